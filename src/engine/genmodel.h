/*
 * genmodel.h — private interface of the random-weight model generator
 * (keel_gen_model): genmodel.c (parameters, keys, tensors, weights),
 * genvocab.c (a deterministic BPE trainer and the generated vocabularies)
 * and gentext.c (the built-in text the vocabularies are learned from).
 * docs/formats.md section 7 describes what is generated.
 *
 * The generator lives in src/engine, above src/model and src/text, because
 * it writes both: model tensors through the GGUF writer and tokenizer
 * vocabularies (with the tokenizers' own GPT-2 byte map; test_genmodel
 * checks the generated vocabularies with the tokenizers).
 */
#ifndef KEEL_ENGINE_GENMODEL_H
#define KEEL_ENGINE_GENMODEL_H

#include "../model/gguf.h"

/* The built-in English text (UTF-8, a few KB) and its length in bytes. */
extern const char genmodel_text[];
extern const size_t genmodel_text_len;

/* ---- BPE trainer (genvocab.c) -------------------------------------------- */

typedef enum genmodel_bpe_mode {
    /* SentencePiece-style: spaces become U+2581 and start words, a U+2581
     * is put before the text (add_space_prefix), words split where letters,
     * digits and punctuation meet and at control characters (which belong
     * to no word); initial symbols are the text's characters. */
    GENMODEL_BPE_SPM = 1,
    /* Byte-level (GPT-2): words split roughly as the qwen2 pre-tokenizer
     * splits (" word", single digits, " punct", contractions, whitespace
     * runs); initial symbols are the 256 bytes, written with the GPT-2
     * byte-to-code-point map. */
    GENMODEL_BPE_BYTES = 2,
} genmodel_bpe_mode;

/*
 * A trained BPE model. Symbol ids: [0, n_base) are the initial symbols
 * (SPM: characters in order of first appearance; BYTES: byte value b is
 * symbol b), then one id per distinct merge result in order of creation.
 * Merge i joins merge_left[i] and merge_right[i] into merge_out[i]; merges
 * are in the order learned (most frequent pair first; ties to the smaller
 * left id, then the smaller right id), so merge_out[i] < n_base + i + 1.
 * Training goes on until max_merges or until every word is one symbol.
 */
typedef struct genmodel_bpe {
    int32_t n_base;
    int32_t n_sym;
    int32_t n_merges;
    char *blob; /* [blob_cap] symbol texts back to back, no NULs */
    size_t blob_len, blob_cap;
    uint32_t *sym_off;  /* [sym_cap] text of symbol i: blob + sym_off[i] */
    uint32_t *sym_len;  /* [sym_cap] its bytes */
    int64_t *sym_count; /* [sym_cap] occurrences in the text (initial symbols),
                           pair count when created (merged symbols) */
    int32_t sym_cap;
    int32_t *merge_left; /* [merge_cap] */
    int32_t *merge_right;
    int32_t *merge_out;
    int32_t merge_cap;
    int32_t n_words;     /* distinct words, in order of first appearance */
    int64_t *word_count; /* [n_words] occurrences */
    int32_t *word_sym;   /* [n_words] the single symbol the word became, or -1 */
} genmodel_bpe;

/* Trains on len bytes of text. KEEL_ENOMEM, KEEL_EINVAL (empty text, a
 * word count or symbol total beyond INT32_MAX). *out is zeroed on failure
 * (safe to free). Deterministic: same input, same model. */
keel_status genmodel_bpe_train(const char *text, size_t len, genmodel_bpe_mode mode,
                               int32_t max_merges, genmodel_bpe *out);
void genmodel_bpe_free(genmodel_bpe *b);

/* ---- generated vocabularies (genvocab.c) --------------------------------- */

#define GENMODEL_MIN_VOCAB 300
#define GENMODEL_MAX_VOCAB (1 << 20)

typedef enum genmodel_vocab_kind {
    GENMODEL_VOCAB_SPM = 1, /* tokenizer.ggml.model "llama" (llama, gemma2) */
    GENMODEL_VOCAB_BPE = 2, /* tokenizer.ggml.model "gpt2", pre "qwen2" (qwen2, qwen3) */
} genmodel_vocab_kind;

/* Adds the tokenizer.ggml.* keys of an n_vocab-token vocabulary learned
 * from genmodel_text. KEEL_EINVAL for n_vocab outside
 * [GENMODEL_MIN_VOCAB, GENMODEL_MAX_VOCAB], KEEL_ENOMEM; detail in
 * err[BASE_ERR_CAP]. */
keel_status genmodel_add_vocab(gguf_writer *w, genmodel_vocab_kind kind, int32_t n_vocab,
                               char *err);

#endif /* KEEL_ENGINE_GENMODEL_H */
