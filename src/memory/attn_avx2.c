/*
 * attn_avx2.c — AVX2/FMA/F16C kernels of attention over the cache (see
 * attn_kernels.h). Compiled with -mavx2 -mfma -mf16c; chosen at run time.
 *
 * K . q:   f32 / f16 keys against f32 queries; q8_0 / q4_0 keys against
 *          q8_0 queries (maddubs int8 dots: q8_0 with the sign trick, q4_0
 *          keys as unsigned nibbles with -8 * sum(q) added per block).
 *          Query rows four at a time: each K vector is loaded, converted or
 *          unpacked once for the four; int8 keys reduce the four rows'
 *          lanes into one vector per block before one convert and scale.
 *          From KQ8_TILE_MIN_ROWS rows (prefill blocks) q8_0 keys go
 *          through kq8_tiles: one cell per lane, each tile's transposes
 *          shared by every row.
 * p . V:   f32 / f16 rows: 64 columns of the block's V rows are converted to
 *          an f32 tile once, then accumulated into every active row with
 *          the row's accumulators in registers across the block. q8_0 /
 *          q4_0 rows: straight from the int8 / nibble values, weights
 *          p * d_v formed once per group of up to four rows, 2 * rows
 *          accumulators per 16 columns in registers (no tile); from
 *          PV_TILE_ROWS active rows (prefill blocks) through the f32 tile
 *          instead, each value converted once for all the rows.
 * exp:     Cephes-style range reduction and a degree-5 polynomial (relative
 *          error < 2e-7 over the range softmax uses).
 * decode:  one token's rows over q8_0 / q4_0 K and V, fused (attn_dec_fn);
 *          f16 / f32 K and V: decf_quad (see there). q8_0 K and V:
 *          dec8_quad_run, one cell per lane from the int8
 *          dots to the probabilities (see there). The other pairs: dec_quad,
 *          per quad of rows and block of 32 cells the scores go cell-major
 *          (one 128-bit store per cell, the scale folded into the query
 *          scales), the four rows' online softmax runs on two cells per
 *          vector, and p . V follows in the same pass. As the separate
 *          kernels do, the scores prefetch the block's V rows (a cell's
 *          worth per cell) and p . V the next block's K rows (a share per
 *          half): the requests spread over the whole block, half a block
 *          ahead. (Both the next block's K and V during the scores had
 *          kept the line-fill buffers full there: 6.9-7.1 GB/s with 1
 *          thread from DRAM against 7.8-7.9; a whole block or two ahead, the
 *          T1/T2 hints, or the first block's keys asked for at once
 *          measured no better.) It saves the separate
 *          kernels' calls per piece and the scores' transpose through
 *          memory; from DRAM the two paths read the cache at the same
 *          rate (keel bench attention --kv q8_0 --simd avx2, 7b4d56a
 *          against this kernel: 6.6-6.8 and 6.4-6.8 GB/s with 1 thread).
 *          In cache (--ctx 1024: 71 MB, in L3 here) it reads 8.6-8.7
 *          GB/s with 1 thread, little more than from DRAM: its arithmetic
 *          holds it. Tried and dropped: p . V with the weights as int16
 *          (vpmaddwd over pairs of cells instead of converting V to f32;
 *          the same speed in cache and from DRAM on the Intel VM, and on
 *          the Zen 5 VM 10.2-10.5 GB/s in L2 against 11.2-11.4 for f32).
 */
#include "attn_kernels.h"
#include "../tensor/simd_avx2.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define QK 32 /* elements per q8_0 / q4_0 block */

static inline float f16_to_f32(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* 16 bytes of packed nibbles -> 32 u8: low nibbles (elements 0..15), then
 * high nibbles (16..31), each 0..15 (no -8: callers fold it in) */
static inline __m256i q4_nibbles(const uint8_t *qs)
{
    __m128i x = _mm_loadu_si128((const __m128i *)qs);
    __m256i v = _mm256_set_m128i(_mm_srli_epi16(x, 4), x);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0f));
}

/* y[0..32) = q[k] * d + m for 32 signed bytes q */
static inline void store_dq8(float *y, __m256i q, __m256 d, __m256 m)
{
    __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    _mm256_store_ps(y, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)), d, m));
    _mm256_store_ps(y + 8, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))), d, m));
    _mm256_store_ps(y + 16, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)), d, m));
    _mm256_store_ps(y + 24, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))), d, m));
}

/* ---- K . q ------------------------------------------------------------- */

/* four row accumulators -> their four sums, in order */
static inline __m128 hsum8x4(__m256 a0, __m256 a1, __m256 a2, __m256 a3)
{
    __m256 h = hadd2_ps(hadd2_ps(a0, a1), hadd2_ps(a2, a3));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* scores of rows r0 .. r0 + nr - 1 for cell j */
static inline void store4(float *scores, int32_t r0, int32_t nr, int32_t j, __m128 s)
{
    float v[4];
    _mm_storeu_ps(v, s);
    for (int32_t i = 0; i < nr; i++)
        scores[(r0 + i) * ATTN_CB + j] = v[i];
}

/* Query rows are taken four at a time (the last quad repeats its last row;
 * those scores are not stored): each K vector is loaded (and converted)
 * once for the four rows, and the four sums are reduced together. */
static inline void quad_rows(const void *const *q, int32_t R, int32_t r0, const void *x[4])
{
    for (int i = 0; i < 4; i++)
        x[i] = q[BASE_MIN(r0 + i, R - 1)];
}

static inline __m256 load_k8(keel_dtype kt, const uint8_t *k, int32_t i)
{
    return kt == KEEL_DTYPE_F16
               ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + 2 * (size_t)i)))
               : _mm256_loadu_ps((const float *)k + i);
}

/* The quad's dots with one key over dims d8..dk (a dim that is not a
 * multiple of 8), added to s. */
static inline __m128 kq_fp_tail(keel_dtype kt, const uint8_t *k, const float *const *x, int32_t d8, int32_t dk,
                                __m128 s)
{
    float t[4] = {0, 0, 0, 0};
    for (int32_t i = d8; i < dk; i++) {
        float kf = kt == KEEL_DTYPE_F16 ? f16_to_f32(k + 2 * (size_t)i) : ((const float *)k)[i];
        for (int r = 0; r < 4; r++) t[r] += kf * x[r][i];
    }
    return _mm_add_ps(s, _mm_loadu_ps(t));
}

/* The quad's dots with keys k and l over dims 0..d8 (a multiple of 8):
 * rows in the lanes of *sk and *sl. */
static inline __attribute__((always_inline)) void kq_fp_pair(keel_dtype kt, const uint8_t *k, const uint8_t *l,
                                                             const float *const *x, int32_t d8, __m128 *sk,
                                                             __m128 *sl)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    for (int32_t i = 0; i < d8; i += 8) {
        __m256 q0 = _mm256_loadu_ps(x[0] + i), q1 = _mm256_loadu_ps(x[1] + i), q2 = _mm256_loadu_ps(x[2] + i),
               q3 = _mm256_loadu_ps(x[3] + i);
        __m256 kv = load_k8(kt, k, i), lv = load_k8(kt, l, i);
        a0 = _mm256_fmadd_ps(kv, q0, a0);
        a1 = _mm256_fmadd_ps(kv, q1, a1);
        a2 = _mm256_fmadd_ps(kv, q2, a2);
        a3 = _mm256_fmadd_ps(kv, q3, a3);
        b0 = _mm256_fmadd_ps(lv, q0, b0);
        b1 = _mm256_fmadd_ps(lv, q1, b1);
        b2 = _mm256_fmadd_ps(lv, q2, b2);
        b3 = _mm256_fmadd_ps(lv, q3, b3);
    }
    *sk = hsum8x4(a0, a1, a2, a3);
    *sl = hsum8x4(b0, b1, b2, b3);
}

/* The same for three keys (the fused decode kernel's scores): each query
 * vector loaded once for three keys, 12 accumulators. */
static inline __attribute__((always_inline)) void kq_fp_three(keel_dtype kt, const uint8_t *const k[3],
                                                              const float *const *x, int32_t d8, __m128 s[3])
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0, c0 = a0,
           c1 = a0, c2 = a0, c3 = a0;
    for (int32_t i = 0; i < d8; i += 8) {
        __m256 u = load_k8(kt, k[0], i), v = load_k8(kt, k[1], i), w = load_k8(kt, k[2], i);
        __m256 q = _mm256_loadu_ps(x[0] + i);
        a0 = _mm256_fmadd_ps(u, q, a0);
        b0 = _mm256_fmadd_ps(v, q, b0);
        c0 = _mm256_fmadd_ps(w, q, c0);
        q = _mm256_loadu_ps(x[1] + i);
        a1 = _mm256_fmadd_ps(u, q, a1);
        b1 = _mm256_fmadd_ps(v, q, b1);
        c1 = _mm256_fmadd_ps(w, q, c1);
        q = _mm256_loadu_ps(x[2] + i);
        a2 = _mm256_fmadd_ps(u, q, a2);
        b2 = _mm256_fmadd_ps(v, q, b2);
        c2 = _mm256_fmadd_ps(w, q, c2);
        q = _mm256_loadu_ps(x[3] + i);
        a3 = _mm256_fmadd_ps(u, q, a3);
        b3 = _mm256_fmadd_ps(v, q, b3);
        c3 = _mm256_fmadd_ps(w, q, c3);
    }
    s[0] = hsum8x4(a0, a1, a2, a3);
    s[1] = hsum8x4(b0, b1, b2, b3);
    s[2] = hsum8x4(c0, c1, c2, c3);
}

