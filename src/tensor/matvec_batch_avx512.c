/*
 * matvec_batch_avx512.c — the batched q8_0 row kernel with AVX-512 VNNI
 * (tensor_mvb_avx512_, the avx512 level): bit for bit what matvec_avx2.c's
 * row kernel gives each token alone, as matvec_batch_avx2.c, in fewer
 * instructions per block and token.
 *
 * The AVX2 kernel keeps two 8-lane accumulators per row: within each group
 * of eight blocks, block k goes to a[k & 1] (the tail blocks past the last
 * group all to a[0]), and the row's value is hsum(a[0] + a[1]). Here one
 * zmm holds both, [a[0] | a[1]], and takes two consecutive blocks (2j,
 * 2j + 1) of a group at once:
 *
 * - int32 lane l of a block's dot is sum_{4l <= e < 4l + 4} w_e x_e in the
 *   AVX2 kernel (maddubs then madd, exact: |x| <= 127 as keel quantizes).
 *   vpdpbusd sums the same four products into lane l, but wants one operand
 *   unsigned: the activation's quants are packed as u = x + 128 (x xor
 *   0x80), so lane l = sum (x + 128) w, and the accumulator starts at
 *   -128 sum w over the lane's four weights. That start depends on the
 *   weights only: one vpdpbusd and one subtraction per pair of blocks,
 *   shared by every token of the group. It leaves sum w x exactly (|lane|
 *   <= 4 * 255 * 128 before the start is added: no overflow).
 * - the scale vector [s_2j x 8 | s_2j+1 x 8], s_b = d_w(b) d_x(b) (the same
 *   single IEEE product as the AVX2 kernel's), is one vpermps of the
 *   token's eight products of the group (one 8-lane multiply per token and
 *   group, as there).
 * - one convert and one FMA for the two blocks: the lower half does a[0]'s
 *   FMA, the upper half a[1]'s, in the same order as the AVX2 kernel.
 * - the tail blocks run on the lower half alone, with 256-bit vpdpbusd;
 *   the end is hsum(lo + hi), the AVX2 kernel's hsum(a[0] + a[1]).
 *
 * Per pair of blocks and token: a load, a register copy, vpdpbusd, vpermps
 * (from the token's scales in memory), a convert and an FMA, against two
 * loads (the bias and the broadcast scale), vpdpbusd, a convert and an FMA
 * per block and token before (256-bit, biased by the activation's sums).
 * Sixteen tokens per pass over a row (one zmm accumulator each).
 */
#include "matvec_batch.h"

#define MVB_TOKS 16

/* ---- packed activations ------------------------------------------------------------ */

/* One group of T tokens: xu [nb2][T][64] u8 (x + 128 of blocks 2j and 2j + 1
 * of a token side by side, nb2 = ceil(nb / 2), zero past nb) | dx
 * (matvec_batch.h). */
static size_t grp_xu(int64_t nb, int T)
{
    return mvb_up64((size_t)((nb + 1) / 2) * (size_t)T * 64);
}

static size_t grp_bytes(int64_t nb, int T)
{
    return grp_xu(nb, T) + mvb_dx_bytes(nb, T);
}

static size_t pack_q8_0_bytes(int64_t n, int n_tok)
{
    return mvb_pack_bytes(n, n_tok, MVB_TOKS, grp_bytes);
}

static void pack_q8_0(const void *const *xv, int n_tok, int64_t n, void *packed)
{
    int64_t nb = n / QK;
    int G = mvb_groups(n_tok, MVB_TOKS);
    const __m256i m80 = _mm256_set1_epi8((char)0x80);
    uint8_t *o = packed;
    for (int g = 0; g < G; g++) {
        int t0, T;
        mvb_group(g, G, n_tok, &t0, &T);
        float *dx = (float *)(void *)(o + grp_xu(nb, T));
        for (int t = 0; t < T; t++) {
            const uint8_t *x = xv[t0 + t];
            for (int64_t b = 0; b < nb; b++) {
                uint8_t *u = o + ((size_t)(b / 2) * (size_t)T + (size_t)t) * 64 + (size_t)(b % 2) * 32;
                _mm256_store_si256((__m256i *)(void *)u,
                                   _mm256_xor_si256(loadu_256(x + (size_t)b * Q8_0_BYTES + 2), m80));
            }
            if (nb % 2) memset(o + ((size_t)(nb / 2) * (size_t)T + (size_t)t) * 64 + 32, 0, 32);
            mvb_pack_dx(x, nb, T, t, dx);
        }
        o += grp_bytes(nb, T);
    }
}

/* ---- the kernel --------------------------------------------------------------------- */

