/*
 * tensor.h — private interface of src/tensor: dtypes and quant formats,
 * kernels (dot, matvec, matmul, rope, wht, norms, softmax), SIMD dispatch.
 * Depends only on src/base.
 *
 * Conventions
 *   - Rows: a matrix W of n_rows x n_cols in dtype t is n_rows contiguous
 *     rows of tensor_row_bytes(t, n_cols) bytes (GGUF's layout: ne[0] =
 *     n_cols is the fastest dimension). y = W x means y[r] = dot(W[r,:], x).
 *   - Alignment: data given as void * (weight rows, quantized blocks) may
 *     start at any byte address, f32 weight rows included (a GGUF buffer
 *     may sit anywhere; test_tensor_kernels checks odd addresses under
 *     UBSan); float * arguments (activations, outputs) are float-aligned.
 *   - Every kernel has a scalar reference and, where it matters, an
 *     AVX2/FMA path chosen at run time by cpuid; tensor_simd_force (or
 *     KEEL_SIMD, keel_set_simd) pins a level process-wide (tests compare
 *     every level the CPU has with scalar; benchmarks time them).
 *     Where a format defines bytes (quantize), both paths produce identical
 *     bytes.
 *   - Hot-path kernels allocate nothing: scratch comes from a caller's arena
 *     (KEEL_ESCRATCH if it does not fit) or caller buffers.
 */
#ifndef KEEL_TENSOR_H
#define KEEL_TENSOR_H

#include "../base/base.h"

/* ---- dtype table (dtype.c) ---------------------------------------------- */

/* True for an id in the dtype table. */
bool tensor_dtype_valid(keel_dtype t);
/* Row bytes of n elements, 0 if invalid (n not a block multiple, unknown). */
size_t tensor_row_bytes(keel_dtype t, int64_t n);

/* ---- CPU features and dispatch ------------------------------------------ */

typedef struct tensor_cpu {
    bool avx2, fma, f16c, bmi2;
    bool avx512f, avx512bw, avx512vl, avx512vnni, avxvnni;
} tensor_cpu;

/* Features of this CPU (cpuid + OS support via xgetbv). Static storage. */
const tensor_cpu *tensor_cpu_features(void);
/* Kernel paths, in order: a level includes the ones below it. AVX2 needs
 * AVX2, FMA, F16C and BMI2; AVX512 adds AVX-512 F/BW/VL/VNNI (used by the
 * attention kernels; the tensor kernels run their AVX2 code there). */
typedef enum tensor_simd {
    TENSOR_SIMD_SCALAR = 0,
    TENSOR_SIMD_AVX2 = 1,
    TENSOR_SIMD_AVX512 = 2,
} tensor_simd;

/* The best level this CPU and OS support. */
tensor_simd tensor_simd_best(void);
/* The level every dispatch uses now: min(requested, best). The request
 * starts as KEEL_SIMD (read once, at the first query) or the best. */
tensor_simd tensor_simd_level(void);
/* Requests a level process-wide (clamped to the best); returns the level
 * in force before. Not thread-safe: call between jobs. */
tensor_simd tensor_simd_force(tensor_simd level);
/* "scalar", "avx2", "avx512" (case-insensitive) or "auto" (the best). */
bool tensor_simd_from_name(const char *name, tensor_simd *out);
/* false: scalar; true: the default level (KEEL_SIMD or the best). Returns
 * whether a SIMD level was in force. Not thread-safe: call between jobs. */
bool tensor_set_simd(bool enabled);
/* True when SIMD paths are in use (level above scalar). */
bool tensor_simd_active(void);
/* "scalar" / "avx2" / "avx512": the level in force. */
const char *tensor_simd_name(void);

/* ---- half precision ----------------------------------------------------- */

/* IEEE binary16 and bfloat16 conversions, round-to-nearest-even, exact
 * (identical to F16C's _cvtss_sh(x, 0) / _cvtsh_ss). */
float tensor_f16_to_f32(uint16_t h);
uint16_t tensor_f32_to_f16(float f);
float tensor_bf16_to_f32(uint16_t h);
uint16_t tensor_f32_to_bf16(float f);

/* ---- quantize / dequantize ---------------------------------------------- */

