/*
 * api_anthropic.c — the Anthropic Messages API: POST /v1/messages and
 * /v1/messages/count_tokens.
 *
 * Requests become the engine's OpenAI-style request:
 *   system (string or text blocks; cache_control accepted)  -> one system
 *                                      message, blocks joined by a blank line
 *   user text blocks                   -> a user message (parts)
 *   user tool_result blocks            -> role "tool" messages (tool_call_id =
 *                                      tool_use_id; block content joined;
 *                                      is_error prefixes "Error: ")
 *   assistant text / thinking blocks   -> content / reasoning_content; a
 *                                      last assistant message is a prefill
 *                                      the engine continues (its text may
 *                                      not end in whitespace, as Anthropic
 *                                      requires), and the answer carries
 *                                      only the new text
 *   assistant tool_use blocks          -> tool_calls (arguments = the input object)
 *   tools {name, description, input_schema} -> OpenAI function tools
 *   tool_choice auto/any/tool/none     -> tools kept / all / the named one / none
 *   thinking enabled/disabled          -> chat_template_kwargs.enable_thinking
 *   stop_sequences, temperature, top_p, top_k, max_tokens, metadata (ignored)
 * Blocks keep their order: text before a tool_result flushes into its own
 * user message first.
 *
 * Responses: a message object with thinking / text / tool_use blocks,
 * stop_reason end_turn / max_tokens / tool_use / stop_sequence and usage
 * (input_tokens = prompt tokens not read from the cache, as Anthropic counts
 * them; cache_read_input_tokens = the reused ones). Streams: message_start,
 * ping, content_block_start / _delta (text_delta, thinking_delta,
 * input_json_delta) / _stop, message_delta, message_stop.
 */
#include "srv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- requests ------------------------------------------------------------------ */

/* Text of a tool_result's content (string or text blocks) into b. */
static bool result_text(json_t *c, size_t mi, size_t bi, srv_buf *b, srv_err *e)
{
    if (!c || json_is_null(c)) return true;
    if (json_is_string(c)) return srv_buf_add(b, json_string_value(c), json_string_length(c));
    if (!json_is_array(c))
        return srv_fail(e, 400, "messages[%zu].content[%zu].content must be a string or an array of blocks", mi, bi);
    size_t i;
    json_t *x;
    json_array_foreach(c, i, x) {
        const char *type = json_string_value(json_object_get(x, "type"));
        json_t *t = json_object_get(x, "text");
        if (!type || strcmp(type, "text") != 0 || !json_is_string(t))
            return srv_fail(e, 400, "messages[%zu].content[%zu].content[%zu]: only text blocks are supported%s%s", mi,
                            bi, i, type ? " (got " : "", type ? type : "");
        if (i && !srv_buf_adds(b, "\n")) return false;
        if (!srv_buf_add(b, json_string_value(t), json_string_length(t))) return false;
    }
    return true;
}

/* Appends a message {role, content} to out. */
static bool push(json_t *out, const char *role, json_t *content, srv_err *e)
{
    json_t *m = json_pack("{ssso}", "role", role, "content", content);
    if (!m || json_array_append_new(out, m) != 0) return srv_fail(e, 500, "out of memory");
    return true;
}

