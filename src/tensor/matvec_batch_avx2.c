/*
 * matvec_batch_avx2.c — the batched q8_0, q4_0, q4_K, q5_K and q6_K row kernels of the avx2 level
 * (tensor_mvb_avx2_): every weight row read once and dotted against up to
 * TENSOR_MV_BATCH_MAX activations (a speculative verify batch), each
 * token's result bit for bit what matvec_avx2.c's row kernel gives that
 * token alone.
 *
 * The row kernel keeps one weight block per 32-bit lane: a row is taken
 * eight blocks (a group) at a time, each block's int8 dot is folded into a
 * lane of its own (exact int32 adds), and per group there is one convert,
 * one multiply (the eight scale products d_w d_x) and one FMA. The float
 * work is what fixes the bits, and it is per group, not per block: the
 * kernels below only have to get every block's exact dot into its lane.
 *
 * - A few tokens (2..MVB_SMALL): small_row takes each block as the row
 *   kernel does (the sign trick: |w| against x with w's sign, vpmaddubsw,
 *   vpmaddwd by ones, then the fold), the weight block's load and |w|
 *   shared by the tokens.
 * - More tokens: the group is sign-extended to int16 and transposed once
 *   for all tokens (t8_i16: vector i lane c = values 2i, 2i+1 of block c),
 *   and each token takes sixteen vpmaddwd and vpaddd against its
 *   activation packed the same way (once per product): per block and
 *   token two multiplies and two adds, no sign trick and no fold. Tokens
 *   share the transposed group from L1 in chunks of up to MVB_CHUNK, whose
 *   int32 sums stay in registers.
 * - One token (the 17th of a 17-token batch, or deterministic decode): the
 *   row kernel itself, on a copy of the activation.
 *
 * The integers are the same in every form (|dot| <= 32 * 128 * 127 <
 * 2^24: exact in int32 and in f32). The sign trick needs activations in
 * [-127, 127], which the q8_0 quantizer guarantees; the int16 products are
 * exact for any byte.
 *
 * q4_0 the same way from 4 tokens on (t8_i16_q4_0: the nibbles less 8,
 * sign-extended, the same transposes; the activations' records are
 * q8_0's), and the row kernel token by token up to 3 (mvb_chunked): its
 * row kernel folds each block's exact sum((q - 8) x) into the same lane.
 *
 * q4_K / q5_K (kq_row): the row kernel's steps with a pair of tokens where
 * it has a pair of rows; what depends on the row alone (the scale field's
 * decode, the nibbles and fifth bits, d and dmin) once per super-block for
 * all tokens; q6_K (q6_row) the same with q6_K_block_sumi's steps.
 *
 * Before (the seventh pass's kernel), every token paid the row kernel's
 * old per-block work: the sign trick and then a convert and an FMA per
 * block (docs/kernel-passes-2.md, "Eighteenth pass", has the measurements). The
 * AVX-512 VNNI form is in matvec_batch_avx512.c.
 */
#include "matvec_batch.h"

#define MVB_SMALL  4 /* at most this many tokens take small_row */
#define MVB_CHUNK  8 /* tokens whose int32 sums share the registers, one row at a time */
#define MVB_CHUNK2 6 /* the same, two rows at a time */
#define MVB_REC    (16 * 32 + 32) /* one token's group: xt [16][32] i16 pairs, dx [8] f32 */

_Static_assert(TENSOR_MV_BATCH_MAX <= 16 && TENSOR_MV_BATCH_MAX <= 3 * MVB_CHUNK2,
               "rows_q8_0 holds at most 16 tokens in at most three chunks");

/* ---- one block per lane, by transposing ------------------------------------------------ */

/* o[j] lane c = r[c] dword j (an 8 x 8 transpose of dwords). */
static inline __attribute__((always_inline)) void t8x8_epi32(const __m256i r[8], __m256i o[8])
{
    __m256i t[8], u[8];
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        t[2 * k] = _mm256_unpacklo_epi32(r[2 * k], r[2 * k + 1]);
        t[2 * k + 1] = _mm256_unpackhi_epi32(r[2 * k], r[2 * k + 1]);
    }
    /* u[4h + j] = rows 4h..4h+3, dword j (lower half) and j + 4 (upper) */
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        u[4 * h + 0] = _mm256_unpacklo_epi64(t[4 * h], t[4 * h + 2]);
        u[4 * h + 1] = _mm256_unpackhi_epi64(t[4 * h], t[4 * h + 2]);
        u[4 * h + 2] = _mm256_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);
        u[4 * h + 3] = _mm256_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);
    }
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        o[j] = _mm256_permute2x128_si256(u[j], u[4 + j], 0x20);
        o[j + 4] = _mm256_permute2x128_si256(u[j], u[4 + j], 0x31);
    }
}

/* The values of the m (0..8) q8_0 blocks at p (block 0's scale) as int16
 * pairs, one block per lane: g[i] lane c = values 2i, 2i+1 of block c
 * (lanes past m zero; nothing past the m blocks is read). */
