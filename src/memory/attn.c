/*
 * attn.c — attention over the cache: out = softmax(q K^T * scale + mask) V.
 *
 * Method
 *   - Queries are rotated into each column's storage basis (H D q when K is
 *     Hadamard-rotated) and converted once to the K dtype's vec_dot type
 *     (q8_0 / q8_1 for quantized K, f32 otherwise), so scores are dot
 *     products against stored rows without decoding them.
 *   - Work is split into tasks of (token block, KV range). A task walks its
 *     cells in blocks, computes visibility for each token once, and for each
 *     KV head reads each K and V row once for all query heads of the GQA
 *     group and all tokens of the block.
 *   - Online softmax in f32: per (token, head) a running max m, sum l and
 *     accumulator acc; V rows are accumulated in the V column's storage
 *     basis and the rotation is undone once on the output (D H acc).
 *   - Long contexts with few query tokens split the cell range across
 *     threads; partial (m, l, acc) are merged afterwards.
 *   - Learned sink logits add exp(sink - m) to the denominator only.
 *   - Scores are scaled, then soft-capped (cap * tanh(s / cap)), then masked.
 *   - Sparse attention (an indexer column and a->iq): each query token is its
 *     own block; it scores every cell it may see against its indexer query
 *     (sum_h w_h relu(q_h . ik)), keeps the top_k highest, and attends over
 *     those cells sorted by (position, stamp): the same path as
 *     deterministic mode over a list, so the result depends neither on the
 *     physical layout nor on the other queries. Equal scores across the
 *     top_k boundary (relu makes exact zeros common) are resolved by the
 *     binary-heap selection of libstdc++'s std::partial_sort run over the
 *     visible cells in (position, stamp) order, which is how llama.cpp's CPU
 *     top_k resolves them for a sequence in a fresh context (its cells in
 *     position order); without such a tie the kept set is simply the top_k.
 *
 * Scratch (reserved at open by mem_attn_scratch_bytes): prepared queries for
 * n_batch_max tokens, per-thread score tiles, partials for split tasks. None
 * of it depends on the context length.
 */
#include "attn_kernels.h"

#include <math.h>
#include <string.h>

#define ATTN_TB 32     /* query tokens per block */
#define ATTN_CHUNK 512 /* cells whose visibility is computed at once */

typedef mem_attn_dims attn_dims;

mem_attn_dims mem_attn_dims_of(const keel_mem_config *cfg, const keel_mem_layer *layers)
{
    attn_dims d = {1, 1, 1, 1, 4, cfg->deterministic ? cfg->n_ctx : 0, 0, 0, 0, 0, 0};
    /* sparse attention lists a query's visible cells (and scores them) */
    for (int32_t i = 0; i < cfg->n_layers; i++)
        if (mem_layer_has_kv(&layers[i]) && layers[i].idx_head_dim > 0) d.vis_cap = cfg->n_ctx;
    for (int32_t i = 0; i < cfg->n_layers; i++) {
        const keel_mem_layer *l = &layers[i];
        if (!mem_layer_has_kv(l)) continue;
        int32_t nh = l->n_heads ? l->n_heads : l->n_kv_heads;
        d.n_heads_max = BASE_MAX(d.n_heads_max, nh);
        d.g_max = BASE_MAX(d.g_max, nh / BASE_MAX(l->n_kv_heads, 1));
        d.dk_max = BASE_MAX(d.dk_max, l->head_dim_k);
        d.dv_max = BASE_MAX(d.dv_max, l->head_dim_v);
        keel_dtype vt = tensor_vec_dot_type(l->k_dtype);
        size_t rb = tensor_row_bytes(vt, l->head_dim_k);
        d.qrow_max = BASE_MAX(d.qrow_max, rb);
        if (l->idx_head_dim > 0) {
            d.ih_max = BASE_MAX(d.ih_max, l->idx_n_heads);
            d.ik_max = BASE_MAX(d.ik_max, l->idx_head_dim);
            d.topk_max = BASE_MAX(d.topk_max, BASE_MIN(l->idx_top_k, cfg->n_ctx));
            keel_dtype it = tensor_vec_dot_type(l->idx_dtype);
            d.iqrow_max = BASE_MAX(d.iqrow_max, tensor_row_bytes(it, l->idx_head_dim));
        }
    }
    return d;
}

static int32_t max_partials(int32_t n_threads)
{
    return 4 * n_threads + 4;
}

static inline size_t up64(size_t x)
{
    return (x + (BASE_ALIGN - 1)) & ~(size_t)(BASE_ALIGN - 1);
}

/* per-thread layout: scores [TB * G][CB] f32 | vis [TB][CHUNK] u8 | idx [CHUNK] i32 |
 * m, l [TB * n_heads] f32 each | q row pointers [TB * G] | acc row pointers
 * [TB * G] | active rows [TB * G] u8 | deterministic mode: the query's
 * ordered visible cells [order_cap] i32 (sparse attention: its visible cells,
 * [vis_cap]; the larger of the two) | sparse attention: the kept cells
 * [topk_max] i32, their scores [topk_max] f32, every cell's score [vis_cap] f32 */
typedef struct thread_layout {
    size_t vis, idx, ml, qp, ap, act, order, kept, hs, sall, total;
} thread_layout;

static thread_layout layout_of(const attn_dims *d)
{
    thread_layout l;
    size_t rows = (size_t)ATTN_TB * (size_t)d->g_max;
    l.vis = up64(rows * ATTN_CB * sizeof(float));
    l.idx = l.vis + up64((size_t)ATTN_CHUNK * ATTN_TB);
    l.ml = l.idx + up64((size_t)ATTN_CHUNK * sizeof(int32_t));
    l.qp = l.ml + up64(2 * (size_t)ATTN_TB * (size_t)d->n_heads_max * sizeof(float));
    l.ap = l.qp + up64(rows * sizeof(void *));
    l.act = l.ap + up64(rows * sizeof(float *));
    l.order = l.act + up64(rows);
    l.kept = l.order + up64((size_t)BASE_MAX(d->order_cap, d->vis_cap) * sizeof(int32_t));
    l.hs = l.kept + up64((size_t)d->topk_max * sizeof(int32_t));
    l.sall = l.hs + up64((size_t)d->topk_max * sizeof(float));
    l.total = l.sall + up64((size_t)d->vis_cap * sizeof(float));
    return l;
}

