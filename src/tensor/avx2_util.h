/*
 * avx2_util.h — inline AVX2 helpers shared by the *_avx2.c files (and only
 * them: everything here needs -mavx2 -mfma -mf16c). All loads are
 * unaligned (loadu / memcpy), as rows may start at any byte. The
 * register-only ones (horizontal sums, hadd2_*) are in simd_avx2.h.
 */
#ifndef KEEL_TENSOR_AVX2_UTIL_H
#define KEEL_TENSOR_AVX2_UTIL_H

#include "simd_avx2.h"
#include "tensor_impl.h"

#include <immintrin.h>

/* ---- the matvec kernels' row stream (matvec_avx2.c, matvec_batch*.c) -------------- */

#define MV_PF 3072 /* prefetch distance in bytes (1024-4096 swept on an Intel VM: 3072 best with 2 threads) */

/* Asks for the `lines` lines from cur + MV_PF on (mv_pf_at: from the
 * address a, kept in integer arithmetic as it may lie past the object),
 * clamped to last, the range's last byte: a repeated request for it costs
 * a load slot, no traffic. __builtin_prefetch, not _mm_prefetch: gcc 12 at
 * -O2 dropped the latter inside the always_inline kernels (no prefetch
 * left in the code). */
static inline void mv_pf_at(uintptr_t a, uintptr_t last, int lines)
{
    for (int k = 0; k < lines; k++, a += 64) __builtin_prefetch((const void *)(a < last ? a : last), 0, 3);
}

static inline void mv_pf(const uint8_t *cur, uintptr_t last, int lines)
{
    mv_pf_at((uintptr_t)cur + MV_PF, last, lines);
}

/* Eight f16 values at p, p + stride, ... as f32: gathered through a small
 * array (combined in general registers, gcc turned the shifts and ors into
 * a chain of shuffles on the port the kernels' other shuffles need). */
static inline __m256 f16x8_strided(const uint8_t *p, size_t stride)
{
    _Alignas(16) uint16_t h[8];
    for (int k = 0; k < 8; k++) h[k] = rd_u16(p + (size_t)k * stride);
    return _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(const void *)h));
}

static inline __m256 abs_ps(__m256 v)
{
    return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v);
}

static inline float f16_load(const uint8_t *p)
{
    return _cvtsh_ss(rd_u16(p));
}

static inline __m256i loadu_256(const void *p)
{
    return _mm256_loadu_si256((const __m256i *)p);
}

static inline __m128i loadu_128(const void *p)
{
    return _mm_loadu_si128((const __m128i *)p);
}

/* 16 bytes of packed nibbles -> 32 bytes: low nibbles (elements 0..15),
 * then high nibbles (16..31), each 0..15. */
static inline __m256i unpack_nibbles_16(const uint8_t *p)
{
    __m128i b = loadu_128(p);
    __m256i v = _mm256_set_m128i(_mm_srli_epi16(b, 4), b);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}

/* 32 bits -> 32 bytes, 0xFF where bit j is set. */
static inline __m256i bytes_from_bits_32(uint32_t bits)
{
    const __m256i shuf = _mm256_setr_epi64x(0x0000000000000000LL, 0x0101010101010101LL,
                                            0x0202020202020202LL, 0x0303030303030303LL);
    const __m256i mask = _mm256_set1_epi64x(0x8040201008040201LL);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), shuf);
    v = _mm256_and_si256(v, mask);
    return _mm256_cmpeq_epi8(v, mask);
}

