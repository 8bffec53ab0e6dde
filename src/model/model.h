/*
 * model.h — private interface of the model runtime: hyperparameters and
 * weights of the supported architectures, bound from a GGUF file, and the
 * forward pass over the memory core. See docs/models.md.
 *
 * Weights are views into the mapped file (never copied), except 1-D tensors
 * (norms, biases), which are converted once to f32 arrays owned by the
 * model_w. A forward pass allocates nothing: it takes its activations from
 * a work arena sized by model_work_bytes.
 */
#ifndef KEEL_MODEL_H
#define KEEL_MODEL_H

#include "../memory/memory.h"
#include "gguf.h"

#include <stdatomic.h>

typedef enum model_arch {
    MODEL_ARCH_LLAMA = 0,
    MODEL_ARCH_QWEN2 = 1,
    MODEL_ARCH_QWEN3 = 2,
    MODEL_ARCH_GEMMA2 = 3,
    MODEL_ARCH_QWEN35 = 4,    /* Gated DeltaNet + gated attention, dense FFN */
    MODEL_ARCH_QWEN3NEXT = 5, /* the same hybrid with MoE + shared expert */
    MODEL_ARCH_MAMBA2 = 6,    /* SSD selective scan, no attention, no FFN */
    MODEL_ARCH_GPT_OSS = 7,   /* MoE (SwiGLU-OAI), attention sinks, alternating SWA */
    MODEL_ARCH_DEEPSEEK32 = 8, /* MLA (absorbed MQA form) + DSA lightning indexer, dense
                                  lead layers then MoE (sigmoid router, shared expert) */
    MODEL_ARCH_GEMMA3 = 9,    /* gemma2's block, 5 of 6 layers sliding with their own RoPE
                                 base, q/k norm, no soft-caps */
    MODEL_ARCH_PHI3 = 10,     /* fused qkv and gate|up, partial NEOX, LongRoPE factors */
    MODEL_ARCH_QWEN3MOE = 11, /* qwen3 attention, MoE every layer (softmax, top-k renormalized) */
    MODEL_ARCH_GLM4MOE = 12,  /* dense lead layers then sigmoid MoE + shared expert, partial
                                 RoPE, q/k/v biases; NextN (MTP) layers bound, never run */
    MODEL_ARCH_NEMOTRON_H = 13, /* per layer one of Mamba2, attention without RoPE, ReLU^2
                                   MLP (arch_nemotron_h.c) */
    MODEL_ARCH_LFM2 = 14,     /* gated short convolutions + GQA attention (per-layer
                                 head_count_kv, 0 = conv), SwiGLU everywhere (arch_lfm2.c) */
    MODEL_ARCH_DEEPSEEK2 = 15, /* deepseek32's MLA without the indexer (q LoRA optional),
                                  grouped expert routing, YaRN with the mscale correction */
} model_arch;

/* What mixes tokens in a layer (one file per kind: layer_attn.c,
 * layer_gdn.c, layer_mamba2.c, layer_mla.c, layer_shortconv.c). */
typedef enum model_mixer {
    MODEL_MIXER_ATTN = 0,   /* attention over the memory core */
    MODEL_MIXER_GDN = 1,    /* Gated DeltaNet: conv1d + gated delta rule */
    MODEL_MIXER_MAMBA2 = 2, /* Mamba2 selective scan */
    MODEL_MIXER_MLA = 3,    /* multi-head latent attention, with the DSA indexer when
                               idx_heads > 0 (layer_mla.c) */
    MODEL_MIXER_NONE = 4,   /* no mixer: the block is its FFN (nemotron_h's MLP layers) */
    MODEL_MIXER_SHORTCONV = 5, /* lfm2: gated depthwise causal conv (layer_shortconv.c) */
} model_mixer;

typedef enum model_ffn_kind {
    MODEL_FFN_NONE = 0,  /* mamba2: the mixer is the whole block */
    MODEL_FFN_DENSE = 1, /* gate/up/down */
    MODEL_FFN_MOE = 2,   /* routed experts (+ an optional gated shared expert) */
} model_ffn_kind;

