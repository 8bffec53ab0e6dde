/*
 * common.c — options shared by the model commands (run, perplexity, bench,
 * tokenize, inspect, demo) and their parsing: llama.cpp's flag names.
 *
 * One table (g_flags) describes every shared flag: its names, the group a
 * command accepts it through, its value type and range, and its help line.
 * The parser and each command's -h are driven by the same table, so a
 * command lists exactly the flags it accepts. Values are parsed strictly
 * (cli_parse_*: whole string, range-checked); a flag the command does not
 * accept, a stray argument (including a value after a boolean flag) and a
 * bad value are usage errors that name the flag.
 */
#include "cli.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void cli_opts_init(cli_opts *o)
{
    memset(o, 0, sizeof *o);
    o->model = keel_model_params_default();
    o->ctx = keel_context_params_default();
    o->samp = keel_sampler_params_default();
    o->n_predict = 128;
    o->samp.seed = 0x5eed;
}

/* ---- strict numbers ------------------------------------------------------ */

static bool starts_number(const char *s, bool sign)
{
    if (!s) return false;
    if (sign && (*s == '-' || *s == '+')) s++;
    return (*s >= '0' && *s <= '9') || (*s == '.' && s[1] >= '0' && s[1] <= '9');
}

bool cli_parse_i32(const char *s, int32_t *out)
{
    if (!starts_number(s, true)) return false;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < INT32_MIN || v > INT32_MAX) return false;
    *out = (int32_t)v;
    return true;
}

bool cli_parse_f32(const char *s, float *out)
{
    if (!starts_number(s, true)) return false;
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    /* ERANGE on underflow returns a usable tiny value; overflow gives inf */
    if (end == s || *end || !isfinite(v)) return false;
    *out = v;
    return true;
}

bool cli_parse_u64(const char *s, uint64_t *out)
{
    if (!starts_number(s, false)) return false;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end) return false;
    *out = (uint64_t)v;
    return true;
}

/* ---- checked output ------------------------------------------------------ */

bool cli_write(FILE *f, const void *p, size_t n, const char *what)
{
    if (n == 0 || fwrite(p, 1, n, f) == n) return true;
    fprintf(stderr, "keel: %s: %s\n", what, strerror(errno ? errno : EIO));
    return false;
}

bool cli_close(FILE *f, const char *what)
{
    if (!f) return true;
    errno = 0;
    bool ok = fflush(f) == 0 && !ferror(f);
    int e = errno;
    if (fclose(f) != 0 && ok) {
        ok = false;
        e = errno;
    }
    if (!ok) fprintf(stderr, "keel: %s: %s\n", what, e ? strerror(e) : "write error");
    return ok;
}

static bool g_stdout_reported; /* one message, however many writes fail */

static bool stdout_error(int e)
{
    if (!g_stdout_reported)
        fprintf(stderr, "keel: writing to standard output: %s\n", e ? strerror(e) : "write error");
    g_stdout_reported = true;
    return false;
}

bool cli_flush_stdout(void)
{
    errno = 0;
    if (fflush(stdout) == 0 && !ferror(stdout)) return true;
    return stdout_error(errno);
}

bool cli_write_stdout(const void *p, size_t n)
{
    errno = 0;
    if ((n == 0 || fwrite(p, 1, n, stdout) == n) && fflush(stdout) == 0) return true;
    return stdout_error(errno);
}

/* ---- the prefill progress line --------------------------------------------- */

void cli_progress_begin(cli_progress *p)
{
    p->tty = isatty(STDERR_FILENO) == 1;
    p->shown = false;
    p->t0 = keel_time_ns();
}

void cli_progress_show(cli_progress *p, int64_t done, int64_t total)
{
    if (!p->tty || done <= 0 || done >= total) return;
    double el = (double)(keel_time_ns() - p->t0) * 1e-9;
    double rate = el > 0 ? (double)done / el : 0.0;
    double eta = rate > 0 ? (double)(total - done) / rate : 0.0;
    if (el + eta < 1.0) return; /* a short prefill: no line */
    /* a failed write turns the line off (stderr is the error channel) */
    if (fprintf(stderr, "\r\033[Kprompt: %lld/%lld tokens (%d%%), %.0f tok/s, ETA %.1f s", (long long)done,
                (long long)total, (int)(100 * done / total), rate, eta) < 0 ||
        fflush(stderr) != 0) {
        p->tty = false;
        return;
    }
    p->shown = true;
}

