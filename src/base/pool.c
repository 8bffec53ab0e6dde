/*
 * pool.c — a fixed thread pool running one parallel-for job at a time.
 *
 * The caller is thread 0 and works too. Tasks are claimed one at a time
 * through `claim`, which holds (job generation << 32 | next task index):
 * a worker that wakes up late, after its job is done, finds a different
 * generation and claims nothing, so the caller never waits for a thread
 * that has not started; it waits only until every claimed task has
 * completed (`done`). That keeps a busy or oversubscribed machine from
 * turning each of the hundreds of jobs per decode step into a scheduler
 * timeslice.
 *
 * Workers spin for a short, time-bounded while (decode issues jobs microseconds
 * apart) and then sleep on a condition variable. Worker stacks are 256 KiB
 * (design.md rule 8). Invariants: generation only grows; a task runs at
 * most once (claimed by a successful CAS in its own generation) and every
 * task of a job runs before base_pool_run returns.
 */
#include "base.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>

#define POOL_STACK_BYTES (256u * 1024u)
#define POOL_SPIN_NS 100000ull /* workers spin this long for the next job */
#define POOL_WAIT_SPIN_NS 20000ull

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
    int n_threads;          /* including the caller */
    pthread_t *workers;     /* [n_threads - 1] */
    pool_worker_arg *args;  /* [n_threads - 1] */
    int n_started;          /* workers actually started */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_uint_fast64_t generation; /* bumped once per job: the wake-up signal */
    atomic_uint_fast64_t claim;      /* (generation << 32) | next task */
    atomic_int_fast64_t done;        /* tasks of the current job completed */
    atomic_int per_thread_left;      /* per-thread jobs: workers yet to run */
    atomic_int n_sleeping;
    atomic_bool stop;
    /* the current job, stored before claim is published */
    atomic_int_fast64_t n_tasks;
    _Atomic(base_task_fn) fn;
    _Atomic(void *) ctx;
    atomic_bool per_thread;
    /* profile (base_pool_profile), written by the calling thread only */
    bool prof;
    base_pool_stats stats;
};

/* Claims and runs tasks of generation gen until none are left. */
static void pool_work(base_pool *p, uint64_t gen, int tid)
{
    for (;;) {
        uint_fast64_t c = atomic_load_explicit(&p->claim, memory_order_acquire);
        if ((c >> 32) != (gen & 0xffffffffu)) return;
        int64_t idx = (int64_t)(c & 0xffffffffu);
        int64_t nt = atomic_load_explicit(&p->n_tasks, memory_order_acquire);
        base_task_fn fn = atomic_load_explicit(&p->fn, memory_order_acquire);
        void *ctx = atomic_load_explicit(&p->ctx, memory_order_acquire);
        if (idx >= nt) return;
        /* success proves the job has not changed since the fields were read:
         * a field of a newer job carries base_pool_run's closed claim with it */
        if (!atomic_compare_exchange_weak_explicit(&p->claim, &c, c + 1, memory_order_acq_rel,
                                                   memory_order_relaxed))
            continue;
        fn(ctx, idx, tid);
        atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
    }
}

