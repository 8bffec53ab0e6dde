/*
 * test_engine_threads.c — keel.h's threading promises for keel_engine, as
 * an embedder meets them (keel.h only). Each case failed before its fix:
 *   - keel_engine_close while keel_engine_run runs on another thread (with
 *     a submitted request streaming and a keel_complete waiting on the
 *     loop) stops the loop and waits for it: the context used to be freed
 *     under the running loop (ASan: heap-use-after-free in the matvec);
 *   - keel_engine_close while a keel_complete steps the engine on another
 *     thread (no loop) cancels it and waits for it to return;
 *   - keel_engine_last_error is the calling thread's own: threads failing
 *     different calls at once each read their own message (one buffer per
 *     engine was written by all of them: a data race under TSan, and the
 *     wrong text);
 *   - keel_engine_count_tokens from two threads while a loop generates
 *     (new: thread-safe, every count the prompt a request gets);
 *   - U+0000, which the engine can generate (the response carries it as
 *     \u0000), is accepted back in messages and prompts: keel_complete and
 *     keel_engine_submit used to refuse it ("\u0000 is not allowed"), so a
 *     client echoing its history was stuck.
 *   - one compiled grammar (a JSON Schema's) shared by threads that call
 *     keel_grammar_match and keel_grammar_accepts_nothing at once (both
 *     promised thread-safe): each gets the single-threaded answers.
 * make test-tsan runs this file under ThreadSanitizer.
 */
#include "testutil.h"

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char g_model[64];

static int setup(void **state)
{
    (void)state;
    return test_gen_qwen2(g_model, sizeof g_model, "engine_threads", 2, 23) ? 0 : -1;
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
    snprintf(opts, sizeof opts, "{\"model\": \"%s\", \"n_threads\": 1, \"n_ctx\": 2048%s%s}", g_model,
             extra ? ", " : "", extra ? extra : "");
    keel_engine *e = NULL;
    keel_status st = keel_engine_open(opts, &e, err);
    if (st != KEEL_OK) fail_msg("engine open: %s: %s", keel_status_name(st), err);
    return e;
}

static const char *MSGS = "[{\"role\":\"user\",\"content\":\"Tell me a long story about a dog\"}]";
/* with FOREVER, generation never fills the cache: it runs until cancelled */
static const char *COMPACT = "\"kv_compact\": {\"policy\": \"window\", \"trigger\": 128, \"target\": 64}";
/* runs until the cache is full (never, with COMPACT) or it is cancelled */
static const char *FOREVER = "{\"max_tokens\": -1, \"temperature\": 0, \"ignore_eos\": true}";

/* Counts a request's events; DONE records its status and finish_reason. */
typedef struct watch {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int content, done;
    keel_status status;
    char finish[32];
} watch;

static void watch_init(watch *w)
{
    memset(w, 0, sizeof *w);
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
}

static void watch_destroy(watch *w)
{
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
}

static bool watch_cb(void *user, const keel_event *ev)
{
    watch *w = user;
    pthread_mutex_lock(&w->mu);
    if (ev->kind == KEEL_EVENT_CONTENT || ev->kind == KEEL_EVENT_REASONING) w->content++;
    if (ev->kind == KEEL_EVENT_DONE) {
        json_t *r = json_loads(ev->response, JSON_ALLOW_NUL, NULL);
        const char *f = r ? json_string_value(json_object_get(r, "finish_reason")) : NULL;
        snprintf(w->finish, sizeof w->finish, "%s", f ? f : "(none)");
        if (r) json_decref(r);
        w->status = ev->status;
        w->done++;
    }
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    return true;
}

/* Waits until w streamed `content` deltas (or ended). */
static void watch_wait_streaming(watch *w, int content)
{
    pthread_mutex_lock(&w->mu);
    while (w->content < content && !w->done) pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
}

/* Waits until w's request ended. */
static void watch_wait_done(watch *w)
{
    pthread_mutex_lock(&w->mu);
    while (!w->done) pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
}

/* Submits MSGS to generate until cancelled (FOREVER), events to w. */
static uint64_t submit_forever(keel_engine *e, watch *w)
{
    char req[512];
    uint64_t id = 0;
    snprintf(req, sizeof req, "{\"messages\": %s, \"max_tokens\": -1, \"temperature\": 0, \"ignore_eos\": true}", MSGS);
    assert_ok(keel_engine_submit(e, req, watch_cb, w, &id));
    assert_true(id > 0);
    return id;
}

static void *run_loop(void *p)
{
    return (void *)(intptr_t)keel_engine_run(p);
}

