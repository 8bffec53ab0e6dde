/*
 * toolcall_hdr.c — call headers: what follows a block marker (a JSON call
 * object's name, <function=NAME>, name[ARGS], DeepSeek / Kimi call openers,
 * the end of the block), decided atomically over held bytes before a call
 * is committed, and the calls read whole before committing (a JSON object
 * whose arguments precede its name, Python-style and Gemma 4 calls).
 * Failing returns the held text, raw, to the text it came from
 * (toolcall.c's invariants).
 */
#include "toolcall_int.h"

#include <string.h>

/* ---- headers --------------------------------------------------------------------------- */

static bool key_in(const char *k, const char *const *set)
{
    for (; *set; set++)
        if (strcmp(k, *set) == 0) return true;
    return false;
}

static const char *const g_name_keys[] = {"name", "tool_name", NULL};
static const char *const g_args_keys[] = {"arguments", "parameters", NULL};
static const char *const g_id_keys[] = {"id", "tool_call_id", NULL};

/* A JSON string member value at s[*j] that is an id: into id (TOOLCALL_ID_CAP);
 * a longer or empty one is not kept. */
static tc_pr read_id(const char *s, size_t n, size_t *j, char *id)
{
    char buf[TOOLCALL_NAME_CAP];
    size_t len;
    tc_pr r = tc_json_string(s, n, j, buf, sizeof buf, &len);
    if (r == TC_OK && len > 0 && len < TOOLCALL_ID_CAP && strlen(buf) == len) memcpy(id, buf, len + 1);
    return r;
}

/* A JSON call object starting at s[i] == '{': committed as soon as its
 * name is read (H_CALL, then ST_OBJ_REST reads the members up to the
 * arguments), an id before the name kept; H_FALLBACK when the object must
 * be read whole (arguments before the name, a nested "function", no name
 * yet, or `whole`: the format's ids may follow the arguments). */
static tc_pr hdr_json_obj(const char *s, size_t n, size_t i, bool at_end, bool whole, bool name_keyed, hdr *h)
{
    size_t j = i + 1;
    char key[64];
    size_t klen;
    for (;;) {
        j = tc_skip_ws(s, n, j);
        if (j >= n) return TC_MORE;
        if (s[j] == '}') break;
        tc_pr r = tc_json_string(s, n, &j, key, sizeof key, &klen);
        if (r != TC_OK) return r;
        j = tc_skip_ws(s, n, j);
        if ((r = tc_lit(s, n, &j, ":")) != TC_OK) return r;
        j = tc_skip_ws(s, n, j);
        if (j >= n) return TC_MORE;
        if (key_in(key, g_args_keys) || whole) break;
        if (name_keyed && !key_in(key, g_name_keys) && !key_in(key, g_id_keys) && s[j] == '{') {
            /* {"NAME": {arguments}}: the key names the call, its value is the arguments */
            if (klen == 0 || strlen(key) != klen) return TC_FAIL;
            memcpy(h->name, key, klen + 1);
            h->kind = H_CALL;
            h->used = j;
            h->next = ST_ARGS;
            h->sub = SUB_JSON;
            return TC_OK;
        }
        if (key_in(key, g_name_keys)) {
            size_t nlen;
            if (s[j] != '"') return TC_FAIL;
            if ((r = tc_json_string(s, n, &j, h->name, sizeof h->name, &nlen)) != TC_OK) return r;
            if (nlen == 0 || strlen(h->name) != nlen) return TC_FAIL;
            h->kind = H_CALL;
            h->used = j;
            h->next = ST_OBJ_REST;
            h->sub = SUB_JSON;
            return TC_OK;
        }
        if (key_in(key, g_id_keys) && s[j] == '"') {
            if ((r = read_id(s, n, &j, h->id)) != TC_OK) return r;
        } else if (strcmp(key, "function") == 0 && s[j] == '{') {
            break;
        } else if ((r = tc_json_skip(s, n, &j, at_end)) != TC_OK) {
            return r;
        }
        j = tc_skip_ws(s, n, j);
        if (j >= n) return TC_MORE;
        if (s[j] == '}') break;
        if (s[j] != ',') return TC_FAIL;
        j++;
    }
    h->id[0] = '\0';
    h->kind = H_FALLBACK;
    h->used = i;
    h->sub = SUB_JSON;
    return TC_OK;
}

/* The close marker at s[*j], if any: TC_OK consumed, TC_MORE partial, TC_FAIL absent. */
static tc_pr opt_lit(const char *s, size_t n, size_t *j, const char *lit)
{
    if (!lit) return TC_FAIL;
    return tc_lit(s, n, j, lit);
}

static tc_pr hdr_end_block(size_t used, hdr *h)
{
    h->kind = H_END_BLOCK;
    h->used = used;
    return TC_OK;
}

/* Whether call objects are read whole here: the format's ids may follow
 * the arguments, or (Llama's bare JSON) an object without arguments is an
 * answer, not a call. */
static bool obj_whole(const toolcall_parser *p)
{
    return p->sp->json_whole || p->blk == TC_BLK_LLAMA;
}