typedef enum model_act {
    MODEL_ACT_SILU = 0,       /* silu(gate) * up */
    MODEL_ACT_GELU = 1,       /* gelu(gate) * up (tanh form) */
    MODEL_ACT_SWIGLU_OAI = 2, /* min(g, L) sigmoid(a min(g, L)) (clamp(u, -L, L) + 1) */
    MODEL_ACT_RELU2 = 3,      /* relu(u)^2, no gate (nemotron_h) */
} model_act;

/* How a router turns its logits into expert choices and weights. */
typedef enum model_router {
    /* probabilities = softmax over all experts; the k largest chosen (by
     * probability + exp_probs_b when the layer has one: glm4moe with
     * softmax gating); their probabilities (renormalized to sum 1 when
     * router_norm) weight them (qwen3next, qwen3moe, mixtral) */
    MODEL_ROUTER_SOFTMAX = 0,
    /* the k largest logits chosen; softmax over the chosen logits weights
     * them (gpt-oss) */
    MODEL_ROUTER_SOFTMAX_WEIGHT = 1,
    /* probabilities = sigmoid(logits); chosen by probability + a selection
     * bias (exp_probs_b), weighted by the unbiased probabilities,
     * renormalized when router_norm (deepseek v3 / 3.2) */
    MODEL_ROUTER_SIGMOID = 2,
} model_router;

/* A 2-D weight: n_rows rows of n_cols elements (ne[0] = n_cols). Experts:
 * n_expert such matrices, expert_bytes apart. */
typedef struct model_mat {
    const void *data;  /* in the mapped file; NULL when absent */
    keel_dtype dtype;
    int64_t n_cols;    /* input features */
    int64_t n_rows;    /* output features */
    size_t nbytes;
    int64_t n_expert;  /* 0 for a plain matrix */
    size_t expert_bytes;
} model_mat;

typedef struct model_layer {
    model_mixer mixer;
    model_ffn_kind ffn;
    const float *attn_norm;      /* [n_embd] */
    /* attention */
    model_mat wq, wk, wv, wo;    /* [n_embd -> n_head*hd_k (x2 with attn_gate)], ..., [n_head*hd_v -> n_embd] */
    const float *bq, *bk, *bv, *bo; /* optional biases */
    const float *q_norm, *k_norm;   /* qwen3, qwen35: [hd_k] */
    bool attn_gate;              /* wq yields per head [q | gate]; out *= sigmoid(gate) */
    const float *sinks;          /* gpt-oss: [n_head] learned sink logits */
    const float *post_attn_norm; /* gemma2: [n_embd] */
    bool swa;                    /* sliding-window layer */
    /* multi-head latent attention (deepseek2, deepseek32), absorbed form:
     * the cache row is [rope | kv_lora] (one KV head), V its kv_lora part.
     * Without q LoRA (q_lora 0: DeepSeek-V2-Lite) wq is [n_embd -> n_head *
     * (nope + rope)] and wq_a, q_a_norm, wq_b are absent */
    model_mat wq_a;              /* [n_embd -> q_lora] */
    const float *q_a_norm;       /* [q_lora] */
    model_mat wq_b;              /* [q_lora -> n_head * (nope + rope)], per head [nope | rope] */
    model_mat wkv_a;             /* [n_embd -> kv_lora + rope] = [kv_lora | k rope] */
    const float *kv_a_norm;      /* [kv_lora] */
    model_mat wk_b;              /* per head ("experts"): [nope -> kv_lora], absorbs q_nope */
    model_mat wv_b;              /* per head: [kv_lora -> v_head] */
    /* the DSA lightning indexer (deepseek32 only) */
    model_mat idx_wq_b;          /* [q_lora -> idx_heads * idx_dim], per head [rope | nope] */
    model_mat idx_wk;            /* [n_embd -> idx_dim] */
    const float *idx_k_norm, *idx_k_norm_b; /* [idx_dim] LayerNorm */
    model_mat idx_proj;          /* [n_embd -> idx_heads] head weights */
    /* recurrent mixers (Gated DeltaNet, Mamba2) */
    model_mat ssm_in;            /* mamba2: [n_embd -> 2 d_inner + 2 n_group d_state + n_head];
                                    lfm2 shortconv.in_proj: [n_embd -> 3 n_embd] = [B | C | x] */
    model_mat ssm_qkv;           /* gdn: [n_embd -> conv channels (q | k | v)] */
    model_mat ssm_z;             /* gdn: [n_embd -> v_dim] output gate */
    model_mat ssm_beta, ssm_alpha; /* gdn: [n_embd -> v heads] */
    model_mat ssm_ba;            /* gdn fused (qwen3next): [n_embd -> 2 v heads], per k head [b | a] */
    model_mat ssm_out;           /* [v_dim or d_inner -> n_embd]; lfm2 shortconv.out_proj */
    const float *ssm_conv;       /* [conv channels][conv kernel] (lfm2: channels n_embd) */
    const float *ssm_conv_b;     /* mamba2: [conv channels] */
    const float *ssm_dt_b;       /* [v heads / heads] */
    const float *ssm_a;          /* [v heads / heads] (negative: -exp(A_log)) */
    const float *ssm_d;          /* mamba2: [heads] skip */
    const float *ssm_norm;       /* gdn: [head_v]; mamba2: [n_group][d_inner / n_group] */
    /* feed-forward */
    const float *ffn_norm;       /* [n_embd] */
    model_mat ffn_gate, ffn_up, ffn_down; /* ffn_gate absent (data NULL) with MODEL_ACT_RELU2 */
    const float *ffn_up_b, *ffn_down_b; /* optional biases [n_ff], [n_embd] (nemotron_h) */
    const float *post_ffw_norm;  /* gemma2: [n_embd] */
    model_mat gate_inp;          /* moe: router [n_embd -> n_expert] */
    const float *gate_inp_b;     /* [n_expert] or NULL */
    const float *exp_probs_b;    /* [n_expert] selection bias or NULL */
    model_mat gate_exps, up_exps, down_exps; /* [n_expert] x [n_embd -> n_ff_exp], [n_ff_exp -> n_embd] */
    const float *gate_exps_b, *up_exps_b, *down_exps_b; /* [n_expert][rows] or NULL */
    const float *shexp_gate;     /* [n_embd] sigmoid gate of the shared expert, or NULL */
    model_mat gate_shexp, up_shexp, down_shexp; /* shared expert, n_ff_shexp */
} model_layer;

