/*
 * test_toolgrammar.c — src/chat/toolgrammar.c: for every format with a
 * tool-call grammar, the canonical text of a call is a sentence of the
 * grammar and the format's parser (src/chat/toolcall) reads it back to the
 * same name and arguments; a wrong name, arguments outside a strict tool's
 * schema and malformed blocks are rejected; tools that are not strict take
 * any object; a strict schema the compiler refuses fails the build, another
 * is left unconstrained with a note; rule renaming keeps recursive schemas
 * intact.
 */
#include "testutil.h"
#include "gramtest.h"
#include "base/base.h"
#include "chat/toolcall.h"
#include "grammar/grammar.h"

#include <stdio.h>
#include <string.h>

/* get_weather is strict; read_file is not (any object unless "all"). */
#define TOOLS                                                                                                  \
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"strict\":true,\"parameters\":{"            \
    "\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":20},"                    \
    "\"unit\":{\"enum\":[\"c\",\"f\"]},\"days\":{\"type\":\"integer\"}},"                   \
    "\"required\":[\"city\"],\"additionalProperties\":false}}},"                                                \
    "{\"type\":\"function\",\"function\":{\"name\":\"read_file\",\"parameters\":{\"type\":\"object\","          \
    "\"properties\":{\"path\":{\"type\":\"string\"}},\"required\":[\"path\"]}}}]"

static json_t *tools_json(const char *s)
{
    json_error_t je;
    json_t *t = json_loads(s, 0, &je);
    if (!t) fail_msg("tools: %s", je.text);
    return t;
}

static gram *build(toolcall_format f, const char *tools_s, const char *only, bool all, toolcall_grammar *tg)
{
    char err[BASE_ERR_CAP] = "";
    json_t *tools = tools_json(tools_s);
    keel_status st = toolcall_grammar_build(f, tools, only, all, true, tg, err);
    json_decref(tools);
    if (st) fail_msg("%s: build: %s", toolcall_format_name(f), err);
    gram *g = NULL;
    if (gram_compile(tg->gbnf, tg->n_gbnf, &g, err)) {
        fputs(tg->gbnf, stderr); /* the whole grammar, for the failure below */
        fail_msg("%s: compile: %s", toolcall_format_name(f), err);
    }
    return g;
}

/* The parser reads text back to the call (name, args as JSON). */
static void parses_to(toolcall_format f, const char *tools_s, const char *text, const char *name, const char *args)
{
    toolcall_options o = toolcall_options_default();
    o.format = f;
    o.tools = tools_json(tools_s);
    toolcall_parser *p = NULL;
    char err[BASE_ERR_CAP] = "";
    assert_ok(toolcall_open(&o, &p, err));
    assert_ok(toolcall_feed(p, text, strlen(text)));
    toolcall_result r;
    assert_ok(toolcall_finish(p, &r));
    if (r.n_calls < 1) fail_msg("%s: no call parsed from %s (content \"%s\")", toolcall_format_name(f), text, r.content);
    assert_string_equal(r.calls[0].name, name);
    if (r.calls[0].error) fail_msg("%s: call error %s", toolcall_format_name(f), r.calls[0].error);
    json_t *got = json_loads(r.calls[0].arguments, 0, NULL), *want = json_loads(args, 0, NULL);
    if (!got || !want || !json_equal(got, want))
        fail_msg("%s: arguments %s, want %s", toolcall_format_name(f), r.calls[0].arguments, args);
    json_decref(got);
    json_decref(want);
    toolcall_close(p);
    json_decref(o.tools);
}

typedef struct tcase {
    const char *fmt;
    const char *good;   /* a call to get_weather {"city": "Paris", "days": 3} */
    const char *two;    /* two calls (or NULL) */
    const char *bad[4]; /* rejected: wrong name, schema violations, broken blocks */
} tcase;

#define ARGS "{\"city\": \"Paris\", \"days\": 3}"
#define DSB "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DSE "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DCB "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DCE "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DSEP "<\xef\xbd\x9ctool\xe2\x96\x81sep\xef\xbd\x9c>"

