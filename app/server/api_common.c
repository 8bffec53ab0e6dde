/*
 * api_common.c — what both APIs share: bounded buffers, the JSON depth
 * scan and body parsing, error objects (OpenAI and Anthropic shapes) and
 * the mapping of engine failures to HTTP statuses, typed getters, ids,
 * and the dispatch of responses and streams to the API files.
 *
 * Invariants: nothing here recurses on input structure (the depth scan is
 * a loop; jansson only sees bodies the scan accepted, so its recursion is
 * bounded by limits.max_depth); every buffer has a maximum.
 */
#include "srv.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

/* ---- buffers --------------------------------------------------------------- */

static bool buf_reserve(srv_buf *b, size_t extra)
{
    size_t max = b->max ? b->max : SRV_BUF_DEFAULT_MAX;
    if (b->overflow) return false;
    if (extra > max || b->len > max - extra - 1) {
        b->overflow = true;
        return false;
    }
    size_t need = b->len + extra + 1;
    if (need <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need) cap = cap > max / 2 ? max + 1 : cap * 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->overflow = true;
        return false;
    }
    b->p = p;
    b->cap = cap;
    return true;
}

bool srv_buf_add(srv_buf *b, const char *s, size_t n)
{
    if (!buf_reserve(b, n)) return false;
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return true;
}

bool srv_buf_adds(srv_buf *b, const char *s)
{
    return srv_buf_add(b, s, strlen(s));
}

bool srv_buf_addf(srv_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || !buf_reserve(b, (size_t)n)) return false;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return true;
}

bool srv_buf_addjson(srv_buf *b, const json_t *j)
{
    char *s = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(10));
    if (!s) {
        b->overflow = true;
        return false;
    }
    bool ok = srv_buf_adds(b, s);
    free(s);
    return ok;
}

void srv_buf_reset(srv_buf *b)
{
    b->len = 0;
    b->overflow = false;
    if (b->p) b->p[0] = 0;
}

void srv_buf_free(srv_buf *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
    b->overflow = false;
}

char *srv_buf_take(srv_buf *b)
{
    char *p = b->p;
    if (!p) p = calloc(1, 1);
    b->p = NULL;
    b->len = b->cap = 0;
    b->overflow = false;
    return p;
}

/* ---- limits and errors ---------------------------------------------------------- */

srv_limits srv_limits_default(void)
{
    srv_limits l;
    l.max_depth = 64;
    l.max_messages = 16384;
    l.max_tools = 1024;
    l.max_parts = 4096;
    l.max_stop = 16;
    l.max_tokens_cap = 4096;
    l.default_max_tokens = -1;
    l.n_vocab = INT32_MAX;
    l.max_prompt_tokens = 1 << 20;
    return l;
}

bool srv_api_is_anthropic(srv_api api)
{
    return api == SRV_API_MESSAGES || api == SRV_API_COUNT_TOKENS;
}

bool srv_fail(srv_err *e, int status, const char *fmt, ...)
{
    e->status = status;
    e->type = NULL;
    e->code = NULL;
    e->param = NULL;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return false;
}

