/*
 * jnumber.c — JSON Schema's numeric keywords (minimum, maximum, the
 * exclusive bounds, multipleOf, integer / non-integer, excluded values) as
 * an exact automaton over the text of a number, written out as GBNF.
 *
 * Numbers are decimal texts, never doubles: a bound is compared digit by
 * digit and a divisor d = p / 10^q is a residue count, so "0.1 + 0.2"
 * style rounding never decides what the grammar accepts.
 *
 * The automaton reads plain decimals -?(0|[1-9][0-9]*)(\.[0-9]+)? over
 * the alphabet 0-9 . - (12 symbols). It is the product of small
 * deterministic components, each a function of the text read so far:
 *
 *   syn   where in the syntax (start, after '-', int "0", int digits,
 *         after '.', fraction all zeros, fraction with a nonzero digit);
 *         the kind (integer / not) is read from its final state.
 *   cmp   the comparison of the text with one constant c (a bound or an
 *         excluded value): the sign read, the integer digits read against
 *         c's integer digits (count and first difference), then fraction
 *         digits against c's fraction; the result LT / EQ / GT is read from
 *         its final state. An excluded value needs only EQ / not EQ, and
 *         its states collapse as soon as the prefix differs.
 *   mul   the residue of value * 10^q modulo p while reading digits, and
 *         how many fraction digits were read (past q they must be zeros).
 *
 * The product is built breadth-first over reachable tuples (hash-consed,
 * at most JN_MAX_STATES), trimmed to the states from which an accepting
 * state is reachable (none: the spec is empty), minimized (Hopcroft's
 * partition refinement) and written as one GBNF rule per state. Every
 * rule reference is in tail position, so the matcher's stacks do not grow
 * with the length of the number.
 *
 * jnum_test decides the same question for any JSON number text (exponent
 * included) on a canonical form (sign, significant digits, decimal
 * exponent) without expanding the exponent.
 */
#include "jnumber.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JN_MAX_STATES (1u << 16)    /* product states before minimization */
#define JN_MAX_RESIDUES 10000u      /* p of one divisor p / 10^q (p rules of 10 alternatives) */
#define JN_MAX_RULES 4096u          /* rules written (minimal states): gram_compile's time grows with their square */
#define JN_MAX_DIGITS 400u          /* digits of a constant written without exponent (doubles need 343) */
#define JN_MAX_EXCEPT 256u          /* excluded values (one component each) */
#define JN_MAX_TUPLE_BYTES (64u << 20) /* component states of all product states */
#define JN_MAX_OUT (16u << 20)      /* bytes of GBNF (gram_compile's source cap) */
#define JN_EXP_SAT 1000000000000000 /* exponents saturate here (far past any constant) */
#define JN_N_SYM 12                 /* 0-9 . - */
#define JN_SYM_DOT 10
#define JN_SYM_MINUS 11
#define JN_NONE UINT32_MAX
#define JN_TRUE (UINT32_MAX - 1) /* a component settled as satisfied */

/* ---- canonical decimals ----------------------------------------------------------- */

/* value = (neg ? -1 : 1) * 0.S * 10^adj, S = a[0..na) b[0..nb): the
 * significant digits, no leading or trailing zeros (empty for zero). */
typedef struct jn_num {
    bool neg, zero;
    const char *a, *b;
    size_t na, nb;
    int64_t adj;
} jn_num;

static bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* Parses n bytes of a JSON number (exponent allowed). False when it is not one. */
static bool num_parse(const char *t, size_t n, jn_num *x)
{
    const char *p = t, *end = t + n;
    memset(x, 0, sizeof *x);
    if (p < end && *p == '-') {
        x->neg = true;
        p++;
    }
    if (p >= end || !is_digit(*p)) return false;
    const char *ip = p;
    if (*p == '0')
        p++;
    else
        while (p < end && is_digit(*p)) p++;
    size_t ni = (size_t)(p - ip), nf = 0;
    const char *fp = p;
    if (p < end && *p == '.') {
        fp = ++p;
        while (p < end && is_digit(*p)) p++;
        nf = (size_t)(p - fp);
        if (!nf) return false;
    }
    int64_t ex = 0;
    if (p < end && (*p == 'e' || *p == 'E')) {
        bool eneg = false;
        p++;
        if (p < end && (*p == '+' || *p == '-')) eneg = *p++ == '-';
        if (p >= end || !is_digit(*p)) return false;
        for (; p < end && is_digit(*p); p++)
            if (ex < JN_EXP_SAT) ex = ex * 10 + (*p - '0');
        if (eneg) ex = -ex;
    }
    if (p != end || n > (size_t)JN_EXP_SAT) return false;
    while (ni && *ip == '0') ip++, ni--;
    if (ni) {
        x->a = ip, x->na = ni, x->b = fp, x->nb = nf;
        x->adj = ex + (int64_t)ni;
    } else {
        size_t z = 0;
        while (z < nf && fp[z] == '0') z++;
        x->a = fp + z, x->na = nf - z;
        x->adj = ex - (int64_t)z;
    }
    while (x->nb && x->b[x->nb - 1] == '0') x->nb--;
    if (!x->nb)
        while (x->na && x->a[x->na - 1] == '0') x->na--;
    if (!x->na && !x->nb) x->zero = true, x->neg = false, x->adj = 0;
    return true;
}

static size_t num_len(const jn_num *x)
{
    return x->na + x->nb;
}

/* Significant digit i of x ('0' past the end). */
static char num_dig(const jn_num *x, size_t i)
{
    return i < x->na ? x->a[i] : i < x->na + x->nb ? x->b[i - x->na] : '0';
}

/* |x| against |y|: <0, 0, >0. */
static int num_cmp_mag(const jn_num *x, const jn_num *y)
{
    if (x->zero || y->zero) return (int)!x->zero - (int)!y->zero;
    if (x->adj != y->adj) return x->adj < y->adj ? -1 : 1;
    size_t n = BASE_MAX(num_len(x), num_len(y));
    for (size_t i = 0; i < n; i++) {
        char c = num_dig(x, i), d = num_dig(y, i);
        if (c != d) return c < d ? -1 : 1;
    }
    return 0;
}

static int num_cmp(const jn_num *x, const jn_num *y)
{
    if (x->neg != y->neg) return x->neg ? -1 : 1; /* zero is never neg */
    int c = num_cmp_mag(x, y);
    return x->neg ? -c : c;
}

int jnum_cmp(const char *a, const char *b)
{
    jn_num x, y;
    bool okx = num_parse(a, strlen(a), &x), oky = num_parse(b, strlen(b), &y);
    if (!okx || !oky) return okx == oky ? strcmp(a, b) : okx ? 1 : -1; /* texts that are not numbers: a fixed order */
    return num_cmp(&x, &y);
}

