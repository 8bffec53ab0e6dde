/*
 * test_engine_prefill.c — prefill continuation through keel.h only
 * (continue_final_message, docs/chat.md "Prefill"): a chat whose last
 * message is the assistant's is continued, not closed.
 *
 * The observables, on a generated qwen2 model with the built-in "qwen3"
 * template (Hermes calls, <think> reasoning):
 *   - the prompt: keel_engine_count_tokens of the chat equals that of the
 *     raw text the continuation must be — the template's rendering of the
 *     conversation before the message with its generation prompt, followed
 *     by the message's text as the model writes it (rendered here with
 *     keel_chat_template_render); continue_final_message false counts the
 *     closed turn instead;
 *   - the answer: greedy, the chat's response and its streamed deltas equal
 *     what the model generates after that raw text (keel_complete with
 *     "prompt"), so they hold the new text only, not the prefill the
 *     client sent; a prefill that opens reasoning ("I'm") comes back as
 *     reasoning_content without "I'm"; reasoning_format "none" leaves the
 *     reasoning in the content.
 *   - the options' values are checked (KEEL_EINVAL).
 * Responses are parsed with JSON_ALLOW_NUL: a random model may generate a
 * NUL byte.
 */
#include "testutil.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char g_model[64];

static int setup(void **state)
{
    (void)state;
    return test_gen_qwen2(g_model, sizeof g_model, "engine_prefill", 1, 11) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    unlink(g_model);
    return 0;
}

static keel_engine *open_engine(void)
{
    char opts[512], err[256] = "";
    snprintf(opts, sizeof opts, "{\"model\": \"%s\", \"n_threads\": 1, \"n_ctx\": 512, \"chat_template\": \"qwen3\"}",
             g_model);
    keel_engine *e = NULL;
    keel_status st = keel_engine_open(opts, &e, err);
    if (st != KEEL_OK) fail_msg("engine open: %s: %s", keel_status_name(st), err);
    return e;
}

static const char *USER = "{\"role\":\"user\",\"content\":\"The little dog ran to the park and\"}";
static const char *PREFILL = "Once upon a time";
static const char *OPTS = "\"max_tokens\": 6, \"temperature\": 0, \"ignore_eos\": true";

/* The qwen3 template's rendering of vars_json (malloc'd). */
static char *render(const char *vars_json)
{
    const char *src = NULL;
    assert_ok(keel_chat_template_builtin("qwen3", &src));
    keel_chat_template *t = NULL;
    char err[256] = "";
    assert_ok(keel_chat_template_open(src, strlen(src), &t, err));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    assert_non_null(buf);
    keel_status st = keel_chat_template_render(t, vars_json, strlen(vars_json), NULL, buf, cap, &n, err);
    if (st != KEEL_OK) fail_msg("render: %s: %s", keel_status_name(st), err);
    keel_chat_template_close(t);
    return buf;
}

/* The conversation before the continued message, opened for the
 * assistant, followed by tail (malloc'd). */
static char *expected_prompt(const char *tail)
{
    char vars[512];
    snprintf(vars, sizeof vars, "{\"messages\": [%s], \"add_generation_prompt\": true}", USER);
    char *p = render(vars);
    size_t n = strlen(p);
    char *out = malloc(n + strlen(tail) + 1);
    assert_non_null(out);
    memcpy(out, p, n);
    strcpy(out + n, tail);
    free(p);
    return out;
}

static int64_t count(keel_engine *e, const char *request_json)
{
    int64_t n = -1;
    keel_status st = keel_engine_count_tokens(e, request_json, &n);
    if (st != KEEL_OK) fail_msg("count_tokens %s: %s: %s", request_json, keel_status_name(st), keel_engine_last_error(e));
    return n;
}

