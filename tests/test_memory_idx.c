/*
 * test_memory_idx.c — the sparse-attention indexer column (issue 12,
 * docs/memory.md "Sparse attention") through keel.h:
 *   - the plan counts the column exactly; bad parameters and misuse are
 *     refused with the memory unchanged;
 *   - top-k equals a double-precision recomputation from the test's own
 *     copy of the indexer keys (sets and outputs), fewer visible cells
 *     than top_k use them all, ties go to the lower position, and the
 *     choice obeys the sequence, causal and sliding rules;
 *   - two sequences in one unified table released at different times while
 *     others decode: every top-k set and output equals that of the same
 *     sequence run alone (bitwise), also for a slot saved mid-way and
 *     restored into another slot (keel_mem_save / keel_mem_load);
 *   - position edits re-rotate the stored indexer keys, compaction evicts
 *     them with their cells, checkpoints of a hybrid keep them, sessions
 *     convert them, and keel_mem_check catches a corrupted one.
 */
#include "testutil.h"

#include "base/base.h"
#include "memory/memory.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DK 48  /* K: rope 16 | 32 */
#define DV 32
#define DI 64  /* indexer key */
#define NH 2   /* query heads (one KV head) */
#define IH 4   /* indexer query heads */
#define MAXT 160

typedef struct h_cfg {
    keel_dtype kt, it;  /* K/V and indexer key types */
    bool rot;           /* Hadamard rotation of the indexer keys */
    bool idx_rope;      /* RoPE on the indexer keys */
    int32_t top_k;
    int32_t n_ctx, n_seq;
    bool sliding;       /* layer 0 sliding (window 12, 2 sinks) */
    bool deterministic;
    bool recurrent;     /* a recurrent layer too (checkpoints) */
    bool ring_ckpt;     /* checkpoints of an attention-only memory (ring rows) */
} h_cfg;

static h_cfg cfg_default(void)
{
    h_cfg c = {KEEL_DTYPE_F32, KEEL_DTYPE_F32, false, true, 8, 128, 4, false, false, false, false};
    return c;
}

static keel_mem_layer idx_layer(const h_cfg *c)
{
    keel_mem_layer l = keel_mem_layer_default();
    l.kind = c->sliding ? KEEL_MEM_LAYER_SLIDING : KEEL_MEM_LAYER_FULL;
    l.window = 12;
    l.n_sink = 2;
    l.n_kv_heads = 1;
    l.n_heads = NH;
    l.head_dim_k = DK;
    l.head_dim_v = DV;
    l.k_dtype = l.v_dtype = c->kt;
    l.rope.type = KEEL_ROPE_NORM;
    l.rope.n_rot = 16;
    l.idx_head_dim = DI;
    l.idx_n_heads = IH;
    l.idx_dtype = c->it;
    l.idx_rot.enabled = c->rot;
    l.idx_rot.block = 0;
    l.idx_rot.seed = 0;
    l.idx_top_k = c->top_k;
    l.idx_rope = keel_rope_default();
    l.idx_rope.type = c->idx_rope ? KEEL_ROPE_NEOX : KEEL_ROPE_NONE;
    l.idx_rope.n_rot = c->idx_rope ? 16 : 0;
    return l;
}

static keel_mem_config mem_cfg(const h_cfg *c, keel_mem_layer *ls)
{
    ls[0] = idx_layer(c);
    ls[1] = keel_mem_layer_default();
    ls[1].kind = KEEL_MEM_LAYER_RECURRENT;
    ls[1].rs.conv_kernel = 2;
    ls[1].rs.conv_channels = 3;
    ls[1].rs.state_floats = 4;
    keel_mem_config mc = keel_mem_config_default();
    mc.layers = ls;
    mc.n_layers = c->recurrent ? 2 : 1;
    mc.n_seq_max = c->n_seq;
    mc.n_ctx = c->n_ctx;
    mc.n_batch_max = 16;
    mc.n_threads = 2;
    mc.deterministic = c->deterministic;
    mc.n_ckpt = c->recurrent || c->ring_ckpt ? 2 : 0;
    return mc;
}

static keel_mem *open_mem(const h_cfg *c)
{
    keel_mem_layer ls[2];
    keel_mem_config mc = mem_cfg(c, ls);
    keel_mem *m = NULL;
    char err[256] = "";
    if (keel_mem_open(&mc, &m, err) != KEEL_OK) fail_msg("open: %s", err);
    return m;
}

/* ---- a token's data: a pure function of (conversation, position) -------- */

static void tok_data(uint64_t conv, int32_t pos, float *k, float *v, float *ik)
{
    uint64_t s = base_hash64(&pos, sizeof pos, conv * 0x9e3779b97f4a7c15ull + 17);
    test_fill_uniform(k, DK, s);
    test_fill_uniform(v, DV, s + 1);
    test_fill_uniform(ik, DI, s + 2);
}

/* Head weights in (0.1, 1.1): a score is 0 only when no head sees a positive
 * q.k (1 in 16 cells), so the double-precision reference below, which
 * breaks ties by position, meets no tie at the top_k boundary
 * (test_ties_as_llamacpp covers ties). */
static void query_data(uint64_t conv, int32_t pos, float *q, float *iq, float *iw)
{
    uint64_t s = base_hash64(&pos, sizeof pos, conv * 0x9e3779b97f4a7c15ull + 91);
    test_fill_uniform(q, NH * DK, s);
    test_fill_uniform(iq, IH * DI, s + 1);
    test_fill_uniform(iw, IH, s + 2);
    for (int32_t h = 0; h < IH; h++) iw[h] = 0.6f + 0.5f * iw[h];
}

