/*
 * test_tokenizer.c — src/text: SPM against llama.cpp's prompt ids for the
 * fixture vocabulary, byte-level BPE with a vocabulary learned here by a
 * tiny BPE trainer (so the tests run without fixtures), pre-tokenizer
 * choice, special tokens, byte fallback, round trips over Unicode-heavy and
 * invalid text, streaming decode, bad ids, allocation failures.
 */
#include "testutil.h"
#include "base/base.h"
#include "model/gguf.h"
#include "text/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char g_unicode[] =
    "Hello, world! Once upon a time there was a little girl.\n"
    "\t\tTabs\tand  multiple   spaces    here.\r\n"
    "Chinese: \xe4\xbd\xa0\xe5\xa5\xbd\xef\xbc\x8c\xe4\xb8\x96\xe7\x95\x8c\xe3\x80\x82 "
    "Japanese: \xe3\x81\x93\xe3\x82\x93\xe3\x81\xab\xe3\x81\xa1\xe3\x81\xaf "
    "Korean: \xed\x95\x9c\xea\xb5\xad\xec\x96\xb4\n"
    "Emoji: \xf0\x9f\x8e\x89\xf0\x9f\x9a\x80 \xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80"
    "\x8d\xf0\x9f\x91\xa7 flags \xf0\x9f\x87\xa9\xf0\x9f\x87\xaa\n"
    "Combining: e\xcc\x81 a\xcc\x88\xcc\x81 n\xcc\x83 caf\xc3\xa9 na\xc3\xafve\n"
    "Arabic: \xd9\x85\xd8\xb1\xd8\xad\xd8\xa8\xd8\xa7 \xd8\xa8\xd8\xa7\xd9\x84\xd8\xb9\xd8\xa7"
    "\xd9\x84\xd9\x85\n"
    "Numbers 1234567 and 3.14159, code: if (x<=y) { return a_b->c; } // done\n"
    "Quotes: 'single' \"double\" it's we're they'll I'd\n"
    "   leading spaces and trailing   \n\n\nend";

/* ---- helpers -------------------------------------------------------------- */

static text_tokenizer *open_gguf_tokenizer(void *data, size_t size, gguf **gout)
{
    gguf *g;
    char err[BASE_ERR_CAP] = "";
    keel_status st = gguf_open_owned(data, size, &g, err);
    if (st) fail_msg("gguf: %s", err);
    text_tokenizer *t;
    st = text_tokenizer_open(g, &t, err);
    if (st) fail_msg("tokenizer: %s: %s", keel_status_name(st), err);
    if (gout)
        *gout = g;
    else
        gguf_close(g);
    return t;
}

/* Tokenizes into a malloc'd array. */
static int32_t *tok(const text_tokenizer *t, const char *s, size_t n, bool add_special,
                    bool parse_special, int64_t *n_out)
{
    char err[BASE_ERR_CAP] = "";
    int64_t need;
    keel_status st = text_tokenize(t, s, n, add_special, parse_special, NULL, 0, &need, err);
    assert_true(st == KEEL_OK || st == KEEL_ERANGE);
    int32_t *ids = malloc((size_t)(need ? need : 1) * sizeof *ids);
    assert_ok(text_tokenize(t, s, n, add_special, parse_special, ids, need, n_out, err));
    assert_int_equal(*n_out, need);
    return ids;
}

static char *detok(const text_tokenizer *t, const int32_t *ids, int64_t n, unsigned flags,
                   size_t *len)
{
    char err[BASE_ERR_CAP] = "";
    size_t need;
    keel_status st = text_detokenize(t, ids, n, flags, NULL, 0, &need, err);
    assert_true(st == KEEL_OK || st == KEEL_ERANGE);
    char *s = malloc(need + 1);
    assert_ok(text_detokenize(t, ids, n, flags, s, need, len, err));
    assert_true(*len <= need);
    s[*len] = '\0';
    return s;
}

static bool utf8_valid(const uint8_t *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        uint8_t c = s[i];
        size_t l = c < 0x80                   ? 1
                   : (c >= 0xc2 && c <= 0xdf) ? 2
                   : (c >= 0xe0 && c <= 0xef) ? 3
                   : (c >= 0xf0 && c <= 0xf4) ? 4
                                              : 0;
        if (!l || i + l > n) return false;
        for (size_t k = 1; k < l; k++)
            if ((s[i + k] & 0xc0) != 0x80) return false;
        i += l;
    }
    return true;
}

/* Decodes ids one at a time through a stream; checks every chunk is whole
 * UTF-8 when the total is; returns the concatenation. */
