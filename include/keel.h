/*
 * keel.h — the public interface of libkeel.
 *
 * keel is an LLM inference runtime for long-context, multi-turn, agentic use on
 * local machines. Its centre is the memory subsystem: the KV cache (one cell
 * table per layer group, every per-token datum a column of it), sliding-window
 * rings with attention sinks, quantized and Hadamard-rotated storage, exact
 * position edits and compaction. This header is the only one a program needs.
 *
 * Conventions (see docs/ and ../shared/style.md):
 *   - Every fallible function returns keel_status; KEEL_OK is 0.
 *     keel_strerror() gives the message of a code; objects also keep a
 *     detailed last-error string (e.g. keel_mem_last_error()).
 *   - Objects are opaque; config structs have a *_default() constructor;
 *     open/close pairs; close(NULL) is a no-op; out-pointers are NULL on failure.
 *   - The library never prints, exits or aborts. Logging goes through the
 *     callback installed with keel_set_log(); allocation through the hooks
 *     installed with keel_set_allocator().
 *   - Token ids and positions are int32_t, element counts int64_t, byte
 *     sizes size_t.
 *
 * A complete example, the memory core without a model (one full-attention
 * layer, 2 KV heads of dimension 64, q8_0 keys rotated by a Hadamard
 * transform):
 *
 *     keel_mem_config cfg = keel_mem_config_default();
 *     keel_mem_layer layer = keel_mem_layer_default();
 *     layer.n_kv_heads = 2; layer.head_dim_k = layer.head_dim_v = 64;
 *     layer.k_dtype = KEEL_DTYPE_Q8_0; layer.k_rot.enabled = true;
 *     cfg.layers = &layer; cfg.n_layers = 1; cfg.n_ctx = 4096;
 *     size_t need;
 *     keel_mem_config_bytes(&cfg, &need);        // exact bytes, before allocating
 *     keel_mem *mem;
 *     if (keel_mem_open(&cfg, &mem) != KEEL_OK) ...;
 *     // place 3 tokens of sequence 0 at positions 0..2, write their K/V rows,
 *     // then attend with a query; see the memory section below.
 *     keel_mem_close(mem);
 */
#ifndef KEEL_H
#define KEEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KEEL_VERSION_MAJOR 0
#define KEEL_VERSION_MINOR 1
#define KEEL_VERSION_PATCH 0
#define KEEL_VERSION_STRING "0.1.0"

/* Version string of the linked library ("0.1.0"). Static storage. */
const char *keel_version(void);

/* ======================================================================== */
/* Status codes                                                             */
/* ======================================================================== */

/* X(name, value, message). One table yields the enum and keel_strerror(). */
#define KEEL_STATUS_TABLE(X)                                                                       \
    X(OK, 0, "ok")                                                                                 \
    X(EINVAL, 1, "invalid argument")                                                               \
    X(ENOMEM, 2, "out of memory")                                                                  \
    X(EOVERFLOW, 3, "size arithmetic overflow")                                                    \
    X(ERANGE, 4, "value out of range")                                                             \
    X(EFORMAT, 5, "malformed input data")                                                          \
    X(EIO, 6, "input/output error")                                                                \
    X(EUNSUPPORTED, 7, "unsupported feature or type")                                              \
    X(ENOENT, 8, "not found")                                                                      \
    X(EFULL, 9, "cache full")                                                                      \
    X(ESCRATCH, 10, "scratch arena exhausted")                                                     \
    X(ESTATE, 11, "operation refused by recurrent state")                                          \
    X(ECANCELED, 12, "canceled")                                                                   \
    X(ECONTEXT, 13, "context too small")                                                           \
    X(EINTERNAL, 14, "internal invariant violated")

typedef enum keel_status {
#define KEEL_STATUS_ENUM_(name, value, msg) KEEL_##name = value,
    KEEL_STATUS_TABLE(KEEL_STATUS_ENUM_)
#undef KEEL_STATUS_ENUM_
} keel_status;

/* Message of a status code ("cache full"). Static storage; never NULL. */
const char *keel_strerror(keel_status status);

/* Name of a status code ("KEEL_EFULL"). Static storage; never NULL. */
const char *keel_status_name(keel_status status);

/* ======================================================================== */
/* Allocator hooks, logging, clock                                          */
/* ======================================================================== */

/*
 * One allocation function, told the old size (Lua's lua_Alloc):
 *   new_size == 0            free ptr (old_size is its size); returns NULL
 *   ptr == NULL              allocate new_size bytes
 *   otherwise                resize from old_size to new_size
 * Returning NULL for a non-zero new_size is an allocation failure; the
 * library then returns KEEL_ENOMEM and leaks nothing.
 * Memory must be aligned to at least 64 bytes when new_size >= 64.
 */
typedef void *(*keel_alloc_fn)(void *user, void *ptr, size_t old_size, size_t new_size);

/*
 * Installs the allocator (NULL restores the default, aligned malloc/free).
 * Call before opening any object; objects free with the allocator they
 * were made with only if it is still installed. Not thread-safe.
 */
void keel_set_allocator(keel_alloc_fn fn, void *user);

typedef enum keel_log_level {
    KEEL_LOG_DEBUG = 0,
    KEEL_LOG_INFO = 1,
    KEEL_LOG_WARN = 2,
    KEEL_LOG_ERROR = 3,
} keel_log_level;

typedef void (*keel_log_fn)(void *user, keel_log_level level, const char *message);

/* Installs the log callback (NULL: discard). Messages below min_level are
 * dropped. The callback may be called from any library thread. */
void keel_set_log(keel_log_fn fn, void *user, keel_log_level min_level);

/* Monotonic clock in nanoseconds. */
uint64_t keel_time_ns(void);

/* Number of online CPUs (>= 1). */
int keel_cpu_count(void);

/*
 * Forces the kernel path of every computation (matrix products, attention,
 * norms, quantization) process-wide: "scalar", "avx2" (AVX2 + FMA + F16C +
 * BMI2) or "avx512" (AVX-512 F/BW/VL/VNNI on top); "auto", "" or NULL: the
 * best this CPU has. The environment variable KEEL_SIMD (same names) sets
 * the starting path, read once at the first kernel call (an unknown value
 * there is ignored). KEEL_EINVAL for an unknown name, KEEL_EUNSUPPORTED
 * when the CPU lacks the path (the path in force is unchanged). Not
 * thread-safe: call while no other keel call runs. Allocates nothing.
 */
keel_status keel_set_simd(const char *name);

/* The kernel path in force: "scalar", "avx2" or "avx512". Static string. */
const char *keel_simd_name(void);

/* OpenBLAS (prompt processing's large products) picks its kernels from the
 * CPU model when the process loads it; on a model it does not know (a newer
 * CPU, or a VM that hides it) it falls back to generic SSE3 kernels, several
 * times slower. NULL when its kernels use the CPU's AVX2 / AVX-512 (or the
 * CPU has neither), else the OPENBLAS_CORETYPE value that does ("Haswell",
 * "SkylakeX"): set it in the environment before the process starts. keel
 * and keel serve restart themselves with it; a program that loads libkeel
 * gets one warning through the log callback at its first large product.
 * Static string. */
const char *keel_blas_coretype_advice(void);

/* ======================================================================== */
/* Data types                                                               */
/* ======================================================================== */

/* Element types. Values are GGUF's (ggml_type), so block layouts and ids are
 * byte-compatible with GGUF files. */
typedef enum keel_dtype {
    KEEL_DTYPE_F32 = 0,
    KEEL_DTYPE_F16 = 1,
    KEEL_DTYPE_Q4_0 = 2,
    KEEL_DTYPE_Q4_1 = 3,
    KEEL_DTYPE_Q5_0 = 6,
    KEEL_DTYPE_Q5_1 = 7,
    KEEL_DTYPE_Q8_0 = 8,
    KEEL_DTYPE_Q8_1 = 9,
    KEEL_DTYPE_Q2_K = 10,
    KEEL_DTYPE_Q3_K = 11,
    KEEL_DTYPE_Q4_K = 12,
    KEEL_DTYPE_Q5_K = 13,
    KEEL_DTYPE_Q6_K = 14,
    KEEL_DTYPE_Q8_K = 15,
    KEEL_DTYPE_I8 = 24,
    KEEL_DTYPE_I16 = 25,
    KEEL_DTYPE_I32 = 26,
    KEEL_DTYPE_I64 = 27,
    KEEL_DTYPE_F64 = 28,
    KEEL_DTYPE_BF16 = 30,
    KEEL_DTYPE_COUNT_ = 40 /* upper bound of ids, not a type */
} keel_dtype;

/* Lower-case name ("q8_0"), or NULL for an id keel does not know. */
const char *keel_dtype_name(keel_dtype dtype);

/* Parses a name ("q8_0", "F16", case-insensitive). KEEL_EINVAL if unknown. */
keel_status keel_dtype_from_name(const char *name, keel_dtype *out);

/* Elements per block (1 for f32/f16/bf16, 32 for q8_0, 256 for K-quants);
 * 0 for an unknown id. */
int64_t keel_dtype_block_size(keel_dtype dtype);

/* Bytes per block; 0 for an unknown id. */
size_t keel_dtype_block_bytes(keel_dtype dtype);

/* Bytes of a row of n elements. KEEL_EINVAL for an unknown id or an n that
 * is not a multiple of the block size, KEEL_EOVERFLOW on overflow. */
keel_status keel_dtype_row_bytes(keel_dtype dtype, int64_t n, size_t *out);

/* True when keel can quantize to this type (not only read it). */
bool keel_dtype_can_quantize(keel_dtype dtype);

/* ======================================================================== */
/* Rotary position embedding parameters                                     */
/* ======================================================================== */

typedef enum keel_rope_type {
    KEEL_ROPE_NONE = -1, /* no rotation (e.g. recurrent layers) */
    KEEL_ROPE_NORM = 0,  /* rotate adjacent pairs (x[2i], x[2i+1]) (llama) */
    KEEL_ROPE_NEOX = 2,  /* rotate halves (x[i], x[i + n_rot/2]) (neox, qwen, gemma) */
} keel_rope_type;

/*
 * RoPE as GGUF carries it. Dimension pair i (0 <= i < n_rot/2) of a token at
 * position p is rotated by p * theta_i, theta_i = freq_base^(-2i/n_rot)
 * (divided by freq_factors[i] when given), with linear scaling
 * (freq_scale = 1/factor) and YaRN's ramp between interpolated and
 * extrapolated angles when ext_factor > 0. Angles are computed in double
 * precision, so rotations stay accurate for positions up to 2^24.
 */
typedef struct keel_rope {
    keel_rope_type type;
    int32_t n_rot;         /* rotated dims per head: even, <= head_dim */
    float freq_base;       /* theta base, e.g. 10000 */
    float freq_scale;      /* 1 / linear scaling factor; 1 = none */
    float ext_factor;      /* YaRN extrapolation mix; 0 = off */
    float attn_factor;     /* YaRN magnitude multiplier; 1 = none */
    float beta_fast;       /* YaRN ramp, e.g. 32 */
    float beta_slow;       /* YaRN ramp, e.g. 1 */
    int32_t n_ctx_orig;    /* YaRN: original training context */
    const float *freq_factors; /* optional [n_rot/2] divisors of theta_i, NULL = none;
                                  borrowed, must outlive the user */
} keel_rope;

/* Llama defaults: NORM, base 10000, no scaling (n_rot must be set). */
keel_rope keel_rope_default(void);

/* ======================================================================== */
/* Benchmarks                                                               */
/* ======================================================================== */

/* Output sink for text produced by the library on request (benchmarks,
 * reports). Called with NUL-free chunks; the library never prints. */
typedef void (*keel_write_fn)(void *user, const char *text, size_t n);

/*
 * Runs the named benchmark ("kernels", "attention", "model") with CLI-style
 * arguments (argv[0] is the first option, not a program name) and writes a
 * human table, or one JSON object with "--json", to out. Only results go
 * to out; what failed is written to err (256 bytes, may be NULL).
 * KEEL_ENOENT for an unknown name, KEEL_EINVAL for bad options (an unknown
 * option, a stray argument, a missing or malformed value: named in err),
 * others from what the benchmark runs (model open, context, decode).
 * Allocates; runs threads; takes seconds.
 */
keel_status keel_bench_run(const char *name, int argc, char **argv, keel_write_fn out, void *user,
                           char *err);

/* ======================================================================== */
/* Memory core: the KV cache                                                */
/* ======================================================================== */
/*
 * A keel_mem holds the attention memory of a model: for each layer, K and V
 * rows of every cached token. Layers of the same kind (full attention, or
 * sliding with the same window and sinks) share one cell table: per-cell
 * metadata (position, sequence set, placement stamp) and, registered with
 * it, one column per per-token datum (K rows, V rows, ...). Every operation
 * that frees, moves or copies cells goes through the table, which applies it
 * to all of its columns. docs/memory.md explains the model.
 *
 * Usage per batch ("ubatch") of tokens:
 *   1. keel_mem_place()  — validates positions and sequences, evicts what
 *      sliding rings no longer need, finds cells: cells[group][token].
 *   2. keel_mem_write()  — per layer: stores the tokens' K (RoPE already
 *      applied at their positions) and V rows; rotation and quantization
 *      happen here.
 *   3. keel_mem_attend() — per layer: softmax(QK^T * scale + mask) V for
 *      query tokens, over every visible cell (causal, sequence and sliding
 *      masks).
 * Sequence edits (seq_rm, seq_cp, seq_keep, seq_add, seq_div, clear) are
 * validated first and committed second: a failure changes nothing.
 *
 * Sliding layers: a sequence's cells in a sliding table are its n_sink
 * lowest-position cells (the sinks; never evicted) and the cells the most
 * recent placement still needs (positions > p_first - window), at most
 * `window` of them besides the sinks (the most recently placed, by stamp:
 * this only bites after position edits put several cells on one position,
 * or for a sequence whose last batch was longer than the window). Cells
 * beyond that are forgotten at the next placement; the mask lets a query at
 * position p see the sinks and keys at positions in (p - window, p]. The
 * ring's capacity is n_seq * (n_sink + window) + n_batch_max per stream
 * (clipped to n_ctx), so unless n_ctx clips it, placement never fails for
 * lack of room in a ring. Physical rows come only from the table; logical
 * counts and positions are never used as row bounds.
 *
 * Thread-safety: a keel_mem is used by one thread at a time; it runs its
 * own worker threads (n_threads) inside keel_mem_attend and position edits.
 */

