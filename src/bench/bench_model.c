/*
 * bench_model.c — `keel bench -m MODEL [-p 512] [-n 128] [-t N] [-r R] [--json]`:
 * prompt processing (pp: one batch of -p tokens from an empty cache) and
 * text generation (tg: -n tokens one at a time) in llama-bench's table
 * style, each beside a reference measured in the same run:
 *   - pp against OpenBLAS sgemm throughput (GFLOP/s) on the model's own
 *     largest projection shape, counting 2 * matmul-params FLOPs per token;
 *   - tg against the memory read bandwidth: the weight bytes a decode step
 *     reads (experts: the used fraction) * tok/s;
 *   - recurrent models: a checkpoint's bytes, the time to take one and to
 *     restore one (seq_rm one token back), the restore's bytes/s beside the
 *     read bandwidth.
 */
#include "bench.h"
#include "../engine/engine.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* OpenBLAS sgemm GFLOP/s, C[n][m] = A[n][k] B[m][k]^T, split over the pool's
 * threads by rows of B (single-threaded OpenBLAS in each), as the prefill
 * GEMM runs. */
typedef struct sg_ctx {
    const float *a, *b;
    float *c;
    int n, m, k, threads;
} sg_ctx;

static void sg_task(void *vctx, int64_t task, int thread)
{
    (void)thread;
    sg_ctx *s = vctx;
    int per = (s->m + s->threads - 1) / s->threads;
    int m0 = (int)task * per, m1 = BASE_MIN(s->m, m0 + per);
    if (m0 >= m1) return;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s->n, m1 - m0, s->k, 1.0f, s->a, s->k,
                s->b + (size_t)m0 * (size_t)s->k, s->k, 0.0f, s->c + m0, s->m);
}

static double sgemm_gflops(base_pool *pool, int n, int m, int k)
{
    size_t na = (size_t)n * (size_t)k, nb = (size_t)m * (size_t)k, nc = (size_t)n * (size_t)m;
    float *a = base_alloc(na * sizeof(float)), *b = base_alloc(nb * sizeof(float));
    float *c = base_alloc(nc * sizeof(float));
    double best = -1.0;
    if (a && b && c) {
        for (size_t i = 0; i < na; i++) a[i] = (float)((i * 7919) % 1000) * 1e-3f;
        for (size_t i = 0; i < nb; i++) b[i] = (float)((i * 104729) % 1000) * 1e-3f;
        openblas_set_num_threads(1);
        sg_ctx s = {a, b, c, n, m, k, base_pool_threads(pool)};
        for (int r = 0; r < 4; r++) {
            uint64_t t0 = base_time_ns();
            base_pool_run(pool, s.threads, sg_task, &s);
            double sec = (double)(base_time_ns() - t0) * 1e-9;
            double g = 2.0 * n * (double)m * k / sec * 1e-9;
            if (g > best) best = g;
        }
    }
    base_free(a, na * sizeof(float));
    base_free(b, nb * sizeof(float));
    base_free(c, nc * sizeof(float));
    return best;
}

typedef struct stat2 {
    double mean, sd;
} stat2;

static stat2 stats(const double *v, int n)
{
    stat2 s = {0, 0};
    for (int i = 0; i < n; i++) s.mean += v[i];
    s.mean /= n;
    for (int i = 0; i < n; i++) s.sd += (v[i] - s.mean) * (v[i] - s.mean);
    s.sd = n > 1 ? sqrt(s.sd / (n - 1)) : 0.0;
    return s;
}

/* Compaction cost and decode speed with compaction on vs off:
 *   - events: a cache of `trigger` cells of sequence 0 compacted to `target`,
 *     repeated; microseconds per event per 1,000 cells compacted;
 *   - decode: n_tg tokens with compaction (cells oscillate between target
 *     and trigger) vs without compaction from a cache prefilled to the same
 *     mean number of cells ((target + trigger) / 2), equal budget. */