/* Quantizes n floats (a multiple of the block size) into y
 * (tensor_row_bytes(t, n) bytes). KEEL_EINVAL for a bad n, KEEL_EUNSUPPORTED
 * for a type keel cannot write. Allocates nothing. */
keel_status tensor_quantize_row(keel_dtype t, const float *x, void *y, int64_t n);
/* Dequantizes n elements of row x into y. KEEL_EINVAL / KEEL_EUNSUPPORTED. */
keel_status tensor_dequantize_row(keel_dtype t, const void *x, float *y, int64_t n);
/* The same without checks or status, for a dtype and n the caller validated
 * once (keel can write t; n a multiple of its block), e.g. the memory core's
 * columns at open. */
void tensor_quantize_row_unchecked(keel_dtype t, const float *x, void *y, int64_t n);
void tensor_dequantize_row_unchecked(keel_dtype t, const void *x, float *y, int64_t n);
/* Whether every one of the n elements of row x (n a multiple of the block,
 * t valid) decodes to a finite value, from the stored bits where the codec
 * allows (floats, the block scales of q4_0..q8_0), else by decoding. */
bool tensor_row_finite(keel_dtype t, const void *x, int64_t n);

/* ---- dot products ------------------------------------------------------- */

/* The activation type a weight dtype's vec_dot takes:
 *   f32, f16, bf16 -> f32;  q4_0, q5_0, q8_0 -> q8_0;  q4_1, q5_1 -> q8_1;
 *   q2_K..q6_K -> q8_K. */
keel_dtype tensor_vec_dot_type(keel_dtype w);

/* Dot of n elements: w (dtype t) with x (dtype tensor_vec_dot_type(t)).
 * n must be a multiple of both block sizes. No checks: hot path. */
float tensor_vec_dot(keel_dtype t, int64_t n, const void *w, const void *x);

/* y[0..n) += a * dequantize(row), for every dtype tensor_dequantize_row
 * accepts. Hot path of attention's V accumulation. No checks. */
void tensor_axpy_row(keel_dtype t, int64_t n, float a, const void *row, float *y);

/* f32 helpers (SIMD-dispatched). */
float tensor_dot_f32(const float *a, const float *b, int64_t n);
void tensor_axpy_f32(float *y, float a, const float *x, int64_t n); /* y += a x */
void tensor_scale_f32(float *y, float a, int64_t n);                /* y *= a */
void tensor_add_f32(float *y, const float *x, int64_t n);           /* y += x */
void tensor_mul_f32(float *y, const float *x, int64_t n);           /* y *= x (elementwise) */

/* ---- matrix-vector and matrix-matrix ------------------------------------ */

/* Scratch bytes tensor_matvec needs from its arena for this shape. */
size_t tensor_matvec_scratch_bytes(keel_dtype t, int64_t n_cols);

/* y[r] = W[r,:] . x for r in [0, n_rows). x is f32 [n_cols]; it is
 * converted once to tensor_vec_dot_type(t) in scratch. Rows are split
 * across the pool's threads (pool may be NULL). KEEL_ESCRATCH when the
 * arena is too small (arena unchanged), KEEL_EINVAL for a bad shape. */
keel_status tensor_matvec(keel_dtype t, const void *W, int64_t n_rows, int64_t n_cols,
                          const float *x, float *y, base_pool *pool, base_arena *scratch);

/* One matrix of tensor_matvec_multi: y = W x, W n_rows x n_cols of dtype;
 * x is the call's shared activation, or the job's own when x is set. */
typedef struct tensor_mv_job {
    keel_dtype dtype;
    const void *W;
    int64_t n_rows;
    float *y;       /* [n_rows] */
    const float *x; /* [n_cols], or NULL: the shared x */
} tensor_mv_job;

/* Decode's q/k/v and gate/up (shared x), and a MoE layer's chosen experts:
 * gate and up of each (shared x), then down (each its own x). */
#define TENSOR_MV_MULTI_MAX 32

/* Scratch bytes tensor_matvec_multi needs (x in each distinct vec_dot type,
 * per distinct activation). */
size_t tensor_matvec_multi_scratch_bytes(const tensor_mv_job *jobs, int n_jobs, int64_t n_cols);

