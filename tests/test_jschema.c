/*
 * test_jschema.c — the JSON Schema compiler's normal form (jschema.c,
 * jschema_emit.c) through gram_compile_schema: keywords that apply per
 * kind, allOf / anyOf / oneOf / not / if-then-else, object and array
 * keywords after merging, references by pointer, anchor and $id,
 * unevaluated*; each case lists texts the grammar must accept and texts it
 * must reject; then refusals (named keyword and location) and the caps.
 */
#include "testutil.h"
#include "gramtest.h"
#include "base/base.h"
#include "grammar/grammar.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct scase {
    const char *schema, *yes[6], *no[6];
} scase;

static const scase g_cases[] = {
    /* type-specific keywords apply to their kind only */
    {"{\"minimum\":1,\"maxLength\":1}", {"1", "\"x\"", "null", "{}", "[0]", "2.5"}, {"0", "\"xy\"", "-1"}},
    {"{\"type\":\"integer\"}", {"1", "1.0", "-0"}, {"1.5", "\"1\"", "null"}},
    {"{\"const\":1}", {"1", "1.0"}, {"2", "true", "\"1\""}},
    {"{\"type\":\"string\",\"enum\":[\"a\",1,\"b\"]}", {"\"a\"", "\"b\""}, {"1", "\"c\""}},
    {"{\"enum\":[[1,2],{\"a\":null}]}", {"[1,2]", "[ 1 , 2.0 ]", "{\"a\":null}"}, {"[2,1]", "{\"a\":1}", "[1]"}},
    /* enum arrays / objects filtered by the other keywords */
    {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"],"
     "\"enum\":[{\"a\":1},{\"a\":\"x\"},{\"b\":2}]}",
     {"{\"a\":1}"}, {"{\"a\":\"x\"}", "{\"b\":2}"}},
    {"{\"items\":{\"minimum\":2},\"uniqueItems\":true,\"enum\":[[1],[2,3],[3,3],\"s\"]}", {"[2,3]", "\"s\""},
     {"[1]", "[3,3]"}},
    /* allOf: per-kind intersection; additionalProperties sees its own schema's names */
    {"{\"allOf\":[{\"properties\":{\"a\":{\"type\":\"integer\"}}},{\"properties\":{\"a\":{\"minimum\":2}}}]}",
     {"{\"a\":2}", "{}", "\"s\""}, {"{\"a\":1}", "{\"a\":\"x\"}", "{\"a\":2.5}"}},
    {"{\"allOf\":[{\"properties\":{\"a\":{}},\"additionalProperties\":false},{\"properties\":{\"b\":{}}}]}",
     {"{\"a\":1}", "{}"}, {"{\"b\":1}", "{\"a\":1,\"b\":1}", "{\"c\":1}"}},
    {"{\"type\":\"object\",\"required\":[\"a\"],\"properties\":{\"a\":{\"type\":\"string\"}},\"$ref\":\"#/$defs/b\","
     "\"$defs\":{\"b\":{\"required\":[\"b\"]}}}",
     {"{\"a\":\"x\",\"b\":1}"}, {"{\"a\":\"x\"}", "{\"b\":1}", "{\"a\":1,\"b\":1}"}},
    /* oneOf: exactly one branch */
    {"{\"oneOf\":[{\"type\":\"integer\"},{\"minimum\":2}]}", {"1", "2.5", "\"x\""}, {"3", "2"}},
    {"{\"oneOf\":[{\"type\":\"string\"},{\"type\":\"null\"}]}", {"\"x\"", "null"}, {"1", "[]"}},
    {"{\"type\":\"object\",\"oneOf\":[{\"type\":\"object\",\"properties\":{\"a\":{}},\"required\":[\"a\"],"
     "\"additionalProperties\":false},{\"type\":\"object\",\"properties\":{\"b\":{}},\"required\":[\"b\"],"
     "\"additionalProperties\":false}]}",
     {"{\"a\":1}", "{\"b\":[]}"}, {"{\"a\":1,\"b\":2}", "{}", "1"}},
    /* a tagged union: branches with additionalProperties false cannot be complemented, but the tags differ */
    {"{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"a\"},\"x\":{\"type\":\"integer\"}},"
     "\"required\":[\"kind\"],\"additionalProperties\":false},{\"type\":\"object\",\"properties\":{\"kind\":"
     "{\"const\":\"b\"},\"y\":{\"type\":\"string\"}},\"required\":[\"kind\"],\"additionalProperties\":false}]}",
     {"{\"kind\":\"a\",\"x\":1}", "{\"kind\":\"b\",\"y\":\"s\"}"}, {"{\"kind\":\"a\",\"y\":\"s\"}", "{\"kind\":\"c\"}", "{}"}},
    /* not: the per-kind complement */
    {"{\"not\":{\"type\":\"string\"}}", {"1", "null", "[]", "{}"}, {"\"a\"", "\"\""}},
    {"{\"type\":\"object\",\"not\":{\"required\":[\"a\"]}}", {"{}", "{\"b\":1}"}, {"{\"a\":1}", "[]"}},
    {"{\"type\":\"object\",\"not\":{\"properties\":{\"a\":{\"type\":\"integer\"}}}}", {"{\"a\":\"x\"}", "{\"a\":1.5}"},
     {"{}", "{\"a\":1}", "{\"b\":1}"}},
    {"{\"type\":\"integer\",\"not\":{\"multipleOf\":2}}", {"3", "-1"}, {"4", "0", "1.5"}},
    {"{\"type\":\"array\",\"not\":{\"items\":{\"type\":\"integer\"}}}", {"[\"a\"]", "[1,null]"}, {"[]", "[1,2]"}},
    {"{\"type\":\"array\",\"not\":{\"prefixItems\":[{\"type\":\"string\"}],\"items\":{\"type\":\"integer\"}}}",
     {"[1]", "[\"a\",\"b\"]", "[\"a\",1,null]"}, {"[\"a\"]", "[\"a\",1,2]", "[]"}},
    {"{\"not\":{\"enum\":[1,\"a\",null]}}", {"2", "\"b\"", "true", "[]"}, {"1", "1.0", "\"a\"", "null"}},
    /* if / then / else */
    {"{\"if\":{\"type\":\"integer\"},\"then\":{\"minimum\":0},\"else\":{\"type\":\"string\"}}", {"1", "\"x\""},
     {"-1", "1.5", "null"}},
    /* object keywords */
    {"{\"dependentRequired\":{\"a\":[\"b\"]}}", {"{\"b\":1}", "{\"a\":1,\"b\":2}", "{}", "3"}, {"{\"a\":1}"}},
    {"{\"dependentSchemas\":{\"a\":{\"required\":[\"c\"]}}}", {"{\"b\":1}", "{\"a\":1,\"c\":2}"}, {"{\"a\":1}"}},
    {"{\"patternProperties\":{\"^x\":{\"type\":\"integer\"}},\"additionalProperties\":false}",
     {"{\"x1\":1}", "{}", "{\"x\":2,\"xy\":3}"}, {"{\"x1\":\"s\"}", "{\"y\":1}"}},
    {"{\"properties\":{\"foo\":{\"type\":\"array\"}},\"patternProperties\":{\"f.o\":{\"minItems\":2}}}",
     {"{\"foo\":[1,2]}", "{\"fao\":2}"}, {"{\"foo\":[]}", "{\"fao\":[1]}"}},
    {"{\"propertyNames\":{\"maxLength\":2}}", {"{\"ab\":1}", "{}"}, {"{\"abc\":1}"}},
    {"{\"propertyNames\":{\"enum\":[\"a\",\"b\"]}}", {"{\"a\":1}", "{\"a\":1,\"b\":2}"}, {"{\"c\":1}"}},
    {"{\"minProperties\":1,\"maxProperties\":2}", {"{\"a\":1}", "{\"a\":1,\"b\":2}", "7"},
     {"{}", "{\"a\":1,\"b\":2,\"c\":3}"}},
    {"{\"properties\":{\"a\":false}}", {"{}", "{\"b\":1}"}, {"{\"a\":1}"}},
    /* arrays */
    {"{\"contains\":{\"const\":1},\"minContains\":2,\"maxContains\":2}", {"[1,1]", "[1,2,1]", "{}"},
     {"[1]", "[1,1,1]", "[]"}},
    {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"contains\":{\"minimum\":5}}", {"[5]", "[1,7]"},
     {"[1]", "[\"a\",5]", "[]"}},
    {"{\"prefixItems\":[{\"type\":\"integer\"}],\"unevaluatedItems\":false}", {"[1]", "[]"}, {"[1,2]"}},
    /* two contains and a prefix: counts per contains, the prefix position's schema */
    {"{\"prefixItems\":[{\"type\":\"string\"}],\"allOf\":[{\"contains\":{\"const\":1}},{\"contains\":{\"const\":2},"
     "\"maxContains\":1}]}",
     {"[\"a\",1,2]", "[\"a\",2,1,1]", "[\"a\",1,2,\"b\"]"}, {"[\"a\",1]", "[\"a\",2,2,1]", "[2,1,\"b\"]", "[1,2]", "[\"a\",2]"}},
    {"{\"contains\":{\"type\":\"string\"},\"unevaluatedItems\":{\"type\":\"integer\"}}", {"[\"a\",1]", "[\"a\"]"},
     {"[\"a\",null]", "[1]"}},
    /* uniqueItems over finitely many values */
    {"{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\",1,1.0]},\"uniqueItems\":true,\"minItems\":1}",
     {"[\"a\"]", "[\"b\",\"a\"]", "[1,\"a\",\"b\"]", "[1.0]"}, {"[]", "[\"a\",\"a\"]", "[1,1.0]", "[\"c\"]"}},
    {"{\"prefixItems\":[{\"type\":\"boolean\"},{\"type\":\"boolean\"}],\"items\":false,\"uniqueItems\":true}",
     {"[]", "[true]", "[false,true]"}, {"[true,true]", "[false,false]", "[1]"}},
    /* references: pointers, anchors, $id resources */
    {"{\"$id\":\"http://x.y/root\",\"items\":{\"$ref\":\"item.json\"},\"$defs\":{\"i\":{\"$id\":\"item.json\","
     "\"type\":\"integer\"}}}",
     {"[1]", "[]"}, {"[\"a\"]"}},
    {"{\"$ref\":\"#num\",\"$defs\":{\"n\":{\"$anchor\":\"num\",\"type\":\"number\"}}}", {"1.5"}, {"\"x\""}},
    {"{\"type\":\"object\",\"properties\":{\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#\"}}},"
     "\"additionalProperties\":false}",
     {"{\"kids\":[{\"kids\":[]}]}", "{}"}, {"{\"kids\":[1]}", "{\"x\":1}"}},
    /* a recursive $ref beside other keywords */
    {"{\"type\":\"object\",\"properties\":{\"n\":{\"allOf\":[{\"$ref\":\"#\"},{\"required\":[\"x\"]}]}}}",
     {"{}", "{\"n\":{\"x\":1}}", "{\"n\":{\"n\":{\"x\":2},\"x\":1}}"}, {"{\"n\":{}}", "{\"n\":{\"n\":{},\"x\":1}}", "{\"n\":1}"}},
    /* unevaluatedProperties sees allOf's properties */
    {"{\"properties\":{\"a\":{}},\"allOf\":[{\"properties\":{\"b\":{}}}],\"unevaluatedProperties\":false}",
     {"{\"a\":1,\"b\":2}", "{}"}, {"{\"c\":1}", "{\"a\":1,\"c\":1}"}},
    {"{\"type\":\"string\",\"pattern\":\"^a+$\"}", {"\"aa\""}, {"\"ab\"", "\"\""}},
};

