/*
 * gmask_avx512.c — the token mask applied to logits with AVX-512 (compiled
 * with -mavx512f..., called only when tensor_simd_level() is AVX512): four
 * masked stores of -inf per 64 tokens, no loads and no branches per token,
 * so the pass costs what writing the row costs, whatever the mask.
 */
#include "grammar.h"

#include <immintrin.h>
#include <math.h>

void gram_apply_avx512(const uint64_t *mask, int32_t n_vocab, float *logits)
{
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    int32_t n_full = n_vocab / 64;
    for (int32_t w = 0; w < n_full; w++) {
        uint64_t x = mask[w];
        if (x == ~0ull) continue;
        float *p = logits + (size_t)w * 64;
        _mm512_mask_storeu_ps(p, (__mmask16)~x, ninf);
        _mm512_mask_storeu_ps(p + 16, (__mmask16)(~x >> 16), ninf);
        _mm512_mask_storeu_ps(p + 32, (__mmask16)(~x >> 32), ninf);
        _mm512_mask_storeu_ps(p + 48, (__mmask16)(~x >> 48), ninf);
    }
    for (int32_t t = n_full * 64; t < n_vocab; t++)
        if (!((mask[t / 64] >> (t % 64)) & 1u)) logits[t] = -INFINITY;
}
