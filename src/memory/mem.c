/*
 * mem.c — the keel_mem object's operations: batch placement, K/V writes,
 * sequence edits, queries. Configuration, the memory plan, open and close
 * are in mem_open.c.
 *
 * Every public operation validates all of its inputs and capacity first and
 * only then commits (design.md rule 6); the commit phase cannot fail. Each
 * takes its scratch from the arena sized at open, so none allocates.
 */
#include "memory.h"

#include <limits.h>
#include <string.h>

int32_t keel_mem_n_groups(const keel_mem *m)
{
    return m ? m->n_groups : 0;
}

int32_t keel_mem_layer_group(const keel_mem *m, int32_t layer)
{
    if (!m || layer < 0 || layer >= m->cfg.n_layers) return -1;
    return m->layer_group[layer];
}

/* The table of group g that holds sequence s. */
static inline mem_table *table_of(const keel_mem *m, int32_t g, int32_t s)
{
    return &m->groups[g].tables[m->n_streams == 1 ? 0 : s];
}

/* ---- queries ------------------------------------------------------------- */

int32_t mem_tables_pos_min(const keel_mem *m, int32_t s)
{
    int32_t r = -1;
    for (int32_t g = 0; g < m->n_groups; g++) {
        const mem_table *t = table_of(m, g, s);
        if (t->seq_cells[s] > 0 && (r < 0 || t->seq_min[s] < r)) r = t->seq_min[s];
    }
    return r;
}

int32_t mem_tables_pos_max(const keel_mem *m, int32_t s)
{
    int32_t r = -1;
    for (int32_t g = 0; g < m->n_groups; g++) {
        const mem_table *t = table_of(m, g, s);
        if (t->seq_cells[s] > 0 && t->seq_max[s] > r) r = t->seq_max[s];
    }
    return r;
}

/* The attention tables hold a sequence's positions; a memory of recurrent
 * layers only records the span itself. */
int32_t keel_mem_seq_pos_min(const keel_mem *m, int32_t s)
{
    if (!m || s < 0 || s >= m->cfg.n_seq_max) return -1;
    return m->n_groups == 0 && m->n_rs_layers > 0 ? m->rs_pos_min[s] : mem_tables_pos_min(m, s);
}

int32_t keel_mem_seq_pos_max(const keel_mem *m, int32_t s)
{
    if (!m || s < 0 || s >= m->cfg.n_seq_max) return -1;
    return m->n_groups == 0 && m->n_rs_layers > 0 ? m->rs_pos_max[s] : mem_tables_pos_max(m, s);
}

int32_t keel_mem_seq_rewind_min(const keel_mem *m, int32_t s)
{
    if (!m || s < 0 || s >= m->cfg.n_seq_max) return 0;
    if (m->n_rs_layers > 0) {
        /* a recurrent sequence rewinds only to a checkpoint (which brings
         * the ring rows it needs), or not at all */
        if (m->seq_slot[s] < 0) return 0;
        int32_t r = keel_mem_seq_pos_max(m, s) + 1;
        for (int32_t i = 0; i < m->n_ckpt; i++) {
            const mem_ckpt *c = &m->ckpts[(size_t)s * (size_t)m->n_ckpt + (size_t)i];
            if (c->pos >= 0 && c->pos < r) r = c->pos;
        }
        return BASE_MAX(r, m->exact_from[s]);
    }
    int64_t r = m->exact_from[s];
    for (int32_t g = 0; g < m->n_groups; g++) {
        const mem_table *t = table_of(m, g, s);
        if (!t->sliding || t->evict_max[s] == MEM_NO_EVICT) continue;
        int64_t need = (int64_t)t->evict_max[s] + t->window;
        if (need > r) r = need;
    }
    return r > INT32_MAX ? INT32_MAX : (int32_t)r;
}

bool keel_mem_can_shift(const keel_mem *m)
{
    return m != NULL;
}

void keel_mem_stats_get(const keel_mem *m, keel_mem_stats *o)
{
    if (!o) return;
    memset(o, 0, sizeof *o);
    if (!m) return;
    for (int32_t g = 0; g < m->n_groups; g++) {
        for (int32_t k = 0; k < m->groups[g].n_tables; k++) {
            const mem_table *t = &m->groups[g].tables[k];
            o->cells_used += t->n_used;
            o->cells_cap += t->cap;
            size_t per_cell = 0;
            for (int32_t c = 0; c < t->n_cols; c++)
                per_cell += t->cols[c].head_row_bytes * (size_t)t->cols[c].n_heads;
            o->bytes_used += per_cell * (size_t)t->n_used;
        }
    }
    o->bytes_total = m->bytes_total;
    o->scratch_bytes = m->scratch.cap;
    o->scratch_high = m->scratch.high;
    o->tokens_placed = m->tokens_placed;
}

int32_t mem_room(const keel_mem *m, int32_t s)
{
    int32_t room = INT32_MAX;
    for (int32_t g = 0; g < m->n_groups; g++) {
        const mem_table *t = table_of(m, g, s);
        if (!t->sliding) room = BASE_MIN(room, t->cap - t->n_used);
    }
    return room;
}

int64_t keel_mem_group_cells_used(const keel_mem *m, int32_t g)
{
    if (!m || g < 0 || g >= m->n_groups) return 0;
    int64_t n = 0;
    for (int32_t k = 0; k < m->groups[g].n_tables; k++) n += m->groups[g].tables[k].n_used;
    return n;
}

