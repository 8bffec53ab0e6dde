/*
 * cmd_run.c — `keel run`: prompt a model and stream the continuation to
 * stdout (the prompt is not echoed); timings and why generation stopped to
 * stderr.
 *
 * Limits: generation runs until -n tokens, an end-of-generation token, or
 * the memory's own limit as keel_decode reports it. Without compaction
 * that is the context (-c cells); with --kv-compact the sequence is held
 * inside its budget (the trigger) between ubatches, so prompts and
 * generations of any length stream through it (-n -1: until end of
 * generation). The CLI never turns a position or -c into a limit of its
 * own.
 */
#include "cli.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const char *g_usage =
    "usage: keel run -m MODEL [-p PROMPT | -f FILE | --prompt-ids 1,2,...] [options]\n"
    "Streams the continuation to stdout (the prompt is not echoed); timings and the reason\n"
    "generation stopped go to stderr.";

/* Pushes tok through the stream into *buf (grown when a piece needs more
 * than *cap bytes). */
static keel_status push_piece(keel_detok_stream *ds, int32_t tok, char **buf, size_t *cap, size_t *n)
{
    keel_status st = keel_detok_stream_push(ds, tok, *buf, *cap, n);
    if (st != KEEL_ERANGE) return st;
    char *nb = realloc(*buf, *n);
    if (!nb) return KEEL_ENOMEM;
    *buf = nb;
    *cap = *n;
    return keel_detok_stream_push(ds, tok, *buf, *cap, n);
}

