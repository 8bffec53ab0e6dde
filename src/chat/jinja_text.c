/*
 * jinja_text.c — Jinja values as text: str() and repr() printing as CPython
 * prints, json.dumps (tojson) as Python's json module writes it, and the
 * JSON reader that turns request variables into values. Walks stop at
 * JV_MAX_DEPTH (jinja_value.c's invariants).
 */
#include "jinja_int.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ---- printing --------------------------------------------------------------- */

/* Python float repr: the shortest digits that round-trip, laid out as
 * CPython's 'r' format does (exponent form below 1e-4 and from 1e16). */
bool jsb_float(jsb *b, double f)
{
    if (isnan(f)) return jsb_adds(b, "nan");
    if (isinf(f)) return jsb_adds(b, f < 0 ? "-inf" : "inf");
    char tmp[40];
    int p;
    for (p = 1; p <= 17; p++) {
        snprintf(tmp, sizeof tmp, "%.*e", p - 1, f);
        if (strtod(tmp, NULL) == f) break;
    }
    /* tmp: [-]d[.ddd]e[+-]XX */
    char digits[24];
    int nd = 0;
    const char *q = tmp;
    bool neg = false;
    if (*q == '-') {
        neg = true;
        q++;
    }
    for (; *q && *q != 'e'; q++)
        if (*q >= '0' && *q <= '9' && nd < 20) digits[nd++] = *q;
    int e = *q == 'e' ? atoi(q + 1) : 0;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    char out[64];
    int k = 0;
    if (neg) out[k++] = '-';
    if (e < -4 || e >= 16) {
        out[k++] = digits[0];
        if (nd > 1) {
            out[k++] = '.';
            for (int i = 1; i < nd; i++) out[k++] = digits[i];
        }
        k += snprintf(out + k, sizeof out - (size_t)k, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    } else {
        int decpt = e + 1;
        if (decpt <= 0) {
            out[k++] = '0';
            out[k++] = '.';
            for (int i = 0; i < -decpt; i++) out[k++] = '0';
            for (int i = 0; i < nd; i++) out[k++] = digits[i];
        } else if (decpt >= nd) {
            for (int i = 0; i < nd; i++) out[k++] = digits[i];
            for (int i = nd; i < decpt; i++) out[k++] = '0';
            out[k++] = '.';
            out[k++] = '0';
        } else {
            for (int i = 0; i < decpt; i++) out[k++] = digits[i];
            out[k++] = '.';
            for (int i = decpt; i < nd; i++) out[k++] = digits[i];
        }
    }
    return jsb_add(b, out, (size_t)k);
}

keel_status jsb_status(jx *x, const jsb *b)
{
    if (b->over)
        return jx_fail(x, KEEL_EOVERFLOW, JINJA_ERR_OUTPUT " %zu bytes", b->max);
    if (b->oom) return jx_oom(x);
    return KEEL_OK;
}

keel_status jsb_ret(jx *x, jsb *b, jv *out)
{
    if (b->over || b->oom) return jsb_status(x, b);
    jstr *s = jsb_done(b);
    if (!s) return jx_oom(x);
    *out = jv_strv(s);
    return KEEL_OK;
}

/* Python's str.isprintable for one code point. */
static bool py_isprintable(uint32_t c)
{
    if (c < 0x80) return c >= 0x20 && c < 0x7F;
    utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)c);
    switch (cat) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
        return false;
    default:
        return true;
    }
}

