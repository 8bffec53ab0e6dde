/*
 * test_hybrid.c — the issue 11 architectures, nemotron_h and lfm2 through
 * keel.h (keel_decode on generated models; the fixtures when present):
 *   - self-oracle: decoding one token at a time through the memory (states
 *     and cache) equals recomputing the whole prefix in one batch, for
 *     qwen35, qwen3next, mamba2 and gpt-oss, with two sequences interleaved
 *     in one batch equal to each alone;
 *   - checkpoint restore equals recompute (keel_context_rewind);
 *   - the agent pattern of design.md 1.2 on qwen35 with q8_0 K/V and
 *     rotation: a 2,000-token prompt with checkpoints every 256, a second
 *     prompt sharing 1,500 tokens resumes from 1,280 and equals a full
 *     recompute, a third diverging at 100 recomputes from scratch, then 20
 *     turns with random divergence points;
 *   - the shift regression on the hybrid: seq_add over the attention layers
 *     of a qwen35-shaped model with q8_0 rotated keys (head_dim 64 and 256)
 *     takes the same scratch at 4,096 and 32,768 cells;
 *   - the plan counts the states and checkpoints exactly; bad parameters;
 *   - issue 26: a fork continued on both sides in one batch (one new state
 *     slot, not two), also across a periodic-checkpoint cut, equals the
 *     same tokens fed one sequence at a time;
 *   - issue 23: nemotron_h's fixture rewound to a checkpoint answers as a
 *     fresh prefill, and its session continues bit-identically elsewhere.
 */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MIN_(a, b) ((a) < (b) ? (a) : (b))

static keel_model *gen_model(const char *arch, int32_t n_layer, int32_t n_embd, int32_t n_head,
                             int32_t n_head_kv, int32_t head_dim, uint64_t seed)
{
    char path[64];
    assert_true(test_temp_file(path, sizeof path, "hybrid"));
    keel_gen_params gp = keel_gen_params_default();
    gp.arch = arch;
    gp.n_layer = n_layer;
    gp.n_embd = n_embd;
    gp.n_head = n_head;
    gp.n_head_kv = n_head_kv;
    gp.head_dim = head_dim;
    gp.n_ff = 2 * n_embd;
    gp.n_swa = 8;
    gp.seed = seed;
    char err[256] = "";
    keel_status st = keel_gen_model(&gp, path, err);
    if (st != KEEL_OK) fail_msg("gen %s: %s", arch, err);
    keel_model_params mp = keel_model_params_default();
    mp.path = path;
    keel_model *m = NULL;
    st = keel_model_open(&mp, &m, err);
    unlink(path);
    if (st != KEEL_OK) fail_msg("open %s: %s", arch, err);
    return m;
}

static keel_context *ctx(keel_model *m, int32_t n_ctx, int32_t n_batch, int32_t n_seq,
                         keel_dtype kv, int32_t every)
{
    keel_context_params cp = keel_context_params_default();
    cp.n_ctx = n_ctx;
    cp.n_batch = cp.n_ubatch = n_batch;
    cp.n_outputs = n_batch;
    cp.n_seq_max = n_seq;
    cp.n_threads = 2;
    cp.type_k = cp.type_v = kv;
    cp.rot_k = cp.rot_v = kv == KEEL_DTYPE_Q8_0 ? 1 : 0;
    cp.checkpoint_every = every;
    keel_context *c = NULL;
    char err[256] = "";
    keel_status st = keel_context_open(m, &cp, &c, err);
    if (st != KEEL_OK) fail_msg("context: %s", err);
    return c;
}

/* max |a - b| / max(1, max |b|) over n values */
static double rel_diff(const float *a, const float *b, size_t n)
{
    double mx = 1.0, d = 0.0;
    for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs((double)b[i]));
    for (size_t i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - (double)b[i]));
    return d / mx;
}

#define N_TOK 40

