/*
 * test_server_api.c — the request converters and response/stream encoders
 * of keel serve (app/server/api_*.c) without HTTP: OpenAI and Anthropic
 * requests into engine requests (normalization, tools and tool_choice,
 * a trailing assistant message and the prefill options, limits, every
 * error with its status), engine responses into both APIs'
 * objects, synthetic engine event sequences (reasoning, text, a tool call)
 * into SSE streams checked event by event, error bodies, the JSON depth
 * scan, UTF-8 repair and the SSE parser.
 */
#include "testutil.h"
#include "server_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static srv_limits lim(void)
{
    srv_limits l = srv_limits_default();
    l.max_tokens_cap = 100;
    l.default_max_tokens = 50;
    l.n_vocab = 512;
    l.max_prompt_tokens = 64;
    l.max_messages = 8;
    l.max_tools = 4;
    return l;
}

static json_t *parse_ok(srv_api api, const char *body, srv_request *rq)
{
    srv_limits l = lim();
    srv_err e;
    if (!srv_request_parse(api, body, strlen(body), &l, rq, &e)) fail_msg("refused (%d): %s\nbody: %s", e.status, e.msg, body);
    return rq->engine;
}

static void parse_err(srv_api api, const char *body, int status, const char *want)
{
    srv_limits l = lim();
    srv_err e;
    srv_request rq;
    if (srv_request_parse(api, body, strlen(body), &l, &rq, &e)) {
        char *s = json_dumps(rq.engine, JSON_COMPACT);
        fail_msg("accepted: %s\n -> %s", body, s);
    }
    if (e.status != status || !strstr(e.msg, want))
        fail_msg("body %s: got %d '%s', want %d '%s'", body, e.status, e.msg, status, want);
    /* the error body has the API's shape */
    char *b = srv_error_body(api, &e);
    json_t *j = json_loads(b, 0, NULL);
    assert_non_null(j);
    if (srv_api_is_anthropic(api)) {
        assert_string_equal(srvt_str(j, "type"), "error");
        assert_non_null(srvt_str(j, "error.type"));
        assert_non_null(strstr(srvt_str(j, "error.message"), want));
    } else {
        assert_int_equal(srvt_int(j, "error.code"), status);
        assert_non_null(srvt_str(j, "error.type"));
        assert_non_null(strstr(srvt_str(j, "error.message"), want));
    }
    json_decref(j);
    free(b);
}

static void test_openai_chat_parse(void **state)
{
    (void)state;
    srv_request rq;
    json_t *r = parse_ok(SRV_API_CHAT,
                         "{\"model\":\"m\",\"stream\":true,\"stream_options\":{\"include_usage\":true},"
                         "\"max_completion_tokens\":1000,\"temperature\":0.5,\"seed\":-1,\"stop\":\"END\",\"n\":1,"
                         "\"messages\":[{\"role\":\"developer\",\"content\":\"be brief\"},"
                         "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\",\"cache_control\":{}},"
                         "{\"type\":\"text\",\"text\":\"b\"}]},"
                         "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\","
                         "\"function\":{\"name\":\"get\",\"arguments\":\"{\\\"x\\\":1}\"}}]},"
                         "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"42\"}],"
                         "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get\",\"parameters\":{\"type\":\"object\"}}},"
                         "{\"type\":\"function\",\"function\":{\"name\":\"put\",\"description\":\"d\"}}],"
                         "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"put\"}}}",
                         &rq);
    assert_true(rq.stream);
    assert_true(rq.include_usage);
    assert_int_equal(srvt_int(r, "max_tokens"), 100); /* capped */
    assert_null(json_object_get(r, "seed"));           /* -1: random */
    assert_string_equal(srvt_str(r, "messages.0.role"), "system");
    assert_string_equal(srvt_str(r, "messages.1.content.1.text"), "b");
    assert_null(json_object_get(json_array_get(json_object_get(json_array_get(json_object_get(r, "messages"), 1), "content"), 0),
                                "cache_control"));
    assert_string_equal(srvt_str(r, "messages.2.tool_calls.0.function.arguments"), "{\"x\":1}");
    assert_string_equal(srvt_str(r, "messages.3.tool_call_id"), "call_1");
    assert_string_equal(srvt_str(r, "stop.0"), "END");
    /* the named tool only */
    assert_int_equal(json_array_size(json_object_get(r, "tools")), 1);
    assert_string_equal(srvt_str(r, "tools.0.function.name"), "put");
    assert_string_equal(srvt_str(r, "tools.0.function.parameters.type"), "object");
    assert_string_equal(srvt_str(r, "tool_choice.name"), "put"); /* the engine opens that call */
    srv_request_free(&rq);
    /* tool_choice none: no tools; default max_tokens; required keeps all */
    r = parse_ok(SRV_API_CHAT,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tool_choice\":\"none\","
                 "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get\"}}]}",
                 &rq);
    assert_null(json_object_get(r, "tools"));
    assert_int_equal(srvt_int(r, "max_tokens"), 50);
    assert_false(rq.stream);
    srv_request_free(&rq);
    r = parse_ok(SRV_API_CHAT,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tool_choice\":\"required\",\"max_tokens\":7,"
                 "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\"}},{\"type\":\"function\",\"function\":{\"name\":\"b\"}}]}",
                 &rq);
    assert_int_equal(json_array_size(json_object_get(r, "tools")), 2);
    assert_int_equal(srvt_int(r, "max_tokens"), 7);
    assert_string_equal(srvt_str(r, "tool_choice"), "required");
    srv_request_free(&rq);
    /* logprobs (chat only) pass to the engine */
    r = parse_ok(SRV_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"logprobs\":true,\"top_logprobs\":3}",
                 &rq);
    assert_true(json_is_true(json_object_get(r, "logprobs")));
    assert_int_equal(srvt_int(r, "top_logprobs"), 3);
    srv_request_free(&rq);
    /* logit_bias passes to the engine, on both OpenAI routes (it was dropped) */
    r = parse_ok(SRV_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"logit_bias\":{\"7\":-100,\"11\":2.5}}",
                 &rq);
    assert_true(json_real_value(json_object_get(json_object_get(r, "logit_bias"), "11")) == 2.5);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(r, "logit_bias"), "7")), -100);
    srv_request_free(&rq);
    r = parse_ok(SRV_API_COMPLETIONS, "{\"prompt\":\"x\",\"logit_bias\":{\"0\":1}}", &rq);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(r, "logit_bias"), "0")), 1);
    srv_request_free(&rq);
    /* a trailing assistant message reaches the engine as sent (the engine
     * continues it by default); continue_final_message and
     * reasoning_format pass to the engine */
    r = parse_ok(SRV_API_CHAT,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},"
                 "{\"role\":\"assistant\",\"content\":\"Once upon\",\"reasoning_content\":\"I'm\"}]}",
                 &rq);
    assert_int_equal(json_array_size(json_object_get(r, "messages")), 2);
    assert_string_equal(srvt_str(r, "messages.1.role"), "assistant");
    assert_string_equal(srvt_str(r, "messages.1.content"), "Once upon");
    assert_string_equal(srvt_str(r, "messages.1.reasoning_content"), "I'm");
    assert_null(json_object_get(r, "continue_final_message"));
    assert_null(json_object_get(r, "reasoning_format"));
    srv_request_free(&rq);
    r = parse_ok(SRV_API_CHAT,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\"a\"}],"
                 "\"continue_final_message\":false,\"reasoning_format\":\"none\"}",
                 &rq);
    assert_true(json_is_false(json_object_get(r, "continue_final_message")));
    assert_string_equal(srvt_str(r, "reasoning_format"), "none");
    srv_request_free(&rq);
    r = parse_ok(SRV_API_CHAT,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\"a\"}],"
                 "\"continue_final_message\":\"reasoning_content\",\"reasoning_format\":\"deepseek-legacy\"}",
                 &rq);
    assert_string_equal(srvt_str(r, "continue_final_message"), "reasoning_content");
    assert_string_equal(srvt_str(r, "reasoning_format"), "deepseek-legacy");
    srv_request_free(&rq);
}

