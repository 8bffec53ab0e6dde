/*
 * gbnf.c — the GBNF compiler (grammar.h): llama.cpp's grammar syntax into
 * the byte-level form.
 *
 *   rule      name ::= alternatives      (a newline ends a rule, except
 *                                         inside parentheses and after |)
 *   elements  "literal"  [class]  [^class]  .  name  ( group )
 *   repeat    x*  x+  x?  x{m}  x{m,}  x{m,n}
 *   escapes   \n \r \t \\ \" \[ \] \xHH \uHHHH \UHHHHHHHH (code points)
 *   comments  # to the end of the line
 *
 * Owns the parse tables while compiling (rules as growable element lists,
 * the byte-set table with a hash for dedup) and the result (gram). Code
 * points are matched as their UTF-8 bytes; a class becomes UTF-8 byte
 * range sequences (surrogates U+D800..DFFF are never matched: UTF-8 cannot
 * hold them). Errors carry "line L col C" of the offending byte.
 * No recursion proportional to the input: groups nest through an explicit
 * depth counter capped at GRAM_MAX_NEST (C recursion of that depth only).
 */
#include "grammar.h"

#include <stdio.h>
#include <string.h>

typedef struct gvec {
    gram_el *d;
    uint32_t n, cap;
} gvec;

typedef struct grule {
    gvec el;
    char *name; /* base_strdup'd; synthetic rules: NULL */
    bool defined;
    const char *ref_at; /* first reference (undefined-rule errors; line and column found then) */
} grule;

typedef struct gp {
    const char *src, *end, *p;
    grule *rules;
    uint32_t n_rules, cap_rules;
    gram_set *sets;
    uint32_t n_sets, cap_sets;
    uint32_t *set_hash; /* open addressing: set index + 1 */
    uint32_t set_hash_cap;
    uint32_t *name_hash; /* open addressing over named rules: rule id + 1 */
    uint32_t name_hash_cap;
    uint64_t n_total; /* elements in all rules */
    int depth;
    char *err;
} gp;

/* ---- errors ------------------------------------------------------------------- */

static void where(const gp *s, const char *at, uint32_t *line, uint32_t *col)
{
    uint32_t l = 1, c = 1;
    for (const char *q = s->src; q < at && q < s->end; q++) {
        if (*q == '\n') {
            l++;
            c = 1;
        } else {
            c++;
        }
    }
    *line = l;
    *col = c;
}

static keel_status perr(gp *s, keel_status st, const char *at, const char *what)
{
    uint32_t l, c;
    where(s, at, &l, &c);
    return base_err(s->err, st, "grammar line %u col %u: %s", l, c, what);
}

/* ---- tables ------------------------------------------------------------------- */

static keel_status vpush(gp *s, gvec *v, gram_el e)
{
    if (s->n_total >= GRAM_MAX_ELEMENTS)
        return base_err(s->err, KEEL_ERANGE, "grammar: more than %u elements after expanding repetitions",
                        GRAM_MAX_ELEMENTS);
    if (v->n == v->cap) {
        uint32_t nc = v->cap ? v->cap * 2 : 16;
        gram_el *d = base_realloc(v->d, (size_t)v->cap * sizeof *d, (size_t)nc * sizeof *d);
        if (!d) return base_err(s->err, KEEL_ENOMEM, "grammar: out of memory");
        v->d = d;
        v->cap = nc;
    }
    v->d[v->n++] = e;
    s->n_total++;
    return KEEL_OK;
}

static keel_status new_rule(gp *s, const char *name, size_t nlen, uint32_t *id)
{
    if (s->n_rules >= GRAM_MAX_RULES)
        return base_err(s->err, KEEL_ERANGE, "grammar: more than %u rules", GRAM_MAX_RULES);
    if (s->n_rules == s->cap_rules) {
        uint32_t nc = s->cap_rules ? s->cap_rules * 2 : 32;
        grule *r = base_realloc(s->rules, (size_t)s->cap_rules * sizeof *r, (size_t)nc * sizeof *r);
        if (!r) return base_err(s->err, KEEL_ENOMEM, "grammar: out of memory");
        s->rules = r;
        s->cap_rules = nc;
    }
    grule *r = &s->rules[s->n_rules];
    memset(r, 0, sizeof *r);
    if (name) {
        r->name = base_alloc(nlen + 1);
        if (!r->name) return base_err(s->err, KEEL_ENOMEM, "grammar: out of memory");
        memcpy(r->name, name, nlen);
        r->name[nlen] = 0;
    } else {
        r->defined = true;
    }
    *id = s->n_rules++;
    return KEEL_OK;
}

static uint32_t name_hash(const char *name, size_t nlen)
{
    return (uint32_t)base_hash64(name, nlen, 0);
}

/* The rule named name (created, undefined, if new). Generated grammars
 * (JSON Schema automata) have thousands of rules: the names are hashed,
 * so a lookup does not walk them all. */
