/*
 * jstring.c — JSON Schema's string keywords as automata (regex.c) and
 * GBNF (jstring.h).
 *
 * A spec becomes one DFA over code points (the conjunction of its
 * patterns, formats and exclusions, built by products), then, when its
 * length bounds are not implied by that DFA, the product with a length
 * counter. The GBNF has one rule per live state: an alternative per
 * target state whose characters are spelled canonically (raw, except '"'
 * '\\' and U+0000..U+001F as escapes), and the closing quote where the
 * state accepts. Dead ends are never emitted (every state is live), so a
 * matcher never walks into a prefix that cannot be completed.
 *
 * Formats are regular expressions of this file run through the same
 * engine, so that jstr_test and jstr_gbnf agree by construction. Where a
 * format's language is not (practically) regular, the automaton is the
 * subset or superset named at its entry in FORMATS.
 */
#include "jstring.h"
#include "regex.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JSTR_MAX_GBNF (32u << 20) /* bytes of emitted GBNF */

/* ---- formats -------------------------------------------------------------- */

/* clang-format off */
#define DEC_OCTET "(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9][0-9]|[0-9])"
#define IPV4      DEC_OCTET "(?:\\." DEC_OCTET "){3}"
#define H16       "[0-9A-Fa-f]{1,4}"
#define LS32      "(?:" H16 ":" H16 "|" IPV4 ")"
#define IPV6                                                                                       \
    "(?:(?:" H16 ":){6}" LS32 "|::(?:" H16 ":){5}" LS32 "|(?:" H16 ")?::(?:" H16 ":){4}" LS32      \
    "|(?:(?:" H16 ":){0,1}" H16 ")?::(?:" H16 ":){3}" LS32 "|(?:(?:" H16 ":){0,2}" H16             \
    ")?::(?:" H16 ":){2}" LS32 "|(?:(?:" H16 ":){0,3}" H16 ")?::" H16 ":" LS32 "|(?:(?:" H16       \
    ":){0,4}" H16 ")?::" LS32 "|(?:(?:" H16 ":){0,5}" H16 ")?::" H16 "|(?:(?:" H16 ":){0,6}" H16   \
    ")?::)"
#define LABEL    "[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
#define HOSTNAME LABEL "(?:\\." LABEL ")*"
/* a label with "--" in its 3rd and 4th characters (IDNA's reserved
 * labels: punycode "xn--" ones are not checked, so all are refused) */
#define RESERVED_LABEL "(?:[^]*\\.)?[^.][^.]--[^]*"
#define FULL_DATE                                                                                  \
    "(?:[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])"                                 \
    "|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8]))"                          \
    "|(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)-02-29)"
#define SECFRAC "(?:\\.[0-9]+)?"
#define FULL_TIME                                                                                  \
    "(?:(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]" SECFRAC                                        \
    "(?:[Zz]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])|23:59:60" SECFRAC "(?:[Zz]|[+-]00:00))"
#define DUR_TIME "T(?:[0-9]+H(?:[0-9]+M(?:[0-9]+S)?)?|[0-9]+M(?:[0-9]+S)?|[0-9]+S)"
#define DURATION                                                                                   \
    "P(?:(?:[0-9]+D|[0-9]+M(?:[0-9]+D)?|[0-9]+Y(?:[0-9]+M(?:[0-9]+D)?)?)(?:" DUR_TIME              \
    ")?|" DUR_TIME "|[0-9]+W)"
#define HEX       "[0-9A-Fa-f]"
#define PCT       "%" HEX HEX
#define UNRES_SUB "A-Za-z0-9._~!$&'()*+,;=\\-"
/* RFC 3986 with U the class body of the unreserved and sub-delims
 * characters and P what a query adds (RFC 3987's IRIs: U gains ucschar,
 * P iprivate) */
