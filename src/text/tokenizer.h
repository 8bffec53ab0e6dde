/*
 * tokenizer.h — private interface of src/text tokenizers: SentencePiece-BPE
 * ("llama", SPM) and byte-level BPE ("gpt2"), built from GGUF tokenizer
 * metadata, with llama.cpp's algorithms (docs/formats.md).
 *
 * GGUF keys read (tokenizer.ggml.*): model, tokens, scores, token_type,
 * merges, pre, bos/eos/eot/eom/unknown/seperator/padding_token_id,
 * add_bos_token, add_eos_token, add_space_prefix.
 *
 * Ownership and threads: a tokenizer copies everything it needs from the
 * gguf (the gguf may be closed afterwards) and is immutable after open, so
 * every function below may run on many threads at once. text_tokenize
 * allocates scratch per call (base_alloc, O(text length)); the piece and
 * decode functions allocate nothing.
 *
 * Errors: KEEL_EINVAL (bad argument, token id out of range), KEEL_ERANGE
 * (output buffer too small: the needed count is still reported),
 * KEEL_EFORMAT (malformed metadata, detail in err), KEEL_EUNSUPPORTED
 * (tokenizer model other than llama/gpt2), KEEL_ENOMEM. err, when not NULL,
 * receives a detail line of BASE_ERR_CAP bytes.
 */
#ifndef KEEL_TEXT_TOKENIZER_H
#define KEEL_TEXT_TOKENIZER_H

#include "../base/base.h"
#include "../model/gguf.h"

#define TEXT_TOKEN_NULL (-1)

typedef enum text_vocab_type {
    TEXT_VOCAB_SPM = 1, /* tokenizer.ggml.model "llama" */
    TEXT_VOCAB_BPE = 2, /* tokenizer.ggml.model "gpt2" */
} text_vocab_type;

/* tokenizer.ggml.token_type values (llama.cpp's llama_token_type). */
typedef enum text_token_type {
    TEXT_TOKEN_UNDEFINED = 0,
    TEXT_TOKEN_NORMAL = 1,
    TEXT_TOKEN_UNKNOWN = 2,
    TEXT_TOKEN_CONTROL = 3,
    TEXT_TOKEN_USER_DEFINED = 4,
    TEXT_TOKEN_UNUSED = 5,
    TEXT_TOKEN_BYTE = 6,
} text_token_type;

typedef struct text_tokenizer_info {
    text_vocab_type type;
    int32_t n_vocab;
    int64_t n_merges; /* BPE merges (0 for SPM) */
    /* special ids, TEXT_TOKEN_NULL when absent */
    int32_t bos, eos, eot, eom, unk, sep, pad;
    bool add_bos;          /* text_tokenize(add_special) prepends bos */
    bool add_eos;          /* ... and appends eos */
    bool add_space_prefix; /* SPM: a space before text that starts a fragment */
    bool ignore_merges;    /* BPE: whole pre-token words that are tokens skip merging */
    bool clean_spaces;     /* detokenize may apply TEXT_DECODE_CLEAN_SPACES */
    char pre[64];          /* tokenizer.ggml.pre as stored ("" if absent; truncated) */
    const char *pre_used;  /* BPE: the pre-tokenizer in use ("llama3", "gpt2", ...); static */
    bool pre_unknown;      /* BPE: pre missing or unrecognized; fell back to "gpt2".
                              Callers should log this: tokens may differ from the
                              model's training tokenizer. */
} text_tokenizer_info;

typedef struct text_tokenizer text_tokenizer;

/*
 * Builds a tokenizer from g's tokenizer.ggml.* keys. KEEL_ENOENT when
 * tokenizer.ggml.model or .tokens is missing ("missing key ..."),
 * KEEL_EUNSUPPORTED for models other than "llama"/"gpt2", KEEL_EFORMAT for
 * bad metadata (wrong types, array lengths that disagree, duplicate token
 * texts, a merge list missing for gpt2), KEEL_ENOMEM. *out is NULL on
 * failure.
 */
keel_status text_tokenizer_open(const gguf *g, text_tokenizer **out, char *err);
/* NULL is a no-op. */
void text_tokenizer_close(text_tokenizer *t);
/* Facts about the vocabulary; valid until close. */
const text_tokenizer_info *text_tokenizer_get_info(const text_tokenizer *t);

/*
 * Tokenizes len bytes of text (any bytes: invalid UTF-8 becomes byte
 * tokens). add_special: add BOS/EOS as the model asks (info.add_bos/eos).
 * parse_special: text equal to a CONTROL/UNKNOWN token becomes that token
 * (USER_DEFINED tokens are always matched, as in llama.cpp); longer
 * special texts are matched first.
 * Writes at most cap ids to out and sets *n_out to the full count; when
 * that exceeds cap returns KEEL_ERANGE (out holds the first cap ids), so
 * callers may query with cap 0 and out NULL. KEEL_ENOMEM for scratch.
 */
keel_status text_tokenize(const text_tokenizer *t, const char *text, size_t len, bool add_special,
                          bool parse_special, int32_t *out, int64_t cap, int64_t *n_out, char *err);

