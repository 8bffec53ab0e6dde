/*
 * jinja_methods.c — the Python methods templates call on values (str, list,
 * tuple, dict, cycler) and the global functions of a chat-template
 * environment (range, namespace, dict, cycler, joiner, raise_exception,
 * strftime_now), with CPython's semantics: code-point indices, Unicode
 * whitespace, str.split with and without a separator. printf-style `%`
 * formatting, str.format and strftime are in jinja_format.c.
 *
 * Case mappings are utf8proc's simple (one-to-one) mappings; CPython uses
 * full mappings for a few characters (ß upper-cases to "SS" there).
 */
#include "jinja_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#define RANGE_MAX 100000 /* jinja2's sandbox MAX_RANGE */

static keel_status need_str(jx *x, const char *fname, jv v, jstr **out)
{
    if (v.t != JT_STR)
        return jx_fail(x, KEEL_EINVAL, "%s() argument must be str, not %s", fname, jv_type_name(v));
    *out = v.u.s;
    return KEEL_OK;
}

static keel_status need_int(jx *x, const char *fname, jv v, int64_t *out)
{
    if (!jv_as_int(v, out))
        return jx_fail(x, KEEL_EINVAL, "%s(): '%s' object cannot be interpreted as an integer",
                       fname, jv_type_name(v));
    return KEEL_OK;
}

/* ---- code points -------------------------------------------------------------- */

typedef struct cps {
    uint32_t *c; /* code points */
    size_t *off; /* [n + 1] byte offsets */
    size_t n;
} cps;

static keel_status decode(jx *x, const jstr *s, cps *o)
{
    size_t cnt = jstr_len_cp(s);
    o->n = cnt;
    o->c = jmem_alloc_n(&x->mem, cnt + 1, sizeof(uint32_t));
    o->off = jmem_alloc_n(&x->mem, cnt + 1, sizeof(size_t));
    if (!o->c || !o->off) return jx_oom(x);
    size_t i = 0, k = 0;
    while (i < s->n) {
        o->off[k] = i;
        o->c[k++] = utf8_next(s->s, s->n, &i);
    }
    o->off[k] = s->n;
    return KEEL_OK;
}

static bool cp_in(uint32_t c, const cps *set)
{
    for (size_t i = 0; i < set->n; i++)
        if (set->c[i] == c) return true;
    return false;
}

static utf8proc_category_t cat(uint32_t c)
{
    return utf8proc_category((utf8proc_int32_t)c);
}

static bool is_alpha(uint32_t c)
{
    utf8proc_category_t k = cat(c);
    return k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
}

static bool is_decimal(uint32_t c)
{
    return cat(c) == UTF8PROC_CATEGORY_ND;
}

