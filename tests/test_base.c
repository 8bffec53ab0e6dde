/*
 * test_base.c — src/base: status table, checked sizes, arenas, pool, rng,
 * allocator hooks (failing-allocator sweep).
 */
#include "testutil.h"
#include "base/base.h"

#include <stdatomic.h>
#include <string.h>

static void test_status_table(void **state)
{
    (void)state;
    assert_string_equal(keel_strerror(KEEL_OK), "ok");
    assert_string_equal(keel_strerror(KEEL_EFULL), "cache full");
    assert_string_equal(keel_status_name(KEEL_ENOMEM), "KEEL_ENOMEM");
    assert_string_equal(keel_strerror((keel_status)9999), "unknown status");
    assert_string_equal(keel_version(), KEEL_VERSION_STRING);
    char err[BASE_ERR_CAP];
    assert_int_equal(base_err(err, KEEL_EINVAL, "tensor %s: offset %d", "x", 912), KEEL_EINVAL);
    assert_string_equal(err, "tensor x: offset 912");
}

static void test_size_math(void **state)
{
    (void)state;
    size_t out;
    assert_true(size_mul(3, 5, &out) && out == 15);
    assert_false(size_mul(SIZE_MAX / 2 + 1, 2, &out));
    assert_false(size_add(SIZE_MAX, 1, &out));
    assert_true(size_mul_add(4, 8, 2, &out) && out == 34);
    assert_false(size_mul_add(SIZE_MAX, 1, 1, &out));
    assert_true(size_align_up(65, 64, &out) && out == 128);
    assert_false(size_align_up(SIZE_MAX - 3, 64, &out));
    assert_false(size_from_i64(-1, &out));
    assert_true(size_from_i64(7, &out) && out == 7);
}

static void test_arena_bounds(void **state)
{
    (void)state;
    base_arena a;
    assert_ok(base_arena_init(&a, 1000));
    assert_int_equal(a.cap, 1024); /* rounded to BASE_ALIGN */
    uint8_t *p = base_arena_take(&a, 100, 64);
    assert_non_null(p);
    assert_int_equal(((uintptr_t)p) % 64, 0);
    size_t mark = base_arena_mark(&a);
    assert_non_null(base_arena_take(&a, 900, 16));
    size_t used = a.used;
    assert_null(base_arena_take(&a, 100, 1)); /* does not fit: unchanged */
    assert_int_equal(a.used, used);
    assert_null(base_arena_take(&a, SIZE_MAX, 1)); /* overflow: unchanged */
    assert_null(base_arena_take_n(&a, SIZE_MAX / 2, 4));
    assert_int_equal(a.used, used);
    base_arena_rewind(&a, mark);
    assert_int_equal(a.used, 100);
    assert_int_equal(a.high, used);
    base_arena_reset(&a);
    assert_int_equal(a.used, 0);
    base_arena_free(&a);
    assert_null(a.data);
    base_arena_free(NULL);
}

typedef struct sum_ctx {
    atomic_long sum;
    atomic_int per_thread_hits[8];
} sum_ctx;

static void sum_task(void *vctx, int64_t task, int thread)
{
    sum_ctx *c = vctx;
    assert_true(thread >= 0 && thread < 8);
    atomic_fetch_add(&c->sum, (long)task);
}

static void per_thread_task(void *vctx, int64_t task, int thread)
{
    sum_ctx *c = vctx;
    assert_int_equal(task, thread);
    atomic_fetch_add(&c->per_thread_hits[thread], 1);
}

static void test_pool_parallel_for(void **state)
{
    (void)state;
    for (int nt = 1; nt <= 4; nt++) {
        base_pool *p;
        assert_ok(base_pool_open(nt, &p));
        assert_int_equal(base_pool_threads(p), nt);
        for (int rep = 0; rep < 200; rep++) {
            sum_ctx c;
            memset(&c, 0, sizeof c);
            int64_t n = 1 + rep * 7;
            base_pool_run(p, n, sum_task, &c);
            assert_int_equal(atomic_load(&c.sum), n * (n - 1) / 2);
        }
        sum_ctx c;
        memset(&c, 0, sizeof c);
        base_pool_run_per_thread(p, per_thread_task, &c);
        for (int t = 0; t < nt; t++) assert_int_equal(atomic_load(&c.per_thread_hits[t]), 1);
        base_pool_close(p);
    }
    base_pool_close(NULL);
    sum_ctx c;
    memset(&c, 0, sizeof c);
    base_pool_run(NULL, 10, sum_task, &c);
    assert_int_equal(atomic_load(&c.sum), 45);
}

/* Per-thread jobs right after ordinary ones: a worker still leaving the previous job (its
 * generation read, the job already done by others) must not take the per-thread flag of the
 * next job as its own and run it twice (seen once under ASan load before the fix). */