uint64_t keel_mem_digest(const keel_mem *m)
{
    if (!m) return 0;
    uint64_t h = 0x6b65656cull;
    for (int32_t g = 0; g < m->n_groups; g++) {
        for (int32_t k = 0; k < m->groups[g].n_tables; k++) {
            const mem_table *t = &m->groups[g].tables[k];
            size_t cap = (size_t)t->cap;
            h = base_hash64(t->pos, cap * sizeof(int32_t), h);
            h = base_hash64(t->stamp, cap * sizeof(uint64_t), h);
            h = base_hash64(t->seq, cap * (size_t)t->seq_words * sizeof(uint64_t), h);
            h = base_hash64(t->flags, cap, h);
            h = base_hash64(t->cflags, cap, h);
            size_t ns = (size_t)t->n_seq * sizeof(int32_t);
            h = base_hash64(t->seq_min, ns, h);
            h = base_hash64(t->seq_max, ns, h);
            h = base_hash64(t->seq_cells, ns, h);
            if (t->sliding) h = base_hash64(t->evict_max, ns, h);
            int32_t meta[3] = {t->n_used, t->head, t->cap};
            h = base_hash64(meta, sizeof meta, h);
            for (int32_t c = 0; c < t->n_cols; c++)
                h = base_hash64(t->cols[c].data, t->cols[c].data_bytes, h);
        }
    }
    if (m->n_rs_layers > 0 || m->n_ckpt > 0) h = mem_rs_digest(m, h);
    int64_t tp = m->tokens_placed;
    h = base_hash64(&tp, sizeof tp, h);
    h = base_hash64(m->exact_from, (size_t)m->cfg.n_seq_max * sizeof(int32_t), h);
    h = base_hash64(m->n_compact, (size_t)m->cfg.n_seq_max * sizeof(int64_t), h);
    return base_hash64(&m->next_stamp, sizeof m->next_stamp, h);
}

/* A copy of [p0, p1) from a sequence whose forgotten positions are <= v
 * (MEM_NO_EVICT: none): dst inherits those in range, which are <=
 * min(v, p1 - 1) (its copy lacks them too, whether or not any cell of the
 * range was copied into this table). */
static void evict_max_merge(mem_table *td, int32_t dst, int32_t v, int32_t p0, int32_t p1)
{
    if (!td->sliding || v == MEM_NO_EVICT || v < p0) return;
    if (v >= p1) v = p1 - 1;
    if (td->evict_max[dst] == MEM_NO_EVICT || v > td->evict_max[dst]) td->evict_max[dst] = v;
}

/* ---- placement ----------------------------------------------------------- */

static inline int32_t batch_n_seq(const keel_mem_batch *b, int32_t i)
{
    return b->n_seq_id ? b->n_seq_id[i] : 1;
}

static inline int32_t batch_seq(const keel_mem_batch *b, int32_t i, int32_t j)
{
    return b->n_seq_id ? b->seq_id[i][j] : b->seq_id1[i];
}

/* Is cell c (of sliding t) a sink of s? Uses thresholds computed earlier
 * (no recompute: callers update sinks before a loop that frees cells). */
static inline bool sink_of(const mem_table *t, int32_t c, int32_t s)
{
    if (t->n_sink == 0 || t->sink_pos[s] < 0) return false;
    int32_t sp = t->sink_pos[s];
    return t->pos[c] < sp || (t->pos[c] == sp && t->stamp[c] <= t->sink_stamp[s]);
}

/*
 * Ring retention at a placement (docs/memory.md, "Sliding rings"). For each
 * sequence s the ring holds:
 *   - its n_sink lowest (pos, stamp) cells (the sinks), always;
 *   - if s is in the batch (first[s] >= 0), no other cell at a position
 *     <= first[s] - window (no query at first[s] or later sees it);
 *   - of its other cells, at most `window`: the most recently placed
 *     (keep_from[s] is the smallest stamp kept, 0 = all). A tie at the cut
 *     (copies of one cell in a split stream) keeps none of the tied cells.
 * Without position edits and with batches processed in order, the window
 * cap forgets nothing a query at the sequence's next position needs; after
 * seq_div (several cells per position) or a multi-sequence run, it is what
 * keeps n_seq * (n_sink + window) + n_batch_max cells enough: placement
 * never fails for lack of room in a ring.
 */

/* Would the position rule forget s at cell c (not a sink, first[s] set)? */
static inline bool evicts_pos(const mem_table *t, int32_t c, int32_t s, const int32_t *first)
{
    return first[s] >= 0 && (int64_t)t->pos[c] <= (int64_t)first[s] - t->window;
}

/* "cell a was placed after cell b" (descending stamps) */
static bool newer(const void *ctx, int32_t a, int32_t b)
{
    const mem_table *t = ctx;
    return t->stamp[a] > t->stamp[b];
}

/* keep_from[s] for every sequence of t (scratch: counts [n_seq], cells
 * [cap]). Updates the sink thresholds first. */
static void ring_keep_from(mem_table *t, const int32_t *first, uint64_t *keep_from,
                           int32_t *counts, int32_t *cells)
{
    mem_table_update_sinks(t, t->n_seq);
    for (int32_t s = 0; s < t->n_seq; s++) {
        keep_from[s] = 0;
        counts[s] = 0;
    }
    for (int32_t c = 0; c < t->cap; c++) {
        if (t->pos[c] < 0) continue;
        const uint64_t *w = t->seq + (size_t)c * (size_t)t->seq_words;
        for (int32_t i = 0; i < t->seq_words; i++)
            for (uint64_t bits = w[i]; bits; bits &= bits - 1) {
                int32_t s = i * 64 + __builtin_ctzll(bits);
                if (!sink_of(t, c, s) && !evicts_pos(t, c, s, first)) counts[s]++;
            }
    }
    for (int32_t s = 0; s < t->n_seq; s++) {
        if (counts[s] <= t->window) continue;
        int32_t n = 0;
        for (int32_t c = 0; c < t->cap; c++)
            if (t->pos[c] >= 0 && mem_seq_has(t, c, s) && !sink_of(t, c, s) &&
                !evicts_pos(t, c, s, first))
                cells[n++] = c;
        mem_heap_sort(cells, n, newer, t);
        int32_t k = t->window; /* keep cells[0 .. k) unless the cut splits a tie */
        while (k > 0 && t->stamp[cells[k - 1]] == t->stamp[cells[k]]) k--;
        keep_from[s] = k > 0 ? t->stamp[cells[k - 1]] : t->stamp[cells[0]] + 1;
    }
}

