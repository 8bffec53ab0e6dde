/*
 * fuzz/regex.c — libFuzzer target: the ECMA-262 regex engine and the JSON
 * string constraints (src/grammar/regex.c, jstring.c). The input is split
 * at its first NUL byte: a pattern before it, a text after it (no NUL:
 * the pattern alone). Checks (abort on failure):
 *   - a refusal carries a message and leaves no automaton; nothing hangs
 *     (the caps of regex.h bound every step);
 *   - with the pattern as a JSON Schema `pattern`, and again with
 *     maxLength 8, jstr_gbnf's grammar compiles and accepts the text's
 *     canonical JSON spelling exactly when jstr_test accepts the text
 *     (grammars over 64 KB are written but not compiled: speed);
 *   - the pattern as a whole-string match agrees with the search form
 *     where it must (a whole match is a search match);
 *   - nothing leaks (libFuzzer's leak check).
 * Seeds: fuzz/corpus/libfuzzer_regex (pattern NUL text).
 */
#include "grammar/grammar.h"
#include "grammar/jstring.h"
#include "grammar/regex.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_spec(const jstr_spec *s, const uint8_t *text, size_t text_n)
{
    char err[BASE_ERR_CAP] = "";
    char *gb = NULL;
    size_t n_gb = 0;
    bool empty = false;
    keel_status st = jstr_gbnf(s, "str", &gb, &n_gb, &empty, err);
    if (st != KEEL_OK) {
        if (gb || !err[0]) abort();
        return;
    }
    if (empty != (gb == NULL)) abort();
    bool ok = false;
    st = jstr_test(s, (const char *)text, text_n, &ok, err);
    if (st != KEEL_OK) abort(); /* jstr_gbnf built the same automaton */
    if (empty) {
        if (ok) abort();
        return;
    }
    if (n_gb >
        (64u << 10)) { /* thousands of states: compiling them is gbnf.c's business, and slow here */
        base_free(gb, n_gb + 1);
        return;
    }
    size_t cap = n_gb + 32;
    char *src = malloc(cap);
    int k = snprintf(src, cap, "root ::= str\n%s", gb);
    base_free(gb, n_gb + 1);
    gram *g = NULL;
    if (gram_compile(src, (size_t)k, &g, err) != KEEL_OK) abort();
    free(src);
    char *sp = malloc(text_n * 6 + 3);
    size_t n_sp = jstr_spell((const char *)text, text_n, sp);
    gram_matcher *m = NULL;
    if (gram_matcher_open(g, NULL, NULL, &m, err) != KEEL_OK) abort();
    st = gram_matcher_accept_bytes(m, (const uint8_t *)sp, n_sp, NULL);
    if (st != KEEL_OK && st != KEEL_EINVAL) abort();
    bool gm = st == KEEL_OK && gram_matcher_complete(m);
    /* invalid UTF-8 is never a JSON string's content: both reject it */
    if (gm != ok) abort();
    gram_matcher_close(m);
    gram_free(g);
    free(sp);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 4096) return 0;
    const uint8_t *nul = memchr(data, 0, size);
    size_t pat_n = nul ? (size_t)(nul - data) : size;
    char *pat = malloc(pat_n + 1); /* NUL-terminated for jstr_spec */
    memcpy(pat, data, pat_n);
    pat[pat_n] = 0;
    const uint8_t *text = nul ? nul + 1 : (const uint8_t *)"";
    size_t text_n = nul ? size - pat_n - 1 : 0;
    char err[BASE_ERR_CAP] = "";
    rx_dfa *d = NULL, *w = NULL;
    keel_status st = rx_compile(pat, pat_n, true, &d, err);
    if (st != KEEL_OK) {
        if (d || !err[0]) abort();
        free(pat);
        return 0;
    }
    if (rx_compile(pat, pat_n, false, &w, err) == KEEL_OK) {
        if (rx_match(w, (const char *)text, text_n) && !rx_match(d, (const char *)text, text_n))
            abort();
        rx_free(w);
    }
    rx_free(d);
    jstr_spec s = {.max_len = -1, .pattern = {pat}, .n_pattern = 1};
    check_spec(&s, text, text_n);
    s.max_len = 8;
    check_spec(&s, text, text_n);
    free(pat);
    return 0;
}
