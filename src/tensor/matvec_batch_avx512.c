/*
 * matvec_batch_avx512.c — the q8_0 row kernels of the avx512 level (AVX-512
 * VNNI): tensor_mv_avx512_ (one token, decode's products) and
 * tensor_mvb_avx512_ (up to 16 tokens, each row read once: a speculative
 * verify batch). Both get every block's exact int8 dot into a lane of its
 * own and then do the same float work, so a token's result is the same
 * bits whichever of the two runs it and however many tokens share the row.
 *
 * One weight block per 32-bit lane. A row is taken sixteen blocks (a
 * group) at a time; the group is transposed once for all tokens
 * (simd512_t16x32: vector i lane c = bytes 4i..4i+3 of block c, biased to
 * u8 as w + 128), and each token then takes eight vpdpbusd against its own
 * activation transposed the same way (packed once per product), started
 * from -128 * sum(x) over each block. That leaves every block's int8 dot
 * exactly in its lane (|sum| <= 32 * 128 * 127 < 2^24: exact in f32 too),
 * so the float work is one convert, one multiply (d_w * d_x, the sixteen
 * blocks' scale products) and one FMA per token and sixteen blocks, into
 * one 16-lane accumulator; the row's value is its lanes' sum (mv_hsum16).
 *
 * The avx2 level's kernels (matvec_avx2.c, matvec_batch_avx2.c) do the
 * same with eight blocks a group (the batched one by vpmaddwd on int16,
 * about 2.4x the time per block and token here at 9 tokens on Zen 5). The
 * two levels' results differ in the order of their float sums; each level
 * is the same bits for decode and verify. A tail group of fewer than 16
 * blocks loads under a mask (nothing past the row is read) and its missing
 * lanes hold zero weights, activations and scales.
 */
#include "matvec_batch.h"
#include "simd_avx512.h"

#define MVB_TOKS 16
#define MVB_G    16 /* blocks per group: one per lane */
#define MVB_REC                                                                                    \
    (8 * 64 + 64 + 64) /* one token's group: xt [8][64] i8, corr [16] i32, dx [16] f32 */

/* The batched kernel's weight stream: the bytes [p, p + n) of the row are
 * asked for MVB_PF_FAR bytes ahead into L2 (prefetcht2) and MVB_PF_NEAR
 * ahead into L1 (prefetcht0), clamped to last. A group's sixteen blocks are
 * all loaded before its first token's work (the transpose needs them), so
 * the out-of-order window does not reach the next group's loads as it
 * reached the next blocks' in the kernel before, whose loads were spread
 * over the tokens' work: with only matvec's one prefetch (3072 bytes ahead
 * into L1) the kernel was 1.4x faster than that one with the rows in L2
 * but 1.4x slower with them in DRAM (9 tokens, 2048 x 768 and 2048 x 2048,
 * one thread, the two kernels alternating in one process). Distances
 * swept there: near 544-2176, far 3072-8192. */
#define MVB_PF_FAR  6144
#define MVB_PF_NEAR 1632

static inline void mvb_pf(const uint8_t *p, size_t n, uintptr_t last)
{
    for (size_t k = 0; k < n + 63; k += 64) {
        uintptr_t f = (uintptr_t)p + MVB_PF_FAR + k, e = (uintptr_t)p + MVB_PF_NEAR + k;
        __builtin_prefetch((const void *)(f < last ? f : last), 0, 1);
        __builtin_prefetch((const void *)(e < last ? e : last), 0, 3);
    }
}

/* ---- weight scales ------------------------------------------------------------------ */

/* The scales of m (<= 8) blocks at p as f32 (lanes past m: 0): a masked
 * gather of the dwords at the blocks' starts, whose low halves are the f16
 * scales; nothing past the row is read. Only short tails of weight rows
 * take it, and the activations' packing (rows in cache): full runs of
 * eight weight blocks take f16x8_strided, as gathers stalled on rows
 * streaming from memory (9 tokens: 0.44 -> 0.72 ns a block and token). */