/* Does the placement forget s at cell c of ring t? */
static inline bool evicts(const mem_table *t, int32_t c, int32_t s, const int32_t *first,
                          const uint64_t *keep_from)
{
    if (sink_of(t, c, s)) return false;
    return evicts_pos(t, c, s, first) || t->stamp[c] < keep_from[s];
}

/* Cells that eviction would free entirely. */
static int32_t count_evictable(mem_table *t, const int32_t *first, const uint64_t *keep_from)
{
    int32_t n = 0;
    for (int32_t c = 0; c < t->cap; c++) {
        if (t->pos[c] < 0) continue;
        bool all = true;
        const uint64_t *w = t->seq + (size_t)c * (size_t)t->seq_words;
        for (int32_t i = 0; i < t->seq_words && all; i++) {
            uint64_t bits = w[i];
            while (bits && all) {
                int32_t s = i * 64 + __builtin_ctzll(bits);
                bits &= bits - 1;
                if (!evicts(t, c, s, first, keep_from)) all = false;
            }
        }
        if (all) n++;
    }
    return n;
}

static void evict(mem_table *t, const int32_t *first, const uint64_t *keep_from)
{
    bool any = false;
    for (int32_t c = 0; c < t->cap; c++) {
        if (t->pos[c] < 0) continue;
        uint64_t *w = t->seq + (size_t)c * (size_t)t->seq_words;
        for (int32_t i = 0; i < t->seq_words; i++) {
            uint64_t bits = w[i];
            while (bits) {
                int32_t s = i * 64 + __builtin_ctzll(bits);
                bits &= bits - 1;
                if (evicts(t, c, s, first, keep_from)) {
                    mem_seq_unset(t, c, s);
                    if (t->evict_max[s] == MEM_NO_EVICT || t->pos[c] > t->evict_max[s])
                        t->evict_max[s] = t->pos[c];
                    any = true;
                }
            }
        }
        if (mem_seq_empty(t, c)) {
            t->n_used--;
            t->pos[c] = -1;
            t->stamp[c] = 0;
            t->cflags[c] = 0;
        }
    }
    if (any) mem_table_refresh(t);
}

keel_status keel_mem_place(keel_mem *m, const keel_mem_batch *b, int32_t *cells)
{
    if (!m) return KEEL_EINVAL;
    m->err[0] = 0;
    if (!b || !cells || !b->pos)
        return base_err(m->err, KEEL_EINVAL, "place: missing batch arrays (batch, pos or cells)");
    if (b->n_seq_id ? !b->seq_id : !b->seq_id1)
        return base_err(m->err, KEEL_EINVAL,
                        b->n_seq_id ? "place: n_seq_id is set but seq_id is NULL"
                                    : "place: no sequence ids (seq_id1, or n_seq_id and seq_id)");
    int32_t n = b->n_tokens;
    if (n < 1 || n > m->cfg.n_batch_max)
        return base_err(m->err, KEEL_EINVAL, "place: n_tokens %d (need 1..n_batch_max %d)", n,
                        m->cfg.n_batch_max);
    if (b->n_seq_id)
        for (int32_t i = 0; i < n; i++)
            if (!b->seq_id[i] && b->n_seq_id[i] != 0)
                return base_err(m->err, KEEL_EINVAL, "place: token %d: seq_id[%d] is NULL", i, i);
    int32_t ns = m->cfg.n_seq_max;
    base_arena_reset(&m->scratch);
    int32_t *expect = base_arena_take_n(&m->scratch, (size_t)ns, sizeof(int32_t));
    int32_t *first = base_arena_take_n(&m->scratch, (size_t)ns, sizeof(int32_t));
    int32_t *need = base_arena_take_n(&m->scratch, (size_t)m->n_streams, sizeof(int32_t));
    int32_t *counts = base_arena_take_n(&m->scratch, (size_t)ns, sizeof(int32_t));
    uint64_t *keep_from = base_arena_take_n(&m->scratch, (size_t)ns, sizeof(uint64_t));
    int32_t *ring = base_arena_take_n(&m->scratch, (size_t)mem_ring_cap_max(&m->cfg), sizeof(int32_t));
    if (!expect || !first || !need || !counts || !keep_from || !ring)
        return base_err(m->err, KEEL_ESCRATCH, "place: scratch exhausted");
    for (int32_t s = 0; s < ns; s++) {
        int32_t pm = keel_mem_seq_pos_max(m, s);
        expect[s] = pm >= 0 ? pm + 1 : -1;
        first[s] = -1;
    }
    for (int32_t k = 0; k < m->n_streams; k++) need[k] = 0;
    /* validate */
    for (int32_t i = 0; i < n; i++) {
        int32_t nsi = batch_n_seq(b, i);
        int32_t p = b->pos[i];
        if (p < 0 || p == INT32_MAX)
            return base_err(m->err, KEEL_EINVAL, "place: token %d has position %d", i, p);
        if (nsi < 1 || nsi > ns)
            return base_err(m->err, KEEL_EINVAL, "place: token %d has %d sequences", i, nsi);
        if (m->n_streams > 1 && nsi != 1)
            return base_err(m->err, KEEL_EINVAL,
                            "place: token %d belongs to %d sequences but streams are split", i,
                            nsi);
        for (int32_t j = 0; j < nsi; j++) {
            int32_t s = batch_seq(b, i, j);
            if (s < 0 || s >= ns)
                return base_err(m->err, KEEL_EINVAL,
                                "place: token %d: unknown sequence id %d (n_seq_max %d)", i, s,
                                ns);
            for (int32_t j2 = 0; j2 < j; j2++)
                if (batch_seq(b, i, j2) == s)
                    return base_err(m->err, KEEL_EINVAL,
                                    "place: token %d lists sequence %d twice", i, s);
            if (expect[s] >= 0 && p != expect[s])
                return base_err(m->err, KEEL_EINVAL,
                                "place: token %d: sequence %d continues at position %d, got %d "
                                "(position gap or reorder)",
                                i, s, expect[s], p);
            expect[s] = p + 1;
            if (first[s] < 0) first[s] = p;
        }
        need[m->n_streams == 1 ? 0 : batch_seq(b, i, 0)]++;
    }
    if (m->n_rs_layers > 0) {
        keel_status st = mem_rs_place_check(m, b);
        if (st != KEEL_OK) return st;
    }
    for (int32_t g = 0; g < m->n_groups; g++) {
        for (int32_t k = 0; k < m->n_streams; k++) {
            if (need[k] == 0) continue;
            mem_table *t = &m->groups[g].tables[k];
            int32_t avail = t->cap - t->n_used;
            if (avail < need[k] && t->sliding) {
                ring_keep_from(t, first, keep_from, counts, ring);
                avail += count_evictable(t, first, keep_from);
            }
            if (avail < need[k])
                return base_err(m->err, KEEL_EFULL,
                                "place: group %d%s has %d free cells of %d, batch needs %d", g,
                                t->sliding ? " (sliding)" : "", avail, t->cap, need[k]);
        }
    }
    /* commit */
    for (int32_t g = 0; g < m->n_groups; g++)
        for (int32_t k = 0; k < m->n_streams; k++)
            if (need[k] > 0 && m->groups[g].tables[k].sliding) {
                mem_table *t = &m->groups[g].tables[k];
                ring_keep_from(t, first, keep_from, counts, ring);
                evict(t, first, keep_from);
            }
    if (m->n_rs_layers > 0) mem_rs_place_commit(m, b, m->next_stamp);
    for (int32_t i = 0; i < n; i++) {
        uint64_t stamp = m->next_stamp++;
        int32_t s0 = batch_seq(b, i, 0);
        for (int32_t g = 0; g < m->n_groups; g++) {
            mem_table *t = table_of(m, g, s0);
            int32_t c = mem_table_find_free(t);
            /* capacity was validated: c >= 0 */
            for (int32_t j = 0; j < batch_n_seq(b, i); j++) {
                int32_t s = batch_seq(b, i, j);
                if (j == 0)
                    mem_table_occupy(t, c, b->pos[i], stamp, s);
                else {
                    mem_seq_set(t, c, s);
                    if (t->seq_cells[s] == 0 || b->pos[i] < t->seq_min[s]) t->seq_min[s] = b->pos[i];
                    if (t->seq_cells[s] == 0 || b->pos[i] > t->seq_max[s]) t->seq_max[s] = b->pos[i];
                    t->seq_cells[s]++;
                }
            }
            t->cflags[c] = b->protect && b->protect[i] ? MEM_CELL_PROTECTED : 0;
            cells[(size_t)g * (size_t)n + (size_t)i] = (int32_t)(t - m->groups[g].tables) * t->cap + c;
            if (c > m->max_cell_touched) m->max_cell_touched = c;
        }
    }
    m->tokens_placed += n;
    for (int32_t s = 0; s < ns; s++)
        if (first[s] >= 0) {
            int32_t held = keel_mem_seq_cells(m, s);
            if (held > m->cells_high[s]) m->cells_high[s] = held;
        }
    return KEEL_OK;
}

