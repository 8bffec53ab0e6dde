/*
 * jschema_emit.c — GBNF from the normal form of jschema.c (jschema_int.h).
 *
 * Each list of schemas (a conjunction) that the grammar needs becomes one
 * rule s<id>, memoized by its members (sorted pointers), the id reserved
 * before the list is normalized: a $ref back to a list still being
 * emitted is a reference to its rule (recursion). A rule is the union of
 * its conjunctions; a conjunction is the union of its kinds; numbers and
 * strings come from jnumber.c / jstring.c; arrays and objects are written
 * here:
 *
 *   arrays   "[" elements "]": prefixItems then items, with minItems /
 *            maxItems as bounded repetition; with contains, rules indexed
 *            by (elements so far, matches so far), both capped.
 *   objects  "{" members "}": the declared names (properties, required,
 *            names made by dependentRequired / not) in a fixed order, each
 *            optional unless required, then further members whose keys are
 *            split by the patternProperties patterns they match (a key
 *            takes the schemas of every pattern it matches, of the
 *            additionalProperties of each group none of whose patterns it
 *            matches); rules indexed by (name, members so far) when
 *            minProperties / maxProperties count members.
 *
 * A rule that turns out to accept nothing is dropped from its parent (a
 * property that cannot be present is absent, an element that cannot
 * exist ends the array); a recursive rule that accepts nothing is refused.
 */
#include "jschema_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_ptr(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t) * (json_t *const *)a, y = (uintptr_t) * (json_t *const *)b;
    return x < y ? -1 : x > y;
}

/* The memo index of list l (true members dropped, sorted, unique), or -1;
 * *key: the list's key (arena) when asked for. */
int js_memo_find(jsb *b, jsl l, const char **key)
{
    json_t *v[256];
    int n = 0;
    for (int i = 0; i < l.n && n < 256; i++)
        if (!json_is_true(l.v[i])) v[n++] = l.v[i];
    qsort(v, (size_t)n, sizeof *v, cmp_ptr);
    char k[256 * 20];
    size_t m = 0;
    for (int i = 0; i < n; i++)
        if (i == 0 || v[i] != v[i - 1]) m += (size_t)snprintf(k + m, sizeof k - m, "%p,", (void *)v[i]);
    k[m] = 0;
    if (key) *key = js_strdup(b, k, m);
    for (int i = 0; i < b->n_memo; i++)
        if (strcmp(b->memo[i].key, k) == 0) return i;
    return -1;
}

static void rule_name(char *out, size_t cap, int64_t r)
{
    if (r == JR_ANY) snprintf(out, cap, "value");
    else snprintf(out, cap, "s%lld", (long long)r);
}

/* Appends helper rule text (whole lines) to the grammar. */
static void add_rules(jsb *b, const char *text, size_t n)
{
    js_sput(b, &b->out, text, n);
    if (n && text[n - 1] != '\n') js_sputs(b, &b->out, "\n");
}

static bool num_trivial(const jnum_spec *s)
{
    return s->kind == JNUM_ANY && !s->n_lo && !s->n_hi && !s->n_mult && !s->n_not_mult && !s->n_except;
}

static bool str_trivial(const jstr_spec *s)
{
    return !s->min_len && s->max_len < 0 && !s->n_pattern && !s->n_not_pattern && !s->n_format &&
           !s->n_not_format && !s->n_except;
}

/* A failure of jnumber.c / jstring.c: refusals get the location, out of memory stays. */
static void sub_fail(jsb *b, keel_status st, const char *where, const char *e)
{
    if (st == KEEL_EUNSUPPORTED || st == KEEL_ERANGE) js_refuse(b, where, "%s", e);
    else if (!b->st) b->st = base_err(b->err, st, "json schema: %s", e);
}

static void key_text(jsb *b, sbuf *k, const char *t, size_t n)
{
    js_sputf(b, k, "%zu:", n);
    js_sput(b, k, t, n);
}

static void key_texts(jsb *b, sbuf *k, char tag, const char *const *t, const bool *flag, int n)
{
    js_sputf(b, k, "|%c%d", tag, n);
    for (int i = 0; i < n; i++) {
        if (flag) js_sputs(b, k, flag[i] ? "x" : "i");
        key_text(b, k, t[i], strlen(t[i]));
    }
}

/* A spec's rule met before (same key): writes name as an alias of it (one
 * still being written is assumed to accept something, checked when it is
 * done); returns -1 when new (*idx: its reserved entry, or -1), else 0
 * (none) / 1. */
static int spec_seen(jsb *b, sbuf *k, const char *name, int *idx)
{
    *idx = -1;
    if (b->st) return 0;
    for (int i = 0; i < b->n_spc; i++)
        if (strcmp(b->spc[i].key, k->d) == 0) {
            if (b->spc[i].done && b->spc[i].empty) return 0;
            if (!b->spc[i].done) b->spc[i].referenced = true;
            js_sputf(b, &b->out, "%s ::= %s\n", name, b->spc[i].name);
            return !b->st;
        }
    if (!b->spc && !(b->spc = js_alloc(b, JS_MAX_MEMO * sizeof *b->spc))) return 0;
    if (b->n_spc == JS_MAX_MEMO) return -1; /* no sharing past the cap, still correct */
    *idx = b->n_spc++;
    b->spc[*idx].key = js_strdup(b, k->d, k->n);
    b->spc[*idx].name = js_strdup(b, name, strlen(name));
    return b->st ? 0 : -1;
}

static void spec_done(jsb *b, int idx, bool empty)
{
    if (idx < 0 || b->st) return;
    b->spc[idx].done = true;
    b->spc[idx].empty = empty;
    if (empty && b->spc[idx].referenced) js_refuse(b, b->spc[idx].name, "a recursive schema that accepts nothing");
}

/* What num_rule / str_rule do with their builder's result: a refusal
 * (st, e) passed on with the location, else the spec under key marked
 * done and its rules (t, n bytes; none when empty) added. False when no
 * value satisfies the spec or on failure. */
static bool spec_rules(jsb *b, int key, keel_status st, const char *e, char *t, size_t n, bool empty,
                       const char *where)
{
    if (st) {
        sub_fail(b, st, where, e);
        return false;
    }
    spec_done(b, key, empty);
    if (empty) return false;
    add_rules(b, t, n);
    base_free(t, n + 1);
    return !b->st;
}

/* The numbers of s as rule `name`: false when none. Equal specs share one
 * set of rules (a format or a bounded integer repeated across properties). */
