/*
 * matvec_avx2.c — AVX2/FMA matrix-vector kernels over ranges of weight
 * rows (tensor_mv_avx2_, used by tensor_matvec and tensor_matvec_multi; the
 * per-row dots of dot_avx2.c serve the rest: dot tiles, tails, other
 * dtypes).
 *
 * Decode streams every weight once per token, so a kernel is good when the
 * memory system never waits for it and it never waits for memory:
 *
 * - Prefetch. Each kernel walks its row range as one byte stream and asks
 *   for the lines MV_PF bytes ahead of what it reads, about one line per 64
 *   bytes consumed, and not past the range (the next range is usually
 *   another thread's). A dot does much more work per byte than a plain
 *   read, so the out-of-order window alone keeps few lines in flight, and
 *   the hardware streamers did not make up for it on the Intel VM these
 *   were tuned on. Issued a whole row at a time the prefetches starved the
 *   demand loads of wide rows on AMD; spread over the row they do not.
 * - Less work per block, with what depends only on the activation done once
 *   per product (tensor_mv_prep_avx2, into the caller's scratch): its block
 *   scales as f32; for q4_0 rows the -8 correction 8 sum(x) per block (an
 *   exact int32) and the activation's quants laid out per pair of blocks; for q4_K /
 *   q5_K the activation's sums per 32-value sub-block (what the mins
 *   multiply). Weight block scales are converted eight at a time and
 *   broadcast from memory (a load, not a shuffle).
 * - q4_0 takes two blocks per vector: their 16 nibble bytes side by side,
 *   the low nibbles of both in one mask, the high ones in one shift and
 *   mask, against the activation's quants in the same order; the two
 *   maddubs results add in int16 (|sum| <= 2 * 2 * 15 * 128) before one
 *   widening. The nibbles stay unsigned: sum (q - 8) x = sum q x - 8 sum x,
 *   in int32. Four pairs are folded into one lane per block, and the float
 *   work is q8_0's (one convert, scale product and FMA per eight blocks),
 *   so that the batched kernel, which gets the same integers from the
 *   values transposed, gives the same bits (twenty-first pass).
 * - q4_K / q5_K decode their 12-byte scale field with two shuffles and a
 *   few masks (no scalar bit work) and widen the scales into int16 pairs
 *   broadcast from memory. What is per super-block rather than per value
 *   (that decode, d and dmin, the mins term, the final convert and FMA) is
 *   done for the two streams' rows at once in 256-bit registers
 *   (`keel bench kernels -t 2 --simd avx2`, interleaved with the tree
 *   before: q4_K in cache 16.7-17.1 -> 18.4-19.1 GB/s, from DRAM with 2
 *   threads 28.6-28.7 -> 29.0-30.2).
 * - Two streams. Each range is cut in two halves and row r of the first
 *   half runs in lockstep with row r of the second: two independent
 *   streams per thread, each prefetched, keep more lines in flight than
 *   one (three or four measured no better, and worse on small matrices).
 *   Rows of a range taken side by side without the software prefetch had
 *   lost the hardware prefetch on AMD (2.5-3x slower from DRAM); here each
 *   stream asks for its own lines. MV_ROWS2 holds the driver; each dtype
 *   writes the dot of NS (1 or 2) rows at once.
 * All of it together, `keel bench kernels -t 2 --simd avx2` (4096
 * columns, >= 256 MiB of weights) on that VM, before (7b4d56a) -> after,
 * GB/s with 1 / 2 threads: q8_0 8.7 / 16.8-17.0 -> 16.2-17.0 / 32.9-33.1,
 * q4_0 3.8 / 7.5-7.6 -> 13.9-14.1 / 28.0-28.3, q4_K 5.0 / 9.8 -> 14.0 /
 * 28.1-28.3, f16 11.8-12.0 / 23.5 -> 16.5-16.7 / 33.4-34.1 (the prefetching
 * read reference of those runs: 17.6 / 35.1-35.6).
 *
 * Integer parts are exact as in the dots; only the f32 summation order
 * differs from tensor_vec_dot (tests compare with the scalar path within a
 * bound; deterministic mode runs these kernels too, through
 * tensor_matvec_batch, whose every token gets their bits).
 */
