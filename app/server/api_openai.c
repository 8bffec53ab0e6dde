/*
 * api_openai.c — the OpenAI API: POST /v1/chat/completions and
 * /v1/completions. Requests become engine requests (messages checked and
 * normalized: developer -> system, text parts only, tool calls with a
 * function name; tools in OpenAI form, tool_choice applied; a trailing
 * assistant message is continued by the engine unless
 * continue_final_message is false), engine responses become chat.completion / text_completion objects, and engine
 * events become chat.completion.chunk / text_completion SSE chunks ending
 * with "data: [DONE]".
 *
 * Every member a request uses is type- and range-checked here, so the
 * engine only sees well-formed requests; unknown members are ignored (as
 * OpenAI-compatible servers do).
 */
#include "srv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SRV_FINGERPRINT "keel-" KEEL_VERSION_STRING

/* ---- requests ----------------------------------------------------------------- */

/* A content value (string, null or parts) checked and normalized into the
 * copy: only text parts, each {"type": "text", "text": ...}. */
static bool norm_content(json_t *c, size_t idx, const srv_limits *lim, json_t **out, srv_err *e)
{
    *out = NULL;
    if (!c || json_is_null(c) || json_is_string(c)) {
        *out = c ? json_incref(c) : NULL;
        return true;
    }
    if (!json_is_array(c)) return srv_fail(e, 400, "messages[%zu].content must be a string or an array of parts", idx);
    if (json_array_size(c) > lim->max_parts)
        return srv_fail(e, 400, "messages[%zu].content: %zu parts (at most %zu)", idx, json_array_size(c),
                        lim->max_parts);
    json_t *parts = json_array();
    if (!parts) return srv_fail(e, 500, "out of memory");
    size_t i;
    json_t *p;
    json_array_foreach(c, i, p) {
        const char *type = json_string_value(json_object_get(p, "type"));
        json_t *text = json_object_get(p, "text");
        if (!json_is_object(p) || !type) {
            json_decref(parts);
            return srv_fail(e, 400, "messages[%zu].content[%zu] must be an object with a type", idx, i);
        }
        if (strcmp(type, "text") != 0) {
            json_decref(parts);
            return srv_fail(e, 400, "messages[%zu].content[%zu]: parts of type '%s' are not supported (text only)", idx,
                            i, type);
        }
        if (!json_is_string(text)) {
            json_decref(parts);
            return srv_fail(e, 400, "messages[%zu].content[%zu].text must be a string", idx, i);
        }
        json_array_append_new(parts, json_pack("{sssO}", "type", "text", "text", text));
    }
    *out = parts;
    return true;
}

