/*
 * attn_kernels.h — inner kernels of attention over the cache (attn.c):
 * scores of R query rows against n K rows, and V accumulation of n rows
 * into R accumulators, for one KV head. Each K / V row is read once for all
 * R rows (every query head of the GQA group and every token of the block).
 * Scalar versions (attn.c) cover every dtype through tensor_vec_dot /
 * tensor_axpy_row; AVX2 versions (attn_avx2.c) cover f32, f16, q8_0 and
 * q4_0 rows. Rows are at base + idx[j] * row_bytes.
 */
#ifndef KEEL_ATTN_KERNELS_H
#define KEEL_ATTN_KERNELS_H

#include "memory.h"

#define ATTN_CB 32 /* cells per block: scores and p are [R][ATTN_CB] */

/* scores[r * ATTN_CB + j] = dot(K row idx[j], q[r]); q[r] in the K dtype's
 * vec_dot type. */
typedef void (*attn_kq_fn)(keel_dtype kt, const uint8_t *base, size_t row_bytes,
                           const int32_t *idx, int32_t n, const void *const *q, int32_t R,
                           int32_t dk, float *scores);

/* acc[r][0..dv) += sum_j p[r * ATTN_CB + j] * V row idx[j], for rows r with
 * active[r]. */
typedef void (*attn_pv_fn)(keel_dtype vt, const uint8_t *base, size_t row_bytes,
                           const int32_t *idx, int32_t n, const float *p, const uint8_t *active,
                           int32_t R, int32_t dv, float *const *acc);

/* x[j] <- exp(x[j] - m) for j < n (-inf -> 0); returns the sum. */
typedef float (*attn_exp_fn)(float *x, int32_t n, float m);

/* AVX2 kernels, or NULL when the dtype has no AVX2 path (attn_avx2.c). */
attn_kq_fn attn_kq_avx2(keel_dtype kt);
attn_pv_fn attn_pv_avx2(keel_dtype vt);
float attn_exp_avx2(float *x, int32_t n, float m);

#endif
