/*
 * sampler.c — the sampler chain (sampler.h). Owns the candidate array
 * [n_vocab], per-token counts of the history window [n_vocab] and the
 * history ring [penalty_last_n]. Invariant: counts[t] == occurrences of t
 * in the ring's live entries.
 *
 * Sorting is an in-place heap sort / heap selection (no libc qsort, whose
 * glibc version may call malloc), ordering by logit descending, then id
 * ascending, so results never depend on sort stability.
 */
#include "sampler.h"

#include <math.h>
#include <string.h>

struct sampler {
    sampler_params p;
    int32_t n_vocab;
    sampler_cand *cand; /* [n_vocab] working candidates */
    int32_t *counts;    /* [n_vocab] occurrences in the window */
    int32_t *ring;      /* [penalty_last_n] last accepted tokens */
    int32_t ring_head;  /* next slot to write */
    int32_t ring_len;   /* live entries, <= penalty_last_n */
    base_rng rng;
};

sampler_params sampler_params_default(void)
{
    sampler_params p = {
        .temperature = 0.8f,
        .top_k = 40,
        .top_p = 0.95f,
        .min_p = 0.05f,
        .repeat_penalty = 1.0f,
        .penalty_last_n = 64,
        .presence_penalty = 0.0f,
        .frequency_penalty = 0.0f,
        .min_keep = 1,
        .seed = 0x5eed,
    };
    return p;
}

keel_status sampler_open(const sampler_params *p, int32_t n_vocab, sampler **out, char *err)
{
    if (!out) return base_err(err, KEEL_EINVAL, "out is NULL");
    *out = NULL;
    if (!p) return base_err(err, KEEL_EINVAL, "params is NULL");
    if (n_vocab < 1) return base_err(err, KEEL_EINVAL, "n_vocab %d < 1", n_vocab);
    if (isnan(p->temperature) || isnan(p->top_p) || isnan(p->min_p) || isnan(p->presence_penalty) ||
        isnan(p->frequency_penalty) || isnan(p->repeat_penalty))
        return base_err(err, KEEL_EINVAL, "a sampler parameter is NaN");
    if (!(p->repeat_penalty > 0) || isinf(p->repeat_penalty))
        return base_err(err, KEEL_EINVAL, "repeat_penalty %g must be finite and > 0",
                        (double)p->repeat_penalty);
    if (p->penalty_last_n < 0)
        return base_err(err, KEEL_EINVAL, "penalty_last_n %d < 0", p->penalty_last_n);
    if (p->min_keep < 1) return base_err(err, KEEL_EINVAL, "min_keep %d < 1", p->min_keep);
    sampler *s = base_calloc(1, sizeof *s);
    if (!s) return base_err(err, KEEL_ENOMEM, "out of memory");
    s->p = *p;
    s->n_vocab = n_vocab;
    s->cand = base_alloc((size_t)n_vocab * sizeof *s->cand);
    s->counts = base_calloc((size_t)n_vocab, sizeof *s->counts);
    s->ring = p->penalty_last_n ? base_alloc((size_t)p->penalty_last_n * sizeof *s->ring) : NULL;
    if (!s->cand || !s->counts || (p->penalty_last_n && !s->ring)) {
        sampler_close(s);
        return base_err(err, KEEL_ENOMEM, "out of memory for %d candidates", n_vocab);
    }
    base_rng_seed(&s->rng, p->seed);
    *out = s;
    return KEEL_OK;
}

void sampler_close(sampler *s)
{
    if (!s) return;
    base_free(s->cand, (size_t)s->n_vocab * sizeof *s->cand);
    base_free(s->counts, (size_t)s->n_vocab * sizeof *s->counts);
    base_free(s->ring, (size_t)s->p.penalty_last_n * sizeof *s->ring);
    base_free(s, sizeof *s);
}

void sampler_reset(sampler *s)
{
    memset(s->counts, 0, (size_t)s->n_vocab * sizeof *s->counts);
    s->ring_head = s->ring_len = 0;
    base_rng_seed(&s->rng, s->p.seed);
}

