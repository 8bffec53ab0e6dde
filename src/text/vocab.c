/*
 * vocab.c — the tokenizer object: loading the vocabulary from GGUF
 * metadata, text -> id lookup, special-token lists, and everything that
 * turns ids back into text (pieces, detokenize, the streaming decoder).
 *
 * Owns: one blob of token texts (copied, so the gguf may close), the token
 * table, an open-addressing index text -> id, the special-token list, and
 * (through bpe.c) merges and compiled regexes. Immutable after open.
 * Invariants: token texts are unique and non-empty (empty ones are renamed
 * "[EMPTY_<id>]" as llama.cpp does); every special id is in range or
 * TEXT_TOKEN_NULL.
 */
#include "tok_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* ---- lookup ---------------------------------------------------------------- */

static uint64_t text_hash(const char *s, size_t n)
{
    return base_hash64(s, n, 0x746f6b656eull);
}

int32_t tok_lookup(const text_tokenizer *t, const char *s, size_t n)
{
    size_t mask = t->index_cap - 1, i = (size_t)text_hash(s, n) & mask;
    while (t->index[i]) {
        const tok_entry *e = &t->tok[t->index[i] - 1];
        if (e->len == n && memcmp(t->blob + e->off, s, n) == 0) return (int32_t)t->index[i] - 1;
        i = (i + 1) & mask;
    }
    return TEXT_TOKEN_NULL;
}

int32_t text_token_find(const text_tokenizer *t, const char *s, size_t n)
{
    if (!t || (!s && n)) return TEXT_TOKEN_NULL;
    return tok_lookup(t, s ? s : "", n);
}

/* ---- loading ------------------------------------------------------------------ */

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* In-place heap sort of special ids: longer text first, then lower id
 * (deterministic, allocation-free). */
static bool special_before(const text_tokenizer *t, int32_t a, int32_t b)
{
    uint32_t la = t->tok[a].len, lb = t->tok[b].len;
    return la > lb || (la == lb && a < b);
}

static void sift(const text_tokenizer *t, int32_t *v, size_t i, size_t n)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        /* max-heap where "greater" means "comes later": ascending result */
        if (l < n && special_before(t, v[m], v[l])) m = l;
        if (r < n && special_before(t, v[m], v[r])) m = r;
        if (m == i) return;
        int32_t x = v[i];
        v[i] = v[m];
        v[m] = x;
        i = m;
    }
}

static void sort_special(const text_tokenizer *t, int32_t *v, size_t n)
{
    for (size_t i = n / 2; i-- > 0;)
        sift(t, v, i, n);
    for (size_t end = n; end > 1; end--) {
        int32_t x = v[0];
        v[0] = v[end - 1];
        v[end - 1] = x;
        sift(t, v, 0, end - 1);
    }
}

static const char *const g_eog_texts[] = {
    "<|eot_id|>",    "<|im_end|>", "<|end|>", "<|return|>", "<|call|>",        "<end_of_turn>",
    "<|endoftext|>", "<|eom_id|>", "<EOT>",   "_<EOT>",     "<|end_of_text|>", "<end_of_utterance>",
};

/* Reads an optional special id key: in range -> *id; absent -> unchanged;
 * out of range -> unchanged (llama.cpp keeps its default and warns). */
static keel_status special_key(const gguf *g, const char *key, int32_t n_vocab, int32_t *id,
                               char *err)
{
    int64_t v;
    keel_status st = gguf_get_int(g, key, &v, err);
    if (st == KEEL_ENOENT || st == KEEL_ERANGE) return KEEL_OK;
    if (st) return st;
    if (v >= 0 && v < n_vocab) *id = (int32_t)v;
    return KEEL_OK;
}

static keel_status bool_key(const gguf *g, const char *key, bool *out, char *err)
{
    keel_status st = gguf_get_bool(g, key, out, err);
    return st == KEEL_ENOENT ? KEEL_OK : st;
}

void text_tokenizer_close(text_tokenizer *t)
{
    if (!t) return;
    bpe_free(t);
    base_free(t->blob, t->blob_bytes);
    base_free(t->tok, (size_t)t->info.n_vocab * sizeof *t->tok);
    base_free(t->index, t->index_cap * sizeof *t->index);
    base_free(t->special, (size_t)t->n_special * sizeof *t->special);
    base_free(t, sizeof *t);
}

