/*
 * server_util.c — see server_util.h: the child-process harness of the
 * keel serve tests. The server's stdout is a pipe the harness reads for the
 * "listening on http://127.0.0.1:PORT" line; its stderr is inherited (ctest
 * shows it on failure).
 */
#include "server_util.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SRVT_TSAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__) && !defined(SRVT_TSAN)
#define SRVT_TSAN 1
#endif

/* A thread-sanitized build (its every memory access checked) is slower
 * than an address-sanitized one: test_first_bytes's long prompt took its
 * server more than nine minutes of prefill under TSan on a slow host,
 * against the 25 a test may take. */
int srvt_slow(void)
{
#ifdef SRVT_TSAN
    return 6;
#else
    return getenv("KEEL_ASAN") ? 6 : 1;
#endif
}

bool srvt_gen_model(char *path, size_t cap, const char *arch, int32_t n_embd, int32_t n_layer, int32_t n_swa,
                    uint64_t seed)
{
    snprintf(path, cap, "/tmp/keel_srvtest_XXXXXX");
    int fd = mkstemp(path);
    if (fd < 0) return false;
    close(fd);
    keel_gen_params gp = keel_gen_params_default();
    gp.arch = arch;
    gp.n_embd = n_embd;
    gp.n_layer = n_layer;
    gp.n_head = 4;
    gp.n_head_kv = 2;
    gp.n_swa = n_swa;
    gp.seed = seed;
    char err[256];
    if (keel_gen_model(&gp, path, err) != KEEL_OK) {
        fprintf(stderr, "gen model: %s\n", err);
        unlink(path);
        return false;
    }
    return true;
}

/* Children still running: killed at exit, so a failed assertion (cmocka
 * jumps out of the test) leaves no server behind. */
static pid_t g_children[16];

static void kill_children(void)
{
    for (int i = 0; i < 16; i++)
        if (g_children[i] > 0) {
            kill(g_children[i], SIGKILL);
            waitpid(g_children[i], NULL, 0);
            g_children[i] = 0;
        }
}

