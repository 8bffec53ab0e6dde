/*
 * jstring.h — JSON strings under JSON Schema's string keywords, as GBNF
 * (jstring.c, on the regex engine of regex.c). Private to src/grammar.
 *
 * A jstr_spec is one conjunction: a string must satisfy every field. The
 * schema compiler (jschema.c) builds it from the string keywords of one
 * schema after allOf / not / if have been merged, and from the key
 * constraints of an object (propertyNames, patternProperties, declared
 * names). Lengths count code points, as JSON Schema does. Patterns are
 * ECMA-262 regular expressions with JSON Schema's semantics: a pattern
 * matches when it matches anywhere in the string (not implicitly
 * anchored); ^ and $ anchor at the string's start and end.
 *
 * The GBNF describes the whole JSON string token, quotes included. The
 * string's content is spelled the way a compact JSON serializer writes it
 * (the canonical spelling): a character is written raw except '"', '\\'
 * and U+0000..U+001F, which are written as the escapes \" \\ \b \f \n \r
 * \t or \u00XX (lowercase hex). Where the content is unconstrained
 * (no pattern, format, except list) any JSON spelling is accepted.
 *
 * Refusals are KEEL_EUNSUPPORTED with err saying what, without the
 * keyword location (the caller adds it), e.g. "pattern \"(a)\\1\":
 * backreferences are not supported"; KEEL_ERANGE past a cap (automaton
 * states); KEEL_ENOMEM.
 */
#ifndef KEEL_GRAMMAR_JSTRING_H
#define KEEL_GRAMMAR_JSTRING_H

#include "../base/base.h"

#define JSTR_MAX_ITEMS 16

typedef struct jstr_spec {
    int64_t min_len;                          /* code points; 0: none */
    int64_t max_len;                          /* -1: none */
    const char *pattern[JSTR_MAX_ITEMS];      /* each must match */
    int n_pattern;
    const char *not_pattern[JSTR_MAX_ITEMS];  /* none may match */
    int n_not_pattern;
    const char *format[JSTR_MAX_ITEMS];       /* each must hold ("date", "uuid", ...) */
    int n_format;
    const char *not_format[JSTR_MAX_ITEMS];   /* none may hold */
    int n_not_format;
    const char *const *except;                /* contents excluded (UTF-8, decoded) */
    const size_t *except_len;
    size_t n_except;
} jstr_spec;

/* The rules of the strings that satisfy s: a rule named `name` for the
 * whole string token (quotes included) and helper rules named
 * `name`-<suffix>; *out is base_alloc'd text of *n_out + 1 bytes
 * (NUL-terminated). *empty is set when no string satisfies s (then *out
 * is NULL and the caller drops the alternative). */
keel_status jstr_gbnf(const jstr_spec *s, const char *name, char **out, size_t *n_out, bool *empty, char *err);

/* Whether the content (UTF-8, decoded, n bytes) satisfies s. */
keel_status jstr_test(const jstr_spec *s, const char *content, size_t n, bool *ok, char *err);

/* The automaton of s, built once for many tests (enum filtering): the
 * same verdicts as jstr_test. Errors as jstr_test's; *out NULL on
 * failure. jstr_auto_close(NULL) is a no-op. */
typedef struct jstr_auto jstr_auto;
keel_status jstr_auto_open(const jstr_spec *s, jstr_auto **out, char *err);
bool jstr_auto_test(const jstr_auto *a, const char *content, size_t n);
void jstr_auto_close(jstr_auto *a);

/* The string token of content s[0..n) in the canonical spelling above,
 * quotes included, into out (at least 6 n + 3 bytes): the text the rules
 * of jstr_gbnf accept for it. Returns its length. */
size_t jstr_spell(const char *s, size_t n, char *out);

/* Whether `format` names a format jstr_gbnf asserts (the rest are refused
 * by the caller or treated as annotations, its choice). */
bool jstr_format_known(const char *format);

#endif /* KEEL_GRAMMAR_JSTRING_H */
