/*
 * memref.c — the memory core's differential driver (see memref.h).
 *
 * Reference semantics (the specification keel_mem must match):
 *   - each sequence has, per layer group, a list of entries (token,
 *     position); a token owns K before RoPE and V for every layer;
 *   - placing tokens appends entries; before that, in sliding groups, the
 *     entries of each placed sequence with position <= first_new - window
 *     that are not among its n_sink lowest (position, stamp) entries are
 *     forgotten;
 *   - seq_rm / seq_cp / seq_keep / seq_add / seq_div / clear edit the lists
 *     of the named sequences only;
 *   - a query (sequence s, position p) attends to the entries of s with
 *     position <= p and, in sliding groups, position > p - window or among
 *     the n_sink lowest; keys are RoPE'd at the entry's current position.
 * Attention is recomputed from these lists in double precision.
 *
 * Sparse attention (layers with an indexer column, docs/memory.md "Sparse
 * attention"): a token also owns an indexer key per such layer (before
 * RoPE); a sparse query's scores sum_h w_h relu(q_h . ik) are recomputed
 * in double over the entries it may see, from the reference's own copy of
 * the keys RoPE'd at the entries' current positions. The memory's kept
 * cells must be min(top_k, visible) distinct visible cells in (position,
 * stamp) order (a cell copied into a stream twice is two cells), and no dropped entry may outscore a kept one beyond the
 * codec's noise; attention is then compared over exactly the kept set (so
 * an indexer key that drifted from its cell shows as a wrong choice).
 *
 * Recurrent layers (docs/memory.md, "The recurrent half"): each sequence
 * has a history (the stamps of its tokens, in order); the driver updates
 * the memory's state of every placed token with a fixed toy recurrence
 * (rs_update) and the reference recomputes the state from the history,
 * from zero, with the same float operations: the two must be bitwise
 * equal after every operation. Checkpoints are modelled as snapshots of
 * the history length and of the ring lists; every refusal (KEEL_ESTATE)
 * is predicted from the reference alone.
 */
#include "memref.h"

#include "keel.h"
#include "base/base.h"
#include "memory/memory.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define REF_MAX_LAYERS 4
#define REF_MAX_SEQ 4
#define REF_MAX_BATCH 16
#define REF_MAX_CKPT 4

/* ---- choices -------------------------------------------------------------- */

typedef struct chooser {
    base_rng rng;
    const uint8_t *data;
    size_t size, off;
    bool bytes;
    bool exhausted;
} chooser;

static uint32_t pick(chooser *c, uint32_t n)
{
    if (n <= 1) return 0;
    if (!c->bytes) return (uint32_t)base_rng_below(&c->rng, n);
    if (c->off >= c->size) {
        c->exhausted = true;
        return 0;
    }
    uint32_t v = c->data[c->off++];
    if (n > 256 && c->off < c->size) v = (v << 8) | c->data[c->off++];
    return v % n;
}

static bool chance(chooser *c, uint32_t pct)
{
    return pick(c, 100) < pct;
}

/* ---- configuration ------------------------------------------------------- */

typedef struct ref_cfg {
    keel_mem_config mc;
    keel_mem_layer layers[REF_MAX_LAYERS];
} ref_cfg;

static const keel_dtype g_kv_types[] = {KEEL_DTYPE_F32,  KEEL_DTYPE_F16,  KEEL_DTYPE_BF16,
                                        KEEL_DTYPE_Q8_0, KEEL_DTYPE_Q4_0, KEEL_DTYPE_Q4_1,
                                        KEEL_DTYPE_Q5_0, KEEL_DTYPE_Q5_1};

static void make_config(chooser *c, int preset, ref_cfg *rc)
{
    memset(rc, 0, sizeof *rc);
    rc->mc = keel_mem_config_default();
    int nl = 1 + (int)pick(c, 3);
    rc->mc.n_layers = nl;
    rc->mc.layers = rc->layers;
    rc->mc.n_seq_max = 1 + (int32_t)pick(c, REF_MAX_SEQ);
    rc->mc.unified = chance(c, 60);
    rc->mc.n_ctx = 24 + (int32_t)pick(c, 120);
    rc->mc.n_batch_max = 1 + (int32_t)pick(c, REF_MAX_BATCH);
    rc->mc.n_threads = 1 + (int32_t)pick(c, 2);
    for (int i = 0; i < REF_MAX_LAYERS; i++) {
        keel_mem_layer *l = &rc->layers[i];
        *l = keel_mem_layer_default();
        uint32_t kind = pick(c, 10);
        l->kind = kind < 5 ? KEEL_MEM_LAYER_FULL : kind < 9 ? KEEL_MEM_LAYER_SLIDING : KEEL_MEM_LAYER_NONE;
        l->window = 3 + (int32_t)pick(c, 20);
        l->n_sink = (int32_t)pick(c, 4);
        l->n_kv_heads = 1 + (int32_t)pick(c, 2);
        l->n_heads = l->n_kv_heads * (1 + (int32_t)pick(c, 3));
        l->k_dtype = g_kv_types[pick(c, 8)];
        l->v_dtype = g_kv_types[pick(c, 8)];
        l->head_dim_k = chance(c, 50) ? 32 : 64;
        l->head_dim_v = chance(c, 50) ? 32 : 64;
        l->k_rot.enabled = chance(c, 50);
        l->k_rot.block = chance(c, 50) ? 32 : 0;
        l->k_rot.seed = chance(c, 70) ? 1 + pick(c, 1000) : 0;
        l->v_rot.enabled = chance(c, 50);
        l->v_rot.block = chance(c, 50) ? 32 : 0;
        l->v_rot.seed = chance(c, 70) ? 1 + pick(c, 1000) : 0;
        l->rope.type = chance(c, 50) ? KEEL_ROPE_NORM : KEEL_ROPE_NEOX;
        l->rope.n_rot = chance(c, 70) ? l->head_dim_k : l->head_dim_k / 2;
        l->rope.freq_base = chance(c, 50) ? 10000.0f : 500000.0f;
        l->rope.freq_scale = chance(c, 80) ? 1.0f : 0.25f;
    }
    /* a layer of attention must exist */
    if (rc->layers[0].kind == KEEL_MEM_LAYER_NONE) rc->layers[0].kind = KEEL_MEM_LAYER_FULL;
    switch (preset) {
    case 0: /* exactness: f32, no rotation, one full + one sliding layer */
        rc->mc.n_layers = 2;
        for (int i = 0; i < 2; i++) {
            rc->layers[i].k_dtype = rc->layers[i].v_dtype = KEEL_DTYPE_F32;
            rc->layers[i].k_rot.enabled = rc->layers[i].v_rot.enabled = false;
        }
        rc->layers[0].kind = KEEL_MEM_LAYER_FULL;
        rc->layers[1].kind = KEEL_MEM_LAYER_SLIDING;
        break;
    case 1: /* q8_0 K rotated, f16 V, sliding + full, unified */
        rc->mc.n_layers = 2;
        rc->mc.unified = true;
        for (int i = 0; i < 2; i++) {
            rc->layers[i].k_dtype = KEEL_DTYPE_Q8_0;
            rc->layers[i].v_dtype = KEEL_DTYPE_F16;
            rc->layers[i].k_rot.enabled = true;
        }
        rc->layers[0].kind = KEEL_MEM_LAYER_SLIDING;
        rc->layers[1].kind = KEEL_MEM_LAYER_FULL;
        break;
    case 2: /* split streams, 4-bit codecs */
        rc->mc.unified = false;
        rc->mc.n_seq_max = 3;
        for (int i = 0; i < nl; i++) {
            rc->layers[i].k_dtype = i % 2 ? KEEL_DTYPE_Q4_1 : KEEL_DTYPE_Q4_0;
            rc->layers[i].v_dtype = i % 2 ? KEEL_DTYPE_Q5_1 : KEEL_DTYPE_Q5_0;
        }
        break;
    case 3: /* many sequences sharing cells, bf16 */
        rc->mc.unified = true;
        rc->mc.n_seq_max = 4;
        for (int i = 0; i < nl; i++) rc->layers[i].k_dtype = rc->layers[i].v_dtype = KEEL_DTYPE_BF16;
        break;
    case 4: /* long context, two threads: the split-KV path (parts of a few
             * cells, see drive), quantized (n_ctx not a multiple of 5:
             * deterministic mode, which never splits, had taken 1100 and
             * with it every run of this preset) */
        rc->mc.n_layers = 1;
        rc->mc.n_seq_max = 1 + (int32_t)pick(c, 2);
        rc->mc.n_ctx = 1101;
        rc->mc.n_batch_max = 16;
        rc->mc.n_threads = 2;
        rc->layers[0].kind = KEEL_MEM_LAYER_FULL;
        rc->layers[0].k_dtype = KEEL_DTYPE_Q8_0;
        rc->layers[0].k_rot.enabled = true;
        rc->layers[0].v_dtype = KEEL_DTYPE_Q4_0;
        break;
    case 5: /* hybrid: full + sliding + recurrent, f32, checkpoints */
        rc->mc.n_layers = 3;
        rc->mc.unified = true;
        rc->mc.n_seq_max = 3;
        for (int i = 0; i < 3; i++) {
            rc->layers[i].k_dtype = rc->layers[i].v_dtype = KEEL_DTYPE_F32;
            rc->layers[i].k_rot.enabled = rc->layers[i].v_rot.enabled = false;
        }
        rc->layers[0].kind = KEEL_MEM_LAYER_RECURRENT;
        rc->layers[1].kind = KEEL_MEM_LAYER_SLIDING;
        rc->layers[2].kind = KEEL_MEM_LAYER_FULL;
        break;
    case 6: /* recurrent only, fewer state slots than sequences */
        rc->mc.n_layers = 2;
        rc->mc.n_seq_max = 3;
        rc->layers[0].kind = rc->layers[1].kind = KEEL_MEM_LAYER_RECURRENT;
        break;
    case 7: /* hybrid with quantized, rotated K in a ring, split streams */
        rc->mc.n_layers = 3;
        rc->mc.unified = false;
        rc->mc.n_seq_max = 2;
        rc->layers[0].kind = KEEL_MEM_LAYER_SLIDING;
        rc->layers[0].k_dtype = KEEL_DTYPE_Q8_0;
        rc->layers[0].k_rot.enabled = true;
        rc->layers[1].kind = KEEL_MEM_LAYER_RECURRENT;
        rc->layers[2].kind = KEEL_MEM_LAYER_FULL;
        break;
    default:
        break;
    }
    /* recurrent layers: in presets 5-7, and in a quarter of random configs */
    bool rs_cfg = preset >= 5 || (preset < 0 && chance(c, 25));
    if (preset < 0 && rs_cfg)
        for (int i = 0; i < rc->mc.n_layers; i++)
            if (chance(c, 35)) rc->layers[i].kind = KEEL_MEM_LAYER_RECURRENT;
    for (int i = 0; i < REF_MAX_LAYERS; i++) {
        keel_mem_recurrent *r = &rc->layers[i].rs;
        r->conv_kernel = 1 + (int32_t)pick(c, 4);
        r->conv_channels = 1 + (int32_t)pick(c, 6);
        r->state_floats = (int64_t)pick(c, 12);
    }
    bool any_rs = false;
    for (int i = 0; i < rc->mc.n_layers; i++) any_rs |= rc->layers[i].kind == KEEL_MEM_LAYER_RECURRENT;
    if (any_rs) {
        rc->mc.n_ckpt = preset == 6 ? 2 : preset >= 5 ? 3 : (int32_t)pick(c, REF_MAX_CKPT + 1);
        rc->mc.n_rs_slots = preset == 6 ? 2 : chance(c, 25) ? 1 + (int32_t)pick(c, (uint32_t)rc->mc.n_seq_max) : 0;
        /* speculation snapshots in about three quarters (derived without a draw) */
        rc->mc.spec_snapshot = preset >= 5 || rc->mc.n_ctx % 4 != 1;
    }
    /* indexer columns (sparse attention) on the attention layers of preset
     * 8 and of about a seventh of the random configurations, derived from
     * what was drawn (without a draw: the seeds' streams stay as they were) */
    if (preset == 8) {
        rc->mc.n_layers = 2;
        rc->mc.unified = true;
        rc->mc.n_seq_max = 3;
        rc->layers[0].kind = KEEL_MEM_LAYER_FULL;
        rc->layers[0].k_dtype = rc->layers[0].v_dtype = KEEL_DTYPE_F32;
        rc->layers[0].k_rot.enabled = false;
        rc->layers[1].kind = KEEL_MEM_LAYER_SLIDING;
        rc->layers[1].k_dtype = KEEL_DTYPE_F16;
    }
    if (preset == 8 || (preset < 0 && rc->mc.n_ctx % 7 == 3))
        for (int i = 0; i < rc->mc.n_layers; i++) {
            keel_mem_layer *l = &rc->layers[i];
            if (l->kind != KEEL_MEM_LAYER_FULL && l->kind != KEEL_MEM_LAYER_SLIDING) continue;
            l->idx_head_dim = l->head_dim_k == 32 ? 64 : 32;
            l->idx_n_heads = 1 + l->window % 4;
            l->idx_dtype = l->k_dtype;
            l->idx_rot = l->k_rot;
            l->idx_rot.seed = l->k_rot.seed ? l->k_rot.seed + 7 : 0;
            l->idx_rope = l->rope;
            l->idx_rope.n_rot = BASE_MIN(l->rope.n_rot, l->idx_head_dim);
            l->idx_top_k = 1 + (l->window * 7 + l->n_sink) % 12;
            if (preset == 8) { /* exact f32 keys in the full layer, q8_0 rotated in the ring */
                l->idx_dtype = i == 0 ? KEEL_DTYPE_F32 : KEEL_DTYPE_Q8_0;
                l->idx_rot.enabled = i == 1;
                l->idx_top_k = i == 0 ? 6 : 4;
            }
        }
    /* deterministic attention in about a fifth of the configurations,
     * derived without a draw (the seeds' operation streams stay as they were) */
    rc->mc.deterministic = rc->mc.n_ctx % 5 == 0;
    /* checkpoints of ring rows on attention memories with sliding layers,
     * in about a third of them (derived without a draw) */
    bool any_sliding = false;
    for (int i = 0; i < rc->mc.n_layers; i++) any_sliding |= rc->layers[i].kind == KEEL_MEM_LAYER_SLIDING;
    if (!any_rs && any_sliding && rc->mc.n_ctx % 3 == 0) rc->mc.n_ckpt = 1 + rc->mc.n_ctx % REF_MAX_CKPT;
}

/*
 * Codec noise model (docs/memory.md, "Codec tolerances"). Storing a row
 * rounds each stored-basis element x_i (after the Hadamard rotation when
 * on) with an error of variance var_i: block codecs round to a step A / div
 * of their 32-element block's largest magnitude A (q8_0: 127, q5_0: 16,
 * q4_0: 8, q5_1: 31/2, q4_1: 15/2; uniform error, step^2 / 12), plus the
 * f16 block scale's relative rounding; f16 / bf16 round each value relative
 * to itself (2^-11 / 2^-8, (u x)^2 / 3); f32 keeps float rounding of the
 * rotation and the edits (2^-22). The query is quantized the same way for
 * keys whose dot type is q8_0 / q8_1.
 */
static void codec_var(keel_dtype t, const float *x, int32_t n, double *var)
{
    double div = 0.0, u = 0x1p-22;
    switch (t) {
    case KEEL_DTYPE_F16: u = 0x1p-11; break;
    case KEEL_DTYPE_BF16: u = 0x1p-8; break;
    case KEEL_DTYPE_Q8_0: case KEEL_DTYPE_Q8_1: div = 127.0; u = 0x1p-11; break;
    case KEEL_DTYPE_Q5_0: div = 16.0; u = 0x1p-11; break;
    case KEEL_DTYPE_Q4_0: div = 8.0; u = 0x1p-11; break;
    case KEEL_DTYPE_Q5_1: div = 15.5; u = 0x1p-11; break;
    case KEEL_DTYPE_Q4_1: div = 7.5; u = 0x1p-11; break;
    default: break;
    }
    /* q4_0 / q5_0 scale by the signed largest value, d = max / -div: values
     * of the other sign near the top clamp to div - 1, a known error */
    bool clamps = t == KEEL_DTYPE_Q4_0 || t == KEEL_DTYPE_Q5_0;
    for (int32_t b0 = 0; b0 < n; b0 += 32) {
        int32_t b1 = b0 + 32 < n ? b0 + 32 : n;
        double amax = 0.0, smax = 0.0;
        for (int32_t i = b0; i < b1; i++)
            if (fabs((double)x[i]) > amax) {
                amax = fabs((double)x[i]);
                smax = x[i];
            }
        double step = div > 0.0 ? amax / div : 0.0;
        for (int32_t i = b0; i < b1; i++) {
            double rel = (double)x[i] * u;
            var[i] = step * step / 12.0 + rel * rel / 3.0;
            if (clamps && step > 0.0) {
                double y = (double)x[i] / (smax / -div); /* in units of d */
                if (y > div - 0.5) {
                    double e = (y - (div - 1.0)) * step;
                    var[i] = e * e + rel * rel / 3.0;
                }
            }
        }
    }
}

