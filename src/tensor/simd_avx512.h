/*
 * simd_avx512.h — register-only AVX-512 helpers shared by the *_avx512.c
 * files of every module (needs only <immintrin.h> and -mavx512f/bw): the
 * transposes that put one 32-byte q8_0 block per 32-bit lane, used by the
 * attention's decode kernel (one key cell per lane) and the batched
 * matvec (one weight block per lane).
 */
#ifndef KEEL_TENSOR_SIMD_AVX512_H
#define KEEL_TENSOR_SIMD_AVX512_H

#include <immintrin.h>

/* Sixteen rows of 32 bytes given as z[i] = [row i | row i + 4] and
 * z[4 + i] = [row 8 + i | row 12 + i] (i < 4) -> g[i] (i < 8): lane c =
 * bytes 4i..4i+3 of row c, each byte xor bias. 24 shuffles, 8 xors. */
static inline __attribute__((always_inline)) void simd512_t16x32(const __m512i z[8], __m512i g[8],
                                                                 __m512i bias)
{
    /* z[i]'s 128-bit lanes: row a dwords 0-3, a 4-7, row b 0-3, b 4-7 */
    __m512i t[8], u[8];
#pragma GCC unroll 2
    for (int h = 0; h < 8; h += 4) {
        t[h] = _mm512_unpacklo_epi32(z[h], z[h + 1]);
        t[h + 1] = _mm512_unpackhi_epi32(z[h], z[h + 1]);
        t[h + 2] = _mm512_unpacklo_epi32(z[h + 2], z[h + 3]);
        t[h + 3] = _mm512_unpackhi_epi32(z[h + 2], z[h + 3]);
        u[h] = _mm512_unpacklo_epi64(t[h], t[h + 2]);
        u[h + 1] = _mm512_unpackhi_epi64(t[h], t[h + 2]);
        u[h + 2] = _mm512_unpacklo_epi64(t[h + 1], t[h + 3]);
        u[h + 3] = _mm512_unpackhi_epi64(t[h + 1], t[h + 3]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        g[i] =
            _mm512_xor_si512(_mm512_shuffle_i32x4(u[i], u[4 + i], _MM_SHUFFLE(2, 0, 2, 0)), bias);
        g[4 + i] =
            _mm512_xor_si512(_mm512_shuffle_i32x4(u[i], u[4 + i], _MM_SHUFFLE(3, 1, 3, 1)), bias);
    }
}

/* The same for eight rows of 32 bytes in 256-bit vectors (r[c] = row c):
 * g[i] lane c = bytes 4i..4i+3 of row c, xor bias. Where a zmm operation
 * takes two 256-bit halves (Zen 4) this costs half of simd512_t16x32 run
 * with rows 8-15 zero. 24 shuffles, 8 xors. */
static inline __attribute__((always_inline)) void simd256_t8x32(const __m256i r[8], __m256i g[8],
                                                                __m256i bias)
{
    __m256i t[8], u[8];
#pragma GCC unroll 2
    for (int k = 0; k < 8; k += 4) {
        t[k] = _mm256_unpacklo_epi32(r[k], r[k + 1]);
        t[k + 1] = _mm256_unpackhi_epi32(r[k], r[k + 1]);
        t[k + 2] = _mm256_unpacklo_epi32(r[k + 2], r[k + 3]);
        t[k + 3] = _mm256_unpackhi_epi32(r[k + 2], r[k + 3]);
        u[k] = _mm256_unpacklo_epi64(t[k], t[k + 2]);
        u[k + 1] = _mm256_unpackhi_epi64(t[k], t[k + 2]);
        u[k + 2] = _mm256_unpacklo_epi64(t[k + 1], t[k + 3]);
        u[k + 3] = _mm256_unpackhi_epi64(t[k + 1], t[k + 3]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        g[i] = _mm256_xor_si256(_mm256_permute2x128_si256(u[i], u[4 + i], 0x20), bias);
        g[4 + i] = _mm256_xor_si256(_mm256_permute2x128_si256(u[i], u[4 + i], 0x31), bias);
    }
}

#endif
