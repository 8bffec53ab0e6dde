/*
 * tensor_impl.h — private to src/tensor: block layouts (byte offsets), the
 * dispatch state and the kernel tables shared by the scalar files and the
 * *_avx2.c files.
 *
 * Blocks are addressed as bytes with the offsets below, never through
 * structs, so that rows may start at any byte address (GGUF rows of 34-byte
 * q8_0 blocks are only 2-aligned; tests use odd addresses). Multi-byte
 * fields are read with memcpy (little-endian, as GGUF).
 *
 *   type  elems bytes  layout (byte offset: field)
 *   q4_0   32    18    0: f16 d | 2: qs[16]  x[j] = d*((qs[j]&15)-8), x[j+16] = d*((qs[j]>>4)-8)
 *   q4_1   32    20    0: f16 d | 2: f16 m | 4: qs[16]   x = d*q + m
 *   q5_0   32    22    0: f16 d | 2: u32 qh | 6: qs[16]  q = nibble | bit(qh, j)<<4, x = d*(q-16)
 *   q5_1   32    24    0: f16 d | 2: f16 m | 4: u32 qh | 8: qs[16]   x = d*q + m
 *   q8_0   32    34    0: f16 d | 2: i8 qs[32]
 *   q8_1   32    36    0: f16 d | 2: f16 s = d*sum(qs) | 4: i8 qs[32]
 *   q2_K  256    84    0: scales[16] (lo: scale, hi: min) | 16: qs[64] | 80: f16 d | 82: f16 dmin
 *   q3_K  256   110    0: hmask[32] | 32: qs[64] | 96: scales[12] (6-bit, -32) | 108: f16 d
 *   q4_K  256   144    0: f16 d | 2: f16 dmin | 4: scales[12] (6-bit sc, min) | 16: qs[128]
 *   q5_K  256   176    0: f16 d | 2: f16 dmin | 4: scales[12] | 16: qh[32] | 48: qs[128]
 *   q6_K  256   210    0: ql[128] | 128: qh[64] | 192: i8 scales[16] | 208: f16 d
 *   q8_K  256   292    0: f32 d | 4: i8 qs[256] | 260: i16 bsums[16] (sums of 16 qs)
 */
#ifndef KEEL_TENSOR_IMPL_H
#define KEEL_TENSOR_IMPL_H

#include "tensor.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

#define QK   32  /* elements per legacy block */
#define QK_K 256 /* elements per K-quant super-block */

#define Q4_0_BYTES 18
#define Q4_1_BYTES 20
#define Q5_0_BYTES 22
#define Q5_1_BYTES 24
#define Q8_0_BYTES 34
#define Q8_1_BYTES 36
#define Q2_K_BYTES 84
#define Q3_K_BYTES 110
#define Q4_K_BYTES 144
#define Q5_K_BYTES 176
#define Q6_K_BYTES 210
#define Q8_K_BYTES 292

#define Q8_K_QS    4
#define Q8_K_BSUMS 260

/* ---- unaligned little-endian field access -------------------------------- */

static inline uint16_t rd_u16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}
static inline uint32_t rd_u32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static inline float rd_f32(const uint8_t *p)
{
    float v;
    memcpy(&v, p, 4);
    return v;
}
static inline int16_t rd_i16(const uint8_t *p)
{
    int16_t v;
    memcpy(&v, p, 2);
    return v;
}
static inline void wr_u16(uint8_t *p, uint16_t v)
{
    memcpy(p, &v, 2);
}
static inline void wr_u32(uint8_t *p, uint32_t v)
{
    memcpy(p, &v, 4);
}
static inline void wr_f32(uint8_t *p, float v)
{
    memcpy(p, &v, 4);
}
static inline float rd_f16(const uint8_t *p)
{
    return tensor_f16_to_f32(rd_u16(p));
}

