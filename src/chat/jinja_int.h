/*
 * jinja_int.h — internals shared by the jinja_*.c files: the arena, values
 * (Python-shaped: str, int, float, list, tuple, dict, None, Undefined,
 * namespace, macros, bound methods, loop objects), the token stream, the AST
 * and the render context.
 *
 * Memory: a template owns one arena (AST, interned names, constants); a
 * render owns another that holds every value it creates and is freed whole
 * at the end (so shared and cyclic values need no reference counts). Values
 * reachable from a template's constants are never written by a render:
 * literal lists and dicts are rebuilt at each evaluation.
 */
#ifndef KEEL_CHAT_JINJA_INT_H
#define KEEL_CHAT_JINJA_INT_H

#include "jinja.h"

#define JV_MAX_DEPTH 130 /* nesting of values walked recursively (JSON input: 128) */

#include <stdarg.h>

/* ---- arena ---------------------------------------------------------------- */

typedef struct jmem_chunk jmem_chunk;

typedef struct jmem {
    jmem_chunk *head; /* newest chunk first */
    size_t total;     /* bytes taken from the hooks */
    size_t limit;     /* most bytes total may reach */
    keel_status fail; /* KEEL_ENOMEM or KEEL_EOVERFLOW after a failed take */
} jmem;

void jmem_init(jmem *m, size_t limit);
/* n bytes, 16-byte aligned, not zeroed; NULL (and m->fail set) on failure. */
void *jmem_alloc(jmem *m, size_t n);
void *jmem_zalloc(jmem *m, size_t n);
/* n * size bytes with overflow checking. */
void *jmem_alloc_n(jmem *m, size_t n, size_t size);
void jmem_free_all(jmem *m);

/* ---- values --------------------------------------------------------------- */

typedef enum jtype {
    JT_UNDEF = 0, /* jinja2's default Undefined */
    JT_NONE,
    JT_BOOL,
    JT_INT,
    JT_FLOAT,
    JT_STR,
    JT_LIST,   /* list, tuple, range, views and generators (jlist.kind) */
    JT_DICT,
    JT_NS,     /* namespace(): a dict with attribute access */
    JT_MACRO,  /* a macro or a call block's caller */
    JT_FUNC,   /* a builtin function or a method bound to a value */
    JT_LOOP,   /* the loop object of a for loop */
    JT_CYCLER, /* cycler() */
    JT_JOINER, /* joiner() */
} jtype;

typedef struct jstr jstr;
typedef struct jlist jlist;
typedef struct jdict jdict;
typedef struct jmacro jmacro;
typedef struct jbound jbound;
typedef struct jloop jloop;
typedef struct jundef jundef;
typedef struct jcycler jcycler;

typedef struct jv {
    uint8_t t;    /* jtype */
    uint8_t safe; /* JT_STR: marked safe (Markup) — printing is unchanged */
    uint16_t fn;  /* JT_FUNC: jfn id */
    uint32_t pad;
    union {
        bool b;
        int64_t i;
        double f;
        jstr *s;
        jlist *l;
        jdict *d;
        jmacro *m;
        jbound *bound; /* JT_FUNC: NULL for a plain builtin */
        jloop *loop;
        jundef *u;     /* JT_UNDEF: why (NULL: anonymous) */
        jcycler *cy;
        void *p;
    } u;
} jv;

struct jstr {
    const char *s; /* n bytes, a NUL follows them (usually stored right after this header) */
    size_t n;
    bool ascii;    /* all bytes < 0x80 (then bytes are code points) */
};

typedef enum jlist_kind {
    JL_LIST = 0,
    JL_TUPLE,
    JL_RANGE,    /* range(start, stop, step): items made on first need (jv_range_fill) */
    JL_ITEMS,    /* dict.items() */
    JL_KEYS,     /* dict.keys() */
    JL_VALUES,   /* dict.values() */
    JL_GEN,      /* a generator (map, select, ...): always true, no len() */
    JL_REVITER,  /* reversed(list) */
} jlist_kind;

