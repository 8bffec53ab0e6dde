/*
 * pool.c — a fixed thread pool running one parallel-for job at a time.
 *
 * The caller is thread 0 and works too. Workers wait for a new job by
 * spinning on the job generation for a short while (a decode step issues
 * hundreds of small jobs) and then sleeping on a condition variable.
 * Invariants: generation only grows; n_active counts workers that have not
 * yet finished the current job; a job's tasks are claimed by an atomic
 * counter, so each runs exactly once. Worker stacks are 256 KiB
 * (design.md rule 8).
 */
#include "base.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#define POOL_STACK_BYTES (256u * 1024u)
#define POOL_SPIN_ITERS 200000

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define POOL_PAUSE() _mm_pause()
#else
#define POOL_PAUSE() ((void)0)
#endif

typedef struct pool_worker_arg {
    base_pool *pool;
    int tid;
} pool_worker_arg;

struct base_pool {
    int n_threads;       /* including the caller */
    pthread_t *workers;  /* [n_threads - 1] */
    pool_worker_arg *args;   /* [n_threads - 1] */
    int n_started;       /* workers actually started */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_uint_fast64_t generation; /* bumped once per job */
    atomic_int n_sleeping;
    atomic_int n_active;             /* workers still inside the current job */
    atomic_int_fast64_t next_task;
    atomic_bool stop;
    /* the current job, written before generation is bumped */
    int64_t n_tasks;
    base_task_fn fn;
    void *ctx;
    bool per_thread;
};

static void pool_do_job(base_pool *p, int tid)
{
    if (p->per_thread) {
        p->fn(p->ctx, tid, tid);
        return;
    }
    for (;;) {
        int64_t t = atomic_fetch_add_explicit(&p->next_task, 1, memory_order_relaxed);
        if (t >= p->n_tasks) break;
        p->fn(p->ctx, t, tid);
    }
}

static void *pool_worker_main(void *arg)
{
    pool_worker_arg a = *(pool_worker_arg *)arg;
    base_pool *p = a.pool;
    uint64_t seen = 0;
    for (;;) {
        uint64_t gen = atomic_load_explicit(&p->generation, memory_order_acquire);
        for (int i = 0; gen == seen && i < POOL_SPIN_ITERS; i++) {
            POOL_PAUSE();
            gen = atomic_load_explicit(&p->generation, memory_order_acquire);
        }
        if (gen == seen) {
            atomic_fetch_add(&p->n_sleeping, 1);
            pthread_mutex_lock(&p->mu);
            while ((gen = atomic_load(&p->generation)) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->cv, &p->mu);
            pthread_mutex_unlock(&p->mu);
            atomic_fetch_sub(&p->n_sleeping, 1);
        }
        if (atomic_load(&p->stop)) break;
        seen = gen;
        pool_do_job(p, a.tid);
        atomic_fetch_sub_explicit(&p->n_active, 1, memory_order_release);
    }
    return NULL;
}

keel_status base_pool_open(int n_threads, base_pool **out)
{
    *out = NULL;
    if (n_threads <= 0) n_threads = keel_cpu_count();
    if (n_threads > 256) n_threads = 256;
    base_pool *p = base_calloc(1, sizeof *p);
    if (!p) return KEEL_ENOMEM;
    p->n_threads = n_threads;
    atomic_init(&p->generation, 0);
    atomic_init(&p->n_sleeping, 0);
    atomic_init(&p->n_active, 0);
    atomic_init(&p->next_task, 0);
    atomic_init(&p->stop, false);
    if (pthread_mutex_init(&p->mu, NULL) != 0) {
        base_free(p, sizeof *p);
        return KEEL_EINTERNAL;
    }
    if (pthread_cond_init(&p->cv, NULL) != 0) {
        pthread_mutex_destroy(&p->mu);
        base_free(p, sizeof *p);
        return KEEL_EINTERNAL;
    }
    if (n_threads == 1) {
        *out = p;
        return KEEL_OK;
    }
    p->workers = base_calloc((size_t)n_threads - 1, sizeof(pthread_t));
    p->args = base_calloc((size_t)n_threads - 1, sizeof(pool_worker_arg));
    if (!p->workers || !p->args) {
        base_pool_close(p);
        return KEEL_ENOMEM;
    }
    pthread_attr_t attr;
    if (pthread_attr_init(&attr) != 0) {
        base_pool_close(p);
        return KEEL_EINTERNAL;
    }
    pthread_attr_setstacksize(&attr, POOL_STACK_BYTES);
    keel_status st = KEEL_OK;
    for (int i = 1; i < n_threads; i++) {
        pool_worker_arg *a = &p->args[i - 1];
        a->pool = p;
        a->tid = i;
        if (pthread_create(&p->workers[i - 1], &attr, pool_worker_main, a) != 0) {
            st = KEEL_EINTERNAL;
            break;
        }
        p->n_started++;
    }
    pthread_attr_destroy(&attr);
    if (st != KEEL_OK) {
        base_pool_close(p);
        return st;
    }
    *out = p;
    return KEEL_OK;
}

void base_pool_close(base_pool *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, true);
    atomic_fetch_add(&p->generation, 1);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_started; i++) pthread_join(p->workers[i], NULL);
    if (p->workers) base_free(p->workers, ((size_t)p->n_threads - 1) * sizeof(pthread_t));
    if (p->args) base_free(p->args, ((size_t)p->n_threads - 1) * sizeof(pool_worker_arg));
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    base_free(p, sizeof *p);
}

size_t base_pool_bytes(int n_threads)
{
    if (n_threads <= 0) n_threads = keel_cpu_count();
    if (n_threads > 256) n_threads = 256;
    size_t bytes = sizeof(base_pool);
    if (n_threads > 1)
        bytes += ((size_t)n_threads - 1) * (sizeof(pthread_t) + sizeof(pool_worker_arg));
    return bytes;
}

int base_pool_threads(const base_pool *p)
{
    return p ? p->n_threads : 1;
}

static void pool_dispatch(base_pool *p, int64_t n_tasks, base_task_fn fn, void *ctx,
                          bool per_thread)
{
    p->n_tasks = n_tasks;
    p->fn = fn;
    p->ctx = ctx;
    p->per_thread = per_thread;
    atomic_store_explicit(&p->next_task, 0, memory_order_relaxed);
    atomic_store_explicit(&p->n_active, p->n_started, memory_order_relaxed);
    atomic_fetch_add(&p->generation, 1); /* seq_cst: publishes the job */
    if (atomic_load(&p->n_sleeping) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    pool_do_job(p, 0);
    for (int i = 0; atomic_load_explicit(&p->n_active, memory_order_acquire) > 0; i++) {
        if (i < POOL_SPIN_ITERS)
            POOL_PAUSE();
        else
            sched_yield();
    }
}

void base_pool_run(base_pool *p, int64_t n_tasks, base_task_fn fn, void *ctx)
{
    if (n_tasks <= 0) return;
    if (!p || p->n_started == 0 || n_tasks == 1) {
        for (int64_t t = 0; t < n_tasks; t++) fn(ctx, t, 0);
        return;
    }
    pool_dispatch(p, n_tasks, fn, ctx, false);
}

void base_pool_run_per_thread(base_pool *p, base_task_fn fn, void *ctx)
{
    if (!p || p->n_started == 0) {
        fn(ctx, 0, 0);
        return;
    }
    pool_dispatch(p, p->n_started + 1, fn, ctx, true);
}
