/*
 * gmask_avx2.c — the token mask applied to logits with AVX2 (compiled with
 * -mavx2..., called only when tensor_simd_level() is AVX2 or above and
 * AVX-512 is not in force): per 8 tokens, the mask byte spread to lanes and
 * a masked store of -inf, no branches per token.
 */
#include "grammar.h"

#include <immintrin.h>
#include <math.h>

void gram_apply_avx2(const uint64_t *mask, int32_t n_vocab, float *logits)
{
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    int32_t n_full = n_vocab / 64;
    for (int32_t w = 0; w < n_full; w++) {
        uint64_t x = mask[w];
        if (x == ~0ull) continue;
        float *p = logits + (size_t)w * 64;
        for (int q = 0; q < 8; q++) {
            __m256i b = _mm256_and_si256(_mm256_set1_epi32((int)((x >> (8 * q)) & 255u)), bit);
            _mm256_maskstore_ps(p + 8 * q, _mm256_cmpeq_epi32(b, _mm256_setzero_si256()), ninf);
        }
    }
    for (int32_t t = n_full * 64; t < n_vocab; t++)
        if (!((mask[t / 64] >> (t % 64)) & 1u)) logits[t] = -INFINITY;
}
