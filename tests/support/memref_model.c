/*
 * memref_model.c — the reference memory of the differential driver
 * (memref.c): the op chooser, the configurations, the reference's lists,
 * tokens and sinks, and its recurrent half (histories, checkpoints, the toy
 * recurrence and RoPE in double).
 */
#include "memref_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- choices -------------------------------------------------------------- */


uint32_t mr_pick(chooser *c, uint32_t n)
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

bool mr_chance(chooser *c, uint32_t pct)
{
    return mr_pick(c, 100) < pct;
}

/* ---- configuration ------------------------------------------------------- */


static const keel_dtype g_kv_types[] = {KEEL_DTYPE_F32,  KEEL_DTYPE_F16,  KEEL_DTYPE_BF16,
                                        KEEL_DTYPE_Q8_0, KEEL_DTYPE_Q4_0, KEEL_DTYPE_Q4_1,
                                        KEEL_DTYPE_Q5_0, KEEL_DTYPE_Q5_1};

void mr_make_config(chooser *c, int preset, ref_cfg *rc)
{
    memset(rc, 0, sizeof *rc);
    rc->mc = keel_mem_config_default();
    int nl = 1 + (int)mr_pick(c, 3);
    rc->mc.n_layers = nl;
    rc->mc.layers = rc->layers;
    rc->mc.n_seq_max = 1 + (int32_t)mr_pick(c, REF_MAX_SEQ);
    rc->mc.unified = mr_chance(c, 60);
    rc->mc.n_ctx = 24 + (int32_t)mr_pick(c, 120);
    rc->mc.n_batch_max = 1 + (int32_t)mr_pick(c, REF_MAX_BATCH);
    rc->mc.n_threads = 1 + (int32_t)mr_pick(c, 2);
    for (int i = 0; i < REF_MAX_LAYERS; i++) {
        keel_mem_layer *l = &rc->layers[i];
        *l = keel_mem_layer_default();
        uint32_t kind = mr_pick(c, 10);
        l->kind = kind < 5 ? KEEL_MEM_LAYER_FULL : kind < 9 ? KEEL_MEM_LAYER_SLIDING : KEEL_MEM_LAYER_NONE;
        l->window = 3 + (int32_t)mr_pick(c, 20);
        l->n_sink = (int32_t)mr_pick(c, 4);
        l->n_kv_heads = 1 + (int32_t)mr_pick(c, 2);
        l->n_heads = l->n_kv_heads * (1 + (int32_t)mr_pick(c, 3));
        l->k_dtype = g_kv_types[mr_pick(c, 8)];
        l->v_dtype = g_kv_types[mr_pick(c, 8)];
        l->head_dim_k = mr_chance(c, 50) ? 32 : 64;
        l->head_dim_v = mr_chance(c, 50) ? 32 : 64;
        l->k_rot.enabled = mr_chance(c, 50);
        l->k_rot.block = mr_chance(c, 50) ? 32 : 0;
        l->k_rot.seed = mr_chance(c, 70) ? 1 + mr_pick(c, 1000) : 0;
        l->v_rot.enabled = mr_chance(c, 50);
        l->v_rot.block = mr_chance(c, 50) ? 32 : 0;
        l->v_rot.seed = mr_chance(c, 70) ? 1 + mr_pick(c, 1000) : 0;
        l->rope.type = mr_chance(c, 50) ? KEEL_ROPE_NORM : KEEL_ROPE_NEOX;
        l->rope.n_rot = mr_chance(c, 70) ? l->head_dim_k : l->head_dim_k / 2;
        l->rope.freq_base = mr_chance(c, 50) ? 10000.0f : 500000.0f;
        l->rope.freq_scale = mr_chance(c, 80) ? 1.0f : 0.25f;
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
        rc->mc.n_seq_max = 1 + (int32_t)mr_pick(c, 2);
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
    bool rs_cfg = preset >= 5 || (preset < 0 && mr_chance(c, 25));
    if (preset < 0 && rs_cfg)
        for (int i = 0; i < rc->mc.n_layers; i++)
            if (mr_chance(c, 35)) rc->layers[i].kind = KEEL_MEM_LAYER_RECURRENT;
    for (int i = 0; i < REF_MAX_LAYERS; i++) {
        keel_mem_recurrent *r = &rc->layers[i].rs;
        r->conv_kernel = 1 + (int32_t)mr_pick(c, 4);
        r->conv_channels = 1 + (int32_t)mr_pick(c, 6);
        r->state_floats = (int64_t)mr_pick(c, 12);
    }
    bool any_rs = false;
    for (int i = 0; i < rc->mc.n_layers; i++) any_rs |= rc->layers[i].kind == KEEL_MEM_LAYER_RECURRENT;
    if (any_rs) {
        rc->mc.n_ckpt = preset == 6 ? 2 : preset >= 5 ? 3 : (int32_t)mr_pick(c, REF_MAX_CKPT + 1);
        rc->mc.n_rs_slots = preset == 6 ? 2 : mr_chance(c, 25) ? 1 + (int32_t)mr_pick(c, (uint32_t)rc->mc.n_seq_max) : 0;
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
void mr_codec_var(keel_dtype t, const float *x, int32_t n, double *var)
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
keel_dtype mr_query_dot_type(keel_dtype t)
{
    switch (t) {
    case KEEL_DTYPE_Q8_0: case KEEL_DTYPE_Q4_0: case KEEL_DTYPE_Q5_0: return KEEL_DTYPE_Q8_0;
    case KEEL_DTYPE_Q4_1: case KEEL_DTYPE_Q5_1: return KEEL_DTYPE_Q8_1;
    default: return KEEL_DTYPE_F32;
    }
}


/* ---- reference ----------------------------------------------------------- */


void mr_plist_push(ref_plist *l, int32_t p)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 16;
        l->p = realloc(l->p, (size_t)l->cap * sizeof(int32_t));
        if (!l->p) abort();
    }
    l->p[l->n++] = p;
}


void mr_list_push(ref_list *l, ref_entry e)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 16;
        l->e = realloc(l->e, (size_t)l->cap * sizeof(ref_entry));
        if (!l->e) abort();
    }
    l->e[l->n++] = e;
}

