/*
 * test_engine_api.c — the embedding API as a binding uses it (keel.h only):
 * regressions found while binding keel_engine from Python (ctypes).
 *   - keel_engine_cancel with nothing running does not cancel the next
 *     request, with or without a scheduler loop (it used to set a sticky
 *     flag: the next keel_complete, or every later submitted request of a
 *     loop, ended "cancelled");
 *   - keel_engine_stats after keel_engine_reset reports the cleared slots
 *     (it used to report the cache as of the last step);
 *   - keel_complete from several threads while a loop runs: every caller
 *     gets its own response (the shared last response was swapped without
 *     the lock);
 *   - keel_engine_stats names a built-in template given at open (the name
 *     pointed into the freed options JSON);
 *   - keel_engine_run started while a keel_complete steps the engine on its
 *     own thread waits for it (both used to step the slots at once);
 *   - keel_engine_slot_restore refuses a file whose token history disagrees
 *     with its cells or holds ids out of the vocabulary, the slot unchanged
 *     (such files were restored and the next turn reused the wrong
 *     tokens); keel_engine_slot_save does not replace a FIFO.
 * Responses are parsed with JSON_ALLOW_NUL: a random model may generate a
 * NUL byte, which the response JSON carries as \\u0000.
 */
#include "testutil.h"

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_model[64];

static int setup(void **state)
{
    (void)state;
    return test_gen_qwen2(g_model, sizeof g_model, "engine_api", 1, 11) ? 0 : -1;
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
    snprintf(opts, sizeof opts, "{\"model\": \"%s\", \"n_threads\": 1, \"n_ctx\": 512%s%s}", g_model,
             extra ? ", " : "", extra ? extra : "");
    keel_engine *e = NULL;
    keel_status st = keel_engine_open(opts, &e, err);
    if (st != KEEL_OK) fail_msg("engine open: %s: %s", keel_status_name(st), err);
    return e;
}

static const char *MSGS = "[{\"role\":\"user\",\"content\":\"The little dog ran to the park and\"}]";
static const char *OPTS4 = "{\"max_tokens\": 4, \"temperature\": 0, \"ignore_eos\": true}";

static json_t *parse(const char *s)
{
    json_t *j = json_loads(s, JSON_ALLOW_NUL, NULL);
    if (!j) fail_msg("not JSON: %s", s);
    return j;
}

static const char *str_of(json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "(none)";
}

static int64_t usage(json_t *r, const char *k)
{
    return json_integer_value(json_object_get(json_object_get(r, "usage"), k));
}

static void test_cancel_idle_then_complete(void **state)
{
    (void)state;
    keel_engine *e = open_engine(NULL);
    char resp[8192];
    keel_engine_cancel(e); /* nothing is queued or running: cancels nothing */
    assert_ok(keel_complete(e, MSGS, OPTS4, NULL, NULL, NULL, resp, sizeof resp));
    json_t *r = parse(resp);
    assert_string_equal(str_of(r, "finish_reason"), "length");
    assert_int_equal(usage(r, "completion_tokens"), 4);
    json_decref(r);
    keel_engine_close(e);
}

/* ---- a scheduler loop ------------------------------------------------------------ */

typedef struct waiter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, content;
    keel_status status;
    char finish[32];
} waiter;

static bool wait_cb(void *user, const keel_event *ev)
{
    waiter *w = user;
    pthread_mutex_lock(&w->mu);
    if (ev->kind == KEEL_EVENT_CONTENT) w->content++;
    if (ev->kind == KEEL_EVENT_DONE) {
        json_t *r = json_loads(ev->response, JSON_ALLOW_NUL, NULL);
        snprintf(w->finish, sizeof w->finish, "%s", r ? str_of(r, "finish_reason") : "(bad JSON)");
        if (r) json_decref(r);
        w->status = ev->status;
        w->done++;
    }
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    return true;
}

static void waiter_init(waiter *w)
{
    memset(w, 0, sizeof *w);
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
}

static void waiter_destroy(waiter *w)
{
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
}

/* Waits until w has seen `done` DONE events or `content` content events. */
static void waiter_wait(waiter *w, int done, int content)
{
    pthread_mutex_lock(&w->mu);
    while (w->done < done && (content == 0 || w->content < content)) pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
}

