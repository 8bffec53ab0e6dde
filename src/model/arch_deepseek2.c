/*
 * arch_deepseek2.c — hyperparameters and per-layer binding of the
 * multi-head latent attention family: deepseek2 (DeepSeek V2 / V2-Lite /
 * V3, Kimi K2) and deepseek32 (the same with the DSA lightning indexer).
 * Both run layer_mla.c's absorbed MQA form; dense lead layers, then MoE.
 *
 * Keys (llama.cpp's): attention.q_lora_rank (deepseek2: absent or 0 = no q
 * LoRA, a plain attn_q as DeepSeek-V2-Lite), kv_lora_rank, key_length /
 * value_length (the absorbed cache row kv_lora + rope, its value kv_lora),
 * key_length_mla / value_length_mla (per head q.k and value dims; without
 * them a file has the legacy unsplit attn_kv_b, refused), rope.dimension_count
 * (the rope part), leading_dense_block_count, expert_count,
 * expert_used_count, expert_feed_forward_length, expert_shared_count,
 * expert_weights_scale, expert_weights_norm, expert_gating_func (1 softmax,
 * 2 sigmoid; deepseek2 defaults to softmax as llama.cpp, deepseek32 to
 * sigmoid), expert_group_count / expert_group_used_count (grouped routing,
 * ffn.c), rope.scaling.yarn_log_mul (0.1 x mscale_all_dim as convert writes
 * it), nextn_predict_layers (MTP blocks after the trunk: not run, their
 * tensors reported unused); deepseek32's attention.indexer.head_count /
 * key_length / top_k and attention.layer_norm_epsilon.
 *
 * YaRN, as llama.cpp's deepseek2 graph and llama_context compute it (f32):
 *   f          = 1 / freq_scale, gm(f, m) = f <= 1 ? 1 : 1 + 0.1 m ln f
 *   L          = yarn_log_mul / 0.1 (mscale_all_dim)
 *   ratio      = L != 0 ? gm(f, M) / gm(f, L) : gm(f, 1), where M = L for
 *                deepseek2 when L != 1 (so ratio = 1), else M = 1
 *   attn_factor (of the RoPE) = ratio / (1 + 0.1 ln f) * rope.scaling.attn_factor
 * the rotated dims then carry magnitude attn_factor (1 + 0.1 ln f) = a0
 * (tensor_rope_rates), and the attention scale is
 *   (a0 (1 + 0.1 L ln f))^2 / sqrt(key_length_mla).
 * Without YaRN a0 = rope.scaling.attn_factor (default 1), the scale
 * a0^2 / sqrt(key_length_mla). Linear scaling is refused.
 */
#include "loader.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define DS_MAX_GROUPS 256 /* ffn.c scores groups on the stack */

static float yarn_get_mscale(float scale, float mscale)
{
    return scale <= 1.0f ? 1.0f : 0.1f * mscale * logf(scale) + 1.0f;
}

/* The RoPE magnitude and attention scale (see the top of the file). */
static keel_status read_yarn(model_loader *l, model_w *w, int32_t kd)
{
    model_hp *hp = &w->hp;
    keel_rope *r = &hp->rope;
    keel_status st;
    float log_mul = 0.0f, af = 1.0f, temp = 0.0f;
    if ((st = model_key_float_in(l, "rope.scaling.yarn_log_mul", 0.0, 0.0, false, 100.0,
                                 &log_mul)) ||
        (st = model_key_float_in(l, "rope.scaling.attn_factor", 1.0, 0.0, true, 1e6, &af)) ||
        (st = model_key_float(l, "attention.temperature_scale", 0.0, &temp)))
        return st;
    if (temp != 0.0f)
        return base_err(l->err, KEEL_EUNSUPPORTED,
                        "key %s.attention.temperature_scale = %g: attention temperature tuning "
                        "(Mistral Large) is not implemented",
                        l->arch, (double)temp);
    log_mul /= 0.1f; /* llama.cpp: cancel the convert script's factor */
    if (r->ext_factor == 0.0f && r->freq_scale != 1.0f)
        return base_err(
            l->err, KEEL_EUNSUPPORTED,
            "%s: linear RoPE scaling (factor %g) is not implemented for multi-head latent "
            "attention (YaRN is)",
            l->arch, (double)(1.0f / r->freq_scale));
    float factor = 1.0f / r->freq_scale;
    if (r->ext_factor != 0.0f) {
        float ratio = yarn_get_mscale(factor, 1.0f);
        if (log_mul != 0.0f) {
            float m = hp->arch == MODEL_ARCH_DEEPSEEK2 && log_mul != 1.0f ? log_mul : 1.0f;
            ratio = yarn_get_mscale(factor, m) / yarn_get_mscale(factor, log_mul);
        }
        af = ratio * (1.0f / (1.0f + 0.1f * logf(factor))) * af;
    }
    r->attn_factor = af;
    float a0 = af * (1.0f + 0.1f * logf(1.0f / r->freq_scale));
    float ms = a0 * (1.0f + 0.1f * log_mul * logf(1.0f / r->freq_scale));
    hp->attn_scale = 1.0f * ms * ms / sqrtf((float)kd);
    if (!isfinite(hp->attn_scale) || !(hp->attn_scale > 0.0f) || !isfinite(af) || !(af > 0.0f))
        return base_err(l->err, KEEL_EFORMAT,
                        "%s: YaRN factor %g with yarn_log_mul %g gives attention scale %g", l->arch,
                        (double)factor, (double)(log_mul * 0.1f), (double)hp->attn_scale);
    return KEEL_OK;
}

