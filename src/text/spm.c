/*
 * spm.c — SentencePiece-BPE tokenization of one text fragment, as
 * llama.cpp's llm_tokenizer_spm does it: split into UTF-8 characters, then
 * repeatedly merge the adjacent pair whose concatenation is the
 * highest-scoring vocabulary token (ties: leftmost), and finally emit each
 * remaining symbol as its token or, if it is not one, as byte tokens
 * ("<0xHH>"). Spaces are escaped to U+2581 first. One deviation, for
 * malformed UTF-8 only: each bad byte is its own symbol (llama.cpp lets a
 * bad lead byte swallow the next bytes), so any input round-trips.
 *
 * llama.cpp also keeps a "rev_merge" map to re-split symbols that are not
 * tokens; it is never consulted with effect, because a merged symbol is
 * always a token (merges happen only when the pair text is one) and single
 * characters never enter the map, so it is omitted here.
 *
 * Scratch per call: escaped text (3 bytes per input byte at most), symbols
 * (at most one per input byte) and a binary heap of candidate pairs (at
 * most 3 per symbol over the run: n - 1 initial, 2 per merge). All O(len),
 * freed before return.
 */
#include "tok_int.h"

#include <string.h>

typedef struct spm_sym {
    int32_t prev, next; /* neighbours in the chain, -1 at the ends */
    uint32_t off, n;    /* bytes of the escaped text; n == 0 once merged away */
} spm_sym;

typedef struct spm_pair {
    float score;
    int32_t left, right;
    uint32_t size; /* bytes of the pair when pushed: detects stale entries */
} spm_pair;

/* a pops before b: higher score, then lower left index (llama.cpp) */
static bool pair_before(const spm_pair *a, const spm_pair *b)
{
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static void heap_push(spm_pair *h, size_t *n, spm_pair v)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!pair_before(&v, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static spm_pair heap_pop(spm_pair *h, size_t *n)
{
    spm_pair top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, best = i;
        const spm_pair *bv = &last;
        if (l < *n && pair_before(&h[l], bv)) best = l, bv = &h[l];
        if (r < *n && pair_before(&h[r], bv)) best = r;
        if (best == i) break;
        h[i] = h[best];
        i = best;
    }
    if (*n) h[i] = last;
    return top;
}

typedef struct spm_ctx {
    const text_tokenizer *t;
    const char *s; /* escaped text */
    spm_sym *sym;
    spm_pair *heap;
    size_t n_heap, heap_cap;
} spm_ctx;

static void try_pair(spm_ctx *c, int32_t left, int32_t right)
{
    if (left < 0 || right < 0) return;
    const spm_sym *l = &c->sym[left], *r = &c->sym[right];
    int32_t id = tok_lookup(c->t, c->s + l->off, (size_t)l->n + r->n);
    if (id == TEXT_TOKEN_NULL || c->n_heap >= c->heap_cap) return;
    spm_pair p = {c->t->tok[id].score, left, right, l->n + r->n};
    heap_push(c->heap, &c->n_heap, p);
}

static void emit_symbol(const text_tokenizer *t, const char *s, size_t n, tok_out *o)
{
    int32_t id = tok_lookup(t, s, n);
    if (id != TEXT_TOKEN_NULL) {
        tok_emit(o, id);
        return;
    }
    /* byte fallback; a byte with no token becomes unk (llama.cpp throws) */
    for (size_t i = 0; i < n; i++) {
        int32_t b = t->byte_tok[(uint8_t)s[i]];
        if (b == TEXT_TOKEN_NULL) b = t->info.unk;
        if (b != TEXT_TOKEN_NULL) tok_emit(o, b);
    }
}

keel_status spm_encode(const text_tokenizer *t, const char *text, size_t len, bool prefix_space,
                       tok_out *o)
{
    keel_status st = KEEL_OK;
    size_t n_sp = prefix_space ? 1 : 0, esc_len;
    for (size_t i = 0; i < len; i++)
        n_sp += text[i] == ' ';
    esc_len = len + (prefix_space ? 1 : 0) + 2 * n_sp;
    if (esc_len == 0) return KEEL_OK;
    if (esc_len > UINT32_MAX / 2) return KEEL_EINVAL;
    /* every input byte (and the prefix) yields at most one symbol */
    size_t sym_cap = len + 1;
    char *s = base_alloc(esc_len);
    spm_sym *sym = base_alloc(sym_cap * sizeof *sym);
    size_t heap_cap = 3 * sym_cap;
    spm_pair *heap = base_alloc(heap_cap * sizeof *heap);
    if (!s || !sym || !heap) {
        st = KEEL_ENOMEM;
        goto done;
    }
    size_t k = 0;
    if (prefix_space) memcpy(s, "\xe2\x96\x81", 3), k = 3;
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ')
            memcpy(s + k, "\xe2\x96\x81", 3), k += 3;
        else
            s[k++] = text[i];
    }
    /* split into UTF-8 characters (each malformed byte its own symbol) */
    int32_t n_sym = 0;
    for (size_t off = 0; off < esc_len;) {
        size_t n = tok_char_len((const uint8_t *)s + off, esc_len - off);
        sym[n_sym].prev = n_sym - 1;
        sym[n_sym].off = (uint32_t)off;
        sym[n_sym].n = (uint32_t)n;
        off += n;
        sym[n_sym].next = off == esc_len ? -1 : n_sym + 1;
        n_sym++;
    }
    spm_ctx c = {t, s, sym, heap, 0, heap_cap};
    for (int32_t i = 1; i < n_sym; i++)
        try_pair(&c, i - 1, i);
    while (c.n_heap) {
        spm_pair p = heap_pop(heap, &c.n_heap);
        spm_sym *l = &sym[p.left], *r = &sym[p.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != p.size) continue; /* stale */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) sym[r->next].prev = p.left;
        try_pair(&c, l->prev, p.left);
        try_pair(&c, p.left, l->next);
    }
    for (int32_t i = 0; i != -1; i = sym[i].next)
        emit_symbol(t, s + sym[i].off, sym[i].n, o);
done:
    base_free(s, esc_len);
    base_free(sym, sym_cap * sizeof *sym);
    base_free(heap, heap_cap * sizeof *heap);
    return st;
}