static void *pool_worker_main(void *arg)
{
    pool_worker_arg a = *(pool_worker_arg *)arg;
    base_pool *p = a.pool;
    uint64_t seen = 0;
    for (;;) {
        uint64_t gen = atomic_load_explicit(&p->generation, memory_order_acquire);
        if (gen == seen) {
            uint64_t t0 = base_time_ns();
            for (int i = 0; gen == seen; i++) {
                POOL_PAUSE();
                gen = atomic_load_explicit(&p->generation, memory_order_acquire);
                if ((i & 255) == 255 && base_time_ns() - t0 > POOL_SPIN_NS) break;
            }
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
        if (atomic_load_explicit(&p->per_thread, memory_order_acquire)) {
            /* A per-thread job stores claim before per_thread: a worker that read a stale
             * generation (a finished job) may see the flag of the next one; its claim names
             * that job's generation, so skip and wait for the generation to catch up. */
            uint_fast64_t c = atomic_load_explicit(&p->claim, memory_order_acquire);
            if ((c >> 32) != (gen & 0xffffffffu)) continue;
            /* the caller waits for every worker in this mode: fields are stable */
            base_task_fn fn = atomic_load_explicit(&p->fn, memory_order_relaxed);
            void *ctx = atomic_load_explicit(&p->ctx, memory_order_relaxed);
            fn(ctx, a.tid, a.tid);
            atomic_fetch_sub_explicit(&p->per_thread_left, 1, memory_order_release);
        } else {
            pool_work(p, gen, a.tid);
        }
    }
    return NULL;
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

keel_status base_pool_open(int n_threads, base_pool **out)
{
    *out = NULL;
    if (n_threads <= 0) n_threads = keel_cpu_count();
    if (n_threads > 256) n_threads = 256;
    base_pool *p = base_calloc(1, sizeof *p);
    if (!p) return KEEL_ENOMEM;
    p->n_threads = n_threads;
    atomic_init(&p->generation, 0);
    atomic_init(&p->claim, 0);
    atomic_init(&p->done, 0);
    atomic_init(&p->per_thread_left, 0);
    atomic_init(&p->n_sleeping, 0);
    atomic_init(&p->stop, false);
    atomic_init(&p->n_tasks, 0);
    atomic_init(&p->fn, NULL);
    atomic_init(&p->ctx, NULL);
    atomic_init(&p->per_thread, false);
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

int base_pool_threads(const base_pool *p)
{
    return p ? p->n_threads : 1;
}

static void pool_wake(base_pool *p)
{
    if (atomic_load(&p->n_sleeping) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
}

/* Spins briefly, then yields, until cond(p) holds. */
static void pool_wait_done(base_pool *p, int64_t n_tasks)
{
    uint64_t t0 = 0;
    for (int i = 0; atomic_load_explicit(&p->done, memory_order_acquire) < n_tasks; i++) {
        if (i < 64) {
            POOL_PAUSE();
            continue;
        }
        if (!t0) t0 = base_time_ns();
        if (base_time_ns() - t0 < POOL_WAIT_SPIN_NS)
            POOL_PAUSE();
        else
            sched_yield();
    }
}

void base_pool_profile(base_pool *p, bool on)
{
    if (!p) return;
    p->prof = on;
    memset(&p->stats, 0, sizeof p->stats);
}

void base_pool_stats_get(const base_pool *p, base_pool_stats *out)
{
    memset(out, 0, sizeof *out);
    if (p) *out = p->stats;
}

void base_pool_run(base_pool *p, int64_t n_tasks, base_task_fn fn, void *ctx)
{
    if (n_tasks <= 0) return;
    if (!p || p->n_started == 0 || n_tasks == 1 || n_tasks > 0xffffffffll) {
        if (p && p->prof) {
            p->stats.runs_inline++;
            p->stats.tasks += n_tasks;
        }
        for (int64_t t = 0; t < n_tasks; t++) fn(ctx, t, 0);
        return;
    }
    uint64_t t0 = p->prof ? base_time_ns() : 0;
    uint64_t gen = atomic_load(&p->generation) + 1;
    /* First close the claim of the last job: a worker that read its claim
     * (all tasks taken: idx == its n_tasks) could otherwise read this job's
     * larger n_tasks, pass the bound, and win its CAS before the new claim
     * is stored — running a task of a job not yet published, with a mix of
     * the two jobs' fields, and counting it in `done` (the caller then
     * returned while the task still ran: seen by TSan in fuzz_memory
     * --config 4, and as rare crashes under load). A claim of this
     * generation with no task left fails every stale CAS and every bound. */
    atomic_store_explicit(&p->claim, (gen & 0xffffffffu) << 32 | 0xffffffffu, memory_order_seq_cst);
    /* release, paired with pool_work's acquire loads: a worker that sees any
     * of these new fields sees the closed claim too, and its CAS fails */
    atomic_store_explicit(&p->n_tasks, n_tasks, memory_order_release);
    atomic_store_explicit(&p->fn, fn, memory_order_release);
    atomic_store_explicit(&p->ctx, ctx, memory_order_release);
    atomic_store_explicit(&p->per_thread, false, memory_order_relaxed);
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    atomic_store_explicit(&p->claim, (gen & 0xffffffffu) << 32, memory_order_release);
    atomic_store(&p->generation, gen); /* seq_cst: publishes the job, pairs with n_sleeping */
    pool_wake(p);
    pool_work(p, gen, 0);
    if (t0) {
        uint64_t t1 = base_time_ns();
        pool_wait_done(p, n_tasks);
        uint64_t t2 = base_time_ns();
        p->stats.runs++;
        p->stats.tasks += n_tasks;
        p->stats.run_ns += t2 - t0;
        p->stats.wait_ns += t2 - t1;
        return;
    }
    pool_wait_done(p, n_tasks);
}

void base_pool_run_per_thread(base_pool *p, base_task_fn fn, void *ctx)
{
    if (!p || p->n_started == 0) {
        fn(ctx, 0, 0);
        return;
    }
    uint64_t gen = atomic_load(&p->generation) + 1;
    atomic_store_explicit(&p->fn, fn, memory_order_relaxed);
    atomic_store_explicit(&p->ctx, ctx, memory_order_relaxed);
    atomic_store_explicit(&p->per_thread_left, p->n_started, memory_order_relaxed);
    atomic_store_explicit(&p->claim, (gen & 0xffffffffu) << 32 | 0xffffffffu, memory_order_relaxed);
    atomic_store_explicit(&p->per_thread, true, memory_order_release);
    atomic_store(&p->generation, gen);
    pool_wake(p);
    fn(ctx, 0, 0);
    for (int i = 0; atomic_load_explicit(&p->per_thread_left, memory_order_acquire) > 0; i++) {
        if (i < 4096)
            POOL_PAUSE();
        else
            sched_yield();
    }
}
