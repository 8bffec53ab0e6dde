/*
 * regex_dfa.c — the automata of regex.h once built: the DFA object,
 * finishing (states that cannot accept merged into the dead state 0,
 * unreachable ones dropped, Hopcroft's partition refinement, identical
 * columns merged into one class), matching, liveness, length ranges,
 * length counters, finite string sets and products. regex.c builds DFAs
 * from patterns on top of this.
 *
 * Invariants of every rx_dfa leaving this file: complete; state 0 dead;
 * surrogates (one interval of their own in every partition) lead to 0;
 * n_states <= RX_MAX_STATES.
 */
#include "regex.h"

#include <stdlib.h>
#include <string.h>

#define SUR_LO  0xD800u
#define SUR_END 0xE000u

/* ---- growable arrays ------------------------------------------------------ */

/* Ensures room for need elements of elsz bytes in *p (capacity *cap). */
bool rx_grow(void *pp, size_t *cap, size_t need, size_t elsz)
{
    void **p = pp;
    if (need <= *cap) return true;
    size_t nc = *cap ? *cap : 16;
    while (nc < need)
        nc *= 2;
    void *q = base_realloc(*p, *cap * elsz, nc * elsz);
    if (!q) return false;
    *p = q;
    *cap = nc;
    return true;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int32_t rx_utf8_next(const unsigned char *s, size_t n, size_t *i)
{
    size_t k = *i;
    uint32_t c = s[k], need, min;
    if (c < 0x80) {
        *i = k + 1;
        return (int32_t)c;
    }
    if (c >= 0xC2 && c <= 0xDF)
        need = 1, c &= 0x1F, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF)
        need = 2, c &= 0x0F, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4)
        need = 3, c &= 0x07, min = 0x10000;
    else
        return -1;
    if (n - k <= need) return -1;
    for (uint32_t j = 1; j <= need; j++) {
        uint32_t b = s[k + j];
        if ((b & 0xC0) != 0x80) return -1;
        c = (c << 6) | (b & 0x3F);
    }
    if (c < min || c > 0x10FFFF || (c >= SUR_LO && c < SUR_END)) return -1;
    *i = k + need + 1;
    return (int32_t)c;
}

/* ---- the DFA object ------------------------------------------------------- */

void rx_free(rx_dfa *d)
{
    if (!d) return;
    base_free(d->iv_lo, (size_t)d->n_iv * sizeof *d->iv_lo);
    base_free(d->iv_cls, (size_t)d->n_iv * sizeof *d->iv_cls);
    base_free(d->next, (size_t)d->n_states * d->n_cls * sizeof *d->next);
    base_free(d->acc, d->n_states);
    base_free(d, sizeof *d);
}

/* A DFA with n_iv intervals, n_cls classes and n_states states, zeroed
 * (every transition to the dead state). */
rx_dfa *rx_dfa_new(uint32_t n_iv, uint32_t n_cls, uint32_t n_states)
{
    rx_dfa *d = base_calloc(1, sizeof *d);
    if (!d) return NULL;
    d->iv_lo = base_calloc(n_iv, sizeof *d->iv_lo);
    d->iv_cls = base_calloc(n_iv, sizeof *d->iv_cls);
    d->next = base_calloc((size_t)n_states * n_cls, sizeof *d->next);
    d->acc = base_calloc(n_states, 1);
    d->n_iv = n_iv;
    d->n_cls = n_cls;
    d->n_states = n_states;
    if (!d->iv_lo || !d->iv_cls || !d->next || !d->acc) {
        rx_free(d);
        return NULL;
    }
    return d;
}

static uint32_t class_of(const rx_dfa *d, uint32_t cp)
{
    uint32_t lo = 0, hi = d->n_iv; /* the last interval with iv_lo <= cp */
    while (hi - lo > 1) {
        uint32_t mid = (lo + hi) / 2;
        if (d->iv_lo[mid] <= cp)
            lo = mid;
        else
            hi = mid;
    }
    return d->iv_cls[lo];
}

bool rx_match(const rx_dfa *d, const char *s, size_t n)
{
    uint32_t q = d->start;
    for (size_t i = 0; i < n && q;) {
        int32_t c = rx_utf8_next((const unsigned char *)s, n, &i);
        if (c < 0) return false;
        q = d->next[(size_t)q * d->n_cls + class_of(d, (uint32_t)c)];
    }
    return d->acc[q];
}

