/*
 * test_server.c — keel serve over real HTTP on loopback ($KEEL_BIN serve as
 * a child process, a generated qwen2 model): /health while loading and
 * after, every endpoint streaming and not, SSE framing, both APIs' response
 * and error shapes, prompt reuse across turns (cached_tokens), auth with
 * --api-key (Bearer, x-api-key, public routes), the bad-request corpus of
 * issue 10 with the server alive after each, /metrics, slot actions'
 * filename validation, SIGTERM with a stream in flight (exit 0; under
 * ASan also no leak), and a prefill through both APIs (a trailing
 * assistant message continued: prompt tokens as the raw continuation's,
 * answers and streams without the prefill, Anthropic's trailing
 * whitespace 400).
 */
#include "testutil.h"
#include "server_util.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char g_model[64];
static char g_slot_dir[64];
static srvt_proc g_srv; /* -np 2 -c 4096 --metrics --slot-save-path */

static int setup(void **state)
{
    (void)state;
    if (!srvt_gen_model(g_model, sizeof g_model, "qwen2", 64, 2, 0, 7)) return -1;
    snprintf(g_slot_dir, sizeof g_slot_dir, "/tmp/keel_srvslots_XXXXXX");
    if (!mkdtemp(g_slot_dir)) return -1;
    const char *args[] = {"-np", "2", "-c", "4096", "-t", "1", "--metrics", "--slot-save-path", g_slot_dir,
                          "--log-disable", NULL};
    return srvt_start(&g_srv, g_model, args, true) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    if (g_srv.pid > 0) srvt_stop(&g_srv, 10 * srvt_slow());
    unlink(g_model);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_slot_dir);
    if (system(cmd) != 0) return -1;
    return 0;
}

static const char *CHAT1 = "{\"messages\":[{\"role\":\"system\",\"content\":\"You are a helpful assistant.\"},"
                           "{\"role\":\"user\",\"content\":\"The little dog ran to the park and\"}],"
                           "\"max_tokens\":6,\"temperature\":0";

/* ---- loading ---------------------------------------------------------------------- */

static void test_loading(void **state)
{
    (void)state;
    char fifo[64];
    snprintf(fifo, sizeof fifo, "/tmp/keel_srvfifo_%d", (int)getpid());
    unlink(fifo);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    srvt_proc p;
    const char *args[] = {"--log-disable", NULL};
    /* the model "file" blocks in open() until a writer comes: the server
     * listens meanwhile */
    assert_true(srvt_start(&p, fifo, args, false));
    int st = 0;
    json_t *h = srvt_get_json(&p, "/health", &st);
    assert_int_equal(st, 503);
    assert_string_equal(srvt_str(h, "status"), "loading");
    json_decref(h);
    json_t *m = srvt_post_json(&p, "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", &st);
    assert_int_equal(st, 503);
    assert_string_equal(srvt_str(m, "error.message"), "Loading model");
    assert_string_equal(srvt_str(m, "error.type"), "unavailable_error");
    json_decref(m);
    m = srvt_post_json(&p, "/v1/messages", "{}", &st);
    assert_int_equal(st, 503);
    assert_string_equal(srvt_str(m, "type"), "error");
    assert_string_equal(srvt_str(m, "error.type"), "overloaded_error");
    json_decref(m);
    /* not a model: the load fails, the server says so and exits 1 */
    int fd = open(fifo, O_WRONLY);
    assert_true(fd >= 0);
    /* the loader may refuse the FIFO (not a regular file) and close it before
     * the bytes arrive: EPIPE then, not a SIGPIPE that ends the test */
    void (*old_pipe)(int) = signal(SIGPIPE, SIG_IGN);
    ssize_t wn = write(fd, "not a model", 11);
    assert_true(wn == 11 || (wn < 0 && errno == EPIPE));
    signal(SIGPIPE, old_pipe);
    close(fd);
    int code = srvt_wait_exit(&p, 10 * srvt_slow());
    srvt_stop(&p, 5);
    unlink(fifo);
    assert_int_equal(code, 1);
}

/* ---- endpoints ----------------------------------------------------------------------- */

static void test_info_endpoints(void **state)
{
    (void)state;
    int st;
    json_t *j = srvt_get_json(&g_srv, "/health", &st);
    assert_int_equal(st, 200);
    assert_string_equal(srvt_str(j, "status"), "ok");
    json_decref(j);
    j = srvt_get_json(&g_srv, "/v1/models", &st);
    assert_int_equal(st, 200);
    assert_string_equal(srvt_str(j, "object"), "list");
    assert_string_equal(srvt_str(j, "data.0.id"), strrchr(g_model, '/') + 1);
    assert_string_equal(srvt_str(j, "data.0.object"), "model");
    /* one slot may fill the whole shared cache: that is its context */
    assert_int_equal(srvt_int(j, "data.0.meta.n_ctx"), 4096);
    json_decref(j);
    j = srvt_get_json(&g_srv, "/props", &st);
    assert_int_equal(st, 200);
    assert_int_equal(srvt_int(j, "total_slots"), 2);
    assert_int_equal(srvt_int(j, "default_generation_settings.n_ctx"), 4096);
    assert_string_equal(srvt_str(j, "chat_template"), "chatml"); /* a generated model carries none */
    assert_true(srvt_int(j, "plan.context_bytes") > 0);
    json_decref(j);
    j = srvt_get_json(&g_srv, "/slots", &st);
    assert_int_equal(st, 200);
    assert_int_equal(json_array_size(j), 2);
    assert_int_equal(srvt_int(j, "1.id"), 1);
    assert_int_equal(srvt_int(j, "0.n_ctx"), 4096);
    assert_true(json_is_false(json_object_get(json_array_get(j, 0), "is_processing")));
    json_decref(j);
    /* GET /v1/models/{id}: the model, or OpenAI's 404 */
    char path[128];
    snprintf(path, sizeof path, "/v1/models/%s", strrchr(g_model, '/') + 1);
    j = srvt_get_json(&g_srv, path, &st);
    assert_int_equal(st, 200);
    assert_string_equal(srvt_str(j, "id"), strrchr(g_model, '/') + 1);
    assert_string_equal(srvt_str(j, "object"), "model");
    assert_int_equal(srvt_int(j, "meta.n_ctx"), 4096);
    json_decref(j);
    j = srvt_get_json(&g_srv, "/v1/models/gpt-nothing", &st);
    assert_int_equal(st, 404);
    assert_string_equal(srvt_str(j, "error.type"), "not_found_error");
    assert_string_equal(srvt_str(j, "error.code"), "model_not_found");
    assert_non_null(strstr(srvt_str(j, "error.message"), "gpt-nothing"));
    json_decref(j);
    /* tokenize / detokenize round trip */
    j = srvt_post_json(&g_srv, "/tokenize", "{\"content\":\"Hello world, the dog ran.\"}", &st);
    assert_int_equal(st, 200);
    json_t *toks = json_object_get(j, "tokens");
    assert_true(json_array_size(toks) > 3);
    json_t *req = json_pack("{sO}", "tokens", toks);
    char *body = json_dumps(req, 0);
    json_t *d = srvt_post_json(&g_srv, "/detokenize", body, &st);
    assert_int_equal(st, 200);
    assert_string_equal(srvt_str(d, "content"), "Hello world, the dog ran.");
    free(body);
    json_decref(req);
    json_decref(d);
    json_decref(j);
    j = srvt_post_json(&g_srv, "/tokenize", "{\"content\":\"dog\",\"with_pieces\":true,\"add_special\":false}", &st);
    assert_int_equal(st, 200);
    assert_true(json_is_integer(json_object_get(json_array_get(json_object_get(j, "tokens"), 0), "id")));
    assert_non_null(srvt_str(j, "tokens.0.piece"));
    json_decref(j);
}

