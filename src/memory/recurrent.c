/*
 * recurrent.c — the recurrent half of keel_mem: per-sequence state slots
 * of the recurrent layers (conv + SSM / delta-rule state, f32), copy on
 * write between forks, checkpoints (the state plus the sliding rings' rows
 * a rewind needs), and the recurrent side of every sequence operation.
 * docs/memory.md, "The recurrent half".
 *
 * Invariants (keel_mem_check, mem_rs_check)
 *   R1 a sequence holds a slot iff it holds tokens; rs_refs[k] is the
 *      number of sequences whose slot is k; a slot of refs > 1 is shared by
 *      forks and copied before it is written (placement makes it exclusive).
 *   R2 the state summarizes exactly the sequence's tokens: rs_pos_min /
 *      rs_pos_max are the span of those tokens; with attention layers the
 *      tables' largest position is rs_pos_max (the last token is kept by
 *      rings and compaction) and their smallest is >= rs_pos_min; rs_stamp
 *      is the stamp of the last token.
 *   R3 a checkpoint of s covers positions < pos with rs_pos_min[s] < pos <=
 *      rs_pos_max[s] + 1; the token at pos - 1 is the one it was taken
 *      after (its stamp is in every full table at pos - 1), its ring rows
 *      are at positions < pos, at most n_sink + window per group.
 * Every operation validates first and commits second (rule 6); a
 * truncation into a state restores a checkpoint or is refused (rule 7).
 */
#include "memory.h"

#include <math.h>
#include <string.h>

/* The span of the tokens the state summarizes: from the first placed (or
 * where edits moved it) to the last. Rings forget and compaction evicts
 * from the attention tables, so their smallest position may be larger;
 * their largest is the state's last token (rings and compaction keep it). */
static inline int32_t rs_lo(const keel_mem *m, int32_t s)
{
    return m->rs_pos_min[s];
}

static inline int32_t rs_hi(const keel_mem *m, int32_t s)
{
    return m->rs_pos_max[s];
}

/* A sequence's span and last stamp, whichever half describes it: the
 * recurrent state's on a recurrent memory, the tables' on an attention
 * memory (whose checkpoints hold ring rows only). */
int32_t mem_seq_hi(const keel_mem *m, int32_t s)
{
    return m->n_rs_layers > 0 ? rs_hi(m, s) : mem_tables_pos_max(m, s);
}

int32_t mem_seq_lo(const keel_mem *m, int32_t s)
{
    return m->n_rs_layers > 0 ? rs_lo(m, s) : mem_tables_pos_min(m, s);
}

bool mem_seq_holds(const keel_mem *m, int32_t s)
{
    return m->n_rs_layers > 0 ? m->seq_slot[s] >= 0 : mem_tables_pos_max(m, s) >= 0;
}

/* The stamp of s's last token (the newest of its cells at its largest
 * position), 0 when it holds none. */
uint64_t mem_seq_last_stamp(const keel_mem *m, int32_t s)
{
    if (m->n_rs_layers > 0) return m->rs_stamp[s];
    int32_t hi = mem_tables_pos_max(m, s);
    uint64_t best = 0;
    for (int32_t g = 0; g < m->n_groups; g++) {
        const mem_table *t = mem_table_of(m, g, s);
        for (int32_t c = 0; c < t->cap; c++)
            if (t->pos[c] == hi && mem_seq_has(t, c, s) && t->stamp[c] > best) best = t->stamp[c];
    }
    return best;
}

bool keel_mem_is_recurrent(const keel_mem *m)
{
    return m && m->n_rs_layers > 0;
}

size_t mem_rs_scratch_bytes(const keel_mem_config *cfg, int32_t max_cap)
{
    bool rs = false;
    int32_t hd = 1;
    for (int32_t i = 0; i < cfg->n_layers; i++) {
        rs |= cfg->layers[i].kind == KEEL_MEM_LAYER_RECURRENT;
        if (mem_layer_has_kv(&cfg->layers[i])) hd = BASE_MAX(hd, mem_layer_dim_max(&cfg->layers[i]));
    }
    if (!rs) return 0;
    size_t c = ((size_t)max_cap * sizeof(int32_t) + BASE_ALIGN - 1) & ~(size_t)(BASE_ALIGN - 1);
    size_t x = ((size_t)hd * sizeof(float) + BASE_ALIGN - 1) & ~(size_t)(BASE_ALIGN - 1);
    return 2 * c + x;
}

void mem_ck_drop(keel_mem *m, int32_t s, int32_t above)
{
    for (int32_t i = 0; i < m->n_ckpt; i++) {
        mem_ckpt *c = mem_ck(m, s, i);
        if (c->pos >= 0 && (above < 0 || c->pos > above)) c->pos = -1;
    }
    /* a speculation snapshot goes with the checkpoints it is newer than */
    if (m->spec_pos && m->spec_pos[s] >= 0 && (above < 0 || m->spec_pos[s] > above)) m->spec_pos[s] = -1;
}

void mem_rs_drop_seq(keel_mem *m, int32_t s)
{
    mem_ck_drop(m, s, -1);
    if (m->n_rs_layers == 0) return;
    if (m->seq_slot[s] >= 0) m->rs_refs[m->seq_slot[s]]--;
    m->seq_slot[s] = -1;
    m->rs_pos_min[s] = m->rs_pos_max[s] = -1;
    m->rs_stamp[s] = 0;
    mem_ck_drop(m, s, -1);
}

void mem_rs_clear(keel_mem *m)
{
    for (int32_t k = 0; k < m->n_rs_slots; k++) m->rs_refs[k] = 0;
    for (int32_t s = 0; s < m->cfg.n_seq_max; s++) {
        m->seq_slot[s] = -1;
        m->rs_pos_min[s] = m->rs_pos_max[s] = -1;
        m->rs_stamp[s] = 0;
    }
    for (size_t i = 0; i < (size_t)m->cfg.n_seq_max * (size_t)m->n_ckpt; i++) {
        memset(&m->ckpts[i], 0, sizeof m->ckpts[i]);
        m->ckpts[i].pos = -1;
    }
    for (int32_t s = 0; m->spec_pos && s < m->cfg.n_seq_max; s++) m->spec_pos[s] = -1;
}