static void test_selforacle_hybrids(void **state)
{
    (void)state;
    const char *archs[] = {"qwen35", "qwen3next", "mamba2", "gpt-oss", "nemotron_h", "lfm2"};
    int32_t toks[N_TOK], toks2[N_TOK];
    for (int i = 0; i < N_TOK; i++) {
        toks[i] = 3 + (i * 131) % 290;
        toks2[i] = 5 + (i * 71) % 280;
    }
    for (size_t a = 0; a < sizeof archs / sizeof archs[0]; a++) {
        keel_model *m = gen_model(archs[a], 4, 128, 4, 2, 32, 7);
        keel_model_info mi;
        keel_model_info_get(m, &mi);
        size_t V = (size_t)mi.n_vocab;
        keel_context *inc = ctx(m, 128, N_TOK, 1, KEEL_DTYPE_F32, 0);
        keel_context *full = ctx(m, 128, N_TOK, 1, KEEL_DTYPE_F32, 0);
        float *step = malloc(V * sizeof(float));
        double worst = 0.0;
        for (int32_t t = 0; t < N_TOK; t++) {
            keel_batch one = {1, &toks[t], NULL, NULL, NULL};
            assert_ok(keel_decode(inc, &one));
            memcpy(step, keel_logits(inc, 0), V * sizeof(float));
            keel_mem_clear(keel_context_memory(full));
            keel_batch all = {t + 1, toks, NULL, NULL, NULL};
            assert_ok(keel_decode(full, &all));
            worst = fmax(worst, rel_diff(step, keel_logits(full, t), V));
        }
        assert_ok(keel_mem_check(keel_context_memory(inc)));
        /* two sequences interleaved in one batch equal each alone */
        keel_context *two = ctx(m, 128, 2 * N_TOK, 2, KEEL_DTYPE_F32, 0);
        int32_t bt[2 * N_TOK], bs[2 * N_TOK];
        int8_t bl[2 * N_TOK];
        for (int i = 0; i < N_TOK; i++) {
            bt[2 * i] = toks[i];
            bs[2 * i] = 0;
            bt[2 * i + 1] = toks2[i];
            bs[2 * i + 1] = 1;
            bl[2 * i] = bl[2 * i + 1] = i == N_TOK - 1;
        }
        keel_batch both = {2 * N_TOK, bt, NULL, bs, bl};
        assert_ok(keel_decode(two, &both));
        keel_mem_clear(keel_context_memory(full));
        keel_batch b1 = {N_TOK, toks2, NULL, NULL, NULL};
        assert_ok(keel_decode(full, &b1));
        double inter = rel_diff(keel_logits(two, 2 * N_TOK - 1), keel_logits(full, N_TOK - 1), V);
        keel_mem_clear(keel_context_memory(full));
        keel_batch b0 = {N_TOK, toks, NULL, NULL, NULL};
        assert_ok(keel_decode(full, &b0));
        inter = fmax(inter, rel_diff(keel_logits(two, 2 * N_TOK - 2), keel_logits(full, N_TOK - 1), V));
        printf("%-10s max |incremental - recompute| / max|logit| = %.2e, interleaved sequences %.2e\n",
               archs[a], worst, inter);
        /* f32 weights and cache: only the order of float sums differs (matvec
         * for one token, GEMM for a batch), compounded through the states */
        assert_true(worst <= 2e-5);
        assert_true(inter <= 2e-5);
        free(step);
        keel_context_close(inc);
        keel_context_close(full);
        keel_context_close(two);
        keel_model_close(m);
    }
}

/* Rewinding to a checkpoint then feeding the rest equals a fresh context
 * given the whole prompt (the same ubatch cuts at multiples of `every`
 * and, with few cells, the same cells: bitwise). */
static void test_checkpoint_restore_equals_recompute(void **state)
{
    (void)state;
    const char *archs[] = {"qwen35", "qwen3next", "mamba2", "nemotron_h", "lfm2"};
    int32_t a_[N_TOK], b_[N_TOK];
    for (int i = 0; i < N_TOK; i++) a_[i] = b_[i] = 3 + (i * 37) % 290;
    for (int i = 21; i < N_TOK; i++) b_[i] = 7 + (i * 53) % 250;
    for (size_t a = 0; a < sizeof archs / sizeof archs[0]; a++) {
        keel_model *m = gen_model(archs[a], 4, 128, 4, 2, 32, 11);
        keel_model_info mi;
        keel_model_info_get(m, &mi);
        size_t V = (size_t)mi.n_vocab;
        keel_context *c = ctx(m, 128, N_TOK, 1, KEEL_DTYPE_F32, 8);
        keel_batch pa = {N_TOK, a_, NULL, NULL, NULL};
        assert_ok(keel_decode(c, &pa));
        keel_mem *mem = keel_context_memory(c);
        keel_mem_ckpt_info info[8];
        int32_t n = 0;
        keel_mem_ckpt_list(mem, 0, info, 8, &n);
        assert_int_equal(n, 5); /* 8, 16, 24, 32 and the prompt end 40 */
        assert_int_equal(info[0].pos, 8);
        assert_int_equal(info[4].pos, 40);
        int32_t resume = -1;
        assert_ok(keel_context_rewind(c, 0, 21, &resume));
        assert_int_equal(resume, 16);
        keel_batch rest = {N_TOK - resume, b_ + resume, NULL, NULL, NULL};
        assert_ok(keel_decode(c, &rest));
        keel_context *f = ctx(m, 128, N_TOK, 1, KEEL_DTYPE_F32, 8);
        keel_batch pb = {N_TOK, b_, NULL, NULL, NULL};
        assert_ok(keel_decode(f, &pb));
        assert_memory_equal(keel_logits(c, N_TOK - resume - 1), keel_logits(f, N_TOK - 1), V * sizeof(float));
        assert_ok(keel_mem_check(mem));
        /* a divergence before the oldest checkpoint: from scratch */
        assert_ok(keel_context_rewind(c, 0, 5, &resume));
        assert_int_equal(resume, 0);
        assert_int_equal(keel_mem_seq_pos_max(mem, 0), -1);
        keel_context_close(c);
        keel_context_close(f);
        keel_model_close(m);
    }
}

/* The agent pattern: qwen35 (the fixture if present, else generated) with
 * q8_0 K/V and rotation, checkpoints every 256. */
#define AG_LEN 2000
#define AG_EVERY 256

