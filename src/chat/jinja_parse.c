/*
 * jinja_parse.c — the parser: tokens to an AST, following jinja2.parser
 * (same precedence, same statement forms, same quirks: `is` tests bind
 * tighter than `not`, `**` is left-associative, a test may take one bare
 * argument, adjacent string literals concatenate). Binary operators are
 * parsed by precedence climbing so that one level of parentheses costs a
 * few stack frames, and a nesting counter bounds the recursion
 * (PARSE_MAX_DEPTH) well inside a 256 KiB stack.
 *
 * After parsing, a check pass reports unknown filters and tests the way
 * jinja2's compiler does: at compile time, except inside an if statement
 * or a conditional expression, where the error waits until the filter runs.
 */
#include "jinja_int.h"

#include <stdio.h>
#include <string.h>

#define PARSE_MAX_DEPTH 128 /* nesting of expressions (about 3 per parenthesis) and blocks */

typedef struct parser {
    jinja_template *t;
    jmem *m;
    jtok *tk;
    size_t n, i;
    int depth;
    int loops;     /* enclosing for loops in the current macro (break/continue) */
    jnode *macro;  /* the macro or call block whose body is being parsed */
    uintptr_t stack_base; /* frame address at jinja_parse's entry */
    const jstr **names; /* intern table (open addressing) */
    size_t names_cap, names_n;
    char *err;
} parser;

static keel_status pfail(parser *p, uint32_t line, const char *fmt, ...) BASE_PRINTF(3, 4);

static keel_status pfail(parser *p, uint32_t line, const char *fmt, ...)
{
    if (p->err) {
        int k = snprintf(p->err, JINJA_ERR_CAP, "template line %u: ", line);
        if (k > 0 && (size_t)k < JINJA_ERR_CAP) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(p->err + k, JINJA_ERR_CAP - (size_t)k, fmt, ap);
            va_end(ap);
        }
    }
    return KEEL_EFORMAT;
}

static keel_status poom(parser *p)
{
    return base_err(p->err, p->m->fail ? p->m->fail : KEEL_ENOMEM, "out of memory");
}

/* ---- tokens ---------------------------------------------------------------- */

static const jtok *cur(const parser *p)
{
    return &p->tk[p->i];
}

static const jtok *look(const parser *p)
{
    return &p->tk[p->i + 1 < p->n ? p->i + 1 : p->n - 1];
}

static void adv(parser *p)
{
    if (p->i + 1 < p->n) p->i++;
}

static bool tok_name(const jtok *t, const char *name)
{
    size_t n = strlen(name);
    return t->type == TK_NAME && t->n == n && memcmp(t->s, name, n) == 0;
}

static bool tok_op(const jtok *t, int op)
{
    return t->type == TK_OP && t->op == op;
}

static const char *op_text(int op)
{
    static const char *const txt[] = {
        "?", "+", "-", "/", "//", "*", "**", "%", "~", "[", "]", "(", ")", "{", "}",
        "==", "!=", ">", ">=", "<", "<=", "=", ".", ":", "|", ",", ";",
    };
    return op > 0 && op < (int)BASE_ARRAY_LEN(txt) ? txt[op] : "?";
}

/* jinja2's describe_token */
static void describe(const jtok *t, char *buf, size_t cap)
{
    switch (t->type) {
    case TK_EOF: snprintf(buf, cap, "end of template"); break;
    case TK_DATA: snprintf(buf, cap, "template data"); break;
    case TK_VAR_BEGIN: snprintf(buf, cap, "begin of print statement"); break;
    case TK_VAR_END: snprintf(buf, cap, "end of print statement"); break;
    case TK_BLOCK_BEGIN: snprintf(buf, cap, "begin of statement block"); break;
    case TK_BLOCK_END: snprintf(buf, cap, "end of statement block"); break;
    case TK_NAME: snprintf(buf, cap, "%.*s", (int)BASE_MIN(t->n, 60), t->s); break;
    case TK_STRING: snprintf(buf, cap, "string"); break;
    case TK_INT: snprintf(buf, cap, "integer"); break;
    case TK_FLOAT: snprintf(buf, cap, "float"); break;
    default: snprintf(buf, cap, "%s", op_text(t->op)); break;
    }
}

static keel_status unexpected(parser *p, const char *want)
{
    char got[80];
    describe(cur(p), got, sizeof got);
    if (cur(p)->type == TK_EOF)
        return pfail(p, cur(p)->line, "unexpected end of template%s%s", want ? ", expected " : "",
                     want ? want : "");
    if (want) return pfail(p, cur(p)->line, "expected %s, got '%s'", want, got);
    return pfail(p, cur(p)->line, "unexpected '%s'", got);
}

static keel_status expect_op(parser *p, int op)
{
    if (!tok_op(cur(p), op)) {
        char want[16];
        snprintf(want, sizeof want, "'%s'", op_text(op));
        return unexpected(p, want);
    }
    adv(p);
    return KEEL_OK;
}

static keel_status expect_type(parser *p, int type, const char *what)
{
    if (cur(p)->type != type) return unexpected(p, what);
    adv(p);
    return KEEL_OK;
}

static keel_status enter(parser *p)
{
    if (++p->depth > PARSE_MAX_DEPTH)
        return base_err(p->err, KEEL_EOVERFLOW,
                        "template line %u: nested more than %d levels deep", cur(p)->line,
                        PARSE_MAX_DEPTH);
    if (jinja_stack_used(p->stack_base) > JINJA_STACK_BUDGET)
        return base_err(p->err, KEEL_EOVERFLOW, "template line %u: nested too deeply (%d KiB of "
                        "stack used)", cur(p)->line, JINJA_STACK_BUDGET / 1024);
    return KEEL_OK;
}

/* ---- nodes and names -------------------------------------------------------- */

