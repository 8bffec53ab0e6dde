/*
 * test_tensor_quant.c — src/tensor formats: dtype table, f16/bf16
 * conversion (bit-exact with F16C), quantize -> dequantize error bounds,
 * scalar/SIMD byte identity, hand-built K-quant blocks, vec_dot against
 * dequantize + f32 dot, and axpy_row, on unaligned buffers.
 */
#include "testutil.h"
#include "tensor/tensor.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* ---- helpers --------------------------------------------------------------------- */

static const keel_dtype k_quant_types[] = {
    KEEL_DTYPE_F32,  KEEL_DTYPE_F16,  KEEL_DTYPE_BF16, KEEL_DTYPE_Q4_0, KEEL_DTYPE_Q4_1,
    KEEL_DTYPE_Q5_0, KEEL_DTYPE_Q5_1, KEEL_DTYPE_Q8_0, KEEL_DTYPE_Q8_1, KEEL_DTYPE_Q8_K,
    KEEL_DTYPE_Q4_K, KEEL_DTYPE_Q5_K, KEEL_DTYPE_Q6_K,
};

static const keel_dtype k_weight_types[] = {
    KEEL_DTYPE_F32,  KEEL_DTYPE_F16,  KEEL_DTYPE_BF16, KEEL_DTYPE_Q4_0, KEEL_DTYPE_Q4_1,
    KEEL_DTYPE_Q5_0, KEEL_DTYPE_Q5_1, KEEL_DTYPE_Q8_0, KEEL_DTYPE_Q2_K, KEEL_DTYPE_Q3_K,
    KEEL_DTYPE_Q4_K, KEEL_DTYPE_Q5_K, KEEL_DTYPE_Q6_K,
};

static bool simd_available(void)
{
    bool prev = tensor_set_simd(true);
    bool on = tensor_simd_active();
    tensor_set_simd(prev);
    return on;
}

/* A buffer of n bytes at an odd address (misalign bytes past 64-aligned). */
typedef struct ubuf {
    uint8_t *base;
    void *p;
} ubuf;

static ubuf ubuf_make(size_t n, size_t misalign)
{
    ubuf b;
    b.base = aligned_alloc(64, ((n + misalign + 64) + 63) & ~(size_t)63);
    assert_non_null(b.base);
    memset(b.base, 0xA5, n + misalign + 64);
    b.p = b.base + misalign;
    return b;
}

static void ubuf_free(ubuf *b)
{
    free(b->base);
    b->base = NULL;
}

/* Random bytes that decode to finite values for dtype t: random bytes with
 * every f16 scale field replaced by a sane value. Built by quantizing data
 * for writable types; for q2_K/q3_K by random bytes with fixed scales. */
static void make_row(keel_dtype t, int64_t n, void *row, uint64_t seed)
{
    if (t == KEEL_DTYPE_Q2_K || t == KEEL_DTYPE_Q3_K) {
        base_rng r;
        base_rng_seed(&r, seed);
        uint8_t *b = row;
        size_t bb = keel_dtype_block_bytes(t);
        for (int64_t i = 0; i < n / 256; i++, b += bb) {
            for (size_t k = 0; k < bb; k++)
                b[k] = (uint8_t)base_rng_next(&r);
            uint16_t d = tensor_f32_to_f16(0.01f + 0.01f * (float)base_rng_uniform(&r));
            uint16_t dm = tensor_f32_to_f16(0.005f * (float)base_rng_uniform(&r));
            if (t == KEEL_DTYPE_Q2_K) {
                memcpy(b + 80, &d, 2);
                memcpy(b + 82, &dm, 2);
            } else {
                memcpy(b + 108, &d, 2);
            }
        }
        return;
    }
    float *x = malloc((size_t)n * sizeof(float));
    test_fill_normal(x, n, seed);
    assert_ok(tensor_quantize_row(t, x, row, n));
    free(x);
}

/* ---- dtype table ------------------------------------------------------------------ */

