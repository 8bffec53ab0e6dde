/*
 * quant_avx2.c — AVX2 quantize (f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0,
 * q8_1, q8_K) and dequantize (those plus q4_K, q5_K, q6_K).
 *
 * Bit-identical to quant.c: the per-block scale is computed from the same
 * f32 max/min (max and min do not depend on order) through the same scalar
 * tq_scale_f16, and every value goes through the same f32 multiply, clamp
 * and round-to-nearest-even as tq_qround.
 */
#include "avx2_util.h"

/* ---- helpers ------------------------------------------------------------------- */

static inline __m256i round_clamp_epi32(__m256 t, __m256 lo, __m256 hi)
{
    t = _mm256_min_ps(_mm256_max_ps(t, lo), hi);
    t = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return _mm256_cvtps_epi32(t);
}

/* 4 x 8 int32 (each in int8 range) -> 32 int8 in element order. */
static inline __m256i pack_i32x32_i8(__m256i i0, __m256i i1, __m256i i2, __m256i i3)
{
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
    return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* 32 floats times mul (after subtracting sub when asym), clamped to
 * [lo, hi] and rounded, as int8. */
static inline __m256i quant_block32(const float *x, __m256 mul, __m256 sub, bool asym, float lo,
                                    float hi, __m256i *i32_out)
{
    __m256 vlo = _mm256_set1_ps(lo), vhi = _mm256_set1_ps(hi);
    __m256i q[4];
    for (int k = 0; k < 4; k++) {
        __m256 v = _mm256_loadu_ps(x + 8 * k);
        if (asym) v = _mm256_sub_ps(v, sub);
        q[k] = round_clamp_epi32(_mm256_mul_ps(v, mul), vlo, vhi);
        if (i32_out) i32_out[k] = q[k];
    }
    return pack_i32x32_i8(q[0], q[1], q[2], q[3]);
}

static inline float block_amax32(const float *x)
{
    __m256 m = abs_ps(_mm256_loadu_ps(x));
    for (int k = 1; k < 4; k++)
        m = _mm256_max_ps(m, abs_ps(_mm256_loadu_ps(x + 8 * k)));
    return hmax_ps(m);
}

/* The first element of largest magnitude, with its sign (0 if all zero),
 * exactly as the scalar blk_signed_max picks it. */
static inline float block_signed_max32(const float *x)
{
    float amax = block_amax32(x);
    if (amax == 0.0f) return 0.0f;
    __m256 va = _mm256_set1_ps(amax);
    uint32_t mask = 0;
    for (int k = 0; k < 4; k++) {
        __m256 eq = _mm256_cmp_ps(abs_ps(_mm256_loadu_ps(x + 8 * k)), va, _CMP_EQ_OQ);
        mask |= (uint32_t)_mm256_movemask_ps(eq) << (8 * k);
    }
    return x[__builtin_ctz(mask)];
}

static inline void pack_nibbles(uint8_t *qs, __m256i q)
{
    __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    _mm_storeu_si128((__m128i *)qs, _mm_or_si128(lo, _mm_slli_epi16(hi, 4)));
}

/* ---- quantize ---------------------------------------------------------------- */

static void quant_f16(const float *x, void *y, int64_t n)
{
    uint8_t *o = y;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(o + 2 * i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++)
        wr_u16(o + 2 * i, tensor_f32_to_f16(x[i]));
}

static void quant_bf16(const float *x, void *y, int64_t n)
{
    uint8_t *o = y;
    int64_t i = 0;
    const __m256i absmask = _mm256_set1_epi32(0x7FFFFFFF), inf = _mm256_set1_epi32(0x7F800000);
    for (; i + 16 <= n; i += 16) {
        __m256i r[2];
        for (int k = 0; k < 2; k++) {
            __m256i v = _mm256_castps_si256(_mm256_loadu_ps(x + i + 8 * k));
            __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(v, absmask), inf);
            __m256i odd = _mm256_and_si256(_mm256_srli_epi32(v, 16), _mm256_set1_epi32(1));
            __m256i rnd = _mm256_add_epi32(v, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), odd));
            __m256i qn = _mm256_or_si256(v, _mm256_set1_epi32(0x400000));
            r[k] = _mm256_srli_epi32(_mm256_blendv_epi8(rnd, qn, nan), 16);
        }
        __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(r[0], r[1]), 0xD8);
        _mm256_storeu_si256((__m256i *)(o + 2 * i), p);
    }
    for (; i < n; i++)
        wr_u16(o + 2 * i, tensor_f32_to_bf16(x[i]));
}