static bool num_rule(jsb *b, const jnum_spec *s, const char *name, const char *where)
{
    sbuf k = {0};
    js_sputf(b, &k, "n%d", s->kind);
    key_texts(b, &k, 'l', s->lo, s->lo_excl, s->n_lo);
    key_texts(b, &k, 'h', s->hi, s->hi_excl, s->n_hi);
    key_texts(b, &k, 'm', s->mult, NULL, s->n_mult);
    key_texts(b, &k, 'M', s->not_mult, NULL, s->n_not_mult);
    key_texts(b, &k, 'e', s->except, NULL, (int)s->n_except);
    int key;
    int seen = b->st ? 0 : spec_seen(b, &k, name, &key);
    js_sfree(&k);
    if (seen >= 0) return seen == 1;
    char e[BASE_ERR_CAP] = "", *t = NULL;
    size_t n = 0;
    bool empty = false;
    keel_status st = jnum_gbnf(s, name, &t, &n, &empty, e);
    return spec_rules(b, key, st, e, t, n, empty, where);
}

static bool str_rule(jsb *b, const jstr_spec *s, const char *name, const char *where)
{
    sbuf k = {0};
    js_sputf(b, &k, "s%lld,%lld", (long long)s->min_len, (long long)s->max_len);
    key_texts(b, &k, 'p', s->pattern, NULL, s->n_pattern);
    key_texts(b, &k, 'P', s->not_pattern, NULL, s->n_not_pattern);
    key_texts(b, &k, 'f', s->format, NULL, s->n_format);
    key_texts(b, &k, 'F', s->not_format, NULL, s->n_not_format);
    js_sputf(b, &k, "|e%zu", s->n_except);
    for (size_t i = 0; i < s->n_except; i++) key_text(b, &k, s->except[i], s->except_len[i]);
    int key;
    int seen = b->st ? 0 : spec_seen(b, &k, name, &key);
    js_sfree(&k);
    if (seen >= 0) return seen == 1;
    char e[BASE_ERR_CAP] = "", *t = NULL;
    size_t n = 0;
    bool empty = false;
    keel_status st = jstr_gbnf(s, name, &t, &n, &empty, e);
    return spec_rules(b, key, st, e, t, n, empty, where);
}

static bool str_ok(jsb *b, const jstr_spec *s, const char *content, size_t n, const char *where)
{
    char e[BASE_ERR_CAP] = "";
    bool ok = false;
    keel_status st = jstr_test(s, content, n, &ok, e);
    if (st) {
        sub_fail(b, st, where, e);
        return false;
    }
    return ok;
}

/* The literal of value v (any JSON spelling of its numbers, canonical
 * strings, ws between tokens) into o; helper rules named name-<i>. */
static void put_value(jsb *b, sbuf *o, json_t *v, const char *name, int *seq, int depth)
{
    char rn[128];
    if (depth > JS_MAX_DEPTH) {
        js_refuse(b, name, "a value nested more than %d deep", JS_MAX_DEPTH);
        return;
    }
    switch (json_typeof(v)) {
    case JSON_NULL: js_sputs(b, o, "\"null\""); return;
    case JSON_TRUE: js_sputs(b, o, "\"true\""); return;
    case JSON_FALSE: js_sputs(b, o, "\"false\""); return;
    case JSON_STRING: js_put_jstring(b, o, json_string_value(v), json_string_length(v)); return;
    case JSON_INTEGER:
    case JSON_REAL: {
        char t[JNUM_TEXT_CAP];
        if (!jnum_text(v, t)) {
            js_refuse(b, name, "a number that is not finite");
            return;
        }
        jnum_spec s;
        memset(&s, 0, sizeof s);
        s.lo[0] = s.hi[0] = t;
        s.n_lo = s.n_hi = 1;
        snprintf(rn, sizeof rn, "%s-%d", name, (*seq)++);
        if (num_rule(b, &s, rn, name)) js_sputs(b, o, rn);
        else js_refuse(b, name, "the number %s has no spelling", t);
        return;
    }
    case JSON_ARRAY: {
        js_sputs(b, o, "( \"[\" ws");
        size_t i;
        json_t *x;
        json_array_foreach(v, i, x) {
            js_sputs(b, o, i ? " \",\" ws " : " ");
            put_value(b, o, x, name, seq, depth + 1);
            js_sputs(b, o, " ws");
        }
        js_sputs(b, o, " \"]\" )");
        return;
    }
    default: {
        js_sputs(b, o, "( \"{\" ws");
        const char *k;
        json_t *x;
        bool first = true;
        json_object_foreach(v, k, x) {
            js_sputs(b, o, first ? " " : " \",\" ws ");
            first = false;
            js_put_jstring(b, o, k, strlen(k));
            js_sputs(b, o, " ws \":\" ws ");
            put_value(b, o, x, name, seq, depth + 1);
            js_sputs(b, o, " ws");
        }
        js_sputs(b, o, " \"}\" )");
        return;
    }
    }
}

static bool arr_constrained(const jconj *c)
{
    return c->min_items > 0 || c->max_items >= 0 || c->n_pre || c->items.n || c->n_ct || c->unique;
}

static bool obj_constrained(const jconj *c)
{
    return c->n_grp || c->n_req || c->min_props > 0 || c->max_props >= 0 || c->pnames.n;
}

/* ---- arrays ------------------------------------------------------------------------------- */

static bool conj_test(jsb *b, const jconj *c, json_t *v, int depth);

/* Elements i.. with prefixItems rules pre[0..k): element i follows pre[i]
 * below k, `it` from k on (none when no_more); the first mn are required,
 * at most mx (-1: no bound) in all: `p0 ( , p1 ( , it{0,n} )? )?`. */
static void prefix_elems(jsb *b, sbuf *o, char (*pre)[32], int64_t k, int64_t i, int64_t mn, int64_t mx,
                         const char *it, bool no_more)
{
    if (mx >= 0 && i >= mx) return;
    if (i >= k) {
        if (no_more) return;
        int64_t lo = mn > i ? mn - i : 0;
        if (i == 0) {
            /* no prefix: it ( , it ){lo-1, mx-1} */
            if (lo == 0) js_sputs(b, o, " (");
            js_sputf(b, o, " %s ( ws \",\" ws %s )", it, it);
            int64_t l1 = lo > 0 ? lo - 1 : 0;
            if (mx >= 0) js_sputf(b, o, "{%lld,%lld}", (long long)l1, (long long)(mx - 1));
            else js_sputf(b, o, "{%lld,}", (long long)l1);
            if (lo == 0) js_sputs(b, o, " )?");
            return;
        }
        if (mx >= 0) js_sputf(b, o, " ( ws \",\" ws %s ){%lld,%lld}", it, (long long)lo, (long long)(mx - i));
        else js_sputf(b, o, " ( ws \",\" ws %s ){%lld,}", it, (long long)lo);
        return;
    }
    bool req = i < mn;
    js_sputs(b, o, req ? " " : " ( ");
    if (i > 0) js_sputs(b, o, "ws \",\" ws ");
    js_sputs(b, o, pre[i]);
    prefix_elems(b, o, pre, k, i + 1, mn, mx, it, no_more);
    if (!req) js_sputs(b, o, " )?");
}