keel_status rx_live(const rx_dfa *d, uint8_t *live)
{
    size_t n = d->n_states, nc = d->n_cls, ne = n * nc;
    memset(live, 0, n);
    for (size_t s = 1; s < n; s++)
        live[s] = d->acc[s];
    /* reverse breadth-first search from the accepting states over the
     * reversed edges (CSR by target) */
    uint32_t *off = base_calloc(n + 1, sizeof *off);
    uint32_t *src = base_alloc((ne ? ne : 1) * sizeof *src);
    uint32_t *queue = base_alloc(n * sizeof *queue);
    keel_status st = KEEL_ENOMEM;
    if (!off || !src || !queue) goto out;
    st = KEEL_OK;
    for (size_t e = 0; e < ne; e++)
        off[d->next[e] + 1]++;
    for (size_t s = 0; s < n; s++)
        off[s + 1] += off[s];
    for (size_t e = 0; e < ne; e++)
        src[off[d->next[e]]++] = (uint32_t)(e / nc);
    for (size_t s = n; s-- > 0;)
        off[s + 1] = off[s];
    off[0] = 0;
    size_t qh = 0, qt = 0;
    for (size_t s = 1; s < n; s++)
        if (live[s]) queue[qt++] = (uint32_t)s;
    while (qh < qt) {
        uint32_t t = queue[qh++];
        for (uint32_t e = off[t]; e < off[t + 1]; e++)
            if (!live[src[e]] && src[e] != 0) {
                live[src[e]] = 1;
                queue[qt++] = src[e];
            }
    }
out:
    base_free(off, (n + 1) * sizeof *off);
    base_free(src, (ne ? ne : 1) * sizeof *src);
    base_free(queue, n * sizeof *queue);
    return st;
}

keel_status rx_len_range(const rx_dfa *d, int64_t *mn, int64_t *mx)
{
    keel_status st = KEEL_ENOMEM;
    size_t n = d->n_states, nc = d->n_cls;
    *mn = 0;
    *mx = 0;
    uint8_t *live = base_alloc(n);
    int64_t *dist = base_alloc(n * sizeof *dist);
    int64_t *lng = base_alloc(n * sizeof *lng);
    uint32_t *queue = base_alloc(n * sizeof *queue);
    uint32_t *indeg = base_calloc(n, sizeof *indeg);
    if (!live || !dist || !lng || !queue || !indeg) goto done;
    st = rx_live(d, live);
    if (st || !live[d->start]) goto done;
    for (size_t s = 0; s < n; s++)
        dist[s] = -1, lng[s] = -1;
    size_t qh = 0, qt = 0;
    dist[d->start] = 0;
    queue[qt++] = d->start;
    while (qh < qt) { /* BFS: shortest accepted length, and reachability */
        uint32_t s = queue[qh++];
        const uint32_t *row = d->next + (size_t)s * nc;
        for (size_t c = 0; c < nc; c++) {
            uint32_t t = row[c];
            if (!live[t]) continue;
            indeg[t]++;
            if (dist[t] < 0) {
                dist[t] = dist[s] + 1;
                queue[qt++] = t;
            }
        }
    }
    *mn = INT64_MAX;
    for (size_t i = 0; i < qt; i++)
        if (d->acc[queue[i]] && dist[queue[i]] < *mn) *mn = dist[queue[i]];
    /* longest: Kahn's order over the reachable live states; a cycle leaves
     * some state unprocessed, and then the length is unbounded */
    size_t done_n = 0;
    qh = qt = 0;
    if (indeg[d->start] == 0) {
        queue[qt++] = d->start;
        lng[d->start] = 0;
    }
    int64_t best = 0;
    while (qh < qt) {
        uint32_t s = queue[qh++];
        done_n++;
        if (d->acc[s] && lng[s] > best) best = lng[s];
        const uint32_t *row = d->next + (size_t)s * nc;
        for (size_t c = 0; c < nc; c++) {
            uint32_t t = row[c];
            if (!live[t] || dist[t] < 0) continue;
            if (lng[s] + 1 > lng[t]) lng[t] = lng[s] + 1;
            if (--indeg[t] == 0) queue[qt++] = t;
        }
    }
    size_t reach = 0;
    for (size_t s = 0; s < n; s++)
        reach += live[s] && dist[s] >= 0;
    *mx = done_n == reach ? best : -1;
done:
    base_free(live, n);
    base_free(dist, n * sizeof *dist);
    base_free(lng, n * sizeof *lng);
    base_free(queue, n * sizeof *queue);
    base_free(indeg, n * sizeof *indeg);
    return st;
}