#include "avx2_util.h"
#include "matvec_batch.h"

/* ---- prefetch ------------------------------------------------------------------------ */

/* The last byte of a range, as an address: prefetches are clamped to it
 * (integer arithmetic: the clamped address may lie past the object). */
static inline uintptr_t mv_pf_last(const uint8_t *W, size_t bytes)
{
    return (uintptr_t)W + (bytes ? bytes - 1 : 0);
}

/* ---- helpers ------------------------------------------------------------------------- */

static inline size_t up8(int64_t n)
{
    return ((size_t)n + 7) & ~(size_t)7;
}

static inline size_t up64b(size_t n)
{
    return (n + 63) & ~(size_t)63;
}

/* ---- prepared activations ------------------------------------------------------------- */

/* q8_0 rows: dx [nb8] f32 (block scales, zero past nb). */
static size_t prep_q8_0_bytes(int64_t n)
{
    return up8(n / QK) * sizeof(float);
}

static void prep_x_scales(const uint8_t *x, int64_t nb, float *dx)
{
    for (int64_t b = 0; b < nb; b++) dx[b] = f16_load(x + (size_t)b * Q8_0_BYTES);
    for (int64_t b = nb; b < (int64_t)up8(nb); b++) dx[b] = 0.0f;
}

static void prep_q8_0(const void *x, int64_t n, void *xp)
{
    prep_x_scales(x, n / QK, xp);
}

/* q4_0 rows: dx [nb8] f32 (block scales) | xs8 [nb8] i32 (8 sum(q_x) per
 * block, the nibbles' -8 offset), both zero past nb | pairs [nb2][64] u8
 * (blocks 2k, 2k+1: values 0-15 of both, then 16-31 of both; a missing
 * last block's values 0), at 64-byte aligned offsets. */
typedef struct q4_0_prep {
    const float *dx;
    const int32_t *xs8;
    const uint8_t *pairs;
} q4_0_prep;

static q4_0_prep q4_0_prep_at(const void *xp, int64_t nb)
{
    const uint8_t *p = xp;
    size_t f = up64b(up8(nb) * sizeof(float));
    q4_0_prep q = {(const float *)(const void *)p, (const int32_t *)(const void *)(p + f), p + 2 * f};
    return q;
}

static size_t prep_q4_0_bytes(int64_t n)
{
    int64_t nb = n / QK;
    return 2 * up64b(up8(nb) * sizeof(float)) + (size_t)((nb + 1) / 2) * 64;
}

static void prep_q4_0(const void *xv, int64_t n, void *xp)
{
    const uint8_t *x = xv;
    int64_t nb = n / QK;
    size_t f = up64b(up8(nb) * sizeof(float));
    float *dx = xp;
    int32_t *xs8 = (int32_t *)(void *)((uint8_t *)xp + f);
    uint8_t *pairs = (uint8_t *)xp + 2 * f;
    prep_x_scales(x, nb, dx);
    const __m256i ones = _mm256_set1_epi8(1);
    for (int64_t b = 0; b < (int64_t)up8(nb); b++)
        xs8[b] = b < nb ? 8 * hsum_epi32(dot_us8_i32(ones, loadu_256(x + (size_t)b * Q8_0_BYTES + 2))) : 0;
    for (int64_t k = 0; k < nb; k += 2) {
        const uint8_t *a = x + (size_t)k * Q8_0_BYTES + 2, *c = a + Q8_0_BYTES;
        uint8_t *o = pairs + (size_t)(k / 2) * 64;
        __m128i z = _mm_setzero_si128();
        __m128i c0 = k + 1 < nb ? loadu_128(c) : z, c1 = k + 1 < nb ? loadu_128(c + 16) : z;
        _mm256_storeu_si256((__m256i *)(void *)o, _mm256_set_m128i(c0, loadu_128(a)));
        _mm256_storeu_si256((__m256i *)(void *)(o + 32), _mm256_set_m128i(c1, loadu_128(a + 16)));
    }
}

