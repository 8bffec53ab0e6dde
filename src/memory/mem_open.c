/*
 * mem_open.c — the keel_mem object's configuration and exact memory plan,
 * open and close.
 *
 * Everything the memory needs is allocated at open, in one block laid out by
 * mem_layout (tables, metadata, columns, descriptors), one scratch arena
 * sized for the largest operation, and the thread pool. keel_mem_config_bytes
 * runs the same layout without allocating, so the reported size is exact.
 * The scratch each operation of mem.c takes is sized here (scratch_bytes):
 * a new operation's scratch must be added to it.
 */
#include "memory.h"

#include <limits.h>
#include <string.h>

/* ---- configuration ------------------------------------------------------- */

keel_mem_layer keel_mem_layer_default(void)
{
    keel_mem_layer l;
    memset(&l, 0, sizeof l);
    l.kind = KEEL_MEM_LAYER_FULL;
    l.n_kv_heads = 1;
    l.head_dim_k = 64;
    l.head_dim_v = 64;
    l.k_dtype = KEEL_DTYPE_F16;
    l.v_dtype = KEEL_DTYPE_F16;
    l.rope = keel_rope_default();
    l.rope.n_rot = 64;
    l.idx_dtype = KEEL_DTYPE_F16;
    l.idx_rope = keel_rope_default();
    l.idx_rope.type = KEEL_ROPE_NONE;
    l.idx_rope.n_rot = 0;
    return l;
}

keel_mem_config keel_mem_config_default(void)
{
    keel_mem_config c;
    memset(&c, 0, sizeof c);
    c.n_seq_max = 1;
    c.n_ctx = 4096;
    c.unified = true;
    c.n_batch_max = 512;
    c.n_threads = 0;
    return c;
}

static bool kv_dtype_ok(keel_dtype t)
{
    switch (t) {
    case KEEL_DTYPE_F32:
    case KEEL_DTYPE_F16:
    case KEEL_DTYPE_BF16:
    case KEEL_DTYPE_Q8_0:
    case KEEL_DTYPE_Q4_0:
    case KEEL_DTYPE_Q4_1:
    case KEEL_DTYPE_Q5_0:
    case KEEL_DTYPE_Q5_1:
        return true;
    default:
        return false;
    }
}

/* Resolves a rotation block for head_dim: the requested one, or the largest
 * power of two in [32, 512] dividing head_dim. 0 if impossible. */
static int32_t rot_block(const keel_mem_rot *r, int32_t head_dim)
{
    if (r->block > 0) {
        int32_t b = r->block;
        if (b < 32 || b > 512 || (b & (b - 1)) || head_dim % b) return 0;
        return b;
    }
    for (int32_t b = 512; b >= 32; b /= 2)
        if (head_dim % b == 0) return b;
    return 0;
}

static keel_status validate_layer(const keel_mem_layer *l, int32_t i, char *err)
{
    if (l->kind == KEEL_MEM_LAYER_NONE) return KEEL_OK;
    if (l->kind == KEEL_MEM_LAYER_RECURRENT) {
        const keel_mem_recurrent *r = &l->rs;
        if (r->conv_kernel < 1 || r->conv_kernel > 64 || r->conv_channels < 1 ||
            r->conv_channels > (1 << 20) || r->state_floats < 0 || r->state_floats > (1 << 30))
            return base_err(err, KEEL_EINVAL,
                            "layer %d: recurrent state conv_kernel %d (need 1..64), conv_channels "
                            "%d (need 1..2^20), state_floats %lld (need 0..2^30)",
                            i, r->conv_kernel, r->conv_channels, (long long)r->state_floats);
        return KEEL_OK;
    }
    if (l->kind != KEEL_MEM_LAYER_FULL && l->kind != KEEL_MEM_LAYER_SLIDING)
        return base_err(err, KEEL_EINVAL, "layer %d: unknown kind %d", i, (int)l->kind);
    if (l->n_kv_heads < 1 || l->n_kv_heads > 4096 || l->head_dim_k < 1 || l->head_dim_k > 8192 ||
        l->head_dim_v < 1 || l->head_dim_v > 8192)
        return base_err(err, KEEL_EINVAL, "layer %d: bad heads (%d) or head dims (%d, %d)", i,
                        l->n_kv_heads, l->head_dim_k, l->head_dim_v);
    int32_t nh = l->n_heads ? l->n_heads : l->n_kv_heads;
    if (nh < l->n_kv_heads || nh % l->n_kv_heads || nh > 65536)
        return base_err(err, KEEL_EINVAL,
                        "layer %d: n_heads %d is not a multiple of n_kv_heads %d", i, nh,
                        l->n_kv_heads);
    if (l->kind == KEEL_MEM_LAYER_SLIDING) {
        if (l->window < 1 || l->n_sink < 0 || l->n_sink > (1 << 20) || l->window > (1 << 28))
            return base_err(err, KEEL_EINVAL, "layer %d: bad window %d or n_sink %d", i,
                            l->window, l->n_sink);
    }
    if (l->idx_head_dim < 0 || l->idx_head_dim > 8192)
        return base_err(err, KEEL_EINVAL, "layer %d: indexer head dim %d (0: none, else 1..8192)", i,
                        l->idx_head_dim);
    if (l->idx_head_dim > 0 && (l->idx_n_heads < 1 || l->idx_n_heads > 4096 || l->idx_top_k < 1 ||
                                l->idx_top_k > (1 << 20)))
        return base_err(err, KEEL_EINVAL,
                        "layer %d: indexer query heads %d (need 1..4096) or top_k %d (need 1..2^20)", i,
                        l->idx_n_heads, l->idx_top_k);
    const keel_dtype dts[3] = {l->k_dtype, l->v_dtype, l->idx_dtype};
    const int32_t dims[3] = {l->head_dim_k, l->head_dim_v, l->idx_head_dim};
    const char *names[3] = {"K", "V", "indexer"};
    const keel_mem_rot *rots[3] = {&l->k_rot, &l->v_rot, &l->idx_rot};
    for (int j = 0; j < mem_layer_n_cols(l); j++) {
        if (!kv_dtype_ok(dts[j]))
            return base_err(err, KEEL_EUNSUPPORTED, "layer %d: %s cache type %s is not supported",
                            i, names[j], keel_dtype_name(dts[j]) ? keel_dtype_name(dts[j]) : "?");
        int64_t bs = keel_dtype_block_size(dts[j]);
        if (dims[j] % bs)
            return base_err(err, KEEL_EUNSUPPORTED,
                            "layer %d: %s cache type %s with block size %lld does not divide "
                            "head_dim %d",
                            i, names[j], keel_dtype_name(dts[j]), (long long)bs, dims[j]);
        if (rots[j]->block < 0)
            return base_err(err, KEEL_EINVAL, "layer %d: %s rotation block %d (0 = auto, or a power of two)",
                            i, names[j], rots[j]->block);
        if (rots[j]->enabled && rot_block(rots[j], dims[j]) == 0)
            return base_err(err, KEEL_EUNSUPPORTED,
                            "layer %d: %s rotation block %d invalid for head_dim %d (need a "
                            "power of two in [32, 512] dividing it)",
                            i, names[j], rots[j]->block, dims[j]);
    }
    for (int j = 0; j < 2; j++) {
        if (j == 1 && l->idx_head_dim == 0) break;
        const keel_rope *r = j == 0 ? &l->rope : &l->idx_rope;
        int32_t hd = j == 0 ? l->head_dim_k : l->idx_head_dim;
        const char *what = j == 0 ? "rope" : "indexer rope";
        if (r->type == KEEL_ROPE_NONE) continue;
        if (r->type != KEEL_ROPE_NORM && r->type != KEEL_ROPE_NEOX)
            return base_err(err, KEEL_EINVAL, "layer %d: unknown %s type %d", i, what, (int)r->type);
        if (r->n_rot < 2 || r->n_rot % 2 || r->n_rot > hd)
            return base_err(err, KEEL_EINVAL, "layer %d: %s n_rot %d invalid for head_dim %d",
                            i, what, r->n_rot, hd);
        if (tensor_rope_check(r) != KEEL_OK)
            return base_err(err, KEEL_EINVAL,
                            "layer %d: invalid %s parameters (freq_base %g, freq_scale %g, "
                            "ext_factor %g, attn_factor %g, n_ctx_orig %d, beta %g/%g%s): need "
                            "finite freq_base, freq_scale, attn_factor > 0, finite ext_factor, "
                            "with YaRN n_ctx_orig >= 1 and betas > 0, freq_factors finite > 0",
                            i, what, (double)r->freq_base, (double)r->freq_scale, (double)r->ext_factor,
                            (double)r->attn_factor, r->n_ctx_orig, (double)r->beta_fast,
                            (double)r->beta_slow, r->freq_factors ? ", freq_factors" : "");
    }
    return KEEL_OK;
}

