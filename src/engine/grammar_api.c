/*
 * grammar_api.c — keel.h's constrained decoding (keel_grammar_*): thin
 * wrappers over src/grammar, and the vocabulary of a model as the grammar
 * engine sees it: each token's bytes as it renders in generated text
 * (SPM's U+2581 as a space, byte tokens as their byte, GPT-2's byte map
 * reversed), control and unused tokens with no bytes (they never match
 * text), and the model's end-of-generation tokens, allowed exactly when
 * the grammar is complete. A tool-call grammar's vocabulary also gives the
 * control tokens that are its markers ([TOOL_CALLS], <|tool_call_begin|>,
 * ...) their text, so that the model can write a marker as the one token
 * it was trained to use.
 */
#include "engine.h"

#include "../grammar/grammar.h"

#include <string.h>

struct keel_grammar {
    gram *g;
};

struct keel_grammar_vocab {
    gram_vocab *v;
};

struct keel_grammar_matcher {
    gram_matcher *m;
};

keel_status keel_grammar_compile(const char *gbnf, size_t len, keel_grammar **out, char *err)
{
    if (!out) return base_err(err, KEEL_EINVAL, "out is NULL");
    *out = NULL;
    keel_grammar *k = base_calloc(1, sizeof *k);
    if (!k) return base_err(err, KEEL_ENOMEM, "out of memory");
    keel_status st = gram_compile(gbnf, len, &k->g, err);
    if (st) {
        base_free(k, sizeof *k);
        return st;
    }
    *out = k;
    return KEEL_OK;
}

keel_status keel_grammar_compile_schema(const char *schema_json, size_t len, keel_grammar **out, char *err)
{
    if (!out) return base_err(err, KEEL_EINVAL, "out is NULL");
    *out = NULL;
    keel_grammar *k = base_calloc(1, sizeof *k);
    if (!k) return base_err(err, KEEL_ENOMEM, "out of memory");
    keel_status st = gram_compile_schema(schema_json, len, &k->g, err);
    if (st) {
        base_free(k, sizeof *k);
        return st;
    }
    *out = k;
    return KEEL_OK;
}

void keel_grammar_close(keel_grammar *g)
{
    if (!g) return;
    gram_free(g->g);
    base_free(g, sizeof *g);
}

keel_status keel_grammar_accepts_nothing(const keel_grammar *g, bool *empty, char *err)
{
    if (!g || !empty) return base_err(err, KEEL_EINVAL, "bad arguments");
    return gram_accepts_nothing(g->g, empty, err);
}

keel_status keel_grammar_match(const keel_grammar *g, const char *text, size_t len, bool *accepted, char *err)
{
    if (!g || !accepted || (!text && len)) return base_err(err, KEEL_EINVAL, "bad arguments");
    *accepted = false;
    gram_matcher *m = NULL;
    keel_status st = gram_matcher_open(g->g, NULL, NULL, &m, err);
    if (st) return st;
    st = gram_matcher_accept_bytes(m, (const uint8_t *)text, len, NULL);
    if (st == KEEL_OK) {
        *accepted = gram_matcher_complete(m);
    } else if (st == KEEL_EINVAL) {
        st = KEEL_OK; /* a byte that cannot follow: rejected */
    } else {
        base_err(err, st, "%s", gram_matcher_error(m));
    }
    gram_matcher_close(m);
    return st;
}

/* A control token's text is one of markers (NULL-terminated; may be NULL). */
static bool is_marker(const text_tokenizer *t, int32_t id, const char *const *markers, char *buf, size_t cap)
{
    size_t k = 0;
    if (!markers || text_token_to_piece(t, id, true, buf, cap, &k) != KEEL_OK || k == 0) return false;
    for (const char *const *m = markers; *m; m++)
        if (strlen(*m) == k && memcmp(*m, buf, k) == 0) return true;
    return false;
}

keel_status engine_grammar_vocab(const keel_model *model, gram_vocab **out, char *err)
{
    return engine_grammar_vocab_marked(model, NULL, out, err);
}

