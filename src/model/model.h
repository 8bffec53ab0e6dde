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

typedef enum model_arch {
    MODEL_ARCH_LLAMA = 0,
    MODEL_ARCH_QWEN2 = 1,
    MODEL_ARCH_QWEN3 = 2,
    MODEL_ARCH_GEMMA2 = 3,
} model_arch;

/* A 2-D weight: n_rows rows of n_cols elements (ne[0] = n_cols). */
typedef struct model_mat {
    const void *data;  /* in the mapped file; NULL when absent */
    keel_dtype dtype;
    int64_t n_cols;    /* input features */
    int64_t n_rows;    /* output features */
    size_t nbytes;
} model_mat;

typedef struct model_layer {
    const float *attn_norm;      /* [n_embd] */
    model_mat wq, wk, wv, wo;    /* [n_embd -> n_head*hd_k], ..., [n_head*hd_v -> n_embd] */
    const float *bq, *bk, *bv, *bo; /* optional biases */
    const float *q_norm, *k_norm;   /* qwen3: [hd_k] */
    const float *post_attn_norm; /* gemma2: [n_embd] */
    const float *ffn_norm;       /* [n_embd] */
    model_mat ffn_gate, ffn_up, ffn_down;
    const float *post_ffw_norm;  /* gemma2: [n_embd] */
    bool swa;                    /* sliding-window layer */
} model_layer;

typedef struct model_hp {
    model_arch arch;
    const char *arch_name;
    int32_t n_vocab, n_ctx_train, n_embd, n_layer, n_head, n_head_kv;
    int32_t hd_k, hd_v, n_ff;
    float norm_eps;
    keel_rope rope;           /* freq_factors points into model_w when present */
    int32_t n_swa;            /* sliding window, 0 if none */
    float attn_softcap;       /* 0 if none */
    float final_softcap;      /* 0 if none */
    float embd_scale;         /* multiply embeddings (gemma2: sqrt(n_embd)), else 1 */
    float attn_scale;         /* scale of q.k */
} model_hp;

typedef struct model_w {
    model_hp hp;
    model_mat tok_embd;       /* [n_vocab][n_embd] */
    model_mat output;         /* [n_vocab][n_embd] (tok_embd when tied) */
    const float *output_norm; /* [n_embd] */
    model_layer *layers;      /* [n_layer] */
    double *rope_rates;       /* [n_rot / 2] */
    float rope_mscale;
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
keel_status model_open_file(const char *path, const char *tok_path, gguf **out, char *err);

/* The memory layer descriptions for a context (kinds, heads, dims, RoPE).
 * layers has room for hp.n_layer. */
void model_mem_layers(const model_w *w, keel_dtype type_k, keel_dtype type_v, int32_t rot_k,
                      int32_t rot_v, int32_t n_sink, int32_t swa_window, int32_t swa_period,
                      keel_mem_layer *layers);

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
    bool deterministic;    /* batch-invariant products (dot tiles for every size) */
} model_ubatch;

/* Work arena bytes a forward chunk of up to n_tokens tokens needs. */
size_t model_work_bytes(const model_w *w, int32_t n_tokens, int32_t n_threads);

/* Runs the chunk: embeddings, every layer (writing K/V into mem and
 * attending), final norm and logits for the requested rows. cancel (may be
 * NULL) is polled between layers: KEEL_ECANCELED. */
keel_status model_forward(const model_w *w, keel_mem *mem, const model_ubatch *ub,
                          base_pool *pool, base_arena *work, const volatile int *cancel,
                          char *err);

#endif
