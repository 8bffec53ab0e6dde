/*
 * jinja_lex.c — the tokenizer: template text, {{ }}, {% %}, {# #} and
 * {% raw %}, with jinja2's whitespace control as transformers configures it
 * (trim_blocks: the newline after a block or comment tag is dropped;
 * lstrip_blocks: spaces and tabs before a block or comment tag at the start
 * of a line are dropped; "-" strips all whitespace on that side, "+"
 * disables both). Mirrors jinja2.lexer.Lexer.tokeniter, rule for rule.
 *
 * Invariants: the input is valid UTF-8 (checked first); every token's text
 * points into the normalized copy, which the template arena owns; brackets
 * inside tags are balanced before a tag may end (so `{{ {'a': 1}}}` works).
 */
#include "jinja_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#define LEX_MAX_BRACKETS 256

typedef struct lexer {
    jmem *m;
    const char *s; /* normalized source */
    size_t n, pos;
    uint32_t line;
    bool line_starting; /* the last match ended with a newline */
    jtok *toks;
    size_t n_toks, cap;
    char *err;
} lexer;

static keel_status lex_fail(lexer *L, uint32_t line, const char *fmt, ...) BASE_PRINTF(3, 4);

static keel_status lex_fail(lexer *L, uint32_t line, const char *fmt, ...)
{
    if (L->err) {
        int k = snprintf(L->err, JINJA_ERR_CAP, "template line %u: ", line);
        if (k > 0 && (size_t)k < JINJA_ERR_CAP) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(L->err + k, JINJA_ERR_CAP - (size_t)k, fmt, ap);
            va_end(ap);
        }
    }
    return KEEL_EFORMAT;
}

static jtok *lex_push(lexer *L, uint8_t type, uint32_t line)
{
    if (L->n_toks == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 256;
        jtok *t = jmem_alloc_n(L->m, cap, sizeof(jtok));
        if (!t) return NULL;
        if (L->n_toks) memcpy(t, L->toks, L->n_toks * sizeof(jtok));
        L->toks = t;
        L->cap = cap;
    }
    jtok *t = &L->toks[L->n_toks++];
    memset(t, 0, sizeof *t);
    t->type = type;
    t->line = line;
    return t;
}

static uint32_t count_nl(const char *s, size_t n)
{
    uint32_t k = 0;
    for (size_t i = 0; i < n; i++) k += s[i] == '\n';
    return k;
}

/* Bytes of the whitespace (Python \s) run starting at s[i]. */
static size_t ws_run(const char *s, size_t n, size_t i)
{
    size_t j = i;
    while (j < n) {
        size_t k = j;
        uint32_t c = utf8_next(s, n, &k);
        if (!py_isspace(c)) break;
        j = k;
    }
    return j - i;
}

/* Length of s[0..n) without its trailing whitespace (str.rstrip()). */
static size_t rstrip_len(const char *s, size_t n)
{
    while (n > 0) {
        size_t st = n - 1;
        while (st > 0 && ((unsigned char)s[st] & 0xC0) == 0x80) st--;
        size_t k = st;
        uint32_t c = utf8_next(s, n, &k);
        if (!py_isspace(c)) break;
        n = st;
    }
    return n;
}

/* Emits the text before a tag, applying "-" / lstrip_blocks. sign is the
 * tag's '-', '+' or 0; lstrip: the tag is a block or comment. */
static keel_status lex_data(lexer *L, size_t start, size_t end, char sign, bool lstrip)
{
    const char *text = L->s + start;
    size_t n = end - start;
    uint32_t line = L->line;
    L->line += count_nl(text, n);
    if (sign == '-') {
        n = rstrip_len(text, n);
    } else if (sign != '+' && lstrip) {
        size_t l_pos = 0;
        for (size_t i = n; i > 0; i--)
            if (text[i - 1] == '\n') {
                l_pos = i;
                break;
            }
        if ((l_pos > 0 || L->line_starting) && l_pos < n && ws_run(text, n, l_pos) == n - l_pos)
            n = l_pos;
    }
    if (n == 0) return KEEL_OK;
    jtok *t = lex_push(L, TK_DATA, line);
    if (!t) return L->m->fail;
    t->s = text;
    t->n = n;
    return KEEL_OK;
}

static bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static bool is_name0(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

/* Bytes of a non-ASCII identifier character at s[i] (Python's XID classes,
 * approximated by Unicode categories: letters and letter numbers start a
 * name, marks, digits and connectors continue it), or 0. */
static size_t uni_name_char(const char *s, size_t n, size_t i, bool start)
{
    if ((unsigned char)s[i] < 0x80) return 0;
    size_t k = i;
    uint32_t c = utf8_next(s, n, &k);
    utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)c);
    bool ok = (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
              cat == UTF8PROC_CATEGORY_NL;
    if (!start)
        ok = ok || cat == UTF8PROC_CATEGORY_MN || cat == UTF8PROC_CATEGORY_MC ||
             cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_PC;
    return ok ? k - i : 0;
}

/* digits with single underscores between them: (\d+_)*\d+ ; returns end */
static size_t scan_digits(const char *s, size_t n, size_t i)
{
    if (i >= n || !is_digit(s[i])) return i;
    while (i < n) {
        while (i < n && is_digit(s[i])) i++;
        if (i + 1 < n && s[i] == '_' && is_digit(s[i + 1]))
            i++;
        else
            break;
    }
    return i;
}

/* float_re: (?<!\.)(\d+_)*\d+((\.(\d+_)*\d+)?e[+\-]?(\d+_)*\d+|\.(\d+_)*\d+) */
static size_t scan_float(const lexer *L, size_t i)
{
    const char *s = L->s;
    size_t n = L->n;
    if (i > 0 && s[i - 1] == '.') return 0;
    size_t j = scan_digits(s, n, i);
    if (j == i) return 0;
    size_t k = j;
    bool frac = false;
    if (k + 1 < n && s[k] == '.' && is_digit(s[k + 1])) {
        k = scan_digits(s, n, k + 1);
        frac = true;
    }
    if (k < n && (s[k] == 'e' || s[k] == 'E')) {
        size_t e = k + 1;
        if (e < n && (s[e] == '+' || s[e] == '-')) e++;
        size_t ee = scan_digits(s, n, e);
        if (ee > e) return ee - i;
    }
    return frac ? k - i : 0;
}

static keel_status lex_number(lexer *L, size_t *pos)
{
    size_t i = *pos;
    const char *s = L->s;
    char buf[128];
    size_t fl = scan_float(L, i);
    if (fl) {
        size_t k = 0;
        for (size_t j = i; j < i + fl && k < sizeof buf - 1; j++)
            if (s[j] != '_') buf[k++] = s[j];
        buf[k] = 0;
        jtok *t = lex_push(L, TK_FLOAT, L->line);
        if (!t) return L->m->fail;
        t->f = strtod(buf, NULL);
        *pos = i + fl;
        return KEEL_OK;
    }
    /* integer_re (case-insensitive):
     * 0b(_?[01])+ | 0o(_?[0-7])+ | 0x(_?[0-9a-f])+ | [1-9](_?\d)* | 0(_?0)* */
    int base = 10;
    size_t j = i;
    if (s[i] == '0' && i + 1 < L->n && strchr("bBoOxX", s[i + 1]) && s[i + 1]) {
        char b = (char)(s[i + 1] | 0x20);
        base = b == 'b' ? 2 : b == 'o' ? 8 : 16;
        size_t k = i + 2;
        size_t d0 = k;
        while (k < L->n) {
            size_t kk = k;
            if (s[kk] == '_') kk++;
            if (kk >= L->n) break;
            char c = (char)(s[kk] | 0x20);
            bool ok = base == 2 ? (c == '0' || c == '1')
                      : base == 8 ? (c >= '0' && c <= '7')
                                  : (is_digit(c) || (c >= 'a' && c <= 'f'));
            if (!ok) break;
            k = kk + 1;
        }
        if (k == d0) {
            base = 10;
            j = i + 1; /* just "0" */
        } else {
            j = k;
        }
    } else if (s[i] == '0') {
        j = i + 1;
        while (j < L->n) {
            size_t kk = j;
            if (s[kk] == '_') kk++;
            if (kk < L->n && s[kk] == '0')
                j = kk + 1;
            else
                break;
        }
    } else {
        j = scan_digits(s, L->n, i);
    }
    uint64_t v = 0;
    size_t start = base == 10 ? i : i + 2;
    for (size_t k = start; k < j; k++) {
        if (s[k] == '_') continue;
        char c = (char)(s[k] | 0x20);
        uint64_t d = is_digit(c) ? (uint64_t)(c - '0') : (uint64_t)(c - 'a' + 10);
        if (v > (UINT64_MAX - d) / (uint64_t)base)
            return lex_fail(L, L->line, "integer literal too large");
        v = v * (uint64_t)base + d;
    }
    if (v > (uint64_t)INT64_MAX) return lex_fail(L, L->line, "integer literal too large");
    jtok *t = lex_push(L, TK_INT, L->line);
    if (!t) return L->m->fail;
    t->i = (int64_t)v;
    *pos = j;
    return KEEL_OK;
}

