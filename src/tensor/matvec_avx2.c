/*
 * matvec_avx2.c — AVX2/FMA matrix-vector kernels over ranges of weight
 * rows (tensor_mv_avx2_, used by tensor_matvec and tensor_matvec_multi; the
 * per-row dots of dot_avx2.c serve the rest: dot tiles, tails, other
 * dtypes).
 *
 * Decode's products have short rows (hundreds to a few thousand columns),
 * so what a single-row dot pays per row and per block for the activation
 * (its scale's conversion, the row's setup and horizontal sum) is a large
 * part of the work. How rows are walked decides the DRAM rate, measured on
 * AMD Zen 4 with the AVX2 path (1 thread, 768-column q8_0 rows, GB/s of
 * weights): one row after another streams (19-22 GB/s with this file's
 * kernel, 15-21 with the plain dot); two or four rows in lockstep, sharing
 * each activation load, fell to 5-8 GB/s (the hardware prefetchers lose
 * the interleaved 34-byte steps). So q8_0/q4_0 rows go one at a time with
 * the activation's scales converted once per call, while q4_K, whose rows
 * advance 144 bytes per super-block, goes four rows at a time (each
 * activation super-block loaded once for the four: 17 vs 11 GB/s). Integer
 * parts are exact as in the dots; only the f32 summation order differs.
 */
#include "avx2_util.h"

#define MV_XS_MAX 1024 /* activation blocks whose scales are kept as f32 (32768 columns) */

static inline __m128 hsum4x8(__m256 a0, __m256 a1, __m256 a2, __m256 a3)
{
    __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* q8_0 / q4_0 rows against a q8_0 activation, one row at a time: rows
 * taken in lockstep (2 or 4 at once, sharing each activation load) ran
 * 2.5-3x slower from DRAM on AMD Zen 4 (the prefetchers lost the
 * interleaved 34-byte steps of several rows), so the gain here is the
 * activation's scales converted once per matvec and four accumulators per
 * row. VALUES gives a block's 32 signed values; |w| with w's sign moved onto
 * x (the dot's sign trick). */
#define MV_SYM(NAME, WBYTES, VALUES, SCALAR_DOT)                                                   \
    static void NAME(int64_t nr, int64_t n, const uint8_t *W, size_t rb, const void *xv, float *y) \
    {                                                                                              \
        const uint8_t *x = xv;                                                                     \
        int64_t nb = n / QK;                                                                       \
        if (nb > MV_XS_MAX) {                                                                      \
            for (int64_t r = 0; r < nr; r++) y[r] = SCALAR_DOT(n, W + (size_t)r * rb, x);          \
            return;                                                                                \
        }                                                                                          \
        float dx[MV_XS_MAX];                                                                       \
        for (int64_t b = 0; b < nb; b++) dx[b] = f16_load(x + (size_t)b * Q8_0_BYTES);            \
        for (int64_t r = 0; r < nr; r++) {                                                         \
            const uint8_t *w = W + (size_t)r * rb;                                                 \
            __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),          \
                           _mm256_setzero_ps()};                                                   \
            int64_t b = 0;                                                                         \
            for (; b + 4 <= nb; b += 4) {                                                          \
                _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++)                                \
                {                                                                                  \
                    const uint8_t *wb = w + (size_t)(b + k) * (WBYTES);                            \
                    __m256i wq = VALUES(wb), xq = loadu_256(x + (size_t)(b + k) * Q8_0_BYTES + 2); \
                    __m256i p = dot_us8_i32(_mm256_sign_epi8(wq, wq), _mm256_sign_epi8(xq, wq));   \
                    a[k] = _mm256_fmadd_ps(_mm256_set1_ps(f16_load(wb) * dx[b + k]),               \
                                           _mm256_cvtepi32_ps(p), a[k]);                           \
                }                                                                                  \
            }                                                                                      \
            for (; b < nb; b++) {                                                                  \
                const uint8_t *wb = w + (size_t)b * (WBYTES);                                      \
                __m256i wq = VALUES(wb), xq = loadu_256(x + (size_t)b * Q8_0_BYTES + 2);           \
                __m256i p = dot_us8_i32(_mm256_sign_epi8(wq, wq), _mm256_sign_epi8(xq, wq));       \
                a[0] = _mm256_fmadd_ps(_mm256_set1_ps(f16_load(wb) * dx[b]), _mm256_cvtepi32_ps(p), a[0]); \
            }                                                                                      \
            y[r] = hsum_ps(_mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3])));   \
        }                                                                                          \
    }

