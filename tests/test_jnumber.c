/*
 * test_jnumber.c — src/grammar/jnumber.c: numbers under JSON Schema's
 * numeric keywords. jnum_text and jnum_cmp on fixed cases; jnum_test
 * against an independent reference (values scaled to 64-bit integers);
 * the grammar of jnum_gbnf against jnum_test on thousands of random texts
 * and random specs (bounds, divisors, kinds, exclusions from a set of
 * interesting decimals, 1e308 included); emptiness; refusals; the cases of
 * JSON-Schema-Test-Suite's numeric keywords (read from /tmp/jsts when
 * present); allocation failures.
 */
#include "testutil.h"
#include "gramtest.h"
#include "base/base.h"
#include "grammar/grammar.h"
#include "grammar/jnumber.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ---------------------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

static int rndn(int n)
{
    return (int)(rnd() % (uint64_t)n);
}

/* jnum_gbnf(s) as a compiled grammar (root ::= n); NULL with *empty set
 * when no number satisfies s. */
static gram *spec_gram(const jnum_spec *s, bool *empty, size_t *n_rules)
{
    char *out = NULL, err[BASE_ERR_CAP] = "";
    size_t n = 0;
    keel_status st = jnum_gbnf(s, "n", &out, &n, empty, err);
    if (st) fail_msg("jnum_gbnf: %s: %s", keel_status_name(st), err);
    if (*empty) {
        assert_null(out);
        return NULL;
    }
    assert_int_equal(strlen(out), n);
    if (n_rules) {
        *n_rules = 0;
        for (const char *p = out; (p = strstr(p, "::=")); p++) (*n_rules)++;
    }
    size_t len = n + 32;
    char *src = malloc(len);
    assert_non_null(src);
    snprintf(src, len, "root ::= n\n%s", out);
    base_free(out, n + 1);
    gram *g = NULL;
    st = gram_compile(src, strlen(src), &g, err);
    if (st) fail_msg("compile: %s: %s\n%s", keel_status_name(st), err, src);
    free(src);
    return g;
}

static bool test_ok(const jnum_spec *s, const char *text)
{
    bool ok = false;
    char err[BASE_ERR_CAP] = "";
    keel_status st = jnum_test(s, text, &ok, err);
    if (st) fail_msg("jnum_test %s: %s: %s", text, keel_status_name(st), err);
    return ok;
}

/* ---- jnum_text, jnum_cmp -------------------------------------------------------------- */

static void test_text(void **state)
{
    (void)state;
    static const struct {
        const char *json, *text;
    } cases[] = {
        {"5", "5"},
        {"-7", "-7"},
        {"9223372036854775807", "9223372036854775807"},
        {"0.0", "0"},
        {"-0.0", "0"},
        {"1.5", "1.5"},
        {"0.1", "0.1"},
        {"-2.75", "-2.75"},
        {"1e-5", "0.00001"},
        {"1.0e2", "100"},
        {"123.456", "123.456"},
        {"0.30000000000000004", "0.30000000000000004"},
        {"1e22", "10000000000000000000000"},
        {"0.123456789", "0.123456789"},
    };
    char out[JNUM_TEXT_CAP];
    for (size_t i = 0; i < BASE_ARRAY_LEN(cases); i++) {
        json_t *v = json_loads(cases[i].json, JSON_DECODE_ANY, NULL);
        assert_non_null(v);
        assert_true(jnum_text(v, out));
        assert_string_equal(out, cases[i].text);
        json_decref(v);
    }
    /* the extremes of double fit JNUM_TEXT_CAP */
    json_t *big = json_real(1.7976931348623157e308), *tiny = json_real(5e-324), *s = json_string("1");
    assert_true(jnum_text(big, out));
    assert_int_equal(strlen(out), 309);
    assert_memory_equal(out, "17976931348623157", 17);
    assert_true(jnum_text(tiny, out));
    assert_int_equal(strlen(out), 2 + 323 + 1);
    assert_string_equal(out + 325, "5");
    assert_false(jnum_text(s, out));
    /* random finite doubles: a plain decimal that reads back to the same double */
    for (int i = 0; i < 20000; i++) {
        uint64_t bits = rnd();
        double d;
        memcpy(&d, &bits, sizeof d);
        if (d != d || d - d != 0) continue; /* NaN, infinity */
        json_t *r = json_real(d);
        assert_true(jnum_text(r, out));
        assert_null(strpbrk(out, "eE"));
        if (strtod(out, NULL) != d && !(d == 0 && !strcmp(out, "0"))) fail_msg("%.17g -> %s", d, out);
        json_decref(r);
    }
    json_decref(big);
    json_decref(tiny);
    json_decref(s);
}