/* The dot type of queries against keys of type t needs quantizing. */
static keel_dtype query_dot_type(keel_dtype t)
{
    switch (t) {
    case KEEL_DTYPE_Q8_0: case KEEL_DTYPE_Q4_0: case KEEL_DTYPE_Q5_0: return KEEL_DTYPE_Q8_0;
    case KEEL_DTYPE_Q4_1: case KEEL_DTYPE_Q5_1: return KEEL_DTYPE_Q8_1;
    default: return KEEL_DTYPE_F32;
    }
}

#define NOISE_Z 8.0  /* tolerance in standard deviations of the first-order error */
#define NOISE_Z2 3.0 /* deviations of the second-order (curvature) term */

/* ---- reference ----------------------------------------------------------- */

typedef struct ref_token {
    int32_t refs;
    uint64_t stamp;
    float *k; /* [n_layers][kvh][dk] before RoPE */
    float *v; /* [n_layers][kvh][dv] */
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

static void plist_push(ref_plist *l, int32_t p)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 16;
        l->p = realloc(l->p, (size_t)l->cap * sizeof(int32_t));
        if (!l->p) abort();
    }
    l->p[l->n++] = p;
}

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
    bool rs;                        /* the config has recurrent layers */
    ref_hist hist[REF_MAX_SEQ];
    int32_t rs_lo[REF_MAX_SEQ], rs_hi[REF_MAX_SEQ];
    uint64_t rs_last[REF_MAX_SEQ];  /* the memory's stamp of the state's last token (the
                                       history keeps the stamps the state was computed
                                       from; a session load re-stamps only this) */
    int64_t rs_id[REF_MAX_SEQ];     /* state identity: equal ids share a slot (forks) */
    int64_t next_rs_id;
    int32_t n_slots, n_ckpt;        /* n_rs_slots and checkpoints kept per sequence */
    ref_ckpt ck[REF_MAX_SEQ][REF_MAX_CKPT]; /* oldest first */
    int32_t n_ck[REF_MAX_SEQ];
} ref;

static void list_push(ref_list *l, ref_entry e)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 16;
        l->e = realloc(l->e, (size_t)l->cap * sizeof(ref_entry));
        if (!l->e) abort();
    }
    l->e[l->n++] = e;
}

static void tok_unref(ref *r, int32_t t)
{
    if (--r->toks[t].refs == 0) {
        free(r->toks[t].k);
        free(r->toks[t].v);
        free(r->toks[t].ik);
        r->toks[t].k = r->toks[t].v = r->toks[t].ik = NULL;
        r->free_toks[r->n_free++] = t;
    }
}

static int32_t tok_new(ref *r)
{
    int32_t t;
    if (r->n_free > 0) {
        t = r->free_toks[--r->n_free];
    } else {
        if (r->n_toks == r->cap_toks) {
            r->cap_toks = r->cap_toks ? 2 * r->cap_toks : 256;
            r->toks = realloc(r->toks, (size_t)r->cap_toks * sizeof(ref_token));
            r->free_toks = realloc(r->free_toks, (size_t)r->cap_toks * sizeof(int32_t));
            if (!r->toks || !r->free_toks) abort();
        }
        t = r->n_toks++;
    }
    ref_token *k = &r->toks[t];
    k->refs = 0;
    k->stamp = r->next_stamp++;
    k->k = malloc(r->k_floats * sizeof(float));
    k->v = malloc(r->v_floats * sizeof(float));
    k->ik = malloc(r->ik_floats * sizeof(float));
    if (!k->k || !k->v || !k->ik) abort();
    for (size_t i = 0; i < r->k_floats; i++) k->k[i] = (float)(base_rng_uniform(&r->data) * 2 - 1);
    for (size_t i = 0; i < r->v_floats; i++) k->v[i] = (float)(base_rng_uniform(&r->data) * 2 - 1);
    for (size_t i = 0; i < r->ik_floats; i++) k->ik[i] = (float)(base_rng_uniform(&r->idata) * 2 - 1);
    return t;
}

/* A copy of token t (same K/V, no draw from the data stream), refs 0. */
static int32_t tok_clone(ref *r, int32_t t)
{
    int32_t c;
    if (r->n_free > 0) {
        c = r->free_toks[--r->n_free];
    } else {
        if (r->n_toks == r->cap_toks) {
            r->cap_toks = r->cap_toks ? 2 * r->cap_toks : 256;
            r->toks = realloc(r->toks, (size_t)r->cap_toks * sizeof(ref_token));
            r->free_toks = realloc(r->free_toks, (size_t)r->cap_toks * sizeof(int32_t));
            if (!r->toks || !r->free_toks) abort();
        }
        c = r->n_toks++;
    }
    ref_token *k = &r->toks[c];
    k->refs = 0;
    k->stamp = r->toks[t].stamp;
    k->k = malloc(r->k_floats * sizeof(float));
    k->v = malloc(r->v_floats * sizeof(float));
    k->ik = malloc(r->ik_floats * sizeof(float));
    if (!k->k || !k->v || !k->ik) abort();
    memcpy(k->k, r->toks[t].k, r->k_floats * sizeof(float));
    memcpy(k->v, r->toks[t].v, r->v_floats * sizeof(float));
    memcpy(k->ik, r->toks[t].ik, r->ik_floats * sizeof(float));
    return c;
}

static void ref_init(ref *r, const ref_cfg *rc, keel_mem *mem, uint64_t data_seed)
{
    memset(r, 0, sizeof *r);
    r->rc = *rc;
    r->rc.mc.layers = r->rc.layers;
    r->n_groups = keel_mem_n_groups(mem);
    for (int32_t l = 0; l < rc->mc.n_layers; l++) {
        const keel_mem_layer *L = &rc->layers[l];
        int32_t g = keel_mem_layer_group(mem, l);
        r->layer_group[l] = g;
        if (g >= 0) {
            r->groups[g].sliding = L->kind == KEEL_MEM_LAYER_SLIDING;
            r->groups[g].window = L->window;
            r->groups[g].n_sink = L->n_sink;
        }
        r->k_off[l] = r->k_floats;
        r->v_off[l] = r->v_floats;
        r->ik_off[l] = r->ik_floats;
        if (g >= 0) {
            r->k_floats += (size_t)L->n_kv_heads * (size_t)L->head_dim_k;
            r->v_floats += (size_t)L->n_kv_heads * (size_t)L->head_dim_v;
            r->ik_floats += (size_t)L->idx_head_dim;
        }
    }
    if (r->k_floats == 0) r->k_floats = 1;
    if (r->v_floats == 0) r->v_floats = 1;
    if (r->ik_floats == 0) r->ik_floats = 1;
    r->next_stamp = 1;
    base_rng_seed(&r->data, data_seed);
    base_rng_seed(&r->idata, data_seed ^ 0x1d7);
    r->rs = keel_mem_is_recurrent(mem);
    r->n_slots = rc->mc.n_rs_slots > 0 ? rc->mc.n_rs_slots : rc->mc.n_seq_max;
    r->n_ckpt = rc->mc.n_ckpt; /* recurrent, or ring rows of an attention memory */
    for (int32_t q = 0; q < REF_MAX_SEQ; q++) {
        r->rs_lo[q] = r->rs_hi[q] = -1;
        r->rs_id[q] = -1;
    }
}

static void ref_free(ref *r)
{
    for (int32_t t = 0; t < r->n_toks; t++) {
        free(r->toks[t].k);
        free(r->toks[t].v);
        free(r->toks[t].ik);
    }
    free(r->toks);
    free(r->free_toks);
    for (int s = 0; s < REF_MAX_SEQ; s++) {
        for (int g = 0; g < REF_MAX_LAYERS; g++) {
            free(r->lists[s][g].e);
            free(r->forg[s][g].p);
        }
        free(r->hist[s].st);
        for (int i = 0; i < REF_MAX_CKPT; i++)
            for (int g = 0; g < REF_MAX_LAYERS; g++) {
                free(r->ck[s][i].ring[g].e);
                free(r->ck[s][i].forg[g].p);
            }
    }
}

static bool key_less(int32_t p, uint64_t st, int32_t q, uint64_t su)
{
    return p < q || (p == q && st < su);
}

/* The n_sink-th lowest (pos, stamp) of a list counting duplicates (a cell
 * copied into a stream twice is two cells), or pos -1. O(n^2). */
static void sink_threshold(const ref *r, const ref_list *l, int32_t n_sink, int32_t *tp,
                           uint64_t *ts)
{
    *tp = -1;
    *ts = 0;
    if (n_sink == 0 || l->n == 0) return;
    int32_t k = n_sink < l->n ? n_sink : l->n;
    /* the entry with exactly k-1 entries strictly below it... or ties */
    for (int32_t i = 0; i < l->n; i++) {
        int32_t p = l->e[i].pos;
        uint64_t st = r->toks[l->e[i].tok].stamp;
        int32_t below = 0, equal = 0;
        for (int32_t j = 0; j < l->n; j++) {
            int32_t q = l->e[j].pos;
            uint64_t su = r->toks[l->e[j].tok].stamp;
            if (key_less(q, su, p, st))
                below++;
            else if (q == p && su == st)
                equal++;
        }
        if (below < k && below + equal >= k) {
            *tp = p;
            *ts = st;
            return;
        }
    }
}

static int32_t ref_lists_max(const ref *r, int32_t s)
{
    int32_t mx = -1;
    for (int32_t g = 0; g < r->n_groups; g++)
        for (int32_t i = 0; i < r->lists[s][g].n; i++)
            if (r->lists[s][g].e[i].pos > mx) mx = r->lists[s][g].e[i].pos;
    return mx;
}

static int32_t ref_lists_min(const ref *r, int32_t s)
{
    int32_t mn = -1;
    for (int32_t g = 0; g < r->n_groups; g++)
        for (int32_t i = 0; i < r->lists[s][g].n; i++)
            if (mn < 0 || r->lists[s][g].e[i].pos < mn) mn = r->lists[s][g].e[i].pos;
    return mn;
}

static int32_t ref_pos_max(const ref *r, int32_t s)
{
    int32_t mx = ref_lists_max(r, s);
    if (r->rs && r->rs_hi[s] > mx) mx = r->rs_hi[s];
    return mx;
}

static bool ref_seq_empty(const ref *r, int32_t s)
{
    if (r->rs && r->hist[s].n) return false;
    for (int32_t g = 0; g < r->n_groups; g++)
        if (r->lists[s][g].n) return false;
    return true;
}

/* ---- the recurrent half of the reference ----------------------------------- */

static void hist_push(ref_hist *h, uint64_t st)
{
    if (h->n == h->cap) {
        h->cap = h->cap ? 2 * h->cap : 64;
        h->st = realloc(h->st, (size_t)h->cap * sizeof(uint64_t));
        if (!h->st) abort();
    }
    h->st[h->n++] = st;
}

/* The toy recurrence of layer l for the token of stamp st: a causal conv
 * over the last conv_kernel inputs, then a decaying state fed by the conv's
 * output. Driver and reference run exactly these float operations. */
static void rs_update(const keel_mem_recurrent *R, int32_t l, uint64_t st, float *conv, float *state)
{
    float u[8], o[8];
    base_rng g;
    base_rng_seed(&g, st * 131 + (uint64_t)l);
    int32_t C = R->conv_channels, K = R->conv_kernel;
    for (int32_t c = 0; c < C; c++) {
        u[c] = (float)(base_rng_uniform(&g) * 2 - 1);
        o[c] = u[c];
        for (int32_t k = 0; k < K - 1; k++) o[c] += conv[(size_t)k * (size_t)C + (size_t)c] * 0.25f * (float)(k + 1);
    }
    for (int32_t k = 0; k + 1 < K - 1; k++)
        for (int32_t c = 0; c < C; c++) conv[(size_t)k * (size_t)C + (size_t)c] = conv[(size_t)(k + 1) * (size_t)C + (size_t)c];
    if (K > 1)
        for (int32_t c = 0; c < C; c++) conv[(size_t)(K - 2) * (size_t)C + (size_t)c] = u[c];
    for (int64_t j = 0; j < R->state_floats; j++) state[j] = 0.5f * state[j] + o[j % C];
}

static void ref_ck_free(ref *r, ref_ckpt *c)
{
    for (int32_t g = 0; g < r->n_groups; g++) {
        for (int32_t i = 0; i < c->ring[g].n; i++) tok_unref(r, c->ring[g].e[i].tok);
        c->ring[g].n = 0;
        c->forg[g].n = 0;
    }
}

/* Drops s's checkpoints covering positions >= above (above < 0: all). */
static void ref_ck_drop(ref *r, int32_t s, int32_t above)
{
    int32_t w = 0;
    for (int32_t i = 0; i < r->n_ck[s]; i++) {
        if (above < 0 || r->ck[s][i].pos > above) {
            ref_ck_free(r, &r->ck[s][i]);
            continue;
        }
        if (w != i) { /* move, keeping the arrays' storage with the slot */
            ref_ckpt tmp = r->ck[s][w];
            r->ck[s][w] = r->ck[s][i];
            r->ck[s][i] = tmp;
        }
        w++;
    }
    r->n_ck[s] = w;
}

static void ref_rs_drop(ref *r, int32_t s)
{
    r->hist[s].n = 0;
    r->rs_lo[s] = r->rs_hi[s] = -1;
    r->rs_id[s] = -1;
    ref_ck_drop(r, s, -1);
}

static int32_t ref_slots_used(const ref *r)
{
    int32_t n = 0;
    for (int32_t q = 0; q < r->rc.mc.n_seq_max; q++) {
        if (!r->hist[q].n) continue;
        bool first = true;
        for (int32_t p = 0; p < q; p++) first &= !(r->hist[p].n && r->rs_id[p] == r->rs_id[q]);
        n += first;
    }
    return n;
}

static bool ref_shared(const ref *r, int32_t s)
{
    for (int32_t q = 0; q < r->rc.mc.n_seq_max; q++)
        if (q != s && r->hist[q].n && r->rs_id[q] == r->rs_id[s]) return true;
    return false;
}

/* The newest checkpoint of s at or before p0, or -1. */
static int32_t ref_ck_find(const ref *r, int32_t s, int32_t p0)
{
    int32_t best = -1;
    for (int32_t i = 0; i < r->n_ck[s]; i++)
        if (r->ck[s][i].pos <= p0 && (best < 0 || r->ck[s][i].pos > r->ck[s][best].pos)) best = i;
    return best;
}

/* RoPE in double at position p of a row of d elements (no YaRN here). */
static void ref_rope_row(const keel_rope *R, int32_t d, const float *x, double p, double *y)
{
    int32_t nr = R->type == KEEL_ROPE_NONE ? 0 : R->n_rot;
    for (int32_t i = 0; i < d; i++) y[i] = x[i];
    for (int32_t i = 0; i < nr / 2; i++) {
        double theta = p * (double)R->freq_scale *
                       pow((double)R->freq_base, -2.0 * i / (double)nr);
        double c = cos(theta), s = sin(theta);
        int32_t a = R->type == KEEL_ROPE_NEOX ? i : 2 * i;
        int32_t b = R->type == KEEL_ROPE_NEOX ? i + nr / 2 : 2 * i + 1;
        double x0 = x[a], x1 = x[b];
        y[a] = x0 * c - x1 * s;
        y[b] = x0 * s + x1 * c;
    }
}

/* The layer's K RoPE. */
static void ref_rope(const keel_mem_layer *L, const float *x, double p, double *y)
{
    ref_rope_row(&L->rope, L->head_dim_k, x, p, y);
}

/* ---- the driver ----------------------------------------------------------- */

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

