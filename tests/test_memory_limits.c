/*
 * test_memory_limits.c — the memory core at its limits (issue 8, M1-M10):
 * compaction scratch at 4k-64k cells, odd head dims (aligned scratch), int32
 * overflow of positions and parameters, batch pointers, invalid RoPE
 * parameters, rings that must always make room (several sequences, seq_div),
 * copy-on-write only for cells that move, duplicate write cells, and the
 * invariant checker catching a ring that drifted from its full table.
 * Each test failed before its fix.
 */
#include "testutil.h"
#include "memory/memory.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memtest.h"

static keel_mem_layer layer(keel_mem_layer_kind kind, int32_t hd, keel_dtype kt)
{
    keel_mem_layer l = keel_mem_layer_default();
    l.kind = kind;
    l.n_kv_heads = 1;
    l.n_heads = 2;
    l.head_dim_k = l.head_dim_v = hd;
    l.k_dtype = l.v_dtype = kt;
    l.rope.n_rot = hd - hd % 2;
    return l;
}

static keel_mem *open_mem(keel_mem_layer *ls, int32_t nl, int32_t n_ctx, int32_t n_seq,
                          int32_t n_batch, int32_t n_threads)
{
    keel_mem_config cfg = keel_mem_config_default();
    cfg.layers = ls;
    cfg.n_layers = nl;
    cfg.n_ctx = n_ctx;
    cfg.n_seq_max = n_seq;
    cfg.n_batch_max = n_batch;
    cfg.n_threads = n_threads;
    keel_mem *m = NULL;
    char err[BASE_ERR_CAP] = "";
    keel_status st = keel_mem_open(&cfg, &m, err);
    if (st != KEEL_OK) fail_msg("open: %s", err);
    return m;
}

/* Places n tokens of seq at pos0.. (batches of at most nb) and writes random
 * K/V rows for every layer with KV. */
static void fill(keel_mem *m, const keel_mem_layer *ls, int32_t nl, int32_t seq, int32_t pos0,
                 int32_t n, int32_t nb, uint64_t seed)
{
    int32_t ng = keel_mem_n_groups(m);
    int32_t *pos = malloc((size_t)nb * sizeof(int32_t)), *sq = malloc((size_t)nb * sizeof(int32_t));
    int32_t *cells = malloc((size_t)nb * (size_t)ng * sizeof(int32_t));
    int32_t hd = 1;
    for (int32_t l = 0; l < nl; l++) hd = BASE_MAX(hd, BASE_MAX(ls[l].head_dim_k, ls[l].head_dim_v));
    float *kv = malloc((size_t)nb * 4 * (size_t)hd * sizeof(float));
    for (int32_t i = 0; i < n; i += nb) {
        int32_t k = BASE_MIN(nb, n - i);
        for (int32_t j = 0; j < k; j++) {
            pos[j] = pos0 + i + j;
            sq[j] = seq;
        }
        keel_mem_batch b = {k, pos, sq, NULL, NULL, NULL};
        keel_status st = keel_mem_place(m, &b, cells);
        if (st != KEEL_OK) fail_msg("place at %d: %s", pos0 + i, keel_mem_last_error(m));
        for (int32_t l = 0; l < nl; l++) {
            int32_t g = keel_mem_layer_group(m, l);
            if (g < 0) continue;
            test_fill_uniform(kv, (int64_t)k * 4 * hd, seed + (uint64_t)(i * 31 + l));
            assert_ok(keel_mem_write(m, l, k, cells + (size_t)g * (size_t)k, kv, kv + (size_t)k * 2 * (size_t)hd));
        }
    }
    free(pos);
    free(sq);
    free(cells);
    free(kv);
}

/* M1: compaction of a full table at 4k-64k cells, with the renumbering pass
 * and a sliding group, on 1-7 threads: OK, invariants hold, the scratch
 * high-water mark stays inside the reservation. */
