/*
 * spec.c — draft sources of speculative decoding (keel_spec, keel.h):
 * prompt lookup (n-gram) over a sequence's own history, and a draft model
 * run in a context of its own; and the back-off that keeps drafting only
 * where it pays.
 *
 * The verifier (keel run, the engine) decodes [last token, drafts] with
 * keel_decode_spec, picks each position's token with
 * keel_sampler_sample_draft until one differs from its draft, rewinds the
 * rest (keel_context_rewind) and reports the outcome (keel_spec_result).
 *
 * Back-off. Per sequence the spec keeps the acceptance rate alpha (the
 * chance a draft token is accepted given the previous one was, from decayed
 * counts of accepted and rejected tokens) and the cost of a verified step
 * relative to a plain one, c(k) = 1 + beta * k + gamma * k for k drafts
 * (beta: verifying one more token, from the caller's step times; gamma:
 * drafting one, measured here). A step drafts the k in 0..max_draft that
 * maximizes the expected tokens per cost, (1 - alpha^(k+1)) / (1 - alpha)
 * / c(k); none when k = 0 wins, except a probe of one token after
 * probe_gap steps without drafts, so that alpha follows a text that turns
 * repetitive. The gap starts at SPEC_PROBE_EVERY and doubles after each
 * probe that is rejected, up to SPEC_PROBE_MAX (a text that never repeats
 * pays about (c(1) - 1) / 128 of its time for the probes); a step with an
 * accepted draft sets it back. alpha's counts age by SPEC_DECAY per step,
 * drafted or not, so that a probe after a long gap is judged mostly on its
 * own outcome (the counts stop ageing near zero: their ratio is kept).
 *
 * The start. Before anything is measured a draft is a guess that can cost
 * several steps (a 9-token verify costs 3-6 plain steps on AVX2), which a
 * short answer on a text that never repeats cannot win back. So a
 * sequence's first step is plain when no plain step has been timed yet
 * (beta is learned against it), and its first draft is a trial of one
 * token; alpha and beta then come from their first outcomes, beta's first
 * measurement replacing its prior rather than being averaged with it.
 * keel_spec_reset (a new conversation in the same slot) keeps the step
 * times and beta: only the trial is repeated.
 *
 * A plain step's time grows with the context (attention), and beta is
 * measured against it. A sequence whose drafts keep being accepted takes
 * no plain step, so its t_plain would stay that of a much shorter context
 * and beta would grow until drafting stopped (or, in a shorter new
 * conversation, shrink and overdraft). So when the history has grown by
 * half (256 tokens at least) since the last timed plain step, or shrunk
 * to under half, one step is plain and its time replaces t_plain: a
 * logarithmic number of steps (about ten from 512 to 32,768 tokens).
 *
 * Memory: the history index is the caller's; the draft model's context and
 * per-sequence token copies are allocated at open. keel_spec_draft
 * allocates nothing.
 */
#include "engine.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SPEC_PROBE_EVERY 16  /* steps without drafts before the first probe */
#define SPEC_PROBE_MAX 128   /* the longest gap between probes */
#define SPEC_DECAY 0.9       /* weight of the past in alpha's counts, per step */

typedef struct spec_seq {
    double acc, rej;          /* decayed counts of accepted / rejected draft tokens */
    double beta;              /* verify cost per extra token, relative to a plain step */
    bool beta_known;          /* beta measured at least once (else its prior) */
    int32_t n_steps;          /* steps reported since open or reset */
    double t_plain;           /* a plain step's ns (EWMA), 0: unknown */
    int32_t plain_at;         /* the history's length when t_plain was last timed */
    int32_t hist_at;          /* the history's length at the last keel_spec_draft */
    bool refresh;             /* this step is plain to time t_plain anew */
    int32_t since;            /* steps since the last draft */
    int32_t probe_gap;        /* steps without drafts before the next probe */
    bool probing;             /* the last keel_spec_draft's drafts are a probe */
    int32_t last_k;           /* drafts of the last keel_spec_draft */
    uint64_t draft_ns;        /* time the last keel_spec_draft spent drafting */
    /* draft model: the tokens the draft context holds for this sequence */
    int32_t *dhist;           /* [hist_cap] */
    int32_t n_dhist;
} spec_seq;