keel_status text_tokenizer_open(const gguf *g, text_tokenizer **out, char *err)
{
    keel_status st;
    const char *model;
    size_t model_len;
    const gguf_value *toks, *scores, *types;
    if (!g || !out) return base_err(err, KEEL_EINVAL, "gguf or out is NULL");
    *out = NULL;
    if ((st = gguf_get_str(g, "tokenizer.ggml.model", &model, &model_len, err))) return st;
    text_vocab_type type;
    if (gguf_str_eq(model, model_len, "llama"))
        type = TEXT_VOCAB_SPM;
    else if (gguf_str_eq(model, model_len, "gpt2"))
        type = TEXT_VOCAB_BPE;
    else
        return base_err(err, KEEL_EUNSUPPORTED,
                        "tokenizer model '%.*s' is not supported (llama and gpt2 are)",
                        (int)BASE_MIN(model_len, 32), model);
    if ((st = gguf_get_arr(g, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &toks, err))) return st;
    if (toks->n == 0 || toks->n > INT32_MAX / 2)
        return base_err(err, KEEL_EFORMAT, "tokenizer.ggml.tokens has %" PRIu64 " entries",
                        toks->n);
    int32_t n = (int32_t)toks->n;
    scores = gguf_find_value(g, "tokenizer.ggml.scores");
    if (scores &&
        (scores->type != GGUF_TYPE_ARRAY ||
         (scores->arr_type != GGUF_TYPE_FLOAT32 && scores->arr_type != GGUF_TYPE_FLOAT64) ||
         scores->n != toks->n))
        return base_err(err, KEEL_EFORMAT,
                        "tokenizer.ggml.scores must be a float array of %d entries", n);
    types = gguf_find_value(g, "tokenizer.ggml.token_type");
    if (types) {
        int64_t dummy;
        if (types->type != GGUF_TYPE_ARRAY || types->n != toks->n ||
            (n > 0 && gguf_arr_int(types, 0, &dummy) == KEEL_EINVAL))
            return base_err(err, KEEL_EFORMAT,
                            "tokenizer.ggml.token_type must be an integer array of %d entries", n);
    }
    /* blob size: every text (renamed when empty) plus a NUL; bounded by
     * the file size plus 24 bytes per empty token */
    size_t blob = 0;
    for (int32_t i = 0; i < n; i++) {
        const char *s;
        size_t l;
        gguf_arr_str(toks, (uint64_t)i, &s, &l);
        blob += (l ? l : 24) + 1;
    }
    if (blob > UINT32_MAX) return base_err(err, KEEL_EFORMAT, "token texts exceed 4 GiB");

    text_tokenizer *t = base_calloc(1, sizeof *t);
    if (!t) return base_err(err, KEEL_ENOMEM, "out of memory");
    t->info.type = type;
    t->info.n_vocab = n;
    t->blob_bytes = blob;
    t->blob = base_alloc(blob);
    t->tok = base_calloc((size_t)n, sizeof *t->tok);
    t->index_cap = 16;
    while (t->index_cap < 2 * (size_t)n)
        t->index_cap <<= 1;
    t->index = base_calloc(t->index_cap, sizeof *t->index);
    if (!t->blob || !t->tok || !t->index) {
        st = base_err(err, KEEL_ENOMEM, "out of memory for %d tokens", n);
        goto fail;
    }
    size_t off = 0, max_piece = 1;
    for (int32_t i = 0; i < n; i++) {
        const char *s;
        size_t l;
        gguf_arr_str(toks, (uint64_t)i, &s, &l);
        char *d = t->blob + off;
        if (l == 0) {
            l = (size_t)snprintf(d, 24, "[EMPTY_%d]", (int)i);
        } else {
            memcpy(d, s, l);
            d[l] = '\0';
        }
        tok_entry *e = &t->tok[i];
        e->off = (uint32_t)off;
        e->len = (uint32_t)l;
        off += l + 1;
        double sc = 0;
        if (scores) gguf_arr_float(scores, (uint64_t)i, &sc);
        e->score = (float)sc;
        int64_t ty = TEXT_TOKEN_NORMAL;
        if (types && gguf_arr_int(types, (uint64_t)i, &ty) != KEEL_OK) ty = TEXT_TOKEN_UNDEFINED;
        e->type =
            (ty >= TEXT_TOKEN_NORMAL && ty <= TEXT_TOKEN_BYTE) ? (uint8_t)ty : TEXT_TOKEN_UNDEFINED;
        e->byte = -1;
        if (e->type == TEXT_TOKEN_BYTE && l == 6 && memcmp(d, "<0x", 3) == 0 && d[5] == '>' &&
            hexval(d[3]) >= 0 && hexval(d[4]) >= 0)
            e->byte = (int16_t)(hexval(d[3]) * 16 + hexval(d[4]));
        max_piece = BASE_MAX(max_piece, l);
        /* index; a repeated text is a malformed vocabulary (llama.cpp
         * asserts on it) */
        size_t mask = t->index_cap - 1, j = (size_t)text_hash(d, l) & mask;
        while (t->index[j]) {
            const tok_entry *o = &t->tok[t->index[j] - 1];
            if (o->len == l && memcmp(t->blob + o->off, d, l) == 0) {
                st = base_err(err, KEEL_EFORMAT, "duplicate token text at ids %u and %d",
                              t->index[j] - 1, (int)i);
                goto fail;
            }
            j = (j + 1) & mask;
        }
        t->index[j] = (uint32_t)i + 1;
    }
    t->max_piece = max_piece;

    /* flags and special ids: llama.cpp's defaults, then the keys */
    text_tokenizer_info *in = &t->info;
    in->bos = in->eos = in->eot = in->eom = in->unk = in->sep = in->pad = TEXT_TOKEN_NULL;
    if (type == TEXT_VOCAB_SPM) {
        in->bos = n > 1 ? 1 : TEXT_TOKEN_NULL;
        in->eos = n > 2 ? 2 : TEXT_TOKEN_NULL;
        in->unk = 0;
        in->add_bos = true;
        in->add_space_prefix = true;
    }
    const char *pre;
    size_t pre_len;
    if (gguf_get_str(g, "tokenizer.ggml.pre", &pre, &pre_len, NULL) == KEEL_OK)
        snprintf(in->pre, sizeof in->pre, "%.*s", (int)BASE_MIN(pre_len, sizeof in->pre - 1), pre);
    if (type == TEXT_VOCAB_BPE && (st = bpe_init(t, g, err))) goto fail;
    if ((st = special_key(g, "tokenizer.ggml.bos_token_id", n, &in->bos, err)) ||
        (st = special_key(g, "tokenizer.ggml.eos_token_id", n, &in->eos, err)) ||
        (st = special_key(g, "tokenizer.ggml.eot_token_id", n, &in->eot, err)) ||
        (st = special_key(g, "tokenizer.ggml.eom_token_id", n, &in->eom, err)) ||
        (st = special_key(g, "tokenizer.ggml.unknown_token_id", n, &in->unk, err)) ||
        (st = special_key(g, "tokenizer.ggml.seperator_token_id", n, &in->sep, err)) ||
        (st = special_key(g, "tokenizer.ggml.padding_token_id", n, &in->pad, err)) ||
        (st = bool_key(g, "tokenizer.ggml.add_bos_token", &in->add_bos, err)) ||
        (st = bool_key(g, "tokenizer.ggml.add_eos_token", &in->add_eos, err)) ||
        (st = bool_key(g, "tokenizer.ggml.add_space_prefix", &in->add_space_prefix, err)))
        goto fail;

    /* byte tokens: SPM "<0xHH>" (else the 1-byte text), BPE the byte's
     * GPT-2 character */
    for (int b = 0; b < 256; b++) {
        char buf[8];
        size_t l;
        if (type == TEXT_VOCAB_SPM) {
            l = (size_t)snprintf(buf, sizeof buf, "<0x%02X>", b);
            t->byte_tok[b] = tok_lookup(t, buf, l);
            if (t->byte_tok[b] == TEXT_TOKEN_NULL) {
                buf[0] = (char)b;
                t->byte_tok[b] = tok_lookup(t, buf, 1);
            }
        } else {
            uint32_t cp = bpe_byte_to_cp((uint8_t)b);
            l = cp < 0x80 ? 1 : 2;
            buf[0] = (char)(cp < 0x80 ? cp : (0xc0 | (cp >> 6)));
            buf[1] = (char)(0x80 | (cp & 0x3f));
            t->byte_tok[b] = tok_lookup(t, buf, l);
        }
    }

    /* end of generation */
    int32_t eog_ids[3] = {in->eos, in->eot, in->eom};
    for (int k = 0; k < 3; k++)
        if (eog_ids[k] != TEXT_TOKEN_NULL) t->tok[eog_ids[k]].eog = 1;
    for (size_t k = 0; k < sizeof g_eog_texts / sizeof g_eog_texts[0]; k++) {
        int32_t id = tok_lookup(t, g_eog_texts[k], strlen(g_eog_texts[k]));
        if (id != TEXT_TOKEN_NULL) t->tok[id].eog = 1;
    }

    /* special tokens, longest text first */
    int32_t n_special = 0;
    for (int32_t i = 0; i < n; i++) {
        uint8_t ty = t->tok[i].type;
        n_special +=
            ty == TEXT_TOKEN_CONTROL || ty == TEXT_TOKEN_USER_DEFINED || ty == TEXT_TOKEN_UNKNOWN;
    }
    if (n_special) {
        t->special = base_alloc((size_t)n_special * sizeof *t->special);
        if (!t->special) {
            st = base_err(err, KEEL_ENOMEM, "out of memory");
            goto fail;
        }
        t->n_special = n_special;
        int32_t k = 0;
        for (int32_t i = 0; i < n; i++) {
            uint8_t ty = t->tok[i].type;
            if (ty == TEXT_TOKEN_CONTROL || ty == TEXT_TOKEN_USER_DEFINED ||
                ty == TEXT_TOKEN_UNKNOWN)
                t->special[k++] = i;
        }
        sort_special(t, t->special, (size_t)n_special);
    }
    *out = t;
    return KEEL_OK;
fail:
    text_tokenizer_close(t);
    return st;
}

