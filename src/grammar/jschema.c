/*
 * jschema.c — JSON Schema to GBNF (grammar.h, gram_schema_gbnf): the core
 * keywords, each translated exactly or refused with the keyword and its
 * location (a JSON pointer), never dropped.
 *
 *   type (a name or a list), properties, required, additionalProperties
 *   (false, true, or a schema), prefixItems, items (a schema, true or
 *   false), minItems, maxItems, enum, const,
 *   minLength, maxLength, anyOf, true / {} (any value), local $ref
 *   ("#", "#/$defs/name", any JSON pointer into the document: each target
 *   becomes one rule, so recursive schemas are recursive rules; a target
 *   reached again reuses its rule; $defs / definitions hold the targets);
 *   annotations
 *   (title, description, default, examples, $comment, $schema, $id,
 *   format: an annotation in draft 2020-12) are ignored; every other
 *   keyword is refused (KEEL_EUNSUPPORTED "json schema: keyword 'pattern'
 *   at /properties/a is not supported").
 *
 * The texts the grammar accepts: JSON with the object members in the
 * order of "properties" (optional ones may be left out), then, where
 * additional properties are allowed, further members with any key;
 * whitespace: at most 20 of space, tab, CR, LF between tokens; numbers and
 * strings as JSON writes them. The grammar is built as GBNF text (rules
 * s0, s1, ... one per schema node, plus the shared JSON rules) and
 * compiled by gbnf.c.
 */
#include "grammar.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JS_MAX_DEPTH 64
#define JS_MAX_OUT (4u << 20)
#define JS_MAX_REFS 256 /* distinct $ref targets in one schema */

typedef struct jsb {
    char *d;
    size_t n, cap;
    uint32_t next_rule;
    char *err;
    keel_status st;
    json_t *root;                     /* the document "#" names */
    json_t *ref_target[JS_MAX_REFS];  /* $ref targets seen, and the rule of each */
    uint32_t ref_rule[JS_MAX_REFS];
    int n_refs;
} jsb;

static void put(jsb *b, const char *s, size_t n)
{
    if (b->st) return;
    if (b->n + n + 1 > JS_MAX_OUT) {
        b->st = base_err(b->err, KEEL_ERANGE, "json schema: the grammar exceeds 4 MiB");
        return;
    }
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 4096;
        while (nc < b->n + n + 1) nc *= 2;
        char *d = base_realloc(b->d, b->cap, nc);
        if (!d) {
            b->st = base_err(b->err, KEEL_ENOMEM, "json schema: out of memory");
            return;
        }
        b->d = d;
        b->cap = nc;
    }
    memcpy(b->d + b->n, s, n);
    b->n += n;
    b->d[b->n] = 0;
}

static void puts_(jsb *b, const char *s)
{
    put(b, s, strlen(s));
}

static void putf(jsb *b, const char *fmt, ...) BASE_PRINTF(2, 3);
static void putf(jsb *b, const char *fmt, ...)
{
    char t[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t, sizeof t, fmt, ap);
    va_end(ap);
    if (n > 0) put(b, t, (size_t)BASE_MIN((size_t)n, sizeof t - 1));
}

/* A GBNF literal of bytes s[0..n): printable ASCII as is, the rest escaped
 * (\xHH is a code point in GBNF, so UTF-8 passes through unescaped). */
static void put_lit(jsb *b, const char *s, size_t n)
{
    puts_(b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            char e[3] = {'\\', (char)c, 0};
            puts_(b, e);
        } else if (c < 0x20 || c == 0x7f) {
            putf(b, "\\x%02X", c);
        } else {
            put(b, (const char *)&s[i], 1);
        }
    }
    puts_(b, "\"");
}

/* A JSON value as the literal of its compact serialization. */
static void put_json_lit(jsb *b, json_t *v)
{
    char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!s) {
        if (!b->st) b->st = base_err(b->err, KEEL_ENOMEM, "json schema: out of memory");
        return;
    }
    put_lit(b, s, strlen(s));
    free(s);
}

