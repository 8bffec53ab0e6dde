/*
 * test_jsts.c — JSON-Schema-Test-Suite (draft 2020-12) conformance of the
 * schema compiler (gram_compile_schema) and the matcher, and of the CLI
 * `keel grammar --json-schema S --test T.jsonl` on a sample of the cases.
 *
 * Data: tests/data/jsts (tools/grammar/extract_jsts.py), found through
 * KEEL_TESTDATA (tests/jsts.cmake); index.txt lists the files and their
 * group ("required": every file of tests/draft2020-12, "optional": the optional
 * files and the files of optional/format); floor.txt holds the least right
 * fraction of the required group.
 *
 * For each (schema, instance) pair: the schema is written compactly (in
 * document order: the order of `properties` matters to the grammar) and
 * compiled; a refusal counts the case's pairs "refused" with the message.
 * Otherwise the instance is written compactly, in the spelling the grammars
 * accept (jansson's JSON_COMPACT: raw UTF-8, control characters as \uXXXX
 * or \n-style escapes; reals laid out as jansson's %.17g but with the
 * fewest digits that read back to the same double, since 17 digits write
 * 0.1 as 0.10000000000000001: spell_real), and matched. The grammars
 * fix the order of object members, so an instance counts as accepted when
 * SOME ordering of the members of its objects (all of them, nested ones
 * too) is a sentence: the orderings are enumerated, document order first,
 * when there are at most JSTS_MAX_ORDERINGS of them; with more, only
 * document order is tried and the pair is "skipped" unless it is accepted.
 *
 * Categories: right, wrong-accept (an invalid instance accepted: the
 * exactness failure), wrong-reject, refused, skipped, format (required
 * format.json: a string the suite calls valid because `format` is only an
 * annotation there, rejected because keel asserts the format), error (a
 * matcher limit, KEEL_ERANGE). The test fails on a wrong-accept in the
 * required group and when the required group's right / (pairs - format)
 * drops below floor.txt. A table per file goes to stdout and to
 * $KEEL_BUILD/jsts/report.txt, every pair's verdict to details.txt, and
 * the numbers as JSON to report.json (also to stdout with --json, and to
 * the file named by KEEL_JSTS_JSON).
 */
#include "testutil.h"
#include "base/base.h"
#include "grammar/grammar.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define JSTS_MAX_ORDERINGS 5040 /* 7!: an object of 7 members, or 3! * 4! * ... */
#define JSTS_CLI_EVERY 3        /* the CLI check takes every 3rd case */

enum { R_RIGHT, R_WRONG_ACCEPT, R_WRONG_REJECT, R_REFUSED, R_SKIPPED, R_FORMAT, R_ERROR, R_N };
static const char *const g_rshort[R_N] = {"right", "w-acc", "w-rej", "refused", "skipped", "format", "error"};
static const char *const g_rname[R_N] = {"right", "wrong_accept", "wrong_reject", "refused",
                                         "skipped", "format", "error"};

/* ---- growable text ---------------------------------------------------------------- */

typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (b->n + n + 1 > cap) cap *= 2;
        char *q = realloc(b->p, cap);
        assert_non_null(q);
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

/* ---- a value's compact spelling, member order chosen per object ------------------ */

/* A JSON value with its scalars and keys already spelled. Objects of two
 * or more members are numbered (obj) for the ordering enumeration. */
typedef struct snode {
    int kind;           /* 0 scalar, 1 array, 2 object */
    char *text;         /* scalar: its spelling */
    size_t n_text;
    int32_t n_kids;
    struct snode *kids; /* [n_kids] elements or member values */
    char **keys;        /* object: [n_kids] keys spelled with their quotes */
    int32_t obj;        /* index among the objects that have orderings, or -1 */
} snode;

typedef struct order {
    int32_t n_obj;
    int32_t *size;      /* [n_obj] members of each numbered object */
    int64_t total;      /* orderings, capped at JSTS_MAX_ORDERINGS + 1 */
} order;

static int64_t fact(int32_t k)
{
    int64_t f = 1;
    for (int32_t i = 2; i <= k; i++) {
        f *= i;
        if (f > JSTS_MAX_ORDERINGS) return JSTS_MAX_ORDERINGS + 1;
    }
    return f;
}

/* A real as jansson writes it (%.17g's layout: positional notation for
 * decimal exponents -4..16, else d.ddde-7 without '+' or leading zeros;
 * ".0" after an integral value) but with the fewest significant digits
 * that read back to the same double: jansson's 17 digits write 0.1 as
 * 0.10000000000000001, which is not the number the suite means. */
