/*
 * quant.c — scalar quantize/dequantize of the float and legacy 32-element
 * formats (f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q8_1, q8_K) and
 * the public tensor_quantize_row / tensor_dequantize_row dispatch.
 *
 * Rounding rule (shared with quant_avx2.c, which must produce identical
 * bytes): block scales are computed in f32, rounded to f16 (nearest even)
 * by tq_scale_f16, and values are quantized with the reciprocal of the
 * *rounded* scale, rounded to nearest even (tq_qround) and clamped. Using
 * the stored scale keeps the error within half a step of what dequantize
 * reproduces. Layouts: tensor_impl.h.
 */
#include "tensor_impl.h"

#include <math.h>

/* ---- float formats ---------------------------------------------------------- */

void tq_quant_f32(const float *x, void *y, int64_t n)
{
    memcpy(y, x, (size_t)n * sizeof(float));
}

void tq_dequant_f32(const void *x, float *y, int64_t n)
{
    memcpy(y, x, (size_t)n * sizeof(float)); /* any byte alignment */
}

void tq_quant_f16(const float *x, void *y, int64_t n)
{
    uint8_t *o = y;
    for (int64_t i = 0; i < n; i++)
        wr_u16(o + 2 * i, tensor_f32_to_f16(x[i]));
}

void tq_dequant_f16(const void *x, float *y, int64_t n)
{
    const uint8_t *p = x;
    for (int64_t i = 0; i < n; i++)
        y[i] = tensor_f16_to_f32(rd_u16(p + 2 * i));
}

void tq_quant_bf16(const float *x, void *y, int64_t n)
{
    uint8_t *o = y;
    for (int64_t i = 0; i < n; i++)
        wr_u16(o + 2 * i, tensor_f32_to_bf16(x[i]));
}

void tq_dequant_bf16(const void *x, float *y, int64_t n)
{
    const uint8_t *p = x;
    for (int64_t i = 0; i < n; i++)
        y[i] = tensor_bf16_to_f32(rd_u16(p + 2 * i));
}

/* ---- block helpers ------------------------------------------------------------ */

/* The element of largest magnitude, with its sign (the first one on ties). */
static float blk_signed_max(const float *x, int n)
{
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++) {
        float a = fabsf(x[j]);
        if (a > amax) {
            amax = a;
            max = x[j];
        }
    }
    return max;
}

static float blk_amax(const float *x, int n)
{
    float amax = 0.0f;
    for (int j = 0; j < n; j++)
        amax = fmaxf(amax, fabsf(x[j]));
    return amax;
}

/* ---- q4_0 / q5_0: symmetric, scale = signed max / -(2^(b-1)) ----------------- */

