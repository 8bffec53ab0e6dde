/*
 * test_server_load.c — keel serve under concurrency: 8 concurrent streams on
 * 4 slots at temperature 0 give exactly the outputs of the same requests
 * run one at a time (--deterministic: batch-invariant numerics); a client
 * that disconnects mid-stream, or before a non-streaming answer, has its
 * request cancelled and its slot freed; 50 random disconnects while other
 * clients keep the slots busy leave every request accounted for, every
 * slot idle, the other clients' answers intact and the server alive (under
 * ASan: no leak at exit).
 */
#include "testutil.h"
#include "server_util.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* The exact comparison needs the engine's deterministic mode (merged). */
#define SERVER_TEST_EXACT_BATCH 1

static char g_model[64];

static int setup(void **state)
{
    (void)state;
    return srvt_gen_model(g_model, sizeof g_model, "qwen2", 64, 2, 0, 11) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    unlink(g_model);
    return 0;
}



/* ---- 8 concurrent streams vs one at a time ------------------------------------------- */

static const char *const PROMPTS[8] = {
    "The dog ran to the park", "A cat sat on the mat", "Once upon a time there was", "The sun was bright",
    "Tom and Lily went to", "The little bird sang", "Mom made a big cake", "The boat sailed far away",
};

typedef struct stream_job {
    int port, idx;
    char text[8192];
    int64_t completion;
    bool ok;
} stream_job;

static void run_stream(stream_job *j)
{
    char body[512];
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}],\"max_tokens\":24,\"temperature\":0,"
             "\"ignore_eos\":true,\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
             PROMPTS[j->idx]);
    srv_http_resp r;
    j->ok = srv_http_request("127.0.0.1", j->port, "POST", "/v1/chat/completions", NULL, body, &r, 120000 * srvt_slow()) &&
            r.status == 200;
    srvt_events ev = {0};
    j->ok = j->ok && srvt_parse_sse(r.body.p, r.body.len, &ev);
    size_t n = 0;
    j->text[0] = 0;
    for (size_t i = 0; j->ok && i < json_array_size(ev.data); i++) {
        json_t *d = json_array_get(ev.data, i);
        const char *t = srvt_str(d, "choices.0.delta.content");
        if (t && n + strlen(t) < sizeof j->text) {
            memcpy(j->text + n, t, strlen(t) + 1);
            n += strlen(t);
        }
        if (json_object_get(d, "usage")) j->completion = srvt_int(d, "usage.completion_tokens");
    }
    srvt_events_free(&ev);
    srv_http_resp_free(&r);
}

static void *stream_thread(void *p)
{
    run_stream(p);
    return NULL;
}

static void test_concurrent_equals_serial(void **state)
{
    (void)state;
    const char *args[] = {"-np", "4", "-c", "2048", "-t", "2", "--log-disable", "--deterministic", NULL};
    static stream_job serial[8], conc[8];
    srvt_proc p;
    assert_true(srvt_start(&p, g_model, args, true));
    for (int i = 0; i < 8; i++) {
        serial[i].port = p.port;
        serial[i].idx = i;
        run_stream(&serial[i]);
        assert_true(serial[i].ok);
        assert_int_equal(serial[i].completion, 24);
    }
    assert_int_equal(srvt_stop(&p, 10 * srvt_slow()), 0);
    /* a fresh server: the same requests, all at once */
    assert_true(srvt_start(&p, g_model, args, true));
    pthread_t th[8];
    for (int i = 0; i < 8; i++) {
        conc[i].port = p.port;
        conc[i].idx = i;
        assert_int_equal(pthread_create(&th[i], NULL, stream_thread, &conc[i]), 0);
    }
    for (int i = 0; i < 8; i++) pthread_join(th[i], NULL);
    int same = 0;
    for (int i = 0; i < 8; i++) {
        assert_true(conc[i].ok);
        assert_int_equal(conc[i].completion, 24);
        same += strcmp(conc[i].text, serial[i].text) == 0;
    }
    printf("8 concurrent streams on 4 slots: %d of 8 outputs equal to the one-at-a-time runs\n", same);
#if SERVER_TEST_EXACT_BATCH
    for (int i = 0; i < 8; i++)
        if (strcmp(conc[i].text, serial[i].text) != 0)
            fail_msg("request %d differs:\n  concurrent: %s\n  serial:     %s", i, conc[i].text, serial[i].text);
#endif
    assert_true(srvt_slots_idle(&p, 10 * srvt_slow()));
    assert_int_equal(srvt_stop(&p, 10 * srvt_slow()), 0);
}

