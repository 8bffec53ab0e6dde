/*
 * test_engine_sched.c — the scheduler's promises under a long prefill
 * (keel.h only; issue 25):
 *   - fairness: a stream's decode rate while another slot prefills a long
 *     prompt is at least half its rate alone (the whole prompt used to go
 *     in n_batch chunks, each step as long as the chunk: a few tokens in
 *     the whole prefill), also while the stream drafts at every step
 *     (speculative decoding; its prefill budget used to stay 0);
 *   - keel_engine_stop, and keel_engine_cancel_request of the only request
 *     in the batch, during a long prefill return within a second (the
 *     running keel_decode used to finish its n_batch tokens first), and
 *     the slot keeps answering as before.
 * Rates are tokens per second of the process's CPU time (the engine runs
 * one thread; other processes on a shared machine do not count), measured
 * in the same run, tried up to five times (single tries read 0.43-0.61 on
 * a shared 2-core VM with another test running beside; the target of the
 * prefill budget is 0.6); the old code misses by two
 * orders of magnitude.
 */
#include "testutil.h"

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static char g_small[64], g_big[64];

static int gen(char *path, size_t cap, const char *stem, int32_t n_embd, int32_t n_layer)
{
    if (!test_temp_file(path, cap, stem)) return -1;
    keel_gen_params gp = keel_gen_params_default();
    gp.arch = "llama";
    gp.n_layer = n_layer;
    gp.n_embd = n_embd;
    gp.n_head = 4;
    gp.n_head_kv = 2;
    gp.n_ctx = 16384;
    gp.seed = 25;
    char err[256];
    return keel_gen_model(&gp, path, err) == KEEL_OK ? 0 : -1;
}

static int setup(void **state)
{
    (void)state;
    if (gen(g_small, sizeof g_small, "sched_small", 256, 4) != 0) return -1;
    return gen(g_big, sizeof g_big, "sched_big", 512, 4);
}

static int teardown(void **state)
{
    (void)state;
    unlink(g_small);
    unlink(g_big);
    return 0;
}

static keel_engine *open_engine(const char *model, const char *extra)
{
    char opts[1024], err[256] = "";
    snprintf(opts, sizeof opts, "{\"model\": \"%s\", \"n_threads\": 1%s%s}", model, extra ? ", " : "",
             extra ? extra : "");
    keel_engine *e = NULL;
    keel_status st = keel_engine_open(opts, &e, err);
    if (st != KEEL_OK) fail_msg("engine open: %s: %s", keel_status_name(st), err);
    return e;
}

static void *run_loop(void *p)
{
    keel_status st = keel_engine_run(p);
    return (void *)(intptr_t)st;
}

/* A request's events: content event times, DONE. */
#define MAX_TIMES 65536
typedef struct track {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t *t;   /* [MAX_TIMES] content event times (process CPU ns) */
    int n;
    bool done;
    keel_status status;
    uint64_t t_done, c_done; /* DONE: wall clock, process CPU time */
    char finish[32];
} track;

/* CPU time of the process (the engine's one thread does the work): rates
 * per CPU second do not depend on what else the machine runs */
static uint64_t cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static bool track_cb(void *user, const keel_event *ev)
{
    track *k = user;
    uint64_t now = cpu_ns();
    pthread_mutex_lock(&k->mu);
    if (ev->kind == KEEL_EVENT_CONTENT && k->n < MAX_TIMES) {
        k->t[k->n++] = now;
    } else if (ev->kind == KEEL_EVENT_DONE) {
        k->done = true;
        k->status = ev->status;
        k->t_done = keel_time_ns();
        k->c_done = now;
        json_t *r = json_loads(ev->response, JSON_ALLOW_NUL, NULL);
        const char *f = json_string_value(json_object_get(r, "finish_reason"));
        snprintf(k->finish, sizeof k->finish, "%s", f ? f : "");
        if (r) json_decref(r);
    }
    pthread_cond_broadcast(&k->cv);
    pthread_mutex_unlock(&k->mu);
    return true;
}

static void track_init(track *k)
{
    memset(k, 0, sizeof *k);
    pthread_mutex_init(&k->mu, NULL);
    pthread_cond_init(&k->cv, NULL);
    k->t = calloc(MAX_TIMES, sizeof *k->t);
    assert_non_null(k->t);
}

static void track_destroy(track *k)
{
    free(k->t);
    pthread_mutex_destroy(&k->mu);
    pthread_cond_destroy(&k->cv);
}