static void quant_q8_0(const float *x, void *y, int64_t n)
{
    uint8_t *b = y;
    const __m256 z = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK; i++, x += QK, b += Q8_0_BYTES) {
        float d, id;
        wr_u16(b, tq_scale_f16(block_amax32(x) / 127.0f, &d, &id));
        __m256i q = quant_block32(x, _mm256_set1_ps(id), z, false, -127.0f, 127.0f, NULL);
        _mm256_storeu_si256((__m256i *)(b + 2), q);
    }
}

static void quant_q8_1(const float *x, void *y, int64_t n)
{
    uint8_t *b = y;
    const __m256 z = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK; i++, x += QK, b += Q8_1_BYTES) {
        float d, id, unused, unused2;
        wr_u16(b, tq_scale_f16(block_amax32(x) / 127.0f, &d, &id));
        __m256i i32[4];
        __m256i q = quant_block32(x, _mm256_set1_ps(id), z, false, -127.0f, 127.0f, i32);
        _mm256_storeu_si256((__m256i *)(b + 4), q);
        int sum = hsum_epi32(
            _mm256_add_epi32(_mm256_add_epi32(i32[0], i32[1]), _mm256_add_epi32(i32[2], i32[3])));
        wr_u16(b + 2, tq_scale_f16(d * (float)sum, &unused, &unused2));
    }
}

static void quant_q8_K(const float *x, void *y, int64_t n)
{
    uint8_t *b = y;
    const __m256 z = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K, b += Q8_K_BYTES) {
        float amax = 0.0f;
        for (int g = 0; g < QK_K / QK; g++)
            amax = fmaxf(amax, block_amax32(x + QK * g));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        wr_f32(b, d);
        __m256 vid = _mm256_set1_ps(id);
        for (int g = 0; g < QK_K / QK; g++) {
            __m256i i32[4];
            __m256i q = quant_block32(x + QK * g, vid, z, false, -127.0f, 127.0f, i32);
            _mm256_storeu_si256((__m256i *)(b + Q8_K_QS + QK * g), q);
            int16_t s0 = (int16_t)hsum_epi32(_mm256_add_epi32(i32[0], i32[1]));
            int16_t s1 = (int16_t)hsum_epi32(_mm256_add_epi32(i32[2], i32[3]));
            memcpy(b + Q8_K_BSUMS + 4 * g, &s0, 2);
            memcpy(b + Q8_K_BSUMS + 4 * g + 2, &s1, 2);
        }
    }
}

static void quant_q4_0(const float *x, void *y, int64_t n)
{
    uint8_t *b = y;
    const __m256 z = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK; i++, x += QK, b += Q4_0_BYTES) {
        float d, id;
        wr_u16(b, tq_scale_f16(block_signed_max32(x) / -8.0f, &d, &id));
        __m256i q = quant_block32(x, _mm256_set1_ps(id), z, false, -8.0f, 7.0f, NULL);
        pack_nibbles(b + 2, _mm256_add_epi8(q, _mm256_set1_epi8(8)));
    }
}

static void quant_q5_0(const float *x, void *y, int64_t n)
{
    uint8_t *b = y;
    const __m256 z = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK; i++, x += QK, b += Q5_0_BYTES) {
        float d, id;
        wr_u16(b, tq_scale_f16(block_signed_max32(x) / -16.0f, &d, &id));
        __m256i q = quant_block32(x, _mm256_set1_ps(id), z, false, -16.0f, 15.0f, NULL);
        q = _mm256_add_epi8(q, _mm256_set1_epi8(16));
        uint32_t qh = (uint32_t)_mm256_movemask_epi8(_mm256_slli_epi16(q, 3));
        wr_u32(b + 2, qh);
        pack_nibbles(b + 6, _mm256_and_si256(q, _mm256_set1_epi8(0x0F)));
    }
}

static inline void block_min_max32(const float *x, float *mn, float *mx)
{
    __m256 lo = _mm256_loadu_ps(x), hi = lo;
    for (int k = 1; k < 4; k++) {
        __m256 v = _mm256_loadu_ps(x + 8 * k);
        lo = _mm256_min_ps(lo, v);
        hi = _mm256_max_ps(hi, v);
    }
    *mn = hmin_ps(lo);
    *mx = hmax_ps(hi);
}