static void test_chat(void **state)
{
    (void)state;
    char body[1024];
    snprintf(body, sizeof body, "%s}", CHAT1);
    int st;
    json_t *r = srvt_post_json(&g_srv, "/v1/chat/completions", body, &st);
    assert_int_equal(st, 200);
    assert_string_equal(srvt_str(r, "object"), "chat.completion");
    assert_memory_equal(srvt_str(r, "id"), "chatcmpl-", 9);
    assert_string_equal(srvt_str(r, "choices.0.message.role"), "assistant");
    assert_non_null(srvt_str(r, "choices.0.message.content"));
    assert_string_equal(srvt_str(r, "choices.0.finish_reason"), "length");
    assert_int_equal(srvt_int(r, "usage.completion_tokens"), 6);
    int64_t p1 = srvt_int(r, "usage.prompt_tokens");
    assert_true(p1 > 10);
    assert_int_equal(srvt_int(r, "usage.total_tokens"), p1 + 6);
    /* the next turn extends the conversation: its prefix comes from the cache */
    json_t *turn = json_loads(body, 0, NULL);
    json_t *msgs = json_object_get(turn, "messages");
    json_array_append_new(msgs, json_pack("{ssss}", "role", "assistant", "content", srvt_str(r, "choices.0.message.content")));
    json_array_append_new(msgs, json_pack("{ssss}", "role", "user", "content", "And then what happened?"));
    char *b2 = json_dumps(turn, 0);
    json_t *r2 = srvt_post_json(&g_srv, "/v1/chat/completions", b2, &st);
    assert_int_equal(st, 200);
    int64_t cached = srvt_int(r2, "usage.prompt_tokens_details.cached_tokens");
    printf("turn 1: %lld prompt tokens; turn 2: %lld prompt, %lld cached\n", (long long)p1,
           (long long)srvt_int(r2, "usage.prompt_tokens"), (long long)cached);
    assert_true(cached >= p1 - 2);
    free(b2);
    json_decref(turn);
    json_decref(r2);
    json_decref(r);
    /* U+0000 (which a model can generate, sent as \u0000) is accepted back
     * on both APIs; the text after it reaches the prompt */
    int64_t n_prompt[2];
    for (int k = 0; k < 2; k++) {
        snprintf(body, sizeof body,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}],\"max_tokens\":1}",
                 k ? "a\\u0000b cd ef gh" : "a\\u0000");
        r = srvt_post_json(&g_srv, "/v1/chat/completions", body, &st);
        assert_int_equal(st, 200);
        n_prompt[k] = srvt_int(r, "usage.prompt_tokens");
        json_decref(r);
        snprintf(body, sizeof body,
                 "{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\\u0000y\"}]}");
        r = srvt_post_json(&g_srv, "/v1/messages", body, &st);
        assert_int_equal(st, 200);
        json_decref(r);
    }
    assert_true(n_prompt[1] > n_prompt[0]);
}

/* Concatenated deltas of an OpenAI chat stream. */
static void chat_stream_text(json_t *data, char *out, size_t cap, const char *field)
{
    size_t n = 0;
    out[0] = 0;
    for (size_t i = 0; i < json_array_size(data); i++) {
        const char *t = srvt_str(json_array_get(data, i), field);
        if (t && n + strlen(t) < cap) {
            memcpy(out + n, t, strlen(t) + 1);
            n += strlen(t);
        }
    }
}

static void test_chat_stream(void **state)
{
    (void)state;
    char body[1024];
    snprintf(body, sizeof body, "%s}", CHAT1);
    int st;
    json_t *plain = srvt_post_json(&g_srv, "/v1/chat/completions", body, &st);
    assert_int_equal(st, 200);
    snprintf(body, sizeof body, "%s,\"stream\":true,\"stream_options\":{\"include_usage\":true}}", CHAT1);
    srv_http_resp r;
    assert_int_equal(srvt_req(&g_srv, "POST", "/v1/chat/completions", NULL, body, &r), 200);
    char ct[128];
    assert_true(srv_http_header(&r, "Content-Type", ct, sizeof ct));
    assert_non_null(strstr(ct, "text/event-stream"));
    srvt_events ev;
    if (!srvt_parse_sse(r.body.p, r.body.len, &ev)) fail_msg("framing:\n%s", r.body.p);
    size_t n = json_array_size(ev.data);
    assert_true(n >= 4);
    assert_string_equal(json_string_value(json_array_get(ev.data, n - 1)), "[DONE]");
    json_t *usage = json_array_get(ev.data, n - 2);
    assert_int_equal(json_array_size(json_object_get(usage, "choices")), 0);
    assert_int_equal(srvt_int(usage, "usage.completion_tokens"), 6);
    assert_true(srvt_int(usage, "usage.prompt_tokens_details.cached_tokens") > 0);
    assert_string_equal(srvt_str(ev.data, "0.choices.0.delta.role"), "assistant");
    assert_string_equal(srvt_str(json_array_get(ev.data, n - 3), "choices.0.finish_reason"), "length");
    const char *id = srvt_str(ev.data, "0.id");
    for (size_t i = 0; i + 1 < n; i++) {
        assert_string_equal(srvt_str(json_array_get(ev.data, i), "id"), id);
        assert_string_equal(srvt_str(json_array_get(ev.data, i), "object"), "chat.completion.chunk");
    }
    char text[4096];
    chat_stream_text(ev.data, text, sizeof text, "choices.0.delta.content");
    assert_string_equal(text, srvt_str(plain, "choices.0.message.content"));
    srvt_events_free(&ev);
    srv_http_resp_free(&r);
    json_decref(plain);
}

static void test_completions(void **state)
{
    (void)state;
    int st;
    json_t *r = srvt_post_json(&g_srv, "/v1/completions", "{\"prompt\":\"Once upon a time\",\"max_tokens\":5,\"temperature\":0}", &st);
    assert_int_equal(st, 200);
    assert_string_equal(srvt_str(r, "object"), "text_completion");
    assert_memory_equal(srvt_str(r, "id"), "cmpl-", 5);
    assert_non_null(srvt_str(r, "choices.0.text"));
    assert_int_equal(srvt_int(r, "usage.completion_tokens"), 5);
    json_decref(r);
    /* a token array prompt, streamed */
    srv_http_resp h;
    assert_int_equal(srvt_req(&g_srv, "POST", "/v1/completions", NULL,
                              "{\"prompt\":[300,301,302,303],\"max_tokens\":4,\"temperature\":0,\"stream\":true}", &h),
                     200);
    srvt_events ev;
    assert_true(srvt_parse_sse(h.body.p, h.body.len, &ev));
    size_t n = json_array_size(ev.data);
    assert_string_equal(json_string_value(json_array_get(ev.data, n - 1)), "[DONE]");
    assert_string_equal(srvt_str(json_array_get(ev.data, n - 2), "object"), "text_completion");
    assert_non_null(srvt_str(json_array_get(ev.data, n - 2), "choices.0.finish_reason"));
    srvt_events_free(&ev);
    srv_http_resp_free(&h);
}

static const char *MSG = "{\"model\":\"claude-test\",\"max_tokens\":6,\"temperature\":0,"
                         "\"system\":[{\"type\":\"text\",\"text\":\"You are terse.\",\"cache_control\":{\"type\":\"ephemeral\"}}],"
                         "\"tools\":[{\"name\":\"get_weather\",\"description\":\"Weather of a city\","
                         "\"input_schema\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}],"
                         "\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"},"
                         "{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"get_weather\","
                         "\"input\":{\"city\":\"Paris\"}}]},"
                         "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_1\",\"content\":\"sunny\"}]}]";