static char *spell_real(double d)
{
    char e[64], out[400];
    int p = 1;
    for (; p <= 17; p++) {
        snprintf(e, sizeof e, "%.*e", p - 1, d);
        if (strtod(e, NULL) == d) break;
    }
    char *x = strchr(e, 'e');
    assert_non_null(x);
    int exp10 = atoi(x + 1);
    if (exp10 >= -4 && exp10 < 17) {
        snprintf(out, sizeof out, "%.*f", p - 1 - exp10 > 0 ? p - 1 - exp10 : 0, d);
        if (!strchr(out, '.')) strcat(out, ".0");
    } else {
        *x = 0;
        snprintf(out, sizeof out, "%se%d", e, exp10);
    }
    char *s = strdup(out);
    assert_non_null(s);
    return s;
}

/* jansson's compact spelling of a scalar (reals: spell_real). */
static char *spell(const json_t *v, size_t *n)
{
    char *s = json_is_real(v) ? spell_real(json_real_value(v)) : json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    assert_non_null(s);
    *n = strlen(s);
    return s;
}

static void snode_build(const json_t *v, snode *o, order *ord)
{
    memset(o, 0, sizeof *o);
    o->obj = -1;
    if (json_is_array(v)) {
        o->kind = 1;
        o->n_kids = (int32_t)json_array_size(v);
        o->kids = calloc((size_t)o->n_kids + 1, sizeof *o->kids);
        assert_non_null(o->kids);
        for (int32_t i = 0; i < o->n_kids; i++) snode_build(json_array_get(v, (size_t)i), &o->kids[i], ord);
    } else if (json_is_object(v)) {
        o->kind = 2;
        o->n_kids = (int32_t)json_object_size(v);
        o->kids = calloc((size_t)o->n_kids + 1, sizeof *o->kids);
        o->keys = calloc((size_t)o->n_kids + 1, sizeof *o->keys);
        assert_true(o->kids && o->keys);
        int32_t i = 0;
        /* jansson iterates in insertion order: document order */
        for (void *it = json_object_iter((json_t *)v); it; it = json_object_iter_next((json_t *)v, it), i++) {
            json_t *k = json_stringn(json_object_iter_key(it), json_object_iter_key_len(it));
            assert_non_null(k);
            size_t n;
            o->keys[i] = spell(k, &n);
            json_decref(k);
            snode_build(json_object_iter_value(it), &o->kids[i], ord);
        }
        if (o->n_kids >= 2) {
            o->obj = ord->n_obj++;
            int32_t *q = realloc(ord->size, (size_t)ord->n_obj * sizeof *q);
            assert_non_null(q);
            ord->size = q;
            ord->size[o->obj] = o->n_kids;
            int64_t f = fact(o->n_kids);
            ord->total = ord->total * f > JSTS_MAX_ORDERINGS ? JSTS_MAX_ORDERINGS + 1 : ord->total * f;
        }
    } else {
        o->text = spell(v, &o->n_text);
    }
}

static void snode_free(snode *o)
{
    for (int32_t i = 0; i < o->n_kids; i++) {
        snode_free(&o->kids[i]);
        if (o->keys) free(o->keys[i]);
    }
    free(o->kids);
    free(o->keys);
    free(o->text);
}

/* Writes o with the members of numbered object j in the order of the
 * permutation whose Lehmer index is lehmer[j] (all zero: document order). */
static void snode_emit(const snode *o, const int64_t *lehmer, sbuf *b)
{
    if (o->kind == 0) {
        sb_put(b, o->text, o->n_text);
        return;
    }
    sb_str(b, o->kind == 1 ? "[" : "{");
    int32_t avail[16], perm_i = 0;
    int64_t idx = o->obj >= 0 ? lehmer[o->obj] : 0;
    for (int32_t i = 0; i < o->n_kids && i < 16; i++) avail[i] = i;
    int32_t n_avail = o->n_kids;
    for (int32_t i = 0; i < o->n_kids; i++) {
        int32_t c = i;
        if (o->obj >= 0 && o->n_kids <= 7) { /* a larger object has one ordering under the cap */
            int64_t f = fact(n_avail - 1);
            int32_t d = (int32_t)(idx / f);
            idx %= f;
            c = avail[d];
            memmove(avail + d, avail + d + 1, (size_t)(n_avail - d - 1) * sizeof *avail);
            n_avail--;
        }
        if (perm_i++) sb_str(b, ",");
        if (o->kind == 2) {
            sb_str(b, o->keys[c]);
            sb_str(b, ":");
        }
        snode_emit(&o->kids[c], lehmer, b);
    }
    sb_str(b, o->kind == 1 ? "]" : "}");
}