#define PCHAR_(U) "(?:[" U ":@]|" PCT ")"
#define AUTHORITY_(U)                                                                              \
    "(?:(?:[" U ":]|" PCT ")*@)?(?:\\[(?:" IPV6 "|[vV]" HEX "+\\.[" UNRES_SUB ":]+)\\]|" IPV4      \
    "|(?:[" U "]|" PCT ")*)(?::[0-9]*)?"
#define PATH_ABEMPTY_(U)  "(?:/" PCHAR_(U) "*)*"
#define QUERY_FRAG_(U, P) "(?:\\?(?:" PCHAR_(U) "|[/?" P "])*)?(?:#(?:" PCHAR_(U) "|[/?])*)?"
#define URI_(U, P)                                                                                 \
    "[A-Za-z][A-Za-z0-9+.-]*:(?://" AUTHORITY_(U) PATH_ABEMPTY_(U)                                 \
    "|/(?:" PCHAR_(U) "+" PATH_ABEMPTY_(U) ")?|" PCHAR_(U) "+" PATH_ABEMPTY_(U) ")?"               \
    QUERY_FRAG_(U, P)
#define RELATIVE_REF_(U, P)                                                                        \
    "(?://" AUTHORITY_(U) PATH_ABEMPTY_(U) "|/(?:" PCHAR_(U) "+" PATH_ABEMPTY_(U) ")?"             \
    "|(?:[" U "@]|" PCT ")+" PATH_ABEMPTY_(U) ")?" QUERY_FRAG_(U, P)
#define UCSCHAR                                                                                    \
    "\\u00A0-\\uD7FF\\uF900-\\uFDCF\\uFDF0-\\uFFEF"                                                \
    "\\u{10000}-\\u{1FFFD}\\u{20000}-\\u{2FFFD}\\u{30000}-\\u{3FFFD}\\u{40000}-\\u{4FFFD}"         \
    "\\u{50000}-\\u{5FFFD}\\u{60000}-\\u{6FFFD}\\u{70000}-\\u{7FFFD}\\u{80000}-\\u{8FFFD}"         \
    "\\u{90000}-\\u{9FFFD}\\u{A0000}-\\u{AFFFD}\\u{B0000}-\\u{BFFFD}\\u{C0000}-\\u{CFFFD}"         \
    "\\u{D0000}-\\u{DFFFD}\\u{E1000}-\\u{EFFFD}"
#define IPRIVATE      "\\uE000-\\uF8FF\\u{F0000}-\\u{FFFFD}\\u{100000}-\\u{10FFFD}"
#define URI           URI_(UNRES_SUB, "")
#define RELATIVE_REF  RELATIVE_REF_(UNRES_SUB, "")
#define IRI           URI_(UNRES_SUB UCSCHAR, IPRIVATE)
#define IRELATIVE_REF RELATIVE_REF_(UNRES_SUB UCSCHAR, IPRIVATE)
/* RFC 6570 (level 4); an apostrophe is a literal, as the test suite has it */
#define TPL_VARCHAR "(?:[A-Za-z0-9_]|" PCT ")"
#define TPL_VARSPEC TPL_VARCHAR "(?:\\.?" TPL_VARCHAR ")*(?::[1-9][0-9]{0,3}|\\*)?"
#define URI_TEMPLATE                                                                               \
    "(?:[\\x21\\x23\\x24\\x26-\\x3B\\x3D\\x3F-\\x5B\\x5D\\x5F\\x61-\\x7A\\x7E" UCSCHAR IPRIVATE    \
    "]|" PCT "|\\{[+#./;?&=,!@|]?" TPL_VARSPEC "(?:," TPL_VARSPEC ")*\\})*"
#define JSON_POINTER "(?:/(?:[^~/]|~[01])*)*"
#define ATEXT        "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]"
/* clang-format on */

typedef struct jstr_format {
    const char *name;
    const char *re;      /* the whole string must match */
    const char *exclude; /* and must not match this (NULL: none) */
    int64_t max_len;     /* and have at most this many code points (0: no bound) */
} jstr_format;

