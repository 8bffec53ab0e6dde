/*
 * jinja_eval.c — the evaluator: runs a template's AST against a render
 * context. Owns scoping (jinja2's: for-loop bodies, macros, call blocks,
 * filter/set blocks and with get their own scope; if does not; a for-loop
 * body starts each iteration afresh), output sinks (macro bodies and set
 * blocks render into their own buffer), loops with jinja2's LoopContext
 * semantics (lazy filtering, one-item lookahead for loop.last), macros and
 * calls, and the public entry jinja_render.
 *
 * Bounds: x->depth counts nested evaluation (statements, expressions, calls)
 * against limits.max_depth; the AST's own height was bounded when it was
 * compiled (JINJA_MAX_HEIGHT); binary-operator chains and elif chains are
 * walked in loops. Steps (iterations, calls) are counted against max_steps.
 */
#include "jinja_int.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

jinja_limits jinja_limits_default(void)
{
    jinja_limits l;
    l.max_output = (size_t)64 << 20;
    l.max_memory = (size_t)256 << 20;
    l.max_steps = 50 * 1000 * 1000; /* about a second of the simplest loop */
    l.max_depth = 200;
    return l;
}

static keel_status exec_list(jx *x, jscope *sc, const jnode *n);
static keel_status eval(jx *x, jscope *sc, const jnode *n, jv *out);

/* ---- scopes ------------------------------------------------------------------ */

static jscope *scope_new(jx *x, jscope *parent)
{
    jscope *s = jmem_zalloc(&x->mem, sizeof *s);
    if (s) s->parent = parent;
    return s;
}

static keel_status scope_set(jx *x, jscope *s, const jstr *name, jv v)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->names[i] == name) {
            s->vals[i] = v;
            return KEEL_OK;
        }
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 4;
        const jstr **nm = jmem_alloc_n(&x->mem, cap, sizeof *nm);
        jv *vals = jmem_alloc_n(&x->mem, cap, sizeof *vals);
        if (!nm || !vals) return jx_oom(x);
        if (s->n) {
            memcpy(nm, s->names, s->n * sizeof *nm);
            memcpy(vals, s->vals, s->n * sizeof *vals);
        }
        s->names = nm;
        s->vals = vals;
        s->cap = cap;
    }
    s->names[s->n] = name;
    s->vals[s->n] = v;
    s->n++;
    return KEEL_OK;
}

static jv lookup(jx *x, jscope *sc, const jstr *name)
{
    for (jscope *s = sc; s; s = s->parent)
        for (size_t i = s->n; i > 0; i--)
            if (s->names[i - 1] == name) return s->vals[i - 1];
    if (x->vars) {
        int64_t i = jdict_find_str(x->vars, name->s, name->n);
        if (i >= 0) return x->vars->v[i];
    }
    jfn g = jinja_global_id(name);
    if (g != JF_NONE) return jv_func(g, NULL);
    return jv_undef_name(x, name);
}

/* ---- depth --------------------------------------------------------------------- */

static keel_status deeper(jx *x)
{
    if (++x->depth > x->lim.max_depth)
        return jx_fail(x, KEEL_EOVERFLOW, "nested more than %d levels deep when run (recursion?)",
                       x->lim.max_depth);
    if (jinja_stack_used(x->stack_base) > JINJA_STACK_BUDGET)
        return jx_fail(x, KEEL_EOVERFLOW, "nested too deeply when run (%d KiB of stack used)",
                       JINJA_STACK_BUDGET / 1024);
    return KEEL_OK;
}

/* ---- argument binding ----------------------------------------------------------- */

keel_status jargs_bind(jx *x, const char *fname, const jargs *a, const char *const *names,
                       size_t n_names, jv *out)
{
    if (a->n_pos > n_names)
        return jx_fail(x, KEEL_EINVAL, "%s() takes at most %zu argument%s (%zu given)", fname,
                       n_names, n_names == 1 ? "" : "s", a->n_pos);
    for (size_t i = 0; i < a->n_pos; i++) out[i] = a->pos[i];
    for (size_t k = 0; k < a->n_kw; k++) {
        size_t i;
        for (i = 0; i < n_names; i++)
            if (jstr_eqc(a->kw_names[k], names[i])) break;
        if (i == n_names)
            return jx_fail(x, KEEL_EINVAL, "%s() got an unexpected keyword argument '%.*s'", fname,
                           (int)a->kw_names[k]->n, a->kw_names[k]->s);
        if (i < a->n_pos)
            return jx_fail(x, KEEL_EINVAL, "%s() got multiple values for argument '%s'", fname,
                           names[i]);
        out[i] = a->kw[k];
    }
    return KEEL_OK;
}