/* Sum over pairs of u8 x s8 products, widened to 8 x i32. */
static inline __m256i dot_us8_i32(__m256i u, __m256i s)
{
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

/* Same for s8 x s8 (|x| <= 127 in at least one operand's role as |x|). */
static inline __m256i dot_ss8_i32(__m256i x, __m256i y)
{
    return dot_us8_i32(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}

/* y[0..32) = q[k] * d + m for 32 signed bytes q. */
static inline void store_i8x32(float *y, __m256i q, __m256 d, __m256 m)
{
    __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    __m256 f0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
    __m256 f1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
    __m256 f2 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
    __m256 f3 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
    _mm256_storeu_ps(y, _mm256_fmadd_ps(f0, d, m));
    _mm256_storeu_ps(y + 8, _mm256_fmadd_ps(f1, d, m));
    _mm256_storeu_ps(y + 16, _mm256_fmadd_ps(f2, d, m));
    _mm256_storeu_ps(y + 24, _mm256_fmadd_ps(f3, d, m));
}

/* y[0..32) += a * (q[k] * d + m): the axpy form. */
static inline void axpy_i8x32(float *y, __m256i q, __m256 ad, __m256 am)
{
    __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    __m256 f0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
    __m256 f1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
    __m256 f2 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
    __m256 f3 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
    _mm256_storeu_ps(y, _mm256_add_ps(_mm256_loadu_ps(y), _mm256_fmadd_ps(f0, ad, am)));
    _mm256_storeu_ps(y + 8, _mm256_add_ps(_mm256_loadu_ps(y + 8), _mm256_fmadd_ps(f1, ad, am)));
    _mm256_storeu_ps(y + 16, _mm256_add_ps(_mm256_loadu_ps(y + 16), _mm256_fmadd_ps(f2, ad, am)));
    _mm256_storeu_ps(y + 24, _mm256_add_ps(_mm256_loadu_ps(y + 24), _mm256_fmadd_ps(f3, ad, am)));
}

/* The integer values of one legacy block as 32 signed bytes. */
static inline __m256i q8_0_block_values(const uint8_t *b)
{
    return loadu_256(b + 2);
}
static inline __m256i q4_0_values(const uint8_t *b)
{
    return _mm256_sub_epi8(unpack_nibbles_16(b + 2), _mm256_set1_epi8(8));
}
static inline __m256i q4_1_values(const uint8_t *b)
{
    return unpack_nibbles_16(b + 4);
}
static inline __m256i q5_0_values(const uint8_t *b)
{
    /* nibble | 0xF0 where the high bit is clear == nibble - 16 as int8 */
    __m256i hi =
        _mm256_andnot_si256(bytes_from_bits_32(rd_u32(b + 2)), _mm256_set1_epi8((char)0xF0));
    return _mm256_or_si256(unpack_nibbles_16(b + 6), hi);
}
static inline __m256i q5_1_values(const uint8_t *b)
{
    __m256i hi = _mm256_and_si256(bytes_from_bits_32(rd_u32(b + 4)), _mm256_set1_epi8(0x10));
    return _mm256_or_si256(unpack_nibbles_16(b + 8), hi);
}

/* The unsigned 6-bit values (0..63, before the -32 offset) of half nh of a
 * q6_K block: q[k] holds values 128 nh + 32 k .. + 31. The two high bits
 * of value k sit at bits 2k, 2k + 1 of its qh byte and go to bits 4-5:
 * one shift (or none) and one mask each, 16-bit shifts being safe since
 * the mask keeps only bits that come from the same byte. */
static inline void q6_K_values(const uint8_t *b, int nh, __m256i q[4])
{
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    __m256i ql0 = loadu_256(b + 64 * nh), ql1 = loadu_256(b + 64 * nh + 32);
    __m256i qh = loadu_256(b + 128 + 32 * nh);
    q[0] = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
    q[1] = _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
    q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), _mm256_and_si256(qh, m30));
    q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                           _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
}

/* The 12-byte scale fields of q4_K / q5_K at qa and qb (16 bytes readable
 * at each) as 16 u8 per lane (lane 0 from qa, lane 1 from qb): scales 0-7,
 * then mins 0-7 (kq_scale_min's bit layout): bytes 0-3 hold scales 0-3
 * (low 6 bits) and the top bits of scales 4-7, bytes 4-7 the same for the
 * mins, bytes 8-11 the low nibbles of scales 4-7 and (high nibbles) of
 * mins 4-7. Two in-lane shuffles put each value's sources in its byte;
 * masks and shifts do the rest, no scalar work. */
