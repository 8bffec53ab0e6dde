/*
 * gvocab.c — the vocabulary trie of constrained decoding (grammar.h):
 * token pieces sorted by bytes (a merge sort through the hooks' memory),
 * then laid out as trie nodes in preorder, each with the first node after
 * its subtree, so a walk skips a dead prefix's subtree in one step.
 * Tokens with identical pieces share a node (chained through tnext).
 */
#include "grammar.h"

#include <string.h>

void gram_vocab_free(gram_vocab *v)
{
    if (!v) return;
    base_free(v->bytes, (size_t)v->off[v->n_vocab] + 1);
    base_free(v->off, ((size_t)v->n_vocab + 1) * sizeof *v->off);
    base_free(v->eog, (size_t)v->n_words * sizeof *v->eog);
    base_free(v->tbyte, (size_t)v->n_tnodes + 1);
    base_free(v->tdepth, ((size_t)v->n_tnodes + 1) * sizeof *v->tdepth);
    base_free(v->tend, ((size_t)v->n_tnodes + 1) * sizeof *v->tend);
    base_free(v->ttok, ((size_t)v->n_tnodes + 1) * sizeof *v->ttok);
    base_free(v->tnext, (size_t)v->n_vocab * sizeof *v->tnext);
    base_free(v->tmulti, (size_t)v->n_tnodes + 1);
    base_free(v, sizeof *v);
}

/* piece a < piece b, bytewise, a prefix first; ties by id */
static bool piece_less(const gram_vocab *v, int32_t a, int32_t b)
{
    uint32_t la = v->off[a + 1] - v->off[a], lb = v->off[b + 1] - v->off[b];
    int c = memcmp(v->bytes + v->off[a], v->bytes + v->off[b], BASE_MIN(la, lb));
    if (c) return c < 0;
    if (la != lb) return la < lb;
    return a < b;
}