static char *stream_all(const text_tokenizer *t, const int32_t *ids, int64_t n, unsigned flags,
                        size_t *len, bool expect_valid)
{
    text_stream s;
    text_stream_init(&s, t, flags);
    size_t cap = text_tokenizer_max_piece(t) + 4, total = 0;
    char *out = malloc((size_t)(n + 1) * cap + 8);
    char *chunk = malloc(cap);
    for (int64_t i = 0; i < n; i++) {
        size_t k;
        assert_ok(text_stream_push(&s, ids[i], chunk, cap, &k));
        if (expect_valid) assert_true(utf8_valid((const uint8_t *)chunk, k));
        memcpy(out + total, chunk, k);
        total += k;
    }
    size_t k;
    assert_ok(text_stream_flush(&s, chunk, cap, &k));
    memcpy(out + total, chunk, k);
    total += k;
    free(chunk);
    *len = total;
    return out;
}

/* ---- SPM (fixture vocabulary) --------------------------------------------- */

static text_tokenizer *fixture_spm(void)
{
    const char *p = test_fixture("models/stories260K.gguf");
    if (!p) return NULL;
    gguf *g;
    char err[BASE_ERR_CAP];
    assert_ok(gguf_open_file(p, &g, err));
    text_tokenizer *t;
    assert_ok(text_tokenizer_open(g, &t, err));
    gguf_close(g); /* the tokenizer keeps its own copy */
    return t;
}

static void test_spm_fixture_prompt(void **state)
{
    (void)state;
    text_tokenizer *t = fixture_spm();
    if (!t) return;
    size_t text_len, ref_len;
    char *text = test_read_file(test_fixture("text/stories.txt"), &text_len);
    int32_t *ref = test_read_file(test_fixture("ref/stories260K.prompt.i32"), &ref_len);
    assert_non_null(text);
    assert_non_null(ref);
    assert_int_equal(ref_len, 800);
    const text_tokenizer_info *in = text_tokenizer_get_info(t);
    assert_int_equal(in->type, TEXT_VOCAB_SPM);
    assert_int_equal(in->n_vocab, 512);
    assert_int_equal(in->bos, 1);
    assert_int_equal(in->eos, 2);
    assert_int_equal(in->unk, 0);
    assert_true(in->add_bos && !in->add_eos && in->add_space_prefix);
    int64_t n;
    int32_t *ids = tok(t, text, text_len, true, false, &n);
    assert_int_equal(n, 4235);
    for (int i = 0; i < 200; i++)
        if (ids[i] != ref[i]) fail_msg("token %d: %d, llama.cpp %d", i, ids[i], ref[i]);
    /* capacity too small: ERANGE, the count reported, the prefix written */
    int32_t few[10];
    int64_t need;
    char err[BASE_ERR_CAP];
    assert_status(text_tokenize(t, text, text_len, true, false, few, 10, &need, err), KEEL_ERANGE);
    assert_int_equal(need, 4235);
    assert_memory_equal(few, ref, sizeof few);
    /* round trip of the whole file */
    size_t len;
    char *back = detok(t, ids, n, TEXT_DECODE_REMOVE_SPECIAL, &len);
    assert_int_equal(len, text_len);
    assert_memory_equal(back, text, len);
    free(back);
    free(ids);
    free(text);
    free(ref);
    text_tokenizer_close(t);
}