static void test_cmp(void **state)
{
    (void)state;
    static const struct {
        const char *a, *b;
        int r;
    } cases[] = {
        {"0", "-0", 0},       {"-0.000", "0.0", 0}, {"1", "1.000", 0},     {"1.5", "1.50", 0},
        {"1.5", "1.49", 1},   {"-1.5", "-1.49", -1}, {"-1", "0", -1},      {"0", "0.0001", -1},
        {"100", "99.999", 1}, {"10", "9", 1},        {"1e2", "100", 0},    {"-1E-2", "-0.01", 0},
        {"0.1", "0.09", 1},   {"123", "1234", -1},   {"-123", "-1234", 1}, {"1e400", "1e399", 1},
    };
    for (size_t i = 0; i < BASE_ARRAY_LEN(cases); i++) {
        int r = jnum_cmp(cases[i].a, cases[i].b);
        if ((r > 0) - (r < 0) != cases[i].r) fail_msg("cmp %s %s: %d", cases[i].a, cases[i].b, r);
        r = jnum_cmp(cases[i].b, cases[i].a);
        if ((r > 0) - (r < 0) != -cases[i].r) fail_msg("cmp %s %s: %d", cases[i].b, cases[i].a, r);
    }
}

/* ---- jnum_test against a reference ----------------------------------------------------- */

/* Reference values: text * 10^REF_SCALE as an exact int64 (texts with at
 * most 7 integer digits and REF_SCALE fraction digits in value). */
#define REF_SCALE 10

static bool ref_value(const char *t, __int128 *v)
{
    bool neg = *t == '-';
    if (neg) t++;
    __int128 m = 0;
    int frac = -1, ex = 0;
    for (; *t && *t != 'e' && *t != 'E'; t++) {
        if (*t == '.') {
            frac = 0;
            continue;
        }
        m = m * 10 + (*t - '0');
        if (frac >= 0) frac++;
    }
    if (*t) ex = atoi(t + 1);
    int sh = REF_SCALE + ex - (frac < 0 ? 0 : frac);
    if (sh < 0) {
        for (; sh < 0; sh++) {
            if (m % 10) return false;
            m /= 10;
        }
    }
    for (; sh > 0; sh--) {
        if (m > ((__int128)1 << 120)) return false;
        m *= 10;
    }
    *v = neg ? -m : m;
    return true;
}

static const char *const small_consts[] = {"0",    "-0",    "1",      "-1",    "0.5",      "-0.5",   "1.5",
                                           "2",    "3",     "10",     "100",   "0.01",     "0.0001", "0.3",
                                           "-2.75", "7",    "99.99",  "-100",  "0.000001", "255",    "12345.6789",
                                           "-3.5", "0.25", "1000000", "-0.01", "4.999999"};
static const char *const mults[] = {"1", "2",  "0.5", "0.01", "0.0001", "1.5", "0.3",
                                    "3", "7", "10",  "0.25", "12.5",   "100", "0.07"};

/* A random spec over consts (n_consts of them); except points at exc[]. */
static void rand_spec(jnum_spec *s, const char *const *consts, int n_consts, const char **exc)
{
    memset(s, 0, sizeof *s);
    s->kind = rndn(3);
    s->n_lo = rndn(3) == 0 ? 0 : rndn(3);
    s->n_hi = rndn(3) == 0 ? 0 : rndn(3);
    for (int i = 0; i < s->n_lo; i++) s->lo[i] = consts[rndn(n_consts)], s->lo_excl[i] = rndn(2);
    for (int i = 0; i < s->n_hi; i++) s->hi[i] = consts[rndn(n_consts)], s->hi_excl[i] = rndn(2);
    s->n_mult = rndn(3) == 0 ? rndn(3) : 0;
    s->n_not_mult = rndn(5) == 0 ? 1 : 0;
    for (int i = 0; i < s->n_mult; i++) s->mult[i] = mults[rndn((int)BASE_ARRAY_LEN(mults))];
    for (int i = 0; i < s->n_not_mult; i++) s->not_mult[i] = mults[rndn((int)BASE_ARRAY_LEN(mults))];
    s->n_except = rndn(4) == 0 ? (size_t)rndn(4) : 0;
    for (size_t i = 0; i < s->n_except; i++) exc[i] = consts[rndn(n_consts)];
    s->except = exc;
}