/* Two cells at a time: each 8 of the quad's query values is loaded once
 * for both keys (4 query loads and 2 key loads per 8 FMAs, against 4 and 1
 * per 4 cell by cell, which kept the load ports the limit on Zen 5). One
 * accumulator per row and cell, so the sums are those of a one-cell loop,
 * bit for bit; an odd last cell is paired with itself. */
static inline void kq_fp(keel_dtype kt, const uint8_t *base, size_t rb, const int32_t *idx,
                         int32_t n, const void *const *q, int32_t R, int32_t dk, float *scores,
                         attn_pf pf)
{
    int32_t d8 = dk & ~7;
    attn_pf_cursor pc = attn_pf_begin(pf);
    int32_t pl = attn_pf_lines(pf, (R + 3) / 4 * n);
    for (int32_t r0 = 0; r0 < R; r0 += 4) {
        const void *xv[4];
        quad_rows(q, R, r0, xv);
        const float *x[4] = {xv[0], xv[1], xv[2], xv[3]};
        int32_t nr = BASE_MIN(4, R - r0);
        for (int32_t j = 0; j < n; j += 2) {
            /* an odd last cell pairs with itself; its copy is not stored */
            bool two = j + 1 < n;
            const uint8_t *k = base + (size_t)idx[j] * rb, *l = two ? base + (size_t)idx[j + 1] * rb : k;
            attn_pf_step_dt(kt, &pc, pl);
            if (two) attn_pf_step_dt(kt, &pc, pl);
            __m128 sk, sl;
            kq_fp_pair(kt, k, l, x, d8, &sk, &sl);
            if (d8 < dk) {
                sk = kq_fp_tail(kt, k, x, d8, dk, sk);
                sl = kq_fp_tail(kt, l, x, d8, dk, sl);
            }
            store4(scores, r0, nr, j, sk);
            if (two) store4(scores, r0, nr, j + 1, sl);
        }
    }
}

static void kq_f32(keel_dtype kt, const uint8_t *base, size_t rb, const int32_t *idx, int32_t n,
                   const void *const *q, int32_t R, int32_t dk, float *scores, attn_pf pf)
{
    (void)kt;
    kq_fp(KEEL_DTYPE_F32, base, rb, idx, n, q, R, dk, scores, pf);
}

static void kq_f16(keel_dtype kt, const uint8_t *base, size_t rb, const int32_t *idx, int32_t n,
                   const void *const *q, int32_t R, int32_t dk, float *scores, attn_pf pf)
{
    (void)kt;
    kq_fp(KEEL_DTYPE_F16, base, rb, idx, n, q, R, dk, scores, pf);
}

/* The query rows of a quad prepared once per call for int8 keys: the rows'
 * blocks (q8_0: scale, 32 int8), and per 32-element block the four rows'
 * scales as [dq0 dq1 dq2 dq3 | dq0 dq1 dq2 dq3] and, for q4_0 keys, the
 * nibble offsets -8 * sum(q) per row, laid out the same way (low half;
 * zeros in the high one), so that both apply after the rows' dots are
 * reduced into one vector. */
#define KQ_NB_MAX 16 /* query blocks prepared (dk <= 512; larger dims: slower path) */

typedef struct kq_quad8 {
    const uint8_t *x[4];
    __m256 dq[KQ_NB_MAX];
    __m256i corr[KQ_NB_MAX];
} kq_quad8;

/* Query block b of the quad's rows x[0..4): d_q per row as [r0..r3 |
 * r0..r3] and, for q4_0 keys, -8 sum(q) per row (zeros in the high lane). */
static inline void quad8_block_scales(keel_dtype kt, const uint8_t *const *x, int32_t b, __m256 *dq,
                                      __m256i *corr)
{
    float d[4];
    int32_t c[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int i = 0; i < 4; i++) {
        const uint8_t *xb = x[i] + (size_t)b * 34;
        d[i] = f16_to_f32(xb);
        if (kt == KEEL_DTYPE_Q4_0) {
            __m256i s16 = _mm256_maddubs_epi16(_mm256_set1_epi8(1), _mm256_loadu_si256((const __m256i *)(xb + 2)));
            c[i] = -8 * hsum_epi32(_mm256_madd_epi16(s16, _mm256_set1_epi16(1)));
        }
    }
    *dq = _mm256_setr_ps(d[0], d[1], d[2], d[3], d[0], d[1], d[2], d[3]);
    *corr = _mm256_loadu_si256((const __m256i *)c);
}

static inline void quad8_prep(keel_dtype kt, const void *const *q, int32_t R, int32_t r0, int32_t nb,
                              kq_quad8 *Q)
{
    for (int i = 0; i < 4; i++) Q->x[i] = q[BASE_MIN(r0 + i, R - 1)];
    for (int32_t b = 0; b < nb && b < KQ_NB_MAX; b++) quad8_block_scales(kt, Q->x, b, &Q->dq[b], &Q->corr[b]);
}

/* The int8 dot of one key block with each of the quad's rows, as 8 int32
 * lanes per row: q8_0 keys with the sign trick (|k| the u8 operand, k's sign
 * moved onto q), q4_0 keys as the u8 nibbles themselves (-8 applied later). */
static inline __attribute__((always_inline)) __m256i kq8_dot(keel_dtype kt, __m256i ku, __m256i kv,
                                                             const uint8_t *xb)
{
    __m256i qv = _mm256_loadu_si256((const __m256i *)(xb + 2));
    if (kt == KEEL_DTYPE_Q8_0) qv = _mm256_sign_epi8(qv, kv);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(ku, qv), _mm256_set1_epi16(1));
}

/* Key block kb (block b of its row) against the quad's rows: the four
 * rows' int8 dots reduced into [r0 r1 r2 r3 | r0 r1 r2 r3] (two hadd2_epi32),
 * before q4_0's correction and the scales. */
static inline __attribute__((always_inline)) __m256i kq8_block(keel_dtype kt, const uint8_t *kb,
                                                               const kq_quad8 *Q, int NR, int32_t b)
{
    const __m256i zero = _mm256_setzero_si256();
    __m256i kv, ku;
    if (kt == KEEL_DTYPE_Q8_0) {
        kv = _mm256_loadu_si256((const __m256i *)(kb + 2));
        ku = _mm256_sign_epi8(kv, kv);
    } else {
        kv = ku = q4_nibbles(kb + 2);
    }
    size_t o = (size_t)b * 34;
    __m256i s0 = kq8_dot(kt, ku, kv, Q->x[0] + o);
    __m256i s1 = NR > 1 ? kq8_dot(kt, ku, kv, Q->x[1] + o) : zero;
    __m256i s2 = NR > 2 ? kq8_dot(kt, ku, kv, Q->x[2] + o) : zero;
    __m256i s3 = NR > 3 ? kq8_dot(kt, ku, kv, Q->x[3] + o) : zero;
    return hadd2_epi32(hadd2_epi32(s0, s1), hadd2_epi32(s2, s3));
}

/* Scores of the quad's rows for each cell. Per key block the four rows'
 * int32 lanes are reduced into one vector [r0 r1 r2 r3 | r0 r1 r2 r3]
 * (two hadd2_epi32), converted once and scaled by d_q (per row) and d_k (per
 * block) with one multiply and one FMA for all four rows. */
static inline __attribute__((always_inline)) void kq8_quad(keel_dtype kt, const uint8_t *base, size_t rb,
                                                           const int32_t *idx, int32_t n, const kq_quad8 *Q,
                                                           int NR, int32_t nb, int32_t r0, float *scores,
                                                           attn_pf_cursor *pc, int32_t pl)
{
    size_t kbs = kt == KEEL_DTYPE_Q8_0 ? 34 : 18;
    for (int32_t j = 0; j < n; j++) {
        const uint8_t *k = base + (size_t)idx[j] * rb;
        attn_pf_step(pc, pl);
        __m256 acc = _mm256_setzero_ps();
        for (int32_t b = 0; b < nb; b++) {
            const uint8_t *kb = k + (size_t)b * kbs;
            __m256i h = kq8_block(kt, kb, Q, NR, b);
            __m256 dq;
            __m256i corr;
            if (b < KQ_NB_MAX) {
                dq = Q->dq[b];
                corr = Q->corr[b];
            } else {
                quad8_block_scales(kt, Q->x, b, &dq, &corr);
            }
            if (kt == KEEL_DTYPE_Q4_0) h = _mm256_add_epi32(h, corr);
            acc = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(h), dq), _mm256_set1_ps(f16_to_f32(kb)), acc);
        }
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
        store4(scores, r0, NR, j, s);
    }
}

/* q8_0 / q4_0 keys against q8_0 query rows: per block the int8 dot is
 * scaled by d_k * d_q. Each key block is loaded (and |k| or the nibbles
 * formed) once for the quad's rows; quads of 1..4 rows are compiled apart
 * so that a short quad does no wasted dots. */
static void kq8_tiles(const uint8_t *base, size_t rb, const int32_t *idx, int32_t n, const void *const *q,
                      int32_t R, int32_t dk, float *scores, attn_pf pf);

/* rows from which the one-cell-per-lane tiles (kq8_tiles) pay for their
 * transposes: a prefill block's R = tokens x GQA rows */
#define KQ8_TILE_MIN_ROWS 8

