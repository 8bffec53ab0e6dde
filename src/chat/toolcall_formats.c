/*
 * toolcall_formats.c — the output formats as data: for each format the
 * markers that are structure (reasoning, tool-call blocks, markers to drop)
 * in content and in reasoning, the XML parameter syntax where there is one,
 * and where raw arguments end; plus names, detection from a template's
 * source and the "prompt leaves the model in reasoning" check.
 *
 * Detection follows llama.cpp's common/chat.cpp: distinctive substrings of
 * the template source, most specific first (a template that renders
 * <arg_key> also renders <tool_call>, so GLM is tested before Hermes).
 */
#include "toolcall_int.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

/* ---- markers ----------------------------------------------------------------- */

#define M_THINK_OPEN {"<think>", TC_ACT_REASON_OPEN, 0}
#define M_THINK_CLOSE {"</think>", TC_ACT_REASON_CLOSE, 0}
#define M_END {NULL, 0, 0}

static const tc_marker g_content_think[] = {M_THINK_OPEN, M_END};
static const tc_marker g_reason_think[] = {M_THINK_CLOSE, M_THINK_OPEN, M_END};

#define M_TAGGED {"<tool_call>", TC_ACT_BLOCK, TC_BLK_TAGGED}
static const tc_marker g_content_tagged[] = {M_THINK_OPEN, M_TAGGED, M_END};
static const tc_marker g_reason_tagged[] = {M_THINK_CLOSE, M_THINK_OPEN, M_TAGGED, M_END};

/* Qwen3-Coder / Qwen3.5: calls whose opening <tool_call> the model dropped */
#define M_QFUNC {"<function=", TC_ACT_BLOCK, TC_BLK_QFUNC}
static const tc_marker g_content_qwen[] = {M_THINK_OPEN, M_TAGGED, M_QFUNC, M_END};
static const tc_marker g_reason_qwen[] = {M_THINK_CLOSE, M_THINK_OPEN, M_TAGGED, M_QFUNC, M_END};

#define M_PYTAG {"<|python_tag|>", TC_ACT_BLOCK, TC_BLK_LLAMA}
static const tc_marker g_content_llama[] = {M_THINK_OPEN, M_PYTAG, M_END};
static const tc_marker g_reason_llama[] = {M_THINK_CLOSE, M_THINK_OPEN, M_PYTAG, M_END};

#define M_FUNC {"<function=", TC_ACT_BLOCK, TC_BLK_FUNC}
static const tc_marker g_content_func[] = {M_THINK_OPEN, M_FUNC, M_END};
static const tc_marker g_reason_func[] = {M_THINK_CLOSE, M_THINK_OPEN, M_FUNC, M_END};

#define M_MISTRAL {"[TOOL_CALLS]", TC_ACT_BLOCK, TC_BLK_MISTRAL}
static const tc_marker g_content_mistral[] = {{"[THINK]", TC_ACT_REASON_OPEN, 0}, M_MISTRAL, M_END};
static const tc_marker g_reason_mistral[] = {{"[/THINK]", TC_ACT_REASON_CLOSE, 0},
                                             {"[THINK]", TC_ACT_REASON_OPEN, 0},
                                             M_MISTRAL,
                                             M_END};

static const tc_marker g_harmony[] = {{"<|end|>", TC_ACT_H_END, 0},    {"<|call|>", TC_ACT_H_END, 0},
                                      {"<|return|>", TC_ACT_H_END, 0}, {"<|start|>", TC_ACT_H_START, 0},
                                      {"<|channel|>", TC_ACT_H_START, 0}, M_END};

#define M_DS_BLOCKS                                                                                \
    {"<｜tool▁calls▁begin｜>", TC_ACT_BLOCK, TC_BLK_DEEPSEEK},                                     \
        {"<｜tool_calls_begin｜>", TC_ACT_BLOCK, TC_BLK_DEEPSEEK},                                 \
        {"<｜tool calls begin｜>", TC_ACT_BLOCK, TC_BLK_DEEPSEEK},                                 \
        {"<｜tool\\_calls\\_begin｜>", TC_ACT_BLOCK, TC_BLK_DEEPSEEK},                             \
        {"<｜tool▁calls｜>", TC_ACT_BLOCK, TC_BLK_DEEPSEEK},                                       \
        {"<｜tool▁call▁begin｜>", TC_ACT_BLOCK, TC_BLK_DEEPSEEK1}
static const tc_marker g_content_ds[] = {M_THINK_OPEN, M_DS_BLOCKS, M_END};
static const tc_marker g_reason_ds[] = {M_THINK_CLOSE, M_THINK_OPEN, M_DS_BLOCKS, M_END};

#define M_DSML                                                                                     \
    {"<｜DSML｜function_calls>", TC_ACT_BLOCK, TC_BLK_XML},                                        \
        {"<｜DSML｜tool_calls>", TC_ACT_BLOCK, TC_BLK_XML}
static const tc_marker g_content_dsml[] = {M_THINK_OPEN, M_DSML, M_END};
static const tc_marker g_reason_dsml[] = {M_THINK_CLOSE, M_THINK_OPEN, M_DSML, M_END};

#define M_KIMI                                                                                     \
    {"<|tool_calls_section_begin|>", TC_ACT_BLOCK, TC_BLK_KIMI},                                  \
        {"<|tool_call_begin|>", TC_ACT_BLOCK, TC_BLK_KIMI1}
