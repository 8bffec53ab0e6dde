/*
 * toolcall_mm3.c — MiniMax M3's tool-call arguments: the body of an
 * <invoke> is XML elements, each prefixed by the namespace token
 * "]<]minimax[>[" (NS): NS<key>value NS</key>. An object value is its keys
 * as elements, an array value is NS<item> elements, a scalar is its text.
 * The tool's JSON schema decides the types as the template rendered them:
 * a string parameter (or a union with a string alternative) is the raw
 * text, even when it looks structured; numbers, booleans and null are
 * JSON literals; without a schema a literal that is JSON stays JSON.
 * The body is converted whole (the call's name was streamed before it).
 */
#include "toolcall_int.h"

#include <string.h>

#define MM3_NS "]<]minimax[>["
#define MM3_NS_LEN (sizeof MM3_NS - 1)
#define MM3_MAX_DEPTH 32

/* An element at s[*i..n) (whitespace before it allowed): its name and its
 * inner text, *i advanced past its close. */
typedef struct mm3_elem {
    const char *name;
    size_t name_len;
    const char *inner;
    size_t inner_len;
} mm3_elem;

static bool at(const char *s, size_t n, size_t i, const char *lit, size_t len)
{
    return i + len <= n && memcmp(s + i, lit, len) == 0;
}

static bool next_elem(const char *s, size_t n, size_t *i, mm3_elem *e)
{
    size_t j = tc_skip_ws(s, n, *i);
    if (!at(s, n, j, MM3_NS "<", MM3_NS_LEN + 1)) return false;
    j += MM3_NS_LEN + 1;
    size_t a = j;
    while (j < n && s[j] != '>' && s[j] != '<' && s[j] != '/' && !tc_is_ws((uint8_t)s[j]))
        j++;
    if (j >= n || s[j] != '>' || j == a) return false;
    e->name = s + a;
    e->name_len = j - a;
    j++;
    e->inner = s + j;
    /* the matching close: same-named elements nest */
    int depth = 1;
    for (size_t k = j; k < n; k++) {
        if (s[k] != MM3_NS[0] || !at(s, n, k, MM3_NS "<", MM3_NS_LEN + 1)) continue;
        size_t t = k + MM3_NS_LEN + 1;
        bool close = t < n && s[t] == '/';
        if (close) t++;
        if (!at(s, n, t, e->name, e->name_len) || t + e->name_len >= n || s[t + e->name_len] != '>') continue;
        depth += close ? -1 : 1;
        if (depth == 0) {
            e->inner_len = k - j;
            *i = t + e->name_len + 1;
            return true;
        }
    }
    return false;
}

/* ---- schema ------------------------------------------------------------------------ */

enum { MT_STRING = 1, MT_NUMBER = 2, MT_BOOL = 4, MT_NULL = 8, MT_OBJECT = 16, MT_ARRAY = 32 };

static int type_bit(const char *t)
{
    static const struct {
        const char *n;
        int b;
    } map[] = {{"string", MT_STRING}, {"number", MT_NUMBER}, {"integer", MT_NUMBER}, {"boolean", MT_BOOL},
               {"null", MT_NULL},     {"object", MT_OBJECT}, {"array", MT_ARRAY}};
    for (size_t i = 0; t && i < BASE_ARRAY_LEN(map); i++)
        if (strcmp(t, map[i].n) == 0) return map[i].b;
    return 0;
}

/* The types a schema allows (0: unknown), its alternatives included. */
static int types_of(const json_t *sch)
{
    if (!json_is_object(sch)) return 0;
    int b = 0;
    const json_t *t = json_object_get(sch, "type");
    if (json_is_string(t)) b |= type_bit(json_string_value(t));
    size_t i;
    json_t *v;
    if (json_is_array(t)) json_array_foreach(t, i, v) b |= type_bit(json_string_value(v));
    static const char *const alts[] = {"anyOf", "oneOf", NULL};
    for (int a = 0; alts[a]; a++) {
        const json_t *arr = json_object_get(sch, alts[a]);
        json_array_foreach(arr, i, v) b |= types_of(v);
    }
    if (!b && json_object_get(sch, "properties")) b = MT_OBJECT;
    if (!b && json_object_get(sch, "items")) b = MT_ARRAY;
    return b;
}