static inline __attribute__((always_inline)) __m256 mv_scales8(const uint8_t *p, int m)
{
    const __m256i off = _mm256_setr_epi32(0, 34, 68, 102, 136, 170, 204, 238);
    __m256i v = _mm256_mmask_i32gather_epi32(_mm256_setzero_si256(), (__mmask8)((1u << m) - 1), off,
                                             (const void *)p, 1);
    return _mm256_cvtph_ps(_mm256_cvtepi32_epi16(v));
}

/* [lo | hi] (AVX-512F only: the level does not require DQ's insertf32x8) */
static inline __m512 mv_join(__m256 lo, __m256 hi)
{
    return _mm512_castpd_ps(
        _mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(lo)), _mm256_castps_pd(hi), 1));
}

/* ---- a row's sum ---------------------------------------------------------------------- */

/* The sum of v's 16 lanes, in the pairings of gcc's _mm512_reduce_add_ps
 * (halves, quarters, then (0 + 2) + (1 + 3)), written out so that
 * mv_hsum16x4 can add the same pairs for four rows' worth at once. */
static inline float mv_hsum16(__m512 v)
{
    __m256 y = _mm256_add_ps(_mm512_castps512_ps256(v),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 z = _mm_add_ps(_mm256_castps256_ps128(y), _mm256_extractf128_ps(y, 1));
    __m128 w = _mm_add_ps(z, _mm_shuffle_ps(z, z, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm_cvtss_f32(_mm_add_ss(w, _mm_shuffle_ps(w, w, _MM_SHUFFLE(3, 2, 0, 1))));
}

/* [mv_hsum16(a0), mv_hsum16(a1), mv_hsum16(a2), mv_hsum16(a3)]: the same
 * additions (float adds commute exactly), 10 operations instead of 28. */
static inline __m128 mv_hsum16x4(__m512 a0, __m512 a1, __m512 a2, __m512 a3)
{
    /* [a_r lanes c + c + 8] for two rows per vector */
    __m512 y01 = _mm512_add_ps(_mm512_shuffle_f32x4(a0, a1, _MM_SHUFFLE(1, 0, 1, 0)),
                               _mm512_shuffle_f32x4(a0, a1, _MM_SHUFFLE(3, 2, 3, 2)));
    __m512 y23 = _mm512_add_ps(_mm512_shuffle_f32x4(a2, a3, _MM_SHUFFLE(1, 0, 1, 0)),
                               _mm512_shuffle_f32x4(a2, a3, _MM_SHUFFLE(3, 2, 3, 2)));
    /* quarter r: row r's lanes c + c + 4 */
    __m512 z = _mm512_add_ps(_mm512_shuffle_f32x4(y01, y23, _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(y01, y23, _MM_SHUFFLE(3, 1, 3, 1)));
    __m512 w = _mm512_add_ps(z, _mm512_shuffle_ps(z, z, _MM_SHUFFLE(1, 0, 3, 2)));
    __m512 s = _mm512_add_ps(w, _mm512_shuffle_ps(w, w, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm512_castps512_ps128(_mm512_permutexvar_ps(
        _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), s));
}

/* The 32 value bytes of the m (1..16) blocks at p (block 0's scale) in
 * simd512_t16x32's input order, z[i] = [block c0 | block c0 + 4] with c0 =
 * i (i < 4) or i + 4: a full group by plain loads, a short one under masks
 * (blocks past m zero; no address past them is formed). */
static inline __attribute__((always_inline)) void mv_group_z(const uint8_t *p, int m, __m512i z[8])
{
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        int c0 = i < 4 ? i : 4 + i, c1 = c0 + 4;
        __m256i lo = m == MVB_G
                         ? loadu_256(p + (size_t)c0 * Q8_0_BYTES + 2)
                         : _mm256_maskz_loadu_epi8(c0 < m ? ~(__mmask32)0 : 0,
                                                   p + (size_t)(c0 < m ? c0 : 0) * Q8_0_BYTES + 2);
        __m256i hi = m == MVB_G
                         ? loadu_256(p + (size_t)c1 * Q8_0_BYTES + 2)
                         : _mm256_maskz_loadu_epi8(c1 < m ? ~(__mmask32)0 : 0,
                                                   p + (size_t)(c1 < m ? c1 : 0) * Q8_0_BYTES + 2);
        z[i] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    }
}

/* ---- one token ---------------------------------------------------------------------- */

/* A token alone reads each weight block once, so transposing the weights
 * does not pay: each block's int8 dot is taken in its natural layout (8
 * lanes of partial sums) and a group's sixteen blocks' lanes are then
 * added across in a tree (mv_fold16) into one lane per block: the same
 * exact integers as the batched kernel's, then the same float work, so the
 * same bits.
 *
 * A zmm holds two blocks, [block c0 | block c0 + 4] with c0 = i (i < 4)
 * or i + 4, mv_group_z's order, for which the tree ends with block c in
 * lane c: per group eight vpdpbusd and 21 adds and shuffles, against
 * sixteen ymm vpdpbusd and 42 ymm adds and shuffles before (that kernel
 * took 1.5x the avx2 row kernel's time with the rows in L2 on a Zen 5 VM,
 * gcc spilling the sixteen partial sums to the stack).
 *
 * The prepared activation: xz [ng][8][64] i8 (group j's vector i = the
 * values of blocks 16 j + c0 and 16 j + c0 + 4, zero past nb), then corr
 * [ng * 16] i32 and dx [ng * 16] f32 as the packed groups have them. */
static size_t prep_q8_0_bytes(int64_t n)
{
    int64_t ng = (n / QK + MVB_G - 1) / MVB_G;
    return (size_t)ng * (8 * 64 + MVB_G * 8);
}

/* Where block c (0..15) of a group lies in its xz vectors. */
static inline size_t xz_off(int c)
{
    return (size_t)((c & 3) + 4 * (c >> 3)) * 64 + (size_t)((c >> 2) & 1) * 32;
}

/* Two blocks' partial-sum vectors -> per 128-bit lane [d0 0+2, d1 0+2,
 * d0 1+3, d1 1+3]: mv_fold16's first step (exact int32 adds). */
static inline __m512i mv_fold2z(__m512i d0, __m512i d1)
{
    return _mm512_add_epi32(_mm512_unpacklo_epi32(d0, d1), _mm512_unpackhi_epi32(d0, d1));
}

/* mv_fold2z of vectors 0-1, 2-3, 4-5, 6-7 of a group (or of the first four
 * only, f[2] = f[3] = 0) -> lane c = the sum of block c's lanes. */
static inline __m512i mv_fold16(const __m512i f[4])
{
    __m512i g0 = _mm512_add_epi32(_mm512_unpacklo_epi64(f[0], f[1]), _mm512_unpackhi_epi64(f[0], f[1]));
    __m512i g1 = _mm512_add_epi32(_mm512_unpacklo_epi64(f[2], f[3]), _mm512_unpackhi_epi64(f[2], f[3]));
    /* g_h's 128-bit lanes: blocks 8h + 0..3 over dwords 0-3 and 4-7 of
     * each, then blocks 8h + 4..7 the same way */
    return _mm512_add_epi32(_mm512_shuffle_i32x4(g0, g1, _MM_SHUFFLE(2, 0, 2, 0)),
                            _mm512_shuffle_i32x4(g0, g1, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* The int8 dots of the m (1..16) blocks at p (block 0's scale) with a
 * group's xz, one lane per block (lanes past m: 0, the weights loaded as 0
 * against zero activations), biased as the batched kernel's (w + 128). A
 * group of at most 8 blocks takes vectors 0-3 only. */
static inline __attribute__((always_inline)) __m512i mv_dots16(const uint8_t *p, const uint8_t *xz, int m)
{
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    const int nv = m > 8 ? 8 : 4;
    __m512i f[4];
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        if (2 * k >= nv) {
            f[k] = _mm512_setzero_si512();
            continue;
        }
        __m512i d[2];
#pragma GCC unroll 2
        for (int j = 0; j < 2; j++) {
            int i = 2 * k + j, c0 = i < 4 ? i : i + 4, c1 = c0 + 4;
            __m256i lo = m == MVB_G || (m == 8 && c0 < 8)
                             ? loadu_256(p + (size_t)c0 * Q8_0_BYTES + 2)
                             : _mm256_maskz_loadu_epi8(c0 < m ? ~(__mmask32)0 : 0,
                                                       p + (size_t)(c0 < m ? c0 : 0) * Q8_0_BYTES + 2);
            __m256i hi = m == MVB_G || (m == 8 && c1 < 8)
                             ? loadu_256(p + (size_t)c1 * Q8_0_BYTES + 2)
                             : _mm256_maskz_loadu_epi8(c1 < m ? ~(__mmask32)0 : 0,
                                                       p + (size_t)(c1 < m ? c1 : 0) * Q8_0_BYTES + 2);
            __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
            d[j] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_xor_si512(z, bias),
                                       _mm512_load_si512((const void *)(xz + 64 * i)));
        }
        f[k] = mv_fold2z(d[0], d[1]);
    }
    return mv_fold16(f);
}

static void prep_q8_0(const void *xv, int64_t n, void *xp)
{
    const uint8_t *x = xv;
    int64_t nb = n / QK, ng = (nb + MVB_G - 1) / MVB_G;
    uint8_t *xz = xp;
    int32_t *corr = (int32_t *)(void *)(xz + (size_t)ng * 8 * 64);
    float *dx = (float *)(void *)(corr + ng * MVB_G);
    memset(xz, 0, (size_t)ng * 8 * 64);
    const __m256i ones = _mm256_set1_epi8(1);
    for (int64_t b = 0; b < ng * MVB_G; b += 8) {
        int m = nb - b >= 8 ? 8 : nb > b ? (int)(nb - b) : 0;
        uint8_t *xg = xz + (size_t)(b / MVB_G) * 8 * 64;
        __m256i d[8];
        for (int c = 0; c < 8; c++) {
            __m256i v = _mm256_maskz_loadu_epi8(c < m ? ~(__mmask32)0 : 0,
                                                x + (size_t)(c < m ? b + c : 0) * Q8_0_BYTES + 2);
            if (c < m) _mm256_store_si256((__m256i *)(void *)(xg + xz_off((int)(b % MVB_G) + c)), v);
            d[c] = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, v);
        }
        /* -128 times each block's sum (|sum| <= 32 * 128: exact) */
        _mm256_store_si256(
            (__m256i *)(void *)(corr + b),
            _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(mv_fold8(d), 7)));
        _mm256_store_ps(dx + b,
                        m > 0 ? mv_scales8(x + (size_t)b * Q8_0_BYTES, m) : _mm256_setzero_ps());
    }
}

/* The rows' lines MV1_PF bytes ahead are asked for into L1, one request a
 * line. Sixteen weight blocks at 0.6 ns a block in L2 (2048 x 768, one
 * thread, a Zen 5 VM) outrun the hardware prefetch from DRAM: without the
 * requests the kernel read 24-32 GB/s against the avx2 row kernel's 24-38
 * (which asks 3072 bytes ahead), with them 26-41; distances 6144-12288
 * measured alike, 1536-3072 worse than none, and the batched kernel's two
 * hints (mvb_pf) worse too (docs/kernel-passes-2.md, twenty-third pass).
 * The earlier kernel (ymm halves, twice the loads a group) took 1.5x the
 * avx2 kernel's time in L2 here and asked for nothing: on the Zen 4 VM of
 * its session (AVX-512 on 256-bit halves) a request 3072 bytes ahead had
 * cost it 15% from DRAM. */
#define MV1_PF 8192

static void mv_q8_0(int64_t n_rows, int64_t n_cols, const uint8_t *W, size_t rb, const void *x,
                    const void *xp, float *y)
{
    (void)x;
    int64_t nb = n_cols / QK, ng = (nb + MVB_G - 1) / MVB_G;
    const uint8_t *xz = xp;
    const int32_t *corr = (const int32_t *)(const void *)(xz + (size_t)ng * 8 * 64);
    const float *dx = (const float *)(const void *)(corr + ng * MVB_G);
    uintptr_t last = (uintptr_t)W + (n_rows > 0 ? (size_t)n_rows * rb - 1 : 0);
    for (int64_t r = 0; r < n_rows; r++) {
        const uint8_t *w = W + (size_t)r * rb;
        __m512 a = _mm512_setzero_ps();
        int64_t b = 0;
        const uint8_t *xg = xz;
        for (; nb - b > 8; b += MVB_G, xg += 8 * 64) {
            const uint8_t *p = w + (size_t)b * Q8_0_BYTES;
            int m = nb - b >= MVB_G ? MVB_G : (int)(nb - b);
            mv_pf_at((uintptr_t)p + MV1_PF, last, 9);
            __m512i d = _mm512_add_epi32(m == MVB_G ? mv_dots16(p, xg, MVB_G) : mv_dots16(p, xg, m),
                                         _mm512_load_si512((const void *)(corr + b)));
            __m256 dl = f16x8_strided(p, Q8_0_BYTES),
                   dh = m == MVB_G ? f16x8_strided(p + 8 * Q8_0_BYTES, Q8_0_BYTES)
                                   : mv_scales8(p + 8 * Q8_0_BYTES, m - 8);
            __m512 dw = mv_join(dl, dh);
            __m512 sc = _mm512_mul_ps(dw, _mm512_load_ps(dx + b));
            a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), sc, a);
        }
        if (b < nb) {
            const uint8_t *p = w + (size_t)b * Q8_0_BYTES;
            int m = (int)(nb - b);
            mv_pf_at((uintptr_t)p + MV1_PF, last, 5);
            __m256i d = _mm256_add_epi32(
                _mm512_castsi512_si256(m == 8 ? mv_dots16(p, xg, 8) : mv_dots16(p, xg, m)),
                _mm256_load_si256((const __m256i *)(const void *)(corr + b)));
            __m256 sc = _mm256_mul_ps(m == 8 ? f16x8_strided(p, Q8_0_BYTES) : mv_scales8(p, m),
                                      _mm256_load_ps(dx + b));
            __m256 lo = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), sc, _mm512_castps512_ps256(a));
            a = _mm512_mask_mov_ps(a, (__mmask16)0x00ff, _mm512_castps256_ps512(lo));
        }
        y[r] = mv_hsum16(a);
    }
}