static jnode *node(parser *p, int kind, uint32_t line)
{
    jnode *n = jmem_zalloc(p->m, sizeof *n);
    if (n) {
        n->kind = (uint8_t)kind;
        n->line = line;
    }
    return n;
}

const jstr *jinja_intern(parser *p, const char *s, size_t n);

const jstr *jinja_intern(parser *p, const char *s, size_t n)
{
    if (p->names_n * 2 + 2 > p->names_cap) {
        size_t cap = p->names_cap ? p->names_cap * 2 : 64;
        const jstr **tab = jmem_zalloc(p->m, cap * sizeof *tab);
        if (!tab) return NULL;
        for (size_t i = 0; i < p->names_cap; i++) {
            const jstr *e = p->names[i];
            if (!e) continue;
            size_t h = (size_t)jstr_hash(e->s, e->n) & (cap - 1);
            while (tab[h]) h = (h + 1) & (cap - 1);
            tab[h] = e;
        }
        p->names = tab;
        p->names_cap = cap;
    }
    size_t h = (size_t)jstr_hash(s, n) & (p->names_cap - 1);
    while (p->names[h]) {
        const jstr *e = p->names[h];
        if (e->n == n && memcmp(e->s, s, n) == 0) return e;
        h = (h + 1) & (p->names_cap - 1);
    }
    jstr *e = jstr_new(p->m, s, n);
    if (!e) return NULL;
    if (n == 0) {
        /* keep one distinct empty name object */
        e = jmem_zalloc(p->m, sizeof *e);
        if (!e) return NULL;
        e->s = "";
        e->ascii = true;
    }
    p->names[h] = e;
    p->names_n++;
    return e;
}

/* Appends to a next-linked list kept as head + tail pointer. */
static void list_add(jnode **head, jnode **tail, jnode *n)
{
    if (*tail)
        (*tail)->next = n;
    else
        *head = n;
    *tail = n;
}

/* ---- expressions -------------------------------------------------------------- */

enum { PREC_OR = 1, PREC_AND, PREC_NOT, PREC_CMP, PREC_ADD, PREC_CONCAT, PREC_MUL, PREC_POW };

enum tuple_mode { TUP_SIMPLE, TUP_COND, TUP_NOCOND };

static keel_status parse_expression(parser *p, bool with_cond, jnode **out);
static keel_status parse_unary(parser *p, bool with_filter, jnode **out);
static keel_status parse_primary(parser *p, jnode **out);
static keel_status parse_tuple(parser *p, int mode, const char *extra_end, bool explicit_parens,
                               jnode **out);
static keel_status parse_postfix(parser *p, jnode **e);
static keel_status parse_filter(parser *p, jnode **e, bool start_inline);

/* The binary operator at the cursor: its jop and precedence (0 if none). */
static int binop_at(const parser *p, int *prec, int *len)
{
    const jtok *t = cur(p);
    *len = 1;
    if (t->type == TK_NAME) {
        if (tok_name(t, "or")) return *prec = PREC_OR, -1;
        if (tok_name(t, "and")) return *prec = PREC_AND, -2;
        if (tok_name(t, "in")) return *prec = PREC_CMP, JO_IN;
        if (tok_name(t, "not") && tok_name(look(p), "in")) return *len = 2, *prec = PREC_CMP, JO_NOTIN;
        return 0;
    }
    if (t->type != TK_OP) return 0;
    switch (t->op) {
    case OP_EQ: *prec = PREC_CMP; return JO_EQ;
    case OP_NE: *prec = PREC_CMP; return JO_NE;
    case OP_LT: *prec = PREC_CMP; return JO_LT;
    case OP_LE: *prec = PREC_CMP; return JO_LE;
    case OP_GT: *prec = PREC_CMP; return JO_GT;
    case OP_GE: *prec = PREC_CMP; return JO_GE;
    case OP_ADD: *prec = PREC_ADD; return JO_ADD;
    case OP_SUB: *prec = PREC_ADD; return JO_SUB;
    case OP_TILDE: *prec = PREC_CONCAT; return JO_CONCAT;
    case OP_MUL: *prec = PREC_MUL; return JO_MUL;
    case OP_DIV: *prec = PREC_MUL; return JO_DIV;
    case OP_FLOORDIV: *prec = PREC_MUL; return JO_FLOORDIV;
    case OP_MOD: *prec = PREC_MUL; return JO_MOD;
    case OP_POW: *prec = PREC_POW; return JO_POW;
    default: return 0;
    }
}

static keel_status parse_binary(parser *p, int min, jnode **out)
{
    TRY(enter(p));
    jnode *left = NULL;
    uint32_t line = cur(p)->line;
    if (min <= PREC_NOT && tok_name(cur(p), "not")) {
        adv(p);
        jnode *operand = NULL;
        TRY(parse_binary(p, PREC_NOT, &operand));
        left = node(p, JK_NOT, line);
        if (!left) return poom(p);
        left->a = operand;
    } else {
        TRY(parse_unary(p, true, &left));
    }
    for (;;) {
        int prec, len;
        int op = binop_at(p, &prec, &len);
        if (!op || prec < min) break;
        line = cur(p)->line;
        if (prec == PREC_CMP) {
            jnode *cmp = node(p, JK_COMPARE, line), *tail = NULL;
            if (!cmp) return poom(p);
            cmp->a = left;
            while ((op = binop_at(p, &prec, &len)) != 0 && prec == PREC_CMP) {
                p->i += (size_t)len;
                jnode *o = node(p, JK_CMPOP, cur(p)->line);
                if (!o) return poom(p);
                o->op = (uint8_t)op;
                TRY(parse_binary(p, PREC_CMP + 1, &o->a));
                list_add(&cmp->b, &tail, o);
            }
            left = cmp;
            continue;
        }
        adv(p);
        jnode *right = NULL;
        TRY(parse_binary(p, prec + 1, &right));
        jnode *b = node(p, op == -1 ? JK_OR : op == -2 ? JK_AND : JK_BIN, line);
        if (!b) return poom(p);
        if (op > 0) b->op = (uint8_t)op;
        b->a = left;
        b->b = right;
        left = b;
    }
    p->depth--;
    *out = left;
    return KEEL_OK;
}