static const tc_marker g_content_kimi[] = {M_THINK_OPEN, M_KIMI, M_END};
static const tc_marker g_reason_kimi[] = {M_THINK_CLOSE, M_THINK_OPEN, M_KIMI, M_END};

#define M_MINIMAX {"<minimax:tool_call>", TC_ACT_BLOCK, TC_BLK_XML}
static const tc_marker g_content_minimax[] = {M_THINK_OPEN, M_MINIMAX, M_END};
static const tc_marker g_reason_minimax[] = {M_THINK_CLOSE, M_THINK_OPEN, M_MINIMAX, M_END};

#define M_TOOL_CALLS {"<tool_calls>", TC_ACT_BLOCK, TC_BLK_JSON}
static const tc_marker g_content_m1[] = {M_THINK_OPEN, M_TOOL_CALLS, M_END};
static const tc_marker g_reason_m1[] = {M_THINK_CLOSE, M_THINK_OPEN, M_TOOL_CALLS, M_END};

#define APRIEL_OPEN "Here are my reasoning steps:"
#define APRIEL_CLOSE "[BEGIN FINAL RESPONSE]"
static const tc_marker g_content_apriel[] = {{APRIEL_OPEN, TC_ACT_REASON_OPEN, 0},
                                             {APRIEL_CLOSE, TC_ACT_DROP, 0},
                                             {"[END FINAL RESPONSE]", TC_ACT_DROP, 0},
                                             M_TOOL_CALLS,
                                             M_END};
static const tc_marker g_reason_apriel[] = {{APRIEL_CLOSE, TC_ACT_REASON_CLOSE, 0},
                                            {APRIEL_OPEN, TC_ACT_REASON_OPEN, 0},
                                            M_TOOL_CALLS,
                                            M_END};

#define M_ACTION {"<|START_ACTION|>", TC_ACT_BLOCK, TC_BLK_JSON}
static const tc_marker g_content_cohere[] = {{"<|START_THINKING|>", TC_ACT_REASON_OPEN, 0},
                                             M_ACTION,
                                             {"<|START_RESPONSE|>", TC_ACT_DROP, 0},
                                             {"<|END_RESPONSE|>", TC_ACT_DROP, 0},
                                             {"<|START_TEXT|>", TC_ACT_DROP, 0},
                                             {"<|END_TEXT|>", TC_ACT_DROP, 0},
                                             M_END};
static const tc_marker g_reason_cohere[] = {{"<|END_THINKING|>", TC_ACT_REASON_CLOSE, 0},
                                            {"<|START_THINKING|>", TC_ACT_REASON_OPEN, 0},
                                            M_ACTION,
                                            M_END};

#define M_GRANITE {"<|tool_call|>", TC_ACT_BLOCK, TC_BLK_JSON}
static const tc_marker g_content_granite[] = {M_THINK_OPEN, M_GRANITE,
                                              {"<response>", TC_ACT_DROP, 0},
                                              {"</response>", TC_ACT_DROP, 0}, M_END};
static const tc_marker g_reason_granite[] = {M_THINK_CLOSE, M_THINK_OPEN, M_GRANITE, M_END};

#define M_NEMO {"<TOOLCALL>", TC_ACT_BLOCK, TC_BLK_JSON}
static const tc_marker g_content_nemotron[] = {M_THINK_OPEN, M_NEMO, M_END};
static const tc_marker g_reason_nemotron[] = {M_THINK_CLOSE, M_THINK_OPEN, M_NEMO, M_END};

#define M_LFM {"<|tool_call_start|>", TC_ACT_BLOCK, TC_BLK_JSON}
static const tc_marker g_content_lfm2[] = {M_THINK_OPEN, M_LFM, M_END};
static const tc_marker g_reason_lfm2[] = {M_THINK_CLOSE, M_THINK_OPEN, M_LFM, M_END};

#define M_CPM {"<function name=\"", TC_ACT_BLOCK, TC_BLK_XML}
static const tc_marker g_content_cpm[] = {M_THINK_OPEN, M_CPM, M_END};
static const tc_marker g_reason_cpm[] = {M_THINK_CLOSE, M_THINK_OPEN, M_CPM, M_END};

#define M_GIGA {"function call<|role_sep|>", TC_ACT_BLOCK, TC_BLK_JSON}
/* GigaChat 3.1 opens the call with its own token */
#define M_GIGA31 {"<|function_call|>", TC_ACT_BLOCK, TC_BLK_JSON}
static const tc_marker g_content_giga[] = {M_THINK_OPEN, M_GIGA, M_GIGA31, {"<|message_sep|>", TC_ACT_DROP, 0}, M_END};
static const tc_marker g_reason_giga[] = {M_THINK_CLOSE, M_THINK_OPEN, M_GIGA, M_GIGA31, M_END};

#define M_GEMMA {"<|tool_call>", TC_ACT_BLOCK, TC_BLK_GEMMA}
#define GEMMA_OPEN "<|channel>thought"
/* after the answer: an empty thought, a stray channel close or opener is structure */
static const tc_marker g_content_gemma[] = {{GEMMA_OPEN, TC_ACT_REASON_OPEN, 0},
                                            M_GEMMA,
                                            {GEMMA_OPEN "\n<channel|>", TC_ACT_RDROP, 0},
                                            {GEMMA_OPEN "<channel|>", TC_ACT_RDROP, 0},
                                            {"<channel|>", TC_ACT_RDROP, 0},
                                            {"<|channel>", TC_ACT_RDROP, 0},
                                            M_END};
