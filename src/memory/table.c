/*
 * table.c — the cell table's metadata: slot search, sequence sets, cell
 * copies (metadata and every column), per-sequence statistics and the sink
 * thresholds of sliding tables.
 *
 * Invariants: see memory.h (T1-T6; the marks of T6 are kept here). Every
 * physical row index originates here (mem_table_find_free, iteration over
 * [0, cap) or the marks' part of it).
 */
#include "memory.h"

#include <string.h>

bool mem_seq_empty(const mem_table *t, int32_t cell)
{
    const uint64_t *w = t->seq + (size_t)cell * (size_t)t->seq_words;
    for (int32_t i = 0; i < t->seq_words; i++)
        if (w[i]) return false;
    return true;
}

int32_t mem_seq_count(const mem_table *t, int32_t cell)
{
    const uint64_t *w = t->seq + (size_t)cell * (size_t)t->seq_words;
    int32_t n = 0;
    for (int32_t i = 0; i < t->seq_words; i++) n += __builtin_popcountll(w[i]);
    return n;
}

/* [*l, *h) narrowed past the free cells at both ends */
static void skip_free_ends(const mem_table *t, int32_t *l, int32_t *h)
{
    while (*h > *l && t->pos[*h - 1] < 0) (*h)--;
    while (*l < *h && t->pos[*l] < 0) (*l)++;
}

/* Moves the marks inward past free cells (T6 holds before and after). */
static void marks_tighten(mem_table *t)
{
    int32_t l = t->lo_mark, h = t->hi_mark;
    skip_free_ends(t, &l, &h);
    if (l >= h) {
        l = t->cap;
        h = 0;
    }
    t->lo_mark = l;
    t->hi_mark = h;
}

void mem_table_free_cell(mem_table *t, int32_t cell)
{
    if (t->pos[cell] >= 0) t->n_used--;
    t->pos[cell] = -1;
    t->stamp[cell] = 0;
    t->cflags[cell] = 0;
    memset(t->seq + (size_t)cell * (size_t)t->seq_words, 0, (size_t)t->seq_words * sizeof(uint64_t));
    t->sinks_dirty = true;
    /* only a cell at either end moves a mark: freeing the oldest or newest
     * cells walks inward over the cells freed before them (each free cell
     * is passed once per time it leaves the range) */
    if (cell == t->lo_mark || cell == t->hi_mark - 1) marks_tighten(t);
}

void mem_table_copy_cell_from(mem_table *td, int32_t dst, const mem_table *ts, int32_t src)
{
    if (td->pos[dst] < 0 && ts->pos[src] >= 0) td->n_used++;
    td->pos[dst] = ts->pos[src];
    if (td->pos[dst] >= 0) mem_table_mark_used(td, dst);
    td->stamp[dst] = ts->stamp[src];
    td->cflags[dst] = ts->cflags[src];
    for (int32_t c = 0; c < td->n_cols; c++) {
        const mem_col *cd = &td->cols[c], *cs = &ts->cols[c];
        for (int32_t h = 0; h < cd->n_heads; h++)
            memcpy(mem_col_row(td, cd, h, dst), mem_col_row(ts, cs, h, src), cd->head_row_bytes);
    }
    td->sinks_dirty = true;
}

void mem_table_copy_cell(mem_table *t, int32_t dst, int32_t src)
{
    mem_table_copy_cell_from(t, dst, t, src);
}

int32_t mem_table_split(mem_table *t, int32_t cell, int32_t s)
{
    if (mem_seq_count(t, cell) <= 1) return cell;
    int32_t d = mem_table_find_free(t); /* room validated by the caller */
    mem_table_copy_cell(t, d, cell);
    mem_seq_unset(t, cell, s);
    mem_seq_set(t, d, s);
    return d;
}

