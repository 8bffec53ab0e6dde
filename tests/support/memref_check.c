/*
 * memref_check.c — the differential driver's session round trips, refused
 * operations and attention checks against the reference (memref.c drives
 * them; memref_model.c is the reference).
 */
#include "memref_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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
        clone = mr_tok_clone(r, old);
        r->toks[clone].stamp = ns;
    }
    r->toks[clone].refs++;
    mr_tok_unref(r, old);
    e->tok = clone;
    e->inst = r->next_inst++;
}

/* A session round trip: the sequence (or the whole memory) saved and loaded
 * back into the same memory. The memory's content must be the same after it
 * (attention keeps matching the reference); a refused load (no room for the
 * copies of shared cells, a whole-memory load into split streams) changes
 * nothing. Run every 97th step without a draw of its own, so the seeds'
 * operation streams stay as they were. */
void mr_op_session(driver *d)
{
    ref *r = &d->r;
    int32_t ns = r->rc.mc.n_seq_max;
    int32_t s = (int32_t)((d->step / 97) % (ns + 1)) - 1;
    size_t n = 0;
    keel_status st = keel_mem_save(d->mem, s, 77, NULL, 0, 0, NULL, 0, &n);
    mr_expect_status(d, st, KEEL_ERANGE, "session size");
    if (st != KEEL_ERANGE) return;
    uint8_t *buf = malloc(n);
    if (!buf) abort();
    size_t got = 0;
    st = keel_mem_save(d->mem, s, 77, NULL, 0, 0, buf, n, &got);
    mr_expect_status(d, st, KEEL_OK, "session save");
    uint64_t before = keel_mem_digest(d->mem);
    uint64_t base = d->mem->next_stamp; /* the load stamps its cells base + rank */
    int32_t nt = -1;
    st = keel_mem_load(d->mem, s, buf, got, 77, 0, NULL, 0, &nt, NULL);
    free(buf);
    TRACE("session seq %d (%zu bytes) -> %s", s, got, keel_status_name(st));
    if (st != KEEL_OK) {
        bool ok = st == KEEL_EFULL || (st == KEEL_EUNSUPPORTED && s < 0 && !r->rc.mc.unified);
        if (!ok) mr_expect_status(d, st, KEEL_OK, "session load");
        mr_refused(d, before, st, "session load");
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
        if (!mr_ref_holds(r, q)) continue;
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
        if ((s >= 0 && q != s) || !mr_ref_holds(r, q)) continue;
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
void mr_op_bad(driver *d)
{
    ref *r = &d->r;
    const keel_mem_config *mc = &r->rc.mc;
    uint64_t before = keel_mem_digest(d->mem);
    keel_status st;
    uint32_t kind = mr_pick(&d->ch, 6);
    switch (kind) {
    case 0: { /* unknown sequence id */
        int32_t pos = 0, seq = mc->n_seq_max + (int32_t)mr_pick(&d->ch, 3);
        keel_mem_batch b = {1, &pos, &seq, NULL, NULL, NULL};
        st = keel_mem_place(d->mem, &b, d->cells);
        mr_expect_status(d, st, KEEL_EINVAL, "place (unknown seq)");
        break;
    }
    case 1: { /* position gap */
        int32_t seq = (int32_t)mr_pick(&d->ch, (uint32_t)mc->n_seq_max);
        int32_t pm = mr_ref_pos_max(r, seq);
        if (pm < 0) return;
        int32_t pos = pm + 2 + (int32_t)mr_pick(&d->ch, 3);
        keel_mem_batch b = {1, &pos, &seq, NULL, NULL, NULL};
        st = keel_mem_place(d->mem, &b, d->cells);
        mr_expect_status(d, st, KEEL_EINVAL, "place (gap)");
        break;
    }
    case 2: { /* empty range */
        int32_t p0 = 1 + (int32_t)mr_pick(&d->ch, 50);
        int32_t p1 = p0 - (int32_t)mr_pick(&d->ch, (uint32_t)BASE_MIN(p0, 3)); /* 0 <= p1 <= p0 */
        st = keel_mem_seq_rm(d->mem, 0, p0, p1);
        mr_expect_status(d, st, KEEL_ERANGE, "seq_rm (empty range)");
        break;
    }
    case 3: { /* negative position from seq_add */
        int32_t s = (int32_t)mr_pick(&d->ch, (uint32_t)mc->n_seq_max);
        if (mr_ref_seq_empty(r, s)) return;
        st = keel_mem_seq_add(d->mem, s, -1, -1, -(mr_ref_pos_max(r, s) + 1));
        mr_expect_status(d, st, KEEL_ERANGE, "seq_add (negative)");
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
        mr_expect_status(d, st, KEEL_EINVAL, "place (too many tokens)");
        break;
    }
    default: { /* write to a cell that is not occupied / out of range */
        int32_t cell = -1 - (int32_t)mr_pick(&d->ch, 3);
        int32_t l = 0;
        while (l < mc->n_layers && r->layer_group[l] < 0) l++;
        st = keel_mem_write(d->mem, l, 1, &cell, d->kbuf, d->vbuf);
        mr_expect_status(d, st, KEEL_EINVAL, "write (bad cell)");
        break;
    }
    }
    mr_refused(d, before, st, "bad input");
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
    keel_dtype qt = mr_query_dot_type(L->idx_dtype);
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
        mr_ref_rope_row(&L->idx_rope, di, r->toks[e->tok].ik + r->ik_off[layer], e->pos, d->dk);
        for (int32_t j = 0; j < di; j++) kr[j] = (float)d->dk[j];
        mem_col_rotate(icol, kr);
        mr_codec_var(L->idx_dtype, kr, di, vk);
        for (int32_t h = 0; h < nih; h++) {
            const float *q = d->iqbuf + ((size_t)i * (size_t)nih + (size_t)h) * (size_t)di;
            double dot = 0.0, mag = 0.0, se = 0.0;
            for (int32_t j = 0; j < di; j++) {
                dot += (double)q[j] * d->dk[j];
                mag += fabs((double)q[j] * d->dk[j]);
                qr[j] = q[j];
            }
            mem_col_rotate(icol, qr);
            mr_codec_var(qt, qr, di, vq);
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
        if (k == l->n || (j > 0 && mr_key_less(t->pos[c], t->stamp[c], last_pos, last_stamp))) {
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
        mr_note(d, "sparse layer %d query %d: the kept cells are not %d distinct visible cells in order "
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
            mr_note(d, "sparse layer %d query %d: a dropped cell scores %.6g beyond a kept one's %.6g "
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
void mr_op_attend(driver *d, int32_t layer, int32_t n_q)
{
    ref *r = &d->r;
    const keel_mem_layer *L = &r->rc.layers[layer];
    int32_t g = r->layer_group[layer];
    if (g < 0) return;
    int32_t nh = L->n_heads, G = nh / L->n_kv_heads, dk = L->head_dim_k, dv = L->head_dim_v;
    int32_t pos[REF_MAX_BATCH], seq[REF_MAX_BATCH];
    if (n_q > r->rc.mc.n_batch_max) n_q = r->rc.mc.n_batch_max;
    for (int32_t i = 0; i < n_q; i++) {
        int32_t s = (int32_t)mr_pick(&d->ch, (uint32_t)r->rc.mc.n_seq_max);
        int32_t pm = mr_ref_pos_max(r, s);
        seq[i] = s;
        pos[i] = mr_chance(&d->ch, 70) ? (pm < 0 ? 0 : pm) : (int32_t)mr_pick(&d->ch, (uint32_t)(pm + 3));
        for (int32_t h = 0; h < nh; h++) {
            float raw[64];
            for (int32_t j = 0; j < dk; j++) raw[j] = (float)(base_rng_uniform(&r->data) * 2 - 1);
            mr_ref_rope(L, raw, pos[i], d->dq);
            for (int32_t j = 0; j < dk; j++)
                d->qbuf[((size_t)i * (size_t)nh + (size_t)h) * (size_t)dk + (size_t)j] = (float)d->dq[j];
        }
    }
    float sinks[16];
    bool use_sinks = mr_chance(&d->ch, 20);
    for (int32_t h = 0; h < nh; h++) sinks[h] = (float)(base_rng_uniform(&r->data) * 2 - 1);
    keel_mem_attn a;
    memset(&a, 0, sizeof a);
    a.n_tokens = n_q;
    a.n_heads = nh;
    a.q = d->qbuf;
    a.pos = pos;
    a.seq = seq;
    a.out = d->out;
    a.scale = mr_chance(&d->ch, 70) ? 0.0f : (float)((0.5 + base_rng_uniform(&r->data)) / sqrt((double)dk));
    a.softcap = mr_chance(&d->ch, 20) ? 1.0f + (float)mr_pick(&d->ch, 10) : 0.0f;
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
                mr_ref_rope_row(&L->idx_rope, di, raw, pos[i], d->dq);
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
    mr_expect_status(d, st, KEEL_OK, "attend");
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
        if (rg->sliding) mr_sink_threshold(r, l, rg->n_sink, &tp, &tsm);
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
                bool sink = tp >= 0 && !mr_key_less(tp, tsm, e->pos, r->toks[e->tok].stamp);
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
                    mr_ref_rope(L, t->k + r->k_off[layer] + (size_t)hk * (size_t)dk, e->pos, d->dk);
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
            bool qquant = mr_query_dot_type(L->k_dtype) != KEEL_DTYPE_F32;
            mr_codec_var(mr_query_dot_type(L->k_dtype), qr, dk, vq);
            for (int32_t k = 0; k < l->n && lsum > 0; k++) {
                const ref_entry *e = &l->e[k];
                if (!use[k]) continue;
                const ref_token *t = &r->toks[e->tok];
                mr_ref_rope(L, t->k + r->k_off[layer] + (size_t)hk * (size_t)dk, e->pos, d->dk);
                double sc = 0.0;
                for (int32_t j = 0; j < dk; j++) {
                    sc += (double)q[j] * d->dk[j];
                    kr[j] = (float)d->dk[j];
                }
                sc *= scale;
                if (a.softcap > 0) sc = a.softcap * tanh(sc / a.softcap);
                double p = exp(sc - m) / lsum;
                mem_col_rotate(kcol, kr);
                mr_codec_var(L->k_dtype, kr, dk, vk);
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
                mr_codec_var(L->v_dtype, vr, dv, vvv);
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
                mr_note(d, "attention diverges: layer %d (%s K%s, %s V%s, %s) seq %d pos %d head %d: err %.4g > tol %.4g (edits %d, softcap %g, sinks %d)",
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

void mr_compare_all(driver *d)
{
    int32_t nl = d->r.rc.mc.n_layers;
    int32_t l = (int32_t)mr_pick(&d->ch, (uint32_t)nl);
    mr_op_attend(d, l, 1 + (int32_t)mr_pick(&d->ch, 3));
}
