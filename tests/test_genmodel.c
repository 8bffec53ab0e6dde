/*
 * test_genmodel.c — keel_gen_model / keel gen-model: every key, tensor
 * name, shape and dtype llama.cpp expects for llama, qwen2, qwen3 and
 * gemma2 across weight dtypes (with per-tensor fallbacks), weight
 * statistics, byte-exact determinism, the generated vocabularies (they open
 * as tokenizers, round-trip English and Unicode text, compress English,
 * every SPM piece is reachable by a merge, every BPE merge is consistent),
 * parameter validation naming the field, allocation failures, and the CLI.
 */
#include "testutil.h"
#include "base/base.h"
#include "model/gguf.h"
#include "tensor/tensor.h"
#include "text/tokenizer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const g_archs[4] = {"llama", "qwen2", "qwen3", "gemma2"};

static const char g_text[] =
    "Once upon a time, there was a little girl who liked to read books in the garden.\n"
    "\t\tTabs\tand  multiple   spaces    here.\r\n"
    "Chinese: \xe4\xbd\xa0\xe5\xa5\xbd\xef\xbc\x8c\xe4\xb8\x96\xe7\x95\x8c\xe3\x80\x82 "
    "Japanese: \xe3\x81\x93\xe3\x82\x93\xe3\x81\xab\xe3\x81\xa1\xe3\x81\xaf "
    "Emoji: \xf0\x9f\x8e\x89\xf0\x9f\x9a\x80 \xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9 "
    "caf\xc3\xa9 na\xc3\xafve M\xc3\xbcnchen e\xcc\x81\n"
    "Numbers 1234567 and 3.14159, code: if (x<=y) { return a_b->c; } // done\n"
    "Quotes: 'single' \"double\" it's we're they'll I'd\n"
    "   leading spaces and trailing   \n\n\nend";

static const char g_english[] =
    "The old man opened the box and showed her the letters his mother had written to her "
    "sister every week for many years.";

/* ---- helpers -------------------------------------------------------------------- */

/* A fresh temporary path (the file is created empty by mkstemp). */
static void temp_path(char *path, size_t cap)
{
    snprintf(path, cap, "/tmp/keel_genmodel_XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
}

static gguf *gen_open(const keel_gen_params *p, char *path, size_t cap)
{
    char err[BASE_ERR_CAP] = "";
    temp_path(path, cap);
    keel_status st = keel_gen_model(p, path, err);
    if (st) fail_msg("keel_gen_model(%s): %s: %s", p->arch, keel_status_name(st), err);
    gguf *g;
    st = gguf_open_file(path, &g, err);
    if (st) fail_msg("gguf_open_file: %s", err);
    return g;
}

static int64_t get_int(const gguf *g, const char *key)
{
    int64_t v = -1;
    char err[BASE_ERR_CAP];
    if (gguf_get_int(g, key, &v, err)) fail_msg("%s", err);
    return v;
}

static double get_float(const gguf *g, const char *key)
{
    double v = 0;
    char err[BASE_ERR_CAP];
    if (gguf_get_float(g, key, &v, err)) fail_msg("%s", err);
    return v;
}

static void assert_key_str(const gguf *g, const char *key, const char *want)
{
    const char *s;
    size_t n;
    char err[BASE_ERR_CAP];
    if (gguf_get_str(g, key, &s, &n, err)) fail_msg("%s", err);
    if (!gguf_str_eq(s, n, want)) fail_msg("%s = '%.*s', want '%s'", key, (int)n, s, want);
}

static int64_t arch_int(const gguf *g, const char *arch, const char *suffix)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    return get_int(g, key);
}

static double arch_float(const gguf *g, const char *arch, const char *suffix)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    return get_float(g, key);
}

/* The dtype a matrix with rows of n elements must have. */
static keel_dtype want_matrix_dtype(keel_dtype d, int64_t n)
{
    if (n % keel_dtype_block_size(d) == 0) return d;
    if (n % 32 == 0 && d != KEEL_DTYPE_F32 && d != KEEL_DTYPE_F16 && d != KEEL_DTYPE_BF16)
        return KEEL_DTYPE_Q8_0;
    return KEEL_DTYPE_F16;
}

/* Checks one tensor's presence, shape and dtype; returns it. */
static const gguf_tensor *expect_tensor(const gguf *g, const char *name, int64_t ne0, int64_t ne1,
                                        keel_dtype dtype)
{
    const gguf_tensor *t = gguf_find_tensor(g, name);
    if (!t) fail_msg("missing tensor %s", name);
    uint32_t nd = ne1 ? 2 : 1;
    if (t->n_dims != nd || t->ne[0] != ne0 || (ne1 && t->ne[1] != ne1))
        fail_msg("tensor %s: shape [%lld, %lld] (%u dims), want [%lld, %lld]", name,
                 (long long)t->ne[0], (long long)t->ne[1], t->n_dims, (long long)ne0,
                 (long long)ne1);
    if (t->dtype != dtype)
        fail_msg("tensor %s: dtype %s, want %s", name, keel_dtype_name(t->dtype),
                 keel_dtype_name(dtype));
    return t;
}