static void test_messages(void **state)
{
    (void)state;
    char body[2048];
    snprintf(body, sizeof body, "%s}", MSG);
    int st;
    json_t *r = srvt_post_json(&g_srv, "/v1/messages", body, &st);
    assert_int_equal(st, 200);
    assert_string_equal(srvt_str(r, "type"), "message");
    assert_string_equal(srvt_str(r, "role"), "assistant");
    assert_memory_equal(srvt_str(r, "id"), "msg_", 4);
    assert_string_equal(srvt_str(r, "stop_reason"), "max_tokens");
    assert_int_equal(srvt_int(r, "usage.output_tokens"), 6);
    int64_t total = srvt_int(r, "usage.input_tokens") + srvt_int(r, "usage.cache_read_input_tokens");
    assert_true(total > 20);
    json_decref(r);
    /* count_tokens renders the same prompt */
    json_t *c = srvt_post_json(&g_srv, "/v1/messages/count_tokens", body, &st);
    assert_int_equal(st, 200);
    assert_int_equal(srvt_int(c, "input_tokens"), total);
    json_decref(c);
    /* count_tokens takes no slot: the slots' caches are as they were, and a
     * prompt far longer than a slot's context (2048 cells) is counted */
    /* the slots' snapshot may lag the answer just received by a step: wait
     * until every slot is idle */
    json_t *before = NULL;
    for (int tries = 0; tries < 500; tries++) {
        before = srvt_get_json(&g_srv, "/slots", &st);
        assert_int_equal(st, 200);
        bool busy = false;
        for (size_t i = 0; i < json_array_size(before); i++)
            busy |= json_is_true(json_object_get(json_array_get(before, i), "is_processing"));
        if (!busy) break;
        json_decref(before);
        before = NULL;
        usleep(10000);
    }
    assert_non_null(before);
    size_t big_cap = 200000;
    char *big = malloc(big_cap);
    assert_non_null(big);
    size_t bn = (size_t)snprintf(big, big_cap, "{\"model\":\"m\",\"max_tokens\":8,\"messages\":[{\"role\":\"user\",\"content\":\"");
    while (bn + 64 < big_cap - 64) bn += (size_t)snprintf(big + bn, big_cap - bn, "the little dog ran to the park again. ");
    snprintf(big + bn, big_cap - bn, "\"}]}");
    c = srvt_post_json(&g_srv, "/v1/messages/count_tokens", big, &st);
    free(big);
    assert_int_equal(st, 200);
    printf("count_tokens: %lld tokens for a 200 KB message\n", (long long)srvt_int(c, "input_tokens"));
    assert_true(srvt_int(c, "input_tokens") > 8192);
    json_decref(c);
    json_t *after = srvt_get_json(&g_srv, "/slots", &st);
    char *b1 = json_dumps(before, JSON_COMPACT | JSON_SORT_KEYS), *b2 = json_dumps(after, JSON_COMPACT | JSON_SORT_KEYS);
    assert_string_equal(b1, b2);
    free(b1);
    free(b2);
    json_decref(before);
    json_decref(after);
    /* the stream: message_start, ping, blocks, message_delta, message_stop */
    snprintf(body, sizeof body, "%s,\"stream\":true}", MSG);
    srv_http_resp h;
    assert_int_equal(srvt_req(&g_srv, "POST", "/v1/messages", NULL, body, &h), 200);
    srvt_events ev;
    if (!srvt_parse_sse(h.body.p, h.body.len, &ev)) fail_msg("framing:\n%s", h.body.p);
    size_t n = json_array_size(ev.names);
    assert_true(n >= 5);
    assert_string_equal(json_string_value(json_array_get(ev.names, 0)), "message_start");
    assert_string_equal(json_string_value(json_array_get(ev.names, 1)), "ping");
    assert_string_equal(json_string_value(json_array_get(ev.names, n - 2)), "message_delta");
    assert_string_equal(json_string_value(json_array_get(ev.names, n - 1)), "message_stop");
    assert_int_equal(srvt_int(json_array_get(ev.data, n - 2), "usage.output_tokens"), 6);
    assert_string_equal(srvt_str(json_array_get(ev.data, n - 2), "delta.stop_reason"), "max_tokens");
    /* blocks open and close in order, deltas go to the open block */
    int64_t open = -1, next = 0;
    for (size_t i = 0; i < n; i++) {
        const char *name = json_string_value(json_array_get(ev.names, i));
        json_t *d = json_array_get(ev.data, i);
        assert_string_equal(srvt_str(d, "type"), name);
        if (strcmp(name, "content_block_start") == 0) {
            assert_int_equal(open, -1);
            assert_int_equal(srvt_int(d, "index"), next);
            open = next++;
        } else if (strcmp(name, "content_block_delta") == 0) {
            assert_int_equal(srvt_int(d, "index"), open);
        } else if (strcmp(name, "content_block_stop") == 0) {
            assert_int_equal(srvt_int(d, "index"), open);
            open = -1;
        }
    }
    assert_int_equal(open, -1);
    srvt_events_free(&ev);
    srv_http_resp_free(&h);
}

/* ---- prefill (a trailing assistant message continued) ------------------------------------ */

/* The prompt tokens of a raw text on /v1/completions: the same engine
 * tokenization a chat's rendering goes through. */
static int64_t raw_prompt_tokens(const char *text)
{
    json_t *b = json_pack("{sssisf}", "prompt", text, "max_tokens", 1, "temperature", 0.0);
    char *body = json_dumps(b, 0);
    int st;
    json_t *r = srvt_post_json(&g_srv, "/v1/completions", body, &st);
    assert_int_equal(st, 200);
    int64_t n = srvt_int(r, "usage.prompt_tokens");
    json_decref(r);
    free(body);
    json_decref(b);
    return n;
}

#define PF_USER "The little dog ran to the park and"
#define PF_TEXT "Once upon a time"
/* ChatML (the generated model carries no template) */
#define PF_OPEN "<|im_start|>user\n" PF_USER "<|im_end|>\n<|im_start|>assistant\n"

