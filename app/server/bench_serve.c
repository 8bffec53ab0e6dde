/*
 * bench_serve.c — `keel bench-serve`: starts keel serve in-process on a
 * loopback port (a generated ~100M-parameter llama model unless -m is
 * given), measures the engine's single-stream decode and prefill speed
 * without HTTP (keel_complete), then streams /v1/completions requests from
 * 1, 2, 4 and 8 concurrent clients and reports aggregate throughput and
 * time to first token beside that reference. A human table, or --json.
 *
 * Each request has its own random prompt (token ids), so no run reuses
 * another's cache; ignore_eos keeps every generation at -n tokens.
 */
#include "../cli/cli.h"
#include "srv.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct bench_opts {
    int32_t n_prompt, n_gen, requests, max_conc;
    int32_t conc[8];
    int n_conc;
} bench_opts;

static bool bench_extra(cli_opts *o, const char *a, const char *v, bool *takes)
{
    bench_opts *b = o->user;
    int32_t x;
    (void)takes;
    if (strcmp(a, "-p") == 0 || strcmp(a, "--prompt-tokens") == 0 || strcmp(a, "-n") == 0 ||
        strcmp(a, "--requests") == 0) {
        if (!v) return true;
        if (!cli_parse_i32(v, &x) || x < 1 || x > 1 << 16) {
            snprintf(o->extra_err, sizeof o->extra_err, "%s %s: must be an integer in [1, 65536]", a, v);
            return true;
        }
        if (strcmp(a, "-n") == 0)
            b->n_gen = x;
        else if (strcmp(a, "--requests") == 0)
            b->requests = x;
        else
            b->n_prompt = x;
        return true;
    }
    if (strcmp(a, "--concurrency") == 0) {
        if (!v) return true;
        b->n_conc = 0;
        b->max_conc = 0;
        const char *p = v;
        while (*p) {
            char num[16];
            size_t k = strcspn(p, ",");
            if (k == 0 || k >= sizeof num || b->n_conc == 8) {
                snprintf(o->extra_err, sizeof o->extra_err, "--concurrency %s: a list like 1,2,4,8 (at most 8)", v);
                return true;
            }
            memcpy(num, p, k);
            num[k] = 0;
            if (!cli_parse_i32(num, &x) || x < 1 || x > 64) {
                snprintf(o->extra_err, sizeof o->extra_err, "--concurrency %s: each in [1, 64]", v);
                return true;
            }
            b->conc[b->n_conc++] = x;
            if (x > b->max_conc) b->max_conc = x;
            p += k + (p[k] == ',');
        }
        return true;
    }
    return false;
}

/* ---- clients ------------------------------------------------------------------------ */

typedef struct run_ctx {
    int port;
    const bench_opts *b;
    int32_t n_vocab;
    atomic_int next; /* request counter (prompt seeds) */
    pthread_mutex_t mu;
    double *ttft;    /* [total requests] seconds */
    int n_ttft;
    int64_t tokens;
    int failures;
} run_ctx;

typedef struct stream_state {
    uint64_t t0, t_first;
    srv_buf acc;
    int64_t tokens;
} stream_state;

static bool on_sse(void *user, const char *p, size_t n)
{
    stream_state *st = user;
    if (!st->t_first && memmem(p, n, "\"text\":\"", 8) && !memmem(p, n, "\"text\":\"\"", 9)) st->t_first = keel_time_ns();
    srv_buf_add(&st->acc, p, n);
    return true;
}

