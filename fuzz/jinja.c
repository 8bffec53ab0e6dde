/*
 * fuzz/jinja.c — libFuzzer target: the Jinja chat-template engine over
 * arbitrary templates and variables. The input is split at its first NUL
 * byte: the template source before it, the variables' JSON after it (no NUL:
 * the whole input is the template and a fixed conversation is used).
 * Rendering runs with small limits (64 KiB of output, 8 MiB of memory, 20000
 * steps, depth 64) so that every input finishes quickly; any crash, leak,
 * hang or UB is a bug. A rendering that succeeds must be NUL-terminated and
 * render identically a second time (renders do not change the template).
 */
#include "chat/jinja.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char g_conv[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"sys\"}, {\"role\": \"user\", "
    "\"content\": \"hi \\u00e9\"}, {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": "
    "[{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": "
    "{\"a\": [1, 2.5, null, true]}}}]}, {\"role\": \"tool\", \"content\": \"{\\\"r\\\": 1}\"}], "
    "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": "
    "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"array\"}}}}}], "
    "\"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t src_n = nul ? (size_t)(nul - data) : size;
    /* exact-size copies: reads past the end are caught */
    char *src = malloc(src_n ? src_n : 1);
    memcpy(src, data, src_n);
    size_t vars_n = nul ? size - src_n - 1 : strlen(g_conv);
    char *vars = malloc(vars_n ? vars_n : 1);
    memcpy(vars, nul ? (const char *)nul + 1 : g_conv, vars_n);

    char err[JINJA_ERR_CAP];
    jinja_template *t = NULL;
    if (jinja_open(src, src_n, &t, err) == KEEL_OK) {
        jinja_limits lim = jinja_limits_default();
        lim.max_output = 64 * 1024;
        lim.max_memory = 8 << 20;
        lim.max_steps = 20000;
        lim.max_depth = 64;
        jinja_time now = {2026, 1, 15, 9, 30, 0};
        jinja_render_opts o = {&lim, &now};
        jinja_buf a = {0}, b = {0};
        keel_status s1 = jinja_render(t, vars, vars_n, NULL, 0, &o, &a, err);
        if (s1 == KEEL_OK) {
            if (a.len > lim.max_output || (a.data && a.data[a.len] != 0)) abort();
            keel_status s2 = jinja_render(t, vars, vars_n, NULL, 0, &o, &b, err);
            if (s2 != KEEL_OK || b.len != a.len || (a.len && memcmp(a.data, b.data, a.len) != 0))
                abort();
        } else if (a.len != 0) {
            abort();
        }
        jinja_buf_free(&a);
        jinja_buf_free(&b);
        jinja_close(t);
    } else if (t) {
        abort();
    }
    free(src);
    free(vars);
    return 0;
}
