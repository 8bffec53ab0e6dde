/*
 * genvocab.c — vocabularies for generated models: a deterministic BPE
 * trainer (SentencePiece-style over characters, or byte-level GPT-2 style)
 * and the tokenizer.ggml.* keys of an SPM ("llama") or BPE ("gpt2",
 * pre "qwen2") vocabulary learned from the built-in text (gentext.c).
 *
 * Trainer: the text is cut into words; identical words are counted once
 * with their multiplicity. Pair counts live in a hash map; a max-heap of
 * (count, left, right) entries, pushed whenever a pair's count changes,
 * gives the next merge: an entry whose count no longer matches the map is
 * stale and dropped. Applying a merge rewrites the words that contain the
 * pair in place (their pairs are subtracted before and added after).
 * Cost: O(words' symbols x merges) for the rewrite scan, small for a few
 * KB of text. Every array has a bound computed from the text.
 *
 * Invariants: pair counts in the map equal the weighted adjacent pairs of
 * the current words; a pair once merged is never merged again.
 */
#include "genmodel.h"

#include "../text/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SPM_SPACE "\xe2\x96\x81" /* U+2581, SentencePiece's escaped space */
#define MAX_TEXT  ((size_t)1 << 24)

/* ---- characters ----------------------------------------------------------- */

static bool is_letter(uint8_t c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80;
}

static bool is_digit(uint8_t c)
{
    return c >= '0' && c <= '9';
}

static bool is_space(uint8_t c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* ---- word cutting ---------------------------------------------------------- */

typedef struct span {
    uint32_t off, len;
} span;

/* Appends [off, off+len) to words (capacity is the source length + 1, and
 * words never overlap, so it cannot overflow). */
static void add_span(span *w, uint32_t *n, size_t off, size_t len)
{
    if (len == 0) return;
    w[*n].off = (uint32_t)off;
    w[*n].len = (uint32_t)len;
    (*n)++;
}

enum { CL_NONE, CL_SPACE, CL_LETTER, CL_DIGIT, CL_PUNCT };

/* SPM words of the escaped text e (U+2581 for spaces, one in front). */
static void cut_spm(const uint8_t *e, size_t n, span *w, uint32_t *nw)
{
    size_t start = 0, i = 0;
    int cls = CL_NONE; /* class of the open word; NONE: no open word */
    while (i < n) {
        size_t l = base_utf8_len(e + i, n - i);
        if (l == 0) { /* invalid byte: belongs to no word */
            if (cls != CL_NONE) add_span(w, nw, start, i - start);
            cls = CL_NONE;
            i++;
            continue;
        }
        uint8_t c = e[i];
        int k = (l == 3 && memcmp(e + i, SPM_SPACE, 3) == 0) ? CL_SPACE
                : (c < 0x20 || c == 0x7f)                    ? CL_NONE
                : is_letter(c)                               ? CL_LETTER
                : is_digit(c)                                ? CL_DIGIT
                                                             : CL_PUNCT;
        if (k == CL_NONE || k == CL_SPACE || (cls != CL_SPACE && cls != k)) {
            if (cls != CL_NONE) add_span(w, nw, start, i - start);
            start = i;
        }
        cls = k;
        i += l;
    }
    if (cls != CL_NONE) add_span(w, nw, start, n - start);
}

/* Length of an English contraction at s ("'s", "'ll", ...), or 0. */
static size_t contraction(const uint8_t *s, size_t n)
{
    if (n < 2 || s[0] != '\'') return 0;
    uint8_t a = (uint8_t)(s[1] | 0x20), b = n > 2 ? (uint8_t)(s[2] | 0x20) : 0;
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
}

/* Byte-level words, roughly the qwen2 pre-tokenizer's split. */
static void cut_bytes(const uint8_t *t, size_t n, span *w, uint32_t *nw)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = t[i];
        size_t j = i + 1, l;
        if ((l = contraction(t + i, n - i))) {
            j = i + l;
        } else if (is_letter(c) ||
                   (c != '\r' && c != '\n' && !is_digit(c) && j < n && is_letter(t[j]))) {
            while (j < n && is_letter(t[j]))
                j++;
        } else if (is_digit(c)) {
            /* one digit */
        } else if (!is_space(c) || (c == ' ' && j < n && !is_space(t[j]) && !is_digit(t[j]))) {
            while (j < n && !is_space(t[j]) && !is_letter(t[j]) && !is_digit(t[j]))
                j++;
            while (j < n && (t[j] == '\r' || t[j] == '\n'))
                j++;
        } else {
            while (j < n && is_space(t[j]))
                j++;
            size_t last_nl = 0;
            for (size_t k = i; k < j; k++)
                if (t[k] == '\n' || t[k] == '\r') last_nl = k + 1;
            if (last_nl)
                j = last_nl;
            else if (j < n && j - i > 1)
                j--; /* leave one space for the next word */
        }
        add_span(w, nw, i, j - i);
        i = j;
    }
}

