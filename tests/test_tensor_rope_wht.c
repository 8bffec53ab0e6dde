/*
 * test_tensor_rope_wht.c — src/tensor RoPE (rates with scaling and YaRN
 * against an independent reference, rotation against double precision,
 * position-edit composition up to 2^24) and the Walsh-Hadamard transform
 * (against the O(n^2) definition, involution, norm, signs, scalar/SIMD
 * identity), on unaligned buffers.
 */
#include "testutil.h"
#include "tensor/tensor.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool simd_available(void)
{
    bool prev = tensor_set_simd(true);
    bool on = tensor_simd_active();
    tensor_set_simd(prev);
    return on;
}

/* ---- WHT ------------------------------------------------------------------------------ */

static int popcount64(uint64_t v)
{
    return __builtin_popcountll(v);
}

/* y = H x / sqrt(n) by definition: H[i][j] = (-1)^popcount(i & j). */
static void wht_ref(const float *x, double *y, int64_t n)
{
    double s = 1.0 / sqrt((double)n);
    for (int64_t i = 0; i < n; i++) {
        double acc = 0;
        for (int64_t j = 0; j < n; j++)
            acc += (popcount64((uint64_t)(i & j)) & 1) ? -x[j] : x[j];
        y[i] = acc * s;
    }
}

static double max_abs(const float *x, int64_t n)
{
    double m = 0;
    for (int64_t i = 0; i < n; i++)
        m = fmax(m, fabs(x[i]));
    return m;
}

static void test_wht_definition(void **state)
{
    (void)state;
    float *buf = malloc((4096 + 8) * sizeof(float));
    double *ref = malloc(4096 * sizeof(double));
    for (int64_t n = 2; n <= 4096; n *= 2) {
        for (int simd = 0; simd <= 1; simd++) {
            bool prev = tensor_set_simd(simd);
            float *x = buf + 1 + (n % 3); /* unaligned by 1..3 floats */
            test_fill_normal(x, n, (uint64_t)n);
            if (n <= 1024) wht_ref(x, ref, n);
            double nx = 0;
            for (int64_t i = 0; i < n; i++)
                nx += (double)x[i] * x[i];
            tensor_wht(x, n);
            double ny = 0;
            for (int64_t i = 0; i < n; i++)
                ny += (double)x[i] * x[i];
            /* orthonormal: norm preserved to 1e-6 relative */
            assert_close(sqrt(ny), sqrt(nx), 1e-6 * sqrt(nx));
            if (n <= 1024) {
                double tol = 1e-6 * sqrt(nx);
                for (int64_t i = 0; i < n; i++)
                    if (!(fabs(x[i] - ref[i]) <= tol))
                        fail_msg("wht n=%lld simd=%d [%lld] %.9g want %.9g", (long long)n, simd,
                                 (long long)i, x[i], ref[i]);
            }
            tensor_set_simd(prev);
        }
    }
    free(buf);
    free(ref);
}

static void test_wht_involution_and_signs(void **state)
{
    (void)state;
    float *x = malloc((4096 + 4) * sizeof(float)), *x0 = malloc(4096 * sizeof(float));
    float *sg = malloc((4096 + 4) * sizeof(float)), *t = malloc(4096 * sizeof(float));
    for (int64_t n = 2; n <= 4096; n *= 2) {
        for (int simd = 0; simd <= 1; simd++) {
            bool prev = tensor_set_simd(simd);
            float *xp = x + (n % 4), *sp = sg + 3 - (n % 4);
            test_fill_normal(x0, n, 77 + (uint64_t)n);
            tensor_wht_signs(1234 + (uint64_t)n, n, sp);
            double tol = 1e-6 * max_abs(x0, n) * 4;
            /* wht(wht(x)) == x */
            memcpy(xp, x0, n * sizeof(float));
            tensor_wht(xp, n);
            tensor_wht(xp, n);
            for (int64_t i = 0; i < n; i++)
                assert_close(xp[i], x0[i], tol);
            /* forward = H (D x), inverse = D (H x), inverse(forward(x)) == x */
            memcpy(xp, x0, n * sizeof(float));
            tensor_wht_forward(xp, n, sp);
            for (int64_t i = 0; i < n; i++)
                t[i] = x0[i] * sp[i];
            tensor_wht(t, n);
            assert_memory_equal(xp, t, n * sizeof(float));
            tensor_wht_inverse(xp, n, sp);
            for (int64_t i = 0; i < n; i++)
                assert_close(xp[i], x0[i], tol);
            memcpy(t, x0, n * sizeof(float));
            tensor_wht(t, n);
            for (int64_t i = 0; i < n; i++)
                t[i] *= sp[i];
            memcpy(xp, x0, n * sizeof(float));
            tensor_wht_inverse(xp, n, sp);
            assert_memory_equal(xp, t, n * sizeof(float));
            /* NULL signs are the identity */
            memcpy(xp, x0, n * sizeof(float));
            memcpy(t, x0, n * sizeof(float));
            tensor_wht_forward(xp, n, NULL);
            tensor_wht(t, n);
            assert_memory_equal(xp, t, n * sizeof(float));
            tensor_set_simd(prev);
        }
    }
    free(x);
    free(x0);
    free(sg);
    free(t);
}