/* q4_K / q5_K rows: pairs [nsb][8] i16 (the activation's sums over each
 * 32-value sub-block) | dx [nsb] f32. */
static size_t prep_kq_bytes(int64_t n)
{
    int64_t nsb = n / QK_K;
    return (size_t)nsb * 16 + (size_t)nsb * sizeof(float);
}

static void prep_kq(const void *xv, int64_t n, void *xp)
{
    const uint8_t *x = xv;
    int64_t nsb = n / QK_K;
    uint8_t *pairs = xp;
    float *dx = (float *)(void *)(pairs + (size_t)nsb * 16);
    for (int64_t i = 0; i < nsb; i++) {
        const uint8_t *xb = x + (size_t)i * Q8_K_BYTES;
        __m256i bs = loadu_256(xb + Q8_K_BSUMS);
        _mm_storeu_si128((__m128i *)(pairs + (size_t)i * 16),
                         _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1)));
        dx[i] = rd_f32(xb);
    }
}

/* ---- the two-stream driver -------------------------------------------------------------- */

/* A range's kernel from a ROWS(NS, w, n, x, xp, last, out) body that
 * computes out[s] = dot(row w[s], x) for s < NS in lockstep: rows r and
 * r + h (h = half the range) together, an odd last row alone. */
#define MV_ROWS2(NAME, ROWS)                                                                       \
    static void NAME(int64_t nr, int64_t n, const uint8_t *W, size_t rb, const void *x, const void *xp, \
                     float *y)                                                                     \
    {                                                                                              \
        uintptr_t last = mv_pf_last(W, (size_t)nr * rb);                                           \
        int64_t h = nr / 2;                                                                        \
        for (int64_t r = 0; r < h; r++) {                                                          \
            const uint8_t *w[2] = {W + (size_t)r * rb, W + (size_t)(r + h) * rb};                  \
            float o[2];                                                                            \
            ROWS(2, w, n, x, xp, last, o);                                                         \
            y[r] = o[0];                                                                           \
            y[r + h] = o[1];                                                                       \
        }                                                                                          \
        if (nr & 1) {                                                                              \
            const uint8_t *w[2] = {W + (size_t)(nr - 1) * rb, W + (size_t)(nr - 1) * rb};          \
            float o[2];                                                                            \
            ROWS(1, w, n, x, xp, last, o);                                                         \
            y[nr - 1] = o[0];                                                                      \
        }                                                                                          \
    }

/* ---- q8_0 --------------------------------------------------------------------------- */

/* int8 dot of one q8_0 weight block with the activation's block, 8 x i32
 * (the sign trick: |w| the unsigned operand, w's sign moved onto x) */
static inline __m256i mv_dot_q8_0(const uint8_t *wb, const uint8_t *xb)
{
    __m256i wq = loadu_256(wb + 2), xq = loadu_256(xb + 2);
    return dot_us8_i32(_mm256_sign_epi8(wq, wq), _mm256_sign_epi8(xq, wq));
}

/* The int8 dots of the m (0..8) blocks at p with the activation's blocks
 * at xb, one lane per block (lanes past m 0): each pair of blocks folded
 * as soon as it is done (mv_fold2), then mv_fold4x2. */
static inline __attribute__((always_inline)) __m256i mv_dots8_q8_0(const uint8_t *p, const uint8_t *xb, int m)
{
    __m256i a[4];
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        int c = 2 * k;
        __m256i d0 = c < m ? mv_dot_q8_0(p + (size_t)c * Q8_0_BYTES, xb + (size_t)c * Q8_0_BYTES)
                           : _mm256_setzero_si256();
        __m256i d1 = c + 1 < m ? mv_dot_q8_0(p + (size_t)(c + 1) * Q8_0_BYTES, xb + (size_t)(c + 1) * Q8_0_BYTES)
                               : _mm256_setzero_si256();
        a[k] = mv_fold2(d0, d1);
    }
    return mv_fold4x2(a);
}