static void test_pool_per_thread_after_run(void **state)
{
    (void)state;
    for (int nt = 2; nt <= 4; nt++) {
        base_pool *p;
        assert_ok(base_pool_open(nt, &p));
        for (int rep = 0; rep < 3000; rep++) {
            sum_ctx c;
            memset(&c, 0, sizeof c);
            base_pool_run(p, 2 + rep % 3, sum_task, &c);
            sum_ctx d;
            memset(&d, 0, sizeof d);
            base_pool_run_per_thread(p, per_thread_task, &d);
            for (int t = 0; t < nt; t++) assert_int_equal(atomic_load(&d.per_thread_hits[t]), 1);
        }
        base_pool_close(p);
    }
}

/* Jobs back to back whose task counts differ (as attention's prep, split and
 * merge jobs do): a worker still holding the claim of a finished job (all
 * its tasks taken) must not take the next job's larger task count as its
 * bound and run a task before that job is published — with the old job's
 * or a mix of the two jobs' fields, counted in the new job's `done`, so the
 * caller could return while it still ran (a TSan race in fuzz_memory
 * --config 4, rare crashes under load). Each task checks it runs for the
 * job being run, once. Run under TSan too (make test-tsan). */
typedef struct job_ctx {
    int64_t job;              /* the job this context belongs to */
    atomic_int hits[64];
} job_ctx;

static atomic_llong g_current_job;
static atomic_int g_stray;

static void job_task(void *vctx, int64_t task, int thread)
{
    (void)thread;
    job_ctx *c = vctx;
    if (c->job != atomic_load(&g_current_job) || task < 0 || task >= 64) {
        atomic_fetch_add(&g_stray, 1);
        return;
    }
    atomic_fetch_add(&c->hits[task], 1);
}

static void test_pool_back_to_back_jobs(void **state)
{
    (void)state;
    for (int nt = 2; nt <= 4; nt++) {
        base_pool *p;
        assert_ok(base_pool_open(nt, &p));
        atomic_store(&g_stray, 0);
        for (int64_t job = 1; job <= 40000; job++) {
            job_ctx c; /* on the stack, reused at the same address, as attend's contexts are */
            memset(&c, 0, sizeof c);
            c.job = job;
            int64_t n = job % 3 == 0 ? 64 : 2 + job % 5;
            atomic_store(&g_current_job, job);
            base_pool_run(p, n, job_task, &c);
            atomic_store(&g_current_job, 0);
            for (int64_t t = 0; t < n; t++)
                if (atomic_load(&c.hits[t]) != 1) fail_msg("threads %d job %lld task %lld ran %d times", nt,
                                                           (long long)job, (long long)t, atomic_load(&c.hits[t]));
        }
        assert_int_equal(atomic_load(&g_stray), 0);
        base_pool_close(p);
    }
}

static void test_rng_deterministic(void **state)
{
    (void)state;
    base_rng a, b;
    base_rng_seed(&a, 42);
    base_rng_seed(&b, 42);
    for (int i = 0; i < 100; i++) assert_int_equal(base_rng_next(&a), base_rng_next(&b));
    double mean = 0, var = 0;
    for (int i = 0; i < 100000; i++) {
        double x = base_rng_normal(&a);
        mean += x;
        var += x * x;
    }
    mean /= 100000;
    var = var / 100000 - mean * mean;
    assert_close(mean, 0.0, 0.02);
    assert_close(var, 1.0, 0.03);
    for (int i = 0; i < 1000; i++) assert_true(base_rng_below(&a, 7) < 7);
    assert_int_not_equal(base_hash64("abc", 3, 0), base_hash64("abd", 3, 0));
    assert_int_equal(base_hash64("abc", 3, 1), base_hash64("abc", 3, 1));
}

static keel_status setup_op(void *ctx)
{
    (void)ctx;
    base_pool *p = NULL;
    base_arena a;
    keel_status st = base_arena_init(&a, 4096);
    if (st != KEEL_OK) return st;
    st = base_pool_open(3, &p);
    if (st != KEEL_OK) {
        base_arena_free(&a);
        return st;
    }
    char *s = base_strdup("hello");
    if (!s) {
        base_pool_close(p);
        base_arena_free(&a);
        return KEEL_ENOMEM;
    }
    base_strfree(s);
    base_pool_close(p);
    base_arena_free(&a);
    return KEEL_OK;
}

static void test_alloc_sweep_base(void **state)
{
    (void)state;
    int64_t n = test_alloc_sweep(setup_op, NULL);
    assert_true(n >= 4);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status_table),      cmocka_unit_test(test_size_math),
        cmocka_unit_test(test_arena_bounds),      cmocka_unit_test(test_pool_parallel_for),
        cmocka_unit_test(test_pool_per_thread_after_run),
        cmocka_unit_test(test_pool_back_to_back_jobs),
        cmocka_unit_test(test_rng_deterministic), cmocka_unit_test(test_alloc_sweep_base),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
