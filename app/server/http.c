/*
 * http.c — the HTTP side of keel serve: a libmicrohttpd daemon with one
 * thread per connection, routing, authentication, limits, the per-request
 * event queues between the engine's scheduler thread and the connection
 * threads, and SSE streaming.
 *
 * Why thread per connection: an agent holds a connection open for the whole
 * generation; with its own thread, a streaming response is a plain loop that
 * waits on its request's queue (a condition variable, with a timeout to send
 * keep-alives and to notice a client that went away), and a non-streaming
 * request simply waits for its end. The number of connections, hence of
 * threads, is bounded (--threads-http); each thread has a small stack
 * because no parser here recurses deeper than the JSON depth limit.
 *
 * A generation request (a job) is shared by two sides:
 *   - the engine calls on_event on its scheduler thread: events are copied
 *     into the job's queue (text deltas of the same kind merge, so the queue
 *     grows only with text) bounded by SRV_QUEUE_MAX bytes; past that, or once
 *     the HTTP side gave up, on_event returns false and the engine cancels
 *     the request. The last event is DONE.
 *   - the connection thread drains the queue into SSE bytes (or waits for
 *     DONE), polling its socket between waits: a client that disconnected
 *     gets its request cancelled (keel_engine_cancel_request).
 * A job is freed when both sides released it (refs: one for the HTTP side,
 * one for the engine until DONE). Everything a request allocates is bounded
 * by max_body (its body) plus SRV_QUEUE_MAX plus its response.
 *
 * keel_engine_last_error is per thread: the message a handler reads after
 * its failed engine call is that call's own.
 *
 * Connections (docs/server.md, "Connections"): a connection with no request
 * in progress is closed after --keep-alive-timeout seconds of silence
 * (libmicrohttpd's timeout, raised to --timeout while a request runs, so
 * neither a long prefill nor a stream is cut); a request's headers must
 * arrive within --read-timeout of the connection's start (or of the
 * previous response's end), and its body within --read-timeout more (the
 * watchdog thread shuts down the socket of one that trickles past its
 * deadline). Up to --threads-http connections are served; up to
 * SRV_CONN_EXTRA more are accepted only to answer 503 with Retry-After and
 * close, so a new client gets an answer instead of waiting in the backlog.
 */
#include "srv.h"

#include <errno.h>
#include <limits.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SRV_QUEUE_MAX ((size_t)4 << 20)   /* bytes of undelivered events per request */
#define SRV_WAIT_MS 100                   /* between checks of the client's socket */
#define SRV_STACK ((size_t)1 << 20)       /* connection thread stack */
#define SRV_WATCH_MS 100                  /* the watchdog's period */

enum { ST_LOADING = 0, ST_READY = 1, ST_STOPPING = 2 };

/* Phases of a connection, for the watchdog. */
enum { PH_WAIT = 0, PH_BODY = 1, PH_ACTIVE = 2 };

/* A connection, from libmicrohttpd's start notification to its close
 * notification (which comes before the socket is closed: a socket in the
 * list is open). Fields under srv_server.cmu. */
typedef struct sconn {
    struct sconn *prev, *next;
    int fd;
    int phase;            /* PH_*: WAIT for headers, BODY being read, ACTIVE: the handler runs */
    uint64_t deadline_ms; /* WAIT and BODY: shut down at this time */
    bool over;            /* opened past --threads-http: its request gets 503 */
    bool cut;             /* the watchdog shut it down */
} sconn;

struct srv_server {
    srv_config cfg;
    struct MHD_Daemon *d;
    int port;
    pthread_mutex_t mu;
    int state;               /* ST_* under mu */
    keel_engine *e;          /* set once loaded */
    srv_limits lim;
    char model[256];         /* name in responses */
    int32_t n_ctx_slot, n_slots, n_vocab;
    int32_t n_ctx;           /* cells of the shared cache: what one slot may fill */
    atomic_int loop_done;    /* the engine loop returned */
    /* connections and their watchdog */
    pthread_mutex_t cmu;
    pthread_cond_t ccv;
    sconn *conns;            /* under cmu */
    int n_open;              /* connections open, under cmu */
    bool wd_stop, wd_started;
    pthread_t wd;
};

/* ---- routes ---------------------------------------------------------------- */

typedef enum route {
    R_NONE = 0,
    R_HEALTH,
    R_MODELS,
    R_PROPS,
    R_CHAT,
    R_COMPLETIONS,
    R_MESSAGES,
    R_COUNT,
    R_TOKENIZE,
    R_DETOKENIZE,
    R_SLOTS,
    R_SLOT_ACTION,
    R_METRICS,
    R_MODEL,      /* GET /v1/models/{id} */
    R_PAGE,       /* the chat page (app/server/page) */
    R_PAGE_JS,
} route;

typedef struct route_def {
    const char *path;
    route r;
    bool post;
    bool is_public; /* no API key needed (llama-server's public endpoints) */
    srv_api api;
} route_def;

static const route_def g_routes[] = {
    {"/health", R_HEALTH, false, true, SRV_API_NATIVE},
    {"/v1/health", R_HEALTH, false, true, SRV_API_NATIVE},
    {"/v1/models", R_MODELS, false, true, SRV_API_NATIVE},
    {"/models", R_MODELS, false, true, SRV_API_NATIVE},
    {"/props", R_PROPS, false, false, SRV_API_NATIVE},
    {"/v1/chat/completions", R_CHAT, true, false, SRV_API_CHAT},
    {"/chat/completions", R_CHAT, true, false, SRV_API_CHAT},
    {"/v1/completions", R_COMPLETIONS, true, false, SRV_API_COMPLETIONS},
    {"/completions", R_COMPLETIONS, true, false, SRV_API_COMPLETIONS},
    {"/v1/messages", R_MESSAGES, true, false, SRV_API_MESSAGES},
    {"/v1/messages/count_tokens", R_COUNT, true, false, SRV_API_COUNT_TOKENS},
    {"/tokenize", R_TOKENIZE, true, false, SRV_API_NATIVE},
    {"/detokenize", R_DETOKENIZE, true, false, SRV_API_NATIVE},
    {"/slots", R_SLOTS, false, false, SRV_API_NATIVE},
    {"/metrics", R_METRICS, false, false, SRV_API_NATIVE},
    /* the page is public, as llama-server's: it asks for the API key */
    {"/", R_PAGE, false, true, SRV_API_NATIVE},
    {"/index.html", R_PAGE, false, true, SRV_API_NATIVE},
    {"/keel-page.js", R_PAGE_JS, false, true, SRV_API_NATIVE},
};

/* ---- jobs ---------------------------------------------------------------------- */

typedef struct qev {
    struct qev *next;
    keel_event_kind kind;
    int32_t index;
    int32_t n_prompt, n_cached; /* PROMPT, PROGRESS */
    int32_t n_processed;        /* PROGRESS */
    double elapsed_ms;
    char *id, *name;
    srv_buf text;
} qev;