static keel_status refuse(jsb *b, const char *where, const char *what)
{
    if (!b->st) b->st = base_err(b->err, KEEL_EUNSUPPORTED, "json schema: %s at %s", what, where[0] ? where : "/");
    return b->st;
}

static keel_status node(jsb *b, json_t *s, const char *where, int depth, uint32_t *id);

static void child_path(char *out, size_t cap, const char *where, const char *a, const char *k)
{
    snprintf(out, cap, "%s/%s%s%s", where, a, k ? "/" : "", k ? k : "");
}

static bool known_annotation(const char *k)
{
    static const char *const ann[] = {"title", "description", "default", "examples", "$comment", "$schema",
                                      "$id", "format", "deprecated", "readOnly", "writeOnly", NULL};
    for (int i = 0; ann[i]; i++)
        if (strcmp(k, ann[i]) == 0) return true;
    return false;
}

static bool get_count(json_t *s, const char *k, int64_t *v)
{
    json_t *x = json_object_get(s, k);
    if (!x) return false;
    *v = json_is_integer(x) ? json_integer_value(x) : (json_is_real(x) && json_real_value(x) == (double)(int64_t)json_real_value(x)) ? (int64_t)json_real_value(x) : -1;
    return true;
}

/* Decodes one UTF-8 code point of s (valid UTF-8, as jansson keeps keys). */
static uint32_t cp_at(const unsigned char *s, size_t *i)
{
    unsigned char c = s[*i];
    size_t n = c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
    uint32_t v = n == 1 ? c : n == 2 ? c & 0x1fu : n == 3 ? c & 0x0fu : c & 0x07u;
    for (size_t k = 1; k < n; k++) v = (v << 6) | (s[*i + k] & 0x3fu);
    *i += n;
    return v;
}

/* Rules s<id>-k<t>: the JSON strings whose content is none of the object's
 * declared property names (so an additional member cannot repeat one): a
 * trie over the names by code point; at each node, any character that
 * leads to no name, or an escape, leaves the trie (then anything follows);
 * ending is allowed where no name ends. Names that need escapes in JSON
 * are refused (an escape could spell them). */
static void keys_except(jsb *b, json_t *props, const char *where, uint32_t id)
{
    size_t n = json_object_size(props);
    const char **names = base_calloc(n ? n : 1, sizeof *names);
    if (!names) {
        b->st = base_err(b->err, KEEL_ENOMEM, "json schema: out of memory");
        return;
    }
    const char *k;
    json_t *v;
    size_t i = 0;
    json_object_foreach(props, k, v) {
        for (const unsigned char *q = (const unsigned char *)k; *q; q++)
            if (*q < 0x20 || *q == '"' || *q == '\\') {
                refuse(b, where, "additional properties beside a property name that needs escapes are not supported");
                base_free(names, (n ? n : 1) * sizeof *names);
                return;
            }
        names[i++] = k;
    }
    /* a trie node is a prefix (names[j], len): visit the distinct prefixes
     * in a breadth-first way, numbering them by their first (name, len) */
    putf(b, "s%u-key ::= \"\\\"\" s%u-k0-0 \"\\\"\"\n", id, id);
    for (size_t j = 0; j < n && !b->st; j++) {
        size_t lj = strlen(names[j]);
        for (size_t len = 0, nx = 0; len <= lj && !b->st; len = nx) {
            /* the next character boundary (nodes sit between characters) */
            nx = len;
            if (len < lj) cp_at((const unsigned char *)names[j], &nx);
            else nx = lj + 1;
            /* the node (j, len) is numbered by the first name with this prefix */
            bool first = true;
            for (size_t q = 0; q < j && first; q++)
                if (strlen(names[q]) >= len && memcmp(names[q], names[j], len) == 0) first = false;
            if (!first) continue;
            putf(b, "s%u-k%zu-%zu ::= ", id, j, len);
            bool ends = false;
            puts_(b, "( [^\"\\\\\\x00-\\x1f");
            /* the characters that continue some name from here */
            for (size_t q = 0; q < n; q++) {
                size_t lq = strlen(names[q]);
                if (lq == len && memcmp(names[q], names[j], len) == 0) ends = true;
                if (lq > len && memcmp(names[q], names[j], len) == 0) {
                    size_t at = len;
                    putf(b, "\\U%08X", cp_at((const unsigned char *)names[q], &at));
                }
            }
            puts_(b, "] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} ) ) char*");
            for (size_t q = 0; q < n; q++) {
                size_t lq = strlen(names[q]);
                if (lq <= len || memcmp(names[q], names[j], len) != 0) continue;
                size_t at = len;
                cp_at((const unsigned char *)names[q], &at);
                /* the child (q', at) where q' is the first name with that prefix */
                bool dup = false;
                for (size_t r = 0; r < q && !dup; r++)
                    if (strlen(names[r]) >= at && memcmp(names[r], names[q], at) == 0 &&
                        memcmp(names[r], names[j], len) == 0)
                        dup = true;
                if (dup) continue;
                size_t owner = q;
                for (size_t r = 0; r < q; r++)
                    if (strlen(names[r]) >= at && memcmp(names[r], names[q], at) == 0) {
                        owner = r;
                        break;
                    }
                puts_(b, " | ");
                put_lit(b, names[q] + len, at - len);
                putf(b, " s%u-k%zu-%zu", id, owner, at);
            }
            if (!ends) puts_(b, " | \"\"");
            puts_(b, "\n");
        }
    }
    if (n == 0) putf(b, "s%u-k0-0 ::= char*\n", id);
    base_free(names, (n ? n : 1) * sizeof *names);
}

