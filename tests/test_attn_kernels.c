/*
 * test_attn_kernels.c — the inner kernels of attention (src/memory/
 * attn_kernels.h) on every path this CPU runs (scalar, AVX2, AVX-512):
 * K . q scores and p . V accumulators against the scalar kernels (float
 * reordering only: 1e-5 of the sum of absolute terms), the scalar kernels
 * against a double-precision reference of the dequantized rows, and exp
 * against expf. Dtypes with SIMD paths (f32, f16, q8_0, q4_0) and ones that
 * fall back to scalar (bf16, q4_1, q5_0); head dims 64 and 128, dims that
 * hit the SIMD kernels' fallbacks (40: not a multiple of 16; 96: not of 64;
 * 576: more query blocks than the AVX-512 quad holds); R in
 * {1, 2, 3, 4, 8, 12}; 1..32 cells with random (repeating) cell lists.
 * Each path runs with its SIMD level forced process-wide (tensor_simd_force,
 * what KEEL_SIMD and keel_set_simd do), through the kernels attention
 * dispatches to under that level.
 */
#include "testutil.h"
#include "memory/attn_kernels.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_CELLS 48 /* rows in the test's K / V column */
#define DIM_MAX 576
#define R_MAX   40

static const keel_dtype k_types[] = {KEEL_DTYPE_F32,  KEEL_DTYPE_F16,  KEEL_DTYPE_Q8_0,
                                     KEEL_DTYPE_Q4_0, KEEL_DTYPE_BF16, KEEL_DTYPE_Q4_1,
                                     KEEL_DTYPE_Q5_0};
static const int32_t k_dims[] = {64, 128, 40, 96, 576, 36}; /* 36: f16/f32 tails (not a multiple of 8 or 16) */
static const int32_t k_rows[] = {1, 2, 3, 4, 8, 12, 37}; /* 37: a prefill block (tokens x GQA), two row groups of the tiled kernels */
static const char *const k_path_names[] = {"scalar", "avx2", "avx512"};

typedef struct fixture {
    uint8_t *rows; /* [N_CELLS][rb] rows of dtype t */
    float *rows_f; /* [N_CELLS][dim] the rows dequantized */
    uint8_t *q;    /* [R_MAX][qrb] queries in t's vec_dot type */
    float *q_f;    /* [R_MAX][dim] the queries dequantized */
    size_t rb, qrb;
} fixture;

static bool dim_fits(keel_dtype t, int32_t dim)
{
    return tensor_row_bytes(t, dim) > 0 && tensor_row_bytes(tensor_vec_dot_type(t), dim) > 0;
}

/* Random rows of t (N(0,1) scaled per row so that magnitudes vary) and
 * queries in t's vec_dot type. */
static void fixture_make(fixture *f, keel_dtype t, int32_t dim, uint64_t seed)
{
    keel_dtype qt = tensor_vec_dot_type(t);
    f->rb = tensor_row_bytes(t, dim);
    f->qrb = tensor_row_bytes(qt, dim);
    f->rows = malloc(N_CELLS * f->rb);
    f->rows_f = malloc(N_CELLS * (size_t)dim * sizeof(float));
    f->q = malloc(R_MAX * f->qrb);
    f->q_f = malloc(R_MAX * (size_t)dim * sizeof(float));
    assert_non_null(f->rows);
    assert_non_null(f->rows_f);
    assert_non_null(f->q);
    assert_non_null(f->q_f);
    float x[DIM_MAX];
    for (int c = 0; c < N_CELLS; c++) {
        test_fill_normal(x, dim, seed * 1000 + (uint64_t)c);
        float s = 0.25f + (float)(c % 7);
        for (int32_t i = 0; i < dim; i++)
            x[i] *= s;
        assert_ok(tensor_quantize_row(t, x, f->rows + (size_t)c * f->rb, dim));
        assert_ok(tensor_dequantize_row(t, f->rows + (size_t)c * f->rb, f->rows_f + (size_t)c * dim,
                                        dim));
    }
    for (int r = 0; r < R_MAX; r++) {
        test_fill_normal(x, dim, seed * 1000 + 500 + (uint64_t)r);
        assert_ok(tensor_quantize_row(qt, x, f->q + (size_t)r * f->qrb, dim));
        assert_ok(
            tensor_dequantize_row(qt, f->q + (size_t)r * f->qrb, f->q_f + (size_t)r * dim, dim));
    }
}

static void fixture_free(fixture *f)
{
    free(f->rows);
    free(f->rows_f);
    free(f->q);
    free(f->q_f);
}

/* Forces the SIMD level of path p process-wide (as KEEL_SIMD / keel_set_simd
 * do) and returns the kernels attention dispatches to under it; the caller
 * restores the level it returns in *prev after running them. */
static attn_kernel_set forced(attn_path p, keel_dtype kt, keel_dtype vt, tensor_simd *prev)
{
    *prev = tensor_simd_force((tensor_simd)p);
    assert_int_equal(attn_path_active(), p);
    return attn_kernels(attn_path_active(), kt, vt, 128, 128);
}