static const tc_marker g_reason_gemma[] = {{"<channel|>", TC_ACT_REASON_CLOSE, 0},
                                           {GEMMA_OPEN, TC_ACT_REASON_OPEN, 0},
                                           M_GEMMA,
                                           M_END};

#define M_SEED_OPEN {"<seed:think>", TC_ACT_REASON_OPEN, 0}
#define M_SEED_CALL {"<seed:tool_call>", TC_ACT_BLOCK, TC_BLK_TAGGED}
static const tc_marker g_content_seed[] = {M_SEED_OPEN, M_SEED_CALL, M_END};
static const tc_marker g_reason_seed[] = {{"</seed:think>", TC_ACT_REASON_CLOSE, 0}, M_SEED_OPEN, M_SEED_CALL, M_END};

/* Kimi K3: tagged sections <|open|>NAME<|sep|> .. <|close|>NAME<|sep|>; the
 * generation prompt opens think (or response) */
#define K3_THINK "<|open|>think<|sep|>"
#define K3_THINK_END "<|close|>think<|sep|>"
#define K3_RESPONSE "<|open|>response<|sep|>"
#define M_K3_TOOLS {"<|open|>tools<|sep|>", TC_ACT_BLOCK, TC_BLK_XML}
static const tc_marker g_content_k3[] = {{K3_THINK, TC_ACT_REASON_OPEN, 0},
                                         {K3_RESPONSE, TC_ACT_DROP, 0},
                                         {"<|close|>response<|sep|>", TC_ACT_DROP, 0},
                                         {"<|close|>message<|sep|>", TC_ACT_DROP, 0},
                                         M_K3_TOOLS,
                                         M_END};
static const tc_marker g_reason_k3[] = {{K3_THINK_END, TC_ACT_REASON_CLOSE, 0},
                                        {K3_RESPONSE, TC_ACT_REASON_CLOSE, 0},
                                        {K3_THINK, TC_ACT_REASON_OPEN, 0},
                                        M_K3_TOOLS,
                                        M_END};

#define M_MM3_OPEN {"<mm:think>", TC_ACT_REASON_OPEN, 0}
#define M_MM3_CALL {TC_MM3_NS "<tool_call>", TC_ACT_BLOCK, TC_BLK_MM3}
/* a bare </mm:think> opens the answer when thinking is off */
static const tc_marker g_content_mm3[] = {M_MM3_OPEN, {"</mm:think>", TC_ACT_REASON_CLOSE, 0}, M_MM3_CALL, M_END};
static const tc_marker g_reason_mm3[] = {{"</mm:think>", TC_ACT_REASON_CLOSE, 0}, M_MM3_OPEN, M_MM3_CALL, M_END};

#define M_APERTUS {"<|tools_prefix|>", TC_ACT_BLOCK, TC_BLK_JSON}
static const tc_marker g_content_apertus[] = {{"<|inner_prefix|>", TC_ACT_REASON_OPEN, 0}, M_APERTUS, M_END};
static const tc_marker g_reason_apertus[] = {{"<|inner_suffix|>", TC_ACT_REASON_CLOSE, 0},
                                             {"<|inner_prefix|>", TC_ACT_REASON_OPEN, 0},
                                             M_APERTUS,
                                             M_END};

/* Command R+: chat text between its turn tokens, actions as a fenced JSON list */
static const tc_marker g_content_crplus[] = {{"<|CHATBOT_TOKEN|>", TC_ACT_DROP, 0},
                                            {"<|END_OF_TURN_TOKEN|>", TC_ACT_DROP, 0},
                                            {"Action:\n```json", TC_ACT_BLOCK, TC_BLK_JSON},
                                            {"Action: ```json", TC_ACT_BLOCK, TC_BLK_JSON},
                                            M_END};

/* Functionary v3.2: every message starts with >>>RECIPIENT\n */
static const tc_marker g_content_fn32[] = {{">>>", TC_ACT_BLOCK, TC_BLK_RECIPIENT}, M_END};

/* FireFunction v2: a JSON list after "functools", no closing marker */
static const tc_marker g_content_firefn[] = {M_THINK_OPEN, {"functools", TC_ACT_BLOCK, TC_BLK_JSON}, M_END};
static const tc_marker g_reason_firefn[] = {M_THINK_CLOSE, M_THINK_OPEN, {"functools", TC_ACT_BLOCK, TC_BLK_JSON}, M_END};

/* Muse Glimmer: harmony-like messages ended by <|eot|> / <|eom|> */
static const tc_marker g_muse[] = {{"<|eot|>", TC_ACT_H_END, 0},
                                   {"<|eom|>", TC_ACT_H_END, 0},
                                   {"<|start|>", TC_ACT_H_START, 0},
                                   {"<atem:function_calls>", TC_ACT_BLOCK, TC_BLK_XML},
                                   M_END};

/* tencent Hy3: every token carries the ":opensource" tag */
#define HY "opensource"
#define M_HY3_CALLS {"<tool_calls:" HY ">", TC_ACT_BLOCK, TC_BLK_XML}
static const tc_marker g_content_hy3[] = {{"<think:" HY ">", TC_ACT_REASON_OPEN, 0}, M_HY3_CALLS, M_END};
static const tc_marker g_reason_hy3[] = {{"</think:" HY ">", TC_ACT_REASON_CLOSE, 0},
                                         {"<think:" HY ">", TC_ACT_REASON_OPEN, 0},
                                         M_HY3_CALLS,
                                         M_END};

