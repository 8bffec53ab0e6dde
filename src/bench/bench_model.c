/*
 * bench_model.c — `keel bench -m MODEL [-p 512] [-n 128] [-d 0,...] [-t N] [-r R]
 * [-ub 512] [-c N] [--ctk T] [--ctv T] [--profile] [--json]`: prompt processing (pp:
 * one batch of -p tokens, in ubatches of -ub) and text generation (tg: -n
 * tokens one at a time) with the cache holding -d tokens before each
 * measurement (llama-bench's depth: filled once, the measured tokens
 * removed again) in a cache of -c cells (default: just what the largest
 * depth and test need; a larger one is what a server with a large n_ctx
 * runs), llama-bench's table style, each row beside references
 * measured in the same run:
 *   - tg: bytes read per token (every matrix but the embedding table, plus
 *     the K and V rows of the cells a step sees, averaged over the steps)
 *     and the bound read bandwidth / bytes (the bandwidth: 1 GiB at the
 *     start and 256 MiB before every repetition, the best); experts count
 *     with the fraction a token uses (MoE models: the header states the
 *     active parameters and weight bytes per token); a pp ubatch of u
 *     tokens reads each expert once if any of its tokens chose it: the
 *     expected fraction 1 - (1 - k / n_expert)^u of the experts' bytes
 *     (uniform routing);
 *   - pp: FLOPs per token (2 x the per-token product parameters, attention
 *     2 x heads x (dk + dv) x cells seen, the output row of the last token)
 *     against the fp32 FMA peak of the SIMD level in force (register-only
 *     FMA loop, same threads) and OpenBLAS sgemm on the model's largest
 *     projection (not an expert) with the ubatch;
 *   - recurrent models (with -p): a checkpoint's bytes, the time to take
 *     one and to restore one (seq_rm one token back), the restore's bytes/s
 *     beside the read bandwidth;
 * t/s is the mean ± sd over the repetitions, with the best in parentheses;
 * ratios to the bound use the best. --profile adds, per depth, one
 * profiled prompt of -p tokens and one profiled run of -n decode steps
 * (each beside the timed ones): time per token of every kernel entry
 * (kind, dtype, shape and its role in the model), the rest of the step and
 * the pool's jobs (docs/kernels.md, Decode profile).
 */
#include "bench.h"
#include "../engine/engine.h"
#include "../tensor/tensor.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

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

/* ---- the model benchmark: pp / tg at depths, beside the references ------ */

#define BM_MAX_DEPTHS 8
#define BM_MAX_ROWS   (2 * BM_MAX_DEPTHS)
#define BM_BW_BYTES   ((size_t)256 << 20)

/* Major page faults of the process so far: a fault in a timed run means
 * weights came from disk (the page cache had dropped them), and the
 * figure measures the disk, not the kernels. */
static long bm_major_faults(void)
{
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? ru.ru_majflt : 0;
}

/* Bytes of a sysfs cache "size" file ("32768K", "2M", "512"); 0 if unreadable. */
static size_t bm_sysfs_size(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char buf[32] = "";
    bool ok = fgets(buf, sizeof buf, f) != NULL;
    fclose(f); /* read-only: nothing to lose */
    if (!ok) return 0;
    char *end = NULL;
    unsigned long long v = strtoull(buf, &end, 10);
    size_t mul = *end == 'K' ? 1024u : *end == 'M' ? 1024u * 1024u : *end == 'G' ? 1024u * 1024u * 1024u : 1u;
    return end == buf || v > SIZE_MAX / mul ? 0 : (size_t)v * mul;
}

/* The last-level cache's bytes that this CPU uses (0 when unknown): decode
 * that reads fewer bytes per token than this is partly served from it, and
 * can pass a bound taken from the DRAM read bandwidth. sysfs first (cpu0's
 * highest-level cache, the slice its cores share): glibc's sysconf reports
 * the whole package's L3 on AMD (384 MiB on a 12-CCD EPYC whose guest CPUs
 * share one 32 MiB L3). */
static size_t bm_llc_bytes(void)
{
    size_t best = 0;
    int best_level = 0;
    for (int i = 0; i < 8; i++) {
        char path[96];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
        size_t level = bm_sysfs_size(path); /* a small integer: the same parser */
        if (level == 0) continue;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        size_t bytes = bm_sysfs_size(path);
        if (bytes > 0 && (int)level >= best_level) {
            best_level = (int)level;
            best = bytes;
        }
    }
    if (best > 0 && best_level >= 2) return best;
    long v = -1;
#ifdef _SC_LEVEL3_CACHE_SIZE
    v = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
#ifdef _SC_LEVEL2_CACHE_SIZE
    if (v <= 0) v = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
    return v > 0 ? (size_t)v : 0;
}

typedef struct bm_row {
    bool tg;                      /* text generation (else prompt processing) */
    int n, depth;                 /* tokens measured, tokens in the cache before */
    long major_faults;            /* pages read from disk during the timed runs */
    double tps_mean, tps_sd, tps_best;
    double weight_bytes, kv_bytes; /* read per token: weights (pp: per ubatch / tokens), K+V rows */
    double flops;                 /* per token: matrix products + attention */
} bm_row;