/* ---- disconnects ---------------------------------------------------------------------- */

static const char *LONG_STREAM = "{\"messages\":[{\"role\":\"user\",\"content\":\"Tell me a long story\"}],"
                                 "\"max_tokens\":-1,\"ignore_eos\":true,\"stream\":true}";
static const char *LONG_PLAIN = "{\"messages\":[{\"role\":\"user\",\"content\":\"Tell me a long story\"}],"
                                "\"max_tokens\":-1,\"ignore_eos\":true}";

static bool stop_at_first(void *user, const char *p, size_t n)
{
    (void)p;
    (void)n;
    *(int *)user += 1;
    return false;
}

static void test_disconnect_mid_stream(void **state)
{
    (void)state;
    /* a long context with compaction: a generation runs until its client goes */
    const char *args[] = {"-np", "2", "-c", "65536", "--kv-compact", "window", "-t", "1", "--metrics", "--log-disable", NULL};
    srvt_proc p;
    assert_true(srvt_start(&p, g_model, args, true));
    double c0 = srvt_metric(&p, "keel_requests_cancelled_total");
    assert_true(c0 >= 0);
    /* streaming: read the first piece, then hang up */
    int fd = srv_http_connect("127.0.0.1", p.port);
    assert_true(fd >= 0);
    assert_true(srv_http_send(fd, "POST", "/v1/chat/completions", NULL, LONG_STREAM, strlen(LONG_STREAM)));
    srv_http_resp r;
    int pieces = 0;
    srv_http_read(fd, &r, 60000 * srvt_slow(), stop_at_first, &pieces);
    assert_int_equal(r.status, 200);
    assert_int_equal(pieces, 1);
    srv_http_resp_free(&r);
    close(fd);
    assert_int_equal(srvt_wait_metric(&p, "keel_requests_cancelled_total", c0 + 1, 5 * srvt_slow()), c0 + 1);
    assert_true(srvt_slots_idle(&p, 5 * srvt_slow()));
    /* not streaming: hang up while it generates */
    fd = srv_http_connect("127.0.0.1", p.port);
    assert_true(fd >= 0);
    assert_true(srv_http_send(fd, "POST", "/v1/chat/completions", NULL, LONG_PLAIN, strlen(LONG_PLAIN)));
    for (int i = 0; i < 500 * srvt_slow(); i++) {
        int st;
        json_t *s = srvt_get_json(&p, "/slots", &st);
        bool busy = json_is_true(json_object_get(json_array_get(s, 0), "is_processing")) ||
                    json_is_true(json_object_get(json_array_get(s, 1), "is_processing"));
        if (s) json_decref(s);
        if (busy) break;
        usleep(10000);
    }
    close(fd);
    assert_int_equal(srvt_wait_metric(&p, "keel_requests_cancelled_total", c0 + 2, 5 * srvt_slow()), c0 + 2);
    assert_true(srvt_slots_idle(&p, 5 * srvt_slow()));
    /* the server is fine afterwards */
    int st;
    json_t *j = srvt_post_json(&p, "/v1/chat/completions",
                               "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":3,\"ignore_eos\":true}", &st);
    assert_int_equal(st, 200);
    assert_int_equal(srvt_int(j, "usage.completion_tokens"), 3);
    json_decref(j);
    assert_int_equal(srvt_stop(&p, 10 * srvt_slow()), 0);
}

typedef struct load_ctx {
    int port;
    atomic_int stop;
    atomic_int ok, bad;
    atomic_int disconnects, submitted;
} load_ctx;