/* ---- packed activations ------------------------------------------------------------ */

/* One group of T tokens: rec [ng][T] (ng = ceil(nb / 16)), each MVB_REC
 * bytes: xt vector i lane c = bytes 4i..4i+3 of block 16j + c; corr[c] =
 * -128 * the sum of that block's 32 values; dx[c] its scale; all zero past
 * nb. */
static size_t grp_bytes(int64_t nb, int T)
{
    return (size_t)((nb + MVB_G - 1) / MVB_G) * (size_t)T * MVB_REC;
}

/* (A batch of one token is packed as tensor_mv_avx512_'s prepared
 * activation and runs that kernel.) */
static size_t pack_q8_0_bytes(int64_t n, int n_tok)
{
    return n_tok == 1 ? prep_q8_0_bytes(n) : mvb_pack_bytes(n, n_tok, MVB_TOKS, grp_bytes);
}

/* One token's record of the m (1..16) blocks at p (block 0's scale): the
 * blocks transposed (no bias), -128 times each block's sum, the scales;
 * lanes past m zero. */
static void pack_rec(const uint8_t *p, int m, uint8_t *rec)
{
    __m512i z[8], g[8];
    mv_group_z(p, m, z);
    simd512_t16x32(z, g, _mm512_setzero_si512());
    const __m512i ones = _mm512_set1_epi8(1);
    __m512i sum = _mm512_setzero_si512();
    for (int i = 0; i < 8; i++) {
        _mm512_store_si512((void *)(rec + 64 * i), g[i]);
        sum = _mm512_dpbusd_epi32(sum, ones, g[i]); /* |sum| <= 32 * 128: exact */
    }
    _mm512_store_si512((void *)(rec + 8 * 64),
                       _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sum, 7)));
    /* masked loads and gathers: nothing past the m blocks is read, and no
     * address past them is formed */
    __m256 dl = mv_scales8(p, m < 8 ? m : 8),
           dh = mv_scales8(p + 8 * Q8_0_BYTES, m > 8 ? m - 8 : 0);
    _mm512_store_ps((float *)(void *)(rec + 8 * 64 + 64), mv_join(dl, dh));
}