/* Mean and standard deviation of a tensor's values (dequantized). */
static void tensor_stats(const gguf_tensor *t, double *mean, double *sd)
{
    int64_t n0 = t->ne[0], rows = t->ne[1] * t->ne[2] * t->ne[3];
    float *x = malloc((size_t)n0 * sizeof *x);
    size_t rb = tensor_row_bytes(t->dtype, n0);
    double s = 0, s2 = 0;
    for (int64_t r = 0; r < rows; r++) {
        assert_ok(tensor_dequantize_row(t->dtype, (const uint8_t *)t->data + r * rb, x, n0));
        for (int64_t i = 0; i < n0; i++) {
            assert_true(isfinite(x[i]));
            s += x[i];
            s2 += (double)x[i] * x[i];
        }
    }
    double n = (double)(n0 * rows);
    *mean = s / n;
    *sd = sqrt(s2 / n - *mean * *mean);
    free(x);
}

/* Checks every key and tensor of a generated model against p (resolved
 * defaults computed here independently of the library). */
static void check_model(const gguf *g, const keel_gen_params *p)
{
    const char *arch = p->arch;
    bool qwen2 = strcmp(arch, "qwen2") == 0, qwen3 = strcmp(arch, "qwen3") == 0;
    bool gemma = strcmp(arch, "gemma2") == 0;
    int64_t E = p->n_embd, V = p->n_vocab, L = p->n_layer;
    int64_t D = p->head_dim ? p->head_dim : E / p->n_head;
    int64_t F = p->n_ff ? p->n_ff : 3 * E;
    int64_t Q = p->n_head * D, KV = p->n_head_kv * D;
    keel_dtype d = p->dtype;
    static const struct {
        keel_dtype d;
        int64_t ftype;
    } ftypes[] = {{KEEL_DTYPE_F32, 0},   {KEEL_DTYPE_F16, 1},   {KEEL_DTYPE_Q4_0, 2},
                  {KEEL_DTYPE_Q4_1, 3},  {KEEL_DTYPE_Q8_0, 7},  {KEEL_DTYPE_Q5_0, 8},
                  {KEEL_DTYPE_Q5_1, 9},  {KEEL_DTYPE_Q4_K, 14}, {KEEL_DTYPE_Q5_K, 16},
                  {KEEL_DTYPE_Q6_K, 18}, {KEEL_DTYPE_BF16, 32}};
    int64_t ftype = -1;
    for (size_t i = 0; i < sizeof ftypes / sizeof ftypes[0]; i++)
        if (ftypes[i].d == d) ftype = ftypes[i].ftype;

    /* keys */
    char name[128];
    snprintf(name, sizeof name, "keel-gen %s seed %llu", arch, (unsigned long long)p->seed);
    assert_key_str(g, "general.architecture", arch);
    assert_key_str(g, "general.name", name);
    assert_int_equal(get_int(g, "general.file_type"), ftype);
    assert_int_equal(arch_int(g, arch, "vocab_size"), V);
    assert_int_equal(arch_int(g, arch, "context_length"), p->n_ctx);
    assert_int_equal(arch_int(g, arch, "embedding_length"), E);
    assert_int_equal(arch_int(g, arch, "block_count"), L);
    assert_int_equal(arch_int(g, arch, "feed_forward_length"), F);
    assert_int_equal(arch_int(g, arch, "attention.head_count"), p->n_head);
    assert_int_equal(arch_int(g, arch, "attention.head_count_kv"), p->n_head_kv);
    assert_int_equal(arch_int(g, arch, "attention.key_length"), D);
    assert_int_equal(arch_int(g, arch, "attention.value_length"), D);
    assert_int_equal(arch_int(g, arch, "rope.dimension_count"), D);
    double eps = arch_float(g, arch, "attention.layer_norm_rms_epsilon");
    assert_close(eps, strcmp(arch, "llama") == 0 ? 1e-5 : 1e-6, 1e-12);
    assert_close(arch_float(g, arch, "rope.freq_base"), qwen2 || qwen3 ? 1e6 : 1e4, 1e-3);
    char key[128];
    snprintf(key, sizeof key, "%s.attention.sliding_window", arch);
    if (gemma) {
        assert_int_equal(arch_int(g, arch, "attention.sliding_window"), p->n_swa ? p->n_swa : 32);
        assert_close(arch_float(g, arch, "attn_logit_softcapping"), 50.0, 0);
        assert_close(arch_float(g, arch, "final_logit_softcapping"), 30.0, 0);
    } else {
        assert_null(gguf_find_value(g, key));
    }
    assert_key_str(g, "tokenizer.ggml.model", qwen2 || qwen3 ? "gpt2" : "llama");
    const gguf_value *toks = gguf_find_value(g, "tokenizer.ggml.tokens");
    assert_non_null(toks);
    assert_int_equal(toks->n, V);

    /* tensors: names, shapes, dtypes, and nothing else */
    int64_t n = 0;
    const gguf_tensor *t;
    t = expect_tensor(g, "token_embd.weight", E, V, want_matrix_dtype(d, E));
    n++;
    double mean, sd;
    if (d == KEEL_DTYPE_F32) {
        tensor_stats(t, &mean, &sd);
        double want = gemma ? 1.0 / sqrt((double)E) : 1.0;
        assert_close(mean, 0.0, 0.05 * want);
        assert_close(sd, want, 0.05 * want);
    }
    t = expect_tensor(g, "output_norm.weight", E, 0, KEEL_DTYPE_F32);
    n++;
    tensor_stats(t, &mean, &sd);
    assert_close(mean, 1.0, 0.02);
    assert_true(sd > 0.005 && sd < 0.04);
    if (!gemma) {
        expect_tensor(g, "output.weight", E, V, want_matrix_dtype(d, E));
        n++;
    } else {
        assert_null(gguf_find_tensor(g, "output.weight"));
    }
    for (int64_t l = 0; l < L; l++) {
        char tn[96];
#define T(what, ne0, ne1, dt)                                                                      \
    (snprintf(tn, sizeof tn, "blk.%lld.%s", (long long)l, what), n++,                              \
     expect_tensor(g, tn, ne0, ne1, dt))
#define M(what, ne0, ne1) T(what, ne0, ne1, want_matrix_dtype(d, ne0))
        T("attn_norm.weight", E, 0, KEEL_DTYPE_F32);
        t = M("attn_q.weight", E, Q);
        if (d == KEEL_DTYPE_F32 || d == KEEL_DTYPE_Q8_0 || d == KEEL_DTYPE_F16) {
            tensor_stats(t, &mean, &sd);
            double want = 1.0 / sqrt((double)E);
            assert_close(mean, 0.0, 0.1 * want);
            assert_close(sd, want, 0.08 * want);
        }
        M("attn_k.weight", E, KV);
        M("attn_v.weight", E, KV);
        t = M("attn_output.weight", Q, E);
        if (d == KEEL_DTYPE_F32) {
            tensor_stats(t, &mean, &sd);
            assert_close(sd, 1.0 / sqrt((double)Q), 0.08 / sqrt((double)Q));
        }
        T("ffn_norm.weight", E, 0, KEEL_DTYPE_F32);
        M("ffn_gate.weight", E, F);
        M("ffn_up.weight", E, F);
        M("ffn_down.weight", F, E);
        if (qwen2) {
            t = T("attn_q.bias", Q, 0, KEEL_DTYPE_F32);
            tensor_stats(t, &mean, &sd);
            assert_true(sd > 0.005 && sd < 0.05 && fabs(mean) < 0.02);
            T("attn_k.bias", KV, 0, KEEL_DTYPE_F32);
            T("attn_v.bias", KV, 0, KEEL_DTYPE_F32);
        } else {
            snprintf(tn, sizeof tn, "blk.%lld.attn_q.bias", (long long)l);
            assert_null(gguf_find_tensor(g, tn));
        }
        if (qwen3) {
            t = T("attn_q_norm.weight", D, 0, KEEL_DTYPE_F32);
            tensor_stats(t, &mean, &sd);
            assert_close(mean, 1.0, 0.03);
            T("attn_k_norm.weight", D, 0, KEEL_DTYPE_F32);
        }
        if (gemma) {
            T("post_attention_norm.weight", E, 0, KEEL_DTYPE_F32);
            T("post_ffw_norm.weight", E, 0, KEEL_DTYPE_F32);
        }
#undef M
#undef T
    }
    assert_int_equal(gguf_n_tensors(g), n);
}

