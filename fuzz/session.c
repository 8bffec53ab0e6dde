/*
 * session.c — libFuzzer target: arbitrary bytes loaded as a session blob
 * (keel_mem_load) into a memory with a full and a sliding group, quantized
 * and rotated columns, two sequences, and (bit 3 of the first byte) a
 * recurrent layer with checkpoints. A refused load must leave the memory
 * byte-identical; an accepted one must pass keel_mem_check and save back to
 * a blob that loads again. Any violation aborts. The first byte picks the
 * target sequence (or the whole memory), conversion (bit 2), the memory
 * (bit 3: hybrid; else bit 5: attention only with ring checkpoints; bit 6,
 * with either: indexer columns on both attention layers, sparse attention,
 * q8_0 rotated keys in the full group and f16 in the ring) and whether the
 * section checksums are recomputed first (bit 4), so that mutations reach
 * the parser behind them. Seeds (fuzz/corpus/libfuzzer_session): blobs
 * keel_mem_save wrote from this target's own memories (each memory; sequence
 * 0 and whole; plain and resealed), a converted load, and a dense blob into
 * the sparse memory and back (refused: the column registries differ).
 */
#include "keel.h"
#include "base/base.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static keel_mem *open_mem(bool hybrid, bool ring_ckpt, bool sparse)
{
    keel_mem_layer ls[3];
    ls[0] = keel_mem_layer_default();
    ls[0].n_kv_heads = 1;
    ls[0].head_dim_k = ls[0].head_dim_v = 32;
    ls[0].k_dtype = KEEL_DTYPE_Q8_0;
    ls[0].k_rot.enabled = true;
    ls[0].k_rot.seed = 3;
    ls[0].rope.n_rot = 32;
    if (sparse) {
        ls[0].idx_head_dim = 64;
        ls[0].idx_n_heads = 2;
        ls[0].idx_dtype = KEEL_DTYPE_Q8_0;
        ls[0].idx_rot.enabled = true;
        ls[0].idx_rope = ls[0].rope;
        ls[0].idx_rope.n_rot = 16;
        ls[0].idx_top_k = 4;
    }
    ls[1] = ls[0];
    ls[1].kind = KEEL_MEM_LAYER_SLIDING;
    ls[1].window = 8;
    ls[1].n_sink = 1;
    ls[1].k_dtype = KEEL_DTYPE_F16;
    ls[1].k_rot.enabled = false;
    ls[1].idx_dtype = KEEL_DTYPE_F16;
    ls[1].idx_rot.enabled = false;
    ls[2] = keel_mem_layer_default();
    ls[2].kind = KEEL_MEM_LAYER_RECURRENT;
    ls[2].rs.conv_kernel = 3;
    ls[2].rs.conv_channels = 4;
    ls[2].rs.state_floats = 8;
    keel_mem_config cfg = keel_mem_config_default();
    cfg.layers = ls;
    cfg.n_layers = hybrid ? 3 : 2;
    cfg.n_ctx = 64;
    cfg.n_seq_max = 2;
    cfg.n_batch_max = 8;
    cfg.n_threads = 1;
    cfg.n_ckpt = hybrid || ring_ckpt ? 2 : 0;
    keel_mem *m = NULL;
    return keel_mem_open(&cfg, &m, NULL) == KEEL_OK ? m : NULL;
}

/* Recomputes the header's and every section's checksum in place. */
static void reseal(uint8_t *p, size_t n)
{
    if (n < 48) return;
    uint64_t h = base_hash64(p, 40, 0x5e55);
    memcpy(p + 40, &h, 8);
    uint32_t nsec;
    memcpy(&nsec, p + 28, 4);
    size_t off = 48;
    for (uint32_t i = 0; i < nsec && n - off >= 24; i++) {
        uint64_t len;
        memcpy(&len, p + off + 8, 8);
        if (len > n - off - 24) return;
        h = base_hash64(p + off + 24, (size_t)len, 0x5e55);
        memcpy(p + off + 16, &h, 8);
        off += 24 + (size_t)len;
    }
}

static uint8_t g_out[1 << 20];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    bool hybrid = data[0] & 8, ring_ckpt = !hybrid && (data[0] & 32), sparse = data[0] & 64;
    keel_mem *m = open_mem(hybrid, ring_ckpt, sparse);
    if (!m) abort();
    /* a little state to overwrite: 5 tokens of sequence 1 (and a checkpoint) */
    int32_t pos[5] = {0, 1, 2, 3, 4}, seq[5] = {1, 1, 1, 1, 1}, cells[10];
    keel_mem_batch b = {5, pos, seq, NULL, NULL, NULL};
    float kv[5 * 64];
    for (int i = 0; i < 5 * 64; i++) kv[i] = (float)((i * 37) % 19) / 19.0f - 0.5f;
    if (keel_mem_place(m, &b, cells) != KEEL_OK) abort();
    for (int l = 0; l < 2; l++)
        if (keel_mem_write_kvi(m, l, 5, cells + 5 * keel_mem_layer_group(m, l), kv, kv, sparse ? kv : NULL) !=
            KEEL_OK)
            abort();
    if ((hybrid || ring_ckpt) && keel_mem_ckpt_take(m, 1) != KEEL_OK) abort();
    int32_t target = data[0] % 3 == 2 ? -1 : data[0] % 3;
    uint8_t *blob = malloc(size);
    if (!blob) abort();
    memcpy(blob, data + 1, size - 1);
    if (data[0] & 16) reseal(blob, size - 1);
    uint64_t before = keel_mem_digest(m);
    int32_t toks[256], nt = 0, np = 0;
    keel_status st = keel_mem_load(m, target, blob, size - 1, 0, data[0] & 4 ? KEEL_SESSION_CONVERT : 0, toks, 256, &nt, &np);
    free(blob);
    if (st != KEEL_OK) {
        if (keel_mem_digest(m) != before) abort(); /* a refused load changed the memory */
    } else {
        if (keel_mem_check(m) != KEEL_OK) abort();
        size_t n = 0;
        /* with its history as loaded (it agreed with the cells) */
        if (keel_mem_save(m, target, 0, toks, nt, np, g_out, sizeof g_out, &n) != KEEL_OK) abort();
        keel_mem *m2 = open_mem(hybrid, ring_ckpt, sparse);
        if (!m2) abort();
        int32_t nt2 = 0;
        if (keel_mem_load(m2, target, g_out, n, 0, 0, NULL, 0, &nt2, NULL) != KEEL_OK || nt2 != nt) abort();
        if (keel_mem_check(m2) != KEEL_OK) abort();
        keel_mem_close(m2);
    }
    keel_mem_close(m);
    return 0;
}
