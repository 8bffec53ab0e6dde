/*
 * fuzz/tokenizer_spm.c — libFuzzer target: SPM tokenization of arbitrary
 * bytes with a small built-in vocabulary (made with the GGUF writer at the
 * first call: byte tokens, scored pieces, control and user-defined tokens),
 * then detokenization and streaming decode. Byte 0 of the input picks the
 * flags. Checks: ids in range, the stream equals detokenize, and the exact
 * round trip where it must hold (no parse_special, no U+2581 and no
 * user-defined token text in the input), and that a stream started after a
 * prefix (text_stream_init_after) continues its text exactly.
 */
#include "model/gguf.h"
#include "text/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A stream started after ids[0..k) continues their text exactly:
 * detokenize(ids[0..k)) + stream(ids[k..n)) == detokenize(ids[0..n)). */
static void check_continuation(const text_tokenizer *t, const int32_t *ids, int64_t n, int64_t k,
                               unsigned flags)
{
    size_t need_all, got_all, need_pre, got_pre;
    if (text_detokenize(t, ids, n, flags, NULL, 0, &need_all, NULL) > KEEL_ERANGE ||
        text_detokenize(t, ids, k, flags, NULL, 0, &need_pre, NULL) > KEEL_ERANGE)
        abort();
    char *whole = malloc(need_all + 1), *pre = malloc(need_pre + 1);
    if (text_detokenize(t, ids, n, flags, whole, need_all, &got_all, NULL) ||
        text_detokenize(t, ids, k, flags, pre, need_pre, &got_pre, NULL))
        abort();
    text_stream s;
    if (text_stream_init_after(&s, t, flags, ids, k)) abort();
    size_t cap = text_tokenizer_max_piece(t) + 4, total = got_pre, c;
    char *chunk = malloc(cap), *cat = malloc(got_pre + (size_t)(n - k + 1) * cap);
    memcpy(cat, pre, got_pre);
    for (int64_t i = k; i < n; i++) {
        if (text_stream_push(&s, ids[i], chunk, cap, &c)) abort();
        memcpy(cat + total, chunk, c);
        total += c;
    }
    if (text_stream_flush(&s, chunk, cap, &c)) abort();
    memcpy(cat + total, chunk, c);
    total += c;
    if (total != got_all || memcmp(cat, whole, total) != 0) abort();
    free(chunk);
    free(cat);
    free(pre);
    free(whole);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static text_tokenizer *g_tok;

static text_tokenizer *build(void)
{
    static const char *const pieces[] = {
        "\xe2\x96\x81",
        "\xe2\x96\x81t",
        "he",
        "\xe2\x96\x81the",
        "\xe2\x96\x81" "a",
        "in",
        "an",
        "\xe2\x96\x81" "an",
        "and",
        "\xe2\x96\x81" "and",
        "er",
        "re",
        "on",
        "\xe2\x96\x81o",
        "\xe2\x96\x81on",
        "\xe2\x96\x81once",
        "ce",
        "nce",
        "\xe2\x96\x81up",
        "up",
        "upon",
        "\xe2\x96\x81upon",
        "e",
        "t",
        "h",
        "a",
        "n",
        "d",
        "o",
        "c",
        "u",
        "p",
        "r",
        "i",
        "\xe4\xbd\xa0",
        "\xe4\xbd\xa0\xe5\xa5\xbd",
        "\xc3\xa9",
        "\xe2\x80\x94",
    };
    enum { NP = sizeof pieces / sizeof pieces[0] };
    enum { N = 3 + 256 + NP + 2 };
    static char bytes[256][8];
    const char *toks[N];
    float scores[N];
    int32_t types[N];
    toks[0] = "<unk>", types[0] = 2, scores[0] = 0;
    toks[1] = "<s>", types[1] = 3, scores[1] = 0;
    toks[2] = "</s>", types[2] = 3, scores[2] = 0;
    for (int b = 0; b < 256; b++) {
        snprintf(bytes[b], sizeof bytes[b], "<0x%02X>", b);
        toks[3 + b] = bytes[b], types[3 + b] = 6, scores[3 + b] = 0;
    }
    for (int i = 0; i < NP; i++)
        toks[259 + i] = pieces[i], types[259 + i] = 1, scores[259 + i] = -(float)i;
    toks[259 + NP] = "<|user|>", types[259 + NP] = 3, scores[259 + NP] = 0;
    toks[260 + NP] = "<tool>", types[260 + NP] = 4, scores[260 + NP] = 0;
    gguf_writer *w;
    void *mem;
    size_t msize;
    gguf *g;
    text_tokenizer *t = NULL;
    if (gguf_writer_open(&w)) abort();
    if (gguf_writer_add_str(w, "tokenizer.ggml.model", "llama") ||
        gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, N) ||
        gguf_writer_add_arr(w, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, scores, N) ||
        gguf_writer_add_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, N) ||
        gguf_writer_write_mem(w, &mem, &msize))
        abort();
    gguf_writer_close(w);
    if (gguf_open_owned(mem, msize, &g, NULL) || text_tokenizer_open(g, &t, NULL)) abort();
    gguf_close(g);
    return t;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_tok) g_tok = build();
    if (size < 1) return 0;
    const text_tokenizer *t = g_tok;
    bool add_special = data[0] & 1, parse_special = data[0] & 2;
    unsigned flags = (data[0] & 4) ? TEXT_DECODE_UNPARSE_SPECIAL : 0;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    int64_t n;
    keel_status st = text_tokenize(t, text, len, add_special, parse_special, NULL, 0, &n, NULL);
    if (st != KEEL_OK && st != KEEL_ERANGE) abort();
    int32_t *ids = malloc((size_t)(n ? n : 1) * sizeof *ids);
    int64_t n2;
    if (text_tokenize(t, text, len, add_special, parse_special, ids, n, &n2, NULL) || n2 != n)
        abort();
    int32_t n_vocab = text_tokenizer_get_info(t)->n_vocab;
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= n_vocab) abort();
    size_t need, got;
    st = text_detokenize(t, ids, n, flags | TEXT_DECODE_REMOVE_SPECIAL, NULL, 0, &need, NULL);
    if (st != KEEL_OK && st != KEEL_ERANGE) abort();
    char *out = malloc(need + 1);
    if (text_detokenize(t, ids, n, flags | TEXT_DECODE_REMOVE_SPECIAL, out, need, &got, NULL))
        abort();
    bool must_hold =
        !parse_special && !memmem(text, len, "\xe2\x96\x81", 3) && !memmem(text, len, "<tool>", 6);
    if (must_hold && (got != len || memcmp(out, text, len) != 0)) abort();
    /* the stream yields what detokenize does (BOS removed by hand) */
    text_stream s;
    text_stream_init(&s, t, flags);
    size_t cap = text_tokenizer_max_piece(t) + 4, total = 0;
    char *chunk = malloc(cap), *all = malloc((size_t)(n + 1) * cap);
    int64_t start = (n > 0 && ids[0] == 1) ? 1 : 0; /* REMOVE_SPECIAL drops a leading BOS */
    for (int64_t i = start; i < n; i++) {
        size_t k;
        if (text_stream_push(&s, ids[i], chunk, cap, &k)) abort();
        memcpy(all + total, chunk, k);
        total += k;
    }
    size_t k;
    if (text_stream_flush(&s, chunk, cap, &k)) abort();
    memcpy(all + total, chunk, k);
    total += k;
    if (total != got || memcmp(all, out, got) != 0) abort();
    /* a continuation after a prefix whose length the last byte picks */
    check_continuation(t, ids, n, size > 1 ? (int64_t)(data[size - 1] % (uint64_t)(n + 1)) : 0,
                       flags & TEXT_DECODE_UNPARSE_SPECIAL);
    free(chunk);
    free(all);
    free(out);
    free(ids);
    return 0;
}
