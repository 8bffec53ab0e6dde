/*
 * eng_prompt.c — requests of the chat engine: options JSON -> eng_opts,
 * request JSON -> eng_req, and the prompt tokens of a request (chat
 * messages rendered through the template, raw text, or ids).
 *
 * Messages are passed to the template as Hugging Face passes them:
 * content parts of type "text" are joined (newline-separated) into one
 * string, and tool-call arguments given as a JSON string (OpenAI's wire
 * form) become the object they encode, as templates expect.
 */
#include "eng.h"

#include "../grammar/grammar.h"

#include <math.h>
#include <string.h>

#define ENG_MAX_STOP 16
#define ENG_MAX_STOP_BYTES 1024

void eng_opts_init(const keel_engine *e, eng_opts *o)
{
    memset(o, 0, sizeof *o);
    o->samp = keel_sampler_params_default();
    o->samp.seed = 0;
    o->max_tokens = -1;
    o->compact = e->compact_default;
    o->add_generation_prompt = true;
    o->cont = -1;
    o->parse_tools = true;
    o->parse_reasoning = true;
    o->strict_tools = -1;
}

void eng_opts_free(eng_opts *o)
{
    for (int32_t i = 0; i < o->n_stop; i++) base_strfree(o->stop[i]);
    base_free(o->stop, (size_t)ENG_MAX_STOP * sizeof(char *));
    o->stop = NULL;
    o->n_stop = 0;
    if (o->template_kwargs) json_decref(o->template_kwargs);
    o->template_kwargs = NULL;
    base_strfree(o->tool_name);
    o->tool_name = NULL;
    base_free(o->bias_tok, (size_t)o->n_bias * sizeof(int32_t));
    base_free(o->bias, (size_t)o->n_bias * sizeof(float));
    o->bias_tok = NULL;
    o->bias = NULL;
    o->n_bias = 0;
    keel_grammar_close(o->grammar);
    o->grammar = NULL;
    base_free(o->grammar_text, o->grammar_len + 1);
    o->grammar_text = NULL;
    o->grammar_len = 0;
    o->grammar_lazy = false;
    o->tool_forced = false;
    eng_lazy_opts_free(o);
}

/* logit_bias: {"token id": bias}, OpenAI's form: ids as decimal strings
 * (no sign, no leading zero) in [0, n_vocab), biases numbers in [-100,
 * 100]. Replaces any earlier bias. */
static keel_status parse_logit_bias(const keel_engine *e, json_t *v, eng_opts *o, char *err)
{
    if (json_is_null(v)) return KEEL_OK;
    if (!json_is_object(v))
        return base_err(err, KEEL_EINVAL, "logit_bias must be an object of token ids to biases in [-100, 100]");
    int32_t n_vocab = e->model->w.hp.n_vocab;
    size_t n = json_object_size(v);
    if (n > (size_t)n_vocab)
        return base_err(err, KEEL_EINVAL, "logit_bias: %zu entries, more than the %d tokens", n, n_vocab);
    int32_t *tok = n ? base_alloc(n * sizeof(int32_t)) : NULL;
    float *bias = n ? base_alloc(n * sizeof(float)) : NULL;
    keel_status st = KEEL_OK;
    if (n && (!tok || !bias)) st = base_err(err, KEEL_ENOMEM, "logit_bias: out of memory");
    const char *k;
    json_t *x;
    int32_t i = 0;
    json_object_foreach(v, k, x) {
        if (st != KEEL_OK) break;
        int64_t id = 0;
        bool ok = k[0] >= '0' && k[0] <= '9' && (k[0] != '0' || k[1] == 0);
        for (const char *p = k; ok && *p; p++) {
            ok = *p >= '0' && *p <= '9' && id < n_vocab;
            id = id * 10 + (*p - '0');
        }
        if (!ok || id >= n_vocab) {
            st = base_err(err, KEEL_EINVAL, "logit_bias: key '%.40s' is not a token id in [0, %d)", k, n_vocab);
        } else if (!json_is_number(x) || json_number_value(x) < -100.0 || json_number_value(x) > 100.0) {
            st = base_err(err, KEEL_EINVAL, "logit_bias[\"%s\"] must be a number in [-100, 100]", k);
        } else {
            tok[i] = (int32_t)id;
            bias[i] = (float)json_number_value(x);
            i++;
        }
    }
    if (st != KEEL_OK) {
        base_free(tok, n * sizeof(int32_t));
        base_free(bias, n * sizeof(float));
        return st;
    }
    base_free(o->bias_tok, (size_t)o->n_bias * sizeof(int32_t));
    base_free(o->bias, (size_t)o->n_bias * sizeof(float));
    o->bias_tok = tok;
    o->bias = bias;
    o->n_bias = (int32_t)n;
    return KEEL_OK;
}

/* tool_choice: "auto", "none", "required" (or Anthropic's "any"), or a
 * named tool: {"name": N}, {"type": "function", "function": {"name": N}}
 * or {"type": "tool", "name": N}. */
static keel_status parse_tool_choice(json_t *v, eng_opts *o, char *err)
{
    const char *name = NULL;
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        if (strcmp(s, "auto") == 0) o->tool_choice = ENG_TOOLS_AUTO;
        else if (strcmp(s, "none") == 0) o->tool_choice = ENG_TOOLS_NONE;
        else if (strcmp(s, "required") == 0 || strcmp(s, "any") == 0) o->tool_choice = ENG_TOOLS_REQUIRED;
        else return base_err(err, KEEL_EINVAL, "tool_choice '%s' is not one of auto, none, required", s);
    } else if (json_is_object(v)) {
        json_t *f = json_object_get(v, "function");
        name = json_string_value(json_object_get(f ? f : v, "name"));
        if (!name || !name[0]) return base_err(err, KEEL_EINVAL, "tool_choice: an object must name a tool");
        o->tool_choice = ENG_TOOLS_REQUIRED;
    } else {
        return base_err(err, KEEL_EINVAL, "tool_choice must be a string or an object");
    }
    base_strfree(o->tool_name);
    o->tool_name = NULL;
    if (name && !(o->tool_name = base_strdup(name))) return base_err(err, KEEL_ENOMEM, "out of memory");
    return KEEL_OK;
}

static keel_status num_f(json_t *v, const char *k, double lo, double hi, float *out, char *err)
{
    if (!json_is_number(v)) return base_err(err, KEEL_EINVAL, "%s must be a number", k);
    double d = json_number_value(v);
    if (!isfinite(d) || d < lo || d > hi)
        return base_err(err, KEEL_EINVAL, "%s %g out of range [%g, %g]", k, d, lo, hi);
    *out = (float)d;
    return KEEL_OK;
}

static keel_status num_i(json_t *v, const char *k, int64_t lo, int64_t hi, int64_t *out, char *err)
{
    if (!json_is_integer(v)) return base_err(err, KEEL_EINVAL, "%s must be an integer", k);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return base_err(err, KEEL_EINVAL, "%s %lld out of range [%lld, %lld]", k, (long long)x,
                        (long long)lo, (long long)hi);
    *out = x;
    return KEEL_OK;
}

