/*
 * model.c — binding a GGUF file to the supported architectures: reads the
 * hyperparameters (llama.cpp's keys and defaults), checks every tensor's
 * shape and dtype, keeps 2-D weights as views into the file and converts
 * 1-D tensors to owned f32 arrays (the readers: loader.c; per-architecture
 * files arch_*.c bind what is theirs through loader.h).
 *
 * Validation at load, each failure naming the key or tensor: integer
 * hyperparameters in range, float ones finite and in range (norm epsilon in
 * (0, 1], RoPE base > 0, soft-caps >= 0, ...), every 1-D tensor (norms,
 * biases, RoPE frequency factors) finite after conversion. Matrices are not
 * scanned (that would read the whole file at open). Tensors the
 * architecture does not bind are reported once through the log callback.
 *
 * Architectures: llama (Llama 2/3, Mistral, TinyLlama, stories), qwen2
 * (QKV biases), qwen3 (per-head Q/K RMSNorm), gemma2 (sliding-window layers,
 * soft-caps, post norms, embedding scale, tied output), qwen35 (Gated
 * DeltaNet + gated attention), qwen3next (the same with MoE and a shared
 * expert), mamba2 (selective scan only), gpt-oss (MoE with SwiGLU-OAI,
 * attention sinks, alternating sliding layers, YaRN), deepseek32 (multi-head
 * latent attention in the absorbed MQA form with the DSA lightning indexer,
 * dense lead layers then MoE with a sigmoid router, selection bias and a
 * shared expert), gemma3 (gemma2's block with q/k norm, 5 of 6 layers
 * sliding with their own RoPE base, no soft-caps), phi3 (fused qkv and
 * gate|up bound as row views, partial RoPE, LongRoPE short/long factors),
 * qwen3moe and glm4moe (arch_moe.c), nemotron_h (per layer Mamba2,
 * attention without RoPE or a ReLU^2 MLP: arch_nemotron_h.c), lfm2 (gated
 * short convolutions and GQA attention chosen per layer by head_count_kv,
 * final norm token_embd_norm: arch_lfm2.c), deepseek2 (deepseek32's MLA without the indexer, q LoRA optional, grouped
 * expert routing, YaRN with the attention scale's mscale correction;
 * arch_deepseek2.c reads and binds the MLA family).
 */
#include "loader.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct arch_desc {
    const char *name;
    model_arch arch;
    keel_rope_type rope;
} arch_desc;

/* qwen35's IMRoPE (type 40) rotates every pair of a text token by its one
 * position (its sections choose among equal t/h/w positions): NEOX
 * (docs/models.md). */
static const arch_desc g_archs[] = {
    {"llama", MODEL_ARCH_LLAMA, KEEL_ROPE_NORM},
    {"qwen2", MODEL_ARCH_QWEN2, KEEL_ROPE_NEOX},
    {"qwen3", MODEL_ARCH_QWEN3, KEEL_ROPE_NEOX},
    {"gemma2", MODEL_ARCH_GEMMA2, KEEL_ROPE_NEOX},
    {"qwen35", MODEL_ARCH_QWEN35, KEEL_ROPE_NEOX},
    {"qwen3next", MODEL_ARCH_QWEN3NEXT, KEEL_ROPE_NEOX},
    {"mamba2", MODEL_ARCH_MAMBA2, KEEL_ROPE_NONE},
    {"gpt-oss", MODEL_ARCH_GPT_OSS, KEEL_ROPE_NEOX},
    /* the indexer's RoPE is NEOX (layer_mla.c) */
    {"deepseek32", MODEL_ARCH_DEEPSEEK32, KEEL_ROPE_NORM},
    {"gemma3", MODEL_ARCH_GEMMA3, KEEL_ROPE_NEOX},
    {"phi3", MODEL_ARCH_PHI3, KEEL_ROPE_NEOX},
    {"qwen3moe", MODEL_ARCH_QWEN3MOE, KEEL_ROPE_NEOX},
    {"glm4moe", MODEL_ARCH_GLM4MOE, KEEL_ROPE_NEOX},
    {"nemotron_h", MODEL_ARCH_NEMOTRON_H, KEEL_ROPE_NONE}, /* attention without RoPE */
    {"lfm2", MODEL_ARCH_LFM2, KEEL_ROPE_NEOX},
    {"deepseek2", MODEL_ARCH_DEEPSEEK2, KEEL_ROPE_NORM},
};

static bool arch_gemma(model_arch a)
{
    return a == MODEL_ARCH_GEMMA2 || a == MODEL_ARCH_GEMMA3;
}

/* bound by arch_moe.c */
static bool arch_moe(model_arch a)
{
    return a == MODEL_ARCH_QWEN3MOE || a == MODEL_ARCH_GLM4MOE;
}

static bool arch_mla(model_arch a)
{
    return a == MODEL_ARCH_DEEPSEEK2 || a == MODEL_ARCH_DEEPSEEK32;
}

static bool arch_gdn(model_arch a)
{
    return a == MODEL_ARCH_QWEN35 || a == MODEL_ARCH_QWEN3NEXT;
}

keel_status model_bind_mamba2(model_loader *l, const model_hp *hp, int32_t i, model_layer *L)
{
    char name[160];
    keel_status st;
    int64_t E = hp->n_embd;
    int64_t C = model_mamba2_conv_channels(hp), D = hp->ssm_d_inner, H = hp->ssm_dt_rank;
    BIND_MAT(ssm_in, "ssm_in", true, E, D + C + H);
    BIND_VECN(ssm_conv, "ssm_conv1d.weight", true, hp->ssm_conv_kernel, C * hp->ssm_conv_kernel);
    BIND_VECN(ssm_conv_b, "ssm_conv1d.bias", true, C, C);
    BIND_VECN(ssm_dt_b, "ssm_dt.bias", true, 0, H);
    BIND_VECN(ssm_a, "ssm_a", true, 0, H);
    BIND_VECN(ssm_d, "ssm_d", true, 0, H);
    BIND_VECN(ssm_norm, "ssm_norm.weight", true, D / hp->ssm_n_group, D);
    BIND_MAT(ssm_out, "ssm_out", true, D, E);
    return KEEL_OK;
}