/* The spelling of ordering number i (0: document order). */
static void spell_ordering(const snode *o, const order *ord, int64_t i, sbuf *b)
{
    int64_t lehmer[16] = {0};
    int64_t *lh = ord->n_obj > 16 ? calloc((size_t)ord->n_obj, sizeof *lh) : lehmer;
    assert_non_null(lh);
    for (int32_t j = 0; j < ord->n_obj; j++) {
        int64_t f = fact(ord->size[j]);
        lh[j] = i % f;
        i /= f;
    }
    b->n = 0;
    snode_emit(o, lh, b);
    if (lh != lehmer) free(lh);
}

/* ---- the suite -------------------------------------------------------------------- */

typedef struct pair_res {
    char *text;        /* the instance in document order */
    bool valid;        /* the suite's verdict */
    bool accepted0;    /* document order accepted (library) */
    int res;           /* R_* */
} pair_res;

typedef struct case_res {
    int32_t file;
    char *schema;      /* compact, document order */
    char *desc;
    bool refused;
    char msg[BASE_ERR_CAP];
    int32_t n_pairs;
    pair_res *pairs;
} case_res;

typedef struct tally {
    int64_t n[R_N];
    int64_t pairs;
} tally;

typedef struct suite {
    int32_t n_files;
    char **file;       /* [n_files] path under tests/data/jsts */
    bool *required;    /* [n_files] */
    int32_t n_cases;
    case_res *cases;
    tally *per_file;   /* [n_files] */
    tally group[2];    /* 0 required, 1 optional */
    double floor;
    char dir[512];     /* tests/data/jsts */
} suite;

static suite g_suite;
static bool g_json_stdout;

/* KEEL_TESTDATA/jsts, else tests/data/jsts from the tree or from a build
 * folder inside it. */
static const char *data_dir(void)
{
    static char dir[512];
    const char *d = getenv("KEEL_TESTDATA");
    snprintf(dir, sizeof dir, "%s/jsts", d ? d : access("tests/data/jsts", R_OK) == 0 ? "tests/data" : "../tests/data");
    return dir;
}

/* Decides one pair: some ordering accepted, none, too many, or a limit. */
static int judge(gram_matcher *m, const json_t *inst, bool valid, bool format_file, pair_res *pr)
{
    snode root;
    order ord = {0, NULL, 1};
    snode_build(inst, &root, &ord);
    sbuf b = {0};
    spell_ordering(&root, &ord, 0, &b);
    pr->text = strdup(b.p);
    assert_non_null(pr->text);
    int res = -1;
    bool accepted = false;
    /* past the cap only document order is tried: accepted decides, else skipped */
    int64_t n_try = ord.total > JSTS_MAX_ORDERINGS ? 1 : ord.total;
    for (int64_t i = 0; res < 0 && i < n_try && !accepted; i++) {
        if (i) spell_ordering(&root, &ord, i, &b);
        assert_int_equal(gram_matcher_reset(m), KEEL_OK);
        keel_status st = gram_matcher_accept_bytes(m, (const uint8_t *)b.p, b.n, NULL);
        if (st == KEEL_OK && gram_matcher_complete(m)) accepted = true;
        else if (st != KEEL_OK && st != KEEL_EINVAL) res = R_ERROR;
        if (i == 0) pr->accepted0 = accepted;
    }
    if (res < 0 && !accepted && ord.total > JSTS_MAX_ORDERINGS) res = R_SKIPPED;
    if (res < 0) {
        if (accepted == valid) res = R_RIGHT;
        else if (accepted) res = R_WRONG_ACCEPT;
        else res = format_file && json_is_string(inst) ? R_FORMAT : R_WRONG_REJECT;
    }
    free(b.p);
    snode_free(&root);
    free(ord.size);
    return res;
}