static void test_prefill(void **state)
{
    (void)state;
    const char *msgs = "[{\"role\":\"user\",\"content\":\"" PF_USER "\"},{\"role\":\"assistant\",\"content\":\"" PF_TEXT "\"}]";
    int64_t n_cont = raw_prompt_tokens(PF_OPEN PF_TEXT);
    int64_t n_closed = raw_prompt_tokens(PF_OPEN PF_TEXT "<|im_end|>\n<|im_start|>assistant\n");
    char body[1024];
    int st;
    /* OpenAI: continued by default; the answer is the new text */
    snprintf(body, sizeof body, "{\"messages\":%s,\"max_tokens\":6,\"temperature\":0}", msgs);
    json_t *r = srvt_post_json(&g_srv, "/v1/chat/completions", body, &st);
    assert_int_equal(st, 200);
    assert_int_equal(srvt_int(r, "usage.prompt_tokens"), n_cont);
    const char *c = srvt_str(r, "choices.0.message.content");
    assert_non_null(c);
    assert_true(strncmp(c, PF_TEXT, strlen(PF_TEXT)) != 0);
    printf("prefill \"%s\": %lld prompt tokens (closed: %lld), the answer \"%s\"\n", PF_TEXT, (long long)n_cont,
           (long long)n_closed, c);
    snprintf(body, sizeof body, "{\"messages\":%s,\"max_tokens\":6,\"temperature\":0,\"stream\":true}", msgs);
    srv_http_resp h;
    assert_int_equal(srvt_req(&g_srv, "POST", "/v1/chat/completions", NULL, body, &h), 200);
    srvt_events ev;
    if (!srvt_parse_sse(h.body.p, h.body.len, &ev)) fail_msg("framing:\n%s", h.body.p);
    char text[4096];
    chat_stream_text(ev.data, text, sizeof text, "choices.0.delta.content");
    assert_string_equal(text, c);
    srvt_events_free(&ev);
    srv_http_resp_free(&h);
    json_decref(r);
    /* continue_final_message false: the message closed, a new turn opened */
    snprintf(body, sizeof body, "{\"messages\":%s,\"max_tokens\":2,\"continue_final_message\":false}", msgs);
    r = srvt_post_json(&g_srv, "/v1/chat/completions", body, &st);
    assert_int_equal(st, 200);
    assert_int_equal(srvt_int(r, "usage.prompt_tokens"), n_closed);
    json_decref(r);
    /* asked to continue a message that is not the assistant's: the engine's 400 */
    r = srvt_post_json(&g_srv, "/v1/chat/completions",
                       "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"continue_final_message\":\"content\"}", &st);
    assert_int_equal(st, 400);
    assert_non_null(strstr(srvt_str(r, "error.message"), "continue_final_message"));
    json_decref(r);

    /* Anthropic: the same prefill, answered and streamed without it */
    snprintf(body, sizeof body, "{\"model\":\"m\",\"max_tokens\":6,\"temperature\":0,\"messages\":%s}", msgs);
    r = srvt_post_json(&g_srv, "/v1/messages", body, &st);
    assert_int_equal(st, 200);
    assert_int_equal(srvt_int(r, "usage.input_tokens") + srvt_int(r, "usage.cache_read_input_tokens"), n_cont);
    assert_string_equal(srvt_str(r, "content.0.type"), "text");
    const char *a = srvt_str(r, "content.0.text");
    assert_true(strncmp(a, PF_TEXT, strlen(PF_TEXT)) != 0);
    json_t *ct = srvt_post_json(&g_srv, "/v1/messages/count_tokens", body, &st);
    assert_int_equal(st, 200);
    assert_int_equal(srvt_int(ct, "input_tokens"), n_cont);
    json_decref(ct);
    snprintf(body, sizeof body, "{\"model\":\"m\",\"max_tokens\":6,\"temperature\":0,\"stream\":true,\"messages\":%s}", msgs);
    assert_int_equal(srvt_req(&g_srv, "POST", "/v1/messages", NULL, body, &h), 200);
    if (!srvt_parse_sse(h.body.p, h.body.len, &ev)) fail_msg("framing:\n%s", h.body.p);
    text[0] = '\0';
    for (size_t i = 0; i < json_array_size(ev.data); i++) {
        const char *t = srvt_str(json_array_get(ev.data, i), "delta.text");
        if (t && strlen(text) + strlen(t) < sizeof text) strcat(text, t);
    }
    assert_string_equal(text, a);
    srvt_events_free(&ev);
    srv_http_resp_free(&h);
    json_decref(r);
    /* a thinking prefill: the prompt opens the reasoning with it, the
     * answer's thinking block is the rest */
    snprintf(body, sizeof body,
             "{\"model\":\"m\",\"max_tokens\":6,\"temperature\":0,\"messages\":[{\"role\":\"user\",\"content\":\"" PF_USER
             "\"},{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"I'm\",\"signature\":\"\"}]}]}");
    r = srvt_post_json(&g_srv, "/v1/messages", body, &st);
    assert_int_equal(st, 200);
    assert_int_equal(srvt_int(r, "usage.input_tokens") + srvt_int(r, "usage.cache_read_input_tokens"),
                     raw_prompt_tokens(PF_OPEN "<think>I'm"));
    assert_string_equal(srvt_str(r, "content.0.type"), "thinking");
    assert_true(strncmp(srvt_str(r, "content.0.thinking"), "I'm", 3) != 0);
    json_decref(r);
    /* Anthropic refuses a prefill ending in whitespace */
    r = srvt_post_json(&g_srv, "/v1/messages",
                       "{\"model\":\"m\",\"max_tokens\":6,\"messages\":[{\"role\":\"user\",\"content\":\"x\"},"
                       "{\"role\":\"assistant\",\"content\":\"Once upon \"}]}",
                       &st);
    assert_int_equal(st, 400);
    assert_string_equal(srvt_str(r, "error.type"), "invalid_request_error");
    assert_string_equal(srvt_str(r, "error.message"), "messages: final assistant content cannot end with trailing whitespace");
    json_decref(r);
}

/* ---- errors --------------------------------------------------------------------------- */

typedef struct bad_case {
    const char *method, *path, *body, *headers;
    int status;
    const char *want; /* substring of the error message */
} bad_case;

static void check_error(const char *path, int want_status, const char *want, srv_http_resp *r)
{
    json_t *j = r->body.p ? json_loadb(r->body.p, r->body.len, 0, NULL) : NULL;
    if (r->status != want_status || !j)
        fail_msg("%s: status %d (want %d), body %s", path, r->status, want_status, r->body.p ? r->body.p : "");
    bool anth = strncmp(path, "/v1/messages", 12) == 0;
    const char *msg = srvt_str(j, "error.message");
    if (anth) {
        assert_string_equal(srvt_str(j, "type"), "error");
        assert_non_null(srvt_str(j, "error.type"));
    } else {
        assert_int_equal(srvt_int(j, "error.code") || srvt_str(j, "error.code"), 1);
        assert_non_null(srvt_str(j, "error.type"));
    }
    if (!msg || !strstr(msg, want)) fail_msg("%s: message '%s', want '%s'", path, msg ? msg : "(none)", want);
    json_decref(j);
}

static void test_bad_requests(void **state)
{
    (void)state;
    const char *C = "/v1/chat/completions", *M = "/v1/messages";
    char *deep = malloc(200100);
    strcpy(deep, "{\"messages\":");
    size_t n = strlen(deep);
    for (int i = 0; i < 100000; i++) deep[n++] = '[';
    for (int i = 0; i < 100000; i++) deep[n++] = ']';
    strcpy(deep + n, "}");
    char *longp = malloc(40000);
    strcpy(longp, "{\"messages\":[{\"role\":\"user\",\"content\":\"");
    for (int i = 0; i < 1200; i++) strcat(longp, "dog cat bird tree ");
    strcat(longp, "\"}]}");
    char *longs = malloc(40100);
    snprintf(longs, 40100, "%.*s,\"stream\":true}", (int)strlen(longp) - 1, longp);
    bad_case cases[] = {
        {"POST", C, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}", NULL, 400, "invalid JSON"},
        {"POST", M, "{\"messages\": nope}", NULL, 400, "invalid JSON"},
        {"POST", C, "", NULL, 400, "empty"},
        {"POST", C, "[]", NULL, 400, "must be a JSON object"},
        {"POST", C, "{\"messages\":{\"role\":\"user\"}}", NULL, 400, "messages must be an array"},
        {"POST", C, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":\"ten\"}", NULL, 400, "max_tokens"},
        {"POST", C, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":123456789012345678901234567890}", NULL, 400, "invalid JSON"},
        {"POST", C, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":1e999}", NULL, 400, "invalid JSON"},
        {"POST", C, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"seed\":1e300}", NULL, 400, "seed must be an integer"},
        {"POST", C, deep, NULL, 400, "nested deeper"},
        {"POST", M, deep, NULL, 400, "nested deeper"},
        {"POST", C, "{\"messages\":[]}", NULL, 400, "must not be empty"},
        {"POST", M, "{\"messages\":[],\"max_tokens\":3}", NULL, 400, "at least one message"},
        {"POST", C, "{\"messages\":[{\"role\":\"pirate\",\"content\":\"arr\"}]}", NULL, 400, "unknown role 'pirate'"},
        {"POST", M, "{\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}", NULL, 400, "unknown role 'tool'"},
        {"POST", C, "{\"messages\":[{\"role\":\"user\",\"content\":\"\xc3\x28\"}]}", NULL, 400, "invalid JSON"},
        {"POST", M, "{\"messages\":[{\"role\":\"user\",\"content\":\"\xed\xa0\x80\"}]}", NULL, 400, "invalid JSON"},
        {"POST", C, longp, NULL, 400, "tokens"},
        {"POST", C, longs, NULL, 400, "tokens"},
        {"POST", "/v1/completions", "{\"prompt\":[1,99999]}", NULL, 400, "token id"},
        {"POST", "/detokenize", "{\"tokens\":[-1]}", NULL, 400, "token id"},
        {"POST", "/tokenize", "{\"content\":5}", NULL, 400, "content must be a string"},
        {"POST", "/slots/0?action=save", "{\"filename\":\"../escape.bin\"}", NULL, 400, "path separator"},
        {"POST", "/slots/0?action=restore", "{\"filename\":\"..\"}", NULL, 400, "\"..\""},
        {"POST", "/slots/0?action=save", "{\"filename\":\"a\\\\b\"}", NULL, 400, "path separator"},
        {"POST", "/slots/0?action=save", "{\"filename\":\"x..y\"}", NULL, 400, "\"..\""},
        {"POST", "/slots/0?action=save", "{\"filename\":\"\"}", NULL, 400, "non-empty"},
        {"POST", "/slots/0?action=save", "{\"filename\":\"a\\u0000b\"}", NULL, 400, "NUL byte"},
        {"POST", "/slots/0?action=save", "{}", NULL, 400, "filename must be"},
        {"POST", "/slots/9?action=erase", NULL, NULL, 400, "slot 9 does not exist"},
        {"POST", "/slots/0?action=fly", NULL, NULL, 400, "action must be"},
        {"GET", "/nowhere", NULL, NULL, 404, "Not Found"},
        {"GET", C, NULL, NULL, 405, "method not allowed"},
        {"DELETE", "/health", NULL, NULL, 405, "method not allowed"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        srv_http_resp r;
        int st = srvt_req(&g_srv, cases[i].method, cases[i].path, cases[i].headers, cases[i].body, &r);
        if (st < 0) fail_msg("case %zu (%s): no response", i, cases[i].path);
        char what[128];
        snprintf(what, sizeof what, "%s (case %zu)", cases[i].path, i);
        check_error(cases[i].path, cases[i].status, cases[i].want, &r);
        srv_http_resp_free(&r);
        if (!srvt_alive(&g_srv)) fail_msg("the server died after %s", what);
    }
    /* 10 MB bodies: refused by Content-Length (413) in both shapes */
    size_t big = 10u << 20;
    char *huge = malloc(big + 1);
    memset(huge, ' ', big);
    memcpy(huge, "{\"messages\":\"", 13);
    huge[big - 2] = '"';
    huge[big - 1] = '}';
    huge[big] = 0;
    const char *paths[] = {C, M, "/tokenize"};
    for (int i = 0; i < 3; i++) {
        srv_http_resp r;
        int st = srvt_req(&g_srv, "POST", paths[i], NULL, huge, &r);
        if (st != 413) fail_msg("%s: 10 MB body: status %d", paths[i], st);
        check_error(paths[i], 413, "larger than the limit", &r);
        srv_http_resp_free(&r);
        assert_true(srvt_alive(&g_srv));
    }
    /* a chunked upload without Content-Length is cut off at the limit too */
    int fd = srv_http_connect("127.0.0.1", g_srv.port);
    assert_true(fd >= 0);
    const char *hdr = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
    assert_true(send(fd, hdr, strlen(hdr), MSG_NOSIGNAL) > 0);
    char chunk[64];
    size_t sent = 0;
    bool refused = false;
    while (sent < big && !refused) {
        int k = snprintf(chunk, sizeof chunk, "%x\r\n", 1 << 16);
        if (send(fd, chunk, (size_t)k, MSG_NOSIGNAL) <= 0 || send(fd, huge, 1 << 16, MSG_NOSIGNAL) <= 0 ||
            send(fd, "\r\n", 2, MSG_NOSIGNAL) <= 0)
            refused = true; /* the server answered and closed */
        sent += 1 << 16;
    }
    if (!refused && send(fd, "0\r\n\r\n", 5, MSG_NOSIGNAL) != 5) refused = true;
    srv_http_resp r;
    if (srv_http_read(fd, &r, 10000 * srvt_slow(), NULL, NULL) || r.status > 0) assert_int_equal(r.status, 413);
    srv_http_resp_free(&r);
    close(fd);
    assert_true(srvt_alive(&g_srv));
    free(huge);
    free(deep);
    free(longp);
    free(longs);
}

static void test_slot_actions(void **state)
{
    (void)state;
    int st;
    json_t *j = srvt_post_json(&g_srv, "/slots/0?action=save", "{\"filename\":\"slot0.bin\"}", &st);
#if SRV_SLOT_ACTIONS
    assert_int_equal(st, 200);
    assert_int_equal(srvt_int(j, "id_slot"), 0);
    assert_string_equal(srvt_str(j, "filename"), "slot0.bin");
    char path[128];
    snprintf(path, sizeof path, "%s/slot0.bin", g_slot_dir);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    json_decref(j);
    j = srvt_post_json(&g_srv, "/slots/1?action=restore", "{\"filename\":\"slot0.bin\"}", &st);
    assert_int_equal(st, 200);
    json_decref(j);
    j = srvt_post_json(&g_srv, "/slots/1?action=restore", "{\"filename\":\"missing.bin\"}", &st);
    assert_true(st == 404 || st == 400);
    json_decref(j);
    j = srvt_post_json(&g_srv, "/slots/1?action=erase", NULL, &st);
    assert_int_equal(st, 200);
#else
    assert_int_equal(st, 501);
    assert_non_null(strstr(srvt_str(j, "error.message"), "not available in this build"));
#endif
    json_decref(j);
}

/* --spec ngram: a repetitive answer is drafted; the OpenAI usage and
 * /metrics count the drafts (docs/speculative.md). */
static void test_speculative(void **state)
{
    (void)state;
    srvt_proc p;
    const char *args[] = {"-c", "2048", "-t", "1", "--metrics", "--spec", "ngram", "--spec-fixed", "--log-disable", NULL};
    assert_true(srvt_start(&p, g_model, args, true));
    int status = 0;
    json_t *j = srvt_post_json(&p, "/v1/chat/completions",
                               "{\"messages\":[{\"role\":\"user\",\"content\":\"abc abc abc abc abc abc abc\"}],"
                               "\"max_tokens\":64,\"temperature\":0}",
                               &status);
    assert_int_equal(status, 200);
    assert_non_null(j);
    int64_t acc = srvt_int(j, "usage.completion_tokens_details.accepted_prediction_tokens");
    int64_t rej = srvt_int(j, "usage.completion_tokens_details.rejected_prediction_tokens");
    assert_non_null(srvt_get(j, "usage.completion_tokens_details.accepted_prediction_tokens"));
    assert_true(acc >= 0 && rej >= 0 && acc + rej > 0);
    assert_true(acc <= srvt_int(j, "usage.completion_tokens"));
    json_decref(j);
    assert_true(srvt_wait_metric(&p, "keel_spec_drafted_tokens_total", (double)(acc + rej), 10 * srvt_slow()) ==
                (double)(acc + rej));
    assert_true(srvt_metric(&p, "keel_spec_accepted_tokens_total") == (double)acc);
    assert_int_equal(srvt_stop(&p, 10 * srvt_slow()), 0);
}

static void test_metrics(void **state)
{
    (void)state;
    srv_http_resp r;
    assert_int_equal(srvt_req(&g_srv, "GET", "/metrics", NULL, NULL, &r), 200);
    char ct[128];
    assert_true(srv_http_header(&r, "Content-Type", ct, sizeof ct));
    assert_non_null(strstr(ct, "text/plain"));
    const char *t = r.body.p;
    const char *q = strstr(t, "\nkeel_requests_total ");
    assert_non_null(q);
    assert_true(atof(q + 21) >= 5); /* the requests of the tests before */
    assert_non_null(strstr(t, "# TYPE keel_time_to_first_token_seconds histogram"));
    assert_non_null(strstr(t, "keel_time_to_first_token_seconds_bucket{le=\"+Inf\"}"));
    assert_non_null(strstr(t, "keel_kv_cells_used{group=\"0\"}"));
    assert_non_null(strstr(t, "keel_kv_cells_capacity{group=\"0\"}"));
    assert_non_null(strstr(t, "\nkeel_prompt_tokens_total "));
    assert_non_null(strstr(t, "\nkeel_tokens_predicted_total "));
    assert_non_null(strstr(t, "\nkeel_prompt_tokens_cached_total "));
    const char *rss = strstr(t, "\nkeel_rss_bytes ");
    assert_non_null(rss);
    assert_true(atof(rss + 16) > 1e6);
    /* every sample line is "name{labels} value" with a value that parses */
    int samples = 0;
    for (const char *l = t; *l;) {
        const char *nl = strchr(l, '\n');
        assert_non_null(nl);
        if (*l != '#') {
            const char *sp = NULL;
            for (const char *q2 = l; q2 < nl; q2++)
                if (*q2 == ' ') sp = q2;
            assert_non_null(sp);
            char *end;
            strtod(sp + 1, &end);
            if (end != nl) fail_msg("sample line: %.*s", (int)(nl - l), l);
            samples++;
        }
        l = nl + 1;
    }
    assert_true(samples > 20);
    srv_http_resp_free(&r);
}

static void test_auth(void **state)
{
    (void)state;
    char keyfile[64];
    snprintf(keyfile, sizeof keyfile, "/tmp/keel_srvkeys_%d", (int)getpid());
    FILE *f = fopen(keyfile, "w");
    assert_non_null(f);
    fputs("\nfile-key-1\n  file-key-2  \n", f);
    fclose(f);
    srvt_proc p;
    const char *args[] = {"--api-key", "sk-one,sk-two", "--api-key-file", keyfile, "--log-disable", NULL};
    assert_true(srvt_start(&p, g_model, args, true));
    const char *body = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":2}";
    const char *mbody = "{\"max_tokens\":2,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";
    struct {
        const char *method, *path, *headers, *body;
        int status;
    } cases[] = {
        {"POST", "/v1/chat/completions", NULL, body, 401},
        {"POST", "/v1/chat/completions", "Authorization: Bearer sk-wrong\r\n", body, 401},
        {"POST", "/v1/chat/completions", "Authorization: Bearer sk-on\r\n", body, 401},
        {"POST", "/v1/chat/completions", "Authorization: Bearer sk-one1\r\n", body, 401},
        {"POST", "/v1/chat/completions", "Authorization: Basic sk-one\r\n", body, 401},
        {"POST", "/v1/chat/completions", "Authorization: Bearer sk-one\r\n", body, 200},
        {"POST", "/v1/chat/completions", "authorization: bearer sk-two\r\n", body, 200},
        {"POST", "/v1/chat/completions", "x-api-key: file-key-2\r\n", body, 200},
        {"POST", "/v1/messages", NULL, mbody, 401},
        {"POST", "/v1/messages", "x-api-key: nope\r\n", mbody, 401},
        {"POST", "/v1/messages", "x-api-key: file-key-1\r\n", mbody, 200},
        {"POST", "/v1/messages/count_tokens", NULL, mbody, 401},
        {"POST", "/tokenize", NULL, "{\"content\":\"a\"}", 401},
        {"GET", "/props", NULL, NULL, 401},
        {"GET", "/slots", NULL, NULL, 401},
        {"GET", "/metrics", NULL, NULL, 401},
        {"GET", "/health", NULL, NULL, 200},
        {"GET", "/v1/health", NULL, NULL, 200},
        {"GET", "/v1/models", NULL, NULL, 200},
        {"GET", "/models", NULL, NULL, 200},
        {"GET", "/props", "Authorization: Bearer sk-two\r\n", NULL, 200},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        srv_http_resp r;
        int st = srvt_req(&p, cases[i].method, cases[i].path, cases[i].headers, cases[i].body, &r);
        if (st != cases[i].status)
            fail_msg("case %zu %s %s: %d, want %d: %s", i, cases[i].method, cases[i].path, st, cases[i].status,
                     r.body.p ? r.body.p : "");
        if (st == 401) check_error(cases[i].path, 401, "Invalid API Key", &r);
        srv_http_resp_free(&r);
    }
    assert_int_equal(srvt_stop(&p, 10 * srvt_slow()), 0);
    unlink(keyfile);
    /* flags are parsed strictly */
    const char *bin = getenv("KEEL_BIN");
    char cmd[512];
    const char *bad[] = {"--port 70000", "--port x", "-np 0", "--timeout 0", "--api-key-file /nonexistent/keys",
                         "--bogus", "--kv-trigger 10", "--max-body 0", "--cache-ram -5"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(cmd, sizeof cmd, "%s serve -m %s %s >/dev/null 2>&1", bin, g_model, bad[i]);
        int rc = system(cmd);
        if (!WIFEXITED(rc) || WEXITSTATUS(rc) == 0) fail_msg("keel serve %s was accepted", bad[i]);
    }
}

/* SIGTERM with a stream in flight: the client sees the stream end, the
 * server exits 0 promptly. */
typedef struct bg_stream {
    int port;
    srv_http_resp r;
    bool ok;
} bg_stream;

static void *stream_forever(void *p)
{
    bg_stream *b = p;
    b->ok = srv_http_request("127.0.0.1", b->port, "POST", "/v1/chat/completions", NULL,
                             "{\"messages\":[{\"role\":\"user\",\"content\":\"go\"}],\"max_tokens\":-1,\"ignore_eos\":true,"
                             "\"stream\":true}",
                             &b->r, 60000 * srvt_slow());
    return NULL;
}

static void test_shutdown(void **state)
{
    (void)state;
    srvt_proc p;
    const char *args[] = {"-c", "65536", "--kv-compact", "window", "--log-disable", "-t", "1", NULL};
    assert_true(srvt_start(&p, g_model, args, true));
    bg_stream b;
    memset(&b, 0, sizeof b);
    b.port = p.port;
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, stream_forever, &b), 0);
    /* wait until it generates */
    for (int i = 0; i < 500 * srvt_slow(); i++) {
        int st;
        json_t *s = srvt_get_json(&p, "/slots", &st);
        bool busy = json_is_true(json_object_get(json_array_get(s, 0), "is_processing"));
        if (s) json_decref(s);
        if (busy) break;
        usleep(10000);
    }
    uint64_t t0 = keel_time_ns();
    int code = srvt_stop(&p, 10 * srvt_slow());
    double secs = (double)(keel_time_ns() - t0) * 1e-9;
    pthread_join(th, NULL);
    printf("SIGTERM with a stream in flight: exit %d after %.2f s; the client got %zu bytes\n", code, secs, b.r.body.len);
    assert_int_equal(code, 0);
    assert_true(secs < 5.0 * srvt_slow());
    assert_int_equal(b.r.status, 200);
    /* the stream ended with an error event: cancelled by the shutdown */
    assert_non_null(b.r.body.p);
    assert_non_null(strstr(b.r.body.p, "\"error\""));
    srv_http_resp_free(&b.r);
}