keel_status engine_grammar_vocab_marked(const keel_model *model, const char *const *markers, gram_vocab **out,
                                        char *err)
{
    if (!out) return base_err(err, KEEL_EINVAL, "out is NULL");
    *out = NULL;
    if (!model) return base_err(err, KEEL_EINVAL, "model is NULL");
    const text_tokenizer *t = model->tok;
    int32_t n = text_tokenizer_get_info(t)->n_vocab;
    size_t cap = text_tokenizer_max_piece(t) + 1, total = 0;
    char *buf = base_alloc(cap);
    size_t *len = base_calloc((size_t)n, sizeof *len);
    const uint8_t **piece = base_calloc((size_t)n, sizeof *piece);
    int32_t *eog = base_alloc((size_t)n * sizeof *eog), n_eog = 0;
    uint8_t *all = NULL;
    keel_status st = KEEL_OK;
    if (!buf || !len || !piece || !eog) {
        st = base_err(err, KEEL_ENOMEM, "out of memory");
        goto out;
    }
    for (int pass = 0; pass < 2 && !st; pass++) {
        size_t o = 0;
        for (int32_t i = 0; i < n; i++) {
            text_token_type ty = text_token_get_type(t, i);
            size_t k = 0;
            if (ty != TEXT_TOKEN_CONTROL && ty != TEXT_TOKEN_UNKNOWN && ty != TEXT_TOKEN_UNUSED) {
                if ((st = text_token_to_piece(t, i, false, buf, cap, &k)) != KEEL_OK) {
                    base_err(err, st, "token %d: no piece", i);
                    break;
                }
            } else if (ty == TEXT_TOKEN_CONTROL && !text_token_is_eog(t, i) && is_marker(t, i, markers, buf, cap)) {
                /* a marker of the grammar that the model writes as one special token */
                if ((st = text_token_to_piece(t, i, true, buf, cap, &k)) != KEEL_OK) {
                    base_err(err, st, "token %d: no piece", i);
                    break;
                }
            }
            if (pass == 0) {
                len[i] = k;
                total += k;
                if (text_token_is_eog(t, i)) eog[n_eog++] = i;
            } else {
                memcpy(all + o, buf, k);
                piece[i] = all + o;
                o += k;
            }
        }
        if (pass == 0 && !st && !(all = base_alloc(total + 1))) st = base_err(err, KEEL_ENOMEM, "out of memory");
    }
    if (!st) st = gram_vocab_build(n, piece, len, eog, n_eog, out, err);
out:
    base_free(all, total + 1);
    base_free(buf, cap);
    base_free(len, (size_t)n * sizeof *len);
    base_free(piece, (size_t)n * sizeof *piece);
    base_free(eog, (size_t)n * sizeof *eog);
    return st;
}

keel_status engine_grammar_vocab_open_marked(const keel_model *model, const char *const *markers,
                                             keel_grammar_vocab **out, char *err)
{
    if (!out) return base_err(err, KEEL_EINVAL, "out is NULL");
    *out = NULL;
    keel_grammar_vocab *v = base_calloc(1, sizeof *v);
    if (!v) return base_err(err, KEEL_ENOMEM, "out of memory");
    keel_status st = engine_grammar_vocab_marked(model, markers, &v->v, err);
    if (st) {
        base_free(v, sizeof *v);
        return st;
    }
    *out = v;
    return KEEL_OK;
}

keel_status keel_grammar_vocab_open(const keel_model *model, keel_grammar_vocab **out, char *err)
{
    if (!out) return base_err(err, KEEL_EINVAL, "out is NULL");
    *out = NULL;
    keel_grammar_vocab *v = base_calloc(1, sizeof *v);
    if (!v) return base_err(err, KEEL_ENOMEM, "out of memory");
    keel_status st = engine_grammar_vocab(model, &v->v, err);
    if (st) {
        base_free(v, sizeof *v);
        return st;
    }
    *out = v;
    return KEEL_OK;
}

void keel_grammar_vocab_close(keel_grammar_vocab *v)
{
    if (!v) return;
    gram_vocab_free(v->v);
    base_free(v, sizeof *v);
}

keel_status keel_grammar_matcher_open(const keel_grammar *g, const keel_grammar_vocab *v, keel_grammar_matcher **out,
                                      char *err)
{
    if (!out) return base_err(err, KEEL_EINVAL, "out is NULL");
    *out = NULL;
    if (!g || !v) return base_err(err, KEEL_EINVAL, "grammar or vocabulary is NULL");
    keel_grammar_matcher *k = base_calloc(1, sizeof *k);
    if (!k) return base_err(err, KEEL_ENOMEM, "out of memory");
    keel_status st = gram_matcher_open(g->g, v->v, NULL, &k->m, err);
    if (st) {
        base_free(k, sizeof *k);
        return st;
    }
    *out = k;
    return KEEL_OK;
}

void keel_grammar_matcher_close(keel_grammar_matcher *m)
{
    if (!m) return;
    gram_matcher_close(m->m);
    base_free(m, sizeof *m);
}

keel_status keel_grammar_matcher_apply(keel_grammar_matcher *m, float *logits)
{
    if (!m || !logits) return KEEL_EINVAL;
    return gram_matcher_apply(m->m, logits);
}

keel_status keel_grammar_matcher_accept(keel_grammar_matcher *m, int32_t token)
{
    if (!m) return KEEL_EINVAL;
    return gram_matcher_accept_token(m->m, token);
}

bool keel_grammar_matcher_complete(const keel_grammar_matcher *m)
{
    return m && gram_matcher_complete(m->m);
}

bool keel_grammar_matcher_done(const keel_grammar_matcher *m)
{
    return m && gram_matcher_done(m->m);
}

void engine_grammar_token_bytes(const keel_grammar_vocab *v, int32_t tok, const char **bytes, size_t *n)
{
    *bytes = NULL;
    *n = 0;
    if (!v || tok < 0 || tok >= v->v->n_vocab) return;
    *bytes = (const char *)v->v->bytes + v->v->off[tok];
    *n = v->v->off[tok + 1] - v->v->off[tok];
}

keel_status engine_grammar_matcher_feed(keel_grammar_matcher *m, const char *s, size_t n)
{
    if (!m || (!s && n)) return KEEL_EINVAL;
    return gram_matcher_accept_bytes(m->m, (const uint8_t *)s, n, NULL);
}

keel_status keel_grammar_matcher_reset(keel_grammar_matcher *m)
{
    if (!m) return KEEL_EINVAL;
    return gram_matcher_reset(m->m);
}

const char *keel_grammar_matcher_last_error(const keel_grammar_matcher *m)
{
    return m ? gram_matcher_error(m->m) : "";
}