static void run_case(suite *s, int32_t fi, const json_t *c, case_res *cr)
{
    const json_t *schema = json_object_get(c, "schema"), *tests = json_object_get(c, "tests");
    assert_true(schema && json_is_array(tests));
    cr->file = fi;
    cr->desc = strdup(json_string_value(json_object_get(c, "description")) ? json_string_value(json_object_get(c, "description")) : "");
    snode sn;
    order ord = {0, NULL, 1};
    snode_build(schema, &sn, &ord);
    sbuf b = {0};
    spell_ordering(&sn, &ord, 0, &b);
    cr->schema = b.p;
    snode_free(&sn);
    free(ord.size);

    gram *g = NULL;
    gram_matcher *m = NULL;
    keel_status st = gram_compile_schema(cr->schema, b.n, &g, cr->msg);
    cr->refused = st != KEEL_OK;
    if (st == KEEL_OK) {
        gram_limits lim = gram_limits_default();
        assert_int_equal(gram_matcher_open(g, NULL, &lim, &m, cr->msg), KEEL_OK);
    } else {
        /* a refusal must say why: a status the compiler documents and a message */
        assert_true(st == KEEL_EUNSUPPORTED || st == KEEL_ERANGE || st == KEEL_EFORMAT);
        assert_true(cr->msg[0] != 0);
    }
    bool format_file = s->required[fi] && strcmp(s->file[fi], "required/format.json") == 0;
    cr->n_pairs = (int32_t)json_array_size(tests);
    cr->pairs = calloc((size_t)cr->n_pairs + 1, sizeof *cr->pairs);
    assert_non_null(cr->pairs);
    for (int32_t t = 0; t < cr->n_pairs; t++) {
        const json_t *tc = json_array_get(tests, (size_t)t);
        pair_res *pr = &cr->pairs[t];
        pr->valid = json_is_true(json_object_get(tc, "valid"));
        if (cr->refused) {
            pr->res = R_REFUSED;
            pr->text = NULL;
        } else {
            pr->res = judge(m, json_object_get(tc, "data"), pr->valid, format_file, pr);
        }
        s->per_file[fi].n[pr->res]++;
        s->per_file[fi].pairs++;
        s->group[s->required[fi] ? 0 : 1].n[pr->res]++;
        s->group[s->required[fi] ? 0 : 1].pairs++;
    }
    gram_matcher_close(m);
    gram_free(g);
}

static double right_frac(const tally *t)
{
    int64_t d = t->pairs - t->n[R_FORMAT];
    return d > 0 ? (double)t->n[R_RIGHT] / (double)d : 1.0;
}

static void tally_row(FILE *f, const char *name, const tally *t)
{
    fprintf(f, "%-38s %6lld", name, (long long)t->pairs);
    for (int r = 0; r < R_N; r++) fprintf(f, " %7lld", (long long)t->n[r]);
    fprintf(f, " %6.1f%%\n", 100.0 * right_frac(t));
}

static void tally_json(json_t *o, const tally *t)
{
    json_object_set_new(o, "pairs", json_integer(t->pairs));
    for (int r = 0; r < R_N; r++) json_object_set_new(o, g_rname[r], json_integer(t->n[r]));
    json_object_set_new(o, "right_fraction", json_real(right_frac(t)));
}

/* The refusal messages without their location, with the pairs they cost. */
static void refusal_reasons(const suite *s, FILE *f, json_t *arr)
{
    int32_t n = 0;
    char (*msg)[BASE_ERR_CAP] = calloc((size_t)s->n_cases + 1, sizeof *msg);
    int64_t *cnt = calloc((size_t)s->n_cases + 1, sizeof *cnt), *cases = calloc((size_t)s->n_cases + 1, sizeof *cases);
    assert_true(msg && cnt && cases);
    for (int32_t i = 0; i < s->n_cases; i++) {
        const case_res *c = &s->cases[i];
        if (!c->refused) continue;
        char m[BASE_ERR_CAP];
        snprintf(m, sizeof m, "%s", c->msg);
        char *at = strstr(m, " at ");
        if (at) *at = 0;
        at = strstr(m, " ('"); /* "'$ref' to another document ('x.json')": one line for all documents */
        if (at) {
            char tail[BASE_ERR_CAP];
            const char *q = strstr(at, "')");
            snprintf(tail, sizeof tail, "%s", q ? q + 2 : "");
            snprintf(at, sizeof m - (size_t)(at - m), " (...)%s", tail);
        }
        int32_t j = 0;
        while (j < n && strcmp(msg[j], m) != 0) j++;
        if (j == n) memcpy(msg[n++], m, sizeof m);
        cnt[j] += c->n_pairs;
        cases[j]++;
    }
    for (int32_t k = 0; k < n; k++) { /* most pairs first */
        int32_t best = k;
        for (int32_t j = k + 1; j < n; j++)
            if (cnt[j] > cnt[best]) best = j;
        char tm[BASE_ERR_CAP];
        int64_t tc = cnt[k], tcs = cases[k];
        memcpy(tm, msg[k], sizeof tm);
        memcpy(msg[k], msg[best], sizeof tm);
        memcpy(msg[best], tm, sizeof tm);
        cnt[k] = cnt[best], cases[k] = cases[best];
        cnt[best] = tc, cases[best] = tcs;
        fprintf(f, "  %5lld pairs %4lld schemas  %s\n", (long long)cnt[k], (long long)cases[k], msg[k]);
        json_t *o = json_object();
        json_object_set_new(o, "reason", json_string(msg[k]));
        json_object_set_new(o, "pairs", json_integer(cnt[k]));
        json_object_set_new(o, "schemas", json_integer(cases[k]));
        json_array_append_new(arr, o);
    }
    free(msg);
    free(cnt);
    free(cases);
}

