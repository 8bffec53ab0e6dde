/*
 * cmd_gen_model.c — `keel gen-model`: writes a deterministic random-weight
 * GGUF model (keel_gen_model) for tests and benchmarks.
 */
#include "cli.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static void gen_usage(FILE *f)
{
    keel_gen_params d = keel_gen_params_default();
    fprintf(f,
            "usage: keel gen-model --arch llama|qwen2|qwen3|gemma2|qwen35|qwen3next|mamba2|gpt-oss|\n"
            "                      deepseek32|gemma3|phi3|qwen3moe|glm4moe|nemotron_h|lfm2|\n"
            "                      deepseek2\n"
            "                      [options] --out FILE\n"
            "  --layers N     blocks (%d)\n"
            "  --embd N       embedding width (%d)\n"
            "  --heads N      attention heads (%d)\n"
            "  --kv-heads N   key/value heads (%d)\n"
            "  --head-dim N   head dimension (0: embd / heads)\n"
            "  --ff N         feed-forward width (0: 3 x embd)\n"
            "  --vocab N      vocabulary size, >= 300 (%d)\n"
            "  --ctx N        training context (%d)\n"
            "  --swa N        gemma2, gpt-oss sliding window (0: 32)\n"
            "  --experts N    qwen3next, gpt-oss, deepseek32, qwen3moe, glm4moe experts (0: 4;\n"
            "                 deepseek2: 8)\n"
            "  --experts-used N  experts per token (0: 2)\n"
            "  --expert-ff N  qwen3moe, glm4moe: FFN width of each expert (0: --ff)\n"
            "  --ssm-state N  mamba2 state size (0: 32)\n"
            "  --top-k N      deepseek32 indexer: cells kept per query (0: 16)\n"
            "  --layer-pattern P  nemotron_h layer kinds, repeated to --layers: M Mamba2,\n"
            "                 * attention, - MLP (M*-)\n"
            "  --q-lora N     deepseek2 q LoRA rank (0: 2 x head-dim; -1: none, plain attn_q)\n"
            "  --expert-groups N  deepseek2 grouped routing (0: experts / 2; -1: none)\n"
            "  --groups-used N    deepseek2 groups the experts are chosen in (0: half)\n"
            "  --gating N     deepseek2 router: 1 softmax, 2 sigmoid + selection bias (0: 2)\n"
            "  --yarn-factor F    deepseek2 YaRN rope.scaling.factor (0: none)\n"
            "  --yarn-log-mul F   deepseek2 rope.scaling.yarn_log_mul (0.1 x mscale_all_dim; 0: absent)\n"
            "  --dtype T      weight matrices: f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1\n"
            "                 q4_K q5_K q6_K, or llama-quantize's mixes q4_K_M q5_K_M (%s)\n"
            "  --seed S       random seed (%" PRIu64 ")\n",
            d.n_layer, d.n_embd, d.n_head, d.n_head_kv, d.n_vocab, d.n_ctx,
            keel_dtype_name(d.dtype), d.seed);
}