static size_t thread_bytes(const attn_dims *d)
{
    return layout_of(d).total;
}

static size_t partial_floats(const attn_dims *d)
{
    return (size_t)ATTN_TB * (size_t)d->n_heads_max * ((size_t)d->dv_max + 2);
}

size_t mem_attn_scratch_bytes(const keel_mem_config *cfg, const keel_mem_layer *layers,
                              int32_t n_threads, int32_t max_cap)
{
    (void)max_cap;
    attn_dims d = mem_attn_dims_of(cfg, layers);
    size_t nb = (size_t)cfg->n_batch_max;
    size_t s = 0;
    /* prepared queries: f32 rotated + vec_dot rows */
    s += nb * (size_t)d.n_heads_max * (size_t)d.dk_max * sizeof(float) + BASE_ALIGN;
    s += nb * (size_t)d.n_heads_max * d.qrow_max + BASE_ALIGN;
    /* prepared indexer queries: f32 rotated + vec_dot rows */
    s += nb * (size_t)d.ih_max * (size_t)d.ik_max * sizeof(float) + BASE_ALIGN;
    s += nb * (size_t)d.ih_max * d.iqrow_max + BASE_ALIGN;
    /* token blocks: table index, first token, count, occupied extent */
    s += (nb + 1) * 5 * sizeof(int32_t) + BASE_ALIGN;
    s += thread_bytes(&d) * (size_t)n_threads + BASE_ALIGN;
    s += (size_t)max_partials(n_threads) * partial_floats(&d) * sizeof(float) + BASE_ALIGN;
    return s + 4 * BASE_ALIGN;
}

/* ---- scalar kernels (every dtype) ---------------------------------------- */

void attn_kq_scalar(keel_dtype kt, const uint8_t *base, size_t rb, const int32_t *idx, int32_t n,
                    const void *const *q, int32_t R, int32_t dk, float *scores, attn_pf pf)
{
    (void)pf;
    for (int32_t j = 0; j < n; j++) {
        const uint8_t *k = base + (size_t)idx[j] * rb;
        for (int32_t r = 0; r < R; r++) scores[r * ATTN_CB + j] = tensor_vec_dot(kt, dk, k, q[r]);
    }
}

void attn_pv_scalar(keel_dtype vt, const uint8_t *base, size_t rb, const int32_t *idx, int32_t n,
                    const float *p, const uint8_t *active, int32_t R, int32_t dv, float *const *acc,
                    attn_pf pf)
{
    (void)pf;
    for (int32_t j = 0; j < n; j++) {
        const uint8_t *v = base + (size_t)idx[j] * rb;
        for (int32_t r = 0; r < R; r++)
            if (active[r] && p[r * ATTN_CB + j] != 0.0f)
                tensor_axpy_row(vt, dv, p[r * ATTN_CB + j], v, acc[r]);
    }
}

float attn_exp_scalar(float *x, int32_t n, float m)
{
    float s = 0.0f;
    for (int32_t j = 0; j < n; j++) {
        x[j] = x[j] == -INFINITY ? 0.0f : expf(x[j] - m);
        s += x[j];
    }
    return s;
}

_Static_assert((int)ATTN_PATH_AVX2 == (int)TENSOR_SIMD_AVX2 &&
                   (int)ATTN_PATH_AVX512 == (int)TENSOR_SIMD_AVX512,
               "attention paths follow the tensor SIMD levels");

attn_path attn_path_best(void)
{
    return (attn_path)tensor_simd_best();
}

attn_path attn_path_active(void)
{
    return (attn_path)tensor_simd_level();
}

bool attn_row_scalar(float *s, int32_t n, float scale, const uint8_t *vis, float *m, float *l,
                      float *alpha)
{
    return attn_row_with(s, n, scale, vis, m, l, alpha, attn_exp_scalar);
}

attn_kernel_set attn_kernels(attn_path path, keel_dtype kt, keel_dtype vt, int32_t dk, int32_t dv)
{
    attn_kernel_set k = {NULL, NULL, attn_exp_scalar, attn_row_scalar, NULL};
    if (path == ATTN_PATH_AVX512) {
        k.kq = attn_kq_avx512(kt);
        k.pv = attn_pv_avx512(vt);
        k.ex = attn_exp_avx512;
        k.row = attn_row_avx512;
        k.dec = attn_dec_avx512(kt, vt, dk, dv);
    }
    if (path >= ATTN_PATH_AVX2) {
        if (!k.kq) k.kq = attn_kq_avx2(kt);
        if (!k.pv) k.pv = attn_pv_avx2(vt);
        if (path == ATTN_PATH_AVX2) {
            k.ex = attn_exp_avx2;
            k.row = attn_row_avx2;
            k.dec = attn_dec_avx2(kt, vt, dk, dv);
        }
    }
    if (!k.kq) k.kq = attn_kq_scalar;
    if (!k.pv) k.pv = attn_pv_scalar;
    return k;
}

/* ---- the task ------------------------------------------------------------ */

typedef struct attn_ctx {
    keel_mem *m;
    const mem_group *grp;
    int32_t col;             /* K column index in each table; V = col + 1 */
    const keel_mem_attn *a;
    int32_t n_kv, G, dk, dv;
    keel_dtype kt, vt, qt;   /* K, V dtypes and the query's vec_dot type */
    size_t qrow;             /* bytes per prepared query row */
    const float *qf;         /* [n_tokens][n_heads][dk] rotated f32 */
    const uint8_t *qq;       /* [n_tokens][n_heads][qrow] (qt != f32) */
    float scale, softcap;
    /* sparse attention: prepared indexer queries, rotated into the IDX
     * column's basis ([n_tokens][n_iq_heads][ik] f32, and vec_dot rows) */
    bool sparse;
    int32_t top_k;           /* cells kept at most (the table's capacity bounds it) */
    int32_t sel_stride;      /* entries per token of a->sel: the requested top_k */
    int32_t n_iq, ik;
    keel_dtype iqt;
    size_t iqrow;
    const float *iqf;
    const uint8_t *iqq;
    /* blocks */
    int32_t n_blocks;
    const int32_t *blk_table, *blk_first, *blk_count;
    const int32_t *blk_lo, *blk_hi; /* per block: the occupied extent of its table, or of its
                                       sequence's cells when it holds one sequence */
    int32_t splits;          /* KV ranges per block: [lo, hi) cut in equal parts */
    float *partials;         /* [n_blocks * splits][TB][n_heads][dv + 2] or NULL */
    size_t partial_stride;   /* floats per partial task */
    uint8_t *thread_scratch;
    size_t thread_bytes;
    attn_dims d;
    attn_kernel_set k;
} attn_ctx;