static bool is_numeric(uint32_t c)
{
    utf8proc_category_t k = cat(c);
    return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

static bool is_cased(uint32_t c)
{
    utf8proc_category_t k = cat(c);
    return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT;
}

static bool is_lower(uint32_t c)
{
    return cat(c) == UTF8PROC_CATEGORY_LL;
}

static bool is_upper(uint32_t c)
{
    utf8proc_category_t k = cat(c);
    return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LT;
}

static uint32_t to_upper(uint32_t c)
{
    if (c < 0x80) return c >= 'a' && c <= 'z' ? c - 32 : c;
    return (uint32_t)utf8proc_toupper((utf8proc_int32_t)c);
}

static uint32_t to_lower(uint32_t c)
{
    if (c < 0x80) return c >= 'A' && c <= 'Z' ? c + 32 : c;
    return (uint32_t)utf8proc_tolower((utf8proc_int32_t)c);
}

static uint32_t to_title(uint32_t c)
{
    if (c < 0x80) return to_upper(c);
    return (uint32_t)utf8proc_totitle((utf8proc_int32_t)c);
}

/* ---- str methods ---------------------------------------------------------------- */

keel_status jstr_strip(jx *x, jstr *s, jv chars, int which, jv *out)
{
    cps set = {0};
    bool ws = !given(chars) || chars.t == JT_UNDEF;
    if (!ws) {
        if (chars.t != JT_STR)
            return jx_fail(x, KEEL_EINVAL, "strip arg must be None or str");
        TRY(decode(x, chars.u.s, &set));
    }
    size_t b = 0, e = s->n;
    if (which & 1) {
        while (b < e) {
            size_t k = b;
            uint32_t c = utf8_next(s->s, s->n, &k);
            if (ws ? !py_isspace(c) : !cp_in(c, &set)) break;
            b = k;
        }
    }
    if (which & 2) {
        while (e > b) {
            size_t st = e - 1;
            while (st > b && ((unsigned char)s->s[st] & 0xC0) == 0x80) st--;
            size_t k = st;
            uint32_t c = utf8_next(s->s, s->n, &k);
            if (ws ? !py_isspace(c) : !cp_in(c, &set)) break;
            e = st;
        }
    }
    if (b == 0 && e == s->n) {
        *out = jv_strv(s);
        return KEEL_OK;
    }
    jstr *r = jstr_new(&x->mem, s->s + b, e - b);
    if (!r) return jx_oom(x);
    *out = jv_strv(r);
    return KEEL_OK;
}

/* CPython's full (one-to-many) case mappings for the common characters:
 * SpecialCasing.txt entries utf8proc's simple mappings lack. */
static const char *special_upper(uint32_t c, bool title)
{
    switch (c) {
    case 0x00DF: return title ? "Ss" : "SS";
    case 0xFB00: return title ? "Ff" : "FF";
    case 0xFB01: return title ? "Fi" : "FI";
    case 0xFB02: return title ? "Fl" : "FL";
    case 0xFB03: return title ? "Ffi" : "FFI";
    case 0xFB04: return title ? "Ffl" : "FFL";
    case 0xFB05:
    case 0xFB06: return title ? "St" : "ST";
    case 0x0149: return "\xCA\xBCN";
    default: return NULL;
    }
}

keel_status jstr_upper_lower(jx *x, jstr *s, int mode, jv *out)
{
    jsb b;
    jsb_init(&b, &x->mem, x->lim.max_output);
    size_t i = 0;
    bool prev_cased = false, first = true;
    while (i < s->n) {
        uint32_t c = utf8_next(s->s, s->n, &i);
        int kind; /* 0 upper, 1 lower, 2 title, -1 unchanged */
        switch (mode) {
        case 0: kind = 0; break;
        case 1: kind = 1; break;
        case 2: /* str.title: a cased character after a cased one is lowered */
            kind = prev_cased ? 1 : 2;
            prev_cased = is_cased(c);
            break;
        case 3: kind = first ? 2 : 1; break; /* str.capitalize */
        default: kind = is_upper(c) ? 1 : is_lower(c) ? 0 : -1; break; /* swapcase */
        }
        first = false;
        const char *sp = kind == 0 || kind == 2 ? special_upper(c, kind == 2) : NULL;
        bool ok;
        if (sp)
            ok = jsb_adds(&b, sp);
        else if (kind == 1 && c == 0x0130)
            ok = jsb_adds(&b, "i\xCC\x87"); /* İ lower-cases to i + combining dot */
        else
            ok = jsb_addcp(&b, kind == 0 ? to_upper(c) : kind == 1 ? to_lower(c)
                                : kind == 2 ? to_title(c) : c);
        if (!ok) break;
    }
    return jsb_ret(x, &b, out);
}

/* Byte offset of the first occurrence of nd in h[from..to) or -1. */
static int64_t find_bytes(const jstr *h, const jstr *nd, size_t from, size_t to)
{
    if (to > h->n) to = h->n;
    if (from > to || nd->n > to - from) return -1;
    if (nd->n == 0) return (int64_t)from;
    const char *p = memmem(h->s + from, to - from, nd->s, nd->n);
    return p ? (int64_t)(p - h->s) : -1;
}

static int64_t rfind_bytes(const jstr *h, const jstr *nd, size_t from, size_t to)
{
    if (to > h->n) to = h->n;
    if (from > to || nd->n > to - from) return -1;
    for (size_t i = to - nd->n + 1; i-- > from;)
        if (memcmp(h->s + i, nd->s, nd->n) == 0) return (int64_t)i;
    return -1;
}

/* Code point index of a byte offset (s valid UTF-8, off at a boundary). */
static int64_t cp_index(const jstr *s, size_t off)
{
    if (s->ascii) return (int64_t)off;
    int64_t k = 0;
    for (size_t i = 0; i < off; i++)
        if (((unsigned char)s->s[i] & 0xC0) != 0x80) k++;
    return k;
}

/* start/end arguments (code points, Python slice rules) to byte offsets. */
static keel_status span_args(jx *x, const jstr *s, jv start, jv end, size_t *b0, size_t *b1)
{
    int64_t len = (int64_t)jstr_len_cp(s), a = 0, z = len;
    if (given(start)) {
        TRY(need_int(x, "slice", start, &a));
        if (a < 0) a = BASE_MAX(0, a + len);
    }
    if (given(end)) {
        TRY(need_int(x, "slice", end, &z));
        if (z < 0) z = BASE_MAX(0, z + len);
    }
    if (a > len) a = len + 1; /* empty */
    if (z > len) z = len;
    *b0 = a > len ? s->n + 1 : utf8_offset(s, (size_t)a);
    *b1 = utf8_offset(s, (size_t)z);
    return KEEL_OK;
}

keel_status jstr_replace(jx *x, jstr *s, jstr *old, jstr *rep, int64_t count, jv *out)
{
    jsb b;
    jsb_init(&b, &x->mem, x->lim.max_output);
    if (count < 0) count = INT64_MAX;
    if (old->n == 0) {
        /* "ab".replace("", "-") == "-a-b-" */
        size_t i = 0;
        int64_t done = 0;
        while (true) {
            if (done < count) {
                jsb_add(&b, rep->s, rep->n);
                done++;
            }
            if (i >= s->n) break;
            size_t st = i;
            utf8_next(s->s, s->n, &i);
            jsb_add(&b, s->s + st, i - st);
            TRY(jx_steps(x, 0));
        }
        return jsb_ret(x, &b, out);
    }
    size_t i = 0;
    int64_t done = 0;
    while (done < count) {
        int64_t p = find_bytes(s, old, i, s->n);
        if (p < 0) break;
        jsb_add(&b, s->s + i, (size_t)p - i);
        jsb_add(&b, rep->s, rep->n);
        i = (size_t)p + old->n;
        done++;
    }
    if (done == 0) {
        *out = jv_strv(s);
        return KEEL_OK;
    }
    jsb_add(&b, s->s + i, s->n - i);
    return jsb_ret(x, &b, out);
}

static keel_status push_str(jx *x, jlist *l, const char *s, size_t n)
{
    jstr *p = jstr_new(&x->mem, s, n);
    if (!p || !jlist_push(&x->mem, l, jv_strv(p))) return jx_oom(x);
    return KEEL_OK;
}

static void list_reverse(jlist *l)
{
    for (size_t i = 0, j = l->n; i + 1 < j; i++, j--) {
        jv t = l->v[i];
        l->v[i] = l->v[j - 1];
        l->v[j - 1] = t;
    }
}

keel_status jstr_split(jx *x, jstr *s, jv sep, int64_t maxsplit, bool right, jv *out)
{
    jlist *l = jlist_new(&x->mem, 0, JL_LIST);
    if (!l) return jx_oom(x);
    if (maxsplit < 0) maxsplit = INT64_MAX;
    if (!given(sep) || sep.t == JT_UNDEF) {
        /* runs of whitespace; no empty strings */
        cps c;
        TRY(decode(x, s, &c));
        if (!right) {
            size_t i = 0;
            int64_t splits = 0;
            while (i < c.n) {
                while (i < c.n && py_isspace(c.c[i])) i++;
                if (i >= c.n) break;
                if (splits >= maxsplit) {
                    size_t e = c.n;
                    while (e > i && py_isspace(c.c[e - 1])) e--;
                    /* CPython keeps the remainder's trailing whitespace */
                    e = c.n;
                    TRY(push_str(x, l, s->s + c.off[i], c.off[e] - c.off[i]));
                    break;
                }
                size_t j = i;
                while (j < c.n && !py_isspace(c.c[j])) j++;
                TRY(push_str(x, l, s->s + c.off[i], c.off[j] - c.off[i]));
                splits++;
                i = j;
            }
        } else {
            size_t i = c.n;
            int64_t splits = 0;
            while (i > 0) {
                while (i > 0 && py_isspace(c.c[i - 1])) i--;
                if (i == 0) break;
                if (splits >= maxsplit) {
                    TRY(push_str(x, l, s->s, c.off[i]));
                    break;
                }
                size_t j = i;
                while (j > 0 && !py_isspace(c.c[j - 1])) j--;
                TRY(push_str(x, l, s->s + c.off[j], c.off[i] - c.off[j]));
                splits++;
                i = j;
            }
            list_reverse(l);
        }
        *out = jv_listv(l);
        return KEEL_OK;
    }
    jstr *sp = NULL;
    TRY(need_str(x, "split", sep, &sp));
    if (sp->n == 0) return jx_fail(x, KEEL_EINVAL, "empty separator");
    if (!right) {
        size_t i = 0;
        int64_t splits = 0;
        for (;;) {
            int64_t p = splits < maxsplit ? find_bytes(s, sp, i, s->n) : -1;
            if (p < 0) {
                TRY(push_str(x, l, s->s + i, s->n - i));
                break;
            }
            TRY(push_str(x, l, s->s + i, (size_t)p - i));
            i = (size_t)p + sp->n;
            splits++;
        }
    } else {
        size_t e = s->n;
        int64_t splits = 0;
        for (;;) {
            int64_t p = splits < maxsplit ? rfind_bytes(s, sp, 0, e) : -1;
            if (p < 0) {
                TRY(push_str(x, l, s->s, e));
                break;
            }
            TRY(push_str(x, l, s->s + p + sp->n, e - (size_t)p - sp->n));
            e = (size_t)p;
            splits++;
        }
        list_reverse(l);
    }
    *out = jv_listv(l);
    return KEEL_OK;
}

static bool is_linebreak(uint32_t c)
{
    return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D ||
           c == 0x1E || c == 0x85 || c == 0x2028 || c == 0x2029;
}

keel_status jstr_splitlines(jx *x, jstr *s, bool keepends, jv *out)
{
    jlist *l = jlist_new(&x->mem, 0, JL_LIST);
    if (!l) return jx_oom(x);
    size_t i = 0, start = 0;
    while (i < s->n) {
        size_t st = i;
        uint32_t c = utf8_next(s->s, s->n, &i);
        if (!is_linebreak(c)) continue;
        size_t eol = i;
        if (c == '\r' && i < s->n && s->s[i] == '\n') eol = ++i;
        TRY(push_str(x, l, s->s + start, (keepends ? eol : st) - start));
        start = i;
    }
    if (start < s->n) TRY(push_str(x, l, s->s + start, s->n - start));
    *out = jv_listv(l);
    return KEEL_OK;
}

static keel_status str_pad(jx *x, jstr *s, int64_t width, uint32_t fill, int how, jv *out)
{
    int64_t len = (int64_t)jstr_len_cp(s);
    if (width <= len) {
        *out = jv_strv(s);
        return KEEL_OK;
    }
    if (width - len > (int64_t)x->lim.max_output)
        return jx_fail(x, KEEL_EOVERFLOW, "padding longer than %zu bytes", x->lim.max_output);
    int64_t marg = width - len, left;
    if (how == 0)
        left = marg / 2 + (marg & width & 1); /* CPython's center */
    else if (how == 1)
        left = 0; /* ljust */
    else
        left = marg; /* rjust */
    jsb b;
    jsb_init(&b, &x->mem, x->lim.max_output);
    for (int64_t i = 0; i < left; i++) jsb_addcp(&b, fill);
    jsb_add(&b, s->s, s->n);
    for (int64_t i = 0; i < marg - left; i++) jsb_addcp(&b, fill);
    return jsb_ret(x, &b, out);
}

static keel_status fill_arg(jx *x, jv v, uint32_t *fill)
{
    *fill = ' ';
    if (!given(v)) return KEEL_OK;
    jstr *f = NULL;
    TRY(need_str(x, "fillchar", v, &f));
    if (jstr_len_cp(f) != 1)
        return jx_fail(x, KEEL_EINVAL, "The fill character must be exactly one character long");
    size_t i = 0;
    *fill = utf8_next(f->s, f->n, &i);
    return KEEL_OK;
}

/* startswith / endswith with a str or a tuple of str */
static keel_status affix(jx *x, jstr *s, jv what, jv start, jv end, bool suffix, bool *out)
{
    size_t b0, b1;
    TRY(span_args(x, s, start, end, &b0, &b1));
    const jv *items = &what;
    size_t n = 1;
    if (what.t == JT_LIST && what.u.l->kind == JL_TUPLE) {
        items = what.u.l->v;
        n = what.u.l->n;
    }
    *out = false;
    for (size_t i = 0; i < n; i++) {
        if (items[i].t != JT_STR)
            return jx_fail(x, KEEL_EINVAL,
                           "%s first arg must be str or a tuple of str, not %s",
                           suffix ? "endswith" : "startswith", jv_type_name(items[i]));
        const jstr *a = items[i].u.s;
        if (b0 > b1 || b1 - b0 < a->n) continue;
        const char *at = suffix ? s->s + b1 - a->n : s->s + b0;
        if (a->n == 0 || memcmp(at, a->s, a->n) == 0) {
            *out = true;
            return KEEL_OK;
        }
    }
    return KEEL_OK;
}

/* ---- names -------------------------------------------------------------------------- */

typedef struct name_id {
    const char *name;
    jfn id;
} name_id;

static const name_id g_str_methods[] = {
    {"upper", JF_S_UPPER}, {"lower", JF_S_LOWER}, {"strip", JF_S_STRIP}, {"lstrip", JF_S_LSTRIP},
    {"rstrip", JF_S_RSTRIP}, {"split", JF_S_SPLIT}, {"rsplit", JF_S_RSPLIT},
    {"splitlines", JF_S_SPLITLINES}, {"startswith", JF_S_STARTSWITH},
    {"endswith", JF_S_ENDSWITH}, {"replace", JF_S_REPLACE}, {"find", JF_S_FIND},
    {"rfind", JF_S_RFIND}, {"index", JF_S_INDEX}, {"rindex", JF_S_RINDEX}, {"count", JF_S_COUNT},
    {"join", JF_S_JOIN}, {"title", JF_S_TITLE}, {"capitalize", JF_S_CAPITALIZE},
    {"swapcase", JF_S_SWAPCASE}, {"casefold", JF_S_CASEFOLD}, {"format", JF_S_FORMAT},
    {"isalpha", JF_S_ISALPHA}, {"isdigit", JF_S_ISDIGIT}, {"isdecimal", JF_S_ISDECIMAL},
    {"isnumeric", JF_S_ISNUMERIC}, {"isalnum", JF_S_ISALNUM}, {"isspace", JF_S_ISSPACE},
    {"islower", JF_S_ISLOWER}, {"isupper", JF_S_ISUPPER}, {"istitle", JF_S_ISTITLE},
    {"isascii", JF_S_ISASCII}, {"isidentifier", JF_S_ISIDENTIFIER},
    {"partition", JF_S_PARTITION}, {"rpartition", JF_S_RPARTITION},
    {"removeprefix", JF_S_REMOVEPREFIX}, {"removesuffix", JF_S_REMOVESUFFIX},
    {"center", JF_S_CENTER}, {"ljust", JF_S_LJUST}, {"rjust", JF_S_RJUST}, {"zfill", JF_S_ZFILL},
    {"expandtabs", JF_S_EXPANDTABS}, {"encode", JF_S_ENCODE},
};

static const name_id g_list_methods[] = {
    {"append", JF_L_APPEND}, {"pop", JF_L_POP}, {"insert", JF_L_INSERT}, {"extend", JF_L_EXTEND},
    {"remove", JF_L_REMOVE}, {"index", JF_L_INDEX}, {"count", JF_L_COUNT},
    {"reverse", JF_L_REVERSE}, {"sort", JF_L_SORT}, {"copy", JF_L_COPY}, {"clear", JF_L_CLEAR},
};

static const name_id g_dict_methods[] = {
    {"get", JF_D_GET}, {"items", JF_D_ITEMS}, {"keys", JF_D_KEYS}, {"values", JF_D_VALUES},
    {"pop", JF_D_POP}, {"setdefault", JF_D_SETDEFAULT}, {"update", JF_D_UPDATE},
    {"copy", JF_D_COPY}, {"clear", JF_D_CLEAR}, {"popitem", JF_D_POPITEM},
};

static const name_id g_globals[] = {
    {"range", JF_RANGE}, {"namespace", JF_NAMESPACE}, {"dict", JF_DICT},
    {"raise_exception", JF_RAISE}, {"strftime_now", JF_STRFTIME}, {"cycler", JF_CYCLER},
    {"joiner", JF_JOINER},
};

static jfn find_name(const name_id *tab, size_t n, const jstr *name)
{
    for (size_t i = 0; i < n; i++)
        if (jstr_eqc(name, tab[i].name)) return tab[i].id;
    return JF_NONE;
}

jfn jinja_method_id(jv obj, const jstr *name)
{
    switch (obj.t) {
    case JT_STR:
        return find_name(g_str_methods, BASE_ARRAY_LEN(g_str_methods), name);
    case JT_LIST: {
        uint8_t k = obj.u.l->kind;
        if (k == JL_LIST) return find_name(g_list_methods, BASE_ARRAY_LEN(g_list_methods), name);
        if (k == JL_TUPLE || k == JL_RANGE) {
            if (jstr_eqc(name, "index")) return JF_L_INDEX;
            if (jstr_eqc(name, "count")) return JF_L_COUNT;
        }
        return JF_NONE;
    }
    case JT_DICT:
        return find_name(g_dict_methods, BASE_ARRAY_LEN(g_dict_methods), name);
    case JT_CYCLER:
        if (jstr_eqc(name, "next")) return JF_CY_NEXT;
        if (jstr_eqc(name, "reset")) return JF_CY_RESET;
        return JF_NONE;
    default:
        return JF_NONE;
    }
}

jfn jinja_global_id(const jstr *name)
{
    return find_name(g_globals, BASE_ARRAY_LEN(g_globals), name);
}

const char *jinja_builtin_name(jfn fn)
{
    const name_id *tabs[] = {g_str_methods, g_list_methods, g_dict_methods, g_globals};
    const size_t ns[] = {BASE_ARRAY_LEN(g_str_methods), BASE_ARRAY_LEN(g_list_methods),
                         BASE_ARRAY_LEN(g_dict_methods), BASE_ARRAY_LEN(g_globals)};
    for (size_t t = 0; t < 4; t++)
        for (size_t i = 0; i < ns[t]; i++)
            if (tabs[t][i].id == fn) return tabs[t][i].name;
    switch (fn) {
    case JF_LOOP_CYCLE: return "cycle";
    case JF_LOOP_CHANGED: return "changed";
    case JF_CY_NEXT: return "next";
    case JF_CY_RESET: return "reset";
    default: return "function";
    }
}

/* ---- calls ---------------------------------------------------------------------------- */

#define BIND(fname, ...) JARGS_BIND(fname, __VA_ARGS__)

#define NO_ARGS(fname) JARGS_NONE(fname)

static keel_status str_pred(jx *x, jfn fn, jstr *s, const jargs *a, jv *out)
{
    NO_ARGS(jinja_builtin_name(fn));
    size_t i = 0, n = 0;
    bool all = true, any_cased = false, all_cased_ok = true;
    bool title_ok = true, prev_cased = false;
    while (i < s->n) {
        uint32_t c = utf8_next(s->s, s->n, &i);
        n++;
        switch (fn) {
        case JF_S_ISALPHA: all = all && is_alpha(c); break;
        case JF_S_ISDIGIT: all = all && (is_decimal(c) || cat(c) == UTF8PROC_CATEGORY_NO); break;
        case JF_S_ISDECIMAL: all = all && is_decimal(c); break;
        case JF_S_ISNUMERIC: all = all && is_numeric(c); break;
        case JF_S_ISALNUM: all = all && (is_alpha(c) || is_numeric(c)); break;
        case JF_S_ISSPACE: all = all && py_isspace(c); break;
        case JF_S_ISASCII: all = all && c < 0x80; break;
        case JF_S_ISIDENTIFIER:
            all = all && (c == '_' || is_alpha(c) || (n > 1 && (is_numeric(c) ||
                                                                 cat(c) == UTF8PROC_CATEGORY_MN ||
                                                                 cat(c) == UTF8PROC_CATEGORY_MC ||
                                                                 cat(c) == UTF8PROC_CATEGORY_PC)));
            break;
        case JF_S_ISLOWER:
            if (is_cased(c)) {
                any_cased = true;
                if (!is_lower(c)) all_cased_ok = false;
            }
            break;
        case JF_S_ISUPPER:
            if (is_cased(c)) {
                any_cased = true;
                if (!is_upper(c)) all_cased_ok = false;
            }
            break;
        default: /* istitle */
            if (is_upper(c)) {
                if (prev_cased) title_ok = false;
                prev_cased = true;
                any_cased = true;
            } else if (is_lower(c)) {
                if (!prev_cased) title_ok = false;
                prev_cased = true;
                any_cased = true;
            } else {
                prev_cased = false;
            }
            break;
        }
    }
    bool r;
    if (fn == JF_S_ISLOWER || fn == JF_S_ISUPPER)
        r = any_cased && all_cased_ok;
    else if (fn == JF_S_ISTITLE)
        r = any_cased && title_ok;
    else if (fn == JF_S_ISASCII)
        r = all;
    else
        r = n > 0 && all;
    *out = jv_bool(r);
    return KEEL_OK;
}

static keel_status str_method(jx *x, jfn fn, jstr *s, const jargs *a, jv *out)
{
    jv arg[4];
    switch (fn) {
    case JF_S_UPPER: NO_ARGS("upper"); return jstr_upper_lower(x, s, 0, out);
    case JF_S_LOWER: NO_ARGS("lower"); return jstr_upper_lower(x, s, 1, out);
    case JF_S_CASEFOLD: NO_ARGS("casefold"); return jstr_upper_lower(x, s, 1, out);
    case JF_S_TITLE: NO_ARGS("title"); return jstr_upper_lower(x, s, 2, out);
    case JF_S_CAPITALIZE: NO_ARGS("capitalize"); return jstr_upper_lower(x, s, 3, out);
    case JF_S_SWAPCASE: NO_ARGS("swapcase"); return jstr_upper_lower(x, s, 4, out);
    case JF_S_STRIP:
    case JF_S_LSTRIP:
    case JF_S_RSTRIP:
        BIND(jinja_builtin_name(fn), "chars");
        return jstr_strip(x, s, arg[0], fn == JF_S_STRIP ? 3 : fn == JF_S_LSTRIP ? 1 : 2, out);
    case JF_S_SPLIT:
    case JF_S_RSPLIT: {
        BIND(fn == JF_S_SPLIT ? "split" : "rsplit", "sep", "maxsplit");
        int64_t maxsplit = -1;
        if (given(arg[1])) TRY(need_int(x, "split", arg[1], &maxsplit));
        return jstr_split(x, s, arg[0], maxsplit, fn == JF_S_RSPLIT, out);
    }
    case JF_S_SPLITLINES:
        BIND("splitlines", "keepends");
        return jstr_splitlines(x, s, given(arg[0]) && jv_truthy(arg[0]), out);
    case JF_S_STARTSWITH:
    case JF_S_ENDSWITH: {
        BIND(jinja_builtin_name(fn), "prefix", "start", "end");
        if (is_missing(arg[0]))
            return jx_fail(x, KEEL_EINVAL, "%s() takes at least 1 argument (0 given)",
                           jinja_builtin_name(fn));
        bool r;
        TRY(affix(x, s, arg[0], arg[1], arg[2], fn == JF_S_ENDSWITH, &r));
        *out = jv_bool(r);
        return KEEL_OK;
    }
    case JF_S_REPLACE: {
        BIND("replace", "old", "new", "count");
        jstr *o = NULL, *r = NULL;
        TRY(need_str(x, "replace", arg[0], &o));
        TRY(need_str(x, "replace", arg[1], &r));
        int64_t count = -1;
        if (given(arg[2])) TRY(need_int(x, "replace", arg[2], &count));
        return jstr_replace(x, s, o, r, count, out);
    }
    case JF_S_FIND:
    case JF_S_RFIND:
    case JF_S_INDEX:
    case JF_S_RINDEX:
    case JF_S_COUNT: {
        BIND(jinja_builtin_name(fn), "sub", "start", "end");
        jstr *sub = NULL;
        TRY(need_str(x, jinja_builtin_name(fn), arg[0], &sub));
        size_t b0, b1;
        TRY(span_args(x, s, arg[1], arg[2], &b0, &b1));
        if (fn == JF_S_COUNT) {
            int64_t k = 0;
            if (b0 <= b1) {
                if (sub->n == 0) {
                    k = cp_index(s, b1) - cp_index(s, b0) + 1;
                } else {
                    size_t i = b0;
                    int64_t p;
                    while ((p = find_bytes(s, sub, i, b1)) >= 0) {
                        k++;
                        i = (size_t)p + sub->n;
                    }
                }
            }
            *out = jv_int(k);
            return KEEL_OK;
        }
        bool rev = fn == JF_S_RFIND || fn == JF_S_RINDEX;
        int64_t p = rev ? rfind_bytes(s, sub, b0, b1) : find_bytes(s, sub, b0, b1);
        if (p < 0 && (fn == JF_S_INDEX || fn == JF_S_RINDEX))
            return jx_fail(x, KEEL_EINVAL, "substring not found");
        *out = jv_int(p < 0 ? -1 : cp_index(s, (size_t)p));
        return KEEL_OK;
    }
    case JF_S_JOIN: {
        BIND("join", "iterable");
        jv *items = NULL;
        size_t n;
        if (is_missing(arg[0])) return jx_fail(x, KEEL_EINVAL, "join() takes exactly one argument");
        TRY(jv_iter(x, arg[0], &items, &n));
        jsb b;
        jsb_init(&b, &x->mem, x->lim.max_output);
        for (size_t i = 0; i < n; i++) {
            if (items[i].t != JT_STR)
                return jx_fail(x, KEEL_EINVAL, "sequence item %zu: expected str instance, %s found",
                               i, jv_type_name(items[i]));
            if (i) jsb_add(&b, s->s, s->n);
            jsb_add(&b, items[i].u.s->s, items[i].u.s->n);
        }
        return jsb_ret(x, &b, out);
    }
    case JF_S_FORMAT:
        return jinja_str_format(x, s, a, out);
    case JF_S_PARTITION:
    case JF_S_RPARTITION: {
        BIND(jinja_builtin_name(fn), "sep");
        jstr *sep = NULL;
        TRY(need_str(x, jinja_builtin_name(fn), arg[0], &sep));
        if (sep->n == 0) return jx_fail(x, KEEL_EINVAL, "empty separator");
        int64_t p = fn == JF_S_PARTITION ? find_bytes(s, sep, 0, s->n) : rfind_bytes(s, sep, 0, s->n);
        jlist *l = jlist_new(&x->mem, 3, JL_TUPLE);
        if (!l) return jx_oom(x);
        if (p < 0) {
            jv e = jv_strv(JSTR_EMPTY);
            l->v[0] = fn == JF_S_PARTITION ? jv_strv(s) : e;
            l->v[1] = e;
            l->v[2] = fn == JF_S_PARTITION ? e : jv_strv(s);
        } else {
            jstr *h = jstr_new(&x->mem, s->s, (size_t)p);
            jstr *t = jstr_new(&x->mem, s->s + p + sep->n, s->n - (size_t)p - sep->n);
            if (!h || !t) return jx_oom(x);
            l->v[0] = jv_strv(h);
            l->v[1] = jv_strv(sep);
            l->v[2] = jv_strv(t);
        }
        l->n = 3;
        *out = jv_listv(l);
        return KEEL_OK;
    }
    case JF_S_REMOVEPREFIX:
    case JF_S_REMOVESUFFIX: {
        BIND(jinja_builtin_name(fn), "affix");
        jstr *f = NULL;
        TRY(need_str(x, jinja_builtin_name(fn), arg[0], &f));
        *out = jv_strv(s);
        if (f->n && f->n <= s->n) {
            bool pre = fn == JF_S_REMOVEPREFIX;
            if (memcmp(pre ? s->s : s->s + s->n - f->n, f->s, f->n) == 0) {
                jstr *r = jstr_new(&x->mem, pre ? s->s + f->n : s->s, s->n - f->n);
                if (!r) return jx_oom(x);
                *out = jv_strv(r);
            }
        }
        return KEEL_OK;
    }
    case JF_S_CENTER:
    case JF_S_LJUST:
    case JF_S_RJUST: {
        BIND(jinja_builtin_name(fn), "width", "fillchar");
        int64_t w;
        uint32_t fill;
        TRY(need_int(x, jinja_builtin_name(fn), arg[0], &w));
        TRY(fill_arg(x, arg[1], &fill));
        return str_pad(x, s, w, fill, fn == JF_S_CENTER ? 0 : fn == JF_S_LJUST ? 1 : 2, out);
    }
    case JF_S_ZFILL: {
        BIND("zfill", "width");
        int64_t w;
        TRY(need_int(x, "zfill", arg[0], &w));
        int64_t len = (int64_t)jstr_len_cp(s);
        if (w <= len) {
            *out = jv_strv(s);
            return KEEL_OK;
        }
        if (w - len > (int64_t)x->lim.max_output)
            return jx_fail(x, KEEL_EOVERFLOW, "padding longer than %zu bytes", x->lim.max_output);
        jsb b;
        jsb_init(&b, &x->mem, x->lim.max_output);
        size_t st = 0;
        if (s->n && (s->s[0] == '-' || s->s[0] == '+')) {
            jsb_addc(&b, s->s[0]);
            st = 1;
        }
        for (int64_t i = 0; i < w - len; i++) jsb_addc(&b, '0');
        jsb_add(&b, s->s + st, s->n - st);
        return jsb_ret(x, &b, out);
    }
    case JF_S_EXPANDTABS: {
        BIND("expandtabs", "tabsize");
        int64_t ts = 8;
        if (given(arg[0])) TRY(need_int(x, "expandtabs", arg[0], &ts));
        jsb b;
        jsb_init(&b, &x->mem, x->lim.max_output);
        int64_t col = 0;
        size_t i = 0;
        while (i < s->n) {
            size_t st = i;
            uint32_t c = utf8_next(s->s, s->n, &i);
            if (c == '\t') {
                if (ts > 0) {
                    int64_t k = ts - col % ts;
                    if (k > (int64_t)x->lim.max_output) k = (int64_t)x->lim.max_output;
                    for (int64_t q = 0; q < k; q++) jsb_addc(&b, ' ');
                    col += k;
                }
            } else {
                jsb_add(&b, s->s + st, i - st);
                col = (c == '\n' || c == '\r') ? 0 : col + 1;
            }
            if (b.over || b.oom) break;
        }
        return jsb_ret(x, &b, out);
    }
    case JF_S_ENCODE:
        return jx_fail(x, KEEL_EINVAL, "str.encode() is not supported (no bytes values)");
    default:
        return str_pred(x, fn, s, a, out);
    }
}

/* ---- list and dict methods ---------------------------------------------------------- */

static keel_status list_sort(jx *x, jv *v, size_t n, bool reverse);

static keel_status list_method(jx *x, jfn fn, jv self, const jargs *a, jv *out)
{
    jlist *l = self.u.l;
    jv arg[3];
    *out = jv_none();
    switch (fn) {
    case JF_L_APPEND:
        BIND("append", "object");
        if (is_missing(arg[0])) return jx_fail(x, KEEL_EINVAL, "append() takes exactly one argument (0 given)");
        TRY(jx_step(x));
        return jlist_push(&x->mem, l, arg[0]) ? KEEL_OK : jx_oom(x);
    case JF_L_INSERT: {
        BIND("insert", "index", "object");
        int64_t i;
        TRY(need_int(x, "insert", arg[0], &i));
        if (is_missing(arg[1])) return jx_fail(x, KEEL_EINVAL, "insert expected 2 arguments");
        if (i < 0) i = BASE_MAX(0, i + (int64_t)l->n);
        TRY(jx_step(x));
        return jlist_insert(&x->mem, l, (size_t)BASE_MIN(i, (int64_t)l->n), arg[1]) ? KEEL_OK
                                                                                    : jx_oom(x);
    }
    case JF_L_EXTEND: {
        BIND("extend", "iterable");
        jv *items = NULL;
        size_t n;
        TRY(jv_iter(x, arg[0], &items, &n));
        TRY(jx_steps(x, (int64_t)n));
        jv *copy = n ? jmem_alloc_n(&x->mem, n, sizeof(jv)) : NULL;
        if (n && !copy) return jx_oom(x);
        if (n) memcpy(copy, items, n * sizeof(jv)); /* l.extend(l) */
        for (size_t i = 0; i < n; i++)
            if (!jlist_push(&x->mem, l, copy[i])) return jx_oom(x);
        return KEEL_OK;
    }
    case JF_L_POP: {
        BIND("pop", "index");
        int64_t i = -1;
        if (given(arg[0])) TRY(need_int(x, "pop", arg[0], &i));
        if (l->n == 0) return jx_fail(x, KEEL_EINVAL, "pop from empty list");
        if (i < 0) i += (int64_t)l->n;
        if (i < 0 || (size_t)i >= l->n) return jx_fail(x, KEEL_EINVAL, "pop index out of range");
        *out = l->v[i];
        memmove(l->v + i, l->v + i + 1, (l->n - (size_t)i - 1) * sizeof(jv));
        l->n--;
        return KEEL_OK;
    }
    case JF_L_REMOVE:
    case JF_L_INDEX:
    case JF_L_COUNT: {
        BIND(jinja_builtin_name(fn), "value");
        if (is_missing(arg[0]))
            return jx_fail(x, KEEL_EINVAL, "%s() takes exactly one argument (0 given)",
                           jinja_builtin_name(fn));
        int64_t cnt = 0;
        for (size_t i = 0; i < l->n; i++) {
            bool e;
            TRY(jv_eq(x, l->v[i], arg[0], &e));
            if (!e) continue;
            if (fn == JF_L_INDEX) {
                *out = jv_int((int64_t)i);
                return KEEL_OK;
            }
            if (fn == JF_L_REMOVE) {
                memmove(l->v + i, l->v + i + 1, (l->n - i - 1) * sizeof(jv));
                l->n--;
                return KEEL_OK;
            }
            cnt++;
        }
        if (fn == JF_L_COUNT) {
            *out = jv_int(cnt);
            return KEEL_OK;
        }
        return jx_fail(x, KEEL_EINVAL, fn == JF_L_INDEX ? "value is not in list"
                                                        : "list.remove(x): x not in list");
    }
    case JF_L_REVERSE:
        NO_ARGS("reverse");
        list_reverse(l);
        return KEEL_OK;
    case JF_L_SORT: {
        BIND("sort", "key", "reverse");
        if (given(arg[0]))
            return jx_fail(x, KEEL_EINVAL, "sort(key=...) is not supported; use the sort filter");
        return list_sort(x, l->v, l->n, given(arg[1]) && jv_truthy(arg[1]));
    }
    case JF_L_COPY: {
        NO_ARGS("copy");
        jlist *c = jv_list_copy(x, l->v, l->n, JL_LIST);
        if (!c) return jx_oom(x);
        *out = jv_listv(c);
        return KEEL_OK;
    }
    case JF_L_CLEAR:
        NO_ARGS("clear");
        l->n = 0;
        return KEEL_OK;
    default:
        return jx_fail(x, KEEL_EINTERNAL, "bad list method");
    }
}

/* Stable merge sort of v[0..n) with Python's < (errors for unorderable). */
static keel_status list_sort(jx *x, jv *v, size_t n, bool reverse)
{
    if (n < 2) return KEEL_OK;
    TRY(jx_steps(x, (int64_t)n));
    jv *tmp = jmem_alloc_n(&x->mem, n, sizeof(jv));
    if (!tmp) return jx_oom(x);
    for (size_t w = 1; w < n; w *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * w) {
            size_t mid = BASE_MIN(lo + w, n), hi = BASE_MIN(lo + 2 * w, n);
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) {
                int c;
                TRY(jv_cmp(x, v[j], v[i], &c));
                /* take from the right only when strictly before (stable);
                 * reverse keeps equal items in order, as Python does */
                bool right = reverse ? c > 0 : c < 0;
                tmp[k++] = right ? v[j++] : v[i++];
            }
            while (i < mid) tmp[k++] = v[i++];
            while (j < hi) tmp[k++] = v[j++];
        }
        memcpy(v, tmp, n * sizeof(jv));
        if (w > SIZE_MAX / 4) break;
    }
    return KEEL_OK;
}