static jsl list_plus(jsb *b, jsl l, json_t *s)
{
    jsl r = {js_alloc(b, (size_t)(l.n + 1) * sizeof(json_t *)), 0};
    if (!r.v) return r;
    if (l.n) memcpy(r.v, l.v, (size_t)l.n * sizeof(json_t *));
    r.v[l.n] = s;
    r.n = l.n + 1;
    return r;
}

#define JS_MAX_CONTAINS 4

/* Arrays with contains (up to 4 in one conjunction, beside prefixItems):
 * rules name-a<n>-<q>, n the elements so far (capped where no bound
 * needs more), q the match counts of each contains in mixed radix (each
 * capped at its maxContains, or saturating at its minContains). An
 * element takes a class S (the contains it is counted for): the element
 * schemas of its position, each contains in S, and "not C" for each
 * contains outside S that has a maxContains (one without may match
 * uncounted: a count is never above the true one). k: the usable prefix. */
static bool contains_rules(jsb *b, const jconj *c, const char *name, int64_t mn, int64_t mx, int64_t k, int depth)
{
    int nc = 0;
    const jcontains *ct[JS_MAX_CONTAINS];
    for (int i = 0; i < c->n_ct; i++) {
        if (c->ct[i].mn <= 0 && c->ct[i].mx < 0) continue; /* always holds */
        if (nc == JS_MAX_CONTAINS)
            return js_refuse(b, c->where, "more than %d 'contains' in one conjunction are not supported", JS_MAX_CONTAINS), false;
        ct[nc++] = &c->ct[i];
    }
    int n_cls = 1 << nc;
    /* positions 0..kk-1 one by one (the prefix, and up to where every
     * contains counts), then kk for every later index */
    int64_t kk = k;
    for (int j = 0; j < nc; j++) kk = BASE_MAX(kk, ct[j]->from);
    int64_t n_pos = kk + 1;
    if (n_pos * n_cls > 1024)
        return js_refuse(b, c->where, "'contains' beside a long 'prefixItems' is not supported"), false;
    int64_t *er = base_alloc((size_t)(n_pos * n_cls) * sizeof *er);
    if (!er) return js_oom(b), false;
    json_t *notc[JS_MAX_CONTAINS] = {NULL};
    bool ok = false;
    char *alive = NULL;
    size_t na = 0;
    sbuf o = {0};
    for (int j = 0; j < nc; j++)
        if (ct[j]->mx >= 0 && js_not_list(b, (jsl){(json_t **)&ct[j]->s, 1}, &notc[j])) goto done;
    for (int64_t p = 0; p < n_pos; p++)
        for (int cls = 0; cls < n_cls; cls++) {
            jsl l = p < k ? c->pre[p] : c->items;
            bool valid = true;
            for (int j = 0; j < nc; j++) {
                bool counted = p >= ct[j]->from; /* position k stands for every index >= k */
                if ((cls >> j) & 1) {
                    if (counted) l = list_plus(b, l, ct[j]->s);
                    else valid = false;
                } else if (notc[j] && counted) {
                    l = list_plus(b, l, notc[j]);
                }
            }
            er[p * n_cls + cls] = valid ? JR_ANY : JR_NONE;
            if (!valid) continue;
            if (l.n && js_emit_list(b, l, depth + 1, &er[p * n_cls + cls])) goto done;
        }
    int64_t ncap = mx >= 0 ? mx : BASE_MAX(BASE_MAX(mn, kk), 1);
    int64_t cap[JS_MAX_CONTAINS], nq = 1;
    for (int j = 0; j < nc; j++) {
        cap[j] = ct[j]->mx >= 0 ? ct[j]->mx : ct[j]->mn;
        nq *= cap[j] + 1;
        if (nq > JS_MAX_COUNT_RULES) break;
    }
    if ((ncap + 1) * nq > JS_MAX_COUNT_RULES) {
        js_refuse(b, c->where, "'contains' with counts over %d rules is not supported", JS_MAX_COUNT_RULES);
        goto done;
    }
    na = (size_t)((ncap + 1) * nq);
    alive = base_calloc(na, 1);
    if (!alive) {
        js_oom(b);
        goto done;
    }
    /* transitions: (n, q) -- element of class cls --> (n2, q2), or -1 */
#define NEXT_N(n) (mx >= 0 ? (n) + 1 : BASE_MIN((n) + 1, ncap))
    for (int pass = 0; pass < 2; pass++) {
        for (int64_t n = ncap; n >= 0; n--)
            for (int64_t q = nq - 1; q >= 0; q--) {
                int64_t cnt[JS_MAX_CONTAINS], r = q;
                bool acc = n >= mn;
                for (int j = 0; j < nc; j++) {
                    cnt[j] = r % (cap[j] + 1);
                    r /= cap[j] + 1;
                    acc &= cnt[j] >= ct[j]->mn;
                }
                bool more = mx < 0 || n < mx;
                int64_t n2 = NEXT_N(n), p = BASE_MIN(n, kk);
                if (pass == 0) {
                    bool a = acc;
                    for (int cls = 0; cls < n_cls && !a && more; cls++) {
                        if (er[p * n_cls + cls] == JR_NONE) continue;
                        int64_t q2 = 0, mul = 1;
                        bool fits = true;
                        for (int j = 0; j < nc; j++) {
                            int64_t v = cnt[j] + ((cls >> j) & 1);
                            if (ct[j]->mx >= 0 && v > ct[j]->mx) fits = false;
                            v = BASE_MIN(v, cap[j]);
                            q2 += v * mul;
                            mul *= cap[j] + 1;
                        }
                        if (fits && (n2 != n || q2 != q) && alive[n2 * nq + q2]) a = true;
                    }
                    alive[n * nq + q] = a;
                    continue;
                }
                if (!alive[n * nq + q]) continue;
                js_sputf(b, &o, "%s-a%lld-%lld ::= ", name, (long long)n, (long long)q);
                bool any = false;
                if (acc) {
                    js_sputs(b, &o, "\"]\"");
                    any = true;
                }
                for (int cls = 0; cls < n_cls && more; cls++) {
                    if (er[p * n_cls + cls] == JR_NONE) continue;
                    int64_t q2 = 0, mul = 1;
                    bool fits = true;
                    for (int j = 0; j < nc; j++) {
                        int64_t v = cnt[j] + ((cls >> j) & 1);
                        if (ct[j]->mx >= 0 && v > ct[j]->mx) fits = false;
                        v = BASE_MIN(v, cap[j]);
                        q2 += v * mul;
                        mul *= cap[j] + 1;
                    }
                    if (!fits || !alive[n2 * nq + q2]) continue;
                    char en[32];
                    rule_name(en, sizeof en, er[p * n_cls + cls]);
                    js_sputf(b, &o, "%s%s%s ws %s-a%lld-%lld", any ? " | " : "", n == 0 ? "" : "\",\" ws ", en, name,
                             (long long)n2, (long long)q2);
                    any = true;
                }
                js_sputs(b, &o, "\n");
            }
        if (pass == 0 && !alive[0]) break;
    }
#undef NEXT_N
    if (alive[0]) {
        js_sputf(b, &o, "%s ::= \"[\" ws %s-a0-0\n", name, name);
        add_rules(b, o.d, o.n);
        ok = !b->st;
    }
done:
    js_sfree(&o);
    base_free(alive, na);
    base_free(er, (size_t)(n_pos * n_cls) * sizeof *er);
    return ok;
}

