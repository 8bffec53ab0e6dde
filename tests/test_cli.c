/*
 * test_cli.c — the keel CLI end to end (build/keel via KEEL_BIN): version
 * and help, perplexity against llama-perplexity's reference values, run
 * with the fixture prompt ids against the greedy reference, tokenize, and
 * the errors a user can cause (empty prompt, context smaller than the
 * prompt, bad token ids, unknown options).
 */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* Runs a shell command, captures stdout (and stderr when merge) into buf;
 * returns the exit status. */
static int run(const char *cmd, char *buf, size_t cap, bool merge)
{
    char full[8192];
    snprintf(full, sizeof full, "%s%s", cmd, merge ? " 2>&1" : " 2>/dev/null");
    FILE *p = popen(full, "r");
    assert_non_null(p);
    size_t n = fread(buf, 1, cap - 1, p);
    buf[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static const char *bin(void)
{
    const char *b = getenv("KEEL_BIN");
    return b && *b ? b : "./keel";
}

static char g_out[1 << 20];

static void test_version_help(void **state)
{
    (void)state;
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s --version", bin());
    assert_int_equal(run(cmd, g_out, sizeof g_out, false), 0);
    assert_non_null(strstr(g_out, "keel " KEEL_VERSION_STRING));
    snprintf(cmd, sizeof cmd, "%s help", bin());
    assert_int_equal(run(cmd, g_out, sizeof g_out, false), 0);
    assert_non_null(strstr(g_out, "perplexity"));
    snprintf(cmd, sizeof cmd, "%s frobnicate", bin());
    assert_int_equal(run(cmd, g_out, sizeof g_out, true), 2);
    snprintf(cmd, sizeof cmd, "%s run --bogus", bin());
    assert_int_equal(run(cmd, g_out, sizeof g_out, true), 2);
    assert_non_null(strstr(g_out, "unknown option"));
}

static double final_ppl(const char *out)
{
    const char *p = strstr(out, "Final estimate: PPL = ");
    assert_non_null(p);
    return atof(p + strlen("Final estimate: PPL = "));
}

static void test_perplexity(void **state)
{
    (void)state;
    const char *mdl = test_fixture("models/stories260K.gguf");
    if (!mdl) return;
    char m[1024], txt[1024], cmd[4096];
    snprintf(m, sizeof m, "%s", mdl);
    snprintf(txt, sizeof txt, "%s", test_fixture("text/stories.txt"));
    /* llama-perplexity on the same file: 5.1825 (-c 128), 4.8315 (-c 256) */
    const struct { int c; double ref; } cases[] = {{128, 5.1825}, {256, 4.8315}};
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd, "%s perplexity -m %s -f %s -c %d", bin(), m, txt, cases[i].c);
        assert_int_equal(run(cmd, g_out, sizeof g_out, false), 0);
        double ppl = final_ppl(g_out);
        printf("perplexity -c %d: %.4f (llama.cpp %.4f, %.3f%%)\n", cases[i].c, ppl, cases[i].ref,
               100.0 * fabs(ppl - cases[i].ref) / cases[i].ref);
        assert_true(fabs(ppl - cases[i].ref) / cases[i].ref < 0.005);
        assert_non_null(strstr(g_out, "[1]"));
    }
}

