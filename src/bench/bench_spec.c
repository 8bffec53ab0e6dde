/*
 * bench_spec.c — `keel bench spec -m MODEL [-n 128] [-k 8] [-p 64] [-t N]
 * [-r R] [--json]`: greedy decode speed with speculative decoding against
 * the acceptance rate, beside plain decoding of the same text. The drafts
 * are the known continuation (plain decoding's output), each token right
 * with a set probability, so the curve runs from 0% to 100% acceptance on
 * any model; each rate is measured with a fixed draft length (k) and with
 * the adaptive back-off. A last row drafts by prompt lookup (n-gram) over
 * the model's own text. Each repetition of a row opens a fresh spec (as
 * keel run does, so the back-off's start is paid) and is followed by a
 * plain run; a row's speed-up is its best over that plain run's best, so
 * a host whose speed drifts during the bench moves both.
 *
 * Before the curve it measures what the back-off's choice rests on: c(k),
 * the time of a verify batch of k + 1 tokens over one plain decode step's,
 * for k = 1, 2, 4, 8 (up to -k) and -k, at the end of the text (each batch
 * decoded, then taken back), the sizes interleaved, best of 15 rounds each
 * (with -t 1 from the thread's CPU time, which time slicing on a shared
 * machine does not inflate; else from wall time).
 * From c(k) it prints the best speed-up the back-off could reach at a given
 * acceptance: max over k of (1 - a^(k+1)) / (1 - a) / c(k) for a the
 * chance that each draft is right (the rates of the curve), and max over k
 * of (1 + a k) / c(k) for a the realized acceptance (accepted / drafted,
 * the curve's "accepted" column), and the c(k) a 2.5x speed-up would need.
 * --profile adds where the time of a 1-token step and of the largest
 * verify batch goes, per kernel kind.
 */
#include "bench.h"

#include "../engine/engine.h"
#include "../tensor/tensor.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

typedef struct spec_run {
    double tok_s;
    int64_t drafted, accepted;
    int32_t same; /* leading tokens equal to plain decoding's */
} spec_run;

