/*
 * test_session_cli.c — `keel run --session-save / --session-load` end to
 * end (build/keel via KEEL_BIN): a run split in two with a save in between
 * prints exactly the tokens (ids and text) of one run of the whole length,
 * on a generated SPM model and on a generated BPE one (and stories260K when
 * the fixtures are present); -p MORE continues the saved text; truncated,
 * corrupted and foreign files make run exit non-zero with the reason; other
 * cache types need --session-convert.
 */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *bin(void)
{
    const char *b = getenv("KEEL_BIN");
    return b && *b ? b : "./keel";
}

static int run(const char *cmd, char *out, size_t cap)
{
    char full[8192];
    snprintf(full, sizeof full, "%s 2>&1", cmd);
    FILE *p = popen(full, "r");
    assert_non_null(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static char g_dir[64];

static int setup(void **state)
{
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/keel_sesscli_XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static size_t read_all(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    size_t n = fread(buf, 1, cap, f);
    fclose(f);
    return n;
}

static char g_out[1 << 16], g_a[1 << 16], g_b[1 << 16], g_all[1 << 16];

/* stdout of a run is the continuation and one newline */
static size_t run_text(const char *cmd, char *buf, size_t cap)
{
    char full[8192];
    snprintf(full, sizeof full, "%s 2>/dev/null", cmd);
    FILE *p = popen(full, "r");
    assert_non_null(p);
    size_t n = fread(buf, 1, cap - 1, p);
    buf[n] = 0;
    assert_int_equal(pclose(p), 0);
    assert_true(n > 0 && buf[n - 1] == '\n');
    return n - 1;
}

static void split_equals_whole(const char *model, const char *prompt)
{
    char cmd[4096], s[512], ia[512], ib[512], iall[512];
    snprintf(s, sizeof s, "%s/s.sess", g_dir);
    snprintf(ia, sizeof ia, "%s/a.ids", g_dir);
    snprintf(ib, sizeof ib, "%s/b.ids", g_dir);
    snprintf(iall, sizeof iall, "%s/all.ids", g_dir);
    snprintf(cmd, sizeof cmd, "%s run -m '%s' -p '%s' -n 40 --temp 0 --ignore-eos --ids-out '%s'", bin(), model, prompt, iall);
    size_t nall = run_text(cmd, g_all, sizeof g_all);
    snprintf(cmd, sizeof cmd, "%s run -m '%s' -p '%s' -n 20 --temp 0 --ignore-eos --session-save '%s' --ids-out '%s'", bin(),
             model, prompt, s, ia);
    size_t na = run_text(cmd, g_a, sizeof g_a);
    snprintf(cmd, sizeof cmd, "%s run -m '%s' --session-load '%s' -n 20 --temp 0 --ignore-eos --ids-out '%s'", bin(), model,
             s, ib);
    size_t nb = run_text(cmd, g_b, sizeof g_b);
    assert_int_equal(na + nb, nall);
    assert_memory_equal(g_a, g_all, na);
    assert_memory_equal(g_b, g_all + na, nb);
    static char x[4096], y[4096], z[4096];
    size_t xa = read_all(ia, x, sizeof x), xb = read_all(ib, y, sizeof y), xall = read_all(iall, z, sizeof z);
    assert_int_equal(xa, 80);
    assert_int_equal(xb, 80);
    assert_int_equal(xall, 160);
    assert_memory_equal(x, z, 80);
    assert_memory_equal(y, z + 80, 80);
}

static void gen(const char *arch, const char *path)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s gen-model --arch %s --out '%s'", bin(), arch, path);
    assert_int_equal(run(cmd, g_out, sizeof g_out), 0);
}

static void test_split_runs(void **state)
{
    (void)state;
    char m1[512], m2[512];
    snprintf(m1, sizeof m1, "%s/llama.gguf", g_dir);
    snprintf(m2, sizeof m2, "%s/qwen2.gguf", g_dir);
    gen("llama", m1); /* SPM */
    gen("qwen2", m2); /* BPE */
    split_equals_whole(m1, "The little dog ran to the park and");
    split_equals_whole(m2, "The little dog ran to the park and");
    const char *fx = test_fixture("models/stories260K.gguf");
    if (fx) split_equals_whole(fx, "Tom and his dog went to the");
}

static void test_more_and_bad_files(void **state)
{
    (void)state;
    char m1[512], m2[512], s[512], t[512], cmd[4096];
    snprintf(m1, sizeof m1, "%s/llama.gguf", g_dir);
    snprintf(m2, sizeof m2, "%s/qwen2.gguf", g_dir);
    snprintf(s, sizeof s, "%s/m.sess", g_dir);
    snprintf(t, sizeof t, "%s/bad.sess", g_dir);
    gen("llama", m1);
    gen("qwen2", m2);
    snprintf(cmd, sizeof cmd, "%s run -m '%s' -p 'Once upon a time' -n 8 --temp 0 --session-save '%s'", bin(), m1, s);
    assert_int_equal(run(cmd, g_out, sizeof g_out), 0);
    /* -p MORE: the pending token and the new text are decoded, then it generates */
    snprintf(cmd, sizeof cmd, "%s run -m '%s' --session-load '%s' -p ' and then' -n 6 --temp 0", bin(), m1, s);
    assert_int_equal(run(cmd, g_out, sizeof g_out), 0);
    assert_non_null(strstr(g_out, "generated 6 tokens"));
    /* truncated, corrupted, foreign */
    static char blob[1 << 20];
    size_t n = read_all(s, blob, sizeof blob);
    assert_true(n > 200);
    FILE *f = fopen(t, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(blob, 1, n / 2, f), n / 2);
    assert_int_equal(fclose(f), 0);
    snprintf(cmd, sizeof cmd, "%s run -m '%s' --session-load '%s' -n 4", bin(), m1, t);
    assert_int_equal(run(cmd, g_out, sizeof g_out), 1);
    assert_non_null(strstr(g_out, "truncated"));
    blob[n / 3] ^= 0x10;
    f = fopen(t, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(blob, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
    snprintf(cmd, sizeof cmd, "%s run -m '%s' --session-load '%s' -n 4", bin(), m1, t);
    assert_int_equal(run(cmd, g_out, sizeof g_out), 1);
    assert_non_null(strstr(g_out, "corrupted"));
    snprintf(cmd, sizeof cmd, "%s run -m '%s' --session-load '%s' -n 4", bin(), m2, s);
    assert_int_equal(run(cmd, g_out, sizeof g_out), 1);
    assert_non_null(strstr(g_out, "another model"));
    /* other cache types: refused, then converted on request */
    snprintf(cmd, sizeof cmd, "%s run -m '%s' --session-load '%s' -n 4 --ctk q8_0", bin(), m1, s);
    assert_int_equal(run(cmd, g_out, sizeof g_out), 1);
    assert_non_null(strstr(g_out, "--session-convert"));
    snprintf(cmd, sizeof cmd, "%s run -m '%s' --session-load '%s' -n 4 --ctk q8_0 --session-convert", bin(), m1, s);
    assert_int_equal(run(cmd, g_out, sizeof g_out), 0);
    snprintf(cmd, sizeof cmd, "%s run -m '%s' --session-load '%s/none.sess' -n 4", bin(), m1, g_dir);
    assert_int_equal(run(cmd, g_out, sizeof g_out), 1);
    assert_non_null(strstr(g_out, "No such file"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_runs),
        cmocka_unit_test(test_more_and_bad_files),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
