/*
 * test_tensor_simd.c — the process-wide kernel path: KEEL_SIMD read once at
 * the first kernel query (this process sets it to "scalar" before any keel
 * call), keel_set_simd / keel_simd_name (names, errors, the path in force
 * left unchanged by a refused request), tensor_simd_force clamping to the
 * CPU's best, attention following the level (attn_path_active), results of
 * a matvec identical whichever way a level is chosen, and the CLI's --simd
 * and KEEL_SIMD checks (build/keel via KEEL_BIN).
 */
#define _POSIX_C_SOURCE 200809L
#include "testutil.h"
#include "memory/attn_kernels.h"
#include "tensor/tensor.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

static const char *const k_names[] = {"scalar", "avx2", "avx512"};

static void test_env_read_once(void **state)
{
    (void)state;
    /* main() set KEEL_SIMD=scalar before the first query */
    assert_int_equal(tensor_simd_level(), TENSOR_SIMD_SCALAR);
    assert_string_equal(keel_simd_name(), "scalar");
    assert_false(tensor_simd_active());
    assert_int_equal(attn_path_active(), ATTN_PATH_SCALAR);
    /* read once: a later change of the environment is not seen */
    setenv("KEEL_SIMD", "avx2", 1);
    tensor_set_simd(true); /* back to the default: the environment's, as read */
    assert_int_equal(tensor_simd_level(), TENSOR_SIMD_SCALAR);
}

static void test_set_simd_names(void **state)
{
    (void)state;
    tensor_simd best = tensor_simd_best();
    for (int l = 0; l <= 2; l++) {
        keel_status want = l <= (int)best ? KEEL_OK : KEEL_EUNSUPPORTED;
        assert_ok(keel_set_simd("scalar"));
        assert_status(keel_set_simd(k_names[l]), want);
        assert_string_equal(keel_simd_name(), want == KEEL_OK ? k_names[l] : "scalar");
        assert_int_equal(attn_path_active(), want == KEEL_OK ? (attn_path)l : ATTN_PATH_SCALAR);
        assert_int_equal(tensor_simd_active(), want == KEEL_OK && l > 0);
    }
    /* case-insensitive; auto, "" and NULL: the best */
    assert_ok(keel_set_simd("SCALAR"));
    assert_int_equal(tensor_simd_level(), TENSOR_SIMD_SCALAR);
    assert_ok(keel_set_simd("auto"));
    assert_int_equal(tensor_simd_level(), best);
    assert_ok(keel_set_simd("scalar"));
    assert_ok(keel_set_simd(""));
    assert_int_equal(tensor_simd_level(), best);
    assert_ok(keel_set_simd("scalar"));
    assert_ok(keel_set_simd(NULL));
    assert_int_equal(tensor_simd_level(), best);
    /* unknown names are refused and change nothing */
    assert_ok(keel_set_simd("scalar"));
    assert_status(keel_set_simd("sse2"), KEEL_EINVAL);
    assert_status(keel_set_simd("avx2 "), KEEL_EINVAL);
    assert_int_equal(tensor_simd_level(), TENSOR_SIMD_SCALAR);
    /* tensor_simd_force clamps to the best and returns the level before */
    assert_int_equal(tensor_simd_force(TENSOR_SIMD_AVX512), TENSOR_SIMD_SCALAR);
    assert_int_equal(tensor_simd_level(), best);
    assert_int_equal(tensor_simd_force(TENSOR_SIMD_SCALAR), best);
    tensor_simd parsed;
    assert_true(tensor_simd_from_name("Avx512", &parsed));
    assert_int_equal(parsed, TENSOR_SIMD_AVX512);
    assert_false(tensor_simd_from_name("avx", &parsed));
    assert_false(tensor_simd_from_name(NULL, &parsed));
}

/* The same product under a level chosen by keel_set_simd and by
 * tensor_simd_force gives the same bytes (one dispatch decision). */
