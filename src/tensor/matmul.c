/*
 * matmul.c — matrix-vector (decode) and matrix-matrix (prefill) products
 * over weight rows in any readable dtype.
 *
 * matvec: the activation is converted once into the caller's arena (its
 * vec_dot type), then chunks of rows are handed to the pool's threads; each
 * task runs the dtype's dot over its rows. Nothing is allocated; the arena
 * is rewound before returning, so it is unchanged apart from its high-water
 * mark.
 *
 * matmul: three strategies (tensor_gemm_path), chosen per dtype and batch
 * by measurement (docs/kernels.md): one token -> matvec; small batches ->
 * dot tiles (X quantized once to the vec_dot type, then 16 rows x 16 tokens
 * at a time through the dtype's dot, both tiles L2-resident); larger
 * batches -> OpenBLAS sgemm, single-threaded inside each of our pool's
 * tasks (openblas_set_num_threads(1) once, so OpenBLAS never starts threads
 * of its own to fight our spinning workers): f32 weights straight, one
 * contiguous slice of rows per thread; other dtypes dequantized a tile of
 * rows at a time into the thread's slice of the arena.
 */
#include "tensor_impl.h"

#include <cblas.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define MATVEC_MIN_ROWS         16                /* rows per task, at least */
#define MATVEC_TASKS_PER_THREAD 8                 /* for load balance */
#define MATMUL_TILE_BYTES       ((size_t)2 << 20) /* f32 tile of dequantized rows per thread */

/* ---- shape checks ------------------------------------------------------------------- */

static bool shape_ok(keel_dtype t, int64_t n_rows, int64_t n_cols)
{
    if (!tensor_dtype_valid(t) || n_rows < 0 || n_cols < 0) return false;
    if (!tensor_dot_scalar_[t]) return false;
    keel_dtype vt = tensor_vec_dot_type(t);
    int64_t bs = keel_dtype_block_size(t), vbs = keel_dtype_block_size(vt);
    if (n_cols % bs != 0 || n_cols % vbs != 0) return false;
    size_t rb;
    if (keel_dtype_row_bytes(t, n_cols, &rb) != KEEL_OK) return false;
    size_t total;
    size_t rows;
    if (!size_from_i64(n_rows, &rows) || !size_mul(rows, rb, &total)) return false;
    return true;
}

/* ---- matvec ---------------------------------------------------------------------------- */

/* Scratch of the row kernels' prepared activation (the larger of the
 * levels' preps, whatever SIMD level runs, so that plans do not depend on
 * it). */
static size_t mv_prep_bytes(keel_dtype t, int64_t n_cols)
{
    const tensor_mv_prep *p[2] = {&tensor_mv_prep_avx2_[t], &tensor_mv_prep_avx512_[t]};
    size_t out = 0;
    for (int i = 0; i < 2; i++) {
        size_t b;
        if (!p[i]->bytes || n_cols <= 0 || !size_add(p[i]->bytes(n_cols), BASE_ALIGN, &b)) continue;
        out = BASE_MAX(out, b);
    }
    return out;
}

/* The row kernel for dtype t at the level in force (NULL: the dot row by
 * row) and its prep. */
static tensor_mv_fn mv_pick(keel_dtype t, const tensor_mv_prep **prep)
{
    *prep = &tensor_mv_prep_avx2_[t];
    if (!tensor_use_avx2()) return NULL;
    if (tensor_simd_level() >= TENSOR_SIMD_AVX512 && tensor_mv_avx512_[t]) {
        *prep = &tensor_mv_prep_avx512_[t];
        return tensor_mv_avx512_[t];
    }
    return tensor_mv_avx2_[t];
}

/* The prepared activation of the row kernel mv (prep: its prep) for x in
 * its vec_dot type, in the arena; NULL when it needs none. false: no room. */
static bool mv_prep(const tensor_mv_prep *p, tensor_mv_fn mv, const void *x, int64_t n_cols, base_arena *scratch,
                    const void **out)
{
    *out = NULL;
    if (!mv || !p->run || n_cols <= 0) return true;
    void *xp = scratch ? base_arena_take(scratch, p->bytes(n_cols), BASE_ALIGN) : NULL;
    if (!xp) return false;
    p->run(x, n_cols, xp);
    *out = xp;
    return true;
}

size_t tensor_matvec_scratch_bytes(keel_dtype t, int64_t n_cols)
{
    if (!tensor_dtype_valid(t)) return 0;
    keel_dtype vt = tensor_vec_dot_type(t);
    size_t out = mv_prep_bytes(t, n_cols);
    if (vt == KEEL_DTYPE_F32) return out;
    size_t rb = tensor_row_bytes(vt, n_cols);
    if (rb == 0 || !size_add(out, rb, &out) || !size_add(out, BASE_ALIGN, &out)) return 0;
    return out;
}

typedef struct matvec_ctx {
    tensor_dot_fn dot;
    tensor_mv_fn mv; /* row-range kernel, or NULL */
    const void *xp;  /* its prepared activation, or NULL */
    const uint8_t *W;
    size_t row_bytes;
    int64_t n_rows, n_cols, rows_per_task;
    const void *x; /* activation in the vec_dot type */
    float *y;
} matvec_ctx;

static void matvec_task(void *vctx, int64_t task, int thread)
{
    (void)thread;
    const matvec_ctx *c = vctx;
    int64_t r0 = task * c->rows_per_task;
    int64_t r1 = BASE_MIN(r0 + c->rows_per_task, c->n_rows);
    /* No software prefetch: issued per row it starved the demand loads of
     * wide rows (f16 at 8 KiB rows: 31 -> 13 GB/s) for +5% on q8_0. */
    const uint8_t *w = c->W + (size_t)r0 * c->row_bytes;
    if (c->mv) {
        c->mv(r1 - r0, c->n_cols, w, c->row_bytes, c->x, c->xp, c->y + r0);
        return;
    }
    for (int64_t r = r0; r < r1; r++, w += c->row_bytes)
        c->y[r] = c->dot(c->n_cols, w, c->x);
}