/* a * b mod m (m < 2^63), without overflow. */
static uint64_t mulmod(uint64_t a, uint64_t b, uint64_t m)
{
    uint64_t r = 0;
    a %= m;
    while (b) {
        if (b & 1) r = (r + a) % m;
        a = (a + a) % m;
        b >>= 1;
    }
    return r;
}

/* Whether x is an integer multiple of d (> 0). x = D * 10^e, d = P * 10^f
 * (D, P the significant digits): x / d = D * 10^(e-f) / P. D has no
 * trailing zero, so e < f leaves a fraction unless x is 0. */
static keel_status num_is_mult(const jn_num *x, const jn_num *d, const char *dtext, bool *ok, char *err)
{
    if (d->zero || d->neg) return base_err(err, KEEL_EINVAL, "multipleOf %s is not greater than 0", dtext);
    size_t nd = num_len(d);
    if (nd > 18) return base_err(err, KEEL_EUNSUPPORTED, "multipleOf %s has more than 18 significant digits", dtext);
    if (x->zero) {
        *ok = true;
        return KEEL_OK;
    }
    int64_t e = x->adj - (int64_t)num_len(x), f = d->adj - (int64_t)nd;
    if (e < f) {
        *ok = false;
        return KEEL_OK;
    }
    uint64_t p = 0, r = 0;
    for (size_t i = 0; i < nd; i++) p = p * 10 + (uint64_t)(num_dig(d, i) - '0');
    for (size_t i = 0; i < num_len(x); i++) r = (r * 10 + (uint64_t)(num_dig(x, i) - '0')) % p;
    uint64_t k = (uint64_t)(e - f), base = 10 % p, pw = 1 % p;
    while (k) {
        if (k & 1) pw = mulmod(pw, base, p);
        base = mulmod(base, base, p);
        k >>= 1;
    }
    *ok = mulmod(r, pw, p) == 0;
    return KEEL_OK;
}

static bool num_is_int(const jn_num *x)
{
    return x->zero || x->adj >= (int64_t)num_len(x);
}

static keel_status parse_const(const char *t, const char *what, jn_num *x, char *err)
{
    if (!t || !num_parse(t, strlen(t), x))
        return base_err(err, KEEL_EINVAL, "%s '%s' is not a decimal number", what, t ? t : "(null)");
    return KEEL_OK;
}

keel_status jnum_test(const jnum_spec *s, const char *text, bool *ok, char *err)
{
    jn_num x, c;
    keel_status st;
    *ok = false;
    if (!num_parse(text, strlen(text), &x)) return base_err(err, KEEL_EINVAL, "'%s' is not a JSON number", text);
    bool good = s->kind == JNUM_INT ? num_is_int(&x) : s->kind == JNUM_FRAC ? !num_is_int(&x) : true;
    for (int i = 0; i < s->n_lo; i++) {
        if ((st = parse_const(s->lo[i], "minimum", &c, err))) return st;
        int r = num_cmp(&x, &c);
        good = good && (s->lo_excl[i] ? r > 0 : r >= 0);
    }
    for (int i = 0; i < s->n_hi; i++) {
        if ((st = parse_const(s->hi[i], "maximum", &c, err))) return st;
        int r = num_cmp(&x, &c);
        good = good && (s->hi_excl[i] ? r < 0 : r <= 0);
    }
    for (int i = 0; i < s->n_mult + s->n_not_mult; i++) {
        bool neg = i >= s->n_mult, m = false;
        const char *t = neg ? s->not_mult[i - s->n_mult] : s->mult[i];
        if ((st = parse_const(t, "multipleOf", &c, err))) return st;
        if ((st = num_is_mult(&x, &c, t, &m, err))) return st;
        good = good && m != neg;
    }
    for (size_t i = 0; i < s->n_except; i++) {
        if ((st = parse_const(s->except[i], "excluded value", &c, err))) return st;
        good = good && num_cmp(&x, &c) != 0;
    }
    *ok = good;
    return KEEL_OK;
}

/* ---- jnum_text ---------------------------------------------------------------------- */