static const jstr_format FORMATS[] = {
    /* RFC 3339 full-date, leap years exact */
    {"date", FULL_DATE, NULL, 0},
    /* RFC 3339 full-time; a leap second only as 23:59:60 in UTC (Z,
     * +00:00, -00:00): a subset, since a leap second at another offset
     * needs the local time remembered (about 1440 more states) */
    {"time", FULL_TIME, NULL, 0},
    {"date-time", FULL_DATE "[Tt]" FULL_TIME, NULL, 0},
    /* RFC 3339 appendix A */
    {"duration", DURATION, NULL, 0},
    {"uuid", HEX "{8}-" HEX "{4}-" HEX "{4}-" HEX "{4}-" HEX "{12}", NULL, 0},
    /* RFC 5321 Mailbox: dot-atom or quoted local part; a hostname or an
     * address literal as the domain */
    {"email",
     "(?:" ATEXT "+(?:\\." ATEXT
     "+)*|\"(?:[\\x20\\x21\\x23-\\x5B\\x5D-\\x7E]|\\\\[\\x20-\\x7E])*\")@(?:" HOSTNAME "|\\[" IPV4
     "\\]|\\[IPv6:" IPV6 "\\])",
     NULL, 0},
    /* RFC 1123 labels of 1..63, at most 253 characters in all (the
     * product with the length counter: about 0.1 s to build); reserved
     * "??--" labels are refused (a subset) */
    {"hostname", HOSTNAME, RESERVED_LABEL, 253},
    {"ipv4", IPV4, NULL, 0},
    {"ipv6", IPV6, NULL, 0},
    /* RFC 3986 */
    {"uri", URI, NULL, 0},
    {"uri-reference", "(?:" URI "|" RELATIVE_REF ")", NULL, 0},
    /* RFC 3987 */
    {"iri", IRI, NULL, 0},
    {"iri-reference", "(?:" IRI "|" IRELATIVE_REF ")", NULL, 0},
    {"uri-template", URI_TEMPLATE, NULL, 0},
    /* RFC 6901 */
    {"json-pointer", JSON_POINTER, NULL, 0},
    {"relative-json-pointer", "(?:0|[1-9][0-9]*)(?:#|" JSON_POINTER ")", NULL, 0},
};

#define N_FORMATS (sizeof FORMATS / sizeof FORMATS[0])

bool jstr_format_known(const char *format)
{
    for (size_t i = 0; i < N_FORMATS; i++)
        if (strcmp(FORMATS[i].name, format) == 0) return true;
    return false;
}

/* *d op= x (x consumed). A NULL *d stands for every string. */
static keel_status combine(rx_dfa **d, rx_dfa *x, int op, char *err)
{
    keel_status st = KEEL_OK;
    if (!*d && op == RX_AND) {
        *d = x;
        return KEEL_OK;
    }
    if (!*d) {
        st = rx_length(0, -1, d, err);
        if (st) {
            rx_free(x);
            return st;
        }
    }
    rx_dfa *r = NULL;
    st = rx_product(*d, x, op, &r, err);
    rx_free(x);
    rx_free(*d);
    *d = r;
    return st;
}

static keel_status format_dfa(const char *name, rx_dfa **out, char *err)
{
    *out = NULL;
    const jstr_format *f = NULL;
    for (size_t i = 0; i < N_FORMATS && !f; i++)
        if (strcmp(FORMATS[i].name, name) == 0) f = &FORMATS[i];
    if (!f) return base_err(err, KEEL_EUNSUPPORTED, "format \"%.60s\" is not supported", name);
    keel_status st = rx_compile(f->re, strlen(f->re), false, out, err);
    if (!st && f->exclude) {
        rx_dfa *x = NULL;
        st = rx_compile(f->exclude, strlen(f->exclude), false, &x, err);
        if (!st) st = combine(out, x, RX_ANDNOT, err);
    }
    if (!st && f->max_len) {
        rx_dfa *x = NULL;
        st = rx_length(0, f->max_len, &x, err);
        if (!st) st = combine(out, x, RX_AND, err);
    }
    if (st) {
        rx_free(*out);
        *out = NULL;
    }
    return st;
}

