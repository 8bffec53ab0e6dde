/*
 * test_engine.c — the chat engine (keel_engine, keel_complete) on generated
 * models: two turns reuse the cached prefix and give the logits of a fresh
 * prefill; cancel from another thread; a callback that stops; compaction
 * switched on and off between turns; stop strings; raw prompts; bad
 * requests refused with named errors; submit + run on a scheduler thread
 * with several slots.
 */
#include "testutil.h"
#include "engine/eng.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char g_model[64];

static int setup(void **state)
{
    (void)state;
    if (!test_temp_file(g_model, sizeof g_model, "engine")) return -1;
    keel_gen_params gp = keel_gen_params_default();
    gp.arch = "qwen2"; /* BPE vocabulary with <|im_start|> / <|im_end|> */
    gp.n_layer = 2;
    gp.n_embd = 64;
    gp.n_head = 4;
    gp.n_head_kv = 2;
    gp.seed = 7;
    char err[256];
    return keel_gen_model(&gp, g_model, err) == KEEL_OK ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    unlink(g_model);
    return 0;
}

static keel_engine *open_engine(const char *extra)
{
    char opts[1024], err[256] = "";
    snprintf(opts, sizeof opts, "{\"model\": \"%s\", \"n_threads\": 2, \"type_k\": \"f32\", \"type_v\": \"f32\"%s%s}",
             g_model, extra ? ", " : "", extra ? extra : "");
    keel_engine *e = NULL;
    keel_status st = keel_engine_open(opts, &e, err);
    if (st != KEEL_OK) fail_msg("engine open: %s: %s", keel_status_name(st), err);
    return e;
}

static json_t *parse(const char *s)
{
    json_t *j = json_loads(s, JSON_ALLOW_NUL, NULL);
    if (!j) fail_msg("response is not JSON: %s", s);
    return j;
}

static int64_t usage(json_t *r, const char *k)
{
    return json_integer_value(json_object_get(json_object_get(r, "usage"), k));
}

static const char *MSG1 = "[{\"role\":\"system\",\"content\":\"You are a helpful assistant.\"},"
                          "{\"role\":\"user\",\"content\":\"The little dog ran to the park and\"}]";
static const char *MSG2 = "[{\"role\":\"system\",\"content\":\"You are a helpful assistant.\"},"
                          "{\"role\":\"user\",\"content\":\"The little dog ran to the park and\"},"
                          "{\"role\":\"assistant\",\"content\":\"it was happy.\"},"
                          "{\"role\":\"user\",\"content\":\"What did the dog see there?\"}]";

typedef struct logit_cap {
    float *row;
    int32_t n;
} logit_cap;

static void cap_logits(void *user, uint64_t req, const float *logits, int32_t n)
{
    (void)req;
    logit_cap *c = user;
    free(c->row);
    c->row = malloc((size_t)n * sizeof(float));
    memcpy(c->row, logits, (size_t)n * sizeof(float));
    c->n = n;
}

static char g_resp[1 << 16];

/* Turn 2 reuses turn 1's prompt tokens and its logits equal a fresh
 * engine's prefill of the whole prompt. */
static void test_two_turns_reuse(void **state)
{
    (void)state;
    keel_engine *e = open_engine(NULL);
    logit_cap cached = {NULL, 0}, fresh = {NULL, 0};
    e->debug_logits = cap_logits;
    e->debug_user = &cached;
    assert_ok(keel_complete(e, MSG1, "{\"max_tokens\": 8, \"temperature\": 0}", NULL, NULL, NULL, g_resp,
                            sizeof g_resp));
    json_t *r1 = parse(g_resp);
    assert_int_equal(usage(r1, "cached_tokens"), 0);
    assert_int_equal(usage(r1, "completion_tokens"), 8);
    assert_string_equal(json_string_value(json_object_get(r1, "finish_reason")), "length");
    assert_ok(keel_complete(e, MSG2, "{\"max_tokens\": 16, \"temperature\": 0}", NULL, NULL, NULL, g_resp,
                            sizeof g_resp));
    json_t *r2 = parse(g_resp);
    int64_t p1 = usage(r1, "prompt_tokens"), c2 = usage(r2, "cached_tokens");
    printf("turn 1: %lld prompt tokens; turn 2: %lld prompt, %lld cached\n", (long long)p1,
           (long long)usage(r2, "prompt_tokens"), (long long)c2);
    assert_true(c2 > 0);
    assert_true(c2 >= p1 - 8); /* everything up to turn 1's generation prompt */
    assert_string_equal(json_string_value(json_object_get(json_object_get(r2, "memory"), "cache")), "reused");
    keel_engine *f = open_engine(NULL);
    f->debug_logits = cap_logits;
    f->debug_user = &fresh;
    assert_ok(keel_complete(f, MSG2, "{\"max_tokens\": 16, \"temperature\": 0}", NULL, NULL, NULL, g_resp,
                            sizeof g_resp));
    json_t *r3 = parse(g_resp);
    assert_int_equal(usage(r3, "cached_tokens"), 0);
    assert_int_equal(cached.n, fresh.n);
    double md = 0;
    for (int32_t i = 0; i < cached.n; i++) md = fmax(md, fabs((double)cached.row[i] - fresh.row[i]));
    printf("turn 2 logits vs a fresh prefill: max |diff| %.3g\n", md);
    assert_true(md < 1e-4); /* the prefill split differently: float rounding of other batch sizes */
    /* in deterministic mode the split does not matter: bit-identical */
    keel_engine *d1 = open_engine("\"deterministic\": true"), *d2 = open_engine("\"deterministic\": true");
    logit_cap dc1 = {NULL, 0}, dc2 = {NULL, 0};
    assert_ok(keel_complete(d1, MSG1, "{\"max_tokens\": 8, \"temperature\": 0}", NULL, NULL, NULL, g_resp, sizeof g_resp));
    d1->debug_logits = cap_logits;
    d1->debug_user = &dc1;
    assert_ok(keel_complete(d1, MSG2, "{\"max_tokens\": 4, \"temperature\": 0}", NULL, NULL, NULL, g_resp, sizeof g_resp));
    json_t *rd = parse(g_resp);
    assert_true(usage(rd, "cached_tokens") > 0);
    json_decref(rd);
    d2->debug_logits = cap_logits;
    d2->debug_user = &dc2;
    assert_ok(keel_complete(d2, MSG2, "{\"max_tokens\": 4, \"temperature\": 0}", NULL, NULL, NULL, g_resp, sizeof g_resp));
    assert_int_equal(dc1.n, dc2.n);
    assert_memory_equal(dc1.row, dc2.row, (size_t)dc1.n * sizeof(float));
    free(dc1.row);
    free(dc2.row);
    keel_engine_close(d1);
    keel_engine_close(d2);
    assert_string_equal(json_string_value(json_object_get(r2, "content")),
                        json_string_value(json_object_get(r3, "content")));
    json_decref(r1);
    json_decref(r2);
    json_decref(r3);
    free(cached.row);
    free(fresh.row);
    keel_engine_close(f);
    keel_engine_close(e);
}

