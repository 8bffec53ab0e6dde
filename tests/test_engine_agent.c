/*
 * test_engine_agent.c — a coding agent's conversation on a sliding-window
 * model and on a hybrid (Gated DeltaNet + attention) model, through keel.h:
 * a long system prompt with tools, turns that append an answer and a user
 * message, and every other turn a <system-reminder> rewritten inside the
 * FIRST user message (what Claude Code does), so the prompt changes right
 * after the system prompt and tools.
 *
 * On such models a rewind needs a checkpoint at or before the divergence.
 * With a small checkpoint budget (4 per slot), small chunks (each chunk's
 * end is a checkpoint) and periodic checkpoints, the newest checkpoints
 * alone all lie near the prompt's end, and every reminder turn used to
 * reuse nothing. The engine now checkpoints where prompts diverge (the end
 * of the system prompt and tools, the starts of the first and last user
 * messages, the prompt's end) and keeps those over periodic ones:
 *   - every turn reuses at least the system prompt and tools;
 *   - turns that only append reuse the whole previous prompt, and the
 *     same request sent again all but its last token;
 *   - each turn's answer and its log-probabilities are bit-identical to a
 *     fresh engine's (deterministic mode, greedy).
 */
#include "testutil.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char g_resp[1 << 17];

static void gen(const char *arch, int32_t n_layer, int32_t n_swa, uint64_t seed, char *path)
{
    assert_true(test_temp_file(path, 64, arch));
    keel_gen_params gp = keel_gen_params_default();
    gp.arch = arch;
    gp.n_layer = n_layer;
    gp.n_embd = 64;
    gp.n_head = 4;
    gp.n_head_kv = 2;
    gp.n_swa = n_swa;
    gp.seed = seed;
    char err[256];
    if (keel_gen_model(&gp, path, err) != KEEL_OK) fail_msg("gen %s: %s", arch, err);
}

/* ckpt: the checkpoint options (a small budget: 4, every 32 tokens) */
static keel_engine *open_engine(const char *path, const char *ckpt)
{
    char opts[512], err[256] = "";
    snprintf(opts, sizeof opts,
             "{\"model\": \"%s\", \"n_threads\": 2, \"deterministic\": true, \"n_ctx\": 8192, \"n_batch\": 64, "
             "%s, \"chat_template\": \"qwen3\"}",
             path, ckpt ? ckpt : "\"ctx_checkpoints\": 4, \"checkpoint_every\": 32");
    keel_engine *e = NULL;
    keel_status st = keel_engine_open(opts, &e, err);
    if (st != KEEL_OK) fail_msg("open: %s: %s", keel_status_name(st), err);
    return e;
}

static const char *TOOLS =
    "[{\"type\":\"function\",\"function\":{\"name\":\"read_file\",\"description\":\"Read a file of the "
    "repository and return its text\",\"parameters\":{\"type\":\"object\",\"properties\":{\"path\":{\"type\":"
    "\"string\",\"description\":\"path relative to the repository root\"}},\"required\":[\"path\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"run_tests\",\"description\":\"Run the test suite and "
    "report failures\",\"parameters\":{\"type\":\"object\",\"properties\":{\"filter\":{\"type\":\"string\"}}}}}]";

static json_t *system_message(void)
{
    char text[4096];
    size_t n = 0;
    const char *line = "You are a careful coding agent working in a C repository. Read before you write, run the "
                       "tests after each change, and keep every commit small. ";
    while (n + strlen(line) + 1 < 2600) {
        memcpy(text + n, line, strlen(line));
        n += strlen(line);
    }
    text[n] = 0;
    return json_pack("{ss ss}", "role", "system", "content", text);
}

/* The first user message, with the reminder of turn t. */
static json_t *first_user(int t)
{
    char text[512];
    snprintf(text, sizeof text,
             "<system-reminder>todo list: %d items open, item %d in progress</system-reminder>\n"
             "Fix the failing test in the memory module.",
             3 + t, 1 + t);
    return json_pack("{ss ss}", "role", "user", "content", text);
}

static json_t *complete(keel_engine *e, json_t *msgs)
{
    char *m = json_dumps(msgs, JSON_COMPACT);
    assert_non_null(m);
    keel_status st = keel_complete(e, m, "{\"max_tokens\": 3, \"temperature\": 0, \"logprobs\": true}", TOOLS, NULL,
                                   NULL, g_resp, sizeof g_resp);
    free(m);
    if (st != KEEL_OK) fail_msg("keel_complete: %s: %s", keel_status_name(st), keel_engine_last_error(e));
    json_t *r = json_loads(g_resp, JSON_ALLOW_NUL, NULL);
    if (!r) fail_msg("not JSON: %s", g_resp);
    return r;
}