#define JS_MAX_UNIQUE 10

/* The values list l allows when they are finitely many (enum, const,
 * null / boolean kinds): added to u[*nu] (distinct), their bits in *dom;
 * false when not finite or more than JS_MAX_UNIQUE in all. */
static bool finite_values(jsb *b, jsl l, json_t **u, int *nu, unsigned *dom, int depth)
{
    *dom = 0;
    if (!l.n) return false;
    jdnf x;
    if (js_norm_list(b, l, 0, &x)) return false;
    for (int i = 0; i < x.n && !b->st; i++) {
        const jconj *c = &x.c[i];
        json_t *lit[3] = {json_null(), json_true(), json_false()};
        size_t n = c->has_en ? c->n_en : 3;
        if (!c->has_en && (c->kinds & ~(unsigned)(JK_NULL | JK_BOOL))) return false;
        for (size_t e = 0; e < n && !b->st; e++) {
            json_t *v = c->has_en ? c->en[e] : lit[e];
            if (!conj_test(b, c, v, depth + 1)) continue;
            int j = 0;
            while (j < *nu && !js_value_eq(u[j], v)) j++;
            if (j == *nu) {
                if (*nu == JS_MAX_UNIQUE) return false;
                u[(*nu)++] = v;
            }
            *dom |= 1u << j;
        }
    }
    return !b->st;
}

/* uniqueItems over finitely many values: rules name-u<mask>, mask the
 * values used so far (the element count is its popcount, the position's
 * schema that of prefixItems below k). 1: written, 0: no array, -1: not
 * applicable (the caller refuses). */
static int unique_rules(jsb *b, const jconj *c, const char *name, int64_t mn, int64_t mx, int64_t k, int depth)
{
    json_t *u[JS_MAX_UNIQUE];
    int nu = 0;
    unsigned dom[258];
    if (k > 256) return -1;
    for (int64_t p = 0; p <= k; p++) {
        bool last_none = p == k && mx >= 0 && mx <= k; /* no element past the usable prefix */
        dom[p] = 0;
        if (!last_none && !finite_values(b, p < k ? c->pre[p] : c->items, u, &nu, &dom[p], depth)) return b->st ? 0 : -1;
    }
    int64_t mxe = mx < 0 ? nu : BASE_MIN(mx, nu);
    if (mn > mxe) return 0;
    size_t nm = (size_t)1 << nu;
    uint8_t *alive = base_calloc(nm, 1);
    if (!alive) return js_oom(b), 0;
    for (size_t m = nm; m-- > 0;) {
        int pc = __builtin_popcount((unsigned)m);
        bool a = pc >= mn && pc <= mxe;
        unsigned d = dom[BASE_MIN((int64_t)pc, k)];
        for (int j = 0; j < nu && !a && pc < mxe; j++)
            if (!(m >> j & 1u) && (d >> j & 1u) && alive[m | (size_t)1 << j]) a = true;
        alive[m] = a;
    }
    int ok = alive[0] ? 1 : 0;
    sbuf o = {0};
    for (int j = 0; ok && j < nu && !b->st; j++) {
        char vn[128];
        int seq = 0;
        snprintf(vn, sizeof vn, "%s-v%d", name, j);
        js_sputf(b, &o, "%s ::= ", vn);
        put_value(b, &o, u[j], vn, &seq, 0);
        js_sputs(b, &o, "\n");
    }
    for (size_t m = 0; ok && m < nm && !b->st; m++) {
        if (!alive[m]) continue;
        int pc = __builtin_popcount((unsigned)m);
        unsigned d = dom[BASE_MIN((int64_t)pc, k)];
        bool any = false;
        js_sputf(b, &o, "%s-u%zu ::= ", name, m);
        if (pc >= mn) {
            js_sputs(b, &o, "\"]\"");
            any = true;
        }
        for (int j = 0; j < nu && pc < mxe; j++)
            if (!(m >> j & 1u) && (d >> j & 1u) && alive[m | (size_t)1 << j]) {
                js_sputf(b, &o, "%s%s%s-v%d ws %s-u%zu", any ? " | " : "", pc ? "\",\" ws " : "", name, j, name,
                         m | (size_t)1 << j);
                any = true;
            }
        js_sputs(b, &o, "\n");
    }
    if (ok) js_sputf(b, &o, "%s ::= \"[\" ws %s-u0\n", name, name);
    if (ok && !b->st) add_rules(b, o.d, o.n);
    js_sfree(&o);
    base_free(alive, nm);
    return b->st ? 0 : ok;
}

