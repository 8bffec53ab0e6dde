/*
 * jinja_filters.c — jinja2's builtin filters and tests, with their
 * signatures, defaults and quirks (default() only replaces undefined unless
 * boolean=true; map/select/reject/items/unique give one-shot generators;
 * sort, dictsort, unique, min and max compare strings case-insensitively by
 * default; tojson is transformers' json.dumps(ensure_ascii=False) with
 * indent, separators and sort_keys; int("42.5") is 42; round is Python's
 * round-half-even). Filters not provided: random, urlize, wordwrap.
 */
#include "jinja_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#define BIND(fname, ...) JARGS_BIND(fname, __VA_ARGS__)

enum {
    F_NONE = 0,
    F_ABS, F_ATTR, F_BATCH, F_CAPITALIZE, F_CENTER, F_COUNT, F_DEFAULT, F_DICTSORT, F_ESCAPE,
    F_FILESIZEFORMAT, F_FIRST, F_FLOAT, F_FORCEESCAPE, F_FORMAT, F_GROUPBY, F_INDENT, F_INT,
    F_ITEMS, F_JOIN, F_LAST, F_LENGTH, F_LIST, F_LOWER, F_MAP, F_MAX, F_MIN, F_PPRINT, F_REJECT,
    F_REJECTATTR, F_REPLACE, F_REVERSE, F_ROUND, F_SAFE, F_SELECT, F_SELECTATTR, F_SLICE, F_SORT,
    F_STRING, F_STRIPTAGS, F_SUM, F_TITLE, F_TOJSON, F_TRIM, F_TRUNCATE, F_UNIQUE, F_UPPER,
    F_URLENCODE, F_WORDCOUNT, F_XMLATTR,
};

static const struct {
    const char *name;
    uint16_t id;
} g_filters[] = {
    {"abs", F_ABS}, {"attr", F_ATTR}, {"batch", F_BATCH}, {"capitalize", F_CAPITALIZE},
    {"center", F_CENTER}, {"count", F_COUNT}, {"d", F_DEFAULT}, {"default", F_DEFAULT},
    {"dictsort", F_DICTSORT}, {"e", F_ESCAPE}, {"escape", F_ESCAPE},
    {"filesizeformat", F_FILESIZEFORMAT}, {"first", F_FIRST}, {"float", F_FLOAT},
    {"forceescape", F_FORCEESCAPE}, {"format", F_FORMAT}, {"groupby", F_GROUPBY},
    {"indent", F_INDENT}, {"int", F_INT}, {"items", F_ITEMS}, {"join", F_JOIN}, {"last", F_LAST},
    {"length", F_LENGTH}, {"list", F_LIST}, {"lower", F_LOWER}, {"map", F_MAP}, {"max", F_MAX},
    {"min", F_MIN}, {"pprint", F_PPRINT}, {"reject", F_REJECT}, {"rejectattr", F_REJECTATTR},
    {"replace", F_REPLACE}, {"reverse", F_REVERSE}, {"round", F_ROUND}, {"safe", F_SAFE},
    {"select", F_SELECT}, {"selectattr", F_SELECTATTR}, {"slice", F_SLICE}, {"sort", F_SORT},
    {"string", F_STRING}, {"striptags", F_STRIPTAGS}, {"sum", F_SUM}, {"title", F_TITLE},
    {"tojson", F_TOJSON}, {"trim", F_TRIM}, {"truncate", F_TRUNCATE}, {"unique", F_UNIQUE},
    {"upper", F_UPPER}, {"urlencode", F_URLENCODE}, {"wordcount", F_WORDCOUNT},
    {"xmlattr", F_XMLATTR},
};

enum {
    T_NONE = 0,
    T_ODD, T_EVEN, T_DIVISIBLEBY, T_DEFINED, T_UNDEFINED, T_FILTER, T_TEST, T_NONE_, T_BOOLEAN,
    T_FALSE, T_TRUE, T_INTEGER, T_FLOAT, T_LOWER, T_UPPER, T_STRING, T_MAPPING, T_NUMBER,
    T_SEQUENCE, T_ITERABLE, T_CALLABLE, T_SAMEAS, T_ESCAPED, T_IN, T_EQ, T_NE, T_GT, T_GE, T_LT,
    T_LE,
};

static const struct {
    const char *name;
    uint16_t id;
} g_tests[] = {
    {"odd", T_ODD}, {"even", T_EVEN}, {"divisibleby", T_DIVISIBLEBY}, {"defined", T_DEFINED},
    {"undefined", T_UNDEFINED}, {"filter", T_FILTER}, {"test", T_TEST}, {"none", T_NONE_},
    {"boolean", T_BOOLEAN}, {"false", T_FALSE}, {"true", T_TRUE}, {"integer", T_INTEGER},
    {"float", T_FLOAT}, {"lower", T_LOWER}, {"upper", T_UPPER}, {"string", T_STRING},
    {"mapping", T_MAPPING}, {"number", T_NUMBER}, {"sequence", T_SEQUENCE},
    {"iterable", T_ITERABLE}, {"callable", T_CALLABLE}, {"sameas", T_SAMEAS},
    {"escaped", T_ESCAPED}, {"in", T_IN}, {"==", T_EQ}, {"eq", T_EQ}, {"equalto", T_EQ},
    {"!=", T_NE}, {"ne", T_NE}, {">", T_GT}, {"gt", T_GT}, {"greaterthan", T_GT}, {">=", T_GE},
    {"ge", T_GE}, {"<", T_LT}, {"lt", T_LT}, {"lessthan", T_LT}, {"<=", T_LE}, {"le", T_LE},
};

uint16_t jinja_filter_id(const char *name, size_t n)
{
    for (size_t i = 0; i < BASE_ARRAY_LEN(g_filters); i++)
        if (strlen(g_filters[i].name) == n && memcmp(g_filters[i].name, name, n) == 0)
            return g_filters[i].id;
    return 0;
}

uint16_t jinja_test_id(const char *name, size_t n)
{
    for (size_t i = 0; i < BASE_ARRAY_LEN(g_tests); i++)
        if (strlen(g_tests[i].name) == n && memcmp(g_tests[i].name, name, n) == 0)
            return g_tests[i].id;
    return 0;
}

const char *jinja_filter_name(uint16_t id)
{
    for (size_t i = 0; i < BASE_ARRAY_LEN(g_filters); i++)
        if (g_filters[i].id == id) return g_filters[i].name;
    return "?";
}

/* ---- helpers ------------------------------------------------------------------- */

static keel_status soft_str(jx *x, jv v, jstr **out)
{
    return jv_to_str(x, v, out);
}

static keel_status make_gen(jx *x, const jv *items, size_t n, uint8_t kind, jv *out)
{
    jlist *l = jv_list_copy(x, items, n, kind);
    if (!l) return jx_oom(x);
    *out = jv_listv(l);
    return KEEL_OK;
}

static jv lower_key(jx *x, jv v, keel_status *st)
{
    *st = KEEL_OK;
    if (v.t != JT_STR) return v;
    jv r;
    *st = jstr_upper_lower(x, v.u.s, 1, &r);
    return r;
}

/* jinja2's make_attrgetter: "a.b.0" looks up each part with getitem
 * (digits as integers); an int attribute is one item lookup. */