/* upstage Solar Open: <|think|>..<|end|>, then <|begin|>assistant<|content|> or <|tool_calls|> */
#define M_SOLAR_CALLS {"<|tool_calls|>", TC_ACT_BLOCK, TC_BLK_SOLAR}
static const tc_marker g_content_solar[] = {{"<|think|>", TC_ACT_REASON_OPEN, 0},
                                            {"<|begin|>assistant", TC_ACT_DROP, 0},
                                            {"<|content|>", TC_ACT_DROP, 0},
                                            {"<|end|>", TC_ACT_DROP, 0},
                                            M_SOLAR_CALLS,
                                            M_END};
static const tc_marker g_reason_solar[] = {{"<|end|>", TC_ACT_REASON_CLOSE, 0}, M_SOLAR_CALLS, M_END};

/* ---- XML parameter syntaxes ---------------------------------------------------- */

static const tc_xml g_xml_qwen = {
    .invoke_open = "<function=",
    .invoke_close = "</function>",
    .param_open = "<parameter=",
    .param_name_end = '>',
    .param_close = "</parameter>",
    .block_close = "</tool_call>",
    .strip_newlines = true,
    .stream_strings = true,
};

/* Seed-OSS: Qwen3-Coder's syntax in its own block; values are kept whole */
static const tc_xml g_xml_seed = {
    .invoke_open = "<function=",
    .invoke_close = "</function>",
    .param_open = "<parameter=",
    .param_name_end = '>',
    .param_close = "</parameter>",
    .block_close = "</seed:tool_call>",
    .stream_strings = true,
};

static const tc_xml g_xml_k3 = {
    .invoke_open = "<|open|>call tool=\"",
    .invoke_close = "<|close|>call<|sep|>",
    .param_open = "<|open|>argument key=\"",
    .param_name_end = '"',
    .param_close = "<|close|>argument<|sep|>",
    .block_close = "<|close|>tools<|sep|>",
    .stream_strings = true,
    .type_attr = true,
    .tag_end = "<|sep|>",
};

static const tc_xml g_xml_atem = {
    .invoke_open = "<atem:invoke name=\"",
    .invoke_close = "</atem:invoke>",
    .param_open = "<atem:parameter name=\"",
    .param_name_end = '"',
    .param_close = "</atem:parameter>",
    .block_close = "</atem:function_calls>",
    .stream_strings = true,
};

static const tc_xml g_xml_hy3 = {
    .invoke_open = "<tool_call:" HY ">",
    .name_end = "<tool_sep:" HY ">",
    .invoke_close = "</tool_call:" HY ">",
    .param_open = "<arg_key:" HY ">",
    .param_name_end = '<',
    .param_after = "</arg_key:" HY ">",
    .param_after2 = "<arg_value:" HY ">",
    .param_close = "</arg_value:" HY ">",
    .block_close = "</tool_calls:" HY ">",
    .stream_strings = true,
};

static const tc_xml g_xml_glm = {
    .invoke_open = NULL,
    .invoke_close = "</tool_call>",
    .param_open = "<arg_key>",
    .param_name_end = '<',
    .param_after = "</arg_key>",
    .param_after2 = "<arg_value>",
    .param_close = "</arg_value>",
    .block_close = "</tool_call>",
    .stream_strings = true,
};

static const tc_xml g_xml_minimax = {
    .invoke_open = "<invoke name=\"",
    .invoke_close = "</invoke>",
    .param_open = "<parameter name=\"",
    .param_name_end = '"',
    .param_close = "</parameter>",
    .block_close = "</minimax:tool_call>",
    .stream_strings = true,
};

static const tc_xml g_xml_dsml = {
    .invoke_open = "<｜DSML｜invoke name=\"",
    .invoke_close = "</｜DSML｜invoke>",
    .param_open = "<｜DSML｜parameter name=\"",
    .param_name_end = '"',
    .param_close = "</｜DSML｜parameter>",
    .block_close = "</｜DSML｜function_calls>",
    .block_close2 = "</｜DSML｜tool_calls>",
    .stream_strings = true,
    .string_attr = true,
};

static const tc_xml g_xml_cpm = {
    .invoke_open = NULL,
    .invoke_close = "</function>",
    .param_open = "<param name=\"",
    .param_name_end = '"',
    .param_close = "</param>",
    .cdata = true,
};

/* ---- the table ---------------------------------------------------------------- */

static const char *const g_stops_tagged[] = {"</tool_call>", NULL};
static const char *const g_stops_func[] = {"</function>", NULL};
static const char *const g_stops_mistral[] = {"[TOOL_CALLS]", NULL};
static const char *const g_stops_harmony[] = {"<|call|>", "<|end|>", "<|return|>", NULL};
static const char *const g_stops_ds[] = {"<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>", NULL};
static const char *const g_stops_kimi[] = {"<|tool_call_end|>", "<|tool_calls_section_end|>", NULL};
static const char *const g_stops_m1[] = {"</tool_calls>", NULL};
static const char *const g_stops_cohere[] = {"<|END_ACTION|>", NULL};
static const char *const g_stops_nemo[] = {"</TOOLCALL>", NULL};
static const char *const g_stops_lfm[] = {"<|tool_call_end|>", NULL};
static const char *const g_stops_giga[] = {"<|message_sep|>", NULL};
static const char *const g_stops_gemma[] = {"<tool_call|>", NULL};
static const char *const g_stops_none[] = {NULL};
static const char *const g_stops_seed[] = {"</seed:tool_call>", NULL};
static const char *const g_stops_apertus[] = {"<|tools_suffix|>", NULL};
static const char *const g_stops_fence[] = {"```", NULL};
static const char *const g_stops_muse[] = {"<|eot|>", "<|eom|>", NULL};
static const char *const g_stops_solar[] = {"<|tool_call:end|>", NULL};
static const char *const g_stops_fn32[] = {">>>", NULL};