typedef struct model_hp {
    model_arch arch;
    const char *arch_name;
    int32_t n_vocab, n_ctx_train, n_embd, n_layer, n_head, n_head_kv;
    int32_t hd_k, hd_v, n_ff;
    float norm_eps;
    keel_rope rope;           /* freq_factors points into model_w when present */
    keel_rope rope_swa;       /* RoPE of the sliding layers: gemma3 base rope.freq_base_swa,
                                 no scaling; else = rope */
    keel_rope rope_long;      /* phi3 LongRoPE: rope with rope_factors_long, used when a
                                 sequence's context exceeds rope.n_ctx_orig (rope itself
                                 carries rope_factors_short); type NONE when absent */
    int32_t rope_sections[4]; /* qwen35 IMRoPE sections (text positions: NEOX, see models.md) */
    int32_t n_swa;            /* sliding window, 0 if none */
    int32_t swa_period;       /* gemma3: layer il slides iff il % period < period - 1 */
    float attn_softcap;       /* 0 if none */
    float final_softcap;      /* 0 if none */
    float embd_scale;         /* multiply embeddings (gemma2: sqrt(n_embd)), else 1 */
    float attn_scale;         /* scale of q.k */
    /* recurrent layers */
    int32_t n_recurrent;      /* layers with a recurrent mixer */
    int32_t ssm_conv_kernel, ssm_d_inner, ssm_d_state, ssm_dt_rank, ssm_n_group;
    int32_t full_attn_interval; /* gdn hybrids: every interval-th layer is attention */
    bool gdn_kv_tiled;        /* gdn: v head h reads k head h % n_k (else h / (n_v / n_k)) */
    /* mixture of experts */
    int32_t n_expert, n_expert_used, n_ff_exp, n_ff_shexp;
    model_router router;
    bool router_norm;         /* renormalize the chosen weights to sum 1 */
    int32_t n_expert_groups;  /* > 1: grouped routing (deepseek2): experts in this many equal
                                 groups, a group scored by the sum of its 2 best selection
                                 scores, the k experts chosen within the n_group_used best */
    int32_t n_group_used;
    float expert_scale;       /* multiply the weights (1: none) */
    model_act ffn_act;        /* of the FFN and the experts */
    float oai_alpha, oai_limit; /* SwiGLU-OAI */
    /* multi-head latent attention (deepseek2) + DSA indexer (deepseek32) */
    int32_t q_lora, kv_lora;  /* ranks of the q and kv compressions; q_lora 0: plain wq */
    int32_t qk_nope, qk_rope; /* per head: q.k dims without / with RoPE (qk_rope = rope.n_rot) */
    int32_t v_head;           /* per head value dims after wv_b */
    int32_t idx_heads, idx_dim, idx_top_k; /* indexer query heads, key dims, cells kept;
                                              0 heads: no indexer (deepseek2) */
    float idx_norm_eps;       /* the indexer key's LayerNorm */
    int32_t n_dense_lead;     /* leading layers with a dense FFN (then MoE) */
    int32_t n_nextn;          /* glm4moe: NextN (MTP) layers after the n_layer run ones
                                 (block_count = n_layer + n_nextn); bound, never run */
} model_hp;