/* Evaluates call arguments (positional, name=, *list, **dict). */
static JX_NOINLINE keel_status eval_args(jx *x, jscope *sc, const jnode *args, jargs *a, size_t extra_kw)
{
    size_t np = 0, nk = extra_kw;
    for (const jnode *n = args; n; n = n->next) {
        if (n->kind == JK_KWARG)
            nk++;
        else if (n->kind != JK_STARARG && n->kind != JK_DSTARARG)
            np++;
    }
    memset(a, 0, sizeof *a);
    /* starred arguments are counted when they are known */
    jv *pos = np ? jmem_alloc_n(&x->mem, np, sizeof(jv)) : NULL;
    const jstr **kn = nk ? jmem_alloc_n(&x->mem, nk, sizeof *kn) : NULL;
    jv *kv = nk ? jmem_alloc_n(&x->mem, nk, sizeof(jv)) : NULL;
    if ((np && !pos) || (nk && (!kn || !kv))) return jx_oom(x);
    size_t ip = 0, ik = 0, cap_p = np, cap_k = nk;
    for (const jnode *n = args; n; n = n->next) {
        jv v;
        if (n->kind == JK_KWARG) {
            TRY(eval(x, sc, n->a, &v));
            kn[ik] = n->name;
            kv[ik++] = v;
        } else if (n->kind == JK_STARARG || n->kind == JK_DSTARARG) {
            TRY(eval(x, sc, n->a, &v));
            x->line = n->line;
            if (n->kind == JK_STARARG) {
                jv *items = NULL;
                size_t cnt;
                TRY(jv_iter(x, v, &items, &cnt));
                jv *np2 = jmem_alloc_n(&x->mem, cap_p + cnt + 1, sizeof(jv));
                if (!np2) return jx_oom(x);
                if (ip) memcpy(np2, pos, ip * sizeof(jv));
                if (cnt) memcpy(np2 + ip, items, cnt * sizeof(jv));
                pos = np2;
                ip += cnt;
                cap_p += cnt;
            } else {
                if (v.t != JT_DICT)
                    return jx_fail(x, KEEL_EINVAL, "argument after ** must be a mapping, not %s",
                                   jv_type_name(v));
                const jdict *d = v.u.d;
                const jstr **kn2 = jmem_alloc_n(&x->mem, cap_k + d->n + 1, sizeof *kn2);
                jv *kv2 = jmem_alloc_n(&x->mem, cap_k + d->n + 1, sizeof(jv));
                if (!kn2 || !kv2) return jx_oom(x);
                if (ik) {
                    memcpy(kn2, kn, ik * sizeof *kn2);
                    memcpy(kv2, kv, ik * sizeof(jv));
                }
                for (size_t i = 0; i < d->n; i++) {
                    if (d->k[i].t != JT_STR)
                        return jx_fail(x, KEEL_EINVAL, "keywords must be strings");
                    kn2[ik] = d->k[i].u.s;
                    kv2[ik++] = d->v[i];
                }
                kn = kn2;
                kv = kv2;
                cap_k += d->n;
            }
        } else {
            TRY(eval(x, sc, n, &v));
            pos[ip++] = v;
        }
    }
    a->pos = pos;
    a->n_pos = ip;
    a->kw_names = kn;
    a->kw = kv;
    a->n_kw = ik;
    return KEEL_OK;
}

/* ---- output --------------------------------------------------------------------- */

static keel_status out_status(jx *x, const jsb *b)
{
    if (b->over)
        return jx_fail(x, KEEL_EOVERFLOW, JINJA_ERR_OUTPUT " %zu bytes", b->max);
    return jx_oom(x);
}

static keel_status emit(jx *x, const char *s, size_t n)
{
    if (!jsb_add(x->out, s, n)) return out_status(x, x->out);
    return KEEL_OK;
}

/* Runs body into a new buffer; *out is the text. */
static JX_NOINLINE keel_status capture(jx *x, jscope *sc, const jnode *body, jstr **out)
{
    jsb b, *save = x->out;
    jsb_init(&b, &x->mem, x->lim.max_output);
    x->out = &b;
    keel_status st = exec_list(x, sc, body);
    x->out = save;
    if (st != KEEL_OK) return st;
    *out = jsb_done(&b);
    return *out ? KEEL_OK : jx_oom(x);
}

/* ---- macros --------------------------------------------------------------------- */

