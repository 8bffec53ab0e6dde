/*
 * genmodel.c — keel_gen_model: deterministic random-weight GGUF models of
 * the llama, qwen2, qwen3, gemma2, qwen35, qwen3next, mamba2, gpt-oss,
 * deepseek32, gemma3, phi3, qwen3moe, glm4moe, nemotron_h and lfm2
 * architectures (keel.h describes the shapes),
 * with the keys, tensor names and shapes llama.cpp's loader expects, and a
 * vocabulary learned from a built-in text (genvocab.c). docs/formats.md section 7.
 *
 * Weights: tensor t, row r is drawn from base_rng seeded with
 * hash(name of t, seed) + (r + 1) * golden ratio, so each row is
 * independent of every other and rows are generated in parallel with the
 * same bytes for any thread count. Tensors are deferred in the GGUF writer
 * and generated one at a time while the file is written: memory is one
 * tensor (the largest) plus a row of f32 per thread, whatever the model
 * size.
 *
 * Invariant: the tensor list (names, shapes, dtypes) depends only on the
 * parameters, and each tensor's bytes only on its name, shape, dtype and
 * the seed; the file is a pure function of the parameters.
 */
#include "genmodel.h"

#include "../tensor/tensor.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define GEN_MAX_LAYER          1024
#define GEN_MAX_EMBD           65536
#define GEN_MAX_HEAD           1024
#define GEN_MAX_HEAD_DIM       4096
#define GEN_MAX_FF             (1 << 20)
#define GEN_MAX_CTX            (1 << 24)
#define GEN_MAX_PARAMS         ((int64_t)1 << 40)
#define GEN_ROW_ELEMS_PER_TASK 65536 /* rows per pool task: about this many elements */

keel_gen_params keel_gen_params_default(void)
{
    keel_gen_params p = {
        .arch = "llama",
        .n_layer = 2,
        .n_embd = 128,
        .n_head = 4,
        .n_head_kv = 2,
        .head_dim = 0,
        .n_ff = 0,
        .n_vocab = 512,
        .n_ctx = 4096,
        .n_swa = 0,
        .dtype = KEEL_DTYPE_F32,
        .seed = 1,
        .n_expert = 0,
        .n_expert_used = 0,
        .ssm_state = 0,
        .top_k = 0,
        .n_ff_exp = 0,
    };
    return p;
}

/* ---- architectures ----------------------------------------------------------- */

typedef enum gen_family {
    GEN_DENSE = 0, /* llama, qwen2, qwen3, gemma2 */
    GEN_QWEN35,    /* Gated DeltaNet + gated attention, dense FFN */
    GEN_QWEN3NEXT, /* the same with MoE and a shared expert */
    GEN_MAMBA2,    /* selective scan only */
    GEN_GPT_OSS,   /* sinks, biases, sliding / full, MoE SwiGLU-OAI, YaRN */
    GEN_DEEPSEEK32, /* MLA + DSA indexer, a dense lead layer, sigmoid MoE + shared expert */
    GEN_DEEPSEEK2,  /* the same MLA without the indexer, grouped routing, optional YaRN */
    GEN_PHI3,      /* fused qkv and gate|up, partial RoPE, LongRoPE factors */
    GEN_QWEN3MOE,  /* qwen3 attention, softmax MoE every layer */
    GEN_GLM4MOE,   /* biases, q/k norm, half RoPE, a dense lead layer, sigmoid MoE +
                      shared expert, one NextN (MTP) layer */
    GEN_NEMOTRON_H, /* per layer Mamba2, attention without RoPE or a ReLU^2 MLP */
    GEN_LFM2,      /* short convs and attention alternating, per-layer head_count_kv */
} gen_family;

typedef struct gen_arch {
    const char *name;
    genmodel_vocab_kind vocab;
    bool qkv_bias;   /* attn_{q,k,v}.bias (qwen2) */
    bool qk_norm;    /* attn_{q,k}_norm [head_dim] (qwen3) */
    bool post_norms; /* post_attention_norm, post_ffw_norm (gemma2) */
    bool tied;       /* no output.weight: logits use token_embd (gemma2) */
    bool gemma;      /* softcapping and sliding-window keys, scaled embeddings */
    float rope_base;
    float rms_eps;
    gen_family family;
} gen_arch;

static const gen_arch g_archs[] = {
    {"llama", GENMODEL_VOCAB_SPM, false, false, false, false, false, 10000.0f, 1e-5f, GEN_DENSE},
    {"qwen2", GENMODEL_VOCAB_BPE, true, false, false, false, false, 1000000.0f, 1e-6f, GEN_DENSE},
    {"qwen3", GENMODEL_VOCAB_BPE, false, true, false, false, false, 1000000.0f, 1e-6f, GEN_DENSE},
    {"gemma2", GENMODEL_VOCAB_SPM, false, false, true, true, true, 10000.0f, 1e-6f, GEN_DENSE},
    {"qwen35", GENMODEL_VOCAB_BPE, false, true, false, false, false, 10000000.0f, 1e-6f, GEN_QWEN35},
    {"qwen3next", GENMODEL_VOCAB_BPE, false, true, false, false, false, 10000000.0f, 1e-6f,
     GEN_QWEN3NEXT},
    {"mamba2", GENMODEL_VOCAB_SPM, false, false, false, true, false, 10000.0f, 1e-5f, GEN_MAMBA2},
    {"gpt-oss", GENMODEL_VOCAB_BPE, true, false, false, false, false, 150000.0f, 1e-5f, GEN_GPT_OSS},
    {"deepseek32", GENMODEL_VOCAB_SPM, false, false, false, false, false, 10000.0f, 1e-6f, GEN_DEEPSEEK32},
    /* gemma3: gemma2's dense block with q/k norm; base 1e6 for the global
     * layers (linear factor 8), freq_base_swa 10000 for the sliding ones */
    {"gemma3", GENMODEL_VOCAB_SPM, false, true, true, true, true, 1000000.0f, 1e-6f, GEN_DENSE},
    {"phi3", GENMODEL_VOCAB_SPM, false, false, false, false, false, 10000.0f, 1e-5f, GEN_PHI3},
    {"qwen3moe", GENMODEL_VOCAB_BPE, false, true, false, false, false, 1000000.0f, 1e-6f, GEN_QWEN3MOE},
    {"glm4moe", GENMODEL_VOCAB_BPE, true, true, false, false, false, 1000000.0f, 1e-5f, GEN_GLM4MOE},
    {"nemotron_h", GENMODEL_VOCAB_SPM, false, false, false, false, false, 10000.0f, 1e-5f, GEN_NEMOTRON_H},
    /* lfm2: q/k norm on the attention layers, tied output */
    {"lfm2", GENMODEL_VOCAB_SPM, false, true, false, true, false, 1000000.0f, 1e-5f, GEN_LFM2},
    {"deepseek2", GENMODEL_VOCAB_SPM, false, false, false, false, false, 10000.0f, 1e-6f, GEN_DEEPSEEK2},
};

/* glm4moe: GLM-4.5's routed weight scale */
#define GEN_GLM_EXPERT_SCALE 2.5f

/* nemotron_h's default layer pattern (repeated to n_layer): M Mamba2,
 * * attention, - MLP (llama.cpp's hybrid_override_pattern letters) */
#define GEN_NEMOTRON_H_PATTERN "M*-"

/* gemma3's global layers: linear RoPE scaling; phi3: LongRoPE's attention
 * factor sqrt(1 + ln 32 / ln 4096) (Phi-4-mini's) */
#define GEN_GEMMA3_ROPE_FACTOR 8.0f
#define GEN_GEMMA3_BASE_SWA    10000.0f
#define GEN_PHI3_ATTN_FACTOR   1.190238f

/* lfm2: layer l is attention iff l % 2 == 1 (conv first, as the fixture);
 * the conv's taps (LFM2's l_cache) */
#define GEN_LFM2_ATTN(l)       ((l) % 2 == 1)
#define GEN_LFM2_L_CACHE       3

#define GEN_FULL_ATTN_INTERVAL 4
#define GEN_CONV_KERNEL        4
#define GEN_YARN_FACTOR        32.0f

/* deepseek32 from head_dim D: q.k heads of D without and D with RoPE,
 * values D, ranks q_lora = kv_lora = 2D, 4 indexer heads of 2D (the
 * cache's K row is kv_lora + D = 3D, a multiple of 32 for D = 32: q8_0
 * caches work), layer 0 dense, shared expert of n_ff */
#define GEN_DS_IDX_HEADS   4
#define GEN_DS_TOP_K       16
#define GEN_DS_EXPERT_SCALE 2.5f

#define GEMMA2_ATTN_SOFTCAP  50.0f
#define GEMMA2_FINAL_SOFTCAP 30.0f
#define GEMMA2_DEFAULT_SWA   32

/* llama.cpp's LLAMA_FTYPE for a file whose matrices are all of dtype t. */
static uint32_t file_type(keel_dtype t)
{
    switch (t) {
    case KEEL_DTYPE_F32:
        return 0; /* ALL_F32 */
    case KEEL_DTYPE_F16:
        return 1; /* MOSTLY_F16 */
    case KEEL_DTYPE_Q4_0:
        return 2; /* MOSTLY_Q4_0 */
    case KEEL_DTYPE_Q4_1:
        return 3; /* MOSTLY_Q4_1 */
    case KEEL_DTYPE_Q8_0:
        return 7; /* MOSTLY_Q8_0 */
    case KEEL_DTYPE_Q5_0:
        return 8; /* MOSTLY_Q5_0 */
    case KEEL_DTYPE_Q5_1:
        return 9; /* MOSTLY_Q5_1 */
    case KEEL_DTYPE_Q4_K:
        return 14; /* MOSTLY_Q4_K_S */
    case KEEL_DTYPE_Q5_K:
        return 16; /* MOSTLY_Q5_K_S */
    case KEEL_DTYPE_Q6_K:
        return 18; /* MOSTLY_Q6_K */
    case KEEL_DTYPE_BF16:
        return 32; /* MOSTLY_BF16 */
    default:
        return UINT32_MAX;
    }
}