/* Derived shapes of the recurrent mixers. */
static inline int32_t model_gdn_conv_channels(const model_hp *hp)
{
    return 2 * hp->ssm_n_group * hp->ssm_d_state + hp->ssm_d_inner;
}
static inline int32_t model_mamba2_conv_channels(const model_hp *hp)
{
    return hp->ssm_d_inner + 2 * hp->ssm_n_group * hp->ssm_d_state;
}

typedef struct model_w {
    model_hp hp;
    model_mat tok_embd;       /* [n_vocab][n_embd] */
    model_mat output;         /* [n_vocab][n_embd] (tok_embd when tied) */
    const float *output_norm; /* [n_embd] */
    model_layer *layers;      /* [n_layer] */
    double *rope_rates;       /* [3][n_rot / 2 + 1] one block: rope, rope_swa, rope_long */
    double *rope_rates_swa;   /* = rope_rates + (n_rot / 2 + 1) */
    double *rope_rates_long;  /* = rope_rates + 2 (n_rot / 2 + 1) */
    float rope_mscale, rope_mscale_swa, rope_mscale_long;
    /* owned f32 copies of the 1-D tensors, one block */
    float *f32_block;
    size_t f32_bytes;
    size_t layers_bytes;
    int64_t n_params;
    size_t weight_bytes;
    keel_dtype main_dtype;
} model_w;

/* Binds the hyperparameters and tensors of g (which must outlive w).
 * KEEL_EUNSUPPORTED (architecture or dtype, named), KEEL_ENOENT (missing
 * key or tensor, named), KEEL_EFORMAT (wrong shape; a hyperparameter out of
 * range or not finite, named with its value; a NaN/Inf element in a 1-D
 * tensor, named with its index), KEEL_ENOMEM. Tensors left unbound (e.g.
 * layers beyond block_count) do not fail: one KEEL_LOG_WARN message names
 * them. */
keel_status model_load(const gguf *g, model_w *w, char *err);
void model_free(model_w *w);

/* Opens a model file (model_file.c): a GGUF file is mapped
 * (gguf_open_file); anything else is a llama2.c checkpoint when tok_path
 * is given (llama2c_open_file), else refused with what the file starts
 * with ("not a GGUF file (magic 'ab\x00\x01'); for a llama2.c checkpoint
 * pass --tokenizer"). Directories, devices, pipes and empty files are
 * refused as such. err never repeats path (the caller names it); errors
 * about the tokenizer name tok_path. A tok_path given with a GGUF file is
 * ignored with a KEEL_LOG_WARN message. KEEL_EIO, KEEL_EFORMAT, and the
 * errors of the two openers. *out is NULL on failure. */
keel_status model_open_file(const char *path, const char *tok_path, bool read_all, gguf **out, char *err);

/* The memory layer descriptions for a context (kinds, heads, dims, RoPE;
 * recurrent layers with their state shapes). layers has room for
 * hp.n_layer. */
void model_mem_layers(const model_w *w, keel_dtype type_k, keel_dtype type_v, int32_t rot_k,
                      int32_t rot_v, int32_t n_sink, int32_t swa_window, int32_t swa_period,
                      bool rope_long, keel_mem_layer *layers);