#define THINK .reason_open = "<think>", .reason_close = "</think>"

static const tc_spec g_specs[TOOLCALL_FORMAT_COUNT_] = {
    [TOOLCALL_FORMAT_CONTENT] = {g_content_think, g_reason_think, THINK, .raw_stops = g_stops_none},
    [TOOLCALL_FORMAT_HERMES] = {g_content_tagged, g_reason_tagged, THINK, .xml = &g_xml_qwen,
                                .raw_stops = g_stops_tagged},
    [TOOLCALL_FORMAT_QWEN3_CODER] = {g_content_qwen, g_reason_qwen, THINK, .xml = &g_xml_qwen,
                                     .raw_stops = g_stops_tagged},
    [TOOLCALL_FORMAT_GLM] = {g_content_tagged, g_reason_tagged, THINK, .xml = &g_xml_qwen,
                             .glm = &g_xml_glm, .raw_stops = g_stops_tagged},
    [TOOLCALL_FORMAT_LLAMA3] = {g_content_llama, g_reason_llama, THINK, .raw_stops = g_stops_none,
                                .llama_start = true, .python = true},
    [TOOLCALL_FORMAT_FUNCTIONARY_V3_1] = {g_content_func, g_reason_func, THINK,
                                          .raw_stops = g_stops_func},
    [TOOLCALL_FORMAT_MISTRAL] = {g_content_mistral, g_reason_mistral, .reason_open = "[THINK]",
                                 .reason_close = "[/THINK]", .raw_stops = g_stops_mistral, .json_whole = true},
    [TOOLCALL_FORMAT_GPT_OSS] = {g_harmony, g_harmony, .raw_stops = g_stops_harmony,
                                 .harmony = true},
    [TOOLCALL_FORMAT_DEEPSEEK_R1] = {g_content_ds, g_reason_ds, THINK, .raw_stops = g_stops_ds},
    [TOOLCALL_FORMAT_DEEPSEEK_V3_1] = {g_content_ds, g_reason_ds, THINK, .raw_stops = g_stops_ds},
    [TOOLCALL_FORMAT_DEEPSEEK_V3_2] = {g_content_dsml, g_reason_dsml, THINK, .xml = &g_xml_dsml,
                                       .raw_stops = g_stops_none},
    [TOOLCALL_FORMAT_KIMI_K2] = {g_content_kimi, g_reason_kimi, THINK, .raw_stops = g_stops_kimi},
    [TOOLCALL_FORMAT_MINIMAX_M2] = {g_content_minimax, g_reason_minimax, THINK,
                                    .xml = &g_xml_minimax, .raw_stops = g_stops_none},
    [TOOLCALL_FORMAT_MINIMAX_M1] = {g_content_m1, g_reason_m1, THINK, .json_close = "</tool_calls>",
                                    .raw_stops = g_stops_m1},
    [TOOLCALL_FORMAT_APRIEL] = {g_content_apriel, g_reason_apriel, .reason_open = APRIEL_OPEN,
                                .reason_close = APRIEL_CLOSE, .json_close = "</tool_calls>",
                                .raw_stops = g_stops_m1},
    [TOOLCALL_FORMAT_COMMAND_R7B] = {g_content_cohere, g_reason_cohere,
                                     .reason_open = "<|START_THINKING|>",
                                     .reason_close = "<|END_THINKING|>",
                                     .json_close = "<|END_ACTION|>", .raw_stops = g_stops_cohere},
    [TOOLCALL_FORMAT_GRANITE] = {g_content_granite, g_reason_granite, THINK,
                                 .raw_stops = g_stops_none},
    [TOOLCALL_FORMAT_NEMOTRON_V2] = {g_content_nemotron, g_reason_nemotron, THINK,
                                     .json_close = "</TOOLCALL>", .raw_stops = g_stops_nemo},
    [TOOLCALL_FORMAT_LFM2] = {g_content_lfm2, g_reason_lfm2, THINK, .json_close = "<|tool_call_end|>",
                              .raw_stops = g_stops_lfm, .python = true},
    [TOOLCALL_FORMAT_MINICPM5] = {g_content_cpm, g_reason_cpm, THINK, .xml = &g_xml_cpm,
                                  .raw_stops = g_stops_none},
    [TOOLCALL_FORMAT_GEMMA4] = {g_content_gemma, g_reason_gemma, .reason_open = GEMMA_OPEN,
                                .reason_close = "<channel|>", .raw_stops = g_stops_gemma},
    [TOOLCALL_FORMAT_SEED_OSS] = {g_content_seed, g_reason_seed, .reason_open = "<seed:think>",
                                  .reason_close = "</seed:think>", .xml = &g_xml_seed, .raw_stops = g_stops_seed},
    [TOOLCALL_FORMAT_KIMI_K3] = {g_content_k3, g_reason_k3, .reason_open = K3_THINK, .reason_close = K3_THINK_END,
                                 .xml = &g_xml_k3, .raw_stops = g_stops_none},
    [TOOLCALL_FORMAT_MINIMAX_M3] = {g_content_mm3, g_reason_mm3, .reason_open = "<mm:think>",
                                    .reason_close = "</mm:think>", .raw_stops = g_stops_none},
    [TOOLCALL_FORMAT_APERTUS] = {g_content_apertus, g_reason_apertus, .reason_open = "<|inner_prefix|>",
                                 .reason_close = "<|inner_suffix|>", .json_close = "<|tools_suffix|>",
                                 .raw_stops = g_stops_apertus, .json_name_keyed = true},
    [TOOLCALL_FORMAT_COMMAND_R_PLUS] = {g_content_crplus, g_content_crplus, .json_close = "```",
                                        .raw_stops = g_stops_fence},
    [TOOLCALL_FORMAT_FUNCTIONARY_V3_2] = {g_content_fn32, g_content_fn32, .raw_stops = g_stops_fn32,
                                          .starts_in_block = TC_BLK_RECIPIENT, .content_prefix = "all\n"},
    [TOOLCALL_FORMAT_FIREFUNCTION_V2] = {g_content_firefn, g_reason_firefn, THINK, .raw_stops = g_stops_none},
    [TOOLCALL_FORMAT_MUSE] = {g_muse, g_muse, .xml = &g_xml_atem, .raw_stops = g_stops_muse, .harmony = true,
                              .muse = true},
    [TOOLCALL_FORMAT_HY3] = {g_content_hy3, g_reason_hy3, .reason_open = "<think:" HY ">",
                             .reason_close = "</think:" HY ">", .xml = &g_xml_hy3, .raw_stops = g_stops_none},
    [TOOLCALL_FORMAT_SOLAR_OPEN] = {g_content_solar, g_reason_solar, .reason_open = "<|think|>", .reason_close = "<|end|>",
                                    .raw_stops = g_stops_solar},
    [TOOLCALL_FORMAT_GIGACHAT3] = {g_content_giga, g_reason_giga, THINK, .json_close = "<|message_sep|>",
                                   .raw_stops = g_stops_giga},
};