static keel_status attr_get(jx *x, jv item, jv attr, jv dflt, jv *out)
{
    if (is_missing(attr) || attr.t == JT_NONE) {
        *out = item;
        return KEEL_OK;
    }
    if (attr.t != JT_STR) {
        TRY(jv_getitem(x, item, attr, out));
    } else {
        const jstr *a = attr.u.s;
        size_t i = 0;
        jv v = item;
        while (i <= a->n) {
            size_t j = i;
            while (j < a->n && a->s[j] != '.') j++;
            bool digits = j > i;
            int64_t iv = 0;
            for (size_t k = i; k < j; k++) {
                if (a->s[k] < '0' || a->s[k] > '9' || iv > INT64_MAX / 10 - 10) digits = false;
                else iv = iv * 10 + (a->s[k] - '0');
            }
            jv key;
            if (digits) {
                key = jv_int(iv);
            } else {
                jstr *p = jstr_new(&x->mem, a->s + i, j - i);
                if (!p) return jx_oom(x);
                key = jv_strv(p);
            }
            TRY(jv_getitem(x, v, key, &v));
            if (j >= a->n) break;
            i = j + 1;
        }
        *out = v;
    }
    if (out->t == JT_UNDEF && !is_missing(dflt)) *out = dflt;
    return KEEL_OK;
}

/* Sort key of an item for sort/unique/min/max/dictsort. */
static keel_status sort_key(jx *x, jv item, jv attr, bool case_sensitive, jv *out)
{
    TRY(attr_get(x, item, attr, jv_missing(), out));
    if (!case_sensitive) {
        keel_status st;
        *out = lower_key(x, *out, &st);
        TRY(st);
    }
    return KEEL_OK;
}

/* Stable merge sort of items by keys (both reordered). */
static keel_status sort_by_keys(jx *x, jv *keys, jv *items, size_t n, bool reverse)
{
    if (n < 2) return KEEL_OK;
    TRY(jx_steps(x, (int64_t)n));
    jv *tk = jmem_alloc_n(&x->mem, n, sizeof(jv)), *ti = jmem_alloc_n(&x->mem, n, sizeof(jv));
    if (!tk || !ti) return jx_oom(x);
    for (size_t w = 1; w < n; w *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * w) {
            size_t mid = BASE_MIN(lo + w, n), hi = BASE_MIN(lo + 2 * w, n);
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) {
                int c;
                TRY(jv_cmp(x, keys[j], keys[i], &c));
                bool right = reverse ? c > 0 : c < 0;
                if (right) {
                    tk[k] = keys[j];
                    ti[k++] = items[j++];
                } else {
                    tk[k] = keys[i];
                    ti[k++] = items[i++];
                }
            }
            while (i < mid) {
                tk[k] = keys[i];
                ti[k++] = items[i++];
            }
            while (j < hi) {
                tk[k] = keys[j];
                ti[k++] = items[j++];
            }
        }
        memcpy(keys, tk, n * sizeof(jv));
        memcpy(items, ti, n * sizeof(jv));
        if (w > SIZE_MAX / 4) break;
    }
    return KEEL_OK;
}

static keel_status iter_copy(jx *x, jv v, jv **items, size_t *n)
{
    jv *src = NULL;
    TRY(jv_iter(x, v, &src, n));
    *items = *n ? jmem_alloc_n(&x->mem, *n, sizeof(jv)) : NULL;
    if (*n && !*items) return jx_oom(x);
    if (*n) memcpy(*items, src, *n * sizeof(jv));
    return KEEL_OK;
}

/* Python int(str, base) for the int filter; false if not an integer. */
static bool parse_int(const jstr *s, int64_t base, int64_t *out)
{
    size_t i = 0, n = s->n;
    const char *p = s->s;
    while (i < n && (p[i] == ' ' || (p[i] >= 9 && p[i] <= 13))) i++;
    while (n > i && (p[n - 1] == ' ' || (p[n - 1] >= 9 && p[n - 1] <= 13))) n--;
    bool neg = false;
    if (i < n && (p[i] == '+' || p[i] == '-')) neg = p[i++] == '-';
    if (base == 0 || base == 16 || base == 8 || base == 2) {
        if (n - i >= 2 && p[i] == '0') {
            char c = (char)(p[i + 1] | 0x20);
            int64_t pb = c == 'x' ? 16 : c == 'o' ? 8 : c == 'b' ? 2 : 0;
            if (pb && (base == 0 || base == pb)) {
                base = pb;
                i += 2;
                if (i < n && p[i] == '_') i++;
            }
        }
        if (base == 0) base = 10;
    }
    if (base < 2 || base > 36 || i >= n) return false;
    uint64_t v = 0;
    bool prev_us = true;
    for (; i < n; i++) {
        char c = p[i];
        if (c == '_') {
            if (prev_us) return false;
            prev_us = true;
            continue;
        }
        prev_us = false;
        int d = c >= '0' && c <= '9' ? c - '0' : (c | 0x20) >= 'a' && (c | 0x20) <= 'z' ? (c | 0x20) - 'a' + 10 : 99;
        if (d >= base) return false;
        if (v > (UINT64_MAX - (uint64_t)d) / (uint64_t)base) return false;
        v = v * (uint64_t)base + (uint64_t)d;
    }
    if (prev_us) return false;
    if (v > (uint64_t)INT64_MAX + (neg ? 1u : 0u)) return false;
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return true;
}

/* Python float(str). */
static bool parse_float(const jstr *s, double *out)
{
    char buf[512];
    size_t k = 0, i = 0, n = s->n;
    const char *p = s->s;
    while (i < n && (p[i] == ' ' || (p[i] >= 9 && p[i] <= 13))) i++;
    while (n > i && (p[n - 1] == ' ' || (p[n - 1] >= 9 && p[n - 1] <= 13))) n--;
    if (i >= n || n - i >= sizeof buf) return false;
    for (; i < n; i++) {
        char c = p[i];
        if (c == '_') {
            if (k == 0 || i + 1 >= n || buf[k - 1] < '0' || buf[k - 1] > '9' || p[i + 1] < '0' ||
                p[i + 1] > '9')
                return false;
            continue;
        }
        if (!(c >= '0' && c <= '9') && (!c || !strchr("+-.eEinfatyINFATY", c))) return false;
        buf[k++] = c;
    }
    buf[k] = 0;
    const char *b = buf + (buf[0] == '+' || buf[0] == '-');
    if (strcasecmp(b, "inf") == 0 || strcasecmp(b, "infinity") == 0) {
        *out = buf[0] == '-' ? -INFINITY : INFINITY;
        return true;
    }
    if (strcasecmp(b, "nan") == 0) {
        *out = NAN;
        return true;
    }
    for (const char *q = b; *q; q++)
        if (!((*q >= '0' && *q <= '9') || *q == '.' || *q == 'e' || *q == 'E' || *q == '+' || *q == '-'))
            return false;
    char *end;
    double v = strtod(buf, &end);
    if (*end || end == buf) return false;
    *out = v;
    return true;
}

static keel_status html_escape(jx *x, jstr *s, jv *out)
{
    return jv_html_escape(x, s, out);
}

/* Python round(x, ndigits) on a float: correctly rounded, ties to even. */
static double py_round(double v, int64_t nd)
{
    if (!isfinite(v)) return v;
    /* from 2^52 on every double is an integer: nothing to round */
    if (nd > 300 || (nd >= 0 && fabs(v) >= 4503599627370496.0)) return v;
    if (nd >= 0) {
        char buf[400];
        snprintf(buf, sizeof buf, "%.*f", (int)nd, v);
        return strtod(buf, NULL);
    }
    if (nd < -308) return 0.0 * v;
    double p = pow(10.0, (double)-nd);
    double r = v / p, f = floor(r), d = r - f;
    if (d > 0.5 || (d == 0.5 && fmod(f, 2.0) != 0)) f += 1;
    return f * p;
}

/* ---- select / map ------------------------------------------------------------------ */