static bool convert_user(json_t *c, size_t mi, const srv_limits *lim, json_t *out, srv_err *e)
{
    json_t *parts = json_array();
    bool ok = true;
    size_t i;
    json_t *blk;
    if (!parts) return srv_fail(e, 500, "out of memory");
    json_array_foreach(c, i, blk) {
        const char *type = json_string_value(json_object_get(blk, "type"));
        if (!json_is_object(blk) || !type) {
            ok = srv_fail(e, 400, "messages[%zu].content[%zu] must be an object with a type", mi, i);
            break;
        }
        if (strcmp(type, "text") == 0) {
            json_t *t = json_object_get(blk, "text");
            if (!json_is_string(t)) {
                ok = srv_fail(e, 400, "messages[%zu].content[%zu].text must be a string", mi, i);
                break;
            }
            json_array_append_new(parts, json_pack("{sssO}", "type", "text", "text", t));
        } else if (strcmp(type, "tool_result") == 0) {
            const char *id = json_string_value(json_object_get(blk, "tool_use_id"));
            json_t *err = json_object_get(blk, "is_error");
            if (!id) {
                ok = srv_fail(e, 400, "messages[%zu].content[%zu].tool_use_id must be a string", mi, i);
                break;
            }
            if (err && !json_is_boolean(err)) {
                ok = srv_fail(e, 400, "messages[%zu].content[%zu].is_error must be a boolean", mi, i);
                break;
            }
            /* text before this result stays before it */
            if (json_array_size(parts)) {
                if (!(ok = push(out, "user", parts, e))) {
                    parts = NULL;
                    break;
                }
                parts = json_array();
                if (!parts) {
                    ok = srv_fail(e, 500, "out of memory");
                    break;
                }
            }
            srv_buf b = {0};
            if (json_is_true(err)) srv_buf_adds(&b, "Error: ");
            if (!(ok = result_text(json_object_get(blk, "content"), mi, i, &b, e))) {
                srv_buf_free(&b);
                break;
            }
            json_t *m = json_pack("{sssoss}", "role", "tool", "content", srv_json_text(b.p, b.len), "tool_call_id", id);
            srv_buf_free(&b);
            if (!m || json_array_append_new(out, m) != 0) {
                ok = srv_fail(e, 500, "out of memory");
                break;
            }
        } else {
            ok = srv_fail(e, 400, "messages[%zu].content[%zu]: blocks of type '%s' are not supported in user messages "
                                  "(text, tool_result)", mi, i, type);
            break;
        }
    }
    (void)lim;
    if (ok && parts && json_array_size(parts)) return push(out, "user", parts, e);
    if (parts) json_decref(parts);
    return ok;
}

static bool convert_assistant(json_t *c, size_t mi, json_t *out, srv_err *e)
{
    srv_buf text = {0}, think = {0};
    json_t *calls = json_array();
    bool ok = calls != NULL;
    if (!ok) return srv_fail(e, 500, "out of memory");
    size_t i;
    json_t *blk;
    json_array_foreach(c, i, blk) {
        const char *type = json_string_value(json_object_get(blk, "type"));
        if (!json_is_object(blk) || !type) {
            ok = srv_fail(e, 400, "messages[%zu].content[%zu] must be an object with a type", mi, i);
            break;
        }
        if (strcmp(type, "text") == 0) {
            json_t *t = json_object_get(blk, "text");
            if (!json_is_string(t)) {
                ok = srv_fail(e, 400, "messages[%zu].content[%zu].text must be a string", mi, i);
                break;
            }
            srv_buf_add(&text, json_string_value(t), json_string_length(t));
        } else if (strcmp(type, "thinking") == 0) {
            json_t *t = json_object_get(blk, "thinking");
            if (!json_is_string(t)) {
                ok = srv_fail(e, 400, "messages[%zu].content[%zu].thinking must be a string", mi, i);
                break;
            }
            srv_buf_add(&think, json_string_value(t), json_string_length(t));
        } else if (strcmp(type, "redacted_thinking") == 0) {
            continue; /* opaque to any model but Anthropic's */
        } else if (strcmp(type, "tool_use") == 0) {
            const char *id = json_string_value(json_object_get(blk, "id"));
            const char *name = json_string_value(json_object_get(blk, "name"));
            json_t *input = json_object_get(blk, "input");
            if (!id || !name || !*name) {
                ok = srv_fail(e, 400, "messages[%zu].content[%zu]: tool_use needs an id and a name", mi, i);
                break;
            }
            if (input && !json_is_object(input)) {
                ok = srv_fail(e, 400, "messages[%zu].content[%zu].input must be an object", mi, i);
                break;
            }
            json_t *args = input ? json_incref(input) : json_object();
            json_t *call = json_pack("{sssss{ssso}}", "id", id, "type", "function", "function", "name", name,
                                     "arguments", args);
            if (!call || json_array_append_new(calls, call) != 0) {
                ok = srv_fail(e, 500, "out of memory");
                break;
            }
        } else {
            ok = srv_fail(e, 400, "messages[%zu].content[%zu]: blocks of type '%s' are not supported in assistant "
                                  "messages (text, thinking, tool_use)", mi, i, type);
            break;
        }
    }
    if (ok && (text.overflow || think.overflow)) ok = srv_fail(e, 500, "out of memory");
    if (ok) {
        json_t *m = json_pack("{ssso}", "role", "assistant", "content", srv_json_text(text.p, text.len));
        if (m && think.len) json_object_set_new(m, "reasoning_content", srv_json_text(think.p, think.len));
        if (m && json_array_size(calls)) json_object_set(m, "tool_calls", calls);
        if (!m || json_array_append_new(out, m) != 0) ok = srv_fail(e, 500, "out of memory");
    }
    srv_buf_free(&text);
    srv_buf_free(&think);
    json_decref(calls);
    return ok;
}

