/*
 * jschema.c — JSON Schema (draft 2020-12) to GBNF (grammar.h,
 * gram_schema_gbnf), exact: every keyword is translated exactly or the
 * schema is refused with the keyword and its location (a JSON pointer),
 * never dropped. This file owns the normal form (jschema_int.h): a schema node becomes
 * a union of kind-wise conjunctions, with allOf / $ref as intersection,
 * anyOf as union, not as the per-kind complement, oneOf and if / then /
 * else built from those. jschema_ref.c indexes the document and resolves
 * references; jschema_emit.c writes the GBNF of a normal form;
 * jschema_util.c holds the buffers, the arena and the refusals.
 *
 * Refused: remote references, a $dynamicRef whose target depends on the
 * dynamic scope, uniqueItems true, complements that the normal form
 * cannot express (patternProperties, additionalProperties, propertyNames,
 * uniqueItems under not), unevaluated* where the evaluated set is not
 * known exactly, unknown keywords (a misspelt keyword is more likely than
 * an extension); caps
 * (jschema_int.h) bound depth, union sizes, work and memory. A schema that
 * accepts nothing compiles to the empty language (gram_accepts_nothing
 * says so; the engine refuses to generate under it).
 */
#include "jschema_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the normal form: values and conjunctions -------------------------------------------- */

static unsigned value_kind(json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_NULL: return JK_NULL;
    case JSON_TRUE:
    case JSON_FALSE: return JK_BOOL;
    case JSON_INTEGER:
    case JSON_REAL: return JK_NUM;
    case JSON_STRING: return JK_STR;
    case JSON_ARRAY: return JK_ARR;
    default: return JK_OBJ;
    }
}

/* JSON Schema equality: numbers by value (1 == 1.0), objects regardless of order. */
bool js_value_eq(json_t *a, json_t *b)
{
    if (json_is_number(a) && json_is_number(b)) {
        char ta[JNUM_TEXT_CAP], tb[JNUM_TEXT_CAP];
        return jnum_text(a, ta) && jnum_text(b, tb) && jnum_cmp(ta, tb) == 0;
    }
    if (json_typeof(a) != json_typeof(b)) return false;
    if (json_is_array(a)) {
        if (json_array_size(a) != json_array_size(b)) return false;
        for (size_t i = 0; i < json_array_size(a); i++)
            if (!js_value_eq(json_array_get(a, i), json_array_get(b, i))) return false;
        return true;
    }
    if (json_is_object(a)) {
        if (json_object_size(a) != json_object_size(b)) return false;
        const char *k;
        json_t *v;
        json_object_foreach(a, k, v) {
            json_t *w = json_object_get(b, k);
            if (!w || !js_value_eq(v, w)) return false;
        }
        return true;
    }
    return json_equal(a, b);
}

static void conj_init(jconj *c, const char *where)
{
    memset(c, 0, sizeof *c);
    c->where = where;
    c->kinds = JK_ALL;
    c->bools = 3;
    c->num.kind = JNUM_ANY;
    c->str.max_len = -1;
    c->max_items = -1;
    c->max_props = -1;
}

bool js_conj_trivial(const jconj *c)
{
    const jnum_spec *n = &c->num;
    const jstr_spec *s = &c->str;
    return c->kinds == JK_ALL && c->bools == 3 && n->kind == JNUM_ANY && !n->n_lo && !n->n_hi && !n->n_mult &&
           !n->n_not_mult && !n->n_except && !s->min_len && s->max_len < 0 && !s->n_pattern && !s->n_not_pattern &&
           !s->n_format && !s->n_not_format && !s->n_except && !c->has_en && !c->min_items && c->max_items < 0 &&
           !c->n_pre && !c->items.n && !c->n_ct && !c->unique && !c->n_grp && !c->n_req && !c->min_props &&
           c->max_props < 0 && !c->pnames.n;
}

/* No constraint but the kinds (and nothing evaluated). */
static bool conj_kinds_only(const jconj *c)
{
    jconj t = *c;
    t.kinds = JK_ALL;
    return js_conj_trivial(&t) && !t.eval_pre && !t.eval_items && !t.eval_contains;
}

static bool conj_evaluates(const jconj *c)
{
    if (c->eval_pre || c->eval_items || c->eval_contains) return true;
    for (int g = 0; g < c->n_grp; g++)
        if (!c->grp[g].noeval) return true;
    return false;
}

/* Clears the constraints of the kinds c does not allow (they constrain
 * nothing there), so that equal alternatives look equal. */
static void conj_clean(jconj *c)
{
    if (!(c->kinds & JK_BOOL)) c->bools = 3;
    if (!(c->kinds & JK_NUM)) memset(&c->num, 0, sizeof c->num);
    if (!(c->kinds & JK_STR)) {
        memset(&c->str, 0, sizeof c->str);
        c->str.max_len = -1;
    }
    if (!(c->kinds & JK_ARR)) {
        c->min_items = 0;
        c->max_items = -1;
        c->pre = NULL;
        c->n_pre = 0;
        c->items.v = NULL;
        c->items.n = 0;
        c->ct = NULL;
        c->n_ct = 0;
        c->unique = false;
        c->eval_pre = 0;
        c->eval_items = c->eval_contains = false;
    }
    if (!(c->kinds & JK_OBJ)) {
        c->grp = NULL;
        c->n_grp = 0;
        c->req = NULL;
        c->n_req = 0;
        c->min_props = 0;
        c->max_props = -1;
        c->pnames.v = NULL;
        c->pnames.n = 0;
    }
}

/* Folds the alternatives that constrain only kinds into one and drops the
 * alternatives it contains (a union's size is what products multiply). */
static void dnf_simplify(jsb *b, jdnf *r)
{
    int k = -1;
    for (int i = 0; i < r->n; i++) {
        conj_clean(&r->c[i]);
        if (!conj_kinds_only(&r->c[i])) continue;
        if (k < 0) {
            k = i;
        } else {
            r->c[k].kinds |= r->c[i].kinds;
            r->c[k].inexact |= r->c[i].inexact;
        }
    }
    if (k < 0) return;
    int n = 0;
    for (int i = 0; i < r->n; i++) {
        bool drop = i != k && (r->c[i].kinds & ~r->c[k].kinds) == 0 && (!b->uneval || !conj_evaluates(&r->c[i]));
        if (conj_kinds_only(&r->c[i]) && i != k) drop = true;
        if (!drop) r->c[n++] = r->c[i];
    }
    r->n = n;
}

static keel_status dnf_one(jsb *b, const jconj *c, jdnf *out)
{
    out->c = js_alloc(b, sizeof *out->c);
    if (!out->c) return b->st;
    out->c[0] = *c;
    out->n = 1;
    return KEEL_OK;
}

static jsl jsl_cat(jsb *b, jsl x, jsl y)
{
    jsl r = {NULL, 0};
    if (!y.n) return x;
    if (!x.n) return y;
    r.v = js_alloc(b, (size_t)(x.n + y.n) * sizeof *r.v);
    if (!r.v) return r;
    memcpy(r.v, x.v, (size_t)x.n * sizeof *r.v);
    memcpy(r.v + x.n, y.v, (size_t)y.n * sizeof *r.v);
    r.n = x.n + y.n;
    return r;
}

static jsl jsl_one(jsb *b, json_t *s)
{
    jsl r = {js_alloc(b, sizeof(json_t *)), 0};
    if (r.v) {
        r.v[0] = s;
        r.n = 1;
    }
    return r;
}

static void *cat_arr(jsb *b, const void *x, size_t nx, const void *y, size_t ny, size_t el)
{
    if (!nx && !ny) return NULL;
    char *r = js_alloc(b, (nx + ny) * el);
    if (!r) return NULL;
    if (nx) memcpy(r, x, nx * el);
    if (ny) memcpy(r + nx * el, y, ny * el);
    return r;
}

/* Appends the texts of list y[0..ny) (with flags) to x's list; refuses past the cap. */
static bool cat_texts(jsb *b, const char **x, bool *xf, int *nx, const char *const *y, const bool *yf, int ny,
                      int cap, const char *where, const char *what)
{
    if (*nx + ny > cap) {
        js_refuse(b, where, "more than %d %s in one conjunction", cap, what);
        return false;
    }
    for (int i = 0; i < ny; i++) {
        x[*nx + i] = y[i];
        if (xf) xf[*nx + i] = yf[i];
    }
    *nx += ny;
    return true;
}