/* ---- tests ------------------------------------------------------------------------ */

static void test_defaults(void **state)
{
    (void)state;
    keel_gen_params p = keel_gen_params_default();
    assert_string_equal(p.arch, "llama");
    assert_int_equal(p.n_layer, 2);
    assert_int_equal(p.n_embd, 128);
    assert_int_equal(p.n_head, 4);
    assert_int_equal(p.n_head_kv, 2);
    assert_int_equal(p.head_dim, 0);
    assert_int_equal(p.n_ff, 0);
    assert_int_equal(p.n_vocab, 512);
    assert_int_equal(p.n_ctx, 4096);
    assert_int_equal(p.n_swa, 0);
    assert_int_equal(p.dtype, KEEL_DTYPE_F32);
    assert_int_equal(p.seed, 1);
}

/* llama-quantize's mixes: q6_K for the output matrix (token_embd when
 * tied) and for attn_v and ffn_down in the layers llama.cpp gives more
 * bits (of 12: 0, 3, 6, 9, 10, 11; MoE experts by their layer), the base
 * type for every other matrix, norms f32; the file type is the mix's;
 * unknown mixes and a dtype other than the mix's base are EINVAL. */
static void test_mix(void **state)
{
    (void)state;
    static const char *const archs[] = {"llama", "gemma2", "qwen3moe"};
    static const struct {
        const char *mix;
        keel_dtype base;
        int64_t file_type;
    } mixes[] = {{"q4_K_M", KEEL_DTYPE_Q4_K, 15}, {"q5_K_M", KEEL_DTYPE_Q5_K, 17}};
    static const bool more[12] = {true, false, false, true, false, false, true, false, false, true, true, true};
    for (size_t a = 0; a < BASE_ARRAY_LEN(archs); a++)
        for (size_t k = 0; k < BASE_ARRAY_LEN(mixes); k++) {
            keel_gen_params p = keel_gen_params_default();
            p.arch = archs[a];
            p.n_layer = 12;
            p.n_embd = 256;
            p.n_ff = 512;
            p.dtype = mixes[k].base;
            p.mix = mixes[k].mix;
            char path[64];
            gguf *g = gen_open(&p, path, sizeof path);
            assert_int_equal(get_int(g, "general.file_type"), mixes[k].file_type);
            bool tied = gguf_find_tensor(g, "output.weight") == NULL;
            int n_q6 = 0;
            for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
                const gguf_tensor *t = gguf_tensor_at(g, i);
                int layer = -1;
                bool is_mat = t->ne[1] > 1 && t->ne[0] % 256 == 0;
                if (sscanf(t->name, "blk.%d.", &layer) != 1) layer = -1;
                bool q6 = strcmp(t->name, "output.weight") == 0 ||
                          (tied && strcmp(t->name, "token_embd.weight") == 0) ||
                          (layer >= 0 && (strstr(t->name, ".attn_v.weight") || strstr(t->name, ".ffn_down")) &&
                           more[layer]);
                keel_dtype want = !is_mat ? t->dtype : q6 ? KEEL_DTYPE_Q6_K : mixes[k].base;
                if (t->ne[1] == 1 && t->ne[2] == 1) want = KEEL_DTYPE_F32;
                if (t->dtype != want)
                    fail_msg("%s %s: %s is %s, want %s", archs[a], mixes[k].mix, t->name, keel_dtype_name(t->dtype),
                             keel_dtype_name(want));
                n_q6 += t->dtype == KEEL_DTYPE_Q6_K;
            }
            assert_true(n_q6 >= 13); /* the output and 6 layers' attn_v and ffn_down */
            gguf_close(g);
            unlink(path);
        }
    /* 8 experts (deepseek2's default): q4_K_M's attention outputs in q5_K */
    keel_gen_params p = keel_gen_params_default();
    p.arch = "deepseek2";
    p.n_layer = 4;
    p.n_embd = 256;
    p.n_ff = 512;
    p.dtype = KEEL_DTYPE_Q4_K;
    p.mix = "q4_K_M";
    char path[64];
    gguf *g = gen_open(&p, path, sizeof path);
    for (int l = 0; l < 4; l++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.attn_output.weight", l);
        const gguf_tensor *t = gguf_find_tensor(g, name);
        assert_non_null(t);
        assert_int_equal(t->dtype, KEEL_DTYPE_Q5_K);
    }
    gguf_close(g);
    unlink(path);
    p = keel_gen_params_default();
    char err[BASE_ERR_CAP] = "";
    p.n_embd = 256;
    p.dtype = KEEL_DTYPE_Q4_K;
    p.mix = "q3_K_M";
    assert_int_equal(keel_gen_model_size(&p, NULL, NULL, err), KEEL_EINVAL);
    assert_non_null(strstr(err, "q3_K_M"));
    p.mix = "q4_K_M";
    p.dtype = KEEL_DTYPE_Q8_0;
    assert_int_equal(keel_gen_model_size(&p, NULL, NULL, err), KEEL_EINVAL);
    assert_non_null(strstr(err, "q4_K_M needs dtype q4_K"));
}

