/*
 * bench_kernels.c — `keel bench kernels [--json] [-t N] [--gemm]`: the
 * tensor kernels timed beside references measured in the same run:
 *   read_bw_gbps  memory read bandwidth, 1 and 2 threads (1 GiB buffer, then
 *                 256 MiB beside each matvec round; the best seen)
 *   wht           ns per vector, scalar vs SIMD, n = 64, 128, 256
 *   matvec        weight GB/s on >= 256 MiB of valid quantized weights, as %
 *                 of read bandwidth; 1, 2 (and N) threads; scalar 1 thread
 *   quantize      ns per row (128 wide; K-quants 256), scalar vs SIMD
 *   fma peak      fp32 GFLOP/s of a register-only FMA loop at the SIMD level
 *                 in force (1 and 2 threads), the reference of matmul
 *   matmul        prefill GEMM GFLOP/s, 4096 x 4096 weights, 16 and 512 tokens,
 *                 and its fraction of the 2-thread FMA peak
 * --gemm adds the strategy comparison behind tensor_matmul's choice (every
 * path over a range of batch sizes; docs/kernels.md).
 * Everything goes through the allocator hooks; nothing is printed except
 * through the caller's sink.
 */
#include "bench.h"
#include "../tensor/tensor.h"

#include <stdlib.h>
#include <string.h>

#define MATVEC_BYTES ((size_t)256 << 20)
#define MATVEC_COLS  4096
#define GEMM_ROWS    4096
#define GEMM_COLS    4096
#define GEMM_TOK     512

typedef struct bk_buf {
    void *p;
    size_t n;
} bk_buf;

static bool bk_alloc(bk_buf *b, size_t n)
{
    b->p = base_alloc(n);
    b->n = b->p ? n : 0;
    return b->p != NULL;
}

static void bk_free(bk_buf *b)
{
    base_free(b->p, b->n);
    b->p = NULL;
    b->n = 0;
}

static void bk_fill_normal(float *x, int64_t n, uint64_t seed)
{
    base_rng r;
    base_rng_seed(&r, seed);
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)base_rng_normal(&r);
}

/* n_rows rows of n_cols in dtype t: 64 distinct quantized random rows,
 * repeated (valid blocks everywhere; quantizing 256 MiB would dominate). */
static keel_status bk_weights(keel_dtype t, int64_t n_rows, int64_t n_cols, bk_buf *out)
{
    size_t rb = tensor_row_bytes(t, n_cols);
    if (!bk_alloc(out, rb * (size_t)n_rows)) return KEEL_ENOMEM;
    bk_buf tmp;
    if (!bk_alloc(&tmp, (size_t)n_cols * sizeof(float))) {
        bk_free(out);
        return KEEL_ENOMEM;
    }
    uint8_t *w = out->p;
    int64_t distinct = BASE_MIN(n_rows, 64);
    for (int64_t r = 0; r < distinct; r++) {
        bk_fill_normal(tmp.p, n_cols, 1000 + (uint64_t)r);
        keel_status st = tensor_quantize_row(t, tmp.p, w + (size_t)r * rb, n_cols);
        if (st != KEEL_OK) {
            bk_free(&tmp);
            bk_free(out);
            return st;
        }
    }
    for (int64_t r = distinct; r < n_rows; r++)
        memcpy(w + (size_t)r * rb, w + (size_t)(r % distinct) * rb, rb);
    bk_free(&tmp);
    return KEEL_OK;
}

/* ---- WHT ------------------------------------------------------------------------------ */

typedef struct wht_res {
    int n;
    double scalar_ns, simd_ns;
} wht_res;

static double bk_time_wht(int64_t n, float *buf, int n_vec)
{
    int reps = (int)(4000000 / (n * n_vec)) + 1;
    double best = 1e30;
    for (int trial = 0; trial < 7; trial++) {
        uint64_t t0 = base_time_ns();
        for (int r = 0; r < reps; r++)
            for (int v = 0; v < n_vec; v++)
                tensor_wht(buf + (size_t)v * (size_t)n, n);
        double ns = (double)(base_time_ns() - t0) / ((double)reps * n_vec);
        if (ns < best) best = ns;
    }
    return best;
}