static keel_status parse_stop(json_t *v, eng_opts *o, char *err)
{
    json_t *one = NULL;
    size_t n = 1;
    if (json_is_string(v))
        one = v;
    else if (json_is_array(v))
        n = json_array_size(v);
    else if (json_is_null(v))
        return KEEL_OK;
    else
        return base_err(err, KEEL_EINVAL, "stop must be a string or an array of strings");
    if (n > ENG_MAX_STOP) return base_err(err, KEEL_EINVAL, "stop: %zu strings (at most %d)", n, ENG_MAX_STOP);
    if (!o->stop) {
        o->stop = base_calloc(ENG_MAX_STOP, sizeof(char *));
        if (!o->stop) return base_err(err, KEEL_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        json_t *s = one ? one : json_array_get(v, i);
        if (!json_is_string(s)) return base_err(err, KEEL_EINVAL, "stop[%zu] must be a string", i);
        size_t len = json_string_length(s);
        if (len == 0) continue; /* an empty stop string matches nothing useful */
        if (len > ENG_MAX_STOP_BYTES)
            return base_err(err, KEEL_EINVAL, "stop[%zu]: %zu bytes (at most %d)", i, len, ENG_MAX_STOP_BYTES);
        if (memchr(json_string_value(s), 0, len))
            return base_err(err, KEEL_EINVAL, "stop[%zu] holds a NUL byte", i);
        char *c = base_strdup(json_string_value(s));
        if (!c) return base_err(err, KEEL_ENOMEM, "out of memory");
        o->stop[o->n_stop++] = c;
    }
    return KEEL_OK;
}

static keel_status parse_compact(const keel_engine *e, json_t *v, keel_compact_params *out, char *err)
{
    keel_compact_params p = keel_compact_params_default();
    json_t *pol = v;
    if (json_is_object(v)) pol = json_object_get(v, "policy");
    if (!json_is_string(pol)) return base_err(err, KEEL_EINVAL, "kv_compact: policy must be a string (none, window, keydiff, knorm, random)");
    if (keel_compact_policy_from_name(json_string_value(pol), &p.policy) != KEEL_OK)
        return base_err(err, KEEL_EINVAL, "kv_compact: unknown policy '%s' (none, window, keydiff, knorm, random)",
                        json_string_value(pol));
    if (p.policy != KEEL_COMPACT_NONE) {
        p.trigger = e->n_ctx_slot;
        p.target = p.trigger / 2;
    }
    if (json_is_object(v)) {
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x) {
            int64_t i = 0;
            keel_status st = KEEL_OK;
            if (strcmp(k, "policy") == 0) continue;
            if (strcmp(k, "trigger") == 0) {
                if ((st = num_i(x, "kv_compact.trigger", 1, INT32_MAX, &i, err)) == KEEL_OK) p.trigger = (int32_t)i;
            } else if (strcmp(k, "target") == 0) {
                if ((st = num_i(x, "kv_compact.target", 1, INT32_MAX, &i, err)) == KEEL_OK) p.target = (int32_t)i;
            } else if (strcmp(k, "sinks") == 0) {
                if ((st = num_i(x, "kv_compact.sinks", 0, INT32_MAX, &i, err)) == KEEL_OK) p.n_sink = (int32_t)i;
            } else if (strcmp(k, "recent") == 0) {
                st = num_f(x, "kv_compact.recent", 0.0, 1.0, &p.recent, err);
            } else if (strcmp(k, "positions") == 0) {
                const char *s = json_string_value(x);
                if (!s || (strcmp(s, "keep") && strcmp(s, "renumber")))
                    st = base_err(err, KEEL_EINVAL, "kv_compact.positions must be \"keep\" or \"renumber\"");
                else
                    p.renumber = strcmp(s, "renumber") == 0;
            } else if (strcmp(k, "seed") == 0) {
                if ((st = num_i(x, "kv_compact.seed", 0, INT64_MAX, &i, err)) == KEEL_OK) p.seed = (uint64_t)i;
            } else {
                st = base_err(err, KEEL_EINVAL, "kv_compact: unknown member '%s'", k);
            }
            if (st != KEEL_OK) return st;
        }
    }
    char why[BASE_ERR_CAP];
    if (keel_compact_params_check(&p, why) != KEEL_OK)
        return base_err(err, KEEL_EINVAL, "kv_compact: %s", why);
    *out = p;
    return KEEL_OK;
}

/* Members of a request object that are not options (skipped by the
 * options parser when allow_other is set). */
static bool is_request_member(const char *k)
{
    static const char *const names[] = {"messages", "tools", "prompt", "prompt_tokens", NULL};
    for (int i = 0; names[i]; i++)
        if (strcmp(k, names[i]) == 0) return true;
    return false;
}

static keel_status eng_opts_parse_members(const keel_engine *e, json_t *obj, bool allow_other, eng_opts *o, char *err,
                                          json_t **schema_out, json_t **rf_out, json_t *any_object);

/* A schema for the request: its grammar replaces any other (one of
 * grammar, json_schema, response_format json may be given). */
static keel_status schema_grammar(json_t *schema, eng_opts *o, char *err)
{
    if (o->grammar) return base_err(err, KEEL_EINVAL, "give one of grammar, json_schema and a JSON response_format");
    char *text = json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!text) return base_err(err, KEEL_ENOMEM, "json_schema: out of memory");
    char *g = NULL, why[BASE_ERR_CAP] = "";
    size_t n = 0;
    keel_status st = gram_schema_gbnf(text, strlen(text), &g, &n, why);
    chat_json_free(text);
    if (st == KEEL_OK && (st = keel_grammar_compile(g, n, &o->grammar, why)) != KEEL_OK) base_free(g, n + 1);
    if (st != KEEL_OK) return base_err(err, st == KEEL_ENOMEM ? KEEL_ENOMEM : KEEL_EINVAL, "%s", why);
    /* a schema no value satisfies (false, or constraints that contradict
     * each other) compiles to the empty language: refused here, up front,
     * rather than at the first token */
    bool empty = false;
    st = keel_grammar_accepts_nothing(o->grammar, &empty, why);
    if (st == KEEL_OK && empty)
        st = base_err(why, KEEL_EINVAL, "json schema: the schema accepts nothing (no value is valid), so nothing can be generated");
    if (st != KEEL_OK) {
        keel_grammar_close(o->grammar);
        o->grammar = NULL;
        base_free(g, n + 1);
        return base_err(err, st == KEEL_ENOMEM ? KEEL_ENOMEM : KEEL_EINVAL, "%s", why);
    }
    o->grammar_text = g; /* the generated GBNF: parked matchers are found by it */
    o->grammar_len = n;
    return KEEL_OK;
}

