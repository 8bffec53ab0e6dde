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
 * this AMD EPYC VM with the AVX2 path forced (1 thread, 768-column q8_0
 * rows, GB/s of weights): one row after another streams (19-22 GB/s with this file's
 * kernel, 15-21 with the plain dot); two or four rows in lockstep, sharing
 * each activation load, fell to 5-8 GB/s (the hardware prefetchers lose
 * the interleaved 34-byte steps). So q8_0/q4_0 rows go one at a time with
 * the activation's scales converted once per call. q4_K stays with the
 * per-row dot: four rows in lockstep (each activation super-block loaded
 * once for the four) measured no faster at 768 columns and 3-4x slower at
 * 2048 and 8192 (1 thread, 8192 x 2048: 3.9 vs 12.1 GB/s; 768 x 2048: 3.0
 * vs 11.7), the same prefetch loss. Integer parts are exact as in the dots;
 * only the f32 summation order differs.
 */
#include "avx2_util.h"

#define MV_XS_MAX 1024 /* activation blocks whose scales are kept as f32 (32768 columns) */

/* q8_0 / q4_0 rows against a q8_0 activation, one row at a time: rows
 * taken in lockstep (2 or 4 at once, sharing each activation load) ran
 * 2.5-3x slower from DRAM on this VM (the prefetchers lost the
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

const tensor_mv_fn tensor_mv_avx2_[KEEL_DTYPE_COUNT_] = {
    [KEEL_DTYPE_Q8_0] = mv_q8_0,
    [KEEL_DTYPE_Q4_0] = mv_q4_0,
};