/* ---- finishing: prune, minimize, merge classes ---------------------------- */

/* Merges identical columns into one class, then adjacent intervals of one
 * class into one interval. */
static keel_status compress_classes(rx_dfa *d)
{
    size_t n = d->n_states, nc = d->n_cls;
    uint32_t *map = base_alloc(nc * sizeof *map);
    uint32_t *rep = base_alloc(nc * sizeof *rep); /* new class -> an old one */
    uint32_t *hash = base_alloc(nc * 2 * sizeof *hash);
    if (!map || !rep || !hash) {
        base_free(map, nc * sizeof *map);
        base_free(rep, nc * sizeof *rep);
        base_free(hash, nc * 2 * sizeof *hash);
        return KEEL_ENOMEM;
    }
    for (size_t i = 0; i < nc * 2; i++)
        hash[i] = UINT32_MAX;
    uint32_t m = 0;
    for (size_t c = 0; c < nc; c++) {
        uint64_t h = 1469598103934665603ull;
        for (size_t s = 0; s < n; s++)
            h = (h ^ d->next[s * nc + c]) * 1099511628211ull;
        size_t at = (size_t)(h % (nc * 2));
        for (;; at = (at + 1) % (nc * 2)) {
            if (hash[at] == UINT32_MAX) {
                hash[at] = (uint32_t)c;
                rep[m] = (uint32_t)c;
                map[c] = m++;
                break;
            }
            size_t o = hash[at];
            size_t s = 0;
            while (s < n && d->next[s * nc + o] == d->next[s * nc + c])
                s++;
            if (s == n) {
                map[c] = map[o];
                break;
            }
        }
    }
    keel_status st = KEEL_OK;
    if (m < nc) {
        uint32_t *nx = base_alloc(n * m * sizeof *nx);
        if (!nx) {
            st = KEEL_ENOMEM;
            goto out;
        }
        for (size_t s = 0; s < n; s++)
            for (size_t c = 0; c < m; c++)
                nx[s * m + c] = d->next[s * nc + rep[c]];
        base_free(d->next, n * nc * sizeof *d->next);
        d->next = nx;
        d->n_cls = m;
    }
    uint32_t k = 0;
    for (uint32_t i = 0; i < d->n_iv; i++) {
        uint32_t c = map[d->iv_cls[i]];
        if (k > 0 && d->iv_cls[k - 1] == c) continue;
        d->iv_lo[k] = d->iv_lo[i];
        d->iv_cls[k++] = c;
    }
    if (k < d->n_iv) {
        uint32_t *a = base_alloc(k * sizeof *a), *b = base_alloc(k * sizeof *b);
        if (!a || !b) {
            base_free(a, k * sizeof *a);
            base_free(b, k * sizeof *b);
            st = KEEL_ENOMEM;
            goto out;
        }
        memcpy(a, d->iv_lo, k * sizeof *a);
        memcpy(b, d->iv_cls, k * sizeof *b);
        base_free(d->iv_lo, d->n_iv * sizeof *a);
        base_free(d->iv_cls, d->n_iv * sizeof *b);
        d->iv_lo = a;
        d->iv_cls = b;
        d->n_iv = k;
    }
out:
    base_free(map, nc * sizeof *map);
    base_free(rep, nc * sizeof *rep);
    base_free(hash, nc * 2 * sizeof *hash);
    return st;
}

/* Rebuilds d with its states renumbered by blk (blk[0] must be 0;
 * nb blocks; states of one block are equivalent). */
static keel_status quotient(rx_dfa *d, const uint32_t *blk, uint32_t nb)
{
    size_t nc = d->n_cls;
    uint32_t *nx = base_calloc((size_t)nb * nc, sizeof *nx);
    uint8_t *acc = base_calloc(nb, 1);
    if (!nx || !acc) {
        base_free(nx, (size_t)nb * nc * sizeof *nx);
        base_free(acc, nb);
        return KEEL_ENOMEM;
    }
    for (size_t s = 0; s < d->n_states; s++) {
        if (blk[s] == UINT32_MAX) continue;
        for (size_t c = 0; c < nc; c++) {
            uint32_t t = d->next[s * nc + c];
            nx[(size_t)blk[s] * nc + c] = blk[t] == UINT32_MAX ? 0 : blk[t];
        }
        acc[blk[s]] = d->acc[s];
    }
    d->start = blk[d->start] == UINT32_MAX ? 0 : blk[d->start];
    base_free(d->next, d->n_states * nc * sizeof *d->next);
    base_free(d->acc, d->n_states);
    d->next = nx;
    d->acc = acc;
    d->n_states = nb;
    return KEEL_OK;
}

