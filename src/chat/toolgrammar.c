/*
 * toolgrammar.c — the grammar of the tool-call blocks a chat model writes
 * (issue 24, lazy grammars): for one tool-call format, GBNF whose sentences
 * are one or more complete call blocks in that format's wire syntax, the
 * name an alternative of the declared tools, the arguments the called
 * tool's JSON schema (gram_schema_gbnf). The engine applies it lazily:
 * free text until a trigger (the format's opening marker), then the
 * grammar from the marker on (docs/grammar.md "Tool calls").
 *
 * Combining schemas: gram_schema_gbnf names its rules root, s0, s1, ...,
 * value, ws, ...; each tool's text is copied with every rule name prefixed
 * ("t3-root", "t3-s0"), so any number of schemas live in one grammar
 * without clashes and without knowing the compiler's rule names. The
 * format's own rules (root, blk, call, tws, ...) never start with "t<digit>"
 * or "any-" (the prefix of the unconstrained argument object).
 *
 * XML-parameter formats (Qwen3-Coder, GLM 4.5, MiniMax M2, Seed-OSS) write
 * each parameter as a tag (Seed-OSS keeps a value's newlines, so its values
 * are written without the newlines Qwen3-Coder puts around them): string-typed values raw (any text without '<',
 * or the schema's enum strings, minLength / maxLength kept), the others as
 * the JSON of the property's schema; parameters in the order of
 * "properties", the required ones present, the others optional, no others.
 *
 * Invariants: the text built is bounded by GRAM_MAX_SOURCE (KEEL_ERANGE past
 * it); nothing is compiled here (the engine compiles the text once).
 */
#include "toolcall.h"

#include "../grammar/grammar.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* ---- a growable text with a cap ------------------------------------------- */

typedef struct tg_buf {
    char *p;
    size_t n, cap;
    keel_status st; /* the first failure; later appends do nothing */
} tg_buf;

static void tg_put(tg_buf *b, const char *s, size_t n)
{
    if (b->st) return;
    if (n > GRAM_MAX_SOURCE - b->n) {
        b->st = KEEL_ERANGE;
        return;
    }
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->n + n + 1) cap *= 2;
        char *q = base_realloc(b->p, b->cap, cap);
        if (!q) {
            b->st = KEEL_ENOMEM;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void tg_puts(tg_buf *b, const char *s)
{
    tg_put(b, s, strlen(s));
}

static void tg_putf(tg_buf *b, const char *fmt, ...) BASE_PRINTF(2, 3);
static void tg_putf(tg_buf *b, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof tmp) {
        if (!b->st) b->st = KEEL_EINTERNAL; /* callers format short fragments only */
        return;
    }
    tg_put(b, tmp, (size_t)n);
}

/* s as a GBNF literal, quotes included: bytes as themselves but for the
 * quote, the backslash and control characters (escaped). */
static void tg_lit(tg_buf *b, const char *s, size_t n)
{
    tg_put(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        uint8_t c = (uint8_t)s[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            tg_put(b, e, 2);
        } else if (c < 0x20 || c == 0x7f) {
            tg_putf(b, "\\x%02x", c);
        } else {
            tg_put(b, (const char *)&c, 1);
        }
    }
    tg_put(b, "\"", 1);
}

static bool word_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

/* Copies GBNF text with every rule name (definitions and references)
 * prefixed: literals, classes, repetition counts and comments are left
 * as they are. */
static void tg_renamed(tg_buf *b, const char *g, size_t n, const char *prefix)
{
    size_t i = 0, plen = strlen(prefix);
    while (i < n && !b->st) {
        char c = g[i];
        size_t j = i + 1;
        if (c == '"' || c == '[') {
            char close = c == '"' ? '"' : ']';
            while (j < n && g[j] != close) j += g[j] == '\\' && j + 1 < n ? 2 : 1;
            if (j < n) j++;
        } else if (c == '{') {
            while (j < n && g[j] != '}') j++;
            if (j < n) j++;
        } else if (c == '#') {
            while (j < n && g[j] != '\n') j++;
        } else if (word_char(c)) {
            while (j < n && word_char(g[j])) j++;
            tg_put(b, prefix, plen);
        }
        tg_put(b, g + i, j - i);
        i = j;
    }
}

/* ---- the tools ------------------------------------------------------------ */