static void test_spm_pieces_and_fallback(void **state)
{
    (void)state;
    text_tokenizer *t = fixture_spm();
    if (!t) return;
    int64_t n;
    /* "Once upon" -> ▁Once ▁upon, BOS first */
    int32_t *ids = tok(t, "Once upon", 9, true, false, &n);
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 403);
    assert_int_equal(ids[2], 407);
    free(ids);
    /* empty text: only BOS with add_special */
    ids = tok(t, "", 0, true, false, &n);
    assert_int_equal(n, 1);
    free(ids);
    ids = tok(t, "", 0, false, false, &n);
    assert_int_equal(n, 0);
    free(ids);
    /* byte fallback: 你 has no token: <0xE4><0xBD><0xA0> (ids 3 + byte) */
    ids = tok(t, "\xe4\xbd\xa0", 3, false, false, &n);
    assert_int_equal(n, 4); /* ▁ then three bytes */
    assert_int_equal(ids[1], 3 + 0xe4);
    assert_int_equal(ids[2], 3 + 0xbd);
    assert_int_equal(ids[3], 3 + 0xa0);
    char buf[16];
    size_t k;
    assert_ok(text_token_to_piece(t, ids[1], false, buf, sizeof buf, &k));
    assert_int_equal(k, 1);
    assert_int_equal((uint8_t)buf[0], 0xe4);
    free(ids);
    /* pieces: ▁ -> space, control tokens only when asked */
    assert_ok(text_token_to_piece(t, 403, false, buf, sizeof buf, &k));
    assert_int_equal(k, 5);
    assert_memory_equal(buf, " Once", 5);
    assert_status(text_token_to_piece(t, 403, false, buf, 3, &k), KEEL_ERANGE);
    assert_int_equal(k, 5);
    assert_ok(text_token_to_piece(t, 1, false, buf, sizeof buf, &k));
    assert_int_equal(k, 0);
    assert_ok(text_token_to_piece(t, 1, true, buf, sizeof buf, &k));
    assert_int_equal(k, 3);
    assert_memory_equal(buf, "<s>", 3);
    assert_status(text_token_to_piece(t, 512, false, buf, sizeof buf, &k), KEEL_EINVAL);
    assert_status(text_token_to_piece(t, -1, false, buf, sizeof buf, &k), KEEL_EINVAL);
    /* invalid UTF-8 and NUL bytes: byte tokens, exact round trip */
    const char bad[] = "a\xff\xfe b\xc3(\x80\xe2\x82 \x00z\xf0\x9f";
    ids = tok(t, bad, sizeof bad - 1, false, false, &n);
    size_t len;
    char *back = detok(t, ids, n, 0, &len);
    assert_int_equal(len, sizeof bad - 1);
    assert_memory_equal(back, bad, len);
    free(back);
    free(ids);
    /* parse_special: "<s>" text becomes BOS only when asked */
    ids = tok(t, "a<s>b", 5, false, true, &n);
    assert_int_equal(n, 3); /* ▁a <s> ▁b: a space again after a special */
    assert_int_equal(ids[1], 1);
    free(ids);
    ids = tok(t, "a<s>b", 5, false, false, &n);
    for (int64_t i = 0; i < n; i++)
        assert_int_not_equal(ids[i], 1);
    back = detok(t, ids, n, 0, &len);
    assert_string_equal(back, "a<s>b");
    free(back);
    free(ids);
    /* bad ids in decode */
    int32_t badids[3] = {403, 600, 407};
    char err[BASE_ERR_CAP];
    assert_status(text_detokenize(t, badids, 3, 0, buf, sizeof buf, &k, err), KEEL_EINVAL);
    assert_string_equal(err, "token id 600 at position 1 out of range [0, 512)");
    text_stream s;
    text_stream_init(&s, t, 0);
    assert_status(text_stream_push(&s, 512, buf, sizeof buf, &k), KEEL_EINVAL);
    assert_true(text_token_is_eog(t, 2));
    assert_false(text_token_is_eog(t, 403));
    text_tokenizer_close(t);
}

static void test_spm_unicode_roundtrip_and_stream(void **state)
{
    (void)state;
    text_tokenizer *t = fixture_spm();
    if (!t) return;
    int64_t n;
    size_t len;
    int32_t *ids = tok(t, g_unicode, sizeof g_unicode - 1, true, false, &n);
    char *back = detok(t, ids, n, TEXT_DECODE_REMOVE_SPECIAL, &len);
    assert_int_equal(len, sizeof g_unicode - 1);
    assert_memory_equal(back, g_unicode, len);
    free(back);
    /* without REMOVE_SPECIAL the control token renders nothing */
    back = detok(t, ids, n, 0, &len);
    assert_memory_equal(back, g_unicode, len);
    free(back);
    /* KEEP_SPACE keeps the prefix space */
    back = detok(t, ids, n, TEXT_DECODE_KEEP_SPACE, &len);
    assert_int_equal(len, sizeof g_unicode);
    assert_int_equal(back[0], ' ');
    free(back);
    /* stream: same text, each chunk whole UTF-8 */
    back = stream_all(t, ids, n, 0, &len, true);
    assert_int_equal(len, sizeof g_unicode - 1);
    assert_memory_equal(back, g_unicode, len);
    free(back);
    free(ids);
    text_tokenizer_close(t);
}

/* ---- a byte-level BPE vocabulary learned here ------------------------------ */

#define TR_MAX_SYM 1024

typedef struct trainer {
    char *sym[TR_MAX_SYM]; /* symbol texts (GPT-2 encoded) */
    int n_sym;
    char *merges[TR_MAX_SYM];
    int n_merges;
    int *words[4096]; /* symbol ids, -1 terminated */
    int n_words;
} trainer;

static size_t enc_byte(uint8_t b, char *out)
{
    /* GPT-2 map, restated independently of bpe.c: the test's oracle */
    unsigned cp = b, n = 0;
    bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    if (!printable) {
        for (unsigned i = 0; i < b; i++)
            n += !((i >= 33 && i <= 126) || (i >= 161 && i <= 172) || i >= 174);
        cp = 256 + n;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xc0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3f));
    return 2;
}

static int find_sym(trainer *tr, const char *s)
{
    for (int i = 0; i < tr->n_sym; i++)
        if (strcmp(tr->sym[i], s) == 0) return i;
    return -1;
}