/* Dead states (cannot accept) become 0, unreachable ones are dropped; the
 * rest are numbered 1.. in breadth-first order from the start. */
static keel_status prune(rx_dfa *d)
{
    size_t n = d->n_states, nc = d->n_cls;
    uint8_t *live = base_alloc(n);
    uint32_t *blk = base_alloc(n * sizeof *blk);
    uint32_t *queue = base_alloc(n * sizeof *queue);
    keel_status st = KEEL_ENOMEM;
    if (!live || !blk || !queue) goto out;
    st = rx_live(d, live);
    if (st) goto out;
    for (size_t s = 0; s < n; s++)
        blk[s] = UINT32_MAX;
    blk[0] = 0;
    uint32_t nb = 1, qh = 0, qt = 0;
    if (live[d->start]) {
        blk[d->start] = nb++;
        queue[qt++] = d->start;
    }
    while (qh < qt) {
        uint32_t s = queue[qh++];
        for (size_t c = 0; c < nc; c++) {
            uint32_t t = d->next[(size_t)s * nc + c];
            if (live[t] && blk[t] == UINT32_MAX) {
                blk[t] = nb++;
                queue[qt++] = t;
            }
        }
    }
    st = quotient(d, blk, nb);
out:
    base_free(live, n);
    base_free(blk, n * sizeof *blk);
    base_free(queue, n * sizeof *queue);
    return st;
}

/* Hopcroft's partition refinement: the blocks converge to the
 * Myhill-Nerode classes in O(n k log n) for n states and k classes. The
 * blocks are ranges of elem[] (a permutation of the states); a splitter
 * (block, class) splits every block with some but not all of its states
 * leading into the block on the class. */
