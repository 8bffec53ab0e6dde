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
 *
 * Sessions: --session-save F writes the sequence when the run ends (the
 * prompt and every generated token, the last sampled one included as
 * pending: it is not in the cache yet); --session-load F continues such a
 * run, decoding only what the saved state does not hold (its pending token,
 * then the tokens of -p, which follow the saved text without a BOS), so a
 * run split in two with a save in between prints exactly the tokens of one
 * run of the whole length.
 */
#include "cli.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const char *g_usage =
    "usage: keel run -m MODEL [-p PROMPT | -f FILE | --prompt-ids 1,2,...] [options]\n"
    "       keel run -m MODEL --session-load F [-p MORE] [options]\n"
    "Streams the continuation to stdout (the prompt is not echoed); timings and the reason\n"
    "generation stopped go to stderr.";

typedef struct run_opts {
    const char *save, *load, *grammar, *schema;
    bool convert;
    cli_spec spec;
} run_opts;

static bool run_extra(cli_opts *o, const char *a, const char *v, bool *takes)
{
    run_opts *r = o->user;
    if (cli_spec_flag(&r->spec, a, v, takes, o->extra_err)) return true;
    if (strcmp(a, "--session-save") == 0) {
        r->save = v;
        return true;
    }
    if (strcmp(a, "--session-load") == 0) {
        r->load = v;
        return true;
    }
    if (strcmp(a, "--grammar") == 0) {
        r->grammar = v;
        return true;
    }
    if (strcmp(a, "--json-schema") == 0) {
        r->schema = v;
        return true;
    }
    if (strcmp(a, "--session-convert") == 0) {
        r->convert = true;
        *takes = false;
        return true;
    }
    return false;
}

/* A saved history loaded into sequence 0 (grown until it fits). */
static keel_status load_session(keel_context *c, const char *path, unsigned flags, int32_t **hist, int32_t *n,
                                int32_t *pending)
{
    int32_t cap = 1 << 14;
    for (;;) {
        int32_t *h = realloc(*hist, (size_t)cap * sizeof(int32_t));
        if (!h) return KEEL_ENOMEM;
        *hist = h;
        keel_status st = keel_session_load(c, 0, path, flags, h, cap, n, pending);
        if (st != KEEL_ERANGE || cap >= (1 << 28)) return st;
        cap *= 4;
    }
}

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

/* The generation loop's state (generate). */
typedef struct gen_state {
    keel_context *c;
    keel_model *m;
    keel_sampler *s;
    keel_grammar_matcher *gm;
    float *glog;                /* [n_vocab] the row the grammar masks */
    int32_t n_vocab;
    const cli_opts *o;
    bool compact;
    keel_detok_stream *ds;
    char **piece;
    size_t *piece_cap;
    FILE *idf;
    const char *idf_what;
    bool save;
    int32_t **gen, *gen_n, *gen_cap; /* --session-save: generated tokens */
    int32_t n_gen;
    char stop[640];
    /* speculative decoding */
    keel_spec *sp;
    int32_t *hist;              /* the text so far: prompt (or saved history) and output */
    int32_t n_hist, cap_hist;
    int64_t drafted, accepted;
} gen_state;

static keel_status hist_push(gen_state *g, const int32_t *t, int32_t n)
{
    if (g->n_hist + n > g->cap_hist) {
        int32_t cap = 2 * g->cap_hist > g->n_hist + n + 256 ? 2 * g->cap_hist : g->n_hist + n + 256;
        int32_t *h = realloc(g->hist, (size_t)cap * sizeof(int32_t));
        if (!h) return KEEL_ENOMEM;
        g->hist = h;
        g->cap_hist = cap;
    }
    memcpy(g->hist + g->n_hist, t, (size_t)n * sizeof(int32_t));
    g->n_hist += n;
    return KEEL_OK;
}

/* A row to sample from: logits, or the grammar's masked copy. 0 or an exit
 * code; *done when the grammar is complete. */
