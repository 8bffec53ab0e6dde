/*
 * jinja_value.c — the values of the Jinja engine and their Python semantics:
 * the arena they live in, strings (UTF-8, indexed by code point), lists and
 * insertion-ordered dicts with a hash index, truthiness, str()/repr()
 * printing as CPython prints, json.dumps, a JSON reader, ==, ordering, `in`,
 * len(), iteration, arithmetic, attribute and item access as jinja2's
 * sandboxed environment resolves them, and Undefined with jinja2's messages.
 *
 * Invariants: every string is valid UTF-8 (inputs are validated; operations
 * cut only at code point boundaries); recursive walks over values (printing,
 * equality, hashing, json) stop at JV_MAX_DEPTH with an error, so cyclic or
 * deeply nested values cannot exhaust the stack.
 */
#include "jinja_int.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#define JV_MAX_DEPTH 130 /* nesting of values walked recursively (JSON input: 128) */
#define JMEM_CHUNK (64 * 1024)

/* ---- arena ---------------------------------------------------------------- */

struct jmem_chunk {
    jmem_chunk *next;
    size_t size; /* bytes of data after the header */
    size_t used;
    size_t pad;  /* keeps data 16-byte aligned (header is 32 bytes) */
};

void jmem_init(jmem *m, size_t limit)
{
    memset(m, 0, sizeof *m);
    m->limit = limit;
}

void *jmem_alloc(jmem *m, size_t n)
{
    size_t need;
    if (!size_align_up(n ? n : 1, 16, &need)) {
        m->fail = KEEL_EOVERFLOW;
        return NULL;
    }
    jmem_chunk *c = m->head;
    if (c && c->size - c->used >= need) {
        void *p = (char *)(c + 1) + c->used;
        c->used += need;
        return p;
    }
    /* a new chunk: large takes get their own; chunks grow with the arena */
    size_t size = BASE_MAX((size_t)JMEM_CHUNK, m->total / 4);
    if (need > size / 4) size = need;
    size_t bytes;
    if (!size_add(size, sizeof(jmem_chunk), &bytes) || m->total > m->limit ||
        bytes > m->limit - m->total) {
        m->fail = KEEL_EOVERFLOW;
        return NULL;
    }
    jmem_chunk *nc = base_alloc(bytes);
    if (!nc) {
        m->fail = KEEL_ENOMEM;
        return NULL;
    }
    nc->size = size;
    nc->used = need;
    m->total += bytes;
    if (c && need == size && c->size - c->used > JMEM_CHUNK / 8) {
        /* a dedicated chunk goes behind the current one, which keeps its room */
        nc->next = c->next;
        c->next = nc;
    } else {
        nc->next = c;
        m->head = nc;
    }
    return nc + 1;
}

void *jmem_zalloc(jmem *m, size_t n)
{
    void *p = jmem_alloc(m, n);
    if (p) memset(p, 0, n);
    return p;
}

void *jmem_alloc_n(jmem *m, size_t n, size_t size)
{
    size_t b;
    if (!size_mul(n, size, &b)) {
        m->fail = KEEL_EOVERFLOW;
        return NULL;
    }
    return jmem_alloc(m, b);
}

void jmem_free_all(jmem *m)
{
    jmem_chunk *c = m->head;
    while (c) {
        jmem_chunk *nx = c->next;
        base_free(c, c->size + sizeof(jmem_chunk));
        c = nx;
    }
    m->head = NULL;
    m->total = 0;
}

/* ---- UTF-8 ---------------------------------------------------------------- */

uint32_t utf8_next(const char *s, size_t n, size_t *i)
{
    const uint8_t *p = (const uint8_t *)s;
    size_t k = *i;
    uint32_t c = p[k];
    if (c < 0x80 || k + 1 >= n) {
        *i = k + 1;
        return c;
    }
    if (c < 0xE0) {
        *i = k + 2;
        return ((c & 0x1F) << 6) | (p[k + 1] & 0x3F);
    }
    if (c < 0xF0) {
        if (k + 2 >= n) {
            *i = n;
            return 0xFFFD;
        }
        *i = k + 3;
        return ((c & 0x0F) << 12) | ((uint32_t)(p[k + 1] & 0x3F) << 6) | (p[k + 2] & 0x3F);
    }
    if (k + 3 >= n) {
        *i = n;
        return 0xFFFD;
    }
    *i = k + 4;
    return ((c & 0x07) << 18) | ((uint32_t)(p[k + 1] & 0x3F) << 12) |
           ((uint32_t)(p[k + 2] & 0x3F) << 6) | (p[k + 3] & 0x3F);
}

int utf8_encode(uint32_t cp, char out[4])
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp >= 0xD800 && cp < 0xE000) cp = 0xFFFD;
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    if (cp > 0x10FFFF) cp = 0xFFFD;
    if (cp == 0xFFFD) return utf8_encode(cp, out);
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

size_t utf8_check(const char *s, size_t n)
{
    const uint8_t *p = (const uint8_t *)s;
    size_t i = 0;
    while (i < n) {
        uint8_t c = p[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t k;
        uint32_t cp, min;
        if ((c & 0xE0) == 0xC0) {
            k = 1, cp = c & 0x1F, min = 0x80;
        } else if ((c & 0xF0) == 0xE0) {
            k = 2, cp = c & 0x0F, min = 0x800;
        } else if ((c & 0xF8) == 0xF0) {
            k = 3, cp = c & 0x07, min = 0x10000;
        } else {
            return i;
        }
        if (n - i <= k) return i;
        for (size_t j = 1; j <= k; j++) {
            if ((p[i + j] & 0xC0) != 0x80) return i;
            cp = (cp << 6) | (p[i + j] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000)) return i;
        i += k + 1;
    }
    return n;
}

bool utf8_valid(const char *s, size_t n)
{
    return utf8_check(s, n) == n;
}

size_t utf8_offset(const jstr *s, size_t cp)
{
    if (s->ascii) return cp < s->n ? cp : s->n;
    size_t i = 0, k = 0;
    while (i < s->n && k < cp) {
        utf8_next(s->s, s->n, &i);
        k++;
    }
    return i;
}

bool py_isspace(uint32_t c)
{
    if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F);
    return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* ---- strings -------------------------------------------------------------- */

jstr jstr_empty_ = {"", 0, true};

static bool bytes_ascii(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80) return false;
    return true;
}

jstr *jstr_new(jmem *m, const char *s, size_t n)
{
    if (n == 0) return JSTR_EMPTY;
    size_t bytes;
    if (!size_add(sizeof(jstr) + 1, n, &bytes)) {
        m->fail = KEEL_EOVERFLOW;
        return NULL;
    }
    jstr *r = jmem_alloc(m, bytes);
    if (!r) return NULL;
    char *d = (char *)(r + 1);
    memcpy(d, s, n);
    d[n] = 0;
    r->s = d;
    r->n = n;
    r->ascii = bytes_ascii(s, n);
    return r;
}

jstr *jstr_cat(jmem *m, const jstr *a, const jstr *b)
{
    if (a->n == 0) return (jstr *)b;
    if (b->n == 0) return (jstr *)a;
    size_t n, bytes;
    if (!size_add(a->n, b->n, &n) || !size_add(sizeof(jstr) + 1, n, &bytes)) {
        m->fail = KEEL_EOVERFLOW;
        return NULL;
    }
    jstr *r = jmem_alloc(m, bytes);
    if (!r) return NULL;
    char *d = (char *)(r + 1);
    memcpy(d, a->s, a->n);
    memcpy(d + a->n, b->s, b->n);
    d[n] = 0;
    r->s = d;
    r->n = n;
    r->ascii = a->ascii && b->ascii;
    return r;
}

bool jstr_eq(const jstr *a, const jstr *b)
{
    return a == b || (a->n == b->n && memcmp(a->s, b->s, a->n) == 0);
}

bool jstr_eqc(const jstr *a, const char *c)
{
    size_t n = strlen(c);
    return a->n == n && memcmp(a->s, c, n) == 0;
}

int jstr_cmp(const jstr *a, const jstr *b)
{
    size_t n = BASE_MIN(a->n, b->n);
    int r = n ? memcmp(a->s, b->s, n) : 0;
    if (r) return r < 0 ? -1 : 1;
    return a->n < b->n ? -1 : a->n > b->n ? 1 : 0;
}

size_t jstr_len_cp(const jstr *s)
{
    if (s->ascii) return s->n;
    size_t k = 0;
    for (size_t i = 0; i < s->n; i++)
        if (((unsigned char)s->s[i] & 0xC0) != 0x80) k++;
    return k;
}

uint64_t jstr_hash(const char *s, size_t n)
{
    return base_hash64(s, n, 0x6a696e6a61ULL);
}

/* ---- string builder -------------------------------------------------------- */

void jsb_init(jsb *b, jmem *m, size_t max)
{
    memset(b, 0, sizeof *b);
    b->m = m;
    b->max = max;
    b->ascii = true;
}

static bool jsb_grow(jsb *b, size_t add)
{
    size_t need;
    if (!size_add(b->n, add, &need) || need > b->max) {
        b->over = true;
        return false;
    }
    if (need <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 48;
    while (cap < need) cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    if (cap > b->max) cap = b->max;
    char *d = jmem_alloc(b->m, cap + 1);
    if (!d) {
        b->oom = true;
        return false;
    }
    if (b->n) memcpy(d, b->d, b->n);
    b->d = d;
    b->cap = cap;
    return true;
}

bool jsb_add(jsb *b, const char *s, size_t n)
{
    if (n == 0) return true;
    if (!jsb_grow(b, n)) return false;
    memcpy(b->d + b->n, s, n);
    b->n += n;
    if (b->ascii) b->ascii = bytes_ascii(s, n);
    return true;
}

bool jsb_addc(jsb *b, char c)
{
    return jsb_add(b, &c, 1);
}

bool jsb_adds(jsb *b, const char *s)
{
    return jsb_add(b, s, strlen(s));
}

bool jsb_addf(jsb *b, const char *fmt, ...)
{
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k < 0) return false;
    if ((size_t)k < sizeof tmp) return jsb_add(b, tmp, (size_t)k);
    /* longer (a float printed with %f): format straight into the buffer */
    if (!jsb_grow(b, (size_t)k + 1)) return false;
    va_start(ap, fmt);
    vsnprintf(b->d + b->n, (size_t)k + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)k;
    return true;
}

bool jsb_addcp(jsb *b, uint32_t cp)
{
    char u[4];
    int k = utf8_encode(cp, u);
    return jsb_add(b, u, (size_t)k);
}

