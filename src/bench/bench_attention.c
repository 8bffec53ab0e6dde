/*
 * bench_attention.c — `keel bench attention [--json] [--ctx N,...] [--quick]`:
 * decode attention over the cache and position-edit cost.
 *
 * Decode: one query token per step over a memory of 32 layers, each with 8
 * KV heads of dimension 128 and 32 query heads (GQA 4), at several context
 * lengths, for f16 / q8_0 / q4_0 K and V, Hadamard rotation on and off, with
 * 1 and 2 threads. A step attends all 32 layers, so the rows read per token
 * are 32 layers' worth (far more than the L3 for ctx >= 4096). gbps is the
 * K and V bytes read per token divided by the time per token, reported
 * beside two references measured in the same run: the machine's read
 * bandwidth, and the multiply bound, the GB/s at which the step's vector
 * multiplies alone (bench_attn_muls) would take all its time if they ran at
 * the fp32 FMA peak. A kernel below the second bound is held by its
 * arithmetic, not by memory; where the multiply bound is itself below the
 * read bandwidth, no kernel doing these multiplies reaches the bandwidth.
 *
 * Options: --ctx N,N,...  --kv f16|q8_0|q4_0  --quick
 *          --shape LAYERS,KV_HEADS,HEADS,DIM: another model's attention
 *          (12,4,12,64 is the 124M test model's), the same figures
 *          --tokens N (2..64): a speculative verify batch instead, N
 *          tokens of one sequence at the last N positions in one call,
 *          each seeing the cells at or before its own, beside the same
 *          N tokens attended one call each (the same job as N decode
 *          steps), per step of all layers
 *
 * Edit: seq_add over every cell of a 32-layer memory (all keys re-encoded),
 * in ns per changed cell.
 */
#include "bench.h"
#include "../memory/attn_kernels.h"
#include "../memory/memory.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the memory's shape: --shape LAYERS,KV_HEADS,HEADS,DIM (32,8,32,128) */
typedef struct ba_shape {
    int32_t layers, kv_heads, heads, dim;
} ba_shape;

typedef struct ba_case {
    keel_dtype kv;
    bool rot;
} ba_case;

static keel_status ba_open(const ba_shape *sh, keel_dtype kv, bool rot, int32_t ctx, int32_t n_batch,
                           keel_mem **out, keel_mem_layer *layers)
{
    for (int i = 0; i < sh->layers; i++) {
        keel_mem_layer *l = &layers[i];
        *l = keel_mem_layer_default();
        l->kind = KEEL_MEM_LAYER_FULL;
        l->n_kv_heads = sh->kv_heads;
        l->n_heads = sh->heads;
        l->head_dim_k = l->head_dim_v = sh->dim;
        l->k_dtype = l->v_dtype = kv;
        l->k_rot.enabled = l->v_rot.enabled = rot;
        l->k_rot.seed = l->v_rot.seed = 1234;
        l->rope.n_rot = sh->dim;
    }
    keel_mem_config cfg = keel_mem_config_default();
    cfg.layers = layers;
    cfg.n_layers = sh->layers;
    cfg.n_ctx = ctx;
    cfg.n_batch_max = n_batch;
    cfg.n_threads = 2;
    return keel_mem_open(&cfg, out, NULL);
}

/* Places ctx tokens of sequence 0 and fills every K/V row with valid
 * encoded data (a few hundred distinct random rows, tiled). */
