/*
 * test_chat_conformance.c — llama.cpp's chat-parser cases
 * (tests/data/chat-conformance/llamacpp_cases.json, extracted from its
 * tests/test-chat.cpp by tools/chat-conformance/extract_llamacpp_cases.py;
 * the commit is in the file) run the way the engine runs a chat turn: an
 * engine opened with the case's template (format detected from it), the
 * request rendered by keel (messages, tools, enable_thinking, a continued
 * assistant message), then the model output parsed whole and byte by
 * byte (eng_chat_parse_output). Both must give the message llama.cpp
 * expects, compared as llama.cpp compares (content and reasoning trimmed,
 * arguments as JSON, ids where the model wrote one).
 *
 * Cases may fail only if known_failures.txt lists them (one id and a
 * reason a line): a new failure, or a listed case that now passes, fails
 * the test, so the list stays exact. Disputed cases (the expectation
 * holds text of the prompt, not of the model) are reported apart.
 *
 * Prints the per-template table (KEEL_CONFORMANCE_VERBOSE=1: each failing
 * case with both messages; KEEL_CONFORMANCE_FILTER=substr: some templates).
 */
#include "testutil.h"
#include "engine/eng.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char g_model[64];
static char g_dir[512];

static int setup(void **state)
{
    (void)state;
    const char *d = getenv("KEEL_TESTDATA");
    snprintf(g_dir, sizeof g_dir, "%s/chat-conformance", d ? d : "tests/data");
    return test_gen_qwen2(g_model, sizeof g_model, "chat_conf", 1, 5) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    unlink(g_model);
    return 0;
}

/* ---- comparison as llama.cpp's assert_msg_equals(..., true) ------------------ */

static void strip(const char *s, size_t n, const char **a, size_t *an)
{
    size_t i = 0;
    while (i < n && strchr(" \t\n\r", s[i])) i++;
    while (n > i && strchr(" \t\n\r", s[n - 1])) n--;
    *a = s + i;
    *an = n - i;
}

static bool text_eq(json_t *want, json_t *got)
{
    const char *w = json_is_string(want) ? json_string_value(want) : "";
    const char *g = json_is_string(got) ? json_string_value(got) : "";
    size_t wn0 = json_is_string(want) ? json_string_length(want) : 0, gn0 = json_is_string(got) ? json_string_length(got) : 0;
    const char *ws, *gs;
    size_t wn, gn;
    strip(w, wn0, &ws, &wn);
    strip(g, gn0, &gs, &gn);
    return wn == gn && memcmp(ws, gs, wn) == 0;
}

/* Arguments: equal as JSON; two texts that are not JSON compare equal (a
 * partial call's arguments), as llama.cpp's renormalize_json makes them "". */
static bool args_eq(const char *want, const char *got)
{
    json_t *w = json_loads(want, JSON_DECODE_ANY, NULL), *g = json_loads(got, JSON_DECODE_ANY, NULL);
    bool eq = (!w && !g) || (w && g && json_equal(w, g));
    if (w) json_decref(w);
    if (g) json_decref(g);
    return eq;
}