static void test_compact_scratch(void **state)
{
    (void)state;
    const int32_t ctxs[] = {4096, 16384, 65536};
    const int32_t threads[] = {1, 2, 7};
    for (size_t a = 0; a < BASE_ARRAY_LEN(ctxs); a++)
        for (size_t b = 0; b < BASE_ARRAY_LEN(threads); b++) {
            if (ctxs[a] == 65536 && threads[b] != 2) continue; /* keep it fast */
            keel_mem_layer ls[3] = {layer(KEEL_MEM_LAYER_FULL, 32, KEEL_DTYPE_F16),
                                    layer(KEEL_MEM_LAYER_SLIDING, 32, KEEL_DTYPE_Q8_0),
                                    layer(KEEL_MEM_LAYER_FULL, 32, KEEL_DTYPE_Q8_0)};
            ls[1].window = 64;
            ls[1].n_sink = 4;
            int32_t n = ctxs[a];
            keel_mem *m = open_mem(ls, 3, n, 1, 512, threads[b]);
            fill(m, ls, 3, 0, 0, n, 512, 7);
            keel_compact_params p = keel_compact_params_default();
            p.policy = KEEL_COMPACT_KEYDIFF;
            p.trigger = n;
            p.target = n / 2;
            p.recent = 0.25f;
            keel_status st = keel_mem_compact(m, 0, &p);
            if (st != KEEL_OK) fail_msg("n_ctx %d threads %d: %s", n, threads[b], keel_mem_last_error(m));
            assert_ok(keel_mem_check(m));
            assert_int_equal(keel_mem_seq_cells(m, 0), n / 2);
            assert_int_equal(keel_mem_seq_pos_max(m, 0), n / 2 - 1);
            /* refill and compact again (the anchor path with new cells) */
            fill(m, ls, 3, 0, n / 2, n / 2, 512, 9);
            p.policy = KEEL_COMPACT_KNORM;
            assert_ok(keel_mem_compact(m, 0, &p));
            assert_ok(keel_mem_check(m));
            keel_mem_stats ms;
            keel_mem_stats_get(m, &ms);
            assert_true(ms.scratch_high <= ms.scratch_bytes);
            keel_mem_close(m);
        }
}

/* M1 through the engine, as reported: stories260K, n_ctx 8192, trigger =
 * n_ctx, ubatch 32. Every decode is OK and leaves a valid memory. */
static void test_compact_scratch_engine(void **state)
{
    (void)state;
    const char *path = test_fixture("models/stories260K.gguf");
    if (!path) return;
    keel_model_params mp = keel_model_params_default();
    mp.path = path;
    keel_model *md = NULL;
    char err[256] = "";
    assert_ok(keel_model_open(&mp, &md, err));
    keel_context_params cp = keel_context_params_default();
    cp.n_ctx = 8192;
    cp.n_batch = cp.n_ubatch = 32;
    cp.n_threads = 2;
    cp.compact.policy = KEEL_COMPACT_KEYDIFF;
    cp.compact.trigger = 8192;
    cp.compact.target = 4096;
    keel_context *c = NULL;
    assert_ok(keel_context_open(md, &cp, &c, err));
    keel_mem *mem = keel_context_memory(c);
    int32_t toks[32];
    /* the first compaction comes when the 257th ubatch would pass 8192 */
    for (int32_t it = 0; it < 8192 / 32 + 4; it++) {
        for (int32_t i = 0; i < 32; i++) toks[i] = 3 + (it * 32 + i) * 7 % 500;
        keel_batch b = {32, toks, NULL, NULL, NULL};
        keel_status st = keel_decode(c, &b);
        if (st != KEEL_OK) fail_msg("decode %d: %s", it, keel_context_last_error(c));
        if (it >= 8192 / 32 - 1) assert_ok(keel_mem_check(mem));
        assert_true(keel_mem_seq_cells(mem, 0) <= 8192);
    }
    assert_ok(keel_mem_check(mem));
    assert_true(keel_mem_seq_compactions(mem, 0) >= 1);
    assert_true(keel_mem_seq_pos_max(mem, 0) < 8192);
    keel_context_close(c);
    keel_model_close(md);
}

/* M2: odd head dims (f32/f16/bf16 allow them): every edit path with its
 * scratch aligned (UBSan checks the int64 stores in make test-asan), and
 * attention still exact against a recomputation. */
