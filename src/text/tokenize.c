/*
 * tokenize.c — text_tokenize: special-token partitioning, then SPM or BPE
 * per raw fragment, with BOS/EOS, as llama.cpp's llama_vocab::tokenize.
 *
 * Partitioning (llama.cpp's tokenizer_st_partition): for each special token
 * in order (longest text first; CONTROL and UNKNOWN only when parse_special,
 * USER_DEFINED always), every raw fragment is split at each leftmost
 * non-overlapping occurrence of its text. Fragments live in two growable
 * vectors swapped per token; their count is at most 2 x text length + 1.
 * Scratch is allocated per call and freed before return.
 */
#include "tok_int.h"

#include <string.h>

typedef struct frag {
    int32_t tok;     /* special token id, or TEXT_TOKEN_NULL for raw text */
    size_t off, len; /* raw text range */
} frag;

typedef struct frag_vec {
    frag *v;
    size_t n, cap;
} frag_vec;

static keel_status frag_push(frag_vec *f, int32_t tok, size_t off, size_t len)
{
    if (f->n == f->cap) {
        size_t nc = f->cap ? 2 * f->cap : 16;
        frag *p = base_realloc(f->v, f->cap * sizeof *p, nc * sizeof *p);
        if (!p) return KEEL_ENOMEM;
        f->v = p;
        f->cap = nc;
    }
    f->v[f->n++] = (frag){tok, off, len};
    return KEEL_OK;
}

static keel_status partition(const text_tokenizer *t, const char *text, size_t len,
                             bool parse_special, frag_vec *a, frag_vec *b)
{
    keel_status st;
    if ((st = frag_push(a, TEXT_TOKEN_NULL, 0, len))) return st;
    for (int32_t k = 0; k < t->n_special; k++) {
        int32_t id = t->special[k];
        const tok_entry *e = &t->tok[id];
        if (!parse_special && e->type != TEXT_TOKEN_USER_DEFINED) continue;
        const char *s = tok_text(t, id);
        size_t sl = e->len;
        if (sl > len || !memmem(text, len, s, sl)) continue; /* cheap reject */
        b->n = 0;
        for (size_t i = 0; i < a->n; i++) {
            frag f = a->v[i];
            if (f.tok != TEXT_TOKEN_NULL) {
                if ((st = frag_push(b, f.tok, 0, 0))) return st;
                continue;
            }
            size_t cur = f.off, end = f.off + f.len;
            while (end - cur >= sl) {
                const char *m = memmem(text + cur, end - cur, s, sl);
                if (!m) break;
                size_t pos = (size_t)(m - text);
                if (pos > cur && (st = frag_push(b, TEXT_TOKEN_NULL, cur, pos - cur))) return st;
                if ((st = frag_push(b, id, 0, 0))) return st;
                cur = pos + sl;
            }
            if (cur < end && (st = frag_push(b, TEXT_TOKEN_NULL, cur, end - cur))) return st;
        }
        frag_vec tmp = *a;
        *a = *b;
        *b = tmp;
    }
    return KEEL_OK;
}

keel_status text_tokenize(const text_tokenizer *t, const char *text, size_t len, bool add_special,
                          bool parse_special, int32_t *out, int64_t cap, int64_t *n_out, char *err)
{
    if (!t || !n_out || (!text && len) || cap < 0 || (!out && cap))
        return base_err(err, KEEL_EINVAL, "bad argument");
    *n_out = 0;
    keel_status st = KEEL_OK;
    const text_tokenizer_info *in = &t->info;
    tok_out o = {out, cap, 0};
    frag_vec a = {0}, b = {0};
    if (len && (st = partition(t, text, len, parse_special, &a, &b))) goto done;
    if (add_special && in->add_bos && in->bos != TEXT_TOKEN_NULL) tok_emit(&o, in->bos);
    bool prev_special = true; /* SPM: a space before the first raw fragment */
    for (size_t i = 0; i < a.n; i++) {
        const frag *f = &a.v[i];
        if (f->tok != TEXT_TOKEN_NULL) {
            tok_emit(&o, f->tok);
            prev_special = true;
            continue;
        }
        if (in->type == TEXT_VOCAB_SPM)
            st = spm_encode(t, text + f->off, f->len, in->add_space_prefix && prev_special, &o);
        else
            st = bpe_encode(t, text + f->off, f->len, &o);
        if (st) goto done;
        prev_special = false;
    }
    if (add_special && in->add_eos && in->eos != TEXT_TOKEN_NULL) tok_emit(&o, in->eos);
    *n_out = o.n;
    if (o.n > cap)
        st = base_err(err, KEEL_ERANGE, "%lld tokens do not fit in %lld", (long long)o.n,
                      (long long)cap);
done:
    if (st == KEEL_ENOMEM) base_err(err, st, "out of memory tokenizing %zu bytes", len);
    if (st == KEEL_EINVAL) base_err(err, st, "text of %zu bytes too long", len);
    base_free(a.v, a.cap * sizeof *a.v);
    base_free(b.v, b.cap * sizeof *b.v);
    return st;
}