static const char *str_or(json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

/* got: {"content", "reasoning_content", "tool_calls": [{"id", "name", "arguments"}]}
 * or toolcall_result_json's message ({"id", "function": {"name", "arguments"}}). */
static bool msg_eq(json_t *want, json_t *got, char *why, size_t cap)
{
    if (!text_eq(json_object_get(want, "content"), json_object_get(got, "content"))) {
        snprintf(why, cap, "content");
        return false;
    }
    if (!text_eq(json_object_get(want, "reasoning_content"), json_object_get(got, "reasoning_content"))) {
        snprintf(why, cap, "reasoning_content");
        return false;
    }
    json_t *wc = json_object_get(want, "tool_calls"), *gc = json_object_get(got, "tool_calls");
    if (json_array_size(wc) != json_array_size(gc)) {
        snprintf(why, cap, "%zu tool calls, expected %zu", json_array_size(gc), json_array_size(wc));
        return false;
    }
    for (size_t i = 0; i < json_array_size(wc); i++) {
        json_t *w = json_array_get(wc, i), *g = json_array_get(gc, i);
        json_t *gf = json_object_get(g, "function");
        if (!gf) gf = g;
        if (strcmp(str_or(w, "name"), str_or(gf, "name")) != 0) {
            snprintf(why, cap, "call %zu name", i);
            return false;
        }
        if (!args_eq(str_or(w, "arguments"), str_or(gf, "arguments"))) {
            snprintf(why, cap, "call %zu arguments", i);
            return false;
        }
        if (*str_or(w, "id") && strcmp(str_or(w, "id"), str_or(g, "id")) != 0) {
            snprintf(why, cap, "call %zu id", i);
            return false;
        }
    }
    return true;
}

/* ---- requests ------------------------------------------------------------------ */

static json_t *request_of(json_t *c, json_t *tools)
{
    json_t *req = json_object();
    json_t *msgs = json_object_get(c, "messages");
    if (json_array_size(msgs) > 0)
        json_object_set(req, "messages", msgs);
    else
        json_object_set_new(req, "messages", json_pack("[{s:s, s:s}]", "role", "user", "content", "Hey there!"));
    json_t *names = json_object_get(c, "tools"), *arr = json_array();
    size_t i;
    json_t *n;
    json_array_foreach(names, i, n)
    {
        json_t *t = json_is_string(n) ? json_object_get(tools, json_string_value(n)) : n;
        if (t) json_array_append(arr, t);
    }
    if (json_array_size(arr) > 0) json_object_set(req, "tools", arr);
    json_decref(arr);
    const char *tc = json_string_value(json_object_get(c, "tool_choice"));
    if (tc) json_object_set_new(req, "tool_choice", json_string(tc));
    json_t *th = json_object_get(c, "enable_thinking");
    json_object_set_new(req, "chat_template_kwargs",
                        json_pack("{s:b}", "enable_thinking", json_is_boolean(th) ? json_is_true(th) : 1));
    const char *rf = json_string_value(json_object_get(c, "reasoning_format"));
    json_object_set_new(req, "reasoning_format", json_string(rf && strcmp(rf, "none") != 0 ? "auto" : "none"));
    const char *cont = json_string_value(json_object_get(c, "continue_final_message"));
    if (cont)
        json_object_set_new(req, "continue_final_message",
                            json_string(strcmp(cont, "reasoning") == 0 ? "reasoning_content" : "content"));
    else
        json_object_set_new(req, "continue_final_message", json_false());
    json_t *schema = json_object_get(c, "json_schema");
    if (schema && !json_is_null(schema))
        json_object_set_new(req, "response_format",
                            json_pack("{s:s, s:{s:O}}", "type", "json_schema", "json_schema", "schema", schema));
    json_t *agp = json_object_get(c, "add_generation_prompt");
    if (json_is_boolean(agp) && !cont) json_object_set(req, "add_generation_prompt", agp);
    return req;
}

/* ---- the run ------------------------------------------------------------------- */

typedef struct row {
    char tmpl[96];
    const char *format;
    int pass, total, cpass, ctotal, disputed;
} row;

static bool listed(json_t *known, const char *id)
{
    return json_object_get(known, id) != NULL;
}

/* known_failures.txt: "id  reason" lines ('#' comments). */
static json_t *load_known(void)
{
    char path[600];
    snprintf(path, sizeof path, "%s/known_failures.txt", g_dir);
    json_t *k = json_object();
    FILE *f = fopen(path, "r");
    if (!f) return k;
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#' || line[0] == '\n') continue;
        char *sp = strpbrk(line, " \t\n");
        if (sp) *sp = '\0';
        json_object_set_new(k, line, json_true());
    }
    fclose(f);
    return k;
}

