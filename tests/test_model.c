/*
 * test_model.c — the model runtime against llama.cpp's reference outputs in
 * ../shared/fixtures (skipped with a message when absent), through keel.h
 * only: logits of every prompt position, greedy continuations, quantized
 * KV deltas, the llama2.c checkpoint path, and bad input. Validation at
 * load (issue 8 items 8, 9, 18) runs on generated models rewritten with
 * one defect each (through the private GGUF reader and writer), and
 * through the CLI (KEEL_BIN) for what a user sees on stderr.
 *
 * Tolerances (max |logit difference| over all 200 x 512 prompt logits):
 * chosen from the fixture README's own spread of llama.cpp configurations
 * for the same model (flash attention on/off, f16 vs f32 KV); keel keeps
 * f16 K/V but accumulates attention in f32, so it sits inside that spread.
 */
#include "testutil.h"
#include "engine/engine.h"
#include "model/gguf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define N_PROMPT 200
#define N_VOCAB 512
#define N_GREEDY 64

typedef struct fixture_case {
    const char *model;
    double tol;      /* max |dlogit| vs ref logits (f16 KV) */
    int argmax_flips; /* prompt rows whose argmax may differ */
    int greedy_exact; /* greedy tokens that must match (0: all 64) */
} fixture_case;

static const fixture_case g_cases[] = {
    /* README: FA off vs ref 2.3e-2, f32 KV 2.2e-2 (logit std 7.5) */
    {"stories260K", 3e-2, 0, 0},
    {"llama-gqa-f32", 1e-3, 0, 0},
    /* f16 weights: FA off vs ref 2.6e-3 */
    {"llama-gqa-f16", 4e-3, 1, 0},
    /* q8_0 weights, activations quantized per 32: FA off vs ref 5.8e-2 (5 argmax) */
    {"llama-gqa-q8_0", 8e-2, 6, 0},
    {"llama-hd64-f32", 1e-3, 0, 0},
    /* gemma2: FA off vs ref 6.1e-3 */
    {"gemma2", 8e-3, 0, 0},
    /* issue 11. qwen35 / qwen3next: llama.cpp's FA off vs ref 1.9e-4 / 2.3e-4,
     * its own incremental spread 5.5e-4 / 5.2e-4 (logit std 1.0) */
    {"qwen35", 1e-3, 0, 0},
    {"qwen3next", 1e-3, 0, 0},
    /* mamba2 (no attention): llama.cpp's AVX-512 build vs its portable one
     * 4.9e-6, incremental 4.3e-6 (logit std 2.0); keel's sums run in
     * another order: 10x that spread */
    {"mamba2", 1e-4, 0, 0},
    /* gpt-oss: FA off vs ref 1.9e-3, f32 KV 2.0e-3. Greedy: identical for 20
     * tokens; step 20 follows a router near-tie at position 212 (layer 0,
     * experts 2 and 3 are 0.0108 apart in llama.cpp's decode and keel picks
     * the other one; docs/models.md): test_fixture_teacher_forced checks
     * the other 63 steps */
    {"gpt-oss", 4e-3, 0, 20},
    /* issue 12. deepseek32: llama.cpp's FA off vs ref 1.3e-3, its own
     * incremental spread 5.5e-4 (FA off) / 3.6e-3 (logit std 1.0); keel
     * 1.1e-4 once top-k ties fall as std::partial_sort's (docs/models.md) */
    {"deepseek32", 2e-3, 0, 0},
    /* issue 23. gemma3: llama.cpp's FA off vs ref 9.4e-3, f32 KV + FA off
     * 8.8e-3 (its GELU goes through an f16 table; logit std 1.0); keel
     * 4.7e-3. The bound is 1.3x llama.cpp's own FA-off spread, as gemma2's */
    {"gemma3", 1.2e-2, 0, 0},
    /* phi3: llama.cpp's FA off vs ref 1.05e-3, f32 KV 1.08e-3; keel 2.7e-4 */
    {"phi3", 1.5e-3, 0, 0},
    /* qwen3moe: llama.cpp's FA off vs ref 8.4e-4, f32 KV + FA off 8.8e-4
     * (logit std 1.0); the bound is 1.4x that spread, as phi3's */
    {"qwen3moe", 1.2e-3, 0, 0},
    /* glm4moe: FA off vs ref 1.05e-3, f32 KV + FA off 1.10e-3; the MTP
     * block (blk.3) is not run (zeroing it changes nothing in llama.cpp) */
    {"glm4moe", 1.5e-3, 0, 0},
    /* nemotron_h: llama.cpp's FA off vs ref 3.21e-4, f32 KV + FA off
     * 3.27e-4 (one attention layer of five; logit std 1.0); keel 3.2e-5.
     * The bound is 1.5x llama.cpp's own FA-off spread */
    {"nemotronh", 5e-4, 0, 0},
    /* lfm2: llama.cpp's FA off vs ref 2.28e-3, f32 KV + FA off 2.29e-3
     * (logit std 2.0, twice the others': token_embd N(0, 2/sqrt(128))); keel
     * 4.3e-4. The bound is 1.3x llama.cpp's own FA-off spread, as gemma3's */
    {"lfm2", 3e-3, 0, 0},
    /* deepseek2: llama.cpp's FA off vs ref 1.73e-3, f32 KV + FA off 2.22e-3
     * (logit std 1.0); keel 5.7e-5. The bound is 1.3x llama.cpp's
     * own FA-off spread: a larger gap would mean a routing flip (the
     * README's rejected seeds flipped by 0.63 and 1.83) */
    {"deepseek2", 2.3e-3, 0, 0},
};

static float *read_f32(const char *rel, size_t want)
{
    const char *p = test_fixture(rel);
    if (!p) return NULL;
    size_t n = 0;
    float *d = test_read_file(p, &n);
    assert_non_null(d);
    assert_int_equal(n, want * sizeof(float));
    return d;
}

static int32_t *read_i32(const char *rel, size_t want)
{
    const char *p = test_fixture(rel);
    if (!p) return NULL;
    size_t n = 0;
    int32_t *d = test_read_file(p, &n);
    assert_non_null(d);
    assert_int_equal(n, want * sizeof(int32_t));
    return d;
}

static keel_model *open_fixture(const char *name)
{
    char rel[256];
    snprintf(rel, sizeof rel, "models/%s.gguf", name);
    const char *p = test_fixture(rel);
    if (!p) return NULL;
    keel_model_params mp = keel_model_params_default();
    mp.path = p;
    keel_model *m = NULL;
    char err[256] = "";
    keel_status st = keel_model_open(&mp, &m, err);
    if (st != KEEL_OK) fail_msg("open %s: %s: %s", name, keel_strerror(st), err);
    return m;
}

/* Logits of all 200 prompt positions (one batch), then 64 greedy tokens
 * decoded one at a time. */
static void run_prompt(keel_model *m, keel_dtype kv, const int32_t *prompt, float *logits,
                       int32_t *greedy)
{
    keel_context_params cp = keel_context_params_default();
    cp.n_ctx = 512;
    cp.n_batch = N_PROMPT;
    cp.n_ubatch = N_PROMPT;
    cp.n_outputs = N_PROMPT;
    cp.type_k = cp.type_v = kv;
    cp.n_threads = 2;
    keel_context *c = NULL;
    char err[256] = "";
    keel_status st = keel_context_open(m, &cp, &c, err);
    if (st != KEEL_OK) fail_msg("context: %s: %s", keel_strerror(st), err);
    int8_t flags[N_PROMPT];
    memset(flags, 1, sizeof flags);
    keel_batch b = {N_PROMPT, prompt, NULL, NULL, flags};
    assert_ok(keel_decode(c, &b));
    for (int i = 0; i < N_PROMPT; i++) {
        const float *l = keel_logits(c, i);
        assert_non_null(l);
        memcpy(logits + (size_t)i * N_VOCAB, l, N_VOCAB * sizeof(float));
    }
    if (greedy) {
        const float *l = keel_logits(c, N_PROMPT - 1);
        for (int t = 0; t < N_GREEDY; t++) {
            int32_t best = 0;
            for (int32_t v = 1; v < N_VOCAB; v++)
                if (l[v] > l[best]) best = v;
            greedy[t] = best;
            keel_batch g = {1, &greedy[t], NULL, NULL, NULL};
            assert_ok(keel_decode(c, &g));
            l = keel_logits(c, 0);
        }
    }
    keel_context_close(c);
}

static int argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static void diff(const float *a, const float *b, double *max, double *mean, int *flips)
{
    *max = 0;
    *mean = 0;
    *flips = 0;
    for (int i = 0; i < N_PROMPT; i++) {
        for (int j = 0; j < N_VOCAB; j++) {
            double d = fabs((double)a[i * N_VOCAB + j] - (double)b[i * N_VOCAB + j]);
            if (d > *max) *max = d;
            *mean += d;
        }
        if (argmax(a + i * N_VOCAB, N_VOCAB) != argmax(b + i * N_VOCAB, N_VOCAB)) (*flips)++;
    }
    *mean /= (double)N_PROMPT * N_VOCAB;
}

