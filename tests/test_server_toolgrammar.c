/*
 * test_server_toolgrammar.c — constrained tool calls through keel serve
 * (issue 24, lazy grammars) with a random-weight model at temperature 1:
 * with strict: true and a tool_choice that forces a call, every answer is a
 * parsed call whose arguments satisfy the schema (hermes and qwen3-coder,
 * Qwen templates; mistral with --strict-tools, OpenAI and Anthropic); a
 * prefill that opened a call block activates the lazy grammar; a lazy
 * grammar whose trigger never comes leaves the output exactly as without
 * it; nothing strict: unconstrained as before; a strict schema the compiler
 * refuses is a 400 naming the keyword.
 */
#include "server_util.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char g_model[64];

/* get_weather's schema: every value bounded, so that a random model ends */
#define WEATHER_PARAMS                                                                                        \
    "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":12},"                 \
    "\"unit\":{\"enum\":[\"c\",\"f\"]},\"metric\":{\"type\":\"boolean\"}},\"required\":[\"city\",\"unit\"],"  \
    "\"additionalProperties\":false}"
#define TOOLS_STRICT                                                                                          \
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"strict\":true,\"parameters\":"       \
    WEATHER_PARAMS "}},{\"type\":\"function\",\"function\":{\"name\":\"now\",\"strict\":true,\"parameters\":"  \
    "{\"type\":\"object\",\"properties\":{},\"additionalProperties\":false}}}]"
#define TOOLS_FREE                                                                                            \
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":" WEATHER_PARAMS "}}]"

static int setup(void **state)
{
    (void)state;
    return srvt_gen_model(g_model, sizeof g_model, "qwen2", 64, 2, 0, 7) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    unlink(g_model);
    return 0;
}

static void start(srvt_proc *p, const char *tmpl, bool strict_tools)
{
    char path[512];
    const char *fx = getenv("KEEL_FIXTURES");
    snprintf(path, sizeof path, "%s/templates/%s.jinja", fx ? fx : "../shared/fixtures", tmpl);
    if (access(path, R_OK) != 0) {
        printf("skipped: no template %s (../shared/fixtures absent)\n", path);
        skip();
    }
    const char *args[] = {"-c", "4096", "-t", "1", "--log-disable", "--chat-template-file", path,
                          strict_tools ? "--strict-tools" : NULL, NULL};
    assert_true(srvt_start(p, g_model, args, true));
}

/* Code points in a JSON string (which may hold U+0000: a random model can
 * sample the NUL byte's token, and "\u0000" is valid JSON) */
static size_t utf8_count(const json_t *str)
{
    const char *s = json_string_value(str);
    size_t n = 0, len = json_string_length(str);
    for (size_t i = 0; i < len; i++) n += ((unsigned char)s[i] & 0xc0) != 0x80;
    return n;
}

/* The arguments (a JSON object) satisfy WEATHER_PARAMS. */
static void check_weather(json_t *args)
{
    assert_true(json_is_object(args));
    const char *k;
    json_t *v;
    json_object_foreach(args, k, v) {
        if (strcmp(k, "city") == 0) {
            assert_true(json_is_string(v));
            assert_true(utf8_count(v) <= 12);
        } else if (strcmp(k, "unit") == 0) {
            assert_true(json_is_string(v));
            assert_true(strcmp(json_string_value(v), "c") == 0 || strcmp(json_string_value(v), "f") == 0);
        } else if (strcmp(k, "metric") == 0) {
            assert_true(json_is_boolean(v));
        } else {
            fail_msg("unexpected member '%s'", k);
        }
    }
    assert_non_null(json_object_get(args, "city"));
    assert_non_null(json_object_get(args, "unit"));
}

/* Every call of an OpenAI response is a valid call of the tools above;
 * the number of calls. */
static int check_calls(json_t *r)
{
    json_t *msg = srvt_get(json_array_get(json_object_get(r, "choices"), 0), "message");
    json_t *calls = json_object_get(msg, "tool_calls");
    size_t i;
    json_t *c;
    json_array_foreach(calls, i, c) {
        const char *name = srvt_str(c, "function.name"), *a = srvt_str(c, "function.arguments");
        assert_non_null(name);
        assert_non_null(a);
        json_t *args = json_loads(a, JSON_ALLOW_NUL, NULL);
        if (!args) fail_msg("arguments are not JSON: %s", a);
        if (strcmp(name, "get_weather") == 0)
            check_weather(args);
        else if (strcmp(name, "now") == 0)
            assert_int_equal(json_object_size(args), 0);
        else
            fail_msg("unknown tool '%s'", name);
        json_decref(args);
    }
    return (int)json_array_size(calls);
}

