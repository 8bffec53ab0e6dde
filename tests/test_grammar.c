/*
 * test_grammar.c — src/grammar and keel_grammar_*: GBNF errors (named, with
 * line and column), accept/reject of texts, llama.cpp's own grammar cases
 * and grammar files (tests/data/grammar, extracted by
 * tools/grammar/extract_llamacpp_grammar.py), token masks against a brute
 * force over a vocabulary with multi-element tokens and pieces that cut
 * UTF-8 characters, masks composed from stack segments against whole-stack
 * walks, the caps (a refusal, not a hang), allocation failures,
 * and sampling through keel_complete with a random-weight model at
 * temperature 1: every output is a complete sentence of its grammar.
 */
#include "testutil.h"
#include "gramtest.h"
#include "base/base.h"
#include "grammar/grammar.h"
#include "tensor/tensor.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static gram *compile_ok(const char *src)
{
    gram *g = NULL;
    char err[BASE_ERR_CAP] = "";
    keel_status st = gram_compile(src, strlen(src), &g, err);
    if (st) fail_msg("compile: %s: %s\n%s", keel_status_name(st), err, src);
    return g;
}

/* ---- syntax and errors ----------------------------------------------------------- */

static void test_errors(void **state)
{
    (void)state;
    static const struct {
        const char *src;
        keel_status st;
        const char *msg;
    } cases[] = {
        {"root ::= \"a", KEEL_EFORMAT, "line 1 col 10: unterminated string literal"},
        {"root ::= [a-", KEEL_EFORMAT, "unterminated character class"},
        {"root ::= [z-a]", KEEL_EFORMAT, "line 1 col 12: character range out of order"},
        {"root ::= \"a\"\nx ::= y", KEEL_EFORMAT, "line 2 col 7: undefined rule 'y'"},
        {"rot ::= \"a\"", KEEL_EFORMAT, "no rule named 'root'"},
        {"root = \"a\"", KEEL_EFORMAT, "line 1 col 6: expected '::=' after the rule name"},
        {"root ::= \"a\" )", KEEL_EFORMAT, "line 1 col 14: expected the end of the line"},
        {"root ::= ( \"a\"", KEEL_EFORMAT, "line 1 col 10: expected ')' to close this group"},
        {"root ::= * \"a\"", KEEL_EFORMAT, "needs an item before it"},
        {"root ::= \"a\"{3,2}", KEEL_EFORMAT, "n < m"},
        {"root ::= \"a\"{1000000}", KEEL_ERANGE, "above 100000"},
        {"root ::= \"\\q\"", KEEL_EFORMAT, "unknown escape"},
        {"root ::= \"\\uD800\"", KEEL_EFORMAT, "surrogate"},
        {"root ::= \"\\U00110000\"", KEEL_EFORMAT, "above U+10FFFF"},
        {"root ::= \"a\"\nroot ::= \"b\"", KEEL_EFORMAT, "line 2 col 1: rule 'root' is defined twice"},
        {"root ::= <[10]> \"a\"", KEEL_EUNSUPPORTED, "token references"},
        {"root ::= \"a\" | root \"a\"", KEEL_EUNSUPPORTED, "left recursion (rewrite it as repetition): root"},
        {"root ::= x\nx ::= y \"b\"\ny ::= e x | \"c\"\ne ::= \"\" | \"d\"", KEEL_EUNSUPPORTED,
         "left recursion (rewrite it as repetition): x -> y -> x"},
        {"root ::= \"\xff\"", KEEL_EFORMAT, "invalid UTF-8"},
        {"", KEEL_EFORMAT, "no rule named 'root'"},
    };
    for (size_t i = 0; i < BASE_ARRAY_LEN(cases); i++) {
        gram *g = NULL;
        char err[BASE_ERR_CAP] = "";
        keel_status st = gram_compile(cases[i].src, strlen(cases[i].src), &g, err);
        if (st != cases[i].st || !strstr(err, cases[i].msg))
            fail_msg("case %zu (%s): got %s '%s', want %s '%s'", i, cases[i].src, keel_status_name(st), err,
                     keel_status_name(cases[i].st), cases[i].msg);
        assert_null(g);
    }
}

static void test_accept_reject(void **state)
{
    (void)state;
    static const struct {
        const char *src, *yes[6], *no[6];
    } cases[] = {
        {"root ::= \"ab\" [c-e]+ (\"x\" | \"yz\")? # comment", {"abc", "abcdex", "abeyz"}, {"", "ab", "abcx y", "abcyzz"}},
        {"root ::= [^a-z\\n]{2,3}", {"AB", "1é2", "日本語"}, {"A", "ABCD", "aB", "A\n"}},
        {"root ::= .{2}", {"é日", "ab", "\xf0\x9f\x94\xb5x"}, {"abc", "\xc3", "é"}},
        {"root ::= \"\\x41\\u00e9\\U0001F535\\t\\\"\\\\\\[\\]\"", {"Aé\xf0\x9f\x94\xb5\t\"\\[]"}, {"A"}},
        {"root ::= (\"a\"?)* \"b\"\n", {"b", "aab"}, {"", "ba"}},
        {"root ::= x\nx ::= x2 | \"q\"\nx2 ::= \"(\" x \")\"", {"q", "((q))"}, {"(q", "q)"}},
        {"root ::= [\\x00-\\x7f]* \"é\"", {"é", "abcé"}, {"\xc3", "ée"}},
        {"root ::= \"\" | \"a\" root", {"", "aaaa"}, {"b"}},
        {"root ::=\n  \"a\" (\n  \"b\" |\n  \"c\"\n  )\n", {"ab", "ac"}, {"a"}},
        {"root ::= \"a\"{2,} \"b\"{0,2}", {"aa", "aaab", "aaaaabb"}, {"a", "aabbb"}},
        /* a repetition of nothing first in its sequence (the fuzzer's: no elements yet) */
        {"root ::= \"\"{2} \"a\"", {"a"}, {"", "aa"}},
    };
    for (size_t i = 0; i < BASE_ARRAY_LEN(cases); i++) {
        gram *g = compile_ok(cases[i].src);
        for (int k = 0; k < 6 && cases[i].yes[k]; k++)
            if (!test_gram_accepts(g, cases[i].yes[k], strlen(cases[i].yes[k])))
                fail_msg("case %zu: '%s' rejected", i, cases[i].yes[k]);
        for (int k = 0; k < 6 && cases[i].no[k]; k++)
            if (test_gram_accepts(g, cases[i].no[k], strlen(cases[i].no[k])))
                fail_msg("case %zu: '%s' accepted", i, cases[i].no[k]);
        gram_free(g);
    }
}