static void track(pid_t pid, bool add)
{
    static bool registered;
    if (!registered) {
        atexit(kill_children);
        registered = true;
    }
    for (int i = 0; i < 16; i++)
        if (add ? g_children[i] == 0 : g_children[i] == pid) {
            g_children[i] = add ? pid : 0;
            return;
        }
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Reads what the child printed for up to ms; false at EOF. */
static bool read_out(srvt_proc *p, int ms)
{
    struct pollfd pf = {p->out_fd, POLLIN, 0};
    if (poll(&pf, 1, ms) <= 0) return true;
    char buf[4096];
    ssize_t n = read(p->out_fd, buf, sizeof buf);
    if (n <= 0) return false;
    srv_buf_add(&p->out, buf, (size_t)n);
    return true;
}

bool srvt_start(srvt_proc *p, const char *model, const char *const *args, bool wait_ready)
{
    memset(p, 0, sizeof p[0]);
    p->pid = -1;
    const char *bin = getenv("KEEL_BIN");
    if (!bin) {
        fprintf(stderr, "KEEL_BIN is not set\n");
        return false;
    }
    const char *argv[64];
    int k = 0;
    argv[k++] = bin;
    argv[k++] = "serve";
    argv[k++] = "-m";
    argv[k++] = model;
    argv[k++] = "--host";
    argv[k++] = "127.0.0.1";
    argv[k++] = "--port";
    argv[k++] = "0";
    for (int i = 0; args && args[i] && k < 63; i++) argv[k++] = args[i];
    argv[k] = NULL;
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return false;
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return false;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the test */
        dup2(fds[1], 1);
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    close(fds[1]);
    p->pid = pid;
    track(pid, true);
    p->out_fd = fds[0];
    uint64_t t0 = now_ms(), limit = 60000u * (uint64_t)srvt_slow();
    while (now_ms() - t0 < limit) {
        const char *l = p->out.p ? strstr(p->out.p, "listening on http://127.0.0.1:") : NULL;
        if (l) {
            p->port = atoi(l + strlen("listening on http://127.0.0.1:"));
            break;
        }
        if (!read_out(p, 100)) break;
    }
    if (p->port <= 0) {
        fprintf(stderr, "keel serve did not start; it printed: %s\n", p->out.p ? p->out.p : "");
        srvt_stop(p, 5);
        return false;
    }
    if (!wait_ready) return true;
    while (now_ms() - t0 < limit) {
        if (srvt_alive(p)) return true;
        read_out(p, 50);
        int st;
        if (waitpid(p->pid, &st, WNOHANG) == p->pid) {
            fprintf(stderr, "keel serve exited while loading; it printed: %s\n", p->out.p ? p->out.p : "");
            track(p->pid, false);
            p->pid = -1;
            return false;
        }
    }
    fprintf(stderr, "keel serve never became ready\n");
    srvt_stop(p, 5);
    return false;
}

int srvt_stop(srvt_proc *p, int timeout_s)
{
    int code = -1;
    if (p->pid > 0) {
        kill(p->pid, SIGTERM);
        uint64_t t0 = now_ms();
        int st = 0;
        pid_t w = 0;
        while ((w = waitpid(p->pid, &st, WNOHANG)) == 0 && now_ms() - t0 < (uint64_t)timeout_s * 1000u) {
            struct timespec ts = {0, 20 * 1000000L};
            nanosleep(&ts, NULL);
        }
        if (w == 0) {
            fprintf(stderr, "keel serve did not exit within %d s of SIGTERM: killed\n", timeout_s);
            kill(p->pid, SIGKILL);
            waitpid(p->pid, &st, 0);
            code = -1;
        } else if (w == p->pid && WIFEXITED(st)) {
            code = WEXITSTATUS(st);
        } else if (w == p->pid && WIFSIGNALED(st)) {
            fprintf(stderr, "keel serve died of signal %d\n", WTERMSIG(st));
        }
        track(p->pid, false);
        p->pid = -1;
    }
    if (p->out_fd > 0) close(p->out_fd);
    p->out_fd = -1;
    srv_buf_free(&p->out);
    return code;
}

int srvt_wait_exit(srvt_proc *p, int timeout_s)
{
    int code = -2;
    uint64_t t0 = now_ms();
    while (p->pid > 0 && now_ms() - t0 < (uint64_t)timeout_s * 1000u) {
        int st;
        if (waitpid(p->pid, &st, WNOHANG) == p->pid) {
            code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
            track(p->pid, false);
            p->pid = -1;
            break;
        }
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    return code;
}

int srvt_req(const srvt_proc *p, const char *method, const char *path, const char *extra, const char *body,
             srv_http_resp *r)
{
    bool ok = srv_http_request("127.0.0.1", p->port, method, path, extra, body, r, 120000 * srvt_slow());
    return ok ? r->status : -1;
}

static json_t *parse_resp(srv_http_resp *r)
{
    json_t *j = r->body.p ? json_loadb(r->body.p, r->body.len, JSON_ALLOW_NUL, NULL) : NULL;
    srv_http_resp_free(r);
    return j;
}

json_t *srvt_post_json(const srvt_proc *p, const char *path, const char *body, int *status)
{
    srv_http_resp r;
    *status = srvt_req(p, "POST", path, NULL, body, &r);
    return parse_resp(&r);
}

json_t *srvt_get_json(const srvt_proc *p, const char *path, int *status)
{
    srv_http_resp r;
    *status = srvt_req(p, "GET", path, NULL, NULL, &r);
    return parse_resp(&r);
}

double srvt_metric(const srvt_proc *p, const char *name)
{
    srv_http_resp r;
    double v = -1;
    if (srvt_req(p, "GET", "/metrics", NULL, NULL, &r) == 200 && r.body.p) {
        char key[128];
        snprintf(key, sizeof key, "\n%s ", name);
        const char *q = strstr(r.body.p, key);
        if (q) v = atof(q + strlen(key));
    }
    srv_http_resp_free(&r);
    return v;
}

double srvt_wait_metric(const srvt_proc *p, const char *name, double want, int timeout_s)
{
    double v = -1;
    for (int i = 0; i < timeout_s * 50; i++) {
        v = srvt_metric(p, name);
        if (v >= want) break;
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    return v;
}

bool srvt_alive(const srvt_proc *p)
{
    srv_http_resp r;
    bool ok = srv_http_request("127.0.0.1", p->port, "GET", "/health", NULL, NULL, &r, 5000 * srvt_slow()) &&
              r.status == 200;
    srv_http_resp_free(&r);
    return ok;
}

bool srvt_slots_idle(const srvt_proc *p, int timeout_s)
{
    uint64_t t0 = now_ms();
    do {
        int st;
        json_t *s = srvt_get_json(p, "/slots", &st);
        bool idle = st == 200 && json_array_size(s) > 0;
        size_t i;
        json_t *sl;
        json_array_foreach(s, i, sl) idle = idle && json_is_false(json_object_get(sl, "is_processing"));
        if (s) json_decref(s);
        if (idle) return true;
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
    } while (now_ms() - t0 < (uint64_t)timeout_s * 1000u);
    return false;
}

bool srvt_parse_sse(const char *body, size_t n, srvt_events *ev)
{
    ev->data = json_array();
    ev->names = json_array();
    ev->comments = 0;
    size_t pos = 0;
    bool bad = false;
    srv_sse_event e;
    memset(&e, 0, sizeof e);
    while (srv_sse_next(body, n, &pos, &e, &bad)) {
        if (e.comment) {
            ev->comments++;
            continue;
        }
        json_t *d = NULL;
        if (e.data.p && strcmp(e.data.p, "[DONE]") == 0)
            d = json_string("[DONE]");
        else if (e.data.p)
            d = json_loadb(e.data.p, e.data.len, JSON_ALLOW_NUL, NULL);
        if (!d) {
            fprintf(stderr, "SSE data is not JSON: %s\n", e.data.p ? e.data.p : "(none)");
            bad = true;
            break;
        }
        json_array_append_new(ev->data, d);
        json_array_append_new(ev->names, json_string(e.event));
    }
    srv_buf_free(&e.data);
    if (pos != n) {
        fprintf(stderr, "SSE: %zu bytes after the last complete event\n", n - pos);
        bad = true;
    }
    return !bad;
}

void srvt_events_free(srvt_events *ev)
{
    if (ev->data) json_decref(ev->data);
    if (ev->names) json_decref(ev->names);
    ev->data = ev->names = NULL;
}

static json_t *walk(json_t *o, const char *path)
{
    char key[64];
    while (o && *path) {
        size_t k = strcspn(path, ".");
        if (k >= sizeof key) return NULL;
        memcpy(key, path, k);
        key[k] = 0;
        if (json_is_array(o))
            o = json_array_get(o, (size_t)atoi(key));
        else
            o = json_object_get(o, key);
        path += k + (path[k] == '.');
    }
    return o;
}

int64_t srvt_int(json_t *o, const char *path)
{
    json_t *v = walk(o, path);
    return json_is_integer(v) ? json_integer_value(v) : 0;
}

const char *srvt_str(json_t *o, const char *path)
{
    return json_string_value(walk(o, path));
}

json_t *srvt_get(json_t *o, const char *path)
{
    return walk(o, path);
}