static json_t *chat(const srvt_proc *p, const char *tools, const char *choice, const char *messages, int seed,
                    const char *extra, int *status)
{
    char body[4096];
    snprintf(body, sizeof body,
             "{\"messages\":%s,\"tools\":%s%s%s,\"temperature\":1,\"seed\":%d%s}",
             messages ? messages : "[{\"role\":\"user\",\"content\":\"weather in Oslo?\"}]", tools,
             choice ? ",\"tool_choice\":" : "", choice ? choice : "", seed, extra ? extra : ",\"max_tokens\":300");
    return srvt_post_json(p, "/v1/chat/completions", body, status);
}

/* strict + a forced call: every answer is a valid call (hermes / qwen3-coder) */
static void forced_calls(const char *tmpl, const char *format)
{
    srvt_proc p;
    start(&p, tmpl, false);
    static const char *const choices[] = {"{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}",
                                          "\"required\""};
    for (int seed = 0; seed < 12; seed++) {
        int status = 0;
        /* parallel calls on every third request: a random model may chain calls
         * until max_tokens; one call always ends (the grammar's language is
         * finite: at most 20 whitespace characters between JSON tokens, a city
         * of 12 characters at most, no other open-ended value) */
        bool one = seed % 3 != 0;
        json_t *r = chat(&p, TOOLS_STRICT, choices[seed % 2], NULL, seed,
                         one ? ",\"parallel_tool_calls\":false,\"max_tokens\":1000" : ",\"max_tokens\":1500", &status);
        assert_int_equal(status, 200);
        const char *tg = srvt_str(r, "tool_grammar");
        assert_non_null(tg);
        assert_non_null(strstr(tg, format));
        assert_string_equal(srvt_str(json_array_get(json_object_get(r, "choices"), 0), "finish_reason"), "tool_calls");
        int n = check_calls(r);
        assert_true(n >= 1);
        if (one) assert_int_equal(n, 1);
        json_decref(r);
    }
    srvt_stop(&p, 10 * srvt_slow());
}

static void test_forced_hermes(void **state)
{
    (void)state;
    forced_calls("Qwen-Qwen2.5-7B-Instruct", "hermes");
}

static void test_forced_qwen3_coder(void **state)
{
    (void)state;
    forced_calls("Qwen3-Coder", "qwen3-coder");
}

/* Lazy: a prefill that opened a call block; a trigger that never comes
 * changes nothing; nothing strict is unconstrained; a refused strict
 * schema is a 400. */