const tc_spec *tc_spec_of(toolcall_format f)
{
    return (unsigned)f < TOOLCALL_FORMAT_COUNT_ ? &g_specs[f] : &g_specs[0];
}

/* ---- names ---------------------------------------------------------------------- */

static const char *const g_names[] = {
#define TOOLCALL_FORMAT_NAME_(e, name, family) name,
    TOOLCALL_FORMAT_TABLE(TOOLCALL_FORMAT_NAME_)
#undef TOOLCALL_FORMAT_NAME_
};

static const char *const g_families[] = {
#define TOOLCALL_FORMAT_FAM_(e, name, family) family,
    TOOLCALL_FORMAT_TABLE(TOOLCALL_FORMAT_FAM_)
#undef TOOLCALL_FORMAT_FAM_
};

const char *toolcall_format_name(toolcall_format f)
{
    return (unsigned)f < TOOLCALL_FORMAT_COUNT_ ? g_names[f] : "?";
}

const char *toolcall_format_family(toolcall_format f)
{
    return (unsigned)f < TOOLCALL_FORMAT_COUNT_ ? g_families[f] : "?";
}

static const struct {
    const char *alias;
    toolcall_format f;
} g_aliases[] = {
    {"none", TOOLCALL_FORMAT_CONTENT},         {"content-only", TOOLCALL_FORMAT_CONTENT},
    {"qwen", TOOLCALL_FORMAT_HERMES},          {"qwen2.5", TOOLCALL_FORMAT_HERMES},
    {"qwen3", TOOLCALL_FORMAT_HERMES},         {"hermes-2-pro", TOOLCALL_FORMAT_HERMES},
    {"qwen3.5", TOOLCALL_FORMAT_QWEN3_CODER},  {"glm", TOOLCALL_FORMAT_GLM},
    {"glm-4.6", TOOLCALL_FORMAT_GLM},          {"llama3.1", TOOLCALL_FORMAT_LLAMA3},
    {"llama-3", TOOLCALL_FORMAT_LLAMA3},       {"magistral", TOOLCALL_FORMAT_MISTRAL},
    {"mistral-nemo", TOOLCALL_FORMAT_MISTRAL}, {"devstral", TOOLCALL_FORMAT_MISTRAL},
    {"harmony", TOOLCALL_FORMAT_GPT_OSS},      {"deepseek-v3", TOOLCALL_FORMAT_DEEPSEEK_R1},
    {"deepseek", TOOLCALL_FORMAT_DEEPSEEK_R1}, {"deepseek-v4", TOOLCALL_FORMAT_DEEPSEEK_V3_2},
    {"kimi", TOOLCALL_FORMAT_KIMI_K2},         {"minimax", TOOLCALL_FORMAT_MINIMAX_M2},
    {"cohere", TOOLCALL_FORMAT_COMMAND_R7B},   {"lfm2.5", TOOLCALL_FORMAT_LFM2},
};

keel_status toolcall_format_from_name(const char *name, toolcall_format *out)
{
    if (!name) return KEEL_ENOENT;
    for (int i = 0; i < TOOLCALL_FORMAT_COUNT_; i++) {
        if (strcasecmp(name, g_names[i]) == 0) {
            *out = (toolcall_format)i;
            return KEEL_OK;
        }
    }
    for (size_t i = 0; i < BASE_ARRAY_LEN(g_aliases); i++) {
        if (strcasecmp(name, g_aliases[i].alias) == 0) {
            *out = g_aliases[i].f;
            return KEEL_OK;
        }
    }
    return KEEL_ENOENT;
}

