/*
 * cmd_perplexity.c — `keel perplexity -m MODEL -f TEXT -c N [-b N]`, the
 * method of llama.cpp's llama-perplexity: the text is tokenized with BOS and
 * cut into floor(n_tokens / N) consecutive chunks of N tokens; the first
 * token of each chunk is replaced by BOS; each chunk is evaluated from an
 * empty cache and the second half is scored (positions N/2 .. N-2
 * predicting the next token). Prints running [i]ppl values and
 * "Final estimate: PPL = X +/- Y" (Y from the spread of the per-token NLL).
 *
 * With --kv-compact the KV cache holds the compaction budget (the trigger,
 * n_ctx by default), not the chunk: each chunk streams through it,
 * compacted between ubatches, so -c may exceed the cells the cache holds.
 */
#include "cli.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *g_usage =
    "usage: keel perplexity -m MODEL -f TEXT [-c N] [options]\n"
    "llama-perplexity's method: chunks of -c tokens (0: min(training context, 4096)), each from an\n"
    "empty cache, the second half scored. With --kv-compact each chunk streams through a cache of\n"
    "--kv-trigger cells.";

int cmd_perplexity(int argc, char **argv)
{
    cli_opts o;
    cli_opts_init(&o);
    o.groups = CLI_G_MODEL | CLI_G_FILE | CLI_G_CTX | CLI_G_THREADS | CLI_G_KV | CLI_G_COMPACT |
               CLI_G_BUDGET;
    int rc = cli_parse(argc, argv, &o, g_usage);
    if (rc) return rc == 1 ? 0 : rc;
    if (!o.file) {
        fprintf(stderr, "keel perplexity: no text (-f FILE)\n%s\n", g_usage);
        return 2;
    }
    keel_model *m = NULL;
    if ((rc = cli_open_model(&o, &m))) return rc;
    keel_model_info mi;
    keel_model_info_get(m, &mi);
    int32_t *toks = NULL, n_tok = 0;
    keel_context *c = NULL;
    float *logits = NULL;
    int8_t *flags = NULL;
    if ((rc = cli_prompt_ids(&o, m, &toks, &n_tok))) goto done;
    int32_t n_ctx = o.ctx.n_ctx > 0 ? o.ctx.n_ctx : (mi.n_ctx_train < 4096 ? mi.n_ctx_train : 4096);
    if (n_ctx < 4) {
        rc = cli_fail("perplexity", KEEL_EINVAL, "-c must be at least 4");
        goto done;
    }
    if ((rc = cli_compact_setup(&o, n_ctx))) goto done;
    bool compact = o.ctx.compact.policy != KEEL_COMPACT_NONE;
    int32_t n_batch = o.batch_set ? o.ctx.n_batch : 512;
    if (n_batch > n_ctx) n_batch = n_ctx;
    int32_t n_chunk = n_tok / n_ctx;
    if (n_chunk < 1) {
        char d[128];
        snprintf(d, sizeof d, "the text has %d tokens, fewer than one chunk of -c %d", n_tok, n_ctx);
        rc = cli_fail("perplexity", KEEL_ECONTEXT, d);
        goto done;
    }
    o.ctx.n_ctx = compact ? o.ctx.compact.trigger : n_ctx; /* the budget bounds the cache */
    o.ctx.n_batch = n_batch;
    o.ctx.n_ubatch = n_batch;
    o.ctx.n_outputs = n_batch;
    char err[256] = "";
    keel_status st = keel_context_open(m, &o.ctx, &c, err);
    if (st != KEEL_OK) {
        rc = cli_fail("context", st, err);
        goto done;
    }
    size_t V = (size_t)mi.n_vocab;
    logits = malloc((size_t)n_ctx * V * sizeof(float));
    flags = malloc((size_t)n_batch);
    if (!logits || !flags) {
        rc = cli_fail("perplexity", KEEL_ENOMEM, NULL);
        goto done;
    }
    memset(flags, 1, (size_t)n_batch);
    fprintf(stderr, "perplexity: %d tokens, %d chunks of %d, batch %d", n_tok, n_chunk, n_ctx, n_batch);
    if (compact)
        fprintf(stderr, ", KV compaction %s: %d cells, trigger %d, target %d",
                keel_compact_policy_name(o.ctx.compact.policy), o.ctx.n_ctx, o.ctx.compact.trigger,
                o.ctx.compact.target);
    fprintf(stderr, "\n");
    int32_t first = n_ctx / 2;
    double nll = 0.0, nll2 = 0.0;
    int64_t count = 0;
    uint64_t t0 = keel_time_ns();
    keel_mem *mem = keel_context_memory(c);
    for (int32_t ch = 0; ch < n_chunk; ch++) {
        int32_t start = ch * n_ctx;
        keel_mem_clear(mem);
        for (int32_t j = 0; j < n_ctx; j += n_batch) {
            int32_t n = n_ctx - j < n_batch ? n_ctx - j : n_batch;
            int32_t saved = toks[start + j];
            if (j == 0 && mi.add_bos && mi.bos >= 0) toks[start] = mi.bos;
            keel_batch b = {n, toks + start + j, NULL, NULL, flags};
            st = keel_decode(c, &b);
            toks[start + j] = saved;
            if (st != KEEL_OK) {
                rc = cli_fail("perplexity", st, keel_context_last_error(c));
                goto done;
            }
            for (int32_t i = 0; i < n; i++) memcpy(logits + (size_t)(j + i) * V, keel_logits(c, i), V * sizeof(float));
        }
        for (int32_t pos = first; pos < n_ctx - 1; pos++) {
            const float *l = logits + (size_t)pos * V;
            double mx = l[0];
            for (size_t v = 1; v < V; v++) mx = l[v] > mx ? l[v] : mx;
            double sum = 0.0;
            for (size_t v = 0; v < V; v++) sum += exp((double)l[v] - mx);
            double lp = (double)l[toks[start + pos + 1]] - mx - log(sum);
            nll += -lp;
            nll2 += lp * lp;
            count++;
        }
        printf("[%d]%.4f,", ch + 1, exp(nll / (double)count));
        if (!cli_flush_stdout()) {
            rc = 1;
            goto done;
        }
    }
    double t = (double)(keel_time_ns() - t0) * 1e-9;
    double mean = nll / (double)count, mean2 = nll2 / (double)count;
    double ppl = exp(mean), var = mean2 - mean * mean;
    double unc = var > 0 && count > 1 ? sqrt(var / (double)(count - 1)) * ppl : 0.0;
    printf("\nFinal estimate: PPL = %.4f +/- %.5f\n", ppl, unc);
    fprintf(stderr, "perplexity: %lld scored tokens, %.2f s (%.1f tok/s evaluated)\n", (long long)count, t,
            (double)n_chunk * n_ctx / t);
done:
    free(flags);
    free(logits);
    keel_context_close(c);
    free(toks);
    keel_model_close(m);
    return rc;
}
