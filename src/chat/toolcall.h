/*
 * toolcall.h — private interface of src/chat's model-output parser: turns
 * the text a chat model generates back into OpenAI/Anthropic structures
 * (content, reasoning_content, tool_calls), incrementally, as the text
 * streams out of the detokenizer.
 *
 *   toolcall_options o = toolcall_options_default();
 *   o.format = toolcall_detect(template_src, template_len);
 *   o.starts_in_reasoning = toolcall_prompt_opens_reasoning(o.format, prompt, prompt_len);
 *   o.on_event = send_sse; o.event_user = conn;
 *   toolcall_parser *p;
 *   if (toolcall_open(&o, &p, err)) ...;
 *   for each detokenized piece: if (toolcall_feed(p, piece, n)) ...;
 *   toolcall_result r;
 *   if (toolcall_finish(p, &r)) ...;       // r stays valid until toolcall_close
 *   json_t *msg; toolcall_result_json(&r, &msg, err);
 *   toolcall_close(p);
 *
 * Streaming contract (tested for every format over random chunk splits and
 * fuzzed):
 *   - The result does not depend on how the text was split into feeds.
 *   - The concatenation of the content / reasoning / per-call argument
 *     deltas delivered through on_event equals the final result's content /
 *     reasoning / arguments, byte for byte.
 *   - A content or reasoning delta never contains a partial marker: a
 *     suffix that could still become "<tool_call>", "<|channel|>", ... is
 *     held back until it is resolved. Deltas never end inside a UTF-8
 *     sequence (when the input is valid UTF-8).
 *   - Tool calls: CALL_BEGIN (index, id, name) as soon as the call's name
 *     is known; for JSON-argument formats the argument text streams as it
 *     arrives; for XML-parameter formats each parameter is emitted as a
 *     complete `"name": value` JSON member (string-typed parameters stream
 *     as their text arrives); CALL_END closes it.
 *
 * Malformed output (docs/chat.md, "Tool calls and reasoning"): text whose
 * call header (block marker, name) does not parse, names a tool that is not
 * in the given tool list, or is cut by the end of output, becomes plain
 * content, raw, nothing lost. Once a call's header is accepted the call is
 * committed (its begin event has been sent): later defects — arguments that
 * are not JSON, an unclosed call at the end, stray text inside the call —
 * keep the call and set its `error` (and the result's n_malformed/error);
 * its arguments then hold the raw text the model wrote. Malformed output is
 * not a failure of the calls below: they return KEEL_OK and report it.
 *
 * Memory: text held undecided (whitespace next to a marker, a partial
 * marker, a call header, an XML value being typed, a JSON call object whose
 * arguments precede its name) is bounded by max_held_bytes plus fixed
 * small caps; past them it is flushed as content (or, inside a committed
 * call, as a string value). The accumulated result grows with the output.
 * All memory goes through the allocator hooks. A parser is used by one
 * thread at a time.
 */
#ifndef KEEL_CHAT_TOOLCALL_H
#define KEEL_CHAT_TOOLCALL_H

#include "../base/base.h"

#include <jansson.h>

/* X(enum suffix, name, family). Names are what --tool-format / the
 * override takes; toolcall_format_name() returns them. */
