/*
 * matvec_batch_avx512.c — the batched q8_0 row kernel with AVX-512 VNNI
 * (tensor_mvb_avx512_, the avx512 level): bit for bit what matvec_avx2.c's
 * row kernel gives each token alone, as matvec_batch_avx2.c, in fewer
 * instructions per block and token.
 *
 * 256-bit vectors throughout, so that the lanes are the AVX2 kernel's: its
 * int32 lane j of a block's dot is sum_{4j <= e < 4j + 4} w_e x_e (maddubs
 * then madd, exact: |x| <= 127 as keel quantizes). vpdpbusd sums the same
 * four products into lane j in one instruction, but wants an unsigned
 * operand: u = w xor 0x80 = w + 128, so lane j = sum (w + 128) x, and the
 * accumulator starts at -128 sum x over the lane's four values (made once
 * per activation, in the prep), which leaves sum w x exactly. Then the same
 * convert, scale product and FMA into the same accumulator as the AVX2
 * kernel. EVEX encoding gives 32 ymm registers: eight tokens per pass.
 */
#include "avx2_util.h"

#define MVB_PF   3072
#define MVB_TOKS 8

static inline void mvb_pf(const uint8_t *cur, uintptr_t last, int lines)
{
    uintptr_t a = (uintptr_t)cur + MVB_PF;
    for (int k = 0; k < lines; k++, a += 64) __builtin_prefetch((const void *)(a < last ? a : last), 0, 3);
}

static inline __m256 mvb_f16x8_strided(const uint8_t *p, size_t stride)
{
    _Alignas(16) uint16_t h[8];
    for (int k = 0; k < 8; k++) h[k] = rd_u16(p + (size_t)k * stride);
    return _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(const void *)h));
}

/* ---- packed activations ------------------------------------------------------------ */

/* Groups of about equal size, at most MVB_TOKS tokens each; group g is
 * [g n / G, (g + 1) n / G). */
static inline int mvb_groups(int n_tok)
{
    return (n_tok + MVB_TOKS - 1) / MVB_TOKS;
}

static inline size_t up64(size_t n)
{
    return (n + 63) & ~(size_t)63;
}

/* One group of T tokens: qs [nb][T][32] i8 | corr [nb][T][8] i32 (-128 x
 * the sum of each lane's four values) | dx [nb8 / 8][T][8] f32 (zero past
 * nb), each part 64-byte aligned. */
static size_t grp_qs(int64_t nb, int T)
{
    return up64((size_t)nb * (size_t)T * 32);
}

static size_t grp_bytes(int64_t nb, int T)
{
    size_t nb8 = ((size_t)nb + 7) & ~(size_t)7;
    return 2 * grp_qs(nb, T) + up64(nb8 * (size_t)T * sizeof(float));
}

static size_t pack_q8_0_bytes(int64_t n, int n_tok)
{
    int64_t nb = n / QK;
    int G = mvb_groups(n_tok);
    size_t s = 0;
    for (int g = 0; g < G; g++) s += grp_bytes(nb, (g + 1) * n_tok / G - g * n_tok / G);
    return s;
}

static void pack_q8_0(const void *const *xv, int n_tok, int64_t n, void *packed)
{
    int64_t nb = n / QK, nb8 = (nb + 7) & ~(int64_t)7;
    int G = mvb_groups(n_tok);
    uint8_t *o = packed;
    for (int g = 0; g < G; g++) {
        int t0 = g * n_tok / G, T = (g + 1) * n_tok / G - t0;
        uint8_t *qs = o;
        int32_t *corr = (int32_t *)(void *)(o + grp_qs(nb, T));
        float *dx = (float *)(void *)(o + 2 * grp_qs(nb, T));
        for (int t = 0; t < T; t++) {
            const uint8_t *x = xv[t0 + t];
            for (int64_t b = 0; b < nb8; b++) {
                float d = 0.0f;
                if (b < nb) {
                    const uint8_t *xb = x + (size_t)b * Q8_0_BYTES;
                    size_t k = (size_t)b * (size_t)T + (size_t)t;
                    memcpy(qs + k * 32, xb + 2, 32);
                    for (int j = 0; j < 8; j++) {
                        int sum = 0;
                        for (int e = 0; e < 4; e++) sum += (int8_t)xb[2 + 4 * j + e];
                        corr[k * 8 + (size_t)j] = -128 * sum;
                    }
                    d = f16_load(xb);
                }
                dx[(size_t)(b / 8) * (size_t)T * 8 + (size_t)t * 8 + (size_t)(b % 8)] = d;
            }
        }
        o += grp_bytes(nb, T);
    }
}

/* ---- the kernel --------------------------------------------------------------------- */