/* Rows per task: a multiple of 4, so that every row lands in the same
 * row group of the 4-row kernels (or the same tail) however a matrix is
 * chunked, and its result is the same bits. */
static int64_t matvec_rows_per_task(int64_t n_rows, int n_threads)
{
    if (n_threads <= 1) return n_rows > 0 ? n_rows : 1;
    int64_t per = n_rows / ((int64_t)n_threads * MATVEC_TASKS_PER_THREAD);
    if (per < MATVEC_MIN_ROWS) per = MATVEC_MIN_ROWS;
    return (per + 3) & ~(int64_t)3;
}

static keel_status matvec_impl(keel_dtype t, const void *W, int64_t n_rows, int64_t n_cols,
                               const float *x, float *y, base_pool *pool, base_arena *scratch)
{
    if (!shape_ok(t, n_rows, n_cols)) return KEEL_EINVAL;
    if (n_rows == 0) return KEEL_OK;
    if (!W || !y || (n_cols > 0 && !x)) return KEEL_EINVAL;
    keel_dtype vt = tensor_vec_dot_type(t);
    size_t mark = scratch ? base_arena_mark(scratch) : 0;
    const void *xa = x;
    if (vt != KEEL_DTYPE_F32 && n_cols > 0) {
        if (!scratch) return KEEL_ESCRATCH;
        void *q = base_arena_take(scratch, tensor_row_bytes(vt, n_cols), BASE_ALIGN);
        if (!q) return KEEL_ESCRATCH;
        tensor_quant_get_(vt)(x, q, n_cols);
        xa = q;
    }
    const tensor_mv_prep *prep;
    tensor_mv_fn mv = mv_pick(t, &prep);
    const void *xp;
    if (!mv_prep(prep, mv, xa, n_cols, scratch, &xp)) {
        if (scratch) base_arena_rewind(scratch, mark);
        return KEEL_ESCRATCH;
    }
    matvec_ctx c = {tensor_dot_get_(t), mv, xp, W, tensor_row_bytes(t, n_cols), n_rows, n_cols, 0, xa, y};
    if (n_cols == 0) {
        memset(y, 0, (size_t)n_rows * sizeof(float));
    } else {
        c.rows_per_task = matvec_rows_per_task(n_rows, base_pool_threads(pool));
        int64_t n_tasks = (n_rows + c.rows_per_task - 1) / c.rows_per_task;
        base_pool_run(pool, n_tasks, matvec_task, &c);
    }
    if (scratch) base_arena_rewind(scratch, mark);
    return KEEL_OK;
}

keel_status tensor_matvec(keel_dtype t, const void *W, int64_t n_rows, int64_t n_cols,
                          const float *x, float *y, base_pool *pool, base_arena *scratch)
{
    uint64_t t0 = tensor_prof_begin();
    keel_status st = matvec_impl(t, W, n_rows, n_cols, x, y, pool, scratch);
    if (t0) tensor_prof_end(t0, TENSOR_PROF_MATVEC, t, n_rows, n_cols,
                            (double)tensor_row_bytes(t, n_cols) * (double)n_rows);
    return st;
}

/* ---- several tokens, each row read once -------------------------------------------- */

#define MVB_CHUNK_BYTES ((size_t)16 << 10) /* rows the generic path keeps in L1 while it runs every token */

/* The batched kernel for dtype t at the level in force, or NULL. */
static const tensor_mvb_kernel *mvb_kernel(keel_dtype t)
{
    if (!tensor_use_avx2()) return NULL;
    if (tensor_simd_level() >= TENSOR_SIMD_AVX512 && tensor_mvb_avx512_[t].run) return &tensor_mvb_avx512_[t];
    return tensor_mvb_avx2_[t].run ? &tensor_mvb_avx2_[t] : NULL;
}

/* Scratch of a batch of n tokens: each x in the vec_dot type and the row
 * kernel's prepared form of it (the generic path), or the packed
 * activations of the largest any level's batched kernel makes. false:
 * overflow. */
static bool mvb_bytes(keel_dtype t, int64_t n_cols, int n, size_t *out)
{
    keel_dtype vt = tensor_vec_dot_type(t);
    size_t per = mv_prep_bytes(t, n_cols), all, pack = 0;
    if (vt != KEEL_DTYPE_F32 && n_cols > 0) {
        size_t rb = tensor_row_bytes(vt, n_cols);
        if (rb == 0 || !size_add(per, rb, &per) || !size_add(per, BASE_ALIGN, &per)) return false;
    }
    const tensor_mvb_kernel *k[2] = {&tensor_mvb_avx2_[t], &tensor_mvb_avx512_[t]};
    for (int i = 0; i < 2 && n_cols > 0 && n > 0; i++) {
        size_t b;
        if (!k[i]->pack_bytes || !size_add(k[i]->pack_bytes(n_cols, n), BASE_ALIGN, &b)) continue;
        pack = BASE_MAX(pack, b);
    }
    if (!size_mul(per, (size_t)n, &all) || !size_add(all, pack, &all)) return false;
    *out = all;
    return true;
}

size_t tensor_matvec_batch_scratch_bytes(keel_dtype t, int64_t n_cols, int64_t n_tok)
{
    size_t out;
    if (!tensor_dtype_valid(t) || n_cols < 0 || n_tok < 0 ||
        !mvb_bytes(t, n_cols, (int)BASE_MIN(n_tok, TENSOR_MV_BATCH_MAX), &out))
        return 0;
    return out;
}

typedef struct mvb_ctx {
    const tensor_mvb_kernel *k; /* batched kernel, or NULL: token by token */
    tensor_dot_fn dot;
    tensor_mv_fn mv;
    const uint8_t *W;
    size_t row_bytes;
    int64_t n_rows, n_cols, rows_per_task, chunk_rows;
    int n_tok;
    const void *x[TENSOR_MV_BATCH_MAX];  /* activations in the vec_dot type */
    const void *xp[TENSOR_MV_BATCH_MAX]; /* mv's prepared forms, or NULL */
    const void *packed;                  /* k's packed activations */
    float *Y;                            /* [n_tok][n_rows] */
} mvb_ctx;