typedef struct job {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;
    srv_server *s;
    uint64_t id;
    qev *head, *tail;
    size_t q_bytes;
    int64_t n_events;
    bool done, abandoned, overflow;
    keel_status st;
    char *response;
    /* the HTTP side */
    srv_meta meta;
    srv_stream stream;
    srv_buf out;
    size_t out_off;
    bool out_final;
    int fd;
    uint64_t t0, t_last_out;
    char url[64];
    bool streaming;
    bool sent_any;      /* the stream's first bytes went out */
} job;

static uint64_t now_ms(void)
{
    return keel_time_ns() / 1000000u;
}

static void qev_free(qev *q)
{
    while (q) {
        qev *n = q->next;
        free(q->id);
        free(q->name);
        srv_buf_free(&q->text);
        free(q);
        q = n;
    }
}

static job *job_new(srv_server *s, srv_api api, int fd, const char *url)
{
    job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->refs = 1;
    j->s = s;
    j->fd = fd;
    j->t0 = j->t_last_out = now_ms();
    j->out.max = SRV_QUEUE_MAX * 4;
    srv_meta_init(&j->meta, api, s->model);
    snprintf(j->url, sizeof j->url, "%s", url);
    return j;
}

static void job_release(job *j)
{
    pthread_mutex_lock(&j->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left > 0) return;
    qev_free(j->head);
    free(j->response);
    srv_buf_free(&j->out);
    srv_stream_free(&j->stream);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

/* The engine's event callback (its scheduler thread). */
static bool on_event(void *user, const keel_event *ev)
{
    job *j = user;
    pthread_mutex_lock(&j->mu);
    if (ev->kind == KEEL_EVENT_DONE) {
        j->st = ev->status;
        j->response = strdup(ev->response ? ev->response : "{}");
        if (!j->response) j->st = KEEL_ENOMEM;
        j->done = true;
        pthread_cond_broadcast(&j->cv);
        pthread_mutex_unlock(&j->mu);
        job_release(j); /* the engine's reference */
        return true;
    }
    bool keep = !j->abandoned && !j->overflow;
    if (keep) {
        bool text = ev->kind == KEEL_EVENT_CONTENT || ev->kind == KEEL_EVENT_REASONING || ev->kind == KEEL_EVENT_TOOL_ARGS;
        qev *t = j->tail;
        if (text && t && t->kind == ev->kind && t->index == ev->index) {
            keep = srv_buf_add(&t->text, ev->text ? ev->text : "", ev->len);
        } else if (ev->kind == KEEL_EVENT_PROGRESS && t && t->kind == ev->kind) {
            t->n_processed = ev->n_processed; /* not sent yet: the newer progress replaces it */
            t->elapsed_ms = ev->elapsed_ms;
        } else {
            qev *q = calloc(1, sizeof *q);
            if (q) {
                q->kind = ev->kind;
                q->index = ev->index;
                q->n_prompt = ev->n_prompt_tokens;
                q->n_cached = ev->n_cached_tokens;
                q->n_processed = ev->n_processed;
                q->elapsed_ms = ev->elapsed_ms;
                q->text.max = SRV_QUEUE_MAX;
                if (ev->id) q->id = strdup(ev->id);
                if (ev->name) q->name = strdup(ev->name);
                keep = srv_buf_add(&q->text, ev->text ? ev->text : "", ev->len) && (!ev->id || q->id) &&
                       (!ev->name || q->name);
                if (j->tail)
                    j->tail->next = q;
                else
                    j->head = q;
                j->tail = q;
            } else {
                keep = false;
            }
        }
        j->q_bytes += ev->len + 64;
        j->n_events++;
        if (!keep || j->q_bytes > SRV_QUEUE_MAX) {
            /* the client does not read fast enough (or no memory): end it */
            j->overflow = true;
            keep = false;
        }
        pthread_cond_broadcast(&j->cv);
    }
    pthread_mutex_unlock(&j->mu);
    return keep;
}

/* True when the client closed its side of the connection. */
static bool client_gone(int fd)
{
    if (fd < 0) return false;
    struct pollfd p = {fd, POLLRDHUP, 0};
    int r = poll(&p, 1, 0);
    return r > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

/* The HTTP side gives up on the job: the engine cancels the request. */
static void job_abandon(job *j)
{
    pthread_mutex_lock(&j->mu);
    bool was = j->abandoned || j->done;
    j->abandoned = true;
    pthread_mutex_unlock(&j->mu);
    if (was || !j->s->e) return;
    keel_status st = keel_engine_cancel_request(j->s->e, j->id);
    if (st != KEEL_OK && st != KEEL_ENOENT) /* ENOENT: it ended meanwhile */
        fprintf(stderr, "keel serve: cancel request %llu: %s\n", (unsigned long long)j->id, keel_strerror(st));
}

/* Waits until the job is done (or, with first, has an event). false when
 * the client went away meanwhile (the job is then abandoned). */
static bool job_wait(job *j, bool first)
{
    for (;;) {
        pthread_mutex_lock(&j->mu);
        bool ready = j->done || (first && j->head);
        if (!ready) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += SRV_WAIT_MS * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&j->cv, &j->mu, &ts);
            ready = j->done || (first && j->head);
        }
        pthread_mutex_unlock(&j->mu);
        if (ready) return true;
        if (client_gone(j->fd)) {
            job_abandon(j);
            return false;
        }
    }
}

/* ---- responses -------------------------------------------------------------------- */

/* Queues a response; close: the connection closes after it (a 413 whose
 * body was not all read, a 503 past the connection cap, which also tells
 * the client when to retry). */
static enum MHD_Result respond(struct MHD_Connection *c, int status, const char *type, const char *body, size_t len,
                               bool close)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    enum MHD_Result ok = MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (ok == MHD_YES && status == 401) ok = MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (ok == MHD_YES && close) ok = MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    if (ok == MHD_YES && close && status == 503) ok = MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    if (ok == MHD_YES) ok = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result send_text(struct MHD_Connection *c, int status, const char *type, const char *body,
                                 size_t len)
{
    return respond(c, status, type, body, len, false);
}

/* The chat page's files (gen/page_data.c, from app/server/page). */
extern const unsigned char srv_page_html[], srv_page_js[];
extern const size_t srv_page_html_len, srv_page_js_len;

/* One of the page's files. Its script is a file of its own so that the
 * Content-Security-Policy can refuse inline scripts: text the model wrote
 * is never markup, and were it ever, it could not run. Nothing but this
 * server is reachable from the page. */
static enum MHD_Result send_page(struct MHD_Connection *c, bool js)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(js ? srv_page_js_len : srv_page_html_len,
                                                             (void *)(js ? srv_page_js : srv_page_html),
                                                             MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    enum MHD_Result ok = MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
                                                 js ? "text/javascript; charset=utf-8" : "text/html; charset=utf-8");
    if (ok == MHD_YES)
        ok = MHD_add_response_header(r, "Content-Security-Policy",
                                     "default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; "
                                     "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
                                     "frame-ancestors 'none'");
    if (ok == MHD_YES) ok = MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    if (ok == MHD_YES) ok = MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    if (ok == MHD_YES) ok = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ok;
}