static void report(const suite *s, FILE *f, json_t *js)
{
    fprintf(f, "JSON-Schema-Test-Suite draft 2020-12: (schema, instance) pairs per file\n");
    fprintf(f, "%-38s %6s", "file", "pairs");
    for (int r = 0; r < R_N; r++) fprintf(f, " %7s", g_rshort[r]);
    fprintf(f, " %7s\n", "right%");
    json_t *files = js ? json_array() : NULL;
    for (int grp = 0; grp < 2; grp++) {
        for (int32_t i = 0; i < s->n_files; i++) {
            if (s->required[i] != (grp == 0)) continue;
            tally_row(f, s->file[i], &s->per_file[i]);
            if (!js) continue;
            json_t *o = json_object();
            json_object_set_new(o, "file", json_string(s->file[i]));
            tally_json(o, &s->per_file[i]);
            json_array_append_new(files, o);
        }
        tally_row(f, grp == 0 ? "TOTAL required" : "TOTAL optional", &s->group[grp]);
        fprintf(f, "\n");
    }
    fprintf(f, "right%% = right / (pairs - format); floor of the required group: %.4f\n", s->floor);
    fprintf(f, "refusals (message without its location):\n");
    json_t *reasons = json_array();
    refusal_reasons(s, f, reasons);
    if (!js) {
        json_decref(reasons);
        return;
    }
    json_t *req = json_object(), *opt = json_object();
    tally_json(req, &s->group[0]);
    tally_json(opt, &s->group[1]);
    json_object_set_new(js, "required", req);
    json_object_set_new(js, "optional", opt);
    json_object_set_new(js, "floor", json_real(s->floor));
    json_object_set_new(js, "max_orderings", json_integer(JSTS_MAX_ORDERINGS));
    json_object_set_new(js, "files", files);
    json_object_set_new(js, "refusals", reasons);
}

static void details(const suite *s, FILE *f)
{
    for (int32_t i = 0; i < s->n_cases; i++) {
        const case_res *c = &s->cases[i];
        fprintf(f, "== %s: %s\n   schema %s\n", s->file[c->file], c->desc, c->schema);
        if (c->refused) fprintf(f, "   refused: %s\n", c->msg);
        for (int32_t t = 0; t < c->n_pairs; t++)
            fprintf(f, "   %-12s valid=%d  %s\n", g_rname[c->pairs[t].res], c->pairs[t].valid,
                    c->pairs[t].text ? c->pairs[t].text : "");
    }
}

static FILE *out_file(const char *name, char *path, size_t cap)
{
    const char *b = getenv("KEEL_BUILD");
    snprintf(path, cap, "%s/jsts", b ? b : ".");
    if (mkdir(path, 0755) != 0 && errno != EEXIST) return NULL;
    snprintf(path, cap, "%s/jsts/%s", b ? b : ".", name);
    return fopen(path, "w");
}