void mem_table_extent(const mem_table *t, int32_t *lo, int32_t *hi)
{
    int32_t l = t->lo_mark, h = t->n_used > 0 ? t->hi_mark : 0;
    skip_free_ends(t, &l, &h);
    if (l >= h) l = h = 0;
    *lo = l;
    *hi = h;
}

void mem_table_seq_extent(const mem_table *t, int32_t s, int32_t *lo, int32_t *hi)
{
    int32_t l = BASE_MAX(t->seq_lo[s], t->lo_mark), h = BASE_MIN(t->seq_hi[s], t->hi_mark);
    while (h > l && !mem_seq_has(t, h - 1, s)) h--;
    while (l < h && !mem_seq_has(t, l, s)) l++;
    if (l >= h) l = h = 0;
    *lo = l;
    *hi = h;
}

int32_t mem_table_find_free(mem_table *t)
{
    if (t->n_used >= t->cap) return -1;
    int32_t c = t->head;
    for (int32_t i = 0; i < t->cap; i++) {
        if (t->pos[c] < 0) {
            t->head = c + 1 == t->cap ? 0 : c + 1;
            return c;
        }
        c = c + 1 == t->cap ? 0 : c + 1;
    }
    return -1;
}

void mem_table_occupy(mem_table *t, int32_t cell, int32_t pos, uint64_t stamp, int32_t s)
{
    if (t->pos[cell] < 0) t->n_used++;
    t->pos[cell] = pos;
    t->stamp[cell] = stamp;
    mem_table_mark_used(t, cell);
    mem_seq_set(t, cell, s);
    if (t->seq_cells[s] == 0 || pos < t->seq_min[s]) t->seq_min[s] = pos;
    if (t->seq_cells[s] == 0 || pos > t->seq_max[s]) t->seq_max[s] = pos;
    t->seq_cells[s]++;
    t->sinks_dirty = true;
}

void mem_table_refresh(mem_table *t)
{
    for (int32_t s = 0; s < t->n_seq; s++) {
        t->seq_min[s] = -1;
        t->seq_max[s] = -1;
        t->seq_cells[s] = 0;
        t->seq_lo[s] = t->cap;
        t->seq_hi[s] = 0;
    }
    int32_t used = 0, lo = t->cap, hi = 0;
    for (int32_t c = 0; c < t->cap; c++) {
        int32_t p = t->pos[c];
        if (p < 0) continue;
        used++;
        if (lo == t->cap) lo = c;
        hi = c + 1;
        const uint64_t *w = t->seq + (size_t)c * (size_t)t->seq_words;
        for (int32_t i = 0; i < t->seq_words; i++) {
            uint64_t bits = w[i];
            while (bits) {
                int32_t s = i * 64 + __builtin_ctzll(bits);
                bits &= bits - 1;
                if (t->seq_cells[s] == 0 || p < t->seq_min[s]) t->seq_min[s] = p;
                if (t->seq_cells[s] == 0 || p > t->seq_max[s]) t->seq_max[s] = p;
                if (t->seq_cells[s] == 0) t->seq_lo[s] = c;
                t->seq_hi[s] = c + 1;
                t->seq_cells[s]++;
            }
        }
    }
    t->n_used = used;
    t->lo_mark = lo;
    t->hi_mark = hi;
    t->sinks_dirty = true;
}

/* (p, st) < (q, su) in (position, stamp) order */
static inline bool key_less(int32_t p, uint64_t st, int32_t q, uint64_t su)
{
    return p < q || (p == q && st < su);
}

/* Max-heap of the n_sink smallest (pos, stamp) keys seen so far. */
static void heap_sift_down(int32_t *hp, uint64_t *hs, int32_t n, int32_t i)
{
    for (;;) {
        int32_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && key_less(hp[m], hs[m], hp[l], hs[l])) m = l;
        if (r < n && key_less(hp[m], hs[m], hp[r], hs[r])) m = r;
        if (m == i) return;
        int32_t tp = hp[i];
        uint64_t ts = hs[i];
        hp[i] = hp[m];
        hs[i] = hs[m];
        hp[m] = tp;
        hs[m] = ts;
        i = m;
    }
}