/* One weight block per lane, eight blocks (a group) at a time: each block's
 * int8 dot in its natural layout (eight lanes of partial sums, the sign
 * trick), the group's eight folded into one lane each (exact int32 adds),
 * one convert, the eight scale products d_w d_x (one IEEE multiply each)
 * and one FMA into the row's accumulator; the row's value is hsum_ps of
 * it. A short last group (n not a multiple of 256) leaves its missing
 * lanes 0 (dot and scale). The batched kernel (matvec_batch_avx2.c) gets
 * every block's dot into the same lane another way and then does the same
 * float work, so decode and a verify batch give the same bits. */
static inline __attribute__((always_inline)) void rows_q8_0(int NS, const uint8_t *const *w, int64_t n,
                                                            const void *xv, const void *xp, uintptr_t last,
                                                            float *out)
{
    const uint8_t *x = xv;
    const float *dx = xp;
    int64_t nb = n / QK, b = 0;
    __m256 a[2];
    #pragma GCC unroll 2
    for (int s = 0; s < NS; s++) a[s] = _mm256_setzero_ps();
    for (; b + 8 <= nb; b += 8) {
        const uint8_t *xb = x + (size_t)b * Q8_0_BYTES;
        __m256 d8 = _mm256_load_ps(dx + b);
        #pragma GCC unroll 2
        for (int s = 0; s < NS; s++) {
            const uint8_t *p = w[s] + (size_t)b * Q8_0_BYTES;
            mv_pf(p, last, 5);
            __m256 sc = _mm256_mul_ps(f16x8_strided(p, Q8_0_BYTES), d8);
            a[s] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mv_dots8_q8_0(p, xb, 8)), sc, a[s]);
        }
    }
    if (b < nb) {
        int m = (int)(nb - b);
        const uint8_t *xb = x + (size_t)b * Q8_0_BYTES;
        __m256 d8 = _mm256_load_ps(dx + b); /* zero past nb */
        #pragma GCC unroll 2
        for (int s = 0; s < NS; s++) {
            const uint8_t *p = w[s] + (size_t)b * Q8_0_BYTES;
            __m256 sc = _mm256_mul_ps(mvb_scales_tail(p, m, Q8_0_BYTES), d8);
            a[s] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mv_dots8_q8_0(p, xb, m)), sc, a[s]);
        }
    }
    #pragma GCC unroll 2
    for (int s = 0; s < NS; s++) out[s] = hsum_ps(a[s]);
}

MV_ROWS2(mv_q8_0, rows_q8_0)

/* ---- q4_0 --------------------------------------------------------------------------- */

/* The int8 dots of the m (0..8) q4_0 blocks at p with the activation's
 * pairs at xq, one lane per block (lanes past m 0): per pair of blocks
 * their unsigned nibbles (values 0-15 of both, then 16-31) against the
 * pairs, vpmaddubsw, one vpmaddwd by ones ([a x 4 | a+1 x 4]), then three
 * horizontal adds and one permute into block order. The caller takes off
 * the -8 offset. */