static void test_dtype_table(void **state)
{
    (void)state;
    assert_string_equal(keel_dtype_name(KEEL_DTYPE_Q8_0), "q8_0");
    assert_string_equal(keel_dtype_name(KEEL_DTYPE_Q4_K), "q4_K");
    keel_dtype t;
    assert_ok(keel_dtype_from_name("Q6_k", &t));
    assert_int_equal(t, KEEL_DTYPE_Q6_K);
    assert_status(keel_dtype_from_name("q9_9", &t), KEEL_EINVAL);
    assert_int_equal(keel_dtype_block_bytes(KEEL_DTYPE_Q4_K), 144);
    assert_int_equal(tensor_row_bytes(KEEL_DTYPE_Q8_0, 64), 68);
    assert_int_equal(tensor_row_bytes(KEEL_DTYPE_Q8_0, 33), 0);
    assert_true(keel_dtype_can_quantize(KEEL_DTYPE_Q4_K));
    assert_true(keel_dtype_can_quantize(KEEL_DTYPE_Q6_K));
    assert_false(keel_dtype_can_quantize(KEEL_DTYPE_Q2_K));
    assert_int_equal(tensor_vec_dot_type(KEEL_DTYPE_Q4_0), KEEL_DTYPE_Q8_0);
    assert_int_equal(tensor_vec_dot_type(KEEL_DTYPE_Q5_1), KEEL_DTYPE_Q8_1);
    assert_int_equal(tensor_vec_dot_type(KEEL_DTYPE_Q3_K), KEEL_DTYPE_Q8_K);
    assert_int_equal(tensor_vec_dot_type(KEEL_DTYPE_BF16), KEEL_DTYPE_F32);
    float x[32] = {0};
    uint8_t y[64];
    assert_status(tensor_quantize_row(KEEL_DTYPE_Q2_K, x, y, 256), KEEL_EUNSUPPORTED);
    assert_status(tensor_quantize_row(KEEL_DTYPE_Q8_0, x, y, 31), KEEL_EINVAL);
    assert_status(tensor_quantize_row(KEEL_DTYPE_I32, x, y, 32), KEEL_EUNSUPPORTED);
    assert_status(tensor_quantize_row((keel_dtype)5, x, y, 32), KEEL_EINVAL);
    assert_status(tensor_dequantize_row(KEEL_DTYPE_Q8_0, y, x, 30), KEEL_EINVAL);
    assert_status(tensor_dequantize_row(KEEL_DTYPE_I8, y, x, 32), KEEL_EUNSUPPORTED);
    const tensor_cpu *c = tensor_cpu_features();
    assert_non_null(c);
    bool prev = tensor_set_simd(false);
    assert_string_equal(tensor_simd_name(), "scalar");
    assert_false(tensor_simd_active());
    tensor_set_simd(prev);
    /* the best path the CPU has, unless KEEL_SIMD forced another */
    const char *forced = getenv("KEEL_SIMD");
    if (c->avx2 && c->fma && c->f16c && c->bmi2 && !(forced && *forced))
        assert_string_equal(tensor_simd_name(),
                            c->avx512f && c->avx512bw && c->avx512vl && c->avx512vnni ? "avx512"
                                                                                       : "avx2");
}

/* ---- half precision ------------------------------------------------------------------ */

#if defined(__x86_64__)
__attribute__((target("f16c"))) static uint16_t f16c_from_f32(float f)
{
    return (uint16_t)_cvtss_sh(f, 0);
}
__attribute__((target("f16c"))) static float f16c_to_f32(uint16_t h)
{
    return _cvtsh_ss(h);
}
#endif

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static void test_half_exact(void **state)
{
    (void)state;
    /* known values */
    assert_int_equal(tensor_f32_to_f16(1.0f), 0x3C00);
    assert_int_equal(tensor_f32_to_f16(-2.0f), 0xC000);
    assert_int_equal(tensor_f32_to_f16(65504.0f), 0x7BFF);
    assert_int_equal(tensor_f32_to_f16(65520.0f), 0x7C00); /* tie -> even -> inf */
    assert_int_equal(tensor_f32_to_f16(65519.996f), 0x7BFF);
    assert_int_equal(tensor_f32_to_f16(5.9604645e-8f), 0x0001);         /* 2^-24 */
    assert_int_equal(tensor_f32_to_f16(2.9802322e-8f), 0x0000);         /* 2^-25: tie -> 0 */
    assert_int_equal(tensor_f32_to_f16(1.0f + 1.0f / 2048.0f), 0x3C00); /* tie -> even */
    assert_int_equal(tensor_f32_to_f16(1.0f + 3.0f / 2048.0f), 0x3C02);
    assert_true(tensor_f16_to_f32(0x7C00) == INFINITY);
    assert_true(isnan(tensor_f16_to_f32(0x7E00)));
    assert_true(tensor_f16_to_f32(0x0001) == 5.9604644775390625e-8f);
    assert_int_equal(tensor_f32_to_bf16(1.0f), 0x3F80);
    assert_int_equal(tensor_f32_to_bf16(bits_f32(0x3F808000)), 0x3F80); /* tie -> even */
    assert_int_equal(tensor_f32_to_bf16(bits_f32(0x3F818000)), 0x3F82);
    assert_true(isnan(tensor_bf16_to_f32(tensor_f32_to_bf16(NAN))));
    /* every f16 round-trips through f32 exactly (NaNs stay NaN) */
    for (uint32_t h = 0; h < 65536; h++) {
        float f = tensor_f16_to_f32((uint16_t)h);
        if (isnan(f)) continue;
        assert_int_equal(tensor_f32_to_f16(f), h);
    }
#if defined(__x86_64__)
    if (!tensor_cpu_features()->f16c) return;
    for (uint32_t h = 0; h < 65536; h++) {
        float a = tensor_f16_to_f32((uint16_t)h), b = f16c_to_f32((uint16_t)h);
        assert_int_equal(f32_bits(a), f32_bits(b));
        /* f32 values at and around the rounding boundaries of h */
        uint32_t u = f32_bits(b);
        for (int k = -2; k <= 2; k++) {
            uint32_t v = u + (uint32_t)(k * 4096); /* half an f16 ulp steps (normal range) */
            for (int e = -1; e <= 1; e++) {
                float f = bits_f32(v + (uint32_t)e);
                assert_int_equal(tensor_f32_to_f16(f), f16c_from_f32(f));
            }
        }
    }
    for (uint64_t u = 0; u < (1ull << 32); u += 4099) {
        float f = bits_f32((uint32_t)u);
        assert_int_equal(tensor_f32_to_f16(f), f16c_from_f32(f));
    }
#endif
}

/* ---- quantize -> dequantize error -------------------------------------------------- */

