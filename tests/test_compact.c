/*
 * test_compact.c — KV compaction: parameter validation, a planted key that
 * KeyDiff keeps and the window policy drops, attention of a compacted cache
 * against a recomputation over exactly the kept tokens, other sequences
 * untouched, bounded prefill (a prompt 10x the trigger never holds more than
 * trigger cells), and the multi-turn ring scenario of design.md 1.1 on a
 * generated gemma2-style model (sliding layers, q8_0 rotated keys, KeyDiff
 * with renumbering), with the invariant check after every step; and a
 * batch whose compaction meets cells shared with a fork (issue 26): refused
 * with memory unchanged when it does not fit, exactly at the least n_ctx
 * that fits, equal to the same batch without the fork.
 */
#include "memtest.h"
#include "memory/memory.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static keel_mem_layer full_layer(keel_dtype kt, bool rot)
{
    keel_mem_layer l = keel_mem_layer_default();
    l.n_kv_heads = 1;
    l.n_heads = 2;
    l.head_dim_k = l.head_dim_v = 64;
    l.k_dtype = kt;
    l.v_dtype = kt == KEEL_DTYPE_F32 ? KEEL_DTYPE_F32 : KEEL_DTYPE_F16;
    l.k_rot.enabled = rot;
    l.k_rot.seed = 3;
    l.rope.n_rot = 64;
    return l;
}

static keel_mem *open_mem(const keel_mem_layer *L, int32_t n_ctx, int32_t n_seq)
{
    keel_mem_config cfg = keel_mem_config_default();
    cfg.layers = L;
    cfg.n_layers = 1;
    cfg.n_ctx = n_ctx;
    cfg.n_batch_max = 64;
    cfg.n_seq_max = n_seq;
    cfg.n_threads = 2;
    keel_mem *m = NULL;
    char err[256];
    assert_ok(keel_mem_open(&cfg, &m, err));
    return m;
}

static void test_params(void **state)
{
    (void)state;
    keel_compact_params p = keel_compact_params_default();
    char err[256];
    assert_ok(keel_compact_params_check(&p, err)); /* none is always valid */
    p.policy = KEEL_COMPACT_KEYDIFF;
    p.trigger = 64;
    p.target = 32;
    assert_ok(keel_compact_params_check(&p, err));
    p.target = 64;
    assert_status(keel_compact_params_check(&p, err), KEEL_EINVAL);
    assert_non_null(strstr(err, "greater than target"));
    p.target = 32;
    p.n_sink = 32;
    assert_status(keel_compact_params_check(&p, err), KEEL_EINVAL);
    p.n_sink = 4;
    p.recent = 1.0f;
    assert_status(keel_compact_params_check(&p, err), KEEL_EINVAL);
    p.recent = 0.9f;
    assert_status(keel_compact_params_check(&p, err), KEEL_EINVAL); /* 4 + 29 > 32 */
    assert_non_null(strstr(err, "exceed target"));
    keel_compact_policy pol;
    assert_ok(keel_compact_policy_from_name("KeyDiff", &pol));
    assert_int_equal(pol, KEEL_COMPACT_KEYDIFF);
    assert_status(keel_compact_policy_from_name("lru", &pol), KEEL_EINVAL);
    assert_string_equal(keel_compact_policy_name(KEEL_COMPACT_WINDOW), "window");
}

/* Keys share one direction plus noise; one planted key points elsewhere. */
static void make_similar_tok(memtest_tok *t, const keel_mem_layer *L, int32_t pos, uint64_t seed,
                             bool planted)
{
    memtest_make_tok(t, L, pos, seed);
    float dir[64];
    test_fill_normal(dir, 64, 4242);
    for (int j = 0; j < 64; j++)
        t->k[j] = planted ? -dir[j] + 0.05f * t->k[j] : dir[j] + 0.3f * t->k[j];
}

static bool has_stamp(const keel_mem *m, uint64_t stamp)
{
    const mem_table *t = &m->groups[0].tables[0];
    for (int32_t c = 0; c < t->cap; c++)
        if (t->pos[c] >= 0 && t->stamp[c] == stamp) return true;
    return false;
}