static void rope_f(const keel_rope *r, float *x, int32_t d, int32_t pos)
{
    if (r->type == KEEL_ROPE_NONE) return;
    double y[DI];
    keel_rope rr = *r;
    (void)rr;
    for (int32_t i = 0; i < d; i++) y[i] = x[i];
    for (int32_t i = 0; i < r->n_rot / 2; i++) {
        double th = pos * pow((double)r->freq_base, -2.0 * i / (double)r->n_rot);
        int32_t a = r->type == KEEL_ROPE_NEOX ? i : 2 * i;
        int32_t b = r->type == KEEL_ROPE_NEOX ? i + r->n_rot / 2 : 2 * i + 1;
        y[a] = x[a] * cos(th) - x[b] * sin(th);
        y[b] = x[a] * sin(th) + x[b] * cos(th);
    }
    for (int32_t i = 0; i < d; i++) x[i] = (float)y[i];
}

/* Places n tokens of conversation conv at seq s (positions p0..), writing
 * every attention layer. cells: [n] of the idx layer's group. */
static void feed(keel_mem *m, const keel_mem_layer *L, int32_t s, uint64_t conv, int32_t p0, int32_t n,
                 int32_t *cells_out)
{
    int32_t pos[16], seq[16], cells[2 * 16];
    float k[16 * DK], v[16 * DV], ik[16 * DI];
    assert_true(n <= 16);
    for (int32_t i = 0; i < n; i++) {
        pos[i] = p0 + i;
        seq[i] = s;
        tok_data(conv, pos[i], k + i * DK, v + i * DV, ik + i * DI);
        rope_f(&L->rope, k + i * DK, DK, pos[i]);
        rope_f(&L->idx_rope, ik + i * DI, DI, pos[i]);
    }
    keel_mem_batch b = {n, pos, seq, NULL, NULL, NULL};
    assert_ok(keel_mem_place(m, &b, cells));
    int32_t g = keel_mem_layer_group(m, 0);
    assert_ok(keel_mem_write_kvi(m, 0, n, cells + g * n, k, v, ik));
    if (cells_out) memcpy(cells_out, cells + g * n, (size_t)n * sizeof(int32_t));
    if (keel_mem_is_recurrent(m))
        for (int32_t i = 0; i < n; i++) {
            float *conv_st = NULL, *state = NULL;
            assert_ok(keel_mem_rs_state(m, 1, s, &conv_st, &state));
            state[0] += 1.0f;
        }
}

/* Attends one query of conversation conv (seq s, position pos); out
 * [NH][DV], sel [top_k] (positions of the kept cells in order, -1 after). */
static void query(keel_mem *m, const keel_mem_layer *L, int32_t s, uint64_t conv, int32_t pos, int32_t top_k,
                  float *out, int32_t *sel_pos)
{
    float q[NH * DK], iq[IH * DI], iw[IH];
    query_data(conv, pos, q, iq, iw);
    for (int32_t h = 0; h < NH; h++) rope_f(&L->rope, q + h * DK, DK, pos);
    for (int32_t h = 0; h < IH; h++) rope_f(&L->idx_rope, iq + h * DI, DI, pos);
    int32_t sel[MAXT];
    keel_mem_attn a;
    memset(&a, 0, sizeof a);
    a.n_tokens = 1;
    a.n_heads = NH;
    a.q = q;
    a.pos = &pos;
    a.seq = &s;
    a.out = out;
    a.iq = iq;
    a.iw = iw;
    a.n_iq_heads = IH;
    a.top_k = top_k;
    a.sel = sel;
    assert_ok(keel_mem_attend(m, 0, &a));
    int32_t g = keel_mem_layer_group(m, 0);
    const mem_group *grp = &m->groups[g];
    int32_t k = top_k > 0 ? top_k : L->idx_top_k;
    for (int32_t j = 0; j < k; j++) {
        const mem_table *t = NULL;
        int32_t c = 0;
        if (sel[j] < 0) {
            sel_pos[j] = -1;
            continue;
        }
        assert_true(mem_cell_decode(grp, sel[j], &t, &c));
        assert_true(mem_seq_has(t, c, s));
        sel_pos[j] = t->pos[c];
    }
}

/* ---- a double-precision reference for one sequence (positions 0..n-1) --- */

/* Positions the reference keeps for a query at pos over positions
 * lo..hi (all visible), ties to the lower position; returns the count. */