/* A small generated model of arch (4 heads, 2 KV heads, embd 64) at a
 * temporary path (path: 64 bytes); the caller unlinks it. */
static void gen_small(const char *arch, int32_t n_layer, int32_t n_swa, uint64_t seed, char *path)
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

/* A hybrid model (Gated DeltaNet + attention): turn 2 resumes the state
 * from the checkpoint at the end of turn 1's prompt, the same prompt sent
 * again from the one a token before its end; the logits are bit-identical
 * to a fresh engine's (deterministic mode). */
static void test_recurrent_reuse(void **state)
{
    (void)state;
    char path[64];
    gen_small("qwen35", 4, 0, 9, path);
    char err[256], opts[512];
    snprintf(opts, sizeof opts, "{\"model\": \"%s\", \"n_threads\": 2, \"deterministic\": true, \"n_batch\": 16}", path);
    keel_engine *e = NULL, *f = NULL;
    assert_ok(keel_engine_open(opts, &e, err));
    assert_ok(keel_engine_open(opts, &f, err));
    logit_cap a = {NULL, 0}, b = {NULL, 0};
    const char *o1 = "{\"max_tokens\": 6, \"temperature\": 0}";
    assert_ok(keel_complete(e, MSG1, o1, NULL, NULL, NULL, g_resp, sizeof g_resp));
    json_t *r1 = parse(g_resp);
    e->debug_logits = cap_logits;
    e->debug_user = &a;
    assert_ok(keel_complete(e, MSG2, o1, NULL, NULL, NULL, g_resp, sizeof g_resp));
    json_t *r2 = parse(g_resp);
    int64_t p1 = usage(r1, "prompt_tokens"), c2 = usage(r2, "cached_tokens");
    printf("hybrid: turn 1 %lld prompt tokens; turn 2 %lld prompt, %lld cached (%s)\n", (long long)p1,
           (long long)usage(r2, "prompt_tokens"), (long long)c2,
           json_string_value(json_object_get(json_object_get(r2, "memory"), "cache")));
    assert_true(c2 >= p1 - 1 && c2 < usage(r2, "prompt_tokens")); /* from the checkpoint at turn 1's prompt end */
    f->debug_logits = cap_logits;
    f->debug_user = &b;
    assert_ok(keel_complete(f, MSG2, o1, NULL, NULL, NULL, g_resp, sizeof g_resp));
    json_t *r3 = parse(g_resp);
    assert_int_equal(usage(r3, "cached_tokens"), 0);
    assert_int_equal(a.n, b.n);
    assert_memory_equal(a.row, b.row, (size_t)a.n * sizeof(float));
    assert_string_equal(json_string_value(json_object_get(r2, "content")), json_string_value(json_object_get(r3, "content")));
    /* the same prompt again: everything but its last token is reused */
    assert_ok(keel_complete(e, MSG2, o1, NULL, NULL, NULL, g_resp, sizeof g_resp));
    json_t *r4 = parse(g_resp);
    assert_int_equal(usage(r4, "cached_tokens"), usage(r4, "prompt_tokens") - 1);
    assert_memory_equal(a.row, b.row, (size_t)a.n * sizeof(float)); /* a: the resent prompt's logits */
    assert_string_equal(json_string_value(json_object_get(r4, "content")), json_string_value(json_object_get(r3, "content")));
    json_decref(r1);
    json_decref(r2);
    json_decref(r3);
    json_decref(r4);
    free(a.row);
    free(b.row);
    keel_engine_close(e);
    keel_engine_close(f);
    unlink(path);
}

/* A sliding-window model (gemma2, window 8): turn 1 generates past the
 * window, so turn 2's divergence lies where the rings no longer hold the
 * tokens it needs. With ring checkpoints the cache resumes from the newest
 * one at or before the divergence, bit-identical to a fresh engine
 * (deterministic mode); without them the cache is reset, named. */
static void test_swa_checkpoint_reuse(void **state)
{
    (void)state;
    char path[64];
    gen_small("gemma2", 2, 8, 11, path);
    char err[256], opts[512], opts0[512];
    const char *base = "{\"model\": \"%s\", \"n_threads\": 2, \"deterministic\": true, \"n_batch\": 16%s}";
    snprintf(opts, sizeof opts, base, path, ", \"ctx_checkpoints\": 8, \"checkpoint_every\": 4");
    snprintf(opts0, sizeof opts0, base, path, ", \"ctx_checkpoints\": 0");
    keel_engine *e = NULL, *f = NULL, *z = NULL;
    assert_ok(keel_engine_open(opts, &e, err));
    assert_ok(keel_engine_open(opts, &f, err));
    assert_ok(keel_engine_open(opts0, &z, err));
    logit_cap a = {NULL, 0}, b = {NULL, 0};
    const char *o1 = "{\"max_tokens\": 24, \"temperature\": 0, \"ignore_eos\": true}";
    const char *o2 = "{\"max_tokens\": 4, \"temperature\": 0}";
    assert_ok(keel_complete(e, MSG1, o1, NULL, NULL, NULL, g_resp, sizeof g_resp));
    json_t *r1 = parse(g_resp);
    assert_int_equal(usage(r1, "completion_tokens"), 24);
    e->debug_logits = cap_logits;
    e->debug_user = &a;
    assert_ok(keel_complete(e, MSG2, o2, NULL, NULL, NULL, g_resp, sizeof g_resp));
    json_t *r2 = parse(g_resp);
    int64_t p1 = usage(r1, "prompt_tokens"), c2 = usage(r2, "cached_tokens");
    printf("swa: turn 1 %lld prompt + 24 generated; turn 2 %lld prompt, %lld cached (%s)\n", (long long)p1,
           (long long)usage(r2, "prompt_tokens"), (long long)c2,
           json_string_value(json_object_get(json_object_get(r2, "memory"), "cache")));
    assert_true(c2 > 0 && c2 <= p1 + 24);
    assert_string_equal(json_string_value(json_object_get(json_object_get(r2, "memory"), "cache")), "reused");
    f->debug_logits = cap_logits;
    f->debug_user = &b;
    assert_ok(keel_complete(f, MSG2, o2, NULL, NULL, NULL, g_resp, sizeof g_resp));
    json_t *r3 = parse(g_resp);
    assert_int_equal(usage(r3, "cached_tokens"), 0);
    assert_int_equal(a.n, b.n);
    assert_memory_equal(a.row, b.row, (size_t)a.n * sizeof(float));
    assert_string_equal(json_string_value(json_object_get(r2, "content")), json_string_value(json_object_get(r3, "content")));
    /* no checkpoints: the same turns reset the cache and say why */
    assert_ok(keel_complete(z, MSG1, o1, NULL, NULL, NULL, g_resp, sizeof g_resp));
    json_t *z1 = parse(g_resp);
    assert_ok(keel_complete(z, MSG2, o2, NULL, NULL, NULL, g_resp, sizeof g_resp));
    json_t *z2 = parse(g_resp);
    const char *note = json_string_value(json_object_get(json_object_get(z2, "memory"), "cache"));
    printf("swa without checkpoints: %lld cached (%s)\n", (long long)usage(z2, "cached_tokens"), note);
    assert_int_equal(usage(z2, "cached_tokens"), 0);
    assert_true(note && strncmp(note, "reset", 5) == 0);
    assert_string_equal(json_string_value(json_object_get(z2, "content")), json_string_value(json_object_get(r3, "content")));
    json_decref(r1);
    json_decref(r2);
    json_decref(r3);
    json_decref(z1);
    json_decref(z2);
    free(a.row);
    free(b.row);
    keel_engine_close(e);
    keel_engine_close(f);
    keel_engine_close(z);
    unlink(path);
}