static keel_status read_experts(model_loader *l, model_w *w)
{
    model_hp *hp = &w->hp;
    keel_status st;
    int32_t n_shared = 0, gating = hp->arch == MODEL_ARCH_DEEPSEEK32 ? 2 : 1;
    /* llama.cpp: GLM 4.7 Lite files (deepseek2, 47/48 layers, 154880
     * tokens) lack the key and are sigmoid-gated */
    if (hp->arch == MODEL_ARCH_DEEPSEEK2 && (hp->n_layer == 47 || hp->n_layer == 48) &&
        hp->n_vocab == 154880)
        gating = 2;
    if ((st = model_key_int(l, "expert_count", true, 0, 1, 4096, &hp->n_expert)) ||
        (st =
             model_key_int(l, "expert_used_count", true, 0, 1, hp->n_expert, &hp->n_expert_used)) ||
        (st = model_key_int(l, "expert_feed_forward_length", true, 0, 1, 1 << 20, &hp->n_ff_exp)) ||
        (st = model_key_int(l, "expert_shared_count", false, 0, 0, 64, &n_shared)) ||
        (st = model_key_int(l, "expert_gating_func", false, gating, 1, 2, &gating)) ||
        (st = model_key_float_in(l, "expert_weights_scale", 1.0, 0.0, true, 1e6,
                                 &hp->expert_scale)) ||
        (st = model_key_int(l, "expert_group_count", false, 0, 0, DS_MAX_GROUPS,
                            &hp->n_expert_groups)) ||
        (st = model_key_int(l, "expert_group_used_count", false, 0, 0, DS_MAX_GROUPS,
                            &hp->n_group_used)))
        return st;
    hp->n_ff_shexp = hp->n_ff_exp * n_shared;
    hp->router = gating == 2 ? MODEL_ROUTER_SIGMOID : MODEL_ROUTER_SOFTMAX;
    char key[128];
    snprintf(key, sizeof key, "%s.expert_weights_norm", l->arch);
    bool norm = false;
    if (gguf_find_key(l->g, key) >= 0 && (st = gguf_get_bool(l->g, key, &norm, l->err)) != KEEL_OK)
        return st;
    hp->router_norm = norm;
    int32_t G = hp->n_expert_groups, U = hp->n_group_used;
    if (G > 1) {
        /* llama.cpp's checks, and its group score (the sum of a group's 2
         * best) needs 2 experts per group */
        if (G >= hp->n_expert || hp->n_expert % G || hp->n_expert / G < 2 || U < 1 || U >= G ||
            hp->n_expert_used > U * (hp->n_expert / G))
            return base_err(
                l->err, KEEL_EFORMAT,
                "%s: expert_group_count %d / expert_group_used_count %d with expert_count %d "
                "and expert_used_count %d: groups must split the experts evenly, 2 or more "
                "each, 1 <= groups used < groups, and hold the experts used",
                l->arch, G, U, hp->n_expert, hp->n_expert_used);
    } else {
        hp->n_expert_groups = hp->n_group_used = 0;
    }
    return KEEL_OK;
}