static void quant_q4_1(const float *x, void *y, int64_t n)
{
    uint8_t *b = y;
    for (int64_t i = 0; i < n / QK; i++, x += QK, b += Q4_1_BYTES) {
        float mn, mx, d, id, m, unused;
        block_min_max32(x, &mn, &mx);
        wr_u16(b, tq_scale_f16((mx - mn) / 15.0f, &d, &id));
        wr_u16(b + 2, tq_scale_f16(mn, &m, &unused));
        __m256i q =
            quant_block32(x, _mm256_set1_ps(id), _mm256_set1_ps(m), true, 0.0f, 15.0f, NULL);
        pack_nibbles(b + 4, q);
    }
}

static void quant_q5_1(const float *x, void *y, int64_t n)
{
    uint8_t *b = y;
    for (int64_t i = 0; i < n / QK; i++, x += QK, b += Q5_1_BYTES) {
        float mn, mx, d, id, m, unused;
        block_min_max32(x, &mn, &mx);
        wr_u16(b, tq_scale_f16((mx - mn) / 31.0f, &d, &id));
        wr_u16(b + 2, tq_scale_f16(mn, &m, &unused));
        __m256i q =
            quant_block32(x, _mm256_set1_ps(id), _mm256_set1_ps(m), true, 0.0f, 31.0f, NULL);
        uint32_t qh = (uint32_t)_mm256_movemask_epi8(_mm256_slli_epi16(q, 3));
        wr_u32(b + 4, qh);
        pack_nibbles(b + 8, _mm256_and_si256(q, _mm256_set1_epi8(0x0F)));
    }
}

/* ---- dequantize -------------------------------------------------------------- */

static void dequant_f16(const void *x, float *y, int64_t n)
{
    const uint8_t *p = x;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(loadu_128(p + 2 * i)));
    for (; i < n; i++)
        y[i] = tensor_f16_to_f32(rd_u16(p + 2 * i));
}

static void dequant_bf16(const void *x, float *y, int64_t n)
{
    const uint8_t *p = x;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i v = _mm256_slli_epi32(_mm256_cvtepu16_epi32(loadu_128(p + 2 * i)), 16);
        _mm256_storeu_ps(y + i, _mm256_castsi256_ps(v));
    }
    for (; i < n; i++)
        y[i] = tensor_bf16_to_f32(rd_u16(p + 2 * i));
}

static void dequant_q8_0(const void *x, float *y, int64_t n)
{
    const uint8_t *b = x;
    const __m256 z = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK; i++, b += Q8_0_BYTES, y += QK)
        store_i8x32(y, loadu_256(b + 2), _mm256_set1_ps(f16_load(b)), z);
}

static void dequant_q4_0(const void *x, float *y, int64_t n)
{
    const uint8_t *b = x;
    const __m256 z = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK; i++, b += Q4_0_BYTES, y += QK)
        store_i8x32(y, q4_0_values(b), _mm256_set1_ps(f16_load(b)), z);
}

static void dequant_q5_0(const void *x, float *y, int64_t n)
{
    const uint8_t *b = x;
    const __m256 z = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK; i++, b += Q5_0_BYTES, y += QK)
        store_i8x32(y, q5_0_values(b), _mm256_set1_ps(f16_load(b)), z);
}

static void dequant_q4_1(const void *x, float *y, int64_t n)
{
    const uint8_t *b = x;
    for (int64_t i = 0; i < n / QK; i++, b += Q4_1_BYTES, y += QK)
        store_i8x32(y, q4_1_values(b), _mm256_set1_ps(f16_load(b)),
                    _mm256_set1_ps(f16_load(b + 2)));
}

static void dequant_q5_1(const void *x, float *y, int64_t n)
{
    const uint8_t *b = x;
    for (int64_t i = 0; i < n / QK; i++, b += Q5_1_BYTES, y += QK)
        store_i8x32(y, q5_1_values(b), _mm256_set1_ps(f16_load(b)),
                    _mm256_set1_ps(f16_load(b + 2)));
}

static void dequant_q4_K(const void *x, float *y, int64_t n)
{
    const uint8_t *b = x;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int64_t i = 0; i < n / QK_K; i++, b += Q4_K_BYTES, y += QK_K) {
        float d = f16_load(b), dmin = f16_load(b + 2);
        uint8_t sm[16];
        kq_unpack_scales(b + 4, sm);
        for (int c = 0; c < 4; c++) {
            __m256i q = loadu_256(b + 16 + 32 * c);
            __m256i lo = _mm256_and_si256(q, m4),
                    hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            store_i8x32(y + 64 * c, lo, _mm256_set1_ps(d * (float)sm[2 * c]),
                        _mm256_set1_ps(-dmin * (float)sm[8 + 2 * c]));
            store_i8x32(y + 64 * c + 32, hi, _mm256_set1_ps(d * (float)sm[2 * c + 1]),
                        _mm256_set1_ps(-dmin * (float)sm[8 + 2 * c + 1]));
        }
    }
}