static int32_t ref_topk(const keel_mem_layer *L, uint64_t conv, int32_t lo, int32_t hi, int32_t pos,
                        int32_t k, int32_t *keep, double *score_out)
{
    float q[NH * DK], iq[IH * DI], iw[IH], kk[DK], vv[DV], ik[DI];
    query_data(conv, pos, q, iq, iw);
    for (int32_t h = 0; h < IH; h++) rope_f(&L->idx_rope, iq + h * DI, DI, pos);
    double sc[MAXT];
    int32_t n = 0, ps[MAXT];
    for (int32_t p = lo; p <= hi; p++) {
        tok_data(conv, p, kk, vv, ik);
        rope_f(&L->idx_rope, ik, DI, p);
        double s = 0;
        for (int32_t h = 0; h < IH; h++) {
            double d = 0;
            for (int32_t j = 0; j < DI; j++) d += (double)iq[h * DI + j] * ik[j];
            if (d > 0) s += iw[h] * d;
        }
        ps[n] = p;
        sc[n++] = s;
    }
    /* selection: repeatedly the best remaining (highest score, lowest position) */
    bool used[MAXT] = {false};
    int32_t m = n < k ? n : k;
    for (int32_t j = 0; j < m; j++) {
        int32_t best = -1;
        for (int32_t i = 0; i < n; i++)
            if (!used[i] && (best < 0 || sc[i] > sc[best])) best = i;
        used[best] = true;
        keep[j] = ps[best];
        if (score_out) score_out[j] = sc[best];
    }
    /* in position order, as sel reports them (scores with them) */
    for (int32_t a = 0; a < m; a++)
        for (int32_t b = a + 1; b < m; b++)
            if (keep[b] < keep[a]) {
                int32_t t = keep[a];
                keep[a] = keep[b];
                keep[b] = t;
                if (score_out) {
                    double x = score_out[a];
                    score_out[a] = score_out[b];
                    score_out[b] = x;
                }
            }
    return m;
}

/* Attention in double over the kept positions. */
static void ref_attend(const keel_mem_layer *L, uint64_t conv, const int32_t *keep, int32_t n, int32_t pos,
                       double *out)
{
    float q[NH * DK], iq[IH * DI], iw[IH], kk[DK], vv[DV], ik[DI];
    query_data(conv, pos, q, iq, iw);
    for (int32_t h = 0; h < NH; h++) rope_f(&L->rope, q + h * DK, DK, pos);
    for (int32_t h = 0; h < NH; h++) {
        double sc[MAXT], mx = -INFINITY, l = 0, acc[DV] = {0};
        for (int32_t i = 0; i < n; i++) {
            tok_data(conv, keep[i], kk, vv, ik);
            rope_f(&L->rope, kk, DK, keep[i]);
            double s = 0;
            for (int32_t j = 0; j < DK; j++) s += (double)q[h * DK + j] * kk[j];
            sc[i] = s / sqrt((double)DK);
            if (sc[i] > mx) mx = sc[i];
        }
        for (int32_t i = 0; i < n; i++) {
            tok_data(conv, keep[i], kk, vv, ik);
            double p = exp(sc[i] - mx);
            l += p;
            for (int32_t j = 0; j < DV; j++) acc[j] += p * vv[j];
        }
        for (int32_t j = 0; j < DV; j++) out[h * DV + j] = acc[j] / l;
    }
}

/* ---- tests ----------------------------------------------------------------- */

static void test_plan_and_misuse(void **state)
{
    (void)state;
    h_cfg c = cfg_default();
    c.it = KEEL_DTYPE_F16;
    keel_mem_layer ls[2];
    keel_mem_config mc = mem_cfg(&c, ls);
    size_t with = mem_config_kv_bytes(&mc);
    keel_mem_layer plain = ls[0];
    plain.idx_head_dim = 0;
    keel_mem_config mc2 = mc;
    mc2.layers = &plain;
    size_t without = mem_config_kv_bytes(&mc2);
    /* the layer's plan counts the column exactly: one f16 row per cell */
    assert_int_equal(with - without, (size_t)c.n_ctx * DI * 2);
    size_t need = 0;
    assert_ok(keel_mem_config_bytes(&mc, &need));
    keel_mem *m = open_mem(&c);
    keel_mem_stats st;
    keel_mem_stats_get(m, &st);
    assert_int_equal(st.bytes_total, need);
    assert_int_equal(m->groups[0].tables[0].n_cols, 3);
    assert_int_equal(m->groups[0].tables[0].cols[2].kind, MEM_COL_IDX);
    /* bad parameters */
    keel_mem *bad = NULL;
    char err[256];
    keel_mem_layer b = ls[0];
    b.idx_top_k = 0;
    mc2.layers = &b;
    assert_status(keel_mem_open(&mc2, &bad, err), KEEL_EINVAL);
    b = ls[0];
    b.idx_head_dim = 40; /* f16 fine, rotation impossible */
    b.idx_rot.enabled = true;
    assert_status(keel_mem_open(&mc2, &bad, err), KEEL_EUNSUPPORTED);
    b = ls[0];
    b.idx_dtype = KEEL_DTYPE_Q8_0;
    b.idx_head_dim = 40; /* not a multiple of 32 */
    assert_status(keel_mem_open(&mc2, &bad, err), KEEL_EUNSUPPORTED);
    b = ls[0];
    b.idx_rope.n_rot = 80;
    assert_status(keel_mem_open(&mc2, &bad, err), KEEL_EINVAL);
    assert_null(bad);
    /* misuse: K/V without indexer keys, indexer queries on a layer without
     * a column, bad heads / top_k; nothing changes */
    feed(m, &ls[0], 0, 1, 0, 4, NULL);
    uint64_t before = keel_mem_digest(m);
    int32_t pos = 4, seq = 0, cells[2];
    keel_mem_batch bt = {1, &pos, &seq, NULL, NULL, NULL};
    float k[DK] = {0}, v[DV] = {0}, ik[DI] = {0}, q[NH * DK] = {0}, iq[IH * DI] = {0}, iw[IH] = {0}, out[NH * DV];
    int32_t cell0 = 0;
    assert_status(keel_mem_write(m, 0, 1, &cell0, k, v), KEEL_EINVAL);
    assert_true(strstr(keel_mem_last_error(m), "keel_mem_write_kvi") != NULL);
    keel_mem_attn a;
    memset(&a, 0, sizeof a);
    a.n_tokens = 1;
    a.n_heads = NH;
    a.q = q;
    a.pos = &pos;
    a.seq = &seq;
    a.out = out;
    a.iq = iq;
    a.iw = iw;
    a.n_iq_heads = IH + 1;
    assert_status(keel_mem_attend(m, 0, &a), KEEL_EINVAL);
    a.n_iq_heads = IH;
    a.top_k = c.top_k + 1;
    assert_status(keel_mem_attend(m, 0, &a), KEEL_EINVAL);
    a.top_k = 0;
    a.iw = NULL;
    assert_status(keel_mem_attend(m, 0, &a), KEEL_EINVAL);
    assert_int_equal(keel_mem_digest(m), before);
    (void)bt;
    (void)cells;
    (void)ik;
    keel_mem_close(m);
    /* a layer without the column refuses indexer keys and queries */
    keel_mem_layer nl = keel_mem_layer_default();
    nl.n_kv_heads = 1;
    nl.head_dim_k = DK;
    nl.head_dim_v = DV;
    nl.rope.n_rot = 16;
    keel_mem_config mc3 = keel_mem_config_default();
    mc3.layers = &nl;
    mc3.n_layers = 1;
    mc3.n_ctx = 16;
    mc3.n_threads = 1;
    assert_ok(keel_mem_open(&mc3, &m, err));
    assert_ok(keel_mem_place(m, &bt, cells));
    assert_status(keel_mem_write_kvi(m, 0, 1, cells, k, v, ik), KEEL_EINVAL);
    a.iw = iw;
    a.n_heads = 1;
    assert_status(keel_mem_attend(m, 0, &a), KEEL_EINVAL);
    keel_mem_close(m);
}