static bool convert_system(json_t *sys, json_t *out, srv_err *e)
{
    if (!sys || json_is_null(sys)) return true;
    if (json_is_string(sys)) return json_string_length(sys) == 0 || push(out, "system", json_incref(sys), e);
    if (!json_is_array(sys)) return srv_fail(e, 400, "system must be a string or an array of text blocks");
    srv_buf b = {0};
    size_t i;
    json_t *blk;
    json_array_foreach(sys, i, blk) {
        const char *type = json_string_value(json_object_get(blk, "type"));
        json_t *t = json_object_get(blk, "text");
        if (!type || strcmp(type, "text") != 0 || !json_is_string(t)) {
            srv_buf_free(&b);
            return srv_fail(e, 400, "system[%zu] must be a text block {\"type\": \"text\", \"text\": ...}", i);
        }
        if (b.len) srv_buf_adds(&b, "\n\n");
        srv_buf_add(&b, json_string_value(t), json_string_length(t));
    }
    bool ok = b.overflow ? srv_fail(e, 500, "out of memory") : b.len == 0 || push(out, "system", srv_json_text(b.p, b.len), e);
    srv_buf_free(&b);
    return ok;
}

/* Whether the text of a final assistant message ends in whitespace, which
 * Anthropic refuses (a prefill is continued from its last byte): a string,
 * or the last block when it is text. */
static bool trailing_space(json_t *c)
{
    json_t *last = json_is_array(c) ? json_array_get(c, json_array_size(c) - 1) : NULL;
    const char *type = json_string_value(json_object_get(last, "type"));
    json_t *t = json_is_string(c) ? c : type && strcmp(type, "text") == 0 ? json_object_get(last, "text") : NULL;
    size_t n = json_string_length(t);
    char ch = n > 0 ? json_string_value(t)[n - 1] : '\0';
    return ch != '\0' && strchr(" \t\n\r\v\f", ch) != NULL;
}

static bool convert_messages(json_t *body, const srv_limits *lim, json_t *req, srv_err *e)
{
    json_t *msgs = json_object_get(body, "messages");
    if (!msgs) return srv_fail(e, 400, "messages: field required");
    if (!json_is_array(msgs)) return srv_fail(e, 400, "messages must be an array");
    size_t n = json_array_size(msgs);
    if (n == 0) return srv_fail(e, 400, "messages: at least one message is required");
    if (n > lim->max_messages) return srv_fail(e, 400, "messages: %zu (at most %zu)", n, lim->max_messages);
    json_t *out = json_array();
    if (!out || json_object_set_new(req, "messages", out) != 0) return srv_fail(e, 500, "out of memory");
    if (!convert_system(json_object_get(body, "system"), out, e)) return false;
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        if (!json_is_object(m)) return srv_fail(e, 400, "messages[%zu] must be an object", i);
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!role) return srv_fail(e, 400, "messages[%zu].role must be a string", i);
        bool user = strcmp(role, "user") == 0;
        if (!user && strcmp(role, "assistant") != 0)
            return srv_fail(e, 400, "messages[%zu]: unknown role '%s' (user, assistant)", i, role);
        json_t *c = json_object_get(m, "content");
        if (!user && i + 1 == n && trailing_space(c))
            return srv_fail(e, 400, "messages: final assistant content cannot end with trailing whitespace");
        if (json_is_string(c)) {
            if (!push(out, role, json_incref(c), e)) return false;
            continue;
        }
        if (!json_is_array(c)) return srv_fail(e, 400, "messages[%zu].content must be a string or an array of blocks", i);
        if (json_array_size(c) == 0 && user) return srv_fail(e, 400, "messages[%zu].content is empty", i);
        if (json_array_size(c) > lim->max_parts)
            return srv_fail(e, 400, "messages[%zu].content: %zu blocks (at most %zu)", i, json_array_size(c),
                            lim->max_parts);
        if (!(user ? convert_user(c, i, lim, out, e) : convert_assistant(c, i, out, e))) return false;
    }
    return true;
}

