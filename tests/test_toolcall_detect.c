/*
 * test_toolcall_detect.c — src/chat/toolcall's format names and detection:
 * every name round trip, detection from inline template snippets, from
 * every fixture template and from every template of llama.cpp's
 * models/templates/ (the files in tests/data, the rest as snippets), and
 * whether a rendered prompt opens the reasoning block.
 */
#include "testutil.h"
#include "base/base.h"
#include "chat/toolcall.h"
#include "chat/toolcall_int.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- names and detection ---------------------------------------------------------------------- */

static void test_names(void **state)
{
    (void)state;
    for (int f = 0; f < TOOLCALL_FORMAT_COUNT_; f++) {
        toolcall_format g;
        assert_ok(toolcall_format_from_name(toolcall_format_name((toolcall_format)f), &g));
        assert_int_equal(g, f);
        assert_non_null(strstr(toolcall_format_names(), toolcall_format_name((toolcall_format)f)));
        assert_true(strlen(toolcall_format_family((toolcall_format)f)) > 5);
    }
    toolcall_format g;
    assert_ok(toolcall_format_from_name("HARMONY", &g));
    assert_int_equal(g, TOOLCALL_FORMAT_GPT_OSS);
    assert_ok(toolcall_format_from_name("qwen3", &g));
    assert_int_equal(g, TOOLCALL_FORMAT_HERMES);
    assert_status(toolcall_format_from_name("nope", &g), KEEL_ENOENT);
    const char *all = toolcall_format_names();
    assert_true(all[strlen(all) - 1] != ' ' && all[strlen(all) - 1] != ',');
    assert_string_equal(toolcall_format_name((toolcall_format)99), "?");
}

static toolcall_format det(const char *s)
{
    return toolcall_detect(s, strlen(s));
}

static void test_detect_snippets(void **state)
{
    (void)state;
    assert_int_equal(det(""), TOOLCALL_FORMAT_CONTENT);
    assert_int_equal(toolcall_detect(NULL, 5), TOOLCALL_FORMAT_CONTENT);
    assert_int_equal(det("{{ '<|im_start|>' + m.content }}<think>"), TOOLCALL_FORMAT_CONTENT);
    assert_int_equal(det("{{- '<tool_call>\\n' }}{{ tool_call | tojson }}"), TOOLCALL_FORMAT_HERMES);
    assert_int_equal(det("<tool_call>\n<function={{ n }}>\n<parameter={{ k }}>"), TOOLCALL_FORMAT_QWEN3_CODER);
    assert_int_equal(det("<tool_call>{{ n }}<arg_key>{{ k }}</arg_key>"), TOOLCALL_FORMAT_GLM);
    assert_int_equal(det("<|start_header_id|>ipython<|end_header_id|>"), TOOLCALL_FORMAT_LLAMA3);
    assert_int_equal(det("<|start_header_id|>x<function={{n}}>"), TOOLCALL_FORMAT_FUNCTIONARY_V3_1);
    assert_int_equal(det("[AVAILABLE_TOOLS]{{t}}[TOOL_CALLS]"), TOOLCALL_FORMAT_MISTRAL);
    assert_int_equal(det("[THINK]{{r}}[/THINK]"), TOOLCALL_FORMAT_MISTRAL);
    assert_int_equal(det("<|start|>assistant<|channel|>final<|message|>"), TOOLCALL_FORMAT_GPT_OSS);
    assert_int_equal(det("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>"),
                     TOOLCALL_FORMAT_DEEPSEEK_R1);
    assert_int_equal(det("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>{{n}}<｜tool▁sep｜>"),
                     TOOLCALL_FORMAT_DEEPSEEK_V3_1);
    assert_int_equal(det("{% set dsml_token = '｜DSML｜' %}"), TOOLCALL_FORMAT_DEEPSEEK_V3_2);
    assert_int_equal(det("<|tool_calls_section_begin|>"), TOOLCALL_FORMAT_KIMI_K2);
    assert_int_equal(det("<minimax:tool_call>"), TOOLCALL_FORMAT_MINIMAX_M2);
    assert_int_equal(det("<tool_calls>\n{\"name\""), TOOLCALL_FORMAT_MINIMAX_M1);
    assert_int_equal(det("<tool_calls>[{{x}}]</tool_calls>"), TOOLCALL_FORMAT_APRIEL);
    assert_int_equal(det("<|END_THINKING|><|START_ACTION|>"), TOOLCALL_FORMAT_COMMAND_R7B);
    assert_int_equal(det("respond only with <|tool_call|>"), TOOLCALL_FORMAT_GRANITE);
    assert_int_equal(det("<TOOLCALL>[...]</TOOLCALL>"), TOOLCALL_FORMAT_NEMOTRON_V2);
    assert_int_equal(det("List of tools: <|tool_list_start|>["), TOOLCALL_FORMAT_LFM2);
    assert_int_equal(det("<function name=\"f\"><param name=\"p\">"), TOOLCALL_FORMAT_MINICPM5);
    assert_int_equal(det("{{- '<|tool_call>call:' + function['name'] + '{' -}}"), TOOLCALL_FORMAT_GEMMA4);
    assert_int_equal(det("x<|role_sep|>y<|message_sep|>function call"), TOOLCALL_FORMAT_GIGACHAT3);
}