static void kq_q8q4(keel_dtype kt, const uint8_t *base, size_t rb, const int32_t *idx, int32_t n,
                    const void *const *q, int32_t R, int32_t dk, float *scores, attn_pf pf)
{
    int32_t nb = dk / QK;
    if (kt == KEEL_DTYPE_Q8_0 && R >= KQ8_TILE_MIN_ROWS && nb <= KQ_NB_MAX) {
        kq8_tiles(base, rb, idx, n, q, R, dk, scores, pf);
        return;
    }
    attn_pf_cursor pc = attn_pf_begin(pf);
    int32_t pl = attn_pf_lines(pf, (R + 3) / 4 * n);
    kq_quad8 Q;
    for (int32_t r0 = 0; r0 < R; r0 += 4) {
        int32_t nr = BASE_MIN(4, R - r0);
        quad8_prep(kt, q, R, r0, nb, &Q);
        switch (nr) {
        case 4: kq8_quad(kt, base, rb, idx, n, &Q, 4, nb, r0, scores, &pc, pl); break;
        case 3: kq8_quad(kt, base, rb, idx, n, &Q, 3, nb, r0, scores, &pc, pl); break;
        case 2: kq8_quad(kt, base, rb, idx, n, &Q, 2, nb, r0, scores, &pc, pl); break;
        default: kq8_quad(kt, base, rb, idx, n, &Q, 1, nb, r0, scores, &pc, pl); break;
        }
    }
}

attn_kq_fn attn_kq_avx2(keel_dtype kt)
{
    switch (kt) {
    case KEEL_DTYPE_F32: return kq_f32;
    case KEEL_DTYPE_F16: return kq_f16;
    case KEEL_DTYPE_Q8_0:
    case KEEL_DTYPE_Q4_0: return kq_q8q4;
    default: return NULL;
    }
}

/* ---- p . V ------------------------------------------------------------- */

/* acc[r][i..i+8) += p_r * v8 for active rows */
static inline void acc_rows(__m256 v8, const float *p, int32_t j, const uint8_t *active, int32_t R,
                            float *const *acc, int32_t i)
{
    for (int32_t r = 0; r < R; r++) {
        if (!active[r]) continue;
        float pr = p[r * ATTN_CB + j];
        if (pr == 0.0f) continue;
        float *a = acc[r] + i;
        _mm256_storeu_ps(a, _mm256_fmadd_ps(_mm256_set1_ps(pr), v8, _mm256_loadu_ps(a)));
    }
}

static void pv_f32(keel_dtype vt, const uint8_t *base, size_t rb, const int32_t *idx, int32_t n,
                   const float *p, const uint8_t *active, int32_t R, int32_t dv, float *const *acc,
                   attn_pf pf)
{
    (void)pf; /* only the fallback shapes come here */
    if (dv % 8) {
        for (int32_t j = 0; j < n; j++)
            for (int32_t r = 0; r < R; r++)
                if (active[r]) tensor_axpy_row(vt, dv, p[r * ATTN_CB + j], base + (size_t)idx[j] * rb, acc[r]);
        return;
    }
    for (int32_t j = 0; j < n; j++) {
        const float *v = (const float *)(base + (size_t)idx[j] * rb);
        for (int32_t i = 0; i < dv; i += 8) acc_rows(_mm256_loadu_ps(v + i), p, j, active, R, acc, i);
    }
}

static void pv_f16(keel_dtype vt, const uint8_t *base, size_t rb, const int32_t *idx, int32_t n,
                   const float *p, const uint8_t *active, int32_t R, int32_t dv, float *const *acc,
                   attn_pf pf)
{
    if (dv % 8) {
        pv_f32(vt, base, rb, idx, n, p, active, R, dv, acc, pf);
        return;
    }
    for (int32_t j = 0; j < n; j++) {
        const uint16_t *v = (const uint16_t *)(base + (size_t)idx[j] * rb);
        for (int32_t i = 0; i < dv; i += 8)
            acc_rows(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(v + i))), p, j, active, R, acc, i);
    }
}

static void dq_tile64_fp(keel_dtype vt, const uint8_t *base, size_t rb, const int32_t *idx,
                         int32_t n, int32_t seg, float *tile, attn_pf_cursor *pc, int32_t pl)
{
    for (int32_t j = 0; j < n; j++) {
        attn_pf_step_dt(vt, pc, pl);
        const uint8_t *v = base + (size_t)idx[j] * rb;
        float *o = tile + (size_t)j * 64;
        for (int k = 0; k < 64; k += 8)
            _mm256_storeu_ps(o + k, load_k8(vt, v, seg + k));
    }
}

/* acc[r][seg..seg+64) += sum_j p[r][j] tile[j]: 8 accumulators in registers
 * across the block of cells (no store/load chain through memory). */
static void tile_accumulate(const float *tile, int32_t n, const float *p, const uint8_t *active,
                            int32_t R, float *const *acc, int32_t seg)
{
    for (int32_t r = 0; r < R; r++) {
        if (!active[r]) continue;
        float *a = acc[r] + seg;
        __m256 a0 = _mm256_loadu_ps(a), a1 = _mm256_loadu_ps(a + 8), a2 = _mm256_loadu_ps(a + 16),
               a3 = _mm256_loadu_ps(a + 24), a4 = _mm256_loadu_ps(a + 32), a5 = _mm256_loadu_ps(a + 40),
               a6 = _mm256_loadu_ps(a + 48), a7 = _mm256_loadu_ps(a + 56);
        const float *pr = p + (size_t)r * ATTN_CB;
        for (int32_t j = 0; j < n; j++) {
            __m256 pj = _mm256_set1_ps(pr[j]);
            const float *t = tile + (size_t)j * 64;
            a0 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(t), a0);
            a1 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(t + 8), a1);
            a2 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(t + 16), a2);
            a3 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(t + 24), a3);
            a4 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(t + 32), a4);
            a5 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(t + 40), a5);
            a6 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(t + 48), a6);
            a7 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(t + 56), a7);
        }
        _mm256_storeu_ps(a, a0);
        _mm256_storeu_ps(a + 8, a1);
        _mm256_storeu_ps(a + 16, a2);
        _mm256_storeu_ps(a + 24, a3);
        _mm256_storeu_ps(a + 32, a4);
        _mm256_storeu_ps(a + 40, a5);
        _mm256_storeu_ps(a + 48, a6);
        _mm256_storeu_ps(a + 56, a7);
    }
}

#define PV_NB_MAX 16 /* V blocks per row handled here (dv <= 512) */
#define PV_TILE_ROWS 8 /* active rows from which V goes through an f32 tile */

/* ar[r][32 b + 16 h ..+16) += sum_j w[j][r] * V row j's values 32 b + 16 h
 * ..+16 (q8_0 / q4_0 rows, block b, half h) for r < NR, with q4_0's -8 as
 * -8 sw[r] (sw[r] = sum_j w[j][r]): 2 * NR accumulators in registers
 * across the cells, each V value converted to f32 once for the rows, the
 * weights broadcast from memory. */
static inline __attribute__((always_inline)) void pv8_half(keel_dtype vt, const uint8_t *const *rows, int32_t n,
                                                           int32_t b, int h, const float (*w)[4], const float *sw,
                                                           float *const *ar, int NR)
{
    const size_t bs = vt == KEEL_DTYPE_Q8_0 ? 34 : 18;
    const __m128i m4 = _mm_set1_epi8(0x0f);
    __m256 a[4][2];
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) a[r][0] = a[r][1] = _mm256_setzero_ps();
    for (int32_t j = 0; j < n; j++) {
        const uint8_t *vb = rows[j] + (size_t)b * bs + 2;
        __m256 v0, v1;
        if (vt == KEEL_DTYPE_Q8_0) {
            v0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(vb + 16 * h))));
            v1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(vb + 16 * h + 8))));
        } else {
            __m128i x = _mm_loadu_si128((const __m128i *)vb);
            x = _mm_and_si128(h ? _mm_srli_epi16(x, 4) : x, m4);
            v0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(x));
            v1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(x, 8)));
        }
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            __m256 wr = _mm256_broadcast_ss(&w[j][r]);
            a[r][0] = _mm256_fmadd_ps(wr, v0, a[r][0]);
            a[r][1] = _mm256_fmadd_ps(wr, v1, a[r][1]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) {
        float *o = ar[r] + (size_t)b * QK + 16 * h;
        __m256 c0 = a[r][0], c1 = a[r][1];
        if (vt == KEEL_DTYPE_Q4_0) {
            __m256 m8 = _mm256_set1_ps(-8.0f * sw[r]);
            c0 = _mm256_add_ps(c0, m8);
            c1 = _mm256_add_ps(c1, m8);
        }
        _mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), c0));
        _mm256_storeu_ps(o + 8, _mm256_add_ps(_mm256_loadu_ps(o + 8), c1));
    }
}

/* p . V for q8_0 / q4_0 rows straight from their int8 values, for a
 * group of NR (1..4) active rows: the weights w[b][j][r] = p[r][j] * d(V
 * row j, block b) are formed once for the group, then for each 16 columns
 * the group's 2 * NR accumulators stay in registers across the block's
 * cells; each V value is converted to f32 once for the group and the
 * weights come from memory as broadcast loads. q4_0's -8 is folded into one
 * correction per block: sum_j w (n - 8) = sum_j w n - 8 sum_j w. */

static inline __attribute__((always_inline)) void pv8_group(keel_dtype vt, const uint8_t *const *rows,
                                                            int32_t n, const float *const *pr,
                                                            float *const *ar, int NR, int32_t nbv,
                                                            attn_pf_cursor *pc, int32_t pl)
{
    size_t bs = vt == KEEL_DTYPE_Q8_0 ? 34 : 18;
    _Alignas(32) float wt[PV_NB_MAX][ATTN_CB][4];
    float sw[PV_NB_MAX][4];
    memset(sw, 0, sizeof sw);
    for (int32_t j = 0; j < n; j++) {
        __m128 pj = _mm_setr_ps(pr[0][j], NR > 1 ? pr[1][j] : 0.0f, NR > 2 ? pr[2][j] : 0.0f,
                                NR > 3 ? pr[3][j] : 0.0f);
        for (int32_t b = 0; b < nbv; b++)
            _mm_store_ps(wt[b][j], _mm_mul_ps(pj, _mm_set1_ps(f16_to_f32(rows[j] + (size_t)b * bs))));
    }
    if (vt == KEEL_DTYPE_Q4_0)
        for (int32_t b = 0; b < nbv; b++)
            for (int32_t j = 0; j < n; j++)
                #pragma GCC unroll 4
                for (int r = 0; r < 4; r++) sw[b][r] += wt[b][j][r];
    for (int32_t b = 0; b < nbv; b++) {
        #pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            attn_pf_step(pc, pl);
            pv8_half(vt, rows, n, b, h, (const float (*)[4])wt[b], sw[b], ar, NR);
        }
    }
}

