/*
 * eng_spec.c — speculative decoding in the engine's step (docs/engine.md,
 * "Speculative decoding"): each generating slot may put drafted tokens
 * after its newest one in the step's batch (drafts of several slots share
 * the batch with prefill chunks); their rows pick tokens by the acceptance
 * rule in order (eng_sched.c's row loop: grammar, bias, logprobs as for
 * any row) until one differs from its draft; then the rejected tail is
 * rewound (keel_context_rewind: exact, recurrent states through the
 * batch's snapshot) and the slot's history cut to what the cache holds.
 *
 * Drafting is bounded by what the step has to spare: batch tokens, logit
 * rows, free full-attention cells (idle caches are never evicted for a
 * draft) and a compacting slot's headroom below its trigger.
 */
#include "eng.h"

#include <math.h>
#include <string.h>

void eng_spec_plan(keel_engine *e, const int32_t *cnt, const int32_t *chunk)
{
    for (int32_t i = 0; i < e->n_slots; i++) e->slots[i].n_draft = 0;
    if (!e->spec) return;
    keel_mem *mem = keel_context_memory(e->ctx);
    int32_t tokens = 0, rows = 0;
    for (int32_t i = 0; i < e->n_slots; i++) {
        tokens += chunk[i] + (cnt[i] && e->slots[i].state == ENG_SLOT_GEN);
        rows += chunk[i] > 0 || cnt[i];
    }
    int32_t tok_left = e->cp.n_batch - tokens, rows_left = e->cp.n_outputs - rows;
    int32_t cells_left = mem_room(mem, 0) - tokens;
    for (int32_t i = 0; i < e->n_slots; i++) {
        eng_slot *sl = &e->slots[i];
        int32_t cap = BASE_MIN(BASE_MIN(tok_left, rows_left), BASE_MIN(cells_left, KEEL_SPEC_MAX_DRAFT));
        if (!cnt[i] || sl->state != ENG_SLOT_GEN || !sl->req || cap <= 0 || sl->n_hist >= e->hist_cap) continue;
        if (sl->hist_lost) continue; /* the history no longer says what the cache holds */
        const eng_opts *o = &sl->req->o;
        if (o->max_tokens >= 0) cap = BASE_MIN(cap, o->max_tokens - sl->n_gen);
        cap = BASE_MIN(cap, e->hist_cap - sl->n_hist - 1); /* the history holds the whole batch */
        if (sl->compact.policy != KEEL_COMPACT_NONE)
            cap = BASE_MIN(cap, sl->compact.trigger - keel_mem_seq_cells(mem, sl->seq) - 1);
        if (cap <= 0) continue;
        /* the history with the newest (sampled, not decoded) token */
        sl->hist[sl->n_hist] = sl->last_tok;
        int32_t k = 0;
        if (keel_spec_draft(e->spec, sl->seq, sl->hist, sl->n_hist + 1, sl->draft, cap, &k) != KEEL_OK) k = 0;
        sl->n_draft = k;
        tok_left -= k;
        rows_left -= k;
        cells_left -= k;
    }
}

void eng_spec_begin(eng_slot *sl)
{
    sl->n_hist0 = sl->n_hist;
    sl->n_acc = 0;
    sl->spec_stop = false;
}

void eng_spec_settle(keel_engine *e, eng_slot *sl, uint64_t step_ns, int32_t n_seq, int32_t n_tok)
{
    int32_t k = sl->n_draft, a = sl->n_acc;
    if (!e->spec || sl->state == ENG_SLOT_PREFILL) return;
    /* the slot's share of the step: with several slots in it, the whole
     * step's time would charge each one the others' drafts (a slot that
     * did not draft would time its plain step on another's verify) */
    uint64_t ns = 0;
    if (step_ns > 0) {
        double sh = eng_cost_share(&e->dec_cost, (double)step_ns, n_seq, n_tok, k);
        ns = sh >= 1.0 ? (uint64_t)llround(sh) : 1;
    }
    if (k == 0) {
        keel_spec_result(e->spec, sl->seq, 0, 0, ns);
        return;
    }
    sl->n_draft = 0;
    sl->n_drafted += k;
    sl->n_accepted += a;
    keel_spec_result(e->spec, sl->seq, k, a, ns);
    if (a == k) return;
    /* the cache holds the newest token and every draft: keep those accepted */
    int32_t keep = sl->n_hist0 + 1 + a, resume = 0;
    keel_status st = keel_context_rewind(e->ctx, sl->seq, keep, &resume);
    if (st != KEEL_OK || resume != keep) {
        char why[BASE_ERR_CAP];
        snprintf(why, sizeof why, "speculative decoding: the cache could not be rewound: %s",
                 st != KEEL_OK ? keel_context_last_error(e->ctx) : "a checkpoint was restored");
        eng_slot_clear(e, sl);
        if (sl->req) eng_finish_error(e, sl, st != KEEL_OK ? st : KEEL_EINTERNAL, why);
        return;
    }
    sl->n_hist = BASE_MIN(sl->n_hist, keep);
}
