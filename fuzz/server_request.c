/*
 * server_request.c — libFuzzer target for keel serve's request parsers and
 * converters (app/server/api_*.c), both APIs, without HTTP.
 *
 * Input: byte 0 selects the route (chat, completions, messages,
 * count_tokens), the rest is the request body. The body is parsed and
 * converted; an accepted request must give an engine request with exactly
 * one prompt form and max_tokens within the cap; a refused one a 4xx error
 * whose body (both shapes) is JSON. The same bytes are then used as an
 * engine response (responses and stream ends of every API), as a sequence
 * of engine events for the stream encoders, and as SSE for the client's
 * event parser. Nothing may crash, leak or trip a sanitizer.
 */
#include "../app/server/srv.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const srv_api g_apis[4] = {SRV_API_CHAT, SRV_API_COMPLETIONS, SRV_API_MESSAGES, SRV_API_COUNT_TOKENS};

static void check_error_body(srv_api api, const srv_err *e)
{
    if (e->status < 400 || e->status > 599) abort();
    char *b = srv_error_body(api, e);
    json_t *j = b ? json_loads(b, 0, NULL) : NULL;
    if (b && !j) abort(); /* the error body must be JSON */
    if (j) json_decref(j);
    free(b);
}

static void fuzz_request(srv_api api, const char *body, size_t n)
{
    srv_limits lim = srv_limits_default();
    lim.max_tokens_cap = 512;
    lim.default_max_tokens = -1;
    lim.n_vocab = 1000;
    lim.max_prompt_tokens = 256;
    lim.max_messages = 64;
    lim.max_tools = 8;
    lim.max_parts = 16;
    srv_request rq;
    srv_err e;
    if (!srv_request_parse(api, body, n, &lim, &rq, &e)) {
        check_error_body(api, &e);
        return;
    }
    json_t *r = rq.engine;
    int forms = (json_object_get(r, "messages") != NULL) + (json_object_get(r, "prompt") != NULL) +
                (json_object_get(r, "prompt_tokens") != NULL);
    if (forms != 1) abort();
    json_t *mt = json_object_get(r, "max_tokens");
    if (!json_is_integer(mt) || json_integer_value(mt) < 0 || json_integer_value(mt) > lim.max_tokens_cap) abort();
    char *s = json_dumps(r, JSON_COMPACT);
    if (!s) abort();
    free(s);
    srv_request_free(&rq);
}

static void fuzz_outputs(const char *text, size_t n)
{
    char *resp = malloc(n + 1);
    if (!resp) return;
    memcpy(resp, text, n);
    resp[n] = 0;
    for (int a = 0; a < 4; a++) {
        srv_meta m;
        srv_meta_init(&m, g_apis[a], "fuzz");
        int status = 0;
        /* KEEL_ECONTEXT: the prompt too long error reads usage and prompt_limit */
        char *b = srv_response_body(&m, resp, n & 1 ? KEEL_OK : n & 8 ? KEEL_ECONTEXT : KEEL_EINVAL, &status);
        free(b);
        /* events: each 8-byte group is (kind, index, text length) over the input */
        srv_stream s;
        srv_stream_init(&s, &m, (n & 2) != 0);
        srv_buf out = {0};
        out.max = 1 << 20;
        size_t pos = 0;
        for (size_t i = 0; i + 3 <= n && i < 3 * 64; i += 3) {
            keel_event ev;
            memset(&ev, 0, sizeof ev);
            ev.kind = (keel_event_kind)((unsigned char)text[i] % 7);
            ev.n_prompt_tokens = (int32_t)(unsigned char)text[i + 1] * 37;
            ev.n_cached_tokens = (int32_t)(unsigned char)text[i + 2];
            ev.index = (int32_t)((unsigned char)text[i + 1] % 4) - 1;
            size_t len = (unsigned char)text[i + 2] % 16;
            if (pos + len > n) len = n - pos;
            ev.text = text + pos;
            ev.len = len;
            ev.id = "call_fuzz";
            ev.name = len ? "tool" : NULL;
            ev.error = ev.kind == KEEL_EVENT_TOOL_END && (len & 1) ? "malformed" : NULL;
            pos = (pos + len) % (n ? n : 1);
            if (!srv_stream_event(&s, &ev, &out)) break;
            if (i % 7 == 0) srv_stream_ping(&s, &out);
        }
        srv_stream_done(&s, resp, n & 4 ? KEEL_OK : KEEL_EFULL, &out);
        srv_stream_free(&s);
        srv_buf_free(&out);
    }
    free(resp);
    /* the client's SSE parser */
    size_t p = 0;
    bool bad = false;
    srv_sse_event ev;
    memset(&ev, 0, sizeof ev);
    while (srv_sse_next(text, n, &p, &ev, &bad)) {
        if (p > n) abort();
    }
    srv_buf_free(&ev.data);
    json_t *t = srv_json_text(text, n);
    if (!t) abort();
    json_decref(t);
    if (srv_json_depth(text, n, 64) < 0) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    srv_api api = g_apis[data[0] % 4];
    fuzz_request(api, (const char *)data + 1, size - 1);
    fuzz_outputs((const char *)data + 1, size - 1);
    return 0;
}