/* tile[j][0..64) = V row idx[j], values seg..seg+64 (two q8_0 / q4_0
 * blocks), as f32 */
static void dq_tile64_q8q4(keel_dtype vt, const uint8_t *base, size_t rb, const int32_t *idx, int32_t n,
                           int32_t seg, float *tile, attn_pf_cursor *pc, int32_t pl)
{
    const size_t bs = vt == KEEL_DTYPE_Q8_0 ? 34 : 18;
    const __m256 zero = _mm256_setzero_ps();
    for (int32_t j = 0; j < n; j++) {
        attn_pf_step(pc, pl);
        const uint8_t *v = base + (size_t)idx[j] * rb + (size_t)(seg / QK) * bs;
        float *o = tile + (size_t)j * 64;
        for (int k = 0; k < 2; k++, v += bs, o += 32) {
            __m256 d = _mm256_set1_ps(f16_to_f32(v));
            if (vt == KEEL_DTYPE_Q8_0) {
                __m256i q = _mm256_loadu_si256((const __m256i *)(v + 2));
                store_dq8(o, q, d, zero);
            } else {
                store_dq8(o, _mm256_sub_epi8(q4_nibbles(v + 2), _mm256_set1_epi8(8)), d, zero);
            }
        }
    }
}

typedef void (*dq_tile64_fn)(keel_dtype vt, const uint8_t *base, size_t rb, const int32_t *idx, int32_t n,
                             int32_t seg, float *tile, attn_pf_cursor *pc, int32_t pl);

/* p . V through an f32 tile (dv a multiple of 64): per 64 columns the
 * block's V values converted once by dq, then accumulated into every
 * active row with the row's accumulators in registers across the block. */
static void pv_tiled(dq_tile64_fn dq, keel_dtype vt, const uint8_t *base, size_t rb, const int32_t *idx,
                     int32_t n, const float *p, const uint8_t *active, int32_t R, int32_t dv,
                     float *const *acc, attn_pf pf)
{
    _Alignas(32) float tile[ATTN_CB * 64];
    attn_pf_cursor pc = attn_pf_begin(pf);
    int32_t pl = attn_pf_lines(pf, dv / 64 * n);
    for (int32_t seg = 0; seg < dv; seg += 64) {
        dq(vt, base, rb, idx, n, seg, tile, &pc, pl);
        tile_accumulate(tile, n, p, active, R, acc, seg);
    }
}

static void pv_q8q4(keel_dtype vt, const uint8_t *base, size_t rb, const int32_t *idx, int32_t n,
                    const float *p, const uint8_t *active, int32_t R, int32_t dv, float *const *acc,
                    attn_pf pf)
{
    if (dv % QK || dv > PV_NB_MAX * QK) {
        for (int32_t j = 0; j < n; j++)
            for (int32_t r = 0; r < R; r++)
                if (active[r]) tensor_axpy_row(vt, dv, p[r * ATTN_CB + j], base + (size_t)idx[j] * rb, acc[r]);
        return;
    }
    int32_t n_act = attn_n_active(active, R);
    if (n_act >= PV_TILE_ROWS && dv % 64 == 0) {
        /* many rows (prefill): each V value converted once for all of
         * them, then the f32 tile's GEMM-like accumulation */
        pv_tiled(dq_tile64_q8q4, vt, base, rb, idx, n, p, active, R, dv, acc, pf);
        return;
    }
    const uint8_t *rows[ATTN_CB];
    for (int32_t j = 0; j < n; j++) rows[j] = base + (size_t)idx[j] * rb;
    int32_t nbv = dv / QK;
    attn_pf_cursor pc = attn_pf_begin(pf);
    int32_t pl = attn_pf_lines(pf, (n_act + 3) / 4 * nbv * 2);
    const float *pr[4];
    float *ar[4];
    int nr;
    for (int32_t r = 0; (nr = attn_next_group(p, active, acc, R, &r, pr, ar)) > 0;) {
        switch (nr) {
        case 4: pv8_group(vt, rows, n, pr, ar, 4, nbv, &pc, pl); break;
        case 3: pv8_group(vt, rows, n, pr, ar, 3, nbv, &pc, pl); break;
        case 2: pv8_group(vt, rows, n, pr, ar, 2, nbv, &pc, pl); break;
        case 1: pv8_group(vt, rows, n, pr, ar, 1, nbv, &pc, pl); break;
        default: break;
        }
    }
}

/* acc[r][c..c+16) += sum_j p_r[j] V row j's values c..c+16 (f16 / f32
 * rows; p_r[j] at pr[r] + j * ps) for NR rows: the rows' accumulators loaded into registers, each V
 * value converted once for the rows, the weights broadcast from p: the
 * operations of tile_accumulate over the f32 tile, in its order, without
 * the tile's stores and reloads. */
static inline __attribute__((always_inline)) void pvf_seg(keel_dtype vt, const uint8_t *const *rows, int32_t n,
                                                          const float *const *pr, int32_t ps, float *const *ar,
                                                          int NR, int32_t c)
{
    __m256 a[4][2];
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) {
        a[r][0] = _mm256_loadu_ps(ar[r] + c);
        a[r][1] = _mm256_loadu_ps(ar[r] + c + 8);
    }
    for (int32_t j = 0; j < n; j++) {
        __m256 v0 = load_k8(vt, rows[j], c), v1 = load_k8(vt, rows[j], c + 8);
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            __m256 w = _mm256_broadcast_ss(pr[r] + (size_t)j * ps);
            a[r][0] = _mm256_fmadd_ps(w, v0, a[r][0]);
            a[r][1] = _mm256_fmadd_ps(w, v1, a[r][1]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) {
        _mm256_storeu_ps(ar[r] + c, a[r][0]);
        _mm256_storeu_ps(ar[r] + c + 8, a[r][1]);
    }
}

/* f16 / f32 rows. Few active rows (decode: one token's GQA group): per 16
 * columns straight from the rows (pvf_seg), a quarter of the loads and none
 * of the stores the tile takes (keel bench attention --kv f16 --simd avx2
 * on the Zen 5 VM: see docs/kernel-passes.md); many rows (prefill) through the
 * tile, each value converted once for all of them. Both give the same
 * bits: the same FMAs in the same order. */
static void pv_fp_tile(keel_dtype vt, const uint8_t *base, size_t rb, const int32_t *idx, int32_t n,
                       const float *p, const uint8_t *active, int32_t R, int32_t dv,
                       float *const *acc, attn_pf pf)
{
    int32_t n_act = attn_n_active(active, R);
    if (n_act < PV_TILE_ROWS && dv % 16 == 0) {
        const uint8_t *rows[ATTN_CB];
        for (int32_t j = 0; j < n; j++) rows[j] = base + (size_t)idx[j] * rb;
        attn_pf_cursor pc = attn_pf_begin(pf);
        int32_t pl = attn_pf_lines(pf, (n_act + 3) / 4 * (dv / 16));
        const float *pr[4];
        float *ar[4];
        int nr;
        for (int32_t r = 0; (nr = attn_next_group(p, active, acc, R, &r, pr, ar)) > 0;) {
            for (int32_t c = 0; c < dv; c += 16) {
                attn_pf_step_dt(vt, &pc, pl);
                switch (nr) {
                case 4: pvf_seg(vt, rows, n, pr, 1, ar, 4, c); break;
                case 3: pvf_seg(vt, rows, n, pr, 1, ar, 3, c); break;
                case 2: pvf_seg(vt, rows, n, pr, 1, ar, 2, c); break;
                case 1: pvf_seg(vt, rows, n, pr, 1, ar, 1, c); break;
                default: break;
                }
            }
        }
        return;
    }
    if (dv % 64) {
        (vt == KEEL_DTYPE_F16 ? pv_f16 : pv_f32)(vt, base, rb, idx, n, p, active, R, dv, acc, pf);
        return;
    }
    pv_tiled(dq_tile64_fp, vt, base, rb, idx, n, p, active, R, dv, acc, pf);
}

attn_pv_fn attn_pv_avx2(keel_dtype vt)
{
    switch (vt) {
    case KEEL_DTYPE_F32:
    case KEEL_DTYPE_F16:
        return pv_fp_tile;
    case KEEL_DTYPE_Q8_0:
    case KEEL_DTYPE_Q4_0: return pv_q8q4;
    default: return NULL;
    }
}

/* ---- exp ---------------------------------------------------------------- */

static inline __m256 exp8(__m256 x)
{
    const __m256 hi = _mm256_set1_ps(88.3762626647949f), lo = _mm256_set1_ps(-87.3365447505531f);
    const __m256 log2e = _mm256_set1_ps(1.44269504088896341f);
    const __m256 c1 = _mm256_set1_ps(0.693359375f), c2 = _mm256_set1_ps(-2.12194440e-4f);
    __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_min_ps(x, hi);
    x = _mm256_max_ps(x, lo);
    __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm256_sub_ps(x, _mm256_mul_ps(fx, c1));
    x = _mm256_sub_ps(x, _mm256_mul_ps(fx, c2));
    __m256 z = _mm256_mul_ps(x, x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, z, _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(under, y);
}

float attn_exp_avx2(float *x, int32_t n, float m)
{
    __m256 mm = _mm256_set1_ps(m), sum = _mm256_setzero_ps();
    int32_t j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 v = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + j), mm));
        _mm256_storeu_ps(x + j, v);
        sum = _mm256_add_ps(sum, v);
    }
    float s = hsum_ps(sum);
    for (; j < n; j++) {
        x[j] = x[j] == -INFINITY ? 0.0f : expf(x[j] - m);
        s += x[j];
    }
    return s;
}

