/*
 * test_deepseek2.c — what is deepseek2's own (issue 23), beyond the fixture
 * rows test_model.c checks against llama.cpp:
 *   - YaRN's attention-scale correction (arch_deepseek2.c) on generated
 *     deepseek2 and deepseek32 models: with YaRN's ramp made all
 *     extrapolation (beta_fast = beta_slow = 1e-6: every dimension keeps
 *     its unscaled angle, the RoPE magnitude is 1), the model equals the
 *     same model without RoPE scaling whose queries are multiplied by
 *     mscale^2 = (1 + 0.1 mscale_all_dim ln factor)^2 (through
 *     attn_q_a_norm, which scales q_nope and q_pe alike);
 *   - the fixture's feature checks from its README: without expert groups
 *     (count 1) or without the selection bias the logits move as far from
 *     the reference as llama.cpp's own did (3.4 and 3.8, to 0.1);
 *   - a quantized V column beside the f16 K rows of the MLA cache;
 *   - load errors naming the key or tensor (the fixture rewritten with one
 *     defect each).
 * Fixture parts are skipped with a message when ../shared/fixtures is
 * absent; the YaRN part runs anywhere.
 */
#include "testutil.h"
#include "model/gguf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N_PROMPT 200
#define N_VOCAB  512

/* One change for rewrite(): a key set (added when absent) to a raw value
 * (type + payload as in a file), or every f32 element of the tensors
 * whose names end with `tensor` multiplied by `scale`. */
typedef struct change {
    const char *key;
    gguf_type type;
    const void *payload;
    size_t nbytes;
    const char *tensor;
    float scale;
} change;

/* src with the n changes applied, written to dst. */
static void rewrite(const char *src, const char *dst, const change *c, int n)
{
    gguf *g = NULL;
    char err[BASE_ERR_CAP] = "";
    keel_status st = gguf_open_file(src, &g, err);
    if (st) fail_msg("open %s: %s", src, err);
    gguf_writer *w;
    assert_ok(gguf_writer_open(&w));
    if (gguf_alignment(g) != GGUF_DEFAULT_ALIGNMENT)
        assert_ok(gguf_writer_set_alignment(w, (uint32_t)gguf_alignment(g)));
    bool done[8] = {false};
    assert_true(n <= 8);
    for (int64_t i = 0; i < gguf_n_kv(g); i++) {
        const char *k = gguf_key_at(g, i);
        const gguf_value *v = gguf_value_at(g, i);
        if (strcmp(k, "general.alignment") == 0) continue;
        int hit = -1;
        for (int j = 0; j < n; j++)
            if (c[j].key && strcmp(k, c[j].key) == 0) hit = j;
        if (hit >= 0) {
            assert_ok(gguf_writer_add_raw(w, k, c[hit].type, c[hit].payload, c[hit].nbytes));
            done[hit] = true;
            continue;
        }
        size_t head = v->type == GGUF_TYPE_STRING ? 8 : v->type == GGUF_TYPE_ARRAY ? 12 : 0;
        assert_ok(gguf_writer_add_raw(w, k, v->type, v->data - head, v->nbytes + head));
    }
    for (int j = 0; j < n; j++)
        if (c[j].key && !done[j])
            assert_ok(gguf_writer_add_raw(w, c[j].key, c[j].type, c[j].payload, c[j].nbytes));
    float *bufs[16] = {NULL};
    int nb = 0;
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        const void *data = t->data;
        for (int j = 0; j < n; j++) {
            size_t tl = c[j].tensor ? strlen(c[j].tensor) : 0;
            if (!tl || t->name_len < tl || strcmp(t->name + t->name_len - tl, c[j].tensor) != 0)
                continue;
            assert_int_equal(t->dtype, KEEL_DTYPE_F32);
            assert_true(nb < 16);
            float *p = malloc(t->nbytes);
            memcpy(p, t->data, t->nbytes);
            for (size_t e = 0; e < t->nbytes / sizeof(float); e++)
                p[e] *= c[j].scale;
            bufs[nb++] = p;
            data = p;
        }
        assert_ok(gguf_writer_add_tensor(w, t->name, t->dtype, t->n_dims, t->ne, data, t->nbytes));
    }
    st = gguf_writer_write_path(w, dst);
    if (st) fail_msg("write %s: %s", dst, gguf_writer_last_error(w));
    for (int j = 0; j < nb; j++)
        free(bufs[j]);
    gguf_writer_close(w);
    gguf_close(g);
}