keel_status eng_opts_parse(const keel_engine *e, json_t *obj, bool allow_other, eng_opts *o, char *err)
{
    if (!obj) return KEEL_OK;
    if (!json_is_object(obj)) return base_err(err, KEEL_EINVAL, "options must be a JSON object");
    json_t *schema = NULL, *rf_schema = NULL, *any_object = json_pack("{s:s}", "type", "object");
    if (!any_object) return base_err(err, KEEL_ENOMEM, "out of memory");
    keel_status fst = eng_opts_parse_members(e, obj, allow_other, o, err, &schema, &rf_schema, any_object);
    if (fst == KEEL_OK && schema && rf_schema)
        fst = base_err(err, KEEL_EINVAL, "give one of json_schema and a JSON response_format");
    if (fst == KEEL_OK && (schema || rf_schema)) fst = schema_grammar(schema ? schema : rf_schema, o, err);
    /* a lazy grammar needs its grammar and a trigger; triggers alone mean nothing */
    if (fst == KEEL_OK && o->grammar_lazy && !o->grammar)
        fst = base_err(err, KEEL_EINVAL, "grammar_lazy needs a grammar (grammar, json_schema or response_format)");
    if (fst == KEEL_OK && o->grammar_lazy && o->n_trig + o->n_trig_tok == 0)
        fst = base_err(err, KEEL_EINVAL, "grammar_lazy needs grammar_triggers");
    if (fst == KEEL_OK && !o->grammar_lazy && o->n_trig + o->n_trig_tok > 0)
        fst = base_err(err, KEEL_EINVAL, "grammar_triggers need grammar_lazy: true");
    json_decref(any_object);
    return fst;
}

static keel_status eng_opts_parse_members(const keel_engine *e, json_t *obj, bool allow_other, eng_opts *o, char *err,
                                          json_t **schema_out, json_t **rf_out, json_t *any_object)
{
    json_t *schema = NULL, *rf_schema = NULL;
    const char *k;
    json_t *v;
    json_object_foreach(obj, k, v) {
        keel_status st = KEEL_OK;
        int64_t i = 0;
        if (strcmp(k, "max_tokens") == 0 || strcmp(k, "max_completion_tokens") == 0 ||
            strcmp(k, "n_predict") == 0) {
            if (json_is_null(v)) continue;
            if ((st = num_i(v, k, -1, INT32_MAX, &i, err)) == KEEL_OK) o->max_tokens = (int32_t)i;
        } else if (strcmp(k, "temperature") == 0) {
            st = num_f(v, k, 0.0, 100.0, &o->samp.temp, err);
        } else if (strcmp(k, "top_p") == 0) {
            st = num_f(v, k, 0.0, 1.0, &o->samp.top_p, err);
        } else if (strcmp(k, "min_p") == 0) {
            st = num_f(v, k, 0.0, 1.0, &o->samp.min_p, err);
        } else if (strcmp(k, "top_k") == 0) {
            if ((st = num_i(v, k, -1, INT32_MAX, &i, err)) == KEEL_OK) o->samp.top_k = (int32_t)i;
        } else if (strcmp(k, "seed") == 0) {
            if (json_is_null(v)) continue;
            if ((st = num_i(v, k, -1, INT64_MAX, &i, err)) == KEEL_OK) o->samp.seed = i < 0 ? 0 : (uint64_t)i;
        } else if (strcmp(k, "repeat_penalty") == 0) {
            st = num_f(v, k, 1e-3, 100.0, &o->samp.repeat_penalty, err);
        } else if (strcmp(k, "repeat_last_n") == 0) {
            if ((st = num_i(v, k, 0, 1 << 20, &i, err)) == KEEL_OK) o->samp.repeat_last_n = (int32_t)i;
        } else if (strcmp(k, "presence_penalty") == 0) {
            st = num_f(v, k, -2.0, 2.0, &o->samp.presence_penalty, err);
        } else if (strcmp(k, "frequency_penalty") == 0) {
            st = num_f(v, k, -2.0, 2.0, &o->samp.frequency_penalty, err);
        } else if (strcmp(k, "stop") == 0 || strcmp(k, "stop_sequences") == 0) {
            st = parse_stop(v, o, err);
        } else if (strcmp(k, "kv_compact") == 0) {
            if ((st = parse_compact(e, v, &o->compact, err)) == KEEL_OK) o->compact_set = true;
        } else if (strcmp(k, "chat_template_kwargs") == 0) {
            if (!json_is_object(v)) {
                st = base_err(err, KEEL_EINVAL, "chat_template_kwargs must be an object");
            } else {
                if (o->template_kwargs) json_decref(o->template_kwargs);
                o->template_kwargs = json_incref(v);
            }
        } else if (strcmp(k, "ignore_eos") == 0) {
            if (!json_is_boolean(v))
                st = base_err(err, KEEL_EINVAL, "ignore_eos must be a boolean");
            else
                o->ignore_eos = json_is_true(v);
        } else if (strcmp(k, "tool_choice") == 0) {
            st = parse_tool_choice(v, o, err);
        } else if (strcmp(k, "return_progress") == 0) {
            if (!json_is_boolean(v))
                st = base_err(err, KEEL_EINVAL, "return_progress must be a boolean");
            else
                o->progress = json_is_true(v);
        } else if (strcmp(k, "logprobs") == 0) {
            if (!json_is_boolean(v))
                st = base_err(err, KEEL_EINVAL, "logprobs must be a boolean");
            else
                o->logprobs = json_is_true(v);
        } else if (strcmp(k, "logit_bias") == 0) {
            st = parse_logit_bias(e, v, o, err);
        } else if (strcmp(k, "top_logprobs") == 0) {
            if (json_is_null(v)) continue;
            if ((st = num_i(v, k, 0, ENG_MAX_TOP_LOGPROBS, &i, err)) == KEEL_OK) o->top_logprobs = (int32_t)i;
        } else if (strcmp(k, "reasoning_format") == 0) {
            /* llama-server's names: "none" leaves reasoning in the content;
             * "auto", "deepseek" and "deepseek-legacy" parse it out */
            static const char *const parsed[] = {"auto", "deepseek", "deepseek-legacy", "deepseek_legacy", NULL};
            const char *m = json_string_value(v);
            bool known = m && strcmp(m, "none") == 0;
            for (int q = 0; m && parsed[q]; q++) known |= strcmp(m, parsed[q]) == 0;
            if (!known)
                st = base_err(err, KEEL_EINVAL, "reasoning_format must be \"none\", \"auto\", \"deepseek\" or "
                                                "\"deepseek-legacy\"");
            else
                o->parse_reasoning = strcmp(m, "none") != 0;
        } else if (strcmp(k, "response_format") == 0) {
            /* {"type": "text" | "json_object" | "json_schema", ...}: the answer is JSON */
            const char *t = json_string_value(json_object_get(v, "type"));
            if (json_is_null(v)) continue;
            if (!t || (strcmp(t, "text") != 0 && strcmp(t, "json_object") != 0 && strcmp(t, "json_schema") != 0)) {
                st = base_err(err, KEEL_EINVAL,
                              "response_format must be an object with type \"text\", \"json_object\" or \"json_schema\"");
            } else {
                o->json_answer = strcmp(t, "text") != 0;
                /* the answer is constrained: json_object to any object,
                 * json_schema to {"json_schema": {"schema": S}} */
                json_t *sc = strcmp(t, "json_schema") == 0 ? json_object_get(json_object_get(v, "json_schema"), "schema")
                                                            : NULL;
                if (strcmp(t, "json_schema") == 0 && !json_is_object(sc) && !json_is_boolean(sc))
                    st = base_err(err, KEEL_EINVAL, "response_format json_schema needs {\"json_schema\": {\"schema\": {...}}}");
                else if (strcmp(t, "text") != 0)
                    rf_schema = sc ? sc : any_object;
            }
        } else if (strcmp(k, "json_schema") == 0) {
            /* llama-server's field: a schema object */
            if (json_is_null(v)) continue;
            if (!json_is_object(v) && !json_is_boolean(v))
                st = base_err(err, KEEL_EINVAL, "json_schema must be a JSON Schema (an object)");
            else
                schema = v;
        } else if (strcmp(k, "grammar") == 0) {
            /* GBNF text; null or "" : none */
            if (json_is_null(v)) continue;
            if (!json_is_string(v)) {
                st = base_err(err, KEEL_EINVAL, "grammar must be a string (GBNF)");
            } else {
                keel_grammar_close(o->grammar);
                o->grammar = NULL;
                base_free(o->grammar_text, o->grammar_len + 1);
                o->grammar_text = NULL;
                o->grammar_len = 0;
                char why[BASE_ERR_CAP] = "";
                size_t n = json_string_length(v);
                if (n > 0 && (st = keel_grammar_compile(json_string_value(v), n, &o->grammar, why)) != KEEL_OK) {
                    st = base_err(err, st == KEEL_ENOMEM ? KEEL_ENOMEM : KEEL_EINVAL, "grammar: %s", why);
                } else if (n > 0) {
                    if (!(o->grammar_text = base_alloc(n + 1))) {
                        st = base_err(err, KEEL_ENOMEM, "grammar: out of memory");
                    } else {
                        memcpy(o->grammar_text, json_string_value(v), n + 1);
                        o->grammar_len = n;
                    }
                }
            }
        } else if (strcmp(k, "grammar_lazy") == 0) {
            if (!json_is_boolean(v))
                st = base_err(err, KEEL_EINVAL, "grammar_lazy must be a boolean");
            else
                o->grammar_lazy = json_is_true(v);
        } else if (strcmp(k, "grammar_triggers") == 0) {
            st = eng_lazy_triggers(e, v, o, err);
        } else if (strcmp(k, "parallel_tool_calls") == 0) {
            if (!json_is_boolean(v))
                st = base_err(err, KEEL_EINVAL, "parallel_tool_calls must be a boolean");
            else
                o->one_call = json_is_false(v);
        } else if (strcmp(k, "strict_tools") == 0) {
            const char *m = json_string_value(v);
            if (json_is_boolean(v))
                o->strict_tools = json_is_true(v) ? 1 : 0;
            else if (m && strcmp(m, "auto") == 0)
                o->strict_tools = -1;
            else
                st = base_err(err, KEEL_EINVAL, "strict_tools must be a boolean or \"auto\"");
        } else if (strcmp(k, "continue_final_message") == 0) {
            const char *m = json_string_value(v);
            if (json_is_boolean(v))
                o->cont = json_is_true(v) ? -1 : 0;
            else if (m && strcmp(m, "content") == 0)
                o->cont = TOOLCALL_CONT_CONTENT;
            else if (m && (strcmp(m, "reasoning_content") == 0 || strcmp(m, "reasoning") == 0))
                o->cont = TOOLCALL_CONT_REASONING;
            else if (m && strcmp(m, "auto") == 0)
                o->cont = -1;
            else
                st = base_err(err, KEEL_EINVAL,
                              "continue_final_message must be a boolean, \"content\" or \"reasoning_content\"");
        } else if (strcmp(k, "add_generation_prompt") == 0) {
            if (!json_is_boolean(v))
                st = base_err(err, KEEL_EINVAL, "add_generation_prompt must be a boolean");
            else
                o->add_generation_prompt = json_is_true(v);
        } else if (!allow_other && !is_request_member(k)) {
            st = base_err(err, KEEL_EINVAL, "unknown option '%s'", k);
        }
        if (st != KEEL_OK) return st;
    }
    *schema_out = schema;
    *rf_out = rf_schema;
    if (o->top_logprobs > 0 && !o->logprobs)
        return base_err(err, KEEL_EINVAL, "top_logprobs needs logprobs: true");
    if (o->samp.seed == 0) o->samp.seed = keel_time_ns() ^ 0x9e3779b97f4a7c15ull;
    return KEEL_OK;
}