const char *srv_openai_type(int status)
{
    switch (status) {
    case 400: case 405: case 413: case 422: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 501: return "not_supported_error";
    case 503: return "unavailable_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

const char *srv_anthropic_type(int status)
{
    switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: case 529: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
    }
}

char *srv_error_body(srv_api api, const srv_err *e)
{
    json_t *o;
    if (srv_api_is_anthropic(api)) {
        o = json_pack("{ss s{ssss}}", "type", "error", "error", "type", e->type ? e->type : srv_anthropic_type(e->status),
                      "message", e->msg);
    } else {
        o = json_pack("{s{sissssso}}", "error", "code", e->status, "message", e->msg, "type",
                      e->type ? e->type : srv_openai_type(e->status), "param",
                      e->param ? json_string(e->param) : json_null());
        /* OpenAI's string codes ("context_length_exceeded") where there is one */
        if (o && e->code) json_object_set_new(json_object_get(o, "error"), "code", json_string(e->code));
    }
    if (!o) return NULL;
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

void srv_err_from_status(srv_err *e, keel_status st, const char *message)
{
    int status = 500;
    const char *code = NULL;
    switch (st) {
    case KEEL_EINVAL: case KEEL_ERANGE: case KEEL_EOVERFLOW: status = 400; break;
    case KEEL_ECONTEXT: status = 400; code = "context_length_exceeded"; break;
    case KEEL_EFULL: case KEEL_ECANCELED: status = 503; break;
    case KEEL_EUNSUPPORTED: status = 501; break;
    default: status = 500; break;
    }
    srv_fail(e, status, "%s", message && *message ? message : keel_strerror(st));
    e->code = code;
}

bool srv_fail_context(srv_err *e, srv_api api, int64_t n, int64_t max)
{
    if (srv_api_is_anthropic(api)) {
        srv_fail(e, 400, "prompt is too long: %lld tokens > %lld maximum", (long long)n, (long long)max);
    } else {
        srv_fail(e, 400,
                 "This model's maximum context length is %lld tokens. However, your %s resulted in %lld tokens. "
                 "Please reduce the length of the %s.",
                 (long long)max, api == SRV_API_COMPLETIONS ? "prompt" : "messages", (long long)n,
                 api == SRV_API_COMPLETIONS ? "prompt" : "messages");
        e->param = api == SRV_API_COMPLETIONS ? "prompt" : "messages";
    }
    e->type = "invalid_request_error";
    e->code = "context_length_exceeded";
    return false;
}

/* ---- bodies ------------------------------------------------------------------------ */

int srv_json_depth(const char *s, size_t n, int limit)
{
    int depth = 0, max = 0;
    bool str = false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (str) {
            if (c == '\\') i++;
            else if (c == '"') str = false;
            continue;
        }
        if (c == '"') {
            str = true;
        } else if (c == '[' || c == '{') {
            if (++depth > max) max = depth;
            if (max > limit) return max;
        } else if ((c == ']' || c == '}') && depth > 0) {
            depth--;
        }
    }
    return max;
}

json_t *srv_parse_body(const char *body, size_t n, const srv_limits *lim, srv_err *e)
{
    if (n == 0) {
        srv_fail(e, 400, "the request body is empty (a JSON object is expected)");
        return NULL;
    }
    int d = srv_json_depth(body, n, lim->max_depth);
    if (d > lim->max_depth) {
        srv_fail(e, 400, "JSON nested deeper than %d levels", lim->max_depth);
        return NULL;
    }
    json_error_t je;
    /* NUL allowed: the engine can generate U+0000, and a client echoing
     * its history sends it back */
    json_t *j = json_loadb(body, n, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
    if (!j) {
        srv_fail(e, 400, "invalid JSON at line %d, column %d: %s", je.line, je.column, je.text);
        return NULL;
    }
    if (!json_is_object(j)) {
        json_decref(j);
        srv_fail(e, 400, "the request body must be a JSON object");
        return NULL;
    }
    return j;
}

/* Length of the valid UTF-8 sequence at s[0..n), or 0. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t len = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    if (!len || len > n) return 0;
    for (size_t i = 1; i < len; i++)
        if ((s[i] & 0xc0) != 0x80) return 0;
    if (c == 0xe0 && s[1] < 0xa0) return 0;  /* overlong */
    if (c == 0xed && s[1] >= 0xa0) return 0; /* surrogate */
    if (c == 0xf0 && s[1] < 0x90) return 0;  /* overlong */
    if (c == 0xf4 && s[1] >= 0x90) return 0; /* > U+10FFFF */
    return len;
}

json_t *srv_json_text(const char *s, size_t n)
{
    if (!s) return json_string("");
    json_t *j = json_stringn(s, n);
    if (j) return j;
    /* invalid UTF-8 (or NUL bytes): repair into a copy */
    srv_buf b = {0};
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        size_t k = u[i] ? utf8_len(u + i, n - i) : 0;
        if (k) {
            srv_buf_add(&b, s + i, k);
            i += k;
        } else {
            srv_buf_add(&b, "\xef\xbf\xbd", 3);
            i++;
        }
    }
    j = b.overflow ? NULL : json_stringn(b.p ? b.p : "", b.len);
    srv_buf_free(&b);
    return j;
}