static void planted_run(keel_compact_policy policy, keel_dtype kt, bool rot, bool *survived)
{
    keel_mem_layer L = full_layer(kt, rot);
    keel_mem *m = open_mem(&L, 256, 1);
    keel_compact_params p = keel_compact_params_default();
    p.policy = policy;
    p.trigger = 64;
    p.target = 32;
    p.n_sink = 4;
    p.recent = 0.25f;
    memtest_tok toks[64];
    int32_t pos = 0;
    uint64_t planted_stamp = 11; /* position 10 is the 11th token placed */
    for (int cycle = 0; cycle < 6; cycle++) {
        int32_t add = cycle == 0 ? 64 : 32;
        for (int32_t i = 0; i < add; i++, pos++) make_similar_tok(&toks[i], &L, pos, 900 + (uint64_t)pos, pos == 10);
        memtest_place_write(m, &L, toks, add, NULL);
        for (int32_t i = 0; i < add; i++) memtest_free_tok(&toks[i]);
        if (cycle == 5) break;
        assert_int_equal(keel_mem_seq_cells(m, 0), 64);
        assert_ok(keel_mem_compact(m, 0, &p));
        assert_ok(keel_mem_check(m));
        assert_int_equal(keel_mem_seq_cells(m, 0), 32);
        pos = keel_mem_seq_pos_max(m, 0) + 1; /* renumbered */
        survived[cycle] = has_stamp(m, planted_stamp);
    }
    assert_int_equal(keel_mem_seq_compactions(m, 0), 5);
    keel_mem_close(m);
}

static void test_planted_key(void **state)
{
    (void)state;
    const struct { keel_dtype kt; bool rot; } kinds[] = {{KEEL_DTYPE_F32, false}, {KEEL_DTYPE_Q8_0, true}};
    for (int k = 0; k < 2; k++) {
        bool kd[5] = {0}, win[5] = {0};
        planted_run(KEEL_COMPACT_KEYDIFF, kinds[k].kt, kinds[k].rot, kd);
        planted_run(KEEL_COMPACT_WINDOW, kinds[k].kt, kinds[k].rot, win);
        for (int c = 0; c < 5; c++) {
            if (!kd[c]) fail_msg("%s: keydiff dropped the planted key in cycle %d", keel_dtype_name(kinds[k].kt), c);
            if (win[c]) fail_msg("%s: window kept the planted key in cycle %d", keel_dtype_name(kinds[k].kt), c);
        }
    }
}

/* The kept tokens (by stamp) with their new positions. */
static int32_t kept_tokens(const keel_mem *m, const memtest_tok *all, int32_t n_all, memtest_tok *out)
{
    const mem_table *t = &m->groups[0].tables[0];
    int32_t n = 0;
    for (int32_t c = 0; c < t->cap; c++) {
        if (t->pos[c] < 0 || !mem_seq_has(t, c, 0)) continue;
        uint64_t st = t->stamp[c];
        assert_true(st >= 1 && (int64_t)st <= n_all);
        out[n] = all[st - 1];
        out[n].pos = t->pos[c];
        n++;
    }
    return n;
}

static void test_compacted_attention(void **state)
{
    (void)state;
    const keel_compact_policy pols[] = {KEEL_COMPACT_WINDOW, KEEL_COMPACT_KEYDIFF, KEEL_COMPACT_KNORM,
                                        KEEL_COMPACT_RANDOM};
    const struct { keel_dtype kt; bool rot; double tol; } kinds[] = {
        {KEEL_DTYPE_F32, false, 4e-6}, {KEEL_DTYPE_F32, true, 4e-6}, {KEEL_DTYPE_Q8_0, true, 2e-2}};
    for (int k = 0; k < 3; k++)
        for (int pi = 0; pi < 4; pi++)
            for (int renumber = 0; renumber < 2; renumber++) {
                keel_mem_layer L = full_layer(kinds[k].kt, kinds[k].rot);
                keel_mem *m = open_mem(&L, 256, 1);
                memtest_tok all[100], kept[100];
                for (int32_t i = 0; i < 100; i++) memtest_make_tok(&all[i], &L, i, 77 + (uint64_t)i);
                memtest_place_write(m, &L, all, 50, NULL);
                memtest_place_write(m, &L, all + 50, 50, NULL);
                keel_compact_params p = keel_compact_params_default();
                p.policy = pols[pi];
                p.trigger = 60;
                p.target = 40;
                p.renumber = renumber;
                assert_ok(keel_mem_compact(m, 0, &p));
                assert_ok(keel_mem_check(m));
                int32_t nk = kept_tokens(m, all, 100, kept);
                assert_int_equal(nk, 40);
                int32_t qpos = keel_mem_seq_pos_max(m, 0);
                if (renumber) assert_int_equal(qpos, 39);
                else assert_int_equal(qpos, 99); /* the recent tokens are kept */
                float q[2 * 64];
                memtest_make_query(&L, qpos, 5, q);
                double e = memtest_attn_err(m, 0, &L, kept, nk, q, qpos);
                if (!(e <= kinds[k].tol))
                    fail_msg("%s%s %s %s: err %.3g > %.3g", keel_dtype_name(kinds[k].kt),
                             kinds[k].rot ? "+rot" : "", keel_compact_policy_name(pols[pi]),
                             renumber ? "renumber" : "keep", e, kinds[k].tol);
                /* a rewind below the compaction cannot be exact */
                assert_int_equal(keel_mem_seq_rewind_min(m, 0), qpos + 1);
                for (int32_t i = 0; i < 100; i++) memtest_free_tok(&all[i]);
                keel_mem_close(m);
            }
}