/* Whether a context whose sequences hold up to n_ctx_seq positions uses
 * the long RoPE factors (phi3 LongRoPE; llama.cpp: n_ctx_seq >
 * rope.scaling.original_context_length). false without them. */
bool model_rope_long(const model_w *w, int32_t n_ctx_seq);

/* The RoPE of layer l's keys (sliding layers: rope_swa; rope_long when
 * chosen). */
const keel_rope *model_layer_rope(const model_w *w, int32_t l, bool rope_long);

/* One forward chunk. */
typedef struct model_ubatch {
    int32_t n;             /* tokens */
    const int32_t *tokens; /* [n] */
    const int32_t *pos;    /* [n] */
    const int32_t *seq;    /* [n] */
    const int32_t *cells;  /* [n_groups][n], from keel_mem_place */
    int32_t n_out;         /* rows to produce logits for */
    const int32_t *out_idx;/* [n_out] token indices in this chunk */
    float *logits;         /* [n_out][n_vocab] */
    bool deterministic;    /* batch-invariant products (tensor_matvec_batch for every size) */
    bool rope_long;        /* phi3: the long RoPE factors (model_rope_long) */
} model_ubatch;

/* Work arena bytes a forward chunk of up to n_tokens tokens needs. */
size_t model_work_bytes(const model_w *w, int32_t n_tokens, int32_t n_threads);

/* Runs the chunk: embeddings, every layer (writing K/V into mem and
 * attending; updating the recurrent states of the chunk's sequences, each
 * sequence's tokens in order), final norm and logits for the requested
 * rows. cancel (may be NULL) is polled between layers, and for models with
 * recurrent layers only before the first one (a state is updated in place:
 * stopping inside a chunk would leave the layers disagreeing):
 * KEEL_ECANCELED. */
keel_status model_forward(const model_w *w, keel_mem *mem, const model_ubatch *ub,
                          base_pool *pool, base_arena *work, const atomic_int *cancel,
                          char *err);

/* ---- layer kinds (forward.c, layer_*.c, ffn.c) ---------------------------- */

/* What a layer function gets: the chunk, its activations and the shared
 * resources. Buffers are [n][...] rows. */
typedef struct model_fw {
    const model_w *w;
    keel_mem *mem;
    const model_ubatch *ub;
    base_pool *pool;
    base_arena *work;
    char *err;
    int32_t l;        /* the layer */
    float *cs;        /* [n][n_rot] RoPE tables of the chunk's positions */
    float *cs_swa;    /* [n][n_rot] the sliding layers' tables (gemma3), else NULL */
} model_fw;

/* y = x W (+ bias per row) for n rows. */
keel_status model_matmul(const model_fw *f, const model_mat *m, const float *x, int32_t n, float *y);
/* y_j = x W_j for n_m <= TENSOR_MV_MULTI_MAX matrices sharing x (same
 * n_cols): decode (n == 1) runs them in one pool run
 * (tensor_matvec_multi: x converted once, one task list; each y_j equals
 * its own model_matmul), otherwise one model_matmul each. */
keel_status model_matmul_group(const model_fw *f, const model_mat *const *ms, float *const *ys, int n_m,
                               const float *x, int32_t n);
/* Floats per token a mixer / FFN kind takes from the work arena (beyond
 * the shared x, h, o), and the functions. Each takes h [n][n_embd] and
 * writes o [n][n_embd]; buffers are taken from f->work and released. */
size_t model_attn_floats(const model_w *w);
keel_status model_attn(const model_fw *f, const float *h, float *o);
size_t model_gdn_floats(const model_w *w);
keel_status model_gdn(const model_fw *f, const float *h, float *o);
size_t model_mamba2_floats(const model_w *w);
keel_status model_mamba2(const model_fw *f, const float *h, float *o);
size_t model_mla_floats(const model_w *w);
keel_status model_mla(const model_fw *f, const float *h, float *o);
size_t model_shortconv_floats(const model_w *w);
keel_status model_shortconv(const model_fw *f, const float *h, float *o);
size_t model_ffn_floats(const model_w *w);
keel_status model_ffn(const model_fw *f, const float *h, float *o);

/* Every matrix of a layer (for scratch planning): fills out, returns n. */
int32_t model_layer_mats(const model_layer *L, const model_mat **out, int32_t cap);

#endif