static JX_NOINLINE keel_status call_macro(jx *x, jmacro *m, const jargs *a, jv *out)
{
    const jnode *def = m->def;
    const char *mname = def->kind == JK_CALLBLOCK ? "caller" : def->name->s;
    TRY(jx_step(x));
    TRY(deeper(x));
    jscope *sc = scope_new(x, m->closure);
    if (!sc) return jx_oom(x);
    size_t n_params = 0;
    for (const jnode *p = def->a; p; p = p->next) n_params++;
    /* positional */
    const jnode *p = def->a;
    size_t i = 0;
    for (; i < a->n_pos && p; i++, p = p->next) TRY(scope_set(x, sc, p->name, a->pos[i]));
    jlist *varargs = NULL;
    if (i < a->n_pos) {
        if (!(def->op & JM_VARARGS))
            return jx_fail(x, KEEL_EINVAL, "macro '%s' takes not more than %zu argument(s)", mname,
                           n_params);
        varargs = jv_list_copy(x, a->pos + i, a->n_pos - i, JL_TUPLE);
        if (!varargs) return jx_oom(x);
    }
    /* keywords */
    jdict *kwargs = NULL;
    jv caller = jv_undef();
    bool have_caller = false;
    for (size_t k = 0; k < a->n_kw; k++) {
        const jstr *kn = a->kw_names[k];
        const jnode *q;
        size_t qi = 0;
        for (q = def->a; q; q = q->next, qi++)
            if (jstr_eq(q->name, kn)) break;
        if (q) {
            if (qi < a->n_pos)
                return jx_fail(x, KEEL_EINVAL, "macro '%s' got multiple values for argument '%.*s'",
                               mname, (int)kn->n, kn->s);
            TRY(scope_set(x, sc, q->name, a->kw[k]));
        } else if (jstr_eqc(kn, "caller") && (def->op & JM_CALLER)) {
            caller = a->kw[k];
            have_caller = true;
        } else if (def->op & JM_KWARGS) {
            if (!kwargs && !(kwargs = jdict_new(&x->mem, 0))) return jx_oom(x);
            if (!jdict_set(&x->mem, kwargs, jv_strv((jstr *)kn), a->kw[k])) return jx_oom(x);
        } else {
            return jx_fail(x, KEEL_EINVAL, "macro '%s' takes no keyword argument '%.*s'", mname,
                           (int)kn->n, kn->s);
        }
    }
    /* defaults, evaluated in the macro's scope (they may use earlier ones) */
    for (p = def->a; p; p = p->next) {
        bool set = false;
        for (size_t k = 0; k < sc->n; k++)
            if (sc->names[k] == p->name) set = true;
        if (set) continue;
        jv v;
        if (p->a) {
            TRY(eval(x, sc, p->a, &v));
        } else {
            v = jv_undef_name(x, p->name);
        }
        TRY(scope_set(x, sc, p->name, v));
    }
    if (def->op & JM_VARARGS) {
        if (!varargs && !(varargs = jlist_new(&x->mem, 0, JL_TUPLE))) return jx_oom(x);
        TRY(scope_set(x, sc, x->t->names.varargs, jv_listv(varargs)));
    }
    if (def->op & JM_KWARGS) {
        if (!kwargs && !(kwargs = jdict_new(&x->mem, 0))) return jx_oom(x);
        TRY(scope_set(x, sc, x->t->names.kwargs, jv_dictv(kwargs)));
    }
    if (def->op & JM_CALLER) {
        if (!have_caller) caller = m->caller;
        TRY(scope_set(x, sc, x->t->names.caller, caller));
    }
    int flow = x->flow;
    x->flow = JFLOW_NONE;
    jstr *s = NULL;
    keel_status st = capture(x, sc, def->c, &s);
    x->flow = flow;
    x->depth--;
    if (st != KEEL_OK) return st;
    *out = jv_strv(s); /* plain str: macros return Markup only under autoescape */
    return KEEL_OK;
}

static JX_NOINLINE keel_status run_for(jx *x, jscope *sc, const jnode *f, jv iter, int32_t depth0);

/* loop(items) in a recursive for loop: the body over items, one level deeper. */
static JX_NOINLINE keel_status call_loop(jx *x, jloop *lp, const jargs *a, jv *out)
{
    if (!lp->fornode || !lp->fornode->op)
        return jx_fail(x, KEEL_EINVAL,
                       "Tried to call non recursive loop.  Maybe you forgot the 'recursive' "
                       "modifier.");
    if (a->n_pos != 1 || a->n_kw) return jx_fail(x, KEEL_EINVAL, "loop() takes exactly one argument");
    jsb b, *save = x->out;
    jsb_init(&b, &x->mem, x->lim.max_output);
    x->out = &b;
    TRY(deeper(x));
    keel_status st = run_for(x, lp->outer, lp->fornode, a->pos[0], lp->depth0 + 1);
    x->depth--;
    x->out = save;
    if (st != KEEL_OK) return st;
    jstr *s = jsb_done(&b);
    if (!s) return jx_oom(x);
    *out = jv_strv(s);
    return KEEL_OK;
}

keel_status jx_call(jx *x, jv fn, const jargs *a, jv *out)
{
    switch (fn.t) {
    case JT_MACRO:
        return call_macro(x, fn.u.m, a, out);
    case JT_FUNC:
        return jinja_builtin_call(x, (jfn)fn.fn, fn.u.bound ? fn.u.bound->self : jv_undef(), a,
                                  out);
    case JT_JOINER: {
        jcycler *j = fn.u.cy;
        *out = jv_strv(j->used ? j->sep : JSTR_EMPTY);
        j->used = true;
        return KEEL_OK;
    }
    case JT_LOOP:
        return call_loop(x, fn.u.loop, a, out);
    case JT_UNDEF:
        return jx_undef_error(x, fn);
    default:
        return jx_fail(x, KEEL_EINVAL, "'%s' object is not callable", jv_type_name(fn));
    }
}

/* ---- expressions ------------------------------------------------------------------ */

static JX_NOINLINE keel_status eval_call(jx *x, jscope *sc, const jnode *n, jv extra_caller, jv *out)
{
    const jnode *callee = n->a;
    jv fn, self = jv_undef();
    jfn method = JF_NONE;
    if (callee->kind == JK_ATTR) {
        /* obj.method(...): call the method without making a bound value */
        jv obj;
        TRY(eval(x, sc, callee->a, &obj));
        x->line = callee->line;
        if (obj.t == JT_UNDEF) return jx_undef_error(x, obj);
        bool unsafe = callee->name->n && callee->name->s[0] == '_';
        if (obj.t != JT_NS && obj.t != JT_LOOP && !unsafe) method = jinja_method_id(obj, callee->name);
        if (method != JF_NONE) {
            self = obj;
        } else {
            TRY(jv_getattr(x, obj, callee->name, &fn));
        }
    } else {
        TRY(eval(x, sc, callee, &fn));
    }
    jargs a;
    bool with_caller = extra_caller.t == JT_MACRO;
    TRY(eval_args(x, sc, n->b, &a, with_caller ? 1 : 0));
    if (with_caller) {
        ((const jstr **)a.kw_names)[a.n_kw] = x->t->names.caller;
        a.kw[a.n_kw++] = extra_caller;
    }
    x->line = n->line;
    if (method != JF_NONE) return jinja_builtin_call(x, method, self, &a, out);
    return jx_call(x, fn, &a, out);
}

