/*
 * test_server_replay.c — the agentic replay of design.md §1.2 against
 * keel serve: 20 turns of a tool-using agent (a system prompt with tool
 * definitions, a growing history of tool calls and results, a reminder
 * block early in the prompt that changes every turn), each turn a request
 * for the next step and a follow-up once the tool's result is in.
 *
 *   - a generated sliding-window model (gemma2 layout, window 32) with q8_0
 *     K/V, the RAM prompt cache on, through the Anthropic API;
 *   - a generated full-attention model (qwen2), through the OpenAI API;
 *   - the gemma2 fixture (../shared/fixtures) when present, through the
 *     Anthropic API;
 *   - the qwen35 fixture (Gated DeltaNet + attention; reuse through the
 *     recurrent state's checkpoints) when present, through the OpenAI API.
 * Checks: every request succeeds; the follow-ups (whose prefix survives)
 * reuse the cache (cached tokens cover the previous prompt); on the
 * full-attention model every request reuses at least the system prompt
 * (the cache is cut at the changed reminder); the last follow-up's answer
 * (greedy, --deterministic) equals a fresh server's answer to the same
 * request (the resumed state gives the fresh prefill's logits); the
 * server's RSS stays within the printed plan (not under ASan).
 */
#include "testutil.h"
#include "server_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* --ctx-checkpoints (the engine keeps them for recurrent states; a no-op
 * for the attention-only models here). */
#define REPLAY_CHECKPOINTS 1

#define TURNS 20

static const char *SYSTEM = "You are a coding agent. Use the tools to read and edit files. Answer briefly.";

static json_t *tools_openai(void)
{
    return json_pack("[{ss s{ssss s{sss{s{ss}}}}}, {ss s{ssss s{sss{s{ss}s{ss}}}}}, {ss s{ssss s{sss{s{ss}}}}}]",
                     "type", "function", "function", "name", "read_file", "description", "Read a file",
                     "parameters", "type", "object", "properties", "path", "type", "string",
                     "type", "function", "function", "name", "write_file", "description", "Write a file",
                     "parameters", "type", "object", "properties", "path", "type", "string", "text", "type", "string",
                     "type", "function", "function", "name", "run_tests", "description", "Run tests",
                     "parameters", "type", "object", "properties", "filter", "type", "string");
}

/* The Anthropic form of the same tools. */
static json_t *tools_anthropic(void)
{
    json_t *o = tools_openai(), *a = json_array();
    size_t i;
    json_t *t;
    json_array_foreach(o, i, t) {
        json_t *f = json_object_get(t, "function");
        json_array_append_new(a, json_pack("{sOsOsO}", "name", json_object_get(f, "name"), "description",
                                           json_object_get(f, "description"), "input_schema", json_object_get(f, "parameters")));
    }
    json_decref(o);
    return a;
}

typedef struct replay {
    srvt_proc *p;
    bool anthropic;
    json_t *history; /* messages after the first user message (OpenAI or Anthropic form) */
    int64_t prompt_a[TURNS], cached_a[TURNS], prompt_b[TURNS], cached_b[TURNS];
    char last_body[1 << 16];
} replay;

static char *reminder(int turn)
{
    static char buf[256];
    snprintf(buf, sizeof buf,
             "<system-reminder>Turn %d, 10:%02d:%02d, %d files changed.</system-reminder>",
             turn, turn, (turn * 37) % 60, turn % 4);
    return buf;
}

static char *tool_output(int turn)
{
    static char buf[1024];
    int n = snprintf(buf, sizeof buf, "src/file_%d.c:\n", turn);
    for (int i = 0; i < 1 && n < 900; i++)
        n += snprintf(buf + n, sizeof buf - (size_t)n, "int f%d_%d(int x) { return x * %d + %d; }\n", turn, i, i + 1, turn);
    return buf;
}

/* The request of turn t: step 0 asks for the next action, step 1 follows
 * the tool's result. */
