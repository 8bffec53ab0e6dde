/*
 * quant_k.c — the K-quants (256-element super-blocks): dequantize of
 * q2_K..q6_K, quantize of q4_K / q5_K / q6_K, and the scalar dots against
 * q8_K activations. Layouts: tensor_impl.h.
 *
 * Element e of a super-block belongs to sub-block e/16 (q2_K, q3_K, q6_K)
 * or e/32 (q4_K, q5_K) in every format, which the loops below use directly.
 *
 * Quantizer (not ggml's exhaustive search): per sub-block, a handful of
 * candidate scales, each refined by one least-squares fit of the scale (and
 * min) to the chosen integers, keeping the lowest squared error; then the
 * sub-block scales are themselves quantized (6 bits for q4_K/q5_K, 8 for
 * q6_K) and the values re-quantized against the scales actually stored.
 * Rounding is tq_qround (nearest even), as everywhere.
 */
#include "tensor_impl.h"

/* ---- dequantize ----------------------------------------------------------------- */

void tq_dequant_q2_K(const void *x, float *y, int64_t n)
{
    const uint8_t *b = x;
    for (int64_t i = 0; i < n / QK_K; i++, b += Q2_K_BYTES, y += QK_K) {
        float d = rd_f16(b + 80), dmin = rd_f16(b + 82);
        for (int e = 0; e < QK_K; e++) {
            int nh = e / 128, j = (e % 128) / 32, l = e % 32;
            int q = (b[16 + 32 * nh + l] >> (2 * j)) & 3;
            int sc = b[e / 16];
            y[e] = d * (float)(sc & 0xF) * (float)q - dmin * (float)(sc >> 4);
        }
    }
}

void tq_dequant_q3_K(const void *x, float *y, int64_t n)
{
    const uint8_t *b = x;
    for (int64_t i = 0; i < n / QK_K; i++, b += Q3_K_BYTES, y += QK_K) {
        float d = rd_f16(b + 108);
        for (int e = 0; e < QK_K; e++) {
            int nh = e / 128, j = (e % 128) / 32, l = e % 32;
            int q = (b[32 + 32 * nh + l] >> (2 * j)) & 3;
            if (!((b[l] >> (4 * nh + j)) & 1)) q -= 4;
            y[e] = d * (float)(q3k_scale(e / 16, b + 96) - 32) * (float)q;
        }
    }
}

void tq_dequant_q4_K(const void *x, float *y, int64_t n)
{
    const uint8_t *b = x;
    for (int64_t i = 0; i < n / QK_K; i++, b += Q4_K_BYTES, y += QK_K) {
        float d = rd_f16(b), dmin = rd_f16(b + 2);
        for (int s = 0; s < 8; s++) {
            int sc, m;
            kq_scale_min(s, b + 4, &sc, &m);
            float dl = d * (float)sc, ml = dmin * (float)m;
            const uint8_t *q = b + 16 + 32 * (s / 2);
            int shift = 4 * (s & 1);
            for (int l = 0; l < 32; l++)
                y[32 * s + l] = dl * (float)((q[l] >> shift) & 0xF) - ml;
        }
    }
}

void tq_dequant_q5_K(const void *x, float *y, int64_t n)
{
    const uint8_t *b = x;
    for (int64_t i = 0; i < n / QK_K; i++, b += Q5_K_BYTES, y += QK_K) {
        float d = rd_f16(b), dmin = rd_f16(b + 2);
        const uint8_t *qh = b + 16;
        for (int s = 0; s < 8; s++) {
            int sc, m;
            kq_scale_min(s, b + 4, &sc, &m);
            float dl = d * (float)sc, ml = dmin * (float)m;
            const uint8_t *q = b + 48 + 32 * (s / 2);
            int shift = 4 * (s & 1);
            for (int l = 0; l < 32; l++) {
                int v = ((q[l] >> shift) & 0xF) | (((qh[l] >> s) & 1) << 4);
                y[32 * s + l] = dl * (float)v - ml;
            }
        }
    }
}

void tq_dequant_q6_K(const void *x, float *y, int64_t n)
{
    const uint8_t *b = x;
    for (int64_t i = 0; i < n / QK_K; i++, b += Q6_K_BYTES, y += QK_K) {
        float d = rd_f16(b + 208);
        for (int e = 0; e < QK_K; e++) {
            int nh = e / 128, r = e % 128;
            int lo = (b[64 * nh + (r & 63)] >> (r >= 64 ? 4 : 0)) & 0xF;
            int hi = (b[128 + 32 * nh + (r & 31)] >> (2 * (r / 32))) & 3;
            int q = (lo | (hi << 4)) - 32;
            y[e] = d * (float)(int8_t)b[192 + e / 16] * (float)q;
        }
    }
}

