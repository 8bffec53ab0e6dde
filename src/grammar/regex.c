/*
 * regex.c — ECMA-262 patterns to minimal DFAs over code points (regex.h).
 *
 * Pipeline: the pattern is parsed into a tree (rnode, children as linked
 * lists so that long concatenations do not deepen the recursion), the
 * tree into a Thompson automaton (one character-set edge or epsilon edges
 * per state; {n,m} copies its operand; ^ and $ are epsilon edges with a
 * condition), the automaton into a DFA by subset construction over the
 * elementary intervals of its character sets, and the DFA is finished by
 * rx_finish (regex_dfa.c). The subset construction follows ^ edges only in
 * the start state's closure (before any character) and $ edges only to
 * decide acceptance (after the last character); a DFA state's set carries
 * an acceptance mark, so two states with the same character states but
 * different acceptance stay apart. \b and \B edges depend on the
 * character before (known: the interval just read) and after (not yet):
 * crossing one records what the next character must be, in the item
 * (state * 3 + requirement) that the closure carries.
 */
#include "regex.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SUR_LO      0xD800u
#define SUR_END     0xE000u
#define SUBSET_WORK (1u << 24) /* automaton states visited by one subset construction */

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* ---- parser --------------------------------------------------------------- */

enum { N_SET, N_CAT, N_ALT, N_REP, N_BOL, N_EOL, N_WB, N_NWB }; /* ^ $ \b \B */

typedef struct rnode {
    uint8_t kind;
    int32_t first, next;   /* first child (CAT, ALT, REP); next sibling */
    int32_t min, max;      /* REP: max -1 unbounded */
    uint32_t cs_off, cs_n; /* SET: intervals (lo, hi) pairs in rp.cs */
} rnode;

typedef struct rp {
    const unsigned char *s;
    size_t n, i;
    char *err;
    const char *what; /* "pattern \"...\"" */
    keel_status st;
    rnode *nd;
    size_t n_nd, cap_nd;
    uint32_t *cs; /* pairs */
    size_t n_cs, cap_cs;
    uint32_t *tmp; /* pairs of the set being built */
    size_t n_tmp, cap_tmp;
    int depth;
} rp;

static int32_t perr(rp *p, keel_status st, const char *msg)
{
    if (!p->st) p->st = base_err(p->err, st, "%s: %s at offset %zu", p->what, msg, p->i);
    return -1;
}

static int32_t node(rp *p, uint8_t kind)
{
    if (p->n_nd >= RX_MAX_NFA) return perr(p, KEEL_ERANGE, "too many elements");
    if (!rx_grow(&p->nd, &p->cap_nd, p->n_nd + 1, sizeof *p->nd))
        return perr(p, KEEL_ENOMEM, "out of memory");
    rnode *r = &p->nd[p->n_nd];
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->first = r->next = -1;
    return (int32_t)p->n_nd++;
}

static bool tmp_add(rp *p, uint32_t lo, uint32_t hi)
{
    if (!rx_grow(&p->tmp, &p->cap_tmp, p->n_tmp * 2 + 2, sizeof *p->tmp)) {
        perr(p, KEEL_ENOMEM, "out of memory");
        return false;
    }
    p->tmp[p->n_tmp * 2] = lo;
    p->tmp[p->n_tmp * 2 + 1] = hi;
    p->n_tmp++;
    return true;
}

