/*
 * session.c — saving the memory (one sequence, or all of it)
 * as a self-describing, checksummed blob (docs/formats.md, "Sessions");
 * session_load.c reads it back, session_fmt.h holds what both use.
 *
 *   header   magic "KEELSESS", version, the caller's model fingerprint, the
 *            saved sequence (-1: the whole memory), section count
 *   DESC     the column descriptors of every layer (kind, window, sinks,
 *            heads, head dims, dtypes, rotation block and seed, RoPE; the
 *            indexer column's when the layer has one), so a blob is refused
 *            by a memory that would read its bytes otherwise
 *   TOKENS   the caller's token history of the sequence
 *   SEQ      per sequence: exactness bound, compactions, cells high-water,
 *            per sliding group the forgotten-position bound
 *   GROUP    per group: its cells (position, placement rank, flags, sequence
 *            set) and then every column's rows of those cells
 *   RSTATE   (memories with recurrent layers) per sequence: whether it holds
 *            a state, of its own or shared with an earlier sequence (forks),
 *            its span, the rank of its last token's stamp, the state floats
 *   CKPT     (likewise) per sequence its checkpoints, oldest first: position,
 *            span start, stamp rank, take-order rank, the state floats and
 *            per sliding group the ring cells (position, rank, flags, rows)
 * Every section carries its length and the xxhash64 of its payload.
 *
 * Rule 1: the columns saved are exactly the tables' column registry, in
 * order; there is no second list to forget one. Rule 6: loading parses and
 * checks the whole blob (bounds, hashes, descriptors, room) before the
 * memory changes; failure leaves it as it was. Rule 10: every length read
 * from the blob is checked against what remains before it is used.
 */
#include "session_fmt.h"

#include <math.h>
#include <string.h>

/* ---- byte writer ---------------------------------------------------------- */

typedef struct wr {
    uint8_t *p;   /* NULL: counting only */
    size_t n, cap;
    bool over;
} wr;

static void put(wr *w, const void *x, size_t n)
{
    if (w->p && !w->over) {
        if (n > w->cap - w->n) {
            w->over = true;
        } else {
            memcpy(w->p + w->n, x, n);
        }
    }
    w->n += n;
}

static void put_u32(wr *w, uint32_t v)
{
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    put(w, b, 4);
}

static void put_i32(wr *w, int32_t v)
{
    put_u32(w, (uint32_t)v);
}

static void put_u64(wr *w, uint64_t v)
{
    put_u32(w, (uint32_t)v);
    put_u32(w, (uint32_t)(v >> 32));
}

static void put_f32(wr *w, float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    put_u32(w, u);
}

/* A section: type, reserved, length, hash, then the payload written by fn. */
typedef void (*sec_fn)(wr *w, const void *ctx);

static void put_section(wr *w, uint32_t type, sec_fn fn, const void *ctx)
{
    wr count = {NULL, 0, 0, false};
    fn(&count, ctx);
    put_u32(w, type);
    put_u32(w, 0);
    put_u64(w, count.n);
    size_t hash_at = w->n;
    put_u64(w, 0); /* patched below */
    size_t start = w->n;
    fn(w, ctx);
    if (w->p && !w->over) {
        uint64_t h = base_hash64(w->p + start, w->n - start, 0x5e55);
        uint8_t b[8];
        for (int i = 0; i < 8; i++) b[i] = (uint8_t)(h >> (8 * i));
        memcpy(w->p + hash_at, b, 8);
    }
}

/* ---- what is saved ----------------------------------------------------------- */

typedef struct save_ctx {
    const keel_mem *m;
    int32_t seq;             /* -1: every sequence */
    const int32_t *tokens;
    int32_t n_tokens, n_pending;
    const uint64_t *ranks;   /* sorted distinct stamps of the saved cells, states, checkpoints */
    int32_t n_ranks;
    const uint64_t *orders;  /* sorted take orders of the saved checkpoints */
    int32_t n_orders;
    int32_t group;           /* GROUP section being written */
} save_ctx;