static void random_idx(int32_t *idx, int32_t n, base_rng *rng)
{
    for (int32_t j = 0; j < n; j++)
        idx[j] = (int32_t)(base_rng_next(rng) % N_CELLS);
}

static void check_close(double got, double want, double tol, const char *what, const char *path,
                        keel_dtype t, int32_t dim, int32_t R, int32_t n, int32_t r, int32_t j)
{
    if (fabs(got - want) <= tol) return;
    fail_msg("%s %s %s dim %d R %d n %d: [%d][%d] = %.9g, want %.9g (tol %.3g)", what, path,
             keel_dtype_name(t), dim, R, n, r, j, got, want, tol);
}

static void test_kq(void **state)
{
    (void)state;
    attn_path best = attn_path_best();
    base_rng rng;
    base_rng_seed(&rng, 7);
    const void *qp[R_MAX];
    int32_t idx[ATTN_CB];
    float ref[R_MAX * ATTN_CB], got[R_MAX * ATTN_CB];
    int64_t checked = 0;
    for (size_t ti = 0; ti < BASE_ARRAY_LEN(k_types); ti++)
        for (size_t di = 0; di < BASE_ARRAY_LEN(k_dims); di++) {
            keel_dtype t = k_types[ti];
            int32_t dim = k_dims[di];
            if (!dim_fits(t, dim)) continue;
            fixture f;
            fixture_make(&f, t, dim, 10 * ti + di + 1);
            /* prefetching (a hint) must not change results */
            attn_pf no_pf = {NULL, 0}, pf = {f.rows + f.rb, (N_CELLS - 1) * f.rb};
            for (int r = 0; r < R_MAX; r++)
                qp[r] = f.q + (size_t)r * f.qrb;
            for (size_t ri = 0; ri < BASE_ARRAY_LEN(k_rows); ri++)
                for (int32_t n = 1; n <= ATTN_CB; n++) {
                    int32_t R = k_rows[ri];
                    random_idx(idx, n, &rng);
                    bool prev = tensor_set_simd(false);
                    attn_kq_scalar(t, f.rows, f.rb, idx, n, qp, R, dim, ref, no_pf);
                    tensor_set_simd(prev);
                    for (int32_t r = 0; r < R; r++)
                        for (int32_t j = 0; j < n; j++) {
                            const float *k = f.rows_f + (size_t)idx[j] * dim,
                                        *x = f.q_f + (size_t)r * dim;
                            double d = 0, a = 0;
                            for (int32_t i = 0; i < dim; i++) {
                                d += (double)k[i] * x[i];
                                a += fabs((double)k[i] * x[i]);
                            }
                            check_close(ref[r * ATTN_CB + j], d, 1e-5 * a + 1e-30, "kq vs double",
                                        "scalar", t, dim, R, n, r, j);
                        }
                    for (int p = (int)ATTN_PATH_SCALAR; p <= (int)best; p++) {
                        tensor_simd lv;
                        attn_kq_fn kq = forced((attn_path)p, t, t, &lv).kq;
                        for (int32_t i = 0; i < R_MAX * ATTN_CB; i++)
                            got[i] = NAN;
                        kq(t, f.rows, f.rb, idx, n, qp, R, dim, got, pf);
                        tensor_simd_force(lv);
                        for (int32_t r = 0; r < R; r++)
                            for (int32_t j = 0; j < n; j++) {
                                const float *k = f.rows_f + (size_t)idx[j] * dim,
                                            *x = f.q_f + (size_t)r * dim;
                                double a = 0;
                                for (int32_t i = 0; i < dim; i++)
                                    a += fabs((double)k[i] * x[i]);
                                check_close(got[r * ATTN_CB + j], ref[r * ATTN_CB + j],
                                            1e-5 * a + 1e-30, "kq", k_path_names[p], t, dim, R, n,
                                            r, j);
                                checked++;
                            }
                        /* nothing outside [R][n] is written */
                        for (int32_t r = 0; r < R_MAX; r++)
                            for (int32_t j = 0; j < ATTN_CB; j++)
                                if (r >= R || j >= n)
                                    if (!isnan(got[r * ATTN_CB + j]))
                                        fail_msg("kq %s %s dim %d R %d n %d wrote [%d][%d]",
                                                 k_path_names[p], keel_dtype_name(t), dim, R, n, r,
                                                 j);
                    }
                }
            fixture_free(&f);
        }
    printf("kq: %lld scores checked, paths up to %s\n", (long long)checked, k_path_names[best]);
}

/* The magnitude a p . V term's rounding scales with: |v| for most dtypes;
 * for q4_1 (v = d q + m) and q4_0 (v = d q + m with m = -8 d) the larger of
 * |d q| and |m|, since a kernel may form p d q + p m (the AVX2 q4_0 p . V
 * adds -8 sum(p d) once per block) where v itself is a small difference of
 * the two. */