/* Waits until k has n content events or is done; returns its count. */
static int track_wait(track *k, int n)
{
    pthread_mutex_lock(&k->mu);
    while (k->n < n && !k->done) pthread_cond_wait(&k->cv, &k->mu);
    int got = k->n;
    pthread_mutex_unlock(&k->mu);
    return got;
}

static void track_wait_done(track *k)
{
    pthread_mutex_lock(&k->mu);
    while (!k->done) pthread_cond_wait(&k->cv, &k->mu);
    pthread_mutex_unlock(&k->mu);
}

/* Content events of k in [t0, t1). */
static int track_count(track *k, uint64_t t0, uint64_t t1)
{
    pthread_mutex_lock(&k->mu);
    int c = 0;
    for (int i = 0; i < k->n; i++) c += k->t[i] >= t0 && k->t[i] < t1;
    pthread_mutex_unlock(&k->mu);
    return c;
}

/* A request of prompt token ids 10 + (i * 7 + salt) % 480, n of them. */
static char *tokens_request(int32_t n, int32_t salt, int32_t max_tokens)
{
    size_t cap = (size_t)n * 8 + 256;
    char *s = malloc(cap);
    assert_non_null(s);
    size_t o = (size_t)snprintf(s, cap, "{\"prompt_tokens\": [");
    for (int32_t i = 0; i < n; i++) o += (size_t)snprintf(s + o, cap - o, "%s%d", i ? "," : "", 10 + (i * 7 + salt) % 480);
    snprintf(s + o, cap - o, "], \"max_tokens\": %d, \"temperature\": 0, \"ignore_eos\": true}", max_tokens);
    return s;
}

/* One try: stream A alone, then beside B's prefill of a prompt about four
 * seconds of A's tokens long (1000..3000: sanitizer builds are slow).
 * Returns rate during / rate alone. */
static double share_try(keel_engine *e, int attempt)
{
    track a, b;
    track_init(&a);
    track_init(&b);
    uint64_t ida = 0, idb = 0;
    char *ra = tokens_request(16, 3 + attempt, 12000);
    assert_ok(keel_engine_submit(e, ra, track_cb, &a, &ida));
    free(ra);
    /* alone: 200 tokens after 20 of warm-up (and again after B, below) */
    track_wait(&a, 20);
    uint64_t t0 = cpu_ns();
    track_wait(&a, 220);
    uint64_t t1 = cpu_ns();
    double alone = (double)track_count(&a, t0, t1) / ((double)(t1 - t0) * 1e-9);
    int32_t n_prompt = (int32_t)(4.0 * alone);
    n_prompt = n_prompt < 1000 ? 1000 : n_prompt > 3000 ? 3000 : n_prompt;
    /* beside B's prefill (B's DONE comes after its first token) */
    char *rb = tokens_request(n_prompt, 5 + attempt, 1);
    uint64_t t2 = cpu_ns(), w2 = keel_time_ns();
    assert_ok(keel_engine_submit(e, rb, track_cb, &b, &idb));
    free(rb);
    track_wait_done(&b);
    double wall = (double)(keel_time_ns() - w2) * 1e-9;
    assert_int_equal(b.status, KEEL_OK);
    uint64_t t3 = b.c_done;
    int during_n = track_count(&a, t2, t3);
    double during = (double)during_n / ((double)(t3 - t2) * 1e-9);
    /* alone again, after it: A's context grew during B's prefill (its own
     * tokens cost more to attend to), so "alone" is the rate over both
     * windows, before and after */
    int n_after = track_wait(&a, track_wait(&a, 0) + 20);
    uint64_t t4 = cpu_ns();
    track_wait(&a, n_after + 200);
    uint64_t t5 = cpu_ns();
    alone = (double)(track_count(&a, t0, t1) + track_count(&a, t4, t5)) / ((double)(t1 - t0 + t5 - t4) * 1e-9);
    assert_ok(keel_engine_cancel_request(e, ida));
    track_wait_done(&a);
    assert_false(a.done && strcmp(a.finish, "length") == 0); /* A outlasted B's prefill */
    printf("# decode alone %.0f tok/s; during a %d-token prefill (%.2f s, %.2f s of CPU) %d tokens, %.0f tok/s: "
           "%.2f\n",
           alone, n_prompt, wall, (double)(t3 - t2) * 1e-9, during_n, during, during / alone);
    track_destroy(&a);
    track_destroy(&b);
    return during / alone;
}

/* share_try on an engine with the options extra, up to five tries: the
 * best ratio is at least 0.5. */