static bool norm_tool_calls(json_t *calls, size_t idx, json_t *m, srv_err *e)
{
    if (!calls || json_is_null(calls)) return true;
    if (!json_is_array(calls)) return srv_fail(e, 400, "messages[%zu].tool_calls must be an array", idx);
    json_t *out = json_array();
    size_t i;
    json_t *c;
    json_array_foreach(calls, i, c) {
        json_t *fn = json_object_get(c, "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        json_t *args = json_object_get(fn, "arguments");
        json_t *id = json_object_get(c, "id");
        if (!json_is_object(c) || !json_is_object(fn) || !name || !*name) {
            json_decref(out);
            return srv_fail(e, 400, "messages[%zu].tool_calls[%zu].function.name must be a non-empty string", idx, i);
        }
        if (args && !json_is_string(args) && !json_is_object(args) && !json_is_null(args)) {
            json_decref(out);
            return srv_fail(e, 400, "messages[%zu].tool_calls[%zu].function.arguments must be a JSON string", idx, i);
        }
        if (id && !json_is_string(id) && !json_is_null(id)) {
            json_decref(out);
            return srv_fail(e, 400, "messages[%zu].tool_calls[%zu].id must be a string", idx, i);
        }
        json_t *call = json_pack("{sss{ss}}", "type", "function", "function", "name", name);
        if (!call) {
            json_decref(out);
            return srv_fail(e, 500, "out of memory");
        }
        json_object_set_new(json_object_get(call, "function"), "arguments",
                            args && !json_is_null(args) ? json_incref(args) : json_string("{}"));
        if (json_is_string(id)) json_object_set(call, "id", id);
        json_array_append_new(out, call);
    }
    if (json_object_set_new(m, "tool_calls", out) != 0) return srv_fail(e, 500, "out of memory");
    return true;
}

static bool norm_messages(json_t *msgs, const srv_limits *lim, json_t *req, srv_err *e)
{
    if (!msgs) return srv_fail(e, 400, "messages is required");
    if (!json_is_array(msgs)) return srv_fail(e, 400, "messages must be an array");
    size_t n = json_array_size(msgs);
    if (n == 0) return srv_fail(e, 400, "messages must not be empty");
    if (n > lim->max_messages) return srv_fail(e, 400, "messages: %zu (at most %zu)", n, lim->max_messages);
    json_t *out = json_array();
    if (!out || json_object_set_new(req, "messages", out) != 0) return srv_fail(e, 500, "out of memory");
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        if (!json_is_object(m)) return srv_fail(e, 400, "messages[%zu] must be an object", i);
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!role) return srv_fail(e, 400, "messages[%zu].role must be a string", i);
        bool user = strcmp(role, "user") == 0, asst = strcmp(role, "assistant") == 0, tool = strcmp(role, "tool") == 0;
        bool sys = strcmp(role, "system") == 0 || strcmp(role, "developer") == 0;
        if (!user && !asst && !tool && !sys)
            return srv_fail(e, 400, "messages[%zu]: unknown role '%s' (system, developer, user, assistant, tool)", i,
                            role);
        json_t *nm = json_pack("{ss}", "role", sys ? "system" : role);
        if (!nm || json_array_append_new(out, nm) != 0) return srv_fail(e, 500, "out of memory");
        json_t *content = json_object_get(m, "content");
        json_t *c = NULL;
        if (!norm_content(content, i, lim, &c, e)) return false;
        bool has_calls = asst && json_array_size(json_object_get(m, "tool_calls")) > 0;
        if ((!c || json_is_null(c)) && !has_calls && !asst) {
            if (c) json_decref(c);
            return srv_fail(e, 400, "messages[%zu] (%s) needs content", i, role);
        }
        json_object_set_new(nm, "content", c ? c : json_null());
        if (asst && !norm_tool_calls(json_object_get(m, "tool_calls"), i, nm, e)) return false;
        const char *s = NULL;
        if (!srv_get_str(m, "name", &s, e)) return false;
        if (s) json_object_set_new(nm, "name", json_string(s));
        s = NULL;
        if (tool && !srv_get_str(m, "tool_call_id", &s, e)) return false;
        if (s) json_object_set_new(nm, "tool_call_id", json_string(s));
        s = NULL;
        if (asst && !srv_get_str(m, "reasoning_content", &s, e)) return false;
        if (s) json_object_set_new(nm, "reasoning_content", json_string(s));
    }
    return true;
}