static void *run_loop(void *p)
{
    keel_status st = keel_engine_run(p);
    return (void *)(intptr_t)st;
}

static void submit(keel_engine *e, const char *extra, waiter *w)
{
    char req[1024];
    uint64_t id = 0;
    snprintf(req, sizeof req, "{\"messages\": %s, \"temperature\": 0, \"ignore_eos\": true, %s}", MSGS, extra);
    assert_ok(keel_engine_submit(e, req, wait_cb, w, &id));
    assert_true(id > 0);
}

static void test_cancel_in_loop(void **state)
{
    (void)state;
    keel_engine *e = open_engine("\"kv_compact\": {\"policy\": \"window\", \"trigger\": 128, \"target\": 64}");
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, run_loop, e), 0);
    /* idle cancel, then a request: it completes */
    keel_engine_cancel(e);
    waiter a;
    waiter_init(&a);
    submit(e, "\"max_tokens\": 3", &a);
    waiter_wait(&a, 1, 0);
    assert_int_equal(a.status, KEEL_OK);
    assert_string_equal(a.finish, "length");
    /* a request that would run forever, cancelled once it streams */
    waiter b;
    waiter_init(&b);
    submit(e, "\"max_tokens\": -1", &b);
    waiter_wait(&b, 1, 3);
    keel_engine_cancel(e);
    waiter_wait(&b, 1, 0);
    assert_int_equal(b.status, KEEL_ECANCELED);
    assert_string_equal(b.finish, "cancelled");
    /* and the next one is not cancelled */
    waiter c;
    waiter_init(&c);
    submit(e, "\"max_tokens\": 3", &c);
    waiter_wait(&c, 1, 0);
    assert_int_equal(c.status, KEEL_OK);
    assert_string_equal(c.finish, "length");
    keel_engine_stop(e);
    void *rv;
    pthread_join(th, &rv);
    assert_int_equal((intptr_t)rv, KEEL_OK);
    waiter_destroy(&a);
    waiter_destroy(&b);
    waiter_destroy(&c);
    keel_engine_close(e);
}

/* ---- stats after reset ----------------------------------------------------------- */

static json_t *stats(keel_engine *e)
{
    char buf[8192];
    size_t n = 0;
    assert_ok(keel_engine_stats(e, buf, sizeof buf, &n));
    assert_int_equal(n, strlen(buf) + 1);
    return parse(buf);
}

static int64_t slot0(json_t *s, const char *k)
{
    json_t *v = json_object_get(json_array_get(json_object_get(s, "slots"), 0), k);
    if (!json_is_integer(v)) fail_msg("slots[0].%s is not an integer", k);
    return json_integer_value(v);
}

static void test_stats_after_reset(void **state)
{
    (void)state;
    keel_engine *e = open_engine(NULL);
    char resp[8192];
    assert_ok(keel_complete(e, MSGS, OPTS4, NULL, NULL, NULL, resp, sizeof resp));
    json_t *r = parse(resp);
    json_t *s = stats(e);
    /* the cache holds the prompt and all but the last generated token */
    assert_int_equal(slot0(s, "cached_tokens"), usage(r, "prompt_tokens") + 3);
    assert_true(slot0(s, "cells") > 0);
    json_decref(s);
    json_decref(r);
    assert_ok(keel_engine_reset(e));
    s = stats(e);
    assert_int_equal(slot0(s, "cached_tokens"), 0);
    assert_int_equal(slot0(s, "cells"), 0);
    json_decref(s);
    /* the next turn starts from an empty cache */
    assert_ok(keel_complete(e, MSGS, OPTS4, NULL, NULL, NULL, resp, sizeof resp));
    r = parse(resp);
    assert_int_equal(usage(r, "cached_tokens"), 0);
    json_decref(r);
    keel_engine_close(e);
}

/* A built-in template named at open: stats name it after the options JSON
 * is gone (the name pointed into the freed options: garbage or ENOMEM). */
static void test_stats_builtin_template(void **state)
{
    (void)state;
    keel_engine *e = open_engine("\"chat_template\": \"qwen3\"");
    char resp[8192];
    assert_ok(keel_complete(e, MSGS, OPTS4, NULL, NULL, NULL, resp, sizeof resp));
    json_t *s = stats(e);
    assert_string_equal(str_of(s, "chat_template"), "qwen3");
    assert_string_equal(str_of(s, "tool_format"), "hermes");
    json_decref(s);
    keel_engine_close(e);
}