jstr *jsb_done(jsb *b)
{
    if (b->n == 0) return JSTR_EMPTY;
    jstr *r = jmem_alloc(b->m, sizeof(jstr));
    if (!r) {
        b->oom = true;
        return NULL;
    }
    b->d[b->n] = 0;
    r->s = b->d;
    r->n = b->n;
    r->ascii = b->ascii;
    b->d = NULL;
    b->n = b->cap = 0;
    b->ascii = true;
    return r;
}

/* ---- lists and dicts ------------------------------------------------------- */

jlist *jlist_new(jmem *m, size_t cap, uint8_t kind)
{
    jlist *l = jmem_zalloc(m, sizeof *l);
    if (!l) return NULL;
    l->kind = kind;
    if (cap) {
        l->v = jmem_alloc_n(m, cap, sizeof(jv));
        if (!l->v) return NULL;
        l->cap = cap;
    }
    return l;
}

static bool jlist_reserve(jmem *m, jlist *l, size_t need)
{
    if (need <= l->cap) return true;
    size_t cap = l->cap ? l->cap * 2 : 4;
    if (cap < need) cap = need;
    jv *v = jmem_alloc_n(m, cap, sizeof(jv));
    if (!v) return false;
    if (l->n) memcpy(v, l->v, l->n * sizeof(jv));
    l->v = v;
    l->cap = cap;
    return true;
}

bool jlist_push(jmem *m, jlist *l, jv v)
{
    if (!jlist_reserve(m, l, l->n + 1)) return false;
    l->v[l->n++] = v;
    return true;
}

bool jlist_insert(jmem *m, jlist *l, size_t at, jv v)
{
    if (at > l->n) at = l->n;
    if (!jlist_reserve(m, l, l->n + 1)) return false;
    memmove(l->v + at + 1, l->v + at, (l->n - at) * sizeof(jv));
    l->v[at] = v;
    l->n++;
    return true;
}

jdict *jdict_new(jmem *m, size_t cap)
{
    jdict *d = jmem_zalloc(m, sizeof *d);
    if (!d) return NULL;
    if (cap) {
        d->k = jmem_alloc_n(m, cap, sizeof(jv));
        d->v = jmem_alloc_n(m, cap, sizeof(jv));
        if (!d->k || !d->v) return NULL;
        d->cap = cap;
    }
    return d;
}

/* Numbers hash by value so that 1, 1.0 and True are one key (as in Python). */
bool jv_hash(jv v, uint64_t *h, int depth)
{
    switch (v.t) {
    case JT_NONE:
        *h = 0x9e3779b97f4a7c15ULL;
        return true;
    case JT_BOOL:
        *h = (uint64_t)v.u.b * 0x9e3779b97f4a7c15ULL + 1;
        return true;
    case JT_INT:
        *h = (uint64_t)v.u.i * 0x9e3779b97f4a7c15ULL + 1;
        return true;
    case JT_FLOAT: {
        double f = v.u.f;
        if (f == floor(f) && fabs(f) < 9.2e18) {
            *h = (uint64_t)(int64_t)f * 0x9e3779b97f4a7c15ULL + 1;
            return true;
        }
        uint64_t bits;
        memcpy(&bits, &f, 8);
        *h = base_hash64(&bits, 8, 7);
        return true;
    }
    case JT_STR:
        *h = jstr_hash(v.u.s->s, v.u.s->n);
        return true;
    case JT_LIST:
        if (v.u.l->kind != JL_TUPLE || depth > JV_MAX_DEPTH) return false;
        *h = 0x345678;
        for (size_t i = 0; i < v.u.l->n; i++) {
            uint64_t e;
            if (!jv_hash(v.u.l->v[i], &e, depth + 1)) return false;
            *h = (*h ^ e) * 1000003ULL;
        }
        return true;
    case JT_UNDEF:
        *h = 0x1234;
        return true;
    default:
        *h = (uint64_t)(uintptr_t)v.u.p * 0x9e3779b97f4a7c15ULL;
        return true;
    }
}

/* == between hashable keys (no errors possible). */
static bool key_eq(jv a, jv b, int depth)
{
    double x, y;
    if (jv_as_num(a, &x) && jv_as_num(b, &y)) {
        if (a.t != JT_FLOAT && b.t != JT_FLOAT) {
            int64_t i, j;
            jv_as_int(a, &i);
            jv_as_int(b, &j);
            return i == j;
        }
        return x == y;
    }
    if (a.t != b.t) return false;
    switch (a.t) {
    case JT_NONE:
    case JT_UNDEF:
        return true;
    case JT_STR:
        return jstr_eq(a.u.s, b.u.s);
    case JT_LIST:
        if (a.u.l->kind != b.u.l->kind || a.u.l->n != b.u.l->n || depth > JV_MAX_DEPTH)
            return a.u.l == b.u.l;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!key_eq(a.u.l->v[i], b.u.l->v[i], depth + 1)) return false;
        return true;
    default:
        return a.u.p == b.u.p;
    }
}

static bool jdict_reindex(jmem *m, jdict *d, size_t want)
{
    size_t cap = 16;
    while (cap < want * 2 + 2) cap *= 2;
    uint32_t *idx = jmem_zalloc(m, cap * sizeof(uint32_t));
    if (!idx) return false;
    for (size_t i = 0; i < d->n; i++) {
        uint64_t h;
        jv_hash(d->k[i], &h, 0);
        size_t p = (size_t)h & (cap - 1);
        while (idx[p]) p = (p + 1) & (cap - 1);
        idx[p] = (uint32_t)(i + 1);
    }
    d->idx = idx;
    d->idx_cap = cap;
    return true;
}

int64_t jdict_find(const jdict *d, jv key)
{
    if (!d->idx) {
        for (size_t i = 0; i < d->n; i++)
            if (key_eq(d->k[i], key, 0)) return (int64_t)i;
        return -1;
    }
    uint64_t h;
    if (!jv_hash(key, &h, 0)) return -1;
    size_t p = (size_t)h & (d->idx_cap - 1);
    while (d->idx[p]) {
        size_t i = d->idx[p] - 1;
        if (key_eq(d->k[i], key, 0)) return (int64_t)i;
        p = (p + 1) & (d->idx_cap - 1);
    }
    return -1;
}

int64_t jdict_find_str(const jdict *d, const char *s, size_t n)
{
    jstr tmp = {s, n, false};
    return jdict_find(d, jv_strv(&tmp));
}

bool jdict_set(jmem *m, jdict *d, jv key, jv val)
{
    int64_t i = jdict_find(d, key);
    if (i >= 0) {
        d->v[i] = val;
        return true;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 4;
        jv *k = jmem_alloc_n(m, cap, sizeof(jv)), *v = jmem_alloc_n(m, cap, sizeof(jv));
        if (!k || !v) return false;
        if (d->n) {
            memcpy(k, d->k, d->n * sizeof(jv));
            memcpy(v, d->v, d->n * sizeof(jv));
        }
        d->k = k;
        d->v = v;
        d->cap = cap;
    }
    d->k[d->n] = key;
    d->v[d->n] = val;
    d->n++;
    if (d->n > 8 && (!d->idx || d->idx_cap < d->n * 2 + 2)) return jdict_reindex(m, d, d->n);
    if (d->idx) {
        uint64_t h;
        jv_hash(key, &h, 0);
        size_t p = (size_t)h & (d->idx_cap - 1);
        while (d->idx[p]) p = (p + 1) & (d->idx_cap - 1);
        d->idx[p] = (uint32_t)d->n;
    }
    return true;
}

bool jdict_remove(jmem *m, jdict *d, size_t i)
{
    if (i >= d->n) return true;
    memmove(d->k + i, d->k + i + 1, (d->n - i - 1) * sizeof(jv));
    memmove(d->v + i, d->v + i + 1, (d->n - i - 1) * sizeof(jv));
    d->n--;
    if (d->idx) {
        d->idx = NULL;
        if (d->n > 8) return jdict_reindex(m, d, d->n);
    }
    return true;
}

/* ---- basic predicates ------------------------------------------------------ */

bool jv_as_int(jv v, int64_t *out)
{
    if (v.t == JT_INT) {
        *out = v.u.i;
        return true;
    }
    if (v.t == JT_BOOL) {
        *out = v.u.b;
        return true;
    }
    return false;
}

bool jv_as_num(jv v, double *out)
{
    switch (v.t) {
    case JT_INT:
        *out = (double)v.u.i;
        return true;
    case JT_BOOL:
        *out = v.u.b;
        return true;
    case JT_FLOAT:
        *out = v.u.f;
        return true;
    default:
        return false;
    }
}

bool jv_truthy(jv v)
{
    switch (v.t) {
    case JT_UNDEF:
    case JT_NONE:
        return false;
    case JT_BOOL:
        return v.u.b;
    case JT_INT:
        return v.u.i != 0;
    case JT_FLOAT:
        return v.u.f != 0.0;
    case JT_STR:
        return v.u.s->n != 0;
    case JT_LIST:
        if (v.u.l->kind == JL_GEN || v.u.l->kind == JL_REVITER) return true;
        return v.u.l->n != 0;
    case JT_DICT:
        return v.u.d->n != 0;
    default:
        return true;
    }
}

const char *jv_type_name(jv v)
{
    switch (v.t) {
    case JT_UNDEF: return "Undefined";
    case JT_NONE: return "NoneType";
    case JT_BOOL: return "bool";
    case JT_INT: return "int";
    case JT_FLOAT: return "float";
    case JT_STR: return "str";
    case JT_LIST:
        switch (v.u.l->kind) {
        case JL_TUPLE: return "tuple";
        case JL_RANGE: return "range";
        case JL_ITEMS: return "dict_items";
        case JL_KEYS: return "dict_keys";
        case JL_VALUES: return "dict_values";
        case JL_GEN: return "generator";
        case JL_REVITER: return "list_reverseiterator";
        default: return "list";
        }
    case JT_DICT: return "dict";
    case JT_NS: return "Namespace";
    case JT_MACRO: return "Macro";
    case JT_FUNC: return "builtin_function_or_method";
    case JT_LOOP: return "LoopContext";
    case JT_CYCLER: return "Cycler";
    case JT_JOINER: return "Joiner";
    }
    return "object";
}

/* ---- errors and undefined -------------------------------------------------- */

keel_status jx_fail(jx *x, keel_status st, const char *fmt, ...)
{
    if (x->err) {
        int k = snprintf(x->err, JINJA_ERR_CAP, "template line %u: ", x->line);
        if (k < 0) k = 0;
        if ((size_t)k < JINJA_ERR_CAP) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(x->err + k, JINJA_ERR_CAP - (size_t)k, fmt, ap);
            va_end(ap);
        }
    }
    return st;
}