struct keel_spec {
    keel_spec_params p;
    int32_t n_seq;
    spec_seq *seqs;           /* [n_seq] */
    double gamma;             /* drafting one token, relative to a plain step (draft model) */
    keel_context *dctx;       /* draft model: its context, or NULL */
    int32_t d_batch;
    int32_t hist_cap;
    int32_t *feed;            /* [d_batch] */
    int8_t *feed_logits;      /* [d_batch] */
    int32_t *feed_seq;        /* [d_batch] */
    keel_spec_stats st;
    /* the oracle source (benchmarks): ref continues a prompt of n_prompt
     * tokens; each draft token is ref's with probability rate */
    const int32_t *ref;
    int32_t n_ref, n_prompt;
    double rate;
    uint64_t rng;
    char err[BASE_ERR_CAP];
};

keel_spec_params keel_spec_params_default(void)
{
    keel_spec_params p;
    memset(&p, 0, sizeof p);
    p.kind = KEEL_SPEC_NONE;
    p.max_draft = 16;
    p.min_n = 2;
    p.max_n = 8;
    p.adaptive = true;
    return p;
}

static keel_status check_params(const keel_spec_params *p, char *err)
{
    if (p->kind < KEEL_SPEC_NONE || p->kind > KEEL_SPEC_DRAFT)
        return base_err(err, KEEL_EINVAL, "spec: unknown kind %d", (int)p->kind);
    if (p->max_draft < 1 || p->max_draft > KEEL_SPEC_MAX_DRAFT)
        return base_err(err, KEEL_EINVAL, "spec: max_draft %d (need 1..%d)", p->max_draft, KEEL_SPEC_MAX_DRAFT);
    if (p->min_n < 1 || p->max_n < p->min_n || p->max_n > 64)
        return base_err(err, KEEL_EINVAL, "spec: n-gram lengths %d..%d (need 1 <= min_n <= max_n <= 64)", p->min_n,
                        p->max_n);
    return KEEL_OK;
}

/* Same vocabulary: as many tokens, each with the same text. */
static keel_status same_vocab(const keel_model *a, const keel_model *b, char *err)
{
    keel_model_info ia, ib;
    keel_model_info_get(a, &ia);
    keel_model_info_get(b, &ib);
    if (ia.n_vocab != ib.n_vocab)
        return base_err(err, KEEL_EINVAL,
                        "spec: the draft model's vocabulary has %d tokens, the model's %d: a draft model "
                        "must share the model's vocabulary",
                        ib.n_vocab, ia.n_vocab);
    for (int32_t i = 0; i < ia.n_vocab; i++) {
        size_t na = 0, nb = 0;
        const char *ta = text_token_text(a->tok, i, &na), *tb = text_token_text(b->tok, i, &nb);
        if (na != nb || (na && memcmp(ta, tb, na) != 0))
            return base_err(err, KEEL_EINVAL,
                            "spec: token %d differs between the model (\"%.*s\") and the draft model "
                            "(\"%.*s\"): a draft model must share the model's vocabulary",
                            i, (int)BASE_MIN(na, 40), ta ? ta : "", (int)BASE_MIN(nb, 40), tb ? tb : "");
    }
    return KEEL_OK;
}