bool jnum_text(const json_t *v, char *out)
{
    if (json_is_integer(v)) {
        int n = snprintf(out, JNUM_TEXT_CAP, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return n > 0 && n < JNUM_TEXT_CAP;
    }
    if (!json_is_real(v)) return false;
    double d = json_real_value(v);
    if (!isfinite(d)) return false;
    if (d == 0) {
        strcpy(out, "0");
        return true;
    }
    char e[64];
    for (int p = 1; p <= 17; p++) {
        snprintf(e, sizeof e, "%.*e", p - 1, d);
        if (strtod(e, NULL) == d) break;
    }
    /* e: -?D(.DDD)?e[+-]XX (any radix character is skipped) */
    char dig[24];
    size_t nd = 0;
    const char *q = e;
    bool neg = *q == '-';
    if (neg) q++;
    for (; *q && *q != 'e'; q++)
        if (is_digit(*q) && nd < sizeof dig) dig[nd++] = *q;
    if (*q != 'e' || !nd) return false;
    long ex = strtol(q + 1, NULL, 10); /* value = d0.d1d2... * 10^ex */
    while (nd > 1 && dig[nd - 1] == '0') nd--;
    size_t o = 0;
    if (neg) out[o++] = '-';
    if (ex >= 0) {
        if ((size_t)ex + nd + 4 >= JNUM_TEXT_CAP) return false;
        for (long i = 0; i <= ex; i++) out[o++] = (size_t)i < nd ? dig[i] : '0';
        if ((size_t)ex + 1 < nd) {
            out[o++] = '.';
            for (size_t i = (size_t)ex + 1; i < nd; i++) out[o++] = dig[i];
        }
    } else {
        if ((size_t)(-ex) + nd + 4 >= JNUM_TEXT_CAP) return false;
        out[o++] = '0';
        out[o++] = '.';
        for (long i = 1; i < -ex; i++) out[o++] = '0';
        for (size_t i = 0; i < nd; i++) out[o++] = dig[i];
    }
    out[o] = 0;
    return true;
}

/* ---- components --------------------------------------------------------------------- */

enum { JN_SYN, JN_CMP, JN_MUL };
enum { JN_LT = 0, JN_EQ = 1, JN_GT = 2 };
/* syn states */
enum { SY_START, SY_MINUS, SY_ZERO, SY_INT, SY_DOT, SY_FRAC0, SY_FRAC1, SY_DEAD = 255 };

typedef struct jn_comp {
    int type;                /* JN_* */
    /* JN_SYN */
    int kind;                /* JNUM_* */
    /* JN_CMP: the constant written without exponent */
    char *buf;               /* [L + F + 1]: integer digits then fraction digits; owned */
    uint32_t L, F;           /* integer digits (no leading zeros, 0 for |c| < 1), fraction digits (no trailing zeros) */
    bool c_neg, c_zero;
    bool eq_only;            /* only EQ / not EQ matters: collapse the rest */
    uint8_t ok_mask;         /* bit r: result r (JN_LT, JN_EQ, JN_GT) is accepted */
    /* JN_MUL: value * 10^q is an integer multiple of p */
    uint32_t p, q;
    uint32_t *pw;            /* [q + 1] 10^i mod p; owned */
    bool negate;             /* not_mult: accept the non-multiples */
} jn_comp;

/* cmp states: 2 * mag + (x negative). mag: INT(k, lex) = 3k + lex for k
 * integer digits read (0..L) and lex their comparison with c's first k;
 * LONGER (more integer digits than c); FRAC(j) (equal so far, j fraction
 * digits read, 0..F); FIX_LT; FIX_GT. */
static uint32_t cmp_longer(const jn_comp *c)
{
    return 3 * (c->L + 1);
}
static uint32_t cmp_frac(const jn_comp *c, uint32_t j)
{
    return 3 * (c->L + 1) + 1 + j;
}
static uint32_t cmp_fix(const jn_comp *c, int r)
{
    return 3 * (c->L + 1) + c->F + 2 + (r == JN_GT);
}

static uint32_t cmp_step(const jn_comp *c, uint32_t st, int sym)
{
    uint32_t neg = st & 1, m = st >> 1, lon = cmp_longer(c);
    if (sym == JN_SYM_MINUS) return m << 1 | 1;
    if (m < lon) {
        uint32_t k = m / 3, lex = m % 3;
        if (sym == JN_SYM_DOT) {
            if (k < c->L || lex == JN_LT) m = cmp_fix(c, JN_LT);
            else m = lex == JN_GT ? cmp_fix(c, JN_GT) : cmp_frac(c, 0);
        } else if (k == 0 && sym == 0) {
            /* the integer part "0": no significant digit */
        } else if (k < c->L) {
            uint32_t d = (uint32_t)sym, cd = (uint32_t)(c->buf[k] - '0');
            if (lex == JN_EQ) lex = d < cd ? JN_LT : d > cd ? JN_GT : JN_EQ;
            m = 3 * (k + 1) + lex;
        } else {
            m = lon;
        }
    } else if (m == lon) {
        if (sym == JN_SYM_DOT) m = cmp_fix(c, JN_GT);
    } else if (m < cmp_fix(c, JN_LT) && sym != JN_SYM_DOT) {
        uint32_t j = m - cmp_frac(c, 0), d = (uint32_t)sym;
        if (j < c->F) {
            uint32_t cd = (uint32_t)(c->buf[c->L + j] - '0');
            m = d < cd ? cmp_fix(c, JN_LT) : d > cd ? cmp_fix(c, JN_GT) : m + 1;
        } else if (d != 0) {
            m = cmp_fix(c, JN_GT);
        }
    }
    if (c->eq_only) {
        /* once the prefix differs from c it never equals c: one state */
        bool ne = (!c->c_zero && neg != c->c_neg) || m == lon || m >= cmp_fix(c, JN_LT) ||
                  (m < lon && m % 3 != JN_EQ);
        if (ne) return cmp_fix(c, JN_GT) << 1;
    }
    return m << 1 | neg;
}

/* The comparison of the whole text (state st) with c: JN_LT, JN_EQ, JN_GT. */
static int cmp_result(const jn_comp *c, uint32_t st)
{
    uint32_t neg = st & 1, m = st >> 1, lon = cmp_longer(c);
    int mag;
    if (m < lon) {
        uint32_t k = m / 3, lex = m % 3;
        mag = k < c->L ? JN_LT : lex != JN_EQ ? (int)lex : c->F ? JN_LT : JN_EQ;
    } else if (m == lon) {
        mag = JN_GT;
    } else if (m < cmp_fix(c, JN_LT)) {
        mag = m - cmp_frac(c, 0) < c->F ? JN_LT : JN_EQ;
    } else {
        mag = m == cmp_fix(c, JN_LT) ? JN_LT : JN_GT;
    }
    if (c->eq_only && m == cmp_fix(c, JN_GT)) return JN_GT; /* collapsed: not equal */
    if (!c->c_neg) return !neg ? mag : (c->c_zero && mag == JN_EQ) ? JN_EQ : JN_LT;
    return !neg ? JN_GT : 2 - mag;
}

/* mul states: INT(r) = r; FRAC(j, r) = p (1 + j) + r for j fraction digits
 * read (0..q); FAIL = p (q + 2): a nonzero digit past the q-th. */
static uint32_t mul_step(const jn_comp *c, uint32_t st, int sym)
{
    uint32_t p = c->p, fail = p * (c->q + 2);
    if (st == fail || sym == JN_SYM_MINUS) return st;
    uint32_t j, r;
    if (st < p) {
        if (sym != JN_SYM_DOT) return (st * 10 + (uint32_t)sym) % p;
        j = 0, r = st;
    } else {
        if (sym == JN_SYM_DOT) return st;
        j = st / p - 1, r = st % p;
        if (j == c->q) return sym == 0 ? st : fail;
        j++, r = (r * 10 + (uint32_t)sym) % p;
    }
    /* past q fraction digits the residue is final: not 0 is as good as FAIL
     * (only zeros may follow, and the number is not a multiple either way) */
    return j == c->q && r ? fail : p * (j + 1) + r;
}

static bool mul_accept(const jn_comp *c, uint32_t st)
{
    uint32_t p = c->p, fail = p * (c->q + 2);
    bool m;
    if (st == fail) m = false;
    else if (st < p) m = (uint64_t)st * c->pw[c->q] % p == 0;
    else m = (uint64_t)(st % p) * c->pw[c->q - (st / p - 1)] % p == 0;
    return m != c->negate;
}

static uint32_t syn_step(int kind, uint32_t st, int sym)
{
    bool dig = sym < 10, nz = sym >= 1 && sym <= 9;
    switch (st) {
    case SY_START:
        if (sym == JN_SYM_MINUS) return SY_MINUS;
        /* fallthrough */
    case SY_MINUS: return sym == 0 ? SY_ZERO : nz ? SY_INT : SY_DEAD;
    case SY_ZERO: return sym == JN_SYM_DOT ? SY_DOT : SY_DEAD;
    case SY_INT: return dig ? SY_INT : sym == JN_SYM_DOT ? SY_DOT : SY_DEAD;
    case SY_DOT:
    case SY_FRAC0:
        if (sym == 0) return SY_FRAC0;
        return nz ? (kind == JNUM_INT ? SY_DEAD : SY_FRAC1) : SY_DEAD;
    case SY_FRAC1: return dig ? SY_FRAC1 : SY_DEAD;
    default: return SY_DEAD;
    }
}

static bool syn_accept(int kind, uint32_t st)
{
    bool is_int = st == SY_ZERO || st == SY_INT || st == SY_FRAC0;
    return kind == JNUM_INT ? is_int : kind == JNUM_FRAC ? st == SY_FRAC1 : is_int || st == SY_FRAC1;
}

static void comp_free(jn_comp *c)
{
    if (c->type == JN_CMP) base_free(c->buf, (size_t)c->L + c->F + 1);
    if (c->type == JN_MUL) base_free(c->pw, ((size_t)c->q + 1) * sizeof *c->pw);
}

static keel_status comp_cmp(jn_comp *c, const char *text, const char *what, uint8_t ok_mask, bool eq_only, char *err)
{
    jn_num x;
    keel_status st = parse_const(text, what, &x, err);
    if (st) return st;
    size_t n = num_len(&x);
    if (x.adj > (int64_t)JN_MAX_DIGITS || -x.adj + (int64_t)n > (int64_t)JN_MAX_DIGITS)
        return base_err(err, KEEL_EUNSUPPORTED, "%s %s has too many digits (at most %u without an exponent)", what,
                        text, JN_MAX_DIGITS);
    uint32_t L = x.adj > 0 ? (uint32_t)x.adj : 0;
    uint32_t F = x.adj >= (int64_t)n ? 0 : (uint32_t)((int64_t)n - x.adj);
    char *buf = base_alloc((size_t)L + F + 1);
    if (!buf) return base_err(err, KEEL_ENOMEM, "out of memory");
    for (uint32_t i = 0; i < L; i++) buf[i] = num_dig(&x, i);
    for (uint32_t j = 0; j < F; j++) {
        int64_t i = x.adj + (int64_t)j; /* significant digit index of fraction digit j */
        buf[L + j] = i < 0 ? '0' : num_dig(&x, (size_t)i);
    }
    buf[L + F] = 0;
    *c = (jn_comp){.type = JN_CMP, .buf = buf, .L = L, .F = F, .c_neg = x.neg, .c_zero = x.zero, .eq_only = eq_only,
                   .ok_mask = ok_mask};
    return KEEL_OK;
}

static keel_status comp_mul(jn_comp *c, const char *text, bool negate, int kind, char *err)
{
    jn_num d;
    keel_status st = parse_const(text, "multipleOf", &d, err);
    if (st) return st;
    if (d.zero || d.neg) return base_err(err, KEEL_EINVAL, "multipleOf %s is not greater than 0", text);
    size_t n = num_len(&d);
    int64_t f = d.adj - (int64_t)n; /* d = P * 10^f */
    if (f < -(int64_t)JN_MAX_DIGITS)
        return base_err(err, KEEL_EUNSUPPORTED, "multipleOf %s has too many digits", text);
    uint64_t p = 0;
    for (size_t i = 0; i < n + (size_t)(f > 0 ? f : 0); i++) {
        p = p * 10 + (uint64_t)(num_dig(&d, i) - '0');
        if (p > JN_MAX_RESIDUES) break;
    }
    uint32_t q = f < 0 ? (uint32_t)-f : 0;
    if (kind == JNUM_INT && p <= JN_MAX_RESIDUES) {
        /* an integer x: x * 10^q = 0 mod p  <=>  x = 0 mod p / gcd(p, 10^q) */
        for (uint32_t i = 0; i < q && p % 2 == 0; i++) p /= 2;
        for (uint32_t i = 0; i < q && p % 5 == 0; i++) p /= 5;
        q = 0;
    }
    if (p > JN_MAX_RESIDUES)
        return base_err(err, KEEL_ERANGE, "multipleOf %s needs more than %u residue states (p of p / 10^q)", text,
                        JN_MAX_RESIDUES);
    if ((uint64_t)p * (q + 2) + 1 > JN_MAX_STATES) /* residues at each of q fraction digits */
        return base_err(err, KEEL_ERANGE, "numeric constraints need more than %u automaton states (multipleOf %s)",
                        JN_MAX_STATES, text);
    uint32_t *pw = base_alloc(((size_t)q + 1) * sizeof *pw);
    if (!pw) return base_err(err, KEEL_ENOMEM, "out of memory");
    pw[0] = (uint32_t)(1 % p);
    for (uint32_t i = 1; i <= q; i++) pw[i] = (uint32_t)((uint64_t)pw[i - 1] * 10 % p);
    *c = (jn_comp){.type = JN_MUL, .p = (uint32_t)p, .q = q, .pw = pw, .negate = negate};
    return KEEL_OK;
}

/* A component state whose verdict no further input changes: +1 accepted
 * (the product keeps JN_TRUE there, so states that differ only in how a
 * settled component got settled are one), -1 rejected (the product state
 * is dead), 0 still open. */
static int comp_settled(const jn_comp *c, uint32_t st)
{
    if (c->type == JN_CMP) {
        uint32_t m = st >> 1;
        if (m != cmp_longer(c) && m < cmp_fix(c, JN_LT)) return 0;
        return (c->ok_mask >> cmp_result(c, st)) & 1 ? 1 : -1;
    }
    if (c->type == JN_MUL && st == c->p * (c->q + 2)) return c->negate ? 1 : -1;
    return 0;
}

static uint32_t comp_step(const jn_comp *c, uint32_t st, int sym)
{
    if (st == JN_TRUE) return JN_TRUE;
    if (c->type == JN_SYN) return syn_step(c->kind, st, sym);
    return c->type == JN_CMP ? cmp_step(c, st, sym) : mul_step(c, st, sym);
}

static bool comp_accept(const jn_comp *c, uint32_t st)
{
    if (st == JN_TRUE) return true;
    if (c->type == JN_SYN) return syn_accept(c->kind, st);
    if (c->type == JN_CMP) return (c->ok_mask >> cmp_result(c, st)) & 1;
    return mul_accept(c, st);
}

/* ---- the product automaton ------------------------------------------------------- */

typedef struct jn_dfa {
    const jn_comp *comp;
    uint32_t n_comp;
    uint32_t *tup;       /* [cap][n_comp] component states of each product state */
    uint32_t *next;      /* [cap][JN_N_SYM] target state or JN_NONE */
    uint32_t n, cap;
    uint32_t max_n;      /* JN_MAX_STATES, less when tuples are long (JN_MAX_TUPLE_BYTES) */
    uint32_t *hash;      /* [n_hash] state + 1, 0: empty */
    uint32_t n_hash;     /* power of two, > 2 n */
} jn_dfa;

static void dfa_free(jn_dfa *a)
{
    base_free(a->tup, (size_t)a->cap * a->n_comp * sizeof *a->tup);
    base_free(a->next, (size_t)a->cap * JN_N_SYM * sizeof *a->next);
    base_free(a->hash, (size_t)a->n_hash * sizeof *a->hash);
}

static uint32_t tup_hash(const uint32_t *t, uint32_t n)
{
    return (uint32_t)base_hash64(t, (size_t)n * sizeof *t, 0x6a6e756dULL);
}

static keel_status dfa_rehash(jn_dfa *a, uint32_t n_hash, char *err)
{
    uint32_t *h = base_calloc(n_hash, sizeof *h);
    if (!h) return base_err(err, KEEL_ENOMEM, "out of memory");
    for (uint32_t i = 0; i < a->n; i++) {
        uint32_t k = tup_hash(a->tup + (size_t)i * a->n_comp, a->n_comp) & (n_hash - 1);
        while (h[k]) k = (k + 1) & (n_hash - 1);
        h[k] = i + 1;
    }
    base_free(a->hash, (size_t)a->n_hash * sizeof *a->hash);
    a->hash = h, a->n_hash = n_hash;
    return KEEL_OK;
}

/* The id of tuple t, added when new. */
static keel_status dfa_intern(jn_dfa *a, const uint32_t *t, uint32_t *id, char *err)
{
    size_t tb = (size_t)a->n_comp * sizeof *t;
    uint32_t k = tup_hash(t, a->n_comp) & (a->n_hash - 1);
    for (; a->hash[k]; k = (k + 1) & (a->n_hash - 1))
        if (!memcmp(a->tup + (size_t)(a->hash[k] - 1) * a->n_comp, t, tb)) {
            *id = a->hash[k] - 1;
            return KEEL_OK;
        }
    if (a->n == a->max_n)
        return base_err(err, KEEL_ERANGE, "numeric constraints need more than %u automaton states", a->max_n);
    if (a->n == a->cap) {
        uint32_t cap = a->cap * 2;
        size_t nb = (size_t)a->cap * JN_N_SYM * sizeof *a->next;
        uint32_t *tup = base_alloc((size_t)cap * tb), *next = base_alloc(2 * nb);
        if (!tup || !next) {
            base_free(tup, (size_t)cap * tb);
            base_free(next, 2 * nb);
            return base_err(err, KEEL_ENOMEM, "out of memory");
        }
        memcpy(tup, a->tup, (size_t)a->cap * tb);
        memcpy(next, a->next, nb);
        base_free(a->tup, (size_t)a->cap * tb);
        base_free(a->next, nb);
        a->tup = tup, a->next = next, a->cap = cap;
    }
    memcpy(a->tup + (size_t)a->n * a->n_comp, t, tb);
    a->hash[k] = a->n + 1;
    *id = a->n++;
    if ((uint64_t)a->n * 2 >= a->n_hash) return dfa_rehash(a, a->n_hash * 2, err);
    return KEEL_OK;
}

/* Breadth-first over the reachable tuples; state 0 is the start. */
static keel_status dfa_build(jn_dfa *a, const jn_comp *comp, uint32_t n_comp, char *err)
{
    keel_status st;
    memset(a, 0, sizeof *a);
    a->comp = comp, a->n_comp = n_comp, a->cap = 256, a->n_hash = 1024;
    a->max_n = (uint32_t)BASE_MIN((size_t)JN_MAX_STATES, JN_MAX_TUPLE_BYTES / ((size_t)n_comp * sizeof *a->tup));
    a->tup = base_alloc((size_t)a->cap * n_comp * sizeof *a->tup);
    a->next = base_alloc((size_t)a->cap * JN_N_SYM * sizeof *a->next);
    a->hash = base_calloc(a->n_hash, sizeof *a->hash);
    uint32_t *t = base_alloc((size_t)n_comp * sizeof *t);
    if (!a->tup || !a->next || !a->hash || !t) {
        st = base_err(err, KEEL_ENOMEM, "out of memory");
        goto done;
    }
    uint32_t id;
    for (uint32_t c = 0; c < n_comp; c++) t[c] = comp[c].type == JN_CMP ? (uint32_t)JN_EQ << 1 : 0; /* INT(0, EQ) */
    if ((st = dfa_intern(a, t, &id, err))) goto done;
    for (uint32_t i = 0; i < a->n; i++) {
        for (int sym = 0; sym < JN_N_SYM; sym++) {
            const uint32_t *from = a->tup + (size_t)i * n_comp;
            uint32_t to = JN_NONE;
            t[0] = syn_step(comp[0].kind, from[0], sym);
            if (t[0] != SY_DEAD) {
                bool dead = false;
                for (uint32_t c = 1; c < n_comp && !dead; c++) {
                    t[c] = comp_step(&comp[c], from[c], sym);
                    int v = t[c] == JN_TRUE ? 0 : comp_settled(&comp[c], t[c]);
                    if (v > 0) t[c] = JN_TRUE;
                    dead = v < 0;
                }
                if (!dead && (st = dfa_intern(a, t, &to, err))) goto done;
            }
            a->next[(size_t)i * JN_N_SYM + (size_t)sym] = to;
        }
    }
    st = KEEL_OK;
done:
    base_free(t, (size_t)n_comp * sizeof *t);
    return st;
}

static bool dfa_accept(const jn_dfa *a, uint32_t i)
{
    const uint32_t *t = a->tup + (size_t)i * a->n_comp;
    for (uint32_t c = 0; c < a->n_comp; c++)
        if (!comp_accept(&a->comp[c], t[c])) return false;
    return true;
}

/* ---- trimming and minimization ------------------------------------------------------- */

/* live[i]: an accepting state is reachable from i (reverse reachability
 * from the accepting states, over in-edge lists). */
static keel_status dfa_live(const jn_dfa *a, uint8_t *live, char *err)
{
    size_t n_edges = (size_t)a->n * JN_N_SYM;
    uint32_t *first = base_calloc((size_t)a->n + 1, sizeof *first);
    uint32_t *src = base_alloc(n_edges * sizeof *src);
    uint32_t *queue = base_alloc((size_t)a->n * sizeof *queue);
    keel_status st = KEEL_OK;
    if (!first || !src || !queue) {
        st = base_err(err, KEEL_ENOMEM, "out of memory");
        goto done;
    }
    for (size_t e = 0; e < n_edges; e++)
        if (a->next[e] != JN_NONE) first[a->next[e] + 1]++;
    for (uint32_t i = 0; i < a->n; i++) first[i + 1] += first[i];
    for (size_t e = 0; e < n_edges; e++) /* first[t] walks to the end of t's list; shifted back below */
        if (a->next[e] != JN_NONE) src[first[a->next[e]]++] = (uint32_t)(e / JN_N_SYM);
    for (uint32_t i = a->n; i > 0; i--) first[i] = first[i - 1];
    first[0] = 0;
    uint32_t nq = 0;
    for (uint32_t i = 0; i < a->n; i++) {
        live[i] = dfa_accept(a, i);
        if (live[i]) queue[nq++] = i;
    }
    for (uint32_t h = 0; h < nq; h++)
        for (uint32_t e = first[queue[h]]; e < first[queue[h] + 1]; e++)
            if (!live[src[e]]) live[src[e]] = 1, queue[nq++] = src[e];
done:
    base_free(first, ((size_t)a->n + 1) * sizeof *first);
    base_free(src, n_edges * sizeof *src);
    base_free(queue, (size_t)a->n * sizeof *queue);
    return st;
}

/* Hopcroft's partition refinement, O(n log n) per symbol: cls[i] is the
 * class of state i (JN_NONE for states from which nothing is accepted),
 * *n_cls the count. A sink (index n) stands for every missing transition,
 * so the automaton is complete; the states that are not live end up in
 * its class. Blocks are ranges of elem[]; marking a state moves it to the
 * front of its block; a block split by a splitter keeps the unmarked part.
 * A popped splitter is copied first: it may be split while it is used. */
static keel_status dfa_minimize(const jn_dfa *a, const uint8_t *live, uint32_t *cls, uint32_t *n_cls, char *err)
{
    uint32_t n = a->n + 1, sink = a->n, nb = 0, nw = 0;
    size_t n_keys = (size_t)n * JN_N_SYM; /* inverse edges keyed by (symbol, target) */
    uint32_t *ifirst = base_calloc(n_keys + 1, sizeof *ifirst);
    uint32_t *isrc = base_alloc(n_keys * sizeof *isrc);
    uint32_t *mem = base_alloc((size_t)n * 10 * sizeof *mem);
    keel_status st = KEEL_OK;
    if (!ifirst || !isrc || !mem) {
        st = base_err(err, KEEL_ENOMEM, "out of memory");
        goto done;
    }
    uint32_t *elem = mem, *loc = mem + n, *blk = mem + 2 * (size_t)n, *bfirst = mem + 3 * (size_t)n,
             *bend = mem + 4 * (size_t)n, *bmark = mem + 5 * (size_t)n, *work = mem + 6 * (size_t)n,
             *touched = mem + 7 * (size_t)n, *tmp = mem + 8 * (size_t)n, *inw = mem + 9 * (size_t)n;
    for (uint32_t i = 0; i < n; i++)
        for (int y = 0; y < JN_N_SYM; y++) {
            uint32_t t = i == sink ? JN_NONE : a->next[(size_t)i * JN_N_SYM + (size_t)y];
            ifirst[(size_t)y * n + (t == JN_NONE ? sink : t) + 1]++;
        }
    for (size_t k = 0; k < n_keys; k++) ifirst[k + 1] += ifirst[k];
    for (uint32_t i = 0; i < n; i++) /* ifirst[k] walks to the end of k's list; shifted back below */
        for (int y = 0; y < JN_N_SYM; y++) {
            uint32_t t = i == sink ? JN_NONE : a->next[(size_t)i * JN_N_SYM + (size_t)y];
            isrc[ifirst[(size_t)y * n + (t == JN_NONE ? sink : t)]++] = i;
        }
    for (size_t k = n_keys; k > 0; k--) ifirst[k] = ifirst[k - 1];
    ifirst[0] = 0;
    /* the first partition: accepting live states, the rest */
    uint32_t ne = 0;
    for (int pass = 0; pass < 2; pass++) {
        uint32_t start = ne;
        for (uint32_t i = 0; i < n; i++) {
            bool acc = i != sink && live[i] && dfa_accept(a, i);
            if (acc != (pass == 0)) continue;
            elem[ne] = i, loc[i] = ne++, blk[i] = nb;
        }
        if (ne == start) continue;
        bfirst[nb] = start, bend[nb] = ne, bmark[nb] = 0;
        inw[nb] = 1, work[nw++] = nb++;
    }
    while (nw) {
        uint32_t s = work[--nw], ns = bend[s] - bfirst[s];
        inw[s] = 0;
        memcpy(tmp, elem + bfirst[s], (size_t)ns * sizeof *tmp);
        for (int y = 0; y < JN_N_SYM; y++) {
            uint32_t n_touched = 0;
            for (uint32_t j = 0; j < ns; j++) {
                size_t key = (size_t)y * n + tmp[j];
                for (uint32_t e = ifirst[key]; e < ifirst[key + 1]; e++) {
                    uint32_t p = isrc[e], b = blk[p], at = bfirst[b] + bmark[b];
                    if (loc[p] < at) continue; /* marked already */
                    if (!bmark[b]) touched[n_touched++] = b;
                    uint32_t q = elem[at]; /* swap p into the marked front */
                    elem[at] = p, elem[loc[p]] = q;
                    loc[q] = loc[p], loc[p] = at;
                    bmark[b]++;
                }
            }
            for (uint32_t k = 0; k < n_touched; k++) {
                uint32_t b = touched[k], m = bmark[b];
                bmark[b] = 0;
                if (m == bend[b] - bfirst[b]) continue;
                uint32_t c = nb++;
                bfirst[c] = bfirst[b], bend[c] = bfirst[b] + m, bmark[c] = 0;
                bfirst[b] = bend[c];
                for (uint32_t e = bfirst[c]; e < bend[c]; e++) blk[elem[e]] = c;
                uint32_t push = inw[b] || m < bend[b] - bfirst[b] ? c : b;
                inw[c] = 0;
                if (!inw[push]) inw[push] = 1, work[nw++] = push;
            }
        }
    }
    /* dense class ids, the sink's block excluded */
    uint32_t count = 0;
    for (uint32_t b = 0; b < nb; b++) tmp[b] = JN_NONE;
    for (uint32_t i = 0; i < a->n; i++) {
        if (!live[i] || blk[i] == blk[sink]) {
            cls[i] = JN_NONE;
            continue;
        }
        if (tmp[blk[i]] == JN_NONE) tmp[blk[i]] = count++;
        cls[i] = tmp[blk[i]];
    }
    *n_cls = count;
done:
    base_free(ifirst, (n_keys + 1) * sizeof *ifirst);
    base_free(isrc, n_keys * sizeof *isrc);
    base_free(mem, (size_t)n * 10 * sizeof *mem);
    return st;
}

/* ---- GBNF output ---------------------------------------------------------------------- */

typedef struct jn_buf {
    char *p;
    size_t n, cap;
    keel_status st;
} jn_buf;

static void bputf(jn_buf *b, const char *fmt, ...) BASE_PRINTF(2, 3);
static void bputf(jn_buf *b, const char *fmt, ...)
{
    if (b->st) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->st = KEEL_EINTERNAL;
            return;
        }
        if (b->p && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        size_t cap = BASE_MAX(b->cap * 2, b->n + (size_t)k + 256);
        if (cap > JN_MAX_OUT) {
            b->st = KEEL_ERANGE;
            return;
        }
        char *p = base_realloc(b->p, b->cap, cap);
        if (!p) {
            b->st = KEEL_ENOMEM;
            return;
        }
        b->p = p, b->cap = cap;
    }
}