/* The rule of an object node: members in the order of "properties". */
static void object_rule(jsb *b, json_t *s, const char *where, int depth, uint32_t id)
{
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    json_t *addl = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props)) {
        refuse(b, where, "'properties' must be an object");
        return;
    }
    if (req && !json_is_array(req)) {
        refuse(b, where, "'required' must be an array");
        return;
    }
    size_t n = props ? json_object_size(props) : 0;
    /* each required name must be a property */
    size_t ri;
    json_t *rv;
    json_array_foreach(req, ri, rv) {
        if (!json_is_string(rv) || !json_object_get(props, json_string_value(rv))) {
            refuse(b, where, "a 'required' name that is not in 'properties' is not supported");
            return;
        }
    }
    uint32_t extra = 0; /* 0: none; else the rule of additional values */
    bool extra_any = false;
    if (!addl || json_is_true(addl)) {
        extra_any = true;
    } else if (json_is_object(addl)) {
        char p[512];
        child_path(p, sizeof p, where, "additionalProperties", NULL);
        if (node(b, addl, p, depth + 1, &extra)) return;
    } else if (!json_is_false(addl)) {
        refuse(b, where, "'additionalProperties' must be a boolean or a schema");
        return;
    }
    uint32_t *val = base_calloc(n ? n : 1, sizeof *val);
    if (!val) {
        b->st = base_err(b->err, KEEL_ENOMEM, "json schema: out of memory");
        return;
    }
    const char *k;
    json_t *v;
    size_t i = 0;
    json_object_foreach(props, k, v) {
        char p[512];
        child_path(p, sizeof p, where, "properties", k);
        if (node(b, v, p, depth + 1, &val[i])) break;
        i++;
    }
    if (!b->st) {
        /* s<id>-f<i>: members from i on, none written yet; -c<i>: after one */
        putf(b, "s%u ::= \"{\" ws s%u-f0 ws \"}\"\n", id, id);
        i = 0;
        json_object_foreach(props, k, v) {
            bool required = false;
            json_array_foreach(req, ri, rv) required |= strcmp(json_string_value(rv), k) == 0;
            for (int c = 0; c < 2; c++) {
                putf(b, "s%u-%c%zu ::= %s", id, c ? 'c' : 'f', i, c ? "ws \",\" ws " : "");
                char *key = NULL;
                json_t *ks = json_string(k);
                key = ks ? json_dumps(ks, JSON_ENCODE_ANY) : NULL;
                json_decref(ks);
                if (!key) {
                    b->st = base_err(b->err, KEEL_ENOMEM, "json schema: out of memory");
                    break;
                }
                put_lit(b, key, strlen(key));
                free(key);
                putf(b, " ws \":\" ws s%u s%u-c%zu", val[i], id, i + 1);
                if (!required) putf(b, " | s%u-%c%zu", id, c ? 'c' : 'f', i + 1);
                puts_(b, "\n");
            }
            i++;
        }
        /* the tail: additional members, or nothing */
        if (extra_any || extra) {
            char vr[32];
            snprintf(vr, sizeof vr, extra ? "s%u" : "value", extra);
            keys_except(b, props, where, id);
            putf(b, "s%u-f%zu ::= ( s%u-key ws \":\" ws %s ( ws \",\" ws s%u-key ws \":\" ws %s )* )?\n", id, n, id, vr,
                 id, vr);
            putf(b, "s%u-c%zu ::= ( ws \",\" ws s%u-key ws \":\" ws %s )*\n", id, n, id, vr);
        } else {
            putf(b, "s%u-f%zu ::= \"\"\ns%u-c%zu ::= \"\"\n", id, n, id, n);
        }
    }
    base_free(val, (n ? n : 1) * sizeof *val);
}

