/*
 * serve.c — `keel serve`: llama-server's flags (parsed strictly; the model,
 * context, KV and compaction flags through the CLI's shared flag table),
 * mapped to keel_engine_open options and request defaults; then listen,
 * load (printing the memory plan), serve, and on SIGINT/SIGTERM shut down:
 * stop accepting, cancel what runs (keel_engine_stop), free everything,
 * exit 0.
 *
 * Threads: SIGINT/SIGTERM are blocked before any thread starts, so only
 * the main thread receives them (sigtimedwait); one engine thread loads the
 * model and then runs the scheduler; libmicrohttpd runs one thread per
 * connection.
 */
#include "../cli/cli.h"
#include "srv.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define SERVE_MAX_KEYS 256

typedef struct serve_opts {
    const char *host, *slot_save_path, *api_key_file, *chat_template, *alias, *tool_format;
    const char *cache_redis;
    int32_t redis_ttl, redis_max_mib, redis_timeout_ms;
    int32_t port, n_slots, cache_ram, timeout, threads_http, n_predict, max_body;
    int32_t keep_alive, read_timeout, sse_ping;
    bool cache_ram_set, metrics, no_slots, no_webui, log_disable, deterministic, strict_tools;
    float prefill_share; /* 0: the engine's default */
    uint64_t seed;
    bool seed_set;
    char *keys[SERVE_MAX_KEYS];
    int n_keys;
    cli_spec spec;
} serve_opts;

static const char g_usage[] =
    "usage: keel serve -m MODEL [--host 127.0.0.1] [--port 8080] [-c N] [-np N] [options]\n"
    "  an OpenAI- and Anthropic-compatible HTTP server (docs/server.md)";

static const char g_help[] =
    "server options (llama-server's names):\n"
    "  --host HOST                    address to listen on (127.0.0.1)\n"
    "  --port PORT                    port; 0: any free port (8080)\n"
    "  -np, --parallel N              slots: requests served at once (1)\n"
    "  -n, --n-predict N              max_tokens of requests that give none; -1: up to the context (-1)\n"
    "  -s, --seed S                   default sampling seed of requests (random per request)\n"
    "  --cache-ram MIB                RAM prompt cache bound in MiB; 0: off (8192)\n"
    "  --cache-redis URL              shared prompt-cache tier: redis://[:PASSWORD@]HOST[:PORT][/DB]\n"
    "                                 (docs/cache-tier.md; servers with one model and K/V setup share states)\n"
    "  --cache-redis-ttl S            expiry of what this server writes (3600)\n"
    "  --cache-redis-max-mib N        write queue bound, also the largest state moved (512)\n"
    "  --cache-redis-timeout MS       connect and read timeout (2000)\n"
    "  --ctx-checkpoints N            checkpoints per slot of its recurrent state or sliding rings, reserved\n"
    "                                 in the plan (8 with recurrent layers; sliding: up to 8 in 1/4 of the KV)\n"
    "  --checkpoint-every N           also a checkpoint every N prompt tokens (0: at prompt ends)\n"
    "  --prefill-share F              while a slot generates, the share of each step's time other\n"
    "                                 slots' prefill may take, in (0, 1]; 1: whole batches (0.4)\n"
    "  --slot-save-path DIR           directory for /slots/{id}?action=save|restore files\n"
    "  --api-key KEY                  require KEY (Bearer or x-api-key); repeatable, comma-separated\n"
    "  --api-key-file FILE            keys, one per line\n"
    "  --metrics                      enable GET /metrics (Prometheus text)\n"
    "  --no-slots                     disable GET /slots\n"
    "  --no-webui                     no chat page at / (404)\n"
    "  --chat-template T              built-in name (chatml llama3 gemma mistral qwen3), file, or source\n"
    "  --chat-template-file FILE      a template file\n"
    "  --tool-format F                tool-call parser format (default: detected from the template)\n"
    "  --strict-tools                 constrain every tool call to the tool's schema (a grammar from the\n"
    "                                 call's opening marker on); default: tools with strict: true and\n"
    "                                 a tool_choice that forces a call\n"
    "  -a, --alias NAME               model name in responses (the file name)\n"
    "  -to, --timeout S               longest silence of a connection during a request, in seconds (600)\n"
    "  --keep-alive-timeout S         close a connection idle between requests after S seconds (5)\n"
    "  --read-timeout S               seconds a client has to send a request's headers, and again its body (30)\n"
    "  --sse-ping S                   a silent stream (a long prefill) gets a keep-alive every S seconds (5)\n"
    "  --threads-http N               connections served at once, one thread each; up to 64 more are\n"
    "                                 answered 503 (max(64, 4 x slots))\n"
    "  --max-body MIB                 largest request body in MiB (8)\n"
    "  --deterministic                batch-invariant numerics: a request's tokens do not depend on\n"
    "                                 what else is batched with it (slower)\n"
    "  --log-disable                  no per-request log lines on stderr\n"
    CLI_SPEC_HELP "\n"
    "  --jinja                        accepted for llama-server compatibility (templates are always Jinja)\n"
    "  serve defaults differ from the table above: -b 2048 (llama-server's)";

