/*
 * toolcall.c — the streaming parser of model output (toolcall.h): one byte
 * driven state machine for every format, configured by the tables of
 * toolcall_formats.c.
 *
 * Model: the unconsumed input lives in `in` from `pos`. Each state handler
 * looks at in[pos..len) and either decides (emits output, consumes bytes,
 * changes state) or answers "more" when its decision could depend on bytes
 * not yet fed. Decisions never depend on where the input was split, only
 * on the bytes (and on the end of input, known only in finish), which is
 * why the result is split-independent. Held regions are re-parsed
 * atomically (headers, bounded by HDR_CAP) or scanned incrementally
 * (arguments, JSON call objects, XML values; bounded by max_held).
 *
 * Invariants:
 *   - pos <= in.len; text before pos has been emitted or dropped as markup.
 *   - Before a call is committed (ST_HDR, ST_OBJ) nothing of its text has
 *     been emitted: failing returns it, raw, to the text it came from.
 *   - After CALL_BEGIN the call is ended exactly once (end_call).
 *   - Every output byte goes through out_text/out_args, which append to the
 *     result and deliver the same bytes as events (so streamed == final).
 */
#include "toolcall_int.h"

#include <string.h>
#include <strings.h>

#define WS_CAP 1024    /* whitespace held before a possible marker */
#define HDR_CAP 4096   /* a call header / harmony header */
#define FEED_STEP 4096 /* input appended per step, so holding stays bounded */
#define DEFAULT_HELD ((size_t)1 << 20)
#define MIN_HELD ((size_t)4096)

enum {
    ST_TEXT = 0,  /* content or reasoning text */
    ST_HDR,       /* a call header after a block marker / between calls (pre-commit) */
    ST_OBJ,       /* JSON call object buffered whole (arguments before name) (pre-commit) */
    ST_ARGS,      /* streaming JSON arguments */
    ST_ARGS_RAW,  /* arguments that are not JSON, raw until a stop marker */
    ST_TRAILER,   /* the rest of a JSON call object after its arguments */
    ST_CALLEND,   /* the marker that ends a call after its arguments */
    ST_XML_PARAMS, /* inside an XML call: a parameter or the close */
    ST_XML_VALUE, /* an XML parameter's value */
    ST_H_HEADER,  /* harmony message header */
    ST_PY,        /* a Python-style call read whole (pre-commit) */
};

/* block sub-kinds */
enum {
    SUB_NONE = 0,
    SUB_JSON,  /* JSON call objects */
    SUB_XML,   /* XML parameters (tc_xml) */
    SUB_GLM,   /* GLM arg_key/arg_value */
    SUB_NAMED, /* Mistral name[ARGS]{json} */
    SUB_R1,    /* DeepSeek R1 / V3: ```json fenced arguments */
    SUB_V31,   /* DeepSeek V3.1 / Kimi / functionary / harmony: JSON then an end marker */
    SUB_PY,    /* Python-style calls: LFM2 [f(a=1), g()], Llama f.call(q="x") */
    SUB_GEMMA, /* Gemma 4 call:name{k:v} */
};

/* parameter value types (from the tool's JSON schema) */
enum { PT_ANY = 0, PT_STRING, PT_NUMBER, PT_INTEGER, PT_BOOL, PT_NULL, PT_OBJECT, PT_ARRAY, PT_JSON };

typedef struct tc_call {
    char id[TOOLCALL_ID_CAP];
    char *name; /* base_strdup */
    tc_buf args;
    size_t args_ev; /* bytes of args delivered as events */
    const char *error;
} tc_call;

struct toolcall_parser {
    toolcall_options o;
    char idpre[40];
    const tc_spec *sp;
    size_t max_held;
    char err[BASE_ERR_CAP];
    keel_status failed; /* sticky: KEEL_ENOMEM or an id_fn status */
    bool finished;

    tc_buf in; /* unconsumed input is in.p[pos..in.len) */
    size_t pos;

    tc_buf content, reasoning;
    size_t content_ev, reasoning_ev; /* bytes delivered as events */
    int last_stream;                 /* 0 content, 1 reasoning, 2 args of the open call, -1 */
    tc_call *calls;
    int32_t n_calls, cap_calls;
    int32_t n_malformed;
    char *errmsg;
    toolcall_call *views;

    /* machine */
    int st;
    bool reasoning_mode;
    bool skip_ws;
    bool seen_content, seen_reasoning; /* a non-whitespace text byte was classified */
    bool reason_done;
    bool llama_start_done;
    int blk, sub;
    bool blk_has_call, blk_array;
    const char *blk_close; /* close marker of the current block, or NULL */
    size_t mark_end;       /* in[pos..pos+mark_end) is whitespace + the block marker */
    int32_t call;          /* open call or -1 */
    /* arguments */
    json_scan scan;
    bool args_started, args_string;
    json_scan inner;
    bool inner_bad, inner_done, args_any;
    uint8_t esc[12];
    int esc_n;
    /* ST_OBJ, ST_PY */
    size_t obj_off, obj_len;
    tc_py_scan py;
    tc_gemma_scan gemma;
    /* XML */
    const tc_xml *xml;
    char pname[TOOLCALL_NAME_CAP];
    int ptype;
    bool p_first, v_stream, v_start, v_nl;
    size_t v_scanned;
};

/* ---- small helpers -------------------------------------------------------------- */

static size_t utf8_cut(const char *s, size_t n)
{
    /* Largest m <= n with s[m..n) an incomplete UTF-8 sequence (or n). */
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        uint8_t c = (uint8_t)s[n - back];
        if ((c & 0xC0) == 0x80) continue; /* continuation */
        size_t need = c >= 0xF0 && c < 0xF8 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return need > back ? n - back : n;
    }
    return n;
}

static keel_status fail_nomem(toolcall_parser *p, keel_status st)
{
    if (st == KEEL_OK) return st;
    p->failed = st;
    if (st == KEEL_ENOMEM || st == KEEL_EOVERFLOW)
        base_err(p->err, st, "tool-call parser: out of memory");
    return st;
}

static void deliver(toolcall_parser *p, toolcall_event_kind k, int32_t idx, const char *s, size_t n)
{
    if (!p->o.on_event || n == 0) return;
    toolcall_event ev = {.kind = k, .index = idx, .text = s, .len = n};
    p->o.on_event(p->o.event_user, &ev);
}

/* Delivers what stream `which` has not delivered yet (all of it, or up to
 * an incomplete UTF-8 tail). */
static void flush_stream(toolcall_parser *p, int which, bool all)
{
    tc_buf *b;
    size_t *ev;
    toolcall_event_kind k;
    int32_t idx = -1;
    if (which == 0) {
        b = &p->content, ev = &p->content_ev, k = TOOLCALL_EV_CONTENT;
    } else if (which == 1) {
        b = &p->reasoning, ev = &p->reasoning_ev, k = TOOLCALL_EV_REASONING;
    } else if (which == 2 && p->call >= 0) {
        b = &p->calls[p->call].args, ev = &p->calls[p->call].args_ev, k = TOOLCALL_EV_CALL_ARGS;
        idx = p->call;
    } else {
        return;
    }
    size_t end = all ? b->len : *ev + utf8_cut(b->p + *ev, b->len - *ev);
    if (end > *ev) deliver(p, k, idx, b->p + *ev, end - *ev);
    *ev = end;
}

static void switch_stream(toolcall_parser *p, int which)
{
    if (p->last_stream != which && p->last_stream >= 0) flush_stream(p, p->last_stream, true);
    p->last_stream = which;
}

static keel_status out_text(toolcall_parser *p, bool reasoning, const char *s, size_t n)
{
    if (n == 0) return KEEL_OK;
    int which = reasoning ? 1 : 0;
    switch_stream(p, which);
    keel_status st = tc_buf_append(reasoning ? &p->reasoning : &p->content, s, n);
    if (st) return fail_nomem(p, st);
    flush_stream(p, which, false);
    return KEEL_OK;
}

static keel_status out_args(toolcall_parser *p, const char *s, size_t n)
{
    if (n == 0 || p->call < 0) return KEEL_OK;
    switch_stream(p, 2);
    keel_status st = tc_buf_append(&p->calls[p->call].args, s, n);
    if (st) return fail_nomem(p, st);
    flush_stream(p, 2, false);
    return KEEL_OK;
}

static keel_status out_args_str(toolcall_parser *p, const char *s)
{
    return out_args(p, s, strlen(s));
}

static keel_status out_args_escaped(toolcall_parser *p, const char *s, size_t n)
{
    if (n == 0 || p->call < 0) return KEEL_OK;
    switch_stream(p, 2);
    keel_status st = tc_buf_append_escaped(&p->calls[p->call].args, s, n);
    if (st) return fail_nomem(p, st);
    flush_stream(p, 2, false);
    return KEEL_OK;
}

static const char *cur(const toolcall_parser *p)
{
    return p->in.p ? p->in.p + p->pos : "";
}

