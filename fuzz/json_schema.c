/*
 * fuzz/json_schema.c — libFuzzer target: the JSON Schema to GBNF compiler
 * (src/grammar/jschema*.c) over arbitrary schemas. The input is split at its
 * first NUL byte: the schema before it, a candidate instance after it.
 * Checks (abort on failure): a refusal carries a message; a schema that
 * compiles yields GBNF that gbnf.c compiles (the generator never writes a
 * grammar its own compiler rejects, KEEL_ERANGE aside); matching the
 * instance ends in accept, reject or a limit; nothing leaks.
 * Seeds: fuzz/corpus/libfuzzer_json_schema.
 */
#include "grammar/grammar.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t n = nul ? (size_t)(nul - data) : size;
    char *src = malloc(n ? n : 1);
    memcpy(src, data, n);
    char err[BASE_ERR_CAP] = "", *gbnf = NULL;
    size_t gn = 0;
    keel_status st = gram_schema_gbnf(src, n, &gbnf, &gn, err);
    free(src);
    if (st != KEEL_OK) {
        if (gbnf || !err[0]) abort();
        return 0;
    }
    gram *g = NULL;
    st = gram_compile(gbnf, gn, &g, err);
    base_free(gbnf, gn + 1);
    if (st == KEEL_ERANGE) return 0;
    if (st != KEEL_OK) abort(); /* the generator wrote a grammar gbnf.c refuses */
    gram_limits lim = gram_limits_default();
    lim.max_nodes = 1u << 14;
    lim.max_set = 256;
    lim.max_closure = 4096;
    lim.max_memo_ids = 1u << 18;
    gram_matcher *m = NULL;
    if (gram_matcher_open(g, NULL, &lim, &m, err) == KEEL_OK && nul) {
        st = gram_matcher_accept_bytes(m, nul + 1, size - n - 1, NULL);
        if (st != KEEL_OK && st != KEEL_EINVAL && st != KEEL_ERANGE) abort();
    }
    gram_matcher_close(m);
    gram_free(g);
    return 0;
}
