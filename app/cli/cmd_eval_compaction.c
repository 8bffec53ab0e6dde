/*
 * cmd_eval_compaction.c — `keel eval-compaction -m MODEL -f TEXT [--json]`:
 * the quality of KV compaction. Owns the command's options (validated here,
 * before the model opens) and the perplexity task; the retrieval task is in
 * eval_retrieval.c.
 *
 * Perplexity task (default): the text (tokenized with BOS) is streamed
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
 *                  so the text must hold at least T tokens;
 *   sliding        a plain sliding window without sinks (policy window, 0
 *                  sinks), per budget.
 * Cells: every policy x budgets (64, 128, 256) x positions keep/renumber.
 * A budget b means trigger b, target b/2, 4 sinks (--kv-sinks), a quarter of
 * the target reserved for recent tokens (--kv-recent). Every run is scored on
 * the same tokens as the full baseline (PPL over them; KL of the next-token
 * distributions on them).
 *
 * User errors (a bad flag value, a text too short for one baseline chunk)
 * exit 2 with a message naming the flag or file and the value.
 */
#include "eval_compaction.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *g_usage =
    "usage: keel eval-compaction -m MODEL -f TEXT [--task perplexity|retrieval] [--json]\n"
    "         [--budgets 64,128,256] [--policies window,keydiff,knorm,random] [--chunk N]\n"
    "         [--docs N] [--doc-tokens N] [--doc-seed N] [--calib-docs N] [--kv-sinks S]\n"
    "         [--kv-recent F] [--kv-positions keep|renumber] [--kv-seed N] [-t N]\n"
    "\n"
    "Measures KV compaction. A budget b compacts at b cells down to b/2 (4 sinks,\n"
    "recent 0.25 of the target unless --kv-sinks / --kv-recent say otherwise).\n"
    "\n"
    "--task perplexity (default): TEXT (at least one trained context of tokens)\n"
    "  streamed as one sequence in --chunk prefill chunks (16); PPL and KL against\n"
    "  the full-context baseline (llama-perplexity's chunks), every policy x budget\n"
    "  x positions keep/renumber, plus a sliding window without sinks.\n"
    "--task retrieval: --docs documents (64) of about --doc-tokens tokens (384),\n"
    "  document i built deterministically from seed --doc-seed + i (1) out of TEXT's\n"
    "  sentences: a needle sentence early (\"There was a dog named Spot.\"), filler,\n"
    "  then the cue (\"The dog named\"); scores the needle's tokens (\" Spot\"): mean\n"
    "  log-probability, top-1 rate, documents fully retrieved. Needles are the\n"
    "  candidates this model retrieves with full context and does not guess without\n"
    "  it (measured first on --calib-docs documents (16) per candidate, other seeds).\n"
    "  Baselines: full (the document cut to the trained context), prior (the\n"
    "  cut document without the needle sentence), uncompacted (the whole document,\n"
    "  positions past the trained context). Positions: --kv-positions (renumber).\n"
    "\n"
    "--budgets: integers in 8..65536; --chunk 1..4096; --docs 1..100000;\n"
    "--doc-tokens 32..65536; --calib-docs 1..1000; at most 16 budgets and 16 policies (not none).";

/* Option values as given; validated by ev_validate. */
typedef struct ev_raw {
    const char *budgets, *policies, *chunk, *task, *docs, *doc_tokens, *doc_seed, *calib_docs;
} ev_raw;

static bool ev_extra(cli_opts *o, const char *a, const char *v, bool *takes)
{
    ev_raw *r = o->user;
    (void)takes;
    const char **slot = strcmp(a, "--budgets") == 0      ? &r->budgets
                        : strcmp(a, "--policies") == 0   ? &r->policies
                        : strcmp(a, "--chunk") == 0      ? &r->chunk
                        : strcmp(a, "--task") == 0       ? &r->task
                        : strcmp(a, "--docs") == 0       ? &r->docs
                        : strcmp(a, "--doc-tokens") == 0 ? &r->doc_tokens
                        : strcmp(a, "--doc-seed") == 0   ? &r->doc_seed
                        : strcmp(a, "--calib-docs") == 0 ? &r->calib_docs
                                                         : NULL;
    if (!slot) return false;
    *slot = v; /* NULL (no value) is reported by cli_parse */
    return true;
}