static inline bool visible(const mem_table *t, int32_t c, int32_t s, int32_t p)
{
    int32_t kp = t->pos[c];
    if (kp < 0 || kp > p || !mem_seq_has(t, c, s)) return false;
    if (!t->sliding) return true;
    if ((int64_t)kp > (int64_t)p - t->window) return true;
    if (t->n_sink == 0 || t->sink_pos[s] < 0) return false;
    return kp < t->sink_pos[s] || (kp == t->sink_pos[s] && t->stamp[c] <= t->sink_stamp[s]);
}

/* (position, placement) order of cells */
static bool cell_before(const void *ctx, int32_t a, int32_t b)
{
    const mem_table *t = ctx;
    return t->pos[a] < t->pos[b] || (t->pos[a] == t->pos[b] && t->stamp[a] < t->stamp[b]);
}

/* "cell a with score sa ranks after cell b with score sb": lower score,
 * or equal scores and a later (position, stamp) */
static inline bool ranks_after(const mem_table *t, float sa, int32_t a, float sb, int32_t b)
{
    return sa < sb || (sa == sb && cell_before(t, b, a));
}

/* Min-heap of the kept cells: the root ranks last. */
static void keep_sift(const mem_table *t, int32_t *hc, float *hs, int32_t n, int32_t i)
{
    for (;;) {
        int32_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && ranks_after(t, hs[l], hc[l], hs[m], hc[m])) m = l;
        if (r < n && ranks_after(t, hs[r], hc[r], hs[m], hc[m])) m = r;
        if (m == i) return;
        int32_t c = hc[i];
        float v = hs[i];
        hc[i] = hc[m];
        hs[i] = hs[m];
        hc[m] = c;
        hs[m] = v;
        i = m;
    }
}

static void keep_push(const mem_table *t, int32_t *hc, float *hs, int32_t i)
{
    while (i > 0) {
        int32_t p = (i - 1) / 2;
        if (!ranks_after(t, hs[i], hc[i], hs[p], hc[p])) return;
        int32_t c = hc[i];
        float v = hs[i];
        hc[i] = hc[p];
        hs[i] = hs[p];
        hc[p] = c;
        hs[p] = v;
        i = p;
    }
}

/*
 * Ties across the top_k boundary: the selection libstdc++'s
 * std::partial_sort(first, first + k, last, greater-by-score) makes, which
 * llama.cpp's CPU top_k uses: a heap of the first k elements (make_heap),
 * then each later element larger than the heap's smallest replaces it
 * (pop_heap into its place); hole-to-leaf sift-down, then sift-up, as that
 * library does. Run over the visible cells in (position, stamp) order (cell
 * order of a fresh single-sequence llama.cpp context), so that equal
 * scores are kept or dropped as the reference keeps them; f[0 .. k) then
 * holds the kept cells. v: every cell's score.
 */
static void ps_push(int32_t *f, int64_t hole, int64_t top, int32_t value, const float *v)
{
    int64_t parent = (hole - 1) / 2;
    while (hole > top && v[f[parent]] > v[value]) {
        f[hole] = f[parent];
        hole = parent;
        parent = (hole - 1) / 2;
    }
    f[hole] = value;
}

static void ps_adjust(int32_t *f, int64_t hole, int64_t len, int32_t value, const float *v)
{
    int64_t top = hole, child = hole;
    while (child < (len - 1) / 2) {
        child = 2 * (child + 1);
        if (v[f[child]] > v[f[child - 1]]) child--;
        f[hole] = f[child];
        hole = child;
    }
    if ((len & 1) == 0 && child == (len - 2) / 2) {
        child = 2 * (child + 1);
        f[hole] = f[child - 1];
        hole = child - 1;
    }
    ps_push(f, hole, top, value, v);
}

static void partial_sort_select(int32_t *f, int32_t n, int32_t k, const float *v)
{
    if (k >= 2)
        for (int64_t parent = (k - 2) / 2;; parent--) {
            ps_adjust(f, parent, k, f[parent], v);
            if (parent == 0) break;
        }
    for (int32_t i = k; i < n; i++)
        if (v[f[i]] > v[f[0]]) {
            int32_t value = f[i];
            f[i] = f[0];
            ps_adjust(f, 0, k, value, v);
        }
}

/* The indexer's choice for query token ti among the cells of t's occupied
 * extent [lo, hi): the top_k cells it may see by score (sum_h w_h relu(q_h
 * . ik)) into hc[0 .. n) (hs: their scores); returns n. vis: scratch for
 * the visible cells, sall: every cell's score ([cap] each). Ties across
 * the boundary: partial_sort_select. */