typedef struct keel_mem keel_mem;

typedef enum keel_mem_layer_kind {
    KEEL_MEM_LAYER_FULL = 0,    /* full causal attention */
    KEEL_MEM_LAYER_SLIDING = 1, /* ring: sinks + last `window` positions */
    KEEL_MEM_LAYER_NONE = 2,    /* no KV and no state (attention-free layer) */
    KEEL_MEM_LAYER_RECURRENT = 3, /* no KV: a per-sequence recurrent state (conv + SSM /
                                     delta rule, f32), see keel_mem_recurrent */
} keel_mem_layer_kind;

/* Shape of a recurrent layer's per-sequence state (KEEL_MEM_LAYER_RECURRENT):
 * the causal conv1d keeps its last conv_kernel - 1 inputs, conv
 * [conv_kernel - 1][conv_channels] f32, and the SSM / delta-rule state is
 * state_floats f32 (Gated DeltaNet: v_heads x head_v x head_k; Mamba2:
 * heads x head_dim x d_state). Both are zero for a new sequence. */
typedef struct keel_mem_recurrent {
    int32_t conv_kernel;   /* taps of the conv, 1..64 (1: no conv state) */
    int32_t conv_channels; /* 1..2^20 */
    int64_t state_floats;  /* 0..2^30 */
} keel_mem_recurrent;

/* Hadamard rotation of stored rows: each head's row is split into blocks of
 * `block` elements and each block stored as H D x (H normalized
 * Walsh-Hadamard, D the random-sign diagonal of `seed`). */
typedef struct keel_mem_rot {
    bool enabled;
    int32_t block;  /* power of two in [32, 512] dividing head_dim; 0 = the
                       largest such power of two; negative is KEEL_EINVAL */
    uint64_t seed;  /* sign diagonal seed; 0 = no signs (plain H) */
} keel_mem_rot;

typedef struct keel_mem_layer {
    keel_mem_layer_kind kind;
    int32_t window;     /* sliding: keys at positions (p - window, p] are visible */
    int32_t n_sink;     /* sliding: lowest positions of a sequence always kept and visible */
    int32_t n_kv_heads;
    int32_t n_heads;    /* query heads attending this layer (multiple of n_kv_heads);
                           0 = n_kv_heads. Sizes attention scratch. */
    int32_t head_dim_k;
    int32_t head_dim_v;
    keel_dtype k_dtype; /* f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1 */
    keel_dtype v_dtype;
    keel_mem_rot k_rot;
    keel_mem_rot v_rot;
    keel_rope rope;     /* RoPE of the stored keys, for position edits; type NONE
                           if keys carry no position */
    keel_mem_recurrent rs; /* KEEL_MEM_LAYER_RECURRENT: the state's shape */
    /* Sparse attention (DSA lightning indexer, deepseek32): idx_head_dim > 0
     * gives the layer a third column in its table, one indexer key per token
     * (a single head), written with K and V (keel_mem_write_kvi) and moved,
     * copied, evicted, compacted, saved and loaded with them; attention then
     * keeps the idx_top_k visible cells a query's indexer scores rank first
     * (keel_mem_attn.iq; docs/memory.md, "Sparse attention"). */
    int32_t idx_head_dim;  /* 0: no indexer column; else 1..8192 */
    int32_t idx_n_heads;   /* indexer query heads a call may pass (1..4096; scratch) */
    keel_dtype idx_dtype;  /* storage type of the indexer keys (as K) */
    keel_mem_rot idx_rot;  /* their Hadamard rotation (deepseek32: on, seed 0) */
    keel_rope idx_rope;    /* RoPE of the stored indexer keys (first n_rot dims), for
                              position edits; type NONE if they carry no position */
    int32_t idx_top_k;     /* cells a query attends at most (1..2^20) */
} keel_mem_layer;

/* A full-attention layer with 1 KV head of dim 64, f16 K/V, no rotation,
 * rope NORM over the whole head, no indexer column (idx_rope type NONE)
 * (set n_kv_heads/head dims/rope as needed). */
keel_mem_layer keel_mem_layer_default(void);

typedef struct keel_mem_config {
    const keel_mem_layer *layers; /* [n_layers]; copied at open */
    int32_t n_layers;
    int32_t n_seq_max;   /* sequence ids are 0 .. n_seq_max-1 (<= 256) */
    int32_t n_ctx;       /* cells of each full-attention table (per stream) */
    bool unified;        /* true: all sequences share one table per group;
                            false: one stream (table per group) per sequence */
    int32_t n_batch_max; /* most tokens per keel_mem_place / keel_mem_attend */
    int32_t n_threads;   /* threads for attention and edits; 0 = all CPUs */
    bool deterministic;  /* attention of a query independent of the other queries of
                            the call and of the cells' physical order (each query alone,
                            its visible cells in (position, placement) order; slower):
                            batch-invariant results for concurrent sequences */
    /* recurrent layers (docs/memory.md, "The recurrent half") */
    int32_t n_rs_slots;  /* state slots (one per sequence holding tokens; forks share
                            one until written); 0 = n_seq_max */
    int32_t n_ckpt;      /* checkpoints kept per sequence (0: none; needs recurrent layers) */
    size_t ckpt_bytes;   /* per sequence cap on checkpoint storage (0: no cap beyond
                            n_ckpt records); fewer records are kept if it bites */
    bool spec_snapshot;  /* recurrent layers: one state snapshot per sequence for
                            speculative batches (keel_mem_spec_save); ignored without
                            recurrent layers, whose drafts seq_rm removes exactly */
} keel_mem_config;

/* n_seq_max 1, n_ctx 4096, unified, n_batch_max 512, n_threads 0, no layers. */
keel_mem_config keel_mem_config_default(void);

/* Exact bytes keel_mem_open will allocate for cfg (tables, columns,
 * scratch, the object itself), computed before allocating anything.
 * Validates cfg like keel_mem_open. */
keel_status keel_mem_config_bytes(const keel_mem_config *cfg, size_t *bytes);

/* Opens a memory for cfg. KEEL_EINVAL (bad config, including RoPE
 * parameters tensor_rope would reject: non-finite or non-positive freq_base,
 * freq_scale or attn_factor, non-finite ext_factor, YaRN without n_ctx_orig,
 * freq_factors not finite > 0; split streams of more than 2^31 - 1 cells;
 * detail in *err if err is not NULL, err has room for 256 bytes),
 * KEEL_EUNSUPPORTED (dtype/head_dim combination), KEEL_ENOMEM,
 * KEEL_EOVERFLOW. *out is NULL on failure. */
keel_status keel_mem_open(const keel_mem_config *cfg, keel_mem **out, char *err);
void keel_mem_close(keel_mem *mem);

/* Detail of the last failed operation on mem ("" if none). Valid until the
 * next call on mem. */
const char *keel_mem_last_error(const keel_mem *mem);

/* Number of cell tables groups (distinct layer kinds) and the group of a
 * layer (-1 for KEEL_MEM_LAYER_NONE). */
int32_t keel_mem_n_groups(const keel_mem *mem);
int32_t keel_mem_layer_group(const keel_mem *mem, int32_t layer);

/* A batch of tokens to place. Token i has position pos[i] and belongs to
 * the sequences seq_id[i][0 .. n_seq_id[i]) (n_seq_id NULL: one sequence,
 * seq_id1[i]). Positions of one sequence must continue it: the first token
 * of s in the batch is at seq_pos_max(s) + 1 (any position >= 0 if s is
 * empty), the next at +1 each. */
typedef struct keel_mem_batch {
    int32_t n_tokens;
    const int32_t *pos;            /* [n_tokens] */
    const int32_t *seq_id1;        /* [n_tokens] one sequence per token, or NULL */
    const int32_t *n_seq_id;       /* [n_tokens] or NULL */
    const int32_t *const *seq_id;  /* [n_tokens][n_seq_id[i]] or NULL */
    const uint8_t *protect;        /* [n_tokens] non-zero: compaction keeps the token
                                      (special tokens: BOS, role markers), or NULL */
} keel_mem_batch;

/*
 * Places a batch: cells[g * n_tokens + i] receives the cell of token i in
 * group g (cells has room for n_groups * n_tokens). KEEL_EINVAL (bad
 * sequence id, position gap or out of order, n_tokens > n_batch_max, a
 * missing array: n_seq_id set with seq_id or one seq_id[i] NULL),
 * KEEL_EFULL (a full-attention table has too few free cells). All or
 * nothing. Allocates nothing.
 */
keel_status keel_mem_place(keel_mem *mem, const keel_mem_batch *batch, int32_t *cells);

/*
 * Stores K and V rows of layer for n tokens at cells (from keel_mem_place,
 * group of the layer): k is f32 [n][n_kv_heads][head_dim_k] with RoPE
 * already applied at each token's position, v f32 [n][n_kv_heads][head_dim_v].
 * Rows are rotated (if enabled) then quantized. KEEL_EINVAL for a layer
 * without KV, a layer with an indexer column (keel_mem_write_kvi), an empty
 * cell, a cell out of range or a cell listed twice (nothing is written then).
 */
keel_status keel_mem_write(keel_mem *mem, int32_t layer, int32_t n, const int32_t *cells,
                           const float *k, const float *v);

/* keel_mem_write with the layer's indexer keys: ik is f32
 * [n][idx_head_dim] with RoPE applied, stored (rotated, quantized) in the
 * same cells as K and V; NULL for layers without an indexer column.
 * KEEL_EINVAL as keel_mem_write, and for ik missing on a layer with an
 * indexer column or given for one without. Allocates nothing. */
keel_status keel_mem_write_kvi(keel_mem *mem, int32_t layer, int32_t n, const int32_t *cells,
                               const float *k, const float *v, const float *ik);

/* Attention of query tokens over the cache of one layer. */
typedef struct keel_mem_attn {
    int32_t n_tokens;
    int32_t n_heads;         /* query heads, a multiple of n_kv_heads (GQA) */
    const float *q;          /* [n_tokens][n_heads][head_dim_k], RoPE applied */
    const int32_t *pos;      /* [n_tokens] query positions */
    const int32_t *seq;      /* [n_tokens] the sequence each query attends in */
    float *out;              /* [n_tokens][n_heads][head_dim_v] */
    float scale;             /* 0: 1/sqrt(head_dim_k) */
    float softcap;           /* > 0: s <- softcap * tanh(s / softcap) */
    const float *sinks;      /* [n_heads] learned sink logits, or NULL */
    /* sparse attention (layers with an indexer column; iq NULL: dense) */
    const float *iq;         /* [n_tokens][n_iq_heads][idx_head_dim] indexer queries, RoPE
                                applied (rotated into the column's basis here) */
    const float *iw;         /* [n_tokens][n_iq_heads] head weights, scales folded in */
    int32_t n_iq_heads;      /* 1..idx_n_heads */
    int32_t top_k;           /* 0: the layer's idx_top_k; else 1..idx_top_k */
    int32_t *sel;            /* optional out [n_tokens][top_k]: the cells each query kept
                                (group cell ids) in (position, placement) order, -1 after
                                the last; NULL to skip */
} keel_mem_attn;

/* Computes out. Accumulates in f32 with an online softmax; splits the KV
 * range across threads for long contexts. A query that sees no cell (and
 * has no sink logit) gets zeros. KEEL_EINVAL for bad shapes or sequence
 * ids. Allocates nothing (scratch reserved at open).
 *
 * Sparse attention (a->iq set, the layer has an indexer column): each
 * query scores every cell it may see (the sequence, causal and sliding
 * rules of dense attention) with score = sum_h iw[h] * max(0, iq_h . ik),
 * ik the cell's stored indexer key, keeps the top_k highest (all of them
 * when fewer are visible), and attends over those alone in (position,
 * placement) order. Equal scores across the top_k boundary (relu makes
 * exact zeros common) are kept or dropped as std::partial_sort's heap
 * selection (libstdc++, which llama.cpp's CPU top_k uses) does over the
 * visible cells in (position, placement) order: deterministic, and
 * independent of the cells' physical order, other queries and other
 * sequences. A NaN score ranks below every number. */
keel_status keel_mem_attend(keel_mem *mem, int32_t layer, const keel_mem_attn *a);

/* Sequence edits. seq < 0 means every sequence where noted; p0 < 0 means 0
 * and p1 < 0 means +infinity. Each validates first and commits second. */

/* Removes cells of seq (all seqs if seq < 0) with p0 <= pos < p1.
 * KEEL_ERANGE for an empty range (p1 <= p0 with both given). */
keel_status keel_mem_seq_rm(keel_mem *mem, int32_t seq, int32_t p0, int32_t p1);
/* Makes dst share src's cells with p0 <= pos < p1 (copies them into dst's
 * stream when streams are separate). KEEL_EFULL if they do not fit. */
keel_status keel_mem_seq_cp(keel_mem *mem, int32_t src, int32_t dst, int32_t p0, int32_t p1);
/* Drops every sequence but seq. */
keel_status keel_mem_seq_keep(keel_mem *mem, int32_t seq);
/* Adds delta to the positions of seq's cells in [p0, p1) and rotates their
 * stored keys by delta. Cells shared with other sequences are split first
 * (copy on write) when they move, so other sequences are untouched.
 * KEEL_ERANGE if a position would become negative or reach INT32_MAX;
 * KEEL_EFULL if no room to split. */