/* ---- issue 25: connections, first bytes, 413, overflow ---------------------------------- */

/* Waits up to ms for the server to close fd (end of stream or reset);
 * *got receives the bytes read meanwhile. */
static bool closed_within(int fd, int ms, size_t *got)
{
    uint64_t t0 = keel_time_ns();
    *got = 0;
    while ((keel_time_ns() - t0) / 1000000u < (uint64_t)ms) {
        struct pollfd pf = {fd, POLLIN, 0};
        if (poll(&pf, 1, 50) <= 0) continue;
        char buf[4096];
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n <= 0) return true;
        *got += (size_t)n;
    }
    return false;
}

/* Idle and slow connections do not lock new clients out: past the cap a
 * new client gets 503 at once, idle connections close after
 * --keep-alive-timeout, a client trickling its headers is cut after
 * --read-timeout (before: all of them held until the 600 s timeout). */
static void test_connections(void **state)
{
    (void)state;
    srvt_proc p;
    const char *args[] = {"-t", "1", "--threads-http", "4", "--keep-alive-timeout", "1", "--read-timeout", "2",
                          "--log-disable", NULL};
    assert_true(srvt_start(&p, g_model, args, true));
    int idle[8];
    for (int i = 0; i < 8; i++) assert_true((idle[i] = srv_http_connect("127.0.0.1", p.port)) >= 0);
    usleep(100000);
    /* a new client is answered within a second: 503 past the cap */
    srv_http_resp r;
    uint64_t t0 = keel_time_ns();
    bool ok = srv_http_request("127.0.0.1", p.port, "GET", "/health", NULL, NULL, &r, 1000 * srvt_slow());
    double ms = (double)(keel_time_ns() - t0) * 1e-6;
    printf("9th connection with 8 idle (--threads-http 4): status %d after %.0f ms\n", ok ? r.status : -1, ms);
    assert_true(ok);
    assert_true(r.status == 503 || r.status == 200);
    if (r.status == 503) {
        char ra[16];
        assert_true(srv_http_header(&r, "Retry-After", ra, sizeof ra));
        json_t *j = json_loadb(r.body.p, r.body.len, 0, NULL);
        const char *type = srvt_str(j, "error.type");
        assert_true(type && strcmp(type, "unavailable_error") == 0);
        json_decref(j);
    }
    srv_http_resp_free(&r);
    /* the idle ones close after the keep-alive timeout */
    for (int i = 0; i < 8; i++) {
        size_t got;
        if (!closed_within(idle[i], 4000 * srvt_slow(), &got)) fail_msg("idle connection %d still open after 4 s", i);
        assert_int_equal(got, 0);
        close(idle[i]);
    }
    /* the server counts a connection closed once its thread has finished
     * with it, which may come just after the client saw the close: a 503
     * (with Retry-After) for a moment is the cap still counting them */
    bool alive = false;
    for (int i = 0; i < 20 && !alive; i++) {
        srv_http_resp h;
        bool ok2 = srv_http_request("127.0.0.1", p.port, "GET", "/health", NULL, NULL, &h, 5000 * srvt_slow());
        alive = ok2 && h.status == 200;
        bool busy = ok2 && h.status == 503;
        srv_http_resp_free(&h);
        if (!alive && !busy) break;
        if (!alive) usleep(100000);
    }
    assert_true(alive);
    /* headers trickling in, a line every 200 ms (each within the idle
     * timeout): cut after --read-timeout, without an answer */
    int fd = srv_http_connect("127.0.0.1", p.port);
    assert_true(fd >= 0);
    const char *start = "GET /health HTTP/1.1\r\nHost: x\r\n";
    assert_true(send(fd, start, strlen(start), MSG_NOSIGNAL) > 0);
    t0 = keel_time_ns();
    bool cut = false;
    size_t got = 0;
    while (!cut && (keel_time_ns() - t0) / 1000000u < 6000u * (uint64_t)srvt_slow()) {
        cut = closed_within(fd, 200, &got) || send(fd, "X-Slow: 1\r\n", 11, MSG_NOSIGNAL) <= 0;
        if (got) break;
    }
    double secs = (double)(keel_time_ns() - t0) * 1e-9;
    printf("slow-header client cut after %.2f s (--read-timeout 2)\n", secs);
    assert_true(cut);
    assert_int_equal(got, 0);
    assert_true(secs >= 1.5);
    close(fd);
    /* a kept-alive connection closes once idle for the keep-alive timeout */
    fd = srv_http_connect("127.0.0.1", p.port);
    const char *req = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    assert_true(send(fd, req, strlen(req), MSG_NOSIGNAL) > 0);
    char buf[1024];
    size_t n = 0;
    while (n < sizeof buf - 1 && !strstr(buf, "\"ok\"")) {
        struct pollfd pf = {fd, POLLIN, 0};
        assert_true(poll(&pf, 1, 5000) > 0);
        ssize_t k = recv(fd, buf + n, sizeof buf - 1 - n, 0);
        assert_true(k > 0);
        n += (size_t)k;
        buf[n] = 0;
    }
    assert_non_null(strstr(buf, "200"));
    t0 = keel_time_ns();
    assert_true(closed_within(fd, 4000 * srvt_slow(), &got));
    printf("kept-alive connection closed %.2f s after its response (--keep-alive-timeout 1)\n",
           (double)(keel_time_ns() - t0) * 1e-9);
    close(fd);
    assert_true(srvt_alive(&p));
    assert_int_equal(srvt_stop(&p, 10 * srvt_slow()), 0);
}