/* Elements i.. of an array with prefixItems (rules pid[0..k)): element i
 * follows pid[i] below k, the items rule `it` from k on (none when items
 * is false); the first mn are required, at most mx (-1: no bound) in all.
 * Required elements come first, so an optional one never holds a required
 * one: `p0 ( , p1 ( , p2 ( , it ){0,n} )? )?`. */
static void prefix_elems(jsb *b, const uint32_t *pid, int64_t k, int64_t i, int64_t mn, int64_t mx,
                         const char *it, bool no_more)
{
    if (mx >= 0 && i >= mx) return;
    if (i >= k) {
        if (no_more) return;
        int64_t lo = mn > i ? mn - i : 0;
        if (mx >= 0)
            putf(b, " ( ws \",\" ws %s ){%lld,%lld}", it, (long long)lo, (long long)(mx - i));
        else
            putf(b, " ( ws \",\" ws %s ){%lld,}", it, (long long)lo);
        return;
    }
    bool req = i < mn;
    puts_(b, req ? " " : " ( ");
    if (i > 0) puts_(b, "ws \",\" ws ");
    putf(b, "s%u", pid[i]);
    prefix_elems(b, pid, k, i + 1, mn, mx, it, no_more);
    if (!req) puts_(b, " )?");
}

/* A count pair (minItems / maxItems, minLength / maxLength): *mn 0 and
 * *mx -1 (no bound) when absent; false with the refusal set when not
 * non-negative integers, above 10000, or max below min. */
static bool get_bounds(jsb *b, json_t *s, const char *where, const char *kmin, const char *kmax, int64_t *mn,
                       int64_t *mx)
{
    char what[160];
    *mn = 0;
    *mx = -1;
    if ((get_count(s, kmin, mn) && *mn < 0) || (get_count(s, kmax, mx) && *mx < 0)) {
        snprintf(what, sizeof what, "'%s' / '%s' must be non-negative integers", kmin, kmax);
    } else if (*mn > 10000 || *mx > 10000) {
        snprintf(what, sizeof what, "'%s' / '%s' above 10000 are not supported", kmin, kmax);
    } else if (*mx >= 0 && *mx < *mn) {
        snprintf(what, sizeof what, "'%s' below '%s' accepts nothing", kmax, kmin);
    } else {
        return true;
    }
    refuse(b, where, what);
    return false;
}