void eng_req_free(eng_req *r)
{
    if (!r) return;
    if (r->messages) json_decref(r->messages);
    if (r->tools) json_decref(r->tools);
    base_free(r->text, r->text_len + 1);
    base_free(r->tokens, (size_t)r->n_tokens * sizeof(int32_t));
    base_free(r->response, r->response_len + 1);
    eng_opts_free(&r->o);
    base_free(r, sizeof *r);
}

/* OpenAI content (string, null or parts) as the string templates expect. */
static keel_status flatten_content(json_t *msg, size_t idx, char *err)
{
    json_t *c = json_object_get(msg, "content");
    if (!c || json_is_string(c) || json_is_null(c)) return KEEL_OK;
    if (!json_is_array(c))
        return base_err(err, KEEL_EINVAL, "messages[%zu].content must be a string or an array of parts", idx);
    size_t total = 0;
    for (size_t i = 0; i < json_array_size(c); i++) {
        json_t *part = json_array_get(c, i);
        const char *type = json_string_value(json_object_get(part, "type"));
        json_t *text = json_object_get(part, "text");
        if (!type || strcmp(type, "text") != 0 || !json_is_string(text))
            return base_err(err, KEEL_EINVAL,
                            "messages[%zu].content[%zu]: only parts of type \"text\" are supported%s%s", idx,
                            i, type ? " (got " : "", type ? type : "");
        total += json_string_length(text) + 1;
    }
    char *buf = base_alloc(total + 1);
    if (!buf) return base_err(err, KEEL_ENOMEM, "out of memory");
    size_t n = 0;
    for (size_t i = 0; i < json_array_size(c); i++) {
        json_t *text = json_object_get(json_array_get(c, i), "text");
        if (i) buf[n++] = '\n';
        memcpy(buf + n, json_string_value(text), json_string_length(text));
        n += json_string_length(text);
    }
    json_t *s = json_stringn(buf, n);
    base_free(buf, total + 1);
    if (!s) return base_err(err, KEEL_EINVAL, "messages[%zu].content is not valid UTF-8", idx);
    return json_object_set_new(msg, "content", s) == 0 ? KEEL_OK : base_err(err, KEEL_ENOMEM, "out of memory");
}