/* value | filter(args); a NULL value node takes x's block input */
static JX_NOINLINE keel_status eval_filter(jx *x, jscope *sc, const jnode *n, jv input, jv *out)
{
    jv v;
    if (n->a) {
        if (n->a->kind == JK_FILTER)
            TRY(eval_filter(x, sc, n->a, input, &v));
        else
            TRY(eval(x, sc, n->a, &v));
    } else {
        v = input;
    }
    jargs a;
    TRY(eval_args(x, sc, n->b, &a, 0));
    x->line = n->line;
    if (n->n == 0)
        return jx_fail(x, KEEL_EINVAL, "No filter named '%.*s'.", (int)n->name->n, n->name->s);
    return jinja_filter_call(x, n->n, v, &a, out);
}

/* The one place `+` departs from jinja2: a string plus none or undefined
 * (either side) is the string, where jinja2 raises (TypeError; UndefinedError
 * from the default Undefined). llama.cpp's Jinja runtime does this
 * (binary_expression, "treating null/undefined as empty string for string
 * concatenation") and real templates rely on it: FireFunction v2 appends an
 * undefined `functions` to a string. As there, none + none, undefined +
 * undefined and none/undefined + a non-string still fail; `~` is left as
 * jinja2 has it (str() of both sides: undefined is "", none is "None"). The
 * string keeps its Markup flag. Only template `+` does this, not the sum
 * filter. */
static bool add_null_to_str(jv a, jv b, jv *out)
{
    bool a_null = a.t == JT_UNDEF || a.t == JT_NONE, b_null = b.t == JT_UNDEF || b.t == JT_NONE;
    if (a_null && b.t == JT_STR) {
        *out = b;
        return true;
    }
    if (b_null && a.t == JT_STR) {
        *out = a;
        return true;
    }
    return false;
}

/* Left-deep chains of binary operators and and/or, walked in a loop. */
static JX_NOINLINE keel_status eval_chain(jx *x, jscope *sc, const jnode *n, jv *out)
{
    size_t k = 0;
    const jnode *leaf = n;
    while (leaf->kind == JK_BIN || leaf->kind == JK_AND || leaf->kind == JK_OR) {
        leaf = leaf->a;
        k++;
    }
    const jnode *small[16], **spine = small;
    if (k > BASE_ARRAY_LEN(small)) {
        spine = jmem_alloc_n(&x->mem, k, sizeof *spine);
        if (!spine) return jx_oom(x);
    }
    size_t i = k;
    for (const jnode *c = n; c != leaf; c = c->a) spine[--i] = c; /* spine[0]: innermost */
    jv v;
    TRY(eval(x, sc, leaf, &v));
    for (i = 0; i < k; i++) {
        const jnode *op = spine[i];
        if (op->kind == JK_AND) {
            if (jv_truthy(v)) TRY(eval(x, sc, op->b, &v));
        } else if (op->kind == JK_OR) {
            if (!jv_truthy(v)) TRY(eval(x, sc, op->b, &v));
        } else {
            jv r;
            TRY(eval(x, sc, op->b, &r));
            x->line = op->line;
            if (op->op != JO_ADD || !add_null_to_str(v, r, &v)) TRY(jv_binop(x, op->op, v, r, &v));
        }
    }
    *out = v;
    return KEEL_OK;
}

static JX_NOINLINE keel_status eval_compare(jx *x, jscope *sc, const jnode *n, jv *out)
{
    jv left;
    TRY(eval(x, sc, n->a, &left));
    bool r = true;
    for (const jnode *o = n->b; o && r; o = o->next) {
        jv right;
        TRY(eval(x, sc, o->a, &right));
        x->line = o->line;
        switch (o->op) {
        case JO_EQ:
            TRY(jv_eq(x, left, right, &r));
            break;
        case JO_NE:
            TRY(jv_eq(x, left, right, &r));
            r = !r;
            break;
        case JO_IN:
            TRY(jv_contains(x, right, left, &r));
            break;
        case JO_NOTIN:
            TRY(jv_contains(x, right, left, &r));
            r = !r;
            break;
        default:
            TRY(jv_order(x, o->op, left, right, &r));
            break;
        }
        left = right;
    }
    *out = jv_bool(r);
    return KEEL_OK;
}

static JX_NOINLINE keel_status eval_unary(jx *x, const jnode *n, jv v, jv *out)
{
    x->line = n->line;
    if (v.t == JT_UNDEF) return jx_undef_error(x, v);
    int64_t i;
    if (jv_as_int(v, &i)) {
        if (n->kind == JK_NEG && i == INT64_MIN) return jx_fail(x, KEEL_EINVAL, "integer overflow");
        *out = jv_int(n->kind == JK_NEG ? -i : i);
        return KEEL_OK;
    }
    if (v.t == JT_FLOAT) {
        *out = jv_float(n->kind == JK_NEG ? -v.u.f : v.u.f);
        return KEEL_OK;
    }
    return jx_fail(x, KEEL_EINVAL, "bad operand type for unary %c: '%s'",
                   n->kind == JK_NEG ? '-' : '+', jv_type_name(v));
}