static keel_model *agent_model(void)
{
    const char *p = test_fixture("models/qwen35.gguf");
    if (!p) return gen_model("qwen35", 4, 128, 4, 2, 64, 23);
    keel_model_params mp = keel_model_params_default();
    mp.path = p;
    keel_model *m = NULL;
    char err[256] = "";
    keel_status st = keel_model_open(&mp, &m, err);
    if (st != KEEL_OK) fail_msg("open qwen35: %s", err);
    return m;
}

/* Feeds toks[from, n) to c; the last logit row. */
static const float *feed(keel_context *c, const int32_t *toks, int32_t from, int32_t n)
{
    for (int32_t i = from; i < n; i += 512) {
        int32_t k = MIN_(512, n - i);
        keel_batch b = {k, toks + i, NULL, NULL, NULL};
        keel_status st = keel_decode(c, &b);
        if (st != KEEL_OK) fail_msg("decode: %s", keel_context_last_error(c));
    }
    return keel_logits(c, (n - from - 1) % 512);
}

static void test_agent_pattern(void **state)
{
    (void)state;
    keel_model *m = agent_model();
    keel_model_info mi;
    keel_model_info_get(m, &mi);
    size_t V = (size_t)mi.n_vocab;
    keel_context *c = ctx(m, 4096, 512, 1, KEEL_DTYPE_Q8_0, AG_EVERY);
    keel_context *f = ctx(m, 4096, 512, 1, KEEL_DTYPE_Q8_0, AG_EVERY);
    int32_t *cur = malloc(AG_LEN * sizeof(int32_t)), *next = malloc(AG_LEN * sizeof(int32_t));
    uint64_t rng = 0x5eed;
    for (int i = 0; i < AG_LEN; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        cur[i] = 3 + (int32_t)((rng >> 33) % (uint64_t)(mi.n_vocab - 3));
    }
    feed(c, cur, 0, AG_LEN);
    keel_mem_ckpt_info info[16];
    int32_t n = 0;
    keel_mem_ckpt_list(keel_context_memory(c), 0, info, 16, &n);
    assert_int_equal(n, 8); /* 256, 512, ..., 1792 and the prompt end 2000 */
    assert_int_equal(info[7].pos, AG_LEN);
    /* turn 1: shares 1,500 tokens; turn 2: diverges at 100; then random */
    int32_t shared[22] = {1500, 100};
    for (int t = 2; t < 22; t++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        shared[t] = (int32_t)((rng >> 33) % AG_LEN);
    }
    int restored = 0, scratch = 0;
    double worst = 0.0;
    for (int t = 0; t < 22; t++) {
        memcpy(next, cur, sizeof(int32_t) * (size_t)shared[t]);
        for (int i = shared[t]; i < AG_LEN; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            next[i] = 3 + (int32_t)((rng >> 33) % (uint64_t)(mi.n_vocab - 3));
        }
        int32_t resume = -1;
        assert_ok(keel_context_rewind(c, 0, shared[t], &resume));
        int32_t want = shared[t] / AG_EVERY * AG_EVERY; /* the newest checkpoint at or before */
        int32_t oldest = info[0].pos;
        if (shared[t] < oldest) want = 0;
        if (t == 0) assert_int_equal(resume, 1280);
        if (t == 1) assert_int_equal(resume, 0);
        assert_int_equal(resume, want);
        restored += resume > 0;
        scratch += resume == 0;
        const float *got = feed(c, next, resume, AG_LEN);
        keel_mem_clear(keel_context_memory(f));
        const float *ref = feed(f, next, 0, AG_LEN);
        /* the K/V bytes and the states are the same; the new tokens sit in
         * other cells, so attention sums in another order: float rounding */
        double e = rel_diff(got, ref, V);
        worst = e > worst ? e : worst;
        if (!(e <= 1e-5))
            fail_msg("turn %d (shared %d, resumed at %d): logits differ from a recompute by %.3g", t,
                     shared[t], resume, e);
        assert_ok(keel_mem_check(keel_context_memory(c)));
        keel_mem_ckpt_list(keel_context_memory(c), 0, info, 16, &n);
        memcpy(cur, next, sizeof(int32_t) * AG_LEN);
    }
    printf("agent pattern: 22 turns, %d resumed from a checkpoint, %d from scratch; max |logit - "
           "recompute| / max|logit| = %.2e\n", restored, scratch, worst);
    assert_true(restored >= 10 && scratch >= 1);
    free(cur);
    free(next);
    keel_context_close(c);
    keel_context_close(f);
    keel_model_close(m);
}

/* seq_add over the attention layers of a qwen35-shaped model with q8_0
 * rotated keys takes scratch independent of the context length (design.md
 * 1.2: the K-shift scratch was sized for another graph). The memory is
 * filled through keel_mem (random K/V rows, the states updated), so 32,768
 * cells cost no forward passes. */