static inline __attribute__((always_inline)) void t8_i16(const uint8_t *p, int m, __m256i g[16])
{
    __m256i lo[8], hi[8];
#pragma GCC unroll 8
    for (int c = 0; c < 8; c++) {
        /* (no address past the m blocks is formed) */
        lo[c] = c < m ? _mm256_cvtepi8_epi16(loadu_128(p + (size_t)c * Q8_0_BYTES + 2))
                      : _mm256_setzero_si256();
        hi[c] = c < m ? _mm256_cvtepi8_epi16(loadu_128(p + (size_t)c * Q8_0_BYTES + 18))
                      : _mm256_setzero_si256();
    }
    t8x8_epi32(lo, g);
    t8x8_epi32(hi, g + 8);
}

/* The same for the m (0..8) q4_0 blocks at p: each block's nibbles less 8
 * (values 0-15 | 16-31), sign-extended, then the same transposes. */
static inline __attribute__((always_inline)) void t8_i16_q4_0(const uint8_t *p, int m, __m256i g[16])
{
    const __m128i m4 = _mm_set1_epi8(0x0F), b8 = _mm_set1_epi8(8);
    __m256i lo[8], hi[8];
#pragma GCC unroll 8
    for (int c = 0; c < 8; c++) {
        if (c < m) {
            __m128i q = loadu_128(p + (size_t)c * Q4_0_BYTES + 2);
            lo[c] = _mm256_cvtepi8_epi16(_mm_sub_epi8(_mm_and_si128(q, m4), b8));
            hi[c] = _mm256_cvtepi8_epi16(_mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(q, 4), m4), b8));
        } else {
            lo[c] = hi[c] = _mm256_setzero_si256();
        }
    }
    t8x8_epi32(lo, g);
    t8x8_epi32(hi, g + 8);
}

/* ---- a few tokens, the row kernel token by token ------------------------------------- */

/* Up to MVB_CHUNKED tokens of a q4_0, q4_K, q5_K or q6_K batch run the row
 * kernel mv token by token over chunks of rows that stay in L1 for the
 * other tokens (what tensor_matvec_batch does for dtypes without a batched
 * kernel): the row kernel takes two rows at a time, and with two or three
 * tokens sharing the row's decode did not pay (kq_row's pairs of tokens
 * 1.0-1.4x slower at 2 tokens; q4_0's transposed form 1.1-1.45x at 2-3).
 * Token t's activation is at packed + t ob, its prepared form xpo bytes
 * further (xpo 0: none). The row results depend on their row alone, so
 * any chunking gives the row kernel's bits. */
#define MVB_CHUNKED   3
#define MVB_CHUNK_ROW ((size_t)16 << 10)

static void mvb_chunked(tensor_mv_fn mv, int64_t nr, int64_t n, const uint8_t *W, size_t rb, int n_tok,
                        const void *packed, size_t ob, size_t xpo, float *y, size_t ys)
{
    /* one token (deterministic decode): all rows in one call, whose
     * prefetch runs ahead through them */
    int64_t ch = n_tok == 1 ? BASE_MAX(nr, 1) : BASE_MAX((int64_t)(MVB_CHUNK_ROW / rb), 1);
    for (int64_t r0 = 0; r0 < nr; r0 += ch) {
        int64_t k = BASE_MIN(ch, nr - r0);
        for (int t = 0; t < n_tok; t++) {
            const uint8_t *o = (const uint8_t *)packed + (size_t)t * ob;
            mv(k, n, W + (size_t)r0 * rb, rb, o, xpo ? o + xpo : NULL, y + (size_t)t * ys + (size_t)r0);
        }
    }
}

/* ---- packed activations ------------------------------------------------------------ */

/* A batch of more than MVB_SMALL tokens: rec [ng][T] (ng = ceil(nb / 8)),
 * each MVB_REC bytes: t8_i16 of the token's blocks 8j..8j+7, then their
 * scales (zero past nb). A smaller batch: per token, its q8_0 row as it is
 * (64-byte aligned), then tensor_mv_prep_avx2_'s prepared form of it (the
 * scales, zero past nb). */
static size_t one_x_bytes(int64_t nb)
{
    return mvb_up64((size_t)nb * Q8_0_BYTES);
}

/* Bytes of one token's part of a small batch whose weights are of dtype
 * w (q8_0 or q4_0): its q8_0 row, then w's row kernel's prepared form. */
static size_t one_bytes(keel_dtype w, int64_t n)
{
    return one_x_bytes(n / QK) + mvb_up64(tensor_mv_prep_avx2_[w].bytes(n));
}

static size_t pack_q8_0_bytes(int64_t n, int n_tok)
{
    int64_t nb = n / QK;
    if (n_tok <= MVB_SMALL) return (size_t)n_tok * one_bytes(KEEL_DTYPE_Q8_0, n);
    return (size_t)((nb + 7) / 8) * (size_t)n_tok * MVB_REC;
}

