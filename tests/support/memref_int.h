/*
 * memref_int.h — what the parts of the memory core's differential driver
 * share (private to tests/support): the reference's types and its
 * operations (memref_model.c), the driver (memref.c), its session, refusal
 * and attention checks (memref_check.c). memref.c's head comment gives the
 * reference semantics.
 */
#ifndef KEEL_MEMREF_INT_H
#define KEEL_MEMREF_INT_H

#include "memref.h"
#include "keel.h"
#include "base/base.h"
#include "memory/memory.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <stdarg.h>
#include <stdio.h>

#define REF_MAX_LAYERS 4
#define REF_MAX_SEQ    4
#define REF_MAX_BATCH  16
#define REF_MAX_CKPT   4

typedef struct chooser {
    base_rng rng;
    const uint8_t *data;
    size_t size, off;
    bool bytes;
    bool exhausted;
} chooser;

typedef struct ref_cfg {
    keel_mem_config mc;
    keel_mem_layer layers[REF_MAX_LAYERS];
} ref_cfg;

#define NOISE_Z  8.0 /* tolerance in standard deviations of the first-order error */
#define NOISE_Z2 3.0 /* deviations of the second-order (curvature) term */

typedef struct ref_token {
    int32_t refs;
    uint64_t stamp;
    float *k;  /* [n_layers][kvh][dk] before RoPE */
    float *v;  /* [n_layers][kvh][dv] */
    float *ik; /* [n_layers][idx_head_dim] indexer keys before RoPE */
} ref_token;

typedef struct ref_entry {
    int32_t tok;
    int32_t pos;
    int32_t edits; /* position edits since written (key re-encodings) */
    int64_t inst;  /* the memory cell this entry models: entries of several
                      sequences share one while the memory shares the cell */
} ref_entry;

typedef struct ref_list {
    ref_entry *e;
    int32_t n, cap;
} ref_list;

typedef struct ref_plist {
    int32_t *p;
    int32_t n, cap;
} ref_plist;

typedef struct ref_group {
    bool sliding;
    int32_t window, n_sink;
} ref_group;

typedef struct ref_hist {
    uint64_t *st; /* stamps of the sequence's tokens, in placement order */
    int32_t n, cap;
} ref_hist;

/* A checkpoint: the history length, the ring lists and forgotten positions
 * a restore brings back (ring entries hold a reference to their token). */
typedef struct ref_ckpt {
    int32_t pos, pos_min, hist_n;
    uint64_t stamp;
    ref_list ring[REF_MAX_LAYERS];
    ref_plist forg[REF_MAX_LAYERS];
} ref_ckpt;

typedef struct ref {
    ref_cfg rc;
    int32_t n_groups;
    ref_group groups[REF_MAX_LAYERS];
    int32_t layer_group[REF_MAX_LAYERS];
    size_t k_off[REF_MAX_LAYERS], v_off[REF_MAX_LAYERS]; /* floats into token k / v */
    size_t k_floats, v_floats;
    size_t ik_off[REF_MAX_LAYERS], ik_floats;
    base_rng idata; /* indexer keys, queries and weights: a stream of its own */
    ref_token *toks;
    int32_t n_toks, cap_toks;
    int32_t *free_toks;
    int32_t n_free;
    ref_list lists[REF_MAX_SEQ][REF_MAX_LAYERS];
    /* positions the rings forgot, per sequence and sliding group (moved by
     * edits, dropped with removed ranges), and where compaction made
     * rewinding inexact: keel_mem_seq_rewind_min must not be below
     * max(exact, forgotten + window) */
    ref_plist forg[REF_MAX_SEQ][REF_MAX_LAYERS];
    int32_t exact[REF_MAX_SEQ];
    uint64_t next_stamp;
    int64_t next_inst;
    base_rng data; /* values of K, V, Q */
    /* recurrent half */
    bool rs; /* the config has recurrent layers */
    ref_hist hist[REF_MAX_SEQ];
    int32_t rs_lo[REF_MAX_SEQ], rs_hi[REF_MAX_SEQ];
    uint64_t rs_last[REF_MAX_SEQ]; /* the memory's stamp of the state's last token (the
                                      history keeps the stamps the state was computed
                                      from; a session load re-stamps only this) */
    int64_t rs_id[REF_MAX_SEQ];    /* state identity: equal ids share a slot (forks) */
    int64_t next_rs_id;
    int32_t n_slots, n_ckpt;                /* n_rs_slots and checkpoints kept per sequence */
    ref_ckpt ck[REF_MAX_SEQ][REF_MAX_CKPT]; /* oldest first */
    int32_t n_ck[REF_MAX_SEQ];
} ref;