/* Sends a JSON body (taking it; NULL: 500 out of memory); close as respond. */
static enum MHD_Result send_json_close(struct MHD_Connection *c, int status, char *body, bool close)
{
    static const char oom[] = "{\"error\":{\"code\":500,\"message\":\"out of memory\",\"type\":\"server_error\"}}";
    enum MHD_Result r = body ? respond(c, status, "application/json; charset=utf-8", body, strlen(body), close)
                             : respond(c, 500, "application/json; charset=utf-8", oom, sizeof oom - 1, close);
    free(body);
    return r;
}

static enum MHD_Result send_json(struct MHD_Connection *c, int status, char *body)
{
    return send_json_close(c, status, body, false);
}

static enum MHD_Result send_obj(struct MHD_Connection *c, int status, json_t *o)
{
    char *s = o ? json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(10)) : NULL;
    if (o) json_decref(o);
    return send_json(c, status, s);
}

static enum MHD_Result send_error(struct MHD_Connection *c, srv_api api, const srv_err *e)
{
    return send_json(c, e->status, srv_error_body(api, e));
}

static enum MHD_Result send_errorv(struct MHD_Connection *c, srv_api api, int status, bool close, const char *fmt,
                                   va_list ap)
{
    srv_err e;
    memset(&e, 0, sizeof e);
    e.status = status;
    vsnprintf(e.msg, sizeof e.msg, fmt, ap);
    return send_json_close(c, e.status, srv_error_body(api, &e), close);
}

static enum MHD_Result send_errorf(struct MHD_Connection *c, srv_api api, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static enum MHD_Result send_errorf(struct MHD_Connection *c, srv_api api, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    enum MHD_Result r = send_errorv(c, api, status, false, fmt, ap);
    va_end(ap);
    return r;
}

/* send_errorf, and the connection closes after the answer. */
static enum MHD_Result send_errorf_close(struct MHD_Connection *c, srv_api api, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static enum MHD_Result send_errorf_close(struct MHD_Connection *c, srv_api api, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    enum MHD_Result r = send_errorv(c, api, status, true, fmt, ap);
    va_end(ap);
    return r;
}

/* ---- per-connection state ------------------------------------------------------------ */

typedef struct conn {
    const route_def *rd;
    route r;
    srv_api api;
    int32_t slot;       /* /slots/{id} */
    srv_buf body;
    bool too_large;     /* the body is past max_body: read and discarded, then 413 */
    size_t discarded;   /* bytes of it discarded */
    bool replied;       /* an early response (401, 413, 503) was queued */
} conn;

static int conn_fd(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

/* ---- connections: the cap, the phases, the watchdog ------------------------------------ */

static sconn *conn_track(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* Moves the connection to phase (WAIT and BODY get a deadline
 * --read-timeout from now). Returns whether it is past the cap. */
static bool conn_phase(srv_server *s, struct MHD_Connection *c, int phase)
{
    sconn *k = conn_track(c);
    bool over = false;
    if (!k) return false; /* not tracked (no memory at its start) */
    pthread_mutex_lock(&s->cmu);
    k->phase = phase;
    k->deadline_ms = now_ms() + (uint64_t)s->cfg.read_timeout_s * 1000u;
    over = k->over;
    pthread_mutex_unlock(&s->cmu);
    return over;
}

/* libmicrohttpd's connection start and close notifications. */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_ctx, enum MHD_ConnectionNotificationCode code)
{
    srv_server *s = cls;
    sconn *k = *socket_ctx;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        k = calloc(1, sizeof *k);
        if (!k) return; /* untracked: the idle timeout still applies */
        k->fd = conn_fd(c);
        k->phase = PH_WAIT;
        k->deadline_ms = now_ms() + (uint64_t)s->cfg.read_timeout_s * 1000u;
        pthread_mutex_lock(&s->cmu);
        k->next = s->conns;
        if (s->conns) s->conns->prev = k;
        s->conns = k;
        k->over = ++s->n_open > s->cfg.threads_http;
        pthread_mutex_unlock(&s->cmu);
        *socket_ctx = k;
    } else if (k) {
        pthread_mutex_lock(&s->cmu);
        if (k->prev) k->prev->next = k->next;
        else s->conns = k->next;
        if (k->next) k->next->prev = k->prev;
        s->n_open--;
        pthread_mutex_unlock(&s->cmu);
        free(k);
        *socket_ctx = NULL;
    }
}

/* Shuts down the sockets of connections past their deadline: the
 * connection's thread then reads the end and closes it. Holding cmu, a
 * listed socket is still open (the close notification comes first). */
static void *watchdog(void *p)
{
    srv_server *s = p;
    pthread_mutex_lock(&s->cmu);
    while (!s->wd_stop) {
        uint64_t now = now_ms();
        for (sconn *k = s->conns; k; k = k->next) {
            if (k->phase == PH_ACTIVE || k->cut || k->fd < 0 || now < k->deadline_ms) continue;
            k->cut = true;
            if (shutdown(k->fd, SHUT_RDWR) != 0 && errno != ENOTCONN)
                fprintf(stderr, "keel serve: shutdown of a slow connection: %s\n", strerror(errno));
            else if (s->cfg.log)
                fprintf(stderr, "keel serve: closed a connection that sent no complete request in %d s (--read-timeout)\n",
                        s->cfg.read_timeout_s);
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += SRV_WATCH_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&s->ccv, &s->cmu, &ts);
    }
    pthread_mutex_unlock(&s->cmu);
    return NULL;
}

/* libmicrohttpd's idle timeout of the connection in seconds (0: none). */
static void conn_timeout(srv_server *s, struct MHD_Connection *c, int seconds)
{
    if (MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)seconds) != MHD_YES && s->cfg.log)
        fprintf(stderr, "keel serve: cannot set a connection's timeout to %d s\n", seconds);
}

/* Constant-time comparison (in the contents; lengths are not secret). */
static bool key_equal(const char *a, size_t na, const char *b, size_t nb)
{
    unsigned d = na != nb;
    size_t n = na > nb ? na : nb;
    for (size_t i = 0; i < n; i++) d |= (unsigned)((i < na ? (unsigned char)a[i] : 0) ^ (i < nb ? (unsigned char)b[i] : 0));
    return d == 0;
}

static bool authorized(srv_server *s, struct MHD_Connection *c)
{
    if (s->cfg.n_api_keys == 0) return true;
    const char *key = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
    const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!key && auth && strncasecmp(auth, "Bearer ", 7) == 0) {
        key = auth + 7;
        while (*key == ' ') key++;
    }
    if (!key) return false;
    bool ok = false;
    size_t nk = strlen(key);
    for (int i = 0; i < s->cfg.n_api_keys; i++) /* every key compared: no early exit */
        ok |= key_equal(key, nk, s->cfg.api_keys[i], strlen(s->cfg.api_keys[i]));
    return ok;
}