/* A GGUF string payload: u64 length, then the bytes. */
static size_t gguf_str(char *buf, size_t cap, const char *s)
{
    uint64_t n = strlen(s);
    assert_true(8 + n <= cap);
    memcpy(buf, &n, 8);
    memcpy(buf + 8, s, n);
    return 8 + n;
}

static keel_model *open_path(const char *path)
{
    keel_model_params mp = keel_model_params_default();
    mp.path = path;
    keel_model *m = NULL;
    char err[256] = "";
    keel_status st = keel_model_open(&mp, &m, err);
    if (st != KEEL_OK) fail_msg("open %s: %s", path, err);
    return m;
}

/* Logits of every position of toks[0..n) in one batch, f32 or the given
 * K and V types, into out [n][n_vocab]. */
static void logits_of(keel_model *m, const int32_t *toks, int n, keel_dtype tk, keel_dtype tv,
                      float *out)
{
    keel_model_info mi;
    keel_model_info_get(m, &mi);
    keel_context_params cp = keel_context_params_default();
    cp.n_ctx = 512;
    cp.n_batch = cp.n_ubatch = cp.n_outputs = n;
    cp.type_k = tk;
    cp.type_v = tv;
    cp.n_threads = 2;
    keel_context *c = NULL;
    char err[256] = "";
    keel_status st = keel_context_open(m, &cp, &c, err);
    if (st != KEEL_OK) fail_msg("context: %s", err);
    int8_t flags[N_PROMPT];
    memset(flags, 1, sizeof flags);
    keel_batch b = {n, toks, NULL, NULL, flags};
    assert_ok(keel_decode(c, &b));
    for (int i = 0; i < n; i++)
        memcpy(out + (size_t)i * (size_t)mi.n_vocab, keel_logits(c, i),
               (size_t)mi.n_vocab * sizeof(float));
    keel_context_close(c);
}

static double max_diff(const float *a, const float *b, size_t n)
{
    double d = 0.0;
    for (size_t i = 0; i < n; i++)
        d = fmax(d, fabs((double)a[i] - (double)b[i]));
    return d;
}