void cli_progress_end(cli_progress *p)
{
    if (p->shown && (fputs("\r\033[K", stderr) == EOF || fflush(stderr) != 0)) p->tty = false;
    p->shown = false;
}

/* Length of a valid UTF-8 sequence at s[0..n) that is not a C1 control
 * (U+0080..U+009F), or 0. */
static size_t utf8_ok(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t len = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    if (!len || len > n) return 0;
    for (size_t i = 1; i < len; i++)
        if ((s[i] & 0xc0) != 0x80) return 0;
    if (c == 0xc2 && s[1] < 0xa0) return 0;             /* C1 control */
    if (c == 0xe0 && s[1] < 0xa0) return 0;             /* overlong */
    if (c == 0xed && s[1] >= 0xa0) return 0;            /* surrogate */
    if (c == 0xf0 && s[1] < 0x90) return 0;             /* overlong */
    if (c == 0xf4 && s[1] >= 0x90) return 0;            /* > U+10FFFF */
    return len;
}

bool cli_put_escaped(FILE *f, const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    bool ok = true;
    for (size_t i = 0; i < n && ok;) {
        unsigned c = u[i];
        char esc[8];
        if (c >= 0x20 && c < 0x7f && c != '\\') {
            ok = fputc((int)c, f) != EOF;
            i++;
            continue;
        }
        size_t k = c >= 0x80 ? utf8_ok(u + i, n - i) : 0;
        if (k) {
            ok = fwrite(u + i, 1, k, f) == k;
            i += k;
            continue;
        }
        if (c == '\n') snprintf(esc, sizeof esc, "\\n");
        else if (c == '\t') snprintf(esc, sizeof esc, "\\t");
        else if (c == '\r') snprintf(esc, sizeof esc, "\\r");
        else if (c == '\\') snprintf(esc, sizeof esc, "\\\\");
        else snprintf(esc, sizeof esc, "\\x%02x", c);
        ok = fputs(esc, f) != EOF;
        i++;
    }
    return ok;
}

/* ---- the flag table ------------------------------------------------------ */

typedef enum flag_kind {
    FK_STR,       /* const char * */
    FK_BOOL,      /* bool, no value */
    FK_I32,       /* int32_t in [lo, hi] */
    FK_F32,       /* float in [lo, hi] (open ends per the flag) */
    FK_U64,       /* uint64_t */
    FK_DTYPE,     /* keel_dtype by name */
    FK_POLICY,    /* keel_compact_policy by name */
    FK_POSITIONS, /* keep|renumber -> bool renumber */
    FK_SIMD,      /* kernel path name, applied at once (keel_set_simd) */
    FK_LOAD,      /* keel_load by name */
    FK_NO_MMAP,   /* keel_load = KEEL_LOAD_READ, no value (llama.cpp's --no-mmap) */
} flag_kind;

enum { F_LO_OPEN = 1, F_HI_OPEN = 2 };

typedef struct cli_flag {
    const char *name, *alias, *alias2; /* alias: short form shown first in help */
    unsigned group;
    flag_kind kind;
    size_t off; /* in cli_opts */
    double lo, hi;
    unsigned open; /* F_*_OPEN */
    const char *arg, *help;
} cli_flag;

#define OFF(f) offsetof(cli_opts, f)
#define I32MAX 2147483647.0

static const char g_kv_types[] = "f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1";

