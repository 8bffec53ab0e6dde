/*
 * arch_moe.c — the qwen3moe and glm4moe architectures: their
 * hyperparameters (llama.cpp's keys and defaults) and per-layer binding.
 * Both run the common attention mixer (layer_attn.c) and the MoE FFN
 * (ffn.c); nothing here runs at decode time.
 *
 * qwen3moe (Qwen3-30B-A3B, Qwen3-Coder-30B-A3B): qwen3's attention (per-head
 * q/k RMS norm before RoPE, NEOX), every layer MoE: softmax over all
 * experts, top-k, the k probabilities renormalized to sum 1 (llama.cpp's
 * qwen3moe graph hard-wires norm_w = true and reads no
 * expert_weights_scale), no shared expert. expert_feed_forward_length
 * defaults to feed_forward_length / expert_used_count, as llama.cpp.
 *
 * glm4moe (GLM-4.5 / 4.6 / 4.7, Air): block_count counts
 * nextn_predict_layers NextN (MTP) layers at the end; llama.cpp loads them
 * (TENSOR_SKIP) and runs only the first block_count - nextn layers, so keel
 * binds and shape-checks them, marks them used (no unused-tensor warning)
 * and never runs them (hp.n_layer excludes them). The first
 * leading_dense_block_count layers have a dense SwiGLU FFN, the others
 * MoE with expert_gating_func (0 or 2: sigmoid; 1: softmax), the
 * exp_probs_b selection bias (selection only), expert_weights_norm,
 * expert_weights_scale (0 or 1: none), and expert_shared_count ungated
 * shared experts of expert_feed_forward_length each. Attention: optional
 * q/k/v biases and q/k RMS norms (GLM-4.5 355B has no norms), partial NEOX
 * RoPE (rope.dimension_count), scale 1/sqrt(head_dim); the FFN's pre-norm
 * is post_attention_norm. Multimodal RoPE sections (GLM-4.6V) are refused.
 */
#include "loader.h"

#include <stdio.h>
#include <string.h>

keel_status model_moe_hparams(model_loader *l, model_w *w)
{
    model_hp *hp = &w->hp;
    keel_status st;
    bool glm = hp->arch == MODEL_ARCH_GLM4MOE;
    if (glm) {
        /* llama.cpp: n_layer_nextn < n_layer_all */
        if ((st = model_key_int(l, "nextn_predict_layers", false, 0, 0, hp->n_layer - 1, &hp->n_nextn)))
            return st;
        hp->n_layer -= hp->n_nextn;
        if ((st = model_key_int(l, "leading_dense_block_count", false, 0, 0, hp->n_layer, &hp->n_dense_lead)))
            return st;
    }
    if ((st = model_key_int(l, "expert_count", true, 0, 1, 4096, &hp->n_expert)) ||
        (st = model_key_int(l, "expert_used_count", true, 0, 1, hp->n_expert, &hp->n_expert_used)))
        return st;
    /* qwen3moe: optional, n_ff / n_expert_used without it (llama.cpp) */
    int32_t ff_def = hp->n_ff / hp->n_expert_used;
    if ((st = model_key_int(l, "expert_feed_forward_length", glm, ff_def > 0 ? ff_def : 1, 1, 1 << 20,
                            &hp->n_ff_exp)))
        return st;
    hp->router = MODEL_ROUTER_SOFTMAX;
    hp->router_norm = true;
    hp->expert_scale = 1.0f;
    if (!glm) return KEEL_OK;
    if (hp->hd_k != hp->hd_v)
        return base_err(l->err, KEEL_EFORMAT, "%s: key_length %d != value_length %d", l->arch, hp->hd_k,
                        hp->hd_v);
    int32_t n_shared = 0, gating = 0;
    float scale = 0.0f;
    if ((st = model_key_int(l, "expert_shared_count", true, 0, 0, 64, &n_shared)) ||
        (st = model_key_int(l, "expert_gating_func", false, 0, 0, 2, &gating)) ||
        (st = model_key_float_in(l, "expert_weights_scale", 0.0, 0.0, false, 1e6, &scale)))
        return st;
    hp->n_ff_shexp = hp->n_ff_exp * n_shared;
    /* 0 (none) is sigmoid for GLM-4.5; llama.cpp scales only by a factor
     * other than 0 and 1 */
    hp->router = gating == 1 ? MODEL_ROUTER_SOFTMAX : MODEL_ROUTER_SIGMOID;
    hp->expert_scale = scale == 0.0f ? 1.0f : scale;
    char key[128];
    snprintf(key, sizeof key, "%s.expert_weights_norm", l->arch);
    bool norm = false;
    if (gguf_find_key(l->g, key) >= 0 && (st = gguf_get_bool(l->g, key, &norm, l->err)) != KEEL_OK) return st;
    hp->router_norm = norm;
    /* multimodal RoPE (GLM-4.6V: sections 0 and 1 set) is not implemented */
    snprintf(key, sizeof key, "%s.rope.dimension_sections", l->arch);
    if (gguf_find_key(l->g, key) >= 0) {
        const gguf_value *sec = NULL;
        if ((st = gguf_get_arr(l->g, key, GGUF_TYPE_COUNT_, &sec, l->err)) != KEEL_OK) return st;
        int64_t s[2] = {0, 0};
        for (uint64_t i = 0; i < sec->n && i < 2; i++)
            if ((st = gguf_arr_int(sec, i, &s[i])) != KEEL_OK)
                return base_err(l->err, KEEL_EFORMAT, "key %s: element %llu is not an integer", key,
                                (unsigned long long)i);
        if (s[0] > 0 && s[1] > 0)
            return base_err(l->err, KEEL_EUNSUPPORTED,
                            "key %s: multimodal RoPE sections (%lld, %lld, ...) are not supported", key,
                            (long long)s[0], (long long)s[1]);
    }
    return KEEL_OK;
}

