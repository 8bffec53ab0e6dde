/*
 * memtest.h — helpers for memory-core tests: tokens with random K (before
 * RoPE) and V, placing and writing them for sequence 0 of layer 0, queries,
 * and the max error of keel's attention against a double-precision
 * recomputation over a list of tokens.
 */
#ifndef KEEL_MEMTEST_H
#define KEEL_MEMTEST_H

#include "testutil.h"

typedef struct memtest_tok {
    int32_t pos;
    float *k; /* [kvh][dk] before RoPE */
    float *v; /* [kvh][dv] */
} memtest_tok;

/* RoPE (NORM / NEOX, no scaling) of x[0..d) at position p, in double. */
void memtest_rope(const keel_rope *r, const float *x, int32_t d, double p, double *y);
/* Max |error| of keel's attention (layer, sequence 0) for one query q
 * [n_heads][dk] (RoPE'd at qpos) against a recomputation over toks. */
double memtest_attn_err(keel_mem *m, int32_t layer, const keel_mem_layer *L, const memtest_tok *toks,
                        int32_t n, const float *q, int32_t qpos);
void memtest_make_tok(memtest_tok *t, const keel_mem_layer *L, int32_t pos, uint64_t seed);
void memtest_free_tok(memtest_tok *t);
/* Places and writes n tokens of sequence 0 (layer 0); cells_out may be NULL. */
void memtest_place_write(keel_mem *m, const keel_mem_layer *L, memtest_tok *toks, int32_t n,
                         int32_t *cells_out);
/* The same for sequence s. */
void memtest_place_write_seq(keel_mem *m, const keel_mem_layer *L, memtest_tok *toks, int32_t n, int32_t s,
                             int32_t *cells_out);
/* A query [n_heads][dk] RoPE'd at pos. */
void memtest_make_query(const keel_mem_layer *L, int32_t pos, uint64_t seed, float *q);

#endif