static const cli_flag g_flags[] = {
    {"--model", "-m", NULL, CLI_G_MODEL, FK_STR, OFF(model.path), 0, 0, 0, "FILE",
     "GGUF model, or a llama2.c checkpoint (.bin) with --tokenizer"},
    {"--tokenizer", NULL, NULL, CLI_G_MODEL, FK_STR, OFF(model.tokenizer_path), 0, 0, 0, "FILE",
     "llama2.c tokenizer.bin for a .bin checkpoint"},
    {"--load", NULL, NULL, CLI_G_MODEL, FK_LOAD, OFF(model.load), 0, 0, 0, "MODE",
     "weights: mmap (map the file), read (into memory, with huge pages where the system gives them), "
     "auto (read when huge pages are on request and the file is at most a quarter of the free memory)"},
    {"--no-mmap", NULL, NULL, CLI_G_MODEL, FK_NO_MMAP, OFF(model.load), 0, 0, 0, NULL, "--load read"},
    {"--prompt", "-p", NULL, CLI_G_PROMPT, FK_STR, OFF(prompt), 0, 0, 0, "TEXT",
     "prompt text (tokenized with BOS as the vocabulary asks)"},
    {"--file", "-f", NULL, CLI_G_FILE, FK_STR, OFF(file), 0, 0, 0, "FILE",
     "read the text from FILE (a readable, non-empty file)"},
    {"--prompt-ids", NULL, NULL, CLI_G_PROMPT, FK_STR, OFF(prompt_ids), 0, 0, 0, "LIST",
     "prompt as token ids, e.g. 1,403,407 (each in [0, n_vocab))"},
    {"--n-predict", "-n", NULL, CLI_G_GEN, FK_I32, OFF(n_predict), -1, I32MAX, 0, "N",
     "tokens to generate; -1: until end of generation or the budget (128)"},
    {"--ignore-eos", NULL, NULL, CLI_G_GEN, FK_BOOL, OFF(ignore_eos), 0, 0, 0, NULL,
     "do not stop at end-of-generation tokens"},
    {"--logits-out", NULL, NULL, CLI_G_GEN, FK_STR, OFF(logits_out), 0, 0, 0, "FILE",
     "write f32 logits of every prompt position, [n_prompt][n_vocab]"},
    {"--ids-out", NULL, NULL, CLI_G_GEN, FK_STR, OFF(ids_out), 0, 0, 0, "FILE",
     "write the generated token ids, int32"},
    {"--temp", NULL, NULL, CLI_G_SAMPLE, FK_F32, OFF(samp.temp), 0, HUGE_VAL, 0, "T",
     "temperature, >= 0; 0: greedy (0.8)"},
    {"--top-k", NULL, NULL, CLI_G_SAMPLE, FK_I32, OFF(samp.top_k), 0, I32MAX, 0, "K",
     "keep the K most likely tokens; 0: off (40)"},
    {"--top-p", NULL, NULL, CLI_G_SAMPLE, FK_F32, OFF(samp.top_p), 0, 1, 0, "P",
     "keep the smallest set of mass >= P, in [0, 1]; 1: off (0.95)"},
    {"--min-p", NULL, NULL, CLI_G_SAMPLE, FK_F32, OFF(samp.min_p), 0, 1, 0, "P",
     "keep tokens with p >= P * p_max, in [0, 1]; 0: off (0.05)"},
    {"--repeat-penalty", NULL, NULL, CLI_G_SAMPLE, FK_F32, OFF(samp.repeat_penalty), 0, HUGE_VAL,
     F_LO_OPEN, "R", "penalty of repeated tokens, > 0; 1: off (1)"},
    {"--repeat-last-n", NULL, NULL, CLI_G_SAMPLE, FK_I32, OFF(samp.repeat_last_n), 0, 1 << 26, 0,
     "N", "tokens the penalties look back over; 0: off (64)"},
    {"--presence-penalty", NULL, NULL, CLI_G_SAMPLE, FK_F32, OFF(samp.presence_penalty), -HUGE_VAL,
     HUGE_VAL, 0, "P", "subtracted once from seen tokens' logits (0)"},
    {"--frequency-penalty", NULL, NULL, CLI_G_SAMPLE, FK_F32, OFF(samp.frequency_penalty),
     -HUGE_VAL, HUGE_VAL, 0, "P", "subtracted per occurrence (0)"},
    {"--seed", "-s", NULL, CLI_G_SEED, FK_U64, OFF(samp.seed), 0, 0, 0, "S",
     "sampling seed, unsigned decimal (24301)"},
    {"--ctx-size", "-c", NULL, CLI_G_CTX, FK_I32, OFF(ctx.n_ctx), 0, 1 << 26, 0, "N",
     "KV cells; 0: min(training context, 4096) (0)"},
    {"--batch-size", "-b", NULL, CLI_G_CTX, FK_I32, OFF(ctx.n_batch), 1, 1 << 20, 0, "N",
     "most tokens per decode call (512)"},
    {"--ubatch-size", "-ub", NULL, CLI_G_CTX, FK_I32, OFF(ctx.n_ubatch), 1, 1 << 20, 0, "N",
     "tokens per forward chunk (512)"},
    {"--ctx-checkpoints", NULL, NULL, CLI_G_CTX, FK_I32, OFF(ctx.n_ctx_checkpoints), -1, 4096, 0, "N",
     "checkpoints per sequence of recurrent states / sliding rings (-1: 8 with recurrent layers; sliding: up to 8 in 1/4 of the KV)"},
    {"--checkpoint-every", NULL, NULL, CLI_G_CTX, FK_I32, OFF(ctx.checkpoint_every), 0, 1 << 26, 0,
     "T", "a checkpoint every T prompt tokens; 0: at prompt ends only (0)"},
    {"--threads", "-t", NULL, CLI_G_THREADS, FK_I32, OFF(ctx.n_threads), 0, 256, 0, "N",
     "threads; 0: all CPUs (0)"},
    {"--simd", NULL, NULL, CLI_G_THREADS, FK_SIMD, OFF(simd), 0, 0, 0, "PATH",
     "kernel path: scalar avx2 avx512 auto (KEEL_SIMD, else auto: the best this CPU has)"},
    {"--cache-type-k", "-ctk", "--ctk", CLI_G_KV, FK_DTYPE, OFF(ctx.type_k), 0, 0, 0, "T",
     "K cache type (f16)"},
    {"--cache-type-v", "-ctv", "--ctv", CLI_G_KV, FK_DTYPE, OFF(ctx.type_v), 0, 0, 0, "T",
     "V cache type (f16)"},
    {"--rot-k", NULL, NULL, CLI_G_KV, FK_I32, OFF(ctx.rot_k), -1, 1, 0, "N",
     "K Hadamard rotation: -1 auto (quantized types, if head_dim allows), 0 off, 1 on (-1)"},
    {"--rot-v", NULL, NULL, CLI_G_KV, FK_I32, OFF(ctx.rot_v), -1, 1, 0, "N",
     "V Hadamard rotation: -1 auto (off), 0 off, 1 on (0)"},
    {"--swa-window", NULL, NULL, CLI_G_KV, FK_I32, OFF(ctx.swa_window), 0, I32MAX, 0, "W",
     "run layers as StreamingLLM windows of W keys; 0: the model's own (0)"},
    {"--swa-period", NULL, NULL, CLI_G_KV, FK_I32, OFF(ctx.swa_period), 1, I32MAX, 0, "N",
     "with --swa-window: every N-th layer stays full attention (2)"},
    {"--swa-sinks", NULL, NULL, CLI_G_KV, FK_I32, OFF(ctx.n_sink), 0, I32MAX, 0, "N",
     "attention sinks kept by sliding layers (0)"},
    {"--kv-compact", NULL, NULL, CLI_G_COMPACT, FK_POLICY, OFF(ctx.compact.policy), 0, 0, 0, "P",
     "KV compaction: none window keydiff knorm random (none); alone: trigger n_ctx,\n"
     "                                 target trigger / 2, 4 sinks, recent 0.25"},
    {"--kv-trigger", NULL, NULL, CLI_G_BUDGET, FK_I32, OFF(ctx.compact.trigger), 1, I32MAX, 0, "N",
     "compact when the sequence holds more than N cells (n_ctx)"},
    {"--kv-target", NULL, NULL, CLI_G_BUDGET, FK_I32, OFF(ctx.compact.target), 1, I32MAX, 0, "N",
     "cells a compaction keeps, < trigger (trigger / 2)"},
    {"--kv-sinks", NULL, NULL, CLI_G_COMPACT, FK_I32, OFF(ctx.compact.n_sink), 0, I32MAX, 0, "N",
     "lowest positions a compaction always keeps (4)"},
    {"--kv-recent", NULL, NULL, CLI_G_COMPACT, FK_F32, OFF(ctx.compact.recent), 0, 1, F_HI_OPEN, "F",
     "fraction of the target kept for the most recent tokens, in [0, 1) (0.25)"},
    {"--kv-positions", NULL, NULL, CLI_G_COMPACT, FK_POSITIONS, OFF(ctx.compact.renumber), 0, 0, 0,
     "keep|renumber", "renumber kept positions 0..target-1, or keep them (renumber)"},
    {"--kv-seed", NULL, NULL, CLI_G_COMPACT, FK_U64, OFF(ctx.compact.seed), 0, 0, 0, "S",
     "seed of the random policy (1)"},
    {"--json", NULL, NULL, CLI_G_JSON, FK_BOOL, OFF(json), 0, 0, 0, NULL, "machine-readable output"},
    {"--ids", NULL, NULL, CLI_G_IDS, FK_BOOL, OFF(ids_only), 0, 0, 0, NULL, "print only the ids"},
    {"--no-tensors", NULL, NULL, CLI_G_NO_TENSORS, FK_BOOL, OFF(no_tensors), 0, 0, 0, NULL,
     "omit the tensor table"},
};