/* ---- quantize ------------------------------------------------------------------- */

/* Fits x[0..n) ~ s*q - m with q in [0, qmax], s >= 0, m >= 0. Returns the
 * squared error of the best candidate. */
static float fit_scale_min(const float *x, int n, int qmax, float *s_out, float *m_out)
{
    float lo = 0.0f, hi = x[0];
    for (int k = 0; k < n; k++) {
        lo = fminf(lo, x[k]);
        hi = fmaxf(hi, x[k]);
    }
    *m_out = -lo;
    if (hi <= lo) {
        *s_out = 0.0f;
        float err = 0.0f;
        for (int k = 0; k < n; k++)
            err += (x[k] - lo) * (x[k] - lo);
        return err;
    }
    float best_err = INFINITY, best_s = (hi - lo) / (float)qmax, best_m = -lo;
    for (int c = -2; c <= 4; c++) {
        float s = (hi - lo) / ((float)qmax + 0.25f * (float)c), m = -lo;
        for (int it = 0; it < 2; it++) {
            /* q for (s, m); then least squares for (s, m) given q */
            float sq = 0, sx = 0, sqq = 0, sqx = 0;
            float is = 1.0f / s;
            for (int k = 0; k < n; k++) {
                float q = (float)tq_qround((x[k] + m) * is, 0.0f, (float)qmax);
                sq += q;
                sx += x[k];
                sqq += q * q;
                sqx += q * x[k];
            }
            float den = (float)n * sqq - sq * sq;
            if (den <= 0.0f) break;
            float ns = ((float)n * sqx - sq * sx) / den;
            float nb = (sx - ns * sq) / (float)n; /* x ~ ns*q + nb */
            if (nb > 0.0f) {                      /* offset must be <= 0 */
                nb = 0.0f;
                ns = sqq > 0.0f ? sqx / sqq : 0.0f;
            }
            if (!(ns > 0.0f)) break;
            s = ns;
            m = -nb;
        }
        float is = 1.0f / s, err = 0.0f;
        for (int k = 0; k < n; k++) {
            float q = (float)tq_qround((x[k] + m) * is, 0.0f, (float)qmax);
            float e = s * q - m - x[k];
            err += e * e;
        }
        if (err < best_err) {
            best_err = err;
            best_s = s;
            best_m = m;
        }
    }
    *s_out = best_s;
    *m_out = best_m;
    return best_err;
}

/* Packs 8 six-bit scales and mins into the 12-byte q4_K/q5_K field. */
static void kq_pack_scales(const int sc[8], const int m[8], uint8_t *q)
{
    for (int j = 0; j < 4; j++) {
        q[j] = (uint8_t)(sc[j] | ((sc[j + 4] >> 4) << 6));
        q[j + 4] = (uint8_t)(m[j] | ((m[j + 4] >> 4) << 6));
        q[j + 8] = (uint8_t)((sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4));
    }
}

/* q4_K (qmax 15) and q5_K (qmax 31): fills d, dmin, scales and the integer
 * values q[256]. */
static void kq_quant_asym(const float *x, uint8_t *b, int qmax, uint8_t q[QK_K])
{
    float s[8], m[8], smax = 0.0f, mmax = 0.0f;
    for (int j = 0; j < 8; j++) {
        fit_scale_min(x + 32 * j, 32, qmax, &s[j], &m[j]);
        smax = fmaxf(smax, s[j]);
        mmax = fmaxf(mmax, m[j]);
    }
    float d, id, dmin, idmin;
    wr_u16(b, tq_scale_f16(smax / 63.0f, &d, &id));
    wr_u16(b + 2, tq_scale_f16(mmax / 63.0f, &dmin, &idmin));
    int sc[8], mi[8];
    for (int j = 0; j < 8; j++) {
        sc[j] = tq_qround(s[j] * id, 0.0f, 63.0f);
        mi[j] = tq_qround(m[j] * idmin, 0.0f, 63.0f);
    }
    kq_pack_scales(sc, mi, b + 4);
    for (int j = 0; j < 8; j++) {
        float es = d * (float)sc[j], em = dmin * (float)mi[j];
        float ies = es != 0.0f ? 1.0f / es : 0.0f;
        for (int k = 0; k < 32; k++)
            q[32 * j + k] = (uint8_t)tq_qround((x[32 * j + k] + em) * ies, 0.0f, (float)qmax);
    }
}

