/*
 * arch_nemotron_h.c — Nemotron-H (NVIDIA Nemotron Nano v2): every block is
 * attn_norm + one mixer + residual, the mixer one of
 *
 *   Mamba2 (layer_mamba2.c)       head_count_kv[il] == 0 and feed_forward_length[il] == 0
 *   attention without RoPE        feed_forward_length[il] == 0 (head_count_kv[il] > 0)
 *   ReLU^2 MLP (up, down; no gate) feed_forward_length[il] > 0
 *
 * as llama.cpp decides it (is_recr iff both are 0; else attention iff no
 * FFN). The kind comes from the per-layer arrays feed_forward_length and
 * attention.head_count_kv (a scalar applies to every layer), each element
 * validated (model_key_int_layer). An MLP block is a model_layer without a
 * mixer (MODEL_MIXER_NONE) whose FFN pre-norm is the block's attn_norm.
 *
 * keel keeps one attention shape per model: every attention layer must
 * have the same head_count and head_count_kv (a file mixing them is
 * refused, naming the layers); MLP widths may differ per layer (each
 * layer's matrices carry theirs; hp.n_ff is the widest).
 */
#include "loader.h"

#include <stdio.h>
#include <string.h>

typedef enum nh_kind { NH_MAMBA2, NH_ATTN, NH_MLP } nh_kind;

/* Layer il's kind and its per-layer counts. */
static keel_status layer_kind(model_loader *l, int32_t il, nh_kind *kind, int32_t *n_head, int32_t *n_kv,
                              int32_t *n_ff)
{
    keel_status st;
    /* llama.cpp's defaults: no FFN, as many kv heads as heads */
    if ((st = model_key_int_layer(l, "feed_forward_length", false, 0, 0, 1 << 20, il, n_ff)) ||
        (st = model_key_int_layer(l, "attention.head_count", true, 0, 0, 4096, il, n_head)) ||
        (st = model_key_int_layer(l, "attention.head_count_kv", false, *n_head, 0, 4096, il, n_kv)))
        return st;
    *kind = *n_kv == 0 && *n_ff == 0 ? NH_MAMBA2 : *n_ff == 0 ? NH_ATTN : NH_MLP;
    return KEEL_OK;
}

keel_status arch_nemotron_h_counts(model_loader *l, model_hp *hp)
{
    int32_t attn_layer = -1;
    hp->n_ff = hp->n_head = hp->n_head_kv = 0;
    for (int32_t il = 0; il < hp->n_layer; il++) {
        nh_kind kind;
        int32_t nh, nkv, nff;
        keel_status st = layer_kind(l, il, &kind, &nh, &nkv, &nff);
        if (st != KEEL_OK) return st;
        if (kind == NH_MLP) hp->n_ff = BASE_MAX(hp->n_ff, nff);
        if (kind != NH_ATTN) continue;
        if (nh < 1 || nh % nkv)
            return base_err(l->err, KEEL_EFORMAT,
                            "%s: attention layer %d has head_count %d, not a positive multiple of "
                            "head_count_kv %d",
                            l->arch, il, nh, nkv);
        if (attn_layer >= 0 && (nh != hp->n_head || nkv != hp->n_head_kv))
            return base_err(l->err, KEEL_EUNSUPPORTED,
                            "%s: attention layers %d (%d heads, %d kv heads) and %d (%d, %d) differ; "
                            "keel needs one attention shape per model",
                            l->arch, attn_layer, hp->n_head, hp->n_head_kv, il, nh, nkv);
        attn_layer = il;
        hp->n_head = nh;
        hp->n_head_kv = nkv;
    }
    return KEEL_OK;
}

