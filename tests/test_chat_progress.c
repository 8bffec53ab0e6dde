/*
 * test_chat_progress.c — the prefill progress of the engine (keel.h only),
 * which `keel chat` draws on a terminal and keel serve streams as
 * llama-server's prompt_progress:
 *   - with "return_progress": true, KEEL_EVENT_PROGRESS after each prefill
 *     chunk (n_batch 64: a 300-token prompt gives 5), n_processed
 *     strictly increasing, the last equal to n_prompt_tokens, every one
 *     after PROMPT and before the answer's first CONTENT, with the same
 *     totals as PROMPT; a second turn's progress starts at its cached tokens;
 *   - without the option no PROGRESS event at all;
 *   - a callback returning false on the first PROGRESS cancels the request
 *     before any answer;
 *   - keel_engine_stats' slot "prompt_progress" {total, cache, processed}
 *     after a turn is the last prompt's;
 *   - a non-boolean return_progress is KEEL_EINVAL, named.
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
    return test_gen_qwen2(g_model, sizeof g_model, "chat_progress", 1, 5) ? 0 : -1;
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
    snprintf(opts, sizeof opts,
             "{\"model\": \"%s\", \"n_threads\": 1, \"n_ctx\": 1024, \"n_batch\": 64}", g_model);
    keel_engine *e = NULL;
    keel_status st = keel_engine_open(opts, &e, err);
    if (st != KEEL_OK) fail_msg("engine open: %s: %s", keel_status_name(st), err);
    return e;
}

typedef struct rec {
    int n_prompt_ev, n_progress, n_content_before_last, n_after_content;
    int32_t prompt_total, prompt_cached;
    int32_t first_done, last_done, last_total, last_cache;
    bool monotonic, totals_agree, seen_content, progress_after_prompt;
    bool cancel_on_progress;
} rec;

static bool on_ev(void *user, const keel_event *ev)
{
    rec *r = user;
    if (ev->kind == KEEL_EVENT_PROMPT) {
        r->n_prompt_ev++;
        r->prompt_total = ev->n_prompt_tokens;
        r->prompt_cached = ev->n_cached_tokens;
    } else if (ev->kind == KEEL_EVENT_PROGRESS) {
        if (r->n_progress == 0)
            r->first_done = ev->n_processed;
        else if (ev->n_processed <= r->last_done)
            r->monotonic = false;
        if (r->n_prompt_ev == 0) r->progress_after_prompt = false;
        if (ev->n_prompt_tokens != r->prompt_total || ev->n_cached_tokens != r->prompt_cached)
            r->totals_agree = false;
        if (r->seen_content) r->n_after_content++;
        r->n_progress++;
        r->last_done = ev->n_processed;
        r->last_total = ev->n_prompt_tokens;
        r->last_cache = ev->n_cached_tokens;
        if (r->cancel_on_progress) return false;
    } else if (ev->kind == KEEL_EVENT_CONTENT || ev->kind == KEEL_EVENT_REASONING) {
        r->seen_content = true;
    }
    return true;
}

static void rec_init(rec *r)
{
    memset(r, 0, sizeof *r);
    r->monotonic = r->totals_agree = r->progress_after_prompt = true;
}

/* A user message of about n words. */
static char *long_messages(int n_words, const char *second)
{
    size_t cap = (size_t)n_words * 8 + 512;
    char *s = malloc(cap);
    assert_non_null(s);
    size_t k = (size_t)snprintf(s, cap, "[{\"role\":\"user\",\"content\":\"");
    for (int i = 0; i < n_words; i++)
        k += (size_t)snprintf(s + k, cap - k, "%s ", i % 2 ? "cat" : "dog");
    k += (size_t)snprintf(s + k, cap - k, "\"}");
    if (second) k += (size_t)snprintf(s + k, cap - k, ",%s", second);
    snprintf(s + k, cap - k, "]");
    return s;
}

static const char *OPTS =
    "{\"max_tokens\": 4, \"temperature\": 0, \"ignore_eos\": true, \"return_progress\": true}";