static void test_level_is_process_wide(void **state)
{
    (void)state;
    enum { ROWS = 40, COLS = 256 };
    size_t rb = tensor_row_bytes(KEEL_DTYPE_Q8_0, COLS);
    uint8_t *W = malloc(ROWS * rb);
    float x[COLS], w[COLS], y1[ROWS], y2[ROWS], ys[ROWS];
    for (int r = 0; r < ROWS; r++) {
        test_fill_normal(w, COLS, 10 + (uint64_t)r);
        assert_ok(tensor_quantize_row(KEEL_DTYPE_Q8_0, w, W + (size_t)r * rb, COLS));
    }
    test_fill_normal(x, COLS, 3);
    base_arena arena;
    assert_ok(base_arena_init(&arena, 1 << 14));
    for (int l = 0; l <= (int)tensor_simd_best(); l++) {
        assert_ok(keel_set_simd(k_names[l]));
        assert_ok(tensor_matvec(KEEL_DTYPE_Q8_0, W, ROWS, COLS, x, y1, NULL, &arena));
        tensor_simd_force(TENSOR_SIMD_SCALAR);
        assert_ok(tensor_matvec(KEEL_DTYPE_Q8_0, W, ROWS, COLS, x, ys, NULL, &arena));
        tensor_simd_force((tensor_simd)l);
        assert_ok(tensor_matvec(KEEL_DTYPE_Q8_0, W, ROWS, COLS, x, y2, NULL, &arena));
        assert_memory_equal(y1, y2, sizeof y1);
        for (int r = 0; r < ROWS; r++)
            assert_close(y1[r], ys[r], 1e-4 * (1.0 + fabsf(ys[r])));
    }
    base_arena_free(&arena);
    free(W);
}

static int run_err(const char *cmd, char *buf, size_t cap)
{
    char full[1024];
    snprintf(full, sizeof full, "%s 2>&1 >/dev/null", cmd);
    FILE *p = popen(full, "r");
    assert_non_null(p);
    size_t n = fread(buf, 1, cap - 1, p);
    buf[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_cli_simd(void **state)
{
    (void)state;
    const char *bin = getenv("KEEL_BIN");
    if (!bin || !*bin) {
        printf("KEEL_BIN not set: CLI checks skipped\n");
        return;
    }
    unsetenv("KEEL_SIMD");
    char cmd[512], out[4096];
    snprintf(cmd, sizeof cmd, "%s bench kernels --simd sse9", bin);
    assert_int_equal(run_err(cmd, out, sizeof out), 2);
    assert_non_null(strstr(out, "--simd sse9: must be one of scalar avx2 avx512 auto"));
    snprintf(cmd, sizeof cmd, "%s bench kernels --simd", bin);
    assert_int_equal(run_err(cmd, out, sizeof out), 2);
    assert_non_null(strstr(out, "--simd needs a value"));
    snprintf(cmd, sizeof cmd, "KEEL_SIMD=bogus %s run -m none.gguf -p hi", bin);
    assert_int_equal(run_err(cmd, out, sizeof out), 2);
    assert_non_null(strstr(out, "KEEL_SIMD=bogus: must be one of"));
    snprintf(cmd, sizeof cmd, "%s run --simd avx3 -m none.gguf", bin);
    assert_int_equal(run_err(cmd, out, sizeof out), 2);
    assert_non_null(strstr(out, "--simd avx3"));
    if (tensor_simd_best() < TENSOR_SIMD_AVX512) {
        snprintf(cmd, sizeof cmd, "%s perplexity --simd avx512 -m none.gguf", bin);
        assert_int_equal(run_err(cmd, out, sizeof out), 2);
        assert_non_null(strstr(out, "this CPU cannot run that path"));
    }
    /* a good --simd gets as far as the model (which is missing) */
    snprintf(cmd, sizeof cmd, "%s run --simd scalar -m /nonexistent/none.gguf -p hi", bin);
    assert_int_equal(run_err(cmd, out, sizeof out), 1);
    assert_non_null(strstr(out, "none.gguf"));
}

int main(void)
{
    setenv("KEEL_SIMD", "scalar", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_env_read_once),
        cmocka_unit_test(test_set_simd_names),
        cmocka_unit_test(test_level_is_process_wide),
        cmocka_unit_test(test_cli_simd),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
