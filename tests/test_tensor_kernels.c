/*
 * test_tensor_kernels.c — src/tensor kernels: f32 helpers, norms, softmax,
 * activations, top-k (against double references, scalar and SIMD, odd
 * sizes, unaligned), matvec and matmul for every weight dtype against a
 * naive double reference with 1..3 threads, weight rows at odd addresses,
 * scratch accounting, and the
 * failing-allocator sweep of the pool + arena setup a matmul needs.
 */
#include "testutil.h"
#include "tensor/tensor.h"
#include "tensor/tensor_impl.h" /* tensor_mv_prep_*: which row kernels prepare x */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const keel_dtype k_weight_types[] = {
    KEEL_DTYPE_F32,  KEEL_DTYPE_F16,  KEEL_DTYPE_BF16, KEEL_DTYPE_Q4_0, KEEL_DTYPE_Q4_1,
    KEEL_DTYPE_Q5_0, KEEL_DTYPE_Q5_1, KEEL_DTYPE_Q8_0, KEEL_DTYPE_Q2_K, KEEL_DTYPE_Q3_K,
    KEEL_DTYPE_Q4_K, KEEL_DTYPE_Q5_K, KEEL_DTYPE_Q6_K,
};

static const int64_t k_sizes[] = {1, 3, 7, 8, 9, 31, 64, 100, 257, 1023};

/* Runs body once per SIMD level this CPU has, forced process-wide
 * (simd: 0 scalar, 1 avx2, 2 avx512), then restores the level before. */
#define FOR_EACH_LEVEL(simd)                                                                       \
    for (int simd = 0, prev_ = (int)tensor_simd_force(TENSOR_SIMD_SCALAR);                        \
         simd <= (int)tensor_simd_best();                                                          \
         tensor_simd_force(++simd <= (int)tensor_simd_best() ? (tensor_simd)simd                   \
                                                             : (tensor_simd)prev_))

/* Random weight rows for dtype t (q2_K/q3_K from random bytes with sane scales). */
static void make_rows(keel_dtype t, int64_t n_rows, int64_t n_cols, uint8_t *W, uint64_t seed)
{
    size_t rb = tensor_row_bytes(t, n_cols);
    if (t == KEEL_DTYPE_Q2_K || t == KEEL_DTYPE_Q3_K) {
        base_rng r;
        base_rng_seed(&r, seed);
        size_t bb = keel_dtype_block_bytes(t);
        for (size_t off = 0; off < rb * (size_t)n_rows; off += bb) {
            for (size_t k = 0; k < bb; k++)
                W[off + k] = (uint8_t)base_rng_next(&r);
            uint16_t d = tensor_f32_to_f16(0.01f), dm = tensor_f32_to_f16(0.004f);
            memcpy(W + off + (t == KEEL_DTYPE_Q2_K ? 80 : 108), &d, 2);
            if (t == KEEL_DTYPE_Q2_K) memcpy(W + off + 82, &dm, 2);
        }
        return;
    }
    float *x = malloc((size_t)n_cols * sizeof(float));
    for (int64_t r = 0; r < n_rows; r++) {
        test_fill_normal(x, n_cols, seed + (uint64_t)r);
        assert_ok(tensor_quantize_row(t, x, W + (size_t)r * rb, n_cols));
    }
    free(x);
}

/* ---- f32 helpers ------------------------------------------------------------------------ */

static void test_f32_helpers(void **state)
{
    (void)state;
    float *buf = malloc(2 * 1040 * sizeof(float)), *y0 = malloc(1040 * sizeof(float));
    for (size_t si = 0; si < BASE_ARRAY_LEN(k_sizes); si++) {
        int64_t n = k_sizes[si];
        float *x = buf + 1 + si % 3, *y = buf + 1040 + 2 - si % 3;
        test_fill_normal(x, n, si);
        test_fill_normal(y0, n, si + 100);
        double d = 0, nx = 0, ny = 0;
        for (int64_t i = 0; i < n; i++) {
            d += (double)x[i] * y0[i];
            nx += (double)x[i] * x[i];
            ny += (double)y0[i] * y0[i];
        }
        FOR_EACH_LEVEL(simd)
        {
            assert_close(tensor_dot_f32(x, y0, n), d, 1e-6 * sqrt(nx * ny));
            memcpy(y, y0, n * sizeof(float));
            tensor_axpy_f32(y, 0.75f, x, n);
            for (int64_t i = 0; i < n; i++)
                assert_close(y[i], y0[i] + 0.75 * x[i], 1e-6 * (fabs(y0[i]) + fabs(x[i])));
            memcpy(y, y0, n * sizeof(float));
            tensor_scale_f32(y, -1.5f, n);
            for (int64_t i = 0; i < n; i++)
                assert_true(y[i] == y0[i] * -1.5f);
            memcpy(y, y0, n * sizeof(float));
            tensor_add_f32(y, x, n);
            for (int64_t i = 0; i < n; i++)
                assert_true(y[i] == y0[i] + x[i]);
            memcpy(y, y0, n * sizeof(float));
            tensor_mul_f32(y, x, n);
            for (int64_t i = 0; i < n; i++)
                assert_true(y[i] == y0[i] * x[i]);
        }
    }
    free(buf);
    free(y0);
}