static void print_msg(const char *label, json_t *m)
{
    char *s = m ? json_dumps(m, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
    printf("    %s: %s\n", label, s ? s : "(none)");
    free(s);
}

/* A seed for fuzz/toolcall.c: format, options (reasoning open, tools,
 * reasoning off, JSON answer), no chunk sizes, the output. */
static void write_seed(const keel_engine *e, json_t *c, const char *id, const char *prompt, const char *in, size_t n)
{
    char path[700], name[160];
    size_t k = 0;
    for (const char *q = id; *q && k + 1 < sizeof name; q++)
        name[k++] = (*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') || (*q >= '0' && *q <= '9') ? *q : '_';
    name[k] = '\0';
    snprintf(path, sizeof path, "%s/case_%s", getenv("KEEL_CONFORMANCE_SEEDS"), name);
    const char *rf = json_string_value(json_object_get(c, "reasoning_format"));
    json_t *schema = json_object_get(c, "json_schema");
    uint8_t head[3] = {(uint8_t)e->tool_format, 0, 0};
    if (toolcall_prompt_opens_reasoning(e->tool_format, prompt, strlen(prompt))) head[1] |= 1;
    if (json_array_size(json_object_get(c, "tools")) > 0) head[1] |= 2;
    if (!rf || strcmp(rf, "none") == 0) head[1] |= 4;
    if (schema && !json_is_null(schema)) head[1] |= 8;
    FILE *f = fopen(path, "wb");
    if (!f) fail_msg("seed %s: cannot write", path);
    bool ok = fwrite(head, 1, 3, f) == 3 && fwrite(in, 1, n, f) == n;
    if (fclose(f) != 0 || !ok) fail_msg("seed %s: write failed", path);
}

static void test_llamacpp_cases(void **state)
{
    (void)state;
    char path[600];
    snprintf(path, sizeof path, "%s/llamacpp_cases.json", g_dir);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) {
        printf("SKIP: %s: %s\n", path, je.text);
        skip();
    }
    json_t *cases = json_object_get(root, "cases"), *tools = json_object_get(root, "tools");
    json_t *known = load_known(), *seen_known = json_object();
    const char *filter = getenv("KEEL_CONFORMANCE_FILTER");
    bool verbose = getenv("KEEL_CONFORMANCE_VERBOSE") != NULL;
    row rows[128];
    int n_rows = 0, unexpected = 0, fixed = 0;
    keel_engine *e = NULL;
    row *r = NULL; /* the current template's row */
    char cur[96] = "";
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c)
    {
        const char *tmpl = str_or(c, "template"), *id = str_or(c, "id");
        if (filter && !strstr(tmpl, filter)) continue;
        if (strcmp(tmpl, cur) != 0) {
            keel_engine_close(e);
            e = NULL;
            snprintf(cur, sizeof cur, "%s", tmpl);
            char opts[1024], err[256] = "";
            snprintf(opts, sizeof opts,
                     "{\"model\": \"%s\", \"n_threads\": 1, \"n_ctx\": 256, \"chat_template\": \"%s/templates/%s\"}",
                     g_model, g_dir, tmpl);
            keel_status st = keel_engine_open(opts, &e, err);
            if (st != KEEL_OK) fail_msg("%s: engine open: %s", tmpl, err);
            r = NULL;
            for (int k = 0; k < n_rows; k++)
                if (strcmp(rows[k].tmpl, tmpl) == 0) r = &rows[k];
            if (!r) {
                assert_true(n_rows < 128);
                r = &rows[n_rows++];
                memset(r, 0, sizeof *r);
                snprintf(r->tmpl, sizeof r->tmpl, "%s", tmpl);
                r->format = toolcall_format_name(e->tool_format);
            }
        }
        bool cont = json_is_true(json_object_get(c, "continuation"));
        bool partial = json_is_true(json_object_get(c, "is_partial"));
        const char *disputed = json_string_value(json_object_get(c, "disputed"));
        json_t *req = request_of(c, tools);
        char *rj = json_dumps(req, JSON_COMPACT);
        json_decref(req);
        const char *in = str_or(c, "input");
        size_t in_len = json_string_length(json_object_get(c, "input"));
        json_t *want = json_object_get(c, "expect");
        json_t *full = NULL, *streamed = NULL, *full1 = NULL, *streamed1 = NULL, *prompt = NULL;
        char err[BASE_ERR_CAP] = "", why[BASE_ERR_CAP + 128] = "";
        bool ok = true;
        keel_status st = eng_chat_parse_output(e, rj, in, in_len, 0, partial, &full, &streamed, &prompt, err);
        if (st != KEEL_OK) {
            ok = false;
            snprintf(why, sizeof why, "parse: %s: %s", keel_status_name(st), err);
        }
        if (ok && !partial && !msg_eq(want, full, why, sizeof why)) ok = false;
        if (ok && !msg_eq(want, streamed, why, sizeof why)) ok = false;
        if (ok) {
            st = eng_chat_parse_output(e, rj, in, in_len, 1, partial, &full1, &streamed1, NULL, err);
            if (st != KEEL_OK) {
                ok = false;
                snprintf(why, sizeof why, "byte by byte: %s: %s", keel_status_name(st), err);
            } else {
                char w1[96] = "";
                if (!msg_eq(want, streamed1, w1, sizeof w1) || (!partial && !msg_eq(want, full1, w1, sizeof w1))) {
                    ok = false;
                    snprintf(why, sizeof why, "byte by byte: %s", w1);
                }
            }
        }
        if (disputed) {
            r->disputed++;
        } else if (cont) {
            r->ctotal++;
            r->cpass += ok;
        } else {
            r->total++;
            r->pass += ok;
        }
        if (!ok && !disputed && !listed(known, id)) unexpected++;
        if (!ok && listed(known, id)) json_object_set_new(seen_known, id, json_true());
        if (ok && listed(known, id)) {
            fixed++;
            printf("FIXED (remove from known_failures.txt): %s\n", id);
        }
        if (!ok && (verbose || (!disputed && !listed(known, id)))) {
            printf("FAIL %s (%s, line %d): %s\n", id, r->format, (int)json_integer_value(json_object_get(c, "line")),
                   why);
            if (verbose) {
                printf("    request: %s\n", rj);
                const char *ps = json_string_value(prompt);
                size_t pl = ps ? strlen(ps) : 0;
                printf("    prompt tail: %s\n", ps ? ps + (pl > 160 ? pl - 160 : 0) : "(none)");
                printf("    input: %s\n", in);
                print_msg("want", want);
                print_msg("full", full);
                print_msg("streamed", streamed1 ? streamed1 : streamed);
            }
        }
        if (getenv("KEEL_CONFORMANCE_SEEDS") && prompt) write_seed(e, c, id, json_string_value(prompt), in, in_len);
        free(rj);
        json_decref(full);
        json_decref(streamed);
        json_decref(full1);
        json_decref(streamed1);
        json_decref(prompt);
    }
    keel_engine_close(e);
    int pass = 0, total = 0, cpass = 0, ctotal = 0, disp = 0;
    printf("\n%-52s %-18s %9s %9s\n", "template", "format", "cases", "continued");
    for (int k = 0; k < n_rows; k++) {
        const row *w = &rows[k];
        char a[16], b[16];
        snprintf(a, sizeof a, "%d/%d", w->pass, w->total);
        snprintf(b, sizeof b, "%d/%d", w->cpass, w->ctotal);
        printf("%-52s %-18s %9s %9s%s\n", w->tmpl, w->format, a, b, w->disputed ? " (+disputed)" : "");
        pass += w->pass, total += w->total, cpass += w->cpass, ctotal += w->ctotal, disp += w->disputed;
    }
    printf("%-52s %-18s %4d/%-4d %4d/%-4d  disputed %d\n", "all", "", pass, total, cpass, ctotal, disp);
    const char *k;
    json_t *v;
    int stale = 0;
    json_object_foreach(known, k, v)
    {
        (void)v;
        if (!json_object_get(seen_known, k) && !filter) stale++;
    }
    json_decref(known);
    json_decref(seen_known);
    json_decref(root);
    if (unexpected) fail_msg("%d cases fail that known_failures.txt does not list", unexpected);
    if (fixed || stale) fail_msg("known_failures.txt lists %d cases that pass and %d that do not exist", fixed,
                                 stale - fixed);
}

