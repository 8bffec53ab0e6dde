/*
 * base.h — private interface of src/base: allocation through the hooks,
 * checked size arithmetic, bounded arenas, error strings, logging, the
 * thread pool and hashing. Every other module builds on these.
 */
#ifndef KEEL_BASE_H
#define KEEL_BASE_H

#include "keel.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define BASE_ALIGN 64 /* alignment of every allocation of >= 64 bytes and of arenas */

#define BASE_MIN(a, b) ((a) < (b) ? (a) : (b))
#define BASE_MAX(a, b) ((a) > (b) ? (a) : (b))
#define BASE_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#if defined(__GNUC__)
#define BASE_PRINTF(f, a) __attribute__((format(printf, f, a)))
#define BASE_LIKELY(x) __builtin_expect(!!(x), 1)
#define BASE_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define BASE_PRINTF(f, a)
#define BASE_LIKELY(x) (x)
#define BASE_UNLIKELY(x) (x)
#endif

/* ---- allocation (all library memory goes through these) ---------------- */

/* NULL on failure or size 0. Aligned to BASE_ALIGN when size >= 64. */
void *base_alloc(size_t size);
/* Zeroed n*size bytes; NULL on failure or overflow. */
void *base_calloc(size_t n, size_t size);
/* Resize; on failure returns NULL and ptr is untouched. */
void *base_realloc(void *ptr, size_t old_size, size_t new_size);
/* Frees ptr of the given size; NULL is a no-op. */
void base_free(void *ptr, size_t size);
/* Duplicates a NUL-terminated string (size strlen+1); NULL on failure. */
char *base_strdup(const char *s);
/* Frees a string made by base_strdup. */
void base_strfree(char *s);

/* ---- checked size arithmetic: return false on overflow ------------------ */

static inline bool size_add(size_t a, size_t b, size_t *out)
{
    return !__builtin_add_overflow(a, b, out);
}

static inline bool size_mul(size_t a, size_t b, size_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}

/* out = a * b + c */
static inline bool size_mul_add(size_t a, size_t b, size_t c, size_t *out)
{
    size_t t;
    return size_mul(a, b, &t) && size_add(t, c, out);
}

/* Rounds a up to a multiple of align (a power of two). */
static inline bool size_align_up(size_t a, size_t align, size_t *out)
{
    size_t t;
    if (!size_add(a, align - 1, &t)) return false;
    *out = t & ~(align - 1);
    return true;
}

/* Signed element counts to size_t, refusing negatives. */
static inline bool size_from_i64(int64_t v, size_t *out)
{
    if (v < 0 || (uint64_t)v > (uint64_t)SIZE_MAX) return false;
    *out = (size_t)v;
    return true;
}

/* Length (1..4) of the well-formed UTF-8 character at s[0..n), or 0 when
 * s[0] does not start one: a stray continuation byte, an overlong form, a
 * surrogate, beyond U+10FFFF, or cut off by n. n >= 1. */
static inline size_t base_utf8_len(const uint8_t *s, size_t n)
{
    uint8_t c = s[0];
    if (c < 0x80) return 1;
    size_t len = (c >= 0xc2 && c <= 0xdf) ? 2 : (c >= 0xe0 && c <= 0xef) ? 3 : (c >= 0xf0 && c <= 0xf4) ? 4 : 0;
    if (len == 0 || len > n) return 0;
    for (size_t i = 1; i < len; i++)
        if ((s[i] & 0xc0) != 0x80) return 0;
    if ((c == 0xe0 && s[1] < 0xa0) || (c == 0xed && s[1] >= 0xa0) || (c == 0xf0 && s[1] < 0x90) ||
        (c == 0xf4 && s[1] >= 0x90))
        return 0;
    return len;
}

/* ---- bounded arenas ----------------------------------------------------- */

/*
 * A fixed-capacity bump allocator. Memory is reserved once (base_arena_init)
 * and handed out by base_arena_take; a take beyond capacity returns NULL and
 * changes nothing (never an overrun). high records the most ever in use, so
 * tests can check that an operation's scratch does not grow with context.
 */
typedef struct base_arena {
    uint8_t *data; /* [cap] bytes, BASE_ALIGN aligned; owned */
    size_t cap;    /* bytes reserved */
    size_t used;   /* bytes handed out since the last reset */
    size_t high;   /* high-water mark of used */
} base_arena;