/* ---- norms, softmax, activations ---------------------------------------------------------- */

static void test_norms(void **state)
{
    (void)state;
    float *x = malloc(1030 * sizeof(float)), *w = malloc(1030 * sizeof(float));
    float *b = malloc(1030 * sizeof(float)), *y = malloc(1030 * sizeof(float));
    for (size_t si = 0; si < BASE_ARRAY_LEN(k_sizes); si++) {
        int64_t n = k_sizes[si];
        float *xs = x + si % 3;
        test_fill_normal(xs, n, 40 + si);
        test_fill_uniform(w, n, 41 + si);
        test_fill_uniform(b, n, 42 + si);
        const float eps = 1e-5f;
        double ss = 0, mean = 0, var = 0;
        for (int64_t i = 0; i < n; i++) {
            ss += (double)xs[i] * xs[i];
            mean += xs[i];
        }
        mean /= n;
        for (int64_t i = 0; i < n; i++)
            var += (xs[i] - mean) * (xs[i] - mean);
        var /= n;
        double rms = 1.0 / sqrt(ss / n + eps), inv = 1.0 / sqrt(var + eps);
        FOR_EACH_LEVEL(simd)
        {
            tensor_rmsnorm(y, xs, w, n, eps);
            for (int64_t i = 0; i < n; i++)
                assert_close(y[i], xs[i] * rms * w[i], 2e-6 * fabs(xs[i] * rms) + 1e-7);
            tensor_rmsnorm(y, xs, NULL, n, eps);
            for (int64_t i = 0; i < n; i++)
                assert_close(y[i], xs[i] * rms, 2e-6 * fabs(xs[i] * rms) + 1e-7);
            tensor_layernorm(y, xs, w, b, n, eps);
            for (int64_t i = 0; i < n; i++)
                assert_close(y[i], (xs[i] - mean) * inv * w[i] + b[i],
                             2e-6 * (fabs((xs[i] - mean) * inv) + 1));
            tensor_layernorm(y, xs, NULL, NULL, n, eps);
            for (int64_t i = 0; i < n; i++)
                assert_close(y[i], (xs[i] - mean) * inv, 2e-6 * (fabs((xs[i] - mean) * inv) + 1));
            memcpy(y, xs, n * sizeof(float));
            tensor_l2norm(y, n, 1e-12f);
            for (int64_t i = 0; i < n; i++)
                assert_close(y[i], xs[i] / sqrt(ss), 2e-6);
        }
        /* in place (y aliases x) */
        memcpy(y, xs, n * sizeof(float));
        tensor_rmsnorm(y, y, w, n, eps);
        for (int64_t i = 0; i < n; i++)
            assert_close(y[i], xs[i] * rms * w[i], 2e-6 * fabs(xs[i] * rms) + 1e-7);
    }
    /* l2norm of a zero vector stays zero (eps floor) */
    memset(y, 0, 8 * sizeof(float));
    tensor_l2norm(y, 8, 1e-6f);
    for (int i = 0; i < 8; i++)
        assert_true(y[i] == 0.0f);
    free(x);
    free(w);
    free(b);
    free(y);
}

static void test_softmax(void **state)
{
    (void)state;
    float *x = malloc(1030 * sizeof(float)), *x0 = malloc(1030 * sizeof(float));
    for (size_t si = 0; si < BASE_ARRAY_LEN(k_sizes); si++) {
        int64_t n = k_sizes[si];
        test_fill_normal(x0, n, 60 + si);
        for (int64_t i = 0; i < n; i++)
            x0[i] = x0[i] * 10.0f + 1000.0f; /* large offset: stability */
        if (n > 4) x0[2] = -INFINITY;
        double mx = -INFINITY, sum = 0;
        for (int64_t i = 0; i < n; i++)
            mx = fmax(mx, x0[i]);
        for (int64_t i = 0; i < n; i++)
            sum += exp((double)x0[i] - mx);
        FOR_EACH_LEVEL(simd)
        {
            float *xs = x + 1 + si % 2;
            memcpy(xs, x0, n * sizeof(float));
            tensor_softmax(xs, n);
            double tot = 0;
            for (int64_t i = 0; i < n; i++) {
                double want = exp((double)x0[i] - mx) / sum;
                assert_close(xs[i], want, 2e-6 * want + 1e-30);
                tot += xs[i];
            }
            assert_close(tot, 1.0, 1e-5);
            if (n > 4) assert_true(xs[2] == 0.0f);
        }
    }
    float z[5] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    tensor_softmax(z, 5);
    for (int i = 0; i < 5; i++)
        assert_true(z[i] == 0.0f);
    float one[1] = {-3.0f};
    tensor_softmax(one, 1);
    assert_true(one[0] == 1.0f);
    free(x);
    free(x0);
}

