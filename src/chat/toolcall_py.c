/*
 * toolcall_py.c — Python-style calls in model output, as LFM2 writes them
 * (`[get_weather(city="Paris", days=3), now()]` between its tool-call
 * markers) and Llama 3's built-in tools (`brave_search.call(query="x")`
 * after <|python_tag|>): an incremental scanner that finds where one call
 * ends, and a converter of its keyword arguments, Python literals, to a
 * JSON object.
 *
 * Invariants: the converter recurses only into nested literals, at most
 * PY_MAX_DEPTH levels; every read is bounded by the length given.
 */
#include "toolcall_int.h"

#include <string.h>

#define PY_MAX_DEPTH 32

void tc_py_scan_init(tc_py_scan *s)
{
    memset(s, 0, sizeof *s);
}

static bool is_ident(uint8_t c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '.' || c == '-' || c >= 0x80;
}

tc_pr tc_py_scan_byte(tc_py_scan *s, uint8_t c)
{
    if (s->quote) {
        if (s->esc)
            s->esc = false;
        else if (c == '\\')
            s->esc = true;
        else if (c == s->quote)
            s->quote = 0;
        else if (c == '\n')
            return TC_FAIL;
        return TC_MORE;
    }
    if (!s->opened) { /* the name, then '(' */
        if (c == '(') {
            if (!s->named) return TC_FAIL;
            s->opened = true;
            s->depth = 1;
            return TC_MORE;
        }
        if (is_ident(c)) {
            s->named = true;
            return TC_MORE;
        }
        return TC_FAIL;
    }
    switch (c) {
    case '\'':
    case '"': s->quote = c; return TC_MORE;
    case '(':
    case '[':
    case '{':
        if (++s->depth > PY_MAX_DEPTH) return TC_FAIL;
        return TC_MORE;
    case ')':
    case ']':
    case '}':
        if (--s->depth == 0) return c == ')' ? TC_OK : TC_FAIL;
        return TC_MORE;
    default: return TC_MORE;
    }
}

/* ---- converter ------------------------------------------------------------- */

typedef struct py {
    const char *s;
    size_t n, i;
    tc_buf *out;
    keel_status st;
} py;

static void py_ws(py *c)
{
    c->i = tc_skip_ws(c->s, c->n, c->i);
}

static bool py_put(py *c, const char *s, size_t n)
{
    if (c->st == KEEL_OK) c->st = tc_buf_append(c->out, s, n);
    return c->st == KEEL_OK;
}