static inline __m256i kq_scales_mins_u8x2(const uint8_t *qa, const uint8_t *qb)
{
    const char z = (char)0x80;
    __m256i v = _mm256_loadu2_m128i((const __m128i *)qb, (const __m128i *)qa);
    /* low-bit sources: sc0-3 <- q0-3, sc4-7 <- q8-11, mn0-3 <- q4-7, mn4-7 <- q8-11 */
    __m256i a = _mm256_shuffle_epi8(v, _mm256_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11, 0, 1, 2,
                                                        3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
    /* high-bit sources: sc4-7 <- top bits of q0-3, mn4-7 <- top bits of q4-7 */
    __m256i h = _mm256_shuffle_epi8(v, _mm256_setr_epi8(z, z, z, z, 0, 1, 2, 3, z, z, z, z, 4, 5, 6, 7, z, z, z, z, 0,
                                                        1, 2, 3, z, z, z, z, 4, 5, 6, 7));
    __m256i lo = _mm256_and_si256(a, _mm256_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0, 63,
                                                      63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0));
    __m256i ln = _mm256_and_si256(_mm256_srli_epi16(a, 4), _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15,
                                                                            15, 15, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                                                            15, 15, 15, 15));
    __m256i hb = _mm256_and_si256(_mm256_srli_epi16(h, 2), _mm256_set1_epi8(0x30)); /* (b >> 6) << 4 */
    return _mm256_or_si256(_mm256_or_si256(lo, ln), hb);
}

/* The 12-byte scale field of q4_K/q5_K as 16 int16: 8 scales, 8 mins.
 * Bit form of kq_scale_min: words w0..w2 hold bytes 0-3, 4-7, 8-11. The
 * matvec rows decode two fields at once with shuffles instead
 * (kq_scales_mins_u8x2, above); for the dot's one field this
 * scalar form measured faster (keel bench kernels --simd avx2, q4_K
 * dot_tiles at 16 tokens: 140.7-144.8 GFLOP/s against 134.4-140.0 with
 * the shuffles), its bit work running beside the vector ports. */
static inline __m256i kq_scales_mins_epi16(const uint8_t *q)
{
    const uint32_t m6 = 0x3f3f3f3f, m4 = 0x0f0f0f0f, m2 = 0x03030303;
    uint32_t w0 = rd_u32(q), w1 = rd_u32(q + 4), w2 = rd_u32(q + 8);
    uint32_t sc_lo = w0 & m6;                                    /* scales 0-3 */
    uint32_t sc_hi = (w2 & m4) | (((w0 >> 6) & m2) << 4);        /* scales 4-7 */
    uint32_t mn_lo = w1 & m6;                                    /* mins 0-3 */
    uint32_t mn_hi = ((w2 >> 4) & m4) | (((w1 >> 6) & m2) << 4); /* mins 4-7 */
    __m128i b = _mm_setr_epi32((int)sc_lo, (int)sc_hi, (int)mn_lo, (int)mn_hi);
    return _mm256_cvtepu8_epi16(b);
}

/* Shuffle controls broadcasting int16 element k of each 128-bit lane. */
static inline __m256i bcast16_ctrl(int k)
{
    return _mm256_set1_epi16((short)(((2 * k + 1) << 8) | (2 * k)));
}

/* The integer part of one q6_K block against a q8_K block:
 * sum_g sc_g (q . x)_g - 32 sum_g sc_g bsum_g as 8 x i32 (exact; the
 * caller scales by d_w d_x). Shared by the dot and the matvec rows. */
static inline __m256i q6_K_block_sumi(const uint8_t *b, const uint8_t *xb)
{
    const __m128i even_odd = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    const uint8_t *xq = xb + Q8_K_QS;
    __m128i sc8 = loadu_128(b + 192);
    /* the -32 offset: 32 * sum_g sc_g * bsum_g */
    __m256i off = _mm256_madd_epi16(loadu_256(xb + Q8_K_BSUMS), _mm256_cvtepi8_epi16(sc8));
    /* low lane: even sub-block scales, high lane: odd ones (int16), so one
     * in-lane broadcast gives [s_2g x 8 | s_2g+1 x 8] for 32 values */
    __m256i sc = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, even_odd));
    __m256i s0 = _mm256_setzero_si256(), s1 = s0;
#pragma GCC unroll 2
    for (int nh = 0; nh < 2; nh++) {
        __m256i q[4];
        q6_K_values(b, nh, q);
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            __m256i p = _mm256_maddubs_epi16(q[k], loadu_256(xq + 128 * nh + 32 * k));
            p = _mm256_madd_epi16(p, _mm256_shuffle_epi8(sc, bcast16_ctrl(4 * nh + k)));
            if (k & 1)
                s1 = _mm256_add_epi32(s1, p);
            else
                s0 = _mm256_add_epi32(s0, p);
        }
    }
    return _mm256_sub_epi32(_mm256_add_epi32(s0, s1), _mm256_slli_epi32(off, 5));
}

#endif /* KEEL_TENSOR_AVX2_UTIL_H */
