/*
 * cmd_bench.c — `keel bench <name> [options]`: runs a library benchmark and
 * prints its table (or JSON with --json) to stdout.
 */
#include "cli.h"

#include <string.h>

int cmd_bench(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "-m") == 0) {
        /* keel bench -m MODEL ...: the model benchmark (llama-bench style) */
        keel_status st = keel_bench_run("model", argc - 1, argv + 1, cli_write_file, stdout);
        fflush(stdout);
        if (st != KEEL_OK) return cli_fail("bench", st, NULL);
        return 0;
    }
    if (argc < 2 || argv[1][0] == '-') {
        fprintf(stderr, "usage: keel bench kernels|attention [--json]\n"
                        "       keel bench -m MODEL [-p 512] [-n 128] [-t N] [-r 3] [--json]\n");
        return 2;
    }
    keel_status st = keel_bench_run(argv[1], argc - 2, argv + 2, cli_write_file, stdout);
    fflush(stdout);
    if (st == KEEL_ENOENT) {
        fprintf(stderr, "keel: bench: unknown benchmark '%s'\n", argv[1]);
        return 2;
    }
    if (st != KEEL_OK) return cli_fail("bench", st, NULL);
    return 0;
}