/* ---- matvec --------------------------------------------------------------------------- */

typedef struct mv_res {
    keel_dtype t;
    int threads;
    double gbps;
    bool scalar;
} mv_res;

static double bk_time_matvec(keel_dtype t, const bk_buf *W, int64_t n_rows, const float *x,
                             float *y, base_pool *pool, base_arena *arena, int reps)
{
    size_t bytes = tensor_row_bytes(t, MATVEC_COLS) * (size_t)n_rows;
    if (tensor_matvec(t, W->p, n_rows, MATVEC_COLS, x, y, pool, arena) != KEEL_OK) return -1; /* warm */
    double best = 0;
    for (int r = 0; r < reps; r++) {
        uint64_t t0 = base_time_ns();
        if (tensor_matvec(t, W->p, n_rows, MATVEC_COLS, x, y, pool, arena) != KEEL_OK) return -1;
        double gbps = (double)bytes / (double)(base_time_ns() - t0);
        if (gbps > best) best = gbps;
    }
    return best;
}

/* ---- quantize ------------------------------------------------------------------------- */

typedef struct q_res {
    keel_dtype t;
    int n;
    double scalar_ns, simd_ns;
} q_res;

/* ns per row, best of 5 trials; -1 if the dtype cannot be quantized */
static double bk_time_quant(keel_dtype t, int n, const float *x, uint8_t *y, int rows)
{
    size_t rb = tensor_row_bytes(t, n);
    double best = 1e30;
    for (int trial = 0; trial < 5; trial++) {
        uint64_t t0 = base_time_ns();
        for (int r = 0; r < rows; r++)
            if (tensor_quantize_row(t, x + (size_t)r * (size_t)n, y + (size_t)r * rb, n) != KEEL_OK) return -1;
        double ns = (double)(base_time_ns() - t0) / rows;
        if (ns < best) best = ns;
    }
    return best;
}

/* ---- matmul ----------------------------------------------------------------------------- */

typedef struct mm_res {
    keel_dtype t;
    int64_t n_tok;
    tensor_gemm_path path;
    double gflops;
} mm_res;

static const char *path_name(tensor_gemm_path p)
{
    switch (p) {
    case TENSOR_GEMM_MATVEC:
        return "matvec";
    case TENSOR_GEMM_DEQUANT_SGEMM:
        return "dequant_sgemm";
    case TENSOR_GEMM_DOT_TILES:
        return "dot_tiles";
    case TENSOR_GEMM_MATVEC_BATCH:
        return "matvec_batch";
    default:
        return "auto";
    }
}

static double bk_time_matmul(tensor_gemm_path path, keel_dtype t, const bk_buf *W, const float *X,
                             int64_t n_tok, float *Y, base_pool *pool, base_arena *arena,
                             double budget_ns)
{
    double flops = 2.0 * GEMM_ROWS * (double)GEMM_COLS * (double)n_tok, best = 0, spent = 0;
    for (int r = 0; r < 5 && (r < 2 || spent < budget_ns); r++) {
        uint64_t t0 = base_time_ns();
        keel_status st =
            tensor_matmul_path(path, t, W->p, GEMM_ROWS, GEMM_COLS, X, n_tok, Y, pool, arena);
        double ns = (double)(base_time_ns() - t0);
        if (st != KEEL_OK) return -1;
        spent += ns;
        if (r > 0 && flops / ns > best) best = flops / ns; /* first run warms */
    }
    return best;
}

/* ---- the benchmark -------------------------------------------------------------------- */

#define BK_MAX_RES 256