/* top-k sets and outputs against the double-precision reference, at every
 * position of a sequence (fewer visible cells than top_k at the start) */
static void check_against_ref(h_cfg c, double out_tol)
{
    keel_mem *m = open_mem(&c);
    keel_mem_layer L = idx_layer(&c);
    int32_t n = 0;
    double worst = 0;
    while (n < 70) {
        int32_t k = 1 + (n * 7) % 9;
        feed(m, &L, 0, 5, n, k, NULL);
        n += k;
        int32_t p = n - 1, sel[MAXT], keep[MAXT];
        float out[NH * DV];
        double want[NH * DV];
        query(m, &L, 0, 5, p, 0, out, sel);
        int32_t nk = ref_topk(&L, 5, 0, p, p, c.top_k, keep, NULL);
        for (int32_t j = 0; j < c.top_k; j++) {
            int32_t w = j < nk ? keep[j] : -1;
            if (sel[j] != w) fail_msg("pos %d: kept position %d is %d, reference %d", p, j, sel[j], w);
        }
        ref_attend(&L, 5, keep, nk, p, want);
        for (int32_t j = 0; j < NH * DV; j++) worst = fmax(worst, fabs(want[j] - out[j]));
    }
    assert_true(worst <= out_tol);
    assert_ok(keel_mem_check(m));
    keel_mem_close(m);
}

static void test_topk_matches_reference(void **state)
{
    (void)state;
    h_cfg c = cfg_default();
    check_against_ref(c, 1e-5);
    c.rot = true; /* rotated f32: the same sets (scores move by float rounding only) */
    check_against_ref(c, 1e-5);
    c.deterministic = true;
    check_against_ref(c, 1e-5);
    c.deterministic = false;
    c.top_k = 100; /* more than ever visible: dense attention over all of them */
    check_against_ref(c, 1e-5);
}

/* equal scores: the lower position wins; iw = 0 makes every score 0 */
static void test_ties_and_visibility(void **state)
{
    (void)state;
    h_cfg c = cfg_default();
    c.idx_rope = false;
    keel_mem *m = open_mem(&c);
    keel_mem_layer L = idx_layer(&c);
    /* sequence 0 and 1 interleaved in one table, identical indexer keys */
    int32_t pos[1], seq[1], cells[1];
    float k[DK], v[DV], ik[DI];
    test_fill_uniform(ik, DI, 3);
    for (int32_t p = 0; p < 40; p++)
        for (int32_t s = 0; s < 2; s++) {
            pos[0] = p;
            seq[0] = s;
            test_fill_uniform(k, DK, (uint64_t)(100 * p + s));
            test_fill_uniform(v, DV, (uint64_t)(100 * p + s + 50));
            keel_mem_batch b = {1, pos, seq, NULL, NULL, NULL};
            assert_ok(keel_mem_place(m, &b, cells));
            assert_ok(keel_mem_write_kvi(m, 0, 1, cells, k, v, ik));
        }
    float out[NH * DV];
    int32_t sel[MAXT];
    /* every score equal: positions 0..7 of the query's own sequence, never
     * the other's, never past the query (causal) */
    for (int32_t s = 0; s < 2; s++) {
        query(m, &L, s, 9, 30, 0, out, sel);
        for (int32_t j = 0; j < 8; j++) assert_int_equal(sel[j], j);
    }
    /* a query at position 3 sees 4 cells: all of them, -1 after */
    query(m, &L, 1, 9, 3, 0, out, sel);
    for (int32_t j = 0; j < 8; j++) assert_int_equal(sel[j], j < 4 ? j : -1);
    keel_mem_close(m);
    /* sliding: sinks and the window only */
    c.sliding = true;
    c.n_seq = 1;
    c.top_k = 20;
    m = open_mem(&c);
    L = idx_layer(&c);
    for (int32_t p = 0; p < 40; p += 8) feed(m, &L, 0, 4, p, 8, NULL);
    query(m, &L, 0, 4, 39, 0, out, sel);
    /* window 12 at 39: positions 28..39, plus sinks 0 and 1: 14 cells */
    int32_t want[14] = {0, 1, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39};
    for (int32_t j = 0; j < 20; j++) assert_int_equal(sel[j], j < 14 ? want[j] : -1);
    keel_mem_close(m);
}

