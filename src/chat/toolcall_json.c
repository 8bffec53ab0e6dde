/*
 * toolcall_json.c — the byte-level JSON machinery of the tool-call parser:
 * an incremental validator (json_scan) that finds where a JSON value ends
 * while it streams, atomic helpers that parse small held regions (strings,
 * literals, skipped values), the growable buffer, and freeing jansson's
 * output.
 *
 * Invariants: nothing here recurses (the scanner's container stack is a bit
 * array of JS_MAX_DEPTH entries); every read is bounded by the length
 * passed in.
 */
#include "toolcall_int.h"

#include <string.h>

/* ---- jansson's output ----------------------------------------------------- */

/*
 * jansson keeps one allocator per process (json_set_alloc_funcs). keel does
 * not install its hooks there: a library must not change a process-wide
 * setting the host program may rely on (a host using jansson itself would
 * free its own values with keel's allocator). jansson values keel makes are
 * therefore allocated by whatever jansson is set to (malloc by default),
 * bounded by the sizes of the inputs they come from, and freed through it.
 */
void chat_json_free(void *ptr)
{
    json_malloc_t m;
    json_free_t f;
    json_get_alloc_funcs(&m, &f);
    if (ptr) f(ptr);
}

/* ---- tc_buf ------------------------------------------------------------------ */

keel_status tc_buf_append(tc_buf *b, const char *s, size_t n)
{
    size_t need;
    if (!size_add(b->len, n, &need) || !size_add(need, 1, &need)) return KEEL_EOVERFLOW;
    if (need > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < need) {
            if (!size_mul(cap, 2, &cap)) return KEEL_EOVERFLOW;
        }
        char *p = base_realloc(b->p, b->cap, cap);
        if (!p) return KEEL_ENOMEM;
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
    return KEEL_OK;
}

void tc_buf_free(tc_buf *b)
{
    base_free(b->p, b->cap);
    b->p = NULL;
    b->len = b->cap = 0;
}

keel_status tc_buf_append_escaped(tc_buf *b, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    keel_status st = KEEL_OK;
    size_t run = 0; /* start of the pending run of bytes that need no escape */
    for (size_t i = 0; i < n && st == KEEL_OK; i++) {
        uint8_t c = (uint8_t)s[i];
        char esc[8];
        size_t k = 0;
        if (c == '"' || c == '\\') {
            esc[0] = '\\', esc[1] = (char)c, k = 2;
        } else if (c == '\n') {
            esc[0] = '\\', esc[1] = 'n', k = 2;
        } else if (c == '\t') {
            esc[0] = '\\', esc[1] = 't', k = 2;
        } else if (c == '\r') {
            esc[0] = '\\', esc[1] = 'r', k = 2;
        } else if (c < 0x20) {
            memcpy(esc, "\\u00", 4);
            esc[4] = hex[c >> 4], esc[5] = hex[c & 15], k = 6;
        } else {
            continue;
        }
        st = tc_buf_append(b, s + run, i - run);
        if (st == KEEL_OK) st = tc_buf_append(b, esc, k);
        run = i + 1;
    }
    if (st == KEEL_OK) st = tc_buf_append(b, s + run, n - run);
    return st;
}

/* ---- json_scan -------------------------------------------------------------- */

enum {
    JS_VALUE = 0, /* a value is expected */
    JS_OBJ_FIRST, /* after '{': key or '}' */
    JS_OBJ_KEY,   /* after ',' in an object: key */
    JS_COLON,     /* after a key: ':' */
    JS_AFTER,     /* after a value inside a container: ',' or the closer */
    JS_ARR_FIRST, /* after '[': value or ']' */
    JS_STR,
    JS_STR_ESC,
    JS_STR_U,
    JS_LIT,
    JS_NUM_MINUS, /* '-' seen */
    JS_NUM_ZERO,  /* leading 0 */
    JS_NUM_INT,
    JS_NUM_DOT, /* '.' seen, digit needed */
    JS_NUM_FRAC,
    JS_NUM_E,    /* 'e' seen */
    JS_NUM_ESGN, /* exponent sign seen, digit needed */
    JS_NUM_EXP,
    JS_END, /* top-level value complete */
    JS_ERR,
};