keel_status sampler_accept(sampler *s, int32_t token)
{
    if (!s || token < 0 || token >= s->n_vocab) return KEEL_EINVAL;
    int32_t cap = s->p.penalty_last_n;
    if (cap == 0) return KEEL_OK;
    if (s->ring_len == cap) {
        s->counts[s->ring[s->ring_head]]--; /* the oldest leaves the window */
    } else {
        s->ring_len++;
    }
    s->ring[s->ring_head] = token;
    s->counts[token]++;
    s->ring_head = (s->ring_head + 1) % cap;
    return KEEL_OK;
}

/* ---- ordering ------------------------------------------------------------ */

/* a ranks before b: higher logit, then lower id */
static bool cand_before(const sampler_cand *a, const sampler_cand *b)
{
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

/* Min-heap on rank (the root ranks last) over v[0..n). */
static void sift_down_last(sampler_cand *v, size_t i, size_t n)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && cand_before(&v[m], &v[l])) m = l;
        if (r < n && cand_before(&v[m], &v[r])) m = r;
        if (m == i) return;
        sampler_cand t = v[i];
        v[i] = v[m];
        v[m] = t;
        i = m;
    }
}

/* Sorts v[0..n) best first: heap sort with the worst at the root, each
 * worst moved to the end of the shrinking heap. */
static void sort_best_first(sampler_cand *v, size_t n)
{
    for (size_t i = n / 2; i-- > 0;)
        sift_down_last(v, i, n);
    for (size_t end = n; end > 1; end--) {
        sampler_cand t = v[0];
        v[0] = v[end - 1];
        v[end - 1] = t;
        sift_down_last(v, 0, end - 1);
    }
}

/* Moves the k best of v[0..n) to v[0..k), sorted best first. O(n log k). */
static void select_top_k(sampler_cand *v, size_t n, size_t k)
{
    /* v[0..k) as a heap whose root ranks last among them */
    for (size_t i = k / 2; i-- > 0;)
        sift_down_last(v, i, k);
    for (size_t i = k; i < n; i++) {
        if (cand_before(&v[i], &v[0])) {
            sampler_cand t = v[0];
            v[0] = v[i];
            v[i] = t;
            sift_down_last(v, 0, k);
        }
    }
    sort_best_first(v, k);
}

/* p = softmax(logit) over v[0..n); v is sorted best first. */
static void softmax_sorted(sampler_cand *v, size_t n)
{
    float max = v[0].logit;
    double sum = 0;
    for (size_t i = 0; i < n; i++) {
        /* logit == max covers max = +inf (inf - inf would be NaN) */
        double e = v[i].logit == max ? 1.0 : exp((double)v[i].logit - (double)max);
        v[i].p = (float)e;
        sum += e;
    }
    for (size_t i = 0; i < n; i++)
        v[i].p = (float)(v[i].p / sum);
}

/* ---- the chain --------------------------------------------------------------- */

/* Fills the candidates with penalized logits. Returns how many, NaN and
 * -inf dropped; 0 when none is finite or +inf. */
static size_t load(sampler *s, const float *logits)
{
    const sampler_params *p = &s->p;
    bool penal =
        p->penalty_last_n > 0 && s->ring_len > 0 &&
        (p->repeat_penalty != 1.0f || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f);
    size_t n = 0;
    for (int32_t i = 0; i < s->n_vocab; i++) {
        float l = logits[i];
        if (penal && s->counts[i] > 0) {
            int32_t c = s->counts[i];
            l = l <= 0 ? l * p->repeat_penalty : l / p->repeat_penalty;
            l -= (float)c * p->frequency_penalty + p->presence_penalty;
        }
        if (isnan(l) || l == -INFINITY) continue;
        s->cand[n].id = i;
        s->cand[n].logit = l;
        s->cand[n].p = 0;
        n++;
    }
    return n;
}