static int ev_refuse(const char *flag, const char *value, const char *why)
{
    fprintf(stderr, "keel eval-compaction: %s '%s': %s\n", flag, value, why);
    return 2;
}

/* The next comma-separated entry of *s into item [cap]; advances *s.
 * 0: an entry; 1: end of list; -1: an empty entry or one longer than cap-1. */
static int next_entry(const char **s, char *item, size_t cap)
{
    if (!*s) return 1;
    const char *c = strchr(*s, ',');
    size_t n = c ? (size_t)(c - *s) : strlen(*s);
    if (n == 0 || n >= cap) return -1;
    memcpy(item, *s, n);
    item[n] = 0;
    *s = c ? c + 1 : NULL;
    return 0;
}

static int parse_i32_flag(const char *flag, const char *v, int32_t lo, int32_t hi, int32_t *out)
{
    int32_t x;
    if (!cli_parse_i32(v, &x) || x < lo || x > hi) {
        char why[96];
        snprintf(why, sizeof why, "not an integer in %d..%d", lo, hi);
        return ev_refuse(flag, v, why);
    }
    *out = x;
    return 0;
}

/* Checks every option of the command and fills e; 0 or exit code 2. */
static int ev_validate(const ev_raw *r, const cli_opts *o, ev_opts *e)
{
    int rc;
    if (strcmp(r->task, "perplexity") == 0)
        e->retrieval = false;
    else if (strcmp(r->task, "retrieval") == 0)
        e->retrieval = true;
    else
        return ev_refuse("--task", r->task, "unknown task (perplexity or retrieval)");
    if ((rc = parse_i32_flag("--chunk", r->chunk, 1, EV_CHUNK_MAX, &e->chunk))) return rc;
    if ((rc = parse_i32_flag("--docs", r->docs, 1, EV_DOCS_MAX, &e->docs))) return rc;
    if ((rc = parse_i32_flag("--doc-tokens", r->doc_tokens, EV_DOC_TOKENS_MIN, EV_DOC_TOKENS_MAX,
                             &e->doc_tokens)))
        return rc;
    if ((rc = parse_i32_flag("--calib-docs", r->calib_docs, 1, EV_CALIB_DOCS_MAX, &e->calib_docs))) return rc;
    if (!cli_parse_u64(r->doc_seed, &e->doc_seed))
        return ev_refuse("--doc-seed", r->doc_seed, "not an unsigned integer");

    char item[64], why[400];
    const char *s = r->budgets;
    if (!*s) return ev_refuse("--budgets", s, "empty list (e.g. 64,128,256)");
    e->n_budgets = 0;
    for (int k; (k = next_entry(&s, item, sizeof item)) != 1;) {
        if (k < 0) return ev_refuse("--budgets", r->budgets, "empty or overlong entry");
        int32_t b;
        if (!cli_parse_i32(item, &b) || b < EV_BUDGET_MIN || b > EV_BUDGET_MAX) {
            snprintf(why, sizeof why, "'%s' is not an integer in %d..%d", item, EV_BUDGET_MIN,
                     EV_BUDGET_MAX);
            return ev_refuse("--budgets", r->budgets, why);
        }
        if (e->n_budgets == EV_LIST_MAX) return ev_refuse("--budgets", r->budgets, "more than 16 budgets");
        /* the compaction each budget implies, with the user's sinks and recent share */
        char err[256] = "";
        keel_compact_params cp = ev_compact_params(o, KEEL_COMPACT_WINDOW, b, true);
        if (keel_compact_params_check(&cp, err) != KEEL_OK) {
            snprintf(why, sizeof why, "budget %d (trigger %d, target %d, %d sinks): %s", b, cp.trigger,
                     cp.target, cp.n_sink, err);
            return ev_refuse("--budgets", r->budgets, why);
        }
        e->budgets[e->n_budgets++] = b;
    }
    s = r->policies;
    if (!*s) return ev_refuse("--policies", s, "empty list (e.g. window,keydiff,knorm,random)");
    e->n_policies = 0;
    for (int k; (k = next_entry(&s, item, sizeof item)) != 1;) {
        if (k < 0) return ev_refuse("--policies", r->policies, "empty or overlong entry");
        keel_compact_policy p;
        if (keel_compact_policy_from_name(item, &p) != KEEL_OK || p == KEEL_COMPACT_NONE) {
            snprintf(why, sizeof why, "unknown policy '%s' (window, keydiff, knorm, random)", item);
            return ev_refuse("--policies", r->policies, why);
        }
        if (e->n_policies == EV_LIST_MAX) return ev_refuse("--policies", r->policies, "more than 16 policies");
        e->policies[e->n_policies++] = p;
    }
    return 0;
}

