/*
 * test_toolcall.c — src/chat/toolcall: every output format, each case
 * parsed whole, byte by byte, at every two-way split (short texts) and in
 * random chunks (many seeds), with the same expected result each time; the
 * streamed deltas concatenated equal the result and never end in a partial
 * block marker; malformed output (unclosed, invalid JSON, unknown tools,
 * oversized held text) kept as content or marked; ids; nesting on a small
 * stack; allocation failures. Format names and detection from templates:
 * test_toolcall_detect.c.
 */
#include "testutil.h"
#include "base/base.h"
#include "chat/toolcall.h"
#include "chat/toolcall_int.h"

#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- event collector ------------------------------------------------------------ */

typedef struct coll {
    char *content, *reasoning, *args[16];
    size_t content_n, reasoning_n, args_n[16];
    char names[16][TOOLCALL_NAME_CAP], ids[16][TOOLCALL_ID_CAP];
    int32_t open, begun, ended;
    const tc_marker *markers[2]; /* block markers that must never be split into a delta */
    bool finishing, check_markers;
    const char *fed; /* the input fed so far: fed[0..fed_n) */
    size_t fed_n;
    char bad[256];
} coll;

static void cat(char **b, size_t *n, const char *s, size_t k)
{
    char *p = realloc(*b, *n + k + 1);
    assert_non_null(p);
    memcpy(p + *n, s, k);
    *n += k;
    p[*n] = 0;
    *b = p;
}

static void check_delta(coll *c, const char *s, size_t n)
{
    if (!c->check_markers || c->bad[0]) return;
    for (int l = 0; l < 2; l++) {
        for (const tc_marker *m = c->markers[l]; m && m->s; m++) {
            if (m->act != TC_ACT_BLOCK && m->act != TC_ACT_H_END && m->act != TC_ACT_H_START) continue;
            size_t ml = strlen(m->s);
            /* a whole marker inside a delta: it leaked into the text */
            for (size_t i = 0; i + ml <= n; i++)
                if (memcmp(s + i, m->s, ml) == 0)
                    snprintf(c->bad, sizeof c->bad, "delta holds marker %s", m->s);
            /* a delta ending in a proper prefix of a marker while the input fed so far
             * ends in it too: its continuation was unknown, so it had to be held */
            if (!c->finishing)
                for (size_t k = 1; k < ml && k <= n && k <= c->fed_n; k++)
                    if (memcmp(s + n - k, m->s, k) == 0 && memcmp(c->fed + c->fed_n - k, m->s, k) == 0)
                        snprintf(c->bad, sizeof c->bad, "delta ends in a prefix of %s", m->s);
        }
    }
}

static void on_ev(void *u, const toolcall_event *e)
{
    coll *c = u;
    switch (e->kind) {
    case TOOLCALL_EV_CONTENT:
        check_delta(c, e->text, e->len);
        cat(&c->content, &c->content_n, e->text, e->len);
        break;
    case TOOLCALL_EV_REASONING:
        check_delta(c, e->text, e->len);
        cat(&c->reasoning, &c->reasoning_n, e->text, e->len);
        break;
    case TOOLCALL_EV_CALL_BEGIN:
        if (c->open >= 0 || e->index != c->begun || e->index >= 16)
            snprintf(c->bad, sizeof c->bad, "begin %d while %d open", e->index, c->open);
        else {
            snprintf(c->names[e->index], TOOLCALL_NAME_CAP, "%s", e->name);
            snprintf(c->ids[e->index], TOOLCALL_ID_CAP, "%s", e->id);
        }
        c->open = e->index;
        c->begun++;
        break;
    case TOOLCALL_EV_CALL_ARGS:
        if (e->index != c->open || e->index < 0 || e->index >= 16)
            snprintf(c->bad, sizeof c->bad, "args of %d while %d open", e->index, c->open);
        else
            cat(&c->args[e->index], &c->args_n[e->index], e->text, e->len);
        break;
    case TOOLCALL_EV_CALL_END:
        if (e->index != c->open) snprintf(c->bad, sizeof c->bad, "end of %d while %d open", e->index, c->open);
        c->open = -1;
        c->ended++;
        break;
    }
}

static void coll_free(coll *c)
{
    free(c->content);
    free(c->reasoning);
    for (int i = 0; i < 16; i++)
        free(c->args[i]);
}

/* ---- cases ------------------------------------------------------------------------ */

/* The case tables give each call's name and arguments and leave `error`
 * (false) out on purpose; clang's -Wextra flags that, gcc's does not. */
#if defined(__clang__)
#pragma clang diagnostic ignored "-Wmissing-field-initializers"
#endif

typedef struct xcall {
    const char *name, *args;
    bool error;
} xcall;

typedef struct tcase {
    const char *fmt;
    const char *text;
    const char *content, *reasoning;
    xcall calls[4];
    bool sir;          /* the prompt opened reasoning */
    const char *tools; /* JSON tool list or NULL */
    bool raw;          /* markers may appear in the text (malformed cases) */
    bool no_reasoning; /* parse_reasoning off */
} tcase;

static json_t *tools_of(const char *js)
{
    if (!js) return NULL;
    json_error_t je;
    json_t *t = json_loads(js, 0, &je);
    if (!t) fail_msg("tools JSON: %s", je.text);
    return t;
}

static const char *nz(const char *s)
{
    return s ? s : "";
}

static int n_calls_of(const tcase *t)
{
    int n = 0;
    while (n < 4 && t->calls[n].name)
        n++;
    return n;
}

/* Splits: mode 0 whole, 1 bytes, 2 at `cut`, 3 random chunks from `seed`. */
static void run_split(const tcase *t, json_t *tools, int mode, size_t cut, uint64_t seed)
{
    toolcall_options o = toolcall_options_default();
    assert_ok(toolcall_format_from_name(t->fmt, &o.format));
    o.starts_in_reasoning = t->sir;
    o.parse_reasoning = !t->no_reasoning;
    o.tools = tools;
    coll c;
    memset(&c, 0, sizeof c);
    c.open = -1;
    c.markers[0] = tc_spec_of(o.format)->content;
    c.markers[1] = tc_spec_of(o.format)->reasoning;
    c.check_markers = !t->raw;
    o.on_event = on_ev;
    o.event_user = &c;
    toolcall_parser *p;
    char err[BASE_ERR_CAP];
    assert_ok(toolcall_open(&o, &p, err));
    size_t n = strlen(t->text);
    base_rng r;
    base_rng_seed(&r, seed);
    for (size_t i = 0; i < n;) {
        size_t k = n - i;
        if (mode == 1) k = 1;
        if (mode == 2) k = i < cut ? cut - i : n - i;
        if (mode == 3) k = 1 + (size_t)base_rng_below(&r, 17);
        if (k > n - i) k = n - i;
        c.fed = t->text;
        c.fed_n = i + k;
        assert_ok(toolcall_feed(p, t->text + i, k));
        i += k;
    }
    c.finishing = true;
    toolcall_result res;
    assert_ok(toolcall_finish(p, &res));
    const char *what = mode == 0 ? "whole" : mode == 1 ? "bytes" : mode == 2 ? "cut" : "random";
    if (c.bad[0]) fail_msg("%s [%s %zu/%llu]: events: %s", t->fmt, what, cut, (unsigned long long)seed, c.bad);
    if (strcmp(res.content, nz(t->content)) != 0)
        fail_msg("%s [%s %zu/%llu]: content\n  got  \"%s\"\n  want \"%s\"", t->fmt, what, cut,
                 (unsigned long long)seed, res.content, nz(t->content));
    if (strcmp(res.reasoning, nz(t->reasoning)) != 0)
        fail_msg("%s [%s %zu/%llu]: reasoning\n  got  \"%s\"\n  want \"%s\"", t->fmt, what, cut,
                 (unsigned long long)seed, res.reasoning, nz(t->reasoning));
    int want = n_calls_of(t);
    if (res.n_calls != want)
        fail_msg("%s [%s %zu]: %d calls, want %d (first: %s)", t->fmt, what, cut, (int)res.n_calls, want,
                 res.n_calls ? res.calls[0].name : "-");
    int bad = 0;
    for (int i = 0; i < want; i++) {
        const toolcall_call *x = &res.calls[i];
        if (strcmp(x->name, t->calls[i].name) != 0 || strcmp(x->arguments, t->calls[i].args) != 0)
            fail_msg("%s [%s %zu]: call %d\n  got  %s %s\n  want %s %s", t->fmt, what, cut, i, x->name,
                     x->arguments, t->calls[i].name, t->calls[i].args);
        if ((x->error != NULL) != t->calls[i].error)
            fail_msg("%s [%s %zu]: call %d error \"%s\"", t->fmt, what, cut, i, nz(x->error));
        bad += x->error != NULL;
        if (strcmp(c.names[i], x->name) != 0 || strcmp(c.ids[i], x->id) != 0 ||
            c.args_n[i] != x->arguments_len || memcmp(nz(c.args[i]), x->arguments, x->arguments_len) != 0)
            fail_msg("%s [%s %zu]: call %d: streamed %s %s != final", t->fmt, what, cut, i, c.names[i],
                     nz(c.args[i]));
    }
    assert_int_equal(res.n_malformed, bad);
    assert_int_equal(c.ended, want);
    if (c.content_n != res.content_len || memcmp(nz(c.content), res.content, res.content_len) != 0)
        fail_msg("%s [%s]: streamed content \"%s\" != final", t->fmt, what, nz(c.content));
    if (c.reasoning_n != res.reasoning_len || memcmp(nz(c.reasoning), res.reasoning, res.reasoning_len) != 0)
        fail_msg("%s [%s]: streamed reasoning \"%s\" != final", t->fmt, what, nz(c.reasoning));
    json_t *j;
    assert_ok(toolcall_result_json(&res, &j, err));
    json_decref(j);
    toolcall_close(p);
    coll_free(&c);
}

