/*
 * eng_cost.c — what a decode-only step of the engine costs against the
 * tokens in its batch (one per generating slot, plus their drafts):
 * T(n) = f + u n, fitted by least squares over the engine's own
 * decode-only steps, each older step's weight multiplied by
 * ENG_COST_DECAY per new one (so the line follows the contexts as they
 * grow). f is what a step pays whatever it holds (the weights read once,
 * the calls), u what one more token adds (its products and attention).
 *
 * Two users (docs/engine.md, "Steps" and "Speculative decoding"):
 *   - the prefill budget: the decode-only reference of the generating
 *     slots (n_gen tokens) and what a mixed step's prefill added to its
 *     decode tokens, drafts included (it used to keep one average for one
 *     token count, which drafts changed at every step: the budget then
 *     stayed at 0 and a prompt waited for every drafting stream to end);
 *   - speculative decoding: each slot's share of a step (eng_cost_share),
 *     so that the back-off of one slot is not timed on the others' work.
 *
 * While every step held about the same number of tokens the slope is
 * unknown and the line is flat at their mean time (u = 0): a stream that
 * drafts four tokens at every step has only ever been timed with five,
 * and its decode-only step is that one. A new count then soon teaches the
 * slope (the prefill budget asks for a decode-only step every
 * ENG_PF_REFRESH mixed ones, and a step that runs long puts the budget in
 * debt, which decode-only steps pay back).
 */
#include "eng.h"

#define ENG_COST_DECAY   0.95 /* weight of the past per new step */
#define ENG_COST_VAR_MIN 0.05 /* least variance of the token counts for a slope */

void eng_cost_add(eng_cost *c, int32_t n, double ns)
{
    if (n <= 0 || !(ns > 0)) return;
    /* a step slowed by something else (another process, a page fault)
     * counts as at most twice the prediction */
    double p = eng_cost_at(c, n);
    if (p > 0 && ns > 2.0 * p) ns = 2.0 * p;
    double x = (double)n;
    c->w = ENG_COST_DECAY * c->w + 1.0;
    c->sn = ENG_COST_DECAY * c->sn + x;
    c->snn = ENG_COST_DECAY * c->snn + x * x;
    c->st = ENG_COST_DECAY * c->st + ns;
    c->snt = ENG_COST_DECAY * c->snt + x * ns;
}

bool eng_cost_line(const eng_cost *c, double *f, double *u)
{
    *f = *u = 0;
    if (c->w <= 0) return false;
    double nm = c->sn / c->w, tm = c->st / c->w, var = c->snn / c->w - nm * nm;
    if (var < ENG_COST_VAR_MIN) {
        *f = tm;
        return false;
    }
    /* the slope within [0, tm / nm]: a token never pays back time, and f
     * is never negative */
    double s = (c->snt / c->w - nm * tm) / var;
    s = s < 0 ? 0 : s > tm / nm ? tm / nm : s;
    *u = s;
    *f = tm - s * nm;
    return true;
}

double eng_cost_at(const eng_cost *c, int32_t n)
{
    double f, u;
    bool sloped = eng_cost_line(c, &f, &u);
    return sloped ? f + u * (double)n : f; /* flat: the mean */
}

double eng_cost_share(const eng_cost *c, double ns, int32_t n_seq, int32_t n_tok, int32_t k)
{
    if (n_seq <= 1) return ns;
    double f, u;
    /* an unknown slope: an equal split */
    if (!eng_cost_line(c, &f, &u)) return ns / (double)n_seq;
    double whole = f + u * (double)n_tok;
    if (!(whole > 0)) return ns / (double)n_seq;
    return ns * (f / (double)n_seq + u * (double)(1 + k)) / whole;
}