struct jlist {
    size_t n, cap;
    jv *v;           /* [cap] */
    uint8_t kind;    /* jlist_kind */
    int64_t r0, r1, r2; /* JL_RANGE: start, stop, step (printing) */
};

struct jdict {
    size_t n, cap;   /* entries in insertion order */
    jv *k, *v;       /* [cap] keys, values */
    uint32_t *idx;   /* open-addressing index of entry+1 (0 empty), NULL if small */
    size_t idx_cap;  /* power of two, > 2 * n */
};

/* Why a value is undefined (messages as jinja2 words them). */
typedef enum jundef_kind {
    JU_NAME,    /* 'x' is undefined */
    JU_ATTR,    /* 'dict object' has no attribute 'x' */
    JU_ITEM,    /* list object has no element 3 */
    JU_HINT,    /* a fixed message */
} jundef_kind;

struct jundef {
    uint8_t kind;
    uint8_t obj_t;    /* jtype of the object (JU_ATTR, JU_ITEM) */
    const char *hint; /* JU_HINT: static text */
    jv key;           /* the missing name or index */
};

typedef struct jnode jnode;
typedef struct jscope jscope;

struct jmacro {
    const jnode *def;   /* JK_MACRO or JK_CALLBLOCK (its caller) */
    jscope *closure;    /* scope the macro was defined in */
    jv caller;          /* a call block's macro gets its caller (or undefined) */
};

struct jbound {
    jv self;            /* the value the method is bound to */
};

struct jcycler {
    jv *items;
    size_t n, pos;
    jstr *sep;          /* joiner */
    bool used;          /* joiner */
};

/* The builtin functions and methods (a JT_FUNC's fn). */
typedef enum jfn {
    JF_NONE = 0,
    /* globals */
    JF_RANGE, JF_NAMESPACE, JF_DICT, JF_RAISE, JF_STRFTIME, JF_CYCLER, JF_JOINER, JF_LIPSUM,
    /* str methods */
    JF_S_UPPER, JF_S_LOWER, JF_S_STRIP, JF_S_LSTRIP, JF_S_RSTRIP, JF_S_SPLIT, JF_S_RSPLIT,
    JF_S_SPLITLINES, JF_S_STARTSWITH, JF_S_ENDSWITH, JF_S_REPLACE, JF_S_FIND, JF_S_RFIND,
    JF_S_INDEX, JF_S_RINDEX, JF_S_COUNT, JF_S_JOIN, JF_S_TITLE, JF_S_CAPITALIZE,
    JF_S_SWAPCASE, JF_S_CASEFOLD, JF_S_FORMAT, JF_S_ISALPHA, JF_S_ISDIGIT, JF_S_ISDECIMAL,
    JF_S_ISNUMERIC, JF_S_ISALNUM, JF_S_ISSPACE, JF_S_ISLOWER, JF_S_ISUPPER, JF_S_ISTITLE,
    JF_S_ISASCII, JF_S_ISIDENTIFIER, JF_S_PARTITION, JF_S_RPARTITION, JF_S_REMOVEPREFIX,
    JF_S_REMOVESUFFIX, JF_S_CENTER, JF_S_LJUST, JF_S_RJUST, JF_S_ZFILL, JF_S_EXPANDTABS,
    JF_S_ENCODE,
    /* list methods */
    JF_L_APPEND, JF_L_POP, JF_L_INSERT, JF_L_EXTEND, JF_L_REMOVE, JF_L_INDEX, JF_L_COUNT,
    JF_L_REVERSE, JF_L_SORT, JF_L_COPY, JF_L_CLEAR,
    /* dict methods */
    JF_D_GET, JF_D_ITEMS, JF_D_KEYS, JF_D_VALUES, JF_D_POP, JF_D_SETDEFAULT, JF_D_UPDATE,
    JF_D_COPY, JF_D_CLEAR, JF_D_POPITEM,
    /* loop, cycler, joiner */
    JF_LOOP_CYCLE, JF_LOOP_CHANGED, JF_CY_NEXT, JF_CY_RESET,
    JF_COUNT_
} jfn;