typedef struct bk_state {
    base_pool *pools[3]; /* 1, 2, N threads */
    int n_threads[3];
    int n_pools;
    double bw[2];
    double peak[2]; /* fp32 FMA peak GFLOP/s at the level in force, 1 and 2 threads */
    wht_res wht[3];
    mv_res mv[BK_MAX_RES];
    int n_mv;
    mv_res mvc[8]; /* in cache, 1 thread */
    int n_mvc;
    double cache_bw; /* 1 thread, the same bytes read in cache */
    q_res q[16];
    int n_q;
    mm_res mm[BK_MAX_RES];
    int n_mm;
    const char *simd;
} bk_state;

#define MATVEC_ROUNDS 3
#define MATVEC_CACHE_BYTES ((size_t)512 << 10) /* in-cache matvec: the first 512 KiB of rows (L2 on most cores) */
#define MATVEC_CACHE_ITERS 64                  /* products per timing */

/* GB/s of one thread over the first rows of W (about MATVEC_CACHE_BYTES:
 * they stay in L2), MATVEC_CACHE_ITERS products per timing, best of reps:
 * what the kernel's arithmetic allows when memory never makes it wait. */
static double bk_time_matvec_cached(keel_dtype t, const bk_buf *W, const float *x, float *y,
                                    base_pool *pool, base_arena *arena, int reps)
{
    size_t rb = tensor_row_bytes(t, MATVEC_COLS);
    int64_t n_rows = (int64_t)(MATVEC_CACHE_BYTES / rb);
    if (n_rows < 1) n_rows = 1;
    size_t bytes = rb * (size_t)n_rows;
    if (tensor_matvec(t, W->p, n_rows, MATVEC_COLS, x, y, pool, arena) != KEEL_OK) return -1; /* warm */
    double best = 0;
    for (int r = 0; r < reps; r++) {
        uint64_t t0 = base_time_ns();
        for (int i = 0; i < MATVEC_CACHE_ITERS; i++)
            if (tensor_matvec(t, W->p, n_rows, MATVEC_COLS, x, y, pool, arena) != KEEL_OK) return -1;
        double gbps = (double)bytes * MATVEC_CACHE_ITERS / (double)(base_time_ns() - t0);
        if (gbps > best) best = gbps;
    }
    return best;
}

/* Each (dtype, threads) is measured in MATVEC_ROUNDS rounds spread over the
 * section, each round right after a fresh read-bandwidth measurement with
 * the same threads: the host's bandwidth drifts, so the best of several
 * rounds on both sides compares like with like. */
