/*
 * dot_avx2.c — AVX2/FMA dot products for every weight dtype against its
 * vec_dot type, axpy_row, and the f32 helpers.
 *
 * Quantized dots multiply bytes with maddubs (u8 x s8 -> pairs of i16),
 * widen with madd, and scale each block's integer sum in f32: the integer
 * part equals the scalar path's exactly; only the float accumulation order
 * differs. maddubs cannot saturate here: |pair| <= 2 * 127 * 128.
 */
#include "avx2_util.h"

/* ---- f32 helpers ----------------------------------------------------------------- */

/* 8 floats from any byte address. */
static inline __m256 loadu_f32x8(const uint8_t *p)
{
    return _mm256_loadu_ps((const float *)(const void *)p);
}

/* Weight rows reach these helpers too (dot_f32, axpy_f32), and a GGUF
 * buffer may sit at any byte address: the operands are walked as bytes,
 * vector loads are unaligned and the scalar tails load with memcpy, so no
 * float is ever read through a misaligned float pointer (UB, and a fault
 * once the compiler vectorizes with aligned loads). */
static float dot_f32_bytes(const uint8_t *pa, const uint8_t *pb, int64_t n)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const uint8_t *qa = pa + 4 * i, *qb = pb + 4 * i;
        s0 = _mm256_fmadd_ps(loadu_f32x8(qa), loadu_f32x8(qb), s0);
        s1 = _mm256_fmadd_ps(loadu_f32x8(qa + 32), loadu_f32x8(qb + 32), s1);
        s2 = _mm256_fmadd_ps(loadu_f32x8(qa + 64), loadu_f32x8(qb + 64), s2);
        s3 = _mm256_fmadd_ps(loadu_f32x8(qa + 96), loadu_f32x8(qb + 96), s3);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(loadu_f32x8(pa + 4 * i), loadu_f32x8(pb + 4 * i), s0);
    float s = hsum_ps(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; i++)
        s += rd_f32(pa + 4 * i) * rd_f32(pb + 4 * i);
    return s;
}

static void axpy_f32_bytes(float *y, float a, const uint8_t *px, int64_t n)
{
    __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i,
                         _mm256_fmadd_ps(va, loadu_f32x8(px + 4 * i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++)
        y[i] += a * rd_f32(px + 4 * i);
}

float tensor_dot_f32_avx2(const float *a, const float *b, int64_t n)
{
    return dot_f32_bytes((const uint8_t *)a, (const uint8_t *)b, n);
}

float tensor_sumsq_f32_avx2(const float *x, int64_t n)
{
    return tensor_dot_f32_avx2(x, x, n);
}

void tensor_axpy_f32_avx2(float *y, float a, const float *x, int64_t n)
{
    axpy_f32_bytes(y, a, (const uint8_t *)x, n);
}

void tensor_scale_f32_avx2(float *y, float a, int64_t n)
{
    __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(y + i), va));
    for (; i < n; i++)
        y[i] *= a;
}

void tensor_add_f32_avx2(float *y, const float *x, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_loadu_ps(x + i)));
    for (; i < n; i++)
        y[i] += x[i];
}

void tensor_mul_f32_avx2(float *y, const float *x, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(y + i), _mm256_loadu_ps(x + i)));
    for (; i < n; i++)
        y[i] *= x[i];
}

/* ---- float-weight dots ------------------------------------------------------------ */

static float dot_f32(int64_t n, const void *w, const void *x)
{
    return dot_f32_bytes(w, x, n);
}

static inline __m256 load_f16x8(const uint8_t *p)
{
    return _mm256_cvtph_ps(loadu_128(p));
}

static inline __m256 load_bf16x8(const uint8_t *p)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(loadu_128(p)), 16));
}