/* Equal scores across the top_k boundary are kept or dropped as llama.cpp's
 * CPU top_k (libstdc++'s std::partial_sort over the cells in position
 * order) keeps them: scores from {-1, 0, 1, 2} (exact in f32), and the
 * kept positions std::partial_sort gave for them (g++ 12, libstdc++),
 * each case one where "the lower position wins" would keep others. */
static const struct {
    int32_t n, k;
    int8_t v[40];
    int32_t keep[12];
} g_tie_cases[] = {
    {25, 12, {2, 1, 2, 0, 2, 0, 2, -1, 2, 0, 1, 1, -1, 2, 1, 0, 1, -1, 2, 0, 1, -1, 0, 2, 0}, {0, 1, 2, 4, 6, 8, 10, 13, 14, 16, 18, 23}},
    {23, 12, {0, -1, 0, -1, 0, 0, -1, 2, 1, -1, 1, 1, -1, -1, 0, -1, 0, -1, 0, -1, 2, -1, 1}, {0, 4, 5, 7, 8, 10, 11, 14, 16, 18, 20, 22}},
    {25, 11, {-1, 2, 1, -1, 2, 0, 1, 0, 1, 1, 0, -1, 1, 0, 0, 1, -1, 2, 0, -1, -1, -1, -1, 2, -1}, {1, 2, 4, 6, 7, 8, 9, 12, 15, 17, 23}},
    {21, 5, {0, 2, -1, 0, 0, 2, -1, 1, 1, 1, 2, -1, 0, 0, -1, -1, -1, 1, 1, 0, -1}, {1, 5, 8, 9, 10}},
    {27, 8, {2, 0, 1, 0, 1, 1, 1, 0, 1, -1, -1, 0, 0, -1, 2, 1, -1, -1, -1, -1, 2, 2, 0, 0, 1, 2, 2}, {0, 4, 8, 14, 20, 21, 25, 26}},
};

static void test_ties_as_llamacpp(void **state)
{
    (void)state;
    h_cfg c = cfg_default();
    c.idx_rope = false;
    c.top_k = 16;
    for (size_t tc = 0; tc < sizeof g_tie_cases / sizeof g_tie_cases[0]; tc++) {
        keel_mem *m = open_mem(&c);
        int32_t n = g_tie_cases[tc].n, k = g_tie_cases[tc].k;
        /* score = relu(ik_0) - relu(ik_1) = v: head 0 reads dim 0 with weight
         * 1, head 1 dim 1 with weight -1 */
        for (int32_t p = 0; p < n; p++) {
            int32_t pos = p, seq = 0, cell;
            float kk[DK] = {0}, vv[DV] = {0}, ik[DI] = {0};
            float v = g_tie_cases[tc].v[p];
            ik[0] = v > 0 ? v : 0;
            ik[1] = v < 0 ? -v : 0;
            vv[0] = (float)p;
            keel_mem_batch b = {1, &pos, &seq, NULL, NULL, NULL};
            assert_ok(keel_mem_place(m, &b, &cell));
            assert_ok(keel_mem_write_kvi(m, 0, 1, &cell, kk, vv, ik));
        }
        float q[NH * DK] = {0}, iq[2 * DI] = {0}, iw[2] = {1.0f, -1.0f}, out[NH * DV];
        iq[0] = 1.0f;
        iq[DI + 1] = 1.0f;
        int32_t pos = n - 1, seq = 0, sel[16];
        keel_mem_attn a;
        memset(&a, 0, sizeof a);
        a.n_tokens = 1;
        a.n_heads = NH;
        a.q = q;
        a.pos = &pos;
        a.seq = &seq;
        a.out = out;
        a.iq = iq;
        a.iw = iw;
        a.n_iq_heads = 2;
        a.top_k = k;
        a.sel = sel;
        assert_ok(keel_mem_attend(m, 0, &a));
        for (int32_t j = 0; j < k; j++)
            if (sel[j] != g_tie_cases[tc].keep[j])
                fail_msg("case %zu: kept cell %d is %d, std::partial_sort keeps %d", tc, j, sel[j],
                         g_tie_cases[tc].keep[j]);
        /* equal q.k everywhere: the output is the mean of the kept values */
        double mean = 0;
        for (int32_t j = 0; j < k; j++) mean += g_tie_cases[tc].keep[j];
        assert_close(out[0], mean / k, 1e-4);
        keel_mem_close(m);
    }
}

/* One scripted run of three conversations: A decodes throughout in seq 0,
 * B in seq 1 is released (seq_rm) at step 25 and C starts in seq 1 reusing
 * its cells, D in seq 2 runs until step 40; with `alone`, only
 * conversation `only` runs, in a memory of its own. Records A's (or
 * only's) sets and outputs per step. */
typedef struct trace {
    int32_t sel[60][16];
    float out[60][NH * DV];
    int32_t len[60]; /* A's tokens at the query */
    int32_t n;
} trace;