/* lane j: sum (w + 128) x + corr = sum w x over the lane's four values */
static inline __m256i blk_dot(__m256i u, const uint8_t *q, const uint8_t *c)
{
    return _mm256_dpbusd_epi32(_mm256_load_si256((const __m256i *)(const void *)c), u,
                               _mm256_load_si256((const __m256i *)(const void *)q));
}

static inline __attribute__((always_inline)) void q8_0_row(int T, const uint8_t *w, int64_t nb,
                                                           const uint8_t *qs, const uint8_t *cs, const float *dxp,
                                                           bool pf, uintptr_t last, float *out)
{
    const __m256i m80 = _mm256_set1_epi8((char)0x80);
    __m256 a[MVB_TOKS][2];
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) a[t][0] = a[t][1] = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 8 <= nb; b += 8) {
        const uint8_t *p = w + (size_t)b * Q8_0_BYTES;
        if (pf) mvb_pf(p, last, 5);
        __m256 dw = mvb_f16x8_strided(p, Q8_0_BYTES);
        const float *d8 = dxp + (size_t)b * (size_t)T;
        _Alignas(32) float sc[MVB_TOKS][8];
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) _mm256_store_ps(sc[t], _mm256_mul_ps(dw, _mm256_load_ps(d8 + 8 * t)));
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            __m256i u = _mm256_xor_si256(loadu_256(p + (size_t)k * Q8_0_BYTES + 2), m80);
            size_t off = (size_t)(b + k) * (size_t)T * 32;
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                __m256i d = blk_dot(u, qs + off + 32 * t, cs + off + 32 * t);
                a[t][k & 1] = _mm256_fmadd_ps(_mm256_broadcast_ss(&sc[t][k]), _mm256_cvtepi32_ps(d), a[t][k & 1]);
            }
        }
    }
    for (; b < nb; b++) {
        const uint8_t *p = w + (size_t)b * Q8_0_BYTES;
        __m256i u = _mm256_xor_si256(loadu_256(p + 2), m80);
        float dw = f16_load(p);
        size_t off = (size_t)b * (size_t)T * 32;
        const float *d8 = dxp + (size_t)(b & ~(int64_t)7) * (size_t)T + (size_t)(b & 7);
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            __m256i d = blk_dot(u, qs + off + 32 * t, cs + off + 32 * t);
            a[t][0] = _mm256_fmadd_ps(_mm256_set1_ps(dw * d8[8 * t]), _mm256_cvtepi32_ps(d), a[t][0]);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) out[t] = hsum_ps(_mm256_add_ps(a[t][0], a[t][1]));
}

static void mvb_q8_0(int64_t nr, int64_t n, const uint8_t *W, size_t rb, int n_tok, const void *packed, float *y,
                     size_t ys)
{
    uintptr_t last = (uintptr_t)W + (nr > 0 ? (size_t)nr * rb - 1 : 0);
    int64_t nb = n / QK;
    int G = mvb_groups(n_tok);
    for (int64_t r = 0; r < nr; r++) {
        const uint8_t *w = W + (size_t)r * rb;
        const uint8_t *o = packed;
        for (int g = 0; g < G; g++) {
            int t0 = g * n_tok / G, T = (g + 1) * n_tok / G - t0;
            const uint8_t *qs = o, *cs = o + grp_qs(nb, T);
            const float *dx = (const float *)(const void *)(o + 2 * grp_qs(nb, T));
            float v[MVB_TOKS];
            bool pf = g == 0;
            switch (T) {
            case 8: q8_0_row(8, w, nb, qs, cs, dx, pf, last, v); break;
            case 7: q8_0_row(7, w, nb, qs, cs, dx, pf, last, v); break;
            case 6: q8_0_row(6, w, nb, qs, cs, dx, pf, last, v); break;
            case 5: q8_0_row(5, w, nb, qs, cs, dx, pf, last, v); break;
            case 4: q8_0_row(4, w, nb, qs, cs, dx, pf, last, v); break;
            case 3: q8_0_row(3, w, nb, qs, cs, dx, pf, last, v); break;
            case 2: q8_0_row(2, w, nb, qs, cs, dx, pf, last, v); break;
            default: q8_0_row(1, w, nb, qs, cs, dx, pf, last, v); break;
            }
            for (int t = 0; t < T; t++) y[(size_t)(t0 + t) * ys + (size_t)r] = v[t];
            o += grp_bytes(nb, T);
        }
    }
}

const tensor_mvb_kernel tensor_mvb_avx512_[KEEL_DTYPE_COUNT_] = {
    [KEEL_DTYPE_Q8_0] = {mvb_q8_0, pack_q8_0_bytes, pack_q8_0},
};