/* Decode flags. */
enum {
    TEXT_DECODE_REMOVE_SPECIAL = 1u << 0,  /* drop a leading BOS / trailing EOS the model adds */
    TEXT_DECODE_UNPARSE_SPECIAL = 1u << 1, /* render CONTROL/UNKNOWN tokens as their text */
    TEXT_DECODE_KEEP_SPACE = 1u << 2,      /* SPM: keep the leading space of the first piece */
    TEXT_DECODE_CLEAN_SPACES = 1u << 3,    /* " ." -> "." etc. when info.clean_spaces */
};

/*
 * The text of one token (SPM: U+2581 -> ' ', "<0xHH>" -> that byte; BPE:
 * GPT-2 byte map reversed). special: render CONTROL/UNKNOWN tokens as their
 * text (otherwise they yield nothing). Writes at most cap bytes, sets *n_out
 * to the piece length; KEEL_ERANGE when it exceeds cap, KEEL_EINVAL for an
 * id outside [0, n_vocab). No NUL is written.
 */
keel_status text_token_to_piece(const text_tokenizer *t, int32_t id, bool special, char *buf,
                                size_t cap, size_t *n_out);

/*
 * The text of n ids with TEXT_DECODE_* flags. SPM: the leading space of
 * the first rendered piece is removed (the one text_tokenize added) unless
 * TEXT_DECODE_KEEP_SPACE. Writes at most cap bytes and sets *n_out to the
 * full length (KEEL_ERANGE when larger than cap). KEEL_EINVAL "token id 600
 * at position 3 out of range [0, 512)" for a bad id (nothing is written).
 */
keel_status text_detokenize(const text_tokenizer *t, const int32_t *ids, int64_t n, unsigned flags,
                            char *buf, size_t cap, size_t *n_out, char *err);

/*
 * Streaming decoder: feed generated ids one at a time; it returns only
 * whole UTF-8 characters, holding back a character whose bytes are split
 * across tokens (SPM byte tokens, BPE byte pieces). Bytes that cannot form
 * a valid character are passed through unchanged. A plain struct, no
 * allocation; one stream per thread.
 */
typedef struct text_stream {
    const text_tokenizer *t;
    unsigned flags;  /* TEXT_DECODE_* (REMOVE_SPECIAL is ignored) */
    bool first;      /* no piece rendered yet (for the leading-space rule) */
    uint8_t pend[4]; /* an incomplete UTF-8 sequence held back */
    int n_pend;
} text_stream;

/* Starts a stream at the start of a text. For a continuation of earlier
 * text use text_stream_init_after (or pass TEXT_DECODE_KEEP_SPACE). */
void text_stream_init(text_stream *s, const text_tokenizer *t, unsigned flags);
/*
 * Starts a stream that continues the text of prev[0..n_prev) (a prompt, or
 * everything decoded so far): SPM's leading-space rule applies to the first
 * piece of a text only, so it applies here only if none of prev renders
 * text (e.g. prev is just BOS). Then text_detokenize(prev) followed by the
 * stream's output equals text_detokenize(prev + pushed ids) byte for byte
 * (same flags; CLEAN_SPACES aside). KEEL_EINVAL for an id of prev out of
 * range; the stream is then initialized as by text_stream_init. O(n_prev),
 * no allocation.
 */
keel_status text_stream_init_after(text_stream *s, const text_tokenizer *t, unsigned flags,
                                   const int32_t *prev, int64_t n_prev);
/*
 * Renders id and writes the complete characters now available (at most
 * cap bytes; text_tokenizer_max_piece(t) + 4 always suffices). KEEL_ERANGE
 * (stream unchanged, *n_out = bytes needed) when cap is too small,
 * KEEL_EINVAL for a bad id.
 */
keel_status text_stream_push(text_stream *s, int32_t id, char *buf, size_t cap, size_t *n_out);
/* Emits any held-back bytes (at most 4) and resets the hold. */
keel_status text_stream_flush(text_stream *s, char *buf, size_t cap, size_t *n_out);

/* GPT-2 byte-level BPE's byte-to-code-point map: writes the UTF-8 (1 or 2
 * bytes) of the code point standing for byte b in gpt2 vocabularies and
 * returns its length. */
size_t text_gpt2_byte_utf8(uint8_t b, char *out);

/* Longest piece any token renders to (bytes), for sizing stream buffers. */
size_t text_tokenizer_max_piece(const text_tokenizer *t);

/* ---- vocabulary lookups (no allocation) --------------------------------- */

/* Raw vocabulary text of id (NUL-terminated, as stored, e.g. "\u2581the"),
 * or NULL for a bad id; *len (may be NULL) gets its length. */
const char *text_token_text(const text_tokenizer *t, int32_t id, size_t *len);
/* Score (0 if the vocab has none) and type of id; 0 / UNDEFINED for a bad id. */
float text_token_score(const text_tokenizer *t, int32_t id);
text_token_type text_token_get_type(const text_tokenizer *t, int32_t id);
/* Id whose vocabulary text is exactly s[0..n), or TEXT_TOKEN_NULL. */
int32_t text_token_find(const text_tokenizer *t, const char *s, size_t n);
/* End of generation: eos, eot, eom and tokens such as "<|im_end|>". */
bool text_token_is_eog(const text_tokenizer *t, int32_t id);

#endif /* KEEL_TEXT_TOKENIZER_H */