/* The content automaton of s without its lengths; *out NULL when the
 * content is unconstrained. */
static keel_status content_dfa(const jstr_spec *s, rx_dfa **out, char *err)
{
    rx_dfa *d = NULL, *x = NULL;
    keel_status st = KEEL_OK;
    for (int i = 0; i < s->n_pattern && !st; i++) {
        st = rx_compile(s->pattern[i], strlen(s->pattern[i]), true, &x, err);
        if (!st) st = combine(&d, x, RX_AND, err);
    }
    for (int i = 0; i < s->n_not_pattern && !st; i++) {
        st = rx_compile(s->not_pattern[i], strlen(s->not_pattern[i]), true, &x, err);
        if (!st) st = combine(&d, x, RX_ANDNOT, err);
    }
    for (int i = 0; i < s->n_format && !st; i++) {
        st = format_dfa(s->format[i], &x, err);
        if (!st) st = combine(&d, x, RX_AND, err);
    }
    for (int i = 0; i < s->n_not_format && !st; i++) {
        st = format_dfa(s->not_format[i], &x, err);
        if (!st) st = combine(&d, x, RX_ANDNOT, err);
    }
    if (!st && s->n_except) {
        st = rx_strings(s->except, s->except_len, s->n_except, &x, err);
        if (!st) st = combine(&d, x, RX_ANDNOT, err);
    }
    if (st) {
        rx_free(d);
        d = NULL;
    }
    *out = d;
    return st;
}

size_t jstr_spell(const char *s, size_t n, char *out)
{
    static const char hex[] = "0123456789abcdef";
    size_t k = 0;
    out[k++] = '"';
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *e = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\b' ? "\\b" : c == '\f' ? "\\f"
                      : c == '\n' ? "\\n" : c == '\r' ? "\\r" : c == '\t' ? "\\t" : NULL;
        if (e) {
            out[k++] = e[0];
            out[k++] = e[1];
        } else if (c < 0x20) {
            memcpy(out + k, "\\u00", 4);
            out[k + 4] = hex[c >> 4];
            out[k + 5] = hex[c & 15];
            k += 6;
        } else {
            out[k++] = (char)c;
        }
    }
    out[k++] = '"';
    return k;
}

static keel_status check_spec(const jstr_spec *s, char *err)
{
    if (s->n_pattern < 0 || s->n_pattern > JSTR_MAX_ITEMS || s->n_not_pattern < 0 ||
        s->n_not_pattern > JSTR_MAX_ITEMS || s->n_format < 0 || s->n_format > JSTR_MAX_ITEMS ||
        s->n_not_format < 0 || s->n_not_format > JSTR_MAX_ITEMS || s->min_len < 0 ||
        (s->n_except && (!s->except || !s->except_len)))
        return base_err(err, KEEL_EINVAL, "string constraints: bad spec");
    return KEEL_OK;
}

struct jstr_auto {
    rx_dfa *d; /* the content; NULL: free */
    int64_t min_len, max_len;
};

keel_status jstr_auto_open(const jstr_spec *s, jstr_auto **out, char *err)
{
    *out = NULL;
    keel_status st = check_spec(s, err);
    if (st) return st;
    jstr_auto *a = base_calloc(1, sizeof *a);
    if (!a) return base_err(err, KEEL_ENOMEM, "string constraints: out of memory");
    a->min_len = s->min_len;
    a->max_len = s->max_len;
    st = content_dfa(s, &a->d, err);
    if (st) {
        base_free(a, sizeof *a);
        return st;
    }
    *out = a;
    return KEEL_OK;
}

