/*
 * half.c — IEEE binary16 and bfloat16 conversions in portable C, bit-exact
 * with F16C (_cvtss_sh(x, 0) / _cvtsh_ss): round to nearest even,
 * subnormals kept, overflow to infinity, NaNs quieted with their top
 * payload bits. bf16 rounds to nearest even and quiets NaNs.
 */
#include "tensor_impl.h"

float tensor_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1F;
    uint32_t mant = h & 0x3FF;
    uint32_t bits;
    if (exp == 0x1F) {
        /* inf, or NaN quieted with its payload kept (as F16C does) */
        bits = sign | 0x7F800000 | (mant ? 0x400000u | (mant << 13) : 0);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (mant << 13);
    } else {
        /* zero or subnormal: mant * 2^-24, exact in f32 */
        float v = (float)mant * 5.9604644775390625e-8f;
        memcpy(&bits, &v, 4);
        bits |= sign;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t tensor_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7FFFFFFF;
    if (ax > 0x7F800000) /* NaN: quiet, keep the top 9 payload bits */
        return (uint16_t)(sign | 0x7E00 | ((ax >> 13) & 0x3FF));
    if (ax >= 0x477FF000) /* >= 65520 (incl. inf) rounds to inf */
        return (uint16_t)(sign | 0x7C00);
    if (ax < 0x38800000) {
        /* below 2^-14: the f16 result is subnormal (or the smallest
         * normal after rounding). Adding 0.5f puts the 2^-24 unit at the
         * last mantissa bit, so the FPU rounds to nearest even for us. */
        float a;
        memcpy(&a, &ax, 4);
        float t = a + 0.5f;
        uint32_t tb;
        memcpy(&tb, &t, 4);
        return (uint16_t)(sign | (tb - 0x3F000000));
    }
    uint32_t odd = (ax >> 13) & 1;
    ax += 0xFFF + odd; /* round to nearest even at bit 13 */
    return (uint16_t)(sign | ((ax - 0x38000000) >> 13));
}

float tensor_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t tensor_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7FFFFFFF) > 0x7F800000) return (uint16_t)((x >> 16) | 0x40); /* quiet NaN */
    x += 0x7FFF + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}