/* tools (OpenAI form) checked into req["tools"], with tool_choice applied. */
static bool norm_tools(json_t *body, const srv_limits *lim, json_t *req, srv_err *e)
{
    json_t *tools = json_object_get(body, "tools");
    json_t *choice = json_object_get(body, "tool_choice");
    if (!tools || json_is_null(tools)) return true;
    if (!json_is_array(tools)) return srv_fail(e, 400, "tools must be an array");
    if (json_array_size(tools) > lim->max_tools)
        return srv_fail(e, 400, "tools: %zu (at most %zu)", json_array_size(tools), lim->max_tools);
    const char *only = NULL;
    if (choice && !json_is_null(choice)) {
        const char *c = json_string_value(choice);
        if (c) {
            if (strcmp(c, "none") == 0) return true; /* rendered without tools */
            if (strcmp(c, "auto") && strcmp(c, "required"))
                return srv_fail(e, 400, "tool_choice '%s' is not one of none, auto, required", c);
        } else if (json_is_object(choice)) {
            only = json_string_value(json_object_get(json_object_get(choice, "function"), "name"));
            if (!only) return srv_fail(e, 400, "tool_choice must name a function: {\"type\": \"function\", \"function\": {\"name\": ...}}");
        } else {
            return srv_fail(e, 400, "tool_choice must be a string or an object");
        }
    }
    json_t *out = json_array();
    if (!out) return srv_fail(e, 500, "out of memory");
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *fn = json_object_get(t, "function");
        const char *type = json_string_value(json_object_get(t, "type"));
        const char *name = json_string_value(json_object_get(fn, "name"));
        json_t *desc = json_object_get(fn, "description"), *params = json_object_get(fn, "parameters");
        if (!json_is_object(t) || (type && strcmp(type, "function") != 0)) {
            json_decref(out);
            return srv_fail(e, 400, "tools[%zu] must be {\"type\": \"function\", \"function\": {...}}", i);
        }
        if (!json_is_object(fn) || !name || !*name) {
            json_decref(out);
            return srv_fail(e, 400, "tools[%zu].function.name must be a non-empty string", i);
        }
        if ((desc && !json_is_string(desc) && !json_is_null(desc)) || (params && !json_is_object(params) && !json_is_null(params))) {
            json_decref(out);
            return srv_fail(e, 400, "tools[%zu].function: description must be a string, parameters an object", i);
        }
        if (only && strcmp(name, only) != 0) continue;
        json_t *f = json_pack("{ss}", "name", name);
        if (json_is_string(desc)) json_object_set(f, "description", desc);
        json_object_set_new(f, "parameters", json_is_object(params) ? json_incref(params) : json_pack("{ss}", "type", "object"));
        /* strict: the arguments are constrained to parameters (the engine's tool grammar) */
        json_t *strict = json_object_get(fn, "strict");
        if (strict && !json_is_null(strict) && !json_is_boolean(strict)) {
            json_decref(f);
            json_decref(out);
            return srv_fail(e, 400, "tools[%zu].function.strict must be a boolean", i);
        }
        if (json_is_true(strict)) json_object_set_new(f, "strict", json_true());
        json_array_append_new(out, json_pack("{sssO}", "type", "function", "function", f));
        json_decref(f);
    }
    if (only && json_array_size(out) == 0) {
        json_decref(out);
        return srv_fail(e, 400, "tool_choice names '%s', which is not among the tools", only);
    }
    if (json_object_set_new(req, "tools", out) != 0) return srv_fail(e, 500, "out of memory");
    /* parallel_tool_calls false: at most one call (the tool grammar's) */
    json_t *par = json_object_get(body, "parallel_tool_calls");
    if (par && !json_is_null(par) && !json_is_boolean(par))
        return srv_fail(e, 400, "parallel_tool_calls must be a boolean");
    if (json_is_false(par) && json_object_set_new(req, "parallel_tool_calls", json_false()) != 0)
        return srv_fail(e, 500, "out of memory");
    bool required = json_is_string(choice) && strcmp(json_string_value(choice), "required") == 0;
    return srv_set_tool_choice(req, only, required, e);
}