static int32_t select_top_k(const attn_ctx *x, const mem_table *t, int32_t lo, int32_t hi, int32_t ti, int32_t *hc,
                            float *hs, int32_t *vis, float *sall)
{
    const keel_mem_attn *a = x->a;
    const mem_col *ic = &t->cols[x->col + MEM_COL_IDX];
    int32_t s = a->seq[ti], p = a->pos[ti], H = x->n_iq, K = x->top_k, n = 0, n_vis = 0;
    const float *w = a->iw + (size_t)ti * (size_t)H;
    const uint8_t *base = mem_col_row(t, ic, 0, 0);
    for (int32_t c = lo; c < hi; c++) {
        if (!visible(t, c, s, p)) continue;
        vis[n_vis++] = c;
        const uint8_t *row = base + (size_t)c * ic->head_row_bytes;
        float sc = 0.0f;
        for (int32_t h = 0; h < H; h++) {
            size_t qi = (size_t)ti * (size_t)H + (size_t)h;
            const void *q = x->iqt == KEEL_DTYPE_F32 ? (const void *)(x->iqf + qi * (size_t)x->ik)
                                                     : (const void *)(x->iqq + qi * x->iqrow);
            float d = tensor_vec_dot(ic->dtype, x->ik, row, q);
            if (d > 0.0f) sc += w[h] * d;
        }
        if (sc != sc) sc = -INFINITY; /* NaN ranks below every number */
        sall[c] = sc;
        if (n < K) {
            hc[n] = c;
            hs[n] = sc;
            keep_push(t, hc, hs, n);
            n++;
        } else if (ranks_after(t, hs[0], hc[0], sc, c)) {
            hc[0] = c;
            hs[0] = sc;
            keep_sift(t, hc, hs, n, 0);
        }
    }
    if (n_vis <= K) return n;
    /* a tie across the boundary: a dropped cell scores as the lowest kept */
    float low = hs[0];
    int32_t eq_kept = 0, eq_all = 0;
    for (int32_t j = 0; j < n; j++) eq_kept += hs[j] == low;
    for (int32_t j = 0; j < n_vis; j++) eq_all += sall[vis[j]] == low;
    if (eq_all == eq_kept) return n;
    mem_heap_sort(vis, n_vis, cell_before, t);
    partial_sort_select(vis, n_vis, K, sall);
    for (int32_t j = 0; j < K; j++) {
        hc[j] = vis[j];
        hs[j] = sall[vis[j]];
    }
    return n;
}

/* Lists the cells of [cb, ce) (or of order[cb..ce)) that some token of the
 * block t0..t0+nt sees into idx, and which tokens see each into vis
 * ([ti][ATTN_CHUNK]); returns their count. Its own function, so that the
 * loop keeps its variables in registers (inlined into attn_task it spilled
 * them: a quarter of a one-KV-head decode's time went here). */
static int32_t list_chunk(const mem_table *t, const keel_mem_attn *a, int32_t t0, int32_t nt, int32_t cb,
                          int32_t ce, const int32_t *order, bool causal_fast, int32_t pmin, int32_t pmax,
                          uint8_t *vis, int32_t *idx)
{
    int32_t nvis = 0;
    if (causal_fast && nt == 1 && !order) {
        /* decode: a cell of the sequence is visible iff 0 <= pos <= pmax */
        const int32_t *pos = t->pos, s = a->seq[t0];
        const uint64_t *sq = t->seq + (size_t)(s >> 6);
        size_t sw = t->seq_words;
        uint32_t top = (uint32_t)pmax;
        for (int32_t c = cb; c < ce; c++) {
            bool in = (uint32_t)pos[c] <= top && ((sq[(size_t)c * sw] >> (s & 63)) & 1u);
            idx[nvis] = c;
            nvis += in;
        }
        memset(vis, 1, (size_t)nvis);
        return nvis;
    }
    for (int32_t j = cb; j < ce; j++) {
        int32_t c = order ? order[j] : j;
        int32_t kp = t->pos[c];
        if (kp < 0 || kp > pmax) continue;
        if (causal_fast) {
            if (!mem_seq_has(t, c, a->seq[t0])) continue;
            for (int32_t ti = 0; ti < nt; ti++)
                vis[(size_t)ti * ATTN_CHUNK + (size_t)nvis] = kp <= pmin || kp <= a->pos[t0 + ti];
            idx[nvis++] = c; /* kp <= pmax: the block's last token sees it */
            continue;
        }
        bool any = false;
        for (int32_t ti = 0; ti < nt; ti++) {
            bool v = visible(t, c, a->seq[t0 + ti], a->pos[t0 + ti]);
            vis[(size_t)ti * ATTN_CHUNK + (size_t)nvis] = v;
            any |= v;
        }
        if (any) idx[nvis++] = c;
    }
    return nvis;
}