/* Compacting sequence 0 leaves sequence 1 (sharing the prefix) bit-identical:
 * a short cache, and one whose sequence 1 holds enough cells (400) for its
 * decode attention to be split across the two threads. The split cuts
 * sequence 1's own extent, which the compaction's copies (past the table's
 * end) do not move; cut on the table's extent it did move. */
static void test_other_sequence_untouched(void **state)
{
    (void)state;
    static const struct {
        int32_t n_ctx, shared, alone, trigger, target;
    } cases[] = {{256, 60, 20, 50, 30}, {1024, 400, 100, 300, 200}};
    keel_mem_layer L = full_layer(KEEL_DTYPE_Q8_0, true);
    for (size_t ci = 0; ci < BASE_ARRAY_LEN(cases); ci++) {
        int32_t sh = cases[ci].shared, n = sh + cases[ci].alone;
        keel_mem *m = open_mem(&L, cases[ci].n_ctx, 2);
        memtest_tok *all = calloc((size_t)n, sizeof(memtest_tok));
        for (int32_t i = 0; i < n; i++) memtest_make_tok(&all[i], &L, i, 500 + (uint64_t)i);
        for (int32_t i = 0; i < sh; i += 50) memtest_place_write(m, &L, all + i, BASE_MIN(50, sh - i), NULL);
        assert_ok(keel_mem_seq_cp(m, 0, 1, -1, -1));
        for (int32_t i = sh; i < n; i += 50) /* seq 0 grows alone */
            memtest_place_write(m, &L, all + i, BASE_MIN(50, n - i), NULL);
        float q[2 * 64], out1[2 * 64], out2[2 * 64];
        memtest_make_query(&L, sh - 1, 9, q);
        int32_t qp = sh - 1, qs = 1;
        keel_mem_attn a = {1, 2, q, &qp, &qs, out1, 0, 0, NULL, NULL, NULL, 0, 0, NULL};
        assert_ok(keel_mem_attend(m, 0, &a));
        keel_compact_params p = keel_compact_params_default();
        p.policy = KEEL_COMPACT_KEYDIFF;
        p.trigger = cases[ci].trigger;
        p.target = cases[ci].target;
        assert_ok(keel_mem_compact(m, 0, &p));
        assert_ok(keel_mem_check(m));
        assert_int_equal(keel_mem_seq_cells(m, 0), cases[ci].target);
        assert_int_equal(keel_mem_seq_cells(m, 1), sh);
        a.out = out2;
        assert_ok(keel_mem_attend(m, 0, &a));
        assert_memory_equal(out1, out2, sizeof out1);
        assert_int_equal(keel_mem_seq_pos_max(m, 1), sh - 1);
        for (int32_t i = 0; i < n; i++) memtest_free_tok(&all[i]);
        free(all);
        keel_mem_close(m);
    }
}

/* ---- engine-level: generated models ------------------------------------- */

static char g_path[64];

static keel_model *gen_model(const char *arch, int32_t n_swa)
{
    snprintf(g_path, sizeof g_path, "/tmp/keel_compact_XXXXXX");
    int fd = mkstemp(g_path);
    assert_true(fd >= 0);
    close(fd);
    keel_gen_params gp = keel_gen_params_default();
    gp.arch = arch;
    gp.n_layer = 2;
    gp.n_embd = 128;
    gp.n_head = 4;
    gp.n_head_kv = 2;
    gp.n_swa = n_swa;
    gp.seed = 11;
    char err[256] = "";
    keel_status st = keel_gen_model(&gp, g_path, err);
    if (st != KEEL_OK) fail_msg("gen_model: %s", err);
    keel_model_params mp = keel_model_params_default();
    mp.path = g_path;
    keel_model *m = NULL;
    st = keel_model_open(&mp, &m, err);
    unlink(g_path);
    if (st != KEEL_OK) fail_msg("open generated model: %s", err);
    return m;
}