static keel_status bind_tensors(model_loader *l, model_w *w)
{
    const model_hp *hp = &w->hp;
    char name[160];
    keel_status st;
    int64_t E = hp->n_embd, V = hp->n_vocab;
    int64_t QD = (int64_t)hp->n_head * hp->hd_k, KD = (int64_t)hp->n_head_kv * hp->hd_k;
    int64_t VD = (int64_t)hp->n_head_kv * hp->hd_v, OD = (int64_t)hp->n_head * hp->hd_v;
    if ((st = model_get_mat(l, "token_embd.weight", true, E, V, &w->tok_embd)) != KEEL_OK) return st;
    /* lfm2's final norm is stored as token_embd_norm (arch_lfm2.c) */
    const char *onorm = hp->arch == MODEL_ARCH_LFM2 ? "token_embd_norm.weight" : "output_norm.weight";
    if ((st = model_get_vec(l, onorm, true, E, &w->output_norm)) != KEEL_OK) return st;
    if ((st = model_get_mat(l, "output.weight", false, E, V, &w->output)) != KEEL_OK) return st;
    if (!w->output.data) w->output = w->tok_embd;
    const float *ff = NULL, *fshort = NULL, *flong = NULL;
    if (hp->rope.n_rot > 0 &&
        (st = model_get_rope_factors(l, "rope_freqs.weight", hp->rope.n_rot, &ff)) != KEEL_OK)
        return st;
    /* phi3 LongRoPE: short factors below the original context, long ones
     * above; rope_freqs, when present, wins (llama.cpp get_rope_factors) */
    if (hp->arch == MODEL_ARCH_PHI3 && hp->rope.n_rot > 0 &&
        ((st = model_get_rope_factors(l, "rope_factors_short.weight", hp->rope.n_rot, &fshort)) != KEEL_OK ||
         (st = model_get_rope_factors(l, "rope_factors_long.weight", hp->rope.n_rot, &flong)) != KEEL_OK))
        return st;
    if (!l->counting) {
        w->hp.rope.freq_factors = ff ? ff : fshort;
        w->hp.rope_swa.freq_factors = w->hp.rope.freq_factors;
        if (!ff && flong) {
            w->hp.rope_long = w->hp.rope;
            w->hp.rope_long.freq_factors = flong;
        }
    }
    /* NextN (MTP) layers after the run ones: bound, never run */
    for (int32_t i = 0; i < hp->n_layer + hp->n_nextn; i++) {
        model_layer *L = l->counting || i >= hp->n_layer ? NULL : &w->layers[i];
        model_layer tmp;
        if (!L) L = &tmp;
        memset(L, 0, sizeof *L);
        model_arch a = hp->arch;
        if (arch_moe(a)) {
            if ((st = model_moe_bind_layer(l, hp, i, L)) != KEEL_OK) return st;
            continue;
        }
        if (a == MODEL_ARCH_NEMOTRON_H) {
            if ((st = arch_nemotron_h_layer(l, hp, i, L)) != KEEL_OK) return st;
            continue;
        }
        if (a == MODEL_ARCH_LFM2) {
            if ((st = model_lfm2_bind_layer(l, w, i, L)) != KEEL_OK) return st;
            continue;
        }
        bool gdn = arch_gdn(a);
        L->mixer = a == MODEL_ARCH_MAMBA2 ? MODEL_MIXER_MAMBA2
                   : arch_mla(a) ? MODEL_MIXER_MLA
                   : gdn && (i + 1) % hp->full_attn_interval != 0 ? MODEL_MIXER_GDN
                                                                   : MODEL_MIXER_ATTN;
        L->ffn = a == MODEL_ARCH_MAMBA2                   ? MODEL_FFN_NONE
                 : hp->n_expert > 0 && i >= hp->n_dense_lead ? MODEL_FFN_MOE
                                                            : MODEL_FFN_DENSE;
        BIND_VEC(attn_norm, "attn_norm", "weight", true, E);
        if (L->mixer == MODEL_MIXER_ATTN) {
            L->attn_gate = gdn;
            model_mat qkv = {0};
            if (a == MODEL_ARCH_PHI3) { /* fused rows [q | k | v], or separate */
                BIND_MAT(wq, "attn_qkv", false, E, QD + KD + VD);
                qkv = L->wq;
            }
            if (qkv.data) {
                L->wq = model_mat_rows(&qkv, 0, QD);
                L->wk = model_mat_rows(&qkv, QD, KD);
                L->wv = model_mat_rows(&qkv, QD + KD, VD);
            } else {
                BIND_MAT(wq, "attn_q", true, E, L->attn_gate ? 2 * QD : QD);
                BIND_MAT(wk, "attn_k", true, E, KD);
                BIND_MAT(wv, "attn_v", true, E, VD);
            }
            BIND_MAT(wo, "attn_output", true, OD, E);
            bool biases = a == MODEL_ARCH_QWEN2 || a == MODEL_ARCH_GPT_OSS;
            BIND_VEC(bq, "attn_q", "bias", biases, QD);
            BIND_VEC(bk, "attn_k", "bias", biases, KD);
            BIND_VEC(bv, "attn_v", "bias", biases, VD);
            BIND_VEC(bo, "attn_output", "bias", a == MODEL_ARCH_GPT_OSS, E);
            bool qk = a == MODEL_ARCH_QWEN3 || a == MODEL_ARCH_GEMMA3 || gdn;
            BIND_VEC(q_norm, "attn_q_norm", "weight", qk, hp->hd_k);
            BIND_VEC(k_norm, "attn_k_norm", "weight", qk, hp->hd_k);
            if (a == MODEL_ARCH_GPT_OSS) {
                BIND_VEC(sinks, "attn_sinks", "weight", true, hp->n_head);
            }
        } else if (L->mixer == MODEL_MIXER_MLA) {
            if ((st = model_mla_bind_layer(l, hp, L, i)) != KEEL_OK) return st;
        } else if (L->mixer == MODEL_MIXER_GDN) {
            int64_t C = model_gdn_conv_channels(hp), VI = hp->ssm_d_inner, nv = hp->ssm_dt_rank;
            BIND_MAT(ssm_qkv, "attn_qkv", true, E, C);
            BIND_MAT(ssm_z, "attn_gate", true, E, VI);
            if (a == MODEL_ARCH_QWEN3NEXT) {
                BIND_MAT(ssm_ba, "ssm_ba", true, E, 2 * nv);
            } else {
                BIND_MAT(ssm_beta, "ssm_beta", true, E, nv);
                BIND_MAT(ssm_alpha, "ssm_alpha", true, E, nv);
            }
            BIND_VECN(ssm_conv, "ssm_conv1d.weight", true, hp->ssm_conv_kernel, C * hp->ssm_conv_kernel);
            BIND_VECN(ssm_dt_b, "ssm_dt.bias", true, 0, nv);
            BIND_VECN(ssm_a, "ssm_a", true, 0, nv);
            BIND_VECN(ssm_norm, "ssm_norm.weight", true, hp->ssm_d_state, hp->ssm_d_state);
            BIND_MAT(ssm_out, "ssm_out", true, VI, E);
        } else {
            if ((st = model_bind_mamba2(l, hp, i, L)) != KEEL_OK) return st;
        }
        if (arch_gemma(a)) {
            BIND_VEC(post_attn_norm, "post_attention_norm", "weight", true, E);
        }
        if (L->ffn != MODEL_FFN_NONE) {
            /* qwen35, qwen3next, gpt-oss name the FFN's pre-norm
             * post_attention_norm */
            bool post = gdn || a == MODEL_ARCH_GPT_OSS;
            if (post) {
                BIND_VEC(ffn_norm, "post_attention_norm", "weight", true, E);
            } else {
                BIND_VEC(ffn_norm, "ffn_norm", "weight", true, E);
            }
        }
        if (L->ffn == MODEL_FFN_DENSE && a == MODEL_ARCH_PHI3) {
            /* fused ffn_up: rows [gate | up] (llama.cpp's SwiGLU halves) */
            model_mat gu;
            snprintf(name, sizeof name, "blk.%d.ffn_up.weight", i);
            if ((st = model_get_mat(l, name, true, E, 2 * (int64_t)hp->n_ff, &gu)) != KEEL_OK) return st;
            L->ffn_gate = model_mat_rows(&gu, 0, hp->n_ff);
            L->ffn_up = model_mat_rows(&gu, hp->n_ff, hp->n_ff);
            BIND_MAT(ffn_down, "ffn_down", true, hp->n_ff, E);
        } else if (L->ffn == MODEL_FFN_DENSE) {
            BIND_MAT(ffn_gate, "ffn_gate", true, E, hp->n_ff);
            BIND_MAT(ffn_up, "ffn_up", true, E, hp->n_ff);
            BIND_MAT(ffn_down, "ffn_down", true, hp->n_ff, E);
        } else if (L->ffn == MODEL_FFN_MOE) {
            int64_t ne = hp->n_expert, Fe = hp->n_ff_exp;
            bool eb = a == MODEL_ARCH_GPT_OSS; /* router and expert biases */
            BIND_MAT(gate_inp, "ffn_gate_inp", true, E, ne);
            BIND_VEC(gate_inp_b, "ffn_gate_inp", "bias", eb, ne);
            BIND_VECN(exp_probs_b, "exp_probs_b.bias", false, ne, ne);
            BIND_EXP(gate_exps, "ffn_gate_exps", true, E, Fe);
            BIND_EXP(up_exps, "ffn_up_exps", true, E, Fe);
            BIND_EXP(down_exps, "ffn_down_exps", true, Fe, E);
            BIND_VECN(gate_exps_b, "ffn_gate_exps.bias", eb, Fe, Fe * ne);
            BIND_VECN(up_exps_b, "ffn_up_exps.bias", eb, Fe, Fe * ne);
            BIND_VECN(down_exps_b, "ffn_down_exps.bias", eb, E, E * ne);
            if (a == MODEL_ARCH_QWEN3NEXT) {
                int64_t Fs = hp->n_ff_shexp;
                BIND_VEC(shexp_gate, "ffn_gate_inp_shexp", "weight", true, E);
                BIND_MAT(gate_shexp, "ffn_gate_shexp", true, E, Fs);
                BIND_MAT(up_shexp, "ffn_up_shexp", true, E, Fs);
                BIND_MAT(down_shexp, "ffn_down_shexp", true, Fs, E);
            }
            if (arch_mla(a) && hp->n_ff_shexp > 0) { /* ungated shared experts */
                int64_t Fs = hp->n_ff_shexp;
                BIND_MAT(gate_shexp, "ffn_gate_shexp", true, E, Fs);
                BIND_MAT(up_shexp, "ffn_up_shexp", true, E, Fs);
                BIND_MAT(down_shexp, "ffn_down_shexp", true, Fs, E);
            }
        }
        if (arch_gemma(a)) {
            BIND_VEC(post_ffw_norm, "post_ffw_norm", "weight", true, E);
        }
        /* gemma2, gpt-oss: every other layer, starting with layer 0, is sliding */
        L->swa = (a == MODEL_ARCH_GEMMA2 || a == MODEL_ARCH_GPT_OSS) && hp->n_swa > 0 && i % 2 == 0;
        /* gemma3: the first swa_period - 1 layers of each period are sliding */
        if (a == MODEL_ARCH_GEMMA3)
            L->swa = hp->n_swa > 0 && i % hp->swa_period < hp->swa_period - 1;
    }
    return KEEL_OK;
}