/* Runs test (by name, with extra args) on v, or truthiness without a name. */
static keel_status run_test_named(jx *x, jv name, const jargs *rest, jv v, bool *out)
{
    if (is_missing(name)) {
        *out = jv_truthy(v);
        return KEEL_OK;
    }
    jstr *nm = NULL;
    TRY(jv_to_str(x, name, &nm));
    uint16_t id = jinja_test_id(nm->s, nm->n);
    if (!id) return jx_fail(x, KEEL_EINVAL, "No test named '%.*s'.", (int)nm->n, nm->s);
    return jinja_test_call(x, id, v, rest, out);
}

static keel_status select_reject(jx *x, jv value, const jargs *a, bool attr, bool reject, jv *out)
{
    jlist *r = jlist_new(&x->mem, 0, JL_GEN);
    if (!r) return jx_oom(x);
    *out = jv_listv(r);
    if (!jv_truthy(value)) return KEEL_OK;
    size_t off = 0;
    jv attrname = jv_missing(), test = jv_missing();
    if (attr) {
        if (a->n_pos < 1) return jx_fail(x, KEEL_EINVAL, "Missing parameter for attribute name");
        attrname = a->pos[0];
        off = 1;
    }
    if (a->n_pos > off) test = a->pos[off];
    jargs rest = *a;
    size_t skip = a->n_pos > off ? off + 1 : a->n_pos;
    rest.pos = a->pos ? a->pos + skip : NULL;
    rest.n_pos = a->n_pos - skip;
    jv *items = NULL;
    size_t n;
    TRY(jv_iter(x, value, &items, &n));
    for (size_t i = 0; i < n; i++) {
        TRY(jx_step(x));
        jv v = items[i];
        if (attr) TRY(attr_get(x, items[i], attrname, jv_missing(), &v));
        bool ok;
        TRY(run_test_named(x, test, &rest, v, &ok));
        if (ok != reject && !jlist_push(&x->mem, r, items[i])) return jx_oom(x);
    }
    return KEEL_OK;
}

static keel_status do_map(jx *x, jv value, const jargs *a, jv *out)
{
    jlist *r = jlist_new(&x->mem, 0, JL_GEN);
    if (!r) return jx_oom(x);
    *out = jv_listv(r);
    if (!jv_truthy(value)) return KEEL_OK;
    jv *items = NULL;
    size_t n;
    if (a->n_pos == 0) {
        jv attr = jv_missing(), dflt = jv_none();
        for (size_t k = 0; k < a->n_kw; k++) {
            if (jstr_eqc(a->kw_names[k], "attribute"))
                attr = a->kw[k];
            else if (jstr_eqc(a->kw_names[k], "default"))
                dflt = a->kw[k];
            else
                return jx_fail(x, KEEL_EINVAL, "Unexpected keyword argument '%.*s'",
                               (int)a->kw_names[k]->n, a->kw_names[k]->s);
        }
        if (is_missing(attr)) return jx_fail(x, KEEL_EINVAL, "map requires a filter argument");
        TRY(jv_iter(x, value, &items, &n));
        for (size_t i = 0; i < n; i++) {
            TRY(jx_step(x));
            jv v;
            TRY(attr_get(x, items[i], attr, dflt, &v));
            if (!jlist_push(&x->mem, r, v)) return jx_oom(x);
        }
        return KEEL_OK;
    }
    jstr *nm = NULL;
    TRY(jv_to_str(x, a->pos[0], &nm));
    uint16_t id = jinja_filter_id(nm->s, nm->n);
    if (!id) return jx_fail(x, KEEL_EINVAL, "No filter named '%.*s'.", (int)nm->n, nm->s);
    jargs rest = *a;
    rest.pos = a->pos + 1;
    rest.n_pos = a->n_pos - 1;
    TRY(jv_iter(x, value, &items, &n));
    for (size_t i = 0; i < n; i++) {
        TRY(jx_step(x));
        jv v;
        TRY(jinja_filter_call(x, id, items[i], &rest, &v));
        if (!jlist_push(&x->mem, r, v)) return jx_oom(x);
    }
    return KEEL_OK;
}

/* ---- tojson ---------------------------------------------------------------------------- */

static keel_status do_tojson(jx *x, jv value, const jargs *a, jv *out)
{
    jv arg[5];
    BIND("tojson", "ensure_ascii", "indent", "separators", "sort_keys");
    jjson_opts o;
    memset(&o, 0, sizeof o);
    o.ensure_ascii = given(arg[0]) && jv_truthy(arg[0]);
    o.sort_keys = given(arg[3]) && jv_truthy(arg[3]);
    char spaces[64];
    if (given(arg[1])) {
        int64_t k;
        o.indent_set = true;
        if (arg[1].t == JT_STR) {
            o.indent = arg[1].u.s->s;
            o.indent_n = arg[1].u.s->n;
        } else if (jv_as_int(arg[1], &k)) {
            if (k > (int64_t)sizeof spaces) k = (int64_t)sizeof spaces;
            if (k < 0) k = 0;
            memset(spaces, ' ', (size_t)k);
            o.indent = spaces;
            o.indent_n = (size_t)k;
        } else {
            return jx_fail(x, KEEL_EINVAL, "tojson: indent must be an int or a str");
        }
    }
    o.item_sep = o.indent_set ? "," : ", ";
    o.item_sep_n = strlen(o.item_sep);
    o.key_sep = ": ";
    o.key_sep_n = 2;
    if (given(arg[2])) {
        jv *sep = NULL;
        size_t n;
        TRY(jv_iter(x, arg[2], &sep, &n));
        if (n != 2 || sep[0].t != JT_STR || sep[1].t != JT_STR)
            return jx_fail(x, KEEL_EINVAL, "tojson: separators must be a pair of strings");
        o.item_sep = sep[0].u.s->s;
        o.item_sep_n = sep[0].u.s->n;
        o.key_sep = sep[1].u.s->s;
        o.key_sep_n = sep[1].u.s->n;
    }
    jsb b;
    jsb_init(&b, &x->mem, x->lim.max_output);
    TRY(jv_tojson(x, &b, value, &o));
    return jsb_ret(x, &b, out);
}

/* ---- filters ---------------------------------------------------------------------------- */

static keel_status do_indent(jx *x, jv value, const jargs *a, jv *out)
{
    jv arg[3];
    BIND("indent", "width", "first", "blank");
    jstr *s = NULL, *ind = NULL;
    TRY(soft_str(x, value, &s));
    int64_t w = 4;
    if (arg[0].t == JT_STR) {
        ind = arg[0].u.s;
    } else {
        if (given(arg[0]) && !jv_as_int(arg[0], &w))
            return jx_fail(x, KEEL_EINVAL, "indent: width must be an int or a str");
        if (w < 0) w = 0;
        if (w > 4096) return jx_fail(x, KEEL_EOVERFLOW, "indent: width %lld is too large", (long long)w);
        char sp[4096];
        memset(sp, ' ', (size_t)w);
        ind = jstr_new(&x->mem, sp, (size_t)w);
        if (!ind) return jx_oom(x);
    }
    bool first = given(arg[1]) && jv_truthy(arg[1]), blank = given(arg[2]) && jv_truthy(arg[2]);
    /* s += "\n"; lines = s.splitlines() */
    jstr nl = {"\n", 1, true};
    jstr *s2 = jstr_cat(&x->mem, s, &nl);
    if (!s2) return jx_oom(x);
    jv lines;
    TRY(jstr_splitlines(x, s2, false, &lines));
    jlist *l = lines.u.l;
    jsb b;
    jsb_init(&b, &x->mem, x->lim.max_output);
    if (first) jsb_add(&b, ind->s, ind->n);
    for (size_t i = 0; i < l->n; i++) {
        const jstr *line = l->v[i].u.s;
        if (i) {
            jsb_addc(&b, '\n');
            if (blank || line->n) jsb_add(&b, ind->s, ind->n);
        }
        jsb_add(&b, line->s, line->n);
    }
    TRY(jsb_ret(x, &b, out));
    out->safe = value.t == JT_STR && value.safe;
    return KEEL_OK;
}