/* llama-quantize's K-quant mixes (llama.cpp src/llama-quant.cpp,
 * llama_tensor_get_type): the base type everywhere but the matrices that
 * get q6_K (apply_mix). */
typedef struct gen_mix {
    const char *name;
    keel_dtype base;
    uint32_t file_type; /* LLAMA_FTYPE */
} gen_mix;

static const gen_mix g_mixes[] = {
    {"q4_K_M", KEEL_DTYPE_Q4_K, 15}, /* MOSTLY_Q4_K_M */
    {"q5_K_M", KEEL_DTYPE_Q5_K, 17}, /* MOSTLY_Q5_K_M */
};

static const gen_mix *find_mix(const char *name)
{
    for (size_t i = 0; name && i < BASE_ARRAY_LEN(g_mixes); i++)
        if (strcmp(name, g_mixes[i].name) == 0) return &g_mixes[i];
    return NULL;
}

/* ---- the tensor list ------------------------------------------------------------ */

typedef enum gen_init {
    GEN_INIT_NORMAL, /* N(0, std) */
    GEN_INIT_NORM,   /* 1 + N(0, std) */
    GEN_INIT_NEG,    /* -(0.05 + |N(0, std)|): SSM decay rates A, negative */
} gen_init;

typedef struct gen_tensor {
    char name[64];
    uint32_t n_dims;
    int64_t ne[3]; /* ne[0] fastest (a row), then rows, then experts; 1 when absent */
    keel_dtype dtype;
    gen_init init;
    float std;
} gen_tensor;

typedef struct gen_model {
    const gen_arch *arch;
    const gen_mix *mix; /* p.mix's, or NULL */
    keel_gen_params p;  /* resolved: head_dim, n_ff, n_swa filled in */
    gen_tensor *t;     /* [n_t] in file order */
    int64_t n_t, cap_t;
    int64_t n_params;
    int64_t max_row; /* longest row (elements) */
    /* generation */
    base_pool *pool;
    int n_threads;
    float *scratch;       /* [n_threads][max_row] */
    keel_status *task_st; /* [n_threads] first failure per thread */
    char err[BASE_ERR_CAP];
} gen_model;

/* Weight dtype of a matrix with rows of n elements: the requested one, or
 * q8_0 / f16 when n is not a multiple of its block (llama.cpp's quantizer
 * also falls back per tensor). */
static keel_dtype matrix_dtype(keel_dtype want, int64_t n)
{
    if (n % keel_dtype_block_size(want) == 0) return want;
    if (n % keel_dtype_block_size(KEEL_DTYPE_Q8_0) == 0 && want != KEEL_DTYPE_F32 &&
        want != KEEL_DTYPE_F16 && want != KEEL_DTYPE_BF16)
        return KEEL_DTYPE_Q8_0;
    return KEEL_DTYPE_F16;
}

/* A tensor of ne0 x ne1 x ne2 (ne1, ne2 <= 0: absent). 2-D and 3-D tensors
 * are matrices in the requested dtype unless f32 is forced (vector-like
 * 2-D tensors: conv weights, per-expert biases, grouped norms). */