/* Every arch with default shapes and each dtype family. */
static void test_archs_and_dtypes(void **state)
{
    (void)state;
    static const keel_dtype dtypes[] = {KEEL_DTYPE_F32,  KEEL_DTYPE_F16,  KEEL_DTYPE_BF16,
                                        KEEL_DTYPE_Q8_0, KEEL_DTYPE_Q4_0, KEEL_DTYPE_Q4_1,
                                        KEEL_DTYPE_Q5_0, KEEL_DTYPE_Q5_1, KEEL_DTYPE_Q4_K,
                                        KEEL_DTYPE_Q5_K, KEEL_DTYPE_Q6_K};
    for (int a = 0; a < 4; a++) {
        for (size_t k = 0; k < sizeof dtypes / sizeof dtypes[0]; k++) {
            if (!keel_dtype_can_quantize(dtypes[k])) continue;
            keel_gen_params p = keel_gen_params_default();
            p.arch = g_archs[a];
            p.dtype = dtypes[k];
            p.seed = 3 + k;
            /* K-quants need rows of 256: a model whose every row is */
            if (keel_dtype_block_size(dtypes[k]) == 256) {
                p.n_embd = 256;
                p.n_ff = 512;
            }
            char path[64];
            gguf *g = gen_open(&p, path, sizeof path);
            check_model(g, &p);
            int64_t n_params;
            size_t n_bytes;
            assert_ok(keel_gen_model_size(&p, &n_params, &n_bytes, NULL));
            assert_int_equal(n_bytes, gguf_size(g));
            int64_t sum = 0;
            for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
                const gguf_tensor *t = gguf_tensor_at(g, i);
                sum += t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
            }
            assert_int_equal(n_params, sum);
            gguf_close(g);
            unlink(path);
        }
    }
}