static void test_odd_head_dims(void **state)
{
    (void)state;
    const int32_t dims[] = {33, 65, 7};
    const keel_dtype dts[] = {KEEL_DTYPE_F32, KEEL_DTYPE_F16, KEEL_DTYPE_BF16};
    for (size_t a = 0; a < BASE_ARRAY_LEN(dims); a++)
        for (size_t b = 0; b < BASE_ARRAY_LEN(dts); b++) {
            keel_mem_layer ls[2] = {layer(KEEL_MEM_LAYER_FULL, dims[a], dts[b]),
                                    layer(KEEL_MEM_LAYER_SLIDING, dims[a] + 2, dts[b])};
            ls[1].window = 8;
            ls[1].n_sink = 1;
            keel_mem *m = open_mem(ls, 2, 256, 2, 16, 3);
            memtest_tok toks[100];
            for (int32_t i = 0; i < 100; i++) memtest_make_tok(&toks[i], &ls[0], i, 50 + (uint64_t)i);
            for (int32_t i = 0; i < 100; i += 10) memtest_place_write(m, &ls[0], toks + i, 10, NULL);
            assert_ok(keel_mem_seq_cp(m, 0, 1, 0, 60)); /* shared: edits split cells */
            assert_ok(keel_mem_seq_add(m, 0, 50, -1, 7));
            assert_ok(keel_mem_seq_div(m, 0, -1, -1, 2));
            assert_ok(keel_mem_check(m));
            for (int32_t i = 0; i < 100; i++) toks[i].pos = (i < 50 ? i : i + 7) / 2;
            float q[2 * 67];
            memtest_make_query(&ls[0], 60, 3, q);
            double e = memtest_attn_err(m, 0, &ls[0], toks, 100, q, 60);
            double tol = dts[b] == KEEL_DTYPE_F32 ? 1e-5 : dts[b] == KEEL_DTYPE_F16 ? 5e-3 : 4e-2;
            if (!(e < tol)) fail_msg("head_dim %d %s: err %g", dims[a], keel_dtype_name(dts[b]), e);
            keel_compact_params p = keel_compact_params_default();
            p.policy = KEEL_COMPACT_WINDOW;
            p.trigger = 60;
            p.target = 40;
            p.recent = 0.5f;
            assert_ok(keel_mem_compact(m, 1, &p)); /* renumbering pass */
            assert_ok(keel_mem_check(m));
            for (int32_t i = 0; i < 100; i++) memtest_free_tok(&toks[i]);
            keel_mem_close(m);
        }
}

/* M3, M6: int32 arithmetic near INT32_MAX. */
static void test_int32_limits(void **state)
{
    (void)state;
    keel_compact_params p = keel_compact_params_default();
    p.policy = KEEL_COMPACT_KEYDIFF;
    p.trigger = INT32_MAX;
    p.target = INT32_MAX - 1;
    p.n_sink = 1073741823;
    p.recent = 0.9f;
    char err[256] = "";
    assert_status(keel_compact_params_check(&p, err), KEEL_EINVAL);
    assert_non_null(strstr(err, "exceed target"));
    p.n_sink = INT32_MAX - 2;
    p.recent = 0.5f;
    assert_status(keel_compact_params_check(&p, err), KEEL_EINVAL);

    /* a ring alone: only its sinks move, and the forgotten positions' bound
     * would pass INT32_MAX: it saturates, rewinding stays refused */
    keel_mem_layer l = layer(KEEL_MEM_LAYER_SLIDING, 32, KEEL_DTYPE_F16);
    l.window = 8;
    l.n_sink = 4;
    keel_mem *m = open_mem(&l, 1, 64, 1, 4, 1);
    fill(m, &l, 1, 0, 0, 40, 4, 3);
    int32_t before = keel_mem_seq_rewind_min(m, 0);
    assert_int_equal(before, 28 + 8);
    assert_ok(keel_mem_seq_add(m, 0, 0, 29, INT32_MAX - 10));
    assert_ok(keel_mem_check(m));
    assert_true(keel_mem_seq_rewind_min(m, 0) >= before);
    assert_int_equal(keel_mem_seq_rewind_min(m, 0), INT32_MAX);
    keel_mem_close(m);
}