static keel_status bk_run_matvec(bk_state *s)
{
    /* q5_K and q6_K: the other halves of the common K-quant model mixes */
    static const keel_dtype types[] = {KEEL_DTYPE_Q8_0, KEEL_DTYPE_Q4_0, KEEL_DTYPE_Q4_K,
                                       KEEL_DTYPE_Q5_K, KEEL_DTYPE_Q6_K, KEEL_DTYPE_F16};
    enum { NT = 6 };
    bk_buf xb, yb, W[NT];
    int64_t n_rows[NT];
    memset(W, 0, sizeof W);
    base_arena arena = {0};
    keel_status st = KEEL_ENOMEM;
    if (!bk_alloc(&xb, MATVEC_COLS * sizeof(float))) return KEEL_ENOMEM;
    if (!bk_alloc(&yb, (MATVEC_BYTES / 1024) * sizeof(float) + 4096)) {
        bk_free(&xb);
        return KEEL_ENOMEM;
    }
    st = base_arena_init(&arena, 1 << 20);
    if (st != KEEL_OK) goto done;
    bk_fill_normal(xb.p, MATVEC_COLS, 7);
    for (int k = 0; k < NT; k++) {
        size_t rb = tensor_row_bytes(types[k], MATVEC_COLS);
        n_rows[k] = (int64_t)((MATVEC_BYTES + rb - 1) / rb);
        st = bk_weights(types[k], n_rows[k], MATVEC_COLS, &W[k]);
        if (st != KEEL_OK) goto done;
    }
    int first = s->n_mv;
    for (int k = 0; k < NT; k++) {
        for (int p = 0; p <= s->n_pools; p++) { /* the last slot: scalar, 1 thread */
            mv_res *r = &s->mv[s->n_mv++];
            r->t = types[k];
            r->scalar = p == s->n_pools;
            r->threads = r->scalar ? 1 : s->n_threads[p];
            r->gbps = 0;
        }
    }
    for (int round = 0; round < MATVEC_ROUNDS; round++) {
        for (int k = 0; k < NT; k++) {
            mv_res *r = &s->mv[first + k * (s->n_pools + 1)];
            for (int p = 0; p < s->n_pools; p++, r++) {
                if (p < 2) {
                    double bw = bench_read_bw_gbps(s->pools[p], MATVEC_BYTES, 3);
                    if (bw > s->bw[p]) s->bw[p] = bw;
                }
                double g = bk_time_matvec(types[k], &W[k], n_rows[k], xb.p, yb.p, s->pools[p], &arena, 4);
                if (g > r->gbps) r->gbps = g;
            }
            if (round == 0) { /* the scalar reference: once (slow) */
                tensor_simd prev = tensor_simd_force(TENSOR_SIMD_SCALAR);
                r->gbps = bk_time_matvec(types[k], &W[k], n_rows[k], xb.p, yb.p, s->pools[0], &arena, 1);
                tensor_simd_force(prev);
            }
        }
    }
    /* in cache, 1 thread (pools[0]), against a read of the same bytes in cache */
    s->cache_bw = bench_read_cached_gbps(MATVEC_CACHE_BYTES, MATVEC_CACHE_ITERS, 5);
    for (int k = 0; k < NT && s->n_mvc < (int)BASE_ARRAY_LEN(s->mvc); k++) {
        mv_res *r = &s->mvc[s->n_mvc++];
        r->t = types[k];
        r->threads = 1;
        r->scalar = false;
        r->gbps = bk_time_matvec_cached(types[k], &W[k], xb.p, yb.p, s->pools[0], &arena, 5);
    }
    st = KEEL_OK;
done:
    for (int k = 0; k < NT; k++) bk_free(&W[k]);
    base_arena_free(&arena);
    bk_free(&xb);
    bk_free(&yb);
    return st;
}

static keel_status bk_run_quant(bk_state *s)
{
    static const keel_dtype types[] = {KEEL_DTYPE_Q8_0, KEEL_DTYPE_Q4_0, KEEL_DTYPE_Q4_1,
                                       KEEL_DTYPE_Q5_0, KEEL_DTYPE_Q5_1, KEEL_DTYPE_F16,
                                       KEEL_DTYPE_BF16, KEEL_DTYPE_Q8_K, KEEL_DTYPE_Q4_K,
                                       KEEL_DTYPE_Q5_K, KEEL_DTYPE_Q6_K};
    const int rows = 2048;
    bk_buf xb, yb;
    if (!bk_alloc(&xb, (size_t)rows * 256 * sizeof(float))) return KEEL_ENOMEM;
    if (!bk_alloc(&yb, (size_t)rows * 256 * sizeof(float))) {
        bk_free(&xb);
        return KEEL_ENOMEM;
    }
    bk_fill_normal(xb.p, rows * 256, 11);
    for (size_t k = 0; k < BASE_ARRAY_LEN(types); k++) {
        keel_dtype t = types[k];
        int n = keel_dtype_block_size(t) > 128 ? 256 : 128;
        int nr = n == 256 && t != KEEL_DTYPE_Q8_K ? rows / 8 : rows; /* K-quant search is slow */
        q_res *r = &s->q[s->n_q++];
        r->t = t;
        r->n = n;
        r->simd_ns = bk_time_quant(t, n, xb.p, yb.p, nr);
        tensor_simd prev = tensor_simd_force(TENSOR_SIMD_SCALAR);
        r->scalar_ns = bk_time_quant(t, n, xb.p, yb.p, nr);
        tensor_simd_force(prev);
    }
    bk_free(&xb);
    bk_free(&yb);
    return KEEL_OK;
}