static bool convert_tools(json_t *body, const srv_limits *lim, json_t *req, srv_err *e)
{
    json_t *tools = json_object_get(body, "tools");
    json_t *choice = json_object_get(body, "tool_choice");
    if (!tools || json_is_null(tools)) return true;
    if (!json_is_array(tools)) return srv_fail(e, 400, "tools must be an array");
    if (json_array_size(tools) > lim->max_tools)
        return srv_fail(e, 400, "tools: %zu (at most %zu)", json_array_size(tools), lim->max_tools);
    const char *only = NULL;
    if (choice && !json_is_null(choice)) {
        const char *ct = json_string_value(json_object_get(choice, "type"));
        if (!json_is_object(choice) || !ct) return srv_fail(e, 400, "tool_choice must be an object with a type");
        if (strcmp(ct, "none") == 0) return true;
        if (strcmp(ct, "tool") == 0) {
            only = json_string_value(json_object_get(choice, "name"));
            if (!only) return srv_fail(e, 400, "tool_choice of type tool needs a name");
        } else if (strcmp(ct, "auto") && strcmp(ct, "any")) {
            return srv_fail(e, 400, "tool_choice.type '%s' is not one of auto, any, tool, none", ct);
        }
    }
    json_t *out = json_array();
    if (!out) return srv_fail(e, 500, "out of memory");
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        const char *name = json_string_value(json_object_get(t, "name"));
        const char *type = json_string_value(json_object_get(t, "type"));
        json_t *desc = json_object_get(t, "description"), *schema = json_object_get(t, "input_schema");
        if (!json_is_object(t) || !name || !*name) {
            json_decref(out);
            return srv_fail(e, 400, "tools[%zu].name must be a non-empty string", i);
        }
        if (!json_is_object(schema)) {
            json_decref(out);
            return srv_fail(e, 400, "tools[%zu] (%s): input_schema must be an object%s%s", i, name,
                            type ? "; server tools are not supported: " : "", type ? type : "");
        }
        if (desc && !json_is_string(desc) && !json_is_null(desc)) {
            json_decref(out);
            return srv_fail(e, 400, "tools[%zu].description must be a string", i);
        }
        if (only && strcmp(name, only) != 0) continue;
        json_t *f = json_pack("{sssO}", "name", name, "parameters", schema);
        if (f && json_is_string(desc)) json_object_set(f, "description", desc);
        json_t *ft = f ? json_pack("{ssso}", "type", "function", "function", f) : NULL;
        if (!ft || json_array_append_new(out, ft) != 0) {
            json_decref(out);
            return srv_fail(e, 500, "out of memory");
        }
    }
    if (only && json_array_size(out) == 0) {
        json_decref(out);
        return srv_fail(e, 400, "tool_choice names '%s', which is not among the tools", only);
    }
    if (json_object_set_new(req, "tools", out) != 0) return srv_fail(e, 500, "out of memory");
    const char *ct = choice ? json_string_value(json_object_get(choice, "type")) : NULL;
    /* disable_parallel_tool_use: at most one call (the tool grammar's) */
    json_t *dp = choice ? json_object_get(choice, "disable_parallel_tool_use") : NULL;
    if (dp && !json_is_null(dp) && !json_is_boolean(dp))
        return srv_fail(e, 400, "tool_choice.disable_parallel_tool_use must be a boolean");
    if (json_is_true(dp) && json_object_set_new(req, "parallel_tool_calls", json_false()) != 0)
        return srv_fail(e, 500, "out of memory");
    return srv_set_tool_choice(req, only, ct && strcmp(ct, "any") == 0, e);
}