/* M4, M7: batch pointers and NULL outputs. */
static void test_null_pointers(void **state)
{
    (void)state;
    keel_mem_layer l = layer(KEEL_MEM_LAYER_FULL, 32, KEEL_DTYPE_F16);
    keel_mem *m = open_mem(&l, 1, 64, 2, 8, 1);
    int32_t pos[2] = {0, 1}, seq1[2] = {0, 0}, nseq[2] = {1, 1}, cells[2];
    keel_mem_batch b = {2, pos, seq1, nseq, NULL, NULL}; /* n_seq_id without seq_id */
    uint64_t d0 = keel_mem_digest(m);
    assert_status(keel_mem_place(m, &b, cells), KEEL_EINVAL);
    assert_non_null(strstr(keel_mem_last_error(m), "seq_id is NULL"));
    const int32_t *sets[2] = {seq1, NULL};
    b.seq_id = sets;
    assert_status(keel_mem_place(m, &b, cells), KEEL_EINVAL);
    assert_non_null(strstr(keel_mem_last_error(m), "seq_id[1] is NULL"));
    keel_mem_batch none = {2, pos, NULL, NULL, NULL, NULL};
    assert_status(keel_mem_place(m, &none, cells), KEEL_EINVAL);
    assert_int_equal(keel_mem_digest(m), d0);
    keel_mem_stats_get(m, NULL); /* no-op */
    keel_mem_stats st;
    keel_mem_stats_get(NULL, &st);
    assert_int_equal(st.cells_cap, 0);
    keel_mem_close(m);
}

/* M5, M10: configurations refused at open instead of misbehaving later. */
static void test_config_refusals(void **state)
{
    (void)state;
    keel_mem_layer l = layer(KEEL_MEM_LAYER_FULL, 64, KEEL_DTYPE_Q8_0);
    keel_mem_config cfg = keel_mem_config_default();
    cfg.layers = &l;
    cfg.n_layers = 1;
    cfg.n_ctx = 256;
    char err[BASE_ERR_CAP];
    keel_mem *m = (keel_mem *)1;
    size_t bytes;
    float ff[32];
    for (int i = 0; i < 32; i++) ff[i] = 1.0f;
    for (int k = 0; k < 7; k++) {
        keel_mem_layer x = layer(KEEL_MEM_LAYER_FULL, 64, KEEL_DTYPE_Q8_0);
        switch (k) {
        case 0: x.rope.ext_factor = 1.0f; x.rope.n_ctx_orig = 0; break; /* YaRN without n_ctx_orig */
        case 1: x.rope.freq_base = INFINITY; break;
        case 2: x.rope.freq_base = NAN; break;
        case 3: ff[5] = 0.0f; x.rope.freq_factors = ff; break;
        case 4: ff[5] = 1.0f; x.rope.ext_factor = NAN; break;
        case 5: x.rope.attn_factor = 0.0f; break;
        case 6: x.k_rot.enabled = true; x.k_rot.block = -32; break; /* negative: not "auto" */
        }
        l = x;
        m = (keel_mem *)1;
        assert_status(keel_mem_open(&cfg, &m, err), KEEL_EINVAL);
        assert_null(m);
        assert_status(keel_mem_config_bytes(&cfg, &bytes), KEEL_EINVAL);
        assert_non_null(strstr(err, k == 6 ? "rotation block -32" : "invalid rope parameters"));
    }
    l = layer(KEEL_MEM_LAYER_FULL, 64, KEEL_DTYPE_Q8_0);
    l.rope.ext_factor = 1.0f;
    l.rope.n_ctx_orig = 4096;
    assert_ok(keel_mem_open(&cfg, &m, err)); /* valid YaRN */
    assert_true(keel_mem_can_shift(m));
    keel_mem_close(m);
    /* cell ids are int32: split streams of n_seq_max x n_ctx > 2^31 refused */
    l = layer(KEEL_MEM_LAYER_FULL, 32, KEEL_DTYPE_F16);
    cfg.unified = false;
    cfg.n_seq_max = 256;
    cfg.n_ctx = 1 << 24;
    assert_status(keel_mem_config_bytes(&cfg, &bytes), KEEL_EINVAL);
    assert_status(keel_mem_open(&cfg, &m, err), KEEL_EINVAL);
    assert_non_null(strstr(err, "exceed 2^31"));
}