/* A raw-text request {"prompt": text, <OPTS>} (malloc'd). */
static char *raw_request(const char *text)
{
    json_t *p = json_string(text);
    char *ps = json_dumps(p, JSON_ENCODE_ANY);
    json_decref(p);
    size_t cap = strlen(ps) + strlen(OPTS) + 32;
    char *r = malloc(cap);
    assert_non_null(r);
    snprintf(r, cap, "{\"prompt\": %s, %s}", ps, OPTS);
    free(ps);
    return r;
}

/* ---- one turn, its deltas collected ----------------------------------------------- */

typedef struct deltas {
    char content[4096], reasoning[4096];
    size_t n_content, n_reasoning;
} deltas;

static bool collect(void *user, const keel_event *ev)
{
    deltas *d = user;
    char *buf = ev->kind == KEEL_EVENT_CONTENT ? d->content : ev->kind == KEEL_EVENT_REASONING ? d->reasoning : NULL;
    size_t *n = ev->kind == KEEL_EVENT_CONTENT ? &d->n_content : &d->n_reasoning;
    if (buf && *n + ev->len < sizeof d->content) {
        memcpy(buf + *n, ev->text, ev->len);
        *n += ev->len;
        buf[*n] = '\0';
    }
    return true;
}

/* keel_complete on a reset engine (no cached prefix), greedy: the response. */
static json_t *turn(keel_engine *e, const char *messages, const char *extra, deltas *d)
{
    char opts[512];
    snprintf(opts, sizeof opts, "{%s%s%s}", OPTS, extra ? ", " : "", extra ? extra : "");
    memset(d, 0, sizeof *d);
    assert_ok(keel_engine_reset(e));
    static char resp[16384];
    keel_status st = keel_complete(e, messages, opts, NULL, collect, d, resp, sizeof resp);
    if (st != KEEL_OK) fail_msg("keel_complete %s %s: %s: %s", messages, opts, keel_status_name(st), keel_engine_last_error(e));
    json_t *r = json_loads(resp, JSON_ALLOW_NUL, NULL);
    if (!r) fail_msg("not JSON: %s", resp);
    return r;
}

/* What the model generates after the raw text (a completion: no parsing;
 * malloc'd). */
static char *generate_raw(keel_engine *e, const char *text)
{
    json_t *o = json_pack("{ss si sf sb}", "prompt", text, "max_tokens", 6, "temperature", 0.0, "ignore_eos", 1);
    char *opts = json_dumps(o, 0);
    assert_non_null(opts);
    assert_ok(keel_engine_reset(e));
    static char resp[16384];
    keel_status st = keel_complete(e, NULL, opts, NULL, NULL, NULL, resp, sizeof resp);
    if (st != KEEL_OK) fail_msg("raw keel_complete: %s: %s", keel_status_name(st), keel_engine_last_error(e));
    json_t *r = json_loads(resp, JSON_ALLOW_NUL, NULL);
    assert_non_null(r);
    const char *c = json_string_value(json_object_get(r, "content"));
    assert_non_null(c);
    char *out = strdup(c);
    json_decref(r);
    free(opts);
    json_decref(o);
    return out;
}