/* ---- hashing ---------------------------------------------------------------- */

static size_t pow2_at_least(size_t n)
{
    size_t c = 16;
    while (c < n)
        c *= 2;
    return c;
}

typedef struct pair_entry {
    uint64_t key; /* left << 32 | right */
    int64_t count;
    int32_t stamp; /* merge number that last listed it as touched */
    uint8_t used, merged;
} pair_entry;

typedef struct heap_entry {
    int64_t count;
    int32_t left, right;
} heap_entry;

typedef struct trainer {
    genmodel_bpe *b;
    /* words */
    int32_t *sym;     /* [n_syms_total] symbols of all distinct words */
    uint32_t *wstart; /* [n_words] first symbol */
    uint32_t *wlen;   /* [n_words] current length */
    size_t n_syms_total;
    /* pair counts */
    pair_entry *pairs; /* [pair_cap] */
    size_t pair_cap;
    heap_entry *heap; /* [heap_cap], heap_n used */
    size_t heap_n, heap_cap;
    uint64_t *touched; /* [touched_cap] keys changed by the current merge */
    size_t touched_n, touched_cap;
    /* symbol text -> id + 1 */
    int32_t *sym_index;
    size_t sym_index_cap;
} trainer;

static uint64_t pair_hash(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ULL;
    return k ^ (k >> 33);
}

/* The entry of key, inserted if absent (the map is sized so it never fills). */
static pair_entry *pair_get(trainer *t, uint64_t key)
{
    size_t mask = t->pair_cap - 1, i = (size_t)pair_hash(key) & mask;
    while (t->pairs[i].used && t->pairs[i].key != key)
        i = (i + 1) & mask;
    pair_entry *e = &t->pairs[i];
    if (!e->used) {
        e->used = 1;
        e->key = key;
        e->stamp = -1;
    }
    return e;
}

static bool heap_less(const heap_entry *x, const heap_entry *y)
{
    /* "x comes after y": lower count, or equal count and larger ids */
    if (x->count != y->count) return x->count < y->count;
    if (x->left != y->left) return x->left > y->left;
    return x->right > y->right;
}

static keel_status heap_push(trainer *t, int64_t count, uint64_t key)
{
    if (t->heap_n == t->heap_cap) {
        size_t nc = t->heap_cap * 2;
        heap_entry *h = base_realloc(t->heap, t->heap_cap * sizeof *h, nc * sizeof *h);
        if (!h) return KEEL_ENOMEM;
        t->heap = h;
        t->heap_cap = nc;
    }
    heap_entry e = {count, (int32_t)(key >> 32), (int32_t)(key & 0xffffffffu)};
    size_t i = t->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(&t->heap[p], &e)) break;
        t->heap[i] = t->heap[p];
        i = p;
    }
    t->heap[i] = e;
    return KEEL_OK;
}

static heap_entry heap_pop(trainer *t)
{
    heap_entry top = t->heap[0], last = t->heap[--t->heap_n];
    size_t i = 0, n = t->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && heap_less(&t->heap[c], &t->heap[c + 1])) c++;
        if (!heap_less(&last, &t->heap[c])) break;
        t->heap[i] = t->heap[c];
        i = c;
    }
    if (n) t->heap[i] = last;
    return top;
}

/* Adds delta to the count of (l, r) and lists it as touched by merge m. */
static void pair_add(trainer *t, int32_t l, int32_t r, int64_t delta, int32_t m)
{
    uint64_t key = (uint64_t)(uint32_t)l << 32 | (uint32_t)r;
    pair_entry *e = pair_get(t, key);
    e->count += delta;
    if (e->stamp != m && t->touched_n < t->touched_cap) {
        e->stamp = m;
        t->touched[t->touched_n++] = key;
    }
}

/* Id of the symbol with text s[0..n), or -1; *slot gets its index slot. */
static int32_t sym_find(const trainer *t, const char *s, size_t n, size_t *slot)
{
    const genmodel_bpe *b = t->b;
    size_t mask = t->sym_index_cap - 1, i = (size_t)base_hash64(s, n, 0) & mask;
    while (t->sym_index[i]) {
        int32_t id = t->sym_index[i] - 1;
        if (b->sym_len[id] == n && memcmp(b->blob + b->sym_off[id], s, n) == 0) {
            *slot = i;
            return id;
        }
        i = (i + 1) & mask;
    }
    *slot = i;
    return -1;
}