static bool bad(cli_opts *o, const char *a, const char *v, const char *need)
{
    snprintf(o->extra_err, sizeof o->extra_err, "%s %s: must be %s", a, v, need);
    return true;
}

static bool int_in(cli_opts *o, const char *a, const char *v, int32_t lo, int32_t hi, int32_t *out)
{
    int32_t x;
    if (!v) return true; /* cli_parse reports the missing value */
    if (!cli_parse_i32(v, &x) || x < lo || x > hi) {
        char need[64];
        snprintf(need, sizeof need, "an integer in [%d, %d]", lo, hi);
        return bad(o, a, v, need);
    }
    *out = x;
    return true;
}

static bool add_keys(serve_opts *so, cli_opts *o, const char *a, const char *list, char sep)
{
    const char *p = list;
    while (*p) {
        const char *q = strchr(p, sep);
        size_t n = q ? (size_t)(q - p) : strlen(p);
        while (n && (p[n - 1] == ' ' || p[n - 1] == '\r' || p[n - 1] == '\t')) n--;
        while (n && (*p == ' ' || *p == '\t')) {
            p++;
            n--;
        }
        if (n) {
            if (so->n_keys >= SERVE_MAX_KEYS) {
                snprintf(o->extra_err, sizeof o->extra_err, "%s: more than %d API keys", a, SERVE_MAX_KEYS);
                return true;
            }
            char *k = malloc(n + 1);
            if (!k) {
                snprintf(o->extra_err, sizeof o->extra_err, "%s: out of memory", a);
                return true;
            }
            memcpy(k, p, n);
            k[n] = 0;
            so->keys[so->n_keys++] = k;
        }
        if (!q) break;
        p = q + 1;
    }
    return true;
}