#define TOOLCALL_FORMAT_TABLE(X)                                                                   \
    X(CONTENT, "content", "no tool calls; <think> reasoning")                                    \
    X(HERMES, "hermes", "Hermes 2/3, Qwen2.5, Qwen3, QwQ, Granite 4, MiMo: <tool_call>{json}")    \
    X(QWEN3_CODER, "qwen3-coder", "Qwen3-Coder, Qwen3.5: <tool_call><function=..><parameter=..>") \
    X(GLM, "glm-4.5", "GLM 4.5/4.6, Laguna: <tool_call>name<arg_key>k</arg_key>...")             \
    X(LLAMA3, "llama3", "Llama 3.x: bare {\"name\", \"parameters\"} JSON; <|python_tag|>f.call()") \
    X(FUNCTIONARY_V3_1, "functionary-v3.1", "Functionary v3.1: <function=name>{json}</function>") \
    X(MISTRAL, "mistral", "Mistral/Devstral/Ministral: [TOOL_CALLS], [THINK]")                    \
    X(GPT_OSS, "gpt-oss", "gpt-oss harmony channels")                                             \
    X(DEEPSEEK_R1, "deepseek-r1", "DeepSeek R1 / V3: <｜tool▁calls▁begin｜> function<｜tool▁sep｜>") \
    X(DEEPSEEK_V3_1, "deepseek-v3.1", "DeepSeek V3.1: <｜tool▁call▁begin｜>name<｜tool▁sep｜>{json}") \
    X(DEEPSEEK_V3_2, "deepseek-v3.2", "DeepSeek V3.2 / V4: <｜DSML｜invoke name=..>")               \
    X(KIMI_K2, "kimi-k2", "Kimi K2: <|tool_calls_section_begin|>")                                \
    X(MINIMAX_M2, "minimax-m2", "MiniMax M2: <minimax:tool_call><invoke name=..>")                \
    X(MINIMAX_M1, "minimax-m1", "MiniMax M1: <tool_calls> JSON lines")                            \
    X(APRIEL, "apriel", "Apriel 1.5/1.6: <tool_calls>[json]; [BEGIN FINAL RESPONSE]")             \
    X(COMMAND_R7B, "command-r7b", "Command R7B, Cohere2: <|START_ACTION|>[json]")                  \
    X(GRANITE, "granite", "Granite 3.x: <|tool_call|>[json]; <response>")                         \
    X(NEMOTRON_V2, "nemotron-v2", "Nemotron Nano v2: <TOOLCALL>[json]</TOOLCALL>")                \
    X(LFM2, "lfm2", "LFM2 / LFM2.5: <|tool_call_start|>[f(a=1)] or [json]<|tool_call_end|>")      \
    X(MINICPM5, "minicpm5", "MiniCPM5: <function name=..><param name=..>")                        \
    X(GIGACHAT3, "gigachat3", "GigaChat 3 / 3.1: function call<|role_sep|>{json}, <|function_call|>{json}")                    \
    X(GEMMA4, "gemma4", "Gemma 4: <|tool_call>call:name{k:<|\"|>v<|\"|>}<tool_call|>")             \
    X(SEED_OSS, "seed-oss", "Seed-OSS: <seed:think>, <seed:tool_call><function=..><parameter=..>") \
    X(KIMI_K3, "kimi-k3", "Kimi K3: <|open|>think<|sep|>, <|open|>tools<|sep|><|open|>call tool=..") \
    X(MINIMAX_M3, "minimax-m3", "MiniMax M3: <mm:think>, ]<]minimax[>[<tool_call> <invoke name=..> elements") \
    X(APERTUS, "apertus", "Apertus: <|inner_prefix|> reasoning, <|tools_prefix|>[{\"name\": {args}}]<|tools_suffix|>") \
    X(COMMAND_R_PLUS, "command-r-plus", "Command R+: Action:\\n```json [{tool_name, parameters}] ```")  \
    X(FUNCTIONARY_V3_2, "functionary-v3.2", "Functionary v3.2: >>>all\\ntext, >>>name\\n{json}") \
    X(FIREFUNCTION_V2, "firefunction-v2", "FireFunction v2: functools[{\"name\", \"arguments\"}, ...]") \
    X(MUSE, "muse", "Muse Glimmer: <|start|>assistant to=self|user|TOOL<|message|>, <atem:function_calls>") \
    X(HY3, "hy3", "tencent Hy3: <think:opensource>, <tool_calls:opensource><tool_call:opensource>name<tool_sep..>") \
    X(SOLAR_OPEN, "solar-open", "upstage Solar Open: <|think|>, <|tool_calls|><|tool_call:begin|>id<|tool_call:name|>..")

typedef enum toolcall_format {
#define TOOLCALL_FORMAT_ENUM_(e, name, family) TOOLCALL_FORMAT_##e,
    TOOLCALL_FORMAT_TABLE(TOOLCALL_FORMAT_ENUM_)
#undef TOOLCALL_FORMAT_ENUM_
        TOOLCALL_FORMAT_COUNT_
} toolcall_format;

/* Name of a format ("hermes"); "?" for an out-of-range value. Static. */
const char *toolcall_format_name(toolcall_format f);
/* One-line description of the families a format covers. Static. */
const char *toolcall_format_family(toolcall_format f);
/* Parses a format name (case-insensitive; a few aliases such as "qwen",
 * "qwen3", "deepseek-v3", "harmony", "none"). KEEL_ENOENT if unknown. */
