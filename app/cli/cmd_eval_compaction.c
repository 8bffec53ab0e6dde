/*
 * cmd_eval_compaction.c — `keel eval-compaction -m MODEL -f TEXT [--json]`:
 * the quality of KV compaction. The text (tokenized with BOS) is streamed
 * through the model as one sequence, in prefill chunks, with the cache held
 * under a budget by compaction; every token is scored (negative
 * log-likelihood of the next token) and its next-token distribution is
 * compared with the full baseline (KL divergence).
 *
 * Baselines:
 *   full           the text chunked at the model's trained context T exactly
 *                  as llama-perplexity does it (complete chunks, first token
 *                  replaced by BOS, the second half of each chunk scored:
 *                  every scored token sees at least T/2 tokens of context);
 *   sliding        a plain sliding window without sinks (policy window, 0
 *                  sinks), per budget.
 * Cells: every policy x budgets (64, 128, 256) x positions keep/renumber.
 * A budget b means trigger b, target b/2, 4 sinks (--kv-sinks), a quarter of
 * the target reserved for recent tokens (--kv-recent). Every run is scored on the same tokens as the
 * full baseline (PPL over them; KL of the next-token distributions on them).
 */
#include "cli.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *g_usage =
    "usage: keel eval-compaction -m MODEL -f TEXT [--json] [--budgets 64,128,256]\n"
    "                            [--policies window,keydiff,knorm,random] [--chunk N] [-t N]";

typedef struct ev_opts {
    const char *budgets, *policies;
    int32_t chunk;
} ev_opts;

static bool ev_extra(cli_opts *o, const char *a, const char *v, bool *takes)
{
    ev_opts *e = o->user;
    (void)takes;
    if (strcmp(a, "--budgets") == 0) {
        e->budgets = v;
        return true;
    }
    if (strcmp(a, "--policies") == 0) {
        e->policies = v;
        return true;
    }
    if (strcmp(a, "--chunk") == 0) {
        e->chunk = v ? atoi(v) : 0;
        return true;
    }
    return false;
}

/* log-softmax of logits into out (double precision sums) */
static void log_softmax(const float *l, int32_t V, float *out)
{
    double mx = l[0];
    for (int32_t v = 1; v < V; v++) mx = l[v] > mx ? l[v] : mx;
    double s = 0.0;
    for (int32_t v = 0; v < V; v++) s += exp((double)l[v] - mx);
    double lse = mx + log(s);
    for (int32_t v = 0; v < V; v++) out[v] = (float)((double)l[v] - lse);
}

typedef struct ev_result {
    const char *policy;
    int32_t budget;
    bool renumber;
    double ppl, ratio, kld;
    int64_t compactions;
    double seconds;
    keel_status st;
} ev_result;

/* Streams the text with one compaction setting; returns PPL and KL. */
static keel_status run_stream(keel_model *m, const cli_opts *o, const int32_t *toks, int32_t n,
                              const float *full_lp, const uint8_t *scored, int32_t V,
                              const keel_compact_params *cp, int32_t budget, int32_t chunk,
                              ev_result *r, float *lp)
{
    keel_context_params p = o->ctx;
    p.n_ctx = budget;
    p.n_batch = chunk;
    p.n_ubatch = chunk;
    p.n_outputs = chunk;
    p.compact = *cp;
    keel_context *c = NULL;
    char err[256] = "";
    keel_status st = keel_context_open(m, &p, &c, err);
    if (st != KEEL_OK) {
        fprintf(stderr, "keel eval-compaction: %s %d: %s\n", keel_compact_policy_name(cp->policy), budget, err);
        return st;
    }
    int8_t *flags = malloc((size_t)chunk);
    memset(flags, 1, (size_t)chunk);
    double nll = 0.0, kl = 0.0;
    int64_t cnt = 0;
    uint64_t t0 = keel_time_ns();
    for (int32_t i = 0; i < n - 1 && st == KEEL_OK; i += chunk) {
        int32_t k = n - 1 - i < chunk ? n - 1 - i : chunk;
        keel_batch b = {k, toks + i, NULL, NULL, flags};
        st = keel_decode(c, &b);
        if (st != KEEL_OK) {
            fprintf(stderr, "keel eval-compaction: decode: %s\n", keel_context_last_error(c));
            break;
        }
        for (int32_t j = 0; j < k; j++) {
            int32_t t = i + j; /* logits at t predict token t + 1 */
            if (!scored[t + 1]) continue;
            log_softmax(keel_logits(c, j), V, lp);
            nll -= lp[toks[t + 1]];
            const float *f = full_lp + (size_t)t * (size_t)V;
            double d = 0.0;
            for (int32_t v = 0; v < V; v++) d += exp((double)f[v]) * ((double)f[v] - (double)lp[v]);
            kl += d;
            cnt++;
        }
    }
    r->seconds = (double)(keel_time_ns() - t0) * 1e-9;
    r->compactions = keel_mem_seq_compactions(keel_context_memory(c), 0);
    free(flags);
    keel_context_close(c);
    if (st != KEEL_OK) return st;
    r->ppl = exp(nll / (double)cnt);
    r->kld = kl / (double)cnt;
    return KEEL_OK;
}