static bool repr_str(jsb *b, const jstr *s)
{
    bool sq = memchr(s->s, '\'', s->n) != NULL, dq = memchr(s->s, '"', s->n) != NULL;
    char quote = sq && !dq ? '"' : '\'';
    bool ok = jsb_addc(b, quote);
    size_t i = 0;
    while (ok && i < s->n) {
        size_t start = i;
        uint32_t c = utf8_next(s->s, s->n, &i);
        if (c == (uint32_t)quote || c == '\\') {
            ok = jsb_addc(b, '\\') && jsb_addc(b, (char)c);
        } else if (c == '\n') {
            ok = jsb_adds(b, "\\n");
        } else if (c == '\r') {
            ok = jsb_adds(b, "\\r");
        } else if (c == '\t') {
            ok = jsb_adds(b, "\\t");
        } else if (!py_isprintable(c)) {
            if (c < 0x100)
                ok = jsb_addf(b, "\\x%02x", c);
            else if (c < 0x10000)
                ok = jsb_addf(b, "\\u%04x", c);
            else
                ok = jsb_addf(b, "\\U%08x", c);
        } else {
            ok = jsb_add(b, s->s + start, i - start);
        }
    }
    return ok && jsb_addc(b, quote);
}

keel_status jv_repr(jx *x, jsb *b, jv v, int depth)
{
    if (depth > JV_MAX_DEPTH || jinja_stack_used(x->stack_base) > JINJA_STACK_BUDGET)
        return jx_fail(x, KEEL_EINVAL, "value nested more than %d levels deep", JV_MAX_DEPTH);
    bool ok = true;
    switch (v.t) {
    case JT_UNDEF:
        ok = jsb_adds(b, "Undefined");
        break;
    case JT_STR:
        ok = repr_str(b, v.u.s);
        break;
    case JT_LIST: {
        const jlist *l = v.u.l;
        const char *open = "[", *close = "]";
        switch (l->kind) {
        case JL_TUPLE:
            open = "(", close = l->n == 1 ? ",)" : ")";
            break;
        case JL_RANGE:
            if (l->r2 == 1)
                ok = jsb_addf(b, "range(%lld, %lld)", (long long)l->r0, (long long)l->r1);
            else
                ok = jsb_addf(b, "range(%lld, %lld, %lld)", (long long)l->r0, (long long)l->r1,
                              (long long)l->r2);
            return ok ? KEEL_OK : jsb_status(x, b);
        case JL_ITEMS:
            open = "dict_items([", close = "])";
            break;
        case JL_KEYS:
            open = "dict_keys([", close = "])";
            break;
        case JL_VALUES:
            open = "dict_values([", close = "])";
            break;
        case JL_GEN:
        case JL_REVITER:
            /* printed as the list of what is left, without consuming it, as
             * llama.cpp prints these filters' results (its filters return
             * lists); Python's "<generator object ... at 0x...>" holds an
             * address no template can depend on */
            break;
        default:
            break;
        }
        ok = jsb_adds(b, open);
        for (size_t i = 0; ok && i < l->n; i++) {
            if (i) ok = jsb_adds(b, ", ");
            TRY(jv_repr(x, b, l->v[i], depth + 1));
        }
        if (ok) ok = jsb_adds(b, close);
        break;
    }
    case JT_DICT:
    case JT_NS: {
        const jdict *d = v.u.d;
        if (v.t == JT_NS) ok = jsb_adds(b, "<Namespace ");
        if (ok) ok = jsb_addc(b, '{');
        for (size_t i = 0; ok && i < d->n; i++) {
            if (i) ok = jsb_adds(b, ", ");
            TRY(jv_repr(x, b, d->k[i], depth + 1));
            ok = jsb_adds(b, ": ");
            TRY(jv_repr(x, b, d->v[i], depth + 1));
        }
        if (ok) ok = jsb_addc(b, '}');
        if (ok && v.t == JT_NS) ok = jsb_addc(b, '>');
        break;
    }
    default:
        return jv_str(x, b, v);
    }
    return ok ? KEEL_OK : jsb_status(x, b);
}