static void test_progress_events(void **state)
{
    (void)state;
    keel_engine *e = open_engine();
    char *msgs = long_messages(300, NULL);
    rec r;
    rec_init(&r);
    char resp[8192];
    assert_int_equal(keel_complete(e, msgs, OPTS, NULL, on_ev, &r, resp, sizeof resp), KEEL_OK);
    assert_int_equal(r.n_prompt_ev, 1);
    assert_true(r.prompt_total > 256);
    assert_int_equal(r.prompt_cached, 0);
    /* chunks of at most n_batch = 64 tokens */
    assert_int_equal(r.n_progress, (r.prompt_total + 63) / 64);
    assert_true(r.first_done > 0 && r.first_done <= 64);
    assert_true(r.monotonic);
    assert_true(r.totals_agree);
    assert_true(r.progress_after_prompt);
    assert_int_equal(r.last_done, r.prompt_total);
    assert_int_equal(r.n_after_content, 0);
    /* the slot's snapshot is the last prompt's */
    size_t n = 0;
    char stats[16384];
    assert_int_equal(keel_engine_stats(e, stats, sizeof stats, &n), KEEL_OK);
    json_t *j = json_loads(stats, 0, NULL);
    assert_non_null(j);
    json_t *pp = json_object_get(json_array_get(json_object_get(j, "slots"), 0), "prompt_progress");
    assert_int_equal(json_integer_value(json_object_get(pp, "total")), r.prompt_total);
    assert_int_equal(json_integer_value(json_object_get(pp, "cache")), 0);
    assert_int_equal(json_integer_value(json_object_get(pp, "processed")), r.prompt_total);
    json_decref(j);

    /* the next turn: its progress starts past the cached prefix */
    json_t *rj = json_loads(resp, JSON_ALLOW_NUL, NULL);
    assert_non_null(rj);
    json_t *am =
        json_pack("{ss sO}", "role", "assistant", "content", json_object_get(rj, "content"));
    char *amj = json_dumps(am, JSON_COMPACT);
    size_t cap = strlen(amj) + 256;
    char *second = malloc(cap);
    assert_non_null(second);
    snprintf(second, cap, "%s,{\"role\":\"user\",\"content\":\"and then?\"}", amj);
    char *msgs2 = long_messages(300, second);
    rec r2;
    rec_init(&r2);
    assert_int_equal(keel_complete(e, msgs2, OPTS, NULL, on_ev, &r2, resp, sizeof resp), KEEL_OK);
    assert_true(r2.prompt_cached > 256);
    assert_true(r2.n_progress >= 1 && r2.n_progress <= 2);
    assert_true(r2.first_done > r2.prompt_cached);
    assert_int_equal(r2.last_done, r2.prompt_total);
    assert_int_equal(r2.last_cache, r2.prompt_cached);
    assert_true(r2.monotonic && r2.totals_agree);
    free(msgs2);
    free(second);
    free(amj);
    json_decref(am);
    json_decref(rj);

    /* without the option: none */
    assert_int_equal(keel_engine_reset(e), KEEL_OK);
    rec r3;
    rec_init(&r3);
    assert_int_equal(keel_complete(e, msgs, "{\"max_tokens\": 2, \"temperature\": 0}", NULL, on_ev,
                                   &r3, resp, sizeof resp),
                     KEEL_OK);
    assert_int_equal(r3.n_prompt_ev, 1);
    assert_int_equal(r3.n_progress, 0);
    free(msgs);
    keel_engine_close(e);
}

static void test_progress_cancel(void **state)
{
    (void)state;
    keel_engine *e = open_engine();
    char *msgs = long_messages(300, NULL);
    rec r;
    rec_init(&r);
    r.cancel_on_progress = true;
    char resp[8192];
    keel_status st = keel_complete(e, msgs, OPTS, NULL, on_ev, &r, resp, sizeof resp);
    assert_int_equal(st, KEEL_ECANCELED);
    assert_int_equal(r.n_progress, 1);
    assert_false(r.seen_content);
    json_t *j = json_loads(resp, JSON_ALLOW_NUL, NULL);
    assert_non_null(j);
    assert_string_equal(json_string_value(json_object_get(j, "finish_reason")), "cancelled");
    json_decref(j);
    free(msgs);
    keel_engine_close(e);
}

static void test_progress_option_checked(void **state)
{
    (void)state;
    keel_engine *e = open_engine();
    char resp[4096];
    keel_status st = keel_complete(e, "[{\"role\":\"user\",\"content\":\"hi\"}]",
                                   "{\"return_progress\": 1}", NULL, NULL, NULL, resp, sizeof resp);
    assert_int_equal(st, KEEL_EINVAL);
    assert_non_null(strstr(keel_engine_last_error(e), "return_progress"));
    keel_engine_close(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_progress_events),
        cmocka_unit_test(test_progress_cancel),
        cmocka_unit_test(test_progress_option_checked),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