/* Adds a symbol (text must not exist yet); its id, or -1 on ENOMEM/full. */
static int32_t sym_add(trainer *t, const char *s, size_t n, size_t slot)
{
    genmodel_bpe *b = t->b;
    if (b->n_sym >= b->sym_cap) return -1;
    if (b->blob_len + n > b->blob_cap) {
        size_t nc = b->blob_cap;
        while (nc < b->blob_len + n)
            nc *= 2;
        char *nb = base_realloc(b->blob, b->blob_cap, nc);
        if (!nb) return -1;
        b->blob = nb;
        b->blob_cap = nc;
    }
    memcpy(b->blob + b->blob_len, s, n);
    int32_t id = b->n_sym++;
    b->sym_off[id] = (uint32_t)b->blob_len;
    b->sym_len[id] = (uint32_t)n;
    b->sym_count[id] = 0;
    b->blob_len += n;
    t->sym_index[slot] = id + 1;
    return id;
}

void genmodel_bpe_free(genmodel_bpe *b)
{
    if (!b) return;
    size_t sc = b->sym_cap > 0 ? (size_t)b->sym_cap : 0;
    size_t mc = b->merge_cap > 0 ? (size_t)b->merge_cap : 0;
    size_t nw = b->n_words > 0 ? (size_t)b->n_words : 0;
    base_free(b->blob, b->blob_cap);
    base_free(b->sym_off, sc * sizeof *b->sym_off);
    base_free(b->sym_len, sc * sizeof *b->sym_len);
    base_free(b->sym_count, sc * sizeof *b->sym_count);
    base_free(b->merge_left, mc * sizeof *b->merge_left);
    base_free(b->merge_right, mc * sizeof *b->merge_right);
    base_free(b->merge_out, mc * sizeof *b->merge_out);
    base_free(b->word_count, nw * sizeof *b->word_count);
    base_free(b->word_sym, nw * sizeof *b->word_sym);
    memset(b, 0, sizeof *b);
}

static void trainer_free(trainer *t, uint32_t n_words)
{
    base_free(t->sym, t->n_syms_total * sizeof *t->sym);
    base_free(t->wstart, n_words * sizeof *t->wstart);
    base_free(t->wlen, n_words * sizeof *t->wlen);
    base_free(t->pairs, t->pair_cap * sizeof *t->pairs);
    base_free(t->heap, t->heap_cap * sizeof *t->heap);
    base_free(t->touched, t->touched_cap * sizeof *t->touched);
    base_free(t->sym_index, t->sym_index_cap * sizeof *t->sym_index);
}

/* Applies merge m = (l, r) -> s to every word; pushes changed pair counts. */
static keel_status apply_merge(trainer *t, int32_t m, int32_t l, int32_t r, int32_t s)
{
    genmodel_bpe *b = t->b;
    t->touched_n = 0;
    for (int32_t w = 0; w < b->n_words; w++) {
        int32_t *x = t->sym + t->wstart[w];
        uint32_t n = t->wlen[w];
        bool has = false;
        for (uint32_t i = 0; i + 1 < n && !has; i++)
            has = x[i] == l && x[i + 1] == r;
        if (!has) continue;
        int64_t c = b->word_count[w];
        for (uint32_t i = 0; i + 1 < n; i++)
            pair_add(t, x[i], x[i + 1], -c, m);
        uint32_t o = 0;
        for (uint32_t i = 0; i < n;) {
            if (i + 1 < n && x[i] == l && x[i + 1] == r) {
                x[o++] = s;
                i += 2;
            } else {
                x[o++] = x[i++];
            }
        }
        t->wlen[w] = n = o;
        for (uint32_t i = 0; i + 1 < n; i++)
            pair_add(t, x[i], x[i + 1], c, m);
    }
    for (size_t i = 0; i < t->touched_n; i++) {
        pair_entry *e = pair_get(t, t->touched[i]);
        if (e->count > 0 && !e->merged) {
            keel_status st = heap_push(t, e->count, e->key);
            if (st) return st;
        }
    }
    return KEEL_OK;
}