/* x ∧ y into *r; *empty when no value satisfies both (kinds all gone). */
static keel_status conj_and(jsb *b, const jconj *x, const jconj *y, jconj *r, bool *empty)
{
    *empty = false;
    bool x_all = js_conj_trivial(x);
    *r = *x;
    if (x_all) r->where = y->where; /* messages name the schema that constrains */
    r->kinds = x->kinds & y->kinds;
    r->bools = x->bools & y->bools;
    if (!r->bools) r->kinds &= ~(unsigned)JK_BOOL;
    /* numbers */
    if (x->num.kind != y->num.kind && x->num.kind && y->num.kind) r->kinds &= ~(unsigned)JK_NUM;
    r->num.kind = x->num.kind ? x->num.kind : y->num.kind;
    if (!cat_texts(b, r->num.lo, r->num.lo_excl, &r->num.n_lo, y->num.lo, y->num.lo_excl, y->num.n_lo, JNUM_MAX_ITEMS,
                   x->where, "lower bounds") ||
        !cat_texts(b, r->num.hi, r->num.hi_excl, &r->num.n_hi, y->num.hi, y->num.hi_excl, y->num.n_hi, JNUM_MAX_ITEMS,
                   x->where, "upper bounds") ||
        !cat_texts(b, r->num.mult, NULL, &r->num.n_mult, y->num.mult, NULL, y->num.n_mult, JNUM_MAX_ITEMS, x->where,
                   "'multipleOf'") ||
        !cat_texts(b, r->num.not_mult, NULL, &r->num.n_not_mult, y->num.not_mult, NULL, y->num.n_not_mult,
                   JNUM_MAX_ITEMS, x->where, "negated 'multipleOf'"))
        return b->st;
    r->num.except = cat_arr(b, x->num.except, x->num.n_except, y->num.except, y->num.n_except, sizeof(char *));
    r->num.n_except = x->num.n_except + y->num.n_except;
    /* strings */
    r->str.min_len = BASE_MAX(x->str.min_len, y->str.min_len);
    r->str.max_len = x->str.max_len < 0 ? y->str.max_len
                   : y->str.max_len < 0 ? x->str.max_len
                                        : BASE_MIN(x->str.max_len, y->str.max_len);
    if (!cat_texts(b, r->str.pattern, NULL, &r->str.n_pattern, y->str.pattern, NULL, y->str.n_pattern,
                   JSTR_MAX_ITEMS, x->where, "'pattern'") ||
        !cat_texts(b, r->str.not_pattern, NULL, &r->str.n_not_pattern, y->str.not_pattern, NULL,
                   y->str.n_not_pattern, JSTR_MAX_ITEMS, x->where, "negated 'pattern'") ||
        !cat_texts(b, r->str.format, NULL, &r->str.n_format, y->str.format, NULL, y->str.n_format, JSTR_MAX_ITEMS,
                   x->where, "'format'") ||
        !cat_texts(b, r->str.not_format, NULL, &r->str.n_not_format, y->str.not_format, NULL, y->str.n_not_format,
                   JSTR_MAX_ITEMS, x->where, "negated 'format'"))
        return b->st;
    r->str.except = cat_arr(b, x->str.except, x->str.n_except, y->str.except, y->str.n_except, sizeof(char *));
    r->str.except_len =
        cat_arr(b, x->str.except_len, x->str.n_except, y->str.except_len, y->str.n_except, sizeof(size_t));
    r->str.n_except = x->str.n_except + y->str.n_except;
    if (r->str.max_len >= 0 && r->str.max_len < r->str.min_len) r->kinds &= ~(unsigned)JK_STR;
    /* finite sets */
    if (x->has_en && y->has_en) {
        if ((double)x->n_en * (double)y->n_en > 1e6)
            return js_refuse(b, x->where, "an intersection of two 'enum' lists over a million pairs");
        r->en = js_alloc(b, (x->n_en ? x->n_en : 1) * sizeof *r->en);
        if (!r->en) return b->st;
        r->n_en = 0;
        for (size_t i = 0; i < x->n_en; i++)
            for (size_t j = 0; j < y->n_en; j++)
                if (js_value_eq(x->en[i], y->en[j])) {
                    r->en[r->n_en++] = x->en[i];
                    break;
                }
    } else if (y->has_en) {
        r->has_en = true;
        r->en = y->en;
        r->n_en = y->n_en;
    }
    if (r->has_en) {
        unsigned k = 0;
        for (size_t i = 0; i < r->n_en; i++) k |= value_kind(r->en[i]);
        r->kinds &= k;
    }
    /* arrays */
    r->min_items = BASE_MAX(x->min_items, y->min_items);
    r->max_items = x->max_items < 0 ? y->max_items
                 : y->max_items < 0 ? x->max_items
                                    : BASE_MIN(x->max_items, y->max_items);
    if (r->max_items >= 0 && r->max_items < r->min_items) r->kinds &= ~(unsigned)JK_ARR;
    r->n_pre = BASE_MAX(x->n_pre, y->n_pre);
    if (r->n_pre) {
        r->pre = js_alloc(b, (size_t)r->n_pre * sizeof *r->pre);
        if (!r->pre) return b->st;
        for (int i = 0; i < r->n_pre; i++)
            r->pre[i] = jsl_cat(b, i < x->n_pre ? x->pre[i] : x->items, i < y->n_pre ? y->pre[i] : y->items);
    }
    r->items = jsl_cat(b, x->items, y->items);
    r->ct = cat_arr(b, x->ct, (size_t)x->n_ct, y->ct, (size_t)y->n_ct, sizeof *r->ct);
    r->n_ct = x->n_ct + y->n_ct;
    r->unique = x->unique || y->unique;
    /* objects */
    r->grp = cat_arr(b, x->grp, (size_t)x->n_grp, y->grp, (size_t)y->n_grp, sizeof *r->grp);
    r->n_grp = x->n_grp + y->n_grp;
    r->req = cat_arr(b, x->req, (size_t)x->n_req, y->req, (size_t)y->n_req, sizeof *r->req);
    r->n_req = x->n_req + y->n_req;
    r->min_props = BASE_MAX(x->min_props, y->min_props);
    r->max_props = x->max_props < 0 ? y->max_props
                 : y->max_props < 0 ? x->max_props
                                    : BASE_MIN(x->max_props, y->max_props);
    if (r->max_props >= 0 && r->max_props < r->min_props) r->kinds &= ~(unsigned)JK_OBJ;
    /* a required name that a merged schema makes absent: no object (prunes required / not required products) */
    for (int i = 0; i < r->n_req && (r->kinds & JK_OBJ); i++)
        for (int g = 0; g < r->n_grp; g++)
            if (json_is_false(json_object_get(r->grp[g].props, r->req[i]))) {
                r->kinds &= ~(unsigned)JK_OBJ;
                break;
            }
    r->pnames = jsl_cat(b, x->pnames, y->pnames);
    r->eval_pre = BASE_MAX(x->eval_pre, y->eval_pre);
    r->eval_items = x->eval_items || y->eval_items;
    r->eval_contains = x->eval_contains || y->eval_contains;
    r->inexact = x->inexact || y->inexact;
    *empty = r->kinds == 0;
    return b->st;
}

static keel_status dnf_and(jsb *b, const jdnf *x, const jdnf *y, jdnf *out, const char *where)
{
    jdnf r = {NULL, 0};
    /* most pairs of a large product are often empty (different kinds): cap the pairs, then the result */
    if ((int64_t)x->n * y->n > JS_MAX_DNF * 16)
        return js_refuse(b, where, "an intersection of more than %d alternatives (allOf / oneOf / not product)",
                         JS_MAX_DNF);
    if (x->n && y->n) {
        r.c = js_alloc(b, (size_t)x->n * (size_t)y->n * sizeof *r.c);
        if (!r.c) return b->st;
    }
    for (int i = 0; i < x->n; i++)
        for (int j = 0; j < y->n; j++) {
            bool empty;
            if (conj_and(b, &x->c[i], &y->c[j], &r.c[r.n], &empty)) return b->st;
            if (!empty) r.n++;
        }
    dnf_simplify(b, &r);
    if (r.n > JS_MAX_DNF)
        return js_refuse(b, where, "an intersection of more than %d alternatives (allOf / oneOf / not product)",
                         JS_MAX_DNF);
    *out = r;
    return KEEL_OK;
}