static void test_openai_errors(void **state)
{
    (void)state;
    const char *U = "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]";
    char b[512];
#define E(fmt, st, want)                                                                                               \
    do {                                                                                                               \
        snprintf(b, sizeof b, fmt, U);                                                                                 \
        parse_err(SRV_API_CHAT, b, st, want);                                                                          \
    } while (0)
    E("{%s,\"n\":2}", 400, "n must be 1");
    E("{%s,\"max_tokens\":\"x\"}", 400, "max_tokens must be an integer");
    E("{%s,\"max_tokens\":-5}", 400, "out of range");
    E("{%s,\"max_tokens\":99999999999999999999}", 400, "invalid JSON");
    E("{%s,\"max_tokens\":1e400}", 400, "invalid JSON");
    E("{%s,\"max_tokens\":1e30}", 400, "max_tokens must be an integer");
    E("{%s,\"temperature\":3}", 400, "temperature 3 is out of range");
    E("{%s,\"temperature\":\"hot\"}", 400, "temperature must be a number");
    E("{%s,\"stop\":[1]}", 400, "stop[0] must be a string");
    E("{%s,\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\",\"j\",\"k\",\"l\",\"m\",\"n\",\"o\",\"p\",\"q\"]}", 400, "at most 16");
    E("{%s,\"stream\":\"yes\"}", 400, "stream must be a boolean");
    E("{%s,\"tools\":{}}", 400, "tools must be an array");
    E("{%s,\"tools\":[{\"type\":\"function\",\"function\":{}}]}", 400, "function.name");
    E("{%s,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\"}}],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"zz\"}}}", 400, "not among the tools");
    E("{%s,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\"}}],\"tool_choice\":\"sometimes\"}", 400, "tool_choice 'sometimes'");
    E("{%s,\"top_logprobs\":2}", 400, "top_logprobs needs logprobs");
    E("{%s,\"logprobs\":true,\"top_logprobs\":21}", 400, "top_logprobs must be an integer");
    E("{%s,\"logprobs\":1}", 400, "logprobs must be a boolean");
    E("{%s,\"logit_bias\":{\"512\":1}}", 400, "logit_bias: '512' is not a token id in [0, 512)");
    E("{%s,\"logit_bias\":{\"x1\":1}}", 400, "logit_bias: 'x1' is not a token id");
    E("{%s,\"logit_bias\":{\"01\":1}}", 400, "is not a token id");
    E("{%s,\"logit_bias\":{\"1\":-101}}", 400, "logit_bias[\"1\"] must be a number in [-100, 100]");
    E("{%s,\"logit_bias\":{\"1\":true}}", 400, "must be a number in [-100, 100]");
    E("{%s,\"logit_bias\":[1]}", 400, "logit_bias must be an object");
    E("{%s,\"response_format\":{\"type\":\"xml\"}}", 400, "response_format type must be");
    E("{%s,\"grammar\":5}", 400, "grammar must be a string");
    E("{%s,\"json_schema\":\"x\"}", 400, "json_schema must be a JSON Schema object");
    E("{%s,\"model\":5}", 400, "model must be a string");
    E("{%s,\"continue_final_message\":\"yes\"}", 400, "continue_final_message must be a boolean");
    E("{%s,\"continue_final_message\":1}", 400, "continue_final_message must be a boolean");
    E("{%s,\"reasoning_format\":\"hidden\"}", 400, "reasoning_format must be");
    E("{%s,\"reasoning_format\":false}", 400, "reasoning_format must be");
    E("{%s,\"messages\":[]}", 400, "invalid JSON"); /* duplicate key */
#undef E
    parse_err(SRV_API_CHAT, "{\"messages\":[]}", 400, "must not be empty");
    parse_err(SRV_API_CHAT, "{}", 400, "messages is required");
    parse_err(SRV_API_CHAT, "{\"messages\":\"hi\"}", 400, "messages must be an array");
    parse_err(SRV_API_CHAT, "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", 400, "unknown role 'wizard'");
    parse_err(SRV_API_CHAT, "{\"messages\":[{\"content\":\"x\"}]}", 400, "role must be a string");
    parse_err(SRV_API_CHAT, "{\"messages\":[{\"role\":\"user\"}]}", 400, "needs content");
    parse_err(SRV_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":7}]}", 400, "content must be a string");
    parse_err(SRV_API_CHAT,
              "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{\"url\":\"x\"}}]}]}", 400,
              "'image_url' are not supported");
    parse_err(SRV_API_CHAT, "{\"messages\":[1]}", 400, "messages[0] must be an object");
    parse_err(SRV_API_CHAT,
              "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\",\"content\":\"a\"},"
              "{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\",\"content\":\"a\"},"
              "{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\",\"content\":\"a\"}]}",
              400, "at most 8");
    parse_err(SRV_API_CHAT, "[1,2]", 400, "must be a JSON object");
    parse_err(SRV_API_CHAT, "", 400, "empty");
    parse_err(SRV_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}", 400, "invalid JSON");
    {
        /* U+0000 is accepted (the engine can generate it, and a client echoes
         * its history back); the content keeps all three bytes */
        srv_request rq;
        json_t *eng = parse_ok(SRV_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000b\"}]}", &rq);
        json_t *c = json_object_get(json_array_get(json_object_get(eng, "messages"), 0), "content");
        assert_int_equal(json_string_length(c), 3);
        assert_memory_equal(json_string_value(c), "a\0b", 3);
        srv_request_free(&rq);
    }
    /* deep nesting is refused before jansson sees it */
    char deep[2100];
    size_t n = 0;
    n += (size_t)snprintf(deep, sizeof deep, "{\"messages\":");
    for (int i = 0; i < 1000; i++) deep[n++] = '[';
    for (int i = 0; i < 1000; i++) deep[n++] = ']';
    deep[n++] = '}';
    deep[n] = 0;
    parse_err(SRV_API_CHAT, deep, 400, "nested deeper than 64");
}