/* tool_choice on a Hermes-format template (qwen3's): a named tool or
 * "required" opens the call in the prompt, so even an untrained model's
 * answer is a call (to that tool, when named); "none" renders and parses no
 * tools; naming a tool that is not there is refused. */
static void test_tool_choice_forced(void **state)
{
    (void)state;
    keel_engine *e = open_engine("\"chat_template\": \"qwen3\"");
    const char *tools = "[{\"type\":\"function\",\"function\":{\"name\":\"read_file\",\"parameters\":{\"type\":"
                        "\"object\",\"properties\":{\"path\":{\"type\":\"string\"}}}}},{\"type\":\"function\","
                        "\"function\":{\"name\":\"run_tests\",\"parameters\":{\"type\":\"object\"}}}]";
    /* strict_tools false: the forced opening alone (the tool grammar of a forced call is
     * tested in test_server_toolgrammar) */
    const char *named = "{\"max_tokens\": 12, \"temperature\": 0, \"strict_tools\": false, \"tool_choice\": {\"type\": \"function\", "
                        "\"function\": {\"name\": \"run_tests\"}}}";
    assert_ok(keel_complete(e, MSG1, named, tools, NULL, NULL, g_resp, sizeof g_resp));
    json_t *r = parse(g_resp);
    json_t *calls = json_object_get(r, "tool_calls");
    printf("named: %s\n", g_resp);
    assert_true(json_array_size(calls) >= 1);
    assert_string_equal(json_string_value(json_object_get(json_object_get(json_array_get(calls, 0), "function"), "name")),
                        "run_tests");
    assert_string_equal(json_string_value(json_object_get(r, "finish_reason")), "tool_calls");
    json_decref(r);
    /* required: the model writes the name itself (whatever an untrained model writes) */
    const char *req = "{\"max_tokens\": 12, \"temperature\": 0, \"tool_choice\": \"required\"}";
    assert_ok(keel_complete(e, MSG1, req, tools, NULL, NULL, g_resp, sizeof g_resp));
    r = parse(g_resp);
    printf("required: %s\n", g_resp);
    /* a call, or (a name the untrained model never closed) the cut-off call
     * given back as text: either way the answer opened with the call */
    const char *content = json_string_value(json_object_get(r, "content"));
    assert_true(json_array_size(json_object_get(r, "tool_calls")) >= 1 ||
                (content && strncmp(content, "<tool_call>\n{\"name\": \"", 21) == 0));
    json_decref(r);
    /* auto and none: no call opened (an untrained model writes no call markup) */
    const char *none = "{\"max_tokens\": 12, \"temperature\": 0, \"tool_choice\": \"none\"}";
    assert_ok(keel_complete(e, MSG1, none, tools, NULL, NULL, g_resp, sizeof g_resp));
    r = parse(g_resp);
    assert_int_equal(json_array_size(json_object_get(r, "tool_calls")), 0);
    json_decref(r);
    /* refused: a name not among the tools, a bad value, required without tools */
    const char *bad[3] = {"{\"tool_choice\": {\"name\": \"rm_rf\"}}", "{\"tool_choice\": \"always\"}",
                          "{\"tool_choice\": \"required\"}"};
    const char *bad_tools[3] = {tools, tools, NULL};
    for (int i = 0; i < 3; i++) {
        keel_status st = keel_complete(e, MSG1, bad[i], bad_tools[i], NULL, NULL, g_resp, sizeof g_resp);
        printf("refused: %s: %s\n", keel_status_name(st), keel_engine_last_error(e));
        assert_int_equal(st, KEEL_EINVAL);
        assert_non_null(strstr(keel_engine_last_error(e), "tool_choice"));
    }
    keel_engine_close(e);
}

/* logprobs: one entry per generated token; greedy picks the most likely
 * token, so each entry's token and logprob are its first top entry; the
 * first equals a log-softmax of the logits computed here; top entries
 * descend and their probabilities sum to at most 1. */
/* LOGPROB events: each entry's JSON (checked against its token and
 * logprob members), in order. */
static bool lp_events(void *user, const keel_event *ev)
{
    json_t *arr = user;
    if (ev->kind != KEEL_EVENT_LOGPROB) return true;
    json_t *x = json_loadb(ev->text, ev->len, JSON_ALLOW_NUL, NULL);
    assert_non_null(x);
    assert_true(fabs(json_real_value(json_object_get(x, "logprob")) - ev->logprob) < 1e-6);
    assert_true(ev->token >= 0);
    json_array_append_new(arr, x);
    return true;
}

static void test_logprobs(void **state)
{
    (void)state;
    keel_engine *e = open_engine(NULL);
    logit_cap first = {NULL, 0};
    e->debug_logits = cap_logits;
    e->debug_user = &first;
    json_t *streamed = json_array();
    assert_ok(keel_complete(e, MSG1,
                            "{\"max_tokens\": 6, \"temperature\": 0, \"logprobs\": true, \"top_logprobs\": 3}",
                            NULL, lp_events, streamed, g_resp, sizeof g_resp));
    json_t *r = parse(g_resp);
    json_t *lp = json_object_get(json_object_get(r, "logprobs"), "content");
    /* streamed per token (issue 25: they came only with the response):
     * the events' entries are the response's */
    assert_true(json_equal(streamed, lp));
    json_decref(streamed);
    /* an end-of-generation token ends the answer and is not listed */
    bool eog = strcmp(json_string_value(json_object_get(r, "finish_reason")), "stop") == 0;
    size_t n_lp = json_array_size(lp);
    assert_int_equal(n_lp, usage(r, "completion_tokens") - eog);
    assert_true(n_lp >= 1);
    double m = -INFINITY, s = 0.0;
    for (int32_t i = 0; i < first.n; i++) m = fmax(m, first.row[i]);
    for (int32_t i = 0; i < first.n; i++) s += exp((double)first.row[i] - m);
    for (size_t i = 0; i < n_lp; i++) {
        json_t *x = json_array_get(lp, i), *top = json_object_get(x, "top_logprobs");
        double v = json_real_value(json_object_get(x, "logprob"));
        assert_true(v <= 0.0);
        assert_int_equal(json_array_size(top), 3);
        assert_string_equal(json_string_value(json_object_get(x, "token")),
                            json_string_value(json_object_get(json_array_get(top, 0), "token")));
        assert_true(fabs(v - json_real_value(json_object_get(json_array_get(top, 0), "logprob"))) < 1e-6);
        double p = 0.0, prev = 0.0;
        for (size_t j = 0; j < 3; j++) {
            double t = json_real_value(json_object_get(json_array_get(top, j), "logprob"));
            if (j) assert_true(t <= prev);
            prev = t;
            p += exp(t);
        }
        assert_true(p <= 1.0 + 1e-6);
        assert_true(json_array_size(json_object_get(x, "bytes")) > 0 || json_string_length(json_object_get(x, "token")) == 0);
        if (i == 0) { /* the first step's logits, recomputed */
            float mx = first.row[0];
            for (int32_t k = 1; k < first.n; k++) mx = fmaxf(mx, first.row[k]);
            double want = (double)mx - m - log(s);
            printf("logprobs: first token %g (recomputed %g)\n", v, want);
            assert_true(fabs(v - want) < 1e-5);
        }
    }
    json_decref(r);
    e->debug_logits = NULL;
    free(first.row);
    /* without the option: no logprobs; top_logprobs alone or out of range: refused */
    assert_ok(keel_complete(e, MSG1, "{\"max_tokens\": 2}", NULL, NULL, NULL, g_resp, sizeof g_resp));
    r = parse(g_resp);
    assert_null(json_object_get(r, "logprobs"));
    json_decref(r);
    assert_status(keel_complete(e, MSG1, "{\"top_logprobs\": 2}", NULL, NULL, NULL, g_resp, sizeof g_resp), KEEL_EINVAL);
    assert_non_null(strstr(keel_engine_last_error(e), "top_logprobs needs logprobs"));
    assert_status(keel_complete(e, MSG1, "{\"logprobs\": true, \"top_logprobs\": 21}", NULL, NULL, NULL, g_resp,
                                sizeof g_resp), KEEL_EINVAL);
    keel_engine_close(e);
}

