/*
 * llama2c.h — private interface of the llama2.c checkpoint converter
 * (llama2c.c): a legacy (v0) llama2.c model.bin and tokenizer.bin become an
 * in-memory GGUF with llama.cpp's llama-arch key and tensor names, opened
 * with the GGUF reader. Everything downstream sees only a gguf.
 *
 * model.bin (little-endian):
 *
 *   | field                  | type / shape (row-major, rows first)      |
 *   |------------------------|-------------------------------------------|
 *   | dim, hidden_dim,       | int32 x 7; vocab_size < 0 means an        |
 *   | n_layers, n_heads,     | unshared classifier (wcls present)        |
 *   | n_kv_heads, vocab_size,|                                           |
 *   | seq_len                |                                           |
 *   | token_embedding        | f32 [vocab][dim]                          |
 *   | rms_att                | f32 [n_layers][dim]                       |
 *   | wq                     | f32 [n_layers][dim][dim]                  |
 *   | wk, wv                 | f32 [n_layers][kv_dim][dim] each          |
 *   | wo                     | f32 [n_layers][dim][dim]                  |
 *   | rms_ffn                | f32 [n_layers][dim]                       |
 *   | w1, w3 (gate, up)      | f32 [n_layers][hidden][dim] (w1, w2, w3   |
 *   | w2 (down)              | f32 [n_layers][dim][hidden]  in that order)|
 *   | rms_final              | f32 [dim]                                 |
 *   | freq_cis_real, _imag   | f32 [seq_len][head_size/2] each (skipped) |
 *   | wcls                   | f32 [vocab][dim], only if vocab_size < 0  |
 *
 * tokenizer.bin: int32 max_token_length, then vocab_size times
 * { f32 score, int32 len, len bytes }.
 */
#ifndef KEEL_MODEL_LLAMA2C_H
#define KEEL_MODEL_LLAMA2C_H

#include "gguf.h"

/* Header fields of a llama2.c checkpoint. */
typedef struct llama2c_config {
    int32_t dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
    bool shared_classifier; /* vocab_size was positive in the file */
} llama2c_config;

/*
 * Reads and validates the header: every field positive (vocab_size non-zero),
 * dim divisible by n_heads, n_heads by n_kv_heads, head_size even, and the
 * file size exactly what the header implies. KEEL_EFORMAT with detail
 * ("truncated: header implies 1056540 bytes, file has 1000"),
 * KEEL_EUNSUPPORTED for the newer llama2.c export versions (magic "ak42").
 */
keel_status llama2c_read_config(const void *model, size_t model_size, llama2c_config *out,
                                char *err);

/*
 * Converts model (and, when tok is not NULL, its tokenizer) into GGUF bytes
 * in a new base_alloc block (*out, *out_size; free with base_free or hand to
 * gguf_open_owned). Weights are copied unchanged (llama2.c and GGUF llama
 * both use adjacent-pair RoPE). Errors: as llama2c_read_config, KEEL_EFORMAT
 * for a malformed tokenizer ("tokenizer: token 17: length 900 past end of
 * file"), KEEL_ENOMEM. Inputs are only read.
 */
keel_status llama2c_convert(const void *model, size_t model_size, const void *tok, size_t tok_size,
                            void **out, size_t *out_size, char *err);

/* llama2c_convert, then gguf_open_owned. *out is NULL on failure. */
keel_status llama2c_open_buffer(const void *model, size_t model_size, const void *tok,
                                size_t tok_size, gguf **out, char *err);

/* Maps both files (tok_path may be NULL), converts and opens. KEEL_EIO when
 * a file cannot be read; other errors as above. Messages about the
 * tokenizer name its path ("tokenizer tok.bin: token 17: ..."). */
keel_status llama2c_open_file(const char *model_path, const char *tok_path, gguf **out, char *err);

#endif /* KEEL_MODEL_LLAMA2C_H */