static const tcase g_cases[] = {
    {"hermes", "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": " ARGS "}\n</tool_call>",
     "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": " ARGS "}\n</tool_call>\n<tool_call>\n{\"name\": "
     "\"read_file\", \"arguments\": {\"path\": \"a\", \"extra\": [1]}}\n</tool_call>",
     {"<tool_call>\n{\"name\": \"get_wether\", \"arguments\": " ARGS "}\n</tool_call>",
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"town\": \"Paris\"}}\n</tool_call>",
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"k\"}}\n</tool_call>",
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": " ARGS "}\n"}},
    {"llama3", "{\"name\": \"get_weather\", \"parameters\": " ARGS "}",
     "{\"name\": \"get_weather\", \"parameters\": " ARGS "}; {\"name\": \"read_file\", \"parameters\": {\"path\": \"b\"}}",
     {"{\"name\": \"weather\", \"parameters\": " ARGS "}", "{\"name\": \"get_weather\", \"parameters\": {\"city\": 3}}",
      "Sure: {\"name\": \"get_weather\", \"parameters\": " ARGS "}", NULL}},
    {"mistral", "[TOOL_CALLS]get_weather[ARGS]" ARGS,
     "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": " ARGS "}, {\"name\": \"read_file\", \"arguments\": "
     "{\"path\": \"b\"}}]",
     {"[TOOL_CALLS]get_weatherx[ARGS]" ARGS, "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\", \"days\": 3.5}",
      "[TOOL_CALLS]get_weather" ARGS, NULL}},
    {"functionary-v3.1", "<function=get_weather>" ARGS "</function>",
     "<function=get_weather>" ARGS "</function><function=read_file>{\"path\": \"c\"}</function>",
     {"<function=get_weather>{\"days\": 3}</function>", "<function=get_weather>" ARGS, NULL, NULL}},
    {"deepseek-v3.1", DSB DCB "get_weather" DSEP ARGS DCE DSE, DCB "get_weather" DSEP ARGS DCE,
     {DSB DCB "get_weather" DSEP "{\"city\": null}" DCE DSE, DSB DCB "nope" DSEP ARGS DCE DSE, NULL, NULL}},
    {"deepseek-r1", DSB DCB "function" DSEP "get_weather\n```json\n" ARGS "\n```" DCE DSE, NULL,
     {DSB DCB "function" DSEP "get_weather\n```json\n{}\n```" DCE DSE, NULL, NULL, NULL}},
    {"kimi-k2",
     "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>" ARGS
     "<|tool_call_end|><|tool_calls_section_end|>",
     "<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>" ARGS
     "<|tool_call_end|><|tool_call_begin|>functions.read_file:1<|tool_call_argument_begin|>{\"path\": \"x\"}"
     "<|tool_call_end|>",
     {"<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"" "123456789012345678901"
      "\"}<|tool_call_end|>",
      NULL, NULL, NULL}},
    {"nemotron-v2", "<TOOLCALL>[{\"name\": \"get_weather\", \"arguments\": " ARGS "}]</TOOLCALL>", NULL,
     {"<TOOLCALL>[{\"name\": \"get_weather\", \"arguments\": " ARGS "}]", NULL, NULL, NULL}},
    {"granite", "<|tool_call|>[{\"name\": \"get_weather\", \"arguments\": " ARGS "}]", NULL, {NULL}},
    {"apriel", "<tool_calls>[{\"name\": \"get_weather\", \"arguments\": " ARGS "}]</tool_calls>", NULL, {NULL}},
    {"lfm2", "<|tool_call_start|>[{\"name\": \"get_weather\", \"arguments\": " ARGS "}]<|tool_call_end|>", NULL, {NULL}},
    /* XML parameters: strings raw, the rest JSON, in the order of properties */
    {"qwen3-coder",
     "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
     "</function>\n</tool_call>",
     "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
     "</function>\n</tool_call>\n<tool_call>\n<function=read_file>\n<parameter=path>\nb.txt\n</parameter>\n"
     "</function>\n</tool_call>",
     {"<tool_call>\n<function=get_weather>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\nthree\n"
      "</parameter>\n</function>\n</tool_call>",
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=unit>\nk\n"
      "</parameter>\n</function>\n</tool_call>",
      "<tool_call>\n<function=other>\n</function>\n</tool_call>"}},
    {"seed-oss",
     "<seed:tool_call>\n<function=get_weather>\n<parameter=city>Paris</parameter>\n<parameter=days>3"
     "</parameter>\n</function>\n</seed:tool_call>",
     NULL, {"<seed:tool_call>\n<function=get_weather>\n</function>\n</seed:tool_call>", NULL, NULL, NULL}},
    {"glm-4.5",
     "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n"
     "<arg_value>3</arg_value>\n</tool_call>",
     NULL, {"<tool_call>get_weather\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>", NULL, NULL, NULL}},
    {"minimax-m2",
     "<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Paris</parameter>\n"
     "<parameter name=\"days\">3</parameter>\n</invoke>\n</minimax:tool_call>",
     NULL,
     {"<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Pa<ris</parameter>\n"
      "</invoke>\n</minimax:tool_call>",
      NULL, NULL, NULL}},
};