/* ---- llama.cpp's cases --------------------------------------------------------- */

static const char *data_dir(void)
{
    const char *d = getenv("KEEL_TESTDATA");
    return d ? d : "tests/data";
}

static void test_llamacpp_cases(void **state)
{
    (void)state;
    char path[1024];
    snprintf(path, sizeof path, "%s/grammar/llamacpp_grammar_cases.json", data_dir());
    json_error_t je;
    json_t *doc = json_load_file(path, 0, &je);
    if (!doc) fail_msg("%s: %s", path, je.text);
    json_t *cases = json_object_get(doc, "cases"), *c;
    size_t i;
    int n_text = 0, n_tok = 0;
    json_array_foreach(cases, i, c) {
        const char *src = json_string_value(json_object_get(c, "grammar"));
        gram *g = NULL;
        char err[BASE_ERR_CAP] = "";
        keel_status st = gram_compile(src, strlen(src), &g, err);
        if (json_is_true(json_object_get(c, "tokens"))) {
            /* token references: refused, named */
            assert_int_equal(st, KEEL_EUNSUPPORTED);
            assert_non_null(strstr(err, "token references"));
            n_tok++;
            continue;
        }
        if (st) fail_msg("%s: %s", json_string_value(json_object_get(c, "desc")), err);
        for (int pass = 1; pass >= 0; pass--) {
            json_t *texts = json_object_get(c, pass ? "pass" : "fail"), *t;
            size_t k;
            json_array_foreach(texts, k, t) {
                bool ok = test_gram_accepts(g, json_string_value(t), json_string_length(t));
                if (ok != (pass == 1))
                    fail_msg("%s: '%s' should be %s", json_string_value(json_object_get(c, "desc")),
                             json_string_value(t), pass ? "accepted" : "rejected");
                n_text++;
            }
        }
        gram_free(g);
    }
    json_t *refused = json_object_get(doc, "refused");
    json_array_foreach(refused, i, c) {
        const char *src = json_string_value(json_object_get(c, "grammar"));
        gram *g = NULL;
        char err[BASE_ERR_CAP] = "";
        keel_status st = gram_compile(src, strlen(src), &g, err);
        if (st != KEEL_EFORMAT && st != KEEL_EUNSUPPORTED)
            fail_msg("%s: compiled (%s)", json_string_value(json_object_get(c, "desc")), keel_status_name(st));
    }
    json_t *files = json_object_get(doc, "grammar_files");
    json_array_foreach(files, i, c) {
        snprintf(path, sizeof path, "%s/grammar/grammars/%s", data_dir(), json_string_value(c));
        size_t n = 0;
        char *src = test_read_file(path, &n);
        assert_non_null(src);
        gram *g = NULL;
        char err[BASE_ERR_CAP] = "";
        if (gram_compile(src, n, &g, err) != KEEL_OK) fail_msg("%s: %s", path, err);
        gram_free(g);
        free(src);
    }
    assert_true(n_text >= 100);
    assert_int_equal(n_tok, 2);
    assert_true(json_array_size(files) >= 8);
    assert_true(json_array_size(refused) >= 6);
    json_decref(doc);
}

/* ---- token masks ------------------------------------------------------------------ */

#define NV 700

typedef struct tvocab {
    uint8_t *piece[NV];
    size_t len[NV];
    int32_t eog[2];
} tvocab;

/* Single bytes (0x00..0xff), slices of a sample cut at any byte (pieces
 * that start or end inside a UTF-8 character), empty pieces (control
 * tokens) and two end-of-generation tokens. */
static void make_vocab(tvocab *tv, gram_vocab **v)
{
    static const char *sample =
        "{\"name\": \"Zoë\", \"tags\": [\"日本語\", \"ok\"], \"n\": -12.5e+3, \"t\": true, \"x\": null}\n"
        "1 + 2 * (3 - 4) / 5; e4 e5 Nf3 O-O 🔵🟠 — \\\"esc\\\\\\n\" [1,2,3] ä ö ü ß ç ñ "
        "- item one\n- item two\n";
    base_rng r;
    base_rng_seed(&r, 99);
    size_t n = strlen(sample);
    for (int i = 0; i < NV; i++) {
        size_t len, off = 0;
        if (i < 256) {
            len = 1;
        } else if (i < 260) {
            len = 0;
        } else {
            len = 2 + (size_t)base_rng_below(&r, 7);
            off = (size_t)base_rng_below(&r, n - len);
        }
        tv->len[i] = len;
        tv->piece[i] = len ? malloc(len) : NULL;
        if (i < 256)
            tv->piece[i][0] = (uint8_t)i;
        else if (len)
            memcpy(tv->piece[i], sample + off, len);
    }
    tv->eog[0] = 257;
    tv->eog[1] = 259;
    char err[BASE_ERR_CAP] = "";
    if (gram_vocab_build(NV, (const uint8_t *const *)tv->piece, tv->len, tv->eog, 2, v, err)) fail_msg("%s", err);
}