/* "/slots/3" -> 3; -1 if url is not a slot action path. */
static int32_t slot_of(const char *url)
{
    if (strncmp(url, "/slots/", 7) != 0) return -1;
    const char *p = url + 7;
    if (!*p || strlen(p) > 6) return -1;
    int32_t v = 0;
    for (; *p; p++) {
        if (*p < '0' || *p > '9') return -1;
        v = v * 10 + (*p - '0');
    }
    return v;
}

static void log_request(srv_server *s, const char *method, const char *url, int status, const job *j)
{
    if (!s->cfg.log) return;
    if (!j || !j->response) {
        fprintf(stderr, "keel serve: %s %s %d\n", method, url, status);
        return;
    }
    json_t *r = json_loads(j->response, JSON_ALLOW_NUL, NULL);
    int64_t p = 0, cached = 0, g = 0;
    srv_engine_usage(r, "prompt_tokens", &p);
    srv_engine_usage(r, "cached_tokens", &cached);
    srv_engine_usage(r, "completion_tokens", &g);
    const char *fin = json_string_value(json_object_get(r, "finish_reason"));
    fprintf(stderr, "keel serve: %s %s %d%s prompt %lld (cached %lld) completion %lld %s %llu ms\n", method, url, status,
            j->streaming ? " stream" : "", (long long)p, (long long)cached, (long long)g, fin ? fin : "-",
            (unsigned long long)(now_ms() - j->t0));
    if (r) json_decref(r);
}

/* ---- generation ---------------------------------------------------------------------------- */

/* Request defaults from the flags for members the request leaves out. Each
 * request gets its own copies: handlers run on several threads, and
 * sharing the defaults' values would have them all touch one refcount. */
static bool apply_defaults(srv_server *s, json_t *req)
{
    const char *k;
    json_t *v;
    if (!s->cfg.defaults) return true;
    json_object_foreach(s->cfg.defaults, k, v) {
        if (!json_object_get(req, k) && json_object_set_new(req, k, json_deep_copy(v)) != 0) return false;
    }
    return true;
}

/* Submits req for j under s->mu; 0 or an HTTP error in e. */
static bool submit(srv_server *s, job *j, json_t *req, srv_err *e)
{
    if (!apply_defaults(s, req)) return srv_fail(e, 500, "out of memory");
    char *text = json_dumps(req, JSON_COMPACT);
    if (!text) return srv_fail(e, 500, "out of memory");
    pthread_mutex_lock(&s->mu);
    bool ok = true;
    if (s->state != ST_READY) {
        ok = srv_fail(e, 503, s->state == ST_LOADING ? "Loading model" : "the server is shutting down");
    } else {
        j->refs++; /* the engine's, dropped at DONE */
        keel_status st = keel_engine_submit(s->e, text, on_event, j, &j->id);
        if (st != KEEL_OK) {
            j->refs--;
            srv_err_from_status(e, st, keel_engine_last_error(s->e));
            if (st == KEEL_EFULL) srv_fail(e, 503, "the request queue is full; retry later");
            ok = false;
        }
    }
    pthread_mutex_unlock(&s->mu);
    free(text);
    return ok;
}

/* The SSE body: drains the job's queue through the stream encoder. */
static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    job *j = cls;
    (void)pos;
    for (;;) {
        if (j->out_off < j->out.len) {
            size_t n = j->out.len - j->out_off;
            if (n > max) n = max;
            memcpy(buf, j->out.p + j->out_off, n);
            j->out_off += n;
            if (j->out_off == j->out.len) {
                srv_buf_reset(&j->out);
                j->out_off = 0;
            }
            j->t_last_out = now_ms();
            j->sent_any = true;
            return (ssize_t)n;
        }
        if (j->out_final) return MHD_CONTENT_READER_END_OF_STREAM;
        pthread_mutex_lock(&j->mu);
        if (!j->head && !j->done) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += SRV_WAIT_MS * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&j->cv, &j->mu, &ts);
        }
        qev *list = j->head;
        j->head = j->tail = NULL;
        j->q_bytes = 0;
        bool done = j->done && !list;
        pthread_mutex_unlock(&j->mu);
        bool ok = true;
        for (qev *q = list; q && ok; q = q->next) {
            keel_event ev;
            memset(&ev, 0, sizeof ev);
            ev.kind = q->kind;
            ev.index = q->index;
            ev.text = q->text.p ? q->text.p : "";
            ev.len = q->text.len;
            ev.id = q->id;
            ev.name = q->name;
            ev.n_prompt_tokens = q->n_prompt;
            ev.n_cached_tokens = q->n_cached;
            ev.n_processed = q->n_processed;
            ev.elapsed_ms = q->elapsed_ms;
            ok = srv_stream_event(&j->stream, &ev, &j->out);
        }
        qev_free(list);
        if (ok && done) {
            ok = srv_stream_done(&j->stream, j->response, j->st, &j->out);
            j->out_final = true;
        }
        if (!ok) { /* out of memory or the stream buffer overflowed */
            job_abandon(j);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (j->out.len) continue;
        if (client_gone(j->fd)) {
            job_abandon(j);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        /* the first bytes at once (a completions stream has no start of
         * its own), then a keep-alive whenever the stream was silent for
         * --sse-ping seconds (a long prefill) */
        if (!j->sent_any || now_ms() - j->t_last_out >= (uint64_t)j->s->cfg.ping_s * 1000u) {
            if (!srv_stream_ping(&j->stream, &j->out)) {
                job_abandon(j);
                return MHD_CONTENT_READER_END_WITH_ERROR;
            }
            j->t_last_out = now_ms();
        }
    }
}

static void sse_free(void *cls)
{
    job *j = cls;
    pthread_mutex_lock(&j->mu);
    bool done = j->done;
    pthread_mutex_unlock(&j->mu);
    if (!done) job_abandon(j);
    log_request(j->s, "POST", j->url, 200, j);
    job_release(j);
}