void tq_quant_q4_K(const float *x, void *y, int64_t n)
{
    uint8_t *b = y;
    uint8_t q[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K, b += Q4_K_BYTES) {
        kq_quant_asym(x, b, 15, q);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++)
                b[16 + 32 * c + l] = (uint8_t)(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
    }
}

void tq_quant_q5_K(const float *x, void *y, int64_t n)
{
    uint8_t *b = y;
    uint8_t q[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K, b += Q5_K_BYTES) {
        kq_quant_asym(x, b, 31, q);
        memset(b + 16, 0, 32);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) {
                int q0 = q[64 * c + l], q1 = q[64 * c + 32 + l];
                b[48 + 32 * c + l] = (uint8_t)((q0 & 0xF) | ((q1 & 0xF) << 4));
                b[16 + l] |= (uint8_t)(((q0 >> 4) << (2 * c)) | ((q1 >> 4) << (2 * c + 1)));
            }
    }
}

/* Fits x[0..16) ~ s*q with q in [-32, 31] (s of either sign). */
static float fit_scale_sym6(const float *x, float *s_out)
{
    float amax = 0.0f, max = 0.0f;
    for (int k = 0; k < 16; k++) {
        if (fabsf(x[k]) > amax) {
            amax = fabsf(x[k]);
            max = x[k];
        }
    }
    *s_out = 0.0f;
    if (amax == 0.0f) return 0.0f;
    static const float divs[] = {-32.0f, -31.5f, -31.0f, -30.5f, 31.0f, 30.5f};
    float best_err = INFINITY;
    for (size_t c = 0; c < BASE_ARRAY_LEN(divs); c++) {
        float s = max / divs[c];
        for (int it = 0; it < 2; it++) {
            float is = 1.0f / s, sqx = 0.0f, sqq = 0.0f, err = 0.0f;
            for (int k = 0; k < 16; k++) {
                float q = (float)tq_qround(x[k] * is, -32.0f, 31.0f);
                sqx += q * x[k];
                sqq += q * q;
                float e = s * q - x[k];
                err += e * e;
            }
            if (err < best_err) {
                best_err = err;
                *s_out = s;
            }
            if (sqq <= 0.0f || sqx == 0.0f) break;
            s = sqx / sqq; /* least-squares scale for these q */
        }
    }
    return best_err;
}

void tq_quant_q6_K(const float *x, void *y, int64_t n)
{
    uint8_t *b = y;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K, b += Q6_K_BYTES) {
        float s[16], amax = 0.0f, max = 0.0f;
        for (int j = 0; j < 16; j++) {
            fit_scale_sym6(x + 16 * j, &s[j]);
            if (fabsf(s[j]) > amax) {
                amax = fabsf(s[j]);
                max = s[j];
            }
        }
        float d, id;
        wr_u16(b + 208, tq_scale_f16(max / -128.0f, &d, &id));
        int q[QK_K];
        for (int j = 0; j < 16; j++) {
            int sc = tq_qround(s[j] * id, -128.0f, 127.0f);
            b[192 + j] = (uint8_t)(int8_t)sc;
            float es = d * (float)sc;
            float ies = es != 0.0f ? 1.0f / es : 0.0f;
            for (int k = 0; k < 16; k++)
                q[16 * j + k] = tq_qround(x[16 * j + k] * ies, -32.0f, 31.0f) + 32;
        }
        for (int nh = 0; nh < 2; nh++) {
            const int *qq = q + 128 * nh;
            for (int l = 0; l < 32; l++) {
                b[64 * nh + l] = (uint8_t)((qq[l] & 0xF) | ((qq[l + 64] & 0xF) << 4));
                b[64 * nh + 32 + l] = (uint8_t)((qq[l + 32] & 0xF) | ((qq[l + 96] & 0xF) << 4));
                b[128 + 32 * nh + l] =
                    (uint8_t)((qq[l] >> 4) | ((qq[l + 32] >> 4) << 2) | ((qq[l + 64] >> 4) << 4) |
                              ((qq[l + 96] >> 4) << 6));
            }
        }
    }
}

/* ---- scalar dots against q8_K ------------------------------------------------- */

static int q8k_bsum(const uint8_t *xb, int g)
{
    return rd_i16(xb + Q8_K_BSUMS + 2 * g);
}