/* A whole block of 32 scores in four ymm: the visibility bytes become lane
 * masks, invisible cells -inf (which exp8 maps to 0); shorter blocks (the
 * last of a chunk) take the scalar step with this exp. */
bool attn_row_avx2(float *s, int32_t n, float scale, const uint8_t *vis, float *m, float *l,
                    float *alpha)
{
    if (n != ATTN_CB) return attn_row_with(s, n, scale, vis, m, l, alpha, attn_exp_avx2);
    const __m256 ninf = _mm256_set1_ps(-INFINITY), sc = _mm256_set1_ps(scale);
    __m256 x[4];
    for (int k = 0; k < 4; k++) {
        __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(vis + 8 * k)));
        __m256 on = _mm256_castsi256_ps(_mm256_cmpgt_epi32(v, _mm256_setzero_si256()));
        x[k] = _mm256_blendv_ps(ninf, _mm256_mul_ps(_mm256_loadu_ps(s + 8 * k), sc), on);
    }
    float bmax = hmax_ps(_mm256_max_ps(_mm256_max_ps(x[0], x[1]), _mm256_max_ps(x[2], x[3])));
    *alpha = 1.0f;
    if (bmax == -INFINITY) {
        for (int k = 0; k < 4; k++) _mm256_storeu_ps(s + 8 * k, x[k]);
        return false;
    }
    float mnew = bmax > *m ? bmax : *m;
    if (*m != -INFINITY && mnew != *m) {
        *alpha = expf(*m - mnew);
        *l *= *alpha;
    }
    *m = mnew;
    __m256 mm = _mm256_set1_ps(mnew), sum = _mm256_setzero_ps();
    for (int k = 0; k < 4; k++) {
        __m256 e = exp8(_mm256_sub_ps(x[k], mm));
        _mm256_storeu_ps(s + 8 * k, e);
        sum = _mm256_add_ps(sum, e);
    }
    *l += hsum_ps(sum);
    return true;
}

/* ---- fused decode ------------------------------------------------------- */

/* The f16 scales of nb blocks of one row (block stride bs, scale first in
 * each block) as f32 in d[0..nb), four at a time through one conversion. */
static inline void dec_scales(const uint8_t *row, size_t bs, int32_t nb, float *d)
{
    int32_t b = 0;
    for (; b + 4 <= nb; b += 4) {
        const uint8_t *p = row + (size_t)b * bs;
        uint16_t h0, h1, h2, h3;
        memcpy(&h0, p, 2);
        memcpy(&h1, p + bs, 2);
        memcpy(&h2, p + 2 * bs, 2);
        memcpy(&h3, p + 3 * bs, 2);
        uint64_t v = (uint64_t)h0 | (uint64_t)h1 << 16 | (uint64_t)h2 << 32 | (uint64_t)h3 << 48;
        _mm_storeu_ps(d + b, _mm_cvtph_ps(_mm_cvtsi64_si128((long long)v)));
    }
    for (; b < nb; b++) d[b] = f16_to_f32(row + (size_t)b * bs);
}

/* acc + key block b's scores for the quad, scaled (d_k from dk[b]) */
static inline __attribute__((always_inline)) __m256 dec_kq_block(keel_dtype kt, const uint8_t *kb,
                                                                 const kq_quad8 *Q, int NR, int32_t b,
                                                                 const float *dk, __m256 acc)
{
    __m256i h = kq8_block(kt, kb, Q, NR, b);
    if (kt == KEEL_DTYPE_Q4_0) h = _mm256_add_epi32(h, Q->corr[b]);
    return _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(h), Q->dq[b]), _mm256_broadcast_ss(dk + b), acc);
}

/* The quad's scores for one cell (rows r0..r0+3 in the lanes), as kq8_quad
 * computes them: the key's block scales converted together, two
 * accumulator chains (even and odd blocks). */
static inline __attribute__((always_inline)) __m128 dec_kq_cell(keel_dtype kt, const uint8_t *k,
                                                                const kq_quad8 *Q, int NR, int32_t nb)
{
    const size_t kbs = kt == KEEL_DTYPE_Q8_0 ? 34 : 18;
    float dk[KQ_NB_MAX];
    dec_scales(k, kbs, nb, dk);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
    int32_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        acc0 = dec_kq_block(kt, k + (size_t)b * kbs, Q, NR, b, dk, acc0);
        acc1 = dec_kq_block(kt, k + (size_t)(b + 1) * kbs, Q, NR, b + 1, dk, acc1);
    }
    if (b < nb) acc0 = dec_kq_block(kt, k + (size_t)b * kbs, Q, NR, b, dk, acc0);
    __m256 t = _mm256_add_ps(acc0, acc1);
    return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

/* The online softmax of a quad's block of nb scores in cell-major order
 * (s[j] = the four rows' scores of cell j; s has room for nb + 1 cells):
 * the running max m4 and sum l4 move on, s[j] becomes exp(s - m) and the
 * accumulators of rows whose max moved are rescaled (NR rows, dv each).
 * Two cells per vector. */
static inline __attribute__((always_inline)) void dec_softmax4(float (*s)[4], int32_t nb, __m128 *m4p, __m128 *l4p,
                                                               float *const *acc, int NR, int32_t dv)
{
    const __m128 m4 = *m4p;
    __m128 l4 = *l4p;
    if (nb & 1) _mm_store_ps(s[nb], _mm_set1_ps(-INFINITY)); /* pairs: the odd block's last */
    int32_t np = (nb + 1) / 2;
    /* block max of each row */
    __m256 mx = _mm256_load_ps(s[0]);
    for (int32_t k = 1; k < np; k++) mx = _mm256_max_ps(mx, _mm256_load_ps(s[2 * k]));
    __m128 bmax = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    __m128 mnew = _mm_max_ps(m4, bmax);
    /* alpha = exp(m_old - m_new): 0 from -inf (nothing accumulated yet) */
    __m256 al8 = exp8(_mm256_castps128_ps256(_mm_sub_ps(m4, mnew)));
    __m128 alpha = _mm256_castps256_ps128(al8);
    __m256 mm = _mm256_set_m128(mnew, mnew), sum = _mm256_setzero_ps();
    for (int32_t k = 0; k < np; k++) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_load_ps(s[2 * k]), mm));
        _mm256_store_ps(s[2 * k], e);
        sum = _mm256_add_ps(sum, e);
    }
    l4 = _mm_add_ps(_mm_mul_ps(l4, alpha),
                    _mm_add_ps(_mm256_castps256_ps128(sum), _mm256_extractf128_ps(sum, 1)));
    *m4p = mnew;
    *l4p = l4;
    /* rescale the accumulators whose max moved */
    int moved = _mm_movemask_ps(_mm_cmpneq_ps(alpha, _mm_set1_ps(1.0f)));
    for (int r = 0; r < NR; r++) {
        if (!(moved >> r & 1)) continue;
        __m256 ar = _mm256_set1_ps(_mm_cvtss_f32(_mm_permutevar_ps(alpha, _mm_set1_epi32(r))));
        for (int32_t i = 0; i < dv; i += 8)
            _mm256_storeu_ps(acc[r] + i, _mm256_mul_ps(_mm256_loadu_ps(acc[r] + i), ar));
    }
}

/* One quad (NR <= 4 rows from r0) over all cells: per block of ATTN_CB
 * cells the scores in cell-major order (s[j] = the quad's four rows), the
 * online softmax of the four rows at once (two cells per vector), then
 * p . V as pv8_group does it (weights p * d_v formed once per block).
 * pf: the block's V rows, asked for one cell's share per cell scored, and
 * the next block's K rows, a share per p . V half (first quad only; the
 * others find them in cache). */
static inline __attribute__((always_inline)) void dec_quad(keel_dtype kt, keel_dtype vt, const attn_dec *a,
                                                           int32_t r0, int NR)
{
    const int32_t nbk = a->dk / QK, nbv = a->dv / QK;
    const size_t vbs = vt == KEEL_DTYPE_Q8_0 ? 34 : 18;
    kq_quad8 Q;
    quad8_prep(kt, a->q, a->R, r0, nbk, &Q);
    /* fold the scale into the query scales (capped scores take it inside) */
    if (a->softcap <= 0.0f)
        for (int32_t b = 0; b < nbk; b++) Q.dq[b] = _mm256_mul_ps(Q.dq[b], _mm256_set1_ps(a->scale));
    float m4a[4], l4a[4], *acc[4];
    attn_dec_quad_load(a, r0, NR, m4a, l4a, acc);
    __m128 m4 = _mm_loadu_ps(m4a), l4 = _mm_loadu_ps(l4a);
    _Alignas(32) float s[ATTN_CB][4];  /* scores, then p, cell-major */
    _Alignas(16) float wt[ATTN_CB][4]; /* p * d_v of one V block */
    float dvs[ATTN_CB][PV_NB_MAX];     /* the V rows' block scales */
    const uint8_t *rows_v[ATTN_CB];
    for (int32_t cb = 0; cb < a->n; cb += ATTN_CB) {
        int32_t nb = BASE_MIN(ATTN_CB, a->n - cb);
        const int32_t *idx = a->idx + cb;
        attn_dec_pf P = attn_dec_pf_block(a, r0, cb, nb, nb, 2 * nbv);
        for (int32_t j = 0; j < nb; j++) {
            attn_pf_step(&P.v, P.vl);
            __m128 sc = dec_kq_cell(kt, a->kbase + (size_t)idx[j] * a->krb, &Q, NR, nbk);
            _mm_store_ps(s[j], sc);
        }
        if (a->softcap > 0.0f)
            for (int32_t j = 0; j < nb; j++)
                for (int r = 0; r < 4; r++) s[j][r] = a->softcap * tanhf(s[j][r] * a->scale / a->softcap);
        dec_softmax4(s, nb, &m4, &l4, acc, NR, a->dv);
        /* p . V */
        for (int32_t j = 0; j < nb; j++) {
            rows_v[j] = a->vbase + (size_t)idx[j] * a->vrb;
            dec_scales(rows_v[j], vbs, nbv, dvs[j]);
        }
        for (int32_t b = 0; b < nbv; b++) {
            __m128 sw = _mm_setzero_ps();
            for (int32_t j = 0; j < nb; j++) {
                __m128 w = _mm_mul_ps(_mm_load_ps(s[j]), _mm_broadcast_ss(&dvs[j][b]));
                _mm_store_ps(wt[j], w);
                if (vt == KEEL_DTYPE_Q4_0) sw = _mm_add_ps(sw, w);
            }
            _Alignas(16) float swa[4];
            _mm_store_ps(swa, sw);
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                attn_pf_step(&P.k, P.kl);
                pv8_half(vt, rows_v, nb, b, h, (const float (*)[4])wt, swa, acc, NR);
            }
        }
    }
    _mm_storeu_ps(m4a, m4);
    _mm_storeu_ps(l4a, l4);
    attn_dec_quad_save(a, r0, NR, m4a, l4a);
}