/* M8: a ring never runs out of room: three sequences each placing a full
 * batch, and sequences after seq_div (several cells per position). */
static void test_ring_always_room(void **state)
{
    (void)state;
    keel_mem_layer l = layer(KEEL_MEM_LAYER_SLIDING, 32, KEEL_DTYPE_F16);
    l.window = 32;
    l.n_sink = 4;
    keel_mem *m = open_mem(&l, 1, 4096, 3, 64, 1);
    for (int32_t s = 0; s < 3; s++) fill(m, &l, 1, s, 0, 64, 64, 11 + (uint64_t)s);
    assert_ok(keel_mem_check(m));
    for (int32_t s = 0; s < 3; s++) fill(m, &l, 1, s, 64, 64, 64, 21 + (uint64_t)s);
    assert_ok(keel_mem_check(m));
    /* each sequence keeps its sinks and at most window others + its batch */
    assert_true(keel_mem_group_cells_used(m, 0) <= 3 * (4 + 32) + 64);
    /* seq_div: positions collapse, the ring keeps placing */
    for (int32_t round = 0; round < 6; round++) {
        for (int32_t s = 0; s < 3; s++) {
            assert_ok(keel_mem_seq_div(m, s, -1, -1, 2));
            int32_t p = keel_mem_seq_pos_max(m, s) + 1;
            for (int32_t i = 0; i < 40; i++) fill(m, &l, 1, s, p + i, 1, 1, 100 + (uint64_t)(round * 77 + i));
        }
        assert_ok(keel_mem_check(m));
    }
    keel_mem_close(m);
    /* with a full layer beside the ring: the ring still never refuses */
    keel_mem_layer ls[2] = {layer(KEEL_MEM_LAYER_FULL, 32, KEEL_DTYPE_F16), l};
    m = open_mem(ls, 2, 4096, 1, 16, 1);
    fill(m, ls, 2, 0, 0, 200, 16, 5);
    for (int32_t round = 0; round < 4; round++) {
        assert_ok(keel_mem_seq_div(m, 0, -1, -1, 3));
        fill(m, ls, 2, 0, keel_mem_seq_pos_max(m, 0) + 1, 100, 16, 500 + (uint64_t)round);
        assert_ok(keel_mem_check(m));
    }
    keel_mem_close(m);
}

/* M9: an edit copies (copy on write) only the shared cells that move: with
 * no free cell, edits that move no shared cell succeed. */
static void test_edit_copies_only_moving_cells(void **state)
{
    (void)state;
    keel_mem_layer l = layer(KEEL_MEM_LAYER_FULL, 32, KEEL_DTYPE_Q8_0);
    keel_mem *m = open_mem(&l, 1, 32, 2, 32, 1);
    fill(m, &l, 1, 0, 0, 32, 32, 4); /* the table is full */
    assert_ok(keel_mem_seq_cp(m, 0, 1, -1, -1));
    uint64_t d0 = keel_mem_digest(m);
    assert_ok(keel_mem_seq_div(m, 0, 0, 1, 2)); /* 0 / 2 = 0: nothing moves */
    assert_ok(keel_mem_seq_add(m, 0, 40, -1, 5)); /* no cell in range */
    assert_int_equal(keel_mem_digest(m), d0);
    assert_status(keel_mem_seq_div(m, 0, 0, 2, 2), KEEL_EFULL); /* 1 -> 0 needs a copy */
    assert_int_equal(keel_mem_digest(m), d0);
    assert_ok(keel_mem_seq_rm(m, -1, 31, -1)); /* one free cell */
    assert_ok(keel_mem_seq_div(m, 0, 0, 2, 2));
    assert_ok(keel_mem_check(m));
    assert_int_equal(keel_mem_seq_pos_min(m, 0), 0);
    keel_mem_close(m);
}