static double pv_term_mag(keel_dtype t, const fixture *f, int32_t cell, int32_t dim, int32_t i)
{
    double v = f->rows_f[(size_t)cell * dim + i];
    if (t != KEEL_DTYPE_Q4_1 && t != KEEL_DTYPE_Q4_0) return fabs(v);
    double m;
    if (t == KEEL_DTYPE_Q4_1) {
        const uint8_t *blk = f->rows + (size_t)cell * f->rb + (size_t)(i / 32) * 20;
        uint16_t mh;
        memcpy(&mh, blk + 2, 2);
        m = tensor_f16_to_f32(mh);
    } else {
        const uint8_t *blk = f->rows + (size_t)cell * f->rb + (size_t)(i / 32) * 18;
        uint16_t dh;
        memcpy(&dh, blk, 2);
        m = -8.0 * tensor_f16_to_f32(dh);
    }
    return fmax(fmax(fabs(v), fabs(v - m)), fabs(m));
}

static void test_pv(void **state)
{
    (void)state;
    attn_path best = attn_path_best();
    base_rng rng;
    base_rng_seed(&rng, 8);
    int32_t idx[ATTN_CB];
    float p[R_MAX * ATTN_CB];
    uint8_t active[R_MAX];
    static float acc0[R_MAX][DIM_MAX], ref[R_MAX][DIM_MAX], got[R_MAX][DIM_MAX + 16];
    float *ap[R_MAX];
    int64_t checked = 0;
    for (size_t ti = 0; ti < BASE_ARRAY_LEN(k_types); ti++)
        for (size_t di = 0; di < BASE_ARRAY_LEN(k_dims); di++) {
            keel_dtype t = k_types[ti];
            int32_t dim = k_dims[di];
            if (tensor_row_bytes(t, dim) == 0) continue;
            fixture f;
            fixture_make(&f, t, dim, 100 + 10 * ti + di);
            attn_pf no_pf = {NULL, 0}, pf = {f.rows, N_CELLS * f.rb};
            for (size_t ri = 0; ri < BASE_ARRAY_LEN(k_rows); ri++)
                for (int32_t n = 1; n <= ATTN_CB; n++) {
                    int32_t R = k_rows[ri];
                    random_idx(idx, n, &rng);
                    for (int32_t r = 0; r < R; r++) {
                        /* about one row in four inactive (as attn_task leaves
                         * them: -inf scores); active rows have some p == 0 */
                        active[r] = R == 1 || base_rng_next(&rng) % 4 != 0;
                        for (int32_t j = 0; j < ATTN_CB; j++) {
                            float u = (float)(base_rng_next(&rng) % 1000) / 1000.0f;
                            p[r * ATTN_CB + j] = !active[r] ? -INFINITY : u < 0.1f ? 0.0f : u;
                        }
                        test_fill_uniform(acc0[r], dim, base_rng_next(&rng));
                    }
                    memcpy(ref, acc0, sizeof ref);
                    for (int32_t r = 0; r < R; r++)
                        ap[r] = ref[r];
                    bool prev = tensor_set_simd(false);
                    attn_pv_scalar(t, f.rows, f.rb, idx, n, p, active, R, dim, ap, no_pf);
                    tensor_set_simd(prev);
                    for (int32_t r = 0; r < R; r++)
                        for (int32_t i = 0; i < dim; i++) {
                            double d = acc0[r][i], a = fabs(acc0[r][i]);
                            if (active[r])
                                for (int32_t j = 0; j < n; j++) {
                                    double v = (double)p[r * ATTN_CB + j] *
                                               f.rows_f[(size_t)idx[j] * dim + i];
                                    d += v;
                                    a += fabs(v);
                                }
                            check_close(ref[r][i], d, 1e-5 * a + 1e-30, "pv vs double", "scalar", t,
                                        dim, R, n, r, i);
                        }
                    for (int pi = (int)ATTN_PATH_SCALAR; pi <= (int)best; pi++) {
                        tensor_simd lv;
                        attn_pv_fn pv = forced((attn_path)pi, t, t, &lv).pv;
                        for (int32_t r = 0; r < R; r++) {
                            memcpy(got[r], acc0[r], (size_t)dim * sizeof(float));
                            for (int i = 0; i < 16; i++)
                                got[r][dim + i] = 12345.0f;
                            ap[r] = got[r];
                        }
                        pv(t, f.rows, f.rb, idx, n, p, active, R, dim, ap, pf);
                        tensor_simd_force(lv);
                        for (int32_t r = 0; r < R; r++) {
                            for (int32_t i = 0; i < dim; i++) {
                                double a = fabs(acc0[r][i]);
                                if (active[r])
                                    for (int32_t j = 0; j < n; j++)
                                        a += fabs((double)p[r * ATTN_CB + j]) *
                                             pv_term_mag(t, &f, idx[j], dim, i);
                                if (!active[r] && got[r][i] != acc0[r][i])
                                    fail_msg("pv %s %s: inactive row %d changed", k_path_names[pi],
                                             keel_dtype_name(t), r);
                                check_close(got[r][i], ref[r][i], 1e-5 * a + 1e-30, "pv",
                                            k_path_names[pi], t, dim, R, n, r, i);
                                checked++;
                            }
                            for (int i = 0; i < 16; i++)
                                if (got[r][dim + i] != 12345.0f)
                                    fail_msg("pv %s %s dim %d: wrote past row %d", k_path_names[pi],
                                             keel_dtype_name(t), dim, r);
                        }
                    }
                }
            fixture_free(&f);
        }
    printf("pv: %lld accumulators checked, paths up to %s\n", (long long)checked,
           k_path_names[best]);
}