/* ---- placement ------------------------------------------------------------ */

keel_status mem_rs_place_check(keel_mem *m, const keel_mem_batch *b)
{
    if (m->n_rs_layers == 0) return KEEL_OK;
    uint8_t seen[MEM_SEQ_MAX];
    memset(seen, 0, sizeof seen);
    for (int32_t i = 0; i < b->n_tokens; i++) {
        int32_t nsi = b->n_seq_id ? b->n_seq_id[i] : 1;
        if (nsi != 1)
            return base_err(m->err, KEEL_EINVAL,
                            "place: token %d belongs to %d sequences; recurrent states are per "
                            "sequence (place it once per sequence, or fork with seq_cp)",
                            i, nsi);
        seen[b->n_seq_id ? b->seq_id[i][0] : b->seq_id1[i]] = 1;
    }
    /* a sequence without a slot needs one; the sharers of a slot (forks)
     * in the batch need min(sharers in the batch, refs - 1) new ones: the
     * last of them to be placed keeps the original (mem_rs_place_commit) */
    int32_t need = 0;
    for (int32_t s = 0; s < m->cfg.n_seq_max; s++) {
        if (!seen[s]) continue;
        int32_t k = m->seq_slot[s], in = 0;
        if (k < 0) {
            need++;
            continue;
        }
        if (m->rs_refs[k] == 1) continue;
        bool first = true; /* count each shared slot once, at its lowest sequence */
        for (int32_t q = 0; q < m->cfg.n_seq_max && first; q++) {
            if (!seen[q] || m->seq_slot[q] != k) continue;
            if (q < s) first = false;
            in++;
        }
        if (first) need += BASE_MIN(in, m->rs_refs[k] - 1);
    }
    int32_t avail = mem_rs_free_slots(m);
    if (need > avail)
        return base_err(m->err, KEEL_EFULL,
                        "place: %d sequences need a recurrent state slot of their own, %d of "
                        "n_rs_slots %d are free",
                        need, avail, m->n_rs_slots);
    return KEEL_OK;
}

void mem_rs_place_commit(keel_mem *m, const keel_mem_batch *b, uint64_t first_stamp)
{
    for (int32_t i = 0; i < b->n_tokens; i++) {
        int32_t s = b->n_seq_id ? b->seq_id[i][0] : b->seq_id1[i];
        int32_t k = m->seq_slot[s];
        if (k < 0) { /* a new sequence starts from zero state */
            int32_t nk = mem_rs_take_slot(m);
            memset(mem_rs_slot(m, nk), 0, m->rs_slot_floats * sizeof(float));
            m->rs_refs[nk] = 1;
            m->seq_slot[s] = nk;
            m->rs_pos_min[s] = b->pos[i];
        } else if (m->rs_refs[k] > 1) { /* copy on write of a fork */
            int32_t nk = mem_rs_take_slot(m);
            memcpy(mem_rs_slot(m, nk), mem_rs_slot(m, k), m->rs_slot_floats * sizeof(float));
            m->rs_refs[k]--;
            m->rs_refs[nk] = 1;
            m->seq_slot[s] = nk;
        }
        m->rs_pos_max[s] = b->pos[i];
        m->rs_stamp[s] = first_stamp + (uint64_t)i;
    }
}

keel_status keel_mem_rs_state(keel_mem *m, int32_t layer, int32_t s, float **conv, float **state)
{
    if (!m) return KEEL_EINVAL;
    m->err[0] = 0;
    if (conv) *conv = NULL;
    if (state) *state = NULL;
    if (layer < 0 || layer >= m->cfg.n_layers || m->layer_rs[layer] < 0)
        return base_err(m->err, KEEL_EINVAL, "rs_state: layer %d is not recurrent", layer);
    if (s < 0 || s >= m->cfg.n_seq_max)
        return base_err(m->err, KEEL_EINVAL, "rs_state: unknown sequence id %d", s);
    int32_t k = m->seq_slot[s];
    if (k < 0)
        return base_err(m->err, KEEL_ESTATE, "rs_state: sequence %d holds no tokens", s);
    if (m->rs_refs[k] > 1)
        return base_err(m->err, KEEL_ESTATE,
                        "rs_state: sequence %d shares its state with %d other sequences (it is "
                        "copied when a batch continues it)",
                        s, m->rs_refs[k] - 1);
    int32_t r = m->layer_rs[layer];
    const keel_mem_recurrent *L = &m->layers[layer].rs;
    if (conv) *conv = L->conv_kernel > 1 ? mem_rs_slot(m, k) + m->rs_conv_off[r] : NULL;
    if (state) *state = mem_rs_slot(m, k) + m->rs_state_off[r];
    return KEEL_OK;
}

/* ---- checkpoints ---------------------------------------------------------- */

static int32_t ck_newest(const keel_mem *m, int32_t s)
{
    int32_t best = -1;
    for (int32_t i = 0; i < m->n_ckpt; i++) {
        const mem_ckpt *c = mem_ck(m, s, i);
        if (c->pos >= 0 && (best < 0 || c->order > mem_ck(m, s, best)->order)) best = i;
    }
    return best;
}

/* The newest checkpoint of s at or before p0 (and after the sequence's
 * start), or -1. Positions only grow between truncations, so the newest by
 * position is the one to restore. */
static int32_t ck_at_or_before(const keel_mem *m, int32_t s, int32_t p0)
{
    int32_t best = -1;
    for (int32_t i = 0; i < m->n_ckpt; i++) {
        const mem_ckpt *c = mem_ck(m, s, i);
        if (c->pos < 0 || c->pos > p0) continue;
        if (best < 0 || c->pos > mem_ck(m, s, best)->pos) best = i;
    }
    return best;
}

static bool newer_stamp(const void *ctx, int32_t a, int32_t b)
{
    const mem_table *t = ctx;
    return t->stamp[a] > t->stamp[b];
}