static void test_wht_simd_identical(void **state)
{
    (void)state;
    if (!simd_available()) {
        printf("[  SKIP    ] no AVX2 on this CPU\n");
        return;
    }
    float *a = malloc((4096 + 4) * sizeof(float)), *b = malloc((4096 + 4) * sizeof(float));
    float *sg = malloc(4096 * sizeof(float));
    for (int64_t n = 2; n <= 4096; n *= 2) {
        float *xa = a + 1, *xb = b + 2;
        test_fill_normal(xa, n, 5 + (uint64_t)n);
        memcpy(xb, xa, n * sizeof(float));
        tensor_wht_signs(99, n, sg);
        tensor_set_simd(false);
        tensor_wht_forward(xa, n, sg);
        tensor_set_simd(true);
        tensor_wht_forward(xb, n, sg);
        assert_memory_equal(xa, xb, n * sizeof(float)); /* same adds in the same order */
        tensor_set_simd(false);
        tensor_wht_inverse(xa, n, sg);
        tensor_set_simd(true);
        tensor_wht_inverse(xb, n, sg);
        assert_memory_equal(xa, xb, n * sizeof(float));
    }
    free(a);
    free(b);
    free(sg);
}

static void test_wht_signs_format(void **state)
{
    (void)state;
    float s[4096], s2[64];
    tensor_wht_signs(42, 4096, s);
    tensor_wht_signs(42, 64, s2);
    assert_memory_equal(s, s2, sizeof s2); /* a pure function of (seed, i) */
    int neg = 0;
    for (int i = 0; i < 4096; i++) {
        assert_true(s[i] == 1.0f || s[i] == -1.0f);
        neg += s[i] < 0;
        /* the documented definition (a stored format: must never change) */
        uint64_t z = 42 + (uint64_t)(i + 1) * 0x9e3779b97f4a7c15ull;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        assert_true(s[i] == ((z >> 63) ? -1.0f : 1.0f));
    }
    assert_in_range(neg, 1900, 2196);
    tensor_wht_signs(43, 64, s2);
    assert_true(memcmp(s, s2, sizeof s2) != 0);
    /* bad sizes are ignored, not crashes */
    float y[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y0[8];
    memcpy(y0, y, sizeof y);
    tensor_wht(y, 6);
    tensor_wht(y, 1);
    tensor_wht(y, 8192);
    assert_memory_equal(y, y0, sizeof y);
}

/* ---- RoPE ------------------------------------------------------------------------------ */

/* Rates by the ggml/llama.cpp definitions, written independently. */
static void rates_ref(const keel_rope *r, double *rate, double *mscale)
{
    int half = r->n_rot / 2;
    double lo = 0, hi = 0;
    if (r->ext_factor != 0.0f) {
        /* corr dims in f32, as ggml_rope_yarn_corr_dims */
        float a = (float)r->n_rot *
                  logf((float)r->n_ctx_orig / (r->beta_fast * 2.0f * (float)M_PI)) /
                  (2.0f * logf(r->freq_base));
        float b = (float)r->n_rot *
                  logf((float)r->n_ctx_orig / (r->beta_slow * 2.0f * (float)M_PI)) /
                  (2.0f * logf(r->freq_base));
        lo = fmax(0.0, floorf(a));
        hi = fmin((double)r->n_rot - 1, ceilf(b));
    }
    for (int i = 0; i < half; i++) {
        double ext = pow((double)r->freq_base, -2.0 * i / r->n_rot);
        if (r->freq_factors) ext /= r->freq_factors[i];
        double interp = ext * r->freq_scale, theta = interp;
        if (r->ext_factor != 0.0f) {
            double y = (i - lo) / fmax(0.001, hi - lo);
            double ramp = 1.0 - fmin(1.0, fmax(0.0, y));
            double mix = ramp * r->ext_factor;
            theta = interp * (1 - mix) + ext * mix;
        }
        rate[i] = theta;
    }
    *mscale = r->attn_factor;
    if (r->ext_factor != 0.0f) *mscale *= 1.0 + 0.1 * log(1.0 / r->freq_scale);
}

/* freq_factors for up to 128 pairs: a few long-wavelength dims divided */
static float k_ff[128];

static const float *ff_table(void)
{
    for (int i = 0; i < 128; i++)
        k_ff[i] = i < 8 ? 1.0f + 0.5f * (float)i : i % 7 == 0 ? 4.0f : 1.0f;
    return k_ff;
}

/* Parameter sets: plain, linear scaling, YaRN, freq_factors, NEOX. */
static keel_rope rope_case(int k, int n_rot)
{
    keel_rope r = keel_rope_default();
    r.n_rot = n_rot;
    r.type = (k & 1) ? KEEL_ROPE_NEOX : KEEL_ROPE_NORM;
    switch (k / 2) {
    case 0:
        break;
    case 1:
        r.freq_scale = 0.25f;
        r.freq_base = 500000.0f;
        break;
    case 2:
        r.freq_scale = 0.125f;
        r.ext_factor = 1.0f;
        r.attn_factor = 1.0f;
        r.beta_fast = 32.0f;
        r.beta_slow = 1.0f;
        r.n_ctx_orig = 4096;
        r.freq_base = 1000000.0f;
        break;
    case 3:
        r.freq_factors = ff_table();
        r.freq_base = 500000.0f;
        break;
    default:
        break;
    }
    return r;
}

static void test_rope_rates(void **state)
{
    (void)state;
    keel_rope r = keel_rope_default();
    assert_int_equal(r.type, KEEL_ROPE_NORM);
    assert_true(r.freq_base == 10000.0f && r.freq_scale == 1.0f && r.attn_factor == 1.0f);
    assert_true(r.ext_factor == 0.0f && r.freq_factors == NULL);
    double rate[64], ref[64], ms_ref;
    float ms;
    assert_status(tensor_rope_rates(&r, rate, &ms), KEEL_EINVAL); /* n_rot unset */
    r.n_rot = 7;
    assert_status(tensor_rope_rates(&r, rate, &ms), KEEL_EINVAL);
    for (int k = 0; k < 8; k++) {
        r = rope_case(k, 64);
        assert_ok(tensor_rope_rates(&r, rate, &ms));
        rates_ref(&r, ref, &ms_ref);
        for (int i = 0; i < 32; i++)
            assert_close(rate[i], ref[i], 1e-12 * ref[i]);
        assert_close(ms, ms_ref, 1e-6);
    }
    /* YaRN: low dims extrapolate (rate = theta), high dims interpolate */
    r = rope_case(4, 64);
    assert_ok(tensor_rope_rates(&r, rate, &ms));
    assert_close(rate[0], 1.0, 1e-12);
    assert_close(rate[31], pow(1e6, -62.0 / 64) * 0.125, 1e-15);
    assert_close(ms, 1.0 + 0.1 * log(8.0), 1e-6);
    r.n_ctx_orig = 0;
    assert_status(tensor_rope_rates(&r, rate, &ms), KEEL_EINVAL);
    r = rope_case(0, 64);
    r.freq_scale = 0.0f;
    assert_status(tensor_rope_rates(&r, rate, &ms), KEEL_EINVAL);
}

/* Rotates by the definition in double precision. */
static void rope_ref(const keel_rope *r, const float *x, double *y, int64_t n_heads,
                     int64_t head_dim, double pos, bool magnitude)
{
    double rate[512], ms;
    rates_ref(r, rate, &ms);
    if (!magnitude) ms = 1.0;
    int half = r->n_rot / 2;
    for (int64_t h = 0; h < n_heads; h++) {
        const float *xh = x + h * head_dim;
        double *yh = y + h * head_dim;
        for (int64_t i = 0; i < head_dim; i++)
            yh[i] = xh[i];
        for (int i = 0; i < half; i++) {
            int i0 = r->type == KEEL_ROPE_NEOX ? i : 2 * i;
            int i1 = r->type == KEEL_ROPE_NEOX ? i + half : 2 * i + 1;
            double a = pos * rate[i], c = cos(a) * ms, s = sin(a) * ms;
            yh[i0] = xh[i0] * c - xh[i1] * s;
            yh[i1] = xh[i0] * s + xh[i1] * c;
        }
    }
}

static void test_rope_vs_reference(void **state)
{
    (void)state;
    const int64_t n_heads = 3, head_dim = 80;
    const int rots[] = {64, 80, 6, 34};
    const int64_t positions[] = {0, 1, 17, 4095, 1 << 20, (1 << 24) - 1, -5};
    float *buf = malloc((n_heads * head_dim + 4) * sizeof(float));
    double *ref = malloc(n_heads * head_dim * sizeof(double));
    for (int simd = 0; simd <= 1; simd++) {
        bool prev = tensor_set_simd(simd);
        for (size_t ri = 0; ri < BASE_ARRAY_LEN(rots); ri++) {
            for (int k = 0; k < 8; k++) {
                keel_rope r = rope_case(k, rots[ri]);
                for (size_t pi = 0; pi < BASE_ARRAY_LEN(positions); pi++) {
                    float *x = buf + 1 + (pi % 3);
                    test_fill_uniform(x, n_heads * head_dim, 31 + pi + 10 * (uint64_t)k);
                    rope_ref(&r, x, ref, n_heads, head_dim, (double)positions[pi], true);
                    assert_ok(tensor_rope(&r, x, n_heads, head_dim, positions[pi]));
                    for (int64_t i = 0; i < n_heads * head_dim; i++)
                        if (!(fabs(x[i] - ref[i]) <= 2e-6))
                            fail_msg(
                                "rope simd=%d n_rot=%d case %d pos %lld [%lld]: %.9g want %.9g",
                                simd, rots[ri], k, (long long)positions[pi], (long long)i, x[i],
                                ref[i]);
                }
            }
        }
        tensor_set_simd(prev);
    }
    keel_rope r = rope_case(0, 64);
    assert_status(tensor_rope(&r, buf, 1, 32, 3), KEEL_EINVAL); /* n_rot > head_dim */
    r.type = KEEL_ROPE_NONE;
    buf[0] = 1.5f;
    assert_ok(tensor_rope(&r, buf, 1, 64, 3));
    assert_true(buf[0] == 1.5f);
    free(buf);
    free(ref);
}

static void test_rope_delta_composes(void **state)
{
    (void)state;
    const int64_t n_heads = 2, head_dim = 128;
    const int64_t as[] = {0, 3, 1000, 1 << 20, 1 << 24};
    const int64_t bs[] = {1, -3, 777, -(1 << 20), 1 << 24, -(1 << 24)};
    float *x = malloc(n_heads * head_dim * sizeof(float)),
          *y = malloc(n_heads * head_dim * sizeof(float));
    for (int simd = 0; simd <= 1; simd++) {
        bool prev = tensor_set_simd(simd);
        for (int k = 0; k < 8; k++) {
            keel_rope r = rope_case(k, k % 3 == 2 ? 96 : 128);
            r.attn_factor = k >= 4 ? 1.25f : 1.0f;
            for (size_t ai = 0; ai < BASE_ARRAY_LEN(as); ai++) {
                for (size_t bi = 0; bi < BASE_ARRAY_LEN(bs); bi++) {
                    test_fill_uniform(x, n_heads * head_dim, 7 * ai + bi);
                    memcpy(y, x, n_heads * head_dim * sizeof(float));
                    assert_ok(tensor_rope(&r, x, n_heads, head_dim, as[ai]));
                    assert_ok(tensor_rope_delta(&r, x, n_heads, head_dim, bs[bi]));
                    assert_ok(tensor_rope(&r, y, n_heads, head_dim, as[ai] + bs[bi]));
                    for (int64_t i = 0; i < n_heads * head_dim; i++)
                        if (!(fabs(x[i] - y[i]) <= 1e-5))
                            fail_msg("case %d a %lld b %lld [%lld]: %.9g vs %.9g", k,
                                     (long long)as[ai], (long long)bs[bi], (long long)i, x[i],
                                     y[i]);
                }
            }
        }
        tensor_set_simd(prev);
    }
    free(x);
    free(y);
}

static void test_rope_apply_simd_matches(void **state)
{
    (void)state;
    if (!simd_available()) return;
    const int rots[] = {2, 6, 8, 10, 16, 34, 64, 128};
    double rate[64];
    float cs[128], ms;
    float *a = malloc((4 * 130 + 3) * sizeof(float)), *b = malloc((4 * 130 + 3) * sizeof(float));
    for (size_t ri = 0; ri < BASE_ARRAY_LEN(rots); ri++) {
        for (int k = 0; k < 2; k++) {
            keel_rope r = rope_case(k, rots[ri]);
            assert_ok(tensor_rope_rates(&r, rate, &ms));
            tensor_rope_cos_sin(rate, r.n_rot, 12345.0, ms, cs);
            float *xa = a + 1, *xb = b + 3;
            test_fill_uniform(xa, 4 * 130, ri);
            memcpy(xb, xa, 4 * 130 * sizeof(float));
            tensor_set_simd(false);
            tensor_rope_apply(r.type, r.n_rot, cs, xa, 4, 130);
            tensor_set_simd(true);
            tensor_rope_apply(r.type, r.n_rot, cs, xb, 4, 130);
            for (int i = 0; i < 4 * 130; i++)
                assert_close(xa[i], xb[i], 3e-7);
        }
    }
    free(a);
    free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wht_definition),      cmocka_unit_test(test_wht_involution_and_signs),
        cmocka_unit_test(test_wht_simd_identical),  cmocka_unit_test(test_wht_signs_format),
        cmocka_unit_test(test_rope_rates),          cmocka_unit_test(test_rope_vs_reference),
        cmocka_unit_test(test_rope_delta_composes), cmocka_unit_test(test_rope_apply_simd_matches),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