static void free_vocab(tvocab *tv)
{
    for (int i = 0; i < NV; i++) free(tv->piece[i]);
}

/* A random walk through the grammar's tokens; at each step the mask must
 * equal a brute force: token t is allowed iff the text so far followed by
 * its piece is a viable prefix (an end-of-generation token iff the text is
 * complete). */
static void walk(const gram *g, const gram_vocab *v, const tvocab *tv, uint64_t seed, int steps)
{
    gram_matcher *m = NULL, *ref = NULL;
    char err[BASE_ERR_CAP] = "";
    assert_ok(gram_matcher_open(g, v, NULL, &m, err));
    assert_ok(gram_matcher_open(g, NULL, NULL, &ref, err));
    uint8_t text[4096];
    size_t n_text = 0;
    uint64_t mask[(NV + 63) / 64];
    base_rng r;
    base_rng_seed(&r, seed);
    for (int s = 0; s < steps; s++) {
        assert_ok(gram_matcher_mask(m, mask));
        int32_t allowed[NV], n_allowed = 0;
        for (int32_t t = 0; t < NV; t++) {
            bool bit = (mask[t / 64] >> (t % 64)) & 1u, want;
            if (t == 257 || t == 259) {
                want = gram_matcher_complete(m);
            } else if (tv->len[t] == 0) {
                want = false;
            } else {
                assert_ok(gram_matcher_reset(ref));
                assert_ok(gram_matcher_accept_bytes(ref, text, n_text, NULL));
                keel_status st = gram_matcher_accept_bytes(ref, tv->piece[t], tv->len[t], NULL);
                if (st != KEEL_OK && st != KEEL_EINVAL) fail_msg("ref: %s", gram_matcher_error(ref));
                want = st == KEEL_OK;
            }
            if (bit != want)
                fail_msg("step %d after '%.*s': token %d ('%.*s') mask %d, brute force %d", s, (int)n_text, text, t,
                         (int)tv->len[t], tv->piece[t], bit, want);
            if (bit) allowed[n_allowed++] = t;
        }
        if (n_allowed == 0) {
            assert_true(gram_matcher_done(m) == false || gram_matcher_complete(m));
            break;
        }
        int32_t t = allowed[base_rng_below(&r, (uint64_t)n_allowed)];
        assert_ok(gram_matcher_accept_token(m, t));
        if (t == 257 || t == 259) {
            assert_true(test_gram_accepts(g, (const char *)text, n_text));
            assert_status(gram_matcher_accept_token(m, 'a'), KEEL_EINVAL);
            break;
        }
        assert_true(n_text + tv->len[t] <= sizeof text);
        memcpy(text + n_text, tv->piece[t], tv->len[t]);
        n_text += tv->len[t];
    }
    /* a token the state does not allow leaves it unchanged */
    gram_matcher_close(m);
    gram_matcher_close(ref);
}

static char *read_data_grammar(const char *name)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/grammar/grammars/%s", data_dir(), name);
    size_t n = 0;
    char *s = test_read_file(path, &n);
    if (!s) fail_msg("cannot read %s", path);
    char *z = malloc(n + 1);
    assert_non_null(z);
    memcpy(z, s, n);
    z[n] = 0;
    free(s);
    return z;
}

static void test_masks(void **state)
{
    (void)state;
    tvocab tv;
    gram_vocab *v = NULL;
    make_vocab(&tv, &v);
    const char *files[] = {"json.gbnf", "arithmetic.gbnf", "list.gbnf", "chess.gbnf", "japanese.gbnf"};
    for (size_t f = 0; f < BASE_ARRAY_LEN(files); f++) {
        char *src = read_data_grammar(files[f]);
        gram *g = compile_ok(src);
        for (uint64_t seed = 1; seed <= 4; seed++) walk(g, v, &tv, seed * 31 + f, 40);
        gram_free(g);
        free(src);
    }
    static const char *inline_grammars[] = {
        "root ::= [α-ω]+ \"é\"? ([^a-z]{2,3})* \"\\n\"",
        "root ::= (\"ab\" | \"a\" \"b\" \"c\" | [a-c]{2})+ \"!\"?",
        "root ::= \"日本\" [^\\x00-\\x7f]{0,4} \"語\"",
    };
    for (size_t i = 0; i < BASE_ARRAY_LEN(inline_grammars); i++) {
        gram *g = compile_ok(inline_grammars[i]);
        for (uint64_t seed = 1; seed <= 6; seed++) walk(g, v, &tv, seed * 7 + i, 30);
        gram_free(g);
    }
    /* an end-of-generation token before the end and an unknown id are refused */
    gram *g = compile_ok("root ::= \"ab\"");
    gram_matcher *m = NULL;
    assert_ok(gram_matcher_open(g, v, NULL, &m, NULL));
    uint64_t first[(NV + 63) / 64];
    assert_ok(gram_matcher_mask(m, first));
    assert_status(gram_matcher_accept_token(m, 257), KEEL_EINVAL);
    assert_status(gram_matcher_accept_token(m, NV), KEEL_EINVAL);
    assert_status(gram_matcher_accept_token(m, 'b'), KEEL_EINVAL);
    assert_ok(gram_matcher_accept_token(m, 'a'));
    assert_false(gram_matcher_complete(m));
    assert_ok(gram_matcher_accept_token(m, 'b'));
    assert_true(gram_matcher_done(m));
    float logits[NV];
    for (int i = 0; i < NV; i++) logits[i] = 1.0f;
    assert_ok(gram_matcher_apply(m, logits));
    for (int i = 0; i < NV; i++) assert_true((logits[i] == 1.0f) == (i == 257 || i == 259));
    gram_stats gs;
    gram_matcher_stats(m, &gs);
    assert_true(gs.mask_misses >= 1);
    gram_matcher_close(m);
    gram_free(g);
    gram_vocab_free(v);
    free_vocab(&tv);
}