keel_compact_params ev_compact_params(const cli_opts *o, keel_compact_policy p, int32_t budget,
                                      bool renumber)
{
    keel_compact_params cp = keel_compact_params_default();
    cp.policy = p;
    cp.trigger = budget;
    cp.target = budget / 2;
    cp.n_sink = o->ctx.compact.n_sink;
    cp.recent = o->ctx.compact.recent;
    cp.seed = o->ctx.compact.seed;
    cp.renumber = renumber;
    return cp;
}

void ev_log_softmax(const float *l, int32_t V, float *out)
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
    if (!flags) {
        keel_context_close(c);
        fprintf(stderr, "keel eval-compaction: %s\n", keel_strerror(KEEL_ENOMEM));
        return KEEL_ENOMEM;
    }
    memset(flags, 1, (size_t)chunk);
    double nll = 0.0, kl = 0.0;
    int64_t cnt = 0;
    for (int32_t i = 0; i < n - 1 && st == KEEL_OK; i += chunk) {
        int32_t k = n - 1 - i < chunk ? n - 1 - i : chunk;
        keel_batch b = {k, toks + i, NULL, NULL, flags};
        st = keel_decode(c, &b);
        if (st != KEEL_OK) {
            fprintf(stderr, "keel eval-compaction: %s %d: decode: %s\n", keel_compact_policy_name(cp->policy),
                    budget, keel_context_last_error(c));
            break;
        }
        for (int32_t j = 0; j < k; j++) {
            int32_t t = i + j; /* logits at t predict token t + 1 */
            if (!scored[t + 1]) continue;
            ev_log_softmax(keel_logits(c, j), V, lp);
            nll -= lp[toks[t + 1]];
            const float *f = full_lp + (size_t)t * (size_t)V;
            double d = 0.0;
            for (int32_t v = 0; v < V; v++) d += exp((double)f[v]) * ((double)f[v] - (double)lp[v]);
            kl += d;
            cnt++;
        }
    }
    r->compactions = keel_mem_seq_compactions(keel_context_memory(c), 0);
    free(flags);
    keel_context_close(c);
    if (st != KEEL_OK) return st;
    r->ppl = exp(nll / (double)cnt);
    r->kld = kl / (double)cnt;
    return KEEL_OK;
}