/* What a model moves and computes per token, from its weights and the
 * context's memory layers (so it follows whatever layers a model has). */
typedef struct bm_model {
    double weight_bytes_tok;  /* decode: every matrix but the embedding table, one embedding row */
    double expert_bytes;      /* all experts' matrices (every layer) */
    double expert_used_frac;  /* n_expert_used / n_expert (0: no experts) */
    double active_params;     /* parameters a token multiplies (experts: the used ones) */
    double mm_flops_tok;      /* 2 * parameters of the per-token products (not the output) */
    double out_flops;         /* 2 * output parameters (once per output row) */
    double kv_cell_bytes;     /* K+V bytes of one cell over the attention layers */
    double attn_flops_cell;   /* 2 * heads * (dk + dv) over the attention layers */
    int sg_m, sg_k;           /* the largest projection (not an expert): the sgemm reference */
    const keel_mem_layer *layers;
    int32_t n_layers;
} bm_model;

static void bm_model_of(const keel_model *m, const keel_context *c, bm_model *bm)
{
    memset(bm, 0, sizeof *bm);
    const model_w *w = &m->w;
    bool tied = w->output.data == w->tok_embd.data;
    double emb = (double)w->tok_embd.nbytes;
    double row = (double)tensor_row_bytes(w->tok_embd.dtype, w->tok_embd.n_cols);
    bm->weight_bytes_tok = (double)w->weight_bytes - (tied ? 0.0 : emb) + row;
    double out_params = (double)w->output.n_rows * (double)w->output.n_cols;
    double emb_params = (double)w->tok_embd.n_rows * (double)w->tok_embd.n_cols;
    bm->mm_flops_tok = 2.0 * ((double)w->n_params - out_params - (tied ? 0.0 : emb_params));
    bm->out_flops = 2.0 * out_params;
    bm->active_params = (double)w->n_params;
    /* experts: a token reads and multiplies the used fraction */
    int64_t big = 0;
    bm->sg_m = w->hp.n_ff;
    bm->sg_k = w->hp.n_embd;
    for (int32_t i = 0; i < w->hp.n_layer; i++) {
        const model_mat *ms[32];
        int32_t k = model_layer_mats(&w->layers[i], ms, 32);
        for (int j = 0; j < k; j++) {
            int64_t pr = ms[j]->n_rows * ms[j]->n_cols;
            if (ms[j]->n_expert > 0) {
                double unused = 1.0 - (double)w->hp.n_expert_used / (double)ms[j]->n_expert;
                bm->weight_bytes_tok -= (double)ms[j]->nbytes * unused;
                bm->expert_bytes += (double)ms[j]->nbytes;
                bm->expert_used_frac = 1.0 - unused;
                bm->mm_flops_tok -= 2.0 * (double)pr * (double)ms[j]->n_expert * unused;
                bm->active_params -= (double)pr * (double)ms[j]->n_expert * unused;
            } else if (pr > big) {
                big = pr;
                bm->sg_m = (int)ms[j]->n_rows;
                bm->sg_k = (int)ms[j]->n_cols;
            }
        }
    }
    bm->layers = c->mem->layers;
    bm->n_layers = c->mem->cfg.n_layers;
    for (int32_t l = 0; l < bm->n_layers; l++) {
        const keel_mem_layer *L = &bm->layers[l];
        if (L->kind == KEEL_MEM_LAYER_NONE) continue;
        int32_t nh = L->n_heads ? L->n_heads : L->n_kv_heads;
        bm->kv_cell_bytes += (double)L->n_kv_heads * (double)(tensor_row_bytes(L->k_dtype, L->head_dim_k) +
                                                              tensor_row_bytes(L->v_dtype, L->head_dim_v));
        bm->attn_flops_cell += 2.0 * nh * (double)(L->head_dim_k + L->head_dim_v);
    }
}

/* K+V bytes read and attention flops for a query that sees `cells` cells of
 * a sequence (sliding layers: at most their window plus sinks). */
static void bm_attn_at(const bm_model *bm, double cells, double *kv_bytes, double *flops)
{
    *kv_bytes = 0;
    *flops = 0;
    for (int32_t l = 0; l < bm->n_layers; l++) {
        const keel_mem_layer *L = &bm->layers[l];
        if (L->kind == KEEL_MEM_LAYER_NONE) continue;
        double seen = cells;
        if (L->kind == KEEL_MEM_LAYER_SLIDING) seen = BASE_MIN(cells, (double)L->window + L->n_sink);
        int32_t nh = L->n_heads ? L->n_heads : L->n_kv_heads;
        *kv_bytes += seen * (double)L->n_kv_heads *
                     (double)(tensor_row_bytes(L->k_dtype, L->head_dim_k) +
                              tensor_row_bytes(L->v_dtype, L->head_dim_v));
        *flops += seen * 2.0 * nh * (double)(L->head_dim_k + L->head_dim_v);
    }
}