/* ---- value constructors and helpers (jinja_value.c) ----------------------- */

static inline jv jv_undef(void)
{
    jv v = {0};
    return v;
}
static inline jv jv_none(void)
{
    jv v = {0};
    v.t = JT_NONE;
    return v;
}
static inline jv jv_bool(bool b)
{
    jv v = {0};
    v.t = JT_BOOL;
    v.u.b = b;
    return v;
}
static inline jv jv_int(int64_t i)
{
    jv v = {0};
    v.t = JT_INT;
    v.u.i = i;
    return v;
}
static inline jv jv_float(double f)
{
    jv v = {0};
    v.t = JT_FLOAT;
    v.u.f = f;
    return v;
}
static inline jv jv_strv(jstr *s)
{
    jv v = {0};
    v.t = JT_STR;
    v.u.s = s;
    return v;
}
static inline jv jv_listv(jlist *l)
{
    jv v = {0};
    v.t = JT_LIST;
    v.u.l = l;
    return v;
}
static inline jv jv_dictv(jdict *d)
{
    jv v = {0};
    v.t = JT_DICT;
    v.u.d = d;
    return v;
}
static inline jv jv_func(jfn fn, jbound *b)
{
    jv v = {0};
    v.t = JT_FUNC;
    v.fn = (uint16_t)fn;
    v.u.bound = b;
    return v;
}

/* Strings (NULL on allocation failure; m->fail says why). */
jstr *jstr_new(jmem *m, const char *s, size_t n);
jstr *jstr_cat(jmem *m, const jstr *a, const jstr *b);
extern jstr jstr_empty_; /* the empty string (static) */
#define JSTR_EMPTY (&jstr_empty_)
bool jstr_eq(const jstr *a, const jstr *b);
bool jstr_eqc(const jstr *a, const char *c);
int jstr_cmp(const jstr *a, const jstr *b);
/* Code points of s. */
size_t jstr_len_cp(const jstr *s);
uint64_t jstr_hash(const char *s, size_t n);

/* A string under construction (arena; grows by doubling). */
typedef struct jsb {
    jmem *m;
    char *d;     /* [cap + 1] bytes */
    size_t n;    /* bytes written */
    size_t cap;  /* bytes available for data (excluding the NUL) */
    size_t max;  /* most bytes allowed (output limit) */
    bool ascii;
    bool over;   /* max exceeded */
    bool oom;
} jsb;

void jsb_init(jsb *b, jmem *m, size_t max);
bool jsb_add(jsb *b, const char *s, size_t n);
bool jsb_addc(jsb *b, char c);
bool jsb_adds(jsb *b, const char *s);
bool jsb_addf(jsb *b, const char *fmt, ...) BASE_PRINTF(2, 3);
/* Appends a UTF-8 encoded code point. */
bool jsb_addcp(jsb *b, uint32_t cp);
/* Finishes: the string (JSTR_EMPTY if nothing); the builder is reset. */
jstr *jsb_done(jsb *b);

/* Lists and dicts. */
jlist *jlist_new(jmem *m, size_t cap, uint8_t kind);
bool jlist_push(jmem *m, jlist *l, jv v);
bool jlist_insert(jmem *m, jlist *l, size_t at, jv v);
jdict *jdict_new(jmem *m, size_t cap);
/* Finds key; index of the entry or -1. */
int64_t jdict_find(const jdict *d, jv key);
int64_t jdict_find_str(const jdict *d, const char *s, size_t n);
/* Sets key (insert at end or replace in place). false on OOM. */
bool jdict_set(jmem *m, jdict *d, jv key, jv val);
/* Removes the entry at i (keeps order). false on OOM (index rebuild). */
bool jdict_remove(jmem *m, jdict *d, size_t i);
/* Hash of a hashable key (str, int, float, bool, None, tuple); false if
 * unhashable. */
