/*
 * embed.c — a program built against an installed keel (tests/pkg/install_test.sh
 * compiles it with `pkg-config --cflags --libs keel`, not CMake): opens a
 * model through keel_engine, runs one keel_complete with streaming, and
 * prints what the script checks:
 *   version <library> <header>
 *   events <content deltas> <content bytes> <done events>
 *   status <status name>
 *   response: <response JSON>
 * Exit 0 when the turn succeeded and the DONE event carried the response
 * that keel_complete wrote; 1 otherwise (with the reason on stderr).
 *
 *   embed MODEL.gguf
 */
#include <keel.h>

#include <stdio.h>
#include <string.h>

typedef struct counts {
    long content, bytes, done;
    char done_response[16384];
} counts;

static bool on_event(void *user, const keel_event *ev)
{
    counts *c = user;
    if (ev->kind == KEEL_EVENT_CONTENT) {
        c->content++;
        c->bytes += (long)ev->len;
    } else if (ev->kind == KEEL_EVENT_DONE) {
        c->done++;
        snprintf(c->done_response, sizeof c->done_response, "%s", ev->response);
    }
    return true;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: embed MODEL.gguf\n");
        return 2;
    }
    if (strpbrk(argv[1], "\"\\")) {
        fprintf(stderr, "embed: the model path must not hold quotes or backslashes\n");
        return 2;
    }
    printf("version %s %s\n", keel_version(), KEEL_VERSION_STRING);
    char opts[4200], err[256] = "";
    snprintf(opts, sizeof opts, "{\"model\": \"%s\", \"n_ctx\": 256, \"n_threads\": 1}", argv[1]);
    keel_engine *e = NULL;
    keel_status st = keel_engine_open(opts, &e, err);
    if (st != KEEL_OK) {
        fprintf(stderr, "embed: keel_engine_open: %s: %s\n", keel_strerror(st), err);
        return 1;
    }
    static char resp[16384];
    counts c;
    memset(&c, 0, sizeof c);
    st = keel_complete(e, "[{\"role\": \"user\", \"content\": \"Once upon a time\"}]",
                       "{\"max_tokens\": 4, \"temperature\": 0, \"ignore_eos\": true}", NULL, on_event, &c, resp,
                       sizeof resp);
    printf("events %ld %ld %ld\n", c.content, c.bytes, c.done);
    printf("status %s\n", keel_status_name(st));
    printf("response: %s\n", resp);
    int rc = 0;
    if (st != KEEL_OK) {
        fprintf(stderr, "embed: keel_complete: %s: %s\n", keel_strerror(st), keel_engine_last_error(e));
        rc = 1;
    } else if (strcmp(c.done_response, resp) != 0) {
        fprintf(stderr, "embed: the DONE event's response differs from keel_complete's\n");
        rc = 1;
    }
    keel_engine_close(e);
    if (fflush(stdout) != 0) rc = 1;
    return rc;
}