static enum MHD_Result generate(srv_server *s, struct MHD_Connection *c, conn *cn, const char *url)
{
    srv_request rq;
    srv_err e;
    if (!srv_request_parse(cn->api, cn->body.p ? cn->body.p : "", cn->body.len, &s->lim, &rq, &e)) {
        log_request(s, "POST", url, e.status, NULL);
        return send_error(c, cn->api, &e);
    }
    job *j = job_new(s, cn->api, conn_fd(c), url);
    if (!j) {
        srv_request_free(&rq);
        return send_json(c, 500, NULL);
    }
    srv_stream_init(&j->stream, &j->meta, rq.include_usage);
    j->stream.progress = rq.stream && rq.return_progress;
    bool ok = submit(s, j, rq.engine, &e);
    bool stream = rq.stream;
    j->streaming = stream;
    srv_request_free(&rq);
    if (!ok) {
        log_request(s, "POST", url, e.status, NULL);
        job_release(j);
        return send_error(c, cn->api, &e);
    }
    if (!job_wait(j, stream)) { /* the client went away */
        log_request(s, "POST", url, 499, j);
        job_release(j);
        return MHD_NO;
    }
    pthread_mutex_lock(&j->mu);
    bool done_first = j->done && !j->head;
    pthread_mutex_unlock(&j->mu);
    if (!stream || done_first) {
        int status = 200;
        char *body = srv_response_body(&j->meta, j->response, j->st, &status);
        if (stream && status == 200) {
            /* finished before its first event (max_tokens 0, an immediate
             * end): still a stream, with only its end */
            free(body);
            body = NULL;
        } else {
            log_request(s, "POST", url, status, j);
            job_release(j);
            return send_json(c, status, body);
        }
    }
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, sse_read, j, sse_free);
    if (!r) {
        job_abandon(j);
        job_release(j);
        return MHD_NO;
    }
    enum MHD_Result res = MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream; charset=utf-8");
    if (res == MHD_YES) res = MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    if (res == MHD_YES) res = MHD_add_response_header(r, "X-Accel-Buffering", "no");
    if (res == MHD_YES) res = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r); /* sse_free runs when MHD is done with it */
    return res;
}

/* ---- the other routes --------------------------------------------------------------------- */

static json_t *stats_obj(srv_server *s)
{
    char *t = srv_stats(s);
    json_t *o = t ? json_loads(t, 0, NULL) : NULL;
    free(t);
    return o;
}

/* The model object of /v1/models (NULL on OOM). */
static json_t *model_obj(srv_server *s)
{
    json_t *st = stats_obj(s);
    json_t *mi = json_object_get(st, "model");
    json_t *meta = json_pack("{sIsIsIsIss}", "n_vocab", (json_int_t)json_integer_value(json_object_get(mi, "n_vocab")),
                             "n_ctx_train", (json_int_t)json_integer_value(json_object_get(mi, "n_ctx_train")),
                             "n_params", (json_int_t)json_integer_value(json_object_get(mi, "n_params")), "n_ctx",
                             (json_int_t)s->n_ctx, "arch", json_string_value(json_object_get(mi, "arch")) ?
                             json_string_value(json_object_get(mi, "arch")) : "");
    json_t *m = json_pack("{sssssIssso}", "id", s->model, "object", "model", "created", (json_int_t)time(NULL),
                          "owned_by", "keel", "meta", meta);
    if (st) json_decref(st);
    return m;
}

static enum MHD_Result route_models(srv_server *s, struct MHD_Connection *c)
{
    return send_obj(c, 200, json_pack("{ss s[o]}", "object", "list", "data", model_obj(s)));
}

/* GET /v1/models/{id}: the model when id names it (the alias or file name). */
static enum MHD_Result route_model(srv_server *s, struct MHD_Connection *c, const char *id)
{
    if (strcmp(id, s->model) != 0) {
        srv_err e;
        srv_fail(&e, 404, "The model '%s' does not exist", id);
        e.code = "model_not_found";
        e.param = "model";
        return send_error(c, SRV_API_NATIVE, &e);
    }
    return send_obj(c, 200, model_obj(s));
}

static enum MHD_Result route_props(srv_server *s, struct MHD_Connection *c)
{
    json_t *st = stats_obj(s);
    json_t *o = json_pack("{s{sis{}}sisssssssss{sbsb}sO}", "default_generation_settings", "n_ctx", s->n_ctx,
                          "params", "total_slots", s->n_slots, "model_alias", s->model, "model_path",
                          s->cfg.model_path ? s->cfg.model_path : "", "build_info", "keel " KEEL_VERSION_STRING,
                          "chat_template", json_string_value(json_object_get(st, "chat_template")) ?
                          json_string_value(json_object_get(st, "chat_template")) : "",
                          "modalities", "vision", 0, "audio", 0, "plan",
                          json_object_get(st, "plan") ? json_object_get(st, "plan") : json_null());
    if (o && s->cfg.defaults) json_object_update(json_object_get(json_object_get(o, "default_generation_settings"), "params"), s->cfg.defaults);
    if (o) json_object_set_new(o, "tool_format", json_string(json_string_value(json_object_get(st, "tool_format")) ? json_string_value(json_object_get(st, "tool_format")) : ""));
    if (st) json_decref(st);
    return send_obj(c, 200, o);
}

static enum MHD_Result route_slots(srv_server *s, struct MHD_Connection *c)
{
    if (!s->cfg.slots) return send_errorf(c, SRV_API_NATIVE, 501, "This server does not support the slots endpoint (--no-slots)");
    json_t *st = stats_obj(s);
    json_t *arr = json_array();
    size_t i;
    json_t *sl;
    json_array_foreach(json_object_get(st, "slots"), i, sl) {
        const char *state = json_string_value(json_object_get(sl, "state"));
        json_t *o = json_deep_copy(sl);
        if (!o) continue;
        json_object_set_new(o, "n_ctx", json_integer(s->n_ctx));
        json_object_set_new(o, "is_processing", json_boolean(state && strcmp(state, "idle") != 0));
        json_array_append_new(arr, o);
    }
    if (st) json_decref(st);
    return send_obj(c, 200, arr);
}

static enum MHD_Result route_metrics(srv_server *s, struct MHD_Connection *c)
{
    if (!s->cfg.metrics)
        return send_errorf(c, SRV_API_NATIVE, 501, "This server does not support the metrics endpoint (start it with --metrics)");
    char *st = srv_stats(s);
    char *text = st ? srv_metrics_text(st, srv_rss_bytes()) : NULL;
    free(st);
    if (!text) return send_json(c, 500, NULL);
    enum MHD_Result r = send_text(c, 200, "text/plain; version=0.0.4; charset=utf-8", text, strlen(text));
    free(text);
    return r;
}

/* POST /v1/messages/count_tokens: the request rendered and tokenized on
 * this handler thread (keel_engine_count_tokens), no slot and no prefill:
 * an agent may call it before every turn, also while others generate. */
static enum MHD_Result route_count(srv_server *s, struct MHD_Connection *c, conn *cn, const char *url)
{
    srv_request rq;
    srv_err e;
    if (!srv_request_parse(cn->api, cn->body.p ? cn->body.p : "", cn->body.len, &s->lim, &rq, &e)) {
        log_request(s, "POST", url, e.status, NULL);
        return send_error(c, cn->api, &e);
    }
    char *text = json_dumps(rq.engine, JSON_COMPACT);
    srv_request_free(&rq);
    if (!text) return send_json(c, 500, NULL);
    int64_t n = 0;
    keel_status st = keel_engine_count_tokens(s->e, text, &n);
    free(text);
    if (st != KEEL_OK) {
        srv_err_from_status(&e, st, keel_engine_last_error(s->e));
        log_request(s, "POST", url, e.status, NULL);
        return send_error(c, cn->api, &e);
    }
    json_t *o = json_pack("{sI}", "input_tokens", (json_int_t)n);
    char *body = o ? json_dumps(o, JSON_COMPACT) : NULL;
    if (o) json_decref(o);
    log_request(s, "POST", url, body ? 200 : 500, NULL);
    return send_json(c, body ? 200 : 500, body);
}