static int64_t usage(json_t *r, const char *k)
{
    return json_integer_value(json_object_get(json_object_get(r, "usage"), k));
}

static void agent(const char *arch, int32_t n_layer, int32_t n_swa, const char *ckpt)
{
    char path[64];
    gen(arch, n_layer, n_swa, 5, path);
    keel_engine *e = open_engine(path, ckpt);
    /* the system prompt and tools alone, rendered without a generation
     * prompt: the prefix every turn must reuse at least */
    keel_engine *f = open_engine(path, ckpt);
    json_t *sys = json_pack("[o]", system_message());
    char *sj = json_dumps(sys, JSON_COMPACT);
    assert_ok(keel_complete(f, sj, "{\"max_tokens\": 0, \"add_generation_prompt\": false}", TOOLS, NULL, NULL, g_resp,
                            sizeof g_resp));
    free(sj);
    json_decref(sys);
    json_t *r0 = json_loads(g_resp, JSON_ALLOW_NUL, NULL);
    int64_t n_sys = usage(r0, "prompt_tokens");
    json_decref(r0);
    keel_engine_close(f);
    assert_true(n_sys > 300);

    json_t *msgs = json_pack("[o o]", system_message(), first_user(0));
    int64_t prev_prompt = 0;
    for (int t = 0; t < 8; t++) {
        bool reminder = t > 0 && t % 2 == 1;
        if (reminder) json_array_set_new(msgs, 1, first_user(t));
        json_t *r = complete(e, msgs);
        f = open_engine(path, ckpt);
        json_t *fr = complete(f, msgs);
        keel_engine_close(f);
        int64_t cached = usage(r, "cached_tokens"), n_prompt = usage(r, "prompt_tokens");
        const char *note = json_string_value(json_object_get(json_object_get(r, "memory"), "cache"));
        printf("%s turn %d%s: %lld prompt tokens, %lld cached (system + tools %lld): %s\n", arch, t,
               reminder ? " (reminder rewritten)" : "", (long long)n_prompt, (long long)cached, (long long)n_sys,
               note ? note : "?");
        if (t > 0) {
            /* the divergence lies inside the first user message at the
             * latest: the system prompt and tools come from the cache */
            if (cached < n_sys - 2) fail_msg("turn %d reused %lld tokens, fewer than the %lld of system + tools", t,
                                             (long long)cached, (long long)n_sys);
            /* a turn that only appends reuses the previous prompt */
            if (!reminder && cached < prev_prompt - 1)
                fail_msg("turn %d appended to the conversation but reused %lld of the previous %lld prompt tokens",
                         t, (long long)cached, (long long)prev_prompt);
        }
        assert_int_equal(usage(fr, "cached_tokens"), 0);
        if (t == 2) { /* the same request again (a client's retry): all but the last token reused */
            json_t *again = complete(e, msgs);
            if (usage(again, "cached_tokens") != n_prompt - 1)
                fail_msg("turn %d sent again reused %lld of %lld tokens", t, (long long)usage(again, "cached_tokens"),
                         (long long)n_prompt);
            json_decref(again);
        }
        /* the same answer with the same log-probabilities as a fresh engine */
        char *a = json_dumps(json_object_get(r, "logprobs"), JSON_COMPACT | JSON_SORT_KEYS);
        char *b = json_dumps(json_object_get(fr, "logprobs"), JSON_COMPACT | JSON_SORT_KEYS);
        assert_non_null(a);
        assert_non_null(b);
        if (strcmp(a, b) != 0) fail_msg("turn %d: answer differs from a fresh engine's:\n%s\n%s", t, a, b);
        free(a);
        free(b);
        prev_prompt = n_prompt;
        /* the answer, then the next user message */
        json_t *content = json_object_get(r, "content");
        json_array_append_new(msgs, json_pack("{ss so}", "role", "assistant", "content",
                                              json_is_string(content) ? json_incref(content) : json_string("")));
        char next[128];
        snprintf(next, sizeof next, "Turn %d: now run the tests again and tell me what failed.", t + 1);
        json_array_append_new(msgs, json_pack("{ss ss}", "role", "user", "content", next));
        json_decref(r);
        json_decref(fr);
    }
    char stats[16384];
    size_t n = 0;
    assert_ok(keel_engine_stats(e, stats, sizeof stats, &n));
    json_t *s = json_loads(stats, 0, NULL);
    json_t *cr = json_object_get(s, "cache_reuse");
    char *crs = json_dumps(cr, JSON_COMPACT);
    printf("%s cache_reuse %s, lost tokens %lld\n", arch, crs ? crs : "?",
           (long long)json_integer_value(json_object_get(s, "cache_lost_tokens")));
    free(crs);
    assert_int_equal(json_integer_value(json_object_get(cr, "reset_no_checkpoint")), 0);
    json_decref(s);
    json_decref(msgs);
    keel_engine_close(e);
    unlink(path);
}

