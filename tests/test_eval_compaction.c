/*
 * test_eval_compaction.c — `keel eval-compaction` end to end (build/keel via
 * KEEL_BIN): every bad option value is refused with exit 2 and a message
 * naming the flag and the value (no model needed: options are checked
 * first); a text shorter than one baseline chunk is refused instead of
 * printing a NaN table; the perplexity table's full baseline is
 * llama-perplexity's value; the retrieval task on stories260K: the
 * full-context baseline retrieves the needle far above the no-needle prior,
 * a window that lost the needle does not, and the same seed gives the same
 * numbers. Skips the model parts (with a note) when the fixtures are absent.
 */
#include "testutil.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char g_out[1 << 20];

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

/* Each bad value exits 2 and names the flag and the value; before the fix
 * --chunk 0/-1/2147483647 and the empty lists were accepted. */
static void test_refused_options(void **state)
{
    (void)state;
    static const struct {
        const char *args, *msg;
    } cases[] = {
        {"--chunk 0", "--chunk '0': not an integer in 1..4096"},
        {"--chunk -1", "--chunk '-1': not an integer in 1..4096"},
        {"--chunk 2147483647", "--chunk '2147483647': not an integer in 1..4096"},
        {"--chunk 16x", "--chunk '16x'"},
        {"--budgets ''", "--budgets '': empty list"},
        {"--budgets 64,,128", "--budgets '64,,128': empty or overlong entry"},
        {"--budgets 64,", "--budgets '64,': empty or overlong entry"},
        {"--budgets 7", "'7' is not an integer in 8..65536"},
        {"--budgets 64abc", "'64abc' is not an integer"},
        {"--budgets 9999999999", "'9999999999' is not an integer"},
        {"--budgets 8", "budget 8 (trigger 8, target 4, 4 sinks)"},
        {"--budgets 16 --kv-sinks 8", "budget 16 (trigger 16, target 8, 8 sinks)"},
        {"--policies ''", "--policies '': empty list"},
        {"--policies none", "unknown policy 'none'"},
        {"--policies window,frob", "unknown policy 'frob'"},
        {"--task frob", "--task 'frob': unknown task"},
        {"--docs 0", "--docs '0'"},
        {"--doc-tokens 31", "--doc-tokens '31'"},
        {"--doc-seed -1", "--doc-seed '-1': not an unsigned integer"},
        {"--calib-docs 0", "--calib-docs '0'"},
    };
    char cmd[2048];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        /* the options are checked before the model is opened */
        snprintf(cmd, sizeof cmd, "%s eval-compaction -m /nonexistent.gguf -f /nonexistent.txt %s", bin(),
                 cases[i].args);
        int rc = run(cmd, g_out, sizeof g_out, true);
        if (rc != 2 || !strstr(g_out, cases[i].msg))
            fail_msg("%s: exit %d, output '%s' (want 2 and '%s')", cases[i].args, rc, g_out, cases[i].msg);
    }
    snprintf(cmd, sizeof cmd, "%s eval-compaction -m /nonexistent.gguf", bin());
    assert_int_equal(run(cmd, g_out, sizeof g_out, true), 2);
    assert_non_null(strstr(g_out, "no text (-f TEXT)"));
}