/* A random plain decimal near the constants; with exp, maybe an exponent. */
static void rand_text(char *out, size_t cap, const char *const *consts, int n_consts, bool exp)
{
    int how = rndn(4);
    if (how == 0) {
        /* a constant, respelled */
        const char *c = consts[rndn(n_consts)];
        const char *pt = strchr(c, '.');
        snprintf(out, cap, "%s%s%s", rndn(4) == 0 && c[0] != '-' ? "-" : "", c,
                 rndn(2) ? "" : pt ? "00" : ".0");
        return;
    }
    if (how == 1) {
        /* a constant with its last digit moved by one */
        const char *c = consts[rndn(n_consts)];
        snprintf(out, cap, "%s", c);
        size_t n = strlen(out);
        if (out[n - 1] > '0' && rndn(2)) out[n - 1]--;
        else if (out[n - 1] < '9') out[n - 1]++;
        else snprintf(out + n, cap - n, "%d", 1 + rndn(9));
        if (out[0] == '0' && out[1] && out[1] != '.') snprintf(out, cap, "%d", 1 + rndn(9)); /* "01" */
        return;
    }
    size_t o = 0;
    if (rndn(3) == 0) out[o++] = '-';
    int ni = rndn(4) == 0 ? 0 : 1 + rndn(7);
    if (!ni) out[o++] = '0';
    for (int i = 0; i < ni; i++) out[o++] = (char)('0' + (i == 0 ? 1 + rndn(9) : rndn(10)));
    if (rndn(2)) {
        int nf = 1 + rndn(7);
        out[o++] = '.';
        for (int i = 0; i < nf; i++) out[o++] = (char)('0' + (rndn(3) == 0 ? rndn(10) : 0));
    }
    if (exp && rndn(4) == 0) o += (size_t)snprintf(out + o, cap - o, "%s%d", rndn(2) ? "e" : "E", rndn(7) - 3);
    out[o] = 0;
}

static bool ref_ok(const jnum_spec *s, const char *text)
{
    __int128 x, c;
    if (!ref_value(text, &x)) fail_msg("reference: %s", text);
    __int128 one = 1;
    for (int i = 0; i < REF_SCALE; i++) one *= 10;
    bool ok = s->kind == JNUM_INT ? x % one == 0 : s->kind == JNUM_FRAC ? x % one != 0 : true;
    for (int i = 0; i < s->n_lo; i++) {
        assert_true(ref_value(s->lo[i], &c));
        ok = ok && (s->lo_excl[i] ? x > c : x >= c);
    }
    for (int i = 0; i < s->n_hi; i++) {
        assert_true(ref_value(s->hi[i], &c));
        ok = ok && (s->hi_excl[i] ? x < c : x <= c);
    }
    for (int i = 0; i < s->n_mult; i++) {
        assert_true(ref_value(s->mult[i], &c));
        ok = ok && x % c == 0;
    }
    for (int i = 0; i < s->n_not_mult; i++) {
        assert_true(ref_value(s->not_mult[i], &c));
        ok = ok && x % c != 0;
    }
    for (size_t i = 0; i < s->n_except; i++) {
        assert_true(ref_value(s->except[i], &c));
        ok = ok && x != c;
    }
    return ok;
}

static void test_reference(void **state)
{
    (void)state;
    const char *exc[4];
    char text[64];
    int n_true = 0, n = 0;
    for (int k = 0; k < 1000; k++) {
        jnum_spec s;
        rand_spec(&s, small_consts, (int)BASE_ARRAY_LEN(small_consts), exc);
        for (int j = 0; j < 100; j++, n++) {
            rand_text(text, sizeof text, small_consts, (int)BASE_ARRAY_LEN(small_consts), true);
            bool want = ref_ok(&s, text), got = test_ok(&s, text);
            if (want != got) fail_msg("spec %d text %s: reference %d, jnum_test %d", k, text, want, got);
            n_true += got;
        }
    }
    /* both outcomes were exercised */
    assert_true(n_true > n / 20 && n_true < n - n / 20);
}

/* ---- the grammar against jnum_test -------------------------------------------------- */

static int n_accepted; /* texts the grammars accepted, over all check_spec calls */

static void check_spec(const jnum_spec *s, const char *const *consts, int n_consts, int n_texts, int *n_empty)
{
    bool empty = false;
    gram *g = spec_gram(s, &empty, NULL);
    char text[700];
    if (empty) (*n_empty)++;
    for (int j = 0; j < n_texts; j++) {
        rand_text(text, sizeof text, consts, n_consts, false);
        bool want = test_ok(s, text), got = g && test_gram_accepts_str(g, text);
        n_accepted += got;
        if (want != got)
            fail_msg("text %s: jnum_test %d, grammar %d (kind %d, lo %d hi %d mult %d not %d exc %zu)", text,
                     want, got, s->kind, s->n_lo, s->n_hi, s->n_mult, s->n_not_mult, s->n_except);
    }
    /* under a constraint, exponents are never spelled (every value has a plain spelling) */
    if (g) assert_false(test_gram_accepts_str(g, "1e0") && (s->n_lo || s->n_hi || s->n_mult || s->n_not_mult || s->n_except));
    gram_free(g);
}