static JX_NOINLINE keel_status eval_seq(jx *x, jscope *sc, const jnode *n, jv *out)
{
    size_t cnt = 0;
    for (const jnode *c = n->a; c; c = c->next) cnt++;
    if (n->kind == JK_DICT) {
        jdict *d = jdict_new(&x->mem, cnt);
        if (!d) return jx_oom(x);
        for (const jnode *c = n->a; c; c = c->next) {
            jv k, v;
            TRY(eval(x, sc, c->a, &k));
            TRY(eval(x, sc, c->b, &v));
            uint64_t h;
            x->line = c->line;
            if (!jv_hash(k, &h, 0))
                return jx_fail(x, KEEL_EINVAL, "unhashable type: '%s'", jv_type_name(k));
            if (!jdict_set(&x->mem, d, k, v)) return jx_oom(x);
        }
        *out = jv_dictv(d);
        return KEEL_OK;
    }
    jlist *l = jlist_new(&x->mem, cnt, n->kind == JK_TUPLE ? JL_TUPLE : JL_LIST);
    if (!l) return jx_oom(x);
    for (const jnode *c = n->a; c; c = c->next) TRY(eval(x, sc, c, &l->v[l->n++]));
    *out = jv_listv(l);
    return KEEL_OK;
}

static JX_NOINLINE keel_status eval_slice(jx *x, jscope *sc, const jnode *n, jv *out)
{
    jv a = jv_undef(), s0 = jv_none(), s1 = jv_none(), s2 = jv_none();
    if (n->a) TRY(eval(x, sc, n->a, &a));
    if (n->b) TRY(eval(x, sc, n->b, &s0));
    if (n->c) TRY(eval(x, sc, n->c, &s1));
    if (n->d) TRY(eval(x, sc, n->d, &s2));
    x->line = n->line;
    if (!n->a) {
        /* a slice inside a tuple subscript (x[1:2, 3]): Python's slice object
         * fits no index or key, so the lookup gives undefined; an unhashable
         * list stands for it */
        jlist *l = jlist_new(&x->mem, 3, JL_LIST);
        if (!l) return jx_oom(x);
        l->v[0] = s0;
        l->v[1] = s1;
        l->v[2] = s2;
        l->n = 3;
        *out = jv_listv(l);
        return KEEL_OK;
    }
    return jv_slice(x, a, s0, s1, s2, out);
}

static JX_NOINLINE keel_status eval_test(jx *x, jscope *sc, const jnode *n, jv *out)
{
    jv a;
    TRY(eval(x, sc, n->a, &a));
    jargs args;
    TRY(eval_args(x, sc, n->b, &args, 0));
    x->line = n->line;
    if (n->n == 0) return jx_fail(x, KEEL_EINVAL, "No test named '%.*s'.", (int)n->name->n, n->name->s);
    bool r;
    TRY(jinja_test_call(x, n->n, a, &args, &r));
    *out = jv_bool(n->op ? !r : r);
    return KEEL_OK;
}

static keel_status eval(jx *x, jscope *sc, const jnode *n, jv *out)
{
    TRY(deeper(x));
    x->line = n->line;
    keel_status st = KEEL_OK;
    jv a, b;
    switch (n->kind) {
    case JK_CONST:
        *out = n->val;
        break;
    case JK_NAME:
        *out = lookup(x, sc, n->name);
        break;
    case JK_LIST:
    case JK_TUPLE:
    case JK_DICT:
        st = eval_seq(x, sc, n, out);
        break;
    case JK_ATTR:
        if ((st = eval(x, sc, n->a, &a)) != KEEL_OK) break;
        x->line = n->line;
        st = jv_getattr(x, a, n->name, out);
        break;
    case JK_ITEM:
        if ((st = eval(x, sc, n->a, &a)) != KEEL_OK) break;
        if ((st = eval(x, sc, n->b, &b)) != KEEL_OK) break;
        x->line = n->line;
        st = jv_getitem(x, a, b, out);
        break;
    case JK_SLICE:
        st = eval_slice(x, sc, n, out);
        break;
    case JK_CALL:
        st = eval_call(x, sc, n, jv_undef(), out);
        break;
    case JK_FILTER:
        st = eval_filter(x, sc, n, jv_undef(), out);
        break;
    case JK_TEST:
        st = eval_test(x, sc, n, out);
        break;
    case JK_NEG:
    case JK_POS:
        if ((st = eval(x, sc, n->a, &a)) != KEEL_OK) break;
        st = eval_unary(x, n, a, out);
        break;
    case JK_NOT:
        if ((st = eval(x, sc, n->a, &a)) != KEEL_OK) break;
        *out = jv_bool(!jv_truthy(a));
        break;
    case JK_BIN:
    case JK_AND:
    case JK_OR:
        st = eval_chain(x, sc, n, out);
        break;
    case JK_COMPARE:
        st = eval_compare(x, sc, n, out);
        break;
    case JK_COND:
        if ((st = eval(x, sc, n->a, &a)) != KEEL_OK) break;
        if (jv_truthy(a))
            st = eval(x, sc, n->b, out);
        else if (n->c)
            st = eval(x, sc, n->c, out);
        else
            *out = jv_undef_hint(x, "the inline if-expression evaluated to false and no else "
                                    "section was defined.");
        break;
    default:
        st = jx_fail(x, KEEL_EINTERNAL, "node %d is not an expression", n->kind);
        break;
    }
    x->depth--;
    return st;
}