typedef struct tg_tool {
    const char *name;
    json_t *schema;  /* parameters / input_schema, or NULL */
    bool strict;     /* OpenAI function.strict */
    bool constrain;  /* the arguments follow the schema */
    bool ok;         /* its argument rules were written (else any object / any parameters) */
} tg_tool;

static void tool_of(json_t *t, tg_tool *out)
{
    json_t *fn = json_object_get(t, "function");
    json_t *f = json_is_object(fn) ? fn : t;
    memset(out, 0, sizeof *out);
    out->name = json_string_value(json_object_get(f, "name"));
    out->schema = json_object_get(f, "parameters");
    if (!out->schema) out->schema = json_object_get(t, "input_schema");
    if (!json_is_object(out->schema)) out->schema = NULL;
    out->strict = json_is_true(json_object_get(f, "strict")) || json_is_true(json_object_get(t, "strict"));
}

/* The GBNF of a schema, renamed with prefix. why: the compiler's refusal. */
static keel_status schema_rules(tg_buf *b, json_t *schema, const char *prefix, char *why)
{
    char *text = json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!text) return base_err(why, KEEL_ENOMEM, "out of memory");
    char *g = NULL;
    size_t n = 0;
    keel_status st = gram_schema_gbnf(text, strlen(text), &g, &n, why);
    chat_json_free(text);
    if (st) return st;
    /* a schema no arguments satisfy would let the model name the tool and
     * then allow no token: refused here, like any schema the compiler
     * cannot use (a strict tool's request fails up front) */
    gram *cg = NULL;
    bool empty = false;
    st = gram_compile(g, n, &cg, why);
    if (!st) st = gram_accepts_nothing(cg, &empty, why);
    gram_free(cg);
    if (!st && empty) st = base_err(why, KEEL_EUNSUPPORTED, "json schema: the schema accepts nothing (no arguments are valid)");
    if (st) {
        base_free(g, n + 1);
        return st;
    }
    tg_renamed(b, g, n, prefix);
    base_free(g, n + 1);
    return b->st;
}

/* ---- formats -------------------------------------------------------------- */

/* A kind of call in a JSON-argument format: the text before the name, the
 * name (as a JSON string or raw), the text between name and arguments and
 * after the arguments, as GBNF fragments (rule tws: structural whitespace). */
typedef struct tg_call {
    const char *rule;
    bool name_json;
    const char *pre, *mid, *post;
} tg_call;

#define TG_OBJ(key) {"call", true, "\"{\" tws \"\\\"name\\\"\" tws \":\" tws", "tws \",\" tws \"\\\"" key "\\\"\" tws \":\" tws", "tws \"}\""}

typedef struct tg_json_fmt {
    toolcall_format f;
    const char *head;      /* the rules of the blocks, using the call rules (root aside) */
    const char *many;      /* root: one or more calls, as the format writes parallel calls */
    const char *one;       /* root: exactly one call (parallel_tool_calls false) */
    tg_call calls[2];
    const char *triggers[2];
    bool at_start;
    const char *const *markers; /* its literal markers, NULL-terminated (toolcall_grammar.markers) */
} tg_json_fmt;

#define DS_CALLS "\"<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "begin\xef\xbd\x9c>\""
#define DS_CALLS_END "\"<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "end\xef\xbd\x9c>\""
#define DS_CALL "\"<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "begin\xef\xbd\x9c>\""
#define DS_CALL_END "\"<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "end\xef\xbd\x9c>\""
#define DS_SEP "\"<\xef\xbd\x9ctool\xe2\x96\x81sep\xef\xbd\x9c>\""
#define DS_CALLS_T "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DS_CALL_T "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define TG_ARRAYS(open, close)                                                                     \
    "root ::= " open " \"[\" tws call ( tws \",\" tws call )* tws \"]\" " close "\n",              \
        "root ::= " open " \"[\" tws call tws \"]\" " close "\n"

/* The markers of each format: control tokens with this text may be written
 * as that one token (the engine's vocabulary of tool grammars). */