static inline __attribute__((always_inline)) __m256i mv_dots8_q4_0(const uint8_t *p, const uint8_t *xq, int m)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256i a[4];
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        int c = 2 * k;
        if (c >= m) {
            a[k] = _mm256_setzero_si256();
            continue;
        }
        const uint8_t *w0 = p + (size_t)c * Q4_0_BYTES + 2;
        __m128i hi128 = c + 1 < m ? loadu_128(w0 + Q4_0_BYTES) : _mm_setzero_si128();
        __m256i v = _mm256_set_m128i(hi128, loadu_128(w0));
        __m256i lo = _mm256_maddubs_epi16(_mm256_and_si256(v, m4), loadu_256(xq + 64 * k));
        __m256i hi = _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4), loadu_256(xq + 64 * k + 32));
        a[k] = _mm256_madd_epi16(_mm256_add_epi16(lo, hi), _mm256_set1_epi16(1));
    }
    /* [pair k's low half: block 2k; high half: block 2k + 1] -> blocks 0 2 4 6 | 1 3 5 7 */
    __m256i t0 = _mm256_add_epi32(_mm256_unpacklo_epi32(a[0], a[1]), _mm256_unpackhi_epi32(a[0], a[1]));
    __m256i t1 = _mm256_add_epi32(_mm256_unpacklo_epi32(a[2], a[3]), _mm256_unpackhi_epi32(a[2], a[3]));
    __m256i u = _mm256_add_epi32(_mm256_unpacklo_epi64(t0, t1), _mm256_unpackhi_epi64(t0, t1));
    return _mm256_permutevar8x32_epi32(u, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* q4_0 as q8_0: one block per lane, eight at a time; each block's exact
 * dot sum((q - 8) x) is its nibbles' dot less the prepared 8 sum(x), then
 * one convert, the eight scale products and one FMA per group. The
 * batched kernel (matvec_batch_avx2.c) gets the same integers into the
 * same lanes from the values sign-extended and transposed, so decode and a
 * verify batch give the same bits. */
static inline __attribute__((always_inline)) void rows_q4_0(int NS, const uint8_t *const *w, int64_t n,
                                                            const void *xv, const void *xpv, uintptr_t last,
                                                            float *out)
{
    (void)xv;
    int64_t nb = n / QK;
    q4_0_prep xp = q4_0_prep_at(xpv, nb);
    __m256 a[2];
    #pragma GCC unroll 2
    for (int s = 0; s < NS; s++) a[s] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b += 8) {
        int m = nb - b >= 8 ? 8 : (int)(nb - b);
        const uint8_t *xq = xp.pairs + (size_t)b * 32;
        __m256 d8 = _mm256_load_ps(xp.dx + b); /* zero past nb */
        __m256i s8 = _mm256_load_si256((const __m256i *)(const void *)(xp.xs8 + b));
        #pragma GCC unroll 2
        for (int s = 0; s < NS; s++) {
            const uint8_t *p = w[s] + (size_t)b * Q4_0_BYTES;
            mv_pf(p, last, 3);
            __m256 sc = _mm256_mul_ps(m == 8 ? f16x8_strided(p, Q4_0_BYTES) : mvb_scales_tail(p, m, Q4_0_BYTES), d8);
            __m256i d = _mm256_sub_epi32(m == 8 ? mv_dots8_q4_0(p, xq, 8) : mv_dots8_q4_0(p, xq, m), s8);
            a[s] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), sc, a[s]);
        }
    }
    #pragma GCC unroll 2
    for (int s = 0; s < NS; s++) out[s] = hsum_ps(a[s]);
}

MV_ROWS2(mv_q4_0, rows_q4_0)

/* ---- K-quants ----------------------------------------------------------------------- */

/* q4_K / q5_K rows against q8_K. Per super-block and row the integer sum
 * sum_j sc_j (q . x)_j (8 x i32) scaled by d d_x, and the mins term
 * -dmin d_x sum_j m_j xsum_j. What is per super-block rather than per
 * value is done for the two rows at once: their scale fields decoded in
 * one 256-bit pass (lane s = row s), the four f16 d / dmin converted
 * together, the mins term as one madd, convert and FMA, the rows' sums
 * reduced into one vector [r0 r0 r1 r1 | r0 r0 r1 r1] before one convert
 * and FMA (with NS = 1 the second lane repeats the row and is dropped).
 * Q5 adds the fifth bit from qh. */
