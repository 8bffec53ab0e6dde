/*
 * bench.c — keel_bench_run: the registry of benchmarks, output helpers and
 * the memory-bandwidth reference every benchmark reports beside its timings.
 */
#include "bench.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tensor/tensor.h"

typedef struct bench_entry {
    const char *name;
    keel_status (*fn)(int argc, char **argv, bench_out *o);
} bench_entry;

static const bench_entry g_benches[] = {
    {"kernels", bench_kernels},
    {"attention", bench_attention},
    {"model", bench_model},
    {"session", bench_session},
    {"grammar", bench_grammar},
    {"spec", bench_spec},
};

void bench_printf(bench_out *o, const char *fmt, ...)
{
    char buf[4096];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n >= sizeof buf) n = (int)sizeof buf - 1;
    if (o->write) o->write(o->user, buf, (size_t)n);
}

bool bench_has_flag(int argc, char **argv, const char *flag)
{
    for (int i = 0; i < argc; i++)
        if (strcmp(argv[i], flag) == 0) return true;
    return false;
}

const char *bench_opt(int argc, char **argv, const char *name)
{
    for (int i = 0; i + 1 < argc; i++)
        if (strcmp(argv[i], name) == 0) return argv[i + 1];
    return NULL;
}

keel_status bench_check_args(bench_out *o, const char *bench, int argc, char **argv,
                             const bench_flag *spec, size_t n_spec)
{
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--json") == 0) continue;
        const bench_flag *f = NULL;
        for (size_t k = 0; k < n_spec && !f; k++)
            if (strcmp(a, spec[k].name) == 0) f = &spec[k];
        if (!f)
            return base_err(o->err, KEEL_EINVAL, "bench %s: %s '%s'", bench,
                            a[0] == '-' ? "unknown option" : "unexpected argument", a);
        if (f->value && ++i >= argc)
            return base_err(o->err, KEEL_EINVAL, "bench %s: option %s needs a value", bench, a);
    }
    return KEEL_OK;
}

keel_status bench_int_opt(bench_out *o, const char *bench, int argc, char **argv, const char *name,
                          int64_t lo, int64_t hi, int64_t def, int64_t *out)
{
    const char *v = bench_opt(argc, argv, name);
    *out = def;
    if (!v) return KEEL_OK;
    char *end = NULL;
    errno = 0;
    long long x = (v[0] == '-' || (v[0] >= '0' && v[0] <= '9')) ? strtoll(v, &end, 10) : 0;
    if (!end || end == v || *end || errno || x < lo || x > hi)
        return base_err(o->err, KEEL_EINVAL, "bench %s: %s %s: must be an integer in [%lld, %lld]",
                        bench, name, v, (long long)lo, (long long)hi);
    *out = x;
    return KEEL_OK;
}

keel_status keel_bench_run(const char *name, int argc, char **argv, keel_write_fn out, void *user,
                           char *err)
{
    if (err) err[0] = 0;
    if (!name || argc < 0 || (argc && !argv)) return base_err(err, KEEL_EINVAL, "bad argument");
    bench_out o = {out, user, bench_has_flag(argc, argv, "--json"), err};
    for (size_t i = 0; i < BASE_ARRAY_LEN(g_benches); i++)
        if (strcmp(g_benches[i].name, name) == 0) return g_benches[i].fn(argc, argv, &o);
    return base_err(err, KEEL_ENOENT, "unknown benchmark '%s' (kernels, attention, model, session, grammar, spec)", name);
}

/* ---- read bandwidth ------------------------------------------------------ */

typedef struct bw_ctx {
    const uint8_t *buf;
    size_t bytes, pf;
    int n_threads;
    double sums[256];
} bw_ctx;

/* Reads bytes (a multiple of 256) at p, prefetching pf ahead (0: none),
 * with the widest loads the CPU has, whatever level is forced: the
 * reference is the machine's bandwidth. */
static uint64_t read_bytes(const uint8_t *p, size_t bytes, size_t pf)
{
    if (tensor_simd_best() >= TENSOR_SIMD_AVX2) return bench_read_avx2(p, bytes, pf);
    const uint64_t *q = (const uint64_t *)(const void *)p;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i < bytes / 8; i += 4) {
        s0 ^= q[i];
        s1 ^= q[i + 1];
        s2 ^= q[i + 2];
        s3 ^= q[i + 3];
    }
    return s0 ^ s1 ^ s2 ^ s3;
}

static void bw_task(void *vctx, int64_t task, int thread)
{
    (void)thread;
    bw_ctx *c = vctx;
    size_t per = c->bytes / (size_t)c->n_threads;
    per &= ~(size_t)255;
    c->sums[task] = (double)read_bytes(c->buf + (size_t)task * per, per, c->pf);
}