static void test_completions_parse(void **state)
{
    (void)state;
    srv_request rq;
    json_t *r = parse_ok(SRV_API_COMPLETIONS, "{\"prompt\":\"Once upon\",\"max_tokens\":3,\"ignore_eos\":true}", &rq);
    assert_string_equal(srvt_str(r, "prompt"), "Once upon");
    assert_int_equal(srvt_int(r, "max_tokens"), 3);
    assert_true(json_is_true(json_object_get(r, "ignore_eos")));
    srv_request_free(&rq);
    r = parse_ok(SRV_API_COMPLETIONS, "{\"prompt\":[1,400,511]}", &rq);
    assert_int_equal(json_array_size(json_object_get(r, "prompt_tokens")), 3);
    assert_int_equal(srvt_int(r, "prompt_tokens.2"), 511);
    srv_request_free(&rq);
    r = parse_ok(SRV_API_COMPLETIONS, "{\"prompt\":[\"one string\"]}", &rq);
    assert_string_equal(srvt_str(r, "prompt"), "one string");
    srv_request_free(&rq);
    parse_err(SRV_API_COMPLETIONS, "{\"prompt\":[1,512]}", 400, "prompt[1] must be a token id in [0, 512)");
    parse_err(SRV_API_COMPLETIONS, "{\"prompt\":[\"a\",\"b\"]}", 400, "one prompt per request");
    parse_err(SRV_API_COMPLETIONS, "{\"prompt\":[]}", 400, "non-empty array");
    r = parse_ok(SRV_API_COMPLETIONS, "{\"prompt\":\"x\",\"logprobs\":2}", &rq); /* legacy: 2 top tokens */
    assert_true(json_is_true(json_object_get(r, "logprobs")));
    assert_int_equal(srvt_int(r, "top_logprobs"), 2);
    srv_request_free(&rq);
    parse_err(SRV_API_COMPLETIONS, "{\"prompt\":\"x\",\"logprobs\":6}", 400, "logprobs must be an integer in [0, 5]");
    parse_err(SRV_API_COMPLETIONS, "{\"prompt\":\"\"}", 400, "prompt is empty");
    parse_err(SRV_API_COMPLETIONS, "{\"prompt\":\"x\",\"echo\":true}", 400, "echo");
    parse_err(SRV_API_COMPLETIONS, "{\"max_tokens\":3}", 400, "prompt is required");
}

static void test_anthropic_parse(void **state)
{
    (void)state;
    srv_request rq;
    json_t *r = parse_ok(
        SRV_API_MESSAGES,
        "{\"model\":\"claude\",\"max_tokens\":20,\"stream\":true,\"metadata\":{\"user_id\":\"u\"},"
        "\"system\":[{\"type\":\"text\",\"text\":\"You are a bot.\",\"cache_control\":{\"type\":\"ephemeral\"}},"
        "{\"type\":\"text\",\"text\":\"Be brief.\"}],"
        "\"messages\":[{\"role\":\"user\",\"content\":\"What is the weather?\"},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"need a tool\",\"signature\":\"s\"},"
        "{\"type\":\"text\",\"text\":\"Let me check.\"},"
        "{\"type\":\"tool_use\",\"id\":\"toolu_9\",\"name\":\"weather\",\"input\":{\"city\":\"Paris\"}}]},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"(note)\"},"
        "{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_9\",\"content\":[{\"type\":\"text\",\"text\":\"sunny\"}]},"
        "{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_8\",\"content\":\"boom\",\"is_error\":true},"
        "{\"type\":\"text\",\"text\":\"thanks\"}]}],"
        "\"tools\":[{\"name\":\"weather\",\"description\":\"w\",\"input_schema\":{\"type\":\"object\"}},"
        "{\"name\":\"other\",\"input_schema\":{\"type\":\"object\"}}],"
        "\"tool_choice\":{\"type\":\"any\"},\"thinking\":{\"type\":\"disabled\"},\"stop_sequences\":[\"###\"],"
        "\"temperature\":1,\"top_k\":5}",
        &rq);
    assert_true(rq.stream);
    json_t *m = json_object_get(r, "messages");
    assert_int_equal(json_array_size(m), 7);
    assert_string_equal(srvt_str(r, "messages.0.role"), "system");
    assert_string_equal(srvt_str(r, "messages.0.content"), "You are a bot.\n\nBe brief.");
    assert_string_equal(srvt_str(r, "messages.1.content"), "What is the weather?");
    assert_string_equal(srvt_str(r, "messages.2.role"), "assistant");
    assert_string_equal(srvt_str(r, "messages.2.content"), "Let me check.");
    assert_string_equal(srvt_str(r, "messages.2.reasoning_content"), "need a tool");
    assert_string_equal(srvt_str(r, "messages.2.tool_calls.0.id"), "toolu_9");
    assert_string_equal(srvt_str(r, "messages.2.tool_calls.0.function.name"), "weather");
    assert_string_equal(srvt_str(r, "messages.2.tool_calls.0.function.arguments.city"), "Paris");
    /* text before the results stays before them; results become tool messages */
    assert_string_equal(srvt_str(r, "messages.3.role"), "user");
    assert_string_equal(srvt_str(r, "messages.3.content.0.text"), "(note)");
    assert_string_equal(srvt_str(r, "messages.4.role"), "tool");
    assert_string_equal(srvt_str(r, "messages.4.tool_call_id"), "toolu_9");
    assert_string_equal(srvt_str(r, "messages.4.content"), "sunny");
    assert_string_equal(srvt_str(r, "messages.5.content"), "Error: boom");
    assert_string_equal(srvt_str(r, "messages.6.content.0.text"), "thanks");
    assert_int_equal(json_array_size(json_object_get(r, "tools")), 2);
    assert_string_equal(srvt_str(r, "tools.0.function.parameters.type"), "object");
    assert_string_equal(srvt_str(r, "tools.0.function.description"), "w");
    assert_true(json_is_false(json_object_get(json_object_get(r, "chat_template_kwargs"), "enable_thinking")));
    assert_string_equal(srvt_str(r, "stop.0"), "###");
    assert_int_equal(srvt_int(r, "max_tokens"), 20);
    assert_int_equal(srvt_int(r, "top_k"), 5);
    assert_string_equal(srvt_str(r, "tool_choice"), "required"); /* any */
    srv_request_free(&rq);
    /* named tool, none, count_tokens */
    const char *T = "\"tools\":[{\"name\":\"a\",\"input_schema\":{}},{\"name\":\"b\",\"input_schema\":{}}]";
    char b[512];
    snprintf(b, sizeof b, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],%s,\"tool_choice\":{\"type\":\"tool\",\"name\":\"b\"}}", T);
    r = parse_ok(SRV_API_MESSAGES, b, &rq);
    assert_int_equal(json_array_size(json_object_get(r, "tools")), 1);
    assert_string_equal(srvt_str(r, "tools.0.function.name"), "b");
    assert_string_equal(srvt_str(r, "tool_choice.name"), "b");
    assert_int_equal(srvt_int(r, "max_tokens"), 50);
    srv_request_free(&rq);
    snprintf(b, sizeof b, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],%s,\"tool_choice\":{\"type\":\"none\"},\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":1024}}", T);
    r = parse_ok(SRV_API_MESSAGES, b, &rq);
    assert_null(json_object_get(r, "tools"));
    assert_true(json_is_true(json_object_get(json_object_get(r, "chat_template_kwargs"), "enable_thinking")));
    srv_request_free(&rq);
    snprintf(b, sizeof b, "{\"model\":\"m\",\"system\":\"S\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],%s}", T);
    r = parse_ok(SRV_API_COUNT_TOKENS, b, &rq);
    assert_int_equal(srvt_int(r, "max_tokens"), 0);
    assert_string_equal(srvt_str(r, "messages.0.content"), "S");
    assert_false(rq.stream);
    srv_request_free(&rq);
    /* a prefill (the last message the assistant's): its text blocks are the
     * content the engine continues, its thinking blocks the reasoning */
    r = parse_ok(SRV_API_MESSAGES,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":["
                 "{\"type\":\"thinking\",\"thinking\":\"I'm\",\"signature\":\"\"},{\"type\":\"text\",\"text\":\"Once \"},"
                 "{\"type\":\"text\",\"text\":\"upon\"}]}]}",
                 &rq);
    assert_int_equal(json_array_size(json_object_get(r, "messages")), 2);
    assert_string_equal(srvt_str(r, "messages.1.role"), "assistant");
    assert_string_equal(srvt_str(r, "messages.1.content"), "Once upon");
    assert_string_equal(srvt_str(r, "messages.1.reasoning_content"), "I'm");
    assert_null(srvt_get(r, "messages.1.tool_calls"));
    assert_null(json_object_get(r, "continue_final_message")); /* continued: the engine's default */
    srv_request_free(&rq);
    r = parse_ok(SRV_API_MESSAGES,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":"
                 "[{\"type\":\"thinking\",\"thinking\":\"I'm\",\"signature\":\"\"}]}]}",
                 &rq);
    assert_string_equal(srvt_str(r, "messages.1.content"), "");
    assert_string_equal(srvt_str(r, "messages.1.reasoning_content"), "I'm");
    srv_request_free(&rq);
    /* whitespace ends an earlier assistant message, or a final one before
     * its tool_use block: accepted */
    r = parse_ok(SRV_API_MESSAGES,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":\"a \"},"
                 "{\"role\":\"user\",\"content\":\"y\"},{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":"
                 "\"b\\n\"},{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"n\",\"input\":{}}]}]}",
                 &rq);
    assert_string_equal(srvt_str(r, "messages.1.content"), "a ");
    srv_request_free(&rq);
    r = parse_ok(SRV_API_MESSAGES,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":\"\"}]}", &rq);
    assert_string_equal(srvt_str(r, "messages.1.content"), "");
    srv_request_free(&rq);
}