static inline __attribute__((always_inline)) void rows_q45_K(int Q5, int NS, const uint8_t *const *w, int64_t n,
                                                             const void *xv, const void *xp, uintptr_t last,
                                                             float *out)
{
    const char z = (char)0x80;
    const __m256i m4 = _mm256_set1_epi8(0x0F), b16 = _mm256_set1_epi8(0x10);
    /* sc0-3 / sc4-7 of each lane's row as int16 pairs (s, s) */
    const __m256i pair_lo = _mm256_setr_epi8(0, z, 0, z, 1, z, 1, z, 2, z, 2, z, 3, z, 3, z, 0, z, 0, z, 1, z, 1, z, 2,
                                             z, 2, z, 3, z, 3, z);
    const __m256i pair_hi = _mm256_setr_epi8(4, z, 4, z, 5, z, 5, z, 6, z, 6, z, 7, z, 7, z, 4, z, 4, z, 5, z, 5, z, 6,
                                             z, 6, z, 7, z, 7, z);
    const __m256i sel_d = _mm256_setr_epi32(0, 0, 2, 2, 0, 0, 2, 2), sel_m = _mm256_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3);
    const __m128 sgn = _mm_setr_ps(1.0f, -1.0f, 1.0f, -1.0f);
    const size_t bb = Q5 ? Q5_K_BYTES : Q4_K_BYTES;
    const uint8_t *x = xv;
    int64_t nsb = n / QK_K;
    const uint8_t *pairs = xp;
    const float *dxs = (const float *)(const void *)(pairs + (size_t)nsb * 16);
    const uint8_t *w1 = w[NS - 1];
    __m256 acc = _mm256_setzero_ps(), macc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nsb; i++) {
        const uint8_t *xq = x + (size_t)i * Q8_K_BYTES + Q8_K_QS;
        const uint8_t *b0 = w[0] + (size_t)i * bb, *b1 = w1 + (size_t)i * bb;
        /* about one line per 64 bytes: 144-byte q4_K blocks take 2 and 3 in turn */
        mv_pf(b0, last, Q5 ? 3 : 2);
        if (NS > 1) mv_pf(b1, last, Q5 ? 3 : 2);
        if (!Q5 && (i & 1)) {
            mv_pf(b0 + 128, last, 1);
            if (NS > 1) mv_pf(b1 + 128, last, 1);
        }
        /* s32[4 s + j] = row s's sc_j, s32[8 + 4 s + j] = its sc_4+j (as pairs) */
        _Alignas(32) int32_t s32[16];
        __m256i sm = kq_scales_mins_u8x2(b0 + 4, b1 + 4);
        _mm256_store_si256((__m256i *)s32, _mm256_shuffle_epi8(sm, pair_lo));
        _mm256_store_si256((__m256i *)(s32 + 8), _mm256_shuffle_epi8(sm, pair_hi));
        /* [d0 dmin0 d1 dmin1] d_x, dmin negated */
        __m128 dd = _mm_mul_ps(_mm_cvtph_ps(_mm_setr_epi32((int)rd_u32(b0), (int)rd_u32(b1), 0, 0)),
                               _mm_mul_ps(_mm_set1_ps(dxs[i]), sgn));
        __m256 dd8 = _mm256_castps128_ps256(dd);
        __m256i mins = _mm256_madd_epi16(_mm256_unpackhi_epi8(sm, _mm256_setzero_si256()),
                                         _mm256_broadcastsi128_si256(loadu_128(pairs + (size_t)i * 16)));
        macc = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(dd8, sel_m), _mm256_cvtepi32_ps(mins), macc);
        __m256i hb[2], si[2];