static size_t avail(const toolcall_parser *p)
{
    return p->in.len - p->pos;
}

static const char g_err_strjson[] = "the arguments string does not hold JSON";

/* Whether t[0..n) is exactly one JSON value (whitespace around allowed). */
static bool json_whole(const char *t, size_t n)
{
    size_t i = 0;
    return n > 0 && tc_json_skip(t, n, &i, true) == TC_OK && tc_skip_ws(t, n, i) == n;
}

/* ---- tools ------------------------------------------------------------------------ */

/* The tool entry named name: its function object (OpenAI) or itself. */
static const json_t *tool_find(const toolcall_parser *p, const char *name)
{
    size_t i;
    json_t *t;
    json_array_foreach(p->o.tools, i, t)
    {
        const json_t *f = json_object_get(t, "function");
        if (!json_is_object(f)) f = t;
        const char *n = json_string_value(json_object_get(f, "name"));
        if (n && strcmp(n, name) == 0) return f;
    }
    return NULL;
}

static bool tool_known(const toolcall_parser *p, const char *name)
{
    return !p->o.tools || tool_find(p, name) != NULL;
}

static int type_of_name(const char *t)
{
    static const struct {
        const char *n;
        int t;
    } map[] = {{"string", PT_STRING}, {"number", PT_NUMBER}, {"integer", PT_INTEGER},
               {"boolean", PT_BOOL},  {"null", PT_NULL},     {"object", PT_OBJECT},
               {"array", PT_ARRAY}};
    for (size_t i = 0; t && i < BASE_ARRAY_LEN(map); i++)
        if (strcmp(t, map[i].n) == 0) return map[i].t;
    return PT_ANY;
}

/* The type a JSON schema gives: "type" as a string or a list (first that
 * is not "null"), else the first anyOf/oneOf alternative with a type. */
static int schema_type(const json_t *sch)
{
    for (int round = 0; round < 2 && json_is_object(sch); round++) {
        const json_t *t = json_object_get(sch, "type");
        if (json_is_string(t)) return type_of_name(json_string_value(t));
        if (json_is_array(t)) {
            size_t i;
            json_t *e;
            int first = PT_ANY;
            json_array_foreach(t, i, e)
            {
                int k = type_of_name(json_string_value(e));
                if (k != PT_NULL && k != PT_ANY) return k;
                if (first == PT_ANY) first = k;
            }
            return first;
        }
        const json_t *alt = json_object_get(sch, "anyOf");
        if (!json_is_array(alt)) alt = json_object_get(sch, "oneOf");
        sch = json_array_get(alt, 0);
    }
    return PT_ANY;
}

static int param_type(const toolcall_parser *p, const char *fname, const char *pname)
{
    if (!p->o.tools || !fname) return PT_ANY;
    const json_t *f = tool_find(p, fname);
    const json_t *sch = json_object_get(f, "parameters");
    if (!sch) sch = json_object_get(f, "input_schema");
    return schema_type(json_object_get(json_object_get(sch, "properties"), pname));
}

/* ---- calls ---------------------------------------------------------------------------- */

static void default_id(const toolcall_parser *p, int32_t index, char *buf)
{
    static const char a62[] = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    bool mistral = p->o.format == TOOLCALL_FORMAT_MISTRAL && !p->o.id_prefix;
    size_t k = 0;
    if (!mistral) {
        size_t n = strlen(p->idpre);
        memcpy(buf, p->idpre, n);
        k = n;
    }
    int chars = mistral ? 9 : 24;
    uint64_t h = 0;
    for (int c = 0; c < chars; c++) {
        if (c % 10 == 0) {
            uint64_t key[2] = {(uint64_t)(uint32_t)index, (uint64_t)c};
            h = base_hash64(key, sizeof key, p->o.id_seed ^ 0x6b65656c746f6f6cull);
        }
        buf[k++] = a62[h % 62];
        h /= 62;
    }
    buf[k] = '\0';
}

static keel_status start_call(toolcall_parser *p, const char *name)
{
    keel_status st = KEEL_OK;
    if (p->n_calls == p->cap_calls) {
        int32_t cap = p->cap_calls ? p->cap_calls * 2 : 4;
        size_t old_bytes, new_bytes;
        if (!size_mul((size_t)p->cap_calls, sizeof *p->calls, &old_bytes) ||
            !size_mul((size_t)cap, sizeof *p->calls, &new_bytes))
            return fail_nomem(p, KEEL_EOVERFLOW);
        tc_call *c = base_realloc(p->calls, old_bytes, new_bytes);
        if (!c) return fail_nomem(p, KEEL_ENOMEM);
        p->calls = c;
        p->cap_calls = cap;
    }
    tc_call *c = &p->calls[p->n_calls];
    memset(c, 0, sizeof *c);
    c->name = base_strdup(name);
    if (!c->name) return fail_nomem(p, KEEL_ENOMEM);
    int32_t idx = p->n_calls;
    if (p->o.id_fn) {
        st = p->o.id_fn(p->o.id_user, p->o.format, idx, c->id, sizeof c->id);
        c->id[sizeof c->id - 1] = '\0';
        if (st) {
            base_strfree(c->name);
            base_err(p->err, st, "tool call %d: the id callback failed", (int)idx + 1);
            p->failed = st;
            return st;
        }
    } else {
        default_id(p, idx, c->id);
    }
    p->n_calls++;
    p->call = idx;
    p->blk_has_call = true;
    if (p->reasoning_mode) { /* a call ends unclosed reasoning (Qwen3.5 and others do this) */
        p->reasoning_mode = false;
        p->reason_done = true;
    }
    switch_stream(p, -1);
    p->last_stream = -1;
    if (p->o.on_event) {
        toolcall_event ev = {.kind = TOOLCALL_EV_CALL_BEGIN, .index = idx, .id = c->id, .name = c->name};
        p->o.on_event(p->o.event_user, &ev);
    }
    p->p_first = true;
    return st;
}

static void set_error(toolcall_parser *p, const char *why)
{
    if (p->call >= 0 && !p->calls[p->call].error) p->calls[p->call].error = why;
}

static keel_status end_call(toolcall_parser *p, const char *why)
{
    if (p->call < 0) return KEEL_OK;
    tc_call *c = &p->calls[p->call];
    keel_status st = KEEL_OK;
    if (c->args.len == 0) st = out_args_str(p, "{}");
    if (st) return st;
    if (why) set_error(p, why);
    flush_stream(p, 2, true);
    p->last_stream = -1;
    if (c->error) {
        p->n_malformed++;
        if (!p->errmsg) {
            char m[BASE_ERR_CAP + TOOLCALL_NAME_CAP];
            snprintf(m, sizeof m, "tool call %d (%s): %s", (int)p->call + 1, c->name, c->error);
            p->errmsg = base_strdup(m);
            if (!p->errmsg) return fail_nomem(p, KEEL_ENOMEM);
        }
    }
    if (p->o.on_event) {
        toolcall_event ev = {.kind = TOOLCALL_EV_CALL_END, .index = p->call, .error = c->error};
        p->o.on_event(p->o.event_user, &ev);
    }
    p->call = -1;
    return KEEL_OK;
}

/* ---- text ------------------------------------------------------------------------------- */

static keel_status emit_text(toolcall_parser *p, size_t n)
{
    keel_status st = out_text(p, p->reasoning_mode, cur(p), n);
    p->pos += n;
    return st;
}

static bool marker_active(const toolcall_parser *p, const tc_marker *m)
{
    if (m->act == TC_ACT_REASON_OPEN || m->act == TC_ACT_REASON_CLOSE) {
        if (!p->o.parse_reasoning) return false;
        if (m->act == TC_ACT_REASON_OPEN) {
            /* opens only before any content; in reasoning it is a repeat at the start */
            if (p->reasoning_mode) return !p->seen_reasoning;
            return !p->seen_content && p->n_calls == 0 && !p->reason_done;
        }
    }
    return true;
}

/* Finds the active marker at s[0..n): its index, -1 (none), -2 (a proper
 * prefix of one fills s and more input could complete it). */
static int match_marker(const toolcall_parser *p, const tc_marker *mk, const char *s, size_t n,
                        bool at_end, size_t *mlen)
{
    int best = -1;
    size_t best_len = 0;
    bool partial = false;
    for (int i = 0; mk[i].s; i++) {
        if (mk[i].s[0] != s[0] || !marker_active(p, &mk[i])) continue;
        size_t len = strlen(mk[i].s), k = len < n ? len : n;
        if (memcmp(s, mk[i].s, k) != 0) continue;
        if (k == len) {
            if (len > best_len) best = i, best_len = len;
        } else {
            partial = true;
        }
    }
    if (partial && !at_end) return -2;
    *mlen = best_len;
    return best;
}