static void test_anthropic_errors(void **state)
{
    (void)state;
    parse_err(SRV_API_MESSAGES, "{\"max_tokens\":5}", 400, "messages: field required");
    parse_err(SRV_API_MESSAGES, "{\"messages\":[]}", 400, "at least one message");
    parse_err(SRV_API_MESSAGES, "{\"messages\":[{\"role\":\"system\",\"content\":\"x\"}]}", 400, "unknown role 'system'");
    parse_err(SRV_API_MESSAGES, "{\"messages\":[{\"role\":\"user\",\"content\":[]}]}", 400, "content is empty");
    parse_err(SRV_API_MESSAGES,
              "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\",\"source\":{}}]}]}", 400,
              "'image' are not supported");
    parse_err(SRV_API_MESSAGES, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\"}]}]}", 400,
              "tool_use_id must be a string");
    parse_err(SRV_API_MESSAGES,
              "{\"messages\":[{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"n\",\"input\":[1]}]}]}",
              400, "input must be an object");
    parse_err(SRV_API_MESSAGES,
              "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"web_search_20250305\",\"name\":\"web_search\"}]}",
              400, "server tools are not supported");
    parse_err(SRV_API_MESSAGES,
              "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"name\":\"a\",\"input_schema\":{}}],\"tool_choice\":{\"type\":\"tool\",\"name\":\"q\"}}",
              400, "not among the tools");
    parse_err(SRV_API_MESSAGES, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"system\":[{\"type\":\"image\"}]}", 400,
              "system[0] must be a text block");
    parse_err(SRV_API_MESSAGES, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"thinking\":{\"type\":\"maybe\"}}", 400,
              "thinking must be");
    parse_err(SRV_API_MESSAGES, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop_sequences\":\"x\"}", 400, "stop_sequences must be an array");
    /* the Messages API's max_tokens is a positive integer */
    parse_err(SRV_API_MESSAGES, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":-2}", 400,
              "max_tokens: must be a positive integer");
    parse_err(SRV_API_MESSAGES, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":-1}", 400,
              "max_tokens: must be a positive integer");
    parse_err(SRV_API_MESSAGES, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":0}", 400,
              "max_tokens: must be a positive integer");
    parse_err(SRV_API_MESSAGES, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":1.5}", 400,
              "max_tokens: must be a positive integer");
    parse_err(SRV_API_MESSAGES, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":\"8\"}", 400,
              "max_tokens: must be a positive integer");
    parse_err(SRV_API_MESSAGES, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"metadata\":\"m\"}", 400,
              "metadata must be an object");
    /* Anthropic's rule for a prefill: its text may not end in whitespace */
    const char *ws[] = {"\"a \"", "\"a\\n\"", "\" \"", "[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\\t\"}]"};
    for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) {
        char b2[512];
        snprintf(b2, sizeof b2, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":%s}]}",
                 ws[i]);
        parse_err(SRV_API_MESSAGES, b2, 400, "messages: final assistant content cannot end with trailing whitespace");
        parse_err(SRV_API_COUNT_TOKENS, b2, 400, "final assistant content cannot end with trailing whitespace");
    }
    /* Anthropic's type names for statuses */
    srv_err e;
    srv_fail(&e, 413, "big");
    char *b = srv_error_body(SRV_API_MESSAGES, &e);
    assert_non_null(strstr(b, "\"request_too_large\""));
    free(b);
    srv_fail(&e, 401, "no");
    b = srv_error_body(SRV_API_COUNT_TOKENS, &e);
    assert_non_null(strstr(b, "\"authentication_error\""));
    free(b);
}

/* ---- streams ------------------------------------------------------------------ */

static const char *RESP =
    "{\"id\":3,\"content\":\"Hello\",\"reasoning_content\":\"think\",\"tool_calls\":[{\"id\":\"call_abc\",\"type\":\"function\","
    "\"function\":{\"name\":\"get\",\"arguments\":\"{\\\"a\\\":1}\"}}],\"finish_reason\":\"tool_calls\",\"stop_sequence\":null,"
    "\"usage\":{\"prompt_tokens\":30,\"cached_tokens\":12,\"completion_tokens\":9},\"timings\":{\"prompt_ms\":1.5}}";

static keel_event mkev(keel_event_kind kind, int32_t index, const char *text, const char *id, const char *name,
                       const char *error)
{
    keel_event e;
    memset(&e, 0, sizeof e);
    e.kind = kind;
    e.request = 1;
    e.index = index;
    e.text = text;
    e.len = text ? strlen(text) : 0;
    e.id = id;
    e.name = name;
    e.error = error;
    return e;
}

static void feed(srv_stream *s, srv_buf *out)
{
    keel_event evs[] = {
        mkev(KEEL_EVENT_REASONING, -1, "thi", NULL, NULL, NULL),
        mkev(KEEL_EVENT_REASONING, -1, "nk", NULL, NULL, NULL),
        mkev(KEEL_EVENT_CONTENT, -1, "Hel", NULL, NULL, NULL),
        mkev(KEEL_EVENT_CONTENT, -1, "", NULL, NULL, NULL),
        mkev(KEEL_EVENT_CONTENT, -1, "lo", NULL, NULL, NULL),
        mkev(KEEL_EVENT_TOOL_BEGIN, 0, NULL, "call_abc", "get", NULL),
        mkev(KEEL_EVENT_TOOL_ARGS, 0, "{\"a\":", NULL, NULL, NULL),
        mkev(KEEL_EVENT_TOOL_ARGS, 0, "1}", NULL, NULL, NULL),
        mkev(KEEL_EVENT_TOOL_END, 0, NULL, NULL, NULL, NULL),
    };
    for (size_t i = 0; i < sizeof evs / sizeof evs[0]; i++) assert_true(srv_stream_event(s, &evs[i], out));
    assert_true(srv_stream_done(s, RESP, KEEL_OK, out));
}