/* The arrays of c as rule `name`: false when none. */
static bool arr_rule(jsb *b, const jconj *c, const char *name, int depth)
{
    int64_t mn = c->min_items, mx = c->max_items, k = c->n_pre;
    int64_t ri = JR_ANY;
    if (c->items.n && js_emit_list(b, c->items, depth + 1, &ri)) return false;
    char(*pre)[32] = NULL;
    if (k) {
        pre = base_calloc((size_t)k, sizeof *pre);
        if (!pre) return js_oom(b), false;
    }
    for (int64_t i = 0; i < k; i++) {
        int64_t r = JR_ANY;
        if (c->pre[i].n && js_emit_list(b, c->pre[i], depth + 1, &r)) goto fail;
        if (r == JR_NONE) {
            mx = mx < 0 ? i : BASE_MIN(mx, i);
            k = i;
            break;
        }
        rule_name(pre[i], sizeof pre[i], r);
    }
    bool no_more = ri == JR_NONE;
    if (no_more) mx = mx < 0 ? k : BASE_MIN(mx, k);
    if (mx >= 0 && mn > mx) goto none;
    if (c->unique && (mx < 0 || mx > 1)) {
        int u = c->n_ct ? -1 : unique_rules(b, c, name, mn, mx, k, depth);
        if (u < 0) {
            js_refuse(b, c->where, "'uniqueItems' true is not supported (it needs arrays of distinct values; exact only "
                                   "where every element is one of at most %d values)", JS_MAX_UNIQUE);
            goto fail;
        }
        base_free(pre, (size_t)(c->n_pre ? c->n_pre : 0) * sizeof *pre);
        return u == 1;
    }
    bool counted = false;
    for (int i = 0; i < c->n_ct; i++) counted |= c->ct[i].mn > 0 || c->ct[i].mx >= 0;
    if (counted) {
        bool ok = contains_rules(b, c, name, mn, mx, k, depth);
        base_free(pre, (size_t)(c->n_pre ? c->n_pre : 0) * sizeof *pre);
        return ok;
    }
    char it[32];
    rule_name(it, sizeof it, ri);
    sbuf o = {0};
    if (mx == 0) {
        js_sputf(b, &o, "%s ::= \"[\" ws \"]\"\n", name);
    } else {
        js_sputf(b, &o, "%s ::= \"[\" ws", name);
        prefix_elems(b, &o, pre, k, 0, mn, mx, it, no_more);
        js_sputs(b, &o, " ws \"]\"\n");
    }
    add_rules(b, o.d ? o.d : "", o.n);
    js_sfree(&o);
    base_free(pre, (size_t)(c->n_pre ? c->n_pre : 0) * sizeof *pre);
    return !b->st;
none:
fail:
    base_free(pre, (size_t)(c->n_pre ? c->n_pre : 0) * sizeof *pre);
    return false;
}

/* ---- objects ------------------------------------------------------------------------------ */

#define JS_MAX_NAMES 256

typedef struct objnames {
    const char *name[JS_MAX_NAMES];
    int n;
} objnames;

static bool names_add(jsb *b, objnames *d, const char *k, const char *where)
{
    for (int i = 0; i < d->n; i++)
        if (strcmp(d->name[i], k) == 0) return true;
    if (d->n == JS_MAX_NAMES) {
        js_refuse(b, where, "an object with more than %d named properties is not supported", JS_MAX_NAMES);
        return false;
    }
    d->name[d->n++] = k;
    return true;
}

static bool pattern_matches(jsb *b, const char *pat, const char *s, const char *where)
{
    jstr_spec p;
    memset(&p, 0, sizeof p);
    p.max_len = -1;
    p.pattern[0] = pat;
    p.n_pattern = 1;
    return str_ok(b, &p, s, strlen(s), where);
}

typedef struct jpat {
    const char *pat;
    json_t *s;
    int grp;
    int bit; /* the pattern's index among the distinct patterns (cells are sets of them) */
} jpat;

/* The value schemas of key k (a declared name when declared) under the groups of c. */
static jsl member_list(jsb *b, const jconj *c, const char *k, const jpat *pats, int np, unsigned mask, bool declared)
{
    jsl l = {NULL, 0};
    for (int g = 0; g < c->n_grp && !b->st; g++) {
        const jgroup *gr = &c->grp[g];
        /* properties and every matching pattern apply together; additionalProperties to members neither names */
        json_t *p = declared && gr->props ? json_object_get(gr->props, k) : NULL;
        bool matched = p != NULL;
        if (p) l = list_plus(b, l, p);
        for (int i = 0; i < np && !b->st; i++) {
            if (pats[i].grp != g) continue;
            bool m = declared ? pattern_matches(b, pats[i].pat, k, c->where) : ((mask >> pats[i].bit) & 1u) != 0;
            if (m) {
                l = list_plus(b, l, pats[i].s);
                matched = true;
            }
        }
        if (!matched && gr->addl) l = list_plus(b, l, gr->addl);
    }
    return l;
}