keel_status jx_oom(jx *x)
{
    if (x->mem.fail == KEEL_EOVERFLOW)
        return jx_fail(x, KEEL_EOVERFLOW, "the template used more than %zu bytes of memory",
                       x->lim.max_memory);
    return jx_fail(x, KEEL_ENOMEM, "out of memory");
}

keel_status jx_step(jx *x)
{
    if (++x->steps > x->lim.max_steps)
        return jx_fail(x, KEEL_EOVERFLOW, "the template ran more than %lld steps (loop iterations, "
                                          "calls, items)",
                       (long long)x->lim.max_steps);
    return KEEL_OK;
}

static jundef *undef_new(jx *x, uint8_t kind)
{
    jundef *u = jmem_zalloc(&x->mem, sizeof *u);
    if (u) u->kind = kind;
    return u;
}

jv jv_undef_attr(jx *x, jv obj, jv key, bool item)
{
    (void)item;
    jv v = jv_undef();
    jundef *u = undef_new(x, key.t == JT_STR ? JU_ATTR : JU_ITEM);
    if (u) {
        u->obj_t = obj.t;
        u->key = key;
        if (obj.t == JT_LIST) u->hint = jv_type_name(obj); /* list / tuple / range */
    }
    v.u.u = u;
    return v;
}

jv jv_undef_hint(jx *x, const char *hint)
{
    jv v = jv_undef();
    jundef *u = undef_new(x, JU_HINT);
    if (u) u->hint = hint;
    v.u.u = u;
    return v;
}

jv jv_undef_name(jx *x, const jstr *name)
{
    jv v = jv_undef();
    jundef *u = undef_new(x, JU_NAME);
    if (u) u->key = jv_strv((jstr *)name);
    v.u.u = u;
    return v;
}

/* Python's repr of a short value into a fixed buffer (messages). */
static void repr_small(jv v, char *buf, size_t cap)
{
    if (v.t == JT_STR) {
        snprintf(buf, cap, "'%.*s'", (int)BASE_MIN(v.u.s->n, cap), v.u.s->s);
    } else if (v.t == JT_INT) {
        snprintf(buf, cap, "%lld", (long long)v.u.i);
    } else if (v.t == JT_BOOL) {
        snprintf(buf, cap, "%s", v.u.b ? "True" : "False");
    } else if (v.t == JT_NONE) {
        snprintf(buf, cap, "None");
    } else if (v.t == JT_FLOAT) {
        snprintf(buf, cap, "%g", v.u.f);
    } else {
        snprintf(buf, cap, "<%s>", jv_type_name(v));
    }
}

static const char *obj_type_repr(uint8_t t, const char *hint)
{
    switch (t) {
    case JT_NONE: return "None";
    case JT_DICT: return "dict object";
    case JT_STR: return "str object";
    case JT_INT: return "int object";
    case JT_FLOAT: return "float object";
    case JT_BOOL: return "bool object";
    case JT_NS: return "jinja2.utils.Namespace object";
    case JT_LOOP: return "jinja2.runtime.LoopContext object";
    case JT_MACRO: return "jinja2.runtime.Macro object";
    case JT_LIST:
        if (hint && strcmp(hint, "tuple") == 0) return "tuple object";
        if (hint && strcmp(hint, "range") == 0) return "range object";
        return "list object";
    default: return "object";
    }
}

void jv_undef_message(jv v, char *buf, size_t cap)
{
    const jundef *u = v.u.u;
    char key[160];
    if (!u) {
        snprintf(buf, cap, "undefined value");
        return;
    }
    switch (u->kind) {
    case JU_NAME:
        repr_small(u->key, key, sizeof key);
        snprintf(buf, cap, "%s is undefined", key);
        break;
    case JU_ATTR:
        repr_small(u->key, key, sizeof key);
        if (u->obj_t == JT_NONE)
            snprintf(buf, cap, "None has no attribute %s", key);
        else
            snprintf(buf, cap, "'%s' has no attribute %s", obj_type_repr(u->obj_t, u->hint), key);
        break;
    case JU_ITEM:
        repr_small(u->key, key, sizeof key);
        snprintf(buf, cap, "%s has no element %s", obj_type_repr(u->obj_t, u->hint), key);
        break;
    default:
        snprintf(buf, cap, "%s", u->hint ? u->hint : "undefined value");
        break;
    }
}

keel_status jx_undef_error(jx *x, jv v)
{
    char msg[200];
    jv_undef_message(v, msg, sizeof msg);
    return jx_fail(x, KEEL_EINVAL, "%s", msg);
}

/* ---- printing --------------------------------------------------------------- */

/* Python float repr: the shortest digits that round-trip, laid out as
 * CPython's 'r' format does (exponent form below 1e-4 and from 1e16). */
bool jsb_float(jsb *b, double f)
{
    if (isnan(f)) return jsb_adds(b, "nan");
    if (isinf(f)) return jsb_adds(b, f < 0 ? "-inf" : "inf");
    char tmp[40];
    int p;
    for (p = 1; p <= 17; p++) {
        snprintf(tmp, sizeof tmp, "%.*e", p - 1, f);
        if (strtod(tmp, NULL) == f) break;
    }
    /* tmp: [-]d[.ddd]e[+-]XX */
    char digits[24];
    int nd = 0;
    const char *q = tmp;
    bool neg = false;
    if (*q == '-') {
        neg = true;
        q++;
    }
    for (; *q && *q != 'e'; q++)
        if (*q >= '0' && *q <= '9' && nd < 20) digits[nd++] = *q;
    int e = *q == 'e' ? atoi(q + 1) : 0;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    char out[64];
    int k = 0;
    if (neg) out[k++] = '-';
    if (e < -4 || e >= 16) {
        out[k++] = digits[0];
        if (nd > 1) {
            out[k++] = '.';
            for (int i = 1; i < nd; i++) out[k++] = digits[i];
        }
        k += snprintf(out + k, sizeof out - (size_t)k, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    } else {
        int decpt = e + 1;
        if (decpt <= 0) {
            out[k++] = '0';
            out[k++] = '.';
            for (int i = 0; i < -decpt; i++) out[k++] = '0';
            for (int i = 0; i < nd; i++) out[k++] = digits[i];
        } else if (decpt >= nd) {
            for (int i = 0; i < nd; i++) out[k++] = digits[i];
            for (int i = nd; i < decpt; i++) out[k++] = '0';
            out[k++] = '.';
            out[k++] = '0';
        } else {
            for (int i = 0; i < decpt; i++) out[k++] = digits[i];
            out[k++] = '.';
            for (int i = decpt; i < nd; i++) out[k++] = digits[i];
        }
    }
    return jsb_add(b, out, (size_t)k);
}

static keel_status sb_status(jx *x, const jsb *b)
{
    if (b->over)
        return jx_fail(x, KEEL_EOVERFLOW, JINJA_ERR_OUTPUT " %zu bytes", b->max);
    if (b->oom) return jx_oom(x);
    return KEEL_OK;
}

/* Python's str.isprintable for one code point. */
static bool py_isprintable(uint32_t c)
{
    if (c < 0x80) return c >= 0x20 && c < 0x7F;
    utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)c);
    switch (cat) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
        return false;
    default:
        return true;
    }
}

static bool repr_str(jsb *b, const jstr *s)
{
    bool sq = memchr(s->s, '\'', s->n) != NULL, dq = memchr(s->s, '"', s->n) != NULL;
    char quote = sq && !dq ? '"' : '\'';
    bool ok = jsb_addc(b, quote);
    size_t i = 0;
    while (ok && i < s->n) {
        size_t start = i;
        uint32_t c = utf8_next(s->s, s->n, &i);
        if (c == (uint32_t)quote || c == '\\') {
            ok = jsb_addc(b, '\\') && jsb_addc(b, (char)c);
        } else if (c == '\n') {
            ok = jsb_adds(b, "\\n");
        } else if (c == '\r') {
            ok = jsb_adds(b, "\\r");
        } else if (c == '\t') {
            ok = jsb_adds(b, "\\t");
        } else if (!py_isprintable(c)) {
            if (c < 0x100)
                ok = jsb_addf(b, "\\x%02x", c);
            else if (c < 0x10000)
                ok = jsb_addf(b, "\\u%04x", c);
            else
                ok = jsb_addf(b, "\\U%08x", c);
        } else {
            ok = jsb_add(b, s->s + start, i - start);
        }
    }
    return ok && jsb_addc(b, quote);
}

keel_status jv_repr(jx *x, jsb *b, jv v, int depth)
{
    if (depth > JV_MAX_DEPTH || jinja_stack_used(x->stack_base) > JINJA_STACK_BUDGET)
        return jx_fail(x, KEEL_EINVAL, "value nested more than %d levels deep", JV_MAX_DEPTH);
    bool ok = true;
    switch (v.t) {
    case JT_UNDEF:
        ok = jsb_adds(b, "Undefined");
        break;
    case JT_STR:
        ok = repr_str(b, v.u.s);
        break;
    case JT_LIST: {
        const jlist *l = v.u.l;
        const char *open = "[", *close = "]";
        switch (l->kind) {
        case JL_TUPLE:
            open = "(", close = l->n == 1 ? ",)" : ")";
            break;
        case JL_RANGE:
            if (l->r2 == 1)
                ok = jsb_addf(b, "range(%lld, %lld)", (long long)l->r0, (long long)l->r1);
            else
                ok = jsb_addf(b, "range(%lld, %lld, %lld)", (long long)l->r0, (long long)l->r1,
                              (long long)l->r2);
            return ok ? KEEL_OK : sb_status(x, b);
        case JL_ITEMS:
            open = "dict_items([", close = "])";
            break;
        case JL_KEYS:
            open = "dict_keys([", close = "])";
            break;
        case JL_VALUES:
            open = "dict_values([", close = "])";
            break;
        case JL_GEN:
        case JL_REVITER:
            /* printed as the list of what is left, without consuming it, as
             * llama.cpp prints these filters' results (its filters return
             * lists); Python's "<generator object ... at 0x...>" holds an
             * address no template can depend on */
            break;
        default:
            break;
        }
        ok = jsb_adds(b, open);
        for (size_t i = 0; ok && i < l->n; i++) {
            if (i) ok = jsb_adds(b, ", ");
            TRY(jv_repr(x, b, l->v[i], depth + 1));
        }
        if (ok) ok = jsb_adds(b, close);
        break;
    }
    case JT_DICT:
    case JT_NS: {
        const jdict *d = v.u.d;
        if (v.t == JT_NS) ok = jsb_adds(b, "<Namespace ");
        if (ok) ok = jsb_addc(b, '{');
        for (size_t i = 0; ok && i < d->n; i++) {
            if (i) ok = jsb_adds(b, ", ");
            TRY(jv_repr(x, b, d->k[i], depth + 1));
            ok = jsb_adds(b, ": ");
            TRY(jv_repr(x, b, d->v[i], depth + 1));
        }
        if (ok) ok = jsb_addc(b, '}');
        if (ok && v.t == JT_NS) ok = jsb_addc(b, '>');
        break;
    }
    default:
        return jv_str(x, b, v);
    }
    return ok ? KEEL_OK : sb_status(x, b);
}