static void run_case(const tcase *t)
{
    json_t *tools = tools_of(t->tools);
    size_t n = strlen(t->text);
    run_split(t, tools, 0, 0, 0);
    run_split(t, tools, 1, 0, 0);
    if (n <= 600)
        for (size_t cut = 1; cut < n; cut++)
            run_split(t, tools, 2, cut, 0);
    for (uint64_t seed = 1; seed <= 40; seed++)
        run_split(t, tools, 3, 0, seed);
    json_decref(tools);
}

static void run_cases(const tcase *cases, size_t n)
{
    for (size_t i = 0; i < n; i++)
        run_case(&cases[i]);
}

#define TOOLS_WEATHER                                                                              \
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":"   \
    "\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},"  \
    "\"metric\":{\"type\":\"boolean\"},\"opts\":{\"type\":\"object\"},\"tags\":{\"type\":"        \
    "[\"array\",\"null\"]}}}}},{\"name\":\"read_file\",\"input_schema\":{\"type\":\"object\","  \
    "\"properties\":{\"path\":{\"type\":\"string\"},\"max_bytes\":{\"type\":\"integer\"}}}}]"

/* ---- formats ------------------------------------------------------------------------ */

static void test_content_and_think(void **state)
{
    (void)state;
    static const tcase cases[] = {
        {.fmt = "content", .text = "Hello, world!", .content = "Hello, world!"},
        {.fmt = "content", .text = "<think>\nI should greet.\n</think>\n\nHello!", .content = "Hello!",
         .reasoning = "I should greet."},
        {.fmt = "content", .text = "Weighing it.\n</think>\n\nDone.", .content = "Done.",
         .reasoning = "Weighing it.", .sir = true},
        {.fmt = "content", .text = "still thinking when the output ended", .reasoning =
                                                                               "still thinking when the output ended",
         .sir = true},
        /* a later <think> is text: reasoning opens only before any content */
        {.fmt = "content", .text = "a <think>b</think> c", .content = "a <think>b</think> c", .raw = true},
        /* parse_reasoning off: markers stay */
        {.fmt = "content", .text = "<think>x</think>y", .content = "<think>x</think>y", .no_reasoning = true},
        /* multi-byte text and a lone '<' */
        {.fmt = "hermes", .text = "x < y; caf\xc3\xa9 \xe6\x9d\xb1\xe4\xba\xac \xf0\x9f\x9a\x80 <",
         .content = "x < y; caf\xc3\xa9 \xe6\x9d\xb1\xe4\xba\xac \xf0\x9f\x9a\x80 <"},
    };
    run_cases(cases, BASE_ARRAY_LEN(cases));
}

