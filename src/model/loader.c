/*
 * loader.c — the loader's reading of a GGUF file for the architectures'
 * binding (model.c, arch_*.c): hyperparameter keys with their defaults and
 * ranges, 2-D and 3-D weights checked for shape and dtype and kept as
 * views into the mapped file, 1-D tensors converted to f32 in the owned
 * block (counted in a first pass, filled in the second) and checked finite.
 * Every failure names the key or tensor.
 */
#include "loader.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

static bool weight_dtype_ok(keel_dtype t)
{
    switch (t) {
    case KEEL_DTYPE_F32:
    case KEEL_DTYPE_F16:
    case KEEL_DTYPE_BF16:
    case KEEL_DTYPE_Q8_0:
    case KEEL_DTYPE_Q4_0:
    case KEEL_DTYPE_Q4_1:
    case KEEL_DTYPE_Q5_0:
    case KEEL_DTYPE_Q5_1:
    case KEEL_DTYPE_Q4_K:
    case KEEL_DTYPE_Q5_K:
    case KEEL_DTYPE_Q6_K:
        return true;
    default:
        return false;
    }
}

/* ---- keys ---------------------------------------------------------------- */

/* Marks t as bound to the model (for the unused-tensor warning). */
static void mark_used(model_loader *l, const gguf_tensor *t)
{
    if (l->used && !l->counting) l->used[t - gguf_tensor_at(l->g, 0)] = 1;
}

keel_status model_key_int(model_loader *l, const char *suffix, bool required, int64_t def, int64_t lo,
                           int64_t hi, int32_t *out)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", l->arch, suffix);
    int64_t v = def;
    if (gguf_find_key(l->g, key) >= 0) {
        keel_status st = gguf_get_int(l->g, key, &v, l->err);
        if (st != KEEL_OK) return st;
    } else if (required) {
        return base_err(l->err, KEEL_ENOENT, "missing key %s", key);
    }
    if (v < lo || v > hi)
        return base_err(l->err, KEEL_EFORMAT, "key %s = %lld out of range [%lld, %lld]", key,
                        (long long)v, (long long)lo, (long long)hi);
    *out = (int32_t)v;
    return KEEL_OK;
}

keel_status model_key_int_layer(model_loader *l, const char *suffix, bool required, int64_t def,
                                int64_t lo, int64_t hi, int32_t il, int32_t *out)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", l->arch, suffix);
    int64_t kid = gguf_find_key(l->g, key);
    if (kid < 0 || gguf_value_at(l->g, kid)->type != GGUF_TYPE_ARRAY)
        return model_key_int(l, suffix, required, def, lo, hi, out);
    const gguf_value *arr = gguf_value_at(l->g, kid);
    int32_t n_layer = l->n_layer;
    if (arr->n != (uint64_t)n_layer)
        return base_err(l->err, KEEL_EFORMAT, "key %s: array of %llu elements, expected one per layer (%s.block_count %d)",
                        key, (unsigned long long)arr->n, l->arch, n_layer);
    int64_t v = 0;
    keel_status st = gguf_arr_int(arr, (uint64_t)il, &v);
    if (st == KEEL_EINVAL)
        return base_err(l->err, KEEL_EFORMAT, "key %s: array of %s, expected integers", key,
                        gguf_type_name(arr->arr_type));
    if (st != KEEL_OK)
        return base_err(l->err, KEEL_EFORMAT, "key %s[%d]: not representable (%s)", key, il, keel_strerror(st));
    if (v < lo || v > hi)
        return base_err(l->err, KEEL_EFORMAT, "key %s[%d] = %lld out of range [%lld, %lld]", key, il,
                        (long long)v, (long long)lo, (long long)hi);
    *out = (int32_t)v;
    return KEEL_OK;
}

keel_status model_key_float(model_loader *l, const char *suffix, double def, float *out)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", l->arch, suffix);
    double v = def;
    if (gguf_find_key(l->g, key) >= 0) {
        keel_status st = gguf_get_float(l->g, key, &v, l->err);
        if (st != KEEL_OK) return st;
    }
    if (!(fabs(v) <= FLT_MAX)) /* NaN, Inf, or an f64 beyond f32 (checked before narrowing) */
        return base_err(l->err, KEEL_EFORMAT, "key %s = %g: not a finite f32 number", key, v);
    *out = (float)v;
    return KEEL_OK;
}