/* Sampling and generation options shared by both endpoints. */
static bool common_options(json_t *b, const srv_limits *lim, json_t *req, srv_request *out, srv_err *e)
{
    const char *model = NULL;
    if (!srv_get_str(b, "model", &model, e)) return false;
    if (!srv_get_bool(b, "stream", &out->stream, e)) return false;
    json_t *so = json_object_get(b, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) return srv_fail(e, 400, "stream_options must be an object");
        if (!srv_get_bool(so, "include_usage", &out->include_usage, e)) return false;
    }
    json_t *n = json_object_get(b, "n");
    if (n && !json_is_null(n) && !(json_is_integer(n) && json_integer_value(n) == 1))
        return srv_fail(e, 400, "n must be 1 (one choice per request)");
    /* chat: logprobs true with top_logprobs 0..20 (the engine's shape is
     * OpenAI's); completions: the legacy integer logprobs 0..5 (the number
     * of top tokens; null or false: none), converted back in the answer */
    json_t *lp = json_object_get(b, "logprobs"), *top = json_object_get(b, "top_logprobs");
    if (out->api == SRV_API_CHAT) {
        if (lp && !json_is_null(lp) && !json_is_boolean(lp)) return srv_fail(e, 400, "logprobs must be a boolean");
        bool want = json_is_true(lp);
        if (top && !json_is_null(top)) {
            if (!json_is_integer(top) || json_integer_value(top) < 0 || json_integer_value(top) > 20)
                return srv_fail(e, 400, "top_logprobs must be an integer in [0, 20]");
            if (!want) return srv_fail(e, 400, "top_logprobs needs logprobs: true");
        }
        if (want && (json_object_set_new(req, "logprobs", json_true()) != 0 ||
                     (top && !json_is_null(top) && json_object_set(req, "top_logprobs", top) != 0)))
            return srv_fail(e, 500, "out of memory");
    } else if (lp && !json_is_null(lp) && !json_is_false(lp)) {
        if (!json_is_integer(lp) || json_integer_value(lp) < 0 || json_integer_value(lp) > 5)
            return srv_fail(e, 400, "logprobs must be an integer in [0, 5] on /v1/completions (the top tokens listed)");
        if (json_object_set_new(req, "logprobs", json_true()) != 0 ||
            (json_integer_value(lp) > 0 && json_object_set(req, "top_logprobs", lp) != 0))
            return srv_fail(e, 500, "out of memory");
    }
    /* logit_bias: {"token id": bias in [-100, 100]}; -100 bans the token */
    json_t *lb = json_object_get(b, "logit_bias");
    if (lb && !json_is_null(lb)) {
        if (!json_is_object(lb)) return srv_fail(e, 400, "logit_bias must be an object of token ids to biases in [-100, 100]");
        const char *k;
        json_t *x;
        json_object_foreach(lb, k, x) {
            char *end = NULL;
            long id = k[0] >= '0' && k[0] <= '9' ? strtol(k, &end, 10) : -1;
            if (id < 0 || !end || *end || id >= lim->n_vocab || (k[0] == '0' && k[1]))
                return srv_fail(e, 400, "logit_bias: '%.40s' is not a token id in [0, %d)", k, lim->n_vocab);
            if (!json_is_number(x) || json_number_value(x) < -100 || json_number_value(x) > 100)
                return srv_fail(e, 400, "logit_bias[\"%s\"] must be a number in [-100, 100]", k);
        }
        if (json_object_set(req, "logit_bias", lb) != 0) return srv_fail(e, 500, "out of memory");
    }
    bool ignore_eos = false;
    if (!srv_get_bool(b, "ignore_eos", &ignore_eos, e)) return false;
    /* llama-server's return_progress: prompt_progress chunks while the
     * prompt is read (streams only) */
    if (!srv_get_bool(b, "return_progress", &out->return_progress, e)) return false;
    if (out->return_progress && out->stream && json_object_set_new(req, "return_progress", json_true()) != 0)
        return srv_fail(e, 500, "out of memory");
    /* llama-server's grammar (GBNF): the engine compiles it (a grammar it
     * refuses is its 400, named) */
    json_t *gr = json_object_get(b, "grammar");
    if (gr && !json_is_null(gr)) {
        if (!json_is_string(gr)) return srv_fail(e, 400, "grammar must be a string (GBNF)");
        if (json_object_set(req, "grammar", gr) != 0) return srv_fail(e, 500, "out of memory");
    }
    /* llama-server's lazy grammar: the engine checks them (a 400 named) */
    json_t *gl = json_object_get(b, "grammar_lazy"), *gt = json_object_get(b, "grammar_triggers");
    if (gl && !json_is_null(gl) && json_object_set(req, "grammar_lazy", gl) != 0) return srv_fail(e, 500, "out of memory");
    if (gt && !json_is_null(gt) && json_object_set(req, "grammar_triggers", gt) != 0)
        return srv_fail(e, 500, "out of memory");
    json_t *js = json_object_get(b, "json_schema"); /* llama-server's field */
    if (js && !json_is_null(js)) {
        if (!json_is_object(js) && !json_is_boolean(js)) return srv_fail(e, 400, "json_schema must be a JSON Schema object");
        if (json_object_set(req, "json_schema", js) != 0) return srv_fail(e, 500, "out of memory");
    }
    if (ignore_eos) json_object_set_new(req, "ignore_eos", json_true());
    json_t *mct = json_object_get(b, "max_completion_tokens");
    if (!srv_copy_max_tokens(b, mct && !json_is_null(mct) ? "max_completion_tokens" : "max_tokens", req, lim, e))
        return false;
    return srv_copy_num(b, "temperature", req, "temperature", 0, 2, e) &&
           srv_copy_num(b, "top_p", req, "top_p", 0, 1, e) && srv_copy_num(b, "min_p", req, "min_p", 0, 1, e) &&
           srv_copy_int(b, "top_k", req, "top_k", -1, INT32_MAX, e) &&
           srv_copy_int(b, "seed", req, "seed", INT64_MIN, INT64_MAX, e) &&
           srv_copy_num(b, "presence_penalty", req, "presence_penalty", -2, 2, e) &&
           srv_copy_num(b, "frequency_penalty", req, "frequency_penalty", -2, 2, e) &&
           srv_copy_num(b, "repeat_penalty", req, "repeat_penalty", 1e-3, 100, e) &&
           srv_copy_int(b, "repeat_last_n", req, "repeat_last_n", 0, 1 << 20, e) && srv_copy_stop(b, "stop", req, lim, e);
}

/* A seed below 0 means "random" (OpenAI and llama.cpp clients send -1). */
static void fix_seed(json_t *req)
{
    json_t *s = json_object_get(req, "seed");
    if (s && json_integer_value(s) < 0) json_object_del(req, "seed");
}