/* Max |x - dequant(quant(x))| allowed for one block (stated per format). */
static double block_bound(keel_dtype t, const float *x, int64_t bs)
{
    double amax = 0, mn = x[0], mx = x[0];
    for (int64_t i = 0; i < bs; i++) {
        amax = fmax(amax, fabs(x[i]));
        mn = fmin(mn, x[i]);
        mx = fmax(mx, x[i]);
    }
    double eps = 1e-6 * amax;
    switch (t) {
    case KEEL_DTYPE_F32:
        return 0;
    case KEEL_DTYPE_F16:
        return amax * 0x1p-11 + 1e-7;
    case KEEL_DTYPE_BF16:
        return amax * 0x1p-8;
    /* half a step of the stored (f16-rounded) scale amax/127 */
    case KEEL_DTYPE_Q8_0:
    case KEEL_DTYPE_Q8_1:
        return amax / 254.0 * 1.002 + eps;
    case KEEL_DTYPE_Q8_K:
        return amax / 254.0 * 1.0001 + eps;
    /* one step |d| = amax/8 (the side opposite the max clamps at 7) */
    case KEEL_DTYPE_Q4_0:
        return amax / 8.0 * 1.002 + eps;
    case KEEL_DTYPE_Q5_0:
        return amax / 16.0 * 1.002 + eps;
    /* half a step (max-min)/15, plus the f16 rounding of the min */
    case KEEL_DTYPE_Q4_1:
        return (mx - mn) / 30.0 * 1.002 + fabs(mn) * 0x1p-11 * 1.01 + eps;
    case KEEL_DTYPE_Q5_1:
        return (mx - mn) / 62.0 * 1.002 + fabs(mn) * 0x1p-11 * 1.01 + eps;
    default:
        return INFINITY; /* K-quants: rmse bound below */
    }
}

/* RMS error relative to the data's RMS on N(0,1) data (K-quants and all). */
static double rmse_bound(keel_dtype t)
{
    /* measured: f16 2.1e-4, bf16 1.7e-3, q8_0 5.4e-3, q8_K 7.0e-3, q4_0 .086,
     * q4_1 .078, q5_0 .043, q5_1 .038, q4_K .072, q5_K .036, q6_K .0173 */
    switch (t) {
    case KEEL_DTYPE_F32:
        return 0;
    case KEEL_DTYPE_F16:
        return 2.5e-4;
    case KEEL_DTYPE_BF16:
        return 2e-3;
    case KEEL_DTYPE_Q8_0:
    case KEEL_DTYPE_Q8_1:
        return 0.006;
    case KEEL_DTYPE_Q8_K:
        return 0.0078;
    case KEEL_DTYPE_Q4_0:
        return 0.095;
    case KEEL_DTYPE_Q4_1:
        return 0.087;
    case KEEL_DTYPE_Q5_0:
        return 0.047;
    case KEEL_DTYPE_Q5_1:
        return 0.042;
    case KEEL_DTYPE_Q4_K:
        return 0.08;
    case KEEL_DTYPE_Q5_K:
        return 0.04;
    case KEEL_DTYPE_Q6_K:
        return 0.02;
    default:
        return 0;
    }
}

static void check_roundtrip(keel_dtype t, const float *x, int64_t n, bool print)
{
    size_t rb = tensor_row_bytes(t, n);
    ubuf q = ubuf_make(rb, 3);
    float *y = malloc((size_t)n * sizeof(float));
    assert_ok(tensor_quantize_row(t, x, q.p, n));
    assert_ok(tensor_dequantize_row(t, q.p, y, n));
    int64_t bs = keel_dtype_block_size(t);
    double se = 0, sx = 0;
    for (int64_t b = 0; b < n; b += bs) {
        double bound = block_bound(t, x + b, bs);
        for (int64_t i = b; i < b + bs; i++) {
            double e = fabs((double)x[i] - (double)y[i]);
            if (!(e <= bound))
                fail_msg("%s: element %lld: x %.9g y %.9g err %.3g > bound %.3g",
                         keel_dtype_name(t), (long long)i, x[i], y[i], e, bound);
            se += e * e;
            sx += (double)x[i] * x[i];
        }
    }
    double rel = sqrt(se / sx);
    if (print)
        printf("    %-5s rmse/rms %.5f (bound %.4f)\n", keel_dtype_name(t), rel, rmse_bound(t));
    if (!(rel <= rmse_bound(t)))
        fail_msg("%s: relative rmse %.5f > %.5f", keel_dtype_name(t), rel, rmse_bound(t));
    free(y);
    ubuf_free(&q);
}

static void test_quant_error_bounds(void **state)
{
    (void)state;
    const int64_t n = 256 * 64;
    float *x = malloc((size_t)n * sizeof(float));
    for (int simd = 0; simd <= 1; simd++) {
        bool prev = tensor_set_simd(simd);
        for (size_t k = 0; k < BASE_ARRAY_LEN(k_quant_types); k++) {
            keel_dtype t = k_quant_types[k];
            test_fill_normal(x, n, 100 + k);
            check_roundtrip(t, x, n, simd == 1);
            /* offset data (q4_1/q5_1 min matters), a few big outliers */
            for (int64_t i = 0; i < n; i++)
                x[i] = x[i] * 0.1f + 3.0f;
            for (int64_t i = 0; i < n; i += 97)
                x[i] *= 20.0f;
            size_t rb = tensor_row_bytes(t, n);
            uint8_t *q = malloc(rb);
            float *y = malloc((size_t)n * sizeof(float));
            assert_ok(tensor_quantize_row(t, x, q, n));
            assert_ok(tensor_dequantize_row(t, q, y, n));
            int64_t bs = keel_dtype_block_size(t);
            for (int64_t b = 0; b < n; b += bs) {
                double bound = block_bound(t, x + b, bs);
                for (int64_t i = b; i < b + bs; i++)
                    if (!(fabs((double)x[i] - y[i]) <= bound))
                        fail_msg("%s offset data: err %.3g > %.3g", keel_dtype_name(t),
                                 fabs((double)x[i] - y[i]), bound);
            }
            free(q);
            free(y);
        }
        tensor_set_simd(prev);
    }
    /* all-zero and tiny blocks quantize to zeros, not NaN */
    memset(x, 0, 256 * sizeof(float));
    x[5] = 1e-30f;
    for (size_t k = 0; k < BASE_ARRAY_LEN(k_quant_types); k++) {
        keel_dtype t = k_quant_types[k];
        uint8_t q[1024];
        float y[256];
        assert_ok(tensor_quantize_row(t, x, q, 256));
        assert_ok(tensor_dequantize_row(t, q, y, 256));
        for (int i = 0; i < 256; i++)
            assert_true(fabsf(y[i] - x[i]) <= 1e-30f);
    }
    free(x);
}