static bool serve_extra(cli_opts *o, const char *a, const char *v, bool *takes)
{
    serve_opts *so = o->user;
    int32_t x = 0;
    if (cli_spec_flag(&so->spec, a, v, takes, o->extra_err)) return true;
    if (strcmp(a, "--host") == 0) {
        so->host = v;
    } else if (strcmp(a, "--port") == 0) {
        return int_in(o, a, v, 0, 65535, &so->port);
    } else if (strcmp(a, "-np") == 0 || strcmp(a, "--parallel") == 0) {
        return int_in(o, a, v, 1, 256, &so->n_slots);
    } else if (strcmp(a, "-n") == 0 || strcmp(a, "--n-predict") == 0 || strcmp(a, "--predict") == 0) {
        return int_in(o, a, v, -1, INT32_MAX, &so->n_predict);
    } else if (strcmp(a, "-s") == 0 || strcmp(a, "--seed") == 0) {
        if (v && !cli_parse_u64(v, &so->seed)) return bad(o, a, v, "an unsigned decimal integer");
        so->seed_set = true;
    } else if (strcmp(a, "--cache-ram") == 0 || strcmp(a, "-cram") == 0) {
        so->cache_ram_set = true;
        if (v && strcmp(v, "-1") == 0)
            return bad(o, a, v, "a bound in MiB, [0, 16777216] (keel never allocates past its plan; 0: off)");
        return int_in(o, a, v, 0, 1 << 24, &so->cache_ram);
    } else if (strcmp(a, "--cache-redis") == 0) {
        so->cache_redis = v;
    } else if (strcmp(a, "--cache-redis-ttl") == 0) {
        return int_in(o, a, v, 1, 1 << 30, &so->redis_ttl);
    } else if (strcmp(a, "--cache-redis-max-mib") == 0) {
        return int_in(o, a, v, 1, 1 << 20, &so->redis_max_mib);
    } else if (strcmp(a, "--cache-redis-timeout") == 0) {
        return int_in(o, a, v, 1, 600000, &so->redis_timeout_ms);
    } else if (strcmp(a, "--swa-checkpoints") == 0) { /* llama-server's older name of --ctx-checkpoints */
        return int_in(o, a, v, 0, 4096, &o->ctx.n_ctx_checkpoints);
    } else if (strcmp(a, "--prefill-share") == 0) {
        if (v && (!cli_parse_f32(v, &so->prefill_share) || !(so->prefill_share > 0.0f) || so->prefill_share > 1.0f))
            return bad(o, a, v, "a number in (0, 1]");
    } else if (strcmp(a, "--slot-save-path") == 0) {
        so->slot_save_path = v;
    } else if (strcmp(a, "--api-key") == 0) {
        return v ? add_keys(so, o, a, v, ',') : true;
    } else if (strcmp(a, "--api-key-file") == 0) {
        so->api_key_file = v;
    } else if (strcmp(a, "--metrics") == 0) {
        so->metrics = true;
        *takes = false;
    } else if (strcmp(a, "--no-webui") == 0) {
        so->no_webui = true;
        *takes = false;
    } else if (strcmp(a, "--no-slots") == 0) {
        so->no_slots = true;
        *takes = false;
    } else if (strcmp(a, "--slots") == 0) {
        so->no_slots = false;
        *takes = false;
    } else if (strcmp(a, "--jinja") == 0) {
        *takes = false;
    } else if (strcmp(a, "--log-disable") == 0) {
        so->log_disable = true;
        *takes = false;
    } else if (strcmp(a, "--deterministic") == 0) {
        so->deterministic = true;
        *takes = false;
    } else if (strcmp(a, "--strict-tools") == 0) {
        so->strict_tools = true;
        *takes = false;
    } else if (strcmp(a, "--chat-template") == 0 || strcmp(a, "--chat-template-file") == 0) {
        so->chat_template = v;
    } else if (strcmp(a, "--tool-format") == 0) {
        so->tool_format = v;
    } else if (strcmp(a, "-a") == 0 || strcmp(a, "--alias") == 0) {
        so->alias = v;
    } else if (strcmp(a, "-to") == 0 || strcmp(a, "--timeout") == 0) {
        return int_in(o, a, v, 1, 86400, &so->timeout);
    } else if (strcmp(a, "--keep-alive-timeout") == 0) {
        return int_in(o, a, v, 1, 86400, &so->keep_alive);
    } else if (strcmp(a, "--read-timeout") == 0) {
        return int_in(o, a, v, 1, 86400, &so->read_timeout);
    } else if (strcmp(a, "--sse-ping") == 0) {
        return int_in(o, a, v, 1, 3600, &so->sse_ping);
    } else if (strcmp(a, "--threads-http") == 0) {
        if (!int_in(o, a, v, -1, 65536, &x)) return true;
        so->threads_http = x == 0 ? -1 : x;
    } else if (strcmp(a, "--max-body") == 0) {
        return int_in(o, a, v, 1, 4096, &so->max_body);
    } else {
        return false;
    }
    return true;
}

/* --api-key-file: one key per line (blank lines skipped). */
static int read_key_file(serve_opts *so, cli_opts *o)
{
    size_t n = 0;
    char *text = cli_read_file(so->api_key_file, &n);
    if (!text) {
        fprintf(stderr, "keel: --api-key-file %s: %s\n", so->api_key_file, strerror(errno));
        return 1;
    }
    if (memchr(text, 0, n)) {
        free(text);
        fprintf(stderr, "keel: --api-key-file %s: holds a NUL byte\n", so->api_key_file);
        return 1;
    }
    add_keys(so, o, "--api-key-file", text, '\n');
    free(text);
    if (o->extra_err[0]) {
        fprintf(stderr, "keel: %s\n", o->extra_err);
        return 1;
    }
    return 0;
}