static bool obj_rule(jsb *b, const jconj *c, const char *name, int depth)
{
    objnames *d = base_calloc(1, sizeof *d);
    int64_t *rv = base_calloc(JS_MAX_NAMES, sizeof *rv);
    bool *req = base_calloc(JS_MAX_NAMES, sizeof *req);
    sbuf cells = {0}, o = {0};
    uint8_t *alive = NULL; /* bit 0: accepts something; bit 1: reachable */
    size_t n_alive = 0;
    bool ok = false;
    if (!d || !rv || !req) {
        js_oom(b);
        goto done;
    }
    const char *k;
    json_t *v;
    for (int g = 0; g < c->n_grp; g++)
        json_object_foreach(c->grp[g].props, k, v) if (!names_add(b, d, k, c->where)) goto done;
    for (int i = 0; i < c->n_req; i++)
        if (!names_add(b, d, c->req[i], c->where)) goto done;
    /* propertyNames: the string spec every key meets (one conjunction), or a finite set of keys */
    jstr_spec keys;
    memset(&keys, 0, sizeof keys);
    keys.max_len = -1;
    bool keys_none = false, keys_finite = false;
    const jconj *kc = NULL;
    if (c->pnames.n) {
        jdnf pn;
        if (js_norm_list(b, c->pnames, 0, &pn)) goto done;
        int n_str = 0;
        for (int i = 0; i < pn.n; i++) {
            if (pn.c[i].kinds & JK_STR) {
                kc = &pn.c[i];
                n_str++;
            }
        }
        if (n_str > 1) {
            js_refuse(b, c->where, "'propertyNames' that is a union of string constraints is not supported");
            goto done;
        }
        if (!kc) keys_none = true;
        else keys = kc->str;
        if (kc && kc->has_en) {
            keys_finite = true;
            for (size_t i = 0; i < kc->n_en; i++)
                if (json_is_string(kc->en[i]) && !names_add(b, d, json_string_value(kc->en[i]), c->where)) goto done;
        }
    }
    jpat pats[4 * JS_MAX_PATTERNS];
    const char *distinct[JS_MAX_PATTERNS];
    int np = 0, nd_pat = 0;
    for (int g = 0; g < c->n_grp; g++) {
        json_object_foreach(c->grp[g].pats, k, v) {
            int bit = 0;
            while (bit < nd_pat && strcmp(distinct[bit], k) != 0) bit++;
            if (bit == nd_pat) {
                if (nd_pat == JS_MAX_PATTERNS) {
                    js_refuse(b, c->where, "more than %d distinct 'patternProperties' patterns in one object are not supported",
                              JS_MAX_PATTERNS);
                    goto done;
                }
                distinct[nd_pat++] = k;
            }
            if (np == 4 * JS_MAX_PATTERNS) {
                js_refuse(b, c->where, "more than %d 'patternProperties' entries in one object are not supported",
                          4 * JS_MAX_PATTERNS);
                goto done;
            }
            pats[np].pat = k;
            pats[np].s = v;
            pats[np].bit = bit;
            pats[np++].grp = g;
        }
    }
    /* the declared names: value rule, or JR_NONE when the name cannot be present */
    for (int i = 0; i < d->n; i++) {
        for (int j = 0; j < c->n_req; j++) req[i] |= strcmp(c->req[j], d->name[i]) == 0;
        bool key_ok = !keys_none;
        if (key_ok && kc) {
            key_ok = str_ok(b, &keys, d->name[i], strlen(d->name[i]), c->where);
            if (kc->has_en) {
                bool in = false;
                for (size_t e = 0; e < kc->n_en; e++)
                    in |= json_is_string(kc->en[e]) && strcmp(json_string_value(kc->en[e]), d->name[i]) == 0;
                key_ok &= in;
            }
        }
        if (b->st) goto done;
        rv[i] = JR_NONE;
        if (key_ok && js_emit_list(b, member_list(b, c, d->name[i], pats, np, 0, true), depth + 1, &rv[i])) goto done;
        if (rv[i] == JR_NONE && req[i]) goto done; /* a required name that cannot be present: no object */
    }
    /* further members: one cell per set of patterns matched */
    if (!keys_none && !keys_finite) {
        const char **ex = js_alloc(b, (size_t)(d->n + (int)keys.n_except + 1) * sizeof *ex);
        size_t *exl = js_alloc(b, (size_t)(d->n + (int)keys.n_except + 1) * sizeof *exl);
        if (!ex || !exl) goto done;
        for (size_t i = 0; i < keys.n_except; i++) {
            ex[i] = keys.except[i];
            exl[i] = keys.except_len[i];
        }
        for (int i = 0; i < d->n; i++) {
            ex[keys.n_except + (size_t)i] = d->name[i];
            exl[keys.n_except + (size_t)i] = strlen(d->name[i]);
        }
        for (unsigned m = 0; m < (1u << nd_pat) && !b->st; m++) {
            int64_t r;
            if (js_emit_list(b, member_list(b, c, NULL, pats, np, m, false), depth + 1, &r)) goto done;
            if (r == JR_NONE) continue;
            jstr_spec ks = keys;
            ks.except = ex;
            ks.except_len = exl;
            ks.n_except = keys.n_except + (size_t)d->n;
            bool room = true;
            for (int i = 0; i < nd_pat && room; i++) {
                if ((m >> i) & 1u) {
                    if (ks.n_pattern == JSTR_MAX_ITEMS) room = false;
                    else ks.pattern[ks.n_pattern++] = distinct[i];
                } else {
                    if (ks.n_not_pattern == JSTR_MAX_ITEMS) room = false;
                    else ks.not_pattern[ks.n_not_pattern++] = distinct[i];
                }
            }
            if (!room) {
                js_refuse(b, c->where, "too many key patterns in one object");
                goto done;
            }
            char kn[160], vn[32];
            snprintf(kn, sizeof kn, "%s-k%u", name, m);
            if (str_trivial(&ks)) snprintf(kn, sizeof kn, "string");
            else if (!str_rule(b, &ks, kn, c->where)) {
                if (b->st) goto done;
                continue;
            }
            rule_name(vn, sizeof vn, r);
            js_sputf(b, &cells, "%s%s ws \":\" ws %s", cells.n ? " | " : "", kn, vn);
        }
    }
    if (b->st) goto done;
    /* counted members: rules name-o<i>-<c> */
    int64_t minp = c->min_props, maxp = c->max_props;
    int64_t cc = maxp >= 0 ? maxp : BASE_MAX(minp, 1);
    int64_t nd = d->n;
    if ((nd + 1) * (cc + 1) > JS_MAX_COUNT_RULES) {
        js_refuse(b, c->where, "an object whose member counts need over %d rules is not supported",
                  JS_MAX_COUNT_RULES);
        goto done;
    }
    n_alive = (size_t)((nd + 1) * (cc + 1));
    alive = base_calloc(n_alive, 1);
    if (!alive) {
        js_oom(b);
        goto done;
    }
#define AL(i, k) alive[(size_t)(i) * (size_t)(cc + 1) + (size_t)(k)]
#define NEXT(k) (maxp >= 0 ? (k) + 1 : BASE_MIN((k) + 1, cc))
    for (int64_t i = nd; i >= 0; i--)
        for (int64_t q = cc; q >= 0; q--) {
            bool more = maxp < 0 || q < maxp;
            bool a = false;
            if (i == nd) {
                a = q >= minp || (more && cells.n && NEXT(q) != q && AL(i, NEXT(q)));
            } else {
                if (!req[i] && AL(i + 1, q)) a = true;
                if (more && rv[i] != JR_NONE && AL(i + 1, NEXT(q))) a = true;
            }
            AL(i, q) = a;
        }
    if (!AL(0, 0)) goto done;
    /* bit 1: reachable from the start through live states (only those are written) */
    AL(0, 0) |= 2;
    for (int64_t i = 0; i <= nd; i++)
        for (int64_t q = 0; q <= cc; q++) {
            if (AL(i, q) != 3) continue;
            bool more = maxp < 0 || q < maxp;
            if (i == nd) {
                if (more && cells.n && AL(i, NEXT(q))) AL(i, NEXT(q)) |= 2;
            } else {
                if (!req[i] && AL(i + 1, q)) AL(i + 1, q) |= 2;
                if (more && rv[i] != JR_NONE && AL(i + 1, NEXT(q))) AL(i + 1, NEXT(q)) |= 2;
            }
        }
    js_sputf(b, &o, "%s ::= \"{\" ws %s-o0-0\n", name, name);
    for (int64_t i = 0; i <= nd && !b->st; i++)
        for (int64_t q = 0; q <= cc && !b->st; q++) {
            if (AL(i, q) != 3) continue;
            const char *sep = q == 0 ? "" : "\",\" ws ";
            bool more = maxp < 0 || q < maxp;
            bool any = false;
            js_sputf(b, &o, "%s-o%lld-%lld ::= ", name, (long long)i, (long long)q);
            if (i == nd) {
                if (q >= minp) {
                    js_sputs(b, &o, "\"}\"");
                    any = true;
                }
                if (more && cells.n && AL(i, NEXT(q)))
                    js_sputf(b, &o, "%s%s( %s ) ws %s-o%lld-%lld", any ? " | " : "", sep, cells.d, name,
                             (long long)i, (long long)NEXT(q));
            } else {
                if (!req[i] && AL(i + 1, q)) {
                    js_sputf(b, &o, "%s-o%lld-%lld", name, (long long)(i + 1), (long long)q);
                    any = true;
                }
                if (more && rv[i] != JR_NONE && AL(i + 1, NEXT(q))) {
                    char vn[32];
                    rule_name(vn, sizeof vn, rv[i]);
                    js_sputf(b, &o, "%s%s", any ? " | " : "", sep);
                    js_put_jstring(b, &o, d->name[i], strlen(d->name[i]));
                    js_sputf(b, &o, " ws \":\" ws %s ws %s-o%lld-%lld", vn, name, (long long)(i + 1),
                             (long long)NEXT(q));
                }
            }
            js_sputs(b, &o, "\n");
        }
#undef AL
#undef NEXT
    add_rules(b, o.d ? o.d : "", o.n);
    ok = !b->st;
done:
    js_sfree(&cells);
    js_sfree(&o);
    base_free(alive, n_alive);
    base_free(d, sizeof *d);
    base_free(rv, JS_MAX_NAMES * sizeof *rv);
    base_free(req, JS_MAX_NAMES * sizeof *req);
    return ok;
}

