/*
 * toolcall.c — the streaming parser of model output (toolcall.h): one byte
 * driven state machine for every format, configured by the tables of
 * toolcall_formats.c; the states of a call's header live in toolcall_hdr.c,
 * those of its body (arguments, XML parameters, harmony) in toolcall_args.c.
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

#define FEED_STEP 4096 /* input appended per step, so holding stays bounded */
#define DEFAULT_HELD ((size_t)1 << 20)
#define MIN_HELD ((size_t)4096)

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

keel_status tc_fail_nomem(toolcall_parser *p, keel_status st)
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
void tc_flush_stream(toolcall_parser *p, int which, bool all)
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
    if (p->last_stream != which && p->last_stream >= 0) tc_flush_stream(p, p->last_stream, true);
    p->last_stream = which;
}

static keel_status out_text(toolcall_parser *p, bool reasoning, const char *s, size_t n)
{
    if (n == 0) return KEEL_OK;
    int which = reasoning ? 1 : 0;
    switch_stream(p, which);
    keel_status st = tc_buf_append(reasoning ? &p->reasoning : &p->content, s, n);
    if (st) return tc_fail_nomem(p, st);
    tc_flush_stream(p, which, false);
    return KEEL_OK;
}

keel_status tc_out_args(toolcall_parser *p, const char *s, size_t n)
{
    if (n == 0 || p->call < 0) return KEEL_OK;
    switch_stream(p, 2);
    keel_status st = tc_buf_append(&p->calls[p->call].args, s, n);
    if (st) return tc_fail_nomem(p, st);
    tc_flush_stream(p, 2, false);
    return KEEL_OK;
}

keel_status tc_out_args_str(toolcall_parser *p, const char *s)
{
    return tc_out_args(p, s, strlen(s));
}

keel_status tc_out_args_escaped(toolcall_parser *p, const char *s, size_t n)
{
    if (n == 0 || p->call < 0) return KEEL_OK;
    switch_stream(p, 2);
    keel_status st = tc_buf_append_escaped(&p->calls[p->call].args, s, n);
    if (st) return tc_fail_nomem(p, st);
    tc_flush_stream(p, 2, false);
    return KEEL_OK;
}

const char tc_err_strjson[] = "the arguments string does not hold JSON";

/* Whether t[0..n) is exactly one JSON value (whitespace around allowed). */
bool tc_json_whole(const char *t, size_t n)
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

bool tc_tool_known(const toolcall_parser *p, const char *name)
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

const json_t *tc_tool_params(const toolcall_parser *p, const char *name)
{
    if (!p->o.tools || !name) return NULL;
    const json_t *f = tool_find(p, name);
    const json_t *sch = json_object_get(f, "parameters");
    return sch ? sch : json_object_get(f, "input_schema");
}