const text_tokenizer_info *text_tokenizer_get_info(const text_tokenizer *t)
{
    return &t->info;
}

size_t text_tokenizer_max_piece(const text_tokenizer *t)
{
    return t->max_piece;
}

static bool id_ok(const text_tokenizer *t, int32_t id)
{
    return t && id >= 0 && id < t->info.n_vocab;
}

const char *text_token_text(const text_tokenizer *t, int32_t id, size_t *len)
{
    if (!id_ok(t, id)) return NULL;
    if (len) *len = t->tok[id].len;
    return tok_text(t, id);
}

float text_token_score(const text_tokenizer *t, int32_t id)
{
    return id_ok(t, id) ? t->tok[id].score : 0.0f;
}

text_token_type text_token_get_type(const text_tokenizer *t, int32_t id)
{
    return id_ok(t, id) ? (text_token_type)t->tok[id].type : TEXT_TOKEN_UNDEFINED;
}

bool text_token_is_eog(const text_tokenizer *t, int32_t id)
{
    return id_ok(t, id) && t->tok[id].eog;
}

/* ---- pieces --------------------------------------------------------------------- */

/* A bounded writer: counts every byte, stores those that fit, drops the
 * first skip bytes. */
typedef struct pw {
    char *dst;
    size_t cap, n, skip;
} pw;