bool jstr_auto_test(const jstr_auto *a, const char *content, size_t n)
{
    int64_t len = 0;
    for (size_t i = 0; i < n; len++)
        if (rx_utf8_next((const unsigned char *)content, n, &i) < 0)
            return false; /* not a JSON string */
    if (len < a->min_len || (a->max_len >= 0 && len > a->max_len)) return false;
    return !a->d || rx_match(a->d, content, n);
}

void jstr_auto_close(jstr_auto *a)
{
    if (!a) return;
    rx_free(a->d);
    base_free(a, sizeof *a);
}

keel_status jstr_test(const jstr_spec *s, const char *content, size_t n, bool *ok, char *err)
{
    *ok = false;
    jstr_auto *a = NULL;
    keel_status st = jstr_auto_open(s, &a, err);
    if (st) return st;
    *ok = jstr_auto_test(a, content, n);
    jstr_auto_close(a);
    return KEEL_OK;
}

/* ---- GBNF ----------------------------------------------------------------- */

typedef struct obuf {
    char *d;
    size_t n, cap;
    keel_status st;
} obuf;

static void oput(obuf *b, const char *s, size_t k)
{
    if (b->st) return;
    if (b->n + k + 1 > JSTR_MAX_GBNF) {
        b->st = KEEL_ERANGE;
        return;
    }
    if (b->n + k + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 4096;
        while (nc < b->n + k + 1)
            nc *= 2;
        char *q = base_realloc(b->d, b->cap, nc);
        if (!q) {
            b->st = KEEL_ENOMEM;
            return;
        }
        b->d = q;
        b->cap = nc;
    }
    memcpy(b->d + b->n, s, k);
    b->n += k;
    b->d[b->n] = 0;
}

static void oputs(obuf *b, const char *s)
{
    oput(b, s, strlen(s));
}

static void oputf(obuf *b, const char *fmt, ...) BASE_PRINTF(2, 3);

static void oputf(obuf *b, const char *fmt, ...)
{
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k < 0 || (size_t)k >= sizeof tmp) {
        if (!b->st) b->st = KEEL_EINTERNAL;
        return;
    }
    oput(b, tmp, (size_t)k);
}

/* The GBNF literal of the JSON escape of c (a character that is never
 * written raw): "\\\"" "\\\\" "\\n" ... "\\u001f". */
static void put_escape(obuf *b, uint32_t c)
{
    switch (c) {
    case '"':
        oputs(b, "\"\\\\\\\"\"");
        return;
    case '\\':
        oputs(b, "\"\\\\\\\\\"");
        return;
    case 8:
        oputs(b, "\"\\\\b\"");
        return;
    case 12:
        oputs(b, "\"\\\\f\"");
        return;
    case 10:
        oputs(b, "\"\\\\n\"");
        return;
    case 13:
        oputs(b, "\"\\\\r\"");
        return;
    case 9:
        oputs(b, "\"\\\\t\"");
        return;
    default:
        oputf(b, "\"\\\\u%04x\"", c);
        return;
    }
}

static bool is_special(uint32_t c)
{
    return c < 0x20 || c == '"' || c == '\\';
}

/* One group of intervals (code points [lo[i], hi[i]]) as the body of a
 * GBNF rule: [raw ranges] | "escape" | ... */
