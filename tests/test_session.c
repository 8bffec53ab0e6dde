/*
 * test_session.c — saving and loading the memory (keel_mem_save /
 * keel_mem_load): a sequence saved from one memory and loaded into another
 * attends exactly as the original (every column, sliding rings, quantized
 * and rotated rows, compaction state, the rewind bound); the whole memory
 * round-trips; every truncation and single-byte corruption is refused with
 * the memory byte-identical; other cache types, rotation, model or room are
 * refused, named.
 */
#include "testutil.h"
#include "memory/memory.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memtest.h"

static void layers(keel_mem_layer *ls)
{
    ls[0] = keel_mem_layer_default();
    ls[0].n_kv_heads = 2;
    ls[0].n_heads = 4;
    ls[0].head_dim_k = ls[0].head_dim_v = 64;
    ls[0].k_dtype = KEEL_DTYPE_Q8_0;
    ls[0].v_dtype = KEEL_DTYPE_Q4_0;
    ls[0].k_rot.enabled = true;
    ls[0].k_rot.seed = 11;
    ls[0].rope.n_rot = 64;
    ls[1] = ls[0];
    ls[1].kind = KEEL_MEM_LAYER_SLIDING;
    ls[1].window = 16;
    ls[1].n_sink = 2;
    ls[1].k_dtype = KEEL_DTYPE_F16;
    ls[1].v_dtype = KEEL_DTYPE_F16;
    ls[1].k_rot.enabled = false;
}

static keel_mem *open_mem(const keel_mem_layer *ls, int32_t n_seq, int32_t n_ctx)
{
    keel_mem_config cfg = keel_mem_config_default();
    cfg.layers = ls;
    cfg.n_layers = 2;
    cfg.n_ctx = n_ctx;
    cfg.n_seq_max = n_seq;
    cfg.n_batch_max = 32;
    cfg.n_threads = 2;
    keel_mem *m = NULL;
    char err[256];
    if (keel_mem_open(&cfg, &m, err) != KEEL_OK) fail_msg("open: %s", err);
    return m;
}

/* Places n tokens of seq at pos0.. and writes both layers. */
static void fill(keel_mem *m, int32_t seq, int32_t pos0, int32_t n, uint64_t seed)
{
    int32_t pos[32], sq[32], cells[64];
    float k[32 * 2 * 64], v[32 * 2 * 64];
    for (int32_t i = 0; i < n; i += 32) {
        int32_t c = BASE_MIN(32, n - i);
        for (int32_t j = 0; j < c; j++) {
            pos[j] = pos0 + i + j;
            sq[j] = seq;
        }
        keel_mem_batch b = {c, pos, sq, NULL, NULL, NULL};
        assert_ok(keel_mem_place(m, &b, cells));
        for (int32_t l = 0; l < 2; l++) {
            test_fill_uniform(k, (int64_t)c * 128, seed + (uint64_t)(i * 7 + l));
            test_fill_uniform(v, (int64_t)c * 128, seed + (uint64_t)(i * 7 + l) + 1000);
            assert_ok(keel_mem_write(m, l, c, cells + (size_t)keel_mem_layer_group(m, l) * (size_t)c, k, v));
        }
    }

}

/* Attention of 4 queries of seq at pos..pos+3 on both layers into out. */
static void attend(keel_mem *m, int32_t seq, int32_t pos, float *out)
{
    float q[4 * 4 * 64];
    test_fill_uniform(q, 4 * 4 * 64, 99);
    int32_t ps[4] = {pos, pos, pos, pos}, ss[4] = {seq, seq, seq, seq};
    for (int32_t l = 0; l < 2; l++) {
        keel_mem_attn a;
        memset(&a, 0, sizeof a);
        a.n_tokens = 4;
        a.n_heads = 4;
        a.q = q;
        a.pos = ps;
        a.seq = ss;
        a.out = out + (size_t)l * 4 * 4 * 64;
        assert_ok(keel_mem_attend(m, l, &a));
    }
}

static uint8_t g_blob[1 << 20], g_blob2[1 << 20];