static double ref_sigmoid(double v)
{
    return 1.0 / (1.0 + exp(-v));
}
static double ref_gelu(double v)
{
    /* 0.5 v (1 + tanh(z)) written as v * sigmoid(2z): no cancellation in the tail */
    return v * ref_sigmoid(2.0 * 0.7978845608028654 * (v + 0.044715 * v * v * v));
}

static void test_activations(void **state)
{
    (void)state;
    const int64_t n = 203;
    float *x0 = malloc(n * sizeof(float)), *x = malloc((n + 2) * sizeof(float));
    float *up = malloc(n * sizeof(float));
    test_fill_normal(x0, n, 77);
    for (int64_t i = 0; i < n; i++)
        x0[i] *= 4.0f;
    x0[0] = 0.0f;
    x0[1] = 100.0f;
    x0[2] = -100.0f;
    x0[3] = 1e-4f;
    x0[4] = -30.0f;
    x0[5] = 89.0f;
    test_fill_uniform(up, n, 78);
    FOR_EACH_LEVEL(simd)
    {
        float *xs = x + 1;
#define CHECK_ACT(call, ref_expr, rtol)                                                            \
    do {                                                                                           \
        memcpy(xs, x0, n * sizeof(float));                                                         \
        call;                                                                                      \
        for (int64_t i = 0; i < n; i++) {                                                          \
            double v = x0[i], want = (ref_expr);                                                   \
            if (!(fabs(xs[i] - want) <= (rtol)*fabs(want) + 1e-12))                                \
                fail_msg("%s simd=%d x=%.9g: %.9g want %.9g", #call, simd, v, xs[i], want);        \
        }                                                                                          \
    } while (0)
        CHECK_ACT(tensor_silu(xs, n), v * ref_sigmoid(v), 2e-6);
        CHECK_ACT(tensor_sigmoid(xs, n), ref_sigmoid(v), 2e-6);
        CHECK_ACT(tensor_gelu(xs, n), ref_gelu(v), 2e-6);
        CHECK_ACT(tensor_gelu_erf(xs, n), 0.5 * v * erfc(-v / sqrt(2.0)), 2e-6);
        CHECK_ACT(tensor_softplus(xs, n), v > 30 ? v : log1p(exp(v)), 2e-6);
        CHECK_ACT(tensor_swiglu(xs, up, n), v * ref_sigmoid(v) * up[i], 2e-6);
        CHECK_ACT(tensor_geglu(xs, up, n), ref_gelu(v) * up[i], 2e-6);
        CHECK_ACT(tensor_softcap(xs, n, 30.0f), 30.0 * tanh(v / 30.0), 2e-6);
#undef CHECK_ACT
    }
    free(x0);
    free(x);
    free(up);
}

/* ---- top-k --------------------------------------------------------------------------------- */

static const float *g_cmp_x;

static int cmp_rank(const void *a, const void *b)
{
    int32_t ia = *(const int32_t *)a, ib = *(const int32_t *)b;
    float va = isnan(g_cmp_x[ia]) ? -INFINITY : g_cmp_x[ia];
    float vb = isnan(g_cmp_x[ib]) ? -INFINITY : g_cmp_x[ib];
    if (va != vb) return va > vb ? -1 : 1;
    return ia < ib ? -1 : ia > ib;
}

static void test_topk(void **state)
{
    (void)state;
    const int64_t n = 1000;
    float *x = malloc(n * sizeof(float));
    int32_t *all = malloc(n * sizeof(int32_t)), *idx = malloc(n * sizeof(int32_t));
    for (int trial = 0; trial < 4; trial++) {
        test_fill_normal(x, n, 90 + trial);
        if (trial >= 1)
            for (int64_t i = 0; i < n; i++)
                x[i] = floorf(x[i] * 3.0f); /* many ties */
        if (trial == 3) x[10] = NAN;
        for (int64_t i = 0; i < n; i++)
            all[i] = (int32_t)i;
        g_cmp_x = x;
        qsort(all, n, sizeof(int32_t), cmp_rank);
        const int64_t ks[] = {1, 2, 5, 40, 999, 1000};
        for (size_t ki = 0; ki < BASE_ARRAY_LEN(ks); ki++) {
            tensor_topk(x, n, ks[ki], idx);
            for (int64_t i = 0; i < ks[ki]; i++)
                if (idx[i] != all[i])
                    fail_msg("topk k=%lld trial %d: idx[%lld] = %d, want %d", (long long)ks[ki],
                             trial, (long long)i, idx[i], all[i]);
        }
    }
    float small[4] = {1, 3, 3, 2};
    int32_t out[4];
    tensor_topk(small, 4, 3, out);
    assert_int_equal(out[0], 1);
    assert_int_equal(out[1], 2);
    assert_int_equal(out[2], 3);
    free(x);
    free(all);
    free(idx);
}

/* ---- matvec / matmul ---------------------------------------------------------------------- */

typedef struct mm_fixture {
    keel_dtype t;
    int64_t n_rows, n_cols;
    uint8_t *W;
    float *Wf; /* dequantized [n_rows][n_cols] */
} mm_fixture;

static void mm_make(mm_fixture *f, keel_dtype t, int64_t n_rows, int64_t n_cols, uint64_t seed)
{
    f->t = t;
    f->n_rows = n_rows;
    f->n_cols = n_cols;
    size_t rb = tensor_row_bytes(t, n_cols);
    f->W = malloc(rb * (size_t)n_rows + 1);
    f->Wf = malloc((size_t)(n_rows * n_cols) * sizeof(float));
    make_rows(t, n_rows, n_cols, f->W, seed);
    for (int64_t r = 0; r < n_rows; r++)
        assert_ok(tensor_dequantize_row(t, f->W + (size_t)r * rb, f->Wf + r * n_cols, n_cols));
}

static void mm_free(mm_fixture *f)
{
    free(f->W);
    free(f->Wf);
}

/* |y - sum_c Wf[r][c] xr[c]| <= tol * ||Wf[r]|| ||xr|| for every r. */
static void check_rows(const mm_fixture *f, const float *xr, const float *y, double tol,
                       const char *what)
{
    double nx = 0;
    for (int64_t c = 0; c < f->n_cols; c++)
        nx += (double)xr[c] * xr[c];
    for (int64_t r = 0; r < f->n_rows; r++) {
        const float *w = f->Wf + r * f->n_cols;
        double s = 0, nw = 0;
        for (int64_t c = 0; c < f->n_cols; c++) {
            s += (double)w[c] * xr[c];
            nw += (double)w[c] * w[c];
        }
        double bound = tol * sqrt(nw * nx) + 1e-30;
        if (!(fabs(y[r] - s) <= bound))
            fail_msg("%s %s row %lld: %.9g want %.9g (bound %.3g)", keel_dtype_name(f->t), what,
                     (long long)r, y[r], s, bound);
    }
}

/* Column counts the row kernels must get right: fewer blocks than a
 * kernel's step, odd block counts (q4_0 takes blocks in pairs), a step
 * plus a tail, and wide rows (ffn_down of large models). */
static const int64_t k_mv_cols[] = {32, 96, 256, 288, 512, 800, 2816, 14336};

static void test_matvec_all_dtypes(void **state)
{
    (void)state;
    const int64_t n_rows = 67, max_cols = 14336;
    base_pool *pools[3];
    for (int p = 0; p < 3; p++)
        assert_ok(base_pool_open(p + 1, &pools[p]));
    base_arena arena;
    assert_ok(base_arena_init(&arena, 1 << 17));
    float *x = malloc((max_cols + 3) * sizeof(float)), *xq = malloc(max_cols * sizeof(float));
    float *y = malloc((n_rows + 3) * sizeof(float));
    uint8_t *xbuf = malloc((size_t)max_cols * sizeof(float));
    for (size_t k = 0; k < BASE_ARRAY_LEN(k_weight_types); k++) {
        for (size_t c = 0; c < BASE_ARRAY_LEN(k_mv_cols); c++) {
            int64_t n_cols = k_mv_cols[c];
            if (n_cols % keel_dtype_block_size(k_weight_types[k])) continue;
            mm_fixture f;
            mm_make(&f, k_weight_types[k], n_rows, n_cols, 300 + k + 17 * c);
            keel_dtype vt = tensor_vec_dot_type(f.t);
            float *xs = x + (k + c) % 4;
            test_fill_normal(xs, n_cols, 400 + k + 17 * c);
            /* the activation as the kernel sees it (quantized to the vec_dot type) */
            assert_ok(tensor_quantize_row(vt, xs, xbuf, n_cols));
            assert_ok(tensor_dequantize_row(vt, xbuf, xq, n_cols));
            assert_true(tensor_matvec_scratch_bytes(f.t, n_cols) <= arena.cap);
            FOR_EACH_LEVEL(simd)
            {
                for (int p = 0; p < 3; p++) {
                    float *ys = y + p;
                    size_t used = arena.used;
                    assert_ok(tensor_matvec(f.t, f.W, n_rows, n_cols, xs, ys, pools[p], &arena));
                    assert_int_equal(arena.used, used); /* scratch rewound */
                    /* exact up to f32 summation against the quantized activation */
                    check_rows(&f, xq, ys, 2e-6, "matvec (vs quantized x)");
                    /* and close to the f32 activation (q8 activation error) */
                    check_rows(&f, xs, ys, vt == KEEL_DTYPE_F32 ? 2e-6 : 1e-2, "matvec (vs f32 x)");
                }
            }
            /* scratch too small: KEEL_ESCRATCH, arena unchanged; also when only
             * the row kernel's prepared activation does not fit (room for
             * the quantized x alone: the scalar path runs, AVX2 refuses) */
            if (vt != KEEL_DTYPE_F32) {
                size_t caps[2] = {0, (tensor_row_bytes(vt, n_cols) + 63) & ~(size_t)63};
                for (int i = 0; i < 2; i++) {
                    base_arena tiny;
                    assert_ok(base_arena_init(&tiny, caps[i]));
                    FOR_EACH_LEVEL(simd2)
                    {
                        keel_status st = tensor_matvec(f.t, f.W, n_rows, n_cols, xs, y, pools[1], &tiny);
                        const tensor_mv_prep *pr = simd2 == 2 && tensor_mv_avx512_[f.t] ? &tensor_mv_prep_avx512_[f.t]
                                                                                     : &tensor_mv_prep_avx2_[f.t];
                        bool fits = i == 1 && (simd2 == 0 || !pr->run);
                        assert_status(st, fits ? KEEL_OK : KEEL_ESCRATCH);
                        assert_int_equal(tiny.used, 0);
                    }
                    base_arena_free(&tiny);
                }
                assert_status(tensor_matvec(f.t, f.W, n_rows, n_cols, xs, y, pools[1], NULL), KEEL_ESCRATCH);
            }
            mm_free(&f);
        }
    }
    /* bad shapes */
    float w[64] = {0};
    assert_status(tensor_matvec(KEEL_DTYPE_Q8_0, w, 1, 33, x, y, NULL, &arena), KEEL_EINVAL);
    assert_status(tensor_matvec(KEEL_DTYPE_Q4_K, w, 1, 32, x, y, NULL, &arena), KEEL_EINVAL);
    assert_status(tensor_matvec(KEEL_DTYPE_I8, w, 1, 32, x, y, NULL, &arena), KEEL_EINVAL);
    assert_status(tensor_matvec(KEEL_DTYPE_F32, w, -1, 32, x, y, NULL, &arena), KEEL_EINVAL);
    assert_ok(tensor_matvec(KEEL_DTYPE_F32, w, 0, 32, x, y, NULL, &arena));
    base_arena_free(&arena);
    for (int p = 0; p < 3; p++)
        base_pool_close(pools[p]);
    free(x);
    free(xq);
    free(y);
    free(xbuf);
}

/* tensor_matvec_multi: matrices of different dtypes (and vec_dot types)
 * sharing x, or each with its own activation (a MoE layer's down
 * projections), give bit for bit what tensor_matvec gives each, with 1..3
 * threads, under every SIMD level; bad arguments and a small arena are
 * refused with the arena unchanged. */
static void test_matvec_multi(void **state)
{
    (void)state;
    const int64_t n_cols = 512;
    const keel_dtype types[] = {KEEL_DTYPE_Q8_0, KEEL_DTYPE_Q4_K, KEEL_DTYPE_F16, KEEL_DTYPE_Q6_K,
                                KEEL_DTYPE_F32, KEEL_DTYPE_Q4_0};
    const int64_t rows[] = {67, 130, 9, 4, 33, 256};
    enum { MAXJ = 12 };
    mm_fixture f[6];
    for (int k = 0; k < 6; k++) mm_make(&f[k], types[k], rows[k], n_cols, 900 + (uint64_t)k);
    float *xs[3], *want = malloc(256 * sizeof(float)), *got[MAXJ];
    for (int k = 0; k < 3; k++) {
        xs[k] = malloc(n_cols * sizeof(float));
        test_fill_normal(xs[k], n_cols, 77 + (uint64_t)k);
    }
    float *x = xs[0];
    for (int k = 0; k < MAXJ; k++) got[k] = malloc(256 * sizeof(float));
    base_arena arena;
    assert_ok(base_arena_init(&arena, 1 << 17));
    base_pool *pools[3];
    for (int p = 0; p < 3; p++) assert_ok(base_pool_open(p + 1, &pools[p]));
    /* sets of matrices (-1 ends one): q/k/v-like (one vec_dot type), mixed
     * types, and experts: gate/up pairs on the shared x, then downs each on
     * its own x (xi: 0 the shared x, 1 and 2 a job's own) */
    const int sets[5][MAXJ] = {{0, 5, 5, -1},
                               {1, 3, 2, 0, -1},
                               {4, 2, -1},
                               {0, 0, 1, 1, 5, 5, 0, 0, -1},
                               {0, 1, 0, 1, 2, 3, 4, 5, 0, 1, 3, 5}};
    const int xi[5][MAXJ] = {{0}, {0}, {0}, {0, 0, 0, 0, 0, 0, 1, 2}, {1, 1, 2, 2, 0, 0, 1, 2, 0, 2, 1, 0}};
    FOR_EACH_LEVEL(simd)
    {
        for (int si = 0; si < 5; si++)
            for (int p = 0; p < 3; p++) {
                tensor_mv_job jobs[MAXJ];
                int n = 0;
                for (int k = 0; k < MAXJ && sets[si][k] >= 0; k++, n++) {
                    const mm_fixture *m = &f[sets[si][k]];
                    jobs[n] = (tensor_mv_job){m->t, m->W, m->n_rows, got[n], xi[si][k] ? xs[xi[si][k]] : NULL};
                }
                size_t used = arena.used;
                assert_true(tensor_matvec_multi_scratch_bytes(jobs, n, n_cols) <= arena.cap);
                assert_ok(tensor_matvec_multi(jobs, n, n_cols, x, pools[p], &arena));
                assert_int_equal(arena.used, used);
                for (int k = 0; k < n; k++) {
                    const mm_fixture *m = &f[sets[si][k]];
                    const float *xk = xs[xi[si][k]];
                    assert_ok(tensor_matvec(m->t, m->W, m->n_rows, n_cols, xk, want, pools[p], &arena));
                    if (memcmp(want, got[k], (size_t)m->n_rows * sizeof(float)) != 0)
                        fail_msg("multi %s (set %d, job %d, %d threads, level %d) differs from tensor_matvec",
                                 keel_dtype_name(m->t), si, k, p + 1, simd);
                    check_rows(m, xk, got[k], tensor_vec_dot_type(m->t) == KEEL_DTYPE_F32 ? 2e-6 : 1e-2,
                               "multi (vs f32 x)");
                }
            }
    }
    tensor_mv_job bad[TENSOR_MV_MULTI_MAX + 1];
    for (int k = 0; k <= TENSOR_MV_MULTI_MAX; k++)
        bad[k] = (tensor_mv_job){f[0].t, f[0].W, f[0].n_rows, got[0], NULL};
    assert_status(tensor_matvec_multi(bad, 0, n_cols, x, NULL, &arena), KEEL_EINVAL);
    assert_status(tensor_matvec_multi(bad, TENSOR_MV_MULTI_MAX + 1, n_cols, x, NULL, &arena), KEEL_EINVAL);
    assert_status(tensor_matvec_multi(bad, 2, 33, x, NULL, &arena), KEEL_EINVAL);
    assert_status(tensor_matvec_multi(bad, 2, n_cols, NULL, NULL, &arena), KEEL_EINVAL); /* no activation */
    bad[1].W = NULL;
    assert_status(tensor_matvec_multi(bad, 2, n_cols, x, NULL, &arena), KEEL_EINVAL);
    base_arena tiny;
    assert_ok(base_arena_init(&tiny, 64));
    assert_status(tensor_matvec_multi(bad, 1, n_cols, x, NULL, &tiny), KEEL_ESCRATCH);
    assert_int_equal(tiny.used, 0);
    base_arena_free(&tiny);
    base_arena_free(&arena);
    for (int p = 0; p < 3; p++) base_pool_close(pools[p]);
    for (int k = 0; k < 6; k++) mm_free(&f[k]);
    for (int k = 0; k < MAXJ; k++) free(got[k]);
    for (int k = 0; k < 3; k++) free(xs[k]);
    free(want);
}

static bool path_quantizes_x(tensor_gemm_path p)
{
    return p == TENSOR_GEMM_MATVEC || p == TENSOR_GEMM_DOT_TILES || p == TENSOR_GEMM_MATVEC_BATCH;
}

static void test_matmul_all_dtypes(void **state)
{
    (void)state;
    const int64_t n_rows = 45, n_cols = 256;
    const int64_t toks[] = {1, 3, 4, 9, 33};
    const tensor_gemm_path paths[] = {TENSOR_GEMM_AUTO, TENSOR_GEMM_MATVEC, TENSOR_GEMM_DEQUANT_SGEMM,
                                      TENSOR_GEMM_DOT_TILES, TENSOR_GEMM_MATVEC_BATCH};
    base_pool *pool;
    assert_ok(base_pool_open(2, &pool));
    float *X = malloc(33 * n_cols * sizeof(float)), *Y = malloc(33 * n_rows * sizeof(float));
    float *Xq = malloc(33 * n_cols * sizeof(float));
    uint8_t *xbuf = malloc(2048);
    for (size_t k = 0; k < BASE_ARRAY_LEN(k_weight_types); k++) {
        mm_fixture f;
        mm_make(&f, k_weight_types[k], n_rows, n_cols, 500 + k);
        keel_dtype vt = tensor_vec_dot_type(f.t);
        test_fill_normal(X, 33 * n_cols, 600 + k);
        for (int64_t i = 0; i < 33; i++) {
            assert_ok(tensor_quantize_row(vt, X + i * n_cols, xbuf, n_cols));
            assert_ok(tensor_dequantize_row(vt, xbuf, Xq + i * n_cols, n_cols));
        }
        for (size_t ti = 0; ti < BASE_ARRAY_LEN(toks); ti++) {
            int64_t n_tok = toks[ti];
            size_t need = tensor_matmul_scratch_bytes(f.t, n_rows, n_cols, n_tok, 2);
            base_arena arena;
            assert_ok(base_arena_init(&arena, need));
            for (size_t pi = 0; pi < BASE_ARRAY_LEN(paths); pi++) {
                tensor_gemm_path p = paths[pi];
                tensor_gemm_path eff =
                    p == TENSOR_GEMM_AUTO ? tensor_matmul_auto_path(f.t, n_tok) : p;
                FOR_EACH_LEVEL(simd)
                {
                    memset(Y, 0xFF, 33 * n_rows * sizeof(float));
                    assert_ok(
                        tensor_matmul_path(p, f.t, f.W, n_rows, n_cols, X, n_tok, Y, pool, &arena));
                    assert_int_equal(arena.used, 0);
                    /* exact up to f32 summation against the activation the
                     * path multiplies (quantized to the vec_dot type or f32) */
                    for (int64_t i = 0; i < n_tok; i++) {
                        const float *xr = path_quantizes_x(eff) ? Xq + i * n_cols : X + i * n_cols;
                        check_rows(&f, xr, Y + i * n_rows, 2e-6, "matmul");
                        check_rows(&f, X + i * n_cols, Y + i * n_rows,
                                   vt == KEEL_DTYPE_F32 ? 2e-6 : 1e-2, "matmul (vs f32 x)");
                    }
                }
                /* a too-small arena is refused when the path needs scratch */
                bool needs = (eff == TENSOR_GEMM_DEQUANT_SGEMM && f.t != KEEL_DTYPE_F32) ||
                             (path_quantizes_x(eff) && vt != KEEL_DTYPE_F32);
                base_arena small;
                assert_ok(base_arena_init(&small, 64));
                assert_status(
                    tensor_matmul_path(p, f.t, f.W, n_rows, n_cols, X, n_tok, Y, pool, &small),
                    needs ? KEEL_ESCRATCH : KEEL_OK);
                assert_int_equal(small.used, 0);
                base_arena_free(&small);
            }
            base_arena_free(&arena);
        }
        mm_free(&f);
    }
    assert_status(
        tensor_matmul_path((tensor_gemm_path)9, KEEL_DTYPE_F32, X, 1, 32, X, 4, Y, pool, NULL),
        KEEL_EINVAL);
    base_pool_close(pool);
    free(X);
    free(Xq);
    free(Y);
    free(xbuf);
}

/* Weight rows at every byte offset 1..3 (a GGUF buffer at an odd address;
 * issue 8 item 6: the AVX2 f32 dot read misaligned floats in its tail):
 * dot, dequantize, axpy_row, matvec and every matmul path give exactly the
 * aligned result (the same code runs; f32 sgemm moves to the dot tiles,
 * checked against the reference instead). Under UBSan (make test-asan) any
 * misaligned typed load aborts. n_cols leaves a scalar tail for block-1
 * dtypes. */
static void test_misaligned_weights(void **state)
{
    (void)state;
    const int64_t n_rows = 21, n_tok = 9;
    base_pool *pool;
    assert_ok(base_pool_open(2, &pool));
    for (size_t k = 0; k < BASE_ARRAY_LEN(k_weight_types); k++) {
        keel_dtype t = k_weight_types[k];
        int64_t bs = keel_dtype_block_size(t);
        int64_t n_cols = bs == 1 ? 263 : bs == 32 ? 288 : 512;
        keel_dtype vt = tensor_vec_dot_type(t);
        size_t rb = tensor_row_bytes(t, n_cols), wb = rb * (size_t)n_rows;
        mm_fixture f;
        mm_make(&f, t, n_rows, n_cols, 700 + k);
        uint8_t *buf = malloc(wb + 8);
        float *X = malloc((size_t)(n_tok * n_cols) * sizeof(float));
        float *Y0 = malloc((size_t)(n_tok * n_rows) * sizeof(float));
        float *Y1 = malloc((size_t)(n_tok * n_rows) * sizeof(float));
        float *d0 = malloc((size_t)n_cols * sizeof(float)), *d1 = malloc((size_t)n_cols * sizeof(float));
        uint8_t *xq = malloc(tensor_row_bytes(vt, n_cols) + 64);
        test_fill_normal(X, n_tok * n_cols, 800 + k);
        assert_ok(tensor_quantize_row(vt, X, xq, n_cols));
        base_arena arena;
        assert_ok(base_arena_init(&arena, tensor_matmul_scratch_bytes(t, n_rows, n_cols, n_tok, 2)));
        for (int off = 1; off <= 3; off++) {
            uint8_t *W = buf + off;
            memcpy(W, f.W, wb);
            FOR_EACH_LEVEL(simd)
            {
                for (int64_t r = 0; r < n_rows; r++) {
                    const uint8_t *a = f.W + (size_t)r * rb, *m = W + (size_t)r * rb;
                    float da = tensor_vec_dot(t, n_cols, a, xq), dm = tensor_vec_dot(t, n_cols, m, xq);
                    if (memcmp(&da, &dm, sizeof da) != 0)
                        fail_msg("%s +%d row %lld: dot %.9g, aligned %.9g", keel_dtype_name(t), off,
                                 (long long)r, dm, da);
                    assert_ok(tensor_dequantize_row(t, a, d0, n_cols));
                    assert_ok(tensor_dequantize_row(t, m, d1, n_cols));
                    assert_memory_equal(d0, d1, (size_t)n_cols * sizeof(float));
                    memset(d0, 0, (size_t)n_cols * sizeof(float));
                    memset(d1, 0, (size_t)n_cols * sizeof(float));
                    tensor_axpy_row(t, n_cols, 0.5f, a, d0);
                    tensor_axpy_row(t, n_cols, 0.5f, m, d1);
                    assert_memory_equal(d0, d1, (size_t)n_cols * sizeof(float));
                }
                assert_ok(tensor_matvec(t, f.W, n_rows, n_cols, X, Y0, pool, &arena));
                assert_ok(tensor_matvec(t, W, n_rows, n_cols, X, Y1, pool, &arena));
                assert_memory_equal(Y0, Y1, (size_t)n_rows * sizeof(float));
                for (int p = TENSOR_GEMM_MATVEC; p <= TENSOR_GEMM_DOT_TILES; p++) {
                    assert_ok(tensor_matmul_path((tensor_gemm_path)p, t, W, n_rows, n_cols, X, n_tok,
                                                 Y1, pool, &arena));
                    if (p == TENSOR_GEMM_DEQUANT_SGEMM && t == KEEL_DTYPE_F32) {
                        for (int64_t i = 0; i < n_tok; i++)
                            check_rows(&f, X + i * n_cols, Y1 + i * n_rows, 2e-6, "misaligned sgemm");
                        continue;
                    }
                    assert_ok(tensor_matmul_path((tensor_gemm_path)p, t, f.W, n_rows, n_cols, X,
                                                 n_tok, Y0, pool, &arena));
                    if (memcmp(Y0, Y1, (size_t)(n_tok * n_rows) * sizeof(float)) != 0)
                        fail_msg("%s +%d: matmul path %d differs from the aligned rows",
                                 keel_dtype_name(t), off, p);
                }
            }
        }
        base_arena_free(&arena);
        mm_free(&f);
        free(buf);
        free(X);
        free(Y0);
        free(Y1);
        free(d0);
        free(d1);
        free(xq);
    }
    base_pool_close(pool);
}

/* The setup a prefill GEMM needs (pool + arena), run once, all through the
 * allocator hooks: every allocation failure must give KEEL_ENOMEM and leak
 * nothing. (src/tensor itself allocates nothing.) */
static keel_status matmul_setup_op(void *ctx)
{
    (void)ctx;
    const int64_t n_rows = 32, n_cols = 64, n_tok = 8;
    static float X[8 * 64], Y[8 * 32];
    static uint8_t W[32 * 68];
    for (int i = 0; i < 8 * 64; i++)
        X[i] = (float)(i % 7) - 3.0f;
    float row[64];
    for (int r = 0; r < 32; r++) {
        for (int c = 0; c < 64; c++)
            row[c] = (float)((r + c) % 5) - 2.0f;
        keel_status qs = tensor_quantize_row(KEEL_DTYPE_Q8_0, row, W + r * 68, 64);
        if (qs != KEEL_OK) return qs;
    }
    base_pool *pool = NULL;
    base_arena arena = {0};
    keel_status st = base_pool_open(2, &pool);
    if (st != KEEL_OK) goto done;
    st = base_arena_init(&arena,
                         tensor_matmul_scratch_bytes(KEEL_DTYPE_Q8_0, n_rows, n_cols, n_tok, 2));
    if (st != KEEL_OK) goto done;
    st = tensor_matmul(KEEL_DTYPE_Q8_0, W, n_rows, n_cols, X, n_tok, Y, pool, &arena);
done:
    base_arena_free(&arena);
    base_pool_close(pool);
    return st;
}

static void test_alloc_sweep_matmul_setup(void **state)
{
    (void)state;
    int64_t n = test_alloc_sweep(matmul_setup_op, NULL);
    assert_true(n >= 3); /* pool, worker arg, arena */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f32_helpers),
        cmocka_unit_test(test_norms),
        cmocka_unit_test(test_softmax),
        cmocka_unit_test(test_activations),
        cmocka_unit_test(test_topk),
        cmocka_unit_test(test_matvec_all_dtypes),
        cmocka_unit_test(test_matvec_multi),
        cmocka_unit_test(test_matmul_all_dtypes),
        cmocka_unit_test(test_misaligned_weights),
        cmocka_unit_test(test_alloc_sweep_matmul_setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
