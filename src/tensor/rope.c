/*
 * rope.c — rotary position embedding with llama.cpp/ggml semantics
 * (linear scaling, per-dimension freq_factors, YaRN), angles in double.
 *
 * For dimension pair i of n_rot/2:
 *   theta_i  = freq_base^(-2i/n_rot) / freq_factors[i]          (extrapolated)
 *   YaRN ramp (ext_factor != 0): corr dims [lo, hi] from ggml's
 *     corr_dim(beta) = n_rot * ln(n_ctx_orig / (2 pi beta)) / (2 ln freq_base),
 *     lo = max(0, floor(corr_dim(beta_fast))), hi = min(n_rot - 1, ceil(corr_dim(beta_slow)))
 *     (computed in f32 exactly as ggml does, since they are floored/ceiled),
 *     ramp_i = 1 - clamp((i - lo) / max(0.001, hi - lo), 0, 1), mix_i = ramp_i * ext_factor
 *   rate_i   = theta_i * (freq_scale * (1 - mix_i) + mix_i)
 *   mscale   = attn_factor * (ext_factor != 0 ? 1 + 0.1 ln(1 / freq_scale) : 1)
 * and a token at position p is rotated by p * rate_i with magnitude mscale.
 * Because the angle is linear in p, rotating by rate_i * delta with
 * magnitude 1 moves a rotated row from p to p + delta exactly.
 */
#include "tensor_impl.h"

#define ROPE_MAX_ROT 1024 /* n_rot limit of the convenience functions (stack tables) */

keel_rope keel_rope_default(void)
{
    keel_rope r;
    memset(&r, 0, sizeof r);
    r.type = KEEL_ROPE_NORM;
    r.n_rot = 0;
    r.freq_base = 10000.0f;
    r.freq_scale = 1.0f;
    r.ext_factor = 0.0f;
    r.attn_factor = 1.0f;
    r.beta_fast = 32.0f;
    r.beta_slow = 1.0f;
    r.n_ctx_orig = 0;
    r.freq_factors = NULL;
    return r;
}

static float rope_corr_dim(int n_rot, int n_ctx_orig, float beta, float base)
{
    return (float)n_rot * logf((float)n_ctx_orig / (beta * 2.0f * (float)M_PI)) /
           (2.0f * logf(base));
}

keel_status tensor_rope_check(const keel_rope *r)
{
    if (!r) return KEEL_EINVAL;
    if (r->type != KEEL_ROPE_NORM && r->type != KEEL_ROPE_NEOX && r->type != KEEL_ROPE_NONE)
        return KEEL_EINVAL;
    if (r->n_rot <= 0 || r->n_rot % 2 != 0) return KEEL_EINVAL;
    if (!(r->freq_base > 0.0f) || !isfinite(r->freq_base)) return KEEL_EINVAL;
    if (!(r->freq_scale > 0.0f) || !isfinite(r->freq_scale)) return KEEL_EINVAL;
    if (!isfinite(r->ext_factor) || !(r->attn_factor > 0.0f) || !isfinite(r->attn_factor))
        return KEEL_EINVAL;
    if (r->ext_factor != 0.0f &&
        (r->n_ctx_orig <= 0 || !(r->beta_fast > 0.0f) || !(r->beta_slow > 0.0f) ||
         !isfinite(r->beta_fast) || !isfinite(r->beta_slow) || r->freq_base == 1.0f))
        return KEEL_EINVAL;
    if (r->freq_factors)
        for (int i = 0; i < r->n_rot / 2; i++)
            if (!(r->freq_factors[i] > 0.0f) || !isfinite(r->freq_factors[i])) return KEEL_EINVAL;
    return KEEL_OK;
}

