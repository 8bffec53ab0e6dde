/*
 * wht_avx2.c — AVX2/FMA fast Walsh-Hadamard transform for n = 8..4096.
 *
 * Up to 128 floats (16 ymm registers) the whole transform stays in
 * registers: stages 1, 2, 4 inside each 8-float vector as one permute and
 * one FMA with a +-1 vector (fma(v, +-1, perm(v)) is exactly a + b or
 * a - b, one rounding, as the scalar code), then the cross-vector stages
 * as plain add/sub, then 1/sqrt(n) (times the post signs) on the way out.
 * Larger n: each 128-float chunk that way (unscaled), then the remaining
 * stages in radix-4 passes over memory (L1-resident), the last pass
 * scaling. Same operations in the same order as wht.c's scalar loops, so
 * the results are bit-identical.
 */
#include "avx2_util.h"

#define WHT_ALWAYS_INLINE static inline __attribute__((always_inline))

WHT_ALWAYS_INLINE void wht_vec_stages(__m256 *v, int nv)
{
    const __m256 s1 = _mm256_setr_ps(1, -1, 1, -1, 1, -1, 1, -1);
    const __m256 s2 = _mm256_setr_ps(1, 1, -1, -1, 1, 1, -1, -1);
    const __m256 s4 = _mm256_setr_ps(1, 1, 1, 1, -1, -1, -1, -1);
#pragma GCC unroll 16
    for (int k = 0; k < nv; k++) {
        __m256 a = v[k];
        a = _mm256_fmadd_ps(a, s1, _mm256_permute_ps(a, 0xB1));
        a = _mm256_fmadd_ps(a, s2, _mm256_permute_ps(a, 0x4E));
        a = _mm256_fmadd_ps(a, s4, _mm256_permute2f128_ps(a, a, 0x01));
        v[k] = a;
    }
}

/* One cross-vector stage with vector stride h over nv vectors. */
WHT_ALWAYS_INLINE void wht_cross_stage(__m256 *v, int nv, int h)
{
    /* pairs (j, j + h) for j in [g, g + h), g = 0, 2h, 4h, ... (affine
     * indices: gcc ignores the unroll pragma on a k / h, k % h loop at -O0,
     * an error under -Werror) */
#pragma GCC unroll 8
    for (int g = 0; g < nv; g += 2 * h) {
#pragma GCC unroll 8
        for (int j = g; j < g + h; j++) {
            __m256 a = v[j], b = v[j + h];
            v[j] = _mm256_add_ps(a, b);
            v[j + h] = _mm256_sub_ps(a, b);
        }
    }
}

/* The in-register transform of nv vectors (nv = 1..16, a power of two):
 * load (times pre signs), all stages, store times mul (or the per-element
 * post vector times the scale). */
WHT_ALWAYS_INLINE void wht_regs(float *x, int nv, const float *pre, const float *post, float scale,
                                bool do_scale)
{
    __m256 v[16];
#pragma GCC unroll 16
    for (int k = 0; k < nv; k++) {
        v[k] = _mm256_loadu_ps(x + 8 * k);
        if (pre) v[k] = _mm256_mul_ps(v[k], _mm256_loadu_ps(pre + 8 * k));
    }
    wht_vec_stages(v, nv);
    if (nv >= 2) wht_cross_stage(v, nv, 1);
    if (nv >= 4) wht_cross_stage(v, nv, 2);
    if (nv >= 8) wht_cross_stage(v, nv, 4);
    if (nv >= 16) wht_cross_stage(v, nv, 8);
    __m256 vs = _mm256_set1_ps(scale);
#pragma GCC unroll 16
    for (int k = 0; k < nv; k++) {
        __m256 a = v[k];
        if (do_scale) {
            __m256 m = post ? _mm256_mul_ps(vs, _mm256_loadu_ps(post + 8 * k)) : vs;
            a = _mm256_mul_ps(a, m);
        }
        _mm256_storeu_ps(x + 8 * k, a);
    }
}

static void wht_n8(float *x, const float *pre, const float *post, float s)
{
    wht_regs(x, 1, pre, post, s, true);
}
static void wht_n16(float *x, const float *pre, const float *post, float s)
{
    wht_regs(x, 2, pre, post, s, true);
}
static void wht_n32(float *x, const float *pre, const float *post, float s)
{
    wht_regs(x, 4, pre, post, s, true);
}
static void wht_n64(float *x, const float *pre, const float *post, float s)
{
    wht_regs(x, 8, pre, post, s, true);
}
static void wht_n128(float *x, const float *pre, const float *post, float s)
{
    wht_regs(x, 16, pre, post, s, true);
}
static void wht_chunk128_unscaled(float *x, const float *pre)
{
    wht_regs(x, 16, pre, NULL, 1.0f, false);
}

