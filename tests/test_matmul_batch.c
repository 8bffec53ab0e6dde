/*
 * test_matmul_batch.c — tensor_matvec_batch (speculative verify batches):
 * for every weight dtype, every SIMD level this CPU has, 1..16 tokens (and
 * longer batches, run in groups of 16), odd row counts, 1 and 2 threads and
 * weights at odd addresses, each token's row is BIT-IDENTICAL to
 * tensor_matvec on that token at the same level, and close to the scalar
 * path's; tensor_matmul's AUTO choice for small batches keeps that
 * identity; q8_0 weights holding -128 (the sign trick's and vpdpbusd's
 * edge); scratch accounting (level-independent, KEEL_ESCRATCH with the
 * arena unchanged) and bad arguments; tensor_matvec_batch_multi (a verify
 * batch's q/k/v in one dispatch) gives each matrix tensor_matvec_batch's
 * bits, within that scratch.
 */
#include "testutil.h"
#include "tensor/tensor.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const keel_dtype k_types[] = {
    KEEL_DTYPE_F32,  KEEL_DTYPE_F16,  KEEL_DTYPE_BF16, KEEL_DTYPE_Q4_0, KEEL_DTYPE_Q4_1,
    KEEL_DTYPE_Q5_0, KEEL_DTYPE_Q5_1, KEEL_DTYPE_Q8_0, KEEL_DTYPE_Q2_K, KEEL_DTYPE_Q3_K,
    KEEL_DTYPE_Q4_K, KEEL_DTYPE_Q5_K, KEEL_DTYPE_Q6_K,
};

/* Runs body once per SIMD level this CPU has (0 scalar, 1 avx2, 2 avx512),
 * then restores the level before. */
#define FOR_EACH_LEVEL(simd)                                                                       \
    for (int simd = 0, prev_ = (int)tensor_simd_force(TENSOR_SIMD_SCALAR);                        \
         simd <= (int)tensor_simd_best();                                                          \
         tensor_simd_force(++simd <= (int)tensor_simd_best() ? (tensor_simd)simd                   \
                                                             : (tensor_simd)prev_))

#define MAX_TOK  33
#define MAX_COLS 3616
#define MAX_ROWS 67

/* Random rows of dtype t at W (q2_K / q3_K from random bytes with sane
 * scales: keel cannot write them). */
static void make_rows(keel_dtype t, int64_t n_rows, int64_t n_cols, uint8_t *W, uint64_t seed)
{
    size_t rb = tensor_row_bytes(t, n_cols);
    if (t == KEEL_DTYPE_Q2_K || t == KEEL_DTYPE_Q3_K) {
        base_rng r;
        base_rng_seed(&r, seed);
        size_t bb = keel_dtype_block_bytes(t);
        for (size_t off = 0; off < rb * (size_t)n_rows; off += bb) {
            for (size_t k = 0; k < bb; k++) W[off + k] = (uint8_t)base_rng_next(&r);
            uint16_t d = tensor_f32_to_f16(0.01f), dm = tensor_f32_to_f16(0.004f);
            memcpy(W + off + (t == KEEL_DTYPE_Q2_K ? 80 : 108), &d, 2);
            if (t == KEEL_DTYPE_Q2_K) memcpy(W + off + 82, &dm, 2);
        }
        return;
    }
    float x[MAX_COLS];
    for (int64_t r = 0; r < n_rows; r++) {
        test_fill_normal(x, n_cols, seed + (uint64_t)r);
        assert_ok(tensor_quantize_row(t, x, W + (size_t)r * rb, n_cols));
    }
}

typedef struct bt_fix {
    base_pool *pools[2]; /* 1 and 2 threads */
    base_arena arena;
    uint8_t *wbuf;
    float *X, *Y, *want, *ref; /* [MAX_TOK][MAX_COLS], then [MAX_TOK][MAX_ROWS] each */
} bt_fix;

static void fix_open(bt_fix *f)
{
    for (int p = 0; p < 2; p++) assert_ok(base_pool_open(p + 1, &f->pools[p]));
    assert_ok(base_arena_init(&f->arena, 1 << 20));
    f->wbuf = malloc((size_t)MAX_ROWS * MAX_COLS * 4 + 8);
    f->X = malloc((size_t)MAX_TOK * MAX_COLS * sizeof(float));
    f->Y = malloc((size_t)MAX_TOK * MAX_ROWS * sizeof(float));
    f->want = malloc((size_t)MAX_TOK * MAX_ROWS * sizeof(float));
    f->ref = malloc((size_t)MAX_TOK * MAX_ROWS * sizeof(float));
    assert_non_null(f->wbuf);
    assert_non_null(f->X);
    assert_non_null(f->Y);
    assert_non_null(f->want);
    assert_non_null(f->ref);
}