static const char *const g_mk_hermes[] = {"<tool_call>", "</tool_call>", NULL};
static const char *const g_mk_none[] = {NULL};
static const char *const g_mk_mistral[] = {"[TOOL_CALLS]", "[ARGS]", NULL};
static const char *const g_mk_ds[] = {DS_CALLS_T, DS_CALL_T, "<\xef\xbd\x9ctool\xe2\x96\x81sep\xef\xbd\x9c>",
                                      "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "end\xef\xbd\x9c>",
                                      "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "end\xef\xbd\x9c>", NULL};
static const char *const g_mk_kimi[] = {"<|tool_calls_section_begin|>", "<|tool_call_begin|>",
                                        "<|tool_call_argument_begin|>", "<|tool_call_end|>",
                                        "<|tool_calls_section_end|>", NULL};
static const char *const g_mk_nemo[] = {"<TOOLCALL>", "</TOOLCALL>", NULL};
static const char *const g_mk_granite[] = {"<|tool_call|>", NULL};
static const char *const g_mk_apriel[] = {"<tool_calls>", "</tool_calls>", NULL};
static const char *const g_mk_lfm2[] = {"<|tool_call_start|>", "<|tool_call_end|>", NULL};
static const char *const g_mk_seed[] = {"<seed:tool_call>", "</seed:tool_call>", NULL};
static const char *const g_mk_glm[] = {"<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>",
                                       "</arg_value>", NULL};
static const char *const g_mk_minimax[] = {"<minimax:tool_call>", "</minimax:tool_call>", NULL};

static const tg_json_fmt g_json_fmts[] = {
    {TOOLCALL_FORMAT_HERMES, "blk ::= \"<tool_call>\" tws call tws \"</tool_call>\"\n", "root ::= blk ( tws blk )* tws\n",
     "root ::= blk tws\n", {TG_OBJ("arguments")}, {"<tool_call>"}, false, g_mk_hermes},
    {TOOLCALL_FORMAT_LLAMA3, "", "root ::= call ( tws \";\" tws call )*\n", "root ::= call\n", {TG_OBJ("parameters")},
     {"{"}, true, g_mk_none},
    {TOOLCALL_FORMAT_MISTRAL,
     "blk ::= \"[TOOL_CALLS]\" ( rcall | \"[\" tws call ( tws \",\" tws call )* tws \"]\" )\n", "root ::= blk+\n",
     "root ::= \"[TOOL_CALLS]\" ( rcall | \"[\" tws call tws \"]\" )\n",
     {TG_OBJ("arguments"), {"rcall", false, "", "\"[ARGS]\"", ""}}, {"[TOOL_CALLS]"}, false, g_mk_mistral},
    {TOOLCALL_FORMAT_FUNCTIONARY_V3_1, "", "root ::= call+\n", "root ::= call\n",
     {{"call", false, "\"<function=\"", "\">\"", "\"</function>\""}}, {"<function="}, false, g_mk_none},
    {TOOLCALL_FORMAT_DEEPSEEK_V3_1, "", "root ::= " DS_CALLS " call+ " DS_CALLS_END " | call+\n",
     "root ::= " DS_CALLS " call " DS_CALLS_END " | call\n", {{"call", false, DS_CALL, DS_SEP, DS_CALL_END}},
     {DS_CALLS_T, DS_CALL_T}, false, g_mk_ds},
    {TOOLCALL_FORMAT_DEEPSEEK_R1, "", "root ::= " DS_CALLS " call ( \"\\n\"? call )* " DS_CALLS_END "\n",
     "root ::= " DS_CALLS " call " DS_CALLS_END "\n",
     {{"call", false, DS_CALL " \"function\" " DS_SEP, "\"\\n```json\\n\"", "\"\\n```\" " DS_CALL_END}},
     {DS_CALLS_T}, false, g_mk_ds},
    {TOOLCALL_FORMAT_KIMI_K2, "",
     "root ::= \"<|tool_calls_section_begin|>\" call+ \"<|tool_calls_section_end|>\" | call+\n",
     "root ::= \"<|tool_calls_section_begin|>\" call \"<|tool_calls_section_end|>\" | call\n",
     {{"call", false, "\"<|tool_call_begin|>functions.\"", "\":\" [0-9]{1,3} \"<|tool_call_argument_begin|>\"",
       "\"<|tool_call_end|>\""}},
     {"<|tool_calls_section_begin|>", "<|tool_call_begin|>"}, false, g_mk_kimi},
    {TOOLCALL_FORMAT_NEMOTRON_V2, "", TG_ARRAYS("\"<TOOLCALL>\"", "\"</TOOLCALL>\""), {TG_OBJ("arguments")},
     {"<TOOLCALL>"}, false, g_mk_nemo},
    {TOOLCALL_FORMAT_GRANITE, "", TG_ARRAYS("\"<|tool_call|>\"", ""), {TG_OBJ("arguments")}, {"<|tool_call|>"}, false, g_mk_granite},
    {TOOLCALL_FORMAT_APRIEL, "", TG_ARRAYS("\"<tool_calls>\"", "\"</tool_calls>\""), {TG_OBJ("arguments")},
     {"<tool_calls>"}, false, g_mk_apriel},
    {TOOLCALL_FORMAT_LFM2, "", TG_ARRAYS("\"<|tool_call_start|>\"", "\"<|tool_call_end|>\""), {TG_OBJ("arguments")},
     {"<|tool_call_start|>"}, false, g_mk_lfm2},
};

/* An XML-parameter format: GBNF fragments around the name and each
 * parameter (rules pname / pval of an unconstrained tool are shared). */
typedef struct tg_xml_fmt {
    toolcall_format f;
    const char *head, *many, *one; /* as tg_json_fmt's, using the rule call */
    const char *pre, *mid, *post;        /* call: pre NAME mid PARAMS post */
    const char *ppre, *pmid, *ppost;     /* parameter: ppre KEY pmid VALUE ppost */
    const char *trigger;
    const char *const *markers;
} tg_xml_fmt;

#define TG_BLOCKS "root ::= blk ( tws blk )* tws\n", "root ::= blk tws\n"
static const tg_xml_fmt g_xml_fmts[] = {
    {TOOLCALL_FORMAT_QWEN3_CODER, "blk ::= \"<tool_call>\\n\" call \"</tool_call>\"\n", TG_BLOCKS, "\"<function=\"",
     "\">\\n\"", "\"</function>\\n\"", "\"<parameter=\"", "\">\\n\"", "\"\\n</parameter>\\n\"", "<tool_call>", g_mk_hermes},
    {TOOLCALL_FORMAT_SEED_OSS, "blk ::= \"<seed:tool_call>\\n\" call \"</seed:tool_call>\"\n", TG_BLOCKS,
     "\"<function=\"", "\">\\n\"", "\"</function>\\n\"", "\"<parameter=\"", "\">\"", "\"</parameter>\\n\"",
     "<seed:tool_call>", g_mk_seed},
    {TOOLCALL_FORMAT_GLM, "blk ::= \"<tool_call>\" call \"</tool_call>\"\n", TG_BLOCKS, "", "\"\\n\"", "",
     "\"<arg_key>\"", "\"</arg_key>\\n<arg_value>\"", "\"</arg_value>\\n\"", "<tool_call>", g_mk_glm},
    {TOOLCALL_FORMAT_MINIMAX_M2, "", "root ::= \"<minimax:tool_call>\\n\" call+ \"</minimax:tool_call>\"\n",
     "root ::= \"<minimax:tool_call>\\n\" call \"</minimax:tool_call>\"\n", "\"<invoke name=\\\"\"", "\"\\\">\\n\"",
     "\"</invoke>\\n\"", "\"<parameter name=\\\"\"", "\"\\\">\"", "\"</parameter>\\n\"", "<minimax:tool_call>", g_mk_minimax},
};

static const tg_json_fmt *json_fmt(toolcall_format f)
{
    for (size_t i = 0; i < BASE_ARRAY_LEN(g_json_fmts); i++)
        if (g_json_fmts[i].f == f) return &g_json_fmts[i];
    return NULL;
}

static const tg_xml_fmt *xml_fmt(toolcall_format f)
{
    for (size_t i = 0; i < BASE_ARRAY_LEN(g_xml_fmts); i++)
        if (g_xml_fmts[i].f == f) return &g_xml_fmts[i];
    return NULL;
}

bool toolcall_grammar_supported(toolcall_format f)
{
    return json_fmt(f) || xml_fmt(f);
}

/* ---- XML values ------------------------------------------------------------ */

/* A string parameter: type string, or an enum of strings alone. */
static bool xml_raw_string(json_t *ps)
{
    const char *t = json_string_value(json_object_get(ps, "type"));
    json_t *en = json_object_get(ps, "enum");
    if (!t && json_is_array(en) && json_array_size(en) > 0) {
        size_t i;
        json_t *x;
        json_array_foreach(en, i, x) if (!json_is_string(x)) return false;
        return true;
    }
    return t && strcmp(t, "string") == 0;
}

static bool int_member(json_t *o, const char *k, long long *out)
{
    json_t *v = json_object_get(o, k);
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 10000) return false;
    *out = (long long)json_integer_value(v);
    return true;
}