static float dot_f16(int64_t n, const void *w, const void *x)
{
    const uint8_t *p = w;
    const float *xf = x;
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(load_f16x8(p + 2 * i), _mm256_loadu_ps(xf + i), s0);
        s1 = _mm256_fmadd_ps(load_f16x8(p + 2 * i + 16), _mm256_loadu_ps(xf + i + 8), s1);
        s2 = _mm256_fmadd_ps(load_f16x8(p + 2 * i + 32), _mm256_loadu_ps(xf + i + 16), s2);
        s3 = _mm256_fmadd_ps(load_f16x8(p + 2 * i + 48), _mm256_loadu_ps(xf + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(load_f16x8(p + 2 * i), _mm256_loadu_ps(xf + i), s0);
    float s = hsum_ps(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; i++)
        s += tensor_f16_to_f32(rd_u16(p + 2 * i)) * xf[i];
    return s;
}

static float dot_bf16(int64_t n, const void *w, const void *x)
{
    const uint8_t *p = w;
    const float *xf = x;
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(load_bf16x8(p + 2 * i), _mm256_loadu_ps(xf + i), s0);
        s1 = _mm256_fmadd_ps(load_bf16x8(p + 2 * i + 16), _mm256_loadu_ps(xf + i + 8), s1);
        s2 = _mm256_fmadd_ps(load_bf16x8(p + 2 * i + 32), _mm256_loadu_ps(xf + i + 16), s2);
        s3 = _mm256_fmadd_ps(load_bf16x8(p + 2 * i + 48), _mm256_loadu_ps(xf + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(load_bf16x8(p + 2 * i), _mm256_loadu_ps(xf + i), s0);
    float s = hsum_ps(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; i++)
        s += tensor_bf16_to_f32(rd_u16(p + 2 * i)) * xf[i];
    return s;
}

/* ---- legacy quant dots ------------------------------------------------------------ */

static inline __m256i q8_0_values(const uint8_t *b)
{
    return loadu_256(b + 2);
}

/* Symmetric formats against q8_0: sum_blocks d_w d_x (q_w . q_x). Four
 * independent accumulators, since a single FMA chain would limit the dot
 * to one block per FMA latency. */
#define DOT_SYM(NAME, WBYTES, VALUES)                                                              \
    static float NAME(int64_t n, const void *w, const void *x)                                     \
    {                                                                                              \
        const uint8_t *b = w, *xb = x;                                                             \
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),            \
                         _mm256_setzero_ps()};                                                     \
        int64_t nb = n / QK, i = 0;                                                                \
        for (; i + 4 <= nb; i += 4, b += 4 * (WBYTES), xb += 4 * Q8_0_BYTES) {                     \
            _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++)                                    \
            {                                                                                      \
                const uint8_t *bk = b + k * (WBYTES), *xk = xb + k * Q8_0_BYTES;                   \
                __m256i p = dot_ss8_i32(VALUES(bk), loadu_256(xk + 2));                            \
                acc[k] = _mm256_fmadd_ps(_mm256_set1_ps(f16_load(bk) * f16_load(xk)),              \
                                         _mm256_cvtepi32_ps(p), acc[k]);                           \
            }                                                                                      \
        }                                                                                          \
        for (; i < nb; i++, b += (WBYTES), xb += Q8_0_BYTES) {                                     \
            __m256i p = dot_ss8_i32(VALUES(b), loadu_256(xb + 2));                                 \
            acc[0] = _mm256_fmadd_ps(_mm256_set1_ps(f16_load(b) * f16_load(xb)),                   \
                                     _mm256_cvtepi32_ps(p), acc[0]);                               \
        }                                                                                          \
        return hsum_ps(                                                                            \
            _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));          \
    }

DOT_SYM(dot_q8_0, Q8_0_BYTES, q8_0_values)
DOT_SYM(dot_q4_0, Q4_0_BYTES, q4_0_values)
DOT_SYM(dot_q5_0, Q5_0_BYTES, q5_0_values)

/* Formats with a min against q8_1: d_w d_x (q_w . q_x) + m_w d_x sum(q_x),
 * the activation sum taken exactly from its quants (not the f16 s). */
