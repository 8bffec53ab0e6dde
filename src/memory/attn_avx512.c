/*
 * attn_avx512.c — AVX-512 kernels of attention over the cache (see
 * attn_kernels.h). Compiled with -mavx512f/bw/vl/dq/vnni; chosen at run time
 * when the CPU has F/BW/VL/VNNI (attn_path_best). Shapes these kernels do
 * not cover (head dims that are not a multiple of 16 / 64, or more than
 * KQ_NB_MAX blocks) go to the AVX2 kernels. Rows of the block after this
 * one (attn_pf) are prefetched a few lines per cell.
 *
 * K . q   Query rows are taken four at a time (a quad); each zmm holds two
 *         query rows, one per 256-bit half, so one K load (broadcast to both
 *         halves) serves two rows per instruction.
 *         q8_0 / q4_0 keys: the int8 dots are VNNI dpbusd (u8 x s8). For
 *         q8_0 keys the query is biased to u8 (q + 128) once per call and
 *         the bias is removed through the accumulator's start value
 *         (-128 * sum of the key bytes, one dpbusd per key block shared by
 *         all rows); for q4_0 keys the nibbles are the u8 operand and the
 *         -8 offset is removed the same way with -8 * sum of the query
 *         bytes, precomputed. Integer sums are exact; each block's sum is
 *         scaled by d_k * d_q in f32 as the scalar kernel does.
 *         f32 / f16 keys: f32 FMAs against f32 query rows.
 *         Per cell the quad ends as one zmm of four 4-lane partial sums;
 *         four cells are reduced together (a 4x4 transpose-add) and stored
 *         as four 4-score runs. f32 / f16 keys compute the four cells
 *         together so that each query vector loaded serves four K rows.
 * p . V   Up to four active rows at a time, 64 columns at a time: 16 zmm
 *         accumulators stay in registers across the block of cells while
 *         each V row segment is dequantized into 4 zmm once for all rows.
 *         From PV_TILE_ROWS active rows on (prefill, verify batches) a
 *         q8_0 / q4_0 block's segment is dequantized once into an f32 tile
 *         for all the row groups instead of once per group.
 * row     The online-softmax step of one row with the block's 32 scores in
 *         two zmm; exp is the AVX2 kernel's polynomial on 16 lanes.
 * decode  One token's rows fused (attn_dec_fn): q8_0 K and V one cell per
 *         lane (dec512_quad), f16 / f32 K and V through the kernels above
 *         in one pass per block (dec512f_quad).
 */
#include "attn_kernels.h"
#include "../tensor/simd_avx512.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define QK            32 /* elements per q8_0 / q4_0 block */
#define KQ_NB_MAX     16 /* query blocks a quad holds (dk <= 512) */
#define ALWAYS_INLINE inline __attribute__((always_inline))

static ALWAYS_INLINE float f16_to_f32(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* ---- K . q --------------------------------------------------------------- */

/* A quad of query rows prepared for one kernel call. Pair p holds rows
 * 2p (low 256 bits) and 2p + 1 (high 256 bits). */
typedef struct kq_quad {
    __m512i u[2][KQ_NB_MAX]; /* block b: q8_0 K: q + 128 (u8); q4_0 K: q (s8) */
    __m512i c[2][KQ_NB_MAX]; /* q4_0 K: -8 * the query's 4-byte lane sums */
    __m512 d[2][KQ_NB_MAX];  /* query block scale, lanes 0..7 row 2p, 8..15 row 2p + 1 */
    const float *f[4];       /* f32 / f16 K: the f32 query rows */
} kq_quad;

/* rows r0 .. r0 + 3 of q (missing rows repeat the last one; their scores
 * are never stored) */
static void quad_prep(keel_dtype kt, const void *const *q, int32_t R, int32_t r0, int32_t nb,
                      kq_quad *Q)
{
    const void *rows[4];
    for (int i = 0; i < 4; i++)
        rows[i] = q[BASE_MIN(r0 + i, R - 1)];
    if (kt != KEEL_DTYPE_Q8_0 && kt != KEEL_DTYPE_Q4_0) {
        for (int i = 0; i < 4; i++)
            Q->f[i] = rows[i];
        return;
    }
    const __m512i bias = _mm512_set1_epi8((char)0x80), eight = _mm512_set1_epi8(8);
    for (int p = 0; p < 2; p++) {
        const uint8_t *x0 = rows[2 * p], *x1 = rows[2 * p + 1];
        for (int32_t b = 0; b < nb; b++) {
            const uint8_t *b0 = x0 + (size_t)b * 34, *b1 = x1 + (size_t)b * 34;
            __m512i v = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b0 + 2))),
                _mm256_loadu_si256((const __m256i *)(b1 + 2)), 1);
            if (kt == KEEL_DTYPE_Q8_0) {
                Q->u[p][b] = _mm512_xor_si512(v, bias);
            } else {
                Q->u[p][b] = v;
                Q->c[p][b] = _mm512_sub_epi32(
                    _mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), eight, v));
            }
            Q->d[p][b] = _mm512_castpd_ps(
                _mm512_insertf64x4(_mm512_castps_pd(_mm512_set1_ps(f16_to_f32(b0))),
                                   _mm256_castps_pd(_mm256_set1_ps(f16_to_f32(b1))), 1));
        }
    }
}

/* pair accumulators (rows 0,1 | rows 2,3) -> [row0 | row1 | row2 | row3],
 * four partial sums per 128-bit lane */
static ALWAYS_INLINE __m512 quad_of_pairs(__m512 p01, __m512 p23)
{
    return _mm512_add_ps(_mm512_shuffle_f32x4(p01, p23, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(p01, p23, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* two 16-lane row accumulators -> pair layout (row a low 256, row b high) */
static ALWAYS_INLINE __m512 pair_of_rows(__m512 a, __m512 b)
{
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
}

static ALWAYS_INLINE __m512 cell_q8(const uint8_t *k, const kq_quad *Q, int32_t nb)
{
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    __m512 a0 = _mm512_setzero_ps(), a1 = a0;
    for (int32_t b = 0; b < nb; b++) {
        const uint8_t *kb = k + (size_t)b * 34;
        __m512i kv = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(kb + 2)));
        __m512i s = _mm512_sub_epi32(_mm512_setzero_si512(),
                                     _mm512_dpbusd_epi32(_mm512_setzero_si512(), bias, kv));
        __m512 dk = _mm512_set1_ps(f16_to_f32(kb));
        __m512i t0 = _mm512_dpbusd_epi32(s, Q->u[0][b], kv);
        __m512i t1 = _mm512_dpbusd_epi32(s, Q->u[1][b], kv);
        a0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t0), _mm512_mul_ps(dk, Q->d[0][b]), a0);
        a1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t1), _mm512_mul_ps(dk, Q->d[1][b]), a1);
    }
    return quad_of_pairs(a0, a1);
}

static ALWAYS_INLINE __m512 cell_q4(const uint8_t *k, const kq_quad *Q, int32_t nb)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    __m512 a0 = _mm512_setzero_ps(), a1 = a0;
    for (int32_t b = 0; b < nb; b++) {
        const uint8_t *kb = k + (size_t)b * 18;
        /* [lo nibbles | hi nibbles] in each 256-bit half: elements 0..31 */
        __m512i x = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(kb + 2)));
        __m512i kv = _mm512_and_si512(_mm512_mask_srli_epi16(x, 0xff00ff00u, x, 4), m4);
        __m512 dk = _mm512_set1_ps(f16_to_f32(kb));
        __m512i t0 = _mm512_dpbusd_epi32(Q->c[0][b], kv, Q->u[0][b]);
        __m512i t1 = _mm512_dpbusd_epi32(Q->c[1][b], kv, Q->u[1][b]);
        a0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t0), _mm512_mul_ps(dk, Q->d[0][b]), a0);
        a1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t1), _mm512_mul_ps(dk, Q->d[1][b]), a1);
    }
    return quad_of_pairs(a0, a1);
}