/* The chain minus the draw; candidates best first with probabilities. */
static keel_status run_chain(sampler *s, const float *logits, size_t *n_out)
{
    const sampler_params *p = &s->p;
    size_t n = load(s, logits);
    if (n == 0) return KEEL_EINVAL;
    sampler_cand *v = s->cand;
    size_t keep_min = (size_t)p->min_keep;
    if (p->temperature <= 0) {
        size_t best = 0;
        for (size_t i = 1; i < n; i++)
            if (cand_before(&v[i], &v[best])) best = i;
        v[0] = v[best];
        v[0].p = 1.0f;
        *n_out = 1;
        return KEEL_OK;
    }
    size_t k = p->top_k > 0 ? BASE_MAX((size_t)p->top_k, keep_min) : n;
    if (k < n) {
        select_top_k(v, n, k);
        n = k;
    } else {
        sort_best_first(v, n);
    }
    softmax_sorted(v, n);
    if (p->top_p < 1.0f) {
        double cum = 0;
        for (size_t i = 0; i < n; i++) {
            cum += v[i].p;
            if (cum >= p->top_p && i + 1 >= keep_min) {
                n = i + 1;
                break;
            }
        }
    }
    if (p->min_p > 0.0f && n > 1) {
        /* p_i >= min_p * p_max  <=>  logit_i >= logit_max + log(min_p) */
        float min_logit = v[0].logit + logf(p->min_p);
        size_t kept = 1;
        while (kept < n && (v[kept].logit >= min_logit || kept < keep_min))
            kept++;
        n = kept;
    }
    for (size_t i = 0; i < n; i++)
        v[i].logit /= p->temperature;
    softmax_sorted(v, n);
    *n_out = n;
    return KEEL_OK;
}

keel_status sampler_candidates(sampler *s, const float *logits, const sampler_cand **out,
                               int64_t *n)
{
    if (!s || !logits || !out || !n) return KEEL_EINVAL;
    size_t k;
    keel_status st = run_chain(s, logits, &k);
    if (st) return st;
    *out = s->cand;
    *n = (int64_t)k;
    return KEEL_OK;
}

keel_status sampler_sample(sampler *s, const float *logits, int32_t *out)
{
    if (!s || !logits || !out) return KEEL_EINVAL;
    size_t n;
    keel_status st = run_chain(s, logits, &n);
    if (st) return st;
    if (n == 1) {
        *out = s->cand[0].id;
        return KEEL_OK;
    }
    double u = base_rng_uniform(&s->rng), cum = 0;
    for (size_t i = 0; i < n; i++) {
        cum += s->cand[i].p;
        if (u < cum) {
            *out = s->cand[i].id;
            return KEEL_OK;
        }
    }
    *out = s->cand[n - 1].id; /* rounding: the sum fell just short of u */
    return KEEL_OK;
}

keel_status sampler_sample_draft(sampler *s, const float *logits, int32_t draft, int32_t *out)
{
    if (!s || !logits || !out) return KEEL_EINVAL;
    size_t n;
    keel_status st = run_chain(s, logits, &n);
    if (st) return st;
    if (n == 1) {
        *out = s->cand[0].id;
        return KEEL_OK;
    }
    /* the draft's probability first: accepted with probability p(draft);
     * past it, the others in the chain's order, which draws the residual
     * p without the draft renormalized. One draw, distributed as p. */
    double pd = 0;
    for (size_t i = 0; i < n; i++)
        if (s->cand[i].id == draft) pd = s->cand[i].p;
    double u = base_rng_uniform(&s->rng);
    if (u < pd) {
        *out = draft;
        return KEEL_OK;
    }
    double cum = pd;
    size_t last = n;
    for (size_t i = 0; i < n; i++) {
        if (s->cand[i].id == draft) continue;
        cum += s->cand[i].p;
        last = i;
        if (u < cum) {
            *out = s->cand[i].id;
            return KEEL_OK;
        }
    }
    *out = s->cand[last < n ? last : 0].id; /* rounding: the sum fell just short of u */
    return KEEL_OK;
}