/* y_j = W_j x_j for up to TENSOR_MV_MULTI_MAX matrices sharing n_cols (x_j:
 * the job's x, else the shared x) in one pool run: each activation is
 * converted once per distinct vec_dot type, the rows of every matrix are
 * chunked into one task list, so one dispatch serves them all and a thread
 * that finishes one matrix's rows goes straight on to the next's. Results
 * equal tensor_matvec on each matrix. KEEL_EINVAL (bad shape, n_jobs
 * outside 1..MAX, a job without an activation), KEEL_ESCRATCH (arena
 * unchanged). */
keel_status tensor_matvec_multi(const tensor_mv_job *jobs, int n_jobs, int64_t n_cols, const float *x,
                                base_pool *pool, base_arena *scratch);

/* Tokens one pass of tensor_matvec_batch reads each weight row for (a
 * longer batch runs in groups of this many). */
#define TENSOR_MV_BATCH_MAX 16

/* Scratch bytes tensor_matvec_batch needs for n_tok tokens (whatever SIMD
 * level runs). */
size_t tensor_matvec_batch_scratch_bytes(keel_dtype t, int64_t n_cols, int64_t n_tok);

/* Y[i][r] = W[r,:] . X[i,:] for i < n_tok, r < n_rows (Y row stride n_rows),
 * each token's row BIT-IDENTICAL to tensor_matvec on that token at the same
 * SIMD level, so a token's result does not depend on the batch around it.
 * Each weight row is read from memory once per TENSOR_MV_BATCH_MAX tokens
 * and dotted against all of them (speculative verify batches: 1 + k
 * tokens). Rows are split across the pool's threads as tensor_matvec
 * splits them. KEEL_ESCRATCH (arena unchanged) / KEEL_EINVAL as
 * tensor_matvec. */
keel_status tensor_matvec_batch(keel_dtype t, const void *W, int64_t n_rows, int64_t n_cols,
                                const float *X, int64_t n_tok, float *Y, base_pool *pool,
                                base_arena *scratch);

/* Y_j = W_j X for up to TENSOR_MV_MULTI_MAX matrices of one dtype sharing
 * n_cols and the n_tok activations X (a verify batch's q/k/v or gate/up):
 * jobs[j].y is [n_tok][n_rows_j], jobs[j].x must be NULL. Where the dtype
 * has a batched kernel at the level in force and n_tok <=
 * TENSOR_MV_BATCH_MAX, X is quantized and packed once and the rows of every
 * matrix go into one task list (one pool run); otherwise each matrix runs
 * through tensor_matvec_batch. Either way each Y_j is bit for bit
 * tensor_matvec_batch's (each token's tensor_matvec bits). Scratch: what
 * tensor_matvec_batch needs for one of them. KEEL_EINVAL (bad shape,
 * n_jobs outside 1..MAX, mixed dtypes, a job with its own x),
 * KEEL_ESCRATCH (arena unchanged). */
keel_status tensor_matvec_batch_multi(const tensor_mv_job *jobs, int n_jobs, int64_t n_cols, const float *X,
                                      int64_t n_tok, base_pool *pool, base_arena *scratch);

/* Scratch bytes tensor_matmul needs for this shape with n_threads threads. */
size_t tensor_matmul_scratch_bytes(keel_dtype t, int64_t n_rows, int64_t n_cols, int64_t n_tok,
                                   int n_threads);

/* Y[i][r] = X[i,:] . W[r,:] for i in [0, n_tok), r in [0, n_rows):
 * X is f32 [n_tok][n_cols], Y is f32 [n_tok][n_rows] (row stride n_rows).
 * Prefill GEMM: OpenBLAS sgemm (single-threaded per pool thread) for f32,
 * dequantized tiles or a tiled quantized kernel for other dtypes (see
 * docs/kernels.md for which, by measurement). One token goes through
 * tensor_matvec; small batches (2..17) through tensor_matvec_batch (or
 * the dot tiles; per dtype, tensor_matmul_auto_path). KEEL_ESCRATCH /
 * KEEL_EINVAL as above. */
keel_status tensor_matmul(keel_dtype t, const void *W, int64_t n_rows, int64_t n_cols,
                          const float *X, int64_t n_tok, float *Y, base_pool *pool,
                          base_arena *scratch);