bool jv_hash(jv v, uint64_t *h, int depth);

/* UTF-8 */
/* Decodes one code point at s[*i] (valid UTF-8 assumed), advancing *i. */
uint32_t utf8_next(const char *s, size_t n, size_t *i);
int utf8_encode(uint32_t cp, char out[4]);
/* Bytes of the valid UTF-8 prefix of s[0..n). */
size_t utf8_check(const char *s, size_t n);
/* True if all n bytes are valid UTF-8 (no surrogates, no overlongs). */
bool utf8_valid(const char *s, size_t n);
/* Byte offset of code point index cp in s (clamped to n). */
size_t utf8_offset(const jstr *s, size_t cp);
/* Python str.isspace() for one code point. */
bool py_isspace(uint32_t cp);

/* ---- AST ------------------------------------------------------------------ */

typedef enum jkind {
    /* expressions */
    JK_CONST,    /* val */
    JK_NAME,     /* name */
    JK_LIST,     /* a: items (next-linked) */
    JK_TUPLE,    /* a: items */
    JK_DICT,     /* a: JK_PAIR items (a key, b value) */
    JK_PAIR,
    JK_ATTR,     /* a . name */
    JK_ITEM,     /* a [ b ] */
    JK_SLICE,    /* a [ b : c : d ] (each may be NULL) */
    JK_CALL,     /* a ( b: args ) */
    JK_FILTER,   /* a | name ( b: args ); a NULL in a filter block */
    JK_TEST,     /* a is name ( b: args ); op 1: negated */
    JK_NEG, JK_POS, JK_NOT,
    JK_BIN,      /* a op b (op: jop) */
    JK_AND, JK_OR,
    JK_COMPARE,  /* a, then b: JK_CMPOP chain (op, a operand) */
    JK_CMPOP,
    JK_COND,     /* b if a else c (c NULL: undefined) */
    JK_KWARG,    /* name = a (call arguments) */
    JK_STARARG,  /* *a */
    JK_DSTARARG, /* **a */
    JK_PARAM,    /* macro parameter: name, a default (or NULL) */
    /* statements */
    JK_TEXT,     /* val (a string) */
    JK_OUTPUT,   /* {{ a }} */
    JK_IF,       /* if a: b (body) else c (body, or one JK_IF for elif) */
    JK_FOR,      /* for a (target) in b: c body, d else body, e filter; op 1: recursive */
    JK_SET,      /* a (target) = b */
    JK_SETBLOCK, /* a (target) = rendered c body, then b (filter chain, a NULL) */
    JK_MACRO,    /* name, a params, c body */
    JK_CALLBLOCK,/* b (the call), a caller params, c body */
    JK_FILTERBLOCK, /* b filter chain (innermost a NULL), c body */
    JK_WITH,     /* a: JK_SET assignments, c body */
    JK_DO,       /* a */
    JK_BREAK, JK_CONTINUE,
    JK_SCOPE,    /* c body rendered in place (generation, block) */
    JK_UNSUPPORTED, /* include/import/extends: fails when run; val names it */
} jkind;

typedef enum jop {
    JO_ADD = 1, JO_SUB, JO_MUL, JO_DIV, JO_FLOORDIV, JO_MOD, JO_POW, JO_CONCAT,
    JO_EQ, JO_NE, JO_LT, JO_LE, JO_GT, JO_GE, JO_IN, JO_NOTIN,
} jop;

/* Most levels of AST nesting the evaluator recurses through (statement
 * lists, elif chains and left operands of binary operators excepted):
 * checked when a template is compiled. */
#define JINJA_MAX_HEIGHT 96

/* Macro flags (jnode.op of JK_MACRO / JK_CALLBLOCK). */
#define JM_VARARGS 1 /* body uses varargs */
#define JM_KWARGS 2  /* body uses kwargs */
#define JM_CALLER 4  /* body uses caller */