keel_status tensor_rope_rates(const keel_rope *r, double *rate, float *mscale)
{
    if (!r || !rate || !mscale) return KEEL_EINVAL;
    keel_status st = tensor_rope_check(r);
    if (st != KEEL_OK) return st;
    bool yarn = r->ext_factor != 0.0f;
    float lo = 0.0f, hi = 0.0f;
    if (yarn) {
        float start = floorf(rope_corr_dim(r->n_rot, r->n_ctx_orig, r->beta_fast, r->freq_base));
        float end = ceilf(rope_corr_dim(r->n_rot, r->n_ctx_orig, r->beta_slow, r->freq_base));
        lo = start > 0.0f ? start : 0.0f;
        hi = end < (float)(r->n_rot - 1) ? end : (float)(r->n_rot - 1);
    }
    int half = r->n_rot / 2;
    double base = r->freq_base, fs = r->freq_scale;
    for (int i = 0; i < half; i++) {
        double theta = pow(base, -2.0 * (double)i / (double)r->n_rot);
        if (r->freq_factors) theta /= (double)r->freq_factors[i];
        double mix = 0.0;
        if (yarn) {
            double den = (double)hi - (double)lo;
            if (den < 0.001) den = 0.001;
            double y = ((double)i - (double)lo) / den;
            y = y < 0.0 ? 0.0 : y > 1.0 ? 1.0 : y;
            mix = (1.0 - y) * (double)r->ext_factor;
        }
        rate[i] = theta * (fs * (1.0 - mix) + mix);
        if (!isfinite(rate[i])) return KEEL_EINVAL;
    }
    double m = r->attn_factor;
    if (yarn) m *= 1.0 + 0.1 * log(1.0 / fs);
    *mscale = (float)m;
    return KEEL_OK;
}

void tensor_rope_cos_sin(const double *rate, int32_t n_rot, double pos, float m, float *cs)
{
    for (int32_t i = 0; i < n_rot / 2; i++) {
        double s, c;
        sincos(pos * rate[i], &s, &c);
        cs[2 * i] = (float)(c * (double)m);
        cs[2 * i + 1] = (float)(s * (double)m);
    }
}

static void rope_apply_scalar(keel_rope_type type, int32_t n_rot, const float *cs, float *x,
                              int64_t n_heads, int64_t head_dim)
{
    int32_t half = n_rot / 2;
    for (int64_t h = 0; h < n_heads; h++) {
        float *xh = x + h * head_dim;
        for (int32_t i = 0; i < half; i++) {
            float c = cs[2 * i], s = cs[2 * i + 1];
            int64_t i0 = type == KEEL_ROPE_NEOX ? i : 2 * i;
            int64_t i1 = type == KEEL_ROPE_NEOX ? i + half : 2 * i + 1;
            float x0 = xh[i0], x1 = xh[i1];
            xh[i0] = x0 * c - x1 * s;
            xh[i1] = x0 * s + x1 * c;
        }
    }
}

void tensor_rope_apply(keel_rope_type type, int32_t n_rot, const float *cs, float *x,
                       int64_t n_heads, int64_t head_dim)
{
    if (type != KEEL_ROPE_NORM && type != KEEL_ROPE_NEOX) return;
    uint64_t t0 = tensor_prof_begin();
    if (tensor_use_avx2())
        tensor_rope_apply_avx2(type, n_rot, cs, x, n_heads, head_dim);
    else
        rope_apply_scalar(type, n_rot, cs, x, n_heads, head_dim);
    if (t0) tensor_prof_end(t0, TENSOR_PROF_ROPE, KEEL_DTYPE_F32, n_heads, head_dim, 0.0);
}

static keel_status rope_rotate(const keel_rope *r, float *x, int64_t n_heads, int64_t head_dim,
                               double pos, bool magnitude)
{
    if (!r) return KEEL_EINVAL;
    if (r->type == KEEL_ROPE_NONE) return KEEL_OK;
    if (r->n_rot > ROPE_MAX_ROT || head_dim <= 0 || r->n_rot > head_dim || n_heads < 0)
        return KEEL_EINVAL;
    if (n_heads > 0 && !x) return KEEL_EINVAL;
    double rate[ROPE_MAX_ROT / 2];
    float cs[ROPE_MAX_ROT];
    float mscale;
    keel_status st = tensor_rope_rates(r, rate, &mscale);
    if (st != KEEL_OK) return st;
    tensor_rope_cos_sin(rate, r->n_rot, pos, magnitude ? mscale : 1.0f, cs);
    tensor_rope_apply(r->type, r->n_rot, cs, x, n_heads, head_dim);
    return KEEL_OK;
}

keel_status tensor_rope(const keel_rope *r, float *x, int64_t n_heads, int64_t head_dim,
                        int64_t pos)
{
    return rope_rotate(r, x, n_heads, head_dim, (double)pos, true);
}

keel_status tensor_rope_delta(const keel_rope *r, float *x, int64_t n_heads, int64_t head_dim,
                              int64_t delta)
{
    return rope_rotate(r, x, n_heads, head_dim, (double)delta, false);
}
