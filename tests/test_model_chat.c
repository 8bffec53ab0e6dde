/*
 * test_model_chat.c — each architecture's fixture model served as an agent
 * serves it: the engine opens the model with its family's real chat
 * template (../shared/fixtures/templates), detects that family's tool-call
 * format, and plays a four-turn tool-using conversation through
 * keel_complete (tools rendered, an assistant tool call and its result
 * echoed back, a final answer). Every turn must render and generate, and
 * from the second turn on reuse the cached conversation: the prompt of turn
 * t + 1 starts with the prompt of turn t (the echoed history renders as the
 * template rendered it before), so at least that many tokens minus a small
 * tail (the generation prompt, which templates may render differently from
 * the echoed message's header) come from the cache.
 * Skipped, with a message, when the fixtures are absent;
 * KEEL_MODEL_CHAT_FILTER=<model> runs one model's cases.
 */
#include "testutil.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct chat_case {
    const char *model;    /* models/<model>.gguf */
    const char *tmpl;     /* templates/<tmpl>.jinja */
    const char *format;   /* tool-call format the engine detects */
    bool user_only;       /* the template refuses system and tool messages (Gemma's): the
                             history is user / assistant turns, the call told in text */
} chat_case;

static const chat_case g_cases[] = {
    {"qwen3moe", "Qwen3-Coder", "qwen3-coder", false},
    {"gemma3", "google-gemma-2-2b-it", "content", true},
    {"glm4moe", "GLM-4.6", "glm-4.5", false},
    {"deepseek2", "deepseek-ai-DeepSeek-V3.1", "deepseek-v3.1", false},
    {"deepseek2", "Kimi-K2-Instruct", "kimi-k2", false},
    {"phi3", "microsoft-Phi-3.5-mini-instruct", "content", false},
    {"nemotronh", "NVIDIA-Nemotron-Nano-v2", "nemotron-v2", false},
    {"lfm2", "LFM2-8B-A1B", "lfm2", false},
};

static const char *TOOLS =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather in a city\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},"
    "\"required\":[\"city\"]}}}]";

static json_t *parse(const char *s)
{
    json_t *j = json_loads(s, JSON_ALLOW_NUL, NULL);
    if (!j) fail_msg("not JSON: %s", s);
    return j;
}

static int64_t usage(json_t *r, const char *k)
{
    return json_integer_value(json_object_get(json_object_get(r, "usage"), k));
}

/* One turn over the history h; returns the response (caller frees). */
static json_t *turn(keel_engine *e, json_t *h, const char *what)
{
    static char resp[1 << 16];
    char *msgs = json_dumps(h, JSON_COMPACT);
    assert_non_null(msgs);
    keel_status st = keel_complete(e, msgs, "{\"max_tokens\": 6, \"temperature\": 0, \"ignore_eos\": true}",
                                   TOOLS, NULL, NULL, resp, sizeof resp);
    free(msgs);
    if (st != KEEL_OK) fail_msg("%s: %s: %s", what, keel_status_name(st), keel_engine_last_error(e));
    return parse(resp);
}

static void add_msg(json_t *h, const char *role, const char *content)
{
    assert_int_equal(json_array_append_new(h, json_pack("{s:s, s:s}", "role", role, "content", content)), 0);
}

