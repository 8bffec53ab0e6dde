/*
 * sampler.h — private interface of src/sample: a fixed sampler chain over
 * one row of logits, in llama.cpp's default order:
 *
 *   penalties (repeat / presence / frequency over the last N accepted tokens)
 *   -> top_k -> top_p -> min_p -> temperature -> draw
 *
 * with temperature <= 0 meaning greedy (argmax of the penalized logits,
 * ties to the lowest id). Draws use base_rng (xoshiro256**) seeded from
 * params.seed: the same seed, logits and accepted tokens give the same
 * tokens on every machine.
 *
 * Memory: sampler_open allocates every working array once (candidates and
 * token counts sized n_vocab, the history ring sized penalty_last_n);
 * sampler_sample, sampler_candidates, sampler_accept and sampler_reset
 * allocate nothing. A sampler is used by one thread at a time.
 */
#ifndef KEEL_SAMPLE_SAMPLER_H
#define KEEL_SAMPLE_SAMPLER_H

#include "../base/base.h"

typedef struct sampler_params {
    float temperature;       /* <= 0: greedy; else logits / temperature before the draw */
    int32_t top_k;           /* keep the k highest logits; <= 0 or >= n_vocab: off */
    float top_p;             /* keep the smallest set of mass >= top_p; >= 1: off */
    float min_p;             /* keep p >= min_p * p_max; <= 0: off */
    float repeat_penalty;    /* > 0; seen tokens: logit / r if > 0, logit * r if <= 0; 1: off */
    int32_t penalty_last_n;  /* accepted tokens the penalties look at; 0: off */
    float presence_penalty;  /* subtracted once from every seen token's logit */
    float frequency_penalty; /* subtracted count times */
    int32_t min_keep;        /* top_k/top_p/min_p keep at least this many (>= 1) */
    uint64_t seed;           /* draw stream */
} sampler_params;

/* llama.cpp's defaults: temperature 0.8, top_k 40, top_p 0.95, min_p 0.05,
 * repeat_penalty 1 (off), penalty_last_n 64, presence/frequency 0,
 * min_keep 1, seed 0x5eed. */
sampler_params sampler_params_default(void);

/* One candidate after the chain: id, (penalized, scaled) logit and its
 * probability among the kept candidates. */
typedef struct sampler_cand {
    int32_t id;
    float logit;
    float p;
} sampler_cand;

typedef struct sampler sampler;

/*
 * Creates a sampler for a vocabulary of n_vocab tokens. KEEL_EINVAL (detail
 * in err) for n_vocab < 1, a NaN parameter, repeat_penalty <= 0,
 * penalty_last_n < 0, min_keep < 1; KEEL_ENOMEM. *out is NULL on failure.
 */
keel_status sampler_open(const sampler_params *p, int32_t n_vocab, sampler **out, char *err);
/* NULL is a no-op. */
void sampler_close(sampler *s);

/*
 * Picks a token from logits[0..n_vocab) (not modified). KEEL_EINVAL when
 * no logit is finite (all NaN / -inf). Allocation-free. The token is not
 * added to the history: call sampler_accept for what is actually used.
 */
keel_status sampler_sample(sampler *s, const float *logits, int32_t *out);

/*
 * Runs the chain without the draw and exposes the kept candidates, most
 * likely first, probabilities summing to 1 (after temperature; for greedy
 * one candidate with p = 1). The array is owned by the sampler and valid
 * until the next call. KEEL_EINVAL as sampler_sample.
 */
keel_status sampler_candidates(sampler *s, const float *logits, const sampler_cand **out,
                               int64_t *n);

/*
 * Speculative sampling of a position whose drafted token is draft (a point
 * mass: drafts are proposed, not sampled from a distribution the verifier
 * knows). The standard acceptance rule for such a draft: accepted with
 * probability p(draft) under the chain, else a token drawn from p without
 * the draft, renormalized. The token is distributed exactly as
 * sampler_sample's; *out == draft means accepted. Greedy: the argmax.
 * Errors and allocation as sampler_sample.
 */
keel_status sampler_sample_draft(sampler *s, const float *logits, int32_t draft, int32_t *out);

/* Adds token to the penalty history. KEEL_EINVAL for an id outside
 * [0, n_vocab) (history unchanged). */
keel_status sampler_accept(sampler *s, int32_t token);

/* Clears the history and restarts the draw stream from the seed. */
void sampler_reset(sampler *s);

#endif /* KEEL_SAMPLE_SAMPLER_H */