static void test_lazy_hermes(void **state)
{
    (void)state;
    srvt_proc p;
    start(&p, "Qwen-Qwen2.5-7B-Instruct", false);
    static const char prefill[] = "[{\"role\":\"user\",\"content\":\"weather?\"},"
                                  "{\"role\":\"assistant\",\"content\":\"Checking.\\n<tool_call>\\n\"}]";
    for (int seed = 0; seed < 6; seed++) {
        int status = 0;
        json_t *r = chat(&p, TOOLS_STRICT, NULL, prefill, seed, ",\"parallel_tool_calls\":false,\"max_tokens\":1000",
                         &status);
        assert_int_equal(status, 200);
        assert_non_null(strstr(srvt_str(r, "tool_grammar"), "lazy"));
        assert_true(check_calls(r) >= 1);
        json_decref(r);
    }
    /* nothing strict, no forced call: no grammar, as before */
    int status = 0;
    json_t *r = chat(&p, TOOLS_FREE, NULL, NULL, 3, NULL, &status);
    assert_int_equal(status, 200);
    assert_null(json_object_get(r, "tool_grammar"));
    json_decref(r);
    /* a lazy grammar that never triggers: the same text as without it */
    static const char ask[] = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"temperature\":1,\"seed\":5,"
                              "\"max_tokens\":40%s}";
    char body[512];
    snprintf(body, sizeof body, ask, "");
    json_t *a = srvt_post_json(&p, "/v1/chat/completions", body, &status);
    assert_int_equal(status, 200);
    snprintf(body, sizeof body, ask,
             ",\"grammar\":\"root ::= \\\"x\\\"\",\"grammar_lazy\":true,\"grammar_triggers\":[\"\\u0001never\"]");
    json_t *b = srvt_post_json(&p, "/v1/chat/completions", body, &status);
    assert_int_equal(status, 200);
    const char *ca = srvt_str(json_array_get(json_object_get(a, "choices"), 0), "message.content");
    const char *cb = srvt_str(json_array_get(json_object_get(b, "choices"), 0), "message.content");
    assert_non_null(ca);
    assert_non_null(cb);
    assert_string_equal(ca, cb);
    json_decref(a);
    json_decref(b);
    /* triggers without grammar_lazy, a pattern trigger: 400 */
    snprintf(body, sizeof body, ask, ",\"grammar\":\"root ::= \\\"x\\\"\",\"grammar_triggers\":[\"a\"]");
    json_decref(srvt_post_json(&p, "/v1/chat/completions", body, &status));
    assert_int_equal(status, 400);
    snprintf(body, sizeof body, ask,
             ",\"grammar\":\"root ::= \\\"x\\\"\",\"grammar_lazy\":true,\"grammar_triggers\":[{\"type\":2,\"value\":\"a+\"}]");
    json_decref(srvt_post_json(&p, "/v1/chat/completions", body, &status));
    assert_int_equal(status, 400);
    /* a strict schema the compiler refuses: 400 naming the tool */
    r = chat(&p,
             "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"strict\":true,\"parameters\":{\"type\":\"object\","
             "\"properties\":{\"a\":{\"$ref\":\"http://example.com/a.json\"}}}}}]",
             NULL, NULL, 1, NULL, &status);
    assert_int_equal(status, 400);
    const char *msg = srvt_str(r, "error.message");
    assert_non_null(msg);
    assert_non_null(strstr(msg, "tool 'f' (strict)"));
    json_decref(r);
    srvt_stop(&p, 10 * srvt_slow());
}

/* --strict-tools: tools that are not strict are constrained too (mistral:
 * no forced opening, the grammar applies from the first token); Anthropic's
 * tool_choice any. */
static void test_strict_flag_mistral(void **state)
{
    (void)state;
    srvt_proc p;
    start(&p, "Mistral-Small-3.2-24B-Instruct-2506", true);
    for (int seed = 0; seed < 6; seed++) {
        int status = 0;
        json_t *r = chat(&p, TOOLS_FREE, "\"required\"", NULL, seed, ",\"parallel_tool_calls\":false,\"max_tokens\":1000",
                         &status);
        assert_int_equal(status, 200);
        assert_non_null(strstr(srvt_str(r, "tool_grammar"), "mistral"));
        assert_true(check_calls(r) >= 1);
        json_decref(r);
    }
    for (int seed = 0; seed < 4; seed++) {
        char body[2048];
        snprintf(body, sizeof body,
                 "{\"model\":\"m\",\"max_tokens\":1000,\"temperature\":1,\"seed\":%d,\"messages\":[{\"role\":\"user\","
                 "\"content\":\"weather?\"}],\"tool_choice\":{\"type\":\"any\",\"disable_parallel_tool_use\":true},"
                 "\"tools\":[{\"name\":\"get_weather\","
                 "\"input_schema\":" WEATHER_PARAMS "}]}",
                 seed);
        int status = 0;
        json_t *r = srvt_post_json(&p, "/v1/messages", body, &status);
        assert_int_equal(status, 200);
        assert_string_equal(srvt_str(r, "stop_reason"), "tool_use");
        size_t i;
        json_t *c;
        int n = 0;
        json_array_foreach(json_object_get(r, "content"), i, c) {
            if (strcmp(srvt_str(c, "type"), "tool_use") != 0) continue;
            assert_string_equal(srvt_str(c, "name"), "get_weather");
            check_weather(json_object_get(c, "input"));
            n++;
        }
        assert_int_equal(n, 1);
        json_decref(r);
    }
    srvt_stop(&p, 10 * srvt_slow());
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forced_hermes),
        cmocka_unit_test(test_forced_qwen3_coder),
        cmocka_unit_test(test_lazy_hermes),
        cmocka_unit_test(test_strict_flag_mistral),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