static void note(driver *d, const char *fmt, ...) BASE_PRINTF(2, 3);
static void note(driver *d, const char *fmt, ...)
{
    if (!d->log) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(d->log, "step %lld: ", (long long)d->step);
    vfprintf(d->log, fmt, ap);
    fputc('\n', d->log);
    va_end(ap);
}

#define TRACE(...) do { if (d->trace) note(d, __VA_ARGS__); } while (0)

/* Recomputes every sequence's recurrent state from its history and
 * compares it bitwise with the memory's. */
static void check_states(driver *d, const char *after)
{
    const ref *r = &d->r;
    const keel_mem *m = d->mem;
    for (int32_t s = 0; s < r->rc.mc.n_seq_max; s++) {
        int32_t k = m->seq_slot[s];
        int32_t want_min = r->n_groups > 0 ? ref_lists_min(r, s) : r->hist[s].n ? r->rs_lo[s] : -1;
        if ((k >= 0) != (r->hist[s].n > 0) || keel_mem_seq_pos_max(m, s) != ref_pos_max(r, s) ||
            keel_mem_seq_pos_min(m, s) != want_min || m->rs_pos_min[s] != r->rs_lo[s] ||
            m->rs_pos_max[s] != r->rs_hi[s]) {
            d->res->invariant_failures++;
            note(d, "after %s: seq %d: memory slot %d span %d..%d, reference %d tokens span %d..%d",
                 after, s, k, keel_mem_seq_pos_min(m, s), keel_mem_seq_pos_max(m, s),
                 r->hist[s].n, r->rs_lo[s], r->rs_hi[s]);
            continue;
        }
        if (k < 0) continue;
        for (int32_t l = 0; l < r->rc.mc.n_layers; l++) {
            const keel_mem_layer *L = &r->rc.layers[l];
            if (L->kind != KEEL_MEM_LAYER_RECURRENT) continue;
            int32_t ri = m->layer_rs[l];
            size_t nc = (size_t)(L->rs.conv_kernel - 1) * (size_t)L->rs.conv_channels;
            float conv[64], st[16];
            memset(conv, 0, sizeof conv);
            memset(st, 0, sizeof st);
            for (int32_t i = 0; i < r->hist[s].n; i++) rs_update(&L->rs, l, r->hist[s].st[i], conv, st);
            const float *base = m->rs_data + (size_t)k * m->rs_slot_floats;
            if (memcmp(conv, base + m->rs_conv_off[ri], nc * sizeof(float)) != 0 ||
                memcmp(st, base + m->rs_state_off[ri], (size_t)L->rs.state_floats * sizeof(float)) != 0) {
                d->res->divergences++;
                note(d, "after %s: seq %d layer %d: recurrent state differs from the recomputation "
                     "over its %d tokens", after, s, l, r->hist[s].n);
            }
        }
    }
}

static void check_invariants(driver *d, const char *after)
{
    const ref *r = &d->r;
    if (r->rs) {
        check_states(d, after);
        for (int32_t s = 0; s < r->rc.mc.n_seq_max; s++) {
            int32_t want = 0;
            if (r->hist[s].n) {
                want = r->rs_hi[s] + 1;
                for (int32_t i = 0; i < r->n_ck[s]; i++) want = BASE_MIN(want, r->ck[s][i].pos);
                want = BASE_MAX(want, r->exact[s]);
            }
            int32_t got = keel_mem_seq_rewind_min(d->mem, s);
            keel_mem_ckpt_info info[REF_MAX_CKPT + 1];
            int32_t n = 0;
            keel_mem_ckpt_list(d->mem, s, info, REF_MAX_CKPT + 1, &n);
            bool same = n == r->n_ck[s];
            for (int32_t i = 0; same && i < n; i++)
                same = info[i].pos == r->ck[s][i].pos && info[i].pos_min == r->ck[s][i].pos_min;
            if (got != want || !same) {
                d->res->invariant_failures++;
                note(d, "after %s: seq %d rewind_min %d (reference %d), %d checkpoints (reference %d)",
                     after, s, got, want, n, r->n_ck[s]);
            }
        }
    }
    for (int32_t s = 0; s < r->rc.mc.n_seq_max && !r->rs && r->n_ckpt > 0; s++) {
        /* an attention memory's checkpoints (ring rows) */
        keel_mem_ckpt_info info[REF_MAX_CKPT + 1];
        int32_t n = 0;
        keel_mem_ckpt_list(d->mem, s, info, REF_MAX_CKPT + 1, &n);
        bool same = n == r->n_ck[s];
        for (int32_t i = 0; same && i < n; i++)
            same = info[i].pos == r->ck[s][i].pos && info[i].pos_min == r->ck[s][i].pos_min;
        if (!same) {
            d->res->invariant_failures++;
            note(d, "after %s: seq %d has %d checkpoints (first at %d), the reference %d (first at %d)", after, s, n,
                 n ? info[0].pos : -1, r->n_ck[s], r->n_ck[s] ? r->ck[s][0].pos : -1);
        }
    }
    for (int32_t s = 0; s < r->rc.mc.n_seq_max && !r->rs; s++) {
        int64_t bound = r->exact[s];
        for (int32_t g = 0; g < r->n_groups; g++)
            if (r->groups[g].sliding)
                for (int32_t i = 0; i < r->forg[s][g].n; i++)
                    bound = BASE_MAX(bound, (int64_t)r->forg[s][g].p[i] + r->groups[g].window);
        if (bound > INT32_MAX) bound = INT32_MAX;
        int32_t got = keel_mem_seq_rewind_min(d->mem, s);
        if (got < bound) {
            d->res->invariant_failures++;
            note(d, "after %s: seq %d rewind_min %d below the reference's exact bound %lld", after,
                 s, got, (long long)bound);
        }
    }
    keel_status st = keel_mem_check(d->mem);
    if (st != KEEL_OK) {
        d->res->invariant_failures++;
        note(d, "invariant failure after %s: %s", after, keel_mem_last_error(d->mem));
    }
    keel_mem_stats ms;
    keel_mem_stats_get(d->mem, &ms);
    if (ms.cells_used > ms.cells_cap) {
        d->res->invariant_failures++;
        note(d, "cells_used %lld > cap %lld", (long long)ms.cells_used, (long long)ms.cells_cap);
    }
}

/* A refused operation must leave the memory byte-identical. */
static void refused(driver *d, uint64_t before, keel_status st, const char *what)
{
    d->res->refused++;
    if (keel_mem_digest(d->mem) != before) {
        d->res->invariant_failures++;
        note(d, "%s refused with %s but changed the memory", what, keel_status_name(st));
    }
}

static void expect_status(driver *d, keel_status got, keel_status want, const char *what)
{
    if (got != want) {
        d->res->invariant_failures++;
        note(d, "%s returned %s, want %s (%s)", what, keel_status_name(got), keel_status_name(want),
             keel_mem_last_error(d->mem));
    }
}

/* Writes K (RoPE'd at pos) and V of token tok for every layer at cells. */
static void write_token_rows(driver *d, int32_t n, const int32_t *toks, const int32_t *pos)
{
    const ref_cfg *rc = &d->r.rc;
    for (int32_t l = 0; l < rc->mc.n_layers; l++) {
        int32_t g = d->r.layer_group[l];
        if (g < 0) continue;
        const keel_mem_layer *L = &rc->layers[l];
        size_t kn = (size_t)L->n_kv_heads * (size_t)L->head_dim_k;
        size_t vn = (size_t)L->n_kv_heads * (size_t)L->head_dim_v;
        for (int32_t i = 0; i < n; i++) {
            const ref_token *t = &d->r.toks[toks[i]];
            for (int32_t h = 0; h < L->n_kv_heads; h++) {
                ref_rope(L, t->k + d->r.k_off[l] + (size_t)h * (size_t)L->head_dim_k, pos[i], d->dk);
                for (int32_t j = 0; j < L->head_dim_k; j++)
                    d->kbuf[(size_t)i * kn + (size_t)h * (size_t)L->head_dim_k + (size_t)j] = (float)d->dk[j];
            }
            memcpy(d->vbuf + (size_t)i * vn, t->v + d->r.v_off[l], vn * sizeof(float));
            if (L->idx_head_dim > 0) {
                ref_rope_row(&L->idx_rope, L->idx_head_dim, t->ik + d->r.ik_off[l], pos[i], d->dk);
                for (int32_t j = 0; j < L->idx_head_dim; j++)
                    d->ibuf[(size_t)i * (size_t)L->idx_head_dim + (size_t)j] = (float)d->dk[j];
            }
        }
        keel_status st = keel_mem_write_kvi(d->mem, l, n, d->cells + (size_t)g * (size_t)n, d->kbuf, d->vbuf,
                                            L->idx_head_dim > 0 ? d->ibuf : NULL);
        expect_status(d, st, KEEL_OK, "write");
    }
}

static void ref_rm(ref *r, int32_t s, int32_t p0, int32_t p1);

/* Removes every token of s (s < 0: of every sequence), both halves. */
static void ref_rm_all(ref *r, int32_t s)
{
    ref_rm(r, s, -1, -1);
    for (int32_t q = 0; q < r->rc.mc.n_seq_max; q++) {
        if (s >= 0 && q != s) continue;
        if (r->rs)
            ref_rs_drop(r, q);
        else
            ref_ck_drop(r, q, -1);
    }
}

/* Slots a batch needs that are not free: placement's KEEL_EFULL of the
 * recurrent half is legitimate exactly then. A new sequence needs one; the
 * sharers of a state (forks) in the batch need min(sharers in the batch,
 * sharers - 1): the last of them placed keeps the shared slot. */
static bool rs_slots_short(const ref *r, int32_t n, const int32_t *seq)
{
    if (!r->rs) return false;
    bool seen[REF_MAX_SEQ] = {false};
    int32_t need = 0, ns = r->rc.mc.n_seq_max;
    for (int32_t i = 0; i < n; i++) seen[seq[i]] = true;
    for (int32_t s = 0; s < ns; s++) {
        if (!seen[s]) continue;
        if (r->hist[s].n == 0) {
            need++;
            continue;
        }
        bool first = true;
        int32_t in = 0, all = 0;
        for (int32_t q = 0; q < ns; q++) {
            if (!r->hist[q].n || r->rs_id[q] != r->rs_id[s]) continue;
            all++;
            if (!seen[q]) continue;
            in++;
            first &= q >= s;
        }
        if (first) need += in < all - 1 ? in : all - 1;
    }
    return need > r->n_slots - ref_slots_used(r);
}

/* A refused placement is legitimate only where a full-attention table (or a
 * ring clipped to n_ctx, smaller than n_seq * (n_sink + window) + n_batch)
 * of a stream the batch uses has fewer free cells than the batch needs: a
 * ring of full size always makes room (docs/memory.md). */
static bool place_full_ok(driver *d, int32_t n, const int32_t *seq, bool multi)
{
    const keel_mem *m = d->mem;
    const keel_mem_config *mc = &d->r.rc.mc;
    for (int32_t k = 0; k < m->n_streams; k++) {
        int32_t need = 0;
        for (int32_t i = 0; i < n; i++) need += m->n_streams == 1 || (!multi && seq[i] == k);
        if (need == 0) continue;
        for (int32_t g = 0; g < m->n_groups; g++) {
            const mem_table *t = &m->groups[g].tables[k];
            int64_t seqs = m->n_streams == 1 ? mc->n_seq_max : 1;
            int64_t ring = seqs * ((int64_t)t->n_sink + t->window) + mc->n_batch_max;
            bool can_fail = !t->sliding || t->cap < ring;
            if (can_fail && t->cap - t->n_used < need) return true;
        }
    }
    return false;
}

static void op_place(driver *d)
{
    ref *r = &d->r;
    const keel_mem_config *mc = &r->rc.mc;
    int32_t n = 1 + (int32_t)pick(&d->ch, (uint32_t)mc->n_batch_max);
    int32_t pos[REF_MAX_BATCH], seq[REF_MAX_BATCH], nseq[REF_MAX_BATCH], toks[REF_MAX_BATCH];
    int32_t sets[REF_MAX_BATCH][REF_MAX_SEQ];
    const int32_t *setp[REF_MAX_BATCH];
    int32_t next[REF_MAX_SEQ];
    /* recurrent histories stay short (the recomputation checks them all) */
    for (int32_t s = 0; r->rs && s < mc->n_seq_max; s++)
        if (r->hist[s].n > 160) {
            expect_status(d, keel_mem_seq_rm(d->mem, s, -1, -1), KEEL_OK, "seq_rm (long history)");
            ref_rm_all(r, s);
        }
    for (int32_t s = 0; s < mc->n_seq_max; s++) {
        int32_t pm = ref_pos_max(r, s);
        next[s] = pm >= 0 ? pm + 1 : (int32_t)pick(&d->ch, 5);
    }
    /* shared tokens: sequences with the same next position (unified only;
     * recurrent states are per sequence) */
    bool multi = mc->unified && mc->n_seq_max > 1 && !r->rs && chance(&d->ch, 25) && d->only_seq < 0;
    for (int32_t i = 0; i < n; i++) {
        int32_t s = (int32_t)pick(&d->ch, (uint32_t)mc->n_seq_max);
        if (chance(&d->ch, 60) && i > 0) s = seq[i - 1];
        if (d->only_seq >= 0) s = d->only_seq;
        seq[i] = s;
        pos[i] = next[s];
        nseq[i] = 1;
        sets[i][0] = s;
        if (multi) {
            for (int32_t t = 0; t < mc->n_seq_max; t++)
                if (t != s && next[t] == next[s] && chance(&d->ch, 50)) sets[i][nseq[i]++] = t;
        }
        for (int32_t j = 0; j < nseq[i]; j++) next[sets[i][j]]++;
        setp[i] = sets[i];
    }
    uint8_t prot[REF_MAX_BATCH];
    for (int32_t i = 0; i < n; i++) prot[i] = chance(&d->ch, 10);
    keel_mem_batch b = {n, pos, NULL, nseq, setp, prot};
    if (!multi) {
        b.seq_id1 = seq;
        b.n_seq_id = NULL;
        b.seq_id = NULL;
    }
    uint64_t before = keel_mem_digest(d->mem);
    keel_status st = keel_mem_place(d->mem, &b, d->cells);
    TRACE("place n=%d first seq %d pos %d .. last seq %d pos %d multi %d -> %s", n, seq[0], pos[0],
          seq[n - 1], pos[n - 1], multi, keel_status_name(st));
    if (st != KEEL_OK) {
        if (st != KEEL_EFULL) expect_status(d, st, KEEL_EFULL, "place");
        else if (!place_full_ok(d, n, seq, multi) && !rs_slots_short(r, n, seq)) {
            d->res->invariant_failures++;
            note(d, "place refused with KEEL_EFULL although only rings lacked room (%s)",
                 keel_mem_last_error(d->mem));
            if (getenv("MEMREF_DUMP"))
                for (int32_t g = 0; g < d->mem->n_groups; g++)
                    for (int32_t k = 0; k < d->mem->groups[g].n_tables; k++) {
                        const mem_table *t = &d->mem->groups[g].tables[k];
                        fprintf(stderr, "group %d table %d cap %d window %d sinks %d:", g, k, t->cap, t->window, t->n_sink);
                        for (int32_t c = 0; c < t->cap; c++)
                            if (t->pos[c] >= 0) fprintf(stderr, " %d/%llu/%llx", t->pos[c], (unsigned long long)t->stamp[c], (unsigned long long)t->seq[(size_t)c * (size_t)t->seq_words]);
                        fprintf(stderr, "\n");
                    }
        }
        refused(d, before, st, "place");
        /* make room: drop a random sequence */
        int32_t victim = (int32_t)pick(&d->ch, (uint32_t)mc->n_seq_max);
        keel_status st2 = keel_mem_seq_rm(d->mem, victim, -1, -1);
        expect_status(d, st2, KEEL_OK, "seq_rm (room)");
        if (st2 == KEEL_OK) ref_rm_all(r, victim);
        return;
    }
    if (r->rs && rs_slots_short(r, n, seq)) {
        d->res->invariant_failures++;
        note(d, "place succeeded although the recurrent state slots were short");
    }
    /* reference: forget in sliding groups, then append */
    int32_t first[REF_MAX_SEQ];
    for (int32_t s = 0; s < REF_MAX_SEQ; s++) first[s] = -1;
    for (int32_t i = 0; i < n; i++)
        for (int32_t j = 0; j < nseq[i]; j++)
            if (first[sets[i][j]] < 0) first[sets[i][j]] = pos[i];
    /* Ring retention (mem.c ring_keep_from): sinks stay; a placed sequence
     * forgets entries at positions <= first - window; then every sequence
     * of a ring the batch touches (all of them when unified) keeps at most
     * `window` other entries, the newest by stamp, a tie at the cut keeping
     * none of the tied. */
    for (int32_t g = 0; g < r->n_groups; g++) {
        if (!r->groups[g].sliding) continue;
        int32_t window = r->groups[g].window;
        for (int32_t s = 0; s < mc->n_seq_max; s++) {
            if (first[s] < 0 && !mc->unified) continue;
            ref_list *l = &r->lists[s][g];
            if (l->n == 0) continue;
            int32_t tp;
            uint64_t tsm;
            sink_threshold(r, l, r->groups[g].n_sink, &tp, &tsm);
            uint64_t *stv = malloc((size_t)l->n * sizeof(uint64_t));
            uint8_t *sk = malloc((size_t)l->n);
            if (!stv || !sk) abort();
            int32_t ns = 0;
            for (int32_t i = 0; i < l->n; i++) {
                ref_entry e = l->e[i];
                sk[i] = tp >= 0 && !key_less(tp, tsm, e.pos, r->toks[e.tok].stamp);
                bool by_pos = first[s] >= 0 && (int64_t)e.pos <= (int64_t)first[s] - window;
                if (!sk[i] && by_pos) sk[i] = 2; /* forgotten by position */
                if (!sk[i]) stv[ns++] = r->toks[e.tok].stamp;
            }
            uint64_t keep_from = 0;
            if (ns > window) {
                /* descending (insertion sort: lists are small) */
                for (int32_t i = 1; i < ns; i++)
                    for (int32_t j = i; j > 0 && stv[j] > stv[j - 1]; j--) {
                        uint64_t x = stv[j];
                        stv[j] = stv[j - 1];
                        stv[j - 1] = x;
                    }
                int32_t k = window;
                while (k > 0 && stv[k - 1] == stv[k]) k--;
                keep_from = k > 0 ? stv[k - 1] : stv[0] + 1;
            }
            int32_t w = 0;
            for (int32_t i = 0; i < l->n; i++) {
                ref_entry e = l->e[i];
                bool keep = sk[i] == 1 || (sk[i] == 0 && r->toks[e.tok].stamp >= keep_from);
                if (keep) {
                    l->e[w++] = e;
                } else {
                    plist_push(&r->forg[s][g], e.pos);
                    tok_unref(r, e.tok);
                }
            }
            l->n = w;
            free(stv);
            free(sk);
        }
    }
    for (int32_t i = 0; i < n; i++) {
        toks[i] = tok_new(r);
        int64_t inst = r->next_inst;
        r->next_inst += r->n_groups;
        for (int32_t j = 0; j < nseq[i]; j++)
            for (int32_t g = 0; g < r->n_groups; g++) {
                ref_entry e = {toks[i], pos[i], 0, inst + g};
                list_push(&r->lists[sets[i][j]][g], e);
                r->toks[toks[i]].refs++;
            }
        if (r->toks[toks[i]].refs == 0) { /* no groups: keep bookkeeping simple */
            r->toks[toks[i]].refs = 1;
            tok_unref(r, toks[i]);
        }
    }
    write_token_rows(d, n, toks, pos);
    if (r->rs) {
        /* the recurrent half: slots made exclusive by the placement; the
         * driver runs the recurrence token by token, the reference records
         * the history */
        bool seen[REF_MAX_SEQ] = {false};
        for (int32_t i = 0; i < n; i++) {
            int32_t s = seq[i];
            if (!seen[s]) {
                seen[s] = true;
                if (r->hist[s].n == 0) r->rs_lo[s] = pos[i];
                if (r->hist[s].n == 0 || ref_shared(r, s)) r->rs_id[s] = r->next_rs_id++;
            }
            uint64_t stp = r->toks[toks[i]].stamp;
            hist_push(&r->hist[s], stp);
            r->rs_hi[s] = pos[i];
            r->rs_last[s] = stp;
            for (int32_t l = 0; l < mc->n_layers; l++) {
                const keel_mem_layer *L = &r->rc.layers[l];
                if (L->kind != KEEL_MEM_LAYER_RECURRENT) continue;
                float *conv = NULL, *state = NULL;
                keel_status st3 = keel_mem_rs_state(d->mem, l, s, &conv, &state);
                expect_status(d, st3, KEEL_OK, "rs_state");
                if (st3 != KEEL_OK) continue;
                float dummy[1] = {0};
                rs_update(&L->rs, l, stp, conv ? conv : dummy, state);
            }
        }
    }
    d->res->tokens_placed += n;
    for (int32_t i = 0; i < r->n_groups * n; i++)
        if (d->cells[i] > d->res->max_cell) d->res->max_cell = d->cells[i];
}