void mr_tok_unref(ref *r, int32_t t)
{
    if (--r->toks[t].refs == 0) {
        free(r->toks[t].k);
        free(r->toks[t].v);
        free(r->toks[t].ik);
        r->toks[t].k = r->toks[t].v = r->toks[t].ik = NULL;
        r->free_toks[r->n_free++] = t;
    }
}

/* A free token slot: a released one, else a new one (the arrays grown). */
static int32_t tok_slot(ref *r)
{
    if (r->n_free > 0) return r->free_toks[--r->n_free];
    if (r->n_toks == r->cap_toks) {
        r->cap_toks = r->cap_toks ? 2 * r->cap_toks : 256;
        r->toks = realloc(r->toks, (size_t)r->cap_toks * sizeof(ref_token));
        r->free_toks = realloc(r->free_toks, (size_t)r->cap_toks * sizeof(int32_t));
        if (!r->toks || !r->free_toks) abort();
    }
    return r->n_toks++;
}

int32_t mr_tok_new(ref *r)
{
    int32_t t = tok_slot(r);
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
int32_t mr_tok_clone(ref *r, int32_t t)
{
    int32_t c = tok_slot(r);
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

void mr_ref_init(ref *r, const ref_cfg *rc, keel_mem *mem, uint64_t data_seed)
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

void mr_ref_free(ref *r)
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

bool mr_key_less(int32_t p, uint64_t st, int32_t q, uint64_t su)
{
    return p < q || (p == q && st < su);
}

/* The n_sink-th lowest (pos, stamp) of a list counting duplicates (a cell
 * copied into a stream twice is two cells), or pos -1. O(n^2). */
void mr_sink_threshold(const ref *r, const ref_list *l, int32_t n_sink, int32_t *tp,
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
            if (mr_key_less(q, su, p, st))
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

int32_t mr_ref_lists_max(const ref *r, int32_t s)
{
    int32_t mx = -1;
    for (int32_t g = 0; g < r->n_groups; g++)
        for (int32_t i = 0; i < r->lists[s][g].n; i++)
            if (r->lists[s][g].e[i].pos > mx) mx = r->lists[s][g].e[i].pos;
    return mx;
}

int32_t mr_ref_lists_min(const ref *r, int32_t s)
{
    int32_t mn = -1;
    for (int32_t g = 0; g < r->n_groups; g++)
        for (int32_t i = 0; i < r->lists[s][g].n; i++)
            if (mn < 0 || r->lists[s][g].e[i].pos < mn) mn = r->lists[s][g].e[i].pos;
    return mn;
}

int32_t mr_ref_pos_max(const ref *r, int32_t s)
{
    int32_t mx = mr_ref_lists_max(r, s);
    if (r->rs && r->rs_hi[s] > mx) mx = r->rs_hi[s];
    return mx;
}

bool mr_ref_seq_empty(const ref *r, int32_t s)
{
    if (r->rs && r->hist[s].n) return false;
    for (int32_t g = 0; g < r->n_groups; g++)
        if (r->lists[s][g].n) return false;
    return true;
}

/* ---- the recurrent half of the reference ----------------------------------- */

void mr_hist_push(ref_hist *h, uint64_t st)
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
void mr_rs_update(const keel_mem_recurrent *R, int32_t l, uint64_t st, float *conv, float *state)
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

void mr_ref_ck_free(ref *r, ref_ckpt *c)
{
    for (int32_t g = 0; g < r->n_groups; g++) {
        for (int32_t i = 0; i < c->ring[g].n; i++) mr_tok_unref(r, c->ring[g].e[i].tok);
        c->ring[g].n = 0;
        c->forg[g].n = 0;
    }
}

/* Drops s's checkpoints covering positions >= above (above < 0: all). */
void mr_ref_ck_drop(ref *r, int32_t s, int32_t above)
{
    int32_t w = 0;
    for (int32_t i = 0; i < r->n_ck[s]; i++) {
        if (above < 0 || r->ck[s][i].pos > above) {
            mr_ref_ck_free(r, &r->ck[s][i]);
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

void mr_ref_rs_drop(ref *r, int32_t s)
{
    r->hist[s].n = 0;
    r->rs_lo[s] = r->rs_hi[s] = -1;
    r->rs_id[s] = -1;
    mr_ref_ck_drop(r, s, -1);
}

int32_t mr_ref_slots_used(const ref *r)
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

bool mr_ref_shared(const ref *r, int32_t s)
{
    for (int32_t q = 0; q < r->rc.mc.n_seq_max; q++)
        if (q != s && r->hist[q].n && r->rs_id[q] == r->rs_id[s]) return true;
    return false;
}

/* The newest checkpoint of s at or before p0, or -1. */
int32_t mr_ref_ck_find(const ref *r, int32_t s, int32_t p0)
{
    int32_t best = -1;
    for (int32_t i = 0; i < r->n_ck[s]; i++)
        if (r->ck[s][i].pos <= p0 && (best < 0 || r->ck[s][i].pos > r->ck[s][best].pos)) best = i;
    return best;
}

/* RoPE in double at position p of a row of d elements (no YaRN here). */
void mr_ref_rope_row(const keel_rope *R, int32_t d, const float *x, double p, double *y)
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
void mr_ref_rope(const keel_mem_layer *L, const float *x, double p, double *y)
{
    mr_ref_rope_row(&L->rope, L->head_dim_k, x, p, y);
}