static void test_cases(void **state)
{
    (void)state;
    for (size_t i = 0; i < BASE_ARRAY_LEN(g_cases); i++) {
        gram *g = NULL;
        char err[BASE_ERR_CAP] = "";
        if (gram_compile_schema(g_cases[i].schema, strlen(g_cases[i].schema), &g, err))
            fail_msg("schema %zu: %s", i, err);
        for (int k = 0; k < 6 && g_cases[i].yes[k]; k++)
            if (!test_gram_accepts_str(g, g_cases[i].yes[k])) fail_msg("schema %zu: '%s' rejected", i, g_cases[i].yes[k]);
        for (int k = 0; k < 6 && g_cases[i].no[k]; k++)
            if (test_gram_accepts_str(g, g_cases[i].no[k])) fail_msg("schema %zu: '%s' accepted", i, g_cases[i].no[k]);
        gram_free(g);
    }
}

static void test_refusals(void **state)
{
    (void)state;
    static const struct {
        const char *schema, *msg;
    } bad[] = {
        {"{\"oneOf\":[{\"patternProperties\":{\"a\":{\"type\":\"integer\"}}},{\"required\":[\"b\"]}]}",
         "'oneOf' whose branches may overlap and cannot be complemented is not supported ('not' of 'patternProperties' is not supported at /oneOf/0) at /"},
        {"{\"not\":{\"additionalProperties\":false}}", "'not' of 'additionalProperties' is not supported at /"},
        {"{\"$dynamicRef\":\"#a\",\"$defs\":{\"x\":{\"$dynamicAnchor\":\"a\"},\"y\":{\"$id\":\"y\",\"$dynamicAnchor\":\"a\"}}}",
         "depends on the dynamic scope"},
        {"{\"properties\":{\"a\":{\"type\":\"array\",\"uniqueItems\":true}}}",
         "'uniqueItems' true is not supported (it needs arrays of distinct values; exact only where every element is one "
         "of at most 10 values) at /properties/a"},
        {"{\"minimum\":\"1\"}", "'minimum' must be a finite number at /"},
    };
    for (size_t i = 0; i < BASE_ARRAY_LEN(bad); i++) {
        gram *g = NULL;
        char err[BASE_ERR_CAP] = "";
        keel_status st = gram_compile_schema(bad[i].schema, strlen(bad[i].schema), &g, err);
        if (st != KEEL_EUNSUPPORTED || !strstr(err, bad[i].msg))
            fail_msg("bad schema %zu: got %s '%s', want '%s'", i, keel_status_name(st), err, bad[i].msg);
        assert_null(g);
    }
}