/* ---- bounds -------------------------------------------------------------------------- */

static void test_limits(void **state)
{
    (void)state;
    /* many stacks in one state: refused past max_set, state unchanged */
    gram *g = compile_ok("root ::= \"a\" (x | y | z | w)\nx ::= \"b\"\ny ::= \"c\"\nz ::= \"d\"\nw ::= \"e\"");
    gram_limits lim = gram_limits_default();
    lim.max_set = 3;
    gram_matcher *m = NULL;
    char err[BASE_ERR_CAP] = "";
    assert_ok(gram_matcher_open(g, NULL, &lim, &m, err));
    assert_status(gram_matcher_accept_bytes(m, (const uint8_t *)"a", 1, NULL), KEEL_ERANGE);
    assert_non_null(strstr(gram_matcher_error(m), "stacks in one state"));
    assert_ok(gram_matcher_accept_bytes(m, (const uint8_t *)"", 0, NULL));
    assert_false(gram_matcher_complete(m));
    gram_matcher_close(m);
    gram_free(g);
    /* deep nesting: distinct stacks capped */
    g = compile_ok("root ::= \"(\" root \")\" | \"x\"");
    lim = gram_limits_default();
    lim.max_nodes = 200;
    assert_ok(gram_matcher_open(g, NULL, &lim, &m, err));
    char deep[400];
    memset(deep, '(', sizeof deep);
    assert_status(gram_matcher_accept_bytes(m, (const uint8_t *)deep, sizeof deep, NULL), KEEL_ERANGE);
    assert_non_null(strstr(gram_matcher_error(m), "parser stacks"));
    gram_matcher_close(m);
    gram_free(g);
    /* a repetition whose expansion is too large is refused at compile time */
    const char *big = "root ::= \"abcdefghij\"{100000} \"abcdefghij\"{100000} \"abcdefghij\"{100000} "
                      "\"abcdefghij\"{100000} \"abcdefghij\"{100000}";
    assert_status(gram_compile(big, strlen(big), &g, err), KEEL_ERANGE);
}

/* ---- allocation failures ---------------------------------------------------------------- */

static keel_status compile_json_op(void *ctx)
{
    const char *src = ctx;
    gram *g = NULL;
    keel_status st = gram_compile(src, strlen(src), &g, NULL);
    if (st) return st;
    gram_matcher *m = NULL;
    st = gram_matcher_open(g, NULL, NULL, &m, NULL);
    const char *text = "{\"a\": [1, \"é\"]}";
    if (!st) st = gram_matcher_accept_bytes(m, (const uint8_t *)text, strlen(text), NULL);
    gram_matcher_close(m);
    gram_free(g);
    return st;
}

static void test_alloc_failures(void **state)
{
    (void)state;
    char *src = read_data_grammar("json.gbnf");
    assert_true(test_alloc_sweep(compile_json_op, src) > 10);
    free(src);
}

/* ---- JSON Schema ------------------------------------------------------------------------ */

