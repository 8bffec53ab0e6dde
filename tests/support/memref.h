/*
 * memref.h — the differential driver of the memory core.
 *
 * A naive reference memory (per sequence and layer group, a list of
 * (token, position) entries; full-precision K before RoPE and V; attention
 * recomputed from scratch in double precision) and a driver that applies
 * the same random operations to it and to a keel_mem: placing and writing,
 * seq_rm / cp / keep / add / div, clear, and attention for random queries,
 * with sliding rings, sinks, several sequences, unified or split streams,
 * every KV dtype and rotation on and off, and indexer columns (sparse
 * attention: the memory's top-k choice checked against the reference's
 * scores from its own copy of the indexer keys). After every operation it runs
 * keel_mem_check and, for refused operations, checks that the memory's
 * digest did not change; after every attention it compares outputs: within
 * float rounding for f32, within the codec's stated tolerance otherwise.
 *
 * The choices come from a "chooser": a seeded RNG (build/fuzz_memory, the
 * ctest runs) or the bytes of a libFuzzer input (the same op language).
 */
#ifndef KEEL_MEMREF_H
#define KEEL_MEMREF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct memref_result {
    int64_t ops;                /* operations applied */
    int64_t divergences;        /* attention outputs outside tolerance */
    int64_t invariant_failures; /* keel_mem_check failures or digest changes on refusal */
    int64_t refused;            /* operations the memory refused (expected or capacity) */
    int64_t attends;            /* attention comparisons */
    double max_err_ratio;       /* max over comparisons of error / tolerance */
    char max_err_case[192];     /* the comparison that reached it */
    int64_t tokens_placed;
    int64_t max_cell;           /* highest cell index the memory produced */
    int64_t max_cap;            /* largest table capacity */
    int64_t rs_restores;        /* checkpoint restores by seq_rm (recurrent configs) */
    int64_t rs_refused;         /* operations refused with KEEL_ESTATE as predicted */
    int64_t rs_ckpts;           /* checkpoints taken */
    int64_t spec_restores;      /* speculation snapshots restored (keel_mem_spec_restore) */
    int64_t sparse_checks;      /* sparse queries whose kept cells were checked */
    int64_t sparse_chosen;      /* of them, with more visible cells than top_k */
} memref_result;

typedef struct memref_opts {
    uint64_t seed;
    int64_t ops;
    int config;      /* -1: derived from the seed; otherwise a preset (see memref_model.c) */
    FILE *log;       /* divergence details, or NULL */
    bool quiet;
} memref_opts;

/* Runs the driver with a seeded RNG. Returns 0 when there were no
 * divergences and no invariant failures. */
int memref_run(const memref_opts *opts, memref_result *res);

/* Runs the op language read from bytes (libFuzzer). Returns the same. */
int memref_run_bytes(const uint8_t *data, size_t size, memref_result *res);

/* Human description of the configuration a seed/preset selects. */
void memref_describe(const memref_opts *opts, char *buf, size_t cap);

#endif
