/*
 * cmd_run.c — `keel run`: prompt a model and stream the continuation to
 * stdout (the prompt is not echoed); timings to stderr.
 */
#include "cli.h"

#include <stdlib.h>
#include <string.h>

static const char *g_usage =
    "usage: keel run -m MODEL [-p PROMPT | -f FILE | --prompt-ids 1,2,...] [-n N] [--temp T]\n"
    "                [--seed S] [-c CTX] [-b N] [-ub N] [-t N] [--ctk T --ctv T] [--tokenizer F]\n"
    "                [--top-k K] [--top-p P] [--min-p P] [--repeat-penalty R] [--repeat-last-n N]\n"
    "                [--presence-penalty P] [--frequency-penalty P] [--ignore-eos]\n"
    "                [--kv-compact none|window|keydiff|knorm|random --kv-trigger N --kv-target M\n"
    "                 --kv-sinks S --kv-recent F --kv-positions keep|renumber] [--swa-sinks N]\n"
    "                [--logits-out FILE]   f32 logits of every prompt position, [n_prompt][n_vocab]\n"
    "                [--ids-out FILE]      generated token ids, int32";

static void put_text(const char *s, size_t n)
{
    fwrite(s, 1, n, stdout);
    fflush(stdout);
}

int cmd_run(int argc, char **argv)
{
    cli_opts o;
    cli_opts_init(&o);
    int rc = cli_parse(argc, argv, &o, g_usage);
    if (rc) return rc == 1 ? 0 : rc;
    keel_model *m = NULL;
    if ((rc = cli_open_model(&o, &m))) return rc;
    keel_model_info mi;
    keel_model_info_get(m, &mi);
    int32_t *ids = NULL, n_prompt = 0;
    keel_context *c = NULL;
    keel_sampler *s = NULL;
    FILE *lf = NULL, *idf = NULL;
    char err[256] = "";
    keel_status st;
    if ((rc = cli_prompt_ids(&o, m, &ids, &n_prompt))) goto done;
    if (n_prompt == 0) {
        rc = cli_fail("run", KEEL_EINVAL, "empty prompt");
        goto done;
    }
    for (int32_t i = 0; i < n_prompt; i++)
        if (ids[i] < 0 || ids[i] >= mi.n_vocab) {
            char d[96];
            snprintf(d, sizeof d, "prompt token %d: id %d out of range (n_vocab %d)", i, ids[i], mi.n_vocab);
            rc = cli_fail("run", KEEL_EINVAL, d);
            goto done;
        }
    if (o.ctx.n_ctx == 0) o.ctx.n_ctx = mi.n_ctx_train < 4096 ? mi.n_ctx_train : 4096;
    if (n_prompt > o.ctx.n_ctx) {
        char d[128];
        snprintf(d, sizeof d, "context (%d) is smaller than the prompt (%d tokens)", o.ctx.n_ctx, n_prompt);
        rc = cli_fail("run", KEEL_ECONTEXT, d);
        goto done;
    }
    if (o.logits_out) {
        if (!o.batch_set) o.ctx.n_batch = n_prompt < 512 ? n_prompt : 512;
        o.ctx.n_outputs = o.ctx.n_batch;
        lf = fopen(o.logits_out, "wb");
        if (!lf) {
            fprintf(stderr, "keel: cannot write %s\n", o.logits_out);
            rc = 1;
            goto done;
        }
    }
    if (o.ids_out && !(idf = fopen(o.ids_out, "wb"))) {
        fprintf(stderr, "keel: cannot write %s\n", o.ids_out);
        rc = 1;
        goto done;
    }
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
    int8_t *flags = calloc((size_t)nb, 1);
    if (!flags) {
        rc = cli_fail("run", KEEL_ENOMEM, NULL);
        goto done;
    }
    uint64_t t0 = keel_time_ns();
    for (int32_t i = 0; i < n_prompt; i += nb) {
        int32_t n = n_prompt - i < nb ? n_prompt - i : nb;
        for (int32_t j = 0; j < n; j++) flags[j] = lf || (i + j == n_prompt - 1);
        keel_batch b = {n, ids + i, NULL, NULL, flags};
        if ((st = keel_decode(c, &b)) != KEEL_OK) {
            free(flags);
            rc = cli_fail("decode", st, keel_context_last_error(c));
            goto done;
        }
        if (lf)
            for (int32_t j = 0; j < n; j++)
                fwrite(keel_logits(c, j), sizeof(float), (size_t)mi.n_vocab, lf);
    }
    free(flags);
    for (int32_t i = 0; i < n_prompt; i++) keel_sampler_accept(s, ids[i]);
    uint64_t t1 = keel_time_ns();
    /* generation */
    keel_detok_stream ds;
    keel_detok_stream_init(&ds, m);
    char piece[1024];
    size_t pn;
    int32_t n_gen = 0, pos = n_prompt;
    const float *logits = keel_logits(c, (n_prompt - 1) % nb);
    bool full = false;
    while (n_gen < o.n_predict) {
        int32_t tok;
        if ((st = keel_sampler_sample(s, logits, &tok)) != KEEL_OK) {
            rc = cli_fail("sample", st, NULL);
            goto done;
        }
        keel_sampler_accept(s, tok);
        n_gen++;
        if (idf) fwrite(&tok, sizeof tok, 1, idf);
        if (!o.ignore_eos && keel_token_is_eog(m, tok)) break;
        if (keel_detok_stream_push(&ds, tok, piece, sizeof piece, &pn) == KEEL_OK) put_text(piece, pn);
        if (n_gen == o.n_predict) break;
        if (pos >= o.ctx.n_ctx) {
            full = true;
            break;
        }
        keel_batch b = {1, &tok, NULL, NULL, NULL};
        if ((st = keel_decode(c, &b)) != KEEL_OK) {
            rc = cli_fail("decode", st, keel_context_last_error(c));
            goto done;
        }
        pos++;
        logits = keel_logits(c, 0);
    }
    if (keel_detok_stream_flush(&ds, piece, sizeof piece, &pn) == KEEL_OK) put_text(piece, pn);
    putchar('\n');
    uint64_t t2 = keel_time_ns();
    double pp_s = (double)(t1 - t0) * 1e-9, tg_s = (double)(t2 - t1) * 1e-9;
    fprintf(stderr, "\nkeel: prompt %d tokens in %.3f s (%.1f tok/s), generated %d tokens in %.3f s (%.1f tok/s)%s\n",
            n_prompt, pp_s, pp_s > 0 ? n_prompt / pp_s : 0.0, n_gen, tg_s,
            tg_s > 0 ? n_gen / tg_s : 0.0, full ? " [context full]" : "");
done:
    if (lf) fclose(lf);
    if (idf) fclose(idf);
    keel_sampler_close(s);
    keel_context_close(c);
    free(ids);
    keel_model_close(m);
    return rc;
}