/* M10: duplicate cells in one write are refused (two threads would race on
 * the row), nothing written, marks left clean. */
static void test_write_duplicates(void **state)
{
    (void)state;
    keel_mem_layer l = layer(KEEL_MEM_LAYER_FULL, 32, KEEL_DTYPE_F16);
    keel_mem *m = open_mem(&l, 1, 64, 1, 16, 2);
    int32_t pos[3] = {0, 1, 2}, seq[3] = {0, 0, 0}, cells[3];
    keel_mem_batch b = {3, pos, seq, NULL, NULL, NULL};
    assert_ok(keel_mem_place(m, &b, cells));
    float kv[3 * 32];
    test_fill_uniform(kv, 3 * 32, 1);
    assert_ok(keel_mem_write(m, 0, 3, cells, kv, kv));
    uint64_t d0 = keel_mem_digest(m);
    int32_t dup[3] = {cells[0], cells[2], cells[0]};
    float kv2[3 * 32];
    test_fill_uniform(kv2, 3 * 32, 2);
    assert_status(keel_mem_write(m, 0, 3, dup, kv2, kv2), KEEL_EINVAL);
    assert_non_null(strstr(keel_mem_last_error(m), "listed twice"));
    assert_int_equal(keel_mem_digest(m), d0);
    assert_ok(keel_mem_check(m)); /* no stale marks */
    keel_mem_close(m);
}

/* M10: keel_mem_check verifies sliding retention against the full table,
 * and compaction refuses inconsistent statistics instead of overrunning. */
static void test_check_catches_drift(void **state)
{
    (void)state;
    keel_mem_layer ls[2] = {layer(KEEL_MEM_LAYER_FULL, 32, KEEL_DTYPE_F16),
                            layer(KEEL_MEM_LAYER_SLIDING, 32, KEEL_DTYPE_F16)};
    ls[1].window = 8;
    ls[1].n_sink = 2;
    keel_mem *m = open_mem(ls, 2, 64, 1, 4, 1);
    fill(m, ls, 2, 0, 0, 30, 4, 8);
    assert_ok(keel_mem_check(m));
    mem_table *R = &m->groups[1].tables[0];
    int32_t c = 0;
    for (int32_t i = 0; i < R->cap; i++)
        if (R->pos[i] > R->pos[c]) c = i;
    int32_t saved = R->pos[c];
    R->pos[c] = saved - 1; /* the ring moved a token the full table did not */
    mem_table_refresh(R);
    assert_status(keel_mem_check(m), KEEL_EINTERNAL);
    assert_non_null(strstr(keel_mem_last_error(m), "sliding group 1 holds"));
    R->pos[c] = saved;
    mem_table_refresh(R);
    assert_ok(keel_mem_check(m));
    mem_table *F = &m->groups[0].tables[0];
    F->seq_cells[0] += 3; /* statistics disagree with the cells */
    keel_compact_params p = keel_compact_params_default();
    p.policy = KEEL_COMPACT_KNORM;
    p.trigger = 20;
    p.target = 16;
    p.recent = 0.5f;
    assert_status(keel_mem_compact(m, 0, &p), KEEL_EINTERNAL);
    F->seq_cells[0] -= 6;
    assert_status(keel_mem_compact(m, 0, &p), KEEL_EINTERNAL);
    F->seq_cells[0] += 3;
    assert_ok(keel_mem_check(m));
    keel_mem_close(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_compact_scratch),
        cmocka_unit_test(test_compact_scratch_engine),
        cmocka_unit_test(test_odd_head_dims),
        cmocka_unit_test(test_int32_limits),
        cmocka_unit_test(test_null_pointers),
        cmocka_unit_test(test_config_refusals),
        cmocka_unit_test(test_ring_always_room),
        cmocka_unit_test(test_edit_copies_only_moving_cells),
        cmocka_unit_test(test_write_duplicates),
        cmocka_unit_test(test_check_catches_drift),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