/* The records of n_tok tokens (t8_i16 of each group, then its scales). */
static void pack_t8(const void *const *xv, int n_tok, int64_t n, void *packed)
{
    int64_t nb = n / QK;
    uint8_t *o = packed;
    for (int t = 0; t < n_tok; t++) {
        const uint8_t *x = xv[t];
        for (int64_t b = 0; b < nb; b += 8) {
            uint8_t *rec = o + ((size_t)(b / 8) * (size_t)n_tok + (size_t)t) * MVB_REC;
            int m = nb - b >= 8 ? 8 : (int)(nb - b);
            __m256i g[16];
            t8_i16(x + (size_t)b * Q8_0_BYTES, m, g);
            for (int i = 0; i < 16; i++)
                _mm256_store_si256((__m256i *)(void *)(rec + 32 * i), g[i]);
            _mm256_store_ps((float *)(void *)(rec + 16 * 32),
                            mvb_scales_tail(x + (size_t)b * Q8_0_BYTES, m, Q8_0_BYTES));
        }
    }
}

/* Each token's q8_0 row (64-byte aligned) and the row kernel of dtype w's
 * prepared form of it. */
static void pack_rows(keel_dtype w, const void *const *xv, int n_tok, int64_t n, void *packed)
{
    int64_t nb = n / QK;
    size_t one = one_bytes(w, n);
    uint8_t *o = packed;
    for (int t = 0; t < n_tok; t++, o += one) {
        memcpy(o, xv[t], (size_t)nb * Q8_0_BYTES);
        tensor_mv_prep_avx2_[w].run(o, n, o + one_x_bytes(nb));
    }
}

static void pack_q8_0(const void *const *xv, int n_tok, int64_t n, void *packed)
{
    if (n_tok <= MVB_SMALL) pack_rows(KEEL_DTYPE_Q8_0, xv, n_tok, n, packed);
    else pack_t8(xv, n_tok, n, packed);
}

/* q4_0: up to MVB_CHUNKED tokens, each in the row kernel's form; more,
 * the records. */
static size_t pack_q4_0_bytes(int64_t n, int n_tok)
{
    if (n_tok <= MVB_CHUNKED) return (size_t)n_tok * one_bytes(KEEL_DTYPE_Q4_0, n);
    return (size_t)((n / QK + 7) / 8) * (size_t)n_tok * MVB_REC;
}

static void pack_q4_0(const void *const *xv, int n_tok, int64_t n, void *packed)
{
    if (n_tok <= MVB_CHUNKED) pack_rows(KEEL_DTYPE_Q4_0, xv, n_tok, n, packed);
    else pack_t8(xv, n_tok, n, packed);
}

/* ---- a few tokens ---------------------------------------------------------------------- */

/* The m (1..8) blocks of a group at p against T (2..4) tokens' blocks at
 * xs[t] + xo, as the row kernel takes them (matvec_avx2.c: each block's
 * dot in eight lanes by the sign trick, the group folded into one lane per
 * block), with the weight block's load and |w| shared by the tokens; then
 * each token's convert and FMA. */
static inline __attribute__((always_inline)) void small_group(int T, const uint8_t *p, int m,
                                                              const uint8_t *const *xs, size_t xo,
                                                              const __m256 *sc, __m256 *a)
{
    __m256i h[4][2];
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        int c = 2 * k;
        __m256i w0 = c < m ? loadu_256(p + (size_t)c * Q8_0_BYTES + 2) : _mm256_setzero_si256();
        __m256i w1 =
            c + 1 < m ? loadu_256(p + (size_t)(c + 1) * Q8_0_BYTES + 2) : _mm256_setzero_si256();
        __m256i u0 = _mm256_sign_epi8(w0, w0), u1 = _mm256_sign_epi8(w1, w1);
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            /* (no address past the m blocks is formed) */
            const uint8_t *x = xs[t] + xo;
            __m256i d0 =
                c < m ? dot_us8_i32(u0,
                                    _mm256_sign_epi8(loadu_256(x + (size_t)c * Q8_0_BYTES + 2), w0))
                      : _mm256_setzero_si256();
            __m256i d1 =
                c + 1 < m
                    ? dot_us8_i32(
                          u1, _mm256_sign_epi8(loadu_256(x + (size_t)(c + 1) * Q8_0_BYTES + 2), w1))
                    : _mm256_setzero_si256();
            __m256i f = mv_fold2(d0, d1);
            /* mv_fold4x2's first step as soon as two pairs are done */
            if (k & 1)
                h[t][k / 2] = _mm256_add_epi32(_mm256_unpacklo_epi64(h[t][k / 2], f),
                                               _mm256_unpackhi_epi64(h[t][k / 2], f));
            else
                h[t][k / 2] = f;
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        __m256i d = _mm256_add_epi32(_mm256_permute2x128_si256(h[t][0], h[t][1], 0x20),
                                     _mm256_permute2x128_si256(h[t][0], h[t][1], 0x31));
        a[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), sc[t], a[t]);
    }
}

/* One row against T (2..4) tokens (xs: their q8_0 rows, dxs: their
 * prepared scales), each result the row kernel's bits. */
