/*
 * check.c — keel_mem_check: verifies the memory invariants (memory.h T1-T6,
 * design.md section 3 rules 1-2 and the column descriptors of rule 4) on a
 * live keel_mem. Tests call it after every operation. Read-only except for
 * the scratch arena and the error string.
 */
#include "memory.h"

#include <math.h>
#include <string.h>

#define FAIL(...) return base_err(m->err, KEEL_EINTERNAL, __VA_ARGS__)

static keel_status check_col(keel_mem *m, const mem_table *t, int32_t g, int32_t ci)
{
    const mem_col *c = &t->cols[ci];
    if (!tensor_dtype_valid(c->dtype)) FAIL("group %d col %d: invalid dtype %d", g, ci, c->dtype);
    if (c->head_row_bytes != tensor_row_bytes(c->dtype, c->head_dim) || c->head_row_bytes == 0)
        FAIL("group %d col %d: head_row_bytes %zu does not match %s x %d", g, ci,
             c->head_row_bytes, keel_dtype_name(c->dtype), c->head_dim);
    if (c->data_bytes != (size_t)c->n_heads * (size_t)t->cap * c->head_row_bytes || !c->data)
        FAIL("group %d col %d: data_bytes %zu for %d heads x %d cells", g, ci, c->data_bytes,
             c->n_heads, t->cap);
    if (c->layer < 0 || c->layer >= m->cfg.n_layers) FAIL("group %d col %d: layer %d", g, ci, c->layer);
    const keel_mem_layer *L = &m->layers[c->layer];
    if (m->layer_group[c->layer] != g) FAIL("group %d col %d: layer %d not in group", g, ci, c->layer);
    if ((int32_t)c->kind < 0 || (int32_t)c->kind >= mem_layer_n_cols(L) ||
        m->layer_col[c->layer] + (int32_t)c->kind != ci)
        FAIL("group %d col %d: layer %d's column index disagrees", g, ci, c->layer);
    mem_col_spec sp = mem_layer_col_spec(L, (int32_t)c->kind);
    if (c->n_heads != sp.n_heads || c->head_dim != sp.head_dim || c->dtype != sp.dtype)
        FAIL("group %d col %d: descriptor disagrees with layer %d", g, ci, c->layer);
    if (c->rot.enabled) {
        int32_t b = c->rot.block;
        if (b < 32 || b > 512 || (b & (b - 1)) || c->head_dim % b)
            FAIL("group %d col %d: rotation block %d", g, ci, b);
        if ((c->rot.seed != 0) != (c->signs != NULL))
            FAIL("group %d col %d: sign diagonal missing or unexpected", g, ci);
        if (c->signs)
            for (int32_t i = 0; i < b; i++)
                if (c->signs[i] != 1.0f && c->signs[i] != -1.0f)
                    FAIL("group %d col %d: sign %d is %g", g, ci, i, (double)c->signs[i]);
    }
    if (c->kind != MEM_COL_V && c->rope.type != KEEL_ROPE_NONE && !c->rope_rates)
        FAIL("group %d col %d: rope without angle rates", g, ci);
    return KEEL_OK;
}