struct jnode {
    uint8_t kind;   /* jkind */
    uint8_t op;     /* jop, flags */
    uint16_t n;     /* JK_FILTER/JK_TEST: filter or test id (0: unknown, checked when run) */
    uint32_t line;
    jnode *a, *b, *c, *d, *e;
    jnode *next;    /* next sibling (statements, arguments, items) */
    const jstr *name;
    jv val;
};

/* ---- tokens (jinja_lex.c) --------------------------------------------------- */

typedef enum jtok_type {
    TK_EOF = 0,
    TK_DATA,        /* template text (s, n: its bytes after whitespace control) */
    TK_VAR_BEGIN,   /* {{ */
    TK_VAR_END,     /* }} */
    TK_BLOCK_BEGIN, /* {% */
    TK_BLOCK_END,   /* %} */
    TK_NAME,        /* s, n */
    TK_STRING,      /* str: the decoded literal */
    TK_INT,         /* i */
    TK_FLOAT,       /* f */
    TK_OP,          /* op: a jtok_op */
} jtok_type;

typedef enum jtok_op {
    OP_ADD = 1, OP_SUB, OP_DIV, OP_FLOORDIV, OP_MUL, OP_POW, OP_MOD, OP_TILDE,
    OP_LBRACKET, OP_RBRACKET, OP_LPAREN, OP_RPAREN, OP_LBRACE, OP_RBRACE,
    OP_EQ, OP_NE, OP_GT, OP_GE, OP_LT, OP_LE, OP_ASSIGN, OP_DOT, OP_COLON, OP_PIPE,
    OP_COMMA, OP_SEMICOLON,
} jtok_op;

typedef struct jtok {
    uint8_t type; /* jtok_type */
    uint8_t op;   /* jtok_op */
    uint32_t line;
    const char *s; /* TK_DATA, TK_NAME: bytes in the lexer's copy of the source */
    size_t n;
    jstr *str;     /* TK_STRING */
    int64_t i;
    double f;
} jtok;

/* Tokenizes src (newlines normalized to \n, one trailing newline dropped,
 * trim_blocks and lstrip_blocks applied). Tokens and their text live in m.
 * KEEL_EFORMAT "template line N: ..." on a lexical error. */
keel_status jinja_lex(jmem *m, const char *src, size_t len, jtok **toks, size_t *n_toks,
                      char *err);

/* ---- template ------------------------------------------------------------- */

/* Interned names used by the evaluator. */
typedef struct jnames {
    const jstr *loop, *varargs, *kwargs, *caller, *self_;
} jnames;

struct jinja_template {
    jmem mem;        /* everything below */
    jnode *body;     /* statements */
    jnames names;
};

/* Parses src into t (jinja_lex.c + jinja_parse.c). */
keel_status jinja_parse(jinja_template *t, const char *src, size_t len, char *err);

/* ---- render context ------------------------------------------------------- */

struct jscope {
    jscope *parent;
    size_t n, cap;
    const jstr **names; /* interned (compared by pointer) */
    jv *vals;
};

struct jloop {
    jv *items;        /* materialized items (all of them once known) */
    size_t n;         /* items known so far */
    size_t i;         /* current index (0-based) */
    bool complete;    /* n is the length */
    /* lazy source for a filtered loop (for x in seq if cond) */
    const jnode *target, *cond;
    jscope *scope;    /* where cond is evaluated */
    jv *src;          /* the unfiltered items */
    size_t src_n, src_i;
    jlist *live;      /* an unfiltered list iterated live (appends are seen) */
    const jlist *range; /* an unfiltered range: item i is computed, never stored */
    int32_t depth0;   /* recursive loops */
    const jnode *fornode;
    jscope *outer;    /* scope the loop was entered from (recursive calls) */
    jv last_changed;  /* loop.changed() */
    bool has_changed;
};