static void test_roundtrip_sequence(void **state)
{
    (void)state;
    keel_mem_layer ls[2];
    layers(ls);
    keel_mem *a = open_mem(ls, 2, 256);
    fill(a, 0, 0, 100, 1);
    fill(a, 1, 0, 40, 2);
    assert_ok(keel_mem_seq_cp(a, 0, 1, 0, 10)); /* shared cells */
    keel_compact_params p = keel_compact_params_default();
    p.policy = KEEL_COMPACT_KEYDIFF;
    p.trigger = 80;
    p.target = 64;
    p.recent = 0.5f;
    assert_ok(keel_mem_compact(a, 0, &p));
    /* the history of the 100 tokens compacted into 64 cells */
    int32_t toks[100], back[128];
    for (int32_t i = 0; i < 100; i++) toks[i] = 7 + i;
    size_t n = 0;
    assert_status(keel_mem_save(a, 0, 0x1234, toks, 100, 0, NULL, 0, &n), KEEL_ERANGE);
    assert_true(n > 0 && n < sizeof g_blob);
    assert_ok(keel_mem_save(a, 0, 0x1234, toks, 100, 0, g_blob, sizeof g_blob, &n));
    /* into another memory, another sequence id, with other cells present */
    keel_mem *b = open_mem(ls, 3, 256);
    fill(b, 2, 0, 30, 3);
    int32_t nt = 0;
    assert_ok(keel_mem_load(b, 1, g_blob, n, 0x1234, 0, back, 128, &nt, NULL));
    assert_ok(keel_mem_check(b));
    assert_int_equal(nt, 100);
    assert_memory_equal(back, toks, sizeof toks);
    assert_int_equal(keel_mem_seq_cells(b, 1), keel_mem_seq_cells(a, 0));
    assert_int_equal(keel_mem_seq_pos_max(b, 1), keel_mem_seq_pos_max(a, 0));
    assert_int_equal(keel_mem_seq_rewind_min(b, 1), keel_mem_seq_rewind_min(a, 0));
    assert_int_equal(keel_mem_seq_compactions(b, 1), keel_mem_seq_compactions(a, 0));
    static float oa[2 * 4 * 4 * 64], ob[2 * 4 * 4 * 64];
    int32_t next = keel_mem_seq_pos_max(a, 0) + 1;
    attend(a, 0, next, oa);
    attend(b, 1, next, ob);
    assert_memory_equal(oa, ob, sizeof oa); /* the same rows: bit-identical */
    /* it continues: both take the same next tokens */
    fill(a, 0, next, 8, 5);
    fill(b, 1, next, 8, 5); /* b places the new cells in another physical order than a */
    attend(a, 0, next + 8, oa);
    attend(b, 1, next + 8, ob);
    /* the same cells, placed in another physical order: the softmax sums
     * in another order (float rounding only) */
    for (size_t i = 0; i < sizeof oa / sizeof oa[0]; i++) assert_close(oa[i], ob[i], 2e-6);
    assert_ok(keel_mem_check(b));
    /* seq 2 of b untouched by the load */
    assert_int_equal(keel_mem_seq_cells(b, 2), 30);
    keel_mem_close(a);
    keel_mem_close(b);
}

static void test_roundtrip_whole(void **state)
{
    (void)state;
    keel_mem_layer ls[2];
    layers(ls);
    keel_mem *a = open_mem(ls, 2, 128);
    fill(a, 0, 0, 50, 1);
    assert_ok(keel_mem_seq_cp(a, 0, 1, -1, -1));
    fill(a, 1, 50, 20, 2);
    size_t n = 0;
    assert_ok(keel_mem_save(a, -1, 0, NULL, 0, 0, g_blob, sizeof g_blob, &n));
    keel_mem *b = open_mem(ls, 2, 128);
    fill(b, 0, 0, 10, 9); /* replaced */
    int32_t nt = -1;
    assert_status(keel_mem_load(b, 0, g_blob, n, 0, 0, NULL, 0, &nt, NULL), KEEL_EINVAL); /* wrong kind */
    assert_ok(keel_mem_load(b, -1, g_blob, n, 0, 0, NULL, 0, &nt, NULL));
    assert_int_equal(nt, 0);
    assert_ok(keel_mem_check(b));
    static float oa[2 * 4 * 4 * 64], ob[2 * 4 * 4 * 64];
    for (int32_t s = 0; s < 2; s++) {
        attend(a, s, 69, oa);
        attend(b, s, 69, ob);
        assert_memory_equal(oa, ob, sizeof oa);
    }
    keel_mem_stats sa, sb;
    keel_mem_stats_get(a, &sa);
    keel_mem_stats_get(b, &sb);
    assert_int_equal(sa.cells_used, sb.cells_used); /* shared cells stay shared */
    keel_mem_close(a);
    keel_mem_close(b);
}

/* Every truncation and every single-byte change is refused, nothing changed. */
static void test_corruption_refused(void **state)
{
    (void)state;
    keel_mem_layer ls[2];
    layers(ls);
    keel_mem *a = open_mem(ls, 1, 64);
    fill(a, 0, 0, 20, 1);
    int32_t toks[20];
    for (int32_t i = 0; i < 20; i++) toks[i] = 1 + i;
    size_t n = 0;
    assert_ok(keel_mem_save(a, 0, 42, toks, 20, 0, g_blob, sizeof g_blob, &n));
    keel_mem *b = open_mem(ls, 1, 64);
    fill(b, 0, 0, 5, 7);
    uint64_t d0 = keel_mem_digest(b);
    int32_t nt;
    for (size_t len = 0; len < n; len += (len < 200 ? 1 : 97)) {
        keel_status st = keel_mem_load(b, 0, g_blob, len, 42, 0, NULL, 0, &nt, NULL);
        if (st == KEEL_OK) fail_msg("truncated to %zu of %zu bytes: loaded", len, n);
        assert_int_equal(keel_mem_digest(b), d0);
    }
    for (size_t i = 0; i < n; i += (i < 256 ? 1 : 61)) {
        memcpy(g_blob2, g_blob, n);
        g_blob2[i] ^= (uint8_t)(1u << (i % 8));
        keel_status st = keel_mem_load(b, 0, g_blob2, n, 42, 0, NULL, 0, &nt, NULL);
        if (st == KEEL_OK) fail_msg("byte %zu flipped: loaded", i);
        assert_int_equal(keel_mem_digest(b), d0);
    }
    assert_ok(keel_mem_check(b));
    /* another model */
    assert_status(keel_mem_load(b, 0, g_blob, n, 43, 0, NULL, 0, &nt, NULL), KEEL_EINVAL);
    assert_non_null(strstr(keel_mem_last_error(b), "another model"));
    /* tokens do not fit */
    int32_t two[2];
    assert_status(keel_mem_load(b, 0, g_blob, n, 42, 0, two, 2, &nt, NULL), KEEL_ERANGE);
    assert_int_equal(keel_mem_digest(b), d0);
    keel_mem_close(a);
    keel_mem_close(b);
}

