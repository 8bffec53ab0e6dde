/*
 * tok_int.h — internals shared by the tokenizer files (vocab.c, spm.c,
 * bpe.c, tokenize.c). Not for other modules: use tokenizer.h.
 */
#ifndef KEEL_TEXT_TOK_INT_H
#define KEEL_TEXT_TOK_INT_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tokenizer.h"

#define TOK_MAX_REGEX 8 /* pre-tokenizer regexes applied in sequence */

typedef struct tok_entry {
    uint32_t off; /* text in blob (NUL-terminated) */
    uint32_t len; /* text bytes */
    float score;
    uint8_t type; /* text_token_type */
    uint8_t eog;  /* ends generation */
    int16_t byte; /* BYTE tokens "<0xHH>": the byte value; else -1 */
} tok_entry;

typedef struct tok_merge {
    uint32_t off; /* left text then right text in mblob (no space) */
    uint32_t left_len;
    uint32_t right_len;
} tok_merge;

struct text_tokenizer {
    text_tokenizer_info info;
    char *blob; /* [blob_bytes] token texts, each NUL-terminated */
    size_t blob_bytes;
    tok_entry *tok;        /* [n_vocab] */
    uint32_t *index;       /* [index_cap] text -> id + 1 (0 empty), open addressing */
    size_t index_cap;      /* power of two >= 2 n_vocab */
    int32_t byte_tok[256]; /* token that encodes byte b alone, or TEXT_TOKEN_NULL */
    int32_t *special;      /* [n_special] CONTROL/USER_DEFINED/UNKNOWN ids, longest text first */
    int32_t n_special;
    size_t max_piece; /* longest piece (bytes) */
    /* BPE only */
    char *mblob; /* [mblob_bytes] merge texts */
    size_t mblob_bytes;
    tok_merge *merges; /* [n_merges], index = rank */
    uint32_t *mindex;  /* [mindex_cap] (left, right) -> rank + 1 */
    size_t mindex_cap;
    pcre2_general_context *gctx; /* routes PCRE2 memory through base_alloc */
    pcre2_code *re[TOK_MAX_REGEX];
    int n_re;
};

/* Output ids: writes while n < cap, counts always. */
typedef struct tok_out {
    int32_t *ids;
    int64_t cap;
    int64_t n;
} tok_out;

static inline void tok_emit(tok_out *o, int32_t id)
{
    if (o->n < o->cap) o->ids[o->n] = id;
    o->n++;
}

/* Byte length of the UTF-8 sequence led by c, as llama.cpp counts it
 * (continuation and 0xF8.. bytes included: 1, 1, 2, 3, 4 by high nibble). */
static inline size_t tok_utf8_len(uint8_t c)
{
    static const uint8_t lookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lookup[c >> 4];
}

/*
 * Length of the character at s[0..n): the UTF-8 sequence length when it is
 * well-formed, else 1 (one malformed byte). For valid text this equals
 * llama.cpp's split; for malformed bytes llama.cpp would swallow following
 * bytes (an escaped space, say) into the bad "character" and lose them to
 * byte fallback, so keel splits them off one by one and round-trips.
 */
static inline size_t tok_char_len(const uint8_t *s, size_t n)
{
    size_t len = base_utf8_len(s, n);
    return len ? len : 1;
}

/* Id of the token whose text is s[0..n), or TEXT_TOKEN_NULL (vocab.c). */
int32_t tok_lookup(const text_tokenizer *t, const char *s, size_t n);
static inline const char *tok_text(const text_tokenizer *t, int32_t id)
{
    return t->blob + t->tok[id].off;
}

/* SPM: tokenizes one raw fragment (spaces escaped inside; prefix_space adds
 * the leading space first). KEEL_ENOMEM only. (spm.c) */
keel_status spm_encode(const text_tokenizer *t, const char *text, size_t len, bool prefix_space,
                       tok_out *o);

/* BPE: loads merges and compiles the pre-tokenizer chosen by info.pre
 * (bpe.c); frees them. */
keel_status bpe_init(text_tokenizer *t, const gguf *g, char *err);
void bpe_free(text_tokenizer *t);
/* BPE: tokenizes one raw fragment. KEEL_ENOMEM only. */
keel_status bpe_encode(const text_tokenizer *t, const char *text, size_t len, tok_out *o);
/* GPT-2 byte <-> code point map. */
uint32_t bpe_byte_to_cp(uint8_t b);
/* Byte for code point cp, or -1 when cp is not in the map. */
int bpe_cp_to_byte(uint32_t cp);

#endif /* KEEL_TEXT_TOK_INT_H */
