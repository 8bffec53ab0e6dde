/*
 * matvec_batch_avx2.c — batched matrix-vector kernels (tensor_mvb_avx2_):
 * every weight row read once and dotted against up to TENSOR_MV_BATCH_MAX
 * activations (a speculative verify batch), each token's result bit for bit
 * what matvec_avx2.c's row kernel gives that token alone.
 *
 * Bit-identity is by construction: per row and token the same integer lanes
 * (the int8 dots are exact), the same scale products (f16 weight scale x
 * activation scale, one IEEE multiply), the same FMAs into the same two
 * accumulators (blocks alternate between them within each group of eight,
 * the tail goes to the first) and the same horizontal sum. What changes is
 * only what is shared: the weight block is loaded, its sign taken and its
 * scales converted once per group of up to four tokens (four pairs of
 * accumulators fit the 16 ymm registers), and the row comes from memory
 * once (later groups find it in L1).
 *
 * q8_0 only; other dtypes run the row kernel token by token over L1-sized
 * chunks of rows (tensor_matvec_batch in matmul.c). The AVX-512 VNNI form
 * is in matvec_batch_avx512.c.
 */
#include "matvec_batch.h"

#define MVB_TOKS 4 /* tokens per pass over a row (four accumulator pairs fill the 16 ymm registers) */

/* ---- packed activations ------------------------------------------------------------ */

/* One group of T tokens: qs [nb][T][32] i8 (block b of every token side by
 * side) | dx (matvec_batch.h). */
static size_t grp_qs(int64_t nb, int T)
{
    return mvb_up64((size_t)nb * (size_t)T * 32);
}

static size_t grp_bytes(int64_t nb, int T)
{
    return grp_qs(nb, T) + mvb_dx_bytes(nb, T);
}

static size_t pack_q8_0_bytes(int64_t n, int n_tok)
{
    return mvb_pack_bytes(n, n_tok, MVB_TOKS, grp_bytes);
}

static void pack_q8_0(const void *const *xv, int n_tok, int64_t n, void *packed)
{
    int64_t nb = n / QK;
    int G = mvb_groups(n_tok, MVB_TOKS);
    uint8_t *o = packed;
    for (int g = 0; g < G; g++) {
        int t0, T;
        mvb_group(g, G, n_tok, &t0, &T);
        float *dx = (float *)(void *)(o + grp_qs(nb, T));
        for (int t = 0; t < T; t++) {
            const uint8_t *x = xv[t0 + t];
            for (int64_t b = 0; b < nb; b++)
                memcpy(o + ((size_t)b * (size_t)T + (size_t)t) * 32, x + (size_t)b * Q8_0_BYTES + 2, 32);
            mvb_pack_dx(x, nb, T, t, dx);
        }
        o += grp_bytes(nb, T);
    }
}

/* ---- the kernel --------------------------------------------------------------------- */

/* One row against the T tokens of a group: matvec_avx2.c's rows_q8_0 for
 * each (the weight block's load, sign and scale conversion shared). */
static inline __attribute__((always_inline)) void q8_0_row(int T, const uint8_t *w, int64_t nb,
                                                           const uint8_t *qs, const float *dxp, bool pf,
                                                           uintptr_t last, float *out)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 a[MVB_TOKS][2];
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) a[t][0] = a[t][1] = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 8 <= nb; b += 8) {
        const uint8_t *p = w + (size_t)b * Q8_0_BYTES;
        if (pf) mv_pf(p, last, 5);
        __m256 dw = f16x8_strided(p, Q8_0_BYTES);
        const float *d8 = dxp + (size_t)b * (size_t)T;
        _Alignas(32) float sc[MVB_TOKS][8];
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) _mm256_store_ps(sc[t], _mm256_mul_ps(dw, _mm256_load_ps(d8 + 8 * t)));
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            __m256i wq = loadu_256(p + (size_t)k * Q8_0_BYTES + 2), wa = _mm256_sign_epi8(wq, wq);
            const uint8_t *q = qs + (size_t)(b + k) * (size_t)T * 32;
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                __m256i xq = _mm256_load_si256((const __m256i *)(const void *)(q + 32 * t));
                __m256i d = _mm256_madd_epi16(_mm256_maddubs_epi16(wa, _mm256_sign_epi8(xq, wq)), ones);
                a[t][k & 1] = _mm256_fmadd_ps(_mm256_broadcast_ss(&sc[t][k]), _mm256_cvtepi32_ps(d), a[t][k & 1]);
            }
        }
    }
    for (; b < nb; b++) {
        const uint8_t *p = w + (size_t)b * Q8_0_BYTES;
        __m256i wq = loadu_256(p + 2), wa = _mm256_sign_epi8(wq, wq);
        float dw = f16_load(p);
        const uint8_t *q = qs + (size_t)b * (size_t)T * 32;
        const float *d8 = dxp + (size_t)(b & ~(int64_t)7) * (size_t)T + (size_t)(b & 7);
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            __m256i xq = _mm256_load_si256((const __m256i *)(const void *)(q + 32 * t));
            __m256i d = _mm256_madd_epi16(_mm256_maddubs_epi16(wa, _mm256_sign_epi8(xq, wq)), ones);
            a[t][0] = _mm256_fmadd_ps(_mm256_set1_ps(dw * d8[8 * t]), _mm256_cvtepi32_ps(d), a[t][0]);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) out[t] = hsum_ps(_mm256_add_ps(a[t][0], a[t][1]));
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
            const uint8_t *qs = o;
            const float *dx = (const float *)(const void *)(o + grp_qs(nb, T));
            float v[MVB_TOKS];
            bool pf = g == 0; /* the first pass brings the row in */
            switch (T) {
            case 4: q8_0_row(4, w, nb, qs, dx, pf, last, v); break;
            case 3: q8_0_row(3, w, nb, qs, dx, pf, last, v); break;
            case 2: q8_0_row(2, w, nb, qs, dx, pf, last, v); break;
            default: q8_0_row(1, w, nb, qs, dx, pf, last, v); break;
            }
            for (int t = 0; t < T; t++) y[(size_t)(t0 + t) * ys + (size_t)r] = v[t];
            o += grp_bytes(nb, T);
        }
    }
}

const tensor_mvb_kernel tensor_mvb_avx2_[KEEL_DTYPE_COUNT_] = {
    [KEEL_DTYPE_Q8_0] = {mvb_q8_0, pack_q8_0_bytes, pack_q8_0},
};
