/*
 * jinja_value.c — the values of the Jinja engine and their Python semantics:
 * the arena they live in, strings (UTF-8, indexed by code point), lists and
 * insertion-ordered dicts with a hash index, truthiness, and Undefined with
 * jinja2's messages. Values as text (str()/repr(), json.dumps, the JSON
 * reader) are in jinja_text.c; ==, ordering, arithmetic, attribute and item
 * access and the loop object in jinja_ops.c.
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
