/*
 * common.c — options shared by the model commands (run, perplexity, bench,
 * tokenize, inspect) and their parsing: llama.cpp's flag names.
 */
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void cli_opts_init(cli_opts *o)
{
    memset(o, 0, sizeof *o);
    o->model = keel_model_params_default();
    o->ctx = keel_context_params_default();
    o->samp = keel_sampler_params_default();
    o->n_predict = 128;
    o->samp.seed = 0x5eed;
}

bool cli_parse_i32(const char *s, int32_t *out)
{
    /* strtol skips leading space: the whole string must be the number */
    if (!s || !*s || isspace((unsigned char)*s)) return false;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < INT32_MIN || v > INT32_MAX) return false;
    *out = (int32_t)v;
    return true;
}

bool cli_parse_f32(const char *s, float *out)
{
    if (!s || !*s || isspace((unsigned char)*s)) return false;
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end || !isfinite(v)) return false;
    *out = v;
    return true;
}

bool cli_parse_u64(const char *s, uint64_t *out)
{
    /* strtoull accepts "-1" (wrapping to 2^64 - 1): digits only at the start */
    if (!s || !(*s >= '0' && *s <= '9')) return false;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || end == s || *end) return false;
    *out = v;
    return true;
}

int cli_parse(int argc, char **argv, cli_opts *o, const char *usage)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true, takes = true;
#define IS(x) (strcmp(a, x) == 0)
        if (IS("-h") || IS("--help")) {
            fprintf(stdout, "%s\n", usage);
            return 1;
        } else if (IS("-m") || IS("--model")) {
            o->model.path = v;
        } else if (IS("--tokenizer")) {
            o->model.tokenizer_path = v;
        } else if (IS("-p") || IS("--prompt")) {
            o->prompt = v;
        } else if (IS("-f") || IS("--file")) {
            o->file = v;
        } else if (IS("--prompt-ids")) {
            o->prompt_ids = v;
        } else if (IS("--logits-out")) {
            o->logits_out = v;
        } else if (IS("--ids-out")) {
            o->ids_out = v;
        } else if (IS("-n") || IS("--n-predict")) {
            ok = v && cli_parse_i32(v, &o->n_predict);
        } else if (IS("-c") || IS("--ctx-size")) {
            ok = v && cli_parse_i32(v, &o->ctx.n_ctx);
        } else if (IS("-b") || IS("--batch-size")) {
            ok = v && cli_parse_i32(v, &o->ctx.n_batch);
            o->batch_set = true;
        } else if (IS("-ub") || IS("--ubatch-size")) {
            ok = v && cli_parse_i32(v, &o->ctx.n_ubatch);
        } else if (IS("-t") || IS("--threads")) {
            ok = v && cli_parse_i32(v, &o->ctx.n_threads);
        } else if (IS("-ctk") || IS("--ctk") || IS("--cache-type-k")) {
            ok = v && keel_dtype_from_name(v, &o->ctx.type_k) == KEEL_OK;
        } else if (IS("-ctv") || IS("--ctv") || IS("--cache-type-v")) {
            ok = v && keel_dtype_from_name(v, &o->ctx.type_v) == KEEL_OK;
        } else if (IS("--rot-k")) {
            ok = v && cli_parse_i32(v, &o->ctx.rot_k);
        } else if (IS("--rot-v")) {
            ok = v && cli_parse_i32(v, &o->ctx.rot_v);
        } else if (IS("--swa-window")) {
            ok = v && cli_parse_i32(v, &o->ctx.swa_window);
        } else if (IS("--swa-period")) {
            ok = v && cli_parse_i32(v, &o->ctx.swa_period);
        } else if (IS("--swa-sinks")) {
            ok = v && cli_parse_i32(v, &o->ctx.n_sink);
        } else if (IS("--kv-compact")) {
            ok = v && keel_compact_policy_from_name(v, &o->ctx.compact.policy) == KEEL_OK;
        } else if (IS("--kv-trigger")) {
            ok = v && cli_parse_i32(v, &o->ctx.compact.trigger);
        } else if (IS("--kv-target")) {
            ok = v && cli_parse_i32(v, &o->ctx.compact.target);
        } else if (IS("--kv-sinks")) {
            ok = v && cli_parse_i32(v, &o->ctx.compact.n_sink);
        } else if (IS("--kv-recent")) {
            ok = v && cli_parse_f32(v, &o->ctx.compact.recent);
        } else if (IS("--kv-positions")) {
            ok = v && (strcmp(v, "keep") == 0 || strcmp(v, "renumber") == 0);
            if (ok) o->ctx.compact.renumber = strcmp(v, "renumber") == 0;
        } else if (IS("--kv-seed")) {
            ok = v && cli_parse_u64(v, &o->ctx.compact.seed);
        } else if (IS("--temp")) {
            ok = v && cli_parse_f32(v, &o->samp.temp);
        } else if (IS("--top-k")) {
            ok = v && cli_parse_i32(v, &o->samp.top_k);
        } else if (IS("--top-p")) {
            ok = v && cli_parse_f32(v, &o->samp.top_p);
        } else if (IS("--min-p")) {
            ok = v && cli_parse_f32(v, &o->samp.min_p);
        } else if (IS("--repeat-penalty")) {
            ok = v && cli_parse_f32(v, &o->samp.repeat_penalty);
        } else if (IS("--repeat-last-n")) {
            ok = v && cli_parse_i32(v, &o->samp.repeat_last_n);
        } else if (IS("--presence-penalty")) {
            ok = v && cli_parse_f32(v, &o->samp.presence_penalty);
        } else if (IS("--frequency-penalty")) {
            ok = v && cli_parse_f32(v, &o->samp.frequency_penalty);
        } else if (IS("-s") || IS("--seed")) {
            ok = v && cli_parse_u64(v, &o->samp.seed);
        } else if (IS("--ignore-eos")) {
            o->ignore_eos = true;
            takes = false;
        } else if (IS("--json")) {
            o->json = true;
            takes = false;
        } else if (IS("--ids")) {
            o->ids_only = true;
            takes = false;
        } else if (IS("--no-tensors")) {
            o->no_tensors = true;
            takes = false;
        } else if (IS("-pp") || IS("--n-prompt")) {
            ok = v && cli_parse_i32(v, &o->bench_pp);
        } else if (IS("-tg") || IS("--n-gen")) {
            ok = v && cli_parse_i32(v, &o->bench_tg);
        } else if (o->extra && o->extra(o, a, v, &takes)) {
            /* command-specific */
        } else if (a[0] != '-' && !o->positional) {
            o->positional = a;
            takes = false;
        } else {
            fprintf(stderr, "keel: unknown option '%s'\n%s\n", a, usage);
            return 2;
        }