static void ref_rm(ref *r, int32_t s, int32_t p0, int32_t p1)
{
    if (p0 < 0) p0 = 0;
    if (p1 < 0) p1 = INT32_MAX;
    for (int32_t q = 0; q < r->rc.mc.n_seq_max; q++) {
        if (s >= 0 && q != s) continue;
        for (int32_t g = 0; g < r->n_groups; g++) {
            ref_list *l = &r->lists[q][g];
            int32_t w = 0;
            for (int32_t i = 0; i < l->n; i++) {
                if (l->e[i].pos >= p0 && l->e[i].pos < p1)
                    tok_unref(r, l->e[i].tok);
                else
                    l->e[w++] = l->e[i];
            }
            l->n = w;
            ref_plist *f = &r->forg[q][g];
            w = 0;
            for (int32_t i = 0; i < f->n; i++)
                if (f->p[i] < p0 || f->p[i] >= p1) f->p[w++] = f->p[i];
            f->n = w;
        }
        if (ref_lists_max(r, q) < 0) { /* emptied: starts over */
            r->exact[q] = 0;
            for (int32_t g = 0; g < r->n_groups; g++) r->forg[q][g].n = 0;
        }
    }
}

/* Room the memory's restore needs in s's rings (clipped rings may lack it). */
static bool ring_room_short(driver *d, int32_t s, const ref_ckpt *c)
{
    const keel_mem *m = d->mem;
    for (int32_t g = 0; g < d->r.n_groups; g++) {
        if (!d->r.groups[g].sliding) continue;
        const mem_table *t = &m->groups[g].tables[m->n_streams == 1 ? 0 : s];
        int32_t avail = t->cap - t->n_used;
        for (int32_t cc = 0; cc < t->cap; cc++)
            if (t->pos[cc] >= 0 && mem_seq_has(t, cc, s) && mem_seq_count(t, cc) == 1) avail++;
        if (avail < c->ring[g].n) return true;
    }
    return false;
}

/* Restores checkpoint i of s in the reference. */
static void ref_restore(ref *r, int32_t s, int32_t i)
{
    ref_ckpt *c = &r->ck[s][i];
    ref_rm(r, s, c->pos, -1);
    for (int32_t g = 0; g < r->n_groups; g++) {
        if (!r->groups[g].sliding) continue;
        ref_list *l = &r->lists[s][g];
        for (int32_t j = 0; j < l->n; j++) tok_unref(r, l->e[j].tok);
        l->n = 0;
        for (int32_t j = 0; j < c->ring[g].n; j++) {
            ref_entry e = c->ring[g].e[j];
            e.inst = r->next_inst++;
            list_push(l, e);
            r->toks[e.tok].refs++;
        }
        r->forg[s][g].n = 0;
        for (int32_t j = 0; j < c->forg[g].n; j++) plist_push(&r->forg[s][g], c->forg[g].p[j]);
    }
    r->hist[s].n = c->hist_n;
    r->rs_hi[s] = c->pos - 1;
    r->rs_last[s] = c->stamp;
    r->rs_id[s] = r->next_rs_id++;
    ref_ck_drop(r, s, c->pos);
}

/* seq_rm on a recurrent configuration: the reference predicts nothing,
 * everything, a restore, or a refusal, and checks the memory did that. */
static void op_rm_rs(driver *d, int32_t s, int32_t p0, int32_t p1, keel_status st, uint64_t before)
{
    ref *r = &d->r;
    int32_t a = p0 < 0 ? 0 : p0, b = p1 < 0 ? INT32_MAX : p1;
    keel_status want = KEEL_OK;
    int32_t restore_seq = -1, restore_ck = -1;
    for (int32_t q = 0; q < r->rc.mc.n_seq_max && want == KEEL_OK; q++) {
        if ((s >= 0 && q != s) || r->hist[q].n == 0) continue;
        int32_t lo = r->rs_lo[q], hi = r->rs_hi[q];
        if (b <= lo || a > hi || (a <= lo && b > hi)) continue;
        if (b <= hi || s < 0) {
            want = KEEL_ESTATE;
            break;
        }
        int32_t i = ref_ck_find(r, q, a);
        if (i < 0) {
            want = KEEL_ESTATE;
        } else if ((ref_shared(r, q) && ref_slots_used(r) >= r->n_slots) ||
                   ring_room_short(d, q, &r->ck[q][i])) {
            want = KEEL_EFULL;
        } else {
            restore_seq = q;
            restore_ck = i;
        }
    }
    if (st != want) {
        expect_status(d, st, want, "seq_rm (recurrent)");
        if (st != KEEL_OK) refused(d, before, st, "seq_rm");
        /* resynchronize: drop the sequence in both */
        int32_t v = s < 0 ? -1 : s;
        expect_status(d, keel_mem_seq_rm(d->mem, v, -1, -1), KEEL_OK, "seq_rm (resync)");
        ref_rm_all(r, v);
        return;
    }
    if (st != KEEL_OK) {
        if (st == KEEL_ESTATE) d->res->rs_refused++;
        refused(d, before, st, "seq_rm");
        return;
    }
    if (restore_seq >= 0) {
        d->res->rs_restores++;
        int32_t at = r->ck[restore_seq][restore_ck].pos;
        ref_restore(r, restore_seq, restore_ck);
        if (keel_mem_seq_pos_max(d->mem, restore_seq) != at - 1) {
            d->res->invariant_failures++;
            note(d, "seq_rm restored sequence %d to end at %d, reference checkpoint at %d",
                 restore_seq, keel_mem_seq_pos_max(d->mem, restore_seq), at);
        }
        return;
    }
    ref_rm(r, s, p0, p1);
    for (int32_t q = 0; q < r->rc.mc.n_seq_max; q++)
        if ((s < 0 || q == s) && r->hist[q].n && a <= r->rs_lo[q] && b > r->rs_hi[q]) ref_rs_drop(r, q);
}

static void op_rm(driver *d)
{
    ref *r = &d->r;
    int32_t ns = r->rc.mc.n_seq_max;
    int32_t s = chance(&d->ch, 10) ? -1 : (int32_t)pick(&d->ch, (uint32_t)ns);
    int32_t pm = s >= 0 ? ref_pos_max(r, s) : 64;
    int32_t p0 = chance(&d->ch, 20) ? -1 : (int32_t)pick(&d->ch, (uint32_t)(pm + 2));
    int32_t p1 = chance(&d->ch, 50) ? -1 : p0 + 1 + (int32_t)pick(&d->ch, 8);
    if (p0 < 0 && p1 >= 0) p1 = (int32_t)pick(&d->ch, (uint32_t)(pm + 2)) + 1;
    /* recurrent: mostly truncations near a checkpoint (the agent pattern) */
    if (r->rs && s >= 0 && r->n_ck[s] && chance(&d->ch, 60)) {
        p0 = r->ck[s][pick(&d->ch, (uint32_t)r->n_ck[s])].pos + (int32_t)pick(&d->ch, 4) - 1;
        p1 = -1;
    }
    uint64_t before = keel_mem_digest(d->mem);
    keel_status st = keel_mem_seq_rm(d->mem, s, p0, p1);
    TRACE("seq_rm %d [%d, %d) -> %s", s, p0, p1, keel_status_name(st));
    if (r->rs) {
        op_rm_rs(d, s, p0, p1, st, before);
        return;
    }
    if (st != KEEL_OK) {
        expect_status(d, st, KEEL_OK, "seq_rm");
        refused(d, before, st, "seq_rm");
        return;
    }
    ref_rm(r, s, p0, p1);
    /* an attention memory's checkpoints covering removed positions go */
    for (int32_t q = 0; q < r->rc.mc.n_seq_max; q++)
        if (s < 0 || q == s) ref_ck_drop(r, q, ref_seq_empty(r, q) ? -1 : p0 < 0 ? 0 : p0);
}

static void op_cp(driver *d)
{
    ref *r = &d->r;
    int32_t ns = r->rc.mc.n_seq_max;
    if (ns < 2) return;
    int32_t src = (int32_t)pick(&d->ch, (uint32_t)ns), dst = (int32_t)pick(&d->ch, (uint32_t)ns);
    if (src == dst) return;
    /* the common use: fork into an emptied sequence */
    if (chance(&d->ch, 70)) {
        keel_status st = keel_mem_seq_rm(d->mem, dst, -1, -1);
        expect_status(d, st, KEEL_OK, "seq_rm (fork)");
        ref_rm_all(r, dst);
    }
    int32_t pm = ref_pos_max(r, src);
    int32_t p0 = chance(&d->ch, 60) ? -1 : (int32_t)pick(&d->ch, (uint32_t)(pm + 2));
    int32_t p1 = chance(&d->ch, 60) ? -1 : (p0 < 0 ? 0 : p0) + 1 + (int32_t)pick(&d->ch, 16);
    uint64_t before = keel_mem_digest(d->mem);
    keel_status st = keel_mem_seq_cp(d->mem, src, dst, p0, p1);
    TRACE("seq_cp %d -> %d [%d, %d) -> %s", src, dst, p0, p1, keel_status_name(st));
    int32_t a = p0 < 0 ? 0 : p0, b = p1 < 0 ? INT32_MAX : p1;
    bool rs_refuse = r->rs && r->hist[src].n &&
                     (a > r->rs_lo[src] || b <= r->rs_hi[src] || r->hist[dst].n > 0);
    if (rs_refuse) {
        expect_status(d, st, KEEL_ESTATE, "seq_cp (recurrent)");
        if (st != KEEL_OK) refused(d, before, st, "seq_cp");
        else {
            expect_status(d, keel_mem_seq_rm(d->mem, dst, -1, -1), KEEL_OK, "seq_rm (resync)");
            ref_rm_all(r, dst);
        }
        return;
    }
    if (st != KEEL_OK) {
        if (st != KEEL_EFULL) expect_status(d, st, KEEL_EFULL, "seq_cp");
        refused(d, before, st, "seq_cp");
        return;
    }
    if (r->rs && r->hist[src].n) {
        for (int32_t i = 0; i < r->hist[src].n; i++) hist_push(&r->hist[dst], r->hist[src].st[i]);
        r->rs_lo[dst] = r->rs_lo[src];
        r->rs_hi[dst] = r->rs_hi[src];
        r->rs_id[dst] = r->rs_id[src];
        r->rs_last[dst] = r->rs_last[src];
    }
    if (r->exact[src] > r->exact[dst]) r->exact[dst] = r->exact[src];
    for (int32_t g = 0; g < r->n_groups; g++) {
        ref_plist *fs = &r->forg[src][g];
        for (int32_t i = 0, n0 = fs->n; i < n0; i++)
            if (fs->p[i] >= a && fs->p[i] < b) plist_push(&r->forg[dst][g], fs->p[i]);
    }
    for (int32_t g = 0; g < r->n_groups; g++) {
        ref_list *ls = &r->lists[src][g], *ld = &r->lists[dst][g];
        int32_t n0 = ls->n, n_dst = ld->n; /* dst's entries before the copy */
        for (int32_t i = 0; i < n0; i++) {
            ref_entry e = ls->e[i];
            if (e.pos < a || e.pos >= b) continue;
            /* unified: dst joins the cell unless it is in it already;
             * split streams: the cell is copied into dst's stream; either
             * way not when dst holds that token at that position already
             * (in another cell): a sequence never holds a token twice */
            bool dup = false;
            for (int32_t j = 0; j < n_dst && !dup; j++)
                dup = (r->rc.mc.unified && ld->e[j].inst == e.inst) ||
                      (ld->e[j].pos == e.pos && r->toks[ld->e[j].tok].stamp == r->toks[e.tok].stamp);
            if (!r->rc.mc.unified) e.inst = r->next_inst++;
            if (dup) continue;
            list_push(ld, e);
            r->toks[e.tok].refs++;
        }
    }
    if (!r->rs) ref_ck_drop(r, dst, a); /* dst may hold more below its checkpoints */
}