/* The tool-call format comes from the template's source wherever it was
 * read from: a template in a file used to get "content" (detection was
 * skipped), the same source inline got its format. */
static void test_template_file_format(void **state)
{
    (void)state;
    static const char src[] = "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                              "{%- endfor %}{%- if tools %}<tool_call>\n<function=x>\n<parameter=y>\n"
                              "{%- endif %}<|im_start|>assistant\n";
    char path[64], opts[512];
    assert_true(test_temp_file(path, sizeof path, "tmpl_fmt"));
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(fputs(src, f) >= 0, 1);
    assert_int_equal(fclose(f), 0);
    snprintf(opts, sizeof opts, "\"chat_template\": \"%s\"", path);
    keel_engine *e = open_engine(opts);
    json_t *s = stats(e);
    assert_string_equal(str_of(s, "chat_template"), "file");
    assert_string_equal(str_of(s, "tool_format"), "qwen3-coder");
    json_decref(s);
    keel_engine_close(e);
    json_t *inl = json_pack("{s:s}", "chat_template", src);
    char *kv = json_dumps(inl, JSON_COMPACT);
    kv[strlen(kv) - 1] = '\0'; /* the member alone, without its braces */
    e = open_engine(kv + 1);
    s = stats(e);
    assert_string_equal(str_of(s, "tool_format"), "qwen3-coder");
    json_decref(s);
    keel_engine_close(e);
    free(kv);
    json_decref(inl);
    unlink(path);
}

/* ---- keel_complete from several threads, a loop running --------------------------- */

typedef struct caller {
    keel_engine *e;
    int idx, ok;
    char why[256];
} caller;

static void *call_thread(void *p)
{
    caller *c = p;
    for (int i = 0; i < 6; i++) {
        char resp[8192], opts[128];
        int want = 1 + (c->idx + i) % 3;
        snprintf(opts, sizeof opts, "{\"max_tokens\": %d, \"temperature\": 0, \"ignore_eos\": true}", want);
        keel_status st = keel_complete(c->e, MSGS, opts, NULL, NULL, NULL, resp, sizeof resp);
        json_t *r = st == KEEL_OK ? json_loads(resp, JSON_ALLOW_NUL, NULL) : NULL;
        int64_t got = r ? usage(r, "completion_tokens") : -1;
        if (r) json_decref(r);
        if (st != KEEL_OK || got != want) {
            snprintf(c->why, sizeof c->why, "call %d: %s (%s), %lld tokens (want %d)", i, keel_status_name(st),
                     keel_engine_last_error(c->e), (long long)got, want);
            return NULL;
        }
        c->ok++;
    }
    return NULL;
}

static void test_complete_threads_with_loop(void **state)
{
    (void)state;
    keel_engine *e = open_engine("\"n_slots\": 3");
    pthread_t loop, th[3];
    caller c[3];
    assert_int_equal(pthread_create(&loop, NULL, run_loop, e), 0);
    /* the loop runs once a submitted request is done (a keel_complete before
     * that would step the engine itself, and the others get KEEL_ESTATE) */
    waiter w;
    waiter_init(&w);
    submit(e, "\"max_tokens\": 1", &w);
    waiter_wait(&w, 1, 0);
    assert_int_equal(w.status, KEEL_OK);
    waiter_destroy(&w);
    for (int i = 0; i < 3; i++) {
        c[i] = (caller){e, i, 0, ""};
        assert_int_equal(pthread_create(&th[i], NULL, call_thread, &c[i]), 0);
    }
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    keel_engine_stop(e);
    pthread_join(loop, NULL);
    for (int i = 0; i < 3; i++)
        if (c[i].ok != 6) fail_msg("thread %d: %s", i, c[i].why);
    keel_engine_close(e);
}

/* ---- a loop started while keel_complete steps the engine -------------------------- */

static atomic_int g_inside, g_overlap;

/* Counts callbacks that run while another one runs (two threads stepping). */
static void enter_cb(void)
{
    if (atomic_fetch_add(&g_inside, 1) != 0) atomic_fetch_add(&g_overlap, 1);
    usleep(300);
    atomic_fetch_sub(&g_inside, 1);
}