static keel_status do_truncate(jx *x, jv value, const jargs *a, jv *out)
{
    jv arg[4];
    BIND("truncate", "length", "killwords", "end", "leeway");
    jstr *s = NULL, *end = NULL;
    TRY(soft_str(x, value, &s));
    int64_t length = 255, leeway = 5;
    if (given(arg[0]) && !jv_as_int(arg[0], &length))
        return jx_fail(x, KEEL_EINVAL, "truncate: length must be an int");
    if (given(arg[3]) && !jv_as_int(arg[3], &leeway))
        return jx_fail(x, KEEL_EINVAL, "truncate: leeway must be an int");
    end = jstr_new(&x->mem, "...", 3);
    if (!end) return jx_oom(x);
    if (!is_missing(arg[2])) TRY(soft_str(x, arg[2], &end));
    int64_t endlen = (int64_t)jstr_len_cp(end), len = (int64_t)jstr_len_cp(s);
    if (length < endlen) return jx_fail(x, KEEL_EINVAL, "expected length >= %lld, got %lld",
                                        (long long)endlen, (long long)length);
    if (leeway < 0) return jx_fail(x, KEEL_EINVAL, "expected leeway >= 0, got %lld", (long long)leeway);
    if (len <= length + leeway) {
        *out = jv_strv(s);
        return KEEL_OK;
    }
    size_t cut = utf8_offset(s, (size_t)(length - endlen));
    jstr head = {s->s, cut, s->ascii};
    jstr *res = NULL;
    if (given(arg[1]) && jv_truthy(arg[1])) {
        res = jstr_new(&x->mem, s->s, cut);
    } else {
        /* s[:length - len(end)].rsplit(" ", 1)[0] */
        size_t k = cut;
        while (k > 0 && head.s[k - 1] != ' ') k--;
        res = jstr_new(&x->mem, s->s, k ? k - 1 : cut);
    }
    if (!res) return jx_oom(x);
    res = jstr_cat(&x->mem, res, end);
    if (!res) return jx_oom(x);
    *out = jv_strv(res);
    return KEEL_OK;
}

static keel_status do_title(jx *x, jv value, jv *out)
{
    /* "".join(item[0].upper() + item[1:].lower() for item in
     *         re.split(r"([-\s({\[<]+)", s) if item) */
    jstr *s = NULL;
    TRY(soft_str(x, value, &s));
    jsb b;
    jsb_init(&b, &x->mem, x->lim.max_output);
    size_t i = 0;
    bool start = true;
    while (i < s->n) {
        uint32_t c = utf8_next(s->s, s->n, &i);
        bool sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || py_isspace(c);
        if (sep) {
            jsb_addcp(&b, c);
            start = true;
            continue;
        }
        if (start) {
            jsb_addcp(&b, c < 0x80 ? (c >= 'a' && c <= 'z' ? c - 32 : c)
                                   : (uint32_t)utf8proc_toupper((utf8proc_int32_t)c));
            start = false;
        } else {
            jsb_addcp(&b, c < 0x80 ? (c >= 'A' && c <= 'Z' ? c + 32 : c)
                                   : (uint32_t)utf8proc_tolower((utf8proc_int32_t)c));
        }
    }
    return jsb_ret(x, &b, out);
}

