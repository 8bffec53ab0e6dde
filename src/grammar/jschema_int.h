/*
 * jschema_int.h — private to jschema.c (normal form, references) and
 * jschema_emit.c (GBNF from the normal form).
 *
 * A schema node is normalized into a union (jdnf) of conjunctions
 * (jconj). A jconj holds, for each kind of JSON value (null, boolean,
 * number, string, array, object), whether the kind is allowed (kinds) and
 * the constraints on values of that kind; the kinds are independent, so
 * the intersection of two jconj is the kind-wise merge of their fields.
 * Sub-schemas (items, property values, ...) stay JSON nodes, held as
 * lists (jsl) meaning the conjunction of their members; a list becomes
 * one GBNF rule when emitted, memoized by its members, so recursive
 * schemas become recursive rules. Everything a jconj points to lives in
 * the builder's arena and is never changed after it is made (merges make
 * new arrays), so jconj values may be copied freely.
 */
#ifndef KEEL_GRAMMAR_JSCHEMA_INT_H
#define KEEL_GRAMMAR_JSCHEMA_INT_H

#include "grammar.h"
#include "jnumber.h"
#include "jstring.h"

#include <jansson.h>

enum {
    JK_NULL = 1,
    JK_BOOL = 2,
    JK_NUM = 4,
    JK_STR = 8,
    JK_ARR = 16,
    JK_OBJ = 32,
    JK_ALL = 63,
};

#define JS_MAX_DEPTH 64              /* in-place applicators / references nested in one rule */
#define JS_MAX_EMIT_DEPTH 256        /* rules nested (items, property values, ...): ~6 KiB of stack each */
#define JS_MAX_OUT (8u << 20)        /* bytes of GBNF */
#define JS_MAX_ARENA (64u << 20)     /* bytes of normal forms */
#define JS_MAX_DNF 256               /* conjunctions in one union */
#define JS_MAX_INFO (1u << 16)       /* schema nodes in one document */
#define JS_MAX_RES 1024              /* $id resources and anchors */
#define JS_MAX_MEMO 4096             /* distinct emitted schema lists */
#define JS_MAX_PATTERNS 6            /* distinct patternProperties patterns in one object */
#define JS_MAX_NORM 200000           /* schema nodes normalized in all */
#define JS_MAX_COUNT_RULES 20000     /* rules of a counted array / object */

/* rule ids: >= 0 a rule s<id>; JR_ANY any JSON value; JR_NONE nothing */
#define JR_ANY (-2)
#define JR_NONE (-1)

typedef struct jsl { /* the conjunction of v[0..n) */
    json_t **v;
    int n;
} jsl;

typedef struct jgroup { /* the member keywords of one schema object */
    json_t *props; /* object name -> schema, or NULL */
    json_t *pats;  /* object pattern -> schema, or NULL */
    json_t *addl;  /* schema of the other members, or NULL (any) */
    bool eval_all; /* additionalProperties / unevaluatedProperties present: every member evaluated */
    bool noeval;   /* made by a complement or an absence: evaluates nothing (annotations under not are dropped) */
} jgroup;

typedef struct jcontains {
    json_t *s;      /* the schema counted */
    int64_t mn, mx; /* count bounds; mx -1: none */
    int64_t from;   /* only elements at index >= from are counted (not of items beside prefixItems) */
    bool eval;      /* from a schema that evaluates (not a complement): matching elements are evaluated */
} jcontains;

typedef struct jconj {
    const char *where; /* the schema location it came from (messages) */
    unsigned kinds;    /* JK_* allowed */
    unsigned bools;    /* bit 0: false allowed, bit 1: true */
    jnum_spec num;
    jstr_spec str;
    bool has_en;       /* a finite set of values (enum / const) */
    json_t **en;
    size_t n_en;
    int64_t min_items, max_items; /* max -1: none */
    jsl *pre;          /* [n_pre] prefixItems: element i is all of pre[i] */
    int n_pre;
    jsl items;         /* elements from n_pre on (empty: any) */
    jcontains *ct;
    int n_ct;
    bool unique;
    jgroup *grp;
    int n_grp;
    const char **req;  /* required names (UTF-8) */
    int n_req;
    int64_t min_props, max_props; /* max -1: none */
    jsl pnames;        /* propertyNames schemas */
    /* what the schemas behind this conjunction evaluate (unevaluatedItems / -Properties) */
    int eval_pre;      /* elements [0, eval_pre) evaluated by prefixItems */
    bool eval_items;   /* every element evaluated (items, unevaluatedItems) */
    bool eval_contains; /* elements matching a contains are evaluated */
    bool inexact;      /* from a union whose other branches may also hold and evaluate more */
} jconj;