void srv_random_hex(char *out, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static uint64_t state;
    uint8_t raw[32];
    size_t have = 0;
    while (have < n) {
        size_t want = (n - have + 1) / 2;
        if (want > sizeof raw) want = sizeof raw;
        ssize_t got = getrandom(raw, want, GRND_NONBLOCK);
        if (got <= 0) {
            /* no entropy yet: ids need only be unique, not secret */
            pthread_mutex_lock(&mu);
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            state += 0x9e3779b97f4a7c15ull ^ (uint64_t)ts.tv_nsec;
            for (size_t i = 0; i < want; i++) {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                raw[i] = (uint8_t)state;
            }
            pthread_mutex_unlock(&mu);
            got = (ssize_t)want;
        }
        for (ssize_t i = 0; i < got && have < n; i++) {
            out[have++] = hex[raw[i] >> 4];
            if (have < n) out[have++] = hex[raw[i] & 15];
        }
    }
    out[n] = 0;
}

/* ---- typed getters ------------------------------------------------------------------ */

bool srv_get_bool(json_t *o, const char *k, bool *out, srv_err *e)
{
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) return true;
    if (!json_is_boolean(v)) return srv_fail(e, 400, "%s must be a boolean", k);
    *out = json_is_true(v);
    return true;
}

bool srv_get_str(json_t *o, const char *k, const char **out, srv_err *e)
{
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) return true;
    if (!json_is_string(v)) return srv_fail(e, 400, "%s must be a string", k);
    *out = json_string_value(v);
    return true;
}

bool srv_copy_num(json_t *src, const char *k, json_t *dst, const char *dk, double lo, double hi, srv_err *e)
{
    json_t *v = json_object_get(src, k);
    if (!v || json_is_null(v)) return true;
    if (!json_is_number(v)) return srv_fail(e, 400, "%s must be a number", k);
    double d = json_number_value(v);
    if (!isfinite(d) || d < lo || d > hi) return srv_fail(e, 400, "%s %g is out of range [%g, %g]", k, d, lo, hi);
    if (json_object_set_new(dst, dk, json_real(d)) != 0) return srv_fail(e, 500, "out of memory");
    return true;
}

bool srv_copy_int(json_t *src, const char *k, json_t *dst, const char *dk, int64_t lo, int64_t hi, srv_err *e)
{
    json_t *v = json_object_get(src, k);
    if (!v || json_is_null(v)) return true;
    if (!json_is_integer(v)) return srv_fail(e, 400, "%s must be an integer", k);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return srv_fail(e, 400, "%s %lld is out of range [%lld, %lld]", k, (long long)x, (long long)lo, (long long)hi);
    if (json_object_set_new(dst, dk, json_integer(x)) != 0) return srv_fail(e, 500, "out of memory");
    return true;
}

bool srv_copy_max_tokens(json_t *src, const char *k, json_t *dst, const srv_limits *lim, srv_err *e)
{
    json_t *v = json_object_get(src, k);
    int64_t n = lim->default_max_tokens;
    if (v && !json_is_null(v)) {
        if (!json_is_integer(v)) return srv_fail(e, 400, "%s must be an integer", k);
        json_int_t x = json_integer_value(v);
        if (x < -1 || x > INT32_MAX)
            return srv_fail(e, 400, "%s %lld is out of range [0, %d] (-1: up to the context)", k, (long long)x,
                            INT32_MAX);
        n = x;
    } else if (json_object_get(dst, "max_tokens")) {
        return true; /* set from another member already (max_completion_tokens) */
    }
    if (n < 0 || n > lim->max_tokens_cap) n = lim->max_tokens_cap;
    if (json_object_set_new(dst, "max_tokens", json_integer(n)) != 0) return srv_fail(e, 500, "out of memory");
    return true;
}