static keel_status parse_condexpr(parser *p, jnode **out)
{
    jnode *e1 = NULL;
    TRY(parse_binary(p, PREC_OR, &e1));
    while (tok_name(cur(p), "if")) {
        uint32_t line = cur(p)->line;
        adv(p);
        jnode *c = node(p, JK_COND, line);
        if (!c) return poom(p);
        TRY(parse_binary(p, PREC_OR, &c->a));
        c->b = e1;
        if (tok_name(cur(p), "else")) {
            adv(p);
            TRY(enter(p));
            TRY(parse_condexpr(p, &c->c));
            p->depth--;
        }
        e1 = c;
    }
    *out = e1;
    return KEEL_OK;
}

static keel_status parse_expression(parser *p, bool with_cond, jnode **out)
{
    return with_cond ? parse_condexpr(p, out) : parse_binary(p, PREC_OR, out);
}

static bool is_tuple_end(const parser *p, const char *extra_end)
{
    const jtok *t = cur(p);
    if (t->type == TK_VAR_END || t->type == TK_BLOCK_END || t->type == TK_EOF) return true;
    if (tok_op(t, OP_RPAREN)) return true;
    return extra_end && tok_name(t, extra_end);
}

static keel_status parse_tuple(parser *p, int mode, const char *extra_end, bool explicit_parens,
                               jnode **out)
{
    uint32_t line = cur(p)->line;
    jnode *head = NULL, *tail = NULL;
    bool is_tuple = false;
    size_t count = 0;
    for (;;) {
        if (count) TRY(expect_op(p, OP_COMMA));
        if (is_tuple_end(p, extra_end)) break;
        jnode *e = NULL;
        if (mode == TUP_SIMPLE)
            TRY(parse_primary(p, &e));
        else
            TRY(parse_expression(p, mode == TUP_COND, &e));
        list_add(&head, &tail, e);
        count++;
        if (tok_op(cur(p), OP_COMMA))
            is_tuple = true;
        else
            break;
    }
    if (!is_tuple) {
        if (count) {
            *out = head;
            return KEEL_OK;
        }
        if (!explicit_parens) {
            char got[80];
            describe(cur(p), got, sizeof got);
            return pfail(p, cur(p)->line, "Expected an expression, got '%s'", got);
        }
    }
    jnode *t = node(p, JK_TUPLE, line);
    if (!t) return poom(p);
    t->a = head;
    *out = t;
    return KEEL_OK;
}

static keel_status parse_list_or_dict(parser *p, bool dict, jnode **out)
{
    uint32_t line = cur(p)->line;
    adv(p); /* [ or { */
    jnode *l = node(p, dict ? JK_DICT : JK_LIST, line), *tail = NULL;
    if (!l) return poom(p);
    int close = dict ? OP_RBRACE : OP_RBRACKET;
    size_t count = 0;
    while (!tok_op(cur(p), close)) {
        if (count) TRY(expect_op(p, OP_COMMA));
        if (tok_op(cur(p), close)) break;
        jnode *e = NULL;
        TRY(parse_expression(p, true, &e));
        if (dict) {
            jnode *pair = node(p, JK_PAIR, e->line);
            if (!pair) return poom(p);
            pair->a = e;
            TRY(expect_op(p, OP_COLON));
            TRY(parse_expression(p, true, &pair->b));
            e = pair;
        }
        list_add(&l->a, &tail, e);
        count++;
    }
    TRY(expect_op(p, close));
    *out = l;
    return KEEL_OK;
}

static keel_status parse_primary(parser *p, jnode **out)
{
    const jtok *t = cur(p);
    jnode *e = NULL;
    switch (t->type) {
    case TK_NAME:
        if (tok_name(t, "true") || tok_name(t, "True") || tok_name(t, "false") ||
            tok_name(t, "False")) {
            e = node(p, JK_CONST, t->line);
            if (!e) return poom(p);
            e->val = jv_bool(t->s[0] == 't' || t->s[0] == 'T');
        } else if (tok_name(t, "none") || tok_name(t, "None")) {
            e = node(p, JK_CONST, t->line);
            if (!e) return poom(p);
            e->val = jv_none();
        } else {
            e = node(p, JK_NAME, t->line);
            if (!e) return poom(p);
            e->name = jinja_intern(p, t->s, t->n);
            if (!e->name) return poom(p);
            if (p->macro) {
                if (e->name == p->t->names.varargs) p->macro->op |= JM_VARARGS;
                if (e->name == p->t->names.kwargs) p->macro->op |= JM_KWARGS;
                if (e->name == p->t->names.caller) p->macro->op |= JM_CALLER;
            }
        }
        adv(p);
        break;
    case TK_STRING: {
        e = node(p, JK_CONST, t->line);
        if (!e) return poom(p);
        jstr *s = t->str;
        adv(p);
        while (cur(p)->type == TK_STRING) {
            s = jstr_cat(p->m, s, cur(p)->str);
            if (!s) return poom(p);
            adv(p);
        }
        e->val = jv_strv(s);
        break;
    }
    case TK_INT:
    case TK_FLOAT:
        e = node(p, JK_CONST, t->line);
        if (!e) return poom(p);
        e->val = t->type == TK_INT ? jv_int(t->i) : jv_float(t->f);
        adv(p);
        break;
    case TK_OP:
        if (t->op == OP_LPAREN) {
            adv(p);
            TRY(enter(p));
            TRY(parse_tuple(p, TUP_COND, NULL, true, &e));
            p->depth--;
            TRY(expect_op(p, OP_RPAREN));
            break;
        }
        if (t->op == OP_LBRACKET || t->op == OP_LBRACE) {
            TRY(enter(p));
            TRY(parse_list_or_dict(p, t->op == OP_LBRACE, &e));
            p->depth--;
            break;
        }
        return unexpected(p, NULL);
    default:
        return unexpected(p, NULL);
    }
    *out = e;
    return KEEL_OK;
}