#pragma GCC unroll 2
        for (int s = 0; s < NS; s++) {
            hb[s] = Q5 ? loadu_256(w[s] + (size_t)i * bb + 16) : _mm256_setzero_si256();
            si[s] = _mm256_setzero_si256();
        }
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            __m256i x0 = loadu_256(xq + 64 * c), x1 = loadu_256(xq + 64 * c + 32);
#pragma GCC unroll 2
            for (int s = 0; s < NS; s++) {
                __m256i q = loadu_256(w[s] + (size_t)i * bb + (Q5 ? 48 : 16) + 32 * c);
                __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                if (Q5) {
                    /* bit 2c of qh -> 0x10 for the low half, bit 2c + 1 for the high half */
                    lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(hb[s], 4), b16));
                    hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(hb[s], 3), b16));
                    hb[s] = _mm256_srli_epi16(hb[s], 2);
                }
                /* set1 of the value, not a broadcast through &s32[k]: gcc hoisted those
                 * addresses out of the loop and spilled them (a reload per use) */
                int k = c < 2 ? 4 * s + 2 * c : 8 + 4 * s + 2 * c - 4;
                __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, x0), _mm256_set1_epi32(s32[k]));
                __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, x1), _mm256_set1_epi32(s32[k + 1]));
                si[s] = _mm256_add_epi32(si[s], _mm256_add_epi32(p0, p1));
            }
        }
        __m256i h = hadd2_epi32(si[0], NS > 1 ? si[1] : si[0]);
        acc = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(dd8, sel_d), _mm256_cvtepi32_ps(h), acc);
    }
    /* acc: [r0 r0 r1 r1 | r0 r0 r1 r1], macc: [r0 x 4 | r1 x 4] */
    __m128 a4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    __m128 mh = _mm_hadd_ps(_mm256_castps256_ps128(macc), _mm256_extractf128_ps(macc, 1));
    __m128 r = _mm_add_ps(_mm_hadd_ps(a4, a4), _mm_hadd_ps(mh, mh)); /* [row 0, row 1, row 0, row 1] */
    out[0] = _mm_cvtss_f32(r);
    if (NS > 1) out[1] = _mm_cvtss_f32(_mm_movehdup_ps(r));
}

static inline __attribute__((always_inline)) void rows_q4_K(int NS, const uint8_t *const *w, int64_t n,
                                                            const void *x, const void *xp, uintptr_t last,
                                                            float *out)
{
    rows_q45_K(0, NS, w, n, x, xp, last, out);
}

static inline __attribute__((always_inline)) void rows_q5_K(int NS, const uint8_t *const *w, int64_t n,
                                                            const void *x, const void *xp, uintptr_t last,
                                                            float *out)
{
    rows_q45_K(1, NS, w, n, x, xp, last, out);
}

MV_ROWS2(mv_q4_K, rows_q4_K)
MV_ROWS2(mv_q5_K, rows_q5_K)

/* q6_K rows against q8_K: 16 signed sub-block scales of 16 values; the
 * -32 offset as 32 sum_g sc_g bsum_g (the dot of dot_avx2.c). */
static inline __attribute__((always_inline)) void rows_q6_K(int NS, const uint8_t *const *w, int64_t n,
                                                            const void *xv, const void *xp, uintptr_t last,
                                                            float *out)
{
    (void)xp;
    const uint8_t *x = xv;
    int64_t nsb = n / QK_K;
    __m256 acc[2];
#pragma GCC unroll 2
    for (int s = 0; s < NS; s++) acc[s] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nsb; i++) {
        const uint8_t *xb = x + (size_t)i * Q8_K_BYTES;
#pragma GCC unroll 2
        for (int s = 0; s < NS; s++) {
            const uint8_t *b = w[s] + (size_t)i * Q6_K_BYTES;
            mv_pf(b, last, 3 + (int)(i & 1));
            acc[s] = _mm256_fmadd_ps(_mm256_set1_ps(rd_f32(xb) * f16_load(b + 208)),
                                     _mm256_cvtepi32_ps(q6_K_block_sumi(b, xb)), acc[s]);
        }
    }
#pragma GCC unroll 2
    for (int s = 0; s < NS; s++) out[s] = hsum_ps(acc[s]);
}

MV_ROWS2(mv_q6_K, rows_q6_K)

/* ---- f16 / bf16 / f32 ------------------------------------------------------------- */

static inline __m256 mv_load8(keel_dtype t, const uint8_t *p)
{
    if (t == KEEL_DTYPE_F16) return _mm256_cvtph_ps(loadu_128(p));
    if (t == KEEL_DTYPE_BF16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(loadu_128(p)), 16));
    return _mm256_loadu_ps((const float *)(const void *)p);
}