static int set(json_t *o, const char *k, json_t *v)
{
    return v ? json_object_set_new(o, k, v) : -1;
}

/* The engine options JSON of the flags. */
static json_t *engine_options(const cli_opts *o, const serve_opts *so)
{
    const keel_context_params *cp = &o->ctx;
    json_t *j = json_object();
    if (!j) return NULL;
    int bad_ = set(j, "model", json_string(o->model.path));
    if (o->model.tokenizer_path) bad_ |= set(j, "tokenizer", json_string(o->model.tokenizer_path));
    bad_ |= set(j, "load", json_string(keel_load_name(o->model.load)));
    bad_ |= set(j, "n_ctx", json_integer(cp->n_ctx));
    bad_ |= set(j, "n_slots", json_integer(so->n_slots));
    bad_ |= set(j, "n_batch", json_integer(o->batch_set ? cp->n_batch : 2048));
    bad_ |= set(j, "n_ubatch", json_integer(cp->n_ubatch));
    bad_ |= set(j, "n_threads", json_integer(cp->n_threads));
    bad_ |= set(j, "type_k", json_string(keel_dtype_name(cp->type_k)));
    bad_ |= set(j, "type_v", json_string(keel_dtype_name(cp->type_v)));
    bad_ |= set(j, "rot_k", json_integer(cp->rot_k));
    bad_ |= set(j, "rot_v", json_integer(cp->rot_v));
    if (cp->swa_window > 0) {
        bad_ |= set(j, "swa_window", json_integer(cp->swa_window));
        bad_ |= set(j, "swa_period", json_integer(cp->swa_period));
    }
    if (cp->n_sink > 0) bad_ |= set(j, "swa_sinks", json_integer(cp->n_sink));
    const keel_compact_params *kc = &cp->compact;
    if (kc->policy != KEEL_COMPACT_NONE) {
        json_t *c = json_pack("{sssisfsssI}", "policy", keel_compact_policy_name(kc->policy), "sinks", kc->n_sink,
                              "recent", (double)kc->recent, "positions", kc->renumber ? "renumber" : "keep", "seed",
                              (json_int_t)kc->seed);
        if (c && o->kv_trigger_set) json_object_set_new(c, "trigger", json_integer(kc->trigger));
        if (c && o->kv_target_set) json_object_set_new(c, "target", json_integer(kc->target));
        bad_ |= set(j, "kv_compact", c);
    }
    if (so->chat_template) bad_ |= set(j, "chat_template", json_string(so->chat_template));
    if (so->tool_format) bad_ |= set(j, "tool_format", json_string(so->tool_format));
    bad_ |= set(j, "cache_ram_mib", json_integer(so->cache_ram));
    if (so->cache_redis) {
        bad_ |= set(j, "cache_redis", json_string(so->cache_redis));
        if (so->redis_ttl) bad_ |= set(j, "cache_redis_ttl", json_integer(so->redis_ttl));
        if (so->redis_max_mib) bad_ |= set(j, "cache_redis_max_mib", json_integer(so->redis_max_mib));
        if (so->redis_timeout_ms) bad_ |= set(j, "cache_redis_timeout_ms", json_integer(so->redis_timeout_ms));
    }
    /* the shared flag table parses --ctx-checkpoints and --checkpoint-every */
    bad_ |= set(j, "ctx_checkpoints", json_integer(cp->n_ctx_checkpoints));
    bad_ |= set(j, "checkpoint_every", json_integer(cp->checkpoint_every));
    if (so->deterministic) bad_ |= set(j, "deterministic", json_true());
    if (so->spec.p.kind != KEEL_SPEC_NONE) {
        const keel_spec_params *sp = &so->spec.p;
        bad_ |= set(j, "spec", json_string(sp->kind == KEEL_SPEC_NGRAM ? "ngram" : "draft"));
        bad_ |= set(j, "spec_max", json_integer(sp->max_draft));
        bad_ |= set(j, "spec_min_n", json_integer(sp->min_n));
        bad_ |= set(j, "spec_max_n", json_integer(sp->max_n));
        bad_ |= set(j, "spec_adaptive", json_boolean(sp->adaptive));
        if (so->spec.draft) bad_ |= set(j, "model_draft", json_string(so->spec.draft));
    }
    if (so->prefill_share > 0) bad_ |= set(j, "prefill_share", json_real(so->prefill_share));
    if (bad_) {
        json_decref(j);
        return NULL;
    }
    return j;
}