#define DOT_ASYM(NAME, WBYTES, VALUES)                                                             \
    static float NAME(int64_t n, const void *w, const void *x)                                     \
    {                                                                                              \
        const uint8_t *b = w, *xb = x;                                                             \
        const __m256i ones = _mm256_set1_epi8(1);                                                  \
        __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};                                \
        __m256 accm[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};                               \
        int64_t nb = n / QK, i = 0;                                                                \
        for (; i + 2 <= nb; i += 2, b += 2 * (WBYTES), xb += 2 * Q8_1_BYTES) {                     \
            _Pragma("GCC unroll 2") for (int k = 0; k < 2; k++)                                    \
            {                                                                                      \
                const uint8_t *bk = b + k * (WBYTES), *xk = xb + k * Q8_1_BYTES;                   \
                __m256i xq = loadu_256(xk + 4);                                                    \
                __m256i p = dot_us8_i32(VALUES(bk), xq), sx = dot_us8_i32(ones, xq);               \
                float dx = f16_load(xk);                                                           \
                acc[k] = _mm256_fmadd_ps(_mm256_set1_ps(f16_load(bk) * dx), _mm256_cvtepi32_ps(p), \
                                         acc[k]);                                                  \
                accm[k] = _mm256_fmadd_ps(_mm256_set1_ps(f16_load(bk + 2) * dx),                   \
                                          _mm256_cvtepi32_ps(sx), accm[k]);                        \
            }                                                                                      \
        }                                                                                          \
        for (; i < nb; i++, b += (WBYTES), xb += Q8_1_BYTES) {                                     \
            __m256i xq = loadu_256(xb + 4);                                                        \
            __m256i p = dot_us8_i32(VALUES(b), xq), sx = dot_us8_i32(ones, xq);                    \
            float dx = f16_load(xb);                                                               \
            acc[0] =                                                                               \
                _mm256_fmadd_ps(_mm256_set1_ps(f16_load(b) * dx), _mm256_cvtepi32_ps(p), acc[0]);  \
            accm[0] = _mm256_fmadd_ps(_mm256_set1_ps(f16_load(b + 2) * dx),                        \
                                      _mm256_cvtepi32_ps(sx), accm[0]);                            \
        }                                                                                          \
        return hsum_ps(                                                                            \
            _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(accm[0], accm[1])));        \
    }

DOT_ASYM(dot_q4_1, Q4_1_BYTES, q4_1_values)
DOT_ASYM(dot_q5_1, Q5_1_BYTES, q5_1_values)

/* ---- K-quant dots ----------------------------------------------------------------- */

/* Per super-block: sum over sub-blocks of scale_j * (q . x) as 8 x i32, with
 * the mins term mins . (bsum pairs) as 4 x i32 in *min_out. */
#define KQ_SUBBLOCK_PAIR(c, lo, hi)                                                                \
    do {                                                                                           \
        __m256i p0 = _mm256_maddubs_epi16(lo, loadu_256(xq + 64 * (c)));                           \
        __m256i p1 = _mm256_maddubs_epi16(hi, loadu_256(xq + 64 * (c) + 32));                      \
        p0 = _mm256_madd_epi16(p0, _mm256_shuffle_epi8(sc, bcast16_ctrl(2 * (c))));                \
        p1 = _mm256_madd_epi16(p1, _mm256_shuffle_epi8(sc, bcast16_ctrl(2 * (c) + 1)));            \
        sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));                                   \
    } while (0)

static inline __m128i kq_min_prod(__m256i sm16, const uint8_t *xb)
{
    __m256i bs = loadu_256(xb + Q8_K_BSUMS);
    __m128i pairs = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
    return _mm_madd_epi16(_mm256_extracti128_si256(sm16, 1), pairs);
}

static float dot_q4_K(int64_t n, const void *w, const void *x)
{
    const uint8_t *b = w, *xb = x;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 acc = _mm256_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++, b += Q4_K_BYTES, xb += Q8_K_BYTES) {
        float dx = rd_f32(xb);
        __m256i sm16 = kq_scales_mins_epi16(b + 4);
        __m256i sc = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(sm16));
        accm = _mm_fmadd_ps(_mm_set1_ps(dx * f16_load(b + 2)),
                            _mm_cvtepi32_ps(kq_min_prod(sm16, xb)), accm);
        const uint8_t *xq = xb + Q8_K_QS, *qs = b + 16;
        __m256i sumi = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            __m256i q = loadu_256(qs + 32 * c);
            __m256i lo = _mm256_and_si256(q, m4),
                    hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            KQ_SUBBLOCK_PAIR(c, lo, hi);
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dx * f16_load(b)), _mm256_cvtepi32_ps(sumi), acc);
    }
    __m128 m = _mm_add_ps(accm, _mm_movehl_ps(accm, accm));
    m = _mm_add_ss(m, _mm_movehdup_ps(m));
    return hsum_ps(acc) - _mm_cvtss_f32(m);
}