/*
 * The keys of the recurrent mixers and the experts (llama.cpp's names):
 * ssm.conv_kernel, ssm.inner_size, ssm.state_size, ssm.time_step_rank (v
 * heads / heads), ssm.group_count (k heads / groups), full_attention_interval;
 * expert_count, expert_used_count, expert_feed_forward_length,
 * expert_shared_feed_forward_length, attention.sliding_window (gpt-oss).
 */
static keel_status read_arch_hparams(model_loader *l, model_w *w)
{
    model_hp *hp = &w->hp;
    model_arch a = hp->arch;
    keel_status st;
    hp->ffn_act = arch_gemma(a) ? MODEL_ACT_GELU
                  : a == MODEL_ARCH_GPT_OSS ? MODEL_ACT_SWIGLU_OAI
                                            : MODEL_ACT_SILU;
    hp->oai_alpha = 1.702f; /* llama.cpp's constants for gpt-oss */
    hp->oai_limit = 7.0f;
    hp->expert_scale = 1.0f;
    if (arch_gdn(a) || a == MODEL_ARCH_MAMBA2 || a == MODEL_ARCH_NEMOTRON_H) {
        if ((st = model_key_int(l, "ssm.conv_kernel", true, 0, 1, 64, &hp->ssm_conv_kernel)) ||
            (st = model_key_int(l, "ssm.inner_size", true, 0, 1, 1 << 20, &hp->ssm_d_inner)) ||
            (st = model_key_int(l, "ssm.state_size", true, 0, 1, 4096, &hp->ssm_d_state)) ||
            (st = model_key_int(l, "ssm.time_step_rank", true, 0, 1, 4096, &hp->ssm_dt_rank)) ||
            (st = model_key_int(l, "ssm.group_count", true, 0, 1, 4096, &hp->ssm_n_group)))
            return st;
        int32_t H = hp->ssm_dt_rank, G = hp->ssm_n_group, D = hp->ssm_d_inner;
        if (H % G || D % H || D % G)
            return base_err(l->err, KEEL_EFORMAT,
                            "%s.ssm: inner_size %d, time_step_rank %d and group_count %d: the heads "
                            "must divide inner_size and be a multiple of the groups",
                            l->arch, D, H, G);
        if (arch_gdn(a) && D / H != hp->ssm_d_state)
            return base_err(l->err, KEEL_EFORMAT,
                            "%s.ssm: inner_size %d / time_step_rank %d = %d must equal state_size %d "
                            "(key and value heads of the delta rule have one size)",
                            l->arch, D, H, D / H, hp->ssm_d_state);
    }
    if (arch_gdn(a)) {
        if ((st = model_key_int(l, "full_attention_interval", false, 4, 1, hp->n_layer, &hp->full_attn_interval)))
            return st;
        if (hp->hd_k != hp->hd_v)
            return base_err(l->err, KEEL_EFORMAT,
                            "%s: gated attention needs key_length %d == value_length %d", l->arch,
                            hp->hd_k, hp->hd_v);
        /* llama.cpp broadcasts the k heads over the v heads by tiling */
        hp->gdn_kv_tiled = a == MODEL_ARCH_QWEN35;
        const gguf_value *sec = NULL;
        char key[128];
        snprintf(key, sizeof key, "%s.rope.dimension_sections", l->arch);
        if (gguf_find_key(l->g, key) >= 0) {
            if ((st = gguf_get_arr(l->g, key, GGUF_TYPE_COUNT_, &sec, l->err)) != KEEL_OK) return st;
            int64_t sum = 0;
            for (uint64_t i = 0; i < sec->n && i < 4; i++) {
                int64_t v = 0;
                if ((st = gguf_arr_int(sec, i, &v)) != KEEL_OK || v < 0 || v > 4096)
                    return base_err(l->err, KEEL_EFORMAT, "key %s: element %llu out of range", key,
                                    (unsigned long long)i);
                hp->rope_sections[i] = (int32_t)v;
                sum += v;
            }
            if (sum > hp->rope.n_rot / 2)
                return base_err(l->err, KEEL_EFORMAT,
                                "key %s: sections sum to %lld pairs, more than rope.dimension_count %d / 2",
                                key, (long long)sum, hp->rope.n_rot);
        }
    }
    for (int32_t i = 0; i < hp->n_layer; i++)
        hp->n_recurrent += a == MODEL_ARCH_MAMBA2 || (arch_gdn(a) && (i + 1) % hp->full_attn_interval != 0);
    if (a == MODEL_ARCH_QWEN3NEXT || a == MODEL_ARCH_GPT_OSS) {
        if ((st = model_key_int(l, "expert_count", true, 0, 1, 4096, &hp->n_expert)) ||
            (st = model_key_int(l, "expert_used_count", true, 0, 1, hp->n_expert, &hp->n_expert_used)) ||
            (st = model_key_int(l, "expert_feed_forward_length", false, hp->n_ff, 1, 1 << 20, &hp->n_ff_exp)))
            return st;
        hp->router = a == MODEL_ARCH_GPT_OSS ? MODEL_ROUTER_SOFTMAX_WEIGHT : MODEL_ROUTER_SOFTMAX;
        hp->router_norm = a == MODEL_ARCH_QWEN3NEXT;
    }
    if (a == MODEL_ARCH_QWEN3NEXT &&
        (st = model_key_int(l, "expert_shared_feed_forward_length", false, hp->n_ff, 1, 1 << 20, &hp->n_ff_shexp)))
        return st;
    if (a == MODEL_ARCH_GPT_OSS) {
        if ((st = model_key_int(l, "attention.sliding_window", false, 128, 1, 1 << 24, &hp->n_swa))) return st;
        hp->attn_scale = 1.0f / sqrtf((float)hp->rope.n_rot);
    }
    if (arch_moe(a)) return model_moe_hparams(l, w);
    if (a == MODEL_ARCH_NEMOTRON_H) return arch_nemotron_h_hparams(l, hp);
    if (a == MODEL_ARCH_LFM2) return model_lfm2_hparams(l, w);
    if (arch_mla(a)) return model_mla_hparams(l, w); /* arch_deepseek2.c */
    return KEEL_OK;
}