static void mvb_task(void *vctx, int64_t task, int thread)
{
    (void)thread;
    const mvb_ctx *c = vctx;
    int64_t r0 = task * c->rows_per_task;
    int64_t r1 = BASE_MIN(r0 + c->rows_per_task, c->n_rows);
    const uint8_t *w = c->W + (size_t)r0 * c->row_bytes;
    if (c->k) {
        c->k->run(r1 - r0, c->n_cols, w, c->row_bytes, c->n_tok, c->packed, c->Y + r0, (size_t)c->n_rows);
        return;
    }
    /* a chunk of rows from memory once, then from L1 for every token: each
     * row's result depends on that row alone, so any chunking gives
     * tensor_matvec's bits */
    for (int64_t a = r0; a < r1; a += c->chunk_rows) {
        int64_t b = BASE_MIN(a + c->chunk_rows, r1);
        const uint8_t *wa = c->W + (size_t)a * c->row_bytes;
        for (int i = 0; i < c->n_tok; i++) {
            float *y = c->Y + (size_t)i * (size_t)c->n_rows;
            if (c->mv) {
                c->mv(b - a, c->n_cols, wa, c->row_bytes, c->x[i], c->xp[i], y + a);
                continue;
            }
            const uint8_t *wr = wa;
            for (int64_t r = a; r < b; r++, wr += c->row_bytes) y[r] = c->dot(c->n_cols, wr, c->x[i]);
        }
    }
}

static keel_status matvec_batch_impl(keel_dtype t, const void *W, int64_t n_rows, int64_t n_cols,
                                     const float *X, int64_t n_tok, float *Y, base_pool *pool,
                                     base_arena *scratch)
{
    if (!shape_ok(t, n_rows, n_cols) || n_tok < 0) return KEEL_EINVAL;
    if (n_rows == 0 || n_tok == 0) return KEEL_OK;
    if (!W || !Y || (n_cols > 0 && !X)) return KEEL_EINVAL;
    size_t ys;
    if (!size_mul((size_t)n_tok, (size_t)n_rows, &ys)) return KEEL_EINVAL;
    if (n_cols == 0) {
        memset(Y, 0, ys * sizeof(float));
        return KEEL_OK;
    }
    keel_dtype vt = tensor_vec_dot_type(t);
    mvb_ctx c;
    memset(&c, 0, sizeof c);
    c.k = mvb_kernel(t);
    c.dot = tensor_dot_get_(t);
    const tensor_mv_prep *prep = NULL;
    c.mv = c.k ? NULL : mv_pick(t, &prep);
    c.W = W;
    c.row_bytes = tensor_row_bytes(t, n_cols);
    c.n_rows = n_rows;
    c.n_cols = n_cols;
    c.rows_per_task = matvec_rows_per_task(n_rows, base_pool_threads(pool));
    c.chunk_rows = BASE_MAX((int64_t)(MVB_CHUNK_BYTES / c.row_bytes), 1);
    int64_t n_tasks = (n_rows + c.rows_per_task - 1) / c.rows_per_task;
    size_t mark = scratch ? base_arena_mark(scratch) : 0;
    for (int64_t i0 = 0; i0 < n_tok; i0 += TENSOR_MV_BATCH_MAX) {
        c.n_tok = (int)BASE_MIN(n_tok - i0, TENSOR_MV_BATCH_MAX);
        c.Y = Y + (size_t)i0 * (size_t)n_rows;
        for (int i = 0; i < c.n_tok; i++) {
            const float *x = X + (size_t)(i0 + i) * (size_t)n_cols;
            c.x[i] = x;
            c.xp[i] = NULL;
            if (vt != KEEL_DTYPE_F32) {
                void *q = scratch ? base_arena_take(scratch, tensor_row_bytes(vt, n_cols), BASE_ALIGN) : NULL;
                if (!q) goto no_room;
                tensor_quant_get_(vt)(x, q, n_cols);
                c.x[i] = q;
            }
            if (!c.k && !mv_prep(prep, c.mv, c.x[i], n_cols, scratch, &c.xp[i])) goto no_room;
        }
        if (c.k) {
            void *pk = scratch ? base_arena_take(scratch, c.k->pack_bytes(n_cols, c.n_tok), BASE_ALIGN) : NULL;
            if (!pk) goto no_room;
            c.k->pack(c.x, c.n_tok, n_cols, pk);
            c.packed = pk;
        }
        base_pool_run(pool, n_tasks, mvb_task, &c);
        if (scratch) base_arena_rewind(scratch, mark);
    }
    return KEEL_OK;
no_room:
    if (scratch) base_arena_rewind(scratch, mark);
    return KEEL_ESCRATCH;
}

keel_status tensor_matvec_batch(keel_dtype t, const void *W, int64_t n_rows, int64_t n_cols,
                                const float *X, int64_t n_tok, float *Y, base_pool *pool,
                                base_arena *scratch)
{
    uint64_t t0 = tensor_prof_begin();
    keel_status st = matvec_batch_impl(t, W, n_rows, n_cols, X, n_tok, Y, pool, scratch);
    if (t0) tensor_prof_end_n(t0, TENSOR_PROF_MATMUL, t, n_rows, n_cols,
                              (double)tensor_row_bytes(t, n_cols) * (double)n_rows, n_tok);
    return st;
}

/* ---- helpers of the one-dispatch products ------------------------------------------- */

/* The job whose tasks hold task: first_task[j] is where job j's begin. */
static int job_of_task(const int64_t *first_task, int n_jobs, int64_t task)
{
    int j = 0;
    while (j + 1 < n_jobs && task >= first_task[j + 1]) j++;
    return j;
}

/* Profile entries for a one-dispatch run that began at t0: the run's time
 * shared among the matrices by their bytes (total: all of them). */