static ALWAYS_INLINE __m512 load_k16(keel_dtype kt, const uint8_t *k, int32_t i)
{
    return kt == KEEL_DTYPE_F16
               ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(k + 2 * (size_t)i)))
               : _mm512_loadu_ps((const float *)k + i);
}

/* f32 / f16 keys: four cells together so that each query vector loaded
 * serves four K rows (one cell at a time is bound by the loads) */
static ALWAYS_INLINE void cells_fp(keel_dtype kt, const uint8_t *const k[4], const kq_quad *Q,
                                   int32_t dk, __m512 z[4])
{
    __m512 a[4][4]; /* [cell][row] */
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++)
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++)
            a[c][r] = _mm512_setzero_ps();
    for (int32_t i = 0; i < dk; i += 16) {
        __m512 kv[4];
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            kv[c] = load_k16(kt, k[c], i);
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            __m512 x = _mm512_loadu_ps(Q->f[r] + i);
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++)
                a[c][r] = _mm512_fmadd_ps(kv[c], x, a[c][r]);
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++)
        z[c] = quad_of_pairs(pair_of_rows(a[c][0], a[c][1]), pair_of_rows(a[c][2], a[c][3]));
}

static ALWAYS_INLINE void cells(keel_dtype kt, const uint8_t *const k[4], const kq_quad *Q,
                                int32_t dk, __m512 z[4])
{
    /* int8 keys one cell at a time: measured faster than four together */
    if (kt == KEEL_DTYPE_Q8_0) {
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            z[c] = cell_q8(k[c], Q, dk / QK);
    } else if (kt == KEEL_DTYPE_Q4_0) {
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            z[c] = cell_q4(k[c], Q, dk / QK);
    } else {
        cells_fp(kt, k, Q, dk, z);
    }
}

/* Four cells' quads [row r: 4 partials] -> [row r: score of cell 0..3]. */
static ALWAYS_INLINE __m512 reduce4(__m512 z0, __m512 z1, __m512 z2, __m512 z3)
{
    __m512 s01 = _mm512_add_ps(_mm512_unpacklo_ps(z0, z1), _mm512_unpackhi_ps(z0, z1));
    __m512 s23 = _mm512_add_ps(_mm512_unpacklo_ps(z2, z3), _mm512_unpackhi_ps(z2, z3));
    __m512d a = _mm512_castps_pd(s01), b = _mm512_castps_pd(s23);
    return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
}

static ALWAYS_INLINE void kq_body(keel_dtype kt, const uint8_t *base, size_t rb, const int32_t *idx,
                                  int32_t n, const void *const *q, int32_t R, int32_t dk,
                                  float *scores, attn_pf pf)
{
    kq_quad Q;
    attn_pf_cursor pc = attn_pf_begin(pf);
    int32_t pl = attn_pf_lines(pf, (R + 3) / 4 * ((n + 3) / 4));
    for (int32_t r0 = 0; r0 < R; r0 += 4) {
        quad_prep(kt, q, R, r0, dk / QK, &Q);
        int32_t nr = BASE_MIN(4, R - r0);
        for (int32_t j = 0; j < n; j += 4) {
            /* a short last group repeats its last cell; masked out on store */
            int32_t m = BASE_MIN(4, n - j);
            attn_pf_step_dt(kt, &pc, pl);
            const uint8_t *k[4];
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++)
                k[c] = base + (size_t)idx[j + BASE_MIN(c, m - 1)] * rb;
            __m512 z[4];
            cells(kt, k, &Q, dk, z);
            __m512 w = reduce4(z[0], z[1], z[2], z[3]);
            float *s = scores + (size_t)r0 * ATTN_CB + j;
            if (m == 4 && nr == 4) {
                /* masked stores are slow on some cores: full groups store plainly */
                _mm_storeu_ps(s, _mm512_castps512_ps128(w));
                _mm_storeu_ps(s + ATTN_CB, _mm512_extractf32x4_ps(w, 1));
                _mm_storeu_ps(s + 2 * ATTN_CB, _mm512_extractf32x4_ps(w, 2));
                _mm_storeu_ps(s + 3 * ATTN_CB, _mm512_extractf32x4_ps(w, 3));
                continue;
            }
            __mmask8 mk = (__mmask8)((1u << m) - 1);
            _mm_mask_storeu_ps(s, mk, _mm512_castps512_ps128(w));
            if (nr > 1) _mm_mask_storeu_ps(s + ATTN_CB, mk, _mm512_extractf32x4_ps(w, 1));
            if (nr > 2) _mm_mask_storeu_ps(s + 2 * ATTN_CB, mk, _mm512_extractf32x4_ps(w, 2));
            if (nr > 3) _mm_mask_storeu_ps(s + 3 * ATTN_CB, mk, _mm512_extractf32x4_ps(w, 3));
        }
    }
}

static void kq_tiles_q8(const uint8_t *base, size_t rb, const int32_t *idx, int32_t n, const void *const *q,
                        int32_t R, int32_t dk, float *scores, attn_pf pf);

/* rows from which the transposed tiles (kq_tiles_q8) pay for their
 * transposes: a prefill block's R = tokens x GQA rows */
#define KQ_TILE_MIN_ROWS 8

static void kq_q8(keel_dtype kt, const uint8_t *base, size_t rb, const int32_t *idx, int32_t n,
                  const void *const *q, int32_t R, int32_t dk, float *scores, attn_pf pf)
{
    if (dk > KQ_NB_MAX * QK) {
        attn_kq_avx2(kt)(kt, base, rb, idx, n, q, R, dk, scores, pf);
        return;
    }
    if (R >= KQ_TILE_MIN_ROWS) {
        kq_tiles_q8(base, rb, idx, n, q, R, dk, scores, pf);
        return;
    }
    kq_body(KEEL_DTYPE_Q8_0, base, rb, idx, n, q, R, dk, scores, pf);
}

static void kq_q4(keel_dtype kt, const uint8_t *base, size_t rb, const int32_t *idx, int32_t n,
                  const void *const *q, int32_t R, int32_t dk, float *scores, attn_pf pf)
{
    if (dk > KQ_NB_MAX * QK) {
        attn_kq_avx2(kt)(kt, base, rb, idx, n, q, R, dk, scores, pf);
        return;
    }
    kq_body(KEEL_DTYPE_Q4_0, base, rb, idx, n, q, R, dk, scores, pf);
}

static void kq_f16(keel_dtype kt, const uint8_t *base, size_t rb, const int32_t *idx, int32_t n,
                   const void *const *q, int32_t R, int32_t dk, float *scores, attn_pf pf)
{
    if (dk % 16) {
        attn_kq_avx2(kt)(kt, base, rb, idx, n, q, R, dk, scores, pf);
        return;
    }
    kq_body(KEEL_DTYPE_F16, base, rb, idx, n, q, R, dk, scores, pf);
}