static keel_status read_hparams(model_loader *l, model_w *w)
{
    model_hp *hp = &w->hp;
    keel_status st;
    const char *a;
    size_t an;
    st = gguf_get_str(l->g, "general.architecture", &a, &an, l->err);
    if (st != KEEL_OK) return st;
    const arch_desc *ad = NULL;
    for (size_t i = 0; i < BASE_ARRAY_LEN(g_archs); i++)
        if (gguf_str_eq(a, an, g_archs[i].name)) ad = &g_archs[i];
    if (!ad)
        return base_err(l->err, KEEL_EUNSUPPORTED,
                        "architecture '%.*s' is not supported (llama, qwen2, qwen3, gemma2, "
                        "qwen35, qwen3next, mamba2, gpt-oss, deepseek32, gemma3, phi3, "
                        "qwen3moe, glm4moe, nemotron_h, lfm2, deepseek2)",
                        (int)BASE_MIN(an, (size_t)64), a);
    hp->arch = ad->arch;
    hp->arch_name = ad->name;
    l->arch = ad->name;
    const int32_t BIG = 1 << 24;
    bool mamba = hp->arch == MODEL_ARCH_MAMBA2; /* no attention, no FFN */
    if ((st = model_key_int(l, "embedding_length", true, 0, 1, 1 << 17, &hp->n_embd)) != KEEL_OK) return st;
    if ((st = model_key_int(l, "block_count", true, 0, 1, 4096, &hp->n_layer)) != KEEL_OK) return st;
    l->n_layer = hp->n_layer;
    if (hp->arch == MODEL_ARCH_NEMOTRON_H) { /* per-layer arrays */
        if ((st = arch_nemotron_h_counts(l, hp)) != KEEL_OK) return st;
    } else {
        if ((st = model_key_int(l, "feed_forward_length", !mamba, 0, mamba ? 0 : 1, 1 << 20, &hp->n_ff)) != KEEL_OK)
            return st;
        if ((st = model_key_int(l, "attention.head_count", !mamba, 0, mamba ? 0 : 1, mamba ? 0 : 4096,
                                &hp->n_head)) != KEEL_OK)
            return st;
        /* lfm2: a per-layer array (0: a conv layer), read by arch_lfm2.c */
        hp->n_head_kv = hp->n_head;
        if (hp->arch != MODEL_ARCH_LFM2 &&
            (st = model_key_int(l, "attention.head_count_kv", false, hp->n_head, mamba ? 0 : 1, hp->n_head,
                                &hp->n_head_kv)) != KEEL_OK)
            return st;
        if (!mamba && hp->n_head % hp->n_head_kv)
            return base_err(l->err, KEEL_EFORMAT, "%s.attention.head_count %d is not a multiple of head_count_kv %d",
                            l->arch, hp->n_head, hp->n_head_kv);
    }
    if ((st = model_key_int(l, "context_length", false, 4096, 1, BIG, &hp->n_ctx_train)) != KEEL_OK) return st;
    int32_t hd_def = mamba || hp->n_head == 0 ? 1 : hp->n_embd / hp->n_head;
    if (hd_def < 1) hd_def = 1;
    if ((st = model_key_int(l, "attention.key_length", false, hd_def, 1, 8192, &hp->hd_k)) != KEEL_OK) return st;
    if ((st = model_key_int(l, "attention.value_length", false, hd_def, 1, 8192, &hp->hd_v)) != KEEL_OK) return st;
    /* eps <= 0 turns the norm of a zero row into 0/0 */
    if ((st = model_key_float_in(l, "attention.layer_norm_rms_epsilon", 1e-5, 0.0, true, 1.0,
                           &hp->norm_eps)) != KEEL_OK)
        return st;
    /* vocabulary size: the key, else the token list, else token_embd */
    int32_t nv = 0;
    if ((st = model_key_int(l, "vocab_size", false, 0, 0, BIG, &nv)) != KEEL_OK) return st;
    if (nv == 0) {
        const gguf_tensor *te = gguf_find_tensor(l->g, "token_embd.weight");
        if (!te) return base_err(l->err, KEEL_ENOENT, "missing tensor token_embd.weight");
        if (te->ne[1] < 1 || te->ne[1] > BIG)
            return base_err(l->err, KEEL_EFORMAT, "token_embd.weight: %lld rows", (long long)te->ne[1]);
        nv = (int32_t)te->ne[1];
    }
    hp->n_vocab = nv;
    /* RoPE */
    keel_rope *r = &hp->rope;
    *r = keel_rope_default();
    r->type = ad->rope;
    if (r->type == KEEL_ROPE_NONE) {
        r->n_rot = 0; /* no positions in the model (mamba2) */
    } else {
        if ((st = model_key_int(l, "rope.dimension_count", false, hp->hd_k, 2, hp->hd_k, &r->n_rot)) != KEEL_OK) return st;
        if (r->n_rot % 2) return base_err(l->err, KEEL_EFORMAT, "%s.rope.dimension_count %d is odd", l->arch, r->n_rot);
        if ((st = model_key_float_in(l, "rope.freq_base", 10000.0, 0.0, true, 1e30, &r->freq_base)) != KEEL_OK)
            return st;
        float factor = 1.0f;
        char key[128];
        snprintf(key, sizeof key, "%s.rope.scaling.type", l->arch);
        const char *stype = "none";
        size_t stn = 4;
        if (gguf_find_key(l->g, key) >= 0 && (st = gguf_get_str(l->g, key, &stype, &stn, l->err)) != KEEL_OK) return st;
        if ((st = model_key_float(l, "rope.scaling.factor", 0.0, &factor)) != KEEL_OK) return st;
        if (factor == 0.0f) {
            float lin = 0.0f; /* older key */
            if ((st = model_key_float(l, "rope.scale_linear", 0.0, &lin)) != KEEL_OK) return st;
            factor = lin > 0.0f ? lin : 1.0f;
            if (lin > 0.0f && gguf_str_eq(stype, stn, "none")) {
                stype = "linear";
                stn = 6;
            }
        }
        if (factor < 0.0f)
            return base_err(l->err, KEEL_EFORMAT, "key %s.rope.scaling.factor = %g: must be >= 0",
                            l->arch, (double)factor);
        r->freq_scale = 1.0f;
        if (gguf_str_eq(stype, stn, "linear")) {
            r->freq_scale = 1.0f / factor;
        } else if (gguf_str_eq(stype, stn, "yarn")) {
            r->freq_scale = 1.0f / factor;
            r->ext_factor = 1.0f;
            if ((st = model_key_float_in(l, "rope.scaling.attn_factor", 1.0, 0.0, true, 1e6,
                                   &r->attn_factor)) != KEEL_OK)
                return st;
            if ((st = model_key_float(l, "rope.scaling.yarn_beta_fast", 32.0, &r->beta_fast)) != KEEL_OK) return st;
            if ((st = model_key_float(l, "rope.scaling.yarn_beta_slow", 1.0, &r->beta_slow)) != KEEL_OK) return st;
            if ((st = model_key_int(l, "rope.scaling.original_context_length", false, hp->n_ctx_train, 1, BIG,
                              &r->n_ctx_orig)) != KEEL_OK)
                return st;
        } else if (!gguf_str_eq(stype, stn, "none")) {
            return base_err(l->err, KEEL_EUNSUPPORTED, "%s.rope.scaling.type '%.*s' is not supported",
                            l->arch, (int)BASE_MIN(stn, (size_t)32), stype);
        }
    }
    if (r->n_ctx_orig == 0) r->n_ctx_orig = hp->n_ctx_train;
    if (hp->arch == MODEL_ARCH_PHI3 && r->type != KEEL_ROPE_NONE) {
        /* LongRoPE: which factors apply depends on the original context;
         * attn_factor multiplies the rotated dims of q and k (llama.cpp's
         * rope_attn_factor, for any scaling type) */
        if ((st = model_key_int(l, "rope.scaling.original_context_length", false, hp->n_ctx_train, 1, BIG,
                          &r->n_ctx_orig)) != KEEL_OK)
            return st;
        if ((st = model_key_float_in(l, "rope.scaling.attn_factor", 1.0, 0.0, true, 1e6, &r->attn_factor)) != KEEL_OK)
            return st;
    }
    hp->rope_swa = *r;
    hp->rope_long = *r;
    hp->rope_long.type = KEEL_ROPE_NONE; /* set by bind_tensors when rope_factors_long is present */
    /* arch specifics */
    hp->embd_scale = 1.0f;
    hp->attn_scale = 1.0f / sqrtf((float)hp->hd_k);
    if (hp->arch == MODEL_ARCH_GEMMA2) {
        /* 0 turns a soft-cap off */
        if ((st = model_key_float_in(l, "attn_logit_softcapping", 50.0, 0.0, false, 1e30,
                               &hp->attn_softcap)) != KEEL_OK)
            return st;
        if ((st = model_key_float_in(l, "final_logit_softcapping", 30.0, 0.0, false, 1e30,
                               &hp->final_softcap)) != KEEL_OK)
            return st;
        if ((st = model_key_int(l, "attention.sliding_window", false, 4096, 1, BIG, &hp->n_swa)) != KEEL_OK) return st;
        hp->embd_scale = sqrtf((float)hp->n_embd);
        /* llama.cpp: gemma2 27B scales by 1/sqrt(n_embd / n_head), the others by head_dim */
        if (hp->n_layer == 46) hp->attn_scale = 1.0f / sqrtf((float)(hp->n_embd / hp->n_head));
    }
    if (hp->arch == MODEL_ARCH_GEMMA3) {
        /* no attention soft-cap; a final one only with the key */
        if ((st = model_key_float_in(l, "final_logit_softcapping", 0.0, 0.0, false, 1e30, &hp->final_softcap)) != KEEL_OK)
            return st;
        /* no window (or 0): every layer is global, with rope */
        if ((st = model_key_int(l, "attention.sliding_window", false, 0, 0, BIG, &hp->n_swa)) != KEEL_OK) return st;
        if ((st = model_key_int(l, "attention.sliding_window_pattern", false, 6, 1, 4096, &hp->swa_period)) != KEEL_OK)
            return st;
        if (hp->n_swa > 0) {
            /* sliding layers: their own base, no scaling (llama.cpp's
             * rope_freq_base_train_swa, default 10000; freq_scale_swa 1) */
            if ((st = model_key_float_in(l, "rope.freq_base_swa", 10000.0, 0.0, true, 1e30,
                                   &hp->rope_swa.freq_base)) != KEEL_OK)
                return st;
            hp->rope_swa.freq_scale = 1.0f;
        }
        hp->embd_scale = sqrtf((float)hp->n_embd);
        /* query_pre_attn_scalar: 27B (62 layers) n_embd / n_head, else head_dim */
        if (hp->n_layer == 62) hp->attn_scale = 1.0f / sqrtf((float)(hp->n_embd / hp->n_head));
    }
    if (hp->arch == MODEL_ARCH_PHI3 && hp->hd_k != hp->hd_v)
        return base_err(l->err, KEEL_EFORMAT, "%s: key_length %d != value_length %d", l->arch, hp->hd_k,
                        hp->hd_v);
    /* phi3's attention.sliding_window is ignored, as llama.cpp does ("Phi
     * SWA is currently disabled"): full attention */
    return read_arch_hparams(l, w);
}