static keel_status check_table(keel_mem *m, const mem_table *t, int32_t g, int32_t k, float *x)
{
    const mem_group *grp = &m->groups[g];
    if (t->cap < 1 || t->head < 0 || t->head >= t->cap)
        FAIL("group %d table %d: cap %d head %d", g, k, t->cap, t->head);
    if (t->lo_mark < 0 || t->lo_mark > t->cap || t->hi_mark < 0 || t->hi_mark > t->cap)
        FAIL("group %d table %d: marks [%d, %d) outside [0, %d]", g, k, t->lo_mark, t->hi_mark, t->cap);
    for (int32_t s = 0; s < m->cfg.n_seq_max; s++)
        if (t->seq_lo[s] < 0 || t->seq_lo[s] > t->cap || t->seq_hi[s] < 0 || t->seq_hi[s] > t->cap)
            FAIL("group %d table %d: sequence %d's marks [%d, %d) outside [0, %d]", g, k, s, t->seq_lo[s],
                 t->seq_hi[s], t->cap);
    int32_t n_cols = 0;
    for (int32_t i = 0; i < m->cfg.n_layers; i++)
        if (m->layer_group[i] == g) n_cols += mem_layer_n_cols(&m->layers[i]);
    if (t->sliding != (grp->kind == KEEL_MEM_LAYER_SLIDING) || t->n_cols != n_cols)
        FAIL("group %d table %d: kind or column count disagrees with the group", g, k);
    int32_t used = 0;
    int32_t ns = m->cfg.n_seq_max;
    for (int32_t c = 0; c < t->cap; c++) {
        int32_t p = t->pos[c];
        const uint64_t *w = t->seq + (size_t)c * (size_t)t->seq_words;
        if (t->flags[c]) FAIL("group %d table %d cell %d: stale operation mark", g, k, c);
        if (p < -1) FAIL("group %d table %d cell %d: position %d", g, k, c, p);
        if (p == -1) {
            if (!mem_seq_empty(t, c)) FAIL("group %d table %d cell %d: empty cell with sequences", g, k, c);
            if (t->cflags[c]) FAIL("group %d table %d cell %d: empty cell with flags", g, k, c);
            continue;
        }
        used++;
        if (c < t->lo_mark || c >= t->hi_mark)
            FAIL("group %d table %d cell %d: occupied outside the marks [%d, %d)", g, k, c, t->lo_mark,
                 t->hi_mark);
        if (mem_seq_empty(t, c))
            FAIL("group %d table %d cell %d: occupied (pos %d) without sequence", g, k, c, p);
        if (t->stamp[c] == 0 || t->stamp[c] >= m->next_stamp)
            FAIL("group %d table %d cell %d: stamp %llu", g, k, c, (unsigned long long)t->stamp[c]);
        for (int32_t s = ns; s < t->seq_words * 64; s++)
            if ((w[s >> 6] >> (s & 63)) & 1u)
                FAIL("group %d table %d cell %d: sequence id %d >= n_seq_max", g, k, c, s);
        for (int32_t i = 0; i < t->seq_words; i++)
            for (uint64_t bits = w[i]; bits; bits &= bits - 1) {
                int32_t s = i * 64 + __builtin_ctzll(bits);
                if (s < ns && (c < t->seq_lo[s] || c >= t->seq_hi[s]))
                    FAIL("group %d table %d cell %d: holds sequence %d outside its marks [%d, %d)", g, k, c, s,
                         t->seq_lo[s], t->seq_hi[s]);
            }
        if (t->stream >= 0 && (mem_seq_count(t, c) != 1 || !mem_seq_has(t, c, t->stream)))
            FAIL("group %d table %d cell %d: holds a sequence of another stream", g, k, c);
        /* stored rows decode to finite values */
        for (int32_t ci = 0; ci < t->n_cols; ci++) {
            const mem_col *col = &t->cols[ci];
            for (int32_t h = 0; h < col->n_heads; h++) {
                const uint8_t *row = mem_col_row(t, col, h, c);
                if (!row) FAIL("group %d table %d cell %d: row out of range", g, k, c);
                tensor_dequantize_row_unchecked(col->dtype, row, x, col->head_dim);
                for (int32_t i = 0; i < col->head_dim; i++)
                    if (!isfinite(x[i]))
                        FAIL("group %d table %d cell %d layer %d %s head %d: non-finite value", g,
                             k, c, col->layer,
                             col->kind == MEM_COL_K ? "K" : col->kind == MEM_COL_V ? "V" : "indexer key", h);
            }
        }
    }
    if (used != t->n_used)
        FAIL("group %d table %d: n_used %d but %d cells occupied", g, k, t->n_used, used);
    /* per-sequence statistics */
    for (int32_t s = 0; s < ns; s++) {
        int32_t mn = -1, mx = -1, cnt = 0;
        for (int32_t c = 0; c < t->cap; c++) {
            if (t->pos[c] < 0 || !mem_seq_has(t, c, s)) continue;
            if (cnt == 0 || t->pos[c] < mn) mn = t->pos[c];
            if (cnt == 0 || t->pos[c] > mx) mx = t->pos[c];
            cnt++;
        }
        if (cnt != t->seq_cells[s] || (cnt && (mn != t->seq_min[s] || mx != t->seq_max[s])))
            FAIL("group %d table %d seq %d: stats (%d cells, %d..%d) but cells say (%d, %d..%d)", g,
                 k, s, t->seq_cells[s], t->seq_min[s], t->seq_max[s], cnt, mn, mx);
    }
    for (int32_t ci = 0; ci < t->n_cols; ci++) {
        keel_status st = check_col(m, t, g, ci);
        if (st != KEEL_OK) return st;
    }
    return KEEL_OK;
}

