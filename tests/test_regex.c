/*
 * test_regex.c — src/grammar/regex.c and jstring.c: ECMA-262 pattern
 * semantics (match / no match, with JSON Schema's search semantics),
 * refusals with their messages, the caps (a refusal within a time bound),
 * every format against its own cases and, when /tmp/jsts holds the
 * JSON-Schema-Test-Suite, against the suite's optional format cases and
 * its pattern cases; and a round-trip property: the GBNF of a spec accepts
 * the canonical JSON spelling of a string exactly when jstr_test says the
 * string satisfies the spec.
 */
#include "testutil.h"
#include "gramtest.h"
#include "base/base.h"
#include "grammar/grammar.h"
#include "grammar/jstring.h"
#include "grammar/regex.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define JSTS "/tmp/jsts/tests/draft2020-12"

/* Time bounds of the caps' refusals; sanitizers make everything slower. */
#if defined(__SANITIZE_ADDRESS__)
#define SLOW 10.0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SLOW 10.0
#endif
#endif
#ifndef SLOW
#define SLOW 1.0
#endif
/* random cases of the round trip (fewer under the sanitizers) */
#define N_ROUNDS    (SLOW > 1.0 ? 60 : 200)
#define N_MUTATIONS (SLOW > 1.0 ? 30 : 100)

/* The thread's CPU time: the caps bound work, which a loaded machine
 * (other tests on the same cores) must not turn into a failure. */
static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static gram *spec_gram(const jstr_spec *s, bool *empty)
{
    char *text = NULL, err[BASE_ERR_CAP] = "";
    size_t n = 0;
    keel_status st = jstr_gbnf(s, "str", &text, &n, empty, err);
    if (st) fail_msg("jstr_gbnf: %s: %s", keel_status_name(st), err);
    if (*empty) return NULL;
    size_t cap = n + 32;
    char *src = malloc(cap);
    int k = snprintf(src, cap, "root ::= str\n%s", text);
    base_free(text, n + 1);
    gram *g = NULL;
    st = gram_compile(src, (size_t)k, &g, err);
    if (st) fail_msg("gram_compile: %s: %s\n%s", keel_status_name(st), err, src);
    free(src);
    return g;
}

static bool spec_test(const jstr_spec *s, const char *str, size_t n)
{
    bool ok = false;
    char err[BASE_ERR_CAP] = "";
    keel_status st = jstr_test(s, str, n, &ok, err);
    if (st) fail_msg("jstr_test: %s: %s", keel_status_name(st), err);
    return ok;
}

/* jstr_test on str (or jstr_auto_test with a), checked against the
 * GBNF's verdict on its spelling. */
static bool both_auto(const jstr_auto *a, const jstr_spec *s, const gram *g, const char *str,
                      size_t n)
{
    bool t = a ? jstr_auto_test(a, str, n) : spec_test(s, str, n);
    char *sp = malloc(n * 6 + 3);
    size_t k = jstr_spell(str, n, sp);
    bool gm = test_gram_accepts(g, sp, k);
    if (gm != t)
        fail_msg("gbnf %d but jstr_test %d on %s (pattern %s)", gm, t, sp,
                 s->n_pattern ? s->pattern[0] : "-");
    free(sp);
    return t;
}

static bool both(const jstr_spec *s, const gram *g, const char *str, size_t n)
{
    return both_auto(NULL, s, g, str, n);
}

static bool pattern_matches(const char *pat, const char *str)
{
    jstr_spec s = {.max_len = -1, .pattern = {pat}, .n_pattern = 1};
    bool empty;
    gram *g = spec_gram(&s, &empty);
    bool r = both(&s, g, str, strlen(str));
    gram_free(g);
    return r;
}