static void test_shift_regression_hybrid(void **state)
{
    (void)state;
    const int32_t dims[2] = {64, 256};
    for (int d = 0; d < 2; d++) {
        int32_t nh = 256 / dims[d], kvh = nh >= 2 ? nh / 2 : 1;
        keel_model *m = gen_model("qwen35", 4, 256, nh, kvh, dims[d], 3);
        size_t high[2] = {0, 0};
        const int32_t ctxs[2] = {4096, 32768};
        for (int k = 0; k < 2; k++) {
            keel_context *c = ctx(m, ctxs[k], 512, 1, KEEL_DTYPE_Q8_0, 0);
            keel_mem *mem = keel_context_memory(c);
            int32_t n_layers = 4;
            float *kbuf = malloc(sizeof(float) * 512 * (size_t)(kvh * dims[d]));
            test_fill_uniform(kbuf, 512LL * kvh * dims[d], 9);
            int32_t pos[512], seq[512], cells[512 * 2];
            for (int32_t p0 = 0; p0 + 512 <= ctxs[k]; p0 += 512) {
                for (int i = 0; i < 512; i++) {
                    pos[i] = p0 + i;
                    seq[i] = 0;
                }
                keel_mem_batch b = {512, pos, seq, NULL, NULL, NULL};
                assert_ok(keel_mem_place(mem, &b, cells));
                for (int32_t l = 0; l < n_layers; l++) {
                    int32_t g = keel_mem_layer_group(mem, l);
                    if (g < 0) continue;
                    assert_ok(keel_mem_write(mem, l, 512, cells + (size_t)g * 512, kbuf, kbuf));
                }
            }
            keel_mem_stats st;
            keel_mem_stats_get(mem, &st);
            size_t before = st.scratch_high;
            assert_ok(keel_mem_seq_add(mem, 0, 0, -1, 7));
            assert_int_equal(keel_mem_seq_pos_max(mem, 0), ctxs[k] - 1 + 7);
            keel_mem_stats_get(mem, &st);
            high[k] = st.scratch_high;
            assert_true(high[k] >= before);
            assert_ok(keel_mem_check(mem));
            free(kbuf);
            keel_context_close(c);
        }
        printf("hybrid shift, head_dim %d: scratch high-water %zu bytes at 4,096 cells, %zu at 32,768\n",
               dims[d], high[0], high[1]);
        assert_int_equal(high[0], high[1]);
        keel_model_close(m);
    }
}

static void test_plan_and_params(void **state)
{
    (void)state;
    keel_model *m = gen_model("qwen35", 4, 128, 4, 2, 32, 5);
    keel_context_params cp = keel_context_params_default();
    cp.n_ctx = 256;
    cp.n_seq_max = 3;
    cp.n_threads = 1;
    cp.n_ctx_checkpoints = 5;
    keel_plan pl;
    char err[256] = "";
    assert_ok(keel_context_plan(m, &cp, &pl, err));
    /* 3 GDN layers: conv 3 x (2*2*32 + 128) = 768 floats, state 4 x 32 x 32 */
    size_t slot = (768 + 4096) * sizeof(float);
    assert_int_equal(pl.rs_bytes, 3 * 3 * slot);
    assert_true(pl.ckpt_bytes >= 3 * 5 * 3 * slot);
    test_alloc_install(0);
    keel_context *c = NULL;
    keel_status st = keel_context_open(m, &cp, &c, err);
    int64_t live = test_alloc_live_bytes();
    keel_context_close(c);
    test_alloc_uninstall();
    assert_ok(st);
    assert_int_equal(live, (int64_t)pl.total_bytes);
    cp.n_ctx_checkpoints = -2;
    assert_status(keel_context_plan(m, &cp, &pl, err), KEEL_EINVAL);
    assert_non_null(strstr(err, "n_ctx_checkpoints -2"));
    cp.n_ctx_checkpoints = 0;
    cp.checkpoint_every = -3;
    assert_status(keel_context_plan(m, &cp, &pl, err), KEEL_EINVAL);
    assert_non_null(strstr(err, "checkpoint_every -3"));
    /* without checkpoints a divergence inside the prompt recomputes */
    cp.checkpoint_every = 0;
    c = NULL;
    assert_ok(keel_context_open(m, &cp, &c, err));
    int32_t toks[10] = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14};
    keel_batch b = {10, toks, NULL, NULL, NULL};
    assert_ok(keel_decode(c, &b));
    int32_t resume = -1;
    assert_status(keel_mem_seq_rm(keel_context_memory(c), 0, 4, -1), KEEL_ESTATE);
    assert_ok(keel_context_rewind(c, 0, 4, &resume));
    assert_int_equal(resume, 0);
    assert_status(keel_context_rewind(c, 9, 4, &resume), KEEL_EINVAL);
    keel_context_close(c);
    keel_model_close(m);
    /* an attention model with sliding layers (gpt-oss: window 8): by default
     * as many ring checkpoints as fit, up to 8, in a quarter of the KV bytes;
     * an explicit count is used as given; the plan counts them */
    m = gen_model("gpt-oss", 4, 64, 4, 2, 16, 5);
    cp = keel_context_params_default();
    cp.n_threads = 1;
    const int32_t n_ctxs[3] = {1024, 64, 16};
    for (int k = 0; k < 3; k++) {
        cp.n_ctx = n_ctxs[k];
        cp.n_ctx_checkpoints = 1;
        assert_ok(keel_context_plan(m, &cp, &pl, err));
        size_t rec = pl.ckpt_bytes;
        assert_true(rec > 0);
        cp.n_ctx_checkpoints = -1;
        assert_ok(keel_context_plan(m, &cp, &pl, err));
        size_t want = pl.kv_bytes / 4 / rec < 8 ? pl.kv_bytes / 4 / rec : 8;
        printf("gpt-oss n_ctx %d: ring checkpoint %zu B, KV %zu B: %zu by default\n", n_ctxs[k], rec, pl.kv_bytes,
               want);
        assert_int_equal(pl.ckpt_bytes, want * rec);
        if (k == 0) assert_int_equal(want, 8);
        if (k == 2) assert_int_equal(want, 0);
        cp.n_ctx_checkpoints = 3;
        assert_ok(keel_context_plan(m, &cp, &pl, err));
        assert_int_equal(pl.ckpt_bytes, 3 * rec);
    }
    keel_model_close(m);
}