static void test_grammar_random(void **state)
{
    (void)state;
    const char *exc[4];
    int n_empty = 0;
    n_accepted = 0;
    for (int k = 0; k < 1000; k++) {
        jnum_spec s;
        rand_spec(&s, small_consts, (int)BASE_ARRAY_LEN(small_consts), exc);
        check_spec(&s, small_consts, (int)BASE_ARRAY_LEN(small_consts), 60, &n_empty);
    }
    print_message("1000 specs (%d empty), 60000 texts (%d accepted)\n", n_empty, n_accepted);
    assert_true(n_empty > 10 && n_empty < 500);
    assert_true(n_accepted > 6000 && n_accepted < 54000);
}

/* Bounds with hundreds of digits (1e308 and its neighbours, written out). */
static void test_grammar_huge(void **state)
{
    (void)state;
    static char big[320], big_m1[320], nbig[330], tiny[340], big_frac[340];
    memset(big, '0', 309);
    big[0] = '1', big[309] = 0; /* 1e308 */
    memset(big_m1, '9', 308);
    big_m1[308] = 0; /* 1e308 - 1 */
    snprintf(nbig, sizeof nbig, "-%s", big);
    snprintf(tiny, sizeof tiny, "0.%0300d1", 0); /* 1e-301 */
    snprintf(big_frac, sizeof big_frac, "%s.5", big_m1);
    const char *const consts[] = {big, big_m1, nbig, tiny, big_frac, "0", "1", "-1", "0.5"};
    int nc = (int)BASE_ARRAY_LEN(consts), n_empty = 0;
    const char *exc[4];
    for (int k = 0; k < 40; k++) {
        jnum_spec s;
        rand_spec(&s, consts, nc, exc);
        /* small divisors: their residues times 309-digit bounds stay under the state cap */
        s.n_mult = s.n_mult ? 1 : 0, s.n_not_mult = 0;
        s.mult[0] = mults[rndn(5)];
        check_spec(&s, consts, nc, 60, &n_empty);
    }
    /* exactly the boundary: integer <= 1e308 */
    jnum_spec s = {.kind = JNUM_INT, .n_hi = 1, .hi = {big}};
    bool empty;
    gram *g = spec_gram(&s, &empty, NULL);
    assert_true(test_gram_accepts_str(g, big));
    assert_true(test_gram_accepts_str(g, big_m1));
    assert_true(test_gram_accepts_str(g, nbig));
    big[308] = '1';
    assert_false(test_gram_accepts_str(g, big));
    big[308] = '0';
    gram_free(g);
}

/* ---- fixed cases -------------------------------------------------------------------------- */

typedef struct gcase {
    const char *text;
    bool ok;
} gcase;

static void check_cases(const jnum_spec *s, const gcase *c, size_t n)
{
    bool empty = false;
    gram *g = spec_gram(s, &empty, NULL);
    assert_false(empty);
    for (size_t i = 0; i < n; i++) {
        if (test_gram_accepts_str(g, c[i].text) != c[i].ok) fail_msg("grammar on %s: want %d", c[i].text, c[i].ok);
        bool ok = false;
        char err[BASE_ERR_CAP] = "";
        keel_status st = jnum_test(s, c[i].text, &ok, err); /* KEEL_EINVAL: not a JSON number, so not accepted */
        if (strpbrk(c[i].text, "eE")) continue; /* exponents: the grammar's limit, not a property */
        if ((st != KEEL_OK && st != KEEL_EINVAL) || ok != c[i].ok)
            fail_msg("jnum_test on %s: want %d", c[i].text, c[i].ok);
    }
    gram_free(g);
}

