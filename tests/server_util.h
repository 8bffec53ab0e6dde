/*
 * server_util.h — what the keel serve tests share: generating a model,
 * running `keel serve` ($KEEL_BIN) as a child process on a free loopback
 * port, requests through the client of app/server/api_client.c, and SSE
 * helpers. Linked into the test_server* executables (tests/server.cmake).
 */
#ifndef KEEL_TESTS_SERVER_UTIL_H
#define KEEL_TESTS_SERVER_UTIL_H

#include "srv.h"

#include <jansson.h>
#include <stdbool.h>
#include <sys/types.h>

typedef struct srvt_proc {
    pid_t pid;
    int port;
    int out_fd;      /* the server's stdout (the plan) */
    srv_buf out;     /* what it printed so far */
} srvt_proc;

/* Under ASan (KEEL_ASAN set) and in a TSan build everything is slower:
 * timeouts scale by this, and tests take smaller workloads where it is
 * above 1. */
int srvt_slow(void);

/* Writes a generated model (keel_gen_model) to a fresh /tmp file; the path
 * (static storage, one per call site's buffer) or NULL. */
bool srvt_gen_model(char *path, size_t cap, const char *arch, int32_t n_embd, int32_t n_layer, int32_t n_swa,
                    uint64_t seed);

/* Starts `keel serve -m model --port 0 --host 127.0.0.1 args...` (args
 * NULL-terminated), reads its port from the "listening on" line, and with
 * wait_ready waits until GET /health answers 200. false (the child killed)
 * on failure. */
bool srvt_start(srvt_proc *p, const char *model, const char *const *args, bool wait_ready);
/* SIGTERM, then waits up to timeout_s for the exit: its exit code, or -1
 * (killed after the timeout, or died of a signal: ASan aborts on a leak). */
int srvt_stop(srvt_proc *p, int timeout_s);

/* Waits up to timeout_s for the server to exit by itself: its exit code,
 * -1 for a signal, -2 if still running. */
int srvt_wait_exit(srvt_proc *p, int timeout_s);

/* A request; the HTTP status (-1 on a transport failure). r receives the
 * response (free with srv_http_resp_free). extra: header lines or NULL. */
int srvt_req(const srvt_proc *p, const char *method, const char *path, const char *extra, const char *body,
             srv_http_resp *r);
/* POST body, parse the JSON answer (NULL if not JSON); *status receives
 * the HTTP status. */
json_t *srvt_post_json(const srvt_proc *p, const char *path, const char *body, int *status);
json_t *srvt_get_json(const srvt_proc *p, const char *path, int *status);
/* A sample of GET /metrics (-1 if absent). */
double srvt_metric(const srvt_proc *p, const char *name);
/* Waits until the metric reaches want: the engine updates counters and slot
 * snapshots after it delivered a request's last event, so right after a
 * response they may lag by a step. The last value read. */
double srvt_wait_metric(const srvt_proc *p, const char *name, double want, int timeout_s);

/* GET /health is 200. */
bool srvt_alive(const srvt_proc *p);
/* Waits (up to timeout_s) until every slot of /slots is idle. */
bool srvt_slots_idle(const srvt_proc *p, int timeout_s);

/* The SSE events of a body: parsed JSON of each data field ("[DONE]" is
 * kept as the string "[DONE]"), event names in names (may be NULL). false
 * on a framing error (a line that is not an SSE field, an unterminated
 * event, data that is not JSON). */
typedef struct srvt_events {
    json_t *data;   /* array of values */
    json_t *names;  /* array of event names ("" when absent) */
    int comments;
} srvt_events;
bool srvt_parse_sse(const char *body, size_t n, srvt_events *ev);
void srvt_events_free(srvt_events *ev);

/* Value of an integer member path like "usage.prompt_tokens" (0 if absent). */
int64_t srvt_int(json_t *o, const char *path);
const char *srvt_str(json_t *o, const char *path);
/* The value at a member path (borrowed; NULL if absent). */
json_t *srvt_get(json_t *o, const char *path);

#endif