const char *toolcall_format_names(void)
{
    static const char all[] =
#define TOOLCALL_FORMAT_LIST_(e, name, family) name ", "
        TOOLCALL_FORMAT_TABLE(TOOLCALL_FORMAT_LIST_)
#undef TOOLCALL_FORMAT_LIST_
        ;
    /* the table's last ", " is cut by the length */
    static char buf[sizeof all];
    if (!buf[0]) {
        memcpy(buf, all, sizeof all - 3);
        buf[sizeof all - 3] = '\0';
    }
    return buf;
}

/* ---- detection -------------------------------------------------------------------- */

static bool has(const char *src, size_t len, const char *needle)
{
    size_t n = strlen(needle);
    if (n == 0 || n > len) return false;
    for (size_t i = 0; i + n <= len; i++) {
        if (src[i] == needle[0] && memcmp(src + i, needle, n) == 0) return true;
    }
    return false;
}

toolcall_format toolcall_detect(const char *s, size_t n)
{
    if (!s) return TOOLCALL_FORMAT_CONTENT;
    if (has(s, n, "<|channel|>")) return TOOLCALL_FORMAT_GPT_OSS;
    if (has(s, n, "<atem:function_calls>")) return TOOLCALL_FORMAT_MUSE;
    if (has(s, n, "[TOOL_CALLS]") || (has(s, n, "[THINK]") && has(s, n, "[/THINK]")))
        return TOOLCALL_FORMAT_MISTRAL;
    if (has(s, n, "dsml_token") || has(s, n, "｜DSML｜")) return TOOLCALL_FORMAT_DEEPSEEK_V3_2;
    if (has(s, n, "message['prefix'] is defined and message['prefix'] and thinking"))
        return TOOLCALL_FORMAT_DEEPSEEK_V3_1;
    if (has(s, n, "<｜tool▁calls▁begin｜>")) {
        /* V3.1 writes name<｜tool▁sep｜>{json}; R1/V3 write function<｜tool▁sep｜>name ```json */
        if (has(s, n, "<｜tool▁call▁begin｜>function<｜tool▁sep｜>") || has(s, n, "```json"))
            return TOOLCALL_FORMAT_DEEPSEEK_R1;
        return has(s, n, "<｜tool▁sep｜>") ? TOOLCALL_FORMAT_DEEPSEEK_V3_1
                                         : TOOLCALL_FORMAT_DEEPSEEK_R1;
    }
    if (has(s, n, "<seed:tool_call>") || has(s, n, "<seed:think>")) return TOOLCALL_FORMAT_SEED_OSS;
    if (has(s, n, "<|tools_prefix|>")) return TOOLCALL_FORMAT_APERTUS;
    if (has(s, n, "<tool_sep{}>") || has(s, n, "<tool_sep:" HY ">")) return TOOLCALL_FORMAT_HY3;
    if (has(s, n, "<|tool_call:begin|>")) return TOOLCALL_FORMAT_SOLAR_OPEN;
    if (has(s, n, "<|tool_calls_section_begin|>")) return TOOLCALL_FORMAT_KIMI_K2;
    if (has(s, n, "'<|open|>'") && has(s, n, "'<|sep|>'")) return TOOLCALL_FORMAT_KIMI_K3;
    if (has(s, n, "<minimax:tool_call>")) return TOOLCALL_FORMAT_MINIMAX_M2;
    if (has(s, n, TC_MM3_NS) || has(s, n, "<mm:think>")) return TOOLCALL_FORMAT_MINIMAX_M3;
    if (has(s, n, "<|START_ACTION|>")) return TOOLCALL_FORMAT_COMMAND_R7B;
    if (has(s, n, "<|CHATBOT_TOKEN|>") && has(s, n, "Action:")) return TOOLCALL_FORMAT_COMMAND_R_PLUS;
    if (has(s, n, ">>>all") || (has(s, n, "'>>>'") && has(s, n, "recipient"))) return TOOLCALL_FORMAT_FUNCTIONARY_V3_2;
    if (has(s, n, "<|tool_call|>")) return TOOLCALL_FORMAT_GRANITE;
    if (has(s, n, "<arg_key>")) return TOOLCALL_FORMAT_GLM;
    if (has(s, n, "<tool_call>") && has(s, n, "<function=") && has(s, n, "<parameter="))
        return TOOLCALL_FORMAT_QWEN3_CODER;
    if (has(s, n, "<function name=\"") && has(s, n, "<param name=\"")) return TOOLCALL_FORMAT_MINICPM5;
    if (has(s, n, "<TOOLCALL>")) return TOOLCALL_FORMAT_NEMOTRON_V2;
    if (has(s, n, "<tool_calls>")) {
        return has(s, n, "[BEGIN FINAL RESPONSE]") || has(s, n, "<tool_calls>[")
                   ? TOOLCALL_FORMAT_APRIEL
                   : TOOLCALL_FORMAT_MINIMAX_M1;
    }
    if (has(s, n, "<tool_call>")) return TOOLCALL_FORMAT_HERMES;
    if (has(s, n, "<|tool_call_start|>") || has(s, n, "<|tool_list_start|>") || has(s, n, "List of tools: ["))
        return TOOLCALL_FORMAT_LFM2;
    if (has(s, n, "<|tool_call>call:")) return TOOLCALL_FORMAT_GEMMA4;
    if (has(s, n, "<|role_sep|>") && has(s, n, "<|message_sep|>") &&
        (has(s, n, "function call") || has(s, n, "<|function_call|>")))
        return TOOLCALL_FORMAT_GIGACHAT3;
    if (has(s, n, "functools[")) return TOOLCALL_FORMAT_FIREFUNCTION_V2;
    if (has(s, n, "<|start_header_id|>") && has(s, n, "<function="))
        return TOOLCALL_FORMAT_FUNCTIONARY_V3_1;
    if (has(s, n, "<|start_header_id|>ipython<|end_header_id|>") || has(s, n, "<|python_tag|>"))
        return TOOLCALL_FORMAT_LLAMA3;
    return TOOLCALL_FORMAT_CONTENT;
}