keel_status keel_spec_open(const keel_spec_params *p, const keel_model *target, const keel_model *draft,
                           const keel_context_params *draft_cp, int32_t n_seq, int32_t hist_cap, keel_spec **out,
                           char *err)
{
    if (out) *out = NULL;
    if (!p || !target || !out || n_seq < 1 || n_seq > 256 || hist_cap < 1)
        return base_err(err, KEEL_EINVAL, "spec: bad arguments (n_seq %d, hist_cap %d)", n_seq, hist_cap);
    keel_status st = check_params(p, err);
    if (st != KEEL_OK) return st;
    if (p->kind == KEEL_SPEC_DRAFT && !draft)
        return base_err(err, KEEL_EINVAL, "spec: kind draft needs a draft model");
    keel_spec *s = base_alloc(sizeof *s);
    if (!s) return base_err(err, KEEL_ENOMEM, "spec: out of memory");
    memset(s, 0, sizeof *s);
    s->p = *p;
    s->n_seq = n_seq;
    s->hist_cap = hist_cap;
    s->seqs = base_alloc((size_t)n_seq * sizeof *s->seqs);
    if (!s->seqs) {
        st = base_err(err, KEEL_ENOMEM, "spec: out of memory");
        goto fail;
    }
    memset(s->seqs, 0, (size_t)n_seq * sizeof *s->seqs);
    for (int32_t i = 0; i < n_seq; i++) {
        s->seqs[i].beta = 0.1;
        s->seqs[i].probe_gap = SPEC_PROBE_EVERY;
    }
    if (p->kind == KEEL_SPEC_DRAFT) {
        if ((st = same_vocab(target, draft, err)) != KEEL_OK) goto fail;
        keel_context_params cp = draft_cp ? *draft_cp : keel_context_params_default();
        cp.n_seq_max = n_seq;
        cp.n_outputs = BASE_MAX(cp.n_outputs, 1);
        cp.speculative = false;
        char cerr[BASE_ERR_CAP];
        if ((st = keel_context_open(draft, &cp, &s->dctx, cerr)) != KEEL_OK) {
            base_err(err, st, "spec: draft model context: %s", cerr);
            goto fail;
        }
        s->d_batch = s->dctx->p.n_batch;
        /* the draft cache holds at most n_ctx tokens of a sequence: so does
         * its copy of the history */
        s->hist_cap = BASE_MIN(hist_cap, s->dctx->p.n_ctx + 1);
        s->feed = base_alloc((size_t)s->d_batch * sizeof(int32_t));
        s->feed_seq = base_alloc((size_t)s->d_batch * sizeof(int32_t));
        s->feed_logits = base_alloc((size_t)s->d_batch);
        if (!s->feed || !s->feed_seq || !s->feed_logits) {
            st = base_err(err, KEEL_ENOMEM, "spec: out of memory");
            goto fail;
        }
        for (int32_t i = 0; i < n_seq; i++) {
            s->seqs[i].dhist = base_alloc((size_t)s->hist_cap * sizeof(int32_t));
            if (!s->seqs[i].dhist) {
                st = base_err(err, KEEL_ENOMEM, "spec: out of memory");
                goto fail;
            }
        }
    }
    *out = s;
    return KEEL_OK;
fail:
    keel_spec_close(s);
    return st;
}

void keel_spec_close(keel_spec *s)
{
    if (!s) return;
    if (s->seqs) {
        for (int32_t i = 0; i < s->n_seq; i++) base_free(s->seqs[i].dhist, (size_t)s->hist_cap * sizeof(int32_t));
        base_free(s->seqs, (size_t)s->n_seq * sizeof *s->seqs);
    }
    base_free(s->feed, (size_t)s->d_batch * sizeof(int32_t));
    base_free(s->feed_seq, (size_t)s->d_batch * sizeof(int32_t));
    base_free(s->feed_logits, (size_t)s->d_batch);
    keel_context_close(s->dctx);
    base_free(s, sizeof *s);
}

const char *keel_spec_last_error(const keel_spec *s)
{
    return s ? s->err : "";
}

const keel_spec_params *keel_spec_params_get(const keel_spec *s)
{
    return s ? &s->p : NULL;
}

void keel_spec_stats_get(const keel_spec *s, keel_spec_stats *out)
{
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (s) *out = s->st;
}

void keel_spec_reset(keel_spec *s, int32_t seq)
{
    if (!s || seq < 0 || seq >= s->n_seq) return;
    spec_seq *q = &s->seqs[seq];
    q->acc = q->rej = 0;
    q->since = 0;
    q->probe_gap = SPEC_PROBE_EVERY;
    q->probing = false;
    q->last_k = 0;
    q->n_steps = 0;
    /* the draft context's cache is kept: a new conversation sharing a
     * prefix reuses it (keel_spec_draft rewinds what differs) */
}

/* How many tokens to draft for q: the k maximizing expected tokens per
 * unit of step time; 0 to skip (a probe of one token aside, which sets
 * q->probing). */
static int32_t want_drafts(const keel_spec *s, spec_seq *q, int32_t n_hist)
{
    int32_t K = s->p.max_draft;
    if (!s->p.adaptive) return K;
    if (q->n_steps == 0 && q->t_plain <= 0) return 0; /* time a plain step first */
    if (q->t_plain > 0 &&
        (n_hist > q->plain_at + BASE_MAX(256, q->plain_at / 2) || n_hist < q->plain_at / 2)) {
        q->refresh = true; /* t_plain is another context's */
        return 0;
    }
    double n = q->acc + q->rej;
    if (n <= 0) return 1; /* the trial: no outcome yet */
    double alpha = BASE_MIN(q->acc / n, 0.995);
    double cost = q->beta + s->gamma, best = 1.0;
    int32_t bk = 0;
    double ak = alpha;
    for (int32_t k = 1; k <= K; k++) {
        ak *= alpha; /* alpha^(k+1) */
        double gain = (1.0 - ak) / (1.0 - alpha) / (1.0 + cost * k);
        if (gain > best * 1.02) {
            best = gain;
            bk = k;
        }
    }
    if (bk == 0 && q->since >= q->probe_gap) {
        bk = 1;
        q->probing = true;
    }
    return bk;
}

