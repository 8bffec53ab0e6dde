/*
 * grammar.h — private interface of src/grammar: constrained decoding over
 * bytes. Three objects:
 *
 *   gram          a compiled grammar (gbnf.c): llama.cpp's GBNF turned into
 *                 a byte-level grammar whose terminals are sets of bytes.
 *                 Immutable; may be shared by threads.
 *   gram_vocab    a vocabulary's token bytes as a trie in preorder (gvocab.c).
 *                 Immutable; may be shared by threads.
 *   gram_matcher  one sequence's parse state (gmatch.c, gmask_*.c): a set of
 *                 pushdown stacks, the token mask of the current state,
 *                 advance by a token or by bytes. One thread at a time.
 *
 * The byte-level form. Every rule is a list of alternatives, each a
 * sequence of elements; an element is a byte set (one byte of input in
 * the set), a reference to a rule, or the end of an alternative / rule.
 * Character classes become a rule whose alternatives spell the class's
 * code points in UTF-8 (one byte set per byte position, as in the
 * utf8-ranges construction), so a token that ends in the middle of a
 * character simply leaves the stacks in the middle of that alternative.
 * Repetitions and groups become rules of their own (x* : R ::= x R | "").
 *
 *   el[] layout: the rules one after another; rule r starts at
 *   rule_start[r]; its alternatives are separated by GRAM_ALT and the last
 *   ends with GRAM_END. An element is uint32_t: kind in the low 2 bits,
 *   value (byte set index, rule id) above.
 *
 * Parse state. A stack is a list of positions in el[] (return addresses
 * below, the element to match next on top). Stacks are hash-consed into
 * nodes (pos, parent node): node 0 is the empty stack, i.e. the root rule
 * is complete. A state is a set of nodes whose top elements are byte
 * sets (or node 0). Advancing a node by a byte, and the closure of a new
 * top (expanding rule references, popping finished alternatives), are
 * memoized per node, so a step costs the number of stacks in the set,
 * never the length of the text so far. Left recursion is refused at
 * compile time (with the cycle named), as llama.cpp does.
 *
 * Token masks. The tokens accepted from a stack are found by a walk of the
 * vocabulary trie (gvocab.c: preorder, each node with the end of its
 * subtree) that carries the set of stacks each prefix leads to and skips a
 * subtree as soon as that set is empty; the sets are interned as walk
 * states with memoized transitions, so a step of the walk is one lookup.
 * A stack's mask is cached per stack, a state's (the OR of its stacks',
 * the end-of-generation bits set exactly when complete) per state. A new
 * stack whose first bytes lead into many trie nodes is composed instead
 * of walked when it can be: its top frames (a segment, hash-consed over an
 * unknown bottom) are walked once and shared by every stack with the same
 * top, giving the tokens accepted whatever lies below and the trie nodes
 * where the segment finishes; the stack's own rest is then walked only
 * from those (xgrammar's context-independent / -dependent tokens, with
 * the segment's depth chosen per stack). Exact: equal to the whole walk.
 *
 * Bounds: every table has a cap (gram_limits); exceeding one is
 * KEEL_ERANGE with the limit named, never a hang or an unbounded
 * allocation. Nothing here prints or aborts.
 */
#ifndef KEEL_GRAMMAR_GRAMMAR_H
#define KEEL_GRAMMAR_GRAMMAR_H

#include "../base/base.h"

typedef uint32_t gram_el;

enum {
    GRAM_END = 0,   /* end of the last alternative of a rule */
    GRAM_ALT = 1,   /* end of an alternative, another follows */
    GRAM_BYTES = 2, /* value: index into gram.sets */
    GRAM_REF = 3,   /* value: rule id */
};

#define GRAM_KIND(e) ((e) & 3u)
#define GRAM_VAL(e) ((e) >> 2)
#define GRAM_MAKE(k, v) ((gram_el)(((uint32_t)(v) << 2) | (uint32_t)(k)))

/* Caps of the compiler (hostile grammars are refused, KEEL_ERANGE). */
#define GRAM_MAX_SOURCE (16u << 20)  /* bytes of GBNF text */
#define GRAM_MAX_ELEMENTS (1u << 22) /* elements after desugaring */
#define GRAM_MAX_RULES (1u << 20)
#define GRAM_MAX_REPEAT 100000u      /* m and n of {m,n} */
#define GRAM_MAX_NEST 256            /* nested groups */

