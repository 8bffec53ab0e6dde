/*
 * fuzz/grammar.c — libFuzzer target: the GBNF compiler and the matcher
 * (src/grammar/grammar.h). The input is split at its first NUL byte: the
 * grammar before it, a text after it (no NUL: the grammar alone). A grammar
 * that compiles is matched against the text with small limits (every input
 * finishes quickly; a limit is a clean KEEL_ERANGE) and walked with a
 * vocabulary of the 256 single bytes and slices of the text. Checks (abort
 * on failure):
 *   - compile errors carry a message; a compiled grammar's start state opens;
 *   - byte by byte, the mask bit of the single-byte token of the next text
 *     byte equals whether the byte matcher accepts that byte, and a masked
 *     token's bytes are accepted by the token matcher;
 *   - the end-of-generation token is allowed exactly when the text so far
 *     is complete;
 *   - nothing leaks (libFuzzer's leak check).
 * Seeds: fuzz/corpus/libfuzzer_grammar (llama.cpp's grammars, each .gbnf with a
 * sample text each).
 */
#include "grammar/grammar.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZ_SLICES 32

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t src_n = nul ? (size_t)(nul - data) : size;
    char *src = malloc(src_n ? src_n : 1); /* exact-size copy: reads past the end are caught */
    memcpy(src, data, src_n);
    const uint8_t *text = nul ? nul + 1 : NULL;
    size_t text_n = nul ? size - src_n - 1 : 0;
    char err[BASE_ERR_CAP] = "";
    gram *g = NULL;
    keel_status st = gram_compile(src, src_n, &g, err);
    free(src);
    if (st != KEEL_OK) {
        if (g || !err[0]) abort();
        return 0;
    }
    /* the vocabulary: 256 bytes, slices of the text, an empty piece, EOG */
    enum { NV = 256 + FZ_SLICES + 2 };
    const uint8_t *piece[NV];
    size_t len[NV];
    uint8_t bytes[256];
    for (int i = 0; i < 256; i++) {
        bytes[i] = (uint8_t)i;
        piece[i] = bytes + i;
        len[i] = 1;
    }
    for (int i = 0; i < FZ_SLICES; i++) {
        size_t off = text_n ? (size_t)(i * 7) % text_n : 0, l = text_n ? 2 + (size_t)i % 5 : 0;
        if (off + l > text_n) l = text_n - off;
        piece[256 + i] = text_n ? text + off : NULL;
        len[256 + i] = l;
    }
    piece[NV - 2] = piece[NV - 1] = NULL;
    len[NV - 2] = len[NV - 1] = 0;
    int32_t eog = NV - 1;
    gram_vocab *v = NULL;
    if (gram_vocab_build(NV, piece, len, &eog, 1, &v, err) != KEEL_OK) abort();
    gram_limits lim = gram_limits_default();
    lim.max_nodes = 1u << 14;
    lim.max_set = 256;
    lim.max_closure = 4096;
    lim.max_memo_ids = 1u << 18;
    lim.max_mask_bytes = 1u << 20;
    gram_matcher *mb = NULL, *mt = NULL;
    if (gram_matcher_open(g, NULL, &lim, &mb, err) != KEEL_OK) goto done; /* the start state past a limit */
    if (gram_matcher_open(g, v, &lim, &mt, err) != KEEL_OK) abort();
    uint64_t mask[(NV + 63) / 64];
    for (size_t i = 0; i <= text_n && i < 64; i++) {
        st = gram_matcher_mask(mt, mask);
        if (st == KEEL_ERANGE) break;
        if (st != KEEL_OK) abort();
        bool eog_ok = (mask[eog / 64] >> (eog % 64)) & 1u;
        if (eog_ok != gram_matcher_complete(mb)) abort();
        if ((mask[(NV - 2) / 64] >> ((NV - 2) % 64)) & 1u) abort(); /* an empty piece is never allowed */
        if (i == text_n) break;
        uint8_t b = text[i];
        bool bit = (mask[b / 64] >> (b % 64)) & 1u;
        st = gram_matcher_accept_bytes(mb, &b, 1, NULL);
        if (st == KEEL_ERANGE) break;
        if ((st == KEEL_OK) != bit) abort();
        if (st != KEEL_OK) break;
        st = gram_matcher_accept_token(mt, b);
        if (st == KEEL_ERANGE) break;
        if (st != KEEL_OK) abort();
    }
    /* every allowed slice token is accepted (then the state is left as it is) */
    if (gram_matcher_mask(mt, mask) == KEEL_OK)
        for (int t = 256; t < 256 + FZ_SLICES; t++)
            if ((mask[t / 64] >> (t % 64)) & 1u) {
                st = gram_matcher_accept_token(mt, t);
                if (st != KEEL_OK && st != KEEL_ERANGE) abort();
                break;
            }
    /* the whole text through the byte matcher once more */
    if (gram_matcher_reset(mb) != KEEL_OK) abort();
    st = gram_matcher_accept_bytes(mb, text, text_n, NULL);
    if (st != KEEL_OK && st != KEEL_EINVAL && st != KEEL_ERANGE) abort();
done:
    gram_matcher_close(mb);
    gram_matcher_close(mt);
    gram_vocab_free(v);
    gram_free(g);
    return 0;
}