static void test_fixed(void **state)
{
    (void)state;
    {   /* no constraint: JSON's grammar */
        jnum_spec s = {.kind = JNUM_ANY};
        gcase c[] = {{"1e5", 1}, {"-0.5E+3", 1}, {"-0", 1}, {"01", 0}, {"1.", 0}, {".5", 0}, {"+1", 0}};
        check_cases(&s, c, BASE_ARRAY_LEN(c));
    }
    {   /* integer, no constraint */
        jnum_spec s = {.kind = JNUM_INT};
        gcase c[] = {{"3", 1}, {"3.0", 1}, {"-0", 1}, {"3.5", 0}, {"1e2", 0}, {"-12.000", 1}};
        check_cases(&s, c, BASE_ARRAY_LEN(c));
    }
    {   /* integer kind with a fractional bound: 1.5 -> 2.. */
        jnum_spec s = {.kind = JNUM_INT, .n_lo = 1, .lo = {"1.5"}, .n_hi = 1, .hi = {"4.2"}};
        gcase c[] = {{"1", 0}, {"2", 1}, {"2.0", 1}, {"4", 1}, {"4.00", 1}, {"5", 0}, {"1.5", 0}, {"3.5", 0}};
        check_cases(&s, c, BASE_ARRAY_LEN(c));
    }
    {   /* several bounds: the tightest wins */
        jnum_spec s = {.kind = JNUM_ANY, .n_lo = 3, .lo = {"-5", "0", "-0.5"}, .lo_excl = {false, true, false},
                       .n_hi = 2, .hi = {"10", "3"}, .hi_excl = {true, false}};
        gcase c[] = {{"0", 0}, {"-0", 0}, {"0.0001", 1}, {"3", 1}, {"3.0000001", 0}, {"-0.5", 0}};
        check_cases(&s, c, BASE_ARRAY_LEN(c));
    }
    {   /* negative bounds */
        jnum_spec s = {.kind = JNUM_ANY, .n_lo = 1, .lo = {"-2.5"}, .n_hi = 1, .hi = {"-1"}, .hi_excl = {true}};
        gcase c[] = {{"-2.5", 1}, {"-2.51", 0}, {"-1", 0}, {"-1.0001", 1}, {"-0", 0}, {"0", 0}, {"-2", 1}};
        check_cases(&s, c, BASE_ARRAY_LEN(c));
    }
    {   /* multipleOf 0.01 */
        jnum_spec s = {.kind = JNUM_ANY, .n_mult = 1, .mult = {"0.01"}};
        gcase c[] = {{"19.99", 1}, {"0.075", 0}, {"0.070", 1}, {"-3", 1}, {"0", 1}, {"0.001", 0}};
        check_cases(&s, c, BASE_ARRAY_LEN(c));
    }
    {   /* multipleOf 0.3 (3 / 10) and 1.5 */
        jnum_spec s = {.kind = JNUM_ANY, .n_mult = 2, .mult = {"0.3", "1.5"}};
        gcase c[] = {{"4.5", 1}, {"-4.5", 1}, {"3", 1}, {"0.3", 0}, {"35", 0}, {"0", 1}, {"9.00", 1}};
        check_cases(&s, c, BASE_ARRAY_LEN(c));
    }
    {   /* not a multiple of 2, non-integers */
        jnum_spec s = {.kind = JNUM_FRAC, .n_not_mult = 1, .not_mult = {"0.5"}};
        gcase c[] = {{"1.25", 1}, {"1.5", 0}, {"2", 0}, {"0.1", 1}, {"-0.75", 1}};
        check_cases(&s, c, BASE_ARRAY_LEN(c));
    }
    {   /* integer multiple of 0.5: every integer */
        jnum_spec s = {.kind = JNUM_INT, .n_mult = 1, .mult = {"0.5"}};
        gcase c[] = {{"7", 1}, {"7.5", 0}, {"-3.0", 1}};
        check_cases(&s, c, BASE_ARRAY_LEN(c));
    }
    {   /* excluded values, -0 equal to 0 */
        static const char *const exc[] = {"0", "1.5"};
        jnum_spec s = {.kind = JNUM_ANY, .except = exc, .n_except = 2};
        gcase c[] = {{"0", 0}, {"-0", 0}, {"0.000", 0}, {"1.50", 0}, {"1.5001", 1}, {"-1.5", 1}, {"2", 1}};
        check_cases(&s, c, BASE_ARRAY_LEN(c));
    }
}

static void test_empty(void **state)
{
    (void)state;
    static const char *const exc1[] = {"3"};
    const jnum_spec cases[] = {
        {.kind = JNUM_ANY, .n_lo = 1, .lo = {"5"}, .lo_excl = {true}, .n_hi = 1, .hi = {"5"}, .hi_excl = {true}},
        {.kind = JNUM_ANY, .n_lo = 1, .lo = {"5"}, .n_hi = 1, .hi = {"5"}, .hi_excl = {true}},
        {.kind = JNUM_ANY, .n_lo = 1, .lo = {"6"}, .n_hi = 1, .hi = {"5"}},
        {.kind = JNUM_INT, .n_lo = 1, .lo = {"1.1"}, .n_hi = 1, .hi = {"1.9"}},
        {.kind = JNUM_FRAC, .n_lo = 1, .lo = {"2"}, .n_hi = 1, .hi = {"2"}},
        {.kind = JNUM_INT, .n_lo = 1, .lo = {"3"}, .n_hi = 1, .hi = {"3"}, .except = exc1, .n_except = 1},
        {.kind = JNUM_ANY, .n_mult = 1, .mult = {"2"}, .n_not_mult = 1, .not_mult = {"1"}},
        {.kind = JNUM_ANY, .n_lo = 1, .lo = {"0.1"}, .n_hi = 1, .hi = {"0.9"}, .n_mult = 1, .mult = {"1"}},
    };
    for (size_t i = 0; i < BASE_ARRAY_LEN(cases); i++) {
        bool empty = false;
        gram *g = spec_gram(&cases[i], &empty, NULL);
        if (!empty) fail_msg("case %zu is not empty", i);
        assert_null(g);
    }
    /* exactly one value left */
    jnum_spec s = {.kind = JNUM_ANY, .n_lo = 1, .lo = {"5"}, .n_hi = 1, .hi = {"5"}};
    bool empty = true;
    gram *g = spec_gram(&s, &empty, NULL);
    assert_false(empty);
    assert_true(test_gram_accepts_str(g, "5"));
    assert_true(test_gram_accepts_str(g, "5.000"));
    assert_false(test_gram_accepts_str(g, "5.001"));
    gram_free(g);
}