/* Shapes that force fallbacks, GQA, explicit head_dim and ff, gemma2 window. */
static void test_shapes_and_fallbacks(void **state)
{
    (void)state;
    struct {
        const char *arch;
        int32_t layers, embd, heads, kv, head_dim, ff, vocab, swa;
        keel_dtype dtype;
    } cases[] = {
        {"llama", 1, 128, 4, 2, 0, 0, 300, 0, KEEL_DTYPE_Q4_K},  /* all rows 128/384: q8_0 */
        {"qwen2", 2, 80, 4, 1, 0, 160, 400, 0, KEEL_DTYPE_Q8_0}, /* rows of 80: f16 */
        {"qwen3", 2, 64, 8, 2, 32, 96, 333, 0, KEEL_DTYPE_Q4_0}, /* q proj 64 -> 256 */
        {"gemma2", 3, 96, 6, 3, 0, 256, 700, 8, KEEL_DTYPE_Q6_K},
        {"gemma2", 1, 64, 2, 2, 0, 0, 300, 0, KEEL_DTYPE_BF16},
        {"llama", 1, 48, 3, 1, 16, 100, 300, 0, KEEL_DTYPE_F16},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        keel_gen_params p = keel_gen_params_default();
        p.arch = cases[i].arch;
        p.n_layer = cases[i].layers;
        p.n_embd = cases[i].embd;
        p.n_head = cases[i].heads;
        p.n_head_kv = cases[i].kv;
        p.head_dim = cases[i].head_dim;
        p.n_ff = cases[i].ff;
        p.n_vocab = cases[i].vocab;
        p.n_swa = cases[i].swa;
        p.dtype = cases[i].dtype;
        p.n_ctx = 1000 + (int32_t)i;
        char path[64];
        gguf *g = gen_open(&p, path, sizeof path);
        check_model(g, &p);
        gguf_close(g);
        unlink(path);
    }
}

static void *gen_bytes(const keel_gen_params *p, size_t *size)
{
    char path[64], err[BASE_ERR_CAP] = "";
    temp_path(path, sizeof path);
    keel_status st = keel_gen_model(p, path, err);
    if (st) fail_msg("%s", err);
    void *d = test_read_file(path, size);
    assert_non_null(d);
    unlink(path);
    return d;
}