/* The deltas of a continued message leave out what repeats the prefill,
 * and only that: a prefill whose tail became a call's opening (not text)
 * does not eat the text the model writes after the call. */
static void test_prefill_skip(void **state)
{
    (void)state;
    eng_pre pre;
    memset(&pre, 0, sizeof pre);
    pre.text[0] = base_alloc(8);
    memcpy(pre.text[0], "Hello, ", 8);
    pre.len[0] = 7;
    const char *d = "Hel";
    size_t n = 3;
    eng_pre_skip(&pre, 0, &d, &n);
    assert_int_equal(n, 0);
    d = "lo, world";
    n = strlen(d);
    eng_pre_skip(&pre, 0, &d, &n);
    assert_int_equal(n, 5);
    assert_memory_equal(d, "world", 5);
    d = "Hello";
    n = 5;
    eng_pre_skip(&pre, 0, &d, &n); /* done: later text is all new */
    assert_int_equal(n, 5);
    eng_pre_free(&pre);
    assert_null(pre.text[0]);

    pre.text[0] = base_alloc(13);
    memcpy(pre.text[0], "<tool_call>{", 13);
    pre.len[0] = 12;
    d = "Done.";
    n = 5;
    eng_pre_skip(&pre, 0, &d, &n);
    assert_int_equal(n, 5);
    eng_pre_skip(&pre, 0, &d, &n);
    assert_int_equal(n, 5);
    eng_pre_free(&pre);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefill_skip),
        cmocka_unit_test(test_llamacpp_cases),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