/* Issue 25: Anthropic's max_tokens and thinking "adaptive"; the
 * context-overflow errors of every route, in the shapes clients match. */
static void test_issue25_requests(void **state)
{
    (void)state;
    srv_request rq;
    json_t *r = parse_ok(SRV_API_MESSAGES, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":1,"
                                           "\"thinking\":{\"type\":\"adaptive\"}}", &rq);
    assert_int_equal(srvt_int(r, "max_tokens"), 1);
    assert_true(json_is_true(json_object_get(json_object_get(r, "chat_template_kwargs"), "enable_thinking")));
    srv_request_free(&rq);
    /* a token-array prompt past the limit */
    char big[1024] = "{\"prompt\":[";
    for (int i = 0; i < 65; i++) strcat(big, i ? ",1" : "1");
    strcat(big, "]}");
    srv_limits l = lim();
    srv_err e;
    assert_false(srv_request_parse(SRV_API_COMPLETIONS, big, strlen(big), &l, &rq, &e));
    srv_request_free(&rq);
    char *b = srv_error_body(SRV_API_COMPLETIONS, &e);
    json_t *j = json_loads(b, 0, NULL);
    assert_int_equal(e.status, 400);
    assert_string_equal(srvt_str(j, "error.code"), "context_length_exceeded");
    assert_string_equal(srvt_str(j, "error.type"), "invalid_request_error");
    assert_string_equal(srvt_str(j, "error.param"), "prompt");
    assert_non_null(strstr(srvt_str(j, "error.message"), "maximum context length is 64 tokens"));
    assert_non_null(strstr(srvt_str(j, "error.message"), "resulted in 65 tokens"));
    json_decref(j);
    free(b);
    /* the engine's KEEL_ECONTEXT response, on each route */
    static const char resp[] = "{\"error\":\"prompt: 9000 tokens, more than the cache's 4096 cells (no compaction)\","
                               "\"status\":\"KEEL_ECONTEXT\",\"prompt_limit\":4096,\"finish_reason\":\"error\","
                               "\"usage\":{\"prompt_tokens\":9000,\"cached_tokens\":0,\"completion_tokens\":0}}";
    static const srv_api apis[] = {SRV_API_CHAT, SRV_API_COMPLETIONS, SRV_API_MESSAGES};
    for (size_t i = 0; i < sizeof apis / sizeof apis[0]; i++) {
        srv_meta m;
        srv_meta_init(&m, apis[i], "m");
        int status = 0;
        b = srv_response_body(&m, resp, KEEL_ECONTEXT, &status);
        j = json_loads(b, 0, NULL);
        assert_int_equal(status, 400);
        if (apis[i] == SRV_API_MESSAGES) {
            assert_string_equal(srvt_str(j, "type"), "error");
            assert_string_equal(srvt_str(j, "error.type"), "invalid_request_error");
            assert_string_equal(srvt_str(j, "error.message"), "prompt is too long: 9000 tokens > 4096 maximum");
        } else {
            assert_string_equal(srvt_str(j, "error.code"), "context_length_exceeded");
            assert_string_equal(srvt_str(j, "error.type"), "invalid_request_error");
            assert_string_equal(srvt_str(j, "error.param"), apis[i] == SRV_API_CHAT ? "messages" : "prompt");
            assert_non_null(strstr(srvt_str(j, "error.message"), "maximum context length is 4096 tokens. However, your"));
        }
        json_decref(j);
        free(b);
        /* a stream that fails so ends with the same error */
        srv_stream s;
        srv_stream_init(&s, &m, false);
        srv_buf out = {0};
        assert_true(srv_stream_done(&s, resp, KEEL_ECONTEXT, &out));
        assert_non_null(strstr(out.p, apis[i] == SRV_API_MESSAGES ? "prompt is too long: 9000 tokens > 4096 maximum"
                                                                   : "context_length_exceeded"));
        srv_buf_free(&out);
        srv_stream_free(&s);
    }
}

/* The PROMPT event starts a stream: Anthropic's message_start carries the
 * prompt's usage (it was all zeros until message_delta), OpenAI chat sends
 * its role chunk. */
static void test_issue25_stream_start(void **state)
{
    (void)state;
    keel_event ev;
    memset(&ev, 0, sizeof ev);
    ev.kind = KEEL_EVENT_PROMPT;
    ev.index = -1;
    ev.n_prompt_tokens = 30;
    ev.n_cached_tokens = 12;
    srv_meta m;
    srv_meta_init(&m, SRV_API_MESSAGES, "c");
    srv_stream s;
    srv_stream_init(&s, &m, true);
    srv_buf out = {0};
    assert_true(srv_stream_event(&s, &ev, &out));
    srvt_events se;
    assert_true(srvt_parse_sse(out.p, out.len, &se));
    assert_int_equal(json_array_size(se.names), 2);
    assert_string_equal(json_string_value(json_array_get(se.names, 0)), "message_start");
    assert_string_equal(json_string_value(json_array_get(se.names, 1)), "ping");
    assert_int_equal(srvt_int(se.data, "0.message.usage.input_tokens"), 18);
    assert_int_equal(srvt_int(se.data, "0.message.usage.cache_read_input_tokens"), 12);
    assert_int_equal(srvt_int(se.data, "0.message.usage.output_tokens"), 0);
    srvt_events_free(&se);
    srv_stream_free(&s);
    srv_buf_reset(&out);
    srv_meta_init(&m, SRV_API_CHAT, "c");
    srv_stream_init(&s, &m, false);
    assert_true(srv_stream_event(&s, &ev, &out));
    assert_true(srvt_parse_sse(out.p, out.len, &se));
    assert_int_equal(json_array_size(se.data), 1);
    assert_string_equal(srvt_str(se.data, "0.choices.0.delta.role"), "assistant");
    srvt_events_free(&se);
    srv_stream_free(&s);
    srv_buf_free(&out);
}