/* The GEMM strategies tensor_matmul chooses between (docs/kernels.md has
 * the measurements behind the choice). Exposed for benchmarks and tests.
 *   AUTO           what tensor_matmul does
 *   MATVEC         tensor_matvec once per token
 *   DEQUANT_SGEMM  dequantize tiles of W rows to f32, OpenBLAS sgemm
 *                  (f32 weights: sgemm directly; DOT_TILES instead when
 *                  W is not 4-byte aligned)
 *   DOT_TILES      X quantized once to the vec_dot type, then tiles of
 *                  rows x tokens through the dtype's vec_dot
 *   MATVEC_BATCH   tensor_matvec_batch: each row read once per 16 tokens,
 *                  every token's row bit-identical to tensor_matvec's */
typedef enum tensor_gemm_path {
    TENSOR_GEMM_AUTO = 0,
    TENSOR_GEMM_MATVEC = 1,
    TENSOR_GEMM_DEQUANT_SGEMM = 2,
    TENSOR_GEMM_DOT_TILES = 3,
    TENSOR_GEMM_MATVEC_BATCH = 4,
} tensor_gemm_path;

/* tensor_matmul with the strategy forced. tensor_matmul_scratch_bytes
 * covers every path. KEEL_EINVAL for an unknown path. */
keel_status tensor_matmul_path(tensor_gemm_path path, keel_dtype t, const void *W, int64_t n_rows,
                               int64_t n_cols, const float *X, int64_t n_tok, float *Y,
                               base_pool *pool, base_arena *scratch);
/* The strategy AUTO picks for this dtype and batch. */
tensor_gemm_path tensor_matmul_auto_path(keel_dtype t, int64_t n_tok);

/* ---- RoPE (rope.c) ------------------------------------------------------ */

/*
 * Per-dimension angle rates for RoPE parameters: for dimension pair
 * i in [0, n_rot/2), the angle at position p is p * rate[i] (double), and
 * *mscale the YaRN magnitude factor (1 when YaRN is off). Rates include
 * freq_scale, freq_factors and the YaRN ramp. KEEL_EINVAL for bad params.
 */
keel_status tensor_rope_rates(const keel_rope *r, double *rate, float *mscale);
/* The parameter checks of tensor_rope_rates alone (type, even n_rot > 0,
 * finite freq_base/freq_scale > 0, finite ext_factor, finite attn_factor
 * > 0, YaRN's n_ctx_orig and betas, freq_factors finite > 0). */
keel_status tensor_rope_check(const keel_rope *r);

/* Fills cs[2*i] = cos(angle_i) * m, cs[2*i + 1] = sin(angle_i) * m for
 * i in [0, n_rot/2), angle_i = pos * rate[i] in double precision. */
void tensor_rope_cos_sin(const double *rate, int32_t n_rot, double pos, float m, float *cs);

/* Rotates the first n_rot dims of each of n_heads heads of x (head stride
 * head_dim floats) by the table cs (from tensor_rope_cos_sin), in the
 * NORM (adjacent pairs) or NEOX (halves) layout. */
void tensor_rope_apply(keel_rope_type type, int32_t n_rot, const float *cs, float *x,
                       int64_t n_heads, int64_t head_dim);

/* Convenience: rotate x to position pos (includes the YaRN magnitude). */
keel_status tensor_rope(const keel_rope *r, float *x, int64_t n_heads, int64_t head_dim,
                        int64_t pos);

/* Position edits: rotate by delta positions with magnitude 1, so that
 * rope_delta(rope(x, a), b) == rope(x, a + b). delta may be negative. */
keel_status tensor_rope_delta(const keel_rope *r, float *x, int64_t n_heads, int64_t head_dim,
                              int64_t delta);

/* ---- Walsh-Hadamard transform (wht.c) ------------------------------------ */

/* In-place normalized fast Walsh-Hadamard transform of n floats (n a power
 * of two, 2..4096): x <- H x / sqrt(n). Orthonormal and its own inverse. */
void tensor_wht(float *x, int64_t n);

/* The seeded random-sign diagonal: signs[i] = +-1.0f, a pure function of
 * (seed, i). */
void tensor_wht_signs(uint64_t seed, int64_t n, float *signs);

