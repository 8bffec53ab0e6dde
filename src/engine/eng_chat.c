/*
 * eng_chat.c — the output side of a chat turn: the parser that turns the
 * model's text into content, reasoning and tool calls, opened the same way
 * for a slot's admission and for the conformance tests, and a continued
 * message's prefill fed to it as the model's own text.
 *
 * A continued message (continue_final_message, docs/chat.md "Prefill"):
 * the prompt ends with the message's text as the model would have written
 * it (toolcall_continuation), so the parse of prefill + generation is the
 * whole message — a reasoning block or a tool call opened in the prefill
 * and closed by the model comes back whole. The client already has the
 * prefill's content and reasoning: the events and the response leave out
 * what repeats them (eng_pre: what a parse of the prefill alone gives).
 */
#include "eng.h"

#include <string.h>

void eng_slot_prefill_free(eng_slot *sl)
{
    if (sl->prefill) base_free(sl->prefill, sl->n_prefill + 1);
    sl->prefill = NULL;
    sl->n_prefill = 0;
}

static toolcall_options parser_options(const keel_engine *e, const eng_req *r, const char *prompt, size_t prompt_len)
{
    toolcall_options to = toolcall_options_default();
    to.format = r->o.parse_tools && r->kind == ENG_REQ_CHAT && r->o.tool_choice != ENG_TOOLS_NONE
                    ? e->tool_format
                    : TOOLCALL_FORMAT_CONTENT;
    to.parse_reasoning = r->kind == ENG_REQ_CHAT && r->o.parse_reasoning;
    to.json_answer = r->kind == ENG_REQ_CHAT && r->o.json_answer;
    to.tools = r->tools;
    if (r->kind == ENG_REQ_CHAT && prompt)
        to.starts_in_reasoning = toolcall_prompt_opens_reasoning(to.format, prompt, prompt_len);
    to.id_seed = r->o.samp.seed ^ r->id;
    return to;
}

void eng_pre_free(eng_pre *pre)
{
    for (int i = 0; i < 2; i++)
        if (pre->text[i]) base_free(pre->text[i], pre->len[i] + 1);
    memset(pre, 0, sizeof *pre);
}

void eng_pre_skip(eng_pre *pre, int which, const char **s, size_t *n)
{
    size_t k = 0;
    while (pre->at[which] < pre->len[which] && k < *n) {
        if (pre->text[which][pre->at[which]] != (*s)[k]) {
            pre->at[which] = pre->len[which]; /* departs from the prefill: new text from here */
            break;
        }
        pre->at[which]++;
        k++;
    }
    *s += k;
    *n -= k;
}

static keel_status pre_keep(eng_pre *pre, int which, const char *s, size_t n)
{
    if (n == 0) return KEEL_OK;
    if (!(pre->text[which] = base_alloc(n + 1))) return KEEL_ENOMEM;
    memcpy(pre->text[which], s, n);
    pre->text[which][n] = '\0';
    pre->len[which] = n;
    return KEEL_OK;
}

/* What the prefill alone parses to: its content and reasoning. */
static keel_status prefill_parse(const toolcall_options *base, const char *tail, size_t n_tail, eng_pre *pre,
                                 char *err)
{
    toolcall_options to = *base;
    to.on_event = NULL;
    to.event_user = NULL;
    toolcall_parser *tp = NULL;
    keel_status st = toolcall_open(&to, &tp, err);
    if (st != KEEL_OK) return st;
    toolcall_result res;
    st = toolcall_feed(tp, tail, n_tail);
    if (st == KEEL_OK) st = toolcall_finish(tp, &res);
    if (st == KEEL_OK) {
        st = pre_keep(pre, 0, res.content, res.content_len);
        if (st == KEEL_OK) st = pre_keep(pre, 1, res.reasoning, res.reasoning_len);
        if (st != KEEL_OK) base_err(err, st, "out of memory");
    } else {
        snprintf(err, BASE_ERR_CAP, "continue_final_message: %s", toolcall_last_error(tp));
    }
    toolcall_close(tp);
    return st;
}

keel_status eng_chat_parser_open(const keel_engine *e, const eng_req *r, const char *prompt, size_t prompt_len,
                                 const char *tail, size_t n_tail, bool tail_is_prefill, toolcall_event_fn fn,
                                 void *user, toolcall_parser **out, eng_pre *pre, char *err)
{
    *out = NULL;
    if (pre) eng_pre_free(pre);
    toolcall_options to = parser_options(e, r, prompt, prompt_len);
    keel_status st = KEEL_OK;
    if (pre && tail_is_prefill && n_tail > 0 && (st = prefill_parse(&to, tail, n_tail, pre, err)) != KEEL_OK) {
        eng_pre_free(pre);
        return st;
    }
    to.on_event = fn;
    to.event_user = user;
    toolcall_parser *tp = NULL;
    if ((st = toolcall_open(&to, &tp, err)) != KEEL_OK) return st;
    /* a forced call's opening or a prefill: the parser reads it as the model's own output */
    if (n_tail > 0 && (st = toolcall_feed(tp, tail, n_tail)) != KEEL_OK) {
        snprintf(err, BASE_ERR_CAP, "%s: %s", tail_is_prefill ? "continue_final_message" : "tool_choice",
                 toolcall_last_error(tp));
        toolcall_close(tp);
        return st;
    }
    *out = tp;
    return KEEL_OK;
}

/* ---- the conformance tests' entry ---------------------------------------------- */