static void pack_q8_0(const void *const *xv, int n_tok, int64_t n, void *packed)
{
    if (n_tok == 1) {
        prep_q8_0(xv[0], n, packed);
        return;
    }
    int64_t nb = n / QK, ng = (nb + MVB_G - 1) / MVB_G;
    int G = mvb_groups(n_tok, MVB_TOKS);
    uint8_t *o = packed;
    for (int g = 0; g < G; g++) {
        int t0, T;
        mvb_group(g, G, n_tok, &t0, &T);
        for (int t = 0; t < T; t++) {
            const uint8_t *x = xv[t0 + t];
            for (int64_t j = 0; j < ng; j++) {
                int64_t b = j * MVB_G;
                pack_rec(x + (size_t)b * Q8_0_BYTES, nb - b >= MVB_G ? MVB_G : (int)(nb - b),
                         o + ((size_t)j * (size_t)T + (size_t)t) * MVB_REC);
            }
        }
        o += grp_bytes(nb, T);
    }
}

/* ---- the kernel --------------------------------------------------------------------- */

/* The m (1..16) blocks of a group at p (block 0's scale) transposed, one per
 * lane (missing lanes: zero weights, as w + 128 = 128), and their scales. */
static inline __attribute__((always_inline)) void wgroup(const uint8_t *p, int m, __m512i g[8],
                                                         __m512 *dw)
{
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    __m512i z[8];
    mv_group_z(p, m, z);
    __m256 dl = f16x8_strided(p, Q8_0_BYTES),
           dh = m == MVB_G ? f16x8_strided(p + 8 * Q8_0_BYTES, Q8_0_BYTES)
                           : mv_scales8(p + 8 * Q8_0_BYTES, m - 8);
    simd512_t16x32(z, g, bias);
    *dw = mv_join(dl, dh);
}