#undef IS
        if (takes && !v) {
            fprintf(stderr, "keel: option %s needs a value\n", a);
            return 2;
        }
        if (!ok) {
            fprintf(stderr, "keel: bad value for %s: '%s'\n", a, v ? v : "");
            return 2;
        }
        if (takes) i++;
    }
    return 0;
}

char *cli_read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t r = fread(buf + len, 1, cap - len - 1, f);
        len += r;
        if (r == 0) break;
        if (len + 1 == cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    fclose(f);
    if (buf) {
        buf[len] = 0;
        *n = len;
    }
    return buf;
}

int cli_open_model(cli_opts *o, keel_model **m)
{
    if (!o->model.path) {
        fprintf(stderr, "keel: no model (-m MODEL)\n");
        return 2;
    }
    char err[256] = "";
    keel_status st = keel_model_open(&o->model, m, err);
    if (st != KEEL_OK) return cli_fail(o->model.path, st, err);
    return 0;
}

/* The prompt as ids: --prompt-ids, -p or -f (tokenized with BOS). */
int cli_prompt_ids(cli_opts *o, const keel_model *m, int32_t **ids, int32_t *n)
{
    *ids = NULL;
    *n = 0;
    if (o->prompt_ids) {
        int32_t cap = 16, cnt = 0;
        int32_t *v = malloc((size_t)cap * sizeof(int32_t));
        const char *s = o->prompt_ids;
        while (v && *s) {
            char *end;
            long x = strtol(s, &end, 10);
            if (end == s) {
                free(v);
                fprintf(stderr, "keel: --prompt-ids: not a number at '%s'\n", s);
                return 2;
            }
            if (cnt == cap) {
                int32_t *nv = realloc(v, (size_t)(cap *= 2) * sizeof(int32_t));
                if (!nv) {
                    free(v);
                    v = NULL;
                    break;
                }
                v = nv;
            }
            v[cnt++] = (int32_t)x;
            s = end;
            while (*s == ',' || *s == ' ') s++;
        }
        if (!v) return cli_fail("prompt", KEEL_ENOMEM, NULL);
        *ids = v;
        *n = cnt;
        return 0;
    }
    char *text = NULL;
    size_t len = 0;
    if (o->file) {
        text = cli_read_file(o->file, &len);
        if (!text) {
            fprintf(stderr, "keel: cannot read %s\n", o->file);
            return 1;
        }
    } else if (o->prompt) {
        len = strlen(o->prompt);
        text = malloc(len + 1);
        if (text) memcpy(text, o->prompt, len + 1);
    } else {
        text = malloc(1);
        if (text) text[0] = 0;
    }
    if (!text) return cli_fail("prompt", KEEL_ENOMEM, NULL);
    int32_t need = 0;
    keel_status st = keel_tokenize(m, text, len, true, false, NULL, 0, &need);
    if (st != KEEL_OK && st != KEEL_ERANGE) {
        free(text);
        return cli_fail("tokenize", st, NULL);
    }
    int32_t *v = malloc((size_t)(need > 0 ? need : 1) * sizeof(int32_t));
    if (!v) {
        free(text);
        return cli_fail("tokenize", KEEL_ENOMEM, NULL);
    }
    st = keel_tokenize(m, text, len, true, false, v, need, &need);
    free(text);
    if (st != KEEL_OK) {
        free(v);
        return cli_fail("tokenize", st, NULL);
    }
    *ids = v;
    *n = need;
    return 0;
}