static keel_status minimize(rx_dfa *d)
{
    size_t n = d->n_states, k = d->n_cls, nk = n * k;
    keel_status st = KEEL_ENOMEM;
    uint32_t *ioff = base_calloc(nk + 1, sizeof *ioff); /* reversed edges by (class, target) */
    uint32_t *isrc = base_alloc((nk ? nk : 1) * sizeof *isrc);
    uint32_t *elem = base_alloc(n * sizeof *elem), *loc = base_alloc(n * sizeof *loc);
    uint32_t *blk = base_alloc(n * sizeof *blk);
    uint32_t *bfirst = base_alloc(n * sizeof *bfirst), *bend = base_alloc(n * sizeof *bend);
    uint32_t *bmark = base_calloc(n, sizeof *bmark), *touched = base_alloc(n * sizeof *touched);
    uint32_t *acopy = base_alloc(n * sizeof *acopy);
    uint8_t *inwl = base_calloc(nk ? nk : 1, 1); /* (block, class) is waiting */
    uint64_t *wl = base_alloc((nk ? nk : 1) * sizeof *wl);
    if (!ioff || !isrc || !elem || !loc || !blk || !bfirst || !bend || !bmark || !touched ||
        !acopy || !inwl || !wl)
        goto out;
    st = KEEL_OK;
    for (size_t s = 0; s < n; s++)
        for (size_t c = 0; c < k; c++)
            ioff[c * n + d->next[s * k + c] + 1]++;
    for (size_t i = 0; i < nk; i++)
        ioff[i + 1] += ioff[i];
    for (size_t s = 0; s < n; s++)
        for (size_t c = 0; c < k; c++)
            isrc[ioff[c * n + d->next[s * k + c]]++] = (uint32_t)s;
    for (size_t i = nk; i-- > 0;)
        ioff[i + 1] = ioff[i];
    ioff[0] = 0;
    /* blocks 0: rejecting, 1: accepting (when both are there) */
    uint32_t nb = 0, e = 0;
    for (int pass = 0; pass < 2; pass++) {
        uint32_t first = e;
        for (size_t s = 0; s < n; s++)
            if (d->acc[s] == pass) {
                elem[e] = (uint32_t)s;
                loc[s] = e++;
                blk[s] = nb;
            }
        if (e > first) {
            bfirst[nb] = first;
            bend[nb++] = e;
        }
    }
    size_t n_wl = 0;
    uint32_t seed = nb == 2 && bend[1] - bfirst[1] < bend[0] - bfirst[0] ? 1 : 0;
    for (size_t c = 0; c < k && nb == 2; c++) {
        wl[n_wl++] = (uint64_t)seed * k + c;
        inwl[seed * k + c] = 1;
    }
    while (n_wl) {
        uint64_t w = wl[--n_wl];
        uint32_t a = (uint32_t)(w / k), c = (uint32_t)(w % k);
        inwl[w] = 0;
        size_t n_touched = 0;
        /* mark the predecessors on c of the states of block a (copied
         * first: marking reorders elem[] inside blocks, a's included) */
        uint32_t na = bend[a] - bfirst[a];
        memcpy(acopy, elem + bfirst[a], na * sizeof *acopy);
        for (uint32_t i = 0; i < na; i++) {
            uint32_t t = acopy[i];
            for (uint32_t j = ioff[(size_t)c * n + t]; j < ioff[(size_t)c * n + t + 1]; j++) {
                uint32_t s = isrc[j], b = blk[s];
                uint32_t at = bfirst[b] + bmark[b];
                if (loc[s] < at) continue; /* already marked */
                if (bmark[b] == 0) touched[n_touched++] = b;
                /* swap s to the end of the marked prefix */
                uint32_t o = elem[at];
                elem[at] = s;
                elem[loc[s]] = o;
                loc[o] = loc[s];
                loc[s] = at;
                bmark[b]++;
            }
        }
        for (size_t i = 0; i < n_touched; i++) {
            uint32_t b = touched[i], m = bmark[b];
            bmark[b] = 0;
            if (m == bend[b] - bfirst[b]) continue;
            /* the marked prefix becomes block nb */
            uint32_t nbk = nb++;
            bfirst[nbk] = bfirst[b];
            bend[nbk] = bfirst[b] + m;
            bfirst[b] += m;
            for (uint32_t j = bfirst[nbk]; j < bend[nbk]; j++)
                blk[elem[j]] = nbk;
            uint32_t small = bend[nbk] - bfirst[nbk] <= bend[b] - bfirst[b] ? nbk : b;
            for (size_t cc = 0; cc < k; cc++) {
                uint32_t add = inwl[(size_t)b * k + cc] ? nbk : small;
                if (!inwl[(size_t)add * k + cc]) {
                    inwl[(size_t)add * k + cc] = 1;
                    wl[n_wl++] = (uint64_t)add * k + cc;
                }
            }
        }
    }
    if (nb < n) {
        /* renumber so that the dead state's block is 0 */
        uint32_t b0 = blk[0];
        for (size_t s = 0; s < n; s++) {
            if (blk[s] == b0)
                blk[s] = 0;
            else if (blk[s] == 0)
                blk[s] = b0;
        }
        st = quotient(d, blk, nb);
    }
out:
    base_free(ioff, (nk + 1) * sizeof *ioff);
    base_free(isrc, (nk ? nk : 1) * sizeof *isrc);
    base_free(elem, n * sizeof *elem);
    base_free(loc, n * sizeof *loc);
    base_free(blk, n * sizeof *blk);
    base_free(bfirst, n * sizeof *bfirst);
    base_free(bend, n * sizeof *bend);
    base_free(bmark, n * sizeof *bmark);
    base_free(touched, n * sizeof *touched);
    base_free(acopy, n * sizeof *acopy);
    base_free(inwl, nk ? nk : 1);
    base_free(wl, (nk ? nk : 1) * sizeof *wl);
    return st;
}

keel_status rx_finish(rx_dfa *d, const char *what, uint32_t max_states, char *err)
{
    keel_status st = compress_classes(d);
    if (!st) st = prune(d);
    if (!st) st = minimize(d);
    if (!st) st = prune(d); /* the renumbering puts the states in BFS order */
    if (!st) st = compress_classes(d);
    if (st) return base_err(err, st, "%s: out of memory", what);
    if (d->n_states > max_states)
        return base_err(err, KEEL_ERANGE, "%s is too complex (more than %u automaton states)", what,
                        max_states);
    return KEEL_OK;
}

/* ---- counters, string sets, products -------------------------------------- */