/* A float flag as the decimal the user typed (0.8, not 0.800000011920929). */
static double r6(float x)
{
    return round((double)x * 1e6) / 1e6;
}

/* Sampling defaults of requests (members they leave out). */
static json_t *request_defaults(const cli_opts *o, const serve_opts *so)
{
    const keel_sampler_params *p = &o->samp;
    json_t *d = json_pack("{sfsisfsfsfsisfsf}", "temperature", r6(p->temp), "top_k", p->top_k, "top_p", r6(p->top_p),
                          "min_p", r6(p->min_p), "repeat_penalty", r6(p->repeat_penalty), "repeat_last_n",
                          p->repeat_last_n, "presence_penalty", r6(p->presence_penalty), "frequency_penalty",
                          r6(p->frequency_penalty));
    if (d && so->seed_set) json_object_set_new(d, "seed", json_integer((json_int_t)(so->seed & INT64_MAX)));
    /* --strict-tools: the engine constrains every tool call (a request's own "strict_tools" wins) */
    if (d && so->strict_tools && json_object_set_new(d, "strict_tools", json_true()) != 0) {
        json_decref(d);
        d = NULL;
    }
    return d;
}

/* ---- the plan ------------------------------------------------------------------- */

static void print_bytes(const char *label, double v)
{
    printf("  %-28s %10.1f MiB\n", label, v / (1024.0 * 1024.0));
}