static keel_status begin_block(toolcall_parser *p, int kind, size_t region)
{
    p->blk = kind;
    p->sub = SUB_NONE;
    p->blk_has_call = false;
    p->blk_array = false;
    p->blk_close = NULL;
    p->mark_end = region;
    p->st = ST_HDR;
    return KEEL_OK;
}

static keel_status h_text(toolcall_parser *p, bool at_end, bool *more)
{
    const tc_marker *mk = p->reasoning_mode ? p->sp->reasoning : p->sp->content;
    const char *b = cur(p);
    size_t n = avail(p), i = 0;
    bool *seen = p->reasoning_mode ? &p->seen_reasoning : &p->seen_content;
    if (p->skip_ws) {
        while (i < n && tc_is_ws((uint8_t)b[i]))
            i++;
        p->pos += i;
        if (i == n) {
            *more = !at_end;
            return KEEL_OK;
        }
        p->skip_ws = false;
        return KEEL_OK;
    }
    bool run = false;
    size_t ws_start = 0;
    for (; i < n; i++) {
        uint8_t c = (uint8_t)b[i];
        bool llama = c == '{' && p->sp->llama_start && !p->reasoning_mode && !p->seen_content &&
                     p->n_calls == 0 && !p->llama_start_done;
        size_t mlen = 0;
        int m = -1;
        if (!llama) m = match_marker(p, mk, b + i, n - i, at_end, &mlen);
        if (llama || m >= 0) {
            size_t text_end = run ? ws_start : i;
            keel_status st = emit_text(p, text_end);
            if (st) return st;
            size_t region = i + mlen - text_end;
            if (llama) return begin_block(p, TC_BLK_LLAMA, region);
            const tc_marker *hit = &mk[m];
            switch (hit->act) {
            case TC_ACT_REASON_OPEN:
                p->pos += region;
                p->reasoning_mode = true;
                p->skip_ws = true;
                return KEEL_OK;
            case TC_ACT_REASON_CLOSE:
                p->pos += region;
                p->reasoning_mode = false;
                p->reason_done = true;
                p->skip_ws = true;
                return KEEL_OK;
            case TC_ACT_DROP:
                p->pos += region;
                p->skip_ws = true;
                return KEEL_OK;
            case TC_ACT_BLOCK:
                return begin_block(p, hit->arg, region);
            case TC_ACT_H_END:
                p->pos += region;
                p->reasoning_mode = false;
                p->st = ST_H_HEADER;
                return KEEL_OK;
            case TC_ACT_H_START:
            default:
                /* the header parse reads the marker itself */
                p->pos += region - mlen;
                p->reasoning_mode = false;
                p->st = ST_H_HEADER;
                return KEEL_OK;
            }
        }
        if (m == -2) {
            keel_status st = emit_text(p, run ? ws_start : i);
            *more = true;
            return st;
        }
        if (tc_is_ws(c)) {
            if (!run) {
                run = true;
                ws_start = i;
            } else if (i + 1 - ws_start >= WS_CAP) {
                run = false; /* too long to hold: plain text */
            }
        } else {
            run = false;
            *seen = true;
        }
    }
    keel_status st = emit_text(p, at_end || !run ? n : ws_start);
    *more = !at_end;
    return st;
}

/* ---- headers --------------------------------------------------------------------------- */

typedef enum { H_CALL = 1, H_FALLBACK, H_END_BLOCK, H_PY } hdr_kind;

typedef struct hdr {
    hdr_kind kind;
    size_t used; /* header bytes consumed; H_FALLBACK: offset of the object's '{' */
    char name[TOOLCALL_NAME_CAP];
    int next; /* state after commit */
    int sub;
} hdr;

static bool key_in(const char *k, const char *const *set)
{
    for (; *set; set++)
        if (strcmp(k, *set) == 0) return true;
    return false;
}

static const char *const g_name_keys[] = {"name", "tool_name", NULL};
static const char *const g_args_keys[] = {"arguments", "parameters", NULL};

/* A JSON call object starting at s[i] == '{': its name, then the start of
 * its arguments value (H_CALL), or H_FALLBACK when the object must be read
 * whole (arguments before the name, nested "function", no arguments). */