keel_status genmodel_bpe_train(const char *text, size_t len, genmodel_bpe_mode mode,
                               int32_t max_merges, genmodel_bpe *out)
{
    keel_status st = KEEL_ENOMEM;
    genmodel_bpe *b = out;
    memset(b, 0, sizeof *b);
    if (!text || len == 0 || len > MAX_TEXT || max_merges < 0) return KEEL_EINVAL;
    trainer t = {.b = b};
    uint8_t *src = NULL; /* SPM: the escaped text */
    size_t src_cap = 0, src_len = len;
    span *words = NULL; /* every word, then the distinct ones compacted to the front */
    size_t words_cap = 0;
    uint32_t n_spans = 0, n_words = 0;
    int32_t *widx = NULL; /* word text -> distinct word + 1 */
    size_t widx_cap = 0;
    int64_t *wtmp = NULL; /* [n_spans] counts while words are being found */
    size_t wtmp_n = 0;

    /* 1. words: spans of the source bytes */
    if (mode == GENMODEL_BPE_SPM) {
        src_cap = 3 + 3 * len;
        if (!(src = base_alloc(src_cap))) goto fail;
        memcpy(src, SPM_SPACE, 3);
        src_len = 3;
        for (size_t i = 0; i < len; i++) {
            if (text[i] == ' ') {
                memcpy(src + src_len, SPM_SPACE, 3);
                src_len += 3;
            } else {
                src[src_len++] = (uint8_t)text[i];
            }
        }
    }
    const uint8_t *base = src ? src : (const uint8_t *)text;
    words_cap = src_len + 1;
    if (!(words = base_alloc(words_cap * sizeof *words))) goto fail;
    if (mode == GENMODEL_BPE_SPM)
        cut_spm(base, src_len, words, &n_spans);
    else
        cut_bytes(base, src_len, words, &n_spans);

    /* 2. distinct words with counts, in order of first appearance */
    widx_cap = pow2_at_least(2 * (size_t)n_spans + 2);
    wtmp_n = (size_t)n_spans + 1;
    if (!(widx = base_calloc(widx_cap, sizeof *widx)) ||
        !(wtmp = base_calloc(wtmp_n, sizeof *wtmp)))
        goto fail;
    for (uint32_t i = 0; i < n_spans; i++) {
        const uint8_t *s = base + words[i].off;
        size_t n = words[i].len, h = (size_t)base_hash64(s, n, 1) & (widx_cap - 1);
        while (widx[h]) {
            const span *u = &words[widx[h] - 1];
            if (u->len == n && memcmp(base + u->off, s, n) == 0) break;
            h = (h + 1) & (widx_cap - 1);
        }
        if (!widx[h]) {
            words[n_words] = words[i]; /* n_words <= i: never overwrites an unread span */
            widx[h] = (int32_t)++n_words;
        }
        wtmp[widx[h] - 1]++;
    }
    if (n_words == 0) {
        st = KEEL_EINVAL;
        goto fail;
    }
    if (!(b->word_count = base_alloc(n_words * sizeof *b->word_count))) goto fail;
    b->n_words = (int32_t)n_words;
    memcpy(b->word_count, wtmp, n_words * sizeof *b->word_count);
    if (!(b->word_sym = base_alloc(n_words * sizeof *b->word_sym))) goto fail;

    /* 3. symbols of each word: characters (SPM) or bytes */
    size_t total = 0;
    for (uint32_t w = 0; w < n_words; w++)
        total += words[w].len;  /* bytes >= characters */
    size_t merge_bound = total; /* each merge removes at least one symbol */
    if ((size_t)max_merges < merge_bound) merge_bound = (size_t)max_merges;
    size_t base_bound = mode == GENMODEL_BPE_SPM ? total : 256;
    t.n_syms_total = total;
    b->sym_cap = (int32_t)(base_bound + merge_bound + 1);
    b->merge_cap = (int32_t)(merge_bound + 1);
    b->blob_cap = 4096;
    t.sym_index_cap = pow2_at_least(2 * (size_t)b->sym_cap);
    t.pair_cap = pow2_at_least(2 * (3 * total + 16));
    t.heap_cap = 3 * total + 16;
    t.touched_cap = 2 * total + 16;
    if (!(t.sym = base_alloc(total * sizeof *t.sym)) ||
        !(t.wstart = base_alloc(n_words * sizeof *t.wstart)) ||
        !(t.wlen = base_alloc(n_words * sizeof *t.wlen)) ||
        !(t.pairs = base_calloc(t.pair_cap, sizeof *t.pairs)) ||
        !(t.heap = base_alloc(t.heap_cap * sizeof *t.heap)) ||
        !(t.touched = base_alloc(t.touched_cap * sizeof *t.touched)) ||
        !(t.sym_index = base_calloc(t.sym_index_cap, sizeof *t.sym_index)) ||
        !(b->blob = base_alloc(b->blob_cap)) ||
        !(b->sym_off = base_alloc((size_t)b->sym_cap * sizeof *b->sym_off)) ||
        !(b->sym_len = base_alloc((size_t)b->sym_cap * sizeof *b->sym_len)) ||
        !(b->sym_count = base_alloc((size_t)b->sym_cap * sizeof *b->sym_count)) ||
        !(b->merge_left = base_alloc((size_t)b->merge_cap * sizeof *b->merge_left)) ||
        !(b->merge_right = base_alloc((size_t)b->merge_cap * sizeof *b->merge_right)) ||
        !(b->merge_out = base_alloc((size_t)b->merge_cap * sizeof *b->merge_out)))
        goto fail;
    if (mode == GENMODEL_BPE_BYTES) {
        for (int c = 0; c < 256; c++) {
            char enc[2];
            size_t n = text_gpt2_byte_utf8((uint8_t)c, enc), slot;
            sym_find(&t, enc, n, &slot);
            if (sym_add(&t, enc, n, slot) < 0) goto fail;
        }
    }
    size_t o = 0;
    for (uint32_t w = 0; w < n_words; w++) {
        const uint8_t *s = base + words[w].off;
        size_t n = words[w].len;
        t.wstart[w] = (uint32_t)o;
        for (size_t i = 0; i < n;) {
            int32_t id = s[i];
            size_t l = 1;
            if (mode == GENMODEL_BPE_SPM) {
                l = base_utf8_len(s + i, n - i); /* words hold whole characters only */
                if (l == 0) l = 1;
                size_t slot;
                id = sym_find(&t, (const char *)s + i, l, &slot);
                if (id < 0 && (id = sym_add(&t, (const char *)s + i, l, slot)) < 0) goto fail;
            }
            b->sym_count[id] += b->word_count[w];
            t.sym[o++] = id;
            i += l;
        }
        t.wlen[w] = (uint32_t)(o - t.wstart[w]);
    }
    b->n_base = b->n_sym;

    /* 4. initial pair counts */
    for (uint32_t w = 0; w < n_words; w++) {
        const int32_t *x = t.sym + t.wstart[w];
        for (uint32_t i = 0; i + 1 < t.wlen[w]; i++)
            pair_add(&t, x[i], x[i + 1], b->word_count[w], 0);
    }
    for (size_t i = 0; i < t.pair_cap; i++)
        if (t.pairs[i].used && t.pairs[i].count > 0 &&
            heap_push(&t, t.pairs[i].count, t.pairs[i].key) != KEEL_OK)
            goto fail;

    /* 5. merges, most frequent pair first */
    while (b->n_merges < max_merges && t.heap_n > 0) {
        heap_entry h = heap_pop(&t);
        uint64_t key = (uint64_t)(uint32_t)h.left << 32 | (uint32_t)h.right;
        pair_entry *e = pair_get(&t, key);
        if (e->merged || e->count != h.count) continue; /* stale */
        e->merged = 1;
        size_t ll = b->sym_len[h.left], lr = b->sym_len[h.right], slot;
        char *cat = base_alloc(ll + lr);
        if (!cat) goto fail;
        memcpy(cat, b->blob + b->sym_off[h.left], ll);
        memcpy(cat + ll, b->blob + b->sym_off[h.right], lr);
        int32_t s = sym_find(&t, cat, ll + lr, &slot);
        if (s < 0 && (s = sym_add(&t, cat, ll + lr, slot)) >= 0) b->sym_count[s] = h.count;
        base_free(cat, ll + lr);
        if (s < 0) goto fail;
        int32_t m = b->n_merges++;
        b->merge_left[m] = h.left;
        b->merge_right[m] = h.right;
        b->merge_out[m] = s;
        if (apply_merge(&t, m + 1, h.left, h.right, s) != KEEL_OK) goto fail;
    }
    for (uint32_t w = 0; w < n_words; w++)
        b->word_sym[w] = t.wlen[w] == 1 ? t.sym[t.wstart[w]] : -1;
    st = KEEL_OK;
fail:
    trainer_free(&t, n_words);
    base_free(wtmp, wtmp_n * sizeof *wtmp);
    base_free(widx, widx_cap * sizeof *widx);
    base_free(words, words_cap * sizeof *words);
    base_free(src, src_cap);
    if (st) genmodel_bpe_free(b);
    return st;
}