/* (args): positional, name=value, *args, **kwargs -> next-linked nodes. */
static keel_status parse_call_args(parser *p, jnode **out)
{
    TRY(expect_op(p, OP_LPAREN));
    TRY(enter(p));
    jnode *head = NULL, *tail = NULL;
    bool require_comma = false, have_kw = false, have_dyn = false, have_dkw = false;
    while (!tok_op(cur(p), OP_RPAREN)) {
        if (require_comma) {
            TRY(expect_op(p, OP_COMMA));
            if (tok_op(cur(p), OP_RPAREN)) break;
        }
        uint32_t line = cur(p)->line;
        jnode *a = NULL;
        if (tok_op(cur(p), OP_MUL)) {
            if (have_dyn || have_dkw) return pfail(p, line, "invalid syntax for function call expression");
            adv(p);
            a = node(p, JK_STARARG, line);
            if (!a) return poom(p);
            TRY(parse_expression(p, true, &a->a));
            have_dyn = true;
        } else if (tok_op(cur(p), OP_POW)) {
            if (have_dkw) return pfail(p, line, "invalid syntax for function call expression");
            adv(p);
            a = node(p, JK_DSTARARG, line);
            if (!a) return poom(p);
            TRY(parse_expression(p, true, &a->a));
            have_dkw = true;
        } else if (cur(p)->type == TK_NAME && tok_op(look(p), OP_ASSIGN)) {
            if (have_dkw) return pfail(p, line, "invalid syntax for function call expression");
            a = node(p, JK_KWARG, line);
            if (!a) return poom(p);
            a->name = jinja_intern(p, cur(p)->s, cur(p)->n);
            if (!a->name) return poom(p);
            p->i += 2;
            TRY(parse_expression(p, true, &a->a));
            have_kw = true;
        } else {
            if (have_dyn || have_dkw || have_kw)
                return pfail(p, line, "invalid syntax for function call expression");
            TRY(parse_expression(p, true, &a));
        }
        list_add(&head, &tail, a);
        require_comma = true;
    }
    TRY(expect_op(p, OP_RPAREN));
    p->depth--;
    *out = head;
    return KEEL_OK;
}

static keel_status parse_call(parser *p, jnode **e)
{
    jnode *c = node(p, JK_CALL, cur(p)->line);
    if (!c) return poom(p);
    c->a = *e;
    TRY(parse_call_args(p, &c->b));
    *e = c;
    return KEEL_OK;
}

/* One subscript item: an expression or a slice a:b:c. */
static keel_status parse_subscribed(parser *p, jnode **out)
{
    uint32_t line = cur(p)->line;
    jnode *parts[3] = {NULL, NULL, NULL};
    if (tok_op(cur(p), OP_COLON)) {
        adv(p);
    } else {
        jnode *e = NULL;
        TRY(parse_expression(p, true, &e));
        if (!tok_op(cur(p), OP_COLON)) {
            *out = e;
            return KEEL_OK;
        }
        adv(p);
        parts[0] = e;
    }
    if (tok_op(cur(p), OP_COLON)) {
        /* a::c */
    } else if (!tok_op(cur(p), OP_RBRACKET) && !tok_op(cur(p), OP_COMMA)) {
        TRY(parse_expression(p, true, &parts[1]));
    }
    if (tok_op(cur(p), OP_COLON)) {
        adv(p);
        if (!tok_op(cur(p), OP_RBRACKET) && !tok_op(cur(p), OP_COMMA))
            TRY(parse_expression(p, true, &parts[2]));
    }
    jnode *s = node(p, JK_SLICE, line);
    if (!s) return poom(p);
    s->b = parts[0];
    s->c = parts[1];
    s->d = parts[2];
    *out = s;
    return KEEL_OK;
}

static keel_status parse_subscript(parser *p, jnode **e)
{
    const jtok *t = cur(p);
    uint32_t line = t->line;
    if (tok_op(t, OP_DOT)) {
        adv(p);
        const jtok *a = cur(p);
        if (a->type == TK_NAME) {
            jnode *g = node(p, JK_ATTR, line);
            if (!g) return poom(p);
            g->a = *e;
            g->name = jinja_intern(p, a->s, a->n);
            if (!g->name) return poom(p);
            adv(p);
            *e = g;
            return KEEL_OK;
        }
        if (a->type != TK_INT) return pfail(p, a->line, "expected name or number");
        jnode *k = node(p, JK_CONST, line), *g = node(p, JK_ITEM, line);
        if (!k || !g) return poom(p);
        k->val = jv_int(a->i);
        g->a = *e;
        g->b = k;
        adv(p);
        *e = g;
        return KEEL_OK;
    }
    /* [ ... ] */
    adv(p);
    TRY(enter(p));
    jnode *head = NULL, *tail = NULL;
    size_t count = 0;
    while (!tok_op(cur(p), OP_RBRACKET)) {
        if (count) TRY(expect_op(p, OP_COMMA));
        jnode *s = NULL;
        TRY(parse_subscribed(p, &s));
        list_add(&head, &tail, s);
        count++;
    }
    TRY(expect_op(p, OP_RBRACKET));
    p->depth--;
    if (count == 0) return pfail(p, line, "expected an expression in the subscript");
    if (count == 1 && head->kind == JK_SLICE) {
        head->a = *e;
        *e = head;
        return KEEL_OK;
    }
    jnode *key = head;
    if (count > 1) {
        key = node(p, JK_TUPLE, line);
        if (!key) return poom(p);
        key->a = head;
    }
    jnode *g = node(p, JK_ITEM, line);
    if (!g) return poom(p);
    g->a = *e;
    g->b = key;
    *e = g;
    return KEEL_OK;
}