static bool flag_is(const cli_flag *f, const char *a)
{
    return strcmp(a, f->name) == 0 || (f->alias && strcmp(a, f->alias) == 0) ||
           (f->alias2 && strcmp(a, f->alias2) == 0);
}

/* "an integer >= 0", "a number in [0, 1)" ... */
static void describe_range(const cli_flag *f, char *buf, size_t cap)
{
    const char *what = f->kind == FK_I32 ? "an integer" : "a finite number";
    bool lo = isfinite(f->lo), hi = isfinite(f->hi) && !(f->kind == FK_I32 && f->hi == I32MAX);
    if (lo && hi)
        snprintf(buf, cap, "%s in %c%.10g, %.10g%c", what, f->open & F_LO_OPEN ? '(' : '[', f->lo,
                 f->hi, f->open & F_HI_OPEN ? ')' : ']');
    else if (lo)
        snprintf(buf, cap, "%s %s %.10g", what, f->open & F_LO_OPEN ? ">" : ">=", f->lo);
    else
        snprintf(buf, cap, "%s", what);
}

static bool in_range(const cli_flag *f, double v)
{
    if (f->open & F_LO_OPEN ? !(v > f->lo) : !(v >= f->lo)) return false;
    if (f->open & F_HI_OPEN ? !(v < f->hi) : !(v <= f->hi)) return false;
    return true;
}