/* The rule name of `items` (a schema, true or absent: any value) in it. */
static bool items_rule(jsb *b, json_t *items, const char *where, int depth, const char *form, char *it,
                       size_t cap)
{
    snprintf(it, cap, "value");
    if (!items || json_is_true(items)) return true;
    char p[512];
    child_path(p, sizeof p, where, "items", NULL);
    if (!json_is_object(items)) {
        refuse(b, p, form);
        return false;
    }
    uint32_t iid;
    if (node(b, items, p, depth + 1, &iid)) return false;
    snprintf(it, cap, "s%u", iid);
    return true;
}

static void array_rule(jsb *b, json_t *s, const char *where, int depth, uint32_t id)
{
    json_t *items = json_object_get(s, "items");
    int64_t mn, mx;
    if (!get_bounds(b, s, where, "minItems", "maxItems", &mn, &mx)) return;
    json_t *pre = json_object_get(s, "prefixItems");
    bool no_more = json_is_false(items);
    char it[32] = "value";
    if (pre) {
        char pp[512];
        child_path(pp, sizeof pp, where, "prefixItems", NULL);
        if (!json_is_array(pre) || json_array_size(pre) == 0 || json_array_size(pre) > 256) {
            refuse(b, pp, "'prefixItems' must be a non-empty array of at most 256 schemas");
            return;
        }
        int64_t k = (int64_t)json_array_size(pre);
        if (no_more && mn > k) {
            refuse(b, where, "'minItems' above the 'prefixItems' with 'items' false accepts nothing");
            return;
        }
        if (!no_more && !items_rule(b, items, where, depth, "'items' must be a schema", it, sizeof it)) return;
        uint32_t pid[256];
        for (int64_t i = 0; i < k; i++) {
            char p[512];
            snprintf(p, sizeof p, "%s/prefixItems/%lld", where, (long long)i);
            if (node(b, json_array_get(pre, (size_t)i), p, depth + 1, &pid[i])) return;
        }
        if (mx == 0) {
            putf(b, "s%u ::= \"[\" ws \"]\"\n", id);
            return;
        }
        putf(b, "s%u ::= \"[\" ws", id);
        prefix_elems(b, pid, k, 0, mn, mx, it, no_more);
        puts_(b, " ws \"]\"\n");
        return;
    }
    if (no_more) { /* items false without prefixItems: the empty array */
        putf(b, "s%u ::= \"[\" ws \"]\"\n", id);
        if (mn > 0) refuse(b, where, "'minItems' with 'items' false accepts nothing");
        return;
    }
    if (!items_rule(b, items, where, depth,
                    "'items' must be a schema (an array of schemas is draft 2019's tuple form: use prefixItems)", it,
                    sizeof it))
        return;
    if (mx == 0) {
        putf(b, "s%u ::= \"[\" ws \"]\"\n", id);
    } else if (mn == 0) {
        putf(b, "s%u ::= \"[\" ws ( %s ( ws \",\" ws %s )", id, it, it);
        if (mx < 0) puts_(b, "*");
        else putf(b, "{0,%lld}", (long long)(mx - 1));
        puts_(b, " )? ws \"]\"\n");
    } else {
        putf(b, "s%u ::= \"[\" ws %s ( ws \",\" ws %s )", id, it, it);
        if (mx < 0) putf(b, "{%lld,}", (long long)(mn - 1));
        else putf(b, "{%lld,%lld}", (long long)(mn - 1), (long long)(mx - 1));
        puts_(b, " ws \"]\"\n");
    }
}

static void string_rule(jsb *b, json_t *s, const char *where, uint32_t id)
{
    int64_t mn, mx;
    if (!get_bounds(b, s, where, "minLength", "maxLength", &mn, &mx)) return;
    if (mx < 0) putf(b, "s%u ::= \"\\\"\" char{%lld,} \"\\\"\"\n", id, (long long)mn);
    else putf(b, "s%u ::= \"\\\"\" char{%lld,%lld} \"\\\"\"\n", id, (long long)mn, (long long)mx);
}