/* A well-behaved client: short requests, answers checked. */
static void *load_thread(void *p)
{
    load_ctx *c = p;
    int k = 0;
    while (!atomic_load(&c->stop)) {
        bool stream = (k++ & 1) != 0;
        const char *body = stream ? "{\"messages\":[{\"role\":\"user\",\"content\":\"Count to five\"}],\"max_tokens\":16,"
                                    "\"ignore_eos\":true,\"stream\":true,\"stream_options\":{\"include_usage\":true}}"
                                  : "{\"messages\":[{\"role\":\"user\",\"content\":\"Count to five\"}],\"max_tokens\":16,"
                                    "\"ignore_eos\":true}";
        srv_http_resp r;
        atomic_fetch_add(&c->submitted, 1);
        bool ok = srv_http_request("127.0.0.1", c->port, "POST", "/v1/chat/completions", NULL, body, &r,
                                   120000 * srvt_slow()) &&
                  r.status == 200;
        if (ok && stream) {
            srvt_events ev = {0};
            ok = srvt_parse_sse(r.body.p, r.body.len, &ev) &&
                 srvt_int(json_array_get(ev.data, json_array_size(ev.data) - 2), "usage.completion_tokens") == 16;
            srvt_events_free(&ev);
        } else if (ok) {
            json_t *j = json_loadb(r.body.p, r.body.len, JSON_ALLOW_NUL, NULL);
            ok = srvt_int(j, "usage.completion_tokens") == 16;
            if (j) json_decref(j);
        }
        if (!ok) fprintf(stderr, "load client: status %d: %.300s\n", r.status, r.body.p ? r.body.p : "");
        atomic_fetch_add(ok ? &c->ok : &c->bad, 1);
        srv_http_resp_free(&r);
    }
    return NULL;
}

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* A client that hangs up at a random moment. */
static void *disconnect_thread(void *p)
{
    load_ctx *c = p;
    uint64_t s = 0x1234567ull + (uint64_t)(uintptr_t)&s;
    for (;;) {
        int n = atomic_fetch_add(&c->disconnects, 1);
        if (n >= 50) break;
        bool stream = rnd(&s) & 1;
        const char *body = stream ? LONG_STREAM : LONG_PLAIN;
        int fd = srv_http_connect("127.0.0.1", c->port);
        if (fd < 0) continue;
        atomic_fetch_add(&c->submitted, 1);
        if (srv_http_send(fd, "POST", "/v1/chat/completions", NULL, body, strlen(body))) {
            int mode = (int)(rnd(&s) % 3);
            if (mode == 1 && stream) { /* after some bytes of the answer */
                char buf[4096];
                size_t want = 64 + rnd(&s) % 4096, got = 0;
                while (got < want) {
                    ssize_t k = recv(fd, buf, sizeof buf, 0);
                    if (k <= 0) break;
                    got += (size_t)k;
                }
            } else if (mode == 2) { /* after a random delay */
                usleep((useconds_t)(rnd(&s) % 200000));
            }
        }
        close(fd);
    }
    return NULL;
}

static void test_random_disconnects(void **state)
{
    (void)state;
    const char *args[] = {"-np", "4", "-c", "65536", "--kv-compact", "window", "-t", "2", "--metrics", "--log-disable", NULL};
    srvt_proc p;
    assert_true(srvt_start(&p, g_model, args, true));
    double r0 = srvt_metric(&p, "keel_requests_total");
    load_ctx c;
    memset(&c, 0, sizeof c);
    c.port = p.port;
    pthread_t lt[2], dt[6];
    for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&lt[i], NULL, load_thread, &c), 0);
    for (int i = 0; i < 6; i++) assert_int_equal(pthread_create(&dt[i], NULL, disconnect_thread, &c), 0);
    for (int i = 0; i < 6; i++) pthread_join(dt[i], NULL);
    atomic_store(&c.stop, 1);
    for (int i = 0; i < 2; i++) pthread_join(lt[i], NULL);
    srvt_wait_metric(&p, "keel_requests_total", r0 + atomic_load(&c.submitted), 10 * srvt_slow());
    assert_true(srvt_slots_idle(&p, 10 * srvt_slow()));
    double r1 = srvt_metric(&p, "keel_requests_total"), cancelled = srvt_metric(&p, "keel_requests_cancelled_total");
    double failed = srvt_metric(&p, "keel_requests_failed_total");
    printf("random disconnects: %d load requests answered (%d bad), 50 disconnects; the engine saw %.0f requests "
           "(%.0f cancelled, %.0f failed)\n",
           atomic_load(&c.ok), atomic_load(&c.bad), r1 - r0, cancelled, failed);
    assert_int_equal(atomic_load(&c.bad), 0);
    assert_true(atomic_load(&c.ok) > 0);
    /* every request ended exactly once; the hung-up ones were cancelled */
    assert_int_equal((int)(r1 - r0), atomic_load(&c.submitted));
    assert_int_equal(cancelled, 50);
    assert_int_equal(failed, 0);
    assert_true(srvt_alive(&p));
    assert_int_equal(srvt_stop(&p, 10 * srvt_slow()), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_concurrent_equals_serial),
        cmocka_unit_test(test_disconnect_mid_stream),
        cmocka_unit_test(test_random_disconnects),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