static void heap_sift_up(int32_t *hp, uint64_t *hs, int32_t i)
{
    while (i > 0) {
        int32_t p = (i - 1) / 2;
        if (!key_less(hp[p], hs[p], hp[i], hs[i])) return;
        int32_t tp = hp[i];
        uint64_t ts = hs[i];
        hp[i] = hp[p];
        hs[i] = hs[p];
        hp[p] = tp;
        hs[p] = ts;
        i = p;
    }
}

void mem_table_update_sinks(mem_table *t, int32_t n_seq)
{
    if (!t->sliding || !t->sinks_dirty) return;
    for (int32_t s = 0; s < n_seq; s++) {
        t->sink_pos[s] = -1;
        t->sink_stamp[s] = 0;
        if (t->n_sink == 0 || t->seq_cells[s] == 0) continue;
        int32_t n = 0;
        for (int32_t c = 0; c < t->cap; c++) {
            if (t->pos[c] < 0 || !mem_seq_has(t, c, s)) continue;
            if (n < t->n_sink) {
                t->heap_pos[n] = t->pos[c];
                t->heap_stamp[n] = t->stamp[c];
                heap_sift_up(t->heap_pos, t->heap_stamp, n);
                n++;
            } else if (key_less(t->pos[c], t->stamp[c], t->heap_pos[0], t->heap_stamp[0])) {
                t->heap_pos[0] = t->pos[c];
                t->heap_stamp[0] = t->stamp[c];
                heap_sift_down(t->heap_pos, t->heap_stamp, n, 0);
            }
        }
        /* the heap's top is the largest of the n_sink smallest keys */
        t->sink_pos[s] = t->heap_pos[0];
        t->sink_stamp[s] = t->heap_stamp[0];
    }
    t->sinks_dirty = false;
}

bool mem_table_is_sink(mem_table *t, int32_t cell, int32_t s)
{
    if (!t->sliding || t->n_sink == 0) return false;
    if (t->sinks_dirty) mem_table_update_sinks(t, t->n_seq);
    if (t->sink_pos[s] < 0) return false;
    return !key_less(t->sink_pos[s], t->sink_stamp[s], t->pos[cell], t->stamp[cell]);
}

static void sift(int32_t *v, int32_t n, int32_t i, mem_less_fn less, const void *ctx)
{
    for (;;) {
        int32_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && less(ctx, v[m], v[l])) m = l;
        if (r < n && less(ctx, v[m], v[r])) m = r;
        if (m == i) return;
        int32_t t = v[i];
        v[i] = v[m];
        v[m] = t;
        i = m;
    }
}

static void reverse(int32_t *v, int32_t a, int32_t b)
{
    for (b--; a < b; a++, b--) {
        int32_t t = v[a];
        v[a] = v[b];
        v[b] = t;
    }
}

void mem_heap_sort(int32_t *v, int32_t n, mem_less_fn less, const void *ctx)
{
    /* in order already, or two runs in order whose second comes first (a
     * ring's cells after it wrapped): O(n) */
    int32_t i = 1;
    while (i < n && !less(ctx, v[i], v[i - 1])) i++;
    if (i >= n) return;
    int32_t j = i + 1;
    while (j < n && !less(ctx, v[j], v[j - 1])) j++;
    if (j >= n && !less(ctx, v[0], v[n - 1])) {
        reverse(v, 0, i);
        reverse(v, i, n);
        reverse(v, 0, n);
        return;
    }
    for (i = n / 2 - 1; i >= 0; i--) sift(v, n, i, less, ctx);
    for (int32_t e = n - 1; e > 0; e--) {
        int32_t t = v[0];
        v[0] = v[e];
        v[e] = t;
        sift(v, e, 0, less, ctx);
    }
}