/* Hands the text over as *n_out + 1 bytes (the size the caller frees). */
static keel_status buf_finish(jn_buf *b, char **out, size_t *n_out, char *err)
{
    char *p = base_realloc(b->p, b->cap, b->n + 1);
    if (!p) return base_err(err, KEEL_ENOMEM, "out of memory");
    *out = p, *n_out = b->n;
    b->p = NULL, b->n = b->cap = 0;
    return KEEL_OK;
}

/* The digits of mask (bit d: digit d) as a class body: "0-35" etc. */
static void put_digits(jn_buf *b, uint32_t mask)
{
    int n = 0;
    for (int d = 0; d < 10; d++) n += (mask >> d) & 1;
    if (n == 1) {
        for (int d = 0; d < 10; d++)
            if ((mask >> d) & 1) bputf(b, "\"%d\"", d);
        return;
    }
    bputf(b, "[");
    for (int d = 0; d < 10;) {
        if (!((mask >> d) & 1)) {
            d++;
            continue;
        }
        int e = d;
        while (e + 1 < 10 && ((mask >> (e + 1)) & 1)) e++;
        if (e == d) bputf(b, "%d", d);
        else if (e == d + 1) bputf(b, "%d%d", d, e);
        else bputf(b, "%d-%d", d, e);
        d = e + 1;
    }
    bputf(b, "]");
}