keel_status toolcall_format_from_name(const char *name, toolcall_format *out);
/* All names, comma-separated ("content, hermes, ..."). Static. */
const char *toolcall_format_names(void);

/*
 * The format a chat template's source implies, found by string search as
 * llama.cpp does (distinctive markers, most specific first); CONTENT when
 * nothing matches or src is NULL. Never fails.
 */
toolcall_format toolcall_detect(const char *src, size_t len);

/*
 * Whether a rendered prompt (ending with the generation prompt) leaves the
 * model inside a reasoning block: it ends, trailing whitespace aside, with
 * the format's reasoning opener ("<think>", "[THINK]", "<|START_THINKING|>",
 * Apriel's "Here are my reasoning steps:") not followed by its closer.
 * Pass the result as toolcall_options.starts_in_reasoning.
 */
bool toolcall_prompt_opens_reasoning(toolcall_format f, const char *prompt, size_t len);

/* The text that opens a tool call in format f, appended to the prompt to
 * force a call (tool_choice "required", or a named tool: then the name is
 * written too and the model continues with the arguments). in_reasoning:
 * the prompt leaves the model inside its reasoning, which is closed first.
 * Returns the length written to buf (NUL-terminated), or 0 where f has no
 * such prefix (the call cannot be forced), the name cannot be written
 * verbatim, or cap is too small. */
size_t toolcall_forced_prefix(toolcall_format f, const char *name, bool in_reasoning, char *buf, size_t cap);

/* How a prefilled assistant message is continued (continue_final_message). */
typedef enum toolcall_cont {
    TOOLCALL_CONT_NONE = 0,
    TOOLCALL_CONT_CONTENT = 1,   /* the model continues the message's content */
    TOOLCALL_CONT_REASONING = 2, /* the model continues its reasoning (no content yet) */
} toolcall_cont;

/*
 * The text that continues a prompt into a prefilled assistant message, as
 * the model would have written it. gen[0..gen_len) is the generation prompt
 * the template appends for the assistant's turn (the rendering with
 * add_generation_prompt minus the one without). *cut receives how many of
 * its bytes to keep: all of them, or up to the format's reasoning opener
 * when the generation prompt writes one (that opener is then written again,
 * followed by the message's reasoning). *out (base_alloc'd, *out_len + 1
 * bytes, NUL-terminated; free with base_free) is then:
 *   - reasoning markers (with_reasoning — the caller parses reasoning, as
 *     llama.cpp puts the reasoning in only then, or continues the
 *     reasoning itself — and reasoning is given, the generation prompt
 *     opened reasoning, or mode is REASONING): opener, reasoning, and in
 *     CONTENT mode the closer and the content;
 *   - gpt-oss: the analysis channel's message, then the final channel's;
 *   - else the content.
 * Feed *out to the output parser before the model's text (toolcall_feed):
 * the parse then holds the whole message, prefill included. KEEL_EINVAL
 * (mode NONE), KEEL_ENOMEM.
 */
keel_status toolcall_continuation(toolcall_format f, const char *gen, size_t gen_len, toolcall_cont mode,
                                  bool with_reasoning, const char *reasoning, size_t reasoning_len,
                                  const char *content, size_t content_len, size_t *cut, char **out,
                                  size_t *out_len);

/* ---- events --------------------------------------------------------------- */

typedef enum toolcall_event_kind {
    TOOLCALL_EV_CONTENT = 0,   /* text delta of the content */
    TOOLCALL_EV_REASONING = 1, /* text delta of reasoning_content */
    TOOLCALL_EV_CALL_BEGIN = 2, /* a tool call starts: index, id, name */
    TOOLCALL_EV_CALL_ARGS = 3, /* text delta of call `index`'s arguments (JSON text) */
    TOOLCALL_EV_CALL_END = 4,  /* call `index` is complete; error NULL or why it is malformed */
} toolcall_event_kind;

