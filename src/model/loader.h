/*
 * loader.h — private interface between model.c (reading a GGUF file into a
 * model_w) and the per-architecture binding files (arch_*.c): the loader's
 * state and its key and tensor readers (loader.c). Each reader names the
 * key or tensor in its error. Binding runs twice: a counting pass (shapes,
 * dtypes, the f32 floats the 1-D tensors need; nothing written) and a
 * filling pass (views set, vectors converted, tensors marked as used).
 */
#ifndef KEEL_MODEL_LOADER_H
#define KEEL_MODEL_LOADER_H

#include "model.h"

typedef struct model_loader {
    const gguf *g;
    const char *arch;
    char *err;
    /* owned f32 block for 1-D tensors: counted, then filled */
    float *f32;
    size_t f32_cap, f32_used; /* floats */
    bool counting;
    uint8_t *used; /* [n_tensors] 1 once bound (filling pass), or NULL */
    int32_t n_layer; /* block_count once read (per-layer keys), else 0 */
} model_loader;

/* "<arch>.<suffix>" as an integer in [lo, hi]; def when absent (an error
 * when required). */
keel_status model_key_int(model_loader *l, const char *suffix, bool required, int64_t def, int64_t lo,
                          int64_t hi, int32_t *out);
/* Layer il's value of a per-layer key (llama.cpp's get_key_or_arr): a
 * scalar applies to every layer (model_key_int), an array must hold one
 * integer per layer (l->n_layer). KEEL_EFORMAT names the key, and the
 * element with its index when out of [lo, hi]. */
keel_status model_key_int_layer(model_loader *l, const char *suffix, bool required, int64_t def,
                                int64_t lo, int64_t hi, int32_t il, int32_t *out);
/* "<arch>.<suffix>" as a finite f32; def when absent. */
keel_status model_key_float(model_loader *l, const char *suffix, double def, float *out);
/* model_key_float, then lo < v <= hi (lo_open) or lo <= v <= hi. */
keel_status model_key_float_in(model_loader *l, const char *suffix, double def, double lo, bool lo_open,
                               double hi, float *out);
/* A 2-D weight of n_rows x n_cols (ne = [n_cols, n_rows]); zeroed when
 * absent and not required. */
keel_status model_get_mat(model_loader *l, const char *name, bool required, int64_t n_cols,
                          int64_t n_rows, model_mat *out);
/* A 1-D tensor of n elements, converted to f32 in the owned block. */
keel_status model_get_vec(model_loader *l, const char *name, bool required, int64_t n, const float **out);
/* A tensor of any shape with n elements (ne0, when > 0, must match),
 * converted like model_get_vec. */
keel_status model_get_vec_n(model_loader *l, const char *name, bool required, int64_t ne0, int64_t n,
                            const float **out);
/* Expert weights: n_exp matrices of n_rows x n_cols, ne = [n_cols, n_rows, n_exp]. */
keel_status model_get_mat3(model_loader *l, const char *name, bool required, int64_t n_cols,
                           int64_t n_rows, int64_t n_exp, model_mat *out);
/* Rows [row0, row0 + n_rows) of a fused matrix: a view. */
model_mat model_mat_rows(const model_mat *m, int64_t row0, int64_t n_rows);
/* A RoPE frequency-factor tensor of n_rot / 2 elements, each > 0. */
keel_status model_get_rope_factors(model_loader *l, const char *name, int32_t n_rot, const float **out);

/* arch_moe.c: qwen3moe and glm4moe. model_moe_hparams reads their keys
 * (after the common ones); model_moe_bind_layer binds layer i (i <
 * n_layer, or a NextN layer i < n_layer + n_nextn: bound, shape-checked
 * and marked used, never run; L may then be scratch). */
keel_status model_moe_hparams(model_loader *l, model_w *w);
keel_status model_moe_bind_layer(model_loader *l, const model_hp *hp, int32_t i, model_layer *L);

/* ---- architectures bound in files of their own ------------------------- */

/* A Mamba2 mixer's tensors of layer i (mamba2, nemotron_h's Mamba2 layers). */
keel_status model_bind_mamba2(model_loader *l, const model_hp *hp, int32_t i, model_layer *L);

/* nemotron_h (arch_nemotron_h.c): the per-layer counts (n_ff the widest
 * MLP, the attention layers' one n_head / n_head_kv, 0 without attention)
 * in place of the scalar keys; the rest of its keys after the common ones
 * and the SSM keys; layer i's kind and tensors. */
keel_status arch_nemotron_h_counts(model_loader *l, model_hp *hp);
keel_status arch_nemotron_h_hparams(model_loader *l, model_hp *hp);
keel_status arch_nemotron_h_layer(model_loader *l, const model_hp *hp, int32_t i, model_layer *L);
/* arch_deepseek2.c: the multi-head latent attention family (deepseek2,
 * deepseek32): its keys, YaRN's attention scale, the experts; then each
 * layer's attention tensors. */
keel_status model_mla_hparams(model_loader *l, model_w *w);
keel_status model_mla_bind_layer(model_loader *l, const model_hp *hp, model_layer *L, int32_t i);

/*
 * Per-layer binding shorthands: they expect in scope `model_loader *l`,
 * `model_layer *L`, `int32_t i` (the layer), `char name[160]`,
 * `keel_status st` (BIND_EXP also `const model_hp *hp`), and return st
 * from the enclosing function on failure.
 */
#define BIND_MAT(field, nm, req, cols, rows)                                                       \
    snprintf(name, sizeof name, "blk.%d." nm ".weight", i);                                        \
    if ((st = model_get_mat(l, name, req, cols, rows, &L->field)) != KEEL_OK) return st
#define BIND_VEC(field, nm, suffix, req, n)                                                        \
    snprintf(name, sizeof name, "blk.%d." nm "." suffix, i);                                       \
    if ((st = model_get_vec(l, name, req, n, &L->field)) != KEEL_OK) return st
#define BIND_VECN(field, nm, req, ne0, n)                                                          \
    snprintf(name, sizeof name, "blk.%d." nm, i);                                                  \
    if ((st = model_get_vec_n(l, name, req, ne0, n, &L->field)) != KEEL_OK) return st
#define BIND_EXP(field, nm, req, cols, rows)                                                       \
    snprintf(name, sizeof name, "blk.%d." nm ".weight", i);                                        \
    if ((st = model_get_mat3(l, name, req, cols, rows, hp->n_expert, &L->field)) != KEEL_OK) return st

/* ---- per-architecture files (arch_*.c) ----------------------------------- */

/* lfm2 (arch_lfm2.c): shortconv.l_cache, the per-layer head_count_kv (0: a
 * conv layer; the attention layers share one count), the optional sliding
 * window; sets n_head_kv, n_recurrent, ssm_conv_kernel. */
keel_status model_lfm2_hparams(model_loader *l, model_w *w);
/* Binds layer i of lfm2 into L (mixer, FFN and their tensors). */
keel_status model_lfm2_bind_layer(model_loader *l, const model_w *w, int32_t i, model_layer *L);

#endif
