/*
 * memory_ops.c — libFuzzer target: the memory core's differential driver
 * reading its operation language (configuration, then operations) from the
 * fuzzer's bytes. Any divergence or invariant failure aborts.
 */
#include "../tests/support/memref.h"

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    memref_result r;
    if (memref_run_bytes(data, size, &r) != 0) abort();
    return 0;
}