int32_t keel_mem_seq_cells_high(const keel_mem *m, int32_t s)
{
    if (!m || s < 0 || s >= m->cfg.n_seq_max) return 0;
    return m->cells_high[s];
}

/* ---- writes -------------------------------------------------------------- */

typedef struct write_ctx {
    keel_mem *m;
    const mem_group *g;
    int32_t col;       /* the layer's K column; V is col + 1, IDX col + 2 */
    int32_t n_cols;    /* the layer's columns: 2, or 3 with an indexer */
    const int32_t *ids; /* group cell ids */
    const float *kx, *vx, *ix;
    uint8_t *thread_scratch;
    size_t thread_bytes;
} write_ctx;

static void write_task(void *vctx, int64_t i, int thread)
{
    write_ctx *w = vctx;
    float *x = (float *)(w->thread_scratch + (size_t)thread * w->thread_bytes);
    const mem_table *t = NULL;
    int32_t cell = 0;
    if (!mem_cell_decode(w->g, w->ids[i], &t, &cell)) return; /* validated by the caller */
    const float *src[3] = {w->kx, w->vx, w->ix};
    for (int32_t kv = 0; kv < w->n_cols; kv++) {
        const mem_col *c = &t->cols[w->col + kv];
        size_t stride = (size_t)c->n_heads * (size_t)c->head_dim;
        for (int32_t h = 0; h < c->n_heads; h++) {
            memcpy(x, src[kv] + (size_t)i * stride + (size_t)h * (size_t)c->head_dim,
                   (size_t)c->head_dim * sizeof(float));
            mem_col_encode(c, x, mem_col_row(t, c, h, cell));
        }
    }
}

keel_status keel_mem_write(keel_mem *m, int32_t layer, int32_t n, const int32_t *cells,
                           const float *k, const float *v)
{
    return keel_mem_write_kvi(m, layer, n, cells, k, v, NULL);
}