static keel_status ba_fill(const ba_shape *sh, keel_mem *m, int32_t ctx, int32_t n_batch)
{
    int32_t *pos = base_alloc((size_t)n_batch * sizeof(int32_t));
    int32_t *seq = base_calloc((size_t)n_batch, sizeof(int32_t));
    int32_t *cells = base_alloc((size_t)n_batch * sizeof(int32_t) * (size_t)m->n_groups);
    keel_status st = pos && seq && cells ? KEEL_OK : KEEL_ENOMEM;
    for (int32_t p = 0; st == KEEL_OK && p < ctx; p += n_batch) {
        int32_t n = BASE_MIN(n_batch, ctx - p);
        for (int32_t i = 0; i < n; i++) pos[i] = p + i;
        keel_mem_batch b = {n, pos, seq, NULL, NULL, NULL};
        st = keel_mem_place(m, &b, cells);
    }
    base_free(pos, (size_t)n_batch * sizeof(int32_t));
    base_free(seq, (size_t)n_batch * sizeof(int32_t));
    base_free(cells, (size_t)n_batch * sizeof(int32_t) * (size_t)m->n_groups);
    if (st != KEEL_OK) return st;
    mem_table *t = &m->groups[0].tables[0];
    enum { DISTINCT = 256 };
    size_t hrb = t->cols[0].head_row_bytes;
    uint8_t *rows = base_alloc(DISTINCT * hrb);
    float *x = base_alloc((size_t)sh->dim * sizeof(float));
    if (!rows || !x) {
        base_free(rows, DISTINCT * hrb);
        base_free(x, (size_t)sh->dim * sizeof(float));
        return KEEL_ENOMEM;
    }
    base_rng r;
    base_rng_seed(&r, 99);
    for (int i = 0; i < DISTINCT; i++) {
        for (int j = 0; j < sh->dim; j++) x[j] = (float)base_rng_normal(&r);
        mem_col_encode(&t->cols[0], x, rows + (size_t)i * hrb);
    }
    for (int32_t c = 0; c < t->n_cols; c++) {
        mem_col *col = &t->cols[c];
        for (int32_t h = 0; h < col->n_heads; h++)
            for (int32_t cell = 0; cell < t->cap; cell++)
                memcpy(mem_col_row(t, col, h, cell),
                       rows + (size_t)((cell * 7 + h * 13 + c) % DISTINCT) * hrb, hrb);
    }
    base_free(rows, DISTINCT * hrb);
    base_free(x, (size_t)sh->dim * sizeof(float));
    return KEEL_OK;
}

double bench_attn_muls(int level, keel_dtype kv, int32_t G, int32_t dk, int32_t dv)
{
    double lanes = bench_simd_lanes(level);
    bool quant = kv == KEEL_DTYPE_Q8_0 || kv == KEEL_DTYPE_Q4_0;
    double scores;
    if (!quant || level == 0)
        scores = (double)G * dk / lanes;
    else if (level == 1)
        scores = 2.0 * G * dk / 32.0; /* vpmaddubsw + vpmaddwd per 32 bytes */
    else
        scores = (double)G * dk / 64.0; /* vpdpbusd per 64 bytes */
    /* the AVX-512 decode kernel's q8_0 p . V: one vpdpwssd per 16 columns
     * and pair of cells (15-bit weights) */
    if (level >= 2 && kv == KEEL_DTYPE_Q8_0) return scores + (double)G * dv / 32.0;
    return scores + (double)G * dv / lanes;
}

/* Seconds per decode token (all layers), best of reps. */
static double ba_decode(const ba_shape *sh, keel_mem *m, int32_t ctx, int reps, float *q, float *out)
{
    int32_t pos = ctx - 1, seq = 0;
    keel_mem_attn a = {1, sh->heads, q, &pos, &seq, out, 0.0f, 0.0f, NULL, NULL, NULL, 0, 0, NULL};
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        uint64_t t0 = base_time_ns();
        for (int32_t l = 0; l < sh->layers; l++)
            if (keel_mem_attend(m, l, &a) != KEEL_OK) return -1.0;
        double s = (double)(base_time_ns() - t0) * 1e-9;
        if (s < best) best = s;
    }
    return best;
}

/* Seconds per step (all layers) of the last n tokens of the context:
 * one call for all of them (one) or one call per token, best of reps. */