static void test_other_memory_refused(void **state)
{
    (void)state;
    keel_mem_layer ls[2];
    layers(ls);
    keel_mem *a = open_mem(ls, 1, 64);
    fill(a, 0, 0, 20, 1);
    size_t n = 0;
    assert_ok(keel_mem_save(a, 0, 0, NULL, 0, 0, g_blob, sizeof g_blob, &n));
    int32_t nt;
    struct {
        int what;
        keel_status st;
        const char *msg;
    } cases[] = {{0, KEEL_EUNSUPPORTED, "K q8_0 / V q4_0, this cache K f16"},
                 {1, KEEL_EUNSUPPORTED, "rotation on (block 64, seed 11) in the session, on (block 64, seed 12)"},
                 {2, KEEL_EINVAL, "sliding window 16/2 sinks in the session, 8/2 here"},
                 {3, KEEL_EINVAL, "other RoPE parameters"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        keel_mem_layer o[2];
        layers(o);
        if (cases[i].what == 0) o[0].k_dtype = KEEL_DTYPE_F16;
        if (cases[i].what == 1) o[0].k_rot.seed = 12;
        if (cases[i].what == 2) o[1].window = 8;
        if (cases[i].what == 3) o[0].rope.freq_base = 500000.0f;
        keel_mem *b = open_mem(o, 1, 64);
        uint64_t d0 = keel_mem_digest(b);
        assert_status(keel_mem_load(b, 0, g_blob, n, 0, 0, NULL, 0, &nt, NULL), cases[i].st);
        if (!strstr(keel_mem_last_error(b), cases[i].msg)) fail_msg("case %zu: %s", i, keel_mem_last_error(b));
        assert_int_equal(keel_mem_digest(b), d0);
        keel_mem_close(b);
    }
    /* with KEEL_SESSION_CONVERT the other types and rotation are re-encoded:
     * attention then differs from the original by the codecs' rounding only */
    static float oa[2 * 4 * 4 * 64], ob[2 * 4 * 4 * 64];
    attend(a, 0, 20, oa);
    for (int what = 0; what < 3; what++) {
        keel_mem_layer o[2];
        layers(o);
        if (what == 0) o[0].k_dtype = KEEL_DTYPE_F16;                         /* q8_0 -> f16 */
        if (what == 1) o[0].k_rot.seed = 12;                                  /* other signs */
        if (what == 2) o[0].k_rot.enabled = false, o[0].v_dtype = KEEL_DTYPE_F32; /* unrotate, q4_0 V -> f32 */
        keel_mem *b = open_mem(o, 1, 64);
        assert_ok(keel_mem_load(b, 0, g_blob, n, 0, KEEL_SESSION_CONVERT, NULL, 0, &nt, NULL));
        assert_ok(keel_mem_check(b));
        attend(b, 0, 20, ob);
        double md = 0;
        for (size_t i = 0; i < sizeof oa / sizeof oa[0]; i++) md = fmax(md, fabs((double)oa[i] - ob[i]));
        printf("converted session (case %d): max |attention difference| %.3g\n", what, md);
        assert_true(md < 2e-2); /* q8_0 keys re-rounded once: well inside the q8_0 tolerance */
        keel_mem_close(b);
    }
    /* no room: 20 cells into a memory with 10 free */
    keel_mem *b = open_mem(ls, 2, 30);
    fill(b, 1, 0, 20, 3);
    uint64_t d0 = keel_mem_digest(b);
    assert_status(keel_mem_load(b, 0, g_blob, n, 0, 0, NULL, 0, &nt, NULL), KEEL_EFULL);
    assert_int_equal(keel_mem_digest(b), d0);
    keel_mem_close(b);
    keel_mem_close(a);
}


/* ---- the token history against the cells ------------------------------------------ */

/* Copies the blob src[0 .. n) into dst with its TOKENS section replaced by
 * toks[0 .. nt) (np pending) and every checksum recomputed, so that only a
 * check of the history itself can refuse it. Returns the new size. */
static size_t with_history(const uint8_t *src, size_t n, const int32_t *toks, int32_t nt, int32_t np, uint8_t *dst)
{
    uint32_t nsec;
    memcpy(&nsec, src + 28, 4);
    memcpy(dst, src, 48);
    size_t in = 48, out = 48;
    for (uint32_t i = 0; i < nsec; i++) {
        uint32_t type;
        uint64_t len;
        memcpy(&type, src + in, 4);
        memcpy(&len, src + in + 8, 8);
        assert_true(in + 24 + len <= n);
        memcpy(dst + out, src + in, 24);
        uint8_t *body = dst + out + 24;
        uint64_t nlen = len;
        if (type == 2) { /* TOKENS: n, n_pending, ids */
            memcpy(body, &nt, 4);
            memcpy(body + 4, &np, 4);
            memcpy(body + 8, toks, (size_t)nt * 4);
            nlen = 8 + (uint64_t)nt * 4;
        } else {
            memcpy(body, src + in + 24, (size_t)len);
        }
        uint64_t h = base_hash64(body, (size_t)nlen, 0x5e55);
        memcpy(dst + out + 8, &nlen, 8);
        memcpy(dst + out + 16, &h, 8);
        in += 24 + (size_t)len;
        out += 24 + (size_t)nlen;
    }
    assert_int_equal(in, n);
    return out;
}

typedef struct hist_case {
    const char *what;
    int32_t nt, np;  /* the history put in the blob */
    const char *want; /* in the message */
} hist_case;

/* Loads blob (of a sequence) with each history of cases into sequence 0 of
 * b: each refused with KEEL_EFORMAT, named, b exactly as before. */
static void refuse_histories(keel_mem *b, const uint8_t *blob, size_t n, const hist_case *cases, int n_cases)
{
    static int32_t toks[256];
    for (int32_t i = 0; i < 256; i++) toks[i] = 3 + i;
    uint64_t d0 = keel_mem_digest(b);
    int32_t cells0 = keel_mem_seq_cells(b, 0), pmax0 = keel_mem_seq_pos_max(b, 0);
    for (int k = 0; k < n_cases; k++) {
        size_t m = with_history(blob, n, toks, cases[k].nt, cases[k].np, g_blob2);
        int32_t nt = -1, np = -1, back[256];
        back[0] = -7;
        keel_status st = keel_mem_load(b, 0, g_blob2, m, 0, 0, back, 256, &nt, &np);
        const char *msg = keel_mem_last_error(b);
        if (st != KEEL_EFORMAT || !strstr(msg, cases[k].want))
            fail_msg("%s: %s '%s', want KEEL_EFORMAT '%s'", cases[k].what, keel_status_name(st), msg, cases[k].want);
        assert_int_equal(keel_mem_digest(b), d0);
        assert_int_equal(keel_mem_seq_cells(b, 0), cells0);
        assert_int_equal(keel_mem_seq_pos_max(b, 0), pmax0);
        assert_int_equal(back[0], -7); /* nothing written */
        assert_ok(keel_mem_check(b));
    }
}

/* A history that disagrees with the cells is refused before anything
 * changes (it used to load, and the engine then reused 100 tokens of a
 * cache that held 40): longer, shorter, pending tokens that are in the
 * cache, positions that are not the history's, a compacted sequence with
 * fewer tokens than cells. What agrees loads: the whole history over rings
 * that forgot its start, a compacted summary of a longer history, no
 * history at all. */
static void test_history_must_agree(void **state)
{
    (void)state;
    keel_mem_layer ls[2];
    layers(ls); /* a full group and a ring of 2 sinks + 16 */
    keel_mem *a = open_mem(ls, 2, 256);
    fill(a, 0, 0, 40, 1);
    size_t n = 0;
    assert_ok(keel_mem_save(a, 0, 0, NULL, 0, 0, g_blob, sizeof g_blob, &n));
    keel_mem *b = open_mem(ls, 2, 256);
    fill(b, 0, 0, 7, 3); /* what a refused load must leave alone */
    const hist_case plain[] = {
        {"longer", 100, 0, "disagrees with the cells: 100 tokens (0 pending) leave 100 in the cache, the sequence's cells end at position 39"},
        {"shorter", 20, 0, "cells end at position 39"},
        {"one short", 39, 0, "cells end at position 39"},
        {"pending in the cache", 40, 5, "5 of its 40 tokens are pending (not in the cache), but the cells reach position 39"},
        {"pending beyond", 45, 6, "are pending"},
    };
    refuse_histories(b, g_blob, n, plain, 5);
    /* the agreeing history loads (the ring forgot positions 2..23) */
    static int32_t toks[256], back[256];
    for (int32_t i = 0; i < 256; i++) toks[i] = 3 + i;
    int32_t nt = 0, np = -1;
    size_t m = with_history(g_blob, n, toks, 41, 1, g_blob2); /* one pending: fine */
    assert_ok(keel_mem_load(b, 1, g_blob2, m, 0, 0, back, 256, &nt, &np));
    assert_int_equal(nt, 41);
    assert_int_equal(np, 1);
    assert_ok(keel_mem_load(b, 1, g_blob, n, 0, 0, back, 256, &nt, &np)); /* no history: not checked */
    assert_int_equal(nt, 0);
    assert_ok(keel_mem_check(b));
    assert_ok(keel_mem_seq_rm(b, 1, -1, -1));

    /* positions that are not the history's: 40 tokens placed at 5..44 */
    keel_mem *c = open_mem(ls, 2, 256);
    fill(c, 0, 5, 40, 1);
    assert_ok(keel_mem_save(c, 0, 0, NULL, 0, 0, g_blob, sizeof g_blob, &n));
    const hist_case moved[] = {
        {"positions 5..44, 45 tokens", 45, 0, "full group 0 has no cell at position 0, where the history has its token 0"},
        {"positions 5..44, 40 tokens", 40, 0, "cells end at position 44"},
    };
    refuse_histories(b, g_blob, n, moved, 2);
    /* positions held twice: 0..9 and 20..29, then sequence 1's 5..14 copied
     * in (30 cells up to position 29, as many as the history) */
    keel_mem_close(c);
    c = open_mem(ls, 2, 256);
    fill(c, 0, 0, 30, 1);
    assert_ok(keel_mem_seq_rm(c, 0, 10, 20));
    fill(c, 1, 0, 20, 2);
    assert_ok(keel_mem_seq_cp(c, 1, 0, 5, 15));
    assert_int_equal(keel_mem_seq_cells(c, 0), 30);
    assert_ok(keel_mem_save(c, 0, 0, NULL, 0, 0, g_blob, sizeof g_blob, &n));
    const hist_case twice[] = {
        {"positions twice", 30, 0, "group 0 holds position 5 twice"},
        {"positions twice, fewer tokens", 20, 0, "cells end at position 29"},
    };
    refuse_histories(b, g_blob, n, twice, 2);

    /* compacted: 100 tokens kept as 64 cells at 0..63 (renumbered) */
    keel_mem_close(c);
    c = open_mem(ls, 2, 256);
    fill(c, 0, 0, 100, 1);
    keel_compact_params p = keel_compact_params_default();
    p.policy = KEEL_COMPACT_KEYDIFF;
    p.trigger = 80;
    p.target = 64;
    p.recent = 0.5f;
    assert_ok(keel_mem_compact(c, 0, &p));
    assert_int_equal(keel_mem_seq_cells(c, 0), 64);
    assert_ok(keel_mem_save(c, 0, 0, NULL, 0, 0, g_blob, sizeof g_blob, &n));
    const hist_case comp[] = {
        {"compacted, fewer tokens than cells", 50, 0, "cells end at position 63"},
        {"compacted, 64 tokens, 1 pending", 64, 1, "pending"},
    };
    refuse_histories(b, g_blob, n, comp, 2);
    m = with_history(g_blob, n, toks, 100, 0, g_blob2); /* the summary of a longer history */
    assert_ok(keel_mem_load(b, 1, g_blob2, m, 0, 0, back, 256, &nt, NULL));
    assert_int_equal(nt, 100);
    m = with_history(g_blob, n, toks, 64, 0, g_blob2); /* as many as cells */
    assert_ok(keel_mem_load(b, 1, g_blob2, m, 0, 0, back, 256, &nt, NULL));
    assert_ok(keel_mem_check(b));
    keel_mem_close(c);
    keel_mem_close(b);
    keel_mem_close(a);
}

/* Bad arguments name themselves (they used to return KEEL_EINVAL with an
 * empty message). */
static void test_bad_arguments_named(void **state)
{
    (void)state;
    keel_mem_layer ls[2];
    layers(ls);
    keel_mem *a = open_mem(ls, 1, 64);
    fill(a, 0, 0, 4, 1);
    int32_t toks[4] = {1, 2, 3, 4}, nt = 0;
    size_t n = 0;
    struct {
        int32_t n_tokens, n_pending;
        bool null_tokens, null_out;
        const char *want;
    } cases[] = {
        {4, 5, false, false, "n_pending 5 is more than n_tokens 4"},
        {-1, 0, false, false, "n_tokens -1 is negative"},
        {4, -2, false, false, "n_pending -2 is negative"},
        {4, 0, true, false, "tokens is NULL with n_tokens 4"},
        {4, 0, false, true, "n_out is NULL"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        keel_status st = keel_mem_save(a, 0, 0, cases[i].null_tokens ? NULL : toks, cases[i].n_tokens,
                                       cases[i].n_pending, g_blob, sizeof g_blob, cases[i].null_out ? NULL : &n);
        const char *msg = keel_mem_last_error(a);
        if (st != KEEL_EINVAL || !strstr(msg, cases[i].want))
            fail_msg("save case %zu: %s '%s', want KEEL_EINVAL '%s'", i, keel_status_name(st), msg, cases[i].want);
    }
    assert_ok(keel_mem_save(a, 0, 0, toks, 4, 0, g_blob, sizeof g_blob, &n));
    uint64_t d0 = keel_mem_digest(a);
    assert_status(keel_mem_load(a, 0, g_blob, n, 0, 0, NULL, 0, NULL, NULL), KEEL_EINVAL);
    assert_non_null(strstr(keel_mem_last_error(a), "n_tokens is NULL"));
    assert_status(keel_mem_load(a, 0, NULL, n, 0, 0, NULL, 0, &nt, NULL), KEEL_EINVAL);
    assert_non_null(strstr(keel_mem_last_error(a), "buf is NULL"));
    assert_int_equal(keel_mem_digest(a), d0);
    keel_mem_close(a);
}

/* ---- through a model: save/load at random points changes nothing ---------------- */

static char g_model_path[64];

static int32_t model_vocab(const keel_model *m)
{
    keel_model_info mi;
    keel_model_info_get(m, &mi);
    return mi.n_vocab;
}

static keel_model *gen_model(const char *arch)
{
    assert_true(test_temp_file(g_model_path, sizeof g_model_path, "sess_model"));
    keel_gen_params gp = keel_gen_params_default();
    gp.arch = arch;
    gp.n_embd = 128;
    gp.n_head = 4; /* head_dim 32: q8_0 keys */
    gp.n_head_kv = 2;
    gp.n_swa = 16;
    if (strcmp(arch, "qwen35") == 0) gp.n_layer = 4; /* one full-attention layer in four */
    if (strcmp(arch, "nemotron_h") == 0) gp.n_layer = 3; /* Mamba2, attention (no RoPE), MLP */
    char err[256];
    if (keel_gen_model(&gp, g_model_path, err) != KEEL_OK) fail_msg("gen: %s", err);
    keel_model_params mp = keel_model_params_default();
    mp.path = g_model_path;
    keel_model *m = NULL;
    if (keel_model_open(&mp, &m, err) != KEEL_OK) fail_msg("open: %s", err);
    unlink(g_model_path);
    return m;
}

/* One scripted session on two sequences: prompts, greedy decoding, a
 * rewind, a compaction; with save_load, sessions of one sequence and of the
 * whole memory are saved and loaded back (into the same or another sequence
 * id) at seeded points. Returns a hash of every logit row. */
static int32_t g_loads, g_resumes; /* loads done; rewinds that resumed a recurrent state mid-sequence */

/* Feeds toks[0 .. n) to seq s (positions continue), logits of the last. */
static keel_status feed(keel_context *c, int32_t s, const int32_t *toks, int32_t n, bool logits)
{
    int32_t sq[32];
    int8_t lg[32];
    for (int32_t i0 = 0; i0 < n; i0 += 32) {
        int32_t k = BASE_MIN(32, n - i0);
        for (int32_t i = 0; i < k; i++) {
            sq[i] = s;
            lg[i] = logits && i0 + i == n - 1;
        }
        keel_batch b = {k, toks + i0, NULL, sq, lg};
        keel_status st = keel_decode(c, &b);
        if (st != KEEL_OK) return st;
    }
    return KEEL_OK;
}

static uint64_t script(keel_model *m, bool save_load, uint64_t seed, int32_t n_ckpt)
{
    keel_context_params cp = keel_context_params_default();
    cp.n_ctx = 256;
    cp.n_seq_max = 3;
    cp.n_batch = 32;
    cp.n_ubatch = 32;
    cp.n_outputs = 32;
    cp.n_threads = 2;
    cp.type_k = KEEL_DTYPE_Q8_0;
    cp.deterministic = true; /* the loaded cells' physical order must not matter */
    cp.n_ctx_checkpoints = n_ckpt; /* > 0 on a sliding model: ring checkpoints */
    cp.checkpoint_every = n_ckpt > 0 ? 8 : 0;
    keel_context *c = NULL;
    char err[256];
    if (keel_context_open(m, &cp, &c, err) != KEEL_OK) fail_msg("context: %s", err);
    keel_mem *mem = keel_context_memory(c);
    bool rs = keel_mem_is_recurrent(mem);
    base_rng rng;
    base_rng_seed(&rng, seed);
    uint64_t h = 0;
    int32_t seq_of[2] = {0, 1}; /* where each conversation lives (a load may move it) */
    static int32_t hist[2][256]; /* each conversation's tokens (position = index) */
    int32_t used[2] = {0, 0};
    int32_t toks[32];
    static uint8_t blob[1 << 21];
    for (int32_t step = 0; step < 60; step++) {
        int32_t conv = (int32_t)(base_rng_next(&rng) % 2), s = seq_of[conv];
        int32_t n = 1 + (int32_t)(base_rng_next(&rng) % 12);
        for (int32_t i = 0; i < n; i++) toks[i] = 3 + (int32_t)(base_rng_next(&rng) % 200);
        keel_status st = used[conv] + n > 256 ? KEEL_EFULL : feed(c, s, toks, n, true);
        if (st == KEEL_EFULL) {
            assert_ok(keel_mem_seq_rm(mem, s, 0, -1));
            used[conv] = 0;
            continue;
        }
        assert_ok(st);
        memcpy(hist[conv] + used[conv], toks, (size_t)n * sizeof(int32_t));
        used[conv] += n;
        h = base_hash64(keel_logits(c, n - 1), (size_t)model_vocab(m) * sizeof(float), h);
        uint64_t r = base_rng_next(&rng) % 10;
        if (r == 0 && used[conv] > 8) { /* rewind a few tokens (a recurrent state from a checkpoint) */
            /* ring checkpoints: deep enough that the rings (window 16) forgot the tokens */
            int32_t depth = n_ckpt > 0 && !rs ? 40 : 6;
            int32_t p0 = used[conv] - 3 - (int32_t)(base_rng_next(&rng) % (uint64_t)depth), resume = -1;
            if (p0 < 0) p0 = 0;
            bool below = p0 < keel_mem_seq_rewind_min(mem, s); /* attention: only a checkpoint helps */
            assert_ok(keel_context_rewind(c, s, p0, &resume));
            assert_true(resume >= 0 && resume <= p0);
            g_resumes += rs ? resume > 0 : below && resume > 0;
            st = feed(c, s, hist[conv] + resume, p0 - resume, false);
            if (st == KEEL_EFULL) { /* the other conversation took the room */
                assert_ok(keel_mem_seq_rm(mem, s, 0, -1));
                p0 = 0;
            } else {
                assert_ok(st);
            }
            used[conv] = p0;
        }
        if (r == 1 && !rs && keel_mem_seq_cells(mem, s) > 40) { /* compaction renumbers: not replayable */
            keel_compact_params p = keel_compact_params_default();
            p.policy = KEEL_COMPACT_KEYDIFF;
            p.trigger = 40;
            p.target = 24;
            p.recent = 0.75f;
            keel_status cst = keel_mem_compact(mem, s, &p);
            assert_true(cst == KEEL_OK || cst == KEEL_EINVAL);
        }
        uint64_t sl = base_rng_next(&rng) % 6; /* drawn in both runs: the streams stay equal */
        if (!save_load || sl > 1) continue;
        size_t len = 0;
        int32_t nt = 0;
        if (sl == 0) { /* one sequence, loaded into the free id */
            int32_t dst = 3 - seq_of[0] - seq_of[1];
            /* with its history: it agrees with the cells through rewinds,
             * compactions, rings and recurrent states */
            static int32_t back[256];
            assert_ok(keel_session_save_buf(c, s, hist[conv], used[conv], 0, blob, sizeof blob, &len));
            assert_ok(keel_mem_seq_rm(mem, s, -1, -1)); /* saved, released, restored elsewhere */
            keel_status lst = keel_session_load_buf(c, dst, blob, len, 0, back, 256, &nt, NULL);
            if (lst != KEEL_OK) fail_msg("load: %s: %s", keel_status_name(lst), keel_context_last_error(c));
            assert_int_equal(nt, used[conv]);
            assert_memory_equal(back, hist[conv], (size_t)nt * sizeof(int32_t));
            seq_of[conv] = dst;
        } else { /* the whole memory, in place */
            assert_ok(keel_session_save_buf(c, -1, NULL, 0, 0, blob, sizeof blob, &len));
            assert_ok(keel_session_load_buf(c, -1, blob, len, 0, NULL, 0, &nt, NULL));
        }
        assert_ok(keel_mem_check(mem));
        g_loads++;
    }
    keel_context_close(c);
    return h;
}

/* Files and ids of a context's sessions: a history id outside the model's
 * vocabulary is refused (file and buffer) with the memory unchanged; a save
 * never replaces what is not a regular file (saving to /dev/full used to
 * replace the device node with a regular file: the temporary file renamed
 * over it) and leaves nothing behind; a link to a regular file stays a
 * link. */
static bool is_fifo(const char *path)
{
    struct stat sb;
    return lstat(path, &sb) == 0 && S_ISFIFO(sb.st_mode);
}

static int dir_entries(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return n;
}

static void test_context_session_files(void **state)
{
    (void)state;
    keel_model *model = gen_model("llama");
    keel_context_params cp = keel_context_params_default();
    cp.n_ctx = 128;
    cp.n_seq_max = 2;
    cp.n_threads = 1;
    keel_context *c = NULL;
    char err[256];
    if (keel_context_open(model, &cp, &c, err) != KEEL_OK) fail_msg("context: %s", err);
    keel_mem *mem = keel_context_memory(c);
    int32_t V = model_vocab(model), toks[24];
    for (int32_t i = 0; i < 24; i++) toks[i] = 3 + i;
    assert_ok(feed(c, 0, toks, 24, true));
    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/keel_sessfiles_XXXXXX");
    assert_non_null(mkdtemp(dir));
    char path[128], fifo[128], sub[128], link[128], link2[128], reg[128];
    snprintf(path, sizeof path, "%s/ok.session", dir);
    /* ids out of the vocabulary: refused, the memory as it was */
    static uint8_t blob[1 << 20];
    size_t len = 0;
    int32_t bad[24], back[32], nt = -1;
    for (int k = 0; k < 2; k++) {
        memcpy(bad, toks, sizeof bad);
        bad[17] = k ? V : -4;
        assert_ok(keel_session_save_buf(c, 0, bad, 24, 0, blob, sizeof blob, &len));
        assert_ok(keel_session_save(c, 0, bad, 24, 0, path));
        uint64_t d0 = keel_mem_digest(mem);
        char want[96];
        snprintf(want, sizeof want, "token 17 is id %d, outside this model's vocabulary [0, %d)", bad[17], V);
        assert_status(keel_session_load_buf(c, 1, blob, len, 0, back, 32, &nt, NULL), KEEL_EFORMAT);
        if (!strstr(keel_context_last_error(c), want)) fail_msg("'%s', want '%s'", keel_context_last_error(c), want);
        assert_status(keel_session_load(c, 1, path, 0, back, 32, &nt, NULL), KEEL_EFORMAT);
        if (!strstr(keel_context_last_error(c), want)) fail_msg("'%s', want '%s'", keel_context_last_error(c), want);
        assert_int_equal(keel_mem_digest(mem), d0);
        assert_int_equal(keel_mem_seq_cells(mem, 1), 0);
    }
    /* NULL n_tokens is named */
    assert_status(keel_session_load(c, 1, path, 0, back, 32, NULL, NULL), KEEL_EINVAL);
    assert_non_null(strstr(keel_context_last_error(c), "n_tokens"));
    assert_status(keel_session_save_buf(c, 0, toks, 24, 0, blob, sizeof blob, NULL), KEEL_EINVAL);
    assert_non_null(strstr(keel_context_last_error(c), "n_out"));
    /* destinations that are not regular files: refused, untouched, nothing left */
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    snprintf(sub, sizeof sub, "%s/sub", dir);
    snprintf(link, sizeof link, "%s/to_fifo", dir);
    snprintf(link2, sizeof link2, "%s/to_nothing", dir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    assert_int_equal(mkdir(sub, 0700), 0);
    assert_int_equal(symlink(fifo, link), 0);
    assert_int_equal(symlink("/nonexistent/keel", link2), 0);
    int before = dir_entries(dir);
    const struct {
        const char *path, *want;
    } dests[] = {
        {fifo, "exists and is a FIFO, not a regular file: not replaced"},
        {sub, "exists and is a directory, not a regular file"},
        {link, "links to a FIFO, not a regular file"},
        {link2, "a symbolic link to nothing"},
    };
    for (size_t i = 0; i < sizeof dests / sizeof dests[0]; i++) {
        keel_status st = keel_session_save(c, 0, toks, 24, 0, dests[i].path);
        if (st != KEEL_EIO || !strstr(keel_context_last_error(c), dests[i].want))
            fail_msg("%s: %s '%s', want KEEL_EIO '%s'", dests[i].path, keel_status_name(st),
                     keel_context_last_error(c), dests[i].want);
        assert_int_equal(dir_entries(dir), before);
    }
    assert_true(is_fifo(fifo));
    struct stat sb;
    assert_int_equal(stat(sub, &sb), 0);
    assert_true(S_ISDIR(sb.st_mode));
    assert_int_equal(lstat(link, &sb), 0);
    assert_true(S_ISLNK(sb.st_mode));
    /* loading from a FIFO is refused at once (it used to wait for a writer) */
    assert_status(keel_session_load(c, 1, fifo, 0, back, 32, &nt, NULL), KEEL_EIO);
    assert_non_null(strstr(keel_context_last_error(c), "not a regular file"));
    /* a link to a regular file: the file is replaced, the link stays */
    snprintf(reg, sizeof reg, "%s/to_ok", dir);
    assert_int_equal(symlink(path, reg), 0);
    assert_ok(keel_session_save(c, 0, toks, 24, 0, reg));
    assert_int_equal(lstat(reg, &sb), 0);
    assert_true(S_ISLNK(sb.st_mode));
    assert_ok(keel_session_load(c, 1, path, 0, back, 32, &nt, NULL));
    assert_int_equal(nt, 24);
    assert_memory_equal(back, toks, sizeof toks);
    assert_int_equal(keel_mem_seq_cells(mem, 1), 24);
    assert_ok(keel_mem_check(mem));
    assert_int_equal(dir_entries(dir), before + 1);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    keel_context_close(c);
    keel_model_close(model);
}

static void test_model_sessions_change_nothing(void **state)
{
    (void)state;
    /* attention (full, sliding), hybrid (Gated DeltaNet + attention, the
     * states and checkpoints in the blob), recurrent only */
    /* the fifth: the sliding model with ring checkpoints (the rows a rewind
     * below the rings' reach restores, saved and loaded with the rest); the
     * sixth: sparse attention (deepseek32: the indexer keys in the blob,
     * top_k 16 of up to 256 cells) */
    /* the seventh: nemotron_h (Mamba2 states and checkpoints, KV without
     * RoPE, an MLP layer without memory) */
    /* the eighth: lfm2 (conv-only recurrent states beside full attention) */
    /* the ninth: the MLA cache without the indexer (deepseek2: one KV head
     * of [rope | kv_lora], V apart) */
    const char *archs[9] = {"llama", "gemma2", "qwen35", "mamba2", "gemma2", "deepseek32", "nemotron_h", "lfm2",
                            "deepseek2"};
    const int32_t ckpts[9] = {-1, -1, -1, -1, 6, -1, -1, -1, -1};
    for (int a = 0; a < 9; a++) {
        keel_model *m = gen_model(archs[a]);
        g_resumes = 0;
        for (uint64_t seed = 1; seed <= 3; seed++) {
            g_loads = 0;
            uint64_t plain = script(m, false, seed, ckpts[a]), with = script(m, true, seed, ckpts[a]);
            assert_true(g_loads >= 8); /* sequences moved and whole memories reloaded */
            if (plain != with)
                fail_msg("%s (checkpoints %d) seed %llu: logits differ after save/load", archs[a], ckpts[a],
                         (unsigned long long)seed);
        }
        printf("%s (checkpoints %d): %d rewinds resumed from a checkpoint\n", archs[a], ckpts[a], g_resumes);
        if ((a >= 2 && a <= 4) || a == 6 || a == 7) assert_true(g_resumes >= 2); /* checkpoints restored, loaded ones among them */
        if (a < 2 || a == 5 || a == 8) assert_int_equal(g_resumes, 0); /* no checkpoints without asking */
        keel_model_close(m);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_sequence),
        cmocka_unit_test(test_roundtrip_whole),
        cmocka_unit_test(test_corruption_refused),
        cmocka_unit_test(test_other_memory_refused),
        cmocka_unit_test(test_history_must_agree),
        cmocka_unit_test(test_bad_arguments_named),
        cmocka_unit_test(test_context_session_files),
        cmocka_unit_test(test_model_sessions_change_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
