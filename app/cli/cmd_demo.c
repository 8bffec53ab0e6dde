/*
 * cmd_demo.c — `keel demo`: keel's main job on its built-in default. It
 * plays a long multi-turn agentic session (system prompt and tool
 * definitions, user turns, assistant turns with tool calls, tool results)
 * whose transcript grows to more than 10x the cache budget, with KeyDiff
 * compaction on the full-attention layers, sliding-window layers with
 * attention sinks, and a quantized (q8_0, Hadamard-rotated) KV cache where
 * the model's head size allows it. Each turn prints tokens seen against the
 * cells held, KV bytes, compactions and speeds; a summary line ends it.
 *
 * Default model: ../shared/fixtures' stories260K when present (a trained
 * model: the text is readable; head_dim 8 cannot hold 32-element q8_0
 * blocks, so its K/V stay f16, and its layers get StreamingLLM sliding
 * windows); otherwise a generated gemma2-style model with its own sliding
 * layers and q8_0 K/V (random weights: the text is noise, the memory
 * behaviour is the point). -m MODEL runs any other model.
 */
#include "cli.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *g_usage =
    "usage: keel demo [-m MODEL] [--turns N] [--kv-trigger N] [--kv-target M] [-t N] [--seed S]\n"
    "A long agentic session under a KV budget (KeyDiff compaction, trigger 128, target 64).";

static const char *g_system =
    "System: You are a helpful assistant in a small town library. You can use tools.\n"
    "Tools: search_books(query) returns titles; read_page(title, page) returns text; "
    "note(text) saves a note for later.\n";

static const char *g_user[] = {
    "User: Can you find a story about a little girl and her dog?\n",
    "User: Read me the first page, please.\n",
    "User: What happened to the ball in the park?\n",
    "User: Save a note that Lily likes the red ball.\n",
    "User: Now find a story about a brave little bird.\n",
    "User: Why was the bird sad at the start?\n",
    "User: Read the next page.\n",
    "User: What did the mom say to Tim?\n",
    "User: Find a story with a big tree and a cat.\n",
    "User: How did the cat get down from the tree?\n",
    "User: What was in my first note?\n",
    "User: Tell me a short happy ending for all of them.\n",
};

static const char *g_tool_call[] = {
    "Assistant: [call search_books(\"girl and dog\")]\n",
    "Assistant: [call read_page(\"Lily and Max\", 1)]\n",
    "Assistant: [call read_page(\"Lily and Max\", 2)]\n",
    "Assistant: [call note(\"Lily likes the red ball\")]\n",
};

static const char *g_tool_result[] = {
    "Tool: Lily and Max. The Big Red Ball. Sam and the Puppy.\n",
    ("Tool: Once upon a time, there was a little girl named Lily. She had a dog named Max. Max "
     "loved to run and jump in the park. One day, Lily and Max went to the park to play with "
     "a big red ball.\n"),
    ("Tool: The ball went up in the tree. Lily was sad. Max barked and barked. A kind man came "
     "and got the ball down. Lily said thank you and they played all day.\n"),
    "Tool: Saved.\n",
};

typedef struct demo_opts {
    int32_t turns;
} demo_opts;

static bool demo_extra(cli_opts *o, const char *a, const char *v, bool *takes)
{
    (void)takes;
    if (strcmp(a, "--turns") == 0) {
        int32_t t;
        if (v && (!cli_parse_i32(v, &t) || t < 1 || t > 10000))
            snprintf(o->extra_err, sizeof o->extra_err, "--turns %s: must be an integer in [1, 10000]", v);
        else if (v)
            ((demo_opts *)o->user)->turns = t;
        return true;
    }
    return false;
}

static const char *fixture_model(void)
{
    static char path[1024];
    const char *root = getenv("KEEL_FIXTURES");
    const char *cands[] = {root, "../shared/fixtures", "../../shared/fixtures"};
    for (size_t i = 0; i < sizeof cands / sizeof cands[0]; i++) {
        if (!cands[i]) continue;
        snprintf(path, sizeof path, "%s/models/stories260K.gguf", cands[i]);
        if (access(path, R_OK) == 0) return path;
    }
    return NULL;
}

static keel_status g_feed_status;

/* Tokenizes text and decodes it; returns tokens or -1 (g_feed_status). */
static int32_t feed(keel_context *c, const keel_model *m, const char *text, int32_t *buf,
                    int32_t cap, bool bos, double *seconds)
{
    int32_t n = 0;
    g_feed_status = keel_tokenize(m, text, strlen(text), bos, false, buf, cap, &n);
    if (g_feed_status != KEEL_OK) return -1;
    uint64_t t0 = keel_time_ns();
    for (int32_t i = 0; i < n;) {
        int32_t k = n - i < 64 ? n - i : 64;
        keel_batch b = {k, buf + i, NULL, NULL, NULL};
        if ((g_feed_status = keel_decode(c, &b)) != KEEL_OK) return -1;
        i += k;
    }
    *seconds += (double)(keel_time_ns() - t0) * 1e-9;
    return n;
}

