/*
 * fuzz/json_number.c — libFuzzer target: numeric constraints as grammars
 * (src/grammar/jnumber.c). The input encodes a spec and some texts:
 *
 *   byte 0        kind (mod 3)
 *   byte 1        number of items (mod 8)
 *   per item      a byte t: the field (t mod 5: minimum, maximum, multipleOf,
 *                 not multipleOf, excluded), exclusive (bit 3), the constant
 *                 (t >> 4: one of 12 interesting decimals, or 12..15: a
 *                 literal of the next byte mod 24 characters, each the next
 *                 byte mod 13 in "0123456789.-e", so malformed too)
 *   the rest      texts to check, separated by spaces (at most 16)
 *
 * Checks (abort on failure): a refusal carries a message and no text; an
 * accepted spec yields GBNF that gbnf.c compiles (KEEL_ERANGE aside); for
 * a JSON number text, a grammar match implies jnum_test, and for a text
 * without exponent the two agree (an empty spec accepts nothing); a text
 * that is not a JSON number never matches; jnum_cmp is antisymmetric;
 * nothing leaks. Every input finishes: the automaton has a state cap, and
 * grammars past 64 KiB are built but not compiled.
 */
#include "grammar/grammar.h"
#include "grammar/jnumber.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZ_LIT 24
#define FZ_TEXTS 16
#define FZ_TEXT_MAX 96
#define FZ_GBNF_MAX (64u << 10)

static const char *const fz_consts[12] = {"0",  "-0",  "1",      "-1",    "0.5", "1.5",
                                          "0.01", "7", "0.0001", "-2.75", "100", "0.3"};

static bool fz_match(const gram *g, const char *t, size_t n)
{
    gram_matcher *m = NULL;
    char err[BASE_ERR_CAP];
    gram_limits lim = gram_limits_default();
    lim.max_nodes = 1u << 16;
    if (gram_matcher_open(g, NULL, &lim, &m, err) != KEEL_OK) abort();
    keel_status st = gram_matcher_accept_bytes(m, (const uint8_t *)t, n, NULL);
    if (st != KEEL_OK && st != KEEL_EINVAL) abort(); /* a number's grammar never reaches a matcher cap */
    bool ok = st == KEEL_OK && gram_matcher_complete(m);
    gram_matcher_close(m);
    return ok;
}

static int fz_sign(int r)
{
    return (r > 0) - (r < 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char lit[JNUM_MAX_ITEMS * 5][FZ_LIT + 1];
    const char *items[JNUM_MAX_ITEMS * 5];
    const char *exc[JNUM_MAX_ITEMS];
    size_t p = 0, n_lit = 0, n_items = 0;
    if (size < 2) return 0;
    jnum_spec s = {.kind = data[0] % 3, .except = exc};
    int n = data[1] % 8;
    p = 2;
    for (int i = 0; i < n && p < size; i++) {
        uint8_t t = data[p++];
        const char *c;
        if ((t >> 4) < 12) {
            c = fz_consts[t >> 4];
        } else {
            size_t len = p < size ? data[p++] % FZ_LIT : 0;
            char *l = lit[n_lit++];
            size_t k = 0;
            for (; k < len && p < size; k++) l[k] = "0123456789.-e"[data[p++] % 13];
            l[k] = 0;
            c = l;
        }
        items[n_items++] = c;
        bool excl = (t >> 3) & 1;
        switch (t % 5) {
        case 0: s.lo_excl[s.n_lo] = excl, s.lo[s.n_lo++] = c; break;
        case 1: s.hi_excl[s.n_hi] = excl, s.hi[s.n_hi++] = c; break;
        case 2: s.mult[s.n_mult++] = c; break;
        case 3: s.not_mult[s.n_not_mult++] = c; break;
        default: exc[s.n_except++] = c; break;
        }
    }
    /* jnum_cmp: antisymmetric, reflexive */
    for (size_t i = 0; i + 1 < n_items; i++) {
        if (fz_sign(jnum_cmp(items[i], items[i + 1])) != -fz_sign(jnum_cmp(items[i + 1], items[i]))) abort();
        if (jnum_cmp(items[i], items[i]) != 0) abort();
    }
    char *out = NULL, err[BASE_ERR_CAP] = "";
    size_t n_out = 0;
    bool empty = false;
    keel_status st = jnum_gbnf(&s, "n", &out, &n_out, &empty, err);
    if (st != KEEL_OK) {
        if (out || !err[0]) abort();
        return 0;
    }
    gram *g = NULL;
    if (!empty) {
        if (!out || strlen(out) != n_out) abort();
        if (n_out > FZ_GBNF_MAX) { /* thousands of rules: gbnf.c's compile time, not this target's subject */
            base_free(out, n_out + 1);
            return 0;
        }
        size_t len = n_out + 16;
        char *src = malloc(len);
        memcpy(src, "root ::= n\n", 11);
        memcpy(src + 11, out, n_out + 1);
        base_free(out, n_out + 1);
        st = gram_compile(src, strlen(src), &g, err);
        free(src);
        if (st == KEEL_ERANGE) return 0;
        if (st != KEEL_OK) abort(); /* jnumber.c wrote GBNF that gbnf.c refuses */
    } else if (out) {
        abort();
    }
    bool constrained = s.kind == JNUM_FRAC || s.n_lo || s.n_hi || s.n_mult || s.n_not_mult || s.n_except;
    for (int k = 0; k < FZ_TEXTS && p < size; k++) {
        const uint8_t *sp = memchr(data + p, ' ', size - p);
        size_t len = sp ? (size_t)(sp - (data + p)) : size - p;
        char text[FZ_TEXT_MAX + 1];
        size_t tl = BASE_MIN(len, (size_t)FZ_TEXT_MAX);
        memcpy(text, data + p, tl);
        text[tl] = 0;
        p += len + (sp ? 1 : 0);
        if (strlen(text) != tl) continue; /* a NUL inside */
        bool ok = false, got = g && fz_match(g, text, tl);
        st = jnum_test(&s, text, &ok, err);
        if (st == KEEL_EINVAL && strstr(err, "is not a JSON number")) {
            if (got) abort(); /* the grammar accepted a non-number */
            continue;
        }
        if (st != KEEL_OK) continue; /* a constant the test refuses (e.g. a divisor past 18 digits) */
        if (got && !ok) abort();
        bool has_exp = strpbrk(text, "eE") != NULL;
        if (!has_exp && ok != got) abort();
        if (has_exp && !constrained && s.kind == JNUM_ANY && ok != got) abort();
    }
    gram_free(g);
    return 0;
}