double bench_read_bw_gbps(base_pool *pool, size_t buf_bytes, int reps)
{
    if (buf_bytes == 0) buf_bytes = (size_t)1 << 30;
    if (reps <= 0) reps = 3;
    uint8_t *buf = base_alloc(buf_bytes);
    if (!buf) return -1.0;
    memset(buf, 1, buf_bytes); /* fault the pages in */
    bw_ctx c = {buf, buf_bytes, 0, base_pool_threads(pool), {0}};
    if (c.n_threads > 256) c.n_threads = 256;
    double best = 0.0;
    for (int r = 0; r < reps; r++)
        for (int k = 0; k < 2; k++) {
            c.pf = k ? 3072 : 0;
            uint64_t t0 = base_time_ns();
            base_pool_run(pool, c.n_threads, bw_task, &c);
            uint64_t t1 = base_time_ns();
            size_t per = (buf_bytes / (size_t)c.n_threads) & ~(size_t)255;
            double gbps = (double)(per * (size_t)c.n_threads) / (double)(t1 - t0);
            if (gbps > best) best = gbps;
        }
    base_free(buf, buf_bytes);
    return best;
}

double bench_read_cached_gbps(size_t bytes, int iters, int reps)
{
    bytes &= ~(size_t)255;
    if (bytes == 0 || iters <= 0 || reps <= 0) return -1.0;
    uint8_t *buf = base_alloc(bytes);
    if (!buf) return -1.0;
    memset(buf, 1, bytes);
    volatile uint64_t sink = read_bytes(buf, bytes, 0); /* warm */
    double best = 0.0;
    for (int r = 0; r < reps; r++) {
        uint64_t t0 = base_time_ns(), acc = 0;
        for (int i = 0; i < iters; i++) acc ^= read_bytes(buf, bytes, 0);
        uint64_t t1 = base_time_ns();
        sink = acc;
        double gbps = (double)bytes * iters / (double)(t1 - t0 ? t1 - t0 : 1);
        if (gbps > best) best = gbps;
    }
    (void)sink;
    base_free(buf, bytes);
    return best;
}

/* ---- fp32 FMA peak -------------------------------------------------------- */

typedef struct fma_ctx {
    int level;
    int64_t iters;
    volatile float sink[256];
} fma_ctx;

/* 12 scalar chains, as the SIMD loops (the compiler may vectorize them: the
 * scalar level's peak is whatever its code reaches) */
static float fma_scalar(int64_t iters)
{
    float c[12];
    for (int k = 0; k < 12; k++) c[k] = 1.0f + (float)k * 1e-3f;
    for (int64_t i = 0; i < iters; i++)
        for (int k = 0; k < 12; k++) c[k] = c[k] * 0.999999f + 1e-6f;
    float s = 0.0f;
    for (int k = 0; k < 12; k++) s += c[k];
    return s;
}

static void fma_task(void *vctx, int64_t task, int thread)
{
    (void)thread;
    fma_ctx *c = vctx;
    float r = c->level >= 2 ? bench_fma_avx512(c->iters)
              : c->level == 1 ? bench_fma_avx2(c->iters)
                              : fma_scalar(c->iters);
    c->sink[task & 255] = r;
}

double bench_simd_lanes(int level)
{
    return level >= 2 ? 16.0 : level == 1 ? 8.0 : 1.0;
}

static double fma_flops_per_iter(int level)
{
    return 2.0 * 12.0 * bench_simd_lanes(level);
}

double bench_fma_peak_gflops(base_pool *pool, int level, int reps)
{
    int best_level = (int)tensor_simd_best();
    if (level > best_level) level = best_level;
    if (level < 0) level = 0;
    if (reps <= 0) reps = 3;
    int nt = base_pool_threads(pool);
    fma_ctx c;
    memset(&c, 0, sizeof c);
    c.level = level;
    /* size the run to about 20 ms per thread from a short calibration */
    c.iters = 1 << 14;
    uint64_t t0 = base_time_ns();
    base_pool_run_per_thread(pool, fma_task, &c);
    double ns = (double)(base_time_ns() - t0);
    c.iters = (int64_t)((double)c.iters * 2e7 / (ns > 1.0 ? ns : 1.0));
    if (c.iters < (1 << 14)) c.iters = 1 << 14;
    double best = 0.0;
    for (int r = 0; r < reps; r++) {
        t0 = base_time_ns();
        base_pool_run_per_thread(pool, fma_task, &c);
        ns = (double)(base_time_ns() - t0);
        double g = fma_flops_per_iter(level) * (double)c.iters * nt / ns;
        if (g > best) best = g;
    }
    return best;
}