/* ---- fused decode, q8_0 K and V: one cell per lane ------------------------
 *
 * The kernel of dec_q8_q8. It keeps one cell per 32-bit lane from the int8
 * dots to the probabilities, in tiles of 8 cells (a block of ATTN_CB cells
 * is up to four tiles), as the AVX-512 kernel does, so no score is reduced
 * across lanes:
 *   - the 32 key bytes of block b of the tile's 8 rows are transposed 16 at
 *     a time into four ymm g[i] (lane c = bytes 4i..4i+3 of cell c: 4 loads,
 *     4 inserts, 8 unpacks);
 *   - each query row r takes, per 4-byte group i, its four bytes broadcast
 *     (q), then vpmaddubsw(|g[i]|, sign(q, g[i])) and vpmaddwd by ones: lane
 *     c gains sum_k q_k * key_k over the group, exactly (below); then one
 *     convert and one FMA per row by d_k (the tile's 8 block scales, one
 *     f16 load) * d_q * scale;
 *   - the online softmax runs on the rows' score vectors (8 cells each),
 *     the four rows' block max and sum reduced together;
 *   - the weights w = p * d_v are formed as vectors per V block, row and
 *     tile; p . V then converts each V value once for the rows and issues
 *     one FMA per row and 8 columns, 2 * NR accumulators in registers.
 *
 * Why the integer dot is exact (no vpmaddubsw saturation): vpmaddubsw
 * multiplies u8 by s8 and adds adjacent pairs into s16 with saturation.
 * Its u8 operand here is |k| (vpabsb), in [0, 128] for any stored byte k in
 * [-128, 127]; its s8 operand is sign(q, k) = q * sgn(k) (vpsignb), in
 * [-127, 127] because keel's q8_0 query quantizer clamps q to [-127, 127]
 * (tensor_quantize_row; vpsignb of -128 would wrap). Each product |k| *
 * q * sgn(k) equals k * q, a pair's sum is at most 2 * 128 * 127 = 32512 <
 * 32767 in magnitude, so no pair saturates; vpmaddwd by 1 adds the two
 * pairs into s32 and the 8 groups of a block sum to at most 32 * 128 * 127
 * = 520192 < 2^24, exact in s32 and in its f32 conversion. (Biasing k to
 * u8 with q as the s8 operand, VNNI's way, would not do: (k + 128) * q
 * reaches 255 * 127 per product and a pair 64770, which saturates.)
 * The scaled scores then differ from the scalar kernel's by float
 * reordering only.
 *
 * Prefetch: the block's V rows a share per key block of each tile during the
 * scores, the next block's K rows a share per p . V half (first quad only:
 * the others find them in cache), as dec_quad does. */

#define DEC8_T 8 /* cells per tile: one per 32-bit lane */

typedef struct dec8_quad {
    const uint8_t *qb[4];       /* row r's q8_0 query blocks (34 bytes each) */
    float dq[4][KQ_NB_MAX];     /* d_q of block b * scale (1 with a softcap) */
} dec8_quad;

/* 16 bytes at rows[c] + off of a tile's 8 cells, transposed: g[i] lane c =
 * bytes 4i..4i+3 of cell c's 16 (cells 0-3 in the low 128 bits, 4-7 high). */
static inline __attribute__((always_inline)) void dec8_kt(const uint8_t *const *rows, size_t off, __m256i g[4])
{
    __m256i z[4];
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++)
        z[c] = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(rows[c] + off))),
                                       _mm_loadu_si128((const __m128i *)(rows[c + 4] + off)), 1);
    /* per 128 bits: t0 = c0:0 c1:0 c0:1 c1:1, t1 = c0:2 c1:2 c0:3 c1:3, t2 / t3 the same for c2, c3 */
    __m256i t0 = _mm256_unpacklo_epi32(z[0], z[1]), t1 = _mm256_unpackhi_epi32(z[0], z[1]);
    __m256i t2 = _mm256_unpacklo_epi32(z[2], z[3]), t3 = _mm256_unpackhi_epi32(z[2], z[3]);
    g[0] = _mm256_unpacklo_epi64(t0, t2);
    g[1] = _mm256_unpackhi_epi64(t0, t2);
    g[2] = _mm256_unpacklo_epi64(t1, t3);
    g[3] = _mm256_unpackhi_epi64(t1, t3);
}

/* The f16 scales at rows[c] + off of a tile's 8 cells as one vector
 * (lane c), built in a register, one insert per cell, where the scores and
 * the weights need them. They used to go through tables filled by eight
 * 2-byte stores per tile and block, which the 16-byte load that read them
 * could not take from the store buffer (a load is forwarded from one store
 * that holds all of it), so each waited for the stores to reach L1. On a
 * Zen 3 VM (dim 128, 4 query rows, 2048 cells in L2) the kernel runs
 * 0.90-0.93x the table form's time (3 rows 0.89-0.90x, 1 row 0.84-0.90x,
 * 16,384 cells 0.86-0.89x; docs/kernel-passes-2.md, nineteenth pass). The
 * values, and so the results, are the same. */
static inline __attribute__((always_inline)) __m128i dec8_scales8(const uint8_t *const *rows, size_t off)
{
    __m128i v = _mm_cvtsi32_si128(attn_ld_u16(rows[0] + off));
    v = _mm_insert_epi16(v, attn_ld_u16(rows[1] + off), 1);
    v = _mm_insert_epi16(v, attn_ld_u16(rows[2] + off), 2);
    v = _mm_insert_epi16(v, attn_ld_u16(rows[3] + off), 3);
    v = _mm_insert_epi16(v, attn_ld_u16(rows[4] + off), 4);
    v = _mm_insert_epi16(v, attn_ld_u16(rows[5] + off), 5);
    v = _mm_insert_epi16(v, attn_ld_u16(rows[6] + off), 6);
    return _mm_insert_epi16(v, attn_ld_u16(rows[7] + off), 7);
}

/* Scores of one tile (8 cells, rows krows[0..8)) for the quad's NR rows:
 * s[r] lane c. */
static inline __attribute__((always_inline)) void dec8_tile_scores(const uint8_t *const *krows,
                                                                   const dec8_quad *Q,
                                                                   int NR, int32_t nbk, __m256 s[4],
                                                                   attn_pf_cursor *pc, int32_t pl)
{
    const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) s[r] = _mm256_setzero_ps();
    for (int32_t b = 0; b < nbk; b++) {
        attn_pf_step(pc, pl);
        __m256i a[4];
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) a[r] = _mm256_setzero_si256();
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m256i g[4];
            dec8_kt(krows, (size_t)b * 34 + 2 + 16 * (size_t)h, g);
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                __m256i u = _mm256_abs_epi8(g[i]);
#pragma GCC unroll 4
                for (int r = 0; r < NR; r++) {
                    __m256i q = _mm256_set1_epi32(attn_ld_i32(Q->qb[r] + (size_t)b * 34 + 2 + 16 * h + 4 * i));
                    __m256i p = _mm256_maddubs_epi16(u, _mm256_sign_epi8(q, g[i]));
                    a[r] = _mm256_add_epi32(a[r], _mm256_madd_epi16(p, ones));
                    /* keep the sum a chain in one register: gcc 12 otherwise
                     * reassociates the 8 groups' adds into a tree and spills
                     * the 32 products of the quad (measured 2x slower) */
                    __asm__("" : "+x"(a[r]));
                }
            }
        }
        __m256 dk = _mm256_cvtph_ps(dec8_scales8(krows, (size_t)b * 34));
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++)
            s[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a[r]), _mm256_mul_ps(dk, _mm256_set1_ps(Q->dq[r][b])), s[r]);
    }
}