float tq_dot_q2_K(int64_t n, const void *w, const void *x)
{
    const uint8_t *b = w, *xb = x;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++, b += Q2_K_BYTES, xb += Q8_K_BYTES) {
        const int8_t *xq = (const int8_t *)(xb + Q8_K_QS);
        int sumi = 0, summ = 0;
        for (int g = 0; g < 16; g++) {
            int acc = 0;
            for (int k = 0; k < 16; k++) {
                int e = 16 * g + k;
                int nh = e / 128, j = (e % 128) / 32, l = e % 32;
                acc += ((b[16 + 32 * nh + l] >> (2 * j)) & 3) * xq[e];
            }
            sumi += (b[g] & 0xF) * acc;
            summ += (b[g] >> 4) * q8k_bsum(xb, g);
        }
        float dx = rd_f32(xb);
        sum += dx * rd_f16(b + 80) * (float)sumi - dx * rd_f16(b + 82) * (float)summ;
    }
    return sum;
}

float tq_dot_q3_K(int64_t n, const void *w, const void *x)
{
    const uint8_t *b = w, *xb = x;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++, b += Q3_K_BYTES, xb += Q8_K_BYTES) {
        const int8_t *xq = (const int8_t *)(xb + Q8_K_QS);
        int sumi = 0;
        for (int g = 0; g < 16; g++) {
            int acc = 0;
            for (int k = 0; k < 16; k++) {
                int e = 16 * g + k;
                int nh = e / 128, j = (e % 128) / 32, l = e % 32;
                int q = (b[32 + 32 * nh + l] >> (2 * j)) & 3;
                if (!((b[l] >> (4 * nh + j)) & 1)) q -= 4;
                acc += q * xq[e];
            }
            sumi += (q3k_scale(g, b + 96) - 32) * acc;
        }
        sum += rd_f32(xb) * rd_f16(b + 108) * (float)sumi;
    }
    return sum;
}

float tq_dot_q4_K(int64_t n, const void *w, const void *x)
{
    const uint8_t *b = w, *xb = x;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++, b += Q4_K_BYTES, xb += Q8_K_BYTES) {
        const int8_t *xq = (const int8_t *)(xb + Q8_K_QS);
        int sumi = 0, summ = 0;
        for (int s = 0; s < 8; s++) {
            int sc, m;
            kq_scale_min(s, b + 4, &sc, &m);
            const uint8_t *q = b + 16 + 32 * (s / 2);
            int shift = 4 * (s & 1), acc = 0;
            for (int l = 0; l < 32; l++)
                acc += ((q[l] >> shift) & 0xF) * xq[32 * s + l];
            sumi += sc * acc;
            summ += m * (q8k_bsum(xb, 2 * s) + q8k_bsum(xb, 2 * s + 1));
        }
        float dx = rd_f32(xb);
        sum += dx * rd_f16(b) * (float)sumi - dx * rd_f16(b + 2) * (float)summ;
    }
    return sum;
}

float tq_dot_q5_K(int64_t n, const void *w, const void *x)
{
    const uint8_t *b = w, *xb = x;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++, b += Q5_K_BYTES, xb += Q8_K_BYTES) {
        const int8_t *xq = (const int8_t *)(xb + Q8_K_QS);
        const uint8_t *qh = b + 16;
        int sumi = 0, summ = 0;
        for (int s = 0; s < 8; s++) {
            int sc, m;
            kq_scale_min(s, b + 4, &sc, &m);
            const uint8_t *q = b + 48 + 32 * (s / 2);
            int shift = 4 * (s & 1), acc = 0;
            for (int l = 0; l < 32; l++) {
                int v = ((q[l] >> shift) & 0xF) | (((qh[l] >> s) & 1) << 4);
                acc += v * xq[32 * s + l];
            }
            sumi += sc * acc;
            summ += m * (q8k_bsum(xb, 2 * s) + q8k_bsum(xb, 2 * s + 1));
        }
        float dx = rd_f32(xb);
        sum += dx * rd_f16(b) * (float)sumi - dx * rd_f16(b + 2) * (float)summ;
    }
    return sum;
}

float tq_dot_q6_K(int64_t n, const void *w, const void *x)
{
    const uint8_t *b = w, *xb = x;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++, b += Q6_K_BYTES, xb += Q8_K_BYTES) {
        const int8_t *xq = (const int8_t *)(xb + Q8_K_QS);
        int sumi = 0;
        for (int g = 0; g < 16; g++) {
            int acc = 0;
            for (int k = 0; k < 16; k++) {
                int e = 16 * g + k, nh = e / 128, r = e % 128;
                int lo = (b[64 * nh + (r & 63)] >> (r >= 64 ? 4 : 0)) & 0xF;
                int hi = (b[128 + 32 * nh + (r & 31)] >> (2 * (r / 32))) & 3;
                acc += ((lo | (hi << 4)) - 32) * xq[e];
            }
            sumi += (int8_t)b[192 + g] * acc;
        }
        sum += rd_f32(xb) * rd_f16(b + 208) * (float)sumi;
    }
    return sum;
}
