/*
 * srv.h — keel serve, the OpenAI- and Anthropic-compatible HTTP server
 * (docs/server.md). The server uses only keel.h, libmicrohttpd and jansson.
 *
 *   api_common.c     bounded buffers, JSON limits (depth), error objects of
 *                    both APIs, ids
 *   api_openai.c     /v1/chat/completions and /v1/completions: request JSON
 *                    -> engine request JSON; engine events -> SSE chunks;
 *                    engine response -> response JSON
 *   api_anthropic.c  /v1/messages and /v1/messages/count_tokens: the same
 *   http.c           the daemon (thread per connection), routing, auth,
 *                    the per-request event queues and SSE streaming
 *   metrics.c        /metrics: Prometheus text from keel_engine_stats
 *   serve.c          `keel serve`: flags, engine options, start, signals,
 *                    shutdown
 *   bench_serve.c    `keel bench-serve`: throughput and TTFT at several
 *                    concurrencies
 *
 * The api_*.c files are pure functions of their inputs (no engine, no
 * sockets): the fuzz target fuzz/server_request.c and test_server_api.c
 * call them directly.
 */
#ifndef KEEL_SERVER_SRV_H
#define KEEL_SERVER_SRV_H

#include "keel.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- bounded buffers ------------------------------------------------------ */

/* A growable byte buffer with a maximum: an append past max fails (and sets
 * overflow) instead of growing. p is NUL-terminated while len < cap. */
typedef struct srv_buf {
    char *p;
    size_t len, cap, max; /* max 0: SRV_BUF_DEFAULT_MAX */
    bool overflow;
} srv_buf;

#define SRV_BUF_DEFAULT_MAX ((size_t)256 << 20)