typedef struct jdnf {
    jconj *c; /* [n] */
    int n;
} jdnf;

typedef struct sbuf {
    char *d;
    size_t n, cap;
} sbuf;

typedef struct jinfo {
    json_t *k;
    const char *path; /* JSON pointer of the node in the document */
    const char *base; /* its base URI ("" when none) */
} jinfo;

typedef struct jres {
    const char *uri; /* absolute, no fragment; or uri#anchor */
    json_t *node;
    bool dyn;        /* made by $dynamicAnchor */
} jres;

typedef struct jmemo {
    const char *key; /* the sorted member pointers */
    int64_t rule;    /* id, or JR_NONE / JR_ANY once done */
    bool done;
    bool none;       /* done and nothing matched */
} jmemo;

typedef struct arblk {
    struct arblk *next;
    size_t cap, used, pad;
} arblk;

typedef struct jsb {
    sbuf out;
    uint32_t next_rule;
    char *err;
    keel_status st;
    json_t *root;
    json_t *synth;     /* a JSON array holding the nodes made here */
    arblk *ar;
    size_t ar_total;
    jinfo *info;       /* [JS_MAX_INFO * 2] open addressing by pointer */
    uint32_t n_info;
    jres *res;
    int n_res;
    jmemo *memo;
    int n_memo;
    json_t *stack[JS_MAX_DEPTH + 8]; /* nodes being normalized */
    int n_stack;
    struct { const char *key; json_t *node; } *syn; /* synthesized nodes by key */
    int n_syn;
    int64_t n_norm;    /* schema nodes normalized so far (JS_MAX_NORM) */
    struct jspec_memo { const char *key, *name; bool empty, done, referenced; } *spc; /* number / string rules by spec [JS_MAX_MEMO] */
    int n_spc;
    bool uneval;       /* the document uses unevaluatedItems / unevaluatedProperties */
} jsb;

/* jschema.c */
void *js_alloc(jsb *b, size_t n);
char *js_strdup(jsb *b, const char *s, size_t n);
keel_status js_refuse(jsb *b, const char *where, const char *fmt, ...) BASE_PRINTF(3, 4);
keel_status js_oom(jsb *b);
const char *js_path(jsb *b, json_t *s);
keel_status js_norm_list(jsb *b, jsl l, int depth, jdnf *out);
keel_status js_not_list(jsb *b, jsl l, json_t **out);
void js_sput(jsb *b, sbuf *o, const char *s, size_t n);
void js_sputs(jsb *b, sbuf *o, const char *s);
void js_sputf(jsb *b, sbuf *o, const char *fmt, ...) BASE_PRINTF(3, 4);
void js_sfree(sbuf *o);
void js_put_lit(jsb *b, sbuf *o, const char *s, size_t n);
void js_put_jstring(jsb *b, sbuf *o, const char *s, size_t n);
bool js_conj_trivial(const jconj *c);
bool js_value_eq(json_t *a, json_t *b);

/* jschema_ref.c: the index of the document under s (locations, base URIs,
 * resources, anchors), and the target of a reference r written in node s
 * (NULL with the refusal set) */
keel_status js_index(jsb *b, json_t *s, const char *path, const char *base, int depth);
keel_status js_add_res(jsb *b, const char *uri, json_t *node, const char *where, bool dyn);
json_t *js_resolve_ref(jsb *b, json_t *s, const char *r);

/* jschema_emit.c: the rule of the conjunction of l (JR_ANY, JR_NONE or an id) */
keel_status js_emit_list(jsb *b, jsl l, int depth, int64_t *rule);
int js_memo_find(jsb *b, jsl l, const char **key);

#endif /* KEEL_GRAMMAR_JSCHEMA_INT_H */
