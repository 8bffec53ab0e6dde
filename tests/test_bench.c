/*
 * test_bench.c — what `keel bench -m MODEL` reports, on a tiny generated
 * llama model (seconds, not a timing: values are checked, not speeds):
 * rows per depth (-d list, llama-bench's depth), the bytes read per decode
 * token (every matrix but the embedding table, plus one embedding row, plus
 * the K/V rows of the cells a step sees, averaged over the steps) recomputed
 * here from the model's shapes, FLOPs per prompt token, the references
 * (read bandwidth, FMA peak) present and positive, the SIMD level reported,
 * the decode profile's entries (every matrix product of a step, by role,
 * with its calls per token) and the errors of the new flags.
 */
#define _POSIX_C_SOURCE 200809L
#include "testutil.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* the tiny model's shapes (test-local copy of what is generated) */
enum { LAYERS = 2, EMBD = 128, HEADS = 4, KV_HEADS = 2, FF = 256, VOCAB = 320, HD = EMBD / HEADS };

static char g_path[128];

static int setup(void **state)
{
    (void)state;
    snprintf(g_path, sizeof g_path, "/tmp/keel_bench_%ld.gguf", (long)getpid());
    keel_gen_params p = keel_gen_params_default();
    p.arch = "llama";
    p.n_layer = LAYERS;
    p.n_embd = EMBD;
    p.n_head = HEADS;
    p.n_head_kv = KV_HEADS;
    p.n_ff = FF;
    p.n_vocab = VOCAB;
    p.dtype = KEEL_DTYPE_Q8_0;
    char err[256] = "";
    return keel_gen_model(&p, g_path, err) == KEEL_OK ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    unlink(g_path);
    return 0;
}

typedef struct sink {
    char *buf;
    size_t len, cap;
} sink;

static void sink_write(void *user, const char *text, size_t n)
{
    sink *s = user;
    if (s->len + n + 1 > s->cap) {
        s->cap = (s->len + n + 1) * 2;
        s->buf = realloc(s->buf, s->cap);
        assert_non_null(s->buf);
    }
    memcpy(s->buf + s->len, text, n);
    s->len += n;
    s->buf[s->len] = 0;
}

static keel_status run(sink *s, char *err, int argc, const char **argv)
{
    s->len = 0;
    if (s->buf) s->buf[0] = 0;
    return keel_bench_run("model", argc, (char **)argv, sink_write, s, err);
}

static double num(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_number(v)) fail_msg("key %s missing or not a number", key);
    return json_number_value(v);
}

static void test_depth_rows_bytes(void **state)
{
    (void)state;
    sink s = {0};
    char err[256] = "";
    const char *argv[] = {"-m", g_path, "-p", "8", "-n", "4", "-d", "0,16", "-r", "1", "-t", "2",
                          "--ctk", "q8_0", "--ctv", "f16", "--json", "--profile"};
    assert_ok(run(&s, err, (int)(sizeof argv / sizeof argv[0]), argv));
    json_error_t je;
    json_t *root = json_loads(s.buf, 0, &je);
    if (!root) fail_msg("bad JSON (%s) in: %s", je.text, s.buf);
    assert_true(num(root, "read_bw_gbps") > 0);
    assert_true(num(root, "fma_peak_gflops") > 0);
    assert_string_equal(json_string_value(json_object_get(root, "simd")), keel_simd_name());
    assert_string_equal(json_string_value(json_object_get(root, "type_k")), "q8_0");
    /* without -c the cache holds what the largest depth and test need, at least 256 cells */
    assert_int_equal((int)num(root, "n_ctx"), 256);

    /* bytes read per decode token, from the shapes: every matrix (q8_0:
     * 34 bytes per 32) but the embedding table, one embedding row, the
     * f32 norms; K/V rows of the cells seen */
    double q8 = 34.0 / 32.0;
    double QD = HEADS * (double)HD, KD = KV_HEADS * (double)HD;
    double layer = q8 * (EMBD * QD + 2 * EMBD * KD + QD * EMBD + 3.0 * EMBD * FF) + 4.0 * 2 * EMBD;
    double weights = LAYERS * layer + q8 * VOCAB * EMBD + 4.0 * EMBD + q8 * EMBD;
    /* a cell: q8_0 K rows (34 bytes per 32 dims) and f16 V rows, every KV head and layer */
    double cell = LAYERS * KV_HEADS * (34.0 * HD / 32 + 2.0 * HD);
    json_t *rows = json_object_get(root, "rows");
    assert_int_equal(json_array_size(rows), 4);
    const int depth[4] = {0, 0, 16, 16};
    for (size_t i = 0; i < 4; i++) {
        json_t *r = json_array_get(rows, i);
        bool tg = strcmp(json_string_value(json_object_get(r, "test")), "tg") == 0;
        assert_int_equal(tg, (int)(i % 2));
        assert_int_equal((int)num(r, "depth"), depth[i]);
        assert_true(num(r, "tps") > 0);
        assert_true(num(r, "tps_best") >= num(r, "tps") * 0.999);
        if (tg) {
            assert_close(num(r, "weight_bytes_per_token"), weights, 0.5);
            /* steps see d + 1 .. d + 4 cells: mean d + 2.5 */
            double kv = num(r, "kv_bytes_per_token");
            assert_close(kv, cell * (depth[i] + 2.5), 1e-6);
            assert_close(num(r, "bound_tps"), num(root, "read_bw_gbps") * 1e9 /
                                                 (num(r, "weight_bytes_per_token") + kv),
                         1e-3 * num(r, "bound_tps")); /* printed to 0.01 GB/s */
        } else {
            assert_true(num(r, "flops_per_token") > 2.0 * LAYERS * (EMBD * QD * 2 + 2 * EMBD * KD + 3.0 * EMBD * FF));
        }
    }
    /* the profile: per depth, every matrix product of a step by role */
    json_t *prof = json_object_get(root, "profile");
    assert_int_equal(json_array_size(prof), 2);
    for (size_t d = 0; d < 2; d++) {
        json_t *p = json_array_get(prof, d);
        assert_int_equal((int)num(p, "depth"), d ? 16 : 0);
        assert_true(num(p, "step_us") > 0);
        json_t *ents = json_object_get(p, "entries");
        double mv_calls = 0, attn_calls = 0;
        bool output = false;
        for (size_t i = 0; i < json_array_size(ents); i++) {
            json_t *e = json_array_get(ents, i);
            const char *kind = json_string_value(json_object_get(e, "kind"));
            if (strcmp(kind, "matvec") == 0) mv_calls += num(e, "calls_per_token");
            if (strcmp(kind, "attention") == 0) attn_calls += num(e, "calls_per_token");
            if (strstr(json_string_value(json_object_get(e, "role")), "output") &&
                strcmp(kind, "matvec") == 0 && num(e, "rows") == VOCAB)
                output = true;
        }
        assert_close(mv_calls, 7.0 * LAYERS + 1, 1e-9);
        assert_close(attn_calls, LAYERS, 1e-9);
        assert_true(output);
        json_t *pool = json_object_get(p, "pool");
        /* at least one job per product group: q/k/v, o, gate/up, down per layer, the output */
        assert_true(num(pool, "runs_per_token") + num(pool, "inline_runs_per_token") >= 4.0 * LAYERS + 1);
    }
    json_decref(root);
    free(s.buf);
}