static keel_status bk_run_matmul(bk_state *s, bool compare)
{
    static const keel_dtype types[] = {KEEL_DTYPE_F32,  KEEL_DTYPE_F16,  KEEL_DTYPE_Q8_0,
                                       KEEL_DTYPE_Q4_0, KEEL_DTYPE_Q4_K, KEEL_DTYPE_Q6_K};
    static const int64_t toks[] = {2, 4, 8, 9, 16, 32, 64, 128, 512};
    static const tensor_gemm_path paths[] = {TENSOR_GEMM_MATVEC, TENSOR_GEMM_DEQUANT_SGEMM,
                                             TENSOR_GEMM_DOT_TILES, TENSOR_GEMM_MATVEC_BATCH};
    base_pool *pool = s->pools[s->n_pools > 1 ? 1 : 0]; /* 2 threads */
    int nt = base_pool_threads(pool);
    bk_buf xb, yb, W;
    base_arena arena = {0};
    keel_status st = KEEL_ENOMEM;
    if (!bk_alloc(&xb, (size_t)GEMM_TOK * GEMM_COLS * sizeof(float))) return KEEL_ENOMEM;
    if (!bk_alloc(&yb, (size_t)GEMM_TOK * GEMM_ROWS * sizeof(float))) {
        bk_free(&xb);
        return KEEL_ENOMEM;
    }
    bk_fill_normal(xb.p, GEMM_TOK * GEMM_COLS, 13);
    size_t need = 0;
    for (size_t k = 0; k < BASE_ARRAY_LEN(types); k++)
        need = BASE_MAX(need,
                        tensor_matmul_scratch_bytes(types[k], GEMM_ROWS, GEMM_COLS, GEMM_TOK, nt));
    st = base_arena_init(&arena, need);
    if (st != KEEL_OK) goto done;
    for (size_t k = 0; k < BASE_ARRAY_LEN(types); k++) {
        keel_dtype t = types[k];
        if (!compare && t == KEEL_DTYPE_Q6_K) continue;
        st = bk_weights(t, GEMM_ROWS, GEMM_COLS, &W);
        if (st != KEEL_OK) goto done;
        if (!compare) {
            static const int64_t auto_toks[] = {16, GEMM_TOK};
            for (size_t ti = 0; ti < BASE_ARRAY_LEN(auto_toks); ti++) {
                mm_res *r = &s->mm[s->n_mm++];
                r->t = t;
                r->n_tok = auto_toks[ti];
                r->path = tensor_matmul_auto_path(t, auto_toks[ti]);
                r->gflops = bk_time_matmul(TENSOR_GEMM_AUTO, t, &W, xb.p, auto_toks[ti], yb.p, pool,
                                           &arena, 1e9);
            }
        } else {
            for (size_t ti = 0; ti < BASE_ARRAY_LEN(toks); ti++) {
                for (size_t pi = 0; pi < BASE_ARRAY_LEN(paths); pi++) {
                    if (s->n_mm >= BK_MAX_RES) break;
                    /* per-token matvec at big batches only costs time */
                    if (paths[pi] == TENSOR_GEMM_MATVEC && toks[ti] > 64) continue;
                    /* the batched matvec is for verify batches (groups of 16 beyond) */
                    if (paths[pi] == TENSOR_GEMM_MATVEC_BATCH && toks[ti] > 32) continue;
                    mm_res *r = &s->mm[s->n_mm++];
                    r->t = t;
                    r->n_tok = toks[ti];
                    r->path = paths[pi];
                    r->gflops =
                        bk_time_matmul(paths[pi], t, &W, xb.p, toks[ti], yb.p, pool, &arena, 3e8);
                }
            }
        }
        bk_free(&W);
    }
    st = KEEL_OK;
done:
    base_arena_free(&arena);
    bk_free(&xb);
    bk_free(&yb);
    return st;
}

static double bk_mv_gbps(const bk_state *s, keel_dtype t, int threads, bool scalar)
{
    for (int i = 0; i < s->n_mv; i++)
        if (s->mv[i].t == t && s->mv[i].threads == threads && s->mv[i].scalar == scalar)
            return s->mv[i].gbps;
    return 0;
}