typedef struct completer {
    keel_engine *e;
    watch w;
    keel_status st;
    char finish[32];
} completer;

static void *complete_thread(void *p)
{
    completer *c = p;
    char resp[65536];
    c->st = keel_complete(c->e, MSGS, FOREVER, NULL, watch_cb, &c->w, resp, sizeof resp);
    json_t *r = json_loads(resp, JSON_ALLOW_NUL, NULL);
    const char *f = r ? json_string_value(json_object_get(r, "finish_reason")) : NULL;
    snprintf(c->finish, sizeof c->finish, "%s", f ? f : "(none)");
    if (r) json_decref(r);
    return NULL;
}

/* ---- close while a loop runs -------------------------------------------------------- */

static void test_close_during_run(void **state)
{
    (void)state;
    char extra[256];
    snprintf(extra, sizeof extra, "\"n_slots\": 2, %s", COMPACT);
    keel_engine *e = open_engine(extra);
    pthread_t loop;
    assert_int_equal(pthread_create(&loop, NULL, run_loop, e), 0);
    watch a;
    watch_init(&a);
    assert_true(submit_forever(e, &a) > 0);
    watch_wait_streaming(&a, 3);
    /* a keel_complete on another thread: it submits to the loop and waits */
    completer c;
    memset(&c, 0, sizeof c);
    c.e = e;
    watch_init(&c.w);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, complete_thread, &c), 0);
    watch_wait_streaming(&c.w, 2);
    assert_int_equal(a.done, 0); /* both still generating */
    assert_int_equal(c.w.done, 0);
    keel_engine_close(e); /* stops the loop, waits for it and for keel_complete */
    void *rv = NULL;
    pthread_join(loop, &rv);
    assert_int_equal((intptr_t)rv, KEEL_OK);
    pthread_join(th, NULL);
    assert_int_equal(a.done, 1);
    assert_int_equal(a.status, KEEL_ECANCELED);
    assert_string_equal(a.finish, "cancelled");
    assert_int_equal(c.st, KEEL_ECANCELED);
    assert_string_equal(c.finish, "cancelled");
    assert_int_equal(c.w.done, 1);
    watch_destroy(&a);
    watch_destroy(&c.w);
}

/* ---- close while keel_complete steps the engine itself ------------------------------- */

static void test_close_during_complete(void **state)
{
    (void)state;
    keel_engine *e = open_engine(COMPACT);
    completer c;
    memset(&c, 0, sizeof c);
    c.e = e;
    watch_init(&c.w);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, complete_thread, &c), 0);
    watch_wait_streaming(&c.w, 3);
    assert_int_equal(c.w.done, 0);
    keel_engine_close(e);
    pthread_join(th, NULL);
    assert_int_equal(c.st, KEEL_ECANCELED);
    assert_string_equal(c.finish, "cancelled");
    assert_int_equal(c.w.done, 1);
    watch_destroy(&c.w);
}

/* ---- each thread reads its own error ------------------------------------------------- */

typedef struct failer {
    keel_engine *e;
    int kind; /* 0: malformed submit, 1: slot action on a missing slot, 2: reset */
    int n_checked;
    char why[512];
} failer;

static void *fail_thread(void *p)
{
    failer *f = p;
    for (int i = 0; i < 400 && !f->why[0]; i++) {
        keel_status st;
        const char *want;
        if (f->kind == 0) {
            uint64_t id;
            st = keel_engine_submit(f->e, "{\"messages\": [", NULL, NULL, &id);
            want = "invalid JSON";
        } else if (f->kind == 1) {
            char info[256];
            st = keel_engine_slot_erase(f->e, 77, info, sizeof info);
            want = st == KEEL_ESTATE ? "another call" : "slot 77 does not exist";
        } else {
            st = keel_engine_reset(f->e);
            if (st == KEEL_OK) continue;
            want = "reset:";
        }
        const char *msg = keel_engine_last_error(f->e);
        if (st == KEEL_OK || !strstr(msg, want)) {
            snprintf(f->why, sizeof f->why, "kind %d, call %d: %s '%s' (want '%s')", f->kind, i,
                     keel_status_name(st), msg, want);
            break;
        }
        f->n_checked++;
    }
    return NULL;
}