static void test_fixture_logits_and_greedy(void **state)
{
    (void)state;
    for (size_t k = 0; k < sizeof g_cases / sizeof g_cases[0]; k++) {
        const fixture_case *fc = &g_cases[k];
        char rel[256];
        snprintf(rel, sizeof rel, "ref/%s.prompt.i32", fc->model);
        int32_t *prompt = read_i32(rel, N_PROMPT);
        if (!prompt) return;
        snprintf(rel, sizeof rel, "ref/%s.logits.f32", fc->model);
        float *ref = read_f32(rel, (size_t)N_PROMPT * N_VOCAB);
        snprintf(rel, sizeof rel, "ref/%s.greedy.i32", fc->model);
        int32_t *gref = read_i32(rel, N_GREEDY);
        keel_model *m = open_fixture(fc->model);
        float *got = malloc(sizeof(float) * N_PROMPT * N_VOCAB);
        int32_t greedy[N_GREEDY];
        run_prompt(m, KEEL_DTYPE_F16, prompt, got, greedy);
        double mx, mean;
        int flips;
        diff(got, ref, &mx, &mean, &flips);
        printf("%-16s max |dlogit| %.3e mean %.2e argmax flips %d (tol %.0e, %d)\n", fc->model, mx,
               mean, flips, fc->tol, fc->argmax_flips);
        assert_true(mx <= fc->tol);
        assert_true(flips <= fc->argmax_flips);
        int exact = fc->greedy_exact ? fc->greedy_exact : N_GREEDY;
        for (int t = 0; t < exact; t++)
            if (greedy[t] != gref[t])
                fail_msg("%s: greedy token %d is %d, reference %d", fc->model, t, greedy[t], gref[t]);
        free(got);
        free(ref);
        free(gref);
        free(prompt);
        keel_model_close(m);
    }
}

/* Teacher forcing: the prompt followed by the reference's 64 greedy tokens
 * in one batch; the argmax after each must be the reference's next token,
 * except where a case documents a near-tie (gpt-oss step 20). */
static void test_fixture_teacher_forced(void **state)
{
    (void)state;
    const char *models[] = {"qwen35", "qwen3next", "mamba2", "gpt-oss", "deepseek32", "gemma3", "phi3",
                            "qwen3moe", "glm4moe", "nemotronh", "lfm2", "deepseek2"};
    const int skip[] = {-1, -1, -1, 20, -1, -1, -1, -1, -1, -1, -1, -1};
    for (int mi = 0; mi < 12; mi++) {
        char rel[256];
        snprintf(rel, sizeof rel, "ref/%s.prompt.i32", models[mi]);
        int32_t *prompt = read_i32(rel, N_PROMPT);
        if (!prompt) return;
        snprintf(rel, sizeof rel, "ref/%s.greedy.i32", models[mi]);
        int32_t *gref = read_i32(rel, N_GREEDY);
        keel_model *m = open_fixture(models[mi]);
        int32_t all[N_PROMPT + N_GREEDY];
        memcpy(all, prompt, sizeof(int32_t) * N_PROMPT);
        memcpy(all + N_PROMPT, gref, sizeof(int32_t) * N_GREEDY);
        keel_context_params cp = keel_context_params_default();
        cp.n_ctx = 512;
        cp.n_batch = cp.n_ubatch = cp.n_outputs = N_PROMPT + N_GREEDY;
        cp.n_threads = 2;
        keel_context *c = NULL;
        char err[256] = "";
        assert_ok(keel_context_open(m, &cp, &c, err));
        int8_t flags[N_PROMPT + N_GREEDY];
        memset(flags, 1, sizeof flags);
        keel_batch b = {N_PROMPT + N_GREEDY - 1, all, NULL, NULL, flags};
        assert_ok(keel_decode(c, &b));
        int agree = 0;
        for (int t = 0; t < N_GREEDY; t++) {
            int a = argmax(keel_logits(c, N_PROMPT - 1 + t), N_VOCAB);
            if (a == gref[t]) agree++;
            else if (t != skip[mi])
                fail_msg("%s: teacher-forced step %d predicts %d, reference %d", models[mi], t, a, gref[t]);
        }
        printf("%-10s teacher-forced argmax agrees with llama.cpp's greedy at %d of 64 steps\n",
               models[mi], agree);
        assert_true(agree >= (skip[mi] >= 0 ? 63 : 64));
        keel_context_close(c);
        keel_model_close(m);
        free(prompt);
        free(gref);
    }
}

/* Incremental decode equals batch (issue 23): prompt tokens 0..99 in one
 * batch, then 100..199 one per keel_decode, against the 200-token batch.
 * Bound: llama.cpp's own incremental spread with f16 KV and FA off (the
 * fixture README; keel keeps f16 K/V and accumulates in f32, as that
 * path does): gemma3 3.18e-3 (keel 1.3e-3), phi3 1.61e-4 (keel 3.2e-5),
 * qwen3moe 1.41e-4, glm4moe 1.77e-4 (a decode step routes each token
 * alone, the batch routes 100 at once: the experts' products must not
 * depend on how many tokens chose them), nemotronh 3.52e-5 (keel 3.1e-5;
 * its Mamba2 states are carried from the 100-token batch into the
 * one-token steps), lfm2 2.10e-4 (keel 1.1e-4; its conv state is f32,
 * exact, like llama.cpp's), deepseek2 4.80e-4 (keel 2.0e-5, the
 * one-KV-head MLA cache); no row's argmax may change. */
static void test_fixture_incremental(void **state)
{
    (void)state;
    const char *models[] = {"gemma3", "phi3", "qwen3moe", "glm4moe", "nemotronh", "lfm2", "deepseek2"};
    const double tol[] = {3.2e-3, 1.7e-4, 1.5e-4, 1.8e-4, 3.6e-5, 2.2e-4, 4.8e-4};
    for (int mi = 0; mi < 7; mi++) {
        char rel[256];
        snprintf(rel, sizeof rel, "ref/%s.prompt.i32", models[mi]);
        int32_t *prompt = read_i32(rel, N_PROMPT);
        if (!prompt) return;
        keel_model *m = open_fixture(models[mi]);
        float *batch = malloc(sizeof(float) * N_PROMPT * N_VOCAB);
        run_prompt(m, KEEL_DTYPE_F16, prompt, batch, NULL);
        keel_context_params cp = keel_context_params_default();
        cp.n_ctx = 512;
        cp.n_batch = cp.n_ubatch = N_PROMPT;
        cp.n_threads = 2;
        keel_context *c = NULL;
        char err[256] = "";
        assert_ok(keel_context_open(m, &cp, &c, err));
        keel_batch b = {100, prompt, NULL, NULL, NULL};
        assert_ok(keel_decode(c, &b));
        double mx = 0.0;
        for (int i = 100; i < N_PROMPT; i++) {
            keel_batch g = {1, &prompt[i], NULL, NULL, NULL};
            assert_ok(keel_decode(c, &g));
            const float *l = keel_logits(c, 0);
            const float *r = batch + (size_t)i * N_VOCAB;
            for (int j = 0; j < N_VOCAB; j++) mx = fmax(mx, fabs((double)l[j] - (double)r[j]));
            assert_int_equal(argmax(l, N_VOCAB), argmax(r, N_VOCAB));
        }
        printf("%-8s incremental vs batch: max |dlogit| %.3e (tol %.1e)\n", models[mi], mx, tol[mi]);
        assert_true(mx <= tol[mi]);
        keel_context_close(c);
        free(batch);
        free(prompt);
        keel_model_close(m);
    }
}

/* Position edits rotate each layer's keys with that layer's own RoPE
 * (issue 23): gemma3's sliding layers (base 10000, unscaled; window 32, so
 * the rings have wrapped) and its global layer (base 1e6, linear 1/8);
 * phi3's LongRoPE factors, without its attn_factor (a rotation only);
 * deepseek2's MLA cache row, whose first 16 dims (k_pe) rotate. 100
 * prompt tokens at positions 0..99 shifted by +50 (keel_mem_seq_add), then
 * token 100 at position 150, equals the same tokens decoded at 50..150
 * from the start, within the f16 rounding of the re-rotated keys. With
 * the global RoPE on every layer gemma3 differs by 3.2 (measured). */
static void test_fixture_shift_per_layer_rope(void **state)
{
    (void)state;
    /* nemotronh: attention without RoPE and Mamba2 states, which hold no
     * positions: a shift must change no bit */
    const char *models[] = {"gemma3", "phi3", "nemotronh", "deepseek2"};
    for (int mi = 0; mi < 4; mi++) {
        char rel[256];
        snprintf(rel, sizeof rel, "ref/%s.prompt.i32", models[mi]);
        int32_t *prompt = read_i32(rel, N_PROMPT);
        if (!prompt) return;
        keel_model *m = open_fixture(models[mi]);
        keel_context_params cp = keel_context_params_default();
        cp.n_ctx = 512;
        cp.n_batch = cp.n_ubatch = 128;
        cp.n_threads = 2;
        float out[2][N_VOCAB];
        int32_t pos[101];
        for (int k = 0; k < 2; k++) {
            keel_context *c = NULL;
            char err[256] = "";
            assert_ok(keel_context_open(m, &cp, &c, err));
            for (int i = 0; i <= 100; i++) pos[i] = i + (k ? 50 : 0);
            keel_batch b = {100, prompt, pos, NULL, NULL};
            assert_ok(keel_decode(c, &b));
            if (k == 0) assert_ok(keel_mem_seq_add(keel_context_memory(c), 0, 0, -1, 50));
            int32_t p = 150;
            keel_batch g = {1, &prompt[100], &p, NULL, NULL};
            assert_ok(keel_decode(c, &g));
            const float *l = keel_logits(c, 0);
        assert_non_null(l);
        memcpy(out[k], l, sizeof out[k]);
            keel_context_close(c);
        }
        double mx = 0.0;
        for (int j = 0; j < N_VOCAB; j++) mx = fmax(mx, fabs((double)out[0][j] - (double)out[1][j]));
        printf("%-8s shifted by +50 vs decoded there: max |dlogit| %.3e\n", models[mi], mx);
        assert_true(mx <= 1e-2);
        if (mi == 2) assert_true(mx == 0.0);
        assert_int_equal(argmax(out[0], N_VOCAB), argmax(out[1], N_VOCAB));
        free(prompt);
        keel_model_close(m);
    }
}