int cmd_run(int argc, char **argv)
{
    cli_opts o;
    cli_opts_init(&o);
    o.groups = CLI_G_MODEL | CLI_G_PROMPT | CLI_G_FILE | CLI_G_GEN | CLI_G_SAMPLE | CLI_G_SEED |
               CLI_G_CTX | CLI_G_THREADS | CLI_G_KV | CLI_G_COMPACT | CLI_G_BUDGET;
    int rc = cli_parse(argc, argv, &o, g_usage);
    if (rc) return rc == 1 ? 0 : rc;
    char err[256] = "";
    keel_status st = keel_sampler_params_check(&o.samp, err);
    if (st != KEEL_OK) return cli_fail("sampler", st, err);
    keel_model *m = NULL;
    if ((rc = cli_open_model(&o, &m))) return rc;
    keel_model_info mi;
    keel_model_info_get(m, &mi);
    int32_t *ids = NULL, n_prompt = 0;
    keel_context *c = NULL;
    keel_sampler *s = NULL;
    FILE *lf = NULL, *idf = NULL;
    int8_t *flags = NULL;
    size_t piece_cap = 4096;
    char *piece = malloc(piece_cap);
    if (!piece) {
        rc = cli_fail("run", KEEL_ENOMEM, NULL);
        goto done;
    }
    if ((rc = cli_prompt_ids(&o, m, &ids, &n_prompt))) goto done;
    if (n_prompt == 0) {
        rc = cli_fail("run", KEEL_EINVAL, "empty prompt (no tokens)");
        goto done;
    }
    if (o.ctx.n_ctx == 0) o.ctx.n_ctx = mi.n_ctx_train < 4096 ? mi.n_ctx_train : 4096;
    if ((rc = cli_compact_setup(&o, o.ctx.n_ctx))) goto done;
    bool compact = o.ctx.compact.policy != KEEL_COMPACT_NONE;
    if (o.logits_out) {
        if (!o.batch_set) o.ctx.n_batch = n_prompt < 512 ? n_prompt : 512;
        o.ctx.n_outputs = o.ctx.n_batch;
        if (!(lf = fopen(o.logits_out, "wb"))) {
            fprintf(stderr, "keel: --logits-out %s: %s\n", o.logits_out, strerror(errno));
            rc = 1;
            goto done;
        }
    }
    if (o.ids_out && !(idf = fopen(o.ids_out, "wb"))) {
        fprintf(stderr, "keel: --ids-out %s: %s\n", o.ids_out, strerror(errno));
        rc = 1;
        goto done;
    }
    char lf_what[1100], idf_what[1100];
    snprintf(lf_what, sizeof lf_what, "--logits-out %s", o.logits_out ? o.logits_out : "");
    snprintf(idf_what, sizeof idf_what, "--ids-out %s", o.ids_out ? o.ids_out : "");
    if ((st = keel_context_open(m, &o.ctx, &c, err)) != KEEL_OK) {
        rc = cli_fail("context", st, err);
        goto done;
    }
    if ((st = keel_sampler_open(&o.samp, mi.n_vocab, &s)) != KEEL_OK) {
        rc = cli_fail("sampler", st, NULL);
        goto done;
    }
    /* prompt, in batches of n_batch */
    int32_t nb = o.ctx.n_batch > 0 ? o.ctx.n_batch : 512;
    if (!(flags = calloc((size_t)nb, 1))) {
        rc = cli_fail("run", KEEL_ENOMEM, NULL);
        goto done;
    }
    uint64_t t0 = keel_time_ns();
    for (int32_t i = 0; i < n_prompt; i += nb) {
        int32_t n = n_prompt - i < nb ? n_prompt - i : nb;
        for (int32_t j = 0; j < n; j++) flags[j] = lf || (i + j == n_prompt - 1);
        keel_batch b = {n, ids + i, NULL, NULL, flags};
        if ((st = keel_decode(c, &b)) != KEEL_OK) {
            if (st == KEEL_EFULL && !compact) {
                char d[512];
                snprintf(d, sizeof d,
                         "the context (-c %d cells) is smaller than the prompt (%d tokens): raise -c "
                         "or use --kv-compact P",
                         o.ctx.n_ctx, n_prompt);
                rc = cli_fail("run", KEEL_ECONTEXT, d);
            } else {
                rc = cli_fail("run", st, keel_context_last_error(c));
            }
            goto done;
        }
        if (lf)
            for (int32_t j = 0; j < n; j++)
                if (!cli_write(lf, keel_logits(c, j), (size_t)mi.n_vocab * sizeof(float), lf_what)) {
                    rc = 1;
                    goto done;
                }
    }
    if (!cli_close(lf, lf_what)) {
        lf = NULL;
        rc = 1;
        goto done;
    }
    lf = NULL;
    for (int32_t i = 0; i < n_prompt; i++)
        if ((st = keel_sampler_accept(s, ids[i])) != KEEL_OK) {
            rc = cli_fail("sampler", st, NULL);
            goto done;
        }
    uint64_t t1 = keel_time_ns();
    /* generation: the text continues the prompt's */
    keel_detok_stream ds;
    if ((st = keel_detok_stream_init_after(&ds, m, ids, n_prompt)) != KEEL_OK) {
        rc = cli_fail("detokenize", st, NULL);
        goto done;
    }
    size_t pn;
    int32_t n_gen = 0;
    const float *logits = keel_logits(c, (n_prompt - 1) % nb);
    char stop[640] = "";
    while (o.n_predict < 0 || n_gen < o.n_predict) {
        int32_t tok;
        if ((st = keel_sampler_sample(s, logits, &tok)) != KEEL_OK ||
            (st = keel_sampler_accept(s, tok)) != KEEL_OK) {
            rc = cli_fail("sample", st, NULL);
            goto done;
        }
        n_gen++;
        if (idf && !cli_write(idf, &tok, sizeof tok, idf_what)) {
            rc = 1;
            goto done;
        }
        if (!o.ignore_eos && keel_token_is_eog(m, tok)) {
            snprintf(stop, sizeof stop, "end of generation");
            break;
        }
        if ((st = push_piece(&ds, tok, &piece, &piece_cap, &pn)) != KEEL_OK) {
            rc = cli_fail("detokenize", st, NULL);
            goto done;
        }
        if (!cli_write_stdout(piece, pn)) {
            rc = 1;
            goto done;
        }
        if (n_gen == o.n_predict) {
            snprintf(stop, sizeof stop, "-n %d tokens", o.n_predict);
            break;
        }
        keel_batch b = {1, &tok, NULL, NULL, NULL};
        if ((st = keel_decode(c, &b)) == KEEL_EFULL) {
            if (compact)
                snprintf(stop, sizeof stop, "the KV cache is full: %s", keel_context_last_error(c));
            else
                snprintf(stop, sizeof stop,
                         "context full (-c %d cells, no compaction; raise -c or use --kv-compact P)",
                         o.ctx.n_ctx);
            break;
        }
        if (st != KEEL_OK) {
            rc = cli_fail("run", st, keel_context_last_error(c));
            goto done;
        }
        logits = keel_logits(c, 0);
    }
    if (!stop[0]) snprintf(stop, sizeof stop, "-n %d tokens", o.n_predict);
    if ((st = keel_detok_stream_flush(&ds, piece, piece_cap, &pn)) != KEEL_OK) {
        rc = cli_fail("detokenize", st, NULL);
        goto done;
    }
    if (!cli_write_stdout(piece, pn) || !cli_write_stdout("\n", 1)) {
        rc = 1;
        goto done;
    }
    if (!cli_close(idf, idf_what)) rc = 1;
    idf = NULL;
    uint64_t t2 = keel_time_ns();
    double pp_s = (double)(t1 - t0) * 1e-9, tg_s = (double)(t2 - t1) * 1e-9;
    keel_mem *mem = keel_context_memory(c);
    char cmp[96] = "";
    if (compact)
        snprintf(cmp, sizeof cmp, ", %lld compactions, cells never above %d",
                 (long long)keel_mem_seq_compactions(mem, 0), keel_mem_seq_cells_high(mem, 0));
    fprintf(stderr,
            "\nkeel: prompt %d tokens in %.3f s (%.1f tok/s), generated %d tokens in %.3f s (%.1f "
            "tok/s)%s; stopped: %s\n",
            n_prompt, pp_s, pp_s > 0 ? n_prompt / pp_s : 0.0, n_gen, tg_s,
            tg_s > 0 ? n_gen / tg_s : 0.0, cmp, stop);
done:
    if (lf) fclose(lf); /* only on an error path: the data is incomplete anyway */
    if (idf) fclose(idf);
    free(flags);
    free(piece);
    keel_sampler_close(s);
    keel_context_close(c);
    free(ids);
    keel_model_close(m);
    return rc;
}