typedef struct jx {
    const jinja_template *t;
    jmem mem;
    jinja_limits lim;
    jinja_time now;
    jdict *vars;      /* render variables (read-only to templates) */
    jscope *root;
    jsb *out;         /* current sink */
    int64_t steps;
    int32_t depth;
    uint32_t line;    /* line of the construct being run (errors) */
    uintptr_t stack_base; /* frame address at jinja_render's entry */
    int flow;         /* JFLOW_* after break/continue */
    char *err;        /* JINJA_ERR_CAP bytes */
} jx;

/* Makes sure item i of a loop is known (filtered loops are lazy, as
 * jinja2's LoopContext peeks one item ahead). false past the end or on an
 * error (*st set). */
bool jx_loop_fetch(jx *x, jloop *lp, size_t i, keel_status *st);

/* Item i of a loop (known: after jx_loop_fetch returned true for it). */
static inline jv jx_loop_item(const jloop *lp, size_t i)
{
    if (lp->range) return jv_int(lp->range->r0 + (int64_t)i * lp->range->r2);
    return lp->items[i];
}

#define JFLOW_NONE 0
#define JFLOW_BREAK 1
#define JFLOW_CONTINUE 2

/* Records "template line N: <msg>" and returns st. */
keel_status jx_fail(jx *x, keel_status st, const char *fmt, ...) BASE_PRINTF(3, 4);
/* The arena's failure (ENOMEM / limit) as a status with a message. */
keel_status jx_oom(jx *x);
/* A string builder's failure as the render's: past the output bound
 * (KEEL_EOVERFLOW, JINJA_ERR_OUTPUT) or out of memory; KEEL_OK if neither. */
keel_status jsb_status(jx *x, const jsb *b);
/* b's string as *out, or jsb_status's failure (b's bound or memory). */
keel_status jsb_ret(jx *x, jsb *b, jv *out);
/* Counts one step; KEEL_EOVERFLOW past the limit. */
keel_status jx_step(jx *x);
static inline keel_status jx_steps(jx *x, int64_t n)
{
    x->steps += n;
    return x->steps > x->lim.max_steps ? jx_step(x) : KEEL_OK;
}
/* Counts a scan of n bytes (a string operation that allocates nothing,
 * such as len() of a non-ASCII string or `in`) as n / 64 steps, so that
 * repeating it over a long string is bounded in time too. */
static inline keel_status jx_scan(jx *x, size_t n)
{
    return jx_steps(x, (int64_t)(n >> 6));
}
/* Error for using an undefined value (its jinja2 message). */
keel_status jx_undef_error(jx *x, jv v);
/* The message of an undefined value into buf. */
void jv_undef_message(jv v, char *buf, size_t cap);

#if defined(__GNUC__)
#define JX_NOINLINE __attribute__((noinline))
#else
#define JX_NOINLINE
#endif

/* Bytes of stack a compile or a render may use below its entry point (its
 * frame address), whatever the compiler and sanitizers make of the frames:
 * checked with the depth counters, so that a 256 KiB thread has room left
 * for its caller. */
#define JINJA_STACK_BUDGET (112 * 1024)

/* Stack used since base (0 when unknown). */
static inline size_t jinja_stack_used(uintptr_t base)
{
#if defined(__GNUC__)
    uintptr_t here = (uintptr_t)__builtin_frame_address(0);
    return base > here && base - here < ((size_t)1 << 30) ? (size_t)(base - here) : 0;
#else
    (void)base;
    return 0;
#endif
}

static inline uintptr_t jinja_stack_here(void)
{
#if defined(__GNUC__)
    return (uintptr_t)__builtin_frame_address(0);
#else
    return 0;
#endif
}

#define TRY(e)                                                                                     \
    do {                                                                                           \
        keel_status st_ = (e);                                                                     \
        if (st_ != KEEL_OK) return st_;                                                            \
    } while (0)

/* ---- Python semantics of values (jinja_value.c) --------------------------- */