keel_status jv_str(jx *x, jsb *b, jv v)
{
    bool ok = true;
    switch (v.t) {
    case JT_UNDEF:
        break;
    case JT_NONE:
        ok = jsb_adds(b, "None");
        break;
    case JT_BOOL:
        ok = jsb_adds(b, v.u.b ? "True" : "False");
        break;
    case JT_INT:
        ok = jsb_addf(b, "%lld", (long long)v.u.i);
        break;
    case JT_FLOAT:
        ok = jsb_float(b, v.u.f);
        break;
    case JT_STR:
        ok = jsb_add(b, v.u.s->s, v.u.s->n);
        break;
    case JT_LIST:
    case JT_DICT:
    case JT_NS:
        return jv_repr(x, b, v, 0);
    case JT_MACRO:
        ok = jsb_addf(b, "<Macro '%.*s'>", v.u.m->def->name ? (int)v.u.m->def->name->n : 6,
                      v.u.m->def->name ? v.u.m->def->name->s : "caller");
        break;
    case JT_FUNC:
        ok = jsb_addf(b, "<built-in method %s>", jinja_builtin_name((jfn)v.fn));
        break;
    case JT_LOOP:
        ok = jsb_addf(b, "<LoopContext %zu/%zu>", v.u.loop->i + 1, v.u.loop->n);
        break;
    case JT_CYCLER:
        ok = jsb_adds(b, "<jinja2.utils.Cycler object>");
        break;
    case JT_JOINER:
        ok = jsb_adds(b, "<jinja2.utils.Joiner object>");
        break;
    }
    return ok ? KEEL_OK : sb_status(x, b);
}

keel_status jv_to_str(jx *x, jv v, jstr **out)
{
    if (v.t == JT_STR) {
        *out = v.u.s;
        return KEEL_OK;
    }
    if (v.t == JT_UNDEF) {
        *out = JSTR_EMPTY;
        return KEEL_OK;
    }
    jsb b;
    jsb_init(&b, &x->mem, x->lim.max_output);
    TRY(jv_str(x, &b, v));
    *out = jsb_done(&b);
    return *out ? KEEL_OK : jx_oom(x);
}

keel_status jv_html_escape(jx *x, const jstr *s, jv *out)
{
    jsb b;
    jsb_init(&b, &x->mem, x->lim.max_output);
    for (size_t i = 0; i < s->n; i++) {
        char c = s->s[i];
        switch (c) {
        case '&': jsb_adds(&b, "&amp;"); break;
        case '<': jsb_adds(&b, "&lt;"); break;
        case '>': jsb_adds(&b, "&gt;"); break;
        case '"': jsb_adds(&b, "&#34;"); break;
        case '\'': jsb_adds(&b, "&#39;"); break;
        default: jsb_addc(&b, c); break;
        }
    }
    if (b.over || b.oom) return sb_status(x, &b);
    jstr *r = jsb_done(&b);
    if (!r) return jx_oom(x);
    *out = jv_strv(r);
    out->safe = 1;
    return KEEL_OK;
}

/* ---- json.dumps ------------------------------------------------------------- */