/* The rule of one type name for schema s (its type-specific keywords). */
static void type_rule(jsb *b, json_t *s, const char *t, const char *where, int depth, uint32_t id)
{
    if (strcmp(t, "object") == 0) object_rule(b, s, where, depth, id);
    else if (strcmp(t, "array") == 0) array_rule(b, s, where, depth, id);
    else if (strcmp(t, "string") == 0) string_rule(b, s, where, id);
    else if (strcmp(t, "integer") == 0) putf(b, "s%u ::= integer\n", id);
    else if (strcmp(t, "number") == 0) putf(b, "s%u ::= number\n", id);
    else if (strcmp(t, "boolean") == 0) putf(b, "s%u ::= \"true\" | \"false\"\n", id);
    else if (strcmp(t, "null") == 0) putf(b, "s%u ::= \"null\"\n", id);
    else refuse(b, where, "an unknown 'type'");
}

/* The schema a local $ref names: "#" or "#/a/b" (a JSON pointer: ~1 is
 * "/", ~0 is "~", %XX a byte), or NULL with the refusal set. */
static json_t *resolve_ref(jsb *b, const char *ref, const char *where)
{
    if (ref[0] != '#') {
        refuse(b, where, "'$ref' to another document is not supported (only local references, \"#...\")");
        return NULL;
    }
    if (ref[1] != '\0' && ref[1] != '/') {
        refuse(b, where, "'$ref' to an anchor is not supported (only JSON pointers, \"#/...\")");
        return NULL;
    }
    json_t *cur = b->root;
    const char *p = ref + 1;
    while (*p == '/') {
        char tok[256];
        size_t n = 0;
        for (p++; *p && *p != '/'; p++) {
            int c = (unsigned char)*p;
            if (c == '~' && (p[1] == '0' || p[1] == '1')) {
                c = p[1] == '0' ? '~' : '/';
                p++;
            } else if (c == '%' && p[1] && p[2]) {
                unsigned v = 0;
                if (sscanf(p + 1, "%2x", &v) == 1) {
                    c = (int)v;
                    p += 2;
                }
            }
            if (n + 1 >= sizeof tok) {
                refuse(b, where, "a '$ref' pointer segment longer than 255 bytes");
                return NULL;
            }
            tok[n++] = (char)c;
        }
        tok[n] = '\0';
        json_t *next = NULL;
        if (json_is_object(cur)) {
            next = json_object_get(cur, tok);
        } else if (json_is_array(cur)) {
            char *end = NULL;
            unsigned long k = strtoul(tok, &end, 10);
            if (n > 0 && *end == '\0') next = json_array_get(cur, k);
        }
        if (!next) {
            refuse(b, where, "a '$ref' that names nothing in the schema");
            return NULL;
        }
        cur = next;
    }
    if (*p) {
        refuse(b, where, "a malformed '$ref'");
        return NULL;
    }
    return cur;
}

/* s holds "$ref" (and nothing but annotations and definitions beside it):
 * rule id is the target's rule. A target is translated once, registered
 * before it is, so a reference inside it (recursion) names the rule. */
static keel_status ref_node(jsb *b, json_t *s, const char *where, int depth, uint32_t id)
{
    json_t *r = json_object_get(s, "$ref");
    const char *k;
    json_t *v;
    json_object_foreach(s, k, v) {
        if (strcmp(k, "$ref") == 0 || strcmp(k, "$defs") == 0 || strcmp(k, "definitions") == 0 ||
            known_annotation(k))
            continue;
        char what[160];
        snprintf(what, sizeof what, "keyword '%.64s' beside '$ref' is not supported", k);
        return refuse(b, where, what);
    }
    if (!json_is_string(r)) return refuse(b, where, "'$ref' must be a string");
    json_t *t = resolve_ref(b, json_string_value(r), where);
    if (!t) return b->st;
    /* a chain of references only, back to itself, is no schema */
    json_t *seen[JS_MAX_REFS];
    int n_seen = 0;
    for (json_t *c = t; json_is_object(c) && json_object_get(c, "$ref");) {
        for (int i = 0; i < n_seen; i++)
            if (seen[i] == c) return refuse(b, where, "a '$ref' cycle that never reaches a schema");
        if (n_seen == JS_MAX_REFS) return refuse(b, where, "a '$ref' chain longer than 256");
        seen[n_seen++] = c;
        json_t *cr = json_object_get(c, "$ref");
        if (!json_is_string(cr)) break; /* refused when its node is built */
        if (!(c = resolve_ref(b, json_string_value(cr), where))) return b->st;
    }
    for (int i = 0; i < b->n_refs; i++)
        if (b->ref_target[i] == t) {
            putf(b, "s%u ::= s%u\n", id, b->ref_rule[i]);
            return b->st;
        }
    if (b->n_refs == JS_MAX_REFS) return refuse(b, where, "more than 256 distinct '$ref' targets");
    b->ref_target[b->n_refs] = t;
    b->ref_rule[b->n_refs++] = id;
    char p[512];
    snprintf(p, sizeof p, "%s", json_string_value(r));
    uint32_t tid;
    if (node(b, t, p, depth + 1, &tid)) return b->st;
    putf(b, "s%u ::= s%u\n", id, tid);
    return b->st;
}