static bool parse_depths(const char *s, int32_t *d, int *n)
{
    *n = 0;
    if (!s) {
        d[(*n)++] = 0;
        return true;
    }
    while (*s && *n < BM_MAX_DEPTHS) {
        char *end;
        long v = (*s >= '0' && *s <= '9') ? strtol(s, &end, 10) : -1;
        if (v < 0 || end == s || v > (1 << 24) || (*n > 0 && v < d[*n - 1])) return false;
        d[(*n)++] = (int32_t)v;
        if (*end == 0) return true;
        if (*end != ',') return false;
        s = end + 1;
    }
    return false;
}

/* Decodes tokens toks[0..n) into sequence 0 in batches of at most nb. */
static keel_status bm_feed(keel_context *c, const int32_t *toks, int32_t n, int32_t nb)
{
    keel_status st = KEEL_OK;
    for (int32_t i = 0; i < n && st == KEEL_OK; i += nb) {
        keel_batch b = {BASE_MIN(nb, n - i), toks + i, NULL, NULL, NULL};
        st = keel_decode(c, &b);
    }
    return st;
}

/* The first index of the largest logit: eight running maxima (a loop the
 * compiler keeps in registers, no branch per logit), then the first index
 * holding the maximum. */
static int32_t bm_argmax(const float *lg, int32_t n)
{
    float m[8] = {lg[0], lg[0], lg[0], lg[0], lg[0], lg[0], lg[0], lg[0]};
    int32_t v = 0;
    for (; v + 8 <= n; v += 8)
        for (int k = 0; k < 8; k++) m[k] = lg[v + k] > m[k] ? lg[v + k] : m[k];
    float best = m[0];
    for (int k = 1; k < 8; k++) best = m[k] > best ? m[k] : best;
    for (; v < n; v++) best = lg[v] > best ? lg[v] : best;
    for (v = 0; v < n; v++)
        if (lg[v] == best) return v;
    return 0; /* only NaN logits (a decode refuses them) */
}

/* n_tg greedy decode steps from tok (the bench's own argmax included). */
static keel_status bm_generate(keel_context *c, int32_t tok, int n_tg, int32_t n_vocab)
{
    for (int i = 0; i < n_tg; i++) {
        keel_batch b = {1, &tok, NULL, NULL, NULL};
        keel_status st = keel_decode(c, &b);
        if (st != KEEL_OK) return st;
        tok = bm_argmax(keel_logits(c, 0), n_vocab);
    }
    return KEEL_OK;
}

/* The matrix roles a (rows, cols) shape has in this model, "/"-joined. */
static void bm_role(const model_hp *hp, int64_t rows, int64_t cols, char *buf, size_t cap)
{
    int64_t E = hp->n_embd, QD = (int64_t)hp->n_head * hp->hd_k, KD = (int64_t)hp->n_head_kv * hp->hd_k;
    int64_t VD = (int64_t)hp->n_head_kv * hp->hd_v, OD = (int64_t)hp->n_head * hp->hd_v, F = hp->n_ff;
    const struct {
        const char *name;
        int64_t r, c;
    } roles[] = {{"attn_q", QD, E},   {"attn_k", KD, E},   {"attn_v", VD, E},        {"attn_output", E, OD},
                 {"ffn_gate", F, E}, {"ffn_up", F, E},   {"ffn_down", E, F},       {"output", hp->n_vocab, E}};
    buf[0] = 0;
    size_t len = 0;
    for (size_t i = 0; i < BASE_ARRAY_LEN(roles); i++) {
        if (roles[i].r != rows || roles[i].c != cols) continue;
        int k = snprintf(buf + len, cap - len, "%s%s", len ? "/" : "", roles[i].name);
        if (k < 0 || (size_t)k >= cap - len) break;
        len += (size_t)k;
    }
    if (!len) snprintf(buf, cap, "%lldx%lld", (long long)rows, (long long)cols);
}

/* One profiled run at the current depth, either n decode steps (pp false:
 * from toks[0]) or one prompt of n tokens (pp true: toks[0..n), in batches
 * of nb): per kernel entry (kind, dtype, shape) its time per token, and the
 * pool's jobs. A profile records a clock read around each top-level kernel
 * call, a few hundred per ubatch, so a profiled prompt runs at its own speed. */