static void test_openai_stream(void **state)
{
    (void)state;
    srv_meta m;
    srv_meta_init(&m, SRV_API_CHAT, "model-x");
    assert_memory_equal(m.id, "chatcmpl-", 9);
    srv_stream s;
    srv_stream_init(&s, &m, true);
    srv_buf out = {0};
    feed(&s, &out);
    srvt_events ev;
    assert_true(srvt_parse_sse(out.p, out.len, &ev));
    size_t n = json_array_size(ev.data);
    /* role, 2 reasoning, 2 content, tool begin, 2 args, finish, usage, [DONE] */
    assert_int_equal(n, 11);
    json_t *d = ev.data;
    assert_string_equal(srvt_str(d, "0.object"), "chat.completion.chunk");
    assert_string_equal(srvt_str(d, "0.id"), m.id);
    assert_string_equal(srvt_str(d, "0.model"), "model-x");
    assert_string_equal(srvt_str(d, "0.choices.0.delta.role"), "assistant");
    assert_string_equal(srvt_str(d, "1.choices.0.delta.reasoning_content"), "thi");
    assert_string_equal(srvt_str(d, "2.choices.0.delta.reasoning_content"), "nk");
    assert_string_equal(srvt_str(d, "3.choices.0.delta.content"), "Hel");
    assert_string_equal(srvt_str(d, "4.choices.0.delta.content"), "lo");
    assert_string_equal(srvt_str(d, "5.choices.0.delta.tool_calls.0.id"), "call_abc");
    assert_string_equal(srvt_str(d, "5.choices.0.delta.tool_calls.0.type"), "function");
    assert_string_equal(srvt_str(d, "5.choices.0.delta.tool_calls.0.function.name"), "get");
    assert_int_equal(srvt_int(d, "6.choices.0.delta.tool_calls.0.index"), 0);
    assert_string_equal(srvt_str(d, "6.choices.0.delta.tool_calls.0.function.arguments"), "{\"a\":");
    assert_string_equal(srvt_str(d, "7.choices.0.delta.tool_calls.0.function.arguments"), "1}");
    assert_null(json_object_get(json_object_get(json_array_get(json_object_get(json_array_get(d, 7), "choices"), 0), "delta"), "id"));
    assert_string_equal(srvt_str(d, "8.choices.0.finish_reason"), "tool_calls");
    assert_true(json_is_null(json_object_get(json_array_get(json_object_get(json_array_get(d, 3), "choices"), 0), "finish_reason")));
    assert_int_equal(json_array_size(json_object_get(json_array_get(d, 9), "choices")), 0);
    assert_int_equal(srvt_int(d, "9.usage.prompt_tokens"), 30);
    assert_int_equal(srvt_int(d, "9.usage.completion_tokens"), 9);
    assert_int_equal(srvt_int(d, "9.usage.total_tokens"), 39);
    assert_int_equal(srvt_int(d, "9.usage.prompt_tokens_details.cached_tokens"), 12);
    assert_string_equal(json_string_value(json_array_get(d, 10)), "[DONE]");
    /* every event is "data: ...\n\n" */
    assert_memory_equal(out.p, "data: {", 7);
    assert_memory_equal(out.p + out.len - 14, "data: [DONE]\n\n", 14);
    srvt_events_free(&ev);
    /* without include_usage there is no usage chunk; completions use text */
    srv_buf_reset(&out);
    srv_meta_init(&m, SRV_API_COMPLETIONS, "m");
    srv_stream_init(&s, &m, false);
    feed(&s, &out);
    assert_true(srvt_parse_sse(out.p, out.len, &ev));
    assert_int_equal(json_array_size(ev.data), 4); /* 2 content, finish, [DONE] */
    assert_string_equal(srvt_str(ev.data, "0.object"), "text_completion");
    assert_string_equal(srvt_str(ev.data, "0.choices.0.text"), "Hel");
    assert_string_equal(srvt_str(ev.data, "2.choices.0.text"), "");
    assert_non_null(srvt_str(ev.data, "2.choices.0.finish_reason"));
    srvt_events_free(&ev);
    srv_buf_free(&out);
}

/* Streaming logprobs (issue 25: they came all in the last chunk): each
 * chunk carries the entries of the tokens before its text, the last chunk
 * those whose text never went out; concatenated they are the answer's.
 * Chat in OpenAI's chat shape, completions in the legacy one with
 * text_offset continuing across chunks. */
#define LPE(t, v) "{\"token\":\"" t "\",\"logprob\":" v ",\"bytes\":[],\"top_logprobs\":[{\"token\":\"" t "\",\"logprob\":" v ",\"bytes\":[]}]}"
static const char *LP_A = LPE("He", "-0.5"), *LP_B = LPE("l", "-1.5"), *LP_C = LPE("lo", "-0.25"), *LP_D = LPE("!", "-2.5");

static void feed_lp(srv_stream *s, srv_buf *out, const char *resp)
{
    keel_event evs[] = {
        mkev(KEEL_EVENT_LOGPROB, -1, LP_A, NULL, NULL, NULL), mkev(KEEL_EVENT_CONTENT, -1, "He", NULL, NULL, NULL),
        mkev(KEEL_EVENT_LOGPROB, -1, LP_B, NULL, NULL, NULL), mkev(KEEL_EVENT_LOGPROB, -1, LP_C, NULL, NULL, NULL),
        mkev(KEEL_EVENT_CONTENT, -1, "llo", NULL, NULL, NULL), mkev(KEEL_EVENT_LOGPROB, -1, LP_D, NULL, NULL, NULL),
    };
    for (size_t i = 0; i < sizeof evs / sizeof evs[0]; i++) assert_true(srv_stream_event(s, &evs[i], out));
    assert_true(srv_stream_done(s, resp, KEEL_OK, out));
}

static void test_stream_logprobs(void **state)
{
    (void)state;
    char resp[2048];
    snprintf(resp, sizeof resp,
             "{\"id\":3,\"content\":\"Hello\",\"tool_calls\":[],\"finish_reason\":\"stop\",\"stop_sequence\":\"!\","
             "\"logprobs\":{\"content\":[%s,%s,%s,%s]},\"usage\":{\"prompt_tokens\":3,\"cached_tokens\":0,"
             "\"completion_tokens\":4}}",
             LP_A, LP_B, LP_C, LP_D);
    json_t *root = json_loads(resp, 0, NULL);
    json_t *want = json_object_get(json_object_get(root, "logprobs"), "content");
    srv_meta m;
    srv_meta_init(&m, SRV_API_CHAT, "m");
    srv_stream s;
    srv_stream_init(&s, &m, false);
    srv_buf out = {0};
    feed_lp(&s, &out, resp);
    srvt_events ev;
    assert_true(srvt_parse_sse(out.p, out.len, &ev));
    /* role, "He", "llo", finish, [DONE] */
    assert_int_equal(json_array_size(ev.data), 5);
    assert_true(json_is_null(json_object_get(json_array_get(json_object_get(json_array_get(ev.data, 0), "choices"), 0), "logprobs")));
    assert_int_equal(json_array_size(srvt_get(ev.data, "1.choices.0.logprobs.content")), 1);
    assert_string_equal(srvt_str(ev.data, "1.choices.0.logprobs.content.0.token"), "He");
    assert_int_equal(json_array_size(srvt_get(ev.data, "2.choices.0.logprobs.content")), 2);
    assert_int_equal(json_array_size(srvt_get(ev.data, "3.choices.0.logprobs.content")), 1);
    json_t *cat = json_array();
    for (int i = 1; i <= 3; i++) {
        char path[64];
        snprintf(path, sizeof path, "%d.choices.0.logprobs.content", i);
        json_array_extend(cat, srvt_get(ev.data, path));
    }
    assert_true(json_equal(cat, want));
    json_decref(cat);
    srvt_events_free(&ev);
    srv_stream_free(&s);
    /* completions: the legacy shape, offsets across chunks */
    srv_buf_reset(&out);
    srv_meta_init(&m, SRV_API_COMPLETIONS, "m");
    srv_stream_init(&s, &m, false);
    feed_lp(&s, &out, resp);
    assert_true(srvt_parse_sse(out.p, out.len, &ev));
    assert_int_equal(json_array_size(ev.data), 4); /* "He", "llo", finish, [DONE] */
    assert_string_equal(srvt_str(ev.data, "0.choices.0.logprobs.tokens.0"), "He");
    assert_int_equal(srvt_int(ev.data, "0.choices.0.logprobs.text_offset.0"), 0);
    assert_string_equal(srvt_str(ev.data, "1.choices.0.logprobs.tokens.1"), "lo");
    assert_int_equal(srvt_int(ev.data, "1.choices.0.logprobs.text_offset.0"), 2);
    assert_int_equal(srvt_int(ev.data, "1.choices.0.logprobs.text_offset.1"), 3);
    assert_true(json_real_value(srvt_get(ev.data, "1.choices.0.logprobs.token_logprobs.1")) == -0.25);
    assert_true(json_real_value(srvt_get(ev.data, "1.choices.0.logprobs.top_logprobs.0.l")) == -1.5);
    assert_string_equal(srvt_str(ev.data, "2.choices.0.logprobs.tokens.0"), "!");
    assert_int_equal(srvt_int(ev.data, "2.choices.0.logprobs.text_offset.0"), 5);
    srvt_events_free(&ev);
    srv_stream_free(&s);
    srv_buf_free(&out);
    /* the answer (not streamed) in the legacy shape */
    char *body = srv_openai_response(&m, root);
    assert_non_null(body);
    json_t *b = json_loads(body, 0, NULL);
    assert_int_equal(json_array_size(srvt_get(b, "choices.0.logprobs.tokens")), 4);
    assert_int_equal(srvt_int(b, "choices.0.logprobs.text_offset.3"), 5);
    json_decref(b);
    free(body);
    json_decref(root);
}