/* [f(x0), f(x1), f(x2), f(x3)], f the max / the sum of 8 lanes */
static inline __m128 dec8_max4(__m256 x0, __m256 x1, __m256 x2, __m256 x3)
{
    __m256 t01 = _mm256_max_ps(_mm256_unpacklo_ps(x0, x1), _mm256_unpackhi_ps(x0, x1));
    __m256 t23 = _mm256_max_ps(_mm256_unpacklo_ps(x2, x3), _mm256_unpackhi_ps(x2, x3));
    __m256 u = _mm256_max_ps(_mm256_shuffle_ps(t01, t23, _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm256_shuffle_ps(t01, t23, _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm_max_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
}

static inline __m128 dec8_sum4(__m256 x0, __m256 x1, __m256 x2, __m256 x3)
{
    __m256 t01 = _mm256_add_ps(_mm256_unpacklo_ps(x0, x1), _mm256_unpackhi_ps(x0, x1));
    __m256 t23 = _mm256_add_ps(_mm256_unpacklo_ps(x2, x3), _mm256_unpackhi_ps(x2, x3));
    __m256 u = _mm256_add_ps(_mm256_shuffle_ps(t01, t23, _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm256_shuffle_ps(t01, t23, _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
}

/* acc[r][32 b + 16 h ..+16) += sum_j w[r][j] * V row j's values there, for
 * r < NR: the accumulators in registers across the cells, each V value
 * converted once for the rows. */
static inline __attribute__((always_inline)) void dec8_pv_half(const uint8_t *const *rows, int32_t n, int32_t b,
                                                               int h, const float (*w)[ATTN_CB], float *const *acc,
                                                               int NR)
{
    __m256 A[4][2];
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) {
        A[r][0] = _mm256_loadu_ps(acc[r] + (size_t)b * QK + 16 * h);
        A[r][1] = _mm256_loadu_ps(acc[r] + (size_t)b * QK + 16 * h + 8);
    }
    for (int32_t j = 0; j < n; j++) {
        const uint8_t *vb = rows[j] + (size_t)b * 34 + 2 + 16 * h;
        __m256 v0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)vb)));
        __m256 v1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(vb + 8))));
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            __m256 wr = _mm256_broadcast_ss(&w[r][j]);
            A[r][0] = _mm256_fmadd_ps(wr, v0, A[r][0]);
            A[r][1] = _mm256_fmadd_ps(wr, v1, A[r][1]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) {
        _mm256_storeu_ps(acc[r] + (size_t)b * QK + 16 * h, A[r][0]);
        _mm256_storeu_ps(acc[r] + (size_t)b * QK + 16 * h + 8, A[r][1]);
    }
}

/* One quad (NR <= 4 rows from r0) over all cells, q8_0 K and V. */
static inline __attribute__((always_inline)) void dec8_quad_run(keel_dtype kt, keel_dtype vt, const attn_dec *a,
                                                                int32_t r0, int NR)
{
    (void)kt; /* q8_0 */
    (void)vt;
    const int32_t nbk = a->dk / QK, nbv = a->dv / QK;
    const bool capped = a->softcap > 0.0f;
    dec8_quad Q;
    for (int r = 0; r < 4; r++) {
        Q.qb[r] = a->q[r0 + BASE_MIN(r, NR - 1)];
        for (int32_t b = 0; b < nbk; b++)
            Q.dq[r][b] = f16_to_f32(Q.qb[r] + (size_t)b * 34) * (capped ? 1.0f : a->scale);
    }
    float m[4], l[4], *acc[4];
    attn_dec_quad_load(a, r0, NR, m, l, acc);
    _Alignas(32) float e[4][ATTN_CB];               /* scores, then exp(s - m), per row */
    _Alignas(32) float wt[PV_NB_MAX][4][ATTN_CB];   /* p * d_v per V block, row, cell */
    const uint8_t *krows[ATTN_CB], *vrows[ATTN_CB];
    const __m256 ninf = _mm256_set1_ps(-INFINITY), one = _mm256_set1_ps(1.0f);
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int32_t cb = 0; cb < a->n; cb += ATTN_CB) {
        int32_t nb = BASE_MIN(ATTN_CB, a->n - cb);
        int32_t T = (nb + DEC8_T - 1) / DEC8_T, np = T * DEC8_T;
        const int32_t *idx = a->idx + cb;
        attn_dec_pf P = attn_dec_pf_block(a, r0, cb, nb, T * nbk, 2 * nbv);
        /* a short last tile repeats the block's last cell; its lanes are masked */
        for (int32_t j = 0; j < np; j++) {
            int32_t c = idx[BASE_MIN(j, nb - 1)];
            krows[j] = a->kbase + (size_t)c * a->krb;
            vrows[j] = a->vbase + (size_t)c * a->vrb;
        }
        for (int32_t t = 0; t < T; t++) {
            __m256 s[4];
            dec8_tile_scores(krows + t * DEC8_T, &Q, NR, nbk, s, &P.v, P.vl);
            __m256 valid = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(nb - t * DEC8_T), iota));
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) {
                if (capped) {
                    _Alignas(32) float x[DEC8_T];
                    _mm256_store_ps(x, s[r]);
                    for (int c = 0; c < DEC8_T; c++) x[c] = a->softcap * tanhf(x[c] * a->scale / a->softcap);
                    s[r] = _mm256_load_ps(x);
                }
                _mm256_store_ps(&e[r][t * DEC8_T], _mm256_blendv_ps(ninf, s[r], valid));
            }
        }
        /* online softmax of the quad's rows: block max, alpha, exp, sum */
        __m256 x[4];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const float *er = e[BASE_MIN(r, NR - 1)];
            x[r] = _mm256_load_ps(er);
            for (int32_t t = 1; t < T; t++) x[r] = _mm256_max_ps(x[r], _mm256_load_ps(er + t * DEC8_T));
        }
        __m128 m4 = _mm_loadu_ps(m), mnew = _mm_max_ps(m4, dec8_max4(x[0], x[1], x[2], x[3]));
        /* alpha = exp(m_old - m_new), 1 where m_old is -inf (nothing accumulated) or did not move */
        __m128 d = _mm_sub_ps(m4, mnew);
        __m128 alpha = _mm256_castps256_ps128(exp8(_mm256_set_m128(d, d)));
        __m128 keep = _mm_or_ps(_mm_cmpeq_ps(m4, _mm_set1_ps(-INFINITY)), _mm_cmpeq_ps(m4, mnew));
        alpha = _mm_blendv_ps(alpha, _mm256_castps256_ps128(one), keep);
        _mm_storeu_ps(m, mnew);
        _Alignas(16) float al[4];
        _mm_store_ps(al, alpha);
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            if (al[r] != 1.0f) {
                __m256 ar = _mm256_set1_ps(al[r]);
                for (int32_t i = 0; i < a->dv; i += 8)
                    _mm256_storeu_ps(acc[r] + i, _mm256_mul_ps(_mm256_loadu_ps(acc[r] + i), ar));
            }
            __m256 mm = _mm256_set1_ps(m[r]), sum = _mm256_setzero_ps();
            for (int32_t t = 0; t < T; t++) {
                __m256 ev = exp8(_mm256_sub_ps(_mm256_load_ps(&e[r][t * DEC8_T]), mm));
                _mm256_store_ps(&e[r][t * DEC8_T], ev);
                sum = _mm256_add_ps(sum, ev);
            }
            x[r] = sum;
        }
        for (int r = NR; r < 4; r++) x[r] = _mm256_setzero_ps();
        _mm_storeu_ps(l, _mm_add_ps(_mm_mul_ps(_mm_loadu_ps(l), alpha), dec8_sum4(x[0], x[1], x[2], x[3])));
        /* the weights p * d_v (the V rows arrived during the scores) */
        for (int32_t b = 0; b < nbv; b++)
            for (int32_t t = 0; t < T; t++) {
                __m256 dv = _mm256_cvtph_ps(dec8_scales8(vrows + t * DEC8_T, (size_t)b * 34));
#pragma GCC unroll 4
                for (int r = 0; r < NR; r++)
                    _mm256_store_ps(&wt[b][r][t * DEC8_T], _mm256_mul_ps(_mm256_load_ps(&e[r][t * DEC8_T]), dv));
            }
        /* p . V */
        for (int32_t b = 0; b < nbv; b++) {
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                attn_pf_step(&P.k, P.kl);
                dec8_pv_half(vrows, nb, b, h, (const float (*)[ATTN_CB])wt[b], acc, NR);
            }
        }
    }
    attn_dec_quad_save(a, r0, NR, m, l);
}

ATTN_DEC_QUADS(dec_q8_q8, dec8_quad_run, KEEL_DTYPE_Q8_0, KEEL_DTYPE_Q8_0)

/* One instance per K / V dtype pair (the dtypes are constants inside). */
ATTN_DEC_QUADS(dec_q8_q4, dec_quad, KEEL_DTYPE_Q8_0, KEEL_DTYPE_Q4_0)
ATTN_DEC_QUADS(dec_q4_q8, dec_quad, KEEL_DTYPE_Q4_0, KEEL_DTYPE_Q8_0)
ATTN_DEC_QUADS(dec_q4_q4, dec_quad, KEEL_DTYPE_Q4_0, KEEL_DTYPE_Q4_0)

/* ---- fused decode, f16 / f32 K and V --------------------------------------
 *
 * One quad of rows (NR <= 4 from r0) over all cells, per block of ATTN_CB
 * cells: the scores three cells at a time (kq_fp_three: each 8 query
 * values loaded once for the three keys, 12 accumulators; two at a time
 * ran 102-104 cycles a cell in L2 at dim 128 x 4 rows against 95), stored
 * cell-major with the scale applied (one 128-bit store a cell, s[j] = the quad's four rows);
 * the four rows' online softmax together (dec_softmax4, two cells per
 * vector); then p . V per 16 columns straight from the V rows (pvf_seg
 * with the weights read cell-major), each V value converted once for the
 * rows. Against the separate kernels (kq, the row step per row, pv) it
 * saves the scores' row-major stores, the visibility masks and the calls
 * per block (docs/kernel-passes-2.md, seventeenth pass). Prefetch (first quad
 * only: the others find the rows in cache): the block's V rows a share per
 * three cells scored, the next block's K rows a share per 16 columns of
 * p . V, with the float kernels' hint (attn_pf_step_dt), and the rows
 * ATTN_PF_FAR blocks ahead (attn_pf_far, into the next call's) over both. */
