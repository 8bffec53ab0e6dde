/*
 * fuzz_memory.c — `build/fuzz_memory --seed S --ops N [--config C] [-v]`:
 * the memory core's differential driver (tests/support/memref.h) from the
 * command line. Prints the configuration, then a final line
 * `ops=N divergences=D invariant_failures=F`; exits non-zero on any
 * divergence or invariant failure.
 */
#include "memref.h"

#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    memref_opts o = {1, 10000, -1, stderr, false};
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc)
            o.seed = strtoull(argv[++i], NULL, 0);
        else if (strcmp(argv[i], "--ops") == 0 && i + 1 < argc)
            o.ops = strtoll(argv[++i], NULL, 0);
        else if (strcmp(argv[i], "--config") == 0 && i + 1 < argc)
            o.config = atoi(argv[++i]);
        else if (strcmp(argv[i], "-q") == 0)
            o.quiet = true;
        else {
            fprintf(stderr, "usage: fuzz_memory [--seed S] [--ops N] [--config C] [-q]\n");
            return 2;
        }
    }
    char desc[1024];
    memref_describe(&o, desc, sizeof desc);
    printf("seed %llu config %d: %s\n", (unsigned long long)o.seed, o.config, desc);
    memref_result r;
    int rc = memref_run(&o, &r);
    printf("attends=%lld refused=%lld tokens_placed=%lld max_cell=%lld max_err/tol=%.3f\n",
           (long long)r.attends, (long long)r.refused, (long long)r.tokens_placed,
           (long long)r.max_cell, r.max_err_ratio);
    if (r.max_err_case[0]) printf("max_err/tol case: %s\n", r.max_err_case);
    if (r.rs_ckpts || r.rs_refused)
        printf("recurrent: checkpoints=%lld restores=%lld refused(ESTATE)=%lld spec_restores=%lld\n",
               (long long)r.rs_ckpts, (long long)r.rs_restores, (long long)r.rs_refused,
               (long long)r.spec_restores);
    if (r.sparse_checks)
        printf("sparse: queries checked=%lld (top_k < visible: %lld)\n", (long long)r.sparse_checks,
               (long long)r.sparse_chosen);
    printf("ops=%lld divergences=%lld invariant_failures=%lld\n", (long long)r.ops,
           (long long)r.divergences, (long long)r.invariant_failures);
    return rc;
}
