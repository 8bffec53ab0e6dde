/*
 * ops.c — norms, softmax, activations and top-k (scalar references and
 * the dispatch to ops_avx2.c). Scalar sums of squares accumulate in double;
 * the AVX2 paths in f32 lanes, so the two agree to ~1e-6 relative.
 * Nothing here allocates.
 */
#include "tensor_impl.h"

static double sumsq_scalar(const float *x, int64_t n)
{
    double s = 0.0;
    for (int64_t i = 0; i < n; i++)
        s += (double)x[i] * (double)x[i];
    return s;
}

static void rmsnorm_impl(float *y, const float *x, const float *w, int64_t n, float eps)
{
    double ss = tensor_use_avx2() ? (double)tensor_sumsq_f32_avx2(x, n) : sumsq_scalar(x, n);
    float scale = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
    if (w) {
        for (int64_t i = 0; i < n; i++)
            y[i] = x[i] * scale * w[i];
    } else if (tensor_use_avx2()) {
        if (y != x) memmove(y, x, (size_t)n * sizeof(float));
        tensor_scale_f32_avx2(y, scale, n);
    } else {
        for (int64_t i = 0; i < n; i++)
            y[i] = x[i] * scale;
    }
}

void tensor_rmsnorm(float *y, const float *x, const float *w, int64_t n, float eps)
{
    if (n <= 0) return;
    uint64_t t0 = tensor_prof_begin();
    rmsnorm_impl(y, x, w, n, eps);
    if (t0) tensor_prof_end(t0, TENSOR_PROF_NORM, KEEL_DTYPE_F32, 1, n, 0.0);
}

void tensor_layernorm(float *y, const float *x, const float *w, const float *b, int64_t n,
                      float eps)
{
    if (n <= 0) return;
    double mean = 0.0;
    for (int64_t i = 0; i < n; i++)
        mean += x[i];
    mean /= (double)n;
    double var = 0.0;
    for (int64_t i = 0; i < n; i++)
        var += ((double)x[i] - mean) * ((double)x[i] - mean);
    var /= (double)n;
    float inv = (float)(1.0 / sqrt(var + (double)eps));
    float m = (float)mean;
    for (int64_t i = 0; i < n; i++) {
        float v = (x[i] - m) * inv;
        if (w) v *= w[i];
        if (b) v += b[i];
        y[i] = v;
    }
}

void tensor_l2norm(float *x, int64_t n, float eps)
{
    if (n <= 0) return;
    double ss = tensor_use_avx2() ? (double)tensor_sumsq_f32_avx2(x, n) : sumsq_scalar(x, n);
    double norm = sqrt(ss);
    if (norm < (double)eps) norm = (double)eps;
    float scale = (float)(1.0 / norm);
    tensor_scale_f32(x, scale, n);
}

void tensor_softmax(float *x, int64_t n)
{
    if (n <= 0) return;
    float max = -INFINITY;
    for (int64_t i = 0; i < n; i++)
        max = x[i] > max ? x[i] : max;
    if (max == -INFINITY) { /* every entry -inf: no mass anywhere */
        memset(x, 0, (size_t)n * sizeof(float));
        return;
    }
    double sum;
    if (tensor_use_avx2()) {
        sum = tensor_exp_sub_avx2(x, n, max);
    } else {
        sum = 0.0;
        for (int64_t i = 0; i < n; i++) {
            x[i] = expf(x[i] - max);
            sum += x[i];
        }
    }
    tensor_scale_f32(x, (float)(1.0 / sum), n);
}