static inline __attribute__((always_inline)) void decf_quad(keel_dtype kt, keel_dtype vt, const attn_dec *a,
                                                            int32_t r0, int NR)
{
    const void *xv[4];
    quad_rows(a->q, a->R, r0, xv);
    const float *x[4] = {xv[0], xv[1], xv[2], xv[3]};
    const bool capped = a->softcap > 0.0f;
    const __m128 sc4 = _mm_set1_ps(capped ? 1.0f : a->scale);
    float m4a[4], l4a[4], *acc[4];
    attn_dec_quad_load(a, r0, NR, m4a, l4a, acc);
    __m128 m4 = _mm_loadu_ps(m4a), l4 = _mm_loadu_ps(l4a);
    _Alignas(32) float s[ATTN_CB + 1][4]; /* scores, then p, cell-major */
    const float *pr[4] = {&s[0][0], &s[0][1], &s[0][2], &s[0][3]};
    const uint8_t *rows_v[ATTN_CB];
    for (int32_t cb = 0; cb < a->n; cb += ATTN_CB) {
        int32_t nb = BASE_MIN(ATTN_CB, a->n - cb);
        const int32_t *idx = a->idx + cb;
        attn_dec_pf P = attn_dec_pf_block(a, r0, cb, nb, (nb + 2) / 3, a->dv / 16);
        attn_pf_far far = {{0, 0}, {0, 0}, 0};
        if (r0 == 0) far = attn_pf_far_at(a, cb, (nb + 2) / 3 + a->dv / 16);
        for (int32_t j = 0; j < nb; j += 3) {
            /* a short last group repeats its last cell; the copies are not stored */
            const uint8_t *k[3];
            for (int c = 0; c < 3; c++) k[c] = a->kbase + (size_t)idx[j + BASE_MIN(c, nb - j - 1)] * a->krb;
            attn_pf_step_dt(vt, &P.v, P.vl);
            attn_pf_far_step(&far);
            __m128 sk[3];
            kq_fp_three(kt, k, x, a->dk, sk);
            for (int c = 0; c < 3 && j + c < nb; c++) _mm_store_ps(s[j + c], _mm_mul_ps(sk[c], sc4));
        }
        if (capped)
            for (int32_t j = 0; j < nb; j++)
                for (int r = 0; r < 4; r++) s[j][r] = a->softcap * tanhf(s[j][r] * a->scale / a->softcap);
        dec_softmax4(s, nb, &m4, &l4, acc, NR, a->dv);
        for (int32_t j = 0; j < nb; j++) rows_v[j] = a->vbase + (size_t)idx[j] * a->vrb;
        for (int32_t c = 0; c < a->dv; c += 16) {
            attn_pf_step_dt(kt, &P.k, P.kl);
            attn_pf_far_step(&far);
            pvf_seg(vt, rows_v, nb, pr, 4, acc, NR, c);
        }
    }
    _mm_storeu_ps(m4a, m4);
    _mm_storeu_ps(l4a, l4);
    attn_dec_quad_save(a, r0, NR, m4a, l4a);
}

ATTN_DEC_QUADS(dec_f16_f16, decf_quad, KEEL_DTYPE_F16, KEEL_DTYPE_F16)
ATTN_DEC_QUADS(dec_f16_f32, decf_quad, KEEL_DTYPE_F16, KEEL_DTYPE_F32)
ATTN_DEC_QUADS(dec_f32_f16, decf_quad, KEEL_DTYPE_F32, KEEL_DTYPE_F16)
ATTN_DEC_QUADS(dec_f32_f32, decf_quad, KEEL_DTYPE_F32, KEEL_DTYPE_F32)

attn_dec_fn attn_dec_avx2(keel_dtype kt, keel_dtype vt, int32_t dk, int32_t dv)
{
    bool kf = kt == KEEL_DTYPE_F16 || kt == KEEL_DTYPE_F32, vf = vt == KEEL_DTYPE_F16 || vt == KEEL_DTYPE_F32;
    if (kf && vf) {
        if (dk % 8 || dv % 16 || dk < 8 || dv < 16) return NULL;
        if (kt == KEEL_DTYPE_F16) return vt == KEEL_DTYPE_F16 ? dec_f16_f16 : dec_f16_f32;
        return vt == KEEL_DTYPE_F16 ? dec_f32_f16 : dec_f32_f32;
    }
    bool kq = kt == KEEL_DTYPE_Q8_0 || kt == KEEL_DTYPE_Q4_0;
    bool vq = vt == KEEL_DTYPE_Q8_0 || vt == KEEL_DTYPE_Q4_0;
    if (!kq || !vq || dk % QK || dv % QK || dk > KQ_NB_MAX * QK || dv > PV_NB_MAX * QK || dk < QK || dv < QK)
        return NULL;
    if (kt == KEEL_DTYPE_Q8_0) return vt == KEEL_DTYPE_Q8_0 ? dec_q8_q8 : dec_q8_q4;
    return vt == KEEL_DTYPE_Q8_0 ? dec_q4_q8 : dec_q4_q4;
}

/* K . q for many query rows (a prefill block: tokens x GQA rows) over
 * q8_0 keys in the decode kernel's one-cell-per-lane form, as the AVX-512
 * kq_tiles_q8 does: per tile of 8 cells and half key block (16 bytes) the
 * half is transposed once (dec8_kt) and |k| formed once for every row;
 * each row then takes four groups of (broadcast q, sign, maddubs, madd,
 * add) into 8 int32 lanes (the halves' sums meet in part[]),
 * and one convert and one FMA by d_k * d_q per block. A quad of rows per
 * cell (kq8_quad) spends per row and cell a load of the row's block, the
 * sign trick, maddubs and madd, plus the quad's three hadd2 reductions,
 * its convert and scale. The int32 dot is exact, so the scores differ
 * from kq8_quad's by float reordering only. Only [R][n] is written. */
static void kq8_tiles(const uint8_t *base, size_t rb, const int32_t *idx, int32_t n, const void *const *q,
                      int32_t R, int32_t dk, float *scores, attn_pf pf)
{
    enum { RG = 32 }; /* rows whose int32 half sums are kept at once */
    const int32_t nb = dk / QK, tiles = (n + DEC8_T - 1) / DEC8_T;
    const __m256i ones = _mm256_set1_epi16(1), iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    _Alignas(32) int32_t part[RG][DEC8_T];
    float dq[RG][KQ_NB_MAX]; /* the rows' query block scales */
    attn_pf_cursor pc = attn_pf_begin(pf);
    int32_t pl = attn_pf_lines(pf, tiles * nb);
    for (int32_t r0 = 0; r0 < R; r0 += RG) {
        int32_t nr = BASE_MIN(RG, R - r0);
        for (int32_t r = 0; r < nr; r++)
            for (int32_t b = 0; b < nb; b++) dq[r][b] = f16_to_f32((const uint8_t *)q[r0 + r] + (size_t)b * 34);
        for (int32_t t = 0; t < tiles; t++) {
            int32_t t0 = t * DEC8_T, m = BASE_MIN(DEC8_T, n - t0);
            const uint8_t *rows[DEC8_T];
            /* a short tile repeats its last cell; those lanes are not stored */
            for (int c = 0; c < DEC8_T; c++) rows[c] = base + (size_t)idx[t0 + BASE_MIN(c, m - 1)] * rb;
            __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(m), iota);
            for (int32_t b = 0; b < nb; b++) {
                if (r0 == 0) attn_pf_step(&pc, pl);
                __m256 dkv = _mm256_cvtph_ps(dec8_scales8(rows, (size_t)b * 34));
                for (int h = 0; h < 2; h++) {
                    __m256i g[4], u[4];
                    dec8_kt(rows, (size_t)b * 34 + 2 + 16 * (size_t)h, g);
#pragma GCC unroll 4
                    for (int i = 0; i < 4; i++) u[i] = _mm256_abs_epi8(g[i]);
#pragma GCC unroll 2
                    for (int32_t r = 0; r < nr; r++) {
                        const uint8_t *qb = (const uint8_t *)q[r0 + r] + (size_t)b * 34;
                        __m256i a = h ? _mm256_load_si256((const __m256i *)part[r]) : _mm256_setzero_si256();
                        __m256i pp[4];
#pragma GCC unroll 4
                        for (int i = 0; i < 4; i++) {
                            __m256i qv = _mm256_set1_epi32(attn_ld_i32(qb + 2 + 16 * h + 4 * i));
                            pp[i] = _mm256_madd_epi16(_mm256_maddubs_epi16(u[i], _mm256_sign_epi8(qv, g[i])), ones);
                        }
                        a = _mm256_add_epi32(a, _mm256_add_epi32(_mm256_add_epi32(pp[0], pp[1]), _mm256_add_epi32(pp[2], pp[3])));
                        if (!h) {
                            _mm256_store_si256((__m256i *)part[r], a);
                            continue;
                        }
                        __m256 d = _mm256_cvtepi32_ps(a);
                        __m256 sc = _mm256_mul_ps(dkv, _mm256_set1_ps(dq[r][b]));
                        float *s = scores + (size_t)(r0 + r) * ATTN_CB + t0;
                        bool full = m == DEC8_T;
                        __m256 v = b == 0 ? _mm256_mul_ps(d, sc)
                                          : _mm256_fmadd_ps(d, sc, full ? _mm256_loadu_ps(s) : _mm256_maskload_ps(s, mask));
                        if (full)
                            _mm256_storeu_ps(s, v);
                        else
                            _mm256_maskstore_ps(s, mask, v);
                    }
                }
            }
        }
    }
}