static keel_status dnf_or(jsb *b, const jdnf *x, const jdnf *y, jdnf *out, const char *where)
{
    if (x->n + y->n > JS_MAX_DNF)
        return js_refuse(b, where, "a union of more than %d alternatives", JS_MAX_DNF);
    jdnf r = {cat_arr(b, x->c, (size_t)x->n, y->c, (size_t)y->n, sizeof(jconj)), x->n + y->n};
    if (b->st) return b->st;
    dnf_simplify(b, &r);
    *out = r;
    return KEEL_OK;
}

/* ---- complements -------------------------------------------------------------------------- */

/* A node made here, once per key (so that emitted lists of it are memoized). */
static json_t *synth(jsb *b, const char *key, json_t *made)
{
    for (int i = 0; i < b->n_syn; i++)
        if (strcmp(b->syn[i].key, key) == 0) {
            json_decref(made);
            return b->syn[i].node;
        }
    if (!made || b->st) {
        json_decref(made);
        js_oom(b);
        return NULL;
    }
    if (b->n_syn >= JS_MAX_MEMO || json_array_append_new(b->synth, made)) {
        js_refuse(b, "/", "more than %d derived schemas", JS_MAX_MEMO);
        return NULL;
    }
    b->syn[b->n_syn].key = js_strdup(b, key, strlen(key));
    b->syn[b->n_syn++].node = made;
    return made;
}

static void list_key(jsl l, const char *tag, char *key, size_t cap)
{
    size_t n = (size_t)snprintf(key, cap, "%s", tag);
    for (int i = 0; i < l.n && n + 20 < cap; i++) n += (size_t)snprintf(key + n, cap - n, "%p,", (void *)l.v[i]);
}

/* {"not": allOf l} as one node. */
keel_status js_not_list(jsb *b, jsl l, json_t **out)
{
    char key[4096];
    *out = NULL;
    if (l.n > 128) return js_refuse(b, "/", "a complement of more than 128 schemas");
    list_key(l, "not:", key, sizeof key);
    json_t *inner;
    if (l.n == 1) {
        inner = json_incref(l.v[0]);
    } else {
        json_t *a = json_array();
        for (int i = 0; a && i < l.n; i++)
            if (json_array_append(a, l.v[i])) {
                json_decref(a);
                a = NULL;
            }
        inner = a ? json_pack("{s:o}", "allOf", a) : NULL;
    }
    *out = synth(b, key, inner ? json_pack("{s:o}", "not", inner) : NULL);
    return b->st;
}

static json_t *not_of(jsb *b, json_t *s)
{
    json_t *r = NULL;
    json_t *one[1] = {s};
    jsl l = {one, 1};
    js_not_list(b, l, &r);
    return r;
}

/* ¬x (one conjunction) as a union: the kinds x does not allow, then for
 * each kind x allows and each constraint on it, the values of that kind
 * that break the constraint. */