/* continue_final_message (a trailing assistant message is continued by
 * default, as llama-server's prefill_assistant; false closes it and opens
 * a new turn) and reasoning_format (llama-server's names), passed on to
 * the engine, which checks them too (a continuation asked of a last
 * message that is not the assistant's is its 400). */
static bool prefill_options(json_t *b, json_t *req, srv_err *e)
{
    json_t *c = json_object_get(b, "continue_final_message");
    if (c && !json_is_null(c)) {
        const char *m = json_string_value(c);
        if (!json_is_boolean(c) && !(m && (strcmp(m, "content") == 0 || strcmp(m, "reasoning_content") == 0)))
            return srv_fail(e, 400, "continue_final_message must be a boolean, \"content\" or \"reasoning_content\"");
        if (json_object_set(req, "continue_final_message", c) != 0) return srv_fail(e, 500, "out of memory");
    }
    json_t *rf = json_object_get(b, "reasoning_format");
    if (rf && !json_is_null(rf)) {
        static const char *const names[] = {"none", "auto", "deepseek", "deepseek-legacy", NULL};
        const char *m = json_string_value(rf);
        bool known = false;
        for (int i = 0; m && names[i]; i++) known |= strcmp(m, names[i]) == 0;
        if (!known)
            return srv_fail(e, 400, "reasoning_format must be \"none\", \"auto\", \"deepseek\" or \"deepseek-legacy\"");
        if (json_object_set(req, "reasoning_format", rf) != 0) return srv_fail(e, 500, "out of memory");
    }
    return true;
}

static bool parse_chat(json_t *b, const srv_limits *lim, json_t *req, srv_request *out, srv_err *e)
{
    if (!common_options(b, lim, req, out, e)) return false;
    if (!norm_messages(json_object_get(b, "messages"), lim, req, e)) return false;
    if (!norm_tools(b, lim, req, e)) return false;
    /* response_format json_object / json_schema: the engine constrains the
     * answer (a schema it cannot compile is its 400, naming the keyword) */
    json_t *rf = json_object_get(b, "response_format");
    if (rf && !json_is_null(rf)) {
        const char *t = json_string_value(json_object_get(rf, "type"));
        if (!t || (strcmp(t, "text") != 0 && strcmp(t, "json_object") != 0 && strcmp(t, "json_schema") != 0))
            return srv_fail(e, 400, "response_format type must be \"text\", \"json_object\" or \"json_schema\"");
        if (json_object_set(req, "response_format", rf) != 0) return srv_fail(e, 500, "out of memory");
    }
    json_t *kw = json_object_get(b, "chat_template_kwargs");
    if (kw && !json_is_null(kw)) {
        if (!json_is_object(kw)) return srv_fail(e, 400, "chat_template_kwargs must be an object");
        json_object_set(req, "chat_template_kwargs", kw);
    }
    return prefill_options(b, req, e);
}

static bool parse_completion(json_t *b, const srv_limits *lim, json_t *req, srv_request *out, srv_err *e)
{
    if (!common_options(b, lim, req, out, e)) return false;
    json_t *echo = json_object_get(b, "echo");
    if (echo && json_is_true(echo)) return srv_fail(e, 400, "echo is not supported");
    json_t *suffix = json_object_get(b, "suffix");
    if (suffix && !json_is_null(suffix)) return srv_fail(e, 400, "suffix is not supported");
    json_t *bo = json_object_get(b, "best_of");
    if (bo && !json_is_null(bo) && !(json_is_integer(bo) && json_integer_value(bo) == 1))
        return srv_fail(e, 400, "best_of must be 1");
    json_t *p = json_object_get(b, "prompt");
    if (!p) return srv_fail(e, 400, "prompt is required");
    if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0))) p = json_array_get(p, 0);
    if (json_is_string(p)) {
        if (json_string_length(p) == 0) return srv_fail(e, 400, "prompt is empty");
        return json_object_set(req, "prompt", p) == 0 || srv_fail(e, 500, "out of memory");
    }
    if (!json_is_array(p) || json_array_size(p) == 0)
        return srv_fail(e, 400, "prompt must be a string or a non-empty array of token ids");
    if (json_array_size(p) > (size_t)lim->max_prompt_tokens)
        return srv_fail_context(e, SRV_API_COMPLETIONS, (int64_t)json_array_size(p), lim->max_prompt_tokens);
    size_t i;
    json_t *t;
    json_array_foreach(p, i, t) {
        if (json_is_string(t) || json_is_array(t))
            return srv_fail(e, 400, "prompt: one prompt per request (a string or one array of token ids)");
        if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) >= lim->n_vocab)
            return srv_fail(e, 400, "prompt[%zu] must be a token id in [0, %d)", i, lim->n_vocab);
    }
    return json_object_set(req, "prompt_tokens", p) == 0 || srv_fail(e, 500, "out of memory");
}

