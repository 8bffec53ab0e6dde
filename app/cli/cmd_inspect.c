/*
 * cmd_inspect.c — `keel inspect MODEL`: architecture, hyperparameters, the
 * tensor table and the memory plan of a context (-c, --ctk, --ctv, ...).
 */
#include "cli.h"

#include <string.h>

static const char *g_usage =
    "usage: keel inspect MODEL [options]   (or -m MODEL)\n"
    "Hyperparameters, the memory plan of a context with the options below, and the tensor table.\n"
    "Text from the file (names) is printed with control characters escaped.";

/* "label        <escaped text>" (no newline) */
static void put_str(const char *label, const char *s)
{
    printf("%-13s", label);
    cli_put_escaped(stdout, s, strlen(s));
}

static double mib(size_t b)
{
    return (double)b / (1024.0 * 1024.0);
}

int cmd_inspect(int argc, char **argv)
{
    cli_opts o;
    cli_opts_init(&o);
    o.groups = CLI_G_MODEL | CLI_G_CTX | CLI_G_THREADS | CLI_G_KV | CLI_G_NO_TENSORS;
    o.positional_name = "MODEL";
    int rc = cli_parse(argc, argv, &o, g_usage);
    if (rc) return rc == 1 ? 0 : rc;
    if (o.model.path && o.positional) {
        fprintf(stderr, "keel: inspect: two models ('%s' and -m %s)\n%s\n", o.positional,
                o.model.path, g_usage);
        return 2;
    }
    if (!o.model.path) o.model.path = o.positional;
    keel_model *m = NULL;
    if ((rc = cli_open_model(&o, &m))) return rc;
    keel_model_info mi;
    keel_model_info_get(m, &mi);
    put_str("model", o.model.path);
    printf("\n");
    put_str("arch", mi.arch);
    if (mi.name[0]) {
        printf("  name ");
        cli_put_escaped(stdout, mi.name, strlen(mi.name));
    }
    printf("\n");
    printf("params       %lld (%.2f M), %.2f MiB of tensors, mostly %s\n", (long long)mi.n_params,
           (double)mi.n_params / 1e6, mib(mi.weight_bytes), keel_dtype_name(mi.dtype));
    printf("vocab        %d (%s, bos %d, eos %d, add_bos %s)\n", mi.n_vocab, mi.tokenizer, mi.bos,
           mi.eos, mi.add_bos ? "yes" : "no");
    printf("n_ctx_train  %d\n", mi.n_ctx_train);
    printf("n_embd       %d\nn_layer      %d\nn_head       %d\nn_head_kv    %d\n", mi.n_embd,
           mi.n_layer, mi.n_head, mi.n_head_kv);
    printf("head_dim     k %d, v %d\nn_ff         %d\nnorm_eps     %g\n", mi.head_dim_k,
           mi.head_dim_v, mi.n_ff, (double)mi.norm_eps);
    printf("rope         %s, n_rot %d, base %g, freq_scale %g%s\n",
           mi.rope.type == KEEL_ROPE_NEOX ? "neox" : mi.rope.type == KEEL_ROPE_NORM ? "norm" : "none",
           mi.rope.n_rot, (double)mi.rope.freq_base, (double)mi.rope.freq_scale,
           mi.rope.ext_factor > 0 ? " (yarn)" : "");
    if (mi.n_swa) printf("sliding      window %d on %d of %d layers\n", mi.n_swa, mi.n_swa_layers, mi.n_layer);
    if (mi.attn_softcap > 0 || mi.final_softcap > 0)
        printf("softcap      attention %g, final %g\n", (double)mi.attn_softcap, (double)mi.final_softcap);
    if (mi.n_recurrent_layers)
        printf("recurrent    %d of %d layers (state %d, inner %d, conv kernel %d, groups %d)\n", mi.n_recurrent_layers,
               mi.n_layer, mi.ssm_d_state, mi.ssm_d_inner, mi.ssm_conv_kernel, mi.ssm_n_group);
    if (mi.n_expert)
        printf("experts      %d, %d used per token (ff %d, shared expert ff %d)\n", mi.n_expert, mi.n_expert_used,
               mi.n_ff_expert, mi.n_ff_shared_expert);
    if (mi.n_expert_groups)
        printf("routing      %s, experts chosen in the best %d of %d groups\n", mi.expert_sigmoid ? "sigmoid" : "softmax",
               mi.n_group_used, mi.n_expert_groups);
    if (mi.kv_lora_rank)
        printf("mla          q_lora %d, kv_lora %d, attention scale %g\n", mi.q_lora_rank, mi.kv_lora_rank,
               (double)mi.attn_scale);
    if (mi.indexer_top_k)
        printf("indexer      %d heads, key dims %d, top_k %d\n", mi.indexer_heads, mi.indexer_dim, mi.indexer_top_k);
    keel_plan pl;
    char err[256] = "";
    keel_status st = keel_context_plan(m, &o.ctx, &pl, err);
    if (st != KEEL_OK) {
        rc = cli_fail("plan", st, err);
    } else {
        int32_t n_ctx = o.ctx.n_ctx ? o.ctx.n_ctx : (mi.n_ctx_train < 4096 ? mi.n_ctx_train : 4096);
        printf("\nmemory plan (n_ctx %d, K %s, V %s, n_batch %d):\n", n_ctx, keel_dtype_name(o.ctx.type_k),
               keel_dtype_name(o.ctx.type_v), o.ctx.n_batch);
        printf("  weights %-9s %10.2f MiB (%s)\n", mi.weights_read ? "read" : "mapped", mib(pl.weights_mapped),
               mi.weights_read ? "the file, read into memory" : "the file, not allocated");
        printf("  KV cache          %10.2f MiB\n", mib(pl.kv_bytes));
        printf("  memory core       %10.2f MiB (KV + cell tables + scratch)\n", mib(pl.mem_bytes));
        if (pl.rs_bytes)
            printf("  recurrent states  %10.2f MiB, checkpoints %.2f MiB (in the memory core)\n",
                   mib(pl.rs_bytes), mib(pl.ckpt_bytes));
        printf("  forward work      %10.2f MiB\n", mib(pl.work_bytes));
        printf("  logits            %10.2f MiB\n", mib(pl.logits_bytes));
        printf("  total allocated   %10.2f MiB (%zu bytes)\n", mib(pl.total_bytes), pl.total_bytes);
    }
    if (!o.no_tensors) {
        printf("\n");
        keel_status ts = keel_model_tensors(m, cli_write_file, stdout);
        if (ts != KEEL_OK && !rc) rc = cli_fail("tensors", ts, NULL);
    }
    keel_model_close(m);
    return rc;
}