/* key_float, then lo < v <= hi (lo_open) or lo <= v <= hi. */
keel_status model_key_float_in(model_loader *l, const char *suffix, double def, double lo, bool lo_open,
                                double hi, float *out)
{
    keel_status st = model_key_float(l, suffix, def, out);
    if (st != KEEL_OK) return st;
    double v = *out;
    if (lo_open ? v > lo : v >= lo) {
        if (v <= hi) return KEEL_OK;
    }
    return base_err(l->err, KEEL_EFORMAT, "key %s.%s = %g: outside %c%g, %g]", l->arch, suffix, v,
                    lo_open ? '(' : '[', lo, hi);
}

/* ---- tensors ------------------------------------------------------------- */

/* A tensor that is not in the file: an error only when required. */
static keel_status absent(model_loader *l, const char *name, bool required)
{
    return required ? base_err(l->err, KEEL_ENOENT, "missing tensor %s", name) : KEEL_OK;
}

/* A weight of n_exp (0: a plain matrix) matrices of n_rows x n_cols:
 * shape, dtype, then the view. */
static keel_status get_weight(model_loader *l, const char *name, bool required, int64_t n_cols,
                              int64_t n_rows, int64_t n_exp, model_mat *out)
{
    memset(out, 0, sizeof *out);
    const gguf_tensor *t = gguf_find_tensor(l->g, name);
    if (!t) return absent(l, name, required);
    bool ok = t->ne[0] == n_cols && t->ne[1] == n_rows &&
              (n_exp > 0 ? t->n_dims == 3 && t->ne[2] == n_exp : t->n_dims == 2);
    if (!ok && n_exp > 0)
        return base_err(l->err, KEEL_EFORMAT,
                        "tensor %s: shape [%lld, %lld, %lld] (%u dims), expected [%lld, %lld, %lld]",
                        name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                        t->n_dims, (long long)n_cols, (long long)n_rows, (long long)n_exp);
    if (!ok)
        return base_err(l->err, KEEL_EFORMAT,
                        "tensor %s: shape [%lld, %lld, %lld] (%u dims), expected [%lld, %lld]",
                        name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                        t->n_dims, (long long)n_cols, (long long)n_rows);
    if (!weight_dtype_ok(t->dtype))
        return base_err(l->err, KEEL_EUNSUPPORTED, "tensor %s: dtype %s (id %d) is not supported",
                        name, keel_dtype_name(t->dtype) ? keel_dtype_name(t->dtype) : "unknown",
                        (int)t->dtype);
    mark_used(l, t);
    out->data = t->data;
    out->dtype = t->dtype;
    out->n_cols = n_cols;
    out->n_rows = n_rows;
    out->nbytes = t->nbytes;
    out->n_expert = n_exp;
    out->expert_bytes = n_exp > 0 ? t->nbytes / (size_t)n_exp : 0;
    return KEEL_OK;
}

keel_status model_get_mat(model_loader *l, const char *name, bool required, int64_t n_cols,
                          int64_t n_rows, model_mat *out)
{
    return get_weight(l, name, required, n_cols, n_rows, 0, out);
}

/* Converts tensor t of n elements (already shape-checked) to f32 in the
 * owned block (only counted in the counting pass); non-finite values are
 * refused where they are. */
