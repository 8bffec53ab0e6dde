/*
 * cli.h — the keel CLI: one file per command, a table in main.c.
 * The CLI uses only keel.h.
 */
#ifndef KEEL_CLI_H
#define KEEL_CLI_H

#include "keel.h"

#include <stdio.h>

/* Writes library output (benchmarks, reports) to a FILE *. Errors stay in
 * the stream's error flag (main checks stdout before exiting). */
void cli_write_file(void *user, const char *text, size_t n);
/* Prints "keel: <what>: <status message>[: detail]" to stderr; returns 1. */
int cli_fail(const char *what, keel_status st, const char *detail);

/* Strict numeric parsing, shared by every command: the whole string must be
 * the number (no leading blanks, no trailing characters). */
bool cli_parse_i32(const char *s, int32_t *out); /* decimal, whole string, in int32 range */
bool cli_parse_f32(const char *s, float *out);   /* whole string, finite */
bool cli_parse_u64(const char *s, uint64_t *out); /* whole string, no sign, decimal */

/* Checked output. cli_write writes n bytes to f and, on failure, prints
 * "keel: <what>: <strerror>" and returns false. cli_close flushes and
 * closes f (NULL: no-op, true) the same way. */
bool cli_write(FILE *f, const void *p, size_t n, const char *what);
bool cli_close(FILE *f, const char *what);
/* Flushes stdout; false (message printed once per process) if any write
 * to it failed. */
bool cli_flush_stdout(void);
/* Writes n bytes to stdout and flushes (streamed output); false (message
 * printed once) on a write error. */
bool cli_write_stdout(const void *p, size_t n);

/* Writes s[0..n) to f with control characters, invalid UTF-8 and the C1
 * controls escaped (\n, \t, \r, \\, \xHH), so text from a model file cannot
 * drive the terminal. Returns false on a write error. */
bool cli_put_escaped(FILE *f, const char *s, size_t n);

/* The prefill progress line (run, chat): on a terminal (stderr), during a
 * prefill that takes about a second or more, one line "prompt: done/total
 * tokens (P%), R tok/s, ETA S s" rewritten in place; cli_progress_end
 * erases it (\r + clear to the end of the line) before the answer starts.
 * Nothing at all when stderr is not a terminal. */
typedef struct cli_progress {
    bool tty;    /* stderr is a terminal (and writing to it works) */
    bool shown;  /* the line is on the screen */
    uint64_t t0; /* keel_time_ns() at the start of the prefill */
} cli_progress;
void cli_progress_begin(cli_progress *p);
/* done of total tokens prefilled since cli_progress_begin. */
void cli_progress_show(cli_progress *p, int64_t done, int64_t total);
void cli_progress_end(cli_progress *p);

/* Flag groups a command accepts (cli_opts.groups); 0 accepts all. */
enum {
    CLI_G_MODEL = 1u << 0,      /* -m, --tokenizer */
    CLI_G_PROMPT = 1u << 1,     /* -p, --prompt-ids */
    CLI_G_FILE = 1u << 2,       /* -f */
    CLI_G_GEN = 1u << 3,        /* -n, --ignore-eos, --logits-out, --ids-out */
    CLI_G_SAMPLE = 1u << 4,     /* --temp, --top-k, ... penalties */
    CLI_G_SEED = 1u << 5,       /* -s, --seed */
    CLI_G_CTX = 1u << 6,        /* -c, -b, -ub */
    CLI_G_THREADS = 1u << 7,    /* -t, --simd */
    CLI_G_KV = 1u << 8,         /* --ctk, --ctv, --rot-k, --rot-v, --swa-* */
    CLI_G_COMPACT = 1u << 9,    /* --kv-compact, --kv-sinks, --kv-recent, --kv-positions, --kv-seed */
    CLI_G_BUDGET = 1u << 10,    /* --kv-trigger, --kv-target */
    CLI_G_JSON = 1u << 11,      /* --json */
    CLI_G_IDS = 1u << 12,       /* --ids */
    CLI_G_NO_TENSORS = 1u << 13 /* --no-tensors */
};