static bool saved_cell(const save_ctx *c, const mem_table *t, int32_t cell)
{
    return t->pos[cell] >= 0 && (c->seq < 0 || mem_seq_has(t, cell, c->seq));
}

static void put_rope(wr *w, const keel_rope *r)
{
    put_i32(w, (int32_t)r->type);
    put_i32(w, r->n_rot);
    put_f32(w, r->freq_base);
    put_f32(w, r->freq_scale);
    put_f32(w, r->ext_factor);
    put_f32(w, r->attn_factor);
    put_f32(w, r->beta_fast);
    put_f32(w, r->beta_slow);
    put_i32(w, r->n_ctx_orig);
    int32_t half = r->freq_factors ? r->n_rot / 2 : 0;
    put_i32(w, half);
    for (int32_t i = 0; i < half; i++) put_f32(w, r->freq_factors[i]);
}

static void put_rot(wr *w, const keel_mem_rot *r, int32_t resolved_block)
{
    put_u32(w, r->enabled);
    put_i32(w, r->enabled ? resolved_block : 0);
    put_u64(w, r->enabled ? r->seed : 0);
}

/* DESC: the layers as the memory stores them (rotation blocks resolved) */
static void sec_desc(wr *w, const void *vctx)
{
    const save_ctx *c = vctx;
    const keel_mem *m = c->m;
    put_i32(w, m->cfg.n_layers);
    put_i32(w, m->cfg.n_seq_max);
    put_u32(w, m->cfg.unified);
    for (int32_t i = 0; i < m->cfg.n_layers; i++) {
        const keel_mem_layer *l = &m->layers[i];
        put_i32(w, (int32_t)l->kind);
        if (l->kind == KEEL_MEM_LAYER_NONE) continue;
        if (l->kind == KEEL_MEM_LAYER_RECURRENT) {
            put_i32(w, l->rs.conv_kernel);
            put_i32(w, l->rs.conv_channels);
            put_u64(w, (uint64_t)l->rs.state_floats);
            continue;
        }
        const mem_table *t = &m->groups[m->layer_group[i]].tables[0];
        const mem_col *kc = &t->cols[m->layer_col[i]], *vc = kc + 1;
        put_i32(w, l->kind == KEEL_MEM_LAYER_SLIDING ? l->window : 0);
        put_i32(w, l->kind == KEEL_MEM_LAYER_SLIDING ? l->n_sink : 0);
        put_i32(w, kc->n_heads);
        put_i32(w, kc->head_dim);
        put_i32(w, vc->head_dim);
        put_i32(w, (int32_t)kc->dtype);
        put_i32(w, (int32_t)vc->dtype);
        put_rot(w, &kc->rot, kc->rot.block);
        put_rot(w, &vc->rot, vc->rot.block);
        put_rope(w, &kc->rope);
        /* the indexer column (sparse attention), when the layer has one */
        bool idx = mem_layer_n_cols(l) == 3;
        put_u32(w, idx);
        if (!idx) continue;
        const mem_col *ic = kc + MEM_COL_IDX;
        put_i32(w, ic->head_dim);
        put_i32(w, (int32_t)ic->dtype);
        put_rot(w, &ic->rot, ic->rot.block);
        put_rope(w, &ic->rope);
    }
}

static void sec_tokens(wr *w, const void *vctx)
{
    const save_ctx *c = vctx;
    put_i32(w, c->n_tokens);
    put_i32(w, c->n_pending);
    for (int32_t i = 0; i < c->n_tokens; i++) put_i32(w, c->tokens[i]);
}