keel_status rx_length(int64_t mn, int64_t mx, rx_dfa **out, char *err)
{
    *out = NULL;
    int64_t top = mx >= 0 ? mx : mn;
    if (mn < 0 || top > (int64_t)RX_MAX_RAW - 2)
        return base_err(err, KEEL_ERANGE,
                        "string lengths above %u are not supported with a pattern or format",
                        RX_MAX_RAW - 2);
    /* states 1 + c for c code points read so far; classes 0 (a character)
     * and 1 (a surrogate) */
    rx_dfa *d = rx_dfa_new(3, 2, (uint32_t)top + 2);
    if (!d) return base_err(err, KEEL_ENOMEM, "string lengths: out of memory");
    d->iv_lo[0] = 0, d->iv_cls[0] = 0;
    d->iv_lo[1] = SUR_LO, d->iv_cls[1] = 1;
    d->iv_lo[2] = SUR_END, d->iv_cls[2] = 0;
    for (int64_t c = 0; c <= top; c++) {
        size_t s = (size_t)c + 1;
        d->next[s * 2] = c < top ? (uint32_t)s + 1 : (mx >= 0 ? 0 : (uint32_t)s);
        d->acc[s] = c >= mn;
    }
    d->start = 1;
    *out = d;
    return KEEL_OK;
}

keel_status rx_strings(const char *const *s, const size_t *n, size_t k, rx_dfa **out, char *err)
{
    *out = NULL;
    keel_status st = KEEL_ENOMEM;
    uint32_t *cps = NULL, *bnd = NULL;
    size_t n_cps = 0, cap_cps = 0;
    rx_dfa *d = NULL;
    uint32_t *next = NULL;
    uint8_t *acc = NULL;
    size_t cap_next = 0, cap_acc = 0, n_states = 2;
    for (size_t i = 0; i < k; i++)
        for (size_t j = 0; j < n[i];) {
            int32_t c = rx_utf8_next((const unsigned char *)s[i], n[i], &j);
            if (c < 0) break;
            if (!rx_grow(&cps, &cap_cps, n_cps + 1, sizeof *cps)) goto fail;
            cps[n_cps++] = (uint32_t)c;
        }
    /* one elementary interval per character used, and the gaps */
    bnd = base_alloc((n_cps * 2 + 3) * sizeof *bnd);
    if (!bnd) goto fail;
    size_t nb = 0;
    bnd[nb++] = 0;
    bnd[nb++] = SUR_LO;
    bnd[nb++] = SUR_END;
    for (size_t i = 0; i < n_cps; i++) {
        bnd[nb++] = cps[i];
        if (cps[i] + 1 < RX_CP_END) bnd[nb++] = cps[i] + 1;
    }
    qsort(bnd, nb, sizeof *bnd, cmp_u32);
    size_t m = 0;
    for (size_t i = 0; i < nb; i++)
        if (!m || bnd[i] != bnd[m - 1]) bnd[m++] = bnd[i];
    nb = m;
    if (!rx_grow(&next, &cap_next, 2 * nb, sizeof *next) || !rx_grow(&acc, &cap_acc, 2, 1))
        goto fail;
    memset(next, 0, 2 * nb * sizeof *next);
    acc[0] = acc[1] = 0;
    for (size_t i = 0; i < k; i++) {
        size_t q = 1;
        bool ok = true;
        for (size_t j = 0; j < n[i] && ok;) {
            int32_t c = rx_utf8_next((const unsigned char *)s[i], n[i], &j);
            if (c < 0) {
                ok = false;
                break;
            }
            uint32_t cc = (uint32_t)c;
            size_t col = (size_t)((uint32_t *)bsearch(&cc, bnd, nb, sizeof *bnd, cmp_u32) - bnd);
            if (!next[q * nb + col]) {
                if (n_states >= RX_MAX_RAW) {
                    st = base_err(err, KEEL_ERANGE,
                                  "the list of excluded strings is too complex (more than %u "
                                  "automaton states)",
                                  RX_MAX_RAW);
                    goto out;
                }
                if ((n_states + 1) * nb > RX_MAX_CELLS) {
                    st = base_err(err, KEEL_ERANGE, "the list of excluded strings is too complex");
                    goto out;
                }
                if (!rx_grow(&next, &cap_next, (n_states + 1) * nb, sizeof *next) ||
                    !rx_grow(&acc, &cap_acc, n_states + 1, 1))
                    goto fail;
                memset(next + n_states * nb, 0, nb * sizeof *next);
                acc[n_states] = 0;
                next[q * nb + col] = (uint32_t)n_states++;
            }
            q = next[q * nb + col];
        }
        if (ok) acc[q] = 1;
    }
    d = rx_dfa_new((uint32_t)nb, (uint32_t)nb, (uint32_t)n_states);
    if (!d) goto fail;
    for (size_t i = 0; i < nb; i++)
        d->iv_lo[i] = bnd[i], d->iv_cls[i] = (uint32_t)i;
    memcpy(d->next, next, n_states * nb * sizeof *next);
    memcpy(d->acc, acc, n_states);
    d->start = 1;
    st = rx_finish(d, "the list of excluded strings", RX_MAX_STATES, err);
    if (!st) {
        *out = d;
        d = NULL;
    }
    goto out;
fail:
    st = base_err(err, KEEL_ENOMEM, "excluded strings: out of memory");
out:
    rx_free(d);
    base_free(cps, cap_cps * sizeof *cps);
    base_free(bnd, (n_cps * 2 + 3) * sizeof *bnd);
    base_free(next, cap_next * sizeof *next);
    base_free(acc, cap_acc);
    return st;
}