/* ---- generated vocabularies ------------------------------------------------- */

/*
 * Token texts are views: into the trained model's blob, into static
 * strings, or (ptr NULL) at offset off of the growing extra blob, resolved
 * once everything is added.
 */
typedef struct vbuild {
    const char **ptr; /* [n_vocab] */
    size_t *off;      /* [n_vocab] extra-blob offset when ptr is NULL */
    size_t *len;      /* [n_vocab] */
    float *score;     /* [n_vocab] */
    int32_t *type;    /* [n_vocab] text_token_type values */
    int32_t n, cap;
    const char **mptr; /* [mcap] merge texts "left right" (BPE) */
    size_t *moff, *mlen;
    int32_t mn, mcap;
    char *extra; /* [extra_cap] texts made here, extra_len used */
    size_t extra_len, extra_cap;
} vbuild;

enum { TOK_NORMAL = 1, TOK_UNKNOWN = 2, TOK_CONTROL = 3, TOK_UNUSED = 5, TOK_BYTE = 6 };

static void vb_add(vbuild *v, const char *s, size_t n, float score, int32_t type)
{
    v->ptr[v->n] = s;
    v->off[v->n] = 0;
    v->len[v->n] = n;
    v->score[v->n] = score;
    v->type[v->n] = type;
    v->n++;
}