static void test_formats(void **state)
{
    (void)state;
    for (size_t i = 0; i < BASE_ARRAY_LEN(g_cases); i++) {
        const tcase *c = &g_cases[i];
        toolcall_format f;
        assert_ok(toolcall_format_from_name(c->fmt, &f));
        assert_true(toolcall_grammar_supported(f));
        toolcall_grammar tg;
        gram *g = build(f, TOOLS, NULL, false, &tg);
        assert_true(tg.n_triggers >= 1);
        assert_non_null(tg.markers);
        assert_int_equal(tg.n_constrained, 1); /* get_weather only: read_file is not strict */
        assert_string_equal(tg.note, "");
        /* the grammar starts with a trigger (llama3: at the start of the output) */
        bool starts = false;
        for (int32_t t = 0; t < tg.n_triggers; t++) starts |= strncmp(c->good, tg.triggers[t], strlen(tg.triggers[t])) == 0;
        if (!starts) fail_msg("%s: the call does not start with a trigger", c->fmt);
        if (!test_gram_accepts_str(g, c->good)) fail_msg("%s: rejects %s\n%s", c->fmt, c->good, tg.gbnf);
        parses_to(f, TOOLS, c->good, "get_weather", ARGS);
        if (c->two) {
            if (!test_gram_accepts_str(g, c->two)) fail_msg("%s: rejects two calls %s", c->fmt, c->two);
            parses_to(f, TOOLS, c->two, "get_weather", ARGS);
        }
        for (int k = 0; k < 4 && c->bad[k]; k++)
            if (test_gram_accepts_str(g, c->bad[k])) fail_msg("%s: accepts bad text %d: %s", c->fmt, k, c->bad[k]);
        /* a prefix of the call is not complete */
        char half[64];
        snprintf(half, sizeof half, "%.*s", (int)(strlen(c->good) / 2), c->good);
        assert_false(test_gram_accepts_str(g, half));
        gram_free(g);
        toolcall_grammar_free(&tg);
    }
}