/* One row against the T tokens of a group. */
static inline __attribute__((always_inline)) void q8_0_row(int T, const uint8_t *w, int64_t nb,
                                                           const uint8_t *xu, const float *dxp, bool pf,
                                                           uintptr_t last, float *out)
{
    const __m512i m80 = _mm512_set1_epi8((char)0x80);
    __m512 a[MVB_TOKS];
#pragma GCC unroll 16
    for (int t = 0; t < T; t++) a[t] = _mm512_setzero_ps();
    int64_t b = 0;
    for (; b + 8 <= nb; b += 8) {
        const uint8_t *p = w + (size_t)b * Q8_0_BYTES;
        if (pf) mv_pf(p, last, 5);
        __m256 dw = f16x8_strided(p, Q8_0_BYTES);
        const float *d8 = dxp + (size_t)b * (size_t)T;
        /* each token's eight scale products, in the lower half (the upper
         * half is zero and never selected) */
        _Alignas(64) float sc[MVB_TOKS][16];
#pragma GCC unroll 16
        for (int t = 0; t < T; t++)
            _mm512_store_ps(sc[t], _mm512_zextps256_ps512(_mm256_mul_ps(dw, _mm256_load_ps(d8 + 8 * t))));
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            const uint8_t *pj = p + (size_t)(2 * j) * Q8_0_BYTES + 2;
            __m512i wz = _mm512_inserti64x4(_mm512_castsi256_si512(loadu_256(pj)), loadu_256(pj + Q8_0_BYTES), 1);
            /* -128 sum w per lane */
            __m512i st = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), m80, wz));
            const __m512i idx = _mm512_set_epi32(2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j + 1,
                                                 2 * j + 1, 2 * j + 1, 2 * j, 2 * j, 2 * j, 2 * j, 2 * j, 2 * j,
                                                 2 * j, 2 * j);
            const uint8_t *xj = xu + (size_t)(b / 2 + j) * (size_t)T * 64;
#pragma GCC unroll 16
            for (int t = 0; t < T; t++) {
                __m512i d = _mm512_dpbusd_epi32(st, _mm512_load_si512((const void *)(xj + 64 * t)), wz);
                __m512 s = _mm512_permutexvar_ps(idx, _mm512_load_ps(sc[t]));
                a[t] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(d), a[t]);
            }
        }
    }
    const __m256i m80y = _mm256_set1_epi8((char)0x80);
    __m256 lo[MVB_TOKS];
#pragma GCC unroll 16
    for (int t = 0; t < T; t++) lo[t] = _mm512_castps512_ps256(a[t]);
    for (; b < nb; b++) {
        const uint8_t *p = w + (size_t)b * Q8_0_BYTES;
        __m256i wq = loadu_256(p + 2);
        __m256i st = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_dpbusd_epi32(_mm256_setzero_si256(), m80y, wq));
        float dw = f16_load(p);
        const uint8_t *xb = xu + (size_t)(b / 2) * (size_t)T * 64 + (size_t)(b % 2) * 32;
        const float *d8 = dxp + (size_t)(b & ~(int64_t)7) * (size_t)T + (size_t)(b & 7);
#pragma GCC unroll 16
        for (int t = 0; t < T; t++) {
            __m256i d = _mm256_dpbusd_epi32(st, _mm256_load_si256((const __m256i *)(const void *)(xb + 64 * t)), wq);
            lo[t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * d8[8 * t]), _mm256_cvtepi32_ps(d), lo[t]);
        }
    }
#pragma GCC unroll 16
    for (int t = 0; t < T; t++) out[t] = hsum_ps(_mm256_add_ps(lo[t], _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a[t]), 1))));
}

static void mvb_q8_0(int64_t nr, int64_t n, const uint8_t *W, size_t rb, int n_tok, const void *packed, float *y,
                     size_t ys)
{
    uintptr_t last = (uintptr_t)W + (nr > 0 ? (size_t)nr * rb - 1 : 0);
    int64_t nb = n / QK;
    int G = mvb_groups(n_tok, MVB_TOKS);
    for (int64_t r = 0; r < nr; r++) {
        const uint8_t *w = W + (size_t)r * rb;
        const uint8_t *o = packed;
        for (int g = 0; g < G; g++) {
            int t0, T;
            mvb_group(g, G, n_tok, &t0, &T);
            const uint8_t *xu = o;
            const float *dx = (const float *)(const void *)(o + grp_xu(nb, T));
            float v[MVB_TOKS];
            bool pf = g == 0; /* the first pass brings the row in */
            switch (T) {
#define MVB_CASE(N)                                                                                \
    case N: q8_0_row(N, w, nb, xu, dx, pf, last, v); break;
            MVB_CASE(16) MVB_CASE(15) MVB_CASE(14) MVB_CASE(13) MVB_CASE(12) MVB_CASE(11) MVB_CASE(10)
            MVB_CASE(9) MVB_CASE(8) MVB_CASE(7) MVB_CASE(6) MVB_CASE(5) MVB_CASE(4) MVB_CASE(3)
            MVB_CASE(2)
#undef MVB_CASE
            default: q8_0_row(1, w, nb, xu, dx, pf, last, v); break;
            }
            for (int t = 0; t < T; t++) y[(size_t)(t0 + t) * ys + (size_t)r] = v[t];
            o += grp_bytes(nb, T);
        }
    }
}

const tensor_mvb_kernel tensor_mvb_avx512_[KEEL_DTYPE_COUNT_] = {
    [KEEL_DTYPE_Q8_0] = {mvb_q8_0, pack_q8_0_bytes, pack_q8_0},
};