static void bk_print_json(bench_out *o, const bk_state *s)
{
    bench_printf(o,
                 "{\"simd\": \"%s\", \"read_bw_gbps\": {\"1\": %.2f, \"2\": %.2f}, "
                 "\"fma_peak_gflops\": {\"1\": %.1f, \"2\": %.1f}, \"wht\": [",
                 s->simd, s->bw[0], s->bw[1], s->peak[0], s->peak[1]);
    for (int i = 0; i < 3; i++)
        bench_printf(o, "%s{\"n\": %d, \"scalar_ns\": %.2f, \"simd_ns\": %.2f}", i ? ", " : "",
                     s->wht[i].n, s->wht[i].scalar_ns, s->wht[i].simd_ns);
    bench_printf(o, "], \"matvec\": [");
    for (int i = 0; i < s->n_mv; i++)
        bench_printf(o, "%s{\"dtype\": \"%s\", \"threads\": %d, %s\"gbps\": %.2f}", i ? ", " : "",
                     keel_dtype_name(s->mv[i].t), s->mv[i].threads,
                     s->mv[i].scalar ? "\"scalar\": true, " : "", s->mv[i].gbps);
    bench_printf(o, "], \"matvec_in_cache\": {\"bytes\": %zu, \"read_gbps\": %.2f, \"kernels\": [",
                 MATVEC_CACHE_BYTES, s->cache_bw);
    for (int i = 0; i < s->n_mvc; i++)
        bench_printf(o, "%s{\"dtype\": \"%s\", \"threads\": 1, \"gbps\": %.2f}", i ? ", " : "",
                     keel_dtype_name(s->mvc[i].t), s->mvc[i].gbps);
    bench_printf(o, "]}, \"quantize\": [");
    for (int i = 0; i < s->n_q; i++)
        bench_printf(
            o,
            "%s{\"dtype\": \"%s\", \"n\": %d, \"ns_per_row\": %.1f, \"scalar_ns_per_row\": %.1f}",
            i ? ", " : "", keel_dtype_name(s->q[i].t), s->q[i].n, s->q[i].simd_ns,
            s->q[i].scalar_ns);
    bench_printf(o, "], \"matmul\": [");
    for (int i = 0; i < s->n_mm; i++)
        bench_printf(
            o,
            "%s{\"dtype\": \"%s\", \"rows\": %d, \"cols\": %d, \"n_tok\": %lld, \"threads\": 2, "
            "\"path\": \"%s\", \"gflops\": %.1f, \"of_peak\": %.3f}",
            i ? ", " : "", keel_dtype_name(s->mm[i].t), GEMM_ROWS, GEMM_COLS,
            (long long)s->mm[i].n_tok, path_name(s->mm[i].path), s->mm[i].gflops,
            s->peak[1] > 0 ? s->mm[i].gflops / s->peak[1] : 0.0);
    double w128 = s->wht[1].simd_ns, ws128 = s->wht[1].scalar_ns;
    double bw2 = s->bw[1];
    bench_printf(o,
                 "], \"targets\": {\"wht128_speedup\": %.2f, \"wht128_simd_ns\": %.2f, "
                 "\"q8_0_matvec_2t_pct_bw\": %.1f, \"q4_K_matvec_2t_pct_bw\": %.1f}}\n",
                 ws128 / w128, w128, 100.0 * bk_mv_gbps(s, KEEL_DTYPE_Q8_0, 2, false) / bw2,
                 100.0 * bk_mv_gbps(s, KEEL_DTYPE_Q4_K, 2, false) / bw2);
}