static void test_errors_per_thread(void **state)
{
    (void)state;
    keel_engine *e = open_engine(NULL);
    failer f[3];
    pthread_t th[3];
    for (int k = 0; k < 3; k++) {
        memset(&f[k], 0, sizeof f[k]);
        f[k].e = e;
        f[k].kind = k;
        assert_int_equal(pthread_create(&th[k], NULL, fail_thread, &f[k]), 0);
    }
    for (int k = 0; k < 3; k++) pthread_join(th[k], NULL);
    for (int k = 0; k < 3; k++)
        if (f[k].why[0]) fail_msg("%s", f[k].why);
    assert_int_equal(f[0].n_checked, 400);
    assert_int_equal(f[1].n_checked, 400);
    /* another thread's failure is not this thread's error */
    assert_string_equal(keel_engine_last_error(e), "");
    keel_engine_close(e);
}

/* ---- count_tokens beside a running loop ------------------------------------------------ */

typedef struct counter {
    keel_engine *e;
    int64_t want;
    int n_ok;
    char why[256];
} counter;

static const char *COUNT_MSGS = "[{\"role\":\"system\",\"content\":\"You are terse.\"},"
                                 "{\"role\":\"user\",\"content\":\"Tell me a long story about a dog\"}]";
static const char *COUNT_TOOLS =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_time\",\"parameters\":{\"type\":\"object\"}}}]";
static char COUNT_REQ[1024]; /* {"messages": COUNT_MSGS, "tools": COUNT_TOOLS} */

static void *count_thread(void *p)
{
    counter *c = p;
    for (int i = 0; i < 50; i++) {
        int64_t n = 0;
        keel_status st = keel_engine_count_tokens(c->e, COUNT_REQ, &n);
        if (st != KEEL_OK || n != c->want) {
            snprintf(c->why, sizeof c->why, "call %d: %s %lld (want %lld): %s", i, keel_status_name(st), (long long)n,
                     (long long)c->want, keel_engine_last_error(c->e));
            return NULL;
        }
        c->n_ok++;
    }
    return NULL;
}

/* keel_engine_count_tokens is thread-safe: two threads render and tokenize
 * on the shared template while the loop generates (make test-tsan), each
 * count equal to the prompt a request gets. */
static void test_count_tokens_beside_loop(void **state)
{
    (void)state;
    keel_engine *e = open_engine(COMPACT);
    snprintf(COUNT_REQ, sizeof COUNT_REQ, "{\"messages\": %s, \"tools\": %s}", COUNT_MSGS, COUNT_TOOLS);
    int64_t want = 0;
    assert_ok(keel_engine_count_tokens(e, COUNT_REQ, &want));
    assert_true(want > 10);
    assert_status(keel_engine_count_tokens(e, "{\"messages\": 3}", &want), KEEL_EINVAL);
    assert_non_null(strstr(keel_engine_last_error(e), "messages"));
    assert_ok(keel_engine_count_tokens(e, COUNT_REQ, &want));
    pthread_t loop;
    assert_int_equal(pthread_create(&loop, NULL, run_loop, e), 0);
    watch a;
    watch_init(&a);
    uint64_t id = submit_forever(e, &a);
    watch_wait_streaming(&a, 2);
    counter c[2];
    pthread_t th[2];
    for (int k = 0; k < 2; k++) {
        c[k] = (counter){e, want, 0, ""};
        assert_int_equal(pthread_create(&th[k], NULL, count_thread, &c[k]), 0);
    }
    for (int k = 0; k < 2; k++) pthread_join(th[k], NULL);
    for (int k = 0; k < 2; k++)
        if (c[k].why[0]) fail_msg("%s", c[k].why);
    assert_int_equal(c[0].n_ok + c[1].n_ok, 100);
    /* the count is the prompt a request gets */
    assert_ok(keel_engine_cancel_request(e, id));
    watch_wait_done(&a);
    keel_engine_stop(e);
    pthread_join(loop, NULL);
    char resp[65536];
    assert_ok(keel_complete(e, COUNT_MSGS, "{\"max_tokens\": 1}", COUNT_TOOLS, NULL, NULL, resp, sizeof resp));
    json_t *r = json_loads(resp, JSON_ALLOW_NUL, NULL);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(r, "usage"), "prompt_tokens")), want);
    json_decref(r);
    watch_destroy(&a);
    keel_engine_close(e);
}

/* ---- U+0000 round trip ------------------------------------------------------------------ */

static int64_t prompt_tokens_of(keel_engine *e, const char *msgs, const char *opts)
{
    char resp[65536];
    keel_status st = keel_complete(e, msgs, opts, NULL, NULL, NULL, resp, sizeof resp);
    if (st != KEEL_OK) fail_msg("keel_complete: %s: %s", keel_status_name(st), keel_engine_last_error(e));
    json_t *r = json_loads(resp, JSON_ALLOW_NUL, NULL);
    if (!r) fail_msg("not JSON: %s", resp);
    int64_t n = json_integer_value(json_object_get(json_object_get(r, "usage"), "prompt_tokens"));
    json_decref(r);
    return n;
}