keel_status jv_str(jx *x, jsb *b, jv v)
{
    bool ok = true;
    switch (v.t) {
    case JT_UNDEF:
        break;
    case JT_NONE:
        ok = jsb_adds(b, "None");
        break;
    case JT_BOOL:
        ok = jsb_adds(b, v.u.b ? "True" : "False");
        break;
    case JT_INT:
        ok = jsb_addf(b, "%lld", (long long)v.u.i);
        break;
    case JT_FLOAT:
        ok = jsb_float(b, v.u.f);
        break;
    case JT_STR:
        ok = jsb_add(b, v.u.s->s, v.u.s->n);
        break;
    case JT_LIST:
    case JT_DICT:
    case JT_NS:
        return jv_repr(x, b, v, 0);
    case JT_MACRO:
        ok = jsb_addf(b, "<Macro '%.*s'>", v.u.m->def->name ? (int)v.u.m->def->name->n : 6,
                      v.u.m->def->name ? v.u.m->def->name->s : "caller");
        break;
    case JT_FUNC:
        ok = jsb_addf(b, "<built-in method %s>", jinja_builtin_name((jfn)v.fn));
        break;
    case JT_LOOP:
        ok = jsb_addf(b, "<LoopContext %zu/%zu>", v.u.loop->i + 1, v.u.loop->n);
        break;
    case JT_CYCLER:
        ok = jsb_adds(b, "<jinja2.utils.Cycler object>");
        break;
    case JT_JOINER:
        ok = jsb_adds(b, "<jinja2.utils.Joiner object>");
        break;
    }
    return ok ? KEEL_OK : jsb_status(x, b);
}

keel_status jv_to_str(jx *x, jv v, jstr **out)
{
    if (v.t == JT_STR) {
        *out = v.u.s;
        return KEEL_OK;
    }
    if (v.t == JT_UNDEF) {
        *out = JSTR_EMPTY;
        return KEEL_OK;
    }
    jsb b;
    jsb_init(&b, &x->mem, x->lim.max_output);
    TRY(jv_str(x, &b, v));
    *out = jsb_done(&b);
    return *out ? KEEL_OK : jx_oom(x);
}

keel_status jv_html_escape(jx *x, const jstr *s, jv *out)
{
    jsb b;
    jsb_init(&b, &x->mem, x->lim.max_output);
    for (size_t i = 0; i < s->n; i++) {
        char c = s->s[i];
        switch (c) {
        case '&': jsb_adds(&b, "&amp;"); break;
        case '<': jsb_adds(&b, "&lt;"); break;
        case '>': jsb_adds(&b, "&gt;"); break;
        case '"': jsb_adds(&b, "&#34;"); break;
        case '\'': jsb_adds(&b, "&#39;"); break;
        default: jsb_addc(&b, c); break;
        }
    }
    if (b.over || b.oom) return jsb_status(x, &b);
    jstr *r = jsb_done(&b);
    if (!r) return jx_oom(x);
    *out = jv_strv(r);
    out->safe = 1;
    return KEEL_OK;
}

/* ---- json.dumps ------------------------------------------------------------- */