static void test_exp(void **state)
{
    (void)state;
    attn_path best = attn_path_best();
    base_rng rng;
    base_rng_seed(&rng, 9);
    float x[ATTN_CB + 8], y[ATTN_CB + 8];
    for (int pi = (int)ATTN_PATH_SCALAR; pi <= (int)best; pi++) {
        tensor_simd lv;
        attn_exp_fn ex = forced((attn_path)pi, KEEL_DTYPE_F32, KEEL_DTYPE_F32, &lv).ex;
        tensor_simd_force(lv);
        for (int trial = 0; trial < 2000; trial++) {
            int32_t n = 1 + (int32_t)(base_rng_next(&rng) % ATTN_CB);
            float m = -INFINITY;
            for (int32_t j = 0; j < ATTN_CB + 8; j++) {
                /* scores over the range softmax sees, including underflow
                 * (< -87.3) and masked cells (-inf) */
                double u = (double)(base_rng_next(&rng) % 1000000) / 1000000.0;
                x[j] = base_rng_next(&rng) % 8 == 0 ? -INFINITY : (float)(u * 120.0 - 100.0);
                if (j < n && x[j] > m) m = x[j];
            }
            if (m == -INFINITY) m = 0.0f;
            memcpy(y, x, sizeof x);
            float s = ex(y, n, m);
            double want_s = 0;
            for (int32_t j = 0; j < n; j++) {
                float w = x[j] == -INFINITY ? 0.0f : expf(x[j] - m);
                want_s += w;
                /* SIMD kernels flush results below FLT_MIN (weights under
                 * 1e-38 of the row's max) to zero */
                if (fabsf(y[j] - w) > 2e-7f * w + FLT_MIN)
                    fail_msg("exp %s: exp(%.9g - %.9g) = %.9g, want %.9g", k_path_names[pi], x[j],
                             m, y[j], w);
            }
            for (int32_t j = n; j < ATTN_CB + 8; j++)
                if (memcmp(&y[j], &x[j], sizeof(float)) != 0)
                    fail_msg("exp %s: n %d wrote x[%d]", k_path_names[pi], n, j);
            if (fabs(s - want_s) > 1e-6 * want_s)
                fail_msg("exp %s: sum %.9g, want %.9g", k_path_names[pi], s, want_s);
        }
    }
}

/* The online-softmax row step against the scalar one: masking and
 * scaling exact, the running max and alpha identical (both use expf),
 * weights within exp's 2e-7, the sum within 1e-6. */
static void test_row(void **state)
{
    (void)state;
    attn_path best = attn_path_best();
    base_rng rng;
    base_rng_seed(&rng, 10);
    float s0[ATTN_CB + 8], ref[ATTN_CB + 8], got[ATTN_CB + 8];
    uint8_t vis[ATTN_CB];
    for (int pi = (int)ATTN_PATH_SCALAR; pi <= (int)best; pi++) {
        tensor_simd lv;
        attn_row_fn row = forced((attn_path)pi, KEEL_DTYPE_F32, KEEL_DTYPE_F32, &lv).row;
        tensor_simd_force(lv);
        for (int trial = 0; trial < 4000; trial++) {
            int32_t n = 1 + (int32_t)(base_rng_next(&rng) % ATTN_CB);
            int dens = (int)(base_rng_next(&rng) % 4); /* 0: nothing visible */
            for (int32_t j = 0; j < ATTN_CB; j++)
                vis[j] =
                    dens > 0 && (int)(base_rng_next(&rng) % 4) < dens + 1 ? (uint8_t)1 : (uint8_t)0;
            for (int32_t j = 0; j < ATTN_CB + 8; j++)
                s0[j] = (float)((double)(base_rng_next(&rng) % 2000000) / 10000.0 - 100.0);
            float scale = trial % 3 == 0 ? 1.0f : 0.0883883476f;
            float m0 = trial % 4 == 0
                           ? -INFINITY
                           : (float)((double)(base_rng_next(&rng) % 20000) / 100.0 - 100.0);
            float l0 = m0 == -INFINITY ? 0.0f : 3.5f;
            float mr = m0, lr = l0, ar, mg = m0, lg = l0, ag;
            memcpy(ref, s0, sizeof s0);
            memcpy(got, s0, sizeof s0);
            bool on_r = attn_row_scalar(ref, n, scale, vis, &mr, &lr, &ar);
            bool on_g = row(got, n, scale, vis, &mg, &lg, &ag);
            if (on_r != on_g || mr != mg || ar != ag)
                fail_msg("row %s n %d: active %d/%d, m %.9g/%.9g, alpha %.9g/%.9g",
                         k_path_names[pi], n, on_g, on_r, mg, mr, ag, ar);
            if (fabsf(lg - lr) > 1e-6f * lr)
                fail_msg("row %s n %d: l %.9g, want %.9g", k_path_names[pi], n, lg, lr);
            for (int32_t j = 0; j < n; j++) {
                bool same = ref[j] == got[j] || fabsf(ref[j] - got[j]) <= 2e-7f * ref[j] + FLT_MIN;
                if (!on_r) same = got[j] == -INFINITY && ref[j] == -INFINITY;
                if (!same)
                    fail_msg("row %s n %d: s[%d] = %.9g, want %.9g", k_path_names[pi], n, j, got[j],
                             ref[j]);
            }
            if (memcmp(got + n, s0 + n, (size_t)(ATTN_CB + 8 - n) * sizeof(float)) != 0)
                fail_msg("row %s n %d: wrote past n", k_path_names[pi], n);
        }
    }
}