static json_t *build(replay *r, int turn, int step, const char *asked_text, int max_tokens)
{
    json_t *msgs = json_array();
    char task[128];
    snprintf(task, sizeof task, "Fix the bug in src/file_0.c.");
    if (r->anthropic) {
        json_array_append_new(msgs, json_pack("{sss[{ssss}{ssss}]}", "role", "user", "content", "type", "text", "text",
                                              reminder(turn), "type", "text", "text", task));
    } else {
        char both[512];
        snprintf(both, sizeof both, "%s\n%s", reminder(turn), task);
        json_array_append_new(msgs, json_pack("{ssss}", "role", "user", "content", both));
    }
    json_array_extend(msgs, r->history);
    char id[32], args[64];
    snprintf(id, sizeof id, r->anthropic ? "toolu_%02d" : "call_%02d", turn);
    snprintf(args, sizeof args, "{\"path\": \"src/file_%d.c\"}", turn);
    if (step == 1) {
        if (r->anthropic) {
            json_t *input = json_loads(args, 0, NULL);
            json_array_append_new(msgs, json_pack("{sss[{ssss}{sssssssO}]}", "role", "assistant", "content", "type", "text",
                                                  "text", asked_text, "type", "tool_use", "id", id, "name", "read_file",
                                                  "input", input));
            json_decref(input);
            json_array_append_new(msgs, json_pack("{sss[{sssssbss}]}", "role", "user", "content", "type", "tool_result",
                                                  "tool_use_id", id, "is_error", turn % 7 == 3, "content", tool_output(turn)));
        } else {
            json_array_append_new(msgs, json_pack("{ssss s[{sssss{ssss}}]}", "role", "assistant", "content", asked_text,
                                                  "tool_calls", "id", id, "type", "function", "function", "name",
                                                  "read_file", "arguments", args));
            json_array_append_new(msgs, json_pack("{ssssss}", "role", "tool", "tool_call_id", id, "content", tool_output(turn)));
        }
    }
    json_t *req;
    if (r->anthropic) {
        json_t *sys = json_pack("[{ssss}]", "type", "text", "text", SYSTEM);
        req = json_pack("{sssisfsososo}", "model", "claude-sonnet-4", "max_tokens", max_tokens, "temperature", 0.0, "system", sys,
                        "tools", tools_anthropic(), "messages", msgs);
    } else {
        json_array_insert_new(msgs, 0, json_pack("{ssss}", "role", "system", "content", SYSTEM));
        req = json_pack("{sisfsoso}", "max_tokens", max_tokens, "temperature", 0.0, "tools", tools_openai(), "messages", msgs);
    }
    return req;
}

/* Sends req; the answer's text and usage. */
static bool send_turn(replay *r, json_t *req, char *text, size_t cap, int64_t *prompt, int64_t *cached)
{
    char *body = json_dumps(req, JSON_COMPACT);
    snprintf(r->last_body, sizeof r->last_body, "%s", body);
    int st;
    json_t *j = srvt_post_json(r->p, r->anthropic ? "/v1/messages" : "/v1/chat/completions", body, &st);
    free(body);
    if (st != 200 || !j) {
        char *e = j ? json_dumps(j, 0) : NULL;
        fprintf(stderr, "replay request: status %d: %s\n", st, e ? e : "");
        free(e);
        if (j) json_decref(j);
        return false;
    }
    text[0] = 0;
    if (r->anthropic) {
        size_t i;
        json_t *b;
        json_array_foreach(json_object_get(j, "content"), i, b)
            if (json_is_string(json_object_get(b, "text"))) snprintf(text, cap, "%s", json_string_value(json_object_get(b, "text")));
        *cached = srvt_int(j, "usage.cache_read_input_tokens");
        *prompt = srvt_int(j, "usage.input_tokens") + *cached;
    } else {
        const char *c = srvt_str(j, "choices.0.message.content");
        snprintf(text, cap, "%s", c ? c : "");
        *prompt = srvt_int(j, "usage.prompt_tokens");
        *cached = srvt_int(j, "usage.prompt_tokens_details.cached_tokens");
    }
    json_decref(j);
    return true;
}