typedef struct driver {
    keel_engine *e;
    pthread_t tid;
    atomic_int streaming, wrong_thread;
    keel_status st;
    int64_t tokens;
} driver;

static bool drive_cb(void *user, const keel_event *ev)
{
    driver *d = user;
    enter_cb();
    if (!pthread_equal(pthread_self(), d->tid)) atomic_fetch_add(&d->wrong_thread, 1);
    if (ev->kind == KEEL_EVENT_CONTENT) atomic_store(&d->streaming, 1);
    return true;
}

static bool submit_cb(void *user, const keel_event *ev)
{
    enter_cb();
    return wait_cb(user, ev);
}

static void *drive_thread(void *p)
{
    driver *d = p;
    char resp[16384];
    d->st = keel_complete(d->e, MSGS, "{\"max_tokens\": 48, \"temperature\": 0, \"ignore_eos\": true}", NULL,
                          drive_cb, d, resp, sizeof resp);
    json_t *r = d->st == KEEL_OK ? json_loads(resp, JSON_ALLOW_NUL, NULL) : NULL;
    d->tokens = r ? usage(r, "completion_tokens") : -1;
    if (r) json_decref(r);
    return NULL;
}

static void test_loop_starts_while_complete_runs(void **state)
{
    (void)state;
    keel_engine *e = open_engine("\"n_slots\": 2");
    driver d;
    memset(&d, 0, sizeof d);
    d.e = e;
    atomic_store(&g_inside, 0);
    atomic_store(&g_overlap, 0);
    assert_int_equal(pthread_create(&d.tid, NULL, drive_thread, &d), 0);
    while (!atomic_load(&d.streaming)) usleep(500);
    /* the loop must wait for the driving keel_complete; a request submitted
     * now runs on the loop, not beside it */
    pthread_t loop;
    assert_int_equal(pthread_create(&loop, NULL, run_loop, e), 0);
    waiter w;
    waiter_init(&w);
    char req[512];
    uint64_t id = 0;
    snprintf(req, sizeof req, "{\"messages\": %s, \"max_tokens\": 8, \"temperature\": 0, \"ignore_eos\": true}", MSGS);
    assert_ok(keel_engine_submit(e, req, submit_cb, &w, &id));
    waiter_wait(&w, 1, 0);
    pthread_join(d.tid, NULL);
    keel_engine_stop(e);
    pthread_join(loop, NULL);
    assert_int_equal(d.st, KEEL_OK);
    assert_int_equal(d.tokens, 48);
    assert_int_equal(atomic_load(&d.wrong_thread), 0);
    assert_int_equal(atomic_load(&g_overlap), 0);
    assert_int_equal(w.status, KEEL_OK);
    assert_string_equal(w.finish, "length");
    waiter_destroy(&w);
    keel_engine_close(e);
}

/* Slot restore checks the file's token history against its cells, and its
 * ids against the vocabulary, before the slot changes: a history longer or
 * shorter than the cells, pending tokens that are in the cache, an id out
 * of the vocabulary or no history at all are refused, named, and the slot
 * keeps its cache (they used to be restored: a history of 100 tokens over
 * 40 cells, and the next turn reused tokens the cache did not hold). A slot
 * save never replaces a FIFO (the temporary file used to be renamed over
 * it). The bad files are written by keel_session_save from a context on
 * the same model, so their checksums are valid. */