/* Rotation with the sign diagonal D (NULL = identity):
 * forward x <- H D x, inverse x <- D H x (its exact inverse). */
void tensor_wht_forward(float *x, int64_t n, const float *signs);
void tensor_wht_inverse(float *x, int64_t n, const float *signs);

/* ---- norms and activations (ops.c) ------------------------------------- */

/* y = x / sqrt(mean(x^2) + eps) * w (w NULL: no weight). y may alias x. */
void tensor_rmsnorm(float *y, const float *x, const float *w, int64_t n, float eps);
/* y = (x - mean) / sqrt(var + eps) * w + b (w, b may be NULL). y may alias x. */
void tensor_layernorm(float *y, const float *x, const float *w, const float *b, int64_t n,
                      float eps);
/* x <- x / max(||x||_2, eps). */
void tensor_l2norm(float *x, int64_t n, float eps);
/* In-place numerically stable softmax (subtracts the max; -inf entries -> 0). */
void tensor_softmax(float *x, int64_t n);
void tensor_silu(float *x, int64_t n);     /* x * sigmoid(x) */
void tensor_gelu(float *x, int64_t n);     /* tanh approximation */
void tensor_gelu_erf(float *x, int64_t n); /* exact erf form */
void tensor_sigmoid(float *x, int64_t n);
void tensor_softplus(float *x, int64_t n); /* log(1 + e^x), stable */
/* gate <- silu(gate) * up (SwiGLU). */
void tensor_swiglu(float *gate, const float *up, int64_t n);
/* gate <- gelu(gate) * up (GeGLU, tanh approximation). */
void tensor_geglu(float *gate, const float *up, int64_t n);
/* x <- cap * tanh(x / cap). */
void tensor_softcap(float *x, int64_t n, float cap);
/* Indices of the k largest values of x[0..n), largest first, ties to the
 * lower index. k <= n. idx has room for k. Allocates nothing (O(n log k)). */
void tensor_topk(const float *x, int64_t n, int64_t k, int32_t *idx);

/* ---- profile (prof.c) ---------------------------------------------------- */

/* Opt-in, per thread: while enabled, instrumented calls made by this thread
 * add their wall time to an entry per (kind, dtype, rows, cols). For
 * benchmarks (`keel bench -m MODEL --profile`); off by default. */
typedef enum tensor_prof_kind {
    TENSOR_PROF_MATVEC = 0, /* tensor_matvec: rows x cols weights of dtype */
    TENSOR_PROF_MATMUL,     /* tensor_matmul (not as matvecs): rows x cols, per call */
    TENSOR_PROF_ATTN,       /* keel_mem_attend: dtype = K dtype, rows = tokens */
    TENSOR_PROF_NORM,       /* rmsnorm / layernorm: cols = n */
    TENSOR_PROF_ROPE,       /* rope_apply: rows = heads, cols = head dim */
    TENSOR_PROF_ACT,        /* swiglu / geglu: cols = n */
} tensor_prof_kind;

#define TENSOR_PROF_MAX 64

typedef struct tensor_prof_entry {
    tensor_prof_kind kind;
    keel_dtype dtype;
    int64_t rows, cols;
    uint64_t ns;  /* wall time of the calls, this thread's view */
    int64_t calls;
    double bytes; /* weight / KV bytes the calls stream */
    int64_t tokens; /* rows of activations the calls took (a matvec: 1 each) */
} tensor_prof_entry;

void tensor_prof_enable(bool on);
bool tensor_prof_enabled(void);
void tensor_prof_reset(void);
/* The entries so far (thread-local storage of the calling thread). */
int tensor_prof_get(const tensor_prof_entry **out);
/* A start time when profiling is on (else 0), and the record of one call. */
uint64_t tensor_prof_begin(void);
void tensor_prof_end(uint64_t t0, tensor_prof_kind kind, keel_dtype dtype, int64_t rows,
                     int64_t cols, double bytes);
/* The same for a call over n_tok activation rows (matmul, attention). */
void tensor_prof_end_n(uint64_t t0, tensor_prof_kind kind, keel_dtype dtype, int64_t rows,
                       int64_t cols, double bytes, int64_t n_tok);
const char *tensor_prof_kind_name(tensor_prof_kind k);

#endif /* KEEL_TENSOR_H */