keel_status keel_mem_seq_add(keel_mem *mem, int32_t seq, int32_t p0, int32_t p1, int32_t delta);
/* Divides the positions of seq's cells in [p0, p1) by d (integer, > 0),
 * correcting stored keys. */
keel_status keel_mem_seq_div(keel_mem *mem, int32_t seq, int32_t p0, int32_t p1, int32_t d);
/* Empties every table. */
void keel_mem_clear(keel_mem *mem);

/* Smallest / largest position of seq over all tables; -1 if it has no cell. */
int32_t keel_mem_seq_pos_min(const keel_mem *mem, int32_t seq);
int32_t keel_mem_seq_pos_max(const keel_mem *mem, int32_t seq);
/* Smallest p0 such that seq_rm(seq, p', -1) for every p' >= p0 leaves a
 * memory equal to recomputing the kept prefix (sliding rings may have
 * forgotten keys that a query at p' would need; a compaction makes every
 * position up to its end inexact); 0 when nothing was forgotten. A
 * conservative bound: never below the exact one. On a recurrent sequence
 * the kept prefix ends at the checkpoint restored: the bound is its oldest
 * checkpoint, or its end + 1 without one. */
int32_t keel_mem_seq_rewind_min(const keel_mem *mem, int32_t seq);
/* True when stored keys can follow position edits (seq_add / seq_div). */
bool keel_mem_can_shift(const keel_mem *mem);

/* ---- compaction ---------------------------------------------------------
 * Compaction evicts cells of one sequence from the full-attention tables so
 * that a long session stays within a fixed budget (docs/compaction.md).
 * Sliding rings are never compacted; their positions follow renumbering. */

typedef enum keel_compact_policy {
    KEEL_COMPACT_NONE = 0,    /* never compact */
    KEEL_COMPACT_WINDOW = 1,  /* sinks + the most recent (StreamingLLM) */
    KEEL_COMPACT_KEYDIFF = 2, /* keep keys least similar to the mean key (KeyDiff) */
    KEEL_COMPACT_KNORM = 3,   /* keep keys of smallest norm */
    KEEL_COMPACT_RANDOM = 4,  /* seeded random baseline */
} keel_compact_policy;

typedef struct keel_compact_params {
    keel_compact_policy policy;
    int32_t trigger;  /* compact when the sequence holds more full-attention cells */
    int32_t target;   /* cells kept by a compaction (< trigger) */
    int32_t n_sink;   /* lowest positions always kept (< target) */
    float recent;     /* fraction of target reserved for the most recent tokens, [0, 1) */
    bool renumber;    /* renumber kept positions 0..target-1 (keys corrected exactly);
                         false keeps the original positions */
    bool protect;     /* keep tokens placed with protect set, budget permitting */
    uint64_t seed;    /* KEEL_COMPACT_RANDOM */
} keel_compact_params;

/* policy none; trigger 0, target 0; n_sink 4; recent 0.25; renumber; protect; seed 1 */
keel_compact_params keel_compact_params_default(void);

/* Name of a policy ("keydiff") / parse one. */
const char *keel_compact_policy_name(keel_compact_policy p);
keel_status keel_compact_policy_from_name(const char *name, keel_compact_policy *out);

/* Checks a parameter set: KEEL_EINVAL with the reason in err (256 bytes, may
 * be NULL) for target >= trigger, n_sink >= target, recent out of [0, 1),
 * sinks + recent above target, negative values. policy none is always valid. */
keel_status keel_compact_params_check(const keel_compact_params *p, char *err);

/* Compacts sequence seq to p->target full-attention cells now (if it holds
 * more): keeps the sinks, the recent tokens, protected tokens while the
 * budget allows, and the best-scored others; frees the rest; renumbers if
 * asked. Cells shared with other sequences only lose seq (other sequences
 * are untouched). Sliding tables keep their cells; every token they hold
 * must be kept (recent tokens must cover the window): else KEEL_EINVAL and
 * nothing changes. KEEL_EFULL if renumbering shared cells finds no room for
 * their copies. All or nothing. */
keel_status keel_mem_compact(keel_mem *mem, int32_t seq, const keel_compact_params *p);

/* Cells of seq in the full-attention tables (what trigger compares with). */
int32_t keel_mem_seq_cells(const keel_mem *mem, int32_t seq);
/* Most full-attention cells seq has held at once (after any operation)
 * since open, clear or the sequence was emptied. */
int32_t keel_mem_seq_cells_high(const keel_mem *mem, int32_t seq);
/* Compactions applied to seq since open. */
int64_t keel_mem_seq_compactions(const keel_mem *mem, int32_t seq);

typedef struct keel_mem_stats {
    int64_t cells_used;    /* occupied cells over all tables */
    int64_t cells_cap;     /* cells over all tables */
    size_t bytes_used;     /* column bytes of occupied cells */
    size_t bytes_total;    /* everything keel_mem_open allocated */
    size_t scratch_bytes;  /* the scratch arena's reservation */
    size_t scratch_high;   /* its high-water mark since open */
    int64_t tokens_placed; /* logical cursor: tokens ever placed */
} keel_mem_stats;

/* Fills out (zeros for a NULL mem; a NULL out is a no-op). */
void keel_mem_stats_get(const keel_mem *mem, keel_mem_stats *out);
/* Cells used by one group (all streams). */
int64_t keel_mem_group_cells_used(const keel_mem *mem, int32_t group);

/* Checks every invariant of docs/memory.md (design.md section 3) on the
 * live memory: table metadata, column descriptors and sizes, sequence sets,
 * sliding retention, agreement between groups, finite stored rows.
 * KEEL_EINTERNAL with the first violation in keel_mem_last_error. */
keel_status keel_mem_check(keel_mem *mem);

/* 64-bit digest of all metadata and every column byte (tests: "nothing
 * changed" after a refused operation). */
uint64_t keel_mem_digest(const keel_mem *mem);

/* ---- sessions: saving and loading the memory --------------------------------
 * A session blob holds one sequence (seq >= 0) or the whole memory (seq -1):
 * the column descriptors, the caller's token history, every cell's position,
 * placement order and flags (and sequence set for the whole memory), every
 * column's rows, the exactness and compaction state; sections carry their
 * length and an xxhash64 (docs/formats.md, "Sessions"). */

/*
 * Writes the session of seq (-1: every sequence) to buf[0 .. cap):
 * fingerprint (e.g. the model's, 0 for none) is stored and checked at load;
 * tokens[0 .. n_tokens) is the caller's token history of the sequence, of
 * which the last n_pending are not in the memory yet (sampled, not decoded),
 * stored as is (keel_mem_load checks it against the cells). *n_out is the
 * size (also when buf is NULL or too small: KEEL_ERANGE, nothing written).
 * KEEL_EINVAL, named in keel_mem_last_error: an unknown seq, n_out NULL,
 * n_tokens or n_pending negative, n_pending > n_tokens, tokens NULL with
 * n_tokens > 0. Allocates nothing (scratch reserved at open).
 */
keel_status keel_mem_save(keel_mem *mem, int32_t seq, uint64_t fingerprint, const int32_t *tokens,
                          int32_t n_tokens, int32_t n_pending, void *buf, size_t cap, size_t *n_out);

/* keel_mem_load / keel_session_load flag: re-encode rows stored with other
 * K/V types or rotation into this memory's (decode, undo the stored
 * rotation, encode as the column does); without it they are refused. */
#define KEEL_SESSION_CONVERT 1u

/*
 * Loads a session blob into seq (replacing what seq holds; -1: the whole
 * memory, replacing everything; the blob must be of the same kind). Every
 * section is validated first — magic, version, fingerprint (when non-zero),
 * checksums, lengths, the column descriptors (the same layers, heads, dims
 * and RoPE as this memory; the same dtypes and rotation unless flags has
 * KEEL_SESSION_CONVERT: else KEEL_EUNSUPPORTED), cell metadata and room
 * (KEEL_EFULL), and the token history against the cells of a one-sequence
 * session (below) — and only then does the memory change; any failure
 * leaves it byte-identical. The token history goes to tokens (cap_tokens
 * entries; NULL to skip; KEEL_ERANGE if it does not fit), its length to
 * *n_tokens and its pending count to *n_pending (may be NULL).
 * The history agrees with the cells when, with c = n_tokens - n_pending the
 * tokens in the cache: a sequence never compacted holds them at positions
 * 0 .. c-1 (its last cell at c-1, every position at most once per layer
 * group, the first full-attention group all of them; sliding rings may have
 * forgotten the oldest; recurrent-only memories: the state's last position
 * is c-1); a compacted one (docs/compaction.md) holds a summary the history
 * only extends (no group more than c cells, none at or past position c, each
 * position at most once). An empty history (n_tokens 0) means none was
 * recorded and is not checked here; a whole-memory session's history names
 * no sequence and is stored as is. KEEL_EFORMAT (corrupted or truncated; a
 * history that disagrees, named), KEEL_EINVAL (another model or memory
 * shape; n_tokens NULL; buf NULL with len > 0). Allocates nothing.
 */
keel_status keel_mem_load(keel_mem *mem, int32_t seq, const void *buf, size_t len, uint64_t fingerprint,
                          unsigned flags, int32_t *tokens, int32_t cap_tokens, int32_t *n_tokens,
                          int32_t *n_pending);
/* ---- the recurrent half ----------------------------------------------------
 * Layers of kind KEEL_MEM_LAYER_RECURRENT keep, per sequence, a state that
 * summarizes every token of the sequence (rule 7: valid only at its last
 * position). It lives in the same keel_mem: one plan, one digest, one
 * checker, and every sequence operation applies to both halves or to
 * neither. On a memory with recurrent layers (docs/memory.md):
 *   - keel_mem_place: a token belongs to one sequence (KEEL_EINVAL
 *     otherwise); each sequence of the batch gets an exclusive state slot (a
 *     new sequence a zeroed one, a fork sharing its slot a copy, except
 *     the last of the slot's sharers in the batch, which keeps it:
 *     KEEL_EFULL if n_rs_slots has too few free).
 *   - keel_mem_seq_rm(s, p0, -1) with p0 inside the sequence restores the
 *     newest checkpoint at or before p0 (the sequence then ends at the
 *     checkpoint: keel_mem_seq_pos_max tells where to resume) and truncates
 *     attention to match, or returns KEEL_ESTATE naming the nearest
 *     checkpoint and changes nothing. Removing a range that starts inside
 *     the sequence and ends before its end is KEEL_ESTATE; removing every
 *     token is always allowed.
 *   - keel_mem_seq_cp copies all of src into an empty dst (the state is
 *     shared, copy on write): KEEL_ESTATE for a partial range or a dst that
 *     holds tokens. Checkpoints are not copied.
 *   - keel_mem_seq_add / seq_div edit the attention half; the state does not
 *     depend on positions and follows the last token; checkpoints reaching
 *     into the edited range are dropped. KEEL_ESTATE if the edit would move
 *     the last token below another token of the sequence.
 *   - keel_mem_compact applies to the attention layers (approximate for the
 *     recurrent half, which already summarizes everything) and drops the
 *     sequence's checkpoints.
 */

/* Pointers to seq's state in recurrent layer `layer`, to be read and
 * updated in place after keel_mem_place placed tokens of seq (the slot is
 * then exclusive): *conv [conv_kernel - 1][conv_channels] (oldest input
 * first; NULL when conv_kernel is 1), *state [state_floats]. Valid until
 * the next operation on mem. KEEL_EINVAL (not a recurrent layer, bad seq),
 * KEEL_ESTATE (seq holds no tokens, or shares its state with another
 * sequence: it is copied at the next placement). Allocates nothing. */
keel_status keel_mem_rs_state(keel_mem *mem, int32_t layer, int32_t seq, float **conv,
                              float **state);
/* True when mem has recurrent layers. */
bool keel_mem_is_recurrent(const keel_mem *mem);

/* A checkpoint of a sequence: its recurrent state and the sliding rings'
 * rows a query at `pos` needs, taken when the sequence ended at pos - 1.
 * A memory without recurrent layers but with sliding ones keeps
 * checkpoints of ring rows alone (n_ckpt > 0): a rewind below
 * keel_mem_seq_rewind_min, which seq_rm cannot do exactly (the rings forgot
 * those tokens), restores one (keel_mem_ckpt_restore). Such checkpoints are
 * dropped by every operation that changes what the sequence holds below
 * them (removals, copies into it, position edits, compaction). */
typedef struct keel_mem_ckpt_info {
    int32_t pos;     /* covers positions < pos: seq_rm(seq, p0 >= pos, -1) can restore it */
    int32_t pos_min; /* the sequence's first position when taken */
    size_t bytes;    /* bytes of the snapshot (state + ring rows) */
    int32_t priority; /* keel_mem_ckpt_take_prio / _set_prio; 0 by default */
} keel_mem_ckpt_info;

/* Takes a checkpoint of seq at its end (pos = seq_pos_max + 1) with
 * priority 0: keel_mem_ckpt_take_prio(mem, seq, 0). */
keel_status keel_mem_ckpt_take(keel_mem *mem, int32_t seq);
/* Takes a checkpoint of seq at its end (pos = seq_pos_max + 1) with a
 * priority (>= 0). When n_ckpt are held, the record of the lowest priority
 * is dropped, the oldest among equals; when every record has a higher
 * priority than the new one, the new one is not kept (KEEL_OK): a caller
 * protects the checkpoints it will need (where prompts are likely to
 * diverge) from a stream of periodic ones. When the newest checkpoint
 * already has that position it is kept, its priority raised to prio.
 * Priorities are not saved in sessions (a loaded checkpoint has 0).
 * KEEL_EINVAL (bad seq, negative priority), KEEL_EUNSUPPORTED (n_ckpt 0),
 * KEEL_ESTATE (seq holds no tokens). Allocates nothing (storage planned at
 * open). */