/* Copies cell `cell` of t (every column, every head) to dst[cell_bytes]. */
static void cell_rows_out(const mem_table *t, int32_t cell, uint8_t *dst)
{
    for (int32_t ci = 0; ci < t->n_cols; ci++) {
        const mem_col *c = &t->cols[ci];
        for (int32_t h = 0; h < c->n_heads; h++) {
            memcpy(dst, mem_col_row(t, c, h, cell), c->head_row_bytes);
            dst += c->head_row_bytes;
        }
    }
}

static void cell_rows_in(mem_table *t, int32_t cell, const uint8_t *src)
{
    for (int32_t ci = 0; ci < t->n_cols; ci++) {
        const mem_col *c = &t->cols[ci];
        for (int32_t h = 0; h < c->n_heads; h++) {
            memcpy(mem_col_row(t, c, h, cell), src, c->head_row_bytes);
            src += c->head_row_bytes;
        }
    }
}

keel_status keel_mem_ckpt_take(keel_mem *m, int32_t s)
{
    return keel_mem_ckpt_take_prio(m, s, 0);
}

/* The record a new checkpoint of priority prio goes to: a free one, else
 * the lowest-priority oldest one if its priority is at most prio, else -1
 * (every record is worth more than the new one). */
static int32_t ck_victim(const keel_mem *m, int32_t s, int32_t prio)
{
    int32_t rec = -1;
    for (int32_t i = 0; i < m->n_ckpt; i++) {
        const mem_ckpt *c = mem_ck(m, s, i);
        if (c->pos < 0) return i;
        if (rec < 0 || c->prio < mem_ck(m, s, rec)->prio ||
            (c->prio == mem_ck(m, s, rec)->prio && c->order < mem_ck(m, s, rec)->order))
            rec = i;
    }
    return rec >= 0 && mem_ck(m, s, rec)->prio <= prio ? rec : -1;
}

keel_status keel_mem_ckpt_take_prio(keel_mem *m, int32_t s, int32_t prio)
{
    if (!m) return KEEL_EINVAL;
    m->err[0] = 0;
    if (s < 0 || s >= m->cfg.n_seq_max)
        return base_err(m->err, KEEL_EINVAL, "ckpt_take: unknown sequence id %d", s);
    if (m->n_ckpt == 0)
        return base_err(m->err, KEEL_EUNSUPPORTED,
                        "ckpt_take: no checkpoint storage (n_ckpt 0; checkpoints need recurrent or "
                        "sliding layers)");
    if (!mem_seq_holds(m, s)) return base_err(m->err, KEEL_ESTATE, "ckpt_take: sequence %d holds no tokens", s);
    int32_t k = m->n_rs_layers > 0 ? m->seq_slot[s] : -1;
    int32_t pos = mem_seq_hi(m, s) + 1;
    uint64_t last = mem_seq_last_stamp(m, s);
    if (prio < 0) return base_err(m->err, KEEL_EINVAL, "ckpt_take: priority %d is negative", prio);
    int32_t nw = ck_newest(m, s);
    if (nw >= 0 && mem_ck(m, s, nw)->pos == pos && mem_ck(m, s, nw)->stamp == last) {
        if (mem_ck(m, s, nw)->prio < prio) mem_ck(m, s, nw)->prio = prio;
        return KEEL_OK;
    }
    int32_t rec = ck_victim(m, s, prio);
    if (rec < 0) return KEEL_OK; /* every record outranks it: not kept */
    base_arena_reset(&m->scratch);
    int32_t max_cap = 1;
    for (int32_t g = 0; g < m->n_groups; g++) max_cap = BASE_MAX(max_cap, m->groups[g].tables[0].cap);
    int32_t *cand = base_arena_take_n(&m->scratch, (size_t)max_cap, sizeof(int32_t));
    if (!cand) return base_err(m->err, KEEL_ESCRATCH, "ckpt_take: scratch exhausted");
    uint8_t *data = mem_ck_data(m, s, rec);
    size_t bytes = m->rs_slot_floats * sizeof(float);
    if (k >= 0) memcpy(data, mem_rs_slot(m, k), bytes);
    for (int32_t g = 0; g < m->n_groups; g++) {
        const mem_ckpt_ring *rr = &m->ckpt_ring[g];
        mem_table *t = mem_table_of(m, g, s);
        if (!t->sliding) continue;
        mem_table_update_sinks(t, t->n_seq);
        /* what a query at pos needs: the sinks and the `window` newest
         * cells at positions > pos - window (docs/memory.md, rings) */
        int32_t n = 0, nsink = 0, forgot = t->evict_max[s];
        int32_t *out_pos = (int32_t *)(data + rr->pos_off);
        uint64_t *out_stamp = (uint64_t *)(data + rr->stamp_off);
        uint8_t *out_cf = data + rr->cflags_off;
        for (int32_t c = 0; c < t->cap; c++) {
            if (t->pos[c] < 0 || !mem_seq_has(t, c, s)) continue;
            if (mem_table_is_sink(t, c, s)) {
                out_pos[nsink] = t->pos[c];
                out_stamp[nsink] = t->stamp[c];
                out_cf[nsink] = t->cflags[c];
                cell_rows_out(t, c, data + rr->rows_off + (size_t)nsink * rr->cell_bytes);
                nsink++;
            } else if ((int64_t)t->pos[c] > (int64_t)pos - t->window) {
                cand[n++] = c;
            } else if (forgot == MEM_NO_EVICT || t->pos[c] > forgot) {
                forgot = t->pos[c];
            }
        }
        mem_heap_sort(cand, n, newer_stamp, t);
        for (int32_t j = t->window; j < n; j++)
            if (forgot == MEM_NO_EVICT || t->pos[cand[j]] > forgot) forgot = t->pos[cand[j]];
        n = BASE_MIN(n, t->window);
        for (int32_t j = 0; j < n; j++) {
            int32_t c = cand[j], o = nsink + j;
            out_pos[o] = t->pos[c];
            out_stamp[o] = t->stamp[c];
            out_cf[o] = t->cflags[c];
            cell_rows_out(t, c, data + rr->rows_off + (size_t)o * rr->cell_bytes);
        }
        int32_t hdr[2] = {nsink + n, forgot};
        memcpy(data + rr->off, hdr, sizeof hdr);
        bytes += (size_t)(nsink + n) * (rr->cell_bytes + sizeof(int32_t) + sizeof(uint64_t) + 1);
    }
    mem_ckpt *c = mem_ck(m, s, rec);
    c->pos = pos;
    c->pos_min = mem_seq_lo(m, s);
    c->stamp = last;
    c->order = ++m->ckpt_order;
    c->bytes = bytes;
    c->prio = prio;
    return KEEL_OK;
}