static bool convert_thinking(json_t *body, json_t *req, srv_err *e)
{
    json_t *th = json_object_get(body, "thinking");
    if (!th || json_is_null(th)) return true;
    const char *t = json_string_value(json_object_get(th, "type"));
    /* adaptive: the model decides how much to think, which a template's
     * switch can only express as thinking on */
    if (!json_is_object(th) || !t || (strcmp(t, "enabled") && strcmp(t, "adaptive") && strcmp(t, "disabled")))
        return srv_fail(e, 400, "thinking must be {\"type\": \"enabled\", \"budget_tokens\": N}, {\"type\": "
                                "\"adaptive\"} or {\"type\": \"disabled\"}");
    json_t *bt = json_object_get(th, "budget_tokens");
    if (bt && !json_is_null(bt) && (!json_is_integer(bt) || json_integer_value(bt) < 0))
        return srv_fail(e, 400, "thinking.budget_tokens must be a non-negative integer");
    json_t *kw = json_pack("{sb}", "enable_thinking", strcmp(t, "disabled") != 0);
    if (!kw || json_object_set_new(req, "chat_template_kwargs", kw) != 0) return srv_fail(e, 500, "out of memory");
    return true;
}

bool srv_anthropic_parse(srv_api api, json_t *b, const srv_limits *lim, srv_request *out, srv_err *e)
{
    json_t *req = json_object();
    if (!req) return srv_fail(e, 500, "out of memory");
    out->engine = req;
    const char *model = NULL;
    if (!srv_get_str(b, "model", &model, e)) return false;
    json_t *md = json_object_get(b, "metadata");
    if (md && !json_is_null(md) && !json_is_object(md)) return srv_fail(e, 400, "metadata must be an object");
    if (!convert_messages(b, lim, req, e) || !convert_tools(b, lim, req, e) || !convert_thinking(b, req, e))
        return false;
    if (api == SRV_API_COUNT_TOKENS) {
        /* rendered and counted, nothing generated */
        if (json_object_set_new(req, "max_tokens", json_integer(0)) != 0) return srv_fail(e, 500, "out of memory");
        return true;
    }
    if (!srv_get_bool(b, "stream", &out->stream, e)) return false;
    out->include_usage = true;
    json_t *ss = json_object_get(b, "stop_sequences");
    if (ss && !json_is_null(ss) && !json_is_array(ss)) return srv_fail(e, 400, "stop_sequences must be an array of strings");
    /* the Messages API takes a positive integer (no -1 "until the end") */
    json_t *mt = json_object_get(b, "max_tokens");
    if (mt && !json_is_null(mt) && (!json_is_integer(mt) || json_integer_value(mt) < 1))
        return srv_fail(e, 400, "max_tokens: must be a positive integer");
    return srv_copy_max_tokens(b, "max_tokens", req, lim, e) && srv_copy_num(b, "temperature", req, "temperature", 0, 2, e) &&
           srv_copy_num(b, "top_p", req, "top_p", 0, 1, e) && srv_copy_int(b, "top_k", req, "top_k", -1, INT32_MAX, e) &&
           srv_copy_stop(b, "stop_sequences", req, lim, e);
}

/* ---- responses --------------------------------------------------------------------- */

static const char *stop_reason(json_t *resp)
{
    const char *f = json_string_value(json_object_get(resp, "finish_reason"));
    if (f && strcmp(f, "tool_calls") == 0) return "tool_use";
    if (f && strcmp(f, "length") == 0) return "max_tokens";
    if (json_is_string(json_object_get(resp, "stop_sequence"))) return "stop_sequence";
    return "end_turn";
}

/* usage of a response; without one (message_start) the prompt's counts
 * of the PROMPT event, p and c. */
static json_t *usage_json(json_t *resp, int64_t p, int64_t c)
{
    int64_t g = 0;
    if (resp) {
        srv_engine_usage(resp, "prompt_tokens", &p);
        srv_engine_usage(resp, "cached_tokens", &c);
        srv_engine_usage(resp, "completion_tokens", &g);
    }
    return json_pack("{sIsIsIsI}", "input_tokens", (json_int_t)(p - c), "output_tokens", (json_int_t)g,
                     "cache_read_input_tokens", (json_int_t)c, "cache_creation_input_tokens", (json_int_t)0);
}

/* The input object of a tool call's arguments (a JSON string); {} if they
 * are not an object. */