static tc_pr hdr_json_obj(const char *s, size_t n, size_t i, bool at_end, hdr *h)
{
    size_t j = i + 1;
    bool have_name = false;
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
        if (key_in(key, g_args_keys)) {
            if (!have_name) break;
            h->kind = H_CALL;
            h->used = j;
            h->next = ST_ARGS;
            h->sub = SUB_JSON;
            return TC_OK;
        }
        if (key_in(key, g_name_keys) && !have_name) {
            size_t nlen;
            if (s[j] != '"') return TC_FAIL;
            if ((r = tc_json_string(s, n, &j, h->name, sizeof h->name, &nlen)) != TC_OK) return r;
            if (nlen == 0 || strlen(h->name) != nlen) return TC_FAIL;
            have_name = true;
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
        return hdr_json_obj(s, n, j, at_end, h);
    }
    if (j >= n) return at_end ? hdr_end_block(j, h) : TC_MORE;
    if (p->blk_array) {
        if (s[j] == ',') {
            j = tc_skip_ws(s, n, j + 1);
            if (j >= n) return at_end ? TC_FAIL : TC_MORE;
            if (p->sub == SUB_PY && py_start(s[j])) return hdr_py(j, h);
            if (s[j] != '{') return TC_FAIL;
            return hdr_json_obj(s, n, j, at_end, h);
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
        if (s[k] == '{') return hdr_json_obj(s, n, k, at_end, h);
        return hdr_end_block(j, h);
    }
    if (s[j] == '{') return hdr_json_obj(s, n, j, at_end, h);
    size_t k = j;
    tc_pr r = opt_lit(s, n, &k, p->blk_close);
    if (r == TC_MORE && !at_end) return TC_MORE;
    return hdr_end_block(r == TC_OK ? k : j, h);
}

/* Reads a name at s[*j] up to (not including) the first byte in `stops`;
 * no control bytes; trimmed; 1..TOOLCALL_NAME_CAP-1 bytes. */
static tc_pr read_name(const char *s, size_t n, size_t *j, const char *stops, char *out)
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
static tc_pr hdr_xml_name(const tc_xml *x, const char *s, size_t n, size_t j, hdr *h, int sub)
{
    char quote = x->param_name_end == '"' ? '"' : '>';
    tc_pr r = read_name(s, n, &j, quote == '"' ? "\"\n<>" : ">\n<", h->name);
    if (r != TC_OK) return r;
    if (s[j] != quote) return TC_FAIL;
    j++;
    if (quote == '"') { /* attributes up to '>' */
        while (j < n && s[j] != '>') {
            if (s[j] == '<' || s[j] == '\n' || j > HDR_CAP) return TC_FAIL;
            j++;
        }
        if (j >= n) return TC_MORE;
        j++;
    }
    return hdr_call(h, j, ST_XML_PARAMS, sub);
}

static tc_pr hdr_tagged(toolcall_parser *p, const char *s, size_t n, bool at_end, hdr *h)
{
    size_t j = tc_skip_ws(s, n, 0);
    if (p->blk_has_call) {
        if (p->sub == SUB_JSON) return hdr_json_block(p, s, n, at_end, h);
        /* after </function>: </tool_call>, another <function=, or the end */
        if (j >= n) return at_end ? hdr_end_block(j, h) : TC_MORE;
        size_t k = j;
        tc_pr r = tc_lit(s, n, &k, "</tool_call>");
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
        p->blk_close = "</tool_call>";
        p->sub = SUB_JSON;
        return hdr_json_block(p, s, n, at_end, h);
    }
    size_t k = j;
    tc_pr r = tc_lit(s, n, &k, p->sp->xml->invoke_open);
    if (r == TC_MORE) return at_end ? TC_FAIL : TC_MORE;
    if (r == TC_OK) return hdr_xml_name(p->sp->xml, s, n, k, h, SUB_XML);
    if (!p->sp->glm) return TC_FAIL;
    /* GLM: name, then <arg_key> or </tool_call> */
    r = read_name(s, n, &j, "<\n{\"", h->name);
    if (r != TC_OK) return r == TC_MORE && at_end ? TC_FAIL : r;
    j = tc_skip_ws(s, n, j);
    k = j;
    r = tc_lit(s, n, &k, "<arg_key>");
    if (r == TC_FAIL) {
        k = j;
        r = tc_lit(s, n, &k, "</tool_call>");
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
    tc_pr r = read_name(s, n, &j, "[{\n", h->name);
    if (r != TC_OK) return r == TC_MORE && at_end ? TC_FAIL : r;
    if (s[j] != '[') return TC_FAIL;
    size_t k = j;
    r = tc_lit(s, n, &k, "[CALL_ID]");
    if (r == TC_MORE) return at_end ? TC_FAIL : TC_MORE;
    if (r == TC_OK) {
        char id[TOOLCALL_NAME_CAP];
        j = k;
        r = read_name(s, n, &j, "[\n", id);
        if (r != TC_OK) return r == TC_MORE && at_end ? TC_FAIL : r;
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
            r = read_name(s, n, &k, "\n`{<", h->name);
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
    /* functions.NAME:INDEX */
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
    tc_pr r = read_name(s, n, &j, ">\n<{", h->name);
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

static tc_pr parse_header(toolcall_parser *p, const char *s, size_t n, bool at_end, hdr *h)
{
    switch (p->blk) {
    case TC_BLK_GEMMA: return hdr_gemma(p, s, n, at_end, h);
    case TC_BLK_JSON:
    case TC_BLK_LLAMA:
        if (!p->blk_has_call) p->sub = SUB_JSON;
        if (p->blk == TC_BLK_JSON) p->blk_close = p->sp->json_close;
        return hdr_json_block(p, s, n, at_end, h);
    case TC_BLK_TAGGED: return hdr_tagged(p, s, n, at_end, h);
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
static keel_status block_fail(toolcall_parser *p)
{
    keel_status st = KEEL_OK;
    if (!p->blk_has_call && p->mark_end) {
        const char *b = cur(p);
        for (size_t i = 0; i < p->mark_end; i++)
            if (!tc_is_ws((uint8_t)b[i])) {
                if (p->reasoning_mode)
                    p->seen_reasoning = true;
                else
                    p->seen_content = true;
            }
        st = emit_text(p, p->mark_end);
    }
    if (p->blk == TC_BLK_LLAMA) p->llama_start_done = true;
    p->mark_end = 0;
    p->blk = TC_BLK_NONE;
    p->st = ST_TEXT;
    p->skip_ws = false;
    return st;
}

static void block_done(toolcall_parser *p)
{
    p->blk = TC_BLK_NONE;
    p->mark_end = 0;
    p->st = ST_TEXT;
    p->skip_ws = true;
}

static void args_begin(toolcall_parser *p)
{
    json_scan_init(&p->scan);
    p->args_started = false;
    p->args_string = false;
    p->args_any = false;
    p->inner_bad = p->inner_done = false;
    p->esc_n = 0;
}

/* Names are 1..TOOLCALL_NAME_CAP-1 bytes without control bytes. */
static bool name_ok(const char *s, size_t n)
{
    if (n == 0 || n >= TOOLCALL_NAME_CAP) return false;
    for (size_t i = 0; i < n; i++)
        if ((uint8_t)s[i] <= 0x20 || s[i] == 0x7f || strchr("\"'<>{}[]`", s[i])) return false;
    return true;
}

static keel_status commit(toolcall_parser *p, const hdr *h, size_t consumed)
{
    p->pos += consumed;
    p->mark_end = 0;
    p->sub = h->sub;
    keel_status st = start_call(p, h->name);
    if (st) return st;
    p->st = h->next;
    if (h->next == ST_ARGS) args_begin(p);
    if (h->next == ST_XML_PARAMS) p->xml = h->sub == SUB_GLM ? p->sp->glm : p->sp->xml;
    return KEEL_OK;
}

static keel_status h_hdr(toolcall_parser *p, bool at_end, bool *more)
{
    const char *s = cur(p) + p->mark_end;
    size_t n = avail(p) - p->mark_end;
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
    if (r == TC_FAIL) return block_fail(p);
    if (h.kind == H_END_BLOCK) {
        if (!p->blk_has_call) return block_fail(p);
        p->pos += p->mark_end + h.used;
        block_done(p);
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
    if (!name_ok(h.name, strlen(h.name)) || !tool_known(p, h.name)) return block_fail(p);
    return commit(p, &h, p->mark_end + h.used);
}

/* What follows a call's end in its block. */
static void block_next(toolcall_parser *p)
{
    switch (p->blk) {
    case TC_BLK_FUNC:
    case TC_BLK_GEMMA: block_done(p); return;
    case TC_BLK_HARMONY:
        p->blk = TC_BLK_NONE;
        p->st = ST_H_HEADER;
        return;
    case TC_BLK_MISTRAL:
        if (p->sub == SUB_NAMED) {
            block_done(p);
            return;
        }
        break;
    case TC_BLK_TAGGED:
        if (p->sub == SUB_GLM) {
            block_done(p);
            return;
        }
        break;
    case TC_BLK_XML:
        if (!p->sp->xml->invoke_open) {
            block_done(p);
            return;
        }
        break;
    default: break;
    }
    p->st = ST_HDR;
    p->mark_end = 0;
}

/* ---- JSON call object read whole (ST_OBJ) ------------------------------------------- */

/* The name and the arguments' span of a JSON call object s[0..n) that the
 * scanner has validated; looks one level into a "function" member. */
static bool obj_fields(const char *s, size_t n, char *name, size_t *as, size_t *ae, int depth)
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
            if (!name_ok(name, nl)) return false;
            have_name = true;
        } else if (key_in(key, g_args_keys) && *ae == 0) {
            *as = vs;
            *ae = j;
        } else if (strcmp(key, "function") == 0 && s[vs] == '{' && depth == 0 && !have_name) {
            size_t fs = 0, fe = 0;
            if (obj_fields(s + vs, j - vs, name, &fs, &fe, 1)) {
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
    if (!obj_fields(s, n, h.name, &as, &ae, 0) || !tool_known(p, h.name)) return block_fail(p);
    if (ae == 0 && p->blk == TC_BLK_LLAMA) return block_fail(p); /* a bare JSON answer, not a call */
    p->pos += p->obj_off + n;
    p->mark_end = 0;
    keel_status st = commit(p, &h, 0);
    if (st) return st;
    const char *why = NULL;
    if (ae > as && s[as] == '"') { /* a string holding the JSON */
        size_t cap = ae - as, dl;
        char *d = base_alloc(cap);
        if (!d) return fail_nomem(p, KEEL_ENOMEM);
        size_t q = as;
        if (tc_json_string(s, ae, &q, d, cap, &dl) == TC_OK) {
            st = out_args(p, d, dl);
            if (dl && !json_whole(d, dl)) why = g_err_strjson;
        } else {
            st = out_args(p, s + as, ae - as);
            why = g_err_strjson;
        }
        base_free(d, cap);
    } else if (ae > as && !(ae - as == 4 && memcmp(s + as, "null", 4) == 0)) {
        st = out_args(p, s + as, ae - as);
    }
    if (st == KEEL_OK) st = end_call(p, why);
    if (st == KEEL_OK) block_next(p);
    return st;
}

static keel_status h_obj(toolcall_parser *p, bool at_end, bool *more)
{
    const char *s = cur(p) + p->obj_off;
    size_t n = avail(p) - p->obj_off;
    while (p->obj_len < n) {
        if (p->obj_len >= p->max_held) return block_fail(p);
        js_result r = json_scan_byte(&p->scan, (uint8_t)s[p->obj_len]);
        if (r != JS_R_CONT && r != JS_R_DONE) return block_fail(p);
        p->obj_len++;
        if (r == JS_R_DONE) return obj_commit(p, s, p->obj_len);
    }
    if (at_end) return block_fail(p);
    *more = true;
    return KEEL_OK;
}

/* A Python-style call, read whole, then committed as one (ST_PY). */
static keel_status h_py(toolcall_parser *p, bool at_end, bool *more)
{
    const char *s = cur(p) + p->obj_off;
    size_t n = avail(p) - p->obj_off;
    while (p->obj_len < n) {
        if (p->obj_len >= p->max_held) return block_fail(p);
        bool gemma = p->sub == SUB_GEMMA;
        uint8_t c = (uint8_t)s[p->obj_len];
        tc_pr r = gemma ? tc_gemma_scan_byte(&p->gemma, c) : tc_py_scan_byte(&p->py, c);
        if (r == TC_FAIL) return block_fail(p);
        p->obj_len++;
        if (r == TC_MORE) continue;
        hdr h = {.kind = H_CALL, .next = gemma ? ST_CALLEND : ST_HDR, .sub = p->sub};
        tc_buf json = {0};
        bool ok;
        keel_status st = gemma ? tc_gemma_call(s, p->obj_len, h.name, &json, &ok)
                               : tc_py_call(s, p->obj_len, h.name, &json, &ok);
        if (st == KEEL_OK && (!ok || !name_ok(h.name, strlen(h.name)) || !tool_known(p, h.name))) {
            tc_buf_free(&json);
            return block_fail(p);
        }
        if (st == KEEL_OK) {
            p->pos += p->obj_off + p->obj_len;
            p->mark_end = 0;
            st = commit(p, &h, 0);
        }
        if (st == KEEL_OK) st = out_args(p, json.p, json.len);
        tc_buf_free(&json);
        if (st == KEEL_OK && gemma) return KEEL_OK; /* <tool_call|> next */
        if (st == KEEL_OK) st = end_call(p, NULL);
        if (st == KEEL_OK) block_next(p);
        return st ? fail_nomem(p, st) : st;
    }
    if (at_end) return block_fail(p);
    *more = true;
    return KEEL_OK;
}

/* ---- arguments -------------------------------------------------------------------------- */

static const char g_err_json[] = "the arguments are not valid JSON";
static const char g_err_cut[] = "the output ended inside the arguments";

typedef struct dec_out {
    char b[256];
    size_t n;
} dec_out;

static void inner_check(toolcall_parser *p, uint8_t c)
{
    if (p->inner_bad) return;
    if (p->inner_done) {
        if (!tc_is_ws(c)) p->inner_bad = true;
        return;
    }
    js_result r = json_scan_byte(&p->inner, c);
    if (r == JS_R_BAD) p->inner_bad = true;
    if (r == JS_R_DONE) p->inner_done = true;
    if (r == JS_R_DONE_BEFORE) {
        p->inner_done = true;
        if (!tc_is_ws(c)) p->inner_bad = true;
    }
}

static keel_status dec_put(toolcall_parser *p, dec_out *o, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (o->n == sizeof o->b) {
            keel_status st = out_args(p, o->b, o->n);
            if (st) return st;
            o->n = 0;
        }
        inner_check(p, (uint8_t)s[i]);
        o->b[o->n++] = s[i];
        p->args_any = true;
    }
    return KEEL_OK;
}

static keel_status dec_cp(toolcall_parser *p, dec_out *o, uint32_t cp)
{
    char u[4];
    size_t k;
    if (cp < 0x80) {
        u[0] = (char)cp, k = 1;
    } else if (cp < 0x800) {
        u[0] = (char)(0xC0 | (cp >> 6)), u[1] = (char)(0x80 | (cp & 0x3F)), k = 2;
    } else if (cp < 0x10000) {
        u[0] = (char)(0xE0 | (cp >> 12)), u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[2] = (char)(0x80 | (cp & 0x3F)), k = 3;
    } else {
        u[0] = (char)(0xF0 | (cp >> 18)), u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3F)), u[3] = (char)(0x80 | (cp & 0x3F)), k = 4;
    }
    return dec_put(p, o, u, k);
}

static uint32_t hex_at(const uint8_t *h)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        uint8_t c = h[i];
        v = v * 16 + (uint32_t)(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
    }
    return v;
}

/* One byte of a JSON string's body (the scanner has validated it). */
static keel_status dec_byte(toolcall_parser *p, dec_out *o, uint8_t c)
{
    static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
    if (p->esc_n == 0) {
        if (c == '\\') {
            p->esc[0] = c;
            p->esc_n = 1;
            return KEEL_OK;
        }
        char ch = (char)c;
        return dec_put(p, o, &ch, 1);
    }
    p->esc[p->esc_n++] = c;
    if (p->esc_n == 2) {
        if (c == 'u') return KEEL_OK;
        const char *f = strchr(from, c);
        p->esc_n = 0;
        char ch = f ? to[f - from] : (char)c;
        return dec_put(p, o, &ch, 1);
    }
    if (p->esc_n < 6) return KEEL_OK;
    if (p->esc_n == 6) {
        uint32_t cp = hex_at(p->esc + 2);
        if (cp >= 0xD800 && cp < 0xDC00) return KEEL_OK; /* wait for the low half */
        p->esc_n = 0;
        return dec_cp(p, o, cp >= 0xDC00 && cp < 0xE000 ? 0xFFFD : cp);
    }
    if (p->esc_n == 7 && c != '\\') {
        p->esc_n = 0;
        keel_status st = dec_cp(p, o, 0xFFFD);
        return st ? st : dec_byte(p, o, c);
    }
    if (p->esc_n == 8 && c != 'u') {
        p->esc_n = 0;
        keel_status st = dec_cp(p, o, 0xFFFD);
        if (st) return st;
        st = dec_byte(p, o, '\\');
        return st ? st : dec_byte(p, o, c);
    }
    if (p->esc_n < 12) return KEEL_OK;
    uint32_t hi = hex_at(p->esc + 2), lo = hex_at(p->esc + 8);
    if (lo >= 0xDC00 && lo < 0xE000) {
        p->esc_n = 0;
        return dec_cp(p, o, 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00));
    }
    /* the second escape stands alone: re-run it */
    keel_status st = dec_cp(p, o, 0xFFFD);
    if (st) return st;
    memmove(p->esc, p->esc + 6, 6);
    p->esc_n = 5;
    return dec_byte(p, o, p->esc[5]);
}

static keel_status args_done(toolcall_parser *p)
{
    keel_status st = KEEL_OK;
    if (p->args_string) {
        if (p->esc_n) {
            dec_out o = {.n = 0};
            p->esc_n = 0;
            st = dec_cp(p, &o, 0xFFFD);
            if (st == KEEL_OK) st = out_args(p, o.b, o.n);
            if (st) return st;
        }
        bool ok = p->inner_done || json_scan_end(&p->inner) == JS_R_DONE;
        if (p->args_any && (p->inner_bad || !ok)) set_error(p, g_err_strjson);
    }
    switch (p->sub) {
    case SUB_JSON:
        p->st = ST_TRAILER;
        json_scan_init_after_member(&p->scan);
        return KEEL_OK;
    case SUB_NAMED:
        st = end_call(p, NULL);
        if (st == KEEL_OK) block_next(p);
        return st;
    default: p->st = ST_CALLEND; return KEEL_OK;
    }
}

/* The output ended in the middle of a call. */
static keel_status call_cut(toolcall_parser *p, const char *why)
{
    keel_status st = end_call(p, why);
    p->blk = TC_BLK_NONE;
    p->mark_end = 0;
    p->st = ST_TEXT;
    return st;
}

static keel_status h_args(toolcall_parser *p, bool at_end, bool *more)
{
    const char *s = cur(p);
    size_t n = avail(p), i = 0;
    keel_status st = KEEL_OK;
    if (!p->args_started) {
        while (i < n && tc_is_ws((uint8_t)s[i]))
            i++;
        p->pos += i;
        if (i == n) {
            if (at_end) return call_cut(p, g_err_cut);
            *more = true;
            return KEEL_OK;
        }
        s += i, n -= i, i = 0;
        p->args_started = true;
        if (s[0] == '"') {
            p->args_string = true;
            json_scan_init(&p->inner);
        }
    }
    dec_out o = {.n = 0};
    size_t raw_from = 0;
    int next = 0; /* 0 continue, 1 done before s[i], 2 done with s[i], 3 bad */
    for (; i < n; i++) {
        uint8_t c = (uint8_t)s[i];
        bool in_str = json_scan_in_string(&p->scan);
        js_result r = json_scan_byte(&p->scan, c);
        if (r == JS_R_BAD) {
            next = 3;
            break;
        }
        if (r == JS_R_DONE_BEFORE) {
            next = 1;
            break;
        }
        if (p->args_string && in_str && r == JS_R_CONT) {
            st = dec_byte(p, &o, c);
            if (st) return st;
        }
        if (r == JS_R_DONE) {
            next = 2;
            break;
        }
    }
    size_t upto = next == 2 ? i + 1 : i;
    st = p->args_string ? out_args(p, o.b, o.n) : out_args(p, s + raw_from, upto - raw_from);
    if (st) return st;
    p->pos += upto;
    if (next == 1 || next == 2) return args_done(p);
    if (next == 3) {
        set_error(p, g_err_json);
        p->st = ST_ARGS_RAW;
        return KEEL_OK;
    }
    if (!at_end) {
        *more = true;
        return KEEL_OK;
    }
    if (json_scan_end(&p->scan) == JS_R_DONE) return args_done(p);
    return call_cut(p, g_err_cut);
}

/* Finds the first of `stops` (NULL-terminated, plus `extra`) in s[0..n):
 * index of the match start (n if none) and *hit (index of stops[], 99 for
 * extra, -2 for a partial match at the end, -1 none). */
static size_t find_stop(const char *const *stops, const char *extra, const char *s, size_t n,
                        bool at_end, int *hit, size_t *mlen)
{
    for (size_t i = 0; i < n; i++) {
        bool partial = false;
        for (int k = -1; k == -1 || stops[k]; k++) {
            const char *m = k < 0 ? extra : stops[k];
            if (!m || m[0] != s[i]) continue;
            size_t len = strlen(m), q = len < n - i ? len : n - i;
            if (memcmp(s + i, m, q) != 0) continue;
            if (q == len) {
                *hit = k < 0 ? 99 : k;
                *mlen = len;
                return i;
            }
            partial = true;
        }
        if (partial && !at_end) {
            *hit = -2;
            return i;
        }
    }
    *hit = -1;
    return n;
}

static keel_status h_args_raw(toolcall_parser *p, bool at_end, bool *more)
{
    const char *s = cur(p);
    size_t n = avail(p), mlen = 0;
    int hit;
    size_t k = find_stop(p->sp->raw_stops, p->blk_close, s, n, at_end, &hit, &mlen);
    keel_status st = out_args(p, s, k);
    if (st) return st;
    p->pos += k;
    if (hit == -2 || (hit == -1 && !at_end)) {
        *more = true;
        return KEEL_OK;
    }
    if (hit == -1) return call_cut(p, NULL);
    if (p->sub == SUB_JSON || p->sub == SUB_NAMED) {
        st = end_call(p, NULL);
        if (st == KEEL_OK) block_next(p);
        return st;
    }
    p->st = ST_CALLEND;
    return KEEL_OK;
}

static keel_status h_trailer(toolcall_parser *p, bool at_end, bool *more)
{
    const char *s = cur(p);
    size_t n = avail(p);
    for (size_t i = 0; i < n; i++) {
        js_result r = json_scan_byte(&p->scan, (uint8_t)s[i]);
        if (r == JS_R_BAD || r == JS_R_DONE_BEFORE) {
            p->pos += i;
            return call_cut(p, "unexpected text after the arguments");
        }
        if (r == JS_R_DONE) {
            p->pos += i + 1;
            keel_status st = end_call(p, NULL);
            if (st == KEEL_OK) block_next(p);
            return st;
        }
    }
    p->pos += n;
    if (at_end) return call_cut(p, NULL);
    *more = true;
    return KEEL_OK;
}

/* The marker after a call's arguments. */
static keel_status h_callend(toolcall_parser *p, bool at_end, bool *more)
{
    static const char *const ds[] = {"<｜tool▁call▁end｜>", NULL};
    static const char *const kimi[] = {"<|tool_call_end|>", NULL};
    static const char *const func[] = {"</function>", NULL};
    static const char *const harmony[] = {"<|call|>", "<|end|>", "<|return|>", NULL};
    static const char *const gemma[] = {"<tool_call|>", NULL};
    const char *const *ends = ds;
    if (p->blk == TC_BLK_GEMMA) ends = gemma;
    if (p->blk == TC_BLK_KIMI || p->blk == TC_BLK_KIMI1) ends = kimi;
    if (p->blk == TC_BLK_FUNC) ends = func;
    if (p->blk == TC_BLK_HARMONY) ends = harmony;
    const char *s = cur(p);
    size_t n = avail(p), j = tc_skip_ws(s, n, 0);
    tc_pr r = TC_FAIL;
    if (p->sub == SUB_R1 && j < n) {
        size_t k = j;
        r = tc_lit(s, n, &k, "```");
        if (r == TC_OK) j = tc_skip_ws(s, n, k);
        if (r == TC_MORE && !at_end) goto wait;
    }
    if (j >= n) {
        if (!at_end) goto wait;
        return call_cut(p, NULL);
    }
    for (int e = 0; ends[e]; e++) {
        size_t k = j;
        r = tc_lit(s, n, &k, ends[e]);
        if (r == TC_OK) {
            p->pos += k;
            keel_status st = end_call(p, NULL);
            if (st == KEEL_OK) block_next(p);
            return st;
        }
        if (r == TC_MORE && !at_end) goto wait;
    }
    /* no end marker: the call is complete, what follows is text */
    p->pos += j;
    if (p->blk == TC_BLK_HARMONY) {
        keel_status st = end_call(p, NULL);
        p->blk = TC_BLK_NONE;
        p->st = ST_TEXT;
        return st;
    }
    return call_cut(p, NULL);
wait:
    *more = true;
    return KEEL_OK;
}

/* ---- XML parameters ------------------------------------------------------------------ */

static const char g_err_xml[] = "unexpected text in the tool call";
static const char g_err_unclosed[] = "the tool call is not closed";
static const char g_err_value[] = "a parameter value is not closed";

static keel_status xml_close(toolcall_parser *p, const char *why)
{
    keel_status st = out_args_str(p, p->p_first ? "{}" : "}");
    return st ? st : end_call(p, why);
}

static keel_status member_prefix(toolcall_parser *p)
{
    keel_status st = out_args_str(p, p->p_first ? "{\"" : ", \"");
    if (st == KEEL_OK) st = out_args_escaped(p, p->pname, strlen(p->pname));
    if (st == KEEL_OK) st = out_args_str(p, "\": ");
    p->p_first = false;
    return st;
}

static keel_status h_xml_params(toolcall_parser *p, bool at_end, bool *more)
{
    const tc_xml *x = p->xml;
    const char *s = cur(p);
    size_t n = avail(p);
    bool capped = n >= HDR_CAP;
    size_t lim = capped ? HDR_CAP : n;
    bool end = at_end && !capped;
    size_t j = tc_skip_ws(s, lim, 0), k = j;
    tc_pr r;
    if (j >= lim) {
        if (capped) goto bad;
        if (at_end) {
            keel_status st = xml_close(p, g_err_unclosed);
            p->pos += j;
            block_done(p);
            return st;
        }
        goto wait;
    }
    r = tc_lit(s, lim, &k, x->param_open);
    if (r == TC_MORE) goto more_or_bad;
    if (r == TC_OK) {
        const char *stops = x->param_name_end == '"' ? "\"\n<>" : x->param_name_end == '>' ? ">\n<" : "<\n";
        r = read_name(s, lim, &k, stops, p->pname);
        if (r == TC_MORE) goto more_or_bad;
        if (r == TC_FAIL) goto bad;
        size_t attr = k, attr_end = k;
        if (x->param_name_end == '"' || x->param_name_end == '>') {
            if (s[k] != x->param_name_end) goto bad;
            k++;
            attr = k;
            if (x->param_name_end == '"') {
                while (k < lim && s[k] != '>') {
                    if (s[k] == '<' || s[k] == '\n') goto bad;
                    k++;
                }
                if (k >= lim) goto more_or_bad;
                attr_end = k++;
            }
        } else {
            r = tc_lit(s, lim, &k, x->param_after);
            if (r == TC_MORE) goto more_or_bad;
            if (r == TC_FAIL) goto bad;
            k = tc_skip_ws(s, lim, k);
            r = tc_lit(s, lim, &k, x->param_after2);
            if (r == TC_MORE) goto more_or_bad;
            if (r == TC_FAIL) goto bad;
        }
        p->ptype = param_type(p, p->calls[p->call].name, p->pname);
        if (x->string_attr && attr_end > attr) { /* DSML: string="true|false" */
            if (memmem(s + attr, attr_end - attr, "string=\"true\"", 13)) p->ptype = PT_STRING;
            if (memmem(s + attr, attr_end - attr, "string=\"false\"", 14)) p->ptype = PT_JSON;
        }
        p->pos += k;
        p->v_stream = x->stream_strings && p->ptype == PT_STRING;
        p->v_start = true;
        p->v_scanned = 0;
        p->st = ST_XML_VALUE;
        if (p->v_stream) {
            keel_status st = member_prefix(p);
            if (st == KEEL_OK) st = out_args_str(p, "\"");
            return st;
        }
        return KEEL_OK;
    }
    {
        const char *closes[3] = {x->invoke_close, x->block_close, x->block_close2};
        for (int c = 0; c < 3; c++) {
            if (!closes[c]) continue;
            k = j;
            r = tc_lit(s, lim, &k, closes[c]);
            if (r == TC_MORE) goto more_or_bad;
            if (r == TC_OK) {
                p->pos += k;
                keel_status st = xml_close(p, NULL);
                if (st) return st;
                if (c == 0)
                    block_next(p);
                else
                    block_done(p);
                return KEEL_OK;
            }
        }
    }
bad: {
    p->pos += j;
    keel_status st = xml_close(p, g_err_xml);
    p->blk = TC_BLK_NONE;
    p->st = ST_TEXT;
    return st;
}
more_or_bad:
    if (end || capped) goto bad;
wait:
    *more = true;
    return KEEL_OK;
}

static bool ieq(const char *t, size_t n, const char *w)
{
    return strlen(w) == n && strncasecmp(t, w, n) == 0;
}

/* A complete XML value, typed: "name": value. */
static keel_status emit_value(toolcall_parser *p, const char *v, size_t n)
{
    const tc_xml *x = p->xml;
    if (x->strip_newlines) {
        if (n && v[0] == '\n') v++, n--;
        if (n && v[n - 1] == '\n') n--;
    }
    if (x->cdata && n >= 12 && memcmp(v, "<![CDATA[", 9) == 0 && memcmp(v + n - 3, "]]>", 3) == 0)
        v += 9, n -= 12;
    size_t a = 0, e = n;
    while (a < e && tc_is_ws((uint8_t)v[a]))
        a++;
    while (e > a && tc_is_ws((uint8_t)v[e - 1]))
        e--;
    const char *t = v + a;
    size_t tn = e - a;
    const char *raw = NULL;
    size_t rawn = 0;
    switch (p->ptype) {
    case PT_NUMBER:
    case PT_INTEGER:
        if (tn && (t[0] == '-' || (t[0] >= '0' && t[0] <= '9')) && json_whole(t, tn)) raw = t, rawn = tn;
        break;
    case PT_BOOL:
        if (ieq(t, tn, "true")) raw = "true", rawn = 4;
        if (ieq(t, tn, "false")) raw = "false", rawn = 5;
        break;
    case PT_NULL:
        if (ieq(t, tn, "null") || ieq(t, tn, "none")) raw = "null", rawn = 4;
        break;
    case PT_OBJECT:
    case PT_ARRAY:
        if (tn && t[0] == (p->ptype == PT_OBJECT ? '{' : '[') && json_whole(t, tn)) raw = t, rawn = tn;
        break;
    case PT_JSON:
        if (json_whole(t, tn)) raw = t, rawn = tn;
        break;
    case PT_ANY:
        if (tn && (t[0] == '{' || t[0] == '[') && json_whole(t, tn)) raw = t, rawn = tn;
        break;
    default: break;
    }
    keel_status st = member_prefix(p);
    if (st) return st;
    if (raw) return out_args(p, raw, rawn);
    st = out_args_str(p, "\"");
    if (st == KEEL_OK) st = out_args_escaped(p, v, n);
    if (st == KEEL_OK) st = out_args_str(p, "\"");
    return st;
}

static keel_status h_xml_value(toolcall_parser *p, bool at_end, bool *more)
{
    const tc_xml *x = p->xml;
    const char *s = cur(p);
    size_t n = avail(p), mlen = strlen(x->param_close);
    keel_status st;
    if (p->v_stream) {
        if (p->v_start) {
            if (n == 0) goto eof_or_wait;
            p->v_start = false;
            if (x->strip_newlines && s[0] == '\n') {
                p->pos++;
                return KEEL_OK;
            }
        }
        char nl_close[64];
        const char *stops[3] = {x->param_close, NULL, NULL};
        if (x->strip_newlines && mlen + 2 <= sizeof nl_close) {
            nl_close[0] = '\n';
            memcpy(nl_close + 1, x->param_close, mlen + 1);
            stops[1] = nl_close;
        }
        int hit;
        size_t ml = 0, k = find_stop(stops, NULL, s, n, at_end, &hit, &ml);
        st = out_args_escaped(p, s, k);
        if (st) return st;
        p->pos += k;
        if (hit >= 0) {
            p->pos += ml;
            p->st = ST_XML_PARAMS;
            return out_args_str(p, "\"");
        }
        if (hit == -2 || !at_end) goto wait;
        st = out_args_str(p, "\"");
        if (st == KEEL_OK) st = xml_close(p, g_err_value);
        block_done(p);
        return st;
    }
    size_t w = n < p->max_held ? n : p->max_held;
    size_t from = p->v_scanned > mlen ? p->v_scanned - mlen : 0;
    for (size_t i = from; i + mlen <= w; i++) {
        if (s[i] == x->param_close[0] && memcmp(s + i, x->param_close, mlen) == 0) {
            st = emit_value(p, s, i);
            p->pos += i + mlen;
            p->st = ST_XML_PARAMS;
            return st;
        }
    }
    p->v_scanned = w;
    if (n >= p->max_held) { /* too long to hold: it streams as a string */
        p->v_stream = true;
        p->ptype = PT_STRING;
        st = member_prefix(p);
        return st ? st : out_args_str(p, "\"");
    }
    if (!at_end) goto wait;
    st = emit_value(p, s, n);
    p->pos += n;
    if (st == KEEL_OK) st = xml_close(p, g_err_value);
    block_done(p);
    return st;
eof_or_wait:
    if (at_end) {
        st = out_args_str(p, "\"");
        if (st == KEEL_OK) st = xml_close(p, g_err_value);
        block_done(p);
        return st;
    }
wait:
    *more = true;
    return KEEL_OK;
}

/* ---- harmony -------------------------------------------------------------------------------- */

/* The token after `key` in h[0..n): up to a space, '<' or the end. */
static size_t h_token(const char *h, size_t n, const char *key, const char **tok)
{
    size_t kl = strlen(key);
    for (size_t i = 0; i + kl <= n; i++) {
        if (memcmp(h + i, key, kl) != 0) continue;
        if (key[0] == 't' && i > 0 && h[i - 1] != ' ' && h[i - 1] != '>') continue;
        size_t a = i + kl, e = a;
        while (e < n && h[e] != ' ' && h[e] != '<' && !tc_is_ws((uint8_t)h[e]))
            e++;
        *tok = h + a;
        return e - a;
    }
    *tok = NULL;
    return 0;
}

static keel_status h_h_header(toolcall_parser *p, bool at_end, bool *more)
{
    static const char msg[] = "<|message|>";
    const char *s = cur(p);
    size_t n = avail(p);
    bool capped = n >= HDR_CAP;
    size_t lim = capped ? HDR_CAP : n;
    size_t j = tc_skip_ws(s, lim, 0), k = j, q;
    if (j > 0) { /* whitespace before a header is dropped */
        p->pos += j;
        return KEEL_OK;
    }
    if (n == 0) {
        if (at_end) {
            p->st = ST_TEXT;
            return KEEL_OK;
        }
        *more = true;
        return KEEL_OK;
    }
    tc_pr r = tc_lit(s, lim, &k, "<|start|>");
    if (r == TC_MORE) goto more_or_fail;
    size_t hstart = r == TC_OK ? k : j;
    for (q = hstart; q < lim; q++) {
        if (s[q] != '<') continue;
        size_t t = q;
        r = tc_lit(s, lim, &t, msg);
        if (r == TC_OK) break;
        if (r == TC_MORE) goto more_or_fail;
    }
    if (q >= lim) goto more_or_fail;
    {
        const char *h = s + hstart, *chan, *to;
        size_t hn = q - hstart, used = q + sizeof msg - 1;
        size_t cl = h_token(h, hn, "<|channel|>", &chan);
        size_t tl = h_token(h, hn, "to=", &to);
        if (to) {
            hdr hd;
            memset(&hd, 0, sizeof hd);
            if (tl > 10 && memcmp(to, "functions.", 10) == 0) to += 10, tl -= 10;
            if (!name_ok(to, tl)) goto reject;
            memcpy(hd.name, to, tl);
            hd.name[tl] = '\0';
            if (!tool_known(p, hd.name)) goto reject;
            hd.kind = H_CALL;
            hd.next = ST_ARGS;
            hd.sub = SUB_V31;
            p->blk = TC_BLK_HARMONY;
            p->reasoning_mode = false;
            return commit(p, &hd, used);
        reject:
            p->reasoning_mode = false;
            p->seen_content = true;
            keel_status st = emit_text(p, used);
            p->st = ST_TEXT;
            return st;
        }
        p->pos += used;
        p->reasoning_mode = p->o.parse_reasoning && chan && cl == 8 && memcmp(chan, "analysis", 8) == 0;
        p->st = ST_TEXT;
        p->skip_ws = false;
        return KEEL_OK;
    }
more_or_fail:
    if (!at_end && !capped) {
        *more = true;
        return KEEL_OK;
    }
    {
        /* not a header: the text is content; step over a leading marker */
        size_t e = j, t = j;
        if (tc_lit(s, lim, &t, "<|start|>") == TC_OK) e = t;
        t = j;
        if (tc_lit(s, lim, &t, "<|channel|>") == TC_OK) e = t;
        p->reasoning_mode = false;
        p->seen_content = true;
        keel_status st = emit_text(p, e);
        p->st = ST_TEXT;
        return st;
    }
}

/* ---- driver ----------------------------------------------------------------------------------- */

static keel_status step(toolcall_parser *p, bool at_end, bool *more)
{
    switch (p->st) {
    case ST_TEXT: return h_text(p, at_end, more);
    case ST_HDR: return h_hdr(p, at_end, more);
    case ST_OBJ: return h_obj(p, at_end, more);
    case ST_ARGS: return h_args(p, at_end, more);
    case ST_ARGS_RAW: return h_args_raw(p, at_end, more);
    case ST_TRAILER: return h_trailer(p, at_end, more);
    case ST_CALLEND: return h_callend(p, at_end, more);
    case ST_XML_PARAMS: return h_xml_params(p, at_end, more);
    case ST_XML_VALUE: return h_xml_value(p, at_end, more);
    case ST_H_HEADER: return h_h_header(p, at_end, more);
    case ST_PY: return h_py(p, at_end, more);
    default: return base_err(p->err, KEEL_EINTERNAL, "tool-call parser: bad state %d", p->st);
    }
}

static keel_status run(toolcall_parser *p, bool at_end)
{
    int idle = 0;
    for (;;) {
        if (p->st == ST_TEXT && avail(p) == 0) return KEEL_OK;
        size_t pos0 = p->pos;
        int st0 = p->st;
        bool more = false;
        keel_status st = step(p, at_end, &more);
        if (st) return st;
        if (more) {
            if (!at_end) return KEEL_OK;
            p->failed = KEEL_EINTERNAL;
            return base_err(p->err, KEEL_EINTERNAL, "tool-call parser: state %d waits at the end", st0);
        }
        idle = p->pos == pos0 ? idle + 1 : 0;
        if (idle > 64) {
            p->failed = KEEL_EINTERNAL;
            return base_err(p->err, KEEL_EINTERNAL, "tool-call parser: no progress in state %d", st0);
        }
    }
}

/* ---- API ---------------------------------------------------------------------------------------- */

toolcall_options toolcall_options_default(void)
{
    toolcall_options o;
    memset(&o, 0, sizeof o);
    o.format = TOOLCALL_FORMAT_CONTENT;
    o.parse_reasoning = true;
    return o;
}

keel_status toolcall_open(const toolcall_options *o, toolcall_parser **out, char *err)
{
    char local[BASE_ERR_CAP];
    if (!err) err = local;
    err[0] = '\0';
    if (!out) return base_err(err, KEEL_EINVAL, "toolcall_open: out is NULL");
    *out = NULL;
    if (!o) return base_err(err, KEEL_EINVAL, "toolcall_open: options are NULL");
    if ((unsigned)o->format >= TOOLCALL_FORMAT_COUNT_)
        return base_err(err, KEEL_EINVAL, "tool-call format %d is not a format", (int)o->format);
    if (o->tools && !json_is_array(o->tools))
        return base_err(err, KEEL_EINVAL, "tools: expected an array of tool definitions");
    if (o->id_prefix && strlen(o->id_prefix) > 32)
        return base_err(err, KEEL_EINVAL, "tool-call id prefix \"%.40s\" is longer than 32 bytes",
                        o->id_prefix);
    toolcall_parser *p = base_calloc(1, sizeof *p);
    if (!p) return base_err(err, KEEL_ENOMEM, "tool-call parser: out of memory");
    p->o = *o;
    snprintf(p->idpre, sizeof p->idpre, "%s", o->id_prefix ? o->id_prefix : "call_");
    p->o.id_prefix = o->id_prefix ? p->idpre : NULL;
    if (p->o.tools) json_incref(p->o.tools);
    p->sp = tc_spec_of(o->format);
    p->max_held = o->max_held_bytes ? BASE_MAX(o->max_held_bytes, MIN_HELD) : DEFAULT_HELD;
    p->call = -1;
    p->last_stream = -1;
    p->st = p->sp->harmony ? ST_H_HEADER : ST_TEXT;
    p->reasoning_mode = o->starts_in_reasoning && o->parse_reasoning && !p->sp->harmony;
    p->skip_ws = p->reasoning_mode; /* whitespace after the prompt's opener */
    *out = p;
    return KEEL_OK;
}

void toolcall_close(toolcall_parser *p)
{
    if (!p) return;
    for (int32_t i = 0; i < p->n_calls; i++) {
        base_strfree(p->calls[i].name);
        tc_buf_free(&p->calls[i].args);
    }
    base_free(p->calls, (size_t)p->cap_calls * sizeof *p->calls);
    base_free(p->views, (size_t)p->n_calls * sizeof *p->views);
    base_strfree(p->errmsg);
    tc_buf_free(&p->in);
    tc_buf_free(&p->content);
    tc_buf_free(&p->reasoning);
    if (p->o.tools) json_decref(p->o.tools);
    base_free(p, sizeof *p);
}

keel_status toolcall_feed(toolcall_parser *p, const char *text, size_t n)
{
    if (!p) return KEEL_EINVAL;
    if (p->failed) return p->failed;
    if (p->finished) return base_err(p->err, KEEL_EINVAL, "toolcall_feed after toolcall_finish");
    if (n && !text) return base_err(p->err, KEEL_EINVAL, "toolcall_feed: text is NULL");
    while (n) {
        size_t k = n < FEED_STEP ? n : FEED_STEP;
        if (p->pos && p->pos >= p->in.len - p->pos) {
            memmove(p->in.p, p->in.p + p->pos, p->in.len - p->pos);
            p->in.len -= p->pos;
            p->pos = 0;
        }
        keel_status st = tc_buf_append(&p->in, text, k);
        if (st) return fail_nomem(p, st);
        text += k, n -= k;
        st = run(p, false);
        if (st) return st;
    }
    return KEEL_OK;
}

static const char g_empty[] = "";

keel_status toolcall_finish(toolcall_parser *p, toolcall_result *out)
{
    if (!p || !out) return KEEL_EINVAL;
    memset(out, 0, sizeof *out);
    if (p->failed) return p->failed;
    if (p->finished) return base_err(p->err, KEEL_EINVAL, "toolcall_finish called twice");
    keel_status st = run(p, true);
    if (st) return st;
    if (p->call >= 0) { /* cannot happen: every state closes its call at the end */
        st = end_call(p, g_err_unclosed);
        if (st) return st;
    }
    p->finished = true;
    flush_stream(p, 0, true);
    flush_stream(p, 1, true);
    if (p->n_calls) {
        p->views = base_calloc((size_t)p->n_calls, sizeof *p->views);
        if (!p->views) return fail_nomem(p, KEEL_ENOMEM);
        for (int32_t i = 0; i < p->n_calls; i++) {
            tc_call *c = &p->calls[i];
            memcpy(p->views[i].id, c->id, sizeof c->id);
            p->views[i].name = c->name;
            p->views[i].arguments = c->args.p ? c->args.p : g_empty;
            p->views[i].arguments_len = c->args.len;
            p->views[i].error = c->error;
        }
    }
    out->content = p->content.p ? p->content.p : g_empty;
    out->content_len = p->content.len;
    out->reasoning = p->reasoning.p ? p->reasoning.p : g_empty;
    out->reasoning_len = p->reasoning.len;
    out->calls = p->views;
    out->n_calls = p->n_calls;
    out->n_malformed = p->n_malformed;
    out->error = p->errmsg;
    return KEEL_OK;
}

size_t toolcall_held_bytes(const toolcall_parser *p)
{
    return p ? p->in.len - p->pos : 0;
}

const char *toolcall_last_error(const toolcall_parser *p)
{
    return p ? p->err : "";
}

/* ---- result as JSON ----------------------------------------------------------------------------- */

/* A JSON string of s (NULL: out of memory); invalid UTF-8 becomes U+FFFD. */
static json_t *str_json(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        size_t k = base_utf8_len((const uint8_t *)s + i, n - i);
        if (!k) break;
        i += k;
    }
    if (i == n) return json_stringn(s, n);
    json_t *v;
    tc_buf b = {0};
    for (i = 0; i < n;) {
        size_t k = base_utf8_len((const uint8_t *)s + i, n - i);
        keel_status st = k ? tc_buf_append(&b, s + i, k) : tc_buf_append(&b, "\xEF\xBF\xBD", 3);
        if (st) {
            tc_buf_free(&b);
            return NULL;
        }
        i += k ? k : 1;
    }
    v = json_stringn(b.p ? b.p : "", b.len);
    tc_buf_free(&b);
    return v;
}

/* Takes the reference of v (NULL: out of memory). */
static bool set_new(json_t *o, const char *key, json_t *v)
{
    return v && json_object_set_new(o, key, v) == 0;
}

keel_status toolcall_result_json(const toolcall_result *r, json_t **out, char *err)
{
    char local[BASE_ERR_CAP];
    if (!err) err = local;
    if (!out) return base_err(err, KEEL_EINVAL, "toolcall_result_json: out is NULL");
    *out = NULL;
    if (!r) return base_err(err, KEEL_EINVAL, "toolcall_result_json: result is NULL");
    json_t *m = json_object();
    bool ok = m && set_new(m, "role", json_string("assistant"));
    if (ok)
        ok = set_new(m, "content",
                     r->content_len == 0 && r->n_calls > 0 ? json_null()
                                                           : str_json(r->content, r->content_len));
    if (ok && r->reasoning_len) ok = set_new(m, "reasoning_content", str_json(r->reasoning, r->reasoning_len));
    if (ok && r->n_calls > 0) {
        json_t *arr = json_array();
        ok = set_new(m, "tool_calls", arr);
        for (int32_t i = 0; ok && i < r->n_calls; i++) {
            const toolcall_call *c = &r->calls[i];
            json_t *tc = json_object(), *fn = json_object();
            ok = tc && fn && json_array_append_new(arr, tc) == 0;
            if (!ok) {
                json_decref(tc);
                json_decref(fn);
                break;
            }
            ok = set_new(tc, "id", str_json(c->id, strlen(c->id))) &&
                 set_new(tc, "type", json_string("function"));
            if (ok)
                ok = set_new(tc, "function", fn); /* steals fn even when it fails */
            else
                json_decref(fn);
            ok = ok && set_new(fn, "name", str_json(c->name, strlen(c->name))) &&
                 set_new(fn, "arguments", str_json(c->arguments, c->arguments_len));
        }
    }
    if (!ok) {
        json_decref(m);
        return base_err(err, KEEL_ENOMEM, "tool-call result: out of memory building JSON");
    }
    *out = m;
    return KEEL_OK;
}