/* phi3 LongRoPE: rope_factors_long replace the short ones when a
 * sequence's context exceeds rope.scaling.original_context_length (4096),
 * as llama.cpp chooses them (n_ctx per sequence, unless unified): n_ctx
 * 8192 changes the prompt's logits, 8192 split over 2 sequences (not
 * unified: 4096 each) does not. */
static void test_fixture_longrope_choice(void **state)
{
    (void)state;
    int32_t *prompt = read_i32("ref/phi3.prompt.i32", N_PROMPT);
    if (!prompt) return;
    keel_model *m = open_fixture("phi3");
    const int32_t n_ctx[3] = {512, 8192, 8192}, n_seq[3] = {1, 1, 2};
    float out[3][N_VOCAB];
    for (int k = 0; k < 3; k++) {
        keel_context_params cp = keel_context_params_default();
        cp.n_ctx = n_ctx[k];
        cp.n_seq_max = n_seq[k];
        cp.unified = n_seq[k] == 1; /* unified: every sequence may take all n_ctx */
        cp.n_batch = cp.n_ubatch = 64;
        cp.n_threads = 2;
        keel_context *c = NULL;
        char err[256] = "";
        assert_ok(keel_context_open(m, &cp, &c, err));
        keel_batch b = {64, prompt, NULL, NULL, NULL};
        assert_ok(keel_decode(c, &b));
        const float *l = keel_logits(c, 63);
        assert_non_null(l);
        memcpy(out[k], l, sizeof out[k]);
        keel_context_close(c);
    }
    double long_d = 0.0, split_d = 0.0;
    for (int j = 0; j < N_VOCAB; j++) {
        long_d = fmax(long_d, fabs((double)out[1][j] - (double)out[0][j]));
        split_d = fmax(split_d, fabs((double)out[2][j] - (double)out[0][j]));
    }
    printf("phi3 n_ctx 8192 vs 512: max |dlogit| %.3e; 8192 over 2 sequences: %.3e\n", long_d, split_d);
    assert_true(long_d > 1e-2);
    assert_true(split_d <= 1e-4);
    free(prompt);
    keel_model_close(m);
}

/* KV q8_0 / q4_0: keel's distance from the f16-KV reference stays within
 * llama.cpp's own distance for that KV type (max within 1.25x, mean within
 * 1.1x: both sides quantize differently, so only the size is comparable). */
static void test_fixture_quantized_kv(void **state)
{
    (void)state;
    const char *models[] = {"llama-gqa-f32", "llama-hd64-f32"};
    const keel_dtype kvs[] = {KEEL_DTYPE_Q8_0, KEEL_DTYPE_Q4_0};
    for (int mi = 0; mi < 2; mi++) {
        char rel[256];
        snprintf(rel, sizeof rel, "ref/%s.prompt.i32", models[mi]);
        int32_t *prompt = read_i32(rel, N_PROMPT);
        if (!prompt) return;
        snprintf(rel, sizeof rel, "ref/%s.logits.f32", models[mi]);
        float *ref = read_f32(rel, (size_t)N_PROMPT * N_VOCAB);
        keel_model *m = open_fixture(models[mi]);
        float *got = malloc(sizeof(float) * N_PROMPT * N_VOCAB);
        for (int k = 0; k < 2; k++) {
            snprintf(rel, sizeof rel, "ref/%s.logits-%s.f32", models[mi], keel_dtype_name(kvs[k]));
            float *refq = read_f32(rel, (size_t)N_PROMPT * N_VOCAB);
            run_prompt(m, kvs[k], prompt, got, NULL);
            double kmax, kmean, rmax, rmean;
            int kf, rf;
            diff(got, ref, &kmax, &kmean, &kf);
            diff(refq, ref, &rmax, &rmean, &rf);
            printf("%-16s KV %-4s: keel vs f16 ref max %.3e mean %.2e flips %d | llama.cpp %s vs f16 "
                   "max %.3e mean %.2e flips %d\n",
                   models[mi], keel_dtype_name(kvs[k]), kmax, kmean, kf, keel_dtype_name(kvs[k]), rmax,
                   rmean, rf);
            assert_true(kmax <= 1.25 * rmax);
            assert_true(kmean <= 1.1 * rmean);
            free(refq);
        }
        free(got);
        free(ref);
        free(prompt);
        keel_model_close(m);
    }
}

/* The llama2.c checkpoint + tokenizer.bin load to the same model. */
static void test_llama2c_matches_gguf(void **state)
{
    (void)state;
    const char *bin = test_fixture("models/stories260K.bin");
    if (!bin) return;
    char binp[4096], tokp[4096];
    snprintf(binp, sizeof binp, "%s", bin);
    const char *tok = test_fixture("models/tok512.bin");
    snprintf(tokp, sizeof tokp, "%s", tok);
    int32_t *prompt = read_i32("ref/stories260K.prompt.i32", N_PROMPT);
    int32_t *gref = read_i32("ref/stories260K.greedy.i32", N_GREEDY);
    keel_model_params mp = keel_model_params_default();
    mp.path = binp;
    mp.tokenizer_path = tokp;
    keel_model *m = NULL;
    char err[256] = "";
    keel_status st = keel_model_open(&mp, &m, err);
    if (st != KEEL_OK) fail_msg("open llama2.c: %s", err);
    float *got = malloc(sizeof(float) * N_PROMPT * N_VOCAB);
    int32_t greedy[N_GREEDY];
    run_prompt(m, KEEL_DTYPE_F16, prompt, got, greedy);
    assert_memory_equal(greedy, gref, sizeof greedy);
    /* tokenizer from tokenizer.bin: same ids for the fixture text */
    int32_t ids[8];
    int32_t n = 0;
    assert_ok(keel_tokenize(m, "Once upon a time", 16, true, false, ids, 8, &n));
    assert_int_equal(n, 5);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 403);
    assert_int_equal(ids[2], 407);
    /* without a tokenizer the checkpoint is refused with a clear message */
    keel_model *m2 = (keel_model *)1;
    mp.tokenizer_path = NULL;
    assert_status(keel_model_open(&mp, &m2, err), KEEL_EFORMAT);
    assert_null(m2);
    assert_non_null(strstr(err, "tokenizer"));
    free(got);
    free(prompt);
    free(gref);
    keel_model_close(m);
}

static void test_bad_input(void **state)
{
    (void)state;
    keel_model *m = open_fixture("llama-gqa-f32");
    if (!m) return;
    keel_context_params cp = keel_context_params_default();
    cp.n_ctx = 16;
    cp.n_batch = 32;
    keel_context *c = NULL;
    char err[256] = "";
    assert_ok(keel_context_open(m, &cp, &c, err));
    int32_t bad[2] = {5, 512};
    keel_batch b = {2, bad, NULL, NULL, NULL};
    assert_status(keel_decode(c, &b), KEEL_EINVAL);
    assert_non_null(strstr(keel_context_last_error(c), "out of range"));
    bad[1] = -3;
    assert_status(keel_decode(c, &b), KEEL_EINVAL);
    keel_batch empty = {0, bad, NULL, NULL, NULL};
    assert_status(keel_decode(c, &empty), KEEL_EINVAL);
    /* a prompt longer than the context: refused as full, memory unchanged */
    int32_t toks[20];
    for (int i = 0; i < 20; i++) toks[i] = 10 + i;
    keel_batch big = {20, toks, NULL, NULL, NULL};
    assert_status(keel_decode(c, &big), KEEL_EFULL);
    assert_non_null(strstr(keel_context_last_error(c), "context full"));
    assert_int_equal(keel_mem_seq_pos_max(keel_context_memory(c), 0), -1);
    keel_batch ok = {10, toks, NULL, NULL, NULL};
    assert_ok(keel_decode(c, &ok));
    assert_ok(keel_mem_check(keel_context_memory(c)));
    keel_context_close(c);
    /* bad context parameters */
    cp.n_seq_max = 0;
    keel_context *c2 = (keel_context *)1;
    assert_status(keel_context_open(m, &cp, &c2, err), KEEL_EINVAL);
    assert_null(c2);
    cp = keel_context_params_default();
    cp.type_k = KEEL_DTYPE_Q4_K;
    assert_status(keel_context_open(m, &cp, &c2, err), KEEL_EUNSUPPORTED);
    keel_model_close(m);
    /* a missing file and a non-model file */
    keel_model_params mp = keel_model_params_default();
    mp.path = "/nonexistent/model.gguf";
    keel_model *m2 = NULL;
    assert_status(keel_model_open(&mp, &m2, err), KEEL_EIO);
}

/* ---- validation at load (generated models, no fixtures needed) ---------- */

static char g_dir[64]; /* temp folder of the generated files */

static const char *tmp_path(const char *name)
{
    static char buf[16][192];
    static int k;
    k = (k + 1) % 16;
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_dir, name);
    return buf[k];
}