typedef struct driver {
    chooser ch;
    ref r;
    keel_mem *mem;
    memref_result *res;
    FILE *log;
    int64_t step;
    bool trace; /* MEMREF_TRACE=1: log every operation */
    /* buffers */
    float *kbuf, *vbuf, *qbuf, *out;
    float *ibuf, *iqbuf, *iwbuf; /* indexer keys, queries, weights */
    int32_t *sel;
    double *dq, *dk, *dacc;
    int32_t cells[REF_MAX_LAYERS * REF_MAX_BATCH];
    int32_t only_seq; /* >= 0: op_place puts every token on this sequence */
} driver;

/* a line in the log (step number first), when there is a log */
void mr_note(driver *d, const char *fmt, ...) BASE_PRINTF(2, 3);
#define TRACE(...)                                                                                 \
    do {                                                                                           \
        if (d->trace) mr_note(d, __VA_ARGS__);                                                     \
    } while (0)

uint32_t mr_pick(chooser *c, uint32_t n);
bool mr_chance(chooser *c, uint32_t pct);
void mr_make_config(chooser *c, int preset, ref_cfg *rc);
void mr_codec_var(keel_dtype t, const float *x, int32_t n, double *var);
keel_dtype mr_query_dot_type(keel_dtype t);
void mr_plist_push(ref_plist *l, int32_t p);
void mr_list_push(ref_list *l, ref_entry e);
void mr_tok_unref(ref *r, int32_t t);
int32_t mr_tok_new(ref *r);
int32_t mr_tok_clone(ref *r, int32_t t);
void mr_ref_init(ref *r, const ref_cfg *rc, keel_mem *mem, uint64_t data_seed);
void mr_ref_free(ref *r);
bool mr_key_less(int32_t p, uint64_t st, int32_t q, uint64_t su);
void mr_sink_threshold(const ref *r, const ref_list *l, int32_t n_sink, int32_t *tp, uint64_t *ts);
int32_t mr_ref_lists_max(const ref *r, int32_t s);
int32_t mr_ref_lists_min(const ref *r, int32_t s);
int32_t mr_ref_pos_max(const ref *r, int32_t s);
bool mr_ref_seq_empty(const ref *r, int32_t s);
void mr_hist_push(ref_hist *h, uint64_t st);
void mr_rs_update(const keel_mem_recurrent *R, int32_t l, uint64_t st, float *conv, float *state);
void mr_ref_ck_free(ref *r, ref_ckpt *c);
void mr_ref_ck_drop(ref *r, int32_t s, int32_t above);
void mr_ref_rs_drop(ref *r, int32_t s);
int32_t mr_ref_slots_used(const ref *r);
bool mr_ref_shared(const ref *r, int32_t s);
int32_t mr_ref_ck_find(const ref *r, int32_t s, int32_t p0);
void mr_ref_rope_row(const keel_rope *R, int32_t d, const float *x, double p, double *y);
void mr_ref_rope(const keel_mem_layer *L, const float *x, double p, double *y);
void mr_refused(driver *d, uint64_t before, keel_status st, const char *what);
void mr_expect_status(driver *d, keel_status got, keel_status want, const char *what);
bool mr_ref_holds(const ref *r, int32_t s);
void mr_op_session(driver *d);
void mr_op_bad(driver *d);
void mr_op_attend(driver *d, int32_t layer, int32_t n_q);
void mr_compare_all(driver *d);

#endif