/* The value rule of one XML parameter: prefix names it. A string is raw
 * text (no '<': it would end the value), its enum strings, or its length
 * bounds; anything else the JSON of its schema. */
static keel_status xml_value(tg_buf *b, json_t *ps, const char *prefix, char *why)
{
    if (!xml_raw_string(ps)) return schema_rules(b, ps, prefix, why);
    json_t *en = json_object_get(ps, "enum");
    if (json_is_array(en) && json_array_size(en) > 0) {
        tg_putf(b, "%sroot ::= ", prefix);
        size_t i;
        json_t *x;
        json_array_foreach(en, i, x) {
            const char *s = json_string_value(x);
            if (!s || strchr(s, '<')) return base_err(why, KEEL_EUNSUPPORTED, "enum value %zu is not a string without '<'", i);
            if (i) tg_puts(b, " | ");
            tg_lit(b, s, json_string_length(x));
        }
        tg_puts(b, "\n");
        return b->st;
    }
    for (const char *k = "pattern\0format\0const\0"; *k; k += strlen(k) + 1)
        if (json_object_get(ps, k))
            return base_err(why, KEEL_EUNSUPPORTED, "json schema: keyword '%s' of a raw string parameter is not supported",
                            k);
    long long mn = 0, mx = -1;
    /* a bound that cannot be written is refused, never dropped */
    if ((json_object_get(ps, "minLength") && !int_member(ps, "minLength", &mn)) ||
        (json_object_get(ps, "maxLength") && !int_member(ps, "maxLength", &mx)) || (mx >= 0 && mx < mn))
        return base_err(why, KEEL_EUNSUPPORTED,
                        "json schema: minLength / maxLength of a raw string parameter must be integers 0..10000, "
                        "maxLength >= minLength");
    if (mx >= 0)
        tg_putf(b, "%sroot ::= [^<]{%lld,%lld}\n", prefix, mn, mx);
    else
        tg_putf(b, "%sroot ::= [^<]{%lld,}\n", prefix, mn);
    return b->st;
}