/* Many excluded values: every integer 0..199 but one; the duplicates and
 * the values outside the bounds cost nothing. */
static void test_except_many(void **state)
{
    (void)state;
    static char txt[256][12];
    const char *exc[256];
    for (int i = 0; i < 256; i++) {
        snprintf(txt[i], sizeof txt[i], "%d", i < 200 ? i : i - 200); /* 200..255 repeat 0..55 */
        exc[i] = txt[i];
    }
    exc[77] = "-5"; /* outside the bounds: 77 stays */
    jnum_spec s = {.kind = JNUM_INT, .n_lo = 1, .lo = {"0"}, .n_hi = 1, .hi = {"200"}, .except = exc, .n_except = 256};
    bool empty = true;
    size_t n_rules = 0;
    gram *g = spec_gram(&s, &empty, &n_rules);
    char t[16];
    for (int i = -3; i < 205; i++) {
        snprintf(t, sizeof t, "%d", i);
        bool want = i == 77 || i == 200;
        if (test_gram_accepts_str(g, t) != want || test_ok(&s, t) != want) fail_msg("%s: want %d", t, want);
    }
    assert_true(test_gram_accepts_str(g, "200.00"));
    assert_true(n_rules < 20);
    gram_free(g);
    char *out = NULL, err[BASE_ERR_CAP] = "";
    size_t n = 0;
    s.n_except = 257;
    assert_int_equal(jnum_gbnf(&s, "n", &out, &n, &empty, err), KEEL_ERANGE);
    assert_non_null(strstr(err, "more than 256 excluded numbers"));
    s.n_except = 1;
    assert_int_equal(jnum_gbnf(&s, "a b", &out, &n, &empty, err), KEEL_EINVAL);
    assert_null(out);
}

static void test_refusals(void **state)
{
    (void)state;
    static const struct {
        jnum_spec s;
        keel_status st;
        const char *msg;
    } cases[] = {
        {{.n_mult = 1, .mult = {"0"}}, KEEL_EINVAL, "multipleOf 0 is not greater than 0"},
        {{.n_mult = 1, .mult = {"-2"}}, KEEL_EINVAL, "not greater than 0"},
        {{.n_mult = 1, .mult = {"0.123456789"}}, KEEL_ERANGE,
         "multipleOf 0.123456789 needs more than 10000 residue states"},
        {{.n_mult = 1, .mult = {"1e-1200"}}, KEEL_EUNSUPPORTED, "multipleOf 1e-1200 has too many digits"},
        {{.n_lo = 1, .lo = {"1e2000"}}, KEEL_EUNSUPPORTED, "minimum 1e2000 has too many digits"},
        {{.n_lo = 1, .lo = {"abc"}}, KEEL_EINVAL, "minimum 'abc' is not a decimal number"},
        {{.kind = 7}, KEEL_EINVAL, "numeric spec out of range"},
        {{.n_mult = 1, .mult = {"86400"}}, KEEL_ERANGE, "multipleOf 86400 needs more than"},
        {{.n_mult = 1, .mult = {"1e-300"}, .n_not_mult = 1, .not_mult = {"1e-200"}}, KEEL_OK, ""},
        {{.n_mult = 1, .mult = {"997e-100"}}, KEEL_ERANGE,
         "need more than 65536 automaton states (multipleOf 997e-100)"},
        {{.n_mult = 1, .mult = {"9973"}}, KEEL_ERANGE, "numeric constraints need 9978 grammar rules (at most 4096)"},
        {{.n_mult = 3, .mult = {"9973", "0.0007", "0.11"}}, KEEL_ERANGE,
         "numeric constraints need more than 65536 automaton states"},
    };
    for (size_t i = 0; i < BASE_ARRAY_LEN(cases); i++) {
        char *out = NULL, err[BASE_ERR_CAP] = "";
        size_t n = 0;
        bool empty = false;
        keel_status st = jnum_gbnf(&cases[i].s, "n", &out, &n, &empty, err);
        if (st != cases[i].st || !strstr(err, cases[i].msg))
            fail_msg("case %zu: %s '%s', want %s '%s'", i, keel_status_name(st), err, keel_status_name(cases[i].st),
                     cases[i].msg);
        if (st == KEEL_OK) base_free(out, n + 1);
        else assert_null(out);
    }
    /* jnum_test: a text that is not a number, a divisor past 18 digits */
    bool ok = true;
    char err[BASE_ERR_CAP] = "";
    jnum_spec s = {.kind = JNUM_ANY};
    assert_int_equal(jnum_test(&s, "1.", &ok, err), KEEL_EINVAL);
    jnum_spec m = {.n_mult = 1, .mult = {"1234567890123456789"}};
    assert_int_equal(jnum_test(&m, "2", &ok, err), KEEL_EUNSUPPORTED);
    /* jnum_test with exponents, exactly */
    jnum_spec t = {.kind = JNUM_INT, .n_mult = 1, .mult = {"0.0001"}, .n_hi = 1, .hi = {"1e308"}};
    assert_true(test_ok(&t, "1e300"));
    assert_false(test_ok(&t, "1.0000000001e308"));
    assert_true(test_ok(&t, "12.5e1"));
    assert_false(test_ok(&t, "1e-3"));
    assert_false(test_ok(&t, "1e1000000000000000000000"));
    jnum_spec u = {.kind = JNUM_ANY, .n_mult = 1, .mult = {"0.0001"}, .n_lo = 1, .lo = {"-1e-9999999999999999999999"}};
    assert_true(test_ok(&u, "1e-4"));
    assert_false(test_ok(&u, "1e-5"));
    assert_true(test_ok(&u, "-0"));
    assert_false(test_ok(&u, "-1e-4"));
}