static void prof_share(uint64_t t0, tensor_prof_kind kind, const tensor_mv_job *jobs, int n_jobs, int64_t n_cols,
                       int64_t n_tok, double total)
{
    uint64_t now = base_time_ns();
    for (int j = 0; j < n_jobs; j++) {
        double bytes = (double)tensor_row_bytes(jobs[j].dtype, n_cols) * (double)jobs[j].n_rows;
        uint64_t ns = total > 0 ? (uint64_t)((double)(now - t0) * bytes / total) : 0;
        tensor_prof_end_n(base_time_ns() - ns, kind, jobs[j].dtype, jobs[j].n_rows, n_cols, bytes, n_tok);
    }
}

/* ---- several matrices, several tokens, one dispatch ---------------------------------- */

typedef struct mvbm_ctx {
    const tensor_mvb_kernel *k;
    int n_jobs, n_tok;
    int64_t n_cols;
    size_t row_bytes;
    const void *packed;
    const uint8_t *W[TENSOR_MV_MULTI_MAX];
    float *Y[TENSOR_MV_MULTI_MAX]; /* [n_tok][n_rows[j]] */
    int64_t n_rows[TENSOR_MV_MULTI_MAX], rows_per_task[TENSOR_MV_MULTI_MAX];
    int64_t first_task[TENSOR_MV_MULTI_MAX + 1]; /* task index where job j starts */
} mvbm_ctx;

static void mvbm_task(void *vctx, int64_t task, int thread)
{
    (void)thread;
    const mvbm_ctx *c = vctx;
    int j = job_of_task(c->first_task, c->n_jobs, task);
    int64_t r0 = (task - c->first_task[j]) * c->rows_per_task[j];
    int64_t r1 = BASE_MIN(r0 + c->rows_per_task[j], c->n_rows[j]);
    c->k->run(r1 - r0, c->n_cols, c->W[j] + (size_t)r0 * c->row_bytes, c->row_bytes, c->n_tok, c->packed,
              c->Y[j] + r0, (size_t)c->n_rows[j]);
}

keel_status tensor_matvec_batch_multi(const tensor_mv_job *jobs, int n_jobs, int64_t n_cols, const float *X,
                                      int64_t n_tok, base_pool *pool, base_arena *scratch)
{
    if (!jobs || n_jobs < 1 || n_jobs > TENSOR_MV_MULTI_MAX || n_cols < 0 || n_tok < 0) return KEEL_EINVAL;
    keel_dtype t = jobs[0].dtype;
    for (int j = 0; j < n_jobs; j++)
        if (jobs[j].dtype != t || jobs[j].x || !shape_ok(t, jobs[j].n_rows, n_cols) ||
            (jobs[j].n_rows > 0 && (!jobs[j].W || !jobs[j].y)))
            return KEEL_EINVAL;
    if (n_tok > 0 && n_cols > 0 && !X) return KEEL_EINVAL;
    const tensor_mvb_kernel *k = mvb_kernel(t);
    if (!k || n_tok > TENSOR_MV_BATCH_MAX || n_cols == 0 || n_tok == 0) {
        /* no batched kernel (or more tokens than one pass takes): each
         * matrix on its own, as tensor_matvec_batch */
        for (int j = 0; j < n_jobs; j++) {
            keel_status st = tensor_matvec_batch(t, jobs[j].W, jobs[j].n_rows, n_cols, X, n_tok, jobs[j].y, pool, scratch);
            if (st != KEEL_OK) return st;
        }
        return KEEL_OK;
    }
    uint64_t t0 = tensor_prof_begin();
    size_t mark = scratch ? base_arena_mark(scratch) : 0;
    mvbm_ctx c;
    memset(&c, 0, sizeof c);
    c.k = k;
    c.n_jobs = n_jobs;
    c.n_tok = (int)n_tok;
    c.n_cols = n_cols;
    c.row_bytes = tensor_row_bytes(t, n_cols);
    /* the activations quantized and packed once for every matrix */
    keel_dtype vt = tensor_vec_dot_type(t);
    const void *x[TENSOR_MV_BATCH_MAX];
    for (int i = 0; i < c.n_tok; i++) {
        void *q = scratch ? base_arena_take(scratch, tensor_row_bytes(vt, n_cols), BASE_ALIGN) : NULL;
        if (!q) goto no_room;
        tensor_quant_get_(vt)(X + (size_t)i * (size_t)n_cols, q, n_cols);
        x[i] = q;
    }
    void *pk = scratch ? base_arena_take(scratch, k->pack_bytes(n_cols, c.n_tok), BASE_ALIGN) : NULL;
    if (!pk) goto no_room;
    k->pack(x, c.n_tok, n_cols, pk);
    c.packed = pk;
    /* each matrix's rows in the chunks tensor_matvec_batch would cut, one
     * task list */
    int nt = base_pool_threads(pool);
    int64_t n_tasks = 0;
    double total = 0;
    for (int j = 0; j < n_jobs; j++) {
        c.W[j] = jobs[j].W;
        c.Y[j] = jobs[j].y;
        c.n_rows[j] = jobs[j].n_rows;
        c.rows_per_task[j] = matvec_rows_per_task(jobs[j].n_rows, nt);
        c.first_task[j] = n_tasks;
        n_tasks += (jobs[j].n_rows + c.rows_per_task[j] - 1) / c.rows_per_task[j];
        total += (double)c.row_bytes * (double)jobs[j].n_rows;
    }
    c.first_task[n_jobs] = n_tasks;
    base_pool_run(pool, n_tasks, mvbm_task, &c);
    if (scratch) base_arena_rewind(scratch, mark);
    if (t0) prof_share(t0, TENSOR_PROF_MATMUL, jobs, n_jobs, n_cols, n_tok, total);
    return KEEL_OK;
no_room:
    if (scratch) base_arena_rewind(scratch, mark);
    return KEEL_ESCRATCH;
}

/* ---- several matrices, one dispatch -------------------------------------------------- */

typedef struct multi_ctx {
    int n_jobs;
    matvec_ctx mv[TENSOR_MV_MULTI_MAX];
    int64_t first_task[TENSOR_MV_MULTI_MAX + 1]; /* task index where job j starts */
} multi_ctx;

static void multi_task(void *vctx, int64_t task, int thread)
{
    const multi_ctx *c = vctx;
    int j = job_of_task(c->first_task, c->n_jobs, task);
    matvec_task((void *)&c->mv[j], task - c->first_task[j], thread);
}