/* The alternative of sch (or sch itself) that allows `bit`. */
static const json_t *alt_with(const json_t *sch, int bit)
{
    if (!json_is_object(sch)) return NULL;
    static const char *const alts[] = {"anyOf", "oneOf", NULL};
    for (int a = 0; alts[a]; a++) {
        size_t i;
        json_t *v;
        json_array_foreach(json_object_get(sch, alts[a]), i, v) if (types_of(v) & bit) return alt_with(v, bit);
    }
    return sch;
}

/* ---- values ---------------------------------------------------------------------- */

static bool is_literal(const char *t, size_t n)
{
    if (n == 0) return false;
    if ((n == 4 && (memcmp(t, "true", 4) == 0 || memcmp(t, "null", 4) == 0)) ||
        (n == 5 && memcmp(t, "false", 5) == 0))
        return true;
    return (t[0] == '-' || (t[0] >= '0' && t[0] <= '9')) && tc_json_whole(t, n);
}

static keel_status put(tc_buf *b, const char *s)
{
    return tc_buf_append(b, s, strlen(s));
}

static keel_status put_string(tc_buf *b, const char *s, size_t n)
{
    keel_status st = put(b, "\"");
    if (!st) st = tc_buf_append_escaped(b, s, n);
    return st ? st : put(b, "\"");
}

static keel_status value(const json_t *sch, const char *v, size_t n, tc_buf *out, int depth, bool *ok);

static keel_status members(const json_t *sch, const char *v, size_t n, tc_buf *out, int depth, bool *ok)
{
    const json_t *props = json_object_get(sch, "properties");
    keel_status st = put(out, "{");
    size_t i = 0;
    mm3_elem e;
    bool first = true;
    while (!st && *ok && next_elem(v, n, &i, &e)) {
        char key[TOOLCALL_NAME_CAP];
        if (e.name_len >= sizeof key) {
            *ok = false;
            break;
        }
        memcpy(key, e.name, e.name_len);
        key[e.name_len] = '\0';
        st = put(out, first ? "\"" : ", \"");
        if (!st) st = tc_buf_append_escaped(out, key, e.name_len);
        if (!st) st = put(out, "\": ");
        if (!st) st = value(json_object_get(props, key), e.inner, e.inner_len, out, depth + 1, ok);
        first = false;
    }
    if (tc_skip_ws(v, n, i) != n) *ok = false;
    return st ? st : put(out, "}");
}

static keel_status items(const json_t *sch, const char *v, size_t n, tc_buf *out, int depth, bool *ok)
{
    const json_t *item = json_object_get(sch, "items");
    keel_status st = put(out, "[");
    size_t i = 0;
    mm3_elem e;
    bool first = true;
    while (!st && *ok && next_elem(v, n, &i, &e)) {
        if (e.name_len != 4 || memcmp(e.name, "item", 4) != 0) {
            *ok = false;
            break;
        }
        if (!first) st = put(out, ", ");
        if (!st) st = value(item, e.inner, e.inner_len, out, depth + 1, ok);
        first = false;
    }
    if (tc_skip_ws(v, n, i) != n) *ok = false;
    return st ? st : put(out, "]");
}

static keel_status value(const json_t *sch, const char *v, size_t n, tc_buf *out, int depth, bool *ok)
{
    if (depth > MM3_MAX_DEPTH) {
        *ok = false;
        return KEEL_OK;
    }
    int types = types_of(sch);
    if (types & MT_STRING) return put_string(out, v, n);
    size_t a = tc_skip_ws(v, n, 0), e = n;
    while (e > a && tc_is_ws((uint8_t)v[e - 1]))
        e--;
    if (at(v, e, a, MM3_NS, MM3_NS_LEN)) {
        size_t i = 0;
        mm3_elem first;
        bool arr = next_elem(v, n, &i, &first) && first.name_len == 4 && memcmp(first.name, "item", 4) == 0;
        if (arr && (types == 0 || (types & MT_ARRAY))) return items(alt_with(sch, MT_ARRAY), v, n, out, depth, ok);
        return members(alt_with(sch, MT_OBJECT), v, n, out, depth, ok);
    }
    if (is_literal(v + a, e - a) && (types == 0 || (types & (MT_NUMBER | MT_BOOL | MT_NULL))))
        return tc_buf_append(out, v + a, e - a);
    return put_string(out, v, n);
}

keel_status tc_mm3_args(const json_t *schema, const char *s, size_t n, tc_buf *json, bool *ok)
{
    *ok = true;
    if (tc_skip_ws(s, n, 0) == n) return put(json, "{}");
    return members(schema, s, n, json, 0, ok);
}
