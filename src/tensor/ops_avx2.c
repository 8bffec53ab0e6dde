/*
 * ops_avx2.c — AVX2/FMA activations and the softmax exponential.
 *
 * exp256: Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, a degree-7
 * Taylor polynomial (truncation < 6e-9 relative) and 2^n applied as two
 * factors so that results from 2^-149 to overflow come out right; about
 * 1-2 ulp from expf. Inputs are clamped to [-104, 88.8] (exp is 0 / inf
 * beyond), so -inf gives 0.
 */
#include "avx2_util.h"

static inline __m256 exp256(__m256 x)
{
    const __m256 log2e = _mm256_set1_ps(1.44269504088896341f);
    const __m256 ln2_hi = _mm256_set1_ps(0.693359375f);
    const __m256 ln2_lo = _mm256_set1_ps(-2.12194440e-4f);
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-104.0f)), _mm256_set1_ps(88.8f));
    __m256 n =
        _mm256_round_ps(_mm256_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, ln2_hi, x);
    r = _mm256_fnmadd_ps(n, ln2_lo, r);
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i ni = _mm256_cvtps_epi32(n);
    __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
    __m256 s1 =
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, _mm256_set1_epi32(127)), 23));
    __m256 s2 =
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, _mm256_set1_epi32(127)), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

static inline __m256 sigmoid256(__m256 x)
{
    const __m256 one = _mm256_set1_ps(1.0f);
    return _mm256_div_ps(one, _mm256_add_ps(one, exp256(_mm256_sub_ps(_mm256_setzero_ps(), x))));
}

/* tanh: odd Taylor series to u^11 below |u| = 0.25 (error < 3e-11), else
 * 1 - 2 / (e^{2|u|} + 1) with the sign restored. */
static inline __m256 tanh256(__m256 u)
{
    const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
    __m256 a = _mm256_andnot_ps(sign, u);
    __m256 big = _mm256_sub_ps(
        one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(exp256(_mm256_add_ps(a, a)), one)));
    __m256 u2 = _mm256_mul_ps(a, a);
    __m256 p = _mm256_set1_ps(-1382.0f / 155925.0f);
    p = _mm256_fmadd_ps(p, u2, _mm256_set1_ps(62.0f / 2835.0f));
    p = _mm256_fmadd_ps(p, u2, _mm256_set1_ps(-17.0f / 315.0f));
    p = _mm256_fmadd_ps(p, u2, _mm256_set1_ps(2.0f / 15.0f));
    p = _mm256_fmadd_ps(p, u2, _mm256_set1_ps(-1.0f / 3.0f));
    __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(p, u2), a, a);
    __m256 r = _mm256_blendv_ps(big, small, _mm256_cmp_ps(a, _mm256_set1_ps(0.25f), _CMP_LT_OQ));
    return _mm256_or_ps(r, _mm256_and_ps(u, sign));
}

#define GELU_K 0.7978845608028654f
#define GELU_C 0.044715f

static inline __m256 gelu256(__m256 x)
{
    __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
    __m256 z =
        _mm256_mul_ps(_mm256_set1_ps(GELU_K), _mm256_fmadd_ps(_mm256_set1_ps(GELU_C), x3, x));
    return _mm256_mul_ps(x, sigmoid256(_mm256_add_ps(z, z)));
}

/* Loads/stores the tail (n % 8 elements) through a small buffer so that
 * every element goes through the same vector code. */
#define TAIL_APPLY(ptr, n, i, expr_of_v)                                                           \
    do {                                                                                           \
        if ((i) < (n)) {                                                                           \
            float buf_[8] = {0};                                                                   \
            int64_t r_ = (n) - (i);                                                                \
            memcpy(buf_, (ptr) + (i), (size_t)r_ * sizeof(float));                                 \
            __m256 v = _mm256_loadu_ps(buf_);                                                      \
            _mm256_storeu_ps(buf_, (expr_of_v));                                                   \
            memcpy((ptr) + (i), buf_, (size_t)r_ * sizeof(float));                                 \
        }                                                                                          \
    } while (0)

float tensor_exp_sub_avx2(float *x, int64_t n, float sub)
{
    __m256 vs = _mm256_set1_ps(sub), acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), vs));
        _mm256_storeu_ps(x + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    float s = hsum_ps(acc);
    for (; i < n; i++) {
        float buf[8] = {x[i] - sub};
        _mm256_storeu_ps(buf, exp256(_mm256_loadu_ps(buf)));
        x[i] = buf[0];
        s += buf[0];
    }
    return s;
}

void tensor_silu_avx2(float *x, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        _mm256_storeu_ps(x + i, _mm256_mul_ps(v, sigmoid256(v)));
    }
    TAIL_APPLY(x, n, i, _mm256_mul_ps(v, sigmoid256(v)));
}

void tensor_sigmoid_avx2(float *x, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, sigmoid256(_mm256_loadu_ps(x + i)));
    TAIL_APPLY(x, n, i, sigmoid256(v));
}

void tensor_gelu_avx2(float *x, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, gelu256(_mm256_loadu_ps(x + i)));
    TAIL_APPLY(x, n, i, gelu256(v));
}

void tensor_swiglu_avx2(float *gate, const float *up, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 g = _mm256_loadu_ps(gate + i);
        _mm256_storeu_ps(gate + i,
                         _mm256_mul_ps(_mm256_mul_ps(g, sigmoid256(g)), _mm256_loadu_ps(up + i)));
    }
    for (; i < n; i++) {
        float buf[8] = {gate[i]};
        __m256 g = _mm256_loadu_ps(buf);
        _mm256_storeu_ps(buf, _mm256_mul_ps(g, sigmoid256(g)));
        gate[i] = buf[0] * up[i];
    }
}

void tensor_geglu_avx2(float *gate, const float *up, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(
            gate + i, _mm256_mul_ps(gelu256(_mm256_loadu_ps(gate + i)), _mm256_loadu_ps(up + i)));
    for (; i < n; i++) {
        float buf[8] = {gate[i]};
        _mm256_storeu_ps(buf, gelu256(_mm256_loadu_ps(buf)));
        gate[i] = buf[0] * up[i];
    }
}

void tensor_softcap_avx2(float *x, int64_t n, float cap)
{
    __m256 vc = _mm256_set1_ps(cap), vi = _mm256_set1_ps(1.0f / cap);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i,
                         _mm256_mul_ps(vc, tanh256(_mm256_mul_ps(_mm256_loadu_ps(x + i), vi))));
    TAIL_APPLY(x, n, i, _mm256_mul_ps(vc, tanh256(_mm256_mul_ps(v, vi))));
}
