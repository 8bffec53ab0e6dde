/*
 * test_engine_lazy.c — src/engine/eng_lazy.c, the waiting side of a lazy
 * grammar, driven token by token on a slot of a real engine (a generated
 * model, byte-level tokens): a trigger split across tokens activates the
 * matcher with the output from its first byte; text before it is left
 * alone; text after a trigger that the grammar refuses keeps the slot
 * waiting for the next trigger; at-start triggers; trigger token ids; the
 * tool grammar of a request (strict tool, forced call, strict_tools
 * false); and the cost of a waiting step (printed: docs/grammar.md).
 */
#include "testutil.h"
#include "engine/eng.h"

#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static char g_model[64];
static keel_engine *g_e;
static keel_grammar_vocab *g_v;
static int32_t g_byte_tok[256]; /* the token whose text is that one byte, or -1 */

static int setup(void **state)
{
    (void)state;
    snprintf(g_model, sizeof g_model, "/tmp/keel_lazy_XXXXXX");
    int fd = mkstemp(g_model);
    if (fd < 0) return -1;
    close(fd);
    keel_gen_params gp = keel_gen_params_default();
    gp.arch = "qwen2";
    gp.n_embd = 64;
    gp.n_layer = 1;
    char err[256] = "", opts[256];
    if (keel_gen_model(&gp, g_model, err) != KEEL_OK) return -1;
    snprintf(opts, sizeof opts, "{\"model\": \"%s\", \"n_ctx\": 512, \"n_threads\": 1, \"chat_template\": \"qwen3\"}",
             g_model);
    if (keel_engine_open(opts, &g_e, err) != KEEL_OK) return -1;
    if (keel_grammar_vocab_open(g_e->model, &g_v, err) != KEEL_OK) return -1;
    g_e->gvocab = g_v; /* the engine's own trigger reads use it; closed with the engine */
    for (int b = 0; b < 256; b++) g_byte_tok[b] = -1;
    for (int32_t t = 0; t < g_e->model->w.hp.n_vocab; t++) {
        const char *p;
        size_t n;
        engine_grammar_token_bytes(g_v, t, &p, &n);
        if (n == 1 && g_byte_tok[(uint8_t)p[0]] < 0) g_byte_tok[(uint8_t)p[0]] = t;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    keel_engine_close(g_e);
    unlink(g_model);
    return 0;
}

typedef struct lazy_fix {
    eng_req *r;
    keel_grammar_matcher *m;
    eng_slot *sl;
} lazy_fix;

/* A request from JSON and a slot waiting on its grammar. */
static void fix_open(lazy_fix *f, const char *request)
{
    char err[BASE_ERR_CAP] = "";
    json_t *j = json_loads(request, 0, NULL);
    assert_non_null(j);
    if (eng_req_make(g_e, j, &f->r, err) != KEEL_OK) fail_msg("request: %s", err);
    json_decref(j);
    assert_non_null(f->r->o.grammar);
    assert_ok(keel_grammar_matcher_open(f->r->o.grammar, g_v, &f->m, err));
    f->sl = test_calloc(1, sizeof *f->sl);
    f->sl->req = f->r;
    f->sl->gm = f->m;
    assert_ok(eng_lazy_begin(g_e, f->sl, err));
}

static void fix_close(lazy_fix *f)
{
    keel_grammar_matcher_close(f->m);
    test_free(f->sl);
    eng_req_free(f->r);
}

/* Feeds text one byte token at a time; returns the byte offset after
 * which the slot stopped waiting (or -1). */
static long feed(lazy_fix *f, const char *text)
{
    long at = -1;
    for (size_t i = 0; text[i]; i++) {
        int32_t t = g_byte_tok[(uint8_t)text[i]];
        assert_true(t >= 0);
        if (f->sl->lazy) {
            assert_ok(eng_lazy_step(g_e, f->sl, t));
            if (!f->sl->lazy && at < 0) at = (long)i + 1;
        } else {
            assert_ok(keel_grammar_matcher_accept(f->m, t));
        }
    }
    return at;
}

#define LAZY(grammar, triggers)                                                                                 \
    "{\"prompt\": \"x\", \"grammar\": \"" grammar "\", \"grammar_lazy\": true, \"grammar_triggers\": " triggers "}"

static void test_trigger_split(void **state)
{
    (void)state;
    lazy_fix f;
    fix_open(&f, LAZY("root ::= \\\"<go>\\\" [a-z]+ \\\"!\\\"", "[\"<go>\"]"));
    assert_true(f.sl->lazy);
    long at = feed(&f, "free text < go <g");
    assert_int_equal(at, -1);
    at = feed(&f, "o>abc!");
    assert_int_equal(at, 2); /* after "o>", the last byte of the trigger */
    assert_true(keel_grammar_matcher_complete(f.m));
    fix_close(&f);
}

/* A token that runs past the trigger into bytes the grammar refuses
 * leaves the slot waiting; the next trigger activates. */
static void test_refused_then_next(void **state)
{
    (void)state;
    /* a token of three lowercase letters or more: its first two are the trigger */
    int32_t tok = -1;
    const char *p = NULL;
    size_t n = 0;
    for (int32_t t = 0; t < g_e->model->w.hp.n_vocab && tok < 0; t++) {
        engine_grammar_token_bytes(g_v, t, &p, &n);
        bool letters = n >= 3;
        for (size_t i = 0; i < n && letters; i++) letters = p[i] >= 'a' && p[i] <= 'z';
        if (letters) tok = t;
    }
    assert_true(tok >= 0);
    char req[256];
    snprintf(req, sizeof req, LAZY("root ::= \\\"%c%c\\\" \\\"#\\\"", "[\"%c%c\"]"), p[0], p[1], p[0], p[1]);
    lazy_fix f;
    fix_open(&f, req);
    assert_ok(eng_lazy_step(g_e, f.sl, tok)); /* the trigger, then a letter the grammar refuses */
    assert_true(f.sl->lazy);
    char again[3] = {p[0], p[1], 0};
    assert_int_equal(feed(&f, again), 2);
    feed(&f, "#");
    assert_true(keel_grammar_matcher_complete(f.m));
    fix_close(&f);
}

static void test_at_start(void **state)
{
    (void)state;
    lazy_fix f;
    fix_open(&f, LAZY("root ::= \\\"{\\\" [a-z]* \\\"}\\\"", "[{\"type\": \"start\", \"value\": \"{\"}]"));
    assert_int_equal(feed(&f, " \n {"), 4);
    feed(&f, "ab}");
    assert_true(keel_grammar_matcher_complete(f.m));
    fix_close(&f);
    fix_open(&f, LAZY("root ::= \\\"{\\\" [a-z]* \\\"}\\\"", "[{\"type\": \"start\", \"value\": \"{\"}]"));
    assert_int_equal(feed(&f, "hi {ab}"), -1);
    assert_true(f.sl->lazy_dead);
    fix_close(&f);
}

static void test_trigger_token(void **state)
{
    (void)state;
    char req[256];
    snprintf(req, sizeof req, LAZY("root ::= \\\"#\\\" [a-z]*", "[{\"type\": 0, \"value\": %d}]"), g_byte_tok['#']);
    lazy_fix f;
    fix_open(&f, req);
    assert_int_equal(feed(&f, "ab#"), 3);
    feed(&f, "xyz");
    assert_true(keel_grammar_matcher_complete(f.m));
    fix_close(&f);
}

static void test_bad_options(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "{\"prompt\": \"x\", \"grammar_lazy\": true, \"grammar_triggers\": [\"a\"]}",
        "{\"prompt\": \"x\", \"grammar\": \"root ::= \\\"a\\\"\", \"grammar_lazy\": true}",
        "{\"prompt\": \"x\", \"grammar\": \"root ::= \\\"a\\\"\", \"grammar_triggers\": [\"a\"]}",
        "{\"prompt\": \"x\", \"grammar\": \"root ::= \\\"a\\\"\", \"grammar_lazy\": true, \"grammar_triggers\": [\"\"]}",
        ("{\"prompt\": \"x\", \"grammar\": \"root ::= \\\"a\\\"\", \"grammar_lazy\": true, \"grammar_triggers\": "
         "[{\"type\": \"pattern\", \"value\": \"a+\"}]}"),
        "{\"prompt\": \"x\", \"strict_tools\": 3}",
    };
    for (size_t i = 0; i < BASE_ARRAY_LEN(bad); i++) {
        char err[BASE_ERR_CAP] = "";
        eng_req *r = NULL;
        json_t *j = json_loads(bad[i], 0, NULL);
        assert_non_null(j);
        assert_int_equal(eng_req_make(g_e, j, &r, err), KEEL_EINVAL);
        assert_null(r);
        json_decref(j);
    }
}

