/*
 * test_cli.c — the keel CLI end to end (build/keel via KEEL_BIN): version
 * and help, perplexity against llama-perplexity's reference values, run
 * with the fixture prompt ids against the greedy reference, tokenize, and
 * the errors a user can cause (empty prompt, context smaller than the
 * prompt, bad token ids, unknown options).
 *
 * Hardening (issue 8), on generated models (llama: SPM vocabulary, qwen2:
 * BPE) and on the fixtures when present: the continuation keeps the space
 * of its first token (prompt text + output == detokenize(prompt + ids)),
 * compaction lets run and perplexity stream past -c, --kv-compact
 * defaults, -n -1, the limit that stopped generation, write errors
 * (/dev/full), non-finite logits, strict parsing of every flag, files,
 * stray arguments, bench's flags and exit codes, sampler messages, help
 * listing every flag, escaped metadata.
 */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static size_t g_out_n; /* bytes run() captured */

/* Runs a shell command, captures stdout (and stderr when merge) into buf;
 * returns the exit status. */
static int run(const char *cmd, char *buf, size_t cap, bool merge)
{
    static char full[1 << 15];
    snprintf(full, sizeof full, "%s%s", cmd, merge ? " 2>&1" : " 2>/dev/null");
    FILE *p = popen(full, "r");
    assert_non_null(p);
    size_t n = fread(buf, 1, cap - 1, p);
    buf[n] = 0;
    g_out_n = n;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Runs cmd as given (its own redirections), capturing its stdout. */
static int run_sh(const char *cmd, char *buf, size_t cap)
{
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(buf, 1, cap - 1, p);
    buf[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Runs cmd with stderr captured into buf and stdout discarded. */
static int run_err(const char *cmd, char *buf, size_t cap)
{
    static char full[1 << 15];
    snprintf(full, sizeof full, "%s 2>&1 >/dev/null", cmd);
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
    assert_int_equal(run(cmd, g_out, sizeof g_out, true), 2);
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

/* ---- hardening (issue 8) ------------------------------------------------------ */

/* Generated models shared by the tests below (group setup): llama (SPM
 * vocabulary) and qwen2 (BPE), plus a text file and an empty file. */
static char g_spm[64] = "/tmp/keel_cli_spm_XXXXXX", g_bpe[64] = "/tmp/keel_cli_bpe_XXXXXX";
static char g_text[64] = "/tmp/keel_cli_txt_XXXXXX", g_empty[64] = "/tmp/keel_cli_nil_XXXXXX";
static char g_tmp[64] = "/tmp/keel_cli_out_XXXXXX";

static const char g_story[] =
    "Once upon a time there was a little girl named Lily. She liked to play in the park with her "
    "dog Max. One day they found a big red ball under a tree. Lily threw the ball and Max ran after "
    "it. They played all day and were very happy. ";

static int make_temp(char *path)
{
    int fd = mkstemp(path);
    if (fd < 0) return -1;
    close(fd);
    return 0;
}

static int group_setup(void **state)
{
    (void)state;
    if (make_temp(g_spm) || make_temp(g_bpe) || make_temp(g_text) || make_temp(g_empty) ||
        make_temp(g_tmp))
        return -1;
    keel_gen_params gp = keel_gen_params_default();
    gp.arch = "llama";
    gp.n_ctx = 256;
    char err[256] = "";
    if (keel_gen_model(&gp, g_spm, err) != KEEL_OK) return -1;
    gp.arch = "qwen2";
    if (keel_gen_model(&gp, g_bpe, err) != KEEL_OK) return -1;
    FILE *f = fopen(g_text, "wb");
    if (!f) return -1;
    for (int i = 0; i < 8; i++) fputs(g_story, f);
    return fclose(f) == 0 ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    unlink(g_spm);
    unlink(g_bpe);
    unlink(g_text);
    unlink(g_empty);
    unlink(g_tmp);
    return 0;
}

static keel_model *open_model(const char *path)
{
    keel_model_params mp = keel_model_params_default();
    mp.path = path;
    keel_model *m = NULL;
    char err[256] = "";
    keel_status st = keel_model_open(&mp, &m, err);
    if (st != KEEL_OK) fail_msg("open %s: %s", path, err);
    return m;
}

static char *detok_all(const keel_model *m, const int32_t *ids, int32_t n, size_t *len)
{
    size_t need = 0;
    keel_status st = keel_detokenize(m, ids, n, NULL, 0, &need);
    assert_true(st == KEEL_OK || st == KEEL_ERANGE);
    char *s = malloc(need + 1);
    assert_ok(keel_detokenize(m, ids, n, s, need + 1, len));
    s[*len] = 0;
    return s;
}

/* Item 1: prompt text + printed continuation == detokenize(prompt ids +
 * generated ids). Returns the continuation's first byte (or -1). */
static int check_continuation(const char *model, const char *prompt, int n)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s run -m %s -p '%s' -n %d --temp 0 --ignore-eos --ids-out %s", bin(),
             model, prompt, n, g_tmp);
    assert_int_equal(run(cmd, g_out, sizeof g_out, false), 0);
    assert_true(g_out_n >= 1 && g_out[g_out_n - 1] == '\n'); /* run ends with a newline */
    size_t out_n = g_out_n - 1;
    size_t gn = 0;
    int32_t *gen = test_read_file(g_tmp, &gn);
    assert_non_null(gen);
    assert_int_equal(gn, (size_t)n * sizeof(int32_t));
    keel_model *m = open_model(model);
    int32_t pn = 0, ids[1024];
    assert_ok(keel_tokenize(m, prompt, strlen(prompt), true, false, ids, 512, &pn));
    size_t plen = 0, flen = 0;
    char *ptext = detok_all(m, ids, pn, &plen);
    assert_string_equal(ptext, prompt);
    memcpy(ids + pn, gen, gn);
    char *full = detok_all(m, ids, pn + n, &flen);
    if (flen != plen + out_n || memcmp(full, ptext, plen) != 0 || memcmp(full + plen, g_out, out_n) != 0)
        fail_msg("%s: prompt '%s' + output '%.*s' != detokenize '%s'", model, ptext, (int)out_n, g_out,
                 full);
    int first = out_n ? (unsigned char)g_out[0] : -1;
    free(full);
    free(ptext);
    free(gen);
    keel_model_close(m);
    return first;
}

static void test_continuation_keeps_space(void **state)
{
    (void)state;
    check_continuation(g_spm, "Once upon a time", 24);
    check_continuation(g_bpe, "Once upon a time", 24);
    check_continuation(g_spm, "", 8); /* only BOS before: the SPM space rule applies */
    const char *mdl = test_fixture("models/stories260K.gguf");
    if (!mdl) return;
    char m[1024];
    snprintf(m, sizeof m, "%s", mdl);
    /* the case: the first token is ▁park, printed " park" */
    assert_int_equal(check_continuation(m, "Tom and his dog went to the", 20), ' ');
    assert_int_equal(strncmp(g_out, " park.", 6), 0);
    check_continuation(m, "Once upon a time", 40);
}

/* Items 2-4: compaction streams past -c; defaults; -n -1; the limit named. */
static void test_compaction_streams(void **state)
{
    (void)state;
    char cmd[4096], err[8192];
    const char *models[2] = {g_spm, test_fixture("models/stories260K.gguf")};
    char fixture[1024] = "";
    if (models[1]) snprintf(fixture, sizeof fixture, "%s", models[1]);
    for (int k = 0; k < 2; k++) {
        const char *m = k ? fixture : g_spm;
        if (!m[0]) break;
        /* the command: 300 tokens through a 32-cell budget in a 128-cell context */
        snprintf(cmd, sizeof cmd,
                 "%s run -m %s -p 'Tom and his dog went to the' -c 128 --kv-compact keydiff "
                 "--kv-trigger 32 --kv-target 16 --kv-positions renumber -n 300 --temp 0 "
                 "--ignore-eos --ids-out %s",
                 bin(), m, g_tmp);
        assert_int_equal(run_err(cmd, err, sizeof err), 0);
        assert_non_null(strstr(err, "generated 300 tokens"));
        assert_non_null(strstr(err, "cells never above 32"));
        assert_non_null(strstr(err, "stopped: -n 300 tokens"));
        size_t n = 0;
        free(test_read_file(g_tmp, &n));
        assert_int_equal(n, 300 * sizeof(int32_t));
        /* without compaction: stops at the context, and says so */
        snprintf(cmd, sizeof cmd,
                 "%s run -m %s -p 'Tom and his dog went to the' -c 64 -n -1 --temp 0 --ignore-eos "
                 "--ids-out %s",
                 bin(), m, g_tmp);
        assert_int_equal(run_err(cmd, err, sizeof err), 0);
        assert_non_null(strstr(err, "stopped: context full (-c 64 cells, no compaction"));
        keel_model *km = open_model(m);
        int32_t pn = 0, ids[64];
        const char *pr = "Tom and his dog went to the";
        assert_ok(keel_tokenize(km, pr, strlen(pr), true, false, ids, 64, &pn));
        keel_model_close(km);
        free(test_read_file(g_tmp, &n));
        assert_int_equal(n, (size_t)(64 - pn + 1) * sizeof(int32_t)); /* the last one sampled, not decoded */
        /* a prompt longer than -c: compaction keeps it inside the budget */
        snprintf(cmd, sizeof cmd, "%s run -m %s -f %s -c 64 --kv-compact keydiff -n 8 --temp 0 --ignore-eos",
                 bin(), m, g_text);
        assert_int_equal(run_err(cmd, err, sizeof err), 0);
        assert_non_null(strstr(err, "generated 8 tokens"));
        assert_non_null(strstr(err, "cells never above 64"));
        snprintf(cmd, sizeof cmd, "%s run -m %s -f %s -c 64 -n 8", bin(), m, g_text);
        assert_int_equal(run_err(cmd, err, sizeof err), 1);
        assert_non_null(strstr(err, "smaller than the prompt"));
        /* --kv-compact alone: trigger n_ctx, target n_ctx / 2; -n -1 runs on through the budget
         * until -n would stop it: here 200 tokens in 48 cells */
        snprintf(cmd, sizeof cmd, "%s run -m %s -p 'Tom' -c 48 --kv-compact window -n 200 --temp 0 --ignore-eos",
                 bin(), m);
        assert_int_equal(run_err(cmd, err, sizeof err), 0);
        assert_non_null(strstr(err, "generated 200 tokens"));
        assert_non_null(strstr(err, "cells never above 48"));
    }
    /* compaction parameters without --kv-compact, and the defaults in --help */
    snprintf(cmd, sizeof cmd, "%s run -m %s -p hi --kv-trigger 32 --kv-target 16", bin(), g_spm);
    assert_int_equal(run_err(cmd, err, sizeof err), 2);
    assert_non_null(strstr(err, "--kv-trigger needs --kv-compact"));
    snprintf(cmd, sizeof cmd, "%s perplexity -m %s -f %s --kv-sinks 2", bin(), g_spm, g_text);
    assert_int_equal(run_err(cmd, err, sizeof err), 2);
    assert_non_null(strstr(err, "--kv-sinks needs --kv-compact"));
    snprintf(cmd, sizeof cmd, "%s run -h", bin());
    assert_int_equal(run(cmd, g_out, sizeof g_out, false), 0);
    assert_non_null(strstr(g_out, "alone: trigger n_ctx"));
    assert_non_null(strstr(g_out, "-1: until end of generation or the budget"));
    /* -n below -1 is an error */
    snprintf(cmd, sizeof cmd, "%s run -m %s -p hi -n -2", bin(), g_spm);
    assert_int_equal(run_err(cmd, err, sizeof err), 2);
    assert_non_null(strstr(err, "-n -2: must be an integer >= -1"));
    /* perplexity streams each chunk through a budget smaller than the chunk */
    snprintf(cmd, sizeof cmd, "%s perplexity -m %s -f %s -c 128 --kv-compact keydiff --kv-trigger 32", bin(),
             g_spm, g_text);
    assert_int_equal(run(cmd, g_out, sizeof g_out, true), 0);
    assert_non_null(strstr(g_out, "KV compaction keydiff: 32 cells, trigger 32, target 16"));
    double ppl = final_ppl(g_out);
    assert_true(isfinite(ppl) && ppl > 1.0);
    if (fixture[0]) {
        char txt[1024];
        snprintf(txt, sizeof txt, "%s", test_fixture("text/stories.txt"));
        snprintf(cmd, sizeof cmd, "%s perplexity -m %s -f %s -c 256 --kv-compact keydiff --kv-trigger 64",
                 bin(), fixture, txt);
        assert_int_equal(run(cmd, g_out, sizeof g_out, true), 0);
        ppl = final_ppl(g_out);
        printf("perplexity -c 256 through a 64-cell keydiff budget: %.4f\n", ppl);
        assert_true(ppl > 4.0 && ppl < 8.0); /* full context: 4.83 */
    }
}

/* Item 5: every write checked. */
static void test_write_errors(void **state)
{
    (void)state;
    if (access("/dev/full", W_OK) != 0) {
        printf("[  SKIP    ] /dev/full absent\n");
        return;
    }
    char cmd[4096], err[8192];
    const struct {
        const char *args;
        const char *what;
    } cases[] = {
        {"run -m %s -p hi -n 4 > /dev/full", "writing to standard output: No space left on device"},
        {"run -m %s -p hi -n 4 --logits-out /dev/full", "--logits-out /dev/full: No space left on device"},
        {"run -m %s -p hi -n 4 --ids-out /dev/full", "--ids-out /dev/full: No space left on device"},
        {"tokenize -m %s -p hi > /dev/full", "No space left on device"},
        {"tokenize -m %s -p hi --ids > /dev/full", "No space left on device"},
        {"inspect %s > /dev/full", "No space left on device"},
        {"inspect %s --no-tensors > /dev/full", "No space left on device"},
        {"run -h > /dev/full %s", "No space left on device"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char args[1024];
        snprintf(args, sizeof args, cases[i].args, g_spm);
        snprintf(cmd, sizeof cmd, "%s 2>&1 %s", bin(), args); /* stderr to the pipe first */
        assert_int_equal(run_sh(cmd, err, sizeof err), 1);
        if (!strstr(err, cases[i].what)) fail_msg("%s: '%s' lacks '%s'", args, err, cases[i].what);
    }
    snprintf(cmd, sizeof cmd, "%s 2>&1 perplexity -m %s -f %s -c 64 > /dev/full", bin(), g_spm, g_text);
    assert_int_equal(run_sh(cmd, err, sizeof err), 1);
    assert_non_null(strstr(err, "No space left on device"));
    snprintf(cmd, sizeof cmd, "%s 2>&1 --version > /dev/full", bin());
    assert_int_equal(run_sh(cmd, err, sizeof err), 1);
    /* and success still exits 0 */
    snprintf(cmd, sizeof cmd, "%s run -m %s -p hi -n 4 > /dev/null", bin(), g_spm);
    assert_int_equal(run_err(cmd, err, sizeof err), 0);
}

/* Item 8 (detection): non-finite logits are named with their position. */
static void test_nonfinite_logits(void **state)
{
    (void)state;
    char path[64] = "/tmp/keel_cli_nan_XXXXXX", cmd[4096], err[8192];
    assert_int_equal(make_temp(path), 0);
    keel_gen_params gp = keel_gen_params_default();
    gp.arch = "llama";
    char e[256] = "";
    assert_ok(keel_gen_model(&gp, path, e));
    assert_true(test_fill_tensor_f32(path, "output.weight", NAN));
    keel_model *m = open_model(path);
    int32_t ids[64], n = 0;
    assert_ok(keel_tokenize(m, "Once upon a time", 16, true, false, ids, 64, &n));
    keel_model_close(m);
    snprintf(cmd, sizeof cmd, "%s run -m %s -p 'Once upon a time' -n 4", bin(), path);
    assert_int_equal(run_err(cmd, err, sizeof err), 1);
    char want[64];
    snprintf(want, sizeof want, "logits are NaN at position %d", n - 1); /* the prompt's last token */
    if (!strstr(err, want)) fail_msg("'%s' lacks '%s'", err, want);
    assert_non_null(strstr(err, "the model's weights or hyperparameters are invalid"));
    assert_null(strstr(err, "sample"));
    unlink(path);
}

/* Items 10-13, 15: strict parsing. */
static void test_strict_parsing(void **state)
{
    (void)state;
    char cmd[4096], err[8192];
    const struct {
        const char *args;
        int rc;
        const char *msg;
    } cases[] = {
        {"run -m %s --prompt-ids 4294967297 -n 1", 2, "'4294967297' is not a token id"},
        {"run -m %s --prompt-ids 1,-2 -n 1", 2, "'-2' is out of range [0, 512)"},
        {"run -m %s --prompt-ids 1,2x -n 1", 2, "'2x' is not a token id"},
        {"run -m %s --prompt-ids 1,,2 -n 1", 2, "element 1 '' is not a token id"},
        {"tokenize -m %s --prompt-ids 512", 2, "'512' is out of range [0, 512)"},
        {"tokenize -m %s --prompt-ids -1", 2, "'-1' is out of range"},
        {"run -m %s -f /tmp -n 1", 1, "-f /tmp: Is a directory"},
        {"run -m %s -f /nonexistent/x -n 1", 1, "-f /nonexistent/x: No such file or directory"},
        {"run -m %s --ignore-eos yes", 2, "unexpected argument 'yes' (--ignore-eos takes no value)"},
        {"run -m %s -p hi stray", 2, "unexpected argument 'stray'"},
        {"tokenize -m %s -p hi --ids extra", 2, "unexpected argument 'extra' (--ids takes no value)"},
        {"tokenize -m %s -p hi --temp 0.5", 2, "unknown option '--temp'"},
        {"perplexity -m %s -c -1", 2, "-c -1: must be an integer in [0, 67108864]"},
        {"run -m %s -p hi -c -1", 2, "-c -1: must be an integer in [0, 67108864]"},
        {"run -m %s -p hi -b 0", 2, "-b 0: must be an integer in [1, 1048576]"},
        {"run -m %s -p hi -t -3", 2, "-t -3: must be an integer in [0, 256]"},
        {"run -m %s -p hi -n 5x", 2, "-n 5x: must be an integer >= -1"},
        {"run -m %s -p hi -n ' 5'", 2, "must be an integer"},
        {"run -m %s -p hi --seed -1", 2, "--seed -1: must be an unsigned decimal"},
        {"run -m %s -p hi --seed 0x10", 2, "--seed 0x10: must be an unsigned decimal"},
        {"run -m %s -p hi --top-k 3.5", 2, "--top-k 3.5: must be an integer >= 0"},
        {"run -m %s -p hi --kv-recent 1", 2, "--kv-recent 1: must be a finite number in [0, 1)"},
        {"run -m %s -p hi --ctk q9", 2, "--ctk q9: must be one of f32 f16"},
        {"demo --turns abc", 2, "--turns abc: must be an integer in [1, 10000]"},
        {"demo --turns 3x", 2, "--turns 3x"},
        {"demo -c 64", 2, "unknown option '-c'"},
        {"inspect %s extra", 2, "unexpected argument 'extra'"},
        {"gen-model --arch llama --layers 2x --out /tmp/x", 2, "--layers 2x: must be an integer"},
        {"gen-model --arch llama --seed -1 --out /tmp/x", 2, "--seed -1"},
        {"run -m %s -p hi --prompt-ids 1,2", 2, "give the prompt once"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char args[1024];
        snprintf(args, sizeof args, cases[i].args, g_spm);
        snprintf(cmd, sizeof cmd, "%s %s", bin(), args);
        int rc = run_err(cmd, err, sizeof err);
        if (rc != cases[i].rc || !strstr(err, cases[i].msg))
            fail_msg("%s: exit %d (want %d), '%s' lacks '%s'", args, rc, cases[i].rc, err, cases[i].msg);
    }
    /* an empty prompt file is an error, not generation from BOS */
    const char *cmds[] = {"run -m %s -f %s -n 4", "tokenize -m %s -f %s", "perplexity -m %s -f %s"};
    for (size_t i = 0; i < 3; i++) {
        char args[1024];
        snprintf(args, sizeof args, cmds[i], g_spm, g_empty);
        snprintf(cmd, sizeof cmd, "%s %s", bin(), args);
        assert_int_equal(run_err(cmd, err, sizeof err), 1);
        if (!strstr(err, "the file is empty")) fail_msg("%s: '%s'", args, err);
    }
    /* values that parse */
    snprintf(cmd, sizeof cmd, "%s tokenize -m %s --prompt-ids '1, 403,407' --ids", bin(), g_spm);
    assert_int_equal(run(cmd, g_out, sizeof g_out, false), 0);
    assert_non_null(strstr(g_out, "[1, 403, 407]"));
    snprintf(cmd, sizeof cmd, "%s run -m %s -p hi -n 2 --temp 0.5 --seed 18446744073709551615 -t 1 -c 32",
             bin(), g_spm);
    assert_int_equal(run_err(cmd, err, sizeof err), 0);
}

/* Items 16, 17: bench's flags, help, exit codes and stderr; sampler messages. */
/* OpenBLAS's generic fallback on a CPU it does not know: keel restarts
 * itself with the kernels that use the CPU's SIMD (the bench header names
 * the core in force), never over a setting of the user's own, which only
 * gets the library's warning. Where OpenBLAS knows the CPU there is nothing
 * to restart (keel_blas_coretype_advice is NULL): said, and only the
 * user's setting is checked. */
static void test_blas_coretype_restart(void **state)
{
    (void)state;
    char cmd[2048], err[8192];
    const char *want = keel_blas_coretype_advice();
    snprintf(cmd, sizeof cmd, "env -u OPENBLAS_CORETYPE %s bench -m %s -p 8 -n 0 -r 1 --json", bin(), g_spm);
    assert_int_equal(run(cmd, g_out, sizeof g_out, false), 0);
    if (want) {
        char core[64];
        snprintf(core, sizeof core, "\"blas_core\": \"%s\"", want);
        if (!strstr(g_out, core)) fail_msg("no restart with OPENBLAS_CORETYPE=%s: %s", want, g_out);
    } else {
        print_message("OpenBLAS uses this CPU's SIMD (%s): no restart to check\n", keel_simd_name());
    }
    snprintf(cmd, sizeof cmd, "OPENBLAS_CORETYPE=Prescott %s bench -m %s -p 8 -n 0 -r 1 --json", bin(), g_spm);
    assert_int_equal(run_err(cmd, err, sizeof err), 0);
    assert_null(strstr(err, "OPENBLAS_CORETYPE=")); /* the user's choice: no advice */
    assert_int_equal(run(cmd, g_out, sizeof g_out, false), 0);
    assert_non_null(strstr(g_out, "\"blas_core\": \"Prescott\""));
}

static void test_bench_and_sampler_messages(void **state)
{
    (void)state;
    char cmd[4096], err[8192];
    snprintf(cmd, sizeof cmd, "%s bench -h", bin());
    assert_int_equal(run(cmd, g_out, sizeof g_out, false), 0);
    assert_non_null(strstr(g_out, "--gemm"));
    assert_non_null(strstr(g_out, "--quick"));
    assert_non_null(strstr(g_out, "--kv-compact"));
    snprintf(cmd, sizeof cmd, "%s bench kernels -h", bin());
    assert_int_equal(run(cmd, g_out, sizeof g_out, false), 0);
    const struct {
        const char *args;
        int rc;
        const char *msg;
    } cases[] = {
        {"bench kernels --bogus", 2, "bench kernels: unknown option '--bogus'"},
        {"bench kernels -t 0", 2, "bench kernels: -t 0: must be an integer in [1, 256]"},
        {"bench kernels -t", 2, "bench kernels: option -t needs a value"},
        {"bench kernels extra", 2, "bench kernels: unexpected argument 'extra'"},
        {"bench attention --kv q9", 2, "bench attention: --kv q9"},
        {"bench attention --ctx 10", 2, "bench attention: --ctx 10"},
        {"bench nosuch", 2, "unknown benchmark 'nosuch'"},
        {"bench", 2, "usage: keel bench"},
        {"bench -m /nonexistent.gguf", 1, "bench model: /nonexistent.gguf"},
        {"bench -m %s -p abc", 2, "bench model: -p abc: must be an integer in [0, 65536]"},
        {"bench -m %s -r 0", 2, "bench model: -r 0"},
        {"bench -m %s --kv-trigger 64", 2, "bench model: --kv-trigger needs --kv-compact"},
        {"bench -m %s --kv-compact bogus", 2, "bench model: --kv-compact bogus"},
        {"bench -m %s --ctk q9", 2, "bench model: --ctk q9"},
        {"run -m %s -p hi --temp nan", 2, "--temp nan: must be a finite number >= 0"},
        {"run -m %s -p hi --temp -1", 2, "--temp -1: must be a finite number >= 0"},
        {"run -m %s -p hi --top-p 2", 2, "--top-p 2: must be a finite number in [0, 1]"},
        {"run -m %s -p hi --repeat-penalty 0", 2, "--repeat-penalty 0: must be a finite number > 0"},
        {"run -m %s -p hi --presence-penalty inf", 2, "--presence-penalty inf: must be a finite number"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char args[1024];
        snprintf(args, sizeof args, cases[i].args, g_spm);
        /* stderr only: nothing of an error goes to stdout */
        snprintf(cmd, sizeof cmd, "%s %s 2>/dev/null", bin(), args);
        assert_int_equal(run(cmd, g_out, sizeof g_out, false), cases[i].rc);
        if (g_out_n) fail_msg("%s: wrote '%s' to stdout", args, g_out);
        snprintf(cmd, sizeof cmd, "%s %s", bin(), args);
        int rc = run_err(cmd, err, sizeof err);
        if (rc != cases[i].rc || !strstr(err, cases[i].msg))
            fail_msg("%s: exit %d (want %d), '%s' lacks '%s'", args, rc, cases[i].rc, err, cases[i].msg);
    }
}

/* Item 19: each command's -h lists the flags it accepts, others are refused;
 * inspect escapes control characters from the file. */
/* issue 11: keel run on the hybrid and recurrent fixtures with --prompt-ids,
 * --logits-out, --ids-out and the checkpoint flags; gen-model's new archs. */
static void test_run_hybrid_fixtures(void **state)
{
    (void)state;
    const char *models[] = {"qwen35", "qwen3next", "mamba2", "gpt-oss", "deepseek32", "gemma3", "phi3",
                            "qwen3moe", "glm4moe", "nemotronh", "lfm2", "deepseek2"};
    const int exact[] = {64, 64, 64, 20, 64, 64, 64, 64, 64, 64, 64, 64}; /* gpt-oss: docs/models.md, step 20 */
    const double tol[] = {1e-3, 1e-3, 1e-4, 4e-3, 2e-3, 1.2e-2, 1.5e-3, 1.2e-3, 1.5e-3, 5e-4, 3e-3, 2.3e-3}; /* as test_model.c */
    char cmd[16384], ids[4096], rel[128], m[1024];
    char idsout[] = "/tmp/keel_test_hids_XXXXXX", lgout[] = "/tmp/keel_test_hlg_XXXXXX";
    int fd1 = mkstemp(idsout), fd2 = mkstemp(lgout);
    assert_true(fd1 >= 0 && fd2 >= 0);
    for (int k = 0; k < (int)(sizeof models / sizeof models[0]); k++) {
        snprintf(rel, sizeof rel, "models/%s.gguf", models[k]);
        const char *mdl = test_fixture(rel);
        if (!mdl) break;
        snprintf(m, sizeof m, "%s", mdl);
        size_t n = 0;
        snprintf(rel, sizeof rel, "ref/%s.prompt.i32", models[k]);
        int32_t *prompt = test_read_file(test_fixture(rel), &n);
        snprintf(rel, sizeof rel, "ref/%s.greedy.i32", models[k]);
        int32_t *greedy = test_read_file(test_fixture(rel), &n);
        snprintf(rel, sizeof rel, "ref/%s.logits.f32", models[k]);
        float *ref = test_read_file(test_fixture(rel), &n);
        size_t kk = 0;
        for (int i = 0; i < 200; i++) kk += (size_t)snprintf(ids + kk, sizeof ids - kk, "%s%d", i ? "," : "", prompt[i]);
        snprintf(cmd, sizeof cmd,
                 "%s run -m %s -c 512 --prompt-ids %s -n 64 --temp 0 --ignore-eos --ids-out %s "
                 "--logits-out %s --ctx-checkpoints 4 --checkpoint-every 64",
                 bin(), m, ids, idsout, lgout);
        assert_int_equal(run(cmd, g_out, sizeof g_out, false), 0);
        size_t gn = 0, ln = 0;
        int32_t *got = test_read_file(idsout, &gn);
        float *lg = test_read_file(lgout, &ln);
        assert_int_equal(gn, 64 * sizeof(int32_t));
        assert_int_equal(ln, 200 * 512 * sizeof(float));
        assert_memory_equal(got, greedy, (size_t)exact[k] * sizeof(int32_t));
        double mx = 0.0;
        for (size_t i = 0; i < 200 * 512; i++) {
            double d = lg[i] > ref[i] ? lg[i] - ref[i] : ref[i] - lg[i];
            if (d > mx) mx = d;
        }
        if (!(mx <= tol[k])) fail_msg("%s: --logits-out differs from llama.cpp's by %.3g", models[k], mx);
        free(got);
        free(lg);
        free(prompt);
        free(greedy);
        free(ref);
    }
    close(fd1);
    close(fd2);
    unlink(idsout);
    unlink(lgout);
    /* the flags are checked */
    char err[8192];
    snprintf(cmd, sizeof cmd, "%s run -m %s -p x --ctx-checkpoints -2", bin(), g_spm);
    assert_int_equal(run_err(cmd, err, sizeof err), 2);
    assert_non_null(strstr(err, "--ctx-checkpoints -2"));
    snprintf(cmd, sizeof cmd, "%s run -m %s -p x --checkpoint-every x", bin(), g_spm);
    assert_int_equal(run_err(cmd, err, sizeof err), 2);
    /* gen-model writes the new architectures and run reads them */
    const char *archs[] = {"qwen35", "qwen3next", "mamba2", "gpt-oss", "deepseek32", "gemma3", "phi3",
                           "qwen3moe", "glm4moe", "nemotron_h", "lfm2", "deepseek2"};
    for (int k = 0; k < (int)(sizeof archs / sizeof archs[0]); k++) {
        char path[64] = "/tmp/keel_cli_hyb_XXXXXX";
        assert_int_equal(make_temp(path), 0);
        snprintf(cmd, sizeof cmd, "%s gen-model --arch %s --layers 4 --embd 64 --vocab 320 --out %s%s",
                 bin(), archs[k], path, strcmp(archs[k], "nemotron_h") == 0 ? " --layer-pattern '-M*M'" : "");
        assert_int_equal(run(cmd, g_out, sizeof g_out, false), 0);
        assert_non_null(strstr(g_out, archs[k]));
        snprintf(cmd, sizeof cmd, "%s run -m %s -p 'Once upon a time' -n 8 --temp 0 --checkpoint-every 2",
                 bin(), path);
        assert_int_equal(run(cmd, g_out, sizeof g_out, false), 0);
        /* no unused-tensor warning (glm4moe: its NextN layer is bound) */
        assert_int_equal(run_err(cmd, err, sizeof err), 0);
        if (strstr(err, "warning")) fail_msg("%s: %s", archs[k], err);
        /* inspect names each architecture's own shapes */
        static const char *const want[][2] = {{"recurrent    3 of 4 layers", NULL},
                                               {"recurrent    3 of 4 layers", "experts "},
                                               {"recurrent    4 of 4 layers", NULL},
                                               {"sliding ", "experts "},
                                               {"mla          q_lora", "indexer "},
                                               {"sliding      window 32 on 4 of 4 layers", "freq_scale 0.125"},
                                               {"n_rot 12, base 10000", NULL},
                                               {"experts      4, 2 used per token (ff 192, shared expert ff 0)",
                                                "n_rot 16"},
                                               /* 4 run layers of block_count 5 */
                                               {"shared expert ff 192", "n_layer      4"},
                                               {"recurrent    2 of 4 layers", "rope         none, n_rot 0"},
                                               {"recurrent    2 of 4 layers", "conv kernel 3"},
                                               {"mla          q_lora 32, kv_lora 32, attention scale 0.176777",
                                                "routing      sigmoid, experts chosen in the best 2 of 4 groups"}};
        snprintf(cmd, sizeof cmd, "%s inspect -m %s", bin(), path);
        assert_int_equal(run(cmd, g_out, sizeof g_out, false), 0);
        for (int w = 0; w < 2; w++)
            if (want[k][w] && !strstr(g_out, want[k][w])) fail_msg("%s inspect: no '%s' in\n%s", archs[k], want[k][w], g_out);
        unlink(path);
    }
    /* deepseek2 without q LoRA, softmax-gated, with YaRN: the attention
     * scale (1 + 0.1 mscale_all_dim ln factor)^2 / sqrt(32) =
     * (1 + 0.0707 ln 40)^2 / sqrt(32) = 0.281009 (arch_deepseek2.c) */
    char path[64] = "/tmp/keel_cli_ds2_XXXXXX";
    assert_int_equal(make_temp(path), 0);
    snprintf(cmd, sizeof cmd,
             "%s gen-model --arch deepseek2 --embd 64 --vocab 320 --q-lora -1 --gating 1 --yarn-factor 40 "
             "--yarn-log-mul 0.0707 --out %s && %s run -m %s -p 'Once upon a time' -n 8 --temp 0 && "
             "%s inspect -m %s",
             bin(), path, bin(), path, bin(), path);
    assert_int_equal(run(cmd, g_out, sizeof g_out, false), 0);
    static const char *const want_yarn[] = {"freq_scale 0.025 (yarn)", "routing      softmax",
                                            "mla          q_lora 0, kv_lora 32, attention scale 0.281009"};
    for (size_t w = 0; w < sizeof want_yarn / sizeof want_yarn[0]; w++)
        if (!strstr(g_out, want_yarn[w])) fail_msg("deepseek2 YaRN inspect: no '%s' in\n%s", want_yarn[w], g_out);
    unlink(path);
}

static void test_help_and_inspect_escapes(void **state)
{
    (void)state;
    char cmd[4096], err[8192];
    const struct {
        const char *cmd;
        const char *flags[18];
    } cases[] = {
        {"run", {"--swa-window", "--swa-period", "--swa-sinks", "--rot-k", "--rot-v", "--kv-seed",
                 "--kv-positions", "--kv-recent", "--ubatch-size", "--logits-out", "--ids-out",
                 "--frequency-penalty", "--tokenizer", "--prompt-ids", "--cache-type-v",
                 "--ctx-checkpoints", NULL}},
        {"perplexity", {"--kv-compact", "--kv-trigger", "--swa-window", "--rot-v", "--batch-size",
                        "--threads", "--file", NULL}},
        {"tokenize", {"--ids", "--prompt-ids", "--file", "--tokenizer", NULL}},
        {"inspect", {"--no-tensors", "--ctx-size", "--cache-type-k", "--swa-window", NULL}},
        {"demo", {"--turns", "--kv-trigger", "--kv-target", "--threads", "--seed", "--model", NULL}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(cmd, sizeof cmd, "%s %s -h", bin(), cases[i].cmd);
        assert_int_equal(run(cmd, g_out, sizeof g_out, false), 0);
        for (int k = 0; cases[i].flags[k]; k++)
            if (!strstr(g_out, cases[i].flags[k]))
                fail_msg("%s -h does not list %s:\n%s", cases[i].cmd, cases[i].flags[k], g_out);
    }
    /* a flag the help does not list is refused */
    snprintf(cmd, sizeof cmd, "%s tokenize -h", bin());
    assert_int_equal(run(cmd, g_out, sizeof g_out, false), 0);
    assert_null(strstr(g_out, "--temp"));
    snprintf(cmd, sizeof cmd, "%s inspect %s --temp 1", bin(), g_spm);
    assert_int_equal(run_err(cmd, err, sizeof err), 2);
    /* general.name with an ESC sequence and a bell: escaped */
    char path[64] = "/tmp/keel_cli_esc_XXXXXX";
    assert_int_equal(make_temp(path), 0);
    keel_gen_params gp = keel_gen_params_default();
    gp.arch = "llama";
    char e[256] = "";
    assert_ok(keel_gen_model(&gp, path, e));
    assert_true(test_patch_bytes(path, "keel-gen llama", "\x1b[2J\a\n-gen ll", 14));
    /* and a tensor name (output.weight is optional: the model then ties it) */
    assert_true(test_patch_bytes(path, "output.weight", "outp\x1bt.weight", 13));
    snprintf(cmd, sizeof cmd, "%s inspect %s", bin(), path);
    assert_int_equal(run(cmd, g_out, sizeof g_out, false), 0);
    assert_non_null(strstr(g_out, "name \\x1b[2J\\x07\\n-gen ll"));
    assert_non_null(strstr(g_out, "outp\\x1bt.weight"));
    assert_null(memchr(g_out, 0x1b, g_out_n));
    assert_null(memchr(g_out, 0x07, g_out_n));
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version_help),
        cmocka_unit_test(test_perplexity),
        cmocka_unit_test(test_run_greedy_ids),
        cmocka_unit_test(test_user_errors),
        cmocka_unit_test(test_demo),
        cmocka_unit_test(test_continuation_keeps_space),
        cmocka_unit_test(test_compaction_streams),
        cmocka_unit_test(test_write_errors),
        cmocka_unit_test(test_nonfinite_logits),
        cmocka_unit_test(test_strict_parsing),
        cmocka_unit_test(test_bench_and_sampler_messages),
        cmocka_unit_test(test_blas_coretype_restart),
        cmocka_unit_test(test_run_hybrid_fixtures),
        cmocka_unit_test(test_help_and_inspect_escapes),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