keel_status keel_mem_ckpt_set_prio(keel_mem *m, int32_t s, int32_t pos, int32_t prio)
{
    if (!m) return KEEL_EINVAL;
    m->err[0] = 0;
    if (s < 0 || s >= m->cfg.n_seq_max)
        return base_err(m->err, KEEL_EINVAL, "ckpt_set_prio: unknown sequence id %d", s);
    if (prio < 0) return base_err(m->err, KEEL_EINVAL, "ckpt_set_prio: priority %d is negative", prio);
    for (int32_t i = 0; i < m->n_ckpt; i++) {
        mem_ckpt *c = mem_ck(m, s, i);
        if (c->pos >= 0 && c->pos == pos) {
            c->prio = prio;
            return KEEL_OK;
        }
    }
    return base_err(m->err, KEEL_ENOENT, "ckpt_set_prio: sequence %d has no checkpoint at %d", s, pos);
}

void keel_mem_ckpt_list(const keel_mem *m, int32_t s, keel_mem_ckpt_info *out, int32_t cap,
                        int32_t *n)
{
    int32_t cnt = 0;
    if (m && s >= 0 && s < m->cfg.n_seq_max && m->n_ckpt > 0) {
        /* oldest first: repeatedly the smallest order above the last one */
        uint64_t last = 0;
        for (;;) {
            int32_t best = -1;
            for (int32_t i = 0; i < m->n_ckpt; i++) {
                const mem_ckpt *c = mem_ck(m, s, i);
                if (c->pos >= 0 && c->order > last &&
                    (best < 0 || c->order < mem_ck(m, s, best)->order))
                    best = i;
            }
            if (best < 0) break;
            const mem_ckpt *c = mem_ck(m, s, best);
            if (out && cnt < cap) {
                out[cnt].pos = c->pos;
                out[cnt].pos_min = c->pos_min;
                out[cnt].bytes = c->bytes;
                out[cnt].priority = c->prio;
            }
            cnt++;
            last = c->order;
        }
    }
    if (n) *n = cnt;
}

int32_t keel_mem_ckpt_find(const keel_mem *m, int32_t s, int32_t p0)
{
    if (!m || s < 0 || s >= m->cfg.n_seq_max) return -1;
    if (p0 < 0) p0 = 0;
    if (!mem_seq_holds(m, s)) return p0;
    if (m->n_rs_layers == 0) { /* attention truncates exactly down to the rewind bound */
        if (p0 >= keel_mem_seq_rewind_min(m, s)) return p0;
        int32_t j = ck_at_or_before(m, s, p0);
        return j < 0 ? -1 : mem_ck(m, s, j)->pos;
    }
    if (p0 > rs_hi(m, s) || p0 <= rs_lo(m, s)) return p0;
    int32_t i = ck_at_or_before(m, s, p0);
    return i < 0 ? -1 : mem_ck(m, s, i)->pos;
}

size_t keel_mem_ckpt_record_bytes(const keel_mem *m)
{
    return m && m->n_ckpt > 0 ? m->ckpt_rec_bytes : 0;
}

size_t keel_mem_rs_bytes(const keel_mem *m)
{
    return m ? m->rs_slot_floats * sizeof(float) * (size_t)m->n_rs_slots : 0;
}

size_t keel_mem_ckpt_bytes(const keel_mem *m)
{
    return m ? m->ckpt_rec_bytes * (size_t)m->n_ckpt * (size_t)m->cfg.n_seq_max : 0;
}

/* ---- speculation snapshots ------------------------------------------------- */

keel_status keel_mem_spec_save(keel_mem *m, int32_t s)
{
    if (!m) return KEEL_EINVAL;
    m->err[0] = 0;
    if (s < 0 || s >= m->cfg.n_seq_max)
        return base_err(m->err, KEEL_EINVAL, "spec_save: unknown sequence id %d", s);
    if (!m->spec_pos)
        return base_err(m->err, KEEL_EUNSUPPORTED,
                        "spec_save: no snapshot storage (the memory has no recurrent layers, or "
                        "spec_snapshot is off)");
    if (m->seq_slot[s] < 0) return base_err(m->err, KEEL_ESTATE, "spec_save: sequence %d holds no tokens", s);
    memcpy(m->spec_data + (size_t)s * m->rs_slot_floats, mem_rs_slot(m, m->seq_slot[s]),
           m->rs_slot_floats * sizeof(float));
    m->spec_pos[s] = rs_hi(m, s) + 1;
    m->spec_lo[s] = rs_lo(m, s);
    m->spec_stamp[s] = m->rs_stamp[s];
    return KEEL_OK;
}

int32_t keel_mem_spec_pos(const keel_mem *m, int32_t s)
{
    if (!m || !m->spec_pos || s < 0 || s >= m->cfg.n_seq_max) return -1;
    return m->spec_pos[s];
}