static const char *plan_label(const char *k)
{
    static const char *const names[][2] = {
        {"weights_mapped", "weights (model file)"}, {"kv_bytes", "KV cache rows"},
        {"mem_bytes", "KV memory (with tables)"},   {"work_bytes", "forward scratch"},
        {"logits_bytes", "logits"},                 {"context_bytes", "context total"},
        {"cache_ram_bytes", "prompt cache (cap)"},  {"checkpoint_bytes", "checkpoints (cap)"},
        {"draft_weights_mapped", "draft model (file)"}, {"draft_context_bytes", "draft model context"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(k, names[i][0]) == 0) return names[i][1];
    return k;
}

/* Parts already inside context_bytes. */
static bool plan_part(const char *k)
{
    return !strcmp(k, "kv_bytes") || !strcmp(k, "mem_bytes") || !strcmp(k, "work_bytes") || !strcmp(k, "logits_bytes");
}

static void print_plan(srv_server *s, const srv_config *cfg)
{
    char *text = srv_stats(s);
    json_t *st = text ? json_loads(text, 0, NULL) : NULL;
    free(text);
    json_t *mi = json_object_get(st, "model");
    printf("keel serve: model %s: %s, %lld parameters, vocabulary %lld, trained context %lld\n",
           cfg->model_path, json_string_value(json_object_get(mi, "arch")) ? json_string_value(json_object_get(mi, "arch")) : "?",
           (long long)json_integer_value(json_object_get(mi, "n_params")),
           (long long)json_integer_value(json_object_get(mi, "n_vocab")),
           (long long)json_integer_value(json_object_get(mi, "n_ctx_train")));
    printf("keel serve: %lld slots x %lld cells (n_ctx %lld), chat template %s, tool calls %s\n",
           (long long)json_integer_value(json_object_get(st, "n_slots")),
           (long long)json_integer_value(json_object_get(mi, "n_ctx_slot")),
           (long long)json_integer_value(json_object_get(st, "n_ctx")),
           json_string_value(json_object_get(st, "chat_template")) ? json_string_value(json_object_get(st, "chat_template")) : "?",
           json_string_value(json_object_get(st, "tool_format")) ? json_string_value(json_object_get(st, "tool_format")) : "?");
    printf("memory plan:\n");
    const char *k;
    json_t *v;
    double total = 0;
    json_object_foreach(json_object_get(st, "plan"), k, v) {
        if (!json_is_number(v)) continue;
        print_bytes(plan_label(k), json_number_value(v));
        if (!plan_part(k)) total += json_number_value(v);
    }
    json_t *pc = json_object_get(st, "prompt_cache");
    if (json_is_number(json_object_get(pc, "limit_bytes"))) {
        double lim = json_number_value(json_object_get(pc, "limit_bytes"));
        print_bytes(lim > 0 ? "prompt cache (bound)" : "prompt cache (off)", lim);
        total += lim;
    }
    print_bytes("total", total);
    printf("  %-28s %d connections x (%zu MiB body + 4 MiB event queue) at most\n", "HTTP buffers", cfg->threads_http,
           cfg->max_body >> 20);
    printf("keel serve: connections: %d served, %d more answered 503; idle ones closed after %d s, a request's "
           "headers and body each within %d s\n", cfg->threads_http, SRV_CONN_EXTRA, cfg->keep_alive_s,
           cfg->read_timeout_s);
    if (st) json_decref(st);
}

/* ---- run ------------------------------------------------------------------------- */

typedef struct serve_ctx {
    srv_server *s;
    const srv_config *cfg;
    pthread_mutex_t mu;
    bool stop, running;
    atomic_int finished, failed;
} serve_ctx;

static void *engine_main(void *p)
{
    serve_ctx *x = p;
    char err[256] = "";
    keel_status st = srv_load(x->s, err);
    if (st != KEEL_OK) {
        fprintf(stderr, "keel: %s: %s: %s\n", x->cfg->model_path, keel_strerror(st), err);
        atomic_store(&x->failed, 1);
        atomic_store(&x->finished, 1);
        return NULL;
    }
    print_plan(x->s, x->cfg);
    printf("keel serve: ready\n");
    fflush(stdout);
    pthread_mutex_lock(&x->mu);
    bool stop = x->stop;
    x->running = !stop;
    pthread_mutex_unlock(&x->mu);
    if (!stop) {
        st = srv_run(x->s);
        if (st != KEEL_OK) {
            fprintf(stderr, "keel serve: the scheduler stopped: %s\n", keel_strerror(st));
            atomic_store(&x->failed, 1);
        }
    }
    atomic_store(&x->finished, 1);
    return NULL;
}

int cmd_serve(int argc, char **argv)
{
    cli_opts o;
    serve_opts so;
    memset(&so, 0, sizeof so);
    so.host = "127.0.0.1";
    so.port = 8080;
    so.n_slots = 1;
    so.cache_ram = 8192;
    so.timeout = 600;
    so.keep_alive = 5;
    so.read_timeout = 30;
    so.sse_ping = 5;
    so.threads_http = -1;
    so.n_predict = -1;
    so.max_body = 8;
    so.spec.p = keel_spec_params_default();
    cli_opts_init(&o);
    o.groups = CLI_G_MODEL | CLI_G_CTX | CLI_G_THREADS | CLI_G_KV | CLI_G_COMPACT | CLI_G_BUDGET | CLI_G_SAMPLE;
    o.extra = serve_extra;
    o.extra_help = g_help;
    o.user = &so;
    int rc = cli_parse(argc, argv, &o, g_usage);
    json_t *opts = NULL, *defaults = NULL;
    char *opts_text = NULL;
    srv_server *s = NULL;
    if (rc) {
        rc = rc == 1 ? 0 : 2;
        goto out;
    }
    if (!o.model.path) {
        fprintf(stderr, "keel: serve needs a model (-m MODEL)\n%s\n", g_usage);
        rc = 2;
        goto out;
    }
    if (o.ctx.compact.policy == KEEL_COMPACT_NONE && o.kv_flag) {
        fprintf(stderr, "keel: %s needs --kv-compact POLICY (compaction is off)\n", o.kv_flag);
        rc = 2;
        goto out;
    }
    if (so.api_key_file && (rc = read_key_file(&so, &o)) != 0) goto out;
    if (so.slot_save_path) {
        struct stat sb;
        if (stat(so.slot_save_path, &sb) != 0 && errno == ENOENT && mkdir(so.slot_save_path, 0700) != 0) {
            fprintf(stderr, "keel: --slot-save-path %s: %s\n", so.slot_save_path, strerror(errno));
            rc = 1;
            goto out;
        }
        if (stat(so.slot_save_path, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
            fprintf(stderr, "keel: --slot-save-path %s: not a directory\n", so.slot_save_path);
            rc = 1;
            goto out;
        }
    }
    opts = engine_options(&o, &so);
    defaults = request_defaults(&o, &so);
    opts_text = opts ? json_dumps(opts, JSON_COMPACT) : NULL;
    if (!opts_text || !defaults) {
        rc = cli_fail("serve", KEEL_ENOMEM, NULL);
        goto out;
    }
    srv_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.host = so.host;
    cfg.port = so.port;
    cfg.model_path = o.model.path;
    cfg.alias = so.alias;
    cfg.engine_options = opts_text;
    cfg.defaults = defaults;
    cfg.api_keys = (const char *const *)so.keys;
    cfg.n_api_keys = so.n_keys;
    cfg.slot_save_path = so.slot_save_path;
    cfg.metrics = so.metrics;
    cfg.slots = !so.no_slots;
    cfg.webui = !so.no_webui;
    cfg.log = !so.log_disable;
    cfg.timeout_s = so.timeout;
    cfg.keep_alive_s = so.keep_alive;
    cfg.read_timeout_s = so.read_timeout;
    cfg.ping_s = so.sse_ping;
    cfg.threads_http = so.threads_http > 0 ? so.threads_http : (4 * so.n_slots > 64 ? 4 * so.n_slots : 64);
    cfg.max_body = (size_t)so.max_body << 20;
    cfg.default_max_tokens = so.n_predict;

    /* only the main thread takes SIGINT/SIGTERM; a closed client socket
     * must not kill the process */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    char err[512] = "";
    if (srv_start(&cfg, &s, err, sizeof err) != 0) {
        fprintf(stderr, "keel: serve: %s\n", err);
        rc = 1;
        goto out;
    }
    printf("keel serve: listening on http://%s%s%s:%d (loading %s)\n", strchr(so.host, ':') ? "[" : "", so.host,
           strchr(so.host, ':') ? "]" : "", srv_port(s), o.model.path);
    fflush(stdout);

    serve_ctx x;
    memset(&x, 0, sizeof x);
    x.s = s;
    x.cfg = &cfg;
    pthread_mutex_init(&x.mu, NULL);
    atomic_init(&x.finished, 0);
    atomic_init(&x.failed, 0);
    pthread_t th;
    if (pthread_create(&th, NULL, engine_main, &x) != 0) {
        fprintf(stderr, "keel: serve: cannot start the engine thread\n");
        pthread_mutex_destroy(&x.mu);
        rc = 1;
        goto out;
    }
    int sig = 0;
    while (!atomic_load(&x.finished)) {
        struct timespec ts = {0, 200 * 1000000L};
        int r = sigtimedwait(&sigs, NULL, &ts);
        if (r == SIGINT || r == SIGTERM) {
            sig = r;
            break;
        }
    }
    if (sig) fprintf(stderr, "keel serve: %s: shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    srv_quiesce(s);
    pthread_mutex_lock(&x.mu);
    x.stop = true;
    bool running = x.running;
    pthread_mutex_unlock(&x.mu);
    /* keel_engine_run may still be starting (it clears a stop that came
     * before it): repeat the stop until the loop is over */
    while (running && !atomic_load(&x.finished)) {
        keel_engine_stop(srv_engine(s));
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    pthread_join(th, NULL);
    pthread_mutex_destroy(&x.mu);
    rc = atomic_load(&x.failed) ? 1 : 0;
out:
    srv_free(s);
    free(opts_text);
    if (opts) json_decref(opts);
    if (defaults) json_decref(defaults);
    for (int i = 0; i < so.n_keys; i++) free(so.keys[i]);
    return rc;
}