/* The activation of job j. */
static const float *job_x(const tensor_mv_job *jobs, int j, const float *x)
{
    return jobs[j].x ? jobs[j].x : x;
}

size_t tensor_matvec_multi_scratch_bytes(const tensor_mv_job *jobs, int n_jobs, int64_t n_cols)
{
    size_t need = 0;
    for (int j = 0; j < n_jobs && j < TENSOR_MV_MULTI_MAX; j++) {
        if (!tensor_dtype_valid(jobs[j].dtype)) return 0;
        keel_dtype vt = tensor_vec_dot_type(jobs[j].dtype);
        bool seen = false; /* an earlier job with this vec_dot type and activation */
        for (int i = 0; i < j && !seen; i++)
            seen = tensor_vec_dot_type(jobs[i].dtype) == vt && jobs[i].x == jobs[j].x;
        if (!seen && !size_add(need, tensor_matvec_scratch_bytes(jobs[j].dtype, n_cols), &need)) return 0;
        /* every job's prepared activation (tensor_matvec_scratch_bytes
         * counted the converted one) */
        if (!size_add(need, mv_prep_bytes(jobs[j].dtype, n_cols), &need)) return 0;
    }
    return need;
}

keel_status tensor_matvec_multi(const tensor_mv_job *jobs, int n_jobs, int64_t n_cols, const float *x,
                                base_pool *pool, base_arena *scratch)
{
    if (!jobs || n_jobs < 1 || n_jobs > TENSOR_MV_MULTI_MAX || n_cols < 0) return KEEL_EINVAL;
    for (int j = 0; j < n_jobs; j++)
        if (!shape_ok(jobs[j].dtype, jobs[j].n_rows, n_cols) || (jobs[j].n_rows > 0 && (!jobs[j].W || !jobs[j].y)) ||
            (n_cols > 0 && !job_x(jobs, j, x)))
            return KEEL_EINVAL;
    uint64_t t0 = tensor_prof_begin();
    size_t mark = scratch ? base_arena_mark(scratch) : 0;
    multi_ctx c;
    memset(&c, 0, sizeof c);
    c.n_jobs = n_jobs;
    /* each activation once per distinct vec_dot type */
    keel_dtype conv_t[TENSOR_MV_MULTI_MAX];
    const float *conv_src[TENSOR_MV_MULTI_MAX];
    const void *conv_x[TENSOR_MV_MULTI_MAX];
    int n_conv = 0;
    double total = 0;
    for (int j = 0; j < n_jobs; j++) {
        keel_dtype t = jobs[j].dtype, vt = tensor_vec_dot_type(t);
        const float *src = job_x(jobs, j, x);
        const void *xa = src;
        if (vt != KEEL_DTYPE_F32 && n_cols > 0) {
            int k = 0;
            while (k < n_conv && !(conv_t[k] == vt && conv_src[k] == src)) k++;
            if (k == n_conv) {
                void *q = scratch ? base_arena_take(scratch, tensor_row_bytes(vt, n_cols), BASE_ALIGN) : NULL;
                if (!q) {
                    if (scratch) base_arena_rewind(scratch, mark);
                    return KEEL_ESCRATCH;
                }
                tensor_quant_get_(vt)(src, q, n_cols);
                conv_t[n_conv] = vt;
                conv_src[n_conv] = src;
                conv_x[n_conv++] = q;
            }
            xa = conv_x[k];
        }
        matvec_ctx *m = &c.mv[j];
        m->dot = tensor_dot_get_(t);
        const tensor_mv_prep *prep;
        m->mv = mv_pick(t, &prep);
        int k = 0;
        while (k < j && !(jobs[k].dtype == t && c.mv[k].xp && job_x(jobs, k, x) == src)) k++;
        if (k < j) {
            m->xp = c.mv[k].xp; /* same dtype and activation: same prepared activation */
        } else if (!mv_prep(prep, m->mv, xa, n_cols, scratch, &m->xp)) {
            if (scratch) base_arena_rewind(scratch, mark);
            return KEEL_ESCRATCH;
        }
        m->W = jobs[j].W;
        m->row_bytes = tensor_row_bytes(t, n_cols);
        m->n_rows = jobs[j].n_rows;
        m->n_cols = n_cols;
        m->x = xa;
        m->y = jobs[j].y;
        total += (double)m->row_bytes * (double)m->n_rows;
    }
    /* chunks of about the same bytes in every matrix, as tensor_matvec sizes them */
    int nt = base_pool_threads(pool);
    double per_task = nt <= 1 ? total : total / ((double)nt * MATVEC_TASKS_PER_THREAD);
    int64_t n_tasks = 0;
    for (int j = 0; j < n_jobs; j++) {
        matvec_ctx *m = &c.mv[j];
        c.first_task[j] = n_tasks;
        if (m->n_rows == 0) continue;
        if (n_cols == 0) {
            memset(m->y, 0, (size_t)m->n_rows * sizeof(float));
            continue;
        }
        int64_t per = nt <= 1 ? m->n_rows : (int64_t)(per_task / (double)m->row_bytes);
        per = nt <= 1 ? per : (BASE_MAX(per, MATVEC_MIN_ROWS) + 3) & ~(int64_t)3;
        m->rows_per_task = per;
        n_tasks += (m->n_rows + per - 1) / per;
    }
    c.first_task[n_jobs] = n_tasks;
    base_pool_run(pool, n_tasks, multi_task, &c);
    if (scratch) base_arena_rewind(scratch, mark);
    if (t0) prof_share(t0, TENSOR_PROF_MATVEC, jobs, n_jobs, n_cols, 1, total);
    return KEEL_OK;
}

/* ---- matmul ---------------------------------------------------------------------------- */

static pthread_once_t g_blas_once = PTHREAD_ONCE_INIT;