/* The perplexity task; returns the exit code. */
static int ev_perplexity(keel_model *m, cli_opts *o, const ev_opts *e)
{
    keel_model_info mi;
    keel_model_info_get(m, &mi);
    int32_t *toks = NULL, n = 0;
    float *full_lp = NULL, *lp = NULL;
    uint8_t *scored = NULL;
    ev_result *res = NULL;
    int n_res = 0, rc;
    if ((rc = cli_prompt_ids(o, m, &toks, &n))) goto done;
    int32_t V = mi.n_vocab, T = mi.n_ctx_train;
    if (n < T) {
        /* no complete chunk: the baseline would score nothing (PPL of 0 tokens) */
        fprintf(stderr,
                "keel eval-compaction: %s: %d tokens; the perplexity baseline needs at least one "
                "chunk of the trained context (%d tokens)\n",
                o->file ? o->file : "text", n, T);
        rc = 2;
        goto done;
    }
    if ((double)n * V * sizeof(float) > 2e9) {
        rc = cli_fail("eval-compaction", KEEL_ERANGE, "text x vocabulary too large for the baseline's distributions (2 GB)");
        goto done;
    }
    full_lp = malloc((size_t)n * (size_t)V * sizeof(float));
    lp = malloc((size_t)V * sizeof(float));
    scored = calloc((size_t)n, 1);
    res = calloc((size_t)(1 + 2 * (e->n_policies + 1) * e->n_budgets), sizeof(ev_result));
    if (!full_lp || !lp || !scored || !res) {
        rc = cli_fail("eval-compaction", KEEL_ENOMEM, NULL);
        goto done;
    }
    /* full baseline: chunks of the trained context */
    {
        keel_context_params p = o->ctx;
        p.n_ctx = T;
        p.n_batch = T;
        p.n_ubatch = T < 512 ? T : 512;
        p.n_outputs = T;
        p.compact = keel_compact_params_default();
        keel_context *c = NULL;
        char err[256] = "";
        keel_status st = keel_context_open(m, &p, &c, err);
        if (st != KEEL_OK) {
            rc = cli_fail("context", st, err);
            goto done;
        }
        int8_t *flags = malloc((size_t)T);
        if (!flags) {
            keel_context_close(c);
            rc = cli_fail("eval-compaction", KEEL_ENOMEM, NULL);
            goto done;
        }
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
            if (st != KEEL_OK) {
                snprintf(err, sizeof err, "%s", keel_context_last_error(c));
                break;
            }
            for (int32_t j = 0; j < k; j++) {
                ev_log_softmax(keel_logits(c, j), V, full_lp + (size_t)(s + j) * (size_t)V);
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
            rc = cli_fail("baseline", st, err);
            goto done;
        }
        if (cnt == 0) {
            fprintf(stderr, "keel eval-compaction: %s: the trained context (%d) is too short to score any token\n",
                    o->model.path, T);
            rc = 2;
            goto done;
        }
        res[0].policy = "full";
        res[0].budget = T;
        res[0].ppl = exp(nll / (double)cnt);
        res[0].ratio = 1.0;
        n_res = 1;
        fprintf(stderr, "eval-compaction: %d tokens, %lld scored, full baseline at the trained context %d: PPL %.4f\n",
                n, (long long)cnt, T, res[0].ppl);
    }
    /* sliding-window baseline, then policies x budgets x positions */
    for (int pi = -1; pi < e->n_policies; pi++) {
        bool sliding = pi < 0;
        for (int bi = 0; bi < e->n_budgets; bi++) {
            int32_t budget = e->budgets[bi];
            for (int renum = 0; renum < 2; renum++) {
                keel_compact_params cp =
                    ev_compact_params(o, sliding ? KEEL_COMPACT_WINDOW : e->policies[pi], budget, renum);
                if (sliding) cp.n_sink = 0;
                int32_t chunk = e->chunk;
                if (chunk > cp.trigger - cp.target) chunk = cp.trigger - cp.target;
                ev_result *r = &res[n_res];
                r->policy = sliding ? "sliding" : keel_compact_policy_name(cp.policy);
                r->budget = budget;
                r->renumber = renum;
                if (run_stream(m, o, toks, n, full_lp, scored, V, &cp, budget, chunk, r, lp) != KEEL_OK) {
                    rc = 1;
                    goto done;
                }
                r->ratio = r->ppl / res[0].ppl;
                n_res++;
            }
        }
    }
    if (o->json) {
        printf("[");
        for (int i = 0; i < n_res; i++)
            printf("%s\n {\"policy\": \"%s\", \"budget\": %d, \"positions\": \"%s\", \"ppl\": %.4f, "
                   "\"ppl_ratio\": %.4f, \"kld\": %.5f, \"compactions\": %lld}",
                   i ? "," : "", res[i].policy, res[i].budget, i == 0 ? "keep" : res[i].renumber ? "renumber" : "keep",
                   res[i].ppl, res[i].ratio, res[i].kld, (long long)res[i].compactions);
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
    return rc;
}

int cmd_eval_compaction(int argc, char **argv)
{
    cli_opts o;
    cli_opts_init(&o);
    ev_raw raw = {"64,128,256", "window,keydiff,knorm,random", "16", "perplexity", "64", "384", "1", "16"};
    o.extra = ev_extra;
    o.user = &raw;
    int rc = cli_parse(argc, argv, &o, g_usage);
    if (rc) return rc == 1 ? 0 : rc;
    if (!o.file) {
        fprintf(stderr, "keel eval-compaction: no text (-f TEXT)\n%s\n", g_usage);
        return 2;
    }
    ev_opts e;
    memset(&e, 0, sizeof e);
    if ((rc = ev_validate(&raw, &o, &e))) return rc;
    keel_model *m = NULL;
    if ((rc = cli_open_model(&o, &m))) return rc;
    rc = e.retrieval ? ev_retrieval(m, &o, &e) : ev_perplexity(m, &o, &e);
    keel_model_close(m);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "keel eval-compaction: writing the results: %s\n", strerror(errno));
        if (!rc) rc = 1;
    }
    return rc;
}
