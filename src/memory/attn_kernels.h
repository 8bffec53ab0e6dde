/*
 * attn_kernels.h — inner kernels of attention over the cache (attn.c):
 * scores of R query rows against n K rows, and V accumulation of n rows
 * into R accumulators, for one KV head. Each K / V row is read once for all
 * R rows (every query head of the GQA group and every token of the block).
 * Scalar versions (attn.c) cover every dtype through tensor_vec_dot /
 * tensor_axpy_row; AVX2 versions (attn_avx2.c) and AVX-512 versions
 * (attn_avx512.c, which need F/BW/VL/VNNI) cover f32, f16, q8_0 and q4_0
 * rows. Rows are at base + idx[j] * row_bytes. Kernels allocate nothing;
 * the SIMD ones compute the scalar results up to float reordering.
 */
#ifndef KEEL_ATTN_KERNELS_H
#define KEEL_ATTN_KERNELS_H

#include "memory.h"

#include <math.h>
#include <string.h>

#define ATTN_CB 32 /* cells per block: scores and p are [R][ATTN_CB] */

/* Bytes the caller reads next ([p, p + bytes), or bytes == 0): a kernel
 * may prefetch them spread over its work, so that the memory traffic
 * overlaps the arithmetic (issued all at once, the prefetches fill the
 * miss buffers and the work waits behind them). */
typedef struct attn_pf {
    const uint8_t *p;
    size_t bytes;
} attn_pf;

/* scores[r * ATTN_CB + j] = dot(K row idx[j], q[r]); q[r] in the K dtype's
 * vec_dot type. */
typedef void (*attn_kq_fn)(keel_dtype kt, const uint8_t *base, size_t row_bytes, const int32_t *idx,
                           int32_t n, const void *const *q, int32_t R, int32_t dk, float *scores,
                           attn_pf pf);

/* acc[r][0..dv) += sum_j p[r * ATTN_CB + j] * V row idx[j], for rows r with
 * active[r]. */
typedef void (*attn_pv_fn)(keel_dtype vt, const uint8_t *base, size_t row_bytes, const int32_t *idx,
                           int32_t n, const float *p, const uint8_t *active, int32_t R, int32_t dv,
                           float *const *acc, attn_pf pf);

/* Cursor over an attn_pf's cache lines: attn_pf_step asks for the next
 * `lines` of them. */
typedef struct attn_pf_cursor {
    uintptr_t line, end; /* next line's address, one past the last byte */
} attn_pf_cursor;

/* Unaligned loads of a K / V row's fields (a block's f16 scale, a query's
 * 4-byte group), for the SIMD kernels. */
static inline uint16_t attn_ld_u16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