/* Tool-call arguments given as a JSON string become the object. */
static keel_status unwrap_arguments(json_t *msg, size_t idx, char *err)
{
    json_t *calls = json_object_get(msg, "tool_calls");
    if (!calls || json_is_null(calls)) return KEEL_OK;
    if (!json_is_array(calls)) return base_err(err, KEEL_EINVAL, "messages[%zu].tool_calls must be an array", idx);
    for (size_t i = 0; i < json_array_size(calls); i++) {
        json_t *fn = json_object_get(json_array_get(calls, i), "function");
        if (!json_is_object(fn) || !json_is_string(json_object_get(fn, "name")))
            return base_err(err, KEEL_EINVAL, "messages[%zu].tool_calls[%zu].function needs a name", idx, i);
        json_t *a = json_object_get(fn, "arguments");
        if (!json_is_string(a)) continue;
        json_t *obj = json_loadb(json_string_value(a), json_string_length(a), JSON_DECODE_ANY, NULL);
        if (!obj) continue; /* not JSON: the template gets the string */
        if (json_object_set_new(fn, "arguments", obj) != 0) return base_err(err, KEEL_ENOMEM, "out of memory");
    }
    return KEEL_OK;
}

/* Whether message m asks for a cache breakpoint: "cache_control" on the
 * message or on one of its content parts (Anthropic's blocks, kept by the
 * server's converter; some OpenAI clients send it too). */
static bool wants_break(json_t *m)
{
    if (json_object_get(m, "cache_control")) return true;
    json_t *c = json_object_get(m, "content");
    size_t i;
    json_t *part;
    if (json_is_array(c))
        json_array_foreach(c, i, part) if (json_is_object(part) && json_object_get(part, "cache_control")) return true;
    return false;
}

static keel_status check_messages(eng_req *r, json_t *msgs, char *err)
{
    if (!json_is_array(msgs)) return base_err(err, KEEL_EINVAL, "messages must be an array");
    if (json_array_size(msgs) == 0) return base_err(err, KEEL_EINVAL, "messages is empty");
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        json_t *m = json_array_get(msgs, i);
        if (!json_is_object(m)) return base_err(err, KEEL_EINVAL, "messages[%zu] must be an object", i);
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!role) return base_err(err, KEEL_EINVAL, "messages[%zu].role must be a string", i);
        if (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant") &&
            strcmp(role, "tool") && strcmp(role, "developer"))
            return base_err(err, KEEL_EINVAL, "messages[%zu]: unknown role '%s'", i, role);
        if (wants_break(m)) { /* the last ENG_MAX_BREAKS are kept */
            if (r->n_breaks == ENG_MAX_BREAKS) {
                memmove(r->breaks, r->breaks + 1, (ENG_MAX_BREAKS - 1) * sizeof r->breaks[0]);
                r->n_breaks--;
            }
            r->breaks[r->n_breaks++] = (int32_t)i;
            json_object_del(m, "cache_control"); /* the template sees the message as sent */
        }
        keel_status st = flatten_content(m, i, err);
        if (st == KEEL_OK) st = unwrap_arguments(m, i, err);
        if (st != KEEL_OK) return st;
    }
    return KEEL_OK;
}

/* Whether the last message, the assistant's, is continued (a prefill)
 * rather than closed, and how: continue_final_message, by default when the
 * last message is the assistant's and holds no tool calls; reasoning when
 * it has reasoning and no content yet. */
static keel_status continued(eng_req *r, char *err)
{
    size_t n = json_array_size(r->messages);
    json_t *last = json_array_get(r->messages, n - 1);
    const char *role = json_string_value(json_object_get(last, "role"));
    bool assistant = role && strcmp(role, "assistant") == 0;
    r->cont = TOOLCALL_CONT_NONE;
    if (r->o.cont == 0) return KEEL_OK;
    if (!assistant) {
        if (r->o.cont > 0)
            return base_err(err, KEEL_EINVAL, "continue_final_message: the last message is not the assistant's");
        return KEEL_OK;
    }
    if (json_array_size(json_object_get(last, "tool_calls")) > 0) {
        if (r->o.cont > 0)
            return base_err(err, KEEL_EINVAL, "continue_final_message: the last message holds tool calls");
        return KEEL_OK;
    }
    if (n >= 2) {
        const char *prev = json_string_value(json_object_get(json_array_get(r->messages, n - 2), "role"));
        if (prev && strcmp(prev, "assistant") == 0)
            return base_err(err, KEEL_EINVAL, "continue_final_message: two assistant messages end the conversation");
    }
    const char *c = json_string_value(json_object_get(last, "content"));
    const char *rc = json_string_value(json_object_get(last, "reasoning_content"));
    if (r->o.cont > 0)
        r->cont = (toolcall_cont)r->o.cont;
    else
        r->cont = rc && *rc && (!c || !*c) ? TOOLCALL_CONT_REASONING : TOOLCALL_CONT_CONTENT;
    return KEEL_OK;
}

keel_status eng_req_make(keel_engine *e, json_t *request, eng_req **out, char *err)
{
    *out = NULL;
    if (!json_is_object(request)) return base_err(err, KEEL_EINVAL, "request must be a JSON object");
    eng_req *r = base_calloc(1, sizeof *r);
    if (!r) return base_err(err, KEEL_ENOMEM, "out of memory");
    eng_opts_init(e, &r->o);
    keel_status st = KEEL_OK;
    json_t *msgs = json_object_get(request, "messages");
    json_t *prompt = json_object_get(request, "prompt");
    json_t *ptoks = json_object_get(request, "prompt_tokens");
    int given = (msgs != NULL) + (prompt != NULL) + (ptoks != NULL);
    if (given != 1) {
        st = base_err(err, KEEL_EINVAL, "a request needs exactly one of messages, prompt, prompt_tokens");
        goto fail;
    }
    if (msgs) {
        r->kind = ENG_REQ_CHAT;
        /* the template sees a normalized deep copy; the caller's JSON stays as given */
        r->messages = json_deep_copy(msgs);
        if (!r->messages) {
            st = base_err(err, json_is_array(msgs) ? KEEL_ENOMEM : KEEL_EINVAL, "messages must be an array");
            goto fail;
        }
        if ((st = check_messages(r, r->messages, err)) != KEEL_OK) goto fail;
        json_t *tools = json_object_get(request, "tools");
        if (tools && !json_is_null(tools)) {
            if (!json_is_array(tools)) {
                st = base_err(err, KEEL_EINVAL, "tools must be an array");
                goto fail;
            }
            if (json_array_size(tools) > 0) r->tools = json_incref(tools);
        }
    } else if (prompt) {
        r->kind = ENG_REQ_TEXT;
        if (!json_is_string(prompt)) {
            st = base_err(err, KEEL_EINVAL, "prompt must be a string");
            goto fail;
        }
        r->text_len = json_string_length(prompt);
        r->text = base_alloc(r->text_len + 1);
        if (!r->text) {
            st = base_err(err, KEEL_ENOMEM, "out of memory");
            goto fail;
        }
        memcpy(r->text, json_string_value(prompt), r->text_len + 1);
        r->o.parse_tools = false;
    } else {
        r->kind = ENG_REQ_TOKENS;
        if (!json_is_array(ptoks) || json_array_size(ptoks) == 0) {
            st = base_err(err, KEEL_EINVAL, "prompt_tokens must be a non-empty array of token ids");
            goto fail;
        }
        if (json_array_size(ptoks) > (size_t)e->hist_cap) {
            st = base_err(err, KEEL_ECONTEXT, "prompt_tokens: %zu tokens (at most %d)", json_array_size(ptoks),
                          e->hist_cap);
            goto fail;
        }
        r->n_tokens = (int32_t)json_array_size(ptoks);
        r->tokens = base_alloc((size_t)r->n_tokens * sizeof(int32_t));
        if (!r->tokens) {
            st = base_err(err, KEEL_ENOMEM, "out of memory");
            goto fail;
        }
        int32_t nv = e->model->w.hp.n_vocab;
        for (int32_t i = 0; i < r->n_tokens; i++) {
            json_t *t = json_array_get(ptoks, (size_t)i);
            if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) >= nv) {
                st = base_err(err, KEEL_EINVAL, "prompt_tokens[%d] must be a token id in [0, %d)", i, nv);
                goto fail;
            }
            r->tokens[i] = (int32_t)json_integer_value(t);
        }
        r->o.parse_tools = false;
    }
    if ((st = eng_opts_parse(e, request, true, &r->o, err)) != KEEL_OK) goto fail;
    if (r->kind == ENG_REQ_CHAT && (st = continued(r, err)) != KEEL_OK) goto fail;
    if ((st = eng_tool_grammar(e, r, err)) != KEEL_OK) goto fail;
    atomic_init(&r->cancel, 0);
    *out = r;
    return KEEL_OK;