/* Layer number of a "blk.N." tensor name, or -1. */
static int64_t block_of(const char *name)
{
    if (strncmp(name, "blk.", 4) != 0) return -1;
    int64_t n = 0;
    const char *p = name + 4;
    if (*p < '0' || *p > '9') return -1;
    for (; *p >= '0' && *p <= '9'; p++)
        if ((n = n * 10 + (*p - '0')) > INT32_MAX) return -1;
    return *p == '.' ? n : -1;
}

/*
 * Tensors the architecture did not bind: one warning through the log
 * callback, naming them (as many as fit) and, when layers beyond
 * block_count are present, saying so. llama.cpp refuses such files ("wrong
 * number of tensors"); keel runs them, since a smaller block_count is also
 * how a model is cut to its first layers on purpose, but never silently.
 */
static void warn_unused(const model_loader *l, const model_w *w)
{
    const gguf *g = l->g;
    int64_t n_unused = 0, blk_lo = INT64_MAX, blk_hi = -1;
    int32_t n_blk = w->hp.n_layer + w->hp.n_nextn; /* block_count */
    char names[640];
    size_t k = 0;
    int64_t listed = 0;
    names[0] = '\0';
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        if (l->used[i]) continue;
        const gguf_tensor *t = gguf_tensor_at(g, i);
        n_unused++;
        int64_t b = block_of(t->name);
        if (b >= n_blk) {
            blk_lo = BASE_MIN(blk_lo, b);
            blk_hi = BASE_MAX(blk_hi, b);
        }
        if (k + t->name_len + 3 < sizeof names - 16) {
            k += (size_t)snprintf(names + k, sizeof names - k, "%s%s", listed ? ", " : "", t->name);
            listed++;
        }
    }
    if (n_unused == 0) return;
    char more[48] = "", blocks[160] = "";
    if (listed < n_unused)
        snprintf(more, sizeof more, " and %lld more", (long long)(n_unused - listed));
    if (blk_hi >= 0)
        snprintf(blocks, sizeof blocks,
                 " (%s.block_count is %d, but the file has layers blk.%lld..blk.%lld)", l->arch,
                 n_blk, (long long)blk_lo, (long long)blk_hi);
    base_log(KEEL_LOG_WARN, "%lld of %lld tensors are not used by the %s model and are ignored%s: %s%s",
             (long long)n_unused, (long long)gguf_n_tensors(g), l->arch, blocks, names, more);
}

