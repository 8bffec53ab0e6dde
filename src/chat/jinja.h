/*
 * jinja.h — private interface of the Jinja chat-template engine (src/chat):
 * compile a template once, render it many times (concurrently: a compiled
 * template is immutable) into a growable buffer.
 *
 * The language is Jinja2 as Hugging Face transformers configures it for chat
 * templates: trim_blocks and lstrip_blocks on, the loopcontrols and do
 * extensions, mutable lists and dicts, {% generation %} rendering its body,
 * tojson = json.dumps(ensure_ascii=False), raise_exception(), strftime_now().
 * docs/chat.md lists what is supported.
 *
 * Bounds (design.md rule 9): every render runs under jinja_limits — output
 * bytes, memory, steps (loop iterations, macro calls, filter items) and
 * nesting depth — and the parser limits nesting, so neither compiling nor
 * rendering recurses deeper than a fixed bound (fits a 256 KiB stack).
 */
#ifndef KEEL_CHAT_JINJA_H
#define KEEL_CHAT_JINJA_H

#include "../base/base.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Error messages of the engine: "template line 12: 'foo' is undefined". */
#define JINJA_ERR_CAP BASE_ERR_CAP
/* What the message of a rendering past max_output holds (KEEL_EOVERFLOW):
 * callers tell it from the other limits by it. */
#define JINJA_ERR_OUTPUT "the rendering is longer than"

typedef struct jinja_limits {
    size_t max_output;  /* bytes of rendered text (64 MiB) */
    size_t max_memory;  /* bytes a render may allocate, values and output (256 MiB) */
    int64_t max_steps;  /* loop iterations + calls + items filters visit (5 x 10^7) */
    int32_t max_depth;  /* run-time nesting: blocks, calls, expressions (200) */
} jinja_limits;

jinja_limits jinja_limits_default(void);

/* Broken-down local time for strftime_now (no time zone). */
typedef struct jinja_time {
    int year, mon, mday; /* mon 1..12, mday 1..31 */
    int hour, min, sec;
} jinja_time;

/* Parses "YYYY-MM-DDTHH:MM:SS" (or a space for T). false if malformed or a
 * field is out of range. */
bool jinja_time_parse(const char *s, jinja_time *out);
/* The current local time. */
void jinja_time_now(jinja_time *out);

/* A compiled template (immutable; safe to render from several threads). */
typedef struct jinja_template jinja_template;

/*
 * Compiles len bytes of template source (UTF-8). KEEL_EFORMAT with
 * "template line N: <what>" for a syntax error or invalid UTF-8,
 * KEEL_EOVERFLOW when nesting exceeds the parser's limit, KEEL_ENOMEM.
 * err (JINJA_ERR_CAP bytes, may be NULL) gets the detail. *out is NULL on
 * failure. Allocates through the hooks; the template owns everything.
 */
keel_status jinja_open(const char *src, size_t len, jinja_template **out, char *err);
void jinja_close(jinja_template *t);

/* A growable output buffer. data is NUL-terminated when non-NULL; free with
 * jinja_buf_free (allocator hooks). */
typedef struct jinja_buf {
    char *data;
    size_t len, cap;
} jinja_buf;

void jinja_buf_free(jinja_buf *b);

/* One template variable given as JSON text (its name is a top-level name of
 * the template, e.g. "messages"). */
typedef struct jinja_var {
    const char *name;
    const char *json;
    size_t len;
} jinja_var;

typedef struct jinja_render_opts {
    const jinja_limits *limits; /* NULL: jinja_limits_default() */
    const jinja_time *now;      /* strftime_now's time; NULL: local time */
} jinja_render_opts;

/*
 * Renders t. vars_json (may be NULL) is a JSON object whose members become
 * template variables; vars (n_vars, may be 0) adds or replaces single
 * variables. The rendering replaces out's contents (out->len bytes, NUL
 * after them); out's storage is reused and grown. Errors:
 *   KEEL_EINVAL     the template refused (raise_exception: its message), or
 *                   a run-time error of the template (undefined value used,
 *                   wrong type, unknown filter, ...), "template line N: ..."
 *   KEEL_EFORMAT    vars_json / a var is not valid JSON (or not an object)
 *   KEEL_EOVERFLOW  a limit was exceeded (output, memory, steps, depth)
 *   KEEL_ENOMEM
 * On failure out->len is 0. err (JINJA_ERR_CAP bytes, may be NULL).
 */
keel_status jinja_render(const jinja_template *t, const char *vars_json, size_t vars_len,
                         const jinja_var *vars, size_t n_vars, const jinja_render_opts *opts,
                         jinja_buf *out, char *err);

#endif /* KEEL_CHAT_JINJA_H */