static keel_status bm_profile(keel_context *c, const keel_model *m, int depth, bool pp, int n,
                              const int32_t *toks, int32_t nb, double bw, double peak, bool first_json,
                              bench_out *o)
{
    const model_hp *hp = &m->w.hp;
    int n_tg = n; /* tokens the times are divided by */
    tensor_prof_reset();
    tensor_prof_enable(true);
    base_pool_profile(c->pool, true);
    uint64_t t0 = base_time_ns();
    keel_status st = pp ? bm_feed(c, toks, n, nb) : bm_generate(c, toks[0], n, hp->n_vocab);
    double total_ns = (double)(base_time_ns() - t0);
    tensor_prof_enable(false);
    base_pool_stats ps;
    base_pool_stats_get(c->pool, &ps);
    base_pool_profile(c->pool, false);
    if (st != KEEL_OK) return st;
    const tensor_prof_entry *e;
    int ne = tensor_prof_get(&e);
    double per = 1e-3 / n_tg; /* ns total -> us per token */
    double step_us = total_ns * per, known = 0;
    for (int i = 0; i < ne; i++) known += (double)e[i].ns;
    if (o->json) {
        bench_printf(o, "%s{\"test\": \"%s\", \"depth\": %d, \"tokens\": %d, \"step_us\": %.1f, \"entries\": [",
                     first_json ? "" : ", ", pp ? "pp" : "tg", depth, n_tg, step_us);
    } else if (pp) {
        bench_printf(o, "\nprofile of a %d-token prompt at depth %d (%s, %d threads, %.1f ms): %.1f us per token\n",
                     n_tg, depth, keel_simd_name(), base_pool_threads(c->pool), total_ns * 1e-6, step_us);
        bench_printf(o, "| kernel | dtype | shape (role) | calls/token | us/token | %% of prompt | GFLOP/s | "
                        "%% of FMA peak |\n");
        bench_printf(o, "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |\n");
    } else {
        bench_printf(o, "\nprofile of one decode step at depth %d (%d steps, %s, %d threads): %.1f us per token\n",
                     depth, n_tg, keel_simd_name(), base_pool_threads(c->pool), step_us);
        bench_printf(o, "| kernel | dtype | shape (role) | calls/token | us/token | %% of step | GB/s | %% of read bw |\n");
        bench_printf(o, "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |\n");
    }
    for (int i = 0; i < ne; i++) {
        char role[96];
        if (e[i].kind == TENSOR_PROF_MATVEC || e[i].kind == TENSOR_PROF_MATMUL)
            bm_role(hp, e[i].rows, e[i].cols, role, sizeof role);
        else if (e[i].kind == TENSOR_PROF_ATTN)
            snprintf(role, sizeof role, "%lld token(s)", (long long)e[i].rows);
        else
            snprintf(role, sizeof role, "%lld x %lld", (long long)e[i].rows, (long long)e[i].cols);
        double us = (double)e[i].ns * per, gbps = e[i].ns ? e[i].bytes / (double)e[i].ns : 0.0;
        /* a product's FLOPs: 2 per weight and activation row */
        bool prod = e[i].kind == TENSOR_PROF_MATVEC || e[i].kind == TENSOR_PROF_MATMUL;
        double gflops = prod && e[i].ns ? 2.0 * (double)e[i].rows * (double)e[i].cols * (double)e[i].tokens /
                                              (double)e[i].ns
                                        : 0.0;
        const char *dt = keel_dtype_name(e[i].dtype) ? keel_dtype_name(e[i].dtype) : "?";
        if (o->json)
            bench_printf(o, "%s{\"kind\": \"%s\", \"dtype\": \"%s\", \"rows\": %lld, \"cols\": %lld, \"role\": \"%s\", "
                            "\"calls_per_token\": %.2f, \"us_per_token\": %.2f, \"gbps\": %.2f, \"gflops\": %.2f}",
                         i ? ", " : "", tensor_prof_kind_name(e[i].kind), dt, (long long)e[i].rows,
                         (long long)e[i].cols, role, (double)e[i].calls / n_tg, us, gbps, gflops);
        else if (pp && prod)
            bench_printf(o, "| %s | %s | %s | %.2f | %.1f | %.1f%% | %.1f | %.0f%% |\n", tensor_prof_kind_name(e[i].kind),
                         dt, role, (double)e[i].calls / n_tg, us, 100.0 * us / step_us, gflops,
                         peak > 0 ? 100.0 * gflops / peak : 0.0);
        else if (pp)
            bench_printf(o, "| %s | %s | %s | %.2f | %.1f | %.1f%% | | |\n", tensor_prof_kind_name(e[i].kind), dt,
                         role, (double)e[i].calls / n_tg, us, 100.0 * us / step_us);
        else if (e[i].bytes > 0)
            bench_printf(o, "| %s | %s | %s | %.1f | %.1f | %.1f%% | %.2f | %.0f%% |\n", tensor_prof_kind_name(e[i].kind),
                         dt, role, (double)e[i].calls / n_tg, us, 100.0 * us / step_us, gbps,
                         bw > 0 ? 100.0 * gbps / bw : 0.0);
        else
            bench_printf(o, "| %s | %s | %s | %.1f | %.1f | %.1f%% | | |\n", tensor_prof_kind_name(e[i].kind), dt, role,
                         (double)e[i].calls / n_tg, us, 100.0 * us / step_us);
    }
    double other_us = (total_ns - known) * per;
    double runs = (double)ps.runs / n_tg, inl = (double)ps.runs_inline / n_tg;
    double wait_us = (double)ps.wait_ns * per, run_us = (double)ps.run_ns * per;
    if (o->json) {
        bench_printf(o, "], \"other_us\": %.2f, \"pool\": {\"runs_per_token\": %.1f, \"inline_runs_per_token\": %.1f, "
                        "\"run_us_per_token\": %.1f, \"wait_us_per_token\": %.2f}}",
                     other_us, runs, inl, run_us, wait_us);
    } else {
        bench_printf(o, "| other (embedding, KV writes, residuals%s) | | | | %.1f | %.1f%% | | |\n",
                     pp ? "" : ", argmax", other_us, 100.0 * other_us / step_us);
        bench_printf(o, "thread synchronization: %.1f parallel jobs per token (%.1f inline), %.1f us per token in them, "
                        "of which %.1f us (%.1f%% of the step) the caller waited for the other threads\n",
                     runs, inl, run_us, wait_us, 100.0 * wait_us / step_us);
    }
    return KEEL_OK;
}