static float dot_q8_0_row(int64_t n, const void *w, const void *x)
{
    return tensor_dot_avx2_[KEEL_DTYPE_Q8_0](n, w, x);
}
static float dot_q4_0_row(int64_t n, const void *w, const void *x)
{
    return tensor_dot_avx2_[KEEL_DTYPE_Q4_0](n, w, x);
}

MV_SYM(mv_q8_0, Q8_0_BYTES, q8_0_block_values, dot_q8_0_row)
MV_SYM(mv_q4_0, Q4_0_BYTES, q4_0_values, dot_q4_0_row)

/* q4_K rows against a q8_K activation: as dot_q4_K (the 6-bit scales
 * unpacked with word operations and applied inside madd, the mins folded
 * through the activation's bsums), with each activation super-block loaded
 * once for the four rows and its scale and block sums shared. */
static void mv_q4_K(int64_t nr, int64_t n, const uint8_t *W, size_t rb, const void *xv, float *y)
{
    const uint8_t *x = xv;
    tensor_dot_fn dot = tensor_dot_avx2_[KEEL_DTYPE_Q4_K];
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    int64_t nb = n / QK_K, r = 0;
    for (; r + 4 <= nr; r += 4) {
        const uint8_t *w = W + (size_t)r * rb;
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        __m128 accm[4] = {_mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps()};
        for (int64_t i = 0; i < nb; i++) {
            const uint8_t *xb = x + (size_t)i * Q8_K_BYTES, *xq = xb + Q8_K_QS;
            float dx = rd_f32(xb);
            __m256i bs = loadu_256(xb + Q8_K_BSUMS);
            __m128i pairs = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
            __m256i xv8[8];
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++) xv8[c] = loadu_256(xq + 32 * c);
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                const uint8_t *b = w + (size_t)k * rb + (size_t)i * Q4_K_BYTES;
                __m256i sm16 = kq_scales_mins_epi16(b + 4);
                __m256i sc = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(sm16));
                accm[k] = _mm_fmadd_ps(_mm_set1_ps(dx * f16_load(b + 2)),
                                       _mm_cvtepi32_ps(_mm_madd_epi16(_mm256_extracti128_si256(sm16, 1), pairs)),
                                       accm[k]);
                const uint8_t *qs = b + 16;
                __m256i sumi = _mm256_setzero_si256();
#pragma GCC unroll 4
                for (int c = 0; c < 4; c++) {
                    __m256i q = loadu_256(qs + 32 * c);
                    __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                    __m256i p0 = _mm256_maddubs_epi16(lo, xv8[2 * c]);
                    __m256i p1 = _mm256_maddubs_epi16(hi, xv8[2 * c + 1]);
                    p0 = _mm256_madd_epi16(p0, _mm256_shuffle_epi8(sc, bcast16_ctrl(2 * c)));
                    p1 = _mm256_madd_epi16(p1, _mm256_shuffle_epi8(sc, bcast16_ctrl(2 * c + 1)));
                    sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
                }
                acc[k] = _mm256_fmadd_ps(_mm256_set1_ps(dx * f16_load(b)), _mm256_cvtepi32_ps(sumi), acc[k]);
            }
        }
        __m128 s = hsum4x8(acc[0], acc[1], acc[2], acc[3]);
        /* the mins: four lanes per row, summed across rows' lanes */
        __m128 m01 = _mm_hadd_ps(accm[0], accm[1]), m23 = _mm_hadd_ps(accm[2], accm[3]);
        _mm_storeu_ps(y + r, _mm_sub_ps(s, _mm_hadd_ps(m01, m23)));
    }
    for (; r < nr; r++) y[r] = dot(n, W + (size_t)r * rb, x);
}

const tensor_mv_fn tensor_mv_avx2_[KEEL_DTYPE_COUNT_] = {
    [KEEL_DTYPE_Q4_K] = mv_q4_K,
    [KEEL_DTYPE_Q8_0] = mv_q8_0,
    [KEEL_DTYPE_Q4_0] = mv_q4_0,
};
