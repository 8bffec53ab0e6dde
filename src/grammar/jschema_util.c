/*
 * jschema_util.c — the schema compiler's growable text buffers (capped at
 * JS_MAX_OUT), GBNF literals (bytes, and JSON strings in the canonical
 * spelling), refusals ("json schema: WHAT at /location"), and the arena
 * that holds the normal forms (blocks of 64 KiB or more, capped at
 * JS_MAX_ARENA, freed together with the builder).
 */
#include "jschema_int.h"
#include "jstring.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* ---- buffers, arena, errors ------------------------------------------------------- */

void js_sput(jsb *b, sbuf *o, const char *s, size_t n)
{
    if (b->st) return;
    if (o->n + n + 1 > JS_MAX_OUT) {
        b->st = base_err(b->err, KEEL_ERANGE, "json schema: the grammar exceeds 8 MiB");
        return;
    }
    if (o->n + n + 1 > o->cap) {
        size_t nc = o->cap ? o->cap : 256;
        while (nc < o->n + n + 1) nc *= 2;
        char *d = base_realloc(o->d, o->cap, nc);
        if (!d) {
            js_oom(b);
            return;
        }
        o->d = d;
        o->cap = nc;
    }
    memcpy(o->d + o->n, s, n);
    o->n += n;
    o->d[o->n] = 0;
}

void js_sputs(jsb *b, sbuf *o, const char *s)
{
    js_sput(b, o, s, strlen(s));
}

void js_sputf(jsb *b, sbuf *o, const char *fmt, ...)
{
    char t[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t, sizeof t, fmt, ap);
    va_end(ap);
    if (n > 0) js_sput(b, o, t, BASE_MIN((size_t)n, sizeof t - 1));
}

void js_sfree(sbuf *o)
{
    base_free(o->d, o->cap);
    o->d = NULL;
    o->n = o->cap = 0;
}

/* A GBNF literal of bytes s[0..n): printable ASCII as is, the rest escaped
 * (\xHH is a code point in GBNF, so UTF-8 passes through unescaped). */
void js_put_lit(jsb *b, sbuf *o, const char *s, size_t n)
{
    js_sputs(b, o, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            char e[3] = {'\\', (char)c, 0};
            js_sputs(b, o, e);
        } else if (c < 0x20 || c == 0x7f) {
            js_sputf(b, o, "\\x%02X", c);
        } else {
            js_sput(b, o, (const char *)&s[i], 1);
        }
    }
    js_sputs(b, o, "\"");
}

/* The GBNF literal of the JSON string token of content s[0..n) in the
 * canonical spelling (jstr_spell): raw but for '"', '\\' and controls. */
void js_put_jstring(jsb *b, sbuf *o, const char *s, size_t n)
{
    if (b->st) return;
    size_t cap = 6 * n + 3;
    char *t = base_alloc(cap);
    if (!t) {
        js_oom(b);
        return;
    }
    js_put_lit(b, o, t, jstr_spell(s, n, t));
    base_free(t, cap);
}

keel_status js_oom(jsb *b)
{
    if (!b->st) b->st = base_err(b->err, KEEL_ENOMEM, "json schema: out of memory");
    return b->st;
}

keel_status js_refuse(jsb *b, const char *where, const char *fmt, ...)
{
    if (b->st) return b->st;
    char what[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    b->st = base_err(b->err, KEEL_EUNSUPPORTED, "json schema: %s at %s", what, where && where[0] ? where : "/");
    return b->st;
}

void *js_alloc(jsb *b, size_t n)
{
    if (b->st) return NULL;
    n = (n + 15) & ~(size_t)15;
    if (!b->ar || b->ar->used + n > b->ar->cap) {
        size_t cap = n > 65536 ? n : 65536;
        if (b->ar_total + cap > JS_MAX_ARENA) {
            b->st = base_err(b->err, KEEL_ERANGE, "json schema: the normal form exceeds 64 MiB");
            return NULL;
        }
        arblk *k = base_alloc(sizeof *k + cap);
        if (!k) {
            js_oom(b);
            return NULL;
        }
        k->next = b->ar;
        k->cap = cap;
        k->used = 0;
        b->ar = k;
        b->ar_total += cap;
    }
    void *p = (char *)(b->ar + 1) + b->ar->used;
    b->ar->used += n;
    memset(p, 0, n);
    return p;
}

char *js_strdup(jsb *b, const char *s, size_t n)
{
    char *d = js_alloc(b, n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