static void op_keep(driver *d)
{
    ref *r = &d->r;
    int32_t s = (int32_t)pick(&d->ch, (uint32_t)r->rc.mc.n_seq_max);
    keel_status st = keel_mem_seq_keep(d->mem, s);
    TRACE("seq_keep %d -> %s", s, keel_status_name(st));
    expect_status(d, st, KEEL_OK, "seq_keep");
    if (st != KEEL_OK) return;
    for (int32_t q = 0; q < r->rc.mc.n_seq_max; q++)
        if (q != s) ref_rm_all(r, q);
}

static void op_edit(driver *d, bool div)
{
    ref *r = &d->r;
    int32_t s = (int32_t)pick(&d->ch, (uint32_t)r->rc.mc.n_seq_max);
    int32_t pm = ref_pos_max(r, s);
    int32_t p0 = chance(&d->ch, 30) ? -1 : (int32_t)pick(&d->ch, (uint32_t)(pm + 2));
    int32_t p1 = chance(&d->ch, 60) ? -1 : (p0 < 0 ? 0 : p0) + 1 + (int32_t)pick(&d->ch, 24);
    int32_t a = p0 < 0 ? 0 : p0, b = p1 < 0 ? INT32_MAX : p1;
    int32_t delta = 0, dv = 1;
    if (div) {
        dv = 1 + (int32_t)pick(&d->ch, 4);
    } else {
        /* mostly legal shifts (context shift, renumbering), sometimes negative past 0 */
        int32_t lo = INT32_MAX;
        for (int32_t g = 0; g < r->n_groups; g++)
            for (int32_t i = 0; i < r->lists[s][g].n; i++) {
                int32_t p = r->lists[s][g].e[i].pos;
                if (p >= a && p < b && p < lo) lo = p;
            }
        if (lo == INT32_MAX) lo = 0;
        delta = chance(&d->ch, 50) ? (int32_t)pick(&d->ch, 40) : -(int32_t)pick(&d->ch, (uint32_t)lo + 1);
        if (chance(&d->ch, 5)) delta = -lo - 1 - (int32_t)pick(&d->ch, 3); /* must be refused */
    }
    bool negative = false;
    for (int32_t g = 0; g < r->n_groups; g++)
        for (int32_t i = 0; i < r->lists[s][g].n; i++) {
            int32_t p = r->lists[s][g].e[i].pos;
            if (p >= a && p < b && (int64_t)p + delta < 0) negative = true;
        }
    /* recurrent: the last token must stay last (predicted from the lists,
     * or from the span without attention layers) */
    bool rs_refuse = false;
    int64_t lo2 = 0, hi2 = 0;
    int32_t ck_floor = a;
    if (r->rs && r->hist[s].n) {
        int32_t lo = r->rs_lo[s], hi = r->rs_hi[s];
        uint64_t last = r->rs_last[s];
        hi2 = hi >= a && hi < b ? (div ? hi / dv : (int64_t)hi + delta) : hi;
        lo2 = lo >= a && lo < b ? (div ? lo / dv : (int64_t)lo + delta) : lo;
        if (hi2 < 0 || lo2 < 0) negative = true;
        int64_t other = lo2, low = lo >= a && lo < b ? lo2 : INT64_MAX;
        for (int32_t g = 0; g < r->n_groups; g++)
            for (int32_t i = 0; i < r->lists[s][g].n; i++) {
                const ref_entry *e = &r->lists[s][g].e[i];
                bool moves = e->pos >= a && e->pos < b;
                int64_t np = moves ? (div ? e->pos / dv : (int64_t)e->pos + delta) : e->pos;
                if (moves && np < low) low = np;
                if (r->toks[e->tok].stamp != last && np > other) other = np;
            }
        ck_floor = low < a ? (int32_t)BASE_MAX(low, 0) : a;
        rs_refuse = other > hi2;
        if (r->n_groups == 0 && !(b <= lo || a > hi) && !(a <= lo && b > hi)) rs_refuse = true;
    }
    uint64_t before = keel_mem_digest(d->mem);
    keel_status st = div ? keel_mem_seq_div(d->mem, s, p0, p1, dv) : keel_mem_seq_add(d->mem, s, p0, p1, delta);
    TRACE("%s %d [%d, %d) %d -> %s", div ? "seq_div" : "seq_add", s, p0, p1, div ? dv : delta,
          keel_status_name(st));
    if ((div && dv == 1) || (!div && delta == 0)) {
        expect_status(d, st, KEEL_OK, "identity edit");
        if (keel_mem_digest(d->mem) != before) {
            d->res->invariant_failures++;
            note(d, "identity edit changed the memory");
        }
        return;
    }
    if (negative) {
        expect_status(d, st, KEEL_ERANGE, "seq_add (negative)");
        if (st != KEEL_OK) refused(d, before, st, "seq_add");
        return;
    }
    if (st == KEEL_ESTATE || (st == KEEL_OK && rs_refuse)) {
        if (!rs_refuse) expect_status(d, st, KEEL_OK, div ? "seq_div" : "seq_add");
        if (st == KEEL_OK) {
            expect_status(d, st, KEEL_ESTATE, div ? "seq_div (recurrent)" : "seq_add (recurrent)");
            expect_status(d, keel_mem_seq_rm(d->mem, s, -1, -1), KEEL_OK, "seq_rm (resync)");
            ref_rm_all(r, s);
            return;
        }
        refused(d, before, st, div ? "seq_div" : "seq_add");
        return;
    }
    if (st != KEEL_OK) {
        if (st != KEEL_EFULL) expect_status(d, st, KEEL_EFULL, div ? "seq_div" : "seq_add");
        else {
            /* legitimate only where the shared cells that move (copy on
             * write) outnumber a table's free cells */
            bool ok = false;
            for (int32_t g = 0; g < r->n_groups && !ok; g++) {
                const mem_table *t = &d->mem->groups[g].tables[d->mem->n_streams == 1 ? 0 : s];
                int32_t moving_shared = 0;
                for (int32_t i = 0; i < r->lists[s][g].n; i++) {
                    const ref_entry *e = &r->lists[s][g].e[i];
                    if (e->pos < a || e->pos >= b) continue;
                    if ((div ? e->pos / dv : e->pos + delta) == e->pos) continue;
                    bool shared = false;
                    for (int32_t q = 0; q < r->rc.mc.n_seq_max && !shared; q++)
                        for (int32_t j = 0; q != s && j < r->lists[q][g].n && !shared; j++)
                            shared = r->lists[q][g].e[j].inst == e->inst;
                    moving_shared += shared;
                }
                ok = moving_shared > t->cap - t->n_used;
            }
            if (!ok) {
                d->res->invariant_failures++;
                note(d, "%s refused with KEEL_EFULL although its moving shared cells fit (%s)",
                     div ? "seq_div" : "seq_add", keel_mem_last_error(d->mem));
            }
        }
        refused(d, before, st, div ? "seq_div" : "seq_add");
        return;
    }
    for (int32_t g = 0; g < r->n_groups; g++)
        for (int32_t i = 0; i < r->lists[s][g].n; i++) {
            ref_entry *e = &r->lists[s][g].e[i];
            if (e->pos < a || e->pos >= b) continue;
            /* copy on write: a cell shared with another sequence is split,
             * unless its position stays (then it stays shared) */
            int32_t np = div ? e->pos / dv : e->pos + delta;
            if (np == e->pos) continue;
            bool shared = false;
            for (int32_t q = 0; q < r->rc.mc.n_seq_max && !shared; q++) {
                if (q == s) continue;
                for (int32_t j = 0; j < r->lists[q][g].n && !shared; j++)
                    shared = r->lists[q][g].e[j].inst == e->inst;
            }
            if (shared) e->inst = r->next_inst++;
            e->edits++;
            e->pos = np;
        }
    for (int32_t g = 0; g < r->n_groups; g++) {
        ref_plist *f = &r->forg[s][g];
        for (int32_t i = 0; i < f->n; i++)
            if (f->p[i] >= a && f->p[i] < b) f->p[i] = div ? f->p[i] / dv : f->p[i] + delta;
    }
    if (r->rs && r->hist[s].n) {
        if (r->n_groups > 0) {
            r->rs_lo[s] = (int32_t)BASE_MIN(lo2, (int64_t)ref_lists_min(r, s));
            r->rs_hi[s] = ref_lists_max(r, s);
        } else {
            r->rs_lo[s] = (int32_t)lo2;
            r->rs_hi[s] = (int32_t)hi2;
        }
        ref_ck_drop(r, s, ck_floor);
    } else if (!r->rs) {
        /* checkpoints below every moved token's new position hold */
        int64_t low = div ? (int64_t)a / dv : BASE_MIN((int64_t)a, (int64_t)a + delta);
        ref_ck_drop(r, s, (int32_t)BASE_MAX(low, 0));
    }
}

/* Compaction: the memory decides what to keep; the driver checks the
 * budget and the reserved cells, then applies exactly that keep-set (and
 * renumbering) to the reference, so every later attention comparison checks
 * the compacted cache against a recomputation over exactly the kept tokens. */
typedef struct kept_tok {
    uint64_t stamp;
    int32_t old_pos, new_pos;
} kept_tok;

static void op_compact(driver *d)
{
    ref *r = &d->r;
    int32_t s = (int32_t)pick(&d->ch, (uint32_t)r->rc.mc.n_seq_max);
    int32_t gfull = -1;
    for (int32_t g = 0; g < r->n_groups; g++)
        if (!r->groups[g].sliding) gfull = g;
    if (gfull < 0) return;
    ref_list *fl = &r->lists[s][gfull];
    if (fl->n < 4) return;
    /* duplicates of one token in a list (split-stream copies) cannot be
     * matched to cells unambiguously: skip those sequences */
    for (int32_t i = 0; i < fl->n; i++)
        for (int32_t j = i + 1; j < fl->n; j++)
            if (r->toks[fl->e[i].tok].stamp == r->toks[fl->e[j].tok].stamp) return;
    keel_compact_params p = keel_compact_params_default();
    p.policy = (keel_compact_policy)(1 + pick(&d->ch, 4));
    p.target = 2 + (int32_t)pick(&d->ch, (uint32_t)(fl->n - 2));
    p.trigger = p.target + 1;
    p.n_sink = (int32_t)pick(&d->ch, (uint32_t)BASE_MIN(4, p.target));
    p.recent = (float)pick(&d->ch, 6) / 10.0f;
    if (p.n_sink + (int32_t)ceil(p.recent * p.target) > p.target) p.recent = 0.0f;
    p.renumber = chance(&d->ch, 60);
    p.protect = chance(&d->ch, 50);
    p.seed = 1 + pick(&d->ch, 100);
    /* snapshot: stamp -> position of s's full-table cells */
    const mem_group *grp = &d->mem->groups[gfull];
    const mem_table *t = &grp->tables[d->mem->n_streams == 1 ? 0 : s];
    uint64_t before = keel_mem_digest(d->mem);
    keel_status st = keel_mem_compact(d->mem, s, &p);
    TRACE("compact seq %d %s target %d sinks %d recent %.1f %s -> %s", s,
          keel_compact_policy_name(p.policy), p.target, p.n_sink, (double)p.recent,
          p.renumber ? "renumber" : "keep", keel_status_name(st));
    if (st != KEEL_OK) {
        if (st != KEEL_EFULL && st != KEEL_EINVAL) expect_status(d, st, KEEL_OK, "compact");
        refused(d, before, st, "compact");
        return;
    }
    /* what the memory kept */
    kept_tok *kt = calloc((size_t)fl->n, sizeof(kept_tok));
    int32_t nk = 0;
    for (int32_t c = 0; c < t->cap; c++)
        if (t->pos[c] >= 0 && mem_seq_has(t, c, s)) {
            kt[nk].stamp = t->stamp[c];
            kt[nk].new_pos = t->pos[c];
            nk++;
        }
    if (nk != BASE_MIN(p.target, fl->n)) {
        d->res->invariant_failures++;
        note(d, "compact kept %d cells, target %d (had %d)", nk, p.target, fl->n);
    }
    /* sinks and recent are kept */
    int32_t *ord = malloc((size_t)fl->n * sizeof(int32_t));
    for (int32_t i = 0; i < fl->n; i++) ord[i] = i;
    for (int32_t i = 1; i < fl->n; i++)
        for (int32_t j = i; j > 0; j--) {
            const ref_entry *a = &fl->e[ord[j - 1]], *b = &fl->e[ord[j]];
            if (key_less(b->pos, r->toks[b->tok].stamp, a->pos, r->toks[a->tok].stamp)) {
                int32_t tmp = ord[j];
                ord[j] = ord[j - 1];
                ord[j - 1] = tmp;
            } else
                break;
        }
    int32_t n_recent = (int32_t)ceil(p.recent * p.target);
    for (int32_t i = 0; i < fl->n; i++) {
        bool must = i < p.n_sink || i >= fl->n - n_recent;
        uint64_t stp = r->toks[fl->e[ord[i]].tok].stamp;
        bool found = false;
        for (int32_t j = 0; j < nk && !found; j++) found = kt[j].stamp == stp;
        if (must && !found) {
            d->res->invariant_failures++;
            note(d, "compact dropped a reserved token (rank %d of %d)", i, fl->n);
        }
    }
    free(ord);
    /* apply to the reference */
    for (int32_t g = 0; g < r->n_groups; g++) {
        ref_list *l = &r->lists[s][g];
        int32_t w = 0;
        for (int32_t i = 0; i < l->n; i++) {
            ref_entry e = l->e[i];
            uint64_t stp = r->toks[e.tok].stamp;
            int32_t j = 0;
            while (j < nk && kt[j].stamp != stp) j++;
            if (j == nk) {
                if (g == gfull) {
                    tok_unref(r, e.tok);
                    continue;
                }
                /* a ring token outside the kept set: with renumbering the ring
                 * forgets it (the memory refuses if the next query needs it);
                 * with positions kept it stays where it is */
                if (p.renumber) {
                    tok_unref(r, e.tok);
                    continue;
                }
                l->e[w++] = e;
                continue;
            }
            if (p.renumber && kt[j].new_pos != e.pos) {
                bool shared = false;
                for (int32_t q = 0; q < r->rc.mc.n_seq_max && !shared; q++) {
                    if (q == s) continue;
                    for (int32_t x = 0; x < r->lists[q][g].n && !shared; x++)
                        shared = r->lists[q][g].e[x].inst == e.inst;
                }
                if (shared) e.inst = r->next_inst++;
                e.pos = kt[j].new_pos;
                e.edits++;
            }
            l->e[w++] = e;
        }
        l->n = w;
        if (p.renumber) r->forg[s][g].n = 0; /* renumbered: exact covers the sequence */
    }
    free(kt);
    if (r->rs && r->hist[s].n) {
        r->rs_lo[s] = BASE_MIN(r->rs_lo[s], ref_lists_min(r, s));
        r->rs_hi[s] = ref_lists_max(r, s);
        ref_ck_drop(r, s, -1);
    } else if (!r->rs) {
        ref_ck_drop(r, s, -1);
    }
    r->exact[s] = ref_pos_max(r, s) + 1;
}

/* Checkpoint of a sequence at its end: the reference snapshots its
 * history length and what each ring keeps for a query at the end. */
/* The stamp of s's last token: the newest entry at its largest position
 * (the state's on a recurrent configuration). */
static uint64_t ref_last_stamp(const ref *r, int32_t s)
{
    if (r->rs) return r->rs_last[s];
    int32_t hi = ref_lists_max(r, s);
    uint64_t best = 0;
    for (int32_t g = 0; g < r->n_groups; g++)
        for (int32_t i = 0; i < r->lists[s][g].n; i++) {
            const ref_entry *e = &r->lists[s][g].e[i];
            if (e->pos == hi && r->toks[e->tok].stamp > best) best = r->toks[e->tok].stamp;
        }
    return best;
}

static bool ref_holds(const ref *r, int32_t s)
{
    return r->rs ? r->hist[s].n > 0 : !ref_seq_empty(r, s);
}

/* keel_mem_ckpt_restore: the newest checkpoint at or before p0, or a
 * refusal (none: ESTATE; no room or slot: EFULL) that changes nothing. */