/* A 9 MiB body reaches the client as a readable 413 (the body is read and
 * discarded first; before, the server closed while the client was still
 * writing and the SDKs saw a connection error), with Content-Length and
 * chunked. */
static void test_body_413(void **state)
{
    (void)state;
    size_t big = 9u << 20;
    char *huge = malloc(big + 1);
    assert_non_null(huge);
    memset(huge, ' ', big);
    memcpy(huge, "{\"messages\":\"", 13);
    huge[big - 2] = '"';
    huge[big - 1] = '}';
    huge[big] = 0;
    const char *paths[] = {"/v1/chat/completions", "/v1/messages"};
    for (int i = 0; i < 2; i++) {
        int fd = srv_http_connect("127.0.0.1", g_srv.port);
        assert_true(fd >= 0);
        /* every byte is taken: no reset while the client writes */
        assert_true(srv_http_send(fd, "POST", paths[i], NULL, huge, big));
        srv_http_resp r;
        assert_true(srv_http_read(fd, &r, 10000 * srvt_slow(), NULL, NULL));
        close(fd);
        check_error(paths[i], 413, "larger than the limit", &r);
        srv_http_resp_free(&r);
    }
    /* chunked: the same */
    int fd = srv_http_connect("127.0.0.1", g_srv.port);
    const char *hdr = "POST /v1/messages HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
    assert_true(send(fd, hdr, strlen(hdr), MSG_NOSIGNAL) > 0);
    for (size_t sent = 0; sent < big; sent += 1 << 16) {
        char chunk[64];
        int k = snprintf(chunk, sizeof chunk, "%x\r\n", 1 << 16);
        assert_true(send(fd, chunk, (size_t)k, MSG_NOSIGNAL) == k);
        assert_true(send(fd, huge, 1 << 16, MSG_NOSIGNAL) == 1 << 16);
        assert_true(send(fd, "\r\n", 2, MSG_NOSIGNAL) == 2);
    }
    assert_true(send(fd, "0\r\n\r\n", 5, MSG_NOSIGNAL) == 5);
    srv_http_resp r;
    assert_true(srv_http_read(fd, &r, 10000 * srvt_slow(), NULL, NULL));
    close(fd);
    check_error("/v1/messages", 413, "larger than the limit", &r);
    srv_http_resp_free(&r);
    free(huge);
    assert_true(srvt_alive(&g_srv));
}