/* The delta rule takes one row of d_state floats per pool thread: the work
 * arena counts them beside the per-token buffers (a one-token decode with
 * many threads and wide heads overran the reservation: KEEL_ESCRATCH). */
static void test_work_arena_threads(void **state)
{
    (void)state;
    keel_model *m = gen_model("qwen35", 4, 256, 1, 1, 256, 13);
    keel_context_params cp = keel_context_params_default();
    cp.n_ctx = 64;
    cp.n_batch = cp.n_ubatch = 1; /* the arena sized for one token */
    cp.n_threads = 16;
    keel_context *c = NULL;
    char err[256] = "";
    assert_ok(keel_context_open(m, &cp, &c, err));
    int32_t t = 7;
    for (int i = 0; i < 3; i++) {
        keel_batch b = {1, &t, NULL, NULL, NULL};
        keel_status st = keel_decode(c, &b);
        if (st != KEEL_OK) fail_msg("decode: %s", keel_context_last_error(c));
    }
    keel_context_close(c);
    keel_model_close(m);
}

/* Issue 26 item 2: a fork of a hybrid sequence continued on both sides in
 * ONE batch needs one new state slot, not two (all sharers of a slot in
 * the batch: one keeps the original). n_seq_max slots always suffice; the
 * logits equal two single-token decodes and a fresh recomputation. */
static void test_fork_one_batch(void **state)
{
    (void)state;
    keel_model *m = gen_model("qwen35", 4, 128, 4, 2, 32, 5);
    keel_model_info mi;
    keel_model_info_get(m, &mi);
    size_t V = (size_t)mi.n_vocab;
    int32_t prompt[12];
    for (int i = 0; i < 12; i++) prompt[i] = 3 + (i * 97) % 280;
    int32_t next[3] = {41, 77, 123};
    for (int32_t n_seq = 2; n_seq <= 3; n_seq++) {
        keel_context *c = ctx(m, 64, 16, n_seq, KEEL_DTYPE_F32, 0);
        keel_context *r = ctx(m, 64, 16, n_seq, KEEL_DTYPE_F32, 0);
        keel_context *f = ctx(m, 64, 16, 1, KEEL_DTYPE_F32, 0);
        keel_context *cs[2] = {c, r};
        for (int k = 0; k < 2; k++) {
            keel_batch p = {12, prompt, NULL, NULL, NULL};
            assert_ok(keel_decode(cs[k], &p));
            for (int32_t q = 1; q < n_seq; q++)
                assert_ok(keel_mem_seq_cp(keel_context_memory(cs[k]), 0, q, -1, -1));
        }
        /* one batch: one token for each sequence */
        int32_t seq[3] = {0, 1, 2};
        int8_t lg[3] = {1, 1, 1};
        keel_batch one = {n_seq, next, NULL, seq, lg};
        keel_status st = keel_decode(c, &one);
        if (st != KEEL_OK) fail_msg("fork of %d, one batch: %s", n_seq, keel_context_last_error(c));
        keel_mem *mem = keel_context_memory(c);
        assert_ok(keel_mem_check(mem));
        /* the reference: one sequence at a time */
        for (int32_t q = 0; q < n_seq; q++) {
            keel_batch b = {1, &next[q], NULL, &seq[q], NULL};
            assert_ok(keel_decode(r, &b));
            assert_int_equal(keel_mem_seq_pos_max(mem, q), 12);
            double e = rel_diff(keel_logits(c, q), keel_logits(r, 0), V);
            if (!(e <= 2e-5)) fail_msg("sequence %d: one batch vs one at a time differ by %.3g", q, e);
            /* and a fresh recomputation of the prompt and the token */
            int32_t all[13];
            memcpy(all, prompt, sizeof prompt);
            all[12] = next[q];
            keel_mem_clear(keel_context_memory(f));
            keel_batch fb = {13, all, NULL, NULL, NULL};
            assert_ok(keel_decode(f, &fb));
            e = rel_diff(keel_logits(c, q), keel_logits(f, 12), V);
            if (!(e <= 2e-5)) fail_msg("sequence %d: one batch vs recomputation differ by %.3g", q, e);
        }
        keel_context_close(c);
        keel_context_close(r);
        keel_context_close(f);
    }
    keel_model_close(m);
}

/* Issue 26 item 3 (a): checkpoint_every 8, a batch over sequences
 * 2,2,2,2,0,1 (1 a fork of 0): the periodic cut puts 0 and 1 in a later
 * ubatch; it used to fail there with sequence 2 already advanced. Now the
 * batch runs whole and equals the same tokens fed one sequence at a time. */