static keel_status parse_postfix(parser *p, jnode **e)
{
    for (;;) {
        const jtok *t = cur(p);
        if (tok_op(t, OP_DOT) || tok_op(t, OP_LBRACKET))
            TRY(parse_subscript(p, e));
        else if (tok_op(t, OP_LPAREN))
            TRY(parse_call(p, e));
        else
            return KEEL_OK;
    }
}

/* A dotted filter or test name into a template-owned string. */
static keel_status parse_dotted_name(parser *p, const jstr **out)
{
    if (cur(p)->type != TK_NAME) return unexpected(p, "name");
    const char *s0 = cur(p)->s;
    size_t n = cur(p)->n;
    adv(p);
    char buf[256];
    size_t k = BASE_MIN(n, sizeof buf - 1);
    memcpy(buf, s0, k);
    while (tok_op(cur(p), OP_DOT)) {
        adv(p);
        if (cur(p)->type != TK_NAME) return unexpected(p, "name");
        if (k + 1 + cur(p)->n < sizeof buf) {
            buf[k++] = '.';
            memcpy(buf + k, cur(p)->s, cur(p)->n);
            k += cur(p)->n;
        }
        adv(p);
    }
    *out = jinja_intern(p, buf, k);
    return *out ? KEEL_OK : poom(p);
}

static keel_status parse_filter(parser *p, jnode **e, bool start_inline)
{
    while (tok_op(cur(p), OP_PIPE) || start_inline) {
        if (!start_inline) adv(p);
        start_inline = false;
        jnode *f = node(p, JK_FILTER, cur(p)->line);
        if (!f) return poom(p);
        TRY(parse_dotted_name(p, &f->name));
        f->n = jinja_filter_id(f->name->s, f->name->n);
        if (tok_op(cur(p), OP_LPAREN)) TRY(parse_call_args(p, &f->b));
        f->a = *e;
        *e = f;
    }
    return KEEL_OK;
}

static keel_status parse_test(parser *p, jnode **e)
{
    uint32_t line = cur(p)->line;
    adv(p); /* is */
    bool negated = false;
    if (tok_name(cur(p), "not")) {
        adv(p);
        negated = true;
    }
    jnode *t = node(p, JK_TEST, line);
    if (!t) return poom(p);
    TRY(parse_dotted_name(p, &t->name));
    t->n = jinja_test_id(t->name->s, t->name->n);
    t->a = *e;
    const jtok *c = cur(p);
    if (tok_op(c, OP_LPAREN)) {
        TRY(parse_call_args(p, &t->b));
    } else if ((c->type == TK_NAME || c->type == TK_STRING || c->type == TK_INT ||
                c->type == TK_FLOAT || tok_op(c, OP_LPAREN) || tok_op(c, OP_LBRACKET) ||
                tok_op(c, OP_LBRACE)) &&
               !tok_name(c, "else") && !tok_name(c, "or") && !tok_name(c, "and")) {
        if (tok_name(c, "is")) return pfail(p, c->line, "You cannot chain multiple tests with is");
        jnode *arg = NULL;
        TRY(enter(p));
        TRY(parse_primary(p, &arg));
        TRY(parse_postfix(p, &arg));
        p->depth--;
        t->b = arg;
    }
    if (negated) t->op = 1;
    *e = t;
    return KEEL_OK;
}

static keel_status parse_filter_expr(parser *p, jnode **e)
{
    for (;;) {
        const jtok *t = cur(p);
        if (tok_op(t, OP_PIPE))
            TRY(parse_filter(p, e, false));
        else if (tok_name(t, "is"))
            TRY(parse_test(p, e));
        else if (tok_op(t, OP_LPAREN))
            TRY(parse_call(p, e));
        else
            return KEEL_OK;
    }
}

static keel_status parse_unary(parser *p, bool with_filter, jnode **out)
{
    TRY(enter(p));
    const jtok *t = cur(p);
    jnode *e = NULL;
    if (tok_op(t, OP_SUB) || tok_op(t, OP_ADD)) {
        e = node(p, tok_op(t, OP_SUB) ? JK_NEG : JK_POS, t->line);
        if (!e) return poom(p);
        adv(p);
        TRY(parse_unary(p, false, &e->a));
    } else {
        TRY(parse_primary(p, &e));
    }
    TRY(parse_postfix(p, &e));
    if (with_filter) TRY(parse_filter_expr(p, &e));
    p->depth--;
    *out = e;
    return KEEL_OK;
}

/* ---- statements ----------------------------------------------------------------- */

static keel_status subparse(parser *p, const char *const *ends, jnode **out);

static bool at_end_tag(const parser *p, const char *const *ends)
{
    if (!ends) return false;
    for (size_t k = 0; ends[k]; k++)
        if (tok_name(cur(p), ends[k])) return true;
    return false;
}

/* After a statement's header: optional ':' and %}, then the body up to one
 * of ends (the end tag's name is consumed if drop). */
static keel_status parse_statements(parser *p, const char *const *ends, bool drop, jnode **out)
{
    if (tok_op(cur(p), OP_COLON)) adv(p);
    TRY(expect_type(p, TK_BLOCK_END, "end of statement block"));
    TRY(enter(p));
    TRY(subparse(p, ends, out));
    p->depth--;
    if (cur(p)->type == TK_EOF) {
        char want[128];
        size_t k = 0;
        for (size_t e = 0; ends[e] && k < sizeof want - 24; e++)
            k += (size_t)snprintf(want + k, sizeof want - k, "%s'%s'", e ? " or " : "", ends[e]);
        return pfail(p, cur(p)->line, "Unexpected end of template. Jinja was looking for the "
                                      "following tags: %s.",
                     want);
    }
    if (drop) adv(p);
    return KEEL_OK;
}