#define TOOLS                                                                                                  \
    "[{\"type\":\"function\",\"function\":{\"name\":\"f\",%s\"parameters\":{\"type\":\"object\",\"properties\":" \
    "{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"],\"additionalProperties\":false}}}]"

/* The tool grammar of a request: lazy for a strict tool, forced for a
 * forced call, none for neither or strict_tools false. */
static void test_tool_grammar(void **state)
{
    (void)state;
    char req[1024], tools[512], err[BASE_ERR_CAP];
    struct {
        const char *strict, *extra;
        int want; /* 0 none, 1 lazy, 2 forced */
    } cases[] = {
        {"\"strict\":true,", "", 1},
        {"", "", 0},
        {"", ", \"tool_choice\": \"required\"", 2},
        {"\"strict\":true,", ", \"strict_tools\": false", 0},
        {"", ", \"strict_tools\": true", 1},
    };
    for (size_t i = 0; i < BASE_ARRAY_LEN(cases); i++) {
        snprintf(tools, sizeof tools, TOOLS, cases[i].strict);
        snprintf(req, sizeof req, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"tools\": %s%s}", tools,
                 cases[i].extra);
        json_t *j = json_loads(req, 0, NULL);
        assert_non_null(j);
        eng_req *r = NULL;
        if (eng_req_make(g_e, j, &r, err) != KEEL_OK) fail_msg("case %zu: %s", i, err);
        json_decref(j);
        assert_int_equal(r->o.grammar != NULL, cases[i].want != 0);
        assert_int_equal(r->o.grammar_lazy, cases[i].want == 1);
        assert_int_equal(r->o.tool_forced, cases[i].want == 2);
        if (cases[i].want) {
            assert_non_null(strstr(r->o.tool_note, "hermes"));
            bool ok = false;
            const char *call = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>";
            assert_ok(keel_grammar_match(r->o.grammar, call, strlen(call), &ok, err));
            assert_true(ok);
        }
        eng_req_free(r);
    }
}