static int suite_setup(void **state)
{
    (void)state;
    suite *s = &g_suite;
    snprintf(s->dir, sizeof s->dir, "%s", data_dir());
    char path[1024];
    snprintf(path, sizeof path, "%s/floor.txt", s->dir);
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "test_jsts: cannot open %s (set KEEL_TESTDATA to tests/data)\n", path);
        return -1;
    }
    char line[512];
    s->floor = -1;
    while (fgets(line, sizeof line, f))
        if (line[0] != '#' && line[0] != '\n') s->floor = strtod(line, NULL);
    fclose(f);
    snprintf(path, sizeof path, "%s/index.txt", s->dir);
    f = fopen(path, "r");
    if (!f || s->floor < 0) {
        if (f) fclose(f);
        fprintf(stderr, "test_jsts: %s or floor.txt unreadable\n", path);
        return -1;
    }
    while (fgets(line, sizeof line, f)) {
        char grp[32], rel[400];
        if (sscanf(line, "%31s %399s", grp, rel) != 2) continue;
        s->file = realloc(s->file, (size_t)(s->n_files + 1) * sizeof *s->file);
        s->required = realloc(s->required, (size_t)(s->n_files + 1) * sizeof *s->required);
        assert_true(s->file && s->required);
        s->file[s->n_files] = strdup(rel);
        s->required[s->n_files] = strcmp(grp, "required") == 0;
        s->n_files++;
    }
    fclose(f);
    s->per_file = calloc((size_t)s->n_files, sizeof *s->per_file);
    assert_non_null(s->per_file);
    for (int32_t i = 0; i < s->n_files; i++) {
        snprintf(path, sizeof path, "%s/%s", s->dir, s->file[i]);
        json_error_t je;
        json_t *doc = json_load_file(path, JSON_ALLOW_NUL, &je);
        /* integers past 64 bits (optional/bignum.json) only as doubles */
        if (!doc) doc = json_load_file(path, JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, &je);
        if (!doc) {
            fprintf(stderr, "test_jsts: %s: %s (line %d)\n", path, je.text, je.line);
            return -1;
        }
        size_t n = json_array_size(doc);
        s->cases = realloc(s->cases, (size_t)(s->n_cases + (int32_t)n + 1) * sizeof *s->cases);
        assert_non_null(s->cases);
        for (size_t k = 0; k < n; k++) {
            case_res *cr = &s->cases[s->n_cases++];
            memset(cr, 0, sizeof *cr);
            run_case(s, i, json_array_get(doc, k), cr);
        }
        json_decref(doc);
    }
    return 0;
}

static int suite_teardown(void **state)
{
    (void)state;
    suite *s = &g_suite;
    for (int32_t i = 0; i < s->n_cases; i++) {
        for (int32_t t = 0; t < s->cases[i].n_pairs; t++) free(s->cases[i].pairs[t].text);
        free(s->cases[i].pairs);
        free(s->cases[i].schema);
        free(s->cases[i].desc);
    }
    for (int32_t i = 0; i < s->n_files; i++) free(s->file[i]);
    free(s->file);
    free(s->required);
    free(s->cases);
    free(s->per_file);
    memset(s, 0, sizeof *s);
    return 0;
}

static void test_suite_table(void **state)
{
    (void)state;
    suite *s = &g_suite;
    json_t *js = json_object();
    assert_non_null(js);
    report(s, stdout, js);
    char path[1024];
    FILE *f = out_file("report.txt", path, sizeof path);
    assert_non_null(f);
    report(s, f, NULL); /* the same text; the JSON is built once above */
    assert_int_equal(fclose(f), 0);
    f = out_file("details.txt", path, sizeof path);
    assert_non_null(f);
    details(s, f);
    assert_int_equal(fclose(f), 0);
    f = out_file("report.json", path, sizeof path);
    printf("report: %s (report.txt and details.txt beside it)\n", path);
    assert_non_null(f);
    assert_int_equal(json_dumpf(js, f, JSON_INDENT(1)), 0);
    assert_int_equal(fclose(f), 0);
    const char *jp = getenv("KEEL_JSTS_JSON");
    if (jp && *jp) assert_int_equal(json_dump_file(js, jp, JSON_INDENT(1)), 0);
    if (g_json_stdout) {
        assert_int_equal(json_dumpf(js, stdout, JSON_INDENT(1)), 0);
        printf("\n");
    }
    json_decref(js);

    /* every pair of the required group was decided one way or another */
    const tally *req = &s->group[0];
    int64_t sum = 0;
    for (int r = 0; r < R_N; r++) sum += req->n[r];
    assert_int_equal(sum, req->pairs);
    assert_true(req->pairs > 1000);
    /* the exactness failure: an invalid instance accepted by a schema keel compiled */
    for (int32_t i = 0; i < s->n_cases; i++)
        for (int32_t t = 0; t < s->cases[i].n_pairs; t++)
            if (s->cases[i].pairs[t].res == R_WRONG_ACCEPT && s->required[s->cases[i].file])
                print_error("wrong accept: %s: %s: schema %s instance %s\n", s->file[s->cases[i].file],
                            s->cases[i].desc, s->cases[i].schema, s->cases[i].pairs[t].text);
    assert_int_equal(req->n[R_WRONG_ACCEPT], 0);
    if (right_frac(req) < s->floor)
        print_error("required group: right fraction %.4f below the floor %.4f\n", right_frac(req), s->floor);
    assert_true(right_frac(req) >= s->floor);
}