/* Options shared by the model commands (llama.cpp's flag names). */
typedef struct cli_opts cli_opts;
struct cli_opts {
    keel_model_params model;
    keel_context_params ctx;
    keel_sampler_params samp;
    const char *prompt, *file, *prompt_ids, *logits_out, *ids_out, *positional;
    const char *simd; /* --simd as given (applied while parsing), or NULL */
    int32_t n_predict; /* -1: until end of generation or the budget */
    bool ignore_eos, json, ids_only, no_tensors, batch_set;
    bool kv_trigger_set, kv_target_set;
    const char *kv_flag; /* first compaction parameter flag given (for "needs --kv-compact") */
    unsigned groups;     /* CLI_G_* accepted (0: all) */
    const char *positional_name; /* e.g. "MODEL": one positional accepted; NULL: none */
    const char *extra_help;      /* help lines of the command's own flags, or NULL */
    /* command-specific options: return true if a was consumed (set *takes
     * to false when it has no value); a bad value: write the message into
     * extra_err (cli_parse prints it and returns 2) */
    bool (*extra)(cli_opts *o, const char *a, const char *v, bool *takes);
    char extra_err[192];
    void *user;
};

void cli_opts_init(cli_opts *o);

/* Speculative decoding flags (run, bench): --spec ngram|draft|none,
 * --spec-max K, --spec-min-n N, --spec-max-n N, --spec-fixed,
 * -md/--model-draft FILE (implies --spec draft). */
typedef struct cli_spec {
    keel_spec_params p;
    const char *draft; /* the draft model's path, or NULL */
    const char *err_flag;
} cli_spec;
#define CLI_SPEC_HELP                                                                                            \
    "  --spec ngram|draft|none        speculative decoding: prompt-lookup drafts, a draft model (-md), or off\n" \
    "  --spec-max K                   most drafted tokens per step (16; 1..64)\n"                                \
    "  --spec-min-n N                 n-gram drafts: shortest suffix matched (2)\n"                              \
    "  --spec-max-n N                 n-gram drafts: longest suffix matched (8)\n"                               \
    "  --spec-fixed                   always draft --spec-max tokens (no back-off when drafts do not pay)\n"     \
    "  -md, --model-draft FILE        draft model (same vocabulary) for --spec draft"
/* Consumes a speculative-decoding flag a (value v); a bad value: message in err. */
bool cli_spec_flag(cli_spec *sp, const char *a, const char *v, bool *takes, char *err);
/* Opens the draft source of sp for n_seq sequences (nothing with --spec
 * none): the draft model (*dm) in a context like cp. 0 or an exit code
 * (printed). */
int cli_spec_open(cli_spec *sp, keel_model *m, const keel_context_params *cp, int32_t n_seq, keel_model **dm,
                  keel_spec **out);
/* 0 ok, 1 help printed (usage, then every flag the command accepts),
 * 2 usage error (printed). */
int cli_parse(int argc, char **argv, cli_opts *o, const char *usage);
/* Compaction defaults for a context of n_ctx cells: with --kv-compact P,
 * trigger = n_ctx and target = trigger / 2 unless given; without it, a
 * compaction parameter flag is an error. 0 or an exit code (printed). */
int cli_compact_setup(cli_opts *o, int32_t n_ctx);
/* Forces the kernel path (keel_set_simd) for option flag = name; name NULL:
 * checks KEEL_SIMD from the environment instead (unset: nothing to do).
 * 0, or 2 with the message printed (unknown name, path this CPU lacks). */
int cli_simd(const char *flag, const char *name);
/* Whole file, NUL-terminated (malloc); NULL on failure with errno set
 * (EISDIR for a directory, EFBIG above 1 GiB). */
char *cli_read_file(const char *path, size_t *n);
/* Opens o->model; prints the error; returns 0 or an exit code. */
int cli_open_model(cli_opts *o, keel_model **m);
/* The prompt ids (malloc'd) from --prompt-ids (each in [0, n_vocab)), -p or
 * -f (an unreadable or empty file is an error); 0 or an exit code. */
int cli_prompt_ids(cli_opts *o, const keel_model *m, int32_t **ids, int32_t *n);

int cmd_bench(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_eval_compaction(int argc, char **argv);
int cmd_demo(int argc, char **argv);
int cmd_gen_model(int argc, char **argv);
int cmd_template(int argc, char **argv);
int cmd_grammar(int argc, char **argv);
int cmd_chat(int argc, char **argv);

#endif
