/*
 * arch_lfm2.c — LiquidAI LFM2: hyperparameters and per-layer binding
 * (llama.cpp's LLM_ARCH_LFM2 keys and tensor names).
 *
 * A layer is a gated short convolution (layer_shortconv.c) when its entry
 * of the per-layer array attention.head_count_kv is 0, else GQA attention
 * with per-head q/k RMS norm and NEOX RoPE; every layer has attn_norm (the
 * "operator norm"), ffn_norm and a dense SwiGLU FFN. The final norm is
 * stored as token_embd_norm (llama.cpp's LLM_TENSOR_OUTPUT_NORM_LFM2: the
 * converter's name for the model's last norm, applied after the layers;
 * model.c binds it in place of output_norm). The output matrix is tied to
 * token_embd unless output.weight is present. shortconv.l_cache (the conv's
 * taps, > 1) and attention.layer_norm_rms_epsilon are required, as
 * llama.cpp reads them; attention.sliding_window > 0 makes every attention
 * layer sliding (llama.cpp's LLAMA_SWA_TYPE_STANDARD for lfm2).
 *
 * Invariant: the attention layers share one KV head count (keel's memory
 * layers and attention take it from hp->n_head_kv); a file whose non-zero
 * entries differ is refused, naming the two layers.
 */
#include "loader.h"

#include <stdio.h>

keel_status model_lfm2_hparams(model_loader *l, model_w *w)
{
    model_hp *hp = &w->hp;
    keel_status st;
    char key[128];
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", l->arch);
    if (gguf_find_key(l->g, key) < 0) return base_err(l->err, KEEL_ENOENT, "missing key %s", key);
    if ((st = model_key_int(l, "shortconv.l_cache", true, 0, 2, 64, &hp->ssm_conv_kernel)) != KEEL_OK) return st;
    if ((st = model_key_int(l, "attention.sliding_window", false, 0, 0, 1 << 24, &hp->n_swa)) != KEEL_OK)
        return st;
    if (hp->hd_k != hp->hd_v)
        return base_err(l->err, KEEL_EFORMAT, "%s: key_length %d != value_length %d", l->arch, hp->hd_k,
                        hp->hd_v);
    int32_t kv_attn = 0, first = -1;
    hp->n_recurrent = 0;
    for (int32_t i = 0; i < hp->n_layer; i++) {
        int32_t kv = 0;
        if ((st = model_key_int_layer(l, "attention.head_count_kv", false, hp->n_head, 0, hp->n_head, i,
                                      &kv)) != KEEL_OK)
            return st;
        if (kv == 0) {
            hp->n_recurrent++;
            continue;
        }
        if (hp->n_head % kv)
            return base_err(l->err, KEEL_EFORMAT,
                            "%s.attention.head_count %d is not a multiple of head_count_kv %d (layer %d)",
                            l->arch, hp->n_head, kv, i);
        if (first >= 0 && kv != kv_attn)
            return base_err(l->err, KEEL_EUNSUPPORTED,
                            "%s.attention.head_count_kv: layer %d has %d KV heads, layer %d has %d (the "
                            "attention layers must share one count)",
                            l->arch, first, kv_attn, i, kv);
        if (first < 0) first = i;
        kv_attn = kv;
    }
    hp->n_head_kv = first >= 0 ? kv_attn : hp->n_head;
    return KEEL_OK;
}

keel_status model_lfm2_bind_layer(model_loader *l, const model_w *w, int32_t i, model_layer *L)
{
    const model_hp *hp = &w->hp;
    char name[160];
    keel_status st;
    int64_t E = hp->n_embd, K = hp->ssm_conv_kernel;
    int64_t QD = (int64_t)hp->n_head * hp->hd_k, KD = (int64_t)hp->n_head_kv * hp->hd_k;
    int64_t OD = (int64_t)hp->n_head * hp->hd_v;
    int32_t kv = 0;
    if ((st = model_key_int_layer(l, "attention.head_count_kv", false, hp->n_head, 0, hp->n_head, i, &kv)) != KEEL_OK)
        return st;
    L->mixer = kv == 0 ? MODEL_MIXER_SHORTCONV : MODEL_MIXER_ATTN;
    L->ffn = MODEL_FFN_DENSE;
    BIND_VEC(attn_norm, "attn_norm", "weight", true, E);
    if (L->mixer == MODEL_MIXER_ATTN) {
        BIND_MAT(wq, "attn_q", true, E, QD);
        BIND_MAT(wk, "attn_k", true, E, KD);
        BIND_MAT(wv, "attn_v", true, E, KD);
        BIND_MAT(wo, "attn_output", true, OD, E);
        BIND_VEC(q_norm, "attn_q_norm", "weight", true, hp->hd_k);
        BIND_VEC(k_norm, "attn_k_norm", "weight", true, hp->hd_k);
        L->swa = hp->n_swa > 0;
    } else {
        /* in_proj rows [B | C | x]; conv ne [l_cache, n_embd]: per channel
         * its taps, oldest input first, the last tap the current token */
        BIND_MAT(ssm_in, "shortconv.in_proj", true, E, 3 * E);
        BIND_VECN(ssm_conv, "shortconv.conv.weight", true, K, E * K);
        BIND_MAT(ssm_out, "shortconv.out_proj", true, E, E);
    }
    BIND_VEC(ffn_norm, "ffn_norm", "weight", true, E);
    BIND_MAT(ffn_gate, "ffn_gate", true, E, hp->n_ff);
    BIND_MAT(ffn_up, "ffn_up", true, E, hp->n_ff);
    BIND_MAT(ffn_down, "ffn_down", true, hp->n_ff, E);
    return KEEL_OK;
}