static keel_status rule_by_name(gp *s, const char *name, size_t nlen, uint32_t *id)
{
    if (2 * ((size_t)s->n_rules + 1) > s->name_hash_cap) {
        uint32_t nc = s->name_hash_cap ? s->name_hash_cap * 2 : 256;
        uint32_t *h = base_calloc(nc, sizeof *h);
        if (!h) return base_err(s->err, KEEL_ENOMEM, "grammar: out of memory");
        for (uint32_t i = 0; i < s->n_rules; i++) {
            const char *n = s->rules[i].name;
            if (!n) continue;
            uint32_t k = name_hash(n, strlen(n)) & (nc - 1);
            while (h[k]) k = (k + 1) & (nc - 1);
            h[k] = i + 1;
        }
        base_free(s->name_hash, (size_t)s->name_hash_cap * sizeof *h);
        s->name_hash = h;
        s->name_hash_cap = nc;
    }
    uint32_t k = name_hash(name, nlen) & (s->name_hash_cap - 1);
    for (; s->name_hash[k]; k = (k + 1) & (s->name_hash_cap - 1)) {
        const char *n = s->rules[s->name_hash[k] - 1].name;
        if (strlen(n) == nlen && memcmp(n, name, nlen) == 0) {
            *id = s->name_hash[k] - 1;
            return KEEL_OK;
        }
    }
    keel_status st = new_rule(s, name, nlen, id);
    if (st) return st;
    s->name_hash[k] = *id + 1;
    return KEEL_OK;
}

static uint32_t set_hash(const gram_set *x)
{
    uint64_t h = x->w[0] * 0x9e3779b97f4a7c15ull ^ x->w[1] * 0xc2b2ae3d27d4eb4full ^
                 x->w[2] * 0x165667b19e3779f9ull ^ x->w[3] * 0x27d4eb2f165667c5ull;
    return (uint32_t)(h ^ (h >> 29));
}

/* Index of set x in the table (added if new). */
static keel_status intern_set(gp *s, const gram_set *x, uint32_t *idx)
{
    if (2 * (s->n_sets + 1) > s->set_hash_cap) {
        uint32_t nc = s->set_hash_cap ? s->set_hash_cap * 2 : 256;
        uint32_t *h = base_calloc(nc, sizeof *h);
        if (!h) return base_err(s->err, KEEL_ENOMEM, "grammar: out of memory");
        for (uint32_t i = 0; i < s->n_sets; i++) {
            uint32_t k = set_hash(&s->sets[i]) & (nc - 1);
            while (h[k]) k = (k + 1) & (nc - 1);
            h[k] = i + 1;
        }
        base_free(s->set_hash, (size_t)s->set_hash_cap * sizeof *h);
        s->set_hash = h;
        s->set_hash_cap = nc;
    }
    uint32_t k = set_hash(x) & (s->set_hash_cap - 1);
    while (s->set_hash[k]) {
        uint32_t i = s->set_hash[k] - 1;
        if (memcmp(&s->sets[i], x, sizeof *x) == 0) {
            *idx = i;
            return KEEL_OK;
        }
        k = (k + 1) & (s->set_hash_cap - 1);
    }
    if (s->n_sets == s->cap_sets) {
        uint32_t nc = s->cap_sets ? s->cap_sets * 2 : 64;
        gram_set *t = base_realloc(s->sets, (size_t)s->cap_sets * sizeof *t, (size_t)nc * sizeof *t);
        if (!t) return base_err(s->err, KEEL_ENOMEM, "grammar: out of memory");
        s->sets = t;
        s->cap_sets = nc;
    }
    s->sets[s->n_sets] = *x;
    s->set_hash[k] = s->n_sets + 1;
    *idx = s->n_sets++;
    return KEEL_OK;
}

static keel_status push_range(gp *s, gvec *v, uint8_t lo, uint8_t hi)
{
    gram_set x;
    memset(&x, 0, sizeof x);
    for (unsigned b = lo; b <= hi; b++) x.w[b >> 6] |= 1ull << (b & 63);
    uint32_t idx;
    keel_status st = intern_set(s, &x, &idx);
    return st ? st : vpush(s, v, GRAM_MAKE(GRAM_BYTES, idx));
}

/* ---- lexing ------------------------------------------------------------------- */