keel_status keel_mem_spec_restore(keel_mem *m, int32_t s, int32_t *pos)
{
    if (pos) *pos = -1;
    if (!m) return KEEL_EINVAL;
    m->err[0] = 0;
    if (s < 0 || s >= m->cfg.n_seq_max)
        return base_err(m->err, KEEL_EINVAL, "spec_restore: unknown sequence id %d", s);
    int32_t p = m->spec_pos ? m->spec_pos[s] : -1;
    /* the sequence must still be the snapshot's plus tokens placed after it */
    if (p < 0 || m->seq_slot[s] < 0 || rs_lo(m, s) != m->spec_lo[s] || rs_hi(m, s) < p - 1)
        return base_err(m->err, KEEL_ESTATE, "spec_restore: sequence %d has no snapshot to restore: nothing changed",
                        s);
    /* the rings: removing positions >= p is exact only if no placement
     * since forgot what a query at p needs */
    for (int32_t g = 0; g < m->n_groups; g++) {
        const mem_table *t = mem_table_of(m, g, s);
        if (t->sliding && t->evict_max[s] != MEM_NO_EVICT && (int64_t)t->evict_max[s] + t->window > p)
            return base_err(m->err, KEEL_ESTATE,
                            "spec_restore: sequence %d: sliding group %d forgot position %d, which a "
                            "query at %d needs (placements after the snapshot went past the window): "
                            "nothing changed",
                            s, g, t->evict_max[s], p);
    }
    int32_t k = m->seq_slot[s];
    if (m->rs_refs[k] > 1 && mem_rs_free_slots(m) < 1)
        return base_err(m->err, KEEL_EFULL,
                        "spec_restore: sequence %d shares its state and none of %d slots is free", s,
                        m->n_rs_slots);
    /* commit */
    mem_attn_rm(m, s, p, INT32_MAX);
    if (m->rs_refs[k] > 1) {
        m->rs_refs[k]--;
        k = mem_rs_take_slot(m);
        m->rs_refs[k] = 1;
        m->seq_slot[s] = k;
    }
    memcpy(mem_rs_slot(m, k), m->spec_data + (size_t)s * m->rs_slot_floats, m->rs_slot_floats * sizeof(float));
    m->rs_pos_max[s] = p - 1;
    m->rs_stamp[s] = m->spec_stamp[s];
    mem_ck_drop(m, s, p - 1); /* checkpoints taken inside the rejected tail, and the snapshot */
    if (pos) *pos = p;
    return KEEL_OK;
}

/* ---- seq_rm ---------------------------------------------------------------- */

/* Room in s's ring tables for checkpoint record rec once s's own cells are
 * gone (a ring clipped to n_ctx may lack it). */
static keel_status ring_room(keel_mem *m, int32_t s, int32_t rec)
{
    const uint8_t *data = mem_ck_data(m, s, rec);
    for (int32_t g = 0; g < m->n_groups; g++) {
        mem_table *t = mem_table_of(m, g, s);
        if (!t->sliding) continue;
        int32_t hdr[2];
        memcpy(hdr, data + m->ckpt_ring[g].off, sizeof hdr);
        int32_t avail = t->cap - t->n_used;
        for (int32_t c = 0; c < t->cap; c++)
            if (t->pos[c] >= 0 && mem_seq_has(t, c, s) && mem_seq_count(t, c) == 1) avail++;
        if (avail < hdr[0])
            return base_err(m->err, KEEL_EFULL,
                            "restoring the checkpoint of sequence %d needs %d cells in "
                            "sliding group %d, %d free",
                            s, hdr[0], g, avail);
    }
    return KEEL_OK;
}

/* Restores record rec of s: attention truncated to positions < its pos,
 * the rings' cells of s replaced by the saved ones, the state copied in. */
static void restore(keel_mem *m, int32_t s, int32_t rec)
{
    const mem_ckpt *ck = mem_ck(m, s, rec);
    const uint8_t *data = mem_ck_data(m, s, rec);
    mem_attn_rm(m, s, ck->pos, INT32_MAX);
    for (int32_t g = 0; g < m->n_groups; g++) {
        mem_table *t = mem_table_of(m, g, s);
        if (!t->sliding) continue;
        const mem_ckpt_ring *rr = &m->ckpt_ring[g];
        for (int32_t c = 0; c < t->cap; c++) {
            if (t->pos[c] < 0 || !mem_seq_has(t, c, s)) continue;
            mem_seq_unset(t, c, s);
            if (mem_seq_empty(t, c)) mem_table_free_cell(t, c);
        }
        int32_t hdr[2];
        memcpy(hdr, data + rr->off, sizeof hdr);
        const int32_t *pos = (const int32_t *)(data + rr->pos_off);
        const uint64_t *stamp = (const uint64_t *)(data + rr->stamp_off);
        const uint8_t *cf = data + rr->cflags_off;
        for (int32_t j = 0; j < hdr[0]; j++) {
            int32_t d = mem_table_find_free(t); /* room validated */
            t->pos[d] = pos[j];
            mem_table_mark_used(t, d);
            t->stamp[d] = stamp[j];
            t->cflags[d] = cf[j];
            mem_seq_set(t, d, s);
            cell_rows_in(t, d, data + rr->rows_off + (size_t)j * rr->cell_bytes);
            if (d > m->max_cell_touched) m->max_cell_touched = d;
        }
        t->evict_max[s] = hdr[1];
        mem_table_refresh(t);
    }
    int32_t pos = ck->pos;
    if (m->n_rs_layers > 0) {
        int32_t k = m->seq_slot[s];
        if (m->rs_refs[k] > 1) {
            m->rs_refs[k]--;
            k = mem_rs_take_slot(m); /* validated */
            m->rs_refs[k] = 1;
            m->seq_slot[s] = k;
        }
        memcpy(mem_rs_slot(m, k), data, m->rs_slot_floats * sizeof(float));
        m->rs_pos_max[s] = pos - 1;
        m->rs_stamp[s] = ck->stamp;
    }
    mem_ck_drop(m, s, pos);
}

/* Validates restoring record rec of s: a state slot of its own when s
 * shares one, room in the rings. */
static keel_status restore_check(keel_mem *m, int32_t s, int32_t rec)
{
    if (m->n_rs_layers > 0 && m->rs_refs[m->seq_slot[s]] > 1 && mem_rs_free_slots(m) < 1)
        return base_err(m->err, KEEL_EFULL,
                        "restoring sequence %d's checkpoint needs a free recurrent state slot (it "
                        "shares its state), none of %d is free",
                        s, m->n_rs_slots);
    return ring_room(m, s, rec);
}