static void test_run_greedy_ids(void **state)
{
    (void)state;
    const char *mdl = test_fixture("models/stories260K.gguf");
    if (!mdl) return;
    char m[1024], cmd[16384], ids[4096], idsout[] = "/tmp/keel_test_ids_XXXXXX";
    snprintf(m, sizeof m, "%s", mdl);
    size_t n = 0;
    int32_t *prompt = test_read_file(test_fixture("ref/stories260K.prompt.i32"), &n);
    int32_t *greedy = test_read_file(test_fixture("ref/stories260K.greedy.i32"), &n);
    size_t k = 0;
    for (int i = 0; i < 200; i++) k += (size_t)snprintf(ids + k, sizeof ids - k, "%s%d", i ? "," : "", prompt[i]);
    int fd = mkstemp(idsout);
    assert_true(fd >= 0);
    snprintf(cmd, sizeof cmd, "%s run -m %s -c 512 --prompt-ids %s -n 64 --temp 0 --ignore-eos --ids-out %s",
             bin(), m, ids, idsout);
    assert_int_equal(run(cmd, g_out, sizeof g_out, false), 0);
    size_t gn = 0;
    int32_t *got = test_read_file(idsout, &gn);
    assert_int_equal(gn, 64 * sizeof(int32_t));
    assert_memory_equal(got, greedy, 64 * sizeof(int32_t));
    /* the .gguf and the llama2.c pair print the same text for a text prompt */
    static char a[1 << 20];
    snprintf(cmd, sizeof cmd, "%s run -m %s -p 'Once upon a time' -n 60 --temp 0", bin(), m);
    assert_int_equal(run(cmd, g_out, sizeof g_out, false), 0);
    memcpy(a, g_out, sizeof a);
    assert_true(strlen(a) > 100);
    assert_non_null(strstr(a, "Lily"));
    char b[1024], t[1024];
    snprintf(b, sizeof b, "%s", test_fixture("models/stories260K.bin"));
    snprintf(t, sizeof t, "%s", test_fixture("models/tok512.bin"));
    snprintf(cmd, sizeof cmd, "%s run -m %s --tokenizer %s -p 'Once upon a time' -n 60 --temp 0", bin(), b, t);
    assert_int_equal(run(cmd, g_out, sizeof g_out, false), 0);
    assert_string_equal(a, g_out);
    close(fd);
    unlink(idsout);
    free(got);
    free(prompt);
    free(greedy);
}

static void test_user_errors(void **state)
{
    (void)state;
    const char *mdl = test_fixture("models/stories260K.gguf");
    if (!mdl) return;
    char m[1024], cmd[4096];
    snprintf(m, sizeof m, "%s", mdl);
    snprintf(cmd, sizeof cmd, "%s run -m %s --prompt-ids 1,2,600 -n 4", bin(), m);
    assert_int_equal(run(cmd, g_out, sizeof g_out, true), 1);
    assert_non_null(strstr(g_out, "out of range"));
    snprintf(cmd, sizeof cmd, "%s run -m %s -c 8 -p 'Once upon a time there was a little girl named Lily'", bin(), m);
    assert_int_equal(run(cmd, g_out, sizeof g_out, true), 1);
    assert_non_null(strstr(g_out, "smaller than the prompt"));
    snprintf(cmd, sizeof cmd, "%s run -m /nonexistent.gguf -p hi", bin());
    assert_int_equal(run(cmd, g_out, sizeof g_out, true), 1);
    assert_non_null(strstr(g_out, "cannot open"));
    snprintf(cmd, sizeof cmd, "%s tokenize -m %s -p 'Once upon a time' --ids", bin(), m);
    assert_int_equal(run(cmd, g_out, sizeof g_out, false), 0);
    assert_non_null(strstr(g_out, "[1, 403, 407, 261, 378]"));
    snprintf(cmd, sizeof cmd, "%s inspect %s -c 256", bin(), m);
    assert_int_equal(run(cmd, g_out, sizeof g_out, false), 0);
    assert_non_null(strstr(g_out, "arch         llama"));
    assert_non_null(strstr(g_out, "KV cache"));
    assert_non_null(strstr(g_out, "blk.0.attn_q.weight"));
}

static void test_demo(void **state)
{
    (void)state;
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s demo --turns 4", bin());
    assert_int_equal(run(cmd, g_out, sizeof g_out, true), 0);
    assert_non_null(strstr(g_out, "summary: 4 turns"));
    assert_non_null(strstr(g_out, "invariants ok"));
    assert_non_null(strstr(g_out, "compactions"));
    /* without fixtures: the generated sliding-window model with q8_0 K/V */
    snprintf(cmd, sizeof cmd, "cd /tmp && KEEL_FIXTURES=/nonexistent %s demo --turns 3", bin());
    assert_int_equal(run(cmd, g_out, sizeof g_out, true), 0);
    assert_non_null(strstr(g_out, "KV q8_0/q8_0"));
    assert_non_null(strstr(g_out, "invariants ok"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version_help),
        cmocka_unit_test(test_perplexity),
        cmocka_unit_test(test_run_greedy_ids),
        cmocka_unit_test(test_user_errors),
        cmocka_unit_test(test_demo),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
