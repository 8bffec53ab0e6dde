/*
 * memtest.c — small single-sequence reference helpers for memory tests (see
 * memtest.h).
 */
#include "memtest.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers: a tiny reference for single-sequence scenarios -------------- */

/* RoPE (NORM / NEOX, no scaling) in double. */
void memtest_rope(const keel_rope *r, const float *x, int32_t d, double p, double *y)
{
    for (int32_t i = 0; i < d; i++) y[i] = x[i];
    for (int32_t i = 0; i < r->n_rot / 2; i++) {
        double th = p * pow((double)r->freq_base, -2.0 * i / (double)r->n_rot);
        double c = cos(th), s = sin(th);
        int32_t a = r->type == KEEL_ROPE_NEOX ? i : 2 * i;
        int32_t b = r->type == KEEL_ROPE_NEOX ? i + r->n_rot / 2 : 2 * i + 1;
        double x0 = x[a], x1 = x[b];
        y[a] = x0 * c - x1 * s;
        y[b] = x0 * s + x1 * c;
    }
}


/* Max |error| of keel's attention for one query against a recomputation
 * over toks (all visible). q is [nh][dk] after RoPE at qpos. */
double memtest_attn_err(keel_mem *m, int32_t layer, const keel_mem_layer *L, const memtest_tok *toks,
                       int32_t n, const float *q, int32_t qpos)
{
    int32_t nh = L->n_heads, G = nh / L->n_kv_heads, dk = L->head_dim_k, dv = L->head_dim_v;
    float *out = malloc((size_t)nh * (size_t)dv * sizeof(float));
    int32_t seq = 0;
    keel_mem_attn a = {1, nh, q, &qpos, &seq, out, 0.0f, 0.0f, NULL, NULL, NULL, 0, 0, NULL};
    assert_ok(keel_mem_attend(m, layer, &a));
    double *kk = malloc((size_t)dk * sizeof(double)), *acc = malloc((size_t)dv * sizeof(double));
    double *sc = malloc((size_t)n * sizeof(double));
    double err = 0.0, scale = 1.0 / sqrt((double)dk);
    for (int32_t h = 0; h < nh; h++) {
        int32_t hk = h / G;
        double mx = -INFINITY;
        for (int32_t i = 0; i < n; i++) {
            memtest_rope(&L->rope, toks[i].k + (size_t)hk * (size_t)dk, dk, toks[i].pos, kk);
            double s = 0;
            for (int32_t j = 0; j < dk; j++) s += (double)q[(size_t)h * (size_t)dk + (size_t)j] * kk[j];
            sc[i] = s * scale;
            if (sc[i] > mx) mx = sc[i];
        }
        double l = 0;
        for (int32_t j = 0; j < dv; j++) acc[j] = 0;
        for (int32_t i = 0; i < n; i++) {
            double p = exp(sc[i] - mx);
            l += p;
            for (int32_t j = 0; j < dv; j++) acc[j] += p * toks[i].v[(size_t)hk * (size_t)dv + (size_t)j];
        }
        for (int32_t j = 0; j < dv; j++) {
            double e = fabs(acc[j] / l - out[(size_t)h * (size_t)dv + (size_t)j]);
            if (e > err) err = e;
        }
    }
    free(out);
    free(kk);
    free(acc);
    free(sc);
    return err;
}

void memtest_make_tok(memtest_tok *t, const keel_mem_layer *L, int32_t pos, uint64_t seed)
{
    t->pos = pos;
    t->k = malloc((size_t)L->n_kv_heads * (size_t)L->head_dim_k * sizeof(float));
    t->v = malloc((size_t)L->n_kv_heads * (size_t)L->head_dim_v * sizeof(float));
    test_fill_uniform(t->k, (int64_t)L->n_kv_heads * L->head_dim_k, seed);
    test_fill_uniform(t->v, (int64_t)L->n_kv_heads * L->head_dim_v, seed ^ 0xabcdef);
}

void memtest_free_tok(memtest_tok *t)
{
    free(t->k);
    free(t->v);
}

/* Places and writes n tokens of sequence 0 (one layer). */
void memtest_place_write(keel_mem *m, const keel_mem_layer *L, memtest_tok *toks, int32_t n,
                        int32_t *cells_out)
{
    memtest_place_write_seq(m, L, toks, n, 0, cells_out);
}

void memtest_place_write_seq(keel_mem *m, const keel_mem_layer *L, memtest_tok *toks, int32_t n, int32_t s,
                             int32_t *cells_out)
{
    int32_t *pos = malloc((size_t)n * sizeof(int32_t)), *seq = malloc((size_t)n * sizeof(int32_t));
    for (int32_t i = 0; i < n; i++) seq[i] = s;
    int32_t ng = keel_mem_n_groups(m);
    int32_t *cells = malloc((size_t)n * (size_t)ng * sizeof(int32_t));
    size_t kn = (size_t)L->n_kv_heads * (size_t)L->head_dim_k;
    size_t vn = (size_t)L->n_kv_heads * (size_t)L->head_dim_v;
    float *k = malloc((size_t)n * kn * sizeof(float)), *v = malloc((size_t)n * vn * sizeof(float));
    double *kd = malloc((size_t)L->head_dim_k * sizeof(double));
    for (int32_t i = 0; i < n; i++) {
        pos[i] = toks[i].pos;
        for (int32_t h = 0; h < L->n_kv_heads; h++) {
            memtest_rope(&L->rope, toks[i].k + (size_t)h * (size_t)L->head_dim_k, L->head_dim_k, pos[i], kd);
            for (int32_t j = 0; j < L->head_dim_k; j++)
                k[(size_t)i * kn + (size_t)h * (size_t)L->head_dim_k + (size_t)j] = (float)kd[j];
        }
        memcpy(v + (size_t)i * vn, toks[i].v, vn * sizeof(float));
    }
    keel_mem_batch b = {n, pos, seq, NULL, NULL, NULL};
    assert_ok(keel_mem_place(m, &b, cells));
    assert_ok(keel_mem_write(m, 0, n, cells, k, v));
    if (cells_out) memcpy(cells_out, cells, (size_t)n * sizeof(int32_t));
    free(pos);
    free(seq);
    free(cells);
    free(k);
    free(v);
    free(kd);
}

void memtest_make_query(const keel_mem_layer *L, int32_t pos, uint64_t seed, float *q)
{
    int32_t nh = L->n_heads, dk = L->head_dim_k;
    float *raw = malloc((size_t)dk * sizeof(float));
    double *y = malloc((size_t)dk * sizeof(double));
    for (int32_t h = 0; h < nh; h++) {
        test_fill_uniform(raw, dk, seed + (uint64_t)h);
        memtest_rope(&L->rope, raw, dk, pos, y);
        for (int32_t j = 0; j < dk; j++) q[(size_t)h * (size_t)dk + (size_t)j] = (float)y[j];
    }
    free(raw);
    free(y);
}