static void test_schema(void **state)
{
    (void)state;
    static const struct {
        const char *schema, *yes[6], *no[6];
    } cases[] = {
        {"{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":5},"
         "\"age\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\",3]},"
         "\"minItems\":1,\"maxItems\":2},\"x\":{\"anyOf\":[{\"type\":\"null\"},{\"type\":\"boolean\"}]}},"
         "\"required\":[\"name\",\"tags\"],\"additionalProperties\":false}",
         {"{\"name\":\"bob\",\"tags\":[\"a\"]}", "{\"name\":\"bob\",\"age\":-3,\"tags\":[\"a\",3],\"x\":null}",
          "{ \"name\" : \"\\u00e9\" , \"tags\" : [ 3 ] }", "{\"name\":\"日本\",\"tags\":[\"b\"],\"x\":true}"},
         {"{\"name\":\"\",\"tags\":[\"a\"]}", "{\"name\":\"bob\",\"tags\":[]}", "{\"tags\":[\"a\"],\"name\":\"bob\"}",
          "{\"name\":\"bob\",\"tags\":[\"a\"],\"z\":1}", "{\"name\":\"bobbie\",\"tags\":[\"a\"]}",
          "{\"name\":\"b\",\"tags\":[\"a\",\"a\",\"a\"]}"}},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"const\":1}}}",
         {"{}", "{\"a\":1}", "{\"a\":1,\"zz\":[true]}", "{\"q\":{}}"}, {"{\"a\":2}", "[]", "{\"a\":1,}"}},
        {"{\"type\":[\"integer\",\"null\"]}", {"0", "-12", "null"}, {"1.5", "01", "\"1\"", "-"}},
        {"{\"type\":\"number\"}", {"0", "-1.5e+3", "2E7", "0.25"}, {".5", "1.", "+1", "1e"}},
        {"true", {"{\"a\":[1,{}]}", "\"x\"", "null", "-0.5"}, {"", "{", "nul"}},
        {"{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":1},\"maxItems\":0}", {"[]", "[ ]"}, {"[\"\"]"}},
        {"{\"type\":\"object\",\"properties\":{\"ab\":{\"type\":\"null\"},\"b\":{\"type\":\"null\"},\"é\":{\"type\":\"null\"}}}",
         {"{\"a\":1}", "{\"abc\":1,\"\":2}", "{\"ab\":null,\"b\":null,\"éé\":3}", "{\"éx\":1}"},
         {"{\"ab\":1}", "{\"b\":null,\"ab\":null}", "{\"b\":null,\"b\":1}", "{\"é\":1}", "{\"x\":1,\"ab\":null}"}},
        {"{\"type\":\"object\",\"additionalProperties\":{\"type\":\"boolean\"}}",
         {"{}", "{\"k\":true,\"j\":false}"}, {"{\"k\":1}"}},
        /* $ref: a recursive list through "#", shared $defs, an escaped pointer */
        {"{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"next\":{\"anyOf\":[{\"$ref\":\"#\"},"
         "{\"type\":\"null\"}]}},\"required\":[\"v\"],\"additionalProperties\":false}",
         {"{\"v\":1}", "{\"v\":1,\"next\":{\"v\":2,\"next\":null}}", "{\"v\":1,\"next\":{\"v\":2,\"next\":{\"v\":3}}}"},
         {"{\"v\":1,\"next\":{\"next\":null}}", "{\"v\":1,\"next\":1}", "{\"v\":1,\"next\":{\"v\":2,\"w\":3}}"}},
        {"{\"$defs\":{\"pt\":{\"type\":\"array\",\"items\":{\"type\":\"number\"},\"minItems\":2,\"maxItems\":2}},"
         "\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#/$defs/pt\"},\"b\":{\"$ref\":\"#/$defs/pt\",\"title\":\"B\"}},"
         "\"required\":[\"a\",\"b\"]}",
         {"{\"a\":[1,2],\"b\":[0,0.5]}"}, {"{\"a\":[1],\"b\":[1,2]}", "{\"a\":[1,2]}", "{\"a\":[1,2],\"b\":[\"x\",1]}"}},
        {"{\"definitions\":{\"a/b\":{\"const\":\"x\"},\"c~d\":{\"enum\":[1,2]}},\"type\":\"array\","
         "\"items\":{\"anyOf\":[{\"$ref\":\"#/definitions/a~1b\"},{\"$ref\":\"#/definitions/c~0d\"}]}}",
         {"[]", "[\"x\",2,1]"}, {"[\"y\"]", "[3]"}},
        /* prefixItems: a tuple, shorter ones valid, then items (false: no more) */
        {"{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"},{\"type\":\"integer\"}],\"items\":false}",
         {"[]", "[\"a\"]", "[\"a\",1]"}, {"[1]", "[\"a\",\"b\"]", "[\"a\",1,2]"}},
        {"{\"type\":\"array\",\"prefixItems\":[{\"const\":0},{\"const\":1}],\"items\":{\"type\":\"boolean\"},"
         "\"minItems\":1,\"maxItems\":4}",
         {"[0]", "[0,1]", "[0,1,true]", "[0,1,true,false]"}, {"[]", "[1]", "[0,true]", "[0,1,true,false,true]", "[0,1,2]"}},
        {"{\"type\":\"array\",\"prefixItems\":[{\"type\":\"null\"}],\"minItems\":3}",
         {"[null,1,\"x\"]", "[null,{},[],4]"}, {"[null,1]", "[1,2,3]"}},
        {"{\"type\":\"array\",\"items\":false}", {"[]", "[ ]"}, {"[1]"}},
    };
    for (size_t i = 0; i < BASE_ARRAY_LEN(cases); i++) {
        gram *g = NULL;
        char err[BASE_ERR_CAP] = "";
        if (gram_compile_schema(cases[i].schema, strlen(cases[i].schema), &g, err))
            fail_msg("schema %zu: %s", i, err);
        for (int k = 0; k < 6 && cases[i].yes[k]; k++)
            if (!test_gram_accepts(g, cases[i].yes[k], strlen(cases[i].yes[k])))
                fail_msg("schema %zu: '%s' rejected", i, cases[i].yes[k]);
        for (int k = 0; k < 6 && cases[i].no[k]; k++)
            if (test_gram_accepts(g, cases[i].no[k], strlen(cases[i].no[k])))
                fail_msg("schema %zu: '%s' accepted", i, cases[i].no[k]);
        gram_free(g);
    }
    static const struct {
        const char *schema;
        keel_status st;
        const char *msg;
    } bad[] = {
        {"{\"type\":\"array\",\"uniqueItems\":true}", KEEL_EUNSUPPORTED, "'uniqueItems' true is not supported"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"$dynamicRef\":\"#x\"}}}", KEEL_EUNSUPPORTED,
         "names nothing in the schema at /properties/a"},
        {"{\"anyOf\":[{\"type\":\"null\"},{\"$ref\":\"#/x\"}]}", KEEL_EUNSUPPORTED,
         "a '$ref' that names nothing in the schema at /anyOf/1"},
        {"{\"$ref\":\"other.json#/a\"}", KEEL_EUNSUPPORTED, "another document"},
        {"{\"$ref\":\"#node\"}", KEEL_EUNSUPPORTED, "'$ref' to the anchor '#node' that names nothing"},
        {"{\"$defs\":{\"a\":{\"$ref\":\"#/$defs/b\"},\"b\":{\"$ref\":\"#/$defs/a\"}},\"$ref\":\"#/$defs/a\"}",
         KEEL_EUNSUPPORTED, "a '$ref' cycle that never reaches a schema"},
        {"{\"minimun\":1}", KEEL_EUNSUPPORTED, "keyword 'minimun' is not supported at /"},
        {"{\"type\":\"array\",\"items\":[{}]}", KEEL_EUNSUPPORTED, "use prefixItems"},
        {"{\"type\":\"decimal\"}", KEEL_EUNSUPPORTED, "the unknown type 'decimal'"},
        {"{\"type\":", KEEL_EFORMAT, "not JSON"},
    };
    for (size_t i = 0; i < BASE_ARRAY_LEN(bad); i++) {
        gram *g = NULL;
        char err[BASE_ERR_CAP] = "";
        keel_status st = gram_compile_schema(bad[i].schema, strlen(bad[i].schema), &g, err);
        if (st != bad[i].st || !strstr(err, bad[i].msg))
            fail_msg("bad schema %zu: got %s '%s', want %s '%s'", i, keel_status_name(st), err,
                     keel_status_name(bad[i].st), bad[i].msg);
    }
}