typedef struct toolcall_event {
    toolcall_event_kind kind;
    int32_t index;     /* tool call index (0, 1, ...) for CALL_*; -1 otherwise */
    const char *text;  /* delta bytes (CONTENT, REASONING, CALL_ARGS); not NUL-terminated */
    size_t len;        /* bytes in text */
    const char *id;    /* CALL_BEGIN: the call's id (NUL-terminated) */
    const char *name;  /* CALL_BEGIN: the function name (NUL-terminated) */
    const char *error; /* CALL_END: NULL, or what is wrong with the call */
} toolcall_event;

/* Receives events during toolcall_feed / toolcall_finish. Every pointer in
 * ev is valid only during the call. Must not call back into the parser. */
typedef void (*toolcall_event_fn)(void *user, const toolcall_event *ev);

/* Writes the id of call `index` (NUL-terminated, < cap bytes; cap is
 * TOOLCALL_ID_CAP). Any status other than KEEL_OK aborts the feed with it. */
typedef keel_status (*toolcall_id_fn)(void *user, toolcall_format f, int32_t index, char *buf,
                                      size_t cap);

#define TOOLCALL_ID_CAP 64
#define TOOLCALL_NAME_CAP 256

typedef struct toolcall_options {
    toolcall_format format;
    bool starts_in_reasoning; /* the prompt opened the reasoning block (toolcall_prompt_opens_reasoning) */
    bool parse_reasoning;     /* false: reasoning markers stay in the content, verbatim */
    bool json_answer;         /* the answer is JSON (a JSON response format): a Markdown fence
                               * around the content (```json ... ```) is removed */
    /* Tools offered to the model (OpenAI [{"type":"function","function":{name,parameters}}]
     * or Anthropic [{name, input_schema}]), or NULL. When given, calls to other names are
     * content, and XML parameter values are typed by the parameter's JSON schema. The
     * parser takes a reference (json_incref) for its lifetime. */
    json_t *tools;
    size_t max_held_bytes; /* cap on undecided text; 0: default 1 MiB; at least 4096 */
    /* Ids: id_fn if set; else id_prefix (NULL: "call_") + 24 base-62 characters derived
     * from id_seed and the index. For MISTRAL with id_prefix NULL the default id is 9
     * alphanumeric characters, as Mistral's templates require. */
    toolcall_id_fn id_fn;
    void *id_user;
    const char *id_prefix; /* copied at open; at most 32 bytes */
    uint64_t id_seed;
    toolcall_event_fn on_event; /* NULL: only the final result */
    void *event_user;
} toolcall_options;

/* format CONTENT, parse_reasoning true, everything else zero/NULL. */
toolcall_options toolcall_options_default(void);

typedef struct toolcall_parser toolcall_parser;

/* Opens a parser. KEEL_EINVAL (bad format, tools not an array, id_prefix too long; detail
 * in err, 256 bytes, may be NULL), KEEL_ENOMEM. *out is NULL on failure. */
keel_status toolcall_open(const toolcall_options *o, toolcall_parser **out, char *err);
/* NULL is a no-op. Releases the result too. */
void toolcall_close(toolcall_parser *p);

/*
 * Feeds the next n bytes of model output (any split: single bytes, halves of
 * a UTF-8 character, whole outputs). Events for what can be decided are
 * delivered before it returns. KEEL_ENOMEM (the parser is then unusable:
 * further calls return KEEL_ENOMEM), KEEL_EINVAL after toolcall_finish, or
 * the status an id_fn returned. Allocates (result buffers grow).
 */
keel_status toolcall_feed(toolcall_parser *p, const char *text, size_t n);

/* ---- the result ------------------------------------------------------------ */

typedef struct toolcall_call {
    char id[TOOLCALL_ID_CAP];
    const char *name;      /* NUL-terminated */
    const char *arguments; /* JSON text as the model wrote it (or built from XML parameters);
                            * NUL-terminated (raw malformed text may hold NUL bytes: use
                            * arguments_len); "{}" when the model gave none */
    size_t arguments_len;
    const char *error; /* NULL, or why the call is malformed (static text) */
} toolcall_call;

typedef struct toolcall_result {
    const char *content; /* NUL-terminated; "" when none */
    size_t content_len;
    const char *reasoning; /* NUL-terminated; "" when none */
    size_t reasoning_len;
    const toolcall_call *calls; /* [n_calls] */
    int32_t n_calls;
    int32_t n_malformed; /* calls with an error */
    const char *error;   /* NULL, or the first malformed call's "tool call 1 (name): why" */
} toolcall_result;