static keel_status validate_config(const keel_mem_config *cfg, char *err)
{
    if (!cfg) return base_err(err, KEEL_EINVAL, "config is NULL");
    if (cfg->n_layers < 1 || cfg->n_layers > 4096 || !cfg->layers)
        return base_err(err, KEEL_EINVAL, "n_layers %d (need 1..4096 and a layer array)",
                        cfg->n_layers);
    if (cfg->n_seq_max < 1 || cfg->n_seq_max > MEM_SEQ_MAX)
        return base_err(err, KEEL_EINVAL, "n_seq_max %d (need 1..%d)", cfg->n_seq_max,
                        MEM_SEQ_MAX);
    if (cfg->n_ctx < 1 || cfg->n_ctx > (1 << 28))
        return base_err(err, KEEL_EINVAL, "n_ctx %d (need 1..2^28)", cfg->n_ctx);
    if (cfg->n_batch_max < 1 || cfg->n_batch_max > (1 << 20))
        return base_err(err, KEEL_EINVAL, "n_batch_max %d (need 1..2^20)", cfg->n_batch_max);
    if (cfg->n_threads < 0 || cfg->n_threads > 256)
        return base_err(err, KEEL_EINVAL, "n_threads %d (need 0..256)", cfg->n_threads);
    bool recurrent = false, sliding = false;
    for (int32_t i = 0; i < cfg->n_layers; i++) {
        keel_status st = validate_layer(&cfg->layers[i], i, err);
        if (st != KEEL_OK) return st;
        recurrent |= cfg->layers[i].kind == KEEL_MEM_LAYER_RECURRENT;
        sliding |= cfg->layers[i].kind == KEEL_MEM_LAYER_SLIDING;
    }
    if (cfg->n_rs_slots < 0 || cfg->n_rs_slots > (1 << 16))
        return base_err(err, KEEL_EINVAL, "n_rs_slots %d (need 0..65536; 0 = n_seq_max)",
                        cfg->n_rs_slots);
    if (cfg->n_ckpt < 0 || cfg->n_ckpt > 4096)
        return base_err(err, KEEL_EINVAL, "n_ckpt %d (need 0..4096)", cfg->n_ckpt);
    if (cfg->n_ckpt > 0 && !recurrent && !sliding)
        return base_err(err, KEEL_EINVAL,
                        "n_ckpt %d: checkpoints need recurrent or sliding layers (full attention "
                        "alone rewinds exactly anywhere)",
                        cfg->n_ckpt);
    /* group cell ids are stream * cap + cell in int32 */
    int64_t n_streams = cfg->unified ? 1 : cfg->n_seq_max;
    if (n_streams * (int64_t)cfg->n_ctx > INT32_MAX)
        return base_err(err, KEEL_EINVAL,
                        "n_seq_max %d x n_ctx %d split streams exceed 2^31 - 1 cells (cell ids are "
                        "int32): use a unified cache or a smaller n_ctx",
                        cfg->n_seq_max, cfg->n_ctx);
    return KEEL_OK;
}