static bool json_str(jsb *b, const char *s, size_t n, bool ascii)
{
    bool ok = jsb_addc(b, '"');
    size_t i = 0;
    while (ok && i < n) {
        size_t start = i;
        uint32_t c = utf8_next(s, n, &i);
        switch (c) {
        case '"': ok = jsb_adds(b, "\\\""); break;
        case '\\': ok = jsb_adds(b, "\\\\"); break;
        case '\n': ok = jsb_adds(b, "\\n"); break;
        case '\r': ok = jsb_adds(b, "\\r"); break;
        case '\t': ok = jsb_adds(b, "\\t"); break;
        case '\b': ok = jsb_adds(b, "\\b"); break;
        case '\f': ok = jsb_adds(b, "\\f"); break;
        default:
            if (c < 0x20 || (ascii && c >= 0x7F)) {
                if (c >= 0x10000) {
                    uint32_t v = c - 0x10000;
                    ok = jsb_addf(b, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
                } else {
                    ok = jsb_addf(b, "\\u%04x", c);
                }
            } else {
                ok = jsb_add(b, s + start, i - start);
            }
        }
    }
    return ok && jsb_addc(b, '"');
}

static bool json_float(jsb *b, double f)
{
    if (isnan(f)) return jsb_adds(b, "NaN");
    if (isinf(f)) return jsb_adds(b, f < 0 ? "-Infinity" : "Infinity");
    return jsb_float(b, f);
}

static bool json_newline(jsb *b, const jjson_opts *o, int level)
{
    bool ok = jsb_addc(b, '\n');
    for (int i = 0; ok && i < level; i++) ok = jsb_add(b, o->indent, o->indent_n);
    return ok;
}

/* A dict key as json.dumps converts it. */
static keel_status json_key(jx *x, jsb *b, jv k, const jjson_opts *o)
{
    bool ok;
    switch (k.t) {
    case JT_STR:
        ok = json_str(b, k.u.s->s, k.u.s->n, o->ensure_ascii);
        break;
    case JT_INT:
        ok = jsb_addf(b, "\"%lld\"", (long long)k.u.i);
        break;
    case JT_BOOL:
        ok = jsb_adds(b, k.u.b ? "\"true\"" : "\"false\"");
        break;
    case JT_NONE:
        ok = jsb_adds(b, "\"null\"");
        break;
    case JT_FLOAT:
        ok = jsb_addc(b, '"') && json_float(b, k.u.f) && jsb_addc(b, '"');
        break;
    default:
        return jx_fail(x, KEEL_EINVAL, "keys must be str, int, float, bool or None, not %s",
                       jv_type_name(k));
    }
    return ok ? KEEL_OK : jsb_status(x, b);
}

/* Stable insertion sort of entry indices by key (sort_keys). */
static keel_status sort_idx_by_key(jx *x, const jdict *d, size_t *ix)
{
    for (size_t i = 0; i < d->n; i++) ix[i] = i;
    for (size_t i = 1; i < d->n; i++) {
        size_t t = ix[i], j = i;
        while (j > 0) {
            int c;
            TRY(jv_cmp(x, d->k[t], d->k[ix[j - 1]], &c));
            if (c >= 0) break;
            ix[j] = ix[j - 1];
            j--;
        }
        ix[j] = t;
    }
    return KEEL_OK;
}

static keel_status tojson_rec(jx *x, jsb *b, jv v, const jjson_opts *o, int depth)
{
    if (depth > JV_MAX_DEPTH || jinja_stack_used(x->stack_base) > JINJA_STACK_BUDGET)
        return jx_fail(x, KEEL_EINVAL, "tojson: value nested more than %d levels deep",
                       JV_MAX_DEPTH);
    bool ok = true;
    switch (v.t) {
    case JT_NONE:
        ok = jsb_adds(b, "null");
        break;
    case JT_BOOL:
        ok = jsb_adds(b, v.u.b ? "true" : "false");
        break;
    case JT_INT:
        ok = jsb_addf(b, "%lld", (long long)v.u.i);
        break;
    case JT_FLOAT:
        ok = json_float(b, v.u.f);
        break;
    case JT_STR:
        ok = json_str(b, v.u.s->s, v.u.s->n, o->ensure_ascii);
        break;
    case JT_LIST: {
        const jlist *l = v.u.l;
        /* A generator (map, select, reject, ..., reverse) is serialized as
         * the list of what is left, without consuming it. Python's json.dumps
         * refuses one; llama.cpp, whose filters return lists, writes the
         * list, and templates in its tree depend on it (DeepSeek R1's
         * `tools | map(attribute='function') | tojson`). */
        if (l->kind != JL_LIST && l->kind != JL_TUPLE && l->kind != JL_GEN && l->kind != JL_REVITER)
            return jx_fail(x, KEEL_EINVAL, "Object of type %s is not JSON serializable",
                           jv_type_name(v));
        if (l->n == 0) {
            ok = jsb_adds(b, "[]");
            break;
        }
        ok = jsb_addc(b, '[');
        for (size_t i = 0; ok && i < l->n; i++) {
            if (i) ok = jsb_add(b, o->item_sep, o->item_sep_n);
            if (ok && o->indent_set) ok = json_newline(b, o, depth + 1);
            if (ok) TRY(tojson_rec(x, b, l->v[i], o, depth + 1));
        }
        if (ok && o->indent_set) ok = json_newline(b, o, depth);
        if (ok) ok = jsb_addc(b, ']');
        break;
    }
    case JT_DICT: {
        const jdict *d = v.u.d;
        if (d->n == 0) {
            ok = jsb_adds(b, "{}");
            break;
        }
        size_t *ix = NULL;
        if (o->sort_keys) {
            ix = jmem_alloc_n(&x->mem, d->n, sizeof(size_t));
            if (!ix) return jx_oom(x);
            TRY(sort_idx_by_key(x, d, ix));
        }
        ok = jsb_addc(b, '{');
        for (size_t j = 0; ok && j < d->n; j++) {
            size_t i = ix ? ix[j] : j;
            if (j) ok = jsb_add(b, o->item_sep, o->item_sep_n);
            if (ok && o->indent_set) ok = json_newline(b, o, depth + 1);
            if (!ok) break;
            TRY(json_key(x, b, d->k[i], o));
            ok = jsb_add(b, o->key_sep, o->key_sep_n);
            if (ok) TRY(tojson_rec(x, b, d->v[i], o, depth + 1));
        }
        if (ok && o->indent_set) ok = json_newline(b, o, depth);
        if (ok) ok = jsb_addc(b, '}');
        break;
    }
    default:
        return jx_fail(x, KEEL_EINVAL, "Object of type %s is not JSON serializable",
                       jv_type_name(v));
    }
    return ok ? KEEL_OK : jsb_status(x, b);
}

keel_status jv_tojson(jx *x, jsb *b, jv v, const jjson_opts *o)
{
    return tojson_rec(x, b, v, o, 0);
}

/* ---- JSON reader ------------------------------------------------------------ */

#define JSON_MAX_DEPTH 128

typedef struct jread {
    const char *s;
    size_t n, i;
    jmem *m;
    char *err;
} jread;

static keel_status jr_fail(jread *r, const char *what)
{
    /* line and column of the offending byte */
    size_t line = 1, col = 1;
    for (size_t k = 0; k < r->i && k < r->n; k++) {
        if (r->s[k] == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    return base_err(r->err, KEEL_EFORMAT, "JSON line %zu column %zu: %s", line, col, what);
}

static void jr_ws(jread *r)
{
    while (r->i < r->n) {
        char c = r->s[r->i];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        r->i++;
    }
}

static int hexv(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static bool jr_hex4(jread *r, uint32_t *out)
{
    if (r->n - r->i < 4) return false;
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
        int h = hexv(r->s[r->i + (size_t)k]);
        if (h < 0) return false;
        v = v * 16 + (uint32_t)h;
    }
    r->i += 4;
    *out = v;
    return true;
}

static keel_status jr_string(jread *r, jstr **out)
{
    r->i++; /* opening quote */
    size_t start = r->i;
    /* fast path: no escapes */
    while (r->i < r->n && r->s[r->i] != '"' && r->s[r->i] != '\\' &&
           (unsigned char)r->s[r->i] >= 0x20)
        r->i++;
    if (r->i < r->n && r->s[r->i] == '"') {
        if (!utf8_valid(r->s + start, r->i - start)) return jr_fail(r, "invalid UTF-8 in a string");
        *out = jstr_new(r->m, r->s + start, r->i - start);
        r->i++;
        return *out ? KEEL_OK : r->m->fail;
    }
    jsb b;
    jsb_init(&b, r->m, SIZE_MAX / 2);
    if (!utf8_valid(r->s + start, r->i - start)) return jr_fail(r, "invalid UTF-8 in a string");
    jsb_add(&b, r->s + start, r->i - start);
    for (;;) {
        if (r->i >= r->n) return jr_fail(r, "unterminated string");
        unsigned char c = (unsigned char)r->s[r->i];
        if (c == '"') {
            r->i++;
            break;
        }
        if (c < 0x20) return jr_fail(r, "control character in a string");
        if (c != '\\') {
            size_t s0 = r->i;
            while (r->i < r->n && r->s[r->i] != '"' && r->s[r->i] != '\\' &&
                   (unsigned char)r->s[r->i] >= 0x20)
                r->i++;
            if (!utf8_valid(r->s + s0, r->i - s0)) return jr_fail(r, "invalid UTF-8 in a string");
            jsb_add(&b, r->s + s0, r->i - s0);
            continue;
        }
        r->i++;
        if (r->i >= r->n) return jr_fail(r, "unterminated string");
        char e = r->s[r->i++];
        uint32_t cp;
        switch (e) {
        case '"': jsb_addc(&b, '"'); break;
        case '\\': jsb_addc(&b, '\\'); break;
        case '/': jsb_addc(&b, '/'); break;
        case 'b': jsb_addc(&b, '\b'); break;
        case 'f': jsb_addc(&b, '\f'); break;
        case 'n': jsb_addc(&b, '\n'); break;
        case 'r': jsb_addc(&b, '\r'); break;
        case 't': jsb_addc(&b, '\t'); break;
        case 'u':
            if (!jr_hex4(r, &cp)) return jr_fail(r, "bad \\u escape");
            if (cp >= 0xD800 && cp < 0xDC00 && r->n - r->i >= 6 && r->s[r->i] == '\\' &&
                r->s[r->i + 1] == 'u') {
                size_t save = r->i;
                uint32_t lo;
                r->i += 2;
                if (jr_hex4(r, &lo) && lo >= 0xDC00 && lo < 0xE000)
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                else
                    r->i = save;
            }
            jsb_addcp(&b, cp); /* a lone surrogate becomes U+FFFD */
            break;
        default:
            return jr_fail(r, "bad escape in a string");
        }
        if (b.oom) return r->m->fail;
    }
    if (b.oom) return r->m->fail;
    *out = jsb_done(&b);
    return *out ? KEEL_OK : r->m->fail;
}

static keel_status jr_number(jread *r, jv *out)
{
    size_t s0 = r->i;
    bool is_float = false;
    if (r->s[r->i] == '-') r->i++;
    if (r->i >= r->n || r->s[r->i] < '0' || r->s[r->i] > '9') return jr_fail(r, "bad number");
    if (r->s[r->i] == '0') {
        r->i++;
    } else {
        while (r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '9') r->i++;
    }
    if (r->i < r->n && r->s[r->i] == '.') {
        is_float = true;
        r->i++;
        if (r->i >= r->n || r->s[r->i] < '0' || r->s[r->i] > '9') return jr_fail(r, "bad number");
        while (r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '9') r->i++;
    }
    if (r->i < r->n && (r->s[r->i] == 'e' || r->s[r->i] == 'E')) {
        is_float = true;
        r->i++;
        if (r->i < r->n && (r->s[r->i] == '+' || r->s[r->i] == '-')) r->i++;
        if (r->i >= r->n || r->s[r->i] < '0' || r->s[r->i] > '9') return jr_fail(r, "bad number");
        while (r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '9') r->i++;
    }
    size_t len = r->i - s0;
    if (len > 400) return jr_fail(r, "number too long");
    char tmp[408];
    memcpy(tmp, r->s + s0, len);
    tmp[len] = 0;
    if (!is_float) {
        char *end;
        errno = 0;
        long long v = strtoll(tmp, &end, 10);
        if (errno == 0) {
            *out = jv_int(v);
            return KEEL_OK;
        }
        /* beyond int64: a float (Python would keep the exact integer) */
    }
    *out = jv_float(strtod(tmp, NULL));
    return KEEL_OK;
}

typedef struct jr_frame {
    jv c;       /* the container */
    jv key;     /* objects: key of the value being read */
} jr_frame;

keel_status jv_from_json(jmem *m, const char *s, size_t n, jv *out, char *err)
{
    jread r = {s, n, 0, m, err};
    jr_frame stack[JSON_MAX_DEPTH];
    int sp = 0;
    jv val;
    keel_status st;
    *out = jv_none();
    for (;;) {
        /* read one value (or open a container) */
        jr_ws(&r);
        if (r.i >= r.n) return jr_fail(&r, "unexpected end of JSON");
        char c = r.s[r.i];
        if (c == '{' || c == '[') {
            if (sp >= JSON_MAX_DEPTH) return jr_fail(&r, "nested more than 128 levels");
            r.i++;
            jv cont;
            if (c == '{') {
                jdict *d = jdict_new(m, 0);
                if (!d) return m->fail;
                cont = jv_dictv(d);
            } else {
                jlist *l = jlist_new(m, 0, JL_LIST);
                if (!l) return m->fail;
                cont = jv_listv(l);
            }
            stack[sp].c = cont;
            stack[sp].key = jv_none();
            sp++;
            jr_ws(&r);
            if (r.i < r.n && r.s[r.i] == (c == '{' ? '}' : ']')) {
                r.i++;
                sp--;
                val = cont;
                goto have_value;
            }
            if (c == '{') goto read_key;
            continue;
        }
        if (c == '"') {
            jstr *str = NULL;
            if ((st = jr_string(&r, &str)) != KEEL_OK) return st;
            val = jv_strv(str);
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            if ((st = jr_number(&r, &val)) != KEEL_OK) return st;
        } else if (r.n - r.i >= 4 && memcmp(r.s + r.i, "true", 4) == 0) {
            r.i += 4;
            val = jv_bool(true);
        } else if (r.n - r.i >= 5 && memcmp(r.s + r.i, "false", 5) == 0) {
            r.i += 5;
            val = jv_bool(false);
        } else if (r.n - r.i >= 4 && memcmp(r.s + r.i, "null", 4) == 0) {
            r.i += 4;
            val = jv_none();
        } else {
            return jr_fail(&r, "unexpected character");
        }
    have_value:
        /* attach val to the container on top, then look for , or the end */
        for (;;) {
            if (sp == 0) {
                jr_ws(&r);
                if (r.i != r.n) return jr_fail(&r, "extra data after the JSON value");
                *out = val;
                return KEEL_OK;
            }
            jr_frame *f = &stack[sp - 1];
            if (f->c.t == JT_DICT) {
                if (!jdict_set(m, f->c.u.d, f->key, val)) return m->fail;
            } else {
                if (!jlist_push(m, f->c.u.l, val)) return m->fail;
            }
            jr_ws(&r);
            if (r.i >= r.n) return jr_fail(&r, "unexpected end of JSON");
            char d = r.s[r.i];
            if (d == ',') {
                r.i++;
                if (f->c.t == JT_DICT) goto read_key;
                break; /* next value */
            }
            if (d == (f->c.t == JT_DICT ? '}' : ']')) {
                r.i++;
                val = f->c;
                sp--;
                continue;
            }
            return jr_fail(&r, "expected ',' or a closing bracket");
        }
        continue;
    read_key:
        jr_ws(&r);
        if (r.i >= r.n || r.s[r.i] != '"') return jr_fail(&r, "expected a string key");
        {
            jstr *key = NULL;
            if ((st = jr_string(&r, &key)) != KEEL_OK) return st;
            stack[sp - 1].key = jv_strv(key);
        }
        jr_ws(&r);
        if (r.i >= r.n || r.s[r.i] != ':') return jr_fail(&r, "expected ':'");
        r.i++;
    }
}