typedef struct gram_set {
    uint64_t w[4]; /* bit b: byte b is in the set */
} gram_set;

static inline bool gram_set_has(const gram_set *s, uint8_t b)
{
    return (s->w[b >> 6] >> (b & 63)) & 1u;
}

typedef struct gram {
    gram_el *el;          /* [n_el] */
    uint32_t n_el;
    uint32_t *rule_start; /* [n_rules] first element of each rule */
    uint32_t *alt_first;  /* [n_rules + 1] index into alt_pos of each rule's first alternative */
    uint32_t *alt_pos;    /* [n_alts] first element of each alternative */
    uint32_t n_rules, n_alts;
    uint32_t root;        /* rule id of "root" */
    gram_set *sets;       /* [n_sets] distinct byte sets */
    uint32_t n_sets;
    uint32_t n_user_rules; /* rules named in the source (the rest are synthetic) */
} gram;

/* Compiles len bytes of GBNF. KEEL_EFORMAT for a syntax error ("line L col
 * C: what"), an undefined rule or a missing root; KEEL_EUNSUPPORTED for
 * left recursion (the cycle named) and llama.cpp's token references
 * (<[id]>, <name>, !...); KEEL_ERANGE past a GRAM_MAX_* cap; KEEL_ENOMEM.
 * err: BASE_ERR_CAP bytes (may be NULL). *out NULL on failure. */
keel_status gram_compile(const char *src, size_t len, gram **out, char *err);
void gram_free(gram *g);

/* JSON Schema (the core keywords, jschema.c) as GBNF text: *gbnf
 * (base_alloc'd, *n_gbnf + 1 bytes, NUL-terminated). KEEL_EFORMAT (not
 * JSON), KEEL_EUNSUPPORTED (a keyword that is not translated, named with
 * its location), KEEL_ERANGE, KEEL_ENOMEM. */
keel_status gram_schema_gbnf(const char *schema, size_t len, char **gbnf, size_t *n_gbnf, char *err);
/* Whether g's language is empty: no text is a sentence (the start state is
 * not complete and takes no byte), e.g. the grammar of the JSON Schema
 * false. KEEL_ENOMEM / KEEL_ERANGE from opening a matcher. */
keel_status gram_accepts_nothing(const gram *g, bool *empty, char *err);
/* gram_schema_gbnf then gram_compile. */
keel_status gram_compile_schema(const char *schema, size_t len, gram **out, char *err);

/* ---- vocabulary ------------------------------------------------------------- */

typedef struct gram_vocab {
    int32_t n_vocab;
    uint8_t *bytes;      /* token pieces, concatenated */
    uint32_t *off;       /* [n_vocab + 1] piece of id i: bytes[off[i] .. off[i+1]) */
    uint64_t *eog;       /* [n_words] bit: an end-of-generation token */
    int32_t n_words;     /* (n_vocab + 63) / 64 */
    /* the trie of the non-empty pieces, in preorder (the root not stored) */
    uint32_t n_tnodes;
    uint8_t *tbyte;      /* [n_tnodes] the byte that leads to the node */
    uint16_t *tdepth;    /* [n_tnodes] bytes from the root (>= 1) */
    uint32_t *tend;      /* [n_tnodes] first node after the node's subtree */
    int32_t *ttok;       /* [n_tnodes] a token whose piece ends here, or -1 */
    int32_t *tnext;      /* [n_vocab] the next token with the same piece, or -1 */
    uint8_t *tmulti;     /* [n_tnodes] 1: more than one token ends here (follow tnext); spares a
                            walk a cache miss on tnext per token */
    uint32_t max_len;    /* longest piece */
    uint32_t tsub1[256]; /* trie nodes under (and at) the depth-1 node of each byte: a walk's bound */
} gram_vocab;

/* Builds the trie of n_vocab pieces (piece i: len[i] bytes at piece[i];
 * len 0: the token never matches text, e.g. a control token) with the
 * end-of-generation ids eog[0..n_eog). Pieces longer than 65535 bytes are
 * KEEL_ERANGE. KEEL_EINVAL, KEEL_ENOMEM; err may be NULL. */