/* ---- layout: one pass counts, the second assigns pointers ----------------- */

typedef struct mem_layout {
    uint8_t *base; /* NULL while counting */
    size_t off;
    bool overflow;
    bool bad;      /* a descriptor could not be filled (assigning pass) */
} mem_layout;

static void *lay_take(mem_layout *l, size_t n, size_t elem)
{
    size_t bytes, start, end;
    if (!size_mul(n, elem, &bytes) || !size_align_up(l->off, BASE_ALIGN, &start) ||
        !size_add(start, bytes, &end)) {
        l->overflow = true;
        return NULL;
    }
    l->off = end;
    return l->base ? l->base + start : NULL;
}

static bool same_group(const keel_mem_layer *a, const mem_group *g)
{
    if (a->kind != g->kind) return false;
    if (a->kind == KEEL_MEM_LAYER_SLIDING) return a->window == g->window && a->n_sink == g->n_sink;
    return true;
}

/* The group a layer belongs to, as a shape (kind, window, sinks). */
static mem_group group_shape(const keel_mem_layer *a)
{
    mem_group g;
    memset(&g, 0, sizeof g);
    g.kind = a->kind;
    g.window = a->kind == KEEL_MEM_LAYER_SLIDING ? a->window : 0;
    g.n_sink = a->kind == KEEL_MEM_LAYER_SLIDING ? a->n_sink : 0;
    return g;
}

/* Layer i has KV and no earlier layer shares its group. */
static bool opens_group(const keel_mem_config *cfg, int32_t i)
{
    if (!mem_layer_has_kv(&cfg->layers[i])) return false;
    mem_group shape = group_shape(&cfg->layers[i]);
    for (int32_t j = 0; j < i; j++)
        if (same_group(&cfg->layers[j], &shape)) return false;
    return true;
}

static int32_t table_cap(const keel_mem_config *cfg, const mem_group *g, int32_t n_streams)
{
    if (g->kind == KEEL_MEM_LAYER_FULL) return cfg->n_ctx;
    int64_t seqs = n_streams == 1 ? cfg->n_seq_max : 1;
    int64_t ring = seqs * ((int64_t)g->n_sink + g->window) + cfg->n_batch_max;
    return (int32_t)(ring < cfg->n_ctx ? ring : cfg->n_ctx);
}

size_t mem_config_kv_bytes(const keel_mem_config *cfg)
{
    if (validate_config(cfg, NULL) != KEEL_OK) return 0;
    int32_t n_streams = cfg->unified ? 1 : cfg->n_seq_max;
    size_t kv = 0;
    for (int32_t i = 0; i < cfg->n_layers; i++) {
        const keel_mem_layer *a = &cfg->layers[i];
        if (!mem_layer_has_kv(a)) continue;
        mem_group shape = group_shape(a);
        size_t cells = (size_t)table_cap(cfg, &shape, n_streams) * (size_t)n_streams;
        for (int32_t j = 0; j < mem_layer_n_cols(a); j++) {
            mem_col_spec cs = mem_layer_col_spec(a, j);
            kv += cells * (size_t)cs.n_heads * tensor_row_bytes(cs.dtype, cs.head_dim);
        }
    }
    return kv;
}

/*
 * Lays out everything but the keel_mem struct. With l->base == NULL only
 * counts; m's pointer fields are then left untouched except counts.
 */