static inline __attribute__((always_inline)) void small_row(int T, const uint8_t *w, int64_t nb,
                                                            const uint8_t *const *xs,
                                                            const float *const *dxs, uintptr_t last,
                                                            float *out)
{
    __m256 a[4], sc[4];
#pragma GCC unroll 4
    for (int t = 0; t < T; t++)
        a[t] = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 8 <= nb; b += 8) {
        const uint8_t *p = w + (size_t)b * Q8_0_BYTES;
        mv_pf(p, last, 5);
        __m256 dw = f16x8_strided(p, Q8_0_BYTES);
#pragma GCC unroll 4
        for (int t = 0; t < T; t++)
            sc[t] = _mm256_mul_ps(dw, _mm256_load_ps(dxs[t] + b));
        small_group(T, p, 8, xs, (size_t)b * Q8_0_BYTES, sc, a);
    }
    if (b < nb) {
        const uint8_t *p = w + (size_t)b * Q8_0_BYTES;
        __m256 dw = mvb_scales_tail(p, (int)(nb - b), Q8_0_BYTES);
#pragma GCC unroll 4
        for (int t = 0; t < T; t++)
            sc[t] = _mm256_mul_ps(dw, _mm256_load_ps(dxs[t] + b));
        small_group(T, p, (int)(nb - b), xs, (size_t)b * Q8_0_BYTES, sc, a);
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++)
        out[t] = hsum_ps(a[t]);
}

/* ---- more tokens ----------------------------------------------------------------------- */

/* C tokens (their records from r on) against R (1 or 2) rows' transposed
 * groups g[16 k ..] with weight scales dw[k]: each token's dots (sixteen
 * vpmaddwd a row, each activation vector loaded once for the rows), then
 * the convert, scale product and FMA into acc[k][t]. */
static inline __attribute__((always_inline)) void chunk_q8_0(int R, int C, const __m256i *g,
                                                             const uint8_t *r, const __m256 *dw,
                                                             float (*const *acc)[8])
{
    __m256i s[2][MVB_CHUNK];
#pragma GCC unroll 2
    for (int k = 0; k < R; k++)
#pragma GCC unroll 8
        for (int t = 0; t < C; t++)
            s[k][t] = _mm256_setzero_si256();
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) {
        __m256i gi[2];
#pragma GCC unroll 2
        for (int k = 0; k < R; k++) {
            gi[k] = _mm256_load_si256(g + 16 * k + i);
            __asm__("" : "+x"(gi[k])); /* kept in a register, not reloaded from g per token */
        }
#pragma GCC unroll 8
        for (int t = 0; t < C; t++) {
            __m256i x = _mm256_load_si256(
                (const __m256i *)(const void *)(r + (size_t)t * MVB_REC + 32 * i));
#pragma GCC unroll 2
            for (int k = 0; k < R; k++) {
                s[k][t] = _mm256_add_epi32(s[k][t], _mm256_madd_epi16(gi[k], x));
                /* one chain per row and token: gcc otherwise reassociates
                 * the adds into a tree, computes the products first and
                 * spills them */
                __asm__("" : "+x"(s[k][t]));
            }
        }
        /* and no load of the next vector's products hoisted above this
         * one's adds (gcc computed all sixteen products of a token first
         * and spilled them) */
        __asm__ volatile("" ::: "memory");
    }
#pragma GCC unroll 8
    for (int t = 0; t < C; t++) {
        __m256 dx =
            _mm256_load_ps((const float *)(const void *)(r + (size_t)t * MVB_REC + 16 * 32));
#pragma GCC unroll 2
        for (int k = 0; k < R; k++)
            _mm256_store_ps(acc[k][t],
                            _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[k][t]), _mm256_mul_ps(dw[k], dx),
                                            _mm256_load_ps(acc[k][t])));
    }
}

/* Most tokens a chunk of R rows takes: R x C sums, the R group vectors and
 * an activation vector in the 16 registers. */
static inline int chunk_max(int R)
{
    return R == 2 ? MVB_CHUNK2 : MVB_CHUNK;
}

static void chunk_any(int R, int C, const __m256i *g, const uint8_t *r, const __m256 *dw,
                      float (*const *acc)[8])
{
#define MVB_CASE(RR, N)                                                                            \
    case N:                                                                                        \
        chunk_q8_0(RR, N, g, r, dw, acc);                                                          \
        break;
    if (R == 2) {
        switch (C) {
            MVB_CASE(2, 6)
            MVB_CASE(2, 5)
            MVB_CASE(2, 4)
            MVB_CASE(2, 3)
            MVB_CASE(2, 2)
        default:
            chunk_q8_0(2, 1, g, r, dw, acc);
            break;
        }
        return;
    }
    switch (C) {
        MVB_CASE(1, 8)
        MVB_CASE(1, 7)
        MVB_CASE(1, 6)
        MVB_CASE(1, 5)
        MVB_CASE(1, 4)
        MVB_CASE(1, 3)
        MVB_CASE(1, 2)
    default:
        chunk_q8_0(1, 1, g, r, dw, acc);
        break;
    }
#undef MVB_CASE
}

/* R (1 or 2) consecutive rows from w (Q4: q4_0, else q8_0) against T
 * (2..16) tokens: per group, each row's weights transposed once, then the
 * tokens in chunks of about equal size, each activation vector loaded once
 * for both rows. out[16 k + t]: row k, token t. */