keel_status keel_mem_ckpt_take_prio(keel_mem *mem, int32_t seq, int32_t priority);
/* Sets the priority of seq's checkpoint at pos. KEEL_ENOENT (none there),
 * KEEL_EINVAL. */
keel_status keel_mem_ckpt_set_prio(keel_mem *mem, int32_t seq, int32_t pos, int32_t priority);
/* Restores seq's newest checkpoint at or before p0: attention truncated to
 * positions below its pos, the rings' cells of seq replaced by the saved
 * ones, the recurrent state copied back; *pos (may be NULL) receives the
 * checkpoint's pos, where the caller resumes feeding tokens. KEEL_ESTATE
 * (none at or before p0), KEEL_EFULL (the rings lack room for the saved
 * cells, or a shared state needs a free slot), KEEL_EINVAL; nothing changed
 * on failure. Allocates nothing. */
keel_status keel_mem_ckpt_restore(keel_mem *mem, int32_t seq, int32_t p0, int32_t *pos);
/* seq's checkpoints, oldest first, into out[0 .. cap); *n their number. */
void keel_mem_ckpt_list(const keel_mem *mem, int32_t seq, keel_mem_ckpt_info *out, int32_t cap,
                        int32_t *n);
/* The position a rewind to p0 resumes from: p0 itself when nothing needs
 * restoring (p0 at or past the end, at or before the start; on an
 * attention memory p0 at or above keel_mem_seq_rewind_min, where seq_rm is
 * exact), else the newest checkpoint's position at or before p0, or -1 when
 * none covers it (a recurrent seq_rm would return KEEL_ESTATE). */
int32_t keel_mem_ckpt_find(const keel_mem *mem, int32_t seq, int32_t p0);
/* Speculation. A batch of drafted tokens is verified and its rejected
 * tail removed again. On attention layers (rings included: a placement
 * forgets only what no query at or after the batch's first position
 * needs) keel_mem_seq_rm of the tail is exact. A recurrent state cannot be
 * truncated, so before such a batch the caller saves the sequence's state
 * in a snapshot record of its own (cfg.spec_snapshot; not one of the n_ckpt
 * checkpoints, never saved in sessions):
 *
 *   keel_mem_spec_save(mem, seq)        before placing the drafted batch
 *   keel_mem_spec_restore(mem, seq, &p) back to the state at the save (p:
 *                                       its position); the caller feeds the
 *                                       accepted tokens again from p
 *
 * save: KEEL_EUNSUPPORTED (no snapshot storage: no recurrent layers or
 * spec_snapshot false), KEEL_ESTATE (seq holds no tokens), KEEL_EINVAL.
 * restore: KEEL_ESTATE (no snapshot of seq, or seq changed since in any
 * way but placing tokens after it), KEEL_EFULL (seq shares its state with
 * a fork and no slot is free), KEEL_EINVAL; nothing changed on failure.
 * A snapshot is dropped by every edit of seq other than placement and by
 * restore itself. Both allocate nothing. */
keel_status keel_mem_spec_save(keel_mem *mem, int32_t seq);
keel_status keel_mem_spec_restore(keel_mem *mem, int32_t seq, int32_t *pos);
/* The position of seq's snapshot (its end + 1 when saved), or -1. */
int32_t keel_mem_spec_pos(const keel_mem *mem, int32_t seq);

/* Bytes of one checkpoint record and of all of them (planned at open). */
size_t keel_mem_ckpt_record_bytes(const keel_mem *mem);
size_t keel_mem_rs_bytes(const keel_mem *mem);
size_t keel_mem_ckpt_bytes(const keel_mem *mem);

/* KEEL_SECTION_MEMORY */

/* ======================================================================== */
/* Models                                                                   */
/* ======================================================================== */
/*
 * A keel_model is a loaded model file: weights memory-mapped from a GGUF
 * file (or converted in memory from a llama2.c checkpoint), hyperparameters
 * and the tokenizer. It is immutable after open and may be shared by
 * several contexts and threads. Supported architectures and dtypes are
 * listed in docs/models.md.
 */

typedef struct keel_model keel_model;

/* How a GGUF file becomes the model's weights. Mapped, the pages are the
 * page cache's: nothing is allocated, other processes share them, and the
 * kernel may drop and re-read them. Read, the file is copied into memory
 * from keel's allocator once at open (its size, allocated), which the
 * default allocator asks to back with transparent huge pages: decode reads
 * every weight once per token, and with 4 KiB pages that is a TLB miss
 * every 4 KiB (a two-level walk under virtualization; on a Zen 4 VM the
 * 124M q8_0 model decoded 15-20% faster with one thread read than mapped,
 * docs/kernel-passes-2.md, sixteenth pass). A llama2.c checkpoint is converted
 * into memory either way. */
typedef enum keel_load {
    KEEL_LOAD_AUTO = 0, /* read where the system gives huge pages on request (Linux,
                           transparent_hugepage "always" or "madvise") and the file
                           takes at most a quarter of the memory available; else map */
    KEEL_LOAD_MMAP = 1,
    KEEL_LOAD_READ = 2,
} keel_load;

/* "auto", "mmap" or "read" (KEEL_EINVAL otherwise); and back. */
keel_status keel_load_from_name(const char *name, keel_load *out);
const char *keel_load_name(keel_load load);

typedef struct keel_model_params {
    const char *path;           /* GGUF file, or a llama2.c checkpoint (.bin) */
    const char *tokenizer_path; /* llama2.c tokenizer.bin for a .bin checkpoint, else NULL */
    keel_load load;             /* KEEL_LOAD_AUTO by default */
} keel_model_params;

keel_model_params keel_model_params_default(void);

/* Opens a model. KEEL_EIO (cannot read; a directory or device),
 * KEEL_EFORMAT (malformed file, e.g. "not a GGUF file (magic '...'); for a
 * llama2.c checkpoint pass --tokenizer"; a hyperparameter out of range or
 * a NaN in a norm, named), KEEL_EUNSUPPORTED (unknown architecture or
 * dtype; the detail names it), KEEL_ENOENT (missing key or tensor; named),
 * KEEL_ENOMEM. err (256 bytes, may be NULL) receives the detail; it does
 * not repeat p->path (the caller has it), but names tokenizer_path when
 * that file is at fault. Tensors the model does not use (layers beyond
 * block_count) are a KEEL_LOG_WARN message, not an error. *out is NULL on
 * failure. */
keel_status keel_model_open(const keel_model_params *p, keel_model **out, char *err);
void keel_model_close(keel_model *m);

typedef struct keel_model_info {
    const char *arch;     /* "llama", "qwen2", "qwen3", "gemma2", "qwen35", "qwen3next",
                             "mamba2", "gpt-oss", "deepseek32" */
    const char *name;     /* general.name, or "" */
    int32_t n_vocab;
    int32_t n_ctx_train;
    int32_t n_embd;
    int32_t n_layer;
    int32_t n_head;
    int32_t n_head_kv;
    int32_t head_dim_k;
    int32_t head_dim_v;
    int32_t n_ff;
    int32_t n_swa;        /* sliding window of SWA layers, 0 if none */
    int32_t n_swa_layers; /* layers using it */
    keel_rope rope;
    float norm_eps;
    float attn_softcap;   /* 0 if none */
    float final_softcap;  /* 0 if none */
    keel_dtype dtype;     /* the most common weight dtype (by bytes) */
    int64_t n_params;
    size_t weight_bytes;  /* bytes of all tensors */
    int32_t bos, eos;     /* -1 if none */
    bool add_bos;
    const char *tokenizer; /* "spm" or "bpe" */
    /* architecture-specific shapes, 0 where the model has none */
    int32_t n_recurrent_layers; /* Gated DeltaNet / Mamba2 layers */
    int32_t ssm_d_state, ssm_d_inner, ssm_conv_kernel, ssm_n_group;
    int32_t n_expert, n_expert_used, n_ff_expert, n_ff_shared_expert;
    int32_t q_lora_rank, kv_lora_rank; /* multi-head latent attention */
    int32_t indexer_heads, indexer_dim, indexer_top_k; /* sparse-attention indexer */
    int32_t n_expert_groups, n_group_used; /* grouped expert routing (deepseek2) */
    bool expert_sigmoid;  /* the router's gating: sigmoid (else softmax) */
    float attn_scale;     /* multiplies q.k (1/sqrt(head_dim) unless the model says otherwise;
                             MLA with YaRN: mscale^2 / sqrt(q.k dims)) */
    bool weights_read;    /* the weights are in memory (read, keel_load, or a converted
                             llama2.c checkpoint), not mapped */
} keel_model_info;

/* Fills info (pointers valid until the model is closed). */
void keel_model_info_get(const keel_model *m, keel_model_info *info);

/* A 64-bit digest of the model's identity: architecture, hyperparameters
 * and tensor table (names, dtypes, shapes, offsets) and file size (not the
 * weights' bytes). Sessions store it; never 0 for a model (0 for NULL). */
uint64_t keel_model_fingerprint(const keel_model *m);

/* Writes the tensor table (name, dtype, shape, bytes) to out. */
keel_status keel_model_tensors(const keel_model *m, keel_write_fn out, void *user);

/* Tokenizes len bytes of text. add_special: BOS/EOS as the vocabulary
 * says; parse_special: special-token texts become their ids. Writes at most
 * cap ids; *n_out is the count needed (KEEL_ERANGE if more than cap). */
keel_status keel_tokenize(const keel_model *m, const char *text, size_t len, bool add_special,
                          bool parse_special, int32_t *ids, int32_t cap, int32_t *n_out);

/* Text of n ids (special tokens rendered). *n_out bytes needed;
 * KEEL_ERANGE if more than cap, KEEL_EINVAL for an id out of range. */
keel_status keel_detokenize(const keel_model *m, const int32_t *ids, int32_t n, char *buf,
                            size_t cap, size_t *n_out);

/* The raw piece of one token (SPM: spaces restored, byte tokens as bytes). */
keel_status keel_token_piece(const keel_model *m, int32_t id, char *buf, size_t cap,
                             size_t *n_out);

/* True for end-of-generation tokens (EOS, EOT, ...). */
bool keel_token_is_eog(const keel_model *m, int32_t id);

/* A streaming detokenizer: push ids, get UTF-8 text that never splits a
 * character across calls. Allocated by the caller (opaque storage); no
 * allocation; one stream per thread. Renders as keel_detokenize does. */
typedef struct keel_detok_stream {
    uint64_t opaque[64];
} keel_detok_stream;

/* Starts a stream at the start of a text: as keel_detokenize, SPM
 * vocabularies drop the leading space of the first piece (the one
 * tokenization added). For generated text that continues a prompt use
 * keel_detok_stream_init_after. */
void keel_detok_stream_init(keel_detok_stream *s, const keel_model *m);
/*
 * Starts a stream that continues the text of prev[0..n_prev): the prompt
 * (or the whole conversation) the pushed ids follow. The leading-space rule
 * then applies only when none of prev renders text (prev is just BOS, or
 * empty), so printing keel_detokenize(prev) and then the stream's output
 * gives exactly keel_detokenize(prev followed by the pushed ids):
 * "Tom went to the" + " park" rather than "park". KEEL_EINVAL for an id of
 * prev out of range (the stream is then started as keel_detok_stream_init).
 * O(n_prev); allocates nothing.
 */
keel_status keel_detok_stream_init_after(keel_detok_stream *s, const keel_model *m,
                                         const int32_t *prev, int32_t n_prev);
keel_status keel_detok_stream_push(keel_detok_stream *s, int32_t id, char *buf, size_t cap,
                                   size_t *n_out);
keel_status keel_detok_stream_flush(keel_detok_stream *s, char *buf, size_t cap, size_t *n_out);

/* Random-weight models for tests and benchmarks (keel gen-model). */
typedef struct keel_gen_params {
    const char *arch;    /* "llama", "qwen2", "qwen3", "gemma2", "qwen35", "qwen3next",
                            "mamba2", "gpt-oss", "deepseek32", "gemma3", "phi3",
                            "qwen3moe", "glm4moe", "nemotron_h", "lfm2", "deepseek2" */
    int32_t n_layer;     /* 2 */
    int32_t n_embd;      /* 128 */
    int32_t n_head;      /* 4 */
    int32_t n_head_kv;   /* 2 */
    int32_t head_dim;    /* 0: n_embd / n_head */
    int32_t n_ff;        /* 0: 3 * n_embd */
    int32_t n_vocab;     /* 512 (>= 300: bytes, specials and pieces of a built-in vocabulary) */
    int32_t n_ctx;       /* 4096 */
    int32_t n_swa;       /* gemma2, gemma3: sliding window (0: 32) */
    keel_dtype dtype;    /* weight matrices (norms stay f32) */
    uint64_t seed;       /* 1 */
    /* issue 11 architectures (0: the default in parentheses) */
    int32_t n_expert;      /* qwen3next, gpt-oss, deepseek32, qwen3moe, glm4moe: experts (4;
                              deepseek2: 8) */
    int32_t n_expert_used; /* experts per token (2) */
    int32_t ssm_state;     /* mamba2: d_state (32); qwen35/qwen3next use head_dim */
    int32_t top_k;         /* deepseek32: cells the indexer keeps per query (16) */
    int32_t n_ff_exp;      /* qwen3moe, glm4moe: FFN width of each expert (0: n_ff) */
    const char *layer_pattern; /* nemotron_h: one letter per layer, repeated to n_layer:
                                  M Mamba2, * attention, - MLP (NULL: "M*-") */
    /* deepseek2 (0: the default in parentheses) */
    int32_t q_lora;          /* q LoRA rank (2 head_dim); -1: none, a plain attn_q (DeepSeek-V2-Lite) */
    int32_t n_expert_groups; /* grouped routing: expert groups (n_expert / 2 when even and >= 4);
                                -1: none */
    int32_t n_group_used;    /* groups the experts are chosen in (half the groups, at least 1) */
    int32_t gating;          /* router: 1 softmax, 2 sigmoid with a selection bias (2) */
    float yarn_factor;       /* deepseek2, deepseek32: YaRN rope.scaling.factor (0: no RoPE scaling) */
    float yarn_log_mul;      /* rope.scaling.yarn_log_mul = 0.1 mscale_all_dim, with yarn_factor
                                (0: key absent) */
    /* A per-tensor quantization mix as llama-quantize makes it (NULL: every
     * matrix in dtype): "q4_K_M" or "q5_K_M", with dtype its base (q4_K,
     * q5_K). q6_K then goes to the output matrix (token_embd when tied),
     * and to the attn_v-like (attn_v, attn_qkv, attn_kv_b) and ffn_down
     * matrices of the layers llama.cpp gives more bits: the first and last
     * eighth and every third in between (docs/formats.md section 7). */
    const char *mix;
} keel_gen_params;

