/*
 * simd_avx2.h — register-only AVX2 helpers (horizontal sums and maxima,
 * pairwise adds) shared by the *_avx2.c files of every module: it needs
 * only <immintrin.h> and -mavx2, no tensor internals, so memory/'s
 * attention kernels use the same ones as tensor/'s.
 *
 * Why the pairwise adds are not vphaddd / vhaddps: those are 3 uops on AMD
 * (Zen 5 issues one every 2 cycles, measured with independent chains)
 * where a shuffle or an add issues ~3 per cycle; in the attention scores
 * the three per key block had cost ~6 of the ~15 cycles a block takes.
 * hadd2_* computes exactly what the instruction does (the same lanes
 * added, in the same order), so swapping one for the other changes no bit.
 */
#ifndef KEEL_TENSOR_SIMD_AVX2_H
#define KEEL_TENSOR_SIMD_AVX2_H

#include <immintrin.h>

/* _mm256_hadd_ps(x, y): [x0+x1, x2+x3, y0+y1, y2+y3 | x4+x5, x6+x7, y4+y5, y6+y7] */
static inline __m256 hadd2_ps(__m256 x, __m256 y)
{
    return _mm256_add_ps(_mm256_shuffle_ps(x, y, 0x88), _mm256_shuffle_ps(x, y, 0xDD));
}

/* _mm256_hadd_epi32(x, y), the same lanes as hadd2_ps */
static inline __m256i hadd2_epi32(__m256i x, __m256i y)
{
    __m256 a = _mm256_castsi256_ps(x), b = _mm256_castsi256_ps(y);
    return _mm256_add_epi32(_mm256_castps_si256(_mm256_shuffle_ps(a, b, 0x88)),
                            _mm256_castps_si256(_mm256_shuffle_ps(a, b, 0xDD)));
}

/* The eight floats of v folded by OP (halves, then pairs, then the last
 * two): hsum_ps, hmax_ps, hmin_ps. */
#define SIMD_HFOLD_PS(NAME, OP_PS, OP_SS)                                                          \
    static inline float NAME(__m256 v)                                                             \
    {                                                                                              \
        __m128 m = OP_PS(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));                 \
        m = OP_PS(m, _mm_movehl_ps(m, m));                                                         \
        m = OP_SS(m, _mm_movehdup_ps(m));                                                          \
        return _mm_cvtss_f32(m);                                                                   \
    }
SIMD_HFOLD_PS(hsum_ps, _mm_add_ps, _mm_add_ss)
SIMD_HFOLD_PS(hmax_ps, _mm_max_ps, _mm_max_ss)
SIMD_HFOLD_PS(hmin_ps, _mm_min_ps, _mm_min_ss)
#undef SIMD_HFOLD_PS

static inline int hsum_epi32(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

#endif
