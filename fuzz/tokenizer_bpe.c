/*
 * fuzz/tokenizer_bpe.c — libFuzzer target: byte-level BPE tokenization of
 * arbitrary bytes with a built-in vocabulary (256 byte tokens, merges,
 * control and user-defined tokens) under every supported pre-tokenizer
 * (byte 0 of the input picks one and the flags). The vocabularies are made
 * with the GGUF writer at the first call. Checks: ids in range, the exact
 * round trip (always, for byte-level BPE; with parse_special the special
 * texts are rendered back), the stream equals detokenize, and a stream
 * started after a prefix (text_stream_init_after) continues its text.
 */
#include "model/gguf.h"
#include "text/tokenizer.h"

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

static const char *const g_pres[] = {
    "gpt2",           "llama3",     "qwen2",      "default",     "deepseek-llm", "deepseek-v3",
    "deepseek-coder", "falcon",     "starcoder",  "gpt-4o",      "tekken",       "bloom",
    "viking",         "seed-coder", "bailingmoe", "chatglm-bpe", "no-such-pre",
};
enum { N_PRE = sizeof g_pres / sizeof g_pres[0] };
static text_tokenizer *g_tok[N_PRE];

static text_tokenizer *build(const char *pre)
{
    static char bytes[256][4];
    static const char *const more[] = {
        "\xc4\xa0t",
        "he",
        "\xc4\xa0the",
        "in",
        "\xc4\xa0" "a",
        "er",
        "on",
        "\xc4\xa0"
        "an",
        "an",
        "and",
        "\xc4\xa0"
        "and",
        "12",
        "123",
        "\xc4\xa0\xc4\xa0",
        "\xc4\x8a\xc4\x8a",
        "'s",
        "\xc3\xa4\xc2\xbd",
        "\xc3\xa4\xc2\xbd\xc2\xa0",
    };
    static const char *const merges[] = {
        "\xc4\xa0 t",
        "h e",
        "\xc4\xa0t he",
        "i n",
        "\xc4\xa0 a",
        "e r",
        "o n",
        "\xc4\xa0 an",
        "a n",
        "an d",
        "\xc4\xa0 and",
        "1 2",
        "12 3",
        "\xc4\xa0 \xc4\xa0",
        "\xc4\x8a \xc4\x8a",
        "' s",
        "\xc3\xa4 \xc2\xbd",
        "\xc3\xa4\xc2\xbd \xc2\xa0",
        "no-space-merge",
    };
    enum { NM = sizeof more / sizeof more[0], N = 256 + NM + 3 };
    const char *toks[N];
    int32_t types[N];
    for (unsigned b = 0; b < 256; b++) {
        text_gpt2_byte_utf8((uint8_t)b, bytes[b]);
        toks[b] = bytes[b], types[b] = 1;
    }
    for (int i = 0; i < NM; i++)
        toks[256 + i] = more[i], types[256 + i] = 1;
    toks[256 + NM] = "<|im_start|>", types[256 + NM] = 3;
    toks[257 + NM] = "<|im_end|>", types[257 + NM] = 3;
    toks[258 + NM] = "<tool>", types[258 + NM] = 4;
    gguf_writer *w;
    void *mem;
    size_t msize;
    gguf *g;
    text_tokenizer *t = NULL;
    if (gguf_writer_open(&w)) abort();
    if (gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2") ||
        gguf_writer_add_str(w, "tokenizer.ggml.pre", pre) ||
        gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, N) ||
        gguf_writer_add_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, N) ||
        gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", merges, NULL,
                                sizeof merges / sizeof merges[0]) ||
        gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", 256 + NM) ||
        gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", 257 + NM) ||
        gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", false) ||
        gguf_writer_write_mem(w, &mem, &msize))
        abort();
    gguf_writer_close(w);
    if (gguf_open_owned(mem, msize, &g, NULL) || text_tokenizer_open(g, &t, NULL)) abort();
    gguf_close(g);
    return t;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    int which = (data[0] >> 2) % N_PRE;
    if (!g_tok[which]) g_tok[which] = build(g_pres[which]);
    const text_tokenizer *t = g_tok[which];
    bool add_special = data[0] & 1, parse_special = data[0] & 2;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    int64_t n, n2;
    keel_status st = text_tokenize(t, text, len, add_special, parse_special, NULL, 0, &n, NULL);
    if (st != KEEL_OK && st != KEEL_ERANGE) abort();
    int32_t *ids = malloc((size_t)(n ? n : 1) * sizeof *ids);
    if (text_tokenize(t, text, len, add_special, parse_special, ids, n, &n2, NULL) || n2 != n)
        abort();
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= text_tokenizer_get_info(t)->n_vocab) abort();
    unsigned flags = TEXT_DECODE_UNPARSE_SPECIAL;
    size_t need, got;
    st = text_detokenize(t, ids, n, flags, NULL, 0, &need, NULL);
    if (st != KEEL_OK && st != KEEL_ERANGE) abort();
    char *out = malloc(need + 1);
    if (text_detokenize(t, ids, n, flags, out, need, &got, NULL)) abort();
    if (got != len || memcmp(out, text, len) != 0) abort();
    text_stream s;
    text_stream_init(&s, t, flags);
    size_t cap = text_tokenizer_max_piece(t) + 4, total = 0, k;
    char *chunk = malloc(cap), *all = malloc((size_t)(n + 1) * cap);
    for (int64_t i = 0; i < n; i++) {
        if (text_stream_push(&s, ids[i], chunk, cap, &k)) abort();
        memcpy(all + total, chunk, k);
        total += k;
    }
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