static void mem_lay_out(keel_mem *m, const keel_mem_config *cfg, mem_layout *l)
{
    bool assign = l->base != NULL;
    int32_t nl = cfg->n_layers;
    int32_t n_streams = cfg->unified ? 1 : cfg->n_seq_max;
    keel_mem_layer *layers = lay_take(l, (size_t)nl, sizeof(keel_mem_layer));
    int32_t *layer_group = lay_take(l, (size_t)nl, sizeof(int32_t));
    int32_t *layer_col = lay_take(l, (size_t)nl, sizeof(int32_t));
    mem_group *groups = lay_take(l, (size_t)nl, sizeof(mem_group));
    /* Groups in order of the layer that opens each (no scratch needed: the
     * counting pass runs before anything is allocated). */
    int32_t n_groups = 0;
    for (int32_t i = 0; i < nl; i++) n_groups += opens_group(cfg, i);
    if (assign) {
        memcpy(layers, cfg->layers, (size_t)nl * sizeof(keel_mem_layer));
        m->cfg = *cfg;
        m->cfg.layers = layers;
        m->layers = layers;
        m->layer_group = layer_group;
        m->layer_col = layer_col;
        m->groups = groups;
        m->n_groups = 0;
        m->n_streams = n_streams;
        for (int32_t i = 0; i < nl; i++) {
            const keel_mem_layer *a = &layers[i];
            layer_group[i] = -1;
            layer_col[i] = -1;
            if (!mem_layer_has_kv(a)) continue;
            int32_t g = 0;
            while (g < m->n_groups && !same_group(a, &groups[g])) g++;
            if (g == m->n_groups) {
                groups[g] = group_shape(a);
                groups[g].n_tables = n_streams;
                m->n_groups++;
            }
            layer_group[i] = g;
            /* the group's columns so far: those of its earlier layers */
            int32_t ci = 0;
            for (int32_t j = 0; j < i; j++)
                if (layer_group[j] == g) ci += mem_layer_n_cols(&layers[j]);
            layer_col[i] = ci;
            groups[g].n_layers++;
        }
    }
    int32_t seq_words = (cfg->n_seq_max + 63) / 64;
    for (int32_t g = 0, rep = 0; g < n_groups; g++, rep++) {
        /* the g-th group is opened by the g-th layer that opens one */
        while (!opens_group(cfg, rep)) rep++;
        mem_group shape = group_shape(&cfg->layers[rep]);
        int32_t gc = 0; /* columns of the group's layers */
        for (int32_t i = 0; i < nl; i++)
            if (mem_layer_has_kv(&cfg->layers[i]) && same_group(&cfg->layers[i], &shape))
                gc += mem_layer_n_cols(&cfg->layers[i]);
        int32_t cap = table_cap(cfg, &shape, n_streams);
        mem_table *tables = lay_take(l, (size_t)n_streams, sizeof(mem_table));
        if (assign) groups[g].tables = tables;
        for (int32_t s = 0; s < n_streams; s++) {
            mem_table *t = assign ? &tables[s] : NULL;
            int32_t *pos = lay_take(l, (size_t)cap, sizeof(int32_t));
            uint64_t *stamp = lay_take(l, (size_t)cap, sizeof(uint64_t));
            uint64_t *seq = lay_take(l, (size_t)cap * (size_t)seq_words, sizeof(uint64_t));
            uint8_t *flags = lay_take(l, (size_t)cap, 1);
            uint8_t *cflags = lay_take(l, (size_t)cap, 1);
            int32_t *newpos = lay_take(l, (size_t)cap, sizeof(int32_t));
            int32_t *seq_min = lay_take(l, (size_t)cfg->n_seq_max, sizeof(int32_t));
            int32_t *seq_max = lay_take(l, (size_t)cfg->n_seq_max, sizeof(int32_t));
            int32_t *seq_cells = lay_take(l, (size_t)cfg->n_seq_max, sizeof(int32_t));
            int32_t *seq_lo = lay_take(l, (size_t)cfg->n_seq_max, sizeof(int32_t));
            int32_t *seq_hi = lay_take(l, (size_t)cfg->n_seq_max, sizeof(int32_t));
            mem_col *cols = lay_take(l, (size_t)gc, sizeof(mem_col));
            int32_t *evict_max = NULL, *sink_pos = NULL, *heap_pos = NULL;
            uint64_t *sink_stamp = NULL, *heap_stamp = NULL;
            if (shape.kind == KEEL_MEM_LAYER_SLIDING) {
                evict_max = lay_take(l, (size_t)cfg->n_seq_max, sizeof(int32_t));
                sink_pos = lay_take(l, (size_t)cfg->n_seq_max, sizeof(int32_t));
                sink_stamp = lay_take(l, (size_t)cfg->n_seq_max, sizeof(uint64_t));
                size_t hs = shape.n_sink > 0 ? (size_t)shape.n_sink : 1;
                heap_pos = lay_take(l, hs, sizeof(int32_t));
                heap_stamp = lay_take(l, hs, sizeof(uint64_t));
            }
            if (t) {
                memset(t, 0, sizeof *t);
                t->cap = cap;
                t->seq_words = seq_words;
                t->stream = n_streams == 1 ? -1 : s;
                t->pos = pos;
                t->stamp = stamp;
                t->seq = seq;
                t->flags = flags;
                t->cflags = cflags;
                t->newpos = newpos;
                t->seq_min = seq_min;
                t->seq_max = seq_max;
                t->seq_cells = seq_cells;
                t->seq_lo = seq_lo;
                t->seq_hi = seq_hi;
                t->n_seq = cfg->n_seq_max;
                t->cols = cols;
                t->n_cols = gc;
                t->sliding = shape.kind == KEEL_MEM_LAYER_SLIDING;
                t->window = shape.window;
                t->n_sink = shape.n_sink;
                t->evict_max = evict_max;
                t->sink_pos = sink_pos;
                t->sink_stamp = sink_stamp;
                t->heap_pos = heap_pos;
                t->heap_stamp = heap_stamp;
                t->sinks_dirty = true;
            }
            /* columns: K, V (and IDX) of each layer of the group, in layer order */
            for (int32_t i = 0, ci = 0; i < nl; i++) {
                const keel_mem_layer *a = &cfg->layers[i];
                if (!mem_layer_has_kv(a) || !same_group(a, &shape)) continue;
                for (int32_t kv = 0; kv < mem_layer_n_cols(a); kv++, ci++) {
                    mem_col_spec spec = mem_layer_col_spec(a, kv);
                    keel_dtype dt = spec.dtype;
                    int32_t hd = spec.head_dim;
                    const keel_mem_rot *rot = spec.rot;
                    size_t hrb = tensor_row_bytes(dt, hd);
                    size_t data_bytes = 0;
                    if (!size_mul((size_t)spec.n_heads * (size_t)cap, hrb, &data_bytes))
                        l->overflow = true;
                    uint8_t *data = lay_take(l, data_bytes, 1);
                    int32_t blk = rot->enabled ? rot_block(rot, hd) : 0;
                    float *signs = NULL;
                    if (rot->enabled && rot->seed != 0) signs = lay_take(l, (size_t)blk, sizeof(float));
                    bool has_rope = spec.rope && spec.rope->type != KEEL_ROPE_NONE;
                    int32_t half = has_rope ? spec.rope->n_rot / 2 : 0;
                    double *rates = has_rope ? lay_take(l, (size_t)half, sizeof(double)) : NULL;
                    float *ff = has_rope && spec.rope->freq_factors
                                    ? lay_take(l, (size_t)half, sizeof(float))
                                    : NULL;
                    if (!t) continue;
                    mem_col *c = &cols[ci];
                    memset(c, 0, sizeof *c);
                    c->kind = (mem_col_kind)kv;
                    c->layer = i;
                    c->dtype = dt;
                    c->n_heads = spec.n_heads;
                    c->head_dim = hd;
                    c->head_row_bytes = hrb;
                    c->rot = *rot;
                    c->rot.block = blk;
                    c->signs = signs;
                    if (signs) tensor_wht_signs(rot->seed, blk, signs);
                    c->data = data;
                    c->data_bytes = data_bytes;
                    if (has_rope) {
                        c->rope = *spec.rope;
                        if (ff) {
                            memcpy(ff, spec.rope->freq_factors, (size_t)half * sizeof(float));
                            c->rope.freq_factors = ff;
                        }
                        c->freq_factors = ff;
                        float mscale;
                        /* validate_layer ran tensor_rope_check: cannot fail; if it
                         * did, open fails rather than store unrotatable keys */
                        if (tensor_rope_rates(&c->rope, rates, &mscale) != KEEL_OK) l->bad = true;
                        c->rope_rates = rates;
                    } else {
                        c->rope = keel_rope_default();
                        c->rope.type = KEEL_ROPE_NONE;
                        c->rope.n_rot = 0;
                    }
                }
            }
        }
    }
    /* per-sequence state: exactness bound, compaction counters, KeyDiff anchors */
    int32_t *exact_from = lay_take(l, (size_t)cfg->n_seq_max, sizeof(int32_t));
    int64_t *n_compact = lay_take(l, (size_t)cfg->n_seq_max, sizeof(int64_t));
    int32_t *cells_high = lay_take(l, (size_t)cfg->n_seq_max, sizeof(int32_t));
    size_t *anchor_off = lay_take(l, (size_t)nl, sizeof(size_t));
    size_t af = 0;
    for (int32_t i = 0; i < nl; i++) {
        const keel_mem_layer *a = &cfg->layers[i];
        if (anchor_off) anchor_off[i] = SIZE_MAX;
        if (a->kind != KEEL_MEM_LAYER_FULL) continue;
        if (anchor_off) anchor_off[i] = af;
        af += (size_t)a->n_kv_heads * (size_t)a->head_dim_k;
    }
    float *anchor = lay_take(l, (size_t)cfg->n_seq_max * (af ? af : 1), sizeof(float));
    uint64_t *anchor_stamp = lay_take(l, (size_t)cfg->n_seq_max, sizeof(uint64_t));
    uint8_t *anchor_valid = lay_take(l, (size_t)cfg->n_seq_max, 1);
    if (assign) {
        m->exact_from = exact_from;
        m->n_compact = n_compact;
        m->cells_high = cells_high;
        m->anchor_off = anchor_off;
        m->anchor_floats = af;
        m->anchor = anchor;
        m->anchor_stamp = anchor_stamp;
        m->anchor_valid = anchor_valid;
    }
    /* the recurrent half: slots, per-sequence positions, checkpoint records */
    int32_t n_rs = 0;
    size_t slot_floats = 0;
    for (int32_t i = 0; i < nl; i++)
        if (cfg->layers[i].kind == KEEL_MEM_LAYER_RECURRENT) {
            const keel_mem_recurrent *r = &cfg->layers[i].rs;
            size_t conv = (size_t)(r->conv_kernel - 1) * (size_t)r->conv_channels;
            slot_floats += ((conv + 15) & ~(size_t)15) + (((size_t)r->state_floats + 15) & ~(size_t)15);
            n_rs++;
        }
    int32_t n_slots = n_rs == 0 ? 0 : cfg->n_rs_slots > 0 ? cfg->n_rs_slots : cfg->n_seq_max;
    int32_t *layer_rs = lay_take(l, (size_t)nl, sizeof(int32_t));
    size_t *conv_off = lay_take(l, (size_t)(n_rs ? n_rs : 1), sizeof(size_t));
    size_t *state_off = lay_take(l, (size_t)(n_rs ? n_rs : 1), sizeof(size_t));
    size_t slots_total = 0;
    if (!size_mul(slot_floats, (size_t)n_slots, &slots_total)) l->overflow = true;
    float *rs_data = lay_take(l, slots_total ? slots_total : 1, sizeof(float));
    int32_t *rs_refs = lay_take(l, (size_t)(n_slots ? n_slots : 1), sizeof(int32_t));
    int32_t *seq_slot = lay_take(l, (size_t)cfg->n_seq_max, sizeof(int32_t));
    int32_t *rs_pos_min = lay_take(l, (size_t)cfg->n_seq_max, sizeof(int32_t));
    int32_t *rs_pos_max = lay_take(l, (size_t)cfg->n_seq_max, sizeof(int32_t));
    uint64_t *rs_stamp = lay_take(l, (size_t)cfg->n_seq_max, sizeof(uint64_t));
    /* speculation snapshots: one state per sequence */
    bool spec = n_rs > 0 && cfg->spec_snapshot;
    size_t spec_total = 0;
    if (spec && !size_mul(slot_floats, (size_t)cfg->n_seq_max, &spec_total)) l->overflow = true;
    float *spec_data = spec ? lay_take(l, spec_total ? spec_total : 1, sizeof(float)) : NULL;
    int32_t *spec_pos = spec ? lay_take(l, (size_t)cfg->n_seq_max, sizeof(int32_t)) : NULL;
    int32_t *spec_lo = spec ? lay_take(l, (size_t)cfg->n_seq_max, sizeof(int32_t)) : NULL;
    uint64_t *spec_stamp = spec ? lay_take(l, (size_t)cfg->n_seq_max, sizeof(uint64_t)) : NULL;
    mem_ckpt_ring *rings = lay_take(l, (size_t)nl, sizeof(mem_ckpt_ring));
    size_t rec = mem_ckpt_record_bytes(cfg, NULL, NULL);
    if (rec == SIZE_MAX) l->overflow = true;
    int32_t n_ck = rec == SIZE_MAX ? 0 : mem_ckpt_count(cfg, rec);
    size_t n_rec = (size_t)cfg->n_seq_max * (size_t)n_ck, data_bytes = 0;
    if (!size_mul(n_rec, rec == SIZE_MAX ? 0 : rec, &data_bytes)) l->overflow = true;
    mem_ckpt *ckpts = lay_take(l, n_rec ? n_rec : 1, sizeof(mem_ckpt));
    uint8_t *ckpt_data = lay_take(l, data_bytes ? data_bytes : 1, 1);
    if (assign) {
        m->n_rs_layers = n_rs;
        m->layer_rs = layer_rs;
        m->rs_conv_off = conv_off;
        m->rs_state_off = state_off;
        m->rs_slot_floats = slot_floats;
        m->n_rs_slots = n_slots;
        m->rs_data = rs_data;
        m->rs_refs = rs_refs;
        m->seq_slot = seq_slot;
        m->rs_pos_min = rs_pos_min;
        m->rs_pos_max = rs_pos_max;
        m->rs_stamp = rs_stamp;
        m->ckpt_ring = rings;
        m->spec_data = spec_data;
        m->spec_pos = spec_pos;
        m->spec_lo = spec_lo;
        m->spec_stamp = spec_stamp;
        for (int32_t q = 0; spec_pos && q < cfg->n_seq_max; q++) spec_pos[q] = -1;
        m->n_ckpt = n_ck;
        m->ckpt_rec_bytes = rec;
        m->ckpts = ckpts;
        m->ckpt_data = ckpt_data;
        size_t off = 0;
        for (int32_t i = 0, k = 0; i < nl; i++) {
            layer_rs[i] = -1;
            if (cfg->layers[i].kind != KEEL_MEM_LAYER_RECURRENT) continue;
            const keel_mem_recurrent *r = &cfg->layers[i].rs;
            size_t conv = (size_t)(r->conv_kernel - 1) * (size_t)r->conv_channels;
            layer_rs[i] = k;
            conv_off[k] = off;
            off += (conv + 15) & ~(size_t)15;
            state_off[k] = off;
            off += ((size_t)r->state_floats + 15) & ~(size_t)15;
            k++;
        }
        mem_ckpt_record_bytes(cfg, m, rings); /* fills rings; its size was checked at open */
    }
}