static void test_quant_simd_bytes_identical(void **state)
{
    (void)state;
    if (!simd_available()) {
        printf("[  SKIP    ] no AVX2 on this CPU\n");
        return;
    }
    const int64_t n = 256 * 16;
    float *xs = malloc((size_t)(n + 8) * sizeof(float));
    for (int trial = 0; trial < 6; trial++) {
        float *x = xs + (trial % 4); /* unaligned input */
        test_fill_normal(x, n, 7 + trial);
        if (trial == 1)
            for (int64_t i = 0; i < n; i++)
                x[i] = floorf(x[i] * 4.0f) * 0.5f; /* exact ties */
        if (trial == 2)
            for (int64_t i = 0; i < n; i += 32)
                x[i] = -x[i + 1]; /* equal magnitudes */
        if (trial == 3)
            for (int64_t i = 0; i < n; i++)
                x[i] *= 1e-6f; /* tiny scales (f16 subnormal) */
        if (trial == 4)
            for (int64_t i = 0; i < n; i++)
                x[i] *= 1e6f; /* scales past f16 max */
        if (trial == 5)
            for (int64_t i = 0; i < 64; i++)
                x[i] = 0.0f; /* zero blocks, -0 */
        for (size_t k = 0; k < BASE_ARRAY_LEN(k_quant_types); k++) {
            keel_dtype t = k_quant_types[k];
            size_t rb = tensor_row_bytes(t, n);
            ubuf a = ubuf_make(rb, 1), b = ubuf_make(rb, 2);
            tensor_set_simd(false);
            assert_ok(tensor_quantize_row(t, x, a.p, n));
            tensor_set_simd(true);
            assert_ok(tensor_quantize_row(t, x, b.p, n));
            if (memcmp(a.p, b.p, rb) != 0)
                fail_msg("%s: scalar and SIMD quantize differ (trial %d)", keel_dtype_name(t),
                         trial);
            /* dequantize agrees too (FMA vs mul+add: 1 ulp) */
            float *ya = malloc((size_t)n * sizeof(float)), *yb = malloc((size_t)n * sizeof(float));
            tensor_set_simd(false);
            assert_ok(tensor_dequantize_row(t, a.p, ya, n));
            tensor_set_simd(true);
            assert_ok(tensor_dequantize_row(t, a.p, yb, n));
            for (int64_t i = 0; i < n; i++)
                if (ya[i] != yb[i]) assert_close(ya[i], yb[i], 1e-6 * fabs(ya[i]) + 1e-30);
            free(ya);
            free(yb);
            ubuf_free(&a);
            ubuf_free(&b);
        }
    }
    tensor_set_simd(true);
    free(xs);
}

/* ---- hand-built K-quant blocks ------------------------------------------------------- */

static void put_f16(uint8_t *p, float v)
{
    uint16_t h = tensor_f32_to_f16(v);
    memcpy(p, &h, 2);
}

/* The 12-byte 6-bit scale/min field of q4_K/q5_K, written from its
 * definition: j < 4 in the low 6 bits of bytes j (scale) and j+4 (min);
 * j >= 4 in the nibbles of byte j+4, top 2 bits in bytes j-4 and j. */
static void pack_k4_scales(uint8_t s[12], const int sc[8], const int m[8])
{
    memset(s, 0, 12);
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            s[j] |= (uint8_t)sc[j];
            s[j + 4] |= (uint8_t)m[j];
        } else {
            s[j + 4] = (uint8_t)((sc[j] & 15) | ((m[j] & 15) << 4));
            s[j - 4] |= (uint8_t)((sc[j] >> 4) << 6);
            s[j] |= (uint8_t)((m[j] >> 4) << 6);
        }
    }
}

static void check_deq(keel_dtype t, const uint8_t *blk, const float *want)
{
    for (int simd = 0; simd <= 1; simd++) {
        bool prev = tensor_set_simd(simd);
        float y[256];
        assert_ok(tensor_dequantize_row(t, blk, y, 256));
        for (int e = 0; e < 256; e++)
            if (!(fabsf(y[e] - want[e]) <= 1e-6f * fabsf(want[e])))
                fail_msg("%s simd=%d: element %d = %.9g, want %.9g", keel_dtype_name(t), simd, e,
                         y[e], want[e]);
        tensor_set_simd(prev);
    }
}