static void fix_close(bt_fix *f)
{
    for (int p = 0; p < 2; p++) base_pool_close(f->pools[p]);
    base_arena_free(&f->arena);
    free(f->wbuf);
    free(f->X);
    free(f->Y);
    free(f->want);
    free(f->ref);
}

/* Y rows of n tokens equal tensor_matvec's on each token, bit for bit. */
static void check_identical(bt_fix *f, keel_dtype t, const uint8_t *W, int64_t n_rows, int64_t n_cols, int64_t n,
                            base_pool *pool, const char *what, int simd)
{
    for (int64_t i = 0; i < n; i++)
        assert_ok(tensor_matvec(t, W, n_rows, n_cols, f->X + i * n_cols, f->want + i * n_rows, pool, &f->arena));
    for (int64_t i = 0; i < n; i++)
        for (int64_t r = 0; r < n_rows; r++) {
            float a = f->Y[i * n_rows + r], b = f->want[i * n_rows + r];
            if (memcmp(&a, &b, sizeof a) != 0)
                fail_msg("%s %s level %d, %lld cols, %lld tokens: token %lld row %lld: %.9g, matvec %.9g", what,
                         keel_dtype_name(t), simd, (long long)n_cols, (long long)n, (long long)i, (long long)r,
                         a, b);
        }
}

/* |y - ref| within a bound relative to the row's magnitude (SIMD against
 * scalar: the f32 summation order differs). */
static void check_close(const float *y, const float *ref, int64_t count, const char *what, keel_dtype t)
{
    double scale = 0;
    for (int64_t k = 0; k < count; k++) scale = fmax(scale, fabs(ref[k]));
    for (int64_t k = 0; k < count; k++)
        if (!(fabs(y[k] - ref[k]) <= 1e-4 * scale + 1e-6))
            fail_msg("%s %s element %lld: %.9g, scalar %.9g", what, keel_dtype_name(t), (long long)k, y[k], ref[k]);
}

static void test_batch_identical_to_matvec(void **state)
{
    (void)state;
    bt_fix f;
    fix_open(&f);
    /* q8_0 at the avx512 level (groups of 16 blocks): a short group alone (96,
     * 256), one of 9 (288), 16 + 8 (768), 16 + 9 (800), full groups (512),
     * 16 + 16 + 13 (1440), and seven groups and a block (3616: from 13
     * tokens on, rows taken in chunks of groups: MVB_REC_WHOLE) */
    static const int64_t cols[] = {96, 288, 800, 256, 768, 512, 1440, 3616};
    static const int64_t rows[] = {67, 5};
    for (size_t k = 0; k < BASE_ARRAY_LEN(k_types); k++) {
        keel_dtype t = k_types[k];
        for (size_t c = 0; c < BASE_ARRAY_LEN(cols); c++) {
            int64_t n_cols = cols[c];
            if (n_cols % keel_dtype_block_size(t) != 0) continue;
            for (size_t ri = 0; ri < BASE_ARRAY_LEN(rows); ri++) {
                int64_t n_rows = rows[ri];
                uint8_t *W = f.wbuf + (k + c + ri) % 2; /* odd addresses too */
                make_rows(t, n_rows, n_cols, W, 100 + 7 * k + c);
                for (int64_t i = 0; i < MAX_TOK; i++) test_fill_normal(f.X + i * n_cols, n_cols, 500 + (uint64_t)i);
                assert_true(tensor_matvec_batch_scratch_bytes(t, n_cols, MAX_TOK) <= f.arena.cap);
                /* scalar reference of all tokens */
                tensor_simd prev = tensor_simd_force(TENSOR_SIMD_SCALAR);
                assert_ok(tensor_matvec_batch(t, W, n_rows, n_cols, f.X, MAX_TOK, f.ref, f.pools[0], &f.arena));
                tensor_simd_force(prev);
                FOR_EACH_LEVEL(simd)
                {
                    static const int64_t toks[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 19, 33};
                    for (size_t ti = 0; ti < BASE_ARRAY_LEN(toks); ti++) {
                        int64_t n = toks[ti];
                        for (int p = 0; p < 2; p++) {
                            size_t used = f.arena.used;
                            memset(f.Y, 0xFF, (size_t)(n * n_rows) * sizeof(float));
                            assert_ok(tensor_matvec_batch(t, W, n_rows, n_cols, f.X, n, f.Y, f.pools[p], &f.arena));
                            assert_int_equal(f.arena.used, used);
                            check_identical(&f, t, W, n_rows, n_cols, n, f.pools[p], "matvec_batch", simd);
                            check_close(f.Y, f.ref, n * n_rows, "matvec_batch vs scalar", t);
                        }
                        /* AUTO for small batches: still each token's matvec bits
                         * where it picks the batched kernel */
                        if (n <= TENSOR_MV_BATCH_MAX + 1 &&
                            tensor_matmul_auto_path(t, n) == TENSOR_GEMM_MATVEC_BATCH) {
                            assert_ok(tensor_matmul(t, W, n_rows, n_cols, f.X, n, f.Y, f.pools[1], &f.arena));
                            check_identical(&f, t, W, n_rows, n_cols, n, f.pools[1], "matmul auto", simd);
                        }
                        assert_ok(tensor_matmul_path(TENSOR_GEMM_MATVEC_BATCH, t, W, n_rows, n_cols, f.X, n, f.Y,
                                                     f.pools[1], &f.arena));
                        check_identical(&f, t, W, n_rows, n_cols, n, f.pools[1], "matmul path", simd);
                    }
                }
            }
        }
    }
    fix_close(&f);
}

