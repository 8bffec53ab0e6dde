/*
 * eval_compaction.h — private to `keel eval-compaction`: the validated
 * options shared by its two tasks (perplexity in cmd_eval_compaction.c,
 * retrieval in eval_retrieval.c).
 */
#ifndef KEEL_EVAL_COMPACTION_H
#define KEEL_EVAL_COMPACTION_H

#include "cli.h"

#define EV_LIST_MAX 16    /* entries of --budgets / --policies */
#define EV_BUDGET_MIN 8
#define EV_BUDGET_MAX 65536
#define EV_CHUNK_MAX 4096
#define EV_DOCS_MAX 100000
#define EV_DOC_TOKENS_MIN 32
#define EV_DOC_TOKENS_MAX 65536
#define EV_CALIB_DOCS_MAX 1000

/* All values validated (ranges above) before the model is opened. */
typedef struct ev_opts {
    bool retrieval;                                /* --task retrieval */
    int32_t budgets[EV_LIST_MAX];                  /* --budgets, each in [EV_BUDGET_MIN, EV_BUDGET_MAX] */
    int n_budgets;                                 /* >= 1 */
    keel_compact_policy policies[EV_LIST_MAX];     /* --policies, never KEEL_COMPACT_NONE */
    int n_policies;                                /* >= 1 */
    int32_t chunk;                                 /* --chunk: prefill chunk, [1, EV_CHUNK_MAX] */
    int32_t docs;                                  /* --docs: retrieval documents */
    int32_t doc_tokens;                            /* --doc-tokens: retrieval document length */
    uint64_t doc_seed;                             /* --doc-seed: document i uses doc_seed + i */
    int32_t calib_docs;                            /* --calib-docs: calibration documents per needle */
} ev_opts;

/* The compaction of budget b under policy p with the user's sinks, recent
 * share, seed and positions (trigger b, target b/2). */
keel_compact_params ev_compact_params(const cli_opts *o, keel_compact_policy p, int32_t budget,
                                      bool renumber);

/* log-softmax of logits l [V] into out [V] (double-precision sums). */
void ev_log_softmax(const float *l, int32_t V, float *out);

/* The retrieval task: prints its tables; returns the exit code. */
int ev_retrieval(keel_model *m, const cli_opts *o, const ev_opts *e);

#endif