static void test_bounded_prefill(void **state)
{
    (void)state;
    keel_model *m = gen_model("llama", 0);
    keel_context_params cp = keel_context_params_default();
    cp.n_ctx = 256;
    cp.n_batch = 640;
    cp.n_ubatch = 128;
    cp.n_threads = 2;
    cp.type_k = KEEL_DTYPE_Q8_0;
    cp.compact.policy = KEEL_COMPACT_KEYDIFF;
    cp.compact.trigger = 64;
    cp.compact.target = 32;
    keel_context *c = NULL;
    char err[256] = "";
    assert_ok(keel_context_open(m, &cp, &c, err));
    int32_t toks[640];
    for (int i = 0; i < 640; i++) toks[i] = 3 + (i * 37) % 500;
    keel_batch b = {640, toks, NULL, NULL, NULL};
    assert_ok(keel_decode(c, &b));
    keel_mem *mem = keel_context_memory(c);
    assert_ok(keel_mem_check(mem));
    printf("bounded prefill: 640 tokens, high-water %d cells (trigger 64), %lld compactions\n",
           keel_mem_seq_cells_high(mem, 0), (long long)keel_mem_seq_compactions(mem, 0));
    assert_true(keel_mem_seq_cells_high(mem, 0) <= 64);
    assert_true(keel_mem_seq_compactions(mem, 0) >= 18);
    assert_non_null(keel_logits(c, 639));
    keel_mem_stats st;
    keel_mem_stats_get(mem, &st);
    assert_int_equal(st.tokens_placed, 640);
    /* compaction off: the same prompt does not fit in 256 cells */
    keel_compact_params none = keel_compact_params_default();
    assert_ok(keel_context_set_compact(c, 0, &none));
    keel_mem_clear(mem);
    assert_status(keel_decode(c, &b), KEEL_EFULL);
    /* invalid combinations are errors, not silent resets */
    keel_compact_params bad = cp.compact;
    bad.trigger = 1000; /* > n_ctx */
    assert_status(keel_context_set_compact(c, 0, &bad), KEEL_EINVAL);
    assert_non_null(strstr(keel_context_last_error(c), "exceeds n_ctx"));
    bad = cp.compact;
    bad.target = bad.trigger;
    assert_status(keel_context_set_compact(c, 0, &bad), KEEL_EINVAL);
    keel_context_close(c);
    keel_model_close(m);
}

/* design.md 1.1, scaled down: gemma2-style model, sliding window 16 with 4
 * sinks, KeyDiff on the global layers (trigger 64, target 32, renumbered),
 * q8_0 keys with rotation; 10 turns of a prompt and ~100 decoded tokens,
 * the invariant check after every step. */
