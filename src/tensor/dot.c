/*
 * dot.c — scalar dot products (weights in any dtype against activations in
 * its vec_dot type), the vec_dot / axpy_row dispatch and the f32 helpers.
 * Integer parts of quantized dots are exact; only the per-block float
 * accumulation differs from the AVX2 paths (by summation order).
 * q4_1/q5_1 against q8_1 use the exact integer sum of the activation's
 * quants for the min term (d_x * sum(q_x)), not the block's f16 s field,
 * whose rounding would cost up to 2^-11 of |m * s| per block.
 */
#include "tensor_impl.h"

keel_dtype tensor_vec_dot_type(keel_dtype w)
{
    switch (w) {
    case KEEL_DTYPE_Q4_0:
    case KEEL_DTYPE_Q5_0:
    case KEEL_DTYPE_Q8_0:
        return KEEL_DTYPE_Q8_0;
    case KEEL_DTYPE_Q4_1:
    case KEEL_DTYPE_Q5_1:
        return KEEL_DTYPE_Q8_1;
    case KEEL_DTYPE_Q2_K:
    case KEEL_DTYPE_Q3_K:
    case KEEL_DTYPE_Q4_K:
    case KEEL_DTYPE_Q5_K:
    case KEEL_DTYPE_Q6_K:
        return KEEL_DTYPE_Q8_K;
    default:
        return KEEL_DTYPE_F32;
    }
}

/* ---- f32 helpers (scalar) ---------------------------------------------------- */

static float dot_f32_scalar(const float *a, const float *b, int64_t n)
{
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += a[i] * b[i];
        s1 += a[i + 1] * b[i + 1];
        s2 += a[i + 2] * b[i + 2];
        s3 += a[i + 3] * b[i + 3];
    }
    for (; i < n; i++)
        s0 += a[i] * b[i];
    return (s0 + s1) + (s2 + s3);
}

float tensor_dot_f32(const float *a, const float *b, int64_t n)
{
    if (tensor_use_avx2()) return tensor_dot_f32_avx2(a, b, n);
    return dot_f32_scalar(a, b, n);
}

void tensor_axpy_f32(float *y, float a, const float *x, int64_t n)
{
    if (tensor_use_avx2()) {
        tensor_axpy_f32_avx2(y, a, x, n);
        return;
    }
    for (int64_t i = 0; i < n; i++)
        y[i] += a * x[i];
}

void tensor_scale_f32(float *y, float a, int64_t n)
{
    if (tensor_use_avx2()) {
        tensor_scale_f32_avx2(y, a, n);
        return;
    }
    for (int64_t i = 0; i < n; i++)
        y[i] *= a;
}

void tensor_add_f32(float *y, const float *x, int64_t n)
{
    if (tensor_use_avx2()) {
        tensor_add_f32_avx2(y, x, n);
        return;
    }
    for (int64_t i = 0; i < n; i++)
        y[i] += x[i];
}

void tensor_mul_f32(float *y, const float *x, int64_t n)
{
    if (tensor_use_avx2()) {
        tensor_mul_f32_avx2(y, x, n);
        return;
    }
    for (int64_t i = 0; i < n; i++)
        y[i] *= x[i];
}

/* ---- scalar dots ---------------------------------------------------------------- */

/* Rows are void * and may sit at any byte address: memcpy loads. */
static float dot_f32(int64_t n, const void *w, const void *x)
{
    const uint8_t *a = w, *b = x;
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += rd_f32(a + 4 * i) * rd_f32(b + 4 * i);
        s1 += rd_f32(a + 4 * i + 4) * rd_f32(b + 4 * i + 4);
        s2 += rd_f32(a + 4 * i + 8) * rd_f32(b + 4 * i + 8);
        s3 += rd_f32(a + 4 * i + 12) * rd_f32(b + 4 * i + 12);
    }
    for (; i < n; i++)
        s0 += rd_f32(a + 4 * i) * rd_f32(b + 4 * i);
    return (s0 + s1) + (s2 + s3);
}

static float dot_f16(int64_t n, const void *w, const void *x)
{
    const uint8_t *p = w;
    const float *xf = x;
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++)
        s += tensor_f16_to_f32(rd_u16(p + 2 * i)) * xf[i];
    return s;
}

static float dot_bf16(int64_t n, const void *w, const void *x)
{
    const uint8_t *p = w;
    const float *xf = x;
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++)
        s += tensor_bf16_to_f32(rd_u16(p + 2 * i)) * xf[i];
    return s;
}

static float dot_q8_0(int64_t n, const void *w, const void *x)
{
    const uint8_t *b = w, *xb = x;
    float s = 0.0f;
    for (int64_t i = 0; i < n / QK; i++, b += Q8_0_BYTES, xb += Q8_0_BYTES) {
        int acc = 0;
        for (int j = 0; j < QK; j++)
            acc += (int8_t)b[2 + j] * (int8_t)xb[2 + j];
        s += rd_f16(b) * rd_f16(xb) * (float)acc;
    }
    return s;
}

static float dot_q4_0(int64_t n, const void *w, const void *x)
{
    const uint8_t *b = w, *xb = x;
    float s = 0.0f;
    for (int64_t i = 0; i < n / QK; i++, b += Q4_0_BYTES, xb += Q8_0_BYTES) {
        const int8_t *xq = (const int8_t *)(xb + 2);
        int acc = 0;
        for (int j = 0; j < 16; j++)
            acc += ((b[2 + j] & 0xF) - 8) * xq[j] + ((b[2 + j] >> 4) - 8) * xq[j + 16];
        s += rd_f16(b) * rd_f16(xb) * (float)acc;
    }
    return s;
}