/* ---- sampling through the engine --------------------------------------------------------- */

static char g_model[64];

static const char *SAMPLE_GRAMMAR =
    "root ::= \"{\" ws \"\\\"id\\\":\" ws num \",\" ws \"\\\"tags\\\":\" ws \"[\" ( str (\",\" ws str){0,2} )? \"]\" ws \"}\"\n"
    "num ::= \"-\"? [1-9] [0-9]{0,4}\n"
    "str ::= \"\\\"\" [a-zé日 ]{0,8} \"\\\"\"\n"
    "ws ::= \" \"?\n";

static void test_sampling(void **state)
{
    (void)state;
    if (!test_gen_qwen2(g_model, sizeof g_model, "grammar", 1, 5)) fail_msg("gen model");
    char opts[256], err[256] = "";
    snprintf(opts, sizeof opts, "{\"model\": \"%s\", \"n_threads\": 1, \"n_ctx\": 512}", g_model);
    keel_engine *e = NULL;
    assert_ok(keel_engine_open(opts, &e, err));
    keel_grammar *kg = NULL;
    assert_ok(keel_grammar_compile(SAMPLE_GRAMMAR, strlen(SAMPLE_GRAMMAR), &kg, err));
    static char resp[1 << 16];
    for (int i = 0; i < 24; i++) {
        json_t *o = json_pack("{s:s, s:s, s:f, s:i, s:i}", "prompt", "The little dog", "grammar", SAMPLE_GRAMMAR,
                              "temperature", i == 0 ? 0.0 : 1.0, "seed", 100 + i, "max_tokens", 300);
        char *os = json_dumps(o, JSON_COMPACT);
        keel_status st = keel_complete(e, NULL, os, NULL, NULL, NULL, resp, sizeof resp);
        if (st) fail_msg("complete: %s: %s", keel_status_name(st), keel_engine_last_error(e));
        json_t *r = json_loads(resp, JSON_ALLOW_NUL, NULL);
        assert_non_null(r);
        const char *fin = json_string_value(json_object_get(r, "finish_reason"));
        json_t *content = json_object_get(r, "content");
        if (!fin || strcmp(fin, "stop") != 0) fail_msg("seed %d: finish %s: %s", i, fin ? fin : "?", resp);
        bool ok = false;
        assert_ok(keel_grammar_match(kg, json_string_value(content), json_string_length(content), &ok, err));
        if (!ok) fail_msg("seed %d: output is not a sentence of the grammar: %s", i, json_string_value(content));
        json_decref(r);
        free(os);
        json_decref(o);
    }
    /* response_format json_schema: every answer is a complete instance */
    static const char *SCHEMA =
        "{\"type\":\"object\",\"properties\":{\"ok\":{\"type\":\"boolean\"},\"n\":{\"enum\":[1,2,3]},"
        "\"w\":{\"type\":\"string\",\"maxLength\":6}},\"required\":[\"ok\",\"w\"],\"additionalProperties\":false}";
    keel_grammar *ks = NULL;
    assert_ok(keel_grammar_compile_schema(SCHEMA, strlen(SCHEMA), &ks, err));
    json_t *schema = json_loads(SCHEMA, 0, NULL);
    assert_non_null(schema);
    for (int i = 0; i < 12; i++) {
        json_t *o = json_pack("{s:s, s:{s:s, s:{s:O}}, s:f, s:i, s:i}", "prompt", "The little dog", "response_format",
                              "type", "json_schema", "json_schema", "schema", schema, "temperature", 1.0, "seed", 7 + i,
                              "max_tokens", 200);
        char *os = json_dumps(o, JSON_COMPACT);
        keel_status st = keel_complete(e, NULL, os, NULL, NULL, NULL, resp, sizeof resp);
        if (st) fail_msg("complete: %s: %s", keel_status_name(st), keel_engine_last_error(e));
        json_t *r = json_loads(resp, JSON_ALLOW_NUL, NULL);
        assert_non_null(r);
        json_t *content = json_object_get(r, "content");
        const char *fin = json_string_value(json_object_get(r, "finish_reason"));
        if (!fin || strcmp(fin, "stop") != 0) fail_msg("schema seed %d: finish %s: %s", i, fin ? fin : "?", resp);
        bool ok = false;
        assert_ok(keel_grammar_match(ks, json_string_value(content), json_string_length(content), &ok, err));
        if (!ok) fail_msg("schema seed %d: not an instance: %s", i, json_string_value(content));
        /* and an independent check of the instance */
        json_t *inst = json_loads(json_string_value(content), JSON_DECODE_ANY, NULL);
        if (!json_is_object(inst) || !json_is_boolean(json_object_get(inst, "ok")) ||
            !json_is_string(json_object_get(inst, "w")))
            fail_msg("schema seed %d: %s", i, json_string_value(content));
        json_decref(inst);
        json_decref(r);
        free(os);
        json_decref(o);
    }
    json_decref(schema);
    keel_grammar_close(ks);
    /* a schema keyword the compiler does not translate is a named KEEL_EINVAL */
    keel_status st0 = keel_complete(e, NULL,
                                    "{\"prompt\": \"x\", \"response_format\": {\"type\": \"json_schema\", \"json_schema\": "
                                    "{\"schema\": {\"type\": \"array\", \"uniqueItems\": true}}}}",
                                    NULL, NULL, NULL, resp, sizeof resp);
    assert_int_equal(st0, KEEL_EINVAL);
    assert_non_null(strstr(keel_engine_last_error(e), "'uniqueItems' true is not supported"));
    /* a schema nothing satisfies is refused up front, not at the first token */
    st0 = keel_complete(e, NULL, "{\"prompt\": \"x\", \"json_schema\": {\"not\": {}}}", NULL, NULL, NULL, resp,
                        sizeof resp);
    assert_int_equal(st0, KEEL_EINVAL);
    assert_non_null(strstr(keel_engine_last_error(e), "the schema accepts nothing"));
    keel_grammar *kf = NULL;
    bool empty = false;
    assert_int_equal(keel_grammar_compile_schema("false", 5, &kf, NULL), KEEL_OK);
    assert_int_equal(keel_grammar_accepts_nothing(kf, &empty, NULL), KEEL_OK);
    assert_true(empty);
    keel_grammar_close(kf);
    /* a grammar the engine refuses is a named KEEL_EINVAL */
    keel_status st = keel_complete(e, NULL, "{\"prompt\": \"x\", \"grammar\": \"root ::= root \\\"a\\\" | \\\"b\\\"\"}", NULL,
                                   NULL, NULL, resp, sizeof resp);
    assert_int_equal(st, KEEL_EINVAL);
    assert_non_null(strstr(keel_engine_last_error(e), "grammar: grammar: left recursion"));
    keel_grammar_close(kg);
    keel_engine_close(e);
    unlink(g_model);
}