static float dot_q5_K(int64_t n, const void *w, const void *x)
{
    const uint8_t *b = w, *xb = x;
    const __m256i m4 = _mm256_set1_epi8(0x0F), b16 = _mm256_set1_epi8(0x10);
    __m256 acc = _mm256_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++, b += Q5_K_BYTES, xb += Q8_K_BYTES) {
        float dx = rd_f32(xb);
        __m256i sm16 = kq_scales_mins_epi16(b + 4);
        __m256i sc = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(sm16));
        accm = _mm_fmadd_ps(_mm_set1_ps(dx * f16_load(b + 2)),
                            _mm_cvtepi32_ps(kq_min_prod(sm16, xb)), accm);
        const uint8_t *xq = xb + Q8_K_QS, *qs = b + 48;
        __m256i hb = loadu_256(b + 16);
        __m256i sumi = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            __m256i q = loadu_256(qs + 32 * c);
            /* bit 2c of qh -> 0x10 for the low half, bit 2c+1 for the high half */
            __m256i h0 = _mm256_and_si256(_mm256_slli_epi16(hb, 4), b16);
            __m256i h1 = _mm256_and_si256(_mm256_slli_epi16(hb, 3), b16);
            hb = _mm256_srli_epi16(hb, 2);
            __m256i lo = _mm256_or_si256(_mm256_and_si256(q, m4), h0);
            __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), h1);
            KQ_SUBBLOCK_PAIR(c, lo, hi);
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dx * f16_load(b)), _mm256_cvtepi32_ps(sumi), acc);
    }
    __m128 m = _mm_add_ps(accm, _mm_movehl_ps(accm, accm));
    m = _mm_add_ss(m, _mm_movehdup_ps(m));
    return hsum_ps(acc) - _mm_cvtss_f32(m);
}

static float dot_q6_K(int64_t n, const void *w, const void *x)
{
    const uint8_t *b = w, *xb = x;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++, b += Q6_K_BYTES, xb += Q8_K_BYTES)
        acc = _mm256_fmadd_ps(_mm256_set1_ps(rd_f32(xb) * f16_load(b + 208)),
                              _mm256_cvtepi32_ps(q6_K_block_sumi(b, xb)), acc);
    return hsum_ps(acc);
}

/* 16 signed int8 scales -> int16 with the even sub-blocks in the low lane
 * and the odd ones in the high lane (see dot_q6_K). */
static inline __m256i scales_even_odd_epi16(__m128i sc8)
{
    const __m128i even_odd = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    return _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, even_odd));
}

/* q2_K: element e = 128n + 32j + l is bits 2j of qs[32n + l]; sub-block
 * e/16 has scale (low nibble) and min (high nibble) in scales[e/16]. */
static float dot_q2_K(int64_t n, const void *w, const void *x)
{
    const uint8_t *b = w, *xb = x;
    const __m256i m2 = _mm256_set1_epi8(3);
    const __m128i m4 = _mm_set1_epi8(0x0F);
    __m256 acc = _mm256_setzero_ps();
    float accm = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++, b += Q2_K_BYTES, xb += Q8_K_BYTES) {
        float dx = rd_f32(xb);
        const uint8_t *xq = xb + Q8_K_QS;
        __m128i sm = loadu_128(b);
        __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sm, 4), m4));
        int summ = hsum_epi32(_mm256_madd_epi16(loadu_256(xb + Q8_K_BSUMS), mins));
        __m256i sc = scales_even_odd_epi16(_mm_and_si128(sm, m4));
        __m256i sumi = _mm256_setzero_si256();
#pragma GCC unroll 2
        for (int nh = 0; nh < 2; nh++) {
            __m256i q = loadu_256(b + 16 + 32 * nh);
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                __m256i v = _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), m2);
                __m256i p = _mm256_maddubs_epi16(v, loadu_256(xq + 128 * nh + 32 * j));
                sumi = _mm256_add_epi32(
                    sumi, _mm256_madd_epi16(p, _mm256_shuffle_epi8(sc, bcast16_ctrl(4 * nh + j))));
            }
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dx * f16_load(b + 80)), _mm256_cvtepi32_ps(sumi), acc);
        accm += dx * f16_load(b + 82) * (float)summ;
    }
    return hsum_ps(acc) - accm;
}

/* q3_K: as q2_K's 2-bit values plus a high bit from hmask[l] (bit 4n + j);
 * value = q2 + 4*hbit - 4, scales 6-bit biased by 32 (see q3k_scale). The
 * -4 is folded in through bsums, as q6_K's -32. */