keel_status arch_nemotron_h_hparams(model_loader *l, model_hp *hp)
{
    keel_status st;
    float ln_eps = 0.0f;
    int32_t nextn = 0, n_expert = 0;
    /* llama.cpp requires it (the MTP head's final LayerNorm), unused here */
    char key[128];
    snprintf(key, sizeof key, "%s.attention.layer_norm_epsilon", l->arch);
    if (gguf_find_key(l->g, key) < 0) return base_err(l->err, KEEL_ENOENT, "missing key %s", key);
    if ((st = model_key_float_in(l, "attention.layer_norm_epsilon", 0.0, 0.0, true, 1.0, &ln_eps)) ||
        (st = model_key_int(l, "nextn_predict_layers", false, 0, 0, hp->n_layer, &nextn)) ||
        (st = model_key_int(l, "expert_count", false, 0, 0, 4096, &n_expert)))
        return st;
    if (nextn > 0 || n_expert > 0)
        return base_err(l->err, KEEL_EUNSUPPORTED,
                        "%s: nextn_predict_layers %d, expert_count %d: MTP blocks and experts "
                        "(nemotron_h_moe) are not implemented",
                        l->arch, nextn, n_expert);
    if (hp->n_head > 0 && hp->hd_k != hp->hd_v)
        return base_err(l->err, KEEL_EFORMAT, "%s: key_length %d != value_length %d", l->arch, hp->hd_k,
                        hp->hd_v);
    hp->ffn_act = MODEL_ACT_RELU2;
    hp->n_recurrent = 0;
    for (int32_t il = 0; il < hp->n_layer; il++) {
        nh_kind kind;
        int32_t nh, nkv, nff;
        if ((st = layer_kind(l, il, &kind, &nh, &nkv, &nff)) != KEEL_OK) return st;
        hp->n_recurrent += kind == NH_MAMBA2;
    }
    return KEEL_OK;
}

keel_status arch_nemotron_h_layer(model_loader *l, const model_hp *hp, int32_t i, model_layer *L)
{
    char name[160];
    keel_status st;
    nh_kind kind;
    int32_t nh, nkv, nff;
    if ((st = layer_kind(l, i, &kind, &nh, &nkv, &nff)) != KEEL_OK) return st;
    int64_t E = hp->n_embd;
    if (kind == NH_MLP) {
        /* the block's one norm is the FFN's pre-norm */
        L->mixer = MODEL_MIXER_NONE;
        L->ffn = MODEL_FFN_DENSE;
        BIND_VEC(ffn_norm, "attn_norm", "weight", true, E);
        BIND_MAT(ffn_up, "ffn_up", true, E, nff);
        BIND_MAT(ffn_down, "ffn_down", true, nff, E);
        BIND_VEC(ffn_up_b, "ffn_up", "bias", false, nff);
        BIND_VEC(ffn_down_b, "ffn_down", "bias", false, E);
        return KEEL_OK;
    }
    L->ffn = MODEL_FFN_NONE;
    BIND_VEC(attn_norm, "attn_norm", "weight", true, E);
    if (kind == NH_ATTN) {
        int64_t QD = (int64_t)hp->n_head * hp->hd_k, KD = (int64_t)hp->n_head_kv * hp->hd_k;
        int64_t VD = (int64_t)hp->n_head_kv * hp->hd_v;
        L->mixer = MODEL_MIXER_ATTN;
        BIND_MAT(wq, "attn_q", true, E, QD);
        BIND_MAT(wk, "attn_k", true, E, KD);
        BIND_MAT(wv, "attn_v", true, E, VD);
        BIND_MAT(wo, "attn_output", true, QD, E);
        BIND_VEC(bq, "attn_q", "bias", false, QD);
        BIND_VEC(bk, "attn_k", "bias", false, KD);
        BIND_VEC(bv, "attn_v", "bias", false, VD);
        BIND_VEC(bo, "attn_output", "bias", false, E);
        return KEEL_OK;
    }
    /* Mamba2, as the mamba2 architecture binds it */
    L->mixer = MODEL_MIXER_MAMBA2;
    return model_bind_mamba2(l, hp, i, L);
}
