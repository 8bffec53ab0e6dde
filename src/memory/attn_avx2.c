/*
 * attn_avx2.c — AVX2/FMA/F16C kernels of attention over the cache (see
 * attn_kernels.h). Compiled with -mavx2 -mfma -mf16c; chosen at run time.
 *
 * K . q:   f32 / f16 keys against f32 queries; q8_0 / q4_0 keys against
 *          q8_0 queries (int8 dot products, scales applied per block).
 *          Query rows four at a time: each K vector is loaded, converted or
 *          unpacked once for the four, and the four sums reduced together.
 * p . V:   64 columns of the block's V rows are converted to an f32 tile
 *          once, then accumulated into every active row with the row's
 *          accumulators in registers across the block.
 * exp:     Cephes-style range reduction and a degree-5 polynomial (relative
 *          error < 2e-7 over the range softmax uses).
 */
#include "attn_kernels.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define QK 32 /* elements per q8_0 / q4_0 block */

static inline float hsum8(__m256 v)
{
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

static inline float f16_to_f32(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

static inline __m256i q4_unpack(const uint8_t *qs)
{
    __m128i x = _mm_loadu_si128((const __m128i *)qs);
    __m256i v = _mm256_set_m128i(_mm_srli_epi16(x, 4), x);
    v = _mm256_and_si256(v, _mm256_set1_epi8(0x0f));
    return _mm256_sub_epi8(v, _mm256_set1_epi8(8));
}

/* ---- K . q ------------------------------------------------------------- */

/* four row accumulators -> their four sums, in order */
static inline __m128 hsum8x4(__m256 a0, __m256 a1, __m256 a2, __m256 a3)
{
    __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
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
        const float *x0 = xv[0], *x1 = xv[1], *x2 = xv[2], *x3 = xv[3];
        int32_t nr = BASE_MIN(4, R - r0);
        for (int32_t j = 0; j < n; j++) {
            const uint8_t *k = base + (size_t)idx[j] * rb;
            attn_pf_step(&pc, pl);
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int32_t i = 0; i < d8; i += 8) {
                __m256 kv = load_k8(kt, k, i);
                a0 = _mm256_fmadd_ps(kv, _mm256_loadu_ps(x0 + i), a0);
                a1 = _mm256_fmadd_ps(kv, _mm256_loadu_ps(x1 + i), a1);
                a2 = _mm256_fmadd_ps(kv, _mm256_loadu_ps(x2 + i), a2);
                a3 = _mm256_fmadd_ps(kv, _mm256_loadu_ps(x3 + i), a3);
            }
            __m128 s = hsum8x4(a0, a1, a2, a3);
            if (d8 < dk) {
                /* tail of a dim that is not a multiple of 8 */
                float t[4] = {0, 0, 0, 0};
                for (int32_t i = d8; i < dk; i++) {
                    float kf = kt == KEEL_DTYPE_F16 ? f16_to_f32(k + 2 * (size_t)i)
                                                    : ((const float *)k)[i];
                    t[0] += kf * x0[i];
                    t[1] += kf * x1[i];
                    t[2] += kf * x2[i];
                    t[3] += kf * x3[i];
                }
                s = _mm_add_ps(s, _mm_loadu_ps(t));
            }
            store4(scores, r0, nr, j, s);
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

/* acc + d_k * d_q * dot(k, q) for one 32-element block: ax = |k|, the sign
 * of k moved onto the query block xb (q8_0: scale, then 32 int8) */
static inline __m256 kq_block_row(__m256 acc, __m256i ax, __m256i kv, const uint8_t *xb, float dkb)
{
    __m256i sy = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(xb + 2)), kv);
    __m256i s32 = _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1));
    return _mm256_fmadd_ps(_mm256_set1_ps(dkb * f16_to_f32(xb)), _mm256_cvtepi32_ps(s32), acc);
}

/* q8_0 / q4_0 keys against q8_0 query rows: per block the int8 dot is
 * scaled by d_k * d_q. |k| and the unpacked key are computed once per block
 * for the four rows. */