keel_gen_params keel_gen_params_default(void);

/* Shapes of the hybrid and recurrent architectures: qwen35 / qwen3next put
 * attention in every 4th layer (3, 7, ...) and Gated DeltaNet elsewhere
 * (n_head v heads and n_head_kv k heads of head_dim, conv kernel 4, rotary
 * dims head_dim / 4); qwen3next adds MoE (n_ff per expert) and a gated
 * shared expert (n_ff); mamba2 has d_inner 2 * n_embd in n_head heads and
 * n_head_kv groups; gpt-oss alternates sliding (n_swa, 0: 32) and full
 * layers with sinks, biases, MoE of SwiGLU-OAI experts and YaRN (factor 32);
 * deepseek32 has multi-head latent attention in n_head heads (q.k dims
 * head_dim + head_dim RoPE, values head_dim, q and kv ranks 2 head_dim:
 * a cache row of 3 head_dim, values of 2), the DSA indexer (4 heads of
 * 2 head_dim, top_k), layer 0 dense and MoE after it (sigmoid router with
 * a selection bias, weights normalized and scaled by 2.5, a shared expert
 * of n_ff); head_dim a multiple of 16; n_head_kv is ignored (MLA);
 * deepseek2 is deepseek32 without the indexer (any even head_dim), q LoRA
 * optional (q_lora), 8 experts by default in n_expert_groups groups,
 * softmax or sigmoid gating (the bias only with sigmoid), optional YaRN;
 * gemma3 is gemma2's block with q/k norms and no soft-caps, layers sliding
 * (n_swa) but every 6th, RoPE base 1e6 with linear factor 8 on the global
 * layers and 10000 on the sliding ones; phi3 has fused attn_qkv and
 * ffn_up (gate | up), rotary dims 3/4 of head_dim (head_dim >= 4),
 * LongRoPE short / long factors (original context n_ctx) and attention
 * factor 1.19; qwen3moe is qwen3's attention with MoE in every layer
 * (n_expert experts of n_ff_exp, n_expert_used per token, softmax router
 * renormalized, no shared expert); glm4moe has q/k/v biases and q/k norms,
 * rotary dims head_dim / 2, layer 0 dense (n_ff; when n_layer > 1), then
 * MoE with a sigmoid router, a selection bias, weights normalized and
 * scaled by 2.5 and one shared expert of n_ff_exp, and one NextN (MTP)
 * layer after the n_layer run ones (block_count n_layer + 1); nemotron_h has per layer (layer_pattern) Mamba2 (mamba2's
 * shapes), attention without RoPE (n_head / n_head_kv of head_dim) or a
 * ReLU^2 MLP of n_ff without a gate, each after its one attn_norm, the
 * kinds written as the per-layer arrays feed_forward_length and
 * attention.head_count_kv; lfm2 alternates gated short convolutions (3 taps, layers
 * 0, 2, ...) with GQA attention with q/k norms (layers 1, 3, ...), a
 * per-layer head_count_kv array (0 on the conv layers), SwiGLU FFNs, the
 * final norm named token_embd_norm and a tied output. */
/* Writes a deterministic random-weight GGUF model to path: norms
 * 1 + N(0, 0.02) (gemma: stored as GGUF expects, i.e. the multiplier),
 * matrices ~N(0, 1/sqrt(fan_in)), embeddings N(0, 1) (gemma2:
 * N(0, 1/sqrt(n_embd))), biases N(0, 0.02), tensor names and keys as
 * llama.cpp expects for the arch, and a vocabulary learned from a built-in
 * English text (docs/formats.md, "Generated models"). The same params give
 * the same bytes. Matrices whose rows do not fit dtype's block are stored
 * in q8_0 (f16 if not a multiple of 32). Holds one tensor in memory at a
 * time; uses up to 16 threads for large models. KEEL_EINVAL (bad params,
 * the field named in err), KEEL_EUNSUPPORTED (arch or dtype), KEEL_EIO
 * (path and errno text in err; no partial file is left), KEEL_ENOMEM.
 * err (256 bytes, may be NULL) receives the detail. */
keel_status keel_gen_model(const keel_gen_params *p, const char *path, char *err);

/* Validates p as keel_gen_model does and reports, without writing, the
 * parameter count and the file size in bytes (either pointer may be NULL).
 * Errors as keel_gen_model except KEEL_EIO. Allocates (builds the
 * vocabulary); takes milliseconds. */
keel_status keel_gen_model_size(const keel_gen_params *p, int64_t *n_params, size_t *n_bytes,
                                char *err);

/* ======================================================================== */
/* Contexts: running a model                                                */
/* ======================================================================== */
/*
 * A keel_context runs a model over a memory (keel_mem) sized at open. Every
 * buffer a forward pass needs is reserved at open from the plan below;
 * keel_decode allocates nothing.
 */

typedef struct keel_context keel_context;

typedef struct keel_context_params {
    int32_t n_ctx;      /* KV cells (per sequence stream); 0: min(training context, 4096) */
    int32_t n_batch;    /* most tokens per keel_decode call (512) */
    int32_t n_ubatch;   /* tokens per forward chunk (512, <= n_batch) */
    int32_t n_seq_max;  /* sequences (1) */
    int32_t n_outputs;  /* most logit rows per keel_decode call; 0: n_seq_max */
    int32_t n_threads;  /* 0: all CPUs */
    keel_dtype type_k;  /* KV cache types (f16) */
    keel_dtype type_v;
    int32_t rot_k;      /* Hadamard rotation of K: -1 auto (on for quantized types
                           when head_dim allows), 0 off, 1 on */
    int32_t rot_v;      /* same for V; auto = off */
    int32_t n_sink;     /* attention sinks kept by sliding layers (0) */
    int32_t swa_window; /* > 0: run layers as sliding windows of this size with n_sink
                           sinks (StreamingLLM) even if the model has none: every layer
                           but each swa_period-th stays full attention. 0: the model's own */
    int32_t swa_period; /* with swa_window: 1 in swa_period layers stays full (2) */
    bool unified;       /* one KV table for all sequences (true) */
    keel_compact_params compact; /* KV compaction of every sequence (policy none) */
    bool deterministic; /* batch-invariant numerics: a token's logits do not depend on
                           the other tokens of its batch or on the cells' physical order
                           (every matrix product through the same per-row kernel, each
                           query's attention alone over its cells in position order);
                           concurrent sequences then give exactly the results they
                           give alone. Slower prefill (false) */
    /* checkpoints of each sequence, taken at the end of every prompt batch,
     * so that a prompt sharing a prefix resumes from the newest one at or
     * before the divergence (keel_context_rewind): on models with
     * recurrent layers (qwen35, qwen3next, mamba2) the state and the rings'
     * rows; on attention models with sliding layers (gemma2, gpt-oss, or
     * swa_window) the rings' rows, for divergences the rings have already
     * forgotten (each costs a copy of the sequence's rings: see keel_plan);
     * full attention needs none (ignored) */
    int32_t n_ctx_checkpoints; /* kept per sequence, oldest dropped; 0: none; -1 (default):
                                  8 with recurrent layers; with sliding layers, up to 8
                                  where they cost at most a quarter of the KV bytes,
                                  else 0 (keel_plan.ckpt_bytes says what they cost) */
    int32_t checkpoint_every;  /* > 0: also every this many prompt tokens (0: only at
                                  the end of each prompt) */
    bool speculative;   /* keel_decode_spec on models with recurrent layers: a state
                           snapshot per sequence (keel_plan.rs_bytes counts them; false) */
} keel_context_params;

keel_context_params keel_context_params_default(void);

/* The memory plan of a context: computed before anything is allocated. */
typedef struct keel_plan {
    size_t weights_mapped; /* bytes of the model file: mapped (not allocated), or read into
                              memory at open (keel_model_info.weights_read) */
    size_t kv_bytes;       /* K/V columns */
    size_t mem_bytes;      /* the whole keel_mem (tables, columns, scratch) */
    size_t work_bytes;     /* forward-pass activations and scratch */
    size_t logits_bytes;   /* n_outputs x n_vocab floats */
    size_t total_bytes;    /* everything keel_context_open allocates */
    size_t rs_bytes;       /* recurrent state slots and speculation snapshots (part of mem_bytes) */
    size_t ckpt_bytes;     /* checkpoint records of every sequence (part of mem_bytes) */
} keel_plan;

keel_status keel_context_plan(const keel_model *m, const keel_context_params *p, keel_plan *out,
                              char *err);

/* Opens a context. Errors as keel_context_plan, plus KEEL_ENOMEM. The model
 * must outlive the context. */
keel_status keel_context_open(const keel_model *m, const keel_context_params *p,
                              keel_context **out, char *err);
void keel_context_close(keel_context *c);
const char *keel_context_last_error(const keel_context *c);
void keel_context_plan_get(const keel_context *c, keel_plan *out);

/* Sets the compaction of one sequence (seq < 0: every sequence), replacing
 * the context default. Checked against the context: KEEL_EINVAL if the
 * parameters are inconsistent (keel_compact_params_check), if trigger
 * exceeds n_ctx, or if renumbering would drop tokens a sliding layer still
 * needs (recent * target below the model's window). Takes effect at the
 * next keel_decode, which compacts between ubatches (prefill included), so
 * the sequence never holds more than trigger cells. */
keel_status keel_context_set_compact(keel_context *c, int32_t seq, const keel_compact_params *p);

/* The context's memory: sequence edits (keel_mem_seq_rm, ...) and stats. */
keel_mem *keel_context_memory(keel_context *c);

/* A batch: token i at position pos[i] of sequence seq[i]; logits[i] != 0
 * keeps its logits (logits NULL: only the last token's). pos NULL: each
 * sequence continues at its last position + 1. seq NULL: sequence 0. */
typedef struct keel_batch {
    int32_t n_tokens;
    const int32_t *tokens;
    const int32_t *pos;
    const int32_t *seq;
    const int8_t *logits;
} keel_batch;

/*
 * Runs the batch through the model, ubatch by ubatch. KEEL_EINVAL (token
 * id out of range, too many tokens or outputs, bad position or sequence:
 * a given position must continue its sequence, also after a renumbering
 * compaction the batch itself triggers; checked before anything changes),
 * KEEL_EFULL (the batch does not fit: checked for every ubatch before the
 * first one changes anything, so memory is exactly as it was — the cells
 * of each ubatch, the compactions it triggers, counting that the cells a
 * sequence shares with another (a seq_cp fork) are not freed when evicted
 * and are copied when a renumbering keeps them (conservative only where a
 * policy keeps shared cells other than the sinks at their positions), and
 * the recurrent state slots of the whole batch: forks continued together
 * need one slot less than sequences, so n_rs_slots = n_seq_max always
 * suffices), KEEL_ERANGE (a continued position would pass
 * INT32_MAX; nothing changes), KEEL_ECANCELED (ubatches completed before
 * the cancel stay in the cache), KEEL_EFORMAT ("logits are NaN at position
 * P: the model's weights or hyperparameters are invalid": every requested
 * logit row is checked to be finite; the ubatches run so far stay in the
 * cache). Detail in keel_context_last_error.
 *
 * Limits: without compaction a sequence needs one full-attention cell per
 * token (n_ctx cells in all; sliding layers only their ring). With
 * compaction on (keel_context_params.compact, keel_context_set_compact) a
 * sequence never holds more than its trigger: batches of any length stream
 * through, compacted between ubatches, and positions stay below the
 * target when renumbered (with keep, they grow up to INT32_MAX).
 *
 * Models with recurrent layers: a sequence's tokens run through each layer
 * in order; a sequence given several tokens (a prompt) gets a checkpoint
 * at its end and, with checkpoint_every, at every multiple of it (ubatches
 * are cut there). keel_cancel takes effect between ubatches (a state is
 * updated in place); a ubatch that fails after placing empties its
 * sequences (KEEL_EINTERNAL-class failures only).
 */
keel_status keel_decode(keel_context *c, const keel_batch *b);

/*
 * Speculative decoding: keel_decode for a batch in which some sequences'
 * tokens are drafts to verify. A sequence given two or more tokens that all
 * ask for logits (b->logits set for each) is drafted; the others (a
 * prompt's chunk, one generated token) are decoded as keel_decode does. For
 * each drafted sequence the batch is not a prompt (no checkpoint is taken
 * at its end) and, on models with recurrent layers, its state is saved
 * first (keel_mem_spec_save), so that the verifier's
 * keel_context_rewind(c, seq, p0) to any p0 inside the batch is exact:
 * attention drops the rejected tail; a recurrent sequence gets its saved
 * state back and the batch's tokens below p0 decoded again (the rewind
 * invalidates keel_logits: read every row first). Rewind each drafted
 * sequence once, before the next decode.
 *
 * Positions must continue each sequence (b->pos NULL). Errors as
 * keel_decode, plus KEEL_EUNSUPPORTED (a recurrent model's context was
 * opened without `speculative`) and KEEL_EFULL when a drafted sequence
 * with compaction would pass its trigger (draft fewer tokens); nothing
 * changed then.
 */