/* JSON block: the next call object, or the end of the block. */
static bool py_start(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

static tc_pr hdr_py(size_t j, hdr *h)
{
    h->kind = H_PY;
    h->used = j;
    h->sub = SUB_PY;
    return TC_OK;
}

static tc_pr hdr_json_block(toolcall_parser *p, const char *s, size_t n, bool at_end, hdr *h)
{
    size_t j = tc_skip_ws(s, n, 0);
    /* Python-style calls: in a [ ] list (LFM2), or Llama's built-in tools */
    bool py_ok = p->sp->python && (p->blk != TC_BLK_LLAMA || p->mark_end > 0);
    if (!p->blk_has_call) {
        if (j >= n) return at_end ? TC_FAIL : TC_MORE;
        if (s[j] == '[') {
            p->blk_array = true;
            j = tc_skip_ws(s, n, j + 1);
            if (j >= n) return at_end ? TC_FAIL : TC_MORE;
            if (py_ok && py_start(s[j]) && p->blk != TC_BLK_LLAMA) return hdr_py(j, h);
        } else if (py_ok && py_start(s[j]) && p->blk == TC_BLK_LLAMA) {
            return hdr_py(j, h);
        }
        if (s[j] != '{') return TC_FAIL;
        return hdr_json_obj(s, n, j, at_end, obj_whole(p), p->sp->json_name_keyed, h);
    }
    if (j >= n) return at_end ? hdr_end_block(j, h) : TC_MORE;
    if (p->blk_array) {
        if (s[j] == ',') {
            j = tc_skip_ws(s, n, j + 1);
            if (j >= n) return at_end ? TC_FAIL : TC_MORE;
            if (p->sub == SUB_PY && py_start(s[j])) return hdr_py(j, h);
            if (s[j] != '{') return TC_FAIL;
            return hdr_json_obj(s, n, j, at_end, obj_whole(p), p->sp->json_name_keyed, h);
        }
        if (s[j] != ']') return TC_FAIL;
        j = tc_skip_ws(s, n, j + 1);
        if (j >= n && !at_end && p->blk_close) return TC_MORE;
        size_t k = j;
        tc_pr r = opt_lit(s, n, &k, p->blk_close);
        if (r == TC_MORE && !at_end) return TC_MORE;
        return hdr_end_block(r == TC_OK ? k : j, h);
    }
    if (s[j] == ',' || s[j] == ';') {
        size_t k = tc_skip_ws(s, n, j + 1);
        if (k >= n) return at_end ? hdr_end_block(j, h) : TC_MORE;
        if (s[k] == '{') return hdr_json_obj(s, n, k, at_end, obj_whole(p), p->sp->json_name_keyed, h);
        return hdr_end_block(j, h);
    }
    if (s[j] == '{') return hdr_json_obj(s, n, j, at_end, obj_whole(p), p->sp->json_name_keyed, h);
    size_t k = j;
    tc_pr r = opt_lit(s, n, &k, p->blk_close);
    if (r == TC_MORE && !at_end) return TC_MORE;
    return hdr_end_block(r == TC_OK ? k : j, h);
}

/* Reads a name at s[*j] up to (not including) the first byte in `stops`;
 * no control bytes; trimmed; 1..TOOLCALL_NAME_CAP-1 bytes. */
tc_pr tc_read_name(const char *s, size_t n, size_t *j, const char *stops, char *out)
{
    size_t k = *j;
    while (k < n && !strchr(stops, s[k])) {
        if ((uint8_t)s[k] < 0x20 && !tc_is_ws((uint8_t)s[k])) return TC_FAIL;
        if (k - *j >= TOOLCALL_NAME_CAP - 1) return TC_FAIL;
        k++;
    }
    if (k >= n) return TC_MORE;
    size_t a = *j, e = k;
    while (a < e && tc_is_ws((uint8_t)s[a]))
        a++;
    while (e > a && tc_is_ws((uint8_t)s[e - 1]))
        e--;
    if (e == a) return TC_FAIL;
    for (size_t q = a; q < e; q++)
        if (tc_is_ws((uint8_t)s[q]) && s[q] != ' ') return TC_FAIL;
    memcpy(out, s + a, e - a);
    out[e - a] = '\0';
    *j = k;
    return TC_OK;
}

/* Reads a name up to the literal `end` (not consumed). */
static tc_pr read_name_to(const char *s, size_t n, size_t *j, const char *end, char *out)
{
    size_t k = *j;
    for (;;) {
        if (k >= n) return TC_MORE;
        size_t q = k;
        tc_pr r = tc_lit(s, n, &q, end);
        if (r == TC_OK) break;
        if (r == TC_MORE) return TC_MORE;
        if (s[k] == '\n' || s[k] == '<' || (uint8_t)s[k] < 0x20) return TC_FAIL;
        if (k - *j >= TOOLCALL_NAME_CAP - 1) return TC_FAIL;
        k++;
    }
    size_t a = *j, e = k;
    while (a < e && s[a] == ' ')
        a++;
    while (e > a && s[e - 1] == ' ')
        e--;
    if (e == a) return TC_FAIL;
    memcpy(out, s + a, e - a);
    out[e - a] = '\0';
    *j = k;
    return TC_OK;
}

static tc_pr hdr_call(hdr *h, size_t used, int next, int sub)
{
    h->kind = H_CALL;
    h->used = used;
    h->next = next;
    h->sub = sub;
    return TC_OK;
}

/* <function=NAME> (Qwen3-Coder) / <invoke name="NAME"> / <function name="NAME"> after its opener. */
/* The attributes after a quoted name, up to the end of the tag (">" or
 * x->tag_end): TC_OK with *attr_end where the tag's end starts and *after
 * past it. */
tc_pr tc_xml_attrs(const tc_xml *x, const char *s, size_t n, size_t k, size_t *attr_end, size_t *after)
{
    const char *te = x->tag_end ? x->tag_end : ">";
    for (; k < n; k++) {
        size_t q = k;
        tc_pr r = tc_lit(s, n, &q, te);
        if (r == TC_OK) {
            *attr_end = k;
            *after = q;
            return TC_OK;
        }
        if (r == TC_MORE) return TC_MORE;
        if (s[k] == '<' || s[k] == '\n' || k > HDR_CAP) return TC_FAIL;
    }
    return TC_MORE;
}

static tc_pr read_name_to(const char *s, size_t n, size_t *j, const char *end, char *out);

static tc_pr hdr_xml_name(const tc_xml *x, const char *s, size_t n, size_t j, hdr *h, int sub)
{
    if (x->name_end) { /* NAME<sep> */
        tc_pr r = read_name_to(s, n, &j, x->name_end, h->name);
        if (r != TC_OK) return r;
        return hdr_call(h, j + strlen(x->name_end), ST_XML_PARAMS, sub);
    }
    char quote = x->param_name_end == '"' ? '"' : '>';
    tc_pr r = tc_read_name(s, n, &j, quote == '"' ? "\"\n<>" : ">\n<", h->name);
    if (r != TC_OK) return r;
    if (s[j] != quote) return TC_FAIL;
    j++;
    if (quote == '"') { /* attributes up to the tag's end */
        size_t ae;
        if ((r = tc_xml_attrs(x, s, n, j, &ae, &j)) != TC_OK) return r;
    }
    return hdr_call(h, j, ST_XML_PARAMS, sub);
}

static tc_pr hdr_tagged(toolcall_parser *p, const char *s, size_t n, bool at_end, hdr *h)
{
    size_t j = tc_skip_ws(s, n, 0);
    /* <function= was the block marker: the name follows */
    if (p->blk == TC_BLK_QFUNC && !p->blk_has_call) return hdr_xml_name(p->sp->xml, s, n, 0, h, SUB_XML);
    if (p->blk_has_call) {
        if (p->sub == SUB_JSON) return hdr_json_block(p, s, n, at_end, h);
        /* after </function>: </tool_call>, another <function=, or the end */
        if (j >= n) return at_end ? hdr_end_block(j, h) : TC_MORE;
        size_t k = j;
        tc_pr r = tc_lit(s, n, &k, p->sp->xml->block_close);
        if (r == TC_MORE && !at_end) return TC_MORE;
        if (r == TC_OK) return hdr_end_block(k, h);
        k = j;
        r = tc_lit(s, n, &k, p->sp->xml->invoke_open);
        if (r == TC_MORE && !at_end) return TC_MORE;
        if (r == TC_OK) return hdr_xml_name(p->sp->xml, s, n, k, h, SUB_XML);
        return hdr_end_block(j, h);
    }
    if (j >= n) return at_end ? TC_FAIL : TC_MORE;
    if (s[j] == '{' || s[j] == '[') {
        p->blk_close = p->sp->xml->block_close;
        p->sub = SUB_JSON;
        return hdr_json_block(p, s, n, at_end, h);
    }
    size_t k = j;
    tc_pr r = tc_lit(s, n, &k, p->sp->xml->invoke_open);
    if (r == TC_MORE) return at_end ? TC_FAIL : TC_MORE;
    if (r == TC_OK) return hdr_xml_name(p->sp->xml, s, n, k, h, SUB_XML);
    if (!p->sp->glm) return TC_FAIL;
    /* GLM: name, then <arg_key> or </tool_call> */
    r = tc_read_name(s, n, &j, "<\n{\"", h->name);
    if (r != TC_OK) return r == TC_MORE && at_end ? TC_FAIL : r;
    j = tc_skip_ws(s, n, j);
    k = j;
    r = tc_lit(s, n, &k, "<arg_key>");
    if (r == TC_FAIL) {
        k = j;
        r = tc_lit(s, n, &k, p->sp->xml->block_close);
    }
    if (r == TC_MORE) return at_end ? TC_FAIL : TC_MORE;
    if (r == TC_FAIL) return TC_FAIL;
    return hdr_call(h, j, ST_XML_PARAMS, SUB_GLM);
}

static tc_pr hdr_xml_block(toolcall_parser *p, const char *s, size_t n, bool at_end, hdr *h)
{
    const tc_xml *x = p->sp->xml;
    size_t j = tc_skip_ws(s, n, 0);
    if (!x->invoke_open) /* the block marker opened the call: name follows */
        return hdr_xml_name(x, s, n, 0, h, SUB_XML);
    if (j >= n) return at_end ? (p->blk_has_call ? hdr_end_block(j, h) : TC_FAIL) : TC_MORE;
    size_t k = j;
    tc_pr r = tc_lit(s, n, &k, x->invoke_open);
    if (r == TC_OK) return hdr_xml_name(x, s, n, k, h, SUB_XML);
    if (r == TC_MORE && !at_end) return TC_MORE;
    if (!p->blk_has_call) return TC_FAIL;
    const char *closes[2] = {x->block_close, x->block_close2};
    for (int c = 0; c < 2; c++) {
        k = j;
        r = opt_lit(s, n, &k, closes[c]);
        if (r == TC_OK) return hdr_end_block(k, h);
        if (r == TC_MORE && !at_end) return TC_MORE;
    }
    return hdr_end_block(j, h);
}

static tc_pr hdr_mistral(toolcall_parser *p, const char *s, size_t n, bool at_end, hdr *h)
{
    if (p->sub == SUB_JSON) return hdr_json_block(p, s, n, at_end, h);
    size_t j = tc_skip_ws(s, n, 0);
    if (j >= n) return at_end ? TC_FAIL : TC_MORE;
    if (s[j] == '[' || s[j] == '{') {
        p->sub = SUB_JSON;
        return hdr_json_block(p, s, n, at_end, h);
    }
    tc_pr r = tc_read_name(s, n, &j, "[{\n", h->name);
    if (r != TC_OK) return r == TC_MORE && at_end ? TC_FAIL : r;
    if (s[j] != '[') return TC_FAIL;
    size_t k = j;
    r = tc_lit(s, n, &k, "[CALL_ID]");
    if (r == TC_MORE) return at_end ? TC_FAIL : TC_MORE;
    if (r == TC_OK) {
        char id[TOOLCALL_NAME_CAP];
        j = k;
        r = tc_read_name(s, n, &j, "[\n", id);
        if (r != TC_OK) return r == TC_MORE && at_end ? TC_FAIL : r;
        if (strlen(id) < TOOLCALL_ID_CAP) memcpy(h->id, id, strlen(id) + 1);
    }
    r = tc_lit(s, n, &j, "[ARGS]");
    if (r != TC_OK) return r == TC_MORE && at_end ? TC_FAIL : r;
    return hdr_call(h, j, ST_ARGS, SUB_NAMED);
}

static tc_pr hdr_deepseek(toolcall_parser *p, const char *s, size_t n, bool at_end, hdr *h)
{
    size_t j = tc_skip_ws(s, n, 0), k;
    tc_pr r;
    if (p->blk_has_call || p->blk == TC_BLK_DEEPSEEK) {
        if (j >= n) return at_end ? (p->blk_has_call ? hdr_end_block(j, h) : TC_FAIL) : TC_MORE;
        k = j;
        r = tc_lit(s, n, &k, "<｜tool▁calls▁end｜>");
        if (r == TC_MORE && !at_end) return TC_MORE;
        if (r == TC_OK) return p->blk_has_call ? hdr_end_block(k, h) : TC_FAIL;
        k = j;
        r = tc_lit(s, n, &k, "<｜tool▁call▁begin｜>");
        if (r == TC_MORE && !at_end) return TC_MORE;
        if (r != TC_OK) return p->blk_has_call ? hdr_end_block(j, h) : TC_FAIL;
        j = k;
    }
    /* R1/V3: function<｜tool▁sep｜>NAME\n```json\n ; V3.1: NAME<｜tool▁sep｜> */
    k = j;
    r = tc_lit(s, n, &k, "function<｜tool▁sep｜>");
    if (r == TC_MORE) return at_end ? TC_FAIL : TC_MORE;
    if (r == TC_OK) {
        size_t q = tc_skip_ws(s, n, k);
        if (q >= n) return at_end ? TC_FAIL : TC_MORE;
        if (s[q] != '{') {
            r = tc_read_name(s, n, &k, "\n`{<", h->name);
            if (r != TC_OK) return r == TC_MORE && at_end ? TC_FAIL : r;
            k = tc_skip_ws(s, n, k);
            size_t f = k;
            r = tc_lit(s, n, &f, "```");
            if (r == TC_MORE) return at_end ? TC_FAIL : TC_MORE;
            if (r == TC_OK) {
                k = f;
                size_t t = k;
                r = tc_lit(s, n, &t, "json");
                if (r == TC_MORE) return at_end ? TC_FAIL : TC_MORE;
                if (r == TC_OK) k = t;
            }
            k = tc_skip_ws(s, n, k);
            if (k >= n && !at_end) return TC_MORE;
            return hdr_call(h, k, ST_ARGS, SUB_R1);
        }
        memcpy(h->name, "function", sizeof "function");
        return hdr_call(h, q, ST_ARGS, SUB_V31);
    }
    r = read_name_to(s, n, &j, "<｜tool▁sep｜>", h->name);
    if (r != TC_OK) return r == TC_MORE && at_end ? TC_FAIL : r;
    j += strlen("<｜tool▁sep｜>");
    j = tc_skip_ws(s, n, j);
    if (j >= n && !at_end) return TC_MORE;
    return hdr_call(h, j, ST_ARGS, SUB_V31);
}

static tc_pr hdr_kimi(toolcall_parser *p, const char *s, size_t n, bool at_end, hdr *h)
{
    size_t j = tc_skip_ws(s, n, 0), k;
    tc_pr r;
    if (p->blk_has_call || p->blk == TC_BLK_KIMI) {
        if (j >= n) return at_end ? (p->blk_has_call ? hdr_end_block(j, h) : TC_FAIL) : TC_MORE;
        k = j;
        r = tc_lit(s, n, &k, "<|tool_calls_section_end|>");
        if (r == TC_MORE && !at_end) return TC_MORE;
        if (r == TC_OK) return p->blk_has_call ? hdr_end_block(k, h) : TC_FAIL;
        k = j;
        r = tc_lit(s, n, &k, "<|tool_call_begin|>");
        if (r == TC_MORE && !at_end) return TC_MORE;
        if (r != TC_OK) return p->blk_has_call ? hdr_end_block(j, h) : TC_FAIL;
        j = k;
    }
    char id[TOOLCALL_NAME_CAP];
    r = read_name_to(s, n, &j, "<|tool_call_argument_begin|>", id);
    if (r != TC_OK) return r == TC_MORE && at_end ? TC_FAIL : r;
    j += strlen("<|tool_call_argument_begin|>");
    /* functions.NAME:INDEX, which is also the call's id */
    if (strlen(id) < TOOLCALL_ID_CAP) memcpy(h->id, id, strlen(id) + 1);
    const char *a = strncmp(id, "functions.", 10) == 0 ? id + 10 : id;
    size_t len = strlen(a);
    const char *colon = strrchr(a, ':');
    if (colon && colon[1] && strspn(colon + 1, "0123456789") == strlen(colon + 1))
        len = (size_t)(colon - a);
    if (len == 0) return TC_FAIL;
    memcpy(h->name, a, len);
    h->name[len] = '\0';
    j = tc_skip_ws(s, n, j);
    if (j >= n && !at_end) return TC_MORE;
    return hdr_call(h, j, ST_ARGS, SUB_V31);
}

static tc_pr hdr_func(toolcall_parser *p, const char *s, size_t n, bool at_end, hdr *h)
{
    (void)p;
    size_t j = 0;
    tc_pr r = tc_read_name(s, n, &j, ">\n<{", h->name);
    if (r != TC_OK) return r == TC_MORE && at_end ? TC_FAIL : r;
    if (s[j] != '>') return TC_FAIL;
    j = tc_skip_ws(s, n, j + 1);
    if (j >= n && !at_end) return TC_MORE;
    return hdr_call(h, j, ST_ARGS, SUB_V31);
}

static tc_pr hdr_gemma(toolcall_parser *p, const char *s, size_t n, bool at_end, hdr *h)
{
    size_t j = tc_skip_ws(s, n, 0), k = j;
    if (p->blk_has_call) return hdr_end_block(0, h);
    tc_pr r = tc_lit(s, n, &k, "call:");
    if (r != TC_OK) return r == TC_MORE && at_end ? TC_FAIL : r;
    h->kind = H_PY;
    h->used = j;
    h->sub = SUB_GEMMA;
    return TC_OK;
}

/* MiniMax M3: NS<invoke name="NAME">, or the block's end NS</tool_call>. */
static tc_pr hdr_mm3(toolcall_parser *p, const char *s, size_t n, bool at_end, hdr *h)
{
    size_t j = tc_skip_ws(s, n, 0), k = j;
    if (j >= n) return at_end ? (p->blk_has_call ? hdr_end_block(j, h) : TC_FAIL) : TC_MORE;
    tc_pr r = tc_lit(s, n, &k, TC_MM3_NS "<invoke name=\"");
    if (r == TC_OK) {
        if ((r = tc_read_name(s, n, &k, "\"\n<>", h->name)) != TC_OK) return r == TC_MORE && at_end ? TC_FAIL : r;
        if ((r = tc_lit(s, n, &k, "\">")) != TC_OK) return r == TC_MORE && at_end ? TC_FAIL : r;
        return hdr_call(h, k, ST_MM3, SUB_MM3);
    }
    if (r == TC_MORE && !at_end) return TC_MORE;
    if (!p->blk_has_call) return TC_FAIL;
    k = j;
    r = tc_lit(s, n, &k, TC_MM3_NS "</tool_call>");
    if (r == TC_MORE && !at_end) return TC_MORE;
    return hdr_end_block(r == TC_OK ? k : j, h);
}

/* Functionary v3.2 after ">>>": RECIPIENT then a line break; "all" is
 * the user (text follows), a tool is called with the JSON that follows. */
static tc_pr hdr_recipient(toolcall_parser *p, const char *s, size_t n, bool at_end, hdr *h)
{
    size_t j = 0;
    tc_pr r = tc_read_name(s, n, &j, "\n", h->name);
    if (r != TC_OK) return r == TC_MORE && at_end ? TC_FAIL : r;
    j++;
    if (strcmp(h->name, "all") == 0) {
        h->kind = H_TEXT;
        h->used = j;
        return TC_OK;
    }
    (void)p;
    return hdr_call(h, j, ST_ARGS, SUB_V31);
}

/* Solar Open: <|tool_call:begin|>ID<|tool_call:name|>NAME<|tool_call:args|>, or <|calls|> (the end). */
static tc_pr hdr_solar(toolcall_parser *p, const char *s, size_t n, bool at_end, hdr *h)
{
    size_t j = tc_skip_ws(s, n, 0), k = j;
    if (j >= n) return at_end ? (p->blk_has_call ? hdr_end_block(j, h) : TC_FAIL) : TC_MORE;
    tc_pr r = tc_lit(s, n, &k, "<|tool_call:begin|>");
    if (r == TC_MORE && !at_end) return TC_MORE;
    if (r != TC_OK) {
        if (!p->blk_has_call) return TC_FAIL;
        k = j;
        r = tc_lit(s, n, &k, "<|calls|>");
        if (r == TC_MORE && !at_end) return TC_MORE;
        return hdr_end_block(r == TC_OK ? k : j, h);
    }
    char id[TOOLCALL_NAME_CAP];
    if ((r = read_name_to(s, n, &k, "<|tool_call:name|>", id)) != TC_OK) return r == TC_MORE && at_end ? TC_FAIL : r;
    if (strlen(id) < TOOLCALL_ID_CAP) memcpy(h->id, id, strlen(id) + 1);
    k += strlen("<|tool_call:name|>");
    if ((r = read_name_to(s, n, &k, "<|tool_call:args|>", h->name)) != TC_OK)
        return r == TC_MORE && at_end ? TC_FAIL : r;
    k = tc_skip_ws(s, n, k + strlen("<|tool_call:args|>"));
    if (k >= n && !at_end) return TC_MORE;
    return hdr_call(h, k, ST_ARGS, SUB_V31);
}

static tc_pr parse_header(toolcall_parser *p, const char *s, size_t n, bool at_end, hdr *h)
{
    switch (p->blk) {
    case TC_BLK_SOLAR: return hdr_solar(p, s, n, at_end, h);
    case TC_BLK_RECIPIENT: return hdr_recipient(p, s, n, at_end, h);
    case TC_BLK_MM3: return hdr_mm3(p, s, n, at_end, h);
    case TC_BLK_GEMMA: return hdr_gemma(p, s, n, at_end, h);
    case TC_BLK_JSON:
    case TC_BLK_LLAMA:
        if (!p->blk_has_call) p->sub = SUB_JSON;
        if (p->blk == TC_BLK_JSON) p->blk_close = p->sp->json_close;
        return hdr_json_block(p, s, n, at_end, h);
    case TC_BLK_TAGGED:
    case TC_BLK_QFUNC: return hdr_tagged(p, s, n, at_end, h);
    case TC_BLK_XML: return hdr_xml_block(p, s, n, at_end, h);
    case TC_BLK_MISTRAL: return hdr_mistral(p, s, n, at_end, h);
    case TC_BLK_DEEPSEEK:
    case TC_BLK_DEEPSEEK1: return hdr_deepseek(p, s, n, at_end, h);
    case TC_BLK_KIMI:
    case TC_BLK_KIMI1: return hdr_kimi(p, s, n, at_end, h);
    case TC_BLK_FUNC: return hdr_func(p, s, n, at_end, h);
    default: return TC_FAIL;
    }
}

/* The held region did not become a call: it goes back to the text, raw. */
keel_status tc_block_fail(toolcall_parser *p)
{
    keel_status st = KEEL_OK;
    if (!p->blk_has_call && p->mark_end) {
        const char *b = tc_cur(p);
        for (size_t i = 0; i < p->mark_end; i++)
            if (!tc_is_ws((uint8_t)b[i])) {
                if (p->reasoning_mode)
                    p->seen_reasoning = true;
                else
                    p->seen_content = true;
            }
        st = tc_emit_text(p, p->mark_end);
    }
    if (p->blk == TC_BLK_LLAMA) p->llama_start_done = true;
    p->mark_end = 0;
    p->blk = TC_BLK_NONE;
    p->st = ST_TEXT;
    p->skip_ws = false;
    return st;
}

void tc_block_done(toolcall_parser *p)
{
    p->blk = TC_BLK_NONE;
    p->mark_end = 0;
    p->st = ST_TEXT;
    p->skip_ws = true;
}

void tc_args_begin(toolcall_parser *p)
{
    json_scan_init(&p->scan);
    p->args_started = false;
    p->args_string = false;
    p->args_any = false;
    p->inner_bad = p->inner_done = false;
    p->esc_n = 0;
}

/* Names are 1..TOOLCALL_NAME_CAP-1 bytes without control bytes. */
bool tc_name_ok(const char *s, size_t n)
{
    if (n == 0 || n >= TOOLCALL_NAME_CAP) return false;
    for (size_t i = 0; i < n; i++)
        if ((uint8_t)s[i] <= 0x20 || s[i] == 0x7f || strchr("\"'<>{}[]`", s[i])) return false;
    return true;
}

keel_status tc_commit(toolcall_parser *p, const hdr *h, size_t consumed)
{
    p->pos += consumed;
    p->mark_end = 0;
    p->sub = h->sub;
    keel_status st = tc_start_call(p, h->name, h->id);
    if (st) return st;
    p->st = h->next;
    if (h->next == ST_ARGS) tc_args_begin(p);
    if (h->next == ST_MM3) p->obj_len = 0;
    if (h->next == ST_XML_PARAMS) p->xml = h->sub == SUB_GLM ? p->sp->glm : p->sp->xml;
    return KEEL_OK;
}

keel_status tc_h_hdr(toolcall_parser *p, bool at_end, bool *more)
{
    const char *s = tc_cur(p) + p->mark_end;
    size_t n = tc_avail(p) - p->mark_end;
    bool capped = n >= HDR_CAP;
    hdr h;
    memset(&h, 0, sizeof h);
    tc_pr r = parse_header(p, s, capped ? HDR_CAP : n, at_end && !capped, &h);
    if (r == TC_MORE) {
        if (!at_end && !capped) {
            *more = true;
            return KEEL_OK;
        }
        r = TC_FAIL;
    }
    if (r == TC_FAIL) return tc_block_fail(p);
    if (h.kind == H_TEXT) {
        p->pos += p->mark_end + h.used;
        tc_block_done(p);
        p->skip_ws = false;
        return KEEL_OK;
    }
    if (h.kind == H_END_BLOCK) {
        if (!p->blk_has_call) return tc_block_fail(p);
        p->pos += p->mark_end + h.used;
        tc_block_done(p);
        return KEEL_OK;
    }
    if (h.kind == H_FALLBACK || h.kind == H_PY) {
        p->st = h.kind == H_PY ? ST_PY : ST_OBJ;
        p->sub = h.sub;
        p->obj_off = p->mark_end + h.used;
        p->obj_len = 0;
        json_scan_init(&p->scan);
        tc_py_scan_init(&p->py);
        tc_gemma_scan_init(&p->gemma);
        return KEEL_OK;
    }
    if (!tc_name_ok(h.name, strlen(h.name)) || !tc_tool_known(p, h.name)) return tc_block_fail(p);
    return tc_commit(p, &h, p->mark_end + h.used);
}

/* What follows a call's end in its block. */
void tc_block_next(toolcall_parser *p)
{
    switch (p->blk) {
    case TC_BLK_FUNC:
    case TC_BLK_GEMMA: tc_block_done(p); return;
    case TC_BLK_HARMONY:
        p->blk = TC_BLK_NONE;
        p->st = ST_H_HEADER;
        return;
    case TC_BLK_MISTRAL:
        if (p->sub == SUB_NAMED) {
            tc_block_done(p);
            return;
        }
        break;
    case TC_BLK_TAGGED:
        if (p->sub == SUB_GLM) {
            tc_block_done(p);
            return;
        }
        break;
    case TC_BLK_XML:
        if (!p->sp->xml->invoke_open) {
            tc_block_done(p);
            return;
        }
        break;
    default: break;
    }
    p->st = ST_HDR;
    p->mark_end = 0;
}

/* ---- a committed JSON call object before its arguments (ST_OBJ_REST) ---------------- */

static const char g_err_obj[] = "unexpected text in the call object";

/* The members after the name, one at a time: the arguments key starts the
 * arguments; other members are skipped; '}' ends a call without arguments. */
keel_status tc_h_obj_rest(toolcall_parser *p, bool at_end, bool *more)
{
    const char *s = tc_cur(p);
    size_t n = tc_avail(p), lim = BASE_MIN(n, (size_t)HDR_CAP), j = tc_skip_ws(s, lim, 0), k;
    char key[64];
    size_t klen;
    if (j >= lim) goto more_or_cut;
    if (s[j] == '}') {
        p->pos += j + 1;
        keel_status st = tc_end_call(p, NULL);
        if (st == KEEL_OK) tc_block_next(p);
        return st;
    }
    if (s[j] != ',') goto bad;
    k = tc_skip_ws(s, lim, j + 1);
    tc_pr r = k < lim ? tc_json_string(s, lim, &k, key, sizeof key, &klen) : TC_MORE;
    if (r == TC_OK) {
        k = tc_skip_ws(s, lim, k);
        r = tc_lit(s, lim, &k, ":");
    }
    if (r == TC_OK) {
        k = tc_skip_ws(s, lim, k);
        if (k >= lim) r = TC_MORE;
    }
    if (r == TC_OK && key_in(key, g_args_keys)) {
        p->pos += k;
        tc_args_begin(p);
        p->st = ST_ARGS;
        return KEEL_OK;
    }
    if (r == TC_OK) r = tc_json_skip(s, lim, &k, at_end && lim == n);
    if (r == TC_OK) {
        p->pos += k;
        return KEEL_OK;
    }
    if (r == TC_FAIL) goto bad;
more_or_cut:
    if (!at_end && n < HDR_CAP) {
        *more = true;
        return KEEL_OK;
    }
    if (!at_end) goto bad;
    p->pos += n;
    return tc_call_cut(p, "the output ended inside the tool call");
bad:
    p->pos += j;
    return tc_call_cut(p, g_err_obj);
}

/* ---- JSON call object read whole (ST_OBJ) ------------------------------------------- */

/* The name and the arguments' span of a JSON call object s[0..n) that the
 * scanner has validated; looks one level into a "function" member. */
static bool obj_fields(const char *s, size_t n, char *name, char *id, size_t *as, size_t *ae, int depth)
{
    size_t j = 1;
    bool have_name = false;
    for (;;) {
        j = tc_skip_ws(s, n, j);
        if (j >= n || s[j] == '}') break;
        char key[64];
        size_t kl, k0 = j;
        if (tc_json_string(s, n, &j, key, sizeof key, &kl) != TC_OK) {
            j = k0;
            key[0] = '\0';
            if (tc_json_skip(s, n, &j, true) != TC_OK) return false;
        }
        j = tc_skip_ws(s, n, j) + 1; /* ':' */
        j = tc_skip_ws(s, n, j);
        size_t vs = j;
        if (tc_json_skip(s, n, &j, true) != TC_OK) return false;
        if (key_in(key, g_name_keys) && s[vs] == '"' && !have_name) {
            size_t q = vs, nl;
            if (tc_json_string(s, n, &q, name, TOOLCALL_NAME_CAP, &nl) != TC_OK) return false;
            if (!tc_name_ok(name, nl)) return false;
            have_name = true;
        } else if (key_in(key, g_id_keys) && s[vs] == '"' && !id[0]) {
            size_t q = vs;
            read_id(s, n, &q, id);
        } else if (key_in(key, g_args_keys) && *ae == 0) {
            *as = vs;
            *ae = j;
        } else if (strcmp(key, "function") == 0 && s[vs] == '{' && depth == 0 && !have_name) {
            size_t fs = 0, fe = 0;
            if (obj_fields(s + vs, j - vs, name, id, &fs, &fe, 1)) {
                have_name = true;
                if (fe) *as = vs + fs, *ae = vs + fe;
            }
        }
        j = tc_skip_ws(s, n, j);
        if (j < n && s[j] == ',') j++;
    }
    return have_name;
}

static keel_status obj_commit(toolcall_parser *p, const char *s, size_t n)
{
    hdr h = {.kind = H_CALL, .next = ST_HDR, .sub = SUB_JSON};
    size_t as = 0, ae = 0;
    if (!obj_fields(s, n, h.name, h.id, &as, &ae, 0) || !tc_tool_known(p, h.name)) return tc_block_fail(p);
    if (ae == 0 && p->blk == TC_BLK_LLAMA) return tc_block_fail(p); /* a bare JSON answer, not a call */
    p->pos += p->obj_off + n;
    p->mark_end = 0;
    keel_status st = tc_commit(p, &h, 0);
    if (st) return st;
    const char *why = NULL;
    if (ae > as && s[as] == '"') { /* a string holding the JSON */
        size_t cap = ae - as, dl;
        char *d = base_alloc(cap);
        if (!d) return tc_fail_nomem(p, KEEL_ENOMEM);
        size_t q = as;
        if (tc_json_string(s, ae, &q, d, cap, &dl) == TC_OK) {
            st = tc_out_args(p, d, dl);
            if (dl && !tc_json_whole(d, dl)) why = tc_err_strjson;
        } else {
            st = tc_out_args(p, s + as, ae - as);
            why = tc_err_strjson;
        }
        base_free(d, cap);
    } else if (ae > as && !(ae - as == 4 && memcmp(s + as, "null", 4) == 0)) {
        st = tc_out_args(p, s + as, ae - as);
    }
    if (st == KEEL_OK) st = tc_end_call(p, why);
    if (st == KEEL_OK) tc_block_next(p);
    return st;
}

keel_status tc_h_obj(toolcall_parser *p, bool at_end, bool *more)
{
    const char *s = tc_cur(p) + p->obj_off;
    size_t n = tc_avail(p) - p->obj_off;
    while (p->obj_len < n) {
        if (p->obj_len >= p->max_held) return tc_block_fail(p);
        js_result r = json_scan_byte(&p->scan, (uint8_t)s[p->obj_len]);
        if (r != JS_R_CONT && r != JS_R_DONE) return tc_block_fail(p);
        p->obj_len++;
        if (r == JS_R_DONE) return obj_commit(p, s, p->obj_len);
    }
    if (at_end) return tc_block_fail(p);
    *more = true;
    return KEEL_OK;
}

/* A Python-style call, read whole, then committed as one (ST_PY). */
/* The name of a Python-style call s[0..n) that ends with its '(' (Llama's
 * built-ins: NAME.call): into name; false when it is not one. */
static bool py_name(const char *s, size_t n, char *name)
{
    size_t a = tc_skip_ws(s, n, 0), e = n - 1;
    while (e > a && tc_is_ws((uint8_t)s[e - 1]))
        e--;
    if (e - a >= 5 && memcmp(s + e - 5, ".call", 5) == 0) e -= 5;
    if (e <= a || e - a >= TOOLCALL_NAME_CAP) return false;
    memcpy(name, s + a, e - a);
    name[e - a] = '\0';
    return true;
}

static const char g_err_py[] = "the call's arguments are not Python keyword arguments";

keel_status tc_h_py(toolcall_parser *p, bool at_end, bool *more)
{
    const char *s = tc_cur(p) + p->obj_off;
    size_t n = tc_avail(p) - p->obj_off;
    bool gemma = p->sub == SUB_GEMMA;
    while (p->obj_len < n) {
        if (p->obj_len >= p->max_held) break;
        uint8_t c = (uint8_t)s[p->obj_len];
        bool opened = p->py.opened;
        tc_pr r = gemma ? tc_gemma_scan_byte(&p->gemma, c) : tc_py_scan_byte(&p->py, c);
        if (r == TC_FAIL && p->call < 0) return tc_block_fail(p);
        if (r == TC_FAIL) break;
        p->obj_len++;
        if (!gemma && !opened && p->py.opened) { /* NAME( : the call starts, its name known */
            char name[TOOLCALL_NAME_CAP];
            if (!py_name(s, p->obj_len, name) || !tc_name_ok(name, strlen(name)) || !tc_tool_known(p, name))
                return tc_block_fail(p);
            keel_status st = tc_start_call(p, name, NULL);
            if (st) return st;
        }
        if (r == TC_MORE) continue;
        hdr h = {.kind = H_CALL, .next = gemma ? ST_CALLEND : ST_HDR, .sub = p->sub};
        tc_buf json = {0};
        bool ok;
        keel_status st = gemma ? tc_gemma_call(s, p->obj_len, h.name, &json, &ok)
                               : tc_py_call(s, p->obj_len, h.name, &json, &ok);
        if (st == KEEL_OK && gemma && (!ok || !tc_name_ok(h.name, strlen(h.name)) || !tc_tool_known(p, h.name))) {
            tc_buf_free(&json);
            return tc_block_fail(p);
        }
        if (st == KEEL_OK) {
            p->pos += p->obj_off + p->obj_len;
            p->mark_end = 0;
            if (gemma) {
                st = tc_commit(p, &h, 0);
            } else {
                p->st = ST_HDR;
                p->sub = h.sub;
            }
        }
        /* arguments that do not convert: the raw text inside the parentheses, marked */
        const char *open_paren = gemma ? NULL : memchr(s, '(', p->obj_len);
        if (st == KEEL_OK && (ok || gemma))
            st = tc_out_args(p, json.p, json.len);
        else if (st == KEEL_OK)
            st = tc_out_args(p, open_paren + 1, (size_t)(s + p->obj_len - 1 - (open_paren + 1)));
        tc_buf_free(&json);
        if (st == KEEL_OK && gemma) return KEEL_OK; /* <tool_call|> next */
        if (st == KEEL_OK) st = tc_end_call(p, ok ? NULL : g_err_py);
        if (st == KEEL_OK) tc_block_next(p);
        return st ? tc_fail_nomem(p, st) : st;
    }
    if (p->obj_len < n || p->obj_len >= p->max_held || at_end) {
        if (p->call < 0) return tc_block_fail(p);
        /* a started call cut by the end, by bytes that cannot be Python or by the bound */
        const char *open_paren = memchr(s, '(', p->obj_len);
        keel_status st = tc_out_args(p, open_paren + 1, (size_t)(s + p->obj_len - (open_paren + 1)));
        p->pos += p->obj_off + p->obj_len;
        p->mark_end = 0;
        if (st) return st;
        return tc_call_cut(p, at_end && p->obj_len == n ? "the output ended inside the arguments" : g_err_py);
    }
    *more = true;
    return KEEL_OK;
}