static inline __attribute__((always_inline)) void rows_t8(int Q4, int R, int T, const uint8_t *w, size_t rb,
                                                          int64_t nb, const uint8_t *rec, uintptr_t last,
                                                          float *out)
{
    const size_t bb = Q4 ? Q4_0_BYTES : Q8_0_BYTES;
    _Alignas(32) float acc[2][16][8];
    for (int k = 0; k < R; k++)
        for (int t = 0; t < T; t++)
            _mm256_store_ps(acc[k][t], _mm256_setzero_ps());
    int cm = chunk_max(R), nc = (T + cm - 1) / cm, t0[4];
    for (int c = 0; c <= nc; c++)
        t0[c] = c * T / nc;
    for (int64_t b = 0; b < nb; b += 8, rec += (size_t)T * MVB_REC) {
        int m = nb - b >= 8 ? 8 : (int)(nb - b);
        _Alignas(32) __m256i g[32];
        __m256 dw[2];
        for (int k = 0; k < R; k++) {
            const uint8_t *p = w + (size_t)k * rb + (size_t)b * bb;
            /* each row asks for its own lines ahead and, past its end, for
             * the row R after it (the next pass's), not for its neighbour */
            mv_pf_at((uintptr_t)p + MV_PF + ((size_t)b * bb + MV_PF >= rb ? (size_t)(R - 1) * rb : 0),
                     last, Q4 ? 3 : 5);
            if (m == 8) {
                if (Q4) t8_i16_q4_0(p, 8, g + 16 * k);
                else t8_i16(p, 8, g + 16 * k);
                dw[k] = f16x8_strided(p, bb);
            } else {
                if (Q4) t8_i16_q4_0(p, m, g + 16 * k);
                else t8_i16(p, m, g + 16 * k);
                dw[k] = mvb_scales_tail(p, m, bb);
            }
        }
        for (int c = 0; c < nc; c++) {
            float(*const a[2])[8] = {acc[0] + t0[c], acc[1] + t0[c]};
            chunk_any(R, t0[c + 1] - t0[c], g, rec + (size_t)t0[c] * MVB_REC, dw, a);
        }
    }
    for (int k = 0; k < R; k++)
        for (int t = 0; t < T; t++)
            out[16 * k + t] = hsum_ps(_mm256_load_ps(acc[k][t]));
}

static void rows_q8_0(int R, int T, const uint8_t *w, size_t rb, int64_t nb, const uint8_t *rec,
                      uintptr_t last, float *out)
{
    rows_t8(0, R, T, w, rb, nb, rec, last, out);
}

static void rows_q4_0(int R, int T, const uint8_t *w, size_t rb, int64_t nb, const uint8_t *rec,
                      uintptr_t last, float *out)
{
    rows_t8(1, R, T, w, rb, nb, rec, last, out);
}

/* Every pair of rows of W against the n_tok (2..16) tokens' records. */
static void mvb_t8(int Q4, int64_t nr, int64_t n, const uint8_t *W, size_t rb, int n_tok,
                   const void *packed, float *y, size_t ys)
{
    uintptr_t last = (uintptr_t)W + (nr > 0 ? (size_t)nr * rb - 1 : 0);
    for (int64_t r = 0; r < nr; r += 2) {
        int R = nr - r >= 2 ? 2 : 1;
        float v[2 * 16];
        (Q4 ? rows_q4_0 : rows_q8_0)(R, n_tok, W + (size_t)r * rb, rb, n / QK, packed, last, v);
        for (int k = 0; k < R; k++)
            for (int t = 0; t < n_tok; t++)
                y[(size_t)t * ys + (size_t)(r + k)] = v[k * 16 + t];
    }
}

static void mvb_q4_0(int64_t nr, int64_t n, const uint8_t *W, size_t rb, int n_tok,
                     const void *packed, float *y, size_t ys)
{
    if (n_tok <= MVB_CHUNKED)
        mvb_chunked(tensor_mv_avx2_[KEEL_DTYPE_Q4_0], nr, n, W, rb, n_tok, packed,
                    one_bytes(KEEL_DTYPE_Q4_0, n), one_x_bytes(n / QK), y, ys);
    else
        mvb_t8(1, nr, n, W, rb, n_tok, packed, y, ys);
}

static void mvb_q8_0(int64_t nr, int64_t n, const uint8_t *W, size_t rb, int n_tok,
                     const void *packed, float *y, size_t ys)
{
    int64_t nb = n / QK;
    const uint8_t *o = packed;
    if (n_tok == 1) {
        tensor_mv_avx2_[KEEL_DTYPE_Q8_0](nr, n, W, rb, o, o + one_x_bytes(nb), y);
        return;
    }
    uintptr_t last = (uintptr_t)W + (nr > 0 ? (size_t)nr * rb - 1 : 0);
    if (n_tok <= MVB_SMALL) {
        const uint8_t *xs[MVB_SMALL];
        const float *dxs[MVB_SMALL];
        for (int t = 0; t < n_tok; t++) {
            xs[t] = o + (size_t)t * one_bytes(KEEL_DTYPE_Q8_0, n);
            dxs[t] = (const float *)(const void *)(xs[t] + one_x_bytes(nb));
        }
        for (int64_t r = 0; r < nr; r++) {
            float v[MVB_SMALL];
            switch (n_tok) {
            case 4:
                small_row(4, W + (size_t)r * rb, nb, xs, dxs, last, v);
                break;
            case 3:
                small_row(3, W + (size_t)r * rb, nb, xs, dxs, last, v);
                break;
            default:
                small_row(2, W + (size_t)r * rb, nb, xs, dxs, last, v);
                break;
            }
            for (int t = 0; t < n_tok; t++)
                y[(size_t)t * ys + (size_t)r] = v[t];
        }
        return;
    }
    mvb_t8(0, nr, n, W, rb, n_tok, packed, y, ys);
}