/* The m (1..8) blocks at p of a short last group transposed into the
 * lower halves (ymm lane c = bytes 4i..4i+3 of block c, as w + 128; missing
 * lanes zero weights) and their scales. */
static inline __attribute__((always_inline)) void wgroup8(const uint8_t *p, int m, __m256i g[8],
                                                          __m256 *dw)
{
    __m256i r[8];
#pragma GCC unroll 8
    for (int c = 0; c < 8; c++)
        r[c] = m == 8 ? loadu_256(p + (size_t)c * Q8_0_BYTES + 2)
                      : _mm256_maskz_loadu_epi8(c < m ? ~(__mmask32)0 : 0,
                                                p + (size_t)(c < m ? c : 0) * Q8_0_BYTES + 2);
    simd256_t8x32(r, g, _mm256_set1_epi8((char)0x80));
    *dw = m == 8 ? f16x8_strided(p, Q8_0_BYTES) : mv_scales8(p, m);
}

/* One row's groups j0 .. j1 - 1 against the T tokens of a group (rec: the
 * group's packed activations, all of the row's groups). The accumulators
 * start at 0 (j0 == 0) or from acc, and go back to acc unless the row ends
 * here, where their sums go to out. */
static inline __attribute__((always_inline)) void q8_0_row(int T, const uint8_t *w, int64_t nb,
                                                           const uint8_t *rec, bool pf,
                                                           uintptr_t last, float *out,
                                                           float (*acc)[MVB_G], int64_t j0,
                                                           int64_t j1)
{
    __m512 a[MVB_TOKS];
#pragma GCC unroll 16
    for (int t = 0; t < T; t++)
        a[t] = j0 == 0 ? _mm512_setzero_ps() : _mm512_load_ps(acc[t]);
    int64_t b = j0 * MVB_G, be = BASE_MIN(nb, j1 * MVB_G);
    rec += (size_t)j0 * (size_t)T * MVB_REC;
    for (; b < be; b += MVB_G, rec += (size_t)T * MVB_REC) {
        const uint8_t *p = w + (size_t)b * Q8_0_BYTES;
        int m = nb - b >= MVB_G ? MVB_G : (int)(nb - b);
        if (m <= 8) break;
        if (pf) mvb_pf(p, (size_t)m * Q8_0_BYTES, last);
        __m512i g[8];
        __m512 dw;
        if (m == MVB_G)
            wgroup(p, MVB_G, g, &dw); /* plain loads */
        else
            wgroup(p, m, g, &dw);
#pragma GCC unroll 16
        for (int t = 0; t < T; t++) {
            const uint8_t *r = rec + (size_t)t * MVB_REC;
            __m512i s0 = _mm512_load_si512((const void *)(r + 8 * 64)), s1 = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int i = 0; i < 8; i += 2) {
                s0 = _mm512_dpbusd_epi32(s0, g[i], _mm512_load_si512((const void *)(r + 64 * i)));
                s1 = _mm512_dpbusd_epi32(s1, g[i + 1],
                                         _mm512_load_si512((const void *)(r + 64 * i + 64)));
            }
            __m512 sc =
                _mm512_mul_ps(dw, _mm512_load_ps((const float *)(const void *)(r + 8 * 64 + 64)));
            a[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)), sc, a[t]);
        }
    }
    if (b < be) {
        /* a last group of at most 8 blocks: the same lanes' work on the
         * lower halves (the upper lanes would add 0 * 0), at half the cost
         * where a zmm operation takes two 256-bit halves */
        const uint8_t *p = w + (size_t)b * Q8_0_BYTES;
        if (pf) mvb_pf(p, (size_t)(nb - b) * Q8_0_BYTES, last);
        __m256i g[8];
        __m256 dw;
        if (nb - b == 8)
            wgroup8(p, 8, g, &dw); /* the usual tail (768 columns: 16 + 8 blocks), without masks */
        else
            wgroup8(p, (int)(nb - b), g, &dw);
#pragma GCC unroll 16
        for (int t = 0; t < T; t++) {
            const uint8_t *r = rec + (size_t)t * MVB_REC;
            __m256i s0 = _mm256_load_si256((const __m256i *)(const void *)(r + 8 * 64)),
                    s1 = _mm256_setzero_si256();
#pragma GCC unroll 4
            for (int i = 0; i < 8; i += 2) {
                s0 = _mm256_dpbusd_epi32(
                    s0, g[i], _mm256_load_si256((const __m256i *)(const void *)(r + 64 * i)));
                s1 = _mm256_dpbusd_epi32(
                    s1, g[i + 1],
                    _mm256_load_si256((const __m256i *)(const void *)(r + 64 * i + 64)));
            }
            __m256 sc =
                _mm256_mul_ps(dw, _mm256_load_ps((const float *)(const void *)(r + 8 * 64 + 64)));
            __m256 lo = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(s0, s1)), sc,
                                        _mm512_castps512_ps256(a[t]));
            a[t] = _mm512_mask_mov_ps(a[t], (__mmask16)0x00ff, _mm512_castps256_ps512(lo));
        }
    }
    if (be < nb) {
#pragma GCC unroll 16
        for (int t = 0; t < T; t++)
            _mm512_store_ps(acc[t], a[t]);
        return;
    }
    const __m512 zero = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int t = 0; t < T; t += 4) {
        _Alignas(16) float o4[4];
        _mm_store_ps(o4, mv_hsum16x4(a[t], t + 1 < T ? a[t + 1] : zero, t + 2 < T ? a[t + 2] : zero,
                                     t + 3 < T ? a[t + 3] : zero));
        for (int k = 0; k < 4 && t + k < T; k++)
            out[t + k] = o4[k];
    }
}