static int hexv(uint8_t c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* A quoted Python string as a JSON string. */
static bool py_string(py *c)
{
    uint8_t q = (uint8_t)c->s[c->i++];
    if (!py_put(c, "\"", 1)) return false;
    while (c->i < c->n) {
        uint8_t ch = (uint8_t)c->s[c->i++];
        if (ch == q) return py_put(c, "\"", 1);
        if (ch != '\\') {
            char b = (char)ch;
            if (c->st == KEEL_OK) c->st = tc_buf_append_escaped(c->out, &b, 1);
            if (c->st) return false;
            continue;
        }
        if (c->i >= c->n) return false;
        uint8_t e = (uint8_t)c->s[c->i++];
        const char *map = NULL;
        char one;
        switch (e) {
        case 'n': map = "\\n"; break;
        case 't': map = "\\t"; break;
        case 'r': map = "\\r"; break;
        case '\\': map = "\\\\"; break;
        case '"': map = "\\\""; break;
        case '\'': map = "'"; break;
        case '0': map = "\\u0000"; break;
        case 'x':
        case 'u': {
            int digits = e == 'x' ? 2 : 4;
            char esc[7] = "\\u0000";
            if (c->i + (size_t)digits > c->n) return false;
            for (int k = 0; k < digits; k++) {
                int h = hexv((uint8_t)c->s[c->i + (size_t)k]);
                if (h < 0) return false;
                esc[6 - digits + k] = (char)c->s[c->i + (size_t)k];
            }
            c->i += (size_t)digits;
            if (!py_put(c, esc, 6)) return false;
            continue;
        }
        default:
            one = (char)e;
            if (!py_put(c, "\\\\", 2)) return false;
            if (c->st == KEEL_OK) c->st = tc_buf_append_escaped(c->out, &one, 1);
            if (c->st) return false;
            continue;
        }
        if (!py_put(c, map, strlen(map))) return false;
    }
    return false;
}

static bool py_word(py *c, const char *w)
{
    size_t k = strlen(w);
    if (c->i + k > c->n || memcmp(c->s + c->i, w, k) != 0) return false;
    if (c->i + k < c->n && is_ident((uint8_t)c->s[c->i + k]) && c->s[c->i + k] != '.') return false;
    c->i += k;
    return true;
}

static bool py_value(py *c, int depth);

/* [a, b] (or (a, b)) as a JSON array; {k: v} as an object. */
static bool py_container(py *c, int depth)
{
    uint8_t open = (uint8_t)c->s[c->i++];
    uint8_t close = open == '[' ? ']' : open == '(' ? ')' : '}';
    bool obj = open == '{';
    if (!py_put(c, obj ? "{" : "[", 1)) return false;
    for (bool first = true;; first = false) {
        py_ws(c);
        if (c->i >= c->n) return false;
        if ((uint8_t)c->s[c->i] == close) {
            c->i++;
            return py_put(c, obj ? "}" : "]", 1);
        }
        if (!first) {
            if (c->s[c->i] != ',') return false;
            c->i++;
            py_ws(c);
            if (c->i < c->n && (uint8_t)c->s[c->i] == close) continue; /* trailing comma */
            if (!py_put(c, ",", 1)) return false;
        }
        if (obj) {
            if (c->i >= c->n || (c->s[c->i] != '\'' && c->s[c->i] != '"')) return false;
            if (!py_string(c)) return false;
            py_ws(c);
            if (c->i >= c->n || c->s[c->i] != ':') return false;
            c->i++;
            if (!py_put(c, ":", 1)) return false;
        }
        if (!py_value(c, depth + 1)) return false;
    }
}

static bool py_value(py *c, int depth)
{
    py_ws(c);
    if (c->i >= c->n || depth > PY_MAX_DEPTH) return false;
    uint8_t ch = (uint8_t)c->s[c->i];
    if (ch == '\'' || ch == '"') return py_string(c);
    if (ch == '[' || ch == '(' || ch == '{') return py_container(c, depth);
    if (py_word(c, "True") || py_word(c, "true")) return py_put(c, "true", 4);
    if (py_word(c, "False") || py_word(c, "false")) return py_put(c, "false", 5);
    if (py_word(c, "None") || py_word(c, "null")) return py_put(c, "null", 4);
    /* a number, as JSON writes it */
    size_t a = c->i;
    if (c->s[c->i] == '-' || c->s[c->i] == '+') c->i++;
    size_t d = c->i;
    while (c->i < c->n && strchr("0123456789.eE+-", c->s[c->i]))
        c->i++;
    if (c->i == d) return false;
    const char *num = c->s + a + (c->s[a] == '+');
    size_t nn = c->s + c->i - num, k = 0;
    if (tc_json_skip(num, nn, &k, true) != TC_OK || k != nn) return false;
    return py_put(c, num, nn);
}

keel_status tc_py_call(const char *s, size_t n, char *name, tc_buf *json, bool *ok)
{
    py c = {.s = s, .n = n, .out = json};
    *ok = false;
    size_t a = tc_skip_ws(s, n, 0), e = a;
    while (e < n && is_ident((uint8_t)s[e]))
        e++;
    size_t nl = e - a;
    if (nl >= 5 && memcmp(s + e - 5, ".call", 5) == 0) nl -= 5; /* Llama's built-in tool call */
    if (nl == 0 || nl >= TOOLCALL_NAME_CAP) return KEEL_OK;
    memcpy(name, s + a, nl);
    name[nl] = '\0';
    c.i = tc_skip_ws(s, n, e);
    if (c.i >= n || s[c.i] != '(') return KEEL_OK;
    c.i++;
    if (!py_put(&c, "{", 1)) return c.st;
    for (bool first = true;; first = false) {
        py_ws(&c);
        if (c.i >= n) return c.st;
        if (s[c.i] == ')') {
            c.i++;
            break;
        }
        if (!first) {
            if (s[c.i] != ',') return c.st;
            c.i++;
            py_ws(&c);
            if (c.i < n && s[c.i] == ')') continue;
            if (!py_put(&c, ",", 1)) return c.st;
        }
        size_t k = c.i;
        while (c.i < n && is_ident((uint8_t)s[c.i]) && s[c.i] != '.' && s[c.i] != '-')
            c.i++;
        if (c.i == k) return c.st; /* positional arguments have no name to give */
        if (!py_put(&c, "\"", 1)) return c.st;
        if (c.st == KEEL_OK) c.st = tc_buf_append_escaped(json, s + k, c.i - k);
        if (!py_put(&c, "\":", 2)) return c.st;
        py_ws(&c);
        if (c.i >= n || s[c.i] != '=') return c.st;
        c.i++;
        if (!py_value(&c, 0)) return c.st;
    }
    if (!py_put(&c, "}", 1)) return c.st;
    *ok = tc_skip_ws(s, n, c.i) == n;
    return KEEL_OK;
}

/* ---- Gemma 4: call:NAME{key:<|"|>text<|"|>,n:3,o:{a:[1,true]}} ------------------ */

#define GQ "<|\"|>" /* Gemma's string quote */
#define GQ_LEN 5

void tc_gemma_scan_init(tc_gemma_scan *s)
{
    memset(s, 0, sizeof *s);
}

tc_pr tc_gemma_scan_byte(tc_gemma_scan *s, uint8_t c)
{
    memmove(s->win, s->win + 1, sizeof s->win - 1);
    s->win[sizeof s->win - 1] = c;
    if (memcmp(s->win, GQ, GQ_LEN) == 0) {
        if (s->depth == 0) return TC_FAIL;
        s->in_str = !s->in_str;
        memset(s->win, 0, sizeof s->win); /* "<|"|>" then "|>": no overlap */
        return TC_MORE;
    }
    if (s->in_str) return TC_MORE;
    if (s->depth == 0) { /* "call:" NAME, then '{' */
        if (c == '{') {
            if (!s->named) return TC_FAIL;
            s->depth = 1;
            return TC_MORE;
        }
        if (is_ident(c) || c == ':') {
            s->named = true;
            return TC_MORE;
        }
        return TC_FAIL;
    }
    if (c == '{' || c == '[') {
        if (++s->depth > PY_MAX_DEPTH) return TC_FAIL;
    } else if (c == '}' || c == ']') {
        if (--s->depth == 0) return c == '}' ? TC_OK : TC_FAIL;
    }
    return TC_MORE;
}

static bool g_lit(py *c, const char *w)
{
    size_t k = strlen(w);
    if (c->i + k > c->n || memcmp(c->s + c->i, w, k) != 0) return false;
    c->i += k;
    return true;
}

/* A bare or quoted key up to ':' as a JSON string. */
static bool g_key(py *c)
{
    size_t a, e;
    if (g_lit(c, GQ)) {
        a = c->i;
        while (c->i + GQ_LEN <= c->n && memcmp(c->s + c->i, GQ, GQ_LEN) != 0)
            c->i++;
        e = c->i;
        if (!g_lit(c, GQ)) return false;
    } else {
        a = c->i;
        while (c->i < c->n && c->s[c->i] != ':' && c->s[c->i] != ',' && c->s[c->i] != '}')
            c->i++;
        e = c->i;
        while (e > a && tc_is_ws((uint8_t)c->s[e - 1]))
            e--;
        if (e == a) return false;
    }
    if (!py_put(c, "\"", 1)) return false;
    if (c->st == KEEL_OK) c->st = tc_buf_append_escaped(c->out, c->s + a, e - a);
    return py_put(c, "\"", 1);
}

static bool g_value(py *c, int depth)
{
    py_ws(c);
    if (c->i >= c->n || depth > PY_MAX_DEPTH) return false;
    if (g_lit(c, GQ)) {
        size_t a = c->i;
        while (c->i + GQ_LEN <= c->n && memcmp(c->s + c->i, GQ, GQ_LEN) != 0)
            c->i++;
        size_t e = c->i;
        if (!g_lit(c, GQ)) return false;
        if (!py_put(c, "\"", 1)) return false;
        if (c->st == KEEL_OK) c->st = tc_buf_append_escaped(c->out, c->s + a, e - a);
        return py_put(c, "\"", 1);
    }
    char ch = c->s[c->i];
    if (ch == '{' || ch == '[') {
        bool obj = ch == '{';
        char close = obj ? '}' : ']';
        c->i++;
        if (!py_put(c, obj ? "{" : "[", 1)) return false;
        for (bool first = true;; first = false) {
            py_ws(c);
            if (c->i >= c->n) return false;
            if (c->s[c->i] == close) {
                c->i++;
                return py_put(c, obj ? "}" : "]", 1);
            }
            if (!first) {
                if (c->s[c->i] != ',') return false;
                c->i++;
                py_ws(c);
                if (!py_put(c, ",", 1)) return false;
            }
            if (obj) {
                if (!g_key(c)) return false;
                if (c->i >= c->n || c->s[c->i] != ':') return false;
                c->i++;
                if (!py_put(c, ":", 1)) return false;
            }
            if (!g_value(c, depth + 1)) return false;
        }
    }
    if (py_word(c, "true") || py_word(c, "True")) return py_put(c, "true", 4);
    if (py_word(c, "false") || py_word(c, "False")) return py_put(c, "false", 5);
    if (py_word(c, "null") || py_word(c, "None")) return py_put(c, "null", 4);
    size_t a = c->i, k = 0;
    while (c->i < c->n && strchr("0123456789.eE+-", c->s[c->i]))
        c->i++;
    if (c->i == a || tc_json_skip(c->s + a, c->i - a, &k, true) != TC_OK || k != c->i - a) return false;
    return py_put(c, c->s + a, c->i - a);
}

keel_status tc_gemma_call(const char *s, size_t n, char *name, tc_buf *json, bool *ok)
{
    py c = {.s = s, .n = n, .out = json};
    *ok = false;
    if (!g_lit(&c, "call:")) return KEEL_OK;
    size_t a = c.i;
    while (c.i < n && c.s[c.i] != '{')
        c.i++;
    size_t nl = c.i - a;
    if (nl == 0 || nl >= TOOLCALL_NAME_CAP || c.i >= n) return KEEL_OK;
    memcpy(name, s + a, nl);
    name[nl] = '\0';
    if (!g_value(&c, 0)) return c.st;
    *ok = c.i == n;
    return c.st;
}