keel_status keel_mem_ckpt_restore(keel_mem *m, int32_t s, int32_t p0, int32_t *pos)
{
    if (pos) *pos = -1;
    if (!m) return KEEL_EINVAL;
    m->err[0] = 0;
    if (s < 0 || s >= m->cfg.n_seq_max)
        return base_err(m->err, KEEL_EINVAL, "ckpt_restore: unknown sequence id %d", s);
    if (p0 < 0) p0 = 0;
    int32_t rec = mem_seq_holds(m, s) ? ck_at_or_before(m, s, p0) : -1;
    if (rec < 0)
        return base_err(m->err, KEEL_ESTATE,
                        "ckpt_restore: sequence %d has no checkpoint at or before %d: nothing changed", s, p0);
    keel_status st = restore_check(m, s, rec);
    if (st != KEEL_OK) return st;
    if (pos) *pos = mem_ck(m, s, rec)->pos;
    restore(m, s, rec);
    return KEEL_OK;
}

keel_status mem_rs_seq_rm(keel_mem *m, int32_t s, int32_t p0, int32_t p1)
{
    int32_t q0 = s < 0 ? 0 : s, q1 = s < 0 ? m->cfg.n_seq_max : s + 1;
    int32_t restore_rec = -1;
    /* validate: per sequence nothing, everything, or a rewind to a checkpoint */
    for (int32_t q = q0; q < q1; q++) {
        if (m->seq_slot[q] < 0) continue;
        int32_t lo = rs_lo(m, q), hi = rs_hi(m, q);
        if (p1 <= lo || p0 > hi) continue;
        if (p0 <= lo && p1 > hi) continue;
        if (p1 <= hi)
            return base_err(m->err, KEEL_ESTATE,
                            "seq_rm: sequence %d: removing [%d, %d) would leave tokens after the "
                            "cut (positions %d..%d); a recurrent state cannot drop tokens from "
                            "its start or middle: nothing changed",
                            q, p0, p1 == INT32_MAX ? -1 : p1, lo, hi);
        if (s < 0)
            return base_err(m->err, KEEL_ESTATE,
                            "seq_rm: truncating every sequence at %d would rewind sequence %d's "
                            "recurrent state: rewind one sequence at a time",
                            p0, q);
        int32_t rec = ck_at_or_before(m, q, p0);
        if (rec < 0) {
            int32_t nearest = -1;
            for (int32_t i = 0; i < m->n_ckpt; i++) {
                const mem_ckpt *c = mem_ck(m, q, i);
                if (c->pos >= 0 && (nearest < 0 || c->pos < nearest)) nearest = c->pos;
            }
            if (nearest >= 0)
                return base_err(m->err, KEEL_ESTATE,
                                "seq_rm: sequence %d: truncating at %d needs a checkpoint at or "
                                "before %d; the nearest is at %d (recompute from scratch or "
                                "from there): nothing changed",
                                q, p0, p0, nearest);
            return base_err(m->err, KEEL_ESTATE,
                            "seq_rm: sequence %d: truncating at %d needs a checkpoint at or "
                            "before %d; the sequence has none (its state is valid only at "
                            "%d): nothing changed",
                            q, p0, p0, hi);
        }
        keel_status st = restore_check(m, q, rec);
        if (st != KEEL_OK) return st;
        restore_rec = rec;
    }
    /* commit */
    if (restore_rec >= 0) {
        restore(m, s, restore_rec);
        return KEEL_OK;
    }
    uint8_t drop[MEM_SEQ_MAX];
    for (int32_t q = q0; q < q1; q++)
        drop[q] = m->seq_slot[q] >= 0 && p0 <= rs_lo(m, q) && p1 > rs_hi(m, q);
    mem_attn_rm(m, s, p0, p1);
    for (int32_t q = q0; q < q1; q++)
        if (drop[q]) mem_rs_drop_seq(m, q);
    return KEEL_OK;
}

/* ---- seq_cp / seq_keep ------------------------------------------------------ */

keel_status mem_rs_seq_cp_check(keel_mem *m, int32_t src, int32_t dst, int32_t p0, int32_t p1)
{
    if (m->seq_slot[src] < 0) return KEEL_OK;
    int32_t lo = rs_lo(m, src), hi = rs_hi(m, src);
    if (p0 > lo || p1 <= hi)
        return base_err(m->err, KEEL_ESTATE,
                        "seq_cp: copying [%d, %d) of sequence %d (positions %d..%d) would split "
                        "its recurrent state, valid only at %d: copy the whole sequence",
                        p0, p1 == INT32_MAX ? -1 : p1, src, lo, hi, hi);
    if (m->seq_slot[dst] >= 0)
        return base_err(m->err, KEEL_ESTATE,
                        "seq_cp: destination sequence %d holds tokens (%d..%d); a recurrent "
                        "state cannot merge two histories: seq_rm it first",
                        dst, rs_lo(m, dst), rs_hi(m, dst));
    return KEEL_OK;
}

void mem_rs_seq_cp_commit(keel_mem *m, int32_t src, int32_t dst)
{
    int32_t k = m->seq_slot[src];
    if (k < 0) return;
    m->seq_slot[dst] = k;
    m->rs_refs[k]++;
    if (m->spec_pos) m->spec_pos[dst] = -1;
    m->rs_pos_min[dst] = m->rs_pos_min[src];
    m->rs_pos_max[dst] = m->rs_pos_max[src];
    m->rs_stamp[dst] = m->rs_stamp[src];
}

void mem_rs_seq_keep(keel_mem *m, int32_t s)
{
    for (int32_t q = 0; q < m->cfg.n_seq_max; q++)
        if (q != s) mem_rs_drop_seq(m, q);
}

/* ---- position edits ---------------------------------------------------------- */