bool srv_openai_parse(srv_api api, json_t *body, const srv_limits *lim, srv_request *out, srv_err *e)
{
    json_t *req = json_object();
    if (!req) return srv_fail(e, 500, "out of memory");
    out->engine = req;
    bool ok = api == SRV_API_CHAT ? parse_chat(body, lim, req, out, e) : parse_completion(body, lim, req, out, e);
    if (ok) fix_seed(req);
    return ok;
}

/* ---- responses --------------------------------------------------------------------- */

static json_t *usage_json(json_t *resp)
{
    int64_t p = 0, c = 0, g = 0;
    srv_engine_usage(resp, "prompt_tokens", &p);
    srv_engine_usage(resp, "cached_tokens", &c);
    srv_engine_usage(resp, "completion_tokens", &g);
    json_t *u = json_pack("{sIsIsIs{sI}}", "prompt_tokens", (json_int_t)p, "completion_tokens", (json_int_t)g,
                          "total_tokens", (json_int_t)(p + g), "prompt_tokens_details", "cached_tokens", (json_int_t)c);
    int64_t d = -1, a = 0;
    if (u && srv_engine_usage(resp, "drafted_tokens", &d) && d >= 0 && srv_engine_usage(resp, "accepted_tokens", &a)) {
        /* speculative decoding, in the names OpenAI gives predicted outputs */
        json_t *det = json_pack("{sIsI}", "accepted_prediction_tokens", (json_int_t)a, "rejected_prediction_tokens",
                                (json_int_t)(d - a));
        if (!det || json_object_set_new(u, "completion_tokens_details", det) != 0) {
            json_decref(u);
            u = NULL;
        }
    }
    return u;
}

static const char *finish_of(json_t *resp)
{
    const char *f = json_string_value(json_object_get(resp, "finish_reason"));
    if (!f || strcmp(f, "cancelled") == 0 || strcmp(f, "error") == 0) return "stop";
    return f;
}

/* Characters (UTF-8 code points) of s. */
static int64_t n_chars(const char *s)
{
    int64_t n = 0;
    for (; s && *s; s++) n += ((unsigned char)*s & 0xc0) != 0x80;
    return n;
}

/* The legacy completions logprobs of chat-shaped entries: {"tokens",
 * "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"},
 * offsets continuing from *offset. NULL on OOM. */
static json_t *legacy_logprobs(json_t *entries, int64_t *offset)
{
    json_t *toks = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    json_t *o = toks && lps && tops && offs ? json_pack("{soso soso}", "tokens", toks, "token_logprobs", lps,
                                                        "top_logprobs", tops, "text_offset", offs)
                                            : NULL;
    if (!o) {
        if (toks) json_decref(toks);
        if (lps) json_decref(lps);
        if (tops) json_decref(tops);
        if (offs) json_decref(offs);
        return NULL;
    }
    size_t i, j;
    json_t *x, *t;
    int bad = 0;
    json_array_foreach(entries, i, x) {
        json_t *tok = json_object_get(x, "token"), *top = json_object(), *tl = json_object_get(x, "top_logprobs");
        bad |= json_array_append_new(toks, tok ? json_incref(tok) : json_string("")) != 0;
        bad |= json_array_append(lps, json_object_get(x, "logprob")) != 0;
        json_array_foreach(tl, j, t) {
            const char *k = json_string_value(json_object_get(t, "token"));
            if (top && k && !json_object_get(top, k)) bad |= json_object_set(top, k, json_object_get(t, "logprob")) != 0;
        }
        bad |= !top || json_array_append_new(tops, top) != 0;
        bad |= json_array_append_new(offs, json_integer(*offset)) != 0;
        *offset += n_chars(json_string_value(tok));
    }
    if (bad) {
        json_decref(o);
        o = NULL;
    }
    return o;
}

static json_t *envelope(const srv_meta *m, const char *object)
{
    return json_pack("{sssssIssss}", "id", m->id, "object", object, "created", (json_int_t)m->created, "model",
                     m->model, "system_fingerprint", SRV_FINGERPRINT);
}