/* What OpenBLAS's generic fallback costs: on a CPU model it does not know
 * (a newer one, or a VM that hides it) its dynamic dispatch picks the SSE3
 * "Prescott" kernels, measured 31 against 217 GFLOP/s (SkylakeX kernels) for
 * a 2048 x 1024 x 512 dequantize + sgemm on 2 threads of an AVX-512 Xeon.
 * The AVX2 / FMA (Haswell, Zen) and AVX-512 (SkylakeX, Cooperlake,
 * SapphireRapids) cores are OpenBLAS's own informed choices: left alone. */
const char *keel_blas_coretype_advice(void)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    static const char *const fit[] = {"haswell", "zen", "skylakex", "cooperlake", "sapphirerapids"};
    __builtin_cpu_init();
    bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                  __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
    bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    const char *core = openblas_get_corename();
    if (!avx2 || !core) return NULL;
    for (size_t i = 0; i < BASE_ARRAY_LEN(fit); i++)
        if (strcasecmp(core, fit[i]) == 0) return NULL;
    return avx512 ? "SkylakeX" : "Haswell";
#else
    return NULL;
#endif
}

static void blas_init(void)
{
    openblas_set_num_threads(1);
    const char *want = keel_blas_coretype_advice();
    if (want && !getenv("OPENBLAS_CORETYPE")) /* a setting of the user's own is left alone */
        base_log(KEEL_LOG_WARN,
                 "OpenBLAS runs its generic '%s' kernels on this %s CPU (it does not know the model): large "
                 "matrix products run several times slower; set OPENBLAS_CORETYPE=%s before the process "
                 "starts (keel and keel serve restart themselves with it)",
                 openblas_get_corename(), strcmp(want, "SkylakeX") == 0 ? "AVX-512" : "AVX2", want);
}

/* Rows of W per dequantized tile: about MATMUL_TILE_BYTES of f32, a
 * multiple of 16, at least 16. */
static int64_t matmul_tile_rows(int64_t n_cols)
{
    if (n_cols <= 0) return 16;
    int64_t r = (int64_t)(MATMUL_TILE_BYTES / ((size_t)n_cols * sizeof(float)));
    r &= ~(int64_t)15;
    return r < 16 ? 16 : r;
}

static size_t matmul_tile_bytes(int64_t n_cols)
{
    size_t rows = (size_t)matmul_tile_rows(n_cols), cols, out;
    if (!size_from_i64(n_cols, &cols) || !size_mul(rows, cols, &out) ||
        !size_mul(out, sizeof(float), &out) || !size_add(out, BASE_ALIGN, &out))
        return 0;
    return out;
}

/* Scratch of the dot-tile path: X quantized to the vec_dot type. */
static size_t matmul_dot_bytes(keel_dtype t, int64_t n_cols, int64_t n_tok)
{
    keel_dtype vt = tensor_vec_dot_type(t);
    if (vt == KEEL_DTYPE_F32) return 0;
    size_t rb = tensor_row_bytes(vt, n_cols), toks, out;
    if (rb == 0 || !size_from_i64(n_tok, &toks) || !size_mul(rb, toks, &out) ||
        !size_add(out, BASE_ALIGN, &out))
        return 0;
    return out;
}

size_t tensor_matmul_scratch_bytes(keel_dtype t, int64_t n_rows, int64_t n_cols, int64_t n_tok,
                                   int n_threads)
{
    (void)n_rows;
    if (!tensor_dtype_valid(t) || n_cols < 0 || n_tok < 0) return 0;
    if (n_threads < 1) n_threads = 1;
    size_t need = tensor_matvec_scratch_bytes(t, n_cols);
    if (t != KEEL_DTYPE_F32) {
        size_t tile = matmul_tile_bytes(n_cols), all;
        if (tile == 0 || !size_mul(tile, (size_t)n_threads, &all)) return 0;
        need = BASE_MAX(need, all);
    }
    need = BASE_MAX(need, tensor_matvec_batch_scratch_bytes(t, n_cols, n_tok));
    return BASE_MAX(need, matmul_dot_bytes(t, n_cols, n_tok));
}

typedef struct matmul_ctx {
    keel_dtype t;
    const uint8_t *W;
    size_t row_bytes;
    int64_t n_rows, n_cols, n_tok;
    const float *X;
    float *Y;
    int64_t rows_per_task;
    float *tiles; /* [n_threads][tile_rows * n_cols] */
    size_t tile_floats;
    tensor_dequant_fn deq;
    /* dot tiles */
    tensor_dot_fn dot;
    tensor_quant_fn quant;
    uint8_t *Xq; /* [n_tok] rows in the vec_dot type */
    size_t xq_row_bytes;
} matmul_ctx;

/* Y[:, r0:r1] = X . W[r0:r1, :]^T with W rows given as f32. */
static void sgemm_rows(const matmul_ctx *c, const float *Wf, int64_t r0, int64_t nr)
{
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)c->n_tok, (blasint)nr,
                (blasint)c->n_cols, 1.0f, c->X, (blasint)c->n_cols, Wf, (blasint)c->n_cols, 0.0f,
                c->Y + r0, (blasint)c->n_rows);
}

static void matmul_task_f32(void *vctx, int64_t task, int thread)
{
    (void)thread;
    const matmul_ctx *c = vctx;
    int64_t r0 = task * c->rows_per_task;
    int64_t r1 = BASE_MIN(r0 + c->rows_per_task, c->n_rows);
    if (r1 > r0) sgemm_rows(c, (const float *)(c->W + (size_t)r0 * c->row_bytes), r0, r1 - r0);
}

static void matmul_task_deq(void *vctx, int64_t task, int thread)
{
    const matmul_ctx *c = vctx;
    int64_t r0 = task * c->rows_per_task;
    int64_t r1 = BASE_MIN(r0 + c->rows_per_task, c->n_rows);
    float *tile = c->tiles + (size_t)thread * c->tile_floats;
    const uint8_t *w = c->W + (size_t)r0 * c->row_bytes;
    for (int64_t r = r0; r < r1; r++, w += c->row_bytes)
        c->deq(w, tile + (size_t)(r - r0) * (size_t)c->n_cols, c->n_cols);
    if (r1 > r0) sgemm_rows(c, tile, r0, r1 - r0);
}