/* One fused decode case: the scalar kernels run block by block as
 * attn_task runs them (kq, softcap or scale, the row step with every cell
 * visible, alpha, pv) are the reference for every path's attn_dec_fn on
 * the same inputs (fresh or carried running state m, l, acc). Returns the
 * accumulators checked; *ran counts the kernel runs. */
static int64_t dec_case(keel_dtype kt, keel_dtype vt, const fixture *fk, const fixture *fv, int32_t dk,
                        int32_t dv, int32_t R, int32_t n, const int32_t *idx, bool carried, float softcap, base_rng *rng,
                        int64_t *ran)
{
    static float acc0[R_MAX][DIM_MAX], ref[R_MAX][DIM_MAX], got[R_MAX][DIM_MAX + 16];
    static double wbound[R_MAX][DIM_MAX];
    attn_path best = attn_path_best();
    int64_t checked = 0;
    const void *qp[R_MAX];
    for (int r = 0; r < R_MAX; r++) qp[r] = fk->q + (size_t)r * fk->qrb;
    float scale = 1.0f / sqrtf((float)dk);
    float m0[R_MAX] = {0}, l0[R_MAX] = {0};
    for (int32_t r = 0; r < R; r++) {
        m0[r] = carried ? (float)(base_rng_next(rng) % 40) - 20.0f : -INFINITY;
        l0[r] = carried ? 1.0f + (float)(base_rng_next(rng) % 100) / 10.0f : 0.0f;
        if (carried)
            test_fill_uniform(acc0[r], dv, base_rng_next(rng));
        else
            memset(acc0[r], 0, (size_t)dv * sizeof(float));
    }
    /* reference: the scalar kernels, block by block */
    float mr[R_MAX], lr[R_MAX], *ap[R_MAX];
    memcpy(mr, m0, sizeof mr);
    memcpy(lr, l0, sizeof lr);
    memcpy(ref, acc0, sizeof ref);
    memset(wbound, 0, sizeof wbound);
    for (int32_t r = 0; r < R; r++) ap[r] = ref[r];
    attn_pf no_pf = {NULL, 0};
    uint8_t vis[ATTN_CB], act[R_MAX];
    memset(vis, 1, sizeof vis);
    float sc[R_MAX * ATTN_CB];
    bool prev = tensor_set_simd(false);
    for (int32_t sb = 0; sb < n; sb += ATTN_CB) {
        int32_t nb = BASE_MIN(ATTN_CB, n - sb);
        attn_kq_scalar(kt, fk->rows, fk->rb, idx + sb, nb, qp, R, dk, sc, no_pf);
        for (int32_t r = 0; r < R; r++) {
            float *s = sc + r * ATTN_CB, sc_scale = scale, alpha;
            if (softcap > 0.0f) {
                for (int32_t j = 0; j < nb; j++) s[j] = softcap * tanhf(s[j] * scale / softcap);
                sc_scale = 1.0f;
            }
            act[r] = attn_row_scalar(s, nb, sc_scale, vis, &mr[r], &lr[r], &alpha);
            if (act[r] && alpha != 1.0f)
                for (int32_t i = 0; i < dv; i++) {
                    ref[r][i] *= alpha;
                    wbound[r][i] *= alpha;
                }
            /* the AVX-512 kernel's p . V rounds the weights w = p * d_v of
             * a row, V block and block of cells to 15 bits against their
             * largest |w|: at most wmax / 65534 each, times |v| */
            if (act[r] && vt == KEEL_DTYPE_Q8_0)
                for (int32_t b = 0; b < dv / 32; b++) {
                    double wmax = 0;
                    for (int32_t j = 0; j < nb; j++) {
                        uint16_t dh;
                        memcpy(&dh, fv->rows + (size_t)idx[sb + j] * fv->rb + (size_t)b * 34, 2);
                        wmax = fmax(wmax, fabs((double)s[j] * tensor_f16_to_f32(dh)));
                    }
                    for (int32_t j = 0; j < nb; j++) {
                        const uint8_t *vb = fv->rows + (size_t)idx[sb + j] * fv->rb + (size_t)b * 34;
                        const int8_t *vq = (const int8_t *)(vb + 2);
                        for (int i = 0; i < 32; i++) wbound[r][32 * b + i] += wmax / 65534.0 * abs(vq[i]);
                    }
                }
        }
        attn_pv_scalar(vt, fv->rows, fv->rb, idx + sb, nb, sc, act, R, dv, ap, no_pf);
    }
    tensor_set_simd(prev);
    for (int pi = (int)ATTN_PATH_SCALAR; pi <= (int)best; pi++) {
        tensor_simd lv;
        attn_kernel_set ks = forced((attn_path)pi, kt, vt, &lv);
        ks = attn_kernels((attn_path)pi, kt, vt, dk, dv);
        if (!ks.dec) {
            tensor_simd_force(lv);
            /* the AVX2 path has one for int8 K and V up to dim 512 and for
             * f16 / f32 K and V at dims that are multiples of 16; the
             * AVX-512 path for q8_0 K and V, and for f16 / f32 K and V at
             * multiples of 64 */
            bool q8 = kt == KEEL_DTYPE_Q8_0 && vt == KEEL_DTYPE_Q8_0;
            bool fl = (kt == KEEL_DTYPE_F16 || kt == KEEL_DTYPE_F32) && (vt == KEEL_DTYPE_F16 || vt == KEEL_DTYPE_F32);
            bool want = fl ? (pi == (int)ATTN_PATH_AVX2 && dk % 8 == 0 && dv % 16 == 0) ||
                                 (pi == (int)ATTN_PATH_AVX512 && dk % 16 == 0 && dv % 64 == 0)
                           : (pi == (int)ATTN_PATH_AVX2 || (pi == (int)ATTN_PATH_AVX512 && q8)) && dk <= 512 &&
                                 dv <= 512;
            if (want)
                fail_msg("no fused decode kernel for %s/%s dims %d/%d", keel_dtype_name(kt), keel_dtype_name(vt), dk,
                         dv);
            continue;
        }
        float mg[R_MAX], lg[R_MAX], *gp[R_MAX];
        memcpy(mg, m0, sizeof mg);
        memcpy(lg, l0, sizeof lg);
        for (int32_t r = 0; r < R; r++) {
            memcpy(got[r], acc0[r], (size_t)dv * sizeof(float));
            for (int i = 0; i < 16; i++) got[r][dv + i] = 12345.0f;
            gp[r] = got[r];
        }
        /* the far prefetch runs on into "the next call": here the list's
         * second half (prefetches change no result; under ASan a cell read
         * past next.n would show) */
        attn_dec a = {fk->rows, fv->rows, fk->rb, fv->rb, idx, n, qp, R, dk, dv, scale, softcap, mg, lg, gp,
                      {fk->rows, fv->rows, idx + n / 2, n - n / 2}};
        ks.dec(kt, vt, &a);
        tensor_simd_force(lv);
        (*ran)++;
        for (int32_t r = 0; r < R; r++) {
            double amax = 0;
            for (int32_t i = 0; i < dv; i++) amax = fmax(amax, fabs(ref[r][i]));
            check_close(mg[r], mr[r], 1e-5 * fabs(mr[r]) + 1e-5, "dec m", k_path_names[pi], kt, dk, R, n, r, -1);
            check_close(lg[r], lr[r], 1e-4 * lr[r], "dec l", k_path_names[pi], kt, dk, R, n, r, -1);
            for (int32_t i = 0; i < dv; i++) {
                double wb = pi == (int)ATTN_PATH_AVX512 ? 1.001 * wbound[r][i] : 0.0;
                check_close(got[r][i], ref[r][i], 1e-4 * amax + wb + 1e-30, "dec acc", k_path_names[pi], kt, dv,
                            R, n, r, i);
                checked++;
            }
            for (int i = 0; i < 16; i++)
                if (got[r][dv + i] != 12345.0f) fail_msg("dec %s: wrote past row %d", k_path_names[pi], r);
        }
    }
    return checked;
}