static void train(trainer *tr, const char *text, int n_merges)
{
    memset(tr, 0, sizeof *tr);
    for (int b = 0; b < 256; b++) {
        char buf[4] = {0};
        enc_byte((uint8_t)b, buf);
        tr->sym[tr->n_sym++] = strdup(buf);
    }
    /* words: a space or newline starts a new word (GPT-2 style " word") */
    size_t n = strlen(text), start = 0;
    for (size_t i = 1; i <= n; i++) {
        if (i == n || text[i] == ' ' || text[i] == '\n') {
            if (tr->n_words < 4096 && i > start) {
                int *w = malloc((i - start + 1) * sizeof *w);
                for (size_t k = start; k < i; k++)
                    w[k - start] = (uint8_t)text[k];
                w[i - start] = -1;
                tr->words[tr->n_words++] = w;
            }
            start = i;
        }
    }
    static int counts[TR_MAX_SYM][TR_MAX_SYM];
    for (int m = 0; m < n_merges && tr->n_sym < TR_MAX_SYM; m++) {
        memset(counts, 0, sizeof counts);
        for (int w = 0; w < tr->n_words; w++)
            for (int *p = tr->words[w]; p[0] >= 0 && p[1] >= 0; p++)
                counts[p[0]][p[1]]++;
        int ba = -1, bb = -1, bc = 1;
        for (int a = 0; a < tr->n_sym; a++)
            for (int b = 0; b < tr->n_sym; b++)
                if (counts[a][b] > bc) ba = a, bb = b, bc = counts[a][b];
        if (ba < 0) break;
        char merged[256], rule[300];
        snprintf(merged, sizeof merged, "%s%s", tr->sym[ba], tr->sym[bb]);
        snprintf(rule, sizeof rule, "%s %s", tr->sym[ba], tr->sym[bb]);
        tr->merges[tr->n_merges++] = strdup(rule);
        int id = find_sym(tr, merged);
        if (id < 0) {
            id = tr->n_sym;
            tr->sym[tr->n_sym++] = strdup(merged);
        }
        for (int w = 0; w < tr->n_words; w++) {
            int *p = tr->words[w], *q = p;
            while (*p >= 0) {
                if (p[0] == ba && p[1] == bb) {
                    *q++ = id;
                    p += 2;
                } else {
                    *q++ = *p++;
                }
            }
            *q = -1;
        }
    }
}

static void trainer_free(trainer *tr)
{
    for (int i = 0; i < tr->n_sym; i++)
        free(tr->sym[i]);
    for (int i = 0; i < tr->n_merges; i++)
        free(tr->merges[i]);
    for (int i = 0; i < tr->n_words; i++)
        free(tr->words[i]);
}

typedef struct bpe_spec {
    const char *pre;          /* NULL: no key */
    const char *const *extra; /* extra tokens (specials) */
    const int32_t *extra_type;
    int n_extra;
    const char *const *merges; /* NULL: the trainer's */
    const char *const *tokens; /* NULL: the trainer's */
    int n_merges, n_tokens;
    bool add_bos;
} bpe_spec;

static keel_status build_bpe(const trainer *tr, const bpe_spec *sp, void **data, size_t *size)
{
    gguf_writer *w;
    keel_status st = gguf_writer_open(&w);
    if (st) return st;
    const char *const *toks = sp->tokens ? sp->tokens : (const char *const *)tr->sym;
    int n_tok = sp->tokens ? sp->n_tokens : tr->n_sym;
    const char *const *merges = sp->merges ? sp->merges : (const char *const *)tr->merges;
    int n_merges = sp->merges ? sp->n_merges : tr->n_merges;
    int n = n_tok + sp->n_extra;
    const char **all = malloc((size_t)n * sizeof *all);
    int32_t *types = malloc((size_t)n * sizeof *types);
    for (int i = 0; i < n_tok; i++)
        all[i] = toks[i], types[i] = TEXT_TOKEN_NORMAL;
    for (int i = 0; i < sp->n_extra; i++)
        all[n_tok + i] = sp->extra[i], types[n_tok + i] = sp->extra_type[i];
    if ((st = gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2")) ||
        (sp->pre && (st = gguf_writer_add_str(w, "tokenizer.ggml.pre", sp->pre))) ||
        (st = gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", all, NULL, (uint64_t)n)) ||
        (st = gguf_writer_add_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types,
                                  (uint64_t)n)) ||
        (st = gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", merges, NULL,
                                      (uint64_t)n_merges)) ||
        (sp->n_extra &&
         (st = gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)n_tok))) ||
        (sp->n_extra &&
         (st = gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)n_tok))) ||
        (st = gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", sp->add_bos)))
        goto done;
    st = gguf_writer_write_mem(w, data, size);
done:
    gguf_writer_close(w);
    free(all);
    free(types);
    return st;
}