/* Row bytes of one cell over every column (K, V, IDX) of the layers in a
 * group shaped like layer `rep`. */
static size_t group_cell_bytes(const keel_mem_config *cfg, int32_t rep)
{
    mem_group shape = group_shape(&cfg->layers[rep]);
    size_t b = 0;
    for (int32_t i = 0; i < cfg->n_layers; i++) {
        const keel_mem_layer *a = &cfg->layers[i];
        if (!mem_layer_has_kv(a) || !same_group(a, &shape)) continue;
        for (int32_t j = 0; j < mem_layer_n_cols(a); j++) {
            mem_col_spec cs = mem_layer_col_spec(a, j);
            b += (size_t)cs.n_heads * tensor_row_bytes(cs.dtype, cs.head_dim);
        }
    }
    return b;
}

static size_t align8_(size_t n)
{
    return (n + 7) & ~(size_t)7;
}

/*
 * A checkpoint record: the state of every recurrent layer (one slot's
 * floats), then per sliding group the ring cells a query at the
 * checkpoint's position needs: int32 n, int32 evict_max, pos [max],
 * stamp [max], cflags [max], rows [max][cell_bytes] (columns in table
 * order, heads in order), max = n_sink + window. SIZE_MAX on overflow.
 * With rings (and m laid out) fills each group's offsets.
 */