static void test_multiturn_ring(void **state)
{
    (void)state;
    keel_model *m = gen_model("gemma2", 16);
    keel_context_params cp = keel_context_params_default();
    cp.n_ctx = 128;
    cp.n_batch = 64;
    cp.n_ubatch = 16;
    cp.n_threads = 2;
    cp.type_k = KEEL_DTYPE_Q8_0;
    cp.rot_k = 1;
    cp.n_sink = 4;
    cp.compact.policy = KEEL_COMPACT_KEYDIFF;
    cp.compact.trigger = 64;
    cp.compact.target = 32;
    cp.compact.n_sink = 4;
    cp.compact.recent = 0.5f;
    cp.compact.renumber = true;
    keel_context *c = NULL;
    char err[256] = "";
    keel_status st = keel_context_open(m, &cp, &c, err);
    if (st != KEEL_OK) fail_msg("context: %s", err);
    keel_mem *mem = keel_context_memory(c);
    int32_t prompt[24];
    int32_t steps = 0;
    for (int turn = 0; turn < 10; turn++) {
        for (int i = 0; i < 24; i++) prompt[i] = 3 + (turn * 31 + i * 7) % 290;
        keel_batch b = {24, prompt, NULL, NULL, NULL};
        assert_ok(keel_decode(c, &b));
        assert_ok(keel_mem_check(mem));
        const float *l = keel_logits(c, 23);
        for (int t = 0; t < 100; t++, steps++) {
            int32_t best = 0;
            for (int32_t v = 1; v < 300; v++)
                if (l[v] > l[best]) best = v;
            keel_batch g = {1, &best, NULL, NULL, NULL};
            assert_ok(keel_decode(c, &g));
            st = keel_mem_check(mem);
            if (st != KEEL_OK) fail_msg("turn %d step %d: %s", turn, t, keel_mem_last_error(mem));
            assert_true(keel_mem_seq_cells(mem, 0) <= 64);
            l = keel_logits(c, 0);
        }
    }
    keel_mem_stats ms;
    keel_mem_stats_get(mem, &ms);
    printf("multi-turn ring: %lld tokens placed, %lld cells held of %lld, %lld compactions, "
           "last position %d, max cell %d\n",
           (long long)ms.tokens_placed, (long long)ms.cells_used, (long long)ms.cells_cap,
           (long long)keel_mem_seq_compactions(mem, 0), keel_mem_seq_pos_max(mem, 0),
           mem->max_cell_touched);
    assert_int_equal(ms.tokens_placed, 10 * 124);
    assert_true(ms.tokens_placed > 5 * ms.cells_cap);
    assert_true(mem->max_cell_touched < 128);
    assert_true(keel_mem_seq_compactions(mem, 0) >= 30);
    assert_true(keel_mem_seq_pos_max(mem, 0) < 64);
    keel_context_close(c);
    keel_model_close(m);
}

/* What a refused decode must leave exactly as it was. */
typedef struct mem_snap {
    uint64_t digest;
    int64_t cells_used, tokens_placed, compactions[2];
    int32_t pos_max[2], cells[2];
} mem_snap;

static void snap_take(keel_mem *mem, mem_snap *s)
{
    keel_mem_stats st;
    keel_mem_stats_get(mem, &st);
    memset(s, 0, sizeof *s);
    s->digest = keel_mem_digest(mem);
    s->cells_used = st.cells_used;
    s->tokens_placed = st.tokens_placed;
    for (int32_t q = 0; q < 2; q++) {
        s->pos_max[q] = keel_mem_seq_pos_max(mem, q);
        s->cells[q] = keel_mem_seq_cells(mem, q);
        s->compactions[q] = keel_mem_seq_compactions(mem, q);
    }
}

static void snap_equal(const mem_snap *a, const mem_snap *b)
{
    assert_true(a->digest == b->digest);
    assert_int_equal(a->cells_used, b->cells_used);
    assert_int_equal(a->tokens_placed, b->tokens_placed);
    for (int q = 0; q < 2; q++) {
        assert_int_equal(a->pos_max[q], b->pos_max[q]);
        assert_int_equal(a->cells[q], b->cells[q]);
        assert_int_equal(a->compactions[q], b->compactions[q]);
    }
}

/* max |a - b| / max(1, max |b|) over n values */
static double rel_diff(const float *a, const float *b, size_t n)
{
    double mx = 1.0, d = 0.0;
    for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs((double)b[i]));
    for (size_t i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - (double)b[i]));
    return d / mx;
}

/* Issue 26 item 3 (b): sequence 1 is a fork of a 100-token sequence 0 with
 * compaction (trigger 120, target 60, renumbered); a 64-token batch for 0
 * compacts once (ubatches of 16) but the cells it keeps are shared with 1
 * and must be copied, and the evicted ones are not freed. Without room the
 * decode is refused before anything changes (it used to advance sequence 0
 * to 115, or compact it, then fail); the least n_ctx that fits (204: 116
 * cells, 40 copies, then 48 more tokens) is exactly what the check
 * accepts, and the result equals the same batch without the fork. */
#define FK_PROMPT 100
#define FK_BATCH 64

static keel_context *fork_ctx(keel_model *m, int32_t n_ctx)
{
    keel_context_params cp = keel_context_params_default();
    cp.n_ctx = n_ctx;
    cp.n_batch = 128;
    cp.n_ubatch = 16;
    cp.n_seq_max = 2;
    cp.n_threads = 2;
    cp.type_k = cp.type_v = KEEL_DTYPE_F32;
    cp.compact.policy = KEEL_COMPACT_WINDOW;
    cp.compact.trigger = 120;
    cp.compact.target = 60;
    keel_context *c = NULL;
    char err[256] = "";
    keel_status st = keel_context_open(m, &cp, &c, err);
    if (st != KEEL_OK) fail_msg("context: %s", err);
    return c;
}