/* ---- assignment ------------------------------------------------------------------- */

static keel_status assign(jx *x, jscope *sc, const jnode *target, jv v)
{
    if (target->kind == JK_NAME) return scope_set(x, sc, target->name, v);
    if (target->kind == JK_ATTR) {
        jv ns = lookup(x, sc, target->a->name);
        x->line = target->line;
        if (ns.t != JT_NS)
            return jx_fail(x, KEEL_EINVAL, "cannot assign attribute on non-namespace object");
        if (!jdict_set(&x->mem, ns.u.d, jv_strv((jstr *)target->name), v)) return jx_oom(x);
        return KEEL_OK;
    }
    /* tuple unpacking */
    size_t want = 0;
    for (const jnode *c = target->a; c; c = c->next) want++;
    jv *items = NULL;
    size_t n;
    x->line = target->line;
    if (v.t == JT_UNDEF) return jx_undef_error(x, v);
    TRY(jv_iter(x, v, &items, &n));
    if (n < want)
        return jx_fail(x, KEEL_EINVAL, "not enough values to unpack (expected %zu, got %zu)", want,
                       n);
    if (n > want)
        return jx_fail(x, KEEL_EINVAL, "too many values to unpack (expected %zu)", want);
    size_t i = 0;
    for (const jnode *c = target->a; c; c = c->next) TRY(assign(x, sc, c, items[i++]));
    return KEEL_OK;
}

/* ---- loops ------------------------------------------------------------------------- */

bool jx_loop_fetch(jx *x, jloop *lp, size_t i, keel_status *st)
{
    *st = KEEL_OK;
    if (lp->live) {
        lp->items = lp->live->v;
        lp->n = lp->live->n;
        return i < lp->n;
    }
    while (lp->n <= i && !lp->complete) {
        if (lp->src_i >= lp->src_n) {
            lp->complete = true;
            break;
        }
        jv item = lp->src[lp->src_i++];
        if ((*st = jx_step(x)) != KEEL_OK) return false;
        /* the filter sees the loop variable (not the loop object) */
        jscope *ts = scope_new(x, lp->scope);
        if (!ts) {
            *st = jx_oom(x);
            return false;
        }
        jv keep;
        if ((*st = assign(x, ts, lp->target, item)) != KEEL_OK) return false;
        if ((*st = eval(x, ts, lp->cond, &keep)) != KEEL_OK) return false;
        if (!jv_truthy(keep)) continue;
        /* items grows by doubling into the arena */
        if ((lp->n & (lp->n - 1)) == 0 || lp->n == 0) {
            size_t cap = lp->n ? lp->n * 2 : 4;
            jv *ni = jmem_alloc_n(&x->mem, cap, sizeof(jv));
            if (!ni) {
                *st = jx_oom(x);
                return false;
            }
            if (lp->n) memcpy(ni, lp->items, lp->n * sizeof(jv));
            lp->items = ni;
        }
        lp->items[lp->n++] = item;
    }
    return i < lp->n;
}

static JX_NOINLINE keel_status run_for(jx *x, jscope *sc, const jnode *f, jv iter, int32_t depth0)
{
    jloop *lp = jmem_zalloc(&x->mem, sizeof *lp);
    if (!lp) return jx_oom(x);
    lp->depth0 = depth0;
    lp->fornode = f;
    lp->outer = sc;
    x->line = f->line;
    if (iter.t == JT_LIST && iter.u.l->kind == JL_RANGE && !f->e && !iter.u.l->v) {
        lp->range = iter.u.l; /* items computed as they are needed */
        lp->n = iter.u.l->n;
        lp->complete = true;
    } else if (iter.t == JT_LIST && iter.u.l->kind != JL_GEN && iter.u.l->kind != JL_REVITER &&
               !f->e) {
        lp->live = iter.u.l; /* appends during the loop are seen, as in Python */
    } else {
        jv *items = NULL;
        size_t n;
        TRY(jv_iter(x, iter, &items, &n));
        if (f->e) {
            lp->src = items;
            lp->src_n = n;
            lp->target = f->a;
            lp->cond = f->e;
            lp->scope = sc;
        } else {
            lp->items = items;
            lp->n = n;
            lp->complete = true;
        }
    }
    jscope *body = scope_new(x, sc);
    if (!body) return jx_oom(x);
    jv loopv = {0};
    loopv.t = JT_LOOP;
    loopv.u.loop = lp;
    size_t i = 0;
    keel_status st;
    for (;; i++) {
        if (!jx_loop_fetch(x, lp, i, &st)) {
            if (st != KEEL_OK) return st;
            break;
        }
        TRY(jx_step(x));
        lp->i = i;
        body->n = 0; /* each iteration starts afresh */
        TRY(scope_set(x, body, x->t->names.loop, loopv));
        TRY(assign(x, body, f->a, jx_loop_item(lp, i)));
        TRY(exec_list(x, body, f->c));
        if (x->flow == JFLOW_BREAK) {
            x->flow = JFLOW_NONE;
            i++;
            break;
        }
        x->flow = JFLOW_NONE;
    }
    if (i == 0 && f->d) {
        jscope *es = scope_new(x, sc);
        if (!es) return jx_oom(x);
        TRY(exec_list(x, es, f->d));
    }
    return KEEL_OK;
}

/* ---- statements --------------------------------------------------------------------- */