static int gen_row(gen_state *g, const float *logits, const float **row, bool *done)
{
    *row = logits;
    *done = false;
    if (!g->gm) return 0;
    if (keel_grammar_matcher_done(g->gm)) {
        snprintf(g->stop, sizeof g->stop, "the grammar is complete");
        *done = true;
        return 0;
    }
    memcpy(g->glog, logits, (size_t)g->n_vocab * sizeof *g->glog);
    keel_status st = keel_grammar_matcher_apply(g->gm, g->glog);
    if (st != KEEL_OK) return cli_fail("--grammar", st, keel_grammar_matcher_last_error(g->gm));
    *row = g->glog;
    return 0;
}

/* The sampled token tok joins the output: sampler and grammar state, the
 * files, stdout. 0 or an exit code; *done when generation ends with it. */
static int gen_take(gen_state *g, int32_t tok, bool *done)
{
    keel_status st;
    *done = false;
    if ((st = keel_sampler_accept(g->s, tok)) != KEEL_OK) return cli_fail("sample", st, NULL);
    if (g->gm && (st = keel_grammar_matcher_accept(g->gm, tok)) != KEEL_OK)
        return cli_fail("--grammar", st, keel_grammar_matcher_last_error(g->gm));
    g->n_gen++;
    if (g->sp && (st = hist_push(g, &tok, 1)) != KEEL_OK) return cli_fail("run", st, NULL);
    if (g->save) {
        if (*g->gen_n == *g->gen_cap) {
            *g->gen_cap = *g->gen_cap ? 2 * *g->gen_cap : 256;
            int32_t *n = realloc(*g->gen, (size_t)*g->gen_cap * sizeof(int32_t));
            if (!n) return cli_fail("run", KEEL_ENOMEM, NULL);
            *g->gen = n;
        }
        (*g->gen)[(*g->gen_n)++] = tok;
    }
    if (g->idf && !cli_write(g->idf, &tok, sizeof tok, g->idf_what)) return 1;
    if ((!g->o->ignore_eos || g->gm) && keel_token_is_eog(g->m, tok)) {
        snprintf(g->stop, sizeof g->stop, "end of generation");
        *done = true;
        return 0;
    }
    size_t pn = 0;
    if ((st = push_piece(g->ds, tok, g->piece, g->piece_cap, &pn)) != KEEL_OK) return cli_fail("detokenize", st, NULL);
    if (!cli_write_stdout(*g->piece, pn)) return 1;
    if (g->n_gen == g->o->n_predict) {
        snprintf(g->stop, sizeof g->stop, "-n %d tokens", g->o->n_predict);
        *done = true;
    }
    return 0;
}

/* A failed decode: a full cache ends the run (named), else an error. */
static int gen_decode_fail(gen_state *g, keel_status st, bool *done)
{
    if (st == KEEL_EFULL) {
        if (g->compact)
            snprintf(g->stop, sizeof g->stop, "the KV cache is full: %s", keel_context_last_error(g->c));
        else
            snprintf(g->stop, sizeof g->stop,
                     "context full (-c %d cells, no compaction; raise -c or use --kv-compact P)", g->o->ctx.n_ctx);
        *done = true;
        return 0;
    }
    return cli_fail("run", st, keel_context_last_error(g->c));
}

/* Samples the token of a row (with a draft: by the acceptance rule) and
 * takes it. 0 or an exit code; *done when generation ends. */
static int gen_pick(gen_state *g, const float *logits, const int32_t *draft, int32_t *tok, bool *done)
{
    const float *row;
    int rc = gen_row(g, logits, &row, done);
    if (rc || *done) return rc;
    keel_status st = draft ? keel_sampler_sample_draft(g->s, row, *draft, tok) : keel_sampler_sample(g->s, row, tok);
    if (st != KEEL_OK) return cli_fail("sample", st, g->gm ? "no token the grammar allows" : NULL);
    return gen_take(g, *tok, done);
}