static void test_kquant_hand_built(void **state)
{
    (void)state;
    uint8_t blk[256];
    float want[256];
    const int sc[8] = {1, 2, 3, 4, 17, 33, 50, 63};
    const int mn[8] = {0, 5, 10, 15, 20, 40, 60, 63};

    /* q4_K: d 0.5, dmin 0.25; element e = 64c + 32h + l has q in nibble h of qs[32c + l] */
    memset(blk, 0, sizeof blk);
    put_f16(blk, 0.5f);
    put_f16(blk + 2, 0.25f);
    pack_k4_scales(blk + 4, sc, mn);
    for (int e = 0; e < 256; e++) {
        int q = (e * 7 + 3) % 16, c = e / 64, h = (e / 32) % 2, l = e % 32;
        blk[16 + 32 * c + l] |= (uint8_t)(q << (4 * h));
        want[e] = 0.5f * (float)sc[e / 32] * (float)q - 0.25f * (float)mn[e / 32];
    }
    check_deq(KEEL_DTYPE_Q4_K, blk, want);

    /* q5_K: fifth bit of element e in bit e/32 of qh[e % 32] */
    memset(blk, 0, sizeof blk);
    put_f16(blk, 0.125f);
    put_f16(blk + 2, 2.0f);
    pack_k4_scales(blk + 4, sc, mn);
    for (int e = 0; e < 256; e++) {
        int q = (e * 11 + 5) % 32, c = e / 64, h = (e / 32) % 2, l = e % 32;
        blk[48 + 32 * c + l] |= (uint8_t)((q & 15) << (4 * h));
        blk[16 + l] |= (uint8_t)((q >> 4) << (e / 32));
        want[e] = 0.125f * (float)sc[e / 32] * (float)q - 2.0f * (float)mn[e / 32];
    }
    check_deq(KEEL_DTYPE_Q5_K, blk, want);

    /* q6_K: ql[64n + (r & 63)] nibble (r >= 64), qh[32n + (r & 31)] bits 2(r/32), r = e % 128 */
    memset(blk, 0, sizeof blk);
    put_f16(blk + 208, 0.25f);
    for (int g = 0; g < 16; g++)
        blk[192 + g] = (uint8_t)(int8_t)(g * 9 - 70);
    for (int e = 0; e < 256; e++) {
        int q = (e * 5 + 1) % 64, nh = e / 128, r = e % 128;
        blk[64 * nh + (r & 63)] |= (uint8_t)((q & 15) << (r >= 64 ? 4 : 0));
        blk[128 + 32 * nh + (r & 31)] |= (uint8_t)((q >> 4) << (2 * (r / 32)));
        want[e] = 0.25f * (float)(int8_t)blk[192 + e / 16] * (float)(q - 32);
    }
    check_deq(KEEL_DTYPE_Q6_K, blk, want);

    /* q2_K: scales[e/16] = scale | min << 4; q in bits 2j of qs[32n + l], e = 128n + 32j + l */
    memset(blk, 0, sizeof blk);
    put_f16(blk + 80, 0.5f);
    put_f16(blk + 82, 0.125f);
    for (int g = 0; g < 16; g++)
        blk[g] = (uint8_t)((g % 16) | (((g * 3) % 16) << 4));
    for (int e = 0; e < 256; e++) {
        int q = (e * 3 + 1) % 4, nh = e / 128, j = (e % 128) / 32, l = e % 32;
        blk[16 + 32 * nh + l] |= (uint8_t)(q << (2 * j));
        want[e] = 0.5f * (float)(e / 16 % 16) * (float)q - 0.125f * (float)((e / 16 * 3) % 16);
    }
    check_deq(KEEL_DTYPE_Q2_K, blk, want);

    /* q3_K: 16 six-bit scales (biased by 32): low nibbles in bytes 0..7
     * (scale k low, scale k+8 high), top bits in bytes 8..11 (byte 8+i:
     * scales i, i+4, i+8, i+12 at bits 0, 2, 4, 6); q = 2 bits of
     * qs[32n + l] at 2j, minus 4 unless hmask[l] bit 4n+j is set. */
    memset(blk, 0, sizeof blk);
    put_f16(blk + 108, 0.5f);
    int s3[16];
    for (int g = 0; g < 16; g++)
        s3[g] = (g * 13 + 7) % 64;
    for (int g = 0; g < 16; g++) {
        blk[96 + (g % 8)] |= (uint8_t)((s3[g] & 15) << (g < 8 ? 0 : 4));
        blk[96 + 8 + (g % 4)] |= (uint8_t)((s3[g] >> 4) << (2 * (g / 4)));
    }
    for (int e = 0; e < 256; e++) {
        int q = (e * 5 + 2) % 4, hbit = (e * 7 / 3) % 2, nh = e / 128, j = (e % 128) / 32,
            l = e % 32;
        blk[32 + 32 * nh + l] |= (uint8_t)(q << (2 * j));
        blk[l] |= (uint8_t)(hbit << (4 * nh + j));
        want[e] = 0.5f * (float)(s3[e / 16] - 32) * (float)(q - (hbit ? 0 : 4));
    }
    check_deq(KEEL_DTYPE_Q3_K, blk, want);
}

/* ---- vec_dot and axpy_row ---------------------------------------------------------- */

static double dot_ref(const float *a, const float *b, int64_t n)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += (double)a[i] * b[i];
    return s;
}