static json_t *stats_of(keel_engine *e)
{
    char buf[16384];
    size_t n = 0;
    assert_ok(keel_engine_stats(e, buf, sizeof buf, &n));
    json_t *s = json_loads(buf, 0, NULL);
    assert_non_null(s);
    return s;
}

static int64_t pc_stat(keel_engine *e, const char *k)
{
    json_t *s = stats_of(e);
    int64_t v = json_integer_value(json_object_get(json_object_get(s, "prompt_cache"), k));
    json_decref(s);
    return v;
}

/* The RAM prompt cache keeps what will be reused: a conversation edited
 * after its system prompt and tools (a rewritten reminder) replaces its own
 * cache instead of saving a copy no prompt would hit; another conversation
 * taking the slot saves it, and it comes back from RAM. */
static void test_prompt_cache_policy(void **state)
{
    (void)state;
    char path[64];
    gen("qwen2", 2, 0, 3, path);
    char opts[512], err[256] = "";
    snprintf(opts, sizeof opts,
             "{\"model\": \"%s\", \"n_threads\": 2, \"n_ctx\": 8192, \"cache_ram_mib\": 64, "
             "\"chat_template\": \"qwen3\"}",
             path);
    keel_engine *e = NULL;
    assert_ok(keel_engine_open(opts, &e, err));
    json_t *a = json_pack("[o o]", system_message(), first_user(0));
    json_decref(complete(e, a));
    json_array_set_new(a, 1, first_user(1)); /* the reminder rewritten */
    json_t *r = complete(e, a);
    int64_t a_prompt = usage(r, "prompt_tokens");
    assert_true(usage(r, "cached_tokens") > 300);
    json_decref(r);
    assert_int_equal(pc_stat(e, "saves"), 0);
    /* another conversation takes the slot: the first one is saved */
    json_t *b = json_pack("[{ss ss} o]", "role", "system", "content", "You translate English into French.",
                          first_user(0));
    json_decref(complete(e, b));
    assert_int_equal(pc_stat(e, "saves"), 1);
    /* and comes back from RAM when it continues */
    json_array_append_new(a, json_pack("{ss ss}", "role", "assistant", "content", "Done."));
    json_array_append_new(a, json_pack("{ss ss}", "role", "user", "content", "Thanks. What next?"));
    r = complete(e, a);
    printf("prompt cache: conversation A back with %lld of %lld tokens cached (its last prompt: %lld)\n",
           (long long)usage(r, "cached_tokens"), (long long)usage(r, "prompt_tokens"), (long long)a_prompt);
    assert_true(usage(r, "cached_tokens") >= a_prompt - 8);
    assert_int_equal(pc_stat(e, "hits"), 1);
    json_decref(r);
    json_decref(a);
    json_decref(b);
    keel_engine_close(e);
    unlink(path);
}

static void test_agent_sliding(void **state)
{
    (void)state;
    agent("gemma2", 2, 16, NULL);
}

static void test_agent_hybrid(void **state)
{
    (void)state;
    agent("qwen35", 4, 0, NULL);
}

/* More checkpoints than the engine lists on its stack (64): every 16
 * tokens of a ~2k-token prompt, 96 kept; the priorities still hold. */
static void test_agent_many_checkpoints(void **state)
{
    (void)state;
    agent("qwen35", 4, 0, "\"ctx_checkpoints\": 96, \"checkpoint_every\": 16");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_agent_sliding),
        cmocka_unit_test(test_agent_hybrid),
        cmocka_unit_test(test_agent_many_checkpoints),
        cmocka_unit_test(test_prompt_cache_policy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