/* Stores v into o for f; false (message printed) for a bad value. */
static bool set_flag(cli_opts *o, const cli_flag *f, const char *a, const char *v)
{
    char *dst = (char *)o + f->off;
    char need[96] = "";
    switch (f->kind) {
    case FK_STR:
        *(const char **)(void *)dst = v;
        return true;
    case FK_BOOL:
        *(bool *)(void *)dst = true;
        return true;
    case FK_NO_MMAP:
        *(keel_load *)(void *)dst = KEEL_LOAD_READ;
        return true;
    case FK_LOAD: {
        keel_load l;
        if (keel_load_from_name(v, &l) == KEEL_OK) {
            *(keel_load *)(void *)dst = l;
            return true;
        }
        snprintf(need, sizeof need, "auto, mmap or read");
        break;
    }
    case FK_I32: {
        int32_t x;
        if (cli_parse_i32(v, &x) && in_range(f, x)) {
            *(int32_t *)(void *)dst = x;
            return true;
        }
        describe_range(f, need, sizeof need);
        break;
    }
    case FK_F32: {
        float x;
        if (cli_parse_f32(v, &x) && in_range(f, x)) {
            *(float *)(void *)dst = x;
            return true;
        }
        describe_range(f, need, sizeof need);
        break;
    }
    case FK_U64: {
        uint64_t x;
        if (cli_parse_u64(v, &x)) {
            *(uint64_t *)(void *)dst = x;
            return true;
        }
        snprintf(need, sizeof need, "an unsigned decimal integer below 2^64");
        break;
    }
    case FK_DTYPE: {
        keel_dtype t;
        if (keel_dtype_from_name(v, &t) == KEEL_OK) {
            *(keel_dtype *)(void *)dst = t;
            return true;
        }
        snprintf(need, sizeof need, "one of %s", g_kv_types);
        break;
    }
    case FK_POLICY: {
        keel_compact_policy p;
        if (keel_compact_policy_from_name(v, &p) == KEEL_OK) {
            *(keel_compact_policy *)(void *)dst = p;
            return true;
        }
        snprintf(need, sizeof need, "one of none window keydiff knorm random");
        break;
    }
    case FK_SIMD:
        *(const char **)(void *)dst = v;
        return cli_simd(a, v) == 0;
    case FK_POSITIONS:
        if (strcmp(v, "keep") == 0 || strcmp(v, "renumber") == 0) {
            *(bool *)(void *)dst = strcmp(v, "renumber") == 0;
            return true;
        }
        snprintf(need, sizeof need, "keep or renumber");
        break;
    }
    fprintf(stderr, "keel: %s %s: must be %s\n", a, v, need);
    return false;
}