/* One rule per class, numbered in breadth-first order from the start
 * (class of state 0, rule `name`). A class that accepts and has no
 * transition is inlined (its references vanish). */
static keel_status dfa_emit(const jn_dfa *a, const uint32_t *cls, uint32_t n_cls, const char *name, jn_buf *b,
                            char *err)
{
    uint32_t *rep = base_alloc((size_t)n_cls * sizeof *rep);   /* a state of each class */
    uint32_t *order = base_alloc((size_t)n_cls * sizeof *order); /* rule number of each class, JN_NONE unseen */
    uint32_t *queue = base_alloc((size_t)n_cls * sizeof *queue);
    keel_status st = KEEL_OK;
    if (!rep || !order || !queue) {
        st = base_err(err, KEEL_ENOMEM, "out of memory");
        goto done;
    }
    for (uint32_t k = 0; k < n_cls; k++) order[k] = JN_NONE;
    for (uint32_t i = a->n; i-- > 0;)
        if (cls[i] != JN_NONE) rep[cls[i]] = i;
    uint32_t nq = 0, n_rules = 0;
    order[cls[0]] = n_rules++;
    queue[nq++] = cls[0];
    for (uint32_t h = 0; h < nq; h++) {
        uint32_t k = queue[h], s = rep[k];
        const uint32_t *nx = a->next + (size_t)s * JN_N_SYM;
        if (order[k]) bputf(b, "%s-%u ::= ", name, order[k]);
        else bputf(b, "%s ::= ", name);
        bool first = true;
        uint32_t done_mask = 0;
        for (int y = 0; y < JN_N_SYM; y++) {
            uint32_t t = nx[y];
            if (t == JN_NONE || cls[t] == JN_NONE || ((done_mask >> y) & 1)) continue;
            uint32_t tk = cls[t], dmask = 0;
            bool dot = false, minus = false;
            for (int z = y; z < JN_N_SYM; z++) {
                if (nx[z] == JN_NONE || cls[nx[z]] != tk) continue;
                done_mask |= 1u << z;
                if (z < 10) dmask |= 1u << z;
                else if (z == JN_SYM_DOT) dot = true;
                else minus = true;
            }
            const uint32_t *tn = a->next + (size_t)rep[tk] * JN_N_SYM;
            bool terminal = dfa_accept(a, rep[tk]);
            for (int z = 0; terminal && z < JN_N_SYM; z++)
                if (tn[z] != JN_NONE && cls[tn[z]] != JN_NONE) terminal = false;
            if (!terminal && order[tk] == JN_NONE) {
                order[tk] = n_rules++;
                queue[nq++] = tk;
            }
            /* digits, '.' and '-' to the same class: one alternative per kind of symbol */
            for (int part = 0; part < 3; part++) {
                if ((part == 0 && !dmask) || (part == 1 && !dot) || (part == 2 && !minus)) continue;
                bputf(b, "%s", first ? "" : " | ");
                first = false;
                if (part == 0) put_digits(b, dmask);
                else bputf(b, part == 1 ? "\".\"" : "\"-\"");
                if (terminal) continue;
                if (order[tk]) bputf(b, " %s-%u", name, order[tk]);
                else bputf(b, " %s", name);
            }
        }
        if (dfa_accept(a, s)) bputf(b, "%s\"\"", first ? "" : " | ");
        bputf(b, "\n");
    }
    if (b->st == KEEL_ERANGE) st = base_err(err, b->st, "numeric grammar longer than %u bytes", JN_MAX_OUT);
    else if (b->st) st = base_err(err, b->st, "out of memory");
done:
    base_free(rep, (size_t)n_cls * sizeof *rep);
    base_free(order, (size_t)n_cls * sizeof *order);
    base_free(queue, (size_t)n_cls * sizeof *queue);
    return st;
}

