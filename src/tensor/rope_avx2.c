/*
 * rope_avx2.c — AVX2/FMA RoPE rotation by a cos/sin table (rope.c builds
 * the table). NORM rotates adjacent pairs in place with fmaddsub; NEOX
 * de-interleaves the table into cos and sin vectors and rotates the halves.
 */
#include "avx2_util.h"

void tensor_rope_apply_avx2(keel_rope_type type, int32_t n_rot, const float *cs, float *x,
                            int64_t n_heads, int64_t head_dim)
{
    int32_t half = n_rot / 2;
    for (int64_t h = 0; h < n_heads; h++) {
        float *xh = x + h * head_dim;
        int32_t i = 0;
        if (type == KEEL_ROPE_NORM) {
            for (; i + 4 <= half; i += 4) { /* 4 pairs = 8 floats */
                __m256 v = _mm256_loadu_ps(xh + 2 * i), t = _mm256_loadu_ps(cs + 2 * i);
                __m256 c = _mm256_moveldup_ps(t), s = _mm256_movehdup_ps(t);
                __m256 sw = _mm256_permute_ps(v, 0xB1); /* x1 x0 x3 x2 ... */
                _mm256_storeu_ps(xh + 2 * i, _mm256_fmaddsub_ps(v, c, _mm256_mul_ps(sw, s)));
            }
            for (; i < half; i++) {
                float c = cs[2 * i], s = cs[2 * i + 1], x0 = xh[2 * i], x1 = xh[2 * i + 1];
                xh[2 * i] = x0 * c - x1 * s;
                xh[2 * i + 1] = x0 * s + x1 * c;
            }
        } else {
            for (; i + 8 <= half; i += 8) {
                __m256 t0 = _mm256_loadu_ps(cs + 2 * i), t1 = _mm256_loadu_ps(cs + 2 * i + 8);
                __m256 c = _mm256_castpd_ps(_mm256_permute4x64_pd(
                    _mm256_castps_pd(_mm256_shuffle_ps(t0, t1, _MM_SHUFFLE(2, 0, 2, 0))), 0xD8));
                __m256 s = _mm256_castpd_ps(_mm256_permute4x64_pd(
                    _mm256_castps_pd(_mm256_shuffle_ps(t0, t1, _MM_SHUFFLE(3, 1, 3, 1))), 0xD8));
                __m256 x0 = _mm256_loadu_ps(xh + i), x1 = _mm256_loadu_ps(xh + half + i);
                _mm256_storeu_ps(xh + i, _mm256_fmsub_ps(x0, c, _mm256_mul_ps(x1, s)));
                _mm256_storeu_ps(xh + half + i, _mm256_fmadd_ps(x0, s, _mm256_mul_ps(x1, c)));
            }
            for (; i < half; i++) {
                float c = cs[2 * i], s = cs[2 * i + 1], x0 = xh[i], x1 = xh[i + half];
                xh[i] = x0 * c - x1 * s;
                xh[i + half] = x0 * s + x1 * c;
            }
        }
    }
}