static void test_vec_dot_all(void **state)
{
    (void)state;
    const int64_t sizes[] = {256, 512, 1024 + 256};
    for (size_t si = 0; si < BASE_ARRAY_LEN(sizes); si++) {
        int64_t n = sizes[si];
        float *xf = malloc((size_t)n * sizeof(float)), *wf = malloc((size_t)n * sizeof(float));
        float *xd = malloc((size_t)n * sizeof(float));
        for (size_t k = 0; k < BASE_ARRAY_LEN(k_weight_types); k++) {
            keel_dtype t = k_weight_types[k], vt = tensor_vec_dot_type(t);
            ubuf w = ubuf_make(tensor_row_bytes(t, n), 1 + k % 3);
            ubuf x = ubuf_make(tensor_row_bytes(vt, n) + 4, vt == KEEL_DTYPE_F32 ? 4 : 3);
            make_row(t, n, w.p, 1000 + k);
            test_fill_normal(xf, n, 2000 + k);
            assert_ok(tensor_quantize_row(vt, xf, x.p, n));
            assert_ok(tensor_dequantize_row(t, w.p, wf, n));
            assert_ok(tensor_dequantize_row(vt, x.p, xd, n));
            double ref = dot_ref(wf, xd, n);
            double mag = sqrt(dot_ref(wf, wf, n) * dot_ref(xd, xd, n));
            tensor_set_simd(false);
            float ds = tensor_vec_dot(t, n, w.p, x.p);
            tensor_set_simd(true);
            float dv = tensor_vec_dot(t, n, w.p, x.p);
            /* both equal the dot of the dequantized rows up to f32 summation */
            if (!(fabs(ds - ref) <= 2e-6 * mag + 1e-30))
                fail_msg("%s n=%lld scalar dot %.9g ref %.9g", keel_dtype_name(t), (long long)n, ds,
                         ref);
            if (!(fabs(dv - ref) <= 2e-6 * mag + 1e-30))
                fail_msg("%s n=%lld simd dot %.9g ref %.9g", keel_dtype_name(t), (long long)n, dv,
                         ref);
            /* and the f32 dot against the unquantized activation is close */
            double ref_x = dot_ref(wf, xf, n);
            double qtol = vt == KEEL_DTYPE_F32 ? 2e-6 : 0.02;
            assert_true(fabs(dv - ref_x) <= qtol * mag);
            ubuf_free(&w);
            ubuf_free(&x);
        }
        free(xf);
        free(wf);
        free(xd);
    }
}

static void test_axpy_row_all(void **state)
{
    (void)state;
    const int64_t n = 512;
    float *row_f = malloc(n * sizeof(float)), *y0 = malloc((n + 4) * sizeof(float));
    float *ys = malloc((n + 4) * sizeof(float)), *yv = malloc((n + 4) * sizeof(float));
    const keel_dtype types[] = {KEEL_DTYPE_F32,  KEEL_DTYPE_F16,  KEEL_DTYPE_BF16, KEEL_DTYPE_Q8_0,
                                KEEL_DTYPE_Q4_0, KEEL_DTYPE_Q4_1, KEEL_DTYPE_Q5_0, KEEL_DTYPE_Q5_1,
                                KEEL_DTYPE_Q8_1, KEEL_DTYPE_Q2_K, KEEL_DTYPE_Q3_K, KEEL_DTYPE_Q4_K,
                                KEEL_DTYPE_Q5_K, KEEL_DTYPE_Q6_K, KEEL_DTYPE_Q8_K};
    for (size_t k = 0; k < BASE_ARRAY_LEN(types); k++) {
        keel_dtype t = types[k];
        ubuf r = ubuf_make(tensor_row_bytes(t, n), t == KEEL_DTYPE_F32 ? 8 : 1 + k % 3);
        make_row(t, n, r.p, 50 + k);
        assert_ok(tensor_dequantize_row(t, r.p, row_f, n));
        int off = (int)(k % 3) + 1; /* y misaligned by 1..3 floats */
        test_fill_uniform(y0, n + 4, 9);
        memcpy(ys, y0, (n + 4) * sizeof(float));
        memcpy(yv, y0, (n + 4) * sizeof(float));
        const float a = -0.37f;
        tensor_set_simd(false);
        tensor_axpy_row(t, n, a, r.p, ys + off);
        tensor_set_simd(true);
        tensor_axpy_row(t, n, a, r.p, yv + off);
        for (int64_t i = 0; i < n; i++) {
            double want = (double)y0[off + i] + (double)a * row_f[i];
            double tol = 1e-6 * (fabs(y0[off + i]) + fabs(a * row_f[i])) + 1e-7;
            if (!(fabs(ys[off + i] - want) <= tol && fabs(yv[off + i] - want) <= tol))
                fail_msg("%s axpy[%lld]: scalar %.9g simd %.9g want %.9g", keel_dtype_name(t),
                         (long long)i, ys[off + i], yv[off + i], want);
        }
        for (int i = 0; i < off; i++)
            assert_true(ys[i] == y0[i] && yv[i] == y0[i]);
        assert_true(ys[off + n] == y0[off + n] && yv[off + n] == y0[off + n]);
        ubuf_free(&r);
    }
    free(row_f);
    free(y0);
    free(ys);
    free(yv);
}

/* ---- fixtures: weights written by llama.cpp ---------------------------------------- */

/* A minimal GGUF v3 tensor directory (test-only; no bounds beyond what the
 * fixture needs, aborting the test on anything unexpected). */
typedef struct gg_tensor {
    char name[64];
    int64_t ne[4];
    int n_dims;
    uint32_t type;
    uint64_t offset;
} gg_tensor;