/* logit_bias (issue 25: it was ignored): -100 bans a token (its logit is
 * -inf in the row the sampler sees, greedy takes the next best), +100 makes
 * greedy pick it every time, and logprobs stay the model's (unbiased);
 * malformed ids and values are refused, named. */
static int32_t row_argmax(const logit_cap *c)
{
    int32_t best = 0;
    for (int32_t i = 1; i < c->n; i++)
        if (c->row[i] > c->row[best]) best = i;
    return best;
}

static void test_logit_bias(void **state)
{
    (void)state;
    keel_engine *e = open_engine(NULL);
    logit_cap plain = {NULL, 0}, banned = {NULL, 0};
    e->debug_logits = cap_logits;
    e->debug_user = &plain;
    const char *base = "\"max_tokens\": 6, \"temperature\": 0, \"ignore_eos\": true, \"logprobs\": true";
    char opts[512];
    snprintf(opts, sizeof opts, "{%s}", base);
    assert_ok(keel_complete(e, MSG1, opts, NULL, NULL, NULL, g_resp, sizeof g_resp));
    json_t *r0 = parse(g_resp);
    json_t *lp0 = json_object_get(json_object_get(r0, "logprobs"), "content");
    int32_t t0 = row_argmax(&plain), n_vocab = plain.n;
    /* banned: another first token, the row holds -inf there */
    e->debug_user = &banned;
    snprintf(opts, sizeof opts, "{%s, \"logit_bias\": {\"%d\": -100}}", base, t0);
    assert_ok(keel_complete(e, MSG1, opts, NULL, NULL, NULL, g_resp, sizeof g_resp));
    json_t *r1 = parse(g_resp);
    json_t *lp1 = json_object_get(json_object_get(r1, "logprobs"), "content");
    assert_true(isinf(banned.row[t0]) && banned.row[t0] < 0);
    int32_t t1 = row_argmax(&banned);
    assert_int_not_equal(t1, t0);
    assert_true(fabs((double)banned.row[t1] - plain.row[t1]) < 1e-3); /* unbiased (the cached prefix may round differently) */
    double v0 = json_real_value(json_object_get(json_array_get(lp0, 0), "logprob"));
    double v1 = json_real_value(json_object_get(json_array_get(lp1, 0), "logprob"));
    assert_true(v1 <= v0 + 1e-3);
    printf("logit_bias: first token %d banned -> %d (logprob %g, was %g)\n", t0, t1, v1, v0);
    /* +100 on a token that greedy would not pick: every token is it; each
     * logprob is the model's (far below 0), not the biased ~0 */
    int32_t x = (t0 + 97) % n_vocab;
    if (x == t0) x = (x + 1) % n_vocab;
    snprintf(opts, sizeof opts, "{%s, \"logit_bias\": {\"%d\": 100, \"%d\": 0.5}}", base, x, t0);
    assert_ok(keel_complete(e, MSG1, opts, NULL, NULL, NULL, g_resp, sizeof g_resp));
    assert_int_equal(row_argmax(&banned), x);
    json_t *r2 = parse(g_resp);
    json_t *lp2 = json_object_get(json_object_get(r2, "logprobs"), "content");
    assert_int_equal(json_array_size(lp2), 6);
    for (size_t i = 0; i < 6; i++) {
        json_t *a = json_array_get(lp2, i);
        assert_string_equal(json_string_value(json_object_get(a, "token")),
                            json_string_value(json_object_get(json_array_get(lp2, 0), "token")));
        assert_true(json_real_value(json_object_get(a, "logprob")) < -0.5);
    }
    if (json_real_value(json_object_get(json_array_get(lp2, 0), "logprob")) > -0.5) fail_msg("biased logprob");
    json_decref(r0);
    json_decref(r1);
    json_decref(r2);
    e->debug_logits = NULL;
    free(plain.row);
    free(banned.row);
    /* refused, named */
    const char *bad[] = {"{\"logit_bias\": {\"abc\": 1}}", "{\"logit_bias\": {\"5\": 101}}",
                         "{\"logit_bias\": {\"99999\": 1}}", "{\"logit_bias\": {\"-1\": 1}}",
                         "{\"logit_bias\": {\"05\": 1}}", "{\"logit_bias\": {\"5\": \"x\"}}",
                         "{\"logit_bias\": [1, 2]}"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        assert_status(keel_complete(e, MSG1, bad[i], NULL, NULL, NULL, g_resp, sizeof g_resp), KEEL_EINVAL);
        assert_non_null(strstr(keel_engine_last_error(e), "logit_bias"));
    }
    keel_engine_close(e);
}

typedef struct done_probe {
    keel_engine *e;
    int64_t requests, completion;
} done_probe;

static bool stats_at_done(void *user, const keel_event *ev)
{
    done_probe *d = user;
    if (ev->kind != KEEL_EVENT_DONE) return true;
    char buf[1 << 14];
    size_t n = 0;
    assert_ok(keel_engine_stats(d->e, buf, sizeof buf, &n));
    json_t *j = parse(buf);
    d->requests = json_integer_value(json_object_get(j, "requests"));
    d->completion = json_integer_value(json_object_get(j, "completion_tokens"));
    json_decref(j);
    return true;
}

/* The stats count a request before its DONE event (a client reading
 * /metrics right after its response sees it). */