static void put_choice(obuf *b, const uint32_t *lo, const uint32_t *hi, size_t k)
{
    bool any_raw = false, first = true;
    for (size_t i = 0; i < k; i++)
        for (uint32_t c = lo[i]; c <= hi[i] && !any_raw; c++) {
            if (!is_special(c)) any_raw = true;
            if (c >= 0x5D) break; /* past every special */
        }
    for (size_t i = 0; i < k && !any_raw; i++)
        if (hi[i] >= 0x5D) any_raw = true;
    if (any_raw) {
        oputs(b, "[");
        for (size_t i = 0; i < k; i++) {
            uint32_t c = lo[i];
            while (c <= hi[i]) {
                if (is_special(c)) {
                    c++;
                    continue;
                }
                /* the run of raw characters from c: up to the next
                 * special ('"' or '\\') or the range's end */
                uint32_t e = c < '"' ? '"' - 1 : c < '\\' ? '\\' - 1 : hi[i];
                if (e > hi[i]) e = hi[i];
                if (e == c)
                    oputf(b, "\\U%08X", c);
                else
                    oputf(b, "\\U%08X-\\U%08X", c, e);
                c = e + 1;
            }
        }
        oputs(b, "]");
        first = false;
    }
    /* the escapes: the short ones each, the \u00XX ones as two classes
     * of the last hex digit (one per first digit) */
    uint32_t u_lo = 0, u_hi = 0; /* bit d: \u000d / \u001d */
    for (size_t i = 0; i < k; i++)
        for (uint32_t c = lo[i]; c <= hi[i] && c <= 0x5C; c++) {
            if (!is_special(c)) continue;
            if (c < 0x20 && c != 8 && c != 9 && c != 10 && c != 12 && c != 13) {
                if (c < 0x10)
                    u_lo |= 1u << c;
                else
                    u_hi |= 1u << (c - 0x10);
                continue;
            }
            if (!first) oputs(b, " | ");
            put_escape(b, c);
            first = false;
        }
    for (int h = 0; h < 2; h++) {
        uint32_t bits = h ? u_hi : u_lo;
        if (!bits) continue;
        if (!first) oputs(b, " | ");
        first = false;
        if ((bits & (bits - 1)) == 0) { /* one character */
            uint32_t c = (uint32_t)h * 16;
            while (!(bits & 1u))
                bits >>= 1, c++;
            put_escape(b, c);
            continue;
        }
        oputf(b, "\"\\\\u00%d\" [", h);
        for (int dg = 0; dg < 16; dg++)
            if (bits >> dg & 1u) oputf(b, "%c", "0123456789abcdef"[dg]);
        oputs(b, "]");
    }
}

typedef struct edge {
    uint32_t to, lo, hi;
} edge;

static int cmp_edge(const void *x, const void *y)
{
    const edge *a = x, *b = y;
    if (a->to != b->to) return a->to < b->to ? -1 : 1;
    return a->lo < b->lo ? -1 : a->lo > b->lo;
}

/* The distinct choices (rule bodies) of a grammar, each one rule
 * name-k<id> referenced by every edge that reads it: the copies of one
 * class a length counter makes cost one reference each. */
typedef struct choices {
    obuf text;   /* the bodies, one after another */
    size_t *off; /* [n + 1] */
    size_t n, cap_off;
    uint32_t *hash; /* id + 1 */
    size_t cap_hash;
} choices;