fail:
    eng_req_free(r);
    return st;
}

/* Template variables of a chat request as one JSON object: its messages
 * (or the first n_msgs of them when n_msgs >= 0), with a generation prompt
 * when gen. */
static json_t *template_vars(const keel_engine *e, const eng_req *r, int32_t n_msgs, bool gen)
{
    json_t *v = json_object(), *msgs = r->messages;
    if (!v) return NULL;
    if (n_msgs >= 0) {
        msgs = json_array();
        for (int32_t i = 0; msgs && i < n_msgs; i++)
            if (json_array_append(msgs, json_array_get(r->messages, (size_t)i)) != 0) {
                json_decref(msgs);
                msgs = NULL;
            }
    }
    bool ok = msgs && (n_msgs >= 0 ? json_object_set_new(v, "messages", msgs) : json_object_set(v, "messages", msgs)) == 0;
    ok = ok && json_object_set_new(v, "add_generation_prompt", json_boolean(gen)) == 0 &&
              json_object_set_new(v, "bos_token", json_string(e->bos_text ? e->bos_text : "")) == 0 &&
              json_object_set_new(v, "eos_token", json_string(e->eos_text ? e->eos_text : "")) == 0;
    if (ok && r->tools && r->o.tool_choice != ENG_TOOLS_NONE) ok = json_object_set(v, "tools", r->tools) == 0;
    if (ok && r->o.template_kwargs) ok = json_object_update(v, r->o.template_kwargs) == 0;
    if (!ok) {
        json_decref(v);
        return NULL;
    }
    return v;
}

/* Whether tools (OpenAI {"type": "function", "function": {"name"}} or
 * plain {"name"} items) hold one called name. */
static bool tools_have(json_t *tools, const char *name)
{
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *f = json_object_get(t, "function");
        const char *n = json_string_value(json_object_get(f ? f : t, "name"));
        if (n && strcmp(n, name) == 0) return true;
    }
    return false;
}

/* The opening of a forced tool call (tool_choice required or named) into
 * sl->forced, where the tool-call format has one; 0 bytes otherwise (the
 * model is then only told about the tools). */
static keel_status forced_call(const keel_engine *e, eng_slot *sl, const eng_req *r, const char *text, size_t len,
                               char *err)
{
    sl->n_forced = 0;
    sl->forced[0] = 0;
    if (r->kind != ENG_REQ_CHAT || r->o.tool_choice != ENG_TOOLS_REQUIRED || !r->o.parse_tools) return KEEL_OK;
    if (!r->tools || json_array_size(r->tools) == 0)
        return base_err(err, KEEL_EINVAL, "tool_choice requires a tool call but no tools were given");
    if (r->o.tool_name && !tools_have(r->tools, r->o.tool_name))
        return base_err(err, KEEL_EINVAL, "tool_choice names '%s', which is not among the tools", r->o.tool_name);
    if (!r->o.add_generation_prompt) return KEEL_OK;
    bool in_reasoning = toolcall_prompt_opens_reasoning(e->tool_format, text, len);
    sl->n_forced = toolcall_forced_prefix(e->tool_format, r->o.tool_name, in_reasoning, sl->forced, sizeof sl->forced);
    return KEEL_OK;
}

/* The most bytes a rendering may have: 64 a token of what a slot tracks
 * (when slot_bound), within the template limits. */
static size_t render_bound(const keel_engine *e, bool slot_bound)
{
    size_t lim = jinja_limits_default().max_output, cap_bytes = (size_t)e->hist_cap * 64;
    return slot_bound && cap_bytes < lim ? cap_bytes : lim;
}

/* Renders r's template (all messages, or the first n_msgs of them, with a
 * generation prompt when gen: see template_vars) into out; its size bounded
 * by what a slot can hold when slot_bound is set, else by the template
 * limits alone. KEEL_ENOMEM, or the template's error in jerr. */
static keel_status render_bounded(keel_engine *e, const eng_req *r, int32_t n_msgs, bool gen, bool slot_bound,
                                  jinja_buf *out, char *jerr)
{
    json_t *vars = template_vars(e, r, n_msgs, gen);
    char *vj = vars ? json_dumps(vars, JSON_COMPACT) : NULL;
    if (vars) json_decref(vars);
    if (!vj) return KEEL_ENOMEM;
    jinja_limits lim = jinja_limits_default();
    lim.max_output = render_bound(e, slot_bound);
    jinja_render_opts ro = {&lim, NULL};
    keel_status st = jinja_render(e->tmpl, vj, strlen(vj), NULL, 0, &ro, out, jerr);
    chat_json_free(vj);
    return st;
}

/* A template that renders the BOS text itself gets it once. */
static int64_t drop_double_bos(const keel_engine *e, int32_t *t, int64_t n)
{
    const text_tokenizer_info *ti = text_tokenizer_get_info(e->model->tok);
    if (n >= 2 && ti->add_bos && t[0] == ti->bos && t[1] == ti->bos) {
        memmove(t, t + 1, (size_t)(n - 1) * sizeof(int32_t));
        n--;
    }
    return n;
}

/* The first n_msgs messages, without a generation prompt (a prefix of the prompt). */
static keel_status render_prefix(keel_engine *e, const eng_req *r, int32_t n_msgs, jinja_buf *out, char *jerr)
{
    return render_bounded(e, r, n_msgs, false, true, out, jerr);
}