static void attn_task(void *vctx, int64_t task, int thread)
{
    attn_ctx *x = vctx;
    const keel_mem_attn *a = x->a;
    int32_t b = (int32_t)(task / x->splits), sp = (int32_t)(task % x->splits);
    const mem_table *t = &x->grp->tables[x->blk_table[b]];
    const mem_col *kc = &t->cols[x->col], *vc = &t->cols[x->col + 1];
    int32_t t0 = x->blk_first[b], nt = x->blk_count[b];
    int32_t nh = a->n_heads, G = x->G, dk = x->dk, dv = x->dv;
    /* the block's extent [lo, hi) (T6: no cell outside it holds the
     * block's sequences), cut into this task's part; one part begins at lo rounded down to a
     * chunk, so the chunks (and the online softmax's blocks) are those of a
     * walk over [0, cap) with its empty chunks left out: the same sums */
    int32_t lo = x->blk_lo[b], hi = x->blk_hi[b], c_begin, c_end;
    if (x->splits > 1) {
        c_begin = lo + (int32_t)((int64_t)(hi - lo) * sp / x->splits);
        c_end = lo + (int32_t)((int64_t)(hi - lo) * (sp + 1) / x->splits);
    } else {
        c_begin = lo / ATTN_CHUNK * ATTN_CHUNK;
        c_end = hi;
    }
    _Static_assert(ATTN_CHUNK % ATTN_CB == 0, "deterministic blocks need whole CB blocks per chunk");

    uint8_t *ts = x->thread_scratch + (size_t)thread * x->thread_bytes;
    thread_layout tl = layout_of(&x->d);
    float *scores = (float *)ts;                   /* [nt * G][CB] */
    uint8_t *vis = ts + tl.vis;                    /* [TB][CHUNK] */
    int32_t *idx = (int32_t *)(ts + tl.idx);       /* [CHUNK] */
    float *mrun = (float *)(ts + tl.ml);           /* [nt][nh] */
    float *lrun = mrun + (size_t)ATTN_TB * (size_t)x->d.n_heads_max;
    const void **qp = (const void **)(ts + tl.qp); /* [R] */
    float **ap = (float **)(ts + tl.ap);           /* [R] */
    uint8_t *act = ts + tl.act;                    /* [R] */

    /* accumulators: the output rows (one split) or this task's partial */
    float *acc_base;
    size_t acc_tok_stride, acc_head_stride;
    if (x->partials) {
        /* [TB][nh][dv | m | l] */
        acc_base = x->partials + (size_t)task * x->partial_stride;
        acc_head_stride = (size_t)dv + 2;
        acc_tok_stride = (size_t)nh * acc_head_stride;
    } else {
        acc_base = a->out + (size_t)t0 * (size_t)nh * (size_t)dv;
        acc_head_stride = (size_t)dv;
        acc_tok_stride = (size_t)nh * (size_t)dv;
    }
    for (int32_t ti = 0; ti < nt; ti++)
        for (int32_t h = 0; h < nh; h++) {
            float *acc = acc_base + (size_t)ti * acc_tok_stride + (size_t)h * acc_head_stride;
            memset(acc, 0, (size_t)dv * sizeof(float));
            mrun[ti * nh + h] = -INFINITY;
            lrun[ti * nh + h] = 0.0f;
        }

    int32_t pmax = INT32_MIN, pmin = INT32_MAX;
    for (int32_t ti = 0; ti < nt; ti++) {
        pmax = BASE_MAX(pmax, a->pos[t0 + ti]);
        pmin = BASE_MIN(pmin, a->pos[t0 + ti]);
    }
    /* a block's tokens are one sequence's (attend_impl): in a full table a
     * cell holding it is visible to exactly the tokens at or after its
     * position (one test per cell, not one visible() per cell and token:
     * prefill blocks have 32 tokens) */
    bool causal_fast = !t->sliding;

    /* deterministic mode (one token per block, no splits): the cells are the
     * token's visible ones in (position, placement) order, so the blocks of
     * the online softmax do not depend on the physical layout or on the
     * other queries of the call */
    const int32_t *order = NULL;
    if (x->sparse) {
        /* sparse attention (one token per block, no splits): the cells the
         * indexer keeps, in (position, placement) order */
        int32_t *ord = (int32_t *)(ts + tl.kept);
        int32_t n_ord = select_top_k(x, t, lo, hi, t0, ord, (float *)(ts + tl.hs), (int32_t *)(ts + tl.order),
                                     (float *)(ts + tl.sall));
        mem_heap_sort(ord, n_ord, cell_before, t);
        if (a->sel) {
            int32_t *out = a->sel + (size_t)t0 * (size_t)x->sel_stride;
            int32_t tab = (int32_t)(t - x->grp->tables);
            for (int32_t j = 0; j < x->sel_stride; j++) out[j] = j < n_ord ? tab * t->cap + ord[j] : -1;
        }
        order = ord;
        c_begin = 0;
        c_end = n_ord;
    } else if (x->d.order_cap > 0) {
        int32_t *ord = (int32_t *)(ts + tl.order), n_ord = 0;
        for (int32_t c = lo; c < hi; c++)
            if (visible(t, c, a->seq[t0], a->pos[t0])) ord[n_ord++] = c;
        mem_heap_sort(ord, n_ord, cell_before, t);
        order = ord;
        c_begin = 0;
        c_end = n_ord;
    }

    /* Chunks of ATTN_CHUNK cells: visibility once per chunk, then per KV head
     * a contiguous run of K and V rows (one stream each for the prefetcher)
     * in blocks of ATTN_CB. */
    int32_t ahead[ATTN_PF_FAR * ATTN_CB]; /* the next chunk's first cells, for the decode kernel */
    for (int32_t cb = c_begin; cb < c_end; cb += ATTN_CHUNK) {
        int32_t ce = BASE_MIN(c_end, cb + ATTN_CHUNK);
        int32_t nvis = list_chunk(t, a, t0, nt, cb, ce, order, causal_fast, pmin, pmax, vis, idx);
        if (nvis == 0) continue;
        int32_t R = nt * G;
        for (int32_t hk = 0; hk < x->n_kv; hk++) {
            /* rows r = ti * G + g: query head h = hk * G + g of token t0 + ti */
            for (int32_t ti = 0; ti < nt; ti++)
                for (int32_t g = 0; g < G; g++) {
                    int32_t r = ti * G + g, h = hk * G + g;
                    size_t qi = (size_t)(t0 + ti) * (size_t)nh + (size_t)h;
                    qp[r] = x->qt == KEEL_DTYPE_F32 ? (const void *)(x->qf + qi * (size_t)dk)
                                                    : (const void *)(x->qq + qi * x->qrow);
                    ap[r] = acc_base + (size_t)ti * acc_tok_stride + (size_t)h * acc_head_stride;
                }
            const uint8_t *kbase = mem_col_row(t, kc, hk, 0);
            const uint8_t *vbase = mem_col_row(t, vc, hk, 0);
            if (nt == 1 && x->k.dec) {
                /* one token: every listed cell is visible to all its rows.
                 * Next come the next head's rows of these cells or, after
                 * the last head, the first head's of the next chunk: its
                 * first cells, as far as the kernel prefetches (the cells
                 * in order, most of them visible). */
                attn_dec dj = {kbase, vbase, kc->head_row_bytes, vc->head_row_bytes, idx, nvis, qp, R, dk, dv,
                               x->scale, x->softcap, &mrun[hk * G], &lrun[hk * G], ap, {NULL, NULL, NULL, 0}};
                if (hk + 1 < x->n_kv)
                    dj.next = (attn_dec_next){mem_col_row(t, kc, hk + 1, 0), mem_col_row(t, vc, hk + 1, 0), idx, nvis};
                else if (!order && ce < c_end) {
                    int32_t nn = BASE_MIN(c_end - ce, (int32_t)BASE_ARRAY_LEN(ahead));
                    for (int32_t i = 0; i < nn; i++) ahead[i] = ce + i;
                    dj.next = (attn_dec_next){mem_col_row(t, kc, 0, 0), mem_col_row(t, vc, 0, 0), ahead, nn};
                }
                x->k.dec(x->kt, x->vt, &dj);
                continue;
            }
            for (int32_t sb = 0; sb < nvis; sb += ATTN_CB) {
                int32_t nb = BASE_MIN(ATTN_CB, nvis - sb);
                const int32_t *bidx = idx + sb;
                /* The scores read K while this block's V arrives; the V
                 * accumulation reads V while the next block's K (or the next
                 * head's first) arrives. */
                attn_pf kpf = {kbase, 0};
                if (sb + nb < nvis)
                    kpf = attn_rows_span(kbase, kc->head_row_bytes, bidx + nb,
                                     BASE_MIN(ATTN_CB, nvis - sb - nb));
                else if (hk + 1 < x->n_kv)
                    kpf = attn_rows_span(mem_col_row(t, kc, hk + 1, 0), kc->head_row_bytes, idx,
                                     BASE_MIN(ATTN_CB, nvis));
                x->k.kq(x->kt, kbase, kc->head_row_bytes, bidx, nb, qp, R, dk, scores,
                        attn_rows_span(vbase, vc->head_row_bytes, bidx, nb));
                /* scale, cap, mask; online softmax per row */
                for (int32_t ti = 0; ti < nt; ti++) {
                    for (int32_t g = 0; g < G; g++) {
                        int32_t r = ti * G + g, h = hk * G + g;
                        float *sc = scores + (size_t)r * ATTN_CB;
                        float scale = x->scale;
                        if (x->softcap > 0.0f) {
                            /* capped before masking; the row kernel then scales by 1 */
                            for (int32_t j = 0; j < nb; j++)
                                sc[j] = x->softcap * tanhf(sc[j] * x->scale / x->softcap);
                            scale = 1.0f;
                        }
                        float alpha;
                        act[r] = x->k.row(sc, nb, scale, vis + (size_t)ti * ATTN_CHUNK + (size_t)sb,
                                          &mrun[ti * nh + h], &lrun[ti * nh + h], &alpha);
                        if (act[r] && alpha != 1.0f) tensor_scale_f32(ap[r], alpha, dv);
                    }
                }
                x->k.pv(x->vt, vbase, vc->head_row_bytes, bidx, nb, scores, act, R, dv, ap, kpf);
            }
        }
    }

    if (x->partials) {
        for (int32_t ti = 0; ti < nt; ti++)
            for (int32_t h = 0; h < nh; h++) {
                float *acc = acc_base + (size_t)ti * acc_tok_stride + (size_t)h * acc_head_stride;
                acc[dv] = mrun[ti * nh + h];
                acc[dv + 1] = lrun[ti * nh + h];
            }
        return;
    }
    /* finalize in place: sinks, normalize, undo V rotation */
    for (int32_t ti = 0; ti < nt; ti++)
        for (int32_t h = 0; h < nh; h++) {
            float *acc = acc_base + (size_t)ti * acc_tok_stride + (size_t)h * acc_head_stride;
            float mr = mrun[ti * nh + h], lr = lrun[ti * nh + h];
            if (a->sinks) {
                float sk = a->sinks[h];
                if (mr == -INFINITY) {
                    mr = sk;
                } else if (sk > mr) {
                    float alpha = expf(mr - sk);
                    tensor_scale_f32(acc, alpha, dv);
                    lr *= alpha;
                    mr = sk;
                }
                lr += expf(sk - mr);
            }
            if (lr > 0.0f)
                tensor_scale_f32(acc, 1.0f / lr, dv);
            else
                memset(acc, 0, (size_t)dv * sizeof(float));
            mem_col_unrotate(vc, acc);
        }
}