/* The q4_K / q5_K 12-byte scale packing: sub-block j in [0, 8) has a 6-bit
 * scale and a 6-bit min. j < 4: low 6 bits of bytes j and j+4; j >= 4: the
 * nibbles of byte j+4 plus the top 2 bits of bytes j-4 (scale) and j (min). */
static inline void kq_scale_min(int j, const uint8_t *q, int *sc, int *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* All 8 scales then all 8 mins (bytes) of a q4_K/q5_K scale field. */
static inline void kq_unpack_scales(const uint8_t *q, uint8_t out[16])
{
    for (int j = 0; j < 8; j++) {
        int sc, m;
        kq_scale_min(j, q, &sc, &m);
        out[j] = (uint8_t)sc;
        out[8 + j] = (uint8_t)m;
    }
}

/* q3_K: the 6-bit scale of sub-block j in [0, 16) (still biased by 32). */
static inline int q3k_scale(int j, const uint8_t *s)
{
    if (j < 4) return (s[j] & 0xF) | (((s[j + 8] >> 0) & 3) << 4);
    if (j < 8) return (s[j] & 0xF) | (((s[j + 4] >> 2) & 3) << 4);
    if (j < 12) return (s[j - 8] >> 4) | (((s[j] >> 4) & 3) << 4);
    return (s[j - 8] >> 4) | (((s[j - 4] >> 6) & 3) << 4);
}

/* ---- rounding and scales shared by the scalar and SIMD quantizers -------- */

/* The one rounding rule: clamp to [lo, hi] (integers; NaN -> lo), then
 * round to nearest, ties to even (nearbyintf in the default rounding mode;
 * _mm256_max_ps, _mm256_min_ps, _mm256_round_ps(_MM_FROUND_TO_NEAREST_INT)
 * in AVX2, which give the same integer for every input). Clamping first
 * keeps the conversion to int defined for any input. */
static inline int tq_qround(float v, float lo, float hi)
{
    v = v >= lo ? v : lo;
    v = v <= hi ? v : hi;
    return (int)nearbyintf(v);
}

#define TQ_F16_MAX 65504.0f

/* A block scale as stored (f16, rounded to nearest even, clamped finite),
 * and the reciprocal the quantizers multiply by (0 for a zero scale). Both
 * paths use exactly these two floats, so their bytes agree. */
static inline uint16_t tq_scale_f16(float d, float *d_rounded, float *inv)
{
    if (d > TQ_F16_MAX) d = TQ_F16_MAX;
    if (d < -TQ_F16_MAX) d = -TQ_F16_MAX;
    uint16_t h = tensor_f32_to_f16(d);
    float r = tensor_f16_to_f32(h);
    *d_rounded = r;
    *inv = r != 0.0f ? 1.0f / r : 0.0f;
    return h;
}

/* ---- dispatch ------------------------------------------------------------- */

/* 1 when the AVX2 paths run, 0 for scalar; -1 before the first query. */
extern _Atomic int tensor_simd_level_;
int tensor_simd_init_(void);

static inline bool tensor_use_avx2(void)
{
    int l = atomic_load_explicit(&tensor_simd_level_, memory_order_relaxed);
    if (BASE_UNLIKELY(l < 0)) l = tensor_simd_init_();
    return l > 0;
}

typedef float (*tensor_dot_fn)(int64_t n, const void *w, const void *x);
typedef void (*tensor_quant_fn)(const float *x, void *y, int64_t n);
typedef void (*tensor_dequant_fn)(const void *x, float *y, int64_t n);
typedef void (*tensor_axpy_fn)(int64_t n, float a, const void *row, float *y);

/* Tables indexed by dtype; NULL where the type has no such kernel. The
 * dispatching functions pick the AVX2 entry when present and active. */
extern const tensor_dot_fn tensor_dot_scalar_[KEEL_DTYPE_COUNT_];
extern const tensor_dot_fn tensor_dot_avx2_[KEEL_DTYPE_COUNT_];
extern const tensor_quant_fn tensor_quant_scalar_[KEEL_DTYPE_COUNT_];
extern const tensor_quant_fn tensor_quant_avx2_[KEEL_DTYPE_COUNT_];
extern const tensor_dequant_fn tensor_dequant_scalar_[KEEL_DTYPE_COUNT_];
extern const tensor_dequant_fn tensor_dequant_avx2_[KEEL_DTYPE_COUNT_];
extern const tensor_axpy_fn tensor_axpy_scalar_[KEEL_DTYPE_COUNT_];
extern const tensor_axpy_fn tensor_axpy_avx2_[KEEL_DTYPE_COUNT_];

/* Matrix-vector kernels over a range of rows: y[r] = dot(W row r, x) for
 * r < n_rows, rows rb bytes apart, x in the dtype's vec_dot type and xp
 * what the dtype's tensor_mv_prep made of x (NULL when it has none)
 * (matvec's hot loop; NULL: the dtype's dot row by row). */
typedef void (*tensor_mv_fn)(int64_t n_rows, int64_t n_cols, const uint8_t *W, size_t rb,
                             const void *x, const void *xp, float *y);
extern const tensor_mv_fn tensor_mv_avx2_[KEEL_DTYPE_COUNT_];

/* What a row kernel needs of the activation beyond x itself, made once per
 * product: bytes(n_cols) of scratch (64-byte aligned), filled by run(x,
 * n_cols, xp). Both NULL when the dtype needs nothing. */
typedef struct tensor_mv_prep {
    size_t (*bytes)(int64_t n_cols);
    void (*run)(const void *x, int64_t n_cols, void *xp);
} tensor_mv_prep;
extern const tensor_mv_prep tensor_mv_prep_avx2_[KEEL_DTYPE_COUNT_];
/* The avx512 level's row kernels where it has its own (q8_0:
 * matvec_batch_avx512.c, the same code as its batched kernel), with their
 * preps; NULL entries take the avx2 ones. */
extern const tensor_mv_fn tensor_mv_avx512_[KEEL_DTYPE_COUNT_];
extern const tensor_mv_prep tensor_mv_prep_avx512_[KEEL_DTYPE_COUNT_];

/* Batched row kernels: y[i * y_stride + r] = dot(W row r, x_i) for
 * r < n_rows, i < n_tok (1..TENSOR_MV_BATCH_MAX), each bit for bit what the
 * dtype's row kernel of the same level gives x_i alone (same per-block products,
 * same lanes, same summation order), with each row read once for all
 * tokens. pack lays the n_tok activations (x[i] in the vec_dot type) out
 * for run once per product (pack_bytes(n_cols, n_tok) bytes of scratch,
 * 64-byte aligned): interleaved per block, so that the kernel walks one
 * pointer for all tokens. run NULL: tensor_matvec_batch runs the row kernel
 * token by token over L1-sized chunks of rows. */
typedef void (*tensor_mvb_fn)(int64_t n_rows, int64_t n_cols, const uint8_t *W, size_t rb, int n_tok,
                              const void *packed, float *y, size_t y_stride);
typedef struct tensor_mvb_kernel {
    tensor_mvb_fn run;
    size_t (*pack_bytes)(int64_t n_cols, int n_tok);
    void (*pack)(const void *const *x, int n_tok, int64_t n_cols, void *packed);
} tensor_mvb_kernel;
extern const tensor_mvb_kernel tensor_mvb_avx2_[KEEL_DTYPE_COUNT_];
/* The same with AVX-512 VNNI (one block per lane; bit for bit
 * tensor_mv_avx512_; call only at the avx512 level). */
extern const tensor_mvb_kernel tensor_mvb_avx512_[KEEL_DTYPE_COUNT_];

tensor_dot_fn tensor_dot_get_(keel_dtype t);
tensor_quant_fn tensor_quant_get_(keel_dtype t);
tensor_dequant_fn tensor_dequant_get_(keel_dtype t);

/* ---- scalar kernels (quant.c, quant_k.c, dot.c) ---------------------------- */

void tq_quant_f32(const float *x, void *y, int64_t n);
void tq_quant_f16(const float *x, void *y, int64_t n);
void tq_quant_bf16(const float *x, void *y, int64_t n);
void tq_quant_q4_0(const float *x, void *y, int64_t n);
void tq_quant_q4_1(const float *x, void *y, int64_t n);
void tq_quant_q5_0(const float *x, void *y, int64_t n);
void tq_quant_q5_1(const float *x, void *y, int64_t n);
void tq_quant_q8_0(const float *x, void *y, int64_t n);
void tq_quant_q8_1(const float *x, void *y, int64_t n);
void tq_quant_q8_K(const float *x, void *y, int64_t n);
void tq_quant_q4_K(const float *x, void *y, int64_t n);
void tq_quant_q5_K(const float *x, void *y, int64_t n);
void tq_quant_q6_K(const float *x, void *y, int64_t n);

void tq_dequant_f32(const void *x, float *y, int64_t n);
void tq_dequant_f16(const void *x, float *y, int64_t n);
void tq_dequant_bf16(const void *x, float *y, int64_t n);
void tq_dequant_q4_0(const void *x, float *y, int64_t n);
void tq_dequant_q4_1(const void *x, float *y, int64_t n);
void tq_dequant_q5_0(const void *x, float *y, int64_t n);
void tq_dequant_q5_1(const void *x, float *y, int64_t n);
void tq_dequant_q8_0(const void *x, float *y, int64_t n);
void tq_dequant_q8_1(const void *x, float *y, int64_t n);
void tq_dequant_q8_K(const void *x, float *y, int64_t n);
void tq_dequant_q2_K(const void *x, float *y, int64_t n);
void tq_dequant_q3_K(const void *x, float *y, int64_t n);
void tq_dequant_q4_K(const void *x, float *y, int64_t n);
void tq_dequant_q5_K(const void *x, float *y, int64_t n);
void tq_dequant_q6_K(const void *x, float *y, int64_t n);

float tq_dot_q2_K(int64_t n, const void *w, const void *x);
float tq_dot_q3_K(int64_t n, const void *w, const void *x);
float tq_dot_q4_K(int64_t n, const void *w, const void *x);
float tq_dot_q5_K(int64_t n, const void *w, const void *x);
float tq_dot_q6_K(int64_t n, const void *w, const void *x);

/* ---- AVX2 kernels (*_avx2.c; call only when tensor_use_avx2()) ------------ */

float tensor_dot_f32_avx2(const float *a, const float *b, int64_t n);
void tensor_axpy_f32_avx2(float *y, float a, const float *x, int64_t n);
void tensor_scale_f32_avx2(float *y, float a, int64_t n);
void tensor_add_f32_avx2(float *y, const float *x, int64_t n);
void tensor_mul_f32_avx2(float *y, const float *x, int64_t n);
float tensor_sumsq_f32_avx2(const float *x, int64_t n);

void tensor_wht_avx2(float *x, int64_t n, const float *pre, const float *post);

/* In-place y = exp(x) on n floats; returns sum(y) (for softmax). */
float tensor_exp_sub_avx2(float *x, int64_t n, float sub);
void tensor_silu_avx2(float *x, int64_t n);
void tensor_sigmoid_avx2(float *x, int64_t n);
void tensor_swiglu_avx2(float *gate, const float *up, int64_t n);
void tensor_gelu_avx2(float *x, int64_t n);
void tensor_geglu_avx2(float *gate, const float *up, int64_t n);
void tensor_softcap_avx2(float *x, int64_t n, float cap);

void tensor_rope_apply_avx2(keel_rope_type type, int32_t n_rot, const float *cs, float *x,
                            int64_t n_heads, int64_t head_dim);

#endif /* KEEL_TENSOR_IMPL_H */