/* Prompt lookup: the continuation of the most recent earlier occurrence of
 * the longest suffix of hist (min_n..max_n tokens). */
static int32_t ngram_draft(const keel_spec *s, const int32_t *h, int32_t n, int32_t *out, int32_t cap)
{
    int32_t nmin = s->p.min_n, nmax = s->p.max_n;
    if (n < nmin + 1 || cap < 1) return 0;
    int32_t best_j = -1, best_len = 0;
    /* j: the end of a candidate occurrence (h[j] matches h[n-1]) */
    for (int32_t j = n - 2; j >= nmin - 1; j--) {
        if (h[j] != h[n - 1]) continue;
        int32_t len = 1;
        while (len < nmax && j - len >= 0 && h[j - len] == h[n - 1 - len]) len++;
        if (len > best_len) {
            best_len = len;
            best_j = j;
            if (len == nmax) break;
        }
    }
    if (best_len < nmin) return 0;
    int32_t k = 0;
    for (int32_t i = best_j + 1; i < n && k < cap; i++) out[k++] = h[i];
    return k;
}

const keel_context *spec_draft_context(const keel_spec *s)
{
    return s ? s->dctx : NULL;
}

void spec_set_oracle(keel_spec *s, const int32_t *ref, int32_t n_ref, int32_t n_prompt, double rate, uint64_t seed)
{
    s->ref = ref;
    s->n_ref = n_ref;
    s->n_prompt = n_prompt;
    s->rate = rate;
    s->rng = seed | 1;
}

/* The known continuation, each token kept with probability rate (else
 * another token). */
static int32_t oracle_draft(keel_spec *s, int32_t n_hist, int32_t *out, int32_t cap)
{
    int32_t k = 0, at = n_hist - s->n_prompt; /* ref index of the first draft */
    for (; k < cap && at + k >= 0 && at + k < s->n_ref; k++) {
        s->rng ^= s->rng << 13;
        s->rng ^= s->rng >> 7;
        s->rng ^= s->rng << 17;
        double u = (double)(s->rng >> 11) / 9007199254740992.0;
        int32_t t = s->ref[at + k];
        out[k] = u < s->rate ? t : t > 0 ? t - 1 : 1; /* a valid id that is not t */
    }
    return k;
}

/* Feeds tokens to the draft context's sequence seq (logits at the last). */
static keel_status dfeed(keel_spec *s, int32_t seq, const int32_t *tok, int32_t n)
{
    spec_seq *q = &s->seqs[seq];
    for (int32_t i = 0; i < n;) {
        int32_t m = BASE_MIN(n - i, s->d_batch);
        for (int32_t j = 0; j < m; j++) {
            s->feed[j] = tok[i + j];
            s->feed_seq[j] = seq;
            s->feed_logits[j] = i + j == n - 1;
        }
        keel_batch b = {m, s->feed, NULL, s->feed_seq, s->feed_logits};
        keel_status st = keel_decode(s->dctx, &b);
        if (st != KEEL_OK) {
            q->n_dhist = 0; /* the next draft rewinds the sequence to 0: empties it */
            return base_err(s->err, st, "spec: draft model: %s", keel_context_last_error(s->dctx));
        }
        for (int32_t j = 0; j < m && q->n_dhist < s->hist_cap; j++) q->dhist[q->n_dhist++] = tok[i + j];
        i += m;
    }
    return KEEL_OK;
}