static uint32_t cls_at(const rx_dfa *d, size_t *i, uint32_t lo)
{
    while (*i + 1 < d->n_iv && d->iv_lo[*i + 1] <= lo)
        (*i)++;
    return d->iv_cls[*i];
}

/* Pairs of states (a << 32 | b) to product states, in insertion order. */
typedef struct pmap {
    uint64_t *pair;
    size_t n, cap_pair;
    uint32_t *hash; /* state + 1 */
    size_t cap_hash;
} pmap;

static size_t pmap_slot(uint64_t k, size_t cap)
{
    /* splitmix64's finalizer: both halves of the pair reach every bit */
    k ^= k >> 30;
    k *= 0xBF58476D1CE4E5B9ull;
    k ^= k >> 27;
    k *= 0x94D049BB133111EBull;
    k ^= k >> 31;
    return (size_t)(k % cap);
}

/* The state of pair k, added when new; -1 no memory, -2 past RX_MAX_PRODUCT_RAW. */
static int64_t pmap_get(pmap *m, uint64_t k)
{
    if ((m->n + 1) * 2 > m->cap_hash) {
        size_t nh = m->cap_hash ? m->cap_hash * 2 : 4096;
        uint32_t *h = base_calloc(nh, sizeof *h);
        if (!h) return -1;
        for (size_t s = 0; s < m->n; s++) {
            size_t at = pmap_slot(m->pair[s], nh);
            while (h[at])
                at = (at + 1) % nh;
            h[at] = (uint32_t)s + 1;
        }
        base_free(m->hash, m->cap_hash * sizeof *m->hash);
        m->hash = h;
        m->cap_hash = nh;
    }
    size_t at = pmap_slot(k, m->cap_hash);
    for (; m->hash[at]; at = (at + 1) % m->cap_hash)
        if (m->pair[m->hash[at] - 1] == k) return m->hash[at] - 1;
    if (m->n >= RX_MAX_PRODUCT_RAW) return -2;
    if (!rx_grow(&m->pair, &m->cap_pair, m->n + 1, sizeof *m->pair)) return -1;
    m->pair[m->n] = k;
    m->hash[at] = (uint32_t)m->n + 1;
    return (int64_t)m->n++;
}