/* Schemas no value satisfies compile to the empty language: every text
 * rejected, gram_accepts_nothing says so, and the engine refuses to
 * generate under one up front (keel_complete's json_schema). */
static void test_empty(void **state)
{
    (void)state;
    static const char *const none[] = {
        "false",
        "{\"not\":{}}",
        "{\"allOf\":[{\"type\":\"string\"},{\"type\":\"integer\"}]}",
        "{\"type\":\"array\",\"prefixItems\":[{}],\"items\":false,\"minItems\":2}",
        "{\"type\":\"integer\",\"minimum\":1.5,\"maximum\":1.9}",
        "{\"enum\":[1,2],\"type\":\"string\"}",
    };
    for (size_t i = 0; i < BASE_ARRAY_LEN(none); i++) {
        gram *g = NULL;
        char err[BASE_ERR_CAP] = "";
        keel_status st = gram_compile_schema(none[i], strlen(none[i]), &g, err);
        if (st) fail_msg("schema %zu: %s: %s", i, keel_status_name(st), err);
        bool empty = false;
        assert_int_equal(gram_accepts_nothing(g, &empty, err), KEEL_OK);
        if (!empty) fail_msg("schema %zu: not empty", i);
        assert_false(test_gram_accepts_str(g, "1"));
        assert_false(test_gram_accepts_str(g, "\"a\""));
        assert_false(test_gram_accepts_str(g, "[{},{}]"));
        assert_false(test_gram_accepts_str(g, ""));
        gram_free(g);
    }
    static const char *const some[] = {"true", "{\"type\":\"null\"}", "{\"const\":\"\"}", "{\"maxLength\":0}"};
    for (size_t i = 0; i < BASE_ARRAY_LEN(some); i++) {
        gram *g = NULL;
        char err[BASE_ERR_CAP] = "";
        assert_int_equal(gram_compile_schema(some[i], strlen(some[i]), &g, err), KEEL_OK);
        bool empty = true;
        assert_int_equal(gram_accepts_nothing(g, &empty, err), KEEL_OK);
        if (empty) fail_msg("schema %zu: empty", i);
        gram_free(g);
    }
}