keel_status eng_chat_render(keel_engine *e, const eng_req *r, bool slot_bound, jinja_buf *out, char **prefill,
                            size_t *n_prefill, char *jerr)
{
    *prefill = NULL;
    *n_prefill = 0;
    if (r->cont == TOOLCALL_CONT_NONE)
        return render_bounded(e, r, -1, r->o.add_generation_prompt, slot_bound, out, jerr);
    /* the conversation before the continued message, opened for the
     * assistant; where its generation prompt starts: the rendering without
     * it shares everything before */
    int32_t n = (int32_t)json_array_size(r->messages) - 1;
    keel_status st = render_bounded(e, r, n, true, slot_bound, out, jerr);
    if (st != KEEL_OK) return st;
    jinja_buf closed = {NULL, 0, 0};
    size_t g = 0;
    if (n > 0) {
        if ((st = render_bounded(e, r, n, false, slot_bound, &closed, jerr)) != KEEL_OK) {
            jinja_buf_free(&closed);
            return st;
        }
        size_t m = BASE_MIN(closed.len, out->len);
        while (g < m && closed.data[g] == out->data[g]) g++;
    }
    jinja_buf_free(&closed);
    json_t *last = json_array_get(r->messages, (size_t)n);
    json_t *c = json_object_get(last, "content"), *rc = json_object_get(last, "reasoning_content");
    size_t cut = 0;
    st = toolcall_continuation(e->tool_format, out->data ? out->data + g : "", out->len - g, r->cont,
                               r->o.parse_reasoning || r->cont == TOOLCALL_CONT_REASONING, json_string_value(rc), json_string_length(rc), json_string_value(c),
                               json_string_length(c), &cut, prefill, n_prefill);
    if (st != KEEL_OK) {
        snprintf(jerr, JINJA_ERR_CAP, "out of memory");
        return KEEL_ENOMEM;
    }
    out->len = g + cut;
    if (out->data) out->data[out->len] = '\0';
    return KEEL_OK;
}

/* Tokenizes text followed by a forced call's opening (n_forced bytes, 0:
 * none) as one text, so that merges across the join are the model's, into
 * ids[0 .. cap) with *n the full count (text_tokenize's contract:
 * KEEL_ERANGE past cap, and cap 0 only counts). */
static keel_status tokenize_prompt(const keel_engine *e, const char *text, size_t len, const char *forced,
                                   size_t n_forced, int32_t *ids, int64_t cap, int64_t *n)
{
    char *joined = NULL;
    if (n_forced > 0) {
        if (!(joined = base_alloc(len + n_forced + 1))) return KEEL_ENOMEM;
        memcpy(joined, text, len);
        memcpy(joined + len, forced, n_forced + 1);
        text = joined;
        len += n_forced;
    }
    keel_status st = text_tokenize(e->model->tok, text, len, true, true, ids, cap, n, NULL);
    if (joined) base_free(joined, len + 1);
    return st;
}

keel_status eng_count_tokens(keel_engine *e, const eng_req *r, int64_t *n_out, char *err)
{
    *n_out = 0;
    if (r->kind == ENG_REQ_TOKENS) {
        *n_out = r->n_tokens;
        return KEEL_OK;
    }
    jinja_buf out = {NULL, 0, 0};
    const char *text = r->text;
    size_t len = r->text_len;
    keel_status st = KEEL_OK;
    eng_slot tmp; /* eng_chat_render and forced_call write a slot's prompt tail */
    memset(&tmp, 0, sizeof tmp);
    if (r->kind == ENG_REQ_CHAT) {
        char jerr[JINJA_ERR_CAP];
        st = eng_chat_render(e, r, false, &out, &tmp.prefill, &tmp.n_prefill, jerr);
        if (st != KEEL_OK) {
            st = st == KEEL_ENOMEM ? base_err(err, st, "out of memory") : base_err(err, st, "chat template: %s", jerr);
            goto out;
        }
        text = out.data ? out.data : "";
        len = out.len;
        if (!tmp.prefill && (st = forced_call(e, &tmp, r, text, len, err)) != KEEL_OK) goto out;
    }
    /* the count, and the first ids (a template's own BOS text is not doubled) */
    int32_t head[2];
    int64_t n = 0;
    const char *tail;
    size_t n_tail;
    eng_slot_tail(&tmp, &tail, &n_tail);
    st = tokenize_prompt(e, text, len, tail, n_tail, head, 2, &n);
    if (st == KEEL_ERANGE) st = KEEL_OK;
    if (st != KEEL_OK) {
        st = base_err(err, st, "prompt: tokenization failed (%s)", keel_strerror(st));
        goto out;
    }
    *n_out = n >= 2 && drop_double_bos(e, head, 2) == 1 ? n - 1 : n;
out:
    eng_slot_prefill_free(&tmp);
    jinja_buf_free(&out);
    return st;
}

static void mark_add(eng_slot *sl, int32_t pos, int32_t prio)
{
    if (pos <= 0 || pos > sl->n_prompt) return; /* nothing before it, or past the prompt */
    for (int32_t i = 0; i < sl->n_marks; i++)
        if (sl->marks[i].pos == pos) {
            if (sl->marks[i].prio < prio) sl->marks[i].prio = prio;
            return;
        }
    if (sl->n_marks == ENG_MAX_MARKS) { /* full: replace the least useful if this is worth more */
        int32_t low = 0;
        for (int32_t i = 1; i < sl->n_marks; i++)
            if (sl->marks[i].prio < sl->marks[low].prio) low = i;
        if (sl->marks[low].prio >= prio) return;
        memmove(&sl->marks[low], &sl->marks[low + 1], (size_t)(sl->n_marks - low - 1) * sizeof sl->marks[0]);
        sl->n_marks--; /* still ascending */
    }
    int32_t i = sl->n_marks++;
    for (; i > 0 && sl->marks[i - 1].pos > pos; i--) sl->marks[i] = sl->marks[i - 1];
    sl->marks[i] = (eng_mark){pos, prio};
}