/* The message the events build, as a client accumulates it. */
typedef struct acc {
    json_t *msg;   /* {"content", "reasoning_content", "tool_calls": [...]} */
    bool bad;      /* out of memory, or an event out of order */
} acc;

static void acc_text(acc *a, const char *key, const char *s, size_t n)
{
    const char *old = json_string_value(json_object_get(a->msg, key));
    size_t on = json_string_length(json_object_get(a->msg, key));
    char *b = base_alloc(on + n + 1);
    if (!b) {
        a->bad = true;
        return;
    }
    memcpy(b, old ? old : "", on);
    memcpy(b + on, s, n);
    b[on + n] = '\0';
    json_t *v = json_stringn_nocheck(b, on + n);
    base_free(b, on + n + 1);
    if (!v || json_object_set_new(a->msg, key, v) != 0) a->bad = true;
}

static void acc_event(void *user, const toolcall_event *ev)
{
    acc *a = user;
    json_t *calls = json_object_get(a->msg, "tool_calls");
    switch (ev->kind) {
    case TOOLCALL_EV_CONTENT: acc_text(a, "content", ev->text, ev->len); break;
    case TOOLCALL_EV_REASONING: acc_text(a, "reasoning_content", ev->text, ev->len); break;
    case TOOLCALL_EV_CALL_BEGIN: {
        if ((size_t)ev->index != json_array_size(calls)) a->bad = true;
        json_t *c = json_pack("{s:s, s:s, s:s}", "id", ev->id, "name", ev->name, "arguments", "");
        if (!c || json_array_append_new(calls, c) != 0) a->bad = true;
        break;
    }
    case TOOLCALL_EV_CALL_ARGS: {
        json_t *c = json_array_get(calls, (size_t)ev->index);
        if (!c) {
            a->bad = true;
            break;
        }
        acc sub = {c, false};
        acc_text(&sub, "arguments", ev->text, ev->len);
        a->bad |= sub.bad;
        break;
    }
    case TOOLCALL_EV_CALL_END: break;
    }
}

keel_status eng_chat_parse_output(keel_engine *e, const char *request_json, const char *output, size_t n,
                                  size_t chunk, bool partial, json_t **full, json_t **streamed, json_t **prompt,
                                  char *err)
{
    *full = *streamed = NULL;
    if (prompt) *prompt = NULL;
    json_error_t jerr_j;
    json_t *req_j = json_loads(request_json, ENG_JSON_FLAGS, &jerr_j);
    if (!req_j) return base_err(err, KEEL_EINVAL, "request: %s", jerr_j.text);
    eng_req *r = NULL;
    keel_status st = eng_req_make(e, req_j, &r, err);
    json_decref(req_j);
    if (st != KEEL_OK) return st;
    jinja_buf out = {NULL, 0, 0};
    char *prefill = NULL;
    size_t n_prefill = 0;
    toolcall_parser *tp = NULL;
    acc a = {json_pack("{s:s, s:s, s:[]}", "content", "", "reasoning_content", "", "tool_calls"), false};
    if (!a.msg) {
        st = base_err(err, KEEL_ENOMEM, "out of memory");
        goto done;
    }
    char jerr[JINJA_ERR_CAP];
    if (r->kind != ENG_REQ_CHAT) {
        st = base_err(err, KEEL_EINVAL, "request: messages expected");
        goto done;
    }
    if ((st = eng_chat_render(e, r, false, &out, &prefill, &n_prefill, jerr)) != KEEL_OK) {
        base_err(err, st, "chat template: %s", jerr);
        goto done;
    }
    if (prompt) {
        size_t pl = out.len + n_prefill;
        char *b = base_alloc(pl + 1);
        if (b) {
            memcpy(b, out.data ? out.data : "", out.len);
            memcpy(b + out.len, prefill ? prefill : "", n_prefill);
            *prompt = json_stringn_nocheck(b, pl);
            base_free(b, pl + 1);
        }
        if (!*prompt) {
            st = base_err(err, KEEL_ENOMEM, "out of memory");
            goto done;
        }
    }
    st = eng_chat_parser_open(e, r, out.data ? out.data : "", out.len, prefill, n_prefill, prefill != NULL,
                              acc_event, &a, &tp, NULL, err);
    for (size_t i = 0; st == KEEL_OK && i < n;) {
        size_t k = chunk == 0 || chunk > n - i ? n - i : chunk;
        if ((st = toolcall_feed(tp, output + i, k)) != KEEL_OK) base_err(err, st, "%s", toolcall_last_error(tp));
        i += k;
    }
    toolcall_result res;
    memset(&res, 0, sizeof res);
    if (st == KEEL_OK && !partial && (st = toolcall_finish(tp, &res)) != KEEL_OK)
        base_err(err, st, "%s", toolcall_last_error(tp));
    if (st == KEEL_OK && !partial && (st = toolcall_result_json(&res, full, err)) != KEEL_OK) goto done;
    if (st == KEEL_OK && a.bad) st = base_err(err, KEEL_ENOMEM, "events: out of memory or out of order");
    if (st == KEEL_OK) {
        *streamed = a.msg;
        a.msg = NULL;
    }
done:
    if (st != KEEL_OK && *full) {
        json_decref(*full);
        *full = NULL;
    }
    if (st != KEEL_OK && prompt && *prompt) {
        json_decref(*prompt);
        *prompt = NULL;
    }
    if (a.msg) json_decref(a.msg);
    toolcall_close(tp);
    if (prefill) base_free(prefill, n_prefill + 1);
    jinja_buf_free(&out);
    eng_req_free(r);
    return st;
}