static keel_status conj_not(jsb *b, const jconj *x, jdnf *out)
{
    const char *w = x->where;
    jconj *buf = js_alloc(b, 128 * sizeof *buf); /* the arena, not the stack: a jconj is ~2 KiB */
    int n = 0;
    if (!buf) return b->st;
#define NEW(k)                                                                                                       \
    do {                                                                                                             \
        if (n == 128) return js_refuse(b, w, "a complement of more than 128 constraints");                          \
        conj_init(&buf[n], w);                                                                                       \
        buf[n].kinds = (k);                                                                                          \
    } while (0)
#define PUSH() n++
    if ((x->kinds & JK_ALL) != JK_ALL) {
        NEW(JK_ALL & ~x->kinds);
        PUSH();
    }
    if (x->has_en) {
        NEW(x->kinds);
        for (size_t i = 0; i < x->n_en; i++) {
            json_t *v = x->en[i];
            unsigned k = value_kind(v);
            if (k == JK_NULL) buf[n].kinds &= ~(unsigned)JK_NULL;
            else if (k == JK_BOOL) buf[n].bools &= json_is_true(v) ? 1u : 2u;
            else if (k == JK_ARR || k == JK_OBJ) return js_refuse(b, w, "'not' of an 'enum' / 'const' with arrays or objects is not supported");
        }
        if (!buf[n].bools) buf[n].kinds &= ~(unsigned)JK_BOOL;
        const char **ne = js_alloc(b, (x->n_en + 1) * sizeof *ne);
        const char **se = js_alloc(b, (x->n_en + 1) * sizeof *se);
        size_t *sl = js_alloc(b, (x->n_en + 1) * sizeof *sl);
        if (!ne || !se || !sl) return b->st;
        for (size_t i = 0; i < x->n_en; i++) {
            json_t *v = x->en[i];
            if (json_is_number(v)) {
                char t[JNUM_TEXT_CAP];
                if (!jnum_text(v, t)) return js_refuse(b, w, "a number that is not finite");
                ne[buf[n].num.n_except++] = js_strdup(b, t, strlen(t));
            } else if (json_is_string(v)) {
                se[buf[n].str.n_except] = json_string_value(v);
                sl[buf[n].str.n_except++] = json_string_length(v);
            }
        }
        buf[n].num.except = ne;
        buf[n].str.except = se;
        buf[n].str.except_len = sl;
        if (buf[n].kinds) PUSH();
    }
    if ((x->kinds & JK_BOOL) && x->bools != 3) {
        NEW(JK_BOOL);
        buf[n].bools = 3u & ~x->bools;
        if (buf[n].bools) PUSH();
    }
    if (x->kinds & JK_NUM) {
        const jnum_spec *s = &x->num;
        if (s->kind) {
            NEW(JK_NUM);
            buf[n].num.kind = s->kind == JNUM_INT ? JNUM_FRAC : JNUM_INT;
            PUSH();
        }
        for (int i = 0; i < s->n_lo; i++) {
            NEW(JK_NUM);
            buf[n].num.hi[0] = s->lo[i];
            buf[n].num.hi_excl[0] = !s->lo_excl[i];
            buf[n].num.n_hi = 1;
            PUSH();
        }
        for (int i = 0; i < s->n_hi; i++) {
            NEW(JK_NUM);
            buf[n].num.lo[0] = s->hi[i];
            buf[n].num.lo_excl[0] = !s->hi_excl[i];
            buf[n].num.n_lo = 1;
            PUSH();
        }
        for (int i = 0; i < s->n_mult; i++) {
            NEW(JK_NUM);
            buf[n].num.not_mult[0] = s->mult[i];
            buf[n].num.n_not_mult = 1;
            PUSH();
        }
        for (int i = 0; i < s->n_not_mult; i++) {
            NEW(JK_NUM);
            buf[n].num.mult[0] = s->not_mult[i];
            buf[n].num.n_mult = 1;
            PUSH();
        }
        if (s->n_except) {
            NEW(JK_NUM);
            buf[n].has_en = true;
            buf[n].en = js_alloc(b, s->n_except * sizeof *buf[n].en);
            if (!buf[n].en) return b->st;
            for (size_t i = 0; i < s->n_except; i++) {
                json_t *v = json_loads(s->except[i], JSON_DECODE_ANY, NULL);
                char key[JNUM_TEXT_CAP + 8];
                snprintf(key, sizeof key, "num:%s", s->except[i]);
                if (!(buf[n].en[i] = synth(b, key, v))) return b->st;
            }
            buf[n].n_en = s->n_except;
            PUSH();
        }
    }
    if (x->kinds & JK_STR) {
        const jstr_spec *s = &x->str;
        if (s->min_len > 0) {
            NEW(JK_STR);
            buf[n].str.max_len = s->min_len - 1;
            PUSH();
        }
        if (s->max_len >= 0) {
            NEW(JK_STR);
            buf[n].str.min_len = s->max_len + 1;
            PUSH();
        }
        for (int i = 0; i < s->n_pattern; i++) {
            NEW(JK_STR);
            buf[n].str.not_pattern[buf[n].str.n_not_pattern++] = s->pattern[i];
            PUSH();
        }
        for (int i = 0; i < s->n_not_pattern; i++) {
            NEW(JK_STR);
            buf[n].str.pattern[buf[n].str.n_pattern++] = s->not_pattern[i];
            PUSH();
        }
        for (int i = 0; i < s->n_format; i++) {
            NEW(JK_STR);
            buf[n].str.not_format[buf[n].str.n_not_format++] = s->format[i];
            PUSH();
        }
        for (int i = 0; i < s->n_not_format; i++) {
            NEW(JK_STR);
            buf[n].str.format[buf[n].str.n_format++] = s->not_format[i];
            PUSH();
        }
        if (s->n_except) {
            NEW(JK_STR);
            buf[n].has_en = true;
            buf[n].en = js_alloc(b, s->n_except * sizeof *buf[n].en);
            if (!buf[n].en) return b->st;
            for (size_t i = 0; i < s->n_except; i++) {
                char key[64];
                snprintf(key, sizeof key, "str:%p", (const void *)s->except[i]);
                if (!(buf[n].en[i] = synth(b, key, json_stringn(s->except[i], s->except_len[i])))) return b->st;
            }
            buf[n].n_en = s->n_except;
            PUSH();
        }
    }
    if (x->kinds & JK_ARR) {
        if (x->unique) return js_refuse(b, w, "'not' of 'uniqueItems' is not supported");
        if (x->min_items > 0) {
            NEW(JK_ARR);
            buf[n].max_items = x->min_items - 1;
            PUSH();
        }
        if (x->max_items >= 0) {
            NEW(JK_ARR);
            buf[n].min_items = x->max_items + 1;
            PUSH();
        }
        for (int i = 0; i < x->n_pre; i++) {
            if (!x->pre[i].n) continue;
            NEW(JK_ARR);
            buf[n].min_items = i + 1;
            buf[n].n_pre = i + 1;
            buf[n].pre = js_alloc(b, (size_t)(i + 1) * sizeof(jsl));
            if (!buf[n].pre) return b->st;
            json_t *ns;
            if (js_not_list(b, x->pre[i], &ns)) return b->st;
            buf[n].pre[i] = jsl_one(b, ns);
            PUSH();
        }
        if (x->items.n) { /* an element past the prefix that fails items */
            NEW(JK_ARR);
            buf[n].ct = js_alloc(b, sizeof *buf[n].ct);
            if (!buf[n].ct || js_not_list(b, x->items, &buf[n].ct[0].s)) return b->st;
            buf[n].ct[0].mn = 1;
            buf[n].ct[0].mx = -1;
            buf[n].ct[0].from = x->n_pre;
            buf[n].n_ct = 1;
            PUSH();
        }
        for (int i = 0; i < x->n_ct; i++) {
            const jcontains *c = &x->ct[i];
            for (int side = 0; side < 2; side++) {
                if (side == 0 && c->mn <= 0) continue;
                if (side == 1 && c->mx < 0) continue;
                NEW(JK_ARR);
                buf[n].ct = js_alloc(b, sizeof *buf[n].ct);
                if (!buf[n].ct) return b->st;
                buf[n].ct[0].s = c->s;
                buf[n].ct[0].from = c->from;
                buf[n].ct[0].mn = side == 0 ? 0 : c->mx + 1;
                buf[n].ct[0].mx = side == 0 ? c->mn - 1 : -1;
                buf[n].n_ct = 1;
                PUSH();
            }
        }
    }
    if (x->kinds & JK_OBJ) {
        if (x->pnames.n) return js_refuse(b, w, "'not' of 'propertyNames' is not supported");
        if (x->min_props > 0) {
            NEW(JK_OBJ);
            buf[n].max_props = x->min_props - 1;
            PUSH();
        }
        if (x->max_props >= 0) {
            NEW(JK_OBJ);
            buf[n].min_props = x->max_props + 1;
            PUSH();
        }
        for (int i = 0; i < x->n_req; i++) {
            NEW(JK_OBJ);
            buf[n].grp = js_alloc(b, sizeof(jgroup));
            if (!buf[n].grp) return b->st;
            char key[600];
            snprintf(key, sizeof key, "absent:%.500s", x->req[i]);
            buf[n].grp[0].props = synth(b, key, json_pack("{s:b}", x->req[i], 0));
            buf[n].grp[0].noeval = true;
            if (b->st) return b->st;
            buf[n].n_grp = 1;
            PUSH();
        }
        for (int g = 0; g < x->n_grp; g++) {
            const jgroup *gr = &x->grp[g];
            const char *pk;
            json_t *pv;
            json_object_foreach(gr->pats, pk, pv) if (!json_is_true(pv)) /* a true pattern schema always holds */
                return js_refuse(b, w, "'not' of 'patternProperties' is not supported");
            if (gr->addl && !json_is_true(gr->addl))
                return js_refuse(b, w, "'not' of 'additionalProperties' is not supported");
            const char *k;
            json_t *v;
            json_object_foreach(gr->props, k, v) {
                if (json_is_true(v)) continue;
                NEW(JK_OBJ);
                json_t *nv = not_of(b, v);
                char key[600];
                snprintf(key, sizeof key, "prop:%p:%.500s", (void *)nv, k);
                buf[n].grp = js_alloc(b, sizeof(jgroup));
                buf[n].req = js_alloc(b, sizeof(char *));
                if (!nv || !buf[n].grp || !buf[n].req) return b->st;
                buf[n].grp[0].props = synth(b, key, json_pack("{s:O}", k, nv));
                buf[n].grp[0].noeval = true;
                if (b->st) return b->st;
                buf[n].n_grp = 1;
                buf[n].req[0] = k;
                buf[n].n_req = 1;
                PUSH();
            }
        }
    }
#undef NEW
#undef PUSH
    if (n > JS_MAX_DNF) return js_refuse(b, w, "a complement of more than %d alternatives", JS_MAX_DNF);
    out->n = n;
    out->c = n ? js_alloc(b, (size_t)n * sizeof *out->c) : NULL;
    if (n && !out->c) return b->st;
    if (n) memcpy(out->c, buf, (size_t)n * sizeof *out->c);
    return b->st;
}

static keel_status dnf_not(jsb *b, const jdnf *x, jdnf *out, const char *where)
{
    jconj all;
    conj_init(&all, where);
    jdnf r;
    if (dnf_one(b, &all, &r)) return b->st;
    for (int i = 0; i < x->n; i++) {
        jdnf nc;
        if (conj_not(b, &x->c[i], &nc) || dnf_and(b, &r, &nc, &r, where)) return b->st;
    }
    *out = r;
    return KEEL_OK;
}

/* ---- normalizing one schema node ---------------------------------------------------------- */

static keel_status norm(jsb *b, json_t *s, int depth, jdnf *out);

static bool known_annotation(const char *k)
{
    static const char *const ann[] = {"title", "description", "default", "examples", "$comment", "$schema", "$id",
                                      "$anchor", "$dynamicAnchor", "deprecated", "readOnly", "writeOnly", "$defs",
                                      "definitions", "contentMediaType", "contentEncoding", "contentSchema", NULL};
    for (int i = 0; ann[i]; i++)
        if (strcmp(k, ann[i]) == 0) return true;
    return false;
}

static const char *const g_handled[] = {
    "type", "enum", "const", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
    "minLength", "maxLength", "pattern", "format", "items", "prefixItems", "minItems", "maxItems", "contains",
    "minContains", "maxContains", "uniqueItems", "properties", "patternProperties", "additionalProperties",
    "required", "minProperties", "maxProperties", "propertyNames", "dependentRequired", "dependentSchemas", "allOf",
    "anyOf", "oneOf", "not", "if", "then", "else", "$ref", "$dynamicRef", "unevaluatedProperties", "unevaluatedItems", NULL};

/* A non-negative integer count keyword (1.0 is 1): *v; -1 when absent; false with the refusal set. */
static bool get_count(jsb *b, json_t *s, const char *k, int64_t *v, const char *where)
{
    json_t *x = json_object_get(s, k);
    *v = -1;
    if (!x) return true;
    double d = json_is_integer(x) ? (double)json_integer_value(x) : json_is_real(x) ? json_real_value(x) : -1;
    if (d < 0 || d != (double)(int64_t)d) {
        js_refuse(b, where, "'%s' must be a non-negative integer", k);
        return false;
    }
    *v = d > 1e9 ? 1000000000 : (int64_t)d;
    return true;
}