static const char g_corpus[] =
    "Once upon a time there was a little girl named Lily. She liked to play outside in the "
    "sun with her friends. One day she saw a big red ball in the park and she wanted to play "
    "with it. The ball was shiny and round. Lily ran to the ball and kicked it high into the "
    "sky. Her friends laughed and they all played together until the sun went down. "
    "The end. Then the little dog came to the garden and the cat was there too. "
    "Tom and his mom went to the store to buy some bread and milk. Tom wanted a toy but his "
    "mom said no. Tom was sad, but then he saw a friendly old man who gave him a shiny coin. "
    "Tom smiled and said thank you. They walked home together, and the birds sang in the "
    "trees. The next day, Lily and Tom played with the ball in the garden. They were happy. "
    "\xe4\xbd\xa0\xe5\xa5\xbd \xe4\xbd\xa0\xe5\xa5\xbd caf\xc3\xa9 caf\xc3\xa9 1234 1234 1234";

static const char *const g_specials[3] = {"<|im_start|>", "<|im_end|>", "<tool>"};
static const int32_t g_special_types[3] = {TEXT_TOKEN_CONTROL, TEXT_TOKEN_CONTROL,
                                           TEXT_TOKEN_USER_DEFINED};

static text_tokenizer *trained_bpe(trainer *tr, const char *pre)
{
    train(tr, g_corpus, 200);
    bpe_spec sp = {.pre = pre, .extra = g_specials, .extra_type = g_special_types, .n_extra = 3};
    void *data;
    size_t size;
    assert_ok(build_bpe(tr, &sp, &data, &size));
    return open_gguf_tokenizer(data, size, NULL);
}

static void test_bpe_trained_roundtrip(void **state)
{
    (void)state;
    const char *pres[] = {"llama3",         "gpt2",        "qwen2",     "default",   "deepseek-llm",
                          "deepseek-v3",    "falcon",      "starcoder", "gpt-4o",    "o200k",
                          "deepseek-coder", "tekken",      "bloom",     "viking",    "seed-coder",
                          "bailingmoe",     "chatglm-bpe", "smollm",    "command-r", "stablelm2"};
    for (size_t p = 0; p < sizeof pres / sizeof pres[0]; p++) {
        trainer tr;
        text_tokenizer *t = trained_bpe(&tr, pres[p]);
        const text_tokenizer_info *in = text_tokenizer_get_info(t);
        assert_int_equal(in->type, TEXT_VOCAB_BPE);
        assert_false(in->pre_unknown);
        assert_int_equal(in->n_merges, tr.n_merges);
        if (tr.n_merges < 100) fail_msg("only %d merges learned", tr.n_merges);
        static const char bad[] = "a\xff\xfe b\xc3(\x80\xe2\x82 \x00z\xf0\x9f";
        const char *texts[3] = {g_unicode, g_corpus, bad};
        size_t lens[3] = {sizeof g_unicode - 1, sizeof g_corpus - 1, sizeof bad - 1};
        for (int k = 0; k < 3; k++) {
            int64_t n;
            size_t len;
            int32_t *ids = tok(t, texts[k], lens[k], false, false, &n);
            assert_true(n > 0);
            char *back = detok(t, ids, n, 0, &len);
            if (len != lens[k] || memcmp(back, texts[k], len) != 0)
                fail_msg("pre %s text %d: round trip differs", pres[p], k);
            free(back);
            back = stream_all(t, ids, n, 0, &len, k < 2);
            assert_int_equal(len, lens[k]);
            assert_memory_equal(back, texts[k], len);
            free(back);
            if (k == 1) assert_true(n < (int64_t)lens[k] / 2); /* merges help on the corpus */
            free(ids);
        }
        text_tokenizer_close(t);
        trainer_free(&tr);
    }
}