keel_status gram_vocab_build(int32_t n_vocab, const uint8_t *const *piece, const size_t *len,
                             const int32_t *eog, int32_t n_eog, gram_vocab **out, char *err);
void gram_vocab_free(gram_vocab *v);

/* ---- matcher -------------------------------------------------------------------- */

/* Caps of one matcher (per sequence); gram_limits_default() gives them. */
typedef struct gram_limits {
    uint32_t max_nodes;      /* distinct stacks ever seen (1 << 21) */
    uint32_t max_set;        /* stacks in one state (4096) */
    uint32_t max_closure;    /* expansion steps of one closure (1 << 16) */
    size_t max_memo_ids;     /* node ids held by the memo tables (1 << 25) */
    size_t max_mask_bytes;   /* token-mask cache; cleared when full (64 MiB) */
    uint32_t seg_max_cost;   /* trie nodes the escapes of a segment may make a stack's mask walk
                                (32768); 0: every stack walks the whole trie (tests compare) */
    uint32_t seg_min_walk;   /* a stack whose first bytes lead into at most this many trie
                                nodes walks them instead of composing (16384) */
} gram_limits;

gram_limits gram_limits_default(void);

typedef struct gram_matcher gram_matcher;

/* Statistics of a matcher (bench, tests). */
typedef struct gram_stats {
    uint32_t n_nodes;        /* stacks interned */
    uint32_t n_set;          /* stacks in the current state */
    int64_t mask_hits, mask_misses; /* misses: trie walks (a whole stack's or a segment's) */
    int64_t seg_walks;       /* of the misses, segment walks */
    int64_t mask_composed;   /* stack masks composed from a segment without a walk of their own */
    uint64_t miss_ns;        /* time spent walking the trie on misses */
    size_t mask_bytes;       /* cache in use */
} gram_stats;

/* Opens a matcher at the grammar's start; v may be NULL (text matching
 * only: gram_matcher_mask is then KEEL_EINVAL). g and v must outlive it.
 * KEEL_ENOMEM, KEEL_ERANGE (the start state exceeds a cap). */
keel_status gram_matcher_open(const gram *g, const gram_vocab *v, const gram_limits *lim, gram_matcher **out,
                              char *err);
void gram_matcher_close(gram_matcher *m);
/* Back to the start state (caches kept). */
keel_status gram_matcher_reset(gram_matcher *m);
/* Feeds n bytes. KEEL_EINVAL when a byte cannot follow (the state is then
 * unchanged and *n_ok, when not NULL, says how many bytes were fine);
 * KEEL_ERANGE past a cap (state unchanged). */
keel_status gram_matcher_accept_bytes(gram_matcher *m, const uint8_t *b, size_t n, size_t *n_ok);
/* Feeds a token: its piece, or for an end-of-generation token the end of
 * the text (allowed only when the root is complete; afterwards nothing
 * more is). KEEL_EINVAL for a token the state does not allow (unchanged). */
keel_status gram_matcher_accept_token(gram_matcher *m, int32_t token);
/* The root rule is complete at this point (the text so far is a sentence). */
bool gram_matcher_complete(const gram_matcher *m);
/* Nothing can follow but the end (complete and no byte continues). */
bool gram_matcher_done(const gram_matcher *m);
/* The allowed tokens: bit i of mask[n_words] (end-of-generation tokens
 * exactly when complete; never after the end). KEEL_ERANGE past a cap. */
keel_status gram_matcher_mask(gram_matcher *m, uint64_t *mask);
/* Sets logits of the tokens the state does not allow to -inf (n_vocab). */
keel_status gram_matcher_apply(gram_matcher *m, float *logits);
void gram_matcher_stats(const gram_matcher *m, gram_stats *out);
/* logits[t] = -inf for every t whose bit in mask[(n_vocab + 63) / 64] is
 * clear: the pass of gram_matcher_apply at one SIMD level
 * (gmask_avx2.c, gmask_avx512.c; call only when the CPU has it). */
void gram_apply_avx2(const uint64_t *mask, int32_t n_vocab, float *logits);
void gram_apply_avx512(const uint64_t *mask, int32_t n_vocab, float *logits);
/* Detail of the last failure ("" if none). */
const char *gram_matcher_error(const gram_matcher *m);

#endif /* KEEL_GRAMMAR_GRAMMAR_H */