static keel_status check_assignable(parser *p, const jnode *t)
{
    if (t->kind == JK_NAME) {
        if (jstr_eqc(t->name, "loop") || jstr_eqc(t->name, "self"))
            return KEEL_OK; /* jinja2 allows these; they shadow */
        return KEEL_OK;
    }
    if (t->kind == JK_TUPLE) {
        for (const jnode *c = t->a; c; c = c->next) TRY(check_assignable(p, c));
        return KEEL_OK;
    }
    return pfail(p, t->line, "can't assign to '%s'",
                 t->kind == JK_CONST ? "Const" : t->kind == JK_LIST ? "List" : "expression");
}

static keel_status parse_assign_target(parser *p, bool with_namespace, const char *extra_end,
                                       jnode **out)
{
    const jtok *t = cur(p);
    if (with_namespace && t->type == TK_NAME && tok_op(look(p), OP_DOT)) {
        jnode *ns = node(p, JK_NAME, t->line), *a = node(p, JK_ATTR, t->line);
        if (!ns || !a) return poom(p);
        ns->name = jinja_intern(p, t->s, t->n);
        adv(p);
        adv(p);
        if (cur(p)->type != TK_NAME) return unexpected(p, "name");
        a->name = jinja_intern(p, cur(p)->s, cur(p)->n);
        if (!ns->name || !a->name) return poom(p);
        adv(p);
        a->a = ns;
        *out = a;
        return KEEL_OK;
    }
    jnode *e = NULL;
    TRY(parse_tuple(p, TUP_SIMPLE, extra_end, false, &e));
    TRY(check_assignable(p, e));
    *out = e;
    return KEEL_OK;
}

static keel_status parse_name_only(parser *p, const jstr **out)
{
    if (cur(p)->type != TK_NAME) return unexpected(p, "name");
    *out = jinja_intern(p, cur(p)->s, cur(p)->n);
    adv(p);
    return *out ? KEEL_OK : poom(p);
}

/* (a, b=1, ...) -> JK_PARAM list */
static keel_status parse_signature(parser *p, jnode **out)
{
    TRY(expect_op(p, OP_LPAREN));
    jnode *head = NULL, *tail = NULL;
    bool defaults = false;
    while (!tok_op(cur(p), OP_RPAREN)) {
        if (head) TRY(expect_op(p, OP_COMMA));
        jnode *a = node(p, JK_PARAM, cur(p)->line);
        if (!a) return poom(p);
        TRY(parse_name_only(p, &a->name));
        if (tok_op(cur(p), OP_ASSIGN)) {
            adv(p);
            TRY(parse_expression(p, true, &a->a));
            defaults = true;
        } else if (defaults) {
            return pfail(p, a->line, "non-default argument follows default argument");
        }
        list_add(&head, &tail, a);
    }
    TRY(expect_op(p, OP_RPAREN));
    *out = head;
    return KEEL_OK;
}

/* A macro or call-block body: break/continue do not cross it. */
static keel_status parse_macro_body(parser *p, jnode *m, const char *end)
{
    const char *ends[] = {end, NULL};
    jnode *save_macro = p->macro;
    int save_loops = p->loops;
    p->macro = m;
    p->loops = 0;
    keel_status st = parse_statements(p, ends, true, &m->c);
    p->macro = save_macro;
    p->loops = save_loops;
    return st;
}

static keel_status parse_for(parser *p, jnode *f)
{
    static const char *const ends_body[] = {"endfor", "else", NULL};
    static const char *const ends_else[] = {"endfor", NULL};
    TRY(parse_assign_target(p, false, "in", &f->a));
    if (!tok_name(cur(p), "in")) return unexpected(p, "'in'");
    adv(p);
    TRY(parse_tuple(p, TUP_NOCOND, "recursive", false, &f->b));
    if (tok_name(cur(p), "if")) {
        adv(p);
        TRY(parse_expression(p, true, &f->e));
    }
    if (tok_name(cur(p), "recursive")) {
        adv(p);
        f->op = 1;
    }
    p->loops++;
    TRY(parse_statements(p, ends_body, false, &f->c));
    p->loops--;
    bool is_else = tok_name(cur(p), "else");
    adv(p);
    if (is_else) TRY(parse_statements(p, ends_else, true, &f->d));
    return KEEL_OK;
}

static keel_status parse_if(parser *p, jnode *n)
{
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    static const char *const ends_else[] = {"endif", NULL};
    jnode *cur_if = n;
    int nest = 0;
    for (;;) {
        TRY(parse_tuple(p, TUP_NOCOND, NULL, false, &cur_if->a));
        TRY(parse_statements(p, ends, false, &cur_if->b));
        const jtok *t = cur(p);
        if (tok_name(t, "elif")) {
            jnode *e = node(p, JK_IF, t->line);
            if (!e) return poom(p);
            e->op = 1; /* an elif: run in the chain's loop, not nested */
            adv(p);
            cur_if->c = e;
            cur_if = e;
            if (++nest > 1000000) return pfail(p, t->line, "too many elif");
            continue;
        }
        bool is_else = tok_name(t, "else");
        adv(p);
        if (is_else) TRY(parse_statements(p, ends_else, true, &cur_if->c));
        return KEEL_OK;
    }
}

static void skip_to_block_end(parser *p)
{
    while (cur(p)->type != TK_BLOCK_END && cur(p)->type != TK_EOF) adv(p);
}