static uint64_t text_hash(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

/* The id of body s[0..n), added when new (*added); -1: no memory. */
static int64_t choice_id(choices *c, const char *s, size_t n, bool *added)
{
    *added = false;
    if ((c->n + 1) * 2 > c->cap_hash) {
        size_t nh = c->cap_hash ? c->cap_hash * 2 : 256;
        uint32_t *h = base_calloc(nh, sizeof *h);
        if (!h) return -1;
        for (size_t i = 0; i < c->n; i++) {
            size_t at = (size_t)(text_hash(c->text.d + c->off[i], c->off[i + 1] - c->off[i]) % nh);
            while (h[at])
                at = (at + 1) % nh;
            h[at] = (uint32_t)i + 1;
        }
        base_free(c->hash, c->cap_hash * sizeof *c->hash);
        c->hash = h;
        c->cap_hash = nh;
    }
    size_t at = (size_t)(text_hash(s, n) % c->cap_hash);
    for (; c->hash[at]; at = (at + 1) % c->cap_hash) {
        size_t id = c->hash[at] - 1;
        if (c->off[id + 1] - c->off[id] == n && memcmp(c->text.d + c->off[id], s, n) == 0)
            return (int64_t)id;
    }
    if (c->cap_off < c->n + 2) {
        size_t nc = c->cap_off ? c->cap_off * 2 : 64;
        size_t *o = base_realloc(c->off, c->cap_off * sizeof *o, nc * sizeof *o);
        if (!o) return -1;
        c->off = o;
        c->cap_off = nc;
    }
    if (c->n == 0) c->off[0] = 0;
    oput(&c->text, s, n);
    if (c->text.st) return -1;
    c->off[c->n + 1] = c->text.n;
    c->hash[at] = (uint32_t)c->n + 1;
    *added = true;
    return (int64_t)c->n++;
}

static keel_status emit_dfa(const rx_dfa *d, const char *name, obuf *b, char *err)
{
    choices ch = {0};
    obuf one = {0}, defs = {0}; /* one choice; the choice rules */
    keel_status st = KEEL_OK;
    uint8_t *live = base_alloc(d->n_states);
    edge *ed = base_alloc((size_t)d->n_iv * sizeof *ed);
    /* ranges of one group: at most one per interval, and one more where
     * the surrogates are cut out */
    uint32_t *lo = base_alloc(((size_t)d->n_iv + 1) * sizeof *lo),
             *hi = base_alloc(((size_t)d->n_iv + 1) * sizeof *hi);
    if (!live || !ed || !lo || !hi) {
        st = base_err(err, KEEL_ENOMEM, "string constraints: out of memory");
        goto out;
    }
    if (rx_live(d, live)) {
        st = base_err(err, KEEL_ENOMEM, "string constraints: out of memory");
        goto out;
    }
    oputf(b, "%s ::= \"\\\"\" %s-s%u\n", name, name, d->start);
    for (uint32_t q = 1; q < d->n_states && !b->st; q++) {
        if (!live[q]) continue;
        size_t k = 0;
        for (uint32_t i = 0; i < d->n_iv; i++) {
            uint32_t t = d->next[(size_t)q * d->n_cls + d->iv_cls[i]];
            uint32_t l = d->iv_lo[i], h = (i + 1 < d->n_iv ? d->iv_lo[i + 1] : RX_CP_END) - 1;
            if (!t || !live[t] || (l >= 0xD800 && h <= 0xDFFF)) continue;
            ed[k++] = (edge){t, l, h};
        }
        qsort(ed, k, sizeof *ed, cmp_edge);
        oputf(b, "%s-s%u ::=", name, q);
        bool first = true;
        for (size_t i = 0; i < k;) {
            size_t j = i, m = 0;
            for (; j < k && ed[j].to == ed[i].to; j++) {
                /* surrogates never appear: cut them out of a range */
                if (m && hi[m - 1] + 1 == ed[j].lo && ed[j].lo != 0xE000) {
                    hi[m - 1] = ed[j].hi; /* adjacent: one range */
                } else {
                    lo[m] = ed[j].lo, hi[m] = ed[j].hi;
                    m++;
                }
                if (lo[m - 1] < 0xD800 && hi[m - 1] > 0xDFFF) { /* cut the surrogates out */
                    lo[m] = 0xE000, hi[m] = hi[m - 1];
                    hi[m - 1] = 0xD7FF;
                    m++;
                }
            }
            one.n = 0;
            put_choice(&one, lo, hi, m);
            bool added = false;
            int64_t id = one.st ? -1 : choice_id(&ch, one.d, one.n, &added);
            if (id < 0) {
                b->st = one.st == KEEL_ERANGE ? KEEL_ERANGE : KEEL_ENOMEM;
                break;
            }
            if (added) {
                oputf(&defs, "%s-k%lld ::= ", name, (long long)id);
                oput(&defs, one.d, one.n);
                oputs(&defs, "\n");
                if (defs.st) b->st = defs.st;
            }
            oputs(b, first ? " " : " | ");
            oputf(b, "%s-k%lld %s-s%u", name, (long long)id, name, ed[i].to);
            first = false;
            i = j;
        }
        if (d->acc[q]) oputs(b, first ? " \"\\\"\"" : " | \"\\\"\"");
        oputs(b, "\n");
    }
    if (!b->st && defs.n) oput(b, defs.d, defs.n);
    if (b->st == KEEL_ERANGE)
        st =
            base_err(err, KEEL_ERANGE, "string constraints: grammar above %u bytes", JSTR_MAX_GBNF);
    else if (b->st)
        st = base_err(err, b->st, "string constraints: out of memory");
out:
    base_free(live, d->n_states);
    base_free(ed, (size_t)d->n_iv * sizeof *ed);
    base_free(lo, ((size_t)d->n_iv + 1) * sizeof *lo);
    base_free(hi, ((size_t)d->n_iv + 1) * sizeof *hi);
    base_free(one.d, one.cap);
    base_free(defs.d, defs.cap);
    base_free(ch.text.d, ch.text.cap);
    base_free(ch.off, ch.cap_off * sizeof *ch.off);
    base_free(ch.hash, ch.cap_hash * sizeof *ch.hash);
    return st;
}

keel_status jstr_gbnf(const jstr_spec *s, const char *name, char **out, size_t *n_out, bool *empty,
                      char *err)
{
    *out = NULL;
    *n_out = 0;
    *empty = false;
    keel_status st = check_spec(s, err);
    if (st) return st;
    if (s->max_len >= 0 && s->max_len < s->min_len) {
        *empty = true;
        return KEEL_OK;
    }
    obuf b = {0};
    rx_dfa *d = NULL;
    st = content_dfa(s, &d, err);
    if (st) return st;
    if (!d) {
        /* the content is free: any JSON spelling, lengths as counts of
         * code points, so a character outside the BMP written as an
         * escaped surrogate pair is one (a lone surrogate escape is no
         * character and is not accepted) */
        oputf(&b, "%s ::= \"\\\"\" %s-c{%lld,", name, name, (long long)s->min_len);
        if (s->max_len >= 0) oputf(&b, "%lld", (long long)s->max_len);
        oputf(&b,
              "} \"\\\"\"\n%s-c ::= [^\"\\\\\\x00-\\x1f] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" "
              "( [0-9a-ce-fA-CE-F] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2} | [dD] [89abAB] [0-9a-fA-F]{2} "
              "\"\\\\u\" [dD] [c-fC-F] [0-9a-fA-F]{2} ) )\n",
              name);
        if (b.st) st = base_err(err, b.st, "string constraints: out of memory");
        goto out;
    }
    /* the lengths, unless the content already implies them */
    int64_t dmn, dmx, mn = s->min_len, mx = s->max_len;
    st = rx_len_range(d, &dmn, &dmx);
    if (st) {
        st = base_err(err, st, "string constraints: out of memory");
        goto out;
    }
    if (dmn >= mn) mn = 0;
    if (mx >= 0 && dmx >= 0 && dmx <= mx) mx = -1;
    if (mn > 0 || mx >= 0) {
        rx_dfa *l = NULL;
        st = rx_length(mn, mx, &l, err);
        if (!st) st = combine(&d, l, RX_AND, err);
        if (st) goto out;
    }
    if (d->start == 0) {
        *empty = true;
        goto out;
    }
    st = emit_dfa(d, name, &b, err);
out:
    rx_free(d);
    if (st || *empty) {
        base_free(b.d, b.cap);
        return st;
    }
    /* hand over an exact-size block (callers free n_out + 1 bytes) */
    char *r = base_alloc(b.n + 1);
    if (!r) {
        base_free(b.d, b.cap);
        return base_err(err, KEEL_ENOMEM, "string constraints: out of memory");
    }
    memcpy(r, b.d, b.n + 1);
    base_free(b.d, b.cap);
    *out = r;
    *n_out = b.n;
    return KEEL_OK;
}