typedef struct gg_file {
    uint8_t *data;
    size_t size, pos, data_start;
    gg_tensor t[64];
    int n_tensors;
} gg_file;

static uint64_t gg_u(gg_file *f, int bytes)
{
    assert_true(f->pos + (size_t)bytes <= f->size);
    uint64_t v = 0;
    memcpy(&v, f->data + f->pos, (size_t)bytes);
    f->pos += (size_t)bytes;
    return v;
}

static void gg_skip_value(gg_file *f, uint32_t type)
{
    static const int sizes[13] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    assert_true(type <= 12);
    if (type == 8) {
        f->pos += gg_u(f, 8);
    } else if (type == 9) {
        uint32_t et = (uint32_t)gg_u(f, 4);
        uint64_t n = gg_u(f, 8);
        for (uint64_t i = 0; i < n; i++)
            gg_skip_value(f, et);
    } else {
        f->pos += (size_t)sizes[type];
    }
    assert_true(f->pos <= f->size);
}

static bool gg_open(gg_file *f, const char *path)
{
    memset(f, 0, sizeof *f);
    f->data = test_read_file(path, &f->size);
    if (!f->data) return false;
    assert_memory_equal(f->data, "GGUF", 4);
    f->pos = 4;
    assert_int_equal(gg_u(f, 4), 3);
    uint64_t n_tensors = gg_u(f, 8), n_kv = gg_u(f, 8);
    assert_true(n_tensors <= 64);
    uint64_t align = 32;
    for (uint64_t i = 0; i < n_kv; i++) {
        uint64_t klen = gg_u(f, 8);
        bool is_align = klen == 17 && memcmp(f->data + f->pos, "general.alignment", 17) == 0;
        f->pos += klen;
        uint32_t type = (uint32_t)gg_u(f, 4);
        if (is_align && type == 4) {
            align = gg_u(f, 4);
            continue;
        }
        gg_skip_value(f, type);
    }
    for (uint64_t i = 0; i < n_tensors; i++) {
        gg_tensor *t = &f->t[f->n_tensors++];
        uint64_t nlen = gg_u(f, 8);
        assert_true(nlen < sizeof t->name);
        memcpy(t->name, f->data + f->pos, nlen);
        t->name[nlen] = 0;
        f->pos += nlen;
        t->n_dims = (int)gg_u(f, 4);
        assert_true(t->n_dims >= 1 && t->n_dims <= 4);
        for (int d = 0; d < 4; d++)
            t->ne[d] = d < t->n_dims ? (int64_t)gg_u(f, 8) : 1;
        t->type = (uint32_t)gg_u(f, 4);
        t->offset = gg_u(f, 8);
    }
    f->data_start = (f->pos + align - 1) / align * align;
    return true;
}

static const gg_tensor *gg_find(const gg_file *f, const char *name)
{
    for (int i = 0; i < f->n_tensors; i++)
        if (strcmp(f->t[i].name, name) == 0) return &f->t[i];
    return NULL;
}

/* llama-quantize's F16 and Q8_0 files of the same f32 model: our f16
 * conversion reproduces the F16 file byte for byte; our q8_0 dequantize of
 * the Q8_0 file is within ggml's q8_0 error of the f32 weights, with the
 * same block scales; our matvec over the file's rows matches f32. */
static void test_fixture_llamacpp_weights(void **state)
{
    (void)state;
    const char *p32 = test_fixture("models/llama-gqa-f32.gguf");
    if (!p32) return;
    gg_file f32, f16, q8;
    assert_true(gg_open(&f32, p32));
    assert_true(gg_open(&f16, test_fixture("models/llama-gqa-f16.gguf")));
    assert_true(gg_open(&q8, test_fixture("models/llama-gqa-q8_0.gguf")));
    int checked = 0;
    base_arena arena;
    assert_ok(base_arena_init(&arena, 1 << 16));
    for (int i = 0; i < f32.n_tensors; i++) {
        const gg_tensor *a = &f32.t[i], *h = gg_find(&f16, a->name), *q = gg_find(&q8, a->name);
        if (a->n_dims != 2 || !h || !q) continue;
        assert_int_equal(a->type, KEEL_DTYPE_F32);
        assert_int_equal(h->type, KEEL_DTYPE_F16);
        assert_int_equal(q->type, KEEL_DTYPE_Q8_0);
        int64_t n_cols = a->ne[0], n_rows = a->ne[1], n = n_cols * n_rows;
        const float *w = (const float *)(f32.data + f32.data_start + a->offset);
        const uint8_t *wh = f16.data + f16.data_start + h->offset;
        const uint8_t *wq = q8.data + q8.data_start + q->offset;
        /* f16: identical bytes */
        uint8_t *mine = malloc((size_t)n * 2);
        assert_ok(tensor_quantize_row(KEEL_DTYPE_F16, w, mine, n));
        assert_memory_equal(mine, wh, (size_t)n * 2);
        free(mine);
        /* q8_0: same scales, values within ggml's bound (its quants use the
         * unrounded scale: half a step plus 127 * 2^-11 of a step) */
        float *y = malloc((size_t)n * sizeof(float));
        assert_ok(tensor_dequantize_row(KEEL_DTYPE_Q8_0, wq, y, n));
        uint8_t *ours = malloc(tensor_row_bytes(KEEL_DTYPE_Q8_0, n));
        assert_ok(tensor_quantize_row(KEEL_DTYPE_Q8_0, w, ours, n));
        int64_t same_q = 0;
        for (int64_t b = 0; b < n / 32; b++) {
            assert_memory_equal(ours + 34 * b, wq + 34 * b, 2); /* scale */
            double amax = 0;
            for (int k = 0; k < 32; k++)
                amax = fmax(amax, fabs(w[32 * b + k]));
            for (int k = 0; k < 32; k++) {
                double e = fabs((double)w[32 * b + k] - y[32 * b + k]);
                if (!(e <= amax / 254.0 * 1.13 + 1e-9))
                    fail_msg("%s element %lld: %.9g vs %.9g", a->name, (long long)(32 * b + k),
                             w[32 * b + k], y[32 * b + k]);
                same_q += ours[34 * b + 2 + k] == wq[34 * b + 2 + k];
            }
        }
        if (checked == 0)
            printf("    %s: %.3f%% of q8_0 quants identical to llama.cpp's\n", a->name,
                   100.0 * (double)same_q / (double)n);
        assert_true(same_q >= n * 98 / 100); /* only rounding-boundary values differ */
        /* matvec over the file's q8_0 rows vs the f32 weights */
        float *x = malloc((size_t)n_cols * sizeof(float)),
              *yy = malloc((size_t)n_rows * sizeof(float));
        test_fill_normal(x, n_cols, 5);
        assert_ok(tensor_matvec(KEEL_DTYPE_Q8_0, wq, n_rows, n_cols, x, yy, NULL, &arena));
        for (int64_t r = 0; r < n_rows; r++) {
            double ref = 0, nw = 0, nx = 0;
            for (int64_t c = 0; c < n_cols; c++) {
                ref += (double)w[r * n_cols + c] * x[c];
                nw += (double)w[r * n_cols + c] * w[r * n_cols + c];
                nx += (double)x[c] * x[c];
            }
            assert_true(fabs(yy[r] - ref) <= 0.01 * sqrt(nw * nx));
        }
        free(x);
        free(yy);
        free(y);
        free(ours);
        checked++;
    }
    assert_true(checked >= 16);
    base_arena_free(&arena);
    free(f32.data);
    free(f16.data);
    free(q8.data);
}