/* Generation from the prompt's last logits. The newest token is sampled
 * and taken, not decoded; each step decodes it, alone or with --spec
 * followed by drafted tokens whose rows pick the next tokens by the
 * acceptance rule until one differs from its draft (that one is the next
 * newest token; when every draft holds, the last row picks it). */
static int generate(gen_state *g, const float *logits)
{
    int32_t draft[KEEL_SPEC_MAX_DRAFT], batch[KEEL_SPEC_MAX_DRAFT + 1];
    int8_t want[KEEL_SPEC_MAX_DRAFT + 1];
    bool done = false;
    keel_status st;
    int32_t tok;
    int rc = gen_pick(g, logits, NULL, &tok, &done);
    while (!rc && !done) {
        int32_t k = 0;
        if (g->sp) {
            int32_t cap = g->o->ctx.n_batch - 1;
            if (cap > KEEL_SPEC_MAX_DRAFT) cap = KEEL_SPEC_MAX_DRAFT;
            if (g->o->n_predict >= 0 && g->o->n_predict - g->n_gen < cap) cap = g->o->n_predict - g->n_gen;
            if (keel_spec_draft(g->sp, 0, g->hist, g->n_hist, draft, cap, &k) != KEEL_OK) k = 0; /* none this step */
        }
        int32_t n0 = keel_mem_seq_pos_max(keel_context_memory(g->c), 0) + 1;
        batch[0] = tok;
        for (int32_t i = 0; i < k; i++) batch[i + 1] = draft[i];
        memset(want, 1, (size_t)k + 1);
        keel_batch b = {k + 1, batch, NULL, NULL, want};
        uint64_t t0 = keel_time_ns();
        st = k ? keel_decode_spec(g->c, &b) : keel_decode(g->c, &b);
        if (st != KEEL_OK) return gen_decode_fail(g, st, &done);
        uint64_t t1 = keel_time_ns();
        int32_t a = 0;
        while (a < k) {
            if ((rc = gen_pick(g, keel_logits(g->c, a), &draft[a], &tok, &done))) return rc;
            if (tok != draft[a] || done) break;
            a++;
        }
        bool all = a == k && !done;
        if (all && (rc = gen_pick(g, keel_logits(g->c, k), NULL, &tok, &done))) return rc;
        if (g->sp) keel_spec_result(g->sp, 0, k, a < k ? a : k, t1 - t0);
        g->drafted += k;
        g->accepted += a < k ? a : k;
        if (a < k) {
            /* the cache keeps the decoded token and the accepted drafts;
             * a draft that ended generation (done) is left pending */
            int32_t keep = n0 + 1 + a, resume = 0;
            if ((st = keel_context_rewind(g->c, 0, keep, &resume)) != KEEL_OK)
                return cli_fail("run", st, keel_context_last_error(g->c));
            if (resume != keep)
                return cli_fail("run", KEEL_EINTERNAL, "speculative decoding: the cache could not be rewound exactly");
        }
    }
    return rc;
}