static inline int64_t edited64(int32_t p, int32_t delta, int32_t div)
{
    return div > 0 ? (int64_t)p / div : (int64_t)p + delta;
}

keel_status mem_rs_edit_check(keel_mem *m, const char *what, int32_t s, int32_t p0, int32_t p1,
                              int32_t delta, int32_t div, int32_t *floor)
{
    *floor = p0;
    if (m->seq_slot[s] < 0) return KEEL_OK;
    int32_t lo = rs_lo(m, s), hi = rs_hi(m, s);
    int64_t hi2 = hi >= p0 && hi < p1 ? edited64(hi, delta, div) : hi;
    int64_t lo2 = lo >= p0 && lo < p1 ? edited64(lo, delta, div) : lo;
    if (hi2 < 0 || lo2 < 0 || hi2 >= INT32_MAX || lo2 >= INT32_MAX)
        return base_err(m->err, KEEL_ERANGE, "%s: sequence %d's positions %d..%d would leave [0, "
                        "INT32_MAX)", what, s, lo, hi);
    /* without attention layers a sequence's positions are only its span:
     * an edit moves all of it or none */
    if (m->n_groups == 0 && !(p1 <= lo || p0 > hi) && !(p0 <= lo && p1 > hi))
        return base_err(m->err, KEEL_ESTATE,
                        "%s: sequence %d (positions %d..%d) has only recurrent layers: an edit "
                        "moves all of its positions or none, not [%d, %d): nothing changed",
                        what, s, lo, hi, p0, p1 == INT32_MAX ? -1 : p1);
    /* the last token must stay last: the next batch continues the state at
     * the sequence's largest position + 1 */
    int64_t other = lo2, low = lo >= p0 && lo < p1 ? lo2 : INT64_MAX;
    for (int32_t g = 0; g < m->n_groups; g++) {
        const mem_table *t = mem_table_of(m, g, s);
        for (int32_t c = 0; c < t->cap; c++) {
            if (t->pos[c] < 0 || !mem_seq_has(t, c, s)) continue;
            bool moves = t->pos[c] >= p0 && t->pos[c] < p1;
            int64_t np = moves ? edited64(t->pos[c], delta, div) : t->pos[c];
            if (moves && np < low) low = np;
            if (t->stamp[c] != m->rs_stamp[s] && np > other) other = np;
        }
    }
    /* checkpoints at or below every moved token's new position keep
     * describing the sequence; the others are dropped at commit */
    if (low < *floor) *floor = (int32_t)BASE_MAX(low, 0);
    if (other > hi2)
        return base_err(m->err, KEEL_ESTATE,
                        "%s: sequence %d: the edit would move its last token (position %d -> "
                        "%lld) below another of its tokens (-> %lld); a recurrent state "
                        "continues only after its last token: nothing changed",
                        what, s, hi, (long long)hi2, (long long)other);
    return KEEL_OK;
}

void mem_rs_edit_commit(keel_mem *m, int32_t s, int32_t p0, int32_t p1, int32_t delta,
                        int32_t div, int32_t floor)
{
    if (m->seq_slot[s] < 0) return;
    int32_t lo = m->rs_pos_min[s], hi = m->rs_pos_max[s];
    if (m->n_groups > 0) {
        int64_t lo2 = lo >= p0 && lo < p1 ? edited64(lo, delta, div) : lo;
        m->rs_pos_min[s] = (int32_t)BASE_MIN(lo2, (int64_t)mem_tables_pos_min(m, s));
        m->rs_pos_max[s] = mem_tables_pos_max(m, s);
    } else {
        if (lo >= p0 && lo < p1) m->rs_pos_min[s] = (int32_t)edited64(lo, delta, div);
        if (hi >= p0 && hi < p1) m->rs_pos_max[s] = (int32_t)edited64(hi, delta, div);
    }
    /* checkpoints covering edited positions, or positions moved tokens
     * now take, no longer describe the sequence */
    mem_ck_drop(m, s, floor);
}

void mem_rs_after_compact(keel_mem *m, int32_t s)
{
    mem_ck_drop(m, s, -1);
    if (m->n_rs_layers == 0 || m->seq_slot[s] < 0) return;
    /* renumbering moves the kept tokens to 0..; keeping positions leaves
     * the first one where it was */
    m->rs_pos_min[s] = BASE_MIN(m->rs_pos_min[s], mem_tables_pos_min(m, s));
    m->rs_pos_max[s] = mem_tables_pos_max(m, s);
    mem_ck_drop(m, s, -1);
}

/* ---- invariants and digest -------------------------------------------------------- */

#define FAIL(...) return base_err(m->err, KEEL_EINTERNAL, __VA_ARGS__)

static bool all_finite(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return false;
    return true;
}