static void op_ckpt_restore(driver *d)
{
    ref *r = &d->r;
    int32_t s = (int32_t)pick(&d->ch, (uint32_t)r->rc.mc.n_seq_max);
    int32_t p0 = r->n_ck[s] ? r->ck[s][pick(&d->ch, (uint32_t)r->n_ck[s])].pos + (int32_t)pick(&d->ch, 4) - 1
                            : (int32_t)pick(&d->ch, (uint32_t)(ref_pos_max(r, s) + 2));
    uint64_t before = keel_mem_digest(d->mem);
    int32_t at = -2;
    keel_status st = keel_mem_ckpt_restore(d->mem, s, p0, &at);
    TRACE("ckpt_restore %d at %d -> %s (%d)", s, p0, keel_status_name(st), at);
    int32_t i = ref_holds(r, s) ? ref_ck_find(r, s, p0 < 0 ? 0 : p0) : -1;
    keel_status want = i < 0 ? KEEL_ESTATE
                       : (r->rs && ref_shared(r, s) && ref_slots_used(r) >= r->n_slots) || ring_room_short(d, s, &r->ck[s][i])
                           ? KEEL_EFULL
                           : KEEL_OK;
    expect_status(d, st, want, "ckpt_restore");
    if (st != KEEL_OK) {
        refused(d, before, st, "ckpt_restore");
        if (want == KEEL_OK) { /* resynchronize: drop the sequence in both */
            expect_status(d, keel_mem_seq_rm(d->mem, s, -1, -1), KEEL_OK, "seq_rm (resync)");
            ref_rm_all(r, s);
        }
        return;
    }
    if (want != KEEL_OK) { /* the memory restored what the reference has not: resynchronize */
        expect_status(d, keel_mem_seq_rm(d->mem, s, -1, -1), KEEL_OK, "seq_rm (resync)");
        ref_rm_all(r, s);
        return;
    }
    d->res->rs_restores++;
    int32_t want_at = r->ck[s][i].pos;
    ref_restore(r, s, i);
    if (at != want_at || keel_mem_seq_pos_max(d->mem, s) != want_at - 1) {
        d->res->invariant_failures++;
        note(d, "ckpt_restore of sequence %d: at %d ending at %d, reference checkpoint at %d", s, at,
             keel_mem_seq_pos_max(d->mem, s), want_at);
    }
}

static void op_ckpt(driver *d)
{
    ref *r = &d->r;
    if (r->n_ckpt > 0 && chance(&d->ch, 30)) {
        op_ckpt_restore(d);
        return;
    }
    int32_t s = (int32_t)pick(&d->ch, (uint32_t)r->rc.mc.n_seq_max);
    uint64_t before = keel_mem_digest(d->mem);
    keel_status st = keel_mem_ckpt_take(d->mem, s);
    TRACE("ckpt_take %d -> %s", s, keel_status_name(st));
    keel_status want = r->n_ckpt == 0 ? KEEL_EUNSUPPORTED : !ref_holds(r, s) ? KEEL_ESTATE : KEEL_OK;
    expect_status(d, st, want, "ckpt_take");
    if (st != KEEL_OK) {
        refused(d, before, st, "ckpt_take");
        return;
    }
    if (want != KEEL_OK) return;
    d->res->rs_ckpts++;
    int32_t pos = ref_pos_max(r, s) + 1;
    uint64_t last = ref_last_stamp(r, s);
    if (r->n_ck[s] && r->ck[s][r->n_ck[s] - 1].pos == pos && r->ck[s][r->n_ck[s] - 1].stamp == last)
        return;
    if (r->n_ck[s] == r->n_ckpt) { /* the oldest goes */
        ref_ck_free(r, &r->ck[s][0]);
        ref_ckpt tmp = r->ck[s][0];
        for (int32_t i = 1; i < r->n_ck[s]; i++) r->ck[s][i - 1] = r->ck[s][i];
        r->ck[s][r->n_ck[s] - 1] = tmp;
        r->n_ck[s]--;
    }
    ref_ckpt *c = &r->ck[s][r->n_ck[s]++];
    c->pos = pos;
    c->pos_min = r->rs ? r->rs_lo[s] : ref_lists_min(r, s);
    c->stamp = last;
    c->hist_n = r->hist[s].n;
    for (int32_t g = 0; g < r->n_groups; g++) {
        c->ring[g].n = 0;
        c->forg[g].n = 0;
        if (!r->groups[g].sliding) continue;
        const ref_list *l = &r->lists[s][g];
        int32_t window = r->groups[g].window, tp;
        uint64_t tsm;
        sink_threshold(r, l, r->groups[g].n_sink, &tp, &tsm);
        int32_t cand[512], nc = 0;
        for (int32_t i = 0; i < l->n; i++) {
            const ref_entry *e = &l->e[i];
            bool sink = tp >= 0 && !key_less(tp, tsm, e->pos, r->toks[e->tok].stamp);
            if (sink) {
                list_push(&c->ring[g], *e);
                r->toks[e->tok].refs++;
            } else if ((int64_t)e->pos > (int64_t)pos - window && nc < 512) {
                cand[nc++] = i;
            } else {
                plist_push(&c->forg[g], e->pos);
            }
        }
        for (int32_t i = 1; i < nc; i++) /* newest first */
            for (int32_t j = i; j > 0 && r->toks[l->e[cand[j]].tok].stamp > r->toks[l->e[cand[j - 1]].tok].stamp; j--) {
                int32_t x = cand[j];
                cand[j] = cand[j - 1];
                cand[j - 1] = x;
            }
        for (int32_t i = 0; i < nc; i++) {
            const ref_entry *e = &l->e[cand[i]];
            if (i < window) {
                list_push(&c->ring[g], *e);
                r->toks[e->tok].refs++;
            } else {
                plist_push(&c->forg[g], e->pos);
            }
        }
        for (int32_t i = 0; i < r->forg[s][g].n; i++) plist_push(&c->forg[g], r->forg[s][g].p[i]);
    }
}

/* Speculation on a recurrent memory, the engine's pattern (keel_decode_spec,
 * keel_context_rewind): a snapshot of s, a drafted batch placed on s, then
 * mostly a restore to the snapshot (some drafts rejected) or nothing (all
 * accepted). The restore is predicted: refused with KEEL_ESTATE when the
 * sequence is no longer the snapshot's plus later tokens or a ring forgot a
 * position a query at the snapshot needs, KEEL_EFULL when the state is
 * shared and no slot is free; otherwise the reference drops the batch and
 * rewinds its history, and every later attention and state comparison
 * checks the memory did the same. */
static void op_spec(driver *d)
{
    ref *r = &d->r;
    int32_t s = (int32_t)pick(&d->ch, (uint32_t)r->rc.mc.n_seq_max);
    if (r->hist[s].n > 160 - REF_MAX_BATCH) { /* op_place would drop the long history */
        expect_status(d, keel_mem_seq_rm(d->mem, s, -1, -1), KEEL_OK, "seq_rm (long history)");
        ref_rm_all(r, s);
    }
    uint64_t before = keel_mem_digest(d->mem);
    keel_status st = keel_mem_spec_save(d->mem, s);
    TRACE("spec_save %d -> %s", s, keel_status_name(st));
    keel_status want = !r->rc.mc.spec_snapshot ? KEEL_EUNSUPPORTED : !ref_holds(r, s) ? KEEL_ESTATE : KEEL_OK;
    expect_status(d, st, want, "spec_save");
    if (st != KEEL_OK) {
        refused(d, before, st, "spec_save");
        return;
    }
    if (want != KEEL_OK) { /* the memory saved what the reference does not hold: resynchronize */
        expect_status(d, keel_mem_seq_rm(d->mem, s, -1, -1), KEEL_OK, "seq_rm (resync)");
        ref_rm_all(r, s);
        return;
    }
    int32_t p = r->rs_hi[s] + 1, lo = r->rs_lo[s], hist_n = r->hist[s].n;
    uint64_t stamp = ref_last_stamp(r, s);
    if (keel_mem_spec_pos(d->mem, s) != p) {
        d->res->invariant_failures++;
        note(d, "spec_save of sequence %d: snapshot at %d, reference at %d", s, keel_mem_spec_pos(d->mem, s), p);
    }
    d->only_seq = s;
    op_place(d);
    d->only_seq = -1;
    check_invariants(d, "place (drafted)");
    if (!chance(&d->ch, 70)) return; /* every draft accepted: the snapshot stays unused */
    bool valid = ref_holds(r, s) && r->rs_lo[s] == lo && r->rs_hi[s] >= p - 1 && r->hist[s].n >= hist_n;
    bool forgot = false;
    for (int32_t g = 0; valid && g < r->n_groups; g++) {
        if (!r->groups[g].sliding) continue;
        for (int32_t i = 0; i < r->forg[s][g].n; i++)
            if ((int64_t)r->forg[s][g].p[i] + r->groups[g].window > p) forgot = true;
    }
    want = !valid || forgot ? KEEL_ESTATE
           : ref_shared(r, s) && ref_slots_used(r) >= r->n_slots ? KEEL_EFULL
                                                                  : KEEL_OK;
    before = keel_mem_digest(d->mem);
    int32_t at = -2;
    st = keel_mem_spec_restore(d->mem, s, &at);
    TRACE("spec_restore %d (snapshot at %d) -> %s (%d)", s, p, keel_status_name(st), at);
    /* the memory's record of what its rings forgot is a bound (edits and
     * removals keep it conservative), so it may refuse where the reference
     * forgot nothing; never the other way */
    if (want == KEEL_OK && st == KEEL_ESTATE && strstr(keel_mem_last_error(d->mem), " forgot position ")) {
        refused(d, before, st, "spec_restore");
        return;
    }
    expect_status(d, st, want, "spec_restore");
    if (st != want) { /* resynchronize: drop the sequence in both */
        if (st != KEEL_OK) refused(d, before, st, "spec_restore");
        expect_status(d, keel_mem_seq_rm(d->mem, s, -1, -1), KEEL_OK, "seq_rm (resync)");
        ref_rm_all(r, s);
        return;
    }
    if (st != KEEL_OK) {
        refused(d, before, st, "spec_restore");
        return;
    }
    d->res->spec_restores++;
    ref_rm(r, s, p, -1);
    r->hist[s].n = hist_n;
    r->rs_hi[s] = p - 1;
    r->rs_last[s] = stamp;
    r->rs_id[s] = r->next_rs_id++;
    ref_ck_drop(r, s, p - 1);
    if (at != p || keel_mem_seq_pos_max(d->mem, s) != p - 1) {
        d->res->invariant_failures++;
        note(d, "spec_restore of sequence %d: at %d ending at %d, reference snapshot at %d", s, at,
             keel_mem_seq_pos_max(d->mem, s), p);
    }
    if (chance(&d->ch, 50)) { /* the accepted tokens decoded again */
        check_invariants(d, "spec_restore");
        d->only_seq = s;
        op_place(d);
        d->only_seq = -1;
    }
}

static void op_clear(driver *d)
{
    TRACE("clear");
    keel_mem_clear(d->mem);
    ref_rm_all(&d->r, -1);
}

/* Index of stamp v in the sorted distinct list (-1: not in it). */
static int32_t stamp_rank(const uint64_t *list, int32_t n, uint64_t v)
{
    for (int32_t k = 0; k < n; k++)
        if (list[k] == v) return k;
    return -1;
}

/* A token with stamp `stamp` among s's entries (lists and checkpoint
 * rings), or -1. */
static int32_t find_stamped(const ref *r, int32_t s, uint64_t stamp)
{
    for (int32_t g = 0; g < r->n_groups; g++) {
        for (int32_t i = 0; i < r->lists[s][g].n; i++)
            if (r->toks[r->lists[s][g].e[i].tok].stamp == stamp) return r->lists[s][g].e[i].tok;
        for (int32_t c = 0; c < r->n_ck[s]; c++)
            for (int32_t i = 0; i < r->ck[s][c].ring[g].n; i++)
                if (r->toks[r->ck[s][c].ring[g].e[i].tok].stamp == stamp) return r->ck[s][c].ring[g].e[i].tok;
    }
    return -1;
}

/* Points entry e of loaded sequence s at a copy of its token stamped
 * base + rank (one copy per old token, shared by its entries: the old
 * stamps are all below base, so a match is a copy made here). */
static void restamp_entry(ref *r, int32_t s, ref_entry *e, const uint64_t *list, int32_t n, uint64_t base)
{
    int32_t old = e->tok;
    uint64_t ns = base + (uint64_t)stamp_rank(list, n, r->toks[old].stamp);
    int32_t clone = find_stamped(r, s, ns);
    if (clone < 0) {
        clone = tok_clone(r, old);
        r->toks[clone].stamp = ns;
    }
    r->toks[clone].refs++;
    tok_unref(r, old);
    e->tok = clone;
    e->inst = r->next_inst++;
}

/* A session round trip: the sequence (or the whole memory) saved and loaded
 * back into the same memory. The memory's content must be the same after it
 * (attention keeps matching the reference); a refused load (no room for the
 * copies of shared cells, a whole-memory load into split streams) changes
 * nothing. Run every 97th step without a draw of its own, so the seeds'
 * operation streams stay as they were. */
static void op_session(driver *d)
{
    ref *r = &d->r;
    int32_t ns = r->rc.mc.n_seq_max;
    int32_t s = (int32_t)((d->step / 97) % (ns + 1)) - 1;
    size_t n = 0;
    keel_status st = keel_mem_save(d->mem, s, 77, NULL, 0, 0, NULL, 0, &n);
    expect_status(d, st, KEEL_ERANGE, "session size");
    if (st != KEEL_ERANGE) return;
    uint8_t *buf = malloc(n);
    if (!buf) abort();
    size_t got = 0;
    st = keel_mem_save(d->mem, s, 77, NULL, 0, 0, buf, n, &got);
    expect_status(d, st, KEEL_OK, "session save");
    uint64_t before = keel_mem_digest(d->mem);
    uint64_t base = d->mem->next_stamp; /* the load stamps its cells base + rank */
    int32_t nt = -1;
    st = keel_mem_load(d->mem, s, buf, got, 77, 0, NULL, 0, &nt, NULL);
    free(buf);
    TRACE("session seq %d (%zu bytes) -> %s", s, got, keel_status_name(st));
    if (st != KEEL_OK) {
        bool ok = st == KEEL_EFULL || (st == KEEL_EUNSUPPORTED && s < 0 && !r->rc.mc.unified);
        if (!ok) expect_status(d, st, KEEL_OK, "session load");
        refused(d, before, st, "session load");
        return;
    }
    /* the memory re-stamped the loaded cells base + the rank of their old
     * stamp among the saved ones (order kept), and so the states' last
     * stamps, the checkpoints' and their ring cells': so does the
     * reference. A loaded sequence holds copies: its tokens are cloned
     * (other sequences keep theirs, with the old stamps), no longer share
     * cells, and its state has a slot of its own. */
    int32_t n_st = 0, cap_st = 64;
    uint64_t *st_list = malloc((size_t)cap_st * sizeof(uint64_t));
    if (!st_list) abort();
#define ST_PUSH(v)                                                                      \
    do {                                                                                \
        if (n_st == cap_st) {                                                           \
            st_list = realloc(st_list, (size_t)(cap_st *= 2) * sizeof(uint64_t));       \
            if (!st_list) abort();                                                      \
        }                                                                               \
        st_list[n_st++] = (v);                                                          \
    } while (0)
    for (int32_t q = 0; q < ns; q++) {
        if (s >= 0 && q != s) continue;
        for (int32_t g = 0; g < r->n_groups; g++)
            for (int32_t i = 0; i < r->lists[q][g].n; i++) ST_PUSH(r->toks[r->lists[q][g].e[i].tok].stamp);
        if (!ref_holds(r, q)) continue;
        if (r->rs) ST_PUSH(r->rs_last[q]); /* an attention memory's is a cell's */
        for (int32_t i = 0; i < r->n_ck[q]; i++) {
            ST_PUSH(r->ck[q][i].stamp);
            for (int32_t g = 0; g < r->n_groups; g++)
                for (int32_t j = 0; j < r->ck[q][i].ring[g].n; j++) ST_PUSH(r->toks[r->ck[q][i].ring[g].e[j].tok].stamp);
        }
    }
#undef ST_PUSH
    for (int32_t i = 1; i < n_st; i++) /* insertion sort, then unique */
        for (int32_t j = i; j > 0 && st_list[j] < st_list[j - 1]; j--) {
            uint64_t x = st_list[j];
            st_list[j] = st_list[j - 1];
            st_list[j - 1] = x;
        }
    int32_t u = 0;
    for (int32_t i = 0; i < n_st; i++)
        if (u == 0 || st_list[i] != st_list[u - 1]) st_list[u++] = st_list[i];
    for (int32_t q = 0; q < ns; q++) { /* states' and checkpoints' stamps */
        if ((s >= 0 && q != s) || !ref_holds(r, q)) continue;
        if (r->rs) r->rs_last[q] = base + (uint64_t)stamp_rank(st_list, u, r->rs_last[q]);
        for (int32_t i = 0; i < r->n_ck[q]; i++) r->ck[q][i].stamp = base + (uint64_t)stamp_rank(st_list, u, r->ck[q][i].stamp);
    }
    if (s < 0) {
        /* whole memory: every token re-stamped in place (sharing is kept) */
        for (int32_t t = 0; t < r->n_toks; t++) {
            if (r->toks[t].refs <= 0) continue;
            int32_t k = stamp_rank(st_list, u, r->toks[t].stamp);
            if (k >= 0) r->toks[t].stamp = base + (uint64_t)k;
        }
    } else {
        for (int32_t g = 0; g < r->n_groups; g++)
            for (int32_t i = 0; i < r->lists[s][g].n; i++) restamp_entry(r, s, &r->lists[s][g].e[i], st_list, u, base);
        for (int32_t i = 0; i < r->n_ck[s]; i++)
            for (int32_t g = 0; g < r->n_groups; g++)
                for (int32_t j = 0; j < r->ck[s][i].ring[g].n; j++)
                    restamp_entry(r, s, &r->ck[s][i].ring[g].e[j], st_list, u, base);
        if (r->rs && r->hist[s].n) r->rs_id[s] = r->next_rs_id++;
    }
    r->next_stamp = base + (uint64_t)u;
    free(st_list);
}