static void pw_put(pw *w, const char *s, size_t k)
{
    size_t d = BASE_MIN(k, w->skip);
    s += d;
    k -= d;
    w->skip -= d;
    if (w->dst && w->n < w->cap) memcpy(w->dst + w->n, s, BASE_MIN(k, w->cap - w->n));
    w->n += k;
}

/* Length of the valid UTF-8 character at s (n bytes left) and its code
 * point, or 0 when the bytes are not one. */
static size_t utf8_decode(const uint8_t *s, size_t n, uint32_t *cp)
{
    uint8_t c = s[0];
    size_t len;
    uint32_t v, min;
    if (c < 0x80) {
        *cp = c;
        return 1;
    } else if (c >= 0xc2 && c <= 0xdf) {
        len = 2, v = c & 0x1f, min = 0x80;
    } else if (c >= 0xe0 && c <= 0xef) {
        len = 3, v = c & 0x0f, min = 0x800;
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4, v = c & 0x07, min = 0x10000;
    } else {
        return 0;
    }
    if (len > n) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        v = (v << 6) | (s[i] & 0x3f);
    }
    if (v < min || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff)) return 0;
    *cp = v;
    return len;
}

static void put_spm_text(pw *w, const char *s, size_t n)
{
    size_t start = 0;
    for (size_t i = 0; i < n; i++) {
        if (i + 3 <= n && memcmp(s + i, "\xe2\x96\x81", 3) == 0) {
            pw_put(w, s + start, i - start);
            pw_put(w, " ", 1);
            i += 2;
            start = i + 1;
        }
    }
    pw_put(w, s + start, n - start);
}