/* dec_case over one K / V dtype pair and widths: fixtures from seed (V
 * from seed + 100), every row count and cell list, each with fresh and
 * carried running state, softcap off and on. */
static void dec_pair(keel_dtype kt, keel_dtype vt, int32_t dk, int32_t dv, uint64_t seed, const int32_t *rows,
                     size_t n_rows, const int32_t *cells, size_t n_cells, base_rng *rng, int64_t *checked,
                     int64_t *ran)
{
    fixture fk, fv;
    fixture_make(&fk, kt, dk, seed);
    fixture_make(&fv, vt, dv, seed + 100);
    for (size_t ri = 0; ri < n_rows; ri++)
        for (size_t ci = 0; ci < n_cells; ci++)
            for (int variant = 0; variant < 4; variant++) {
                int32_t idx[128];
                for (int32_t j = 0; j < cells[ci]; j++) idx[j] = (int32_t)(base_rng_next(rng) % N_CELLS);
                *checked += dec_case(kt, vt, &fk, &fv, dk, dv, rows[ri], cells[ci], idx, variant & 1,
                                     variant & 2 ? 30.0f : 0.0f, rng, ran);
            }
    fixture_free(&fk);
    fixture_free(&fv);
}

/* The fused decode kernel (attn_dec_fn) against the scalar kernels
 * (dec_case): q8_0 / q4_0 K and V (also mixed), dims 32..512 (and 576: no
 * kernel); f16 / f32 K and V (also mixed), dims 16..576 (72: no kernel), R from 1 to 12 (quads and their tails), cell lists of 1..100
 * (blocks and a short last block), fresh and carried running state (m, l,
 * acc: the rescaling), softcap on and off. The AVX-512 kernel (q8_0 K and
 * V) scores 16 cells per vector, the AVX2 one 8: the lists of 1, 5, 7, 12,
 * 20, 31, 33 and 100 cells end in part-filled tiles (a block's first,
 * second, third or fourth tile). */