static double ba_verify(const ba_shape *sh, keel_mem *m, int32_t ctx, int32_t n, bool one, int reps,
                        const float *q, float *out)
{
    int32_t pos[64], seq[64] = {0};
    for (int32_t i = 0; i < n; i++) pos[i] = ctx - n + i;
    size_t qs = (size_t)sh->heads * (size_t)sh->dim;
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        uint64_t t0 = base_time_ns();
        for (int32_t l = 0; l < sh->layers; l++)
            for (int32_t i = 0; i < (one ? 1 : n); i++) {
                keel_mem_attn a = {one ? n : 1, sh->heads, q + (size_t)i * qs, &pos[i], &seq[i], out + (size_t)i * qs,
                                   0.0f, 0.0f, NULL, NULL, NULL, 0, 0, NULL};
                if (keel_mem_attend(m, l, &a) != KEEL_OK) return -1.0;
            }
        double s = (double)(base_time_ns() - t0) * 1e-9;
        if (s < best) best = s;
    }
    return best;
}

static bool parse_ctx_list(const char *s, int32_t *ctxs, int *n)
{
    *n = 0;
    while (s && *s && *n < 8) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 64 || v > (1 << 22)) return false;
        ctxs[(*n)++] = (int32_t)v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return false;
    }
    return *n > 0;
}

/* --tokens N: the verify batch beside N one-token calls, per case, context
 * and thread count; also the largest difference between their outputs
 * (float reordering only). */