static void sec_seq(wr *w, const void *vctx)
{
    const save_ctx *c = vctx;
    const keel_mem *m = c->m;
    int32_t s0 = c->seq < 0 ? 0 : c->seq, s1 = c->seq < 0 ? m->cfg.n_seq_max : c->seq + 1;
    put_i32(w, s1 - s0);
    for (int32_t s = s0; s < s1; s++) {
        put_i32(w, m->exact_from[s]);
        put_u64(w, (uint64_t)m->n_compact[s]);
        put_i32(w, m->cells_high[s]);
        for (int32_t g = 0; g < m->n_groups; g++) {
            const mem_table *t = &m->groups[g].tables[m->n_streams == 1 ? 0 : s];
            put_i32(w, t->sliding ? t->evict_max[s] : MEM_NO_EVICT);
        }
    }
}

/* Index of v in the sorted distinct v[0 .. n). */
static int32_t index_in(const uint64_t *sorted, int32_t n, uint64_t v)
{
    int32_t lo = 0, hi = n - 1;
    while (lo <= hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (sorted[mid] == v) return mid;
        if (sorted[mid] < v)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1; /* not reached: every saved value is ranked */
}

static int32_t rank_of(const save_ctx *c, uint64_t stamp)
{
    return index_in(c->ranks, c->n_ranks, stamp);
}

static void seq_range(const keel_mem *m, int32_t seq, int32_t *s0, int32_t *s1)
{
    *s0 = seq < 0 ? 0 : seq;
    *s1 = seq < 0 ? m->cfg.n_seq_max : seq + 1;
}

/* The checkpoint record of s with the smallest take order above `after`
 * (-1 when none): walking from 0 lists them oldest first. */
static int32_t ck_next(const keel_mem *m, int32_t s, uint64_t after)
{
    int32_t best = -1;
    for (int32_t i = 0; i < m->n_ckpt; i++) {
        const mem_ckpt *c = mem_ck(m, s, i);
        if (c->pos >= 0 && c->order > after && (best < 0 || c->order < mem_ck(m, s, best)->order)) best = i;
    }
    return best;
}

/* RSTATE: per sequence its state (own or shared with an earlier one). */
static void sec_rstate(wr *w, const void *vctx)
{
    const save_ctx *c = vctx;
    const keel_mem *m = c->m;
    int32_t s0, s1;
    seq_range(m, c->seq, &s0, &s1);
    put_i32(w, s1 - s0);
    put_u64(w, (uint64_t)m->rs_slot_floats);
    for (int32_t s = s0; s < s1; s++) {
        if (!mem_seq_holds(m, s)) {
            put_u32(w, 0);
            continue;
        }
        /* an attention memory: kind 1 with no floats (its span and last stamp) */
        int32_t k = m->n_rs_layers > 0 ? m->seq_slot[s] : -1, share = -1;
        for (int32_t q = s0; k >= 0 && q < s && share < 0; q++)
            if (m->seq_slot[q] == k) share = q - s0;
        put_u32(w, share >= 0 ? 2 : 1);
        put_i32(w, share);
        put_i32(w, mem_seq_lo(m, s));
        put_i32(w, mem_seq_hi(m, s));
        put_i32(w, rank_of(c, mem_seq_last_stamp(m, s)));
        if (share < 0 && k >= 0) put(w, mem_rs_slot(m, k), m->rs_slot_floats * sizeof(float));
    }
}

/* CKPT: per sequence its checkpoints, oldest first, in a layout of their
 * own (not the record's, whose offsets depend on this memory). */
static void sec_ckpt(wr *w, const void *vctx)
{
    const save_ctx *c = vctx;
    const keel_mem *m = c->m;
    int32_t s0, s1;
    seq_range(m, c->seq, &s0, &s1);
    put_i32(w, s1 - s0);
    for (int32_t s = s0; s < s1; s++) {
        int32_t n = 0;
        for (int32_t i = 0; i < m->n_ckpt; i++) n += mem_ck(m, s, i)->pos >= 0;
        put_i32(w, n);
        uint64_t last = 0;
        for (int32_t i; (i = ck_next(m, s, last)) >= 0;) {
            const mem_ckpt *ck = mem_ck(m, s, i);
            const uint8_t *data = mem_ck_data(m, s, i);
            last = ck->order;
            put_i32(w, ck->pos);
            put_i32(w, ck->pos_min);
            put_i32(w, rank_of(c, ck->stamp));
            put_i32(w, index_in(c->orders, c->n_orders, ck->order));
            put(w, data, m->rs_slot_floats * sizeof(float));
            for (int32_t g = 0; g < m->n_groups; g++) {
                if (!m->groups[g].tables[0].sliding) continue;
                const mem_ckpt_ring *rr = &m->ckpt_ring[g];
                int32_t nr = rd_i32_at(data + rr->off), forgot = rd_i32_at(data + rr->off + 4);
                put_i32(w, nr);
                put_i32(w, forgot);
                for (int32_t j = 0; j < nr; j++) {
                    put_i32(w, rd_i32_at(data + rr->pos_off + (size_t)j * 4));
                    put_i32(w, rank_of(c, rd_u64_at(data + rr->stamp_off + (size_t)j * 8)));
                    put_u32(w, data[rr->cflags_off + (size_t)j]);
                }
                put(w, data + rr->rows_off, (size_t)nr * rr->cell_bytes);
            }
        }
    }
}

/* GROUP: cell metadata of every saved cell of the group's tables (all
 * streams, in table then cell order), then each column's rows of them. */
static void sec_group(wr *w, const void *vctx)
{
    const save_ctx *c = vctx;
    const mem_group *grp = &c->m->groups[c->group];
    int32_t n = 0;
    for (int32_t k = 0; k < grp->n_tables; k++)
        for (int32_t cell = 0; cell < grp->tables[k].cap; cell++) n += saved_cell(c, &grp->tables[k], cell);
    int32_t words = grp->tables[0].seq_words;
    if (!w->p) { /* counting: the size without walking the rows */
        size_t per = 12 + (c->seq < 0 ? (size_t)words * 8 : 0);
        for (int32_t ci = 0; ci < grp->tables[0].n_cols; ci++)
            per += grp->tables[0].cols[ci].head_row_bytes * (size_t)grp->tables[0].cols[ci].n_heads;
        w->n += 8 + per * (size_t)n;
        return;
    }
    put_i32(w, c->group);
    put_i32(w, n);
    for (int32_t k = 0; k < grp->n_tables; k++) {
        const mem_table *t = &grp->tables[k];
        for (int32_t cell = 0; cell < t->cap; cell++) {
            if (!saved_cell(c, t, cell)) continue;
            put_i32(w, t->pos[cell]);
            put_i32(w, rank_of(c, t->stamp[cell]));
            put_u32(w, t->cflags[cell]);
            if (c->seq < 0)
                for (int32_t i = 0; i < words; i++) put_u64(w, t->seq[(size_t)cell * (size_t)words + (size_t)i]);
        }
    }
    /* rows: per column, head by head, the saved cells in order; a run of
     * consecutive saved cells is one copy (rows are [head][cell] in memory) */
    for (int32_t ci = 0; ci < grp->tables[0].n_cols; ci++)
        for (int32_t k = 0; k < grp->n_tables; k++) {
            const mem_table *t = &grp->tables[k];
            const mem_col *col = &t->cols[ci];
            for (int32_t h = 0; h < col->n_heads; h++)
                for (int32_t cell = 0; cell < t->cap;) {
                    if (!saved_cell(c, t, cell)) {
                        cell++;
                        continue;
                    }
                    int32_t end = cell + 1;
                    while (end < t->cap && saved_cell(c, t, end)) end++;
                    put(w, mem_col_row(t, col, h, cell), (size_t)(end - cell) * col->head_row_bytes);
                    cell = end;
                }
        }
}

static bool less_u64_at(const void *ctx, int32_t a, int32_t b)
{
    const uint64_t *v = ctx;
    return v[a] < v[b];
}

static size_t up64(size_t n)
{
    return (n + BASE_ALIGN - 1) & ~(size_t)(BASE_ALIGN - 1);
}

size_t mem_session_scratch_bytes(size_t total_stamps, size_t n_ckpts, int32_t n_layers, int32_t hd_sum)
{
    /* save: stamps, distinct stamps (u64) and an order (i32) of every
     * stamp, the same of every checkpoint's take order; load: the stored
     * descriptors, a decoded row, a sign diagonal */
    size_t save = 2 * up64(total_stamps * sizeof(uint64_t)) + up64(total_stamps * sizeof(int32_t)) +
                  2 * up64(n_ckpts * sizeof(uint64_t)) + up64(n_ckpts * sizeof(int32_t));
    size_t load = up64(3 * (size_t)n_layers * sizeof(sess_col)) + up64((size_t)hd_sum * sizeof(float)) +
                  up64(512 * sizeof(float)) + 2 * up64(total_stamps * sizeof(uint64_t));
    return BASE_MAX(save, load);
}

/* Sorts v[0 .. n) (idx: n scratch entries) into out as distinct values;
 * returns how many. */
static int32_t sort_distinct(const uint64_t *v, int32_t n, int32_t *idx, uint64_t *out)
{
    for (int32_t i = 0; i < n; i++) idx[i] = i;
    mem_heap_sort(idx, n, less_u64_at, v);
    int32_t u = 0;
    for (int32_t i = 0; i < n; i++)
        if (u == 0 || v[idx[i]] != out[u - 1]) out[u++] = v[idx[i]];
    return u;
}

/* The distinct stamps of what is saved (cells; each sequence's last
 * token, checkpoints and their ring cells), ascending, and the take orders
 * of the saved checkpoints, in scratch. */
static keel_status rank_stamps(keel_mem *m, int32_t seq, save_ctx *c)
{
    int32_t s0, s1;
    seq_range(m, seq, &s0, &s1);
    int64_t total = 0, n_ck = 0;
    for (int32_t g = 0; g < m->n_groups; g++)
        for (int32_t k = 0; k < m->groups[g].n_tables; k++) total += m->groups[g].tables[k].cap;
    if (rs_sections(m))
        for (int32_t s = s0; s < s1; s++) {
            total++;
            for (int32_t i = 0; i < m->n_ckpt; i++) {
                if (mem_ck(m, s, i)->pos < 0) continue;
                n_ck++;
                total++;
                for (int32_t g = 0; g < m->n_groups; g++)
                    if (m->groups[g].tables[0].sliding) total += rd_i32_at(mem_ck_data(m, s, i) + m->ckpt_ring[g].off);
            }
        }
    base_arena_reset(&m->scratch);
    uint64_t *st = base_arena_take_n(&m->scratch, (size_t)total, sizeof(uint64_t));
    uint64_t *uniq = base_arena_take_n(&m->scratch, (size_t)total, sizeof(uint64_t));
    int32_t *idx = base_arena_take_n(&m->scratch, (size_t)total, sizeof(int32_t));
    uint64_t *ord = base_arena_take_n(&m->scratch, (size_t)n_ck, sizeof(uint64_t));
    uint64_t *ord_u = base_arena_take_n(&m->scratch, (size_t)n_ck, sizeof(uint64_t));
    if (!st || !uniq || !idx || (n_ck && (!ord || !ord_u)))
        return base_err(m->err, KEEL_ESCRATCH, "session: scratch exhausted");
    int32_t n = 0, no = 0;
    c->seq = seq;
    for (int32_t g = 0; g < m->n_groups; g++)
        for (int32_t k = 0; k < m->groups[g].n_tables; k++) {
            const mem_table *t = &m->groups[g].tables[k];
            for (int32_t cell = 0; cell < t->cap; cell++)
                if (saved_cell(c, t, cell)) st[n++] = t->stamp[cell];
        }
    if (rs_sections(m))
        for (int32_t s = s0; s < s1; s++) {
            if (mem_seq_holds(m, s)) st[n++] = mem_seq_last_stamp(m, s);
            for (int32_t i = 0; i < m->n_ckpt; i++) {
                const mem_ckpt *ck = mem_ck(m, s, i);
                if (ck->pos < 0) continue;
                const uint8_t *data = mem_ck_data(m, s, i);
                ord[no++] = ck->order;
                st[n++] = ck->stamp;
                for (int32_t g = 0; g < m->n_groups; g++) {
                    const mem_ckpt_ring *rr = &m->ckpt_ring[g];
                    if (!m->groups[g].tables[0].sliding) continue;
                    int32_t nr = rd_i32_at(data + rr->off);
                    for (int32_t j = 0; j < nr; j++) st[n++] = rd_u64_at(data + rr->stamp_off + (size_t)j * 8);
                }
            }
        }
    c->ranks = uniq;
    c->n_ranks = sort_distinct(st, n, idx, uniq);
    c->orders = ord_u;
    c->n_orders = sort_distinct(ord, no, idx, ord_u);
    return KEEL_OK;
}

keel_status keel_mem_save(keel_mem *m, int32_t seq, uint64_t fingerprint, const int32_t *tokens,
                          int32_t n_tokens, int32_t n_pending, void *buf, size_t cap, size_t *n_out)
{
    if (!m) return KEEL_EINVAL;
    m->err[0] = 0;
    if (!n_out) return base_err(m->err, KEEL_EINVAL, "save: n_out is NULL");
    if (n_tokens < 0) return base_err(m->err, KEEL_EINVAL, "save: n_tokens %d is negative", n_tokens);
    if (n_tokens > 0 && !tokens) return base_err(m->err, KEEL_EINVAL, "save: tokens is NULL with n_tokens %d", n_tokens);
    if (n_pending < 0) return base_err(m->err, KEEL_EINVAL, "save: n_pending %d is negative", n_pending);
    if (n_pending > n_tokens)
        return base_err(m->err, KEEL_EINVAL, "save: n_pending %d is more than n_tokens %d", n_pending, n_tokens);
    if (seq < -1 || seq >= m->cfg.n_seq_max)
        return base_err(m->err, KEEL_EINVAL, "save: unknown sequence id %d", seq);
    save_ctx c = {m, seq, tokens, n_tokens, n_pending, NULL, 0, NULL, 0, 0};
    keel_status st = rank_stamps(m, seq, &c);
    if (st != KEEL_OK) return st;
    for (int pass = 0; pass < 2; pass++) {
        wr w = {pass ? buf : NULL, 0, pass ? cap : 0, false};
        put(&w, SESS_MAGIC, 8);
        put_u32(&w, SESS_VERSION);
        put_u32(&w, SESS_HEADER_BYTES);
        put_u64(&w, fingerprint);
        put_i32(&w, seq);
        put_u32(&w, (uint32_t)(3 + m->n_groups + (rs_sections(m) ? 2 : 0)));
        put_u64(&w, (uint64_t)c.n_ranks);
        /* the header's own checksum */
        put_u64(&w, w.p && !w.over ? base_hash64(w.p, 40, 0x5e55) : 0);
        put_section(&w, SEC_DESC, sec_desc, &c);
        put_section(&w, SEC_TOKENS, sec_tokens, &c);
        put_section(&w, SEC_SEQ, sec_seq, &c);
        for (int32_t g = 0; g < m->n_groups; g++) {
            c.group = g;
            put_section(&w, SEC_GROUP, sec_group, &c);
        }
        if (rs_sections(m)) {
            put_section(&w, SEC_RSTATE, sec_rstate, &c);
            put_section(&w, SEC_CKPT, sec_ckpt, &c);
        }
        *n_out = w.n;
        if (pass == 0 && (!buf || cap < w.n)) return buf ? base_err(m->err, KEEL_ERANGE, "save: %zu bytes needed, %zu given", w.n, cap) : KEEL_ERANGE;
    }
    return KEEL_OK;
}