keel_status gram_vocab_build(int32_t n_vocab, const uint8_t *const *piece, const size_t *len, const int32_t *eog,
                             int32_t n_eog, gram_vocab **out, char *err)
{
    if (!out) return base_err(err, KEEL_EINVAL, "grammar vocab: out is NULL");
    *out = NULL;
    if (n_vocab < 1 || !piece || !len || (n_eog && !eog))
        return base_err(err, KEEL_EINVAL, "grammar vocab: bad arguments");
    size_t total = 0;
    for (int32_t i = 0; i < n_vocab; i++) {
        if (len[i] > 65535) return base_err(err, KEEL_ERANGE, "grammar vocab: token %d longer than 65535 bytes", i);
        if (len[i] && !piece[i]) return base_err(err, KEEL_EINVAL, "grammar vocab: token %d has no bytes", i);
        total += len[i];
    }
    if (total > UINT32_MAX - 1) return base_err(err, KEEL_ERANGE, "grammar vocab: pieces above 4 GiB");
    gram_vocab *v = base_calloc(1, sizeof *v);
    int32_t *ord = NULL, *tmp = NULL, *open = NULL;
    keel_status st = KEEL_OK;
    if (!v) return base_err(err, KEEL_ENOMEM, "grammar vocab: out of memory");
    v->n_vocab = n_vocab;
    v->n_words = (n_vocab + 63) / 64;
    v->off = base_calloc((size_t)n_vocab + 1, sizeof *v->off);
    v->bytes = base_alloc(total + 1);
    v->eog = base_calloc((size_t)v->n_words, sizeof *v->eog);
    v->tnext = base_alloc((size_t)n_vocab * sizeof *v->tnext);
    ord = base_alloc((size_t)n_vocab * sizeof *ord);
    tmp = base_alloc((size_t)n_vocab * sizeof *tmp);
    if (!v->off || !v->bytes || !v->eog || !v->tnext || !ord || !tmp) {
        st = base_err(err, KEEL_ENOMEM, "grammar vocab: out of memory");
        goto fail;
    }
    size_t o = 0;
    int32_t n_ord = 0;
    for (int32_t i = 0; i < n_vocab; i++) {
        v->off[i] = (uint32_t)o;
        if (len[i]) memcpy(v->bytes + o, piece[i], len[i]);
        o += len[i];
        v->tnext[i] = -1;
        if (len[i]) ord[n_ord++] = i;
        if (len[i] > v->max_len) v->max_len = (uint32_t)len[i];
    }
    v->off[n_vocab] = (uint32_t)o;
    for (int32_t i = 0; i < n_eog; i++) {
        if (eog[i] < 0 || eog[i] >= n_vocab) {
            st = base_err(err, KEEL_EINVAL, "grammar vocab: end-of-generation id %d out of range", eog[i]);
            goto fail;
        }
        v->eog[eog[i] / 64] |= 1ull << (eog[i] % 64);
    }
    /* sort the ids with pieces by bytes (bottom-up merge sort) */
    int32_t *a = ord, *b = tmp;
    for (int32_t w = 1; w < n_ord; w *= 2) {
        for (int32_t i = 0; i < n_ord; i += 2 * w) {
            int32_t m = BASE_MIN(i + w, n_ord), e = BASE_MIN(i + 2 * w, n_ord), x = i, y = m, k = i;
            while (x < m && y < e) b[k++] = piece_less(v, a[y], a[x]) ? a[y++] : a[x++];
            while (x < m) b[k++] = a[x++];
            while (y < e) b[k++] = a[y++];
        }
        int32_t *t = a;
        a = b;
        b = t;
    }
    /* count the nodes: each piece adds len - lcp(previous) */
    size_t nodes = 0;
    for (int32_t i = 0; i < n_ord; i++) {
        uint32_t l = v->off[a[i] + 1] - v->off[a[i]], lcp = 0;
        if (i > 0) {
            uint32_t pl = v->off[a[i - 1] + 1] - v->off[a[i - 1]];
            const uint8_t *p = v->bytes + v->off[a[i - 1]], *q = v->bytes + v->off[a[i]];
            while (lcp < pl && lcp < l && p[lcp] == q[lcp]) lcp++;
        }
        nodes += l - lcp;
    }
    if (nodes >= UINT32_MAX) {
        st = base_err(err, KEEL_ERANGE, "grammar vocab: trie too large");
        goto fail;
    }
    v->n_tnodes = (uint32_t)nodes;
    v->tbyte = base_alloc(nodes + 1);
    v->tdepth = base_alloc((nodes + 1) * sizeof *v->tdepth);
    v->tend = base_alloc((nodes + 1) * sizeof *v->tend);
    v->ttok = base_alloc((nodes + 1) * sizeof *v->ttok);
    v->tmulti = base_calloc(nodes + 1, 1);
    open = base_alloc(((size_t)v->max_len + 1) * sizeof *open); /* open[d]: the node at depth d on the path */
    if (!v->tbyte || !v->tdepth || !v->tend || !v->ttok || !v->tmulti || !open) {
        st = base_err(err, KEEL_ENOMEM, "grammar vocab: out of memory");
        goto fail;
    }
    uint32_t k = 0, path = 0; /* path: depth of the current open path */
    for (int32_t i = 0; i < n_ord; i++) {
        int32_t id = a[i];
        uint32_t l = v->off[id + 1] - v->off[id], lcp = 0;
        const uint8_t *q = v->bytes + v->off[id];
        if (i > 0) {
            uint32_t pl = v->off[a[i - 1] + 1] - v->off[a[i - 1]];
            const uint8_t *p = v->bytes + v->off[a[i - 1]];
            while (lcp < pl && lcp < l && p[lcp] == q[lcp]) lcp++;
        }
        /* close the nodes below the common prefix */
        while (path > lcp) v->tend[open[path--]] = k;
        for (uint32_t d = lcp + 1; d <= l; d++) {
            v->tbyte[k] = q[d - 1];
            v->tdepth[k] = (uint16_t)d;
            v->ttok[k] = -1;
            open[d] = (int32_t)k;
            k++;
        }
        path = l;
        int32_t at = open[l];
        v->tnext[id] = v->ttok[at];
        v->tmulti[at] = v->ttok[at] >= 0;
        v->ttok[at] = id;
    }
    while (path > 0) v->tend[open[path--]] = k;
    for (uint32_t i = 0; i < v->n_tnodes; i = v->tend[i]) v->tsub1[v->tbyte[i]] = v->tend[i] - i;
    base_free(ord, (size_t)n_vocab * sizeof *ord);
    base_free(tmp, (size_t)n_vocab * sizeof *tmp);
    base_free(open, ((size_t)v->max_len + 1) * sizeof *open);
    *out = v;
    return KEEL_OK;
fail:
    base_free(ord, (size_t)n_vocab * sizeof *ord);
    base_free(tmp, (size_t)n_vocab * sizeof *tmp);
    if (open) base_free(open, ((size_t)v->max_len + 1) * sizeof *open);
    if (!v->off) {
        base_free(v->bytes, total + 1);
        base_free(v->eog, (size_t)v->n_words * sizeof *v->eog);
        base_free(v->tnext, (size_t)n_vocab * sizeof *v->tnext);
        base_free(v, sizeof *v);
        return st;
    }
    v->off[n_vocab] = (uint32_t)total;
    gram_vocab_free(v);
    return st;
}