/* --ctk / --ctv into p (KV cache types). */
static keel_status kv_types(bench_out *o, int argc, char **argv, keel_context_params *p)
{
    const char *ctk = bench_opt(argc, argv, "--ctk"), *ctv = bench_opt(argc, argv, "--ctv");
    if (ctk && keel_dtype_from_name(ctk, &p->type_k) != KEEL_OK)
        return base_err(o->err, KEEL_EINVAL, "bench model: --ctk %s: unknown type", ctk);
    if (ctv && keel_dtype_from_name(ctv, &p->type_v) != KEEL_OK)
        return base_err(o->err, KEEL_EINVAL, "bench model: --ctv %s: unknown type", ctv);
    return KEEL_OK;
}

static keel_status bench_compact(keel_model *m, int argc, char **argv, int threads, int n_tg,
                                 bench_out *o)
{
    keel_compact_params cp = keel_compact_params_default();
    const char *pol = bench_opt(argc, argv, "--kv-compact");
    if (keel_compact_policy_from_name(pol, &cp.policy) != KEEL_OK || cp.policy == KEEL_COMPACT_NONE)
        return base_err(o->err, KEEL_EINVAL,
                        "bench model: --kv-compact %s: must be window, keydiff, knorm or random", pol);
    int64_t trigger, target;
    keel_status st = bench_int_opt(o, "model", argc, argv, "--kv-trigger", 2, 1 << 24, 1024, &trigger);
    if (st == KEEL_OK)
        st = bench_int_opt(o, "model", argc, argv, "--kv-target", 1, trigger - 1, trigger / 2, &target);
    if (st != KEEL_OK) return st;
    cp.trigger = (int32_t)trigger;
    cp.target = (int32_t)target;
    const model_hp *hp = &m->w.hp;
    keel_context_params p = keel_context_params_default();
    p.n_ctx = cp.trigger + 64;
    p.n_batch = 512;
    p.n_ubatch = 512;
    p.n_threads = threads;
    if ((st = kv_types(o, argc, argv, &p)) != KEEL_OK) return st;
    keel_context *c = NULL;
    char err[BASE_ERR_CAP] = "";
    st = keel_context_open(m, &p, &c, err);
    if (st != KEEL_OK) return base_err(o->err, st, "bench model: context: %s", err);
    if ((st = keel_compact_params_check(&cp, err)) != KEEL_OK) {
        keel_context_close(c);
        return base_err(o->err, st, "bench model: --kv-compact: %s", err);
    }
    int32_t n_fill = cp.trigger;
    int32_t *toks = base_alloc((size_t)n_fill * sizeof(int32_t));
    if (!toks) {
        keel_context_close(c);
        return base_err(o->err, KEEL_ENOMEM, "bench model: out of memory");
    }
    base_rng r;
    base_rng_seed(&r, 3);
    for (int32_t i = 0; i < n_fill; i++) toks[i] = (int32_t)base_rng_below(&r, (uint64_t)hp->n_vocab);
    /* events */
    double ev_us = 0.0;
    int events = 0;
    for (int rep = 0; rep < 5 && st == KEEL_OK; rep++) {
        keel_mem_clear(c->mem);
        for (int32_t i = 0; i < n_fill && st == KEEL_OK; i += 512) {
            keel_batch b = {BASE_MIN(512, n_fill - i), toks + i, NULL, NULL, NULL};
            st = keel_decode(c, &b);
        }
        if (st != KEEL_OK) break;
        uint64_t t0 = base_time_ns();
        st = keel_mem_compact(c->mem, 0, &cp);
        ev_us += (double)(base_time_ns() - t0) * 1e-3;
        events++;
    }
    double us_per_k = events ? ev_us / events / (cp.trigger / 1000.0) : 0.0;
    /* decode with compaction on, then off at the same mean budget */
    double tps[2] = {0, 0};
    int64_t n_events = 0;
    for (int on = 1; on >= 0 && st == KEEL_OK; on--) {
        keel_mem_clear(c->mem);
        keel_compact_params none = keel_compact_params_default();
        st = keel_context_set_compact(c, 0, on ? &cp : &none);
        int32_t pre = on ? cp.target : (cp.target + cp.trigger) / 2;
        for (int32_t i = 0; i < pre && st == KEEL_OK; i += 512) {
            keel_batch b = {BASE_MIN(512, pre - i), toks + i, NULL, NULL, NULL};
            st = keel_decode(c, &b);
        }
        int64_t ev0 = keel_mem_seq_compactions(c->mem, 0);
        int32_t tok = toks[0];
        uint64_t t0 = base_time_ns();
        for (int i = 0; i < n_tg && st == KEEL_OK; i++) {
            keel_batch b = {1, &tok, NULL, NULL, NULL};
            st = keel_decode(c, &b);
            tok = toks[(i * 7) % n_fill];
            if (!on && keel_mem_seq_cells(c->mem, 0) >= cp.trigger) /* stay at the budget */
                st = keel_mem_seq_rm(c->mem, 0, keel_mem_seq_pos_max(c->mem, 0), -1);
        }
        tps[on] = n_tg / ((double)(base_time_ns() - t0) * 1e-9);
        if (on) n_events = keel_mem_seq_compactions(c->mem, 0) - ev0;
    }
    if (st != KEEL_OK)
        base_err(o->err, st, "bench model: compaction: %s",
                 keel_context_last_error(c)[0] ? keel_context_last_error(c) : keel_mem_last_error(c->mem));
    else if (o->json)
        bench_printf(o, "{\"compact\": {\"policy\": \"%s\", \"trigger\": %d, \"target\": %d, "
                        "\"us_per_event_per_1000_cells\": %.1f, \"tg_tps_on\": %.2f, \"tg_tps_off\": %.2f, "
                        "\"events_during_tg\": %lld}}\n",
                     keel_compact_policy_name(cp.policy), cp.trigger, cp.target, us_per_k, tps[1], tps[0],
                     (long long)n_events);
    else
        bench_printf(o, "compaction %s (trigger %d, target %d): %.1f us per event per 1000 cells; "
                        "tg%d %.2f tok/s with compaction (%lld events) vs %.2f tok/s without at the "
                        "same mean budget\n",
                     keel_compact_policy_name(cp.policy), cp.trigger, cp.target, us_per_k, n_tg,
                     tps[1], (long long)n_events, tps[0]);
    base_free(toks, (size_t)n_fill * sizeof(int32_t));
    keel_context_close(c);
    return st;
}