/* A tool grammar's vocabulary: control tokens that are markers have their
 * text (end-of-generation tokens never); the plain vocabulary none. */
static void test_marker_vocab(void **state)
{
    (void)state;
    static const char *const markers[] = {"<|im_start|>", "<|im_end|>", NULL};
    keel_grammar_vocab *mv = NULL;
    char err[BASE_ERR_CAP] = "";
    assert_ok(engine_grammar_vocab_open_marked(g_e->model, markers, &mv, err));
    int found = 0;
    for (int32_t t = 0; t < g_e->model->w.hp.n_vocab; t++) {
        char buf[64];
        size_t k = 0;
        if (text_token_get_type(g_e->model->tok, t) != TEXT_TOKEN_CONTROL) continue;
        assert_ok(text_token_to_piece(g_e->model->tok, t, true, buf, sizeof buf, &k));
        const char *p;
        size_t n, n0;
        engine_grammar_token_bytes(mv, t, &p, &n);
        engine_grammar_token_bytes(g_v, t, &p, &n0);
        assert_int_equal(n0, 0);
        if (k == 12 && memcmp(buf, "<|im_start|>", 12) == 0) {
            assert_int_equal(n, 12);
            found++;
        } else {
            assert_int_equal(n, 0); /* <|im_end|> is an end of generation; the rest are not markers */
        }
    }
    assert_int_equal(found, 1);
    keel_grammar_vocab_close(mv);
}

/* The cost of a waiting step: uniformly random tokens (no trigger). */
static void test_waiting_cost(void **state)
{
    (void)state;
    lazy_fix f;
    fix_open(&f, LAZY("root ::= \\\"<tool_call>\\\" [a-z]*", "[\"<tool_call>\", \"[TOOL_CALLS]\"]"));
    enum { N = 200000 };
    int32_t nv = g_e->model->w.hp.n_vocab;
    uint64_t x = 88172645463325252ull;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < N; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        assert_ok(eng_lazy_step(g_e, f.sl, (int32_t)(x % (uint64_t)nv)));
        if (!f.sl->lazy) { /* random bytes spelled a trigger: wait again */
            f.sl->lazy = true;
            assert_ok(keel_grammar_matcher_reset(f.m));
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ns = ((double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec)) / N;
    printf("lazy grammar, waiting: %.0f ns per token (n_vocab %d)\n", ns, nv);
    assert_true(ns < 20000); /* far below any decode step, even under sanitizers */
    fix_close(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_trigger_split), cmocka_unit_test(test_refused_then_next),
        cmocka_unit_test(test_at_start),      cmocka_unit_test(test_trigger_token),
        cmocka_unit_test(test_bad_options),   cmocka_unit_test(test_tool_grammar),
        cmocka_unit_test(test_marker_vocab),  cmocka_unit_test(test_waiting_cost),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