static void kq_f32(keel_dtype kt, const uint8_t *base, size_t rb, const int32_t *idx, int32_t n,
                   const void *const *q, int32_t R, int32_t dk, float *scores, attn_pf pf)
{
    if (dk % 16) {
        attn_kq_avx2(kt)(kt, base, rb, idx, n, q, R, dk, scores, pf);
        return;
    }
    kq_body(KEEL_DTYPE_F32, base, rb, idx, n, q, R, dk, scores, pf);
}

attn_kq_fn attn_kq_avx512(keel_dtype kt)
{
    switch (kt) {
    case KEEL_DTYPE_F32:
        return kq_f32;
    case KEEL_DTYPE_F16:
        return kq_f16;
    case KEEL_DTYPE_Q8_0:
        return kq_q8;
    case KEEL_DTYPE_Q4_0:
        return kq_q4;
    default:
        return NULL;
    }
}

/* ---- p . V --------------------------------------------------------------- */

/* v[0..4) = elements [seg, seg + 64) of row */
static ALWAYS_INLINE void dq_seg(keel_dtype vt, const uint8_t *row, int32_t seg, __m512 v[4])
{
    if (vt == KEEL_DTYPE_Q8_0) {
        const uint8_t *b = row + (size_t)(seg / QK) * 34;
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++, b += 34) {
            __m512 d = _mm512_set1_ps(f16_to_f32(b));
            __m128i x0 = _mm_loadu_si128((const __m128i *)(b + 2));
            __m128i x1 = _mm_loadu_si128((const __m128i *)(b + 18));
            v[2 * h] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(x0)));
            v[2 * h + 1] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(x1)));
        }
    } else if (vt == KEEL_DTYPE_Q4_0) {
        const uint8_t *b = row + (size_t)(seg / QK) * 18;
        const __m512i m4 = _mm512_set1_epi32(0x0f);
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++, b += 18) {
            /* (n - 8) * d as n * d - 8 * d: both exact before the one rounding */
            __m512 d = _mm512_set1_ps(f16_to_f32(b));
            __m512 m8d = _mm512_mul_ps(d, _mm512_set1_ps(-8.0f));
            /* one byte per lane: low nibbles are elements 0..15, high 16..31 */
            __m512i x = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b + 2)));
            __m512i lo = _mm512_and_si512(x, m4), hi = _mm512_srli_epi32(x, 4);
            v[2 * h] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo), d, m8d);
            v[2 * h + 1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), d, m8d);
        }
    } else if (vt == KEEL_DTYPE_F16) {
        const uint8_t *h = row + (size_t)seg * 2;
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++)
            v[i] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + 32 * i)));
    } else {
        const float *f = (const float *)row + seg;
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++)
            v[i] = _mm512_loadu_ps(f + 16 * i);
    }
}

/* acc rows a[0..nr) [seg, seg + 64) += sum_j p[r][j] V_j, where V_j is
 * cell j's 64 values: from tile[j] when a tile is given (the block
 * already in f32, so four aligned loads serve the nr rows' 4 nr FMAs),
 * else dequantized from V row idx[j] (asking for pc's lines and, given a
 * far cursor, its lines a cell at a time). Unrolled so that acc stays in
 * 4 * nr registers; both sources give the same values in the same FMA
 * order, so the same bits. */
static ALWAYS_INLINE void pv_seg(keel_dtype vt, const float *tile, const uint8_t *base, size_t rb,
                                 const int32_t *idx, int32_t n, const float *const *p, float *const *a,
                                 int nr, int32_t seg, attn_pf_cursor *pc, int32_t pl, attn_pf_far *far)
{
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++)
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++)
            acc[r][i] = _mm512_loadu_ps(a[r] + seg + 16 * i);
    for (int32_t j = 0; j < n; j++) {
        __m512 v[4];
        if (tile) {
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++)
                v[i] = _mm512_load_ps(tile + (size_t)j * 64 + 16 * i);
        } else {
            attn_pf_step_dt(vt, pc, pl);
            if (far) attn_pf_far_step(far);
            dq_seg(vt, base + (size_t)idx[j] * rb, seg, v);
        }
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) {
            __m512 pj = _mm512_set1_ps(p[r][j]);
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++)
                acc[r][i] = _mm512_fmadd_ps(pj, v[i], acc[r][i]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++)
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++)
            _mm512_storeu_ps(a[r] + seg + 16 * i, acc[r][i]);
}

/* pv_seg for a group of nr in [1, 4] rows, each size its own unrolled copy */
static ALWAYS_INLINE void pv_seg_group(keel_dtype vt, const float *tile, const uint8_t *base, size_t rb,
                                       const int32_t *idx, int32_t n, const float *const *p,
                                       float *const *a, int nr, int32_t seg, attn_pf_cursor *pc,
                                       int32_t pl)
{
    switch (nr) {
    case 4:
        pv_seg(vt, tile, base, rb, idx, n, p, a, 4, seg, pc, pl, NULL);
        break;
    case 3:
        pv_seg(vt, tile, base, rb, idx, n, p, a, 3, seg, pc, pl, NULL);
        break;
    case 2:
        pv_seg(vt, tile, base, rb, idx, n, p, a, 2, seg, pc, pl, NULL);
        break;
    case 1:
        pv_seg(vt, tile, base, rb, idx, n, p, a, 1, seg, pc, pl, NULL);
        break;
    default:
        break;
    }
}

/* Many active rows (a prefill block or a verify batch: tokens x GQA
 * rows): per 64 columns the block's V values are dequantized once into an
 * f32 tile, then accumulated four rows at a time. */
static ALWAYS_INLINE void pv_tiled(keel_dtype vt, const uint8_t *base, size_t rb, const int32_t *idx, int32_t n,
                                   const float *p, const uint8_t *active, int32_t R, int32_t dv, float *const *acc,
                                   attn_pf pf)
{
    _Alignas(64) float tile[ATTN_CB * 64];
    attn_pf_cursor pc = attn_pf_begin(pf);
    int32_t pl = attn_pf_lines(pf, dv / 64 * n);
    const float *pr[4];
    float *ar[4];
    for (int32_t seg = 0; seg < dv; seg += 64) {
        for (int32_t j = 0; j < n; j++) {
            __m512 v[4];
            attn_pf_step_dt(vt, &pc, pl);
            dq_seg(vt, base + (size_t)idx[j] * rb, seg, v);
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++)
                _mm512_store_ps(tile + (size_t)j * 64 + 16 * i, v[i]);
        }
        int nr;
        for (int32_t r = 0; (nr = attn_next_group(p, active, acc, R, &r, pr, ar)) > 0;)
            pv_seg_group(vt, tile, base, rb, idx, n, pr, ar, nr, seg, &pc, pl);
    }
}

/* Active rows from which q8_0 / q4_0 V goes through an f32 tile: with
 * three or more groups of four the conversions saved pay for the tile's
 * stores (a harness, dim 64 and 128, 4096 cells: 0.99x at 8 rows, 1.05-1.09x
 * at 12, 1.06-1.12x at 16, 1.10-1.14x at 27-32 of kq + row + pv). f16 V
 * converts in one instruction a vector and gains nothing (1.01x). */
#define PV_TILE_ROWS 9