keel_status keel_mem_write_kvi(keel_mem *m, int32_t layer, int32_t n, const int32_t *cells,
                               const float *k, const float *v, const float *ik)
{
    if (!m) return KEEL_EINVAL;
    m->err[0] = 0;
    if (layer < 0 || layer >= m->cfg.n_layers || m->layer_group[layer] < 0)
        return base_err(m->err, KEEL_EINVAL, "write: layer %d has no KV", layer);
    if (n < 1 || n > m->cfg.n_batch_max || !cells || !k || !v)
        return base_err(m->err, KEEL_EINVAL, "write: bad n (%d) or NULL arrays", n);
    /* indexer keys go in with K and V, never apart (rule 1: a cell's
     * columns are written together) */
    bool has_idx = m->layers[layer].idx_head_dim > 0;
    if (has_idx != (ik != NULL))
        return base_err(m->err, KEEL_EINVAL,
                        has_idx ? "write: layer %d has an indexer column: its keys are written with "
                                  "K and V (keel_mem_write_kvi)"
                                : "write: layer %d has no indexer column, indexer keys given",
                        layer);
    const mem_group *g = &m->groups[m->layer_group[layer]];
    /* every cell occupied and listed once (two tokens writing one cell would
     * race between threads): marks in the tables' flags, cleared again */
    int32_t bad = -1;
    bool dup = false;
    for (int32_t i = 0; i < n && bad < 0; i++) {
        const mem_table *t = NULL;
        int32_t cell = 0;
        if (!mem_cell_decode(g, cells[i], &t, &cell) || t->pos[cell] < 0) {
            bad = i;
        } else if (t->flags[cell]) {
            bad = i;
            dup = true;
        } else {
            t->flags[cell] = 1;
        }
    }
    for (int32_t i = 0; i < (bad < 0 ? n : bad); i++) {
        const mem_table *t = NULL;
        int32_t cell = 0;
        if (mem_cell_decode(g, cells[i], &t, &cell)) t->flags[cell] = 0;
    }
    if (bad >= 0)
        return base_err(m->err, KEEL_EINVAL,
                        dup ? "write: token %d: cell %d is listed twice"
                            : "write: token %d: cell %d is not occupied",
                        bad, cells[bad]);
    base_arena_reset(&m->scratch);
    size_t tb = mem_write_thread_bytes(&m->cfg);
    uint8_t *ts = base_arena_take(&m->scratch, tb * (size_t)m->n_threads, BASE_ALIGN);
    if (!ts) return base_err(m->err, KEEL_ESCRATCH, "write: scratch exhausted");
    write_ctx w = {m, g, m->layer_col[layer], mem_layer_n_cols(&m->layers[layer]), cells, k, v, ik, ts, tb};
    base_pool_run(n >= 8 ? m->pool : NULL, n, write_task, &w);
    return KEEL_OK;
}

/* ---- sequence edits ------------------------------------------------------ */

static inline void norm_range(int32_t *p0, int32_t *p1)
{
    if (*p0 < 0) *p0 = 0;
    if (*p1 < 0) *p1 = INT32_MAX;
}

/* Tables that may hold s (s < 0: all). Iterate with for (k = k0; k < k1). */
static inline void stream_range(const keel_mem *m, int32_t s, int32_t *k0, int32_t *k1)
{
    if (m->n_streams == 1 || s < 0) {
        *k0 = 0;
        *k1 = m->n_streams;
    } else {
        *k0 = s;
        *k1 = s + 1;
    }
}

keel_status keel_mem_seq_rm(keel_mem *m, int32_t s, int32_t p0, int32_t p1)
{
    if (!m) return KEEL_EINVAL;
    m->err[0] = 0;
    if (s >= m->cfg.n_seq_max)
        return base_err(m->err, KEEL_EINVAL, "seq_rm: unknown sequence id %d", s);
    if (p0 >= 0 && p1 >= 0 && p1 <= p0)
        return base_err(m->err, KEEL_ERANGE, "seq_rm: empty range [%d, %d)", p0, p1);
    norm_range(&p0, &p1);
    if (m->n_rs_layers > 0) return mem_rs_seq_rm(m, s, p0, p1);
    mem_attn_rm(m, s, p0, p1);
    /* an attention memory's checkpoints covering removed positions go, and
     * all of an emptied sequence's (it starts over) */
    for (int32_t q = 0; m->n_ckpt > 0 && q < m->cfg.n_seq_max; q++)
        if (s < 0 || q == s) mem_ck_drop(m, q, mem_seq_holds(m, q) ? p0 : -1);
    return KEEL_OK;
}

void mem_attn_rm(keel_mem *m, int32_t s, int32_t p0, int32_t p1)
{
    int32_t k0, k1;
    stream_range(m, s, &k0, &k1);
    for (int32_t g = 0; g < m->n_groups; g++) {
        for (int32_t k = k0; k < k1; k++) {
            mem_table *t = &m->groups[g].tables[k];
            bool any = false;
            for (int32_t c = 0; c < t->cap; c++) {
                int32_t p = t->pos[c];
                if (p < p0 || p >= p1) continue;
                if (s < 0) {
                    mem_table_free_cell(t, c);
                    any = true;
                } else if (mem_seq_has(t, c, s)) {
                    mem_seq_unset(t, c, s);
                    if (mem_seq_empty(t, c)) mem_table_free_cell(t, c);
                    any = true;
                }
            }
            if (any) mem_table_refresh(t);
        }
    }
    for (int32_t q = 0; q < m->cfg.n_seq_max; q++) {
        if (s >= 0 && q != s) continue;
        m->anchor_valid[q] = 0;
        if (mem_tables_pos_max(m, q) >= 0) {
            /* forgotten positions at or past p0 are gone with the range */
            for (int32_t g = 0; g < m->n_groups; g++) {
                mem_table *t = table_of(m, g, q);
                if (t->sliding && t->evict_max[q] != MEM_NO_EVICT && t->evict_max[q] >= p0 &&
                    t->evict_max[q] < p1 && p1 == INT32_MAX)
                    t->evict_max[q] = p0 > 0 ? p0 - 1 : MEM_NO_EVICT;
            }
            continue;
        }
        /* an emptied sequence (in every group: a ring may be empty while a
         * full table still holds the sequence) starts over */
        m->exact_from[q] = 0;
        m->cells_high[q] = 0;
        for (int32_t g = 0; g < m->n_groups; g++) {
            mem_table *t = table_of(m, g, q);
            if (t->sliding) t->evict_max[q] = MEM_NO_EVICT;
        }
    }
}

/* (stamp, position) order of cells of one table */
static bool less_stamp_pos_cell(const void *ctx, int32_t a, int32_t b)
{
    const mem_table *t = ctx;
    return t->stamp[a] < t->stamp[b] || (t->stamp[a] == t->stamp[b] && t->pos[a] < t->pos[b]);
}

