/*
 * cli.h — the keel CLI: one file per command, a table in main.c.
 * The CLI uses only keel.h.
 */
#ifndef KEEL_CLI_H
#define KEEL_CLI_H

#include "keel.h"

#include <stdio.h>

/* Writes library output (benchmarks, reports) to a FILE *. */
void cli_write_file(void *user, const char *text, size_t n);
/* Prints "keel: <what>: <status message>[: detail]" to stderr; returns 1. */
int cli_fail(const char *what, keel_status st, const char *detail);

/* Options shared by the model commands (llama.cpp's flag names). */
typedef struct cli_opts cli_opts;
struct cli_opts {
    keel_model_params model;
    keel_context_params ctx;
    keel_sampler_params samp;
    const char *prompt, *file, *prompt_ids, *logits_out, *ids_out, *positional;
    int32_t n_predict;
    int32_t bench_pp, bench_tg;
    bool ignore_eos, json, ids_only, no_tensors, batch_set;
    /* command-specific options: return true if a was consumed (set *takes
     * to false when it has no value) */
    bool (*extra)(cli_opts *o, const char *a, const char *v, bool *takes);
    void *user;
};

void cli_opts_init(cli_opts *o);
/* 0 ok, 1 help printed, 2 usage error (printed). */
int cli_parse(int argc, char **argv, cli_opts *o, const char *usage);
/* Whole file, NUL-terminated (malloc); NULL on failure. */
char *cli_read_file(const char *path, size_t *n);
/* Opens o->model; prints the error; returns 0 or an exit code. */
int cli_open_model(cli_opts *o, keel_model **m);
/* The prompt ids (malloc'd) from --prompt-ids, -p or -f; 0 or an exit code. */
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

#endif