keel_status model_mla_hparams(model_loader *l, model_w *w)
{
    model_hp *hp = &w->hp;
    keel_status st;
    bool dsa = hp->arch == MODEL_ARCH_DEEPSEEK32;
    int32_t kd = 0, vd = 0, nextn = 0;
    if ((st = model_key_int(l, "nextn_predict_layers", false, 0, 0, hp->n_layer - 1, &nextn)))
        return st;
    hp->n_layer -= nextn; /* the MTP blocks follow the trunk */
    if ((st = model_key_int(l, "attention.q_lora_rank", dsa, 0, dsa ? 1 : 0, 1 << 16,
                            &hp->q_lora)) ||
        (st = model_key_int(l, "attention.kv_lora_rank", true, 0, 1, 1 << 16, &hp->kv_lora)) ||
        (st = model_key_int(l, "attention.key_length_mla", true, 0, 2, 8192, &kd)) ||
        (st = model_key_int(l, "attention.value_length_mla", true, 0, 1, 8192, &vd)) ||
        (st = model_key_int(l, "leading_dense_block_count", false, 0, 0, hp->n_layer,
                            &hp->n_dense_lead)))
        return st;
    if (dsa &&
        ((st =
              model_key_int(l, "attention.indexer.head_count", true, 0, 1, 4096, &hp->idx_heads)) ||
         (st = model_key_int(l, "attention.indexer.key_length", true, 0, 2, 8192, &hp->idx_dim)) ||
         (st = model_key_int(l, "attention.indexer.top_k", true, 0, 1, 1 << 20, &hp->idx_top_k))))
        return st;
    int32_t R = hp->rope.n_rot;
    if (hp->n_head_kv != 1 || hp->hd_k != hp->kv_lora + R || hp->hd_v != hp->kv_lora || kd <= R ||
        kd % 2)
        return base_err(
            l->err, KEEL_EFORMAT,
            "%s: the absorbed MLA form needs head_count_kv 1 (%d), key_length = kv_lora_rank + "
            "rope dims (%d != %d + %d), value_length = kv_lora_rank (%d), key_length_mla %d > "
            "rope dims and even",
            l->arch, hp->n_head_kv, hp->hd_k, hp->kv_lora, R, hp->hd_v, kd);
    if (dsa && (hp->idx_dim <= R || hp->idx_dim % 2))
        return base_err(
            l->err, KEEL_EFORMAT,
            "%s.attention.indexer.key_length %d: must be even and above the %d rope dims", l->arch,
            hp->idx_dim, R);
    hp->qk_rope = R;
    hp->qk_nope = kd - R;
    hp->v_head = vd;
    if ((st = read_yarn(l, w, kd))) return st;
    hp->idx_norm_eps = 1e-6f; /* llama.cpp's LayerNorm epsilon of the indexer key */
    if (dsa && (st = model_key_float_in(l, "attention.layer_norm_epsilon", 1e-6, 0.0, true, 1.0,
                                        &hp->idx_norm_eps)))
        return st;
    if (hp->n_dense_lead < hp->n_layer) return read_experts(l, w);
    return KEEL_OK;
}

keel_status model_mla_bind_layer(model_loader *l, const model_hp *hp, model_layer *L, int32_t i)
{
    char name[160];
    keel_status st;
    int64_t E = hp->n_embd, H = hp->n_head, N = hp->qk_nope, R = hp->qk_rope, KL = hp->kv_lora,
            QL = hp->q_lora;
    if (QL > 0) {
        BIND_MAT(wq_a, "attn_q_a", true, E, QL);
        BIND_VEC(q_a_norm, "attn_q_a_norm", "weight", true, QL);
        BIND_MAT(wq_b, "attn_q_b", true, QL, H * (N + R));
    } else {
        BIND_MAT(wq, "attn_q", true, E, H * (N + R));
    }
    BIND_MAT(wkv_a, "attn_kv_a_mqa", true, E, KL + R);
    BIND_VEC(kv_a_norm, "attn_kv_a_norm", "weight", true, KL);
    snprintf(name, sizeof name, "blk.%d.attn_k_b.weight", i);
    if ((st = model_get_mat3(l, name, true, N, KL, H, &L->wk_b)) != KEEL_OK) return st;
    snprintf(name, sizeof name, "blk.%d.attn_v_b.weight", i);
    if ((st = model_get_mat3(l, name, true, KL, hp->v_head, H, &L->wv_b)) != KEEL_OK) return st;
    BIND_MAT(wo, "attn_output", true, H * hp->v_head, E);
    if (hp->idx_heads > 0) {
        int64_t IH = hp->idx_heads, ID = hp->idx_dim;
        BIND_MAT(idx_wq_b, "indexer.attn_q_b", true, QL, IH * ID);
        BIND_MAT(idx_wk, "indexer.attn_k", true, E, ID);
        BIND_VEC(idx_k_norm, "indexer.k_norm", "weight", true, ID);
        BIND_VEC(idx_k_norm_b, "indexer.k_norm", "bias", true, ID);
        BIND_MAT(idx_proj, "indexer.proj", true, E, IH);
    }
    return KEEL_OK;
}