static void scenario(const h_cfg *c, int only, trace *tr, bool save_mid)
{
    keel_mem *m = open_mem(c);
    keel_mem_layer L = idx_layer(c);
    int32_t len[4] = {0, 0, 0, 0};
    static uint8_t blob[1 << 20];
    int32_t slot_a = 0; /* where A lives (moves at the save) */
    tr->n = 0;
    for (int32_t step = 0; step < 60; step++) {
        /* conversations: 0 = A (seq 0), 1 = B (seq 1, steps < 25), 2 = C
         * (seq 1, steps >= 25), 3 = D (seq 2, steps < 40) */
        for (int conv = 0; conv < 4; conv++) {
            bool live = conv == 0 || (conv == 1 && step < 25) || (conv == 2 && step >= 25) ||
                        (conv == 3 && step < 40);
            if (!live || (only >= 0 && conv != only)) continue;
            int32_t s = only >= 0 ? 0 : conv == 0 ? slot_a : conv == 3 ? 2 : 1;
            int32_t n = step == 0 || (conv == 2 && step == 25) ? 5 : 1 + step % 2;
            feed(m, &L, s, 100 + (uint64_t)conv, len[conv], n, NULL);
            len[conv] += n;
            if (conv == 0 || only >= 0) {
                query(m, &L, s, 100 + (uint64_t)conv, len[conv] - 1, 16, tr->out[tr->n], tr->sel[tr->n]);
                tr->len[tr->n++] = len[conv];
            }
        }
        if (only < 0 && step == 24) assert_ok(keel_mem_seq_rm(m, 1, -1, -1)); /* release B */
        if (only < 0 && step == 39) assert_ok(keel_mem_seq_rm(m, 2, -1, -1)); /* release D */
        if (save_mid && only < 0 && step == 30) {
            /* A's slot saved, released, restored into slot 3 */
            size_t n = 0;
            int32_t nt = 0;
            assert_ok(keel_mem_save(m, slot_a, 7, NULL, 0, 0, blob, sizeof blob, &n));
            assert_ok(keel_mem_seq_rm(m, slot_a, -1, -1));
            assert_ok(keel_mem_load(m, 3, blob, n, 7, 0, NULL, 0, &nt, NULL));
            slot_a = 3;
        }
        assert_ok(keel_mem_check(m));
    }
    keel_mem_close(m);
}

static void test_two_slot_release(void **state)
{
    (void)state;
    for (int variant = 0; variant < 3; variant++) {
        h_cfg c = cfg_default();
        c.top_k = 16;
        c.it = variant == 0 ? KEEL_DTYPE_F16 : variant == 1 ? KEEL_DTYPE_Q8_0 : KEEL_DTYPE_F32;
        c.rot = variant < 2;
        c.kt = variant == 1 ? KEEL_DTYPE_F16 : KEEL_DTYPE_F32;
        c.deterministic = variant == 2;
        c.n_ctx = 160;
        static trace alone, shared, moved;
        scenario(&c, 0, &alone, false);
        scenario(&c, -1, &shared, false);
        scenario(&c, -1, &moved, true);
        assert_int_equal(alone.n, shared.n);
        assert_int_equal(alone.n, moved.n);
        int32_t sparse_steps = 0;
        for (int32_t i = 0; i < alone.n; i++) {
            if (memcmp(alone.sel[i], shared.sel[i], sizeof alone.sel[i]) != 0)
                fail_msg("variant %d step %d: A's top-k differs with B, C and D in the table", variant, i);
            if (memcmp(alone.sel[i], moved.sel[i], sizeof alone.sel[i]) != 0)
                fail_msg("variant %d step %d: A's top-k differs after its slot was saved and restored",
                         variant, i);
            /* the same rows in the same order: bitwise the same output */
            if (memcmp(alone.out[i], shared.out[i], sizeof alone.out[i]) != 0 ||
                memcmp(alone.out[i], moved.out[i], sizeof alone.out[i]) != 0)
                fail_msg("variant %d step %d: A's attention output differs", variant, i);
            sparse_steps += alone.len[i] > 16; /* chosen among more cells than it keeps */
        }
        assert_true(sparse_steps > 20); /* the choice was made among more cells than it keeps */
    }
}

/* seq_add re-rotates the stored indexer keys: the choice after the shift
 * equals the choice of keys written at the new positions */
static void test_edit_rerotates(void **state)
{
    (void)state;
    h_cfg c = cfg_default();
    c.rot = true;
    keel_mem *m = open_mem(&c);
    keel_mem_layer L = idx_layer(&c);
    /* conversation 6 written at positions 10.., shifted by -10, against a
     * reference of the same data at 0.. */
    int32_t pos[16], seq[16], cells[16];
    float k[16 * DK], v[16 * DV], ik[16 * DI];
    for (int32_t b0 = 0; b0 < 48; b0 += 16) {
        for (int32_t i = 0; i < 16; i++) {
            int32_t p = b0 + i;
            pos[i] = p + 10;
            seq[i] = 0;
            tok_data(6, p, k + i * DK, v + i * DV, ik + i * DI);
            rope_f(&L.rope, k + i * DK, DK, pos[i]);
            rope_f(&L.idx_rope, ik + i * DI, DI, pos[i]);
        }
        keel_mem_batch b = {16, pos, seq, NULL, NULL, NULL};
        assert_ok(keel_mem_place(m, &b, cells));
        assert_ok(keel_mem_write_kvi(m, 0, 16, cells, k, v, ik));
    }
    assert_ok(keel_mem_seq_add(m, 0, 10, -1, -10));
    assert_ok(keel_mem_check(m));
    float out[NH * DV];
    double want[NH * DV];
    int32_t sel[MAXT], keep[MAXT];
    query(m, &L, 0, 6, 47, 0, out, sel);
    int32_t nk = ref_topk(&L, 6, 0, 47, 47, c.top_k, keep, NULL);
    for (int32_t j = 0; j < nk; j++) assert_int_equal(sel[j], keep[j]);
    ref_attend(&L, 6, keep, nk, 47, want);
    for (int32_t j = 0; j < NH * DV; j++) assert_close(out[j], want[j], 1e-4);
    keel_mem_close(m);
}