bool jv_truthy(jv v);
/* "str", "int", "dict", ... as Python names the type. */
const char *jv_type_name(jv v);
/* Appends str(v) (what {{ v }} prints). */
keel_status jv_str(jx *x, jsb *b, jv v);
/* Appends repr(v). */
keel_status jv_repr(jx *x, jsb *b, jv v, int depth);
/* str(v) as a new string (v itself when it is a string). */
keel_status jv_to_str(jx *x, jv v, jstr **out);
/* markupsafe.escape(s): & < > " ' as entities; the result is safe. */
keel_status jv_html_escape(jx *x, const jstr *s, jv *out);
/* Appends Python's repr of a float. */
bool jsb_float(jsb *b, double f);

typedef struct jjson_opts {
    bool ensure_ascii, sort_keys;
    bool indent_set;
    const char *indent; /* indent string (may be "") */
    size_t indent_n;
    const char *item_sep, *key_sep;
    size_t item_sep_n, key_sep_n;
} jjson_opts;

/* json.dumps(v, ...) appended to b. */
keel_status jv_tojson(jx *x, jsb *b, jv v, const jjson_opts *o);
/* Parses JSON text into values (depth limited, no recursion). */
keel_status jv_from_json(jmem *m, const char *s, size_t n, jv *out, char *err);

/* Python ==. */
keel_status jv_eq(jx *x, jv a, jv b, bool *out);
/* Python <, <=, >, >= (JO_LT..JO_GE): TypeError for unorderable types. */
keel_status jv_order(jx *x, int op, jv a, jv b, bool *out);
/* Three-way compare for sorting (TypeError when unorderable). */
keel_status jv_cmp(jx *x, jv a, jv b, int *out);
/* `a in b`. */
keel_status jv_contains(jx *x, jv container, jv item, bool *out);
/* Python len(); TypeError if it has none. */
keel_status jv_len(jx *x, jv v, int64_t *out);
/* The items of an iterable (list items, dict keys, string characters);
 * undefined gives none. TypeError otherwise. items may point into v. */
keel_status jv_iter(jx *x, jv v, jv **items, size_t *n);
/* Arithmetic (JO_ADD..JO_CONCAT). */
keel_status jv_binop(jx *x, int op, jv a, jv b, jv *out);
/* obj.name (jinja2's sandboxed getattr: attribute, then item). */
keel_status jv_getattr(jx *x, jv obj, const jstr *name, jv *out);
/* obj[key] (item, then attribute for string keys). */
keel_status jv_getitem(jx *x, jv obj, jv key, jv *out);
/* obj[start:stop:step] (each may be none/undefined). */
keel_status jv_slice(jx *x, jv obj, jv start, jv stop, jv step, jv *out);
/* A new undefined value for a missing attribute / item / name. */
jv jv_undef_attr(jx *x, jv obj, jv key, bool item);
jv jv_undef_hint(jx *x, const char *hint);
jv jv_undef_name(jx *x, const jstr *name);
/* Integer value of an int or bool (false otherwise). */
bool jv_as_int(jv v, int64_t *out);
/* Number value of an int, float or bool. */
bool jv_as_num(jv v, double *out);
/* Makes a range's items (they are computed lazily); false on OOM. Any
 * code reading l->v of a list that may be a range calls this first. */
bool jv_range_fill(jx *x, jlist *l);
/* Deep-enough copy for list(), dict.copy(): a new container, same items. */
jlist *jv_list_copy(jx *x, const jv *items, size_t n, uint8_t kind);

/* ---- calls (jinja_eval.c) --------------------------------------------------- */

/* Evaluated call arguments: positional then keyword. */
typedef struct jargs {
    jv *pos;
    size_t n_pos;
    const jstr **kw_names;
    jv *kw;
    size_t n_kw;
} jargs;

/* An argument that was not given (a distinct undefined). */
static inline jv jv_missing(void)
{
    jv v = {0};
    v.pad = 0x4d495353;
    return v;
}
static inline bool is_missing(jv v)
{
    return v.t == JT_UNDEF && v.pad == 0x4d495353;
}
/* Given and not None. */
static inline bool given(jv v)
{
    return !is_missing(v) && v.t != JT_NONE;
}