static void test_determinism(void **state)
{
    (void)state;
    keel_gen_params p = keel_gen_params_default();
    p.dtype = KEEL_DTYPE_Q8_0;
    size_t n1, n2, n3;
    void *a = gen_bytes(&p, &n1), *b = gen_bytes(&p, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(a, b, n1);
    p.seed = 2;
    void *c = gen_bytes(&p, &n3);
    assert_int_equal(n1, n3);
    assert_true(memcmp(a, c, n1) != 0);
    free(a);
    free(b);
    free(c);
    /* large enough to be generated by several threads */
    p = keel_gen_params_default();
    p.arch = "qwen3";
    p.n_embd = 256;
    p.n_vocab = 9000;
    p.dtype = KEEL_DTYPE_Q8_0;
    int64_t n_params;
    assert_ok(keel_gen_model_size(&p, &n_params, NULL, NULL));
    assert_true(n_params > ((int64_t)1 << 22));
    a = gen_bytes(&p, &n1);
    b = gen_bytes(&p, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(a, b, n1);
    free(a);
    free(b);
}

/* The vocabulary of a generated model, opened as a tokenizer. */
static text_tokenizer *gen_tokenizer(const char *arch, int32_t n_vocab, gguf **gout)
{
    keel_gen_params p = keel_gen_params_default();
    p.arch = arch;
    p.n_vocab = n_vocab;
    p.n_layer = 1;
    p.n_embd = 32;
    p.n_head = 2;
    p.n_head_kv = 1;
    char path[64], err[BASE_ERR_CAP] = "";
    gguf *g = gen_open(&p, path, sizeof path);
    unlink(path); /* the mapping stays valid */
    text_tokenizer *t;
    keel_status st = text_tokenizer_open(g, &t, err);
    if (st) fail_msg("%s vocab %d: tokenizer: %s: %s", arch, n_vocab, keel_status_name(st), err);
    *gout = g;
    return t;
}

static int64_t tokenize(const text_tokenizer *t, const char *s, size_t n, bool add_special,
                        int32_t **ids)
{
    int64_t need = 0;
    keel_status st = text_tokenize(t, s, n, add_special, false, NULL, 0, &need, NULL);
    assert_true(st == KEEL_OK || st == KEEL_ERANGE);
    *ids = malloc((size_t)(need + 1) * sizeof **ids);
    int64_t got;
    assert_ok(text_tokenize(t, s, n, add_special, false, *ids, need, &got, NULL));
    assert_int_equal(got, need);
    return need;
}

static void roundtrip(const text_tokenizer *t, const char *s, size_t n)
{
    int32_t *ids;
    int64_t k = tokenize(t, s, n, false, &ids);
    size_t need = 0;
    keel_status st = text_detokenize(t, ids, k, 0, NULL, 0, &need, NULL);
    assert_true(st == KEEL_OK || st == KEEL_ERANGE);
    char *out = malloc(need + 1);
    assert_ok(text_detokenize(t, ids, k, 0, out, need, &need, NULL));
    if (need != n || memcmp(out, s, n) != 0)
        fail_msg("round trip differs:\n[%.*s]\n[%.*s]", (int)n, s, (int)need, out);
    free(out);
    free(ids);
}

static void test_vocab_tokenizers(void **state)
{
    (void)state;
    static const int32_t sizes[] = {300, 512, 4000, 32000};
    for (int a = 0; a < 4; a++) {
        bool bpe = a == 1 || a == 2;
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            int32_t V = sizes[k];
            gguf *g;
            text_tokenizer *t = gen_tokenizer(g_archs[a], V, &g);
            const text_tokenizer_info *in = text_tokenizer_get_info(t);
            assert_int_equal(in->n_vocab, V);
            if (bpe) {
                assert_int_equal(in->type, TEXT_VOCAB_BPE);
                assert_string_equal(in->pre, "qwen2");
                assert_false(in->pre_unknown);
                assert_int_equal(in->eos, V - 3);
                assert_int_equal(in->bos, V - 3);
                assert_false(in->add_bos);
                assert_int_equal(text_token_find(t, "<|endoftext|>", 13), V - 3);
                assert_int_equal(text_token_find(t, "<|im_start|>", 12), V - 2);
                assert_int_equal(text_token_find(t, "<|im_end|>", 10), V - 1);
                assert_int_equal(text_token_get_type(t, V - 2), TEXT_TOKEN_CONTROL);
                assert_int_equal(text_token_get_type(t, V - 1), TEXT_TOKEN_CONTROL);
                assert_true(text_token_is_eog(t, V - 1));
                assert_true(text_token_is_eog(t, V - 3));
                assert_true(in->n_merges > 0);
            } else {
                assert_int_equal(in->type, TEXT_VOCAB_SPM);
                assert_int_equal(in->unk, 0);
                assert_int_equal(in->bos, 1);
                assert_int_equal(in->eos, 2);
                assert_true(in->add_bos);
                assert_false(in->add_eos);
                assert_int_equal(text_token_get_type(t, 0), TEXT_TOKEN_UNKNOWN);
                assert_int_equal(text_token_get_type(t, 1), TEXT_TOKEN_CONTROL);
                assert_int_equal(text_token_get_type(t, 2), TEXT_TOKEN_CONTROL);
                for (int b = 0; b < 256; b++) {
                    char bt[8];
                    snprintf(bt, sizeof bt, "<0x%02X>", b);
                    assert_int_equal(text_token_find(t, bt, 6), 3 + b);
                    assert_int_equal(text_token_get_type(t, 3 + b), TEXT_TOKEN_BYTE);
                }
            }
            roundtrip(t, g_text, sizeof g_text - 1);
            roundtrip(t, g_english, sizeof g_english - 1);
            /* English compresses: clearly fewer tokens than bytes */
            int32_t *ids;
            int64_t n = tokenize(t, g_english, sizeof g_english - 1, true, &ids);
            double ratio = (double)n / (double)(sizeof g_english - 1);
            if (V >= 512 && ratio > 0.45)
                fail_msg("%s vocab %d: %lld tokens for %zu bytes", g_archs[a], V, (long long)n,
                         sizeof g_english - 1);
            assert_true(ratio < 0.9);
            if (!bpe) assert_int_equal(ids[0], 1); /* BOS */
            free(ids);
            text_tokenizer_close(t);
            gguf_close(g);
        }
    }
}

/* SPM: every NORMAL piece of two or more characters splits into two
 * pieces of the vocabulary (so SPM's merges can build it); scores strictly
 * decrease over the pieces. BPE: every merge joins two tokens into a token;
 * no duplicate merge. */
static void test_vocab_structure(void **state)
{
    (void)state;
    for (int a = 0; a < 4; a++) {
        for (int32_t V = 512; V <= 20000; V += 19488) {
            gguf *g;
            text_tokenizer *t = gen_tokenizer(g_archs[a], V, &g);
            const text_tokenizer_info *in = text_tokenizer_get_info(t);
            int64_t normal = 0, unused = 0;
            if (in->type == TEXT_VOCAB_SPM) {
                float prev = 1.0f;
                for (int32_t id = 259; id < V; id++) {
                    size_t n;
                    const char *s = text_token_text(t, id, &n);
                    text_token_type ty = text_token_get_type(t, id);
                    if (ty == TEXT_TOKEN_UNUSED) {
                        unused++;
                        continue;
                    }
                    assert_int_equal(ty, TEXT_TOKEN_NORMAL);
                    normal++;
                    float sc = text_token_score(t, id);
                    assert_true(sc < prev);
                    prev = sc;
                    size_t first = 1;
                    while (first < n && ((uint8_t)s[first] & 0xc0) == 0x80)
                        first++;
                    if (first == n) continue; /* one character */
                    bool ok = false;
                    for (size_t cut = 1; cut < n && !ok; cut++) {
                        if (((uint8_t)s[cut] & 0xc0) == 0x80) continue;
                        ok = text_token_find(t, s, cut) >= 0 &&
                             text_token_find(t, s + cut, n - cut) >= 0;
                    }
                    if (!ok) fail_msg("SPM piece %d '%s' is not a merge of two pieces", id, s);
                }
            } else {
                const gguf_value *mv;
                assert_ok(gguf_get_arr(g, "tokenizer.ggml.merges", GGUF_TYPE_STRING, &mv, NULL));
                assert_int_equal(mv->n, in->n_merges);
                for (uint64_t i = 0; i < mv->n; i++) {
                    const char *s;
                    size_t n;
                    assert_ok(gguf_arr_str(mv, i, &s, &n));
                    const char *sp = memchr(s, ' ', n);
                    assert_non_null(sp);
                    size_t nl = (size_t)(sp - s), nr = n - nl - 1;
                    assert_true(text_token_find(t, s, nl) >= 0);
                    assert_true(text_token_find(t, sp + 1, nr) >= 0);
                    char cat[512];
                    assert_true(nl + nr < sizeof cat);
                    memcpy(cat, s, nl);
                    memcpy(cat + nl, sp + 1, nr);
                    assert_true(text_token_find(t, cat, nl + nr) >= 0);
                }
                for (int32_t id = 0; id < V - 3; id++) {
                    text_token_type ty = text_token_get_type(t, id);
                    normal += ty == TEXT_TOKEN_NORMAL;
                    unused += ty == TEXT_TOKEN_UNUSED;
                }
            }
            /* the built-in text fills these sizes with real pieces */
            assert_int_equal(unused, 0);
            assert_true(normal > V - 300);
            text_tokenizer_close(t);
            gguf_close(g);
        }
    }
}

static void expect_invalid(const keel_gen_params *p, keel_status want, const char *field)
{
    char err[BASE_ERR_CAP] = "";
    char path[64];
    temp_path(path, sizeof path);
    unlink(path);
    keel_status st = keel_gen_model(p, path, err);
    if (st != want)
        fail_msg("%s: got %s (%s), want %s", field, keel_status_name(st), err,
                 keel_status_name(want));
    if (!strstr(err, field)) fail_msg("error '%s' does not name '%s'", err, field);
    assert_int_equal(access(path, F_OK), -1); /* nothing written */
    assert_status(keel_gen_model_size(p, NULL, NULL, NULL), want);
}

static void test_bad_params(void **state)
{
    (void)state;
    keel_gen_params d = keel_gen_params_default(), p;
#define BAD(stmt, want, field)                                                                     \
    do {                                                                                           \
        p = d;                                                                                     \
        stmt;                                                                                      \
        expect_invalid(&p, want, field);                                                           \
    } while (0)
    BAD(p.arch = NULL, KEEL_EINVAL, "arch");
    BAD(p.arch = "mamba", KEEL_EUNSUPPORTED, "mamba");
    BAD(p.n_layer = 0, KEEL_EINVAL, "n_layer");
    BAD(p.n_layer = 5000, KEEL_EINVAL, "n_layer");
    BAD(p.n_embd = -1, KEEL_EINVAL, "n_embd");
    BAD(p.n_head = 0, KEEL_EINVAL, "n_head");
    BAD(p.n_head_kv = 3, KEEL_EINVAL, "n_head_kv");
    BAD(p.n_head_kv = 8, KEEL_EINVAL, "n_head_kv");
    BAD(p.n_head_kv = 0, KEEL_EINVAL, "n_head_kv");
    BAD((p.n_embd = 130, p.n_head = 4), KEEL_EINVAL, "head_dim");
    BAD(p.head_dim = 31, KEEL_EINVAL, "head_dim");
    BAD(p.head_dim = -2, KEEL_EINVAL, "head_dim");
    BAD(p.n_ff = -5, KEEL_EINVAL, "n_ff");
    BAD(p.n_vocab = 299, KEEL_EINVAL, "n_vocab");
    BAD(p.n_vocab = 1 << 21, KEEL_EINVAL, "n_vocab");
    BAD(p.n_ctx = 0, KEEL_EINVAL, "n_ctx");
    BAD(p.n_swa = -1, KEEL_EINVAL, "n_swa");
    BAD(p.dtype = (keel_dtype)99, KEEL_EINVAL, "dtype");
    BAD(p.dtype = KEEL_DTYPE_Q8_1, KEEL_EUNSUPPORTED, "dtype");
    BAD(p.dtype = KEEL_DTYPE_I32, KEEL_EUNSUPPORTED, "dtype");
    BAD((p.arch = "nemotron_h", p.layer_pattern = "M*E"), KEEL_EINVAL, "layer_pattern 'M*E'");
    BAD((p.arch = "nemotron_h", p.layer_pattern = ""), KEEL_EINVAL, "layer_pattern");
    BAD((p.arch = "nemotron_h", p.n_head = 6, p.n_head_kv = 2, p.head_dim = 16), KEEL_EINVAL,
        "nemotron_h: n_head = 6 (heads) must divide 2 * n_embd");
    BAD((p.n_layer = 1024, p.n_embd = 65536, p.n_head = 256, p.n_head_kv = 256, p.n_ff = 1 << 20),
        KEEL_EINVAL, "too large");
#undef BAD
    char err[BASE_ERR_CAP] = "";
    assert_status(keel_gen_model(NULL, "/tmp/x", err), KEEL_EINVAL);
    assert_status(keel_gen_model(&d, NULL, err), KEEL_EINVAL);
    assert_non_null(strstr(err, "path"));
    assert_status(keel_gen_model(&d, "/nonexistent-dir/m.gguf", err), KEEL_EIO);
    assert_non_null(strstr(err, "/nonexistent-dir/m.gguf"));
    assert_non_null(strstr(err, "No such file"));
    assert_status(keel_gen_model(&d, "/tmp/x", NULL), KEEL_OK); /* err may be NULL */
    unlink("/tmp/x");
}

typedef struct sweep_ctx {
    keel_gen_params p;
    char path[64];
} sweep_ctx;

static keel_status gen_op(void *vctx)
{
    sweep_ctx *c = vctx;
    unlink(c->path);
    keel_status st = keel_gen_model(&c->p, c->path, NULL);
    if (st) assert_int_equal(access(c->path, F_OK), -1); /* no partial file */
    return st;
}

static keel_status size_op(void *vctx)
{
    sweep_ctx *c = vctx;
    int64_t n;
    return keel_gen_model_size(&c->p, &n, NULL, NULL);
}

static void test_alloc_sweep_gen(void **state)
{
    (void)state;
    sweep_ctx c;
    c.p = keel_gen_params_default();
    c.p.n_layer = 1;
    c.p.n_embd = 32;
    c.p.n_head = 2;
    c.p.n_head_kv = 1;
    c.p.n_vocab = 300;
    temp_path(c.path, sizeof c.path);
    for (int a = 0; a < 4; a++) {
        c.p.arch = g_archs[a];
        c.p.dtype = a == 1 ? KEEL_DTYPE_Q8_0 : KEEL_DTYPE_F32;
        assert_true(test_alloc_sweep(gen_op, &c) >= 20);
    }
    c.p.arch = "qwen3";
    assert_true(test_alloc_sweep(size_op, &c) >= 10);
    unlink(c.path);
}

/* Runs a shell command, returning its exit status and output. */
static int run_cmd(const char *cmd, char *out, size_t cap)
{
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = '\0';
    int rc = pclose(f);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static void test_cli(void **state)
{
    (void)state;
    const char *bin = getenv("KEEL_BIN");
    if (!bin || access(bin, X_OK) != 0) {
        printf("[  SKIP    ] KEEL_BIN not set or not executable\n");
        return;
    }
    char path[64], cmd[1024], out[4096];
    temp_path(path, sizeof path);
    snprintf(cmd, sizeof cmd,
             "%s gen-model --arch qwen2 --layers 1 --embd 64 --heads 2 --kv-heads 1 --ff 96 "
             "--vocab 400 --ctx 512 --dtype q8_0 --seed 7 --out %s 2>&1",
             bin, path);
    assert_int_equal(run_cmd(cmd, out, sizeof out), 0);
    keel_gen_params p = keel_gen_params_default();
    p.arch = "qwen2";
    p.n_layer = 1;
    p.n_embd = 64;
    p.n_head = 2;
    p.n_head_kv = 1;
    p.n_ff = 96;
    p.n_vocab = 400;
    p.n_ctx = 512;
    p.dtype = KEEL_DTYPE_Q8_0;
    p.seed = 7;
    int64_t n_params;
    size_t n_bytes;
    assert_ok(keel_gen_model_size(&p, &n_params, &n_bytes, NULL));
    char want[256];
    snprintf(want, sizeof want, "%s: qwen2, %lld parameters, %zu bytes\n", path,
             (long long)n_params, n_bytes);
    assert_string_equal(out, want);
    size_t n1, n2;
    void *a = test_read_file(path, &n1), *b = gen_bytes(&p, &n2);
    assert_non_null(a);
    assert_int_equal(n1, n2);
    assert_memory_equal(a, b, n1); /* the CLI writes what the library writes */
    free(a);
    free(b);
    gguf *g;
    assert_ok(gguf_open_file(path, &g, NULL));
    check_model(g, &p);
    gguf_close(g);
    unlink(path);
    /* bad input: the field is named, nonzero exit, no file */
    snprintf(cmd, sizeof cmd, "%s gen-model --arch llama --vocab 10 --out %s 2>&1", bin, path);
    assert_int_equal(run_cmd(cmd, out, sizeof out), 1);
    assert_non_null(strstr(out, "n_vocab"));
    assert_int_equal(access(path, F_OK), -1);
    snprintf(cmd, sizeof cmd, "%s gen-model --arch llama --dtype q9_9 --out %s 2>&1", bin, path);
    assert_int_equal(run_cmd(cmd, out, sizeof out), 2);
    snprintf(cmd, sizeof cmd, "%s gen-model --layers 2 2>&1", bin);
    assert_int_equal(run_cmd(cmd, out, sizeof out), 2);
    assert_non_null(strstr(out, "--arch"));
    /* --dtype Q4_K_M (any case): the library's q4_K_M mix, byte for byte */
    snprintf(cmd, sizeof cmd, "%s gen-model --arch llama --layers 2 --embd 256 --ff 512 --dtype Q4_K_M --out %s 2>&1",
             bin, path);
    assert_int_equal(run_cmd(cmd, out, sizeof out), 0);
    p = keel_gen_params_default();
    p.n_layer = 2;
    p.n_embd = 256;
    p.n_ff = 512;
    p.dtype = KEEL_DTYPE_Q4_K;
    p.mix = "q4_K_M";
    a = test_read_file(path, &n1);
    b = gen_bytes(&p, &n2);
    assert_non_null(a);
    assert_int_equal(n1, n2);
    assert_memory_equal(a, b, n1);
    free(a);
    free(b);
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_archs_and_dtypes),
        cmocka_unit_test(test_mix),
        cmocka_unit_test(test_shapes_and_fallbacks),
        cmocka_unit_test(test_determinism),
        cmocka_unit_test(test_vocab_tokenizers),
        cmocka_unit_test(test_vocab_structure),
        cmocka_unit_test(test_bad_params),
        cmocka_unit_test(test_alloc_sweep_gen),
        cmocka_unit_test(test_cli),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