/* A tool's parameters rule tK-params (XML formats). */
static keel_status xml_params(tg_buf *b, const tg_xml_fmt *x, int32_t k, json_t *schema, char *why)
{
    json_t *props = json_object_get(schema, "properties"), *req = json_object_get(schema, "required");
    if (props && !json_is_object(props)) return base_err(why, KEEL_EUNSUPPORTED, "properties must be an object");
    size_t n = json_object_size(props);
    size_t i = 0;
    const char *key;
    json_t *ps;
    tg_putf(b, "t%d-params ::=", k);
    if (n == 0) tg_puts(b, " \"\"");
    json_object_foreach(props, key, ps) {
        bool required = false;
        size_t j;
        json_t *r;
        json_array_foreach(req, j, r) required |= json_is_string(r) && strcmp(json_string_value(r), key) == 0;
        tg_putf(b, " t%d-p%zu%s", k, i, required ? "" : "?");
        i++;
    }
    tg_puts(b, "\n");
    i = 0;
    json_object_foreach(props, key, ps) {
        if (strchr(key, '<') || strchr(key, '>') || strchr(key, '"'))
            return base_err(why, KEEL_EUNSUPPORTED, "property name '%.60s' cannot be written as a tag", key);
        tg_putf(b, "t%d-p%zu ::= %s ", k, i, x->ppre);
        tg_lit(b, key, strlen(key));
        tg_putf(b, " %s t%d-v%zu-root %s\n", x->pmid, k, i, x->ppost);
        char prefix[48];
        snprintf(prefix, sizeof prefix, "t%d-v%zu-", k, i);
        keel_status st = xml_value(b, json_is_object(ps) || json_is_boolean(ps) ? ps : NULL, prefix, why);
        if (st) {
            char tmp[BASE_ERR_CAP];
            snprintf(tmp, sizeof tmp, "%s", why);
            return base_err(why, st, "parameter '%.60s': %s", key, tmp);
        }
        i++;
    }
    return b->st;
}