/* Appends n bytes (two pieces, the second may be empty) to the extra blob;
 * its offset in *off. KEEL_ENOMEM. */
static keel_status vb_extra(vbuild *v, const char *a, size_t na, const char *b, size_t nb,
                            size_t *off)
{
    size_t need = v->extra_len + na + nb;
    if (need > v->extra_cap) {
        size_t nc = v->extra_cap ? v->extra_cap : 4096;
        while (nc < need)
            nc *= 2;
        char *p = base_realloc(v->extra, v->extra_cap, nc);
        if (!p) return KEEL_ENOMEM;
        v->extra = p;
        v->extra_cap = nc;
    }
    *off = v->extra_len;
    memcpy(v->extra + v->extra_len, a, na);
    if (nb) memcpy(v->extra + v->extra_len + na, b, nb);
    v->extra_len = need;
    return KEEL_OK;
}

static keel_status vb_add_extra(vbuild *v, const char *a, size_t na, const char *b, size_t nb,
                                float score, int32_t type)
{
    size_t off;
    keel_status st = vb_extra(v, a, na, b, nb, &off);
    if (st) return st;
    vb_add(v, NULL, na + nb, score, type);
    v->off[v->n - 1] = off;
    return KEEL_OK;
}

static keel_status vb_add_merge(vbuild *v, const char *a, size_t na, const char *b, size_t nb)
{
    size_t off, off2;
    keel_status st = vb_extra(v, a, na, " ", 1, &off);
    if (st == KEEL_OK) st = vb_extra(v, b, nb, "", 0, &off2); /* right after: one text */
    if (st) return st;
    v->mptr[v->mn] = NULL;
    v->moff[v->mn] = off;
    v->mlen[v->mn] = na + 1 + nb;
    v->mn++;
    return KEEL_OK;
}

static void vb_free(vbuild *v)
{
    size_t c = v->cap > 0 ? (size_t)v->cap : 0, mc = v->mcap > 0 ? (size_t)v->mcap : 0;
    base_free(v->ptr, c * sizeof *v->ptr);
    base_free(v->off, c * sizeof *v->off);
    base_free(v->len, c * sizeof *v->len);
    base_free(v->score, c * sizeof *v->score);
    base_free(v->type, c * sizeof *v->type);
    base_free(v->mptr, mc * sizeof *v->mptr);
    base_free(v->moff, mc * sizeof *v->moff);
    base_free(v->mlen, mc * sizeof *v->mlen);
    base_free(v->extra, v->extra_cap);
}

/* Whole words usable in filler pieces, most frequent first (ties: first
 * seen first): words that became one symbol, start with prefix and
 * continue with letters only. */
typedef struct wordref {
    int64_t count;
    int32_t idx, sym;
} wordref;