/* q8_0 weights whose quants include -128 (a file may hold them; keel's
 * quantizer writes -127..127): |w| = 128 in the AVX2 sign trick, w xor
 * 0x80 = 0 in vpdpbusd. Both must still give the exact products, the
 * scalar dot's. */
static void test_q8_0_extremes(void **state)
{
    (void)state;
    bt_fix f;
    fix_open(&f);
    const int64_t n_rows = 9, n_cols = 800, n = 11;
    size_t rb = tensor_row_bytes(KEEL_DTYPE_Q8_0, n_cols);
    uint8_t *W = f.wbuf + 1;
    base_rng rng;
    base_rng_seed(&rng, 5);
    for (int64_t r = 0; r < n_rows; r++)
        for (int64_t b = 0; b < n_cols / 32; b++) {
            uint8_t *blk = W + (size_t)r * rb + (size_t)b * 34;
            uint16_t d = tensor_f32_to_f16(0.001f * (float)(1 + (b % 7)));
            memcpy(blk, &d, 2);
            for (int e = 0; e < 32; e++) {
                uint64_t v = base_rng_next(&rng);
                blk[2 + e] = (r + b) % 3 == 0 ? 0x80 : (uint8_t)(e % 2 ? 0x80 : 0x7F) ^ (uint8_t)(v & (r & 1));
            }
        }
    for (int64_t i = 0; i < n; i++) {
        test_fill_normal(f.X + i * n_cols, n_cols, 900 + (uint64_t)i);
        /* an activation at its extremes too */
        for (int64_t c = 0; c < n_cols; c += 3) f.X[i * n_cols + c] = c % 2 ? -8.0f : 8.0f;
    }
    tensor_simd prev = tensor_simd_force(TENSOR_SIMD_SCALAR);
    assert_ok(tensor_matvec_batch(KEEL_DTYPE_Q8_0, W, n_rows, n_cols, f.X, n, f.ref, f.pools[0], &f.arena));
    tensor_simd_force(prev);
    FOR_EACH_LEVEL(simd)
    {
        for (int p = 0; p < 2; p++) {
            assert_ok(tensor_matvec_batch(KEEL_DTYPE_Q8_0, W, n_rows, n_cols, f.X, n, f.Y, f.pools[p], &f.arena));
            check_identical(&f, KEEL_DTYPE_Q8_0, W, n_rows, n_cols, n, f.pools[p], "q8_0 extremes", simd);
            check_close(f.Y, f.ref, n * n_rows, "q8_0 extremes vs scalar", KEEL_DTYPE_Q8_0);
        }
    }
    fix_close(&f);
}

/* Scratch: the same need at every level; too small an arena (or none for a
 * quantized activation) is KEEL_ESCRATCH with the arena unchanged; bad
 * shapes are KEEL_EINVAL; empty products write nothing / zeros. */