static void test_dec(void **state)
{
    (void)state;
    static const keel_dtype kv[][2] = {{KEEL_DTYPE_Q8_0, KEEL_DTYPE_Q8_0}, {KEEL_DTYPE_Q4_0, KEEL_DTYPE_Q4_0},
                                       {KEEL_DTYPE_Q8_0, KEEL_DTYPE_Q4_0}, {KEEL_DTYPE_Q4_0, KEEL_DTYPE_Q8_0},
                                       {KEEL_DTYPE_F16, KEEL_DTYPE_F16},   {KEEL_DTYPE_F32, KEEL_DTYPE_F32},
                                       {KEEL_DTYPE_F16, KEEL_DTYPE_F32},   {KEEL_DTYPE_F32, KEEL_DTYPE_F16}};
    static const int32_t dims[] = {32, 64, 96, 128, 512, 576};
    /* f16 / f32: 72 is a multiple of 8 but not of 16 (no fused kernel) */
    static const int32_t dims_f[] = {16, 64, 72, 80, 128, 576};
    _Static_assert(sizeof dims_f == sizeof dims, "one float dim per int8 dim");
    static const int32_t rows[] = {1, 2, 3, 4, 5, 8, 12};
    static const int32_t cells_q8[] = {1, 5, 7, 12, 20, 31, 32, 33, 64, 100};
    static const int32_t cells_q4[] = {1, 7, 32, 33, 64, 100};
    base_rng rng;
    base_rng_seed(&rng, 11);
    int64_t checked = 0, ran = 0;
    for (size_t ki = 0; ki < BASE_ARRAY_LEN(kv); ki++)
        for (size_t di = 0; di < BASE_ARRAY_LEN(dims); di++) {
            keel_dtype kt = kv[ki][0], vt = kv[ki][1];
            bool fl = kt == KEEL_DTYPE_F16 || kt == KEEL_DTYPE_F32;
            /* q8_0 K and V, and f16 / f32 (three or four cells a step): every tail */
            bool q8 = (kt == KEEL_DTYPE_Q8_0 && vt == KEEL_DTYPE_Q8_0) || fl;
            const int32_t *cells = q8 ? cells_q8 : cells_q4;
            size_t n_cells = q8 ? BASE_ARRAY_LEN(cells_q8) : BASE_ARRAY_LEN(cells_q4);
            int32_t dim = fl ? dims_f[di] : dims[di];
            dec_pair(kt, vt, dim, dim, 300 + 10 * ki + di, rows, BASE_ARRAY_LEN(rows), cells, n_cells, &rng, &checked,
                     &ran);
        }
    printf("dec: %lld runs, %lld accumulators checked, paths up to %s\n", (long long)ran,
           (long long)checked, k_path_names[attn_path_best()]);
}

/* The fused decode kernels with K and V of different widths (dk != dv, as
 * DeepSeek's latent attention: 192 / 128, 576 / 512), each dtype pair that
 * has a kernel, against the scalar kernels (dec_pair: fresh and carried
 * state, softcap off and on). */
static void test_dec_dims(void **state)
{
    (void)state;
    static const keel_dtype kv[][2] = {{KEEL_DTYPE_Q8_0, KEEL_DTYPE_Q8_0}, {KEEL_DTYPE_Q4_0, KEEL_DTYPE_Q8_0},
                                       {KEEL_DTYPE_F16, KEEL_DTYPE_F16},   {KEEL_DTYPE_F32, KEEL_DTYPE_F16}};
    static const int32_t dkv[][2] = {{192, 128}, {576, 512}, {64, 128}, {96, 64}};
    static const int32_t rows[] = {1, 3, 4, 8};
    static const int32_t cells[] = {7, 32, 45, 100};
    base_rng rng;
    base_rng_seed(&rng, 19);
    int64_t checked = 0, ran = 0;
    for (size_t ki = 0; ki < BASE_ARRAY_LEN(kv); ki++)
        for (size_t di = 0; di < BASE_ARRAY_LEN(dkv); di++)
            dec_pair(kv[ki][0], kv[ki][1], dkv[di][0], dkv[di][1], 700 + 10 * ki + di, rows, BASE_ARRAY_LEN(rows),
                     cells, BASE_ARRAY_LEN(cells), &rng, &checked, &ran);
    printf("dec dims: %lld runs, %lld accumulators checked\n", (long long)ran, (long long)checked);
}