static ALWAYS_INLINE void pv_body(keel_dtype vt, const uint8_t *base, size_t rb, const int32_t *idx,
                                  int32_t n, const float *p, const uint8_t *active, int32_t R,
                                  int32_t dv, float *const *acc, attn_pf pf)
{
    int32_t n_act = attn_n_active(active, R);
    if ((vt == KEEL_DTYPE_Q8_0 || vt == KEEL_DTYPE_Q4_0) && n_act >= PV_TILE_ROWS) {
        pv_tiled(vt, base, rb, idx, n, p, active, R, dv, acc, pf);
        return;
    }
    attn_pf_cursor pc = attn_pf_begin(pf);
    int32_t pl = attn_pf_lines(pf, (n_act + 3) / 4 * (dv / 64) * n);
    const float *pr[4];
    float *ar[4];
    int nr;
    for (int32_t r = 0; (nr = attn_next_group(p, active, acc, R, &r, pr, ar)) > 0;)
        for (int32_t seg = 0; seg < dv; seg += 64)
            pv_seg_group(vt, NULL, base, rb, idx, n, pr, ar, nr, seg, &pc, pl);
}

static void pv_q8(keel_dtype vt, const uint8_t *base, size_t rb, const int32_t *idx, int32_t n,
                  const float *p, const uint8_t *active, int32_t R, int32_t dv, float *const *acc,
                  attn_pf pf)
{
    if (dv % 64) {
        attn_pv_avx2(vt)(vt, base, rb, idx, n, p, active, R, dv, acc, pf);
        return;
    }
    pv_body(KEEL_DTYPE_Q8_0, base, rb, idx, n, p, active, R, dv, acc, pf);
}

static void pv_q4(keel_dtype vt, const uint8_t *base, size_t rb, const int32_t *idx, int32_t n,
                  const float *p, const uint8_t *active, int32_t R, int32_t dv, float *const *acc,
                  attn_pf pf)
{
    if (dv % 64) {
        attn_pv_avx2(vt)(vt, base, rb, idx, n, p, active, R, dv, acc, pf);
        return;
    }
    pv_body(KEEL_DTYPE_Q4_0, base, rb, idx, n, p, active, R, dv, acc, pf);
}

static void pv_f16(keel_dtype vt, const uint8_t *base, size_t rb, const int32_t *idx, int32_t n,
                   const float *p, const uint8_t *active, int32_t R, int32_t dv, float *const *acc,
                   attn_pf pf)
{
    if (dv % 64) {
        attn_pv_avx2(vt)(vt, base, rb, idx, n, p, active, R, dv, acc, pf);
        return;
    }
    pv_body(KEEL_DTYPE_F16, base, rb, idx, n, p, active, R, dv, acc, pf);
}

static void pv_f32(keel_dtype vt, const uint8_t *base, size_t rb, const int32_t *idx, int32_t n,
                   const float *p, const uint8_t *active, int32_t R, int32_t dv, float *const *acc,
                   attn_pf pf)
{
    if (dv % 64) {
        attn_pv_avx2(vt)(vt, base, rb, idx, n, p, active, R, dv, acc, pf);
        return;
    }
    pv_body(KEEL_DTYPE_F32, base, rb, idx, n, p, active, R, dv, acc, pf);
}

attn_pv_fn attn_pv_avx512(keel_dtype vt)
{
    switch (vt) {
    case KEEL_DTYPE_F32:
        return pv_f32;
    case KEEL_DTYPE_F16:
        return pv_f16;
    case KEEL_DTYPE_Q8_0:
        return pv_q8;
    case KEEL_DTYPE_Q4_0:
        return pv_q4;
    default:
        return NULL;
    }
}

/* ---- exp ----------------------------------------------------------------- */

static ALWAYS_INLINE __m512 exp16(__m512 x)
{
    const __m512 hi = _mm512_set1_ps(88.3762626647949f), lo = _mm512_set1_ps(-87.3365447505531f);
    const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
    const __m512 c1 = _mm512_set1_ps(0.693359375f), c2 = _mm512_set1_ps(-2.12194440e-4f);
    __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    x = _mm512_min_ps(x, hi);
    x = _mm512_max_ps(x, lo);
    __m512 fx = _mm512_roundscale_ps(_mm512_mul_ps(x, log2e),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm512_sub_ps(x, _mm512_mul_ps(fx, c1));
    x = _mm512_sub_ps(x, _mm512_mul_ps(fx, c2));
    __m512 z = _mm512_mul_ps(x, x);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, z, _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
    __m512i e =
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(fx), _mm512_set1_epi32(127)), 23);
    y = _mm512_mul_ps(y, _mm512_castsi512_ps(e));
    return _mm512_maskz_mov_ps((__mmask16)~under, y);
}

float attn_exp_avx512(float *x, int32_t n, float m)
{
    __m512 mm = _mm512_set1_ps(m), sum = _mm512_setzero_ps();
    for (int32_t j = 0; j < n; j += 16) {
        /* masked tail: lanes past n are neither read nor written */
        __mmask16 k = n - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - j)) - 1);
        __m512 v = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + j), mm));
        v = _mm512_maskz_mov_ps(k, v);
        _mm512_mask_storeu_ps(x + j, k, v);
        sum = _mm512_add_ps(sum, v);
    }
    return _mm512_reduce_add_ps(sum);
}

bool attn_row_avx512(float *s, int32_t n, float scale, const uint8_t *vis, float *m, float *l,
                     float *alpha)
{
    /* both halves of the block in registers: lanes past n and invisible
     * cells are -inf, which exp16 maps to 0 */
    __mmask16 k0 = n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
    __mmask16 k1 = n >= 32 ? (__mmask16)0xffff : n > 16 ? (__mmask16)((1u << (n - 16)) - 1) : 0;
    __m128i v0 = _mm_maskz_loadu_epi8(k0, vis), v1 = _mm_maskz_loadu_epi8(k1, vis + 16);
    __mmask16 w0 = _mm_test_epi8_mask(v0, v0), w1 = _mm_test_epi8_mask(v1, v1);
    const __m512 ninf = _mm512_set1_ps(-INFINITY), sc = _mm512_set1_ps(scale);
    __m512 x0 = _mm512_mask_mul_ps(ninf, w0, _mm512_maskz_loadu_ps(k0, s), sc);
    __m512 x1 = _mm512_mask_mul_ps(ninf, w1, _mm512_maskz_loadu_ps(k1, s + 16), sc);
    float bmax = _mm512_reduce_max_ps(_mm512_max_ps(x0, x1));
    *alpha = 1.0f;
    if (bmax == -INFINITY) {
        _mm512_mask_storeu_ps(s, k0, x0);
        _mm512_mask_storeu_ps(s + 16, k1, x1);
        return false;
    }
    float mnew = bmax > *m ? bmax : *m;
    if (*m != -INFINITY && mnew != *m) {
        *alpha = expf(*m - mnew);
        *l *= *alpha;
    }
    *m = mnew;
    __m512 mm = _mm512_set1_ps(mnew);
    __m512 e0 = exp16(_mm512_sub_ps(x0, mm)), e1 = exp16(_mm512_sub_ps(x1, mm));
    _mm512_mask_storeu_ps(s, k0, e0);
    _mm512_mask_storeu_ps(s + 16, k1, e1);
    *l += _mm512_reduce_add_ps(_mm512_add_ps(e0, e1));
    return true;
}