static void key_list(jsb *b, sbuf *k, char tag, jsl l)
{
    js_sputf(b, k, "|%c", tag);
    for (int i = 0; i < l.n; i++) js_sputf(b, k, "%p,", (void *)l.v[i]);
}

/* The array or object rule of c, shared with an earlier conjunction whose
 * array (object) fields are the same (a $ref target met at many places). */
static bool shared_rule(jsb *b, const jconj *c, const char *name, int depth, bool obj)
{
    sbuf k = {0};
    if (obj) {
        js_sputf(b, &k, "O%lld,%lld", (long long)c->min_props, (long long)c->max_props);
        for (int g = 0; g < c->n_grp; g++)
            js_sputf(b, &k, "|g%p,%p,%p", (void *)c->grp[g].props, (void *)c->grp[g].pats, (void *)c->grp[g].addl);
        key_texts(b, &k, 'r', c->req, NULL, c->n_req);
        key_list(b, &k, 'p', c->pnames);
    } else {
        js_sputf(b, &k, "A%lld,%lld,%d", (long long)c->min_items, (long long)c->max_items, (int)c->unique);
        for (int i = 0; i < c->n_pre; i++) key_list(b, &k, 'e', c->pre[i]);
        key_list(b, &k, 'i', c->items);
        for (int i = 0; i < c->n_ct; i++)
            js_sputf(b, &k, "|c%p,%lld,%lld,%lld", (void *)c->ct[i].s, (long long)c->ct[i].mn, (long long)c->ct[i].mx,
                     (long long)c->ct[i].from);
    }
    int key;
    int seen = b->st ? 0 : spec_seen(b, &k, name, &key);
    js_sfree(&k);
    if (seen >= 0) return seen == 1;
    bool ok = obj ? obj_rule(b, c, name, depth) : arr_rule(b, c, name, depth);
    spec_done(b, key, !ok);
    return ok && !b->st;
}

/* ---- values against the normal form (enum / const arrays and objects) ------------------- */

/* Whether v satisfies every schema of l. */
static bool list_test(jsb *b, jsl l, json_t *v, int depth)
{
    if (depth > JS_MAX_EMIT_DEPTH) {
        js_refuse(b, l.n ? js_path(b, l.v[0]) : "/", "an 'enum' value nested more than %d deep", JS_MAX_EMIT_DEPTH);
        return false;
    }
    if (!l.n) return true;
    jdnf x;
    if (js_norm_list(b, l, 0, &x)) return false;
    for (int i = 0; i < x.n && !b->st; i++)
        if (conj_test(b, &x.c[i], v, depth + 1)) return true;
    return false;
}

/* Whether the value v satisfies conjunction c (a validator over the normal
 * form, used to filter enum values where the grammar cannot). */
static bool conj_test(jsb *b, const jconj *c, json_t *v, int depth)
{
    unsigned k = json_is_null(v) ? JK_NULL : json_is_boolean(v) ? JK_BOOL : json_is_number(v) ? JK_NUM
               : json_is_string(v) ? JK_STR : json_is_array(v) ? JK_ARR : JK_OBJ;
    if (!(c->kinds & k) || b->st) return false;
    if (c->has_en) {
        bool in = false;
        for (size_t i = 0; i < c->n_en && !in; i++) in = js_value_eq(c->en[i], v);
        if (!in) return false;
    }
    switch (k) {
    case JK_NULL: return true;
    case JK_BOOL: return (c->bools & (json_is_true(v) ? 2u : 1u)) != 0;
    case JK_NUM: {
        char t[JNUM_TEXT_CAP], e[BASE_ERR_CAP] = "";
        bool ok = false;
        if (!jnum_text(v, t)) return false;
        keel_status jst = jnum_test(&c->num, t, &ok, e);
        if (jst) sub_fail(b, jst, c->where, e);
        return ok;
    }
    case JK_STR: return str_ok(b, &c->str, json_string_value(v), json_string_length(v), c->where);
    case JK_ARR: {
        int64_t n = (int64_t)json_array_size(v);
        if (n < c->min_items || (c->max_items >= 0 && n > c->max_items)) return false;
        for (int64_t i = 0; i < n; i++)
            if (!list_test(b, i < c->n_pre ? c->pre[i] : c->items, json_array_get(v, (size_t)i), depth)) return false;
        for (int j = 0; j < c->n_ct; j++) {
            int64_t cnt = 0;
            for (int64_t i = c->ct[j].from; i < n && !b->st; i++)
                cnt += list_test(b, (jsl){(json_t **)&c->ct[j].s, 1}, json_array_get(v, (size_t)i), depth);
            if (cnt < c->ct[j].mn || (c->ct[j].mx >= 0 && cnt > c->ct[j].mx)) return false;
        }
        if (c->unique)
            for (int64_t i = 0; i < n; i++)
                for (int64_t j = i + 1; j < n; j++)
                    if (js_value_eq(json_array_get(v, (size_t)i), json_array_get(v, (size_t)j))) return false;
        return !b->st;
    }
    default: {
        int64_t n = (int64_t)json_object_size(v);
        if (n < c->min_props || (c->max_props >= 0 && n > c->max_props)) return false;
        for (int i = 0; i < c->n_req; i++)
            if (!json_object_get(v, c->req[i])) return false;
        jpat pats[4 * JS_MAX_PATTERNS];
        int np = 0;
        for (int g = 0; g < c->n_grp; g++) {
            const char *pk;
            json_t *pv;
            json_object_foreach(c->grp[g].pats, pk, pv) {
                if (np == 4 * JS_MAX_PATTERNS) {
                    js_refuse(b, c->where, "too many 'patternProperties' entries in one object");
                    return false;
                }
                pats[np].pat = pk;
                pats[np].s = pv;
                pats[np].bit = 0;
                pats[np++].grp = g;
            }
        }
        const char *key;
        json_t *x;
        json_object_foreach(v, key, x) {
            if (c->pnames.n) {
                json_t *ks = json_string(key);
                if (!ks) return js_oom(b), false;
                bool ok = list_test(b, c->pnames, ks, depth);
                json_decref(ks);
                if (!ok) return false;
            }
            if (!list_test(b, member_list(b, c, key, pats, np, 0, true), x, depth)) return false;
        }
        return !b->st;
    }
    }
}