static keel_status dict_method(jx *x, jfn fn, jv self, const jargs *a, jv *out)
{
    jdict *d = self.u.d;
    jv arg[2];
    *out = jv_none();
    switch (fn) {
    case JF_D_GET: {
        BIND("get", "key", "default");
        if (is_missing(arg[0])) return jx_fail(x, KEEL_EINVAL, "get expected at least 1 argument, got 0");
        uint64_t h;
        if (!jv_hash(arg[0], &h, 0))
            return jx_fail(x, KEEL_EINVAL, "unhashable type: '%s'", jv_type_name(arg[0]));
        int64_t i = jdict_find(d, arg[0]);
        *out = i >= 0 ? d->v[i] : is_missing(arg[1]) ? jv_none() : arg[1];
        return KEEL_OK;
    }
    case JF_D_ITEMS:
    case JF_D_KEYS:
    case JF_D_VALUES: {
        NO_ARGS(jinja_builtin_name(fn));
        jlist *l = jlist_new(&x->mem, d->n,
                             fn == JF_D_ITEMS ? JL_ITEMS : fn == JF_D_KEYS ? JL_KEYS : JL_VALUES);
        if (!l) return jx_oom(x);
        TRY(jx_steps(x, (int64_t)d->n / 8));
        for (size_t i = 0; i < d->n; i++) {
            if (fn == JF_D_ITEMS) {
                jlist *t = jlist_new(&x->mem, 2, JL_TUPLE);
                if (!t) return jx_oom(x);
                t->v[0] = d->k[i];
                t->v[1] = d->v[i];
                t->n = 2;
                l->v[i] = jv_listv(t);
            } else {
                l->v[i] = fn == JF_D_KEYS ? d->k[i] : d->v[i];
            }
        }
        l->n = d->n;
        *out = jv_listv(l);
        return KEEL_OK;
    }
    case JF_D_POP: {
        BIND("pop", "key", "default");
        int64_t i = jdict_find(d, arg[0]);
        if (i < 0) {
            if (!is_missing(arg[1])) {
                *out = arg[1];
                return KEEL_OK;
            }
            jsb kb;
            jsb_init(&kb, &x->mem, 200);
            TRY(jv_repr(x, &kb, arg[0], 0));
            return jx_fail(x, KEEL_EINVAL, "KeyError: %.*s", (int)kb.n, kb.n ? kb.d : "");
        }
        *out = d->v[i];
        return jdict_remove(&x->mem, d, (size_t)i) ? KEEL_OK : jx_oom(x);
    }
    case JF_D_POPITEM: {
        NO_ARGS("popitem");
        if (d->n == 0) return jx_fail(x, KEEL_EINVAL, "KeyError: 'popitem(): dictionary is empty'");
        jlist *t = jlist_new(&x->mem, 2, JL_TUPLE);
        if (!t) return jx_oom(x);
        t->v[0] = d->k[d->n - 1];
        t->v[1] = d->v[d->n - 1];
        t->n = 2;
        *out = jv_listv(t);
        return jdict_remove(&x->mem, d, d->n - 1) ? KEEL_OK : jx_oom(x);
    }
    case JF_D_SETDEFAULT: {
        BIND("setdefault", "key", "default");
        uint64_t h;
        if (!jv_hash(arg[0], &h, 0))
            return jx_fail(x, KEEL_EINVAL, "unhashable type: '%s'", jv_type_name(arg[0]));
        int64_t i = jdict_find(d, arg[0]);
        if (i >= 0) {
            *out = d->v[i];
            return KEEL_OK;
        }
        *out = is_missing(arg[1]) ? jv_none() : arg[1];
        return jdict_set(&x->mem, d, arg[0], *out) ? KEEL_OK : jx_oom(x);
    }
    case JF_D_UPDATE: {
        if (a->n_pos > 1) return jx_fail(x, KEEL_EINVAL, "update expected at most 1 argument");
        if (a->n_pos == 1) {
            jv o = a->pos[0];
            if (o.t == JT_DICT || o.t == JT_NS) {
                const jdict *e = o.u.d;
                for (size_t i = 0; i < e->n; i++)
                    if (!jdict_set(&x->mem, d, e->k[i], e->v[i])) return jx_oom(x);
            } else {
                jv *items = NULL;
                size_t n;
                TRY(jv_iter(x, o, &items, &n));
                for (size_t i = 0; i < n; i++) {
                    jv *kv = NULL;
                    size_t m;
                    TRY(jv_iter(x, items[i], &kv, &m));
                    if (m != 2)
                        return jx_fail(x, KEEL_EINVAL, "dictionary update sequence element #%zu has "
                                                       "length %zu; 2 is required", i, m);
                    if (!jdict_set(&x->mem, d, kv[0], kv[1])) return jx_oom(x);
                }
            }
        }
        for (size_t k = 0; k < a->n_kw; k++)
            if (!jdict_set(&x->mem, d, jv_strv((jstr *)a->kw_names[k]), a->kw[k])) return jx_oom(x);
        return KEEL_OK;
    }
    case JF_D_COPY: {
        NO_ARGS("copy");
        jdict *c = jdict_new(&x->mem, d->n);
        if (!c) return jx_oom(x);
        for (size_t i = 0; i < d->n; i++)
            if (!jdict_set(&x->mem, c, d->k[i], d->v[i])) return jx_oom(x);
        *out = jv_dictv(c);
        return KEEL_OK;
    }
    case JF_D_CLEAR:
        NO_ARGS("clear");
        d->n = 0;
        d->idx = NULL;
        return KEEL_OK;
    default:
        return jx_fail(x, KEEL_EINTERNAL, "bad dict method");
    }
}

