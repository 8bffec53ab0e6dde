/*
 * regex.h — ECMA-262 regular expressions (code-point semantics, as with the
 * u flag) as deterministic automata over code points (regex.c), and the
 * operations the string constraints of JSON Schema need (regex_dfa.c).
 * Private to src/grammar; jstring.c is the client.
 *
 * The alphabet is the Unicode scalar values U+0000..U+10FFFF less the
 * surrogates U+D800..U+DFFF (a UTF-8 string cannot hold them): every
 * automaton sends a surrogate to its dead state.
 *
 * An rx_dfa is complete. The code-point range is cut into n_iv intervals
 * (interval i is [iv_lo[i], iv_lo[i + 1]), the last one ends at 0x110000),
 * each mapped to a class; the transition table has one column per class.
 * State 0 is the dead state (rejects, loops on every class), so an empty
 * language has start 0. Results of rx_compile, rx_strings and rx_product
 * are minimal (Hopcroft), with their states in breadth-first order.
 *
 *   field    shape                      meaning
 *   iv_lo    [n_iv] ascending, [0] = 0  first code point of each interval
 *   iv_cls   [n_iv] < n_cls             class of each interval
 *   next     [n_states][n_cls]          target state
 *   acc      [n_states] 0 / 1           accepting
 *
 * Caps: RX_MAX_STATES states in a result, RX_MAX_RAW states while
 * building (before minimization), RX_MAX_NFA states of the Thompson
 * automaton (bounds the expansion of {n,m}), RX_MAX_REPEAT for n and m,
 * and a work budget of the subset construction (states its closures
 * visit). Past one: KEEL_ERANGE, "... is too complex (more than N
 * automaton states)". Nothing allocates without a cap; nothing recurses
 * deeper than the group nesting (RX_MAX_NEST). No global state: every
 * function may run on many threads at once; an rx_dfa is read-only once
 * built.
 */
#ifndef KEEL_GRAMMAR_REGEX_H
#define KEEL_GRAMMAR_REGEX_H

#include "../base/base.h"

#define RX_MAX_STATES 4096u
#define RX_MAX_RAW    16384u
/* products (a pattern or format with length bounds, several patterns):
 * email with maxLength 254 is about 20,000 states, built in 0.3 s */
#define RX_MAX_PRODUCT     65536u
#define RX_MAX_PRODUCT_RAW 131072u
#define RX_MAX_NFA    200000u
#define RX_MAX_REPEAT 1000
#define RX_MAX_NEST   128
#define RX_MAX_CELLS  (1u << 23) /* states * classes of one table */
#define RX_CP_END     0x110000u

typedef struct rx_dfa {
    uint32_t *iv_lo;  /* [n_iv] */
    uint32_t *iv_cls; /* [n_iv] */
    uint32_t n_iv;
    uint32_t n_cls;
    uint32_t *next; /* [n_states * n_cls] */
    uint8_t *acc;   /* [n_states] */
    uint32_t n_states;
    uint32_t start;
} rx_dfa;

enum { RX_AND, RX_OR, RX_ANDNOT };

/* The strings the pattern (n bytes of UTF-8) matches. search: JSON Schema's
 * semantics (a match anywhere; ^ / $ anchor at the ends of the string);
 * otherwise the whole string must match. Errors: KEEL_EFORMAT (syntax,
 * "pattern \"...\": what at offset N"), KEEL_EUNSUPPORTED (backreferences,
 * lookaround, \p, inline flags), KEEL_ERANGE (caps), KEEL_ENOMEM.
 * err: BASE_ERR_CAP bytes. *out: rx_free it; NULL on failure. */
keel_status rx_compile(const char *pat, size_t n, bool search, rx_dfa **out, char *err);
/* Every string of mn..mx code points (mx -1: no upper bound): a counter,
 * one state per count (not minimized; products with it are). mx above
 * RX_MAX_RAW - 2 (or mn above it with mx -1) is KEEL_ERANGE. */
keel_status rx_length(int64_t mn, int64_t mx, rx_dfa **out, char *err);
/* Exactly the k strings s[i] (n[i] bytes of UTF-8 each; invalid UTF-8 is
 * never matched, so such an entry is left out). */
keel_status rx_strings(const char *const *s, const size_t *n, size_t k, rx_dfa **out, char *err);
/* a AND b, a OR b, a AND NOT b; minimized. */
keel_status rx_product(const rx_dfa *a, const rx_dfa *b, int op, rx_dfa **out, char *err);
void rx_free(rx_dfa *d);

/* Whether the n bytes of UTF-8 at s are accepted (invalid UTF-8: false). */
bool rx_match(const rx_dfa *d, const char *s, size_t n);
/* Marks in live[n_states] the states from which an accepting state can be
 * reached (0 never). KEEL_ENOMEM. */
keel_status rx_live(const rx_dfa *d, uint8_t *live);
/* Bounds on the lengths (code points) of the accepted strings: *mn the
 * shortest, *mx the longest or -1 when unbounded. Empty language: 0, 0.
 * KEEL_ENOMEM. */
keel_status rx_len_range(const rx_dfa *d, int64_t *mn, int64_t *mx);
/* Decodes one UTF-8 scalar at s[*i] (below n), advancing *i; -1 when
 * invalid (overlong, surrogate, truncated, above U+10FFFF). */
int32_t rx_utf8_next(const unsigned char *s, size_t n, size_t *i);

/* ---- between regex.c and regex_dfa.c ---- */

/* Ensures room for need elements of elsz bytes in *pp (capacity *cap,
 * doubling); false (nothing changed) when out of memory. */
bool rx_grow(void *pp, size_t *cap, size_t need, size_t elsz);
/* A DFA with n_iv intervals, n_cls classes and n_states states, zeroed
 * (every transition to the dead state); NULL when out of memory. */
rx_dfa *rx_dfa_new(uint32_t n_iv, uint32_t n_cls, uint32_t n_states);
/* Prunes, minimizes and merges the classes of d; KEEL_ERANGE ("<what>
 * is too complex ...") past RX_MAX_STATES, KEEL_ENOMEM. */
keel_status rx_finish(rx_dfa *d, const char *what, uint32_t max_states, char *err);

#endif /* KEEL_GRAMMAR_REGEX_H */