/* A string literal: Python's unicode-escape decoding of its body. */
static keel_status lex_string(lexer *L, size_t *pos)
{
    const char *s = L->s;
    size_t i = *pos;
    char q = s[i];
    size_t j = i + 1;
    while (j < L->n && s[j] != q) {
        if (s[j] == '\\') j++;
        j++;
    }
    if (j >= L->n) return lex_fail(L, L->line, "unexpected char '%c' (an unterminated string)", q);
    uint32_t line = L->line;
    jsb b;
    jsb_init(&b, L->m, SIZE_MAX / 2);
    size_t k = i + 1;
    while (k < j) {
        char c = s[k];
        if (c != '\\') {
            size_t e = k;
            while (e < j && s[e] != '\\') e++;
            jsb_add(&b, s + k, e - k);
            k = e;
            continue;
        }
        char e = s[k + 1];
        k += 2;
        uint32_t cp;
        int nd;
        switch (e) {
        case '\n': break;
        case '\\': jsb_addc(&b, '\\'); break;
        case '\'': jsb_addc(&b, '\''); break;
        case '"': jsb_addc(&b, '"'); break;
        case 'a': jsb_addc(&b, '\a'); break;
        case 'b': jsb_addc(&b, '\b'); break;
        case 'f': jsb_addc(&b, '\f'); break;
        case 'n': jsb_addc(&b, '\n'); break;
        case 'r': jsb_addc(&b, '\r'); break;
        case 't': jsb_addc(&b, '\t'); break;
        case 'v': jsb_addc(&b, '\v'); break;
        case 'x': case 'u': case 'U':
            nd = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            cp = 0;
            for (int d = 0; d < nd; d++) {
                char h = k < j ? (char)(s[k] | 0x20) : 0;
                int v = is_digit(h) ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10 : -1;
                if (v < 0) return lex_fail(L, line, "truncated \\%c escape in a string", e);
                cp = cp * 16 + (uint32_t)v;
                k++;
            }
            if (cp > 0x10FFFF) return lex_fail(L, line, "illegal Unicode character in a string");
            jsb_addcp(&b, cp);
            break;
        case '0': case '1': case '2': case '3': case '4': case '5': case '6': case '7':
            cp = (uint32_t)(e - '0');
            for (int d = 0; d < 2 && k < j && s[k] >= '0' && s[k] <= '7'; d++, k++)
                cp = cp * 8 + (uint32_t)(s[k] - '0');
            jsb_addcp(&b, cp);
            break;
        default:
            /* unknown escapes stay as written (Python keeps the backslash) */
            jsb_addc(&b, '\\');
            k--;
            break;
        }
    }
    if (b.oom) return L->m->fail;
    jtok *t = lex_push(L, TK_STRING, line);
    if (!t) return L->m->fail;
    t->str = jsb_done(&b);
    if (!t->str) return L->m->fail;
    L->line += count_nl(s + i, j + 1 - i);
    *pos = j + 1;
    return KEEL_OK;
}