/* ---- globals ------------------------------------------------------------------------- */

static keel_status g_range(jx *x, const jargs *a, jv *out)
{
    if (a->n_kw) return jx_fail(x, KEEL_EINVAL, "range() takes no keyword arguments");
    if (a->n_pos < 1 || a->n_pos > 3)
        return jx_fail(x, KEEL_EINVAL, "range expected at most 3 arguments, got %zu", a->n_pos);
    int64_t v[3] = {0, 0, 1};
    for (size_t i = 0; i < a->n_pos; i++)
        if (!jv_as_int(a->pos[i], &v[i]))
            return jx_fail(x, KEEL_EINVAL, "'%s' object cannot be interpreted as an integer",
                           jv_type_name(a->pos[i]));
    int64_t start = 0, stop, step = 1;
    if (a->n_pos == 1) {
        stop = v[0];
    } else {
        start = v[0];
        stop = v[1];
        if (a->n_pos == 3) step = v[2];
    }
    if (step == 0) return jx_fail(x, KEEL_EINVAL, "range() arg 3 must not be zero");
    int64_t n = 0;
    if (step > 0 && start < stop) n = (int64_t)(((uint64_t)stop - (uint64_t)start - 1) / (uint64_t)step) + 1;
    if (step < 0 && start > stop)
        n = (int64_t)(((uint64_t)start - (uint64_t)stop - 1) / ((uint64_t)0 - (uint64_t)step)) + 1;
    if (n > RANGE_MAX)
        return jx_fail(x, KEEL_EOVERFLOW, "Range too big. The sandbox blocks ranges larger than "
                                          "MAX_RANGE (%d).", RANGE_MAX);
    jlist *l = jlist_new(&x->mem, 0, JL_RANGE); /* items made when needed */
    if (!l) return jx_oom(x);
    l->n = (size_t)n;
    l->r0 = start;
    l->r1 = stop;
    l->r2 = step;
    *out = jv_listv(l);
    return KEEL_OK;
}