bool srv_copy_stop(json_t *src, const char *k, json_t *dst, const srv_limits *lim, srv_err *e)
{
    json_t *v = json_object_get(src, k);
    if (!v || json_is_null(v)) return true;
    json_t *arr = json_array();
    if (!arr) return srv_fail(e, 500, "out of memory");
    if (json_is_string(v)) {
        json_array_append(arr, v);
    } else if (json_is_array(v)) {
        if (json_array_size(v) > lim->max_stop) {
            json_decref(arr);
            return srv_fail(e, 400, "%s: %zu strings (at most %zu)", k, json_array_size(v), lim->max_stop);
        }
        size_t i;
        json_t *s;
        json_array_foreach(v, i, s) {
            if (!json_is_string(s)) {
                json_decref(arr);
                return srv_fail(e, 400, "%s[%zu] must be a string", k, i);
            }
            json_array_append(arr, s);
        }
    } else {
        json_decref(arr);
        return srv_fail(e, 400, "%s must be a string or an array of strings", k);
    }
    if (json_object_set_new(dst, "stop", arr) != 0) return srv_fail(e, 500, "out of memory");
    return true;
}

json_t *srv_engine_usage(json_t *resp, const char *k, int64_t *out)
{
    json_t *v = json_object_get(json_object_get(resp, "usage"), k);
    *out = json_is_integer(v) ? json_integer_value(v) : 0;
    return v;
}

/* ---- requests, responses and streams ----------------------------------------------------- */

void srv_request_free(srv_request *r)
{
    if (!r) return;
    if (r->engine) json_decref(r->engine);
    r->engine = NULL;
}

bool srv_request_parse(srv_api api, const char *body, size_t n, const srv_limits *lim, srv_request *out,
                       srv_err *e)
{
    memset(out, 0, sizeof *out);
    out->api = api;
    json_t *j = srv_parse_body(body, n, lim, e);
    if (!j) return false;
    bool ok;
    if (srv_api_is_anthropic(api))
        ok = srv_anthropic_parse(api, j, lim, out, e);
    else if (api == SRV_API_CHAT || api == SRV_API_COMPLETIONS)
        ok = srv_openai_parse(api, j, lim, out, e);
    else
        ok = srv_fail(e, 404, "no generation API at this route");
    json_decref(j);
    if (!ok) srv_request_free(out);
    return ok;
}

void srv_meta_init(srv_meta *m, srv_api api, const char *model)
{
    memset(m, 0, sizeof *m);
    m->api = api;
    m->model = model ? model : "";
    m->created = (int64_t)time(NULL);
    const char *prefix = api == SRV_API_COMPLETIONS ? "cmpl-" : srv_api_is_anthropic(api) ? "msg_" : "chatcmpl-";
    size_t pl = strlen(prefix);
    memcpy(m->id, prefix, pl);
    srv_random_hex(m->id + pl, 24);
}

void srv_toolu_id(const char *id, char *out, size_t cap)
{
    if (!id) id = "";
    if (strncmp(id, "toolu_", 6) == 0)
        snprintf(out, cap, "%s", id);
    else if (strncmp(id, "call_", 5) == 0)
        snprintf(out, cap, "toolu_%s", id + 5);
    else
        snprintf(out, cap, "toolu_%s", id);
}

/* The engine's failure of a finished request, or false when it succeeded. */
static bool engine_failed(srv_api api, json_t *resp, keel_status st, srv_err *e)
{
    const char *msg = json_string_value(json_object_get(resp, "error"));
    int64_t n = 0;
    json_t *limit = json_object_get(resp, "prompt_limit");
    if (st == KEEL_ECONTEXT && json_is_integer(limit) && srv_engine_usage(resp, "prompt_tokens", &n)) {
        srv_fail_context(e, api, n, json_integer_value(limit));
        return true;
    }
    if (st == KEEL_ECANCELED) {
        srv_fail(e, 503, "the request was cancelled (the server is shutting down or the client went away)");
        return true;
    }
    if (st != KEEL_OK || msg) {
        srv_err_from_status(e, st != KEEL_OK ? st : KEEL_EINTERNAL, msg);
        return true;
    }
    return false;
}