void tq_quant_q4_0(const float *x, void *y, int64_t n)
{
    uint8_t *b = y;
    for (int64_t i = 0; i < n / QK; i++, x += QK, b += Q4_0_BYTES) {
        float d, id;
        wr_u16(b, tq_scale_f16(blk_signed_max(x, QK) / -8.0f, &d, &id));
        for (int j = 0; j < 16; j++) {
            int q0 = tq_qround(x[j] * id, -8.0f, 7.0f) + 8;
            int q1 = tq_qround(x[j + 16] * id, -8.0f, 7.0f) + 8;
            b[2 + j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

void tq_dequant_q4_0(const void *x, float *y, int64_t n)
{
    const uint8_t *b = x;
    for (int64_t i = 0; i < n / QK; i++, b += Q4_0_BYTES, y += QK) {
        float d = rd_f16(b);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)((b[2 + j] & 0xF) - 8);
            y[j + 16] = d * (float)((b[2 + j] >> 4) - 8);
        }
    }
}

void tq_quant_q5_0(const float *x, void *y, int64_t n)
{
    uint8_t *b = y;
    for (int64_t i = 0; i < n / QK; i++, x += QK, b += Q5_0_BYTES) {
        float d, id;
        wr_u16(b, tq_scale_f16(blk_signed_max(x, QK) / -16.0f, &d, &id));
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            int q0 = tq_qround(x[j] * id, -16.0f, 15.0f) + 16;
            int q1 = tq_qround(x[j + 16] * id, -16.0f, 15.0f) + 16;
            b[6 + j] = (uint8_t)((q0 & 0xF) | ((q1 & 0xF) << 4));
            qh |= (uint32_t)(q0 >> 4) << j;
            qh |= (uint32_t)(q1 >> 4) << (j + 16);
        }
        wr_u32(b + 2, qh);
    }
}

void tq_dequant_q5_0(const void *x, float *y, int64_t n)
{
    const uint8_t *b = x;
    for (int64_t i = 0; i < n / QK; i++, b += Q5_0_BYTES, y += QK) {
        float d = rd_f16(b);
        uint32_t qh = rd_u32(b + 2);
        for (int j = 0; j < 16; j++) {
            int q0 = (b[6 + j] & 0xF) | (int)(((qh >> j) & 1) << 4);
            int q1 = (b[6 + j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            y[j] = d * (float)(q0 - 16);
            y[j + 16] = d * (float)(q1 - 16);
        }
    }
}

/* ---- q4_1 / q5_1: asymmetric, x = d*q + m, m = block min ------------------- */

static void blk_min_max(const float *x, int n, float *mn, float *mx)
{
    float lo = x[0], hi = x[0];
    for (int j = 1; j < n; j++) {
        lo = fminf(lo, x[j]);
        hi = fmaxf(hi, x[j]);
    }
    *mn = lo;
    *mx = hi;
}

void tq_quant_q4_1(const float *x, void *y, int64_t n)
{
    uint8_t *b = y;
    for (int64_t i = 0; i < n / QK; i++, x += QK, b += Q4_1_BYTES) {
        float mn, mx, d, id, m, unused;
        blk_min_max(x, QK, &mn, &mx);
        wr_u16(b, tq_scale_f16((mx - mn) / 15.0f, &d, &id));
        wr_u16(b + 2, tq_scale_f16(mn, &m, &unused));
        for (int j = 0; j < 16; j++) {
            int q0 = tq_qround((x[j] - m) * id, 0.0f, 15.0f);
            int q1 = tq_qround((x[j + 16] - m) * id, 0.0f, 15.0f);
            b[4 + j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

void tq_dequant_q4_1(const void *x, float *y, int64_t n)
{
    const uint8_t *b = x;
    for (int64_t i = 0; i < n / QK; i++, b += Q4_1_BYTES, y += QK) {
        float d = rd_f16(b), m = rd_f16(b + 2);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)(b[4 + j] & 0xF) + m;
            y[j + 16] = d * (float)(b[4 + j] >> 4) + m;
        }
    }
}

void tq_quant_q5_1(const float *x, void *y, int64_t n)
{
    uint8_t *b = y;
    for (int64_t i = 0; i < n / QK; i++, x += QK, b += Q5_1_BYTES) {
        float mn, mx, d, id, m, unused;
        blk_min_max(x, QK, &mn, &mx);
        wr_u16(b, tq_scale_f16((mx - mn) / 31.0f, &d, &id));
        wr_u16(b + 2, tq_scale_f16(mn, &m, &unused));
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            int q0 = tq_qround((x[j] - m) * id, 0.0f, 31.0f);
            int q1 = tq_qround((x[j + 16] - m) * id, 0.0f, 31.0f);
            b[8 + j] = (uint8_t)((q0 & 0xF) | ((q1 & 0xF) << 4));
            qh |= (uint32_t)(q0 >> 4) << j;
            qh |= (uint32_t)(q1 >> 4) << (j + 16);
        }
        wr_u32(b + 4, qh);
    }
}

void tq_dequant_q5_1(const void *x, float *y, int64_t n)
{
    const uint8_t *b = x;
    for (int64_t i = 0; i < n / QK; i++, b += Q5_1_BYTES, y += QK) {
        float d = rd_f16(b), m = rd_f16(b + 2);
        uint32_t qh = rd_u32(b + 4);
        for (int j = 0; j < 16; j++) {
            int q0 = (b[8 + j] & 0xF) | (int)(((qh >> j) & 1) << 4);
            int q1 = (b[8 + j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            y[j] = d * (float)q0 + m;
            y[j + 16] = d * (float)q1 + m;
        }
    }
}

/* ---- q8_0 / q8_1 / q8_K: symmetric 8-bit, scale = amax / 127 ---------------- */

void tq_quant_q8_0(const float *x, void *y, int64_t n)
{
    uint8_t *b = y;
    for (int64_t i = 0; i < n / QK; i++, x += QK, b += Q8_0_BYTES) {
        float d, id;
        wr_u16(b, tq_scale_f16(blk_amax(x, QK) / 127.0f, &d, &id));
        for (int j = 0; j < QK; j++)
            b[2 + j] = (uint8_t)(int8_t)tq_qround(x[j] * id, -127.0f, 127.0f);
    }
}

void tq_dequant_q8_0(const void *x, float *y, int64_t n)
{
    const uint8_t *b = x;
    for (int64_t i = 0; i < n / QK; i++, b += Q8_0_BYTES, y += QK) {
        float d = rd_f16(b);
        for (int j = 0; j < QK; j++)
            y[j] = d * (float)(int8_t)b[2 + j];
    }
}

void tq_quant_q8_1(const float *x, void *y, int64_t n)
{
    uint8_t *b = y;
    for (int64_t i = 0; i < n / QK; i++, x += QK, b += Q8_1_BYTES) {
        float d, id, unused, unused2;
        wr_u16(b, tq_scale_f16(blk_amax(x, QK) / 127.0f, &d, &id));
        int sum = 0;
        for (int j = 0; j < QK; j++) {
            int q = tq_qround(x[j] * id, -127.0f, 127.0f);
            b[4 + j] = (uint8_t)(int8_t)q;
            sum += q;
        }
        wr_u16(b + 2, tq_scale_f16(d * (float)sum, &unused, &unused2));
    }
}

void tq_dequant_q8_1(const void *x, float *y, int64_t n)
{
    const uint8_t *b = x;
    for (int64_t i = 0; i < n / QK; i++, b += Q8_1_BYTES, y += QK) {
        float d = rd_f16(b);
        for (int j = 0; j < QK; j++)
            y[j] = d * (float)(int8_t)b[4 + j];
    }
}

void tq_quant_q8_K(const float *x, void *y, int64_t n)
{
    uint8_t *b = y;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K, b += Q8_K_BYTES) {
        float amax = blk_amax(x, QK_K);
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        wr_f32(b, d);
        for (int g = 0; g < 16; g++) {
            int sum = 0;
            for (int j = 0; j < 16; j++) {
                int q = tq_qround(x[16 * g + j] * id, -127.0f, 127.0f);
                b[Q8_K_QS + 16 * g + j] = (uint8_t)(int8_t)q;
                sum += q;
            }
            int16_t s = (int16_t)sum;
            memcpy(b + Q8_K_BSUMS + 2 * g, &s, 2);
        }
    }
}

void tq_dequant_q8_K(const void *x, float *y, int64_t n)
{
    const uint8_t *b = x;
    for (int64_t i = 0; i < n / QK_K; i++, b += Q8_K_BYTES, y += QK_K) {
        float d = rd_f32(b);
        for (int j = 0; j < QK_K; j++)
            y[j] = d * (float)(int8_t)b[Q8_K_QS + j];
    }
}

/* ---- tables and dispatch ------------------------------------------------------ */

const tensor_quant_fn tensor_quant_scalar_[KEEL_DTYPE_COUNT_] = {
    [KEEL_DTYPE_F32] = tq_quant_f32,   [KEEL_DTYPE_F16] = tq_quant_f16,
    [KEEL_DTYPE_BF16] = tq_quant_bf16, [KEEL_DTYPE_Q4_0] = tq_quant_q4_0,
    [KEEL_DTYPE_Q4_1] = tq_quant_q4_1, [KEEL_DTYPE_Q5_0] = tq_quant_q5_0,
    [KEEL_DTYPE_Q5_1] = tq_quant_q5_1, [KEEL_DTYPE_Q8_0] = tq_quant_q8_0,
    [KEEL_DTYPE_Q8_1] = tq_quant_q8_1, [KEEL_DTYPE_Q8_K] = tq_quant_q8_K,
    [KEEL_DTYPE_Q4_K] = tq_quant_q4_K, [KEEL_DTYPE_Q5_K] = tq_quant_q5_K,
    [KEEL_DTYPE_Q6_K] = tq_quant_q6_K,
};

const tensor_dequant_fn tensor_dequant_scalar_[KEEL_DTYPE_COUNT_] = {
    [KEEL_DTYPE_F32] = tq_dequant_f32,   [KEEL_DTYPE_F16] = tq_dequant_f16,
    [KEEL_DTYPE_BF16] = tq_dequant_bf16, [KEEL_DTYPE_Q4_0] = tq_dequant_q4_0,
    [KEEL_DTYPE_Q4_1] = tq_dequant_q4_1, [KEEL_DTYPE_Q5_0] = tq_dequant_q5_0,
    [KEEL_DTYPE_Q5_1] = tq_dequant_q5_1, [KEEL_DTYPE_Q8_0] = tq_dequant_q8_0,
    [KEEL_DTYPE_Q8_1] = tq_dequant_q8_1, [KEEL_DTYPE_Q8_K] = tq_dequant_q8_K,
    [KEEL_DTYPE_Q2_K] = tq_dequant_q2_K, [KEEL_DTYPE_Q3_K] = tq_dequant_q3_K,
    [KEEL_DTYPE_Q4_K] = tq_dequant_q4_K, [KEEL_DTYPE_Q5_K] = tq_dequant_q5_K,
    [KEEL_DTYPE_Q6_K] = tq_dequant_q6_K,
};

tensor_quant_fn tensor_quant_get_(keel_dtype t)
{
    if ((unsigned)t >= KEEL_DTYPE_COUNT_) return NULL;
    if (tensor_use_avx2() && tensor_quant_avx2_[t]) return tensor_quant_avx2_[t];
    return tensor_quant_scalar_[t];
}

tensor_dequant_fn tensor_dequant_get_(keel_dtype t)
{
    if ((unsigned)t >= KEEL_DTYPE_COUNT_) return NULL;
    if (tensor_use_avx2() && tensor_dequant_avx2_[t]) return tensor_dequant_avx2_[t];
    return tensor_dequant_scalar_[t];
}

void tensor_quantize_row_unchecked(keel_dtype t, const float *x, void *y, int64_t n)
{
    tensor_quant_get_(t)(x, y, n);
}

void tensor_dequantize_row_unchecked(keel_dtype t, const void *x, float *y, int64_t n)
{
    tensor_dequant_get_(t)(x, y, n);
}

static bool half_bits_finite(const uint8_t *p)
{
    return ((p[1] >> 2) & 0x1f) != 0x1f; /* exponent not all ones: not inf / NaN */
}

/* Whether none of the nb bytes at p, read as little-endian lanes whose
 * exponent field is mask (one per lane, repeated over a 64-bit word), has
 * that field all ones (inf / NaN). Adding the field's lowest bit carries
 * into the bit above it (top) exactly when the field is all ones; the
 * lanes cannot carry into each other. A word at a time, no early exit, so
 * that the compiler keeps it branch-free; lane_bytes divides nb. */
static bool lanes_finite(const uint8_t *p, size_t nb, size_t lane_bytes, uint64_t mask, uint64_t add, uint64_t top)
{
    uint64_t bad = 0;
    size_t i = 0;
    for (; i + 8 <= nb; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        bad |= ((w & mask) + add) & top;
    }
    for (; i < nb; i += lane_bytes) { /* the tail: one lane at a time */
        uint64_t w = 0;
        memcpy(&w, p + i, lane_bytes);
        bad |= ((w & mask) + add) & top;
    }
    return bad == 0;
}

bool tensor_row_finite(keel_dtype t, const void *x, int64_t n)
{
    const uint8_t *p = x;
    int64_t bs = keel_dtype_block_size(t);
    size_t blk = tensor_row_bytes(t, bs);
    /* the legacy block codecs: values are small integers times the f16
     * scale (plus the f16 minimum): finite iff those are */
    int scales = t == KEEL_DTYPE_Q8_0 || t == KEEL_DTYPE_Q4_0 || t == KEEL_DTYPE_Q5_0 ? 1
                 : t == KEEL_DTYPE_Q4_1 || t == KEEL_DTYPE_Q5_1                      ? 2
                                                                                      : 0;
    switch (t) {
    case KEEL_DTYPE_F32:
        return lanes_finite(p, (size_t)n * 4, 4, 0x7f8000007f800000ull, 0x0080000000800000ull, 0x8000000080000000ull);
    case KEEL_DTYPE_BF16:
        return lanes_finite(p, (size_t)n * 2, 2, 0x7f807f807f807f80ull, 0x0080008000800080ull, 0x8000800080008000ull);
    case KEEL_DTYPE_F16:
        return lanes_finite(p, (size_t)n * 2, 2, 0x7c007c007c007c00ull, 0x0400040004000400ull, 0x8000800080008000ull);
    default:
        break;
    }
    if (scales) {
        for (int64_t b = 0; b < n / bs; b++, p += blk)
            for (int k = 0; k < scales; k++)
                if (!half_bits_finite(p + 2 * k)) return false;
        return true;
    }
    /* any other codec: decode block by block */
    tensor_dequant_fn fn = tensor_dequant_get_(t);
    if (!fn || bs > 256) return false;
    float y[256];
    for (int64_t b = 0; b < n / bs; b++, p += blk) {
        fn(p, y, bs);
        for (int64_t i = 0; i < bs; i++)
            if (!isfinite(y[i])) return false;
    }
    return true;
}

keel_status tensor_quantize_row(keel_dtype t, const float *x, void *y, int64_t n)
{
    if (!tensor_dtype_valid(t)) return KEEL_EINVAL;
    int64_t bs = keel_dtype_block_size(t);
    if (n < 0 || n % bs != 0) return KEEL_EINVAL;
    tensor_quant_fn fn = tensor_quant_get_(t);
    if (!fn) return KEEL_EUNSUPPORTED;
    if (n == 0) return KEEL_OK;
    if (!x || !y) return KEEL_EINVAL;
    fn(x, y, n);
    return KEEL_OK;
}

keel_status tensor_dequantize_row(keel_dtype t, const void *x, float *y, int64_t n)
{
    if (!tensor_dtype_valid(t)) return KEEL_EINVAL;
    int64_t bs = keel_dtype_block_size(t);
    if (n < 0 || n % bs != 0) return KEEL_EINVAL;
    tensor_dequant_fn fn = tensor_dequant_get_(t);
    if (!fn) return KEEL_EUNSUPPORTED;
    if (n == 0) return KEEL_OK;
    if (!x || !y) return KEEL_EINVAL;
    fn(x, y, n);
    return KEEL_OK;
}