static void run_replay(replay *r, bool full_attention)
{
    r->history = json_array();
    char asked[4096], answer[4096];
    for (int t = 0; t < TURNS; t++) {
        /* one token: the cache then holds exactly this prompt, and the
         * follow-up extends it (a sliding ring cannot be rewound without
         * checkpoints) */
        json_t *a = build(r, t, 0, NULL, 1);
        assert_true(send_turn(r, a, asked, sizeof asked, &r->prompt_a[t], &r->cached_a[t]));
        json_decref(a);
        json_t *b = build(r, t, 1, asked, 8);
        assert_true(send_turn(r, b, answer, sizeof answer, &r->prompt_b[t], &r->cached_b[t]));
        /* the next turn's history: this turn's call, result and answer */
        json_t *msgs = json_object_get(b, "messages");
        size_t n = json_array_size(msgs);
        json_array_append(r->history, json_array_get(msgs, n - 2));
        json_array_append(r->history, json_array_get(msgs, n - 1));
        if (r->anthropic)
            json_array_append_new(r->history, json_pack("{sss[{ssss}]}", "role", "assistant", "content", "type", "text", "text",
                                                        answer[0] ? answer : "Done."));
        else
            json_array_append_new(r->history, json_pack("{ssss}", "role", "assistant", "content", answer[0] ? answer : "Done."));
        json_array_append_new(r->history, r->anthropic
                                              ? json_pack("{sss[{ssss}]}", "role", "user", "content", "type", "text", "text",
                                                          "Next.")
                                              : json_pack("{ssss}", "role", "user", "content", "Next."));
        json_decref(b);
    }
    int reused_b = 0, reused_a = 0;
    for (int t = 0; t < TURNS; t++) {
        printf("  turn %2d: request %5lld prompt / %5lld cached; follow-up %5lld / %5lld\n", t, (long long)r->prompt_a[t],
               (long long)r->cached_a[t], (long long)r->prompt_b[t], (long long)r->cached_b[t]);
        /* the follow-up extends the request's prompt and answer: all of the
         * prompt but its last token comes from the cache */
        if (r->cached_b[t] >= r->prompt_a[t] - 1) reused_b++;
        if (t > 0 && r->cached_a[t] > 0) reused_a++;
    }
    printf("  follow-ups reusing the whole previous prompt: %d of %d; requests reusing a prefix: %d of %d\n", reused_b,
           TURNS, reused_a, TURNS);
    assert_int_equal(reused_b, TURNS);
    if (full_attention) assert_int_equal(reused_a, TURNS - 1); /* the cache is cut at the changed reminder */
    /* prompts grew: the history is really there */
    assert_true(r->prompt_a[TURNS - 1] > r->prompt_a[0] + 30 * (TURNS - 1));
    json_decref(r->history);
}

/* VmRSS of a process in bytes. */
static double rss_of(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    double v = 0;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "VmRSS:", 6) == 0) v = atof(line + 6) * 1024.0;
    if (f) fclose(f);
    return v;
}


/* The body with max_tokens replaced. */
static char *with_max_tokens(const char *body, int n)
{
    json_t *j = json_loads(body, 0, NULL);
    json_object_set_new(j, "max_tokens", json_integer(n));
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    return s;
}

static const char *answer_text(json_t *j, bool anthropic)
{
    const char *t = anthropic ? srvt_str(j, "content.0.text") : srvt_str(j, "choices.0.message.content");
    return t ? t : "";
}

static int64_t cached_of(json_t *j, bool anthropic)
{
    return anthropic ? srvt_int(j, "usage.cache_read_input_tokens") : srvt_int(j, "usage.prompt_tokens_details.cached_tokens");
}

/* One replay on model with extra server flags, the RSS check; then the
 * resumed-vs-fresh comparison on two --deterministic servers. */