keel_status mem_rs_check(keel_mem *m, float *x)
{
    if (m->n_rs_layers == 0 && m->n_ckpt == 0) return KEEL_OK;
    int32_t ns = m->cfg.n_seq_max;
    for (int32_t k = 0; k < m->n_rs_slots; k++) {
        int32_t cnt = 0;
        for (int32_t s = 0; s < ns; s++) cnt += m->seq_slot[s] == k;
        if (cnt != m->rs_refs[k])
            FAIL("recurrent slot %d: %d references recorded, %d sequences use it", k, m->rs_refs[k], cnt);
        if (cnt > 0 && !all_finite(mem_rs_slot(m, k), m->rs_slot_floats))
            FAIL("recurrent slot %d: non-finite state", k);
    }
    int32_t gf = -1;
    for (int32_t g = 0; g < m->n_groups && gf < 0; g++)
        if (m->groups[g].kind == KEEL_MEM_LAYER_FULL) gf = g;
    for (int32_t s = 0; s < ns; s++) {
        bool rs = m->n_rs_layers > 0;
        int32_t k = rs ? m->seq_slot[s] : (mem_seq_holds(m, s) ? 0 : -1), lo = mem_seq_lo(m, s), hi = mem_seq_hi(m, s);
        if (rs && (k < -1 || k >= m->n_rs_slots)) FAIL("seq %d: slot %d out of range", s, k);
        int32_t th = m->n_groups > 0 ? mem_tables_pos_max(m, s) : hi;
        if (rs && (k >= 0) != (th >= 0))
            FAIL("seq %d: %s a recurrent state but %s tokens", s, k >= 0 ? "has" : "lacks",
                 th >= 0 ? "holds" : "no");
        if (k >= 0 && (lo < 0 || hi < lo)) FAIL("seq %d: span %d..%d", s, lo, hi);
        if (k < 0 && (lo != -1 || hi != -1)) FAIL("seq %d: span %d..%d without tokens", s, lo, hi);
        if (rs && k >= 0 && m->n_groups > 0) {
            int32_t tmin = mem_tables_pos_min(m, s), tmax = mem_tables_pos_max(m, s);
            if (tmax != hi || tmin < lo)
                FAIL("seq %d: recurrent span %d..%d, attention tables %d..%d (the last token must "
                     "agree)", s, lo, hi, tmin, tmax);
        }
        for (int32_t i = 0; i < m->n_ckpt; i++) {
            const mem_ckpt *c = mem_ck(m, s, i);
            if (c->pos < 0) continue;
            if (k < 0) FAIL("seq %d: checkpoint at %d of an empty sequence", s, c->pos);
            /* (an attention memory's rings forget: its span start is not the
             * one recorded, and without a full table, which keeps every
             * token, its end may fall below pos - 1 after a removal) */
            if (c->pos < 1 || ((rs || gf >= 0) && c->pos > hi + 1) || (rs && (c->pos <= lo || c->pos_min != lo)))
                FAIL("seq %d: checkpoint at %d (from %d) outside the sequence %d..%d", s, c->pos,
                     c->pos_min, lo, hi);
            if (c->order == 0 || c->order > m->ckpt_order || c->bytes > m->ckpt_rec_bytes)
                FAIL("seq %d: checkpoint at %d: order %llu bytes %zu", s, c->pos,
                     (unsigned long long)c->order, c->bytes);
            for (int32_t j = 0; j < m->n_ckpt; j++)
                if (j != i && mem_ck(m, s, j)->pos >= 0 && mem_ck(m, s, j)->order == c->order)
                    FAIL("seq %d: two checkpoints of one take order", s);
            const uint8_t *data = mem_ck_data(m, s, i);
            if (!all_finite((const float *)data, m->rs_slot_floats))
                FAIL("seq %d: checkpoint at %d: non-finite state", s, c->pos);
            /* its last token is still there (an attention memory's compaction
             * may drop it from the full table: rings keep it) */
            if (gf >= 0 && (rs || m->exact_from[s] == 0)) {
                const mem_table *t = mem_table_of(m, gf, s);
                bool found = false;
                for (int32_t cc = 0; cc < t->cap && !found; cc++)
                    found = t->pos[cc] == c->pos - 1 && t->stamp[cc] == c->stamp && mem_seq_has(t, cc, s);
                if (!found)
                    FAIL("seq %d: checkpoint at %d: its last token (stamp %llu) is not at %d", s,
                         c->pos, (unsigned long long)c->stamp, c->pos - 1);
            }
            for (int32_t g = 0; g < m->n_groups; g++) {
                const mem_ckpt_ring *rr = &m->ckpt_ring[g];
                if (!m->groups[g].tables[0].sliding) continue;
                int32_t hdr[2];
                memcpy(hdr, data + rr->off, sizeof hdr);
                if (hdr[0] < 0 || hdr[0] > rr->max)
                    FAIL("seq %d: checkpoint at %d: %d ring cells in group %d (max %d)", s, c->pos,
                         hdr[0], g, rr->max);
                const mem_table *t = mem_table_of(m, g, s);
                for (int32_t j = 0; j < hdr[0]; j++) {
                    int32_t p;
                    memcpy(&p, data + rr->pos_off + (size_t)j * sizeof(int32_t), sizeof p);
                    if (p < 0 || p >= c->pos)
                        FAIL("seq %d: checkpoint at %d: ring cell at position %d", s, c->pos, p);
                    const uint8_t *row = data + rr->rows_off + (size_t)j * rr->cell_bytes;
                    for (int32_t ci = 0; ci < t->n_cols; ci++) {
                        const mem_col *col = &t->cols[ci];
                        for (int32_t h = 0; h < col->n_heads; h++, row += col->head_row_bytes) {
                            tensor_dequantize_row_unchecked(col->dtype, row, x, col->head_dim);
                            if (!all_finite(x, (size_t)col->head_dim))
                                FAIL("seq %d: checkpoint at %d: non-finite ring row", s, c->pos);
                        }
                    }
                }
            }
        }
    }
    return KEEL_OK;
}

uint64_t mem_rs_digest(const keel_mem *m, uint64_t h)
{
    size_t ns = (size_t)m->cfg.n_seq_max;
    h = base_hash64(m->rs_refs, (size_t)m->n_rs_slots * sizeof(int32_t), h);
    h = base_hash64(m->seq_slot, ns * sizeof(int32_t), h);
    h = base_hash64(m->rs_pos_min, ns * sizeof(int32_t), h);
    h = base_hash64(m->rs_pos_max, ns * sizeof(int32_t), h);
    h = base_hash64(m->rs_stamp, ns * sizeof(uint64_t), h);
    for (int32_t k = 0; k < m->n_rs_slots; k++)
        if (m->rs_refs[k] > 0) h = base_hash64(mem_rs_slot(m, k), m->rs_slot_floats * sizeof(float), h);
    h = base_hash64(m->ckpts, ns * (size_t)m->n_ckpt * sizeof(mem_ckpt), h);
    for (size_t s = 0; s < ns; s++)
        for (int32_t i = 0; i < m->n_ckpt; i++)
            if (mem_ck(m, (int32_t)s, i)->pos >= 0)
                h = base_hash64(mem_ck_data(m, (int32_t)s, i), m->ckpt_rec_bytes, h);
    h = base_hash64(&m->ckpt_order, sizeof m->ckpt_order, h);
    return h;
}
