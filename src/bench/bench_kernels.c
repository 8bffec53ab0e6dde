/*
 * bench_kernels.c — `keel bench kernels` (placeholder until the tensor
 * kernels land: reports memory bandwidth only).
 */
#include "bench.h"

keel_status bench_kernels(int argc, char **argv, bench_out *o)
{
    (void)argc;
    (void)argv;
    base_pool *p1 = NULL, *p2 = NULL;
    keel_status st = base_pool_open(1, &p1);
    if (st == KEEL_OK) st = base_pool_open(2, &p2);
    if (st != KEEL_OK) {
        base_pool_close(p1);
        return st;
    }
    double bw1 = bench_read_bw_gbps(p1, 0, 3), bw2 = bench_read_bw_gbps(p2, 0, 3);
    if (o->json)
        bench_printf(o, "{\"read_bw_gbps\": {\"1\": %.2f, \"2\": %.2f}}\n", bw1, bw2);
    else
        bench_printf(o, "read bandwidth: 1 thread %.2f GB/s, 2 threads %.2f GB/s\n", bw1, bw2);
    base_pool_close(p1);
    base_pool_close(p2);
    return KEEL_OK;
}