/* `keel grammar --json-schema S --test T.jsonl` on every JSTS_CLI_EVERY-th
 * case of the required group must say what the library says of the
 * document-order spelling of each instance (and refuse what it refuses). */
static void test_cli_agrees(void **state)
{
    (void)state;
    suite *s = &g_suite;
    const char *bin = getenv("KEEL_BIN");
    if (!bin || access(bin, X_OK) != 0) {
        printf("test_cli_agrees: KEEL_BIN (the keel executable) not found; skipped\n");
        skip();
    }
    char sp[256], tp[256], op[256];
    assert_true(test_temp_file(sp, sizeof sp, "jsts_schema"));
    assert_true(test_temp_file(tp, sizeof tp, "jsts_texts"));
    assert_true(test_temp_file(op, sizeof op, "jsts_out"));
    int32_t n_cases = 0, n_texts = 0, n_refused = 0;
    for (int32_t i = 0; i < s->n_cases; i += JSTS_CLI_EVERY) {
        const case_res *c = &s->cases[i];
        if (!s->required[c->file]) continue;
        FILE *f = fopen(sp, "w");
        assert_non_null(f);
        fputs(c->schema, f);
        assert_int_equal(fclose(f), 0);
        f = fopen(tp, "w");
        assert_non_null(f);
        for (int32_t t = 0; t < c->n_pairs && !c->refused; t++) {
            json_t *str = json_stringn(c->pairs[t].text, strlen(c->pairs[t].text));
            assert_non_null(str);
            char *line = json_dumps(str, JSON_COMPACT | JSON_ENCODE_ANY);
            assert_non_null(line);
            fprintf(f, "%s\n", line);
            free(line);
            json_decref(str);
        }
        assert_int_equal(fclose(f), 0);
        char cmd[1200];
        snprintf(cmd, sizeof cmd, "'%s' grammar --json-schema '%s' --test '%s' > '%s' 2>&1", bin, sp, tp, op);
        int rc = system(cmd);
        assert_true(rc != -1 && WIFEXITED(rc));
        size_t n_out = 0;
        char *out = test_read_file(op, &n_out);
        assert_non_null(out);
        if (c->refused) {
            if (WEXITSTATUS(rc) != 3 || n_out < 13 || strncmp(out, "unsupported: ", 13) != 0)
                print_error("CLI accepts a schema the library refuses (%s): %s\n", c->msg, c->schema);
            assert_int_equal(WEXITSTATUS(rc), 3);
            assert_true(n_out >= 13 && strncmp(out, "unsupported: ", 13) == 0);
            n_refused++;
        } else {
            if (WEXITSTATUS(rc) != 0) print_error("CLI exit %d on %s: %s\n", WEXITSTATUS(rc), c->schema, out);
            assert_int_equal(WEXITSTATUS(rc), 0);
            char *p = out;
            for (int32_t t = 0; t < c->n_pairs; t++) {
                const char *want = c->pairs[t].accepted0 ? "accept\n" : "reject\n";
                assert_true(p + 7 <= out + n_out);
                if (strncmp(p, want, 7) != 0)
                    print_error("CLI disagrees on %s with %s: library %s", c->schema, c->pairs[t].text, want);
                assert_true(strncmp(p, want, 7) == 0);
                p += 7;
                n_texts++;
            }
            assert_true(p == out + n_out); /* one line per text, nothing else */
        }
        free(out);
        n_cases++;
    }
    unlink(sp);
    unlink(tp);
    unlink(op);
    printf("CLI: %d schemas (%d refused by both), %d texts: the same verdicts as the library\n", n_cases,
           n_refused, n_texts);
    assert_true(n_cases > 100);
}