size_t mem_ckpt_record_bytes(const keel_mem_config *cfg, const keel_mem *m, mem_ckpt_ring *rings)
{
    (void)m;
    size_t slot = 0;
    for (int32_t i = 0; i < cfg->n_layers; i++)
        if (cfg->layers[i].kind == KEEL_MEM_LAYER_RECURRENT) {
            const keel_mem_recurrent *r = &cfg->layers[i].rs;
            size_t conv = (size_t)(r->conv_kernel - 1) * (size_t)r->conv_channels;
            slot += ((conv + 15) & ~(size_t)15) + (((size_t)r->state_floats + 15) & ~(size_t)15);
        }
    size_t off;
    if (!size_mul(slot, sizeof(float), &off)) return SIZE_MAX;
    for (int32_t i = 0, g = 0; i < cfg->n_layers; i++) {
        if (!opens_group(cfg, i)) continue;
        const keel_mem_layer *a = &cfg->layers[i];
        mem_ckpt_ring rr;
        memset(&rr, 0, sizeof rr);
        if (a->kind == KEEL_MEM_LAYER_SLIDING) {
            size_t max = (size_t)a->n_sink + (size_t)a->window, rows;
            rr.max = (int32_t)max;
            rr.cell_bytes = group_cell_bytes(cfg, i);
            rr.off = off;
            rr.pos_off = off + 8;
            rr.stamp_off = align8_(rr.pos_off + max * sizeof(int32_t));
            rr.cflags_off = rr.stamp_off + max * sizeof(uint64_t);
            rr.rows_off = align8_(rr.cflags_off + max);
            if (!size_mul(max, rr.cell_bytes, &rows) || !size_add(rr.rows_off, rows, &off))
                return SIZE_MAX;
            off = align8_(off);
        }
        if (rings) rings[g] = rr;
        g++;
    }
    return (off + BASE_ALIGN - 1) & ~(size_t)(BASE_ALIGN - 1);
}

void mem_config_rs_bytes(const keel_mem_config *cfg, size_t *rs, size_t *ckpt)
{
    *rs = *ckpt = 0;
    if (validate_config(cfg, NULL) != KEEL_OK) return;
    size_t slot = 0;
    for (int32_t i = 0; i < cfg->n_layers; i++)
        if (cfg->layers[i].kind == KEEL_MEM_LAYER_RECURRENT) {
            const keel_mem_recurrent *r = &cfg->layers[i].rs;
            size_t conv = (size_t)(r->conv_kernel - 1) * (size_t)r->conv_channels;
            slot += ((conv + 15) & ~(size_t)15) + (((size_t)r->state_floats + 15) & ~(size_t)15);
        }
    if (slot > 0) {
        int32_t slots = cfg->n_rs_slots > 0 ? cfg->n_rs_slots : cfg->n_seq_max;
        if (cfg->spec_snapshot) slots += cfg->n_seq_max; /* the speculation snapshots */
        *rs = slot * sizeof(float) * (size_t)slots;
    }
    if (cfg->n_ckpt <= 0) return;
    /* recurrent states, or an attention memory's ring rows only */
    size_t rec = mem_ckpt_record_bytes(cfg, NULL, NULL);
    if (rec != SIZE_MAX) *ckpt = rec * (size_t)mem_ckpt_count(cfg, rec) * (size_t)cfg->n_seq_max;
}

