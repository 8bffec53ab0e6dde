/*
 * gramtest.h — the tests' check of a text against a compiled grammar
 * (src/grammar), shared by the grammar, regex, number, schema and tool-call
 * grammar tests.
 */
#ifndef KEEL_TESTS_GRAMTEST_H
#define KEEL_TESTS_GRAMTEST_H

#include "grammar/grammar.h"

#include <stdbool.h>
#include <stddef.h>

/* Whether text[0..n) is a complete sentence of g (a NULL g accepts
 * nothing), by the byte matcher; a matcher failure other than a refused
 * byte fails the test. */
bool test_gram_accepts(const gram *g, const char *text, size_t n);
/* The same for a NUL-terminated text. */
bool test_gram_accepts_str(const gram *g, const char *text);

#endif /* KEEL_TESTS_GRAMTEST_H */