keel_status bench_model(int argc, char **argv, bench_out *o)
{
    static const bench_flag spec[] = {
        {"-m", true},  {"-p", true},          {"-n", true},          {"-t", true},
        {"-r", true},  {"--tokenizer", true}, {"--ctk", true},       {"--ctv", true},
        {"--kv-compact", true}, {"--kv-trigger", true}, {"--kv-target", true},
    };
    keel_status st = bench_check_args(o, "model", argc, argv, spec, BASE_ARRAY_LEN(spec));
    if (st != KEEL_OK) return st;
    const char *path = bench_opt(argc, argv, "-m");
    if (!path) return base_err(o->err, KEEL_EINVAL, "bench model: no model (-m MODEL)");
    int64_t iv[4];
    st = bench_int_opt(o, "model", argc, argv, "-p", 0, 65536, 512, &iv[0]);
    if (st == KEEL_OK) st = bench_int_opt(o, "model", argc, argv, "-n", 0, 65536, 128, &iv[1]);
    if (st == KEEL_OK) st = bench_int_opt(o, "model", argc, argv, "-t", 1, 256, keel_cpu_count(), &iv[2]);
    if (st == KEEL_OK) st = bench_int_opt(o, "model", argc, argv, "-r", 1, 64, 3, &iv[3]);
    if (st != KEEL_OK) return st;
    int n_pp = (int)iv[0], n_tg = (int)iv[1], threads = (int)iv[2], reps = (int)iv[3];
    if (!bench_opt(argc, argv, "--kv-compact")) {
        const char *kv = bench_opt(argc, argv, "--kv-trigger") ? "--kv-trigger"
                         : bench_opt(argc, argv, "--kv-target") ? "--kv-target"
                                                                 : NULL;
        if (kv) return base_err(o->err, KEEL_EINVAL, "bench model: %s needs --kv-compact POLICY", kv);
    }
    keel_model_params mp = keel_model_params_default();
    mp.path = path;
    mp.tokenizer_path = bench_opt(argc, argv, "--tokenizer");
    keel_model *m = NULL;
    char err[BASE_ERR_CAP] = "";
    st = keel_model_open(&mp, &m, err);
    if (st != KEEL_OK) return base_err(o->err, st, "bench model: %s: %s", path, err);
    if (bench_opt(argc, argv, "--kv-compact")) {
        st = bench_compact(m, argc, argv, threads, n_tg > 0 ? n_tg : 128, o);
        keel_model_close(m);
        return st;
    }
    const model_hp *hp = &m->w.hp;
    keel_context_params cp = keel_context_params_default();
    cp.n_ctx = BASE_MAX(n_pp + n_tg + 8, 256);
    cp.n_batch = BASE_MAX(n_pp, 1);
    cp.n_ubatch = BASE_MAX(n_pp, 1);
    cp.n_threads = threads;
    keel_context *c = NULL;
    int32_t *toks = NULL;
    double *pp_t = NULL, *tg_t = NULL;
    st = kv_types(o, argc, argv, &cp);
    if (st == KEEL_OK) {
        st = keel_context_open(m, &cp, &c, err);
        if (st != KEEL_OK) base_err(o->err, st, "bench model: context: %s", err);
    }
    if (st != KEEL_OK) {
        keel_model_close(m);
        return st;
    }
    size_t tb = (size_t)BASE_MAX(n_pp, 1) * sizeof(int32_t);
    toks = base_alloc(tb);
    pp_t = base_calloc((size_t)reps, sizeof(double));
    tg_t = base_calloc((size_t)reps, sizeof(double));
    if (!toks || !pp_t || !tg_t) {
        st = base_err(o->err, KEEL_ENOMEM, "bench model: out of memory");
        goto done;
    }
    base_rng r;
    base_rng_seed(&r, 7);
    for (int i = 0; i < BASE_MAX(n_pp, 1); i++) toks[i] = (int32_t)base_rng_below(&r, (uint64_t)hp->n_vocab);
    /* warm-up: page the weights in */
    {
        keel_batch b = {BASE_MIN(8, BASE_MAX(n_pp, 1)), toks, NULL, NULL, NULL};
        if ((st = keel_decode(c, &b)) != KEEL_OK) goto fail_decode;
        keel_mem_clear(c->mem);
    }
    for (int rep = 0; rep < reps; rep++) {
        if (n_pp > 0) {
            keel_mem_clear(c->mem);
            keel_batch b = {n_pp, toks, NULL, NULL, NULL};
            uint64_t t0 = base_time_ns();
            if ((st = keel_decode(c, &b)) != KEEL_OK) goto fail_decode;
            pp_t[rep] = (double)(base_time_ns() - t0) * 1e-9;
        }
        if (n_tg > 0) {
            keel_mem_clear(c->mem);
            int32_t tok = toks[0];
            uint64_t t0 = base_time_ns();
            for (int i = 0; i < n_tg; i++) {
                keel_batch b = {1, &tok, NULL, NULL, NULL};
                if ((st = keel_decode(c, &b)) != KEEL_OK) goto fail_decode;
                const float *lg = keel_logits(c, 0);
                int32_t best = 0;
                for (int32_t v = 1; v < hp->n_vocab; v++)
                    if (lg[v] > lg[best]) best = v;
                tok = best;
            }
            tg_t[rep] = (double)(base_time_ns() - t0) * 1e-9;
        }
    }
    /* recurrent models: a checkpoint's size, the time to take one and to
     * restore one (seq_rm one token back), after the last pp run */
    double ck_take_us = 0.0, ck_restore_us = 0.0;
    size_t ck_bytes = keel_mem_ckpt_record_bytes(c->mem);
    if (ck_bytes > 0 && n_pp > 0) {
        keel_mem_clear(c->mem);
        keel_batch b = {n_pp, toks, NULL, NULL, NULL};
        if ((st = keel_decode(c, &b)) != KEEL_OK) goto fail_decode; /* takes one at n_pp */
        int32_t tok = toks[0];
        int nck = 16;
        for (int i = 0; i < nck; i++) {
            keel_batch one = {1, &tok, NULL, NULL, NULL};
            if ((st = keel_decode(c, &one)) != KEEL_OK) goto fail_decode;
            uint64_t t0 = base_time_ns();
            st = keel_mem_ckpt_take(c->mem, 0);
            uint64_t t1 = base_time_ns();
            if (st == KEEL_OK) st = keel_mem_seq_rm(c->mem, 0, n_pp, -1); /* back to n_pp */
            uint64_t t2 = base_time_ns();
            if (st != KEEL_OK) {
                base_err(o->err, st, "bench model: checkpoint: %s", keel_mem_last_error(c->mem));
                goto done;
            }
            ck_take_us += (double)(t1 - t0) * 1e-3 / nck;
            ck_restore_us += (double)(t2 - t1) * 1e-3 / nck;
        }
    }
    /* references, same run */
    double bw = bench_read_bw_gbps(c->pool, 0, 3);
    /* parameters of the per-token matrix products (experts: the used
     * fraction), the largest one's shape for the sgemm reference, and the
     * weight bytes a decode step reads */
    int64_t mm_params = 0, big = 0;
    int sg_k = hp->n_embd, sg_m = hp->n_ff;
    double active = (double)m->w.weight_bytes;
    for (int32_t i = 0; i < hp->n_layer; i++) {
        const model_mat *ms[32];
        int32_t k = model_layer_mats(&m->w.layers[i], ms, 32);
        for (int j = 0; j < k; j++) {
            int64_t pr = ms[j]->n_rows * ms[j]->n_cols;
            if (ms[j]->n_expert > 0) {
                double used = (double)hp->n_expert_used / (double)ms[j]->n_expert;
                mm_params += (int64_t)((double)pr * ms[j]->n_expert * used);
                active -= (double)ms[j]->nbytes * (1.0 - used);
            } else {
                mm_params += pr;
                if (pr > big) {
                    big = pr;
                    sg_k = (int)ms[j]->n_cols;
                    sg_m = (int)ms[j]->n_rows;
                }
            }
        }
    }
    int64_t out_params = m->w.output.n_rows * m->w.output.n_cols;
    /* reference GEMM on the model's largest projection with the same batch */
    int sg_n = BASE_MAX(n_pp, 1);
    double sg = n_pp > 0 ? sgemm_gflops(c->pool, sg_n, sg_m, sg_k) : 0.0;
    double pp_tps[64], tg_tps[64];
    int nr = BASE_MIN(reps, 64);
    for (int i = 0; i < nr; i++) {
        pp_tps[i] = n_pp > 0 ? n_pp / pp_t[i] : 0.0;
        tg_tps[i] = n_tg > 0 ? n_tg / tg_t[i] : 0.0;
    }
    stat2 pps = stats(pp_tps, nr), tgs = stats(tg_tps, nr);
    /* pp FLOPs: matmuls of every token, logits of the last only */
    double pp_gflops = (2.0 * (double)mm_params * n_pp + 2.0 * (double)out_params) * pps.mean * 1e-9 /
                       (n_pp > 0 ? n_pp : 1);
    size_t wb = m->w.weight_bytes;
    double tg_need = active * tgs.mean * 1e-9;
    const char *name = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    if (o->json) {
        bench_printf(o,
                     "{\"model\": \"%s\", \"arch\": \"%s\", \"threads\": %d, \"weight_bytes\": %zu, "
                     "\"n_params\": %lld, \"read_bw_gbps\": %.2f, \"sgemm_gflops\": %.1f,\n"
                     " \"pp\": {\"n\": %d, \"tps\": %.2f, \"sd\": %.2f, \"gflops\": %.1f, "
                     "\"of_sgemm\": %.3f},\n"
                     " \"tg\": {\"n\": %d, \"tps\": %.2f, \"sd\": %.2f, \"gbps\": %.2f, \"of_bw\": %.3f},\n"
                     " \"ckpt\": {\"bytes\": %zu, \"take_us\": %.2f, \"restore_us\": %.2f}}\n",
                     name, hp->arch_name, threads, wb, (long long)m->w.n_params, bw, sg, n_pp, pps.mean,
                     pps.sd, pp_gflops, sg > 0 ? pp_gflops / sg : 0.0, n_tg, tgs.mean, tgs.sd, tg_need,
                     bw > 0 ? tg_need / bw : 0.0, ck_bytes, ck_take_us, ck_restore_us);
    } else {
        bench_printf(o, "| model | size | params | type | threads | test | t/s | reference |\n");
        bench_printf(o, "| --- | ---: | ---: | --- | ---: | ---: | ---: | --- |\n");
        char size[32], params[32];
        snprintf(size, sizeof size, "%.2f MiB", (double)wb / (1024.0 * 1024.0));
        snprintf(params, sizeof params, "%.2f M", (double)m->w.n_params / 1e6);
        if (n_pp > 0)
            bench_printf(o, "| %s | %s | %s | %s | %d | pp%d | %.2f ± %.2f | %.1f GFLOP/s = %.0f%% of sgemm %.1f |\n",
                         name, size, params, keel_dtype_name(m->w.main_dtype), threads, n_pp, pps.mean,
                         pps.sd, pp_gflops, sg > 0 ? 100.0 * pp_gflops / sg : 0.0, sg);
        if (n_tg > 0)
            bench_printf(o, "| %s | %s | %s | %s | %d | tg%d | %.2f ± %.2f | %.2f GB/s = %.0f%% of read bw %.2f |\n",
                         name, size, params, keel_dtype_name(m->w.main_dtype), threads, n_tg, tgs.mean,
                         tgs.sd, tg_need, bw > 0 ? 100.0 * tg_need / bw : 0.0, bw);
        if (ck_bytes > 0 && n_pp > 0) {
            /* a restore copies a record back: its bytes over the time, beside
             * the read bandwidth */
            double gbps = ck_restore_us > 0 ? (double)ck_bytes / (ck_restore_us * 1e3) : 0.0;
            bench_printf(o, "| %s | %s | %s | %s | %d | ckpt %zu B | take %.1f us, restore %.1f us | "
                            "restore %.2f GB/s = %.0f%% of read bw %.2f |\n",
                         name, size, params, keel_dtype_name(m->w.main_dtype), threads, ck_bytes,
                         ck_take_us, ck_restore_us, gbps, bw > 0 ? 100.0 * gbps / bw : 0.0, bw);
        }
    }
    goto done;
fail_decode:
    base_err(o->err, st, "bench model: decode: %s", keel_context_last_error(c));
done:
    base_free(toks, tb);
    base_free(pp_t, (size_t)reps * sizeof(double));
    base_free(tg_t, (size_t)reps * sizeof(double));
    keel_context_close(c);
    keel_model_close(m);
    return st;
}
