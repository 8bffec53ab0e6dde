/*
 * cachetier.c — libFuzzer target: arbitrary bytes as a value read from the
 * shared cache tier (tier_unwrap), under the fingerprint the first 8 bytes
 * name (so that mutations reach past the fingerprint check) and a bound of
 * 1 MiB. An accepted value must wrap back to the same bytes' payload and
 * history; nothing may read out of bounds. Seeds: values tier_wrap writes.
 */
#include "cachetier/tier.h"
#include "base/base.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 8) return 0;
    uint64_t fp;
    memcpy(&fp, data, 8);
    int32_t b = 0, *h = NULL, nh = 0;
    uint8_t *p = NULL;
    size_t n = 0;
    char err[256];
    keel_status st = tier_unwrap(fp, data + 8, size - 8, 1u << 20, &b, &h, &nh, &p, &n, err);
    if (st == KEEL_OK) {
        if (!h || !p || nh <= 0 || b <= 0 || b > nh || n == 0) abort();
        uint8_t *v = NULL;
        size_t vn = 0;
        if (tier_wrap(fp, b, h, nh, p, n, &v, &vn) != KEEL_OK) abort();
        int32_t b2 = 0, *h2 = NULL, nh2 = 0;
        uint8_t *p2 = NULL;
        size_t n2 = 0;
        if (tier_unwrap(fp, v, vn, 1u << 20, &b2, &h2, &nh2, &p2, &n2, err) != KEEL_OK || b2 != b || nh2 != nh ||
            n2 != n || memcmp(h2, h, (size_t)nh * 4) != 0 || memcmp(p2, p, n) != 0)
            abort();
        base_free(h2, (size_t)nh2 * 4);
        base_free(p2, n2);
        base_free(v, vn);
        base_free(h, (size_t)nh * 4);
        base_free(p, n);
    } else if (h || p) {
        abort();
    }
    return 0;
}