static void test_scratch_and_args(void **state)
{
    (void)state;
    bt_fix f;
    fix_open(&f);
    const int64_t n_rows = 7, n_cols = 256;
    for (size_t k = 0; k < BASE_ARRAY_LEN(k_types); k++) {
        keel_dtype t = k_types[k];
        make_rows(t, n_rows, n_cols, f.wbuf, 3);
        for (int64_t i = 0; i < 16; i++) test_fill_normal(f.X + i * n_cols, n_cols, 70 + (uint64_t)i);
        size_t need = tensor_matvec_batch_scratch_bytes(t, n_cols, 16);
        assert_true(need >= tensor_matvec_scratch_bytes(t, n_cols));
        /* longer batches run in groups of 16: no more scratch */
        assert_int_equal(tensor_matvec_batch_scratch_bytes(t, n_cols, 1000), need);
        assert_true(tensor_matmul_scratch_bytes(t, n_rows, n_cols, 16, 2) >= need);
        FOR_EACH_LEVEL(simd)
        {
            base_arena exact;
            assert_ok(base_arena_init(&exact, need));
            assert_ok(tensor_matvec_batch(t, f.wbuf, n_rows, n_cols, f.X, 16, f.Y, f.pools[1], &exact));
            assert_int_equal(exact.used, 0);
            base_arena_free(&exact);
            if (tensor_vec_dot_type(t) != KEEL_DTYPE_F32) {
                base_arena tiny;
                /* room for 4 of the 16 quantized activations */
                assert_ok(base_arena_init(&tiny, 4 * tensor_row_bytes(tensor_vec_dot_type(t), n_cols)));
                assert_status(tensor_matvec_batch(t, f.wbuf, n_rows, n_cols, f.X, 16, f.Y, f.pools[1], &tiny),
                              KEEL_ESCRATCH);
                assert_int_equal(tiny.used, 0);
                base_arena_free(&tiny);
                assert_status(tensor_matvec_batch(t, f.wbuf, n_rows, n_cols, f.X, 3, f.Y, f.pools[1], NULL),
                              KEEL_ESCRATCH);
            }
        }
    }
    float y[4] = {1, 2, 3, 4};
    assert_status(tensor_matvec_batch(KEEL_DTYPE_Q8_0, f.wbuf, 1, 33, f.X, 2, f.Y, NULL, &f.arena), KEEL_EINVAL);
    assert_status(tensor_matvec_batch(KEEL_DTYPE_Q4_K, f.wbuf, 1, 32, f.X, 2, f.Y, NULL, &f.arena), KEEL_EINVAL);
    assert_status(tensor_matvec_batch(KEEL_DTYPE_I8, f.wbuf, 1, 32, f.X, 2, f.Y, NULL, &f.arena), KEEL_EINVAL);
    assert_status(tensor_matvec_batch(KEEL_DTYPE_F32, f.wbuf, 1, 32, f.X, -1, f.Y, NULL, &f.arena), KEEL_EINVAL);
    assert_status(tensor_matvec_batch(KEEL_DTYPE_F32, NULL, 1, 32, f.X, 2, f.Y, NULL, &f.arena), KEEL_EINVAL);
    assert_status(tensor_matmul_path((tensor_gemm_path)5, KEEL_DTYPE_F32, f.wbuf, 1, 32, f.X, 2, f.Y, NULL,
                                     &f.arena),
                  KEEL_EINVAL);
    assert_ok(tensor_matvec_batch(KEEL_DTYPE_F32, f.wbuf, 0, 32, f.X, 2, y, NULL, &f.arena));
    assert_ok(tensor_matvec_batch(KEEL_DTYPE_F32, f.wbuf, 2, 32, f.X, 0, y, NULL, &f.arena));
    assert_true(y[0] == 1 && y[3] == 4);
    assert_ok(tensor_matvec_batch(KEEL_DTYPE_Q8_0, f.wbuf, 2, 0, f.X, 2, y, NULL, &f.arena));
    assert_true(y[0] == 0 && y[1] == 0 && y[2] == 0 && y[3] == 0);
    fix_close(&f);
}

/* tensor_matvec_batch_multi: three matrices of one dtype (67, 5 and 33
 * rows) against the same tokens, each bit for bit tensor_matvec_batch on
 * its own, at every level, 1 and 2 threads, within one matrix's scratch;
 * bad arguments. */
