/*
 * memref.c — the memory core's differential driver (see memref.h): the
 * operations it applies to both sides and the invariant checks after each.
 * The reference itself is in memref_model.c, the session, refusal and
 * attention checks in memref_check.c, what they share in memref_int.h.
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
#include "memref_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- the driver ----------------------------------------------------------- */

void mr_note(driver *d, const char *fmt, ...)
{
    if (!d->log) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(d->log, "step %lld: ", (long long)d->step);
    vfprintf(d->log, fmt, ap);
    fputc('\n', d->log);
    va_end(ap);
}


/* Recomputes every sequence's recurrent state from its history and
 * compares it bitwise with the memory's. */
static void check_states(driver *d, const char *after)
{
    const ref *r = &d->r;
    const keel_mem *m = d->mem;
    for (int32_t s = 0; s < r->rc.mc.n_seq_max; s++) {
        int32_t k = m->seq_slot[s];
        int32_t want_min = r->n_groups > 0 ? mr_ref_lists_min(r, s) : r->hist[s].n ? r->rs_lo[s] : -1;
        if ((k >= 0) != (r->hist[s].n > 0) || keel_mem_seq_pos_max(m, s) != mr_ref_pos_max(r, s) ||
            keel_mem_seq_pos_min(m, s) != want_min || m->rs_pos_min[s] != r->rs_lo[s] ||
            m->rs_pos_max[s] != r->rs_hi[s]) {
            d->res->invariant_failures++;
            mr_note(d, "after %s: seq %d: memory slot %d span %d..%d, reference %d tokens span %d..%d",
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
            for (int32_t i = 0; i < r->hist[s].n; i++) mr_rs_update(&L->rs, l, r->hist[s].st[i], conv, st);
            const float *base = m->rs_data + (size_t)k * m->rs_slot_floats;
            if (memcmp(conv, base + m->rs_conv_off[ri], nc * sizeof(float)) != 0 ||
                memcmp(st, base + m->rs_state_off[ri], (size_t)L->rs.state_floats * sizeof(float)) != 0) {
                d->res->divergences++;
                mr_note(d, "after %s: seq %d layer %d: recurrent state differs from the recomputation "
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
                mr_note(d, "after %s: seq %d rewind_min %d (reference %d), %d checkpoints (reference %d)",
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
            mr_note(d, "after %s: seq %d has %d checkpoints (first at %d), the reference %d (first at %d)", after, s, n,
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
            mr_note(d, "after %s: seq %d rewind_min %d below the reference's exact bound %lld", after,
                 s, got, (long long)bound);
        }
    }
    keel_status st = keel_mem_check(d->mem);
    if (st != KEEL_OK) {
        d->res->invariant_failures++;
        mr_note(d, "invariant failure after %s: %s", after, keel_mem_last_error(d->mem));
    }
    keel_mem_stats ms;
    keel_mem_stats_get(d->mem, &ms);
    if (ms.cells_used > ms.cells_cap) {
        d->res->invariant_failures++;
        mr_note(d, "cells_used %lld > cap %lld", (long long)ms.cells_used, (long long)ms.cells_cap);
    }
}

/* A refused operation must leave the memory byte-identical. */
void mr_refused(driver *d, uint64_t before, keel_status st, const char *what)
{
    d->res->refused++;
    if (keel_mem_digest(d->mem) != before) {
        d->res->invariant_failures++;
        mr_note(d, "%s refused with %s but changed the memory", what, keel_status_name(st));
    }
}

void mr_expect_status(driver *d, keel_status got, keel_status want, const char *what)
{
    if (got != want) {
        d->res->invariant_failures++;
        mr_note(d, "%s returned %s, want %s (%s)", what, keel_status_name(got), keel_status_name(want),
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
                mr_ref_rope(L, t->k + d->r.k_off[l] + (size_t)h * (size_t)L->head_dim_k, pos[i], d->dk);
                for (int32_t j = 0; j < L->head_dim_k; j++)
                    d->kbuf[(size_t)i * kn + (size_t)h * (size_t)L->head_dim_k + (size_t)j] = (float)d->dk[j];
            }
            memcpy(d->vbuf + (size_t)i * vn, t->v + d->r.v_off[l], vn * sizeof(float));
            if (L->idx_head_dim > 0) {
                mr_ref_rope_row(&L->idx_rope, L->idx_head_dim, t->ik + d->r.ik_off[l], pos[i], d->dk);
                for (int32_t j = 0; j < L->idx_head_dim; j++)
                    d->ibuf[(size_t)i * (size_t)L->idx_head_dim + (size_t)j] = (float)d->dk[j];
            }
        }
        keel_status st = keel_mem_write_kvi(d->mem, l, n, d->cells + (size_t)g * (size_t)n, d->kbuf, d->vbuf,
                                            L->idx_head_dim > 0 ? d->ibuf : NULL);
        mr_expect_status(d, st, KEEL_OK, "write");
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
            mr_ref_rs_drop(r, q);
        else
            mr_ref_ck_drop(r, q, -1);
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
    return need > r->n_slots - mr_ref_slots_used(r);
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
    int32_t n = 1 + (int32_t)mr_pick(&d->ch, (uint32_t)mc->n_batch_max);
    int32_t pos[REF_MAX_BATCH], seq[REF_MAX_BATCH], nseq[REF_MAX_BATCH], toks[REF_MAX_BATCH];
    int32_t sets[REF_MAX_BATCH][REF_MAX_SEQ];
    const int32_t *setp[REF_MAX_BATCH];
    int32_t next[REF_MAX_SEQ];
    /* recurrent histories stay short (the recomputation checks them all) */
    for (int32_t s = 0; r->rs && s < mc->n_seq_max; s++)
        if (r->hist[s].n > 160) {
            mr_expect_status(d, keel_mem_seq_rm(d->mem, s, -1, -1), KEEL_OK, "seq_rm (long history)");
            ref_rm_all(r, s);
        }
    for (int32_t s = 0; s < mc->n_seq_max; s++) {
        int32_t pm = mr_ref_pos_max(r, s);
        next[s] = pm >= 0 ? pm + 1 : (int32_t)mr_pick(&d->ch, 5);
    }
    /* shared tokens: sequences with the same next position (unified only;
     * recurrent states are per sequence) */
    bool multi = mc->unified && mc->n_seq_max > 1 && !r->rs && mr_chance(&d->ch, 25) && d->only_seq < 0;
    for (int32_t i = 0; i < n; i++) {
        int32_t s = (int32_t)mr_pick(&d->ch, (uint32_t)mc->n_seq_max);
        if (mr_chance(&d->ch, 60) && i > 0) s = seq[i - 1];
        if (d->only_seq >= 0) s = d->only_seq;
        seq[i] = s;
        pos[i] = next[s];
        nseq[i] = 1;
        sets[i][0] = s;
        if (multi) {
            for (int32_t t = 0; t < mc->n_seq_max; t++)
                if (t != s && next[t] == next[s] && mr_chance(&d->ch, 50)) sets[i][nseq[i]++] = t;
        }
        for (int32_t j = 0; j < nseq[i]; j++) next[sets[i][j]]++;
        setp[i] = sets[i];
    }
    uint8_t prot[REF_MAX_BATCH];
    for (int32_t i = 0; i < n; i++) prot[i] = mr_chance(&d->ch, 10);
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
        if (st != KEEL_EFULL) mr_expect_status(d, st, KEEL_EFULL, "place");
        else if (!place_full_ok(d, n, seq, multi) && !rs_slots_short(r, n, seq)) {
            d->res->invariant_failures++;
            mr_note(d, "place refused with KEEL_EFULL although only rings lacked room (%s)",
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
        mr_refused(d, before, st, "place");
        /* make room: drop a random sequence */
        int32_t victim = (int32_t)mr_pick(&d->ch, (uint32_t)mc->n_seq_max);
        keel_status st2 = keel_mem_seq_rm(d->mem, victim, -1, -1);
        mr_expect_status(d, st2, KEEL_OK, "seq_rm (room)");
        if (st2 == KEEL_OK) ref_rm_all(r, victim);
        return;
    }
    if (r->rs && rs_slots_short(r, n, seq)) {
        d->res->invariant_failures++;
        mr_note(d, "place succeeded although the recurrent state slots were short");
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
            mr_sink_threshold(r, l, r->groups[g].n_sink, &tp, &tsm);
            uint64_t *stv = malloc((size_t)l->n * sizeof(uint64_t));
            uint8_t *sk = malloc((size_t)l->n);
            if (!stv || !sk) abort();
            int32_t ns = 0;
            for (int32_t i = 0; i < l->n; i++) {
                ref_entry e = l->e[i];
                sk[i] = tp >= 0 && !mr_key_less(tp, tsm, e.pos, r->toks[e.tok].stamp);
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
                    mr_plist_push(&r->forg[s][g], e.pos);
                    mr_tok_unref(r, e.tok);
                }
            }
            l->n = w;
            free(stv);
            free(sk);
        }
    }
    for (int32_t i = 0; i < n; i++) {
        toks[i] = mr_tok_new(r);
        int64_t inst = r->next_inst;
        r->next_inst += r->n_groups;
        for (int32_t j = 0; j < nseq[i]; j++)
            for (int32_t g = 0; g < r->n_groups; g++) {
                ref_entry e = {toks[i], pos[i], 0, inst + g};
                mr_list_push(&r->lists[sets[i][j]][g], e);
                r->toks[toks[i]].refs++;
            }
        if (r->toks[toks[i]].refs == 0) { /* no groups: keep bookkeeping simple */
            r->toks[toks[i]].refs = 1;
            mr_tok_unref(r, toks[i]);
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
                if (r->hist[s].n == 0 || mr_ref_shared(r, s)) r->rs_id[s] = r->next_rs_id++;
            }
            uint64_t stp = r->toks[toks[i]].stamp;
            mr_hist_push(&r->hist[s], stp);
            r->rs_hi[s] = pos[i];
            r->rs_last[s] = stp;
            for (int32_t l = 0; l < mc->n_layers; l++) {
                const keel_mem_layer *L = &r->rc.layers[l];
                if (L->kind != KEEL_MEM_LAYER_RECURRENT) continue;
                float *conv = NULL, *state = NULL;
                keel_status st3 = keel_mem_rs_state(d->mem, l, s, &conv, &state);
                mr_expect_status(d, st3, KEEL_OK, "rs_state");
                if (st3 != KEEL_OK) continue;
                float dummy[1] = {0};
                mr_rs_update(&L->rs, l, stp, conv ? conv : dummy, state);
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
                    mr_tok_unref(r, l->e[i].tok);
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
        if (mr_ref_lists_max(r, q) < 0) { /* emptied: starts over */
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
        for (int32_t j = 0; j < l->n; j++) mr_tok_unref(r, l->e[j].tok);
        l->n = 0;
        for (int32_t j = 0; j < c->ring[g].n; j++) {
            ref_entry e = c->ring[g].e[j];
            e.inst = r->next_inst++;
            mr_list_push(l, e);
            r->toks[e.tok].refs++;
        }
        r->forg[s][g].n = 0;
        for (int32_t j = 0; j < c->forg[g].n; j++) mr_plist_push(&r->forg[s][g], c->forg[g].p[j]);
    }
    r->hist[s].n = c->hist_n;
    r->rs_hi[s] = c->pos - 1;
    r->rs_last[s] = c->stamp;
    r->rs_id[s] = r->next_rs_id++;
    mr_ref_ck_drop(r, s, c->pos);
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
        int32_t i = mr_ref_ck_find(r, q, a);
        if (i < 0) {
            want = KEEL_ESTATE;
        } else if ((mr_ref_shared(r, q) && mr_ref_slots_used(r) >= r->n_slots) ||
                   ring_room_short(d, q, &r->ck[q][i])) {
            want = KEEL_EFULL;
        } else {
            restore_seq = q;
            restore_ck = i;
        }
    }
    if (st != want) {
        mr_expect_status(d, st, want, "seq_rm (recurrent)");
        if (st != KEEL_OK) mr_refused(d, before, st, "seq_rm");
        /* resynchronize: drop the sequence in both */
        int32_t v = s < 0 ? -1 : s;
        mr_expect_status(d, keel_mem_seq_rm(d->mem, v, -1, -1), KEEL_OK, "seq_rm (resync)");
        ref_rm_all(r, v);
        return;
    }
    if (st != KEEL_OK) {
        if (st == KEEL_ESTATE) d->res->rs_refused++;
        mr_refused(d, before, st, "seq_rm");
        return;
    }
    if (restore_seq >= 0) {
        d->res->rs_restores++;
        int32_t at = r->ck[restore_seq][restore_ck].pos;
        ref_restore(r, restore_seq, restore_ck);
        if (keel_mem_seq_pos_max(d->mem, restore_seq) != at - 1) {
            d->res->invariant_failures++;
            mr_note(d, "seq_rm restored sequence %d to end at %d, reference checkpoint at %d",
                 restore_seq, keel_mem_seq_pos_max(d->mem, restore_seq), at);
        }
        return;
    }
    ref_rm(r, s, p0, p1);
    for (int32_t q = 0; q < r->rc.mc.n_seq_max; q++)
        if ((s < 0 || q == s) && r->hist[q].n && a <= r->rs_lo[q] && b > r->rs_hi[q]) mr_ref_rs_drop(r, q);
}

static void op_rm(driver *d)
{
    ref *r = &d->r;
    int32_t ns = r->rc.mc.n_seq_max;
    int32_t s = mr_chance(&d->ch, 10) ? -1 : (int32_t)mr_pick(&d->ch, (uint32_t)ns);
    int32_t pm = s >= 0 ? mr_ref_pos_max(r, s) : 64;
    int32_t p0 = mr_chance(&d->ch, 20) ? -1 : (int32_t)mr_pick(&d->ch, (uint32_t)(pm + 2));
    int32_t p1 = mr_chance(&d->ch, 50) ? -1 : p0 + 1 + (int32_t)mr_pick(&d->ch, 8);
    if (p0 < 0 && p1 >= 0) p1 = (int32_t)mr_pick(&d->ch, (uint32_t)(pm + 2)) + 1;
    /* recurrent: mostly truncations near a checkpoint (the agent pattern) */
    if (r->rs && s >= 0 && r->n_ck[s] && mr_chance(&d->ch, 60)) {
        p0 = r->ck[s][mr_pick(&d->ch, (uint32_t)r->n_ck[s])].pos + (int32_t)mr_pick(&d->ch, 4) - 1;
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
        mr_expect_status(d, st, KEEL_OK, "seq_rm");
        mr_refused(d, before, st, "seq_rm");
        return;
    }
    ref_rm(r, s, p0, p1);
    /* an attention memory's checkpoints covering removed positions go */
    for (int32_t q = 0; q < r->rc.mc.n_seq_max; q++)
        if (s < 0 || q == s) mr_ref_ck_drop(r, q, mr_ref_seq_empty(r, q) ? -1 : p0 < 0 ? 0 : p0);
}

static void op_cp(driver *d)
{
    ref *r = &d->r;
    int32_t ns = r->rc.mc.n_seq_max;
    if (ns < 2) return;
    int32_t src = (int32_t)mr_pick(&d->ch, (uint32_t)ns), dst = (int32_t)mr_pick(&d->ch, (uint32_t)ns);
    if (src == dst) return;
    /* the common use: fork into an emptied sequence */
    if (mr_chance(&d->ch, 70)) {
        keel_status st = keel_mem_seq_rm(d->mem, dst, -1, -1);
        mr_expect_status(d, st, KEEL_OK, "seq_rm (fork)");
        ref_rm_all(r, dst);
    }
    int32_t pm = mr_ref_pos_max(r, src);
    int32_t p0 = mr_chance(&d->ch, 60) ? -1 : (int32_t)mr_pick(&d->ch, (uint32_t)(pm + 2));
    int32_t p1 = mr_chance(&d->ch, 60) ? -1 : (p0 < 0 ? 0 : p0) + 1 + (int32_t)mr_pick(&d->ch, 16);
    uint64_t before = keel_mem_digest(d->mem);
    keel_status st = keel_mem_seq_cp(d->mem, src, dst, p0, p1);
    TRACE("seq_cp %d -> %d [%d, %d) -> %s", src, dst, p0, p1, keel_status_name(st));
    int32_t a = p0 < 0 ? 0 : p0, b = p1 < 0 ? INT32_MAX : p1;
    bool rs_refuse = r->rs && r->hist[src].n &&
                     (a > r->rs_lo[src] || b <= r->rs_hi[src] || r->hist[dst].n > 0);
    if (rs_refuse) {
        mr_expect_status(d, st, KEEL_ESTATE, "seq_cp (recurrent)");
        if (st != KEEL_OK) mr_refused(d, before, st, "seq_cp");
        else {
            mr_expect_status(d, keel_mem_seq_rm(d->mem, dst, -1, -1), KEEL_OK, "seq_rm (resync)");
            ref_rm_all(r, dst);
        }
        return;
    }
    if (st != KEEL_OK) {
        if (st != KEEL_EFULL) mr_expect_status(d, st, KEEL_EFULL, "seq_cp");
        mr_refused(d, before, st, "seq_cp");
        return;
    }
    if (r->rs && r->hist[src].n) {
        for (int32_t i = 0; i < r->hist[src].n; i++) mr_hist_push(&r->hist[dst], r->hist[src].st[i]);
        r->rs_lo[dst] = r->rs_lo[src];
        r->rs_hi[dst] = r->rs_hi[src];
        r->rs_id[dst] = r->rs_id[src];
        r->rs_last[dst] = r->rs_last[src];
    }
    if (r->exact[src] > r->exact[dst]) r->exact[dst] = r->exact[src];
    for (int32_t g = 0; g < r->n_groups; g++) {
        ref_plist *fs = &r->forg[src][g];
        for (int32_t i = 0, n0 = fs->n; i < n0; i++)
            if (fs->p[i] >= a && fs->p[i] < b) mr_plist_push(&r->forg[dst][g], fs->p[i]);
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
            mr_list_push(ld, e);
            r->toks[e.tok].refs++;
        }
    }
    if (!r->rs) mr_ref_ck_drop(r, dst, a); /* dst may hold more below its checkpoints */
}

static void op_keep(driver *d)
{
    ref *r = &d->r;
    int32_t s = (int32_t)mr_pick(&d->ch, (uint32_t)r->rc.mc.n_seq_max);
    keel_status st = keel_mem_seq_keep(d->mem, s);
    TRACE("seq_keep %d -> %s", s, keel_status_name(st));
    mr_expect_status(d, st, KEEL_OK, "seq_keep");
    if (st != KEEL_OK) return;
    for (int32_t q = 0; q < r->rc.mc.n_seq_max; q++)
        if (q != s) ref_rm_all(r, q);
}

static void op_edit(driver *d, bool div)
{
    ref *r = &d->r;
    int32_t s = (int32_t)mr_pick(&d->ch, (uint32_t)r->rc.mc.n_seq_max);
    int32_t pm = mr_ref_pos_max(r, s);
    int32_t p0 = mr_chance(&d->ch, 30) ? -1 : (int32_t)mr_pick(&d->ch, (uint32_t)(pm + 2));
    int32_t p1 = mr_chance(&d->ch, 60) ? -1 : (p0 < 0 ? 0 : p0) + 1 + (int32_t)mr_pick(&d->ch, 24);
    int32_t a = p0 < 0 ? 0 : p0, b = p1 < 0 ? INT32_MAX : p1;
    int32_t delta = 0, dv = 1;
    if (div) {
        dv = 1 + (int32_t)mr_pick(&d->ch, 4);
    } else {
        /* mostly legal shifts (context shift, renumbering), sometimes negative past 0 */
        int32_t lo = INT32_MAX;
        for (int32_t g = 0; g < r->n_groups; g++)
            for (int32_t i = 0; i < r->lists[s][g].n; i++) {
                int32_t p = r->lists[s][g].e[i].pos;
                if (p >= a && p < b && p < lo) lo = p;
            }
        if (lo == INT32_MAX) lo = 0;
        delta = mr_chance(&d->ch, 50) ? (int32_t)mr_pick(&d->ch, 40) : -(int32_t)mr_pick(&d->ch, (uint32_t)lo + 1);
        if (mr_chance(&d->ch, 5)) delta = -lo - 1 - (int32_t)mr_pick(&d->ch, 3); /* must be refused */
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
        mr_expect_status(d, st, KEEL_OK, "identity edit");
        if (keel_mem_digest(d->mem) != before) {
            d->res->invariant_failures++;
            mr_note(d, "identity edit changed the memory");
        }
        return;
    }
    if (negative) {
        mr_expect_status(d, st, KEEL_ERANGE, "seq_add (negative)");
        if (st != KEEL_OK) mr_refused(d, before, st, "seq_add");
        return;
    }
    if (st == KEEL_ESTATE || (st == KEEL_OK && rs_refuse)) {
        if (!rs_refuse) mr_expect_status(d, st, KEEL_OK, div ? "seq_div" : "seq_add");
        if (st == KEEL_OK) {
            mr_expect_status(d, st, KEEL_ESTATE, div ? "seq_div (recurrent)" : "seq_add (recurrent)");
            mr_expect_status(d, keel_mem_seq_rm(d->mem, s, -1, -1), KEEL_OK, "seq_rm (resync)");
            ref_rm_all(r, s);
            return;
        }
        mr_refused(d, before, st, div ? "seq_div" : "seq_add");
        return;
    }
    if (st != KEEL_OK) {
        if (st != KEEL_EFULL) mr_expect_status(d, st, KEEL_EFULL, div ? "seq_div" : "seq_add");
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
                mr_note(d, "%s refused with KEEL_EFULL although its moving shared cells fit (%s)",
                     div ? "seq_div" : "seq_add", keel_mem_last_error(d->mem));
            }
        }
        mr_refused(d, before, st, div ? "seq_div" : "seq_add");
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
            r->rs_lo[s] = (int32_t)BASE_MIN(lo2, (int64_t)mr_ref_lists_min(r, s));
            r->rs_hi[s] = mr_ref_lists_max(r, s);
        } else {
            r->rs_lo[s] = (int32_t)lo2;
            r->rs_hi[s] = (int32_t)hi2;
        }
        mr_ref_ck_drop(r, s, ck_floor);
    } else if (!r->rs) {
        /* checkpoints below every moved token's new position hold */
        int64_t low = div ? (int64_t)a / dv : BASE_MIN((int64_t)a, (int64_t)a + delta);
        mr_ref_ck_drop(r, s, (int32_t)BASE_MAX(low, 0));
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
    int32_t s = (int32_t)mr_pick(&d->ch, (uint32_t)r->rc.mc.n_seq_max);
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
    p.policy = (keel_compact_policy)(1 + mr_pick(&d->ch, 4));
    p.target = 2 + (int32_t)mr_pick(&d->ch, (uint32_t)(fl->n - 2));
    p.trigger = p.target + 1;
    p.n_sink = (int32_t)mr_pick(&d->ch, (uint32_t)BASE_MIN(4, p.target));
    p.recent = (float)mr_pick(&d->ch, 6) / 10.0f;
    if (p.n_sink + (int32_t)ceil(p.recent * p.target) > p.target) p.recent = 0.0f;
    p.renumber = mr_chance(&d->ch, 60);
    p.protect = mr_chance(&d->ch, 50);
    p.seed = 1 + mr_pick(&d->ch, 100);
    /* snapshot: stamp -> position of s's full-table cells */
    const mem_group *grp = &d->mem->groups[gfull];
    const mem_table *t = &grp->tables[d->mem->n_streams == 1 ? 0 : s];
    uint64_t before = keel_mem_digest(d->mem);
    keel_status st = keel_mem_compact(d->mem, s, &p);
    TRACE("compact seq %d %s target %d sinks %d recent %.1f %s -> %s", s,
          keel_compact_policy_name(p.policy), p.target, p.n_sink, (double)p.recent,
          p.renumber ? "renumber" : "keep", keel_status_name(st));
    if (st != KEEL_OK) {
        if (st != KEEL_EFULL && st != KEEL_EINVAL) mr_expect_status(d, st, KEEL_OK, "compact");
        mr_refused(d, before, st, "compact");
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
        mr_note(d, "compact kept %d cells, target %d (had %d)", nk, p.target, fl->n);
    }
    /* sinks and recent are kept */
    int32_t *ord = malloc((size_t)fl->n * sizeof(int32_t));
    for (int32_t i = 0; i < fl->n; i++) ord[i] = i;
    for (int32_t i = 1; i < fl->n; i++)
        for (int32_t j = i; j > 0; j--) {
            const ref_entry *a = &fl->e[ord[j - 1]], *b = &fl->e[ord[j]];
            if (mr_key_less(b->pos, r->toks[b->tok].stamp, a->pos, r->toks[a->tok].stamp)) {
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
            mr_note(d, "compact dropped a reserved token (rank %d of %d)", i, fl->n);
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
                    mr_tok_unref(r, e.tok);
                    continue;
                }
                /* a ring token outside the kept set: with renumbering the ring
                 * forgets it (the memory refuses if the next query needs it);
                 * with positions kept it stays where it is */
                if (p.renumber) {
                    mr_tok_unref(r, e.tok);
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
        r->rs_lo[s] = BASE_MIN(r->rs_lo[s], mr_ref_lists_min(r, s));
        r->rs_hi[s] = mr_ref_lists_max(r, s);
        mr_ref_ck_drop(r, s, -1);
    } else if (!r->rs) {
        mr_ref_ck_drop(r, s, -1);
    }
    r->exact[s] = mr_ref_pos_max(r, s) + 1;
}

/* Checkpoint of a sequence at its end: the reference snapshots its
 * history length and what each ring keeps for a query at the end. */
/* The stamp of s's last token: the newest entry at its largest position
 * (the state's on a recurrent configuration). */
static uint64_t ref_last_stamp(const ref *r, int32_t s)
{
    if (r->rs) return r->rs_last[s];
    int32_t hi = mr_ref_lists_max(r, s);
    uint64_t best = 0;
    for (int32_t g = 0; g < r->n_groups; g++)
        for (int32_t i = 0; i < r->lists[s][g].n; i++) {
            const ref_entry *e = &r->lists[s][g].e[i];
            if (e->pos == hi && r->toks[e->tok].stamp > best) best = r->toks[e->tok].stamp;
        }
    return best;
}

bool mr_ref_holds(const ref *r, int32_t s)
{
    return r->rs ? r->hist[s].n > 0 : !mr_ref_seq_empty(r, s);
}

/* keel_mem_ckpt_restore: the newest checkpoint at or before p0, or a
 * refusal (none: ESTATE; no room or slot: EFULL) that changes nothing. */
static void op_ckpt_restore(driver *d)
{
    ref *r = &d->r;
    int32_t s = (int32_t)mr_pick(&d->ch, (uint32_t)r->rc.mc.n_seq_max);
    int32_t p0 = r->n_ck[s] ? r->ck[s][mr_pick(&d->ch, (uint32_t)r->n_ck[s])].pos + (int32_t)mr_pick(&d->ch, 4) - 1
                            : (int32_t)mr_pick(&d->ch, (uint32_t)(mr_ref_pos_max(r, s) + 2));
    uint64_t before = keel_mem_digest(d->mem);
    int32_t at = -2;
    keel_status st = keel_mem_ckpt_restore(d->mem, s, p0, &at);
    TRACE("ckpt_restore %d at %d -> %s (%d)", s, p0, keel_status_name(st), at);
    int32_t i = mr_ref_holds(r, s) ? mr_ref_ck_find(r, s, p0 < 0 ? 0 : p0) : -1;
    keel_status want = i < 0 ? KEEL_ESTATE
                       : (r->rs && mr_ref_shared(r, s) && mr_ref_slots_used(r) >= r->n_slots) || ring_room_short(d, s, &r->ck[s][i])
                           ? KEEL_EFULL
                           : KEEL_OK;
    mr_expect_status(d, st, want, "ckpt_restore");
    if (st != KEEL_OK) {
        mr_refused(d, before, st, "ckpt_restore");
        if (want == KEEL_OK) { /* resynchronize: drop the sequence in both */
            mr_expect_status(d, keel_mem_seq_rm(d->mem, s, -1, -1), KEEL_OK, "seq_rm (resync)");
            ref_rm_all(r, s);
        }
        return;
    }
    if (want != KEEL_OK) { /* the memory restored what the reference has not: resynchronize */
        mr_expect_status(d, keel_mem_seq_rm(d->mem, s, -1, -1), KEEL_OK, "seq_rm (resync)");
        ref_rm_all(r, s);
        return;
    }
    d->res->rs_restores++;
    int32_t want_at = r->ck[s][i].pos;
    ref_restore(r, s, i);
    if (at != want_at || keel_mem_seq_pos_max(d->mem, s) != want_at - 1) {
        d->res->invariant_failures++;
        mr_note(d, "ckpt_restore of sequence %d: at %d ending at %d, reference checkpoint at %d", s, at,
             keel_mem_seq_pos_max(d->mem, s), want_at);
    }
}

static void op_ckpt(driver *d)
{
    ref *r = &d->r;
    if (r->n_ckpt > 0 && mr_chance(&d->ch, 30)) {
        op_ckpt_restore(d);
        return;
    }
    int32_t s = (int32_t)mr_pick(&d->ch, (uint32_t)r->rc.mc.n_seq_max);
    uint64_t before = keel_mem_digest(d->mem);
    keel_status st = keel_mem_ckpt_take(d->mem, s);
    TRACE("ckpt_take %d -> %s", s, keel_status_name(st));
    keel_status want = r->n_ckpt == 0 ? KEEL_EUNSUPPORTED : !mr_ref_holds(r, s) ? KEEL_ESTATE : KEEL_OK;
    mr_expect_status(d, st, want, "ckpt_take");
    if (st != KEEL_OK) {
        mr_refused(d, before, st, "ckpt_take");
        return;
    }
    if (want != KEEL_OK) return;
    d->res->rs_ckpts++;
    int32_t pos = mr_ref_pos_max(r, s) + 1;
    uint64_t last = ref_last_stamp(r, s);
    if (r->n_ck[s] && r->ck[s][r->n_ck[s] - 1].pos == pos && r->ck[s][r->n_ck[s] - 1].stamp == last)
        return;
    if (r->n_ck[s] == r->n_ckpt) { /* the oldest goes */
        mr_ref_ck_free(r, &r->ck[s][0]);
        ref_ckpt tmp = r->ck[s][0];
        for (int32_t i = 1; i < r->n_ck[s]; i++) r->ck[s][i - 1] = r->ck[s][i];
        r->ck[s][r->n_ck[s] - 1] = tmp;
        r->n_ck[s]--;
    }
    ref_ckpt *c = &r->ck[s][r->n_ck[s]++];
    c->pos = pos;
    c->pos_min = r->rs ? r->rs_lo[s] : mr_ref_lists_min(r, s);
    c->stamp = last;
    c->hist_n = r->hist[s].n;
    for (int32_t g = 0; g < r->n_groups; g++) {
        c->ring[g].n = 0;
        c->forg[g].n = 0;
        if (!r->groups[g].sliding) continue;
        const ref_list *l = &r->lists[s][g];
        int32_t window = r->groups[g].window, tp;
        uint64_t tsm;
        mr_sink_threshold(r, l, r->groups[g].n_sink, &tp, &tsm);
        int32_t cand[512], nc = 0;
        for (int32_t i = 0; i < l->n; i++) {
            const ref_entry *e = &l->e[i];
            bool sink = tp >= 0 && !mr_key_less(tp, tsm, e->pos, r->toks[e->tok].stamp);
            if (sink) {
                mr_list_push(&c->ring[g], *e);
                r->toks[e->tok].refs++;
            } else if ((int64_t)e->pos > (int64_t)pos - window && nc < 512) {
                cand[nc++] = i;
            } else {
                mr_plist_push(&c->forg[g], e->pos);
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
                mr_list_push(&c->ring[g], *e);
                r->toks[e->tok].refs++;
            } else {
                mr_plist_push(&c->forg[g], e->pos);
            }
        }
        for (int32_t i = 0; i < r->forg[s][g].n; i++) mr_plist_push(&c->forg[g], r->forg[s][g].p[i]);
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
    int32_t s = (int32_t)mr_pick(&d->ch, (uint32_t)r->rc.mc.n_seq_max);
    if (r->hist[s].n > 160 - REF_MAX_BATCH) { /* op_place would drop the long history */
        mr_expect_status(d, keel_mem_seq_rm(d->mem, s, -1, -1), KEEL_OK, "seq_rm (long history)");
        ref_rm_all(r, s);
    }
    uint64_t before = keel_mem_digest(d->mem);
    keel_status st = keel_mem_spec_save(d->mem, s);
    TRACE("spec_save %d -> %s", s, keel_status_name(st));
    keel_status want = !r->rc.mc.spec_snapshot ? KEEL_EUNSUPPORTED : !mr_ref_holds(r, s) ? KEEL_ESTATE : KEEL_OK;
    mr_expect_status(d, st, want, "spec_save");
    if (st != KEEL_OK) {
        mr_refused(d, before, st, "spec_save");
        return;
    }
    if (want != KEEL_OK) { /* the memory saved what the reference does not hold: resynchronize */
        mr_expect_status(d, keel_mem_seq_rm(d->mem, s, -1, -1), KEEL_OK, "seq_rm (resync)");
        ref_rm_all(r, s);
        return;
    }
    int32_t p = r->rs_hi[s] + 1, lo = r->rs_lo[s], hist_n = r->hist[s].n;
    uint64_t stamp = ref_last_stamp(r, s);
    if (keel_mem_spec_pos(d->mem, s) != p) {
        d->res->invariant_failures++;
        mr_note(d, "spec_save of sequence %d: snapshot at %d, reference at %d", s, keel_mem_spec_pos(d->mem, s), p);
    }
    d->only_seq = s;
    op_place(d);
    d->only_seq = -1;
    check_invariants(d, "place (drafted)");
    if (!mr_chance(&d->ch, 70)) return; /* every draft accepted: the snapshot stays unused */
    bool valid = mr_ref_holds(r, s) && r->rs_lo[s] == lo && r->rs_hi[s] >= p - 1 && r->hist[s].n >= hist_n;
    bool forgot = false;
    for (int32_t g = 0; valid && g < r->n_groups; g++) {
        if (!r->groups[g].sliding) continue;
        for (int32_t i = 0; i < r->forg[s][g].n; i++)
            if ((int64_t)r->forg[s][g].p[i] + r->groups[g].window > p) forgot = true;
    }
    want = !valid || forgot ? KEEL_ESTATE
           : mr_ref_shared(r, s) && mr_ref_slots_used(r) >= r->n_slots ? KEEL_EFULL
                                                                  : KEEL_OK;
    before = keel_mem_digest(d->mem);
    int32_t at = -2;
    st = keel_mem_spec_restore(d->mem, s, &at);
    TRACE("spec_restore %d (snapshot at %d) -> %s (%d)", s, p, keel_status_name(st), at);
    /* the memory's record of what its rings forgot is a bound (edits and
     * removals keep it conservative), so it may refuse where the reference
     * forgot nothing; never the other way */
    if (want == KEEL_OK && st == KEEL_ESTATE && strstr(keel_mem_last_error(d->mem), " forgot position ")) {
        mr_refused(d, before, st, "spec_restore");
        return;
    }
    mr_expect_status(d, st, want, "spec_restore");
    if (st != want) { /* resynchronize: drop the sequence in both */
        if (st != KEEL_OK) mr_refused(d, before, st, "spec_restore");
        mr_expect_status(d, keel_mem_seq_rm(d->mem, s, -1, -1), KEEL_OK, "seq_rm (resync)");
        ref_rm_all(r, s);
        return;
    }
    if (st != KEEL_OK) {
        mr_refused(d, before, st, "spec_restore");
        return;
    }
    d->res->spec_restores++;
    ref_rm(r, s, p, -1);
    r->hist[s].n = hist_n;
    r->rs_hi[s] = p - 1;
    r->rs_last[s] = stamp;
    r->rs_id[s] = r->next_rs_id++;
    mr_ref_ck_drop(r, s, p - 1);
    if (at != p || keel_mem_seq_pos_max(d->mem, s) != p - 1) {
        d->res->invariant_failures++;
        mr_note(d, "spec_restore of sequence %d: at %d ending at %d, reference snapshot at %d", s, at,
             keel_mem_seq_pos_max(d->mem, s), p);
    }
    if (mr_chance(&d->ch, 50)) { /* the accepted tokens decoded again */
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
    mr_make_config(&d.ch, preset, &rc);
    char err[BASE_ERR_CAP] = "";
    keel_status st = keel_mem_open(&rc.mc, &d.mem, err);
    if (st != KEEL_OK) {
        if (log) fprintf(log, "open failed: %s: %s\n", keel_strerror(st), err);
        res->invariant_failures++;
        return 1;
    }
    /* short caches reach the split-KV path of attention too: parts of a
     * few cells (preset 4 always, half the random configs) */
    if (preset == 4 || (preset < 0 && mr_chance(&d.ch, 50)))
        d.mem->split_min_cells = 1 + (int32_t)mr_pick(&d.ch, 16);
    mr_ref_init(&d.r, &rc, d.mem, base_rng_next(&d.ch.rng) ^ 0x5eed);
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
        uint32_t op = mr_pick(&d.ch, 100);
        const char *name;
        if (op < 38) {
            op_place(&d);
            name = "place";
        } else if (op < 58) {
            mr_op_attend(&d, (int32_t)mr_pick(&d.ch, (uint32_t)rc.mc.n_layers), 1 + (int32_t)mr_pick(&d.ch, 6));
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
        } else if (op < 99 && d.r.rs && d.r.rc.mc.spec_snapshot && mr_chance(&d.ch, 40)) {
            op_spec(&d);
            name = "spec";
        } else if (op < 99 && d.r.rs) {
            /* the engine's pattern: a batch, then a checkpoint at its end */
            op_place(&d);
            check_invariants(&d, "place");
            op_ckpt(&d);
            name = "place + ckpt_take";
        } else {
            mr_op_bad(&d);
            name = "bad input";
        }
        if (d.ch.exhausted) break;
        if (d.step % 97 == 96) {
            check_invariants(&d, name);
            mr_op_session(&d);
            name = "session";
        }
        check_invariants(&d, name);
        mr_compare_all(&d);
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
    mr_ref_free(&d.r);
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
    mr_make_config(&ch, o->config, &rc);
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