/* -c: a cache larger than the test needs (a server's n_ctx) reads the
 * same bytes per token and says its size */
static void test_cache_size(void **state)
{
    (void)state;
    sink s = {0};
    char err[256] = "";
    const char *argv[] = {"-m", g_path, "-p", "0", "-n", "2", "-d", "16", "-r", "1", "-t", "2", "-c", "4096", "--json"};
    assert_ok(run(&s, err, (int)(sizeof argv / sizeof argv[0]), argv));
    json_error_t je;
    json_t *root = json_loads(s.buf, 0, &je);
    if (!root) fail_msg("bad JSON (%s) in: %s", je.text, s.buf);
    assert_int_equal((int)num(root, "n_ctx"), 4096);
    json_t *r = json_array_get(json_object_get(root, "rows"), 0);
    double cell = LAYERS * KV_HEADS * (2.0 * HD + 2.0 * HD); /* f16 K and V */
    assert_close(num(r, "kv_bytes_per_token"), cell * (16 + 1.5), 1e-6); /* steps see 17, 18 cells */
    json_decref(root);
    free(s.buf);
}

static void test_flag_errors(void **state)
{
    (void)state;
    sink s = {0};
    char err[256] = "";
    const char *a1[] = {"-m", g_path, "-d", "16,8"};
    assert_status(run(&s, err, 4, a1), KEEL_EINVAL);
    assert_non_null(strstr(err, "-d 16,8: must be 1 to 8 ascending"));
    const char *a2[] = {"-m", g_path, "-d", "x"};
    assert_status(run(&s, err, 4, a2), KEEL_EINVAL);
    const char *a3[] = {"-m", g_path, "--profile", "-n", "0"};
    assert_status(run(&s, err, 5, a3), KEEL_EINVAL);
    assert_non_null(strstr(err, "--profile"));
    const char *a4[] = {"-m", g_path, "-ub", "0"};
    assert_status(run(&s, err, 4, a4), KEEL_EINVAL);
    assert_non_null(strstr(err, "-ub 0"));
    /* a cache smaller than the depth and the test need */
    const char *a5[] = {"-m", g_path, "-p", "0", "-n", "128", "-d", "300", "-c", "299"}; /* needs 300 + 128 + 8 */
    assert_status(run(&s, err, 10, a5), KEEL_EINVAL);
    assert_non_null(strstr(err, "-c 299: must be an integer in [436,"));
    free(s.buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_depth_rows_bytes),
        cmocka_unit_test(test_cache_size),
        cmocka_unit_test(test_flag_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