/* ---- fused decode (q8_0 K, q8_0 V) ---------------------------------------
 *
 * One quad of query rows (NR <= 4) over the listed cells, in blocks of
 * ATTN_CB cells made of two tiles of 16. The scores keep one cell per
 * 32-bit lane from the int8 dots to the probabilities, so nothing is
 * reduced across lanes per cell:
 *   - a tile's K block b (16 rows x 32 bytes) is transposed into eight zmm
 *     (lane c = bytes 4i..4i+3 of cell c) and biased to u8 (k + 128);
 *   - each row r takes eight dpbusd against its query's 4-byte groups
 *     (embedded broadcasts), started from -128 * sum(q) so the integer sum
 *     is exact; then one convert and one FMA by d_k (the tile's 16 block
 *     scales, gathered) * d_q * scale;
 *   - the online softmax runs on the rows' two score vectors per block.
 * p . V in int16 (dec_pv16_block): the weights w = p * d_v of a row, V
 * block and block of cells are rounded to 15-bit integers against their
 * largest |w| (dec_pv16_weights); per pair of cells the V block's 32
 * values of both are sign-extended and interleaved (a lane = a column, its
 * two int16 = the two cells) and each row takes one vpdpwssd per 16
 * columns against the pair's two weights. The int32 sums are exact and are
 * scaled into the f32 accumulators once per block of cells. Against f32
 * weights with one FMA per cell, row and 16 columns this halves the
 * multiplies and drops the conversion of V to f32: 15% of the kernel at
 * dim 64 x 3 rows and at 128 x 4 on a Zen 4 VM (docs/kernel-passes-2.md, sixteenth
 * pass). The cost is the weights' rounding: at most 1 / 65534 of the
 * block's largest weight each, against q8_0's own rounding of V of up to
 * 1 / 254 of its block's largest value.
 * The block's V rows are prefetched during the scores, the next block's K
 * rows during p . V, and the K and V rows ATTN_PF_FAR blocks ahead into L2
 * during p . V (attn_pf_far). */

#define DEC_T 16        /* cells per tile: one per lane */
#define PV_NB_MAX512 16 /* V blocks per row (dv <= 512) */

typedef struct dec_quad512 {
    const uint8_t *qb[4]; /* row r's q8_0 query blocks */
    int32_t corr[4][KQ_NB_MAX]; /* -128 * sum of block b's query bytes */
    float dq[4][KQ_NB_MAX];     /* d_q of block b * scale (1 with a softcap) */
} dec_quad512;

/* Block data at rows[c] + off (32 int8 each) of 16 cells transposed: g[i]
 * lane c = bytes 4i..4i+3 of cell c, plus 128 (as u8). */
static ALWAYS_INLINE void dec_kt(const uint8_t *const *rows, size_t off, __m512i g[8])
{
    __m512i z[8];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        z[i] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(rows[i] + off))),
                                  _mm256_loadu_si256((const __m256i *)(rows[i + 4] + off)), 1);
        z[4 + i] =
            _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(rows[8 + i] + off))),
                               _mm256_loadu_si256((const __m256i *)(rows[12 + i] + off)), 1);
    }
    simd512_t16x32(z, g, _mm512_set1_epi8((char)0x80));
}

/* The f16 values at base + off[c] (c < 16, off as two 8-lane int64
 * vectors) as f32. */
static ALWAYS_INLINE __m512 dec_scales16(const uint8_t *base, __m512i off_lo, __m512i off_hi)
{
    __m256i lo = _mm512_i64gather_epi32(off_lo, (const void *)base, 1);
    __m256i hi = _mm512_i64gather_epi32(off_hi, (const void *)base, 1);
    __m512i d = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(d));
}

/* Scores of one tile (16 cells at krows, byte offsets koff of each from
 * kbase) for the quad's NR rows: s[r] lane c. */
static ALWAYS_INLINE void dec_tile_scores(const uint8_t *const *krows, const uint8_t *kbase, __m512i off_lo,
                                          __m512i off_hi, const dec_quad512 *Q, int NR, int32_t nbk, __m512 s[4],
                                          attn_pf_cursor *pc, int32_t pl)
{
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) s[r] = _mm512_setzero_ps();
    for (int32_t b = 0; b < nbk; b++) {
        __m512i g[8];
        attn_pf_step(pc, pl);
        dec_kt(krows, (size_t)b * 34 + 2, g);
        __m512i bo = _mm512_set1_epi64((long long)b * 34);
        __m512 dk = dec_scales16(kbase, _mm512_add_epi64(off_lo, bo), _mm512_add_epi64(off_hi, bo));
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const uint8_t *qd = Q->qb[r] + (size_t)b * 34 + 2;
            __m512i a0 = _mm512_set1_epi32(Q->corr[r][b]), a1 = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int i = 0; i < 8; i += 2) {
                a0 = _mm512_dpbusd_epi32(a0, g[i], _mm512_set1_epi32(attn_ld_i32(qd + 4 * i)));
                a1 = _mm512_dpbusd_epi32(a1, g[i + 1], _mm512_set1_epi32(attn_ld_i32(qd + 4 * i + 4)));
            }
            s[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(a0, a1)),
                                   _mm512_mul_ps(dk, _mm512_set1_ps(Q->dq[r][b])), s[r]);
        }
    }
}

/* The byte offsets idx[c] * rb of a tile's n cells (the last one repeated
 * up to 16) as two int64 vectors, and their row pointers. */
static ALWAYS_INLINE void dec_tile_rows(const uint8_t *base, size_t rb, const int32_t *idx, int32_t n,
                                        const uint8_t **rows, __m512i *lo, __m512i *hi)
{
    __mmask16 k = n >= DEC_T ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
    __m512i ix = _mm512_mask_loadu_epi32(_mm512_set1_epi32(idx[n - 1]), k, idx);
    __m512i r = _mm512_set1_epi64((long long)rb), bp = _mm512_set1_epi64((long long)(uintptr_t)base);
    *lo = _mm512_mullo_epi64(_mm512_cvtepi32_epi64(_mm512_castsi512_si256(ix)), r);
    *hi = _mm512_mullo_epi64(_mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(ix, 1)), r);
    _mm512_storeu_si512((void *)rows, _mm512_add_epi64(*lo, bp));
    _mm512_storeu_si512((void *)(rows + 8), _mm512_add_epi64(*hi, bp));
}

/* K . q for many query rows (a prefill block: tokens x GQA rows) over
 * q8_0 keys, in the decode kernel's transposed form: per tile of 16 cells
 * and key block, the block is transposed once (dec_kt: lane c = cell c's
 * 4-byte groups, biased to u8) and its scales gathered once, and every row
 * then takes eight vpdpbusd with its 4-byte groups broadcast, started from
 * -128 * sum(q) over the block, so that the int32 dot is exact
 * (|sum| <= 32 * 127 * 128 < 2^24: exact in f32 too); one convert and one
 * FMA by d_k * d_q per row and block, the rows' scores accumulating over
 * the blocks in place. A quad of rows per cell (kq_body) spends about 2.5x
 * the instructions per multiply; the transposes are repaid from about 8
 * rows. Only [R][n] is written (a short tile stores under a mask). */