static keel_status vec_convert(model_loader *l, const char *name, const gguf_tensor *t, int64_t n, const float **out)
{
    if (t->dtype != KEEL_DTYPE_F32 && t->dtype != KEEL_DTYPE_F16 && t->dtype != KEEL_DTYPE_BF16)
        return base_err(l->err, KEEL_EUNSUPPORTED, "tensor %s: dtype %s not supported for a vector",
                        name, keel_dtype_name(t->dtype) ? keel_dtype_name(t->dtype) : "unknown");
    size_t nn = (size_t)n;
    if (l->counting) {
        l->f32_cap += (nn + 15) & ~(size_t)15;
        return KEEL_OK;
    }
    mark_used(l, t);
    float *dst = l->f32 + l->f32_used;
    l->f32_used += (nn + 15) & ~(size_t)15;
    keel_status st = tensor_dequantize_row(t->dtype, t->data, dst, n);
    if (st != KEEL_OK) return base_err(l->err, st, "tensor %s: cannot convert", name);
    /* A NaN or Inf in a norm or bias reaches every logit; say where it is
     * now rather than as an invalid sampler argument later. */
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(dst[i]))
            return base_err(l->err, KEEL_EFORMAT,
                            "tensor %s: element %lld is %s: the weights are invalid", name,
                            (long long)i, isnan(dst[i]) ? "NaN" : dst[i] > 0 ? "+Inf" : "-Inf");
    *out = dst;
    return KEEL_OK;
}

/* A 1-D tensor of n elements, converted to f32 in the owned block. */
keel_status model_get_vec(model_loader *l, const char *name, bool required, int64_t n,
                           const float **out)
{
    *out = NULL;
    const gguf_tensor *t = gguf_find_tensor(l->g, name);
    if (!t) return absent(l, name, required);
    int64_t count = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
    if (t->ne[0] != n || count != n)
        return base_err(l->err, KEEL_EFORMAT, "tensor %s: %lld elements (ne0 %lld), expected %lld",
                        name, (long long)count, (long long)t->ne[0], (long long)n);
    return vec_convert(l, name, t, n, out);
}

/* A tensor of any shape with n elements in all (1-D or 2-D f32/f16/bf16:
 * conv weights [channels][kernel], per-expert biases [n_expert][rows],
 * grouped norms), converted like get_vec. ne0, when > 0, must match. */
keel_status model_get_vec_n(model_loader *l, const char *name, bool required, int64_t ne0, int64_t n,
                             const float **out)
{
    *out = NULL;
    const gguf_tensor *t = gguf_find_tensor(l->g, name);
    if (!t) return absent(l, name, required);
    int64_t count = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
    if (count != n || (ne0 > 0 && t->ne[0] != ne0))
        return base_err(l->err, KEEL_EFORMAT,
                        "tensor %s: shape [%lld, %lld, %lld], expected %lld elements (ne0 %lld)", name,
                        (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                        (long long)n, (long long)(ne0 > 0 ? ne0 : t->ne[0]));
    return vec_convert(l, name, t, n, out);
}

/* Expert weights: n_expert matrices of n_rows x n_cols, ne = [n_cols,
 * n_rows, n_expert]. */
keel_status model_get_mat3(model_loader *l, const char *name, bool required, int64_t n_cols,
                            int64_t n_rows, int64_t n_exp, model_mat *out)
{
    return get_weight(l, name, required, n_cols, n_rows, n_exp, out);
}

/* Rows [row0, row0 + n_rows) of a fused matrix (phi3's attn_qkv, ffn_up):
 * a view, the rows being contiguous. */
model_mat model_mat_rows(const model_mat *m, int64_t row0, int64_t n_rows)
{
    model_mat r = *m;
    size_t rb = tensor_row_bytes(m->dtype, m->n_cols);
    r.data = (const uint8_t *)m->data + (size_t)row0 * rb;
    r.n_rows = n_rows;
    r.nbytes = (size_t)n_rows * rb;
    return r;
}

/* A RoPE frequency-factor tensor of n_rot / 2 elements, each > 0 (the
 * angle rate is divided by it). */
keel_status model_get_rope_factors(model_loader *l, const char *name, int32_t n_rot, const float **out)
{
    keel_status st = model_get_vec(l, name, false, n_rot / 2, out);
    if (st != KEEL_OK) return st;
    for (int32_t i = 0; *out && i < n_rot / 2; i++)
        if (!((*out)[i] > 0.0f))
            return base_err(l->err, KEEL_EFORMAT, "tensor %s: element %d is %g, must be > 0", name, i,
                            (double)(*out)[i]);
    return KEEL_OK;
}