static char *dump_free(json_t *o)
{
    if (!o) return NULL;
    char *s = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(10));
    json_decref(o);
    return s;
}

char *srv_openai_response(const srv_meta *m, json_t *resp)
{
    bool chat = m->api == SRV_API_CHAT;
    json_t *o = envelope(m, chat ? "chat.completion" : "text_completion");
    json_t *lp = json_object_get(resp, "logprobs");
    int64_t off = 0;
    json_t *lpo = !lp ? json_null() : chat ? json_incref(lp) : legacy_logprobs(json_object_get(lp, "content"), &off);
    json_t *choice = json_pack("{sisoss}", "index", 0, "logprobs", lpo, "finish_reason", finish_of(resp));
    json_t *content = json_object_get(resp, "content");
    if (!o || !choice) {
        if (o) json_decref(o);
        if (choice) json_decref(choice);
        return NULL;
    }
    if (chat) {
        json_t *msg = json_pack("{sssO}", "role", "assistant", "content", content ? content : json_null());
        json_t *rc = json_object_get(resp, "reasoning_content");
        if (json_is_string(rc) && json_string_length(rc)) json_object_set(msg, "reasoning_content", rc);
        json_t *tc = json_object_get(resp, "tool_calls");
        if (json_array_size(tc) > 0) json_object_set(msg, "tool_calls", tc);
        json_object_set_new(choice, "message", msg);
    } else {
        json_object_set_new(choice, "text", json_is_string(content) ? json_incref(content) : json_string(""));
    }
    json_object_set_new(o, "choices", json_pack("[o]", choice));
    json_object_set_new(o, "usage", usage_json(resp));
    json_t *t = json_object_get(resp, "timings");
    if (t) json_object_set(o, "timings", t);
    /* how the slot's cache was used ("cache": "reused", "partial: ...",
     * "reset: why"): an agent's operator sees why a turn was slow */
    json_t *mem = json_object_get(resp, "memory");
    if (mem) json_object_set(o, "memory", mem);
    /* whether tool calls were constrained, and how (an extension field) */
    json_t *tg = json_object_get(resp, "tool_grammar");
    if (tg) json_object_set(o, "tool_grammar", tg);
    return dump_free(o);
}

/* ---- streams -------------------------------------------------------------------------- */

static bool emit(srv_buf *out, json_t *o)
{
    if (!o) return false;
    bool ok = srv_buf_adds(out, "data: ") && srv_buf_addjson(out, o) && srv_buf_adds(out, "\n\n");
    json_decref(o);
    return ok;
}

/* A chunk with one choice: delta (chat) or text (completions) and a finish reason. */
static json_t *chunk(const srv_stream *s, json_t *delta_or_text, const char *finish)
{
    bool chat = s->m.api == SRV_API_CHAT;
    json_t *o = envelope(&s->m, chat ? "chat.completion.chunk" : "text_completion");
    json_t *c = json_pack("{siso}", "index", 0, "logprobs", json_null());
    if (!o || !c || !delta_or_text) {
        if (o) json_decref(o);
        if (c) json_decref(c);
        if (delta_or_text) json_decref(delta_or_text);
        return NULL;
    }
    json_object_set_new(c, chat ? "delta" : "text", delta_or_text);
    json_object_set_new(c, "finish_reason", finish ? json_string(finish) : json_null());
    json_object_set_new(o, "choices", json_pack("[o]", c));
    return o;
}

/* The logprobs entries that arrived since the last chunk go with this one
 * (each chunk carries the entries of the tokens before its text; the
 * concatenation is the answer's logprobs.content). */
static json_t *with_logprobs(srv_stream *s, json_t *o)
{
    if (!o || !s->lp) return o;
    json_t *c = json_array_get(json_object_get(o, "choices"), 0);
    json_t *v = s->m.api == SRV_API_CHAT ? json_pack("{sO}", "content", s->lp) : legacy_logprobs(s->lp, &s->lp_offset);
    if (!v || json_object_set_new(c, "logprobs", v) != 0) {
        json_decref(o);
        o = NULL;
    }
    json_decref(s->lp);
    s->lp = NULL;
    return o;
}

static bool start(srv_stream *s, srv_buf *out)
{
    if (s->started) return true;
    s->started = true;
    if (s->m.api != SRV_API_CHAT) return true;
    return emit(out, chunk(s, json_pack("{ssss}", "role", "assistant", "content", ""), NULL));
}

/* A chunk with llama-server's prompt_progress {total, cache, processed,
 * time_ms}: processed counts the cached tokens too. */