static void test_stats_before_done(void **state)
{
    (void)state;
    keel_engine *e = open_engine(NULL);
    done_probe d = {e, -1, -1};
    for (int t = 1; t <= 2; t++) {
        assert_ok(keel_complete(e, MSG1, "{\"max_tokens\": 5, \"temperature\": 0, \"ignore_eos\": true}", NULL,
                                stats_at_done, &d, g_resp, sizeof g_resp));
        assert_int_equal(d.requests, t);
        assert_int_equal(d.completion, 5 * t);
    }
    /* a refused request is counted before its DONE too */
    assert_status(keel_complete(e, MSG1, "{\"tool_choice\": \"required\"}", NULL, stats_at_done, &d, g_resp,
                                sizeof g_resp), KEEL_EINVAL);
    assert_int_equal(d.requests, 3);
    keel_engine_close(e);
}

typedef struct counter {
    int content, stop_after;
    size_t bytes;
} counter;

static bool count_cb(void *user, const keel_event *ev)
{
    counter *c = user;
    if (ev->kind == KEEL_EVENT_CONTENT || ev->kind == KEEL_EVENT_REASONING) {
        c->content++;
        c->bytes += ev->len;
    }
    return !(c->stop_after && c->content >= c->stop_after);
}

static void test_callback_stops(void **state)
{
    (void)state;
    keel_engine *e = open_engine(NULL);
    counter c = {0, 5, 0};
    keel_status st = keel_complete(e, MSG1, "{\"max_tokens\": 200, \"temperature\": 0}", NULL, count_cb, &c,
                                   g_resp, sizeof g_resp);
    assert_status(st, KEEL_ECANCELED);
    json_t *r = parse(g_resp);
    assert_string_equal(json_string_value(json_object_get(r, "finish_reason")), "cancelled");
    assert_true(usage(r, "completion_tokens") < 200);
    assert_int_equal(c.content, 5);
    json_decref(r);
    /* the engine is usable afterwards */
    assert_ok(keel_complete(e, MSG1, "{\"max_tokens\": 4, \"temperature\": 0}", NULL, NULL, NULL, g_resp,
                            sizeof g_resp));
    keel_engine_close(e);
}

typedef struct cancel_arg {
    keel_engine *e;
    atomic_int started;
} cancel_arg;

static bool note_start(void *user, const keel_event *ev)
{
    cancel_arg *a = user;
    if (ev->kind == KEEL_EVENT_CONTENT) atomic_store(&a->started, 1);
    return true;
}

static void *canceller(void *p)
{
    cancel_arg *a = p;
    while (!atomic_load(&a->started)) usleep(1000);
    usleep(20000);
    keel_engine_cancel(a->e);
    return NULL;
}

static void test_cancel_from_thread(void **state)
{
    (void)state;
    /* compaction keeps the cache bounded however long it generates */
    keel_engine *e = open_engine("\"n_ctx\": 256, \"kv_compact\": {\"policy\": \"window\", \"trigger\": 128, \"target\": 64}");
    cancel_arg a = {e, 0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, canceller, &a), 0);
    keel_status st = keel_complete(e, MSG1, "{\"max_tokens\": -1, \"temperature\": 0.8, \"ignore_eos\": true}", NULL, note_start, &a,
                                   g_resp, sizeof g_resp);
    pthread_join(th, NULL);
    assert_status(st, KEEL_ECANCELED);
    json_t *r = parse(g_resp);
    assert_string_equal(json_string_value(json_object_get(r, "finish_reason")), "cancelled");
    assert_true(json_integer_value(json_object_get(json_object_get(r, "memory"), "cells")) <= 128);
    json_decref(r);
    keel_engine_close(e);
}

static int64_t mem_field(json_t *r, const char *k)
{
    return json_integer_value(json_object_get(json_object_get(r, "memory"), k));
}

static void test_compaction_switch(void **state)
{
    (void)state;
    keel_engine *e = open_engine("\"n_ctx\": 512");
    const char *on = "{\"max_tokens\": 120, \"temperature\": 0, \"kv_compact\": {\"policy\": \"keydiff\", \"trigger\": 64, \"target\": 32}}";
    assert_ok(keel_complete(e, MSG1, on, NULL, NULL, NULL, g_resp, sizeof g_resp));
    json_t *r = parse(g_resp);
    assert_true(mem_field(r, "compactions") > 0);
    assert_true(mem_field(r, "cells") <= 64);
    json_decref(r);
    /* off: the compacted cache cannot be truncated to the new prompt: reset, say so */
    assert_ok(keel_complete(e, MSG2, "{\"max_tokens\": 8, \"temperature\": 0, \"kv_compact\": \"none\"}", NULL, NULL,
                            NULL, g_resp, sizeof g_resp));
    r = parse(g_resp);
    assert_int_equal(mem_field(r, "compactions"), 0);
    assert_non_null(strstr(json_string_value(json_object_get(json_object_get(r, "memory"), "cache")), "reset"));
    assert_int_equal(usage(r, "cached_tokens"), 0);
    json_decref(r);
    /* still off (sticky): a long generation fills the cache without compacting */
    assert_ok(keel_complete(e, MSG2, "{\"max_tokens\": 100, \"temperature\": 0}", NULL, NULL, NULL, g_resp,
                            sizeof g_resp));
    r = parse(g_resp);
    assert_int_equal(mem_field(r, "compactions"), 0);
    assert_true(usage(r, "cached_tokens") > 0);
    json_decref(r);
    /* on again */
    assert_ok(keel_complete(e, MSG2, on, NULL, NULL, NULL, g_resp, sizeof g_resp));
    r = parse(g_resp);
    assert_true(mem_field(r, "compactions") > 0);
    json_decref(r);
    keel_engine_close(e);
}

static void test_stop_and_raw_prompt(void **state)
{
    (void)state;
    keel_engine *e = open_engine(NULL);
    /* find what it says, then stop at its third byte */
    assert_ok(keel_complete(e, NULL, "{\"prompt\": \"The cat sat on the\", \"max_tokens\": 12, \"temperature\": 0}",
                            NULL, NULL, NULL, g_resp, sizeof g_resp));
    json_t *r = parse(g_resp);
    const char *full = json_string_value(json_object_get(r, "content"));
    assert_true(strlen(full) > 4);
    char stop[3] = {full[2], full[3], 0};
    char opts[256];
    snprintf(opts, sizeof opts, "{\"prompt\": \"The cat sat on the\", \"max_tokens\": 12, \"temperature\": 0, \"stop\": [\"%s\"]}",
             stop);
    bool quote = strchr(stop, '"') || strchr(stop, '\\') || (unsigned char)stop[0] < 0x20 || (unsigned char)stop[1] < 0x20;
    if (!quote) {
        assert_ok(keel_complete(e, NULL, opts, NULL, NULL, NULL, g_resp, sizeof g_resp));
        json_t *s = parse(g_resp);
        const char *cut = json_string_value(json_object_get(s, "content"));
        assert_string_equal(json_string_value(json_object_get(s, "finish_reason")), "stop");
        assert_string_equal(json_string_value(json_object_get(s, "stop_sequence")), stop);
        assert_true(strlen(cut) <= 2);
        assert_memory_equal(cut, full, strlen(cut));
        json_decref(s);
    }
    json_decref(r);
    keel_engine_close(e);
}