/* Binds the call's args (const jargs *a) to parameter names into jv arg[],
 * missing where not given; returns the TypeError from the enclosing
 * function. Needs `jx *x`, `const jargs *a`, `jv arg[]` in scope. */
#define JARGS_BIND(fname, ...)                                                                     \
    do {                                                                                           \
        static const char *const names_[] = {__VA_ARGS__};                                         \
        for (size_t i_ = 0; i_ < BASE_ARRAY_LEN(names_); i_++) arg[i_] = jv_missing();             \
        TRY(jargs_bind(x, fname, a, names_, BASE_ARRAY_LEN(names_), arg));                         \
    } while (0)

#define JARGS_NONE(fname)                                                                          \
    do {                                                                                           \
        if (a->n_pos || a->n_kw)                                                                   \
            return jx_fail(x, KEEL_EINVAL, "%s() takes no arguments", fname);                      \
    } while (0)

/* Binds args to named parameters: out[i] is the argument for names[i] or
 * stays as initialized (callers preset defaults; JT_UNDEF with u.u NULL
 * after the call means "not given" only if the caller set it so). first
 * positional parameter index is names[0]. TypeError for too many or an
 * unknown keyword. */
keel_status jargs_bind(jx *x, const char *fname, const jargs *a, const char *const *names,
                       size_t n_names, jv *out);
/* Calls a callable value. */
keel_status jx_call(jx *x, jv fn, const jargs *a, jv *out);

/* ---- filters, tests, methods (jinja_filters.c, jinja_methods.c) ----------- */

/* Filter and test ids by name (0 if unknown). */
uint16_t jinja_filter_id(const char *name, size_t n);
uint16_t jinja_test_id(const char *name, size_t n);
/* value | filter(args) */
keel_status jinja_filter_call(jx *x, uint16_t id, jv value, const jargs *a, jv *out);
/* value is test(args) */
keel_status jinja_test_call(jx *x, uint16_t id, jv value, const jargs *a, bool *out);
/* The method id of obj.name (JF_NONE if obj's type has none). */
jfn jinja_method_id(jv obj, const jstr *name);
/* The global function of a name (JF_NONE if none). */
jfn jinja_global_id(const jstr *name);
/* Calls builtin fn (self: the bound value or undefined for globals). */
keel_status jinja_builtin_call(jx *x, jfn fn, jv self, const jargs *a, jv *out);
/* The name of a builtin (printing). */
const char *jinja_builtin_name(jfn fn);

/* Python str methods used by filters too (jinja_methods.c). */
keel_status jstr_strip(jx *x, jstr *s, jv chars, int which, jv *out); /* which: 1 l, 2 r, 3 both */
keel_status jstr_upper_lower(jx *x, jstr *s, int mode, jv *out);      /* 0 upper 1 lower 2 title 3 capitalize 4 swapcase */
keel_status jstr_replace(jx *x, jstr *s, jstr *old, jstr *rep, int64_t count, jv *out);
keel_status jstr_split(jx *x, jstr *s, jv sep, int64_t maxsplit, bool right, jv *out);
keel_status jstr_splitlines(jx *x, jstr *s, bool keepends, jv *out);
keel_status jstr_percent_format(jx *x, jstr *fmt, jv args, jv *out);
/* str.format(*args, **kwargs) on fmt (jinja_format.c). */
keel_status jinja_str_format(jx *x, jstr *fmt, const jargs *a, jv *out);
/* strftime_now(fmt) at the render's clock x->now (jinja_format.c). */
keel_status jinja_strftime_now(jx *x, jstr *fmt, jv *out);
/* The evaluator's printing of a filter/test name for errors. */
const char *jinja_filter_name(uint16_t id);

#endif /* KEEL_CHAT_JINJA_INT_H */