static void test_hermes(void **state)
{
    (void)state;
    static const tcase cases[] = {
        {.fmt = "hermes",
         .text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
         .calls = {{"get_weather", "{\"city\": \"Paris\"}"}}},
        {.fmt = "hermes",
         .text = "Let me check.\n\n<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a.txt\"}}\n"
                 "</tool_call>\n<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"b.txt\", "
                 "\"max_bytes\": 100}}\n</tool_call>",
         .content = "Let me check.",
         .calls = {{"read_file", "{\"path\": \"a.txt\"}"},
                   {"read_file", "{\"path\": \"b.txt\", \"max_bytes\": 100}"}}},
        /* Qwen3: reasoning, then a call; nested JSON with escapes and braces in strings */
        {.fmt = "hermes",
         .text = "<think>\nThe user wants weather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", "
                 "\"arguments\": {\"city\": \"S\\u00e3o \\\"P\\\" {}\", \"opts\": {\"a\": [1, 2.5e3, true, null]}}}\n"
                 "</tool_call>",
         .reasoning = "The user wants weather.",
         .calls = {{"get_weather",
                    "{\"city\": \"S\\u00e3o \\\"P\\\" {}\", \"opts\": {\"a\": [1, 2.5e3, true, null]}}"}}},
        /* keys in another order: arguments first (read whole), extra keys skipped */
        {.fmt = "hermes",
         .text = "<tool_call>{\"arguments\": {\"city\": \"Oslo\"}, \"name\": \"get_weather\"}</tool_call>",
         .calls = {{"get_weather", "{\"city\": \"Oslo\"}"}}},
        {.fmt = "hermes",
         .text = "<tool_call>{\"id\": \"x1\", \"type\": \"function\", \"name\": \"read_file\", "
                 "\"arguments\": {\"path\": \"c\"}, \"extra\": [1]}</tool_call>",
         .calls = {{"read_file", "{\"path\": \"c\"}"}}},
        /* no arguments: "{}" */
        {.fmt = "hermes", .text = "<tool_call>{\"name\": \"now\"}</tool_call>", .calls = {{"now", "{}"}}},
        /* arguments as a JSON string holding JSON */
        {.fmt = "hermes",
         .text = "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": \\\"\\u00e9\\\\n\\\"}\"}</tool_call>",
         .calls = {{"f", "{\"a\": \"\xc3\xa9\\n\"}"}}},
        /* OpenAI-shaped object */
        {.fmt = "hermes",
         .text = "<tool_call>{\"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": {\"x\": 1}}}"
                 "</tool_call>",
         .calls = {{"f", "{\"x\": 1}"}}},
        /* a call inside unclosed reasoning ends it (Qwen3.5 style) */
        {.fmt = "hermes",
         .text = "Need a file.\n<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"x\"}}\n</tool_call>",
         .reasoning = "Need a file.", .sir = true, .calls = {{"read_file", "{\"path\": \"x\"}"}}},
        /* a missing </tool_call> before the next call */
        {.fmt = "hermes",
         .text = "<tool_call>{\"name\": \"a\", \"arguments\": {}}\n<tool_call>{\"name\": \"b\", \"arguments\": {}}"
                 "</tool_call>",
         .calls = {{"a", "{}"}, {"b", "{}"}}},
        /* text after the calls */
        {.fmt = "hermes", .text = "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\nDone.",
         .content = "Done.", .calls = {{"a", "{}"}}},
    };
    run_cases(cases, BASE_ARRAY_LEN(cases));
}

static void test_qwen3_coder_xml(void **state)
{
    (void)state;
    static const tcase cases[] = {
        /* typed by the schema */
        {.fmt = "qwen3-coder",
         .text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Jos\xc3\xa9\n</parameter>\n"
                 "<parameter=days>\n3\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n<parameter=opts>\n"
                 "{\"x\": [1, 2]}\n</parameter>\n<parameter=tags>\n[\"a\"]\n</parameter>\n</function>\n</tool_call>",
         .tools = TOOLS_WEATHER,
         .calls = {{"get_weather", "{\"city\": \"San Jos\xc3\xa9\", \"days\": 3, \"metric\": true, \"opts\": "
                                   "{\"x\": [1, 2]}, \"tags\": [\"a\"]}"}}},
        /* without a schema values are strings (objects and arrays that parse stay JSON) */
        {.fmt = "qwen3-coder",
         .text = "<tool_call>\n<function=read_file>\n<parameter=path>\nb.txt\n</parameter>\n<parameter=max_bytes>\n"
                 "100\n</parameter>\n<parameter=o>\n{\"k\": 1}\n</parameter>\n</function>\n</tool_call>",
         .calls = {{"read_file", "{\"path\": \"b.txt\", \"max_bytes\": \"100\", \"o\": {\"k\": 1}}"}}},
        /* a typed value that does not parse is a string; multi-line strings are escaped */
        {.fmt = "qwen3-coder",
         .text = "<tool_call>\n<function=get_weather>\n<parameter=days>\nthree\n</parameter>\n<parameter=city>\n"
                 "line 1\n\"line\" 2\t</x>\n</parameter>\n</function>\n</tool_call>",
         .tools = TOOLS_WEATHER,
         .calls = {{"get_weather", "{\"days\": \"three\", \"city\": \"line 1\\n\\\"line\\\" 2\\t</x>\"}"}}},
        /* Qwen3.5: starts in reasoning, two calls, no parameters */
        {.fmt = "qwen3-coder",
         .text = "Plan.\n</think>\n\n<tool_call>\n<function=now>\n</function>\n</tool_call>\n<tool_call>\n"
                 "<function=read_file>\n<parameter=path>\na\n</parameter>\n</function>\n</tool_call>",
         .sir = true, .reasoning = "Plan.", .calls = {{"now", "{}"}, {"read_file", "{\"path\": \"a\"}"}}},
        /* the JSON shape inside <tool_call> is accepted too */
        {.fmt = "qwen3-coder", .text = "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}</tool_call>",
         .calls = {{"f", "{\"a\": 1}"}}},
    };
    run_cases(cases, BASE_ARRAY_LEN(cases));
}

static void test_glm(void **state)
{
    (void)state;
    static const tcase cases[] = {
        {.fmt = "glm-4.5",
         .text = "<think>Check the files.</think>\n<tool_call>read_file\n<arg_key>path</arg_key>\n<arg_value>a.txt"
                 "</arg_value>\n</tool_call>\n<tool_call>read_file\n<arg_key>path</arg_key>\n<arg_value>b.txt"
                 "</arg_value>\n<arg_key>max_bytes</arg_key>\n<arg_value>100</arg_value>\n</tool_call>",
         .tools = TOOLS_WEATHER, .reasoning = "Check the files.",
         .calls = {{"read_file", "{\"path\": \"a.txt\"}"},
                   {"read_file", "{\"path\": \"b.txt\", \"max_bytes\": 100}"}}},
        /* Laguna: no newlines */
        {.fmt = "glm-4.5",
         .text = "<tool_call>now</tool_call><tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo"
                 "</arg_value></tool_call>",
         .calls = {{"now", "{}"}, {"get_weather", "{\"city\": \"Oslo\"}"}}},
    };
    run_cases(cases, BASE_ARRAY_LEN(cases));
}

static void test_llama3_and_functionary(void **state)
{
    (void)state;
    static const tcase cases[] = {
        {.fmt = "llama3", .text = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}",
         .calls = {{"get_weather", "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}}},
        {.fmt = "llama3",
         .text = "\n{\"type\": \"function\", \"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"x\": 1}}",
         .calls = {{"a", "{}"}, {"b", "{\"x\": 1}"}}},
        {.fmt = "llama3", .text = "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"q\": \"x\"}}",
         .calls = {{"f", "{\"q\": \"x\"}"}}},
        /* built-in tools */
        {.fmt = "llama3", .text = "<|python_tag|>brave_search.call(query=\"weather in Paris\")",
         .calls = {{"brave_search", "{\"query\":\"weather in Paris\"}"}}},
        /* JSON that is an answer, not a call: content */
        {.fmt = "llama3", .text = "{\"name\": \"Bob\", \"age\": 3}", .content = "{\"name\": \"Bob\", \"age\": 3}"},
        {.fmt = "llama3", .text = "The answer is {\"name\": \"x\", \"parameters\": {}}",
         .content = "The answer is {\"name\": \"x\", \"parameters\": {}}"},
        {.fmt = "functionary-v3.1",
         .text = "Sure.<function=read_file>{\"path\": \"a.txt\"}</function><function=read_file>{\"path\": \"b\"}"
                 "</function>",
         .content = "Sure.", .calls = {{"read_file", "{\"path\": \"a.txt\"}"}, {"read_file", "{\"path\": \"b\"}"}}},
    };
    run_cases(cases, BASE_ARRAY_LEN(cases));
}

static void test_mistral(void **state)
{
    (void)state;
    static const tcase cases[] = {
        /* Mistral Small 3.2 / Devstral / Ministral */
        {.fmt = "mistral",
         .text = "[TOOL_CALLS]read_file[CALL_ID]call0000a[ARGS]{\"path\": \"a.txt\"}[TOOL_CALLS]read_file[ARGS]"
                 "{\"path\": \"b.txt\", \"max_bytes\": 100}",
         .calls = {{"read_file", "{\"path\": \"a.txt\"}"}, {"read_file", "{\"path\": \"b.txt\", \"max_bytes\": 100}"}}},
        /* Nemo: a JSON array */
        {.fmt = "mistral",
         .text = "[TOOL_CALLS][{\"name\": \"read_file\", \"arguments\": {\"path\": \"a.txt\"}, \"id\": \"call0000a\"}, "
                 "{\"name\": \"read_file\", \"arguments\": {\"path\": \"b.txt\"}, \"id\": \"call0000b\"}]",
         .calls = {{"read_file", "{\"path\": \"a.txt\"}"}, {"read_file", "{\"path\": \"b.txt\"}"}}},
        /* Magistral reasoning */
        {.fmt = "mistral", .text = "[THINK]Two files.[/THINK]Reading.[TOOL_CALLS]f[ARGS]{}",
         .reasoning = "Two files.", .content = "Reading.", .calls = {{"f", "{}"}}},
        {.fmt = "mistral", .text = "No tools needed [TOOL", .content = "No tools needed [TOOL"},
    };
    run_cases(cases, BASE_ARRAY_LEN(cases));
}

static void test_gpt_oss(void **state)
{
    (void)state;
    static const tcase cases[] = {
        {.fmt = "gpt-oss",
         .text = "<|channel|>analysis<|message|>User greets.<|end|><|start|>assistant<|channel|>final<|message|>"
                 "Hello there.<|return|>",
         .reasoning = "User greets.", .content = "Hello there."},
        /* recipient in the channel, constrain */
        {.fmt = "gpt-oss",
         .text = "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
                 "to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>",
         .reasoning = "Need weather.", .calls = {{"get_weather", "{\"city\":\"Paris\"}"}}},
        /* recipient in the role (as gpt-oss's template renders it), right after <|start|>assistant */
        {.fmt = "gpt-oss",
         .text = " to=functions.read_file<|channel|>commentary json<|message|>{\"path\": \"a.txt\"}<|call|>",
         .calls = {{"read_file", "{\"path\": \"a.txt\"}"}}},
        /* preamble in commentary, final without <|return|> */
        {.fmt = "gpt-oss",
         .text = "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>final<|message|>Done",
         .content = "Checking.Done"},
        /* not harmony at all: content */
        {.fmt = "gpt-oss", .text = "plain words", .content = "plain words"},
    };
    run_cases(cases, BASE_ARRAY_LEN(cases));
}

static void test_deepseek(void **state)
{
    (void)state;
    static const tcase cases[] = {
        /* R1 / V3: prompt ended with <think>\n */
        {.fmt = "deepseek-r1",
         .text = "Two files.\n</think>\n\n<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "begin\xef\xbd\x9c>"
                 "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "begin\xef\xbd\x9c>function"
                 "<\xef\xbd\x9ctool\xe2\x96\x81sep\xef\xbd\x9c>read_file\n```json\n{\"path\": \"a.txt\"}\n```"
                 "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "end\xef\xbd\x9c>\n"
                 "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "begin\xef\xbd\x9c>function"
                 "<\xef\xbd\x9ctool\xe2\x96\x81sep\xef\xbd\x9c>read_file\n```json\n{\"path\": \"b.txt\"}\n```"
                 "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "end\xef\xbd\x9c>"
                 "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "end\xef\xbd\x9c>",
         .sir = true, .reasoning = "Two files.",
         .calls = {{"read_file", "{\"path\": \"a.txt\"}"}, {"read_file", "{\"path\": \"b.txt\"}"}}},
        /* V3.1 */
        {.fmt = "deepseek-v3.1",
         .text = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>read_file<｜tool▁sep｜>{\"path\": \"a.txt\"}"
                 "<｜tool▁call▁end｜><｜tool▁call▁begin｜>read_file<｜tool▁sep｜>{\"path\": \"b.txt\", \"max_bytes\": 100}"
                 "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
         .calls = {{"read_file", "{\"path\": \"a.txt\"}"}, {"read_file", "{\"path\": \"b.txt\", \"max_bytes\": 100}"}}},
        /* V3.1 call without the block opener, text before */
        {.fmt = "deepseek-v3.1", .text = "Sure. <｜tool▁call▁begin｜>now<｜tool▁sep｜>{}<｜tool▁call▁end｜>",
         .content = "Sure.", .calls = {{"now", "{}"}}},
        /* a full-width marker prefix at the end is text */
        {.fmt = "deepseek-r1", .text = "Text <｜tool▁ca", .content = "Text <｜tool▁ca"},
        /* DSML (V3.2 / V4) */
        {.fmt = "deepseek-v3.2", .sir = true,
         .text = "</think>\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"read_file\">\n<｜DSML｜parameter "
                 "name=\"path\" string=\"true\">b.txt</｜DSML｜parameter>\n<｜DSML｜parameter name=\"max_bytes\" "
                 "string=\"false\">100</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>",
         .calls = {{"read_file", "{\"path\": \"b.txt\", \"max_bytes\": 100}"}}},
        {.fmt = "deepseek-v3.2",
         .text = "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"a\">\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"b\">\n"
                 "<｜DSML｜parameter name=\"x\" string=\"true\">1</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
                 "</｜DSML｜tool_calls>",
         .calls = {{"a", "{}"}, {"b", "{\"x\": \"1\"}"}}},
    };
    run_cases(cases, BASE_ARRAY_LEN(cases));
}

static void test_other_families(void **state)
{
    (void)state;
    static const tcase cases[] = {
        {.fmt = "kimi-k2",
         .text = "<|tool_calls_section_begin|><|tool_call_begin|>functions.read_file:0<|tool_call_argument_begin|>"
                 "{\"path\": \"a.txt\"}<|tool_call_end|><|tool_call_begin|>functions.read_file:1"
                 "<|tool_call_argument_begin|>{\"path\": \"b.txt\", \"max_bytes\": 100}<|tool_call_end|>"
                 "<|tool_calls_section_end|>",
         .calls = {{"read_file", "{\"path\": \"a.txt\"}"}, {"read_file", "{\"path\": \"b.txt\", \"max_bytes\": 100}"}}},
        {.fmt = "kimi-k2",
         .text = "<think>hmm</think>Ok.<|tool_call_begin|>functions.now:0<|tool_call_argument_begin|>{}<|tool_call_end|>",
         .reasoning = "hmm", .content = "Ok.", .calls = {{"now", "{}"}}},
        {.fmt = "minimax-m2",
         .text = "Need files.\n</think>\n\n<minimax:tool_call>\n<invoke name=\"read_file\">\n<parameter name=\"path\">"
                 "a.txt</parameter>\n</invoke>\n<invoke name=\"read_file\">\n<parameter name=\"path\">b.txt</parameter>\n"
                 "<parameter name=\"max_bytes\">100</parameter>\n</invoke>\n</minimax:tool_call>",
         .sir = true, .tools = TOOLS_WEATHER, .reasoning = "Need files.",
         .calls = {{"read_file", "{\"path\": \"a.txt\"}"}, {"read_file", "{\"path\": \"b.txt\", \"max_bytes\": 100}"}}},
        {.fmt = "minimax-m1",
         .text = "<think>x</think><tool_calls>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a.txt\"}}\n"
                 "{\"name\": \"read_file\", \"arguments\": {\"path\": \"b.txt\"}}\n</tool_calls>",
         .reasoning = "x", .calls = {{"read_file", "{\"path\": \"a.txt\"}"}, {"read_file", "{\"path\": \"b.txt\"}"}}},
        {.fmt = "apriel",
         .text = "\nThe user wants two files.\n[BEGIN FINAL RESPONSE]\n<tool_calls>[{\"name\": \"read_file\", "
                 "\"arguments\": {\"path\": \"a.txt\"}, \"id\": \"call0000a\"}, {\"name\": \"read_file\", "
                 "\"arguments\": {\"path\": \"b.txt\"}}]</tool_calls>\n[END FINAL RESPONSE]",
         .sir = true, .reasoning = "The user wants two files.",
         .calls = {{"read_file", "{\"path\": \"a.txt\"}"}, {"read_file", "{\"path\": \"b.txt\"}"}}},
        {.fmt = "command-r7b",
         .text = "<|START_THINKING|>Read both.<|END_THINKING|><|START_ACTION|>[\n    {\"tool_call_id\": \"0\", "
                 "\"tool_name\": \"read_file\", \"parameters\": {\"path\": \"a.txt\"}},\n    {\"tool_call_id\": \"1\", "
                 "\"tool_name\": \"read_file\", \"parameters\": {\"path\": \"b.txt\"}}\n]<|END_ACTION|>",
         .reasoning = "Read both.",
         .calls = {{"read_file", "{\"path\": \"a.txt\"}"}, {"read_file", "{\"path\": \"b.txt\"}"}}},
        {.fmt = "command-r7b", .text = "<|START_RESPONSE|>Hi there.<|END_RESPONSE|>", .content = "Hi there."},
        {.fmt = "granite",
         .text = "<think>t</think><response>Calling.</response><|tool_call|>[{\"name\": \"f\", \"arguments\": {\"a\": 1}}]",
         .reasoning = "t", .content = "Calling.", .calls = {{"f", "{\"a\": 1}"}}},
        {.fmt = "nemotron-v2",
         .text = "ok\n</think>\n<TOOLCALL>[{\"name\": \"read_file\", \"arguments\": {\"path\": \"a.txt\"}}, "
                 "{\"name\": \"read_file\", \"arguments\": {\"path\": \"b.txt\"}}]</TOOLCALL>",
         .sir = true, .reasoning = "ok",
         .calls = {{"read_file", "{\"path\": \"a.txt\"}"}, {"read_file", "{\"path\": \"b.txt\"}"}}},
        {.fmt = "lfm2",
         .text = "<|tool_call_start|>[{\"name\": \"get_current_time\", \"arguments\": {\"location\": \"Paris\"}}]"
                 "<|tool_call_end|>Checking.",
         .content = "Checking.", .calls = {{"get_current_time", "{\"location\": \"Paris\"}"}}},
        /* LFM2's own Python-style list */
        {.fmt = "lfm2",
         .text = "<|tool_call_start|>[read_file(path='a.txt'), read_file(path=\"b \\\"x\\\")\", max_bytes=100, "
                 "opts={'k': [1, -2.5, True, None]}), now()]<|tool_call_end|>",
         .calls = {{"read_file", "{\"path\":\"a.txt\"}"},
                   {"read_file", "{\"path\":\"b \\\"x\\\")\",\"max_bytes\":100,\"opts\":{\"k\":[1,-2.5,true,null]}}"},
                   {"now", "{}"}}},
        /* the call starts at "f(" (its name streams first); positional arguments
         * have no names to give: the call keeps them raw, marked */
        {.fmt = "lfm2", .text = "<|tool_call_start|>[f(1, 2)]<|tool_call_end|>",
         .calls = {{"f", "1, 2", true}}, .raw = true},
        {.fmt = "gemma4",
         .text = "<|channel>thought\nTwo reads.<channel|><|tool_call>call:read_file{path:<|\"|>a.txt<|\"|>}"
                 "<tool_call|><|tool_call>call:read_file{max_bytes:100,path:<|\"|>b {x}, \"y\"<|\"|>,o:{k:[1,true,"
                 "<|\"|>s<|\"|>]}}<tool_call|>",
         .reasoning = "Two reads.",
         .calls = {{"read_file", "{\"path\":\"a.txt\"}"},
                   {"read_file", "{\"max_bytes\":100,\"path\":\"b {x}, \\\"y\\\"\",\"o\":{\"k\":[1,true,\"s\"]}}"}}},
        {.fmt = "gigachat3",
         .text = "Checking.<|message_sep|>\n\nfunction call<|role_sep|>\n{\"name\": \"read_file\", \"arguments\": "
                 "{\"path\": \"a.txt\"}}",
         .content = "Checking.", .calls = {{"read_file", "{\"path\": \"a.txt\"}"}}},
        {.fmt = "minicpm5",
         .text = "<function name=\"read_file\"><param name=\"path\">a.txt</param></function>\n<function "
                 "name=\"read_file\"><param name=\"path\"><![CDATA[b <&>\nc]]></param><param name=\"max_bytes\">100"
                 "</param></function>",
         .tools = TOOLS_WEATHER,
         .calls = {{"read_file", "{\"path\": \"a.txt\"}"}, {"read_file", "{\"path\": \"b <&>\\nc\", \"max_bytes\": 100}"}}},
    };
    run_cases(cases, BASE_ARRAY_LEN(cases));
}

/* ---- malformed ------------------------------------------------------------------------- */

static void test_malformed(void **state)
{
    (void)state;
    static const tcase cases[] = {
        /* the header never completes: all content, raw */
        {.fmt = "hermes", .text = "Hi <tool_call>\n{\"name\": \"get_w", .content = "Hi <tool_call>\n{\"name\": \"get_w",
         .raw = true},
        {.fmt = "hermes", .text = "<tool_call>hello world</tool_call> bye",
         .content = "<tool_call>hello world</tool_call> bye", .raw = true},
        {.fmt = "hermes", .text = "<tool_call>", .content = "<tool_call>", .raw = true},
        /* committed, then the output ends inside the arguments: the call keeps the raw text */
        {.fmt = "hermes", .text = "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": [1, 2",
         .calls = {{"f", "{\"a\": [1, 2", true}}},
        /* invalid JSON arguments: raw up to </tool_call> */
        {.fmt = "hermes", .text = "<tool_call>{\"name\": \"f\", \"arguments\": {a: 1}}</tool_call>after",
         .content = "after", .calls = {{"f", "{a: 1}}", true}}},
        /* unknown tool with a list: content, and the next call still parses */
        {.fmt = "hermes",
         .text = "<tool_call>{\"name\": \"rm_rf\", \"arguments\": {}}</tool_call><tool_call>{\"name\": \"read_file\", "
                 "\"arguments\": {\"path\": \"a\"}}</tool_call>",
         .tools = TOOLS_WEATHER, .raw = true,
         .content = "<tool_call>{\"name\": \"rm_rf\", \"arguments\": {}}</tool_call>",
         .calls = {{"read_file", "{\"path\": \"a\"}"}}},
        /* text after the arguments inside the object */
        {.fmt = "hermes", .text = "<tool_call>{\"name\": \"f\", \"arguments\": {} oops}</tool_call>",
         .content = "oops}</tool_call>", .raw = true, .calls = {{"f", "{}", true}}},
        /* XML: unclosed parameter and call at the end */
        {.fmt = "qwen3-coder", .text = "<tool_call>\n<function=f>\n<parameter=a>\nhalf",
         .calls = {{"f", "{\"a\": \"half\"}", true}}},
        {.fmt = "qwen3-coder", .text = "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n",
         .calls = {{"f", "{\"a\": \"1\"}", true}}},
        {.fmt = "qwen3-coder", .text = "<tool_call>\n<function=f>\nstray\n</function>\n</tool_call>",
         .content = "stray\n</function>\n</tool_call>", .raw = true, .calls = {{"f", "{}", true}}},
        /* unknown XML function */
        {.fmt = "minimax-m2",
         .text = "<minimax:tool_call>\n<invoke name=\"nope\">\n</invoke>\n</minimax:tool_call>",
         .tools = TOOLS_WEATHER, .raw = true,
         .content = "<minimax:tool_call>\n<invoke name=\"nope\">\n</invoke>\n</minimax:tool_call>"},
        /* Mistral: bad arguments up to the next [TOOL_CALLS] */
        {.fmt = "mistral", .text = "[TOOL_CALLS]f[ARGS]{x}[TOOL_CALLS]g[ARGS]{\"y\": 2}",
         .calls = {{"f", "{x}", true}, {"g", "{\"y\": 2}"}}},
        /* harmony: an unknown recipient is content */
        {.fmt = "gpt-oss", .tools = TOOLS_WEATHER, .raw = true,
         .text = "<|channel|>commentary to=functions.nope json<|message|>{}<|call|>",
         .content = "<|channel|>commentary to=functions.nope json<|message|>{}"},
        /* DeepSeek: arguments cut by the end of output */
        {.fmt = "deepseek-v3.1", .text = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\":",
         .calls = {{"f", "{\"a\":", true}}},
        /* a string that does not hold JSON */
        {.fmt = "hermes", .text = "<tool_call>{\"name\": \"f\", \"arguments\": \"not json\"}</tool_call>",
         .calls = {{"f", "not json", true}}},
    };
    run_cases(cases, BASE_ARRAY_LEN(cases));
}

/* Text held undecided stays bounded; past the bound it is content (or a string value). */
static void test_bounded_holding(void **state)
{
    (void)state;
    size_t big = (size_t)3 << 20;
    char *t = malloc(big + 64);
    assert_non_null(t);
    strcpy(t, "<tool_call>");
    memset(t + 11, ' ', big);
    strcpy(t + 11 + big, "x");
    toolcall_options o = toolcall_options_default();
    o.format = TOOLCALL_FORMAT_HERMES;
    o.max_held_bytes = 8192;
    toolcall_parser *p;
    assert_ok(toolcall_open(&o, &p, NULL));
    size_t n = strlen(t), held = 0;
    for (size_t i = 0; i < n; i += 1000) {
        assert_ok(toolcall_feed(p, t + i, BASE_MIN(1000, n - i)));
        held = BASE_MAX(held, toolcall_held_bytes(p));
    }
    assert_true(held <= 8192 + 4096 + 1024 + 64 + 1000);
    toolcall_result r;
    assert_ok(toolcall_finish(p, &r));
    assert_int_equal(r.n_calls, 0);
    assert_int_equal(r.content_len, n);
    assert_memory_equal(r.content, t, n);
    toolcall_close(p);

    /* an XML value past the bound streams as a string; the call completes */
    size_t vlen = 100000;
    snprintf(t, 64, "<tool_call>\n<function=w>\n<parameter=body>\n");
    size_t h = strlen(t);
    for (size_t i = 0; i < vlen; i++)
        t[h + i] = (char)('a' + i % 26);
    strcpy(t + h + vlen, "\n</parameter>\n</function>\n</tool_call>");
    assert_ok(toolcall_open(&o, &p, NULL));
    n = strlen(t);
    held = 0;
    for (size_t i = 0; i < n; i += 777) {
        assert_ok(toolcall_feed(p, t + i, BASE_MIN(777, n - i)));
        held = BASE_MAX(held, toolcall_held_bytes(p));
    }
    assert_true(held <= 8192 + 4096 + 1024 + 64 + 777);
    assert_ok(toolcall_finish(p, &r));
    assert_int_equal(r.n_calls, 1);
    assert_null(r.calls[0].error);
    assert_int_equal(r.calls[0].arguments_len, vlen + strlen("{\"body\": \"\"}"));
    assert_memory_equal(r.calls[0].arguments, "{\"body\": \"abc", 13);
    toolcall_close(p);
    free(t);
}

/* The holdback, shown step by step. */
static void test_partial_marker_holdback(void **state)
{
    (void)state;
    coll c;
    memset(&c, 0, sizeof c);
    c.open = -1;
    toolcall_options o = toolcall_options_default();
    o.format = TOOLCALL_FORMAT_HERMES;
    o.on_event = on_ev;
    o.event_user = &c;
    toolcall_parser *p;
    assert_ok(toolcall_open(&o, &p, NULL));
    assert_ok(toolcall_feed(p, "Hello <tool", 11));
    assert_string_equal(nz(c.content), "Hello"); /* " <tool" is held */
    assert_ok(toolcall_feed(p, "_c", 2));
    assert_string_equal(nz(c.content), "Hello");
    assert_ok(toolcall_feed(p, "x", 1)); /* "<tool_cx" is no marker: released */
    assert_string_equal(nz(c.content), "Hello <tool_cx");
    assert_ok(toolcall_feed(p, " <tool_call>{\"name\": \"f\", \"arguments\": {\"a\"", 43));
    assert_string_equal(nz(c.content), "Hello <tool_cx");
    assert_int_equal(c.begun, 1);
    assert_string_equal(c.names[0], "f");
    assert_string_equal(nz(c.args[0]), "{\"a\""); /* arguments stream as they arrive */
    assert_ok(toolcall_feed(p, ": 1}}</tool_call>", 17));
    assert_int_equal(c.ended, 1);
    assert_string_equal(nz(c.args[0]), "{\"a\": 1}");
    /* DeepSeek's full-width marker split inside a character */
    toolcall_close(p);
    coll_free(&c);
    memset(&c, 0, sizeof c);
    c.open = -1;
    o.format = TOOLCALL_FORMAT_DEEPSEEK_V3_1;
    assert_ok(toolcall_open(&o, &p, NULL));
    const char *m = "ok<｜tool▁call▁begin｜>f<｜tool▁sep｜>{}";
    assert_ok(toolcall_feed(p, m, 4)); /* "ok" + 2 of the 3 bytes of '｜' */
    assert_string_equal(nz(c.content), "ok");
    assert_ok(toolcall_feed(p, m + 4, strlen(m) - 4));
    toolcall_result r;
    assert_ok(toolcall_finish(p, &r));
    assert_int_equal(r.n_calls, 1);
    assert_string_equal(r.content, "ok");
    toolcall_close(p);
    coll_free(&c);
    /* a content delta never ends inside a UTF-8 character */
    memset(&c, 0, sizeof c);
    c.open = -1;
    o.format = TOOLCALL_FORMAT_CONTENT;
    assert_ok(toolcall_open(&o, &p, NULL));
    assert_ok(toolcall_feed(p, "caf\xc3", 4));
    assert_string_equal(nz(c.content), "caf");
    assert_ok(toolcall_feed(p, "\xa9!", 2));
    assert_string_equal(nz(c.content), "caf\xc3\xa9!");
    toolcall_close(p);
    coll_free(&c);
}

/* ---- ids, JSON, options -------------------------------------------------------------------- */

static keel_status my_id(void *user, toolcall_format f, int32_t index, char *buf, size_t cap)
{
    int *calls = user;
    (*calls)++;
    assert_int_equal(f, TOOLCALL_FORMAT_HERMES);
    snprintf(buf, cap, "toolu_%02d", (int)index);
    return index == 7 ? KEEL_ECANCELED : KEEL_OK;
}

static void parse_all(const toolcall_options *o, const char *text, toolcall_parser **pp, toolcall_result *r)
{
    assert_ok(toolcall_open(o, pp, NULL));
    assert_ok(toolcall_feed(*pp, text, strlen(text)));
    assert_ok(toolcall_finish(*pp, r));
}

static void test_ids_and_json(void **state)
{
    (void)state;
    const char *two = "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call><tool_call>{\"name\": \"b\", "
                      "\"arguments\": {\"x\": \"\\u00e9\"}}</tool_call>";
    toolcall_options o = toolcall_options_default();
    o.format = TOOLCALL_FORMAT_HERMES;
    toolcall_parser *p, *q;
    toolcall_result r, s;
    parse_all(&o, two, &p, &r);
    parse_all(&o, two, &q, &s);
    assert_int_equal(r.n_calls, 2);
    assert_string_equal(r.calls[0].id, s.calls[0].id); /* deterministic */
    assert_string_not_equal(r.calls[0].id, r.calls[1].id);
    assert_int_equal(strlen(r.calls[0].id), 5 + 24);
    assert_memory_equal(r.calls[0].id, "call_", 5);
    toolcall_close(q);
    o.id_seed = 99;
    parse_all(&o, two, &q, &s);
    assert_string_not_equal(r.calls[0].id, s.calls[0].id);
    toolcall_close(q);
    o.id_prefix = "toolu_";
    parse_all(&o, two, &q, &s);
    assert_memory_equal(s.calls[1].id, "toolu_", 6);
    assert_int_equal(strlen(s.calls[1].id), 6 + 24);
    toolcall_close(q);
    int n_id = 0;
    o.id_fn = my_id;
    o.id_user = &n_id;
    parse_all(&o, two, &q, &s);
    assert_int_equal(n_id, 2);
    assert_string_equal(s.calls[1].id, "toolu_01");
    toolcall_close(q);

    json_t *j;
    char err[BASE_ERR_CAP];
    assert_ok(toolcall_result_json(&r, &j, err));
    assert_true(json_is_null(json_object_get(j, "content")));
    json_t *tc = json_array_get(json_object_get(j, "tool_calls"), 1);
    assert_string_equal(json_string_value(json_object_get(tc, "type")), "function");
    assert_string_equal(json_string_value(json_object_get(tc, "id")), r.calls[1].id);
    json_t *fn = json_object_get(tc, "function");
    assert_string_equal(json_string_value(json_object_get(fn, "name")), "b");
    assert_string_equal(json_string_value(json_object_get(fn, "arguments")), "{\"x\": \"\\u00e9\"}");
    assert_null(json_object_get(j, "reasoning_content"));
    json_decref(j);
    toolcall_close(p);

    /* Mistral's default ids are 9 alphanumerics */
    o = toolcall_options_default();
    o.format = TOOLCALL_FORMAT_MISTRAL;
    parse_all(&o, "[TOOL_CALLS]f[ARGS]{}", &p, &r);
    assert_int_equal(strlen(r.calls[0].id), 9);
    toolcall_close(p);

    /* invalid UTF-8 becomes U+FFFD in the JSON view only */
    o.format = TOOLCALL_FORMAT_CONTENT;
    parse_all(&o, "<think>a\xff</think>b\xc3(", &p, &r);
    assert_int_equal(r.content_len, 3);
    assert_ok(toolcall_result_json(&r, &j, err));
    assert_string_equal(json_string_value(json_object_get(j, "content")), "b\xef\xbf\xbd(");
    assert_string_equal(json_string_value(json_object_get(j, "reasoning_content")), "a\xef\xbf\xbd");
    json_decref(j);
    toolcall_close(p);

    /* a failing id callback stops the feed with its status */
    char text[2048] = "";
    for (int i = 0; i < 9; i++)
        strcat(text, "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>");
    o = toolcall_options_default();
    o.format = TOOLCALL_FORMAT_HERMES;
    o.id_fn = my_id;
    o.id_user = &n_id;
    assert_ok(toolcall_open(&o, &p, NULL));
    assert_status(toolcall_feed(p, text, strlen(text)), KEEL_ECANCELED);
    assert_status(toolcall_feed(p, "x", 1), KEEL_ECANCELED);
    assert_status(toolcall_finish(p, &r), KEEL_ECANCELED);
    toolcall_close(p);
}

/* Formats and fixes measured against llama.cpp's chat cases (issue 22); each
 * case also runs split byte by byte, at every cut and at random. */
static void test_added_formats(void **state)
{
    (void)state;
    static const tcase cases[] = {
        /* Seed-OSS: its own block; values keep their newlines */
        {.fmt = "seed-oss",
         .text = "<seed:think>Two files.</seed:think>\n<seed:tool_call>\n<function=read_file>\n"
                 "<parameter=path>a.txt\n</parameter>\n</function>\n</seed:tool_call>",
         .reasoning = "Two files.", .calls = {{"read_file", "{\"path\": \"a.txt\\n\"}"}}},
        /* Kimi K3: sections, typed arguments */
        {.fmt = "kimi-k3", .sir = true,
         .text = "Checking.<|close|>think<|sep|><|open|>response<|sep|>On it.<|close|>response<|sep|>"
                 "<|open|>tools<|sep|><|open|>call tool=\"get_weather\" index=\"1\"<|sep|>"
                 "<|open|>argument key=\"city\" type=\"string\"<|sep|>Paris<|close|>argument<|sep|>"
                 "<|open|>argument key=\"days\" type=\"number\"<|sep|>3<|close|>argument<|sep|>"
                 "<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|>",
         .reasoning = "Checking.", .content = "On it.", .calls = {{"get_weather", "{\"city\": \"Paris\", \"days\": 3}"}}},
        /* MiniMax M3: elements typed by the schema, nested object and array */
        {.fmt = "minimax-m3", .tools = TOOLS_WEATHER,
         .text = "<mm:think>Go.</mm:think>]<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name=\"get_weather\">"
                 "]<]minimax[>[<city>Oslo]<]minimax[>[</city>]<]minimax[>[<days>2]<]minimax[>[</days>"
                 "]<]minimax[>[<tags>]<]minimax[>[<item>a]<]minimax[>[</item>]<]minimax[>[</tags>"
                 "]<]minimax[>[<opts>]<]minimax[>[<k>1]<]minimax[>[</k>]<]minimax[>[</opts>"
                 "]<]minimax[>[</invoke>\n]<]minimax[>[</tool_call>",
         .reasoning = "Go.",
         .calls = {{"get_weather", "{\"city\": \"Oslo\", \"days\": 2, \"tags\": [\"a\"], \"opts\": {\"k\": 1}}"}}},
        /* Apertus: {NAME: arguments} objects */
        {.fmt = "apertus", .text = "<|tools_prefix|>[{\"get_weather\": {\"city\": \"Rome\"}}]<|tools_suffix|>",
         .calls = {{"get_weather", "{\"city\": \"Rome\"}"}}},
        /* Command R+: Action: and a fenced JSON list */
        {.fmt = "command-r-plus",
         .text = "Action:\n```json\n[{\"tool_name\": \"now\", \"parameters\": {}}]\n```",
         .calls = {{"now", "{}"}}},
        {.fmt = "command-r-plus", .text = "<|CHATBOT_TOKEN|>Hi.<|END_OF_TURN_TOKEN|>", .content = "Hi."},
        /* Functionary v3.2: >>>all is text, >>>NAME a call */
        {.fmt = "functionary-v3.2", .text = "all\nLet me look.>>>read_file\n{\"path\": \"a\"}",
         .content = "Let me look.", .calls = {{"read_file", "{\"path\": \"a\"}"}}},
        /* FireFunction v2 */
        {.fmt = "firefunction-v2", .text = " functools[{\"name\": \"now\", \"arguments\": {}}]",
         .calls = {{"now", "{}"}}},
        /* Muse Glimmer: the call block counts only in a message to a tool */
        {.fmt = "muse", .tools = TOOLS_WEATHER,
         .text = " to=self<|message|>Quoting <atem:function_calls> here<|eom|><|start|>assistant to=user"
                 "<|message|>Sure.<|eom|><|start|>assistant to=get_weather<|message|><atem:function_calls>\n"
                 "<atem:invoke name=\"get_weather\">\n<atem:parameter name=\"days\">4</atem:parameter>\n"
                 "</atem:invoke>\n</atem:function_calls>",
         .reasoning = "Quoting <atem:function_calls> here", .content = "Sure.", .raw = true,
         .calls = {{"get_weather", "{\"days\": 4}"}}},
        /* tencent Hy3 */
        {.fmt = "hy3", .tools = TOOLS_WEATHER,
         .text = "<think:opensource>Hm.</think:opensource><tool_calls:opensource>\n<tool_call:opensource>get_weather"
                 "<tool_sep:opensource>\n<arg_key:opensource>days</arg_key:opensource>\n<arg_value:opensource>5"
                 "</arg_value:opensource>\n</tool_call:opensource>\n</tool_calls:opensource>",
         .reasoning = "Hm.", .calls = {{"get_weather", "{\"days\": 5}"}}},
        /* upstage Solar Open: the model's id is kept */
        {.fmt = "solar-open",
         .text = "<|think|>Hm.<|end|><|begin|>assistant<|tool_calls|><|tool_call:begin|>c1<|tool_call:name|>now"
                 "<|tool_call:args|>{}<|tool_call:end|><|calls|>",
         .reasoning = "Hm.", .calls = {{"now", "{}"}}},
        {.fmt = "solar-open", .text = "<|think|>Hm.<|end|><|begin|>assistant<|content|>Hi.<|end|>",
         .reasoning = "Hm.", .content = "Hi."},
        /* GigaChat 3.1 */
        {.fmt = "gigachat3", .text = "Sure.<|function_call|>{\"name\": \"now\", \"arguments\": {}}",
         .content = "Sure.", .calls = {{"now", "{}"}}},
        /* Qwen3-Coder calls that lost their <tool_call> opener: both kept */
        {.fmt = "qwen3-coder",
         .text = "<function=now>\n</function>\n</tool_call>\n<function=read_file>\n<parameter=path>\nx\n"
                 "</parameter>\n</function>\n</tool_call>",
         .calls = {{"now", "{}"}, {"read_file", "{\"path\": \"x\"}"}}},
        /* a call marker inside a closed reasoning block is reasoning */
        {.fmt = "hermes", .sir = true,
         .text = "Maybe <tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call> later.</think>"
                 "<tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call>",
         .reasoning = "Maybe <tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call> later.", .raw = true,
         .calls = {{"now", "{}"}}},
        /* ... and ends an unclosed one */
        {.fmt = "hermes", .sir = true, .text = "Need it.\n<tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call>",
         .reasoning = "Need it.", .calls = {{"now", "{}"}}},
        /* MiniCPM5: CDATA holding the close tag */
        {.fmt = "minicpm5",
         .text = "<function name=\"read_file\"><param name=\"path\"><![CDATA[a</param>b]]></param></function>",
         .calls = {{"read_file", "{\"path\": \"a</param>b\"}"}}},
        /* Gemma 4: an empty thought and stray channel markers after the answer */
        {.fmt = "gemma4", .text = "<|channel>thought\n<channel|>Hi.<|channel>thought\n<channel|><channel|>", .content = "Hi."},
        /* gpt-oss: to=assistant is no recipient; a built-in nobody offered is dropped */
        {.fmt = "gpt-oss",
         .text = "<|channel|>commentary to=assistant<|channel|>analysis<|message|>Run it.<|end|><|start|>assistant "
                 "to=container.exec<|channel|>commentary<|message|>ls<|call|>",
         .reasoning = "Run it."},
        {.fmt = "gpt-oss", .no_reasoning = true,
         .text = "<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|channel|>final<|message|>Hi.",
         .content = "<|channel|>analysis<|message|>Hm.<|end|>Hi.", .raw = true},
    };
    run_cases(cases, BASE_ARRAY_LEN(cases));
}

/* The ids models write are kept; a JSON answer's fence is removed; the name
 * of a call is known before its arguments. */
static void test_model_ids_and_fences(void **state)
{
    (void)state;
    static const struct {
        toolcall_format f;
        const char *text, *id0, *id1;
    } ids[] = {
        {TOOLCALL_FORMAT_KIMI_K2,
         "<|tool_calls_section_begin|><|tool_call_begin|>functions.now:0<|tool_call_argument_begin|>{}"
         "<|tool_call_end|><|tool_call_begin|>functions.now:1<|tool_call_argument_begin|>{}<|tool_call_end|>"
         "<|tool_calls_section_end|>",
         "functions.now:0", "functions.now:1"},
        {TOOLCALL_FORMAT_MISTRAL, "[TOOL_CALLS]now[CALL_ID]a1b2c3d4e[ARGS]{}[TOOL_CALLS]now[CALL_ID]z9[ARGS]{}",
         "a1b2c3d4e", "z9"},
        {TOOLCALL_FORMAT_MISTRAL, "[TOOL_CALLS][{\"name\": \"now\", \"arguments\": {}, \"id\": \"123456789\"}]",
         "123456789", NULL},
        {TOOLCALL_FORMAT_COMMAND_R7B,
         "<|START_ACTION|>[{\"tool_call_id\": \"0\", \"tool_name\": \"now\", \"parameters\": {}}, "
         "{\"tool_call_id\": \"1\", \"tool_name\": \"now\", \"parameters\": {}}]<|END_ACTION|>",
         "0", "1"},
    };
    for (size_t i = 0; i < BASE_ARRAY_LEN(ids); i++) {
        toolcall_options o = toolcall_options_default();
        o.format = ids[i].f;
        toolcall_parser *p;
        toolcall_result r;
        parse_all(&o, ids[i].text, &p, &r);
        assert_true(r.n_calls >= 1);
        assert_string_equal(r.calls[0].id, ids[i].id0);
        if (ids[i].id1) assert_string_equal(r.calls[1].id, ids[i].id1);
        toolcall_close(p);
    }

    /* json_answer: the fence goes, a fence inside the answer stays */
    static const struct {
        const char *text, *content;
    } fences[] = {
        {"```json\n{\"a\": 1}\n```", "{\"a\": 1}"},
        {"```\n[1, 2]\n```\n", "[1, 2]"},
        {"{\"a\": \"```\"}", "{\"a\": \"```\"}"},
        {"```json\n{\"a\": 1}\n``` and more", "{\"a\": 1}\n``` and more"},
    };
    for (size_t i = 0; i < BASE_ARRAY_LEN(fences); i++) {
        for (size_t step = 1; step <= 64; step *= 4) {
            toolcall_options o = toolcall_options_default();
            o.json_answer = true;
            toolcall_parser *p;
            toolcall_result r;
            assert_ok(toolcall_open(&o, &p, NULL));
            const char *t = fences[i].text;
            for (size_t k = 0, n = strlen(t); k < n; k += step)
                assert_ok(toolcall_feed(p, t + k, BASE_MIN(step, n - k)));
            assert_ok(toolcall_finish(p, &r));
            assert_string_equal(r.content, fences[i].content);
            toolcall_close(p);
        }
    }

    /* the name is known as soon as it is written (OpenAI streams it first) */
    static const struct {
        toolcall_format f;
        const char *text, *name;
    } early[] = {
        {TOOLCALL_FORMAT_COMMAND_R7B, "<|START_ACTION|>[{\"tool_call_id\": \"0\", \"tool_name\": \"now\", ", "now"},
        {TOOLCALL_FORMAT_LFM2, "<|tool_call_start|>[now(a=", "now"},
        {TOOLCALL_FORMAT_HERMES, "<tool_call>{\"name\": \"now\", \"id\": 3, ", "now"},
    };
    for (size_t i = 0; i < BASE_ARRAY_LEN(early); i++) {
        coll c;
        memset(&c, 0, sizeof c);
        c.open = -1;
        toolcall_options o = toolcall_options_default();
        o.format = early[i].f;
        o.on_event = on_ev;
        o.event_user = &c;
        toolcall_parser *p;
        assert_ok(toolcall_open(&o, &p, NULL));
        c.fed = early[i].text;
        c.fed_n = strlen(early[i].text);
        assert_ok(toolcall_feed(p, early[i].text, strlen(early[i].text)));
        assert_int_equal(c.begun, 1);
        assert_string_equal(c.names[0], early[i].name);
        toolcall_close(p);
    }
}

static void test_bad_arguments(void **state)
{
    (void)state;
    toolcall_options o = toolcall_options_default();
    toolcall_parser *p;
    char err[BASE_ERR_CAP];
    o.format = TOOLCALL_FORMAT_COUNT_;
    assert_status(toolcall_open(&o, &p, err), KEEL_EINVAL);
    assert_null(p);
    assert_non_null(strstr(err, "format"));
    o.format = TOOLCALL_FORMAT_HERMES;
    json_t *obj = json_object();
    o.tools = obj;
    assert_status(toolcall_open(&o, &p, err), KEEL_EINVAL);
    assert_non_null(strstr(err, "tools"));
    json_decref(obj);
    o.tools = NULL;
    o.id_prefix = "a-very-long-prefix-that-exceeds-32-bytes";
    assert_status(toolcall_open(&o, &p, err), KEEL_EINVAL);
    o.id_prefix = NULL;
    assert_status(toolcall_open(NULL, &p, err), KEEL_EINVAL);
    assert_ok(toolcall_open(&o, &p, err));
    assert_status(toolcall_feed(p, NULL, 3), KEEL_EINVAL);
    toolcall_result r;
    assert_ok(toolcall_finish(p, &r));
    assert_status(toolcall_finish(p, &r), KEEL_EINVAL);
    assert_status(toolcall_feed(p, "x", 1), KEEL_EINVAL);
    toolcall_close(p);
    toolcall_close(NULL);
}

/* ---- nesting, on a 256 KiB stack (design.md rule 8) ----------------------------------------------- */

typedef struct deep_ctx {
    int failures;
} deep_ctx;

static void expect_one(deep_ctx *d, toolcall_format f, const char *text, const char *args_prefix, bool error)
{
    toolcall_options o = toolcall_options_default();
    o.format = f;
    toolcall_parser *p;
    toolcall_result r;
    if (toolcall_open(&o, &p, NULL)) {
        d->failures++;
        return;
    }
    size_t n = strlen(text);
    for (size_t i = 0; i < n; i += 5)
        if (toolcall_feed(p, text + i, BASE_MIN(5, n - i))) d->failures++;
    if (toolcall_finish(p, &r) || r.n_calls != 1 || (r.calls[0].error != NULL) != error ||
        strncmp(r.calls[0].arguments, args_prefix, strlen(args_prefix)) != 0)
        d->failures++;
    toolcall_close(p);
}

static void *deep_thread(void *arg)
{
    deep_ctx *d = arg;
    static char t[8192];
    /* JSON arguments 500 deep stream fine; past the scanner's 512 they are raw and marked */
    for (int depth = 500; depth <= 600; depth += 100) {
        strcpy(t, "<tool_call>{\"name\": \"f\", \"arguments\": ");
        size_t k = strlen(t);
        for (int i = 0; i < depth; i++)
            t[k++] = '[';
        for (int i = 0; i < depth; i++)
            t[k++] = ']';
        strcpy(t + k, "}</tool_call>");
        expect_one(d, TOOLCALL_FORMAT_HERMES, t, "[[[[", depth > 500);
    }
    /* Python-style and Gemma literals 30 deep convert; the converters stop at 32 */
    strcpy(t, "<|tool_call_start|>[f(a=");
    size_t k = strlen(t);
    for (int i = 0; i < 30; i++)
        t[k++] = '[';
    for (int i = 0; i < 30; i++)
        t[k++] = ']';
    strcpy(t + k, ")]<|tool_call_end|>");
    expect_one(d, TOOLCALL_FORMAT_LFM2, t, "{\"a\":[[[", false);
    strcpy(t, "<|tool_call>call:f{a:");
    k = strlen(t);
    for (int i = 0; i < 30; i++)
        t[k++] = '[';
    for (int i = 0; i < 30; i++)
        t[k++] = ']';
    strcpy(t + k, "}<tool_call|>");
    expect_one(d, TOOLCALL_FORMAT_GEMMA4, t, "{\"a\":[[[", false);
    return NULL;
}

/* The opening of a forced call (tool_choice required / named) per format,
 * and the model's continuation after it parsed as one call. */
static void test_forced_prefix(void **state)
{
    (void)state;
    char buf[320], text[640];
    typedef struct fcase {
        const char *fmt, *name;
        bool in_reasoning;
        const char *want, *rest, *call, *args;
    } fcase;
    static const fcase cases[] = {
        {"hermes", "get_weather", false, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ",
         "{\"city\": \"Paris\"}}\n</tool_call>", "get_weather", "{\"city\": \"Paris\"}"},
        {"hermes", NULL, false, "<tool_call>\n{\"name\": \"",
         "read_file\", \"arguments\": {\"path\": \"a.txt\"}}\n</tool_call>", "read_file", "{\"path\": \"a.txt\"}"},
        {"hermes", "read_file", true, "</think>\n\n<tool_call>\n{\"name\": \"read_file\", \"arguments\": ",
         "{\"path\": \"b\"}}\n</tool_call>", "read_file", "{\"path\": \"b\"}"},
        {"qwen3-coder", "read_file", false, "<tool_call>\n<function=read_file>\n",
         "<parameter=path>\na.txt\n</parameter>\n</function>\n</tool_call>", "read_file", "{\"path\": \"a.txt\"}"},
        {"qwen3-coder", NULL, false, "<tool_call>\n<function=",
         "read_file>\n<parameter=path>\nc\n</parameter>\n</function>\n</tool_call>", "read_file", "{\"path\": \"c\"}"},
        {"llama3", "get_weather", false, "{\"name\": \"get_weather\", \"parameters\": ", "{\"city\": \"Oslo\"}}",
         "get_weather", "{\"city\": \"Oslo\"}"},
    };
    for (size_t i = 0; i < BASE_ARRAY_LEN(cases); i++) {
        const fcase *f = &cases[i];
        toolcall_format fmt;
        assert_ok(toolcall_format_from_name(f->fmt, &fmt));
        size_t n = toolcall_forced_prefix(fmt, f->name, f->in_reasoning, buf, sizeof buf);
        assert_int_equal(n, strlen(f->want));
        assert_string_equal(buf, f->want);
        snprintf(text, sizeof text, "%s%s", buf, f->rest);
        tcase t = {.fmt = f->fmt, .text = text, .calls = {{f->call, f->args}}, .sir = f->in_reasoning,
                   .tools = TOOLS_WEATHER};
        run_case(&t);
    }
    toolcall_format fmt;
    assert_ok(toolcall_format_from_name("hermes", &fmt));
    /* names that cannot be written verbatim, a buffer too small, formats without an opening */
    assert_int_equal(toolcall_forced_prefix(fmt, "a\"b", false, buf, sizeof buf), 0);
    assert_int_equal(toolcall_forced_prefix(fmt, "", false, buf, sizeof buf), 0);
    assert_int_equal(toolcall_forced_prefix(fmt, "read_file", false, buf, 12), 0);
    assert_string_equal(buf, "");
    assert_int_equal(toolcall_forced_prefix(fmt, NULL, false, NULL, 0), 0);
    assert_ok(toolcall_format_from_name("mistral", &fmt));
    assert_int_equal(toolcall_forced_prefix(fmt, NULL, false, buf, sizeof buf), 0);
    assert_ok(toolcall_format_from_name("content", &fmt));
    assert_int_equal(toolcall_forced_prefix(fmt, "x", false, buf, sizeof buf), 0);
}

static void test_deep_nesting_small_stack(void **state)
{
    (void)state;
    pthread_attr_t attr;
    pthread_t th;
    deep_ctx d = {0};
    assert_int_equal(pthread_attr_init(&attr), 0);
    assert_int_equal(pthread_attr_setstacksize(&attr, 256 * 1024), 0);
    assert_int_equal(pthread_create(&th, &attr, deep_thread, &d), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
    pthread_attr_destroy(&attr);
    assert_int_equal(d.failures, 0);
}

/* ---- allocation failures ---------------------------------------------------------------------------- */

typedef struct sweep_ctx {
    toolcall_format f;
    const char *text;
    json_t *tools;
} sweep_ctx;

static keel_status sweep_op(void *ctx)
{
    sweep_ctx *c = ctx;
    toolcall_options o = toolcall_options_default();
    o.format = c->f;
    o.tools = c->tools;
    toolcall_parser *p;
    keel_status st = toolcall_open(&o, &p, NULL);
    if (st) return st;
    size_t n = strlen(c->text);
    for (size_t i = 0; i < n && st == KEEL_OK; i += 7)
        st = toolcall_feed(p, c->text + i, BASE_MIN(7, n - i));
    toolcall_result r;
    if (st == KEEL_OK) st = toolcall_finish(p, &r);
    json_t *j = NULL;
    if (st == KEEL_OK) st = toolcall_result_json(&r, &j, NULL);
    json_decref(j);
    toolcall_close(p);
    return st;
}

static void test_alloc_sweep_toolcall(void **state)
{
    (void)state;
    json_t *tools = tools_of(TOOLS_WEATHER);
    sweep_ctx a = {TOOLCALL_FORMAT_HERMES,
                   "<think>r</think>Hi.<tool_call>{\"name\": \"read_file\", \"arguments\": {\"path\": \"a\"}}</tool_call>"
                   "<tool_call>{\"arguments\": {}, \"name\": \"get_weather\"}</tool_call>",
                   tools};
    assert_true(test_alloc_sweep(sweep_op, &a) >= 8);
    sweep_ctx b = {TOOLCALL_FORMAT_QWEN3_CODER,
                   "<tool_call>\n<function=get_weather>\n<parameter=city>\nX\n</parameter>\n<parameter=days>\n2\n"
                   "</parameter>\n</function>\n</tool_call>",
                   tools};
    assert_true(test_alloc_sweep(sweep_op, &b) >= 5);
    sweep_ctx c = {TOOLCALL_FORMAT_GPT_OSS,
                   "<|channel|>analysis<|message|>a<|end|><|start|>assistant to=functions.read_file<|channel|>"
                   "commentary json<|message|>{\"path\":\"x\"}<|call|>",
                   tools};
    assert_true(test_alloc_sweep(sweep_op, &c) >= 5);
    json_decref(tools);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_content_and_think),
        cmocka_unit_test(test_hermes),
        cmocka_unit_test(test_qwen3_coder_xml),
        cmocka_unit_test(test_glm),
        cmocka_unit_test(test_llama3_and_functionary),
        cmocka_unit_test(test_mistral),
        cmocka_unit_test(test_gpt_oss),
        cmocka_unit_test(test_deepseek),
        cmocka_unit_test(test_other_families),
        cmocka_unit_test(test_added_formats),
        cmocka_unit_test(test_model_ids_and_fences),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_bounded_holding),
        cmocka_unit_test(test_partial_marker_holdback),
        cmocka_unit_test(test_ids_and_json),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_forced_prefix),
        cmocka_unit_test(test_deep_nesting_small_stack),
        cmocka_unit_test(test_alloc_sweep_toolcall),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