/* Hostile schemas are refused quickly: an allOf product, a long $ref chain, a huge enum. */
static void test_caps(void **state)
{
    (void)state;
    char *s = malloc(1 << 20);
    assert_non_null(s);
    /* allOf of 6 anyOf of 8 kinds: 8^6 alternatives */
    size_t n = (size_t)snprintf(s, 1 << 20, "{\"allOf\":[");
    for (int i = 0; i < 6; i++) {
        n += (size_t)snprintf(s + n, (1 << 20) - n, "%s{\"anyOf\":[", i ? "," : "");
        for (int k = 0; k < 8; k++)
            n += (size_t)snprintf(s + n, (1 << 20) - n, "%s{\"minimum\":%d,\"maxLength\":%d}", k ? "," : "", k, k);
        n += (size_t)snprintf(s + n, (1 << 20) - n, "]}");
    }
    n += (size_t)snprintf(s + n, (1 << 20) - n, "]}");
    char err[BASE_ERR_CAP] = "";
    gram *g = NULL;
    clock_t t0 = clock();
    keel_status st = gram_compile_schema(s, n, &g, err);
    assert_int_equal(st, KEEL_EUNSUPPORTED);
    assert_non_null(strstr(err, "more than 256 alternatives"));
    /* a chain of 300 $refs through $defs */
    n = (size_t)snprintf(s, 1 << 20, "{\"$ref\":\"#/$defs/d0\",\"$defs\":{");
    for (int i = 0; i < 300; i++)
        n += (size_t)snprintf(s + n, (1 << 20) - n, "%s\"d%d\":{\"$ref\":\"#/$defs/d%d\"}", i ? "," : "", i, i + 1);
    n += (size_t)snprintf(s + n, (1 << 20) - n, ",\"d300\":{\"type\":\"null\"}}}");
    st = gram_compile_schema(s, n, &g, err);
    assert_int_equal(st, KEEL_EUNSUPPORTED);
    assert_non_null(strstr(err, "nested more than 64 deep"));
    /* an enum of 5000 values */
    n = (size_t)snprintf(s, 1 << 20, "{\"enum\":[");
    for (int i = 0; i < 5000; i++) n += (size_t)snprintf(s + n, (1 << 20) - n, "%s%d", i ? "," : "", i);
    n += (size_t)snprintf(s + n, (1 << 20) - n, "]}");
    st = gram_compile_schema(s, n, &g, err);
    assert_int_equal(st, KEEL_EUNSUPPORTED);
    assert_non_null(strstr(err, "at most 4096 values"));
    /* definitions each using the previous one twice: 2^30 expansions */
    n = (size_t)snprintf(s, 1 << 20, "{\"$ref\":\"#/$defs/d30\",\"$defs\":{\"d0\":{\"type\":\"integer\"}");
    for (int i = 1; i <= 30; i++)
        n += (size_t)snprintf(s + n, (1 << 20) - n, ",\"d%d\":{\"allOf\":[{\"$ref\":\"#/$defs/d%d\"},{\"$ref\":\"#/$defs/d%d\"}]}",
                              i, i - 1, i - 1);
    n += (size_t)snprintf(s + n, (1 << 20) - n, "}}");
    st = gram_compile_schema(s, n, &g, err);
    if (!((st == KEEL_EUNSUPPORTED && strstr(err, "normalization steps")) ||
          (st == KEEL_ERANGE && strstr(err, "normal form exceeds"))))
        fail_msg("doubling definitions: %s '%s'", keel_status_name(st), err);
    double secs = (double)(clock() - t0) / CLOCKS_PER_SEC;
    if (secs > 5) fail_msg("hostile schemas took %.1f s", secs);
    free(s);
}

