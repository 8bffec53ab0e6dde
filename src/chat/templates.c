/*
 * templates.c — the public chat-template API (keel.h "Chat templates") over
 * the Jinja engine, and the built-in templates: real Jinja sources, written
 * for keel, that produce the prompt formats of their model families:
 *
 *   chatml   <|im_start|>{role}\n{content}<|im_end|>\n ... <|im_start|>assistant\n
 *   llama3   <|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>
 *   gemma    <start_of_turn>{user|model}\n{content}<end_of_turn>\n (system folded
 *            into the first user turn)
 *   mistral  [INST] {user} [/INST]{assistant}</s> (system before the first user turn)
 *   qwen3    ChatML with a # Tools system block, Hermes <tool_call> JSON,
 *            <tool_response> turns and <think> reasoning on the current turn
 *
 * Message content may be a string or a list of parts ({"type": "text",
 * "text": ...}); other parts are dropped. Owns no state.
 */
#include "jinja.h"

#include <string.h>

struct keel_chat_template {
    jinja_template *t;
};

/* ---- built-in sources -------------------------------------------------------- */

#define TEXT_MACRO                                                                                 \
    "{%- macro text(c) -%}"                                                                        \
    "{%- if c is string -%}{{- c -}}"                                                              \
    "{%- elif c is iterable and c is not mapping -%}"                                              \
    "{%- for p in c if p is mapping and p.type == 'text' -%}{{- p.text -}}{%- endfor -%}"          \
    "{%- elif c is not none and c is defined -%}{{- c -}}"                                         \
    "{%- endif -%}"                                                                                \
    "{%- endmacro -%}\n"

static const char g_chatml[] =
    TEXT_MACRO
    "{%- for message in messages -%}\n"
    "{{- '<|im_start|>' + message.role + '\\n' + text(message.content) + '<|im_end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}\n";

static const char g_llama3[] =
    TEXT_MACRO
    "{{- bos_token -}}\n"
    "{%- for message in messages -%}\n"
    "{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' -}}\n"
    "{{- text(message.content) | trim -}}\n"
    "{{- '<|eot_id|>' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n"
    "{%- endif -%}\n";

static const char g_gemma[] =
    TEXT_MACRO
    "{{- bos_token -}}\n"
    "{%- set ns = namespace(prefix='') -%}\n"
    "{%- set turns = messages -%}\n"
    "{%- if messages and messages[0].role == 'system' -%}\n"
    "{%- set ns.prefix = text(messages[0].content) + '\\n\\n' -%}\n"
    "{%- set turns = messages[1:] -%}\n"
    "{%- endif -%}\n"
    "{%- for message in turns -%}\n"
    "{%- set role = 'model' if message.role == 'assistant' else message.role -%}\n"
    "{{- '<start_of_turn>' + role + '\\n' -}}\n"
    "{%- if loop.first -%}{{- ns.prefix -}}{%- endif -%}\n"
    "{{- text(message.content) | trim -}}\n"
    "{{- '<end_of_turn>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}\n";

static const char g_mistral[] =
    TEXT_MACRO
    "{{- bos_token -}}\n"
    "{%- set ns = namespace(system='') -%}\n"
    "{%- set turns = messages -%}\n"
    "{%- if messages and messages[0].role == 'system' -%}\n"
    "{%- set ns.system = text(messages[0].content) -%}\n"
    "{%- set turns = messages[1:] -%}\n"
    "{%- endif -%}\n"
    "{%- for message in turns -%}\n"
    "{%- if message.role == 'user' -%}\n"
    "{%- if loop.first and ns.system -%}\n"
    "{{- '[INST] ' + ns.system + '\\n\\n' + text(message.content) + ' [/INST]' -}}\n"
    "{%- else -%}\n"
    "{{- '[INST] ' + text(message.content) + ' [/INST]' -}}\n"
    "{%- endif -%}\n"
    "{%- elif message.role == 'assistant' -%}\n"
    "{{- text(message.content) + eos_token -}}\n"
    "{%- else -%}\n"
    "{{- raise_exception('mistral: only user and assistant messages after an optional "
    "system message') -}}\n"
    "{%- endif -%}\n"
    "{%- endfor -%}\n";