static void test_bpe_merges_and_pretokenizers(void **state)
{
    (void)state;
    /* a hand vocabulary: bytes, then merged tokens, with ranks */
    char *toks[256 + 8];
    for (int b = 0; b < 256; b++) {
        char buf[4] = {0};
        enc_byte((uint8_t)b, buf);
        toks[b] = strdup(buf);
    }
    const char *more[] = {"ab",
                          "bc",
                          "abc",
                          "12",
                          "123",
                          "1234",
                          "\xc4\xa0"
                          "w",
                          "\xc4\xa0"
                          "wo"};
    for (int i = 0; i < 8; i++)
        toks[256 + i] = strdup(more[i]);
    /* "b c" ranks before "a b": "abc" -> a + bc (no "a bc" merge) */
    const char *merges1[] = {"b c",  "a b",   "ab c",       "1 2",
                             "12 3", "123 4", "\xc4\xa0 w", "\xc4\xa0w o"};
    bpe_spec sp = {.pre = "gpt2",
                   .tokens = (const char *const *)toks,
                   .n_tokens = 264,
                   .merges = merges1,
                   .n_merges = 8};
    trainer dummy;
    memset(&dummy, 0, sizeof dummy);
    void *data;
    size_t size;
    assert_ok(build_bpe(&dummy, &sp, &data, &size));
    text_tokenizer *t = open_gguf_tokenizer(data, size, NULL);
    int64_t n;
    int32_t *ids = tok(t, "abc", 3, false, false, &n);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 'a');
    assert_int_equal(ids[1], 257); /* "bc" */
    free(ids);
    /* gpt2: \p{N}+ keeps "1234" whole -> one token; " wo" merges */
    ids = tok(t, "1234 wo", 7, false, false, &n);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 261);
    assert_int_equal(ids[1], 263);
    free(ids);
    text_tokenizer_close(t);
    /* llama3: \p{N}{1,3} splits "1234" -> "123" "4" */
    sp.pre = "llama3";
    assert_ok(build_bpe(&dummy, &sp, &data, &size));
    t = open_gguf_tokenizer(data, size, NULL);
    const text_tokenizer_info *in = text_tokenizer_get_info(t);
    assert_string_equal(in->pre_used, "llama3");
    assert_true(in->ignore_merges);
    ids = tok(t, "1234", 4, false, false, &n);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 260);
    assert_int_equal(ids[1], '4');
    free(ids);
    text_tokenizer_close(t);
    /* qwen2: \p{N} one digit at a time */
    sp.pre = "qwen2";
    assert_ok(build_bpe(&dummy, &sp, &data, &size));
    t = open_gguf_tokenizer(data, size, NULL);
    ids = tok(t, "1234", 4, false, false, &n);
    assert_int_equal(n, 4);
    free(ids);
    text_tokenizer_close(t);
    /* unknown and missing pre: gpt2, flagged */
    sp.pre = "no-such-pre";
    assert_ok(build_bpe(&dummy, &sp, &data, &size));
    t = open_gguf_tokenizer(data, size, NULL);
    in = text_tokenizer_get_info(t);
    assert_true(in->pre_unknown);
    assert_string_equal(in->pre_used, "gpt2");
    assert_string_equal(in->pre, "no-such-pre");
    text_tokenizer_close(t);
    sp.pre = NULL;
    assert_ok(build_bpe(&dummy, &sp, &data, &size));
    t = open_gguf_tokenizer(data, size, NULL);
    assert_true(text_tokenizer_get_info(t)->pre_unknown);
    text_tokenizer_close(t);
    for (int i = 0; i < 264; i++)
        free(toks[i]);
}

static void test_bpe_special_tokens(void **state)
{
    (void)state;
    trainer tr;
    text_tokenizer *t = trained_bpe(&tr, "qwen2");
    const text_tokenizer_info *in = text_tokenizer_get_info(t);
    int32_t im_start = text_token_find(t, "<|im_start|>", 12);
    int32_t im_end = text_token_find(t, "<|im_end|>", 10);
    int32_t tool = text_token_find(t, "<tool>", 6);
    assert_true(im_start >= 0 && im_end == im_start + 1 && tool == im_start + 2);
    assert_int_equal(in->eos, im_start);
    assert_true(text_token_is_eog(t, im_end)); /* by text */
    const char *msg = "<|im_start|>user\nhi<tool><|im_end|>";
    int64_t n;
    int32_t *ids = tok(t, msg, strlen(msg), false, true, &n);
    assert_int_equal(ids[0], im_start);
    assert_int_equal(ids[n - 1], im_end);
    assert_int_equal(ids[n - 2], tool);
    size_t len;
    char *back = detok(t, ids, n, TEXT_DECODE_UNPARSE_SPECIAL, &len);
    assert_string_equal(back, msg);
    free(back);
    back = detok(t, ids, n, 0, &len); /* control tokens hidden, user-defined shown */
    assert_string_equal(back, "user\nhi<tool>");
    free(back);
    free(ids);
    /* parse_special off: control texts are plain text, user-defined still split */
    ids = tok(t, msg, strlen(msg), false, false, &n);
    bool saw_tool = false;
    for (int64_t i = 0; i < n; i++) {
        assert_true(ids[i] != im_start && ids[i] != im_end);
        saw_tool |= ids[i] == tool;
    }
    assert_true(saw_tool);
    back = detok(t, ids, n, 0, &len);
    assert_string_equal(back, msg);
    free(back);
    free(ids);
    /* add_special with add_bos_token false: nothing added */
    ids = tok(t, "x", 1, true, false, &n);
    assert_int_equal(n, 1);
    free(ids);
    /* adjacent and overlapping special texts */
    const char *adj = "<|im_end|><|im_end|>x<|im_end|";
    ids = tok(t, adj, strlen(adj), false, true, &n);
    assert_int_equal(ids[0], im_end);
    assert_int_equal(ids[1], im_end);
    back = detok(t, ids, n, TEXT_DECODE_UNPARSE_SPECIAL, &len);
    assert_string_equal(back, adj);
    free(back);
    free(ids);
    text_tokenizer_close(t);
    trainer_free(&tr);
}