static keel_status exec_stmt(jx *x, jscope *sc, const jnode *n)
{
    jv v;
    jstr *s = NULL;
    x->line = n->line;
    switch (n->kind) {
    case JK_TEXT:
        return emit(x, n->val.u.s->s, n->val.u.s->n);
    case JK_OUTPUT:
        TRY(eval(x, sc, n->a, &v));
        if (v.t == JT_STR) return emit(x, v.u.s->s, v.u.s->n);
        return jv_str(x, x->out, v);
    case JK_IF:
        for (const jnode *c = n;;) {
            TRY(eval(x, sc, c->a, &v));
            if (jv_truthy(v)) return exec_list(x, sc, c->b);
            if (c->c && c->c->kind == JK_IF && c->c->op == 1) {
                c = c->c;
                continue;
            }
            return exec_list(x, sc, c->c);
        }
    case JK_FOR:
        TRY(eval(x, sc, n->b, &v));
        return run_for(x, sc, n, v, 0);
    case JK_SET:
        TRY(eval(x, sc, n->b, &v));
        return assign(x, sc, n->a, v);
    case JK_SETBLOCK: {
        jscope *inner = scope_new(x, sc);
        if (!inner) return jx_oom(x);
        TRY(capture(x, inner, n->c, &s));
        v = jv_strv(s);
        if (n->b) TRY(eval_filter(x, sc, n->b, v, &v));
        return assign(x, sc, n->a, v);
    }
    case JK_FILTERBLOCK: {
        jscope *inner = scope_new(x, sc);
        if (!inner) return jx_oom(x);
        TRY(capture(x, inner, n->c, &s));
        TRY(eval_filter(x, inner, n->b, jv_strv(s), &v));
        if (v.t == JT_STR) return emit(x, v.u.s->s, v.u.s->n);
        return jv_str(x, x->out, v);
    }
    case JK_MACRO: {
        jmacro *m = jmem_zalloc(&x->mem, sizeof *m);
        if (!m) return jx_oom(x);
        m->def = n;
        m->closure = sc;
        v.t = JT_MACRO;
        v.u.m = m;
        return scope_set(x, sc, n->name, v);
    }
    case JK_CALLBLOCK: {
        jmacro *m = jmem_zalloc(&x->mem, sizeof *m);
        if (!m) return jx_oom(x);
        m->def = n;
        m->closure = sc;
        jv caller = {0};
        caller.t = JT_MACRO;
        caller.u.m = m;
        TRY(eval_call(x, sc, n->b, caller, &v));
        if (v.t == JT_STR) return emit(x, v.u.s->s, v.u.s->n);
        return jv_str(x, x->out, v);
    }
    case JK_WITH: {
        jscope *inner = scope_new(x, sc);
        if (!inner) return jx_oom(x);
        for (const jnode *a = n->a; a; a = a->next) {
            TRY(eval(x, sc, a->b, &v));
            TRY(assign(x, inner, a->a, v));
        }
        return exec_list(x, inner, n->c);
    }
    case JK_DO:
        return eval(x, sc, n->a, &v);
    case JK_BREAK:
        x->flow = JFLOW_BREAK;
        return KEEL_OK;
    case JK_CONTINUE:
        x->flow = JFLOW_CONTINUE;
        return KEEL_OK;
    case JK_SCOPE: {
        if (n->op == 1) {
            TRY(eval(x, sc, n->a, &v));
            if (jv_truthy(v))
                return jx_fail(x, KEEL_EINVAL, "autoescape is not supported (HTML escaping)");
        }
        jscope *inner = scope_new(x, sc);
        if (!inner) return jx_oom(x);
        return exec_list(x, inner, n->c);
    }
    case JK_UNSUPPORTED:
        return jx_fail(x, KEEL_EINVAL, "'%s' is not supported (templates are rendered alone, "
                                       "without a loader)",
                       n->name->s);
    default:
        return jx_fail(x, KEEL_EINTERNAL, "node %d is not a statement", n->kind);
    }
}

static keel_status exec_list(jx *x, jscope *sc, const jnode *n)
{
    TRY(deeper(x));
    keel_status st = KEEL_OK;
    for (; n && st == KEEL_OK && x->flow == JFLOW_NONE; n = n->next) st = exec_stmt(x, sc, n);
    x->depth--;
    return st;
}

/* ---- public (private-to-library) API ------------------------------------------------ */

keel_status jinja_open(const char *src, size_t len, jinja_template **out, char *err)
{
    if (!out) return base_err(err, KEEL_EINVAL, "out is NULL");
    *out = NULL;
    if (!src && len) return base_err(err, KEEL_EINVAL, "template source is NULL");
    jinja_template *t = base_calloc(1, sizeof *t);
    if (!t) return base_err(err, KEEL_ENOMEM, "out of memory");
    jmem_init(&t->mem, SIZE_MAX);
    keel_status st = jinja_parse(t, src ? src : "", len, err);
    if (st != KEEL_OK) {
        if (st == KEEL_ENOMEM) base_err(err, KEEL_ENOMEM, "out of memory compiling the template");
        jinja_close(t);
        return st;
    }
    *out = t;
    return KEEL_OK;
}

void jinja_close(jinja_template *t)
{
    if (!t) return;
    jmem_free_all(&t->mem);
    base_free(t, sizeof *t);
}