static bool json_str(jsb *b, const char *s, size_t n, bool ascii)
{
    bool ok = jsb_addc(b, '"');
    size_t i = 0;
    while (ok && i < n) {
        size_t start = i;
        uint32_t c = utf8_next(s, n, &i);
        switch (c) {
        case '"': ok = jsb_adds(b, "\\\""); break;
        case '\\': ok = jsb_adds(b, "\\\\"); break;
        case '\n': ok = jsb_adds(b, "\\n"); break;
        case '\r': ok = jsb_adds(b, "\\r"); break;
        case '\t': ok = jsb_adds(b, "\\t"); break;
        case '\b': ok = jsb_adds(b, "\\b"); break;
        case '\f': ok = jsb_adds(b, "\\f"); break;
        default:
            if (c < 0x20 || (ascii && c >= 0x7F)) {
                if (c >= 0x10000) {
                    uint32_t v = c - 0x10000;
                    ok = jsb_addf(b, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
                } else {
                    ok = jsb_addf(b, "\\u%04x", c);
                }
            } else {
                ok = jsb_add(b, s + start, i - start);
            }
        }
    }
    return ok && jsb_addc(b, '"');
}

static bool json_float(jsb *b, double f)
{
    if (isnan(f)) return jsb_adds(b, "NaN");
    if (isinf(f)) return jsb_adds(b, f < 0 ? "-Infinity" : "Infinity");
    return jsb_float(b, f);
}

static bool json_newline(jsb *b, const jjson_opts *o, int level)
{
    bool ok = jsb_addc(b, '\n');
    for (int i = 0; ok && i < level; i++) ok = jsb_add(b, o->indent, o->indent_n);
    return ok;
}

/* A dict key as json.dumps converts it. */
static keel_status json_key(jx *x, jsb *b, jv k, const jjson_opts *o)
{
    bool ok;
    switch (k.t) {
    case JT_STR:
        ok = json_str(b, k.u.s->s, k.u.s->n, o->ensure_ascii);
        break;
    case JT_INT:
        ok = jsb_addf(b, "\"%lld\"", (long long)k.u.i);
        break;
    case JT_BOOL:
        ok = jsb_adds(b, k.u.b ? "\"true\"" : "\"false\"");
        break;
    case JT_NONE:
        ok = jsb_adds(b, "\"null\"");
        break;
    case JT_FLOAT:
        ok = jsb_addc(b, '"') && json_float(b, k.u.f) && jsb_addc(b, '"');
        break;
    default:
        return jx_fail(x, KEEL_EINVAL, "keys must be str, int, float, bool or None, not %s",
                       jv_type_name(k));
    }
    return ok ? KEEL_OK : sb_status(x, b);
}

/* Stable insertion sort of entry indices by key (sort_keys). */
static keel_status sort_idx_by_key(jx *x, const jdict *d, size_t *ix)
{
    for (size_t i = 0; i < d->n; i++) ix[i] = i;
    for (size_t i = 1; i < d->n; i++) {
        size_t t = ix[i], j = i;
        while (j > 0) {
            int c;
            TRY(jv_cmp(x, d->k[t], d->k[ix[j - 1]], &c));
            if (c >= 0) break;
            ix[j] = ix[j - 1];
            j--;
        }
        ix[j] = t;
    }
    return KEEL_OK;
}

static keel_status tojson_rec(jx *x, jsb *b, jv v, const jjson_opts *o, int depth)
{
    if (depth > JV_MAX_DEPTH || jinja_stack_used(x->stack_base) > JINJA_STACK_BUDGET)
        return jx_fail(x, KEEL_EINVAL, "tojson: value nested more than %d levels deep",
                       JV_MAX_DEPTH);
    bool ok = true;
    switch (v.t) {
    case JT_NONE:
        ok = jsb_adds(b, "null");
        break;
    case JT_BOOL:
        ok = jsb_adds(b, v.u.b ? "true" : "false");
        break;
    case JT_INT:
        ok = jsb_addf(b, "%lld", (long long)v.u.i);
        break;
    case JT_FLOAT:
        ok = json_float(b, v.u.f);
        break;
    case JT_STR:
        ok = json_str(b, v.u.s->s, v.u.s->n, o->ensure_ascii);
        break;
    case JT_LIST: {
        const jlist *l = v.u.l;
        /* A generator (map, select, reject, ..., reverse) is serialized as
         * the list of what is left, without consuming it. Python's json.dumps
         * refuses one; llama.cpp, whose filters return lists, writes the
         * list, and templates in its tree depend on it (DeepSeek R1's
         * `tools | map(attribute='function') | tojson`). */
        if (l->kind != JL_LIST && l->kind != JL_TUPLE && l->kind != JL_GEN && l->kind != JL_REVITER)
            return jx_fail(x, KEEL_EINVAL, "Object of type %s is not JSON serializable",
                           jv_type_name(v));
        if (l->n == 0) {
            ok = jsb_adds(b, "[]");
            break;
        }
        ok = jsb_addc(b, '[');
        for (size_t i = 0; ok && i < l->n; i++) {
            if (i) ok = jsb_add(b, o->item_sep, o->item_sep_n);
            if (ok && o->indent_set) ok = json_newline(b, o, depth + 1);
            if (ok) TRY(tojson_rec(x, b, l->v[i], o, depth + 1));
        }
        if (ok && o->indent_set) ok = json_newline(b, o, depth);
        if (ok) ok = jsb_addc(b, ']');
        break;
    }
    case JT_DICT: {
        const jdict *d = v.u.d;
        if (d->n == 0) {
            ok = jsb_adds(b, "{}");
            break;
        }
        size_t *ix = NULL;
        if (o->sort_keys) {
            ix = jmem_alloc_n(&x->mem, d->n, sizeof(size_t));
            if (!ix) return jx_oom(x);
            TRY(sort_idx_by_key(x, d, ix));
        }
        ok = jsb_addc(b, '{');
        for (size_t j = 0; ok && j < d->n; j++) {
            size_t i = ix ? ix[j] : j;
            if (j) ok = jsb_add(b, o->item_sep, o->item_sep_n);
            if (ok && o->indent_set) ok = json_newline(b, o, depth + 1);
            if (!ok) break;
            TRY(json_key(x, b, d->k[i], o));
            ok = jsb_add(b, o->key_sep, o->key_sep_n);
            if (ok) TRY(tojson_rec(x, b, d->v[i], o, depth + 1));
        }
        if (ok && o->indent_set) ok = json_newline(b, o, depth);
        if (ok) ok = jsb_addc(b, '}');
        break;
    }
    default:
        return jx_fail(x, KEEL_EINVAL, "Object of type %s is not JSON serializable",
                       jv_type_name(v));
    }
    return ok ? KEEL_OK : sb_status(x, b);
}

keel_status jv_tojson(jx *x, jsb *b, jv v, const jjson_opts *o)
{
    return tojson_rec(x, b, v, o, 0);
}

/* ---- JSON reader ------------------------------------------------------------ */

#define JSON_MAX_DEPTH 128

typedef struct jread {
    const char *s;
    size_t n, i;
    jmem *m;
    char *err;
} jread;

static keel_status jr_fail(jread *r, const char *what)
{
    /* line and column of the offending byte */
    size_t line = 1, col = 1;
    for (size_t k = 0; k < r->i && k < r->n; k++) {
        if (r->s[k] == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    return base_err(r->err, KEEL_EFORMAT, "JSON line %zu column %zu: %s", line, col, what);
}

static void jr_ws(jread *r)
{
    while (r->i < r->n) {
        char c = r->s[r->i];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        r->i++;
    }
}

static int hexv(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static bool jr_hex4(jread *r, uint32_t *out)
{
    if (r->n - r->i < 4) return false;
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
        int h = hexv(r->s[r->i + (size_t)k]);
        if (h < 0) return false;
        v = v * 16 + (uint32_t)h;
    }
    r->i += 4;
    *out = v;
    return true;
}

static keel_status jr_string(jread *r, jstr **out)
{
    r->i++; /* opening quote */
    size_t start = r->i;
    /* fast path: no escapes */
    while (r->i < r->n && r->s[r->i] != '"' && r->s[r->i] != '\\' &&
           (unsigned char)r->s[r->i] >= 0x20)
        r->i++;
    if (r->i < r->n && r->s[r->i] == '"') {
        if (!utf8_valid(r->s + start, r->i - start)) return jr_fail(r, "invalid UTF-8 in a string");
        *out = jstr_new(r->m, r->s + start, r->i - start);
        r->i++;
        return *out ? KEEL_OK : r->m->fail;
    }
    jsb b;
    jsb_init(&b, r->m, SIZE_MAX / 2);
    if (!utf8_valid(r->s + start, r->i - start)) return jr_fail(r, "invalid UTF-8 in a string");
    jsb_add(&b, r->s + start, r->i - start);
    for (;;) {
        if (r->i >= r->n) return jr_fail(r, "unterminated string");
        unsigned char c = (unsigned char)r->s[r->i];
        if (c == '"') {
            r->i++;
            break;
        }
        if (c < 0x20) return jr_fail(r, "control character in a string");
        if (c != '\\') {
            size_t s0 = r->i;
            while (r->i < r->n && r->s[r->i] != '"' && r->s[r->i] != '\\' &&
                   (unsigned char)r->s[r->i] >= 0x20)
                r->i++;
            if (!utf8_valid(r->s + s0, r->i - s0)) return jr_fail(r, "invalid UTF-8 in a string");
            jsb_add(&b, r->s + s0, r->i - s0);
            continue;
        }
        r->i++;
        if (r->i >= r->n) return jr_fail(r, "unterminated string");
        char e = r->s[r->i++];
        uint32_t cp;
        switch (e) {
        case '"': jsb_addc(&b, '"'); break;
        case '\\': jsb_addc(&b, '\\'); break;
        case '/': jsb_addc(&b, '/'); break;
        case 'b': jsb_addc(&b, '\b'); break;
        case 'f': jsb_addc(&b, '\f'); break;
        case 'n': jsb_addc(&b, '\n'); break;
        case 'r': jsb_addc(&b, '\r'); break;
        case 't': jsb_addc(&b, '\t'); break;
        case 'u':
            if (!jr_hex4(r, &cp)) return jr_fail(r, "bad \\u escape");
            if (cp >= 0xD800 && cp < 0xDC00 && r->n - r->i >= 6 && r->s[r->i] == '\\' &&
                r->s[r->i + 1] == 'u') {
                size_t save = r->i;
                uint32_t lo;
                r->i += 2;
                if (jr_hex4(r, &lo) && lo >= 0xDC00 && lo < 0xE000)
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                else
                    r->i = save;
            }
            jsb_addcp(&b, cp); /* a lone surrogate becomes U+FFFD */
            break;
        default:
            return jr_fail(r, "bad escape in a string");
        }
        if (b.oom) return r->m->fail;
    }
    if (b.oom) return r->m->fail;
    *out = jsb_done(&b);
    return *out ? KEEL_OK : r->m->fail;
}

static keel_status jr_number(jread *r, jv *out)
{
    size_t s0 = r->i;
    bool is_float = false;
    if (r->s[r->i] == '-') r->i++;
    if (r->i >= r->n || r->s[r->i] < '0' || r->s[r->i] > '9') return jr_fail(r, "bad number");
    if (r->s[r->i] == '0') {
        r->i++;
    } else {
        while (r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '9') r->i++;
    }
    if (r->i < r->n && r->s[r->i] == '.') {
        is_float = true;
        r->i++;
        if (r->i >= r->n || r->s[r->i] < '0' || r->s[r->i] > '9') return jr_fail(r, "bad number");
        while (r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '9') r->i++;
    }
    if (r->i < r->n && (r->s[r->i] == 'e' || r->s[r->i] == 'E')) {
        is_float = true;
        r->i++;
        if (r->i < r->n && (r->s[r->i] == '+' || r->s[r->i] == '-')) r->i++;
        if (r->i >= r->n || r->s[r->i] < '0' || r->s[r->i] > '9') return jr_fail(r, "bad number");
        while (r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '9') r->i++;
    }
    size_t len = r->i - s0;
    if (len > 400) return jr_fail(r, "number too long");
    char tmp[408];
    memcpy(tmp, r->s + s0, len);
    tmp[len] = 0;
    if (!is_float) {
        char *end;
        errno = 0;
        long long v = strtoll(tmp, &end, 10);
        if (errno == 0) {
            *out = jv_int(v);
            return KEEL_OK;
        }
        /* beyond int64: a float (Python would keep the exact integer) */
    }
    *out = jv_float(strtod(tmp, NULL));
    return KEEL_OK;
}

typedef struct jr_frame {
    jv c;       /* the container */
    jv key;     /* objects: key of the value being read */
} jr_frame;

keel_status jv_from_json(jmem *m, const char *s, size_t n, jv *out, char *err)
{
    jread r = {s, n, 0, m, err};
    jr_frame stack[JSON_MAX_DEPTH];
    int sp = 0;
    jv val;
    keel_status st;
    *out = jv_none();
    for (;;) {
        /* read one value (or open a container) */
        jr_ws(&r);
        if (r.i >= r.n) return jr_fail(&r, "unexpected end of JSON");
        char c = r.s[r.i];
        if (c == '{' || c == '[') {
            if (sp >= JSON_MAX_DEPTH) return jr_fail(&r, "nested more than 128 levels");
            r.i++;
            jv cont;
            if (c == '{') {
                jdict *d = jdict_new(m, 0);
                if (!d) return m->fail;
                cont = jv_dictv(d);
            } else {
                jlist *l = jlist_new(m, 0, JL_LIST);
                if (!l) return m->fail;
                cont = jv_listv(l);
            }
            stack[sp].c = cont;
            stack[sp].key = jv_none();
            sp++;
            jr_ws(&r);
            if (r.i < r.n && r.s[r.i] == (c == '{' ? '}' : ']')) {
                r.i++;
                sp--;
                val = cont;
                goto have_value;
            }
            if (c == '{') goto read_key;
            continue;
        }
        if (c == '"') {
            jstr *str = NULL;
            if ((st = jr_string(&r, &str)) != KEEL_OK) return st;
            val = jv_strv(str);
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            if ((st = jr_number(&r, &val)) != KEEL_OK) return st;
        } else if (r.n - r.i >= 4 && memcmp(r.s + r.i, "true", 4) == 0) {
            r.i += 4;
            val = jv_bool(true);
        } else if (r.n - r.i >= 5 && memcmp(r.s + r.i, "false", 5) == 0) {
            r.i += 5;
            val = jv_bool(false);
        } else if (r.n - r.i >= 4 && memcmp(r.s + r.i, "null", 4) == 0) {
            r.i += 4;
            val = jv_none();
        } else {
            return jr_fail(&r, "unexpected character");
        }
    have_value:
        /* attach val to the container on top, then look for , or the end */
        for (;;) {
            if (sp == 0) {
                jr_ws(&r);
                if (r.i != r.n) return jr_fail(&r, "extra data after the JSON value");
                *out = val;
                return KEEL_OK;
            }
            jr_frame *f = &stack[sp - 1];
            if (f->c.t == JT_DICT) {
                if (!jdict_set(m, f->c.u.d, f->key, val)) return m->fail;
            } else {
                if (!jlist_push(m, f->c.u.l, val)) return m->fail;
            }
            jr_ws(&r);
            if (r.i >= r.n) return jr_fail(&r, "unexpected end of JSON");
            char d = r.s[r.i];
            if (d == ',') {
                r.i++;
                if (f->c.t == JT_DICT) goto read_key;
                break; /* next value */
            }
            if (d == (f->c.t == JT_DICT ? '}' : ']')) {
                r.i++;
                val = f->c;
                sp--;
                continue;
            }
            return jr_fail(&r, "expected ',' or a closing bracket");
        }
        continue;
    read_key:
        jr_ws(&r);
        if (r.i >= r.n || r.s[r.i] != '"') return jr_fail(&r, "expected a string key");
        {
            jstr *key = NULL;
            if ((st = jr_string(&r, &key)) != KEEL_OK) return st;
            stack[sp - 1].key = jv_strv(key);
        }
        jr_ws(&r);
        if (r.i >= r.n || r.s[r.i] != ':') return jr_fail(&r, "expected ':'");
        r.i++;
    }
}

/* ---- equality and ordering -------------------------------------------------- */

static keel_status eq_rec(jx *x, jv a, jv b, bool *out, int depth)
{
    if (depth > JV_MAX_DEPTH || jinja_stack_used(x->stack_base) > JINJA_STACK_BUDGET)
        return jx_fail(x, KEEL_EINVAL, "value nested more than %d levels deep", JV_MAX_DEPTH);
    double p = 0, q = 0;
    if (jv_as_num(a, &p) && jv_as_num(b, &q)) {
        if (a.t != JT_FLOAT && b.t != JT_FLOAT) {
            int64_t i, j;
            jv_as_int(a, &i);
            jv_as_int(b, &j);
            *out = i == j;
        } else {
            *out = p == q;
        }
        return KEEL_OK;
    }
    if (a.t != b.t) {
        *out = false;
        return KEEL_OK;
    }
    switch (a.t) {
    case JT_UNDEF:
    case JT_NONE:
        *out = true;
        return KEEL_OK;
    case JT_STR:
        if (a.u.s->n == b.u.s->n) TRY(jx_scan(x, a.u.s->n));
        *out = jstr_eq(a.u.s, b.u.s);
        return KEEL_OK;
    case JT_LIST: {
        const jlist *l = a.u.l, *m = b.u.l;
        bool seq = l->kind == JL_LIST || l->kind == JL_TUPLE || l->kind == JL_RANGE;
        if (l == m) {
            *out = true;
            return KEEL_OK;
        }
        if (!seq || l->kind != m->kind || l->n != m->n) {
            *out = false;
            return KEEL_OK;
        }
        if (!jv_range_fill(x, a.u.l) || !jv_range_fill(x, b.u.l)) return jx_oom(x);
        TRY(jx_steps(x, (int64_t)(l->n >> 4)));
        for (size_t i = 0; i < l->n; i++) {
            bool e;
            TRY(eq_rec(x, l->v[i], m->v[i], &e, depth + 1));
            if (!e) {
                *out = false;
                return KEEL_OK;
            }
        }
        *out = true;
        return KEEL_OK;
    }
    case JT_DICT: {
        const jdict *d = a.u.d, *e = b.u.d;
        if (d == e) {
            *out = true;
            return KEEL_OK;
        }
        if (d->n != e->n) {
            *out = false;
            return KEEL_OK;
        }
        TRY(jx_steps(x, (int64_t)(d->n >> 4)));
        for (size_t i = 0; i < d->n; i++) {
            int64_t j = jdict_find(e, d->k[i]);
            bool same = false;
            if (j >= 0) TRY(eq_rec(x, d->v[i], e->v[j], &same, depth + 1));
            if (!same) {
                *out = false;
                return KEEL_OK;
            }
        }
        *out = true;
        return KEEL_OK;
    }
    case JT_FUNC:
        *out = a.fn == b.fn && a.u.p == b.u.p;
        return KEEL_OK;
    default:
        *out = a.u.p == b.u.p;
        return KEEL_OK;
    }
}

keel_status jv_eq(jx *x, jv a, jv b, bool *out)
{
    return eq_rec(x, a, b, out, 0);
}

static const char *op_sym(int op)
{
    switch (op) {
    case JO_LT: return "<";
    case JO_LE: return "<=";
    case JO_GT: return ">";
    case JO_GE: return ">=";
    case JO_ADD: return "+";
    case JO_SUB: return "-";
    case JO_MUL: return "*";
    case JO_DIV: return "/";
    case JO_FLOORDIV: return "//";
    case JO_MOD: return "%";
    case JO_POW: return "** or pow()";
    default: return "?";
    }
}

/* c < 0, 0, > 0 for orderable a, b; TypeError otherwise. */
static keel_status cmp_rec(jx *x, int op, jv a, jv b, int *out, int depth)
{
    if (depth > JV_MAX_DEPTH || jinja_stack_used(x->stack_base) > JINJA_STACK_BUDGET)
        return jx_fail(x, KEEL_EINVAL, "value nested more than %d levels deep", JV_MAX_DEPTH);
    if (a.t == JT_UNDEF) return jx_undef_error(x, a);
    if (b.t == JT_UNDEF) return jx_undef_error(x, b);
    double p = 0, q = 0;
    if (jv_as_num(a, &p) && jv_as_num(b, &q)) {
        if (a.t != JT_FLOAT && b.t != JT_FLOAT) {
            int64_t i, j;
            jv_as_int(a, &i);
            jv_as_int(b, &j);
            *out = i < j ? -1 : i > j;
        } else {
            *out = p < q ? -1 : p > q ? 1 : 0;
        }
        return KEEL_OK;
    }
    if (a.t == JT_STR && b.t == JT_STR) {
        *out = jstr_cmp(a.u.s, b.u.s);
        return KEEL_OK;
    }
    if (a.t == JT_LIST && b.t == JT_LIST && a.u.l->kind == b.u.l->kind &&
        (a.u.l->kind == JL_LIST || a.u.l->kind == JL_TUPLE)) {
        const jlist *l = a.u.l, *m = b.u.l;
        for (size_t i = 0; i < l->n && i < m->n; i++) {
            bool e;
            TRY(eq_rec(x, l->v[i], m->v[i], &e, depth + 1));
            if (!e) return cmp_rec(x, op, l->v[i], m->v[i], out, depth + 1);
        }
        *out = l->n < m->n ? -1 : l->n > m->n;
        return KEEL_OK;
    }
    return jx_fail(x, KEEL_EINVAL, "'%s' not supported between instances of '%s' and '%s'",
                   op_sym(op), jv_type_name(a), jv_type_name(b));
}

keel_status jv_order(jx *x, int op, jv a, jv b, bool *out)
{
    int c;
    TRY(cmp_rec(x, op, a, b, &c, 0));
    switch (op) {
    case JO_LT: *out = c < 0; break;
    case JO_LE: *out = c <= 0; break;
    case JO_GT: *out = c > 0; break;
    default: *out = c >= 0; break;
    }
    return KEEL_OK;
}

keel_status jv_cmp(jx *x, jv a, jv b, int *out)
{
    return cmp_rec(x, JO_LT, a, b, out, 0);
}

keel_status jv_contains(jx *x, jv c, jv item, bool *out)
{
    *out = false;
    switch (c.t) {
    case JT_UNDEF:
        return KEEL_OK;
    case JT_STR: {
        if (item.t != JT_STR)
            return jx_fail(x, KEEL_EINVAL, "'in <string>' requires string as left operand, not %s",
                           jv_type_name(item));
        const jstr *h = c.u.s, *nd = item.u.s;
        TRY(jx_scan(x, h->n));
        if (nd->n == 0) {
            *out = true;
        } else if (nd->n <= h->n) {
            *out = memmem(h->s, h->n, nd->s, nd->n) != NULL;
        }
        return KEEL_OK;
    }
    case JT_LIST:
        if (!jv_range_fill(x, c.u.l)) return jx_oom(x);
        TRY(jx_steps(x, (int64_t)(c.u.l->n >> 4)));
        for (size_t i = 0; i < c.u.l->n; i++) {
            TRY(jv_eq(x, c.u.l->v[i], item, out));
            if (*out) return KEEL_OK;
        }
        return KEEL_OK;
    case JT_DICT: {
        uint64_t h;
        if (!jv_hash(item, &h, 0))
            return jx_fail(x, KEEL_EINVAL, "unhashable type: '%s'", jv_type_name(item));
        *out = jdict_find(c.u.d, item) >= 0;
        return KEEL_OK;
    }
    default:
        return jx_fail(x, KEEL_EINVAL, "argument of type '%s' is not iterable", jv_type_name(c));
    }
}

keel_status jv_len(jx *x, jv v, int64_t *out)
{
    switch (v.t) {
    case JT_UNDEF:
        *out = 0;
        return KEEL_OK;
    case JT_STR:
        if (!v.u.s->ascii) TRY(jx_scan(x, v.u.s->n));
        *out = (int64_t)jstr_len_cp(v.u.s);
        return KEEL_OK;
    case JT_LIST:
        if (v.u.l->kind == JL_GEN || v.u.l->kind == JL_REVITER) break;
        *out = (int64_t)v.u.l->n;
        return KEEL_OK;
    case JT_DICT:
        *out = (int64_t)v.u.d->n;
        return KEEL_OK;
    default:
        break;
    }
    return jx_fail(x, KEEL_EINVAL, "object of type '%s' has no len()", jv_type_name(v));
}

keel_status jv_iter(jx *x, jv v, jv **items, size_t *n)
{
    *items = NULL;
    *n = 0;
    /* whatever walks the items is bounded in time: n / 16 steps */
    if (v.t == JT_LIST) TRY(jx_steps(x, (int64_t)(v.u.l->n >> 4)));
    if (v.t == JT_DICT) TRY(jx_steps(x, (int64_t)(v.u.d->n >> 4)));
    switch (v.t) {
    case JT_UNDEF:
        return KEEL_OK;
    case JT_LIST:
        if (!jv_range_fill(x, v.u.l)) return jx_oom(x);
        *items = v.u.l->v;
        *n = v.u.l->n;
        /* generators are consumed by iteration */
        if (v.u.l->kind == JL_GEN || v.u.l->kind == JL_REVITER) v.u.l->n = 0;
        return KEEL_OK;
    case JT_DICT:
        *items = v.u.d->k;
        *n = v.u.d->n;
        return KEEL_OK;
    case JT_STR: {
        const jstr *s = v.u.s;
        size_t cnt = jstr_len_cp(s);
        if (cnt == 0) return KEEL_OK;
        jv *it = jmem_alloc_n(&x->mem, cnt, sizeof(jv));
        if (!it) return jx_oom(x);
        size_t i = 0, k = 0;
        while (i < s->n) {
            size_t s0 = i;
            utf8_next(s->s, s->n, &i);
            jstr *c = jstr_new(&x->mem, s->s + s0, i - s0);
            if (!c) return jx_oom(x);
            it[k++] = jv_strv(c);
        }
        *items = it;
        *n = k;
        return KEEL_OK;
    }
    default:
        return jx_fail(x, KEEL_EINVAL, "'%s' object is not iterable", jv_type_name(v));
    }
}

bool jv_range_fill(jx *x, jlist *l)
{
    if (l->kind != JL_RANGE || l->v || l->n == 0) return true;
    x->steps += (int64_t)(l->n / 8); /* checked by the next step */
    jv *v = jmem_alloc_n(&x->mem, l->n, sizeof(jv));
    if (!v) return false;
    for (size_t i = 0; i < l->n; i++) v[i] = jv_int(l->r0 + (int64_t)i * l->r2);
    l->v = v;
    l->cap = l->n;
    return true;
}

jlist *jv_list_copy(jx *x, const jv *items, size_t n, uint8_t kind)
{
    jlist *l = jlist_new(&x->mem, n, kind);
    if (!l) return NULL;
    if (n) memcpy(l->v, items, n * sizeof(jv));
    l->n = n;
    return l;
}

/* ---- arithmetic ------------------------------------------------------------- */

static keel_status binop_type_error(jx *x, int op, jv a, jv b)
{
    if (op == JO_ADD && a.t == JT_STR)
        return jx_fail(x, KEEL_EINVAL, "can only concatenate str (not \"%s\") to str",
                       jv_type_name(b));
    if (op == JO_ADD && a.t == JT_LIST && (a.u.l->kind == JL_LIST || a.u.l->kind == JL_TUPLE))
        return jx_fail(x, KEEL_EINVAL, "can only concatenate %s (not \"%s\") to %s",
                       jv_type_name(a), jv_type_name(b), jv_type_name(a));
    return jx_fail(x, KEEL_EINVAL, "unsupported operand type(s) for %s: '%s' and '%s'", op_sym(op),
                   jv_type_name(a), jv_type_name(b));
}

static keel_status repeat(jx *x, jv seq, int64_t times, jv *out)
{
    if (times < 0) times = 0;
    if (seq.t == JT_STR) {
        const jstr *s = seq.u.s;
        size_t total;
        if (!size_mul(s->n, (size_t)times, &total) || total > x->lim.max_output)
            return jx_fail(x, KEEL_EOVERFLOW, "string repetition longer than %zu bytes",
                           x->lim.max_output);
        jsb b;
        jsb_init(&b, &x->mem, x->lim.max_output);
        for (int64_t i = 0; i < times; i++)
            if (!jsb_add(&b, s->s, s->n)) return sb_status(x, &b);
        jstr *r = jsb_done(&b);
        if (!r) return jx_oom(x);
        *out = jv_strv(r);
        return KEEL_OK;
    }
    const jlist *l = seq.u.l;
    size_t total;
    if (!size_mul(l->n, (size_t)times, &total) || total > (size_t)x->lim.max_steps)
        return jx_fail(x, KEEL_EOVERFLOW, "list repetition too long");
    TRY(jx_steps(x, (int64_t)total));
    jlist *r = jlist_new(&x->mem, total, l->kind);
    if (!r) return jx_oom(x);
    for (int64_t i = 0; i < times && l->n; i++) {
        memcpy(r->v + r->n, l->v, l->n * sizeof(jv));
        r->n += l->n;
    }
    *out = jv_listv(r);
    return KEEL_OK;
}

static double py_fmod(double a, double b)
{
    double m = fmod(a, b);
    if (m != 0 && ((b < 0) != (m < 0))) m += b;
    return m;
}

keel_status jv_binop(jx *x, int op, jv a, jv b, jv *out)
{
    if (op == JO_CONCAT) {
        jstr *sa = NULL, *sb = NULL;
        TRY(jv_to_str(x, a, &sa));
        TRY(jv_to_str(x, b, &sb));
        jstr *r = jstr_cat(&x->mem, sa, sb);
        if (!r) return jx_oom(x);
        *out = jv_strv(r);
        return KEEL_OK;
    }
    if (a.t == JT_UNDEF) return jx_undef_error(x, a);
    if (b.t == JT_UNDEF) return jx_undef_error(x, b);
    int64_t i = 0, j = 0;
    double p = 0, q = 0;
    bool ints = jv_as_int(a, &i) && jv_as_int(b, &j);
    bool nums = jv_as_num(a, &p) && jv_as_num(b, &q);
    switch (op) {
    case JO_ADD:
        if (ints) {
            int64_t r;
            if (__builtin_add_overflow(i, j, &r)) return jx_fail(x, KEEL_EINVAL, "integer overflow");
            *out = jv_int(r);
            return KEEL_OK;
        }
        if (nums) {
            *out = jv_float(p + q);
            return KEEL_OK;
        }
        if (a.t == JT_STR && b.t == JT_STR) {
            /* Markup + str escapes the str (either side), as markupsafe does */
            jstr *sa = a.u.s, *sb = b.u.s;
            if (a.safe != b.safe) {
                jv e;
                TRY(jv_html_escape(x, a.safe ? sb : sa, &e));
                if (a.safe)
                    sb = e.u.s;
                else
                    sa = e.u.s;
            }
            jstr *r = jstr_cat(&x->mem, sa, sb);
            if (!r) return jx_oom(x);
            *out = jv_strv(r);
            out->safe = a.safe || b.safe;
            return KEEL_OK;
        }
        if (a.t == JT_LIST && b.t == JT_LIST && a.u.l->kind == b.u.l->kind &&
            (a.u.l->kind == JL_LIST || a.u.l->kind == JL_TUPLE)) {
            size_t n;
            if (!size_add(a.u.l->n, b.u.l->n, &n)) return jx_oom(x);
            TRY(jx_steps(x, (int64_t)(n / 16)));
            jlist *r = jlist_new(&x->mem, n, a.u.l->kind);
            if (!r) return jx_oom(x);
            if (a.u.l->n) memcpy(r->v, a.u.l->v, a.u.l->n * sizeof(jv));
            if (b.u.l->n) memcpy(r->v + a.u.l->n, b.u.l->v, b.u.l->n * sizeof(jv));
            r->n = n;
            *out = jv_listv(r);
            return KEEL_OK;
        }
        return binop_type_error(x, op, a, b);
    case JO_SUB:
        if (ints) {
            int64_t r;
            if (__builtin_sub_overflow(i, j, &r)) return jx_fail(x, KEEL_EINVAL, "integer overflow");
            *out = jv_int(r);
            return KEEL_OK;
        }
        if (nums) {
            *out = jv_float(p - q);
            return KEEL_OK;
        }
        return binop_type_error(x, op, a, b);
    case JO_MUL:
        if (ints) {
            int64_t r;
            if (__builtin_mul_overflow(i, j, &r)) return jx_fail(x, KEEL_EINVAL, "integer overflow");
            *out = jv_int(r);
            return KEEL_OK;
        }
        if (nums) {
            *out = jv_float(p * q);
            return KEEL_OK;
        }
        {
            bool seq_a = a.t == JT_STR ||
                         (a.t == JT_LIST && (a.u.l->kind == JL_LIST || a.u.l->kind == JL_TUPLE));
            bool seq_b = b.t == JT_STR ||
                         (b.t == JT_LIST && (b.u.l->kind == JL_LIST || b.u.l->kind == JL_TUPLE));
            int64_t k;
            if (seq_a && jv_as_int(b, &k)) {
                TRY(repeat(x, a, k, out));
                if (a.t == JT_STR) out->safe = a.safe;
                return KEEL_OK;
            }
            if (seq_b && jv_as_int(a, &k)) {
                TRY(repeat(x, b, k, out));
                if (b.t == JT_STR) out->safe = b.safe;
                return KEEL_OK;
            }
        }
        return binop_type_error(x, op, a, b);
    case JO_DIV:
        if (!nums) return binop_type_error(x, op, a, b);
        if (q == 0) return jx_fail(x, KEEL_EINVAL, "division by zero");
        *out = jv_float(ints ? (double)i / (double)j : p / q);
        return KEEL_OK;
    case JO_FLOORDIV:
        if (!nums) return binop_type_error(x, op, a, b);
        if (q == 0)
            return jx_fail(x, KEEL_EINVAL, ints ? "integer division or modulo by zero"
                                                : "float floor division by zero");
        if (ints) {
            if (i == INT64_MIN && j == -1) return jx_fail(x, KEEL_EINVAL, "integer overflow");
            int64_t d = i / j;
            if ((i % j != 0) && ((i < 0) != (j < 0))) d--;
            *out = jv_int(d);
        } else {
            *out = jv_float(floor(p / q));
        }
        return KEEL_OK;
    case JO_MOD:
        if (a.t == JT_STR) return jstr_percent_format(x, a.u.s, b, out);
        if (!nums) return binop_type_error(x, op, a, b);
        if (q == 0)
            return jx_fail(x, KEEL_EINVAL, ints ? "integer division or modulo by zero"
                                                : "float modulo");
        if (ints) {
            if (j == -1) {
                *out = jv_int(0);
                return KEEL_OK;
            }
            int64_t m = i % j;
            if (m != 0 && ((m < 0) != (j < 0))) m += j;
            *out = jv_int(m);
        } else {
            *out = jv_float(py_fmod(p, q));
        }
        return KEEL_OK;
    case JO_POW:
        if (!nums) return binop_type_error(x, op, a, b);
        if (ints && j >= 0) {
            int64_t r = 1, base = i, e = j;
            while (e > 0) {
                if (e & 1) {
                    if (__builtin_mul_overflow(r, base, &r))
                        return jx_fail(x, KEEL_EINVAL, "integer overflow");
                }
                e >>= 1;
                if (e && __builtin_mul_overflow(base, base, &base))
                    return jx_fail(x, KEEL_EINVAL, "integer overflow");
            }
            *out = jv_int(r);
            return KEEL_OK;
        }
        if (p == 0 && q < 0)
            return jx_fail(x, KEEL_EINVAL, "0.0 cannot be raised to a negative power");
        *out = jv_float(pow(p, q));
        return KEEL_OK;
    default:
        return jx_fail(x, KEEL_EINTERNAL, "bad operator");
    }
}

/* ---- attributes and items ---------------------------------------------------- */

static keel_status loop_attr(jx *x, jv obj, const jstr *name, jv *out);

keel_status jv_getattr(jx *x, jv obj, const jstr *name, jv *out)
{
    if (obj.t == JT_UNDEF) return jx_undef_error(x, obj);
    jv key = jv_strv((jstr *)name);
    bool unsafe = name->n > 0 && name->s[0] == '_';
    switch (obj.t) {
    case JT_DICT: {
        jfn m = unsafe ? JF_NONE : jinja_method_id(obj, name);
        if (m != JF_NONE) break;
        int64_t i = jdict_find(obj.u.d, key);
        if (i >= 0) {
            *out = obj.u.d->v[i];
            return KEEL_OK;
        }
        *out = jv_undef_attr(x, obj, key, false);
        return KEEL_OK;
    }
    case JT_NS: {
        int64_t i = jdict_find(obj.u.d, key);
        *out = i >= 0 ? obj.u.d->v[i] : jv_undef_attr(x, obj, key, false);
        return KEEL_OK;
    }
    case JT_LOOP:
        return loop_attr(x, obj, name, out);
    case JT_CYCLER:
        if (jstr_eqc(name, "current")) {
            *out = obj.u.cy->items[obj.u.cy->pos];
            return KEEL_OK;
        }
        break;
    case JT_LIST:
        if (obj.u.l->kind == JL_TUPLE && obj.u.l->r0 == 1 && obj.u.l->n == 2) {
            /* groupby's (grouper, list) tuples */
            if (jstr_eqc(name, "grouper")) {
                *out = obj.u.l->v[0];
                return KEEL_OK;
            }
            if (jstr_eqc(name, "list")) {
                *out = obj.u.l->v[1];
                return KEEL_OK;
            }
        }
        break;
    default:
        break;
    }
    jfn m = unsafe ? JF_NONE : jinja_method_id(obj, name);
    if (m == JF_NONE) {
        *out = jv_undef_attr(x, obj, key, false);
        return KEEL_OK;
    }
    jbound *bd = jmem_alloc(&x->mem, sizeof *bd);
    if (!bd) return jx_oom(x);
    bd->self = obj;
    *out = jv_func(m, bd);
    return KEEL_OK;
}

keel_status jv_getitem(jx *x, jv obj, jv key, jv *out)
{
    if (obj.t == JT_UNDEF) return jx_undef_error(x, obj);
    int64_t idx;
    switch (obj.t) {
    case JT_DICT: {
        int64_t i = jdict_find(obj.u.d, key);
        if (i >= 0) {
            *out = obj.u.d->v[i];
            return KEEL_OK;
        }
        break;
    }
    case JT_LIST: {
        const jlist *l = obj.u.l;
        bool subscriptable = l->kind == JL_LIST || l->kind == JL_TUPLE || l->kind == JL_RANGE;
        if (subscriptable && jv_as_int(key, &idx)) {
            if (idx < 0) idx += (int64_t)l->n;
            if (idx >= 0 && (size_t)idx < l->n) {
                *out = l->v ? l->v[idx] : jv_int(l->r0 + idx * l->r2); /* a lazy range */
                return KEEL_OK;
            }
            *out = jv_undef_attr(x, obj, key, true);
            return KEEL_OK;
        }
        break;
    }
    case JT_STR:
        if (jv_as_int(key, &idx)) {
            const jstr *s = obj.u.s;
            if (!s->ascii) TRY(jx_scan(x, s->n));
            int64_t len = (int64_t)jstr_len_cp(s);
            if (idx < 0) idx += len;
            if (idx >= 0 && idx < len) {
                size_t b0 = utf8_offset(s, (size_t)idx), b1 = b0;
                utf8_next(s->s, s->n, &b1);
                jstr *c = jstr_new(&x->mem, s->s + b0, b1 - b0);
                if (!c) return jx_oom(x);
                *out = jv_strv(c);
                out->safe = obj.safe; /* Markup[i] is Markup */
                return KEEL_OK;
            }
            *out = jv_undef_attr(x, obj, key, true);
            return KEEL_OK;
        }
        break;
    default:
        break;
    }
    if (key.t == JT_STR) {
        if (obj.t == JT_DICT) {
            /* d['items'] falls back to the method when there is no such key */
            jfn m = key.u.s->n && key.u.s->s[0] == '_' ? JF_NONE : jinja_method_id(obj, key.u.s);
            if (m == JF_NONE) {
                *out = jv_undef_attr(x, obj, key, true);
                return KEEL_OK;
            }
            jbound *bd = jmem_alloc(&x->mem, sizeof *bd);
            if (!bd) return jx_oom(x);
            bd->self = obj;
            *out = jv_func(m, bd);
            return KEEL_OK;
        }
        return jv_getattr(x, obj, key.u.s, out);
    }
    *out = jv_undef_attr(x, obj, key, true);
    return KEEL_OK;
}

/* Python slice index normalization (PySlice_AdjustIndices). */
static keel_status slice_bounds(jx *x, int64_t len, jv start, jv stop, jv step, int64_t *s0,
                                int64_t *s1, int64_t *st, int64_t *cnt)
{
    int64_t k = 1;
    if (step.t != JT_NONE && step.t != JT_UNDEF) {
        if (!jv_as_int(step, &k))
            return jx_fail(x, KEEL_EINVAL, "slice indices must be integers or None");
        if (k == 0) return jx_fail(x, KEEL_EINVAL, "slice step cannot be zero");
    }
    int64_t a, b;
    if (start.t == JT_NONE || start.t == JT_UNDEF) {
        a = k < 0 ? len - 1 : 0;
    } else {
        if (!jv_as_int(start, &a))
            return jx_fail(x, KEEL_EINVAL, "slice indices must be integers or None");
        if (a < 0) {
            a += len;
            if (a < 0) a = k < 0 ? -1 : 0;
        } else if (a >= len) {
            a = k < 0 ? len - 1 : len;
        }
    }
    if (stop.t == JT_NONE || stop.t == JT_UNDEF) {
        b = k < 0 ? -1 : len;
    } else {
        if (!jv_as_int(stop, &b))
            return jx_fail(x, KEEL_EINVAL, "slice indices must be integers or None");
        if (b < 0) {
            b += len;
            if (b < 0) b = k < 0 ? -1 : 0;
        } else if (b >= len) {
            b = k < 0 ? len - 1 : len;
        }
    }
    int64_t c = 0;
    if (k < 0) {
        if (b < a) c = (a - b - 1) / (-k) + 1;
    } else {
        if (a < b) c = (b - a - 1) / k + 1;
    }
    *s0 = a;
    *s1 = b;
    *st = k;
    *cnt = c;
    return KEEL_OK;
}

keel_status jv_slice(jx *x, jv obj, jv start, jv stop, jv step, jv *out)
{
    if (obj.t == JT_UNDEF) return jx_undef_error(x, obj);
    int64_t a, b, k, cnt;
    if (obj.t == JT_STR) {
        const jstr *s = obj.u.s;
        TRY(jx_scan(x, s->n));
        int64_t len = (int64_t)jstr_len_cp(s);
        TRY(slice_bounds(x, len, start, stop, step, &a, &b, &k, &cnt));
        if (k == 1) {
            size_t b0 = utf8_offset(s, (size_t)a), b1 = utf8_offset(s, (size_t)(a + cnt));
            jstr *r = jstr_new(&x->mem, s->s + b0, b1 - b0);
            if (!r) return jx_oom(x);
            *out = jv_strv(r);
            out->safe = obj.safe;
            return KEEL_OK;
        }
        /* general step: offsets of every code point */
        size_t *off = jmem_alloc_n(&x->mem, (size_t)len + 1, sizeof(size_t));
        if (!off) return jx_oom(x);
        size_t i = 0, c = 0;
        while (i < s->n) {
            off[c++] = i;
            utf8_next(s->s, s->n, &i);
        }
        off[c] = s->n;
        jsb sb;
        jsb_init(&sb, &x->mem, x->lim.max_output);
        for (int64_t t = 0, p = a; t < cnt; t++, p += k)
            if (!jsb_add(&sb, s->s + off[p], off[p + 1] - off[p])) return sb_status(x, &sb);
        jstr *r = jsb_done(&sb);
        if (!r) return jx_oom(x);
        *out = jv_strv(r);
        out->safe = obj.safe;
        return KEEL_OK;
    }
    if (obj.t == JT_LIST && obj.u.l->kind == JL_RANGE) {
        /* a slice of a range is a range */
        const jlist *l = obj.u.l;
        TRY(slice_bounds(x, (int64_t)l->n, start, stop, step, &a, &b, &k, &cnt));
        jlist *r = jlist_new(&x->mem, 0, JL_RANGE);
        if (!r) return jx_oom(x);
        r->n = (size_t)cnt;
        r->r0 = l->r0 + a * l->r2;
        r->r1 = l->r0 + b * l->r2;
        r->r2 = l->r2 * k;
        *out = jv_listv(r);
        return KEEL_OK;
    }
    if (obj.t == JT_LIST &&
        (obj.u.l->kind == JL_LIST || obj.u.l->kind == JL_TUPLE || obj.u.l->kind == JL_RANGE)) {
        const jlist *l = obj.u.l;
        if (!jv_range_fill(x, obj.u.l)) return jx_oom(x);
        TRY(slice_bounds(x, (int64_t)l->n, start, stop, step, &a, &b, &k, &cnt));
        jlist *r = jlist_new(&x->mem, (size_t)cnt, l->kind == JL_TUPLE ? JL_TUPLE : JL_LIST);
        if (!r) return jx_oom(x);
        for (int64_t t = 0, p = a; t < cnt; t++, p += k) r->v[r->n++] = l->v[p];
        *out = jv_listv(r);
        return KEEL_OK;
    }
    *out = jv_undef_attr(x, obj, jv_none(), true);
    return KEEL_OK;
}

/* ---- the loop object ---------------------------------------------------------- */

static keel_status loop_attr(jx *x, jv obj, const jstr *name, jv *out)
{
    jloop *lp = obj.u.loop;
    keel_status st = KEEL_OK;
    const char *nm = name->s;
    size_t nn = name->n;
#define NAME_IS(lit) (nn == sizeof(lit) - 1 && memcmp(nm, lit, nn) == 0)
    if (NAME_IS("index0")) {
        *out = jv_int((int64_t)lp->i);
    } else if (NAME_IS("index")) {
        *out = jv_int((int64_t)lp->i + 1);
    } else if (NAME_IS("first")) {
        *out = jv_bool(lp->i == 0);
    } else if (NAME_IS("depth")) {
        *out = jv_int(lp->depth0 + 1);
    } else if (NAME_IS("depth0")) {
        *out = jv_int(lp->depth0);
    } else if (NAME_IS("previtem")) {
        *out = lp->i > 0 ? jx_loop_item(lp, lp->i - 1) : jv_undef_hint(x, "there is no previous item");
    } else if (NAME_IS("nextitem")) {
        bool have = jx_loop_fetch(x, lp, lp->i + 1, &st);
        if (st != KEEL_OK) return st;
        *out = have ? jx_loop_item(lp, lp->i + 1) : jv_undef_hint(x, "there is no next item");
    } else if (NAME_IS("last")) {
        bool have = jx_loop_fetch(x, lp, lp->i + 1, &st);
        if (st != KEEL_OK) return st;
        *out = jv_bool(!have);
    } else if (NAME_IS("length") || NAME_IS("revindex") || NAME_IS("revindex0")) {
        /* the whole length: materialize every item */
        if (lp->live) {
            jx_loop_fetch(x, lp, 0, &st); /* refreshes the live list's length */
            TRY(st);
        }
        while (!lp->live && !lp->complete) {
            jx_loop_fetch(x, lp, lp->n, &st);
            if (st != KEEL_OK) return st;
        }
        int64_t len = (int64_t)lp->n;
        if (NAME_IS("length"))
            *out = jv_int(len);
        else if (NAME_IS("revindex"))
            *out = jv_int(len - (int64_t)lp->i);
        else
            *out = jv_int(len - (int64_t)lp->i - 1);
    } else if (NAME_IS("cycle")) {
        *out = jv_func(JF_LOOP_CYCLE, NULL);
        jbound *bd = jmem_alloc(&x->mem, sizeof *bd);
        if (!bd) return jx_oom(x);
        bd->self = obj;
        out->u.bound = bd;
    } else if (NAME_IS("changed")) {
        *out = jv_func(JF_LOOP_CHANGED, NULL);
        jbound *bd = jmem_alloc(&x->mem, sizeof *bd);
        if (!bd) return jx_oom(x);
        bd->self = obj;
        out->u.bound = bd;
    } else {
        *out = jv_undef_attr(x, obj, jv_strv((jstr *)name), false);
    }
#undef NAME_IS
    return KEEL_OK;
}