static void test_bad_metadata(void **state)
{
    (void)state;
    struct {
        const char *model;
        int n_scores, n_types;
        bool dup, merges;
        keel_status want;
        const char *msg;
    } cases[] = {
        {"bert", 3, 3, false, true, KEEL_EUNSUPPORTED, "'bert' is not supported"},
        {"llama", 2, 3, false, false, KEEL_EFORMAT, "tokenizer.ggml.scores"},
        {"llama", 3, 4, false, false, KEEL_EFORMAT, "tokenizer.ggml.token_type"},
        {"llama", 3, 3, true, false, KEEL_EFORMAT, "duplicate token text at ids 0 and 2"},
        {"gpt2", 3, 3, false, false, KEEL_EFORMAT, "tokenizer.ggml.merges"},
        {NULL, 3, 3, false, false, KEEL_ENOENT, "missing key tokenizer.ggml.model"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        gguf_writer *w;
        assert_ok(gguf_writer_open(&w));
        const char *toks[3] = {"a", "b", cases[c].dup ? "a" : "c"};
        float sc[4] = {0, 1, 2, 3};
        int32_t ty[4] = {1, 1, 1, 1};
        if (cases[c].model)
            assert_ok(gguf_writer_add_str(w, "tokenizer.ggml.model", cases[c].model));
        assert_ok(gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, 3));
        assert_ok(gguf_writer_add_arr(w, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, sc,
                                      (uint64_t)cases[c].n_scores));
        assert_ok(gguf_writer_add_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, ty,
                                      (uint64_t)cases[c].n_types));
        void *data;
        size_t size;
        assert_ok(gguf_writer_write_mem(w, &data, &size));
        gguf_writer_close(w);
        gguf *g;
        assert_ok(gguf_open_owned(data, size, &g, NULL));
        text_tokenizer *t;
        char err[BASE_ERR_CAP] = "";
        assert_status(text_tokenizer_open(g, &t, err), cases[c].want);
        assert_null(t);
        if (!strstr(err, cases[c].msg)) fail_msg("'%s' lacks '%s'", err, cases[c].msg);
        gguf_close(g);
    }
}

/* ---- allocation failures ---------------------------------------------------- */

typedef struct sweep_ctx {
    const void *data;
    size_t size;
} sweep_ctx;

static keel_status open_tok_op(void *vctx)
{
    sweep_ctx *c = vctx;
    gguf *g;
    keel_status st = gguf_open_buffer(c->data, c->size, &g, NULL);
    if (st) return st;
    text_tokenizer *t;
    st = text_tokenizer_open(g, &t, NULL);
    if (st == KEEL_OK) {
        int32_t ids[512];
        int64_t n;
        st = text_tokenize(t, g_unicode, 200, true, true, ids, 512, &n, NULL);
        text_tokenizer_close(t);
    }
    gguf_close(g);
    return st;
}

static void test_alloc_sweep_tokenizers(void **state)
{
    (void)state;
    trainer tr;
    train(&tr, g_corpus, 100);
    bpe_spec sp = {
        .pre = "llama3", .extra = g_specials, .extra_type = g_special_types, .n_extra = 3};
    sweep_ctx c;
    void *data;
    assert_ok(build_bpe(&tr, &sp, &data, &c.size));
    c.data = data;
    assert_true(test_alloc_sweep(open_tok_op, &c) >= 10);
    base_free(data, c.size);
    trainer_free(&tr);
    /* SPM: a small vocabulary written here */
    gguf_writer *w;
    assert_ok(gguf_writer_open(&w));
    const char *toks[8] = {"<unk>",
                           "<s>",
                           "</s>",
                           "\xe2\x96\x81",
                           "a",
                           ("\xe2\x96\x81"
                            "a"),
                           "b",
                           "<0x41>"};
    int32_t ty[8] = {2, 3, 3, 1, 1, 1, 1, 6};
    float sc[8] = {0, 0, 0, -1, -2, -3, -4, 0};
    assert_ok(gguf_writer_add_str(w, "tokenizer.ggml.model", "llama"));
    assert_ok(gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, 8));
    assert_ok(gguf_writer_add_arr(w, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, sc, 8));
    assert_ok(gguf_writer_add_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, ty, 8));
    assert_ok(gguf_writer_write_mem(w, &data, &c.size));
    gguf_writer_close(w);
    c.data = data;
    assert_true(test_alloc_sweep(open_tok_op, &c) >= 5);
    base_free(data, c.size);
}

/* ---- streams that continue a prompt (issue 8 item 1) ---------------------- */

/* For every split k of ids: detokenize(ids[0..k)) followed by a stream
 * started after ids[0..k) and fed ids[k..n) equals detokenize(ids[0..n)).
 * Returns how many splits changed the continuation's first byte compared
 * with a stream started at the beginning of a text. */
