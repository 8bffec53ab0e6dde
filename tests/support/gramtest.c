/* gramtest.c — see gramtest.h. */
#include "gramtest.h"
#include "testutil.h"

#include <string.h>

bool test_gram_accepts(const gram *g, const char *text, size_t n)
{
    if (!g) return false;
    gram_matcher *m = NULL;
    char err[BASE_ERR_CAP] = "";
    keel_status st = gram_matcher_open(g, NULL, NULL, &m, err);
    if (st) fail_msg("matcher: %s", err);
    st = gram_matcher_accept_bytes(m, (const uint8_t *)text, n, NULL);
    if (st != KEEL_OK && st != KEEL_EINVAL) fail_msg("accept: %s", gram_matcher_error(m));
    bool ok = st == KEEL_OK && gram_matcher_complete(m);
    gram_matcher_close(m);
    return ok;
}

bool test_gram_accepts_str(const gram *g, const char *text)
{
    return test_gram_accepts(g, text, strlen(text));
}