int cmd_eval_compaction(int argc, char **argv)
{
    cli_opts o;
    cli_opts_init(&o);
    ev_opts e = {"64,128,256", "window,keydiff,knorm,random", 16};
    o.extra = ev_extra;
    o.user = &e;
    int rc = cli_parse(argc, argv, &o, g_usage);
    if (rc) return rc == 1 ? 0 : rc;
    if (!o.file) {
        fprintf(stderr, "%s\n", g_usage);
        return 2;
    }
    keel_model *m = NULL;
    if ((rc = cli_open_model(&o, &m))) return rc;
    keel_model_info mi;
    keel_model_info_get(m, &mi);
    int32_t *toks = NULL, n = 0;
    float *full_lp = NULL, *lp = NULL;
    uint8_t *scored = NULL;
    ev_result *res = NULL;
    int n_res = 0;
    if ((rc = cli_prompt_ids(&o, m, &toks, &n))) goto done;
    int32_t V = mi.n_vocab, T = mi.n_ctx_train;
    if ((double)n * V * sizeof(float) > 2e9) {
        rc = cli_fail("eval-compaction", KEEL_ERANGE, "text x vocabulary too large for the baseline's distributions (2 GB)");
        goto done;
    }
    full_lp = malloc((size_t)n * (size_t)V * sizeof(float));
    lp = malloc((size_t)V * sizeof(float));
    scored = calloc((size_t)n, 1);
    if (!full_lp || !lp || !scored) {
        rc = cli_fail("eval-compaction", KEEL_ENOMEM, NULL);
        goto done;
    }
    /* full baseline: chunks of the trained context */
    {
        keel_context_params p = o.ctx;
        p.n_ctx = T;
        p.n_batch = T;
        p.n_ubatch = T < 512 ? T : 512;
        p.n_outputs = T;
        keel_context *c = NULL;
        char err[256] = "";
        keel_status st = keel_context_open(m, &p, &c, err);
        if (st != KEEL_OK) {
            rc = cli_fail("context", st, err);
            goto done;
        }
        int8_t *flags = malloc((size_t)T);
        memset(flags, 1, (size_t)T);
        double nll = 0.0;
        int64_t cnt = 0;
        for (int32_t s = 0; s + T <= n; s += T) {
            int32_t k = T;
            keel_mem_clear(keel_context_memory(c));
            int32_t saved = toks[s];
            if (mi.add_bos && mi.bos >= 0) toks[s] = mi.bos;
            keel_batch b = {k, toks + s, NULL, NULL, flags};
            st = keel_decode(c, &b);
            toks[s] = saved;
            if (st != KEEL_OK) break;
            for (int32_t j = 0; j < k; j++) {
                log_softmax(keel_logits(c, j), V, full_lp + (size_t)(s + j) * (size_t)V);
                if (j >= T / 2 && j + 1 < k) {
                    scored[s + j + 1] = 1;
                    nll -= full_lp[(size_t)(s + j) * (size_t)V + (size_t)toks[s + j + 1]];
                    cnt++;
                }
            }
        }
        free(flags);
        keel_context_close(c);
        if (st != KEEL_OK) {
            rc = cli_fail("baseline", st, NULL);
            goto done;
        }
        res = calloc(64, sizeof(ev_result));
        res[0].policy = "full";
        res[0].budget = T;
        res[0].ppl = exp(nll / (double)cnt);
        res[0].ratio = 1.0;
        n_res = 1;
        fprintf(stderr, "eval-compaction: %d tokens, %lld scored, full baseline at the trained context %d: PPL %.4f\n",
                n, (long long)cnt, T, res[0].ppl);
    }
    /* policies x budgets x positions, plus the sliding-window baseline */
    char pols[256];
    snprintf(pols, sizeof pols, "sliding,%s", e.policies);
    for (char *save = NULL, *pn = strtok_r(pols, ",", &save); pn; pn = strtok_r(NULL, ",", &save)) {
        keel_compact_params cp = keel_compact_params_default();
        bool sliding = strcmp(pn, "sliding") == 0;
        if (sliding)
            cp.policy = KEEL_COMPACT_WINDOW;
        else if (keel_compact_policy_from_name(pn, &cp.policy) != KEEL_OK || cp.policy == KEEL_COMPACT_NONE) {
            fprintf(stderr, "keel eval-compaction: unknown policy '%s'\n", pn);
            rc = 2;
            goto done;
        }
        char buds[128];
        snprintf(buds, sizeof buds, "%s", e.budgets);
        for (char *s2 = NULL, *bs = strtok_r(buds, ",", &s2); bs; bs = strtok_r(NULL, ",", &s2)) {
            int32_t budget = atoi(bs);
            if (budget < 8) {
                rc = cli_fail("eval-compaction", KEEL_EINVAL, "budgets must be >= 8");
                goto done;
            }
            for (int renum = 0; renum < 2 && n_res < 64; renum++) {
                cp.trigger = budget;
                cp.target = budget / 2;
                cp.n_sink = sliding ? 0 : o.ctx.compact.n_sink;
                cp.recent = o.ctx.compact.recent;
                cp.renumber = renum;
                int32_t chunk = e.chunk > 0 ? e.chunk : 16;
                if (chunk > cp.trigger - cp.target) chunk = cp.trigger - cp.target;
                ev_result *r = &res[n_res];
                r->policy = sliding ? "sliding" : keel_compact_policy_name(cp.policy);
                r->budget = budget;
                r->renumber = renum;
                r->st = run_stream(m, &o, toks, n, full_lp, scored, V, &cp, budget, chunk, r, lp);
                if (r->st != KEEL_OK) {
                    rc = 1;
                    goto done;
                }
                r->ratio = r->ppl / res[0].ppl;
                n_res++;
            }
        }
    }
    if (o.json) {
        printf("[");
        for (int i = 0; i < n_res; i++)
            printf("%s\n {\"policy\": \"%s\", \"budget\": %d, \"positions\": \"%s\", \"ppl\": %.4f, "
                   "\"ppl_ratio\": %.4f, \"kld\": %.5f, \"compactions\": %lld, \"seconds\": %.3f}",
                   i ? "," : "", res[i].policy, res[i].budget, i == 0 ? "keep" : res[i].renumber ? "renumber" : "keep",
                   res[i].ppl, res[i].ratio, res[i].kld, (long long)res[i].compactions, res[i].seconds);
        printf("\n]\n");
    } else {
        printf("| policy  | budget | positions | PPL       | PPL / full | KL vs full | compactions |\n");
        printf("|---------|-------:|-----------|----------:|-----------:|-----------:|------------:|\n");
        for (int i = 0; i < n_res; i++)
            printf("| %-7s | %6d | %-9s | %9.4f | %10.4f | %10.5f | %11lld |\n", res[i].policy,
                   res[i].budget, i == 0 ? "-" : res[i].renumber ? "renumber" : "keep", res[i].ppl,
                   res[i].ratio, res[i].kld, (long long)res[i].compactions);
    }
done:
    free(res);
    free(scored);
    free(lp);
    free(full_lp);
    free(toks);
    keel_model_close(m);
    return rc;
}