static void add_t3(gen_model *m, const char *name, int64_t ne0, int64_t ne1, int64_t ne2,
                   gen_init init, float std, bool f32)
{
    if (m->n_t >= m->cap_t) return; /* the cap covers every list (build checks the count) */
    gen_tensor *t = &m->t[m->n_t++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->n_dims = ne2 > 0 ? 3 : ne1 > 0 ? 2 : 1;
    t->ne[0] = ne0;
    t->ne[1] = ne1 > 0 ? ne1 : 1;
    t->ne[2] = ne2 > 0 ? ne2 : 1;
    t->dtype = t->n_dims >= 2 && !f32 ? matrix_dtype(m->p.dtype, ne0) : KEEL_DTYPE_F32;
    t->init = init;
    t->std = std;
    m->n_params += ne0 * t->ne[1] * t->ne[2];
    if (ne0 > m->max_row) m->max_row = ne0;
}

static void add_t(gen_model *m, const char *name, int64_t ne0, int64_t ne1, gen_init init,
                  float std)
{
    add_t3(m, name, ne0, ne1, 0, init, std, false);
}

static void add_blk(gen_model *m, int32_t l, const char *what, int64_t ne0, int64_t ne1,
                    gen_init init, float std)
{
    char name[64];
    snprintf(name, sizeof name, "blk.%d.%s", (int)l, what);
    add_t(m, name, ne0, ne1, init, std);
}

static void add_blk3(gen_model *m, int32_t l, const char *what, int64_t ne0, int64_t ne1,
                     int64_t ne2, gen_init init, float std, bool f32)
{
    char name[64];
    snprintf(name, sizeof name, "blk.%d.%s", (int)l, what);
    add_t3(m, name, ne0, ne1, ne2, init, std, f32);
}

#define NORM_STD 0.02f /* norms: 1 + N(0, 0.02); biases: N(0, 0.02) */

static float inv_sqrt(int64_t n)
{
    return (float)(1.0 / sqrt((double)n));
}

/* A deepseek32 or deepseek2 layer (shapes as the fixtures', from head_dim
 * D; deepseek2: no indexer, q LoRA of rank q_lora or none). */
static void list_deepseek32_layer(gen_model *m, int32_t l)
{
    const keel_gen_params *p = &m->p;
    int64_t E = p->n_embd, F = p->n_ff, D = p->head_dim, H = p->n_head, ne = p->n_expert;
    int64_t N = D, R = D, KL = 2 * D, QL = p->q_lora, VH = D, IH = GEN_DS_IDX_HEADS, ID = 2 * D;
    bool dsa = m->arch->family == GEN_DEEPSEEK32;
    add_blk(m, l, "attn_norm.weight", E, 0, GEN_INIT_NORM, NORM_STD);
    if (QL > 0) {
        add_blk(m, l, "attn_q_a.weight", E, QL, GEN_INIT_NORMAL, inv_sqrt(E));
        add_blk(m, l, "attn_q_a_norm.weight", QL, 0, GEN_INIT_NORM, NORM_STD);
        add_blk(m, l, "attn_q_b.weight", QL, H * (N + R), GEN_INIT_NORMAL, inv_sqrt(QL));
    } else {
        add_blk(m, l, "attn_q.weight", E, H * (N + R), GEN_INIT_NORMAL, inv_sqrt(E));
    }
    add_blk(m, l, "attn_kv_a_mqa.weight", E, KL + R, GEN_INIT_NORMAL, inv_sqrt(E));
    add_blk(m, l, "attn_kv_a_norm.weight", KL, 0, GEN_INIT_NORM, NORM_STD);
    add_blk3(m, l, "attn_k_b.weight", N, KL, H, GEN_INIT_NORMAL, inv_sqrt(N), false);
    add_blk3(m, l, "attn_v_b.weight", KL, VH, H, GEN_INIT_NORMAL, inv_sqrt(KL), false);
    add_blk(m, l, "attn_output.weight", H * VH, E, GEN_INIT_NORMAL, inv_sqrt(H * VH));
    if (dsa) {
        add_blk(m, l, "indexer.attn_q_b.weight", QL, IH * ID, GEN_INIT_NORMAL, inv_sqrt(QL));
        add_blk(m, l, "indexer.attn_k.weight", E, ID, GEN_INIT_NORMAL, inv_sqrt(E));
        add_blk(m, l, "indexer.k_norm.weight", ID, 0, GEN_INIT_NORM, NORM_STD);
        add_blk(m, l, "indexer.k_norm.bias", ID, 0, GEN_INIT_NORMAL, NORM_STD);
        add_blk(m, l, "indexer.proj.weight", E, IH, GEN_INIT_NORMAL, inv_sqrt(E));
    }
    add_blk(m, l, "ffn_norm.weight", E, 0, GEN_INIT_NORM, NORM_STD);
    if (l == 0) { /* leading_dense_block_count 1 */
        add_blk(m, l, "ffn_gate.weight", E, F, GEN_INIT_NORMAL, inv_sqrt(E));
        add_blk(m, l, "ffn_up.weight", E, F, GEN_INIT_NORMAL, inv_sqrt(E));
        add_blk(m, l, "ffn_down.weight", F, E, GEN_INIT_NORMAL, inv_sqrt(F));
        return;
    }
    add_blk(m, l, "ffn_gate_inp.weight", E, ne, GEN_INIT_NORMAL, inv_sqrt(E));
    if (p->gating == 2) add_blk(m, l, "exp_probs_b.bias", ne, 0, GEN_INIT_NORMAL, 0.1f);
    add_blk3(m, l, "ffn_gate_exps.weight", E, F, ne, GEN_INIT_NORMAL, inv_sqrt(E), false);
    add_blk3(m, l, "ffn_up_exps.weight", E, F, ne, GEN_INIT_NORMAL, inv_sqrt(E), false);
    add_blk3(m, l, "ffn_down_exps.weight", F, E, ne, GEN_INIT_NORMAL, inv_sqrt(F), false);
    add_blk(m, l, "ffn_gate_shexp.weight", E, F, GEN_INIT_NORMAL, inv_sqrt(E));
    add_blk(m, l, "ffn_up_shexp.weight", E, F, GEN_INIT_NORMAL, inv_sqrt(E));
    add_blk(m, l, "ffn_down_shexp.weight", F, E, GEN_INIT_NORMAL, inv_sqrt(F));
}

/* A qwen3moe or glm4moe layer; glm4moe's layer n_layer is its NextN
 * (MTP) block: a MoE layer plus the nextn tensors. */
static void list_moe_layer(gen_model *m, int32_t l)
{
    const gen_arch *a = m->arch;
    const keel_gen_params *p = &m->p;
    int64_t E = p->n_embd, F = p->n_ff, Fe = p->n_ff_exp, D = p->head_dim, ne = p->n_expert;
    int64_t Q = (int64_t)p->n_head * D, KV = (int64_t)p->n_head_kv * D;
    bool glm = a->family == GEN_GLM4MOE;
    add_blk(m, l, "attn_norm.weight", E, 0, GEN_INIT_NORM, NORM_STD);
    add_blk(m, l, "attn_q.weight", E, Q, GEN_INIT_NORMAL, inv_sqrt(E));
    if (a->qkv_bias) add_blk(m, l, "attn_q.bias", Q, 0, GEN_INIT_NORMAL, NORM_STD);
    add_blk(m, l, "attn_k.weight", E, KV, GEN_INIT_NORMAL, inv_sqrt(E));
    if (a->qkv_bias) add_blk(m, l, "attn_k.bias", KV, 0, GEN_INIT_NORMAL, NORM_STD);
    add_blk(m, l, "attn_v.weight", E, KV, GEN_INIT_NORMAL, inv_sqrt(E));
    if (a->qkv_bias) add_blk(m, l, "attn_v.bias", KV, 0, GEN_INIT_NORMAL, NORM_STD);
    add_blk(m, l, "attn_q_norm.weight", D, 0, GEN_INIT_NORM, NORM_STD);
    add_blk(m, l, "attn_k_norm.weight", D, 0, GEN_INIT_NORM, NORM_STD);
    add_blk(m, l, "attn_output.weight", Q, E, GEN_INIT_NORMAL, inv_sqrt(Q));
    add_blk(m, l, glm ? "post_attention_norm.weight" : "ffn_norm.weight", E, 0, GEN_INIT_NORM, NORM_STD);
    if (glm && l == 0 && p->n_layer > 1) { /* leading_dense_block_count 1 */
        add_blk(m, l, "ffn_gate.weight", E, F, GEN_INIT_NORMAL, inv_sqrt(E));
        add_blk(m, l, "ffn_up.weight", E, F, GEN_INIT_NORMAL, inv_sqrt(E));
        add_blk(m, l, "ffn_down.weight", F, E, GEN_INIT_NORMAL, inv_sqrt(F));
        return;
    }
    add_blk(m, l, "ffn_gate_inp.weight", E, ne, GEN_INIT_NORMAL, inv_sqrt(E));
    if (glm) add_blk(m, l, "exp_probs_b.bias", ne, 0, GEN_INIT_NORMAL, 0.1f);
    add_blk3(m, l, "ffn_gate_exps.weight", E, Fe, ne, GEN_INIT_NORMAL, inv_sqrt(E), false);
    add_blk3(m, l, "ffn_up_exps.weight", E, Fe, ne, GEN_INIT_NORMAL, inv_sqrt(E), false);
    add_blk3(m, l, "ffn_down_exps.weight", Fe, E, ne, GEN_INIT_NORMAL, inv_sqrt(Fe), false);
    if (!glm) return;
    add_blk(m, l, "ffn_gate_shexp.weight", E, Fe, GEN_INIT_NORMAL, inv_sqrt(E));
    add_blk(m, l, "ffn_up_shexp.weight", E, Fe, GEN_INIT_NORMAL, inv_sqrt(E));
    add_blk(m, l, "ffn_down_shexp.weight", Fe, E, GEN_INIT_NORMAL, inv_sqrt(Fe));
    if (l < p->n_layer) return;
    add_blk(m, l, "nextn.eh_proj.weight", 2 * E, E, GEN_INIT_NORMAL, inv_sqrt(2 * E));
    add_blk(m, l, "nextn.enorm.weight", E, 0, GEN_INIT_NORM, NORM_STD);
    add_blk(m, l, "nextn.hnorm.weight", E, 0, GEN_INIT_NORM, NORM_STD);
    add_blk(m, l, "nextn.shared_head_norm.weight", E, 0, GEN_INIT_NORM, NORM_STD);
}

/* Rotated dims per head: qwen35 / qwen3next a quarter (llama.cpp's
 * partial_rotary_factor 0.25), phi3 three quarters (Phi-4-mini's), else
 * all; even. */
static int64_t gen_n_rot(const gen_model *m)
{
    gen_family f = m->arch->family;
    int32_t D = m->p.head_dim;
    if (f == GEN_QWEN35 || f == GEN_QWEN3NEXT) return (D / 4) & ~1;
    if (f == GEN_PHI3) return (3 * D / 4) & ~1;
    if (f == GEN_GLM4MOE) return (D / 2) & ~1; /* GLM's partial_rotary_factor 0.5 */
    return D;
}

/* nemotron_h: layer l's letter of the pattern (repeated). */
static char nemotron_kind(const gen_model *m, int32_t l)
{
    const char *pat = m->p.layer_pattern;
    return pat[(size_t)l % strlen(pat)];
}

/* A Mamba2 mixer's tensors (mamba2, nemotron_h's Mamba2 layers): d_inner
 * 2 n_embd, n_head heads in n_head_kv groups of ssm_state. */
static void list_mamba2_mixer(gen_model *m, int32_t l)
{
    const keel_gen_params *p = &m->p;
    int64_t E = p->n_embd;
    int64_t Din = 2 * E, H = p->n_head, G = p->n_head_kv, N = p->ssm_state;
    int64_t C = Din + 2 * G * N;
    add_blk(m, l, "ssm_in.weight", E, Din + C + H, GEN_INIT_NORMAL, inv_sqrt(E));
    add_blk3(m, l, "ssm_conv1d.weight", GEN_CONV_KERNEL, C, 0, GEN_INIT_NORMAL, 0.3f, true);
    add_blk(m, l, "ssm_conv1d.bias", C, 0, GEN_INIT_NORMAL, NORM_STD);
    add_blk(m, l, "ssm_dt.bias", H, 0, GEN_INIT_NORMAL, 0.5f);
    add_blk3(m, l, "ssm_a", 1, H, 0, GEN_INIT_NEG, 1.0f, true);
    add_blk3(m, l, "ssm_d", 1, H, 0, GEN_INIT_NORM, 0.1f, true);
    add_blk3(m, l, "ssm_norm.weight", Din / G, G, 0, GEN_INIT_NORM, NORM_STD, true);
    add_blk(m, l, "ssm_out.weight", Din, E, GEN_INIT_NORMAL, inv_sqrt(Din));
}

/* A nemotron_h layer: attn_norm, then Mamba2 (mamba2's shapes: d_inner
 * 2 n_embd in n_head heads and n_head_kv groups), attention (n_head /
 * n_head_kv heads of head_dim, no RoPE) or a ReLU^2 MLP of n_ff. */
static void list_nemotron_h_layer(gen_model *m, int32_t l)
{
    const keel_gen_params *p = &m->p;
    int64_t E = p->n_embd, F = p->n_ff, D = p->head_dim;
    int64_t Q = (int64_t)p->n_head * D, KV = (int64_t)p->n_head_kv * D;
    add_blk(m, l, "attn_norm.weight", E, 0, GEN_INIT_NORM, NORM_STD);
    char k = nemotron_kind(m, l);
    if (k == '*') {
        add_blk(m, l, "attn_q.weight", E, Q, GEN_INIT_NORMAL, inv_sqrt(E));
        add_blk(m, l, "attn_k.weight", E, KV, GEN_INIT_NORMAL, inv_sqrt(E));
        add_blk(m, l, "attn_v.weight", E, KV, GEN_INIT_NORMAL, inv_sqrt(E));
        add_blk(m, l, "attn_output.weight", Q, E, GEN_INIT_NORMAL, inv_sqrt(Q));
    } else if (k == '-') {
        add_blk(m, l, "ffn_up.weight", E, F, GEN_INIT_NORMAL, inv_sqrt(E));
        add_blk(m, l, "ffn_down.weight", F, E, GEN_INIT_NORMAL, inv_sqrt(F));
    } else {
        list_mamba2_mixer(m, l);
    }
}

/* The layers of the issue 11 families (list_tensors does the dense ones). */
static void list_family_layer(gen_model *m, int32_t l)
{
    const gen_arch *a = m->arch;
    const keel_gen_params *p = &m->p;
    int64_t E = p->n_embd, F = p->n_ff, D = p->head_dim, ne = p->n_expert;
    int64_t Q = (int64_t)p->n_head * D, KV = (int64_t)p->n_head_kv * D;
    if (a->family == GEN_DEEPSEEK32 || a->family == GEN_DEEPSEEK2) {
        list_deepseek32_layer(m, l);
        return;
    }
    if (a->family == GEN_QWEN3MOE || a->family == GEN_GLM4MOE) {
        list_moe_layer(m, l);
        return;
    }
    if (a->family == GEN_NEMOTRON_H) {
        list_nemotron_h_layer(m, l);
        return;
    }
    add_blk(m, l, "attn_norm.weight", E, 0, GEN_INIT_NORM, NORM_STD);
    if (a->family == GEN_LFM2) {
        if (GEN_LFM2_ATTN(l)) {
            add_blk(m, l, "attn_q.weight", E, Q, GEN_INIT_NORMAL, inv_sqrt(E));
            add_blk(m, l, "attn_k.weight", E, KV, GEN_INIT_NORMAL, inv_sqrt(E));
            add_blk(m, l, "attn_v.weight", E, KV, GEN_INIT_NORMAL, inv_sqrt(E));
            add_blk(m, l, "attn_q_norm.weight", D, 0, GEN_INIT_NORM, NORM_STD);
            add_blk(m, l, "attn_k_norm.weight", D, 0, GEN_INIT_NORM, NORM_STD);
            add_blk(m, l, "attn_output.weight", Q, E, GEN_INIT_NORMAL, inv_sqrt(Q));
        } else { /* in_proj rows [B | C | x]; conv [n_embd][l_cache] */
            add_blk(m, l, "shortconv.in_proj.weight", E, 3 * E, GEN_INIT_NORMAL, inv_sqrt(E));
            add_blk3(m, l, "shortconv.conv.weight", GEN_LFM2_L_CACHE, E, 0, GEN_INIT_NORMAL, 0.3f, true);
            add_blk(m, l, "shortconv.out_proj.weight", E, E, GEN_INIT_NORMAL, inv_sqrt(E));
        }
        add_blk(m, l, "ffn_norm.weight", E, 0, GEN_INIT_NORM, NORM_STD);
        add_blk(m, l, "ffn_gate.weight", E, F, GEN_INIT_NORMAL, inv_sqrt(E));
        add_blk(m, l, "ffn_up.weight", E, F, GEN_INIT_NORMAL, inv_sqrt(E));
        add_blk(m, l, "ffn_down.weight", F, E, GEN_INIT_NORMAL, inv_sqrt(F));
        return;
    }
    if (a->family == GEN_PHI3) { /* rows [q | k | v] and [gate | up] */
        add_blk(m, l, "attn_qkv.weight", E, Q + 2 * KV, GEN_INIT_NORMAL, inv_sqrt(E));
        add_blk(m, l, "attn_output.weight", Q, E, GEN_INIT_NORMAL, inv_sqrt(Q));
        add_blk(m, l, "ffn_norm.weight", E, 0, GEN_INIT_NORM, NORM_STD);
        add_blk(m, l, "ffn_up.weight", E, 2 * F, GEN_INIT_NORMAL, inv_sqrt(E));
        add_blk(m, l, "ffn_down.weight", F, E, GEN_INIT_NORMAL, inv_sqrt(F));
        return;
    }
    if (a->family == GEN_MAMBA2) {
        list_mamba2_mixer(m, l);
        return;
    }
    bool gdn = a->family == GEN_QWEN35 || a->family == GEN_QWEN3NEXT;
    if (gdn) add_blk(m, l, "post_attention_norm.weight", E, 0, GEN_INIT_NORM, NORM_STD);
    if (gdn && (l + 1) % GEN_FULL_ATTN_INTERVAL != 0) {
        int64_t nv = p->n_head, nk = p->n_head_kv, Vd = nv * D, C = 2 * nk * D + Vd;
        add_blk(m, l, "attn_qkv.weight", E, C, GEN_INIT_NORMAL, inv_sqrt(E));
        add_blk(m, l, "attn_gate.weight", E, Vd, GEN_INIT_NORMAL, inv_sqrt(E));
        add_blk3(m, l, "ssm_conv1d.weight", GEN_CONV_KERNEL, C, 0, GEN_INIT_NORMAL, 0.3f, true);
        add_blk(m, l, "ssm_dt.bias", nv, 0, GEN_INIT_NORMAL, 0.5f);
        add_blk(m, l, "ssm_a", nv, 0, GEN_INIT_NEG, 0.5f);
        if (a->family == GEN_QWEN3NEXT) {
            add_blk(m, l, "ssm_ba.weight", E, 2 * nv, GEN_INIT_NORMAL, inv_sqrt(E));
        } else {
            add_blk(m, l, "ssm_beta.weight", E, nv, GEN_INIT_NORMAL, inv_sqrt(E));
            add_blk(m, l, "ssm_alpha.weight", E, nv, GEN_INIT_NORMAL, inv_sqrt(E));
        }
        add_blk(m, l, "ssm_norm.weight", D, 0, GEN_INIT_NORM, NORM_STD);
        add_blk(m, l, "ssm_out.weight", Vd, E, GEN_INIT_NORMAL, inv_sqrt(Vd));
    } else {
        add_blk(m, l, "attn_q.weight", E, gdn ? 2 * Q : Q, GEN_INIT_NORMAL, inv_sqrt(E));
        if (a->qkv_bias) add_blk(m, l, "attn_q.bias", Q, 0, GEN_INIT_NORMAL, NORM_STD);
        add_blk(m, l, "attn_k.weight", E, KV, GEN_INIT_NORMAL, inv_sqrt(E));
        if (a->qkv_bias) add_blk(m, l, "attn_k.bias", KV, 0, GEN_INIT_NORMAL, NORM_STD);
        add_blk(m, l, "attn_v.weight", E, KV, GEN_INIT_NORMAL, inv_sqrt(E));
        if (a->qkv_bias) add_blk(m, l, "attn_v.bias", KV, 0, GEN_INIT_NORMAL, NORM_STD);
        if (a->qk_norm) {
            add_blk(m, l, "attn_q_norm.weight", D, 0, GEN_INIT_NORM, NORM_STD);
            add_blk(m, l, "attn_k_norm.weight", D, 0, GEN_INIT_NORM, NORM_STD);
        }
        add_blk(m, l, "attn_output.weight", Q, E, GEN_INIT_NORMAL, inv_sqrt(Q));
        if (a->family == GEN_GPT_OSS) {
            add_blk(m, l, "attn_output.bias", E, 0, GEN_INIT_NORMAL, NORM_STD);
            add_blk(m, l, "attn_sinks.weight", p->n_head, 0, GEN_INIT_NORMAL, 1.0f);
        }
    }
    if (a->family == GEN_GPT_OSS) add_blk(m, l, "post_attention_norm.weight", E, 0, GEN_INIT_NORM, NORM_STD);
    if (a->family == GEN_QWEN35) {
        add_blk(m, l, "ffn_gate.weight", E, F, GEN_INIT_NORMAL, inv_sqrt(E));
        add_blk(m, l, "ffn_up.weight", E, F, GEN_INIT_NORMAL, inv_sqrt(E));
        add_blk(m, l, "ffn_down.weight", F, E, GEN_INIT_NORMAL, inv_sqrt(F));
        return;
    }
    bool eb = a->family == GEN_GPT_OSS;
    add_blk(m, l, "ffn_gate_inp.weight", E, ne, GEN_INIT_NORMAL, inv_sqrt(E));
    if (eb) add_blk(m, l, "ffn_gate_inp.bias", ne, 0, GEN_INIT_NORMAL, NORM_STD);
    add_blk3(m, l, "ffn_gate_exps.weight", E, F, ne, GEN_INIT_NORMAL, inv_sqrt(E), false);
    if (eb) add_blk3(m, l, "ffn_gate_exps.bias", F, ne, 0, GEN_INIT_NORMAL, NORM_STD, true);
    add_blk3(m, l, "ffn_up_exps.weight", E, F, ne, GEN_INIT_NORMAL, inv_sqrt(E), false);
    if (eb) add_blk3(m, l, "ffn_up_exps.bias", F, ne, 0, GEN_INIT_NORMAL, NORM_STD, true);
    add_blk3(m, l, "ffn_down_exps.weight", F, E, ne, GEN_INIT_NORMAL, inv_sqrt(F), false);
    if (eb) add_blk3(m, l, "ffn_down_exps.bias", E, ne, 0, GEN_INIT_NORMAL, NORM_STD, true);
    if (a->family == GEN_QWEN3NEXT) {
        add_blk(m, l, "ffn_gate_inp_shexp.weight", E, 0, GEN_INIT_NORMAL, inv_sqrt(E));
        add_blk(m, l, "ffn_gate_shexp.weight", E, F, GEN_INIT_NORMAL, inv_sqrt(E));
        add_blk(m, l, "ffn_up_shexp.weight", E, F, GEN_INIT_NORMAL, inv_sqrt(E));
        add_blk(m, l, "ffn_down_shexp.weight", F, E, GEN_INIT_NORMAL, inv_sqrt(F));
    }
}

/* block_count: the layers, and glm4moe's NextN layer. */
static int32_t gen_blocks(const gen_model *m)
{
    return m->p.n_layer + (m->arch->family == GEN_GLM4MOE ? 1 : 0);
}

/* Lists every tensor (m->t must hold tensor_count entries). */
static void list_tensors(gen_model *m)
{
    const gen_arch *a = m->arch;
    const keel_gen_params *p = &m->p;
    int64_t E = p->n_embd, V = p->n_vocab, F = p->n_ff, D = p->head_dim;
    int64_t Q = (int64_t)p->n_head * D, KV = (int64_t)p->n_head_kv * D;
    add_t(m, "token_embd.weight", E, V, GEN_INIT_NORMAL, a->gemma ? inv_sqrt(E) : 1.0f);
    /* lfm2's final norm is named token_embd_norm (llama.cpp's quirk) */
    add_t(m, a->family == GEN_LFM2 ? "token_embd_norm.weight" : "output_norm.weight", E, 0, GEN_INIT_NORM,
          NORM_STD);
    if (!a->tied) add_t(m, "output.weight", E, V, GEN_INIT_NORMAL, inv_sqrt(E));
    if (a->family == GEN_PHI3) { /* LongRoPE factors, 1 + N(0, 0.02) */
        add_t(m, "rope_factors_short.weight", gen_n_rot(m) / 2, 0, GEN_INIT_NORM, NORM_STD);
        add_t(m, "rope_factors_long.weight", gen_n_rot(m) / 2, 0, GEN_INIT_NORM, NORM_STD);
    }
    for (int32_t l = 0; l < gen_blocks(m) && a->family != GEN_DENSE; l++) list_family_layer(m, l);
    for (int32_t l = 0; l < p->n_layer && a->family == GEN_DENSE; l++) {
        add_blk(m, l, "attn_norm.weight", E, 0, GEN_INIT_NORM, NORM_STD);
        add_blk(m, l, "attn_q.weight", E, Q, GEN_INIT_NORMAL, inv_sqrt(E));
        if (a->qkv_bias) add_blk(m, l, "attn_q.bias", Q, 0, GEN_INIT_NORMAL, NORM_STD);
        add_blk(m, l, "attn_k.weight", E, KV, GEN_INIT_NORMAL, inv_sqrt(E));
        if (a->qkv_bias) add_blk(m, l, "attn_k.bias", KV, 0, GEN_INIT_NORMAL, NORM_STD);
        add_blk(m, l, "attn_v.weight", E, KV, GEN_INIT_NORMAL, inv_sqrt(E));
        if (a->qkv_bias) add_blk(m, l, "attn_v.bias", KV, 0, GEN_INIT_NORMAL, NORM_STD);
        if (a->qk_norm) {
            add_blk(m, l, "attn_q_norm.weight", D, 0, GEN_INIT_NORM, NORM_STD);
            add_blk(m, l, "attn_k_norm.weight", D, 0, GEN_INIT_NORM, NORM_STD);
        }
        add_blk(m, l, "attn_output.weight", Q, E, GEN_INIT_NORMAL, inv_sqrt(Q));
        if (a->post_norms)
            add_blk(m, l, "post_attention_norm.weight", E, 0, GEN_INIT_NORM, NORM_STD);
        add_blk(m, l, "ffn_norm.weight", E, 0, GEN_INIT_NORM, NORM_STD);
        add_blk(m, l, "ffn_gate.weight", E, F, GEN_INIT_NORMAL, inv_sqrt(E));
        add_blk(m, l, "ffn_up.weight", E, F, GEN_INIT_NORMAL, inv_sqrt(E));
        add_blk(m, l, "ffn_down.weight", F, E, GEN_INIT_NORMAL, inv_sqrt(F));
        if (a->post_norms) add_blk(m, l, "post_ffw_norm.weight", E, 0, GEN_INIT_NORM, NORM_STD);
    }
}

/* llama.cpp's use_more_bits: the first and last eighth of n and every
 * third in between. */
static bool more_bits(int64_t i, int64_t n)
{
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

/* A matrix llama-quantize types, and so counts: 2-D or more, named *.weight. */
static bool mix_typed(const gen_tensor *t)
{
    size_t len = strlen(t->name);
    return t->n_dims >= 2 && len >= 7 && strcmp(t->name + len - 7, ".weight") == 0;
}

/* llama.cpp's attn_v-like tensors (category_is_attn_v) */
static bool attn_v_like(const char *nm)
{
    return strstr(nm, "attn_v.weight") || strstr(nm, "attn_qkv.weight") || strstr(nm, "attn_kv_b.weight");
}

/* The mix's q6_K matrices (m->mix set): the output (token_embd when
 * tied); attn_v-like matrices by their index among them (more_bits of
 * their count); ffn_down matrices by their index among them against the
 * block count, or in MoE models by the layer in their name, as llama.cpp
 * counts them; q4_K_M's attention outputs of 8-expert models in q5_K.
 * Matrices in a fallback dtype (rows not a multiple of 256) keep it. */
static void apply_mix(gen_model *m)
{
    const gen_mix *x = m->mix;
    if (!x) return;
    int64_t n_wv = 0, i_wv = 0, i_down = 0;
    bool moe = false;
    for (int64_t i = 0; i < m->n_t; i++) {
        n_wv += mix_typed(&m->t[i]) && attn_v_like(m->t[i].name);
        moe |= strstr(m->t[i].name, "_exps") != NULL;
    }
    for (int64_t i = 0; i < m->n_t; i++) {
        gen_tensor *t = &m->t[i];
        const char *nm = t->name;
        if (!mix_typed(t)) continue;
        bool bump = false;
        if (strcmp(nm, "output.weight") == 0 || (m->arch->tied && strcmp(nm, "token_embd.weight") == 0)) {
            bump = true;
        } else if (attn_v_like(nm)) {
            bump = more_bits(i_wv++, n_wv);
        } else if (strstr(nm, "ffn_down")) {
            int layer = -1;
            if (moe && sscanf(nm, "blk.%d.", &layer) != 1) layer = -1;
            bump = more_bits(moe ? layer : i_down, gen_blocks(m));
            i_down++;
        } else if (strstr(nm, "attn_output.weight") && x->base == KEEL_DTYPE_Q4_K && moe && m->p.n_expert == 8) {
            /* llama.cpp: Q4_K_M attention outputs of 8-expert models in q5_K */
            if (t->dtype == x->base) t->dtype = KEEL_DTYPE_Q5_K;
        }
        if (bump && t->dtype == x->base) t->dtype = KEEL_DTYPE_Q6_K;
    }
}

/* An upper bound of the tensor count (list_tensors stops at it; build
 * checks the list fits). */
static int64_t tensor_count(const gen_model *m)
{
    const gen_arch *a = m->arch;
    int64_t per = 9 + (a->qkv_bias ? 3 : 0) + (a->qk_norm ? 2 : 0) + (a->post_norms ? 2 : 0);
    if (a->family != GEN_DENSE) per = 32;
    return 5 + per * gen_blocks(m); /* token_embd, output_norm, output, 2 rope factors */
}

/* ---- parameters -------------------------------------------------------------------- */

static keel_status check_range(char *err, const char *field, int64_t v, int64_t lo, int64_t hi)
{
    if (v < lo || v > hi)
        return base_err(err, KEEL_EINVAL, "%s = %" PRId64 " outside [%" PRId64 ", %" PRId64 "]",
                        field, v, lo, hi);
    return KEEL_OK;
}

/* deepseek32 / deepseek2: q LoRA (deepseek32 always has it), expert
 * groups, gating, YaRN; defaults resolved into m->p. */
static keel_status resolve_deepseek(gen_model *m, char *err)
{
    keel_gen_params *q = &m->p;
    gen_family fam = m->arch->family;
    keel_status st;
    if ((st = check_range(err, "q_lora", q->q_lora, -1, 1 << 16)) ||
        (st = check_range(err, "gating", q->gating, 0, 2)) ||
        (st = check_range(err, "n_expert_groups", q->n_expert_groups, -1, 256)) ||
        (st = check_range(err, "n_group_used", q->n_group_used, 0, 256)))
        return st;
    if (!(q->yarn_factor >= 0.0f && q->yarn_factor <= 1e6f) || !(q->yarn_log_mul >= 0.0f && q->yarn_log_mul <= 10.0f))
        return base_err(err, KEEL_EINVAL, "yarn_factor = %g / yarn_log_mul = %g: need [0, 1e6] / [0, 10]",
                        (double)q->yarn_factor, (double)q->yarn_log_mul);
    if (fam != GEN_DEEPSEEK2) {
        if (fam == GEN_DEEPSEEK32) { /* the indexer reads the q LoRA: always on, sigmoid, no groups */
            q->q_lora = 2 * q->head_dim;
            q->gating = 2;
        } else {
            q->yarn_factor = q->yarn_log_mul = 0.0f;
        }
        q->n_expert_groups = q->n_group_used = 0;
        return KEEL_OK;
    }
    if (q->q_lora == 0) q->q_lora = 2 * q->head_dim;
    if (q->q_lora < 0) q->q_lora = 0;
    if (q->gating == 0) q->gating = 2;
    int32_t ne = q->n_expert;
    if (q->n_expert_groups == 0) q->n_expert_groups = ne >= 4 && ne % 2 == 0 ? ne / 2 : 1;
    if (q->n_expert_groups < 0) q->n_expert_groups = 1;
    int32_t G = q->n_expert_groups;
    if (G > 1) {
        if (q->n_group_used == 0) q->n_group_used = BASE_MAX(1, G / 2);
        if (ne % G || ne / G < 2 || q->n_group_used >= G || q->n_expert_used > q->n_group_used * (ne / G))
            return base_err(err, KEEL_EINVAL,
                            "n_expert_groups = %d, n_group_used = %d: need groups of 2 or more of the %d "
                            "experts, fewer groups used than groups, room for %d experts used",
                            G, q->n_group_used, ne, q->n_expert_used);
    } else {
        q->n_group_used = 0;
    }
    return KEEL_OK;
}

/* Validates p and resolves defaults into m->p. */
static keel_status resolve(const keel_gen_params *p, gen_model *m, char *err)
{
    keel_status st;
    if (!p) return base_err(err, KEEL_EINVAL, "params is NULL");
    if (!p->arch) return base_err(err, KEEL_EINVAL, "arch is NULL");
    for (size_t i = 0; i < BASE_ARRAY_LEN(g_archs); i++)
        if (strcmp(p->arch, g_archs[i].name) == 0) m->arch = &g_archs[i];
    if (!m->arch)
        return base_err(err, KEEL_EUNSUPPORTED,
                        "arch '%.64s' not supported (llama, qwen2, qwen3, gemma2, qwen35, "
                        "qwen3next, mamba2, gpt-oss, deepseek32, gemma3, phi3, qwen3moe, glm4moe, "
                        "nemotron_h, lfm2, deepseek2)",
                        p->arch);
    m->p = *p;
    keel_gen_params *q = &m->p;
    if ((st = check_range(err, "n_layer", q->n_layer, 1, GEN_MAX_LAYER)) ||
        (st = check_range(err, "n_embd", q->n_embd, 1, GEN_MAX_EMBD)) ||
        (st = check_range(err, "n_head", q->n_head, 1, GEN_MAX_HEAD)) ||
        (st = check_range(err, "n_head_kv", q->n_head_kv, 1, q->n_head)))
        return st;
    if (q->n_head % q->n_head_kv != 0)
        return base_err(err, KEEL_EINVAL, "n_head = %d is not a multiple of n_head_kv = %d",
                        q->n_head, q->n_head_kv);
    if (q->head_dim == 0) {
        if (q->n_embd % q->n_head != 0)
            return base_err(err, KEEL_EINVAL,
                            "head_dim = 0 needs n_embd (%d) divisible by n_head (%d); set head_dim",
                            q->n_embd, q->n_head);
        q->head_dim = q->n_embd / q->n_head;
    }
    if ((st = check_range(err, "head_dim", q->head_dim, 2, GEN_MAX_HEAD_DIM))) return st;
    if (q->head_dim % 2 != 0)
        return base_err(err, KEEL_EINVAL, "head_dim = %d is odd (RoPE rotates pairs)", q->head_dim);
    if (q->n_ff == 0) q->n_ff = 3 * q->n_embd;
    if ((st = check_range(err, "n_ff", q->n_ff, 1, GEN_MAX_FF)) ||
        (st = check_range(err, "n_vocab", q->n_vocab, GENMODEL_MIN_VOCAB, GENMODEL_MAX_VOCAB)) ||
        (st = check_range(err, "n_ctx", q->n_ctx, 1, GEN_MAX_CTX)) ||
        (st = check_range(err, "n_swa", q->n_swa, 0, GEN_MAX_CTX)))
        return st;
    if (m->arch->gemma && q->n_swa == 0) q->n_swa = GEMMA2_DEFAULT_SWA;
    gen_family fam = m->arch->family;
    if (fam == GEN_GPT_OSS && q->n_swa == 0) q->n_swa = GEMMA2_DEFAULT_SWA;
    if ((st = check_range(err, "n_expert", q->n_expert, 0, 256)) ||
        (st = check_range(err, "n_expert_used", q->n_expert_used, 0, q->n_expert ? q->n_expert : 4)) ||
        (st = check_range(err, "ssm_state", q->ssm_state, 0, 4096)))
        return st;
    bool moe2 = fam == GEN_QWEN3MOE || fam == GEN_GLM4MOE;
    if (fam == GEN_DEEPSEEK2 && q->n_expert == 0) q->n_expert = 8;
    if (fam == GEN_QWEN3NEXT || fam == GEN_GPT_OSS || fam == GEN_DEEPSEEK32 || fam == GEN_DEEPSEEK2 || moe2) {
        if (q->n_expert == 0) q->n_expert = 4;
        if (q->n_expert_used == 0) q->n_expert_used = BASE_MIN(2, q->n_expert);
    }
    if ((st = check_range(err, "top_k", q->top_k, 0, 1 << 20)) ||
        (st = check_range(err, "n_ff_exp", q->n_ff_exp, 0, GEN_MAX_FF)))
        return st;
    if (q->n_ff_exp == 0) q->n_ff_exp = q->n_ff;
    if (fam == GEN_GLM4MOE && q->head_dim < 4)
        return base_err(err, KEEL_EINVAL, "head_dim = %d: glm4moe needs >= 4 (rotary dims are head_dim / 2)",
                        q->head_dim);
    if (fam == GEN_DEEPSEEK32) {
        if (q->top_k == 0) q->top_k = GEN_DS_TOP_K;
        /* the indexer key (2 head_dim) is Hadamard-rotated in blocks of >= 32 */
        if (q->head_dim < 16 || (2 * q->head_dim) % 32)
            return base_err(err, KEEL_EINVAL,
                            "head_dim = %d: deepseek32 needs a multiple of 16 (indexer keys of 2 head_dim "
                            "are rotated in blocks of 32 or more)",
                            q->head_dim);
    }
    bool ssm = fam == GEN_MAMBA2 || fam == GEN_NEMOTRON_H;
    if (ssm && q->ssm_state == 0) q->ssm_state = 32;
    if (fam == GEN_NEMOTRON_H) {
        if (!q->layer_pattern) q->layer_pattern = GEN_NEMOTRON_H_PATTERN;
        size_t n = strlen(q->layer_pattern);
        if (n == 0 || n > GEN_MAX_LAYER || strspn(q->layer_pattern, "M*-") != n)
            return base_err(err, KEEL_EINVAL,
                            "layer_pattern '%.64s': 1 to %d letters M (Mamba2), * (attention), - (MLP)",
                            q->layer_pattern, GEN_MAX_LAYER);
    }
    if ((st = resolve_deepseek(m, err))) return st;
    if ((fam == GEN_QWEN35 || fam == GEN_QWEN3NEXT) && q->head_dim < 8)
        return base_err(err, KEEL_EINVAL, "head_dim = %d: %s needs >= 8 (rotary dims are head_dim / 4)",
                        q->head_dim, m->arch->name);
    if (fam == GEN_PHI3 && q->head_dim < 4)
        return base_err(err, KEEL_EINVAL, "head_dim = %d: phi3 needs >= 4 (rotary dims are 3/4 of it)",
                        q->head_dim);
    if (ssm && (q->n_head % q->n_head_kv != 0 || (2 * q->n_embd) % q->n_head != 0))
        return base_err(err, KEEL_EINVAL,
                        "%s: n_head = %d (heads) must divide 2 * n_embd = %d and be a multiple of "
                        "n_head_kv = %d (groups)",
                        m->arch->name, q->n_head, 2 * q->n_embd, q->n_head_kv);
    if (!keel_dtype_name(q->dtype))
        return base_err(err, KEEL_EINVAL, "dtype = %d is not a known type", (int)q->dtype);
    m->mix = find_mix(q->mix);
    if (q->mix && !m->mix)
        return base_err(err, KEEL_EINVAL, "mix '%.32s' unknown (q4_K_M, q5_K_M)", q->mix);
    if (m->mix && q->dtype != m->mix->base)
        return base_err(err, KEEL_EINVAL, "mix %s needs dtype %s (not %s)", q->mix,
                        keel_dtype_name(m->mix->base), keel_dtype_name(q->dtype));
    if (file_type(q->dtype) == UINT32_MAX || !keel_dtype_can_quantize(q->dtype))
        return base_err(err, KEEL_EUNSUPPORTED,
                        "dtype = %s cannot be generated (f32, f16, bf16, q8_0, q4_0, q4_1, "
                        "q5_0, q5_1, q4_K, q5_K, q6_K)",
                        keel_dtype_name(q->dtype));
    /* Parameter count in checked arithmetic: every factor is bounded
     * above, but products of them are not small. */
    int64_t E = q->n_embd, V = q->n_vocab, F = q->n_ff, D = q->head_dim, L = q->n_layer;
    int64_t Q = q->n_head * D, KV = q->n_head_kv * D, per, glob, total;
    if (__builtin_mul_overflow(E, 2 * Q + 2 * KV + 3 * F, &per) ||
        __builtin_add_overflow(per, 6 * E + Q + 2 * KV + 2 * D, &per) ||
        __builtin_mul_overflow(per, L, &total) || __builtin_mul_overflow(E, 2 * V, &glob) ||
        __builtin_add_overflow(total, glob + E, &total) || total > GEN_MAX_PARAMS)
        return base_err(err, KEEL_EINVAL, "model too large (more than %" PRId64 " parameters)",
                        GEN_MAX_PARAMS);
    return KEEL_OK;
}

/* ---- weights ---------------------------------------------------------------------------- */

typedef struct fill_job {
    gen_model *m;
    const gen_tensor *t;
    uint64_t seed; /* the tensor's */
    uint8_t *dst;  /* its bytes */
    size_t row_bytes;
    int64_t rows_per_task;
} fill_job;

/* Fills x[0..n) from rng: N(0, std), plus 1 for norms. Box-Muller, both
 * values of each pair used. */
static void draw_row(base_rng *rng, float *x, int64_t n, gen_init init, float std)
{
    for (int64_t i = 0; i < n; i += 2) {
        double u1 = ((double)(base_rng_next(rng) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
        double u2 = (double)(base_rng_next(rng) >> 11) * (1.0 / 9007199254740992.0);
        double r = sqrt(-2.0 * log(u1)), th = 6.283185307179586 * u2;
        x[i] = (float)(r * cos(th) * std);
        if (i + 1 < n) x[i + 1] = (float)(r * sin(th) * std);
    }
    if (init == GEN_INIT_NORM)
        for (int64_t i = 0; i < n; i++)
            x[i] += 1.0f;
    if (init == GEN_INIT_NEG)
        for (int64_t i = 0; i < n; i++)
            x[i] = -(0.05f + fabsf(x[i]));
}

static void fill_task(void *ctx, int64_t task, int thread)
{
    fill_job *j = ctx;
    const gen_tensor *t = j->t;
    float *x = j->m->scratch + (size_t)thread * (size_t)j->m->max_row;
    int64_t r0 = task * j->rows_per_task, r1 = BASE_MIN(r0 + j->rows_per_task, t->ne[1] * t->ne[2]);
    for (int64_t r = r0; r < r1; r++) {
        base_rng rng;
        base_rng_seed(&rng, j->seed + (uint64_t)(r + 1) * 0x9e3779b97f4a7c15ULL);
        draw_row(&rng, x, t->ne[0], t->init, t->std);
        keel_status st =
            tensor_quantize_row(t->dtype, x, j->dst + (size_t)r * j->row_bytes, t->ne[0]);
        if (st && !j->m->task_st[thread]) j->m->task_st[thread] = st;
    }
}

/* gguf_writer_fill_fn: generates tensor index into buf. */
static keel_status fill_tensor(void *user, int64_t index, const char *name, void *buf,
                               size_t nbytes)
{
    gen_model *m = user;
    if (index < 0 || index >= m->n_t) return KEEL_EINTERNAL;
    const gen_tensor *t = &m->t[index];
    fill_job j = {
        .m = m,
        .t = t,
        .seed = base_hash64(name, strlen(name), m->p.seed),
        .dst = buf,
        .row_bytes = tensor_row_bytes(t->dtype, t->ne[0]),
        .rows_per_task = BASE_MAX(1, GEN_ROW_ELEMS_PER_TASK / t->ne[0]),
    };
    int64_t rows = t->ne[1] * t->ne[2];
    if (j.row_bytes * (size_t)rows != nbytes) return KEEL_EINTERNAL;
    int64_t n_tasks = (rows + j.rows_per_task - 1) / j.rows_per_task;
    for (int i = 0; i < m->n_threads; i++)
        m->task_st[i] = KEEL_OK;
    base_pool_run(n_tasks > 1 ? m->pool : NULL, n_tasks, fill_task, &j);
    for (int i = 0; i < m->n_threads; i++)
        if (m->task_st[i])
            return base_err(m->err, m->task_st[i], "tensor %s: %s", name,
                            keel_strerror(m->task_st[i]));
    return KEEL_OK;
}

/* ---- the file ------------------------------------------------------------------------------ */

static void gen_free(gen_model *m)
{
    base_free(m->t, (size_t)m->cap_t * sizeof *m->t);
    base_pool_close(m->pool);
    base_free(m->scratch, (size_t)m->n_threads * (size_t)m->max_row * sizeof *m->scratch);
    base_free(m->task_st, (size_t)m->n_threads * sizeof *m->task_st);
}

/* Adds every key and (deferred) tensor of the model to w. */
static keel_status build(gen_model *m, gguf_writer *w, char *err)
{
    keel_status st;
    const gen_arch *a = m->arch;
    const keel_gen_params *p = &m->p;
    m->cap_t = tensor_count(m) + 1; /* one spare: a full list means the bound was short */
    if (!(m->t = base_alloc((size_t)m->cap_t * sizeof *m->t)))
        return base_err(err, KEEL_ENOMEM, "out of memory for %" PRId64 " tensor records", m->cap_t);
    list_tensors(m);
    apply_mix(m);
    if (m->n_t >= m->cap_t)
        return base_err(err, KEEL_EINTERNAL, "tensor list longer than its bound (%" PRId64 ")",
                        m->cap_t);
    if (m->n_params > GEN_MAX_PARAMS)
        return base_err(err, KEEL_EINVAL, "model too large (%" PRId64 " parameters, at most %" PRId64 ")",
                        m->n_params, GEN_MAX_PARAMS);
    char key[96], name[96];
    snprintf(name, sizeof name, "keel-gen %s seed %" PRIu64, a->name, p->seed);
    gen_family fam = a->family;
    bool mamba = fam == GEN_MAMBA2, gdn = fam == GEN_QWEN35 || fam == GEN_QWEN3NEXT;
    bool nem = fam == GEN_NEMOTRON_H;
    uint32_t n_rot = (uint32_t)gen_n_rot(m);
#define KEY(suffix) (snprintf(key, sizeof key, "%s." suffix, a->name), key)
    if ((st = gguf_writer_add_str(w, "general.architecture", a->name)) ||
        (st = gguf_writer_add_str(w, "general.name", name)) ||
        (st = gguf_writer_add_u32(w, "general.file_type",
                                  m->mix ? m->mix->file_type : file_type(p->dtype))) ||
        (st = gguf_writer_add_u32(w, KEY("vocab_size"), (uint32_t)p->n_vocab)) ||
        (st = gguf_writer_add_u32(w, KEY("context_length"), (uint32_t)p->n_ctx)) ||
        (st = gguf_writer_add_u32(w, KEY("embedding_length"), (uint32_t)p->n_embd)) ||
        (st = gguf_writer_add_u32(w, KEY("block_count"), (uint32_t)gen_blocks(m))) ||
        (!nem && (st = gguf_writer_add_u32(w, KEY("feed_forward_length"), mamba ? 0 : (uint32_t)p->n_ff))) ||
        (st = gguf_writer_add_u32(w, KEY("attention.head_count"), mamba ? 0 : (uint32_t)p->n_head)) ||
        (st = gguf_writer_add_f32(w, KEY("attention.layer_norm_rms_epsilon"), a->rms_eps)))
        goto fail;
    bool ds = fam == GEN_DEEPSEEK32 || fam == GEN_DEEPSEEK2, dsa = fam == GEN_DEEPSEEK32, lfm2 = fam == GEN_LFM2;
    if (nem) { /* the layer kinds as per-layer arrays; no RoPE keys */
        int32_t ff[GEN_MAX_LAYER], kv[GEN_MAX_LAYER];
        for (int32_t l = 0; l < p->n_layer; l++) {
            char k = nemotron_kind(m, l);
            ff[l] = k == '-' ? p->n_ff : 0;
            kv[l] = k == '*' ? p->n_head_kv : 0;
        }
        if ((st = gguf_writer_add_arr(w, KEY("feed_forward_length"), GGUF_TYPE_INT32, ff, (uint64_t)p->n_layer)) ||
            (st = gguf_writer_add_arr(w, KEY("attention.head_count_kv"), GGUF_TYPE_INT32, kv, (uint64_t)p->n_layer)) ||
            (st = gguf_writer_add_u32(w, KEY("attention.key_length"), (uint32_t)p->head_dim)) ||
            (st = gguf_writer_add_u32(w, KEY("attention.value_length"), (uint32_t)p->head_dim)) ||
            (st = gguf_writer_add_f32(w, KEY("attention.layer_norm_epsilon"), a->rms_eps)))
            goto fail;
    }
    if (lfm2) { /* per layer: 0 for a conv layer */
        uint32_t kv[GEN_MAX_LAYER];
        for (int32_t l = 0; l < p->n_layer; l++) kv[l] = GEN_LFM2_ATTN(l) ? (uint32_t)p->n_head_kv : 0;
        if ((st = gguf_writer_add_arr(w, KEY("attention.head_count_kv"), GGUF_TYPE_UINT32, kv,
                                      (uint64_t)p->n_layer)) ||
            (st = gguf_writer_add_u32(w, KEY("shortconv.l_cache"), GEN_LFM2_L_CACHE)))
            goto fail;
    }
    if (!mamba && !ds && !lfm2 && !nem &&
        (st = gguf_writer_add_u32(w, KEY("attention.head_count_kv"), (uint32_t)p->n_head_kv)))
        goto fail;
    if (!mamba && !ds && !nem &&
        ((st = gguf_writer_add_u32(w, KEY("attention.key_length"), (uint32_t)p->head_dim)) ||
         (st = gguf_writer_add_u32(w, KEY("attention.value_length"), (uint32_t)p->head_dim)) ||
         (st = gguf_writer_add_u32(w, KEY("rope.dimension_count"), n_rot)) ||
         (st = gguf_writer_add_f32(w, KEY("rope.freq_base"), a->rope_base))))
        goto fail;
    if (ds) { /* the absorbed MLA form's keys (llama.cpp's deepseek2 family) */
        uint32_t D = (uint32_t)p->head_dim;
        if ((p->q_lora > 0 && (st = gguf_writer_add_u32(w, KEY("attention.q_lora_rank"), (uint32_t)p->q_lora))) ||
            (st = gguf_writer_add_u32(w, KEY("attention.head_count_kv"), 1)) ||
            (st = gguf_writer_add_u32(w, KEY("attention.kv_lora_rank"), 2 * D)) ||
            (st = gguf_writer_add_u32(w, KEY("attention.key_length"), 3 * D)) ||
            (st = gguf_writer_add_u32(w, KEY("attention.value_length"), 2 * D)) ||
            (st = gguf_writer_add_u32(w, KEY("attention.key_length_mla"), 2 * D)) ||
            (st = gguf_writer_add_u32(w, KEY("attention.value_length_mla"), D)) ||
            (st = gguf_writer_add_u32(w, KEY("rope.dimension_count"), D)) ||
            (st = gguf_writer_add_f32(w, KEY("rope.freq_base"), a->rope_base)) ||
            (st = gguf_writer_add_u32(w, KEY("leading_dense_block_count"), 1)) ||
            (st = gguf_writer_add_u32(w, KEY("expert_count"), (uint32_t)p->n_expert)) ||
            (st = gguf_writer_add_u32(w, KEY("expert_used_count"), (uint32_t)p->n_expert_used)) ||
            (st = gguf_writer_add_u32(w, KEY("expert_feed_forward_length"), (uint32_t)p->n_ff)) ||
            (st = gguf_writer_add_u32(w, KEY("expert_shared_count"), 1)) ||
            (st = gguf_writer_add_u32(w, KEY("expert_gating_func"), (uint32_t)p->gating)) ||
            (st = gguf_writer_add_f32(w, KEY("expert_weights_scale"), GEN_DS_EXPERT_SCALE)) ||
            (st = gguf_writer_add_bool(w, KEY("expert_weights_norm"), true)))
            goto fail;
        if (dsa && ((st = gguf_writer_add_u32(w, KEY("attention.indexer.head_count"), GEN_DS_IDX_HEADS)) ||
                    (st = gguf_writer_add_u32(w, KEY("attention.indexer.key_length"), 2 * D)) ||
                    (st = gguf_writer_add_u32(w, KEY("attention.indexer.top_k"), (uint32_t)p->top_k))))
            goto fail;
        if (p->n_expert_groups > 1 &&
            ((st = gguf_writer_add_u32(w, KEY("expert_group_count"), (uint32_t)p->n_expert_groups)) ||
             (st = gguf_writer_add_u32(w, KEY("expert_group_used_count"), (uint32_t)p->n_group_used))))
            goto fail;
        if (p->yarn_factor > 0.0f &&
            ((st = gguf_writer_add_str(w, KEY("rope.scaling.type"), "yarn")) ||
             (st = gguf_writer_add_f32(w, KEY("rope.scaling.factor"), p->yarn_factor)) ||
             (st = gguf_writer_add_u32(w, KEY("rope.scaling.original_context_length"), (uint32_t)p->n_ctx)) ||
             (p->yarn_log_mul > 0.0f &&
              (st = gguf_writer_add_f32(w, KEY("rope.scaling.yarn_log_mul"), p->yarn_log_mul)))))
            goto fail;
    }
    if (mamba || gdn || nem) {
        bool m2 = mamba || nem;
        uint32_t inner = m2 ? 2 * (uint32_t)p->n_embd : (uint32_t)(p->n_head * p->head_dim);
        uint32_t state = m2 ? (uint32_t)p->ssm_state : (uint32_t)p->head_dim;
        if ((st = gguf_writer_add_u32(w, KEY("ssm.conv_kernel"), GEN_CONV_KERNEL)) ||
            (st = gguf_writer_add_u32(w, KEY("ssm.inner_size"), inner)) ||
            (st = gguf_writer_add_u32(w, KEY("ssm.state_size"), state)) ||
            (st = gguf_writer_add_u32(w, KEY("ssm.time_step_rank"), (uint32_t)p->n_head)) ||
            (st = gguf_writer_add_u32(w, KEY("ssm.group_count"), (uint32_t)p->n_head_kv)))
            goto fail;
    }
    if (gdn && (st = gguf_writer_add_u32(w, KEY("full_attention_interval"), GEN_FULL_ATTN_INTERVAL)))
        goto fail;
    if (fam == GEN_QWEN35) {
        /* IMRoPE sections over the rotated pairs, llama.cpp's [3, 3, 2, 0] shape */
        int32_t pairs = (int32_t)n_rot / 2, sec[4] = {pairs * 3 / 8, pairs * 3 / 8, 0, 0};
        sec[2] = pairs - sec[0] - sec[1];
        if ((st = gguf_writer_add_arr(w, KEY("rope.dimension_sections"), GGUF_TYPE_INT32, sec, 4)))
            goto fail;
    }
    if ((fam == GEN_QWEN3NEXT || fam == GEN_GPT_OSS) &&
        ((st = gguf_writer_add_u32(w, KEY("expert_count"), (uint32_t)p->n_expert)) ||
         (st = gguf_writer_add_u32(w, KEY("expert_used_count"), (uint32_t)p->n_expert_used)) ||
         (st = gguf_writer_add_u32(w, KEY("expert_feed_forward_length"), (uint32_t)p->n_ff))))
        goto fail;
    if (fam == GEN_QWEN3NEXT &&
        (st = gguf_writer_add_u32(w, KEY("expert_shared_feed_forward_length"), (uint32_t)p->n_ff)))
        goto fail;
    if (fam == GEN_GPT_OSS &&
        ((st = gguf_writer_add_u32(w, KEY("attention.sliding_window"), (uint32_t)p->n_swa)) ||
         (st = gguf_writer_add_str(w, KEY("rope.scaling.type"), "yarn")) ||
         (st = gguf_writer_add_f32(w, KEY("rope.scaling.factor"), GEN_YARN_FACTOR)) ||
         (st = gguf_writer_add_u32(w, KEY("rope.scaling.original_context_length"), (uint32_t)p->n_ctx))))
        goto fail;
    if ((fam == GEN_QWEN3MOE || fam == GEN_GLM4MOE) &&
        ((st = gguf_writer_add_u32(w, KEY("expert_count"), (uint32_t)p->n_expert)) ||
         (st = gguf_writer_add_u32(w, KEY("expert_used_count"), (uint32_t)p->n_expert_used)) ||
         (st = gguf_writer_add_u32(w, KEY("expert_feed_forward_length"), (uint32_t)p->n_ff_exp))))
        goto fail;
    if (fam == GEN_GLM4MOE &&
        ((st = gguf_writer_add_u32(w, KEY("leading_dense_block_count"), p->n_layer > 1 ? 1 : 0)) ||
         (st = gguf_writer_add_u32(w, KEY("nextn_predict_layers"), 1)) ||
         (st = gguf_writer_add_u32(w, KEY("expert_shared_count"), 1)) ||
         (st = gguf_writer_add_u32(w, KEY("expert_gating_func"), 2)) ||
         (st = gguf_writer_add_f32(w, KEY("expert_weights_scale"), GEN_GLM_EXPERT_SCALE)) ||
         (st = gguf_writer_add_bool(w, KEY("expert_weights_norm"), true))))
        goto fail;
    bool g3 = strcmp(a->name, "gemma3") == 0;
    if (g3 && ((st = gguf_writer_add_u32(w, KEY("attention.sliding_window"), (uint32_t)p->n_swa)) ||
               (st = gguf_writer_add_f32(w, KEY("rope.freq_base_swa"), GEN_GEMMA3_BASE_SWA)) ||
               (st = gguf_writer_add_str(w, KEY("rope.scaling.type"), "linear")) ||
               (st = gguf_writer_add_f32(w, KEY("rope.scaling.factor"), GEN_GEMMA3_ROPE_FACTOR))))
        goto fail;
    /* phi3: the short factors up to n_ctx (keel's default context), the
     * long ones beyond; its sliding_window key is ignored by runtimes */
    if (fam == GEN_PHI3 &&
        ((st = gguf_writer_add_u32(w, KEY("rope.scaling.original_context_length"), (uint32_t)p->n_ctx)) ||
         (st = gguf_writer_add_f32(w, KEY("rope.scaling.attn_factor"), GEN_PHI3_ATTN_FACTOR))))
        goto fail;
    if (a->gemma && !g3 &&
        ((st = gguf_writer_add_u32(w, KEY("attention.sliding_window"), (uint32_t)p->n_swa)) ||
         (st = gguf_writer_add_f32(w, KEY("attn_logit_softcapping"), GEMMA2_ATTN_SOFTCAP)) ||
         (st = gguf_writer_add_f32(w, KEY("final_logit_softcapping"), GEMMA2_FINAL_SOFTCAP))))
        goto fail;
#undef KEY
    if ((st = genmodel_add_vocab(w, a->vocab, p->n_vocab, err))) return st;
    for (int64_t i = 0; i < m->n_t; i++) {
        const gen_tensor *t = &m->t[i];
        if ((st = gguf_writer_add_tensor_deferred(w, t->name, t->dtype, t->n_dims, t->ne)))
            goto fail;
    }
    return KEEL_OK;
fail:
    return base_err(err, st, "%s", gguf_writer_last_error(w));
}

/* Builds the writer for p (everything but the weights). */
static keel_status gen_open(const keel_gen_params *p, gen_model *m, gguf_writer **w, char *err)
{
    keel_status st;
    memset(m, 0, sizeof *m);
    *w = NULL;
    if ((st = resolve(p, m, err))) return st;
    if ((st = gguf_writer_open(w))) return base_err(err, st, "out of memory");
    if ((st = build(m, *w, err))) {
        gguf_writer_close(*w);
        *w = NULL;
        gen_free(m);
        return st;
    }
    return KEEL_OK;
}

keel_status keel_gen_model_size(const keel_gen_params *p, int64_t *n_params, size_t *n_bytes,
                                char *err)
{
    gen_model m;
    gguf_writer *w;
    keel_status st = gen_open(p, &m, &w, err);
    if (st) return st;
    size_t size = 0;
    st = gguf_writer_size(w, &size);
    if (st) base_err(err, st, "file size overflows");
    if (!st && n_params) *n_params = m.n_params;
    if (!st && n_bytes) *n_bytes = size;
    gguf_writer_close(w);
    gen_free(&m);
    return st;
}

keel_status keel_gen_model(const keel_gen_params *p, const char *path, char *err)
{
    if (!path) return base_err(err, KEEL_EINVAL, "path is NULL");
    gen_model m;
    gguf_writer *w;
    keel_status st = gen_open(p, &m, &w, err);
    if (st) return st;
    /* one pool for big models; small ones are generated inline */
    m.n_threads = 1;
    if (m.n_params >= ((int64_t)1 << 22)) {
        if ((st = base_pool_open(BASE_MIN(keel_cpu_count(), 16), &m.pool))) {
            base_err(err, st, "cannot start generator threads");
            goto done;
        }
        m.n_threads = base_pool_threads(m.pool);
    }
    if (!(m.scratch = base_alloc((size_t)m.n_threads * (size_t)m.max_row * sizeof *m.scratch)) ||
        !(m.task_st = base_calloc((size_t)m.n_threads, sizeof *m.task_st))) {
        st = base_err(err, KEEL_ENOMEM, "out of memory for generator scratch");
        goto done;
    }
    gguf_writer_set_fill(w, fill_tensor, &m);
    FILE *f = fopen(path, "wb");
    if (!f) {
        st = base_err(err, KEEL_EIO, "cannot create %s: %s", path, strerror(errno));
        goto done;
    }
    st = gguf_writer_write_file(w, f);
    if (st) {
        if (m.err[0])
            base_err(err, st, "%s", m.err);
        else
            base_err(err, st, "%s: %s", path, gguf_writer_last_error(w));
    }
    if (fclose(f) != 0 && !st) st = base_err(err, KEEL_EIO, "%s: %s", path, strerror(errno));
    if (st) remove(path); /* no partial model files */
done:
    gguf_writer_close(w);
    gen_free(&m);
    return st;
}