static json_t *tool_input(json_t *args)
{
    json_t *v = json_is_string(args) ? json_loadb(json_string_value(args), json_string_length(args), 0, NULL) : NULL;
    if (json_is_object(v)) return v;
    if (json_is_object(args)) return json_incref(args);
    if (v) json_decref(v);
    return json_object();
}

static char *dump_free(json_t *o)
{
    if (!o) return NULL;
    char *s = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(10));
    json_decref(o);
    return s;
}

char *srv_anthropic_response(const srv_meta *m, json_t *resp)
{
    if (m->api == SRV_API_COUNT_TOKENS) {
        int64_t p = 0;
        srv_engine_usage(resp, "prompt_tokens", &p);
        return dump_free(json_pack("{sI}", "input_tokens", (json_int_t)p));
    }
    json_t *content = json_array();
    if (!content) return NULL;
    json_t *rc = json_object_get(resp, "reasoning_content");
    if (json_is_string(rc) && json_string_length(rc))
        json_array_append_new(content, json_pack("{sssOss}", "type", "thinking", "thinking", rc, "signature", ""));
    json_t *c = json_object_get(resp, "content");
    if (json_is_string(c) && json_string_length(c))
        json_array_append_new(content, json_pack("{sssO}", "type", "text", "text", c));
    size_t i;
    json_t *tc;
    json_array_foreach(json_object_get(resp, "tool_calls"), i, tc) {
        char id[160];
        json_t *fn = json_object_get(tc, "function");
        srv_toolu_id(json_string_value(json_object_get(tc, "id")), id, sizeof id);
        const char *name = json_string_value(json_object_get(fn, "name"));
        json_array_append_new(content, json_pack("{ssssssso}", "type", "tool_use", "id", id, "name", name ? name : "",
                                                 "input", tool_input(json_object_get(fn, "arguments"))));
    }
    json_t *ss = json_object_get(resp, "stop_sequence");
    json_t *o = json_pack("{sssssssssosssOso}", "id", m->id, "type", "message", "role", "assistant", "model",
                          m->model, "content", content, "stop_reason", stop_reason(resp), "stop_sequence",
                          json_is_string(ss) ? ss : json_null(), "usage", usage_json(resp, 0, 0));
    /* how the slot's cache was used (an extension field, as OpenAI's) */
    json_t *mem = json_object_get(resp, "memory");
    if (o && mem) json_object_set(o, "memory", mem);
    json_t *tg = json_object_get(resp, "tool_grammar");
    if (o && tg) json_object_set(o, "tool_grammar", tg);
    return dump_free(o);
}

/* ---- streams -------------------------------------------------------------------------- */

static bool emit(srv_buf *out, const char *event, json_t *o)
{
    if (!o) return false;
    bool ok = srv_buf_addf(out, "event: %s\ndata: ", event) && srv_buf_addjson(out, o) && srv_buf_adds(out, "\n\n");
    json_decref(o);
    return ok;
}

static bool start(srv_stream *s, srv_buf *out)
{
    if (s->started) return true;
    s->started = true;
    json_t *msg = json_pack("{sssssssss[]sososo}", "id", s->m.id, "type", "message", "role", "assistant", "model",
                            s->m.model, "content", "stop_reason", json_null(), "stop_sequence", json_null(), "usage",
                            usage_json(NULL, s->prompt_tokens, s->cached_tokens));
    return emit(out, "message_start", json_pack("{ssso}", "type", "message_start", "message", msg)) &&
           srv_buf_adds(out, "event: ping\ndata: {\"type\":\"ping\"}\n\n");
}

static bool delta(srv_stream *s, json_t *d, srv_buf *out);

/* A tool_use block's input goes out whole when the call ends: a valid JSON
 * object as the model wrote it, else {} (what the response holds then). A
 * malformed call streamed piece by piece would make clients' partial-JSON
 * parsers fail mid-stream. */
static bool flush_args(srv_stream *s, const char *error, srv_buf *out)
{
    json_t *v = !error && s->args.len ? json_loadb(s->args.p, s->args.len, 0, NULL) : NULL;
    bool obj = json_is_object(v);
    if (v) json_decref(v);
    bool ok = delta(s, json_pack("{ssso}", "type", "input_json_delta", "partial_json",
                                 obj ? json_stringn(s->args.p, s->args.len) : json_string("{}")),
                    out);
    srv_buf_reset(&s->args);
    return ok;
}