static int32_t argmax(const float *x, int32_t n)
{
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Greedy generation of n tokens after prompt (sp NULL: plain). */
static keel_status gen(keel_context *c, keel_spec *sp, const int32_t *prompt, int32_t np, int32_t n, int32_t k,
                       int32_t *out, spec_run *r, char *err)
{
    keel_mem *mem = keel_context_memory(c);
    keel_status st = keel_mem_seq_rm(mem, -1, -1, -1);
    if (st != KEEL_OK) return base_err(err, st, "bench spec: clearing the cache");
    int32_t nv = c->model->w.hp.n_vocab;
    int32_t *hist = base_alloc((size_t)(np + n + 1) * sizeof(int32_t));
    if (!hist) return base_err(err, KEEL_ENOMEM, "bench spec: out of memory");
    memcpy(hist, prompt, (size_t)np * sizeof(int32_t));
    int32_t nh = np;
    /* the prompt in chunks of the context's batch size, the last one's
     * last row with logits */
    int32_t nb = 0;
    for (int32_t at = 0; at < np; at += nb) {
        nb = BASE_MIN(np - at, c->p.n_batch);
        keel_batch b = {nb, (int32_t *)prompt + at, NULL, NULL, NULL};
        if ((st = keel_decode(c, &b)) != KEEL_OK) goto fail;
    }
    uint64_t t0 = keel_time_ns();
    int32_t got = 0, tok = argmax(keel_logits(c, nb - 1), nv);
    out[got++] = tok;
    hist[nh++] = tok;
    r->drafted = r->accepted = 0;
    while (got < n) {
        int32_t batch[KEEL_SPEC_MAX_DRAFT + 1], kk = 0;
        int8_t want[KEEL_SPEC_MAX_DRAFT + 1];
        if (sp && (st = keel_spec_draft(sp, 0, hist, nh, batch + 1, BASE_MIN(k, n - got), &kk)) != KEEL_OK) goto fail;
        batch[0] = tok;
        memset(want, 1, sizeof want);
        int32_t n0 = keel_mem_seq_pos_max(mem, 0) + 1;
        keel_batch sb = {kk + 1, batch, NULL, NULL, want};
        uint64_t s0 = keel_time_ns();
        if ((st = kk ? keel_decode_spec(c, &sb) : keel_decode(c, &sb)) != KEEL_OK) goto fail;
        uint64_t s1 = keel_time_ns();
        int32_t a = 0;
        for (;;) {
            tok = argmax(keel_logits(c, a), nv);
            out[got++] = tok;
            hist[nh++] = tok;
            if (a == kk || tok != batch[a + 1] || got == n) break;
            a++;
        }
        r->drafted += kk;
        r->accepted += a;
        if (sp) keel_spec_result(sp, 0, kk, a, s1 - s0);
        int32_t resume = 0;
        if (a < kk && (st = keel_context_rewind(c, 0, n0 + 1 + a, &resume)) != KEEL_OK) goto fail;
    }
    r->tok_s = (double)(n - 1) / ((double)(keel_time_ns() - t0) * 1e-9);
    base_free(hist, (size_t)(np + n + 1) * sizeof(int32_t));
    return KEEL_OK;
fail:
    base_free(hist, (size_t)(np + n + 1) * sizeof(int32_t));
    return base_err(err, st, "bench spec: decode: %s", keel_context_last_error(c));
}

/* ---- c(k): the cost of a verify batch ----------------------------------------------- */

#define VC_MAX   6  /* batch sizes measured: 1 and k + 1 for up to 5 k */
#define VC_ROUNDS 15

/* The calling thread's CPU time in ns. */
static double vc_cpu_ns(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0.0;
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* One batch of n tokens at the end of sequence 0, every row with logits,
 * then taken back: its wall time in ns (0 on failure, st set), and in
 * *cpu the calling thread's CPU time (the whole work with one thread). */
static uint64_t vc_once(keel_context *c, const int32_t *toks, int32_t n, keel_status *st, double *cpu)
{
    int32_t batch[KEEL_SPEC_MAX_DRAFT + 1];
    int8_t want[KEEL_SPEC_MAX_DRAFT + 1];
    memcpy(batch, toks, (size_t)n * sizeof(int32_t));
    memset(want, 1, sizeof want);
    int32_t n0 = keel_mem_seq_pos_max(keel_context_memory(c), 0) + 1;
    keel_batch b = {n, batch, NULL, NULL, want};
    double c0 = vc_cpu_ns();
    uint64_t t0 = keel_time_ns();
    *st = n > 1 ? keel_decode_spec(c, &b) : keel_decode(c, &b);
    uint64_t t1 = keel_time_ns();
    *cpu = vc_cpu_ns() - c0;
    if (*st != KEEL_OK) return 0;
    int32_t resume = 0;
    if ((*st = keel_context_rewind(c, 0, n0, &resume)) != KEEL_OK) return 0;
    return t1 - t0;
}

/* Sums of the profile entries of the calling thread per kind (ns), the
 * matrix products (matvec for one token, matmul for a batch) together. */
#define VC_KINDS 5
static void vc_prof_sum(double *ns)
{
    const tensor_prof_entry *e;
    int ne = tensor_prof_get(&e);
    for (int i = 0; i < VC_KINDS; i++) ns[i] = 0;
    for (int i = 0; i < ne; i++) {
        int k = e[i].kind == TENSOR_PROF_MATVEC ? 0 : (int)e[i].kind - 1;
        if (k >= 0 && k < VC_KINDS) ns[k] += (double)e[i].ns;
    }
}

/* c(k) for the sizes sz[0] = 1, sz[1..nsz): best of VC_ROUNDS each,
 * interleaved; with profile, where the time of sizes 1 and sz[nsz - 1]
 * goes. */
static keel_status verify_costs(keel_context *c, const int32_t *toks, const int32_t *sz, int nsz, bool profile,
                                bench_out *o)
{
    double best[VC_MAX] = {0}, bcpu[VC_MAX] = {0}, cpu = 0;
    keel_status st = KEEL_OK;
    for (int r = 0; r < VC_ROUNDS; r++)
        for (int i = 0; i < nsz; i++) {
            uint64_t ns = vc_once(c, toks, sz[i], &st, &cpu);
            if (st != KEEL_OK) return base_err(o->err, st, "bench spec: verify batch: %s", keel_context_last_error(c));
            if (best[i] == 0 || (double)ns < best[i]) best[i] = (double)ns;
            if (bcpu[i] == 0 || cpu < bcpu[i]) bcpu[i] = cpu;
        }
    /* with one thread its CPU time is the work, whatever else runs on the
     * machine: the costs then come from it (and the wall times are shown) */
    bool by_cpu = base_pool_threads(c->pool) == 1 && bcpu[0] > 0;
    double cost[VC_MAX];
    for (int i = 0; i < nsz; i++) cost[i] = by_cpu ? bcpu[i] / bcpu[0] : best[i] / best[0];
    static const double as[] = {0.5, 0.7, 0.8, 0.9};
    if (o->json) {
        bench_printf(o, "\"step_us\": %.2f, \"step_cpu_us\": %.2f, \"verify\": [", best[0] * 1e-3, bcpu[0] * 1e-3);
        for (int i = 1; i < nsz; i++)
            bench_printf(o, "%s{\"k\": %d, \"us\": %.2f, \"cpu_us\": %.2f, \"c\": %.4f, \"c_wall\": %.4f}",
                         i > 1 ? ", " : "", sz[i] - 1, best[i] * 1e-3, bcpu[i] * 1e-3, cost[i], best[i] / best[0]);
        bench_printf(o, "], ");
    } else {
        bench_printf(o, "verify cost (best of %d, interleaved; c(k) by %s): a plain step %.0f us (CPU %.0f us)\n",
                     VC_ROUNDS, by_cpu ? "the thread's CPU time" : "wall time", best[0] * 1e-3, bcpu[0] * 1e-3);
        for (int i = 1; i < nsz; i++)
            bench_printf(o, "  k = %2d: %2d tokens %8.0f us (CPU %.0f us), c(k) = %.2f (wall %.2f), %.2f steps per token\n",
                         sz[i] - 1, sz[i], best[i] * 1e-3, bcpu[i] * 1e-3, cost[i], best[i] / best[0], cost[i] / sz[i]);
        /* the best fixed k under these costs, and what 2.5x would need */
        for (size_t ai = 0; ai < BASE_ARRAY_LEN(as); ai++) {
            double a = as[ai], bp = 0, br = 0;
            int kp = 0, kr = 0;
            for (int i = 1; i < nsz; i++) {
                int k = sz[i] - 1;
                double c_k = cost[i];
                double sp = (1.0 - pow(a, k + 1)) / (1.0 - a) / c_k, sr = (1.0 + a * k) / c_k;
                if (sp > bp) bp = sp, kp = k;
                if (sr > br) br = sr, kr = k;
            }
            bench_printf(o, "  at %.0f%%: best %.2fx (k = %d) if each draft is right with p = %.2f; %.2fx (k = %d) "
                            "at realized acceptance %.2f\n", 100 * a, bp, kp, a, br, kr, a);
        }
        bench_printf(o, "  2.5x at 70%% would need c(k) <=");
        for (int i = 1; i < nsz; i++) {
            int k = sz[i] - 1;
            bench_printf(o, " %.2f (k = %d, p) / %.2f (realized)%s", (1.0 - pow(0.7, k + 1)) / 0.3 / 2.5,
                         k, (1.0 + 0.7 * k) / 2.5, i + 1 < nsz ? ";" : "\n");
        }
    }
    if (!profile || o->json) return KEEL_OK;
    static const char *const kinds[VC_KINDS] = {"matrix products", "attention", "norm", "rope", "activation"};
    double ns[2][VC_KINDS], tot[2], runs[2];
    int pick[2] = {0, nsz - 1};
    for (int j = 0; j < 2; j++) {
        base_pool *pool = c->pool;
        tensor_prof_reset();
        tensor_prof_enable(true);
        base_pool_profile(pool, true);
        uint64_t t = 0;
        for (int r = 0; r < VC_ROUNDS && st == KEEL_OK; r++) t += vc_once(c, toks, sz[pick[j]], &st, &cpu);
        tensor_prof_enable(false);
        base_pool_stats ps;
        base_pool_stats_get(pool, &ps);
        base_pool_profile(pool, false);
        if (st != KEEL_OK) return base_err(o->err, st, "bench spec: verify batch: %s", keel_context_last_error(c));
        vc_prof_sum(ns[j]);
        tot[j] = (double)t / VC_ROUNDS;
        runs[j] = (double)ps.runs / VC_ROUNDS;
        for (int i = 0; i < VC_KINDS; i++) ns[j][i] /= VC_ROUNDS;
    }
    bench_printf(o, "where the time goes (mean of %d, us): | kind | 1 token | %d tokens | ratio |\n", VC_ROUNDS,
                 sz[pick[1]]);
    double known[2] = {0, 0};
    for (int i = 0; i < VC_KINDS; i++) {
        known[0] += ns[0][i];
        known[1] += ns[1][i];
        if (ns[0][i] + ns[1][i] > 0)
            bench_printf(o, "  | %s | %.0f | %.0f | %.2f |\n", kinds[i], ns[0][i] * 1e-3, ns[1][i] * 1e-3,
                         ns[0][i] > 0 ? ns[1][i] / ns[0][i] : 0.0);
    }
    bench_printf(o, "  | other | %.0f | %.0f | %.2f |\n  | step | %.0f | %.0f | %.2f |\n", (tot[0] - known[0]) * 1e-3,
                 (tot[1] - known[1]) * 1e-3, (tot[1] - known[1]) / (tot[0] - known[0]), tot[0] * 1e-3, tot[1] * 1e-3,
                 tot[1] / tot[0]);
    bench_printf(o, "  parallel jobs per step: %.1f / %.1f\n", runs[0], runs[1]);
    return KEEL_OK;
}

keel_status bench_spec(int argc, char **argv, bench_out *o)
{
    static const bench_flag flags[] = {{"-m", true}, {"-n", true}, {"-k", true}, {"-p", true},
                                       {"-t", true}, {"-r", true}, {"--ctk", true}, {"--ctv", true},
                                       {"--deterministic", false}, {"-f", true},
                                       {"--profile", false}};
    keel_status st = bench_check_args(o, "spec", argc, argv, flags, BASE_ARRAY_LEN(flags));
    if (st != KEEL_OK) return st;
    const char *path = bench_opt(argc, argv, "-m");
    if (!path) return base_err(o->err, KEEL_EINVAL, "bench spec: -m MODEL is required");
    int64_t n, k, np, threads, reps, np_cap = 0;
    if ((st = bench_int_opt(o, "spec", argc, argv, "-n", 16, 4096, 128, &n)) != KEEL_OK ||
        (st = bench_int_opt(o, "spec", argc, argv, "-k", 1, KEEL_SPEC_MAX_DRAFT, 8, &k)) != KEEL_OK ||
        (st = bench_int_opt(o, "spec", argc, argv, "-p", 8, 1 << 16, 64, &np)) != KEEL_OK ||
        (st = bench_int_opt(o, "spec", argc, argv, "-t", 0, 256, 0, &threads)) != KEEL_OK ||
        (st = bench_int_opt(o, "spec", argc, argv, "-r", 1, 20, 2, &reps)) != KEEL_OK)
        return st;
    keel_model_params mp = keel_model_params_default();
    mp.path = path;
    keel_model *m = NULL;
    keel_context *c = NULL;
    keel_spec *sp = NULL;
    int32_t *prompt = NULL, *ref = NULL, *out = NULL;
    char err[256] = "";
    if ((st = keel_model_open(&mp, &m, err)) != KEEL_OK) return base_err(o->err, st, "bench spec: %s: %s", path, err);
    keel_context_params cp = keel_context_params_default();
    cp.n_ctx = (int32_t)(np + n + k + 8);
    cp.n_threads = (int32_t)threads;
    cp.n_outputs = (int32_t)k + 1;
    cp.speculative = true;
    for (int i = 0; i < argc; i++) cp.deterministic |= strcmp(argv[i], "--deterministic") == 0;
    const char *kt = bench_opt(argc, argv, "--ctk"), *vt = bench_opt(argc, argv, "--ctv");
    if ((kt && keel_dtype_from_name(kt, &cp.type_k) != KEEL_OK) || (vt && keel_dtype_from_name(vt, &cp.type_v) != KEEL_OK)) {
        st = base_err(o->err, KEEL_EINVAL, "bench spec: unknown cache type");
        goto out;
    }
    if ((st = keel_context_open(m, &cp, &c, err)) != KEEL_OK) {
        base_err(o->err, st, "bench spec: context: %s", err);
        goto out;
    }
    int32_t nv = m->w.hp.n_vocab;
    np_cap = np;
    prompt = base_alloc((size_t)np * sizeof(int32_t));
    ref = base_alloc((size_t)n * sizeof(int32_t));
    out = base_alloc((size_t)n * sizeof(int32_t));
    if (!prompt || !ref || !out) {
        st = base_err(o->err, KEEL_ENOMEM, "bench spec: out of memory");
        goto out;
    }
    const char *fpath = bench_opt(argc, argv, "-f");
    if (fpath) {
        /* the prompt: the file's first np tokens (a text to continue, or
         * an agent's context to answer from) */
        size_t flen = 0;
        char *text = NULL;
        FILE *f = fopen(fpath, "rb");
        if (f) {
            text = base_alloc(1 << 20);
            if (text) flen = fread(text, 1, (1 << 20) - 1, f);
            if (fclose(f) != 0) flen = 0;
        }
        int32_t need = 0, got = 0;
        int32_t *all = NULL;
        if (text && flen > 0) {
            st = keel_tokenize(m, text, flen, true, false, NULL, 0, &need);
            if ((st == KEEL_OK || st == KEEL_ERANGE) && need > 0 && (all = base_alloc((size_t)need * sizeof(int32_t))))
                st = keel_tokenize(m, text, flen, true, false, all, need, &got);
        }
        if (text) base_free(text, 1 << 20);
        if (!all || st != KEEL_OK || got < 8) {
            if (all) base_free(all, (size_t)need * sizeof(int32_t));
            st = base_err(o->err, KEEL_EIO, "bench spec: -f %s: cannot read or tokenize it (8 tokens at least)", fpath);
            goto out;
        }
        if (got < np) np = got;
        memcpy(prompt, all, (size_t)np * sizeof(int32_t));
        base_free(all, (size_t)need * sizeof(int32_t));
    } else {
        for (int64_t i = 0; i < np; i++) prompt[i] = (int32_t)((i * 7919 + 13) % nv);
    }
    spec_run plain = {0, 0, 0, 0}, r;
    for (int64_t i = 0; i < reps; i++) { /* best of reps; the first also gives the text */
        if ((st = gen(c, NULL, prompt, (int32_t)np, (int32_t)n, 0, i ? out : ref, &r, o->err)) != KEEL_OK) goto out;
        if (r.tok_s > plain.tok_s) plain = r;
    }
    static const double rates[] = {0.0, 0.25, 0.5, 0.7, 0.8, 0.9, 0.95, 1.0};
    if (!o->json) {
        bench_printf(o, "speculative decoding, %s: %lld tokens after %lld, greedy, drafts of up to %lld\n", path,
                     (long long)n, (long long)np, (long long)k);
        bench_printf(o, "plain decoding (reference, same run): %.1f tok/s\n", plain.tok_s);
    } else {
        bench_printf(o, "{\"bench\": \"spec\", \"model\": \"%s\", \"n\": %lld, \"k\": %lld, \"plain_tok_s\": %.3f, ",
                     path, (long long)n, (long long)k, plain.tok_s);
    }
    {
        /* c(k) at the end of the text (its tokens, repeated as needed) */
        int32_t vtok[KEEL_SPEC_MAX_DRAFT + 1], sz[VC_MAX] = {1};
        for (int64_t i = 0; i <= k; i++) vtok[i] = ref[i % n];
        int nsz = 1;
        for (int64_t kk = 1; kk <= k && kk <= 8; kk *= 2) sz[nsz++] = (int32_t)kk + 1;
        if (sz[nsz - 1] != k + 1) sz[nsz++] = (int32_t)k + 1;
        if ((st = verify_costs(c, vtok, sz, nsz, bench_has_flag(argc, argv, "--profile"), o)) != KEEL_OK) goto out;
    }
    if (!o->json)
        bench_printf(o, "%-12s %-9s %10s %9s %9s %8s %6s\n", "drafts", "mode", "accepted", "tok/s", "plain", "speedup",
                     "same");
    else
        bench_printf(o, "\"rows\": [");
    bool first = true;
    for (int32_t ri = 0; ri <= (int32_t)BASE_ARRAY_LEN(rates); ri++) {
        bool ngram = ri == (int32_t)BASE_ARRAY_LEN(rates);
        for (int32_t ad = 0; ad < 2; ad++) {
            if (ngram && ad == 0) continue;
            keel_spec_params p = keel_spec_params_default();
            p.kind = KEEL_SPEC_NGRAM;
            p.max_draft = (int32_t)k;
            p.adaptive = ad == 1;
            /* each repetition a fresh spec (as keel run starts), and a
             * plain run right after it: the row's speed-up is against
             * the host's speed of the moment */
            spec_run best = {0, 0, 0, 0}, pbest = {0, 0, 0, 0};
            for (int64_t i = 0; i < reps; i++) {
                if ((st = keel_spec_open(&p, m, NULL, NULL, 1, (int32_t)(np + n + 1), &sp, err)) != KEEL_OK) {
                    base_err(o->err, st, "bench spec: %s", err);
                    goto out;
                }
                if (!ngram) spec_set_oracle(sp, ref, (int32_t)n, (int32_t)np, rates[ri], 1234 + (uint64_t)i);
                if ((st = gen(c, sp, prompt, (int32_t)np, (int32_t)n, (int32_t)k, out, &r, o->err)) != KEEL_OK) goto out;
                keel_spec_close(sp);
                sp = NULL;
                /* batch-invariant numerics: the text is plain decoding's,
                 * exactly; else it is until a near-tie resolves otherwise */
                int32_t same = 0;
                while (same < n && out[same] == ref[same]) same++;
                if (cp.deterministic && same < n) {
                    st = base_err(o->err, KEEL_EINTERNAL, "bench spec: token %d differs from plain decoding", same);
                    goto out;
                }
                r.same = same;
                if (r.tok_s > best.tok_s) best = r;
                spec_run pr;
                if ((st = gen(c, NULL, prompt, (int32_t)np, (int32_t)n, 0, out, &pr, o->err)) != KEEL_OK) goto out;
                if (pr.tok_s > pbest.tok_s) pbest = pr;
            }
            double acc = best.drafted ? (double)best.accepted / (double)best.drafted : 0.0;
            char what[32];
            if (ngram) snprintf(what, sizeof what, "n-gram");
            else snprintf(what, sizeof what, "oracle %3.0f%%", 100.0 * rates[ri]);
            if (!o->json)
                bench_printf(o, "%-12s %-9s %9.1f%% %9.1f %9.1f %7.2fx %6d\n", what, ad ? "adaptive" : "fixed",
                             100.0 * acc, best.tok_s, pbest.tok_s, best.tok_s / pbest.tok_s, best.same);
            else
                bench_printf(o,
                             "%s{\"drafts\": \"%s\", \"rate\": %.2f, \"adaptive\": %s, \"drafted\": %lld, "
                             "\"accepted\": %lld, \"tok_s\": %.3f, \"plain_tok_s\": %.3f, \"speedup\": %.4f, "
                             "\"same_tokens\": %d}",
                             first ? "" : ", ", ngram ? "ngram" : "oracle", ngram ? -1.0 : rates[ri],
                             ad ? "true" : "false", (long long)best.drafted, (long long)best.accepted, best.tok_s,
                             pbest.tok_s, best.tok_s / pbest.tok_s, best.same);
            first = false;
        }
    }
    if (o->json) bench_printf(o, "]}\n");
out:
    keel_spec_close(sp);
    base_free(prompt, (size_t)np_cap * sizeof(int32_t));
    base_free(ref, (size_t)n * sizeof(int32_t));
    base_free(out, (size_t)n * sizeof(int32_t));
    keel_context_close(c);
    keel_model_close(m);
    return st;
}
