/*
 * jinja_ops.c — operations on Jinja values with Python's semantics: ==,
 * ordering and `in`, len() and iteration, arithmetic, attribute and item
 * access as jinja2's sandboxed environment resolves them, and the loop
 * object. Walks stop at JV_MAX_DEPTH (jinja_value.c's invariants).
 */
#include "jinja_int.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

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
            if (!jsb_add(&b, s->s, s->n)) return jsb_status(x, &b);
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
            if (!jsb_add(&sb, s->s + off[p], off[p + 1] - off[p])) return jsb_status(x, &sb);
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