/* Reserves cap bytes. KEEL_ENOMEM on failure (arena left empty). */
keel_status base_arena_init(base_arena *a, size_t cap);
/* Releases the reservation; the arena becomes empty. NULL-safe. */
void base_arena_free(base_arena *a);
/* size bytes aligned to align (power of two, <= BASE_ALIGN); NULL if they
 * do not fit. Not zeroed. */
void *base_arena_take(base_arena *a, size_t size, size_t align);
/* Typed helper: n elements of elem bytes, 64-byte aligned; NULL on overflow
 * or exhaustion. */
void *base_arena_take_n(base_arena *a, size_t n, size_t elem);
/* A mark to rewind to (the current used). */
static inline size_t base_arena_mark(const base_arena *a)
{
    return a->used;
}
/* Rewinds to a mark taken earlier. */
static inline void base_arena_rewind(base_arena *a, size_t mark)
{
    if (mark <= a->used) a->used = mark;
}
static inline void base_arena_reset(base_arena *a)
{
    a->used = 0;
}

/* ---- error strings ------------------------------------------------------ */

#define BASE_ERR_CAP 256

/* Formats into buf[BASE_ERR_CAP] (truncating) and returns status, so that
 * callers can write `return base_err(obj->err, KEEL_EINVAL, "...", ...)`. */
keel_status base_err(char *buf, keel_status status, const char *fmt, ...) BASE_PRINTF(3, 4);

/* ---- logging ------------------------------------------------------------ */

void base_log(keel_log_level level, const char *fmt, ...) BASE_PRINTF(2, 3);

/* ---- clock -------------------------------------------------------------- */

uint64_t base_time_ns(void);

/* ---- thread pool -------------------------------------------------------- */

/*
 * A fixed set of worker threads (256 KiB stacks, design.md rule 8) that run
 * parallel-for jobs. The calling thread takes part as thread 0, so a pool of
 * n threads starts n-1 workers; a pool of 1 runs everything inline. Workers
 * spin briefly for the next job (decode issues hundreds of small jobs per
 * token) and then sleep. One job at a time per pool; not reentrant.
 */
typedef struct base_pool base_pool;

/* fn(ctx, task, thread): runs once for each task in [0, n_tasks) on thread
 * ids in [0, n_threads). */
typedef void (*base_task_fn)(void *ctx, int64_t task, int thread);

/* n_threads <= 0 means keel_cpu_count(). KEEL_ENOMEM / KEEL_EINTERNAL on
 * failure (nothing leaked). */
keel_status base_pool_open(int n_threads, base_pool **out);
void base_pool_close(base_pool *pool);
/* Bytes base_pool_open(n_threads) allocates through the hooks (thread
 * stacks are the system's and not included). */
size_t base_pool_bytes(int n_threads);
int base_pool_threads(const base_pool *pool);
/* Runs fn over [0, n_tasks), tasks handed out dynamically, and returns when
 * all are done. pool may be NULL (runs inline on thread 0). */
void base_pool_run(base_pool *pool, int64_t n_tasks, base_task_fn fn, void *ctx);
/* Runs fn exactly once per thread with task == thread id. */
void base_pool_run_per_thread(base_pool *pool, base_task_fn fn, void *ctx);

/* Counters of a pool's jobs while profiling is on (base_pool_profile; off
 * by default, when nothing is timed): jobs run in parallel and inline,
 * their tasks, the caller's wall time inside parallel jobs and the part of
 * it spent waiting for other threads after its own claims ran out (load
 * imbalance and wake-up latency). The caller's thread only; NULL pool:
 * no-op / zeros. */
typedef struct base_pool_stats {
    int64_t runs, runs_inline, tasks;
    uint64_t run_ns, wait_ns;
} base_pool_stats;
void base_pool_profile(base_pool *pool, bool on);
void base_pool_stats_get(const base_pool *pool, base_pool_stats *out);

/* ---- hashing ------------------------------------------------------------ */

uint64_t base_hash64(const void *data, size_t n, uint64_t seed);

/* ---- deterministic PRNG (tests, seeded signs, gen-model) ---------------- */

typedef struct base_rng {
    uint64_t s[4];
} base_rng;

void base_rng_seed(base_rng *r, uint64_t seed);
uint64_t base_rng_next(base_rng *r);
/* Uniform in [0, 1). */
double base_rng_uniform(base_rng *r);
/* Standard normal (Box-Muller). */
double base_rng_normal(base_rng *r);
/* Uniform integer in [0, n), n > 0. */
uint64_t base_rng_below(base_rng *r, uint64_t n);

#endif /* KEEL_BASE_H */