static keel_status parse_statement(parser *p, jnode **out)
{
    const jtok *t = cur(p);
    uint32_t line = t->line;
    if (t->type != TK_NAME) return pfail(p, line, "tag name expected");
    jnode *n = NULL;
#define TAG(s) tok_name(t, s)
    if (TAG("for")) {
        adv(p);
        n = node(p, JK_FOR, line);
        if (!n) return poom(p);
        TRY(parse_for(p, n));
    } else if (TAG("if")) {
        adv(p);
        n = node(p, JK_IF, line);
        if (!n) return poom(p);
        TRY(parse_if(p, n));
    } else if (TAG("set")) {
        adv(p);
        jnode *target = NULL;
        TRY(parse_assign_target(p, true, NULL, &target));
        if (tok_op(cur(p), OP_ASSIGN)) {
            adv(p);
            n = node(p, JK_SET, line);
            if (!n) return poom(p);
            n->a = target;
            TRY(parse_tuple(p, TUP_COND, NULL, false, &n->b));
        } else {
            static const char *const ends[] = {"endset", NULL};
            n = node(p, JK_SETBLOCK, line);
            if (!n) return poom(p);
            n->a = target;
            jnode *f = NULL;
            TRY(parse_filter(p, &f, false));
            n->b = f;
            TRY(parse_statements(p, ends, true, &n->c));
        }
    } else if (TAG("macro")) {
        adv(p);
        n = node(p, JK_MACRO, line);
        if (!n) return poom(p);
        TRY(parse_name_only(p, &n->name));
        TRY(parse_signature(p, &n->a));
        TRY(parse_macro_body(p, n, "endmacro"));
    } else if (TAG("call")) {
        adv(p);
        n = node(p, JK_CALLBLOCK, line);
        if (!n) return poom(p);
        if (tok_op(cur(p), OP_LPAREN)) TRY(parse_signature(p, &n->a));
        TRY(parse_expression(p, true, &n->b));
        if (n->b->kind != JK_CALL) return pfail(p, line, "expected call");
        TRY(parse_macro_body(p, n, "endcall"));
    } else if (TAG("filter")) {
        static const char *const ends[] = {"endfilter", NULL};
        adv(p);
        n = node(p, JK_FILTERBLOCK, line);
        if (!n) return poom(p);
        jnode *f = NULL;
        TRY(parse_filter(p, &f, true));
        n->b = f;
        TRY(parse_statements(p, ends, true, &n->c));
    } else if (TAG("with")) {
        static const char *const ends[] = {"endwith", NULL};
        adv(p);
        n = node(p, JK_WITH, line);
        if (!n) return poom(p);
        jnode *tail = NULL;
        while (cur(p)->type != TK_BLOCK_END) {
            if (n->a) TRY(expect_op(p, OP_COMMA));
            jnode *s = node(p, JK_SET, cur(p)->line);
            if (!s) return poom(p);
            TRY(parse_assign_target(p, false, NULL, &s->a));
            TRY(expect_op(p, OP_ASSIGN));
            TRY(parse_expression(p, true, &s->b));
            list_add(&n->a, &tail, s);
        }
        TRY(parse_statements(p, ends, true, &n->c));
    } else if (TAG("do")) {
        adv(p);
        n = node(p, JK_DO, line);
        if (!n) return poom(p);
        TRY(parse_tuple(p, TUP_COND, NULL, false, &n->a));
    } else if (TAG("print")) {
        adv(p);
        n = node(p, JK_OUTPUT, line);
        if (!n) return poom(p);
        TRY(parse_tuple(p, TUP_COND, NULL, false, &n->a));
    } else if (TAG("break") || TAG("continue")) {
        if (p->loops == 0)
            return pfail(p, line, "'%s' outside of a loop", TAG("break") ? "break" : "continue");
        n = node(p, TAG("break") ? JK_BREAK : JK_CONTINUE, line);
        if (!n) return poom(p);
        adv(p);
    } else if (TAG("generation") || TAG("block") || TAG("autoescape")) {
        bool block = TAG("block"), autoesc = TAG("autoescape");
        static const char *const ends_gen[] = {"endgeneration", NULL};
        static const char *const ends_block[] = {"endblock", NULL};
        static const char *const ends_auto[] = {"endautoescape", NULL};
        adv(p);
        n = node(p, JK_SCOPE, line);
        if (!n) return poom(p);
        if (block) {
            TRY(parse_name_only(p, &n->name));
            if (tok_name(cur(p), "scoped")) adv(p);
            if (tok_name(cur(p), "required")) adv(p);
        } else if (autoesc) {
            jnode *e = NULL;
            TRY(parse_expression(p, true, &e));
            n->a = e; /* must be false when run (escaping is not supported) */
            n->op = 1;
        }
        TRY(parse_statements(p, block ? ends_block : autoesc ? ends_auto : ends_gen, true, &n->c));
        if (block && cur(p)->type == TK_NAME) adv(p); /* {% endblock name %} */
    } else if (TAG("include") || TAG("import") || TAG("from") || TAG("extends")) {
        n = node(p, JK_UNSUPPORTED, line);
        if (!n) return poom(p);
        n->name = jinja_intern(p, t->s, t->n);
        if (!n->name) return poom(p);
        skip_to_block_end(p);
    } else {
        char got[80];
        describe(t, got, sizeof got);
        return pfail(p, line, "Encountered unknown tag '%s'.", got);
    }
#undef TAG
    *out = n;
    return KEEL_OK;
}