static bool progress_chunk(srv_stream *s, int64_t total, int64_t cache, int64_t processed, double ms, srv_buf *out)
{
    bool chat = s->m.api == SRV_API_CHAT;
    json_t *o = chunk(s, chat ? json_pack("{ssso}", "role", "assistant", "content", json_null()) : json_string(""), NULL);
    json_t *p = json_pack("{sIsIsIsI}", "total", (json_int_t)total, "cache", (json_int_t)cache, "processed",
                          (json_int_t)processed, "time_ms", (json_int_t)(ms + 0.5));
    if (!o || !p) {
        if (o) json_decref(o);
        if (p) json_decref(p);
        return false;
    }
    if (json_object_set_new(o, "prompt_progress", p) != 0) {
        json_decref(o);
        return false;
    }
    return emit(out, o);
}

bool srv_openai_event(srv_stream *s, const keel_event *ev, srv_buf *out)
{
    if (!start(s, out)) return false;
    bool chat = s->m.api == SRV_API_CHAT;
    json_t *d = NULL;
    switch (ev->kind) {
    case KEEL_EVENT_PROMPT: /* the prefill starts: 0% of what is left */
        if (!s->progress) return true;
        return progress_chunk(s, ev->n_prompt_tokens, ev->n_cached_tokens, ev->n_cached_tokens, 0.0, out);
    case KEEL_EVENT_PROGRESS:
        if (!s->progress) return true;
        return progress_chunk(s, ev->n_prompt_tokens, ev->n_cached_tokens, ev->n_processed, ev->elapsed_ms, out);
    case KEEL_EVENT_LOGPROB: {
        json_t *x = json_loadb(ev->text, ev->len, JSON_ALLOW_NUL, NULL);
        if (!x) return false;
        if (!s->lp && !(s->lp = json_array())) {
            json_decref(x);
            return false;
        }
        return json_array_append_new(s->lp, x) == 0;
    }
    case KEEL_EVENT_CONTENT:
        if (!ev->len) return true;
        if (!chat) return emit(out, with_logprobs(s, chunk(s, srv_json_text(ev->text, ev->len), NULL)));
        d = json_pack("{so}", "content", srv_json_text(ev->text, ev->len));
        break;
    case KEEL_EVENT_REASONING:
        if (!ev->len || !chat) return true;
        d = json_pack("{so}", "reasoning_content", srv_json_text(ev->text, ev->len));
        break;
    case KEEL_EVENT_TOOL_BEGIN:
        if (!chat) return true;
        d = json_pack("{s[{sisssss{ssss}}]}", "tool_calls", "index", ev->index, "id", ev->id ? ev->id : "", "type",
                      "function", "function", "name", ev->name ? ev->name : "", "arguments", "");
        s->n_tools++;
        break;
    case KEEL_EVENT_TOOL_ARGS:
        if (!ev->len || !chat) return true;
        d = json_pack("{s[{sis{so}}]}", "tool_calls", "index", ev->index, "function", "arguments",
                      srv_json_text(ev->text, ev->len));
        break;
    default:
        return true;
    }
    return emit(out, with_logprobs(s, chunk(s, d, NULL)));
}

bool srv_openai_done(srv_stream *s, json_t *resp, srv_buf *out)
{
    if (!start(s, out)) return false;
    bool chat = s->m.api == SRV_API_CHAT;
    json_t *last = chunk(s, chat ? json_object() : json_string(""), finish_of(resp));
    json_t *t = json_object_get(resp, "timings"), *lp = json_object_get(resp, "logprobs");
    if (last && t) json_object_set(last, "timings", t);
    json_t *mem = json_object_get(resp, "memory");
    if (last && mem) json_object_set(last, "memory", mem);
    json_t *tg = json_object_get(resp, "tool_grammar");
    if (last && tg) json_object_set(last, "tool_grammar", tg);
    /* the entries whose text never went out (held back, or a stop string)
     * in the last chunk: clients concatenate the chunks' entries */
    if (last && lp && !s->lp) s->lp = json_array();
    if (lp) last = with_logprobs(s, last);
    if (!emit(out, last)) return false;
    if (s->include_usage) {
        json_t *u = envelope(&s->m, chat ? "chat.completion.chunk" : "text_completion");
        if (!u) return false;
        json_object_set_new(u, "choices", json_array());
        json_object_set_new(u, "usage", usage_json(resp));
        if (!emit(out, u)) return false;
    }
    return srv_buf_adds(out, "data: [DONE]\n\n");
}