int tc_param_type(const toolcall_parser *p, const char *fname, const char *pname)
{
    const json_t *sch = tc_tool_params(p, fname);
    if (!sch) return PT_ANY;
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

keel_status tc_start_call(toolcall_parser *p, const char *name, const char *model_id)
{
    keel_status st = KEEL_OK;
    if (p->n_calls == p->cap_calls) {
        int32_t cap = p->cap_calls ? p->cap_calls * 2 : 4;
        size_t old_bytes, new_bytes;
        if (!size_mul((size_t)p->cap_calls, sizeof *p->calls, &old_bytes) ||
            !size_mul((size_t)cap, sizeof *p->calls, &new_bytes))
            return tc_fail_nomem(p, KEEL_EOVERFLOW);
        tc_call *c = base_realloc(p->calls, old_bytes, new_bytes);
        if (!c) return tc_fail_nomem(p, KEEL_ENOMEM);
        p->calls = c;
        p->cap_calls = cap;
    }
    tc_call *c = &p->calls[p->n_calls];
    memset(c, 0, sizeof *c);
    c->name = base_strdup(name);
    if (!c->name) return tc_fail_nomem(p, KEEL_ENOMEM);
    int32_t idx = p->n_calls;
    if (model_id && model_id[0]) { /* the model's id: the next turn's tool result refers to it */
        snprintf(c->id, sizeof c->id, "%s", model_id);
    } else if (p->o.id_fn) {
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

void tc_set_error(toolcall_parser *p, const char *why)
{
    if (p->call >= 0 && !p->calls[p->call].error) p->calls[p->call].error = why;
}

keel_status tc_end_call(toolcall_parser *p, const char *why)
{
    if (p->call < 0) return KEEL_OK;
    tc_call *c = &p->calls[p->call];
    keel_status st = KEEL_OK;
    if (c->args.len == 0) st = tc_out_args_str(p, "{}");
    if (st) return st;
    if (why) tc_set_error(p, why);
    tc_flush_stream(p, 2, true);
    p->last_stream = -1;
    if (c->error) {
        p->n_malformed++;
        if (!p->errmsg) {
            char m[BASE_ERR_CAP + TOOLCALL_NAME_CAP];
            snprintf(m, sizeof m, "tool call %d (%s): %s", (int)p->call + 1, c->name, c->error);
            p->errmsg = base_strdup(m);
            if (!p->errmsg) return tc_fail_nomem(p, KEEL_ENOMEM);
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

keel_status tc_emit_text(toolcall_parser *p, size_t n)
{
    keel_status st = p->h_drop ? KEEL_OK : out_text(p, p->reasoning_mode, tc_cur(p), n);
    p->pos += n;
    return st;
}

static bool marker_active(const toolcall_parser *p, const tc_marker *m)
{
    if (m->act == TC_ACT_RDROP) return p->o.parse_reasoning;
    if (m->act == TC_ACT_BLOCK && p->sp->muse && !p->h_tool) return false; /* markup quoted in text */
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

/*
 * A JSON answer (json_answer) in a Markdown fence: "```json" (or "```")
 * and its line break open the content, dropped; "```" with nothing but
 * whitespace after it up to the end of the output closes it, dropped. A
 * "```" followed by more text is text. Called at the head of the held
 * content: consumes an opening fence, or decides a closing one (*wait:
 * more bytes are needed).
 */
static keel_status fence(toolcall_parser *p, const char *b, size_t n, bool at_end, bool *wait)
{
    size_t j = tc_skip_ws(b, n, 0), k = j;
    if (!p->seen_content && !p->fence_open) {
        if (j >= n) {
            *wait = !at_end;
            return KEEL_OK;
        }
        tc_pr r = tc_lit(b, n, &k, "```");
        if (r == TC_MORE && !at_end) {
            *wait = true;
            return KEEL_OK;
        }
        if (r != TC_OK) return KEEL_OK;
        size_t q = k;
        r = tc_lit(b, n, &q, "json");
        if (r == TC_MORE && !at_end) {
            *wait = true;
            return KEEL_OK;
        }
        if (r == TC_OK) k = q;
        while (k < n && (b[k] == ' ' || b[k] == '\t'))
            k++;
        if (k < n && b[k] == '\r') k++;
        if (k >= n && !at_end) {
            *wait = true;
            return KEEL_OK;
        }
        if (k < n && b[k] != '\n') return KEEL_OK; /* "```x": not an opening fence */
        p->pos += k < n ? k + 1 : k;
        p->fence_open = true;
        return KEEL_OK;
    }
    if (!p->fence_open || j >= n || b[j] != '`') return KEEL_OK;
    tc_pr r = tc_lit(b, n, &k, "```");
    if (r == TC_MORE && !at_end) {
        *wait = true;
        return KEEL_OK;
    }
    if (r != TC_OK) return KEEL_OK;
    size_t e = tc_skip_ws(b, n, k);
    if (e < n) { /* more text after it: the backticks are text */
        p->fence_open = false;
        return KEEL_OK;
    }
    if (!at_end) {
        *wait = true;
        return KEEL_OK;
    }
    p->pos += n; /* the closing fence and the whitespace around it */
    p->fence_open = false;
    return KEEL_OK;
}

static keel_status h_text(toolcall_parser *p, bool at_end, bool *more)
{
    const tc_marker *mk = p->reasoning_mode ? p->sp->reasoning : p->sp->content;
    const char *b = tc_cur(p);
    size_t n = tc_avail(p), i = 0;
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
    if (p->o.json_answer && !p->reasoning_mode) {
        bool wait = false;
        keel_status st = fence(p, b, n, at_end, &wait);
        if (st || wait) {
            *more = wait && !at_end;
            return st;
        }
        if (p->pos != (size_t)(b - p->in.p)) return KEEL_OK; /* consumed: look again */
    }
    bool run = false;
    size_t ws_start = 0, head = tc_skip_ws(b, n, 0);
    for (; i < n; i++) {
        uint8_t c = (uint8_t)b[i];
        /* backticks after the head: a closing fence, decided by fence() once they lead */
        if (p->fence_open && c == '`' && i > head && !p->reasoning_mode) {
            keel_status st = tc_emit_text(p, run ? ws_start : i);
            return st;
        }
        bool llama = c == '{' && p->sp->llama_start && !p->reasoning_mode && !p->seen_content &&
                     p->n_calls == 0 && !p->llama_start_done;
        size_t mlen = 0;
        int m = -1;
        if (!llama) m = match_marker(p, mk, b + i, n - i, at_end, &mlen);
        if (llama || m >= 0) {
            size_t text_end = run ? ws_start : i;
            keel_status st = tc_emit_text(p, text_end);
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
            case TC_ACT_RDROP:
                p->pos += region;
                p->skip_ws = true;
                return KEEL_OK;
            case TC_ACT_BLOCK:
                /* in reasoning, a call marker is a call only if the reasoning is
                 * never closed after it: held until that is known */
                if (p->reasoning_mode && !p->r_release) { /* held from the whitespace before it */
                    p->obj_len = 0;
                    p->st = ST_R_HOLD;
                    return KEEL_OK;
                }
                p->r_release = false;
                return begin_block(p, hit->arg, region);
            case TC_ACT_H_END:
                /* an analysis message kept in the content keeps its end too */
                if (p->h_raw) {
                    p->pos += region - mlen;
                    keel_status st2 = tc_emit_text(p, mlen);
                    if (st2) return st2;
                } else {
                    p->pos += region;
                }
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
            keel_status st = tc_emit_text(p, run ? ws_start : i);
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
    keel_status st = tc_emit_text(p, at_end || !run ? n : ws_start);
    *more = !at_end;
    return st;
}

/* ---- a call marker inside reasoning (ST_R_HOLD) ---------------------------------------- */

/* Text inside a closed reasoning block is reasoning, call markers
 * included; a call in reasoning that is never closed ends the reasoning
 * (models that call tools from their thinking). Held from the marker
 * until a reasoning close (then reasoning text) or the end of the output
 * (then parsed as calls); past max_held it is reasoning. */
static keel_status h_r_hold(toolcall_parser *p, bool at_end, bool *more)
{
    const char *s = tc_cur(p);
    size_t n = tc_avail(p), w = BASE_MIN(n, p->max_held);
    for (size_t i = p->obj_len; i < w; i++) {
        for (const tc_marker *m = p->sp->reasoning; m->s; m++) {
            if (m->act != TC_ACT_REASON_CLOSE || m->s[0] != s[i]) continue;
            size_t len = strlen(m->s);
            if (i + len > n) {
                if (!at_end) {
                    p->obj_len = i;
                    *more = true;
                    return KEEL_OK;
                }
                continue;
            }
            if (memcmp(s + i, m->s, len) != 0) continue;
            p->st = ST_TEXT; /* the close follows: all of it was reasoning */
            p->seen_reasoning = true;
            return tc_emit_text(p, i);
        }
    }
    p->obj_len = w;
    if (!at_end && n < p->max_held) {
        *more = true;
        return KEEL_OK;
    }
    p->st = ST_TEXT;
    if (at_end && n < p->max_held) { /* never closed: the marker opens a call */
        p->r_release = true;
        return KEEL_OK;
    }
    p->seen_reasoning = true;
    return tc_emit_text(p, w);
}

/* ---- driver ----------------------------------------------------------------------------------- */

static keel_status step(toolcall_parser *p, bool at_end, bool *more)
{
    switch (p->st) {
    case ST_TEXT: return h_text(p, at_end, more);
    case ST_HDR: return tc_h_hdr(p, at_end, more);
    case ST_OBJ: return tc_h_obj(p, at_end, more);
    case ST_ARGS: return tc_h_args(p, at_end, more);
    case ST_ARGS_RAW: return tc_h_args_raw(p, at_end, more);
    case ST_TRAILER: return tc_h_trailer(p, at_end, more);
    case ST_CALLEND: return tc_h_callend(p, at_end, more);
    case ST_XML_PARAMS: return tc_h_xml_params(p, at_end, more);
    case ST_XML_VALUE: return tc_h_xml_value(p, at_end, more);
    case ST_H_HEADER: return tc_h_h_header(p, at_end, more);
    case ST_PY: return tc_h_py(p, at_end, more);
    case ST_MM3: return tc_h_mm3(p, at_end, more);
    case ST_OBJ_REST: return tc_h_obj_rest(p, at_end, more);
    case ST_R_HOLD: return h_r_hold(p, at_end, more);
    default: return base_err(p->err, KEEL_EINTERNAL, "tool-call parser: bad state %d", p->st);
    }
}

static keel_status run(toolcall_parser *p, bool at_end)
{
    int idle = 0;
    for (;;) {
        if (p->st == ST_TEXT && tc_avail(p) == 0) return KEEL_OK;
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
    if (p->sp->starts_in_block) { /* the prompt wrote the block marker: a header comes first */
        p->blk = p->sp->starts_in_block;
        p->st = ST_HDR;
    }
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
        if (st) return tc_fail_nomem(p, st);
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
        st = tc_end_call(p, tc_err_unclosed);
        if (st) return st;
    }
    p->finished = true;
    tc_flush_stream(p, 0, true);
    tc_flush_stream(p, 1, true);
    if (p->n_calls) {
        p->views = base_calloc((size_t)p->n_calls, sizeof *p->views);
        if (!p->views) return tc_fail_nomem(p, KEEL_ENOMEM);
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