static void test_agent_turns(void **state)
{
    (void)state;
    int ran = 0;
    for (size_t k = 0; k < sizeof g_cases / sizeof g_cases[0]; k++) {
        const chat_case *c = &g_cases[k];
        const char *only = getenv("KEEL_MODEL_CHAT_FILTER"); /* a model name, while debugging */
        if (only && strcmp(only, c->model) != 0) continue;
        char rel[128], model[1024], tmpl[1024];
        snprintf(rel, sizeof rel, "models/%s.gguf", c->model);
        const char *p = test_fixture(rel);
        if (!p) continue;
        snprintf(model, sizeof model, "%s", p);
        snprintf(rel, sizeof rel, "templates/%s.jinja", c->tmpl);
        p = test_fixture(rel);
        if (!p) continue;
        snprintf(tmpl, sizeof tmpl, "%s", p);
        char what[192];
        snprintf(what, sizeof what, "%s with %s", c->model, c->tmpl);
        json_t *o = json_pack("{s:s, s:s, s:i, s:i}", "model", model, "chat_template", tmpl, "n_ctx", 4096,
                              "n_threads", 1);
        char *opts = json_dumps(o, JSON_COMPACT);
        json_decref(o);
        keel_engine *e = NULL;
        char err[512] = "";
        keel_status st = keel_engine_open(opts, &e, err);
        free(opts);
        if (st != KEEL_OK) fail_msg("%s: open: %s: %s", what, keel_status_name(st), err);
        char stats[1 << 14];
        size_t n_stats = 0;
        assert_ok(keel_engine_stats(e, stats, sizeof stats, &n_stats));
        json_t *s = parse(stats);
        const char *fmt = json_string_value(json_object_get(s, "tool_format"));
        if (!fmt || strcmp(fmt, c->format) != 0)
            fail_msg("%s: tool format %s, expected %s", what, fmt ? fmt : "(none)", c->format);
        json_decref(s);

        json_t *h = json_array();
        if (!c->user_only) add_msg(h, "system", "You are a helpful assistant with tools.");
        add_msg(h, "user", "What is the weather in Paris?");
        json_t *r1 = turn(e, h, what);
        int64_t p1 = usage(r1, "prompt_tokens");
        assert_true(p1 > 20);
        assert_int_equal(usage(r1, "completion_tokens"), 6);
        json_decref(r1);
        /* the assistant called the tool; its result; the next turn */
        if (c->user_only) {
            add_msg(h, "assistant", "get_weather(city=\"Paris\")");
            add_msg(h, "user", "get_weather returned {\"temp_c\": 18, \"sky\": \"clear\"}");
        } else {
            json_t *call = json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", "call_1", "type", "function", "function",
                                     "name", "get_weather", "arguments", "{\"city\": \"Paris\"}");
            assert_int_equal(json_array_append_new(h, json_pack("{s:s, s:s, s:[o]}", "role", "assistant",
                                                                "content", "", "tool_calls", call)),
                             0);
            assert_int_equal(json_array_append_new(h, json_pack("{s:s, s:s, s:s, s:s}", "role", "tool",
                                                                "tool_call_id", "call_1", "name", "get_weather",
                                                                "content", "{\"temp_c\": 18, \"sky\": \"clear\"}")),
                             0);
        }
        json_t *r2 = turn(e, h, what);
        int64_t p2 = usage(r2, "prompt_tokens"), c2 = usage(r2, "cached_tokens");
        if (getenv("KEEL_MODEL_CHAT_VERBOSE")) {
            char *mem = json_dumps(json_object_get(r2, "memory"), JSON_COMPACT);
            print_message("%s: turn 2 memory %s\n", what, mem ? mem : "?");
            free(mem);
        }
        json_decref(r2);
        add_msg(h, "assistant", "It is 18 degrees and clear in Paris.");
        add_msg(h, "user", "And tomorrow, in Lyon?");
        json_t *r3 = turn(e, h, what);
        int64_t p3 = usage(r3, "prompt_tokens"), c3 = usage(r3, "cached_tokens");
        json_decref(r3);
        add_msg(h, "assistant", "I will check Lyon.");
        add_msg(h, "user", "Thanks. Summarize both.");
        json_t *r4 = turn(e, h, what);
        int64_t p4 = usage(r4, "prompt_tokens"), c4 = usage(r4, "cached_tokens");
        json_decref(r4);
        json_decref(h);
        print_message("%s: prompts %lld, %lld (%lld cached), %lld (%lld cached), %lld (%lld cached)\n", what,
                      (long long)p1, (long long)p2, (long long)c2, (long long)p3, (long long)c3,
                      (long long)p4, (long long)c4);
        /* the tail a template may render differently: the generation
         * prompt, and the last turn's header */
        const int64_t slack = 32; /* the fixtures' 512-token vocabulary spells markers in many tokens */
        if (c2 < p1 - slack || c3 < p2 - slack || c4 < p3 - slack)
            fail_msg("%s: a turn reused less than the previous prompt minus %lld tokens", what,
                     (long long)slack);
        assert_true(p2 > p1 && p3 > p2 && p4 > p3);
        keel_engine_close(e);
        ran++;
    }
    if (ran == 0) print_message("skipped: no fixture models\n");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_agent_turns),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