typedef struct merge_ctx {
    attn_ctx *x;
} merge_ctx;

/* Merges the splits of block b, token ti (task index = b * TB + ti). */
static void merge_task(void *vctx, int64_t task, int thread)
{
    (void)thread;
    attn_ctx *x = ((merge_ctx *)vctx)->x;
    const keel_mem_attn *a = x->a;
    int32_t b = (int32_t)(task / ATTN_TB), ti = (int32_t)(task % ATTN_TB);
    if (ti >= x->blk_count[b]) return;
    const mem_table *t = &x->grp->tables[x->blk_table[b]];
    const mem_col *vc = &t->cols[x->col + 1];
    int32_t nh = a->n_heads, dv = x->dv;
    size_t hs = (size_t)dv + 2, tok = (size_t)nh * hs;
    int32_t tg = x->blk_first[b] + ti;
    for (int32_t h = 0; h < nh; h++) {
        float *out = a->out + ((size_t)tg * (size_t)nh + (size_t)h) * (size_t)dv;
        float M = -INFINITY;
        for (int32_t sp = 0; sp < x->splits; sp++) {
            const float *p = x->partials + (size_t)(b * x->splits + sp) * x->partial_stride +
                             (size_t)ti * tok + (size_t)h * hs;
            if (p[dv] > M) M = p[dv];
        }
        if (a->sinks && a->sinks[h] > M) M = a->sinks[h];
        memset(out, 0, (size_t)dv * sizeof(float));
        if (M == -INFINITY) continue;
        float L = 0.0f;
        for (int32_t sp = 0; sp < x->splits; sp++) {
            const float *p = x->partials + (size_t)(b * x->splits + sp) * x->partial_stride +
                             (size_t)ti * tok + (size_t)h * hs;
            if (p[dv] == -INFINITY) continue;
            float w = expf(p[dv] - M);
            L += p[dv + 1] * w;
            tensor_axpy_f32(out, w, p, dv);
        }
        if (a->sinks) L += expf(a->sinks[h] - M);
        if (L > 0.0f) tensor_scale_f32(out, 1.0f / L, dv);
        mem_col_unrotate(vc, out);
    }
}

typedef struct prep_ctx {
    attn_ctx *x;
    const mem_col *kc, *ic;
    float *qf, *iqf;
    uint8_t *qq, *iqq;
} prep_ctx;

