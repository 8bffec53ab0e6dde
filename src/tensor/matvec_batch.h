/*
 * matvec_batch.h — what the batched q8_0 row kernels of
 * matvec_batch_avx2.c and matvec_batch_avx512.c share (include only from
 * files built with AVX2 enabled): the prefetch, the weight scales eight at
 * a time, how the tokens of a batch are cut into groups, and the layout of
 * the activations' block scales in the packed form.
 *
 * Both kernels walk a weight row once per group of at most `toks` tokens.
 * Groups are of about equal size: group g of G is [g n / G, (g + 1) n / G)
 * (9 tokens in groups of 4: 3 + 3 + 3). The packed activations of a group
 * are its own bytes, groups one after another, each part 64-byte aligned;
 * each kernel lays out the quants its own way; the avx2 kernel keeps the
 * block scales as dx [nb8 / 8][T][8] f32 (the eight scales of a token's
 * blocks 8i..8i+7 together, zero past nb), the avx512 one its own records
 * of sixteen blocks (matvec_batch_avx512.c).
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

/* Bytes of dx [nb8 / 8][T][8] f32. */
static inline size_t mvb_dx_bytes(int64_t nb, int T)
{
    size_t nb8 = ((size_t)nb + 7) & ~(size_t)7;
    return mvb_up64(nb8 * (size_t)T * sizeof(float));
}

/* Token t's block scales (x: its q8_0 row of nb blocks) into a group's dx. */
static inline void mvb_pack_dx(const uint8_t *x, int64_t nb, int T, int t, float *dx)
{
    int64_t nb8 = (nb + 7) & ~(int64_t)7;
    for (int64_t b = 0; b < nb8; b++)
        dx[(size_t)(b / 8) * (size_t)T * 8 + (size_t)t * 8 + (size_t)(b % 8)] =
            b < nb ? f16_load(x + (size_t)b * Q8_0_BYTES) : 0.0f;
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

#endif