/* ---- segment masks ------------------------------------------------------------------------ */

/* At every step of random walks, the masks composed from shared stack
 * segments (default limits; costs of 1 and 64 trie nodes, which choose
 * other segment depths or the whole-stack walk; a mask cache of three
 * masks, cleared while composing) equal those of whole-stack walks
 * (seg_max_cost 0). Returns the stack masks composed with the defaults. */
static int64_t seg_walk(const gram *g, const gram_vocab *v, uint64_t seed, int steps)
{
    enum { NM = 4, NWORDS = (NV + 63) / 64 };
    gram_limits lim[NM + 1];
    for (int i = 0; i <= NM; i++) {
        lim[i] = gram_limits_default();
        lim[i].seg_min_walk = 0; /* the vocabulary is small: compose whenever a segment allows */
    }
    lim[1].seg_max_cost = 1;
    lim[2].seg_max_cost = 64;
    lim[3].max_mask_bytes = 3 * NWORDS * sizeof(uint64_t);
    lim[NM].seg_max_cost = 0; /* the reference */
    gram_matcher *m[NM + 1] = {NULL};
    char err[BASE_ERR_CAP] = "";
    for (int i = 0; i <= NM; i++) assert_ok(gram_matcher_open(g, v, &lim[i], &m[i], err));
    base_rng r;
    base_rng_seed(&r, seed);
    for (int s = 0; s < steps; s++) {
        uint64_t want[NWORDS], got[NWORDS];
        assert_ok(gram_matcher_mask(m[NM], want));
        for (int i = 0; i < NM; i++) {
            assert_ok(gram_matcher_mask(m[i], got));
            for (int32_t t = 0; t < NV; t++) {
                bool a = (got[t / 64] >> (t % 64)) & 1u, b = (want[t / 64] >> (t % 64)) & 1u;
                if (a != b) fail_msg("seed %llu step %d limits %d: token %d composed %d, whole-stack walk %d",
                                     (unsigned long long)seed, s, i, t, a, b);
            }
        }
        int32_t allowed[NV], n_allowed = 0;
        for (int32_t t = 0; t < NV; t++)
            if ((want[t / 64] >> (t % 64)) & 1u) allowed[n_allowed++] = t;
        if (n_allowed == 0) break;
        int32_t t = allowed[base_rng_below(&r, (uint64_t)n_allowed)];
        for (int i = 0; i <= NM; i++) assert_ok(gram_matcher_accept_token(m[i], t));
        if (t == 257 || t == 259) break;
    }
    gram_stats gs;
    gram_matcher_stats(m[0], &gs);
    for (int i = 0; i <= NM; i++) gram_matcher_close(m[i]);
    return gs.mask_composed;
}

