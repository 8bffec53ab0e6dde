/*
 * test_bench.c — what `keel bench -m MODEL` reports, on a tiny generated
 * llama model (seconds, not a timing: values are checked, not speeds):
 * rows per depth (-d list, llama-bench's depth), the bytes read per decode
 * token (every matrix but the embedding table, plus one embedding row, plus
 * the K/V rows of the cells a step sees, averaged over the steps) recomputed
 * here from the model's shapes, FLOPs per prompt token, the references
 * (read bandwidth, FMA peak) present and positive, the SIMD level reported,
 * the decode profile's entries (every matrix product of a step, by role,
 * with its calls per token) and the errors of the new flags; and what
 * `keel bench attention` reports beside its speeds: the multiply bound from
 * the FMA peak of the same run and the multiply count of the step; and
 * the verify costs `keel bench spec` measures before its curve (c(k) for
 * k = 1, 2, 4 and -k, each its batch's time over a plain step's, by CPU
 * time with one thread).
 */
#define _POSIX_C_SOURCE 200809L
#include "testutil.h"
#include "bench/bench.h"

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
            /* the bandwidth printed to 0.01 GB/s (0.005 of rounding, 0.1% of
             * the 5 GB/s a sanitizer build under load can read), the bound
             * to 0.01 tok/s */
            double bw = num(root, "read_bw_gbps"), want = bw * 1e9 / (num(r, "weight_bytes_per_token") + kv);
            assert_close(num(r, "bound_tps"), want, want * (0.005 / bw + 1e-6) + 0.005);
        } else {
            assert_true(num(r, "flops_per_token") > 2.0 * LAYERS * (EMBD * QD * 2 + 2 * EMBD * KD + 3.0 * EMBD * FF));
        }
    }
    /* the profile: per depth, the prompt's kernels (per token) and every
     * matrix product of a decode step by role */
    json_t *prof = json_object_get(root, "profile");
    assert_int_equal(json_array_size(prof), 4);
    for (size_t d = 0; d < 2; d++) {
        json_t *p = json_array_get(prof, 2 * d);
        assert_string_equal(json_string_value(json_object_get(p, "test")), "pp");
        assert_int_equal((int)num(p, "depth"), d ? 16 : 0);
        assert_int_equal((int)num(p, "tokens"), 8);
        json_t *ents = json_object_get(p, "entries");
        double attn_calls = 0, known_us = 0;
        for (size_t i = 0; i < json_array_size(ents); i++) {
            json_t *e = json_array_get(ents, i);
            if (strcmp(json_string_value(json_object_get(e, "kind")), "attention") == 0) {
                attn_calls += num(e, "calls_per_token");
                assert_int_equal((int)num(e, "rows"), 8); /* one call per layer for the 8-token batch */
            }
            known_us += num(e, "us_per_token");
        }
        assert_close(attn_calls, LAYERS / 8.0, 1e-9);
        assert_true(known_us > 0 && known_us <= num(p, "step_us") * 1.01);
    }
    for (size_t d = 0; d < 2; d++) {
        json_t *p = json_array_get(prof, 2 * d + 1);
        assert_string_equal(json_string_value(json_object_get(p, "test")), "tg");
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
    const char *a3[] = {"-m", g_path, "--profile", "-n", "0", "-p", "0"};
    assert_status(run(&s, err, 7, a3), KEEL_EINVAL);
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

/* the multiply model: per cell and KV head, scores plus p.V */
static void test_attn_muls(void **state)
{
    (void)state;
    /* AVX2: int8 dots 2 per 32 bytes (4 rows x 4 blocks x 2) + 4 x 128 / 8 FMAs */
    assert_close(bench_attn_muls(1, KEEL_DTYPE_Q8_0, 4, 128, 128), 32.0 + 64.0, 1e-12);
    assert_close(bench_attn_muls(1, KEEL_DTYPE_Q4_0, 3, 64, 64), 12.0 + 24.0, 1e-12);
    assert_close(bench_attn_muls(1, KEEL_DTYPE_F16, 4, 128, 128), 64.0 + 64.0, 1e-12);
    /* AVX-512: one vpdpbusd per 64 bytes; q8_0 p . V one vpdpwssd per 16
     * columns and pair of cells, other dtypes 16-lane FMAs */
    assert_close(bench_attn_muls(2, KEEL_DTYPE_Q8_0, 4, 128, 128), 8.0 + 16.0, 1e-12);
    assert_close(bench_attn_muls(2, KEEL_DTYPE_Q4_0, 4, 128, 128), 8.0 + 32.0, 1e-12);
    assert_close(bench_attn_muls(2, KEEL_DTYPE_F32, 8, 128, 128), 64.0 + 64.0, 1e-12);
    /* scalar: one per value */
    assert_close(bench_attn_muls(0, KEEL_DTYPE_Q4_0, 4, 128, 64), 512.0 + 256.0, 1e-12);
}

/* How far a printed multiply bound may sit from the one the test derives
 * from the printed FMA peak pk: the bound is printed to 0.01 (0.005 of
 * rounding) and the peak to 0.1 (0.05 of rounding, which moves want by
 * 0.05 / pk of itself: 1% at the 5 GFLOP/s a sanitizer build can measure),
 * plus float slack. */
static double mul_bound_tol(double want, double pk)
{
    return 0.005 + (0.05 / pk + 1e-3) * want;
}

/* Each flag / value pair makes bench attention fail with EINVAL and a
 * message that names the value. */
static void assert_attention_rejects(const char *const (*bad)[2], size_t n)
{
    sink s = {0};
    char err[256];
    for (size_t i = 0; i < n; i++) {
        s.len = 0;
        err[0] = 0;
        assert_status(keel_bench_run("attention", 2, (char **)bad[i], sink_write, &s, err), KEEL_EINVAL);
        assert_non_null(strstr(err, bad[i][1]));
    }
    free(s.buf);
}

/* bench attention --json: every decode row carries its multiply bound,
 * which follows from the run's FMA peak for that thread count, the SIMD
 * level it reports and the K and V bytes of a cell and KV head (q4_0, 128
 * dims: 72 + 72) */
static void test_attention_bound(void **state)
{
    (void)state;
    sink s = {0};
    char err[256] = "";
    const char *argv[] = {"--ctx", "64", "--kv", "q4_0", "--quick", "--json"};
    s.len = 0;
    assert_ok(keel_bench_run("attention", 6, (char **)argv, sink_write, &s, err));
    json_error_t je;
    json_t *root = json_loads(s.buf, 0, &je);
    if (!root) fail_msg("bad JSON (%s) in: %s", je.text, s.buf);
    const char *simd = json_string_value(json_object_get(root, "simd"));
    assert_non_null(simd);
    int level = strcmp(simd, "avx512") == 0 ? 2 : strcmp(simd, "avx2") == 0 ? 1 : 0;
    double lanes = level == 2 ? 16.0 : level == 1 ? 8.0 : 1.0;
    json_t *peak = json_object_get(root, "fma_peak_gflops");
    json_t *dec = json_object_get(root, "decode");
    assert_int_equal((int)json_array_size(dec), 4); /* rotation off / on x 1 / 2 threads */
    for (size_t i = 0; i < json_array_size(dec); i++) {
        json_t *e = json_array_get(dec, i);
        char key[2] = {(char)('0' + (int)num(e, "threads")), 0};
        double pk = num(peak, key);
        assert_true(pk > 0.0);
        double want = pk / (2.0 * lanes) / bench_attn_muls(level, KEEL_DTYPE_Q4_0, 4, 128, 128) * 144.0;
        assert_close(num(e, "mul_bound_gbps"), want, mul_bound_tol(want, pk));
        assert_true(num(e, "gbps") > 0.0);
    }
    json_decref(root);
    free(s.buf);
}

/* --shape: another model's attention (2 layers, 2 KV heads, 6 query heads,
 * 64 dims): the rows' GB/s are that shape's K and V bytes (q8_0: 68 + 68 per
 * cell and KV head) over the time, the multiply bound is GQA 3's; a bad
 * shape is EINVAL, named */
static void test_attention_shape(void **state)
{
    (void)state;
    sink s = {0};
    char err[256] = "";
    const char *argv[] = {"--ctx", "256", "--kv", "q8_0", "--quick", "--shape", "2,2,6,64", "--json"};
    assert_ok(keel_bench_run("attention", 8, (char **)argv, sink_write, &s, err));
    json_error_t je;
    json_t *root = json_loads(s.buf, 0, &je);
    if (!root) fail_msg("bad JSON (%s) in: %s", je.text, s.buf);
    assert_int_equal((int)num(root, "layers"), 2);
    assert_int_equal((int)num(root, "kv_heads"), 2);
    assert_int_equal((int)num(root, "heads"), 6);
    assert_int_equal((int)num(root, "dim"), 64);
    const char *simd = json_string_value(json_object_get(root, "simd"));
    int level = strcmp(simd, "avx512") == 0 ? 2 : strcmp(simd, "avx2") == 0 ? 1 : 0;
    double lanes = level == 2 ? 16.0 : level == 1 ? 8.0 : 1.0;
    json_t *dec = json_object_get(root, "decode");
    assert_int_equal((int)json_array_size(dec), 4);
    double bytes = 2.0 * 256 * 2 * 136.0;
    for (size_t i = 0; i < json_array_size(dec); i++) {
        json_t *e = json_array_get(dec, i);
        double gbps = num(e, "gbps"), us = num(e, "us_per_token");
        assert_true(gbps > 0.0 && us > 0.0);
        /* gbps printed to 0.01, us to 0.1: a slow (sanitizer) build's 0.2
         * GB/s is 2.5% off by its rounding alone */
        assert_close(gbps * us * 1e3, bytes, (0.005 * us + 0.05 * gbps) * 1e3 + 1e-3 * bytes);
        char key[2] = {(char)('0' + (int)num(e, "threads")), 0};
        double pk = num(json_object_get(root, "fma_peak_gflops"), key);
        double want = pk / (2.0 * lanes) / bench_attn_muls(level, KEEL_DTYPE_Q8_0, 3, 64, 64) * 136.0;
        assert_close(num(e, "mul_bound_gbps"), want, mul_bound_tol(want, pk));
    }
    json_decref(root);
    free(s.buf);
    static const char *const bad[][2] = {{"--shape", "2,4,6,64"}, {"--shape", "2,2,6,48"}, {"--shape", "2,2,6"},
                                         {"--shape", "0,2,6,64"}, {"--shape", "2,2,6,64x"}};
    assert_attention_rejects(bad, sizeof bad / sizeof bad[0]);
}

/* --tokens N: a verify batch beside the same tokens one call each; both
 * timed, their outputs equal up to float reordering (attention outputs are
 * convex combinations of V rows of norm ~1 here, so 1e-4 is far above
 * reordering and far below any wrong visibility or row); bad N is EINVAL */
static void test_attention_tokens(void **state)
{
    (void)state;
    sink s = {0};
    char err[256] = "";
    const char *argv[] = {"--ctx", "200", "--kv", "q8_0", "--quick", "--shape", "2,2,6,64", "--tokens", "9", "--json"};
    assert_ok(keel_bench_run("attention", 10, (char **)argv, sink_write, &s, err));
    json_error_t je;
    json_t *root = json_loads(s.buf, 0, &je);
    if (!root) fail_msg("bad JSON (%s) in: %s", je.text, s.buf);
    assert_int_equal((int)num(root, "tokens"), 9);
    json_t *v = json_object_get(root, "verify");
    assert_int_equal((int)json_array_size(v), 4); /* rotation off / on x 1 / 2 threads */
    for (size_t i = 0; i < json_array_size(v); i++) {
        json_t *e = json_array_get(v, i);
        assert_true(num(e, "us_per_batch") > 0.0 && num(e, "us_per_calls") > 0.0);
        assert_true(num(e, "max_abs_diff") < 1e-4);
        assert_int_equal((int)num(e, "ctx"), 200);
    }
    json_decref(root);
    free(s.buf);
    static const char *const bad[][2] = {{"--tokens", "1"}, {"--tokens", "65"}, {"--tokens", "9x"}};
    assert_attention_rejects(bad, sizeof bad / sizeof bad[0]);
}

static void test_spec_verify_costs(void **state)
{
    (void)state;
    sink s = {0};
    char err[256] = "";
    const char *argv[] = {"-m", g_path, "-n", "16", "-k", "6", "-p", "8", "-r", "1", "-t", "1", "--json"};
    assert_ok(keel_bench_run("spec", (int)(sizeof argv / sizeof argv[0]), (char **)argv, sink_write, &s, err));
    json_error_t je;
    json_t *root = json_loads(s.buf, 0, &je);
    if (!root) fail_msg("bad JSON (%s) in: %s", je.text, s.buf);
    double step = num(root, "step_us");
    assert_true(step > 0.0);
    json_t *v = json_object_get(root, "verify");
    const int ks[] = {1, 2, 4, 6};
    assert_int_equal((int)json_array_size(v), 4);
    for (size_t i = 0; i < 4; i++) {
        json_t *e = json_array_get(v, i);
        assert_int_equal((int)num(e, "k"), ks[i]);
        assert_true(num(e, "us") > 0.0);
        /* -t 1: c from the thread's CPU time */
        assert_true(num(e, "cpu_us") > 0.0);
        assert_close(num(e, "c"), num(e, "cpu_us") / num(root, "step_cpu_us"), 1e-3 * num(e, "c") + 0.01);
        assert_close(num(e, "c_wall"), num(e, "us") / step, 1e-3 * num(e, "c_wall") + 0.01); /* printed to 0.01 us */
    }
    /* every row's speed-up is over the plain runs beside it (tok_s printed
     * to 0.001, speedup to 0.0001); at 100% with a fixed k drafts are made
     * and accepted (not all: without --deterministic a near-tie of this
     * random model can take the text off the known continuation) */
    json_t *rows = json_object_get(root, "rows");
    assert_int_equal((int)json_array_size(rows), 17); /* 8 rates x fixed / adaptive, n-gram */
    for (size_t i = 0; i < json_array_size(rows); i++) {
        json_t *e = json_array_get(rows, i);
        double tps = num(e, "tok_s"), ptps = num(e, "plain_tok_s");
        assert_true(tps > 0.0 && ptps > 0.0);
        assert_close(num(e, "speedup"), tps / ptps, 1e-4 + 1e-3 / ptps * (1.0 + tps / ptps));
    }
    json_t *all = json_array_get(rows, 14);
    assert_true(json_number_value(json_object_get(all, "rate")) == 1.0);
    assert_true(json_is_false(json_object_get(all, "adaptive")));
    assert_true(num(all, "drafted") > 0 && num(all, "accepted") > 0);
    json_decref(root);
    free(s.buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_depth_rows_bytes),
        cmocka_unit_test(test_cache_size),
        cmocka_unit_test(test_flag_errors),
        cmocka_unit_test(test_attn_muls),
        cmocka_unit_test(test_attention_bound),
        cmocka_unit_test(test_attention_shape),
        cmocka_unit_test(test_attention_tokens),
        cmocka_unit_test(test_spec_verify_costs),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
