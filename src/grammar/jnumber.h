/*
 * jnumber.h — JSON numbers under JSON Schema's numeric keywords, as GBNF
 * (jnumber.c). Private to src/grammar.
 *
 * A jnum_spec is one conjunction: a number must satisfy every field.
 * Bounds and divisors are decimal texts (jnum_text writes a JSON number
 * of the schema as the shortest decimal that reads back to the same
 * double, or an integer exactly), compared exactly, never in floating
 * point. The schema compiler (jschema.c) builds a spec from the numeric
 * keywords of one schema after allOf / not / if have been merged.
 *
 * The texts: with no bound, divisor or exclusion, JSON's number grammar
 * (an integer kind: -?(0|[1-9][0-9]*) with an optional fraction of zeros,
 * "1.0" being an integer in JSON Schema). Under any constraint, numbers
 * without an exponent (the grammar cannot compare an exponent's value
 * exactly; docs/grammar-numbers.md): every accepted text satisfies the
 * spec, and every satisfying value has an accepted spelling.
 *
 * Refusals are KEEL_EUNSUPPORTED with err saying what (the caller adds
 * the keyword location), e.g. "multipleOf 1e-400 has too many digits";
 * KEEL_ERANGE past a cap ("multipleOf 86400 needs more than 10000 residue
 * states", 2^16 product states, 4096 rules, 256 excluded values);
 * KEEL_EINVAL for a constant that is not a number, multipleOf <= 0, a
 * rule name outside [a-zA-Z0-9_-]+; KEEL_ENOMEM.
 */
#ifndef KEEL_GRAMMAR_JNUMBER_H
#define KEEL_GRAMMAR_JNUMBER_H

#include "../base/base.h"

#define JNUM_MAX_ITEMS 16
#define JNUM_TEXT_CAP 400 /* the longest finite double, 5e-324, is 343 bytes plain */

enum {
    JNUM_ANY = 0,  /* any number */
    JNUM_INT = 1,  /* integer-valued ("3", "3.0") */
    JNUM_FRAC = 2, /* not integer-valued ("3.5") */
};

typedef struct jnum_spec {
    int kind;                                 /* JNUM_* */
    const char *lo[JNUM_MAX_ITEMS];           /* value >= lo (> when lo_excl) */
    bool lo_excl[JNUM_MAX_ITEMS];
    int n_lo;
    const char *hi[JNUM_MAX_ITEMS];           /* value <= hi (< when hi_excl) */
    bool hi_excl[JNUM_MAX_ITEMS];
    int n_hi;
    const char *mult[JNUM_MAX_ITEMS];         /* value is a multiple of each (> 0) */
    int n_mult;
    const char *not_mult[JNUM_MAX_ITEMS];     /* value is a multiple of none */
    int n_not_mult;
    const char *const *except;                /* values excluded (decimal texts) */
    size_t n_except;
} jnum_spec;

/* The rules of the numbers that satisfy s: a rule named `name` and helper
 * rules named `name`-<suffix>; *out is base_alloc'd text of *n_out + 1
 * bytes (NUL-terminated). *empty is set when no number satisfies s (then
 * *out is NULL and the caller drops the alternative). */
keel_status jnum_gbnf(const jnum_spec *s, const char *name, char **out, size_t *n_out, bool *empty, char *err);

/* Whether the JSON number text satisfies s (exponents allowed here). */
keel_status jnum_test(const jnum_spec *s, const char *text, bool *ok, char *err);

/* Writes the JSON number v (a jansson integer or real, passed as its
 * json_t) as a decimal text into out[JNUM_TEXT_CAP]; false when v is not
 * a number or not finite. */
struct json_t;
bool jnum_text(const struct json_t *v, char *out);

/* Compares two decimal texts exactly: <0, 0, >0. */
int jnum_cmp(const char *a, const char *b);

#endif /* KEEL_GRAMMAR_JNUMBER_H */