static bool num_text(jsb *b, json_t *v, const char *k, const char **out, const char *where)
{
    char t[JNUM_TEXT_CAP];
    if (!json_is_number(v) || !jnum_text(v, t)) {
        js_refuse(b, where, "'%s' must be a finite number", k);
        return false;
    }
    *out = js_strdup(b, t, strlen(t));
    return *out != NULL;
}

/* The keywords of s that constrain values directly (no applicators). */
static keel_status base_conj(jsb *b, json_t *s, const char *where, jconj *c)
{
    conj_init(c, where);
    json_t *v;
    if ((v = json_object_get(s, "type"))) {
        unsigned k = 0;
        bool num = false, integer = false;
        size_t n = json_is_array(v) ? json_array_size(v) : 1;
        if (!json_is_array(v) && !json_is_string(v)) return js_refuse(b, where, "'type' must be a name or a list");
        for (size_t i = 0; i < n; i++) {
            json_t *t = json_is_array(v) ? json_array_get(v, i) : v;
            const char *tn = json_string_value(t);
            if (!tn) return js_refuse(b, where, "'type' must list names");
            if (strcmp(tn, "null") == 0) k |= JK_NULL;
            else if (strcmp(tn, "boolean") == 0) k |= JK_BOOL;
            else if (strcmp(tn, "number") == 0) num = true;
            else if (strcmp(tn, "integer") == 0) integer = true;
            else if (strcmp(tn, "string") == 0) k |= JK_STR;
            else if (strcmp(tn, "array") == 0) k |= JK_ARR;
            else if (strcmp(tn, "object") == 0) k |= JK_OBJ;
            else return js_refuse(b, where, "the unknown type '%.64s'", tn);
        }
        if (num || integer) k |= JK_NUM;
        if (integer && !num) c->num.kind = JNUM_INT;
        c->kinds = k;
    }
    /* numbers */
    static const char *const nk[] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum", "multipleOf"};
    for (int i = 0; i < 5; i++) {
        if (!(v = json_object_get(s, nk[i]))) continue;
        const char *t;
        if (!num_text(b, v, nk[i], &t, where)) return b->st;
        if (i < 2) {
            c->num.lo[c->num.n_lo] = t;
            c->num.lo_excl[c->num.n_lo++] = i == 1;
        } else if (i < 4) {
            c->num.hi[c->num.n_hi] = t;
            c->num.hi_excl[c->num.n_hi++] = i == 3;
        } else {
            if (jnum_cmp(t, "0") <= 0) return js_refuse(b, where, "'multipleOf' must be above 0");
            c->num.mult[c->num.n_mult++] = t;
        }
    }
    /* strings */
    int64_t mn, mx;
    if (!get_count(b, s, "minLength", &mn, where) || !get_count(b, s, "maxLength", &mx, where)) return b->st;
    c->str.min_len = mn < 0 ? 0 : mn;
    c->str.max_len = mx;
    if ((v = json_object_get(s, "pattern"))) {
        if (!json_is_string(v)) return js_refuse(b, where, "'pattern' must be a string");
        c->str.pattern[c->str.n_pattern++] = json_string_value(v);
    }
    if ((v = json_object_get(s, "format"))) {
        if (!json_is_string(v)) return js_refuse(b, where, "'format' must be a string");
        /* an assertion where jstring.c checks the format; else an annotation (2020-12's default) */
        if (jstr_format_known(json_string_value(v))) c->str.format[c->str.n_format++] = json_string_value(v);
    }
    if (c->str.max_len >= 0 && c->str.max_len < c->str.min_len) c->kinds &= ~(unsigned)JK_STR;
    /* arrays */
    if (!get_count(b, s, "minItems", &mn, where) || !get_count(b, s, "maxItems", &mx, where)) return b->st;
    c->min_items = mn < 0 ? 0 : mn;
    c->max_items = mx;
    if ((v = json_object_get(s, "prefixItems"))) {
        if (!json_is_array(v) || json_array_size(v) > 256)
            return js_refuse(b, where, "'prefixItems' must be an array of at most 256 schemas");
        c->n_pre = (int)json_array_size(v);
        c->pre = js_alloc(b, (size_t)(c->n_pre ? c->n_pre : 1) * sizeof *c->pre);
        if (!c->pre) return b->st;
        for (int i = 0; i < c->n_pre; i++) c->pre[i] = jsl_one(b, json_array_get(v, (size_t)i));
    }
    if ((v = json_object_get(s, "items"))) {
        if (!json_is_object(v) && !json_is_boolean(v))
            return js_refuse(b, where, "'items' must be a schema (an array of schemas is draft 2019's tuple form: use prefixItems)");
        if (!json_is_true(v)) c->items = jsl_one(b, v);
        c->eval_items = true;
    }
    c->eval_pre = c->n_pre;
    if ((v = json_object_get(s, "contains"))) {
        int64_t cmn, cmx;
        if (!get_count(b, s, "minContains", &cmn, where) || !get_count(b, s, "maxContains", &cmx, where))
            return b->st;
        c->ct = js_alloc(b, sizeof *c->ct);
        if (!c->ct) return b->st;
        c->ct[0].s = v;
        c->ct[0].mn = cmn < 0 ? 1 : cmn;
        c->ct[0].mx = cmx;
        c->ct[0].eval = true;
        c->n_ct = 1;
        c->eval_contains = true;
        if (cmx >= 0 && cmx < c->ct[0].mn) c->kinds &= ~(unsigned)JK_ARR;
    }
    if ((v = json_object_get(s, "uniqueItems"))) {
        if (!json_is_boolean(v)) return js_refuse(b, where, "'uniqueItems' must be a boolean");
        c->unique = json_is_true(v);
    }
    if (c->max_items >= 0 && c->max_items < c->min_items) c->kinds &= ~(unsigned)JK_ARR;
    /* objects */
    json_t *pr = json_object_get(s, "properties"), *pp = json_object_get(s, "patternProperties");
    json_t *ad = json_object_get(s, "additionalProperties");
    if ((pr && !json_is_object(pr)) || (pp && !json_is_object(pp)))
        return js_refuse(b, where, "'properties' / 'patternProperties' must be objects");
    if (ad && !json_is_object(ad) && !json_is_boolean(ad))
        return js_refuse(b, where, "'additionalProperties' must be a schema");
    bool eval_all = ad != NULL;
    if (ad && json_is_true(ad)) ad = NULL;
    if ((pr && json_object_size(pr)) || (pp && json_object_size(pp)) || eval_all) {
        c->grp = js_alloc(b, sizeof *c->grp);
        if (!c->grp) return b->st;
        c->grp[0].props = pr;
        c->grp[0].pats = pp;
        c->grp[0].addl = ad;
        c->grp[0].eval_all = eval_all;
        c->n_grp = 1;
    }
    if ((v = json_object_get(s, "required"))) {
        if (!json_is_array(v)) return js_refuse(b, where, "'required' must be an array");
        c->n_req = (int)json_array_size(v);
        c->req = js_alloc(b, (size_t)(c->n_req ? c->n_req : 1) * sizeof *c->req);
        if (!c->req) return b->st;
        for (int i = 0; i < c->n_req; i++) {
            c->req[i] = json_string_value(json_array_get(v, (size_t)i));
            if (!c->req[i]) return js_refuse(b, where, "'required' must list names");
        }
    }
    if (!get_count(b, s, "minProperties", &mn, where) || !get_count(b, s, "maxProperties", &mx, where)) return b->st;
    c->min_props = mn < 0 ? 0 : mn;
    c->max_props = mx;
    if (c->max_props >= 0 && c->max_props < c->min_props) c->kinds &= ~(unsigned)JK_OBJ;
    if ((v = json_object_get(s, "propertyNames")) && !json_is_true(v)) c->pnames = jsl_one(b, v);
    /* finite sets */
    json_t *cst = json_object_get(s, "const"), *en = json_object_get(s, "enum");
    if (en && (!json_is_array(en) || json_array_size(en) > 4096))
        return js_refuse(b, where, "'enum' must be an array of at most 4096 values");
    if (cst || en) {
        jconj e;
        conj_init(&e, where);
        e.has_en = true;
        e.n_en = cst ? 1 : json_array_size(en);
        e.en = js_alloc(b, (e.n_en ? e.n_en : 1) * sizeof *e.en);
        if (!e.en) return b->st;
        for (size_t i = 0; i < e.n_en; i++) e.en[i] = cst ? cst : json_array_get(en, i);
        if (cst && en) {
            jconj f = e;
            f.n_en = json_array_size(en);
            f.en = js_alloc(b, (f.n_en ? f.n_en : 1) * sizeof *f.en);
            if (!f.en) return b->st;
            for (size_t i = 0; i < f.n_en; i++) f.en[i] = json_array_get(en, i);
            bool empty;
            if (conj_and(b, &e, &f, &e, &empty)) return b->st;
        }
        bool empty;
        jconj r;
        if (conj_and(b, c, &e, &r, &empty)) return b->st;
        *c = r;
    }
    return b->st;
}

