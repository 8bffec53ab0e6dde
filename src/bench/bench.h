/*
 * bench.h — private interface of src/bench: the benchmark registry, output
 * helpers (table and JSON through the caller's keel_write_fn) and the
 * shared reference measurements (memory read bandwidth).
 * src/bench sits above every other module and may include any of them.
 */
#ifndef KEEL_BENCH_H
#define KEEL_BENCH_H

#include "../base/base.h"

typedef struct bench_out {
    keel_write_fn write;
    void *user;
    bool json; /* --json given */
    char *err; /* [BASE_ERR_CAP] what failed, or NULL */
} bench_out;

/* A flag a benchmark accepts; value: it takes one. */
typedef struct bench_flag {
    const char *name;
    bool value;
} bench_flag;

/* Every argument must be one of spec's flags (with its value when it takes
 * one) or "--json": else KEEL_EINVAL, the unknown option, stray argument or
 * missing value named in o->err ("bench kernels: unknown option '--bogus'"). */
keel_status bench_check_args(bench_out *o, const char *bench, int argc, char **argv,
                             const bench_flag *spec, size_t n_spec);
/* The integer after flag name (def when absent): the whole value a decimal
 * in [lo, hi], else KEEL_EINVAL named in o->err. */
keel_status bench_int_opt(bench_out *o, const char *bench, int argc, char **argv, const char *name,
                          int64_t lo, int64_t hi, int64_t def, int64_t *out);

/* printf into the sink (chunks of up to 4 KiB). */
void bench_printf(bench_out *o, const char *fmt, ...) BASE_PRINTF(2, 3);

/* Memory read bandwidth in GB/s (1e9 bytes/s) with n_threads threads over a
 * buffer of buf_bytes (use >> L3: 1 GiB by default when 0). Best of reps,
 * each rep the better of a plain read and one that prefetches 3 KiB ahead
 * (as the matvec kernels do: on some machines the streamers alone leave
 * bandwidth unused, and a kernel must not beat its reference). Returns a
 * negative value if the buffer cannot be allocated. */
double bench_read_bw_gbps(base_pool *pool, size_t buf_bytes, int reps);

/* Read bandwidth of the calling thread over a buffer of `bytes` that stays
 * in cache (read `iters` times per timing, best of reps): the reference of
 * the in-cache kernel figures. Negative if the buffer cannot be allocated. */
double bench_read_cached_gbps(size_t bytes, int iters, int reps);

/* fp32 FMA peak in GFLOP/s with the pool's threads running a register-only
 * FMA loop at once, at SIMD level `level` (tensor_simd: 0 scalar, 1 avx2 ymm,
 * 2 avx512 zmm; clamped to what the CPU has). Best of reps runs of about
 * 20 ms each. */
double bench_fma_peak_gflops(base_pool *pool, int level, int reps);
/* f32 lanes of one vector FMA at SIMD level `level` (16 / 8 / 1): the
 * peak's flops are 2 x lanes per FMA instruction. */
double bench_simd_lanes(int level);

/* Vector multiply instructions per cell and KV head of one decode
 * attention step with G query rows per KV head and head dims dk / dv, K and
 * V of dtype kv, at SIMD level `level` (0 scalar: one per value, 1 AVX2, 2
 * AVX-512): the scores (f16 / f32 keys: one FMA per lane; q8_0 / q4_0 keys:
 * int8 dots, AVX2 vpmaddubsw + vpmaddwd per 32 bytes, AVX-512 one vpdpbusd
 * per 64) plus p.V (one f32 FMA per lane and row). The floor of the
 * kernel's multiply-pipe work, the softmax, conversions and reductions left
 * out; bench attention reports the bound it sets beside the read
 * bandwidth. */
double bench_attn_muls(int level, keel_dtype kv, int32_t G, int32_t dk, int32_t dv);

/* The reference loops (bench_avx2.c / bench_avx512.c; call only when the CPU
 * has the level): xor of every byte of p[0..bytes) (32-byte aligned, bytes
 * a multiple of 128) in 32-byte loads, asking pf bytes ahead for the lines
 * to come when pf > 0; iters iterations of 12 FMA chains (2 * 8 * 12 and
 * 2 * 16 * 12 flops per iteration). */
uint64_t bench_read_avx2(const uint8_t *p, size_t bytes, size_t pf);
float bench_fma_avx2(int64_t iters);
float bench_fma_avx512(int64_t iters);

/* Parses "--json" and returns the index of the first unparsed argument;
 * benchmarks parse their own other options. */
bool bench_has_flag(int argc, char **argv, const char *flag);
/* Value after "--name" or NULL. */
const char *bench_opt(int argc, char **argv, const char *name);

/* Benchmarks (one per file in src/bench). */
keel_status bench_kernels(int argc, char **argv, bench_out *o);
keel_status bench_attention(int argc, char **argv, bench_out *o);
keel_status bench_model(int argc, char **argv, bench_out *o);
keel_status bench_session(int argc, char **argv, bench_out *o);
keel_status bench_grammar(int argc, char **argv, bench_out *o);
keel_status bench_spec(int argc, char **argv, bench_out *o);

#endif /* KEEL_BENCH_H */