/* ---- jnum_gbnf ------------------------------------------------------------------------ */

/* Index of the tightest of n bounds: the largest (lower) or smallest
 * (upper); on a tie the exclusive one. -1 for none. */
static keel_status tightest(const char *const *v, const bool *excl, int n, bool lower, int *best, char *err)
{
    jn_num x, y;
    keel_status st;
    *best = -1;
    for (int i = 0; i < n; i++) {
        if ((st = parse_const(v[i], lower ? "minimum" : "maximum", &x, err))) return st;
        if (*best < 0) {
            *best = i;
            continue;
        }
        if ((st = parse_const(v[*best], lower ? "minimum" : "maximum", &y, err))) return st;
        int c = num_cmp(&x, &y);
        if ((lower ? c > 0 : c < 0) || (c == 0 && excl[i])) *best = i;
    }
    return KEEL_OK;
}

keel_status jnum_gbnf(const jnum_spec *s, const char *name, char **out, size_t *n_out, bool *empty, char *err)
{
    *out = NULL, *n_out = 0, *empty = false;
    if (s->kind < JNUM_ANY || s->kind > JNUM_FRAC || s->n_lo < 0 || s->n_lo > JNUM_MAX_ITEMS || s->n_hi < 0 ||
        s->n_hi > JNUM_MAX_ITEMS || s->n_mult < 0 || s->n_mult > JNUM_MAX_ITEMS || s->n_not_mult < 0 ||
        s->n_not_mult > JNUM_MAX_ITEMS || (s->n_except && !s->except))
        return base_err(err, KEEL_EINVAL, "numeric spec out of range");
    if (s->n_except > JN_MAX_EXCEPT)
        return base_err(err, KEEL_ERANGE, "more than %u excluded numbers", JN_MAX_EXCEPT);
    bool name_ok = name && name[0];
    for (const char *q = name; name_ok && *q; q++)
        name_ok = (*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') || is_digit(*q) || *q == '-' || *q == '_';
    if (!name_ok) return base_err(err, KEEL_EINVAL, "rule name '%s' is not [a-zA-Z0-9_-]+", name ? name : "(null)");
    jn_buf b = {0};
    keel_status st = KEEL_OK;
    bool none = !s->n_lo && !s->n_hi && !s->n_mult && !s->n_not_mult && !s->n_except;
    if (none && s->kind != JNUM_FRAC) {
        /* no constraint: JSON's own grammar (exponents included) */
        if (s->kind == JNUM_ANY)
            bputf(&b, "%s ::= \"-\"? (\"0\" | [1-9] [0-9]*) (\".\" [0-9]+)? ([eE] [-+]? [0-9]+)?\n", name);
        else
            bputf(&b, "%s ::= \"-\"? (\"0\" | [1-9] [0-9]*) (\".\" \"0\"+)?\n", name);
        if (b.st) return base_err(err, b.st, "out of memory");
        return buf_finish(&b, out, n_out, err);
    }
    size_t n_comp_cap = 3 + (size_t)s->n_mult + (size_t)s->n_not_mult + s->n_except;
    jn_comp *comp = base_calloc(n_comp_cap, sizeof *comp);
    uint32_t n_comp = 0;
    jn_dfa a = {0};
    uint8_t *live = NULL;
    uint32_t *cls = NULL, n_cls = 0;
    if (!comp) return base_err(err, KEEL_ENOMEM, "out of memory");
    comp[n_comp++] = (jn_comp){.type = JN_SYN, .kind = s->kind};
    int lo, hi;
    jn_num x, y;
    if ((st = tightest(s->lo, s->lo_excl, s->n_lo, true, &lo, err))) goto fail;
    if ((st = tightest(s->hi, s->hi_excl, s->n_hi, false, &hi, err))) goto fail;
    if (lo >= 0) {
        uint8_t m = s->lo_excl[lo] ? 1u << JN_GT : (1u << JN_GT | 1u << JN_EQ);
        if ((st = comp_cmp(&comp[n_comp], s->lo[lo], "minimum", m, false, err))) goto fail;
        n_comp++;
    }
    if (hi >= 0) {
        uint8_t m = s->hi_excl[hi] ? 1u << JN_LT : (1u << JN_LT | 1u << JN_EQ);
        if ((st = comp_cmp(&comp[n_comp], s->hi[hi], "maximum", m, false, err))) goto fail;
        n_comp++;
    }
    for (int i = 0; i < s->n_mult + s->n_not_mult; i++) {
        bool neg = i >= s->n_mult;
        if ((st = comp_mul(&comp[n_comp], neg ? s->not_mult[i - s->n_mult] : s->mult[i], neg, s->kind, err))) goto fail;
        n_comp++;
    }
    for (size_t i = 0; i < s->n_except; i++) {
        /* a value the rest of the spec refuses, or one excluded already, needs no component */
        jnum_spec base = *s;
        base.n_except = 0;
        bool keep = false;
        if ((st = parse_const(s->except[i], "excluded value", &x, err))) goto fail;
        if ((st = jnum_test(&base, s->except[i], &keep, err))) goto fail;
        for (size_t j = 0; keep && j < i; j++)
            if (num_parse(s->except[j], strlen(s->except[j]), &y) && num_cmp(&x, &y) == 0) keep = false;
        if (!keep) continue;
        if ((st = comp_cmp(&comp[n_comp], s->except[i], "excluded value", 1u << JN_LT | 1u << JN_GT, true, err)))
            goto fail;
        n_comp++;
    }
    if ((st = dfa_build(&a, comp, n_comp, err))) goto fail;
    live = base_alloc(a.n);
    cls = base_alloc((size_t)a.n * sizeof *cls);
    if (!live || !cls) {
        st = base_err(err, KEEL_ENOMEM, "out of memory");
        goto fail;
    }
    if ((st = dfa_live(&a, live, err))) goto fail;
    if (!live[0]) {
        *empty = true;
        goto fail; /* st is KEEL_OK: nothing to emit */
    }
    if ((st = dfa_minimize(&a, live, cls, &n_cls, err))) goto fail;
    if (n_cls > JN_MAX_RULES) {
        st = base_err(err, KEEL_ERANGE, "numeric constraints need %u grammar rules (at most %u)", n_cls, JN_MAX_RULES);
        goto fail;
    }
    if ((st = dfa_emit(&a, cls, n_cls, name, &b, err))) goto fail;
    st = buf_finish(&b, out, n_out, err);
fail:
    base_free(b.p, b.cap);
    base_free(live, a.n);
    base_free(cls, (size_t)a.n * sizeof *cls);
    dfa_free(&a);
    for (uint32_t i = 0; i < n_comp; i++) comp_free(&comp[i]);
    base_free(comp, n_comp_cap * sizeof *comp);
    return st;
}