static void test_semantics(void **state)
{
    (void)state;
    static const struct {
        const char *pat, *str;
        bool match;
    } cases[] = {
        {"abc", "xxabcxx", true},
        {"^abc", "xxabc", false},
        {"^abc", "abcxx", true},
        {"abc$", "xxabc", true},
        {"abc$", "abcx", false},
        {"^abc$", "abc", true},
        {"^abc$", "abcabc", false},
        {"^a|b$", "ax", true},
        {"^a|b$", "xb", true},
        {"^a|b$", "xa", false},
        {"^(?:a|b)+$", "abba", true},
        {"^(a|b)+$", "abca", false},
        {"^a{2,3}$", "a", false},
        {"^a{2,3}$", "aa", true},
        {"^a{2,3}$", "aaaa", false},
        {"^a{2}$", "aa", true},
        {"^a{2,}$", "aaaaa", true},
        {"^a{2,}$", "a", false},
        {"^a*?b+?c??$", "aabbc", true},
        {"^\\d+$", "0123", true},
        {"^\\d+$", "12a", false},
        {"^\\D$", "a", true},
        {"^\\w+$", "ab_Z9", true},
        {"^\\w$", "-", false},
        {"^\\W$", "-", true},
        {"^\\s$", "\xef\xbb\xbf", true},
        {"^\\s$", "\xc2\xa0", true},
        {"^\\s$", "\xe3\x80\x80", true},
        {"^\\s$", "\xe2\x80\xa8", true},
        {"^\\s$", "\xe1\xa0\x8e", false},
        {"^\\S$", "x", true},
        {"^.$", "\n", false},
        {"^.$", "\xe2\x80\xa9", false},
        {"^.$", "\xf0\x9f\x98\x80", true},
        {"^[\\s\\S]$", "\n", true},
        {"^[^]$", "\r", true},
        {"^[]$", "", false},
        {"^[a-c]+$", "abcb", true},
        {"^[a-c]$", "d", false},
        {"^[^a-c]$", "d", true},
        {"^[^a-c]$", "b", false},
        {"^[-a]$", "-", true},
        {"^[a-]$", "-", true},
        {"^[\\d-z]$", "-", true},
        {"^[\\b]$", "\b", true},
        {"^\\t\\n\\r\\v\\f$", "\t\n\r\v\f", true},
        {"^\\0$", "\0", false},
        {"^\\cJ$", "\n", true},
        {"^\\x41\\u0042\\u{43}$", "ABC", true},
        {"^\\uD83D\\uDE00$", "\xf0\x9f\x98\x80", true},
        {"^\\u{1F600}$", "\xf0\x9f\x98\x80", true},
        {"^[\\u{1F600}-\\u{1F64F}]$", "\xf0\x9f\x99\x82", true},
        {"^\xf0\x9f\x98\x80+$", "\xf0\x9f\x98\x80\xf0\x9f\x98\x80", true},
        {"^.$", "\xf0\x9f\x98\x80\xf0\x9f\x98\x80", false},
        {"^\\.\\*\\/\\$\\^$", ".*/$^", true},
        {"a{", "a{", true},
        {"^a}$", "a}", true},
        {"^(?<year>\\d{4})-(?<m>\\d\\d)$", "2024-01", true},
        {"^(?:)$", "", true},
        {"", "anything", true},
        {"^$", "", true},
        {"^$", "x", false},
        {"^a|", "zzz", true},
        {"\\\\", "a\\b", true},
        {"\"", "say \"hi\"", true},
        {"^[\"\\\\]+$", "\"\\\"", true},
        {"^\\x00-\\x1f$", "\x01", false},
        {"^[\\x00-\\x1f]+$", "\x01\x1f\n", true},
        {"^((a)|b)*c$", "abac", true},
        {"^(a*)*$", "aaa", true},
        {"^(a|b)*a(a|b){3}$", "babb", false},
        {"^(a|b)*a(a|b){3}$", "bbabbb", true},
        /* ^ and $ anywhere, as assertions */
        {"a^b", "ab", false},
        {"a^b", "a^b", false},
        {"a$b", "ab", false},
        {"(^a|b)c", "ac", true},
        {"(^a|b)c", "xac", false},
        {"(^a|b)c", "xbc", true},
        {"(a$)", "xa", true},
        {"(a$)", "ax", false},
        {"^$|^x$", "", true},
        {"^$|^x$", "x", true},
        {"^$|^x$", "xx", false},
        {"(?:^|,)a(?:,|$)", "b,a", true},
        {"(?:^|,)a(?:,|$)", "a", true},
        {"(?:^|,)a(?:,|$)", "ba", false},
        {"(^)*", "x", true},
        {"x(?:$|y)$", "x", true},
        {"x(?:$|y)$", "xy", true},
        {"x(?:$|y)$", "xyz", false},
        {"^^a$$", "a", true},
        {"(?:a|^)+b", "cb", false},
        {"(?:a|^)+b", "b", true},
        /* word boundaries (\w: ASCII letters, digits, _; the ends are not word characters) */
        {"\\bfoo\\b", "a foo.", true},
        {"\\bfoo\\b", "afoo", false},
        {"\\bfoo\\b", "foo_", false},
        {"\\Bo", "foo", true},
        {"\\Bo", "o", false},
        {"\\b", "", false},
        {"\\b", "-", false},
        {"\\b",
         "\xc3\xa9"
         "a",
         true},
        {"\\B", "", true},
        {"a\\b", "ab", false},
        {"a\\b", "a b", true},
        {"^\\w+\\b$", "abc", true},
        {"\\b\\B", "a", false},
        {"(?:\\b|x)y", "xy", true},
        {"\\b\\d{3}\\b", "a 123 b", true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bool m = pattern_matches(cases[i].pat, cases[i].str);
        if (m != cases[i].match)
            fail_msg("pattern %s on \"%s\": %d, want %d", cases[i].pat, cases[i].str, m,
                     cases[i].match);
    }
    /* "\0" as data needs its length */
    jstr_spec s = {.max_len = -1, .pattern = {"^\\0$"}, .n_pattern = 1};
    bool empty;
    gram *g = spec_gram(&s, &empty);
    assert_true(both(&s, g, "\0", 1));
    gram_free(g);
}

static void test_refusals(void **state)
{
    (void)state;
    static const struct {
        const char *pat;
        keel_status st;
        const char *msg;
    } cases[] = {
        {"(a)\\1", KEEL_EUNSUPPORTED, "backreferences"},
        {"(?<n>a)\\k<n>", KEEL_EUNSUPPORTED, "backreferences"},
        {"a(?=b)", KEEL_EUNSUPPORTED, "lookahead"},
        {"a(?!b)", KEEL_EUNSUPPORTED, "lookahead"},
        {"(?<=a)b", KEEL_EUNSUPPORTED, "lookbehind"},
        {"(?<!a)b", KEEL_EUNSUPPORTED, "lookbehind"},
        {"\\b+", KEEL_EFORMAT, "nothing to repeat"},
        {"[\\B]", KEEL_EFORMAT, "\\B in a character class"},
        {"\\p{Letter}", KEEL_EUNSUPPORTED, "property"},
        {"\\P{L}", KEEL_EUNSUPPORTED, "property"},
        {"(?i)abc", KEEL_EUNSUPPORTED, "flags"},
        {"^*a", KEEL_EFORMAT, "nothing to repeat"},
        {"a${2}", KEEL_EFORMAT, "nothing to repeat"},
        {"(a", KEEL_EFORMAT, "missing )"},
        {"a)", KEEL_EFORMAT, "unmatched )"},
        {"[a", KEEL_EFORMAT, "unterminated"},
        {"*a", KEEL_EFORMAT, "nothing to repeat"},
        {"a**", KEEL_EFORMAT, "nothing to repeat"},
        {"[z-a]", KEEL_EFORMAT, "out of order"},
        {"a{3,2}", KEEL_EFORMAT, "out of order"},
        {"\\a", KEEL_EFORMAT, "unknown escape"},
        {"\\x4", KEEL_EFORMAT, "\\x"},
        {"\\u{110000}", KEEL_EFORMAT, "\\u{"},
        {"abc\\", KEEL_EFORMAT, "end of the pattern"},
        {"a{1001}", KEEL_ERANGE, "above 1000"},
        {"\xff", KEEL_EFORMAT, "UTF-8"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        rx_dfa *d = NULL;
        char err[BASE_ERR_CAP] = "";
        keel_status st = rx_compile(cases[i].pat, strlen(cases[i].pat), true, &d, err);
        if (st != cases[i].st || !strstr(err, cases[i].msg) || !strstr(err, "pattern \""))
            fail_msg("%s: %s \"%s\", want %s \"%s\"", cases[i].pat, keel_status_name(st), err,
                     keel_status_name(cases[i].st), cases[i].msg);
        assert_null(d);
    }
    /* through jstr_gbnf / jstr_test, and an unknown format */
    jstr_spec s = {.max_len = -1, .pattern = {"(a)\\1"}, .n_pattern = 1};
    char *out = NULL, err[BASE_ERR_CAP] = "";
    size_t n = 0;
    bool empty = false, ok = true;
    assert_int_equal(jstr_gbnf(&s, "x", &out, &n, &empty, err), KEEL_EUNSUPPORTED);
    assert_null(out);
    assert_int_equal(jstr_test(&s, "aa", 2, &ok, err), KEEL_EUNSUPPORTED);
    jstr_spec f = {.max_len = -1, .format = {"color"}, .n_format = 1};
    assert_int_equal(jstr_gbnf(&f, "x", &out, &n, &empty, err), KEEL_EUNSUPPORTED);
    assert_non_null(strstr(err, "color"));
    assert_false(jstr_format_known("color"));
    assert_true(jstr_format_known("date-time"));
}

static void test_caps(void **state)
{
    (void)state;
    static const char *const heavy[] = {
        "(a|b)*a(a|b){30}",
        "^(a|b)*a(a|b){20}$",
        "((((a{1000}){1000}){1000}){1000})",
        "[ab]*a[ab]{15}c",
        "^(.*a.*b){2}(a|b)*a(a|b){14}$",
        "^(?:[ab]{0,300}c){1,50}$", /* huge subsets: the work cap */
        "^.{0,1000}x.{0,1000}$",
    };
    for (size_t i = 0; i < sizeof heavy / sizeof heavy[0]; i++) {
        rx_dfa *d = NULL;
        char err[BASE_ERR_CAP] = "";
        double t0 = now_s();
        keel_status st = rx_compile(heavy[i], strlen(heavy[i]), true, &d, err);
        double dt = now_s() - t0;
        if (st != KEEL_ERANGE || !strstr(err, "too complex"))
            fail_msg("%s: %s %s", heavy[i], keel_status_name(st), err);
        if (dt > SLOW) fail_msg("%s: refused after %.2f s", heavy[i], dt);
        assert_null(d);
    }
    /* a pattern within the caps, and a product past them */
    jstr_spec s = {.min_len = 0, .max_len = 16000, .pattern = {"abcdefghij"}, .n_pattern = 1};
    char *out = NULL, err[BASE_ERR_CAP] = "";
    size_t n = 0;
    bool empty = false;
    double t0 = now_s();
    keel_status st = jstr_gbnf(&s, "x", &out, &n, &empty, err);
    assert_int_equal(st, KEEL_ERANGE);
    assert_non_null(strstr(err, "too complex"));
    assert_true(now_s() - t0 < SLOW);
    /* implied bounds cost nothing: a 3-letter word within maxLength 5000 */
    jstr_spec w = {.min_len = 1, .max_len = 5000, .pattern = {"^[A-Z]{3}$"}, .n_pattern = 1};
    assert_int_equal(jstr_gbnf(&w, "x", &out, &n, &empty, err), KEEL_OK);
    assert_false(empty);
    base_free(out, n + 1);
}

/* ---- lengths, exclusions, conjunctions -------------------------------------- */

static void test_spec(void **state)
{
    (void)state;
    bool empty;
    /* lengths alone: any JSON spelling */
    jstr_spec l = {.min_len = 2, .max_len = 3};
    gram *g = spec_gram(&l, &empty);
    assert_true(test_gram_accepts(g, "\"ab\"", 4));
    assert_true(test_gram_accepts(g, "\"\\u0041b\"", 9));
    assert_false(test_gram_accepts(g, "\"abcd\"", 6));
    assert_true(spec_test(&l, "\xf0\x9f\x98\x80\xf0\x9f\x98\x80", 8)); /* code points, not bytes */
    assert_false(spec_test(&l, "a", 1));
    /* an escaped surrogate pair is one code point; a lone surrogate none */
    assert_false(test_gram_accepts(g, "\"\\ud83d\\ude00\"", 14));
    assert_true(test_gram_accepts(g, "\"\\uD83D\\uDE00a\"", 15));
    assert_false(test_gram_accepts(g, "\"\\ud83da\"", 9));
    assert_true(test_gram_accepts(g, "\"\\ud7ffa\"", 9));
    gram_free(g);
    /* a pattern with lengths */
    jstr_spec p = {.min_len = 2, .max_len = 4, .pattern = {"^[a-z]+$"}, .n_pattern = 1};
    g = spec_gram(&p, &empty);
    assert_false(both(&p, g, "a", 1));
    assert_true(both(&p, g, "ab", 2));
    assert_true(both(&p, g, "abcd", 4));
    assert_false(both(&p, g, "abcde", 5));
    gram_free(g);
    /* exclusions (enum filtering), not-patterns and formats together */
    const char *ex[] = {"red", "green"};
    size_t exn[] = {3, 5};
    jstr_spec e = {.max_len = -1,
                   .pattern = {"^[a-z]+$"},
                   .n_pattern = 1,
                   .not_pattern = {"^b"},
                   .n_not_pattern = 1,
                   .except = ex,
                   .except_len = exn,
                   .n_except = 2};
    g = spec_gram(&e, &empty);
    assert_false(both(&e, g, "red", 3));
    assert_true(both(&e, g, "re", 2));
    assert_true(both(&e, g, "redd", 4));
    assert_false(both(&e, g, "green", 5));
    assert_false(both(&e, g, "blue", 4));
    assert_true(both(&e, g, "gray", 4));
    gram_free(g);
    /* except alone: the canonical spelling is required */
    jstr_spec x = {.max_len = -1, .except = ex, .except_len = exn, .n_except = 1};
    g = spec_gram(&x, &empty);
    assert_false(both(&x, g, "red", 3));
    assert_true(both(&x, g, "", 0));
    assert_true(both(&x, g, "a\"\\\n\x01", 5));
    assert_false(test_gram_accepts(g, "\"\\u0061\"", 8));
    gram_free(g);
    /* empty conjunctions */
    jstr_spec z = {.max_len = -1, .pattern = {"^a+$", "^b+$"}, .n_pattern = 2};
    char *out = (char *)1, err[BASE_ERR_CAP] = "";
    size_t n = 7;
    assert_int_equal(jstr_gbnf(&z, "x", &out, &n, &empty, err), KEEL_OK);
    assert_true(empty);
    assert_null(out);
    jstr_spec z2 = {.min_len = 4, .max_len = -1, .pattern = {"^a{1,3}$"}, .n_pattern = 1};
    assert_int_equal(jstr_gbnf(&z2, "x", &out, &n, &empty, err), KEEL_OK);
    assert_true(empty);
    jstr_spec z3 = {.min_len = 4, .max_len = 3};
    assert_int_equal(jstr_gbnf(&z3, "x", &out, &n, &empty, err), KEEL_OK);
    assert_true(empty);
    jstr_spec z4 = {.max_len = -1,
                    .format = {"ipv4"},
                    .n_format = 1,
                    .not_format = {"ipv4"},
                    .n_not_format = 1};
    assert_int_equal(jstr_gbnf(&z4, "x", &out, &n, &empty, err), KEEL_OK);
    assert_true(empty);
    /* a long match (the grammar's stacks do not grow with the text) */
    jstr_spec big = {.max_len = -1, .pattern = {"^[a-z]*$"}, .n_pattern = 1};
    g = spec_gram(&big, &empty);
    char *long_s = malloc(20001);
    memset(long_s, 'q', 20000);
    assert_true(both(&big, g, long_s, 20000));
    free(long_s);
    gram_free(g);
}

/* The automaton operations by themselves: union, intersection,
 * difference, length ranges, minimality of small cases. */
static void test_automata(void **state)
{
    (void)state;
    char err[BASE_ERR_CAP] = "";
    rx_dfa *a = NULL, *b = NULL, *o = NULL, *x = NULL, *m = NULL;
    assert_int_equal(rx_compile("a+", 2, false, &a, err), KEEL_OK);
    assert_int_equal(rx_compile("b{2,3}", 6, false, &b, err), KEEL_OK);
    assert_int_equal(a->n_states, 3); /* dead, start, loop */
    assert_int_equal(b->n_states, 5);
    assert_int_equal(rx_product(a, b, RX_OR, &o, err), KEEL_OK);
    assert_int_equal(rx_product(a, b, RX_AND, &x, err), KEEL_OK);
    assert_int_equal(rx_product(o, a, RX_ANDNOT, &m, err), KEEL_OK);
    static const char *const strs[] = {"", "a", "aaa", "b", "bb", "bbb", "bbbb", "ab"};
    for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++) {
        size_t n = strlen(strs[i]);
        bool in_a = rx_match(a, strs[i], n), in_b = rx_match(b, strs[i], n);
        assert_int_equal(rx_match(o, strs[i], n), in_a || in_b);
        assert_int_equal(rx_match(x, strs[i], n), in_a && in_b);
        assert_int_equal(rx_match(m, strs[i], n), in_b);
    }
    assert_int_equal(x->start, 0); /* a+ and b{2,3} share nothing: empty */
    int64_t mn, mx;
    assert_int_equal(rx_len_range(b, &mn, &mx), KEEL_OK);
    assert_true(mn == 2 && mx == 3);
    assert_int_equal(rx_len_range(a, &mn, &mx), KEEL_OK);
    assert_true(mn == 1 && mx == -1);
    assert_int_equal(rx_len_range(m, &mn, &mx), KEEL_OK);
    assert_true(mn == 2 && mx == 3);
    assert_int_equal(m->n_states, b->n_states); /* minimal again */
    rx_free(a), rx_free(b), rx_free(o), rx_free(x), rx_free(m);
    /* string sets: exactly the strings, invalid UTF-8 left out */
    const char *ss[] = {"ab", "abc", "\xc3\xa9", "\xff"};
    size_t sn[] = {2, 3, 2, 1};
    rx_dfa *t = NULL;
    assert_int_equal(rx_strings(ss, sn, 4, &t, err), KEEL_OK);
    assert_true(rx_match(t, "ab", 2) && rx_match(t, "abc", 3) && rx_match(t, "\xc3\xa9", 2));
    assert_false(rx_match(t, "a", 1) || rx_match(t, "abcd", 4) || rx_match(t, "\xff", 1) ||
                 rx_match(t, "", 0));
    rx_free(t);
    /* counters */
    rx_dfa *l = NULL;
    assert_int_equal(rx_length(2, 3, &l, err), KEEL_OK);
    assert_false(rx_match(l, "\xf0\x9f\x98\x80", 4));
    assert_true(rx_match(l, "\xf0\x9f\x98\x80\xf0\x9f\x98\x80", 8));
    assert_false(rx_match(l, "abcd", 4));
    rx_free(l);
    assert_int_equal(rx_length(0, 100000, &l, err), KEEL_ERANGE);
    assert_null(l);
}

/* ---- formats ---------------------------------------------------------------- */

static bool format_ok(const char *fmt, const char *str, size_t n)
{
    jstr_spec s = {.max_len = -1, .format = {fmt}, .n_format = 1};
    return spec_test(&s, str, n);
}

static void test_formats(void **state)
{
    (void)state;
    static const struct {
        const char *fmt, *str;
        bool ok;
    } cases[] = {
        {"date", "2024-02-29", true},
        {"date", "2023-02-29", false},
        {"date", "2000-02-29", true},
        {"date", "1900-02-29", false},
        {"date", "2024-04-31", false},
        {"date", "2024-12-31", true},
        {"date", "2024-13-01", false},
        {"date", "24-01-01", false},
        {"time", "08:30:06Z", true},
        {"time", "23:59:60Z", true},
        {"time", "22:59:60Z", false},
        {"time", "08:30:06.5+05:30", true},
        {"time", "08:30:06", false},
        {"time", "24:00:00Z", false},
        {"date-time", "1963-06-19T08:30:06.283185Z", true},
        {"date-time", "1963-06-19t08:30:06z", true},
        {"date-time", "1963-06-19 08:30:06Z", false},
        {"duration", "P1Y2M3DT4H5M6S", true},
        {"duration", "PT1H2S", false},
        {"duration", "P2W", true},
        {"duration", "P", false},
        {"uuid", "2EB8AA08-AA98-11EA-B4AA-73B441D16380", true},
        {"uuid", "2eb8aa08-aa98-11ea-b4aa-73b441d1638", false},
        {"email", "joe.bloggs@example.com", true},
        {"email", "\"joe bloggs\"@example.com", true},
        {"email", "te..st@example.com", false},
        {"email", "a@[IPv6:::1]", true},
        {"hostname", "www.example.com", true},
        {"hostname", "-a.com", false},
        {"hostname", "a--b.com", true},
        {"hostname", "ab--c.com", false},
        {"ipv4", "192.168.0.1", true},
        {"ipv4", "256.0.0.1", false},
        {"ipv4", "01.2.3.4", false},
        {"ipv6", "::1", true},
        {"ipv6", "1:2:3:4:5:6:7:8", true},
        {"ipv6", "1:2:3:4:5:6:7:8:9", false},
        {"ipv6", "::ffff:1.2.3.4", true},
        {"ipv6", "1::2::3", false},
        {"ipv6", "fe80::1%eth0", false},
        {"uri", "http://a.b/c?d#e", true},
        {"uri", "/a", false},
        {"uri", "urn:isbn:0451450523", true},
        {"uri", "http://[::1]:80/", true},
        {"uri-reference", "/a", true},
        {"uri-reference", "", true},
        {"uri-reference", "a b", false},
        {"json-pointer", "/a~1b/~0", true},
        {"json-pointer", "a", false},
        {"json-pointer", "/~2", false},
        {"relative-json-pointer", "0#", true},
        {"relative-json-pointer", "01", false},
        {"relative-json-pointer", "2/a", true},
        {"iri", "http://\xc3\xa9.fr/\xc3\xa9?\xee\x80\x80", true},
        {"iri", "http://\xc3\xa9.fr/#\xee\x80\x80", false},
        {"iri-reference", "\xc3\xa9", true},
        {"uri-template", "/a/{b,c*}{?d:3}", true},
        {"uri-template", "{a", false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bool ok = format_ok(cases[i].fmt, cases[i].str, strlen(cases[i].str));
        if (ok != cases[i].ok)
            fail_msg("format %s on \"%s\": %d, want %d", cases[i].fmt, cases[i].str, ok,
                     cases[i].ok);
    }
}

/* The suite's cases where an automaton is knowingly a subset or superset
 * (see FORMATS in jstring.c). */
static bool known_gap(const char *fmt, const char *str)
{
    if (strcmp(fmt, "time") == 0 || strcmp(fmt, "date-time") == 0)
        return strstr(str, ":60") != NULL;
    if (strcmp(fmt, "hostname") == 0) return strncmp(str, "xn--", 4) == 0 || strlen(str) > 253;
    return false;
}

static void test_suite_formats(void **state)
{
    (void)state;
    static const char *const fmts[] = {
        "date",          "time",         "date-time",     "duration",
        "uuid",          "email",        "hostname",      "ipv4",
        "ipv6",          "uri",          "uri-reference", "iri",
        "iri-reference", "uri-template", "json-pointer",  "relative-json-pointer"};
    int n_checked = 0, n_gap = 0;
    for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++) {
        char path[256];
        snprintf(path, sizeof path, JSTS "/optional/format/%s.json", fmts[f]);
        json_error_t je;
        json_t *doc = json_load_file(path, JSON_ALLOW_NUL, &je);
        if (!doc) {
            print_message("skip: %s: %s\n", path, je.text);
            continue;
        }
        jstr_spec s = {.max_len = -1, .format = {fmts[f]}, .n_format = 1};
        jstr_auto *a = NULL;
        char err[BASE_ERR_CAP] = "";
        assert_int_equal(jstr_auto_open(&s, &a, err), KEEL_OK);
        size_t gi, ti;
        json_t *grp, *t;
        json_array_foreach(doc, gi, grp)
        {
            json_array_foreach(json_object_get(grp, "tests"), ti, t)
            {
                json_t *data = json_object_get(t, "data");
                if (!json_is_string(data)) continue;
                const char *str = json_string_value(data);
                size_t n = json_string_length(data);
                bool want = json_is_true(json_object_get(t, "valid"));
                bool got = jstr_auto_test(a, str, n);
                if (got != want) {
                    if (known_gap(fmts[f], str)) {
                        if (getenv("KEEL_TEST_VERBOSE"))
                            print_message("gap: %s \"%s\" want %d\n", fmts[f], str, want);
                        n_gap++;
                        continue;
                    }
                    fail_msg("suite %s on \"%s\": %d, want %d", fmts[f], str, got, want);
                }
                n_checked++;
            }
        }
        jstr_auto_close(a);
        json_decref(doc);
    }
    print_message("suite formats: %d cases agree, %d known gaps\n", n_checked, n_gap);
}

/* pattern.json, patternProperties' patterns, non-bmp-regex.json and
 * ecmascript-regex.json: every case whose pattern compiles agrees. */
static void test_suite_patterns(void **state)
{
    (void)state;
    static const char *const files[] = {"pattern.json", "optional/non-bmp-regex.json",
                                        "optional/ecmascript-regex.json"};
    int n_ok = 0, n_refused = 0;
    for (size_t f = 0; f < sizeof files / sizeof files[0]; f++) {
        char path[256];
        snprintf(path, sizeof path, JSTS "/%s", files[f]);
        json_error_t je;
        json_t *doc = json_load_file(path, JSON_ALLOW_NUL, &je);
        if (!doc) {
            print_message("skip: %s: %s\n", path, je.text);
            continue;
        }
        size_t gi, ti;
        json_t *grp, *t;
        json_array_foreach(doc, gi, grp)
        {
            json_t *pat = json_object_get(json_object_get(grp, "schema"), "pattern");
            if (!json_is_string(pat)) continue;
            jstr_spec s = {.max_len = -1, .pattern = {json_string_value(pat)}, .n_pattern = 1};
            rx_dfa *d = NULL;
            char err[BASE_ERR_CAP] = "";
            if (rx_compile(json_string_value(pat), json_string_length(pat), true, &d, err)) {
                if (getenv("KEEL_TEST_VERBOSE")) print_message("refused: %s\n", err);
                n_refused++;
                continue;
            }
            rx_free(d);
            bool empty;
            gram *g = spec_gram(&s, &empty);
            json_array_foreach(json_object_get(grp, "tests"), ti, t)
            {
                json_t *data = json_object_get(t, "data");
                if (!json_is_string(data)) continue;
                bool want = json_is_true(json_object_get(t, "valid"));
                bool got = both(&s, g, json_string_value(data), json_string_length(data));
                if (got != want)
                    fail_msg("%s: pattern %s on \"%s\": %d, want %d", files[f],
                             json_string_value(pat), json_string_value(data), got, want);
                n_ok++;
            }
            gram_free(g);
        }
        json_decref(doc);
    }
    print_message("suite patterns: %d cases agree, %d patterns refused\n", n_ok, n_refused);
}

/* ---- round trip --------------------------------------------------------------- */

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* The alphabet of the random strings: ASCII letters, the characters that
 * are escaped, and multi-byte ones. */
static const char *const ALPHA[] = {
    "a", "b", "c", "\"", "\\", "\n", "\x01", "\xc3\xa9", "\xf0\x9f\x98\x80", " ", "1"};
#define N_ALPHA (sizeof ALPHA / sizeof ALPHA[0])

static const char *const ATOMS[] = {"a",        "b",          "[ab]",         "[^a]",
                                    ".",        "\\d",        "\\s",          "\\w",
                                    "\\\\",     "\"",         "\\n",          "[\\x00-\\x1f]",
                                    "\xc3\xa9", "\\u{1F600}", "[^\\w]",       "(?:a|b\\\\)",
                                    "(?:^|a)",  "(?:b|$)",    "(?:\\ba|\\Bb)"};
#define N_ATOMS (sizeof ATOMS / sizeof ATOMS[0])

static void random_pattern(uint64_t *rs, char *out, size_t cap)
{
    size_t k = 0;
    if (rng_next(rs) % 2) out[k++] = '^';
    int n = 1 + (int)(rng_next(rs) % 4);
    for (int i = 0; i < n; i++) {
        bool group = rng_next(rs) % 4 == 0;
        if (group) out[k++] = '(';
        const char *a = ATOMS[rng_next(rs) % N_ATOMS];
        k += (size_t)snprintf(out + k, cap - k, "%s", a);
        if (group) {
            out[k++] = '|';
            a = ATOMS[rng_next(rs) % N_ATOMS];
            k += (size_t)snprintf(out + k, cap - k, "%s)", a);
        }
        static const char *const Q[] = {"", "", "*", "+", "?", "{2}", "{1,3}", "{0,}"};
        k += (size_t)snprintf(out + k, cap - k, "%s", Q[rng_next(rs) % 8]);
    }
    if (rng_next(rs) % 2) out[k++] = '$';
    out[k] = 0;
}

static int64_t n_code_points(const char *s, size_t n)
{
    int64_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += ((unsigned char)s[i] & 0xC0) != 0x80;
    return k;
}

/* The verdict on a spec from each pattern's own automaton, the code
 * points counted and the exclusions compared: no product involved, so
 * that the products' results are checked against something else. */
static bool spec_by_parts(const jstr_spec *s, rx_dfa *const *pat, rx_dfa *const *npat,
                          const char *str, size_t n)
{
    int64_t len = n_code_points(str, n);
    if (len < s->min_len || (s->max_len >= 0 && len > s->max_len)) return false;
    for (int i = 0; i < s->n_pattern; i++)
        if (!rx_match(pat[i], str, n)) return false;
    for (int i = 0; i < s->n_not_pattern; i++)
        if (rx_match(npat[i], str, n)) return false;
    for (size_t i = 0; i < s->n_except; i++)
        if (s->except_len[i] == n && memcmp(s->except[i], str, n) == 0) return false;
    return true;
}

static void test_round_trip(void **state)
{
    (void)state;
    uint64_t rs = 0x9E3779B97F4A7C15ull;
    int n_true = 0, n_false = 0;
    double t0 = now_s();
    for (int it = 0; it < N_ROUNDS; it++) {
        char p1[256], p2[256];
        random_pattern(&rs, p1, sizeof p1);
        random_pattern(&rs, p2, sizeof p2);
        jstr_spec s = {.max_len = -1, .pattern = {p1}, .n_pattern = 1};
        if (it % 3 == 1) s.not_pattern[0] = p2, s.n_not_pattern = 1;
        if (it % 3 == 2) s.pattern[1] = p2, s.n_pattern = 2;
        if (it % 4 == 0)
            s.min_len = (int64_t)(rng_next(&rs) % 3),
            s.max_len = s.min_len + (int64_t)(rng_next(&rs) % 5);
        const char *ex[2] = {"a", "ab"};
        size_t exn[2] = {1, 2};
        if (it % 5 == 0) s.except = ex, s.except_len = exn, s.n_except = 2;
        bool empty;
        gram *g = spec_gram(&s, &empty);
        rx_dfa *pat[2] = {NULL, NULL}, *npat[1] = {NULL};
        char err[BASE_ERR_CAP] = "";
        for (int i = 0; i < s.n_pattern; i++)
            assert_int_equal(rx_compile(s.pattern[i], strlen(s.pattern[i]), true, &pat[i], err),
                             KEEL_OK);
        for (int i = 0; i < s.n_not_pattern; i++)
            assert_int_equal(
                rx_compile(s.not_pattern[i], strlen(s.not_pattern[i]), true, &npat[i], err),
                KEEL_OK);
        for (int j = 0; j < 40; j++) {
            char str[64];
            size_t n = 0;
            int len = (int)(rng_next(&rs) % 7);
            for (int c = 0; c < len; c++) {
                const char *a = ALPHA[rng_next(&rs) % N_ALPHA];
                memcpy(str + n, a, strlen(a));
                n += strlen(a);
            }
            if (j % 10 == 9)
                n = 1 + (size_t)(j % 20 == 9), memcpy(str, "ab", 2); /* the exclusions */
            bool ok = both(&s, g, str, n);
            if (ok != spec_by_parts(&s, pat, npat, str, n))
                fail_msg("product: %d, parts: %d on \"%.*s\" (%s / %s)", ok, !ok, (int)n, str, p1,
                         p2);
            if (empty) assert_false(ok);
            ok ? n_true++ : n_false++;
        }
        for (int i = 0; i < 2; i++)
            rx_free(pat[i]);
        rx_free(npat[0]);
        gram_free(g);
    }
    /* formats, with and without lengths, on mutations of valid examples */
    static const char *const fmt_ex[][2] = {
        {"date", "2024-02-29"},
        {"time", "23:59:60.5+00:00"},
        {"date-time", "1963-06-19T08:30:06.283185Z"},
        {"duration", "P1Y2M3DT4H5M6S"},
        {"uuid", "2eb8aa08-aa98-11ea-b4aa-73b441d16380"},
        {"email", "\"jo\\\"e b\"@[IPv6:::ffff:1.2.3.4]"},
        {"hostname", "a-b.example.com"},
        {"ipv4", "192.168.10.1"},
        {"ipv6", "1:2:3::7:8"},
        {"uri", "http://u@[::1]:8/a?b#c"},
        {"uri-reference", "//a/b%20c?d"},
        {"iri", "http://\xc3\xa9.fr/p?\xee\x80\x80#f"},
        {"uri-template", "/a/{+b,c*}{?d:3}"},
        {"json-pointer", "/a~1b/~0c"},
        {"relative-json-pointer", "12/a~1"},
    };
    static const char MUT[] = "0123456789:-.T/@[]\"\\%~#?aZ";
    for (size_t f = 0; f < sizeof fmt_ex / sizeof fmt_ex[0]; f++)
        for (int variant = 0; variant < 2; variant++) {
            jstr_spec s = {.max_len = -1, .format = {fmt_ex[f][0]}, .n_format = 1};
            if (variant) s.min_len = 3, s.max_len = 24;
            bool empty;
            gram *g = spec_gram(&s, &empty);
            assert_true(empty ==
                        (variant && strcmp(fmt_ex[f][0], "uuid") == 0)); /* 36 characters */
            jstr_auto *a = NULL, *a0 = NULL; /* a0: the format without lengths */
            char err[BASE_ERR_CAP] = "";
            assert_int_equal(jstr_auto_open(&s, &a, err), KEEL_OK);
            jstr_spec s0 = s;
            s0.min_len = 0, s0.max_len = -1;
            assert_int_equal(jstr_auto_open(&s0, &a0, err), KEEL_OK);
            size_t n0 = strlen(fmt_ex[f][1]);
            if (!variant || n0 <= 24) assert_true(both(&s, g, fmt_ex[f][1], n0));
            for (int j = 0; j < N_MUTATIONS; j++) {
                char str[64];
                memcpy(str, fmt_ex[f][1], n0);
                size_t n = n0;
                int edits = 1 + (int)(rng_next(&rs) % 2);
                for (int e = 0; e < edits && n > 0; e++) {
                    size_t at = (size_t)(rng_next(&rs) % n);
                    switch (rng_next(&rs) % 3) {
                    case 0:
                        str[at] = MUT[rng_next(&rs) % (sizeof MUT - 1)];
                        break;
                    case 1:
                        memmove(str + at, str + at + 1, n - at - 1), n--;
                        break;
                    default:
                        memmove(str + at + 1, str + at, n - at), n++;
                        str[at] = MUT[rng_next(&rs) % (sizeof MUT - 1)];
                        break;
                    }
                }
                bool ok = both_auto(a, &s, g, str, n);
                if (ok != spec_test(&s, str, n) && j < 5)
                    fail_msg("jstr_auto_test and jstr_test differ");
                int64_t len = n_code_points(str, n);
                bool parts = jstr_auto_test(a0, str, n) && len >= s.min_len &&
                             (s.max_len < 0 || len <= s.max_len);
                if (ok != parts)
                    fail_msg("format %s with lengths: %d, parts %d", fmt_ex[f][0], ok, parts);
                ok ? n_true++ : n_false++;
            }
            jstr_auto_close(a);
            jstr_auto_close(a0);
            gram_free(g);
        }
    print_message("round trip: %d accepted, %d rejected, %.2f s\n", n_true, n_false, now_s() - t0);
    assert_true(n_true > N_ROUNDS * 2 && n_false > N_ROUNDS * 2);
}

/* ---- allocation failures -------------------------------------------------------- */

static keel_status op_gbnf(void *ctx)
{
    const jstr_spec *s = ctx;
    char *out = NULL, err[BASE_ERR_CAP] = "";
    size_t n = 0;
    bool empty = false;
    keel_status st = jstr_gbnf(s, "x", &out, &n, &empty, err);
    if (!st && !empty) base_free(out, n + 1);
    if (st && !err[0]) return KEEL_EINTERNAL; /* a failure always says what */
    return st;
}

static keel_status op_test(void *ctx)
{
    bool ok = false;
    char err[BASE_ERR_CAP] = "";
    return jstr_test(ctx, "abcd", 4, &ok, err);
}

static void test_alloc_failures(void **state)
{
    (void)state;
    const char *ex[] = {"ab", "abc"};
    size_t exn[] = {2, 3};
    jstr_spec s = {.min_len = 1,
                   .max_len = 6,
                   .pattern = {"^[a-z]{2,}\\d?$"},
                   .n_pattern = 1,
                   .not_pattern = {"q"},
                   .n_not_pattern = 1,
                   .except = ex,
                   .except_len = exn,
                   .n_except = 2};
    int64_t n1 = test_alloc_sweep(op_gbnf, &s);
    int64_t n2 = test_alloc_sweep(op_test, &s);
    jstr_spec f = {.max_len = -1, .format = {"date"}, .n_format = 1};
    int64_t n3 = test_alloc_sweep(op_gbnf, &f);
    jstr_spec l = {.min_len = 2, .max_len = 9};
    int64_t n4 = test_alloc_sweep(op_gbnf, &l);
    print_message("allocation sites swept: %lld %lld %lld %lld\n", (long long)n1, (long long)n2,
                  (long long)n3, (long long)n4);
    assert_true(n1 > 20 && n2 > 20 && n3 > 10 && n4 > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_semantics),     cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_caps),          cmocka_unit_test(test_spec),
        cmocka_unit_test(test_automata),      cmocka_unit_test(test_formats),
        cmocka_unit_test(test_suite_formats), cmocka_unit_test(test_suite_patterns),
        cmocka_unit_test(test_round_trip),    cmocka_unit_test(test_alloc_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
