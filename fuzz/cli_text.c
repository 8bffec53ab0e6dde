/*
 * fuzz/cli_text.c — libFuzzer target: the CLI's text handling
 * (app/cli/common.c, compiled in): cli_put_escaped over arbitrary bytes
 * (model metadata and pieces are untrusted) and the strict number parsers.
 * Checks: escaped output holds no control byte, no C1 control and only
 * valid UTF-8, and unescaping it gives the input back; cli_parse_i32 and
 * cli_parse_u64 accept exactly the decimal strings whose value fits, and
 * cli_parse_f32 only finite values of a whole string.
 */
#include "../app/cli/common.c"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* main.c's two helpers, which common.c uses */
int cli_fail(const char *what, keel_status st, const char *detail)
{
    (void)what;
    (void)st;
    (void)detail;
    return 1;
}

void cli_write_file(void *user, const char *text, size_t n)
{
    fwrite(text, 1, n, (FILE *)user);
}

static int hexval(int c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

static void check_escape(const uint8_t *data, size_t size)
{
    char *out = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&out, &n);
    if (!f) abort();
    if (!cli_put_escaped(f, (const char *)data, size)) abort();
    if (fclose(f) != 0) abort();
    const uint8_t *o = (const uint8_t *)out;
    uint8_t *back = malloc(size + 1);
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        uint8_t c = o[i];
        if (c < 0x20 || c == 0x7f) abort(); /* nothing a terminal would act on */
        if (c == '\\') {
            if (i + 1 >= n) abort();
            char e = (char)o[i + 1];
            if (e == 'n' || e == 't' || e == 'r' || e == '\\') {
                back[k++] = e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : '\\';
                i += 2;
            } else if (e == 'x' && i + 3 < n && hexval(o[i + 2]) >= 0 && hexval(o[i + 3]) >= 0) {
                back[k++] = (uint8_t)(hexval(o[i + 2]) * 16 + hexval(o[i + 3]));
                i += 4;
            } else {
                abort();
            }
            continue;
        }
        size_t len = c < 0x80 ? 1 : utf8_ok(o + i, n - i);
        if (len == 0) abort(); /* invalid UTF-8 or a C1 control got through */
        if (k + len > size) abort();
        memcpy(back + k, o + i, len);
        k += len;
        i += len;
    }
    if (k != size || memcmp(back, data, size) != 0) abort();
    free(back);
    free(out);
}

static void check_numbers(const uint8_t *data, size_t size)
{
    char s[64];
    size_t m = size < sizeof s - 1 ? size : sizeof s - 1;
    memcpy(s, data, m);
    s[m] = 0;
    int32_t i32;
    uint64_t u64;
    float f32;
    /* reference: an optional sign, then digits only, value in range */
    size_t p = (s[0] == '-' || s[0] == '+') ? 1 : 0, d = p;
    while (s[d] >= '0' && s[d] <= '9') d++;
    bool digits = d > p && s[d] == 0;
    if (cli_parse_i32(s, &i32)) {
        if (!digits || (long long)i32 != strtoll(s, NULL, 10)) abort();
    } else if (digits) {
        long long v = strtoll(s, NULL, 10);
        if (v >= INT32_MIN && v <= INT32_MAX && strlen(s) < 12) abort();
    }
    if (cli_parse_u64(s, &u64)) {
        if (!digits || p != 0 || u64 != strtoull(s, NULL, 10)) abort();
    }
    if (cli_parse_f32(s, &f32)) {
        char *end;
        float r = strtof(s, &end);
        if (*end || !isfinite(f32) || memcmp(&r, &f32, sizeof r) != 0) abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    check_escape(data, size);
    check_numbers(data, size);
    return 0;
}