int cmd_gen_model(int argc, char **argv)
{
    keel_gen_params p = keel_gen_params_default();
    p.arch = NULL;
    const char *out = NULL;
    static const struct {
        const char *flag;
        size_t off;
    } ints[] = {
        {"--layers", offsetof(keel_gen_params, n_layer)},
        {"--embd", offsetof(keel_gen_params, n_embd)},
        {"--heads", offsetof(keel_gen_params, n_head)},
        {"--kv-heads", offsetof(keel_gen_params, n_head_kv)},
        {"--head-dim", offsetof(keel_gen_params, head_dim)},
        {"--ff", offsetof(keel_gen_params, n_ff)},
        {"--vocab", offsetof(keel_gen_params, n_vocab)},
        {"--ctx", offsetof(keel_gen_params, n_ctx)},
        {"--swa", offsetof(keel_gen_params, n_swa)},
        {"--experts", offsetof(keel_gen_params, n_expert)},
        {"--experts-used", offsetof(keel_gen_params, n_expert_used)},
        {"--ssm-state", offsetof(keel_gen_params, ssm_state)},
        {"--top-k", offsetof(keel_gen_params, top_k)},
        {"--expert-ff", offsetof(keel_gen_params, n_ff_exp)},
        {"--q-lora", offsetof(keel_gen_params, q_lora)},
        {"--expert-groups", offsetof(keel_gen_params, n_expert_groups)},
        {"--groups-used", offsetof(keel_gen_params, n_group_used)},
        {"--gating", offsetof(keel_gen_params, gating)},
    };
    static const struct {
        const char *flag;
        size_t off;
    } floats[] = {
        {"--yarn-factor", offsetof(keel_gen_params, yarn_factor)},
        {"--yarn-log-mul", offsetof(keel_gen_params, yarn_log_mul)},
    };
    static const char *const others[] = {"--arch", "--out", "-o", "--dtype", "--seed", "--layer-pattern"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            gen_usage(stdout);
            return 0;
        }
        bool known = false;
        for (size_t k = 0; k < sizeof ints / sizeof ints[0]; k++) known |= strcmp(a, ints[k].flag) == 0;
        for (size_t k = 0; k < sizeof floats / sizeof floats[0]; k++) known |= strcmp(a, floats[k].flag) == 0;
        for (size_t k = 0; k < sizeof others / sizeof others[0]; k++) known |= strcmp(a, others[k]) == 0;
        if (!known) {
            fprintf(stderr, "keel gen-model: %s '%s'\n", a[0] == '-' ? "unknown option" : "unexpected argument", a);
            gen_usage(stderr);
            return 2;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "keel gen-model: option %s needs a value\n", a);
            gen_usage(stderr);
            return 2;
        }
        const char *v = argv[++i];
        bool done = false;
        for (size_t k = 0; k < sizeof ints / sizeof ints[0] && !done; k++) {
            if (strcmp(a, ints[k].flag) != 0) continue;
            int32_t x32;
            if (!cli_parse_i32(v, &x32)) {
                fprintf(stderr, "keel gen-model: %s %s: must be an integer\n", a, v);
                return 2;
            }
            memcpy((char *)&p + ints[k].off, &x32, sizeof x32);
            done = true;
        }
        for (size_t k = 0; k < sizeof floats / sizeof floats[0] && !done; k++) {
            if (strcmp(a, floats[k].flag) != 0) continue;
            float xf;
            if (!cli_parse_f32(v, &xf)) {
                fprintf(stderr, "keel gen-model: %s %s: must be a finite number\n", a, v);
                return 2;
            }
            memcpy((char *)&p + floats[k].off, &xf, sizeof xf);
            done = true;
        }
        if (done) continue;
        if (strcmp(a, "--arch") == 0) {
            p.arch = v;
        } else if (strcmp(a, "--layer-pattern") == 0) {
            p.layer_pattern = v;
        } else if (strcmp(a, "--out") == 0 || strcmp(a, "-o") == 0) {
            out = v;
        } else if (strcmp(a, "--dtype") == 0) {
            if (strcasecmp(v, "q4_K_M") == 0 || strcasecmp(v, "q5_K_M") == 0) {
                p.mix = v[1] == '4' ? "q4_K_M" : "q5_K_M";
                p.dtype = v[1] == '4' ? KEEL_DTYPE_Q4_K : KEEL_DTYPE_Q5_K;
            } else if ((p.mix = NULL, keel_dtype_from_name(v, &p.dtype)) != KEEL_OK) {
                fprintf(stderr, "keel gen-model: unknown dtype '%s'\n", v);
                return 2;
            }
        } else if (strcmp(a, "--seed") == 0) {
            if (!cli_parse_u64(v, &p.seed)) {
                fprintf(stderr, "keel gen-model: --seed %s: must be an unsigned decimal integer\n", v);
                return 2;
            }
        }
    }
    if (!p.arch || !out) {
        fprintf(stderr, "keel gen-model: --arch and --out are required\n");
        gen_usage(stderr);
        return 2;
    }
    char err[256] = "";
    int64_t n_params = 0;
    size_t n_bytes = 0;
    keel_status st = keel_gen_model_size(&p, &n_params, &n_bytes, err);
    if (st == KEEL_OK) st = keel_gen_model(&p, out, err);
    if (st != KEEL_OK) return cli_fail("gen-model", st, err);
    printf("%s: %s, %" PRId64 " parameters, %zu bytes\n", out, p.arch, n_params, n_bytes);
    return 0;
}