/* A prompt longer than the context, and a rendering past its bound, get
 * OpenAI's context_length_exceeded and Anthropic's "prompt is too long: N
 * tokens > M maximum" on every route (before: the chat routes answered a
 * long rendering with a template error without a code). */
static void test_overflow_errors(void **state)
{
    (void)state;
    /* ~5000 tokens: past the 4096 cells of the cache */
    size_t cap = 700000;
    char *text = malloc(cap);
    assert_non_null(text);
    size_t n = 0;
    for (int i = 0; i < 2500; i++) n += (size_t)snprintf(text + n, cap - n, "dog %d ", i);
    const char *fmt_chat = "{\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}],\"max_tokens\":2}";
    const char *fmt_cmpl = "{\"prompt\":\"%s\",\"max_tokens\":2}";
    char *body = malloc(cap + 256);
    for (int big = 0; big < 2; big++) {
        if (big) { /* 600 KB: a rendering past 64 bytes x 8192 tokens */
            memset(text, 'a', 600000);
            for (size_t i = 7; i < 600000; i += 8) text[i] = ' ';
            text[600000] = 0;
        }
        const char *paths[] = {"/v1/chat/completions", "/v1/messages", "/v1/completions"};
        for (int i = 0; i < 3; i++) {
            for (int stream = 0; stream < 2; stream++) {
                snprintf(body, cap + 256, i == 2 ? fmt_cmpl : fmt_chat, text);
                if (stream) strcpy(body + strlen(body) - 1, ",\"stream\":true}");
                srv_http_resp r;
                int st = srvt_req(&g_srv, "POST", paths[i], NULL, body, &r);
                json_t *j = r.body.p ? json_loadb(r.body.p, r.body.len, 0, NULL) : NULL;
                const char *code = srvt_str(j, i == 1 ? "error.type" : "error.code");
                if (st != 400 || !code || strcmp(code, i == 1 ? "invalid_request_error" : "context_length_exceeded") != 0)
                    fail_msg("%s (rendering %s, stream %d): status %d, %s", paths[i], big ? "huge" : "long", stream, st,
                             r.body.p ? r.body.p : "");
                srv_http_resp_free(&r);
                if (i == 1) {
                    const char *msg = srvt_str(j, "error.message");
                    long long tok = 0, max = 0;
                    assert_string_equal(srvt_str(j, "type"), "error");
                    assert_string_equal(srvt_str(j, "error.type"), "invalid_request_error");
                    if (!msg || sscanf(msg, "prompt is too long: %lld tokens > %lld maximum", &tok, &max) != 2)
                        fail_msg("message: %s", msg ? msg : "(none)");
                    assert_int_equal(max, 4096);
                    assert_true(tok > max);
                } else {
                    assert_string_equal(srvt_str(j, "error.code"), "context_length_exceeded");
                    assert_string_equal(srvt_str(j, "error.type"), "invalid_request_error");
                    const char *param = srvt_str(j, "error.param");
                    if (!param || strcmp(param, i == 0 ? "messages" : "prompt") != 0) fail_msg("param %s", param ? param : "null");
                    assert_non_null(strstr(srvt_str(j, "error.message"), "maximum context length is 4096 tokens"));
                }
                json_decref(j);
            }
        }
    }
    free(body);
    free(text);
    assert_true(srvt_alive(&g_srv));
}