keel_status keel_decode_spec(keel_context *c, const keel_batch *b);

/* ---- draft sources (speculative decoding) -------------------------------
 * A keel_spec proposes the tokens that may follow a sequence's history:
 *   - KEEL_SPEC_NGRAM, prompt lookup: the continuation of the most recent
 *     earlier occurrence of the history's longest suffix of min_n..max_n
 *     tokens (agents repeat what their context holds: files, diffs, JSON);
 *   - KEEL_SPEC_DRAFT: a smaller model sharing the vocabulary (checked
 *     token by token at open), run greedily in a context of its own.
 * With adaptive on, each sequence drafts only the number of tokens that
 * maximizes the expected tokens per unit of step time, from its measured
 * acceptance and the verify cost the caller reports (keel_spec_result);
 * when drafting does not pay it stops, probing now and then.
 *
 * A step of the caller (keel run and the engine do exactly this):
 *   keel_spec_draft(sp, seq, hist, n, drafts, cap, &k);   hist ends with the
 *                                                          sampled, undecoded token
 *   keel_decode_spec(ctx, {hist[n-1], drafts[0..k)} with logits on each);
 *   for i in 0..k: keel_sampler_sample_draft(smp, logits(i), drafts[i], &t);
 *                  accept t; stop at the first t != drafts[i] (t is the next token)
 *   keel_context_rewind(ctx, seq, n_before + 1 + accepted, &resume);
 *   keel_spec_result(sp, seq, k, accepted, step_ns);
 * One thread at a time per keel_spec.
 */
#define KEEL_SPEC_MAX_DRAFT 64

typedef enum keel_spec_kind {
    KEEL_SPEC_NONE = 0,
    KEEL_SPEC_NGRAM = 1,
    KEEL_SPEC_DRAFT = 2,
} keel_spec_kind;

typedef struct keel_spec_params {
    keel_spec_kind kind;
    int32_t max_draft; /* most drafted tokens per step, 1..KEEL_SPEC_MAX_DRAFT (16) */
    int32_t min_n;     /* n-gram: shortest suffix matched (2) */
    int32_t max_n;     /* n-gram: longest suffix matched, <= 64 (8) */
    bool adaptive;     /* draft only as many tokens as pay, per sequence (true) */
} keel_spec_params;

typedef struct keel_spec_stats {
    int64_t steps;       /* verified steps reported */
    int64_t draft_steps; /* of them with drafts */
    int64_t drafted;     /* drafted tokens */
    int64_t accepted;    /* of them accepted */
} keel_spec_stats;

typedef struct keel_spec keel_spec;

/* kind none, max_draft 16, min_n 2, max_n 8, adaptive. */
keel_spec_params keel_spec_params_default(void);
/* A draft source for n_seq sequences whose histories hold at most
 * hist_cap tokens. draft (KEEL_SPEC_DRAFT only; must outlive the spec) runs
 * in its own context opened with draft_cp (NULL: defaults; n_seq_max is
 * set to n_seq). KEEL_EINVAL (parameters; a draft model whose vocabulary
 * differs, named), the draft context's errors, KEEL_ENOMEM; detail in err
 * (256 bytes). */
keel_status keel_spec_open(const keel_spec_params *p, const keel_model *target, const keel_model *draft,
                           const keel_context_params *draft_cp, int32_t n_seq, int32_t hist_cap, keel_spec **out,
                           char *err);
void keel_spec_close(keel_spec *s);
/* Up to cap tokens that may follow hist[0..n_hist) (the last one sampled,
 * not yet decoded) for sequence seq, into out; *n_out 0 when none is worth
 * drafting. A draft model's failure (its context full, say) returns its
 * status with detail in keel_spec_last_error; the caller goes on without
 * drafts. Allocates nothing. */
keel_status keel_spec_draft(keel_spec *s, int32_t seq, const int32_t *hist, int32_t n_hist, int32_t *out,
                            int32_t cap, int32_t *n_out);
/* The outcome of seq's step: n_drafted tokens verified, n_accepted of them
 * accepted, the verifying decode's time (0: unknown). Feeds the back-off
 * and the stats. */
void keel_spec_result(keel_spec *s, int32_t seq, int32_t n_drafted, int32_t n_accepted, uint64_t step_ns);
/* A new request on seq: its acceptance is measured afresh. */
void keel_spec_reset(keel_spec *s, int32_t seq);
void keel_spec_stats_get(const keel_spec *s, keel_spec_stats *out);
const keel_spec_params *keel_spec_params_get(const keel_spec *s);
const char *keel_spec_last_error(const keel_spec *s);

/* ---- sessions of a context -------------------------------------------------
 * The memory's session blobs (keel_mem_save, docs/formats.md "Sessions")
 * stamped with the model's fingerprint: a loaded sequence continues exactly
 * as if it had never been saved. tokens[0 .. n_tokens) is the sequence's
 * history, of which the last n_pending are not in the cache yet (a sampled
 * token not decoded); the history comes back on load, checked against the
 * cells as keel_mem_load does and every id against the model's vocabulary
 * (KEEL_EFORMAT "token 17 is id 600, outside this model's vocabulary
 * [0, 512)"). Errors name the file and the reason in
 * keel_context_last_error. */

/* To a caller's buffer (KEEL_ERANGE with *n_out the size when it is too
 * small or NULL). */
keel_status keel_session_save_buf(keel_context *c, int32_t seq, const int32_t *tokens, int32_t n_tokens,
                                  int32_t n_pending, void *buf, size_t cap, size_t *n_out);
/* To a file, atomically (a temporary file of a new name in the same
 * directory, fsync, rename, directory fsync): an existing regular file is
 * replaced only by a complete new one; through a symbolic link to a regular
 * file the target is replaced and the link stays. A path that exists and is
 * not a regular file (a device such as /dev/full, a FIFO, a directory, a
 * socket, a link to one or to nothing) is refused with KEEL_EIO before
 * anything is created: the rename would put a regular file in its place.
 * KEEL_EIO with the path and errno text. Allocates the blob. */
keel_status keel_session_save(keel_context *c, int32_t seq, const int32_t *tokens, int32_t n_tokens,
                              int32_t n_pending, const char *path);
/* From a buffer / a file into seq (-1: the whole memory): validated
 * completely first (another model, other cache types or rotation unless
 * flags has KEEL_SESSION_CONVERT, corrupted or truncated, no room, a history
 * that disagrees with the cells or holds ids outside the vocabulary: each a
 * status and message, the memory as before). A file larger than any session
 * of this context could be, or a path that is not a regular file (KEEL_EIO,
 * not waited on), is refused before it is read. */
keel_status keel_session_load_buf(keel_context *c, int32_t seq, const void *buf, size_t len, unsigned flags,
                                  int32_t *tokens, int32_t cap, int32_t *n_tokens, int32_t *n_pending);
keel_status keel_session_load(keel_context *c, int32_t seq, const char *path, unsigned flags, int32_t *tokens,
                              int32_t cap, int32_t *n_tokens, int32_t *n_pending);
/*
 * Prepares sequence seq to continue at position p0 (a prompt that shares
 * its first p0 tokens with what seq holds), exactly: removes positions
 * >= p0 where that is exact (attention at or above keel_mem_seq_rewind_min),
 * else restores the newest checkpoint at or before p0 (a recurrent state
 * cannot be truncated; sliding rings forgot the tokens a query at p0
 * needs), else empties the sequence. *resume (may be NULL) receives the
 * position the caller must feed from (p0 itself, the checkpoint's
 * position, or 0). KEEL_EINVAL (bad seq), KEEL_EFULL (a
 * restore found no room), detail in keel_context_last_error. Allocates
 * nothing.
 */
keel_status keel_context_rewind(keel_context *c, int32_t seq, int32_t p0, int32_t *resume);

/* Logits [n_vocab] of the i-th token of the last batch, or NULL if it did
 * not request logits. Valid until the next keel_decode. */
const float *keel_logits(const keel_context *c, int32_t i);

/* Requests cancellation of a keel_decode running on another thread. */
void keel_cancel(keel_context *c);

/* ======================================================================== */
/* Sampling                                                                 */
/* ======================================================================== */

typedef struct keel_sampler keel_sampler;

typedef struct keel_sampler_params {
    float temp;              /* <= 0: greedy (argmax, ties to the lowest id) */
    int32_t top_k;           /* <= 0: off */
    float top_p;             /* 1: off */
    float min_p;             /* 0: off */
    float repeat_penalty;    /* 1: off */
    int32_t repeat_last_n;   /* tokens the penalties look back over */
    float presence_penalty;  /* 0: off */
    float frequency_penalty; /* 0: off */
    uint64_t seed;
} keel_sampler_params;

/* llama.cpp's defaults: temp 0.8, top_k 40, top_p 0.95, min_p 0.05, no
 * penalties over the last 64, seed 0. */
keel_sampler_params keel_sampler_params_default(void);

/* Checks a parameter set: KEEL_EINVAL with the parameter and its value in
 * err (256 bytes, may be NULL), e.g. "temp nan: must be finite (<= 0:
 * greedy)", for a non-finite float, repeat_penalty <= 0, repeat_last_n < 0.
 * Allocates nothing. */
keel_status keel_sampler_params_check(const keel_sampler_params *p, char *err);
/* Opens a sampler for n_vocab tokens. KEEL_EINVAL for parameters
 * keel_sampler_params_check refuses or n_vocab < 1, KEEL_ENOMEM. */
keel_status keel_sampler_open(const keel_sampler_params *p, int32_t n_vocab, keel_sampler **out);
void keel_sampler_close(keel_sampler *s);
/* Picks a token from logits [n_vocab]. KEEL_EINVAL when no logit is
 * finite (keel_decode already refuses non-finite logits). Allocates nothing. */
keel_status keel_sampler_sample(keel_sampler *s, const float *logits, int32_t *token);
/* Adds a token to the penalty history (prompt and generated tokens). */
/* Speculative decoding: the token at a position whose drafted token is
 * draft, by the standard acceptance rule for a proposed (point-mass) draft:
 * the draft with probability p(draft) under the sampler's chain, else a
 * token drawn from p without it, renormalized; greedy: the argmax. The
 * token is distributed exactly as keel_sampler_sample's (a seeded run
 * draws differently, so sampled texts differ from a run without drafts);
 * *token == draft means accepted. Errors as keel_sampler_sample. */
keel_status keel_sampler_sample_draft(keel_sampler *s, const float *logits, int32_t draft, int32_t *token);
keel_status keel_sampler_accept(keel_sampler *s, int32_t token);
void keel_sampler_reset(keel_sampler *s);

/* ======================================================================== */
/* Constrained decoding: grammars                                           */
/* ======================================================================== */
/*
 * Grammars in llama.cpp's GBNF (docs/grammar.md): rules, alternatives,
 * groups, * + ? {m,n}, "literals", [classes] with ranges and ^, ., escapes
 * \n \r \t \\ \" \[ \] \xHH \uHHHH \UHHHHHHHH, # comments, the start rule
 * `root`. Left recursion is refused (named); token references (<[id]>) are
 * not supported. The engine works on bytes, so a token may span several
 * grammar elements or end inside a UTF-8 character. A matcher's step costs
 * the stacks in its state, never the length of the text so far; its token
 * masks are cached per parser stack.
 *
 *     keel_grammar *g;  keel_grammar_vocab *v;  keel_grammar_matcher *gm;
 *     keel_grammar_compile(src, strlen(src), &g, err);
 *     keel_grammar_vocab_open(model, &v, err);       // once per model
 *     keel_grammar_matcher_open(g, v, &gm, err);     // once per sequence
 *     for (;;) {
 *         if (keel_grammar_matcher_done(gm)) break;  // only the end can follow
 *         keel_grammar_matcher_apply(gm, logits);    // disallowed -> -inf
 *         keel_sampler_sample(s, logits, &tok);
 *         keel_grammar_matcher_accept(gm, tok);
 *         if (keel_token_is_eog(model, tok)) break;  // allowed only when complete
 *         ... decode tok ...
 *     }
 */

typedef struct keel_grammar keel_grammar;
typedef struct keel_grammar_vocab keel_grammar_vocab;
typedef struct keel_grammar_matcher keel_grammar_matcher;

/* Compiles len bytes of GBNF. KEEL_EFORMAT for a syntax error, an undefined
 * rule or no root ("grammar line L col C: what" in err); KEEL_EUNSUPPORTED
 * for left recursion (the cycle named) and token references; KEEL_ERANGE
 * past a size limit (16 MiB of source, 2^22 elements after expanding
 * repetitions, {m,n} counts above 100000); KEEL_ENOMEM. err: 256 bytes, may
 * be NULL. The grammar is immutable: any number of threads may share it. */
keel_status keel_grammar_compile(const char *gbnf, size_t len, keel_grammar **out, char *err);
/* Compiles a JSON Schema, draft 2020-12 (len bytes of JSON), to a grammar
 * of exactly the JSON texts it accepts: every keyword of the validation and
 * applicator vocabularies (type, properties, patternProperties, items,
 * prefixItems, contains, enum, const, numeric bounds and multipleOf exactly
 * in decimal, minLength/maxLength, pattern as an ECMA-262 regex, format
 * assertions, allOf/anyOf/oneOf/not/if, dependent*, unevaluated*, local
 * $ref/$anchor/$id, ...; docs/grammar.md "JSON Schema"). Object members
 * in the order of "properties", then additional members where allowed; at
 * most 20 whitespace characters between tokens; numbers under a numeric
 * constraint without an exponent. A schema nothing satisfies (false)
 * compiles to a grammar that accepts no text (keel_grammar_accepts_nothing).
 * KEEL_EFORMAT (not JSON), KEEL_EUNSUPPORTED for a keyword or a use of one
 * the compiler cannot make exact (uniqueItems over unbounded values,
 * remote references, regex backreferences, an unknown keyword, ...),
 * named with its location ("json schema: ... at /properties/a"),
 * KEEL_ERANGE past a cap (hostile schemas), KEEL_ENOMEM. */