static inline int32_t attn_ld_i32(const uint8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline attn_pf_cursor attn_pf_begin(attn_pf pf)
{
    uintptr_t a = (uintptr_t)pf.p;
    attn_pf_cursor c = {a & ~(uintptr_t)63, pf.bytes ? a + pf.bytes : a & ~(uintptr_t)63};
    return c;
}

/* lines per step that spread n_lines over n_steps */
static inline int32_t attn_pf_lines(attn_pf pf, int32_t n_steps)
{
    size_t lines = (pf.bytes + 127) / 64;
    return n_steps > 0 ? (int32_t)((lines + (size_t)n_steps - 1) / (size_t)n_steps) : 0;
}

/* Asks for the next `lines` lines: into L1 (T0) or, with l2, into L2 only (T2). */
static inline void attn_pf_lines_hint(attn_pf_cursor *c, int32_t lines, bool l2)
{
    uintptr_t e = c->line + (uintptr_t)lines * 64;
    e = e < c->end ? e : c->end;
    for (; c->line < e; c->line += 64) {
        if (l2)
            __builtin_prefetch((const void *)c->line, 0, 1);
        else
            __builtin_prefetch((const void *)c->line, 0, 3);
    }
}

static inline void attn_pf_step(attn_pf_cursor *c, int32_t lines)
{
    attn_pf_lines_hint(c, lines, false);
}

/* attn_pf_step in a kernel over rows of dtype dt: the f16 / f32 kernels
 * ask with the T2 hint (into L2, not L1), the int8 ones with T0 as above.
 * The float kernels stream twice the bytes per cell for the same
 * arithmetic, and on a Zen 4 VM T0 prefetches of the next rows held them
 * to 10.6-11.0 GB/s (AVX2, f16, 16k cells, 1 thread) against 14.2-14.9
 * with T2; the int8 kernels, held by their arithmetic, read the same with
 * T2 on AVX2 and 5-10% less on AVX-512 (docs/kernel-passes-2.md, thirteenth
 * pass). */
static inline void attn_pf_step_dt(keel_dtype dt, attn_pf_cursor *c, int32_t lines)
{
    attn_pf_lines_hint(c, lines, dt == KEEL_DTYPE_F16 || dt == KEEL_DTYPE_F32);
}

/* The bytes of rows idx[0..n) (row_bytes each, at base + idx * row_bytes)
 * when they lie close together (ascending, at most twice as far apart as
 * their count, as a block's cells usually do); scattered rows: nothing. */
static inline attn_pf attn_rows_span(const uint8_t *base, size_t row_bytes, const int32_t *idx, int32_t n)
{
    attn_pf pf = {base, 0};
    if (n <= 0 || idx[n - 1] < idx[0] || idx[n - 1] - idx[0] + 1 > 2 * n) return pf;
    pf.p = base + (size_t)idx[0] * row_bytes;
    pf.bytes = (size_t)(idx[n - 1] - idx[0] + 1) * row_bytes;
    return pf;
}

/* Rows of a p . V call that are active (the others hold -inf scores, not
 * probabilities, and are skipped). */
static inline int32_t attn_n_active(const uint8_t *active, int32_t R)
{
    int32_t n = 0;
    for (int32_t r = 0; r < R; r++) n += active[r] != 0;
    return n;
}

/* The next group of up to four active rows from *r on: their probability
 * rows (p, ATTN_CB apart) in pr and accumulators in ar; advances *r past
 * them and returns how many (0 once the rows are done). */
static inline int attn_next_group(const float *p, const uint8_t *active, float *const *acc, int32_t R, int32_t *r,
                                  const float *pr[4], float *ar[4])
{
    int nr = 0;
    for (; *r < R && nr < 4; (*r)++)
        if (active[*r]) {
            pr[nr] = p + (size_t)*r * ATTN_CB;
            ar[nr++] = acc[*r];
        }
    return nr;
}

/* x[j] <- exp(x[j] - m) for j < n (-inf -> 0); returns the sum. */
typedef float (*attn_exp_fn)(float *x, int32_t n, float m);

/* One online-softmax step of one row over a block of n <= ATTN_CB scores:
 * s[j] <- vis[j] ? s[j] * scale : -inf; when some s[j] is finite, the
 * running max *m becomes max(*m, s), *alpha = exp(m_old - m_new) (1 when
 * the max did not move or was -inf), *l <- *l * alpha + sum exp(s - m_new),
 * s[j] <- exp(s[j] - m_new), and it returns true; the caller scales the
 * row's accumulator by *alpha. Returns false (s all -inf, *m and *l kept)
 * when no cell is visible. */
typedef bool (*attn_row_fn)(float *s, int32_t n, float scale, const uint8_t *vis, float *m,
                            float *l, float *alpha);

/* The online-softmax row step with a given exp kernel: scale and mask the
 * scores, update the running max and sum, exponentiate. Inlined into the
 * scalar and AVX2 row kernels, which differ only in the exp. */
static inline bool attn_row_with(float *s, int32_t n, float scale, const uint8_t *vis, float *m,
                                 float *l, float *alpha, float (*ex)(float *, int32_t, float))
{
    float bmax = -INFINITY;
    for (int32_t j = 0; j < n; j++) {
        float v = vis[j] ? s[j] * scale : -INFINITY;
        s[j] = v;
        bmax = v > bmax ? v : bmax;
    }
    *alpha = 1.0f;
    if (bmax == -INFINITY) return false;
    float mnew = bmax > *m ? bmax : *m;
    if (*m != -INFINITY && mnew != *m) {
        *alpha = expf(*m - mnew);
        *l *= *alpha;
    }
    *m = mnew;
    *l += ex(s, n, mnew);
    return true;
}

/* Decode attention of one KV head over a list of cells, fused: the rows
 * (query heads of one token) see every listed cell. For each block of up
 * to ATTN_CB cells of idx, in order: scores s = K . q (q[r] in K's vec_dot
 * type), scaled, or capped (softcap * tanh(s * scale / softcap)) when
 * softcap > 0; then the online-softmax step of every row (m[r], l[r],
 * acc[r] scaled by exp(m_old - m_new)) and acc[r] += sum_j p_j V row j.
 * Equal to attn_kq + attn_row (all cells visible) + attn_pv per block, up
 * to float reordering. The kernel prefetches each next block's K and V
 * rows itself, and (attn_pf_far) the rows ATTN_PF_FAR blocks ahead, which
 * may lie in the caller's next call (next: its K / V bases and cells, or
 * n == 0). */
typedef struct attn_dec_next {
    const uint8_t *kbase, *vbase;
    const int32_t *idx;
    int32_t n;
} attn_dec_next;

typedef struct attn_dec {
    const uint8_t *kbase, *vbase; /* K / V rows: base + idx[j] * rb */
    size_t krb, vrb;
    const int32_t *idx;
    int32_t n;
    const void *const *q; /* [R] query rows */
    int32_t R, dk, dv;
    float scale, softcap;
    float *m, *l;      /* [R] running max and sum */
    float *const *acc; /* [R] -> dv accumulators (V storage basis) */
    attn_dec_next next; /* the cells the caller attends next (rows krb / vrb apart) */
} attn_dec;

/* The far prefetch of the AVX-512 fused decode kernel. The near one (attn_pf_step:
 * this block's V during its scores, the next block's K during p . V, into
 * L1) keeps about a block's rows in flight, and from DRAM that was not
 * enough: on a Zen 4 VM the AVX-512 kernel took 26-28 ns a cell (dim 128,
 * 4 rows, 1 thread) against 21.5 with the rows in L3. Asking also for the
 * K and V rows of the block ATTN_PF_FAR blocks ahead, into L2 (T2) and
 * spread over a block's p . V, brought it to 23.7-24.0; all at once they
 * fill the miss buffers and cost 10-50% instead (docs/kernel-passes-2.md,
 * fourteenth pass). Blocks past the call's cells are the next call's. */
#define ATTN_PF_FAR 3

typedef struct attn_pf_far {
    attn_pf_cursor k, v;
    int32_t lines; /* per step, of each */
} attn_pf_far;

/* The far cursors for the block of a that starts at cell cb, spread over
 * `steps` steps. */
static inline attn_pf_far attn_pf_far_at(const attn_dec *a, int32_t cb, int32_t steps)
{
    attn_pf_far f = {{0, 0}, {0, 0}, 0};
    int32_t fb = cb + ATTN_PF_FAR * ATTN_CB, n = a->n;
    const uint8_t *kb = a->kbase, *vb = a->vbase;
    const int32_t *idx = a->idx;
    if (fb >= n) {
        fb -= n;
        kb = a->next.kbase;
        vb = a->next.vbase;
        idx = a->next.idx;
        n = a->next.n;
        if (fb >= n || !kb || !vb || !idx) return f;
    }
    int32_t fn = n - fb < ATTN_CB ? n - fb : ATTN_CB;
    attn_pf pk = attn_rows_span(kb, a->krb, idx + fb, fn), pv = attn_rows_span(vb, a->vrb, idx + fb, fn);
    f.k = attn_pf_begin(pk);
    f.v = attn_pf_begin(pv);
    f.lines = BASE_MAX(attn_pf_lines(pk, steps), attn_pf_lines(pv, steps));
    return f;
}

static inline void attn_pf_far_step(attn_pf_far *f)
{
    attn_pf_lines_hint(&f->k, f->lines, true);
    attn_pf_lines_hint(&f->v, f->lines, true);
}

typedef void (*attn_dec_fn)(keel_dtype kt, keel_dtype vt, const attn_dec *a);

/* The near prefetches of a fused decode kernel's block of nb cells from
 * cb: the block's V rows spread over v_steps steps (the kernel asks during
 * the scores) and the next block's K rows over k_steps (during p . V).
 * Only the first quad asks (r0 == 0): the others find the rows in cache. */
typedef struct attn_dec_pf {
    attn_pf_cursor v, k;
    int32_t vl, kl; /* lines per step */
} attn_dec_pf;

static inline attn_dec_pf attn_dec_pf_block(const attn_dec *a, int32_t r0, int32_t cb, int32_t nb, int32_t v_steps,
                                            int32_t k_steps)
{
    attn_dec_pf p = {{0, 0}, {0, 0}, 0, 0};
    if (r0 != 0) return p;
    const int32_t *idx = a->idx + cb;
    attn_pf fv = attn_rows_span(a->vbase, a->vrb, idx, nb);
    p.v = attn_pf_begin(fv);
    p.vl = attn_pf_lines(fv, v_steps);
    if (cb + nb < a->n) {
        attn_pf fk = attn_rows_span(a->kbase, a->krb, idx + nb, BASE_MIN(ATTN_CB, a->n - cb - nb));
        p.k = attn_pf_begin(fk);
        p.kl = attn_pf_lines(fk, k_steps);
    }
    return p;
}

/* A quad's running max, sum and accumulators: rows r0 .. r0 + 3 of a, the
 * rows past NR repeating the last one (their lanes are computed, never
 * stored); attn_dec_quad_save stores m and l of the NR rows back. */
static inline void attn_dec_quad_load(const attn_dec *a, int32_t r0, int NR, float m[4], float l[4], float *acc[4])
{
    for (int r = 0; r < 4; r++) {
        int32_t rr = r0 + (r < NR ? r : NR - 1);
        m[r] = a->m[rr];
        l[r] = a->l[rr];
        acc[r] = a->acc[rr];
    }
}

static inline void attn_dec_quad_save(const attn_dec *a, int32_t r0, int NR, const float m[4], const float l[4])
{
    for (int r = 0; r < NR; r++) {
        a->m[r0 + r] = m[r];
        a->l[r0 + r] = l[r];
    }
}

/* An attn_dec_fn NAME that runs QUAD(KT, VT, a, r0, NR) over the quads of
 * a's rows: NR = 4, and the last quad's 1 to 3, each row count a constant
 * in a copy of its own. */
#define ATTN_DEC_QUADS(NAME, QUAD, KT, VT)                                                           \
    static void NAME(keel_dtype kt, keel_dtype vt, const attn_dec *a)                                \
    {                                                                                                \
        (void)kt;                                                                                    \
        (void)vt;                                                                                    \
        for (int32_t r0 = 0; r0 < a->R; r0 += 4) {                                                   \
            switch (BASE_MIN(4, a->R - r0)) {                                                        \
            case 4: QUAD(KT, VT, a, r0, 4); break;                                                   \
            case 3: QUAD(KT, VT, a, r0, 3); break;                                                   \
            case 2: QUAD(KT, VT, a, r0, 2); break;                                                   \
            default: QUAD(KT, VT, a, r0, 1); break;                                                  \
            }                                                                                        \
        }                                                                                            \
    }


/* Scalar kernels (attn.c): every dtype; the reference of the others. */
void attn_kq_scalar(keel_dtype kt, const uint8_t *base, size_t row_bytes, const int32_t *idx,
                    int32_t n, const void *const *q, int32_t R, int32_t dk, float *scores,
                    attn_pf pf);
void attn_pv_scalar(keel_dtype vt, const uint8_t *base, size_t row_bytes, const int32_t *idx,
                    int32_t n, const float *p, const uint8_t *active, int32_t R, int32_t dv,
                    float *const *acc, attn_pf pf);
float attn_exp_scalar(float *x, int32_t n, float m);
bool attn_row_scalar(float *s, int32_t n, float scale, const uint8_t *vis, float *m, float *l,
                     float *alpha);

/* AVX2 kernels, or NULL when the dtype has no AVX2 path (attn_avx2.c).
 * Callable only when the CPU has AVX2, FMA and F16C. */
attn_kq_fn attn_kq_avx2(keel_dtype kt);
attn_pv_fn attn_pv_avx2(keel_dtype vt);
/* The fused decode kernel for K dtype kt and V dtype vt with these dims,
 * or NULL (q8_0 / q4_0 K and V, dims multiples of 32 up to 512; f16 / f32
 * K and V, dk a multiple of 8 and dv of 16). */
attn_dec_fn attn_dec_avx2(keel_dtype kt, keel_dtype vt, int32_t dk, int32_t dv);
float attn_exp_avx2(float *x, int32_t n, float m);
bool attn_row_avx2(float *s, int32_t n, float scale, const uint8_t *vis, float *m, float *l,
                   float *alpha);

/* AVX-512 kernels, or NULL when the dtype has no AVX-512 path
 * (attn_avx512.c). Callable only when attn_path_best() is ATTN_PATH_AVX512; shapes they do
 * not cover fall back to the AVX2 kernels inside. */
attn_kq_fn attn_kq_avx512(keel_dtype kt);
attn_pv_fn attn_pv_avx512(keel_dtype vt);
float attn_exp_avx512(float *x, int32_t n, float m);
bool attn_row_avx512(float *s, int32_t n, float scale, const uint8_t *vis, float *m, float *l,
                     float *alpha);
/* The fused decode kernel of the AVX-512 path, or NULL (q8_0 K and V, dims
 * multiples of 32 up to 512; f16 / f32 K and V, dk a multiple of 16 and dv
 * of 64; the rest runs the separate kernels). */
attn_dec_fn attn_dec_avx512(keel_dtype kt, keel_dtype vt, int32_t dk, int32_t dv);

/* The kernel paths of attention, fastest last. */
typedef enum attn_path { ATTN_PATH_SCALAR, ATTN_PATH_AVX2, ATTN_PATH_AVX512 } attn_path;

/* The best path this CPU supports (ignores the forced level). */
attn_path attn_path_best(void);
/* The path attention runs now: the SIMD level in force (tensor_simd_level:
 * KEEL_SIMD, keel_set_simd, tensor_simd_force). */
attn_path attn_path_active(void);

typedef struct attn_kernel_set {
    attn_kq_fn kq;
    attn_pv_fn pv;
    attn_exp_fn ex;
    attn_row_fn row;
    attn_dec_fn dec; /* fused decode (one token per block), or NULL */
} attn_kernel_set;

/* The kernels of path for K dtype kt and V dtype vt (head dims dk, dv);
 * dtypes the path does not cover get the scalar kernels (and no dec).
 * path must be <= attn_path_best(). */
attn_kernel_set attn_kernels(attn_path path, keel_dtype kt, keel_dtype vt, int32_t dk, int32_t dv);

#endif