typedef struct arrivals {
    srv_buf body;
    uint64_t t0;
    size_t at[512];   /* body length after each piece */
    uint64_t ms[512]; /* and its arrival, ms since t0 */
    int n;
} arrivals;

static bool on_piece(void *user, const char *p, size_t n)
{
    arrivals *a = user;
    if (!srv_buf_add(&a->body, p, n)) return false;
    if (a->n < 512) {
        a->at[a->n] = a->body.len;
        a->ms[a->n++] = (keel_time_ns() - a->t0) / 1000000u;
    }
    return true;
}

/* When the byte at offset off arrived (ms), or -1. */
static int64_t arrived(const arrivals *a, size_t off)
{
    for (int i = 0; i < a->n; i++)
        if (a->at[i] > off) return (int64_t)a->ms[i];
    return -1;
}

/* A stream answers at admission: headers and message_start with the
 * prompt's usage (or the role chunk) at once, then a ping every --sse-ping
 * seconds through a long prefill, before the first token; --keep-alive-timeout
 * does not cut it (before: nothing until the first token, message_start's
 * usage all zeros). */
static void test_first_bytes(void **state)
{
    (void)state;
    char slow[64];
    assert_true(srvt_gen_model(slow, sizeof slow, "qwen2", 256, 4, 0, 11));
    srvt_proc p;
    const char *args[] = {"-t", "1", "-c", "16384", "-ub", "64", "-b", "64", "--sse-ping", "1", "--keep-alive-timeout",
                          "1", "--log-disable", NULL};
    assert_true(srvt_start(&p, slow, args, true));
    size_t cap = 64000;
    char *text = malloc(cap), *body = malloc(cap + 256);
    /* a prefill of ~4 s here (2000 words took 1.4 s once prefill attention
     * got faster: the margin must hold on faster machines too), longer
     * under the sanitizers */
    int words = srvt_slow() > 1 ? 300 : 2400;
    for (int api = 0; api < 2; api++) {
        size_t n = 0;
        for (int i = 0; i < words; i++) n += (size_t)snprintf(text + n, cap - n, "%s %d ", api ? "cat" : "dog", i);
        snprintf(body, cap + 256,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}],\"max_tokens\":2,\"stream\":true,\"temperature\":0}",
                 text);
        arrivals a;
        memset(&a, 0, sizeof a);
        a.t0 = keel_time_ns();
        int fd = srv_http_connect("127.0.0.1", p.port);
        assert_true(srv_http_send(fd, "POST", api ? "/v1/messages" : "/v1/chat/completions", NULL, body, strlen(body)));
        srv_http_resp r;
        assert_true(srv_http_read(fd, &r, 60000 * srvt_slow(), on_piece, &a));
        close(fd);
        assert_int_equal(r.status, 200);
        const char *b = a.body.p;
        const char *first = strstr(b, api ? "content_block_start" : "\"delta\":{\"content\"");
        const char *head = strstr(b, api ? "message_start" : "\"role\":\"assistant\"");
        assert_non_null(head);
        int64_t t_head = arrived(&a, (size_t)(head - b)), t_first = first ? arrived(&a, (size_t)(first - b)) : -1;
        int pings = 0;
        for (const char *q = b; (q = strstr(q, api ? "event: ping" : ": keep-alive")) && (!first || q < first); q++) pings++;
        printf("%s stream, a prompt of %d words: start at %lld ms, first token at %lld ms, %d keep-alives between\n",
               api ? "Anthropic" : "OpenAI", 2 * words, (long long)t_head, (long long)t_first, pings);
        /* the prefill takes seconds: the start comes long before the token */
        assert_true(t_first - t_head >= 1500);
        assert_true(pings >= (api ? 2 : 1)); /* Anthropic: the one after message_start, then the periodic ones */
        if (api) {
            srvt_events ev;
            assert_true(srvt_parse_sse(b, a.body.len, &ev));
            /* the prompt's count, as the final usage has it */
            int64_t in = srvt_int(ev.data, "0.message.usage.input_tokens");
            int64_t cached = srvt_int(ev.data, "0.message.usage.cache_read_input_tokens");
            assert_true(in + cached > 2 * words);
            size_t last = json_array_size(ev.data) - 2; /* message_delta */
            json_t *fin = json_array_get(ev.data, last);
            assert_int_equal(srvt_int(fin, "usage.input_tokens"), in);
            assert_int_equal(srvt_int(fin, "usage.cache_read_input_tokens"), cached);
            srvt_events_free(&ev);
        }
        srv_http_resp_free(&r);
        srv_buf_free(&a.body);
    }
    free(text);
    free(body);
    assert_int_equal(srvt_stop(&p, 10 * srvt_slow()), 0);
    unlink(slow);
}

/* keel bench-serve on a small model: the JSON it prints. */
static void test_bench_serve(void **state)
{
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s bench-serve -m %s -t 1 -p 8 -n 4 --requests 1 --concurrency 1,2 --json", getenv("KEEL_BIN"),
             g_model);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    static char out[16384];
    size_t n = fread(out, 1, sizeof out - 1, f);
    out[n] = 0;
    assert_int_equal(pclose(f), 0);
    json_t *j = json_loads(out, 0, NULL);
    if (!j) fail_msg("bench-serve printed: %s", out);
    assert_true(json_number_value(json_object_get(json_object_get(j, "single_stream"), "decode_tokens_per_second")) > 0);
    json_t *runs = json_object_get(j, "runs");
    assert_int_equal(json_array_size(runs), 2);
    assert_int_equal(srvt_int(runs, "1.concurrency"), 2);
    assert_int_equal(srvt_int(runs, "1.requests"), 2);
    assert_int_equal(srvt_int(runs, "1.failures"), 0);
    assert_true(json_number_value(json_object_get(json_array_get(runs, 1), "tokens_per_second")) > 0);
    assert_true(json_number_value(json_object_get(json_array_get(runs, 0), "ttft_mean_ms")) > 0);
    json_decref(j);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_loading),       cmocka_unit_test(test_info_endpoints), cmocka_unit_test(test_chat),
        cmocka_unit_test(test_chat_stream),   cmocka_unit_test(test_completions),    cmocka_unit_test(test_messages),
        cmocka_unit_test(test_bad_requests),  cmocka_unit_test(test_slot_actions),   cmocka_unit_test(test_metrics), cmocka_unit_test(test_speculative),
        cmocka_unit_test(test_auth),          cmocka_unit_test(test_shutdown),       cmocka_unit_test(test_bench_serve),
        cmocka_unit_test(test_connections),   cmocka_unit_test(test_body_413),       cmocka_unit_test(test_overflow_errors),
        cmocka_unit_test(test_first_bytes),   cmocka_unit_test(test_prefill),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
