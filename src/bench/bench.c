/*
 * bench.c — keel_bench_run: the registry of benchmarks, output helpers and
 * the memory-bandwidth reference every benchmark reports beside its timings.
 */
#include "bench.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

typedef struct bench_entry {
    const char *name;
    keel_status (*fn)(int argc, char **argv, bench_out *o);
} bench_entry;

static const bench_entry g_benches[] = {
    {"kernels", bench_kernels},
    {"attention", bench_attention},
    {"model", bench_model},
    {"session", bench_session},
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
    return base_err(err, KEEL_ENOENT, "unknown benchmark '%s' (kernels, attention, model, session)", name);
}

/* ---- read bandwidth ------------------------------------------------------ */

typedef struct bw_ctx {
    const uint8_t *buf;
    size_t bytes;
    int n_threads;
    double sums[256];
} bw_ctx;

static void bw_task(void *vctx, int64_t task, int thread)
{
    (void)thread;
    bw_ctx *c = vctx;
    size_t per = c->bytes / (size_t)c->n_threads;
    per &= ~(size_t)255;
    const uint8_t *p = c->buf + (size_t)task * per;
#if defined(__AVX2__)
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < per; i += 128) {
        a0 = _mm256_xor_si256(a0, _mm256_load_si256((const __m256i *)(p + i)));
        a1 = _mm256_xor_si256(a1, _mm256_load_si256((const __m256i *)(p + i + 32)));
        a2 = _mm256_xor_si256(a2, _mm256_load_si256((const __m256i *)(p + i + 64)));
        a3 = _mm256_xor_si256(a3, _mm256_load_si256((const __m256i *)(p + i + 96)));
    }
    a0 = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
    c->sums[task] = (double)_mm256_extract_epi64(a0, 0);
#else
    const uint64_t *q = (const uint64_t *)p;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i < per / 8; i += 4) {
        s0 ^= q[i];
        s1 ^= q[i + 1];
        s2 ^= q[i + 2];
        s3 ^= q[i + 3];
    }
    c->sums[task] = (double)(s0 ^ s1 ^ s2 ^ s3);
#endif
}

double bench_read_bw_gbps(base_pool *pool, size_t buf_bytes, int reps)
{
    if (buf_bytes == 0) buf_bytes = (size_t)1 << 30;
    if (reps <= 0) reps = 3;
    uint8_t *buf = base_alloc(buf_bytes);
    if (!buf) return -1.0;
    memset(buf, 1, buf_bytes); /* fault the pages in */
    bw_ctx c = {buf, buf_bytes, base_pool_threads(pool), {0}};
    if (c.n_threads > 256) c.n_threads = 256;
    double best = 0.0;
    for (int r = 0; r < reps; r++) {
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