/* Stages h and 2h (in floats, h >= 8) over n floats; scales when last. */
static void wht_pass4(float *x, int64_t n, int64_t h, bool last, float scale, const float *post)
{
    __m256 vs = _mm256_set1_ps(scale);
    for (int64_t g = 0; g < n; g += 4 * h) {
        for (int64_t j = g; j < g + h; j += 8) {
            __m256 a = _mm256_loadu_ps(x + j), b = _mm256_loadu_ps(x + j + h);
            __m256 c = _mm256_loadu_ps(x + j + 2 * h), d = _mm256_loadu_ps(x + j + 3 * h);
            __m256 a1 = _mm256_add_ps(a, b), b1 = _mm256_sub_ps(a, b);
            __m256 c1 = _mm256_add_ps(c, d), d1 = _mm256_sub_ps(c, d);
            a = _mm256_add_ps(a1, c1);
            c = _mm256_sub_ps(a1, c1);
            b = _mm256_add_ps(b1, d1);
            d = _mm256_sub_ps(b1, d1);
            if (last) {
                __m256 ma = vs, mb = vs, mc = vs, md = vs;
                if (post) {
                    ma = _mm256_mul_ps(vs, _mm256_loadu_ps(post + j));
                    mb = _mm256_mul_ps(vs, _mm256_loadu_ps(post + j + h));
                    mc = _mm256_mul_ps(vs, _mm256_loadu_ps(post + j + 2 * h));
                    md = _mm256_mul_ps(vs, _mm256_loadu_ps(post + j + 3 * h));
                }
                a = _mm256_mul_ps(a, ma);
                b = _mm256_mul_ps(b, mb);
                c = _mm256_mul_ps(c, mc);
                d = _mm256_mul_ps(d, md);
            }
            _mm256_storeu_ps(x + j, a);
            _mm256_storeu_ps(x + j + h, b);
            _mm256_storeu_ps(x + j + 2 * h, c);
            _mm256_storeu_ps(x + j + 3 * h, d);
        }
    }
}

/* Stage h alone (radix 2). */
static void wht_pass2(float *x, int64_t n, int64_t h, bool last, float scale, const float *post)
{
    __m256 vs = _mm256_set1_ps(scale);
    for (int64_t g = 0; g < n; g += 2 * h) {
        for (int64_t j = g; j < g + h; j += 8) {
            __m256 a = _mm256_loadu_ps(x + j), b = _mm256_loadu_ps(x + j + h);
            __m256 s = _mm256_add_ps(a, b), t = _mm256_sub_ps(a, b);
            if (last) {
                __m256 ma = vs, mb = vs;
                if (post) {
                    ma = _mm256_mul_ps(vs, _mm256_loadu_ps(post + j));
                    mb = _mm256_mul_ps(vs, _mm256_loadu_ps(post + j + h));
                }
                s = _mm256_mul_ps(s, ma);
                t = _mm256_mul_ps(t, mb);
            }
            _mm256_storeu_ps(x + j, s);
            _mm256_storeu_ps(x + j + h, t);
        }
    }
}

void tensor_wht_avx2(float *x, int64_t n, const float *pre, const float *post)
{
    float s = (float)(1.0 / sqrt((double)n));
    switch (n) {
    case 8:
        wht_n8(x, pre, post, s);
        return;
    case 16:
        wht_n16(x, pre, post, s);
        return;
    case 32:
        wht_n32(x, pre, post, s);
        return;
    case 64:
        wht_n64(x, pre, post, s);
        return;
    case 128:
        wht_n128(x, pre, post, s);
        return;
    default:
        break;
    }
    for (int64_t c = 0; c < n; c += 128)
        wht_chunk128_unscaled(x + c, pre ? pre + c : NULL);
    int64_t h = 128;
    int stages = 0;
    for (int64_t t = h; t < n; t *= 2)
        stages++;
    if (stages & 1) {
        wht_pass2(x, n, h, stages == 1, s, post);
        h *= 2;
        stages--;
    }
    while (stages > 0) {
        wht_pass4(x, n, h, stages == 2, s, post);
        h *= 4;
        stages -= 2;
    }
}