/* llama.cpp's models/templates/ that tests/data does not hold (no parser
 * case uses them): the lines that decide their format, copied from the
 * templates at the commit in tests/data/chat-conformance/README.md. The
 * format is the one llama.cpp's parse matches (docs/chat.md). */
static void test_detect_llamacpp_snippets(void **state)
{
    (void)state;
    /* Bielik 11B v3.0: Hermes calls, <think> (autoparser) */
    assert_int_equal(det("{{- ']\\n<|function_list|>\\n\\nAby wywołać narzędzie, użyj formatu <tool_call>{\"name\": "
                         "\"nazwa_narzędzia\", \"arguments\": {\"argument\": \"wartość\"}}</tool_call>.' }}\n"
                         "{{- '\\n<tool_call>\\n{\"name\": \"' + tool_call.name + '\", \"arguments\": ' }}"),
                     TOOLCALL_FORMAT_HERMES);
    /* SmolLM3 3B: no tools, <think> reasoning (autoparser) */
    assert_int_equal(det("{{ \"<|im_start|>assistant\\n\" + \"<think>\\n\\n</think>\\n\" + "
                         "content.lstrip(\"\\n\") + \"<|im_end|>\\n\" }}"),
                     TOOLCALL_FORMAT_CONTENT);
    /* MiniMax M1: one JSON object a line in <tool_calls> (autoparser) */
    assert_int_equal(det("{{ '<beginning_of_sentence>ai name=assistant\\n<tool_calls>\\n' -}}\n"
                         "{{ '{\"name\": \"' + tool_call.function.name + '\", \"arguments\": ' + "
                         "tool_call.function.arguments | tojson + '}\\n' -}}\n"
                         "{{ '</tool_calls><end_of_sentence>\\n' -}}"),
                     TOOLCALL_FORMAT_MINIMAX_M1);
    /* Qwen3 0.6B: Hermes calls, <think> (autoparser) */
    assert_int_equal(det("{%- if '</think>' in message.content %}\n{{- '<tool_call>\\n{\"name\": \"' }}"),
                     TOOLCALL_FORMAT_HERMES);
    /* Gemma 4 31B interleaved: Gemma 4 handler */
    assert_int_equal(det("{%- elif value['type'] | upper == 'OBJECT' -%}\n"
                         "{{- '<|tool_call>call:' + function['name'] + '{' -}}"),
                     TOOLCALL_FORMAT_GEMMA4);
    /* RWKV world (llama.cpp's own): no tools, <think> (autoparser) */
    assert_int_equal(det("{%- set content = content.split('</think>')[-1] -%}\n{{- 'Assistant:' -}}\n"
                         "{{- ' <think>\\n</think>' }}"),
                     TOOLCALL_FORMAT_CONTENT);
    /* Phi-3.5 mini: no tools, no reasoning (autoparser) */
    assert_int_equal(det("{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + "
                         "message['content'] + '<|end|>\n'}}"),
                     TOOLCALL_FORMAT_CONTENT);
    /* Laguna S 2.1, XS 2.1, XS.2: GLM's <arg_key>/<arg_value> (autoparser, Laguna patch) */
    assert_int_equal(det("{{- '<tool_call>' + function_data.name -}}\n"
                         "{{- \"<arg_key>\" ~ k ~ \"</arg_key>\" -}}\n"
                         "{{- \"<arg_value>\" -}}"
                         "{{- v | tojson(ensure_ascii=False) if v is not string else v -}}"
                         "{{- \"</arg_value>\" -}}"),
                     TOOLCALL_FORMAT_GLM);
    assert_int_equal(det("{{- '<tool_call>' + function_data.name }}\n"
                         "{{- \"<arg_key>\" ~ k ~ \"</arg_key>\\n\" -}}"),
                     TOOLCALL_FORMAT_GLM);
    assert_int_equal(det("\"<tool_call>function-name\\n<arg_key>argument-key</arg_key>\\n"
                         "<arg_value>value-of-argument-key</arg_value>\\n\" ~"),
                     TOOLCALL_FORMAT_GLM);
    /* tencent Hy3: :opensource tokens built by format() (autoparser) */
    assert_int_equal(det("{%- set toolcall_begin_token = '<tool_call{}>'.format(HYTK) %}\n"
                         "{%- set toolsep_token = '<tool_sep{}>'.format(HYTK) %}"),
                     TOOLCALL_FORMAT_HY3);
    /* upstage Solar Open 100B (autoparser, Solar Open patch) */
    assert_int_equal(det("{{- \"<|begin|>assistant<|tool_calls|>\" }}\n"
                         "{{- \"<|tool_call:begin|>\" + tool_call.id +\"<|tool_call:name|>\" + "
                         "tool_call.function.name + \"<|tool_call:args|>\" }}\n"
                         "{{- \"<|begin|>assistant<|think|><|end|>\" }}"),
                     TOOLCALL_FORMAT_SOLAR_OPEN);
}