keel_status rx_product(const rx_dfa *a, const rx_dfa *b, int op, rx_dfa **out, char *err)
{
    *out = NULL;
    const char *what = "the combination of string constraints";
    keel_status st = KEEL_ENOMEM;
    uint32_t *lo = NULL, *ivc = NULL, *table = NULL;
    uint64_t *key = NULL, *pk = NULL;
    uint8_t *acc = NULL;
    size_t n_lo = 0, cap_table = 0, cap_acc = 0, n_st = 0;
    pmap pm = {0};
    int64_t s0 = 0;
    rx_dfa *d = NULL;
    /* merged intervals, each with its (class in a, class in b) */
    size_t cap_lo = (size_t)a->n_iv + b->n_iv;
    lo = base_alloc(cap_lo * sizeof *lo);
    ivc = base_alloc(cap_lo * sizeof *ivc);
    key = base_alloc(cap_lo * sizeof *key);
    pk = base_alloc(cap_lo * sizeof *pk);
    if (!lo || !ivc || !key || !pk) goto fail;
    for (size_t i = 0, j = 0; i < a->n_iv || j < b->n_iv;) {
        uint32_t x = i < a->n_iv ? a->iv_lo[i] : RX_CP_END,
                 y = j < b->n_iv ? b->iv_lo[j] : RX_CP_END;
        uint32_t v = x < y ? x : y;
        if (x == v) i++;
        if (y == v) j++;
        lo[n_lo++] = v;
    }
    size_t ia = 0, ib = 0;
    for (size_t i = 0; i < n_lo; i++) {
        key[i] = ((uint64_t)cls_at(a, &ia, lo[i]) << 32) | cls_at(b, &ib, lo[i]);
        pk[i] = key[i];
    }
    qsort(pk, n_lo, sizeof *pk, cmp_u64);
    size_t nc = 0;
    for (size_t i = 0; i < n_lo; i++)
        if (!nc || pk[i] != pk[nc - 1]) pk[nc++] = pk[i];
    for (size_t i = 0; i < n_lo; i++)
        ivc[i] = (uint32_t)((uint64_t *)bsearch(&key[i], pk, nc, sizeof *pk, cmp_u64) - pk);
    /* breadth-first over the reachable pairs; pair (0, 0) is state 0 */
    if (pmap_get(&pm, 0) < 0) goto fail;
    uint32_t a0 = a->start, b0 = b->start;
    if (!((op == RX_AND && (!a0 || !b0)) || (op == RX_ANDNOT && !a0))) {
        s0 = pmap_get(&pm, ((uint64_t)a0 << 32) | b0);
        if (s0 < 0) goto fail;
    }
    for (size_t q = 0; q < pm.n; q++) {
        if ((q + 1) * nc > RX_MAX_CELLS) goto too_big;
        if (!rx_grow(&table, &cap_table, (q + 1) * nc, sizeof *table) ||
            !rx_grow(&acc, &cap_acc, q + 1, 1))
            goto fail;
        uint32_t sa = (uint32_t)(pm.pair[q] >> 32), sb = (uint32_t)pm.pair[q];
        bool xa = a->acc[sa], xb = b->acc[sb];
        acc[q] = op == RX_AND ? xa && xb : op == RX_OR ? xa || xb : xa && !xb;
        for (size_t c = 0; c < nc; c++) {
            uint32_t ta = a->next[(size_t)sa * a->n_cls + (uint32_t)(pk[c] >> 32)];
            uint32_t tb = b->next[(size_t)sb * b->n_cls + (uint32_t)pk[c]];
            uint64_t pr = ((uint64_t)ta << 32) | tb;
            if ((op == RX_AND && (!ta || !tb)) || (op == RX_ANDNOT && !ta)) pr = 0;
            int64_t id = pmap_get(&pm, pr);
            if (id == -1) goto fail;
            if (id == -2) goto too_big;
            table[q * nc + c] = (uint32_t)id;
        }
    }
    n_st = pm.n;
    d = rx_dfa_new((uint32_t)n_lo, (uint32_t)nc, (uint32_t)n_st);
    if (!d) goto fail;
    memcpy(d->iv_lo, lo, n_lo * sizeof *lo);
    memcpy(d->iv_cls, ivc, n_lo * sizeof *ivc);
    memcpy(d->next, table, n_st * nc * sizeof *table);
    memcpy(d->acc, acc, n_st);
    d->start = (uint32_t)s0;
    st = rx_finish(d, what, RX_MAX_PRODUCT, err);
    if (!st) {
        *out = d;
        d = NULL;
    }
    goto out;
too_big:
    st = base_err(err, KEEL_ERANGE, "%s is too complex (more than %u automaton states)", what,
                  RX_MAX_PRODUCT);
    goto out;
fail:
    st = base_err(err, KEEL_ENOMEM, "%s: out of memory", what);
out:
    rx_free(d);
    base_free(lo, cap_lo * sizeof *lo);
    base_free(ivc, cap_lo * sizeof *ivc);
    base_free(key, cap_lo * sizeof *key);
    base_free(pk, cap_lo * sizeof *pk);
    base_free(table, cap_table * sizeof *table);
    base_free(pm.pair, pm.cap_pair * sizeof *pm.pair);
    base_free(pm.hash, pm.cap_hash * sizeof *pm.hash);
    base_free(acc, cap_acc);
    return st;
}