static void test_batch_multi(void **state)
{
    (void)state;
    bt_fix f;
    fix_open(&f);
    static const keel_dtype types[] = {KEEL_DTYPE_Q8_0, KEEL_DTYPE_Q4_K, KEEL_DTYPE_F32};
    static const int64_t rows[3] = {MAX_ROWS, 5, 33};
    const int64_t n_cols = 768;
    float *Ym = malloc((size_t)3 * MAX_TOK * MAX_ROWS * sizeof(float));
    assert_non_null(Ym);
    uint8_t *Wm = malloc((size_t)3 * MAX_ROWS * 1024 * 4 + 8);
    assert_non_null(Wm);
    for (size_t k = 0; k < BASE_ARRAY_LEN(types); k++) {
        keel_dtype t = types[k];
        size_t rb = tensor_row_bytes(t, n_cols);
        const uint8_t *W[3];
        for (int j = 0; j < 3; j++) {
            uint8_t *w = Wm + (size_t)j * MAX_ROWS * rb + (size_t)(j % 2); /* odd addresses too */
            make_rows(t, rows[j], n_cols, w, 40 + 3 * k + (uint64_t)j);
            W[j] = w;
        }
        for (int64_t i = 0; i < MAX_TOK; i++) test_fill_normal(f.X + i * n_cols, n_cols, 800 + (uint64_t)i);
        size_t need = tensor_matvec_batch_scratch_bytes(t, n_cols, TENSOR_MV_BATCH_MAX);
        FOR_EACH_LEVEL(simd)
        {
            static const int64_t toks[] = {1, 2, 3, 5, 8, 9, 12, 16, 17, 19};
            for (size_t ti = 0; ti < BASE_ARRAY_LEN(toks); ti++) {
                int64_t n = toks[ti];
                for (int p = 0; p < 2; p++) {
                    tensor_mv_job jobs[3];
                    for (int j = 0; j < 3; j++) {
                        float *y = Ym + (size_t)j * MAX_TOK * MAX_ROWS;
                        memset(y, 0xFF, (size_t)(n * rows[j]) * sizeof(float));
                        jobs[j] = (tensor_mv_job){t, W[j], rows[j], y, NULL};
                    }
                    base_arena exact;
                    assert_ok(base_arena_init(&exact, need));
                    assert_ok(tensor_matvec_batch_multi(jobs, 3, n_cols, f.X, n, f.pools[p],
                                                        n <= TENSOR_MV_BATCH_MAX ? &exact : &f.arena));
                    assert_int_equal(exact.used, 0);
                    base_arena_free(&exact);
                    for (int j = 0; j < 3; j++) {
                        assert_ok(tensor_matvec_batch(t, W[j], rows[j], n_cols, f.X, n, f.Y, f.pools[p], &f.arena));
                        if (memcmp(f.Y, jobs[j].y, (size_t)(n * rows[j]) * sizeof(float)) != 0)
                            fail_msg("batch_multi %s level %d, %lld tokens, matrix %d: differs from matvec_batch",
                                     keel_dtype_name(t), simd, (long long)n, j);
                    }
                }
            }
        }
    }
    /* bad arguments */
    tensor_mv_job jobs[2] = {{KEEL_DTYPE_Q8_0, Wm, 2, Ym, NULL}, {KEEL_DTYPE_Q4_0, Wm, 2, Ym, NULL}};
    assert_status(tensor_matvec_batch_multi(jobs, 2, 64, f.X, 2, f.pools[0], &f.arena), KEEL_EINVAL);
    jobs[1].dtype = KEEL_DTYPE_Q8_0;
    jobs[1].x = f.X;
    assert_status(tensor_matvec_batch_multi(jobs, 2, 64, f.X, 2, f.pools[0], &f.arena), KEEL_EINVAL);
    jobs[1].x = NULL;
    assert_status(tensor_matvec_batch_multi(jobs, 0, 64, f.X, 2, f.pools[0], &f.arena), KEEL_EINVAL);
    assert_status(tensor_matvec_batch_multi(jobs, 2, 33, f.X, 2, f.pools[0], &f.arena), KEEL_EINVAL);
    assert_status(tensor_matvec_batch_multi(jobs, 2, 64, f.X, 2, f.pools[0], NULL), KEEL_ESCRATCH);
    assert_ok(tensor_matvec_batch_multi(jobs, 2, 64, f.X, 2, f.pools[0], &f.arena));
    free(Ym);
    free(Wm);
    fix_close(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_identical_to_matvec),
        cmocka_unit_test(test_q8_0_extremes),
        cmocka_unit_test(test_scratch_and_args),
        cmocka_unit_test(test_batch_multi),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