static void bk_print_table(bench_out *o, const bk_state *s)
{
    bench_printf(o, "keel bench kernels (SIMD: %s)\n\n", s->simd);
    bench_printf(
        o, "memory read bandwidth (best of 1 GiB and 256 MiB runs): 1 thread %.2f GB/s, 2 threads %.2f GB/s\n\n",
        s->bw[0], s->bw[1]);
    bench_printf(o, "fp32 FMA peak (register-only FMA loop, %s): 1 thread %.1f GFLOP/s, 2 threads %.1f GFLOP/s\n\n",
                 s->simd, s->peak[0], s->peak[1]);
    bench_printf(o, "Walsh-Hadamard transform, ns per vector\n");
    bench_printf(o, "  %6s %12s %12s %9s\n", "n", "scalar", "simd", "speedup");
    for (int i = 0; i < 3; i++)
        bench_printf(o, "  %6d %12.1f %12.1f %8.2fx\n", s->wht[i].n, s->wht[i].scalar_ns,
                     s->wht[i].simd_ns, s->wht[i].scalar_ns / s->wht[i].simd_ns);
    bench_printf(o, "  target: n=128 simd >= 4x scalar and <= 48 ns\n\n");
    bench_printf(o, "matvec %d columns, >= 256 MiB of weights, weight GB/s\n", MATVEC_COLS);
    bench_printf(o, "  %-6s %8s %10s %12s %14s\n", "dtype", "threads", "GB/s", "% read bw",
                 "scalar 1t GB/s");
    for (int i = 0; i < s->n_mv; i++) {
        const mv_res *r = &s->mv[i];
        if (r->scalar) continue;
        double bw = r->threads == 1 ? s->bw[0] : s->bw[1];
        if (r->threads <= 2)
            bench_printf(o, "  %-6s %8d %10.2f %11.1f%% %14.2f\n", keel_dtype_name(r->t), r->threads,
                         r->gbps, 100.0 * r->gbps / bw, bk_mv_gbps(s, r->t, 1, true));
        else
            bench_printf(o, "  %-6s %8d %10.2f %12s %14.2f\n", keel_dtype_name(r->t), r->threads,
                         r->gbps, "-", bk_mv_gbps(s, r->t, 1, true));
    }
    bench_printf(o,
                 "  target: q8_0 and q4_K with 2 threads >= 60%% of 2-thread read bandwidth\n\n");
    bench_printf(o,
                 "matvec in cache (the first %zu KiB of the rows, 1 thread, %d products per timing):\n"
                 "what each kernel's arithmetic allows; read of the same bytes in cache %.2f GB/s\n",
                 MATVEC_CACHE_BYTES >> 10, MATVEC_CACHE_ITERS, s->cache_bw);
    bench_printf(o, "  %-6s %10s %14s %16s\n", "dtype", "GB/s", "% cache read", "x 1t DRAM read");
    for (int i = 0; i < s->n_mvc; i++)
        bench_printf(o, "  %-6s %10.2f %13.1f%% %15.2fx\n", keel_dtype_name(s->mvc[i].t), s->mvc[i].gbps,
                     100.0 * s->mvc[i].gbps / s->cache_bw, s->mvc[i].gbps / s->bw[0]);
    bench_printf(o, "\n");
    bench_printf(o, "quantize, ns per row\n");
    bench_printf(o, "  %-6s %5s %12s %12s %9s\n", "dtype", "n", "scalar", "simd", "speedup");
    for (int i = 0; i < s->n_q; i++) {
        keel_dtype t = s->q[i].t;
        bool scalar_only = t == KEEL_DTYPE_Q4_K || t == KEEL_DTYPE_Q5_K || t == KEEL_DTYPE_Q6_K;
        if (scalar_only)
            bench_printf(o, "  %-6s %5d %12.1f %12s %9s\n", keel_dtype_name(t), s->q[i].n,
                         s->q[i].scalar_ns, "(scalar)", "-");
        else
            bench_printf(o, "  %-6s %5d %12.1f %12.1f %8.2fx\n", keel_dtype_name(t), s->q[i].n,
                         s->q[i].scalar_ns, s->q[i].simd_ns, s->q[i].scalar_ns / s->q[i].simd_ns);
    }
    bench_printf(o, "\nmatmul %dx%d weights, 2 threads, GFLOP/s\n", GEMM_ROWS, GEMM_COLS);
    bench_printf(o, "  %-6s %6s %-14s %10s %12s\n", "dtype", "n_tok", "path", "GFLOP/s", "% FMA peak");
    for (int i = 0; i < s->n_mm; i++)
        bench_printf(o, "  %-6s %6lld %-14s %10.1f %11.1f%%\n", keel_dtype_name(s->mm[i].t),
                     (long long)s->mm[i].n_tok, path_name(s->mm[i].path), s->mm[i].gflops,
                     s->peak[1] > 0 ? 100.0 * s->mm[i].gflops / s->peak[1] : 0.0);
}