static void test_bad_requests(void **state)
{
    (void)state;
    keel_engine *e = open_engine("\"n_ctx\": 64");
    struct {
        const char *msgs, *opts, *want;
        keel_status st;
    } cases[] = {
        {"[{\"role\":\"user\"", NULL, "messages: invalid JSON", KEEL_EINVAL},
        {"[]", NULL, "messages is empty", KEEL_EINVAL},
        {"[{\"role\":\"wizard\",\"content\":\"x\"}]", NULL, "unknown role 'wizard'", KEEL_EINVAL},
        {"[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]", NULL, "only parts of type \"text\"", KEEL_EINVAL},
        {"[{\"role\":\"user\",\"content\":\"x\"}]", "{\"temprature\": 1}", "unknown option 'temprature'", KEEL_EINVAL},
        {"[{\"role\":\"user\",\"content\":\"x\"}]", "{\"temperature\": -1}", "temperature -1 out of range", KEEL_EINVAL},
        {"[{\"role\":\"user\",\"content\":\"x\"}]", "{\"stop\": 3}", "stop must be a string", KEEL_EINVAL},
        {"[{\"role\":\"user\",\"content\":\"x\"}]", "{\"kv_compact\": \"magic\"}", "unknown policy 'magic'", KEEL_EINVAL},
        {NULL, "{\"prompt_tokens\": [1, 99999]}", "prompt_tokens[1] must be a token id", KEEL_EINVAL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        keel_status st = keel_complete(e, cases[i].msgs, cases[i].opts, NULL, NULL, NULL, g_resp, sizeof g_resp);
        if (st != cases[i].st || !strstr(keel_engine_last_error(e), cases[i].want))
            fail_msg("case %zu: %s '%s', want %s '%s'", i, keel_status_name(st), keel_engine_last_error(e),
                     keel_status_name(cases[i].st), cases[i].want);
    }
    /* longer than the cache without compaction */
    char big[8192] = "[{\"role\":\"user\",\"content\":\"";
    for (int i = 0; i < 200; i++) strcat(big, "dog cat ");
    strcat(big, "\"}]");
    assert_status(keel_complete(e, big, NULL, NULL, NULL, NULL, g_resp, sizeof g_resp), KEEL_ECONTEXT);
    assert_non_null(strstr(keel_engine_last_error(e), "tokens, more than the"));
    /* a response that does not fit: the turn happened, fetch it */
    assert_status(keel_complete(e, "[{\"role\":\"user\",\"content\":\"hi\"}]", "{\"max_tokens\": 2}", NULL, NULL, NULL,
                                g_resp, 8),
                  KEEL_ERANGE);
    size_t n = 0;
    assert_status(keel_engine_response(e, g_resp, 8, &n), KEEL_ERANGE);
    assert_ok(keel_engine_response(e, g_resp, sizeof g_resp, &n));
    assert_int_equal(n, strlen(g_resp) + 1);
    keel_engine_close(e);
    /* open errors */
    char err[256];
    keel_engine *x = (keel_engine *)1;
    assert_status(keel_engine_open("{\"model\": \"/nonexistent.gguf\"}", &x, err), KEEL_EIO);
    assert_null(x);
    assert_status(keel_engine_open("{\"modle\": 1}", &x, err), KEEL_EINVAL);
    assert_non_null(strstr(err, "unknown option 'modle'"));
}


/* Slot save / erase / restore: the restored cache serves a turn exactly as
 * before; a corrupted file is refused and the slot keeps its cache. */
static void test_slot_save_restore(void **state)
{
    (void)state;
    keel_engine *e = open_engine(NULL);
    logit_cap a = {NULL, 0}, b = {NULL, 0};
    assert_ok(keel_complete(e, MSG1, "{\"max_tokens\": 4, \"temperature\": 0}", NULL, NULL, NULL, g_resp, sizeof g_resp));
    char path[64];
    assert_true(test_temp_file(path, sizeof path, "slot"));
    char info[512];
    assert_ok(keel_engine_slot_save(e, 0, path, info, sizeof info));
    json_t *i1 = parse(info);
    int64_t saved = json_integer_value(json_object_get(i1, "n_saved"));
    assert_true(saved > 10);
    json_decref(i1);
    e->debug_logits = cap_logits;
    e->debug_user = &a;
    assert_ok(keel_complete(e, MSG2, "{\"max_tokens\": 4, \"temperature\": 0}", NULL, NULL, NULL, g_resp, sizeof g_resp));
    json_t *r1 = parse(g_resp);
    assert_ok(keel_engine_slot_erase(e, 0, info, sizeof info));
    assert_ok(keel_engine_slot_restore(e, 0, path, info, sizeof info));
    json_t *i2 = parse(info);
    assert_int_equal(json_integer_value(json_object_get(i2, "n_restored")), saved);
    json_decref(i2);
    e->debug_user = &b;
    assert_ok(keel_complete(e, MSG2, "{\"max_tokens\": 4, \"temperature\": 0}", NULL, NULL, NULL, g_resp, sizeof g_resp));
    json_t *r2 = parse(g_resp);
    assert_int_equal(usage(r2, "cached_tokens"), usage(r1, "cached_tokens"));
    assert_int_equal(a.n, b.n);
    assert_memory_equal(a.row, b.row, (size_t)a.n * sizeof(float));
    /* a corrupted file: refused, the slot keeps its cache */
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, 100, SEEK_SET), 0);
    assert_int_equal(fputc(0x5a, f), 0x5a);
    assert_int_equal(fclose(f), 0);
    keel_status st = keel_engine_slot_restore(e, 0, path, info, sizeof info);
    assert_true(st == KEEL_EFORMAT);
    assert_non_null(strstr(keel_engine_last_error(e), "checksum"));
    assert_ok(keel_complete(e, MSG2, "{\"max_tokens\": 4, \"temperature\": 0}", NULL, NULL, NULL, g_resp, sizeof g_resp));
    json_t *r3 = parse(g_resp);
    assert_true(usage(r3, "cached_tokens") > 0);
    assert_status(keel_engine_slot_save(e, 3, path, info, sizeof info), KEEL_EINVAL);
    assert_status(keel_engine_slot_restore(e, 0, "/nonexistent/x", info, sizeof info), KEEL_EIO);
    unlink(path);
    json_decref(r1);
    json_decref(r2);
    json_decref(r3);
    free(a.row);
    free(b.row);
    keel_engine_close(e);
}

static const char *MSG_B = "[{\"role\":\"system\",\"content\":\"You write poems about the sea and the moon.\"},"
                           "{\"role\":\"user\",\"content\":\"Tell me something completely different now.\"}]";

/* The RAM prompt cache keeps a slot's cache when another conversation
 * takes the only slot, and restores it when the first one comes back. */
