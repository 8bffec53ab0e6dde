/*
 * test_spec.c — speculative decoding (keel.h: keel_decode_spec,
 * keel_sampler_sample_draft, keel_spec, the engine's spec options):
 *   - greedy equivalence: on a dense, a sliding-window, a hybrid
 *     (Gated DeltaNet) and a Mamba2 model, a verifier fed drafts that are
 *     right or wrong at a chosen rate (the known continuation, corrupted)
 *     produces exactly the tokens of plain decoding, and the memory passes
 *     keel_mem_check after every rewind (rings wrap, recurrent states go
 *     back through their snapshot and decode the accepted tokens again);
 *   - the acceptance rule: tokens drawn with a draft are distributed as
 *     the sampler's (chi-square over 200,000 draws, drafts likely,
 *     unlikely and outside the kept candidates);
 *   - the n-gram drafter, the draft-model vocabulary check, the back-off,
 *     the engine's step cost and each slot's share of a step;
 *   - the engine: keel_complete with "spec": "ngram" and with a draft
 *     model gives the text of a run without, and reports the drafts.
 */
#include "testutil.h"
#include "engine/eng.h"

#include <jansson.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GEN 96

static char g_dir[64];

static int setup(void **state)
{
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/keel_spec_XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void gen_model(const char *arch, int32_t layers, int32_t swa, int32_t vocab, uint64_t seed, char *path,
                      size_t cap)
{
    snprintf(path, cap, "%s/%s_%d_%d_%llu.gguf", g_dir, arch, layers, vocab, (unsigned long long)seed);
    if (access(path, R_OK) == 0) return;
    keel_gen_params gp = keel_gen_params_default();
    gp.arch = arch;
    gp.n_layer = layers;
    gp.n_embd = 64;
    gp.n_swa = swa;
    gp.seed = seed;
    if (vocab) gp.n_vocab = vocab;
    char err[256] = "";
    keel_status st = keel_gen_model(&gp, path, err);
    if (st != KEEL_OK) fail_msg("gen-model %s: %s", arch, err);
}

static int32_t argmax(const float *x, int32_t n)
{
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Plain greedy decoding of n tokens after prompt. */
static void plain(keel_model *m, const keel_context_params *cp, const int32_t *prompt, int32_t np, int32_t *out,
                  int32_t n)
{
    keel_context *c = NULL;
    char err[256];
    assert_int_equal(keel_context_open(m, cp, &c, err), KEEL_OK);
    keel_batch b = {np, (int32_t *)prompt, NULL, NULL, NULL};
    assert_int_equal(keel_decode(c, &b), KEEL_OK);
    keel_model_info mi;
    keel_model_info_get(m, &mi);
    for (int32_t i = 0; i < n; i++) {
        out[i] = argmax(keel_logits(c, i == 0 ? np - 1 : 0), mi.n_vocab);
        keel_batch b1 = {1, &out[i], NULL, NULL, NULL};
        assert_int_equal(keel_decode(c, &b1), KEEL_OK);
    }
    keel_context_close(c);
}

/* Greedy decoding verifying drafts of up to k tokens, each the known
 * continuation ref or (with probability wrong) another token. Returns the
 * accepted drafts. */
static int64_t verified(keel_model *m, const keel_context_params *cp0, const int32_t *prompt, int32_t np,
                        const int32_t *ref, int32_t n, int32_t k, double wrong, uint64_t seed, int32_t *out)
{
    keel_context_params cp = *cp0;
    cp.speculative = true;
    cp.n_outputs = k + 1;
    keel_context *c = NULL;
    char err[256];
    assert_int_equal(keel_context_open(m, &cp, &c, err), KEEL_OK);
    keel_mem *mem = keel_context_memory(c);
    keel_batch b = {np, (int32_t *)prompt, NULL, NULL, NULL};
    assert_int_equal(keel_decode(c, &b), KEEL_OK);
    keel_model_info mi;
    keel_model_info_get(m, &mi);
    int32_t got = 0, tok = argmax(keel_logits(c, np - 1), mi.n_vocab);
    out[got++] = tok;
    int64_t acc = 0;
    uint64_t r = seed;
    while (got < n) {
        int32_t batch[17], kk = 0;
        int8_t want[17];
        batch[0] = tok;
        for (int32_t i = 0; i < k && got + i < n; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            double u = (double)(r >> 11) / 9007199254740992.0;
            int32_t t = ref[got + i];
            if (u < wrong) t = (t + 1 + (int32_t)(r >> 40) % (mi.n_vocab - 1)) % mi.n_vocab;
            batch[++kk] = t;
        }
        memset(want, 1, sizeof want);
        int32_t n0 = keel_mem_seq_pos_max(mem, 0) + 1;
        keel_batch sb = {kk + 1, batch, NULL, NULL, want};
        assert_int_equal(kk ? keel_decode_spec(c, &sb) : keel_decode(c, &sb), KEEL_OK);
        int32_t a = 0;
        for (;;) {
            tok = argmax(keel_logits(c, a), mi.n_vocab);
            out[got++] = tok;
            if (a == kk || tok != batch[a + 1] || got == n) break;
            a++;
        }
        acc += a;
        if (a < kk) {
            int32_t resume = -1;
            assert_int_equal(keel_context_rewind(c, 0, n0 + 1 + a, &resume), KEEL_OK);
            assert_int_equal(resume, n0 + 1 + a);
        }
        assert_int_equal(keel_mem_seq_pos_max(mem, 0) + 1, n0 + 1 + a);
        assert_int_equal(keel_mem_check(mem), KEEL_OK);
    }
    keel_context_close(c);
    return acc;
}

static void greedy_case(const char *arch, int32_t layers, int32_t swa)
{
    char path[128];
    gen_model(arch, layers, swa, 0, 7, path, sizeof path);
    keel_model *m = NULL;
    keel_model_params mp = keel_model_params_default();
    mp.path = path;
    char err[256];
    assert_int_equal(keel_model_open(&mp, &m, err), KEEL_OK);
    keel_context_params cp = keel_context_params_default();
    cp.n_ctx = 512;
    cp.n_threads = 1;
    cp.deterministic = true; /* a row's logits do not depend on the batch: exact token equality */
    int32_t prompt[24], ref[GEN], out[GEN];
    for (int32_t i = 0; i < 24; i++) prompt[i] = 5 + (i * 37) % 200;
    plain(m, &cp, prompt, 24, ref, GEN);
    const double rates[] = {0.0, 0.1, 0.4, 1.0};
    for (int32_t w = 0; w < 4; w++)
        for (int32_t k = 1; k <= 16; k *= 4) {
            int64_t acc = verified(m, &cp, prompt, 24, ref, GEN, k, rates[w], 99 + (uint64_t)w, out);
            for (int32_t i = 0; i < GEN; i++)
                if (out[i] != ref[i])
                    fail_msg("%s: k %d wrong %.1f: token %d is %d, plain decoding gave %d", arch, k, rates[w], i,
                             out[i], ref[i]);
            if (rates[w] == 0.0) assert_true(acc >= GEN - 1 - (GEN + k - 1) / k * 1 - 1);
            if (rates[w] == 1.0) assert_int_equal(acc, 0);
        }
    keel_model_close(m);
}

static void test_greedy_dense(void **state)
{
    (void)state;
    greedy_case("llama", 2, 0);
}

static void test_greedy_sliding(void **state)
{
    (void)state;
    greedy_case("gemma2", 2, 8); /* a window of 8: the ring wraps many times over 120 tokens */
}

static void test_greedy_hybrid(void **state)
{
    (void)state;
    greedy_case("qwen35", 4, 0);
}

static void test_greedy_mamba2(void **state)
{
    (void)state;
    greedy_case("mamba2", 2, 0);
}

/* A recurrent context opened without speculative refuses drafts, named. */
static void test_recurrent_needs_flag(void **state)
{
    (void)state;
    char path[128];
    gen_model("mamba2", 2, 0, 0, 7, path, sizeof path);
    keel_model *m = NULL;
    keel_model_params mp = keel_model_params_default();
    mp.path = path;
    char err[256];
    assert_int_equal(keel_model_open(&mp, &m, err), KEEL_OK);
    keel_context_params cp = keel_context_params_default();
    cp.n_ctx = 128;
    cp.n_outputs = 4;
    keel_context *c = NULL;
    assert_int_equal(keel_context_open(m, &cp, &c, err), KEEL_OK);
    int32_t t[3] = {5, 6, 7};
    int8_t want[3] = {1, 1, 1};
    keel_batch b = {3, t, NULL, NULL, want};
    assert_int_equal(keel_decode_spec(c, &b), KEEL_EUNSUPPORTED);
    assert_non_null(strstr(keel_context_last_error(c), "speculative"));
    assert_int_equal(keel_mem_seq_pos_max(keel_context_memory(c), 0), -1); /* nothing changed */
    keel_context_close(c);
    keel_model_close(m);
}

/* The acceptance rule keeps the sampler's distribution. */
static void test_sample_draft_distribution(void **state)
{
    (void)state;
    enum { V = 8, N = 200000 };
    const float logits[V] = {2.0f, 1.5f, 1.0f, 0.5f, 0.0f, -0.5f, -3.0f, -8.0f};
    keel_sampler_params sp = keel_sampler_params_default();
    sp.temp = 1.0f;
    sp.top_k = 6; /* tokens 6 and 7 are outside the kept candidates */
    sp.top_p = 1.0f;
    sp.min_p = 0.0f;
    sp.seed = 42;
    double p[V] = {0}, z = 0;
    for (int32_t i = 0; i < 6; i++) z += exp(logits[i]);
    for (int32_t i = 0; i < 6; i++) p[i] = exp(logits[i]) / z;
    const int32_t drafts[] = {0, 3, 5, 7};
    for (int32_t d = 0; d < 4; d++) {
        keel_sampler *s = NULL;
        assert_int_equal(keel_sampler_open(&sp, V, &s), KEEL_OK);
        int64_t cnt[V] = {0};
        for (int32_t i = 0; i < N; i++) {
            int32_t t = -1;
            assert_int_equal(keel_sampler_sample_draft(s, logits, drafts[d], &t), KEEL_OK);
            assert_true(t >= 0 && t < V);
            cnt[t]++;
        }
        keel_sampler_close(s);
        double chi = 0;
        for (int32_t i = 0; i < V; i++) {
            if (p[i] == 0) {
                assert_int_equal(cnt[i], 0);
                continue;
            }
            double e = p[i] * N;
            chi += (cnt[i] - e) * (cnt[i] - e) / e;
        }
        /* 5 degrees of freedom: P(chi2 > 25.7) = 0.0001 */
        if (chi > 25.7) fail_msg("draft %d: chi-square %.1f over 5 degrees of freedom", drafts[d], chi);
    }
    /* greedy: the argmax whatever the draft */
    sp.temp = 0.0f;
    keel_sampler *s = NULL;
    assert_int_equal(keel_sampler_open(&sp, V, &s), KEEL_OK);
    int32_t t = -1;
    assert_int_equal(keel_sampler_sample_draft(s, logits, 3, &t), KEEL_OK);
    assert_int_equal(t, 0);
    keel_sampler_close(s);
}

/* End to end on a small vocabulary: the second token after a prompt,
 * sampled at temperature 0.2, once plainly and once verifying a draft
 * (decode_spec of [first, draft], the draft's row by the acceptance rule,
 * the rejected draft rewound), has the same distribution: a two-sample
 * chi-square over the tokens seen. */
static void test_sampled_distribution(void **state)
{
    (void)state;
    char path[128], err[256];
    gen_model("llama", 1, 0, 300, 5, path, sizeof path);
    keel_model_params mp = keel_model_params_default();
    mp.path = path;
    keel_model *m = NULL;
    assert_int_equal(keel_model_open(&mp, &m, err), KEEL_OK);
    keel_context_params cp = keel_context_params_default();
    cp.n_ctx = 64;
    cp.n_threads = 1;
    cp.n_outputs = 2;
    cp.speculative = true;
    cp.deterministic = true;
    keel_context *c = NULL;
    assert_int_equal(keel_context_open(m, &cp, &c, err), KEEL_OK);
    keel_sampler_params sp = keel_sampler_params_default();
    sp.temp = 0.2f; /* a random model's logits are flat: sharpen them */
    sp.top_k = 0;
    sp.top_p = 1.0f;
    sp.min_p = 0.0f;
    enum { RUNS = 6000, V = 300 };
    static int64_t cnt[2][V];
    memset(cnt, 0, sizeof cnt);
    int32_t prompt[4] = {10, 20, 30, 40};
    int64_t accepted = 0;
    for (int32_t mode = 0; mode < 2; mode++)
        for (int32_t r = 0; r < RUNS; r++) {
            keel_mem *mem = keel_context_memory(c);
            assert_int_equal(keel_mem_seq_rm(mem, 0, -1, -1), KEEL_OK);
            keel_batch b = {4, prompt, NULL, NULL, NULL};
            assert_int_equal(keel_decode(c, &b), KEEL_OK);
            sp.seed = (uint64_t)(mode * RUNS + r) * 2654435761u + 1;
            keel_sampler *s = NULL;
            assert_int_equal(keel_sampler_open(&sp, V, &s), KEEL_OK);
            int32_t t1 = -1, t2 = -1;
            assert_int_equal(keel_sampler_sample(s, keel_logits(c, 3), &t1), KEEL_OK);
            if (mode == 0) {
                keel_batch b1 = {1, &t1, NULL, NULL, NULL};
                assert_int_equal(keel_decode(c, &b1), KEEL_OK);
                assert_int_equal(keel_sampler_sample(s, keel_logits(c, 0), &t2), KEEL_OK);
            } else {
                /* the draft: the plain runs' most frequent second token, so
                 * that both branches of the rule run */
                int32_t guess = 0;
                for (int32_t t = 1; t < V; t++)
                    if (cnt[0][t] > cnt[0][guess]) guess = t;
                int32_t tk[2] = {t1, guess};
                int8_t want[2] = {1, 1};
                keel_batch b2 = {2, tk, NULL, NULL, want};
                assert_int_equal(keel_decode_spec(c, &b2), KEEL_OK);
                assert_int_equal(keel_sampler_sample_draft(s, keel_logits(c, 0), guess, &t2), KEEL_OK);
                accepted += t2 == guess;
                if (t2 != guess) {
                    int32_t resume = -1;
                    assert_int_equal(keel_context_rewind(c, 0, 5, &resume), KEEL_OK);
                    assert_int_equal(resume, 5);
                }
            }
            keel_sampler_close(s);
            cnt[mode][t2]++;
        }
    /* two-sample chi-square over tokens seen at least 10 times in all */
    double chi = 0;
    int32_t df = -1;
    for (int32_t t = 0; t < V; t++) {
        int64_t a = cnt[0][t], b = cnt[1][t];
        if (a + b < 10) continue;
        chi += (double)(a - b) * (double)(a - b) / (double)(a + b);
        df++;
    }
    assert_true(df >= 5);
    print_message("sampled second tokens: %lld of %d drafts accepted, chi-square %.1f over %d degrees of freedom\n",
                  (long long)accepted, RUNS, chi, df);
    assert_true(accepted > RUNS / 100 && accepted < RUNS - RUNS / 100);
    /* the 0.9999 quantile of chi-square(df) is below df + 4.5 sqrt(2 df) + 12 for these df */
    double bound = df + 4.5 * sqrt(2.0 * df) + 12;
    if (chi > bound) fail_msg("chi-square %.1f over %d degrees of freedom (bound %.1f)", chi, df, bound);
    keel_context_close(c);
    keel_model_close(m);
}

static keel_model *open_gen(const char *arch, int32_t vocab, uint64_t seed)
{
    char path[128], err[256];
    gen_model(arch, 1, 0, vocab, seed, path, sizeof path);
    keel_model_params mp = keel_model_params_default();
    mp.path = path;
    keel_model *m = NULL;
    assert_int_equal(keel_model_open(&mp, &m, err), KEEL_OK);
    return m;
}

/* A prompt-lookup spec of one sequence on m. */
static keel_spec *open_ngram(const keel_model *m, bool adaptive, int32_t max_draft)
{
    keel_spec_params p = keel_spec_params_default();
    p.kind = KEEL_SPEC_NGRAM;
    p.adaptive = adaptive;
    p.max_draft = max_draft;
    keel_spec *sp = NULL;
    char err[256];
    if (keel_spec_open(&p, m, NULL, NULL, 1, 1024, &sp, err) != KEEL_OK) fail_msg("keel_spec_open: %s", err);
    return sp;
}

/* Prompt lookup proposes the continuation of the latest longest match. */
static void test_ngram_drafter(void **state)
{
    (void)state;
    keel_model *m = open_gen("llama", 0, 7);
    keel_spec *sp = open_ngram(m, false, 4);
    /* 1 2 3 4 5 | 9 2 3 7 8 | 1 2 3: the suffix "1 2 3" matched at the start
     * (longer than "2 3" later) */
    const int32_t h[] = {1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 1, 2, 3};
    int32_t out[8], k = -1;
    assert_int_equal(keel_spec_draft(sp, 0, h, 13, out, 8, &k), KEEL_OK);
    assert_int_equal(k, 4);
    assert_int_equal(out[0], 4);
    assert_int_equal(out[1], 5);
    assert_int_equal(out[2], 9);
    assert_int_equal(out[3], 2);
    /* "2 3" only: the most recent occurrence wins */
    const int32_t h2[] = {2, 3, 4, 0, 2, 3, 6, 0, 5, 2, 3};
    assert_int_equal(keel_spec_draft(sp, 0, h2, 11, out, 2, &k), KEEL_OK);
    assert_int_equal(k, 2);
    assert_int_equal(out[0], 6);
    assert_int_equal(out[1], 0);
    /* no suffix of 2 repeats: nothing */
    const int32_t h3[] = {1, 2, 3, 4, 5, 6};
    assert_int_equal(keel_spec_draft(sp, 0, h3, 6, out, 8, &k), KEEL_OK);
    assert_int_equal(k, 0);
    keel_spec_close(sp);
    /* back-off: drafts that are never accepted stop (probes aside) */
    sp = open_ngram(m, true, 4);
    int32_t drafted_steps = 0, last_draft = -1, gaps[16], n_gaps = 0;
    for (int32_t step = 0; step < 400; step++) {
        assert_int_equal(keel_spec_draft(sp, 0, h, 13, out, 8, &k), KEEL_OK);
        if (k > 0) {
            drafted_steps++;
            /* once alpha reads 0, only probes of one token: the gap between
             * them doubles from 16 up to 128 */
            if (step > 8) {
                assert_int_equal(k, 1);
                if (n_gaps < 16) gaps[n_gaps++] = step - last_draft - 1;
            }
            last_draft = step;
        }
        keel_spec_result(sp, 0, k, 0, 1000000 + (uint64_t)k * 200000);
    }
    assert_true(n_gaps >= 4);
    assert_true(drafted_steps <= 3 + n_gaps);
    for (int32_t i = 0; i < n_gaps; i++) assert_int_equal(gaps[i], i < 3 ? 16 << i : 128);
    keel_spec_stats st;
    keel_spec_stats_get(sp, &st);
    assert_int_equal(st.steps, 400);
    assert_int_equal(st.accepted, 0);
    /* the text turns repetitive: the next probe is accepted, and drafting
     * is back to full length soon after (not 128 steps later) */
    int32_t first = -1, full = -1;
    for (int32_t step = 0; step < 200 && full < 0; step++) {
        assert_int_equal(keel_spec_draft(sp, 0, h, 13, out, 8, &k), KEEL_OK);
        if (k > 0 && first < 0) first = step;
        if (k >= 4) full = step;
        keel_spec_result(sp, 0, k, k, 1000000 + (uint64_t)k * 200000);
    }
    assert_true(first >= 0 && first <= 128);
    assert_true(full >= 0 && full - first <= 24);
    keel_spec_close(sp);
    keel_model_close(m);
}

/* The back-off's start: a fresh sequence first takes a plain step (to time
 * one), then drafts a trial of one token, and only from their outcomes
 * longer drafts; so a text that never repeats pays one token's verify, not
 * a full draft's. keel_spec_reset keeps the step times: only the trial
 * again. */
static void test_backoff_start(void **state)
{
    (void)state;
    keel_model *m = open_gen("llama", 0, 7);
    /* 1..12 then 1 2 3: the lookup offers 4..12 (8 at most) */
    int32_t h[15], out[8], k = -1;
    for (int32_t i = 0; i < 15; i++) h[i] = i % 12 + 1;
    /* every draft right, a verify costing 1 + 0.2 k plain steps */
    keel_spec *sp = open_ngram(m, true, 8);
    const int32_t want[] = {0, 1, 8, 8};
    for (int32_t step = 0; step < 4; step++) {
        assert_int_equal(keel_spec_draft(sp, 0, h, 15, out, 8, &k), KEEL_OK);
        if (k != want[step]) fail_msg("step %d drafted %d, want %d", step, k, want[step]);
        keel_spec_result(sp, 0, k, k, 1000000 + (uint64_t)k * 200000);
    }
    /* a new conversation: the step time is known, the trial comes first */
    keel_spec_reset(sp, 0);
    assert_int_equal(keel_spec_draft(sp, 0, h, 15, out, 8, &k), KEEL_OK);
    assert_int_equal(k, 1);
    keel_spec_close(sp);
    /* no draft ever right: over 64 steps the trial and two probes, one
     * token each (at gaps of 16 and 32 steps) */
    sp = open_ngram(m, true, 8);
    int32_t drafted = 0, at[4], n_at = 0;
    for (int32_t step = 0; step < 64; step++) {
        assert_int_equal(keel_spec_draft(sp, 0, h, 15, out, 8, &k), KEEL_OK);
        assert_true(k <= 1);
        if (k > 0 && n_at < 4) at[n_at++] = step;
        drafted += k;
        keel_spec_result(sp, 0, k, 0, 1000000 + (uint64_t)k * 200000);
    }
    assert_int_equal(drafted, 3);
    assert_int_equal(at[0], 1);
    assert_int_equal(at[1], 18);
    assert_int_equal(at[2], 51);
    keel_spec_close(sp);
    keel_model_close(m);
}

/* A long answer whose drafts are all accepted takes no plain step of its
 * own, while a plain step's time grows with the context and beta is
 * measured against it. The spec times a plain step again when the history
 * has grown by half: drafting stays at 6 to 8 tokens to 20,000 tokens, at
 * the cost of a dozen plain steps (without that, it stalled). */
static void test_backoff_context(void **state)
{
    (void)state;
    keel_model *m = open_gen("llama", 0, 7);
    keel_spec *sp = open_ngram(m, true, 8);
    enum { N = 20000 };
    int32_t *h = malloc((N + 16) * sizeof *h);
    assert_non_null(h);
    for (int32_t i = 0; i < N + 16; i++) h[i] = i % 12 + 1;
    int32_t n = 100, plain = 0, partial = 0, out[8], k = -1;
    while (n < N) {
        assert_int_equal(keel_spec_draft(sp, 0, h, n, out, 8, &k), KEEL_OK);
        plain += k == 0;
        partial += k > 0 && k < 6;
        /* a plain step: 1 ms and 1 us per token of context; a verify of k
         * drafts 1 + 0.2 k of it */
        keel_spec_result(sp, 0, k, k, (uint64_t)((1e6 + 1e3 * n) * (1.0 + 0.2 * k)));
        n += k + 1;
    }
    print_message("to %d tokens: %d plain steps, %d short drafts\n", N, plain, partial);
    assert_true(plain >= 8 && plain <= 16); /* 100, 356, 612, then every half */
    assert_int_equal(partial, 1);           /* the trial (beta, timed up to half a
                                             * context late, can make 6 or 7 the best) */
    free(h);
    keel_spec_close(sp);
    keel_model_close(m);
}

/* The engine's decode-only step cost (eng_cost.c) and each slot's share
 * of a step, on steps timed as f + u n (5 ms, 0.4 ms a token) with +-3%
 * of noise: the line is found within 3% from the token counts that drafts
 * make; a slot's share of a step adds up with the others' to the step,
 * and a slot that did not draft gets the same share whether the other
 * slot drafted 8 tokens or none (timed on the whole step, as the engine
 * did, its plain step read 2x that share, and 3.1x beside 8 drafts). */
static void test_step_cost(void **state)
{
    (void)state;
    const double f = 5e6, u = 4e5;
    eng_cost c = {0};
    assert_true(eng_cost_at(&c, 2) == 0.0); /* nothing timed */
    /* one count only: no slope, flat at the mean */
    for (int i = 0; i < 40; i++) eng_cost_add(&c, 2, (f + 2 * u) * (i % 2 ? 1.03 : 0.97));
    double lf, lu;
    assert_false(eng_cost_line(&c, &lf, &lu));
    assert_true(lu == 0.0);
    assert_true(fabs(eng_cost_at(&c, 9) / (f + 2 * u) - 1.0) < 0.03);
    assert_true(eng_cost_share(&c, 6e6, 2, 9, 7) == 3e6); /* an equal split */
    /* two slots, the first drafting 0..8 tokens */
    static const int32_t k0[] = {0, 8, 3, 0, 5, 1, 8, 0, 2, 6};
    for (int i = 0; i < 200; i++) {
        int32_t n = 2 + k0[i % 10];
        eng_cost_add(&c, n, (f + u * n) * (1.0 + 0.03 * ((i * 7) % 3 - 1)));
    }
    assert_true(eng_cost_line(&c, &lf, &lu));
    for (int32_t n = 1; n <= 12; n++) {
        double want = f + u * n, got = eng_cost_at(&c, n);
        if (fabs(got / want - 1.0) > 0.03) fail_msg("T(%d) = %.0f ns, want %.0f", n, got, want);
    }
    /* a step 10x slow (another process) counts as 2x: the line moves by
     * less than a quarter (unclamped: 1.67x) */
    eng_cost d = c;
    eng_cost_add(&d, 2, 10 * (f + 2 * u));
    double moved = eng_cost_at(&d, 2) / eng_cost_at(&c, 2);
    print_message("a 10x step moves T(2) by %.3fx\n", moved);
    assert_true(moved > 1.01 && moved < 1.25);
    /* shares: one slot takes the whole step; three add up to it */
    assert_true(eng_cost_share(&c, 7e6, 1, 9, 8) == 7e6);
    double t3 = f + u * (3 + 4 + 1), sum = 0;
    static const int32_t k3[] = {0, 4, 1};
    for (int i = 0; i < 3; i++) sum += eng_cost_share(&c, t3, 3, 8, k3[i]);
    assert_true(fabs(sum / t3 - 1.0) < 1e-9);
    /* the plain slot beside another's 0 or 8 drafts */
    double beside0 = eng_cost_share(&c, f + 2 * u, 2, 2, 0), beside8 = eng_cost_share(&c, f + 10 * u, 2, 10, 0);
    double want = f / 2 + u;
    if (fabs(beside0 / want - 1.0) > 0.03 || fabs(beside8 / want - 1.0) > 0.03)
        fail_msg("a plain slot's share %.0f / %.0f ns, want %.0f", beside0, beside8, want);
    /* and the drafting slot pays for its drafts: its verify of 8 costs
     * 1 + 8 u / (f / 2 + u) of its plain share */
    double v8 = eng_cost_share(&c, f + 10 * u, 2, 10, 8);
    assert_true(fabs(v8 / want - (1.0 + 8 * u / want)) < 0.05);
}

/* A draft model must share the vocabulary. */
static void test_draft_vocab_check(void **state)
{
    (void)state;
    keel_model *a = open_gen("llama", 512, 7), *b = open_gen("llama", 600, 7);
    keel_spec_params p = keel_spec_params_default();
    p.kind = KEEL_SPEC_DRAFT;
    keel_spec *sp = NULL;
    char err[256] = "";
    assert_int_equal(keel_spec_open(&p, a, b, NULL, 1, 1024, &sp, err), KEEL_EINVAL);
    assert_null(sp);
    assert_non_null(strstr(err, "vocabulary"));
    keel_model_close(a);
    keel_model_close(b);
}

/* keel_complete with drafts gives the text without, and counts them. */
static void complete_text(const char *opts, char **text, int64_t *drafted, int64_t *accepted)
{
    keel_engine *e = NULL;
    char err[256] = "";
    keel_status st = keel_engine_open(opts, &e, err);
    if (st != KEEL_OK) fail_msg("engine: %s", err);
    const char *msgs = "[{\"role\":\"user\",\"content\":\"abc abc abc abc abc abc abc abc abc abc abc\"}]";
    const char *o = "{\"max_tokens\": 80, \"temperature\": 0}";
    static char resp[1 << 16];
    st = keel_complete(e, msgs, o, NULL, NULL, NULL, resp, sizeof resp);
    if (st != KEEL_OK) fail_msg("complete: %s: %s", keel_strerror(st), resp);
    json_t *j = json_loads(resp, 0, NULL);
    assert_non_null(j);
    *text = strdup(json_string_value(json_object_get(j, "content")));
    json_t *u = json_object_get(j, "usage");
    *drafted = json_integer_value(json_object_get(u, "drafted_tokens"));
    *accepted = json_integer_value(json_object_get(u, "accepted_tokens"));
    json_decref(j);
    keel_engine_close(e);
}

static void engine_case(const char *arch, int32_t layers, int32_t swa)
{
    char path[128], opts[768];
    gen_model(arch, layers, swa, 0, 11, path, sizeof path);
    char *t0 = NULL, *t1 = NULL, *t2 = NULL;
    int64_t d = 0, a = 0;
    const char *common = "\"n_ctx\": 1024, \"n_threads\": 1, \"chat_template\": \"qwen3\", \"deterministic\": true";
    snprintf(opts, sizeof opts, "{\"model\": \"%s\", %s}", path, common);
    complete_text(opts, &t0, &d, &a);
    assert_int_equal(d, 0);
    snprintf(opts, sizeof opts, "{\"model\": \"%s\", %s, \"spec\": \"ngram\", \"spec_adaptive\": false}", path, common);
    complete_text(opts, &t1, &d, &a);
    assert_string_equal(t0, t1);
    assert_true(d > 0);
    assert_true(a <= d);
    /* the model drafting for itself: every draft is accepted */
    snprintf(opts, sizeof opts,
             "{\"model\": \"%s\", %s, \"model_draft\": \"%s\", \"spec_max\": 4, \"spec_adaptive\": false}", path,
             common, path);
    complete_text(opts, &t2, &d, &a);
    assert_string_equal(t0, t2);
    assert_true(d > 0);
    assert_int_equal(a, d);
    free(t0);
    free(t1);
    free(t2);
}

static void test_engine(void **state)
{
    (void)state;
    engine_case("qwen2", 1, 0);
    engine_case("gemma2", 2, 8);
    engine_case("qwen35", 4, 0);
}

/* Events of a submitted request: its response. */
typedef struct sub {
    char resp[1 << 14];
    bool done;
} sub;

static bool on_event(void *user, const keel_event *ev)
{
    sub *s = user;
    if (ev->kind == KEEL_EVENT_DONE) {
        snprintf(s->resp, sizeof s->resp, "%s", ev->response);
        s->done = true;
    }
    return true;
}

/* Four requests at once on four slots: drafts of several slots share the
 * batches (with prefill chunks); each text is the one it has alone. */
static void test_engine_slots(void **state)
{
    (void)state;
    char path[128], opts[768];
    gen_model("qwen2", 1, 0, 0, 11, path, sizeof path);
    const char *prompts[4] = {"abc abc abc abc abc abc", "x y z x y z x y z", "hello hello hello",
                              "one two three one two three one two"};
    char *alone[4];
    int64_t d, a;
    for (int i = 0; i < 4; i++) {
        snprintf(opts, sizeof opts,
                 "{\"model\": \"%s\", \"n_ctx\": 1024, \"n_threads\": 1, \"chat_template\": \"qwen3\", "
                 "\"deterministic\": true}",
                 path);
        keel_engine *e = NULL;
        char err[256], msgs[256];
        assert_int_equal(keel_engine_open(opts, &e, err), KEEL_OK);
        snprintf(msgs, sizeof msgs, "[{\"role\":\"user\",\"content\":\"%s\"}]", prompts[i]);
        static char resp[1 << 14];
        assert_int_equal(keel_complete(e, msgs, "{\"max_tokens\": 48, \"temperature\": 0}", NULL, NULL, NULL, resp,
                                       sizeof resp),
                         KEEL_OK);
        json_t *j = json_loads(resp, 0, NULL);
        alone[i] = strdup(json_string_value(json_object_get(j, "content")));
        json_decref(j);
        keel_engine_close(e);
    }
    snprintf(opts, sizeof opts,
             "{\"model\": \"%s\", \"n_ctx\": 4096, \"n_slots\": 4, \"n_threads\": 1, \"chat_template\": "
             "\"qwen3\", \"deterministic\": true, \"spec\": \"ngram\", \"spec_adaptive\": false, \"spec_max\": 6}",
             path);
    keel_engine *e = NULL;
    char err[256];
    assert_int_equal(keel_engine_open(opts, &e, err), KEEL_OK);
    static sub subs[4];
    for (int i = 0; i < 4; i++) {
        char req[512];
        snprintf(req, sizeof req,
                 "{\"messages\": [{\"role\":\"user\",\"content\":\"%s\"}], \"max_tokens\": 48, "
                 "\"temperature\": 0}",
                 prompts[i]);
        uint64_t id;
        memset(&subs[i], 0, sizeof subs[i]);
        assert_int_equal(keel_engine_submit(e, req, on_event, &subs[i], &id), KEEL_OK);
    }
    while (eng_step(e)) {
    }
    int64_t drafted = 0;
    for (int i = 0; i < 4; i++) {
        assert_true(subs[i].done);
        json_t *j = json_loads(subs[i].resp, 0, NULL);
        assert_non_null(j);
        assert_string_equal(json_string_value(json_object_get(j, "content")), alone[i]);
        d = json_integer_value(json_object_get(json_object_get(j, "usage"), "drafted_tokens"));
        a = json_integer_value(json_object_get(json_object_get(j, "usage"), "accepted_tokens"));
        assert_true(a <= d);
        drafted += d;
        json_decref(j);
        free(alone[i]);
    }
    assert_true(drafted > 0);
    assert_int_equal(keel_mem_check(keel_context_memory(e->ctx)), KEEL_OK);
    keel_engine_close(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_dense),
        cmocka_unit_test(test_greedy_sliding),
        cmocka_unit_test(test_greedy_hybrid),
        cmocka_unit_test(test_greedy_mamba2),
        cmocka_unit_test(test_recurrent_needs_flag),
        cmocka_unit_test(test_sample_draft_distribution),
        cmocka_unit_test(test_sampled_distribution),
        cmocka_unit_test(test_ngram_drafter), cmocka_unit_test(test_backoff_start), cmocka_unit_test(test_backoff_context),
        cmocka_unit_test(test_step_cost),
        cmocka_unit_test(test_draft_vocab_check),
        cmocka_unit_test(test_engine),
        cmocka_unit_test(test_engine_slots),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