/* ---- the grammar ------------------------------------------------------------ */

static void note_add(toolcall_grammar *g, const char *fmt, ...) BASE_PRINTF(2, 3);
static void note_add(toolcall_grammar *g, const char *fmt, ...)
{
    size_t n = strlen(g->note);
    if (n + 3 >= sizeof g->note) return;
    if (n) {
        memcpy(g->note + n, "; ", 3);
        n += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->note + n, sizeof g->note - n, fmt, ap);
    va_end(ap);
}

/* The argument rules of tool k into b: its schema's (tK-root, or for XML
 * tK-params) when constrained and the schema compiles. On a refusal a
 * strict tool fails the build; another is left unconstrained (noted). */
static keel_status tool_rules(tg_buf *b, const tg_xml_fmt *x, int32_t k, tg_tool *t, toolcall_grammar *g, char *err)
{
    if (!t->constrain) return KEEL_OK;
    size_t mark = b->n;
    char why[BASE_ERR_CAP] = "", prefix[32];
    snprintf(prefix, sizeof prefix, "t%d-", k);
    static const char any_object[] = "{\"type\":\"object\"}";
    json_t *obj = NULL;
    if (!t->schema && !(obj = json_loads(any_object, 0, NULL))) return base_err(err, KEEL_ENOMEM, "out of memory");
    keel_status st = x ? xml_params(b, x, k, t->schema ? t->schema : obj, why)
                       : schema_rules(b, t->schema ? t->schema : obj, prefix, why);
    json_decref(obj);
    if (st == KEEL_OK) {
        t->ok = true;
        g->n_constrained++;
        return KEEL_OK;
    }
    if (st == KEEL_ENOMEM || st == KEEL_EINTERNAL || b->st) return base_err(err, st, "tool '%.60s': %s", t->name, why);
    if (t->strict) return base_err(err, st, "tool '%.60s' (strict): %s", t->name, why);
    /* drop what was written, leave the tool free */
    b->n = mark;
    if (b->p) b->p[mark] = 0;
    note_add(g, "tool '%.40s' unconstrained: %.120s", t->name, why);
    return KEEL_OK;
}

/* The name as the format writes it: a JSON string or raw text. */
static keel_status name_lit(tg_buf *b, const char *name, bool as_json)
{
    if (!as_json) {
        tg_lit(b, name, strlen(name));
        return b->st;
    }
    json_t *s = json_string(name);
    char *j = s ? json_dumps(s, JSON_ENCODE_ANY) : NULL;
    json_decref(s);
    if (!j) return KEEL_ENOMEM;
    tg_lit(b, j, strlen(j));
    chat_json_free(j);
    return b->st;
}