static void test_prompt_cache(void **state)
{
    (void)state;
    for (int with = 0; with < 2; with++) {
        keel_engine *e = open_engine(with ? "\"cache_ram_mib\": 16" : NULL);
        assert_ok(keel_complete(e, MSG1, "{\"max_tokens\": 4, \"temperature\": 0}", NULL, NULL, NULL, g_resp, sizeof g_resp));
        assert_ok(keel_complete(e, MSG_B, "{\"max_tokens\": 4, \"temperature\": 0}", NULL, NULL, NULL, g_resp, sizeof g_resp));
        assert_ok(keel_complete(e, MSG2, "{\"max_tokens\": 4, \"temperature\": 0}", NULL, NULL, NULL, g_resp, sizeof g_resp));
        json_t *r = parse(g_resp);
        size_t n;
        assert_ok(keel_engine_stats(e, g_resp, sizeof g_resp, &n));
        json_t *s = parse(g_resp);
        json_t *pc = json_object_get(s, "prompt_cache");
        printf("prompt cache %s: cached_tokens %lld, hits %lld, entries %lld, bytes %lld\n", with ? "on" : "off",
               (long long)usage(r, "cached_tokens"), (long long)json_integer_value(json_object_get(pc, "hits")),
               (long long)json_integer_value(json_object_get(pc, "entries")),
               (long long)json_integer_value(json_object_get(pc, "bytes")));
        if (with) {
            assert_true(usage(r, "cached_tokens") > 40); /* turn 1's whole prompt */
            assert_int_equal(json_integer_value(json_object_get(pc, "hits")), 1);
            assert_true(json_integer_value(json_object_get(pc, "bytes")) <= 16 << 20);
        } else {
            assert_true(usage(r, "cached_tokens") < 20); /* only the common system-prompt opening */
        }
        json_decref(r);
        json_decref(s);
        keel_engine_close(e);
    }
}

/* ---- the loop on a scheduler thread, several slots ------------------------------ */

typedef struct collect {
    pthread_mutex_t mu;
    int done;
    char text[8][4096];
    size_t len[8];
    uint64_t ids[8];
} collect;

static bool collect_cb(void *user, const keel_event *ev)
{
    collect *c = user;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < 8; i++)
        if (c->ids[i] == ev->request) {
            if (ev->kind == KEEL_EVENT_CONTENT && c->len[i] + ev->len < sizeof c->text[i]) {
                memcpy(c->text[i] + c->len[i], ev->text, ev->len);
                c->len[i] += ev->len;
            }
            if (ev->kind == KEEL_EVENT_DONE) c->done++;
        }
    pthread_mutex_unlock(&c->mu);
    return true;
}

static void *run_loop(void *p)
{
    keel_status st = keel_engine_run(p);
    return (void *)(intptr_t)st;
}

static void test_run_loop_slots(void **state)
{
    (void)state;
    keel_engine *e = open_engine("\"n_slots\": 4, \"n_ctx\": 2048");
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, run_loop, e), 0);
    collect c;
    memset(&c, 0, sizeof c);
    pthread_mutex_init(&c.mu, NULL);
    const char *users[4] = {"The dog", "A cat and a bird", "Once upon a time there was", "The sun"};
    pthread_mutex_lock(&c.mu); /* ids are filled before any event is matched */
    for (int i = 0; i < 8; i++) {
        char req[512];
        snprintf(req, sizeof req,
                 "{\"messages\": [{\"role\":\"user\",\"content\":\"%s\"}], \"max_tokens\": %d, \"temperature\": 0}",
                 users[i % 4], 6 + i);
        assert_ok(keel_engine_submit(e, req, collect_cb, &c, &c.ids[i]));
    }
    pthread_mutex_unlock(&c.mu);
    for (int t = 0; t < 30000; t++) {
        pthread_mutex_lock(&c.mu);
        int d = c.done;
        pthread_mutex_unlock(&c.mu);
        if (d == 8) break;
        usleep(1000);
    }
    assert_int_equal(c.done, 8);
    /* a keel_complete while the loop runs submits and waits */
    assert_ok(keel_complete(e, MSG1, "{\"max_tokens\": 3, \"temperature\": 0}", NULL, NULL, NULL, g_resp, sizeof g_resp));
    size_t n = 0;
    assert_ok(keel_engine_stats(e, g_resp, sizeof g_resp, &n));
    json_t *s = parse(g_resp);
    assert_int_equal(json_integer_value(json_object_get(s, "requests")), 9);
    assert_int_equal(json_array_size(json_object_get(s, "slots")), 4);
    json_decref(s);
    keel_engine_stop(e);
    void *rv;
    pthread_join(th, &rv);
    assert_int_equal((intptr_t)rv, KEEL_OK);
    pthread_mutex_destroy(&c.mu);
    keel_engine_close(e);
}


/* Deterministic mode: 8 requests on 4 slots under continuous batching give
 * exactly (logits of the first token, then every greedy token) what they
 * give run one at a time. */
typedef struct det_cap {
    pthread_mutex_t mu;
    float *rows[8];
    uint64_t ids[8];
    int32_t n;
} det_cap;

static void det_logits(void *user, uint64_t req, const float *logits, int32_t n)
{
    det_cap *c = user;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < 8; i++)
        if (c->ids[i] == req) {
            c->rows[i] = malloc((size_t)n * sizeof(float));
            memcpy(c->rows[i], logits, (size_t)n * sizeof(float));
            c->n = n;
        }
    pthread_mutex_unlock(&c->mu);
}

static void test_deterministic_batching(void **state)
{
    (void)state;
    const char *users[8] = {"The dog", "A cat and a bird sat in the tree", "Once upon a time there was", "The sun",
                            "Tom and his dog went to the", "Lily liked to play", "It was a big red", "Mom said"};
    char reqs[8][512];
    for (int i = 0; i < 8; i++)
        snprintf(reqs[i], sizeof reqs[i],
                 "{\"messages\": [{\"role\":\"user\",\"content\":\"%s\"}], \"max_tokens\": %d, \"temperature\": 0, "
                 "\"ignore_eos\": true}",
                 users[i], 12 + 3 * i);
    /* concurrently */
    keel_engine *e = open_engine("\"n_slots\": 4, \"n_ctx\": 2048, \"deterministic\": true, \"n_batch\": 64");
    det_cap dc;
    memset(&dc, 0, sizeof dc);
    pthread_mutex_init(&dc.mu, NULL);
    e->debug_logits = det_logits;
    e->debug_user = &dc;
    collect c;
    memset(&c, 0, sizeof c);
    pthread_mutex_init(&c.mu, NULL);
    pthread_t th;
    pthread_mutex_lock(&c.mu);
    pthread_mutex_lock(&dc.mu);
    assert_int_equal(pthread_create(&th, NULL, run_loop, e), 0);
    for (int i = 0; i < 8; i++) {
        assert_ok(keel_engine_submit(e, reqs[i], collect_cb, &c, &c.ids[i]));
        dc.ids[i] = c.ids[i];
    }
    pthread_mutex_unlock(&dc.mu);
    pthread_mutex_unlock(&c.mu);
    for (int t = 0; t < 60000; t++) {
        pthread_mutex_lock(&c.mu);
        int d = c.done;
        pthread_mutex_unlock(&c.mu);
        if (d == 8) break;
        usleep(1000);
    }
    assert_int_equal(c.done, 8);
    keel_engine_stop(e);
    pthread_join(th, NULL);
    /* one at a time, on a fresh engine */
    keel_engine *f = open_engine("\"n_slots\": 1, \"n_ctx\": 512, \"deterministic\": true");
    logit_cap one = {NULL, 0};
    f->debug_logits = cap_logits;
    f->debug_user = &one;
    int same_text = 0;
    for (int i = 0; i < 8; i++) {
        char *msgs = strstr(reqs[i], "[");
        char mj[256];
        size_t ml = (size_t)(strstr(msgs, "]") - msgs) + 1;
        memcpy(mj, msgs, ml);
        mj[ml] = 0;
        char opts[128];
        snprintf(opts, sizeof opts, "{\"max_tokens\": %d, \"temperature\": 0, \"ignore_eos\": true}", 12 + 3 * i);
        /* the streamed bytes (the response JSON replaces invalid UTF-8) */
        collect a;
        memset(&a, 0, sizeof a);
        pthread_mutex_init(&a.mu, NULL);
        a.ids[0] = (uint64_t)(i + 1);
        assert_ok(keel_complete(f, mj, opts, NULL, collect_cb, &a, g_resp, sizeof g_resp));
        pthread_mutex_destroy(&a.mu);
        assert_non_null(dc.rows[i]);
        assert_memory_equal(dc.rows[i], one.row, (size_t)one.n * sizeof(float));
        if (a.len[0] == c.len[i] && memcmp(a.text[0], c.text[i], c.len[i]) == 0) same_text++;
        else printf("request %d: concurrent and alone outputs differ\n", i);
        assert_ok(keel_engine_reset(f));
    }
    assert_int_equal(same_text, 8);
    for (int i = 0; i < 8; i++) free(dc.rows[i]);
    free(one.row);
    keel_engine_close(f);
    keel_engine_close(e);
}