static keel_status node(jsb *b, json_t *s, const char *where, int depth, uint32_t *id)
{
    if (b->st) return b->st;
    if (depth > JS_MAX_DEPTH) return refuse(b, where, "schemas nested more than 64 deep");
    *id = b->next_rule++;
    if (json_is_object(s) && json_object_get(s, "$ref")) return ref_node(b, s, where, depth, *id);
    if (json_is_true(s)) {
        putf(b, "s%u ::= value\n", *id);
        return b->st;
    }
    if (json_is_false(s)) return refuse(b, where, "the schema false (nothing is valid)");
    if (!json_is_object(s)) return refuse(b, where, "a schema must be an object or a boolean");
    static const char *const handled[] = {"type", "properties", "required", "additionalProperties", "items",
                                          "minItems", "maxItems", "enum", "const", "minLength", "maxLength",
                                          "anyOf", "$defs", "definitions", "prefixItems", NULL};
    const char *k;
    json_t *v;
    json_object_foreach(s, k, v) {
        bool ok = known_annotation(k);
        for (int i = 0; !ok && handled[i]; i++) ok = strcmp(k, handled[i]) == 0;
        if (!ok) {
            char what[160];
            snprintf(what, sizeof what, "keyword '%.64s' is not supported", k);
            return refuse(b, where, what);
        }
    }
    json_t *cst = json_object_get(s, "const"), *en = json_object_get(s, "enum"), *any = json_object_get(s, "anyOf");
    json_t *ty = json_object_get(s, "type");
    int n_kinds = (cst != NULL) + (en != NULL) + (any != NULL);
    if (n_kinds > 1 || (n_kinds && (ty || json_object_get(s, "properties") || json_object_get(s, "items"))))
        return refuse(b, where, "'const', 'enum' and 'anyOf' combined with each other or with 'type' are not supported");
    if (cst) {
        putf(b, "s%u ::= ", *id);
        put_json_lit(b, cst);
        puts_(b, "\n");
        return b->st;
    }
    if (en) {
        if (!json_is_array(en) || json_array_size(en) == 0) return refuse(b, where, "'enum' must be a non-empty array");
        putf(b, "s%u ::= ", *id);
        size_t i;
        json_t *x;
        json_array_foreach(en, i, x) {
            if (i) puts_(b, " | ");
            put_json_lit(b, x);
        }
        puts_(b, "\n");
        return b->st;
    }
    if (any) {
        if (!json_is_array(any) || json_array_size(any) == 0) return refuse(b, where, "'anyOf' must be a non-empty array");
        size_t n = json_array_size(any), i;
        json_t *x;
        uint32_t *alt = base_alloc(n * sizeof *alt);
        if (!alt) return b->st = base_err(b->err, KEEL_ENOMEM, "json schema: out of memory");
        json_array_foreach(any, i, x) {
            char p[512];
            snprintf(p, sizeof p, "%s/anyOf/%zu", where, i);
            if (node(b, x, p, depth + 1, &alt[i])) break;
        }
        if (!b->st) {
            putf(b, "s%u ::= ", *id);
            for (i = 0; i < n; i++) putf(b, "%ss%u", i ? " | " : "", alt[i]);
            puts_(b, "\n");
        }
        base_free(alt, n * sizeof *alt);
        return b->st;
    }
    if (!ty) {
        /* no type: the keywords of each type apply to values of that type;
         * only schemas without type-specific keywords are supported */
        static const char *const typed[] = {"properties", "required", "additionalProperties", "items", "prefixItems", "minItems",
                                            "maxItems", "minLength", "maxLength", NULL};
        for (int i = 0; typed[i]; i++)
            if (json_object_get(s, typed[i])) {
                char what[160];
                snprintf(what, sizeof what, "keyword '%s' without 'type' is not supported", typed[i]);
                return refuse(b, where, what);
            }
        putf(b, "s%u ::= value\n", *id);
        return b->st;
    }
    if (json_is_string(ty)) {
        type_rule(b, s, json_string_value(ty), where, depth, *id);
        return b->st;
    }
    if (!json_is_array(ty) || json_array_size(ty) == 0) return refuse(b, where, "'type' must be a name or a list");
    size_t n = json_array_size(ty), i;
    json_t *x;
    uint32_t first = b->next_rule;
    b->next_rule += (uint32_t)n;
    json_array_foreach(ty, i, x) {
        if (!json_is_string(x)) return refuse(b, where, "'type' must list names");
        type_rule(b, s, json_string_value(x), where, depth, first + (uint32_t)i);
    }
    putf(b, "s%u ::= ", *id);
    for (i = 0; i < n; i++) putf(b, "%ss%u", i ? " | " : "", first + (uint32_t)i);
    puts_(b, "\n");
    return b->st;
}