int cli_simd(const char *flag, const char *name)
{
    if (!name) {
        /* the library ignores a bad KEEL_SIMD; the CLI refuses it */
        name = getenv("KEEL_SIMD");
        if (!name || !name[0]) return 0;
        flag = "KEEL_SIMD";
    }
    keel_status st = keel_set_simd(name);
    if (st == KEEL_OK) return 0;
    const char *sep = strcmp(flag, "KEEL_SIMD") == 0 ? "=" : " ";
    if (st == KEEL_EUNSUPPORTED)
        fprintf(stderr, "keel: %s%s%s: this CPU cannot run that path (its best: ", flag, sep, name);
    else
        fprintf(stderr, "keel: %s%s%s: must be one of scalar avx2 avx512 auto (this CPU's best: ",
                flag, sep, name);
    keel_status r = keel_set_simd("auto");
    fprintf(stderr, "%s)\n", r == KEEL_OK ? keel_simd_name() : "?");
    return 2;
}

/* printf for the help text, keeping the errno of the first failed write: a
 * text longer than stdout's buffer fails inside printf, and the final flush
 * would see only the error flag, not why. */
static void help_printf(int *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void help_printf(int *err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    errno = 0;
    if (vprintf(fmt, ap) < 0 && *err == 0) *err = errno ? errno : EIO;
    va_end(ap);
}

static void print_help(const cli_opts *o, const char *usage)
{
    int err = 0;
    help_printf(&err, "%s\n\noptions:\n", usage);
    for (size_t i = 0; i < sizeof g_flags / sizeof g_flags[0]; i++) {
        const cli_flag *f = &g_flags[i];
        if (o->groups && !(o->groups & f->group)) continue;
        char names[96];
        snprintf(names, sizeof names, "%s%s%s%s%s%s%s", f->alias ? f->alias : "",
                 f->alias ? ", " : "", f->alias2 ? f->alias2 : "", f->alias2 ? ", " : "", f->name,
                 f->arg ? " " : "", f->arg ? f->arg : "");
        help_printf(&err, "  %-30s %s\n", names, f->help);
        if (f->kind == FK_DTYPE) help_printf(&err, "  %-30s   %s\n", "", g_kv_types);
    }
    if (o->extra_help) help_printf(&err, "%s\n", o->extra_help);
    help_printf(&err, "  %-30s %s\n", "-h, --help", "this text");
    if (err) stdout_error(err); /* reported once; main's final flush fails too */
}

int cli_parse(int argc, char **argv, cli_opts *o, const char *usage)
{
    const char *prev_bool = NULL; /* the boolean flag just before, for the message */
    if ((!o->groups || (o->groups & CLI_G_THREADS)) && cli_simd(NULL, NULL) != 0) return 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            print_help(o, usage);
            return 1;
        }
        const cli_flag *f = NULL;
        for (size_t k = 0; k < sizeof g_flags / sizeof g_flags[0] && !f; k++)
            if (flag_is(&g_flags[k], a) && (!o->groups || (o->groups & g_flags[k].group)))
                f = &g_flags[k];
        bool takes = true;
        if (f) {
            takes = f->kind != FK_BOOL && f->kind != FK_NO_MMAP;
            if (takes && !v) {
                fprintf(stderr, "keel: option %s needs a value\n%s\n", a, usage);
                return 2;
            }
            if (!set_flag(o, f, a, v)) return 2;
            bool kv_param = (f->group & CLI_G_BUDGET) || ((f->group & CLI_G_COMPACT) && f->kind != FK_POLICY);
            if (kv_param && !o->kv_flag) o->kv_flag = f->name;
            if (f->off == OFF(ctx.compact.trigger)) o->kv_trigger_set = true;
            if (f->off == OFF(ctx.compact.target)) o->kv_target_set = true;
            if (f->off == OFF(ctx.n_batch)) o->batch_set = true;
        } else if (o->extra && o->extra(o, a, v, &takes)) {
            if (o->extra_err[0]) {
                fprintf(stderr, "keel: %s\n", o->extra_err);
                return 2;
            }
            if (takes && !v) {
                fprintf(stderr, "keel: option %s needs a value\n%s\n", a, usage);
                return 2;
            }
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "keel: unknown option '%s'\n%s\n", a, usage);
            return 2;
        } else if (o->positional_name && !o->positional) {
            o->positional = a;
            takes = false;
        } else {
            if (prev_bool)
                fprintf(stderr, "keel: unexpected argument '%s' (%s takes no value)\n%s\n", a,
                        prev_bool, usage);
            else
                fprintf(stderr, "keel: unexpected argument '%s'\n%s\n", a, usage);
            return 2;
        }
        prev_bool = takes ? NULL : a;
        if (takes) i++;
    }
    return 0;
}