/* Every template of llama.cpp's parser cases (tests/data/chat-conformance/
 * templates, read through KEEL_TESTDATA) with the keel format that matches
 * llama.cpp's parse of it; every file there must be listed. */
static void test_detect_llamacpp_templates(void **state)
{
    (void)state;
    static const struct {
        const char *file;
        toolcall_format f;
    } want[] = {
        {"Apertus-8B-Instruct", TOOLCALL_FORMAT_APERTUS},
        {"Apriel-1.6-15b-Thinker-fixed", TOOLCALL_FORMAT_APRIEL},
        {"ByteDance-Seed-OSS", TOOLCALL_FORMAT_SEED_OSS},
        {"Cohere2MoE", TOOLCALL_FORMAT_COMMAND_R7B},
        {"CohereForAI-c4ai-command-r-plus-tool_use", TOOLCALL_FORMAT_COMMAND_R_PLUS},
        {"CohereForAI-c4ai-command-r7b-12-2024-tool_use", TOOLCALL_FORMAT_COMMAND_R7B},
        {"GLM-4.6", TOOLCALL_FORMAT_GLM},
        {"GLM-4.7-Flash", TOOLCALL_FORMAT_GLM},
        {"GigaChat3-10B-A1.8B", TOOLCALL_FORMAT_GIGACHAT3},
        {"GigaChat3.1-10B-A1.8B", TOOLCALL_FORMAT_GIGACHAT3},
        {"Kimi-K2-Instruct", TOOLCALL_FORMAT_KIMI_K2},
        {"Kimi-K2-Thinking", TOOLCALL_FORMAT_KIMI_K2},
        {"Kimi-K3", TOOLCALL_FORMAT_KIMI_K3},
        {"LFM2-8B-A1B", TOOLCALL_FORMAT_LFM2},
        {"LFM2.5-8B-A1B", TOOLCALL_FORMAT_LFM2},
        {"LFM2.5-Instruct", TOOLCALL_FORMAT_LFM2},
        {"MiMo-VL", TOOLCALL_FORMAT_HERMES},
        {"MiniMax-M2", TOOLCALL_FORMAT_MINIMAX_M2},
        {"MiniMax-M3", TOOLCALL_FORMAT_MINIMAX_M3},
        {"Mistral-Small-3.2-24B-Instruct-2506", TOOLCALL_FORMAT_MISTRAL},
        {"NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", TOOLCALL_FORMAT_QWEN3_CODER},
        {"NVIDIA-Nemotron-Nano-v2", TOOLCALL_FORMAT_NEMOTRON_V2},
        {"NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use", TOOLCALL_FORMAT_HERMES},
        {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use", TOOLCALL_FORMAT_HERMES},
        {"Qwen-QwQ-32B", TOOLCALL_FORMAT_HERMES},
        {"Qwen-Qwen2.5-7B-Instruct", TOOLCALL_FORMAT_HERMES},
        {"Qwen3-Coder", TOOLCALL_FORMAT_QWEN3_CODER},
        {"Qwen3.5-4B", TOOLCALL_FORMAT_QWEN3_CODER},
        {"Reka-Edge", TOOLCALL_FORMAT_HERMES},
        {"StepFun3.5-Flash", TOOLCALL_FORMAT_QWEN3_CODER},
        {"deepseek-ai-DeepSeek-R1-Distill-Llama-8B", TOOLCALL_FORMAT_DEEPSEEK_R1},
        {"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", TOOLCALL_FORMAT_DEEPSEEK_R1},
        {"deepseek-ai-DeepSeek-V3.1", TOOLCALL_FORMAT_DEEPSEEK_V3_1},
        {"deepseek-ai-DeepSeek-V3.2", TOOLCALL_FORMAT_DEEPSEEK_V3_2},
        {"deepseek-ai-DeepSeek-V4-Flash-0731", TOOLCALL_FORMAT_DEEPSEEK_V3_2},
        {"deepseek-ai-DeepSeek-V4", TOOLCALL_FORMAT_DEEPSEEK_V3_2},
        {"fireworks-ai-llama-3-firefunction-v2", TOOLCALL_FORMAT_FIREFUNCTION_V2},
        {"google-gemma-2-2b-it", TOOLCALL_FORMAT_CONTENT},
        {"google-gemma-4-31B-it", TOOLCALL_FORMAT_GEMMA4},
        {"ibm-granite-granite-3.3-2B-Instruct", TOOLCALL_FORMAT_GRANITE},
        {"ibm-granite-granite-4.0", TOOLCALL_FORMAT_HERMES},
        {"ibm-granite-granite-4.1", TOOLCALL_FORMAT_HERMES},
        {"llama-cpp-deepseek-r1", TOOLCALL_FORMAT_DEEPSEEK_R1},
        {"meetkai-functionary-medium-v3.1", TOOLCALL_FORMAT_FUNCTIONARY_V3_1},
        {"meetkai-functionary-medium-v3.2", TOOLCALL_FORMAT_FUNCTIONARY_V3_2},
        {"meta-llama-Llama-3.1-8B-Instruct", TOOLCALL_FORMAT_LLAMA3},
        {"meta-llama-Llama-3.2-3B-Instruct", TOOLCALL_FORMAT_LLAMA3},
        {"meta-llama-Llama-3.3-70B-Instruct", TOOLCALL_FORMAT_LLAMA3},
        {"mistralai-Ministral-3-14B-Reasoning-2512", TOOLCALL_FORMAT_MISTRAL},
        {"mistralai-Mistral-Nemo-Instruct-2407", TOOLCALL_FORMAT_MISTRAL},
        {"moonshotai-Kimi-K2", TOOLCALL_FORMAT_KIMI_K2},
        {"muse-glimmer", TOOLCALL_FORMAT_MUSE},
        {"openai-gpt-oss-120b", TOOLCALL_FORMAT_GPT_OSS},
        {"openbmb-MiniCPM5-1B", TOOLCALL_FORMAT_MINICPM5},
        {"unsloth-Apriel-1.5", TOOLCALL_FORMAT_APRIEL},
        {"unsloth-mistral-Devstral-Small-2507", TOOLCALL_FORMAT_MISTRAL},
    };
    const char *root = getenv("KEEL_TESTDATA");
    char dir[512];
    snprintf(dir, sizeof dir, "%s/chat-conformance/templates", root ? root : "");
    DIR *d = root && *root ? opendir(dir) : NULL;
    if (!d) {
        printf("[  SKIP    ] %s not found (set KEEL_TESTDATA to tests/data)\n",
               root && *root ? dir : "KEEL_TESTDATA");
        return;
    }
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (len < 7 || strcmp(e->d_name + len - 6, ".jinja") != 0) continue;
        size_t k = 0;
        while (k < BASE_ARRAY_LEN(want) &&
               !(strlen(want[k].file) == len - 6 && memcmp(want[k].file, e->d_name, len - 6) == 0))
            k++;
        if (k == BASE_ARRAY_LEN(want)) fail_msg("%s: not in the table (add its expected format)", e->d_name);
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        size_t src_len;
        char *src = test_read_file(path, &src_len);
        assert_non_null(src);
        toolcall_format got = toolcall_detect(src, src_len);
        free(src);
        if (got != want[k].f)
            fail_msg("%s: detected %s, want %s", want[k].file, toolcall_format_name(got),
                     toolcall_format_name(want[k].f));
        n++;
    }
    closedir(d);
    assert_int_equal(n, BASE_ARRAY_LEN(want));
}