int cmd_demo(int argc, char **argv)
{
    cli_opts o;
    cli_opts_init(&o);
    demo_opts d = {12};
    o.extra = demo_extra;
    o.user = &d;
    o.groups = CLI_G_MODEL | CLI_G_THREADS | CLI_G_SEED | CLI_G_BUDGET;
    o.extra_help = "  --turns N                      turns to play, in [1, 10000] (12)";
    o.ctx.compact.policy = KEEL_COMPACT_KEYDIFF;
    o.ctx.compact.trigger = 128;
    o.ctx.compact.target = 64;
    o.ctx.compact.n_sink = 4;
    o.ctx.compact.recent = 0.5f;
    int rc = cli_parse(argc, argv, &o, g_usage);
    if (rc) return rc == 1 ? 0 : rc;
    if (o.kv_trigger_set && !o.kv_target_set) o.ctx.compact.target = o.ctx.compact.trigger / 2;
    char gen_path[64] = "";
    bool generated = false;
    if (!o.model.path) {
        o.model.path = fixture_model();
        if (!o.model.path) {
            snprintf(gen_path, sizeof gen_path, "/tmp/keel-demo-XXXXXX");
            int fd = mkstemp(gen_path);
            if (fd < 0) return cli_fail("demo", KEEL_EIO, "cannot create a temporary model file");
            close(fd);
            keel_gen_params gp = keel_gen_params_default();
            gp.arch = "gemma2";
            gp.n_layer = 4;
            gp.n_embd = 256;
            gp.n_head = 4;
            gp.n_head_kv = 2;
            gp.n_swa = 32;
            gp.n_vocab = 2048;
            gp.seed = 7;
            char err[256] = "";
            keel_status st = keel_gen_model(&gp, gen_path, err);
            if (st != KEEL_OK) {
                unlink(gen_path);
                return cli_fail("demo: gen-model", st, err);
            }
            o.model.path = gen_path;
            generated = true;
        }
    }
    keel_model *m = NULL;
    rc = cli_open_model(&o, &m);
    if (generated) unlink(gen_path);
    if (rc) return rc;
    keel_model_info mi;
    keel_model_info_get(m, &mi);
    /* memory: q8_0 K/V where the head allows 32-element blocks; sliding
     * layers (the model's, or StreamingLLM windows) with 4 sinks */
    o.ctx.n_ctx = o.ctx.compact.trigger + 64;
    o.ctx.n_batch = 64;
    o.ctx.n_ubatch = 64;
    o.ctx.n_sink = 4;
    const char *kv_note = "";
    if (mi.head_dim_k % 32 == 0 && mi.head_dim_v % 32 == 0) {
        o.ctx.type_k = o.ctx.type_v = KEEL_DTYPE_Q8_0;
        o.ctx.rot_k = 1;
    } else {
        kv_note = " (q8_0 needs head_dim % 32 == 0: this model's is f16)";
    }
    if (mi.n_swa == 0) {
        o.ctx.swa_window = 32;
        o.ctx.swa_period = 2;
    }
    keel_context *c = NULL;
    keel_sampler *s = NULL;
    int32_t *buf = NULL;
    char err[256] = "";
    keel_status st = keel_context_open(m, &o.ctx, &c, err);
    if (st != KEEL_OK) {
        rc = cli_fail("demo: context", st, err);
        goto done;
    }
    keel_sampler_params sp = keel_sampler_params_default();
    sp.seed = o.samp.seed;
    sp.temp = 0.7f;
    sp.repeat_penalty = 1.1f;
    if ((st = keel_sampler_open(&sp, mi.n_vocab, &s)) != KEEL_OK) {
        rc = cli_fail("demo: sampler", st, NULL);
        goto done;
    }
    keel_plan pl;
    keel_context_plan_get(c, &pl);
    keel_mem *mem = keel_context_memory(c);
    printf("keel demo: %s (%s, %d layers, head_dim %d, %.2f M params)\n", o.model.path, mi.arch,
           mi.n_layer, mi.head_dim_k, (double)mi.n_params / 1e6);
    printf("memory: KV %s/%s%s, sliding window %d + %d sinks on %s layers, KeyDiff compaction "
           "on the full layers: trigger %d, target %d, positions renumbered\n",
           keel_dtype_name(o.ctx.type_k), keel_dtype_name(o.ctx.type_v), kv_note,
           mi.n_swa ? mi.n_swa : o.ctx.swa_window, o.ctx.n_sink,
           mi.n_swa ? "the model's sliding" : "alternate (StreamingLLM)", o.ctx.compact.trigger,
           o.ctx.compact.target);
    printf("plan: %.1f KiB allocated in all (KV %.1f KiB), weights %.1f KiB mapped\n\n",
           (double)pl.total_bytes / 1024, (double)pl.kv_bytes / 1024,
           (double)pl.weights_mapped / 1024);
    int32_t cap = 4096;
    buf = malloc((size_t)cap * sizeof(int32_t));
    if (!buf) {
        rc = cli_fail("demo", KEEL_ENOMEM, NULL);
        goto done;
    }
    double pp_s = 0.0, tg_s = 0.0;
    int64_t pp_n = 0, tg_n = 0;
    int32_t n = feed(c, m, g_system, buf, cap, true, &pp_s);
    if (n < 0) goto decode_fail;
    pp_n += n;
    char piece[512];
    for (int turn = 0; turn < d.turns; turn++) {
        double t_pp = 0.0, t_tg = 0.0;
        int64_t turn_pp = 0, turn_tg = 0;
        /* user turn, then a tool call and its result (as an agent loop inserts them) */
        const char *parts[3] = {g_user[turn % 12], g_tool_call[turn % 4], g_tool_result[turn % 4]};
        for (int k = 0; k < 3; k++) {
            if ((n = feed(c, m, parts[k], buf, cap, false, &t_pp)) < 0) goto decode_fail;
            turn_pp += n;
        }
        if ((n = feed(c, m, "Assistant:", buf, cap, false, &t_pp)) < 0) goto decode_fail;
        turn_pp += n;
        /* the assistant's answer continues the transcript ("Assistant:" just fed) */
        keel_detok_stream ds;
        if ((st = keel_detok_stream_init_after(&ds, m, buf, n)) != KEEL_OK) {
            rc = cli_fail("demo: detokenize", st, NULL);
            goto done;
        }
        printf("turn %2d  assistant:", turn + 1);
        const float *logits = keel_logits(c, n - 1 - ((n - 1) / 64) * 64);
        uint64_t t0 = keel_time_ns();
        for (int i = 0; i < 48; i++) {
            int32_t tok;
            if ((st = keel_sampler_sample(s, logits, &tok)) != KEEL_OK ||
                (st = keel_sampler_accept(s, tok)) != KEEL_OK) {
                rc = cli_fail("demo: sample", st, NULL);
                goto done;
            }
            if (keel_token_is_eog(m, tok)) break;
            size_t pn = 0;
            st = keel_detok_stream_push(&ds, tok, piece, sizeof piece, &pn);
            if (st == KEEL_ERANGE) { /* a piece longer than the buffer: not shown */
                st = KEEL_OK;
                pn = 0;
            }
            if (st != KEEL_OK) {
                rc = cli_fail("demo: detokenize", st, NULL);
                goto done;
            }
            /* one line per turn; other control characters escaped */
            for (size_t j = 0; j < pn; j++)
                if (piece[j] == '\n') piece[j] = ' ';
            cli_put_escaped(stdout, piece, pn);
            keel_batch b = {1, &tok, NULL, NULL, NULL};
            if ((g_feed_status = keel_decode(c, &b)) != KEEL_OK) goto decode_fail;
            logits = keel_logits(c, 0);
            turn_tg++;
        }
        t_tg = (double)(keel_time_ns() - t0) * 1e-9;
        printf("\n");
        keel_mem_stats ms;
        keel_mem_stats_get(mem, &ms);
        printf("         seen %5lld tokens | held %3d cells (full) %lld/%lld (all tables) | KV %6.1f KiB | "
               "compactions %3lld | prefill %7.0f tok/s | decode %6.0f tok/s\n",
               (long long)ms.tokens_placed, keel_mem_seq_cells(mem, 0), (long long)ms.cells_used,
               (long long)ms.cells_cap, (double)ms.bytes_used / 1024,
               (long long)keel_mem_seq_compactions(mem, 0), t_pp > 0 ? turn_pp / t_pp : 0.0,
               t_tg > 0 ? turn_tg / t_tg : 0.0);
        pp_s += t_pp;
        tg_s += t_tg;
        pp_n += turn_pp;
        tg_n += turn_tg;
        if (!cli_flush_stdout()) {
            rc = 1;
            goto done;
        }
    }
    {
        keel_mem_stats ms;
        keel_mem_stats_get(mem, &ms);
        st = keel_mem_check(mem);
        printf("\nsummary: %d turns, %lld tokens seen in a %d-cell budget (%.1fx), %lld compactions, "
               "cells never above %d, invariants %s, prefill %.0f tok/s, decode %.0f tok/s\n",
               d.turns, (long long)ms.tokens_placed, o.ctx.compact.trigger,
               (double)ms.tokens_placed / o.ctx.compact.trigger,
               (long long)keel_mem_seq_compactions(mem, 0), keel_mem_seq_cells_high(mem, 0),
               st == KEEL_OK ? "ok" : keel_mem_last_error(mem), pp_s > 0 ? pp_n / pp_s : 0.0,
               tg_s > 0 ? tg_n / tg_s : 0.0);
        if (st != KEEL_OK) rc = 1;
    }
    goto done;
decode_fail:
    rc = cli_fail("demo: decode", g_feed_status, keel_context_last_error(c));
done:
    free(buf);
    keel_sampler_close(s);
    keel_context_close(c);
    keel_model_close(m);
    return rc;
}