static void test_nul_round_trip(void **state)
{
    (void)state;
    keel_engine *e = open_engine(NULL);
    const char *opts = "{\"max_tokens\": 1, \"temperature\": 0}";
    /* the text after the NUL reaches the prompt (nothing is cut at it) */
    int64_t cut = prompt_tokens_of(e, "[{\"role\":\"user\",\"content\":\"ab\\u0000\"}]", opts);
    int64_t whole =
        prompt_tokens_of(e, "[{\"role\":\"user\",\"content\":\"ab\\u0000cd efg hij klm\"}]", opts);
    assert_true(whole > cut);
    /* an assistant turn echoed back with the NUL it generated, and text parts */
    int64_t hist = prompt_tokens_of(e,
                                    "[{\"role\":\"user\",\"content\":\"hi\"},"
                                    "{\"role\":\"assistant\",\"content\":\"x\\u0000y\"},"
                                    "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\\u0000b\"}]}]",
                                    opts);
    assert_true(hist > 0);
    /* a raw prompt, and a submitted request through a loop */
    assert_true(prompt_tokens_of(e, NULL, "{\"prompt\": \"one\\u0000two\", \"max_tokens\": 1}") > 1);
    pthread_t loop;
    assert_int_equal(pthread_create(&loop, NULL, run_loop, e), 0);
    watch w;
    watch_init(&w);
    uint64_t id = 0;
    assert_ok(keel_engine_submit(e,
                                 "{\"messages\": [{\"role\":\"user\",\"content\":\"z\\u0000z\"}], "
                                 "\"max_tokens\": 2, \"temperature\": 0}",
                                 watch_cb, &w, &id));
    watch_wait_done(&w);
    assert_int_equal(w.status, KEEL_OK);
    keel_engine_stop(e);
    pthread_join(loop, NULL);
    watch_destroy(&w);
    keel_engine_close(e);
}

typedef struct gram_job {
    const keel_grammar *g;
    int bad; /* answers that differ from the single-threaded ones */
} gram_job;

static const char *const g_gram_texts[] = {"{\"a\":1}", "{\"a\":\"x\"}", "{\"a\":7,\"b\":[true]}", "[]"};
static const bool g_gram_want[] = {true, false, true, false};

static void *gram_thread(void *arg)
{
    gram_job *j = arg;
    for (int r = 0; r < 200; r++) {
        for (size_t i = 0; i < sizeof g_gram_want / sizeof g_gram_want[0]; i++) {
            bool ok = !g_gram_want[i];
            if (keel_grammar_match(j->g, g_gram_texts[i], strlen(g_gram_texts[i]), &ok, NULL) != KEEL_OK ||
                ok != g_gram_want[i])
                j->bad++;
        }
        bool empty = true;
        if (keel_grammar_accepts_nothing(j->g, &empty, NULL) != KEEL_OK || empty) j->bad++;
    }
    return NULL;
}

static void test_grammar_shared(void **state)
{
    (void)state;
    static const char schema[] = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"minimum\":1},"
                                 "\"b\":{\"type\":\"array\",\"items\":{\"type\":\"boolean\"}}},\"required\":[\"a\"]}";
    keel_grammar *g = NULL;
    assert_int_equal(keel_grammar_compile_schema(schema, strlen(schema), &g, NULL), KEEL_OK);
    gram_job jobs[4];
    pthread_t th[4];
    for (int k = 0; k < 4; k++) {
        jobs[k] = (gram_job){g, 0};
        assert_int_equal(pthread_create(&th[k], NULL, gram_thread, &jobs[k]), 0);
    }
    for (int k = 0; k < 4; k++) {
        pthread_join(th[k], NULL);
        assert_int_equal(jobs[k].bad, 0);
    }
    keel_grammar_close(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_close_during_run),
        cmocka_unit_test(test_close_during_complete),
        cmocka_unit_test(test_errors_per_thread),
        cmocka_unit_test(test_count_tokens_beside_loop),
        cmocka_unit_test(test_nul_round_trip),
        cmocka_unit_test(test_grammar_shared),
    };
    if (getenv("KEEL_TEST_FILTER")) cmocka_set_test_filter(getenv("KEEL_TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, teardown);
}