bool srv_buf_add(srv_buf *b, const char *s, size_t n);
bool srv_buf_adds(srv_buf *b, const char *s);
bool srv_buf_addf(srv_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends j as compact JSON (UTF-8, not ASCII-escaped). */
bool srv_buf_addjson(srv_buf *b, const json_t *j);
void srv_buf_reset(srv_buf *b);
void srv_buf_free(srv_buf *b);
/* Takes the bytes (NUL-terminated, malloc'd; "" for an empty buffer);
 * the buffer is empty afterwards. NULL on allocation failure. */
char *srv_buf_take(srv_buf *b);

/* ---- APIs, limits, errors --------------------------------------------------- */

typedef enum srv_api {
    SRV_API_NATIVE = 0,       /* /health, /tokenize, /slots, ...: OpenAI-style errors */
    SRV_API_CHAT = 1,         /* POST /v1/chat/completions */
    SRV_API_COMPLETIONS = 2,  /* POST /v1/completions */
    SRV_API_MESSAGES = 3,     /* POST /v1/messages (Anthropic) */
    SRV_API_COUNT_TOKENS = 4, /* POST /v1/messages/count_tokens (Anthropic) */
} srv_api;

/* Anthropic routes answer with Anthropic error objects. */
bool srv_api_is_anthropic(srv_api api);

typedef struct srv_limits {
    int max_depth;             /* JSON nesting levels of a body (64) */
    size_t max_messages;       /* messages of one request (16384) */
    size_t max_tools;          /* tool definitions (1024) */
    size_t max_parts;          /* content parts / blocks of one message (4096) */
    size_t max_stop;           /* stop strings (16, the engine's limit) */
    int32_t max_tokens_cap;    /* max_tokens above this are lowered to it (the context per slot) */
    int32_t default_max_tokens; /* when the request gives none (-1: until the end or the context) */
    int32_t n_vocab;           /* token ids of prompt arrays are in [0, n_vocab) */
    int32_t max_prompt_tokens; /* token-array prompts hold at most this many ids */
} srv_limits;

srv_limits srv_limits_default(void);

/* An error a request gets: HTTP status, the API's error type (NULL: from the
 * status), an optional code ("context_length_exceeded") and the message. */
typedef struct srv_err {
    int status;
    const char *type;
    const char *code;
    const char *param; /* OpenAI's error.param ("messages"), or NULL */
    char msg[512];
} srv_err;

/* Sets e (status, message) and returns false, so parsers can `return srv_fail(...)`. */
bool srv_fail(srv_err *e, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The error body of api for e (malloc'd JSON text; NULL on OOM):
 *   OpenAI:    {"error": {"code": 400, "message", "type", "param": null}}
 *   Anthropic: {"type": "error", "error": {"type", "message"}} */
char *srv_error_body(srv_api api, const srv_err *e);
/* The HTTP status, type and code of an engine failure (keel_status). */
void srv_err_from_status(srv_err *e, keel_status st, const char *message);
/* A prompt of n tokens, more than max: 400 with the message clients match
 * to compact their conversation — Anthropic's "prompt is too long: N tokens
 * > M maximum", OpenAI's "This model's maximum context length is M tokens.
 * However, your messages resulted in N tokens. ..." with code
 * context_length_exceeded and param "messages" ("prompt" on completions).
 * Returns false. */
bool srv_fail_context(srv_err *e, srv_api api, int64_t n, int64_t max);

/* Longest nesting of arrays and objects in the n bytes of JSON text s (a
 * linear scan; strings and escapes skipped), stopping early once past
 * limit. Runs before jansson so deep input never recurses there. */
int srv_json_depth(const char *s, size_t n, int limit);
/* Parses a request body: depth, JSON validity (UTF-8, no duplicate keys,
 * numbers in range), a top-level object. NULL with e set (400) otherwise. */
json_t *srv_parse_body(const char *body, size_t n, const srv_limits *lim, srv_err *e);

/* A JSON string of the n bytes at s; invalid UTF-8 (which model output may
 * hold) becomes U+FFFD instead of failing. NULL only on OOM. */
json_t *srv_json_text(const char *s, size_t n);

/* Passes a forced tool call on to the engine request req: tool_choice
 * {"name": only} for a named tool, else "required" when required (the
 * engine then opens the call in the prompt where the format has an
 * opening); nothing when neither. False with e set (500) on OOM. */
bool srv_set_tool_choice(json_t *req, const char *only, bool required, srv_err *e);

/* Random lowercase hex of n characters into out (n + 1 bytes). */
void srv_random_hex(char *out, size_t n);

/* ---- requests ------------------------------------------------------------------ */

/* A parsed generation request. */
typedef struct srv_request {
    srv_api api;
    bool stream;
    bool include_usage; /* stream_options.include_usage (OpenAI) */
    bool return_progress; /* llama-server's: prompt_progress chunks while streaming (OpenAI) */
    json_t *engine;     /* owned: the engine request object (keel_engine_submit) */
} srv_request;

void srv_request_free(srv_request *r);

/*
 * Turns the body of a request to api (CHAT, COMPLETIONS, MESSAGES,
 * COUNT_TOKENS) into the engine's request: OpenAI-style messages (Anthropic
 * system blocks joined, tool_use -> assistant tool_calls, tool_result -> tool
 * messages), tools in OpenAI form (tool_choice "none" drops them, a named
 * tool keeps only that one), sampling options, stop strings, max_tokens
 * (capped), chat_template_kwargs (Anthropic thinking -> enable_thinking),
 * continue_final_message and reasoning_format (OpenAI chat). A trailing
 * assistant message stays last: the engine continues it (Anthropic's
 * prefill, which may not end in whitespace). Every value's type and range
 * is checked; false with e (4xx) otherwise.
 */
bool srv_request_parse(srv_api api, const char *body, size_t n, const srv_limits *lim, srv_request *out,
                       srv_err *e);

/* ---- responses and streams ------------------------------------------------------- */

/* Identity of a response: the id ("chatcmpl-…", "cmpl-…", "msg_…"), the model
 * name and the creation time (Unix seconds). */
typedef struct srv_meta {
    srv_api api;
    char id[48];
    const char *model;
    int64_t created;
} srv_meta;

void srv_meta_init(srv_meta *m, srv_api api, const char *model);

/*
 * The response body of a finished non-streaming request from the engine's
 * response JSON (keel_complete's shape) and status (a prompt too long:
 * srv_fail_context's error). *status receives the
 * HTTP status: 200, or the error's (the body is then the API's error
 * object). NULL on OOM.
 */
char *srv_response_body(const srv_meta *m, const char *engine_response, keel_status st, int *status);

/* Anthropic tool-use ids: the engine's "call_X" becomes "toolu_X" (other ids
 * get "toolu_" prepended), the same way in responses and streams. */
void srv_toolu_id(const char *id, char *out, size_t cap);

/* The state of one SSE stream. */
typedef struct srv_stream {
    srv_meta m;
    bool include_usage;
    bool progress;    /* OpenAI: prompt_progress chunks (return_progress) */
    bool started;     /* OpenAI: the role chunk was sent; Anthropic: message_start */
    int32_t block;    /* Anthropic: index of the open content block, -1 none */
    int block_kind;   /* Anthropic: SRV_BLOCK_* of the open block */
    int32_t n_blocks; /* Anthropic: blocks started so far */
    int32_t tool;     /* engine tool index of the open tool_use block, -1 none */
    int32_t n_tools;  /* OpenAI: tool calls announced so far (indexes are dense) */
    int64_t prompt_tokens, cached_tokens; /* from the PROMPT event: message_start's usage */
    srv_buf args;     /* Anthropic: the open tool call's arguments, sent whole at its end */
    bool ended;
    json_t *lp;       /* OpenAI: logprobs entries of tokens whose text has not gone out (array or NULL) */
    int64_t lp_offset; /* completions: text_offset of the next token (characters) */
} srv_stream;

enum { SRV_BLOCK_NONE = 0, SRV_BLOCK_TEXT = 1, SRV_BLOCK_THINKING = 2, SRV_BLOCK_TOOL = 3 };

void srv_stream_init(srv_stream *s, const srv_meta *m, bool include_usage);
void srv_stream_free(srv_stream *s);
/* Appends the SSE bytes of one engine event (not DONE) to out. PROMPT
 * starts the stream: OpenAI chat's role chunk, Anthropic's message_start
 * with the prompt's usage and a ping. */
bool srv_stream_event(srv_stream *s, const keel_event *ev, srv_buf *out);
/* Appends the stream's end: the final chunk(s) with finish_reason and usage
 * and "data: [DONE]" (OpenAI), or content_block_stop, message_delta and
 * message_stop (Anthropic); for a failed request an error event instead. */
bool srv_stream_done(srv_stream *s, const char *engine_response, keel_status st, srv_buf *out);
/* A keep-alive: an SSE comment (OpenAI) or a ping event (Anthropic, once
 * message_start went out). */
bool srv_stream_ping(srv_stream *s, srv_buf *out);

/* ---- internal to the api files ----------------------------------------------------- */

/* Getters that check a member's type: false with e set (400, naming the
 * member) when present with another type; *out untouched when absent. */
bool srv_get_bool(json_t *o, const char *k, bool *out, srv_err *e);
bool srv_get_str(json_t *o, const char *k, const char **out, srv_err *e);
/* Sets dst[k] to src[k] when present, checking it is a number in [lo, hi]. */
bool srv_copy_num(json_t *src, const char *k, json_t *dst, const char *dk, double lo, double hi, srv_err *e);
/* An integer in [lo, hi] (huge values are errors, not wrapped). */
bool srv_copy_int(json_t *src, const char *k, json_t *dst, const char *dk, int64_t lo, int64_t hi, srv_err *e);
/* max_tokens (named k) into dst["max_tokens"]: an integer >= 0 (-1 also
 * accepted: no limit), lowered to lim->max_tokens_cap; the default when absent. */
bool srv_copy_max_tokens(json_t *src, const char *k, json_t *dst, const srv_limits *lim, srv_err *e);
/* stop (string or array of strings) into dst["stop"], at most lim->max_stop. */
bool srv_copy_stop(json_t *src, const char *k, json_t *dst, const srv_limits *lim, srv_err *e);
/* JSON value from the engine response (borrowed), or NULL. */
json_t *srv_engine_usage(json_t *resp, const char *k, int64_t *out);
/* The OpenAI error type of an HTTP status. */
const char *srv_openai_type(int status);
const char *srv_anthropic_type(int status);

bool srv_openai_parse(srv_api api, json_t *body, const srv_limits *lim, srv_request *out, srv_err *e);
bool srv_anthropic_parse(srv_api api, json_t *body, const srv_limits *lim, srv_request *out, srv_err *e);
char *srv_openai_response(const srv_meta *m, json_t *resp);
char *srv_anthropic_response(const srv_meta *m, json_t *resp);
bool srv_openai_event(srv_stream *s, const keel_event *ev, srv_buf *out);
bool srv_anthropic_event(srv_stream *s, const keel_event *ev, srv_buf *out);
bool srv_openai_done(srv_stream *s, json_t *resp, srv_buf *out);
bool srv_anthropic_done(srv_stream *s, json_t *resp, srv_buf *out);

/* ---- the server (http.c) ------------------------------------------------------------ */

/* Slot save/restore/erase through keel_engine_slot_* (1: the engine has
 * them; 0 answers 501 after validating the request). */
#define SRV_SLOT_ACTIONS 1

typedef struct srv_config {
    const char *host;          /* "127.0.0.1"; a numeric IPv4/IPv6 address or a host name */
    int port;                  /* 8080; 0: any free port (srv_port tells which) */
    const char *model_path;    /* for /v1/models and /props */
    const char *alias;         /* model name in responses; NULL: the file name */
    const char *engine_options; /* JSON for keel_engine_open */
    json_t *defaults;          /* request defaults (temperature, ...), borrowed; may be NULL */
    const char *const *api_keys; /* [n_api_keys]; none: no authentication */
    int n_api_keys;
    const char *slot_save_path; /* directory for slot files; NULL: save/restore refused */
    bool metrics;              /* GET /metrics */
    bool slots;                /* GET /slots */
    bool webui;                /* the chat page at / */
    bool log;                  /* one line per request on stderr */
    int timeout_s;             /* longest silence of a connection during a request (600) */
    int keep_alive_s;          /* idle connections (no request in progress) are closed after this (5) */
    int read_timeout_s;        /* a request's headers must arrive within this, and its body again (30) */
    int ping_s;                /* a silent stream gets a keep-alive this often (5) */
    int threads_http;          /* connections served at once; more get 503 (up to SRV_CONN_EXTRA more) */
    size_t max_body;           /* bytes of a request body (8 MiB) */
    int32_t default_max_tokens; /* -n (-1) */
} srv_config;

typedef struct srv_server srv_server;

/* Connections past threads_http that are still accepted, to be answered
 * 503 (beyond them new connections wait in the listen backlog). */
#define SRV_CONN_EXTRA 64
/* Bytes of a body over max_body that are read and discarded before the
 * 413, so that the client reads the answer instead of a reset. */
#define SRV_DISCARD_MAX ((size_t)64 << 20)

/* Starts listening (the model is not loaded yet: every route but /health
 * answers 503). 0, or -1 with the reason in err. */
int srv_start(const srv_config *cfg, srv_server **out, char *err, size_t cap);
/* The port it listens on. */
int srv_port(const srv_server *s);
/* Opens the engine from cfg->engine_options (blocking; any thread) and, on
 * success, makes the server ready. */
keel_status srv_load(srv_server *s, char *err);
keel_engine *srv_engine(srv_server *s);
/* Runs the engine's scheduler on the calling thread until srv_shutdown. */
keel_status srv_run(srv_server *s);
/* Stops accepting connections and new requests (503 from now on): the
 * first step of a shutdown. */
void srv_quiesce(srv_server *s);
/* Ends a shutdown once the engine loop has returned: closes the remaining
 * connections, frees everything (the engine included). NULL is a no-op. */
void srv_free(srv_server *s);
/* The stats JSON of the engine (malloc'd) or NULL. */
char *srv_stats(srv_server *s);

/* /metrics text from the engine's stats JSON and the process RSS (metrics.c);
 * malloc'd, NULL on OOM or malformed stats. */
char *srv_metrics_text(const char *stats_json, size_t rss_bytes);
/* Resident set size of this process in bytes (0 if unknown). */
size_t srv_rss_bytes(void);

/* ---- a small HTTP/1.1 client (api_client.c) --------------------------------------------- */
/* For keel bench-serve and the server tests: blocking sockets, one request
 * per connection ("Connection: close"), Content-Length, chunked and
 * close-delimited bodies. */

typedef struct srv_http_resp {
    int status;
    srv_buf head;   /* status line and headers */
    srv_buf body;   /* the decoded body */
} srv_http_resp;

/* Connects to host:port (numeric address or name); the fd or -1. */
int srv_http_connect(const char *host, int port);
/* Sends a request (extra: header lines, each ending in \r\n, or NULL). */
bool srv_http_send(int fd, const char *method, const char *path, const char *extra, const char *body, size_t n);
/* Reads the response until its end, the connection's end or timeout_ms
 * without data. on_data (may be NULL) sees each piece of the decoded body as
 * it arrives; returning false stops reading (the response is then partial).
 * true when a status line was read and the body ended as framed. */
bool srv_http_read(int fd, srv_http_resp *r, int timeout_ms, bool (*on_data)(void *user, const char *p, size_t n),
                   void *user);
/* connect + send + read + close. */
bool srv_http_request(const char *host, int port, const char *method, const char *path, const char *extra,
                      const char *body, srv_http_resp *r, int timeout_ms);
/* The value of header name (case-insensitive) into out; false if absent. */
bool srv_http_header(const srv_http_resp *r, const char *name, char *out, size_t cap);
void srv_http_resp_free(srv_http_resp *r);

/* One SSE event of a stream. */
typedef struct srv_sse_event {
    char event[64];  /* "event:" field, "" when absent */
    srv_buf data;    /* "data:" lines joined with \n */
    bool comment;    /* only ": ..." comment lines */
} srv_sse_event;

/* Parses the next event of buf[*pos .. n): false when no complete event
 * (terminated by a blank line) remains. *bad is set for a line that is not
 * "event:", "data:", ":" or another field (framing error). */
bool srv_sse_next(const char *buf, size_t n, size_t *pos, srv_sse_event *ev, bool *bad);

/* `keel serve` and `keel bench-serve` (serve.c, bench_serve.c). */
int cmd_serve(int argc, char **argv);
int cmd_bench_serve(int argc, char **argv);

#endif