keel_status keel_grammar_compile_schema(const char *schema_json, size_t len, keel_grammar **out, char *err);
void keel_grammar_close(keel_grammar *g);
/* Whether no text at all is a sentence of g (*empty), e.g. the grammar of
 * the schema false or of contradicting constraints: sampling under it
 * would fail at its first token. KEEL_EINVAL, KEEL_ENOMEM. Thread-safe. */
keel_status keel_grammar_accepts_nothing(const keel_grammar *g, bool *empty, char *err);
/* Whether text[0..len) is a complete sentence of g (*accepted), with the
 * engine sampling uses. KEEL_ERANGE (named in err) when the parse exceeds
 * the matcher's limits (stacks in one state, distinct stacks). Allocates
 * the parse state and frees it. Thread-safe. */
keel_status keel_grammar_match(const keel_grammar *g, const char *text, size_t len, bool *accepted, char *err);
/* The vocabulary of m as the matcher sees it (a trie of token bytes;
 * control tokens have none; end-of-generation tokens end the text). Build
 * once per model (milliseconds to ~100 ms for 150k tokens); immutable and
 * shareable; must not outlive m's use by matchers. KEEL_ENOMEM. */
keel_status keel_grammar_vocab_open(const keel_model *m, keel_grammar_vocab **out, char *err);
void keel_grammar_vocab_close(keel_grammar_vocab *v);
/* A parse state of one sequence at g's start. g and v must outlive it. One
 * thread at a time. KEEL_EINVAL, KEEL_ENOMEM, KEEL_ERANGE. */
keel_status keel_grammar_matcher_open(const keel_grammar *g, const keel_grammar_vocab *v,
                                      keel_grammar_matcher **out, char *err);
void keel_grammar_matcher_close(keel_grammar_matcher *m);
/* Sets logits[i] = -inf for every token the state does not allow (the
 * vocabulary's n_vocab entries). End-of-generation tokens are allowed
 * exactly when the text so far is complete. A stack seen for the first
 * time costs a walk of the trie (cached); KEEL_ERANGE past the cache's or
 * the state's limits (detail in keel_grammar_matcher_last_error). */
keel_status keel_grammar_matcher_apply(keel_grammar_matcher *m, float *logits);
/* Advances by a token. KEEL_EINVAL (state unchanged) for a token the state
 * does not allow, or an id out of range. */
keel_status keel_grammar_matcher_accept(keel_grammar_matcher *m, int32_t token);
/* The text so far is a complete sentence. */
bool keel_grammar_matcher_complete(const keel_grammar_matcher *m);
/* Nothing can follow but the end of generation (or it was accepted). */
bool keel_grammar_matcher_done(const keel_grammar_matcher *m);
/* Back to the start (caches kept). */
keel_status keel_grammar_matcher_reset(keel_grammar_matcher *m);
/* Detail of the last failure ("" if none). Valid until the next call. */
const char *keel_grammar_matcher_last_error(const keel_grammar_matcher *m);

/* ======================================================================== */
/* Chat templates                                                           */
/* ======================================================================== */
/*
 * A Jinja2 engine for the chat templates models carry (GGUF
 * tokenizer.chat_template), configured as Hugging Face transformers renders
 * them: trim_blocks and lstrip_blocks on, loop controls and `do`, mutable
 * lists, {% generation %}, tojson = json.dumps(ensure_ascii=False),
 * raise_exception(msg), strftime_now(fmt). The supported language and the
 * limits are in docs/chat.md. Rendering is bounded: output at most 64 MiB,
 * working memory at most 256 MiB, at most 5 x 10^7 steps (loop iterations,
 * calls, items visited by filters), nesting at most 200 levels at run time
 * (fits a 256 KiB thread stack); exceeding one is an error, never a hang.
 *
 *     keel_chat_template *t;
 *     char err[256];
 *     if (keel_chat_template_open(src, strlen(src), &t, err) != KEEL_OK) ...;
 *     const char *vars = "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}],"
 *                        " \"add_generation_prompt\": true}";
 *     size_t n;
 *     keel_status st = keel_chat_template_render(t, vars, strlen(vars), NULL, buf, cap, &n, err);
 *     // KEEL_ERANGE: buf too small, n is the length needed (plus 1 for the NUL)
 *     keel_chat_template_close(t);
 */

typedef struct keel_chat_template keel_chat_template;

/*
 * Compiles len bytes of template source (UTF-8; need not be NUL-terminated).
 * KEEL_EFORMAT for a syntax error, invalid UTF-8 or an unknown filter/test
 * outside a conditional, with "template line N: <what>" in err;
 * KEEL_EOVERFLOW if the template nests too deeply (128 levels of blocks and
 * expressions, 96 AST levels); KEEL_EINVAL for NULL arguments; KEEL_ENOMEM. err (256
 * bytes, may be NULL) receives the detail. *out is NULL on failure.
 * Allocates through the hooks; the template owns everything and does not
 * keep source. Thread-safe (no shared state).
 */
keel_status keel_chat_template_open(const char *source, size_t len, keel_chat_template **out,
                                    char *err);

/*
 * Renders t with the variables in vars_json (len bytes: a JSON object whose
 * members become template variables: messages, tools,
 * add_generation_prompt, bos_token, eos_token, ...; NULL or len 0: none).
 * now ("2026-01-15T09:30:00") is the time strftime_now formats; NULL: the
 * local time. The text is written to buf followed by a NUL and *n_out is its
 * length (without the NUL). Errors:
 *   KEEL_ERANGE     cap < *n_out + 1: nothing written, *n_out is the length
 *   KEEL_EINVAL     the template refused (raise_exception: err holds its
 *                   message, "template line N: <message>") or failed at run
 *                   time (undefined value used, wrong type, ...); a NULL
 *                   argument; now malformed
 *   KEEL_EFORMAT    vars_json is not valid JSON or not an object
 *   KEEL_EOVERFLOW  a limit above was exceeded (err names it)
 *   KEEL_ENOMEM
 * err (256 bytes, may be NULL) receives the detail. Allocates working memory
 * through the hooks and frees it before returning. t is not modified: any
 * number of threads may render one template at once.
 */
keel_status keel_chat_template_render(const keel_chat_template *t, const char *vars_json,
                                      size_t len, const char *now, char *buf, size_t cap,
                                      size_t *n_out, char *err);

/* Frees a template. NULL is a no-op. */
void keel_chat_template_close(keel_chat_template *t);

/*
 * The source of a built-in template (static storage, NUL-terminated):
 * "chatml" (<|im_start|>role\ncontent<|im_end|>), "llama3", "gemma",
 * "mistral", "qwen3" (ChatML with Hermes tool calls and <think>).
 * KEEL_ENOENT for another name, KEEL_EINVAL for NULL arguments.
 */
keel_status keel_chat_template_builtin(const char *name, const char **source);

/* NULL-terminated list of the built-in names (static storage). */
const char *const *keel_chat_template_builtin_names(void);

/*
 * The chat template of a model (GGUF tokenizer.chat_template): *source
 * points at *len bytes inside the model (not NUL-terminated; valid until the
 * model is closed). KEEL_ENOENT if the model has none (callers then use
 * "chatml"), KEEL_EFORMAT if the key is not a string, KEEL_EINVAL for NULL
 * arguments. Allocates nothing.
 */
keel_status keel_model_chat_template(const keel_model *m, const char **source, size_t *len);

/* KEEL_SECTION_CHAT */

/* KEEL_SECTION_MODEL */

/* KEEL_SECTION_ENGINE */

/* ======================================================================== */
/* Engine: chat completions over slots (keel_complete, the server)          */
/* ======================================================================== */
/*
 * A keel_engine owns a model, one context whose unified cache is shared by
 * n_slots sequences ("slots"), the model's chat template and its tool-call
 * format. It turns chat messages (OpenAI JSON) into prompts, reuses the
 * longest cached prefix of a slot, generates with continuous batching
 * (every step decodes one token of each generating slot and a chunk of each
 * prefilling slot in one batch), parses the output back into content,
 * reasoning and tool calls, and streams it as events. docs/engine.md.
 *
 * Two ways to drive it:
 *   - keel_complete(): one request, synchronously on the calling thread
 *     (embedding from Python or Swift: a conversation turn after turn);
 *   - keel_engine_submit() from any thread + keel_engine_run() on one
 *     scheduler thread (the server): requests run concurrently on the slots.
 *
 *     keel_engine *e;
 *     char err[256];
 *     if (keel_engine_open("{\"model\": \"m.gguf\", \"n_ctx\": 4096}", &e, err)) ...;
 *     char resp[65536];
 *     keel_complete(e, "[{\"role\":\"user\",\"content\":\"Hi\"}]", "{\"max_tokens\":64}",
 *                   NULL, on_event, user, resp, sizeof resp);
 *     keel_engine_close(e);
 */

typedef struct keel_engine keel_engine;

/*
 * Opens an engine from options, a JSON object:
 *   "model" (path, required), "tokenizer" (llama2.c tokenizer.bin),
 *   "n_ctx" (cells of the shared cache; 0: min(training context, 4096) per slot),
 *   "n_slots" (1), "n_batch" (512), "n_ubatch" (512), "n_threads" (0: all CPUs),
 *   "type_k", "type_v" ("f16"), "rot_k", "rot_v" (-1 auto / 0 / 1),
 *   "swa_window", "swa_period", "swa_sinks",
 *   "kv_compact" (the default of every request: "none" or an object
 *     {"policy", "trigger", "target", "sinks", "recent", "positions": "keep"|"renumber"};
 *     a policy alone gets trigger = n_ctx per slot, target = trigger / 2),
 *   "chat_template" (a built-in name, a file path, or template source; default: the
 *     model's, else "chatml"), "tool_format" (a parser format name; default: detected
 *     from the template), "max_prompt_tokens" (default 4 x n_ctx per slot),
 *   "prefill_share" (0.4, in (0, 1]: while a slot generates, the share of
 *     each step's time the other slots' prefill may take, measured by the
 *     engine, so a stream keeps about 1 - share of its rate alone beside a
 *     long prompt; 1: prefill fills n_batch whatever generates).
 * Unknown keys are KEEL_EINVAL (named). Errors of keel_model_open and
 * keel_context_open, with the detail in err (256 bytes, may be NULL). *out is
 * NULL on failure. Allocates the whole plan (keel_engine_stats reports it).
 */
keel_status keel_engine_open(const char *options_json, keel_engine **out, char *err);
/* Closes e; NULL is a no-op. May be called while other threads are inside
 * calls on e: it cancels every queued and running request (each ends with
 * finish_reason "cancelled"; keel_complete returns KEEL_ECANCELED), makes a
 * running keel_engine_run return KEEL_OK, waits for every call in progress
 * on other threads (keel_complete, keel_engine_submit, slot actions, reset,
 * stats) to return, then frees everything. Calls that begin after close
 * began return KEEL_ECANCELED until it frees e; a call made after close
 * returned uses freed memory (the caller's error). Must not be called from
 * an event callback (it would wait for itself). */
void keel_engine_close(keel_engine *e);
const keel_model *keel_engine_model(const keel_engine *e);
/* Detail of the calling thread's last failed call on e ("" if none, or if
 * this thread's last failed call was on another engine). Per thread:
 * other threads' calls on e never change it, so it can be read any time
 * after the failing call. Valid until this thread's next call on an
 * engine. */
const char *keel_engine_last_error(const keel_engine *e);

typedef enum keel_event_kind {
    KEEL_EVENT_CONTENT = 0,    /* text delta of the answer */
    KEEL_EVENT_REASONING = 1,  /* text delta of the reasoning (<think> ...) */
    KEEL_EVENT_TOOL_BEGIN = 2, /* a tool call starts: index, id, name */
    KEEL_EVENT_TOOL_ARGS = 3,  /* text delta of tool call `index`'s JSON arguments */
    KEEL_EVENT_TOOL_END = 4,   /* tool call `index` is complete (error: NULL or why it is malformed) */
    KEEL_EVENT_DONE = 5,       /* the request ended: response holds the response JSON */
    KEEL_EVENT_PROMPT = 6,     /* the request took a slot, its prompt tokenized: n_prompt_tokens,
                                  n_cached_tokens (the prefix reused from the cache, not prefilled).
                                  Once, first, before the prefill; a request that fails before
                                  (a template error, a prompt too long) gets only DONE */
    KEEL_EVENT_LOGPROB = 7,    /* requests with "logprobs" only: one generated token's entry, sent
                                  before the text it produces (which may come later, held back
                                  for a stop string or the tool-call parser): text holds the
                                  entry's JSON, exactly as in the response's logprobs.content
                                  ({"token", "logprob", "bytes", "top_logprobs"}); token and
                                  logprob hold the id and its log-probability. The entries of a
                                  request, concatenated, are its response's logprobs.content */
    KEEL_EVENT_PROGRESS = 8,   /* requests with "return_progress" only: the prefill advanced.
                                  n_prompt_tokens, n_cached_tokens as PROMPT's; n_processed:
                                  prompt tokens in the cache now (cached ones included, so the
                                  overall progress is n_processed / n_prompt_tokens);
                                  elapsed_ms: since the request took its slot. After each step
                                  that fed the prompt, the last with n_processed ==
                                  n_prompt_tokens, before the first generated token's events */
} keel_event_kind;