static void prep_task(void *vctx, int64_t i, int thread)
{
    (void)thread;
    prep_ctx *p = vctx;
    attn_ctx *x = p->x;
    int32_t nh = x->a->n_heads, dk = x->dk;
    for (int32_t h = 0; h < nh; h++) {
        size_t qi = (size_t)i * (size_t)nh + (size_t)h;
        float *q = p->qf + qi * (size_t)dk;
        memcpy(q, x->a->q + qi * (size_t)dk, (size_t)dk * sizeof(float));
        mem_col_rotate(p->kc, q);
        if (x->qt != KEEL_DTYPE_F32) tensor_quantize_row_unchecked(x->qt, q, p->qq + qi * x->qrow, dk);
    }
    for (int32_t h = 0; x->sparse && h < x->n_iq; h++) {
        size_t qi = (size_t)i * (size_t)x->n_iq + (size_t)h;
        float *q = p->iqf + qi * (size_t)x->ik;
        memcpy(q, x->a->iq + qi * (size_t)x->ik, (size_t)x->ik * sizeof(float));
        mem_col_rotate(p->ic, q);
        if (x->iqt != KEEL_DTYPE_F32) tensor_quantize_row_unchecked(x->iqt, q, p->iqq + qi * x->iqrow, x->ik);
    }
}