/* compaction evicts the indexer keys with their cells: afterwards the
 * choice is the reference's among the kept positions */
static void test_compaction(void **state)
{
    (void)state;
    h_cfg c = cfg_default();
    c.it = KEEL_DTYPE_F16;
    c.rot = true;
    keel_mem *m = open_mem(&c);
    keel_mem_layer L = idx_layer(&c);
    for (int32_t p = 0; p < 64; p += 16) feed(m, &L, 0, 8, p, 16, NULL);
    keel_compact_params cp = keel_compact_params_default();
    cp.policy = KEEL_COMPACT_KEYDIFF;
    cp.trigger = 40;
    cp.target = 32;
    cp.renumber = false;
    assert_ok(keel_mem_compact(m, 0, &cp));
    assert_ok(keel_mem_check(m));
    assert_int_equal(keel_mem_seq_cells(m, 0), 32);
    /* the kept positions, and the choice among them */
    const mem_table *t = &m->groups[0].tables[0];
    int32_t kept[64], nkept = 0;
    for (int32_t p = 0; p < 64; p++)
        for (int32_t cc = 0; cc < t->cap; cc++)
            if (t->pos[cc] == p) kept[nkept++] = p;
    assert_int_equal(nkept, 32);
    float out[NH * DV];
    int32_t sel[MAXT];
    query(m, &L, 0, 8, 63, 0, out, sel);
    /* reference: scores of every kept position, the best 8 */
    int32_t all[MAXT];
    double sc[MAXT];
    int32_t n_all = ref_topk(&L, 8, 0, 63, 63, 64, all, sc);
    (void)n_all;
    /* recompute per kept position (ref_topk sorted by position: sc is in
     * selection order, so redo it here) */
    double best[MAXT];
    int32_t bp[MAXT], nb = 0;
    for (int32_t i = 0; i < nkept; i++) {
        int32_t one[1];
        double s1[1];
        ref_topk(&L, 8, kept[i], kept[i], 63, 1, one, s1);
        bp[nb] = kept[i];
        best[nb++] = s1[0];
    }
    int32_t want[8];
    bool used[MAXT] = {false};
    for (int32_t j = 0; j < 8; j++) {
        int32_t b = -1;
        for (int32_t i = 0; i < nb; i++)
            if (!used[i] && (b < 0 || best[i] > best[b])) b = i;
        used[b] = true;
        want[j] = bp[b];
    }
    for (int32_t a = 0; a < 8; a++)
        for (int32_t b = a + 1; b < 8; b++)
            if (want[b] < want[a]) {
                int32_t x = want[a];
                want[a] = want[b];
                want[b] = x;
            }
    for (int32_t j = 0; j < 8; j++) assert_int_equal(sel[j], want[j]);
    /* renumbering: the kept keys (indexer ones too) follow their new positions */
    feed(m, &L, 0, 8, 64, 16, NULL);
    cp.renumber = true;
    assert_ok(keel_mem_compact(m, 0, &cp));
    assert_ok(keel_mem_check(m));
    assert_int_equal(keel_mem_seq_pos_max(m, 0), 31);
    keel_mem_close(m);
}

/* 48 tokens fed with a checkpoint at 16, then a rewind to 16 (seq_rm, or
 * via_restore: keel_mem_ckpt_restore) and token 16 again: its kept set and
 * output equal those of a memory that only ever saw tokens 0..16. */
static void rewind_equals_recompute(const h_cfg *c, uint64_t seed, bool via_restore)
{
    keel_mem *m = open_mem(c), *m2 = NULL;
    keel_mem_layer L = idx_layer(c);
    float o1[NH * DV], o2[NH * DV];
    int32_t s1[MAXT], s2[MAXT];
    feed(m, &L, 0, seed, 0, 16, NULL);
    assert_ok(keel_mem_ckpt_take(m, 0));
    feed(m, &L, 0, seed, 16, 16, NULL);
    feed(m, &L, 0, seed, 32, 16, NULL);
    if (via_restore) {
        int32_t at = -1;
        assert_ok(keel_mem_ckpt_restore(m, 0, 16, &at));
        assert_int_equal(at, 16);
    } else {
        assert_ok(keel_mem_seq_rm(m, 0, 16, -1));
    }
    assert_int_equal(keel_mem_seq_pos_max(m, 0), 15);
    assert_ok(keel_mem_check(m));
    feed(m, &L, 0, seed, 16, 1, NULL);
    m2 = open_mem(c);
    feed(m2, &L, 0, seed, 0, 16, NULL);
    feed(m2, &L, 0, seed, 16, 1, NULL);
    query(m, &L, 0, seed, 16, 0, o1, s1);
    query(m2, &L, 0, seed, 16, 0, o2, s2);
    assert_memory_equal(s1, s2, 8 * sizeof(int32_t));
    assert_memory_equal(o1, o2, sizeof o1);
    keel_mem_close(m2);
    keel_mem_close(m);
}