#define DOT_TILE_ROWS 16
#define DOT_TILE_TOKS 16

static void matmul_task_quant_x(void *vctx, int64_t task, int thread)
{
    (void)thread;
    const matmul_ctx *c = vctx;
    c->quant(c->X + task * c->n_cols, c->Xq + (size_t)task * c->xq_row_bytes, c->n_cols);
}

/* Rows [r0, r0 + DOT_TILE_ROWS) against every token, DOT_TILE_TOKS tokens
 * at a time, so that both tiles stay in L2. */
static void matmul_task_dot(void *vctx, int64_t task, int thread)
{
    (void)thread;
    const matmul_ctx *c = vctx;
    int64_t r0 = task * DOT_TILE_ROWS, r1 = BASE_MIN(r0 + DOT_TILE_ROWS, c->n_rows);
    for (int64_t i0 = 0; i0 < c->n_tok; i0 += DOT_TILE_TOKS) {
        int64_t i1 = BASE_MIN(i0 + DOT_TILE_TOKS, c->n_tok);
        for (int64_t r = r0; r < r1; r++) {
            const uint8_t *w = c->W + (size_t)r * c->row_bytes;
            for (int64_t i = i0; i < i1; i++)
                c->Y[i * c->n_rows + r] = c->dot(c->n_cols, w, c->Xq + (size_t)i * c->xq_row_bytes);
        }
    }
}

/* Whether OpenBLAS runs kernels that use the CPU's AVX2 / AVX-512 (not its
 * generic fallback: keel_blas_coretype_advice). */
static pthread_once_t g_blas_fit_once = PTHREAD_ONCE_INIT;
static bool g_blas_fit;

static void blas_fit_init(void)
{
    g_blas_fit = keel_blas_coretype_advice() == NULL;
}

/* Smallest batch at which dequantize + sgemm beat the dot tiles, measured
 * with `keel bench kernels --gemm` (4096 x 4096 weights, 2 threads;
 * docs/kernels.md). With OpenBLAS's generic SSE3 kernels (a CPU it does not
 * know) sgemm ran at 31 GFLOP/s and the thresholds are the first column;
 * with its AVX2 (Haswell) or AVX-512 (SkylakeX) kernels sgemm is 3-7x
 * faster and wins from the second: q8_0 at 16 tokens 67 vs 59 GFLOP/s
 * (AVX-512; AVX2 60 vs 52), q4_K at 32 118 vs 106 (AVX2 74 vs 73), which
 * is what a MoE expert's share of a 512-token batch is. Types not measured
 * take their closest relative's value. q2_K/q3_K dequantize in scalar code
 * only, so their dot tiles win at every batch measured. */
static int64_t matmul_sgemm_from(keel_dtype t)
{
    pthread_once(&g_blas_fit_once, blas_fit_init);
    bool fit = g_blas_fit;
    switch (t) {
    case KEEL_DTYPE_F32:
        return 8;
    case KEEL_DTYPE_F16:
    case KEEL_DTYPE_BF16:
        return 16;
    case KEEL_DTYPE_Q8_0:
        return fit ? 16 : 32;
    case KEEL_DTYPE_Q4_0:
    case KEEL_DTYPE_Q4_1:
    case KEEL_DTYPE_Q5_0:
    case KEEL_DTYPE_Q5_1:
        return 16;
    case KEEL_DTYPE_Q4_K:
    case KEEL_DTYPE_Q5_K:
        return fit ? 32 : 64;
    case KEEL_DTYPE_Q6_K:
        return 32;
    case KEEL_DTYPE_Q2_K:
    case KEEL_DTYPE_Q3_K:
        return INT64_MAX;
    default:
        return 2;
    }
}

/* Largest batch tensor_matvec_batch takes for dtype t (0: none), measured
 * against the dot tiles and sgemm (docs/kernel-passes.md, "Seventh pass", CPU
 * time of one thread at 2048 x 768, 9 tokens): q8_0 0.33 ms against the
 * dot tiles' 0.46 (its batched kernels share the weight block's load, sign
 * and scales among the tokens; AVX-512: vpdpbusd), q4_0 0.32 against 0.66
 * (its row kernel, token by token, beat its dot; since the twenty-first
 * pass it has q8_0's batched form from 4 tokens), f16 0.68 against 0.74;
 * q4_K even (0.356 / 0.358), taken for its result: each token's matvec
 * bits, so that a verify batch agrees with decode; q6_K's dot tiles were
 * 5% faster (0.38 / 0.41) until it had a batched kernel (eighteenth pass:
 * 0.55-0.72x the dot tiles at 9 tokens, 1.05-1.2x at 2, taken for its
 * bits as q4_K). f16 hands over to sgemm at 16 as before. The
 * quantized ones go to 17 tokens: 1 + the 16 drafts speculation takes by
 * default (the 17th token's pass over the rows costs about one matvec;
 * q8_0 sgemm at 16 tokens took 0.86 ms against the batch's 0.50). */
static int64_t matmul_batch_upto(keel_dtype t)
{
    switch (t) {
    case KEEL_DTYPE_Q8_0:
    case KEEL_DTYPE_Q4_0:
    case KEEL_DTYPE_Q4_K:
    case KEEL_DTYPE_Q5_K:
    case KEEL_DTYPE_Q6_K:
        return TENSOR_MV_BATCH_MAX + 1;
    case KEEL_DTYPE_F16:
    case KEEL_DTYPE_BF16:
        return matmul_sgemm_from(t) - 1;
    default:
        return 0;
    }
}

tensor_gemm_path tensor_matmul_auto_path(keel_dtype t, int64_t n_tok)
{
    if (n_tok <= 1) return TENSOR_GEMM_MATVEC;
    if (n_tok <= matmul_batch_upto(t)) return TENSOR_GEMM_MATVEC_BATCH;
    if (n_tok < matmul_sgemm_from(t)) return TENSOR_GEMM_DOT_TILES;
    return TENSOR_GEMM_DEQUANT_SGEMM;
}