keel_status bench_kernels(int argc, char **argv, bench_out *o)
{
    static const bench_flag spec[] = {{"-t", true}, {"--gemm", false}};
    keel_status st = bench_check_args(o, "kernels", argc, argv, spec, BASE_ARRAY_LEN(spec));
    int64_t extra = 0;
    if (st == KEEL_OK) st = bench_int_opt(o, "kernels", argc, argv, "-t", 1, 256, 0, &extra);
    if (st != KEEL_OK) return st;
    bool compare = bench_has_flag(argc, argv, "--gemm");
    bk_state *s = base_calloc(1, sizeof *s);
    if (!s) return base_err(o->err, KEEL_ENOMEM, "bench kernels: out of memory");
    int want[3] = {1, 2, (int)extra};
    for (int i = 0; i < 3 && st == KEEL_OK; i++) {
        if (i == 2 && (extra == 0 || extra <= 2)) break;
        st = base_pool_open(want[i], &s->pools[i]);
        if (st == KEEL_OK) s->n_threads[s->n_pools++] = want[i];
        else base_err(o->err, st, "bench kernels: cannot start %d threads", want[i]);
    }
    if (st != KEEL_OK) goto done;
    s->simd = tensor_simd_name();

    s->bw[0] = bench_read_bw_gbps(s->pools[0], 0, 3);
    s->bw[1] = bench_read_bw_gbps(s->pools[1], 0, 3);
    s->peak[0] = bench_fma_peak_gflops(s->pools[0], (int)tensor_simd_level(), 5);
    s->peak[1] = bench_fma_peak_gflops(s->pools[1], (int)tensor_simd_level(), 5);
    if (s->bw[0] < 0 || s->bw[1] < 0) {
        st = base_err(o->err, KEEL_ENOMEM, "bench kernels: cannot allocate the 1 GiB bandwidth buffer");
        goto done;
    }

    {
        bk_buf wb;
        const int n_vec = 32;
        if (!bk_alloc(&wb, (size_t)n_vec * 256 * sizeof(float))) {
            st = base_err(o->err, KEEL_ENOMEM, "bench kernels: out of memory (wht vectors)");
            goto done;
        }
        const int ns[3] = {64, 128, 256};
        for (int i = 0; i < 3; i++) {
            bk_fill_normal(wb.p, n_vec * ns[i], 3);
            s->wht[i].n = ns[i];
            s->wht[i].simd_ns = bk_time_wht(ns[i], wb.p, n_vec);
            tensor_simd prev = tensor_simd_force(TENSOR_SIMD_SCALAR);
            s->wht[i].scalar_ns = bk_time_wht(ns[i], wb.p, n_vec);
            tensor_simd_force(prev);
        }
        bk_free(&wb);
    }

    const char *stage = "matvec";
    st = bk_run_matvec(s);
    if (st == KEEL_OK) {
        stage = "quantize";
        st = bk_run_quant(s);
    }
    if (st == KEEL_OK) {
        stage = "matmul";
        st = bk_run_matmul(s, compare);
    }
    if (st != KEEL_OK) {
        base_err(o->err, st, "bench kernels: %s: %s (256 MiB of weights per round)", stage,
                 keel_strerror(st));
        goto done;
    }
    if (o->json)
        bk_print_json(o, s);
    else
        bk_print_table(o, s);
done:
    for (int i = 0; i < 3; i++)
        base_pool_close(s->pools[i]);
    base_free(s, sizeof *s);
    return st;
}
