/*
 * prof.c — an opt-in profile of the kernels one thread calls (where a
 * decode step's time goes: `keel bench -m MODEL --profile`).
 *
 * Per thread (thread-local, so concurrent contexts do not mix): while on,
 * each instrumented top-level call (matvec, matmul, attention, norms, RoPE,
 * activations) adds its wall time, its count and the bytes it streams to
 * the entry of its (kind, dtype, rows, cols); entries are kept in order of
 * first appearance, at most TENSOR_PROF_MAX (later shapes fold into the
 * last entry). Off (the default), a call costs one thread-local load.
 * Nested calls are not double counted: a matmul that runs as matvecs lets
 * the matvecs record themselves.
 */
#include "tensor_impl.h"

static _Thread_local bool g_prof_on;
static _Thread_local int g_prof_n;
static _Thread_local tensor_prof_entry g_prof[TENSOR_PROF_MAX];

void tensor_prof_enable(bool on)
{
    g_prof_on = on;
}

bool tensor_prof_enabled(void)
{
    return g_prof_on;
}

void tensor_prof_reset(void)
{
    g_prof_n = 0;
}

int tensor_prof_get(const tensor_prof_entry **out)
{
    *out = g_prof;
    return g_prof_n;
}

uint64_t tensor_prof_begin(void)
{
    return g_prof_on ? base_time_ns() : 0;
}

void tensor_prof_end(uint64_t t0, tensor_prof_kind kind, keel_dtype dtype, int64_t rows,
                     int64_t cols, double bytes)
{
    tensor_prof_end_n(t0, kind, dtype, rows, cols, bytes, 1);
}

void tensor_prof_end_n(uint64_t t0, tensor_prof_kind kind, keel_dtype dtype, int64_t rows,
                       int64_t cols, double bytes, int64_t n_tok)
{
    if (!g_prof_on || t0 == 0) return;
    uint64_t ns = base_time_ns() - t0;
    tensor_prof_entry *e = NULL;
    for (int i = 0; i < g_prof_n && !e; i++) {
        tensor_prof_entry *c = &g_prof[i];
        if (c->kind == kind && c->dtype == dtype && c->rows == rows && c->cols == cols) e = c;
    }
    if (!e) {
        if (g_prof_n < TENSOR_PROF_MAX) {
            e = &g_prof[g_prof_n++];
            memset(e, 0, sizeof *e);
            e->kind = kind;
            e->dtype = dtype;
            e->rows = rows;
            e->cols = cols;
        } else {
            e = &g_prof[TENSOR_PROF_MAX - 1];
        }
    }
    e->ns += ns;
    e->calls++;
    e->bytes += bytes;
    e->tokens += n_tok;
}

const char *tensor_prof_kind_name(tensor_prof_kind k)
{
    switch (k) {
    case TENSOR_PROF_MATVEC: return "matvec";
    case TENSOR_PROF_MATMUL: return "matmul";
    case TENSOR_PROF_ATTN: return "attention";
    case TENSOR_PROF_NORM: return "norm";
    case TENSOR_PROF_ROPE: return "rope";
    case TENSOR_PROF_ACT: return "activation";
    default: return "?";
    }
}