/* Bad input: each must be refused with a clear status and change nothing. */
static void op_bad(driver *d)
{
    ref *r = &d->r;
    const keel_mem_config *mc = &r->rc.mc;
    uint64_t before = keel_mem_digest(d->mem);
    keel_status st;
    uint32_t kind = pick(&d->ch, 6);
    switch (kind) {
    case 0: { /* unknown sequence id */
        int32_t pos = 0, seq = mc->n_seq_max + (int32_t)pick(&d->ch, 3);
        keel_mem_batch b = {1, &pos, &seq, NULL, NULL, NULL};
        st = keel_mem_place(d->mem, &b, d->cells);
        expect_status(d, st, KEEL_EINVAL, "place (unknown seq)");
        break;
    }
    case 1: { /* position gap */
        int32_t seq = (int32_t)pick(&d->ch, (uint32_t)mc->n_seq_max);
        int32_t pm = ref_pos_max(r, seq);
        if (pm < 0) return;
        int32_t pos = pm + 2 + (int32_t)pick(&d->ch, 3);
        keel_mem_batch b = {1, &pos, &seq, NULL, NULL, NULL};
        st = keel_mem_place(d->mem, &b, d->cells);
        expect_status(d, st, KEEL_EINVAL, "place (gap)");
        break;
    }
    case 2: { /* empty range */
        int32_t p0 = 1 + (int32_t)pick(&d->ch, 50);
        int32_t p1 = p0 - (int32_t)pick(&d->ch, (uint32_t)BASE_MIN(p0, 3)); /* 0 <= p1 <= p0 */
        st = keel_mem_seq_rm(d->mem, 0, p0, p1);
        expect_status(d, st, KEEL_ERANGE, "seq_rm (empty range)");
        break;
    }
    case 3: { /* negative position from seq_add */
        int32_t s = (int32_t)pick(&d->ch, (uint32_t)mc->n_seq_max);
        if (ref_seq_empty(r, s)) return;
        st = keel_mem_seq_add(d->mem, s, -1, -1, -(ref_pos_max(r, s) + 1));
        expect_status(d, st, KEEL_ERANGE, "seq_add (negative)");
        break;
    }
    case 4: { /* too many tokens */
        int32_t n = mc->n_batch_max + 1;
        int32_t pos[REF_MAX_BATCH + 1], seq[REF_MAX_BATCH + 1];
        for (int32_t i = 0; i < n; i++) {
            pos[i] = i;
            seq[i] = 0;
        }
        keel_mem_batch b = {n, pos, seq, NULL, NULL, NULL};
        st = keel_mem_place(d->mem, &b, d->cells);
        expect_status(d, st, KEEL_EINVAL, "place (too many tokens)");
        break;
    }
    default: { /* write to a cell that is not occupied / out of range */
        int32_t cell = -1 - (int32_t)pick(&d->ch, 3);
        int32_t l = 0;
        while (l < mc->n_layers && r->layer_group[l] < 0) l++;
        st = keel_mem_write(d->mem, l, 1, &cell, d->kbuf, d->vbuf);
        expect_status(d, st, KEEL_EINVAL, "write (bad cell)");
        break;
    }
    }
    refused(d, before, st, "bad input");
}

static void dump_seq(driver *d, int32_t s, int32_t g)
{
    if (!d->log) return;
    const ref_list *l = &d->r.lists[s][g];
    fprintf(d->log, "  ref seq %d group %d:", s, g);
    for (int32_t i = 0; i < l->n; i++)
        fprintf(d->log, " %d/%llu", l->e[i].pos, (unsigned long long)d->r.toks[l->e[i].tok].stamp);
    fprintf(d->log, "\n  mem:");
    const mem_group *grp = &d->mem->groups[g];
    const mem_table *t = &grp->tables[d->mem->n_streams == 1 ? 0 : s];
    for (int32_t c = 0; c < t->cap; c++)
        if (t->pos[c] >= 0 && mem_seq_has(t, c, s))
            fprintf(d->log, " %d/%llu", t->pos[c], (unsigned long long)t->stamp[c]);
    fprintf(d->log, "\n");
}

/* Checks a sparse query's kept cells sel[0 .. top_k) (query i of the call
 * in d->iqbuf / d->iwbuf) against the reference's scores of the visible
 * entries (use[k] set; n_vis of them), and narrows use to the kept ones. */
static void check_selection(driver *d, int32_t layer, int32_t i, const ref_list *l, uint8_t *use,
                            int32_t n_vis, int32_t top_k, const int32_t *sel)
{
    ref *r = &d->r;
    const keel_mem_layer *L = &r->rc.layers[layer];
    int32_t g = r->layer_group[layer], nih = L->idx_n_heads, di = L->idx_head_dim;
    const mem_group *grp = &d->mem->groups[g];
    const mem_col *icol = &grp->tables[0].cols[d->mem->layer_col[layer] + MEM_COL_IDX];
    keel_dtype qt = query_dot_type(L->idx_dtype);
    const float *w = d->iwbuf + (size_t)i * (size_t)nih;
    /* reference scores and their tolerance (relu is 1-Lipschitz: a dot's
     * error passes through scaled by |w_h| at most) */
    double *sc = calloc((size_t)l->n + 1, sizeof(double)), *tol = calloc((size_t)l->n + 1, sizeof(double));
    if (!sc || !tol) abort();
    float qr[64], kr[64];
    double vq[64], vk[64];
    for (int32_t k = 0; k < l->n; k++) {
        if (!use[k]) continue;
        const ref_entry *e = &l->e[k];
        ref_rope_row(&L->idx_rope, di, r->toks[e->tok].ik + r->ik_off[layer], e->pos, d->dk);
        for (int32_t j = 0; j < di; j++) kr[j] = (float)d->dk[j];
        mem_col_rotate(icol, kr);
        codec_var(L->idx_dtype, kr, di, vk);
        for (int32_t h = 0; h < nih; h++) {
            const float *q = d->iqbuf + ((size_t)i * (size_t)nih + (size_t)h) * (size_t)di;
            double dot = 0.0, mag = 0.0, se = 0.0;
            for (int32_t j = 0; j < di; j++) {
                dot += (double)q[j] * d->dk[j];
                mag += fabs((double)q[j] * d->dk[j]);
                qr[j] = q[j];
            }
            mem_col_rotate(icol, qr);
            codec_var(qt, qr, di, vq);
            for (int32_t j = 0; j < di; j++) {
                se += (double)qr[j] * qr[j] * vk[j] * (1.0 + e->edits);
                if (qt != KEEL_DTYPE_F32) se += vq[j] * (double)kr[j] * kr[j];
            }
            if (dot > 0) sc[k] += (double)w[h] * dot;
            tol[k] += fabs((double)w[h]) * (NOISE_Z * sqrt(se) + 1e-5 * (mag + 1.0));
        }
    }
    int32_t want = BASE_MIN(top_k, n_vis), n_sel = 0;
    uint8_t *kept = calloc((size_t)l->n + 1, 1);
    if (!kept) abort();
    bool bad = false;
    int32_t last_pos = -1;
    uint64_t last_stamp = 0;
    for (int32_t j = 0; j < top_k && !bad; j++) {
        if (sel[j] < 0) {
            for (int32_t x = j; x < top_k; x++) bad |= sel[x] >= 0;
            break;
        }
        const mem_table *t = NULL;
        int32_t c = -1;
        if (!mem_cell_decode(grp, sel[j], &t, &c) || t->pos[c] < 0) {
            bad = true;
            break;
        }
        int32_t k = 0;
        while (k < l->n && !(use[k] && !kept[k] && l->e[k].pos == t->pos[c] &&
                             r->toks[l->e[k].tok].stamp == t->stamp[c]))
            k++;
        if (k == l->n || (j > 0 && key_less(t->pos[c], t->stamp[c], last_pos, last_stamp))) {
            bad = true;
            break;
        }
        last_pos = t->pos[c];
        last_stamp = t->stamp[c];
        kept[k] = 1;
        n_sel++;
    }
    if (bad || n_sel != want) {
        d->res->divergences++;
        note(d, "sparse layer %d query %d: the kept cells are not %d distinct visible cells in order "
             "(%d kept, %d visible)", layer, i, want, n_sel, n_vis);
        if (d->log) {
            fprintf(d->log, "  kept:");
            for (int32_t j = 0; j < top_k; j++) {
                const mem_table *t = NULL;
                int32_t c = -1;
                if (sel[j] >= 0 && mem_cell_decode(grp, sel[j], &t, &c))
                    fprintf(d->log, " %d=%d/%llu", sel[j], t->pos[c], (unsigned long long)t->stamp[c]);
                else
                    fprintf(d->log, " %d", sel[j]);
            }
            fprintf(d->log, "\n  visible:");
            for (int32_t k = 0; k < l->n; k++)
                if (use[k])
                    fprintf(d->log, " %d/%llu(%.3g)", l->e[k].pos, (unsigned long long)r->toks[l->e[k].tok].stamp, sc[k]);
            fprintf(d->log, "\n");
        }
    } else {
        double lo = INFINITY, hi = -INFINITY;
        for (int32_t k = 0; k < l->n; k++) {
            if (!use[k]) continue;
            if (kept[k]) lo = fmin(lo, sc[k] + tol[k]);
            else hi = fmax(hi, sc[k] - tol[k]);
        }
        if (hi > lo) {
            d->res->divergences++;
            note(d, "sparse layer %d query %d: a dropped cell scores %.6g beyond a kept one's %.6g "
                 "(top_k %d of %d visible)", layer, i, hi, lo, top_k, n_vis);
        }
        d->res->sparse_checks++;
        if (n_vis > top_k) d->res->sparse_chosen++;
        memcpy(use, kept, (size_t)l->n);
    }
    free(kept);
    free(sc);
    free(tol);
}

