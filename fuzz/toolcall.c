/*
 * fuzz/toolcall.c — libFuzzer target: the tool-call / reasoning parser
 * (src/chat/toolcall.h) over arbitrary model output. Byte 0 picks the
 * format (every one: modulo their count), byte 1 the options (reasoning
 * already open, a tool list, reasoning parsing off, a JSON answer); byte 2
 * says how many of the next bytes are chunk sizes; the rest is the text,
 * fed once whole and once in chunks of those sizes. Seeds: fuzz/corpus/
 * libfuzzer_toolcall (llama.cpp's chat cases for every format, written by
 * test_chat_conformance with KEEL_CONFORMANCE_SEEDS=dir).
 * Checks (abort on failure):
 *   - both runs give the same result (content, reasoning, calls, errors);
 *   - in each run the concatenated event deltas equal the result and the
 *     events are well formed (BEGIN, ARGS*, END per call, in order);
 *   - a call without an error has arguments that are one JSON value;
 *   - held bytes stay within the documented bound.
 */
#include "chat/toolcall.h"
#include "chat/toolcall_int.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct sink {
    char *content, *reasoning, *args[64];
    size_t content_n, reasoning_n, args_n[64];
    int32_t open;  /* open call index or -1 */
    int32_t begun; /* calls begun */
    bool bad;
} sink;

static void append(char **b, size_t *n, const char *s, size_t k)
{
    char *p = realloc(*b, *n + k + 1);
    if (!p) abort();
    memcpy(p + *n, s, k);
    *n += k;
    p[*n] = 0;
    *b = p;
}

static void on_event(void *u, const toolcall_event *e)
{
    sink *s = u;
    switch (e->kind) {
    case TOOLCALL_EV_CONTENT: append(&s->content, &s->content_n, e->text, e->len); break;
    case TOOLCALL_EV_REASONING: append(&s->reasoning, &s->reasoning_n, e->text, e->len); break;
    case TOOLCALL_EV_CALL_BEGIN:
        if (s->open >= 0 || e->index != s->begun || !e->name || !e->name[0] || !e->id) s->bad = true;
        s->open = e->index;
        s->begun++;
        break;
    case TOOLCALL_EV_CALL_ARGS:
        if (e->index != s->open || e->index >= 64) {
            s->bad = true;
            break;
        }
        append(&s->args[e->index], &s->args_n[e->index], e->text, e->len);
        break;
    case TOOLCALL_EV_CALL_END:
        if (e->index != s->open) s->bad = true;
        s->open = -1;
        break;
    }
}

static void sink_free(sink *s)
{
    free(s->content);
    free(s->reasoning);
    for (int i = 0; i < 64; i++)
        free(s->args[i]);
}

static bool same(const char *a, size_t an, const char *b, size_t bn)
{
    return an == bn && (an == 0 || memcmp(a, b, an) == 0);
}

static json_t *g_tools;

static toolcall_parser *open_parser(uint8_t fmt, uint8_t sel, sink *s)
{
    toolcall_options o = toolcall_options_default();
    o.format = (toolcall_format)(fmt % TOOLCALL_FORMAT_COUNT_);
    o.starts_in_reasoning = sel & 1;
    o.tools = (sel & 2) ? g_tools : NULL;
    o.parse_reasoning = !(sel & 4) || (sel & 1);
    o.json_answer = sel & 8;
    o.max_held_bytes = 4096;
    o.on_event = on_event;
    o.event_user = s;
    toolcall_parser *p;
    if (toolcall_open(&o, &p, NULL)) abort();
    return p;
}

static void check_sink(const sink *s, const toolcall_result *r)
{
    if (s->bad || s->open >= 0 || s->begun != r->n_calls) abort();
    if (!same(s->content, s->content_n, r->content, r->content_len)) abort();
    if (!same(s->reasoning, s->reasoning_n, r->reasoning, r->reasoning_len)) abort();
    int32_t bad = 0;
    for (int32_t i = 0; i < r->n_calls && i < 64; i++) {
        const toolcall_call *c = &r->calls[i];
        if (!same(s->args[i], s->args_n[i], c->arguments, c->arguments_len)) abort();
        if (c->arguments[c->arguments_len] != 0 || !c->name[0]) abort();
        if (c->error) {
            bad++;
            continue;
        }
        size_t k = 0;
        if (tc_json_skip(c->arguments, c->arguments_len, &k, true) != TC_OK ||
            tc_skip_ws(c->arguments, c->arguments_len, k) != c->arguments_len)
            abort();
    }
    if (bad != r->n_malformed || (bad > 0) != (r->error != NULL)) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2) return 0;
    if (!g_tools) {
        g_tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                             "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":"
                             "\"string\"},\"days\":{\"type\":\"integer\"},\"opts\":{\"type\":\"object\"},"
                             "\"ok\":{\"type\":\"boolean\"}}}}},{\"name\":\"read_file\",\"input_schema\":"
                             "{\"properties\":{\"path\":{\"type\":\"string\"}}}}]",
                             0, NULL);
        if (!g_tools) abort();
    }
    if (size < 3) return 0;
    uint8_t fmt = data[0], sel = data[1];
    size_t nk = data[2] % 8, off = 3 + nk;
    if (off > size) return 0;
    const uint8_t *ks = data + 3;
    const char *text = (const char *)data + off;
    size_t n = size - off;

    sink a = {.open = -1}, b = {.open = -1};
    toolcall_parser *pa = open_parser(fmt, sel, &a), *pb = open_parser(fmt, sel, &b);
    if (toolcall_feed(pa, text, n)) abort();
    size_t held_max = 0;
    for (size_t i = 0, c = 0; i < n; c++) {
        size_t k = nk ? (size_t)(ks[c % nk] % 32) + 1 : 1;
        if (k > n - i) k = n - i;
        if (toolcall_feed(pb, text + i, k)) abort();
        size_t h = toolcall_held_bytes(pb);
        if (h > held_max) held_max = h;
        i += k;
    }
    /* 4096 max_held + whitespace (1024) + a marker + a header (4096) + a feed step */
    if (held_max > 4096 + 1024 + 64 + 4096 + 4096) abort();
    toolcall_result ra, rb;
    if (toolcall_finish(pa, &ra) || toolcall_finish(pb, &rb)) abort();
    check_sink(&a, &ra);
    check_sink(&b, &rb);
    if (!same(ra.content, ra.content_len, rb.content, rb.content_len) ||
        !same(ra.reasoning, ra.reasoning_len, rb.reasoning, rb.reasoning_len) ||
        ra.n_calls != rb.n_calls || ra.n_malformed != rb.n_malformed)
        abort();
    for (int32_t i = 0; i < ra.n_calls; i++) {
        const toolcall_call *x = &ra.calls[i], *y = &rb.calls[i];
        if (strcmp(x->id, y->id) || strcmp(x->name, y->name) || x->error != y->error ||
            !same(x->arguments, x->arguments_len, y->arguments, y->arguments_len))
            abort();
    }
    json_t *j;
    if (toolcall_result_json(&rb, &j, NULL)) abort();
    json_decref(j);
    toolcall_close(pa);
    toolcall_close(pb);
    sink_free(&a);
    sink_free(&b);
    return 0;
}