static enum MHD_Result route_tokenize(srv_server *s, struct MHD_Connection *c, conn *cn)
{
    srv_err e;
    json_t *b = srv_parse_body(cn->body.p, cn->body.len, &s->lim, &e);
    if (!b) return send_error(c, SRV_API_NATIVE, &e);
    json_t *content = json_object_get(b, "content");
    bool add_special = false, parse_special = true, pieces = false;
    if (!json_is_string(content)) {
        json_decref(b);
        return send_errorf(c, SRV_API_NATIVE, 400, "content must be a string");
    }
    if (!srv_get_bool(b, "add_special", &add_special, &e) || !srv_get_bool(b, "parse_special", &parse_special, &e) ||
        !srv_get_bool(b, "with_pieces", &pieces, &e)) {
        json_decref(b);
        return send_error(c, SRV_API_NATIVE, &e);
    }
    const keel_model *m = keel_engine_model(s->e);
    int32_t n = 0;
    const char *text = json_string_value(content);
    size_t len = json_string_length(content);
    keel_status st = keel_tokenize(m, text, len, add_special, parse_special, NULL, 0, &n);
    int32_t *ids = NULL;
    if (st == KEEL_OK || st == KEEL_ERANGE) {
        ids = malloc((size_t)(n > 0 ? n : 1) * sizeof *ids);
        st = ids ? keel_tokenize(m, text, len, add_special, parse_special, ids, n, &n) : KEEL_ENOMEM;
    }
    json_t *arr = st == KEEL_OK ? json_array() : NULL;
    for (int32_t i = 0; arr && i < n; i++) {
        if (!pieces) {
            json_array_append_new(arr, json_integer(ids[i]));
            continue;
        }
        char piece[512];
        size_t pn = 0;
        if (keel_token_piece(m, ids[i], piece, sizeof piece, &pn) != KEEL_OK) pn = 0;
        json_array_append_new(arr, json_pack("{siso}", "id", ids[i], "piece", srv_json_text(piece, pn)));
    }
    free(ids);
    json_decref(b);
    if (st != KEEL_OK) {
        srv_err_from_status(&e, st, "tokenization failed");
        return send_error(c, SRV_API_NATIVE, &e);
    }
    return send_obj(c, 200, json_pack("{so}", "tokens", arr));
}

static enum MHD_Result route_detokenize(srv_server *s, struct MHD_Connection *c, conn *cn)
{
    srv_err e;
    json_t *b = srv_parse_body(cn->body.p, cn->body.len, &s->lim, &e);
    if (!b) return send_error(c, SRV_API_NATIVE, &e);
    json_t *toks = json_object_get(b, "tokens");
    if (!json_is_array(toks)) {
        json_decref(b);
        return send_errorf(c, SRV_API_NATIVE, 400, "tokens must be an array of token ids");
    }
    size_t n = json_array_size(toks);
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    if (!ids) {
        json_decref(b);
        return send_json(c, 500, NULL);
    }
    for (size_t i = 0; i < n; i++) {
        json_t *t = json_array_get(toks, i);
        if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) >= s->n_vocab) {
            free(ids);
            json_decref(b);
            return send_errorf(c, SRV_API_NATIVE, 400, "tokens[%zu] must be a token id in [0, %d)", i, s->n_vocab);
        }
        ids[i] = (int32_t)json_integer_value(t);
    }
    json_decref(b);
    const keel_model *m = keel_engine_model(s->e);
    size_t need = 0;
    keel_status st = n > (size_t)INT32_MAX ? KEEL_ERANGE : keel_detokenize(m, ids, (int32_t)n, NULL, 0, &need);
    char *text = NULL;
    if (st == KEEL_OK || st == KEEL_ERANGE) {
        text = malloc(need + 1);
        st = text ? keel_detokenize(m, ids, (int32_t)n, text, need + 1, &need) : KEEL_ENOMEM;
    }
    free(ids);
    if (st != KEEL_OK) {
        free(text);
        srv_err_from_status(&e, st, "detokenization failed");
        return send_error(c, SRV_API_NATIVE, &e);
    }
    json_t *o = json_pack("{so}", "content", srv_json_text(text, need));
    free(text);
    return send_obj(c, 200, o);
}

/* A slot file name: not empty, at most 255 bytes, no path separator, no
 * "..", no NUL, no control characters. */
static bool filename_ok(json_t *f, const char **why)
{
    const char *s = json_string_value(f);
    size_t n = json_string_length(f);
    *why = NULL;
    if (!s || n == 0) *why = "filename must be a non-empty string";
    else if (n > 255) *why = "filename is longer than 255 bytes";
    else if (strlen(s) != n) *why = "filename holds a NUL byte";
    else if (strchr(s, '/') || strchr(s, '\\')) *why = "filename must not contain a path separator";
    else if (strstr(s, "..")) *why = "filename must not contain \"..\"";
    for (size_t i = 0; !*why && i < n; i++)
        if ((unsigned char)s[i] < 0x20) *why = "filename holds a control character";
    return *why == NULL;
}

static enum MHD_Result route_slot_action(srv_server *s, struct MHD_Connection *c, conn *cn)
{
    const char *action = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "action");
    if (!action || (strcmp(action, "save") && strcmp(action, "restore") && strcmp(action, "erase")))
        return send_errorf(c, SRV_API_NATIVE, 400, "action must be save, restore or erase");
    if (cn->slot < 0 || cn->slot >= s->n_slots)
        return send_errorf(c, SRV_API_NATIVE, 400, "slot %d does not exist (0 .. %d)", cn->slot, s->n_slots - 1);
    char path[PATH_MAX];
    const char *fname = NULL;
    bool erase = strcmp(action, "erase") == 0;
    if (!erase) {
        srv_err e;
        if (!s->cfg.slot_save_path)
            return send_errorf(c, SRV_API_NATIVE, 501, "slot %s needs --slot-save-path", action);
        json_t *b = srv_parse_body(cn->body.p, cn->body.len, &s->lim, &e);
        if (!b) return send_error(c, SRV_API_NATIVE, &e);
        const char *why;
        if (!filename_ok(json_object_get(b, "filename"), &why)) {
            json_decref(b);
            return send_errorf(c, SRV_API_NATIVE, 400, "%s", why);
        }
        int n = snprintf(path, sizeof path, "%s/%s", s->cfg.slot_save_path, json_string_value(json_object_get(b, "filename")));
        json_decref(b);
        if (n < 0 || (size_t)n >= sizeof path) return send_errorf(c, SRV_API_NATIVE, 400, "the slot file path is too long");
        fname = path + strlen(s->cfg.slot_save_path) + 1;
    }