/* s's cells of t in (stamp, position) order into idx; returns how many. */
static int32_t seq_sorted(const mem_table *t, int32_t s, int32_t *idx)
{
    int32_t n = 0;
    for (int32_t c = 0; c < t->cap; c++)
        if (t->pos[c] >= 0 && mem_seq_has(t, c, s)) idx[n++] = c;
    mem_heap_sort(idx, n, less_stamp_pos_cell, t);
    return n;
}

/* Does one of idx[0 .. n) (sorted by seq_sorted) hold the token of stamp
 * st at position p? */
static bool sorted_has(const mem_table *t, const int32_t *idx, int32_t n, uint64_t st, int32_t p)
{
    int32_t lo = 0, hi = n - 1;
    while (lo <= hi) {
        int32_t mid = lo + (hi - lo) / 2, c = idx[mid];
        if (t->stamp[c] == st && t->pos[c] == p) return true;
        if (t->stamp[c] < st || (t->stamp[c] == st && t->pos[c] < p))
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return false;
}

keel_status keel_mem_seq_cp(keel_mem *m, int32_t src, int32_t dst, int32_t p0, int32_t p1)
{
    if (!m) return KEEL_EINVAL;
    m->err[0] = 0;
    int32_t ns = m->cfg.n_seq_max;
    if (src < 0 || src >= ns || dst < 0 || dst >= ns)
        return base_err(m->err, KEEL_EINVAL, "seq_cp: unknown sequence id (%d -> %d)", src, dst);
    if (p0 >= 0 && p1 >= 0 && p1 <= p0)
        return base_err(m->err, KEEL_ERANGE, "seq_cp: empty range [%d, %d)", p0, p1);
    if (src == dst) return KEEL_OK;
    norm_range(&p0, &p1);
    if (m->n_rs_layers > 0) {
        keel_status st = mem_rs_seq_cp_check(m, src, dst, p0, p1);
        if (st != KEEL_OK) return st;
        if (m->seq_slot[src] < 0) return KEEL_OK; /* nothing to copy */
    }
    /* a token dst already holds at that position is not copied again: a
     * sequence never holds two cells of one (stamp, position), so its sinks
     * and ring cap count tokens (scratch: dst's cells sorted, per table) */
    int32_t max_cap = 1;
    for (int32_t g = 0; g < m->n_groups; g++) max_cap = BASE_MAX(max_cap, m->groups[g].tables[0].cap);
    base_arena_reset(&m->scratch);
    int32_t *have = base_arena_take_n(&m->scratch, (size_t)max_cap, sizeof(int32_t));
    if (!have) return base_err(m->err, KEEL_ESCRATCH, "seq_cp: scratch exhausted");
    if (m->n_streams == 1) {
        m->anchor_valid[dst] = 0;
        if (m->exact_from[src] > m->exact_from[dst]) m->exact_from[dst] = m->exact_from[src];
        for (int32_t g = 0; g < m->n_groups; g++) {
            mem_table *t = &m->groups[g].tables[0];
            bool any = false;
            int32_t nh = seq_sorted(t, dst, have);
            for (int32_t c = 0; c < t->cap; c++)
                if (t->pos[c] >= p0 && t->pos[c] < p1 && mem_seq_has(t, c, src) &&
                    !mem_seq_has(t, c, dst) && !sorted_has(t, have, nh, t->stamp[c], t->pos[c])) {
                    mem_seq_set(t, c, dst);
                    any = true;
                }
            if (t->sliding) evict_max_merge(t, dst, t->evict_max[src], p0, p1);
            if (any) mem_table_refresh(t);
        }
        if (m->n_rs_layers > 0) mem_rs_seq_cp_commit(m, src, dst);
        else if (m->n_ckpt > 0) mem_ck_drop(m, dst, p0); /* dst now holds more below them */
        return KEEL_OK;
    }
    /* split streams: copy cells into dst's tables; validate room first */
    for (int32_t g = 0; g < m->n_groups; g++) {
        mem_table *ts = &m->groups[g].tables[src], *td = &m->groups[g].tables[dst];
        int32_t cnt = 0, nh = seq_sorted(td, dst, have);
        for (int32_t c = 0; c < ts->cap; c++)
            if (ts->pos[c] >= p0 && ts->pos[c] < p1 && !sorted_has(td, have, nh, ts->stamp[c], ts->pos[c])) cnt++;
        if (cnt > td->cap - td->n_used)
            return base_err(m->err, KEEL_EFULL,
                            "seq_cp: group %d: %d cells to copy, %d free in sequence %d's stream",
                            g, cnt, td->cap - td->n_used, dst);
    }
    m->anchor_valid[dst] = 0;
    if (m->exact_from[src] > m->exact_from[dst]) m->exact_from[dst] = m->exact_from[src];
    for (int32_t g = 0; g < m->n_groups; g++) {
        mem_table *ts = &m->groups[g].tables[src], *td = &m->groups[g].tables[dst];
        bool any = false;
        int32_t nh = seq_sorted(td, dst, have); /* before this group's copies */
        for (int32_t c = 0; c < ts->cap; c++) {
            if (ts->pos[c] < p0 || ts->pos[c] >= p1 || sorted_has(td, have, nh, ts->stamp[c], ts->pos[c])) continue;
            int32_t d = mem_table_find_free(td);
            if (d > m->max_cell_touched) m->max_cell_touched = d;
            mem_table_copy_cell_from(td, d, ts, c);
            mem_seq_set(td, d, dst);
            any = true;
        }
        if (td->sliding) evict_max_merge(td, dst, ts->evict_max[src], p0, p1);
        if (any) mem_table_refresh(td);
    }
    if (m->n_rs_layers > 0) mem_rs_seq_cp_commit(m, src, dst);
    else if (m->n_ckpt > 0) mem_ck_drop(m, dst, p0);
    return KEEL_OK;
}

keel_status keel_mem_seq_keep(keel_mem *m, int32_t s)
{
    if (!m) return KEEL_EINVAL;
    m->err[0] = 0;
    if (s < 0 || s >= m->cfg.n_seq_max)
        return base_err(m->err, KEEL_EINVAL, "seq_keep: unknown sequence id %d", s);
    for (int32_t q = 0; q < m->cfg.n_seq_max; q++)
        if (q != s) {
            m->anchor_valid[q] = 0;
            m->exact_from[q] = 0;
        }
    for (int32_t g = 0; g < m->n_groups; g++) {
        for (int32_t k = 0; k < m->n_streams; k++) {
            mem_table *t = &m->groups[g].tables[k];
            for (int32_t c = 0; c < t->cap; c++) {
                if (t->pos[c] < 0) continue;
                if (!mem_seq_has(t, c, s)) {
                    mem_table_free_cell(t, c);
                } else {
                    memset(t->seq + (size_t)c * (size_t)t->seq_words, 0,
                           (size_t)t->seq_words * sizeof(uint64_t));
                    mem_seq_set(t, c, s);
                }
            }
            if (t->sliding)
                for (int32_t q = 0; q < t->n_seq; q++)
                    if (q != s) t->evict_max[q] = MEM_NO_EVICT;
            mem_table_refresh(t);
        }
    }
    if (m->n_rs_layers > 0) mem_rs_seq_keep(m, s);
    for (int32_t q = 0; m->n_rs_layers == 0 && m->n_ckpt > 0 && q < m->cfg.n_seq_max; q++)
        if (q != s) mem_ck_drop(m, q, -1);
    return KEEL_OK;
}

/* Position edits: seq_add (delta), seq_div (div > 0), renumbering (map). */
typedef struct edit_ctx {
    keel_mem *m;
    mem_table *t;
    int32_t delta; /* seq_add */
    int32_t div;   /* seq_div */
    bool map;      /* renumbering: t->newpos */
    int64_t n_tasks;
    uint8_t *thread_scratch;
    size_t thread_bytes;
} edit_ctx;

static void edit_task(void *vctx, int64_t task, int thread)
{
    edit_ctx *e = vctx;
    mem_table *t = e->t;
    int32_t per = (int32_t)((t->cap + e->n_tasks - 1) / e->n_tasks);
    int32_t c0 = (int32_t)task * per, c1 = BASE_MIN(t->cap, c0 + per);
    uint8_t *base = e->thread_scratch + (size_t)thread * e->thread_bytes;
    int32_t hd_max = 1, nrot_max = 0;
    for (int32_t ci = 0; ci < t->n_cols; ci++) {
        hd_max = BASE_MAX(hd_max, t->cols[ci].head_dim);
        nrot_max = BASE_MAX(nrot_max, t->cols[ci].rope.n_rot);
    }
    mem_edit_layout lay = mem_edit_layout_of((size_t)hd_max, (size_t)t->n_cols, (size_t)nrot_max);
    float *x = (float *)base;
    float *cs = (float *)(base + lay.cs_off);
    int64_t *cached = (int64_t *)(base + lay.cached_off);
    for (int32_t ci = 0; ci < t->n_cols; ci++) cached[ci] = INT64_MIN;
    for (int32_t c = c0; c < c1; c++) {
        if (!t->flags[c]) continue;
        int32_t old = t->pos[c];
        int32_t nw = e->map ? t->newpos[c] : e->div > 0 ? old / e->div : old + e->delta;
        int64_t d = (int64_t)nw - old;
        if (d != 0) {
            for (int32_t ci = 0; ci < t->n_cols; ci++) {
                const mem_col *col = &t->cols[ci];
                if (col->kind == MEM_COL_V || col->rope.type == KEEL_ROPE_NONE) continue;
                float *ccs = cs + (size_t)ci * (size_t)(nrot_max + 2);
                if (cached[ci] != d) {
                    mem_col_shift_cs(col, d, ccs);
                    cached[ci] = d;
                }
                for (int32_t h = 0; h < col->n_heads; h++)
                    mem_col_shift_row(col, mem_col_row(t, col, h, c), ccs, x);
            }
        }
        t->pos[c] = nw;
        t->flags[c] = 0;
    }
}

void mem_edit_marked(keel_mem *m, mem_table *t, int32_t delta, int32_t div, bool map,
                     uint8_t *scratch)
{
    int32_t marked = 0;
    for (int32_t c = 0; c < t->cap; c++) marked += t->flags[c] != 0;
    edit_ctx e = {m, t, delta, div, map, 0, scratch, mem_edit_thread_bytes(&m->cfg)};
    e.n_tasks = BASE_MIN((int64_t)m->n_threads * 4, (int64_t)t->cap);
    base_pool_run(marked >= 64 ? m->pool : NULL, e.n_tasks, edit_task, &e);
}

/* The position a cell at p moves to under seq_add (delta) / seq_div (div > 0);
 * positions were validated to stay in [0, INT32_MAX). */
static inline int32_t edited_pos(int32_t p, int32_t delta, int32_t div)
{
    return div > 0 ? p / div : (int32_t)((int64_t)p + delta);
}

/*
 * The bound on forgotten positions after an edit of [p0, p1) (e >= p0 >= 0).
 * Forgotten positions are all <= e; those in range move, the others stay:
 * those below p0 are <= p0 - 1, those at or past p1 (if e >= p1) <= e, the
 * moved ones <= edited(min(e, p1 - 1)). The result is their maximum,
 * computed in 64 bits and saturated below INT32_MAX (no position above it
 * can rewind exactly).
 */
static int32_t evict_max_edited(int32_t e, int32_t p0, int32_t p1, int32_t delta, int32_t div)
{
    int64_t top = BASE_MIN((int64_t)e, (int64_t)p1 - 1);
    int64_t moved = div > 0 ? top / div : top + delta;
    int64_t stay = e >= p1 ? e : (int64_t)p0 - 1;
    int64_t r = BASE_MAX(moved, stay);
    return (int32_t)BASE_MIN(r, (int64_t)INT32_MAX - 1);
}

static keel_status seq_edit(keel_mem *m, const char *what, int32_t s, int32_t p0, int32_t p1,
                            int32_t delta, int32_t div)
{
    if (!m) return KEEL_EINVAL;
    m->err[0] = 0;
    if (s < 0 || s >= m->cfg.n_seq_max)
        return base_err(m->err, KEEL_EINVAL, "%s: unknown sequence id %d", what, s);
    if (p0 >= 0 && p1 >= 0 && p1 <= p0)
        return base_err(m->err, KEEL_ERANGE, "%s: empty range [%d, %d)", what, p0, p1);
    if (div == 0 && delta == 0) return KEEL_OK;
    if (div == 1) return KEEL_OK;
    norm_range(&p0, &p1);
    /* validate: resulting positions in every group first (a bad request is
     * KEEL_ERANGE whatever the room), then room for copy-on-write splits of
     * the shared cells that move (a cell whose position stays needs no copy),
     * then scratch */
    for (int32_t g = 0; g < m->n_groups && div == 0; g++) {
        mem_table *t = table_of(m, g, s);
        for (int32_t c = 0; c < t->cap; c++) {
            int32_t p = t->pos[c];
            if (p < p0 || p >= p1 || !mem_seq_has(t, c, s)) continue;
            int64_t np = (int64_t)p + delta;
            if (np < 0)
                return base_err(m->err, KEEL_ERANGE, "%s: position %d + %d would be negative",
                                what, p, delta);
            if (np >= INT32_MAX)
                return base_err(m->err, KEEL_ERANGE, "%s: position %d + %d overflows", what, p,
                                delta);
        }
    }
    for (int32_t g = 0; g < m->n_groups; g++) {
        mem_table *t = table_of(m, g, s);
        int32_t shared = 0;
        for (int32_t c = 0; c < t->cap; c++) {
            int32_t p = t->pos[c];
            if (p >= p0 && p < p1 && mem_seq_has(t, c, s) && edited_pos(p, delta, div) != p &&
                mem_seq_count(t, c) > 1)
                shared++;
        }
        if (shared > t->cap - t->n_used)
            return base_err(m->err, KEEL_EFULL,
                            "%s: group %d: %d cells shared with other sequences need copies, %d "
                            "free",
                            what, g, shared, t->cap - t->n_used);
    }
    int32_t ck_floor = p0;
    if (m->n_rs_layers > 0) {
        keel_status st = mem_rs_edit_check(m, what, s, p0, p1, delta, div, &ck_floor);
        if (st != KEEL_OK) return st;
    }
    base_arena_reset(&m->scratch);
    uint8_t *ts = base_arena_take(&m->scratch, mem_edit_thread_bytes(&m->cfg) * (size_t)m->n_threads,
                                  BASE_ALIGN);
    if (!ts) return base_err(m->err, KEEL_ESCRATCH, "%s: scratch exhausted", what);
    /* commit: split the shared cells that move, mark, then shift the marked
     * cells in parallel; forgotten positions in range move with them */
    for (int32_t g = 0; g < m->n_groups; g++) {
        mem_table *t = table_of(m, g, s);
        int32_t marked = 0;
        for (int32_t c = 0; c < t->cap; c++) {
            int32_t p = t->pos[c];
            if (p < p0 || p >= p1 || !mem_seq_has(t, c, s) || t->flags[c]) continue;
            if (edited_pos(p, delta, div) == p) continue;
            int32_t cell = mem_table_split(t, c, s);
            if (cell > m->max_cell_touched) m->max_cell_touched = cell;
            t->flags[cell] = 1;
            marked++;
        }
        if (marked) mem_edit_marked(m, t, delta, div, false, ts);
        if (t->sliding && t->evict_max[s] != MEM_NO_EVICT && t->evict_max[s] >= p0)
            t->evict_max[s] = evict_max_edited(t->evict_max[s], p0, p1, delta, div);
        if (marked) mem_table_refresh(t);
    }
    if (m->n_rs_layers > 0) {
        mem_rs_edit_commit(m, s, p0, p1, delta, div, ck_floor);
    } else if (m->n_ckpt > 0) {
        /* checkpoints below every moved token's new position still hold */
        int64_t low = div > 0 ? (int64_t)p0 / div : BASE_MIN((int64_t)p0, (int64_t)p0 + delta);
        mem_ck_drop(m, s, (int32_t)BASE_MAX(low, 0));
    }
    return KEEL_OK;
}

keel_status keel_mem_seq_add(keel_mem *m, int32_t s, int32_t p0, int32_t p1, int32_t delta)
{
    return seq_edit(m, "seq_add", s, p0, p1, delta, 0);
}

keel_status keel_mem_seq_div(keel_mem *m, int32_t s, int32_t p0, int32_t p1, int32_t d)
{
    if (m && d < 1) return base_err(m->err, KEEL_EINVAL, "seq_div: divisor %d (need > 0)", d);
    return seq_edit(m, "seq_div", s, p0, p1, 0, d);
}

void keel_mem_clear(keel_mem *m)
{
    if (!m) return;
    for (int32_t s = 0; s < m->cfg.n_seq_max; s++) {
        m->exact_from[s] = 0;
        m->anchor_valid[s] = 0;
        m->cells_high[s] = 0;
    }
    for (int32_t g = 0; g < m->n_groups; g++) {
        for (int32_t k = 0; k < m->groups[g].n_tables; k++) {
            mem_table *t = &m->groups[g].tables[k];
            for (int32_t c = 0; c < t->cap; c++) t->pos[c] = -1;
            memset(t->stamp, 0, (size_t)t->cap * sizeof(uint64_t));
            memset(t->seq, 0, (size_t)t->cap * (size_t)t->seq_words * sizeof(uint64_t));
            memset(t->flags, 0, (size_t)t->cap);
            memset(t->cflags, 0, (size_t)t->cap);
            t->n_used = 0;
            t->head = 0;
            if (t->sliding)
                for (int32_t s = 0; s < t->n_seq; s++) t->evict_max[s] = MEM_NO_EVICT;
            mem_table_refresh(t);
        }
    }
    mem_rs_clear(m);
}