/* (stamp, pos) order of cells of one table */
static bool less_stamp_pos(const void *ctx, int32_t a, int32_t b)
{
    const mem_table *t = ctx;
    return t->stamp[a] < t->stamp[b] || (t->stamp[a] == t->stamp[b] && t->pos[a] < t->pos[b]);
}

static int32_t cells_of(const mem_table *t, int32_t s, int32_t *out)
{
    int32_t n = 0;
    for (int32_t c = 0; c < t->cap; c++)
        if (t->pos[c] >= 0 && mem_seq_has(t, c, s)) out[n++] = c;
    mem_heap_sort(out, n, less_stamp_pos, t);
    return n;
}

/*
 * T4 (sliding retention against the full table): every operation reaches a
 * ring and the full table of a sequence alike (placement, copies, removals,
 * position edits, copy-on-write), except that rings also forget; so unless
 * the sequence was compacted, the (stamp, position) multiset of its ring
 * cells is contained in that of its full-table cells. A ring that kept a
 * token the full table lost, or moved one differently, breaks it.
 */
static keel_status check_ring_subset(keel_mem *m, int32_t s, int32_t gr, const mem_table *R,
                                     int32_t gf, const mem_table *F, int32_t *a, int32_t *b)
{
    int32_t na = cells_of(R, s, a), nb = cells_of(F, s, b);
    for (int32_t i = 0, j = 0; i < na; i++, j++) {
        while (j < nb && (F->stamp[b[j]] < R->stamp[a[i]] ||
                          (F->stamp[b[j]] == R->stamp[a[i]] && F->pos[b[j]] < R->pos[a[i]])))
            j++;
        if (j == nb || F->stamp[b[j]] != R->stamp[a[i]] || F->pos[b[j]] != R->pos[a[i]])
            FAIL("seq %d: sliding group %d holds the token of stamp %llu at position %d, which full "
                 "group %d does not hold there",
                 s, gr, (unsigned long long)R->stamp[a[i]], R->pos[a[i]], gf);
    }
    return KEEL_OK;
}

size_t mem_check_scratch_bytes(const keel_mem_config *cfg, int32_t max_cap)
{
    int32_t hd = 1;
    for (int32_t i = 0; i < cfg->n_layers; i++) hd = BASE_MAX(hd, mem_layer_dim_max(&cfg->layers[i]));
    size_t x = ((size_t)hd * sizeof(float) + BASE_ALIGN - 1) & ~(size_t)(BASE_ALIGN - 1);
    size_t c = ((size_t)max_cap * sizeof(int32_t) + BASE_ALIGN - 1) & ~(size_t)(BASE_ALIGN - 1);
    return x + 2 * c;
}