static keel_status g_dict(jx *x, const jargs *a, bool ns, jv *out)
{
    jdict *d = jdict_new(&x->mem, a->n_kw);
    if (!d) return jx_oom(x);
    if (a->n_pos > 1)
        return jx_fail(x, KEEL_EINVAL, "%s expected at most 1 argument, got %zu",
                       ns ? "namespace" : "dict", a->n_pos);
    if (a->n_pos == 1 && a->pos[0].t != JT_UNDEF) {
        jv o = a->pos[0];
        if (o.t == JT_DICT || o.t == JT_NS) {
            for (size_t i = 0; i < o.u.d->n; i++)
                if (!jdict_set(&x->mem, d, o.u.d->k[i], o.u.d->v[i])) return jx_oom(x);
        } else {
            jv *items = NULL;
            size_t n;
            TRY(jv_iter(x, o, &items, &n));
            for (size_t i = 0; i < n; i++) {
                jv *kv = NULL;
                size_t m;
                TRY(jv_iter(x, items[i], &kv, &m));
                if (m != 2)
                    return jx_fail(x, KEEL_EINVAL, "dictionary update sequence element #%zu has "
                                                   "length %zu; 2 is required", i, m);
                uint64_t h;
                if (!jv_hash(kv[0], &h, 0))
                    return jx_fail(x, KEEL_EINVAL, "unhashable type: '%s'", jv_type_name(kv[0]));
                if (!jdict_set(&x->mem, d, kv[0], kv[1])) return jx_oom(x);
            }
        }
    }
    for (size_t k = 0; k < a->n_kw; k++)
        if (!jdict_set(&x->mem, d, jv_strv((jstr *)a->kw_names[k]), a->kw[k])) return jx_oom(x);
    *out = jv_dictv(d);
    if (ns) out->t = JT_NS;
    return KEEL_OK;
}