static inline float mv_load1(keel_dtype t, const uint8_t *p)
{
    return t == KEEL_DTYPE_F16 ? tensor_f16_to_f32(rd_u16(p)) : t == KEEL_DTYPE_BF16 ? tensor_bf16_to_f32(rd_u16(p)) : rd_f32(p);
}

static inline __attribute__((always_inline)) void rows_fp(keel_dtype t, int NS, const uint8_t *const *w, int64_t n,
                                                          const float *x, uintptr_t last, float *out)
{
    const size_t es = t == KEEL_DTYPE_F32 ? 4 : 2;
    __m256 a[2][4];
    #pragma GCC unroll 2
    for (int s = 0; s < NS; s++) a[s][0] = a[s][1] = a[s][2] = a[s][3] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        #pragma GCC unroll 2
        for (int s = 0; s < NS; s++) {
            const uint8_t *p = w[s] + (size_t)i * es;
            mv_pf(p, last, (int)es / 2); /* 32 values: 64 or 128 bytes */
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++)
                a[s][k] = _mm256_fmadd_ps(mv_load8(t, p + 8 * k * es), _mm256_loadu_ps(x + i + 8 * k), a[s][k]);
        }
    for (; i + 8 <= n; i += 8)
        #pragma GCC unroll 2
        for (int s = 0; s < NS; s++)
            a[s][0] = _mm256_fmadd_ps(mv_load8(t, w[s] + (size_t)i * es), _mm256_loadu_ps(x + i), a[s][0]);
    #pragma GCC unroll 2
    for (int s = 0; s < NS; s++) {
        float r = hsum_ps(_mm256_add_ps(_mm256_add_ps(a[s][0], a[s][1]), _mm256_add_ps(a[s][2], a[s][3])));
        for (int64_t j = i; j < n; j++) r += mv_load1(t, w[s] + (size_t)j * es) * x[j];
        out[s] = r;
    }
}

static inline __attribute__((always_inline)) void rows_f16(int NS, const uint8_t *const *w, int64_t n, const void *x,
                                                           const void *xp, uintptr_t last, float *out)
{
    (void)xp;
    rows_fp(KEEL_DTYPE_F16, NS, w, n, x, last, out);
}

static inline __attribute__((always_inline)) void rows_bf16(int NS, const uint8_t *const *w, int64_t n, const void *x,
                                                            const void *xp, uintptr_t last, float *out)
{
    (void)xp;
    rows_fp(KEEL_DTYPE_BF16, NS, w, n, x, last, out);
}

static inline __attribute__((always_inline)) void rows_f32(int NS, const uint8_t *const *w, int64_t n, const void *x,
                                                           const void *xp, uintptr_t last, float *out)
{
    (void)xp;
    rows_fp(KEEL_DTYPE_F32, NS, w, n, x, last, out);
}

MV_ROWS2(mv_f16, rows_f16)
MV_ROWS2(mv_bf16, rows_bf16)
MV_ROWS2(mv_f32, rows_f32)

const tensor_mv_fn tensor_mv_avx2_[KEEL_DTYPE_COUNT_] = {
    [KEEL_DTYPE_F32] = mv_f32,   [KEEL_DTYPE_F16] = mv_f16,   [KEEL_DTYPE_BF16] = mv_bf16,
    [KEEL_DTYPE_Q8_0] = mv_q8_0, [KEEL_DTYPE_Q4_0] = mv_q4_0, [KEEL_DTYPE_Q4_K] = mv_q4_K,
    [KEEL_DTYPE_Q5_K] = mv_q5_K, [KEEL_DTYPE_Q6_K] = mv_q6_K,
};

const tensor_mv_prep tensor_mv_prep_avx2_[KEEL_DTYPE_COUNT_] = {
    [KEEL_DTYPE_Q8_0] = {prep_q8_0_bytes, prep_q8_0},
    [KEEL_DTYPE_Q4_0] = {prep_q4_0_bytes, prep_q4_0},
    [KEEL_DTYPE_Q4_K] = {prep_kq_bytes, prep_kq},
    [KEEL_DTYPE_Q5_K] = {prep_kq_bytes, prep_kq},
};