static const char g_qwen3[] =
    TEXT_MACRO
    /* the system turn, with the tool list when there are tools */
    "{%- set has_system = messages and messages[0].role == 'system' -%}\n"
    "{%- if tools -%}\n"
    "{{- '<|im_start|>system\\n' -}}\n"
    "{%- if has_system -%}{{- text(messages[0].content) + '\\n\\n' -}}{%- endif -%}\n"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n'"
    " + 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' "
    "-}}\n"
    "{%- for tool in tools -%}{{- '\\n' + tool | tojson -}}{%- endfor -%}\n"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": "
    "<function-name>, \"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' -}}\n"
    "{%- elif has_system -%}\n"
    "{{- '<|im_start|>system\\n' + text(messages[0].content) + '<|im_end|>\\n' -}}\n"
    "{%- endif -%}\n"
    /* the last real user turn: reasoning is shown only after it */
    "{%- set ns = namespace(searching=true, last_query=messages | length - 1) -%}\n"
    "{%- for message in messages | reverse -%}\n"
    "{%- set c = text(message.content) -%}\n"
    "{%- if ns.searching and message.role == 'user' and not (c.startswith('<tool_response>') "
    "and c.endswith('</tool_response>')) -%}\n"
    "{%- set ns.searching = false -%}\n"
    "{%- set ns.last_query = messages | length - 1 - loop.index0 -%}\n"
    "{%- endif -%}\n"
    "{%- endfor -%}\n"
    "{%- for message in messages -%}\n"
    "{%- set content = text(message.content) -%}\n"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) -%}\n"
    "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' -}}\n"
    "{%- elif message.role == 'assistant' -%}\n"
    "{%- set reasoning = '' -%}\n"
    "{%- if message.reasoning_content is string -%}\n"
    "{%- set reasoning = message.reasoning_content -%}\n"
    "{%- elif '</think>' in content -%}\n"
    "{%- set reasoning = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1]"
    ".lstrip('\\n') -%}\n"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}\n"
    "{%- endif -%}\n"
    "{{- '<|im_start|>assistant\\n' -}}\n"
    "{%- if loop.index0 > ns.last_query and (loop.last or reasoning) -%}\n"
    "{{- '<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') -}}\n"
    "{%- else -%}{{- content -}}{%- endif -%}\n"
    "{%- for call in message.tool_calls or [] -%}\n"
    "{%- set f = call.function if call.function is defined else call -%}\n"
    "{%- if not loop.first or content -%}{{- '\\n' -}}{%- endif -%}\n"
    "{{- '<tool_call>\\n{\"name\": \"' + f.name + '\", \"arguments\": ' -}}\n"
    "{{- f.arguments if f.arguments is string else f.arguments | tojson -}}\n"
    "{{- '}\\n</tool_call>' -}}\n"
    "{%- endfor -%}\n"
    "{{- '<|im_end|>\\n' -}}\n"
    "{%- elif message.role == 'tool' -%}\n"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' "
    "-}}{%- endif -%}\n"
    "{{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' -}}\n"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}\n"
    "{%- endif -%}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "{{- '<|im_start|>assistant\\n' -}}\n"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}\n"
    "{%- endif -%}\n";

static const struct {
    const char *name;
    const char *src;
} g_builtins[] = {
    {"chatml", g_chatml}, {"llama3", g_llama3}, {"gemma", g_gemma},
    {"mistral", g_mistral}, {"qwen3", g_qwen3},
};

static const char *const g_builtin_names[] = {"chatml", "llama3", "gemma", "mistral", "qwen3", NULL};

keel_status keel_chat_template_builtin(const char *name, const char **source)
{
    if (!name || !source) return KEEL_EINVAL;
    *source = NULL;
    for (size_t i = 0; i < BASE_ARRAY_LEN(g_builtins); i++)
        if (strcmp(name, g_builtins[i].name) == 0) {
            *source = g_builtins[i].src;
            return KEEL_OK;
        }
    return KEEL_ENOENT;
}

const char *const *keel_chat_template_builtin_names(void)
{
    return g_builtin_names;
}

/* ---- public API ---------------------------------------------------------------- */

keel_status keel_chat_template_open(const char *source, size_t len, keel_chat_template **out,
                                    char *err)
{
    if (!out) return base_err(err, KEEL_EINVAL, "out is NULL");
    *out = NULL;
    if (!source && len) return base_err(err, KEEL_EINVAL, "template source is NULL");
    keel_chat_template *t = base_calloc(1, sizeof *t);
    if (!t) return base_err(err, KEEL_ENOMEM, "out of memory");
    keel_status st = jinja_open(source, len, &t->t, err);
    if (st != KEEL_OK) {
        base_free(t, sizeof *t);
        return st;
    }
    *out = t;
    return KEEL_OK;
}

void keel_chat_template_close(keel_chat_template *t)
{
    if (!t) return;
    jinja_close(t->t);
    base_free(t, sizeof *t);
}

keel_status keel_chat_template_render(const keel_chat_template *t, const char *vars_json,
                                      size_t len, const char *now, char *buf, size_t cap,
                                      size_t *n_out, char *err)
{
    if (n_out) *n_out = 0;
    if (!t || !n_out || (!buf && cap) || (!vars_json && len))
        return base_err(err, KEEL_EINVAL, "NULL argument to keel_chat_template_render");
    jinja_time tm;
    jinja_render_opts o = {NULL, NULL};
    if (now) {
        if (!jinja_time_parse(now, &tm))
            return base_err(err, KEEL_EINVAL, "now '%.40s': expected YYYY-MM-DDTHH:MM:SS", now);
        o.now = &tm;
    }
    jinja_buf b = {0};
    keel_status st = jinja_render(t->t, vars_json, len, NULL, 0, &o, &b, err);
    if (st == KEEL_OK) {
        *n_out = b.len;
        if (cap < b.len + 1) {
            st = base_err(err, KEEL_ERANGE, "the rendering is %zu bytes, the buffer %zu", b.len,
                          cap);
        } else {
            memcpy(buf, b.data, b.len);
            buf[b.len] = 0;
        }
    }
    jinja_buf_free(&b);
    return st;
}