static bool close_block(srv_stream *s, srv_buf *out)
{
    if (s->block < 0) return true;
    if (s->block_kind == SRV_BLOCK_TOOL && !flush_args(s, s->args.overflow ? "too long" : NULL, out)) return false;
    bool ok = emit(out, "content_block_stop", json_pack("{sssi}", "type", "content_block_stop", "index", s->block));
    s->block = -1;
    s->block_kind = SRV_BLOCK_NONE;
    s->tool = -1;
    return ok;
}

/* Makes a block of kind the open one (closing another first). */
static bool open_block(srv_stream *s, int kind, json_t *block, srv_buf *out)
{
    if (!close_block(s, out)) {
        json_decref(block);
        return false;
    }
    s->block = s->n_blocks++;
    s->block_kind = kind;
    return emit(out, "content_block_start",
                json_pack("{sssiso}", "type", "content_block_start", "index", s->block, "content_block", block));
}

static bool delta(srv_stream *s, json_t *d, srv_buf *out)
{
    return emit(out, "content_block_delta", json_pack("{sssiso}", "type", "content_block_delta", "index", s->block, "delta", d));
}

bool srv_anthropic_event(srv_stream *s, const keel_event *ev, srv_buf *out)
{
    if (!start(s, out)) return false;
    switch (ev->kind) {
    case KEEL_EVENT_CONTENT:
        if (!ev->len) return true;
        if (s->block_kind != SRV_BLOCK_TEXT &&
            !open_block(s, SRV_BLOCK_TEXT, json_pack("{ssss}", "type", "text", "text", ""), out))
            return false;
        return delta(s, json_pack("{ssso}", "type", "text_delta", "text", srv_json_text(ev->text, ev->len)), out);
    case KEEL_EVENT_REASONING:
        if (!ev->len) return true;
        if (s->block_kind != SRV_BLOCK_THINKING &&
            !open_block(s, SRV_BLOCK_THINKING, json_pack("{ssssss}", "type", "thinking", "thinking", "", "signature", ""), out))
            return false;
        return delta(s, json_pack("{ssso}", "type", "thinking_delta", "thinking", srv_json_text(ev->text, ev->len)), out);
    case KEEL_EVENT_TOOL_BEGIN: {
        char id[160];
        srv_toolu_id(ev->id, id, sizeof id);
        if (!open_block(s, SRV_BLOCK_TOOL,
                        json_pack("{sssssss{}}", "type", "tool_use", "id", id, "name", ev->name ? ev->name : "", "input"),
                        out))
            return false;
        s->tool = ev->index;
        return true;
    }
    case KEEL_EVENT_TOOL_ARGS:
        /* arguments of a call whose block is not open cannot be placed */
        if (!ev->len || s->block_kind != SRV_BLOCK_TOOL || s->tool != ev->index) return true;
        srv_buf_add(&s->args, ev->text, ev->len); /* an overflow makes the input {} */
        return true;
    case KEEL_EVENT_TOOL_END:
        if (s->block_kind != SRV_BLOCK_TOOL || s->tool != ev->index) return true;
        if (!flush_args(s, ev->error ? ev->error : s->args.overflow ? "too long" : NULL, out)) return false;
        s->block_kind = SRV_BLOCK_NONE; /* its input is out: close_block must not send it again */
        return close_block(s, out);
    default:
        return true;
    }
}

bool srv_anthropic_done(srv_stream *s, json_t *resp, srv_buf *out)
{
    if (!start(s, out) || !close_block(s, out)) return false;
    json_t *ss = json_object_get(resp, "stop_sequence");
    json_t *d = json_pack("{sssO}", "stop_reason", stop_reason(resp), "stop_sequence", json_is_string(ss) ? ss : json_null());
    return emit(out, "message_delta", json_pack("{sssoso}", "type", "message_delta", "delta", d, "usage", usage_json(resp, 0, 0))) &&
           emit(out, "message_stop", json_pack("{ss}", "type", "message_stop"));
}