#if SRV_SLOT_ACTIONS
    char info[1024] = "";
    keel_status st = erase ? keel_engine_slot_erase(s->e, cn->slot, info, sizeof info)
                     : strcmp(action, "save") == 0 ? keel_engine_slot_save(s->e, cn->slot, path, info, sizeof info)
                                                   : keel_engine_slot_restore(s->e, cn->slot, path, info, sizeof info);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", keel_engine_last_error(s->e));
    if (st != KEEL_OK && st != KEEL_ERANGE) {
        srv_err e;
        srv_err_from_status(&e, st, msg);
        if (st == KEEL_ESTATE) e.status = 409;
        if (st == KEEL_EIO && !erase && strcmp(action, "restore") == 0) e.status = 404;
        return send_error(c, SRV_API_NATIVE, &e);
    }
    json_t *o = json_loads(info, 0, NULL);
    if (!o) o = json_pack("{si}", "id_slot", cn->slot);
    if (o && fname) json_object_set_new(o, "filename", json_string(fname));
    return send_obj(c, 200, o);
#else
    (void)fname;
    return send_errorf(c, SRV_API_NATIVE, 501, "slot %s is not available in this build (the engine lacks slot actions)", action);
#endif
}

/* ---- the access handler --------------------------------------------------------------------- */

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                              const char *version, const char *upload, size_t *upload_size, void **ctx)
{
    srv_server *s = cls;
    conn *cn = *ctx;
    (void)version;
    if (!cn) {
        /* first call: headers only */
        cn = calloc(1, sizeof *cn);
        if (!cn) return MHD_NO;
        *ctx = cn;
        cn->slot = -1;
        cn->body.max = s->cfg.max_body;
        for (size_t i = 0; i < sizeof g_routes / sizeof g_routes[0]; i++)
            if (strcmp(url, g_routes[i].path) == 0) cn->rd = &g_routes[i];
        if (!cn->rd && (cn->slot = slot_of(url)) >= 0) {
            static const route_def slot_route = {"/slots/{id}", R_SLOT_ACTION, true, false, SRV_API_NATIVE};
            cn->rd = &slot_route;
        }
        cn->api = cn->rd ? cn->rd->api : SRV_API_NATIVE;
        cn->r = cn->rd ? cn->rd->r : R_NONE;
        /* the headers are in: the body has --read-timeout from now, and
         * the request may be silent for --timeout (a long prefill) */
        conn_timeout(s, c, s->cfg.timeout_s);
        if (conn_phase(s, c, PH_BODY)) {
            cn->replied = true;
            log_request(s, method, url, 503, NULL);
            return send_errorf_close(c, cn->api, 503, "too many connections (--threads-http %d); retry later",
                                     s->cfg.threads_http);
        }
        bool post = strcmp(method, "POST") == 0, get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
        if (!cn->rd && strncmp(url, "/v1/models/", 11) == 0 && get) {
            static const route_def model_route = {"/v1/models/{id}", R_MODEL, false, true, SRV_API_NATIVE};
            cn->rd = &model_route;
            cn->r = R_MODEL;
        }
        if (cn->rd && (cn->r == R_PAGE || cn->r == R_PAGE_JS) && !s->cfg.webui) cn->rd = NULL;
        if (!cn->rd) {
            cn->replied = true;
            log_request(s, method, url, 404, NULL);
            return send_errorf(c, cn->api, 404, "File Not Found: %s", url);
        }
        if (cn->rd->post ? !post : !get) {
            cn->replied = true;
            log_request(s, method, url, 405, NULL);
            return send_errorf(c, cn->api, 405, "%s %s: method not allowed (use %s)", method, url, cn->rd->post ? "POST" : "GET");
        }
        if (!cn->rd->is_public && !authorized(s, c)) {
            cn->replied = true;
            log_request(s, method, url, 401, NULL);
            return send_errorf(c, cn->api, 401, "Invalid API Key");
        }
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        const char *expect = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_EXPECT);
        if (cl) {
            char *end;
            errno = 0;
            unsigned long long v = strtoull(cl, &end, 10);
            bool bad_len = errno || *end || end == cl;
            if (bad_len || v > s->cfg.max_body) {
                /* answered at once when the client waits for 100-continue
                 * or the body is past what is worth reading; else read
                 * and discarded first, so the client reads the 413 */
                if (bad_len || (expect && strcasecmp(expect, "100-continue") == 0) ||
                    v - s->cfg.max_body > SRV_DISCARD_MAX) {
                    cn->replied = true;
                    log_request(s, method, url, 413, NULL);
                    return send_errorf_close(c, cn->api, 413,
                                             "the request body (%s bytes) is larger than the limit of %zu bytes", cl,
                                             s->cfg.max_body);
                }
                cn->too_large = true;
            }
        }
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (cn->replied) return MHD_YES;
        if (!cn->too_large && !srv_buf_add(&cn->body, upload, n)) {
            cn->too_large = true; /* a chunked body, or longer than its Content-Length said */
            cn->discarded = cn->body.len;
            srv_buf_free(&cn->body);
        }
        if (cn->too_large) {
            cn->discarded += n;
            if (cn->discarded > s->cfg.max_body + SRV_DISCARD_MAX) {
                cn->replied = true;
                log_request(s, method, url, 413, NULL);
                return send_errorf_close(c, cn->api, 413, "the request body is larger than the limit of %zu bytes",
                                         s->cfg.max_body);
            }
        }
        return MHD_YES;
    }
    if (cn->replied) return MHD_YES;
    cn->replied = true;
    if (cn->too_large) {
        log_request(s, method, url, 413, NULL);
        return send_errorf_close(c, cn->api, 413, "the request body%s is larger than the limit of %zu bytes",
                                 cn->discarded ? "" : " (Content-Length)", s->cfg.max_body);
    }
    conn_phase(s, c, PH_ACTIVE);
    if (cn->r == R_HEALTH) {
        pthread_mutex_lock(&s->mu);
        int state = s->state;
        pthread_mutex_unlock(&s->mu);
        if (state == ST_LOADING) return send_json(c, 503, strdup("{\"status\":\"loading\"}"));
        return send_json(c, 200, strdup("{\"status\":\"ok\"}"));
    }
    if (cn->r == R_PAGE || cn->r == R_PAGE_JS) return send_page(c, cn->r == R_PAGE_JS);
    pthread_mutex_lock(&s->mu);
    int state = s->state;
    pthread_mutex_unlock(&s->mu);
    if (state != ST_READY) {
        log_request(s, method, url, 503, NULL);
        return send_errorf(c, cn->api, 503, state == ST_LOADING ? "Loading model" : "the server is shutting down");
    }
    enum MHD_Result res;
    switch (cn->r) {
    case R_MODELS: res = route_models(s, c); break;
    case R_MODEL: res = route_model(s, c, url + 11); break;
    case R_PROPS: res = route_props(s, c); break;
    case R_SLOTS: res = route_slots(s, c); break;
    case R_METRICS: res = route_metrics(s, c); break;
    case R_TOKENIZE: res = route_tokenize(s, c, cn); break;
    case R_DETOKENIZE: res = route_detokenize(s, c, cn); break;
    case R_SLOT_ACTION: res = route_slot_action(s, c, cn); break;
    case R_COUNT: res = route_count(s, c, cn, url); break;
    default: return generate(s, c, cn, url);
    }
    return res;
}