/* The int8 dots at their extremes: q8_0 keys whose bytes are -128, -127,
 * 127 or 0 (keel's quantizer stores [-127, 127]; a loaded file may hold
 * -128) against queries of +-127, 126 and 0 (keel's query quantizer clamps
 * to [-127, 127]). Adjacent pairs of such products reach 2 * 128 * 127 in
 * magnitude: a kernel whose vpmaddubsw pairs saturate (e.g. keys biased to
 * u8 with the query as the signed operand, whose pairs reach 2 * 255 *
 * 127) gives wrong scores here, far outside the tolerance. The scales are
 * small so that the scores stay in a range where every cell counts. */
static void test_dec_extremes(void **state)
{
    (void)state;
    static const int8_t kvals[] = {-128, -127, 127, 0, 127, -128};
    static const int8_t qvals[] = {127, -127, 127, 126, -127, 0};
    static const int32_t dims[] = {32, 128, 256};
    static const int32_t rows[] = {1, 3, 4, 8};
    static const int32_t cells[] = {9, 32, 45};
    base_rng rng;
    base_rng_seed(&rng, 23);
    int64_t checked = 0, ran = 0;
    for (size_t di = 0; di < BASE_ARRAY_LEN(dims); di++)
        for (int pattern = 0; pattern < 3; pattern++) {
            int32_t dim = dims[di], nbk = dim / 32;
            fixture fk, fv;
            fixture_make(&fk, KEEL_DTYPE_Q8_0, dim, 500 + di);
            fixture_make(&fv, KEEL_DTYPE_Q8_0, dim, 600 + di);
            /* pattern 0: every key byte and query byte at an extreme of the same
             * sign run (pairs of +-127 * 128); 1: random extremes; 2: alternating */
            for (int c = 0; c < N_CELLS; c++)
                for (int32_t b = 0; b < nbk; b++) {
                    uint8_t *kb = fk.rows + (size_t)c * fk.rb + (size_t)b * 34;
                    uint16_t d = 0x1c00 + (uint16_t)(c % 5); /* f16 ~ 0.0039 */
                    memcpy(kb, &d, 2);
                    for (int i = 0; i < 32; i++) {
                        int8_t v = pattern == 0   ? (c & 1 ? -128 : 127)
                                   : pattern == 1 ? kvals[base_rng_next(&rng) % BASE_ARRAY_LEN(kvals)]
                                                  : kvals[(i + c) % BASE_ARRAY_LEN(kvals)];
                        kb[2 + i] = (uint8_t)v;
                    }
                }
            for (int r = 0; r < R_MAX; r++)
                for (int32_t b = 0; b < nbk; b++) {
                    uint8_t *qb = fk.q + (size_t)r * fk.qrb + (size_t)b * 34;
                    uint16_t d = 0x1c00 + (uint16_t)r;
                    memcpy(qb, &d, 2);
                    for (int i = 0; i < 32; i++) {
                        int8_t v = pattern == 0   ? (r & 1 ? -127 : 127)
                                   : pattern == 1 ? qvals[base_rng_next(&rng) % BASE_ARRAY_LEN(qvals)]
                                                  : qvals[(i + r) % BASE_ARRAY_LEN(qvals)];
                        qb[2 + i] = (uint8_t)v;
                    }
                }
            for (size_t ri = 0; ri < BASE_ARRAY_LEN(rows); ri++)
                for (size_t ci = 0; ci < BASE_ARRAY_LEN(cells); ci++) {
                    int32_t idx[64], n = cells[ci];
                    for (int32_t j = 0; j < n; j++) idx[j] = (int32_t)(base_rng_next(&rng) % N_CELLS);
                    checked += dec_case(KEEL_DTYPE_Q8_0, KEEL_DTYPE_Q8_0, &fk, &fv, dim, dim, rows[ri], n, idx, ci & 1,
                                        0.0f, &rng, &ran);
                }
            fixture_free(&fk);
            fixture_free(&fv);
        }
    printf("dec extremes: %lld runs, %lld accumulators checked\n", (long long)ran, (long long)checked);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kq),
        cmocka_unit_test(test_pv),
        cmocka_unit_test(test_exp),
        cmocka_unit_test(test_row),
        cmocka_unit_test(test_dec),
        cmocka_unit_test(test_dec_dims),
        cmocka_unit_test(test_dec_extremes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