static void test_slot_restore_checks_history(void **state)
{
    (void)state;
    keel_engine *e = open_engine(NULL);
    char resp[8192], info[512];
    assert_ok(keel_complete(e, MSGS, OPTS4, NULL, NULL, NULL, resp, sizeof resp));
    json_t *s = stats(e);
    int64_t cached = slot0(s, "cached_tokens"), cells = slot0(s, "cells");
    json_decref(s);
    assert_true(cached > 10 && cells > 0);
    char dir[64], good[128], bad[128], fifo[128];
    snprintf(dir, sizeof dir, "/tmp/keel_slothist_XXXXXX");
    assert_non_null(mkdtemp(dir));
    snprintf(good, sizeof good, "%s/good", dir);
    snprintf(bad, sizeof bad, "%s/bad", dir);
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    assert_ok(keel_engine_slot_save(e, 0, good, info, sizeof info));
    /* a context on the same model reads the slot's file and writes edited ones */
    keel_model_params mp = keel_model_params_default();
    mp.path = g_model;
    keel_model *m = NULL;
    char err[256];
    if (keel_model_open(&mp, &m, err) != KEEL_OK) fail_msg("model: %s", err);
    keel_model_info mi;
    keel_model_info_get(m, &mi);
    keel_context_params cp = keel_context_params_default();
    cp.n_ctx = 512;
    cp.n_threads = 1;
    keel_context *c = NULL;
    if (keel_context_open(m, &cp, &c, err) != KEEL_OK) fail_msg("context: %s", err);
    int32_t hist[600], nt = 0, np = -1;
    keel_status st = keel_session_load(c, 0, good, 0, hist, 540, &nt, &np);
    if (st != KEEL_OK) fail_msg("load: %s", keel_context_last_error(c));
    assert_int_equal(nt, cached);
    assert_int_equal(np, 0);
    for (int32_t i = nt; i < 600; i++) hist[i] = 5 + i % 50;
    const struct {
        const char *what;
        int32_t n, pending, oov_at;
        const char *want;
    } cases[] = {
        {"longer", nt + 60, 0, -1, "token history disagrees with the cells"},
        {"shorter", nt - 10, 0, -1, "token history disagrees with the cells"},
        {"pending in the cache", nt, 5, -1, "are pending (not in the cache), but the cells reach position"},
        {"out of the vocabulary", nt, 0, 3, "outside this model's vocabulary"},
        {"no history", 0, 0, -1, "no token history"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int32_t keep = cases[i].oov_at >= 0 ? hist[cases[i].oov_at] : 0;
        if (cases[i].oov_at >= 0) hist[cases[i].oov_at] = mi.n_vocab + 7;
        assert_ok(keel_session_save(c, 0, hist, cases[i].n, cases[i].pending, bad));
        if (cases[i].oov_at >= 0) hist[cases[i].oov_at] = keep;
        st = keel_engine_slot_restore(e, 0, bad, info, sizeof info);
        if (st != KEEL_EFORMAT || !strstr(keel_engine_last_error(e), cases[i].want))
            fail_msg("%s: %s '%s', want KEEL_EFORMAT '%s'", cases[i].what, keel_status_name(st),
                     keel_engine_last_error(e), cases[i].want);
        s = stats(e);
        assert_int_equal(slot0(s, "cached_tokens"), cached);
        assert_int_equal(slot0(s, "cells"), cells);
        json_decref(s);
    }
    /* a FIFO is not replaced by a slot save */
    assert_int_equal(mkfifo(fifo, 0600), 0);
    assert_status(keel_engine_slot_save(e, 0, fifo, info, sizeof info), KEEL_EIO);
    assert_non_null(strstr(keel_engine_last_error(e), "not a regular file"));
    struct stat sb;
    assert_int_equal(lstat(fifo, &sb), 0);
    assert_true(S_ISFIFO(sb.st_mode));
    /* the slot kept its cache: the same conversation reuses it */
    assert_ok(keel_complete(e, MSGS, OPTS4, NULL, NULL, NULL, resp, sizeof resp));
    json_t *r = parse(resp);
    assert_int_equal(usage(r, "cached_tokens"), usage(r, "prompt_tokens") - 1);
    json_decref(r);
    /* and the file with the agreeing history restores */
    assert_ok(keel_engine_slot_restore(e, 0, good, info, sizeof info));
    s = stats(e);
    assert_int_equal(slot0(s, "cached_tokens"), cached);
    assert_int_equal(slot0(s, "cells"), cells);
    json_decref(s);
    keel_context_close(c);
    keel_model_close(m);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    keel_engine_close(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cancel_idle_then_complete),
        cmocka_unit_test(test_cancel_in_loop),
        cmocka_unit_test(test_stats_after_reset),
        cmocka_unit_test(test_template_file_format),
        cmocka_unit_test(test_stats_builtin_template),
        cmocka_unit_test(test_complete_threads_with_loop),
        cmocka_unit_test(test_loop_starts_while_complete_runs),
        cmocka_unit_test(test_slot_restore_checks_history),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