static void kq_tiles_q8(const uint8_t *base, size_t rb, const int32_t *idx, int32_t n, const void *const *q,
                        int32_t R, int32_t dk, float *scores, attn_pf pf)
{
    enum { RG = 32 }; /* rows whose block sums and scales are kept at once */
    const int32_t nb = dk / QK, tiles = (n + DEC_T - 1) / DEC_T;
    int32_t corr[RG][KQ_NB_MAX];
    float dq[RG][KQ_NB_MAX];
    const uint8_t *rows[DEC_T];
    attn_pf_cursor pc = attn_pf_begin(pf);
    int32_t pl = attn_pf_lines(pf, tiles * nb);
    for (int32_t r0 = 0; r0 < R; r0 += RG) {
        int32_t nr = BASE_MIN(RG, R - r0);
        for (int32_t r = 0; r < nr; r++) {
            const uint8_t *x = q[r0 + r];
            for (int32_t b = 0; b < nb; b++) {
                const uint8_t *xb = x + (size_t)b * 34;
                /* sum of the block's 32 int8: (sum of x + 128 as u8) - 32 * 128 */
                __m256i v = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(xb + 2)),
                                             _mm256_set1_epi8((char)0x80));
                __m256i sad = _mm256_sad_epu8(v, _mm256_setzero_si256());
                __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(sad), _mm256_extracti128_si256(sad, 1));
                int32_t sum = (int32_t)(_mm_cvtsi128_si64(s2) + _mm_extract_epi64(s2, 1)) - 32 * 128;
                corr[r][b] = -128 * sum;
                dq[r][b] = f16_to_f32(xb);
            }
        }
        for (int32_t t = 0; t < tiles; t++) {
            int32_t t0 = t * DEC_T, m = BASE_MIN(DEC_T, n - t0);
            __mmask16 mk = m == DEC_T ? (__mmask16)0xffff : (__mmask16)((1u << m) - 1);
            __m512i off_lo, off_hi;
            dec_tile_rows(base, rb, idx + t0, m, rows, &off_lo, &off_hi);
            for (int32_t b = 0; b < nb; b++) {
                if (r0 == 0) attn_pf_step(&pc, pl);
                __m512i g[8];
                dec_kt(rows, (size_t)b * 34 + 2, g);
                __m512i bo = _mm512_set1_epi64((long long)b * 34);
                __m512 dkv = dec_scales16(base, _mm512_add_epi64(off_lo, bo), _mm512_add_epi64(off_hi, bo));
                for (int32_t r = 0; r < nr; r++) {
                    const uint8_t *qd = (const uint8_t *)q[r0 + r] + (size_t)b * 34 + 2;
                    __m512i a0 = _mm512_set1_epi32(corr[r][b]), a1 = _mm512_setzero_si512();
#pragma GCC unroll 4
                    for (int i = 0; i < 8; i += 2) {
                        a0 = _mm512_dpbusd_epi32(a0, g[i], _mm512_set1_epi32(attn_ld_i32(qd + 4 * i)));
                        a1 = _mm512_dpbusd_epi32(a1, g[i + 1], _mm512_set1_epi32(attn_ld_i32(qd + 4 * i + 4)));
                    }
                    __m512 d = _mm512_cvtepi32_ps(_mm512_add_epi32(a0, a1));
                    __m512 sc = _mm512_mul_ps(dkv, _mm512_set1_ps(dq[r][b]));
                    float *s = scores + (size_t)(r0 + r) * ATTN_CB + t0;
                    __m512 v = b == 0 ? _mm512_mul_ps(d, sc) : _mm512_fmadd_ps(d, sc, _mm512_maskz_loadu_ps(mk, s));
                    if (m == DEC_T)
                        _mm512_storeu_ps(s, v);
                    else
                        _mm512_mask_storeu_ps(s, mk, v);
                }
            }
        }
    }
}

/* [f(x0), f(x1), f(x2), f(x3)] in every 128-bit lane, f the reduction of
 * 16 lanes by op (max or add) */
#define DEC_REDUCE4(OP, x0, x1, x2, x3, out)                                                                \
    do {                                                                                                 \
        __m512 t01_ = OP(_mm512_unpacklo_ps(x0, x1), _mm512_unpackhi_ps(x0, x1));                       \
        __m512 t23_ = OP(_mm512_unpacklo_ps(x2, x3), _mm512_unpackhi_ps(x2, x3));                       \
        __m512 u_ = OP(_mm512_shuffle_ps(t01_, t23_, _MM_SHUFFLE(1, 0, 1, 0)),                          \
                       _mm512_shuffle_ps(t01_, t23_, _MM_SHUFFLE(3, 2, 3, 2)));                         \
        u_ = OP(u_, _mm512_shuffle_f32x4(u_, u_, _MM_SHUFFLE(1, 0, 3, 2)));                             \
        (out) = OP(u_, _mm512_shuffle_f32x4(u_, u_, _MM_SHUFFLE(2, 3, 0, 1)));                          \
    } while (0)

/* The online softmax of a quad's block: s[t][r] = row r's scores of tile t
 * (-inf past the block's cells). The running max m and sum l of the rows
 * move on, the accumulators of rows whose max moved (NR rows of dv) are
 * rescaled, and e[t][r] = exp(s[t][r] - m[r]). The four rows' block max
 * and sum are reduced together. */
static ALWAYS_INLINE void dec512_softmax(const __m512 s[2][4], int NR, float *m, float *l, float *const *acc,
                                         int32_t dv, __m512 e[2][4])
{
    __m512 x[4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) x[r] = _mm512_max_ps(s[0][BASE_MIN(r, NR - 1)], s[1][BASE_MIN(r, NR - 1)]);
    __m512 bmax;
    DEC_REDUCE4(_mm512_max_ps, x[0], x[1], x[2], x[3], bmax);
    __m128 m4 = _mm_loadu_ps(m), mnew = _mm_max_ps(m4, _mm512_castps512_ps128(bmax));
    /* alpha = exp(m_old - m_new), 1 where m_old is -inf (nothing accumulated) */
    __m128 alpha = _mm512_castps512_ps128(exp16(_mm512_castps128_ps512(_mm_sub_ps(m4, mnew))));
    alpha = _mm_blendv_ps(alpha, _mm_set1_ps(1.0f), _mm_cmpeq_ps(m4, _mm_set1_ps(-INFINITY)));
    alpha = _mm_blendv_ps(alpha, _mm_set1_ps(1.0f), _mm_cmpeq_ps(m4, mnew));
    _mm_storeu_ps(m, mnew);
    _Alignas(16) float al[4];
    _mm_store_ps(al, alpha);
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) {
        if (al[r] != 1.0f) {
            __m512 ar = _mm512_set1_ps(al[r]);
            for (int32_t i = 0; i < dv; i += 16)
                _mm512_storeu_ps(acc[r] + i, _mm512_mul_ps(_mm512_loadu_ps(acc[r] + i), ar));
        }
        __m512 mm = _mm512_set1_ps(m[r]);
        e[0][r] = exp16(_mm512_sub_ps(s[0][r], mm));
        e[1][r] = exp16(_mm512_sub_ps(s[1][r], mm));
        x[r] = _mm512_add_ps(e[0][r], e[1][r]);
    }
    for (int r = NR; r < 4; r++) x[r] = _mm512_setzero_ps();
    __m512 bsum;
    DEC_REDUCE4(_mm512_add_ps, x[0], x[1], x[2], x[3], bsum);
    _mm_storeu_ps(l, _mm_add_ps(_mm_mul_ps(_mm_loadu_ps(l), alpha), _mm512_castps512_ps128(bsum)));
}

/* The 15-bit weights of V block b for the quad's rows: w = p * d_v of the
 * block's 32 cells (e[t][r] = p of row r in tile t, dv = the cells' d_v),
 * wq[r][c] = round(w * 32767 / wmax) with wmax the largest |w| of row r,
 * and ws[r] = wmax / 32767, the value of one unit (0 where wmax is 0). */