/* ---- JSON-Schema-Test-Suite's numeric keywords ----------------------------------------- */

/* The schema's numeric keywords as a spec (false when it has others). */
static bool suite_spec(json_t *schema, jnum_spec *s, char txt[][JNUM_TEXT_CAP])
{
    memset(s, 0, sizeof *s);
    const char *k;
    json_t *v;
    int nt = 0;
    json_object_foreach(schema, k, v) {
        if (!strcmp(k, "$schema")) continue;
        if (!strcmp(k, "type") && json_is_string(v) && !strcmp(json_string_value(v), "integer")) {
            s->kind = JNUM_INT;
            continue;
        }
        if (!strcmp(k, "type") && json_is_string(v) && !strcmp(json_string_value(v), "number")) continue;
        if (!json_is_number(v) || !jnum_text(v, txt[nt])) return false;
        const char *t = txt[nt++];
        if (!strcmp(k, "minimum") || !strcmp(k, "exclusiveMinimum")) {
            s->lo_excl[s->n_lo] = k[0] == 'e';
            s->lo[s->n_lo++] = t;
        } else if (!strcmp(k, "maximum") || !strcmp(k, "exclusiveMaximum")) {
            s->hi_excl[s->n_hi] = k[0] == 'e';
            s->hi[s->n_hi++] = t;
        } else if (!strcmp(k, "multipleOf")) {
            s->mult[s->n_mult++] = t;
        } else {
            return false;
        }
    }
    return true;
}

static void test_suite(void **state)
{
    (void)state;
    static const char *const files[] = {"minimum",          "maximum",    "exclusiveMinimum",
                                        "exclusiveMaximum", "multipleOf", "optional/bignum",
                                        "optional/float-overflow"};
    int n_checked = 0, n_refused = 0;
    for (size_t f = 0; f < BASE_ARRAY_LEN(files); f++) {
        char path[256];
        snprintf(path, sizeof path, "/tmp/jsts/tests/draft2020-12/%s.json", files[f]);
        json_t *doc = json_load_file(path, JSON_DECODE_ANY | JSON_DECODE_INT_AS_REAL, NULL); /* bignum's integers */
        if (!doc) continue; /* the suite is not on this machine */
        size_t i;
        json_t *grp;
        json_array_foreach(doc, i, grp) {
            jnum_spec s;
            char txt[8][JNUM_TEXT_CAP];
            if (!suite_spec(json_object_get(grp, "schema"), &s, txt)) continue;
            char *out = NULL, err[BASE_ERR_CAP] = "";
            size_t n = 0;
            bool empty = false;
            keel_status st = jnum_gbnf(&s, "n", &out, &n, &empty, err);
            gram *g = NULL;
            if (st == KEEL_OK) {
                base_free(out, n + 1);
                g = spec_gram(&s, &empty, NULL);
            } else {
                n_refused++;
            }
            size_t j;
            json_t *tc;
            json_array_foreach(json_object_get(grp, "tests"), j, tc) {
                json_t *data = json_object_get(tc, "data");
                char text[JNUM_TEXT_CAP];
                if (!json_is_number(data) || !jnum_text(data, text)) continue;
                bool valid = json_is_true(json_object_get(tc, "valid"));
                if (test_ok(&s, text) != valid) fail_msg("%s: %s: jnum_test on %s", files[f],
                                                         json_string_value(json_object_get(tc, "description")), text);
                if (st == KEEL_OK && (g && test_gram_accepts_str(g, text)) != valid)
                    fail_msg("%s: %s: grammar on %s", files[f], json_string_value(json_object_get(tc, "description")),
                             text);
                n_checked++;
            }
            gram_free(g);
        }
        json_decref(doc);
    }
    print_message("suite: %d cases, %d schemas refused\n", n_checked, n_refused);
    if (n_checked) assert_true(n_checked > 20 && n_refused <= 1);
}

