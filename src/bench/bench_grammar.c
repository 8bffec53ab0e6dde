/*
 * bench_grammar.c — `keel bench grammar -m MODEL [-n 256] [-t N] [-s SEED]
 * [--json-schema FILE] [--text FILE] [--seg-cost N] [--dump PREFIX]
 * [--json]`: the cost of constrained decoding per
 * generated token beside the decode step of the same model in the same
 * run. The model generates n tokens at temperature 1 (no other filter)
 * under a JSON grammar (any JSON value, nested objects and arrays,
 * escapes, numbers) or the schema of FILE; each step
 * times the token mask (gram_matcher_apply over the model's logits), the
 * advance by the sampled token and the decode of that token. Reported:
 * vocabulary trie build and grammar compile time, the mask time per token
 * (median, mean, p99, max; the steps whose state held a stack seen for the
 * first time, which walk the trie, counted apart), and mask / decode; and
 * the compile time of a generated 30-property schema (nested objects,
 * arrays, enums, string lengths).
 * When the grammar is complete the matcher starts over (another value).
 * Then the sampled tokens (or those of --text FILE) are replayed on a
 * fresh matcher and again with every mask cached, without decoding in
 * between. --seg-cost N sets gram_limits.seg_max_cost (0: whole-stack
 * walks only); --dump PREFIX writes PREFIX.gbnf and PREFIX.tokens for
 * tools/grammar/llama_grammar_bench.cpp.
 */
#include "bench.h"

#include "../engine/engine.h"
#include "../grammar/grammar.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const char *g_json_gbnf =
    "root   ::= value\n"
    "value  ::= object | array | string | number | \"true\" | \"false\" | \"null\"\n"
    "object ::= \"{\" ws ( member ( ws \",\" ws member )* )? ws \"}\"\n"
    "member ::= string ws \":\" ws value\n"
    "array  ::= \"[\" ws ( value ( ws \",\" ws value )* )? ws \"]\"\n"
    "string ::= \"\\\"\" ( [^\"\\\\\\x00-\\x1f] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} ) )* \"\\\"\"\n"
    "number ::= \"-\"? ( \"0\" | [1-9] [0-9]* ) ( \".\" [0-9]+ )? ( [eE] [-+]? [0-9]+ )?\n"
    "ws     ::= [ \\t\\n]{0,8}\n";

/* A 30-property schema: 10 flat properties of each kind, an object of 10
 * nested ones, and arrays of enums, into buf[cap]. */
static void schema30(char *buf, size_t cap)
{
    size_t o = (size_t)snprintf(buf, cap, "{\"type\":\"object\",\"properties\":{");
    for (int i = 0; i < 30 && o < cap; i++) {
        const char *t = i % 5 == 0   ? "{\"type\":\"string\",\"maxLength\":32}"
                        : i % 5 == 1 ? "{\"type\":\"integer\"}"
                        : i % 5 == 2 ? "{\"type\":\"array\",\"items\":{\"enum\":[\"red\",\"green\",\"blue\"]},\"maxItems\":4}"
                        : i % 5 == 3 ? "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"number\"},\"y\":"
                                       "{\"type\":[\"boolean\",\"null\"]}},\"required\":[\"x\"]}"
                                     : "{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"number\"}]}";
        o += (size_t)snprintf(buf + o, cap - o, "%s\"field_%02d\":%s", i ? "," : "", i, t);
    }
    if (o < cap) snprintf(buf + o, cap - o, "},\"required\":[\"field_00\",\"field_01\"],\"additionalProperties\":false}");
}

static void sort_d(double *v, int64_t n)
{
    for (int64_t i = 1; i < n; i++) { /* insertion: n is a few hundred */
        double x = v[i];
        int64_t j = i;
        while (j > 0 && v[j - 1] > x) {
            v[j] = v[j - 1];
            j--;
        }
        v[j] = x;
    }
}

static double pct(const double *sorted, int64_t n, double p)
{
    if (n == 0) return 0;
    int64_t i = (int64_t)ceil(p * (double)n) - 1;
    return sorted[BASE_MAX(0, BASE_MIN(i, n - 1))];
}

/* --dump P: P.gbnf (the grammar) and P.tokens (the replayed ids: those
 * sampled or those of --text; one a line, "reset" where the matcher
 * started over), for the llama.cpp
 * comparison (tools/grammar/llama_grammar_bench.cpp). */