static keel_status compile_schema_op(void *ctx)
{
    const char *src = ctx;
    gram *g = NULL;
    keel_status st = gram_compile_schema(src, strlen(src), &g, NULL);
    gram_free(g);
    return st;
}

/* Every allocation failing in turn: KEEL_ENOMEM and nothing left allocated. */
static void test_alloc_failures(void **state)
{
    (void)state;
    const char *src =
        "{\"$id\":\"http://x.y/r\",\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"minimum\":1},"
        "\"b\":{\"$ref\":\"#/$defs/s\"},\"c\":{\"type\":\"array\",\"prefixItems\":[{\"const\":1}],\"contains\":"
        "{\"type\":\"string\"},\"maxContains\":2}},\"patternProperties\":{\"^x\":{\"enum\":[\"p\",{\"q\":1}]}},"
        "\"required\":[\"a\"],\"oneOf\":[{\"required\":[\"b\"]},{\"not\":{\"minProperties\":3}}],"
        "\"if\":{\"required\":[\"c\"]},\"then\":{\"maxProperties\":4},\"unevaluatedProperties\":false,"
        "\"$defs\":{\"s\":{\"type\":\"string\",\"maxLength\":4,\"pattern\":\"^[a-z]+$\"}}}";
    assert_int_equal(compile_schema_op((void *)src), KEEL_OK);
    assert_true(test_alloc_sweep(compile_schema_op, (void *)src) > 10);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cases),
        cmocka_unit_test(test_refusals), cmocka_unit_test(test_empty),
        cmocka_unit_test(test_caps),
        cmocka_unit_test(test_alloc_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