static void *client(void *p)
{
    run_ctx *r = p;
    for (int k = 0; k < r->b->requests; k++) {
        int seed = atomic_fetch_add(&r->next, 1);
        srv_buf body = {0};
        srv_buf_adds(&body, "{\"prompt\":[");
        uint64_t x = 0x9e3779b97f4a7c15ull * (uint64_t)(seed + 1);
        for (int i = 0; i < r->b->n_prompt; i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            int32_t span = r->n_vocab > 400 ? r->n_vocab - 300 : r->n_vocab;
            srv_buf_addf(&body, "%s%d", i ? "," : "", (int)(r->n_vocab - span + (int32_t)(x % (uint64_t)span)));
        }
        srv_buf_addf(&body, "],\"max_tokens\":%d,\"temperature\":0,\"ignore_eos\":true,\"stream\":true,"
                            "\"stream_options\":{\"include_usage\":true}}", r->b->n_gen);
        stream_state st;
        memset(&st, 0, sizeof st);
        st.acc.max = (size_t)16 << 20;
        st.t0 = keel_time_ns();
        int fd = srv_http_connect("127.0.0.1", r->port);
        srv_http_resp resp;
        bool ok = fd >= 0 && srv_http_send(fd, "POST", "/v1/completions", NULL, body.p, body.len) &&
                  srv_http_read(fd, &resp, 600000, on_sse, &st) && resp.status == 200;
        if (fd >= 0) close(fd);
        /* completion tokens from the usage chunk */
        const char *u = st.acc.p ? strstr(st.acc.p, "\"completion_tokens\":") : NULL;
        int64_t toks = u ? atoll(u + 20) : 0;
        pthread_mutex_lock(&r->mu);
        if (ok && st.t_first && toks > 0) {
            r->ttft[r->n_ttft++] = (double)(st.t_first - st.t0) * 1e-9;
            r->tokens += toks;
        } else {
            r->failures++;
        }
        pthread_mutex_unlock(&r->mu);
        if (fd >= 0) srv_http_resp_free(&resp);
        srv_buf_free(&st.acc);
        srv_buf_free(&body);
    }
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* ---- the command ------------------------------------------------------------------------ */

typedef struct eng_thread {
    srv_server *s;
    atomic_int ready, failed;
    char err[256];
} eng_thread;

static void *engine_main(void *p)
{
    eng_thread *t = p;
    if (srv_load(t->s, t->err) != KEEL_OK) {
        atomic_store(&t->failed, 1);
        return NULL;
    }
    atomic_store(&t->ready, 1);
    keel_status st = srv_run(t->s);
    if (st != KEEL_OK) atomic_store(&t->failed, 1);
    return NULL;
}

int cmd_bench_serve(int argc, char **argv)
{
    cli_opts o;
    bench_opts b = {128, 64, 2, 8, {1, 2, 4, 8}, 4};
    cli_opts_init(&o);
    o.groups = CLI_G_MODEL | CLI_G_THREADS | CLI_G_KV | CLI_G_JSON;
    o.extra = bench_extra;
    o.user = &b;
    o.extra_help = "  -p N                           prompt tokens per request (128)\n"
                   "  -n N                           tokens generated per request (64)\n"
                   "  --requests N                   requests per client and concurrency (2)\n"
                   "  --concurrency LIST             concurrent clients, e.g. 1,2,4,8 (1,2,4,8)\n"
                   "  without -m: a generated ~100M-parameter llama model (q8_0) in /tmp";
    int rc = cli_parse(argc, argv, &o, "usage: keel bench-serve [-m MODEL] [-p 128] [-n 64] [--json]");
    if (rc) return rc == 1 ? 0 : 2;
    char gen_path[64] = "";
    const char *model = o.model.path;
    int64_t n_params = 0;
    if (!model) {
        keel_gen_params gp = keel_gen_params_default();
        gp.arch = "llama";
        gp.n_layer = 12;
        gp.n_embd = 768;
        gp.n_head = 12;
        gp.n_head_kv = 4;
        gp.n_ff = 2048;
        gp.n_vocab = 8192;
        gp.dtype = KEEL_DTYPE_Q8_0;
        char err[256] = "";
        snprintf(gen_path, sizeof gen_path, "/tmp/keel_bench_serve_XXXXXX");
        int fd = mkstemp(gen_path);
        if (fd < 0) return cli_fail("bench-serve: temporary model", KEEL_EIO, gen_path);
        close(fd);
        keel_status st = keel_gen_model(&gp, gen_path, err);
        if (st != KEEL_OK) {
            unlink(gen_path);
            return cli_fail("bench-serve: gen-model", st, err);
        }
        model = gen_path;
    }
    int32_t n_slots = b.max_conc;
    int32_t n_ctx = n_slots * (b.n_prompt + b.n_gen + 16);
    json_t *opts = json_pack("{sssisisisisissss}", "model", model, "n_ctx", n_ctx, "n_slots", n_slots, "n_threads",
                             o.ctx.n_threads, "n_batch", 2048 > n_ctx ? n_ctx : 2048, "n_ubatch", 512,
                             "type_k", keel_dtype_name(o.ctx.type_k), "type_v", keel_dtype_name(o.ctx.type_v));
    char *opts_text = opts ? json_dumps(opts, JSON_COMPACT) : NULL;
    if (opts) json_decref(opts);
    srv_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.host = "127.0.0.1";
    cfg.port = 0;
    cfg.model_path = model;
    cfg.engine_options = opts_text;
    cfg.timeout_s = 600;
    cfg.keep_alive_s = 5;
    cfg.read_timeout_s = 30;
    cfg.ping_s = 5;
    cfg.threads_http = 64;
    cfg.max_body = (size_t)8 << 20;
    cfg.default_max_tokens = -1;
    cfg.slots = true;
    cfg.webui = true;
    srv_server *s = NULL;
    char err[512] = "";
    eng_thread et;
    memset(&et, 0, sizeof et);
    pthread_t th;
    bool th_started = false;
    json_t *out = NULL;
    rc = 1;
    if (!opts_text || srv_start(&cfg, &s, err, sizeof err) != 0) {
        fprintf(stderr, "keel: bench-serve: %s\n", err[0] ? err : "out of memory");
        goto done;
    }
    et.s = s;
    if (pthread_create(&th, NULL, engine_main, &et) != 0) goto done;
    th_started = true;
    while (!atomic_load(&et.ready) && !atomic_load(&et.failed)) usleep(10000);
    if (atomic_load(&et.failed)) {
        fprintf(stderr, "keel: bench-serve: %s: %s\n", model, et.err);
        goto done;
    }
    keel_engine *e = srv_engine(s);
    keel_model_info mi;
    keel_model_info_get(keel_engine_model(e), &mi);
    n_params = mi.n_params;
    /* the reference: one stream, no HTTP */
    double ref_decode = 0, ref_prefill = 0;
    {
        srv_buf req = {0};
        srv_buf_adds(&req, "{\"prompt_tokens\":[");
        for (int i = 0; i < b.n_prompt; i++) srv_buf_addf(&req, "%s%d", i ? "," : "", 300 + (i * 7919) % (mi.n_vocab - 300));
        srv_buf_addf(&req, "],\"max_tokens\":%d,\"temperature\":0,\"ignore_eos\":true}", b.n_gen);
        char resp[8192];
        keel_status st = keel_complete(e, NULL, req.p, NULL, NULL, NULL, resp, sizeof resp);
        srv_buf_free(&req);
        json_t *r = st == KEEL_OK ? json_loads(resp, JSON_ALLOW_NUL, NULL) : NULL;
        json_t *t = json_object_get(r, "timings");
        ref_decode = json_number_value(json_object_get(t, "predicted_per_second"));
        ref_prefill = json_number_value(json_object_get(t, "prompt_per_second"));
        if (r) json_decref(r);
        if (st != KEEL_OK) {
            fprintf(stderr, "keel: bench-serve: reference run: %s: %s\n", keel_strerror(st), keel_engine_last_error(e));
            goto done;
        }
    }
    out = json_pack("{sssIsisisisis{sfsf}s[]}", "model", o.model.path ? o.model.path : "generated llama 12x768 q8_0",
                    "n_params", (json_int_t)n_params, "slots", n_slots, "prompt_tokens", b.n_prompt, "gen_tokens",
                    b.n_gen, "threads", o.ctx.n_threads ? o.ctx.n_threads : keel_cpu_count(), "single_stream",
                    "decode_tokens_per_second", ref_decode, "prefill_tokens_per_second", ref_prefill, "runs");
    if (!out) goto done;
    if (!o.json) {
        printf("bench-serve: %s (%lld parameters), %d slots, %d prompt + %d generated tokens per request, %d threads\n",
               o.model.path ? o.model.path : "generated llama 12 x 768, q8_0", (long long)n_params, n_slots, b.n_prompt,
               b.n_gen, o.ctx.n_threads ? o.ctx.n_threads : keel_cpu_count());
        printf("single-stream reference (engine, no HTTP): decode %.1f tok/s, prefill %.1f tok/s\n\n", ref_decode,
               ref_prefill);
        printf("%11s %9s %13s %15s %9s %14s %13s %12s\n", "concurrency", "requests", "total tok/s", "per stream tok/s",
               "vs ref", "TTFT mean ms", "TTFT p50 ms", "TTFT max ms");
    }
    for (int ci = 0; ci < b.n_conc; ci++) {
        int c = b.conc[ci];
        run_ctx r;
        memset(&r, 0, sizeof r);
        r.port = srv_port(s);
        r.b = &b;
        r.n_vocab = mi.n_vocab;
        atomic_init(&r.next, ci * 1000);
        pthread_mutex_init(&r.mu, NULL);
        r.ttft = calloc((size_t)c * (size_t)b.requests, sizeof(double));
        pthread_t ths[64];
        uint64_t t0 = keel_time_ns();
        int started = 0;
        for (int k = 0; k < c && r.ttft; k++)
            if (pthread_create(&ths[k], NULL, client, &r) == 0) started++;
        for (int k = 0; k < started; k++) pthread_join(ths[k], NULL);
        double wall = (double)(keel_time_ns() - t0) * 1e-9;
        double tps = wall > 0 ? (double)r.tokens / wall : 0, mean = 0, p50 = 0, mx = 0;
        if (r.n_ttft) {
            qsort(r.ttft, (size_t)r.n_ttft, sizeof(double), cmp_double);
            for (int k = 0; k < r.n_ttft; k++) mean += r.ttft[k];
            mean /= r.n_ttft;
            p50 = r.ttft[r.n_ttft / 2];
            mx = r.ttft[r.n_ttft - 1];
        }
        double per = c ? tps / c : 0;
        json_array_append_new(json_object_get(out, "runs"),
                              json_pack("{sisisisfsfsfsfsf}", "concurrency", c, "requests", r.n_ttft, "failures",
                                        r.failures, "tokens_per_second", tps, "per_stream_tokens_per_second", per,
                                        "ttft_mean_ms", mean * 1e3, "ttft_p50_ms", p50 * 1e3, "ttft_max_ms", mx * 1e3));
        if (!o.json)
            printf("%11d %9d %13.1f %15.1f %8.2fx %14.1f %13.1f %12.1f%s\n", c, r.n_ttft, tps, per,
                   ref_decode > 0 ? tps / ref_decode : 0, mean * 1e3, p50 * 1e3, mx * 1e3, r.failures ? "  (failures)" : "");
        free(r.ttft);
        pthread_mutex_destroy(&r.mu);
        if (r.failures) {
            fprintf(stderr, "keel: bench-serve: %d requests failed at concurrency %d\n", r.failures, c);
            goto done;
        }
    }
    if (o.json) {
        char *t = json_dumps(out, JSON_INDENT(2) | JSON_REAL_PRECISION(6));
        if (t) printf("%s\n", t);
        free(t);
    }
    rc = 0;
done:
    if (s) srv_quiesce(s);
    if (th_started) {
        while (!atomic_load(&et.failed) && atomic_load(&et.ready) && srv_engine(s)) {
            keel_engine_stop(srv_engine(s));
            struct timespec ts = {0, 20 * 1000000L};
            nanosleep(&ts, NULL);
            if (pthread_tryjoin_np(th, NULL) == 0) {
                th_started = false;
                break;
            }
        }
        if (th_started) pthread_join(th, NULL);
    }
    srv_free(s);
    free(opts_text);
    if (out) json_decref(out);
    if (gen_path[0]) unlink(gen_path);
    return rc;
}