int cmd_run(int argc, char **argv)
{
    cli_opts o;
    cli_opts_init(&o);
    o.groups = CLI_G_MODEL | CLI_G_PROMPT | CLI_G_FILE | CLI_G_GEN | CLI_G_SAMPLE | CLI_G_SEED |
               CLI_G_CTX | CLI_G_THREADS | CLI_G_KV | CLI_G_COMPACT | CLI_G_BUDGET;
    run_opts ro = {NULL, NULL, NULL, NULL, false, {{0}, NULL, NULL}};
    ro.spec.p = keel_spec_params_default();
    o.user = &ro;
    o.extra = run_extra;
    o.extra_help = "  --session-save FILE            save the sequence when the run ends (prompt, generated tokens)\n"
                   "  --session-load FILE            continue a saved run (-p MORE: text that follows it)\n"
                   "  --session-convert              re-encode a session saved with other --ctk/--ctv or rotation\n"
                   "  --grammar FILE                 constrain the output to a GBNF grammar (docs/grammar.md):\n"
                   "                                 generation ends when the grammar is complete\n"
                   "  --json-schema FILE             constrain the output to a JSON Schema's instances instead\n" CLI_SPEC_HELP;
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
    keel_model *dm = NULL;
    keel_spec *sp = NULL;
    keel_grammar *gr = NULL;
    keel_grammar_vocab *gv = NULL;
    keel_grammar_matcher *gm = NULL;
    float *glog = NULL; /* the logits row the grammar masks */
    FILE *lf = NULL, *idf = NULL;
    int8_t *flags = NULL;
    int32_t *hist = NULL, n_hist = 0, pending = 0;   /* --session-load: the saved history */
    int32_t *gen = NULL, gen_n = 0, gen_cap = 0;     /* --session-save: generated tokens */
    size_t piece_cap = 4096;
    char *piece = malloc(piece_cap);
    if (!piece) {
        rc = cli_fail("run", KEEL_ENOMEM, NULL);
        goto done;
    }
    if (ro.load) {
        /* the new text follows the saved one: no BOS */
        if (o.file || o.prompt_ids) {
            rc = cli_fail("run", KEEL_EINVAL, "--session-load takes -p MORE (not -f or --prompt-ids)");
            goto done;
        }
        if (o.prompt && *o.prompt) {
            size_t len = strlen(o.prompt);
            int32_t need = 0;
            st = keel_tokenize(m, o.prompt, len, false, false, NULL, 0, &need);
            if ((st != KEEL_OK && st != KEEL_ERANGE) || !(ids = malloc((size_t)(need ? need : 1) * sizeof(int32_t))) ||
                (need > 0 && (st = keel_tokenize(m, o.prompt, len, false, false, ids, need, &need)) != KEEL_OK)) {
                rc = cli_fail("tokenize", st != KEEL_OK ? st : KEEL_ENOMEM, NULL);
                goto done;
            }
            n_prompt = need;
        }
    } else {
        if ((rc = cli_prompt_ids(&o, m, &ids, &n_prompt))) goto done;
        if (n_prompt == 0) {
            rc = cli_fail("run", KEEL_EINVAL, "empty prompt (no tokens)");
            goto done;
        }
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
    if (ro.spec.p.kind != KEEL_SPEC_NONE) {
        o.ctx.speculative = true;
        /* a step verifies the newest token and its drafts: a logit row each */
        int32_t rows = ro.spec.p.max_draft + 1 < o.ctx.n_batch ? ro.spec.p.max_draft + 1 : o.ctx.n_batch;
        if (o.ctx.n_outputs < rows) o.ctx.n_outputs = rows;
    }
    if ((st = keel_context_open(m, &o.ctx, &c, err)) != KEEL_OK) {
        rc = cli_fail("context", st, err);
        goto done;
    }
    if ((rc = cli_spec_open(&ro.spec, m, &o.ctx, 1, &dm, &sp))) goto done;
    if (ro.load) {
        st = load_session(c, ro.load, ro.convert ? KEEL_SESSION_CONVERT : 0, &hist, &n_hist, &pending);
        if (st != KEEL_OK) {
            rc = cli_fail("--session-load", st, keel_context_last_error(c));
            if (st == KEEL_EUNSUPPORTED && !ro.convert)
                fprintf(stderr, "keel: --session-convert re-encodes it into this cache's types\n");
            goto done;
        }
        /* what the run decodes: the saved run's pending tokens, then the new text */
        int32_t n_new = pending + n_prompt;
        if (n_new == 0) {
            rc = cli_fail("--session-load", KEEL_EINVAL,
                          "the session holds no pending token (it was not saved by keel run): give -p MORE");
            goto done;
        }
        int32_t *todo = malloc((size_t)n_new * sizeof(int32_t));
        int32_t *h2 = realloc(hist, ((size_t)n_hist + (size_t)n_prompt + 1) * sizeof(int32_t));
        if (!todo || !h2) {
            free(todo);
            rc = cli_fail("run", KEEL_ENOMEM, NULL);
            goto done;
        }
        hist = h2;
        memcpy(todo, hist + n_hist - pending, (size_t)pending * sizeof(int32_t));
        if (n_prompt) memcpy(todo + pending, ids, (size_t)n_prompt * sizeof(int32_t));
        if (n_prompt) memcpy(hist + n_hist, ids, (size_t)n_prompt * sizeof(int32_t)); /* ids NULL without -p */
        n_hist += n_prompt;
        free(ids);
        ids = todo;
        n_prompt = n_new;
    }
    if ((st = keel_sampler_open(&o.samp, mi.n_vocab, &s)) != KEEL_OK) {
        rc = cli_fail("sampler", st, NULL);
        goto done;
    }
    if (ro.grammar && ro.schema) {
        rc = cli_fail("run", KEEL_EINVAL, "give --grammar or --json-schema, not both");
        goto done;
    }
    if (ro.grammar || ro.schema) {
        const char *gpath = ro.grammar ? ro.grammar : ro.schema, *flag = ro.grammar ? "--grammar" : "--json-schema";
        size_t gn = 0;
        char *src = cli_read_file(gpath, &gn);
        if (!src) {
            fprintf(stderr, "keel: %s %s: %s\n", flag, gpath, strerror(errno));
            rc = 1;
            goto done;
        }
        st = ro.grammar ? keel_grammar_compile(src, gn, &gr, err) : keel_grammar_compile_schema(src, gn, &gr, err);
        free(src);
        if (st != KEEL_OK) {
            rc = cli_fail(flag, st, err);
            goto done;
        }
        if ((st = keel_grammar_vocab_open(m, &gv, err)) != KEEL_OK ||
            (st = keel_grammar_matcher_open(gr, gv, &gm, err)) != KEEL_OK) {
            rc = cli_fail(flag, st, err);
            goto done;
        }
        if (!(glog = malloc((size_t)mi.n_vocab * sizeof *glog))) {
            rc = cli_fail("run", KEEL_ENOMEM, NULL);
            goto done;
        }
    }
    /* prompt, in batches of n_batch */
    int32_t nb = o.ctx.n_batch > 0 ? o.ctx.n_batch : 512;
    if (!(flags = calloc((size_t)nb, 1))) {
        rc = cli_fail("run", KEEL_ENOMEM, NULL);
        goto done;
    }
    uint64_t t0 = keel_time_ns();
    cli_progress prog;
    cli_progress_begin(&prog);
    for (int32_t i = 0; i < n_prompt; i += nb) {
        cli_progress_show(&prog, i, n_prompt); /* once per batch (-b) */
        int32_t n = n_prompt - i < nb ? n_prompt - i : nb;
        for (int32_t j = 0; j < n; j++) flags[j] = lf || (i + j == n_prompt - 1);
        keel_batch b = {n, ids + i, NULL, NULL, flags};
        if ((st = keel_decode(c, &b)) != KEEL_OK) {
            cli_progress_end(&prog);
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
                    cli_progress_end(&prog);
                    rc = 1;
                    goto done;
                }
    }
    cli_progress_end(&prog);
    if (!cli_close(lf, lf_what)) {
        lf = NULL;
        rc = 1;
        goto done;
    }
    lf = NULL;
    /* the penalties see the whole text (with a loaded session, its history) */
    const int32_t *seen = ro.load ? hist : ids;
    int32_t n_seen = ro.load ? n_hist : n_prompt;
    for (int32_t i = 0; i < n_seen; i++)
        if ((st = keel_sampler_accept(s, seen[i])) != KEEL_OK) {
            rc = cli_fail("sampler", st, NULL);
            goto done;
        }
    uint64_t t1 = keel_time_ns();
    /* generation: the text continues the prompt's (the saved run's) */
    keel_detok_stream ds;
    if ((st = keel_detok_stream_init_after(&ds, m, seen, n_seen)) != KEEL_OK) {
        rc = cli_fail("detokenize", st, NULL);
        goto done;
    }
    size_t pn;
    gen_state g = {c, m, s, gm, glog, mi.n_vocab, &o, compact, &ds, &piece, &piece_cap, idf, idf_what,
                   ro.save != NULL, &gen, &gen_n, &gen_cap, 0, "", sp, NULL, 0, 0, 0, 0};
    if (sp && (st = hist_push(&g, seen, n_seen)) != KEEL_OK) {
        rc = cli_fail("run", st, NULL);
        goto done;
    }
    rc = generate(&g, keel_logits(c, (n_prompt - 1) % nb));
    free(g.hist);
    int32_t n_gen = g.n_gen;
    if (rc) goto done;
    if (!g.stop[0]) snprintf(g.stop, sizeof g.stop, "-n %d tokens", o.n_predict);
    const char *stop = g.stop;
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
    if (ro.save && rc == 0) {
        /* the text so far and the generated tokens; the last sampled one is
         * not in the cache (pending) */
        const int32_t *base = ro.load ? hist : ids;
        int32_t nb0 = ro.load ? n_hist : n_prompt;
        int32_t *all = malloc(((size_t)nb0 + (size_t)gen_n + 1) * sizeof(int32_t));
        if (!all) {
            rc = cli_fail("run", KEEL_ENOMEM, NULL);
        } else {
            memcpy(all, base, (size_t)nb0 * sizeof(int32_t));
            memcpy(all + nb0, gen, (size_t)gen_n * sizeof(int32_t));
            st = keel_session_save(c, 0, all, nb0 + gen_n, gen_n > 0 ? 1 : 0, ro.save);
            free(all);
            if (st != KEEL_OK) rc = cli_fail("--session-save", st, keel_context_last_error(c));
        }
    }
    uint64_t t2 = keel_time_ns();
    char spec_note[160] = "";
    if (sp)
        snprintf(spec_note, sizeof spec_note, ", drafted %lld, accepted %lld (%.1f%%)", (long long)g.drafted,
                 (long long)g.accepted, g.drafted ? 100.0 * (double)g.accepted / (double)g.drafted : 0.0);
    double pp_s = (double)(t1 - t0) * 1e-9, tg_s = (double)(t2 - t1) * 1e-9;
    keel_mem *mem = keel_context_memory(c);
    char cmp[96] = "";
    if (compact)
        snprintf(cmp, sizeof cmp, ", %lld compactions, cells never above %d",
                 (long long)keel_mem_seq_compactions(mem, 0), keel_mem_seq_cells_high(mem, 0));
    fprintf(stderr,
            "\nkeel: prompt %d tokens in %.3f s (%.1f tok/s), generated %d tokens in %.3f s (%.1f "
            "tok/s)%s%s; stopped: %s\n",
            n_prompt, pp_s, pp_s > 0 ? n_prompt / pp_s : 0.0, n_gen, tg_s,
            tg_s > 0 ? n_gen / tg_s : 0.0, cmp, spec_note, stop);
done:
    keel_grammar_matcher_close(gm);
    keel_grammar_vocab_close(gv);
    keel_grammar_close(gr);
    free(glog);
    free(gen);
    free(hist);
    if (lf) fclose(lf); /* only on an error path: the data is incomplete anyway */
    if (idf) fclose(idf);
    free(flags);
    free(piece);
    keel_sampler_close(s);
    keel_spec_close(sp);
    keel_model_close(dm);
    keel_context_close(c);
    free(ids);
    keel_model_close(m);
    return rc;
}