static void replay_model(const char *model, bool anthropic, bool full_attention, const char *const *extra)
{
    const char *args[32], *dargs[34];
    int k = 0;
    const char *base[] = {"-np", "2", "-c", "8192", "-t", "2", "--metrics", "--log-disable", NULL};
    for (int i = 0; base[i]; i++) args[k++] = base[i];
    for (int i = 0; extra && extra[i]; i++) args[k++] = extra[i];
    args[k] = NULL;
    for (int i = 0; i <= k; i++) dargs[i] = args[i];
    dargs[k] = "--deterministic";
    dargs[k + 1] = NULL;
    srvt_proc p;
    assert_true(srvt_start(&p, model, args, true));
    static replay r;
    memset(&r, 0, sizeof r);
    r.p = &p;
    r.anthropic = anthropic;
    run_replay(&r, full_attention);
    double total = srvt_wait_metric(&p, "keel_requests_total", 2 * TURNS, 5 * srvt_slow());
    double failed = srvt_metric(&p, "keel_requests_failed_total");
    assert_int_equal(failed, 0);
    assert_int_equal(total, 2 * TURNS);
    printf("  prompt cache: %.0f entries, %.0f hits, %.0f hit tokens\n", srvt_metric(&p, "keel_prompt_cache_entries"),
           srvt_metric(&p, "keel_prompt_cache_hits"), srvt_metric(&p, "keel_prompt_cache_hit_tokens"));
    double rss = rss_of(p.pid), plan = srvt_metric(&p, "keel_plan_total_bytes");
    printf("  RSS %.1f MiB, plan %.1f MiB\n", rss / 1048576.0, plan / 1048576.0);
    assert_true(plan > 0);
    /* the plan bounds what the engine allocates; allow the process's own
     * baseline (libraries, stacks, the HTTP side's heap) */
    if (!getenv("KEEL_ASAN")) assert_true(rss <= plan + 48.0 * 1048576.0);
    assert_int_equal(srvt_stop(&p, 10 * srvt_slow()), 0);
    /* the last follow-up resumed from a cache that holds its prompt, against
     * a fresh server: the same greedy answer */
    char *prime = with_max_tokens(r.last_body, 1), *ask = with_max_tokens(r.last_body, 8);
    const char *path = anthropic ? "/v1/messages" : "/v1/chat/completions";
    int st;
    assert_true(srvt_start(&p, model, dargs, true));
    json_t *j = srvt_post_json(&p, path, prime, &st);
    assert_int_equal(st, 200);
    json_decref(j);
    json_t *resumed = srvt_post_json(&p, path, ask, &st);
    assert_int_equal(st, 200);
    assert_int_equal(srvt_stop(&p, 10 * srvt_slow()), 0);
    assert_true(srvt_start(&p, model, dargs, true));
    json_t *fresh = srvt_post_json(&p, path, ask, &st);
    assert_int_equal(st, 200);
    assert_int_equal(srvt_stop(&p, 10 * srvt_slow()), 0);
    /* the texts as JSON strings: model noise can hold control characters */
    json_t *rt = json_string(answer_text(resumed, anthropic)), *ft = json_string(answer_text(fresh, anthropic));
    char *rs = rt ? json_dumps(rt, JSON_ENCODE_ANY) : NULL, *fs = ft ? json_dumps(ft, JSON_ENCODE_ANY) : NULL;
    printf("  resumed (%lld cached): %s\n  fresh   (%lld cached): %s\n", (long long)cached_of(resumed, anthropic),
           rs ? rs : "?", (long long)cached_of(fresh, anthropic), fs ? fs : "?");
    free(rs);
    free(fs);
    if (rt) json_decref(rt);
    if (ft) json_decref(ft);
    assert_true(cached_of(resumed, anthropic) > 0);
    assert_int_equal(cached_of(fresh, anthropic), 0);
    assert_string_equal(answer_text(resumed, anthropic), answer_text(fresh, anthropic));
    json_decref(resumed);
    json_decref(fresh);
    free(prime);
    free(ask);
}

static void test_replay_swa_q8(void **state)
{
    (void)state;
    char model[64];
    assert_true(srvt_gen_model(model, sizeof model, "gemma2", 128, 2, 32, 3));
    printf("generated gemma2 (sliding window 32), q8_0 K/V, prompt cache on, Anthropic API:\n");
    const char *extra[] = {"-ctk", "q8_0", "-ctv", "q8_0", "--cache-ram", "64",
#if REPLAY_CHECKPOINTS
                           "--ctx-checkpoints", "8",
#endif
                           NULL};
    replay_model(model, true, false, extra);
    unlink(model);
}

static void test_replay_full_attention(void **state)
{
    (void)state;
    char model[64];
    assert_true(srvt_gen_model(model, sizeof model, "qwen2", 64, 2, 0, 5));
    printf("generated qwen2 (full attention), f16 K/V, OpenAI API:\n");
    const char *extra[] = {"--cache-ram", "64", NULL};
    replay_model(model, false, true, extra);
    unlink(model);
}

static void test_replay_gemma2_fixture(void **state)
{
    (void)state;
    const char *model = test_fixture("models/gemma2.gguf");
    if (!model) {
        printf("gemma2 fixture absent: skipped\n");
        return;
    }
    char path[512];
    snprintf(path, sizeof path, "%s", model);
    printf("gemma2 fixture, q8_0 K/V, prompt cache on, Anthropic API:\n");
    const char *extra[] = {"-ctk", "q8_0", "-ctv", "q8_0", "--cache-ram", "64", NULL};
    replay_model(path, true, false, extra);
}

/* A hybrid model (Gated DeltaNet + attention): reuse goes through the
 * recurrent state's checkpoints. */
static void test_replay_qwen35_fixture(void **state)
{
    (void)state;
    const char *model = test_fixture("models/qwen35.gguf");
    if (!model) {
        printf("qwen35 fixture absent: skipped\n");
        return;
    }
    char path[512];
    snprintf(path, sizeof path, "%s", model);
    printf("qwen35 fixture (recurrent + attention), checkpoints every 64 prompt tokens, OpenAI API:\n");
    const char *extra[] = {"--cache-ram", "64", "--ctx-checkpoints", "8", "--checkpoint-every", "64", NULL};
    replay_model(path, false, false, extra);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_replay_swa_q8),
        cmocka_unit_test(test_replay_full_attention),
        cmocka_unit_test(test_replay_gemma2_fixture),
        cmocka_unit_test(test_replay_qwen35_fixture),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