/* ---- conjunctions and lists ------------------------------------------------------------------ */

/* The alternatives of conjunction c (" | alt" each) into line. */
static void emit_conj(jsb *b, const jconj *c, int64_t id, int ci, sbuf *line, int depth)
{
    char name[96];
    if (c->has_en) {
        int seq = 0;
        for (size_t i = 0; i < c->n_en && !b->st; i++) {
            json_t *v = c->en[i];
            unsigned k = 0;
            bool ok = true;
            switch (json_typeof(v)) {
            case JSON_NULL: k = JK_NULL; break;
            case JSON_TRUE: k = JK_BOOL, ok = (c->bools & 2u) != 0; break;
            case JSON_FALSE: k = JK_BOOL, ok = (c->bools & 1u) != 0; break;
            case JSON_INTEGER:
            case JSON_REAL: {
                k = JK_NUM;
                char t[JNUM_TEXT_CAP], e[BASE_ERR_CAP] = "";
                keel_status jst = KEEL_OK;
                if (!jnum_text(v, t)) ok = false;
                else jst = jnum_test(&c->num, t, &ok, e);
                if (jst) sub_fail(b, jst, c->where, e);
                break;
            }
            case JSON_STRING:
                k = JK_STR;
                ok = str_ok(b, &c->str, json_string_value(v), json_string_length(v), c->where);
                break;
            case JSON_ARRAY:
                k = JK_ARR;
                if (arr_constrained(c)) ok = conj_test(b, c, v, depth + 1);
                break;
            default:
                k = JK_OBJ;
                if (obj_constrained(c)) ok = conj_test(b, c, v, depth + 1);
                break;
            }
            if (b->st || !ok || !(c->kinds & k)) continue;
            snprintf(name, sizeof name, "s%lld-%d-e", (long long)id, ci);
            js_sputs(b, line, " | ");
            put_value(b, line, v, name, &seq, 0);
        }
        return;
    }
    if (c->kinds & JK_NULL) js_sputs(b, line, " | \"null\"");
    if ((c->kinds & JK_BOOL) && (c->bools & 2u)) js_sputs(b, line, " | \"true\"");
    if ((c->kinds & JK_BOOL) && (c->bools & 1u)) js_sputs(b, line, " | \"false\"");
    if (c->kinds & JK_NUM) {
        snprintf(name, sizeof name, "s%lld-%d-n", (long long)id, ci);
        if (num_trivial(&c->num)) js_sputs(b, line, " | number");
        else if (num_rule(b, &c->num, name, c->where)) js_sputf(b, line, " | %s", name);
    }
    if (c->kinds & JK_STR) {
        snprintf(name, sizeof name, "s%lld-%d-s", (long long)id, ci);
        if (str_trivial(&c->str)) js_sputs(b, line, " | string");
        else if (str_rule(b, &c->str, name, c->where)) js_sputf(b, line, " | %s", name);
    }
    if (c->kinds & JK_ARR) {
        snprintf(name, sizeof name, "s%lld-%d-a", (long long)id, ci);
        if (!arr_constrained(c)) js_sputs(b, line, " | array");
        else if (shared_rule(b, c, name, depth, false)) js_sputf(b, line, " | %s", name);
    }
    if (c->kinds & JK_OBJ) {
        snprintf(name, sizeof name, "s%lld-%d-o", (long long)id, ci);
        if (!obj_constrained(c)) js_sputs(b, line, " | object");
        else if (shared_rule(b, c, name, depth, true)) js_sputf(b, line, " | %s", name);
    }
}

keel_status js_emit_list(jsb *b, jsl l, int depth, int64_t *rule)
{
    *rule = JR_NONE;
    if (b->st) return b->st;
    if (depth > JS_MAX_EMIT_DEPTH)
        return js_refuse(b, l.n ? js_path(b, l.v[0]) : "/", "sub-schemas (items, property values) nested more than %d deep",
                         JS_MAX_EMIT_DEPTH);
    int n_true = 0;
    for (int i = 0; i < l.n; i++) {
        if (json_is_false(l.v[i])) return KEEL_OK;
        n_true += json_is_true(l.v[i]);
    }
    if (n_true == l.n) {
        *rule = JR_ANY;
        return KEEL_OK;
    }
    if (l.n > 256) return js_refuse(b, js_path(b, l.v[0]), "a conjunction of more than 256 schemas");
    const char *key = NULL;
    int m = js_memo_find(b, l, &key);
    if (b->st) return b->st;
    if (m >= 0) {
        jmemo *e = &b->memo[m];
        *rule = e->done && e->none ? JR_NONE : e->rule;
        if (!e->done) e->none = true; /* marks "referenced while being emitted" */
        return KEEL_OK;
    }
    if (b->n_memo == JS_MAX_MEMO) return js_refuse(b, js_path(b, l.v[0]), "more than %d distinct subschemas", JS_MAX_MEMO);
    m = b->n_memo++;
    int64_t id = b->next_rule++;
    b->memo[m].key = key;
    b->memo[m].rule = id;
    jdnf x;
    if (js_norm_list(b, l, 0, &x)) return b->st; /* nesting of in-place applicators counts from here */
    bool referenced = b->memo[m].none;
    if (x.n == 1 && js_conj_trivial(&x.c[0]) && !referenced) {
        b->memo[m].done = true;
        b->memo[m].rule = JR_ANY;
        *rule = JR_ANY;
        return KEEL_OK;
    }
    sbuf line = {0};
    for (int i = 0; i < x.n && !b->st; i++) emit_conj(b, &x.c[i], id, i, &line, depth);
    referenced = b->memo[m].none;
    b->memo[m].done = true;
    if (!b->st && line.n == 0) {
        b->memo[m].none = true;
        if (referenced) js_refuse(b, js_path(b, l.v[0]), "a recursive schema that accepts nothing");
    } else if (!b->st) {
        b->memo[m].none = false;
        js_sputf(b, &b->out, "s%lld ::=%s\n", (long long)id, line.d + 2);
        *rule = id;
    }
    js_sfree(&line);
    return b->st;
}