static void completed(void *cls, struct MHD_Connection *c, void **ctx, enum MHD_RequestTerminationCode toe)
{
    srv_server *s = cls;
    conn *cn = *ctx;
    if (toe == MHD_REQUEST_TERMINATED_COMPLETED_OK) {
        /* kept alive: idle until the next request, whose headers have
         * --read-timeout */
        conn_timeout(s, c, s->cfg.keep_alive_s);
        conn_phase(s, c, PH_WAIT);
    }
    if (!cn) return;
    srv_buf_free(&cn->body);
    free(cn);
    *ctx = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    srv_server *s = cls;
    if (!s->cfg.log) return;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r')) msg[--n] = 0;
    fprintf(stderr, "keel serve: http: %s\n", msg);
}

/* ---- lifecycle ------------------------------------------------------------------------------ */

int srv_start(const srv_config *cfg, srv_server **out, char *err, size_t cap)
{
    *out = NULL;
    srv_server *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, cap, "out of memory");
        return -1;
    }
    s->cfg = *cfg;
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->cmu, NULL);
    pthread_cond_init(&s->ccv, NULL);
    s->state = ST_LOADING;
    s->lim = srv_limits_default();
    atomic_init(&s->loop_done, 0);
    const char *name = cfg->alias;
    if (!name) {
        name = cfg->model_path ? strrchr(cfg->model_path, '/') : NULL;
        name = name ? name + 1 : cfg->model_path ? cfg->model_path : "keel";
    }
    snprintf(s->model, sizeof s->model, "%s", name);
    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    char port[16];
    snprintf(port, sizeof port, "%d", cfg->port);
    int gai = getaddrinfo(cfg->host, port, &hints, &ai);
    if (gai != 0 || !ai) {
        snprintf(err, cap, "--host %s: %s", cfg->host, gai ? gai_strerror(gai) : "no address");
        srv_free(s);
        return -1;
    }
    if (pthread_create(&s->wd, NULL, watchdog, s) != 0) {
        snprintf(err, cap, "cannot start the connection watchdog thread");
        freeaddrinfo(ai);
        srv_free(s);
        return -1;
    }
    s->wd_started = true;
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG | MHD_USE_ITC;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    s->d = MHD_start_daemon(flags, (uint16_t)cfg->port, NULL, NULL, handle, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,
                            MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)(cfg->threads_http + SRV_CONN_EXTRA),
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)cfg->keep_alive_s,
                            MHD_OPTION_THREAD_STACK_SIZE, SRV_STACK,
                            MHD_OPTION_NOTIFY_COMPLETED, completed, s, MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)128 * 1024, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->d) {
        snprintf(err, cap, "cannot listen on %s port %d: %s", cfg->host, cfg->port,
                 errno ? strerror(errno) : "libmicrohttpd refused");
        srv_free(s);
        return -1;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : cfg->port;
    *out = s;
    return 0;
}

int srv_port(const srv_server *s)
{
    return s->port;
}

keel_engine *srv_engine(srv_server *s)
{
    return s->e;
}

keel_status srv_load(srv_server *s, char *err)
{
    keel_engine *e = NULL;
    keel_status st = keel_engine_open(s->cfg.engine_options, &e, err);
    if (st != KEEL_OK) return st;
    s->e = e;
    json_t *o = stats_obj(s);
    json_t *mi = json_object_get(o, "model");
    s->n_slots = (int32_t)json_integer_value(json_object_get(o, "n_slots"));
    s->n_ctx_slot = (int32_t)json_integer_value(json_object_get(mi, "n_ctx_slot"));
    s->n_vocab = (int32_t)json_integer_value(json_object_get(mi, "n_vocab"));
    s->n_ctx = (int32_t)json_integer_value(json_object_get(o, "n_ctx"));
    if (o) json_decref(o);
    if (s->n_slots < 1 || s->n_ctx_slot < 1 || s->n_vocab < 1 || s->n_ctx < s->n_ctx_slot) {
        snprintf(err, 256, "the engine's stats lack n_slots / n_ctx / model.n_ctx_slot / model.n_vocab");
        return KEEL_EINTERNAL;
    }
    /* the cache is shared: one slot may fill all of it (n_ctx_slot is an
     * even share, the default compaction trigger) */
    s->lim.max_tokens_cap = s->n_ctx;
    s->lim.default_max_tokens = s->cfg.default_max_tokens;
    s->lim.n_vocab = s->n_vocab;
    s->lim.max_prompt_tokens = 4 * s->n_ctx_slot;
    pthread_mutex_lock(&s->mu);
    if (s->state == ST_LOADING) s->state = ST_READY;
    pthread_mutex_unlock(&s->mu);
    return KEEL_OK;
}

keel_status srv_run(srv_server *s)
{
    keel_status st = s->e ? keel_engine_run(s->e) : KEEL_EINVAL;
    atomic_store(&s->loop_done, 1);
    return st;
}

void srv_quiesce(srv_server *s)
{
    pthread_mutex_lock(&s->mu);
    s->state = ST_STOPPING;
    pthread_mutex_unlock(&s->mu);
    int fd = MHD_quiesce_daemon(s->d);
    if (fd >= 0) close(fd);
}

char *srv_stats(srv_server *s)
{
    if (!s->e) return NULL;
    size_t cap = 16384, n = 0;
    for (int tries = 0; tries < 4; tries++) {
        char *buf = malloc(cap);
        if (!buf) return NULL;
        keel_status st = keel_engine_stats(s->e, buf, cap, &n);
        if (st == KEEL_OK) return buf;
        free(buf);
        if (st != KEEL_ERANGE) return NULL;
        cap = n + 1024;
    }
    return NULL;
}

void srv_free(srv_server *s)
{
    if (!s) return;
    if (s->d) MHD_stop_daemon(s->d); /* every connection closed (and unlisted) */
    if (s->wd_started) {
        pthread_mutex_lock(&s->cmu);
        s->wd_stop = true;
        pthread_cond_broadcast(&s->ccv);
        pthread_mutex_unlock(&s->cmu);
        pthread_join(s->wd, NULL);
    }
    keel_engine_close(s->e);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->cmu);
    pthread_cond_destroy(&s->ccv);
    free(s);
}
