/*
 * cmd_grammar.c — `keel grammar (--gbnf FILE | --json-schema FILE) [--test
 * TEXTS.jsonl]`: compiles a GBNF grammar (or a JSON Schema into one,
 * keel_grammar_compile_schema) and, with --test, prints for each line of TEXTS.jsonl (a
 * JSON string holding a candidate text) `accept` when the whole text is a
 * complete sentence of the grammar, else `reject`, one line per text in
 * order, with the engine sampling uses (keel_grammar_match). A grammar or
 * schema the engine refuses prints `unsupported: REASON` once and exits 3; a
 * malformed line of the test file is an error (exit 1) naming the line.
 * Without --test it prints `ok` for a grammar that compiles.
 */
#include "cli.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const char *g_usage = "usage: keel grammar (--gbnf FILE | --json-schema FILE) [--test TEXTS.jsonl]\n"
                             "  --gbnf FILE   the grammar (llama.cpp's GBNF, start rule root)\n"
                             "  --json-schema FILE  a JSON Schema (the keywords of docs/grammar.md) instead\n"
                             "  --test FILE   one JSON string per line: prints accept or reject for each\n"
                             "exit 0: done; 3: the grammar is refused (unsupported: REASON); 1: an error; 2: usage";

static int hex4(const char *s, const char *e, uint32_t *v)
{
    if (e - s < 4) return 0;
    *v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        int h = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (h < 0) return 0;
        *v = *v * 16 + (uint32_t)h;
    }
    return 1;
}

static size_t put_utf8(uint32_t cp, char *o)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* Decodes the JSON string that is the whole of s[0..n) (blanks around it
 * allowed) into out (at least n bytes); false when it is not one. A lone
 * surrogate escape becomes its 3-byte encoding, as Python writes it. */
static bool json_string(const char *s, size_t n, char *out, size_t *n_out)
{
    const char *p = s, *e = s + n;
    while (p < e && (*p == ' ' || *p == '\t' || *p == '\r')) p++;
    while (e > p && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r')) e--;
    if (e - p < 2 || *p != '"' || e[-1] != '"') return false;
    p++;
    e--;
    size_t o = 0;
    while (p < e) {
        unsigned char c = (unsigned char)*p;
        if (c == '"' || c < 0x20) return false;
        if (c != '\\') {
            out[o++] = (char)c;
            p++;
            continue;
        }
        if (++p >= e) return false;
        char x = *p++;
        uint32_t cp;
        switch (x) {
        case '"': out[o++] = '"'; break;
        case '\\': out[o++] = '\\'; break;
        case '/': out[o++] = '/'; break;
        case 'b': out[o++] = '\b'; break;
        case 'f': out[o++] = '\f'; break;
        case 'n': out[o++] = '\n'; break;
        case 'r': out[o++] = '\r'; break;
        case 't': out[o++] = '\t'; break;
        case 'u':
            if (!hex4(p, e, &cp)) return false;
            p += 4;
            if (cp >= 0xd800 && cp <= 0xdbff && e - p >= 6 && p[0] == '\\' && p[1] == 'u') {
                uint32_t lo;
                if (hex4(p + 2, e, &lo) && lo >= 0xdc00 && lo <= 0xdfff) {
                    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                    p += 6;
                }
            }
            o += put_utf8(cp, out + o);
            break;
        default: return false;
        }
    }
    *n_out = o;
    return true;
}

int cmd_grammar(int argc, char **argv)
{
    const char *gbnf = NULL, *test = NULL, *schema = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            printf("%s\n", g_usage);
            return 0;
        }
        const char **dst = strcmp(argv[i], "--gbnf") == 0          ? &gbnf
                            : strcmp(argv[i], "--json-schema") == 0 ? &schema
                            : strcmp(argv[i], "--test") == 0        ? &test
                                                                    : NULL;
        if (!dst) {
            fprintf(stderr, "keel: grammar: unknown option '%s'\n%s\n", argv[i], g_usage);
            return 2;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "keel: grammar: option %s needs a value\n", argv[i]);
            return 2;
        }
        *dst = argv[++i];
    }
    if (!gbnf == !schema) {
        fprintf(stderr, "%s\n", g_usage);
        return 2;
    }
    size_t n_src = 0;
    const char *path = gbnf ? gbnf : schema;
    char *src = cli_read_file(path, &n_src);
    if (!src) {
        fprintf(stderr, "keel: %s %s: %s\n", gbnf ? "--gbnf" : "--json-schema", path, strerror(errno));
        return 1;
    }
    char err[256] = "";
    keel_grammar *g = NULL;
    keel_status st = gbnf ? keel_grammar_compile(src, n_src, &g, err) : keel_grammar_compile_schema(src, n_src, &g, err);
    free(src);
    if (st == KEEL_ENOMEM) return cli_fail("grammar", st, err);
    if (st != KEEL_OK) {
        printf("unsupported: %s\n", err[0] ? err : keel_strerror(st));
        return 3;
    }
    int rc = 0;
    if (!test) {
        printf("ok\n");
        keel_grammar_close(g);
        return 0;
    }
    size_t n_txt = 0;
    char *txt = cli_read_file(test, &n_txt);
    char *buf = txt ? malloc(n_txt + 1) : NULL;
    if (!txt || !buf) {
        fprintf(stderr, "keel: --test %s: %s\n", test, txt ? strerror(ENOMEM) : strerror(errno));
        rc = 1;
        goto done;
    }
    size_t line = 0;
    for (char *p = txt, *end = txt + n_txt; p < end;) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        char *le = nl ? nl : end;
        line++;
        size_t n = 0;
        if (!json_string(p, (size_t)(le - p), buf, &n)) {
            fprintf(stderr, "keel: --test %s line %zu: not a JSON string\n", test, line);
            rc = 1;
            goto done;
        }
        bool ok = false;
        if ((st = keel_grammar_match(g, buf, n, &ok, err)) != KEEL_OK) {
            rc = cli_fail("grammar", st, err);
            goto done;
        }
        if (!cli_write_stdout(ok ? "accept\n" : "reject\n", 7)) {
            rc = 1;
            goto done;
        }
        p = nl ? nl + 1 : end;
    }
done:
    free(buf);
    free(txt);
    keel_grammar_close(g);
    return rc;
}