static float dot_q3_K(int64_t n, const void *w, const void *x)
{
    const uint8_t *b = w, *xb = x;
    const __m256i m2 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    const uint32_t k4 = 0x0f0f0f0f, k2 = 0x03030303;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++, b += Q3_K_BYTES, xb += Q8_K_BYTES) {
        const uint8_t *xq = xb + Q8_K_QS;
        uint32_t w0 = rd_u32(b + 96), w1 = rd_u32(b + 100), w2 = rd_u32(b + 104);
        __m128i s6 = _mm_setr_epi32((int)((w0 & k4) | (((w2 >> 0) & k2) << 4)),
                                    (int)((w1 & k4) | (((w2 >> 2) & k2) << 4)),
                                    (int)(((w0 >> 4) & k4) | (((w2 >> 4) & k2) << 4)),
                                    (int)(((w1 >> 4) & k4) | (((w2 >> 6) & k2) << 4)));
        __m128i sc8 = _mm_sub_epi8(s6, _mm_set1_epi8(32));
        __m256i off = _mm256_madd_epi16(loadu_256(xb + Q8_K_BSUMS), _mm256_cvtepi8_epi16(sc8));
        __m256i sc = scales_even_odd_epi16(sc8);
        __m256i hm = loadu_256(b);
        __m256i sumi = _mm256_setzero_si256();
#pragma GCC unroll 2
        for (int nh = 0; nh < 2; nh++) {
            __m256i q = loadu_256(b + 32 + 32 * nh);
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                __m256i h = _mm256_and_si256(_mm256_srli_epi16(hm, 4 * nh + j), one);
                __m256i v = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 2 * j), m2),
                                            _mm256_slli_epi16(h, 2));
                __m256i p = _mm256_maddubs_epi16(v, loadu_256(xq + 128 * nh + 32 * j));
                sumi = _mm256_add_epi32(
                    sumi, _mm256_madd_epi16(p, _mm256_shuffle_epi8(sc, bcast16_ctrl(4 * nh + j))));
            }
        }
        sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(off, 2));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(rd_f32(xb) * f16_load(b + 108)),
                              _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum_ps(acc);
}

const tensor_dot_fn tensor_dot_avx2_[KEEL_DTYPE_COUNT_] = {
    [KEEL_DTYPE_F32] = dot_f32,   [KEEL_DTYPE_F16] = dot_f16,   [KEEL_DTYPE_BF16] = dot_bf16,
    [KEEL_DTYPE_Q8_0] = dot_q8_0, [KEEL_DTYPE_Q4_0] = dot_q4_0, [KEEL_DTYPE_Q5_0] = dot_q5_0,
    [KEEL_DTYPE_Q4_1] = dot_q4_1, [KEEL_DTYPE_Q5_1] = dot_q5_1, [KEEL_DTYPE_Q4_K] = dot_q4_K,
    [KEEL_DTYPE_Q5_K] = dot_q5_K, [KEEL_DTYPE_Q6_K] = dot_q6_K, [KEEL_DTYPE_Q2_K] = dot_q2_K,
    [KEEL_DTYPE_Q3_K] = dot_q3_K,
};

/* ---- axpy_row ------------------------------------------------------------------------ */

static void axpy_f32(int64_t n, float a, const void *row, float *y)
{
    axpy_f32_bytes(y, a, row, n);
}

static void axpy_f16(int64_t n, float a, const void *row, float *y)
{
    const uint8_t *p = row;
    __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, load_f16x8(p + 2 * i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++)
        y[i] += a * tensor_f16_to_f32(rd_u16(p + 2 * i));
}

static void axpy_bf16(int64_t n, float a, const void *row, float *y)
{
    const uint8_t *p = row;
    __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i,
                         _mm256_fmadd_ps(va, load_bf16x8(p + 2 * i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++)
        y[i] += a * tensor_bf16_to_f32(rd_u16(p + 2 * i));
}

static void axpy_q8_0(int64_t n, float a, const void *row, float *y)
{
    const uint8_t *b = row;
    const __m256 z = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK; i++, b += Q8_0_BYTES, y += QK)
        axpy_i8x32(y, loadu_256(b + 2), _mm256_set1_ps(a * f16_load(b)), z);
}