int cli_compact_setup(cli_opts *o, int32_t n_ctx)
{
    keel_compact_params *cp = &o->ctx.compact;
    if (cp->policy == KEEL_COMPACT_NONE) {
        if (o->kv_flag) {
            fprintf(stderr, "keel: %s needs --kv-compact POLICY (compaction is off)\n", o->kv_flag);
            return 2;
        }
        return 0;
    }
    if (!o->kv_trigger_set) cp->trigger = n_ctx;
    if (!o->kv_target_set) cp->target = cp->trigger / 2;
    char err[256] = "";
    keel_status st = keel_compact_params_check(cp, err);
    if (st != KEEL_OK) {
        fprintf(stderr, "keel: --kv-compact %s (trigger %d, target %d, %d sinks, recent %g): %s\n",
                keel_compact_policy_name(cp->policy), cp->trigger, cp->target, cp->n_sink,
                (double)cp->recent, err);
        return 2;
    }
    return 0;
}

/* ---- input --------------------------------------------------------------- */

#define CLI_FILE_MAX ((size_t)1 << 30)

char *cli_read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    int e = buf ? 0 : ENOMEM;
    while (buf) {
        size_t r = fread(buf + len, 1, cap - len - 1, f);
        len += r;
        if (r == 0) {
            if (ferror(f)) e = errno ? errno : EIO; /* e.g. EISDIR for a directory */
            break;
        }
        if (len + 1 == cap) {
            if (cap > CLI_FILE_MAX) {
                e = EFBIG;
                break;
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                e = ENOMEM;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    fclose(f);
    if (e) {
        free(buf);
        errno = e;
        return NULL;
    }
    buf[len] = 0;
    *n = len;
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

/* --prompt-ids "1,403, 407": every element an id in [0, n_vocab). */
static int parse_ids(const char *list, int32_t n_vocab, int32_t **ids, int32_t *n)
{
    size_t len = strlen(list), cnt = 1;
    for (size_t i = 0; i < len; i++) cnt += list[i] == ',';
    if (cnt > (size_t)INT32_MAX / 2) return cli_fail("--prompt-ids", KEEL_ERANGE, "too many ids");
    int32_t *v = malloc(cnt * sizeof(int32_t));
    char *tmp = malloc(len + 1);
    if (!v || !tmp) {
        free(v);
        free(tmp);
        return cli_fail("--prompt-ids", KEEL_ENOMEM, NULL);
    }
    memcpy(tmp, list, len + 1);
    int32_t k = 0;
    int rc = 0;
    char *s = tmp;
    for (;;) {
        char *comma = strchr(s, ',');
        if (comma) *comma = 0;
        while (*s == ' ') s++;
        char *e = s + strlen(s);
        while (e > s && e[-1] == ' ') *--e = 0;
        int32_t x;
        bool num = cli_parse_i32(s, &x);
        if (!num || x < 0 || x >= n_vocab) {
            fprintf(stderr, "keel: --prompt-ids: element %d '%s' %s [0, %d) (n_vocab)\n", k, s,
                    num ? "is out of range" : "is not a token id in", n_vocab);
            rc = 2;
            break;
        }
        v[k++] = x;
        if (!comma) break;
        s = comma + 1;
    }
    free(tmp);
    if (rc) {
        free(v);
        return rc;
    }
    *ids = v;
    *n = k;
    return 0;
}

/* The prompt as ids: --prompt-ids, -p or -f (tokenized with BOS). */
int cli_prompt_ids(cli_opts *o, const keel_model *m, int32_t **ids, int32_t *n)
{
    *ids = NULL;
    *n = 0;
    keel_model_info mi;
    keel_model_info_get(m, &mi);
    if (!!o->prompt_ids + !!o->prompt + !!o->file > 1) {
        fprintf(stderr, "keel: give the prompt once: -p, -f or --prompt-ids\n");
        return 2;
    }
    if (o->prompt_ids) return parse_ids(o->prompt_ids, mi.n_vocab, ids, n);
    char *text = NULL;
    size_t len = 0;
    if (o->file) {
        text = cli_read_file(o->file, &len);
        if (!text) {
            fprintf(stderr, "keel: -f %s: %s\n", o->file, strerror(errno));
            return 1;
        }
        if (len == 0) {
            free(text);
            fprintf(stderr, "keel: -f %s: the file is empty\n", o->file);
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

/* ---- speculative decoding flags ------------------------------------------ */

bool cli_spec_flag(cli_spec *sp, const char *a, const char *v, bool *takes, char *err)
{
    int32_t x;
    if (strcmp(a, "--spec") == 0) {
        if (v && strcmp(v, "ngram") == 0) sp->p.kind = KEEL_SPEC_NGRAM;
        else if (v && strcmp(v, "draft") == 0) sp->p.kind = KEEL_SPEC_DRAFT;
        else if (v && strcmp(v, "none") == 0) sp->p.kind = KEEL_SPEC_NONE;
        else snprintf(err, 192, "--spec: '%s' (need ngram, draft or none)", v ? v : "");
        return true;
    }
    if (strcmp(a, "-md") == 0 || strcmp(a, "--model-draft") == 0) {
        sp->draft = v;
        if (sp->p.kind == KEEL_SPEC_NONE) sp->p.kind = KEEL_SPEC_DRAFT;
        return true;
    }
    if (strcmp(a, "--spec-fixed") == 0) {
        sp->p.adaptive = false;
        *takes = false;
        return true;
    }
    int32_t *dst = strcmp(a, "--spec-max") == 0     ? &sp->p.max_draft
                   : strcmp(a, "--spec-min-n") == 0 ? &sp->p.min_n
                   : strcmp(a, "--spec-max-n") == 0 ? &sp->p.max_n
                                                    : NULL;
    if (!dst) return false;
    int32_t hi = dst == &sp->p.max_draft ? KEEL_SPEC_MAX_DRAFT : 64;
    if (!cli_parse_i32(v, &x) || x < 1 || x > hi) snprintf(err, 192, "%s: '%s' (need 1..%d)", a, v ? v : "", hi);
    else *dst = x;
    return true;
}

int cli_spec_open(cli_spec *sp, keel_model *m, const keel_context_params *cp, int32_t n_seq, keel_model **dm,
                  keel_spec **out)
{
    *out = NULL;
    if (sp->p.kind == KEEL_SPEC_NONE) return 0;
    if (sp->p.kind == KEEL_SPEC_DRAFT && !sp->draft) return cli_fail("--spec draft", KEEL_EINVAL, "needs -md FILE");
    char err[256] = "";
    keel_status st;
    if (sp->p.min_n > sp->p.max_n)
        return cli_fail("--spec-min-n", KEEL_EINVAL, "is above --spec-max-n");
    if (sp->draft) {
        keel_model_params mp = keel_model_params_default();
        mp.path = sp->draft;
        if ((st = keel_model_open(&mp, dm, err)) != KEEL_OK) return cli_fail(sp->draft, st, err);
    }
    keel_context_params dcp = *cp;
    dcp.speculative = false;
    dcp.compact.policy = KEEL_COMPACT_NONE;
    dcp.n_ctx_checkpoints = 0;
    if ((st = keel_spec_open(&sp->p, m, *dm, &dcp, n_seq, 1 << 26, out, err)) != KEEL_OK)
        return cli_fail("--spec", st, err);
    return 0;
}