static const char *const g_lits[3] = {"true", "false", "null"};

void json_scan_init(json_scan *s)
{
    memset(s, 0, sizeof *s);
    s->st = JS_VALUE;
}

void json_scan_init_after_member(json_scan *s)
{
    memset(s, 0, sizeof *s);
    s->depth = 1;
    s->stack[0] = 1;
    s->st = JS_AFTER;
}

bool json_scan_in_string(const json_scan *s)
{
    return s->st == JS_STR || s->st == JS_STR_ESC || s->st == JS_STR_U;
}

static bool js_top_is_obj(const json_scan *s)
{
    int32_t d = s->depth - 1;
    return (s->stack[d >> 3] >> (d & 7)) & 1;
}

/* A value just finished: where the scanner goes next. */
static js_result js_value_done(json_scan *s)
{
    if (s->depth == 0) {
        s->st = JS_END;
        return JS_R_DONE;
    }
    s->st = JS_AFTER;
    return JS_R_CONT;
}

static bool js_is_digit(uint8_t c)
{
    return c >= '0' && c <= '9';
}

static bool js_is_hex(uint8_t c)
{
    return js_is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

static js_result js_push(json_scan *s, bool obj)
{
    if (s->depth >= JS_MAX_DEPTH) return JS_R_BAD;
    int32_t d = s->depth++;
    if (obj)
        s->stack[d >> 3] |= (uint8_t)(1u << (d & 7));
    else
        s->stack[d >> 3] &= (uint8_t)~(1u << (d & 7));
    s->st = obj ? JS_OBJ_FIRST : JS_ARR_FIRST;
    return JS_R_CONT;
}

/* The start of a value (after any whitespace). */
static js_result js_value_start(json_scan *s, uint8_t c)
{
    switch (c) {
    case '{': return js_push(s, true);
    case '[': return js_push(s, false);
    case '"': s->st = JS_STR, s->key = 0; return JS_R_CONT;
    case '-': s->st = JS_NUM_MINUS; return JS_R_CONT;
    case '0': s->st = JS_NUM_ZERO; return JS_R_CONT;
    case 't': s->st = JS_LIT, s->lit = 0, s->sub = 1; return JS_R_CONT;
    case 'f': s->st = JS_LIT, s->lit = 1, s->sub = 1; return JS_R_CONT;
    case 'n': s->st = JS_LIT, s->lit = 2, s->sub = 1; return JS_R_CONT;
    default:
        if (c >= '1' && c <= '9') {
            s->st = JS_NUM_INT;
            return JS_R_CONT;
        }
        return JS_R_BAD;
    }
}

/* A number ended before byte c: close it and process c in the new state. */
static js_result js_num_end(json_scan *s, uint8_t c)
{
    if (s->depth == 0) {
        s->st = JS_END;
        return JS_R_DONE_BEFORE;
    }
    s->st = JS_AFTER;
    return json_scan_byte(s, c); /* one level: JS_AFTER never ends a number */
}

js_result json_scan_byte(json_scan *s, uint8_t c)
{
    js_result r = JS_R_BAD;
    switch (s->st) {
    case JS_VALUE:
    case JS_ARR_FIRST:
        if (tc_is_ws(c)) {
            r = JS_R_CONT;
        } else if (s->st == JS_ARR_FIRST && c == ']') {
            s->depth--;
            r = js_value_done(s);
        } else {
            r = js_value_start(s, c);
        }
        break;
    case JS_OBJ_FIRST:
    case JS_OBJ_KEY:
        if (tc_is_ws(c)) {
            r = JS_R_CONT;
        } else if (c == '"') {
            s->st = JS_STR, s->key = 1;
            r = JS_R_CONT;
        } else if (c == '}' && s->st == JS_OBJ_FIRST) {
            s->depth--;
            r = js_value_done(s);
        }
        break;
    case JS_COLON:
        if (tc_is_ws(c)) {
            r = JS_R_CONT;
        } else if (c == ':') {
            s->st = JS_VALUE;
            r = JS_R_CONT;
        }
        break;
    case JS_AFTER:
        if (tc_is_ws(c)) {
            r = JS_R_CONT;
        } else if (c == ',') {
            s->st = js_top_is_obj(s) ? JS_OBJ_KEY : JS_VALUE;
            r = JS_R_CONT;
        } else if (c == (js_top_is_obj(s) ? '}' : ']')) {
            s->depth--;
            r = js_value_done(s);
        }
        break;
    case JS_STR:
        if (c == '"') {
            if (s->key) {
                s->key = 0;
                s->st = JS_COLON;
                r = JS_R_CONT;
            } else {
                r = js_value_done(s);
            }
        } else if (c == '\\') {
            s->st = JS_STR_ESC;
            r = JS_R_CONT;
        } else if (c >= 0x20) {
            r = JS_R_CONT;
        }
        break;
    case JS_STR_ESC:
        if (strchr("\"\\/bfnrt", c) && c) {
            s->st = JS_STR;
            r = JS_R_CONT;
        } else if (c == 'u') {
            s->st = JS_STR_U, s->sub = 0;
            r = JS_R_CONT;
        }
        break;
    case JS_STR_U:
        if (js_is_hex(c)) {
            if (++s->sub == 4) s->st = JS_STR;
            r = JS_R_CONT;
        }
        break;
    case JS_LIT: {
        const char *lit = g_lits[s->lit];
        if ((uint8_t)lit[s->sub] == c) {
            s->sub++;
            r = lit[s->sub] ? JS_R_CONT : js_value_done(s);
        }
        break;
    }
    case JS_NUM_MINUS:
        if (c == '0')
            s->st = JS_NUM_ZERO, r = JS_R_CONT;
        else if (js_is_digit(c))
            s->st = JS_NUM_INT, r = JS_R_CONT;
        break;
    case JS_NUM_ZERO:
    case JS_NUM_INT:
        if (js_is_digit(c) && s->st == JS_NUM_INT)
            r = JS_R_CONT;
        else if (c == '.')
            s->st = JS_NUM_DOT, r = JS_R_CONT;
        else if (c == 'e' || c == 'E')
            s->st = JS_NUM_E, r = JS_R_CONT;
        else if (js_is_digit(c))
            r = JS_R_BAD; /* leading zero */
        else
            return js_num_end(s, c);
        break;
    case JS_NUM_DOT:
        if (js_is_digit(c)) s->st = JS_NUM_FRAC, r = JS_R_CONT;
        break;
    case JS_NUM_FRAC:
        if (js_is_digit(c))
            r = JS_R_CONT;
        else if (c == 'e' || c == 'E')
            s->st = JS_NUM_E, r = JS_R_CONT;
        else
            return js_num_end(s, c);
        break;
    case JS_NUM_E:
        if (c == '+' || c == '-')
            s->st = JS_NUM_ESGN, r = JS_R_CONT;
        else if (js_is_digit(c))
            s->st = JS_NUM_EXP, r = JS_R_CONT;
        break;
    case JS_NUM_ESGN:
        if (js_is_digit(c)) s->st = JS_NUM_EXP, r = JS_R_CONT;
        break;
    case JS_NUM_EXP:
        if (js_is_digit(c))
            r = JS_R_CONT;
        else
            return js_num_end(s, c);
        break;
    case JS_END:
        return JS_R_DONE_BEFORE;
    default:
        break;
    }
    if (r == JS_R_BAD) {
        s->st = JS_ERR;
    } else {
        s->n++;
    }
    return r;
}

js_result json_scan_end(json_scan *s)
{
    if (s->depth == 0 && (s->st == JS_NUM_ZERO || s->st == JS_NUM_INT || s->st == JS_NUM_FRAC ||
                          s->st == JS_NUM_EXP || s->st == JS_END)) {
        s->st = JS_END;
        return JS_R_DONE;
    }
    return JS_R_BAD;
}

/* ---- atomic helpers --------------------------------------------------------------- */

size_t tc_skip_ws(const char *s, size_t n, size_t i)
{
    while (i < n && tc_is_ws((uint8_t)s[i]))
        i++;
    return i;
}

tc_pr tc_lit(const char *s, size_t n, size_t *i, const char *lit)
{
    size_t k = 0, j = *i;
    while (lit[k]) {
        if (j >= n) return TC_MORE;
        if (s[j] != lit[k]) return TC_FAIL;
        j++, k++;
    }
    *i = j;
    return TC_OK;
}

static int hexval(uint8_t c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Parses 4 hex digits at s[j]. */
static tc_pr hex4(const char *s, size_t n, size_t j, uint32_t *out)
{
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
        if (j + (size_t)k >= n) return TC_MORE;
        int h = hexval((uint8_t)s[j + (size_t)k]);
        if (h < 0) return TC_FAIL;
        v = v * 16 + (uint32_t)h;
    }
    *out = v;
    return TC_OK;
}

static size_t utf8_put(uint32_t cp, char *o)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

tc_pr tc_json_string(const char *s, size_t n, size_t *i, char *out, size_t cap, size_t *out_len)
{
    size_t j = *i, o = 0;
    if (j >= n) return TC_MORE;
    if (s[j] != '"') return TC_FAIL;
    j++;
    for (;;) {
        if (j >= n) return TC_MORE;
        uint8_t c = (uint8_t)s[j];
        char tmp[4];
        size_t k = 0;
        if (c == '"') {
            j++;
            break;
        }
        if (c < 0x20) return TC_FAIL;
        if (c != '\\') {
            tmp[0] = (char)c, k = 1, j++;
        } else {
            if (j + 1 >= n) return TC_MORE;
            uint8_t e = (uint8_t)s[j + 1];
            const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t";
            const char *f = e ? strchr(from, e) : NULL;
            if (f) {
                tmp[0] = to[f - from], k = 1, j += 2;
            } else if (e == 'u') {
                uint32_t cp, lo;
                tc_pr r = hex4(s, n, j + 2, &cp);
                if (r != TC_OK) return r;
                j += 6;
                if (cp >= 0xD800 && cp < 0xDC00) {
                    /* a high surrogate wants "\uDC00".."\uDFFF" next */
                    if (j + 1 >= n) return TC_MORE;
                    if (s[j] == '\\' && s[j + 1] == 'u') {
                        r = hex4(s, n, j + 2, &lo);
                        if (r == TC_MORE) return r;
                        if (r == TC_OK && lo >= 0xDC00 && lo < 0xE000) {
                            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                            j += 6;
                        } else {
                            cp = 0xFFFD;
                        }
                    } else {
                        cp = 0xFFFD;
                    }
                } else if (cp >= 0xDC00 && cp < 0xE000) {
                    cp = 0xFFFD;
                }
                k = utf8_put(cp, tmp);
            } else {
                return TC_FAIL;
            }
        }
        if (o + k + 1 > cap) return TC_FAIL;
        memcpy(out + o, tmp, k);
        o += k;
    }
    out[o] = '\0';
    *out_len = o;
    *i = j;
    return TC_OK;
}

tc_pr tc_json_skip(const char *s, size_t n, size_t *i, bool at_end)
{
    json_scan sc;
    json_scan_init(&sc);
    size_t j = tc_skip_ws(s, n, *i);
    if (j >= n) return at_end ? TC_FAIL : TC_MORE;
    for (; j < n; j++) {
        js_result r = json_scan_byte(&sc, (uint8_t)s[j]);
        if (r == JS_R_BAD) return TC_FAIL;
        if (r == JS_R_DONE) {
            *i = j + 1;
            return TC_OK;
        }
        if (r == JS_R_DONE_BEFORE) {
            *i = j;
            return TC_OK;
        }
    }
    if (at_end && json_scan_end(&sc) == JS_R_DONE) {
        *i = n;
        return TC_OK;
    }
    return at_end ? TC_FAIL : TC_MORE;
}