char *srv_response_body(const srv_meta *m, const char *engine_response, keel_status st, int *status)
{
    json_t *resp = engine_response ? json_loads(engine_response, JSON_ALLOW_NUL, NULL) : NULL;
    srv_err e;
    char *out = NULL;
    if (!resp) {
        srv_err_from_status(&e, st != KEEL_OK ? st : KEEL_EINTERNAL, "the engine's response is not JSON");
    } else if (!engine_failed(m->api, resp, st, &e)) {
        *status = 200;
        out = srv_api_is_anthropic(m->api) ? srv_anthropic_response(m, resp) : srv_openai_response(m, resp);
        json_decref(resp);
        return out;
    }
    if (resp) json_decref(resp);
    *status = e.status;
    return srv_error_body(m->api, &e);
}

void srv_stream_init(srv_stream *s, const srv_meta *m, bool include_usage)
{
    memset(s, 0, sizeof *s);
    s->m = *m;
    s->include_usage = include_usage;
    s->block = -1;
    s->tool = -1;
    s->args.max = (size_t)4 << 20;
}

void srv_stream_free(srv_stream *s)
{
    srv_buf_free(&s->args);
    if (s->lp) json_decref(s->lp);
    s->lp = NULL;
}

bool srv_stream_event(srv_stream *s, const keel_event *ev, srv_buf *out)
{
    if (s->ended || ev->kind == KEEL_EVENT_DONE) return true;
    if (ev->kind == KEEL_EVENT_PROMPT) {
        s->prompt_tokens = ev->n_prompt_tokens;
        s->cached_tokens = ev->n_cached_tokens;
    }
    return srv_api_is_anthropic(s->m.api) ? srv_anthropic_event(s, ev, out) : srv_openai_event(s, ev, out);
}

bool srv_stream_done(srv_stream *s, const char *engine_response, keel_status st, srv_buf *out)
{
    if (s->ended) return true;
    s->ended = true;
    json_t *resp = engine_response ? json_loads(engine_response, JSON_ALLOW_NUL, NULL) : NULL;
    srv_err e;
    bool ok;
    if (!resp || engine_failed(s->m.api, resp, st, &e)) {
        if (!resp) srv_err_from_status(&e, st != KEEL_OK ? st : KEEL_EINTERNAL, "the engine's response is not JSON");
        char *body = srv_error_body(s->m.api, &e);
        if (srv_api_is_anthropic(s->m.api))
            ok = srv_buf_addf(out, "event: error\ndata: %s\n\n", body ? body : "{}");
        else
            ok = srv_buf_addf(out, "data: %s\n\n", body ? body : "{}");
        free(body);
    } else {
        ok = srv_api_is_anthropic(s->m.api) ? srv_anthropic_done(s, resp, out) : srv_openai_done(s, resp, out);
    }
    if (resp) json_decref(resp);
    return ok;
}

bool srv_stream_ping(srv_stream *s, srv_buf *out)
{
    if (s->ended) return true;
    if (srv_api_is_anthropic(s->m.api))
        return s->started ? srv_buf_adds(out, "event: ping\ndata: {\"type\":\"ping\"}\n\n") : true;
    return srv_buf_adds(out, ": keep-alive\n\n");
}

bool srv_set_tool_choice(json_t *req, const char *only, bool required, srv_err *e)
{
    if (!only && !required) return true;
    json_t *tc = only ? json_pack("{ss}", "name", only) : json_string("required");
    if (!tc || json_object_set_new(req, "tool_choice", tc) != 0) return srv_fail(e, 500, "out of memory");
    return true;
}