static void axpy_q4_0(int64_t n, float a, const void *row, float *y)
{
    const uint8_t *b = row;
    const __m256 z = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK; i++, b += Q4_0_BYTES, y += QK)
        axpy_i8x32(y, q4_0_values(b), _mm256_set1_ps(a * f16_load(b)), z);
}

static void axpy_q5_0(int64_t n, float a, const void *row, float *y)
{
    const uint8_t *b = row;
    const __m256 z = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK; i++, b += Q5_0_BYTES, y += QK)
        axpy_i8x32(y, q5_0_values(b), _mm256_set1_ps(a * f16_load(b)), z);
}

static void axpy_q4_1(int64_t n, float a, const void *row, float *y)
{
    const uint8_t *b = row;
    for (int64_t i = 0; i < n / QK; i++, b += Q4_1_BYTES, y += QK)
        axpy_i8x32(y, q4_1_values(b), _mm256_set1_ps(a * f16_load(b)),
                   _mm256_set1_ps(a * f16_load(b + 2)));
}

static void axpy_q5_1(int64_t n, float a, const void *row, float *y)
{
    const uint8_t *b = row;
    for (int64_t i = 0; i < n / QK; i++, b += Q5_1_BYTES, y += QK)
        axpy_i8x32(y, q5_1_values(b), _mm256_set1_ps(a * f16_load(b)),
                   _mm256_set1_ps(a * f16_load(b + 2)));
}

/* K-quants and the rest: dequantize a super-block on the stack, then axpy. */
static void axpy_blocked(keel_dtype t, int64_t n, float a, const void *row, float *y)
{
    tensor_dequant_fn deq =
        tensor_dequant_avx2_[t] ? tensor_dequant_avx2_[t] : tensor_dequant_scalar_[t];
    size_t bb = keel_dtype_block_bytes(t);
    float tmp[QK_K];
    const uint8_t *p = row;
    for (int64_t i = 0; i < n; i += QK_K, p += bb) {
        deq(p, tmp, QK_K);
        __m256 va = _mm256_set1_ps(a);
        for (int k = 0; k < QK_K; k += 8)
            _mm256_storeu_ps(y + i + k, _mm256_fmadd_ps(va, _mm256_loadu_ps(tmp + k),
                                                        _mm256_loadu_ps(y + i + k)));
    }
}

static void axpy_q2_K(int64_t n, float a, const void *row, float *y)
{
    axpy_blocked(KEEL_DTYPE_Q2_K, n, a, row, y);
}
static void axpy_q3_K(int64_t n, float a, const void *row, float *y)
{
    axpy_blocked(KEEL_DTYPE_Q3_K, n, a, row, y);
}
static void axpy_q4_K(int64_t n, float a, const void *row, float *y)
{
    axpy_blocked(KEEL_DTYPE_Q4_K, n, a, row, y);
}
static void axpy_q5_K(int64_t n, float a, const void *row, float *y)
{
    axpy_blocked(KEEL_DTYPE_Q5_K, n, a, row, y);
}
static void axpy_q6_K(int64_t n, float a, const void *row, float *y)
{
    axpy_blocked(KEEL_DTYPE_Q6_K, n, a, row, y);
}
static void axpy_q8_K(int64_t n, float a, const void *row, float *y)
{
    axpy_blocked(KEEL_DTYPE_Q8_K, n, a, row, y);
}

const tensor_axpy_fn tensor_axpy_avx2_[KEEL_DTYPE_COUNT_] = {
    [KEEL_DTYPE_F32] = axpy_f32,   [KEEL_DTYPE_F16] = axpy_f16,   [KEEL_DTYPE_BF16] = axpy_bf16,
    [KEEL_DTYPE_Q8_0] = axpy_q8_0, [KEEL_DTYPE_Q4_0] = axpy_q4_0, [KEEL_DTYPE_Q5_0] = axpy_q5_0,
    [KEEL_DTYPE_Q4_1] = axpy_q4_1, [KEEL_DTYPE_Q5_1] = axpy_q5_1, [KEEL_DTYPE_Q2_K] = axpy_q2_K,
    [KEEL_DTYPE_Q3_K] = axpy_q3_K, [KEEL_DTYPE_Q4_K] = axpy_q4_K, [KEEL_DTYPE_Q5_K] = axpy_q5_K,
    [KEEL_DTYPE_Q6_K] = axpy_q6_K, [KEEL_DTYPE_Q8_K] = axpy_q8_K,
};