/* ---- q4_K / q5_K -------------------------------------------------------------------- */

/* A batch of q4_K / q5_K rows against q8_K activations: per token, its
 * q8_K row (64-byte aligned), then tensor_mv_prep_avx2_'s prepared form
 * (the sums over each 32-value sub-block as int16 pairs, d_x). */
static size_t kq_x_bytes(int64_t n)
{
    return mvb_up64((size_t)(n / QK_K) * Q8_K_BYTES);
}

static size_t kq_one_bytes(int64_t n)
{
    return kq_x_bytes(n) + mvb_up64(tensor_mv_prep_avx2_[KEEL_DTYPE_Q4_K].bytes(n));
}

static size_t pack_kq_bytes(int64_t n, int n_tok)
{
    return (size_t)n_tok * kq_one_bytes(n);
}

static void pack_kq(const void *const *xv, int n_tok, int64_t n, void *packed)
{
    uint8_t *o = packed;
    for (int t = 0; t < n_tok; t++, o += kq_one_bytes(n)) {
        memcpy(o, xv[t], (size_t)(n / QK_K) * Q8_K_BYTES);
        tensor_mv_prep_avx2_[KEEL_DTYPE_Q4_K].run(o, n, o + kq_x_bytes(n));
    }
}

/* One q4_K / q5_K row (Q5: q5_K) against T (1..16) tokens: matvec_avx2.c's
 * rows_q45_K with a pair of tokens where it has a pair of rows. What
 * depends on the row alone (the scale field's decode, the weights' nibbles
 * and fifth bits, d and dmin) is done once per super-block for all tokens;
 * each pair of tokens then takes the row kernel's integer and float steps
 * with token t in the lanes of its first row and t + 1 in those of its
 * second, which give each token what the row kernel gives it alone (its
 * lanes hold the same values and meet the same operations; an odd last
 * token pairs with itself). The pairs' accumulators live in memory. */