static ALWAYS_INLINE void dec_pv16_weights(const __m512 e[2][4], const __m512 dv[2], int NR, int16_t (*wq)[ATTN_CB],
                                           float *ws)
{
    __m512 w[2][4], am[4], wm;
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) {
        int rr = BASE_MIN(r, NR - 1);
        w[0][r] = _mm512_mul_ps(e[0][rr], dv[0]);
        w[1][r] = _mm512_mul_ps(e[1][rr], dv[1]);
        am[r] = _mm512_max_ps(_mm512_abs_ps(w[0][r]), _mm512_abs_ps(w[1][r]));
    }
    DEC_REDUCE4(_mm512_max_ps, am[0], am[1], am[2], am[3], wm);
    __m128 wmax = _mm512_castps512_ps128(wm);
    __m128 inv = _mm_and_ps(_mm_div_ps(_mm_set1_ps(32767.0f), wmax), _mm_cmpgt_ps(wmax, _mm_setzero_ps()));
    _mm_storeu_ps(ws, _mm_mul_ps(wmax, _mm_set1_ps(1.0f / 32767.0f)));
    _Alignas(16) float iv[4];
    _mm_store_ps(iv, inv);
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) {
        __m512 ivr = _mm512_set1_ps(iv[r]);
#pragma GCC unroll 2
        for (int t = 0; t < 2; t++)
            _mm256_store_si256((__m256i *)&wq[r][t * DEC_T],
                               _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(w[t][r], ivr))));
    }
}

/* acc[r][32 b ..+32) += ws[r] * sum_c wq[r][c] * V row c's block b, for the
 * cells c < np (even; a pair past the list has weight 0 and a valid row) */
static ALWAYS_INLINE void dec_pv16_block(const uint8_t *const *vrows, int32_t np, int32_t b,
                                         const int16_t (*wq)[ATTN_CB], const float *ws, float *const *acc, int NR,
                                         attn_pf_cursor *pc, int32_t pl, attn_pf_far *far)
{
    __m512i I[4][2];
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) I[r][0] = I[r][1] = _mm512_setzero_si512();
    for (int32_t c = 0; c < np; c += 2) {
        attn_pf_step(pc, pl);
        attn_pf_far_step(far);
        __m512i x = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(vrows[c] + (size_t)b * 34 + 2)));
        __m512i y = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(vrows[c + 1] + (size_t)b * 34 + 2)));
        /* lanes of lo: columns 0-3, 8-11, 16-19, 24-27; of hi: 4-7, 12-15, 20-23, 28-31 */
        __m512i lo = _mm512_unpacklo_epi16(x, y), hi = _mm512_unpackhi_epi16(x, y);
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            __m512i w = _mm512_set1_epi32(attn_ld_i32((const uint8_t *)&wq[r][c]));
            /* |sum| <= 32 cells * 32767 * 128 < 2^31: exact */
            I[r][0] = _mm512_dpwssd_epi32(I[r][0], lo, w);
            I[r][1] = _mm512_dpwssd_epi32(I[r][1], hi, w);
        }
    }
    const __m512i p0 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i p1 = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) {
        float *o = acc[r] + (size_t)b * QK;
        __m512 sc = _mm512_set1_ps(ws[r]);
        __m512 f0 = _mm512_cvtepi32_ps(_mm512_permutex2var_epi32(I[r][0], p0, I[r][1]));
        __m512 f1 = _mm512_cvtepi32_ps(_mm512_permutex2var_epi32(I[r][0], p1, I[r][1]));
        _mm512_storeu_ps(o, _mm512_fmadd_ps(f0, sc, _mm512_loadu_ps(o)));
        _mm512_storeu_ps(o + 16, _mm512_fmadd_ps(f1, sc, _mm512_loadu_ps(o + 16)));
    }
}

static ALWAYS_INLINE void dec512_quad(keel_dtype kt, keel_dtype vt, const attn_dec *a, int32_t r0, int NR)
{
    (void)kt; /* q8_0 */
    (void)vt;
    const int32_t nbk = a->dk / QK, nbv = a->dv / QK;
    const bool capped = a->softcap > 0.0f;
    dec_quad512 Q;
    for (int r = 0; r < 4; r++) {
        const uint8_t *q = a->q[r0 + BASE_MIN(r, NR - 1)];
        Q.qb[r] = q;
        for (int32_t b = 0; b < nbk; b++) {
            const uint8_t *qb = q + (size_t)b * 34;
            int32_t sum = 0;
            for (int i = 0; i < QK; i++) sum += (int8_t)qb[2 + i];
            Q.corr[r][b] = -128 * sum;
            Q.dq[r][b] = f16_to_f32(qb) * (capped ? 1.0f : a->scale);
        }
    }
    float m[4], l[4], *acc[4];
    attn_dec_quad_load(a, r0, NR, m, l, acc);
    _Alignas(64) int16_t wq[PV_NB_MAX512][4][ATTN_CB]; /* 15-bit weights per V block, row, cell */
    float ws[PV_NB_MAX512][4];                          /* their units */
    const uint8_t *krows[ATTN_CB], *vrows[ATTN_CB];
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    for (int32_t cb = 0; cb < a->n; cb += ATTN_CB) {
        int32_t nb = BASE_MIN(ATTN_CB, a->n - cb);
        const int32_t *idx = a->idx + cb;
        attn_dec_pf P = attn_dec_pf_block(a, r0, cb, nb, 2 * nbk, nbv * ((nb + 1) / 2));
        attn_pf_far far = {{0, 0}, {0, 0}, 0};
        /* rows of 64 dims for 3 query rows kept up without it and lost up
         * to 15% with it; 128 x 4 gained 10-15%, 256 x 4 28% */
        if (r0 == 0 && a->dk * NR >= 512) far = attn_pf_far_at(a, cb, nbv * ((nb + 1) / 2));
        __m512 s[2][4];
        __m512i vlo[2], vhi[2];
        for (int t = 0; t < 2; t++) {
            int32_t nt = BASE_MIN(DEC_T, nb - t * DEC_T);
            if (nt <= 0) {
                for (int r = 0; r < 4; r++) s[t][r] = ninf;
                continue;
            }
            __m512i klo, khi;
            dec_tile_rows(a->kbase, a->krb, idx + t * DEC_T, nt, krows + t * DEC_T, &klo, &khi);
            dec_tile_rows(a->vbase, a->vrb, idx + t * DEC_T, nt, vrows + t * DEC_T, &vlo[t], &vhi[t]);
            dec_tile_scores(krows + t * DEC_T, a->kbase, klo, khi, &Q, NR, nbk, s[t], &P.v, P.vl);
            __mmask16 valid = nt >= DEC_T ? (__mmask16)0xffff : (__mmask16)((1u << nt) - 1);
            for (int r = 0; r < NR; r++) {
                if (capped) {
                    _Alignas(64) float x[DEC_T];
                    _mm512_store_ps(x, s[t][r]);
                    for (int c = 0; c < DEC_T; c++) x[c] = a->softcap * tanhf(x[c] * a->scale / a->softcap);
                    s[t][r] = _mm512_load_ps(x);
                }
                s[t][r] = _mm512_mask_mov_ps(ninf, valid, s[t][r]);
            }
        }
        /* online softmax per row, then the weights p * d_v */
        __m512 dv[PV_NB_MAX512][2];
        for (int32_t b = 0; b < nbv; b++)
            for (int t = 0; t < 2; t++) {
                __m512i bo = _mm512_set1_epi64((long long)b * 34);
                dv[b][t] = t * DEC_T < nb ? dec_scales16(a->vbase, _mm512_add_epi64(vlo[t], bo),
                                                          _mm512_add_epi64(vhi[t], bo))
                                          : _mm512_setzero_ps();
            }
        __m512 e[2][4];
        dec512_softmax(s, NR, m, l, acc, a->dv, e);
        for (int32_t b = 0; b < nbv; b++) dec_pv16_weights((const __m512(*)[4])e, dv[b], NR, wq[b], ws[b]);
        /* p . V, a V block at a time; an odd last cell pairs with the tile's
         * repeated row (weight 0) */
        for (int32_t b = 0; b < nbv; b++)
            dec_pv16_block(vrows, (nb + 1) & ~1, b, (const int16_t(*)[ATTN_CB])wq[b], ws[b], acc, NR, &P.k, P.kl,
                           &far);
    }
    attn_dec_quad_save(a, r0, NR, m, l);
}