/* ---- prompt check ------------------------------------------------------------------- */

static bool ends_with(const char *s, size_t n, const char *suf)
{
    size_t k = strlen(suf);
    return k <= n && memcmp(s + n - k, suf, k) == 0;
}

size_t toolcall_forced_prefix(toolcall_format f, const char *name, bool in_reasoning, char *buf, size_t cap)
{
    if (!buf || cap == 0) return 0;
    buf[0] = 0;
    const tc_spec *sp = tc_spec_of(f);
    if (in_reasoning && !sp->reason_close) return 0;
    if (name) { /* names go into JSON strings and tags verbatim */
        if (!name[0]) return 0;
        for (const char *c = name; *c; c++)
            if ((uint8_t)*c < 0x20 || *c == '"' || *c == '\\' || *c == '<' || *c == '>') return 0;
    }
    const char *open, *named_tail;
    switch (f) {
    case TOOLCALL_FORMAT_HERMES:
        open = "<tool_call>\n{\"name\": \"";
        named_tail = "\", \"arguments\": ";
        break;
    case TOOLCALL_FORMAT_QWEN3_CODER:
        open = "<tool_call>\n<function=";
        named_tail = ">\n";
        break;
    case TOOLCALL_FORMAT_LLAMA3:
        open = "{\"name\": \"";
        named_tail = "\", \"parameters\": ";
        break;
    default:
        return 0;
    }
    int n = snprintf(buf, cap, "%s%s%s%s%s", in_reasoning ? sp->reason_close : "", in_reasoning ? "\n\n" : "", open,
                     name ? name : "", name ? named_tail : "");
    if (n < 0 || (size_t)n >= cap) {
        buf[0] = 0;
        return 0;
    }
    return (size_t)n;
}

bool toolcall_prompt_opens_reasoning(toolcall_format f, const char *prompt, size_t len)
{
    const tc_spec *sp = tc_spec_of(f);
    if (!prompt || !sp->reason_open) return false;
    while (len > 0 && tc_is_ws((uint8_t)prompt[len - 1]))
        len--;
    return ends_with(prompt, len, sp->reason_open);
}

/* ---- continuation of a prefilled message ------------------------------------------ */

static keel_status cat(tc_buf *b, const char *s, size_t n)
{
    return n ? tc_buf_append(b, s, n) : KEEL_OK;
}

keel_status toolcall_continuation(toolcall_format f, const char *gen, size_t gen_len, toolcall_cont mode,
                                  bool with_reasoning, const char *reasoning, size_t rl, const char *content,
                                  size_t cl, size_t *cut, char **out, size_t *out_len)
{
    *out = NULL;
    *out_len = 0;
    *cut = gen_len;
    if (mode != TOOLCALL_CONT_CONTENT && mode != TOOLCALL_CONT_REASONING) return KEEL_EINVAL;
    if (!reasoning) rl = 0;
    if (!content) cl = 0;
    const tc_spec *sp = tc_spec_of(f);
    bool want_content = mode == TOOLCALL_CONT_CONTENT;
    tc_buf b = {0};
    keel_status st = KEEL_OK;
    if (sp->harmony) {
        static const char an[] = "<|channel|>analysis<|message|>", fin[] = "<|channel|>final<|message|>",
                          next[] = "<|end|><|start|>assistant";
        if (rl || !want_content) {
            st = cat(&b, an, sizeof an - 1);
            if (!st) st = cat(&b, reasoning, rl);
            if (!st && want_content) st = cat(&b, next, sizeof next - 1);
        }
        if (!st && want_content) st = cat(&b, fin, sizeof fin - 1);
        if (!st && want_content) st = cat(&b, content, cl);
    } else {
        bool opened = false;
        if (!with_reasoning) rl = 0;
        if (sp->reason_open && with_reasoning && gen) {
            size_t ol = strlen(sp->reason_open);
            for (size_t i = 0; i + ol <= gen_len; i++)
                if (memcmp(gen + i, sp->reason_open, ol) == 0) {
                    *cut = i;
                    opened = true;
                    break;
                }
        }
        if (sp->reason_open && with_reasoning && (opened || rl || !want_content)) {
            st = cat(&b, sp->reason_open, strlen(sp->reason_open));
            if (!st) st = cat(&b, reasoning, rl);
            if (!st && want_content) st = cat(&b, sp->reason_close, strlen(sp->reason_close));
        }
        if (!st && want_content && sp->content_prefix) st = cat(&b, sp->content_prefix, strlen(sp->content_prefix));
        if (!st && want_content) st = cat(&b, content, cl);
    }
    if (!st) st = tc_buf_append(&b, "", 0); /* allocates the NUL when empty */
    char *exact = st ? NULL : base_realloc(b.p, b.cap, b.len + 1);
    if (!exact) {
        tc_buf_free(&b);
        return KEEL_ENOMEM;
    }
    b.p = exact;
    *out = b.p;
    *out_len = b.len;
    return KEEL_OK;
}