/* sessions carry the column: a round trip is byte-identical, a memory
 * without it refuses the blob, another dtype converts on request; a
 * hybrid's checkpoints keep the ring's indexer keys */
static void test_sessions_and_checkpoints(void **state)
{
    (void)state;
    h_cfg c = cfg_default();
    c.it = KEEL_DTYPE_F16; /* unrotated: converting to f32 keeps every score */
    keel_mem *m = open_mem(&c);
    keel_mem_layer L = idx_layer(&c);
    for (int32_t p = 0; p < 40; p += 10) feed(m, &L, 0, 2, p, 10, NULL);
    feed(m, &L, 1, 3, 0, 12, NULL);
    static uint8_t blob[1 << 20];
    size_t n = 0;
    int32_t nt = 0;
    assert_ok(keel_mem_save(m, -1, 0, NULL, 0, 0, blob, sizeof blob, &n));
    keel_mem *m2 = open_mem(&c);
    assert_ok(keel_mem_load(m2, -1, blob, n, 0, 0, NULL, 0, &nt, NULL));
    /* saved again, the blob is the same bytes: every indexer key came back */
    static uint8_t blob2[1 << 20];
    size_t n2 = 0;
    assert_ok(keel_mem_save(m2, -1, 0, NULL, 0, 0, blob2, sizeof blob2, &n2));
    assert_int_equal(n2, n);
    assert_memory_equal(blob, blob2, n);
    keel_mem_close(m2);
    /* no indexer column here: refused, unchanged */
    h_cfg c2 = c;
    keel_mem_layer ls[2];
    keel_mem_config mc = mem_cfg(&c2, ls);
    ls[0].idx_head_dim = 0;
    char err[256];
    assert_ok(keel_mem_open(&mc, &m2, err));
    uint64_t d0 = keel_mem_digest(m2);
    assert_status(keel_mem_load(m2, -1, blob, n, 0, 0, NULL, 0, &nt, NULL), KEEL_EINVAL);
    assert_true(strstr(keel_mem_last_error(m2), "indexer") != NULL);
    assert_int_equal(keel_mem_digest(m2), d0);
    keel_mem_close(m2);
    /* f32 indexer keys here: refused, then converted on request; the
     * choice of a query is the same */
    c2.it = KEEL_DTYPE_F32;
    m2 = open_mem(&c2);
    d0 = keel_mem_digest(m2);
    assert_status(keel_mem_load(m2, -1, blob, n, 0, 0, NULL, 0, &nt, NULL), KEEL_EUNSUPPORTED);
    assert_int_equal(keel_mem_digest(m2), d0);
    assert_ok(keel_mem_load(m2, -1, blob, n, 0, KEEL_SESSION_CONVERT, NULL, 0, &nt, NULL));
    assert_ok(keel_mem_check(m2));
    float o1[NH * DV], o2[NH * DV];
    int32_t s1[MAXT], s2[MAXT];
    query(m, &L, 0, 2, 39, 0, o1, s1);
    query(m2, &L, 0, 2, 39, 0, o2, s2);
    assert_memory_equal(s1, s2, 8 * sizeof(int32_t));
    keel_mem_close(m2);
    keel_mem_close(m);
    /* a hybrid: sliding indexer layer + recurrent layer; rewind to a
     * checkpoint after the ring forgot the keys: the next token's choice
     * equals that of a recompute of the prefix */
    c = cfg_default();
    c.sliding = true;
    c.recurrent = true;
    c.n_seq = 1;
    rewind_equals_recompute(&c, 11, false);
    /* attention only, ring checkpoints: keel_mem_ckpt_restore brings back
     * the ring cells with their indexer keys (sinks 0, 1 and positions 4..15
     * of the window 12: the rows the later tokens had evicted) */
    c = cfg_default();
    c.sliding = true;
    c.ring_ckpt = true;
    c.n_seq = 1;
    rewind_equals_recompute(&c, 12, true);
}

/* keel_mem_check reads the column: a NaN indexer key is caught and named */
static void test_check_catches_bad_key(void **state)
{
    (void)state;
    h_cfg c = cfg_default();
    keel_mem *m = open_mem(&c);
    keel_mem_layer L = idx_layer(&c);
    feed(m, &L, 0, 1, 0, 4, NULL);
    assert_ok(keel_mem_check(m));
    mem_table *t = &m->groups[0].tables[0];
    mem_col *ic = &t->cols[2];
    float nan = NAN;
    memcpy(mem_col_row(t, ic, 0, 1) + 4, &nan, sizeof nan);
    assert_status(keel_mem_check(m), KEEL_EINTERNAL);
    assert_true(strstr(keel_mem_last_error(m), "indexer key") != NULL);
    keel_mem_close(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_and_misuse),
        cmocka_unit_test(test_topk_matches_reference),
        cmocka_unit_test(test_ties_and_visibility),
        cmocka_unit_test(test_ties_as_llamacpp),
        cmocka_unit_test(test_two_slot_release),
        cmocka_unit_test(test_edit_rerotates),
        cmocka_unit_test(test_compaction),
        cmocka_unit_test(test_sessions_and_checkpoints),
        cmocka_unit_test(test_check_catches_bad_key),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