keel_status eng_prompt_marks(keel_engine *e, eng_slot *sl, const eng_req *r, const char *text, size_t len)
{
    sl->n_marks = 0;
    /* the end of the prompt, where the same conversation, extended,
     * resumes, and one token short of it, where the same prompt sent again
     * (a client's retry) resumes: a state cannot be truncated, rings
     * cannot be cut below their newest cells, and the last prompt token
     * must be computed again for its logits. A recurrent model keeps only
     * the second (its first chunk after it is one token) */
    mark_add(sl, sl->n_prompt - 1, ENG_PRIO_RECENT);
    if (!e->recurrent) mark_add(sl, sl->n_prompt, ENG_PRIO_RECENT);
    if (r->kind != ENG_REQ_CHAT) return KEEL_OK;
    int32_t n_msgs = (int32_t)json_array_size(r->messages);
    /* the candidate prefixes: (number of messages, priority) */
    int32_t want_k[ENG_MAX_MARKS + ENG_MAX_BREAKS], want_p[ENG_MAX_MARKS + ENG_MAX_BREAKS], n_want = 0;
    int32_t k_sys = 0;
    while (k_sys < n_msgs) {
        const char *role = json_string_value(json_object_get(json_array_get(r->messages, (size_t)k_sys), "role"));
        if (!role || (strcmp(role, "system") != 0 && strcmp(role, "developer") != 0)) break;
        k_sys++;
    }
    if (k_sys > 0 || (r->tools && r->o.tool_choice != ENG_TOOLS_NONE)) {
        want_k[n_want] = k_sys;
        want_p[n_want++] = ENG_PRIO_SYSTEM;
    }
    int32_t users[ENG_LAST_USERS], n_users = 0, first_user = -1;
    for (int32_t i = 0; i < n_msgs; i++) {
        const char *role = json_string_value(json_object_get(json_array_get(r->messages, (size_t)i), "role"));
        if (!role || strcmp(role, "user") != 0) continue;
        if (first_user < 0) first_user = i;
        if (n_users == ENG_LAST_USERS) memmove(users, users + 1, (ENG_LAST_USERS - 1) * sizeof users[0]);
        users[n_users < ENG_LAST_USERS ? n_users++ : ENG_LAST_USERS - 1] = i;
    }
    if (first_user > 0) {
        want_k[n_want] = first_user;
        want_p[n_want++] = ENG_PRIO_BREAK;
    }
    for (int32_t i = 0; i < n_users; i++)
        if (users[i] > 0) {
            want_k[n_want] = users[i];
            want_p[n_want++] = ENG_PRIO_RECENT;
        }
    for (int32_t i = 0; i < r->n_breaks; i++) {
        want_k[n_want] = r->breaks[i] + 1;
        want_p[n_want++] = ENG_PRIO_BREAK;
    }
    /* where the generation prompt starts: the next turn renders this
     * conversation again with the answer in place of the generation
     * prompt, which templates often write differently (a reasoning opener
     * the history drops), and a template that refuses a shorter
     * conversation still renders this one */
    if (r->o.add_generation_prompt && r->cont == TOOLCALL_CONT_NONE && n_msgs > 0) {
        want_k[n_want] = n_msgs;
        want_p[n_want++] = ENG_PRIO_RECENT;
    }
    keel_status st = KEEL_OK;
    jinja_buf part = {NULL, 0, 0};
    int32_t *toks = NULL;
    size_t toks_bytes = 0;
    for (int32_t w = 0; w < n_want && st == KEEL_OK; w++) {
        int32_t k = want_k[w];
        bool seen = false;
        for (int32_t v = 0; v < w; v++) seen |= want_k[v] == k && want_p[v] >= want_p[w];
        if (seen) continue;
        char jerr[JINJA_ERR_CAP];
        part.len = 0;
        st = render_prefix(e, r, k, &part, jerr);
        if (st != KEEL_OK) {
            if (st != KEEL_ENOMEM) st = KEEL_OK; /* the template refuses this prefix: no mark */
            continue;
        }
        /* the bytes it shares with the whole prompt, then the tokens */
        size_t b = 0, n = BASE_MIN(part.len, len);
        while (b < n && part.data[b] == text[b]) b++;
        if (b == 0) continue;
        if (!toks) {
            toks_bytes = (size_t)sl->n_prompt * sizeof(int32_t);
            if (!(toks = base_alloc(toks_bytes))) {
                st = KEEL_ENOMEM;
                break;
            }
        }
        int64_t nt = 0;
        keel_status ts = text_tokenize(e->model->tok, text, b, true, true, toks, sl->n_prompt, &nt, NULL);
        if (ts == KEEL_ENOMEM) st = ts;
        if (ts != KEEL_OK) continue;
        nt = drop_double_bos(e, toks, nt);
        int32_t pos = 0;
        while (pos < nt && pos < sl->n_prompt && toks[pos] == sl->prompt[pos]) pos++;
        mark_add(sl, pos, want_p[w]);
    }
    base_free(toks, toks_bytes);
    jinja_buf_free(&part);
    return st;
}

int32_t eng_prompt_limit(const keel_engine *e, const eng_req *r)
{
    return r->o.compact.policy == KEEL_COMPACT_NONE ? BASE_MIN(e->hist_cap, e->cp.n_ctx) : e->hist_cap;
}

keel_status eng_prompt_tokens(keel_engine *e, eng_slot *sl, const eng_req *r, char *err,
                              jinja_buf *rendered)
{
    sl->n_prompt = 0;
    sl->n_forced = 0;
    sl->n_too_long = 0;
    sl->prompt_limit = 0;
    if (r->kind == ENG_REQ_TOKENS) {
        memcpy(sl->prompt, r->tokens, (size_t)r->n_tokens * sizeof(int32_t));
        sl->n_prompt = r->n_tokens;
        return KEEL_OK;
    }
    const char *text = r->text;
    size_t len = r->text_len;
    jinja_buf *out = rendered;
    keel_status st = KEEL_OK;
    if (r->kind == ENG_REQ_CHAT) {
        char jerr[JINJA_ERR_CAP];
        st = eng_chat_render(e, r, true, out, &sl->prefill, &sl->n_prefill, jerr);
        if (st == KEEL_ENOMEM) return base_err(err, st, "out of memory");
        if (st == KEEL_EOVERFLOW && strstr(jerr, JINJA_ERR_OUTPUT)) {
            /* the bound is 64 bytes a token of the most a slot tracks: a
             * prompt too long, counted at ~4 bytes a token */
            size_t max_out = render_bound(e, true);
            sl->n_too_long = BASE_MAX((int64_t)(max_out / 4), (int64_t)eng_prompt_limit(e, r) + 1);
            sl->prompt_limit = eng_prompt_limit(e, r);
            return base_err(err, KEEL_ECONTEXT, "prompt: the rendering is longer than %zu bytes (more than the %d "
                            "tokens a prompt may have)", max_out, sl->prompt_limit);
        }
        if (st != KEEL_OK) return base_err(err, st, "chat template: %s", jerr);
        text = out->data ? out->data : "";
        len = out->len;
        if (!sl->prefill && (st = forced_call(e, sl, r, text, len, err)) != KEEL_OK) return st;
    }
    int64_t n = 0;
    const char *tail;
    size_t n_tail;
    eng_slot_tail(sl, &tail, &n_tail);
    st = tokenize_prompt(e, text, len, tail, n_tail, sl->prompt, e->hist_cap, &n);
    if (st == KEEL_ERANGE || n > e->hist_cap) {
        sl->n_too_long = n;
        sl->prompt_limit = eng_prompt_limit(e, r);
        st = base_err(err, KEEL_ECONTEXT, "prompt: %lld tokens, more than the %d a slot holds (max_prompt_tokens)",
                      (long long)n, e->hist_cap);
    } else if (st != KEEL_OK) {
        st = base_err(err, st, "prompt: tokenization failed (%s)", keel_strerror(st));
    } else {
        n = drop_double_bos(e, sl->prompt, n);
        if (n == 0) st = base_err(err, KEEL_EINVAL, "prompt: empty");
        sl->n_prompt = (int32_t)n;
    }
    return st;
}