/* A few of the suite's cases, hard-coded (they run without /tmp/jsts). */
static void test_suite_fixed(void **state)
{
    (void)state;
    {   /* minimum 1.1 */
        jnum_spec s = {.n_lo = 1, .lo = {"1.1"}};
        gcase c[] = {{"2.6", 1}, {"1.1", 1}, {"0.6", 0}};
        check_cases(&s, c, BASE_ARRAY_LEN(c));
    }
    {   /* minimum -2 with signed integer */
        jnum_spec s = {.n_lo = 1, .lo = {"-2"}};
        gcase c[] = {{"-1", 1}, {"0", 1}, {"-2", 1}, {"-2.0001", 0}, {"-3", 0}};
        check_cases(&s, c, BASE_ARRAY_LEN(c));
    }
    {   /* exclusiveMaximum 3.0 */
        jnum_spec s = {.n_hi = 1, .hi = {"3"}, .hi_excl = {true}};
        gcase c[] = {{"2.2", 1}, {"3.0", 0}, {"3.5", 0}};
        check_cases(&s, c, BASE_ARRAY_LEN(c));
    }
    {   /* multipleOf 0.0001 */
        jnum_spec s = {.n_mult = 1, .mult = {"0.0001"}};
        gcase c[] = {{"0.0075", 1}, {"0.00751", 0}};
        check_cases(&s, c, BASE_ARRAY_LEN(c));
    }
    {   /* integer, multipleOf 1e-8: every integer; 12391239123 */
        jnum_spec s = {.kind = JNUM_INT, .n_mult = 1, .mult = {"0.00000001"}};
        gcase c[] = {{"12391239123", 1}, {"1.5", 0}};
        check_cases(&s, c, BASE_ARRAY_LEN(c));
    }
}

/* ---- sizes and allocation failures -------------------------------------------------------- */

static void test_sizes(void **state)
{
    (void)state;
    static const struct {
        jnum_spec s;
        size_t max_rules; /* the minimal automaton's states */
    } cases[] = {
        {{.kind = JNUM_INT, .n_lo = 1, .lo = {"0"}}, 6},
        {{.kind = JNUM_INT, .n_lo = 1, .lo = {"1"}, .n_hi = 1, .hi = {"100"}}, 7},
        {{.kind = JNUM_ANY, .n_lo = 1, .lo = {"0"}, .n_hi = 1, .hi = {"1"}}, 8},
        {{.kind = JNUM_ANY, .n_mult = 1, .mult = {"0.01"}}, 7},
        {{.kind = JNUM_INT, .n_mult = 1, .mult = {"7"}}, 12}, /* 7 residues, sign, "0", the fraction of zeros */
    };
    for (size_t i = 0; i < BASE_ARRAY_LEN(cases); i++) {
        bool empty;
        size_t n_rules = 0;
        gram *g = spec_gram(&cases[i].s, &empty, &n_rules);
        if (n_rules > cases[i].max_rules) fail_msg("case %zu: %zu rules (at most %zu)", i, n_rules, cases[i].max_rules);
        gram_free(g);
    }
}

static keel_status gbnf_op(void *ctx)
{
    char *out = NULL, err[BASE_ERR_CAP];
    size_t n = 0;
    bool empty;
    keel_status st = jnum_gbnf(ctx, "n", &out, &n, &empty, err);
    base_free(out, n + 1);
    return st;
}

static void test_alloc_failures(void **state)
{
    (void)state;
    static const char *const exc[] = {"5", "0.25"};
    jnum_spec s = {.kind = JNUM_ANY, .n_lo = 1, .lo = {"-3.5"}, .n_hi = 1, .hi = {"12345"}, .n_mult = 1,
                   .mult = {"0.25"}, .except = exc, .n_except = 2};
    assert_true(test_alloc_sweep(gbnf_op, &s) > 10);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text),         cmocka_unit_test(test_cmp),          cmocka_unit_test(test_reference),
        cmocka_unit_test(test_grammar_random), cmocka_unit_test(test_grammar_huge), cmocka_unit_test(test_fixed),
        cmocka_unit_test(test_empty),        cmocka_unit_test(test_refusals),     cmocka_unit_test(test_suite),
        cmocka_unit_test(test_suite_fixed),  cmocka_unit_test(test_sizes),        cmocka_unit_test(test_alloc_failures),
        cmocka_unit_test(test_except_many),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
