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

int cmd_bench(int argc, char **argv);
int cmd_gen_model(int argc, char **argv);

#endif