/* all: every tool follows its schema; only: one name */
static void test_all_and_only(void **state)
{
    (void)state;
    toolcall_grammar tg;
    gram *g = build(TOOLCALL_FORMAT_HERMES, TOOLS, NULL, true, &tg);
    assert_int_equal(tg.n_constrained, 2);
    assert_true(test_gram_accepts_str(g, "<tool_call>{\"name\": \"read_file\", \"arguments\": {\"path\": \"a\"}}</tool_call>"));
    assert_false(test_gram_accepts_str(g, "<tool_call>{\"name\": \"read_file\", \"arguments\": {\"path\": 1}}</tool_call>"));
    gram_free(g);
    toolcall_grammar_free(&tg);
    g = build(TOOLCALL_FORMAT_QWEN3_CODER, TOOLS, "read_file", true, &tg);
    assert_true(test_gram_accepts_str(g, "<tool_call>\n<function=read_file>\n<parameter=path>\na b\n</parameter>\n</function>\n"
                           "</tool_call>"));
    assert_false(test_gram_accepts_str(g, "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                            "</function>\n</tool_call>"));
    assert_false(test_gram_accepts_str(g, "<tool_call>\n<function=read_file>\n</function>\n</tool_call>")); /* path required */
    gram_free(g);
    toolcall_grammar_free(&tg);
    /* not strict, XML: any parameters */
    g = build(TOOLCALL_FORMAT_QWEN3_CODER, TOOLS, NULL, false, &tg);
    assert_true(test_gram_accepts_str(g, "<tool_call>\n<function=read_file>\n<parameter=whatever>\n{\"x\": 1}\n</parameter>\n"
                           "</function>\n</tool_call>"));
    gram_free(g);
    toolcall_grammar_free(&tg);
}

/* A schema the compiler refuses: strict fails naming the tool; otherwise
 * the tool is left free and the note says why. */
static void test_refused_schema(void **state)
{
    (void)state;
    static const char tools_strict[] =
        "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"strict\":true,\"parameters\":{\"type\":\"object\","
        "\"properties\":{\"a\":{\"$ref\":\"http://example.com/s.json\"}}}}}]";
    static const char tools_free[] =
        "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\","
        "\"properties\":{\"a\":{\"$ref\":\"http://example.com/s.json\"}}}}}]";
    char err[BASE_ERR_CAP] = "";
    toolcall_grammar tg;
    json_t *t = tools_json(tools_strict);
    keel_status st = toolcall_grammar_build(TOOLCALL_FORMAT_HERMES, t, NULL, false, true, &tg, err);
    json_decref(t);
    assert_true(st == KEEL_EUNSUPPORTED || st == KEEL_EFORMAT);
    assert_non_null(strstr(err, "tool 'f' (strict)"));
    assert_null(tg.gbnf);
    gram *g = build(TOOLCALL_FORMAT_HERMES, tools_free, NULL, true, &tg);
    assert_int_equal(tg.n_constrained, 0);
    assert_non_null(strstr(tg.note, "tool 'f' unconstrained"));
    assert_true(test_gram_accepts_str(g, "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": [1]}}</tool_call>"));
    gram_free(g);
    toolcall_grammar_free(&tg);
    /* a format without a grammar */
    t = tools_json(TOOLS);
    assert_int_equal(toolcall_grammar_build(TOOLCALL_FORMAT_GPT_OSS, t, NULL, true, true, &tg, err), KEEL_EUNSUPPORTED);
    assert_int_equal(toolcall_grammar_build(TOOLCALL_FORMAT_HERMES, t, "nope", true, true, &tg, err), KEEL_EINVAL);
    json_decref(t);
    assert_false(toolcall_grammar_supported(TOOLCALL_FORMAT_GPT_OSS));
    /* a strict tool whose schema accepts nothing is refused up front */
    t = tools_json("[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"strict\":true,\"parameters\":{\"type\":\"object\","
                   "\"properties\":{\"a\":{\"type\":\"integer\",\"minimum\":2,\"maximum\":1}},\"required\":[\"a\"]}}}]");
    st = toolcall_grammar_build(TOOLCALL_FORMAT_HERMES, t, NULL, false, true, &tg, err);
    json_decref(t);
    assert_int_equal(st, KEEL_EUNSUPPORTED);
    assert_non_null(strstr(err, "accepts nothing"));
    /* an XML format's raw string: a length bound it cannot write is refused, not dropped */
    static const char *const raw_bad[] = {
        "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"strict\":true,\"parameters\":{\"type\":\"object\","
        "\"properties\":{\"a\":{\"type\":\"string\",\"minLength\":20000}}}}}]",
        "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"strict\":true,\"parameters\":{\"type\":\"object\","
        "\"properties\":{\"a\":{\"type\":\"string\",\"minLength\":5,\"maxLength\":2}}}}}]",
    };
    for (size_t i = 0; i < BASE_ARRAY_LEN(raw_bad); i++) {
        t = tools_json(raw_bad[i]);
        st = toolcall_grammar_build(TOOLCALL_FORMAT_QWEN3_CODER, t, NULL, false, true, &tg, err);
        json_decref(t);
        assert_int_equal(st, KEEL_EUNSUPPORTED);
        assert_non_null(strstr(err, "minLength / maxLength of a raw string parameter"));
    }
}

/* Two tools with recursive schemas: each keeps its own rules. */
static void test_recursive_schemas(void **state)
{
    (void)state;
    static const char tools[] =
        "[{\"type\":\"function\",\"function\":{\"name\":\"tree\",\"strict\":true,\"parameters\":{\"type\":\"object\","
        "\"properties\":{\"v\":{\"type\":\"integer\"},\"next\":{\"anyOf\":[{\"$ref\":\"#\"},{\"type\":\"null\"}]}},"
        "\"required\":[\"v\",\"next\"],\"additionalProperties\":false}}},"
        "{\"type\":\"function\",\"function\":{\"name\":\"flag\",\"strict\":true,\"parameters\":{\"type\":\"object\","
        "\"properties\":{\"on\":{\"type\":\"boolean\"}},\"required\":[\"on\"],\"additionalProperties\":false}}}]";
    toolcall_grammar tg;
    gram *g = build(TOOLCALL_FORMAT_HERMES, tools, NULL, false, &tg);
    assert_int_equal(tg.n_constrained, 2);
    assert_true(test_gram_accepts_str(g, "<tool_call>{\"name\": \"tree\", \"arguments\": {\"v\": 1, \"next\": {\"v\": 2, \"next\": "
                           "null}}}</tool_call>"));
    assert_false(test_gram_accepts_str(g, "<tool_call>{\"name\": \"tree\", \"arguments\": {\"v\": 1, \"next\": {\"on\": true}}}"
                            "</tool_call>"));
    assert_true(test_gram_accepts_str(g, "<tool_call>{\"name\": \"flag\", \"arguments\": {\"on\": true}}</tool_call>"));
    assert_false(test_gram_accepts_str(g, "<tool_call>{\"name\": \"flag\", \"arguments\": {\"v\": 1, \"next\": null}}</tool_call>"));
    gram_free(g);
    toolcall_grammar_free(&tg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_formats),
        cmocka_unit_test(test_all_and_only),
        cmocka_unit_test(test_refused_schema),
        cmocka_unit_test(test_recursive_schemas),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