/* $ref, or $dynamicRef where its target does not depend on the dynamic
 * scope: it names no $dynamicAnchor, or the only one of its name in the
 * document (remote documents being refused, no other can be in scope). */
static keel_status norm_ref(jsb *b, json_t *s, const char *kw, int depth, jdnf *out)
{
    const char *where = js_path(b, s);
    json_t *r = json_object_get(s, kw);
    if (!json_is_string(r)) return js_refuse(b, where, "'%s' must be a string", kw);
    json_t *t = js_resolve_ref(b, s, json_string_value(r));
    if (!t) return b->st;
    const char *frag = strchr(json_string_value(r), '#');
    json_t *da = json_object_get(t, "$dynamicAnchor");
    if (kw[1] == 'd' && frag && frag[1] && frag[1] != '/' && json_is_string(da) &&
        strcmp(json_string_value(da), frag + 1) == 0) {
        int n = 0;
        size_t fl = strlen(frag);
        for (int i = 0; i < b->n_res; i++) {
            size_t ul = strlen(b->res[i].uri);
            n += b->res[i].dyn && ul >= fl && strcmp(b->res[i].uri + ul - fl, frag) == 0;
        }
        if (n > 1) return js_refuse(b, where, "'$dynamicRef' whose target depends on the dynamic scope is not supported");
    }
    for (int i = 0; i < b->n_stack; i++)
        if (b->stack[i] == t)
            return js_refuse(b, where, "a '$ref' cycle that never reaches a schema");
    /* the target is normalized in place, even when its own rule is being
     * emitted: normalizing never enters sub-schemas (items, property
     * values), which become rules memoized by their members, so recursion
     * ends at the first list met again, one level below, and a recursive
     * $ref combines with other keywords like any other */
    return norm(b, t, depth + 1, out);
}

static bool dnf_evaluates(const jdnf *x)
{
    for (int i = 0; i < x->n; i++) {
        const jconj *c = &x->c[i];
        if (c->eval_pre || c->eval_items || c->eval_contains) return true;
        for (int g = 0; g < c->n_grp; g++)
            if (!c->grp[g].noeval) return true;
    }
    return false;
}

/* Drops the object kind of conjunctions where a required name's
 * property schemas share no value (tagged unions: "kind": {"const": "a"}
 * against {"const": "b"}; a name another branch's additionalProperties
 * false forbids), and the conjunctions left with no kind. Groups with
 * patterns are only looked at through properties: enough to prove
 * emptiness. */
static keel_status dnf_prune_objects(jsb *b, jdnf *t, int depth)
{
    int n = 0;
    for (int i = 0; i < t->n; i++) {
        jconj *c = &t->c[i];
        for (int r = 0; r < c->n_req && (c->kinds & JK_OBJ) && !b->st; r++) {
            json_t *v[64];
            int nv = 0;
            for (int g = 0; g < c->n_grp && nv < 64; g++) {
                json_t *p = json_object_get(c->grp[g].props, c->req[r]);
                if (p) v[nv++] = p;
                else if (c->grp[g].addl && !json_object_size(c->grp[g].pats)) v[nv++] = c->grp[g].addl;
            }
            if (nv < 2) continue;
            jdnf x;
            if (js_norm_list(b, (jsl){v, nv}, depth + 1, &x)) return b->st;
            if (x.n == 0) c->kinds &= ~(unsigned)JK_OBJ;
        }
        if (c->kinds) t->c[n++] = *c;
    }
    t->n = n;
    return b->st;
}

/* A refusal that a caller can work around: its reason (without the
 * "json schema: " prefix) into why, and the builder's status cleared;
 * false for other failures (out of memory, caps), which stand. */
static bool soft_fail(jsb *b, char *why)
{
    if (b->st != KEEL_EUNSUPPORTED) return false;
    const char *m = b->err ? b->err : "";
    if (strncmp(m, "json schema: ", 13) == 0) m += 13;
    if (!why[0]) snprintf(why, BASE_ERR_CAP, "%s", m);
    b->st = KEEL_OK;
    return true;
}

static keel_status norm_list_of(jsb *b, json_t *s, const char *kw, int depth, jdnf *r, int mode)
{
    const char *where = js_path(b, s);
    json_t *a = json_object_get(s, kw);
    if (!json_is_array(a) || json_array_size(a) == 0)
        return js_refuse(b, where, "'%s' must be a non-empty array of schemas", kw);
    size_t n = json_array_size(a);
    if (mode == 0) { /* allOf */
        for (size_t i = 0; i < n; i++) {
            jdnf x;
            if (norm(b, json_array_get(a, i), depth + 1, &x) || dnf_and(b, r, &x, r, where)) return b->st;
        }
        return KEEL_OK;
    }
    jdnf u = {NULL, 0};
    if (mode == 1) { /* anyOf */
        jdnf x[16];
        int n_eval = 0;
        if (n > 16) return js_refuse(b, where, "'anyOf' with more than 16 branches is not supported");
        for (size_t i = 0; i < n; i++) {
            if (norm(b, json_array_get(a, i), depth + 1, &x[i])) return b->st;
            n_eval += dnf_evaluates(&x[i]);
        }
        bool exact = true;
        if (b->uneval && n_eval > 0 && n > 1) {
            /* the evaluated members depend on which branches hold: one
             * disjunct per non-empty set of holding branches */
            if (n > 4) exact = false;
            jdnf nx[4];
            char why[BASE_ERR_CAP] = "";
            for (size_t i = 0; i < n && exact; i++)
                if (dnf_not(b, &x[i], &nx[i], where)) exact = false;
            for (unsigned m = 1; exact && m < (1u << n); m++) {
                jconj all;
                conj_init(&all, where);
                jdnf t;
                if (dnf_one(b, &all, &t)) return b->st;
                for (size_t i = 0; i < n && !b->st; i++) dnf_and(b, &t, (m >> i) & 1u ? &x[i] : &nx[i], &t, where);
                if (!b->st) dnf_or(b, &u, &t, &u, where);
                if (b->st) exact = false;
            }
            if (!exact) {
                if (b->st && !soft_fail(b, why)) return b->st;
                u.n = 0;
            } else {
                return dnf_and(b, r, &u, r, where);
            }
        }
        for (size_t i = 0; i < n; i++) {
            if (dnf_or(b, &u, &x[i], &u, where)) return b->st;
        }
        if (n_eval > 0 && n > 1)
            for (int i = 0; i < u.n; i++) u.c[i].inexact = true;
        return dnf_and(b, r, &u, r, where);
    }
    /* oneOf: branch i and no other branch */
    if (n > 16) return js_refuse(b, where, "'oneOf' with more than 16 branches is not supported");
    jdnf x[16], nx[16];
    for (size_t i = 0; i < n; i++)
        if (norm(b, json_array_get(a, i), depth + 1, &x[i])) return b->st;
    char why[BASE_ERR_CAP] = "";
    bool exact = true;
    for (size_t i = 0; i < n && exact; i++) {
        if (dnf_not(b, &x[i], &nx[i], where)) {
            if (!soft_fail(b, why)) return b->st;
            exact = false;
        }
    }
    if (exact) {
        for (size_t i = 0; i < n; i++) {
            jdnf t = x[i];
            for (size_t j = 0; j < n && !b->st; j++)
                if (j != i) dnf_and(b, &t, &nx[j], &t, where);
            if (b->st) {
                if (!soft_fail(b, why)) return b->st;
                exact = false;
                break;
            }
            if (dnf_or(b, &u, &t, &u, where)) return b->st;
        }
    }
    if (!exact) {
        /* a plain union when the branches share no value (their pairwise intersections are empty) */
        u.n = 0;
        for (size_t i = 0; i < n; i++)
            for (size_t j = i + 1; j < n; j++) {
                jdnf t;
                if (dnf_and(b, &x[i], &x[j], &t, where) || dnf_prune_objects(b, &t, depth)) return b->st;
                if (t.n)
                    return js_refuse(b, where, "'oneOf' whose branches may overlap and cannot be complemented is not supported (%.200s)", why);
            }
        for (size_t i = 0; i < n; i++)
            if (dnf_or(b, &u, &x[i], &u, where)) return b->st;
    }
    return dnf_and(b, r, &u, r, where);
}

