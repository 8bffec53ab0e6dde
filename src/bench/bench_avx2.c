/*
 * bench_avx2.c — the AVX2/FMA reference loops of the benchmarks (compiled
 * with -mavx2 -mfma; called only when the CPU has the avx2 level):
 * streaming reads (the read-bandwidth reference) and a register-only FMA
 * loop (the fp32 peak the matrix products are compared with).
 */
#include "bench.h"

#include <immintrin.h>

uint64_t bench_read_avx2(const uint8_t *p, size_t bytes, size_t pf)
{
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 128 <= bytes; i += 128) {
        if (pf) {
            /* both lines of the step, pf bytes ahead (past the end: a hint, no fault) */
            __builtin_prefetch(p + i + pf, 0, 3);
            __builtin_prefetch(p + i + pf + 64, 0, 3);
        }
        a0 = _mm256_xor_si256(a0, _mm256_load_si256((const __m256i *)(const void *)(p + i)));
        a1 = _mm256_xor_si256(a1, _mm256_load_si256((const __m256i *)(const void *)(p + i + 32)));
        a2 = _mm256_xor_si256(a2, _mm256_load_si256((const __m256i *)(const void *)(p + i + 64)));
        a3 = _mm256_xor_si256(a3, _mm256_load_si256((const __m256i *)(const void *)(p + i + 96)));
    }
    a0 = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
    return (uint64_t)_mm256_extract_epi64(a0, 0) ^ (uint64_t)_mm256_extract_epi64(a0, 3);
}

/* 12 independent chains (more than FMA latency x ports on current cores),
 * acc = acc * a + b: bounded, never subnormal. Returns a value that depends
 * on every chain so the loop is kept; 2 * 8 * 12 flops per iteration. */
float bench_fma_avx2(int64_t iters)
{
    __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-6f);
    __m256 c[12];
    for (int k = 0; k < 12; k++) c[k] = _mm256_set1_ps(1.0f + (float)k * 1e-3f);
    for (int64_t i = 0; i < iters; i++) {
#pragma GCC unroll 12
        for (int k = 0; k < 12; k++) c[k] = _mm256_fmadd_ps(c[k], a, b);
    }
    __m256 s = c[0];
    for (int k = 1; k < 12; k++) s = _mm256_add_ps(s, c[k]);
    return _mm256_cvtss_f32(s);
}
