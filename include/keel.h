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
 * Runs the named benchmark ("kernels", "attention", ...) with CLI-style
 * arguments (argv[0] is the first option, not a program name) and writes a
 * human table, or one JSON object with "--json", to out.
 * KEEL_ENOENT for an unknown name, KEEL_EINVAL for bad options.
 * Allocates; runs threads; takes seconds.
 */
keel_status keel_bench_run(const char *name, int argc, char **argv, keel_write_fn out, void *user);

/* KEEL_SECTION_MEMORY */

/* KEEL_SECTION_MODEL */

/* KEEL_SECTION_ENGINE */

#ifdef __cplusplus
}
#endif

#endif /* KEEL_H */