static int check_after(const text_tokenizer *t, const int32_t *ids, int64_t n)
{
    size_t flen;
    char *full = detok(t, ids, n, 0, &flen);
    size_t cap = text_tokenizer_max_piece(t) + 4;
    char *chunk = malloc(cap);
    int differs = 0;
    for (int64_t k = 0; k <= n; k++) {
        size_t plen;
        char *pre = detok(t, ids, k, 0, &plen);
        text_stream s;
        assert_ok(text_stream_init_after(&s, t, 0, ids, k));
        char *out = malloc(flen + 8);
        size_t total = 0, c;
        for (int64_t i = k; i < n; i++) {
            assert_ok(text_stream_push(&s, ids[i], chunk, cap, &c));
            assert_true(total + c <= flen);
            memcpy(out + total, chunk, c);
            total += c;
        }
        assert_ok(text_stream_flush(&s, chunk, cap, &c));
        memcpy(out + total, chunk, c);
        total += c;
        if (plen + total != flen || memcmp(full, pre, plen) != 0 || memcmp(full + plen, out, total) != 0)
            fail_msg("split %lld of %lld: '%s' + '%.*s' != '%s'", (long long)k, (long long)n, pre,
                     (int)total, out, full);
        /* a stream started as at the start of a text drops the space */
        size_t slen;
        char *plain = stream_all(t, ids + k, n - k, 0, &slen, false);
        if (slen != total || memcmp(plain, out, total) != 0) differs++;
        free(plain);
        free(out);
        free(pre);
    }
    free(chunk);
    free(full);
    return differs;
}

static void test_stream_continues_prompt(void **state)
{
    (void)state;
    const char *text = "Tom and his dog went to the park. They played with a ball.";
    /* generated SPM vocabulary (no fixtures needed), the fixture's, and a BPE one */
    char path[64] = "/tmp/keel_tok_spm_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    keel_gen_params gp = keel_gen_params_default();
    gp.arch = "llama";
    char err[BASE_ERR_CAP] = "";
    assert_ok(keel_gen_model(&gp, path, err));
    gguf *g;
    assert_ok(gguf_open_file(path, &g, err));
    text_tokenizer *spm[2] = {NULL, fixture_spm()};
    assert_ok(text_tokenizer_open(g, &spm[0], err));
    gguf_close(g);
    unlink(path);
    for (int v = 0; v < 2; v++) {
        text_tokenizer *t = spm[v];
        if (!t) continue;
        assert_true(text_tokenizer_get_info(t)->add_space_prefix);
        int64_t n;
        int32_t *ids = tok(t, text, strlen(text), true, false, &n);
        /* every split before a word after the first: the old stream lost that space */
        int words = 0;
        for (int64_t k = 2; k < n; k++) {
            char pc[64];
            size_t pl;
            assert_ok(text_token_to_piece(t, ids[k], false, pc, sizeof pc, &pl));
            words += pl > 0 && pc[0] == ' ';
        }
        assert_true(words >= 8);
        assert_int_equal(check_after(t, ids, n), words);
        /* after BOS alone the space rule still applies (a text starting there) */
        text_stream s, s0;
        char buf[64], buf0[64];
        size_t k, k0;
        text_stream_init(&s0, t, 0);
        assert_ok(text_stream_push(&s0, ids[1], buf0, sizeof buf0, &k0));
        assert_ok(text_stream_init_after(&s, t, 0, ids, 1));
        assert_ok(text_stream_push(&s, ids[1], buf, sizeof buf, &k));
        assert_int_equal(k, k0);
        assert_memory_equal(buf, buf0, k);
        /* a bad id: EINVAL, the stream starts as at the start of a text */
        int32_t bad[2] = {ids[1], 1 << 20};
        assert_status(text_stream_init_after(&s, t, 0, bad, 2), KEEL_EINVAL);
        assert_ok(text_stream_push(&s, ids[1], buf, sizeof buf, &k));
        assert_int_equal(k, k0);
        assert_memory_equal(buf, buf0, k);
        assert_status(text_stream_init_after(&s, t, 0, NULL, 1), KEEL_EINVAL);
        free(ids);
        text_tokenizer_close(t);
    }
    trainer tr;
    text_tokenizer *t = trained_bpe(&tr, "llama3");
    int64_t n;
    int32_t *ids = tok(t, g_corpus, 200, false, false, &n);
    assert_int_equal(check_after(t, ids, n), 0); /* no space rule in BPE: same as before */
    free(ids);
    text_tokenizer_close(t);
    trainer_free(&tr);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spm_fixture_prompt),
        cmocka_unit_test(test_spm_pieces_and_fallback),
        cmocka_unit_test(test_spm_unicode_roundtrip_and_stream),
        cmocka_unit_test(test_bpe_trained_roundtrip),
        cmocka_unit_test(test_bpe_merges_and_pretokenizers),
        cmocka_unit_test(test_bpe_special_tokens),
        cmocka_unit_test(test_bad_metadata),
        cmocka_unit_test(test_alloc_sweep_tokenizers),
        cmocka_unit_test(test_stream_continues_prompt),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