void jinja_buf_free(jinja_buf *b)
{
    if (!b) return;
    if (b->data) base_free(b->data, b->cap);
    memset(b, 0, sizeof *b);
}

bool jinja_time_parse(const char *s, jinja_time *o)
{
    if (!s) return false;
    int v[6] = {0};
    const int width[6] = {4, 2, 2, 2, 2, 2};
    const char seps[6] = {'-', '-', 'T', ':', ':', 0};
    size_t k = 0;
    for (int f = 0; f < 6; f++) {
        for (int d = 0; d < width[f]; d++, k++) {
            if (s[k] < '0' || s[k] > '9') return false;
            v[f] = v[f] * 10 + (s[k] - '0');
        }
        if (f < 5) {
            if (s[k] != seps[f] && !(f == 2 && s[k] == ' ')) return false;
            k++;
        }
    }
    if (s[k] != 0) return false;
    if (v[1] < 1 || v[1] > 12 || v[2] < 1 || v[2] > 31 || v[3] > 23 || v[4] > 59 || v[5] > 60)
        return false;
    o->year = v[0];
    o->mon = v[1];
    o->mday = v[2];
    o->hour = v[3];
    o->min = v[4];
    o->sec = v[5];
    return true;
}

void jinja_time_now(jinja_time *o)
{
    time_t now = time(NULL);
    struct tm tm;
    memset(&tm, 0, sizeof tm);
    localtime_r(&now, &tm);
    o->year = tm.tm_year + 1900;
    o->mon = tm.tm_mon + 1;
    o->mday = tm.tm_mday;
    o->hour = tm.tm_hour;
    o->min = tm.tm_min;
    o->sec = tm.tm_sec;
}

/* Copies the rendering into out (hooks; grows, keeps a NUL). */
static keel_status buf_put(jinja_buf *out, const char *s, size_t n, char *err)
{
    size_t need;
    if (!size_add(n, 1, &need)) return base_err(err, KEEL_EOVERFLOW, "output too large");
    if (need > out->cap) {
        size_t cap = out->cap ? out->cap : 256;
        while (cap < need) cap = cap > SIZE_MAX / 2 ? need : cap * 2;
        char *d = base_realloc(out->data, out->cap, cap);
        if (!d) return base_err(err, KEEL_ENOMEM, "out of memory for the rendering");
        out->data = d;
        out->cap = cap;
    }
    if (n) memcpy(out->data, s, n);
    out->data[n] = 0;
    out->len = n;
    return KEEL_OK;
}

keel_status jinja_render(const jinja_template *t, const char *vars_json, size_t vars_len,
                         const jinja_var *vars, size_t n_vars, const jinja_render_opts *opts,
                         jinja_buf *out, char *err)
{
    if (!t || !out) return base_err(err, KEEL_EINVAL, "template or output buffer is NULL");
    out->len = 0;
    if (out->data) out->data[0] = 0;
    jx x;
    memset(&x, 0, sizeof x);
    x.t = t;
    x.lim = opts && opts->limits ? *opts->limits : jinja_limits_default();
    if (opts && opts->now)
        x.now = *opts->now;
    else
        jinja_time_now(&x.now);
    char local_err[JINJA_ERR_CAP];
    x.err = err ? err : local_err;
    x.err[0] = 0;
    jmem_init(&x.mem, x.lim.max_memory);
    keel_status st = KEEL_OK;
    jsb root;
    x.vars = jdict_new(&x.mem, 0);
    x.root = scope_new(&x, NULL);
    if (!x.vars || !x.root) {
        st = jx_oom(&x);
        goto done;
    }
    if (vars_json && vars_len) {
        jv v;
        st = jv_from_json(&x.mem, vars_json, vars_len, &v, x.err);
        if (st == KEEL_OK && v.t != JT_DICT)
            st = base_err(x.err, KEEL_EFORMAT, "template variables: the JSON is not an object");
        if (st != KEEL_OK) {
            if (st != KEEL_EFORMAT) st = jx_oom(&x);
            goto done;
        }
        x.vars = v.u.d;
    }
    for (size_t i = 0; i < n_vars; i++) {
        jv v;
        if (!vars[i].name) {
            st = base_err(x.err, KEEL_EINVAL, "template variable %zu has no name", i);
            goto done;
        }
        st = jv_from_json(&x.mem, vars[i].json ? vars[i].json : "null",
                          vars[i].json ? vars[i].len : 4, &v, x.err);
        if (st == KEEL_EFORMAT) {
            char detail[JINJA_ERR_CAP];
            snprintf(detail, sizeof detail, "%s", x.err);
            base_err(x.err, KEEL_EFORMAT, "template variable %s: %s", vars[i].name, detail);
            goto done;
        }
        if (st != KEEL_OK) {
            st = jx_oom(&x);
            goto done;
        }
        jstr *name = jstr_new(&x.mem, vars[i].name, strlen(vars[i].name));
        if (!name || !jdict_set(&x.mem, x.vars, jv_strv(name), v)) {
            st = jx_oom(&x);
            goto done;
        }
    }
    jsb_init(&root, &x.mem, x.lim.max_output);
    x.out = &root;
    x.stack_base = jinja_stack_here();
    st = exec_list(&x, x.root, t->body);
    if (st == KEEL_OK) st = buf_put(out, root.n ? root.d : "", root.n, x.err);
done:
    jmem_free_all(&x.mem);
    if (st != KEEL_OK) out->len = 0;
    return st;
}