keel_status model_load(const gguf *g, model_w *w, char *err)
{
    memset(w, 0, sizeof *w);
    model_loader l = {g, NULL, err, NULL, 0, 0, true, NULL, 0};
    keel_status st = read_hparams(&l, w);
    if (st != KEEL_OK) return st;
    /* pass 1: shapes, dtypes, and how many f32 floats the vectors need */
    st = bind_tensors(&l, w);
    if (st != KEEL_OK) return st;
    size_t lb;
    if (!size_mul((size_t)w->hp.n_layer, sizeof(model_layer), &lb))
        return base_err(err, KEEL_EOVERFLOW, "too many layers");
    w->layers = base_calloc(1, lb);
    if (!w->layers) return base_err(err, KEEL_ENOMEM, "out of memory (layers)");
    w->layers_bytes = lb;
    size_t fb;
    if (!size_mul(l.f32_cap, sizeof(float), &fb) || fb == 0) fb = sizeof(float) * 16;
    w->f32_block = base_alloc(fb);
    w->f32_bytes = fb;
    size_t rb = 3 * (size_t)(w->hp.rope.n_rot / 2 + 1) * sizeof(double);
    w->rope_rates = base_alloc(rb);
    if (!w->f32_block || !w->rope_rates) {
        model_free(w);
        return base_err(err, KEEL_ENOMEM, "out of memory (model vectors)");
    }
    size_t n_t = (size_t)gguf_n_tensors(g);
    l.used = n_t ? base_calloc(n_t, 1) : NULL;
    if (n_t && !l.used) {
        model_free(w);
        return base_err(err, KEEL_ENOMEM, "out of memory (tensor marks)");
    }
    l.counting = false;
    l.f32 = w->f32_block;
    l.f32_used = 0;
    st = bind_tensors(&l, w);
    if (st == KEEL_OK && w->hp.rope.type != KEEL_ROPE_NONE) {
        size_t nr = (size_t)(w->hp.rope.n_rot / 2 + 1);
        w->rope_rates_swa = w->rope_rates + nr;
        w->rope_rates_long = w->rope_rates + 2 * nr;
        st = tensor_rope_rates(&w->hp.rope, w->rope_rates, &w->rope_mscale);
        if (st == KEEL_OK) st = tensor_rope_rates(&w->hp.rope_swa, w->rope_rates_swa, &w->rope_mscale_swa);
        if (st == KEEL_OK && w->hp.rope_long.type != KEEL_ROPE_NONE)
            st = tensor_rope_rates(&w->hp.rope_long, w->rope_rates_long, &w->rope_mscale_long);
    }
    if (st == KEEL_OK) warn_unused(&l, w);
    base_free(l.used, n_t);
    if (st != KEEL_OK) {
        model_free(w);
        return st == KEEL_EINVAL ? base_err(err, KEEL_EFORMAT, "bad RoPE parameters") : st;
    }
    /* parameter count, bytes, main dtype (by bytes) */
    size_t by_dtype[KEEL_DTYPE_COUNT_] = {0};
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        w->n_params += t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
        w->weight_bytes += t->nbytes;
        if ((unsigned)t->dtype < KEEL_DTYPE_COUNT_) by_dtype[t->dtype] += t->nbytes;
    }
    w->main_dtype = KEEL_DTYPE_F32;
    for (int i = 0; i < KEEL_DTYPE_COUNT_; i++)
        if (by_dtype[i] > by_dtype[w->main_dtype]) w->main_dtype = (keel_dtype)i;
    return KEEL_OK;
}