/* Markup's methods that return Markup (markupsafe wraps these). */
static bool keeps_markup(jfn fn)
{
    switch (fn) {
    case JF_S_CAPITALIZE: case JF_S_TITLE: case JF_S_LOWER: case JF_S_UPPER: case JF_S_REPLACE:
    case JF_S_LJUST: case JF_S_RJUST: case JF_S_LSTRIP: case JF_S_RSTRIP: case JF_S_CENTER:
    case JF_S_STRIP: case JF_S_EXPANDTABS: case JF_S_SWAPCASE: case JF_S_ZFILL:
        return true;
    default:
        return false;
    }
}

keel_status jinja_builtin_call(jx *x, jfn fn, jv self, const jargs *a, jv *out)
{
    jv arg[2];
    TRY(jx_step(x));
    if (fn >= JF_S_UPPER && fn <= JF_S_ENCODE) {
        if (self.t != JT_STR) return jx_fail(x, KEEL_EINTERNAL, "str method on %s", jv_type_name(self));
        TRY(jx_scan(x, self.u.s->n));
        TRY(str_method(x, fn, self.u.s, a, out));
        if (self.safe && out->t == JT_STR && keeps_markup(fn)) out->safe = 1;
        return KEEL_OK;
    }
    if (fn >= JF_L_APPEND && fn <= JF_L_CLEAR) {
        if (self.t != JT_LIST) return jx_fail(x, KEEL_EINTERNAL, "list method on %s", jv_type_name(self));
        if (!jv_range_fill(x, self.u.l)) return jx_oom(x);
        return list_method(x, fn, self, a, out);
    }
    if (fn >= JF_D_GET && fn <= JF_D_POPITEM) {
        if (self.t != JT_DICT) return jx_fail(x, KEEL_EINTERNAL, "dict method on %s", jv_type_name(self));
        return dict_method(x, fn, self, a, out);
    }
    switch (fn) {
    case JF_RANGE:
        return g_range(x, a, out);
    case JF_NAMESPACE:
        return g_dict(x, a, true, out);
    case JF_DICT:
        return g_dict(x, a, false, out);
    case JF_RAISE: {
        BIND("raise_exception", "message");
        jstr *msg = NULL;
        TRY(jv_to_str(x, is_missing(arg[0]) ? jv_strv(JSTR_EMPTY) : arg[0], &msg));
        return jx_fail(x, KEEL_EINVAL, "%.*s", (int)BASE_MIN(msg->n, 200), msg->s);
    }
    case JF_STRFTIME: {
        BIND("strftime_now", "format");
        jstr *f = NULL;
        TRY(need_str(x, "strftime_now", arg[0], &f));
        return jinja_strftime_now(x, f, out);
    }
    case JF_CYCLER: {
        if (a->n_kw) return jx_fail(x, KEEL_EINVAL, "cycler() takes no keyword arguments");
        if (a->n_pos == 0) return jx_fail(x, KEEL_EINVAL, "at least one item has to be provided");
        jcycler *c = jmem_zalloc(&x->mem, sizeof *c);
        if (!c) return jx_oom(x);
        c->items = jmem_alloc_n(&x->mem, a->n_pos, sizeof(jv));
        if (!c->items) return jx_oom(x);
        memcpy(c->items, a->pos, a->n_pos * sizeof(jv));
        c->n = a->n_pos;
        *out = jv_undef();
        out->t = JT_CYCLER;
        out->u.cy = c;
        return KEEL_OK;
    }
    case JF_JOINER: {
        BIND("joiner", "sep");
        jcycler *c = jmem_zalloc(&x->mem, sizeof *c);
        if (!c) return jx_oom(x);
        c->sep = jstr_new(&x->mem, ", ", 2);
        if (!c->sep) return jx_oom(x);
        if (!is_missing(arg[0])) TRY(jv_to_str(x, arg[0], &c->sep));
        *out = jv_undef();
        out->t = JT_JOINER;
        out->u.cy = c;
        return KEEL_OK;
    }
    case JF_CY_NEXT: {
        NO_ARGS("next");
        jcycler *c = self.u.cy;
        *out = c->items[c->pos];
        c->pos = (c->pos + 1) % c->n;
        return KEEL_OK;
    }
    case JF_CY_RESET:
        NO_ARGS("reset");
        self.u.cy->pos = 0;
        *out = jv_none();
        return KEEL_OK;
    case JF_LOOP_CYCLE: {
        if (a->n_pos == 0) return jx_fail(x, KEEL_EINVAL, "no items for cycling given");
        *out = a->pos[self.u.loop->i % a->n_pos];
        return KEEL_OK;
    }
    case JF_LOOP_CHANGED: {
        jloop *lp = self.u.loop;
        jlist *t = jv_list_copy(x, a->pos, a->n_pos, JL_TUPLE);
        if (!t) return jx_oom(x);
        jv now = jv_listv(t);
        bool same = false;
        if (lp->has_changed) TRY(jv_eq(x, lp->last_changed, now, &same));
        lp->last_changed = now;
        lp->has_changed = true;
        *out = jv_bool(!same);
        return KEEL_OK;
    }
    default:
        return jx_fail(x, KEEL_EINTERNAL, "unknown builtin %d", (int)fn);
    }
}