static keel_status matmul_impl(tensor_gemm_path path, keel_dtype t, const void *W, int64_t n_rows,
                               int64_t n_cols, const float *X, int64_t n_tok, float *Y,
                               base_pool *pool, base_arena *scratch)
{
    if (!shape_ok(t, n_rows, n_cols) || n_tok < 0) return KEEL_EINVAL;
    if ((unsigned)path > TENSOR_GEMM_MATVEC_BATCH) return KEEL_EINVAL;
    if (n_rows == 0 || n_tok == 0) return KEEL_OK;
    if (!W || !Y || !X) return KEEL_EINVAL;
    size_t ys;
    if (!size_mul((size_t)n_tok, (size_t)n_rows, &ys) || n_rows > INT32_MAX || n_cols > INT32_MAX ||
        n_tok > INT32_MAX)
        return KEEL_EINVAL;
    if (path == TENSOR_GEMM_AUTO) path = tensor_matmul_auto_path(t, n_tok);
    /* f32 weights go to sgemm in place, and OpenBLAS's C packing code
     * reads them as floats: rows not 4-byte aligned (a GGUF buffer at an odd
     * address) take the dot tiles, whose f32 dot reads any address and
     * needs no scratch. */
    if (path == TENSOR_GEMM_DEQUANT_SGEMM && t == KEEL_DTYPE_F32 &&
        (uintptr_t)W % sizeof(float) != 0)
        path = TENSOR_GEMM_DOT_TILES;
    if (path == TENSOR_GEMM_MATVEC_BATCH) return matvec_batch_impl(t, W, n_rows, n_cols, X, n_tok, Y, pool, scratch);
    if (path == TENSOR_GEMM_MATVEC || n_cols == 0) {
        for (int64_t i = 0; i < n_tok; i++) {
            keel_status st =
                tensor_matvec(t, W, n_rows, n_cols, X + i * n_cols, Y + i * n_rows, pool, scratch);
            if (st != KEEL_OK) return st;
        }
        return KEEL_OK;
    }
    int n_threads = base_pool_threads(pool);
    matmul_ctx c;
    memset(&c, 0, sizeof c);
    c.t = t;
    c.W = W;
    c.row_bytes = tensor_row_bytes(t, n_cols);
    c.n_rows = n_rows;
    c.n_cols = n_cols;
    c.n_tok = n_tok;
    c.X = X;
    c.Y = Y;
    size_t mark = scratch ? base_arena_mark(scratch) : 0;
    if (path == TENSOR_GEMM_DOT_TILES) {
        keel_dtype vt = tensor_vec_dot_type(t);
        c.dot = tensor_dot_get_(t);
        if (vt == KEEL_DTYPE_F32) {
            c.Xq = (uint8_t *)(uintptr_t)X;
            c.xq_row_bytes = (size_t)n_cols * sizeof(float);
        } else {
            c.xq_row_bytes = tensor_row_bytes(vt, n_cols);
            c.Xq = scratch ? base_arena_take_n(scratch, (size_t)n_tok, c.xq_row_bytes) : NULL;
            if (!c.Xq) return KEEL_ESCRATCH;
            c.quant = tensor_quant_get_(vt);
            base_pool_run(pool, n_tok, matmul_task_quant_x, &c);
        }
        base_pool_run(pool, (n_rows + DOT_TILE_ROWS - 1) / DOT_TILE_ROWS, matmul_task_dot, &c);
        if (scratch) base_arena_rewind(scratch, mark);
        return KEEL_OK;
    }
    pthread_once(&g_blas_once, blas_init);
    if (t == KEEL_DTYPE_F32) {
        /* one slice per thread; sgemm blocks internally */
        c.rows_per_task = (n_rows + n_threads - 1) / n_threads;
        c.rows_per_task = (c.rows_per_task + 15) & ~(int64_t)15;
        base_pool_run(pool, (n_rows + c.rows_per_task - 1) / c.rows_per_task, matmul_task_f32, &c);
        return KEEL_OK;
    }
    int64_t tile_rows = matmul_tile_rows(n_cols);
    c.tile_floats = (size_t)tile_rows * (size_t)n_cols;
    c.tiles = scratch ? base_arena_take_n(scratch, c.tile_floats * (size_t)n_threads, sizeof(float))
                      : NULL;
    if (!c.tiles) return KEEL_ESCRATCH;
    c.deq = tensor_dequant_get_(t);
    /* balance: no more rows per task than an even split */
    int64_t even = (n_rows + n_threads - 1) / n_threads;
    c.rows_per_task = BASE_MIN(tile_rows, (even + 15) & ~(int64_t)15);
    base_pool_run(pool, (n_rows + c.rows_per_task - 1) / c.rows_per_task, matmul_task_deq, &c);
    base_arena_rewind(scratch, mark);
    return KEEL_OK;
}

keel_status tensor_matmul_path(tensor_gemm_path path, keel_dtype t, const void *W, int64_t n_rows,
                               int64_t n_cols, const float *X, int64_t n_tok, float *Y,
                               base_pool *pool, base_arena *scratch)
{
    /* a product that runs as matvecs lets them record themselves */
    bool as_matvec = path == TENSOR_GEMM_MATVEC ||
                     (path == TENSOR_GEMM_AUTO && tensor_matmul_auto_path(t, n_tok) == TENSOR_GEMM_MATVEC);
    uint64_t t0 = as_matvec ? 0 : tensor_prof_begin();
    keel_status st = matmul_impl(path, t, W, n_rows, n_cols, X, n_tok, Y, pool, scratch);
    if (t0) tensor_prof_end_n(t0, TENSOR_PROF_MATMUL, t, n_rows, n_cols,
                              (double)tensor_row_bytes(t, n_cols) * (double)n_rows, n_tok);
    return st;
}

keel_status tensor_matmul(keel_dtype t, const void *W, int64_t n_rows, int64_t n_cols,
                          const float *X, int64_t n_tok, float *Y, base_pool *pool,
                          base_arena *scratch)
{
    return tensor_matmul_path(TENSOR_GEMM_AUTO, t, W, n_rows, n_cols, X, n_tok, Y, pool, scratch);
}