/* The conjunction: objects without name (any value that is not an object, or an object without it). */
static keel_status absent_dnf(jsb *b, const char *name, const char *where, jconj *c)
{
    conj_init(c, where);
    c->grp = js_alloc(b, sizeof(jgroup));
    if (!c->grp) return b->st;
    char key[600];
    snprintf(key, sizeof key, "absent:%.500s", name);
    c->grp[0].props = synth(b, key, json_pack("{s:b}", name, 0));
    c->grp[0].noeval = true;
    c->n_grp = 1;
    return b->st;
}

/* unevaluatedProperties u on conjunction c: the members no evaluating
 * group of c names or matches take u (as additionalProperties would). */
static keel_status uneval_props(jsb *b, jconj *c, json_t *u, const char *where)
{
    if (c->inexact)
        return js_refuse(b, where, "'unevaluatedProperties' where 'anyOf' branches may each evaluate members is not supported");
    for (int g = 0; g < c->n_grp; g++)
        if (!c->grp[g].noeval && c->grp[g].eval_all) return KEEL_OK;
    json_t *props = json_object(), *pats = json_object();
    if (!props || !pats) {
        json_decref(props);
        json_decref(pats);
        return js_oom(b);
    }
    for (int g = 0; g < c->n_grp; g++) {
        if (c->grp[g].noeval) continue;
        const char *k;
        json_t *v;
        json_object_foreach(c->grp[g].props, k, v) if (json_object_set(props, k, json_true())) goto oom;
        json_object_foreach(c->grp[g].pats, k, v) if (json_object_set(pats, k, json_true())) goto oom;
    }
    jgroup *ng = js_alloc(b, (size_t)(c->n_grp + 1) * sizeof *ng);
    char key[64];
    if (!ng) goto oom;
    if (c->n_grp) memcpy(ng, c->grp, (size_t)c->n_grp * sizeof *ng);
    snprintf(key, sizeof key, "uneval-props:%d", b->n_syn);
    ng[c->n_grp].props = synth(b, key, props);
    snprintf(key, sizeof key, "uneval-pats:%d", b->n_syn);
    ng[c->n_grp].pats = synth(b, key, pats);
    ng[c->n_grp].addl = json_is_true(u) ? NULL : u;
    ng[c->n_grp].eval_all = true;
    c->grp = ng;
    c->n_grp++;
    return b->st;
oom:
    json_decref(props);
    json_decref(pats);
    return js_oom(b);
}

/* unevaluatedItems u on c: the elements past the evaluated prefix take u. */
static keel_status uneval_items(jsb *b, jconj *c, json_t *u, const char *where)
{
    if (c->eval_items || json_is_true(u)) {
        c->eval_items = true;
        return KEEL_OK;
    }
    if (c->inexact)
        return js_refuse(b, where, "'unevaluatedItems' where 'anyOf' branches may each evaluate elements is not supported");
    jconj t;
    conj_init(&t, where);
    t.n_pre = c->eval_pre;
    if (t.n_pre) {
        t.pre = js_alloc(b, (size_t)t.n_pre * sizeof *t.pre);
        if (!t.pre) return b->st;
    }
    t.items = jsl_one(b, u);
    if (c->eval_contains) {
        /* an element past the prefix matches an evaluating contains, or u */
        json_t *any = json_array();
        char key[2048];
        size_t kn = (size_t)snprintf(key, sizeof key, "uneval-items:%p:", (void *)u);
        for (int i = 0; any && i < c->n_ct; i++) {
            if (!c->ct[i].eval) continue;
            if (json_array_append(any, c->ct[i].s)) {
                json_decref(any);
                any = NULL;
            } else if (kn + 20 < sizeof key) {
                kn += (size_t)snprintf(key + kn, sizeof key - kn, "%p,", (void *)c->ct[i].s);
            }
        }
        if (any && json_array_append(any, u)) {
            json_decref(any);
            any = NULL;
        }
        if (kn + 20 >= sizeof key) {
            json_decref(any);
            return js_refuse(b, where, "'unevaluatedItems' beside too many 'contains'");
        }
        json_t *node = synth(b, key, any ? json_pack("{s:o}", "anyOf", any) : NULL);
        if (!node) return b->st;
        t.items = jsl_one(b, node);
    }
    bool empty;
    jconj r;
    if (conj_and(b, c, &t, &r, &empty)) return b->st;
    *c = r;
    c->eval_items = true;
    return KEEL_OK;
}

