/*
 * fuzz/gguf.c — libFuzzer target: the GGUF reader over arbitrary bytes.
 * When a file opens, every key (array elements too), every tensor and its
 * data range are walked, and a tokenizer is built from its metadata; when
 * the bytes are not GGUF they are read as a u32 model length, a llama2.c
 * model.bin and its tokenizer.bin, and run through the converter. Any crash, leak or UB is a bug.
 * GGUF bytes sit at an odd address, so tensor data is misaligned; a file
 * that opens is also bound as a model (hyperparameter and tensor checks,
 * the unused-tensor scan), and the first row of each tensor (up to 4096
 * elements) is dequantized and dotted with the kernels at that address.
 */
#include "model/gguf.h"
#include "model/llama2c.h"
#include "model/model.h"
#include "text/tokenizer.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint64_t g_sink;

static void walk(const gguf *g)
{
    const uint8_t *lo = gguf_bytes(g), *hi = lo + gguf_size(g);
    for (int64_t i = 0; i < gguf_n_kv(g); i++) {
        const char *k = gguf_key_at(g, i);
        const gguf_value *v = gguf_value_at(g, i);
        if (!k || !v || gguf_find_key(g, k) != i) abort();
        if (v->nbytes && (v->data < lo || v->data + v->nbytes > hi)) abort();
        int64_t x;
        double d;
        if (gguf_value_int(v, &x) == KEEL_OK) g_sink += (uint64_t)x;
        if (gguf_value_float(v, &d) == KEEL_OK) g_sink += (uint64_t)(d == d);
        if (v->type != GGUF_TYPE_ARRAY) continue;
        for (uint64_t j = 0; j < v->n && j < 4096; j++) {
            gguf_value e;
            if (gguf_arr_elem(v, j, &e) != KEEL_OK) abort();
            if (e.nbytes && (e.data < lo || e.data + e.nbytes > hi)) abort();
            if (e.type == GGUF_TYPE_ARRAY) {
                gguf_value e2;
                if (e.n && gguf_arr_elem(&e, e.n - 1, &e2) != KEEL_OK) abort();
            }
            g_sink += e.nbytes;
        }
    }
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        if (gguf_find_tensor(g, t->name) != t) abort();
        const uint8_t *p = t->data;
        if (p < lo || p + t->nbytes > hi || t->n_dims < 1 || t->n_dims > 4) abort();
        if (t->nbytes) g_sink += p[0] + p[t->nbytes - 1];
    }
}

/* Binds g as a model, then runs each tensor's first row through the
 * dequantize and dot kernels where they read it (any byte address). */
static void bind_and_read(const gguf *g)
{
    char err[BASE_ERR_CAP];
    model_w w;
    if (model_load(g, &w, err) == KEEL_OK) model_free(&w);
    static float row[4096];
    static uint8_t act[4096 * 4 + 64];
    memset(act, 0, sizeof act); /* zero blocks are valid in every vec_dot type */
    for (int64_t i = 0; i < gguf_n_tensors(g) && i < 64; i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        if (t->ne[0] > 4096) continue;
        if (tensor_dequantize_row(t->dtype, t->data, row, t->ne[0]) != KEEL_OK) continue;
        g_sink += (uint64_t)(row[0] == row[0]);
        float d = tensor_vec_dot(t->dtype, t->ne[0], t->data, act);
        g_sink += (uint64_t)(d == d);
    }
}

static void tokenize_some(const text_tokenizer *t, const uint8_t *data, size_t size)
{
    int32_t ids[256];
    int64_t n;
    size_t len = size < 64 ? size : 64;
    keel_status st = text_tokenize(t, (const char *)data, len, true, true, ids, 256, &n, NULL);
    if (st != KEEL_OK) return;
    char buf[4096];
    size_t k;
    text_detokenize(t, ids, n, TEXT_DECODE_UNPARSE_SPECIAL, buf, sizeof buf, &k, NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[BASE_ERR_CAP];
    gguf *g = NULL;
    /* an exact-size copy at an odd address: reads past the end are
     * caught, and no tensor is aligned */
    uint8_t *block = malloc(size + 1), *copy = block + 1;
    memcpy(copy, data, size);
    if (gguf_open_buffer(copy, size, &g, err) == KEEL_OK) {
        walk(g);
        bind_and_read(g);
        text_tokenizer *t = NULL;
        if (text_tokenizer_open(g, &t, err) == KEEL_OK) {
            tokenize_some(t, data, size);
            text_tokenizer_close(t);
        }
        gguf_close(g);
    } else if (size >= 32 && memcmp(data, "GGUF", 4) != 0) {
        /* llama2.c: u32 model length, the model, then tokenizer.bin */
        uint32_t ml;
        memcpy(&ml, data, 4);
        size_t m = ml % (size - 3);
        if (llama2c_open_buffer(copy + 4, m, copy + 4 + m, size - 4 - m, &g, err) == KEEL_OK) {
            walk(g);
            text_tokenizer *t = NULL;
            if (text_tokenizer_open(g, &t, err) == KEEL_OK) text_tokenizer_close(t);
            gguf_close(g);
        }
    }
    free(block);
    return 0;
}
