/*
 * engine.h — private interface of src/engine: the public keel_model and
 * keel_context objects, built from the model runtime (src/model), the
 * memory core (src/memory), tokenizers (src/text) and samplers (src/sample).
 */
#ifndef KEEL_ENGINE_H
#define KEEL_ENGINE_H

#include "../model/model.h"
#include "../sample/sampler.h"
#include "../text/tokenizer.h"

struct keel_model {
    gguf *g;               /* mapped file (or converted llama2.c checkpoint) */
    model_w w;
    text_tokenizer *tok;
    size_t file_bytes;
    bool weights_read; /* in memory (read, or a converted checkpoint), not mapped */
    char name[128];
};

struct keel_context {
    const keel_model *model;
    keel_context_params p;
    base_pool *pool;
    keel_mem *mem;
    base_arena work;       /* forward-pass activations and matmul scratch */
    float *logits;         /* [n_outputs][n_vocab] */
    size_t logits_bytes;
    int32_t *out_row;      /* [n_batch] token -> logits row or -1 */
    int32_t *ub_tok, *ub_pos, *ub_seq, *ub_cells, *ub_out; /* per-ubatch views */
    size_t small_bytes;    /* out_row + ubatch arrays */
    int32_t n_groups;
    int32_t n_last;        /* tokens of the last keel_decode batch */
    keel_compact_params *compact; /* [n_seq_max] per-sequence compaction */
    uint8_t *ub_prot;      /* [n_batch] protected tokens (special ids) */
    keel_plan plan;
    /* the last keel_decode_spec batch (rewinds into it decode its accepted
     * tokens again on recurrent models) */
    int32_t *spec_tok, *spec_seq, *spec_pos; /* [n_batch]; spec_seq -1: rewound already */
    int32_t *re_tok, *re_seq;                /* [n_batch] a rewind's tokens to decode again */
    int32_t spec_n;        /* its tokens; 0: the last batch was not speculative */
    atomic_int cancel;     /* keel_cancel (any thread) -> the running forward pass */
    char err[BASE_ERR_CAP];
};

/* Benchmarks (spec.c): s drafts the known continuation ref[0..n_ref) of a
 * prompt of n_prompt tokens, each token right with probability rate (else
 * a neighbouring id).
 * ref must outlive the drafting. */
/* The draft model's context (its plan is part of the engine's), or NULL. */
const keel_context *spec_draft_context(const keel_spec *s);
void spec_set_oracle(keel_spec *s, const int32_t *ref, int32_t n_ref, int32_t n_prompt, double rate, uint64_t seed);

/* keel_session_load with the slots' rule (session_api.c): with
 * need_history a sequence that holds cells must come with the token history
 * they hold (an empty history is refused, KEEL_EFORMAT). */
keel_status engine_session_load(keel_context *c, int32_t seq, const char *path, unsigned flags, bool need_history,
                                int32_t *tokens, int32_t cap, int32_t *n_tokens, int32_t *n_pending);

/* The vocabulary of m as constrained decoding sees it (grammar_api.c):
 * each token's bytes as generated text renders them, none for control,
 * unknown and unused tokens, the end-of-generation ids. */
struct gram_vocab;
keel_status engine_grammar_vocab(const keel_model *m, struct gram_vocab **out, char *err);
/* The same, where the control tokens whose text is one of markers
 * (NULL-terminated; end-of-generation tokens aside) have their text as
 * bytes: a tool-call grammar's markers written as the model's special
 * tokens. keel_grammar_vocab_open's, with markers. */
keel_status engine_grammar_vocab_marked(const keel_model *m, const char *const *markers, struct gram_vocab **out,
                                        char *err);
keel_status engine_grammar_vocab_open_marked(const keel_model *m, const char *const *markers,
                                             keel_grammar_vocab **out, char *err);
/* Feeds n bytes of text to a matcher (grammar_api.c): a lazy grammar's
 * trigger and what followed it. KEEL_EINVAL when a byte cannot follow (the
 * state is then unchanged), KEEL_ERANGE past a cap. */
keel_status engine_grammar_matcher_feed(keel_grammar_matcher *m, const char *s, size_t n);
/* Token tok's bytes as the grammar vocabulary holds them (*n 0 for control,
 * unknown and unused tokens, or an id out of range): a pointer into v. */
void engine_grammar_token_bytes(const keel_grammar_vocab *v, int32_t tok, const char **bytes, size_t *n);

/* KEEL_LOAD_AUTO's choice for a model file of `bytes`: read it into memory
 * when transparent huge pages are given on request (thp_enabled, the line
 * of /sys/kernel/mm/transparent_hugepage/enabled, selects [always] or
 * [madvise]) and it takes at most a quarter of mem_avail_kib (MemAvailable);
 * else map it. */
bool engine_load_reads(const char *thp_enabled, unsigned long long mem_avail_kib, size_t bytes);

#endif