static int cmp_pair(const void *a, const void *b)
{
    const uint32_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* tmp (from pair `from` on) sorted, merged, optionally negated, less the
 * surrogates, as a SET node. */
static int32_t tmp_set(rp *p, size_t from, bool neg)
{
    /* room for the result first, so that tmp is never NULL below */
    if (!rx_grow(&p->tmp, &p->cap_tmp, p->n_tmp * 2 + 2, sizeof *p->tmp))
        return perr(p, KEEL_ENOMEM, "out of memory");
    size_t k = p->n_tmp - from;
    uint32_t *t = p->tmp + from * 2;
    if (k) qsort(t, k, 2 * sizeof *t, cmp_pair);
    size_t m = 0;
    for (size_t i = 0; i < k; i++) {
        if (m && t[i * 2] <= t[(m - 1) * 2 + 1] + 1) {
            if (t[i * 2 + 1] > t[(m - 1) * 2 + 1]) t[(m - 1) * 2 + 1] = t[i * 2 + 1];
        } else {
            t[m * 2] = t[i * 2];
            t[m * 2 + 1] = t[i * 2 + 1];
            m++;
        }
    }
    /* the result, built in cs: negation, then the surrogates cut out */
    size_t need = p->n_cs * 2 + (m + 2) * 2 * 2;
    if (!rx_grow(&p->cs, &p->cap_cs, need, sizeof *p->cs))
        return perr(p, KEEL_ENOMEM, "out of memory");
    t = p->tmp + from * 2; /* tmp is not moved by growing cs */
    uint32_t *o = p->cs + p->n_cs * 2;
    size_t no = 0;
    uint32_t pending_lo = 0;
    for (size_t i = 0; i <= m; i++) {
        uint32_t lo, hi;
        if (neg) {
            if (i == m) {
                if (pending_lo > 0x10FFFF) break;
                lo = pending_lo, hi = 0x10FFFF;
            } else {
                if (t[i * 2] == pending_lo) {
                    pending_lo = t[i * 2 + 1] + 1;
                    continue;
                }
                lo = pending_lo, hi = t[i * 2] - 1;
                pending_lo = t[i * 2 + 1] + 1;
            }
        } else {
            if (i == m) break;
            lo = t[i * 2], hi = t[i * 2 + 1];
        }
        /* cut [SUR_LO, SUR_END) */
        if (lo < SUR_LO && hi >= SUR_LO) {
            o[no * 2] = lo, o[no * 2 + 1] = SUR_LO - 1, no++;
            if (hi >= SUR_END) o[no * 2] = SUR_END, o[no * 2 + 1] = hi, no++;
        } else if (lo >= SUR_LO && lo < SUR_END) {
            if (hi >= SUR_END) o[no * 2] = SUR_END, o[no * 2 + 1] = hi, no++;
        } else {
            o[no * 2] = lo, o[no * 2 + 1] = hi, no++;
        }
    }
    p->n_tmp = from;
    int32_t r = node(p, N_SET);
    if (r < 0) return r;
    p->nd[r].cs_off = (uint32_t)p->n_cs;
    p->nd[r].cs_n = (uint32_t)no;
    p->n_cs += no;
    return r;
}

static const uint32_t SET_D[] = {0x30, 0x39};
static const uint32_t SET_W[] = {0x30, 0x39, 0x41, 0x5A, 0x5F, 0x5F, 0x61, 0x7A};
static const uint32_t SET_S[] = {0x09,   0x0D,   0x20,   0x20,   0xA0,   0xA0,   0x1680,
                                 0x1680, 0x2000, 0x200A, 0x2028, 0x2029, 0x202F, 0x202F,
                                 0x205F, 0x205F, 0x3000, 0x3000, 0xFEFF, 0xFEFF};
static const uint32_t SET_DOT[] = {0x0, 0x9, 0xB, 0xC, 0xE, 0x2027, 0x202A, 0x10FFFF};

/* Adds a predefined set (d w s, upper case: negated) to tmp. */
static bool tmp_class(rp *p, int cls)
{
    const uint32_t *v;
    size_t k;
    switch (cls | 0x20) {
    case 'd':
        v = SET_D, k = 1;
        break;
    case 'w':
        v = SET_W, k = 4;
        break;
    default:
        v = SET_S, k = 10;
        break;
    }
    if (cls & 0x20) {
        for (size_t i = 0; i < k; i++)
            if (!tmp_add(p, v[i * 2], v[i * 2 + 1])) return false;
        return true;
    }
    uint32_t lo = 0;
    for (size_t i = 0; i < k; i++) {
        if (v[i * 2] > lo && !tmp_add(p, lo, v[i * 2] - 1)) return false;
        lo = v[i * 2 + 1] + 1;
    }
    return tmp_add(p, lo, 0x10FFFF);
}

static int32_t next_cp(rp *p)
{
    if (p->i >= p->n) return -1;
    int32_t c = rx_utf8_next(p->s, p->n, &p->i);
    if (c < 0) return perr(p, KEEL_EFORMAT, "invalid UTF-8");
    return c;
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* k hex digits at p->i; -1 when not there (nothing consumed). */
static int32_t hexn(rp *p, int k)
{
    if (p->n - p->i < (size_t)k) return -1;
    int32_t v = 0;
    for (int j = 0; j < k; j++) {
        int h = hexval(p->s[p->i + (size_t)j]);
        if (h < 0) return -1;
        v = v * 16 + h;
    }
    p->i += (size_t)k;
    return v;
}

/* An escape after '\': a code point (returned) or a class ('d', 'D', ...
 * in *cls, returns -2); -1 on error. */
static int32_t escape(rp *p, bool in_class, int *cls)
{
    *cls = 0;
    if (p->i >= p->n) return perr(p, KEEL_EFORMAT, "\\ at the end of the pattern");
    int c = p->s[p->i];
    switch (c) {
    case 'd':
    case 'D':
    case 'w':
    case 'W':
    case 's':
    case 'S':
        p->i++;
        *cls = c;
        return -2;
    case 't':
        p->i++;
        return 9;
    case 'n':
        p->i++;
        return 10;
    case 'v':
        p->i++;
        return 11;
    case 'f':
        p->i++;
        return 12;
    case 'r':
        p->i++;
        return 13;
    case 'b':
        p->i++;
        if (in_class) return 8;
        *cls = 'b'; /* a word boundary (an assertion) */
        return -2;
    case 'B':
        if (in_class) return perr(p, KEEL_EFORMAT, "\\B in a character class");
        p->i++;
        *cls = 'B';
        return -2;
    case '0':
        if (p->i + 1 < p->n && p->s[p->i + 1] >= '0' && p->s[p->i + 1] <= '9')
            return perr(p, KEEL_EUNSUPPORTED, "octal escapes are not supported");
        p->i++;
        return 0;
    case 'c':
        if (p->i + 1 < p->n && ((p->s[p->i + 1] | 0x20) >= 'a' && (p->s[p->i + 1] | 0x20) <= 'z')) {
            p->i += 2;
            return p->s[p->i - 1] % 32;
        }
        return perr(p, KEEL_EFORMAT, "\\c must be followed by a letter");
    case 'x': {
        p->i++;
        int32_t v = hexn(p, 2);
        return v >= 0 ? v : perr(p, KEEL_EFORMAT, "\\x must be followed by two hex digits");
    }
    case 'u': {
        p->i++;
        if (p->i < p->n && p->s[p->i] == '{') {
            size_t j = p->i + 1;
            uint32_t v = 0;
            while (j < p->n && hexval(p->s[j]) >= 0 && v <= 0x10FFFF)
                v = v * 16 + (uint32_t)hexval(p->s[j++]);
            if (j == p->i + 1 || j >= p->n || p->s[j] != '}' || v > 0x10FFFF)
                return perr(p, KEEL_EFORMAT, "bad \\u{...} escape");
            p->i = j + 1;
            return (int32_t)v;
        }
        int32_t v = hexn(p, 4);
        if (v < 0) return perr(p, KEEL_EFORMAT, "\\u must be followed by four hex digits or {...}");
        if (v >= 0xD800 && v <= 0xDBFF && p->n - p->i >= 6 && p->s[p->i] == '\\' &&
            p->s[p->i + 1] == 'u') {
            size_t save = p->i;
            p->i += 2;
            int32_t lo = hexn(p, 4);
            if (lo >= 0xDC00 && lo <= 0xDFFF) return 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
            p->i = save;
        }
        return v; /* a lone surrogate: matches nothing */
    }
    case 'k':
        return perr(p, KEEL_EUNSUPPORTED, "backreferences are not supported");
    case 'p':
    case 'P':
        return perr(p, KEEL_EUNSUPPORTED, "Unicode property escapes (\\p, \\P) are not supported");
    default:
        break;
    }
    if (c >= '1' && c <= '9') return perr(p, KEEL_EUNSUPPORTED, "backreferences are not supported");
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_')
        return perr(p, KEEL_EFORMAT, "unknown escape");
    return next_cp(p); /* identity escape: punctuation and non-ASCII */
}

static bool lone_surrogate(int32_t c)
{
    return c >= (int32_t)SUR_LO && c < (int32_t)SUR_END;
}

/* After '[': the class up to and including ']'. */
static int32_t parse_class(rp *p)
{
    size_t from = p->n_tmp;
    bool neg = false;
    if (p->i < p->n && p->s[p->i] == '^') {
        neg = true;
        p->i++;
    }
    for (;;) {
        if (p->i >= p->n) return perr(p, KEEL_EFORMAT, "unterminated character class");
        if (p->s[p->i] == ']') {
            p->i++;
            break;
        }
        int cls = 0;
        int32_t a;
        if (p->s[p->i] == '\\') {
            p->i++;
            a = escape(p, true, &cls);
        } else {
            a = next_cp(p);
        }
        if (a == -1) return -1;
        if (cls) {
            if (!tmp_class(p, cls)) return -1;
            continue; /* a following '-' is taken literally (Annex B) */
        }
        if (p->i + 1 < p->n && p->s[p->i] == '-' && p->s[p->i + 1] != ']') {
            p->i++;
            int cls2 = 0;
            int32_t b;
            if (p->s[p->i] == '\\') {
                p->i++;
                b = escape(p, true, &cls2);
            } else {
                b = next_cp(p);
            }
            if (b == -1) return -1;
            if (cls2) {
                if (!tmp_add(p, (uint32_t)a, (uint32_t)a) || !tmp_add(p, '-', '-') ||
                    !tmp_class(p, cls2))
                    return -1;
                continue;
            }
            if (b < a) return perr(p, KEEL_EFORMAT, "character class range out of order");
            if (!tmp_add(p, (uint32_t)a, (uint32_t)b)) return -1;
            continue;
        }
        if (!lone_surrogate(a) && !tmp_add(p, (uint32_t)a, (uint32_t)a)) return -1;
    }
    return tmp_set(p, from, neg);
}

static int32_t single(rp *p, uint32_t lo, uint32_t hi)
{
    size_t from = p->n_tmp;
    if (!tmp_add(p, lo, hi)) return -1;
    return tmp_set(p, from, false);
}

static int32_t parse_alt(rp *p, bool top);

/* Reads {n}, {n,}, {n,m} at p->i ('{'); false (nothing consumed) when it is
 * not a quantifier (then '{' is a literal, as Annex B reads it). */
static bool read_braces(rp *p, int32_t *mn, int32_t *mx)
{
    size_t j = p->i + 1;
    int64_t a = 0, b = -1;
    size_t d0 = j;
    while (j < p->n && p->s[j] >= '0' && p->s[j] <= '9') {
        a = a < 1000000 ? a * 10 + (p->s[j] - '0') : a;
        j++;
    }
    if (j == d0) return false;
    if (j < p->n && p->s[j] == ',') {
        j++;
        size_t d1 = j;
        int64_t v = 0;
        while (j < p->n && p->s[j] >= '0' && p->s[j] <= '9') {
            v = v < 1000000 ? v * 10 + (p->s[j] - '0') : v;
            j++;
        }
        b = j == d1 ? -1 : v;
    } else {
        b = a;
    }
    if (j >= p->n || p->s[j] != '}') return false;
    p->i = j + 1;
    *mn = (int32_t)(a > 1000000 ? 1000000 : a);
    *mx = (int32_t)(b > 1000000 ? 1000000 : b);
    return true;
}

/* Whether a quantifier (*, +, ?, a well-formed {m,n}) starts at p->i;
 * p->i is left where it was. */
static bool quantifier_at(rp *p)
{
    if (p->i >= p->n) return false;
    int c = p->s[p->i];
    if (c == '*' || c == '+' || c == '?') return true;
    if (c != '{') return false;
    size_t save = p->i;
    int32_t a, b;
    bool q = read_braces(p, &a, &b);
    p->i = save;
    return q;
}

/* A sequence up to '|', ')' or the end. */
static int32_t parse_seq(rp *p)
{
    int32_t cat = node(p, N_CAT);
    if (cat < 0) return -1;
    int32_t last = -1;
    while (p->i < p->n && p->s[p->i] != '|' && p->s[p->i] != ')') {
        int c = p->s[p->i];
        int32_t atom = -1;
        bool assertion = false; /* ^ $ \b \B: no quantifier may follow (as with the u flag) */
        if (c == '^' || c == '$') {
            p->i++;
            atom = node(p, c == '^' ? N_BOL : N_EOL);
            assertion = true;
        } else if (quantifier_at(p)) {
            return perr(p, KEEL_EFORMAT, "nothing to repeat");
        } else if (c == '(') {
            p->i++;
            if (p->i < p->n && p->s[p->i] == '?') {
                if (p->i + 1 < p->n && p->s[p->i + 1] == ':') {
                    p->i += 2;
                } else if (p->i + 1 < p->n && (p->s[p->i + 1] == '=' || p->s[p->i + 1] == '!')) {
                    return perr(p, KEEL_EUNSUPPORTED, "lookahead assertions are not supported");
                } else if (p->i + 2 < p->n && p->s[p->i + 1] == '<' &&
                           (p->s[p->i + 2] == '=' || p->s[p->i + 2] == '!')) {
                    return perr(p, KEEL_EUNSUPPORTED, "lookbehind assertions are not supported");
                } else if (p->i + 1 < p->n && p->s[p->i + 1] == '<') {
                    size_t j = p->i + 2;
                    while (j < p->n && p->s[j] != '>' && p->s[j] != ')')
                        j++;
                    if (j >= p->n || p->s[j] != '>' || j == p->i + 2)
                        return perr(p, KEEL_EFORMAT, "bad group name");
                    p->i = j + 1;
                } else {
                    return perr(p, KEEL_EUNSUPPORTED,
                                "inline flags and other (? groups are not supported");
                }
            }
            if (++p->depth > RX_MAX_NEST) return perr(p, KEEL_ERANGE, "groups nested too deeply");
            atom = parse_alt(p, false);
            p->depth--;
            if (atom < 0) return -1;
            if (p->i >= p->n || p->s[p->i] != ')') return perr(p, KEEL_EFORMAT, "missing )");
            p->i++;
        } else if (c == '[') {
            p->i++;
            atom = parse_class(p);
        } else if (c == '.') {
            p->i++;
            size_t from = p->n_tmp;
            for (int k = 0; k < 4; k++)
                if (!tmp_add(p, SET_DOT[k * 2], SET_DOT[k * 2 + 1])) return -1;
            atom = tmp_set(p, from, false);
        } else if (c == '\\') {
            p->i++;
            int cls = 0;
            int32_t v = escape(p, false, &cls);
            if (v == -1) return -1;
            if (cls == 'b' || cls == 'B') {
                atom = node(p, cls == 'b' ? N_WB : N_NWB);
                assertion = true;
            } else if (cls) {
                size_t from = p->n_tmp;
                if (!tmp_class(p, cls)) return -1;
                atom = tmp_set(p, from, false);
            } else if (lone_surrogate(v)) {
                atom = tmp_set(p, p->n_tmp, false); /* the empty set */
            } else {
                atom = single(p, (uint32_t)v, (uint32_t)v);
            }
        } else {
            int32_t v = next_cp(p);
            if (v < 0) return -1;
            atom = single(p, (uint32_t)v, (uint32_t)v);
        }
        if (atom < 0) return -1;
        if (assertion && quantifier_at(p)) return perr(p, KEEL_EFORMAT, "nothing to repeat");
        /* quantifiers (a lazy '?' after one changes nothing here) */
        while (!assertion && p->i < p->n) {
            int q = p->s[p->i];
            int32_t mn, mx;
            if (q == '*')
                mn = 0, mx = -1, p->i++;
            else if (q == '+')
                mn = 1, mx = -1, p->i++;
            else if (q == '?')
                mn = 0, mx = 1, p->i++;
            else if (q == '{' && read_braces(p, &mn, &mx)) {
                if (mx >= 0 && mx < mn)
                    return perr(p, KEEL_EFORMAT, "numbers out of order in {} quantifier");
                if (mn > RX_MAX_REPEAT || mx > RX_MAX_REPEAT) {
                    if (!p->st)
                        p->st = base_err(p->err, KEEL_ERANGE,
                                         "%s: repetition counts above %d are not supported",
                                         p->what, RX_MAX_REPEAT);
                    return -1;
                }
            } else
                break;
            if (p->i < p->n && p->s[p->i] == '?') p->i++;
            int32_t r = node(p, N_REP);
            if (r < 0) return -1;
            p->nd[r].first = atom;
            p->nd[r].min = mn;
            p->nd[r].max = mx;
            atom = r;
            if (p->i < p->n && (p->s[p->i] == '*' || p->s[p->i] == '+' || p->s[p->i] == '?'))
                return perr(p, KEEL_EFORMAT, "nothing to repeat");
        }
        if (last < 0)
            p->nd[cat].first = atom;
        else
            p->nd[last].next = atom;
        last = atom;
    }
    return cat;
}

static int32_t any_star(rp *p)
{
    int32_t s = single(p, 0, 0x10FFFF);
    if (s < 0) return -1;
    int32_t r = node(p, N_REP);
    if (r < 0) return -1;
    p->nd[r].first = s;
    p->nd[r].min = 0;
    p->nd[r].max = -1;
    return r;
}

/* Alternatives up to ')' (or, at the top level, the end). */
static int32_t parse_alt(rp *p, bool top)
{
    int32_t alt = node(p, N_ALT);
    if (alt < 0) return -1;
    int32_t last = -1;
    for (;;) {
        int32_t seq = parse_seq(p);
        if (seq < 0) return -1;
        if (last < 0)
            p->nd[alt].first = seq;
        else
            p->nd[last].next = seq;
        last = seq;
        if (p->i < p->n && p->s[p->i] == '|') {
            p->i++;
            continue;
        }
        break;
    }
    if (top && p->i < p->n) return perr(p, KEEL_EFORMAT, "unmatched )");
    return alt;
}

/* The pattern: its alternatives, with search [\s\S]* on both sides (a
 * match anywhere; ^ and $ then pin it to the ends). */
static int32_t parse_root(rp *p, bool search)
{
    int32_t alt = parse_alt(p, true);
    if (alt < 0 || !search) return alt;
    int32_t cat = node(p, N_CAT), l = any_star(p), r = any_star(p);
    if (cat < 0 || l < 0 || r < 0) return -1;
    p->nd[cat].first = l;
    p->nd[l].next = alt;
    p->nd[alt].next = r;
    return cat;
}

/* ---- Thompson automaton --------------------------------------------------- */

typedef struct nfa {
    int32_t *set; /* [n] SET node of the state's character edge, or -1 */
    uint32_t *to; /* [n] target of the character edge */
    uint32_t n;
    size_t cap_set, cap_to;
    uint32_t *eps; /* triples (from, to, tag): tag EPS_*, the condition */
    size_t n_eps, cap_eps;
    uint32_t *eoff; /* [n + 1] CSR of eps by from */
    uint32_t *eto;
    uint8_t *etag;
    bool has_wb; /* \b or \B somewhere: the partition splits \w off */
} nfa;

static int64_t nfa_state(nfa *a, rp *p)
{
    if (a->n >= RX_MAX_NFA) {
        if (!p->st)
            p->st =
                base_err(p->err, KEEL_ERANGE, "%s is too complex (more than %u automaton states)",
                         p->what, RX_MAX_NFA);
        return -1;
    }
    if (!rx_grow(&a->set, &a->cap_set, a->n + 1, sizeof *a->set) ||
        !rx_grow(&a->to, &a->cap_to, a->n + 1, sizeof *a->to)) {
        perr(p, KEEL_ENOMEM, "out of memory");
        return -1;
    }
    a->set[a->n] = -1;
    a->to[a->n] = 0;
    return a->n++;
}

/* always; before any character; after the last; at a word boundary;
 * not at one */
enum { EPS_ANY, EPS_BOL, EPS_EOL, EPS_WB, EPS_NWB };

static bool nfa_eps_tag(nfa *a, rp *p, uint32_t from, uint32_t to, uint32_t tag)
{
    if (!rx_grow(&a->eps, &a->cap_eps, a->n_eps * 3 + 3, sizeof *a->eps)) {
        perr(p, KEEL_ENOMEM, "out of memory");
        return false;
    }
    a->eps[a->n_eps * 3] = from;
    a->eps[a->n_eps * 3 + 1] = to;
    a->eps[a->n_eps * 3 + 2] = tag;
    a->n_eps++;
    return true;
}

static bool nfa_eps(nfa *a, rp *p, uint32_t from, uint32_t to)
{
    return nfa_eps_tag(a, p, from, to, EPS_ANY);
}

/* Adds paths for node r from state `from`; returns the exit state. No edge
 * ever enters `from`, so a caller may keep adding edges out of it. */
static int64_t build(nfa *a, rp *p, int32_t r, uint32_t from)
{
    const rnode *x = &p->nd[r];
    switch (x->kind) {
    case N_SET: {
        int64_t s = nfa_state(a, p), t = nfa_state(a, p);
        if (s < 0 || t < 0 || !nfa_eps(a, p, from, (uint32_t)s)) return -1;
        a->set[s] = r;
        a->to[s] = (uint32_t)t;
        return t;
    }
    case N_BOL:
    case N_EOL:
    case N_WB:
    case N_NWB: {
        static const uint32_t tag[] = {
            [N_BOL] = EPS_BOL, [N_EOL] = EPS_EOL, [N_WB] = EPS_WB, [N_NWB] = EPS_NWB};
        int64_t t = nfa_state(a, p);
        if (t < 0 || !nfa_eps_tag(a, p, from, (uint32_t)t, tag[x->kind])) return -1;
        if (x->kind >= N_WB) a->has_wb = true;
        return t;
    }
    case N_CAT: {
        int64_t cur = nfa_state(a, p);
        if (cur < 0 || !nfa_eps(a, p, from, (uint32_t)cur)) return -1;
        for (int32_t c = x->first; c >= 0; c = p->nd[c].next) {
            cur = build(a, p, c, (uint32_t)cur);
            if (cur < 0) return -1;
        }
        return cur;
    }
    case N_ALT: {
        int64_t t = nfa_state(a, p);
        if (t < 0) return -1;
        for (int32_t c = x->first; c >= 0; c = p->nd[c].next) {
            int64_t e = build(a, p, c, from);
            if (e < 0 || !nfa_eps(a, p, (uint32_t)e, (uint32_t)t)) return -1;
        }
        return t;
    }
    default: {
        int64_t cur = nfa_state(a, p);
        if (cur < 0 || !nfa_eps(a, p, from, (uint32_t)cur)) return -1;
        for (int32_t k = 0; k < x->min; k++) {
            cur = build(a, p, x->first, (uint32_t)cur);
            if (cur < 0) return -1;
        }
        if (x->max < 0) {
            int64_t s = nfa_state(a, p);
            if (s < 0 || !nfa_eps(a, p, (uint32_t)cur, (uint32_t)s)) return -1;
            int64_t e = build(a, p, x->first, (uint32_t)s);
            if (e < 0 || !nfa_eps(a, p, (uint32_t)e, (uint32_t)s)) return -1;
            return s;
        }
        for (int32_t k = x->min; k < x->max; k++) {
            int64_t t = nfa_state(a, p);
            if (t < 0) return -1;
            int64_t e = build(a, p, x->first, (uint32_t)cur);
            if (e < 0 || !nfa_eps(a, p, (uint32_t)e, (uint32_t)t) ||
                !nfa_eps(a, p, (uint32_t)cur, (uint32_t)t))
                return -1;
            cur = t;
        }
        return cur;
    }
    }
}

static void nfa_free(nfa *a)
{
    base_free(a->set, a->cap_set * sizeof *a->set);
    base_free(a->to, a->cap_to * sizeof *a->to);
    base_free(a->eps, a->cap_eps * sizeof *a->eps);
    base_free(a->eoff, ((size_t)a->n + 1) * sizeof *a->eoff);
    base_free(a->eto, (a->n_eps ? a->n_eps : 1) * sizeof *a->eto);
    base_free(a->etag, a->n_eps ? a->n_eps : 1);
}

static bool nfa_csr(nfa *a)
{
    a->eoff = base_calloc((size_t)a->n + 1, sizeof *a->eoff);
    a->eto = base_alloc((a->n_eps ? a->n_eps : 1) * sizeof *a->eto);
    a->etag = base_alloc(a->n_eps ? a->n_eps : 1);
    if (!a->eoff || !a->eto || !a->etag) return false;
    for (size_t e = 0; e < a->n_eps; e++)
        a->eoff[a->eps[e * 3] + 1]++;
    for (size_t s = 0; s < a->n; s++)
        a->eoff[s + 1] += a->eoff[s];
    uint32_t *fill = base_alloc(((size_t)a->n + 1) * sizeof *fill);
    if (!fill) return false;
    memcpy(fill, a->eoff, ((size_t)a->n + 1) * sizeof *fill);
    for (size_t e = 0; e < a->n_eps; e++) {
        uint32_t at = fill[a->eps[e * 3]]++;
        a->eto[at] = a->eps[e * 3 + 1];
        a->etag[at] = (uint8_t)a->eps[e * 3 + 2];
    }
    base_free(fill, ((size_t)a->n + 1) * sizeof *fill);
    return true;
}

/* ---- subset construction -------------------------------------------------- */

typedef struct subset {
    uint32_t *pool; /* the sets, one after another */
    size_t n_pool, cap_pool;
    uint32_t *off; /* [n + 1] */
    size_t n, cap_off;
    uint32_t *hash; /* set id + 1; open addressing */
    size_t cap_hash;
} subset;

static uint64_t set_hash(const uint32_t *v, size_t k)
{
    uint64_t h = 1469598103934665603ull ^ k;
    for (size_t i = 0; i < k; i++)
        h = (h ^ v[i]) * 1099511628211ull;
    return h;
}

static bool subset_rehash(subset *ss)
{
    size_t nc = ss->cap_hash ? ss->cap_hash * 2 : 1024;
    uint32_t *h = base_calloc(nc, sizeof *h);
    if (!h) return false;
    for (size_t i = 0; i < ss->n; i++) {
        uint64_t x = set_hash(ss->pool + ss->off[i], ss->off[i + 1] - ss->off[i]);
        size_t at = (size_t)(x % nc);
        while (h[at])
            at = (at + 1) % nc;
        h[at] = (uint32_t)i + 1;
    }
    base_free(ss->hash, ss->cap_hash * sizeof *ss->hash);
    ss->hash = h;
    ss->cap_hash = nc;
    return true;
}

/* The id of the set v[0..k) (sorted), added when new (*added). -1: no
 * memory; -2: past RX_MAX_RAW sets. */
static int64_t subset_get(subset *ss, const uint32_t *v, size_t k, bool *added)
{
    *added = false;
    if ((ss->n + 1) * 2 > ss->cap_hash && !subset_rehash(ss)) return -1;
    uint64_t x = set_hash(v, k);
    size_t at = (size_t)(x % ss->cap_hash);
    for (; ss->hash[at]; at = (at + 1) % ss->cap_hash) {
        uint32_t id = ss->hash[at] - 1;
        size_t kk = ss->off[id + 1] - ss->off[id];
        if (kk == k && (k == 0 || memcmp(ss->pool + ss->off[id], v, k * sizeof *v) == 0)) return id;
    }
    if (ss->n >= RX_MAX_RAW) return -2;
    if (!rx_grow(&ss->pool, &ss->cap_pool, ss->n_pool + k + 1, sizeof *ss->pool) ||
        !rx_grow(&ss->off, &ss->cap_off, ss->n + 2, sizeof *ss->off))
        return -1;
    if (ss->n == 0) ss->off[0] = 0;
    if (k) memcpy(ss->pool + ss->n_pool, v, k * sizeof *v);
    ss->n_pool += k;
    ss->off[ss->n + 1] = (uint32_t)ss->n_pool;
    ss->hash[at] = (uint32_t)ss->n + 1;
    *added = true;
    return (int64_t)ss->n++;
}

typedef struct closure {
    uint32_t *stack, *mark, *out, *seen; /* [n], [n], [n + 1], [n] */
    uint32_t *pend;                      /* [n_eps + 1] targets of $ edges */
    uint32_t gen;
    size_t n_out;
} closure;

/* Closures work on items: an automaton state with what the next
 * character must be, which word boundaries decide (REQ_WORD: a word
 * character \w; REQ_NONWORD: another one or the end). An item is
 * state * 3 + req. */
enum { REQ_ANY, REQ_WORD, REQ_NONWORD };

/* The requirement after crossing a \b (wb) or \B edge after a word
 * character or not (prev_word), on top of req; -1 when they conflict. */
static int req_cross(int req, bool wb, bool prev_word)
{
    int r = (wb != prev_word) ? REQ_WORD : REQ_NONWORD;
    return req == REQ_ANY || req == r ? r : -1;
}

/* The epsilon closure of seeds (items; ^ edges followed only when bol:
 * before any character; prev_word: the character read last was \w), kept
 * to its items of character states, sorted, in c->out; then acc_mark
 * appended when the final state is reachable at the end of the string
 * (the closure with $ edges too, the end being no word character). The
 * mark makes a set's identity carry its acceptance. Returns the items
 * visited (the work). */
static size_t eps_close(const nfa *a, closure *c, const uint32_t *seeds, size_t k, uint32_t fin,
                        bool bol, bool prev_word, uint32_t acc_mark)
{
    c->gen++;
    uint32_t m0 = c->gen * 2, m1 = m0 + 1; /* the marks of the two phases */
    size_t sp = 0, n_seen = 0, n_pend = 0;
    c->n_out = 0;
    for (size_t i = 0; i < k; i++)
        if (c->mark[seeds[i]] != m0) {
            c->mark[seeds[i]] = m0;
            c->stack[sp++] = seeds[i];
        }
    bool acc = false;
    for (int phase = 0; phase < 2; phase++) {
        if (phase == 1) {
            /* for acceptance only: what the noted $ edges reach (the rest
             * was seen in phase 0) */
            if (acc || !n_pend) break;
            for (size_t i = 0; i < n_seen; i++)
                c->mark[c->seen[i]] = m1;
            for (size_t i = 0; i < n_pend; i++)
                if (c->mark[c->pend[i]] != m1) {
                    c->mark[c->pend[i]] = m1;
                    c->stack[sp++] = c->pend[i];
                }
        }
        uint32_t mk = phase ? m1 : m0;
        while (sp && !(phase && acc)) {
            uint32_t it = c->stack[--sp], s = it / 3;
            int req = (int)(it % 3);
            if (phase == 0) {
                c->seen[n_seen++] = it;
                if (a->set[s] >= 0) c->out[c->n_out++] = it;
            } else {
                n_seen++;
            }
            if (s == fin && req != REQ_WORD) acc = true;
            for (uint32_t e = a->eoff[s]; e < a->eoff[s + 1]; e++) {
                int r = req;
                switch (a->etag[e]) {
                case EPS_BOL:
                    if (!bol) continue;
                    break;
                case EPS_EOL:
                    if (phase == 0) {
                        c->pend[n_pend++] = a->eto[e] * 3 + (uint32_t)req;
                        continue;
                    }
                    break;
                case EPS_WB:
                case EPS_NWB:
                    r = req_cross(req, a->etag[e] == EPS_WB, prev_word);
                    if (r < 0) continue;
                    break;
                default:
                    break;
                }
                uint32_t t = a->eto[e] * 3 + (uint32_t)r;
                if (c->mark[t] != mk) {
                    c->mark[t] = mk;
                    c->stack[sp++] = t;
                }
            }
        }
    }
    qsort(c->out, c->n_out, sizeof *c->out, cmp_u32);
    if (acc) c->out[c->n_out++] = acc_mark;
    return n_seen + n_pend;
}

static keel_status determinize(rp *p, nfa *a, uint32_t start, uint32_t fin, rx_dfa **out)
{
    keel_status st = KEEL_ENOMEM;
    rx_dfa *d = NULL;
    subset ss = {0};
    closure c = {0};
    uint32_t *bnd = NULL, *er = NULL, *table = NULL;
    uint32_t *tg = NULL, *cnt = NULL;
    uint8_t *isword = NULL;
    size_t n_bnd = 0, cap_bnd = 0, cap_table = 0, cap_tg = 0;
    /* elementary intervals: every set boundary, and the surrogates apart */
    size_t need = p->n_cs * 2 + 3;
    need += 8; /* the boundaries of \w */
    bnd = base_alloc(need * sizeof *bnd);
    cap_bnd = need;
    er = base_alloc((p->n_cs ? p->n_cs : 1) * 2 * sizeof *er);
    if (!bnd || !er) goto fail;
    bnd[n_bnd++] = 0;
    bnd[n_bnd++] = SUR_LO;
    bnd[n_bnd++] = SUR_END;
    for (size_t i = 0; i < p->n_cs; i++) {
        bnd[n_bnd++] = p->cs[i * 2];
        if (p->cs[i * 2 + 1] + 1 < RX_CP_END) bnd[n_bnd++] = p->cs[i * 2 + 1] + 1;
    }
    for (size_t i = 0; a->has_wb && i < 4; i++)
        bnd[n_bnd++] = SET_W[i * 2], bnd[n_bnd++] = SET_W[i * 2 + 1] + 1;
    qsort(bnd, n_bnd, sizeof *bnd, cmp_u32);
    size_t m = 0;
    for (size_t i = 0; i < n_bnd; i++)
        if (!m || bnd[i] != bnd[m - 1]) bnd[m++] = bnd[i];
    n_bnd = m;
    /* each set interval as a range of elementary intervals */
    for (size_t i = 0; i < p->n_cs; i++) {
        uint32_t lo = p->cs[i * 2], hi = p->cs[i * 2 + 1];
        uint32_t *k1 = bsearch(&lo, bnd, n_bnd, sizeof *bnd, cmp_u32);
        uint32_t e = 0, x = hi + 1;
        if (x < RX_CP_END)
            e = (uint32_t)((uint32_t *)bsearch(&x, bnd, n_bnd, sizeof *bnd, cmp_u32) - bnd);
        else
            e = (uint32_t)n_bnd;
        er[i * 2] = (uint32_t)(k1 - bnd);
        er[i * 2 + 1] = e; /* exclusive */
    }
    /* whether each elementary interval is \w (all of it or none) */
    isword = base_alloc(n_bnd);
    for (size_t k = 0; isword && k < n_bnd; k++) {
        isword[k] = 0;
        for (size_t i = 0; i < 4; i++)
            isword[k] |= bnd[k] >= SET_W[i * 2] && bnd[k] <= SET_W[i * 2 + 1];
    }
    size_t n_items = (size_t)a->n * 3, acc_mark = n_items;
    cnt = base_alloc((n_bnd + 1) * sizeof *cnt);
    c.stack = base_alloc(n_items * sizeof *c.stack);
    c.mark = base_calloc(n_items, sizeof *c.mark);
    c.out = base_alloc((n_items + 1) * sizeof *c.out);
    c.seen = base_alloc(n_items * sizeof *c.seen);
    c.pend = base_alloc((a->n_eps * 3 + 1) * sizeof *c.pend);
    if (!isword || !cnt || !c.stack || !c.mark || !c.out || !c.seen || !c.pend) goto fail;
    bool added;
    if (subset_get(&ss, NULL, 0, &added) < 0) goto fail; /* the dead state */
    uint32_t start_item = start * 3 + REQ_ANY;
    uint64_t work = eps_close(a, &c, &start_item, 1, fin, true, false, (uint32_t)acc_mark);
    int64_t s0 = subset_get(&ss, c.out, c.n_out, &added);
    if (s0 < 0) goto fail;
    size_t nc = n_bnd;
    for (size_t q = 0; q < ss.n; q++) {
        if (!rx_grow(&table, &cap_table, (q + 1) * nc, sizeof *table)) goto fail;
        if ((q + 1) * nc > RX_MAX_CELLS) goto too_big;
        memset(table + q * nc, 0, nc * sizeof *table);
        /* the targets of the state's edges bucketed by elementary
         * interval (a counting sort: cnt[k + 1] counts, then starts);
         * two intervals covered by the same character states get equal
         * target lists, in the same order */
        memset(cnt, 0, (nc + 1) * sizeof *cnt);
        size_t n_pairs = 0;
        for (int pass = 0; pass < 2; pass++) {
            for (uint32_t i = ss.off[q]; i < ss.off[q + 1]; i++) {
                uint32_t it = ss.pool[i], s = it / 3, req = it % 3;
                if (it == acc_mark || a->set[s] < 0) continue; /* the acceptance mark, or no edge */
                const rnode *x = &p->nd[a->set[s]];
                for (uint32_t j = 0; j < x->cs_n; j++)
                    for (uint32_t k = er[(x->cs_off + j) * 2]; k < er[(x->cs_off + j) * 2 + 1];
                         k++) {
                        if (req != REQ_ANY && (req == REQ_WORD) != (bool)isword[k]) continue;
                        if (pass == 0)
                            cnt[k + 1]++, n_pairs++;
                        else
                            tg[cnt[k]++] = a->to[s] * 3 + REQ_ANY;
                    }
            }
            if (pass == 0) {
                work += n_pairs + nc;
                if (work > SUBSET_WORK) goto too_big;
                if (!rx_grow(&tg, &cap_tg, n_pairs + 1, sizeof *tg)) goto fail;
                for (size_t k = 0; k < nc; k++)
                    cnt[k + 1] += cnt[k];
            }
        }
        /* now bucket k is tg[k ? cnt[k - 1] : 0 .. cnt[k]) */
        /* intervals with the same targets lead to the same state: the
         * last few distinct target lists of this state are remembered
         * (intervals of one class alternate with others: '.' and \n) */
        enum { N_MEMO = 8 };
        size_t memo_at[N_MEMO], memo_n[N_MEMO], memo_k[N_MEMO];
        int64_t memo_id[N_MEMO];
        int n_memo = 0, next_memo = 0;
        for (size_t k = 0; k < nc; k++) {
            size_t i = k ? cnt[k - 1] : 0, nk = cnt[k] - i;
            if (!nk) continue;
            int64_t id = -1;
            for (int j = 0; j < n_memo && id < 0; j++)
                if (memo_n[j] == nk && isword[memo_k[j]] == isword[k] &&
                    memcmp(tg + memo_at[j], tg + i, nk * sizeof *tg) == 0)
                    id = memo_id[j];
            if (id < 0) {
                work += eps_close(a, &c, tg + i, nk, fin, false, isword[k], (uint32_t)acc_mark) +
                        c.n_out;
                if (work > SUBSET_WORK) goto too_big;
                id = subset_get(&ss, c.out, c.n_out, &added);
                if (id == -1) goto fail;
                if (id == -2) goto too_big;
                memo_at[next_memo] = i, memo_n[next_memo] = nk, memo_id[next_memo] = id,
                memo_k[next_memo] = k;
                next_memo = (next_memo + 1) % N_MEMO;
                if (n_memo < N_MEMO) n_memo++;
            }
            table[q * nc + k] = (uint32_t)id;
        }
    }
    d = rx_dfa_new((uint32_t)n_bnd, (uint32_t)nc, (uint32_t)ss.n);
    if (!d) goto fail;
    for (size_t i = 0; i < n_bnd; i++)
        d->iv_lo[i] = bnd[i], d->iv_cls[i] = (uint32_t)i;
    memcpy(d->next, table, ss.n * nc * sizeof *table);
    for (size_t q = 0; q < ss.n; q++)
        for (uint32_t i = ss.off[q]; i < ss.off[q + 1]; i++)
            if (ss.pool[i] == acc_mark) d->acc[q] = 1;
    d->start = (uint32_t)s0;
    st = rx_finish(d, p->what, RX_MAX_STATES, p->err);
    if (st) goto fail_set;
    *out = d;
    d = NULL;
    goto done;
too_big:
    st = base_err(p->err, KEEL_ERANGE, "%s is too complex (more than %u automaton states)", p->what,
                  RX_MAX_STATES);
    goto done;
fail:
    st = base_err(p->err, KEEL_ENOMEM, "%s: out of memory", p->what);
fail_set:
done:
    rx_free(d);
    base_free(bnd, cap_bnd * sizeof *bnd);
    base_free(er, (p->n_cs ? p->n_cs : 1) * 2 * sizeof *er);
    base_free(table, cap_table * sizeof *table);
    base_free(tg, cap_tg * sizeof *tg);
    base_free(cnt, (n_bnd + 1) * sizeof *cnt);
    base_free(ss.pool, ss.cap_pool * sizeof *ss.pool);
    base_free(ss.off, ss.cap_off * sizeof *ss.off);
    base_free(ss.hash, ss.cap_hash * sizeof *ss.hash);
    base_free(c.stack, (size_t)a->n * 3 * sizeof *c.stack);
    base_free(c.mark, (size_t)a->n * 3 * sizeof *c.mark);
    base_free(c.out, ((size_t)a->n * 3 + 1) * sizeof *c.out);
    base_free(c.seen, (size_t)a->n * 3 * sizeof *c.seen);
    base_free(c.pend, (a->n_eps * 3 + 1) * sizeof *c.pend);
    base_free(isword, n_bnd ? n_bnd : 1);
    return st;
}

keel_status rx_compile(const char *pat, size_t n, bool search, rx_dfa **out, char *err)
{
    *out = NULL;
    char what[96];
    /* the pattern quoted in messages, cut at 60 bytes */
    int shown = n > 60 ? 60 : (int)n;
    snprintf(what, sizeof what, "pattern \"%.*s%s\"", shown, pat, n > 60 ? "..." : "");
    rp p = {.s = (const unsigned char *)pat, .n = n, .err = err, .what = what};
    nfa a = {0};
    int32_t root = parse_root(&p, search);
    keel_status st = p.st;
    if (root >= 0 && !st) {
        int64_t s0 = nfa_state(&a, &p);
        int64_t fin = s0 >= 0 ? build(&a, &p, root, (uint32_t)s0) : -1;
        st = p.st;
        if (!st && fin >= 0) {
            if (!nfa_csr(&a))
                st = base_err(err, KEEL_ENOMEM, "%s: out of memory", what);
            else
                st = determinize(&p, &a, (uint32_t)s0, (uint32_t)fin, out);
        }
    }
    if (!st && !*out) st = base_err(err, KEEL_EINTERNAL, "%s: no automaton", what);
    nfa_free(&a);
    base_free(p.nd, p.cap_nd * sizeof *p.nd);
    base_free(p.cs, p.cap_cs * sizeof *p.cs);
    base_free(p.tmp, p.cap_tmp * sizeof *p.tmp);
    return st;
}