static int op_at(const char *s, size_t n, size_t i, size_t *len)
{
    char c = s[i], d = i + 1 < n ? s[i + 1] : 0;
    *len = 2;
    if (c == '/' && d == '/') return OP_FLOORDIV;
    if (c == '*' && d == '*') return OP_POW;
    if (c == '=' && d == '=') return OP_EQ;
    if (c == '!' && d == '=') return OP_NE;
    if (c == '>' && d == '=') return OP_GE;
    if (c == '<' && d == '=') return OP_LE;
    *len = 1;
    switch (c) {
    case '+': return OP_ADD;
    case '-': return OP_SUB;
    case '/': return OP_DIV;
    case '*': return OP_MUL;
    case '%': return OP_MOD;
    case '~': return OP_TILDE;
    case '[': return OP_LBRACKET;
    case ']': return OP_RBRACKET;
    case '(': return OP_LPAREN;
    case ')': return OP_RPAREN;
    case '{': return OP_LBRACE;
    case '}': return OP_RBRACE;
    case '>': return OP_GT;
    case '<': return OP_LT;
    case '=': return OP_ASSIGN;
    case '.': return OP_DOT;
    case ':': return OP_COLON;
    case '|': return OP_PIPE;
    case ',': return OP_COMMA;
    case ';': return OP_SEMICOLON;
    default: return 0;
    }
}

/* Tokens of a {{ }} (block false) or {% %} tag up to and including its end. */
static keel_status lex_tag(lexer *L, bool block)
{
    const char *s = L->s;
    size_t n = L->n;
    char stack[LEX_MAX_BRACKETS];
    int sp = 0;
    const char end1 = block ? '%' : '}';
    for (;;) {
        size_t i = L->pos;
        if (i >= n)
            return lex_fail(L, L->line, "unexpected end of template (unclosed %s)",
                            block ? "'{%'" : "'{{'");
        if (sp == 0) {
            /* end rules come first: +%}  -%}\s*  %}\n?   /   -}}\s*  }} */
            if (block && s[i] == '+' && i + 2 < n + 0 && s[i + 1] == '%' && s[i + 2] == '}') {
                if (!lex_push(L, TK_BLOCK_END, L->line)) return L->m->fail;
                L->pos = i + 3;
                L->line_starting = false;
                return KEEL_OK;
            }
            if (s[i] == '-' && i + 2 < n && s[i + 1] == end1 && s[i + 2] == '}') {
                if (!lex_push(L, block ? TK_BLOCK_END : TK_VAR_END, L->line)) return L->m->fail;
                size_t w = ws_run(s, n, i + 3);
                L->line += count_nl(s + i + 3, w);
                L->pos = i + 3 + w;
                L->line_starting = w > 0 ? s[i + 3 + w - 1] == '\n' : false;
                return KEEL_OK;
            }
            if (s[i] == end1 && i + 1 < n && s[i + 1] == '}') {
                if (!lex_push(L, block ? TK_BLOCK_END : TK_VAR_END, L->line)) return L->m->fail;
                L->pos = i + 2;
                L->line_starting = false;
                if (block && L->pos < n && s[L->pos] == '\n') {
                    L->pos++;
                    L->line++;
                    L->line_starting = true;
                }
                return KEEL_OK;
            }
        }
        size_t w = ws_run(s, n, i);
        if (w) {
            L->line += count_nl(s + i, w);
            L->pos = i + w;
            continue;
        }
        char c = s[i];
        if (is_digit(c)) {
            TRY(lex_number(L, &L->pos));
            continue;
        }
        size_t u0 = is_name0(c) ? 1 : uni_name_char(s, n, i, true);
        if (u0) {
            size_t j = i + u0, u;
            for (;;) {
                if (j < n && (is_name0(s[j]) || is_digit(s[j])))
                    j++;
                else if (j < n && (u = uni_name_char(s, n, j, false)) > 0)
                    j += u;
                else
                    break;
            }
            jtok *t = lex_push(L, TK_NAME, L->line);
            if (!t) return L->m->fail;
            t->s = s + i;
            t->n = j - i;
            L->pos = j;
            continue;
        }
        if (c == '\'' || c == '"') {
            TRY(lex_string(L, &L->pos));
            continue;
        }
        size_t len;
        int op = op_at(s, n, i, &len);
        if (!op) {
            if ((unsigned char)c >= 0x80) {
                size_t k = i;
                uint32_t cp = utf8_next(s, n, &k);
                return lex_fail(L, L->line, "unexpected char U+%04X", cp);
            }
            return lex_fail(L, L->line, "unexpected char '%c'", c);
        }
        if (op == OP_LPAREN || op == OP_LBRACKET || op == OP_LBRACE) {
            if (sp >= LEX_MAX_BRACKETS) return lex_fail(L, L->line, "brackets nested too deeply");
            stack[sp++] = op == OP_LPAREN ? ')' : op == OP_LBRACKET ? ']' : '}';
        } else if (op == OP_RPAREN || op == OP_RBRACKET || op == OP_RBRACE) {
            if (sp == 0) return lex_fail(L, L->line, "unexpected '%c'", c);
            if (stack[sp - 1] != c)
                return lex_fail(L, L->line, "unexpected '%c', expected '%c'", c, stack[sp - 1]);
            sp--;
        }
        jtok *t = lex_push(L, TK_OP, L->line);
        if (!t) return L->m->fail;
        t->op = (uint8_t)op;
        L->pos = i + len;
    }
}