static void put_bpe_text(pw *w, const char *s, size_t n)
{
    const uint8_t *u = (const uint8_t *)s;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t l = utf8_decode(u + i, n - i, &cp);
        int b = l ? bpe_cp_to_byte(cp) : -1;
        if (b >= 0) {
            char c = (char)b;
            pw_put(w, &c, 1);
        } else {
            /* not in the byte map (or invalid): pass the bytes through */
            l = l ? l : 1;
            pw_put(w, s + i, l);
        }
        i += l;
    }
}

static void piece(const text_tokenizer *t, int32_t id, bool special, pw *w)
{
    const tok_entry *e = &t->tok[id];
    const char *s = tok_text(t, id);
    switch (e->type) {
    case TEXT_TOKEN_CONTROL:
    case TEXT_TOKEN_UNKNOWN:
        if (special) pw_put(w, s, e->len);
        return;
    case TEXT_TOKEN_USER_DEFINED:
        pw_put(w, s, e->len);
        return;
    case TEXT_TOKEN_BYTE:
        if (e->byte >= 0) {
            char c = (char)e->byte;
            pw_put(w, &c, 1);
            return;
        }
        /* a BYTE token without <0xHH> text reads as normal */
        __attribute__((fallthrough));
    case TEXT_TOKEN_NORMAL:
        if (t->info.type == TEXT_VOCAB_SPM)
            put_spm_text(w, s, e->len);
        else
            put_bpe_text(w, s, e->len);
        return;
    default: /* UNUSED, UNDEFINED: nothing, as llama.cpp */
        return;
    }
}

keel_status text_token_to_piece(const text_tokenizer *t, int32_t id, bool special, char *buf,
                                size_t cap, size_t *n_out)
{
    if (!id_ok(t, id) || !n_out) return KEEL_EINVAL;
    pw w = {buf, buf ? cap : 0, 0, 0};
    piece(t, id, special, &w);
    *n_out = w.n;
    return w.n > w.cap ? KEEL_ERANGE : KEEL_OK;
}

/* First byte of id's piece, or -1 when the piece is empty. */
static int piece_first(const text_tokenizer *t, int32_t id, bool special)
{
    char c;
    pw w = {&c, 1, 0, 0};
    piece(t, id, special, &w);
    return w.n ? (uint8_t)c : -1;
}