/* Compares attention for n_q random queries of one layer. */
static void op_attend(driver *d, int32_t layer, int32_t n_q)
{
    ref *r = &d->r;
    const keel_mem_layer *L = &r->rc.layers[layer];
    int32_t g = r->layer_group[layer];
    if (g < 0) return;
    int32_t nh = L->n_heads, G = nh / L->n_kv_heads, dk = L->head_dim_k, dv = L->head_dim_v;
    int32_t pos[REF_MAX_BATCH], seq[REF_MAX_BATCH];
    if (n_q > r->rc.mc.n_batch_max) n_q = r->rc.mc.n_batch_max;
    for (int32_t i = 0; i < n_q; i++) {
        int32_t s = (int32_t)pick(&d->ch, (uint32_t)r->rc.mc.n_seq_max);
        int32_t pm = ref_pos_max(r, s);
        seq[i] = s;
        pos[i] = chance(&d->ch, 70) ? (pm < 0 ? 0 : pm) : (int32_t)pick(&d->ch, (uint32_t)(pm + 3));
        for (int32_t h = 0; h < nh; h++) {
            float raw[64];
            for (int32_t j = 0; j < dk; j++) raw[j] = (float)(base_rng_uniform(&r->data) * 2 - 1);
            ref_rope(L, raw, pos[i], d->dq);
            for (int32_t j = 0; j < dk; j++)
                d->qbuf[((size_t)i * (size_t)nh + (size_t)h) * (size_t)dk + (size_t)j] = (float)d->dq[j];
        }
    }
    float sinks[16];
    bool use_sinks = chance(&d->ch, 20);
    for (int32_t h = 0; h < nh; h++) sinks[h] = (float)(base_rng_uniform(&r->data) * 2 - 1);
    keel_mem_attn a;
    memset(&a, 0, sizeof a);
    a.n_tokens = n_q;
    a.n_heads = nh;
    a.q = d->qbuf;
    a.pos = pos;
    a.seq = seq;
    a.out = d->out;
    a.scale = chance(&d->ch, 70) ? 0.0f : (float)((0.5 + base_rng_uniform(&r->data)) / sqrt((double)dk));
    a.softcap = chance(&d->ch, 20) ? 1.0f + (float)pick(&d->ch, 10) : 0.0f;
    a.sinks = use_sinks ? sinks : NULL;
    /* sparse on three calls in four of a layer with an indexer column
     * (queries, weights and top_k from the indexer's own stream) */
    int32_t nih = L->idx_n_heads, di = L->idx_head_dim, top_k = 0;
    bool sparse = di > 0 && d->step % 4 != 3;
    if (sparse) {
        uint64_t u = base_rng_next(&r->idata);
        top_k = u % 3 == 0 ? L->idx_top_k : 1 + (int32_t)((u >> 8) % (uint64_t)L->idx_top_k);
        for (int32_t i = 0; i < n_q; i++)
            for (int32_t h = 0; h < nih; h++) {
                float raw[64];
                for (int32_t j = 0; j < di; j++) raw[j] = (float)(base_rng_uniform(&r->idata) * 2 - 1);
                ref_rope_row(&L->idx_rope, di, raw, pos[i], d->dq);
                for (int32_t j = 0; j < di; j++)
                    d->iqbuf[((size_t)i * (size_t)nih + (size_t)h) * (size_t)di + (size_t)j] = (float)d->dq[j];
                d->iwbuf[(size_t)i * (size_t)nih + (size_t)h] = (float)(base_rng_uniform(&r->idata) * 1.25 - 0.25);
            }
        a.iq = d->iqbuf;
        a.iw = d->iwbuf;
        a.n_iq_heads = nih;
        a.top_k = top_k == L->idx_top_k && (u & 1) ? 0 : top_k;
        a.sel = d->sel;
    }
    keel_status st = keel_mem_attend(d->mem, layer, &a);
    expect_status(d, st, KEEL_OK, "attend");
    if (st != KEEL_OK) return;
    d->res->attends++;
    double scale = a.scale > 0 ? a.scale : 1.0 / sqrt((double)dk);
    const mem_group *grp = &d->mem->groups[g];
    const mem_table *t0 = &grp->tables[0];
    const mem_col *kcol = &t0->cols[d->mem->layer_col[layer]], *vcol = kcol + 1;
    for (int32_t i = 0; i < n_q; i++) {
        const ref_list *l = &r->lists[seq[i]][g];
        const ref_group *rg = &r->groups[g];
        int32_t tp = -1;
        uint64_t tsm = 0;
        if (rg->sliding) sink_threshold(r, l, rg->n_sink, &tp, &tsm);
        int32_t max_edits = 0;
        /* the entries the query attends: the visible ones, of those the
         * memory's kept set when sparse (checked against the scores) */
        uint8_t *use = calloc((size_t)l->n + 1, 1);
        if (!use) abort();
        int32_t n_vis = 0;
        for (int32_t k = 0; k < l->n; k++) {
            const ref_entry *e = &l->e[k];
            if (e->pos > pos[i]) continue;
            if (rg->sliding && (int64_t)e->pos <= (int64_t)pos[i] - rg->window) {
                bool sink = tp >= 0 && !key_less(tp, tsm, e->pos, r->toks[e->tok].stamp);
                if (!sink) continue;
            }
            use[k] = 1;
            n_vis++;
        }
        if (sparse) check_selection(d, layer, i, l, use, n_vis, top_k, a.sel + (size_t)i * (size_t)top_k);
        for (int32_t h = 0; h < nh; h++) {
            int32_t hk = h / G;
            const float *q = d->qbuf + ((size_t)i * (size_t)nh + (size_t)h) * (size_t)dk;
            double m = -INFINITY, lsum = 0.0;
            for (int32_t j = 0; j < dv; j++) d->dacc[j] = 0.0;
            /* two passes: max, then sums */
            for (int pass = 0; pass < 2; pass++) {
                for (int32_t k = 0; k < l->n; k++) {
                    const ref_entry *e = &l->e[k];
                    if (!use[k]) continue;
                    const ref_token *t = &r->toks[e->tok];
                    ref_rope(L, t->k + r->k_off[layer] + (size_t)hk * (size_t)dk, e->pos, d->dk);
                    double sc = 0.0;
                    for (int32_t j = 0; j < dk; j++) sc += (double)q[j] * d->dk[j];
                    sc *= scale;
                    if (a.softcap > 0) sc = a.softcap * tanh(sc / a.softcap);
                    if (pass == 0) {
                        if (sc > m) m = sc;
                        if (e->edits > max_edits) max_edits = e->edits;
                    } else {
                        double p = exp(sc - m);
                        lsum += p;
                        const float *v = t->v + r->v_off[layer] + (size_t)hk * (size_t)dv;
                        for (int32_t j = 0; j < dv; j++) d->dacc[j] += p * v[j];
                    }
                }
                if (pass == 0 && use_sinks && sinks[h] > m) m = sinks[h];
            }
            if (use_sinks && m != -INFINITY) lsum += exp(sinks[h] - m);
            /* tolerance per output element from the codec noise model: with
             * score errors eps_e (std sigma_e) and stored-V errors dv_e,
             * o = sum p_e v_e moves by sum p_e eps_e (v_e - o) + sum p_e dv_e
             * to first order; the tolerance is NOISE_Z standard deviations
             * of each sum, a curvature term and a float-rounding floor */
            double want[64], var_k[64], var_v[64], dvo[64], sig_max = 0.0;
            for (int32_t j = 0; j < dv; j++) {
                want[j] = lsum > 0 ? d->dacc[j] / lsum : 0.0;
                var_k[j] = var_v[j] = dvo[j] = 0.0;
            }
            float qr[64], kr[64], vr[64];
            double vq[64], vk[64], vvv[64];
            for (int32_t j = 0; j < dk; j++) qr[j] = q[j];
            mem_col_rotate(kcol, qr);
            bool qquant = query_dot_type(L->k_dtype) != KEEL_DTYPE_F32;
            codec_var(query_dot_type(L->k_dtype), qr, dk, vq);
            for (int32_t k = 0; k < l->n && lsum > 0; k++) {
                const ref_entry *e = &l->e[k];
                if (!use[k]) continue;
                const ref_token *t = &r->toks[e->tok];
                ref_rope(L, t->k + r->k_off[layer] + (size_t)hk * (size_t)dk, e->pos, d->dk);
                double sc = 0.0;
                for (int32_t j = 0; j < dk; j++) {
                    sc += (double)q[j] * d->dk[j];
                    kr[j] = (float)d->dk[j];
                }
                sc *= scale;
                if (a.softcap > 0) sc = a.softcap * tanh(sc / a.softcap);
                double p = exp(sc - m) / lsum;
                mem_col_rotate(kcol, kr);
                codec_var(L->k_dtype, kr, dk, vk);
                double se = 0.0;
                for (int32_t j = 0; j < dk; j++) {
                    se += (double)qr[j] * qr[j] * vk[j] * (1.0 + e->edits);
                    if (qquant) se += vq[j] * (double)kr[j] * kr[j];
                }
                double sigma = scale * sqrt(se);
                if (sigma > sig_max) sig_max = sigma;
                const float *v = t->v + r->v_off[layer] + (size_t)hk * (size_t)dv;
                for (int32_t j = 0; j < dv; j++) vr[j] = v[j];
                mem_col_rotate(vcol, vr);
                codec_var(L->v_dtype, vr, dv, vvv);
                if (vcol->rot.enabled) /* back in the output basis: the block's mean */
                    for (int32_t b0 = 0; b0 < dv; b0 += vcol->rot.block) {
                        double mean = 0.0;
                        for (int32_t j = b0; j < b0 + vcol->rot.block; j++) mean += vvv[j];
                        mean /= vcol->rot.block;
                        for (int32_t j = b0; j < b0 + vcol->rot.block; j++) vvv[j] = mean;
                    }
                for (int32_t j = 0; j < dv; j++) {
                    double dvj = (double)v[j] - want[j];
                    var_k[j] += p * p * sigma * sigma * dvj * dvj;
                    var_v[j] += p * p * vvv[j];
                    if (fabs(dvj) > dvo[j]) dvo[j] = fabs(dvj);
                }
            }
            const float *o = d->out + ((size_t)i * (size_t)nh + (size_t)h) * (size_t)dv;
            double err = 0.0, tol = 1.0, ratio = 0.0;
            for (int32_t j = 0; j < dv; j++) {
                double tj = 4e-6 * sqrt(1.0 + max_edits) + NOISE_Z * sqrt(var_k[j]) +
                            NOISE_Z * sqrt(var_v[j]) + NOISE_Z2 * NOISE_Z2 * sig_max * sig_max * dvo[j];
                double ej = fabs(want[j] - (double)o[j]);
                if (isnan(ej)) ej = INFINITY;
                if (!(ej / tj <= ratio)) {
                    ratio = ej / tj;
                    err = ej;
                    tol = tj;
                }
            }
            if (ratio > d->res->max_err_ratio) {
                d->res->max_err_ratio = ratio;
                snprintf(d->res->max_err_case, sizeof d->res->max_err_case,
                         "step %lld layer %d (%s K%s, %s V%s, %s) err %.3g tol %.3g edits %d "
                         "softcap %g sinks %d",
                         (long long)d->step, layer, keel_dtype_name(L->k_dtype),
                         L->k_rot.enabled ? "+rot" : "", keel_dtype_name(L->v_dtype),
                         L->v_rot.enabled ? "+rot" : "",
                         L->kind == KEEL_MEM_LAYER_SLIDING ? "sliding" : "full", err, tol,
                         max_edits, (double)a.softcap, use_sinks);
            }
            if (!(ratio <= 1.0)) {
                d->res->divergences++;
                note(d, "attention diverges: layer %d (%s K%s, %s V%s, %s) seq %d pos %d head %d: err %.4g > tol %.4g (edits %d, softcap %g, sinks %d)",
                     layer, keel_dtype_name(L->k_dtype), L->k_rot.enabled ? "+rot" : "",
                     keel_dtype_name(L->v_dtype), L->v_rot.enabled ? "+rot" : "",
                     L->kind == KEEL_MEM_LAYER_SLIDING ? "sliding" : "full", seq[i], pos[i], h, err, tol,
                     max_edits, (double)a.softcap, use_sinks);
                if (d->res->divergences == 1) dump_seq(d, seq[i], g);
            }
        }
        free(use);
    }
}

static void compare_all(driver *d)
{
    int32_t nl = d->r.rc.mc.n_layers;
    int32_t l = (int32_t)pick(&d->ch, (uint32_t)nl);
    op_attend(d, l, 1 + (int32_t)pick(&d->ch, 3));
}

static int drive(chooser *ch, int preset, int64_t n_ops, FILE *log, memref_result *res)
{
    memset(res, 0, sizeof *res);
    driver d;
    memset(&d, 0, sizeof d);
    d.ch = *ch;
    d.res = res;
    d.log = log;
    d.only_seq = -1;
    d.trace = log && getenv("MEMREF_TRACE") && getenv("MEMREF_TRACE")[0] == '1';
    ref_cfg rc;
    make_config(&d.ch, preset, &rc);
    char err[BASE_ERR_CAP] = "";
    keel_status st = keel_mem_open(&rc.mc, &d.mem, err);
    if (st != KEEL_OK) {
        if (log) fprintf(log, "open failed: %s: %s\n", keel_strerror(st), err);
        res->invariant_failures++;
        return 1;
    }
    /* short caches reach the split-KV path of attention too: parts of a
     * few cells (preset 4 always, half the random configs) */
    if (preset == 4 || (preset < 0 && chance(&d.ch, 50)))
        d.mem->split_min_cells = 1 + (int32_t)pick(&d.ch, 16);
    ref_init(&d.r, &rc, d.mem, base_rng_next(&d.ch.rng) ^ 0x5eed);
    size_t maxk = 0, maxv = 0, maxq = 0, maxi = 1, maxiq = 1, maxtk = 1;
    for (int32_t l = 0; l < rc.mc.n_layers; l++) {
        maxi = BASE_MAX(maxi, (size_t)rc.layers[l].idx_head_dim);
        maxiq = BASE_MAX(maxiq, (size_t)rc.layers[l].idx_n_heads * (size_t)rc.layers[l].idx_head_dim);
        maxtk = BASE_MAX(maxtk, (size_t)rc.layers[l].idx_top_k);
        maxk = BASE_MAX(maxk, (size_t)rc.layers[l].n_kv_heads * (size_t)rc.layers[l].head_dim_k);
        maxv = BASE_MAX(maxv, (size_t)BASE_MAX(rc.layers[l].n_heads, rc.layers[l].n_kv_heads) *
                                  (size_t)rc.layers[l].head_dim_v);
        maxq = BASE_MAX(maxq, (size_t)rc.layers[l].n_heads * (size_t)rc.layers[l].head_dim_k);
    }
    d.kbuf = calloc(maxk * REF_MAX_BATCH, sizeof(float));
    d.vbuf = calloc(maxv * REF_MAX_BATCH, sizeof(float));
    d.qbuf = calloc(maxq * REF_MAX_BATCH, sizeof(float));
    d.out = calloc(maxv * REF_MAX_BATCH, sizeof(float));
    d.ibuf = calloc(maxi * REF_MAX_BATCH, sizeof(float));
    d.iqbuf = calloc(maxiq * REF_MAX_BATCH, sizeof(float));
    d.iwbuf = calloc(16 * REF_MAX_BATCH, sizeof(float));
    d.sel = calloc(maxtk * REF_MAX_BATCH, sizeof(int32_t));
    d.dq = calloc(64, sizeof(double));
    d.dk = calloc(64, sizeof(double));
    d.dacc = calloc(64, sizeof(double));
    keel_mem_stats ms;
    keel_mem_stats_get(d.mem, &ms);
    res->max_cap = rc.mc.n_ctx;
    res->max_cell = -1;
    for (d.step = 0; d.step < n_ops; d.step++) {
        uint32_t op = pick(&d.ch, 100);
        const char *name;
        if (op < 38) {
            op_place(&d);
            name = "place";
        } else if (op < 58) {
            op_attend(&d, (int32_t)pick(&d.ch, (uint32_t)rc.mc.n_layers), 1 + (int32_t)pick(&d.ch, 6));
            name = "attend";
        } else if (op < 66) {
            op_rm(&d);
            name = "seq_rm";
        } else if (op < 71) {
            op_cp(&d);
            name = "seq_cp";
        } else if (op < 73) {
            op_keep(&d);
            name = "seq_keep";
        } else if (op < 83) {
            op_edit(&d, false);
            name = "seq_add";
        } else if (op < 87) {
            op_edit(&d, true);
            name = "seq_div";
        } else if (op < 88) {
            op_clear(&d);
            name = "clear";
        } else if (op < 92) {
            op_compact(&d);
            name = "compact";
        } else if (op < 96 && (d.r.rs || op < 93)) {
            op_ckpt(&d);
            name = "ckpt_take";
        } else if (op < 99 && d.r.rs && d.r.rc.mc.spec_snapshot && chance(&d.ch, 40)) {
            op_spec(&d);
            name = "spec";
        } else if (op < 99 && d.r.rs) {
            /* the engine's pattern: a batch, then a checkpoint at its end */
            op_place(&d);
            check_invariants(&d, "place");
            op_ckpt(&d);
            name = "place + ckpt_take";
        } else {
            op_bad(&d);
            name = "bad input";
        }
        if (d.ch.exhausted) break;
        if (d.step % 97 == 96) {
            check_invariants(&d, name);
            op_session(&d);
            name = "session";
        }
        check_invariants(&d, name);
        compare_all(&d);
        res->ops++;
        if (log && (res->divergences + res->invariant_failures) > 20) break;
    }
    keel_mem_stats_get(d.mem, &ms);
    free(d.kbuf);
    free(d.vbuf);
    free(d.qbuf);
    free(d.out);
    free(d.ibuf);
    free(d.iqbuf);
    free(d.iwbuf);
    free(d.sel);
    free(d.dq);
    free(d.dk);
    free(d.dacc);
    ref_free(&d.r);
    keel_mem_close(d.mem);
    return res->divergences || res->invariant_failures ? 1 : 0;
}

int memref_run(const memref_opts *o, memref_result *res)
{
    chooser ch;
    memset(&ch, 0, sizeof ch);
    base_rng_seed(&ch.rng, o->seed);
    return drive(&ch, o->config, o->ops, o->quiet ? NULL : o->log, res);
}

int memref_run_bytes(const uint8_t *data, size_t size, memref_result *res)
{
    chooser ch;
    memset(&ch, 0, sizeof ch);
    uint64_t seed = 0;
    for (size_t i = 0; i < size && i < 8; i++) seed = seed * 131 + data[i];
    base_rng_seed(&ch.rng, seed);
    ch.bytes = true;
    ch.data = data;
    ch.size = size;
    return drive(&ch, -1, 1 << 20, NULL, res);
}

void memref_describe(const memref_opts *o, char *buf, size_t cap)
{
    chooser ch;
    memset(&ch, 0, sizeof ch);
    base_rng_seed(&ch.rng, o->seed);
    ref_cfg rc;
    make_config(&ch, o->config, &rc);
    size_t n = (size_t)snprintf(buf, cap, "n_seq %d %s n_ctx %d n_batch %d threads %d%s layers:",
                                rc.mc.n_seq_max, rc.mc.unified ? "unified" : "split", rc.mc.n_ctx,
                                rc.mc.n_batch_max, rc.mc.n_threads, rc.mc.deterministic ? " deterministic" : "");
    if (n < cap && (rc.mc.n_ckpt || rc.mc.n_rs_slots))
        n += (size_t)snprintf(buf + n, cap - n, " n_ckpt %d n_rs_slots %d", rc.mc.n_ckpt, rc.mc.n_rs_slots);
    for (int32_t l = 0; l < rc.mc.n_layers && n < cap; l++) {
        const keel_mem_layer *L = &rc.layers[l];
        if (L->kind == KEEL_MEM_LAYER_RECURRENT) {
            n += (size_t)snprintf(buf + n, cap - n, " [recurrent conv %dx%d state %lld]",
                                  L->rs.conv_kernel, L->rs.conv_channels, (long long)L->rs.state_floats);
            continue;
        }
        n += (size_t)snprintf(buf + n, cap - n, " [%s%s kv%d/q%d dk%d dv%d K %s%s V %s%s",
                              L->kind == KEEL_MEM_LAYER_FULL ? "full" : L->kind == KEEL_MEM_LAYER_NONE ? "none" : "sliding",
                              "", L->n_kv_heads, L->n_heads, L->head_dim_k, L->head_dim_v,
                              keel_dtype_name(L->k_dtype), L->k_rot.enabled ? "+rot" : "",
                              keel_dtype_name(L->v_dtype), L->v_rot.enabled ? "+rot" : "");
        if (n < cap && L->idx_head_dim > 0)
            n += (size_t)snprintf(buf + n, cap - n, " IDX %dx%d %s%s top_k %d", L->idx_n_heads, L->idx_head_dim,
                                  keel_dtype_name(L->idx_dtype), L->idx_rot.enabled ? "+rot" : "", L->idx_top_k);
        if (n < cap) n += (size_t)snprintf(buf + n, cap - n, "]");
    }
}