/* The streamed deltas are the response's content byte for byte (valid
 * UTF-8: the random model writes invalid bytes, both get U+FFFD). */
static void test_stream_equals_response(void **state)
{
    (void)state;
    keel_engine *e = open_engine(NULL);
    for (int k = 0; k < 3; k++) {
        collect c;
        memset(&c, 0, sizeof c);
        pthread_mutex_init(&c.mu, NULL);
        c.ids[0] = (uint64_t)(k + 1);
        char opts[128];
        snprintf(opts, sizeof opts, "{\"max_tokens\": 60, \"temperature\": 1.0, \"seed\": %d, \"ignore_eos\": true}", 7 + k);
        assert_ok(keel_complete(e, MSG1, opts, NULL, collect_cb, &c, g_resp, sizeof g_resp));
        pthread_mutex_destroy(&c.mu);
        json_t *r = parse(g_resp);
        json_t *ct = json_object_get(r, "content");
        size_t len = json_string_length(ct);
        assert_int_equal(len, c.len[0]);
        assert_memory_equal(json_string_value(ct), c.text[0], len);
        /* and it is valid UTF-8 (jansson refuses anything else) */
        json_t *again = json_stringn(c.text[0], c.len[0]);
        assert_non_null(again);
        json_decref(again);
        json_decref(r);
    }
    keel_engine_close(e);
}

typedef struct prog_log {
    int32_t n_prompt, n_cached, n_events, last, first_text_at;
    int32_t n_after_text; /* PROGRESS events after the first text: must stay 0 */
    bool monotone;
    double last_ms;
} prog_log;

static bool prog_cb(void *user, const keel_event *ev)
{
    prog_log *p = user;
    if (ev->kind == KEEL_EVENT_PROMPT) {
        p->n_prompt = ev->n_prompt_tokens;
        p->n_cached = ev->n_cached_tokens;
        p->last = ev->n_cached_tokens;
    } else if (ev->kind == KEEL_EVENT_PROGRESS) {
        if (p->first_text_at >= 0) p->n_after_text++;
        if (ev->n_prompt_tokens != p->n_prompt || ev->n_cached_tokens != p->n_cached || ev->n_processed <= p->last ||
            ev->n_processed > ev->n_prompt_tokens || ev->elapsed_ms < p->last_ms)
            p->monotone = false;
        p->last = ev->n_processed;
        p->last_ms = ev->elapsed_ms;
        p->n_events++;
    } else if ((ev->kind == KEEL_EVENT_CONTENT || ev->kind == KEEL_EVENT_REASONING) && p->first_text_at < 0) {
        p->first_text_at = p->n_events;
    }
    return true;
}

/* return_progress: PROGRESS events climb to the prompt's length, one per
 * step that fed it (n_batch 8: several), all before the first text, from
 * the cached prefix on; none without the option. */
static void test_progress_events(void **state)
{
    (void)state;
    keel_engine *e = open_engine("\"n_batch\": 8");
    prog_log p = {.monotone = true, .first_text_at = -1};
    assert_ok(keel_complete(e, MSG1, "{\"max_tokens\": 4, \"temperature\": 0, \"return_progress\": true}", NULL,
                            prog_cb, &p, g_resp, sizeof g_resp));
    assert_true(p.monotone);
    assert_int_equal(p.last, p.n_prompt);
    assert_true(p.n_events >= (p.n_prompt - p.n_cached + 7) / 8);
    assert_int_equal(p.n_after_text, 0);
    /* the second turn starts from the cached prefix */
    prog_log q = {.monotone = true, .first_text_at = -1};
    assert_ok(keel_complete(e, MSG2, "{\"max_tokens\": 4, \"temperature\": 0, \"return_progress\": true}", NULL,
                            prog_cb, &q, g_resp, sizeof g_resp));
    assert_true(q.n_cached > 0);
    assert_true(q.monotone);
    assert_int_equal(q.last, q.n_prompt);
    assert_true(q.n_events >= 1 && q.n_events <= (q.n_prompt - q.n_cached + 7) / 8);
    /* without the option: none */
    prog_log r = {.monotone = true, .first_text_at = -1};
    assert_ok(keel_engine_slot_erase(e, 0, NULL, 0));
    assert_ok(keel_complete(e, MSG2, "{\"max_tokens\": 2, \"temperature\": 0}", NULL, prog_cb, &r, g_resp,
                            sizeof g_resp));
    assert_int_equal(r.n_events, 0);
    assert_status(keel_complete(e, MSG1, "{\"return_progress\": 1}", NULL, NULL, NULL, g_resp, sizeof g_resp),
                  KEEL_EINVAL);
    keel_engine_close(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_turns_reuse),   cmocka_unit_test(test_callback_stops),
        cmocka_unit_test(test_recurrent_reuse),
        cmocka_unit_test(test_swa_checkpoint_reuse),
        cmocka_unit_test(test_tool_choice_forced),
        cmocka_unit_test(test_stats_before_done),
        cmocka_unit_test(test_logprobs),
        cmocka_unit_test(test_logit_bias),
        cmocka_unit_test(test_cancel_from_thread), cmocka_unit_test(test_compaction_switch),
        cmocka_unit_test(test_stop_and_raw_prompt), cmocka_unit_test(test_bad_requests),
        cmocka_unit_test(test_run_loop_slots),    cmocka_unit_test(test_slot_save_restore),
        cmocka_unit_test(test_prompt_cache),       cmocka_unit_test(test_deterministic_batching),
        cmocka_unit_test(test_stream_equals_response), cmocka_unit_test(test_progress_events),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