static keel_status do_striptags(jx *x, jv value, jv *out)
{
    jstr *s = NULL;
    TRY(soft_str(x, value, &s));
    jsb b;
    jsb_init(&b, &x->mem, x->lim.max_output);
    /* drop comments and tags, unescape the common entities, collapse whitespace */
    size_t i = 0;
    bool space = false, any = false;
    while (i < s->n) {
        if (s->n - i >= 4 && memcmp(s->s + i, "<!--", 4) == 0) {
            const char *e = memmem(s->s + i + 4, s->n - i - 4, "-->", 3);
            if (e) {
                i = (size_t)(e - s->s) + 3;
                continue;
            }
        }
        if (s->s[i] == '<') {
            const char *e = memchr(s->s + i, '>', s->n - i);
            if (e) {
                i = (size_t)(e - s->s) + 1;
                continue;
            }
        }
        size_t st = i;
        uint32_t c = utf8_next(s->s, s->n, &i);
        if (py_isspace(c)) {
            space = any;
            continue;
        }
        if (space) jsb_addc(&b, ' ');
        space = false;
        any = true;
        static const struct { const char *ent; char c; } ents[] = {
            {"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}, {"&#34;", '"'},
            {"&#39;", '\''}, {"&apos;", '\''},
        };
        bool done = false;
        if (c == '&') {
            for (size_t k = 0; k < BASE_ARRAY_LEN(ents); k++) {
                size_t el = strlen(ents[k].ent);
                if (s->n - st >= el && memcmp(s->s + st, ents[k].ent, el) == 0) {
                    jsb_addc(&b, ents[k].c);
                    i = st + el;
                    done = true;
                    break;
                }
            }
        }
        if (!done) jsb_add(&b, s->s + st, i - st);
    }
    return jsb_ret(x, &b, out);
}

static keel_status do_wordcount(jx *x, jv value, jv *out)
{
    jstr *s = NULL;
    TRY(soft_str(x, value, &s));
    size_t i = 0;
    int64_t words = 0;
    bool in = false;
    while (i < s->n) {
        uint32_t c = utf8_next(s->s, s->n, &i);
        utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
        bool w = c == '_' || (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) ||
                 (k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO) ||
                 k == UTF8PROC_CATEGORY_MN || k == UTF8PROC_CATEGORY_MC;
        if (w && !in) words++;
        in = w;
    }
    *out = jv_int(words);
    return KEEL_OK;
}

static keel_status do_urlencode(jx *x, jv value, jv *out)
{
    jsb b;
    jsb_init(&b, &x->mem, x->lim.max_output);
    const jv *keys = NULL, *vals = NULL;
    size_t n = 0;
    bool pairs = false;
    if (value.t == JT_DICT) {
        keys = value.u.d->k;
        vals = value.u.d->v;
        n = value.u.d->n;
        pairs = true;
    }
    for (size_t k = 0; k < (pairs ? n : 1); k++) {
        for (int part = 0; part < (pairs ? 2 : 1); part++) {
            jstr *s = NULL;
            TRY(soft_str(x, pairs ? (part ? vals[k] : keys[k]) : value, &s));
            if (pairs && part == 0 && k) jsb_addc(&b, '&');
            if (pairs && part == 1) jsb_addc(&b, '=');
            for (size_t i = 0; i < s->n; i++) {
                unsigned char c = (unsigned char)s->s[i];
                bool safe = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                            (c >= '0' && c <= '9') || strchr("_.-~", c) ||
                            (!pairs && c == '/');
                if (safe && c)
                    jsb_addc(&b, (char)c);
                else if (pairs && c == ' ')
                    jsb_addc(&b, '+');
                else
                    jsb_addf(&b, "%%%02X", c);
            }
        }
    }
    return jsb_ret(x, &b, out);
}

static keel_status do_filesizeformat(jx *x, jv value, const jargs *a, jv *out)
{
    jv arg[1];
    BIND("filesizeformat", "binary");
    double bytes;
    if (value.t == JT_STR) {
        if (!parse_float(value.u.s, &bytes))
            return jx_fail(x, KEEL_EINVAL, "could not convert string to float");
    } else if (!jv_as_num(value, &bytes)) {
        return jx_fail(x, KEEL_EINVAL, "float() argument must be a string or a real number, not '%s'",
                       jv_type_name(value));
    }
    bool bin = given(arg[0]) && jv_truthy(arg[0]);
    double base = bin ? 1024 : 1000;
    static const char *const si[] = {"kB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB"};
    static const char *const iec[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB"};
    jsb b;
    jsb_init(&b, &x->mem, x->lim.max_output);
    if (bytes == 1) {
        jsb_adds(&b, "1 Byte");
    } else if (bytes < base) {
        jsb_addf(&b, "%lld Bytes", (long long)bytes);
    } else {
        double unit = base;
        int i;
        for (i = 0; i < 8; i++) {
            unit *= base;
            if (bytes < unit) break;
        }
        if (i == 8) i = 7;
        jsb_addf(&b, "%.1f %s", base * bytes / unit, bin ? iec[i] : si[i]);
    }
    return jsb_ret(x, &b, out);
}

static keel_status do_xmlattr(jx *x, jv value, const jargs *a, jv *out)
{
    jv arg[1];
    BIND("xmlattr", "autospace");
    if (value.t != JT_DICT) return jx_fail(x, KEEL_EINVAL, "xmlattr needs a mapping");
    jsb b;
    jsb_init(&b, &x->mem, x->lim.max_output);
    bool autospace = is_missing(arg[0]) || jv_truthy(arg[0]);
    size_t cnt = 0;
    for (size_t i = 0; i < value.u.d->n; i++) {
        jv v = value.u.d->v[i];
        if (v.t == JT_NONE || v.t == JT_UNDEF) continue;
        jstr *k = NULL, *vs = NULL;
        jv ek, ev;
        TRY(soft_str(x, value.u.d->k[i], &k));
        for (size_t q = 0; q < k->n; q++)
            if (k->s[q] == '/' || k->s[q] == '>' || k->s[q] == '=' || py_isspace((unsigned char)k->s[q]))
                return jx_fail(x, KEEL_EINVAL, "Invalid character in attribute name: '%.*s'",
                               (int)k->n, k->s);
        TRY(html_escape(x, k, &ek));
        TRY(soft_str(x, v, &vs));
        TRY(html_escape(x, vs, &ev));
        if (cnt++ || autospace) jsb_addc(&b, ' ');
        jsb_add(&b, ek.u.s->s, ek.u.s->n);
        jsb_adds(&b, "=\"");
        jsb_add(&b, ev.u.s->s, ev.u.s->n);
        jsb_addc(&b, '"');
    }
    return jsb_ret(x, &b, out);
}

static keel_status do_batch_slice(jx *x, jv value, const jargs *a, bool slice, jv *out)
{
    jv arg[2];
    if (slice)
        BIND("slice", "slices", "fill_with");
    else
        BIND("batch", "linecount", "fill_with");
    int64_t k;
    if (!jv_as_int(arg[0], &k))
        return jx_fail(x, KEEL_EINVAL, "%s: the count must be an int", slice ? "slice" : "batch");
    if (k <= 0 && !slice) return jx_fail(x, KEEL_EINVAL, "batch: linecount must be positive");
    if (k <= 0) return jx_fail(x, KEEL_EINVAL, "slice: integer division or modulo by zero");
    if (k > 1000000) return jx_fail(x, KEEL_EOVERFLOW, "%s count too large", slice ? "slice" : "batch");
    jv *items = NULL;
    size_t n;
    TRY(iter_copy(x, value, &items, &n));
    jlist *r = jlist_new(&x->mem, 0, JL_GEN);
    if (!r) return jx_oom(x);
    bool fill = !is_missing(arg[1]) && arg[1].t != JT_NONE;
    if (!slice) {
        for (size_t i = 0; i < n; i += (size_t)k) {
            size_t m = BASE_MIN((size_t)k, n - i);
            jlist *t = jlist_new(&x->mem, (size_t)k, JL_LIST);
            if (!t) return jx_oom(x);
            memcpy(t->v, items + i, m * sizeof(jv));
            t->n = m;
            if (fill)
                while (t->n < (size_t)k) t->v[t->n++] = arg[1];
            if (!jlist_push(&x->mem, r, jv_listv(t))) return jx_oom(x);
            TRY(jx_step(x));
        }
    } else {
        size_t per = n / (size_t)k, extra = n % (size_t)k, offset = 0;
        for (size_t s = 0; s < (size_t)k; s++) {
            size_t start = offset + s * per;
            if (s < extra) offset++;
            size_t end = offset + (s + 1) * per;
            jlist *t = jlist_new(&x->mem, end - start + 1, JL_LIST);
            if (!t) return jx_oom(x);
            if (end > start) memcpy(t->v, items + start, (end - start) * sizeof(jv));
            t->n = end - start;
            if (fill && s >= extra) t->v[t->n++] = arg[1];
            if (!jlist_push(&x->mem, r, jv_listv(t))) return jx_oom(x);
            TRY(jx_step(x));
        }
    }
    *out = jv_listv(r);
    return KEEL_OK;
}

static keel_status do_groupby(jx *x, jv value, const jargs *a, jv *out)
{
    jv arg[3];
    BIND("groupby", "attribute", "default", "case_sensitive");
    bool cs = given(arg[2]) && jv_truthy(arg[2]);
    jv *items, *keys;
    size_t n;
    TRY(iter_copy(x, value, &items, &n));
    keys = n ? jmem_alloc_n(&x->mem, n, sizeof(jv)) : NULL;
    if (n && !keys) return jx_oom(x);
    for (size_t i = 0; i < n; i++) {
        TRY(attr_get(x, items[i], arg[0], arg[1], &keys[i]));
        if (!cs) {
            keel_status st;
            keys[i] = lower_key(x, keys[i], &st);
            TRY(st);
        }
    }
    TRY(sort_by_keys(x, keys, items, n, false));
    jlist *r = jlist_new(&x->mem, 0, JL_LIST);
    if (!r) return jx_oom(x);
    for (size_t i = 0; i < n;) {
        size_t j = i + 1;
        for (; j < n; j++) {
            bool e;
            TRY(jv_eq(x, keys[i], keys[j], &e));
            if (!e) break;
        }
        jlist *g = jv_list_copy(x, items + i, j - i, JL_LIST);
        jlist *t = jlist_new(&x->mem, 2, JL_TUPLE);
        if (!g || !t) return jx_oom(x);
        jv grouper = keys[i];
        if (!cs) TRY(attr_get(x, items[i], arg[0], arg[1], &grouper));
        t->v[0] = grouper;
        t->v[1] = jv_listv(g);
        t->n = 2;
        t->r0 = 1; /* a _GroupTuple: .grouper and .list */
        if (!jlist_push(&x->mem, r, jv_listv(t))) return jx_oom(x);
        i = j;
    }
    *out = jv_listv(r);
    return KEEL_OK;
}

static keel_status do_minmax(jx *x, jv value, const jargs *a, bool max, jv *out)
{
    jv arg[2];
    BIND(max ? "max" : "min", "case_sensitive", "attribute");
    bool cs = given(arg[0]) && jv_truthy(arg[0]);
    jv *items = NULL;
    size_t n;
    TRY(jv_iter(x, value, &items, &n));
    if (n == 0) {
        *out = jv_undef_hint(x, "No aggregated item, sequence was empty.");
        return KEEL_OK;
    }
    jv best = items[0], bk;
    TRY(sort_key(x, items[0], arg[1], cs, &bk));
    for (size_t i = 1; i < n; i++) {
        jv k;
        TRY(sort_key(x, items[i], arg[1], cs, &k));
        int c;
        TRY(jv_cmp(x, k, bk, &c));
        if (max ? c > 0 : c < 0) {
            best = items[i];
            bk = k;
        }
    }
    *out = best;
    return KEEL_OK;
}

keel_status jinja_filter_call(jx *x, uint16_t id, jv value, const jargs *a, jv *out)
{
    jv arg[4];
    jstr *s = NULL;
    TRY(jx_step(x));
    if (value.t == JT_STR) TRY(jx_scan(x, value.u.s->n));
    switch (id) {
    case F_ABS: {
        if (a->n_pos || a->n_kw) return jx_fail(x, KEEL_EINVAL, "abs() takes exactly one argument");
        int64_t i;
        if (jv_as_int(value, &i)) {
            if (i == INT64_MIN) return jx_fail(x, KEEL_EINVAL, "integer overflow");
            *out = jv_int(i < 0 ? -i : i);
        } else if (value.t == JT_FLOAT) {
            *out = jv_float(fabs(value.u.f));
        } else {
            if (value.t == JT_UNDEF) return jx_undef_error(x, value);
            return jx_fail(x, KEEL_EINVAL, "bad operand type for abs(): '%s'", jv_type_name(value));
        }
        return KEEL_OK;
    }
    case F_ATTR: {
        BIND("attr", "name");
        jstr *nm = NULL;
        TRY(soft_str(x, arg[0], &nm));
        if (value.t == JT_DICT) {
            /* attributes only, never items */
            jfn m = jinja_method_id(value, nm);
            if (m == JF_NONE) {
                *out = jv_undef_attr(x, value, jv_strv(nm), false);
                return KEEL_OK;
            }
        }
        return jv_getattr(x, value, nm, out);
    }
    case F_BATCH:
        return do_batch_slice(x, value, a, false, out);
    case F_SLICE:
        return do_batch_slice(x, value, a, true, out);
    case F_CAPITALIZE:
    case F_LOWER:
    case F_UPPER:
        if (a->n_pos || a->n_kw) return jx_fail(x, KEEL_EINVAL, "%s() takes no arguments", jinja_filter_name(id));
        TRY(soft_str(x, value, &s));
        TRY(jstr_upper_lower(x, s, id == F_UPPER ? 0 : id == F_LOWER ? 1 : 3, out));
        out->safe = value.t == JT_STR && value.safe; /* Markup methods keep Markup */
        return KEEL_OK;
    case F_TITLE:
        return do_title(x, value, out);
    case F_CENTER: {
        BIND("center", "width");
        int64_t w = 80;
        if (given(arg[0]) && !jv_as_int(arg[0], &w))
            return jx_fail(x, KEEL_EINVAL, "center: width must be an int");
        TRY(soft_str(x, value, &s));
        jargs pa = {arg, 1, NULL, NULL, 0};
        arg[0] = jv_int(w);
        TRY(jinja_builtin_call(x, JF_S_CENTER, jv_strv(s), &pa, out));
        out->safe = value.t == JT_STR && value.safe;
        return KEEL_OK;
    }
    case F_COUNT:
    case F_LENGTH: {
        int64_t n;
        TRY(jv_len(x, value, &n));
        *out = jv_int(n);
        return KEEL_OK;
    }
    case F_DEFAULT: {
        BIND("default", "default_value", "boolean");
        jv dflt = is_missing(arg[0]) ? jv_strv(JSTR_EMPTY) : arg[0];
        bool boolean = given(arg[1]) && jv_truthy(arg[1]);
        *out = (value.t == JT_UNDEF || (boolean && !jv_truthy(value))) ? dflt : value;
        return KEEL_OK;
    }
    case F_DICTSORT: {
        BIND("dictsort", "case_sensitive", "by", "reverse");
        if (value.t != JT_DICT) {
            if (value.t == JT_UNDEF) return jx_undef_error(x, value);
            return jx_fail(x, KEEL_EINVAL, "'%s' object has no attribute 'items'", jv_type_name(value));
        }
        int pos = 0;
        if (given(arg[1])) {
            if (arg[1].t == JT_STR && jstr_eqc(arg[1].u.s, "value"))
                pos = 1;
            else if (!(arg[1].t == JT_STR && jstr_eqc(arg[1].u.s, "key")))
                return jx_fail(x, KEEL_EINVAL, "You can only sort by either \"key\" or \"value\"");
        }
        bool cs = given(arg[0]) && jv_truthy(arg[0]);
        const jdict *d = value.u.d;
        jv *items = d->n ? jmem_alloc_n(&x->mem, d->n, sizeof(jv)) : NULL;
        jv *keys = d->n ? jmem_alloc_n(&x->mem, d->n, sizeof(jv)) : NULL;
        if (d->n && (!items || !keys)) return jx_oom(x);
        for (size_t i = 0; i < d->n; i++) {
            jlist *t = jlist_new(&x->mem, 2, JL_TUPLE);
            if (!t) return jx_oom(x);
            t->v[0] = d->k[i];
            t->v[1] = d->v[i];
            t->n = 2;
            items[i] = jv_listv(t);
            keys[i] = pos ? d->v[i] : d->k[i];
            if (!cs) {
                keel_status st;
                keys[i] = lower_key(x, keys[i], &st);
                TRY(st);
            }
        }
        TRY(sort_by_keys(x, keys, items, d->n, given(arg[2]) && jv_truthy(arg[2])));
        return make_gen(x, items, d->n, JL_LIST, out);
    }
    case F_ESCAPE:
        if (value.t == JT_STR && value.safe) {
            *out = value;
            return KEEL_OK;
        }
        /* fall through */
    case F_FORCEESCAPE:
        TRY(soft_str(x, value, &s));
        return html_escape(x, s, out);
    case F_FILESIZEFORMAT:
        return do_filesizeformat(x, value, a, out);
    case F_FIRST: {
        jv *items = NULL;
        size_t n;
        TRY(jv_iter(x, value, &items, &n));
        *out = n ? items[0] : jv_undef_hint(x, "No first item, sequence was empty.");
        return KEEL_OK;
    }
    case F_LAST: {
        if (value.t == JT_LIST && (value.u.l->kind == JL_GEN || value.u.l->kind == JL_REVITER))
            return jx_fail(x, KEEL_EINVAL, "'%s' object is not reversible", jv_type_name(value));
        jv *items = NULL;
        size_t n;
        TRY(jv_iter(x, value, &items, &n));
        *out = n ? items[n - 1] : jv_undef_hint(x, "No last item, sequence was empty.");
        return KEEL_OK;
    }
    case F_FLOAT: {
        BIND("float", "default");
        jv dflt = is_missing(arg[0]) ? jv_float(0.0) : arg[0];
        double d;
        if (value.t == JT_STR) {
            *out = parse_float(value.u.s, &d) ? jv_float(d) : dflt;
        } else if (jv_as_num(value, &d)) {
            *out = jv_float(d);
        } else {
            if (value.t == JT_UNDEF) return jx_undef_error(x, value);
            *out = dflt;
        }
        return KEEL_OK;
    }
    case F_INT: {
        BIND("int", "default", "base");
        jv dflt = is_missing(arg[0]) ? jv_int(0) : arg[0];
        int64_t base = 10, iv;
        if (given(arg[1]) && !jv_as_int(arg[1], &base))
            return jx_fail(x, KEEL_EINVAL, "int: base must be an int");
        double d;
        if (value.t == JT_STR) {
            if (parse_int(value.u.s, base, &iv))
                *out = jv_int(iv);
            else if (parse_float(value.u.s, &d) && isfinite(d) && fabs(d) < 9.2e18)
                *out = jv_int((int64_t)d);
            else
                *out = dflt;
        } else if (jv_as_int(value, &iv)) {
            *out = jv_int(iv);
        } else if (value.t == JT_FLOAT) {
            *out = isfinite(value.u.f) && fabs(value.u.f) < 9.2e18 ? jv_int((int64_t)value.u.f) : dflt;
        } else {
            if (value.t == JT_UNDEF) return jx_undef_error(x, value);
            *out = dflt;
        }
        return KEEL_OK;
    }
    case F_FORMAT: {
        TRY(soft_str(x, value, &s));
        if (a->n_pos && a->n_kw)
            return jx_fail(x, KEEL_EINVAL, "can't handle positional and keyword arguments at the "
                                           "same time");
        jv args;
        if (a->n_kw) {
            jdict *d = jdict_new(&x->mem, a->n_kw);
            if (!d) return jx_oom(x);
            for (size_t k = 0; k < a->n_kw; k++)
                if (!jdict_set(&x->mem, d, jv_strv((jstr *)a->kw_names[k]), a->kw[k])) return jx_oom(x);
            args = jv_dictv(d);
        } else {
            jlist *t = jv_list_copy(x, a->pos, a->n_pos, JL_TUPLE);
            if (!t) return jx_oom(x);
            args = jv_listv(t);
        }
        return jstr_percent_format(x, s, args, out);
    }
    case F_GROUPBY:
        return do_groupby(x, value, a, out);
    case F_INDENT:
        return do_indent(x, value, a, out);
    case F_ITEMS: {
        jlist *r = jlist_new(&x->mem, 0, JL_GEN);
        if (!r) return jx_oom(x);
        *out = jv_listv(r);
        if (value.t == JT_UNDEF) return KEEL_OK;
        if (value.t != JT_DICT)
            return jx_fail(x, KEEL_EINVAL, "Can only get item pairs from a mapping.");
        for (size_t i = 0; i < value.u.d->n; i++) {
            jlist *t = jlist_new(&x->mem, 2, JL_TUPLE);
            if (!t) return jx_oom(x);
            t->v[0] = value.u.d->k[i];
            t->v[1] = value.u.d->v[i];
            t->n = 2;
            if (!jlist_push(&x->mem, r, jv_listv(t))) return jx_oom(x);
        }
        return KEEL_OK;
    }
    case F_JOIN: {
        BIND("join", "d", "attribute");
        jstr *sep = JSTR_EMPTY;
        if (!is_missing(arg[0])) TRY(soft_str(x, arg[0], &sep));
        jv *items = NULL;
        size_t n;
        TRY(jv_iter(x, value, &items, &n));
        jsb b;
        jsb_init(&b, &x->mem, x->lim.max_output);
        for (size_t i = 0; i < n; i++) {
            jv v = items[i];
            if (given(arg[1])) TRY(attr_get(x, v, arg[1], jv_missing(), &v));
            if (i) jsb_add(&b, sep->s, sep->n);
            TRY(jv_str(x, &b, v));
        }
        return jsb_ret(x, &b, out);
    }
    case F_LIST: {
        jv *items = NULL;
        size_t n;
        TRY(jv_iter(x, value, &items, &n));
        return make_gen(x, items, n, JL_LIST, out);
    }
    case F_MAP:
        return do_map(x, value, a, out);
    case F_MAX:
    case F_MIN:
        return do_minmax(x, value, a, id == F_MAX, out);
    case F_PPRINT: {
        jsb b;
        jsb_init(&b, &x->mem, x->lim.max_output);
        TRY(jv_repr(x, &b, value, 0));
        return jsb_ret(x, &b, out);
    }
    case F_SELECT:
    case F_REJECT:
        return select_reject(x, value, a, false, id == F_REJECT, out);
    case F_SELECTATTR:
    case F_REJECTATTR:
        return select_reject(x, value, a, true, id == F_REJECTATTR, out);
    case F_REPLACE: {
        BIND("replace", "old", "new", "count");
        jstr *o = NULL, *r = NULL;
        TRY(soft_str(x, value, &s));
        TRY(soft_str(x, arg[0], &o));
        TRY(soft_str(x, arg[1], &r));
        int64_t count = -1;
        if (given(arg[2]) && !jv_as_int(arg[2], &count))
            return jx_fail(x, KEEL_EINVAL, "replace: count must be an int");
        return jstr_replace(x, s, o, r, count, out);
    }
    case F_REVERSE: {
        if (value.t == JT_STR) return jv_slice(x, value, jv_none(), jv_none(), jv_int(-1), out);
        jv *items = NULL;
        size_t n;
        bool gen = value.t == JT_LIST && (value.u.l->kind == JL_GEN || value.u.l->kind == JL_REVITER);
        TRY(jv_iter(x, value, &items, &n));
        jlist *r = jlist_new(&x->mem, n, gen ? JL_LIST : JL_REVITER);
        if (!r) return jx_oom(x);
        for (size_t i = 0; i < n; i++) r->v[i] = items[n - 1 - i];
        r->n = n;
        *out = jv_listv(r);
        return KEEL_OK;
    }
    case F_ROUND: {
        BIND("round", "precision", "method");
        int64_t prec = 0;
        if (given(arg[0]) && !jv_as_int(arg[0], &prec))
            return jx_fail(x, KEEL_EINVAL, "round: precision must be an int");
        int method = 0;
        if (given(arg[1])) {
            jstr *m = NULL;
            TRY(soft_str(x, arg[1], &m));
            if (jstr_eqc(m, "ceil"))
                method = 1;
            else if (jstr_eqc(m, "floor"))
                method = 2;
            else if (!jstr_eqc(m, "common"))
                return jx_fail(x, KEEL_EINVAL, "method must be common, ceil or floor");
        }
        double d;
        if (!jv_as_num(value, &d)) {
            if (value.t == JT_UNDEF) return jx_undef_error(x, value);
            return jx_fail(x, KEEL_EINVAL, "type %s doesn't define __round__ method",
                           jv_type_name(value));
        }
        if (method == 0) {
            int64_t iv;
            if (jv_as_int(value, &iv) && prec >= 0) {
                *out = jv_int(iv);
                return KEEL_OK;
            }
            *out = jv_float(py_round(d, prec));
            if (value.t != JT_FLOAT) *out = jv_int((int64_t)out->u.f);
            return KEEL_OK;
        }
        double p = pow(10.0, (double)prec);
        *out = jv_float((method == 1 ? ceil(d * p) : floor(d * p)) / p);
        return KEEL_OK;
    }
    case F_SAFE:
        TRY(soft_str(x, value, &s));
        *out = jv_strv(s);
        out->safe = 1;
        return KEEL_OK;
    case F_SORT: {
        BIND("sort", "reverse", "case_sensitive", "attribute");
        bool cs = given(arg[1]) && jv_truthy(arg[1]);
        jv *items = NULL;
        size_t n;
        TRY(iter_copy(x, value, &items, &n));
        jv *keys = n ? jmem_alloc_n(&x->mem, n, sizeof(jv)) : NULL;
        if (n && !keys) return jx_oom(x);
        /* attribute may list several, comma separated */
        jv attrs[8];
        size_t na = 0;
        if (given(arg[2]) && arg[2].t == JT_STR && memchr(arg[2].u.s->s, ',', arg[2].u.s->n)) {
            const jstr *as = arg[2].u.s;
            size_t i = 0;
            while (i <= as->n && na < BASE_ARRAY_LEN(attrs)) {
                size_t j = i;
                while (j < as->n && as->s[j] != ',') j++;
                jstr *part = jstr_new(&x->mem, as->s + i, j - i);
                if (!part) return jx_oom(x);
                attrs[na++] = jv_strv(part);
                i = j + 1;
            }
        }
        for (size_t i = 0; i < n; i++) {
            if (na) {
                jlist *t = jlist_new(&x->mem, na, JL_LIST);
                if (!t) return jx_oom(x);
                for (size_t k = 0; k < na; k++) TRY(sort_key(x, items[i], attrs[k], cs, &t->v[t->n++]));
                keys[i] = jv_listv(t);
            } else {
                TRY(sort_key(x, items[i], arg[2], cs, &keys[i]));
            }
        }
        TRY(sort_by_keys(x, keys, items, n, given(arg[0]) && jv_truthy(arg[0])));
        return make_gen(x, items, n, JL_LIST, out);
    }
    case F_STRING:
        if (value.t == JT_STR) {
            *out = value;
            return KEEL_OK;
        }
        TRY(soft_str(x, value, &s));
        *out = jv_strv(s);
        return KEEL_OK;
    case F_STRIPTAGS:
        return do_striptags(x, value, out);
    case F_SUM: {
        BIND("sum", "attribute", "start");
        jv acc = is_missing(arg[1]) ? jv_int(0) : arg[1];
        jv *items = NULL;
        size_t n;
        TRY(jv_iter(x, value, &items, &n));
        for (size_t i = 0; i < n; i++) {
            jv v = items[i];
            if (given(arg[0])) TRY(attr_get(x, v, arg[0], jv_missing(), &v));
            TRY(jv_binop(x, JO_ADD, acc, v, &acc));
        }
        *out = acc;
        return KEEL_OK;
    }
    case F_TOJSON:
        return do_tojson(x, value, a, out);
    case F_TRIM:
        BIND("trim", "chars");
        TRY(soft_str(x, value, &s));
        TRY(jstr_strip(x, s, arg[0], 3, out));
        out->safe = value.t == JT_STR && value.safe;
        return KEEL_OK;
    case F_TRUNCATE:
        return do_truncate(x, value, a, out);
    case F_UNIQUE: {
        BIND("unique", "case_sensitive", "attribute");
        bool cs = given(arg[0]) && jv_truthy(arg[0]);
        jv *items = NULL;
        size_t n;
        TRY(jv_iter(x, value, &items, &n));
        jdict *seen = jdict_new(&x->mem, 0);
        jlist *r = jlist_new(&x->mem, 0, JL_GEN);
        if (!seen || !r) return jx_oom(x);
        for (size_t i = 0; i < n; i++) {
            jv k;
            TRY(sort_key(x, items[i], arg[1], cs, &k));
            uint64_t h;
            if (!jv_hash(k, &h, 0))
                return jx_fail(x, KEEL_EINVAL, "unhashable type: '%s'", jv_type_name(k));
            if (jdict_find(seen, k) >= 0) continue;
            if (!jdict_set(&x->mem, seen, k, jv_none()) || !jlist_push(&x->mem, r, items[i]))
                return jx_oom(x);
        }
        *out = jv_listv(r);
        return KEEL_OK;
    }
    case F_URLENCODE:
        return do_urlencode(x, value, out);
    case F_WORDCOUNT:
        return do_wordcount(x, value, out);
    case F_XMLATTR:
        return do_xmlattr(x, value, a, out);
    default:
        return jx_fail(x, KEEL_EINTERNAL, "unknown filter %u", id);
    }
}

/* ---- tests ------------------------------------------------------------------------------ */

static keel_status test_mod(jx *x, jv value, jv by, int64_t want, bool *out)
{
    jv r;
    TRY(jv_binop(x, JO_MOD, value, by, &r));
    bool e;
    TRY(jv_eq(x, r, jv_int(want), &e));
    *out = e;
    return KEEL_OK;
}

keel_status jinja_test_call(jx *x, uint16_t id, jv v, const jargs *a, bool *out)
{
    jv arg[1];
    int64_t iv;
    switch (id) {
    case T_DEFINED: *out = v.t != JT_UNDEF; return KEEL_OK;
    case T_UNDEFINED: *out = v.t == JT_UNDEF; return KEEL_OK;
    case T_NONE_: *out = v.t == JT_NONE; return KEEL_OK;
    case T_BOOLEAN: *out = v.t == JT_BOOL; return KEEL_OK;
    case T_FALSE: *out = v.t == JT_BOOL && !v.u.b; return KEEL_OK;
    case T_TRUE: *out = v.t == JT_BOOL && v.u.b; return KEEL_OK;
    case T_INTEGER: *out = v.t == JT_INT; return KEEL_OK;
    case T_FLOAT: *out = v.t == JT_FLOAT; return KEEL_OK;
    case T_NUMBER: *out = v.t == JT_INT || v.t == JT_FLOAT || v.t == JT_BOOL; return KEEL_OK;
    case T_STRING: *out = v.t == JT_STR; return KEEL_OK;
    case T_MAPPING: *out = v.t == JT_DICT; return KEEL_OK;
    case T_ESCAPED: *out = v.t == JT_STR && v.safe; return KEEL_OK;
    case T_SEQUENCE:
        *out = v.t == JT_STR || v.t == JT_DICT || v.t == JT_UNDEF ||
               (v.t == JT_LIST && (v.u.l->kind == JL_LIST || v.u.l->kind == JL_TUPLE ||
                                   v.u.l->kind == JL_RANGE));
        return KEEL_OK;
    case T_ITERABLE:
        *out = v.t == JT_STR || v.t == JT_DICT || v.t == JT_UNDEF || v.t == JT_LIST;
        return KEEL_OK;
    case T_CALLABLE:
        *out = v.t == JT_MACRO || v.t == JT_FUNC || v.t == JT_JOINER || v.t == JT_LOOP ||
               v.t == JT_UNDEF;
        return KEEL_OK;
    case T_LOWER:
    case T_UPPER: {
        jstr *s = NULL;
        TRY(jv_to_str(x, v, &s));
        jargs none = {0};
        jv r;
        TRY(jinja_builtin_call(x, id == T_LOWER ? JF_S_ISLOWER : JF_S_ISUPPER, jv_strv(s), &none, &r));
        *out = r.u.b;
        return KEEL_OK;
    }
    case T_ODD:
    case T_EVEN:
        if (a->n_pos || a->n_kw) return jx_fail(x, KEEL_EINVAL, "test takes no arguments");
        return test_mod(x, v, jv_int(2), id == T_ODD ? 1 : 0, out);
    case T_FILTER:
    case T_TEST: {
        if (v.t != JT_STR) {
            *out = false;
            return KEEL_OK;
        }
        *out = (id == T_FILTER ? jinja_filter_id(v.u.s->s, v.u.s->n)
                               : jinja_test_id(v.u.s->s, v.u.s->n)) != 0;
        return KEEL_OK;
    }
    default:
        break;
    }
    /* tests with one argument */
    static const char *const names[] = {"other"};
    arg[0] = jv_missing();
    TRY(jargs_bind(x, "test", a, names, 1, arg));
    if (is_missing(arg[0])) return jx_fail(x, KEEL_EINVAL, "the test needs an argument");
    jv o = arg[0];
    switch (id) {
    case T_DIVISIBLEBY: return test_mod(x, v, o, 0, out);
    case T_IN: return jv_contains(x, o, v, out);
    case T_EQ: return jv_eq(x, v, o, out);
    case T_NE:
        TRY(jv_eq(x, v, o, out));
        *out = !*out;
        return KEEL_OK;
    case T_GT: return jv_order(x, JO_GT, v, o, out);
    case T_GE: return jv_order(x, JO_GE, v, o, out);
    case T_LT: return jv_order(x, JO_LT, v, o, out);
    case T_LE: return jv_order(x, JO_LE, v, o, out);
    case T_SAMEAS:
        if (v.t != o.t) {
            *out = false;
        } else if (v.t == JT_NONE || v.t == JT_UNDEF) {
            *out = true;
        } else if (v.t == JT_BOOL) {
            *out = v.u.b == o.u.b;
        } else if (jv_as_int(v, &iv)) {
            *out = iv == o.u.i && iv >= -5 && iv <= 256; /* CPython's small-int cache */
        } else {
            *out = v.u.p == o.u.p;
        }
        return KEEL_OK;
    default:
        return jx_fail(x, KEEL_EINTERNAL, "unknown test %u", id);
    }
}
