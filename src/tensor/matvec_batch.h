/*
 * matvec_batch.h — what the batched q8_0 row kernels of
 * matvec_batch_avx2.c and matvec_batch_avx512.c share (include only from
 * files built with AVX2 enabled): how the tokens of a batch are cut into
 * groups, the weight scales of a short last group, and the fold that puts
 * each block's int8 dot into a lane of its own (the one-token kernels of
 * both levels; matvec_avx2.c includes this file for it).
 *
 * The avx512 kernel walks a weight row once per group of at most `toks`
 * tokens. Groups are of about equal size: group g of G is [g n / G,
 * (g + 1) n / G). The packed activations
 * of a group are its own bytes, groups one after another; each kernel lays
 * out its records its own way (see each file).
 */
#ifndef KEEL_TENSOR_MATVEC_BATCH_H
#define KEEL_TENSOR_MATVEC_BATCH_H

#include "avx2_util.h"

static inline size_t mvb_up64(size_t n)
{
    return (n + 63) & ~(size_t)63;
}

/* Number of groups of a batch of n_tok tokens, at most toks each. */
static inline int mvb_groups(int n_tok, int toks)
{
    return (n_tok + toks - 1) / toks;
}

/* Group g of G: its first token and its size. */
static inline void mvb_group(int g, int G, int n_tok, int *t0, int *T)
{
    *t0 = g * n_tok / G;
    *T = (g + 1) * n_tok / G - *t0;
}

/* Packed bytes of n_tok tokens of n columns, given one group's size. */
static inline size_t mvb_pack_bytes(int64_t n, int n_tok, int toks, size_t (*grp_bytes)(int64_t nb, int T))
{
    int G = mvb_groups(n_tok, toks);
    size_t s = 0;
    for (int g = 0; g < G; g++) {
        int t0, T;
        mvb_group(g, G, n_tok, &t0, &T);
        s += grp_bytes(n / QK, T);
    }
    return s;
}

/* ---- one lane per block ---------------------------------------------------------------- */

/* Two blocks' partial-sum vectors (8 lanes each) -> [p0 lanes 0+2, p1 0+2,
 * p0 1+3, p1 1+3 | p0 4+6, p1 4+6, p0 5+7, p1 5+7]: mv_fold8's first step,
 * which a kernel can take as soon as a pair of blocks is done (exact int32
 * adds). */
static inline __m256i mv_fold2(__m256i p0, __m256i p1)
{
    return _mm256_add_epi32(_mm256_unpacklo_epi32(p0, p1), _mm256_unpackhi_epi32(p0, p1));
}

/* Four mv_fold2 results (blocks 0-1, 2-3, 4-5, 6-7) -> lane c = the sum of
 * block c's lanes. */
static inline __m256i mv_fold4x2(const __m256i a[4])
{
    __m256i b[2];
    for (int k = 0; k < 2; k++)
        b[k] = _mm256_add_epi32(_mm256_unpacklo_epi64(a[2 * k], a[2 * k + 1]),
                                _mm256_unpackhi_epi64(a[2 * k], a[2 * k + 1]));
    /* b[k] halves: blocks 4k..4k+3 over dwords 0-3, then over 4-7 */
    return _mm256_add_epi32(_mm256_permute2x128_si256(b[0], b[1], 0x20),
                            _mm256_permute2x128_si256(b[0], b[1], 0x31));
}

/* Eight blocks' partial-sum vectors p[0..7] (8 lanes each) -> lane c = the
 * sum of p[c]'s lanes (exact int32 adds). */
static inline __attribute__((always_inline)) __m256i mv_fold8(const __m256i p[8])
{
    __m256i a[4];
    for (int k = 0; k < 4; k++) a[k] = mv_fold2(p[2 * k], p[2 * k + 1]);
    return mv_fold4x2(a);
}

/* The f16 scales of m (0..8) blocks of `stride` bytes at p (block 0's
 * scale) as f32, lanes past m 0 (nothing past the m blocks is read). */
static inline __m256 mvb_scales_tail(const uint8_t *p, int m, size_t stride)
{
    _Alignas(32) float d[8];
    for (int c = 0; c < 8; c++) d[c] = c < m ? f16_load(p + (size_t)c * stride) : 0.0f;
    return _mm256_load_ps(d);
}

#endif