keel_status bench_model(int argc, char **argv, bench_out *o)
{
    static const bench_flag spec[] = {
        {"-m", true},  {"-p", true},          {"-n", true},          {"-t", true},
        {"-r", true},  {"--tokenizer", true}, {"--ctk", true},       {"--ctv", true},
        {"--kv-compact", true}, {"--kv-trigger", true}, {"--kv-target", true},
        {"-d", true},  {"-ub", true},         {"--profile", false},  {"-c", true},
        {"--load", true},
    };
    keel_status st = bench_check_args(o, "model", argc, argv, spec, BASE_ARRAY_LEN(spec));
    if (st != KEEL_OK) return st;
    const char *path = bench_opt(argc, argv, "-m");
    if (!path) return base_err(o->err, KEEL_EINVAL, "bench model: no model (-m MODEL)");
    int64_t iv[5];
    st = bench_int_opt(o, "model", argc, argv, "-p", 0, 65536, 512, &iv[0]);
    if (st == KEEL_OK) st = bench_int_opt(o, "model", argc, argv, "-n", 0, 65536, 128, &iv[1]);
    if (st == KEEL_OK) st = bench_int_opt(o, "model", argc, argv, "-t", 1, 256, keel_cpu_count(), &iv[2]);
    if (st == KEEL_OK) st = bench_int_opt(o, "model", argc, argv, "-r", 1, 64, 3, &iv[3]);
    if (st == KEEL_OK) st = bench_int_opt(o, "model", argc, argv, "-ub", 1, 65536, 512, &iv[4]);
    if (st != KEEL_OK) return st;
    int n_pp = (int)iv[0], n_tg = (int)iv[1], threads = (int)iv[2], reps = (int)iv[3];
    int n_ub = (int)BASE_MIN(iv[4], BASE_MAX(iv[0], 1));
    int32_t depths[BM_MAX_DEPTHS];
    int n_depth = 0;
    const char *dl = bench_opt(argc, argv, "-d");
    if (!parse_depths(dl, depths, &n_depth))
        return base_err(o->err, KEEL_EINVAL,
                        "bench model: -d %s: must be 1 to %d ascending comma-separated integers in [0, 16777216]",
                        dl, BM_MAX_DEPTHS);
    bool profile = bench_has_flag(argc, argv, "--profile");
    if (profile && n_tg == 0 && n_pp == 0)
        return base_err(o->err, KEEL_EINVAL, "bench model: --profile profiles the prompt and decode: needs -p or -n > 0");
    if (!bench_opt(argc, argv, "--kv-compact")) {
        const char *kv = bench_opt(argc, argv, "--kv-trigger") ? "--kv-trigger"
                         : bench_opt(argc, argv, "--kv-target") ? "--kv-target"
                                                                 : NULL;
        if (kv) return base_err(o->err, KEEL_EINVAL, "bench model: %s needs --kv-compact POLICY", kv);
    }
    keel_model_params mp = keel_model_params_default();
    mp.path = path;
    mp.tokenizer_path = bench_opt(argc, argv, "--tokenizer");
    const char *load = bench_opt(argc, argv, "--load");
    if (load && keel_load_from_name(load, &mp.load) != KEEL_OK)
        return base_err(o->err, KEEL_EINVAL, "bench model: --load %s: need auto, mmap or read", load);
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
    int32_t max_depth = depths[n_depth - 1];
    keel_context_params cp = keel_context_params_default();
    int64_t need = BASE_MAX((int64_t)max_depth + BASE_MAX(n_pp, n_tg) + 8, 256), n_ctx = need;
    st = bench_int_opt(o, "model", argc, argv, "-c", need, 16777216, need, &n_ctx);
    if (st != KEEL_OK) {
        keel_model_close(m);
        return st;
    }
    cp.n_ctx = (int32_t)n_ctx;
    cp.n_batch = BASE_MAX(n_pp, 512);
    cp.n_ubatch = BASE_MAX(n_ub, 1);
    cp.n_threads = threads;
    keel_context *c = NULL;
    int32_t *toks = NULL;
    double *pp_t = NULL, *tg_t = NULL;
    bm_row *rows = NULL;
    int n_rows = 0;
    int32_t n_toks = (int32_t)BASE_MAX(BASE_MAX(n_pp, max_depth), 8);
    size_t tb = (size_t)n_toks * sizeof(int32_t);
    st = kv_types(o, argc, argv, &cp);
    if (st == KEEL_OK) {
        st = keel_context_open(m, &cp, &c, err);
        if (st != KEEL_OK) base_err(o->err, st, "bench model: context: %s", err);
    }
    if (st != KEEL_OK) {
        keel_model_close(m);
        return st;
    }
    toks = base_alloc(tb);
    pp_t = base_calloc((size_t)reps, sizeof(double));
    tg_t = base_calloc((size_t)reps, sizeof(double));
    rows = base_calloc(BM_MAX_ROWS, sizeof(bm_row));
    if (!toks || !pp_t || !tg_t || !rows) {
        st = base_err(o->err, KEEL_ENOMEM, "bench model: out of memory");
        goto done;
    }
    base_rng r;
    base_rng_seed(&r, 7);
    for (int32_t i = 0; i < n_toks; i++) toks[i] = (int32_t)base_rng_below(&r, (uint64_t)hp->n_vocab);
    bm_model bm;
    bm_model_of(m, c, &bm);
    /* references, same run: the read bandwidth (1 GiB now, 256 MiB before
     * every repetition: the best), the FMA peak at the level in force and
     * OpenBLAS sgemm on the model's ffn shape with the pp batch */
    double bw = bench_read_bw_gbps(c->pool, 0, 3);
    double peak = bench_fma_peak_gflops(c->pool, (int)tensor_simd_level(), 5);
    double sg = n_pp > 0 ? sgemm_gflops(c->pool, BASE_MIN(n_pp, n_ub), bm.sg_m, bm.sg_k) : 0.0;
    /* warm-up: page the weights in */
    if ((st = bm_feed(c, toks, BASE_MIN(8, n_toks), cp.n_batch)) != KEEL_OK) goto fail_decode;
    keel_mem_clear(c->mem);
    int32_t filled = 0;
    bool first_prof = true;
    if (profile && o->json) bench_printf(o, "{\"profile\": [");
    for (int di = 0; di < n_depth; di++) {
        int32_t d = depths[di];
        /* the cache holds d tokens before each measurement (filled once,
         * measured tokens removed again) */
        if ((st = bm_feed(c, toks + filled, d - filled, cp.n_batch)) != KEEL_OK) goto fail_decode;
        filled = d;
        /* a recurrent state (or a ring) returns to d through a checkpoint */
        if (d > 0 && keel_mem_ckpt_bytes(c->mem) > 0 &&
            (st = keel_mem_ckpt_take(c->mem, 0)) != KEEL_OK)
            goto fail_mem;
        long flt_pp = 0, flt_tg = 0;
        for (int rep = 0; rep < reps; rep++) {
            double b = bench_read_bw_gbps(c->pool, BM_BW_BYTES, 2);
            if (b > bw) bw = b;
            /* the reference's buffer may have pushed weights out of the page
             * cache: one untimed token pages them back in */
            if ((st = bm_generate(c, toks[d % n_toks], 1, hp->n_vocab)) != KEEL_OK) goto fail_decode;
            if ((st = keel_mem_seq_rm(c->mem, 0, d, -1)) != KEEL_OK) goto fail_mem;
            if (n_pp > 0) {
                long f0 = bm_major_faults();
                uint64_t t0 = base_time_ns();
                if ((st = bm_feed(c, toks, n_pp, cp.n_batch)) != KEEL_OK) goto fail_decode;
                pp_t[rep] = (double)(base_time_ns() - t0) * 1e-9;
                flt_pp += bm_major_faults() - f0;
                if ((st = keel_mem_seq_rm(c->mem, 0, d, -1)) != KEEL_OK) goto fail_mem;
            }
            if (n_tg > 0) {
                long f0 = bm_major_faults();
                uint64_t t0 = base_time_ns();
                if ((st = bm_generate(c, toks[d % n_toks], n_tg, hp->n_vocab)) != KEEL_OK) goto fail_decode;
                tg_t[rep] = (double)(base_time_ns() - t0) * 1e-9;
                flt_tg += bm_major_faults() - f0;
                if ((st = keel_mem_seq_rm(c->mem, 0, d, -1)) != KEEL_OK) goto fail_mem;
            }
        }
        for (int k = 0; k < 2; k++) {
            bool tg = k == 1;
            int n = tg ? n_tg : n_pp;
            if (n == 0) continue;
            bm_row *row = &rows[n_rows++];
            row->tg = tg;
            row->n = n;
            row->depth = d;
            row->major_faults = tg ? flt_tg : flt_pp;
            double v[64];
            int nr = BASE_MIN(reps, 64);
            row->tps_best = 0;
            for (int i = 0; i < nr; i++) {
                v[i] = n / (tg ? tg_t[i] : pp_t[i]);
                if (v[i] > row->tps_best) row->tps_best = v[i];
            }
            stat2 sv = stats(v, nr);
            row->tps_mean = sv.mean;
            row->tps_sd = sv.sd;
            /* tg: each step sees d + 1 .. d + n cells; pp: queries see d + 1 .. d + n */
            double kv, af;
            bm_attn_at(&bm, d + (n + 1) / 2.0, &kv, &af);
            double n_ubatches = tg ? n : ceil((double)n / n_ub);
            row->weight_bytes = bm.weight_bytes_tok * n_ubatches / n;
            if (!tg && bm.expert_used_frac > 0) {
                /* a ubatch reads each expert any of its tokens chose */
                double u = (double)n / n_ubatches;
                double touched = 1.0 - pow(1.0 - bm.expert_used_frac, u);
                row->weight_bytes += bm.expert_bytes * (touched - bm.expert_used_frac) * n_ubatches / n;
            }
            row->kv_bytes = tg ? kv : 0.0;
            row->flops = bm.mm_flops_tok + af + bm.out_flops * (tg ? 1.0 : 1.0 / n);
        }
        for (int k = 0; profile && k < 2; k++) {
            int n = k ? n_tg : n_pp;
            if (n == 0) continue;
            st = bm_profile(c, m, d, k == 0, n, k ? toks + d % n_toks : toks, cp.n_batch, bw, peak, first_prof, o);
            first_prof = false;
            if (st != KEEL_OK) goto fail_decode;
            if ((st = keel_mem_seq_rm(c->mem, 0, d, -1)) != KEEL_OK) goto fail_mem;
        }
    }
    if (profile && o->json) bench_printf(o, "],\n ");
    /* recurrent models: a checkpoint's size, the time to take one and to
     * restore one (seq_rm one token back), after the measurements */
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
    const char *name = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    size_t wb = m->w.weight_bytes;
    const char *core = openblas_get_corename();
    if (o->json) {
        bench_printf(o,
                     "%s\"model\": \"%s\", \"arch\": \"%s\", \"type\": \"%s\", \"threads\": %d, \"simd\": \"%s\", "
                     "\"blas_core\": \"%s\", \"weight_bytes\": %zu, \"n_params\": %lld, \"type_k\": \"%s\", "
                     "\"type_v\": \"%s\", \"n_ubatch\": %d, \"read_bw_gbps\": %.2f, \"fma_peak_gflops\": %.1f, "
                     "\"sgemm_gflops\": %.1f, \"llc_bytes\": %zu, \"n_ctx\": %d, \"n_expert\": %d, "
                     "\"n_expert_used\": %d, \"active_params\": %.0f, \"active_weight_bytes_per_token\": %.0f,"
                     "\n \"rows\": [",
                     profile ? "" : "{", name, hp->arch_name, keel_dtype_name(m->w.main_dtype), threads,
                     keel_simd_name(), core ? core : "?", wb, (long long)m->w.n_params,
                     keel_dtype_name(cp.type_k), keel_dtype_name(cp.type_v), n_ub, bw, peak, sg, bm_llc_bytes(),
                     cp.n_ctx, hp->n_expert, hp->n_expert_used, bm.active_params, bm.weight_bytes_tok);
        for (int i = 0; i < n_rows; i++) {
            const bm_row *w = &rows[i];
            double bytes = w->weight_bytes + w->kv_bytes, bound = bytes > 0 ? bw * 1e9 / bytes : 0;
            double gflops = w->flops * w->tps_mean * 1e-9;
            bench_printf(o,
                         "%s\n  {\"test\": \"%s\", \"n\": %d, \"depth\": %d, \"tps\": %.2f, \"sd\": %.2f, "
                         "\"tps_best\": %.2f, \"weight_bytes_per_token\": %.0f, \"kv_bytes_per_token\": %.0f, "
                         "\"bound_tps\": %.2f, \"of_bound\": %.3f, \"gbps\": %.2f, \"flops_per_token\": %.0f, "
                         "\"gflops\": %.1f, \"of_fma_peak\": %.3f, \"major_faults\": %ld}",
                         i ? "," : "", w->tg ? "tg" : "pp", w->n, w->depth, w->tps_mean, w->tps_sd, w->tps_best,
                         w->weight_bytes, w->kv_bytes, bound, bound > 0 ? w->tps_best / bound : 0.0,
                         bytes * w->tps_best * 1e-9, w->flops, gflops, peak > 0 ? gflops / peak : 0.0,
                         w->major_faults);
        }
        bench_printf(o, "\n ],\n \"ckpt\": {\"bytes\": %zu, \"take_us\": %.2f, \"restore_us\": %.2f}}\n", ck_bytes,
                     ck_take_us, ck_restore_us);
    } else {
        char size[32], params[32];
        snprintf(size, sizeof size, "%.2f MiB", (double)wb / (1024.0 * 1024.0));
        snprintf(params, sizeof params, "%.2f M", (double)m->w.n_params / 1e6);
        bench_printf(o,
                     "\nkeel bench: %s, %s, %s weights, K %s / V %s cache of %d cells, %d threads, %s kernels "
                     "(OpenBLAS %s)\n",
                     name, size, keel_dtype_name(m->w.main_dtype), keel_dtype_name(cp.type_k),
                     keel_dtype_name(cp.type_v), cp.n_ctx, threads, keel_simd_name(), core ? core : "?");
        if (hp->n_expert > 0)
            bench_printf(o,
                         "mixture of experts: %d experts, %d per token: active parameters %.2f M of %.2f M, "
                         "weight bytes read per token %.2f MB of %.2f MB\n",
                         hp->n_expert, hp->n_expert_used, bm.active_params / 1e6, (double)m->w.n_params / 1e6,
                         bm.weight_bytes_tok * 1e-6, (double)wb * 1e-6);
        bench_printf(o, "references, same run: read bandwidth %.2f GB/s, fp32 FMA peak %.1f GFLOP/s, "
                        "sgemm %.1f GFLOP/s\n\n", bw, peak, sg);
        bench_printf(o, "| model | size | params | type | threads | test | t/s (best) | bytes/token | bound t/s | %% of bound | GFLOP/s | %% of FMA peak |\n");
        bench_printf(o, "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
        for (int i = 0; i < n_rows; i++) {
            const bm_row *w = &rows[i];
            char test[48];
            if (w->depth > 0)
                snprintf(test, sizeof test, "%s%d @ d%d", w->tg ? "tg" : "pp", w->n, w->depth);
            else
                snprintf(test, sizeof test, "%s%d", w->tg ? "tg" : "pp", w->n);
            double bytes = w->weight_bytes + w->kv_bytes, bound = bytes > 0 ? bw * 1e9 / bytes : 0;
            double gflops = w->flops * w->tps_mean * 1e-9;
            char bnd[48] = "-", ofb[16] = "-"; /* prompts are compute-bound: FLOP columns */
            if (w->tg) {
                snprintf(bnd, sizeof bnd, "%.1f", bound);
                snprintf(ofb, sizeof ofb, "%.0f%%", bound > 0 ? 100.0 * w->tps_best / bound : 0.0);
            }
            bench_printf(o, "| %s | %s | %s | %s | %d | %s | %.2f ± %.2f (%.2f) | %.2f MB | %s | %s | %.1f | %.0f%% |\n",
                         name, size, params, keel_dtype_name(m->w.main_dtype), threads, test, w->tps_mean,
                         w->tps_sd, w->tps_best, bytes * 1e-6, bnd, ofb, gflops,
                         peak > 0 ? 100.0 * gflops / peak : 0.0);
        }
        /* a fault reads up to the readahead window (128 KiB by default):
         * worth a warning once that passes 0.5% of what the runs read */
        long faults = 0;
        double disk = 0.0, moved = 0.0;
        for (int i = 0; i < n_rows; i++) {
            faults += rows[i].major_faults;
            disk += (double)rows[i].major_faults * 131072.0;
            moved += (rows[i].weight_bytes + rows[i].kv_bytes) * rows[i].n * reps;
        }
        size_t llc = bm_llc_bytes();
        bool in_llc = false;
        for (int i = 0; i < n_rows; i++)
            in_llc |= rows[i].tg && llc > 0 && rows[i].weight_bytes + rows[i].kv_bytes <= (double)llc;
        if (in_llc)
            bench_printf(o, "\nnote: the last-level cache (%.0f MiB) holds a tg row's bytes per token: that row is "
                            "partly served from it, and its %% of bound (DRAM read bandwidth) can pass 100%%\n",
                         (double)llc / (1024.0 * 1024.0));
        if (disk > 0.005 * moved)
            bench_printf(o, "\nwarning: %ld major page faults during the timed runs: weights were read from disk "
                            "(the page cache dropped them), so these figures are low; free memory or run again\n",
                         faults);
        if (ck_bytes > 0 && n_pp > 0) {
            /* a restore copies a record back: its bytes over the time, beside
             * the read bandwidth */
            double gbps = ck_restore_us > 0 ? (double)ck_bytes / (ck_restore_us * 1e3) : 0.0;
            bench_printf(o, "\ncheckpoint: %zu B, take %.1f us, restore %.1f us (restore %.2f GB/s = %.0f%% of "
                            "read bw %.2f)\n",
                         ck_bytes, ck_take_us, ck_restore_us, gbps, bw > 0 ? 100.0 * gbps / bw : 0.0, bw);
        }
    }
    goto done;
fail_mem:
    base_err(o->err, st, "bench model: cache: %s", keel_mem_last_error(c->mem));
    goto done;
fail_decode:
    base_err(o->err, st, "bench model: decode: %s", keel_context_last_error(c));
done:
    base_free(toks, tb);
    base_free(pp_t, (size_t)reps * sizeof(double));
    base_free(tg_t, (size_t)reps * sizeof(double));
    base_free(rows, BM_MAX_ROWS * sizeof(bm_row));
    keel_context_close(c);
    keel_model_close(m);
    return st;
}