/*
 * Ends the output: resolves everything held (partial markers become text,
 * unclosed calls are closed and marked), delivers the last events and fills
 * *out. The result's pointers stay valid until toolcall_close. KEEL_ENOMEM,
 * KEEL_EINVAL if called twice, or an id_fn's status.
 */
keel_status toolcall_finish(toolcall_parser *p, toolcall_result *out);

/*
 * The result as an OpenAI assistant message:
 *   {"role":"assistant","content":..,"reasoning_content":..,
 *    "tool_calls":[{"id":..,"type":"function","function":{"name":..,"arguments":".."}}]}
 * content is null when empty and there are tool calls; reasoning_content and
 * tool_calls are left out when empty. Invalid UTF-8 in the text becomes
 * U+FFFD (JSON strings must be UTF-8). New reference in *out. KEEL_ENOMEM.
 */
keel_status toolcall_result_json(const toolcall_result *r, json_t **out, char *err);

/* Bytes of model output held undecided right now (for the memory bound tests). */
size_t toolcall_held_bytes(const toolcall_parser *p);
/* Detail of the last failure ("" if none). Valid until the next call. */
const char *toolcall_last_error(const toolcall_parser *p);

/* ---- the grammar of tool-call blocks (toolgrammar.c) ----------------------- */

/*
 * GBNF for one or more complete tool-call blocks in format f: the name one
 * of tools (OpenAI [{"type":"function","function":{name, parameters,
 * strict}}], Anthropic [{name, input_schema}]; only: that one tool, or
 * NULL), the arguments the tool's schema (gram_schema_gbnf's keywords) for
 * tools with "strict": true, or for every tool when all is set; any JSON
 * object (XML formats: any parameters) for the others. parallel: one or
 * more calls, as the format writes several; else exactly one. The grammar starts
 * with the format's opening marker: the engine activates it lazily at the
 * first trigger (docs/grammar.md, "Tool calls").
 */
#define TOOLCALL_GRAMMAR_TRIGGERS 2
typedef struct toolcall_grammar {
    char *gbnf;        /* base_alloc'd, n_gbnf + 1 bytes, NUL-terminated */
    size_t n_gbnf;
    const char *triggers[TOOLCALL_GRAMMAR_TRIGGERS]; /* static: the text that opens a block */
    int32_t n_triggers;
    bool at_start;     /* a trigger counts only at the start of the output, whitespace aside
                          (llama3's bare JSON call) */
    const char *const *markers; /* static, NULL-terminated: the format's markers (openers, separators,
                                   closers); a model's control token with such a text may stand for it */
    int32_t n_constrained; /* tools whose arguments follow their schema */
    char note[256];    /* tools left unconstrained (a schema refused) and why; "" if none */
} toolcall_grammar;

/* Whether format f has a tool-call grammar (hermes, qwen3-coder, llama3,
 * mistral, functionary-v3.1, deepseek-r1 / v3.1, kimi-k2, glm-4.5,
 * minimax-m2, seed-oss, nemotron-v2, granite, apriel, lfm2). */
bool toolcall_grammar_supported(toolcall_format f);

/* Builds the grammar into *out (toolcall_grammar_free releases it).
 * KEEL_EUNSUPPORTED: f has no grammar, or a strict tool's schema was
 * refused (err names the tool and the keyword; a tool that is not strict
 * is left unconstrained instead, noted in out->note); KEEL_EINVAL: no
 * tools, or only names none of them; KEEL_ERANGE: past GRAM_MAX_SOURCE;
 * KEEL_ENOMEM. out is zeroed on failure. */
keel_status toolcall_grammar_build(toolcall_format f, json_t *tools, const char *only, bool all, bool parallel,
                                   toolcall_grammar *out, char *err);
/* NULL is a no-op. */
void toolcall_grammar_free(toolcall_grammar *g);

/* ---- shared with the fuzz target and tests ------------------------------- */

/* Frees memory jansson returned to the caller (json_dumps) with jansson's own free
 * function (keel leaves jansson's process-wide allocator as the host set it). NULL is a
 * no-op. */
void chat_json_free(void *ptr);

#endif /* KEEL_CHAT_TOOLCALL_H */