ATTN_DEC_QUADS(dec512_q8_q8, dec512_quad, KEEL_DTYPE_Q8_0, KEEL_DTYPE_Q8_0)

/* ---- fused decode, f16 / f32 K and V --------------------------------------
 *
 * One quad of rows (NR <= 4 from r0) over all cells, per block of ATTN_CB
 * cells: the scores four cells at a time as kq_body computes them
 * (cells_fp, each query vector loaded once for four keys), stored
 * row-major; the four rows' online softmax on two vectors a row
 * (dec512_softmax, as the q8_0 kernel); then p . V per 64 columns straight
 * from the V rows (pv_seg), each V value converted once for the rows.
 * Against the separate kernels (kq, the row step per row, pv) it saves the
 * visibility masks, the per-row reductions and the calls per block
 * (docs/kernel-passes-2.md, seventeenth pass). Prefetch (first quad only): the
 * block's V rows a share per four cells scored, the next block's K rows a
 * share per cell and 64 columns of p . V (the float kernels' hint), and
 * the rows ATTN_PF_FAR blocks ahead over both (attn_pf_far). */
static ALWAYS_INLINE void dec512f_quad(keel_dtype kt, keel_dtype vt, const attn_dec *a, int32_t r0, int NR)
{
    const bool capped = a->softcap > 0.0f;
    const __m512 ninf = _mm512_set1_ps(-INFINITY), sc = _mm512_set1_ps(a->scale);
    kq_quad Q;
    quad_prep(kt, a->q, a->R, r0, a->dk / QK, &Q);
    float m[4], l[4], *acc[4];
    attn_dec_quad_load(a, r0, NR, m, l, acc);
    _Alignas(64) float sp[4][ATTN_CB]; /* scores, then p, row-major */
    const float *pr[4] = {sp[0], sp[1], sp[2], sp[3]};
    for (int32_t cb = 0; cb < a->n; cb += ATTN_CB) {
        const int32_t nb = BASE_MIN(ATTN_CB, a->n - cb), groups = (nb + 3) / 4;
        const int32_t *idx = a->idx + cb;
        attn_dec_pf P = attn_dec_pf_block(a, r0, cb, nb, groups, a->dv / 64 * nb);
        attn_pf_far far = {{0, 0}, {0, 0}, 0};
        if (r0 == 0) far = attn_pf_far_at(a, cb, groups + a->dv / 64 * nb);
        for (int32_t j = 0; j < nb; j += 4) {
            /* a short last group repeats its last cell; those lanes are masked below */
            const uint8_t *k[4];
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) k[c] = a->kbase + (size_t)idx[j + BASE_MIN(c, nb - j - 1)] * a->krb;
            attn_pf_step_dt(vt, &P.v, P.vl);
            attn_pf_far_step(&far);
            __m512 z[4];
            cells(kt, k, &Q, a->dk, z);
            __m512 w = reduce4(z[0], z[1], z[2], z[3]);
            _mm_store_ps(sp[0] + j, _mm512_castps512_ps128(w));
            _mm_store_ps(sp[1] + j, _mm512_extractf32x4_ps(w, 1));
            _mm_store_ps(sp[2] + j, _mm512_extractf32x4_ps(w, 2));
            _mm_store_ps(sp[3] + j, _mm512_extractf32x4_ps(w, 3));
        }
        if (capped)
            for (int r = 0; r < NR; r++)
                for (int32_t j = 0; j < nb; j++) sp[r][j] = a->softcap * tanhf(sp[r][j] * a->scale / a->softcap);
        __mmask16 k0 = nb >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << nb) - 1);
        __mmask16 k1 = nb >= 32 ? (__mmask16)0xffff : nb > 16 ? (__mmask16)((1u << (nb - 16)) - 1) : 0;
        __m512 s[2][4], e[2][4];
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            __m512 x0 = _mm512_load_ps(sp[r]), x1 = _mm512_load_ps(sp[r] + 16);
            if (!capped) {
                x0 = _mm512_mul_ps(x0, sc);
                x1 = _mm512_mul_ps(x1, sc);
            }
            s[0][r] = _mm512_mask_mov_ps(ninf, k0, x0);
            s[1][r] = _mm512_mask_mov_ps(ninf, k1, x1);
        }
        dec512_softmax((const __m512(*)[4])s, NR, m, l, acc, a->dv, e);
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            _mm512_store_ps(sp[r], e[0][r]);
            _mm512_store_ps(sp[r] + 16, e[1][r]);
        }
        for (int32_t seg = 0; seg < a->dv; seg += 64)
            pv_seg(vt, NULL, a->vbase, a->vrb, idx, nb, pr, acc, NR, seg, &P.k, P.kl, &far);
    }
    attn_dec_quad_save(a, r0, NR, m, l);
}

ATTN_DEC_QUADS(dec512_f16_f16, dec512f_quad, KEEL_DTYPE_F16, KEEL_DTYPE_F16)
ATTN_DEC_QUADS(dec512_f16_f32, dec512f_quad, KEEL_DTYPE_F16, KEEL_DTYPE_F32)
ATTN_DEC_QUADS(dec512_f32_f16, dec512f_quad, KEEL_DTYPE_F32, KEEL_DTYPE_F16)
ATTN_DEC_QUADS(dec512_f32_f32, dec512f_quad, KEEL_DTYPE_F32, KEEL_DTYPE_F32)

attn_dec_fn attn_dec_avx512(keel_dtype kt, keel_dtype vt, int32_t dk, int32_t dv)
{
    bool kf = kt == KEEL_DTYPE_F16 || kt == KEEL_DTYPE_F32, vf = vt == KEEL_DTYPE_F16 || vt == KEEL_DTYPE_F32;
    if (kf && vf) {
        if (dk % 16 || dv % 64 || dk < 16 || dv < 64) return NULL;
        if (kt == KEEL_DTYPE_F16) return vt == KEEL_DTYPE_F16 ? dec512_f16_f16 : dec512_f16_f32;
        return vt == KEEL_DTYPE_F16 ? dec512_f32_f16 : dec512_f32_f32;
    }
    if (kt != KEEL_DTYPE_Q8_0 || vt != KEEL_DTYPE_Q8_0 || dk % QK || dv % QK || dk < QK || dv < QK ||
        dk > KQ_NB_MAX * QK || dv > PV_NB_MAX512 * QK)
        return NULL;
    return dec512_q8_q8;
}