void model_free(model_w *w)
{
    if (!w) return;
    base_free(w->layers, w->layers_bytes);
    base_free(w->f32_block, w->f32_bytes);
    base_free(w->rope_rates, 3 * (size_t)(w->hp.rope.n_rot / 2 + 1) * sizeof(double));
    w->layers = NULL;
    w->f32_block = NULL;
    w->rope_rates = NULL;
}

void model_mem_layers(const model_w *w, keel_dtype type_k, keel_dtype type_v, int32_t rot_k,
                      int32_t rot_v, int32_t n_sink, int32_t swa_window, int32_t swa_period,
                      bool rope_long, keel_mem_layer *layers)
{
    const model_hp *hp = &w->hp;
    bool qk = type_k != KEEL_DTYPE_F32 && type_k != KEEL_DTYPE_F16 && type_k != KEEL_DTYPE_BF16;
    for (int32_t i = 0; i < hp->n_layer; i++) {
        keel_mem_layer *L = &layers[i];
        *L = keel_mem_layer_default();
        const model_layer *ML = &w->layers[i];
        if (ML->mixer == MODEL_MIXER_NONE) { /* an FFN-only block: no KV, no state */
            L->kind = KEEL_MEM_LAYER_NONE;
            continue;
        }
        if (ML->mixer != MODEL_MIXER_ATTN && ML->mixer != MODEL_MIXER_MLA) {
            /* the state shapes of layer_gdn.c / layer_mamba2.c */
            L->kind = KEEL_MEM_LAYER_RECURRENT;
            L->rs.conv_kernel = hp->ssm_conv_kernel;
            if (ML->mixer == MODEL_MIXER_SHORTCONV) {
                /* lfm2: the conv's last l_cache - 1 inputs (B * x), no SSM state */
                L->rs.conv_channels = hp->n_embd;
                L->rs.state_floats = 0;
            } else if (ML->mixer == MODEL_MIXER_GDN) {
                L->rs.conv_channels = model_gdn_conv_channels(hp);
                L->rs.state_floats = (int64_t)hp->ssm_dt_rank * hp->ssm_d_state * hp->ssm_d_state;
            } else {
                L->rs.conv_channels = model_mamba2_conv_channels(hp);
                L->rs.state_floats = (int64_t)hp->ssm_d_inner * hp->ssm_d_state;
            }
            continue;
        }
        L->kind = ML->swa ? KEEL_MEM_LAYER_SLIDING : KEEL_MEM_LAYER_FULL;
        L->window = hp->n_swa;
        if (swa_window > 0) {
            /* StreamingLLM-style override: sinks + window on all but every
             * swa_period-th layer (the last of each period stays full) */
            bool full = swa_period > 0 && i % swa_period == swa_period - 1;
            L->kind = full ? KEEL_MEM_LAYER_FULL : KEEL_MEM_LAYER_SLIDING;
            L->window = swa_window;
        }
        L->n_sink = n_sink;
        L->n_kv_heads = hp->n_head_kv;
        L->n_heads = hp->n_head;
        L->head_dim_k = hp->hd_k;
        L->head_dim_v = hp->hd_v;
        L->k_dtype = type_k;
        L->v_dtype = type_v;
        /* auto: rotate quantized K when the head has a power-of-two block >= 32 */
        bool rk = rot_k > 0 || (rot_k < 0 && qk && hp->hd_k % 32 == 0);
        L->k_rot.enabled = rk;
        L->k_rot.block = 0;
        L->k_rot.seed = 0x6b65656c0001ull;
        L->v_rot.enabled = rot_v > 0;
        L->v_rot.block = 0;
        L->v_rot.seed = 0x6b65656c0002ull;
        /* position edits rotate each layer's keys with its own RoPE */
        L->rope = *model_layer_rope(w, i, rope_long);
        if (ML->mixer != MODEL_MIXER_MLA || hp->idx_heads == 0) continue;
        /* the absorbed MLA form: one KV head, K = [rope | kv_lora] (RoPE on
         * its first dims, so position edits rotate them), V = the kv_lora
         * part; the indexer key as the table's third column, stored like K
         * (llama.cpp: the indexer cache takes type_k) and always
         * Hadamard-rotated with the plain matrix (seed 0), as llama.cpp's
         * indexer cache is (attn_rot_k = 1); its RoPE is NEOX */
        L->idx_head_dim = hp->idx_dim;
        L->idx_n_heads = hp->idx_heads;
        L->idx_dtype = type_k;
        L->idx_rot.enabled = true;
        L->idx_rot.block = 0;
        L->idx_rot.seed = 0;
        L->idx_rope = hp->rope;
        L->idx_rope.type = KEEL_ROPE_NEOX;
        L->idx_top_k = hp->idx_top_k;
    }
}

bool model_rope_long(const model_w *w, int32_t n_ctx_seq)
{
    return w->hp.rope_long.type != KEEL_ROPE_NONE && n_ctx_seq > w->hp.rope.n_ctx_orig;
}

const keel_rope *model_layer_rope(const model_w *w, int32_t l, bool rope_long)
{
    if (rope_long && w->hp.rope_long.type != KEEL_ROPE_NONE) return &w->hp.rope_long;
    if (w->layers[l].swa) return &w->hp.rope_swa;
    return &w->hp.rope;
}