static bool is_word(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

/* Skips blanks and comments; newlines only when newline_ok. */
static void skip_space(gp *s, bool newline_ok)
{
    while (s->p < s->end) {
        char c = *s->p;
        if (c == ' ' || c == '\t') {
            s->p++;
        } else if (c == '#') {
            while (s->p < s->end && *s->p != '\n' && *s->p != '\r') s->p++;
        } else if (newline_ok && (c == '\n' || c == '\r')) {
            s->p++;
        } else {
            break;
        }
    }
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* One character of a literal or class: an escape or a UTF-8 code point. */
static keel_status parse_char(gp *s, uint32_t *cp)
{
    const char *at = s->p;
    if (s->p >= s->end) return perr(s, KEEL_EFORMAT, at, "unexpected end of grammar");
    uint8_t c = (uint8_t)*s->p;
    if (c == '\\') {
        if (s->p + 1 >= s->end) return perr(s, KEEL_EFORMAT, at, "unexpected end of grammar after \\");
        char e = s->p[1];
        s->p += 2;
        int nd = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
        if (nd) {
            uint32_t v = 0;
            for (int i = 0; i < nd; i++) {
                int h = s->p < s->end ? hexval(*s->p) : -1;
                if (h < 0) return perr(s, KEEL_EFORMAT, at, "expected hex digits after \\x, \\u or \\U");
                v = v * 16 + (uint32_t)h;
                s->p++;
            }
            if (v > 0x10ffff) return perr(s, KEEL_EFORMAT, at, "code point above U+10FFFF");
            if (v >= 0xd800 && v <= 0xdfff)
                return perr(s, KEEL_EFORMAT, at, "surrogate code point (UTF-8 cannot encode it)");
            *cp = v;
            return KEEL_OK;
        }
        switch (e) {
        case 'n': *cp = '\n'; return KEEL_OK;
        case 'r': *cp = '\r'; return KEEL_OK;
        case 't': *cp = '\t'; return KEEL_OK;
        case '\\': case '"': case '[': case ']': *cp = (uint32_t)(uint8_t)e; return KEEL_OK;
        default: return perr(s, KEEL_EFORMAT, at, "unknown escape (\\n \\r \\t \\\\ \\\" \\[ \\] \\x \\u \\U)");
        }
    }
    size_t n = base_utf8_len((const uint8_t *)s->p, (size_t)(s->end - s->p));
    if (n == 0) return perr(s, KEEL_EFORMAT, at, "invalid UTF-8 in the grammar");
    const uint8_t *u = (const uint8_t *)s->p;
    uint32_t v = n == 1 ? u[0]
                 : n == 2 ? ((u[0] & 0x1fu) << 6) | (u[1] & 0x3fu)
                 : n == 3 ? ((u[0] & 0x0fu) << 12) | ((u[1] & 0x3fu) << 6) | (u[2] & 0x3fu)
                          : ((u[0] & 0x07u) << 18) | ((u[1] & 0x3fu) << 12) | ((u[2] & 0x3fu) << 6) | (u[3] & 0x3fu);
    s->p += n;
    *cp = v;
    return KEEL_OK;
}

static size_t utf8_enc(uint32_t cp, uint8_t *o)
{
    if (cp < 0x80) {
        o[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (uint8_t)(0xc0 | (cp >> 6));
        o[1] = (uint8_t)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (uint8_t)(0xe0 | (cp >> 12));
        o[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (uint8_t)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (uint8_t)(0xf0 | (cp >> 18));
    o[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (uint8_t)(0x80 | (cp & 0x3f));
    return 4;
}

/* ---- character classes -------------------------------------------------------- */

typedef struct crange {
    uint32_t lo, hi;
} crange;

typedef struct cls {
    crange *r;
    uint32_t n, cap;
} cls;

static keel_status cls_add(gp *s, cls *c, uint32_t lo, uint32_t hi)
{
    if (c->n == c->cap) {
        uint32_t nc = c->cap ? c->cap * 2 : 16;
        if (nc > (1u << 24)) return base_err(s->err, KEEL_ERANGE, "grammar: character class too large");
        crange *r = base_realloc(c->r, (size_t)c->cap * sizeof *r, (size_t)nc * sizeof *r);
        if (!r) return base_err(s->err, KEEL_ENOMEM, "grammar: out of memory");
        c->r = r;
        c->cap = nc;
    }
    c->r[c->n].lo = lo;
    c->r[c->n].hi = hi;
    c->n++;
    return KEEL_OK;
}

/* Sorts by lo (bottom-up merge sort through tmp) and merges overlaps. */
static keel_status cls_norm(gp *s, cls *c)
{
    if (c->n < 2) return KEEL_OK;
    crange *tmp = base_alloc((size_t)c->n * sizeof *tmp);
    if (!tmp) return base_err(s->err, KEEL_ENOMEM, "grammar: out of memory");
    crange *a = c->r, *b = tmp;
    for (uint32_t w = 1; w < c->n; w *= 2) {
        for (uint32_t i = 0; i < c->n; i += 2 * w) {
            uint32_t m = BASE_MIN(i + w, c->n), e = BASE_MIN(i + 2 * w, c->n), x = i, y = m, k = i;
            while (x < m && y < e) b[k++] = a[x].lo <= a[y].lo ? a[x++] : a[y++];
            while (x < m) b[k++] = a[x++];
            while (y < e) b[k++] = a[y++];
        }
        crange *t = a;
        a = b;
        b = t;
    }
    if (a != c->r) memcpy(c->r, a, (size_t)c->n * sizeof *a);
    base_free(tmp, (size_t)c->n * sizeof *tmp);
    uint32_t o = 0;
    for (uint32_t i = 1; i < c->n; i++) {
        if (c->r[i].lo <= c->r[o].hi + 1) {
            if (c->r[i].hi > c->r[o].hi) c->r[o].hi = c->r[i].hi;
        } else {
            c->r[++o] = c->r[i];
        }
    }
    c->n = o + 1;
    return KEEL_OK;
}

/* Emits the UTF-8 byte sequences of code points lo..hi (same encoded
 * length, no surrogates) as alternatives of rule vector v (each preceded by
 * GRAM_ALT unless *first). The utf8-ranges split: a range is cut where its
 * low and high differ above a continuation boundary that is not aligned,
 * until each byte position is one range. Iterative with a small stack. */
static keel_status emit_utf8(gp *s, gvec *v, uint32_t lo0, uint32_t hi0, bool *first)
{
    crange st[64];
    int sp = 0;
    st[sp].lo = lo0;
    st[sp++].hi = hi0;
    while (sp > 0) {
        uint32_t lo = st[--sp].lo, hi = st[sp].hi;
        uint8_t a[4], b[4];
        size_t n = utf8_enc(lo, a);
        if (utf8_enc(hi, b) != n) return base_err(s->err, KEEL_EINTERNAL, "grammar: utf8 split");
        bool split = false;
        for (size_t i = 1; i < n && !split; i++) {
            uint32_t m = (1u << (6 * i)) - 1;
            if ((lo & ~m) != (hi & ~m)) {
                if ((lo & m) != 0) {
                    st[sp].lo = (lo | m) + 1;
                    st[sp++].hi = hi;
                    st[sp].lo = lo;
                    st[sp++].hi = lo | m;
                    split = true;
                } else if ((hi & m) != m) {
                    st[sp].lo = hi & ~m;
                    st[sp++].hi = hi;
                    st[sp].lo = lo;
                    st[sp++].hi = (hi & ~m) - 1;
                    split = true;
                }
            }
        }
        if (split) continue;
        if (!*first) {
            keel_status e = vpush(s, v, GRAM_MAKE(GRAM_ALT, 0));
            if (e) return e;
        }
        *first = false;
        for (size_t i = 0; i < n; i++) {
            keel_status e = push_range(s, v, a[i], b[i]);
            if (e) return e;
        }
    }
    return KEEL_OK;
}

/* A normalized class as elements appended to out: one byte set when all
 * of it is ASCII, else a reference to a new rule of its UTF-8 sequences. */
static keel_status emit_class(gp *s, const cls *c, gvec *out)
{
    gram_set ascii;
    memset(&ascii, 0, sizeof ascii);
    bool wide = false;
    for (uint32_t i = 0; i < c->n; i++) {
        for (uint32_t x = c->r[i].lo; x <= c->r[i].hi && x < 0x80; x++) ascii.w[x >> 6] |= 1ull << (x & 63);
        wide |= c->r[i].hi >= 0x80;
    }
    uint32_t idx;
    keel_status st = intern_set(s, &ascii, &idx);
    if (st) return st;
    if (!wide) return vpush(s, out, GRAM_MAKE(GRAM_BYTES, idx));
    uint32_t id;
    if ((st = new_rule(s, NULL, 0, &id))) return st;
    gvec v = {NULL, 0, 0};
    bool first = true;
    if (ascii.w[0] | ascii.w[1]) {
        st = vpush(s, &v, GRAM_MAKE(GRAM_BYTES, idx));
        first = false;
    }
    static const uint32_t bounds[][2] = {{0x80, 0x7ff}, {0x800, 0xd7ff}, {0xe000, 0xffff}, {0x10000, 0x10ffff}};
    for (uint32_t i = 0; i < c->n && !st; i++) {
        for (size_t k = 0; k < 4 && !st; k++) {
            uint32_t lo = BASE_MAX(c->r[i].lo, bounds[k][0]), hi = BASE_MIN(c->r[i].hi, bounds[k][1]);
            if (lo <= hi) st = emit_utf8(s, &v, lo, hi, &first);
        }
    }
    if (!st) st = vpush(s, &v, GRAM_MAKE(GRAM_END, 0));
    if (st) {
        base_free(v.d, (size_t)v.cap * sizeof *v.d);
        return st;
    }
    s->rules[id].el = v;
    return vpush(s, out, GRAM_MAKE(GRAM_REF, id));
}

/* [ ... ] or [^ ... ]; s->p after '['. */
static keel_status parse_class(gp *s, gvec *out)
{
    cls c = {NULL, 0, 0};
    bool neg = false;
    keel_status st = KEEL_OK;
    const char *open = s->p - 1;
    if (s->p < s->end && *s->p == '^') {
        neg = true;
        s->p++;
    }
    for (;;) {
        if (s->p >= s->end) {
            st = perr(s, KEEL_EFORMAT, open, "unterminated character class");
            break;
        }
        if (*s->p == ']') {
            s->p++;
            break;
        }
        uint32_t lo, hi;
        if ((st = parse_char(s, &lo))) break;
        hi = lo;
        if (s->p + 1 < s->end && *s->p == '-' && s->p[1] != ']') {
            const char *at = s->p;
            s->p++;
            if ((st = parse_char(s, &hi))) break;
            if (hi < lo) {
                st = perr(s, KEEL_EFORMAT, at, "character range out of order");
                break;
            }
        }
        if ((st = cls_add(s, &c, lo, hi))) break;
    }
    if (!st) st = cls_norm(s, &c);
    if (!st && neg) { /* complement over the code points */
        cls k = {NULL, 0, 0};
        uint32_t next = 0;
        for (uint32_t i = 0; i < c.n && !st; i++) {
            if (c.r[i].lo > next) st = cls_add(s, &k, next, c.r[i].lo - 1);
            next = c.r[i].hi + 1;
        }
        if (!st && next <= 0x10ffff) st = cls_add(s, &k, next, 0x10ffff);
        base_free(c.r, (size_t)c.cap * sizeof *c.r);
        c = k;
    }
    if (!st) st = emit_class(s, &c, out);
    base_free(c.r, (size_t)c.cap * sizeof *c.r);
    return st;
}

/* ---- rules -------------------------------------------------------------------- */

static keel_status parse_alternates(gp *s, gvec *out, bool nested);

/* Elements seq[from..n) as a new rule's body (copied), for repetition. */
static keel_status repeat_rule(gp *s, const gram_el *x, uint32_t nx, bool with_self, uint32_t tail, uint32_t *id)
{
    /* R ::= x (R | tail)? | "" : with_self gives x R, else x tail (tail rule id + 1, 0: none) */
    keel_status st = new_rule(s, NULL, 0, id);
    if (st) return st;
    gvec v = {NULL, 0, 0};
    for (uint32_t i = 0; i < nx && !st; i++) st = vpush(s, &v, x[i]);
    if (!st && with_self) st = vpush(s, &v, GRAM_MAKE(GRAM_REF, *id));
    if (!st && tail) st = vpush(s, &v, GRAM_MAKE(GRAM_REF, tail - 1));
    if (!st) st = vpush(s, &v, GRAM_MAKE(GRAM_ALT, 0));
    if (!st) st = vpush(s, &v, GRAM_MAKE(GRAM_END, 0));
    if (st) {
        base_free(v.d, (size_t)v.cap * sizeof *v.d);
        return st;
    }
    s->rules[*id].el = v;
    return KEEL_OK;
}

/* Applies {min,max} (max UINT32_MAX: unbounded) to out[from..). */
static keel_status repeat(gp *s, gvec *out, uint32_t from, uint32_t min, uint32_t max)
{
    uint32_t nx = out->n - from;
    gram_el *x = base_alloc((size_t)(nx ? nx : 1) * sizeof *x);
    if (!x) return base_err(s->err, KEEL_ENOMEM, "grammar: out of memory");
    if (nx) memcpy(x, out->d + from, (size_t)nx * sizeof *x); /* out->d may be NULL when empty */
    s->n_total -= nx;
    out->n = from;
    keel_status st = KEEL_OK;
    if ((uint64_t)nx * (min ? min : 1) > GRAM_MAX_ELEMENTS)
        st = base_err(s->err, KEEL_ERANGE, "grammar: a repetition expands past %u elements", GRAM_MAX_ELEMENTS);
    for (uint32_t k = 0; k < min && !st; k++)
        for (uint32_t i = 0; i < nx && !st; i++) st = vpush(s, out, x[i]);
    uint32_t id = 0;
    if (!st && max == UINT32_MAX) {
        st = repeat_rule(s, x, nx, true, 0, &id);
        if (!st) st = vpush(s, out, GRAM_MAKE(GRAM_REF, id));
    } else if (!st && max > min) {
        uint32_t tail = 0; /* R1 ::= x | "", Rk ::= x R(k-1) | "" */
        for (uint32_t k = 0; k < max - min && !st; k++) {
            st = repeat_rule(s, x, nx, false, tail, &id);
            tail = id + 1;
        }
        if (!st) st = vpush(s, out, GRAM_MAKE(GRAM_REF, id));
    }
    base_free(x, (size_t)(nx ? nx : 1) * sizeof *x);
    return st;
}

static keel_status parse_uint(gp *s, uint32_t *v)
{
    const char *at = s->p;
    uint64_t x = 0;
    if (s->p >= s->end || *s->p < '0' || *s->p > '9') return perr(s, KEEL_EFORMAT, at, "expected a number");
    while (s->p < s->end && *s->p >= '0' && *s->p <= '9') {
        x = x * 10 + (uint64_t)(*s->p - '0');
        if (x > GRAM_MAX_REPEAT) return perr(s, KEEL_ERANGE, at, "repetition count above 100000");
        s->p++;
    }
    *v = (uint32_t)x;
    return KEEL_OK;
}

static keel_status parse_sequence(gp *s, gvec *out, bool nested)
{
    uint32_t last = UINT32_MAX; /* where the last item starts in out */
    keel_status st = KEEL_OK;
    while (s->p < s->end && !st) {
        char c = *s->p;
        const char *at = s->p;
        if (c == '"') {
            s->p++;
            last = out->n;
            while (!st) {
                if (s->p >= s->end || *s->p == '\n' || *s->p == '\r') {
                    st = perr(s, KEEL_EFORMAT, at, "unterminated string literal");
                    break;
                }
                if (*s->p == '"') {
                    s->p++;
                    break;
                }
                uint32_t cp;
                uint8_t u[4];
                if ((st = parse_char(s, &cp))) break;
                size_t n = utf8_enc(cp, u);
                for (size_t i = 0; i < n && !st; i++) st = push_range(s, out, u[i], u[i]);
            }
        } else if (c == '[') {
            s->p++;
            last = out->n;
            st = parse_class(s, out);
        } else if (c == '.') {
            s->p++;
            last = out->n;
            cls any = {NULL, 0, 0};
            st = cls_add(s, &any, 0, 0x10ffff);
            if (!st) st = emit_class(s, &any, out);
            base_free(any.r, (size_t)any.cap * sizeof *any.r);
        } else if (is_word(c)) {
            const char *n0 = s->p;
            while (s->p < s->end && is_word(*s->p)) s->p++;
            uint32_t id;
            if ((st = rule_by_name(s, n0, (size_t)(s->p - n0), &id))) break;
            if (!s->rules[id].ref_at) s->rules[id].ref_at = n0;
            last = out->n;
            st = vpush(s, out, GRAM_MAKE(GRAM_REF, id));
        } else if (c == '(') {
            if (s->depth >= GRAM_MAX_NEST) return perr(s, KEEL_ERANGE, at, "groups nested more than 256 deep");
            s->p++;
            uint32_t id;
            if ((st = new_rule(s, NULL, 0, &id))) break;
            gvec v = {NULL, 0, 0};
            skip_space(s, true);
            s->depth++;
            st = parse_alternates(s, &v, true);
            s->depth--;
            s->rules[id].el = v;
            if (st) break;
            if (s->p >= s->end || *s->p != ')') {
                st = perr(s, KEEL_EFORMAT, at, "expected ')' to close this group");
                break;
            }
            s->p++;
            last = out->n;
            st = vpush(s, out, GRAM_MAKE(GRAM_REF, id));
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            if (last == UINT32_MAX)
                return perr(s, KEEL_EFORMAT, at, "a repetition operator needs an item before it");
            s->p++;
            uint32_t min = c == '+' ? 1 : 0, max = c == '?' ? 1 : UINT32_MAX;
            if (c == '{') {
                skip_space(s, nested);
                if ((st = parse_uint(s, &min))) break;
                skip_space(s, nested);
                max = min;
                if (s->p < s->end && *s->p == ',') {
                    s->p++;
                    skip_space(s, nested);
                    max = UINT32_MAX;
                    if (s->p < s->end && *s->p >= '0' && *s->p <= '9') {
                        if ((st = parse_uint(s, &max))) break;
                        skip_space(s, nested);
                    }
                }
                if (s->p >= s->end || *s->p != '}') {
                    st = perr(s, KEEL_EFORMAT, at, "expected '}' after a repetition count");
                    break;
                }
                s->p++;
                if (max < min) {
                    st = perr(s, KEEL_EFORMAT, at, "repetition {m,n} with n < m");
                    break;
                }
            }
            st = repeat(s, out, last, min, max);
            last = UINT32_MAX;
        } else if (c == '<' || c == '!') {
            return perr(s, KEEL_EUNSUPPORTED, at, "token references (<[id]>, <token>, !) are not supported");
        } else {
            break;
        }
        if (!st) skip_space(s, nested);
    }
    return st;
}

static keel_status parse_alternates(gp *s, gvec *out, bool nested)
{
    keel_status st = parse_sequence(s, out, nested);
    while (!st && s->p < s->end && *s->p == '|') {
        s->p++;
        skip_space(s, true);
        if (!(st = vpush(s, out, GRAM_MAKE(GRAM_ALT, 0)))) st = parse_sequence(s, out, nested);
    }
    if (!st) st = vpush(s, out, GRAM_MAKE(GRAM_END, 0));
    return st;
}

static keel_status parse_rules(gp *s)
{
    skip_space(s, true);
    while (s->p < s->end) {
        const char *at = s->p;
        if (!is_word(*s->p)) return perr(s, KEEL_EFORMAT, at, "expected a rule name");
        while (s->p < s->end && is_word(*s->p)) s->p++;
        uint32_t id;
        keel_status st = rule_by_name(s, at, (size_t)(s->p - at), &id);
        if (st) return st;
        if (s->rules[id].defined) {
            char m[160];
            snprintf(m, sizeof m, "rule '%.64s' is defined twice", s->rules[id].name);
            return perr(s, KEEL_EFORMAT, at, m);
        }
        s->rules[id].defined = true;
        skip_space(s, false);
        if (s->end - s->p < 3 || memcmp(s->p, "::=", 3) != 0)
            return perr(s, KEEL_EFORMAT, s->p, "expected '::=' after the rule name");
        s->p += 3;
        skip_space(s, true);
        gvec v = {NULL, 0, 0};
        st = parse_alternates(s, &v, false);
        s->rules[id].el = v;
        if (st) return st;
        if (s->p < s->end && *s->p == '\r') s->p++;
        if (s->p < s->end && *s->p != '\n') return perr(s, KEEL_EFORMAT, s->p, "expected the end of the line");
        skip_space(s, true);
    }
    return KEEL_OK;
}

/* ---- checks: undefined rules, root, left recursion -------------------------------- */

/* Whether the first i elements of an alternative can all match nothing
 * (nul: the rules that can). */
static bool alt_nullable_prefix(const bool *nul, const gram_el *e, uint32_t i)
{
    for (uint32_t k = 0; k < i; k++) {
        if (GRAM_KIND(e[k]) == GRAM_BYTES) return false;
        if (GRAM_KIND(e[k]) == GRAM_REF && !nul[GRAM_VAL(e[k])]) return false;
    }
    return true;
}

/* Left recursion: a rule that can reach itself without consuming input
 * through at least one reference that is not in tail position (that one
 * leaves a return address on the stack, so the expansion never ends).
 * Edges u -> v for each reference to v after a nullable prefix of u's
 * alternative; strongly connected components (iterative Tarjan); an edge
 * that is not a tail call inside one component is refused, and the cycle
 * through it named. Cycles of tail calls only revisit a stack, which the
 * closure skips (e.g. ("a"?)*). */
static keel_status check_left_recursion(gp *s)
{
    uint32_t n = s->n_rules;
    size_t n_edges = 0;
    bool *nul = base_calloc(n, sizeof *nul);
    uint32_t *eoff = base_calloc((size_t)n + 1, sizeof *eoff);
    uint32_t *eto = NULL, *idx = NULL, *low = NULL, *comp = NULL, *it = NULL, *stk = NULL, *call = NULL, *from = NULL;
    uint8_t *etail = NULL, *on = NULL;
    keel_status st = KEEL_OK;
    if (!nul || !eoff) goto oom;
    /* nullable: fixpoint over the rules */
    for (bool changed = true; changed;) {
        changed = false;
        for (uint32_t r = 0; r < n; r++) {
            if (nul[r]) continue;
            const gram_el *e = s->rules[r].el.d;
            uint32_t ne = s->rules[r].el.n, start = 0;
            for (uint32_t i = 0; i < ne; i++) {
                if (GRAM_KIND(e[i]) == GRAM_ALT || GRAM_KIND(e[i]) == GRAM_END) {
                    if (alt_nullable_prefix(nul, e + start, i - start)) {
                        nul[r] = changed = true;
                        break;
                    }
                    start = i + 1;
                }
            }
        }
    }
    /* the edges, in CSR form (two passes: count, fill) */
    for (int pass = 0; pass < 2; pass++) {
        size_t k = 0;
        for (uint32_t r = 0; r < n; r++) {
            const gram_el *e = s->rules[r].el.d;
            uint32_t ne = s->rules[r].el.n, start = 0;
            if (pass == 1) eoff[r] = (uint32_t)k;
            for (uint32_t i = 0; i < ne; i++) {
                if (GRAM_KIND(e[i]) <= GRAM_ALT) {
                    start = i + 1;
                    continue;
                }
                if (GRAM_KIND(e[i]) != GRAM_REF || !alt_nullable_prefix(nul, e + start, i - start))
                    continue;
                if (pass == 1) {
                    eto[k] = GRAM_VAL(e[i]);
                    etail[k] = i + 1 < ne && GRAM_KIND(e[i + 1]) <= GRAM_ALT;
                }
                k++;
            }
        }
        if (pass == 0) {
            n_edges = k;
            eto = base_alloc((n_edges ? n_edges : 1) * sizeof *eto);
            etail = base_alloc(n_edges ? n_edges : 1);
            if (!eto || !etail) goto oom;
        } else {
            eoff[n] = (uint32_t)k;
        }
    }
    idx = base_alloc((size_t)n * sizeof *idx);
    low = base_alloc((size_t)n * sizeof *low);
    comp = base_alloc((size_t)n * sizeof *comp);
    it = base_alloc((size_t)n * sizeof *it);
    stk = base_alloc((size_t)n * sizeof *stk);
    call = base_alloc((size_t)n * sizeof *call);
    from = base_alloc((size_t)n * sizeof *from);
    on = base_calloc(n, 1);
    if (!idx || !low || !comp || !it || !stk || !call || !from || !on) goto oom;
    for (uint32_t r = 0; r < n; r++) idx[r] = UINT32_MAX;
    uint32_t next = 0, sp = 0;
    for (uint32_t r0 = 0; r0 < n; r0++) {
        if (idx[r0] != UINT32_MAX) continue;
        uint32_t cp = 0;
        call[cp++] = r0;
        idx[r0] = low[r0] = next++;
        stk[sp++] = r0;
        on[r0] = 1;
        it[r0] = eoff[r0];
        while (cp > 0) {
            uint32_t u = call[cp - 1];
            if (it[u] < eoff[u + 1]) {
                uint32_t v = eto[it[u]++];
                if (idx[v] == UINT32_MAX) {
                    idx[v] = low[v] = next++;
                    stk[sp++] = v;
                    on[v] = 1;
                    it[v] = eoff[v];
                    call[cp++] = v;
                } else if (on[v] && idx[v] < low[u]) {
                    low[u] = idx[v];
                }
                continue;
            }
            cp--;
            if (cp > 0 && low[u] < low[call[cp - 1]]) low[call[cp - 1]] = low[u];
            if (low[u] == idx[u]) {
                uint32_t w;
                do {
                    w = stk[--sp];
                    on[w] = 0;
                    comp[w] = u;
                } while (w != u);
            }
        }
    }
    for (uint32_t u = 0; u < n && !st; u++) {
        for (uint32_t k = eoff[u]; k < eoff[u + 1] && !st; k++) {
            uint32_t v = eto[k];
            if (etail[k] || comp[u] != comp[v]) continue;
            /* the cycle u -> v -> ... -> u: a BFS from v inside the component */
            for (uint32_t r = 0; r < n; r++) from[r] = UINT32_MAX;
            uint32_t head = 0, tail = 0;
            call[tail++] = v;
            from[v] = v;
            while (head < tail && from[u] == UINT32_MAX) {
                uint32_t x = call[head++];
                for (uint32_t j = eoff[x]; j < eoff[x + 1]; j++) {
                    uint32_t y = eto[j];
                    if (comp[y] != comp[u] || from[y] != UINT32_MAX) continue;
                    from[y] = x;
                    call[tail++] = y;
                }
            }
            /* the path back from u, reversed: u, v, ..., u */
            uint32_t np = 0;
            if (u != v)
                for (uint32_t x = u; np < n; x = from[x]) {
                    stk[np++] = x;
                    if (x == v) break;
                }
            char path[200];
            size_t pl = (size_t)snprintf(path, sizeof path, "%.40s", s->rules[u].name ? s->rules[u].name : "(group)");
            for (uint32_t j = np; j-- > 0 && pl < sizeof path - 48;) {
                const char *nm = s->rules[stk[j]].name;
                if (nm) pl += (size_t)snprintf(path + pl, sizeof path - pl, " -> %.40s", nm);
            }
            if (u == v && pl < sizeof path - 48) snprintf(path + pl, sizeof path - pl, " -> %.40s", s->rules[u].name ? s->rules[u].name : "(group)");
            st = base_err(s->err, KEEL_EUNSUPPORTED, "grammar: left recursion (rewrite it as repetition): %s", path);
        }
    }
    goto out;
oom:
    st = base_err(s->err, KEEL_ENOMEM, "grammar: out of memory");
out:
    base_free(nul, (size_t)n * sizeof *nul);
    base_free(eoff, ((size_t)n + 1) * sizeof *eoff);
    base_free(eto, (n_edges ? n_edges : 1) * sizeof *eto);
    base_free(etail, n_edges ? n_edges : 1);
    base_free(idx, (size_t)n * sizeof *idx);
    base_free(low, (size_t)n * sizeof *low);
    base_free(comp, (size_t)n * sizeof *comp);
    base_free(it, (size_t)n * sizeof *it);
    base_free(stk, (size_t)n * sizeof *stk);
    base_free(call, (size_t)n * sizeof *call);
    base_free(from, (size_t)n * sizeof *from);
    base_free(on, n);
    return st;
}

/* ---- assembly ------------------------------------------------------------------- */

void gram_free(gram *g)
{
    if (!g) return;
    base_free(g->el, (size_t)g->n_el * sizeof *g->el);
    base_free(g->rule_start, (size_t)g->n_rules * sizeof *g->rule_start);
    base_free(g->alt_first, ((size_t)g->n_rules + 1) * sizeof *g->alt_first);
    base_free(g->alt_pos, (size_t)g->n_alts * sizeof *g->alt_pos);
    base_free(g->sets, (size_t)g->n_sets * sizeof *g->sets);
    base_free(g, sizeof *g);
}

static keel_status assemble(gp *s, gram **out)
{
    gram *g = base_calloc(1, sizeof *g);
    if (!g) return base_err(s->err, KEEL_ENOMEM, "grammar: out of memory");
    g->n_rules = s->n_rules;
    g->n_el = (uint32_t)s->n_total;
    g->n_sets = s->n_sets;
    for (uint32_t r = 0; r < s->n_rules; r++)
        for (uint32_t i = 0; i < s->rules[r].el.n; i++)
            g->n_alts += GRAM_KIND(s->rules[r].el.d[i]) <= GRAM_ALT;
    g->el = base_alloc((size_t)(g->n_el ? g->n_el : 1) * sizeof *g->el);
    g->rule_start = base_alloc((size_t)g->n_rules * sizeof *g->rule_start);
    g->alt_first = base_alloc(((size_t)g->n_rules + 1) * sizeof *g->alt_first);
    g->alt_pos = base_alloc((size_t)(g->n_alts ? g->n_alts : 1) * sizeof *g->alt_pos);
    g->sets = base_alloc((size_t)(g->n_sets ? g->n_sets : 1) * sizeof *g->sets);
    if (!g->el || !g->rule_start || !g->alt_first || !g->alt_pos || !g->sets) {
        if (!g->n_el) g->n_el = 1;
        if (!g->n_alts) g->n_alts = 1;
        if (!g->n_sets) g->n_sets = 1;
        gram_free(g);
        return base_err(s->err, KEEL_ENOMEM, "grammar: out of memory");
    }
    uint32_t k = 0, a = 0;
    for (uint32_t r = 0; r < s->n_rules; r++) {
        g->rule_start[r] = k;
        g->alt_first[r] = a;
        g->alt_pos[a++] = k;
        for (uint32_t i = 0; i < s->rules[r].el.n; i++) {
            gram_el e = s->rules[r].el.d[i];
            g->el[k++] = e;
            if (GRAM_KIND(e) == GRAM_ALT) g->alt_pos[a++] = k;
        }
    }
    g->alt_first[s->n_rules] = a;
    if (s->n_sets) memcpy(g->sets, s->sets, (size_t)s->n_sets * sizeof *s->sets);
    *out = g;
    return KEEL_OK;
}

keel_status gram_compile(const char *src, size_t len, gram **out, char *err)
{
    if (!out) return base_err(err, KEEL_EINVAL, "grammar: out is NULL");
    *out = NULL;
    if (!src && len) return base_err(err, KEEL_EINVAL, "grammar: source is NULL");
    if (len > GRAM_MAX_SOURCE) return base_err(err, KEEL_ERANGE, "grammar: source above 16 MiB");
    gp s;
    memset(&s, 0, sizeof s);
    s.src = s.p = src ? src : "";
    s.end = s.src + len;
    s.err = err;
    keel_status st = parse_rules(&s);
    uint32_t root = UINT32_MAX;
    for (uint32_t r = 0; r < s.n_rules && !st; r++) {
        if (!s.rules[r].defined) {
            uint32_t l = 0, c = 0;
            where(&s, s.rules[r].ref_at, &l, &c);
            st = base_err(err, KEEL_EFORMAT, "grammar line %u col %u: undefined rule '%.64s'", l, c, s.rules[r].name);
        } else if (s.rules[r].name && strcmp(s.rules[r].name, "root") == 0) {
            root = r;
        }
    }
    if (!st && root == UINT32_MAX) st = base_err(err, KEEL_EFORMAT, "grammar: no rule named 'root'");
    if (!st) st = check_left_recursion(&s);
    gram *g = NULL;
    if (!st) st = assemble(&s, &g);
    if (!st) {
        g->root = root;
        for (uint32_t r = 0; r < s.n_rules; r++) g->n_user_rules += s.rules[r].name != NULL;
    }
    for (uint32_t r = 0; r < s.n_rules; r++) {
        base_free(s.rules[r].el.d, (size_t)s.rules[r].el.cap * sizeof(gram_el));
        base_strfree(s.rules[r].name);
    }
    base_free(s.rules, (size_t)s.cap_rules * sizeof *s.rules);
    base_free(s.sets, (size_t)s.cap_sets * sizeof *s.sets);
    base_free(s.set_hash, (size_t)s.set_hash_cap * sizeof *s.set_hash);
    base_free(s.name_hash, (size_t)s.name_hash_cap * sizeof *s.name_hash);
    if (st) return st;
    *out = g;
    return KEEL_OK;
}