static void test_anthropic_stream(void **state)
{
    (void)state;
    srv_meta m;
    srv_meta_init(&m, SRV_API_MESSAGES, "claude-x");
    assert_memory_equal(m.id, "msg_", 4);
    srv_stream s;
    srv_stream_init(&s, &m, true);
    srv_buf out = {0};
    feed(&s, &out);
    srvt_events ev;
    assert_true(srvt_parse_sse(out.p, out.len, &ev));
    static const char *const want[] = {
        "message_start", "ping", "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop", "content_block_start",
        "content_block_delta", "content_block_stop", "message_delta", "message_stop"};
    size_t n = json_array_size(ev.names);
    if (n != sizeof want / sizeof want[0]) fail_msg("%zu events:\n%s", n, out.p);
    for (size_t i = 0; i < n; i++) {
        assert_string_equal(json_string_value(json_array_get(ev.names, i)), want[i]);
        /* the data's type repeats the event name */
        assert_string_equal(srvt_str(json_array_get(ev.data, i), "type"), want[i]);
    }
    json_t *d = ev.data;
    assert_string_equal(srvt_str(d, "0.message.id"), m.id);
    assert_string_equal(srvt_str(d, "0.message.role"), "assistant");
    assert_string_equal(srvt_str(d, "0.message.model"), "claude-x");
    assert_int_equal(srvt_int(d, "2.index"), 0);
    assert_string_equal(srvt_str(d, "2.content_block.type"), "thinking");
    assert_string_equal(srvt_str(d, "3.delta.type"), "thinking_delta");
    assert_string_equal(srvt_str(d, "3.delta.thinking"), "thi");
    assert_int_equal(srvt_int(d, "5.index"), 0);
    assert_int_equal(srvt_int(d, "6.index"), 1);
    assert_string_equal(srvt_str(d, "6.content_block.type"), "text");
    assert_string_equal(srvt_str(d, "7.delta.type"), "text_delta");
    assert_string_equal(srvt_str(d, "8.delta.text"), "lo");
    assert_int_equal(srvt_int(d, "10.index"), 2);
    assert_string_equal(srvt_str(d, "10.content_block.type"), "tool_use");
    assert_string_equal(srvt_str(d, "10.content_block.id"), "toolu_abc");
    assert_string_equal(srvt_str(d, "10.content_block.name"), "get");
    assert_true(json_is_object(json_object_get(json_object_get(json_array_get(d, 10), "content_block"), "input")));
    /* the input goes out whole when the call ends */
    assert_string_equal(srvt_str(d, "11.delta.type"), "input_json_delta");
    assert_string_equal(srvt_str(d, "11.delta.partial_json"), "{\"a\":1}");
    assert_int_equal(srvt_int(d, "12.index"), 2);
    assert_string_equal(srvt_str(d, "13.delta.stop_reason"), "tool_use");
    assert_int_equal(srvt_int(d, "13.usage.output_tokens"), 9);
    assert_int_equal(srvt_int(d, "13.usage.input_tokens"), 18);
    assert_int_equal(srvt_int(d, "13.usage.cache_read_input_tokens"), 12);
    srvt_events_free(&ev);
    srv_stream_free(&s);
    /* a malformed call (the engine says why at its end) gets {}; so does one
     * cut off by the end of the output */
    for (int k = 0; k < 2; k++) {
        srv_buf_reset(&out);
        srv_stream_init(&s, &m, true);
        keel_event evs[] = {
            mkev(KEEL_EVENT_TOOL_BEGIN, 0, NULL, "call_x", "f", NULL),
            mkev(KEEL_EVENT_TOOL_ARGS, 0, "{\"a\": [1, 2", NULL, NULL, NULL),
            mkev(KEEL_EVENT_TOOL_END, 0, NULL, NULL, NULL, "the arguments are not valid JSON"),
        };
        for (size_t i = 0; i < (k == 0 ? 3u : 2u); i++) assert_true(srv_stream_event(&s, &evs[i], &out));
        assert_true(srv_stream_done(&s, RESP, KEEL_OK, &out));
        assert_true(srvt_parse_sse(out.p, out.len, &ev));
        assert_string_equal(srvt_str(ev.data, "3.delta.partial_json"), "{}");
        assert_string_equal(json_string_value(json_array_get(ev.names, 4)), "content_block_stop");
        srvt_events_free(&ev);
        srv_stream_free(&s);
    }
    /* a keep-alive is a ping event once started */
    srv_buf_reset(&out);
    srv_stream_init(&s, &m, true);
    assert_true(srv_stream_ping(&s, &out));
    assert_int_equal(out.len, 0);
    srv_buf_free(&out);
}

static void test_stream_errors(void **state)
{
    (void)state;
    const char *resp = "{\"error\":\"context full: the prompt needs 900 more cells\",\"status\":\"KEEL_EFULL\",\"finish_reason\":\"error\"}";
    srv_meta m;
    srv_stream s;
    srv_buf out = {0};
    srvt_events ev;
    srv_meta_init(&m, SRV_API_CHAT, "m");
    srv_stream_init(&s, &m, true);
    keel_event c = mkev(KEEL_EVENT_CONTENT, -1, "x", NULL, NULL, NULL);
    assert_true(srv_stream_event(&s, &c, &out));
    assert_true(srv_stream_done(&s, resp, KEEL_EFULL, &out));
    assert_true(srvt_parse_sse(out.p, out.len, &ev));
    json_t *last = json_array_get(ev.data, json_array_size(ev.data) - 1);
    assert_non_null(strstr(srvt_str(last, "error.message"), "context full"));
    assert_int_equal(srvt_int(last, "error.code"), 503);
    srvt_events_free(&ev);
    srv_buf_reset(&out);
    srv_meta_init(&m, SRV_API_MESSAGES, "m");
    srv_stream_init(&s, &m, true);
    assert_true(srv_stream_event(&s, &c, &out));
    assert_true(srv_stream_done(&s, resp, KEEL_EFULL, &out));
    assert_true(srvt_parse_sse(out.p, out.len, &ev));
    size_t n = json_array_size(ev.names);
    assert_string_equal(json_string_value(json_array_get(ev.names, n - 1)), "error");
    assert_string_equal(srvt_str(json_array_get(ev.data, n - 1), "error.type"), "overloaded_error");
    srvt_events_free(&ev);
    srv_buf_free(&out);
}