static inline __attribute__((always_inline)) void kq_row(int Q5, int T, const uint8_t *w,
                                                         int64_t nsb, const uint8_t *o, size_t ob,
                                                         uintptr_t last, float *out)
{
    const char z = (char)0x80;
    const __m256i m4 = _mm256_set1_epi8(0x0F), b16 = _mm256_set1_epi8(0x10);
    const __m256i pair_lo = _mm256_setr_epi8(0, z, 0, z, 1, z, 1, z, 2, z, 2, z, 3, z, 3, z, 0, z,
                                             0, z, 1, z, 1, z, 2, z, 2, z, 3, z, 3, z);
    const __m256i pair_hi = _mm256_setr_epi8(4, z, 4, z, 5, z, 5, z, 6, z, 6, z, 7, z, 7, z, 4, z,
                                             4, z, 5, z, 5, z, 6, z, 6, z, 7, z, 7, z);
    const __m256i sel_d = _mm256_setr_epi32(0, 0, 2, 2, 0, 0, 2, 2),
                  sel_m = _mm256_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3);
    const __m128 sgn = _mm_setr_ps(1.0f, -1.0f, 1.0f, -1.0f);
    const size_t bb = Q5 ? Q5_K_BYTES : Q4_K_BYTES;
    const size_t xb = kq_x_bytes((int64_t)nsb * QK_K);
    int P = (T + 1) / 2;
    _Alignas(32) float acc[8][8], macc[8][8];
    for (int p = 0; p < P; p++) {
        _mm256_store_ps(acc[p], _mm256_setzero_ps());
        _mm256_store_ps(macc[p], _mm256_setzero_ps());
    }
    for (int64_t i = 0; i < nsb; i++) {
        const uint8_t *b = w + (size_t)i * bb;
        mv_pf(b, last, Q5 ? 3 : 2);
        if (!Q5 && (i & 1)) mv_pf(b + 128, last, 1);
        _Alignas(32) int32_t s32[16];
        __m256i sm = kq_scales_mins_u8x2(b + 4, b + 4);
        _mm256_store_si256((__m256i *)s32, _mm256_shuffle_epi8(sm, pair_lo));
        _mm256_store_si256((__m256i *)(s32 + 8), _mm256_shuffle_epi8(sm, pair_hi));
        __m128 dw = _mm_cvtph_ps(_mm_setr_epi32((int)rd_u32(b), (int)rd_u32(b), 0, 0));
        __m256i mw = _mm256_unpackhi_epi8(sm, _mm256_setzero_si256());
        __m256i lo[4], hi[4];
        __m256i hb = Q5 ? loadu_256(b + 16) : _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            __m256i q = loadu_256(b + (Q5 ? 48 : 16) + 32 * c);
            lo[c] = _mm256_and_si256(q, m4);
            hi[c] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            if (Q5) {
                lo[c] = _mm256_or_si256(lo[c], _mm256_and_si256(_mm256_slli_epi16(hb, 4), b16));
                hi[c] = _mm256_or_si256(hi[c], _mm256_and_si256(_mm256_slli_epi16(hb, 3), b16));
                hb = _mm256_srli_epi16(hb, 2);
            }
        }
        for (int p = 0; p < P; p++) {
            int t0 = 2 * p, t1 = 2 * p + 1 < T ? 2 * p + 1 : 2 * p;
            const uint8_t *o0 = o + (size_t)t0 * ob, *o1 = o + (size_t)t1 * ob;
            const uint8_t *pr0 = o0 + xb + (size_t)i * 16, *pr1 = o1 + xb + (size_t)i * 16;
            const float *dx0 = (const float *)(const void *)(o0 + xb + (size_t)nsb * 16);
            const float *dx1 = (const float *)(const void *)(o1 + xb + (size_t)nsb * 16);
            __m128 dd =
                _mm_mul_ps(dw, _mm_mul_ps(_mm_setr_ps(dx0[i], dx0[i], dx1[i], dx1[i]), sgn));
            __m256 dd8 = _mm256_castps128_ps256(dd);
            __m256i mins =
                _mm256_madd_epi16(mw, _mm256_loadu2_m128i((const __m128i *)(const void *)pr1,
                                                          (const __m128i *)(const void *)pr0));
            _mm256_store_ps(macc[p],
                            _mm256_fmadd_ps(_mm256_permutevar8x32_ps(dd8, sel_m),
                                            _mm256_cvtepi32_ps(mins), _mm256_load_ps(macc[p])));
            __m256i si[2];
#pragma GCC unroll 2
            for (int s = 0; s < 2; s++) {
                const uint8_t *xq = (s ? o1 : o0) + (size_t)i * Q8_K_BYTES + Q8_K_QS;
                si[s] = _mm256_setzero_si256();
#pragma GCC unroll 4
                for (int c = 0; c < 4; c++) {
                    int k = c < 2 ? 2 * c : 8 + 2 * c - 4;
                    __m256i p0 =
                        _mm256_madd_epi16(_mm256_maddubs_epi16(lo[c], loadu_256(xq + 64 * c)),
                                          _mm256_set1_epi32(s32[k]));
                    __m256i p1 =
                        _mm256_madd_epi16(_mm256_maddubs_epi16(hi[c], loadu_256(xq + 64 * c + 32)),
                                          _mm256_set1_epi32(s32[k + 1]));
                    si[s] = _mm256_add_epi32(si[s], _mm256_add_epi32(p0, p1));
                }
            }
            __m256i h = hadd2_epi32(si[0], si[1]);
            _mm256_store_ps(acc[p], _mm256_fmadd_ps(_mm256_permutevar8x32_ps(dd8, sel_d),
                                                    _mm256_cvtepi32_ps(h), _mm256_load_ps(acc[p])));
        }
    }
    for (int p = 0; p < P; p++) {
        __m256 a = _mm256_load_ps(acc[p]), m = _mm256_load_ps(macc[p]);
        __m128 a4 = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
        __m128 mh = _mm_hadd_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        __m128 r = _mm_add_ps(_mm_hadd_ps(a4, a4), _mm_hadd_ps(mh, mh)); /* [t0, t1, t0, t1] */
        out[2 * p] = _mm_cvtss_f32(r);
        if (2 * p + 1 < T) out[2 * p + 1] = _mm_cvtss_f32(_mm_movehdup_ps(r));
    }
}

static inline __attribute__((always_inline)) void mvb_kq(int Q5, int64_t nr, int64_t n,
                                                         const uint8_t *W, size_t rb, int n_tok,
                                                         const void *packed, float *y, size_t ys)
{
    size_t ob = kq_one_bytes(n);
    if (n_tok <= MVB_CHUNKED) {
        mvb_chunked(tensor_mv_avx2_[Q5 ? KEEL_DTYPE_Q5_K : KEEL_DTYPE_Q4_K], nr, n, W, rb, n_tok, packed, ob,
                    kq_x_bytes(n), y, ys);
        return;
    }
    uintptr_t last = (uintptr_t)W + (nr > 0 ? (size_t)nr * rb - 1 : 0);
    for (int64_t r = 0; r < nr; r++) {
        float v[16];
        kq_row(Q5, n_tok, W + (size_t)r * rb, n / QK_K, packed, ob, last, v);
        for (int t = 0; t < n_tok; t++)
            y[(size_t)t * ys + (size_t)r] = v[t];
    }
}

static void mvb_q4_K(int64_t nr, int64_t n, const uint8_t *W, size_t rb, int n_tok,
                     const void *packed, float *y, size_t ys)
{
    mvb_kq(0, nr, n, W, rb, n_tok, packed, y, ys);
}