static void test_yarn_attention_scale(void **state)
{
    (void)state;
    const char *archs[2] = {"deepseek2", "deepseek32"};
    const float log_mul[2] = {0.0707f, 0.1f}; /* V2's mscale_all_dim 0.707, V3's 1 (x 0.1) */
    const float factor = 40.0f;
    int32_t toks[40];
    for (int i = 0; i < 40; i++)
        toks[i] = 3 + (i * 131) % 290;
    for (int a = 0; a < 2; a++) {
        char yarn[64], none[64], scaled[64], tmp[64];
        assert_true(test_temp_file(yarn, sizeof yarn, "ds2_yarn"));
        assert_true(test_temp_file(none, sizeof none, "ds2_none"));
        assert_true(test_temp_file(scaled, sizeof scaled, "ds2_scaled"));
        assert_true(test_temp_file(tmp, sizeof tmp, "ds2_tmp"));
        keel_gen_params gp = keel_gen_params_default();
        gp.arch = archs[a];
        gp.n_layer = 3;
        gp.n_embd = 128;
        gp.yarn_factor = factor;
        gp.yarn_log_mul = log_mul[a];
        gp.seed = 7;
        char err[256] = "";
        if (keel_gen_model(&gp, tmp, err) != KEEL_OK) fail_msg("gen %s: %s", archs[a], err);
        /* the ramp all extrapolation: corr_dim(1e-6) > n_rot - 1 */
        static const float tiny = 1e-6f;
        char key[2][96], tkey[96];
        snprintf(key[0], sizeof key[0], "%s.rope.scaling.yarn_beta_fast", archs[a]);
        snprintf(key[1], sizeof key[1], "%s.rope.scaling.yarn_beta_slow", archs[a]);
        change betas[2] = {{key[0], GGUF_TYPE_FLOAT32, &tiny, 4, NULL, 0},
                           {key[1], GGUF_TYPE_FLOAT32, &tiny, 4, NULL, 0}};
        rewrite(tmp, yarn, betas, 2);
        char sbuf[32];
        size_t sn = gguf_str(sbuf, sizeof sbuf, "none");
        snprintf(tkey, sizeof tkey, "%s.rope.scaling.type", archs[a]);
        change off = {tkey, GGUF_TYPE_STRING, sbuf, sn, NULL, 0};
        rewrite(yarn, none, &off, 1);
        /* llama.cpp's kq_scale factor, in f32 as it computes it */
        float L = log_mul[a] / 0.1f, ms = 1.0f + 0.1f * L * logf(factor);
        change sc[2] = {off, {NULL, 0, NULL, 0, "attn_q_a_norm.weight", ms * ms}};
        rewrite(yarn, scaled, sc, 2);
        keel_model *my = open_path(yarn), *mn = open_path(none), *ms_ = open_path(scaled);
        size_t V = 512, n = 40;
        float *ly = malloc(n * V * sizeof(float)), *ln = malloc(n * V * sizeof(float));
        float *ls = malloc(n * V * sizeof(float));
        logits_of(my, toks, (int)n, KEEL_DTYPE_F32, KEEL_DTYPE_F32, ly);
        logits_of(mn, toks, (int)n, KEEL_DTYPE_F32, KEEL_DTYPE_F32, ln);
        logits_of(ms_, toks, (int)n, KEEL_DTYPE_F32, KEEL_DTYPE_F32, ls);
        double d_scaled = max_diff(ly, ls, n * V), d_none = max_diff(ly, ln, n * V);
        printf("%-10s YaRN factor %g, mscale_all_dim %g: vs queries x mscale^2 = %.4f: max "
               "|dlogit| %.2e; "
               "vs no scaling %.2e\n",
               archs[a], (double)factor, (double)L, (double)(ms * ms), d_scaled, d_none);
        /* f32 throughout: only where the factor enters the sums differs */
        assert_true(d_scaled <= 1e-4);
        assert_true(d_none >= 1e-2);
        free(ly);
        free(ln);
        free(ls);
        keel_model_close(my);
        keel_model_close(mn);
        keel_model_close(ms_);
        unlink(yarn);
        unlink(none);
        unlink(scaled);
        unlink(tmp);
    }
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

/* The README's feature checks, and a quantized V column. */
static void test_fixture_features(void **state)
{
    (void)state;
    int32_t *prompt = read_i32("ref/deepseek2.prompt.i32", N_PROMPT);
    if (!prompt) return;
    char model[512], nogroups[64], nobias[64];
    snprintf(model, sizeof model, "%s", test_fixture("models/deepseek2.gguf"));
    size_t n = 0;
    float *ref = test_read_file(test_fixture("ref/deepseek2.logits.f32"), &n);
    assert_int_equal(n, (size_t)N_PROMPT * N_VOCAB * sizeof(float));
    assert_true(test_temp_file(nogroups, sizeof nogroups, "ds2_ng"));
    assert_true(test_temp_file(nobias, sizeof nobias, "ds2_nb"));
    static const uint32_t one = 1;
    change ng = {"deepseek2.expert_group_count", GGUF_TYPE_UINT32, &one, 4, NULL, 0};
    rewrite(model, nogroups, &ng, 1);
    change nb = {NULL, 0, NULL, 0, "exp_probs_b.bias", 0.0f};
    rewrite(model, nobias, &nb, 1);
    float *got = malloc((size_t)N_PROMPT * N_VOCAB * sizeof(float));
    const char *paths[2] = {nogroups, nobias};
    const char *what[2] = {"without expert groups", "without exp_probs_b"};
    for (int k = 0; k < 2; k++) {
        keel_model *m = open_path(paths[k]);
        logits_of(m, prompt, N_PROMPT, KEEL_DTYPE_F16, KEEL_DTYPE_F16, got);
        double d = max_diff(got, ref, (size_t)N_PROMPT * N_VOCAB);
        const double theirs = k ? 3.8 : 3.4; /* the README's, rounded to 0.1 */
        printf("deepseek2 %s: max |dlogit| vs llama.cpp %.2f (its own: %.1f)\n", what[k], d,
               theirs);
        assert_true(fabs(d - theirs) <= 0.1);
        keel_model_close(m);
        unlink(paths[k]);
    }
    /* V stored quantized beside f16 K rows (K's 80 dims take no 32-block
     * type; llama.cpp's MLA cache has no V of its own, so there is no
     * reference). Measured: q8_0 <= 0.04 on every row but one, where the
     * rounding swaps two near-tied experts (row 185: 2.07; the README
     * rejected seeds for such flips); argmax flips only at near-ties
     * (top1 - top2 of the reference below twice the row's difference). At
     * most one row beyond the bound, and no flip elsewhere. (q4_0 V moves
     * 55 of the 200 rows by more than 0.25: routing flips cascade through
     * the two MoE layers of this deliberately tie-prone model.) */
    keel_model *m = open_path(model);
    const keel_dtype vt[1] = {KEEL_DTYPE_Q8_0};
    const double tol[1] = {6e-2};
    for (int k = 0; k < 1; k++) {
        logits_of(m, prompt, N_PROMPT, KEEL_DTYPE_F16, vt[k], got);
        double kept = 0.0;
        int over = 0, ties = 0;
        for (int i = 0; i < N_PROMPT; i++) {
            const float *a = got + (size_t)i * N_VOCAB, *b = ref + (size_t)i * N_VOCAB;
            double rd = max_diff(a, b, N_VOCAB);
            int ia = 0, ib = 0, ib2 = -1;
            for (int j = 1; j < N_VOCAB; j++)
                if (a[j] > a[ia]) ia = j;
            for (int j = 1; j < N_VOCAB; j++)
                if (b[j] > b[ib]) ib = j;
            for (int j = 0; j < N_VOCAB; j++)
                if (j != ib && (ib2 < 0 || b[j] > b[ib2])) ib2 = j;
            if (rd > tol[k]) {
                over++;
                continue;
            }
            kept = fmax(kept, rd);
            if (ia != ib) {
                ties++;
                if (!((double)b[ib] - (double)b[ib2] <= 2.0 * rd))
                    fail_msg(
                        "V %s: row %d argmax %d, reference %d (margin %.4f, row differs by %.4f)",
                        keel_dtype_name(vt[k]), i, ia, ib, (double)(b[ib] - b[ib2]), rd);
            }
        }
        printf("deepseek2 K f16, V %s: max |dlogit| vs llama.cpp's f16 %.3e on all rows but %d "
               "(tol %.0e); "
               "%d argmax flips at near-ties\n",
               keel_dtype_name(vt[k]), kept, over, tol[k], ties);
        assert_true(over <= 1);
    }
    keel_model_close(m);
    free(got);
    free(ref);
    free(prompt);
}

static void expect_refused(const char *path, keel_status want, const char *msg)
{
    keel_model_params mp = keel_model_params_default();
    mp.path = path;
    keel_model *m = (keel_model *)1;
    char err[256] = "";
    keel_status st = keel_model_open(&mp, &m, err);
    if (st == KEEL_OK) keel_model_close(m);
    if (st != want || !strstr(err, msg))
        fail_msg("%s '%s', want %s '%s'", keel_status_name(st), err, keel_status_name(want), msg);
    assert_null(m);
}

/* Each of deepseek2's keys and tensors checked at load, named. */
static void test_fixture_validation(void **state)
{
    (void)state;
    const char *fx = test_fixture("models/deepseek2.gguf");
    if (!fx) return;
    char model[512], bad[64];
    snprintf(model, sizeof model, "%s", fx);
    assert_true(test_temp_file(bad, sizeof bad, "ds2_bad"));
    static const uint32_t three = 3, four = 4, zero = 0, odd = 47, nine = 9, eight = 8;
    static const float neg = -1.0f, temp = 0.5f, factor = 4.0f, nanv = NAN;
    char lin[32];
    size_t ln = gguf_str(lin, sizeof lin, "linear");
    const struct {
        change c[2];
        int n;
        keel_status st;
        const char *msg;
    } cases[] = {
        {{{"deepseek2.expert_group_count", GGUF_TYPE_UINT32, &three, 4, NULL, 0}},
         1,
         KEEL_EFORMAT,
         "deepseek2: expert_group_count 3 / expert_group_used_count 2 with expert_count 8"},
        {{{"deepseek2.expert_group_used_count", GGUF_TYPE_UINT32, &four, 4, NULL, 0}},
         1,
         KEEL_EFORMAT,
         "expert_group_count 4 / expert_group_used_count 4"},
        {{{"deepseek2.expert_group_count", GGUF_TYPE_UINT32, &eight, 4, NULL, 0}},
         1,
         KEEL_EFORMAT,
         "expert_group_count 8 / expert_group_used_count 2 with expert_count 8"},
        {{{"deepseek2.expert_group_count", GGUF_TYPE_UINT32, &nine, 4, NULL, 0}},
         1,
         KEEL_EFORMAT,
         "expert_group_count 9 /"},
        /* q LoRA off (DeepSeek-V2-Lite): a plain attn_q is then needed */
        {{{"deepseek2.attention.q_lora_rank", GGUF_TYPE_UINT32, &zero, 4, NULL, 0}},
         1,
         KEEL_ENOENT,
         "blk.0.attn_q.weight"},
        {{{"deepseek2.attention.key_length_mla", GGUF_TYPE_UINT32, &odd, 4, NULL, 0}},
         1,
         KEEL_EFORMAT,
         "key_length_mla 47 > rope dims and even"},
        {{{"deepseek2.expert_gating_func", GGUF_TYPE_UINT32, &three, 4, NULL, 0}},
         1,
         KEEL_EFORMAT,
         "key deepseek2.expert_gating_func = 3 out of range [1, 2]"},
        {{{"deepseek2.rope.scaling.yarn_log_mul", GGUF_TYPE_FLOAT32, &neg, 4, NULL, 0}},
         1,
         KEEL_EFORMAT,
         "key deepseek2.rope.scaling.yarn_log_mul = -1: outside [0, 100]"},
        {{{"deepseek2.attention.temperature_scale", GGUF_TYPE_FLOAT32, &temp, 4, NULL, 0}},
         1,
         KEEL_EUNSUPPORTED,
         "key deepseek2.attention.temperature_scale = 0.5: attention temperature tuning"},
        {{{"deepseek2.rope.scaling.type", GGUF_TYPE_STRING, lin, ln, NULL, 0},
          {"deepseek2.rope.scaling.factor", GGUF_TYPE_FLOAT32, &factor, 4, NULL, 0}},
         2,
         KEEL_EUNSUPPORTED,
         "deepseek2: linear RoPE scaling (factor 4) is not implemented"},
        {{{"deepseek2.nextn_predict_layers", GGUF_TYPE_UINT32, &three, 4, NULL, 0}},
         1,
         KEEL_EFORMAT,
         "key deepseek2.nextn_predict_layers = 3 out of range [0, 2]"},
        {{{NULL, 0, NULL, 0, "blk.2.exp_probs_b.bias", nanv}},
         1,
         KEEL_EFORMAT,
         "tensor blk.2.exp_probs_b.bias: element 0 is NaN"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        rewrite(model, bad, cases[i].c, cases[i].n);
        expect_refused(bad, cases[i].st, cases[i].msg);
    }
    /* MTP blocks after the trunk: the last block is left unused, the rest runs */
    static const uint32_t one = 1;
    change mtp = {"deepseek2.nextn_predict_layers", GGUF_TYPE_UINT32, &one, 4, NULL, 0};
    rewrite(model, bad, &mtp, 1);
    keel_model *m = open_path(bad);
    keel_model_info mi;
    keel_model_info_get(m, &mi);
    assert_int_equal(mi.n_layer, 2);
    assert_int_equal(mi.n_expert_groups, 4);
    assert_int_equal(mi.n_group_used, 2);
    assert_true(mi.expert_sigmoid);
    keel_model_close(m);
    unlink(bad);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_yarn_attention_scale),
        cmocka_unit_test(test_fixture_features),
        cmocka_unit_test(test_fixture_validation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