static int32_t argmax(const float *x, int32_t n)
{
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* The draft model: its cache brought to hist, then greedy tokens. */
static keel_status model_draft(keel_spec *s, int32_t seq, const int32_t *h, int32_t n, int32_t *out, int32_t cap,
                               int32_t *n_out)
{
    spec_seq *q = &s->seqs[seq];
    keel_model_info mi;
    keel_model_info_get(s->dctx->model, &mi);
    int32_t lcp = 0;
    while (lcp < q->n_dhist && lcp < n && q->dhist[lcp] == h[lcp]) lcp++;
    if (lcp >= n) lcp = n - 1; /* the last token is fed again for its logits */
    int32_t resume = 0;
    keel_status st = keel_context_rewind(s->dctx, seq, lcp, &resume);
    if (st != KEEL_OK) {
        q->n_dhist = 0;
        return base_err(s->err, st, "spec: draft model: %s", keel_context_last_error(s->dctx));
    }
    q->n_dhist = BASE_MIN(resume, lcp);
    if ((st = dfeed(s, seq, h + q->n_dhist, n - q->n_dhist)) != KEEL_OK) return st;
    int32_t k = 0;
    for (;;) {
        const float *lg = keel_logits(s->dctx, s->dctx->n_last - 1);
        if (!lg) break;
        int32_t t = argmax(lg, mi.n_vocab);
        out[k++] = t;
        if (k >= cap || keel_token_is_eog(s->dctx->model, t)) break;
        if ((st = dfeed(s, seq, &t, 1)) != KEEL_OK) return st;
    }
    *n_out = k;
    return KEEL_OK;
}

keel_status keel_spec_draft(keel_spec *s, int32_t seq, const int32_t *hist, int32_t n_hist, int32_t *out,
                            int32_t cap, int32_t *n_out)
{
    if (n_out) *n_out = 0;
    if (!s || !hist || !out || !n_out || seq < 0 || seq >= s->n_seq || n_hist < 1) return KEEL_EINVAL;
    s->err[0] = 0;
    spec_seq *q = &s->seqs[seq];
    q->last_k = 0;
    q->draft_ns = 0;
    q->probing = false;
    q->refresh = false;
    q->hist_at = n_hist;
    if (s->p.kind == KEEL_SPEC_NONE || cap < 1) return KEEL_OK;
    int32_t k = BASE_MIN(want_drafts(s, q, n_hist), cap);
    if (k <= 0) {
        q->since++;
        return KEEL_OK;
    }
    uint64_t t0 = base_time_ns();
    int32_t got = 0;
    if (s->ref) {
        got = oracle_draft(s, n_hist, out, k);
    } else if (s->p.kind == KEEL_SPEC_NGRAM) {
        got = ngram_draft(s, hist, n_hist, out, k);
    } else {
        keel_status st = model_draft(s, seq, hist, n_hist, out, k, &got);
        if (st != KEEL_OK) return st;
    }
    q->draft_ns = base_time_ns() - t0;
    q->last_k = got;
    if (got > 0) q->since = 0;
    else q->since++;
    *n_out = got;
    return KEEL_OK;
}

void keel_spec_result(keel_spec *s, int32_t seq, int32_t n_drafted, int32_t n_accepted, uint64_t step_ns)
{
    if (!s || seq < 0 || seq >= s->n_seq || n_drafted < 0 || n_accepted < 0 || n_accepted > n_drafted) return;
    spec_seq *q = &s->seqs[seq];
    s->st.steps++;
    q->n_steps++;
    s->st.drafted += n_drafted;
    s->st.accepted += n_accepted;
    if (q->acc + q->rej > 1e-3) { /* the counts age with every step */
        q->acc *= SPEC_DECAY;
        q->rej *= SPEC_DECAY;
    }
    if (n_drafted == 0) {
        if (step_ns > 0)
            q->t_plain = q->t_plain > 0 && !q->refresh ? 0.8 * q->t_plain + 0.2 * (double)step_ns : (double)step_ns;
        q->plain_at = q->hist_at; /* also untimed: no refresh again at once */
        q->refresh = false;
        return;
    }
    s->st.draft_steps++;
    q->acc += n_accepted;
    q->rej += n_accepted < n_drafted ? 1 : 0;
    if (n_accepted > 0) q->probe_gap = SPEC_PROBE_EVERY;
    else if (q->probing) q->probe_gap = BASE_MIN(2 * q->probe_gap, SPEC_PROBE_MAX);
    q->probing = false;
    if (q->t_plain > 0 && step_ns > 0) {
        double b = ((double)step_ns / q->t_plain - 1.0) / n_drafted;
        b = BASE_MAX(0.0, BASE_MIN(b, 2.0));
        q->beta = q->beta_known ? 0.8 * q->beta + 0.2 * b : b;
        q->beta_known = true;
        if (q->draft_ns > 0 && q->last_k > 0) {
            double g = (double)q->draft_ns / q->t_plain / q->last_k;
            s->gamma = s->gamma > 0 ? 0.8 * s->gamma + 0.2 * g : g;
        }
    }
}