static void test_responses(void **state)
{
    (void)state;
    srv_meta m;
    int status = 0;
    srv_meta_init(&m, SRV_API_CHAT, "m");
    char *b = srv_response_body(&m, RESP, KEEL_OK, &status);
    assert_int_equal(status, 200);
    json_t *j = json_loads(b, 0, NULL);
    assert_string_equal(srvt_str(j, "object"), "chat.completion");
    assert_string_equal(srvt_str(j, "choices.0.message.role"), "assistant");
    assert_string_equal(srvt_str(j, "choices.0.message.content"), "Hello");
    assert_string_equal(srvt_str(j, "choices.0.message.reasoning_content"), "think");
    assert_string_equal(srvt_str(j, "choices.0.message.tool_calls.0.function.arguments"), "{\"a\":1}");
    assert_string_equal(srvt_str(j, "choices.0.finish_reason"), "tool_calls");
    assert_int_equal(srvt_int(j, "usage.prompt_tokens_details.cached_tokens"), 12);
    json_decref(j);
    free(b);
    srv_meta_init(&m, SRV_API_MESSAGES, "m");
    b = srv_response_body(&m, RESP, KEEL_OK, &status);
    j = json_loads(b, 0, NULL);
    assert_int_equal(status, 200);
    assert_string_equal(srvt_str(j, "type"), "message");
    assert_string_equal(srvt_str(j, "content.0.type"), "thinking");
    assert_string_equal(srvt_str(j, "content.1.text"), "Hello");
    assert_string_equal(srvt_str(j, "content.2.type"), "tool_use");
    assert_string_equal(srvt_str(j, "content.2.id"), "toolu_abc");
    assert_int_equal(srvt_int(j, "content.2.input.a"), 1);
    assert_string_equal(srvt_str(j, "stop_reason"), "tool_use");
    assert_int_equal(srvt_int(j, "usage.input_tokens"), 18);
    assert_int_equal(srvt_int(j, "usage.cache_read_input_tokens"), 12);
    json_decref(j);
    free(b);
    b = srv_response_body(&m, "{\"content\":\"x\",\"finish_reason\":\"stop\",\"stop_sequence\":\"##\",\"usage\":{}}", KEEL_OK, &status);
    assert_non_null(strstr(b, "\"stop_reason\":\"stop_sequence\""));
    assert_non_null(strstr(b, "\"stop_sequence\":\"##\""));
    free(b);
    b = srv_response_body(&m, "{\"content\":\"x\",\"finish_reason\":\"length\",\"usage\":{}}", KEEL_OK, &status);
    assert_non_null(strstr(b, "\"stop_reason\":\"max_tokens\""));
    free(b);
    srv_meta_init(&m, SRV_API_COUNT_TOKENS, "m");
    b = srv_response_body(&m, RESP, KEEL_OK, &status);
    assert_string_equal(b, "{\"input_tokens\":30}");
    free(b);
    /* engine failures: status and shape */
    srv_meta_init(&m, SRV_API_CHAT, "m");
    b = srv_response_body(&m, "{\"error\":\"prompt: 9000 tokens, more than the 4096 a slot holds\",\"finish_reason\":\"error\"}",
                          KEEL_ECONTEXT, &status);
    assert_int_equal(status, 400);
    j = json_loads(b, 0, NULL);
    assert_string_equal(srvt_str(j, "error.code"), "context_length_exceeded");
    assert_non_null(strstr(srvt_str(j, "error.message"), "9000 tokens"));
    json_decref(j);
    free(b);
    srv_meta_init(&m, SRV_API_MESSAGES, "m");
    b = srv_response_body(&m, "{\"error\":\"chat template: line 3: boom\"}", KEEL_EINVAL, &status);
    assert_int_equal(status, 400);
    assert_non_null(strstr(b, "\"invalid_request_error\""));
    free(b);
    b = srv_response_body(&m, "not json", KEEL_OK, &status);
    assert_int_equal(status, 500);
    free(b);
}

static void test_helpers(void **state)
{
    (void)state;
    assert_int_equal(srv_json_depth("{\"a\":\"[[[[{{{\",\"b\":[1,[2]]}", 26, 64), 3);
    assert_int_equal(srv_json_depth("\"\\\"[[\"", 6, 64), 0);
    json_t *t = srv_json_text("a\xff" "b\xe2\x82", 5);
    assert_string_equal(json_string_value(t), "a\xef\xbf\xbd" "b\xef\xbf\xbd\xef\xbf\xbd");
    json_decref(t);
    char id[64];
    srv_toolu_id("call_x1", id, sizeof id);
    assert_string_equal(id, "toolu_x1");
    srv_toolu_id("toolu_y", id, sizeof id);
    assert_string_equal(id, "toolu_y");
    srv_toolu_id("abc", id, sizeof id);
    assert_string_equal(id, "toolu_abc");
    /* SSE framing: a stray line is a framing error, comments are counted */
    srvt_events ev;
    const char *good = ": keep-alive\n\ndata: {\"a\":1}\n\nevent: x\ndata: [DONE]\n\n";
    assert_true(srvt_parse_sse(good, strlen(good), &ev));
    assert_int_equal(ev.comments, 1);
    assert_int_equal(json_array_size(ev.data), 2);
    assert_string_equal(json_string_value(json_array_get(ev.names, 1)), "x");
    srvt_events_free(&ev);
    const char *badf = "data: {}\nwhat\n\n";
    assert_false(srvt_parse_sse(badf, strlen(badf), &ev));
    srvt_events_free(&ev);
    const char *cut = "data: {}\n\ndata: {}";
    assert_false(srvt_parse_sse(cut, strlen(cut), &ev));
    srvt_events_free(&ev);
    /* bounded buffers refuse to grow past their maximum */
    srv_buf b = {0};
    b.max = 8;
    assert_true(srv_buf_adds(&b, "1234567"));
    assert_false(srv_buf_adds(&b, "89"));
    assert_true(b.overflow);
    srv_buf_free(&b);
}

/* test_server_api --write-sse DIR: the SSE bytes of the tool-call streams
 * (both APIs) for tests/server-clients, whose SDK clients must parse them. */
static int write_sse(const char *dir)
{
    static const srv_api apis[2] = {SRV_API_CHAT, SRV_API_MESSAGES};
    static const char *const names[2] = {"openai_tools.sse", "anthropic_tools.sse"};
    for (int i = 0; i < 2; i++) {
        srv_meta m;
        srv_meta_init(&m, apis[i], "keel-test");
        srv_stream s;
        srv_stream_init(&s, &m, true);
        srv_buf out = {0};
        feed(&s, &out);
        srv_stream_free(&s);
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        FILE *f = fopen(path, "wb");
        bool ok = f && fwrite(out.p, 1, out.len, f) == out.len;
        if (f && fclose(f) != 0) ok = false;
        srv_buf_free(&out);
        if (!ok) {
            fprintf(stderr, "test_server_api: cannot write %s\n", path);
            return 1;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--write-sse") == 0) return write_sse(argv[2]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_openai_chat_parse), cmocka_unit_test(test_openai_errors),
        cmocka_unit_test(test_completions_parse), cmocka_unit_test(test_anthropic_parse),
        cmocka_unit_test(test_anthropic_errors),  cmocka_unit_test(test_openai_stream), cmocka_unit_test(test_stream_logprobs),
        cmocka_unit_test(test_anthropic_stream),  cmocka_unit_test(test_stream_errors),
        cmocka_unit_test(test_responses),         cmocka_unit_test(test_helpers),
        cmocka_unit_test(test_issue25_requests),  cmocka_unit_test(test_issue25_stream_start),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