static void kq_q8q4(keel_dtype kt, const uint8_t *base, size_t rb, const int32_t *idx, int32_t n,
                    const void *const *q, int32_t R, int32_t dk, float *scores, attn_pf pf)
{
    int32_t nb = dk / QK;
    size_t kbs = kt == KEEL_DTYPE_Q8_0 ? 34 : 18;
    attn_pf_cursor pc = attn_pf_begin(pf);
    int32_t pl = attn_pf_lines(pf, (R + 3) / 4 * n);
    for (int32_t r0 = 0; r0 < R; r0 += 4) {
        const void *xv[4];
        quad_rows(q, R, r0, xv);
        const uint8_t *x0 = xv[0], *x1 = xv[1], *x2 = xv[2], *x3 = xv[3];
        int32_t nr = BASE_MIN(4, R - r0);
        for (int32_t j = 0; j < n; j++) {
            const uint8_t *k = base + (size_t)idx[j] * rb;
            attn_pf_step(&pc, pl);
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int32_t b = 0; b < nb; b++) {
                const uint8_t *kb = k + (size_t)b * kbs;
                __m256i kv = kt == KEEL_DTYPE_Q8_0 ? _mm256_loadu_si256((const __m256i *)(kb + 2))
                                                   : q4_unpack(kb + 2);
                __m256i ax = _mm256_sign_epi8(kv, kv);
                float dkb = f16_to_f32(kb);
                size_t o = (size_t)b * 34;
                a0 = kq_block_row(a0, ax, kv, x0 + o, dkb);
                a1 = kq_block_row(a1, ax, kv, x1 + o, dkb);
                a2 = kq_block_row(a2, ax, kv, x2 + o, dkb);
                a3 = kq_block_row(a3, ax, kv, x3 + o, dkb);
            }
            store4(scores, r0, nr, j, hsum8x4(a0, a1, a2, a3));
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

/* Dequantizes 64 elements [seg, seg + 64) of n quantized rows into tile
 * [n][64] (f32). */
static void dq_tile64(keel_dtype vt, const uint8_t *base, size_t rb, const int32_t *idx, int32_t n,
                      int32_t seg, float *tile, attn_pf_cursor *pc, int32_t pl)
{
    size_t bs = vt == KEEL_DTYPE_Q8_0 ? 34 : 18;
    for (int32_t j = 0; j < n; j++) {
        attn_pf_step(pc, pl);
        const uint8_t *v = base + (size_t)idx[j] * rb + (size_t)(seg / QK) * bs;
        float *o = tile + (size_t)j * 64;
        for (int b = 0; b < 2; b++) {
            const uint8_t *vb = v + (size_t)b * bs;
            __m256i q = vt == KEEL_DTYPE_Q8_0 ? _mm256_loadu_si256((const __m256i *)(vb + 2))
                                              : q4_unpack(vb + 2);
            __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
            __m256 d = _mm256_set1_ps(f16_to_f32(vb));
            float *ob = o + b * 32;
            _mm256_storeu_ps(ob, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo))));
            _mm256_storeu_ps(ob + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)))));
            _mm256_storeu_ps(ob + 16, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi))));
            _mm256_storeu_ps(ob + 24, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)))));
        }
    }
}

static void dq_tile64_fp(keel_dtype vt, const uint8_t *base, size_t rb, const int32_t *idx,
                         int32_t n, int32_t seg, float *tile, attn_pf_cursor *pc, int32_t pl)
{
    for (int32_t j = 0; j < n; j++) {
        attn_pf_step(pc, pl);
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

static void pv_q8q4(keel_dtype vt, const uint8_t *base, size_t rb, const int32_t *idx, int32_t n,
                    const float *p, const uint8_t *active, int32_t R, int32_t dv, float *const *acc,
                    attn_pf pf)
{
    if (dv % 64) {
        for (int32_t j = 0; j < n; j++)
            for (int32_t r = 0; r < R; r++)
                if (active[r]) tensor_axpy_row(vt, dv, p[r * ATTN_CB + j], base + (size_t)idx[j] * rb, acc[r]);
        return;
    }
    _Alignas(32) float tile[ATTN_CB * 64];
    attn_pf_cursor pc = attn_pf_begin(pf);
    int32_t pl = attn_pf_lines(pf, dv / 64 * n);
    for (int32_t seg = 0; seg < dv; seg += 64) {
        dq_tile64(vt, base, rb, idx, n, seg, tile, &pc, pl);
        tile_accumulate(tile, n, p, active, R, acc, seg);
    }
}

/* f16 / f32 rows through the tile: accumulators stay in registers across
 * the block instead of a load and store per cell */
static void pv_fp_tile(keel_dtype vt, const uint8_t *base, size_t rb, const int32_t *idx, int32_t n,
                       const float *p, const uint8_t *active, int32_t R, int32_t dv,
                       float *const *acc, attn_pf pf)
{
    if (dv % 64) {
        (vt == KEEL_DTYPE_F16 ? pv_f16 : pv_f32)(vt, base, rb, idx, n, p, active, R, dv, acc, pf);
        return;
    }
    _Alignas(32) float tile[ATTN_CB * 64];
    attn_pf_cursor pc = attn_pf_begin(pf);
    int32_t pl = attn_pf_lines(pf, dv / 64 * n);
    for (int32_t seg = 0; seg < dv; seg += 64) {
        dq_tile64_fp(vt, base, rb, idx, n, seg, tile, &pc, pl);
        tile_accumulate(tile, n, p, active, R, acc, seg);
    }
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
    float s = hsum8(sum);
    for (; j < n; j++) {
        x[j] = x[j] == -INFINITY ? 0.0f : expf(x[j] - m);
        s += x[j];
    }
    return s;
}

bool attn_row_avx2(float *s, int32_t n, float scale, const uint8_t *vis, float *m, float *l,
                    float *alpha)
{
    return attn_row_with(s, n, scale, vis, m, l, alpha, attn_exp_avx2);
}