static keel_status ba_verify_table(bench_out *o, const ba_shape *sh, const ba_case *cases, size_t n_cases,
                                   const char *only, const int32_t *ctxs, int n_ctx, int32_t n, bool quick,
                                   keel_mem_layer *layers, const float *q, float *out, float *out1)
{
    size_t qn = (size_t)n * (size_t)sh->heads * (size_t)sh->dim;
    if (o->json)
        bench_printf(o, "{\"simd\": \"%s\", \"tokens\": %d, \"layers\": %d, \"kv_heads\": %d, \"heads\": %d, "
                        "\"dim\": %d,\n \"verify\": [",
                     tensor_simd_name(), n, sh->layers, sh->kv_heads, sh->heads, sh->dim);
    else {
        bench_printf(o, "keel bench attention — a verify batch of %d tokens (one sequence, the last %d positions), "
                        "%d layers x %d KV heads x %d dims, %d query heads, %s kernels\n",
                     n, n, sh->layers, sh->kv_heads, sh->dim, sh->heads, tensor_simd_name());
        bench_printf(o, "reference (same run): the same %d tokens attended one call each (as %d decode steps)\n\n",
                     n, n);
        bench_printf(o, "| kv   | rot | ctx   | threads | us/batch | us/%2d calls | batch / calls | max |diff| |\n", n);
        bench_printf(o, "|------|-----|-------|---------|----------|-------------|---------------|------------|\n");
    }
    bool first = true;
    keel_status st = KEEL_OK;
    for (size_t ci = 0; ci < n_cases && st == KEEL_OK; ci++) {
        if (only && strcmp(only, keel_dtype_name(cases[ci].kv)) != 0) continue;
        for (int k = 0; k < n_ctx && st == KEEL_OK; k++) {
            int32_t ctx = BASE_MAX(ctxs[k], n);
            keel_mem *m = NULL;
            int32_t nb = BASE_MIN(ctx, 4096);
            st = ba_open(sh, cases[ci].kv, cases[ci].rot, ctx, nb, &m, layers);
            if (st == KEEL_OK) st = ba_fill(sh, m, ctx, nb);
            if (st != KEEL_OK) {
                base_err(o->err, st, "bench attention: %s cache of %d cells: %s", keel_dtype_name(cases[ci].kv),
                         ctx, m ? keel_mem_last_error(m) : keel_strerror(st));
                keel_mem_close(m);
                break;
            }
            double bytes = (double)sh->layers * ctx * sh->kv_heads * (double)tensor_row_bytes(cases[ci].kv, sh->dim);
            int reps = bytes > 1e9 ? 3 : bytes > 1e8 ? 5 : 20;
            if (quick) reps = BASE_MAX(2, reps / 4);
            for (int threads = 1; threads <= 2 && st == KEEL_OK; threads++) {
                base_pool *keep = m->pool;
                int32_t keep_n = m->n_threads;
                if (threads == 1) {
                    m->pool = NULL;
                    m->n_threads = 1;
                }
                /* alternating, so that a slow phase of the host hits both */
                double sb = 1e30, sc = 1e30;
                for (int round = 0; round < 3; round++) {
                    double b = ba_verify(sh, m, ctx, n, true, reps, q, out);
                    double c = ba_verify(sh, m, ctx, n, false, reps, q, out1);
                    if (b < 0 || c < 0) {
                        sb = -1.0;
                        break;
                    }
                    sb = BASE_MIN(sb, b);
                    sc = BASE_MIN(sc, c);
                }
                m->pool = keep;
                m->n_threads = keep_n;
                if (sb < 0) {
                    st = base_err(o->err, KEEL_EINTERNAL, "bench attention: %d tokens over %d %s cells: %s", n,
                                  ctx, keel_dtype_name(cases[ci].kv), keel_mem_last_error(m));
                    break;
                }
                double diff = 0.0;
                for (size_t i = 0; i < qn; i++) diff = BASE_MAX(diff, fabs((double)out[i] - (double)out1[i]));
                if (o->json)
                    bench_printf(o, "%s\n  {\"kv\": \"%s\", \"rot\": %s, \"ctx\": %d, \"threads\": %d, "
                                    "\"us_per_batch\": %.1f, \"us_per_calls\": %.1f, \"max_abs_diff\": %.3g}",
                                 first ? "" : ",", keel_dtype_name(cases[ci].kv), cases[ci].rot ? "true" : "false",
                                 ctx, threads, sb * 1e6, sc * 1e6, diff);
                else
                    bench_printf(o, "| %-4s | %-3s | %5d | %7d | %8.1f | %11.1f | %13.2f | %10.2g |\n",
                                 keel_dtype_name(cases[ci].kv), cases[ci].rot ? "on" : "off", ctx, threads,
                                 sb * 1e6, sc * 1e6, sb / sc, diff);
                first = false;
            }
            keel_mem_close(m);
        }
    }
    if (o->json && st == KEEL_OK) bench_printf(o, "\n ]}\n");
    return st;
}