static const char g_json_rules[] =
    "value ::= object | array | string | number | \"true\" | \"false\" | \"null\"\n"
    "object ::= \"{\" ws ( string ws \":\" ws value ( ws \",\" ws string ws \":\" ws value )* )? ws \"}\"\n"
    "array ::= \"[\" ws ( value ( ws \",\" ws value )* )? ws \"]\"\n"
    "string ::= \"\\\"\" char* \"\\\"\"\n"
    "char ::= [^\"\\\\\\x00-\\x1f] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} )\n"
    "integer ::= \"-\"? ( \"0\" | [1-9] [0-9]* )\n"
    "number ::= integer ( \".\" [0-9]+ )? ( [eE] [-+]? [0-9]+ )?\n"
    "ws ::= [ \\t\\n\\r]{0,20}\n";

keel_status gram_schema_gbnf(const char *schema, size_t len, char **gbnf, size_t *n_gbnf, char *err)
{
    if (!gbnf || !n_gbnf) return base_err(err, KEEL_EINVAL, "json schema: out is NULL");
    *gbnf = NULL;
    *n_gbnf = 0;
    json_error_t je;
    json_t *s = json_loadb(schema ? schema : "", len, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &je);
    if (!s) return base_err(err, KEEL_EFORMAT, "json schema: not JSON: %s (line %d col %d)", je.text, je.line, je.column);
    jsb b;
    memset(&b, 0, sizeof b);
    b.err = err;
    b.next_rule = 0;
    b.root = s;
    puts_(&b, "root ::= s0\n");
    uint32_t root;
    node(&b, s, "", 0, &root);
    puts_(&b, g_json_rules);
    json_decref(s);
    if (b.st) {
        base_free(b.d, b.cap);
        return b.st;
    }
    /* hand over an exactly sized copy (callers free n + 1 bytes) */
    char *out = base_alloc(b.n + 1);
    if (!out) {
        base_free(b.d, b.cap);
        return base_err(err, KEEL_ENOMEM, "json schema: out of memory");
    }
    memcpy(out, b.d, b.n + 1);
    base_free(b.d, b.cap);
    *gbnf = out;
    *n_gbnf = b.n;
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