static void test_fork_checkpoint_cut(void **state)
{
    (void)state;
    keel_model *m = gen_model("qwen35", 4, 128, 4, 2, 32, 9);
    keel_model_info mi;
    keel_model_info_get(m, &mi);
    size_t V = (size_t)mi.n_vocab;
    int32_t p0[10], p2[6];
    for (int i = 0; i < 10; i++) p0[i] = 3 + (i * 61) % 280;
    for (int i = 0; i < 6; i++) p2[i] = 9 + (i * 43) % 270;
    keel_context *c = ctx(m, 64, 16, 3, KEEL_DTYPE_F32, 8);
    keel_context *r = ctx(m, 64, 16, 3, KEEL_DTYPE_F32, 8);
    keel_context *cs[2] = {c, r};
    for (int k = 0; k < 2; k++) {
        keel_batch a = {10, p0, NULL, NULL, NULL};
        assert_ok(keel_decode(cs[k], &a));
        assert_ok(keel_mem_seq_cp(keel_context_memory(cs[k]), 0, 1, -1, -1));
        int32_t s2[6] = {2, 2, 2, 2, 2, 2};
        keel_batch b = {6, p2, NULL, s2, NULL};
        assert_ok(keel_decode(cs[k], &b));
    }
    keel_mem *mem = keel_context_memory(c);
    assert_int_equal(keel_mem_seq_pos_max(mem, 2), 5);
    int32_t toks[6] = {50, 51, 52, 53, 60, 61}, seq[6] = {2, 2, 2, 2, 0, 1};
    int8_t lg[6] = {0, 0, 0, 1, 1, 1};
    keel_batch b = {6, toks, NULL, seq, lg};
    keel_status st = keel_decode(c, &b);
    if (st != KEEL_OK) fail_msg("batch 2,2,2,2,0,1: %s", keel_context_last_error(c));
    assert_ok(keel_mem_check(mem));
    assert_int_equal(keel_mem_seq_pos_max(mem, 2), 9);
    assert_int_equal(keel_mem_seq_pos_max(mem, 0), 10);
    assert_int_equal(keel_mem_seq_pos_max(mem, 1), 10);
    /* sequence 2 (a prompt of 4 tokens): checkpoints at 8 and at its end 10 */
    keel_mem_ckpt_info info[8];
    int32_t n = 0;
    keel_mem_ckpt_list(mem, 2, info, 8, &n);
    assert_true(n >= 2);
    assert_int_equal(info[n - 2].pos, 8);
    assert_int_equal(info[n - 1].pos, 10);
    /* the reference: the same tokens, one sequence per call */
    keel_batch r2 = {4, toks, NULL, seq, NULL};
    assert_ok(keel_decode(r, &r2));
    double e = rel_diff(keel_logits(c, 3), keel_logits(r, 3), V);
    for (int q = 0; q < 2; q++) {
        keel_batch rq = {1, &toks[4 + q], NULL, &seq[4 + q], NULL};
        assert_ok(keel_decode(r, &rq));
        double eq = rel_diff(keel_logits(c, 4 + q), keel_logits(r, 0), V);
        e = eq > e ? eq : e;
    }
    if (!(e <= 2e-5)) fail_msg("batch vs one sequence at a time: %.3g", e);
    keel_context_close(c);
    keel_context_close(r);
    keel_model_close(m);
}

/* Issue 23: nemotron_h's fixture (Mamba2 layers 0 and 2, attention without
 * RoPE at 3, ReLU^2 MLPs at 1 and 4) in a conversation: a rewind to a
 * checkpoint followed by the rest of the prompt answers as a fresh prefill
 * (the same ubatch cuts and, with n_ctx 200, the same cells: bitwise;
 * in other cells within float rounding), both continue with llama.cpp's
 * 64 greedy tokens, and so does the rewound conversation's session loaded
 * into another context. */
#define NH_PROMPT 200
#define NH_GREEDY 64

/* Feeds toks[from, n) in batches of 64 cut at multiples of 64; the last logit row. */
static const float *nh_feed(keel_context *c, const int32_t *toks, int32_t from, int32_t n)
{
    int32_t i = from;
    while (i < n) {
        int32_t k = MIN_((i / 64 + 1) * 64, n) - i;
        keel_batch b = {k, toks + i, NULL, NULL, NULL};
        keel_status st = keel_decode(c, &b);
        if (st != KEEL_OK) fail_msg("decode: %s", keel_context_last_error(c));
        i += k;
    }
    return keel_logits(c, (n - 1) % 64);
}

static void nh_greedy(keel_context *c, const float *l, int32_t n_vocab, int32_t *out)
{
    for (int t = 0; t < NH_GREEDY; t++) {
        int32_t best = 0;
        for (int32_t v = 1; v < n_vocab; v++)
            if (l[v] > l[best]) best = v;
        out[t] = best;
        keel_batch g = {1, &out[t], NULL, NULL, NULL};
        assert_ok(keel_decode(c, &g));
        l = keel_logits(c, 0);
    }
}