keel_status toolcall_grammar_build(toolcall_format f, json_t *tools, const char *only, bool all, bool parallel,
                                   toolcall_grammar *out, char *err)
{
    if (!out) return base_err(err, KEEL_EINVAL, "out is NULL");
    memset(out, 0, sizeof *out);
    const tg_json_fmt *jf = json_fmt(f);
    const tg_xml_fmt *xf = xml_fmt(f);
    if (!jf && !xf) return base_err(err, KEEL_EUNSUPPORTED, "tool-call format '%s' has no grammar", toolcall_format_name(f));
    if (!json_is_array(tools) || json_array_size(tools) == 0) return base_err(err, KEEL_EINVAL, "no tools");
    size_t n_tools = json_array_size(tools);
    if (n_tools > 4096) return base_err(err, KEEL_ERANGE, "%zu tools (at most 4096)", n_tools);
    tg_tool *tt = base_calloc(n_tools, sizeof *tt);
    if (!tt) return base_err(err, KEEL_ENOMEM, "out of memory");
    tg_buf b = {0};
    keel_status st = KEEL_OK;
    int32_t n_named = 0;
    bool any_free = false;
    for (size_t i = 0; i < n_tools && !st; i++) {
        tool_of(json_array_get(tools, i), &tt[i]);
        if (!tt[i].name || !tt[i].name[0] || (only && strcmp(tt[i].name, only) != 0)) continue;
        if (!jf && (strchr(tt[i].name, '<') || strchr(tt[i].name, '>') || strchr(tt[i].name, '"'))) {
            note_add(out, "tool '%.40s' left out: its name cannot be written as a tag", tt[i].name);
            tt[i].name = NULL;
            continue;
        }
        n_named++;
        tt[i].constrain = all || tt[i].strict;
        st = tool_rules(&b, xf, (int32_t)i, &tt[i], out, err);
        any_free |= !tt[i].ok;
    }
    if (!st && n_named == 0 && only) st = base_err(err, KEEL_EINVAL, "tool '%.60s' is not among the tools", only);
    if (!st && n_named == 0 && !only) st = base_err(err, KEEL_EINVAL, "no tool with a name the format can write");
    if (!st) {
        /* the format's blocks, then one alternative per tool and call kind */
        tg_puts(&b, jf ? jf->head : xf->head);
        tg_puts(&b, parallel ? (jf ? jf->many : xf->many) : (jf ? jf->one : xf->one));
        tg_puts(&b, "tws ::= [ \\t\\n]{0,4}\n");
        for (int c = 0; c < (jf ? 2 : 1) && !b.st; c++) {
            const tg_call *k = jf ? &jf->calls[c] : NULL;
            if (jf && !k->rule) break;
            tg_putf(&b, "%s ::=", jf ? k->rule : "call");
            int32_t alt = 0;
            for (size_t i = 0; i < n_tools && !b.st; i++) {
                if (!tt[i].name || (only && strcmp(tt[i].name, only) != 0)) continue;
                tg_puts(&b, alt++ ? " |\n    " : " "); /* a newline ends a rule except after '|' */
                tg_puts(&b, jf ? k->pre : xf->pre);
                tg_puts(&b, " ");
                if ((st = name_lit(&b, tt[i].name, jf && k->name_json)) != KEEL_OK) break;
                tg_putf(&b, " %s ", jf ? k->mid : xf->mid);
                if (jf)
                    tg_putf(&b, tt[i].ok ? "t%zu-root" : "any-root", i);
                else
                    tg_putf(&b, tt[i].ok ? "t%zu-params" : "any-params", i);
                tg_putf(&b, " %s", jf ? k->post : xf->post);
            }
            tg_puts(&b, "\n");
        }
        if (any_free && jf) {
            char why[BASE_ERR_CAP] = "";
            json_t *obj = json_pack("{ss}", "type", "object");
            st = obj ? schema_rules(&b, obj, "any-", why) : KEEL_ENOMEM;
            json_decref(obj);
            if (st) base_err(err, st, "the any-object rule: %s", why);
        } else if (any_free) {
            tg_putf(&b, "any-params ::= any-p*\nany-p ::= %s [a-zA-Z0-9_.-]{1,64} %s [^<]* %s\n", xf->ppre, xf->pmid,
                    xf->ppost);
        }
    }
    if (!st && b.st) st = base_err(err, b.st, b.st == KEEL_ERANGE ? "tool grammar larger than %u bytes" : "out of memory",
                                   (unsigned)GRAM_MAX_SOURCE);
    base_free(tt, n_tools * sizeof *tt);
    if (st) {
        base_free(b.p, b.cap);
        memset(out, 0, sizeof *out);
        return st;
    }
    /* the text is handed over with its exact size (n + 1), as base_free needs it */
    char *text = base_realloc(b.p, b.cap, b.n + 1);
    if (!text) {
        base_free(b.p, b.cap);
        memset(out, 0, sizeof *out);
        return base_err(err, KEEL_ENOMEM, "out of memory");
    }
    out->gbnf = text;
    out->n_gbnf = b.n;
    for (int i = 0; i < 2; i++) {
        const char *t = jf ? jf->triggers[i] : (i == 0 ? xf->trigger : NULL);
        if (t) out->triggers[out->n_triggers++] = t;
    }
    out->at_start = jf && jf->at_start;
    out->markers = jf ? jf->markers : xf->markers;
    return KEEL_OK;
}

void toolcall_grammar_free(toolcall_grammar *g)
{
    if (!g) return;
    base_free(g->gbnf, g->gbnf ? g->n_gbnf + 1 : 0);
    g->gbnf = NULL;
    g->n_gbnf = 0;
}