static const char *str_or_empty(json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

/* ---- the prompt -------------------------------------------------------------------- */

static void test_prompt_continues_content(void **state)
{
    (void)state;
    keel_engine *e = open_engine();
    char req[1024];
    /* continued: the conversation before it, the generation prompt, the text */
    char *want = expected_prompt(PREFILL);
    char *raw = raw_request(want);
    int64_t n_want = count(e, raw);
    snprintf(req, sizeof req, "{\"messages\": [%s, {\"role\":\"assistant\",\"content\":\"%s\"}]}", USER, PREFILL);
    int64_t n_default = count(e, req);
    assert_int_equal(n_default, n_want);
    snprintf(req, sizeof req, "{\"messages\": [%s, {\"role\":\"assistant\",\"content\":\"%s\"}], \"continue_final_message\": true}",
             USER, PREFILL);
    assert_int_equal(count(e, req), n_want);
    snprintf(req, sizeof req,
             "{\"messages\": [%s, {\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"%s\"}]}], "
             "\"continue_final_message\": \"content\"}",
             USER, PREFILL);
    assert_int_equal(count(e, req), n_want);
    free(raw);
    free(want);
    /* false: the message is closed and a new assistant turn opens */
    char vars[512];
    snprintf(vars, sizeof vars, "{\"messages\": [%s, {\"role\":\"assistant\",\"content\":\"%s\"}], \"add_generation_prompt\": true}",
             USER, PREFILL);
    char *closed = render(vars);
    assert_non_null(strstr(closed, "<|im_end|>\n<|im_start|>assistant\n"));
    raw = raw_request(closed);
    int64_t n_closed = count(e, raw);
    snprintf(req, sizeof req, "{\"messages\": [%s, {\"role\":\"assistant\",\"content\":\"%s\"}], \"continue_final_message\": false}",
             USER, PREFILL);
    assert_int_equal(count(e, req), n_closed);
    printf("continued: %lld prompt tokens; closed: %lld\n", (long long)n_default, (long long)n_closed);
    assert_true(n_closed > n_default);
    free(raw);
    free(closed);
    /* an assistant message with tool calls is closed, not continued */
    snprintf(req, sizeof req,
             "{\"messages\": [%s, {\"role\":\"assistant\",\"content\":\"%s\",\"tool_calls\":[{\"id\":\"call_1\",\"type\":"
             "\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}]}",
             USER, PREFILL);
    int64_t n_calls = count(e, req);
    snprintf(req + strlen(req) - 1, sizeof req - strlen(req) + 1, ", \"continue_final_message\": false}");
    assert_int_equal(n_calls, count(e, req));
    keel_engine_close(e);
}

static void test_options_checked(void **state)
{
    (void)state;
    keel_engine *e = open_engine();
    int64_t n = 0;
    char req[1024];
    const char *bad[] = {
        /* not the assistant's last message, yet asked to continue it (true
         * is the default: continue one if there is one) */
        "{\"messages\": [%s], \"continue_final_message\": \"content\"}",
        "{\"messages\": [%s], \"continue_final_message\": \"reasoning_content\"}",
        "{\"messages\": [%s, {\"role\":\"assistant\",\"content\":\"a\"}], \"continue_final_message\": \"sideways\"}",
        "{\"messages\": [%s, {\"role\":\"assistant\",\"content\":\"a\"}], \"continue_final_message\": 1}",
        "{\"messages\": [%s, {\"role\":\"assistant\",\"content\":\"a\"}, {\"role\":\"assistant\",\"content\":\"b\"}]}",
        "{\"messages\": [%s], \"reasoning_format\": \"sometimes\"}",
        "{\"messages\": [%s], \"reasoning_format\": true}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(req, sizeof req, bad[i], USER);
        keel_status st = keel_engine_count_tokens(e, req, &n);
        if (st != KEEL_EINVAL) fail_msg("%s: %s, want KEEL_EINVAL", req, keel_status_name(st));
    }
    const char *good[] = {"none", "auto", "deepseek", "deepseek-legacy"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        snprintf(req, sizeof req, "{\"messages\": [%s], \"reasoning_format\": \"%s\"}", USER, good[i]);
        assert_ok(keel_engine_count_tokens(e, req, &n));
    }
    /* keel_complete names the option */
    char msgs[512], resp[4096];
    snprintf(msgs, sizeof msgs, "[%s]", USER);
    assert_status(keel_complete(e, msgs, "{\"continue_final_message\": \"content\"}", NULL, NULL, NULL, resp, sizeof resp),
                  KEEL_EINVAL);
    assert_non_null(strstr(keel_engine_last_error(e), "continue_final_message"));
    assert_status(keel_complete(e, msgs, "{\"reasoning_format\": \"x\"}", NULL, NULL, NULL, resp, sizeof resp),
                  KEEL_EINVAL);
    assert_non_null(strstr(keel_engine_last_error(e), "reasoning_format"));
    keel_engine_close(e);
}

/* ---- the answer ---------------------------------------------------------------------- */

static void test_answer_leaves_out_prefill(void **state)
{
    (void)state;
    keel_engine *e = open_engine();
    char *prompt = expected_prompt(PREFILL);
    char *gen = generate_raw(e, prompt);
    printf("prefill \"%s\", the model goes on with \"%s\"\n", PREFILL, gen);
    assert_true(strlen(gen) > 0);
    char msgs[512];
    snprintf(msgs, sizeof msgs, "[%s, {\"role\":\"assistant\",\"content\":\"%s\"}]", USER, PREFILL);
    deltas d;
    json_t *r = turn(e, msgs, NULL, &d);
    assert_string_equal(str_or_empty(r, "content"), gen);
    assert_string_equal(d.content, gen);
    assert_string_equal(str_or_empty(r, "reasoning_content"), "");
    assert_int_equal(d.n_reasoning, 0);
    json_decref(r);
    /* closed, the model answers the closed conversation (the raw text of
     * the template's rendering with a new turn) */
    char vars[1024];
    snprintf(vars, sizeof vars, "{\"messages\": %s, \"add_generation_prompt\": true}", msgs);
    char *closed = render(vars);
    char *gen_closed = generate_raw(e, closed);
    r = turn(e, msgs, "\"continue_final_message\": false", &d);
    assert_string_equal(str_or_empty(r, "content"), gen_closed);
    assert_string_equal(d.content, gen_closed);
    json_decref(r);
    printf("closed: the model answers \"%s\"\n", gen_closed);
    free(gen_closed);
    free(closed);
    free(gen);
    free(prompt);
    keel_engine_close(e);
}

static void test_reasoning_prefill(void **state)
{
    (void)state;
    keel_engine *e = open_engine();
    /* the template has <think>: the prefill opens the block, and its
     * reasoning follows */
    char *prompt = expected_prompt("<think>I'm");
    char *raw = raw_request(prompt);
    char msgs[512], req[1024 + 512];
    snprintf(msgs, sizeof msgs, "[%s, {\"role\":\"assistant\",\"reasoning_content\":\"I'm\"}]", USER);
    snprintf(req, sizeof req, "{\"messages\": %s}", msgs);
    assert_int_equal(count(e, req), count(e, raw));
    snprintf(req, sizeof req, "{\"messages\": %s, \"continue_final_message\": \"reasoning_content\"}", msgs);
    assert_int_equal(count(e, req), count(e, raw));
    char *gen = generate_raw(e, prompt);
    printf("reasoning prefill \"I'm\", the model goes on with \"%s\"\n", gen);
    assert_null(strstr(gen, "</think>")); /* else the check below must split it */
    deltas d;
    json_t *r = turn(e, msgs, NULL, &d);
    assert_string_equal(str_or_empty(r, "reasoning_content"), gen);
    assert_string_equal(d.reasoning, gen);
    assert_string_equal(str_or_empty(r, "content"), "");
    assert_int_equal(d.n_content, 0);
    json_decref(r);
    /* reasoning_format none: the markers are text; the prefill's bytes
     * (the opener included) are still the client's */
    r = turn(e, msgs, "\"reasoning_format\": \"none\"", &d);
    assert_string_equal(str_or_empty(r, "content"), gen);
    assert_string_equal(d.content, gen);
    assert_string_equal(str_or_empty(r, "reasoning_content"), "");
    json_decref(r);
    free(gen);
    free(raw);
    free(prompt);
    keel_engine_close(e);
}

int main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prompt_continues_content),
        cmocka_unit_test(test_options_checked),
        cmocka_unit_test(test_answer_leaves_out_prefill),
        cmocka_unit_test(test_reasoning_prefill),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