/* A file of text (made for a test); returns its path (static). */
static const char *write_text(const char *text)
{
    static char path[] = "/tmp/keel_test_evc_XXXXXX";
    strcpy(path, "/tmp/keel_test_evc_XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    size_t n = strlen(text);
    assert_int_equal(write(fd, text, n), (ssize_t)n);
    assert_int_equal(close(fd), 0);
    return path;
}

/* Before the fix: a text shorter than one chunk printed a -nan table and exited 0. */
static void test_short_text(void **state)
{
    (void)state;
    const char *mdl = test_fixture("models/stories260K.gguf");
    if (!mdl) return;
    char m[1024], cmd[4096];
    snprintf(m, sizeof m, "%s", mdl);
    const char *txt = write_text("Once upon a time there was a dog. The dog liked to run.\n");
    snprintf(cmd, sizeof cmd, "%s eval-compaction -m %s -f %s --budgets 64 --policies window", bin(), m, txt);
    assert_int_equal(run(cmd, g_out, sizeof g_out, true), 2);
    assert_non_null(strstr(g_out, "needs at least one chunk of the trained context (128 tokens)"));
    assert_null(strstr(g_out, "nan"));
    /* the retrieval task needs sentences to build documents from */
    snprintf(cmd, sizeof cmd, "%s eval-compaction -m %s -f %s --task retrieval", bin(), m, txt);
    assert_int_equal(run(cmd, g_out, sizeof g_out, true), 2);
    assert_non_null(strstr(g_out, "only 2 usable sentences"));
    unlink(txt);
}

/* Texts the sentence splitter must survive: no terminator at all, one
 * sentence longer than the splitter's limit, only quotes and terminators,
 * every sentence mentioning a needle, NUL and invalid UTF-8 bytes. */
static void test_odd_texts(void **state)
{
    (void)state;
    const char *mdl = test_fixture("models/stories260K.gguf");
    if (!mdl) return;
    char m[1024], cmd[4096];
    snprintf(m, sizeof m, "%s", mdl);
    static char text[8192];
    for (int k = 0; k < 5; k++) {
        size_t n = 0;
        if (k == 0)
            for (; n < 3000; n++) text[n] = "once upon a time "[n % 17];
        if (k == 1) {
            for (; n < 2000; n++) text[n] = "The long day "[n % 13];
            text[n++] = '.';
        }
        if (k == 2)
            for (; n < 3000; n++) text[n] = ".!?\"' \n"[n % 7];
        if (k == 3)
            for (int i = 0; i < 40; i++) n += (size_t)snprintf(text + n, sizeof text - n, "The cat named Tom ran. Spot ran. ");
        if (k == 4)
            for (int i = 0; i < 40; i++) n += (size_t)snprintf(text + n, sizeof text - n, "A \xff\xfe b\x80. \n\n");
        char path[] = "/tmp/keel_test_evc_odd_XXXXXX";
        int fd = mkstemp(path);
        assert_true(fd >= 0);
        if (k == 4) text[3] = 0; /* a NUL inside the first sentence */
        assert_int_equal(write(fd, text, n), (ssize_t)n);
        assert_int_equal(close(fd), 0);
        snprintf(cmd, sizeof cmd, "%s eval-compaction -m %s -f %s --task retrieval --docs 1 --calib-docs 1 "
                 "--budgets 64 --policies window", bin(), m, path);
        int rc = run(cmd, g_out, sizeof g_out, true);
        printf("odd text %d: exit %d\n", k, rc);
        if (k < 4) {
            /* nothing usable: refused with the count */
            assert_int_equal(rc, 2);
            assert_non_null(strstr(g_out, "usable sentences"));
        } else {
            /* 40 short sentences of odd bytes: a document can be built; no crash */
            assert_true(rc == 0 || rc == 1);
        }
        unlink(path);
    }
}

static void test_perplexity_table(void **state)
{
    (void)state;
    const char *mdl = test_fixture("models/stories260K.gguf");
    if (!mdl) return;
    char m[1024], txt[1024], cmd[4096];
    snprintf(m, sizeof m, "%s", mdl);
    snprintf(txt, sizeof txt, "%s", test_fixture("text/stories.txt"));
    snprintf(cmd, sizeof cmd, "%s eval-compaction -m %s -f %s --budgets 64 --policies window --json", bin(), m, txt);
    assert_int_equal(run(cmd, g_out, sizeof g_out, false), 0);
    json_error_t je;
    json_t *a = json_loads(g_out, 0, &je);
    if (!a) fail_msg("not JSON (%s): %s", je.text, g_out);
    /* full, sliding keep/renumber, window keep/renumber */
    assert_int_equal(json_array_size(a), 5);
    double full = json_real_value(json_object_get(json_array_get(a, 0), "ppl"));
    assert_close(full, 5.1825, 0.005); /* llama-perplexity on the same text, -c 128 */
    double keep = json_real_value(json_object_get(json_array_get(a, 3), "ppl"));
    double renum = json_real_value(json_object_get(json_array_get(a, 4), "ppl"));
    assert_string_equal(json_string_value(json_object_get(json_array_get(a, 4), "positions")), "renumber");
    /* docs/compaction.md: keeping positions past the trained context collapses */
    assert_true(isfinite(keep) && isfinite(renum));
    assert_true(renum < 1.2 * full);
    assert_true(keep > 4.0 * full);
    assert_true(json_integer_value(json_object_get(json_array_get(a, 4), "compactions")) > 100);
    json_decref(a);
}

static json_t *row(json_t *rows, const char *policy, int budget)
{
    for (size_t i = 0; i < json_array_size(rows); i++) {
        json_t *r = json_array_get(rows, i);
        json_t *b = json_object_get(r, "budget");
        if (strcmp(json_string_value(json_object_get(r, "policy")), policy) == 0 &&
            (budget ? json_integer_value(b) == budget : json_is_null(b)))
            return r;
    }
    fail_msg("no row %s %d", policy, budget);
    return NULL;
}

static double num(json_t *r, const char *k)
{
    json_t *v = json_object_get(r, k);
    assert_non_null(v);
    return json_number_value(v);
}

static void test_retrieval(void **state)
{
    (void)state;
    const char *mdl = test_fixture("models/stories260K.gguf");
    if (!mdl) return;
    char m[1024], txt[1024], cmd[4096];
    static char first[sizeof g_out];
    snprintf(m, sizeof m, "%s", mdl);
    snprintf(txt, sizeof txt, "%s", test_fixture("text/stories.txt"));
    snprintf(cmd, sizeof cmd,
             "%s eval-compaction -m %s -f %s --task retrieval --docs 8 --doc-tokens 200 --calib-docs 4 "
             "--budgets 64 --policies window,keydiff --json",
             bin(), m, txt);
    assert_int_equal(run(cmd, g_out, sizeof g_out, false), 0);
    memcpy(first, g_out, sizeof first);
    json_error_t je;
    json_t *doc = json_loads(g_out, 0, &je);
    if (!doc) fail_msg("not JSON (%s): %s", je.text, g_out);
    assert_int_equal(json_integer_value(json_object_get(doc, "n_ctx_train")), 128);
    json_t *rows = json_object_get(doc, "rows");
    assert_int_equal(json_array_size(rows), 5);
    json_t *full = row(rows, "full", 0), *prior = row(rows, "prior", 0), *win = row(rows, "window", 64);
    json_t *kd = row(rows, "keydiff", 64), *unc = row(rows, "uncompacted", 0);
    printf("retrieval: full %.3f (top-1 %.3f), prior %.3f, window %.3f, keydiff %.3f\n", num(full, "logp"),
           num(full, "top1"), num(prior, "logp"), num(win, "logp"), num(kd, "logp"));
    /* the full-context baseline retrieves the needle; without it the model guesses */
    assert_int_equal(num(full, "docs"), 8);
    assert_true(num(full, "mean_doc_tokens") <= 128);
    assert_true(num(full, "top1") >= 0.7);
    assert_true(num(full, "retrieved") >= 0.25);
    assert_true(num(full, "logp") > num(prior, "logp") + 0.7);
    assert_true(num(prior, "retrieved") <= 0.125);
    /* the documents run past the budget: every compacted document compacts
     * several times, and a window of 64 has lost the needle */
    assert_true(num(unc, "mean_doc_tokens") > 180);
    assert_true(num(win, "compactions_per_doc") >= 3);
    assert_true(num(kd, "compactions_per_doc") == num(win, "compactions_per_doc"));
    assert_true(num(win, "logp") < num(full, "logp") - 0.5);
    assert_true(num(win, "retrieved") <= 0.125);
    /* every needle used was measured retrievable */
    json_t *needles = json_object_get(doc, "needles");
    int kept = 0;
    for (size_t i = 0; i < json_array_size(needles); i++) {
        json_t *nd = json_array_get(needles, i);
        if (!json_is_true(json_object_get(nd, "kept"))) continue;
        kept++;
        assert_true(num(nd, "full_top1") >= 0.7);
        assert_true(num(nd, "full_logp") >= num(nd, "prior_logp") + 1.0);
    }
    assert_true(kept >= 1);
    json_decref(doc);
    /* deterministic: the same seed gives the same documents and numbers,
     * another seed others (a smaller run) */
    snprintf(cmd, sizeof cmd,
             "%s eval-compaction -m %s -f %s --task retrieval --docs 3 --doc-tokens 200 --calib-docs 1 "
             "--budgets 64 --policies keydiff --json",
             bin(), m, txt);
    assert_int_equal(run(cmd, g_out, sizeof g_out, false), 0);
    memcpy(first, g_out, sizeof first);
    assert_int_equal(run(cmd, g_out, sizeof g_out, false), 0);
    assert_string_equal(g_out, first);
    strcat(cmd, " --doc-seed 99");
    assert_int_equal(run(cmd, g_out, sizeof g_out, false), 0);
    assert_true(strcmp(g_out, first) != 0);
    assert_non_null(strstr(g_out, "\"doc_seed\": 99"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refused_options),
        cmocka_unit_test(test_short_text),
        cmocka_unit_test(test_odd_texts),
        cmocka_unit_test(test_perplexity_table),
        cmocka_unit_test(test_retrieval),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
