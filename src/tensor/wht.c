/*
 * wht.c — the normalized fast Walsh-Hadamard transform (scalar reference
 * and dispatch) and the seeded sign diagonal used by rotated KV storage.
 *
 * Transform: stages h = 1, 2, 4, ..., n/2 of butterflies (a, b) ->
 * (a + b, a - b) over pairs (j, j + h), then every element times
 * 1/sqrt(n). H/sqrt(n) is orthonormal and symmetric, so it is its own
 * inverse. wht_avx2.c performs the same additions in the same order
 * (and the same final multiply), so both paths give identical floats.
 *
 * Signs (a storage format: never change): signs[i] = -1 when the top bit
 * of splitmix64(seed + (i + 1) * 0x9e3779b97f4a7c15) is set, else +1, i.e.
 * the (i+1)-th output of a splitmix64 generator started at seed.
 */
#include "tensor_impl.h"

static bool wht_size_ok(int64_t n)
{
    return n >= 2 && n <= 4096 && (n & (n - 1)) == 0;
}

static float wht_scale(int64_t n)
{
    return (float)(1.0 / sqrt((double)n));
}

static void wht_scalar(float *x, int64_t n, const float *pre, const float *post)
{
    if (pre)
        for (int64_t i = 0; i < n; i++)
            x[i] *= pre[i];
    for (int64_t h = 1; h < n; h *= 2) {
        for (int64_t i = 0; i < n; i += 2 * h) {
            for (int64_t j = i; j < i + h; j++) {
                float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
        }
    }
    float s = wht_scale(n);
    for (int64_t i = 0; i < n; i++)
        x[i] *= s;
    if (post)
        for (int64_t i = 0; i < n; i++)
            x[i] *= post[i];
}

static void wht_dispatch(float *x, int64_t n, const float *pre, const float *post)
{
    if (!x || !wht_size_ok(n)) return;
    if (n >= 8 && tensor_use_avx2())
        tensor_wht_avx2(x, n, pre, post);
    else
        wht_scalar(x, n, pre, post);
}

void tensor_wht(float *x, int64_t n)
{
    wht_dispatch(x, n, NULL, NULL);
}

void tensor_wht_forward(float *x, int64_t n, const float *signs)
{
    wht_dispatch(x, n, signs, NULL);
}

void tensor_wht_inverse(float *x, int64_t n, const float *signs)
{
    wht_dispatch(x, n, NULL, signs);
}

void tensor_wht_signs(uint64_t seed, int64_t n, float *signs)
{
    for (int64_t i = 0; i < n; i++) {
        uint64_t z = seed + (uint64_t)(i + 1) * 0x9e3779b97f4a7c15ull;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        signs[i] = (z >> 63) ? -1.0f : 1.0f;
    }
}