static keel_status subparse(parser *p, const char *const *ends, jnode **out)
{
    jnode *head = NULL, *tail = NULL;
    for (;;) {
        const jtok *t = cur(p);
        if (t->type == TK_EOF) break;
        if (t->type == TK_DATA) {
            jnode *d = node(p, JK_TEXT, t->line);
            if (!d) return poom(p);
            jstr *s = jstr_new(p->m, t->s, t->n);
            if (!s) return poom(p);
            d->val = jv_strv(s);
            list_add(&head, &tail, d);
            adv(p);
        } else if (t->type == TK_VAR_BEGIN) {
            adv(p);
            jnode *o = node(p, JK_OUTPUT, t->line);
            if (!o) return poom(p);
            TRY(parse_tuple(p, TUP_COND, NULL, false, &o->a));
            TRY(expect_type(p, TK_VAR_END, "end of print statement"));
            list_add(&head, &tail, o);
        } else if (t->type == TK_BLOCK_BEGIN) {
            adv(p);
            if (at_end_tag(p, ends)) break;
            jnode *s = NULL;
            TRY(parse_statement(p, &s));
            TRY(expect_type(p, TK_BLOCK_END, "end of statement block"));
            list_add(&head, &tail, s);
        } else {
            return unexpected(p, NULL);
        }
    }
    *out = head;
    return KEEL_OK;
}

/* ---- unknown filters and tests ------------------------------------------------- */

static keel_status check_node(parser *p, const jnode *n, bool soft, int depth);

static keel_status check_list(parser *p, const jnode *n, bool soft, int depth)
{
    for (; n; n = n->next) TRY(check_node(p, n, soft, depth));
    return KEEL_OK;
}

/* The recursion of this pass is the evaluator's: statement lists, elif
 * chains and the left operands of binary operators are walked in loops, every
 * other child one level deeper. Bounding it here bounds evaluation. */
static keel_status check_node(parser *p, const jnode *n, bool soft, int depth)
{
    while (n) {
        if (depth > JINJA_MAX_HEIGHT || jinja_stack_used(p->stack_base) > JINJA_STACK_BUDGET)
            return base_err(p->err, KEEL_EOVERFLOW,
                            "template line %u: nested more than %d levels deep", n->line,
                            JINJA_MAX_HEIGHT);
        if ((n->kind == JK_FILTER || n->kind == JK_TEST) && n->n == 0 && !soft)
            return pfail(p, n->line, "No %s named '%.*s'.",
                         n->kind == JK_FILTER ? "filter" : "test", (int)n->name->n, n->name->s);
        switch (n->kind) {
        case JK_IF:
            /* if / elif chain, all soft */
            TRY(check_node(p, n->a, true, depth + 1));
            TRY(check_list(p, n->b, true, depth + 1));
            if (n->c && n->c->kind == JK_IF && n->c->op == 1) {
                n = n->c;
                soft = true;
                continue;
            }
            return check_list(p, n->c, true, depth + 1);
        case JK_BIN:
        case JK_AND:
        case JK_OR:
            TRY(check_node(p, n->b, soft, depth + 1));
            n = n->a;
            continue;
        case JK_COND:
            TRY(check_node(p, n->a, true, depth + 1));
            TRY(check_node(p, n->b, true, depth + 1));
            return check_node(p, n->c, true, depth + 1);
        case JK_FOR:
            TRY(check_node(p, n->a, soft, depth + 1));
            TRY(check_node(p, n->b, soft, depth + 1));
            TRY(check_list(p, n->c, false, depth + 1));
            TRY(check_list(p, n->d, false, depth + 1));
            return check_node(p, n->e, false, depth + 1);
        case JK_MACRO:
            TRY(check_list(p, n->a, false, depth + 1));
            return check_list(p, n->c, false, depth + 1);
        case JK_CALLBLOCK:
            TRY(check_node(p, n->b, soft, depth + 1));
            TRY(check_list(p, n->a, false, depth + 1));
            return check_list(p, n->c, false, depth + 1);
        case JK_FILTERBLOCK:
        case JK_SETBLOCK:
        case JK_WITH:
        case JK_SCOPE:
            TRY(check_list(p, n->a, false, depth + 1));
            TRY(check_node(p, n->b, false, depth + 1));
            return check_list(p, n->c, false, depth + 1);
        case JK_LIST:
        case JK_TUPLE:
        case JK_DICT:
            return check_list(p, n->a, soft, depth + 1);
        case JK_CALL:
        case JK_FILTER:
        case JK_TEST:
            TRY(check_list(p, n->b, soft, depth + 1));
            n = n->a;
            depth++;
            continue;
        case JK_COMPARE:
            TRY(check_list(p, n->b, soft, depth + 1));
            n = n->a;
            depth++;
            continue;
        default:
            TRY(check_node(p, n->b, soft, depth + 1));
            TRY(check_node(p, n->c, soft, depth + 1));
            TRY(check_node(p, n->d, soft, depth + 1));
            TRY(check_node(p, n->e, soft, depth + 1));
            n = n->a;
            depth++;
            continue;
        }
    }
    return KEEL_OK;
}

keel_status jinja_parse(jinja_template *t, const char *src, size_t len, char *err)
{
    parser p = {0};
    p.stack_base = jinja_stack_here();
    p.t = t;
    p.m = &t->mem;
    p.err = err;
    TRY(jinja_lex(p.m, src, len, &p.tk, &p.n, err));
    t->names.loop = jinja_intern(&p, "loop", 4);
    t->names.varargs = jinja_intern(&p, "varargs", 7);
    t->names.kwargs = jinja_intern(&p, "kwargs", 6);
    t->names.caller = jinja_intern(&p, "caller", 6);
    t->names.self_ = jinja_intern(&p, "self", 4);
    if (!t->names.loop || !t->names.varargs || !t->names.kwargs || !t->names.caller ||
        !t->names.self_)
        return poom(&p);
    TRY(subparse(&p, NULL, &t->body));
    if (cur(&p)->type != TK_EOF) return unexpected(&p, NULL);
    return check_list(&p, t->body, false, 0);
}