/* {% [-+]? \s* raw \s* (-%}\s* | %}) at s[i]: length of the match or 0. */
static size_t match_raw_begin(const lexer *L, size_t i, char *sign)
{
    const char *s = L->s;
    size_t n = L->n, k = i + 2;
    *sign = 0;
    if (k < n && (s[k] == '-' || s[k] == '+')) *sign = s[k++];
    k += ws_run(s, n, k);
    if (n - k < 3 || memcmp(s + k, "raw", 3) != 0) return 0;
    k += 3;
    k += ws_run(s, n, k);
    if (k + 2 < n + 0 && s[k] == '-' && s[k + 1] == '%' && s[k + 2] == '}') {
        k += 3;
        return k + ws_run(s, n, k) - i;
    }
    if (k + 1 < n && s[k] == '%' && s[k + 1] == '}') return k + 2 - i;
    return 0;
}

/* The body of a raw block up to {% endraw %} (whose own whitespace control
 * applies as for any block tag). */
static keel_status lex_raw(lexer *L)
{
    const char *s = L->s;
    size_t n = L->n, start = L->pos;
    for (size_t i = start; i + 1 < n; i++) {
        if (s[i] != '{' || s[i + 1] != '%') continue;
        size_t k = i + 2;
        char sign = 0;
        if (k < n && (s[k] == '-' || s[k] == '+')) sign = s[k++];
        k += ws_run(s, n, k);
        if (n - k < 6 || memcmp(s + k, "endraw", 6) != 0) continue;
        k += 6;
        k += ws_run(s, n, k);
        size_t end;
        bool trim = false, strip = false;
        if (k + 2 < n && s[k] == '+' && s[k + 1] == '%' && s[k + 2] == '}') {
            end = k + 3;
        } else if (k + 2 < n && s[k] == '-' && s[k + 1] == '%' && s[k + 2] == '}') {
            end = k + 3;
            strip = true;
        } else if (k + 1 < n && s[k] == '%' && s[k + 1] == '}') {
            end = k + 2;
            trim = true;
        } else {
            continue;
        }
        TRY(lex_data(L, start, i, sign, true));
        L->line += count_nl(s + i, end - i);
        L->line_starting = false;
        if (strip) {
            size_t w = ws_run(s, n, end);
            L->line += count_nl(s + end, w);
            if (w) L->line_starting = s[end + w - 1] == '\n';
            end += w;
        } else if (trim && end < n && s[end] == '\n') {
            end++;
            L->line++;
            L->line_starting = true;
        }
        L->pos = end;
        return KEEL_OK;
    }
    return lex_fail(L, L->line, "Missing end of raw directive");
}