static void dequant_q5_K(const void *x, float *y, int64_t n)
{
    const uint8_t *b = x;
    const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    for (int64_t i = 0; i < n / QK_K; i++, b += Q5_K_BYTES, y += QK_K) {
        float d = f16_load(b), dmin = f16_load(b + 2);
        uint8_t sm[16];
        kq_unpack_scales(b + 4, sm);
        __m256i hb = loadu_256(b + 16);
        for (int c = 0; c < 4; c++) {
            __m256i q = loadu_256(b + 48 + 32 * c);
            __m256i h0 = _mm256_slli_epi16(_mm256_and_si256(hb, one), 4);
            __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 1), one), 4);
            hb = _mm256_srli_epi16(hb, 2);
            __m256i lo = _mm256_or_si256(_mm256_and_si256(q, m4), h0);
            __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), h1);
            store_i8x32(y + 64 * c, lo, _mm256_set1_ps(d * (float)sm[2 * c]),
                        _mm256_set1_ps(-dmin * (float)sm[8 + 2 * c]));
            store_i8x32(y + 64 * c + 32, hi, _mm256_set1_ps(d * (float)sm[2 * c + 1]),
                        _mm256_set1_ps(-dmin * (float)sm[8 + 2 * c + 1]));
        }
    }
}

/* y[0..16) = q[0..16) * d0, y[16..32) = q[16..32) * d1. */
static inline void store_i8x32_2(float *y, __m256i q, __m256 d0, __m256 d1)
{
    __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    _mm256_storeu_ps(y, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)), d0));
    _mm256_storeu_ps(
        y + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))), d0));
    _mm256_storeu_ps(y + 16, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)), d1));
    _mm256_storeu_ps(
        y + 24, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))), d1));
}

static void dequant_q6_K(const void *x, float *y, int64_t n)
{
    const uint8_t *b = x;
    const __m256i o32 = _mm256_set1_epi8(32);
    for (int64_t i = 0; i < n / QK_K; i++, b += Q6_K_BYTES, y += QK_K) {
        float d = f16_load(b + 208);
        const int8_t *sc = (const int8_t *)(b + 192);
        for (int nh = 0; nh < 2; nh++) {
            __m256i q[4];
            q6_K_values(b, nh, q);
            for (int k = 0; k < 4; k++) {
                int s = 8 * nh + 2 * k;
                store_i8x32_2(y + 128 * nh + 32 * k, _mm256_sub_epi8(q[k], o32),
                              _mm256_set1_ps(d * (float)sc[s]),
                              _mm256_set1_ps(d * (float)sc[s + 1]));
            }
        }
    }
}

const tensor_quant_fn tensor_quant_avx2_[KEEL_DTYPE_COUNT_] = {
    [KEEL_DTYPE_F16] = quant_f16,   [KEEL_DTYPE_BF16] = quant_bf16, [KEEL_DTYPE_Q8_0] = quant_q8_0,
    [KEEL_DTYPE_Q8_1] = quant_q8_1, [KEEL_DTYPE_Q8_K] = quant_q8_K, [KEEL_DTYPE_Q4_0] = quant_q4_0,
    [KEEL_DTYPE_Q4_1] = quant_q4_1, [KEEL_DTYPE_Q5_0] = quant_q5_0, [KEEL_DTYPE_Q5_1] = quant_q5_1,
};

const tensor_dequant_fn tensor_dequant_avx2_[KEEL_DTYPE_COUNT_] = {
    [KEEL_DTYPE_F16] = dequant_f16,   [KEEL_DTYPE_BF16] = dequant_bf16,
    [KEEL_DTYPE_Q8_0] = dequant_q8_0, [KEEL_DTYPE_Q4_0] = dequant_q4_0,
    [KEEL_DTYPE_Q4_1] = dequant_q4_1, [KEEL_DTYPE_Q5_0] = dequant_q5_0,
    [KEEL_DTYPE_Q5_1] = dequant_q5_1, [KEEL_DTYPE_Q4_K] = dequant_q4_K,
    [KEEL_DTYPE_Q5_K] = dequant_q5_K, [KEEL_DTYPE_Q6_K] = dequant_q6_K,
};