static int setup_dir(void **state)
{
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/keel_model_XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown_dir(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void gen(const char *arch, int32_t n_layer, const char *path)
{
    keel_gen_params p = keel_gen_params_default();
    p.arch = arch;
    p.n_layer = n_layer;
    p.n_embd = 64;
    p.n_vocab = 320;
    char err[256] = "";
    keel_status st = keel_gen_model(&p, path, err);
    if (st != KEEL_OK) fail_msg("gen %s: %s", arch, err);
}

/* One defect for rewrite(): a key set to a raw value (type + payload as in
 * a file; added when absent), an f32 element of a tensor overwritten, a
 * tensor added as a copy of another. */
typedef struct edit {
    const char *key;
    gguf_type type;
    const void *payload;
    size_t nbytes;
    const char *tensor; /* f32 tensor to patch */
    int64_t elem;
    float value;
    const char *copy_of; /* add tensor `tensor` as a copy of this one */
} edit;

/* src with edit e applied, written to dst: keys, tensors and alignment as
 * they were otherwise. */
static void rewrite(const char *src, const char *dst, const edit *e)
{
    gguf *g = NULL;
    char err[BASE_ERR_CAP] = "";
    keel_status st = gguf_open_file(src, &g, err);
    if (st) fail_msg("open %s: %s", src, err);
    gguf_writer *w;
    assert_ok(gguf_writer_open(&w));
    if (gguf_alignment(g) != GGUF_DEFAULT_ALIGNMENT)
        assert_ok(gguf_writer_set_alignment(w, (uint32_t)gguf_alignment(g)));
    bool key_done = false;
    for (int64_t i = 0; i < gguf_n_kv(g); i++) {
        const char *k = gguf_key_at(g, i);
        const gguf_value *v = gguf_value_at(g, i);
        if (strcmp(k, "general.alignment") == 0) continue;
        if (e->key && strcmp(k, e->key) == 0) {
            assert_ok(gguf_writer_add_raw(w, k, e->type, e->payload, e->nbytes));
            key_done = true;
            continue;
        }
        /* the raw payload: strings and arrays start at their length / type */
        size_t head = v->type == GGUF_TYPE_STRING ? 8 : v->type == GGUF_TYPE_ARRAY ? 12 : 0;
        assert_ok(gguf_writer_add_raw(w, k, v->type, v->data - head, v->nbytes + head));
    }
    if (e->key && !key_done) assert_ok(gguf_writer_add_raw(w, e->key, e->type, e->payload, e->nbytes));
    float *patched = NULL;
    size_t patched_bytes = 0;
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        const void *data = t->data;
        if (e->tensor && !e->copy_of && strcmp(t->name, e->tensor) == 0) {
            assert_int_equal(t->dtype, KEEL_DTYPE_F32);
            patched = malloc(t->nbytes);
            patched_bytes = t->nbytes;
            memcpy(patched, t->data, t->nbytes);
            patched[e->elem] = e->value;
            data = patched;
        }
        assert_ok(gguf_writer_add_tensor(w, t->name, t->dtype, t->n_dims, t->ne, data, t->nbytes));
    }
    if (e->copy_of) {
        const gguf_tensor *t = gguf_find_tensor(g, e->copy_of);
        assert_non_null(t);
        assert_ok(gguf_writer_add_tensor(w, e->tensor, t->dtype, t->n_dims, t->ne, t->data,
                                         t->nbytes));
    }
    st = gguf_writer_write_path(w, dst);
    if (st) fail_msg("write %s: %s", dst, gguf_writer_last_error(w));
    (void)patched_bytes;
    free(patched);
    gguf_writer_close(w);
    gguf_close(g);
}

/* Log messages captured while a test runs. */
typedef struct log_cap {
    int n_warn;
    char last[1024];
} log_cap;

static void capture_log(void *user, keel_log_level level, const char *message)
{
    log_cap *c = user;
    if (level == KEEL_LOG_WARN) c->n_warn++;
    snprintf(c->last, sizeof c->last, "%s", message);
}

/* Opens path; returns the status, err filled; closes a model that opened. */
static keel_status try_open(const char *path, const char *tok, char *err)
{
    keel_model_params mp = keel_model_params_default();
    mp.path = path;
    mp.tokenizer_path = tok;
    keel_model *m = (keel_model *)1;
    err[0] = '\0';
    keel_status st = keel_model_open(&mp, &m, err);
    if (st != KEEL_OK) assert_null(m);
    keel_model_close(m);
    return st;
}

static void expect_refused(const char *path, keel_status want, const char *msg)
{
    char err[256];
    keel_status st = try_open(path, NULL, err);
    if (st != want || !strstr(err, msg))
        fail_msg("%s: %s '%s', want %s '%s'", path, keel_status_name(st), err,
                 keel_status_name(want), msg);
}

/* Issue 23: gemma3's and phi3's own keys and tensors are checked at load,
 * each failure naming the key or tensor (the fixtures rewritten with one
 * defect each). */
static void test_new_arch_validation(void **state)
{
    (void)state;
    const char *g3 = test_fixture("models/gemma3.gguf");
    if (!g3) return;
    char gemma3[512], phi3[512];
    snprintf(gemma3, sizeof gemma3, "%s", g3);
    const char *p3 = test_fixture("models/phi3.gguf");
    if (!p3) return;
    snprintf(phi3, sizeof phi3, "%s", p3);
    const char *bad = tmp_path("bad.gguf");
    static const float nbase = -1.0f, zero = 0.0f;
    static const uint32_t zero_u = 0;
    const struct {
        const char *base;
        edit e;
        keel_status st;
        const char *msg;
    } cases[] = {
        {gemma3, {.key = "gemma3.rope.freq_base_swa", .type = GGUF_TYPE_FLOAT32, .payload = &nbase, .nbytes = 4},
         KEEL_EFORMAT, "key gemma3.rope.freq_base_swa = -1: outside (0, 1e+30]"},
        {gemma3, {.key = "gemma3.attention.sliding_window_pattern", .type = GGUF_TYPE_UINT32, .payload = &zero_u, .nbytes = 4},
         KEEL_EFORMAT, "key gemma3.attention.sliding_window_pattern = 0 out of range [1, 4096]"},
        {gemma3, {.tensor = "blk.2.attn_q_norm.weight", .elem = 5, .value = NAN},
         KEEL_EFORMAT, "tensor blk.2.attn_q_norm.weight: element 5 is NaN"},
        {gemma3, {.tensor = "output.weight", .copy_of = "blk.0.attn_q.weight"},
         KEEL_EFORMAT, "tensor output.weight: shape [128, 256, 1] (2 dims), expected [128, 512]"},
        {phi3, {.key = "phi3.rope.scaling.attn_factor", .type = GGUF_TYPE_FLOAT32, .payload = &zero, .nbytes = 4},
         KEEL_EFORMAT, "key phi3.rope.scaling.attn_factor = 0: outside (0, 1e+06]"},
        {phi3, {.key = "phi3.rope.scaling.original_context_length", .type = GGUF_TYPE_UINT32, .payload = &zero_u, .nbytes = 4},
         KEEL_EFORMAT, "key phi3.rope.scaling.original_context_length = 0 out of range"},
        {phi3, {.tensor = "rope_factors_short.weight", .elem = 3, .value = 0.0f},
         KEEL_EFORMAT, "tensor rope_factors_short.weight: element 3 is 0, must be > 0"},
        {phi3, {.tensor = "rope_factors_long.weight", .elem = 11, .value = INFINITY},
         KEEL_EFORMAT, "tensor rope_factors_long.weight: element 11 is +Inf"},
        {phi3, {.tensor = "rope_freqs.weight", .copy_of = "blk.0.attn_norm.weight"},
         KEEL_EFORMAT, "tensor rope_freqs.weight: 128 elements (ne0 128), expected 12"},
    };
    for (size_t i = 0; i < BASE_ARRAY_LEN(cases); i++) {
        rewrite(cases[i].base, bad, &cases[i].e);
        expect_refused(bad, cases[i].st, cases[i].msg);
    }
}

/* A GGUF array payload (element type, count, elements) of n int32. */
static size_t arr_i32(uint8_t *buf, const int32_t *v, uint64_t n)
{
    uint32_t t = GGUF_TYPE_INT32;
    memcpy(buf, &t, 4);
    memcpy(buf + 4, &n, 8);
    memcpy(buf + 12, v, (size_t)n * 4);
    return 12 + (size_t)n * 4;
}

/* Issue 23: nemotron_h's layer kinds come from the per-layer arrays
 * feed_forward_length and attention.head_count_kv; each element and each
 * array is checked at load, and the kinds decide which tensors must be
 * there (the fixture rewritten with one defect each). */
static void test_nemotron_h_validation(void **state)
{
    (void)state;
    const char *src = test_fixture("models/nemotronh.gguf");
    if (!src) return;
    char nh[512];
    snprintf(nh, sizeof nh, "%s", src);
    const char *bad = tmp_path("bad.gguf");
    static uint8_t short_kv[64], neg_ff[64], kv3[64], two_attn[64], mlp_as_attn[64], fl_kv[64];
    static const int32_t v_short[] = {0, 0, 0, 2}, v_neg[] = {0, 256, 0, 0, -1}, v_kv3[] = {0, 0, 0, 3, 0};
    static const int32_t v_two[] = {0, 0, 1, 2, 0}, v_mlp[] = {0, 0, 0, 0, 256};
    size_t n_short = arr_i32(short_kv, v_short, 4), n_neg = arr_i32(neg_ff, v_neg, 5);
    size_t n_kv3 = arr_i32(kv3, v_kv3, 5), n_two = arr_i32(two_attn, v_two, 5);
    size_t n_mlp = arr_i32(mlp_as_attn, v_mlp, 5);
    size_t n_fl = arr_i32(fl_kv, v_kv3, 5);
    uint32_t ft = GGUF_TYPE_FLOAT32;
    memcpy(fl_kv, &ft, 4); /* the same bytes read as f32 elements */
    static const float zero = 0.0f;
    static const uint32_t one = 1;
    const struct {
        edit e;
        keel_status st;
        const char *msg;
    } cases[] = {
        {{.key = "nemotron_h.attention.head_count_kv", .type = GGUF_TYPE_ARRAY, .payload = short_kv, .nbytes = n_short},
         KEEL_EFORMAT,
         "key nemotron_h.attention.head_count_kv: array of 4 elements, expected one per layer "
         "(nemotron_h.block_count 5)"},
        {{.key = "nemotron_h.feed_forward_length", .type = GGUF_TYPE_ARRAY, .payload = neg_ff, .nbytes = n_neg},
         KEEL_EFORMAT, "key nemotron_h.feed_forward_length[4] = -1 out of range [0, 1048576]"},
        {{.key = "nemotron_h.attention.head_count_kv", .type = GGUF_TYPE_ARRAY, .payload = fl_kv, .nbytes = n_fl},
         KEEL_EFORMAT, "key nemotron_h.attention.head_count_kv: array of f32, expected integers"},
        {{.key = "nemotron_h.attention.head_count_kv", .type = GGUF_TYPE_ARRAY, .payload = kv3, .nbytes = n_kv3},
         KEEL_EFORMAT, "nemotron_h: attention layer 3 has head_count 4, not a positive multiple of head_count_kv 3"},
        {{.key = "nemotron_h.attention.head_count_kv", .type = GGUF_TYPE_ARRAY, .payload = two_attn, .nbytes = n_two},
         KEEL_EUNSUPPORTED, "nemotron_h: attention layers 2 (4 heads, 1 kv heads) and 3 (4, 2) differ"},
        /* layer 1 (no FFN, no kv heads) becomes a Mamba2 layer: its tensors are missing */
        {{.key = "nemotron_h.feed_forward_length", .type = GGUF_TYPE_ARRAY, .payload = mlp_as_attn, .nbytes = n_mlp},
         KEEL_ENOENT, "missing tensor blk.1.ssm_in.weight"},
        {{.key = "nemotron_h.attention.layer_norm_epsilon", .type = GGUF_TYPE_FLOAT32, .payload = &zero, .nbytes = 4},
         KEEL_EFORMAT, "key nemotron_h.attention.layer_norm_epsilon = 0: outside (0, 1]"},
        {{.key = "nemotron_h.expert_count", .type = GGUF_TYPE_UINT32, .payload = &one, .nbytes = 4},
         KEEL_EUNSUPPORTED, "nemotron_h: nextn_predict_layers 0, expert_count 1: MTP blocks and experts"},
        {{.key = "nemotron_h.ssm.group_count", .type = GGUF_TYPE_UINT32, .payload = &(uint32_t){3}, .nbytes = 4},
         KEEL_EFORMAT, "nemotron_h.ssm: inner_size 256, time_step_rank 8 and group_count 3"},
        {{.tensor = "blk.2.ssm_norm.weight", .elem = 200, .value = NAN},
         KEEL_EFORMAT, "tensor blk.2.ssm_norm.weight: element 200 is NaN"},
        {{.tensor = "blk.4.ffn_up.bias", .copy_of = "blk.4.attn_norm.weight"},
         KEEL_EFORMAT, "tensor blk.4.ffn_up.bias: 128 elements (ne0 128), expected 256"},
    };
    for (size_t i = 0; i < BASE_ARRAY_LEN(cases); i++) {
        rewrite(nh, bad, &cases[i].e);
        expect_refused(bad, cases[i].st, cases[i].msg);
    }
    /* a scalar applies to every layer: head_count_kv 0 turns the attention
     * layer 3 into a Mamba2 one */
    static const uint32_t zero_u = 0;
    edit e = {.key = "nemotron_h.attention.head_count_kv", .type = GGUF_TYPE_UINT32, .payload = &zero_u, .nbytes = 4};
    rewrite(nh, bad, &e);
    expect_refused(bad, KEEL_ENOENT, "missing tensor blk.3.ssm_in.weight");
}

/* Issue 23: qwen3moe's and glm4moe's keys and tensors are checked at load,
 * each failure naming the key or tensor; glm4moe's NextN (MTP) block is
 * bound (shapes checked) without a warning, and with nextn_predict_layers
 * 0 it is a run layer whose nextn.* tensors the warning names, without a
 * block_count complaint (the layer is within block_count). */
static void test_moe_arch_validation(void **state)
{
    (void)state;
    const char *q = test_fixture("models/qwen3moe.gguf");
    if (!q) return;
    char qwen3moe[512], glm4moe[512];
    snprintf(qwen3moe, sizeof qwen3moe, "%s", q);
    const char *g = test_fixture("models/glm4moe.gguf");
    if (!g) return;
    snprintf(glm4moe, sizeof glm4moe, "%s", g);
    const char *bad = tmp_path("bad.gguf");
    static const float neg = -1.0f;
    static const uint32_t nine = 9, four = 4, three = 3;
    const struct {
        const char *base;
        edit e;
        keel_status st;
        const char *msg;
    } cases[] = {
        {qwen3moe, {.key = "qwen3moe.expert_used_count", .type = GGUF_TYPE_UINT32, .payload = &nine, .nbytes = 4},
         KEEL_EFORMAT, "key qwen3moe.expert_used_count = 9 out of range [1, 8]"},
        {qwen3moe, {.tensor = "blk.1.attn_k_norm.weight", .elem = 7, .value = NAN},
         KEEL_EFORMAT, "tensor blk.1.attn_k_norm.weight: element 7 is NaN"},
        {qwen3moe, {.tensor = "blk.0.attn_qkv.weight", .copy_of = "blk.0.attn_q.weight"},
         KEEL_EFORMAT, "tensor blk.0.attn_qkv.weight: shape [128, 256, 1] (2 dims), expected [128, 512]"},
        {glm4moe, {.key = "glm4moe.nextn_predict_layers", .type = GGUF_TYPE_UINT32, .payload = &four, .nbytes = 4},
         KEEL_EFORMAT, "key glm4moe.nextn_predict_layers = 4 out of range [0, 3]"},
        {glm4moe, {.key = "glm4moe.leading_dense_block_count", .type = GGUF_TYPE_UINT32, .payload = &four, .nbytes = 4},
         KEEL_EFORMAT, "key glm4moe.leading_dense_block_count = 4 out of range [0, 3]"},
        {glm4moe, {.key = "glm4moe.expert_gating_func", .type = GGUF_TYPE_UINT32, .payload = &three, .nbytes = 4},
         KEEL_EFORMAT, "key glm4moe.expert_gating_func = 3 out of range [0, 2]"},
        {glm4moe, {.key = "glm4moe.expert_weights_scale", .type = GGUF_TYPE_FLOAT32, .payload = &neg, .nbytes = 4},
         KEEL_EFORMAT, "key glm4moe.expert_weights_scale = -1: outside [0, 1e+06]"},
        {glm4moe, {.tensor = "blk.2.exp_probs_b.bias", .elem = 2, .value = INFINITY},
         KEEL_EFORMAT, "tensor blk.2.exp_probs_b.bias: element 2 is +Inf"},
        /* the MTP block's tensors are checked although never run */
        {glm4moe, {.tensor = "blk.3.nextn.embed_tokens.weight", .copy_of = "blk.3.attn_q.weight"},
         KEEL_EFORMAT, "tensor blk.3.nextn.embed_tokens.weight: shape [128, 256, 1] (2 dims), expected [128, 512]"},
        {glm4moe, {.tensor = "blk.3.nextn.enorm.weight", .elem = 0, .value = NAN},
         KEEL_EFORMAT, "tensor blk.3.nextn.enorm.weight: element 0 is NaN"},
    };
    for (size_t i = 0; i < BASE_ARRAY_LEN(cases); i++) {
        rewrite(cases[i].base, bad, &cases[i].e);
        expect_refused(bad, cases[i].st, cases[i].msg);
    }
    static const uint32_t zero_u = 0;
    edit e = {.key = "glm4moe.nextn_predict_layers", .type = GGUF_TYPE_UINT32, .payload = &zero_u, .nbytes = 4};
    rewrite(glm4moe, bad, &e);
    const char *paths[2] = {glm4moe, bad};
    const int n_warn[2] = {0, 1}, n_layer[2] = {3, 4};
    for (int k = 0; k < 2; k++) {
        log_cap cap;
        memset(&cap, 0, sizeof cap);
        char err[256];
        keel_set_log(capture_log, &cap, KEEL_LOG_DEBUG);
        keel_model_params mp = keel_model_params_default();
        mp.path = paths[k];
        keel_model *m = NULL;
        keel_status st = keel_model_open(&mp, &m, err);
        keel_set_log(NULL, NULL, KEEL_LOG_INFO);
        if (st != KEEL_OK) fail_msg("%s: %s", paths[k], err);
        assert_int_equal(cap.n_warn, n_warn[k]);
        keel_model_info mi;
        keel_model_info_get(m, &mi);
        assert_int_equal(mi.n_layer, n_layer[k]);
        keel_model_close(m);
        if (k == 1) {
            const char *want = "4 of 78 tensors are not used by the glm4moe model and are ignored: "
                               "blk.3.nextn.eh_proj.weight";
            if (!strstr(cap.last, want)) fail_msg("warning '%s' lacks '%s'", cap.last, want);
            assert_null(strstr(cap.last, "block_count"));
        }
    }
    /* expert_gating_func 1: softmax over the experts, still chosen with the
     * exp_probs_b bias (llama.cpp adds it for any gating); the routing, and
     * so the logits, change */
    static const uint32_t one = 1;
    edit sm = {.key = "glm4moe.expert_gating_func", .type = GGUF_TYPE_UINT32, .payload = &one, .nbytes = 4};
    rewrite(glm4moe, bad, &sm);
    int32_t *prompt = read_i32("ref/glm4moe.prompt.i32", N_PROMPT);
    assert_non_null(prompt);
    float out[2][N_VOCAB];
    for (int k = 0; k < 2; k++) {
        keel_model_params mp = keel_model_params_default();
        mp.path = paths[k];
        keel_model *m = NULL;
        char err[256];
        assert_ok(keel_model_open(&mp, &m, err));
        keel_context_params cp = keel_context_params_default();
        cp.n_ctx = 64;
        keel_context *c = NULL;
        assert_ok(keel_context_open(m, &cp, &c, err));
        keel_batch b = {32, prompt, NULL, NULL, NULL};
        assert_ok(keel_decode(c, &b));
        const float *l = keel_logits(c, 31);
        assert_non_null(l);
        memcpy(out[k], l, sizeof out[k]);
        keel_context_close(c);
        keel_model_close(m);
    }
    double d = 0.0;
    for (int j = 0; j < N_VOCAB; j++) {
        assert_true(isfinite(out[1][j]));
        d = fmax(d, fabs((double)out[0][j] - (double)out[1][j]));
    }
    printf("glm4moe softmax gating vs sigmoid: max |dlogit| %.3e\n", d);
    assert_true(d > 1e-3);
    free(prompt);
}

/* An array-valued key's raw GGUF payload (element type, count, elements)
 * in buf; returns its size. */
static size_t arr_payload(uint8_t *buf, gguf_type elem, const void *vals, uint64_t n, size_t elem_bytes)
{
    uint32_t t = (uint32_t)elem;
    memcpy(buf, &t, 4);
    memcpy(buf + 4, &n, 8);
    memcpy(buf + 12, vals, (size_t)n * elem_bytes);
    return 12 + (size_t)n * elem_bytes;
}

/* Issue 23: lfm2's keys and tensors, the per-layer head_count_kv array
 * above all, are checked at load, each failure naming the key, element or
 * tensor (the fixture rewritten with one defect each). */
static void test_lfm2_validation(void **state)
{
    (void)state;
    const char *p = test_fixture("models/lfm2.gguf");
    if (!p) return;
    char lfm2[512];
    snprintf(lfm2, sizeof lfm2, "%s", p);
    const char *bad = tmp_path("bad.gguf");
    static const uint32_t short3[3] = {0, 2, 0}, big[4] = {0, 2, 0, 5}, mixed[4] = {0, 2, 0, 1};
    static const uint32_t attn0[4] = {2, 2, 0, 2}, conv1[4] = {0, 0, 0, 2};
    static const float fl[4] = {0, 2, 0, 2};
    static const uint32_t one = 1;
    static uint8_t pl[7][64];
    size_t n[7] = {
        arr_payload(pl[0], GGUF_TYPE_UINT32, short3, 3, 4), arr_payload(pl[1], GGUF_TYPE_UINT32, big, 4, 4),
        arr_payload(pl[2], GGUF_TYPE_FLOAT32, fl, 4, 4),    arr_payload(pl[3], GGUF_TYPE_UINT32, mixed, 4, 4),
        arr_payload(pl[4], GGUF_TYPE_UINT32, attn0, 4, 4),  arr_payload(pl[5], GGUF_TYPE_UINT32, conv1, 4, 4),
        0,
    };
    const char *kv = "lfm2.attention.head_count_kv";
    const struct {
        edit e;
        keel_status st;
        const char *msg;
    } cases[] = {
        {{.key = kv, .type = GGUF_TYPE_ARRAY, .payload = pl[0], .nbytes = n[0]},
         KEEL_EFORMAT, "key lfm2.attention.head_count_kv: array of 3 elements, expected one per layer (lfm2.block_count 4)"},
        {{.key = kv, .type = GGUF_TYPE_ARRAY, .payload = pl[1], .nbytes = n[1]},
         KEEL_EFORMAT, "key lfm2.attention.head_count_kv[3] = 5 out of range [0, 4]"},
        {{.key = kv, .type = GGUF_TYPE_ARRAY, .payload = pl[2], .nbytes = n[2]},
         KEEL_EFORMAT, "key lfm2.attention.head_count_kv: array of f32, expected integers"},
        {{.key = kv, .type = GGUF_TYPE_ARRAY, .payload = pl[3], .nbytes = n[3]},
         KEEL_EUNSUPPORTED, "lfm2.attention.head_count_kv: layer 1 has 2 KV heads, layer 3 has 1"},
        /* the array decides each layer's kind, hence its tensors */
        {{.key = kv, .type = GGUF_TYPE_ARRAY, .payload = pl[4], .nbytes = n[4]},
         KEEL_ENOENT, "missing tensor blk.0.attn_q.weight"},
        {{.key = kv, .type = GGUF_TYPE_ARRAY, .payload = pl[5], .nbytes = n[5]},
         KEEL_ENOENT, "missing tensor blk.1.shortconv.in_proj.weight"},
        {{.key = "lfm2.shortconv.l_cache", .type = GGUF_TYPE_UINT32, .payload = &one, .nbytes = 4},
         KEEL_EFORMAT, "key lfm2.shortconv.l_cache = 1 out of range [2, 64]"},
        {{.tensor = "token_embd_norm.weight", .elem = 5, .value = NAN},
         KEEL_EFORMAT, "tensor token_embd_norm.weight: element 5 is NaN"},
        {{.tensor = "blk.2.shortconv.conv.weight", .elem = 7, .value = INFINITY},
         KEEL_EFORMAT, "tensor blk.2.shortconv.conv.weight: element 7 is +Inf"},
        {{.tensor = "output.weight", .copy_of = "blk.0.shortconv.in_proj.weight"},
         KEEL_EFORMAT, "tensor output.weight: shape [128, 384, 1] (2 dims), expected [128, 512]"},
    };
    for (size_t i = 0; i < BASE_ARRAY_LEN(cases); i++) {
        rewrite(lfm2, bad, &cases[i].e);
        expect_refused(bad, cases[i].st, cases[i].msg);
    }
}

/* lfm2's optional attention.sliding_window makes every attention layer
 * sliding (llama.cpp's STANDARD SWA for lfm2) and none of the conv layers:
 * with a window of 16, prompt rows below 16 see what they saw without it,
 * later rows do not. */
static void test_lfm2_sliding_window(void **state)
{
    (void)state;
    const char *fp = test_fixture("models/lfm2.gguf");
    if (!fp) return;
    char p[512];
    snprintf(p, sizeof p, "%s", fp);
    int32_t *prompt = read_i32("ref/lfm2.prompt.i32", N_PROMPT);
    if (!prompt) return;
    const char *swa = tmp_path("swa.gguf");
    static const uint32_t w16 = 16;
    edit e = {.key = "lfm2.attention.sliding_window", .type = GGUF_TYPE_UINT32, .payload = &w16, .nbytes = 4};
    rewrite(p, swa, &e);
    keel_model *full = open_fixture("lfm2"), *slid = NULL;
    keel_model_params mp = keel_model_params_default();
    mp.path = swa;
    char err[256] = "";
    if (keel_model_open(&mp, &slid, err) != KEEL_OK) fail_msg("open %s: %s", swa, err);
    keel_model_info mi;
    keel_model_info_get(slid, &mi);
    assert_int_equal(mi.n_swa, 16);
    assert_int_equal(mi.n_swa_layers, 2); /* layers 1 and 3 */
    float *a = malloc(sizeof(float) * N_PROMPT * N_VOCAB), *b = malloc(sizeof(float) * N_PROMPT * N_VOCAB);
    run_prompt(full, KEEL_DTYPE_F16, prompt, a, NULL);
    run_prompt(slid, KEEL_DTYPE_F16, prompt, b, NULL);
    double below = 0.0, above = 0.0;
    for (int i = 0; i < N_PROMPT; i++)
        for (int j = 0; j < N_VOCAB; j++) {
            double d = fabs((double)a[i * N_VOCAB + j] - (double)b[i * N_VOCAB + j]);
            if (i < 16) below = fmax(below, d);
            else above = fmax(above, d);
        }
    printf("lfm2 sliding_window 16 vs none: rows < 16 max |dlogit| %.3e, rows >= 16 %.3e\n", below, above);
    assert_true(below <= 1e-5);
    assert_true(above > 1e-1);
    free(a);
    free(b);
    free(prompt);
    keel_model_close(full);
    keel_model_close(slid);
}

/* Issue 8 item 8: bad float hyperparameters and NaN/Inf norm weights were
 * accepted and failed later as "sample: invalid argument". Each is refused
 * at load, naming the key or the tensor and element. */
static void test_invalid_hparams_and_norms(void **state)
{
    (void)state;
    const char *base = tmp_path("base.gguf"), *bad = tmp_path("bad.gguf");
    gen("llama", 2, base);
    char err[256];
    const edit none = {0};
    rewrite(base, bad, &none); /* the rewriter changes nothing by itself */
    assert_ok(try_open(bad, NULL, err));
    static const float neg = -1e-5f, zero = 0.0f, nanv = NAN, inf = INFINITY, nbase = -10000.0f;
    static const double big = 1e300;
    const struct {
        edit e;
        const char *msg;
    } cases[] = {
        {{.key = "llama.attention.layer_norm_rms_epsilon", .type = GGUF_TYPE_FLOAT32, .payload = &neg, .nbytes = 4},
         "key llama.attention.layer_norm_rms_epsilon = -1e-05: outside (0, 1]"},
        {{.key = "llama.attention.layer_norm_rms_epsilon", .type = GGUF_TYPE_FLOAT32, .payload = &zero, .nbytes = 4},
         "key llama.attention.layer_norm_rms_epsilon = 0: outside (0, 1]"},
        {{.key = "llama.attention.layer_norm_rms_epsilon", .type = GGUF_TYPE_FLOAT32, .payload = &nanv, .nbytes = 4},
         "key llama.attention.layer_norm_rms_epsilon = nan: not a finite f32 number"},
        {{.key = "llama.attention.layer_norm_rms_epsilon", .type = GGUF_TYPE_FLOAT32, .payload = &inf, .nbytes = 4},
         "key llama.attention.layer_norm_rms_epsilon = inf: not a finite f32 number"},
        {{.key = "llama.attention.layer_norm_rms_epsilon", .type = GGUF_TYPE_FLOAT64, .payload = &big, .nbytes = 8},
         "key llama.attention.layer_norm_rms_epsilon = 1e+300: not a finite f32 number"},
        {{.key = "llama.rope.freq_base", .type = GGUF_TYPE_FLOAT32, .payload = &nbase, .nbytes = 4},
         "key llama.rope.freq_base = -10000: outside (0, 1e+30]"},
        {{.tensor = "blk.1.ffn_norm.weight", .elem = 3, .value = NAN},
         "tensor blk.1.ffn_norm.weight: element 3 is NaN: the weights are invalid"},
        {{.tensor = "blk.0.attn_norm.weight", .elem = 63, .value = -INFINITY},
         "tensor blk.0.attn_norm.weight: element 63 is -Inf"},
        {{.tensor = "output_norm.weight", .elem = 0, .value = INFINITY},
         "tensor output_norm.weight: element 0 is +Inf"},
    };
    for (size_t i = 0; i < BASE_ARRAY_LEN(cases); i++) {
        rewrite(base, bad, &cases[i].e);
        expect_refused(bad, KEEL_EFORMAT, cases[i].msg);
    }
    /* gemma2's soft-caps: negative is refused, 0 (off) is fine */
    const char *gbase = tmp_path("gemma2.gguf");
    gen("gemma2", 2, gbase);
    static const float ncap = -30.0f;
    edit e = {.key = "gemma2.final_logit_softcapping", .type = GGUF_TYPE_FLOAT32, .payload = &ncap,
              .nbytes = 4};
    rewrite(gbase, bad, &e);
    expect_refused(bad, KEEL_EFORMAT, "key gemma2.final_logit_softcapping = -30: outside [0, 1e+30]");
    e.payload = &zero;
    rewrite(gbase, bad, &e);
    assert_ok(try_open(bad, NULL, err));
}

/* Issue 8 item 9: layers beyond block_count (and tensors the architecture
 * has no use for) ran silently. They still run (llama.cpp refuses them;
 * keel keeps a deliberately cut model usable), with one warning through
 * the log callback naming them. */
static void test_unused_tensors_warn(void **state)
{
    (void)state;
    const char *base = tmp_path("three.gguf"), *cut = tmp_path("cut.gguf");
    const char *extra = tmp_path("extra.gguf");
    gen("llama", 3, base);
    uint32_t two = 2;
    edit e = {.key = "llama.block_count", .type = GGUF_TYPE_UINT32, .payload = &two, .nbytes = 4};
    rewrite(base, cut, &e);
    edit x = {.tensor = "token_embd_norm.weight", .copy_of = "output_norm.weight"};
    rewrite(base, extra, &x);
    log_cap cap;
    char err[256];
    const struct {
        const char *path;
        int n_warn;
        const char *msg;
    } cases[] = {
        {base, 0, ""},
        {cut, 1,
         "9 of 30 tensors are not used by the llama model and are ignored (llama.block_count is 2, "
         "but the file has layers blk.2..blk.2): blk.2.attn_norm.weight, blk.2.attn_q.weight, "},
        {extra, 1,
         "1 of 31 tensors are not used by the llama model and are ignored: "
         "token_embd_norm.weight"},
    };
    for (size_t i = 0; i < BASE_ARRAY_LEN(cases); i++) {
        memset(&cap, 0, sizeof cap);
        keel_set_log(capture_log, &cap, KEEL_LOG_DEBUG);
        keel_status st = try_open(cases[i].path, NULL, err);
        keel_set_log(NULL, NULL, KEEL_LOG_INFO);
        if (st != KEEL_OK) fail_msg("%s: %s", cases[i].path, err);
        assert_int_equal(cap.n_warn, cases[i].n_warn);
        if (!strstr(cap.last, cases[i].msg)) fail_msg("warning '%s' lacks '%s'", cap.last, cases[i].msg);
    }
    /* the cut model runs on its two layers */
    keel_model_params mp = keel_model_params_default();
    mp.path = cut;
    keel_model *m = NULL;
    assert_ok(keel_model_open(&mp, &m, err));
    keel_model_info mi;
    keel_model_info_get(m, &mi);
    assert_int_equal(mi.n_layer, 2);
    keel_context_params cp = keel_context_params_default();
    cp.n_ctx = 32;
    keel_context *c = NULL;
    assert_ok(keel_context_open(m, &cp, &c, err));
    int32_t toks[4] = {1, 20, 30, 40};
    keel_batch b = {4, toks, NULL, NULL, NULL};
    assert_ok(keel_decode(c, &b));
    const float *l = keel_logits(c, 3);
    assert_non_null(l);
    assert_true(isfinite(l[0]) && isfinite(l[mi.n_vocab - 1]));
    keel_context_close(c);
    keel_model_close(m);
}

/* A tiny llama2.c checkpoint (zero weights, shared classifier, vocab 4). */
static void write_l2c(const char *path)
{
    const int32_t h[7] = {8, 16, 1, 2, 2, 4, 4};
    /* emb 4x8, rms_att 8, wq/wk/wv/wo 4x64, rms_ffn 8, w1/w2/w3 3x128,
     * rms_final 8, freq_cis 2 x 4 x 2 */
    size_t n_floats = 32 + 8 + 4 * 64 + 8 + 3 * 128 + 8 + 16;
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(h, sizeof h, 1, f), 1);
    float z = 0.0f;
    for (size_t i = 0; i < n_floats; i++)
        assert_int_equal(fwrite(&z, 4, 1, f), 1);
    assert_int_equal(fclose(f), 0);
}