keel_status bench_attention(int argc, char **argv, bench_out *o)
{
    int32_t ctxs[8] = {1024, 4096, 16384, 65536};
    int n_ctx = 4;
    static const bench_flag spec[] = {{"--quick", false}, {"--ctx", true}, {"--kv", true}, {"--shape", true},
                                       {"--tokens", true}};
    keel_status st = bench_check_args(o, "attention", argc, argv, spec, BASE_ARRAY_LEN(spec));
    if (st != KEEL_OK) return st;
    bool quick = bench_has_flag(argc, argv, "--quick");
    const char *cl = bench_opt(argc, argv, "--ctx");
    if (cl && !parse_ctx_list(cl, ctxs, &n_ctx))
        return base_err(o->err, KEEL_EINVAL,
                        "bench attention: --ctx %s: must be 1 to 8 comma-separated integers in [64, 4194304]",
                        cl);
    if (quick && !cl) n_ctx = 2;
    ba_shape shape = {32, 8, 32, 128}, *sh = &shape;
    const char *sl = bench_opt(argc, argv, "--shape");
    if (sl) {
        int used = 0;
        if (sscanf(sl, "%" SCNd32 ",%" SCNd32 ",%" SCNd32 ",%" SCNd32 "%n", &shape.layers, &shape.kv_heads,
                   &shape.heads, &shape.dim, &used) != 4 ||
            sl[used] != 0 || shape.layers < 1 || shape.layers > 256 || shape.kv_heads < 1 ||
            shape.kv_heads > 256 || shape.heads < shape.kv_heads || shape.heads > 1024 ||
            shape.heads % shape.kv_heads || shape.dim < 32 || shape.dim > 512 || shape.dim % 32)
            return base_err(o->err, KEEL_EINVAL,
                            "bench attention: --shape %s: must be LAYERS,KV_HEADS,HEADS,DIM with layers and KV "
                            "heads in [1, 256], heads a multiple of KV heads up to 1024, dim a multiple of 32 "
                            "in [32, 512]",
                            sl);
    }
    const char *only = bench_opt(argc, argv, "--kv");
    if (only && strcmp(only, "f16") != 0 && strcmp(only, "q8_0") != 0 && strcmp(only, "q4_0") != 0)
        return base_err(o->err, KEEL_EINVAL, "bench attention: --kv %s: must be f16, q8_0 or q4_0", only);

    int32_t n_tok = 1;
    const char *tl = bench_opt(argc, argv, "--tokens");
    if (tl) {
        char *end;
        long v = strtol(tl, &end, 10);
        if (end == tl || *end || v < 2 || v > 64)
            return base_err(o->err, KEEL_EINVAL, "bench attention: --tokens %s: must be an integer in [2, 64]", tl);
        n_tok = (int32_t)v;
    }
    const ba_case cases[] = {{KEEL_DTYPE_F16, false}, {KEEL_DTYPE_F16, true},
                             {KEEL_DTYPE_Q8_0, false}, {KEEL_DTYPE_Q8_0, true},
                             {KEEL_DTYPE_Q4_0, false}, {KEEL_DTYPE_Q4_0, true}};
    size_t qn = (size_t)n_tok * (size_t)sh->heads * (size_t)sh->dim;
    keel_mem_layer *layers = base_alloc((size_t)sh->layers * sizeof(keel_mem_layer));
    float *q = base_alloc(qn * sizeof(float));
    float *out = base_alloc(qn * sizeof(float));
    float *out1 = n_tok > 1 ? base_alloc(qn * sizeof(float)) : NULL;
    base_rng r;
    base_rng_seed(&r, 5);
    if (q)
        for (size_t i = 0; i < qn; i++) q[i] = (float)base_rng_normal(&r);
    if (n_tok > 1) {
        st = layers && q && out && out1
                 ? ba_verify_table(o, sh, cases, BASE_ARRAY_LEN(cases), only, ctxs, n_ctx, n_tok, quick, layers, q,
                                   out, out1)
                 : base_err(o->err, KEEL_ENOMEM, "bench attention: out of memory");
        goto done;
    }

    base_pool *p1 = NULL, *p2 = NULL;
    st = base_pool_open(1, &p1);
    if (st == KEEL_OK) st = base_pool_open(2, &p2);
    if (st != KEEL_OK) {
        base_pool_close(p1);
        return base_err(o->err, st, "bench attention: cannot start 2 threads");
    }
    double bw1 = bench_read_bw_gbps(p1, 0, 3), bw2 = bench_read_bw_gbps(p2, 0, 3);
    int level = (int)attn_path_active();
    double pk1 = bench_fma_peak_gflops(p1, level, 3), pk2 = bench_fma_peak_gflops(p2, level, 3);
    base_pool_close(p1);
    base_pool_close(p2);

    if (!layers || !q || !out || bw1 < 0 || bw2 < 0) {
        st = base_err(o->err, KEEL_ENOMEM, "bench attention: out of memory%s",
                      bw1 < 0 || bw2 < 0 ? " (the 1 GiB bandwidth buffer)" : "");
        goto done;
    }
    const char *path = tensor_simd_name(); /* the attention path is the SIMD level in force */
    if (o->json)
        bench_printf(o,
                     "{\"simd\": \"%s\", \"read_bw_gbps\": {\"1\": %.2f, \"2\": %.2f}, "
                     "\"fma_peak_gflops\": {\"1\": %.1f, \"2\": %.1f}, \"layers\": %d, \"kv_heads\": %d, "
                     "\"heads\": %d, \"dim\": %d,\n \"decode\": [",
                     path, bw1, bw2, pk1, pk2, sh->layers, sh->kv_heads, sh->heads, sh->dim);
    else {
        bench_printf(o, "keel bench attention — decode, %d layers x %d KV heads x %d dims, %d query heads, %s kernels\n",
                     sh->layers, sh->kv_heads, sh->dim, sh->heads, path);
        bench_printf(o, "references (same run): read bandwidth 1 thread %.2f GB/s, 2 threads %.2f GB/s; "
                        "fp32 FMA peak 1 thread %.1f GFLOP/s, 2 threads %.1f\n",
                     bw1, bw2, pk1, pk2);
        bench_printf(o, "mul bound: the GB/s if the kernel's vector multiplies per cell and KV head (scores and "
                        "p.V, %s) ran at the FMA peak and nothing else took time\n\n",
                     level == 1   ? "int8 dots 2 per 32 bytes, f32 FMAs 8 lanes"
                     : level == 2 ? "int8 dots 1 per 64 bytes, f32 FMAs 16 lanes"
                                  : "one per value");
        bench_printf(o, "| kv   | rot | ctx   | threads | us/token | GB/s  | %% of read bw | mul bound GB/s | "
                        "%% of mul bound |\n");
        bench_printf(o, "|------|-----|-------|---------|----------|-------|-------------|----------------|"
                        "----------------|\n");
    }
    bool first = true;
    for (size_t ci = 0; ci < BASE_ARRAY_LEN(cases); ci++) {
        if (only && strcmp(only, keel_dtype_name(cases[ci].kv)) != 0) continue;
        for (int k = 0; k < n_ctx; k++) {
            int32_t ctx = ctxs[k];
            keel_mem *m = NULL;
            int32_t nb = BASE_MIN(ctx, 4096);
            st = ba_open(sh, cases[ci].kv, cases[ci].rot, ctx, nb, &m, layers);
            if (st == KEEL_OK) st = ba_fill(sh, m, ctx, nb);
            if (st != KEEL_OK) {
                base_err(o->err, st, "bench attention: %s cache of %d cells: %s",
                         keel_dtype_name(cases[ci].kv), ctx, m ? keel_mem_last_error(m) : keel_strerror(st));
                keel_mem_close(m);
                goto done;
            }
            size_t row = tensor_row_bytes(cases[ci].kv, sh->dim);
            double bytes = (double)sh->layers * ctx * sh->kv_heads * (double)row * 2.0;
            int reps = bytes > 4e9 ? 3 : bytes > 1e9 ? 5 : 20;
            if (quick) reps = BASE_MAX(2, reps / 4);
            for (int threads = 1; threads <= 2; threads++) {
                base_pool *keep = m->pool;
                int32_t keep_n = m->n_threads;
                if (threads == 1) {
                    m->pool = NULL;
                    m->n_threads = 1;
                }
                double s = ba_decode(sh, m, ctx, reps, q, out);
                m->pool = keep;
                m->n_threads = keep_n;
                if (s < 0) {
                    st = base_err(o->err, KEEL_EINTERNAL, "bench attention: decode over %d %s cells: %s",
                                  ctx, keel_dtype_name(cases[ci].kv), keel_mem_last_error(m));
                    keel_mem_close(m);
                    goto done;
                }
                double gbps = bytes / s * 1e-9;
                double ref = threads == 1 ? bw1 : bw2;
                /* multiplies per second at the peak (2 flops per lane), over the
                 * multiplies per cell and KV head, times its K and V bytes */
                double muls = bench_attn_muls(level, cases[ci].kv, sh->heads / sh->kv_heads, sh->dim, sh->dim);
                double peak = threads == 1 ? pk1 : pk2;
                double mul_bound = peak > 0.0 ? peak / (2.0 * bench_simd_lanes(level)) / muls * 2.0 * (double)row : 0.0;
                if (o->json)
                    bench_printf(o, "%s\n  {\"kv\": \"%s\", \"rot\": %s, \"ctx\": %d, \"threads\": %d, "
                                    "\"us_per_token\": %.1f, \"gbps\": %.2f, \"mul_bound_gbps\": %.2f}",
                                 first ? "" : ",", keel_dtype_name(cases[ci].kv),
                                 cases[ci].rot ? "true" : "false", ctx, threads, s * 1e6, gbps, mul_bound);
                else
                    bench_printf(o, "| %-4s | %-3s | %5d | %7d | %8.1f | %5.2f | %10.0f%% | %14.2f | %13.0f%% |\n",
                                 keel_dtype_name(cases[ci].kv), cases[ci].rot ? "on" : "off", ctx,
                                 threads, s * 1e6, gbps, 100.0 * gbps / ref, mul_bound,
                                 mul_bound > 0.0 ? 100.0 * gbps / mul_bound : 0.0);
                first = false;
            }
            keel_mem_close(m);
        }
    }
    /* edits: seq_add over every cell, all 32 layers' keys re-encoded */
    if (o->json)
        bench_printf(o, "\n ],\n \"edit\": [");
    else {
        bench_printf(o, "\nposition edit (seq_add over all cells, %d layers, 2 threads)\n", sh->layers);
        bench_printf(o, "| kv   | rot | ns per changed cell | ns per key row |\n");
        bench_printf(o, "|------|-----|---------------------|----------------|\n");
    }
    first = true;
    for (size_t ci = 0; ci < BASE_ARRAY_LEN(cases); ci++) {
        if (only && strcmp(only, keel_dtype_name(cases[ci].kv)) != 0) continue;
        int32_t ctx = 4096;
        keel_mem *m = NULL;
        st = ba_open(sh, cases[ci].kv, cases[ci].rot, ctx, 4096, &m, layers);
        if (st != KEEL_OK) {
            base_err(o->err, st, "bench attention: %s cache of %d cells: %s", keel_dtype_name(cases[ci].kv),
                     ctx, keel_strerror(st));
            goto done;
        }
        st = ba_fill(sh, m, ctx, 4096);
        if (st == KEEL_OK) {
            uint64_t t0 = base_time_ns();
            st = keel_mem_seq_add(m, 0, -1, -1, 7);
            double ns = (double)(base_time_ns() - t0) / ctx;
            double per_row = ns / ((double)sh->layers * sh->kv_heads);
            if (o->json)
                bench_printf(o, "%s\n  {\"kv\": \"%s\", \"rot\": %s, \"ns_per_changed_cell\": %.0f}",
                             first ? "" : ",", keel_dtype_name(cases[ci].kv),
                             cases[ci].rot ? "true" : "false", ns);
            else
                bench_printf(o, "| %-4s | %-3s | %19.0f | %14.1f |\n", keel_dtype_name(cases[ci].kv),
                             cases[ci].rot ? "on" : "off", ns, per_row);
            first = false;
        }
        if (st != KEEL_OK)
            base_err(o->err, st, "bench attention: position edit on %s: %s", keel_dtype_name(cases[ci].kv),
                     keel_mem_last_error(m));
        keel_mem_close(m);
        if (st != KEEL_OK) goto done;
    }
    if (o->json) bench_printf(o, "\n ]}\n");
done:
    base_free(layers, (size_t)sh->layers * sizeof(keel_mem_layer));
    base_free(q, qn * sizeof(float));
    base_free(out, qn * sizeof(float));
    base_free(out1, n_tok > 1 ? qn * sizeof(float) : 0);
    return st;
}