keel_status keel_mem_check(keel_mem *m)
{
    if (!m) return KEEL_EINVAL;
    m->err[0] = 0;
    if (m->n_groups < 0 || m->n_groups > m->cfg.n_layers) FAIL("n_groups %d", m->n_groups);
    for (int32_t i = 0; i < m->cfg.n_layers; i++) {
        int32_t g = m->layer_group[i];
        bool none = !mem_layer_has_kv(&m->layers[i]);
        if ((g < 0) != none || g >= m->n_groups)
            FAIL("layer %d: group %d for kind %d", i, g, (int)m->layers[i].kind);
    }
    int32_t hd = 1;
    for (int32_t i = 0; i < m->cfg.n_layers; i++) hd = BASE_MAX(hd, mem_layer_dim_max(&m->layers[i]));
    base_arena_reset(&m->scratch);
    int32_t max_cap = 1;
    for (int32_t g = 0; g < m->n_groups; g++) max_cap = BASE_MAX(max_cap, m->groups[g].tables[0].cap);
    float *x = base_arena_take_n(&m->scratch, (size_t)hd, sizeof(float));
    int32_t *ia = base_arena_take_n(&m->scratch, (size_t)max_cap, sizeof(int32_t));
    int32_t *ib = base_arena_take_n(&m->scratch, (size_t)max_cap, sizeof(int32_t));
    if (!x || !ia || !ib) return base_err(m->err, KEEL_ESCRATCH, "check: scratch exhausted");
    for (int32_t g = 0; g < m->n_groups; g++) {
        const mem_group *grp = &m->groups[g];
        if (grp->n_tables != m->n_streams) FAIL("group %d: %d tables for %d streams", g, grp->n_tables, m->n_streams);
        for (int32_t k = 0; k < grp->n_tables; k++) {
            keel_status st = check_table(m, &grp->tables[k], g, k, x);
            if (st != KEEL_OK) return st;
            if (grp->tables[k].cap != grp->tables[0].cap) FAIL("group %d: tables differ in capacity", g);
        }
    }
    /* T5: unless the sequence was compacted (which may drop from the full
     * tables tokens a ring still holds), a sequence a sliding table holds is
     * held by every full table, up to at least the same last position (rings
     * forget old cells, never new ones; a partial seq_cp may copy fewer). */
    for (int32_t s = 0; s < m->cfg.n_seq_max; s++) {
        if (m->exact_from[s] != 0) continue;
        int32_t k = m->n_streams == 1 ? 0 : s;
        for (int32_t g = 0; g < m->n_groups; g++) {
            const mem_table *a = &m->groups[g].tables[k];
            if (a->sliding) continue;
            for (int32_t g2 = 0; g2 < m->n_groups; g2++) {
                const mem_table *b = &m->groups[g2].tables[k];
                if (g2 == g || b->seq_cells[s] == 0) continue;
                if (a->seq_cells[s] == 0 || b->seq_max[s] > a->seq_max[s])
                    FAIL("seq %d: group %d ends at %d beyond full group %d (%d)", s, g2,
                         b->seq_max[s], g, a->seq_cells[s] ? a->seq_max[s] : -1);
            }
        }
    }
    /* T4: rings against the full table, for sequences never compacted */
    int32_t gf = -1;
    for (int32_t g = 0; g < m->n_groups && gf < 0; g++)
        if (m->groups[g].kind == KEEL_MEM_LAYER_FULL) gf = g;
    for (int32_t s = 0; gf >= 0 && s < m->cfg.n_seq_max; s++) {
        if (m->exact_from[s] != 0) continue;
        int32_t k = m->n_streams == 1 ? 0 : s;
        for (int32_t g = 0; g < m->n_groups; g++) {
            const mem_table *R = &m->groups[g].tables[k];
            if (!R->sliding || R->seq_cells[s] == 0) continue;
            keel_status st = check_ring_subset(m, s, g, R, gf, &m->groups[gf].tables[k], ia, ib);
            if (st != KEEL_OK) return st;
        }
    }
    return mem_rs_check(m, x);
}