static int wordref_cmp(const void *a, const void *b)
{
    const wordref *x = a, *y = b;
    if (x->count != y->count) return x->count > y->count ? -1 : 1;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

static int32_t pick_words(const genmodel_bpe *b, const char *prefix, wordref *out)
{
    size_t pl = strlen(prefix);
    int32_t n = 0;
    for (int32_t w = 0; w < b->n_words; w++) {
        int32_t s = b->word_sym[w];
        if (s < 0 || b->sym_len[s] <= pl || memcmp(b->blob + b->sym_off[s], prefix, pl) != 0)
            continue;
        bool letters = true; /* whole words of letters only: no "people\"" */
        for (uint32_t i = (uint32_t)pl; i < b->sym_len[s] && letters; i++)
            letters = is_letter((uint8_t)b->blob[b->sym_off[s] + i]);
        if (!letters) continue;
        out[n++] = (wordref){b->word_count[w], w, s};
    }
    qsort(out, (size_t)n, sizeof *out, wordref_cmp);
    return n;
}

/*
 * Fills the vocabulary up to n_vocab - reserve tokens with pieces made of
 * two whole words (W[i] W[j], enumerated by i + j, then i), each reachable
 * by merging two tokens already present; BPE also gets the merge "W[i]
 * W[j]". Whatever is still missing becomes "[PAD<id>]" UNUSED tokens, as
 * llama.cpp's converters pad vocabularies.
 */
static keel_status fill_rest(vbuild *v, const genmodel_bpe *b, const char *prefix, bool merges,
                             int32_t n_vocab, int32_t reserve, float *score)
{
    keel_status st = KEEL_OK;
    int32_t target = n_vocab - reserve;
    if (v->n >= target) return KEEL_OK;
    wordref *w = base_alloc((size_t)(b->n_words > 0 ? b->n_words : 1) * sizeof *w);
    if (!w) return KEEL_ENOMEM;
    int64_t nw = pick_words(b, prefix, w);
    for (int64_t s = 0; s <= 2 * (nw - 1) && v->n < target && !st; s++) {
        for (int64_t i = s < nw ? 0 : s - nw + 1; i <= s && i < nw && v->n < target && !st; i++) {
            const wordref *x = &w[i], *y = &w[s - i];
            const char *a = b->blob + b->sym_off[x->sym], *c = b->blob + b->sym_off[y->sym];
            size_t na = b->sym_len[x->sym], nc = b->sym_len[y->sym];
            st = vb_add_extra(v, a, na, c, nc, (*score)--, TOK_NORMAL);
            if (!st && merges) st = vb_add_merge(v, a, na, c, nc);
        }
    }
    base_free(w, (size_t)(b->n_words > 0 ? b->n_words : 1) * sizeof *w);
    while (!st && v->n < target) {
        char pad[32];
        int n = snprintf(pad, sizeof pad, "[PAD%d]", v->n);
        st = vb_add_extra(v, pad, (size_t)n, "", 0, (*score)--, TOK_UNUSED);
    }
    return st;
}

/* Initial symbols by count (descending), ties by id. */
typedef struct charref {
    int64_t count;
    int32_t id;
} charref;

static int charref_cmp(const void *a, const void *b)
{
    const charref *x = a, *y = b;
    if (x->count != y->count) return x->count > y->count ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static keel_status build_spm(vbuild *v, const genmodel_bpe *b, int32_t n_vocab)
{
    static const char hex[] = "0123456789ABCDEF";
    keel_status st;
    vb_add(v, "<unk>", 5, 0.0f, TOK_UNKNOWN);
    vb_add(v, "<s>", 3, 0.0f, TOK_CONTROL);
    vb_add(v, "</s>", 4, 0.0f, TOK_CONTROL);
    for (int c = 0; c < 256; c++) {
        char t[6] = {'<', '0', 'x', hex[c >> 4], hex[c & 15], '>'};
        if ((st = vb_add_extra(v, t, 6, "", 0, 0.0f, TOK_BYTE))) return st;
    }
    /* characters first, as SentencePiece reserves them, but at most half
     * the room: in a small vocabulary merges compress more than rare
     * characters, which byte tokens cover anyway */
    int32_t room = n_vocab - v->n;
    int32_t n_chars = BASE_MIN(b->n_base, room / 2);
    int32_t n_pieces = BASE_MIN(b->n_sym - b->n_base, room - n_chars);
    float score = 0.0f;
    for (int32_t i = 0; i < n_pieces; i++) {
        int32_t s = b->n_base + i;
        vb_add(v, b->blob + b->sym_off[s], b->sym_len[s], score--, TOK_NORMAL);
    }
    charref *c = base_alloc((size_t)(b->n_base > 0 ? b->n_base : 1) * sizeof *c);
    if (!c) return KEEL_ENOMEM;
    for (int32_t i = 0; i < b->n_base; i++)
        c[i] = (charref){b->sym_count[i], i};
    qsort(c, (size_t)b->n_base, sizeof *c, charref_cmp);
    for (int32_t i = 0; i < n_chars; i++)
        vb_add(v, b->blob + b->sym_off[c[i].id], b->sym_len[c[i].id], score--, TOK_NORMAL);
    base_free(c, (size_t)(b->n_base > 0 ? b->n_base : 1) * sizeof *c);
    return fill_rest(v, b, SPM_SPACE, false, n_vocab, 0, &score);
}

static const char *const g_bpe_special[3] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};

static keel_status build_bpe(vbuild *v, const genmodel_bpe *b, int32_t n_vocab)
{
    keel_status st;
    for (int32_t s = 0; s < 256; s++)
        vb_add(v, b->blob + b->sym_off[s], b->sym_len[s], 0.0f, TOK_NORMAL);
    int32_t room = n_vocab - 256 - 3;
    int32_t n_pieces = BASE_MIN(b->n_sym - 256, room);
    for (int32_t i = 0; i < n_pieces; i++) {
        int32_t s = 256 + i;
        vb_add(v, b->blob + b->sym_off[s], b->sym_len[s], 0.0f, TOK_NORMAL);
    }
    for (int32_t m = 0; m < b->n_merges && b->merge_out[m] < 256 + n_pieces; m++) {
        int32_t l = b->merge_left[m], r = b->merge_right[m];
        if ((st = vb_add_merge(v, b->blob + b->sym_off[l], b->sym_len[l], b->blob + b->sym_off[r],
                               b->sym_len[r])))
            return st;
    }
    float score = 0.0f;
    if ((st = fill_rest(v, b, "\xc4\xa0", true, n_vocab, 3, &score))) return st;
    for (int i = 0; i < 3; i++)
        vb_add(v, g_bpe_special[i], strlen(g_bpe_special[i]), 0.0f, TOK_CONTROL);
    return KEEL_OK;
}

keel_status genmodel_add_vocab(gguf_writer *w, genmodel_vocab_kind kind, int32_t n_vocab, char *err)
{
    keel_status st;
    if (n_vocab < GENMODEL_MIN_VOCAB || n_vocab > GENMODEL_MAX_VOCAB)
        return base_err(err, KEEL_EINVAL, "n_vocab %d outside [%d, %d]", n_vocab,
                        GENMODEL_MIN_VOCAB, GENMODEL_MAX_VOCAB);
    bool spm = kind == GENMODEL_VOCAB_SPM;
    genmodel_bpe b;
    vbuild v = {0};
    int32_t room = n_vocab - 259; /* SPM: 3 specials + 256 bytes; BPE: 256 bytes + 3 specials */
    st = genmodel_bpe_train(genmodel_text, genmodel_text_len,
                            spm ? GENMODEL_BPE_SPM : GENMODEL_BPE_BYTES, room, &b);
    if (st) return base_err(err, st, "vocabulary: training: %s", keel_strerror(st));
    size_t cap = (size_t)n_vocab;
    v.cap = n_vocab;
    v.mcap = spm ? 0 : b.n_merges + n_vocab;
    size_t mcap = (size_t)v.mcap;
    st = KEEL_ENOMEM;
    if (!(v.ptr = base_alloc(cap * sizeof *v.ptr)) || !(v.off = base_alloc(cap * sizeof *v.off)) ||
        !(v.len = base_alloc(cap * sizeof *v.len)) ||
        !(v.score = base_alloc(cap * sizeof *v.score)) ||
        !(v.type = base_alloc(cap * sizeof *v.type)))
        goto done;
    if (mcap && (!(v.mptr = base_alloc(mcap * sizeof *v.mptr)) ||
                 !(v.moff = base_alloc(mcap * sizeof *v.moff)) ||
                 !(v.mlen = base_alloc(mcap * sizeof *v.mlen))))
        goto done;
    if ((st = spm ? build_spm(&v, &b, n_vocab) : build_bpe(&v, &b, n_vocab))) goto done;
    if (v.n != n_vocab) {
        st = KEEL_EINTERNAL;
        goto done;
    }
    for (int32_t i = 0; i < v.n; i++)
        if (!v.ptr[i]) v.ptr[i] = v.extra + v.off[i];
    for (int32_t i = 0; i < v.mn; i++)
        if (!v.mptr[i]) v.mptr[i] = v.extra + v.moff[i];
    const uint64_t n = (uint64_t)n_vocab;
    if (spm) {
        if ((st = gguf_writer_add_str(w, "tokenizer.ggml.model", "llama")) ||
            (st = gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", v.ptr, v.len, n)) ||
            (st = gguf_writer_add_arr(w, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, v.score, n)) ||
            (st =
                 gguf_writer_add_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, v.type, n)) ||
            (st = gguf_writer_add_u32(w, "tokenizer.ggml.unknown_token_id", 0)) ||
            (st = gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", 1)) ||
            (st = gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", 2)) ||
            (st = gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", true)) ||
            (st = gguf_writer_add_bool(w, "tokenizer.ggml.add_eos_token", false)))
            goto done;
    } else {
        uint32_t eot = (uint32_t)n_vocab - 3;
        if ((st = gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2")) ||
            (st = gguf_writer_add_str(w, "tokenizer.ggml.pre", "qwen2")) ||
            (st = gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", v.ptr, v.len, n)) ||
            (st =
                 gguf_writer_add_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, v.type, n)) ||
            (st = gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", v.mptr, v.mlen,
                                          (uint64_t)v.mn)) ||
            (st = gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", eot)) ||
            (st = gguf_writer_add_u32(w, "tokenizer.ggml.padding_token_id", eot)) ||
            (st = gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", eot)) ||
            (st = gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", false)))
            goto done;
    }
done:
    if (st == KEEL_ENOMEM)
        base_err(err, st, "vocabulary: out of memory");
    else if (st)
        base_err(err, st, "vocabulary: %s", gguf_writer_last_error(w));
    vb_free(&v);
    genmodel_bpe_free(&b);
    return st;
}