static keel_status norm(jsb *b, json_t *s, int depth, jdnf *out)
{
    if (b->st) return b->st;
    const char *where = js_path(b, s);
    out->c = NULL;
    out->n = 0;
    if (depth > JS_MAX_DEPTH) return js_refuse(b, where, "schemas nested more than %d deep", JS_MAX_DEPTH);
    /* references are normalized where they are used: bound the total work
     * (a chain of definitions each using the previous twice doubles it) */
    if (++b->n_norm > JS_MAX_NORM) return js_refuse(b, where, "a schema that needs more than %d normalization steps", JS_MAX_NORM);
    jconj c;
    if (json_is_true(s)) {
        conj_init(&c, where);
        return dnf_one(b, &c, out);
    }
    if (json_is_false(s)) return KEEL_OK;
    if (!json_is_object(s)) return js_refuse(b, where, "a schema must be an object or a boolean");
    const char *k;
    json_t *v;
    json_object_foreach(s, k, v) {
        bool ok = known_annotation(k);
        for (int i = 0; !ok && g_handled[i]; i++) ok = strcmp(k, g_handled[i]) == 0;
        if (!ok) return js_refuse(b, where, "keyword '%.64s' is not supported", k);
    }
    if (b->n_stack >= JS_MAX_DEPTH) return js_refuse(b, where, "schemas nested more than %d deep", JS_MAX_DEPTH);
    b->stack[b->n_stack++] = s;
    jdnf r = {NULL, 0};
    if (base_conj(b, s, where, &c) || dnf_one(b, &c, &r)) goto done;
    if (c.kinds == 0) {
        r.n = 0;
        goto done;
    }
    static const char *const refs[] = {"$ref", "$dynamicRef"};
    for (int i = 0; i < 2; i++)
        if (json_object_get(s, refs[i])) {
            jdnf x;
            if (norm_ref(b, s, refs[i], depth, &x) || dnf_and(b, &r, &x, &r, where)) goto done;
        }
    if (json_object_get(s, "allOf") && norm_list_of(b, s, "allOf", depth, &r, 0)) goto done;
    if (json_object_get(s, "anyOf") && norm_list_of(b, s, "anyOf", depth, &r, 1)) goto done;
    if (json_object_get(s, "oneOf") && norm_list_of(b, s, "oneOf", depth, &r, 2)) goto done;
    if ((v = json_object_get(s, "not"))) {
        jdnf x;
        if (norm(b, v, depth + 1, &x) || dnf_not(b, &x, &x, where) || dnf_and(b, &r, &x, &r, where)) goto done;
    }
    if ((v = json_object_get(s, "if"))) {
        json_t *th = json_object_get(s, "then"), *el = json_object_get(s, "else");
        if (th || el || b->uneval) { /* if alone: its annotations count where it holds */
            jdnf xi, xn, xt, xe, u;
            conj_init(&c, where);
            jdnf all;
            if (dnf_one(b, &c, &all) || norm(b, v, depth + 1, &xi) || dnf_not(b, &xi, &xn, where)) goto done;
            xt = all;
            xe = all;
            if ((th && norm(b, th, depth + 1, &xt)) || (el && norm(b, el, depth + 1, &xe))) goto done;
            if (dnf_and(b, &xi, &xt, &xt, where) || dnf_and(b, &xn, &xe, &xe, where) || dnf_or(b, &xt, &xe, &u, where) ||
                dnf_and(b, &r, &u, &r, where))
                goto done;
        }
    }
    if ((v = json_object_get(s, "dependentRequired"))) {
        if (!json_is_object(v)) {
            js_refuse(b, where, "'dependentRequired' must be an object");
            goto done;
        }
        json_t *names;
        json_object_foreach(v, k, names) {
            jconj two[2];
            if (!json_is_array(names)) {
                js_refuse(b, where, "'dependentRequired' must map names to arrays of names");
                goto done;
            }
            if (absent_dnf(b, k, where, &two[0])) goto done;
            conj_init(&two[1], where);
            two[1].kinds = JK_OBJ;
            two[1].n_req = (int)json_array_size(names) + 1;
            two[1].req = js_alloc(b, (size_t)two[1].n_req * sizeof(char *));
            if (!two[1].req) goto done;
            two[1].req[0] = k;
            for (size_t i = 0; i < json_array_size(names); i++)
                if (!(two[1].req[i + 1] = json_string_value(json_array_get(names, i)))) {
                    js_refuse(b, where, "'dependentRequired' must map names to arrays of names");
                    goto done;
                }
            jdnf u = {two, 2};
            if (dnf_and(b, &r, &u, &r, where)) goto done;
        }
    }
    if ((v = json_object_get(s, "dependentSchemas"))) {
        if (!json_is_object(v)) {
            js_refuse(b, where, "'dependentSchemas' must be an object");
            goto done;
        }
        json_t *ds;
        json_object_foreach(v, k, ds) {
            jconj two[2];
            if (absent_dnf(b, k, where, &two[0])) goto done;
            conj_init(&two[1], where);
            two[1].kinds = JK_OBJ;
            two[1].n_req = 1;
            two[1].req = js_alloc(b, sizeof(char *));
            if (!two[1].req) goto done;
            two[1].req[0] = k;
            jdnf p = {&two[1], 1}, x, u, a = {&two[0], 1};
            if (norm(b, ds, depth + 1, &x) || dnf_and(b, &p, &x, &x, where) || dnf_or(b, &a, &x, &u, where) ||
                dnf_and(b, &r, &u, &r, where))
                goto done;
        }
    }
    json_t *uep = json_object_get(s, "unevaluatedProperties"), *uei = json_object_get(s, "unevaluatedItems");
    if ((uep && !json_is_object(uep) && !json_is_boolean(uep)) || (uei && !json_is_object(uei) && !json_is_boolean(uei))) {
        js_refuse(b, where, "'unevaluatedProperties' / 'unevaluatedItems' must be schemas");
        goto done;
    }
    for (int i = 0; i < r.n && !b->st; i++) {
        if (uep && (r.c[i].kinds & JK_OBJ)) uneval_props(b, &r.c[i], uep, where);
        if (uei && (r.c[i].kinds & JK_ARR)) uneval_items(b, &r.c[i], uei, where);
    }
done:
    b->n_stack--;
    if (!b->st) *out = r;
    return b->st;
}

keel_status js_norm_list(jsb *b, jsl l, int depth, jdnf *out)
{
    jconj c;
    conj_init(&c, l.n ? js_path(b, l.v[0]) : "/");
    if (dnf_one(b, &c, out)) return b->st;
    for (int i = 0; i < l.n; i++) {
        jdnf x;
        if (norm(b, l.v[i], depth, &x) || dnf_and(b, out, &x, out, js_path(b, l.v[i]))) return b->st;
    }
    return b->st;
}

/* ---- the interface ------------------------------------------------------------------------- */

static const char g_json_rules[] =
    "value ::= object | array | string | number | \"true\" | \"false\" | \"null\"\n"
    "object ::= \"{\" ws ( string ws \":\" ws value ( ws \",\" ws string ws \":\" ws value )* )? ws \"}\"\n"
    "array ::= \"[\" ws ( value ( ws \",\" ws value )* )? ws \"]\"\n"
    "string ::= \"\\\"\" char* \"\\\"\"\n"
    "char ::= [^\"\\\\\\x00-\\x1f] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} )\n"
    "integer ::= \"-\"? ( \"0\" | [1-9] [0-9]* )\n"
    "number ::= integer ( \".\" [0-9]+ )? ( [eE] [-+]? [0-9]+ )?\n"
    "ws ::= [ \\t\\n\\r]{0,20}\n";

static void jsb_free(jsb *b)
{
    js_sfree(&b->out);
    while (b->ar) {
        arblk *k = b->ar;
        b->ar = k->next;
        base_free(k, sizeof *k + k->cap);
    }
    base_free(b->info, JS_MAX_INFO * 2 * sizeof *b->info);
    base_free(b->res, JS_MAX_RES * sizeof *b->res);
    base_free(b->memo, JS_MAX_MEMO * sizeof *b->memo);
    base_free(b->syn, JS_MAX_MEMO * sizeof *b->syn);
    json_decref(b->synth);
    json_decref(b->root);
}

keel_status gram_schema_gbnf(const char *schema, size_t len, char **gbnf, size_t *n_gbnf, char *err)
{
    if (!gbnf || !n_gbnf) return base_err(err, KEEL_EINVAL, "json schema: out is NULL");
    *gbnf = NULL;
    *n_gbnf = 0;
    json_error_t je;
    json_t *s = json_loadb(schema ? schema : "", len, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
    if (!s) return base_err(err, KEEL_EFORMAT, "json schema: not JSON: %s (line %d col %d)", je.text, je.line, je.column);
    jsb b;
    memset(&b, 0, sizeof b);
    b.err = err;
    b.root = s;
    b.synth = json_array();
    b.info = base_calloc(JS_MAX_INFO * 2, sizeof *b.info);
    b.res = base_calloc(JS_MAX_RES, sizeof *b.res);
    b.memo = base_calloc(JS_MAX_MEMO, sizeof *b.memo);
    b.syn = base_calloc(JS_MAX_MEMO, sizeof *b.syn);
    if (!b.synth || !b.info || !b.res || !b.memo || !b.syn) {
        js_oom(&b);
    } else if (!js_index(&b, s, "", "", 0)) {
        /* a document without $id is the resource "" (references "#..." name it) */
        keel_status st0 = KEEL_OK;
        if (json_is_object(s) && !json_is_string(json_object_get(s, "$id"))) st0 = js_add_res(&b, "", s, "/", false);
        int64_t root = JR_NONE;
        json_t *one[1] = {s};
        jsl l = {one, 1};
        if (!st0 && !js_emit_list(&b, l, 0, &root)) {
            /* nothing is valid: a grammar of the empty language (every text
             * rejected; generation under it is refused by the engine) */
            if (root == JR_NONE) js_sputs(&b, &b.out, "root ::= [^\\x00-\\U0010FFFF]\n");
            else if (root == JR_ANY) js_sputs(&b, &b.out, "root ::= value\n");
            else js_sputf(&b, &b.out, "root ::= s%lld\n", (long long)root);
            js_sputs(&b, &b.out, g_json_rules);
        }
    }
    keel_status st = b.st;
    char *out = NULL;
    size_t n = b.out.n;
    if (!st) {
        /* hand over an exactly sized copy (callers free n + 1 bytes) */
        out = base_alloc(n + 1);
        if (!out) st = base_err(err, KEEL_ENOMEM, "json schema: out of memory");
        else memcpy(out, b.out.d, n + 1);
    }
    jsb_free(&b);
    if (st) return st;
    *gbnf = out;
    *n_gbnf = n;
    return KEEL_OK;
}

keel_status gram_compile_schema(const char *schema, size_t len, gram **out, char *err)
{
    if (!out) return base_err(err, KEEL_EINVAL, "json schema: out is NULL");
    *out = NULL;
    char *g = NULL;
    size_t n = 0;
    keel_status st = gram_schema_gbnf(schema, len, &g, &n, err);
    if (st) return st;
    st = gram_compile(g, n, out, err);
    base_free(g, n + 1);
    return st;
}