int32_t mem_ckpt_count(const keel_mem_config *cfg, size_t rec_bytes)
{
    int32_t n = cfg->n_ckpt;
    if (n > 0 && cfg->ckpt_bytes > 0 && rec_bytes > 0) {
        size_t fit = cfg->ckpt_bytes / rec_bytes;
        if (fit < (size_t)n) n = (int32_t)fit;
    }
    return n;
}

static size_t align_up_(size_t n)
{
    return (n + BASE_ALIGN - 1) & ~(size_t)(BASE_ALIGN - 1);
}

mem_edit_layout mem_edit_layout_of(size_t hd, size_t ncols, size_t nrot)
{
    mem_edit_layout e;
    e.cs_off = align_up_(hd * sizeof(float));
    e.cached_off = align_up_(e.cs_off + ncols * (nrot + 2) * sizeof(float));
    e.bytes = align_up_(e.cached_off + ncols * sizeof(int64_t));
    return e;
}

size_t mem_edit_thread_bytes(const keel_mem_config *cfg)
{
    size_t hd = 1, ncols = 0, nrot = 0;
    for (int32_t i = 0; i < cfg->n_layers; i++) {
        const keel_mem_layer *a = &cfg->layers[i];
        if (!mem_layer_has_kv(a)) continue;
        ncols += (size_t)mem_layer_n_cols(a);
        hd = BASE_MAX(hd, (size_t)mem_layer_dim_max(a));
        if (a->rope.type != KEEL_ROPE_NONE) nrot = BASE_MAX(nrot, (size_t)a->rope.n_rot);
        if (a->idx_head_dim > 0 && a->idx_rope.type != KEEL_ROPE_NONE)
            nrot = BASE_MAX(nrot, (size_t)a->idx_rope.n_rot);
    }
    return mem_edit_layout_of(hd, ncols, nrot).bytes;
}

/* Largest sliding table capacity of cfg (0 without sliding layers). */
int32_t mem_ring_cap_max(const keel_mem_config *cfg)
{
    int32_t n_streams = cfg->unified ? 1 : cfg->n_seq_max, r = 0;
    for (int32_t i = 0; i < cfg->n_layers; i++)
        if (cfg->layers[i].kind == KEEL_MEM_LAYER_SLIDING) {
            mem_group shape = group_shape(&cfg->layers[i]);
            r = BASE_MAX(r, table_cap(cfg, &shape, n_streams));
        }
    return r;
}

static size_t place_bytes(const keel_mem_config *cfg)
{
    /* expect, first [n_seq] i32; need [n_streams] i32; ring retention:
     * counts [n_seq] i32, keep_from [n_seq] u64, cells [ring cap] i32 */
    size_t ns = (size_t)cfg->n_seq_max;
    return align_up_(ns * sizeof(int32_t)) * 4 + align_up_(ns * sizeof(uint64_t)) +
           align_up_((size_t)mem_ring_cap_max(cfg) * sizeof(int32_t));
}

size_t mem_write_thread_bytes(const keel_mem_config *cfg)
{
    size_t hd = 1;
    for (int32_t i = 0; i < cfg->n_layers; i++) hd = BASE_MAX(hd, (size_t)mem_layer_dim_max(&cfg->layers[i]));
    return align_up_(hd * sizeof(float));
}

static int32_t resolve_threads(const keel_mem_config *cfg)
{
    int32_t n = cfg->n_threads > 0 ? cfg->n_threads : keel_cpu_count();
    return n > 256 ? 256 : n;
}

static size_t scratch_bytes(const keel_mem_config *cfg, int32_t n_threads, int32_t max_cap)
{
    size_t per_thread = BASE_MAX(mem_edit_thread_bytes(cfg), mem_write_thread_bytes(cfg));
    size_t s = place_bytes(cfg) + per_thread * (size_t)n_threads + BASE_ALIGN;
    size_t a = mem_attn_scratch_bytes(cfg, cfg->layers, n_threads, max_cap);
    size_t c = mem_compact_scratch_bytes(cfg, n_threads);
    size_t k = mem_check_scratch_bytes(cfg, max_cap);
    /* every cell of every table, for session save/load */
    int32_t n_streams = cfg->unified ? 1 : cfg->n_seq_max;
    size_t cells = 0;
    for (int32_t i = 0; i < cfg->n_layers; i++)
        if (opens_group(cfg, i)) {
            mem_group shape = group_shape(&cfg->layers[i]);
            cells += (size_t)table_cap(cfg, &shape, n_streams) * (size_t)n_streams;
        }
    /* and of the recurrent half: each sequence's last stamp, its
     * checkpoints' stamps and their ring cells' */
    size_t n_ck = 0;
    bool rs = false;
    for (int32_t i = 0; i < cfg->n_layers; i++) rs |= cfg->layers[i].kind == KEEL_MEM_LAYER_RECURRENT;
    if (rs) {
        size_t ring = 0, rec = mem_ckpt_record_bytes(cfg, NULL, NULL);
        for (int32_t i = 0; i < cfg->n_layers; i++)
            if (opens_group(cfg, i) && cfg->layers[i].kind == KEEL_MEM_LAYER_SLIDING)
                ring += (size_t)cfg->layers[i].window + (size_t)cfg->layers[i].n_sink;
        n_ck = rec == SIZE_MAX ? 0 : (size_t)cfg->n_seq_max * (size_t)mem_ckpt_count(cfg, rec);
        cells += (size_t)cfg->n_seq_max + n_ck * (1 + ring);
    }
    mem_attn_dims ad = mem_attn_dims_of(cfg, cfg->layers);
    size_t ss = mem_session_scratch_bytes(cells, n_ck, cfg->n_layers, BASE_MAX(ad.dk_max + ad.dv_max, ad.ik_max));
    size_t r = mem_rs_scratch_bytes(cfg, max_cap);
    size_t cp = align_up_((size_t)max_cap * sizeof(int32_t)); /* seq_cp: dst's cells sorted */
    return BASE_MAX(BASE_MAX(BASE_MAX(s, a), BASE_MAX(c, k)), BASE_MAX(BASE_MAX(ss, r), cp));
}