/* llama.cpp's clean_up_tokenization_spaces passes over buf[0..n). */
static size_t clean_spaces(char *text, size_t n)
{
    size_t total = n ? 1 : 0;
    for (size_t i = 1; i < n; i++) { /* " ?", " !", " .", " ," */
        char x = text[i];
        if (text[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) total--;
        text[total++] = x;
    }
    n = total;
    total = n ? 1 : 0;
    for (size_t i = 1; i < n; i++) { /* " ' " */
        char x = text[i];
        if (x == '\'' && i + 1 < n && text[i - 1] == ' ' && text[i + 1] == ' ') {
            total--;
            text[++i] = '\0';
        }
        text[total++] = x;
    }
    n = total;
    total = n ? 1 : 0;
    for (size_t i = 1; i < n; i++) { /* " 's", " 'm", " 're", " 've" */
        char x = text[i];
        if (text[i - 1] == ' ' && x == '\'' && i + 1 < n) {
            char x1 = text[i + 1];
            if (x1 == 's' || x1 == 'm')
                total--;
            else if (i + 2 < n &&
                     ((x1 == 'r' && text[i + 2] == 'e') || (x1 == 'v' && text[i + 2] == 'e')))
                total--;
        }
        text[total++] = x;
    }
    return total;
}

keel_status text_detokenize(const text_tokenizer *t, const int32_t *ids, int64_t n, unsigned flags,
                            char *buf, size_t cap, size_t *n_out, char *err)
{
    if (!t || !n_out || n < 0 || (!ids && n)) return base_err(err, KEEL_EINVAL, "bad argument");
    *n_out = 0;
    for (int64_t i = 0; i < n; i++)
        if (!id_ok(t, ids[i]))
            return base_err(err, KEEL_EINVAL,
                            "token id %d at position %" PRId64 " out of range [0, %d)", ids[i], i,
                            t->info.n_vocab);
    const text_tokenizer_info *in = &t->info;
    int64_t start = 0, end = n;
    if (flags & TEXT_DECODE_REMOVE_SPECIAL) {
        if (in->add_bos && end > 0 && ids[0] == in->bos) start = 1;
        if (in->add_eos && end > start && ids[end - 1] == in->eos) end--;
    }
    bool special = (flags & TEXT_DECODE_UNPARSE_SPECIAL) != 0;
    bool strip = in->add_space_prefix && !(flags & TEXT_DECODE_KEEP_SPACE);
    pw w = {buf, buf ? cap : 0, 0, 0};
    for (int64_t i = start; i < end; i++) {
        if (strip) {
            int c = piece_first(t, ids[i], special);
            if (c < 0) continue; /* empty piece: the rule moves on */
            w.skip = c == ' ';
            strip = false;
        }
        piece(t, ids[i], special, &w);
    }
    *n_out = w.n;
    if (w.n > w.cap) return KEEL_ERANGE;
    if ((flags & TEXT_DECODE_CLEAN_SPACES) && in->clean_spaces) *n_out = clean_spaces(buf, w.n);
    return KEEL_OK;
}

/* ---- streaming ------------------------------------------------------------------- */

void text_stream_init(text_stream *s, const text_tokenizer *t, unsigned flags)
{
    memset(s, 0, sizeof *s);
    s->t = t;
    s->flags = flags;
    s->first = true;
}

keel_status text_stream_init_after(text_stream *s, const text_tokenizer *t, unsigned flags,
                                   const int32_t *prev, int64_t n_prev)
{
    text_stream_init(s, t, flags);
    if (n_prev < 0 || (!prev && n_prev)) return KEEL_EINVAL;
    for (int64_t i = 0; i < n_prev; i++)
        if (!id_ok(t, prev[i])) return KEEL_EINVAL;
    bool special = (flags & TEXT_DECODE_UNPARSE_SPECIAL) != 0;
    for (int64_t i = 0; i < n_prev && s->first; i++)
        if (piece_first(t, prev[i], special) >= 0) s->first = false;
    return KEEL_OK;
}

/* Length of an incomplete but so far valid UTF-8 sequence ending buf[0..n),
 * 0 if the tail is complete or invalid. */
static size_t incomplete_tail(const uint8_t *b, size_t n)
{
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        uint8_t c = b[n - k];
        if ((c & 0xc0) == 0x80) continue; /* continuation: look further back */
        size_t need = (c >= 0xc2 && c <= 0xdf)   ? 2
                      : (c >= 0xe0 && c <= 0xef) ? 3
                      : (c >= 0xf0 && c <= 0xf4) ? 4
                                                 : 0;
        return need > k ? k : 0;
    }
    return 0;
}

keel_status text_stream_push(text_stream *s, int32_t id, char *buf, size_t cap, size_t *n_out)
{
    if (!s || !n_out || !id_ok(s->t, id)) return KEEL_EINVAL;
    const text_tokenizer *t = s->t;
    bool special = (s->flags & TEXT_DECODE_UNPARSE_SPECIAL) != 0;
    size_t skip = 0;
    bool strip = s->first && t->info.add_space_prefix && !(s->flags & TEXT_DECODE_KEEP_SPACE);
    int c0 = piece_first(t, id, special);
    if (strip && c0 == ' ') skip = 1;
    pw m = {NULL, 0, 0, skip};
    piece(t, id, special, &m);
    size_t need = (size_t)s->n_pend + m.n;
    *n_out = need;
    if (!buf || cap < need) return KEEL_ERANGE;
    memcpy(buf, s->pend, (size_t)s->n_pend);
    pw w = {buf + s->n_pend, cap - (size_t)s->n_pend, 0, skip};
    piece(t, id, special, &w);
    if (c0 >= 0) s->first = false;
    size_t hold = incomplete_tail((const uint8_t *)buf, need);
    memcpy(s->pend, buf + need - hold, hold);
    s->n_pend = (int)hold;
    *n_out = need - hold;
    return KEEL_OK;
}

keel_status text_stream_flush(text_stream *s, char *buf, size_t cap, size_t *n_out)
{
    if (!s || !n_out) return KEEL_EINVAL;
    *n_out = (size_t)s->n_pend;
    if (s->n_pend && (!buf || cap < (size_t)s->n_pend)) return KEEL_ERANGE;
    if (s->n_pend) memcpy(buf, s->pend, (size_t)s->n_pend);
    s->n_pend = 0;
    return KEEL_OK;
}