typedef struct keel_event {
    keel_event_kind kind;
    uint64_t request;     /* the request's id (keel_engine_submit) */
    int32_t index;        /* tool call index for TOOL_*, else -1 */
    const char *text;     /* delta bytes (CONTENT, REASONING, TOOL_ARGS), not NUL-terminated;
                             valid UTF-8 (invalid bytes the model produced become U+FFFD,
                             as in the response) */
    size_t len;
    const char *id;       /* TOOL_BEGIN: the call id */
    const char *name;     /* TOOL_BEGIN: the function name */
    const char *response; /* DONE: the response JSON (NUL-terminated) */
    keel_status status;   /* DONE: KEEL_OK, or why the request failed (detail in response) */
    const char *error;    /* TOOL_END: NULL, or why the call is malformed (its arguments are
                             then the raw text the model wrote) */
    int32_t n_prompt_tokens; /* PROMPT: tokens of the prompt */
    int32_t n_cached_tokens; /* PROMPT: of those, already in the cache (usage.cached_tokens) */
    int32_t token;        /* LOGPROB: the token id */
    float logprob;        /* LOGPROB: its log-probability under the model */
    int32_t n_processed;  /* PROGRESS: prompt tokens in the cache (n_cached_tokens included) */
    double elapsed_ms;    /* PROGRESS: milliseconds since the prefill began */
} keel_event;

/* Receives events, on the thread that runs the engine (keel_complete's caller
 * or keel_engine_run's). Pointers are valid only during the call. Returning
 * false cancels the request (it ends with finish_reason "cancelled"). Must
 * not call back into the engine except keel_engine_cancel*. */
typedef bool (*keel_event_fn)(void *user, const keel_event *ev);

/*
 * One chat turn, synchronously: renders messages_json (an OpenAI messages
 * array; content as a string or text parts; strings may hold \u0000, which
 * the engine itself can generate, so a history echoed back is accepted) with tools_json (an OpenAI tools
 * array, or NULL), reuses the longest common prefix of the cached
 * conversation (unless compaction made the cache differ from the history:
 * then the response says so), generates, streams every delta through cb (may
 * be NULL), and writes the response JSON to response[0 .. cap) (NUL
 * included; may be NULL with cap 0):
 *   {"content", "reasoning_content", "tool_calls": [{"id", "type": "function",
 *    "function": {"name", "arguments"}}], "finish_reason": "stop" | "length" |
 *    "tool_calls" | "cancelled", "stop_sequence", "usage": {"prompt_tokens",
 *    "cached_tokens", "completion_tokens"}, "timings": {"prompt_ms",
 *    "predicted_ms", "prompt_per_second", "predicted_per_second"},
 *   "memory": {"cells", "compactions", "cache": "reused" | "reset: why"},
 *   "tool_grammar" (only when tool calls were to be constrained: see strict_tools)}
 * options_json (may be NULL): "max_tokens" (-1: until the end of generation or
 * the budget), "temperature", "top_p", "top_k", "min_p", "seed",
 * "repeat_penalty", "presence_penalty", "frequency_penalty", "stop" (string or
 * array), "kv_compact" (as at open; "none" turns compaction off for this and
 * the following turns), "chat_template_kwargs" (object of extra template
 * variables, e.g. {"enable_thinking": false}), "add_generation_prompt" (true),
 * "continue_final_message" (true: a last message that is the assistant's
 * and holds no tool calls is a prefill the model continues — the prompt is
 * the conversation before it, the generation prompt, and the message as
 * the model writes it: the reasoning opener and its reasoning_content (when
 * reasoning is parsed, as llama.cpp does), then the closer and its content;
 * with reasoning and no content the reasoning is continued. The parse covers prefill and generation, so a reasoning
 * block or a tool call the prefill opened comes back whole, but the events
 * and the response's content / reasoning_content leave out the prefill's
 * own bytes: the caller has them. "content" / "reasoning_content" continue
 * that part, KEEL_EINVAL when the last message is not the assistant's;
 * false closes the message and opens a new turn; two assistant messages
 * ending the conversation are KEEL_EINVAL unless false), "reasoning_format"
 * (llama-server's names: "auto", the default, "deepseek" and
 * "deepseek-legacy" alike parse reasoning into reasoning_content; "none"
 * leaves the reasoning markers and text in the content), "response_format"
 * ({"type": "text" | "json_object" | "json_schema", ...}: with a JSON type
 * the answer is constrained to a JSON object, or to the instances of
 * {"json_schema": {"schema": S}} (keel_grammar_compile_schema's keywords;
 * another keyword is KEEL_EINVAL naming it and its location); an answer
 * in a Markdown fence, ```json ... ```, would come back unwrapped),
 * "json_schema" (llama-server's: a schema object, the same), "grammar" (GBNF text: the
 * output is constrained to its sentences, keel_grammar_compile's syntax;
 * end-of-generation tokens are allowed exactly when the text is complete,
 * and a complete text nothing can extend ends with finish_reason "stop";
 * a grammar the compiler refuses is KEEL_EINVAL "grammar: ..."; the
 * vocabulary trie is built at the first such request; one of grammar,
 * json_schema and a JSON response_format), "grammar_lazy" (true: the
 * grammar applies only from the first trigger in the output on — the text
 * before it is free and stays content — and the grammar's sentences begin
 * with the trigger's text; the matcher is not touched while it waits),
 * "grammar_triggers" (with grammar_lazy: up to 16 strings of 1..128 bytes,
 * or objects {"type": "word", "value": S}, {"type": "token", "value": ID}
 * (a token id: its text, special tokens rendered, is where the grammar
 * starts) or {"type": "start", "value": S} (S counts only where the output
 * begins with it, whitespace aside; not mixed with words); llama-server's
 * numeric types 0 (token) and 1 (word) are accepted, patterns are
 * KEEL_EINVAL; text after a trigger that the grammar refuses leaves the
 * request waiting for the next one), "strict_tools" ("auto", the default:
 * tool calls are constrained when a tool sets "strict": true (OpenAI's
 * function.strict) or tool_choice forces a call; true: every tool call;
 * false: none. Constrained means a grammar of the template's tool-call
 * format — docs/grammar.md "Tool calls" lists the formats — with the
 * name one of the tools and the arguments the tool's "parameters" schema
 * (strict tools, or every tool when forced or true; the others any JSON
 * object), lazy from the format's opening marker on, or from the first
 * token of a forced call; a strict tool whose schema is refused is
 * KEEL_EINVAL "tools: tool 'f' (strict): ..." naming the keyword; another
 * tool is left unconstrained, and a format without a grammar leaves every
 * call unconstrained (logged once); the response's "tool_grammar" says
 * which: "lazy: 1 of 2 tools constrained (hermes)", "forced: ...",
 * "unconstrained: why"; an explicit grammar wins over the tools'),
 * "parallel_tool_calls" (false: the tool grammar allows one call),
 * "ignore_eos", "return_progress" (true: KEEL_EVENT_PROGRESS events
 * during the prefill, llama-server's option of that name),
 * "logprobs" (true: the response's "logprobs": {"content": [{"token",
 * "logprob", "bytes", "top_logprobs": [...]}]}, OpenAI's shape, one entry
 * per generated token, log-softmax of the model's logits), "top_logprobs"
 * (0..20, with logprobs), "logit_bias" ({"token id": bias}: ids as decimal
 * strings in [0, n_vocab), biases in [-100, 100] added to those logits
 * before sampling, greedy included; -100 bans the token; logprobs stay the
 * model's), "tool_choice" ("auto"; "none": tools neither rendered nor
 * parsed; "required", or {"name": N} / {"type": "function", "function":
 * {"name": N}}: the prompt ends with the opening of a call (to N) where the
 * tool-call format has one — hermes, qwen3-coder, llama3 JSON — so the
 * answer is a call; other formats are only told about the tools),
 * "prompt" (raw text instead of messages: no template, no tool parsing) or
 * "prompt_tokens" (ids).
 * KEEL_ERANGE: the response did not fit cap (the turn happened; get it with
 * keel_engine_response). KEEL_EINVAL (bad JSON or option, named),
 * KEEL_ECONTEXT (prompt longer than the cache can ever hold: the response's
 * usage.prompt_tokens is its length — for a chat rendering past its bound of
 * 64 bytes a token, an estimate at 4 bytes a token — and "prompt_limit" the
 * most tokens it may have), KEEL_EFULL,
 * KEEL_ECANCELED (keel_engine_cancel or cb returned false; the response says
 * so), template errors (KEEL_EINVAL with the template's message). Not
 * thread-safe against other keel_complete calls on e; with a loop running on
 * another thread (keel_engine_run) it submits and waits.
 */
keel_status keel_complete(keel_engine *e, const char *messages_json, const char *options_json,
                          const char *tools_json, keel_event_fn cb, void *user, char *response,
                          size_t cap);

/* The response JSON of the last keel_complete on e (NUL included in *n_out;
 * with several threads calling keel_complete, whichever finished last).
 * KEEL_ERANGE if cap is too small (buf may be NULL to ask the size),
 * KEEL_ENOENT if none. Thread-safe. */
keel_status keel_engine_response(keel_engine *e, char *buf, size_t cap, size_t *n_out);

/*
 * Queues a request (thread-safe): request_json is an object with "messages"
 * (and "tools") or "prompt" / "prompt_tokens", plus the options of
 * keel_complete. Events go to cb on the engine's thread; the last is DONE.
 * *id receives the request id. KEEL_EINVAL (malformed, named), KEEL_EFULL
 * (the queue holds max_queue requests), KEEL_ECANCELED (the engine stops).
 * Validation of the prompt happens when it starts: a bad request still ends
 * with DONE and a non-OK status.
 */
keel_status keel_engine_submit(keel_engine *e, const char *request_json, keel_event_fn cb,
                               void *user, uint64_t *id);
/* The number of prompt tokens request_json (as keel_engine_submit takes it:
 * messages and tools, or prompt / prompt_tokens) renders and tokenizes to,
 * exactly as a request would be prompted (a continued assistant message
 * included), without a slot, a forward pass or a bound from the context (a
 * prompt longer than the cache is counted).
 * Runs on the calling thread, never waits for the scheduler; thread-safe.
 * KEEL_EINVAL (malformed, named; template errors), KEEL_ENOMEM. Allocates
 * the rendering and frees it. */
keel_status keel_engine_count_tokens(keel_engine *e, const char *request_json, int64_t *n_tokens);
/* Runs the scheduler on the calling thread until keel_engine_stop: waits for
 * requests, steps the slots. Returns KEEL_OK after stop (in-flight requests
 * end with "cancelled"). KEEL_EINVAL if a loop already runs. A keel_complete
 * already stepping the engine on its own thread finishes its request first
 * (the loop waits for it); later keel_complete calls submit and wait. */
keel_status keel_engine_run(keel_engine *e);
/* Asks the loop to return (thread-safe, async-signal-unsafe); a batch in
 * progress is interrupted (keel_cancel: between layers, between ubatches
 * for models with recurrent layers) and its slots keep their caches as
 * before the batch. */
void keel_engine_stop(keel_engine *e);
/* Cancels one request (thread-safe): it ends at the next step with
 * finish_reason "cancelled"; when no other live request is in the batch
 * being decoded, that batch is interrupted (as keel_engine_stop's).
 * KEEL_ENOENT if it is not queued or running. */
keel_status keel_engine_cancel_request(keel_engine *e, uint64_t id);
/* Cancels every queued and running request (thread-safe); requests queued
 * after it returns are not affected. */
void keel_engine_cancel(keel_engine *e);
/* Clears every slot's cache and history (not while requests run: KEEL_ESTATE). */
keel_status keel_engine_reset(keel_engine *e);
/*
 * Slot actions (the server's /slots/{id}?action=...), thread-safe: with a
 * loop running they are queued to it and wait; they need the slot idle
 * (KEEL_ESTATE otherwise) and a valid slot id (KEEL_EINVAL).
 *   save:    writes the slot's cache and its token history to path
 *            (keel_session format, docs/formats.md; atomic: a temporary file
 *            renamed into place; a path that is not a regular file is
 *            refused as keel_session_save does). info (may be NULL, cap bytes) receives
 *            {"id_slot", "n_saved", "n_written", "timings": {"save_ms"}}.
 *   restore: loads such a file into the slot (validated completely before the
 *            slot changes: wrong model, other cache types, corrupted or
 *            truncated files, and a token history that is not the one the
 *            cells hold (as keel_mem_load checks it; here an empty history
 *            with cells is refused too) or holds ids outside the vocabulary
 *            are refused, KEEL_EFORMAT, with the slot's cache and history
 *            unchanged); info receives {"id_slot", "n_restored", "n_read",
 *            "timings": {"restore_ms"}}.
 *   erase:   empties the slot's cache; info {"id_slot", "n_erased"}.
 * KEEL_EIO (path and errno text in keel_engine_last_error), KEEL_EFORMAT,
 * KEEL_EFULL (the cache has no room for the restored cells), KEEL_ERANGE
 * (info did not fit: the action happened).
 */
keel_status keel_engine_slot_save(keel_engine *e, int32_t slot, const char *path, char *info, size_t cap);
keel_status keel_engine_slot_restore(keel_engine *e, int32_t slot, const char *path, char *info, size_t cap);
keel_status keel_engine_slot_erase(keel_engine *e, int32_t slot, char *info, size_t cap);

/* Statistics and the memory plan as JSON into buf (thread-safe): slots (state,
 * cached tokens, cells, compactions, and "prompt_progress": {"total",
 * "cache", "processed"} tokens of the slot's current or last prompt, as
 * KEEL_EVENT_PROGRESS counts them, as of the last step), requests served, tokens in/out, plan
 * bytes. KEEL_ERANGE if cap is too small (*n_out says how much). */
keel_status keel_engine_stats(keel_engine *e, char *buf, size_t cap, size_t *n_out);

#ifdef __cplusplus
}
#endif

#endif /* KEEL_H */