/* The shortest-real spelling and the ordering enumeration themselves. */
static void test_spelling(void **state)
{
    (void)state;
    json_error_t je;
    json_t *v = json_loads("{\"b\":[0.1,1.0,{\"y\":1,\"x\":\"\\u00e9\\n\"}],\"a\":1e20,\"c\":null}", 0, &je);
    assert_non_null(v);
    snode n;
    order ord = {0, NULL, 1};
    snode_build(v, &n, &ord);
    assert_int_equal(ord.n_obj, 2);
    assert_int_equal(ord.total, 12); /* 3! * 2! */
    sbuf b = {0};
    spell_ordering(&n, &ord, 0, &b);
    assert_string_equal(b.p, "{\"b\":[0.1,1.0,{\"y\":1,\"x\":\"\xc3\xa9\\n\"}],\"a\":1e20,\"c\":null}");
    int seen = 0;
    for (int64_t i = 0; i < ord.total; i++) {
        spell_ordering(&n, &ord, i, &b);
        seen += strcmp(b.p, "{\"c\":null,\"a\":1e20,\"b\":[0.1,1.0,{\"x\":\"\xc3\xa9\\n\",\"y\":1}]}") == 0;
    }
    assert_int_equal(seen, 1);
    free(b.p);
    snode_free(&n);
    free(ord.size);
    json_decref(v);
    static const struct {
        double d;
        const char *s;
    } reals[] = {{300.0, "300.0"}, {0.1, "0.1"}, {1.5e-7, "1.5e-7"}, {1e20, "1e20"}, {-0.0, "-0.0"},
                 {9007199254740992.0, "9007199254740992.0"}, {1e16, "10000000000000000.0"}, {1e17, "1e17"},
                 {0.0001, "0.0001"}, {0.00001, "1e-5"}, {1.2345678910111214e52, "1.2345678910111214e52"},
                 {-2.5, "-2.5"}, {0.0075, "0.0075"}, {1e308, "1e308"}, {99.99999999999999, "99.99999999999999"}};
    for (size_t i = 0; i < sizeof reals / sizeof reals[0]; i++) {
        char *s = spell_real(reals[i].d);
        assert_string_equal(s, reals[i].s);
        free(s);
    }
}

/* judge: an instance whose members the grammar wants in another order
 * (nested too) is accepted through some ordering; past the cap it is skipped. */
static void test_orderings(void **state)
{
    (void)state;
    const char *schema = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":"
                         "\"object\",\"properties\":{\"x\":{\"type\":\"boolean\"},\"y\":{\"type\":\"null\"}}}}}";
    char err[BASE_ERR_CAP] = "";
    gram *g = NULL;
    gram_matcher *m = NULL;
    assert_int_equal(gram_compile_schema(schema, strlen(schema), &g, err), KEEL_OK);
    gram_limits lim = gram_limits_default();
    assert_int_equal(gram_matcher_open(g, NULL, &lim, &m, err), KEEL_OK);
    static const struct {
        const char *inst;
        bool valid;
        int want;
        bool accepted0;
    } cases[] = {
        {"{\"b\":{\"y\":null,\"x\":true},\"a\":1}", true, R_RIGHT, false},
        {"{\"b\":{\"y\":null,\"x\":true},\"a\":1}", false, R_WRONG_ACCEPT, false},
        {"{\"a\":1,\"b\":{\"x\":true,\"y\":null}}", true, R_RIGHT, true},
        {"{\"b\":{\"y\":null,\"x\":1},\"a\":1}", false, R_RIGHT, false},
        {"{\"b\":{\"y\":null,\"x\":1},\"a\":1}", true, R_WRONG_REJECT, false},
        {"{\"1\":1,\"2\":2,\"3\":3,\"4\":4,\"5\":5,\"6\":6,\"7\":7,\"8\":8}", true, R_RIGHT, true},
        {"{\"1\":1,\"2\":2,\"3\":3,\"4\":4,\"5\":5,\"6\":6,\"7\":7,\"a\":\"s\"}", false, R_SKIPPED, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_error_t je;
        json_t *v = json_loads(cases[i].inst, 0, &je);
        assert_non_null(v);
        pair_res pr = {0};
        int res = judge(m, v, cases[i].valid, false, &pr);
        if (res != cases[i].want) print_error("case %zu: %s, expected %s\n", i, g_rname[res], g_rname[cases[i].want]);
        assert_int_equal(res, cases[i].want);
        assert_int_equal(pr.accepted0, cases[i].accepted0);
        assert_string_equal(pr.text, cases[i].inst); /* document order, compact */
        free(pr.text);
        json_decref(v);
    }
    gram_matcher_close(m);
    gram_free(g);
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--json") == 0) g_json_stdout = true;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spelling),
        cmocka_unit_test(test_orderings),
        cmocka_unit_test(test_suite_table),
        cmocka_unit_test(test_cli_agrees),
    };
    return cmocka_run_group_tests(tests, suite_setup, suite_teardown);
}