static keel_status dump_run(bench_out *o, const char *prefix, const char *gbnf, const int32_t *seq, int64_t n_seq)
{
    char path[4096];
    snprintf(path, sizeof path, "%s.gbnf", prefix);
    FILE *f = fopen(path, "wb");
    bool ok = f && fwrite(gbnf, 1, strlen(gbnf), f) == strlen(gbnf);
    if (f && fclose(f) != 0) ok = false;
    if (!ok) return base_err(o->err, KEEL_EIO, "bench grammar: cannot write %s", path);
    snprintf(path, sizeof path, "%s.tokens", prefix);
    f = fopen(path, "wb");
    ok = f != NULL;
    for (int64_t i = 0; ok && i < n_seq; i++)
        ok = (seq[i] < 0 ? fprintf(f, "reset\n") : fprintf(f, "%d\n", seq[i])) > 0;
    if (f && fclose(f) != 0) ok = false;
    if (!ok) return base_err(o->err, KEEL_EIO, "bench grammar: cannot write %s", path);
    return KEEL_OK;
}

/* The sampled sequence replayed on a fresh matcher (then once more on the
 * same one, every mask cached), without decoding in between: the mask
 * (gram_matcher_apply on lg) per token into cold[] and warm[] (n_seq
 * each); *n the tokens timed. The model's threads are idle here, so on a
 * busy machine these are steadier than the timings beside the decode. */
static keel_status replay(const gram *g, const gram_vocab *v, const gram_limits *lim, const int32_t *seq,
                          int64_t n_seq, float *lg, double *cold, double *warm, int64_t *n, char *err)
{
    gram_matcher *gm = NULL;
    keel_status st = gram_matcher_open(g, v, lim, &gm, err);
    if (st) return st;
    for (int pass = 0; pass < 2 && !st; pass++) {
        double *t = pass ? warm : cold;
        int64_t k = 0;
        if ((st = gram_matcher_reset(gm))) break;
        for (int64_t i = 0; i < n_seq && !st; i++) {
            if (seq[i] < 0) {
                st = gram_matcher_reset(gm);
                continue;
            }
            uint64_t a = base_time_ns();
            if ((st = gram_matcher_apply(gm, lg))) break;
            t[k++] = (double)(base_time_ns() - a) * 1e-3;
            if (!((v->eog[seq[i] / 64] >> (seq[i] % 64)) & 1u)) st = gram_matcher_accept_token(gm, seq[i]);
        }
        *n = k;
    }
    if (st) base_err(err, st, "%s", gram_matcher_error(gm));
    gram_matcher_close(gm);
    return st;
}

#define T_IDS 65536 /* tokens of --text at most */

static double mean_d(const double *v, int64_t n)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += v[i];
    return n ? s / (double)n : 0;
}