/* A comment: up to the first #} (with its - / + and trim). */
static keel_status lex_comment(lexer *L)
{
    const char *s = L->s;
    size_t n = L->n;
    for (size_t i = L->pos; i + 1 < n; i++) {
        if (s[i] != '#' || s[i + 1] != '}') continue;
        char sign = i > L->pos ? s[i - 1] : 0;
        size_t end = i + 2;
        L->line += count_nl(s + L->pos, end - L->pos);
        L->line_starting = false;
        if (sign == '-') {
            size_t w = ws_run(s, n, end);
            L->line += count_nl(s + end, w);
            if (w) L->line_starting = s[end + w - 1] == '\n';
            end += w;
        } else if (sign != '+' && end < n && s[end] == '\n') {
            end++;
            L->line++;
            L->line_starting = true;
        }
        L->pos = end;
        return KEEL_OK;
    }
    return lex_fail(L, L->line, "Missing end of comment tag");
}

keel_status jinja_lex(jmem *m, const char *src, size_t len, jtok **toks, size_t *n_toks,
                      char *err)
{
    lexer L = {0};
    L.m = m;
    L.err = err;
    L.line = 1;
    L.line_starting = true;
    size_t bad = utf8_check(src, len);
    if (bad != len) {
        uint32_t line = 1 + count_nl(src, bad);
        return lex_fail(&L, line, "the template is not valid UTF-8 (byte %zu)", bad);
    }
    /* newlines: \r\n and \r become \n; one trailing newline is dropped */
    char *s = jmem_alloc(m, len + 1);
    if (!s) return m->fail;
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n > 0 && s[n - 1] == '\n') n--;
    s[n] = 0;
    L.s = s;
    L.n = n;
    while (L.pos < n) {
        /* the next tag start */
        size_t i = L.pos, tag = n;
        char kind = 0;
        for (; i + 1 < n; i++) {
            if (s[i] == '{' && (s[i + 1] == '{' || s[i + 1] == '%' || s[i + 1] == '#')) {
                tag = i;
                kind = s[i + 1];
                break;
            }
        }
        if (tag == n) {
            TRY(lex_data(&L, L.pos, n, 0, false));
            L.pos = n;
            break;
        }
        char sign = tag + 2 < n && (s[tag + 2] == '-' || s[tag + 2] == '+') ? s[tag + 2] : 0;
        if (kind == '%') {
            char rsign;
            size_t rl = match_raw_begin(&L, tag, &rsign);
            if (rl) {
                TRY(lex_data(&L, L.pos, tag, rsign, true));
                L.line += count_nl(s + tag, rl);
                L.line_starting = s[tag + rl - 1] == '\n';
                L.pos = tag + rl;
                TRY(lex_raw(&L));
                continue;
            }
        }
        TRY(lex_data(&L, L.pos, tag, sign, kind != '{'));
        L.line_starting = false;
        L.pos = tag + 2 + (sign ? 1 : 0);
        if (kind == '#') {
            TRY(lex_comment(&L));
            continue;
        }
        if (!lex_push(&L, kind == '%' ? TK_BLOCK_BEGIN : TK_VAR_BEGIN, L.line)) return m->fail;
        TRY(lex_tag(&L, kind == '%'));
    }
    if (!lex_push(&L, TK_EOF, L.line)) return m->fail;
    *toks = L.toks;
    *n_toks = L.n_toks;
    return KEEL_OK;
}