/* Every fixture template, with the format its outputs use. */
static void test_detect_fixtures(void **state)
{
    (void)state;
    static const struct {
        const char *file;
        toolcall_format f;
    } want[] = {
        {"Apriel-1.6-15b-Thinker-fixed", TOOLCALL_FORMAT_APRIEL},
        {"Cohere2MoE", TOOLCALL_FORMAT_COMMAND_R7B},
        {"CohereForAI-c4ai-command-r7b-12-2024-tool_use", TOOLCALL_FORMAT_COMMAND_R7B},
        {"GLM-4.6", TOOLCALL_FORMAT_GLM},
        {"GigaChat3-10B-A1.8B", TOOLCALL_FORMAT_GIGACHAT3},
        {"HuggingFaceTB-SmolLM3-3B", TOOLCALL_FORMAT_CONTENT},
        {"Kimi-K2-Instruct", TOOLCALL_FORMAT_KIMI_K2},
        {"Kimi-K2-Thinking", TOOLCALL_FORMAT_KIMI_K2},
        {"LFM2-8B-A1B", TOOLCALL_FORMAT_LFM2},
        {"LFM2.5-8B-A1B", TOOLCALL_FORMAT_LFM2},
        {"MiMo-VL", TOOLCALL_FORMAT_HERMES},
        {"MiniMax-M1", TOOLCALL_FORMAT_MINIMAX_M1},
        {"MiniMax-M2", TOOLCALL_FORMAT_MINIMAX_M2},
        {"Mistral-Small-3.2-24B-Instruct-2506", TOOLCALL_FORMAT_MISTRAL},
        {"NVIDIA-Nemotron-Nano-v2", TOOLCALL_FORMAT_NEMOTRON_V2},
        {"NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use", TOOLCALL_FORMAT_HERMES},
        {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use", TOOLCALL_FORMAT_HERMES},
        {"Qwen-QwQ-32B", TOOLCALL_FORMAT_HERMES},
        {"Qwen-Qwen2.5-7B-Instruct", TOOLCALL_FORMAT_HERMES},
        {"Qwen-Qwen3-0.6B", TOOLCALL_FORMAT_HERMES},
        {"Qwen3-Coder", TOOLCALL_FORMAT_QWEN3_CODER},
        {"Qwen3.5-4B", TOOLCALL_FORMAT_QWEN3_CODER},
        {"deepseek-ai-DeepSeek-R1-Distill-Llama-8B", TOOLCALL_FORMAT_DEEPSEEK_R1},
        {"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", TOOLCALL_FORMAT_DEEPSEEK_R1},
        {"deepseek-ai-DeepSeek-V3.1", TOOLCALL_FORMAT_DEEPSEEK_V3_1},
        {"deepseek-ai-DeepSeek-V3.2", TOOLCALL_FORMAT_DEEPSEEK_V3_2},
        {"deepseek-ai-DeepSeek-V4", TOOLCALL_FORMAT_DEEPSEEK_V3_2},
        {"google-gemma-2-2b-it", TOOLCALL_FORMAT_CONTENT},
        {"google-gemma-4-31B-it-interleaved", TOOLCALL_FORMAT_GEMMA4},
        {"google-gemma-4-31B-it", TOOLCALL_FORMAT_GEMMA4},
        {"ibm-granite-granite-3.3-2B-Instruct", TOOLCALL_FORMAT_GRANITE},
        {"ibm-granite-granite-4.0", TOOLCALL_FORMAT_HERMES},
        {"llama-cpp-rwkv-world", TOOLCALL_FORMAT_CONTENT},
        {"meetkai-functionary-medium-v3.1", TOOLCALL_FORMAT_FUNCTIONARY_V3_1},
        {"meta-llama-Llama-3.1-8B-Instruct", TOOLCALL_FORMAT_LLAMA3},
        {"meta-llama-Llama-3.2-3B-Instruct", TOOLCALL_FORMAT_LLAMA3},
        {"meta-llama-Llama-3.3-70B-Instruct", TOOLCALL_FORMAT_LLAMA3},
        {"microsoft-Phi-3.5-mini-instruct", TOOLCALL_FORMAT_CONTENT},
        {"mistralai-Ministral-3-14B-Reasoning-2512", TOOLCALL_FORMAT_MISTRAL},
        {"mistralai-Mistral-Nemo-Instruct-2407", TOOLCALL_FORMAT_MISTRAL},
        {"moonshotai-Kimi-K2", TOOLCALL_FORMAT_KIMI_K2},
        {"openai-gpt-oss-120b", TOOLCALL_FORMAT_GPT_OSS},
        {"openbmb-MiniCPM5-1B", TOOLCALL_FORMAT_MINICPM5},
        {"poolside-Laguna-S-2.1", TOOLCALL_FORMAT_GLM},
        {"poolside-Laguna-XS-2.1", TOOLCALL_FORMAT_GLM},
        {"poolside-Laguna-XS.2", TOOLCALL_FORMAT_GLM},
        {"unsloth-Apriel-1.5", TOOLCALL_FORMAT_APRIEL},
        {"unsloth-mistral-Devstral-Small-2507", TOOLCALL_FORMAT_MISTRAL},
    };
    if (!test_fixture("templates/cases.json")) return;
    int n = 0;
    for (size_t i = 0; i < BASE_ARRAY_LEN(want); i++) {
        char rel[256];
        snprintf(rel, sizeof rel, "templates/%s.jinja", want[i].file);
        const char *path = test_fixture(rel);
        assert_non_null(path);
        size_t len;
        char *src = test_read_file(path, &len);
        assert_non_null(src);
        toolcall_format got = toolcall_detect(src, len);
        if (got != want[i].f)
            fail_msg("%s: detected %s, want %s", want[i].file, toolcall_format_name(got),
                     toolcall_format_name(want[i].f));
        free(src);
        n++;
    }
    assert_int_equal(n, 48);
}

/* The generation prompts the fixture templates render (basic case), as inline text. */
static void test_prompt_opens_reasoning(void **state)
{
    (void)state;
    static const struct {
        toolcall_format f;
        const char *tail;
        bool open;
    } cases[] = {
        {TOOLCALL_FORMAT_QWEN3_CODER, "<|im_start|>assistant\n<think>\n", true}, /* Qwen3.5 */
        {TOOLCALL_FORMAT_HERMES, "<|im_start|>assistant\n<think>\n</think>", false}, /* QwQ */
        {TOOLCALL_FORMAT_HERMES, "<|im_start|>assistant\n", false},
        {TOOLCALL_FORMAT_DEEPSEEK_R1, "<｜Assistant｜><think>\n", true},
        {TOOLCALL_FORMAT_DEEPSEEK_V3_1, "<｜Assistant｜><think></think>", false},
        {TOOLCALL_FORMAT_DEEPSEEK_V3_2, "<｜Assistant｜></think>", false},
        {TOOLCALL_FORMAT_MINIMAX_M2, "]~b]ai\n<think>\n", true},
        {TOOLCALL_FORMAT_NEMOTRON_V2, "<SPECIAL_11>Assistant\n<think>\n", true},
        {TOOLCALL_FORMAT_COMMAND_R7B, "<|CHATBOT_TOKEN|><|START_THINKING|>", true},
        {TOOLCALL_FORMAT_COMMAND_R7B, "<|CHATBOT_TOKEN|><|START_THINKING|><|END_THINKING|>", false},
        {TOOLCALL_FORMAT_APRIEL, "<|begin_assistant|>\nHere are my reasoning steps:\n", true},
        {TOOLCALL_FORMAT_GLM, "<assistant><think>", true},  /* Laguna S */
        {TOOLCALL_FORMAT_GLM, "<assistant>\n</think>", false}, /* Laguna XS */
        {TOOLCALL_FORMAT_MISTRAL, "[/INST][THINK]", true},
        {TOOLCALL_FORMAT_GPT_OSS, "<|start|>assistant", false},
        {TOOLCALL_FORMAT_GEMMA4, "<|turn>model\n<|channel>thought\n<channel|>", false},
    };
    for (size_t i = 0; i < BASE_ARRAY_LEN(cases); i++) {
        bool got = toolcall_prompt_opens_reasoning(cases[i].f, cases[i].tail, strlen(cases[i].tail));
        if (got != cases[i].open) fail_msg("%s: %s -> %d", toolcall_format_name(cases[i].f), cases[i].tail, got);
    }
    assert_false(toolcall_prompt_opens_reasoning(TOOLCALL_FORMAT_HERMES, NULL, 0));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_detect_snippets),
        cmocka_unit_test(test_detect_fixtures),
        cmocka_unit_test(test_detect_llamacpp_snippets),
        cmocka_unit_test(test_detect_llamacpp_templates),
        cmocka_unit_test(test_prompt_opens_reasoning),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