keel_status bench_grammar(int argc, char **argv, bench_out *o)
{
    static const bench_flag spec[] = {{"-m", true}, {"-n", true}, {"-t", true}, {"-s", true}, {"--json-schema", true},
                                      {"--dump", true}, {"--seg-cost", true},
                                      {"--text", true}};
    keel_status st = bench_check_args(o, "grammar", argc, argv, spec, BASE_ARRAY_LEN(spec));
    if (st != KEEL_OK) return st;
    const char *path = bench_opt(argc, argv, "-m");
    if (!path) return base_err(o->err, KEEL_EINVAL, "bench grammar: -m MODEL is required (e.g. keel gen-model --vocab 151936)");
    int64_t n_gen, threads, seed, seg_cost;
    gram_limits lim = gram_limits_default();
    if ((st = bench_int_opt(o, "grammar", argc, argv, "-n", 1, 65536, 256, &n_gen)) != KEEL_OK ||
        (st = bench_int_opt(o, "grammar", argc, argv, "-t", 0, 256, 0, &threads)) != KEEL_OK ||
        (st = bench_int_opt(o, "grammar", argc, argv, "-s", 0, INT64_MAX, 1, &seed)) != KEEL_OK ||
        (st = bench_int_opt(o, "grammar", argc, argv, "--seg-cost", 0, UINT32_MAX, lim.seg_max_cost, &seg_cost)) !=
            KEEL_OK)
        return st;
    lim.seg_max_cost = (uint32_t)seg_cost;
    keel_model_params mp = keel_model_params_default();
    mp.path = path;
    keel_model *m = NULL;
    keel_context *c = NULL;
    keel_sampler *s = NULL;
    gram *g = NULL;
    gram_vocab *v = NULL;
    gram_matcher *gm = NULL;
    float *lg = NULL;
    double *t_mask = NULL, *t_mask_warm = NULL, *t_dec = NULL, *t_acc = NULL, *t_state = NULL, *t_apply = NULL;
    double *t_rc = NULL, *t_rw = NULL; /* replayed: a fresh matcher, then every mask cached */
    int32_t *t_ids = NULL;             /* the tokens of --text */
    uint64_t *mbits = NULL;
    int32_t *seq = NULL; /* the sampled tokens, -1 where the matcher starts over (--dump) */
    int64_t n_seq = 0;
    char *gbnf = NULL;
    size_t n_gbnf = 0;
    int32_t n_vocab = 0;
    char err[256] = "";
    if ((st = keel_model_open(&mp, &m, err)) != KEEL_OK) return base_err(o->err, st, "bench grammar: %s: %s", path, err);
    n_vocab = m->w.hp.n_vocab;
    keel_context_params cp = keel_context_params_default();
    cp.n_ctx = (int32_t)n_gen + 64;
    cp.n_threads = (int32_t)threads;
    if ((st = keel_context_open(m, &cp, &c, err)) != KEEL_OK) {
        base_err(o->err, st, "bench grammar: context: %s", err);
        goto out;
    }
    uint64_t t0 = base_time_ns();
    if ((st = engine_grammar_vocab(m, &v, err)) != KEEL_OK) {
        base_err(o->err, st, "bench grammar: vocabulary: %s", err);
        goto out;
    }
    double vocab_ms = (double)(base_time_ns() - t0) * 1e-6;
    int reps = 20;
    char s30[4096];
    schema30(s30, sizeof s30);
    t0 = base_time_ns();
    for (int r = 0; r < reps; r++) {
        gram_free(g);
        g = NULL;
        if ((st = gram_compile_schema(s30, strlen(s30), &g, err)) != KEEL_OK) {
            base_err(o->err, st, "bench grammar: the 30-property schema: %s", err);
            goto out;
        }
    }
    double schema30_ms = (double)(base_time_ns() - t0) * 1e-6 / reps;
    const char *schema_path = bench_opt(argc, argv, "--json-schema");
    char *schema_src = NULL;
    size_t schema_n = 0;
    if (schema_path) {
        FILE *f = fopen(schema_path, "rb");
        if (f) {
            schema_src = base_alloc(1 << 20);
            if (schema_src) schema_n = fread(schema_src, 1, (1 << 20) - 1, f);
            fclose(f);
        }
        if (!schema_src) {
            st = base_err(o->err, KEEL_EIO, "bench grammar: cannot read %s", schema_path);
            goto out;
        }
    }
    t0 = base_time_ns();
    for (int r = 0; r < reps && st == KEEL_OK; r++) {
        gram_free(g);
        g = NULL;
        st = schema_src ? gram_compile_schema(schema_src, schema_n, &g, err)
                        : gram_compile(g_json_gbnf, strlen(g_json_gbnf), &g, err);
    }
    if (st == KEEL_OK && schema_src && (st = gram_schema_gbnf(schema_src, schema_n, &gbnf, &n_gbnf, err)) != KEEL_OK)
        gbnf = NULL;
    base_free(schema_src, 1 << 20);
    if (st != KEEL_OK) {
        base_err(o->err, st, "bench grammar: compile: %s", err);
        goto out;
    }
    double compile_ms = (double)(base_time_ns() - t0) * 1e-6 / reps;
    if ((st = gram_matcher_open(g, v, &lim, &gm, err)) != KEEL_OK) {
        base_err(o->err, st, "bench grammar: matcher: %s", err);
        goto out;
    }
    keel_sampler_params sp = keel_sampler_params_default();
    sp.temp = 1.0f;
    sp.top_k = 0;
    sp.top_p = 1.0f;
    sp.min_p = 0.0f;
    sp.seed = (uint64_t)seed;
    if ((st = keel_sampler_open(&sp, n_vocab, &s)) != KEEL_OK) {
        base_err(o->err, st, "bench grammar: sampler");
        goto out;
    }
    lg = base_alloc((size_t)n_vocab * sizeof *lg);
    t_mask = base_alloc((size_t)n_gen * sizeof(double));
    t_mask_warm = base_alloc((size_t)n_gen * sizeof(double));
    t_dec = base_alloc((size_t)n_gen * sizeof(double));
    t_acc = base_alloc((size_t)n_gen * sizeof(double));
    t_state = base_alloc((size_t)n_gen * sizeof(double));
    t_apply = base_alloc((size_t)n_gen * sizeof(double));
    mbits = base_alloc((size_t)v->n_words * sizeof *mbits);
    seq = base_alloc((size_t)n_gen * 2 * sizeof *seq);
    t_rc = base_alloc((size_t)BASE_MAX(n_gen * 2, T_IDS) * sizeof *t_rc);
    t_rw = base_alloc((size_t)BASE_MAX(n_gen * 2, T_IDS) * sizeof *t_rw);
    t_ids = base_alloc((size_t)T_IDS * sizeof *t_ids);
    if (!t_rc || !t_rw || !t_ids || !lg || !t_mask || !t_mask_warm || !t_dec || !t_acc || !t_state || !t_apply || !mbits || !seq) {
        st = base_err(o->err, KEEL_ENOMEM, "bench grammar: out of memory");
        goto out;
    }
    int32_t prompt[32], n_prompt = 0;
    if ((st = keel_tokenize(m, "JSON:", 5, true, false, prompt, 32, &n_prompt)) != KEEL_OK) {
        base_err(o->err, st, "bench grammar: tokenize");
        goto out;
    }
    keel_batch b = {n_prompt, prompt, NULL, NULL, NULL};
    if ((st = keel_decode(c, &b)) != KEEL_OK) {
        base_err(o->err, st, "bench grammar: decode: %s", keel_context_last_error(c));
        goto out;
    }
    int64_t n_warm = 0, n_done = 0, restarts = 0;
    gram_stats gs0, gs1;
    for (int64_t i = 0; i < n_gen; i++) {
        if (gram_matcher_done(gm)) {
            if ((st = gram_matcher_reset(gm)) != KEEL_OK) goto gfail;
            restarts++;
            seq[n_seq++] = -1;
        }
        /* the logits of the batch's last token: the prompt's, then each single token's */
        memcpy(lg, keel_logits(c, i == 0 ? n_prompt - 1 : 0), (size_t)n_vocab * sizeof *lg);
        gram_matcher_stats(gm, &gs0);
        /* the mask of the state (cached per state), then the pass over the
         * logits (a cache hit of the same state): the two halves of apply */
        uint64_t a = base_time_ns();
        if ((st = gram_matcher_mask(gm, mbits)) != KEEL_OK) goto gfail;
        uint64_t am = base_time_ns();
        if ((st = gram_matcher_apply(gm, lg)) != KEEL_OK) goto gfail;
        uint64_t bt = base_time_ns();
        gram_matcher_stats(gm, &gs1);
        int32_t tok;
        if ((st = keel_sampler_sample(s, lg, &tok)) != KEEL_OK) {
            base_err(o->err, st, "bench grammar: no token allowed");
            goto out;
        }
        uint64_t c0 = base_time_ns();
        seq[n_seq++] = tok;
        if (keel_token_is_eog(m, tok)) {
            st = gram_matcher_reset(gm); /* the value is complete: start another */
            restarts++;
            seq[n_seq++] = -1;
            if (st) goto gfail;
        } else if ((st = gram_matcher_accept_token(gm, tok)) != KEEL_OK) {
            goto gfail;
        }
        uint64_t c1 = base_time_ns();
        keel_batch one = {1, &tok, NULL, NULL, NULL};
        if ((st = keel_decode(c, &one)) != KEEL_OK) {
            base_err(o->err, st, "bench grammar: decode: %s", keel_context_last_error(c));
            goto out;
        }
        uint64_t c2 = base_time_ns();
        t_mask[i] = (double)(bt - a) * 1e-3;
        t_state[i] = (double)(am - a) * 1e-3;
        t_apply[i] = (double)(bt - am) * 1e-3;
        t_acc[i] = (double)(c1 - c0) * 1e-3;
        t_dec[i] = (double)(c2 - c1) * 1e-6;
        if (gs1.mask_misses == gs0.mask_misses) t_mask_warm[n_warm++] = t_mask[i];
        n_done++;
    }
    gram_stats gs;
    gram_matcher_stats(gm, &gs);
    double sum_m = 0, sum_a = 0, sum_d = 0, sum_w = 0;
    for (int64_t i = 0; i < n_done; i++) {
        sum_m += t_mask[i];
        sum_a += t_acc[i];
        sum_d += t_dec[i];
    }
    for (int64_t i = 0; i < n_warm; i++) sum_w += t_mask_warm[i];
    sort_d(t_mask, n_done);
    sort_d(t_mask_warm, n_warm);
    sort_d(t_dec, n_done);
    sort_d(t_state, n_done);
    sort_d(t_apply, n_done);
    double state_med = pct(t_state, n_done, 0.5), apply_med = pct(t_apply, n_done, 0.5);
    /* --text FILE: the replay follows that text's tokens instead */
    const char *text_path = bench_opt(argc, argv, "--text");
    const int32_t *rseq = seq;
    int64_t n_rseq = n_seq;
    if (text_path) {
        FILE *f = fopen(text_path, "rb");
        size_t cap = 1 << 20, n_text = 0;
        char *text = f ? base_alloc(cap) : NULL;
        if (text) n_text = fread(text, 1, cap, f);
        if (f) fclose(f);
        int32_t n_tok = 0;
        keel_status ts = text && n_text < cap ? keel_tokenize(m, text, n_text, false, false, t_ids, T_IDS, &n_tok)
                                              : KEEL_EIO;
        base_free(text, text ? cap : 0);
        if (ts != KEEL_OK) {
            st = base_err(o->err, ts, "bench grammar: --text %s: cannot read or tokenize (up to 1 MiB, %d tokens)",
                          text_path, T_IDS);
            goto out;
        }
        rseq = t_ids;
        n_rseq = n_tok;
    }
    const char *dump = bench_opt(argc, argv, "--dump"); /* the replayed tokens */
    if (dump && (st = dump_run(o, dump, gbnf ? gbnf : g_json_gbnf, rseq, n_rseq)) != KEEL_OK) goto out;
    int64_t n_rep = 0;
    if ((st = replay(g, v, &lim, rseq, n_rseq, lg, t_rc, t_rw, &n_rep, err)) != KEEL_OK) {
        base_err(o->err, st, "bench grammar: replay: %s", err);
        goto out;
    }
    double rc_mean = mean_d(t_rc, n_rep), rw_mean = mean_d(t_rw, n_rep);
    sort_d(t_rc, n_rep);
    sort_d(t_rw, n_rep);
    double rc_med = pct(t_rc, n_rep, 0.5), rw_med = pct(t_rw, n_rep, 0.5);

    double dec_med = pct(t_dec, n_done, 0.5), mask_med = pct(t_mask, n_done, 0.5);
    double warm_med = pct(t_mask_warm, n_warm, 0.5), warm_mean = n_warm ? sum_w / (double)n_warm : 0;
    int64_t n_cold = n_done - n_warm;
    if (o->json) {
        bench_printf(o,
                     "{\"bench\":\"grammar\",\"model\":\"%s\",\"grammar\":\"%s\",\"n_vocab\":%d,\"tokens\":%lld,"
                     "\"vocab_build_ms\":%.2f,\"grammar_compile_ms\":%.4f,\"schema30_compile_ms\":%.4f,\"decode_step_ms_median\":%.3f,\"decode_step_ms_mean\":%.3f,"
                     "\"mask_us_median\":%.2f,\"mask_us_mean\":%.2f,\"mask_us_p99\":%.2f,\"mask_us_max\":%.2f,"
                     "\"mask_cached_us_median\":%.2f,\"mask_cached_us_mean\":%.2f,\"cached_steps\":%lld,"
                     "\"first_visit_steps\":%lld,\"trie_walks\":%lld,\"segment_walks\":%lld,\"trie_walk_ms_total\":%.2f,"
                     "\"stack_masks_composed\":%lld,\"mask_state_us_median\":%.2f,\"mask_apply_us_median\":%.2f,"
                     "\"replay_mask_us_median\":%.2f,\"replay_mask_us_mean\":%.2f,\"replay_cached_mask_us_median\":%.2f,"
                     "\"replay_cached_mask_us_mean\":%.2f,"
                     "\"accept_us_mean\":%.2f,\"mask_over_decode_median\":%.5f,\"parser_stacks\":%u,"
                     "\"mask_cache_bytes\":%zu,\"restarts\":%lld}\n",
                     path, schema_path ? "json-schema" : "json", n_vocab, (long long)n_done, vocab_ms, compile_ms,
                     schema30_ms, dec_med, sum_d / (double)n_done,
                     mask_med, sum_m / (double)n_done, pct(t_mask, n_done, 0.99), t_mask[n_done - 1], warm_med,
                     warm_mean, (long long)n_warm, (long long)n_cold, (long long)gs.mask_misses,
                     (long long)gs.seg_walks, (double)gs.miss_ns * 1e-6, (long long)gs.mask_composed, state_med,
                     apply_med, rc_med, rc_mean, rw_med, rw_mean, sum_a / (double)n_done, mask_med * 1e-3 / dec_med, gs.n_nodes,
                     gs.mask_bytes, (long long)restarts);
    } else {
        bench_printf(o, "constrained decoding, %s: %s (n_vocab %d), %lld tokens at temperature 1\n",
                     schema_path ? schema_path : "JSON grammar", path, n_vocab, (long long)n_done);
        bench_printf(o, "| measure | value |\n|---|---|\n");
        bench_printf(o, "| vocabulary trie build | %.1f ms |\n", vocab_ms);
        bench_printf(o, "| grammar compile | %.3f ms |\n", compile_ms);
        bench_printf(o, "| 30-property schema compile | %.3f ms |\n", schema30_ms);
        bench_printf(o, "| decode step (reference), median / mean | %.3f / %.3f ms |\n", dec_med, sum_d / (double)n_done);
        bench_printf(o, "| mask per token, median / mean / p99 / max | %.1f / %.1f / %.1f / %.1f us |\n", mask_med,
                     sum_m / (double)n_done, pct(t_mask, n_done, 0.99), t_mask[n_done - 1]);
        bench_printf(o, "| mask per token, steps without a trie walk (%lld), median / mean | %.1f / %.1f us |\n",
                     (long long)n_warm, warm_med, warm_mean);
        bench_printf(o, "| mask per token, median: the state's mask / the pass over the logits | %.1f / %.1f us |\n",
                     state_med, apply_med);
        bench_printf(o, "| steps with a trie walk / walks (of segments) / their total | %lld / %lld (%lld) / %.1f ms |\n",
                     (long long)n_cold, (long long)gs.mask_misses, (long long)gs.seg_walks,
                     (double)gs.miss_ns * 1e-6);
        bench_printf(o, "| stack masks composed from a segment | %lld |\n", (long long)gs.mask_composed);
        bench_printf(o, "| replayed without decoding%s%s (%lld tokens), fresh matcher: mask median / mean | %.1f / %.1f us |\n",
                     text_path ? ", the tokens of " : "", text_path ? text_path : "", (long long)n_rep, rc_med, rc_mean);
        bench_printf(o, "| replayed again, every mask cached: median / mean | %.1f / %.1f us |\n", rw_med, rw_mean);
        bench_printf(o, "| advance by the token, mean | %.2f us |\n", sum_a / (double)n_done);
        bench_printf(o, "| mask / decode step (medians) | %.2f%% |\n", 100.0 * mask_med * 1e-3 / dec_med);
        bench_printf(o, "| parser stacks interned / mask cache | %u / %.1f MiB |\n", gs.n_nodes,
                     (double)gs.mask_bytes / 1048576.0);
    }
    st = KEEL_OK;
    goto out;
gfail:
    base_err(o->err, st, "bench grammar: %s", gram_matcher_error(gm));
out:
    base_free(t_mask, (size_t)n_gen * sizeof(double));
    base_free(t_mask_warm, (size_t)n_gen * sizeof(double));
    base_free(t_dec, (size_t)n_gen * sizeof(double));
    base_free(t_acc, (size_t)n_gen * sizeof(double));
    base_free(t_state, (size_t)n_gen * sizeof(double));
    base_free(t_apply, (size_t)n_gen * sizeof(double));
    base_free(mbits, v ? (size_t)v->n_words * sizeof *mbits : 0);
    base_free(seq, (size_t)n_gen * 2 * sizeof *seq);
    base_free(t_rc, (size_t)BASE_MAX(n_gen * 2, T_IDS) * sizeof *t_rc);
    base_free(t_rw, (size_t)BASE_MAX(n_gen * 2, T_IDS) * sizeof *t_rw);
    base_free(t_ids, (size_t)T_IDS * sizeof *t_ids);
    base_free(gbnf, gbnf ? n_gbnf + 1 : 0);
    base_free(lg, (size_t)n_vocab * sizeof *lg);
    gram_matcher_close(gm);
    gram_free(g);
    gram_vocab_free(v);
    keel_sampler_close(s);
    keel_context_close(c);
    keel_model_close(m);
    return st;
}