static float dot_q5_0(int64_t n, const void *w, const void *x)
{
    const uint8_t *b = w, *xb = x;
    float s = 0.0f;
    for (int64_t i = 0; i < n / QK; i++, b += Q5_0_BYTES, xb += Q8_0_BYTES) {
        const int8_t *xq = (const int8_t *)(xb + 2);
        uint32_t qh = rd_u32(b + 2);
        int acc = 0;
        for (int j = 0; j < 16; j++) {
            int q0 = (b[6 + j] & 0xF) | (int)(((qh >> j) & 1) << 4);
            int q1 = (b[6 + j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            acc += (q0 - 16) * xq[j] + (q1 - 16) * xq[j + 16];
        }
        s += rd_f16(b) * rd_f16(xb) * (float)acc;
    }
    return s;
}

static float dot_q4_1(int64_t n, const void *w, const void *x)
{
    const uint8_t *b = w, *xb = x;
    float s = 0.0f;
    for (int64_t i = 0; i < n / QK; i++, b += Q4_1_BYTES, xb += Q8_1_BYTES) {
        const int8_t *xq = (const int8_t *)(xb + 4);
        int acc = 0, sx = 0;
        for (int j = 0; j < 16; j++) {
            acc += (b[4 + j] & 0xF) * xq[j] + (b[4 + j] >> 4) * xq[j + 16];
            sx += xq[j] + xq[j + 16];
        }
        float dx = rd_f16(xb);
        s += rd_f16(b) * dx * (float)acc + rd_f16(b + 2) * dx * (float)sx;
    }
    return s;
}

static float dot_q5_1(int64_t n, const void *w, const void *x)
{
    const uint8_t *b = w, *xb = x;
    float s = 0.0f;
    for (int64_t i = 0; i < n / QK; i++, b += Q5_1_BYTES, xb += Q8_1_BYTES) {
        const int8_t *xq = (const int8_t *)(xb + 4);
        uint32_t qh = rd_u32(b + 4);
        int acc = 0, sx = 0;
        for (int j = 0; j < 16; j++) {
            int q0 = (b[8 + j] & 0xF) | (int)(((qh >> j) & 1) << 4);
            int q1 = (b[8 + j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            acc += q0 * xq[j] + q1 * xq[j + 16];
            sx += xq[j] + xq[j + 16];
        }
        float dx = rd_f16(xb);
        s += rd_f16(b) * dx * (float)acc + rd_f16(b + 2) * dx * (float)sx;
    }
    return s;
}

const tensor_dot_fn tensor_dot_scalar_[KEEL_DTYPE_COUNT_] = {
    [KEEL_DTYPE_F32] = dot_f32,      [KEEL_DTYPE_F16] = dot_f16,
    [KEEL_DTYPE_BF16] = dot_bf16,    [KEEL_DTYPE_Q8_0] = dot_q8_0,
    [KEEL_DTYPE_Q4_0] = dot_q4_0,    [KEEL_DTYPE_Q5_0] = dot_q5_0,
    [KEEL_DTYPE_Q4_1] = dot_q4_1,    [KEEL_DTYPE_Q5_1] = dot_q5_1,
    [KEEL_DTYPE_Q2_K] = tq_dot_q2_K, [KEEL_DTYPE_Q3_K] = tq_dot_q3_K,
    [KEEL_DTYPE_Q4_K] = tq_dot_q4_K, [KEEL_DTYPE_Q5_K] = tq_dot_q5_K,
    [KEEL_DTYPE_Q6_K] = tq_dot_q6_K,
};

tensor_dot_fn tensor_dot_get_(keel_dtype t)
{
    if ((unsigned)t >= KEEL_DTYPE_COUNT_) return NULL;
    if (tensor_use_avx2() && tensor_dot_avx2_[t]) return tensor_dot_avx2_[t];
    return tensor_dot_scalar_[t];
}

float tensor_vec_dot(keel_dtype t, int64_t n, const void *w, const void *x)
{
    tensor_dot_fn fn = tensor_dot_get_(t);
    return fn ? fn(n, w, x) : 0.0f;
}

/* ---- axpy_row --------------------------------------------------------------------- */

/* y += a * dequantize(row): dequantizes one block at a time on the stack. */
static void axpy_generic(keel_dtype t, int64_t n, float a, const void *row, float *y)
{
    tensor_dequant_fn deq = tensor_dequant_scalar_[t];
    int64_t bs = keel_dtype_block_size(t);
    size_t bb = keel_dtype_block_bytes(t);
    if (!deq || bs <= 0 || bs > QK_K) return;
    float tmp[QK_K];
    const uint8_t *p = row;
    for (int64_t i = 0; i < n; i += bs, p += bb) {
        deq(p, tmp, bs);
        for (int64_t j = 0; j < bs; j++)
            y[i + j] += a * tmp[j];
    }
}

void tensor_axpy_row(keel_dtype t, int64_t n, float a, const void *row, float *y)
{
    if ((unsigned)t >= KEEL_DTYPE_COUNT_) return;
    if (tensor_use_avx2() && tensor_axpy_avx2_[t]) {
        tensor_axpy_avx2_[t](n, a, row, y);
        return;
    }
    if (t == KEEL_DTYPE_F32) {
        const uint8_t *p = row;
        for (int64_t i = 0; i < n; i++)
            y[i] += a * rd_f32(p + 4 * i);
        return;
    }
    if (t == KEEL_DTYPE_F16 || t == KEEL_DTYPE_BF16) {
        const uint8_t *p = row;
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = rd_u16(p + 2 * i);
            y[i] += a * (t == KEEL_DTYPE_F16 ? tensor_f16_to_f32(h) : tensor_bf16_to_f32(h));
        }
        return;
    }
    axpy_generic(t, n, a, row, y);
}