static keel_status mem_plan(const keel_mem_config *cfg, bool own_pool, size_t *block,
                            size_t *scratch, size_t *total, char *err)
{
    keel_status st = validate_config(cfg, err);
    if (st != KEEL_OK) return st;
    mem_layout l = {NULL, 0, false, false};
    mem_lay_out(NULL, cfg, &l);
    if (l.overflow) return base_err(err, KEEL_EOVERFLOW, "memory plan overflows size_t");
    if (cfg->n_ckpt > 0) {
        size_t rec = mem_ckpt_record_bytes(cfg, NULL, NULL);
        if (mem_ckpt_count(cfg, rec) < 1)
            return base_err(err, KEEL_EINVAL,
                            "ckpt_bytes %zu is below one checkpoint record (%zu bytes)",
                            cfg->ckpt_bytes, rec);
    }
    int32_t max_cap = cfg->n_ctx;
    int32_t nt = resolve_threads(cfg);
    size_t sb;
    if (!size_align_up(scratch_bytes(cfg, nt, max_cap), BASE_ALIGN, &sb))
        return base_err(err, KEEL_EOVERFLOW, "scratch plan overflows size_t");
    size_t blk;
    if (!size_align_up(l.off, BASE_ALIGN, &blk))
        return base_err(err, KEEL_EOVERFLOW, "memory plan overflows size_t");
    size_t t = sizeof(keel_mem);
    if (!size_add(t, blk, &t) || !size_add(t, sb, &t) ||
        !size_add(t, own_pool ? base_pool_bytes(nt) : 0, &t))
        return base_err(err, KEEL_EOVERFLOW, "memory plan overflows size_t");
    *block = blk;
    *scratch = sb;
    *total = t;
    return KEEL_OK;
}

keel_status keel_mem_config_bytes(const keel_mem_config *cfg, size_t *bytes)
{
    size_t block, scratch;
    if (!bytes) return KEEL_EINVAL;
    return mem_plan(cfg, true, &block, &scratch, bytes, NULL);
}

keel_status mem_config_bytes_shared(const keel_mem_config *cfg, size_t *bytes, char *err)
{
    size_t block, scratch;
    return mem_plan(cfg, false, &block, &scratch, bytes, err);
}

static keel_status mem_open_impl(const keel_mem_config *cfg, base_pool *shared, keel_mem **out,
                                 char *err)
{
    if (!out) return KEEL_EINVAL;
    *out = NULL;
    size_t block_bytes, scratch, total;
    keel_status st = mem_plan(cfg, shared == NULL, &block_bytes, &scratch, &total, err);
    if (st != KEEL_OK) return st;
    keel_mem *m = base_calloc(1, sizeof *m);
    if (!m) return base_err(err, KEEL_ENOMEM, "keel_mem: out of memory");
    uint8_t *block = base_alloc(block_bytes);
    if (!block) {
        base_free(m, sizeof *m);
        return base_err(err, KEEL_ENOMEM, "keel_mem: cannot allocate %zu bytes", block_bytes);
    }
    memset(block, 0, block_bytes);
    mem_layout l = {block, 0, false, false};
    mem_lay_out(m, cfg, &l);
    if (l.bad) {
        base_free(block, block_bytes);
        base_free(m, sizeof *m);
        return base_err(err, KEEL_EINVAL, "keel_mem: rope angle rates could not be computed");
    }
    m->n_threads = resolve_threads(cfg);
    m->split_min_cells = MEM_SPLIT_MIN_CELLS;
    st = base_arena_init(&m->scratch, scratch);
    if (st != KEEL_OK) {
        base_free(block, block_bytes);
        base_free(m, sizeof *m);
        return base_err(err, st, "keel_mem: cannot reserve %zu bytes of scratch", scratch);
    }
    if (shared) {
        m->pool = shared;
        m->pool_shared = true;
        m->n_threads = base_pool_threads(shared);
    } else {
        st = base_pool_open(m->n_threads, &m->pool);
    }
    if (st != KEEL_OK) {
        int32_t nt = m->n_threads;
        base_arena_free(&m->scratch);
        base_free(block, block_bytes);
        base_free(m, sizeof *m);
        return base_err(err, st, "keel_mem: cannot start %d threads", nt);
    }
    m->bytes_total = total;
    m->block_bytes = block_bytes;
    m->attn_dims = mem_attn_dims_of(&m->cfg, m->layers);
    m->next_stamp = 1;
    m->max_cell_touched = -1;
    keel_mem_clear(m);
    *out = m;
    return KEEL_OK;
}

keel_status keel_mem_open(const keel_mem_config *cfg, keel_mem **out, char *err)
{
    return mem_open_impl(cfg, NULL, out, err);
}

keel_status mem_open_shared(const keel_mem_config *cfg, base_pool *pool, keel_mem **out, char *err)
{
    if (!pool) return base_err(err, KEEL_EINVAL, "mem_open_shared: no pool");
    keel_mem_config c = *cfg;
    c.n_threads = base_pool_threads(pool);
    return mem_open_impl(&c, pool, out, err);
}

void keel_mem_close(keel_mem *m)
{
    if (!m) return;
    if (!m->pool_shared) base_pool_close(m->pool);
    base_arena_free(&m->scratch);
    base_free(m->layers, m->block_bytes); /* the layers array opens the block */
    base_free(m, sizeof *m);
}

const char *keel_mem_last_error(const keel_mem *m)
{
    return m ? m->err : "memory is NULL";
}