/* tensor_row_finite on f32 / f16 / bf16 rows of every length 1..70: rows of
 * extreme finite values (largest, smallest subnormal, -0) pass; one inf,
 * -inf or NaN (quiet or signalling) at any position fails. */
static void test_row_finite(void **state)
{
    (void)state;
    static const uint32_t f32_ok[] = {0x7f7fffffu, 0xff7fffffu, 0x00000001u, 0x80000000u, 0x3f800000u, 0x00800000u};
    static const uint32_t f32_bad[] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffffffffu};
    static const uint16_t h_ok[] = {0x7bffu, 0xfbffu, 0x0001u, 0x8000u, 0x3c00u, 0x0400u};
    static const uint16_t h_bad[] = {0x7c00u, 0xfc00u, 0x7e00u, 0x7c01u, 0xffffu};
    static const uint16_t b_ok[] = {0x7f7fu, 0xff7fu, 0x0001u, 0x8000u, 0x3f80u, 0x0080u};
    static const uint16_t b_bad[] = {0x7f80u, 0xff80u, 0x7fc0u, 0x7f81u, 0xffffu};
    uint8_t row[70 * 4];
    for (int64_t n = 1; n <= 70; n++) {
        for (int64_t i = 0; i < n; i++) {
            uint32_t f = f32_ok[i % 6];
            memcpy(row + 4 * i, &f, 4);
        }
        assert_true(tensor_row_finite(KEEL_DTYPE_F32, row, n));
        for (int64_t at = 0; at < n; at++)
            for (int k = 0; k < 5; k++) {
                uint32_t keep;
                memcpy(&keep, row + 4 * at, 4);
                memcpy(row + 4 * at, &f32_bad[k], 4);
                if (tensor_row_finite(KEEL_DTYPE_F32, row, n)) fail_msg("f32 n %lld: bad value at %lld passed", (long long)n, (long long)at);
                memcpy(row + 4 * at, &keep, 4);
            }
        for (int d = 0; d < 2; d++) {
            keel_dtype t = d ? KEEL_DTYPE_BF16 : KEEL_DTYPE_F16;
            const uint16_t *ok = d ? b_ok : h_ok, *bad = d ? b_bad : h_bad;
            for (int64_t i = 0; i < n; i++) memcpy(row + 2 * i, &ok[i % 6], 2);
            assert_true(tensor_row_finite(t, row, n));
            for (int64_t at = 0; at < n; at++)
                for (int k = 0; k < 5; k++) {
                    uint16_t keep;
                    memcpy(&keep, row + 2 * at, 2);
                    memcpy(row + 2 * at, &bad[k], 2);
                    if (tensor_row_finite(t, row, n))
                        fail_msg("%s n %lld: bad value at %lld passed", keel_dtype_name(t), (long long)n, (long long)at);
                    memcpy(row + 2 * at, &keep, 2);
                }
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dtype_table),
        cmocka_unit_test(test_row_finite),
        cmocka_unit_test(test_half_exact),
        cmocka_unit_test(test_quant_error_bounds),
        cmocka_unit_test(test_quant_simd_bytes_identical),
        cmocka_unit_test(test_kquant_hand_built),
        cmocka_unit_test(test_vec_dot_all),
        cmocka_unit_test(test_axpy_row_all),
        cmocka_unit_test(test_fixture_llamacpp_weights),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