static void test_nemotron_h_fixture_conversation(void **state)
{
    (void)state;
    const char *mp_path = test_fixture("models/nemotronh.gguf");
    if (!mp_path) return;
    char path[1024];
    snprintf(path, sizeof path, "%s", mp_path);
    size_t n = 0;
    int32_t *prompt = test_read_file(test_fixture("ref/nemotronh.prompt.i32"), &n);
    assert_int_equal(n, NH_PROMPT * sizeof(int32_t));
    int32_t *gref = test_read_file(test_fixture("ref/nemotronh.greedy.i32"), &n);
    assert_int_equal(n, NH_GREEDY * sizeof(int32_t));
    keel_model_params mp = keel_model_params_default();
    mp.path = path;
    keel_model *m = NULL;
    char err[256] = "";
    assert_ok(keel_model_open(&mp, &m, err));
    keel_model_info mi;
    keel_model_info_get(m, &mi);
    assert_int_equal(mi.n_recurrent_layers, 2);
    size_t V = (size_t)mi.n_vocab;
    /* a conversation that went elsewhere after 150 tokens, rewound */
    int32_t other[NH_PROMPT];
    memcpy(other, prompt, sizeof other);
    for (int i = 150; i < NH_PROMPT; i++) other[i] = 3 + (i * 37) % 500;
    float *lr = malloc(V * sizeof(float)), *lfr = malloc(V * sizeof(float));
    keel_context *a = NULL, *f = NULL;
    for (int pass = 0; pass < 2; pass++) {
        /* pass 0: n_ctx 200, so the rewound tokens land in the cells they
         * had and attention sums in the fresh prefill's order: bitwise;
         * pass 1: room for the answer, the rewound tokens in other cells
         * (float rounding of the one attention layer's sums) */
        int32_t n_ctx = pass == 0 ? NH_PROMPT : 512;
        keel_context_close(a);
        keel_context_close(f);
        a = ctx(m, n_ctx, 64, 1, KEEL_DTYPE_F16, 32);
        f = ctx(m, n_ctx, 64, 1, KEEL_DTYPE_F16, 32);
        nh_feed(a, other, 0, NH_PROMPT);
        int32_t resume = -1;
        assert_ok(keel_context_rewind(a, 0, 150, &resume));
        assert_int_equal(resume, 128); /* the newest checkpoint at or before 150 */
        memcpy(lr, nh_feed(a, prompt, resume, NH_PROMPT), V * sizeof(float));
        memcpy(lfr, nh_feed(f, prompt, 0, NH_PROMPT), V * sizeof(float));
        assert_ok(keel_mem_check(keel_context_memory(a)));
        double e = rel_diff(lr, lfr, V);
        printf("nemotronh n_ctx %d: rewound to %d (checkpoint) vs fresh prefill: max |dlogit| / max|logit| %.2e\n",
               n_ctx, resume, e);
        if (pass == 0) assert_memory_equal(lr, lfr, V * sizeof(float));
        assert_true(e <= 1e-6);
    }
    /* the session of the rewound conversation, loaded elsewhere */
    char sess[64];
    assert_true(test_temp_file(sess, sizeof sess, "nh_sess"));
    assert_ok(keel_session_save(a, 0, prompt, NH_PROMPT, 0, sess));
    keel_context *s = ctx(m, 512, 64, 1, KEEL_DTYPE_F16, 32);
    int32_t back[NH_PROMPT], nt = 0;
    assert_ok(keel_session_load(s, 0, sess, 0, back, NH_PROMPT, &nt, NULL));
    unlink(sess);
    assert_int_equal(nt, NH_PROMPT);
    assert_memory_equal(back, prompt, sizeof back);
    int32_t ga[NH_GREEDY], gf[NH_GREEDY], gs[NH_GREEDY];
    nh_greedy(a, lr, mi.n_vocab, ga);
    nh_greedy(f, lfr, mi.n_vocab, gf);
    /* the loaded session has no logits: it continues from the rewound
     * conversation's first answer token */
    float *last = lr;
    gs[0] = ga[0];
    keel_batch g0 = {1, &gs[0], NULL, NULL, NULL};
    assert_ok(keel_decode(s, &g0));
    memcpy(last, keel_logits(s, 0), V * sizeof(float));
    for (int t = 1; t < NH_GREEDY; t++) {
        int32_t best = 0;
        for (size_t v = 1; v < V; v++)
            if (last[v] > last[best]) best = (int32_t)v;
        gs[t] = best;
        keel_batch g = {1, &gs[t], NULL, NULL, NULL};
        assert_ok(keel_decode(s, &g));
        memcpy(last, keel_logits(s, 0), V * sizeof(float));
    }
    assert_memory_equal(ga, gref, sizeof ga);
    assert_memory_equal(gf, gref, sizeof gf);
    assert_memory_equal(gs, gref, sizeof gs);
    assert_ok(keel_mem_check(keel_context_memory(s)));
    printf("nemotronh: llama.cpp's 64 greedy tokens after the rewind, fresh, and from the loaded session\n");
    free(lfr);
    free(lr);
    free(prompt);
    free(gref);
    keel_context_close(a);
    keel_context_close(f);
    keel_context_close(s);
    keel_model_close(m);
}