static void test_fork_compaction_all_or_nothing(void **state)
{
    (void)state;
    keel_model *m = gen_model("llama", 0);
    keel_model_info mi;
    keel_model_info_get(m, &mi);
    size_t V = (size_t)mi.n_vocab;
    int32_t prompt[FK_PROMPT], more[FK_BATCH];
    for (int i = 0; i < FK_PROMPT; i++) prompt[i] = 3 + (i * 37) % 500;
    for (int i = 0; i < FK_BATCH; i++) more[i] = 5 + (i * 53) % 480;
    keel_batch pb = {FK_PROMPT, prompt, NULL, NULL, NULL};
    keel_batch mb = {FK_BATCH, more, NULL, NULL, NULL};
    /* the reference: no fork */
    keel_context *ref = fork_ctx(m, 256);
    assert_ok(keel_decode(ref, &pb));
    assert_ok(keel_decode(ref, &mb));
    const int32_t sizes[] = {150, 170, 200, 203, 204, 256};
    for (size_t k = 0; k < BASE_ARRAY_LEN(sizes); k++) {
        keel_context *c = fork_ctx(m, sizes[k]);
        keel_mem *mem = keel_context_memory(c);
        assert_ok(keel_decode(c, &pb));
        assert_ok(keel_mem_seq_cp(mem, 0, 1, -1, -1));
        mem_snap before, after;
        snap_take(mem, &before);
        keel_status st = keel_decode(c, &mb);
        printf("fork + compaction, n_ctx %d: %s%s%s\n", sizes[k], keel_status_name(st),
               st == KEEL_OK ? "" : ": ", st == KEEL_OK ? "" : keel_context_last_error(c));
        assert_ok(keel_mem_check(mem));
        if (sizes[k] < 204) {
            assert_status(st, KEEL_EFULL);
            assert_non_null(strstr(keel_context_last_error(c), "context full"));
            snap_take(mem, &after);
            snap_equal(&before, &after);
            assert_int_equal(after.pos_max[0], FK_PROMPT - 1);
            keel_context_close(c);
            continue;
        }
        assert_ok(st);
        assert_int_equal(keel_mem_seq_compactions(mem, 0), 1);
        if (sizes[k] == 256) {
            /* given positions that ignore the renumbering of the batch's own
             * compaction: refused before anything changes (KEEL_EINVAL) */
            keel_context *g = fork_ctx(m, 256);
            keel_mem *gm = keel_context_memory(g);
            assert_ok(keel_decode(g, &pb));
            assert_ok(keel_mem_seq_cp(gm, 0, 1, -1, -1));
            int32_t pos[FK_BATCH];
            for (int i = 0; i < FK_BATCH; i++) pos[i] = FK_PROMPT + i;
            keel_batch gb = {FK_BATCH, more, pos, NULL, NULL};
            snap_take(gm, &before);
            assert_status(keel_decode(g, &gb), KEEL_EINVAL);
            assert_non_null(strstr(keel_context_last_error(g), "renumbered by a compaction"));
            snap_take(gm, &after);
            snap_equal(&before, &after);
            assert_ok(keel_mem_check(gm));
            keel_context_close(g);
        }
        assert_int_equal(keel_mem_seq_pos_max(mem, 0), 60 + 3 * 16 - 1);
        assert_int_equal(keel_mem_seq_cells(mem, 0), 60 + 3 * 16);
        assert_int_equal(keel_mem_seq_pos_max(mem, 1), FK_PROMPT - 1);
        assert_int_equal(keel_mem_seq_cells(mem, 1), FK_PROMPT);
        assert_int_equal(keel_mem_seq_pos_max(keel_context_memory(ref), 0), keel_mem_seq_pos_max(mem, 0));
        double e = rel_diff(keel_logits(c, FK_BATCH - 1), keel_logits(ref, FK_BATCH - 1), V);
        if (!(e <= 1e-5)) fail_msg("n_ctx %d: forked vs not: logits differ by %.3g", sizes[k], e);
        keel_context_close(c);
    }
    keel_context_close(ref);
    keel_model_close(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_params),
        cmocka_unit_test(test_planted_key),
        cmocka_unit_test(test_compacted_attention),
        cmocka_unit_test(test_other_sequence_untouched),
        cmocka_unit_test(test_bounded_prefill),
        cmocka_unit_test(test_fork_compaction_all_or_nothing),
        cmocka_unit_test(test_multiturn_ring),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