static void mvb_q5_K(int64_t nr, int64_t n, const uint8_t *W, size_t rb, int n_tok,
                     const void *packed, float *y, size_t ys)
{
    mvb_kq(1, nr, n, W, rb, n_tok, packed, y, ys);
}

/* ---- q6_K --------------------------------------------------------------------------- */

/* A batch of q6_K rows: per token, its q8_K row (64-byte aligned; the row
 * kernel takes no prepared form). */
static size_t pack_q6_K_bytes(int64_t n, int n_tok)
{
    return (size_t)n_tok * kq_x_bytes(n);
}

static void pack_q6_K(const void *const *xv, int n_tok, int64_t n, void *packed)
{
    uint8_t *o = packed;
    for (int t = 0; t < n_tok; t++, o += kq_x_bytes(n))
        memcpy(o, xv[t], (size_t)(n / QK_K) * Q8_K_BYTES);
}

/* One q6_K row against T (1..16) tokens: per super-block, the 6-bit values
 * and the sub-block scales' broadcasts (q6_K_block_sumi's) once for all
 * tokens, then each token's integer sum by q6_K_block_sumi's steps (the
 * same lanes) and its convert and FMA, as matvec_avx2.c's rows_q6_K. */
static void q6_row(int T, const uint8_t *w, int64_t nsb, const uint8_t *o, size_t ob,
                   uintptr_t last, float *out)
{
    const __m128i even_odd = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    _Alignas(32) float acc[16][8];
    for (int t = 0; t < T; t++)
        _mm256_store_ps(acc[t], _mm256_setzero_ps());
    for (int64_t i = 0; i < nsb; i++) {
        const uint8_t *b = w + (size_t)i * Q6_K_BYTES;
        mv_pf(b, last, 3 + (int)(i & 1));
        __m256i q[8], sb[8];
        q6_K_values(b, 0, q);
        q6_K_values(b, 1, q + 4);
        __m128i sc8 = loadu_128(b + 192);
        __m256i sc16 = _mm256_cvtepi8_epi16(sc8),
                sc = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, even_odd));
        for (int k = 0; k < 8; k++)
            sb[k] = _mm256_shuffle_epi8(sc, bcast16_ctrl(k));
        float dw = f16_load(b + 208);
        for (int t = 0; t < T; t++) {
            const uint8_t *xb = o + (size_t)t * ob + (size_t)i * Q8_K_BYTES, *xq = xb + Q8_K_QS;
            __m256i off = _mm256_madd_epi16(loadu_256(xb + Q8_K_BSUMS), sc16);
            __m256i s0 = _mm256_setzero_si256(), s1 = s0;
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) {
                __m256i p =
                    _mm256_madd_epi16(_mm256_maddubs_epi16(q[k], loadu_256(xq + 32 * k)), sb[k]);
                if (k & 1)
                    s1 = _mm256_add_epi32(s1, p);
                else
                    s0 = _mm256_add_epi32(s0, p);
            }
            __m256i si = _mm256_sub_epi32(_mm256_add_epi32(s0, s1), _mm256_slli_epi32(off, 5));
            _mm256_store_ps(acc[t],
                            _mm256_fmadd_ps(_mm256_set1_ps(rd_f32(xb) * dw), _mm256_cvtepi32_ps(si),
                                            _mm256_load_ps(acc[t])));
        }
    }
    for (int t = 0; t < T; t++)
        out[t] = hsum_ps(_mm256_load_ps(acc[t]));
}

static void mvb_q6_K(int64_t nr, int64_t n, const uint8_t *W, size_t rb, int n_tok,
                     const void *packed, float *y, size_t ys)
{
    size_t ob = kq_x_bytes(n);
    if (n_tok <= MVB_CHUNKED) {
        mvb_chunked(tensor_mv_avx2_[KEEL_DTYPE_Q6_K], nr, n, W, rb, n_tok, packed, ob, 0, y, ys);
        return;
    }
    uintptr_t last = (uintptr_t)W + (nr > 0 ? (size_t)nr * rb - 1 : 0);
    for (int64_t r = 0; r < nr; r++) {
        float v[16];
        q6_row(n_tok, W + (size_t)r * rb, n / QK_K, packed, ob, last, v);
        for (int t = 0; t < n_tok; t++)
            y[(size_t)t * ys + (size_t)r] = v[t];
    }
}

const tensor_mvb_kernel tensor_mvb_avx2_[KEEL_DTYPE_COUNT_] = {
    [KEEL_DTYPE_Q8_0] = {mvb_q8_0, pack_q8_0_bytes, pack_q8_0},
    [KEEL_DTYPE_Q4_0] = {mvb_q4_0, pack_q4_0_bytes, pack_q4_0},
    [KEEL_DTYPE_Q4_K] = {mvb_q4_K, pack_kq_bytes, pack_kq},
    [KEEL_DTYPE_Q5_K] = {mvb_q5_K, pack_kq_bytes, pack_kq},
    [KEEL_DTYPE_Q6_K] = {mvb_q6_K, pack_q6_K_bytes, pack_q6_K},
};