/* Long rows against many tokens: a row's records (T x MVB_REC bytes a
 * group, against the group's 544 bytes of weights) outgrow L1, and a whole
 * row at a time read all of them from L2 for every row. Past MVB_REC_WHOLE
 * bytes of records a row, its groups are taken in chunks whose records
 * fit MVB_L1_REC, each chunk serving MVB_ROWS rows before the next one is
 * read, the rows' accumulators kept in between (the same additions in the
 * same order: the same bits). The rows' weights are then read a chunk of
 * each row at a time, which streams worse from DRAM: below the threshold
 * whole rows measured better. At 9 tokens, one thread of a Zen 5 VM, rows
 * from DRAM, ns a block and token whole rows / chunked: 14336 columns
 * 0.56 / 0.27, 8192 0.60 / 0.29, 4096 0.44 / 0.50 (46 KiB of records: kept
 * whole); at 16 tokens and 4096 columns 0.37 / 0.28; at 4 tokens and 14336
 * columns 0.76 / 0.45 (docs/kernel-passes-2.md, twenty-third pass). */
#define MVB_REC_WHOLE (64 << 10)
#define MVB_L1_REC    (16 << 10)
#define MVB_ROWS      8

static void mvb_q8_0(int64_t nr, int64_t n, const uint8_t *W, size_t rb, int n_tok,
                     const void *packed, float *y, size_t ys)
{
    if (n_tok == 1) {
        mv_q8_0(nr, n, W, rb, NULL, packed, y);
        return;
    }
    uintptr_t last = (uintptr_t)W + (nr > 0 ? (size_t)nr * rb - 1 : 0);
    int64_t nb = n / QK, ng = (nb + MVB_G - 1) / MVB_G;
    int G = mvb_groups(n_tok, MVB_TOKS);
    _Alignas(64) float acc[MVB_ROWS][MVB_TOKS][MVB_G];
    for (int64_t r0 = 0; r0 < nr; r0 += MVB_ROWS) {
        int64_t rn = BASE_MIN((int64_t)MVB_ROWS, nr - r0);
        const uint8_t *o = packed;
        for (int g = 0; g < G; g++) {
            int t0, T;
            mvb_group(g, G, n_tok, &t0, &T);
            int64_t kc = (size_t)T * (size_t)ng * MVB_REC <= MVB_REC_WHOLE
                             ? ng
                             : BASE_MAX((int64_t)1, (int64_t)(MVB_L1_REC / ((size_t)T * MVB_REC)));
            bool pf = g == 0; /* the first pass brings the rows in */
            for (int64_t j0 = 0; j0 < ng; j0 += kc) {
                int64_t j1 = BASE_MIN(ng, j0 + kc);
                for (int64_t k = 0; k < rn; k++) {
                    const uint8_t *w = W + (size_t)(r0 + k) * rb;
                    float v[MVB_TOKS];
                    switch (T) {
#define MVB_CASE(N)                                                                                \
    case N:                                                                                        \
        q8_0_row(N, w, nb, o, pf, last, v, acc[k], j0, j1);                                        \
        break;
                        MVB_CASE(16)
                        MVB_CASE(15)
                        MVB_CASE(14)
                        MVB_CASE(13)
                        MVB_CASE(12)
                        MVB_CASE(11)
                        MVB_CASE(10)
                        MVB_CASE(9)
                        MVB_CASE(8)
                        MVB_CASE(7)
                        MVB_CASE(6)
                        MVB_CASE(5)
                        MVB_CASE(4)
                        MVB_CASE(3)
                        MVB_CASE(2)
#undef MVB_CASE
                    default:
                        q8_0_row(1, w, nb, o, pf, last, v, acc[k], j0, j1);
                        break; /* not reached: T >= 2 when n_tok >= 2 */
                    }
                    if (j1 == ng)
                        for (int t = 0; t < T; t++)
                            y[(size_t)(t0 + t) * ys + (size_t)(r0 + k)] = v[t];
                }
            }
            o += grp_bytes(nb, T);
        }
    }
}

const tensor_mvb_kernel tensor_mvb_avx512_[KEEL_DTYPE_COUNT_] = {
    [KEEL_DTYPE_Q8_0] = {mvb_q8_0, pack_q8_0_bytes, pack_q8_0},
};

const tensor_mv_fn tensor_mv_avx512_[KEEL_DTYPE_COUNT_] = {
    [KEEL_DTYPE_Q8_0] = mv_q8_0,
};

const tensor_mv_prep tensor_mv_prep_avx512_[KEEL_DTYPE_COUNT_] = {
    [KEEL_DTYPE_Q8_0] = {prep_q8_0_bytes, prep_q8_0},
};