static void decode_share(const char *extra)
{
    keel_engine *e = open_engine(g_small, extra);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, run_loop, e), 0);
    double best = 0;
    for (int attempt = 0; attempt < 5 && best < 0.5; attempt++) {
        double r = share_try(e, attempt);
        if (r > best) best = r;
    }
    keel_engine_stop(e);
    void *rv;
    pthread_join(th, &rv);
    assert_int_equal((intptr_t)rv, KEEL_OK);
    keel_engine_close(e);
    if (best < 0.5) fail_msg("decode during a long prefill: %.2f of its rate alone (want >= 0.5)", best);
}

static void test_decode_share(void **state)
{
    (void)state;
    decode_share("\"n_slots\": 2, \"n_ctx\": 32768, \"n_batch\": 512, \"n_ubatch\": 512");
}

/* The same while the stream drafts four tokens at every step (the model
 * drafting for itself, the back-off off: every draft accepted). Its
 * decode-only steps then always held five tokens, never the one token of
 * a plain step that the prefill budget's reference was kept for, so the
 * budget stayed 0 and B's prompt waited for A to end (A's 12,000 tokens
 * ran out first: share_try's cancel of A found it gone, after 90 s). */
static void test_decode_share_drafting(void **state)
{
    (void)state;
    char extra[256];
    snprintf(extra, sizeof extra,
             "\"n_slots\": 2, \"n_ctx\": 32768, \"n_batch\": 512, \"n_ubatch\": 512, \"model_draft\": \"%s\", "
             "\"spec_adaptive\": false, \"spec_max\": 4",
             g_small);
    decode_share(extra);
}

/* keel_engine_stop and keel_engine_cancel_request while a 6144-token
 * prompt prefills (n_batch 2048: one step is several seconds on one
 * thread) return within a second; a short greedy request answers the same
 * before and after. */
static void test_stop_during_prefill(void **state)
{
    (void)state;
    const char *opts = "\"n_slots\": 1, \"n_ctx\": 8192, \"n_batch\": 2048, \"n_ubatch\": 512";
    keel_engine *e = open_engine(g_big, opts);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, run_loop, e), 0);
    /* the short request, once */
    track s1;
    track_init(&s1);
    uint64_t id = 0;
    char *rs = tokens_request(8, 1, 4);
    assert_ok(keel_engine_submit(e, rs, track_cb, &s1, &id));
    track_wait_done(&s1);
    assert_int_equal(s1.status, KEEL_OK);
    /* a long prompt, cancelled while it prefills */
    track p;
    track_init(&p);
    char *rp = tokens_request(6144, 2, 4);
    assert_ok(keel_engine_submit(e, rp, track_cb, &p, &id));
    usleep(700 * 1000);
    uint64_t t0 = keel_time_ns();
    assert_ok(keel_engine_cancel_request(e, id));
    track_wait_done(&p);
    double cancel_s = (double)(p.t_done - t0) * 1e-9;
    assert_int_equal(p.status, KEEL_ECANCELED);
    assert_string_equal(p.finish, "cancelled");
    assert_int_equal(p.n, 0);
    /* the engine answers as before */
    track s2;
    track_init(&s2);
    assert_ok(keel_engine_submit(e, rs, track_cb, &s2, &id));
    track_wait_done(&s2);
    assert_int_equal(s2.status, KEEL_OK);
    assert_int_equal(s2.n, s1.n);
    /* stop during a long prefill */
    track q;
    track_init(&q);
    assert_ok(keel_engine_submit(e, rp, track_cb, &q, &id));
    usleep(700 * 1000);
    uint64_t t1 = keel_time_ns();
    keel_engine_stop(e);
    void *rv;
    pthread_join(th, &rv);
    double stop_s = (double)(keel_time_ns() - t1) * 1e-9;
    assert_int_equal((intptr_t)rv, KEEL_OK);
    assert_true(q.done);
    assert_int_equal(q.status, KEEL_ECANCELED);
    printf("# cancel_request during a prefill: %.3f s; keel_engine_stop: %.3f s\n", cancel_s, stop_s);
    free(rs);
    free(rp);
    keel_engine_close(e);
    track_destroy(&s1);
    track_destroy(&s2);
    track_destroy(&p);
    track_destroy(&q);
    assert_true(cancel_s < 1.0);
    assert_true(stop_s < 1.0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_share),
        cmocka_unit_test(test_decode_share_drafting),
        cmocka_unit_test(test_stop_during_prefill),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