static void test_mask_segments(void **state)
{
    (void)state;
    tvocab tv;
    gram_vocab *v = NULL;
    make_vocab(&tv, &v);
    int64_t composed = 0;
    const char *files[] = {"json.gbnf", "json_arr.gbnf", "arithmetic.gbnf", "list.gbnf", "chess.gbnf",
                           "japanese.gbnf", "c.gbnf", "english.gbnf"};
    for (size_t f = 0; f < BASE_ARRAY_LEN(files); f++) {
        char *src = read_data_grammar(files[f]);
        gram *g = compile_ok(src);
        for (uint64_t seed = 1; seed <= 3; seed++) composed += seg_walk(g, v, seed * 131 + f, 60);
        gram_free(g);
        free(src);
    }
    static const char *inline_grammars[] = {
        /* bounded chains: a new stack at every character */
        "root ::= \"{\" ws ( kv ( ws \",\" ws kv ){0,3} )? ws \"}\"\n"
        "kv ::= \"\\\"\" [a-z]{1,6} \"\\\"\" ws \":\" ws ( str | [0-9]{1,4} | root )\n"
        "str ::= \"\\\"\" ( [^\"\\\\] | \"\\\\\" [\"\\\\n] ){0,10} \"\\\"\"\n"
        "ws ::= [ \\t\\n]{0,4}",
        "root ::= ( [^ ]{0,3} \" \" ){0,5} \"e4\"?",
        "root ::= [α-ω]+ \"é\"? ([^a-z]{2,3})* \"\\n\"",
        "root ::= (\"ab\" | \"a\" \"b\" \"c\" | [a-c]{2})+ \"!\"?",
    };
    for (size_t i = 0; i < BASE_ARRAY_LEN(inline_grammars); i++) {
        gram *g = compile_ok(inline_grammars[i]);
        for (uint64_t seed = 1; seed <= 6; seed++) composed += seg_walk(g, v, seed * 17 + i, 60);
        gram_free(g);
    }
    static const char *schemas[] = {
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":6},"
        "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":3},\"maxItems\":3},"
        "\"n\":{\"type\":\"number\"},\"x\":{\"anyOf\":[{\"type\":\"null\"},{\"enum\":[\"ok\",true]}]}},"
        "\"required\":[\"name\"],\"additionalProperties\":false}",
        "{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}},"
        "\"maxItems\":4}",
    };
    for (size_t i = 0; i < BASE_ARRAY_LEN(schemas); i++) {
        gram *g = NULL;
        char err[BASE_ERR_CAP] = "";
        if (gram_compile_schema(schemas[i], strlen(schemas[i]), &g, err)) fail_msg("schema %zu: %s", i, err);
        for (uint64_t seed = 1; seed <= 6; seed++) composed += seg_walk(g, v, seed * 23 + i, 80);
        gram_free(g);
    }
    assert_true(composed > 100); /* the segment path is the one tested */
    /* the pass over the logits at each SIMD level (700 tokens: 10 words and
     * a tail of 60) bans exactly the tokens whose bit is clear */
    gram *g = compile_ok("root ::= \"{\" [a-z \"]{0,5} \"}\"");
    gram_matcher *m = NULL;
    assert_ok(gram_matcher_open(g, v, NULL, &m, NULL));
    assert_ok(gram_matcher_accept_token(m, '{'));
    uint64_t mask[(NV + 63) / 64];
    assert_ok(gram_matcher_mask(m, mask));
    tensor_simd was = tensor_simd_level();
    for (int lv = TENSOR_SIMD_SCALAR; lv <= TENSOR_SIMD_AVX512; lv++) {
        tensor_simd_force((tensor_simd)lv);
        float logits[NV];
        for (int i = 0; i < NV; i++) logits[i] = (float)i;
        assert_ok(gram_matcher_apply(m, logits));
        for (int32_t t = 0; t < NV; t++) {
            bool bit = (mask[t / 64] >> (t % 64)) & 1u;
            if (bit != (logits[t] == (float)t)) fail_msg("level %d token %d: bit %d logit %g", lv, t, bit, logits[t]);
        }
    }
    tensor_simd_force(was);
    gram_matcher_close(m);
    gram_free(g);
    gram_vocab_free(v);
    free_vocab(&tv);
}

/* Masks along a fixed path with each allocation failing in turn: the
 * failure is KEEL_ENOMEM with nothing leaked, or (a cache that could not
 * be kept) the right mask anyway. */
typedef struct mask_sweep {
    const gram *g;
    const gram_vocab *v;
    int32_t path[16];
    int n_path;
    uint64_t want[17][(NV + 63) / 64];
} mask_sweep;

static keel_status mask_sweep_op(void *ctx)
{
    mask_sweep *c = ctx;
    gram_limits lim = gram_limits_default();
    lim.seg_min_walk = 0;
    gram_matcher *m = NULL;
    keel_status st = gram_matcher_open(c->g, c->v, &lim, &m, NULL);
    for (int s = 0; !st && s <= c->n_path; s++) {
        uint64_t got[(NV + 63) / 64];
        if ((st = gram_matcher_mask(m, got))) break;
        if (memcmp(got, c->want[s], sizeof got) != 0) fail_msg("mask %d differs after an allocation failure", s);
        if (s < c->n_path) st = gram_matcher_accept_token(m, c->path[s]);
    }
    gram_matcher_close(m);
    if (st == KEEL_OK && test_alloc_failed()) st = KEEL_ENOMEM; /* swallowed by design: the mask was right */
    return st;
}

static void test_mask_alloc_failures(void **state)
{
    (void)state;
    tvocab tv;
    mask_sweep *c = calloc(1, sizeof *c);
    assert_non_null(c);
    gram_vocab *v = NULL;
    make_vocab(&tv, &v);
    gram *g = compile_ok("root ::= \"{\" ws ( kv ( ws \",\" ws kv ){0,3} )? ws \"}\"\n"
                         "kv ::= \"\\\"\" [a-z]{1,6} \"\\\"\" ws \":\" ws ( [0-9]{1,4} | root )\n"
                         "ws ::= [ \\t\\n]{0,4}");
    c->g = g;
    c->v = v;
    const char *text = "{ \"name\":{\"x\":12}}"; /* the path: its single-byte tokens */
    gram_matcher *m = NULL;
    assert_ok(gram_matcher_open(g, v, NULL, &m, NULL));
    for (const char *p = text; *p && c->n_path < 16; p++) {
        assert_ok(gram_matcher_mask(m, c->want[c->n_path]));
        c->path[c->n_path++] = (uint8_t)*p;
        assert_ok(gram_matcher_accept_token(m, (uint8_t)*p));
    }
    assert_ok(gram_matcher_mask(m, c->want[c->n_path]));
    gram_matcher_close(m);
    assert_true(test_alloc_sweep(mask_sweep_op, c) > 20);
    gram_free(g);
    gram_vocab_free(v);
    free_vocab(&tv);
    free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_errors),      cmocka_unit_test(test_accept_reject), cmocka_unit_test(test_llamacpp_cases),
        cmocka_unit_test(test_masks),       cmocka_unit_test(test_limits),        cmocka_unit_test(test_alloc_failures),
        cmocka_unit_test(test_schema),      cmocka_unit_test(test_sampling),      cmocka_unit_test(test_mask_segments),
        cmocka_unit_test(test_mask_alloc_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