static keel_status attend_impl(keel_mem *m, int32_t layer, const keel_mem_attn *a)
{
    if (!m) return KEEL_EINVAL;
    m->err[0] = 0;
    if (!a || !a->q || !a->pos || !a->seq || !a->out)
        return base_err(m->err, KEEL_EINVAL, "attend: missing arrays");
    if (layer < 0 || layer >= m->cfg.n_layers || m->layer_group[layer] < 0)
        return base_err(m->err, KEEL_EINVAL, "attend: layer %d has no KV", layer);
    const keel_mem_layer *L = &m->layers[layer];
    int32_t nh_cfg = L->n_heads ? L->n_heads : L->n_kv_heads;
    if (a->n_tokens < 1 || a->n_tokens > m->cfg.n_batch_max)
        return base_err(m->err, KEEL_EINVAL, "attend: n_tokens %d (need 1..%d)", a->n_tokens,
                        m->cfg.n_batch_max);
    if (a->n_heads < L->n_kv_heads || a->n_heads % L->n_kv_heads || a->n_heads > nh_cfg)
        return base_err(m->err, KEEL_EINVAL,
                        "attend: n_heads %d (need a multiple of %d, at most %d)", a->n_heads,
                        L->n_kv_heads, nh_cfg);
    for (int32_t i = 0; i < a->n_tokens; i++) {
        if (a->seq[i] < 0 || a->seq[i] >= m->cfg.n_seq_max)
            return base_err(m->err, KEEL_EINVAL, "attend: token %d: unknown sequence id %d", i,
                            a->seq[i]);
        if (a->pos[i] < 0)
            return base_err(m->err, KEEL_EINVAL, "attend: token %d: position %d", i, a->pos[i]);
    }
    const mem_group *grp = &m->groups[m->layer_group[layer]];
    int32_t col = m->layer_col[layer];
    bool sparse = a->iq != NULL;
    int32_t top_k = 0;
    if (sparse) {
        if (L->idx_head_dim == 0)
            return base_err(m->err, KEEL_EINVAL, "attend: layer %d has no indexer column (iq given)", layer);
        if (!a->iw || a->n_iq_heads < 1 || a->n_iq_heads > L->idx_n_heads)
            return base_err(m->err, KEEL_EINVAL, "attend: indexer heads %d (need 1..%d and head weights)",
                            a->n_iq_heads, L->idx_n_heads);
        if (a->top_k < 0 || a->top_k > L->idx_top_k)
            return base_err(m->err, KEEL_EINVAL, "attend: top_k %d (need 0..%d; 0: the layer's)", a->top_k,
                            L->idx_top_k);
        top_k = a->top_k > 0 ? a->top_k : L->idx_top_k;
    }
    attn_ctx x;
    memset(&x, 0, sizeof x);
    x.m = m;
    x.grp = grp;
    x.col = col;
    x.a = a;
    x.n_kv = L->n_kv_heads;
    x.G = a->n_heads / L->n_kv_heads;
    x.dk = L->head_dim_k;
    x.dv = L->head_dim_v;
    x.kt = L->k_dtype;
    x.vt = L->v_dtype;
    x.qt = tensor_vec_dot_type(L->k_dtype);
    x.qrow = tensor_row_bytes(x.qt, x.dk);
    x.scale = a->scale > 0.0f ? a->scale : 1.0f / sqrtf((float)x.dk);
    x.softcap = a->softcap;
    x.d = m->attn_dims; /* computed once at open */
    x.sparse = sparse;
    if (sparse) {
        x.sel_stride = top_k;
        x.top_k = BASE_MIN(top_k, grp->tables[0].cap); /* at most every cell of a table */
        x.n_iq = a->n_iq_heads;
        x.ik = L->idx_head_dim;
        x.iqt = tensor_vec_dot_type(L->idx_dtype);
        x.iqrow = tensor_row_bytes(x.iqt, x.ik);
    }
    x.k = attn_kernels(attn_path_active(), x.kt, x.vt, x.dk, x.dv);

    /* sinks of sliding tables must be current before threads read them */
    for (int32_t k = 0; k < grp->n_tables; k++)
        mem_table_update_sinks(&grp->tables[k], m->cfg.n_seq_max);

    base_arena_reset(&m->scratch);
    base_arena *ar = &m->scratch;
    size_t nq = (size_t)a->n_tokens * (size_t)a->n_heads;
    float *qf = base_arena_take_n(ar, nq * (size_t)x.dk, sizeof(float));
    uint8_t *qq = x.qt != KEEL_DTYPE_F32 ? base_arena_take_n(ar, nq, x.qrow) : NULL;
    float *iqf = NULL;
    uint8_t *iqq = NULL;
    if (sparse) {
        size_t ni = (size_t)a->n_tokens * (size_t)x.n_iq;
        iqf = base_arena_take_n(ar, ni * (size_t)x.ik, sizeof(float));
        iqq = x.iqt != KEEL_DTYPE_F32 ? base_arena_take_n(ar, ni, x.iqrow) : NULL;
        if (!iqf || (x.iqt != KEEL_DTYPE_F32 && !iqq))
            return base_err(m->err, KEEL_ESCRATCH, "attend: scratch exhausted (indexer queries)");
    }
    int32_t *blk = base_arena_take_n(ar, ((size_t)a->n_tokens + 1) * 5, sizeof(int32_t));
    x.thread_bytes = thread_bytes(&x.d);
    uint8_t *ts = base_arena_take(ar, x.thread_bytes * (size_t)m->n_threads, BASE_ALIGN);
    if (!qf || (x.qt != KEEL_DTYPE_F32 && !qq) || !blk || !ts)
        return base_err(m->err, KEEL_ESCRATCH, "attend: scratch exhausted");
    x.qf = qf;
    x.qq = qq;
    x.iqf = iqf;
    x.iqq = iqq;
    x.thread_scratch = ts;

    /* token blocks: consecutive tokens of one sequence, at most TB. A block
     * of one sequence reads only its cells (its extent, the causal fast
     * path, and for one token the fused decode kernel). Tokens of several
     * sequences in one block (as the decode tokens of the engine's slots
     * were, in a unified cache) read every cell of the table, other slots'
     * cached conversations included, through the general path with a
     * visibility test per cell and token: two greedy streams of
     * stories260K ran 2,187 tok/s together against 4,514 for one alone. */
    int32_t *bt = blk, *bf = blk + a->n_tokens + 1, *bc = bf + a->n_tokens + 1;
    int32_t nb = 0;
    for (int32_t i = 0; i < a->n_tokens; i++) {
        int32_t tab = m->n_streams == 1 ? 0 : a->seq[i];
        if (nb > 0 && bt[nb - 1] == tab && a->seq[bf[nb - 1]] == a->seq[i] &&
            bc[nb - 1] < (x.d.order_cap > 0 || sparse ? 1 : ATTN_TB)) {
            bc[nb - 1]++;
        } else {
            bt[nb] = tab;
            bf[nb] = i;
            bc[nb] = 1;
            nb++;
        }
    }
    x.n_blocks = nb;
    x.blk_table = bt;
    x.blk_first = bf;
    x.blk_count = bc;

    /* split the KV range when the blocks cannot keep the threads busy:
     * fewer blocks than threads, or one block holding more than a thread's
     * share of all the blocks' cells by a quarter (a long conversation
     * decoding beside short ones: each slot's token is a block of its own,
     * and one thread would walk the long one alone). The occupied extent
     * [lo, hi) of each block's sequence is cut (T6 keeps finding it O(1)),
     * into as many parts as the largest extent holds m->split_min_cells
     * cells, so neither the cut nor the part count depends on n_ctx. With
     * [0, cap) cut, a cache holding far fewer cells than its n_ctx (a
     * server's large context, a short conversation) had every cell in the
     * first part, and one thread did the whole attention; with the count
     * following cap, a cache under 1024 cells never split (see
     * docs/memory.md: keel bench -m ... -d 512 / -d 4096 -c 16512). A call
     * of one sequence's tokens cuts that sequence's extent, so that what
     * other sequences hold (another slot's turn, a compaction of another
     * sequence) moves neither its cut nor its part count: its output stays
     * bit-identical */
    int32_t *blo = bc + a->n_tokens + 1, *bhi = blo + a->n_tokens + 1, ext = 0;
    int64_t cells = 0;
    for (int32_t b = 0; b < nb; b++) {
        mem_table_seq_extent(&grp->tables[bt[b]], a->seq[bf[b]], &blo[b], &bhi[b]);
        ext = BASE_MAX(ext, bhi[b] - blo[b]);
        cells += bhi[b] - blo[b];
    }
    x.blk_lo = blo;
    x.blk_hi = bhi;
    x.splits = 1;
    int32_t part = BASE_MAX(1, m->split_min_cells);
    bool uneven = (int64_t)ext * m->n_threads * 4 > cells * 5;
    if (m->n_threads > 1 && (nb < m->n_threads || uneven) && ext >= 2 * part && x.d.order_cap == 0 && !sparse) {
        /* about two parts a thread over all the cells */
        int32_t want = nb < m->n_threads ? (2 * m->n_threads + nb - 1) / nb
                                         : (int32_t)((2 * (int64_t)m->n_threads * ext + cells - 1) / cells);
        int32_t most = ext / part;
        x.splits = BASE_MAX(1, BASE_MIN(want, most));
        if (nb * x.splits > max_partials(m->n_threads)) x.splits = max_partials(m->n_threads) / nb;
        if (x.splits < 2) x.splits = 1;
    }
    if (x.splits > 1) {
        x.partial_stride = partial_floats(&x.d);
        x.partials = base_arena_take_n(ar, (size_t)nb * (size_t)x.splits * x.partial_stride,
                                       sizeof(float));
        if (!x.partials) return base_err(m->err, KEEL_ESCRATCH, "attend: scratch exhausted");
    }

    prep_ctx p = {&x, &grp->tables[0].cols[col], sparse ? &grp->tables[0].cols[col + MEM_COL_IDX] : NULL,
                  qf, iqf, qq, iqq};
    base_pool_run(a->n_tokens >= 16 ? m->pool : NULL, a->n_tokens, prep_task, &p);
    base_pool_run(m->pool, (int64_t)nb * x.splits, attn_task, &x);
    if (x.splits > 1) {
        merge_ctx mc = {&x};
        base_pool_run(m->pool, (int64_t)nb * ATTN_TB, merge_task, &mc);
    }
    return KEEL_OK;
}

keel_status keel_mem_attend(keel_mem *m, int32_t layer, const keel_mem_attn *a)
{
    uint64_t t0 = tensor_prof_begin();
    keel_status st = attend_impl(m, layer, a);
    if (t0 && st == KEEL_OK)
        tensor_prof_end_n(t0, TENSOR_PROF_ATTN, m->layers[layer].k_dtype, a->n_tokens, 0, 0.0, a->n_tokens);
    return st;
}