/* x * sigmoid(x) and friends in forms that stay accurate at both tails. */
static float sigmoidf_(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_C 0.044715f

/* 0.5 x (1 + tanh(z)) == x * sigmoid(2z): no cancellation for x << 0. */
static float gelu_tanh_(float x)
{
    float z = GELU_K * (x + GELU_C * x * x * x);
    return x * sigmoidf_(2.0f * z);
}

void tensor_silu(float *x, int64_t n)
{
    if (tensor_use_avx2()) {
        tensor_silu_avx2(x, n);
        return;
    }
    for (int64_t i = 0; i < n; i++)
        x[i] = x[i] * sigmoidf_(x[i]);
}

void tensor_sigmoid(float *x, int64_t n)
{
    if (tensor_use_avx2()) {
        tensor_sigmoid_avx2(x, n);
        return;
    }
    for (int64_t i = 0; i < n; i++)
        x[i] = sigmoidf_(x[i]);
}

void tensor_gelu(float *x, int64_t n)
{
    if (tensor_use_avx2()) {
        tensor_gelu_avx2(x, n);
        return;
    }
    for (int64_t i = 0; i < n; i++)
        x[i] = gelu_tanh_(x[i]);
}

void tensor_gelu_erf(float *x, int64_t n)
{
    /* 1 + erf(t) == erfc(-t), without the cancellation for x << 0 */
    for (int64_t i = 0; i < n; i++)
        x[i] = 0.5f * x[i] * erfcf(-x[i] * 0.70710678118654752f);
}

void tensor_softplus(float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        x[i] = (v > 0.0f ? v : 0.0f) + log1pf(expf(-fabsf(v)));
    }
}

void tensor_swiglu(float *gate, const float *up, int64_t n)
{
    uint64_t t0 = tensor_prof_begin();
    if (tensor_use_avx2()) {
        tensor_swiglu_avx2(gate, up, n);
    } else {
        for (int64_t i = 0; i < n; i++)
            gate[i] = gate[i] * sigmoidf_(gate[i]) * up[i];
    }
    if (t0) tensor_prof_end(t0, TENSOR_PROF_ACT, KEEL_DTYPE_F32, 1, n, 0.0);
}

void tensor_geglu(float *gate, const float *up, int64_t n)
{
    uint64_t t0 = tensor_prof_begin();
    if (tensor_use_avx2()) {
        tensor_geglu_avx2(gate, up, n);
    } else {
        for (int64_t i = 0; i < n; i++)
            gate[i] = gelu_tanh_(gate[i]) * up[i];
    }
    if (t0) tensor_prof_end(t0, TENSOR_PROF_ACT, KEEL_DTYPE_F32, 1, n, 0.0);
}

void tensor_softcap(float *x, int64_t n, float cap)
{
    if (tensor_use_avx2()) {
        tensor_softcap_avx2(x, n, cap);
        return;
    }
    float inv = 1.0f / cap;
    for (int64_t i = 0; i < n; i++)
        x[i] = cap * tanhf(x[i] * inv);
}

/* ---- top-k ------------------------------------------------------------------- */

/* a ranks before b: larger value, ties to the lower index; NaN lowest. */
static bool topk_before(const float *x, int32_t a, int32_t b)
{
    float va = x[a], vb = x[b];
    if (isnan(va)) va = -INFINITY;
    if (isnan(vb)) vb = -INFINITY;
    return va > vb || (va == vb && a < b);
}

/* Min-heap on "rank": the root is the worst of the kept k. */
static void topk_sift_down(const float *x, int32_t *h, int64_t k, int64_t i)
{
    for (;;) {
        int64_t l = 2 * i + 1, r = l + 1, w = i;
        if (l < k && topk_before(x, h[w], h[l])) w = l;
        if (r < k && topk_before(x, h[w], h[r])) w = r;
        if (w == i) return;
        int32_t t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

void tensor_topk(const float *x, int64_t n, int64_t k, int32_t *idx)
{
    if (k <= 0 || n <= 0) return;
    if (k > n) k = n;
    for (int64_t i = 0; i < k; i++)
        idx[i] = (int32_t)i;
    for (int64_t i = k / 2; i-- > 0;)
        topk_sift_down(x, idx, k, i);
    for (int64_t i = k; i < n; i++) {
        if (topk_before(x, (int32_t)i, idx[0])) {
            idx[0] = (int32_t)i;
            topk_sift_down(x, idx, k, 0);
        }
    }
    /* heap sort: repeatedly move the worst to the end -> best first */
    for (int64_t end = k - 1; end > 0; end--) {
        int32_t t = idx[0];
        idx[0] = idx[end];
        idx[end] = t;
        topk_sift_down(x, idx, end, 0);
    }
}