/* Issue 23: a conversation on lfm2 (the fixture if present, else
 * generated; f16 K/V, checkpoints every 64): a 200-token prompt and 16
 * greedy tokens, then the same conversation edited at 150 (the user
 * rewrote the last turn). keel_context_rewind resumes from the checkpoint
 * at 128 (the conv states restored with the attention rows) and the
 * answer is the one a fresh context prefilling the edited prompt gives:
 * the same 16 greedy tokens, every logit row within 1e-5 of max |logit|
 * (the states and K/V rows are the same bytes; the new tokens sit in other
 * cells than the fresh context's, after the first answer's, so attention
 * sums in another order: test_checkpoint_restore_equals_recompute, whose
 * cells coincide, is bitwise). A rewind at the end keeps everything; one
 * below the first checkpoint starts from scratch. */
static void test_lfm2_conversation_rewind(void **state)
{
    (void)state;
    keel_model *m = NULL;
    const char *p = test_fixture("models/lfm2.gguf");
    if (p) {
        keel_model_params mp = keel_model_params_default();
        mp.path = p;
        char err[256] = "";
        if (keel_model_open(&mp, &m, err) != KEEL_OK) fail_msg("open lfm2: %s", err);
    } else {
        m = gen_model("lfm2", 4, 128, 4, 2, 32, 13);
    }
    keel_model_info mi;
    keel_model_info_get(m, &mi);
    size_t V = (size_t)mi.n_vocab;
    enum { N = 200, CUT = 150, GEN = 16 };
    int32_t a_[N], b_[N];
    for (int i = 0; i < N; i++) a_[i] = b_[i] = 3 + (i * 131) % (mi.n_vocab - 3);
    for (int i = CUT; i < N; i++) b_[i] = 5 + (i * 71) % (mi.n_vocab - 5);
    keel_context *c = ctx(m, 512, N, 1, KEEL_DTYPE_F16, 64);
    feed(c, a_, 0, N);
    int32_t tok = 0;
    for (int t = 0; t < GEN; t++) { /* the first answer, then the edit */
        const float *l = keel_logits(c, t == 0 ? N - 1 : 0);
        tok = 0;
        for (size_t v = 1; v < V; v++)
            if (l[v] > l[tok]) tok = (int32_t)v;
        keel_batch g = {1, &tok, NULL, NULL, NULL};
        assert_ok(keel_decode(c, &g));
    }
    keel_mem *mem = keel_context_memory(c);
    int32_t resume = -1;
    assert_ok(keel_context_rewind(c, 0, CUT, &resume));
    assert_int_equal(resume, 128);
    assert_int_equal(keel_mem_seq_pos_max(mem, 0), 127);
    assert_ok(keel_mem_check(mem));
    keel_context *f = ctx(m, 512, N, 1, KEEL_DTYPE_F16, 64);
    feed(c, b_, resume, N);
    feed(f, b_, 0, N);
    double worst = 0.0;
    for (int t = 0; t < GEN; t++) {
        const float *lc = keel_logits(c, t == 0 ? N - resume - 1 : 0);
        const float *lf = keel_logits(f, t == 0 ? N - 1 : 0);
        worst = fmax(worst, rel_diff(lc, lf, V));
        int32_t tc = 0, tf = 0;
        for (size_t v = 1; v < V; v++) {
            if (lc[v] > lc[tc]) tc = (int32_t)v;
            if (lf[v] > lf[tf]) tf = (int32_t)v;
        }
        if (tc != tf) fail_msg("answer token %d: %d after the rewind, %d from a fresh prefill", t, tc, tf);
        keel_batch gc = {1, &tc, NULL, NULL, NULL}, gf = {1, &tf, NULL, NULL, NULL};
        assert_ok(keel_decode(c, &gc));
        assert_ok(keel_decode(f, &gf));
    }
    if (!(worst <= 1e-5)) fail_msg("rewound answer vs fresh prefill: %.3g of max |logit|", worst);
    assert_ok(keel_mem_check(mem));
    /* nothing to cut: everything kept */
    int32_t end = keel_mem_seq_pos_max(mem, 0) + 1;
    assert_ok(keel_context_rewind(c, 0, end, &resume));
    assert_int_equal(resume, end);
    /* below the oldest checkpoint (64): from scratch */
    assert_ok(keel_context_rewind(c, 0, 40, &resume));
    assert_int_equal(resume, 0);
    assert_int_equal(keel_mem_seq_pos_max(mem, 0), -1);
    printf("lfm2 (%s): rewound to %d, resumed at 128: %d answer tokens as a fresh prefill, logits "
           "within %.2e of max |logit|\n", p ? "fixture" : "generated", CUT, GEN, worst);
    keel_context_close(c);
    keel_context_close(f);
    keel_model_close(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_and_params),
        cmocka_unit_test(test_work_arena_threads),
        cmocka_unit_test(test_selforacle_hybrids),
        cmocka_unit_test(test_checkpoint_restore_equals_recompute),
        cmocka_unit_test(test_shift_regression_hybrid),
        cmocka_unit_test(test_agent_pattern),
        cmocka_unit_test(test_fork_one_batch),
        cmocka_unit_test(test_fork_checkpoint_cut),
        cmocka_unit_test(test_lfm2_conversation_rewind),
        cmocka_unit_test(test_nemotron_h_fixture_conversation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
