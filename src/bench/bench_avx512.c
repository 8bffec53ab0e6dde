/*
 * bench_avx512.c — the AVX-512 register-only FMA loop (the fp32 peak at the
 * avx512 level; called only when the CPU has it). As bench_fma_avx2, on
 * zmm: 2 * 16 * 12 flops per iteration.
 */
#include "bench.h"

#include <immintrin.h>

float bench_fma_avx512(int64_t iters)
{
    __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-6f);
    __m512 c[12];
    for (int k = 0; k < 12; k++) c[k] = _mm512_set1_ps(1.0f + (float)k * 1e-3f);
    for (int64_t i = 0; i < iters; i++) {
#pragma GCC unroll 12
        for (int k = 0; k < 12; k++) c[k] = _mm512_fmadd_ps(c[k], a, b);
    }
    __m512 s = c[0];
    for (int k = 1; k < 12; k++) s = _mm512_add_ps(s, c[k]);
    return _mm512_reduce_add_ps(s);
}