/* The NextN (MTP) block's own tensors (glm4moe), bound and checked only. */
static keel_status bind_nextn(model_loader *l, const model_hp *hp, int32_t i)
{
    char name[160];
    keel_status st;
    int64_t E = hp->n_embd, V = hp->n_vocab;
    model_mat m;
    const float *v;
    snprintf(name, sizeof name, "blk.%d.nextn.eh_proj.weight", i);
    if ((st = model_get_mat(l, name, true, 2 * E, E, &m))) return st;
    snprintf(name, sizeof name, "blk.%d.nextn.embed_tokens.weight", i);
    if ((st = model_get_mat(l, name, false, E, V, &m))) return st;
    snprintf(name, sizeof name, "blk.%d.nextn.shared_head_head.weight", i);
    if ((st = model_get_mat(l, name, false, E, V, &m))) return st;
    static const char *const norms[3] = {"enorm", "hnorm", "shared_head_norm"};
    for (int k = 0; k < 3; k++) {
        snprintf(name, sizeof name, "blk.%d.nextn.%s.weight", i, norms[k]);
        if ((st = model_get_vec(l, name, k < 2, E, &v))) return st;
    }
    return KEEL_OK;
}

keel_status model_moe_bind_layer(model_loader *l, const model_hp *hp, int32_t i, model_layer *L)
{
    char name[160];
    keel_status st;
    bool glm = hp->arch == MODEL_ARCH_GLM4MOE;
    int64_t E = hp->n_embd, ne = hp->n_expert, Fe = hp->n_ff_exp, Fs = hp->n_ff_shexp;
    int64_t QD = (int64_t)hp->n_head * hp->hd_k, KD = (int64_t)hp->n_head_kv * hp->hd_k;
    int64_t VD = (int64_t)hp->n_head_kv * hp->hd_v, OD = (int64_t)hp->n_head * hp->hd_v;
    L->mixer = MODEL_MIXER_ATTN;
    L->ffn = i >= hp->n_dense_lead ? MODEL_FFN_MOE : MODEL_FFN_DENSE;
    BIND_VEC(attn_norm, "attn_norm", "weight", true, E);
    /* fused attn_qkv (rows q, k, v; optional bias) or separate q, k, v
     * with optional biases: llama.cpp's create_tensor_qkv */
    model_mat qkv;
    snprintf(name, sizeof name, "blk.%d.attn_qkv.weight", i);
    if ((st = model_get_mat(l, name, false, E, QD + KD + VD, &qkv))) return st;
    if (qkv.data) {
        L->wq = model_mat_rows(&qkv, 0, QD);
        L->wk = model_mat_rows(&qkv, QD, KD);
        L->wv = model_mat_rows(&qkv, QD + KD, VD);
        BIND_VEC(bq, "attn_qkv", "bias", false, QD + KD + VD);
        if (L->bq) {
            L->bk = L->bq + QD;
            L->bv = L->bq + QD + KD;
        }
    } else {
        BIND_MAT(wq, "attn_q", true, E, QD);
        BIND_MAT(wk, "attn_k", true, E, KD);
        BIND_MAT(wv, "attn_v", true, E, VD);
        BIND_VEC(bq, "attn_q", "bias", false, QD);
        BIND_VEC(bk, "attn_k", "bias", false, KD);
        BIND_VEC(bv, "attn_v", "bias", false, VD);
    }
    BIND_MAT(wo, "attn_output", true, OD, E);
    BIND_VEC(q_norm, "attn_q_norm", "weight", !glm, hp->hd_k);
    BIND_VEC(k_norm, "attn_k_norm", "weight", !glm, hp->hd_k);
    if (glm) {
        BIND_VEC(ffn_norm, "post_attention_norm", "weight", true, E);
    } else {
        BIND_VEC(ffn_norm, "ffn_norm", "weight", true, E);
    }
    if (L->ffn == MODEL_FFN_DENSE) {
        BIND_MAT(ffn_gate, "ffn_gate", true, E, hp->n_ff);
        BIND_MAT(ffn_up, "ffn_up", true, E, hp->n_ff);
        BIND_MAT(ffn_down, "ffn_down", true, hp->n_ff, E);
    } else {
        BIND_MAT(gate_inp, "ffn_gate_inp", true, E, ne);
        if (glm) {
            BIND_VEC(exp_probs_b, "exp_probs_b", "bias", true, ne);
        }
        BIND_EXP(gate_exps, "ffn_gate_exps", true, E, Fe);
        BIND_EXP(up_exps, "ffn_up_exps", true, E, Fe);
        BIND_EXP(down_exps, "ffn_down_exps", true, Fe, E);
        if (Fs > 0) { /* glm4moe: ungated shared experts */
            BIND_MAT(gate_shexp, "ffn_gate_shexp", true, E, Fs);
            BIND_MAT(up_shexp, "ffn_up_shexp", true, E, Fs);
            BIND_MAT(down_shexp, "ffn_down_shexp", true, Fs, E);
        }
    }
    if (i >= hp->n_layer) return bind_nextn(l, hp, i);
    return KEEL_OK;
}