static int count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle))
        n++;
    return n;
}

/* Runs the keel CLI (KEEL_BIN) with args; stderr into buf; exit status. */
static int run_cli(const char *args, char *buf, size_t cap)
{
    const char *bin = getenv("KEEL_BIN");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s %s 2>&1 >/dev/null", bin && *bin ? bin : "./keel", args);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(buf, 1, cap - 1, p);
    buf[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Issue 8 item 18: a path that is not a model says what it found (not a
 * regular file, a directory, empty, the magic), the CLI prints the path
 * once, and tokenizer-file errors name the tokenizer's path. */
static void test_not_a_model(void **state)
{
    (void)state;
    const char *empty = tmp_path("empty.bin"), *text = tmp_path("notes.txt");
    const char *shortf = tmp_path("short.bin"), *l2c = tmp_path("model.bin");
    const char *badtok = tmp_path("badtok.bin");
    FILE *f = fopen(empty, "wb");
    assert_int_equal(fclose(f), 0);
    f = fopen(text, "wb");
    fputs("# my notes\n", f);
    assert_int_equal(fclose(f), 0);
    f = fopen(shortf, "wb");
    fputs("GG", f);
    assert_int_equal(fclose(f), 0);
    f = fopen(badtok, "wb");
    fputs("this is not a tokenizer at all", f);
    assert_int_equal(fclose(f), 0);
    write_l2c(l2c);
    const struct {
        const char *path, *tok;
        keel_status st;
        const char *msg;
    } cases[] = {
        {"/dev/null", NULL, KEEL_EIO,
         "not a regular file (a character device): a model is a GGUF file or a llama2.c checkpoint"},
        {g_dir, NULL, KEEL_EIO, "is a directory, not a model file"},
        {empty, NULL, KEEL_EFORMAT, "empty file (0 bytes): not a GGUF file or a llama2.c checkpoint"},
        {text, NULL, KEEL_EFORMAT,
         "not a GGUF file (magic '# my'); for a llama2.c checkpoint pass --tokenizer"},
        {shortf, NULL, KEEL_EFORMAT, "not a GGUF file (2 bytes: 'GG')"},
        {l2c, NULL, KEEL_EFORMAT,
         "not a GGUF file (magic '\\x08\\x00\\x00\\x00'); for a llama2.c checkpoint pass --tokenizer"},
        {tmp_path("missing.gguf"), NULL, KEEL_EIO, "cannot open: No such file or directory"},
        {l2c, tmp_path("missing-tok.bin"), KEEL_EIO, "tokenizer "},
        {l2c, badtok, KEEL_EFORMAT, "tokenizer "},
    };
    char err[256], out[8192], args[1024];
    for (size_t i = 0; i < BASE_ARRAY_LEN(cases); i++) {
        keel_status st = try_open(cases[i].path, cases[i].tok, err);
        if (st != cases[i].st || !strstr(err, cases[i].msg))
            fail_msg("%s: %s '%s', want %s '%s'", cases[i].path, keel_status_name(st), err,
                     keel_status_name(cases[i].st), cases[i].msg);
        /* the library names the tokenizer, never the model path */
        assert_null(strstr(err, cases[i].path));
        if (cases[i].tok) {
            char want[256];
            snprintf(want, sizeof want, "tokenizer %s: ", cases[i].tok);
            if (!strstr(err, want)) fail_msg("'%s' lacks '%s'", err, want);
        }
        /* the CLI: one line, the model path once, the detail once */
        snprintf(args, sizeof args, "run -m '%s'%s%s%s -p hi -n 1", cases[i].path,
                 cases[i].tok ? " --tokenizer '" : "", cases[i].tok ? cases[i].tok : "",
                 cases[i].tok ? "'" : "");
        assert_int_equal(run_cli(args, out, sizeof out), 1);
        assert_int_equal(count(out, "\n"), 1);
        assert_int_equal(count(out, cases[i].path), 1);
        assert_int_equal(count(out, cases[i].msg), 1);
        if (cases[i].tok) assert_int_equal(count(out, cases[i].tok), 1);
    }
}

/* The CLI shows the library's unused-tensor warning on stderr, once. */
static void test_cli_unused_warning(void **state)
{
    (void)state;
    const char *base = tmp_path("cli3.gguf"), *cut = tmp_path("cli-cut.gguf");
    gen("llama", 3, base);
    uint32_t two = 2;
    edit e = {.key = "llama.block_count", .type = GGUF_TYPE_UINT32, .payload = &two, .nbytes = 4};
    rewrite(base, cut, &e);
    char out[8192], args[512];
    snprintf(args, sizeof args, "run -m '%s' -p hi -n 1", cut);
    assert_int_equal(run_cli(args, out, sizeof out), 0);
    assert_int_equal(count(out, "keel: warning: 9 of 30 tensors are not used"), 1);
    assert_int_equal(count(out, "warning"), 1);
    snprintf(args, sizeof args, "run -m '%s' -p hi -n 1", base);
    assert_int_equal(run_cli(args, out, sizeof out), 0);
    assert_null(strstr(out, "warning"));
}

/* keel_decode refuses non-finite logits, naming the position (issue 8
 * item 8), and a continued position past INT32_MAX; generated models, so
 * it runs without fixtures. */
/* A generated llama model (keel_gen_params_default) in a fresh file from
 * the mkstemp pattern in path (at most 63 characters). */
static void gen_tmp_llama(char *path)
{
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    keel_gen_params gp = keel_gen_params_default();
    gp.arch = "llama";
    char err[256] = "";
    if (keel_gen_model(&gp, path, err) != KEEL_OK) fail_msg("gen %s: %s", path, err);
}

/* keel_load: the file mapped and read into memory give the same model,
 * bit for bit the same logits; the info says which; AUTO is one of the
 * two; a load that is none of them is KEEL_EINVAL; names round-trip. */
static void logits_of(const char *path, keel_load load, bool *read, float *out, int32_t n_vocab)
{
    char err[256] = "";
    keel_model_params mp = keel_model_params_default();
    mp.path = path;
    mp.load = load;
    keel_model *m = NULL;
    assert_ok(keel_model_open(&mp, &m, err));
    keel_model_info mi;
    keel_model_info_get(m, &mi);
    *read = mi.weights_read;
    assert_int_equal(mi.n_vocab, n_vocab);
    keel_context_params cp = keel_context_params_default();
    cp.n_ctx = 64;
    cp.n_threads = 1;
    keel_context *c = NULL;
    assert_ok(keel_context_open(m, &cp, &c, err));
    int32_t toks[3] = {1, 40, 41};
    int8_t flags[3] = {0, 0, 1};
    keel_batch b = {3, toks, NULL, NULL, flags};
    assert_ok(keel_decode(c, &b));
    const float *l = keel_logits(c, 2);
    assert_non_null(l);
    memcpy(out, l, (size_t)n_vocab * sizeof(float));
    keel_context_close(c);
    keel_model_close(m);
}

static void test_load_modes(void **state)
{
    (void)state;
    char path[64] = "/tmp/keel_model_load_XXXXXX";
    gen_tmp_llama(path);
    char err[256] = "";
    int32_t nv = keel_gen_params_default().n_vocab;
    float *a = malloc((size_t)nv * sizeof(float)), *b = malloc((size_t)nv * sizeof(float));
    float *c = malloc((size_t)nv * sizeof(float));
    bool ra, rb, rc;
    logits_of(path, KEEL_LOAD_MMAP, &ra, a, nv);
    logits_of(path, KEEL_LOAD_READ, &rb, b, nv);
    logits_of(path, KEEL_LOAD_AUTO, &rc, c, nv);
    assert_false(ra);
    assert_true(rb);
    assert_memory_equal(a, b, (size_t)nv * sizeof(float));
    assert_memory_equal(a, c, (size_t)nv * sizeof(float));
    keel_model_params mp = keel_model_params_default();
    mp.path = path;
    mp.load = (keel_load)7;
    keel_model *m = NULL;
    assert_status(keel_model_open(&mp, &m, err), KEEL_EINVAL);
    assert_null(m);
    assert_non_null(strstr(err, "KEEL_LOAD_READ"));
    /* a directory read is refused as mapping refuses it */
    mp.path = "/tmp";
    mp.load = KEEL_LOAD_READ;
    assert_status(keel_model_open(&mp, &m, err), KEEL_EIO);
    for (int l = KEEL_LOAD_AUTO; l <= KEEL_LOAD_READ; l++) {
        keel_load back;
        assert_ok(keel_load_from_name(keel_load_name((keel_load)l), &back));
        assert_int_equal(back, l);
    }
    /* AUTO's choice: read only where huge pages are on request and the
     * file is at most a quarter of the available memory */
    unsigned long long gib_kib = 1024ull * 1024;
    assert_true(engine_load_reads("always [madvise] never\n", 16 * gib_kib, (size_t)1 << 30));
    assert_true(engine_load_reads("[always] madvise never\n", 16 * gib_kib, (size_t)1 << 30));
    assert_false(engine_load_reads("always madvise [never]\n", 16 * gib_kib, (size_t)1 << 30));
    assert_false(engine_load_reads("", 16 * gib_kib, 1024));
    assert_false(engine_load_reads(NULL, 16 * gib_kib, 1024));
    assert_true(engine_load_reads("[madvise]", 4 * gib_kib, (size_t)1 << 30));
    assert_false(engine_load_reads("[madvise]", 4 * gib_kib, ((size_t)1 << 30) + 1024));
    assert_false(engine_load_reads("[madvise]", 0, 1024));
    keel_load back = KEEL_LOAD_MMAP;
    assert_status(keel_load_from_name("mapped", &back), KEEL_EINVAL);
    assert_int_equal(back, KEEL_LOAD_MMAP);
    free(a);
    free(b);
    free(c);
    unlink(path);
}

static void test_decode_limits(void **state)
{
    (void)state;
    char path[64] = "/tmp/keel_model_nan_XXXXXX";
    gen_tmp_llama(path);
    char err[256] = "";
    keel_model_params mp = keel_model_params_default();
    mp.path = path;
    keel_model *m = NULL;
    assert_ok(keel_model_open(&mp, &m, err));
    keel_context_params cp = keel_context_params_default();
    cp.n_ctx = 64;
    cp.n_threads = 1;
    cp.n_outputs = 8;
    keel_context *c = NULL;
    assert_ok(keel_context_open(m, &cp, &c, err));
    int32_t toks[4] = {1, 40, 41, 42};
    int8_t flags[4] = {0, 1, 0, 1};
    keel_batch b = {4, toks, NULL, NULL, flags};
    assert_ok(keel_decode(c, &b)); /* finite weights: finite logits */
    for (int i = 0; i < 4; i += 2) assert_null(keel_logits(c, i));
    /* positions: the memory's last position is INT32_MAX - 1; continuing a
     * sequence there is refused up front and nothing changes */
    keel_mem *mem = keel_context_memory(c);
    keel_mem_clear(mem);
    int32_t pos = INT32_MAX - 1;
    keel_batch at_max = {1, toks, &pos, NULL, NULL};
    assert_ok(keel_decode(c, &at_max));
    uint64_t d = keel_mem_digest(mem);
    keel_batch next = {1, toks, NULL, NULL, NULL};
    assert_status(keel_decode(c, &next), KEEL_ERANGE);
    assert_non_null(strstr(keel_context_last_error(c), "position 2147483646 is the last one"));
    assert_int_equal(keel_mem_digest(mem), d);
    keel_status st;
    keel_context_close(c);
    keel_model_close(m);
    /* NaN output weights: NaN logits, named with their position */
    assert_true(test_fill_tensor_f32(path, "output.weight", NAN));
    assert_ok(keel_model_open(&mp, &m, err));
    assert_ok(keel_context_open(m, &cp, &c, err));
    assert_status(keel_decode(c, &b), KEEL_EFORMAT);
    assert_string_equal(keel_context_last_error(c),
                        "decode: logits are NaN at position 1 (sequence 0, batch token 1): the model's "
                        "weights or hyperparameters are invalid");
    /* no logits requested: nothing to check, the batch runs */
    keel_mem_clear(keel_context_memory(c));
    int8_t none[4] = {0, 0, 0, 0};
    keel_batch quiet = {4, toks, NULL, NULL, none};
    assert_ok(keel_decode(c, &quiet));
    keel_context_close(c);
    keel_model_close(m);
    /* overflowing (finite) weights: infinite logits */
    assert_true(test_fill_tensor_f32(path, "output.weight", 3e38f));
    assert_true(test_fill_tensor_f32(path, "output_norm.weight", 1e3f));
    assert_ok(keel_model_open(&mp, &m, err));
    assert_ok(keel_context_open(m, &cp, &c, err));
    st = keel_decode(c, &b);
    assert_status(st, KEEL_EFORMAT);
    assert_non_null(strstr(keel_context_last_error(c), "at position 1 (sequence 0, batch token 1)"));
    keel_context_close(c);
    keel_model_close(m);
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture_logits_and_greedy),
        cmocka_unit_test(test_fixture_teacher_forced),
        cmocka_unit_test(test_fixture_incremental),
        cmocka_unit_test(test_fixture_shift_per_layer_rope),
        cmocka_unit_test(test_fixture_longrope_choice),
        cmocka_unit_test(test_fixture_quantized_kv),
        cmocka_unit_test(test_llama2c_matches_gguf),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test_setup_teardown(test_invalid_hparams_and_norms, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_new_arch_validation, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_moe_arch_validation, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_nemotron_h_validation, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_lfm2_validation, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_lfm2_sliding_window, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_unused_tensors_warn, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_not_a_model, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_cli_unused_warning, setup_dir, teardown_dir),
        cmocka_unit_test(test_decode_limits),
        cmocka_unit_test(test_load_modes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
