/*
 * session_load.c — loading a session blob (session.c writes it): parse and
 * check the whole blob (bounds, hashes, descriptors, room, the recurrent half
 * against the tables) before the memory changes (rule 6), then commit.
 */
#include "session_fmt.h"

#include <math.h>
#include <string.h>

/* ---- loading ------------------------------------------------------------------ */

typedef struct sect {
    uint32_t type;
    rd body;
} sect;

#define SESS_MAX_SECTIONS 64

typedef struct parsed {
    int32_t seq;
    uint64_t n_ranks;
    sect s[SESS_MAX_SECTIONS];
    int32_t n;
} parsed;

static keel_status parse_blob(keel_mem *m, const uint8_t *p, size_t len, uint64_t fingerprint, parsed *out)
{
    rd r = {p, p + len, false};
    const uint8_t *magic = take(&r, 8);
    if (!magic || memcmp(magic, SESS_MAGIC, 8) != 0)
        return base_err(m->err, KEEL_EFORMAT, "load: not a keel session (bad magic)");
    uint32_t ver = get_u32(&r), hb = get_u32(&r);
    uint64_t fp = get_u64(&r);
    out->seq = get_i32(&r);
    uint32_t n_sec = get_u32(&r);
    out->n_ranks = get_u64(&r);
    uint64_t hh = get_u64(&r);
    if (r.bad) return base_err(m->err, KEEL_EFORMAT, "load: truncated header");
    if (hh != base_hash64(p, 40, 0x5e55)) return base_err(m->err, KEEL_EFORMAT, "load: header checksum mismatch (corrupted)");
    if (ver != SESS_VERSION || hb != SESS_HEADER_BYTES)
        return base_err(m->err, KEEL_EFORMAT, "load: session version %u (this build reads %u)", ver, SESS_VERSION);
    if (fingerprint && fp != fingerprint)
        return base_err(m->err, KEEL_EINVAL, "load: the session was saved with another model (fingerprint %016llx, this one %016llx)",
                        (unsigned long long)fp, (unsigned long long)fingerprint);
    if (n_sec > SESS_MAX_SECTIONS) return base_err(m->err, KEEL_EFORMAT, "load: %u sections", n_sec);
    out->n = 0;
    for (uint32_t i = 0; i < n_sec; i++) {
        uint32_t type = get_u32(&r), reserved = get_u32(&r);
        uint64_t slen = get_u64(&r), h = get_u64(&r);
        if (r.bad) return base_err(m->err, KEEL_EFORMAT, "load: truncated section %u header", i);
        if (reserved != 0 || type < SEC_DESC || type > SEC_CKPT)
            return base_err(m->err, KEEL_EFORMAT, "load: section %u: type %u (reserved %u)", i, type, reserved);
        if (slen > (uint64_t)(r.end - r.p))
            return base_err(m->err, KEEL_EFORMAT, "load: section %u: %llu bytes, %zu left (truncated file?)", i,
                            (unsigned long long)slen, (size_t)(r.end - r.p));
        const uint8_t *body = take(&r, (size_t)slen);
        if (base_hash64(body, (size_t)slen, 0x5e55) != h)
            return base_err(m->err, KEEL_EFORMAT, "load: section %u (type %u): checksum mismatch (corrupted)", i, type);
        out->s[out->n].type = type;
        out->s[out->n].body = (rd){body, body + slen, false};
        out->n++;
    }
    if (r.p != r.end) return base_err(m->err, KEEL_EFORMAT, "load: %zu trailing bytes", (size_t)(r.end - r.p));
    return KEEL_OK;
}

static const sect *find(const parsed *ps, uint32_t type, int32_t nth)
{
    for (int32_t i = 0; i < ps->n; i++)
        if (ps->s[i].type == type && nth-- == 0) return &ps->s[i];
    return NULL;
}

static bool rope_same(rd *r, const keel_rope *a)
{
    bool ok = get_i32(r) == (int32_t)a->type && get_i32(r) == a->n_rot;
    float f[6] = {a->freq_base, a->freq_scale, a->ext_factor, a->attn_factor, a->beta_fast, a->beta_slow};
    for (int i = 0; i < 6; i++) {
        float g = get_f32(r);
        ok = ok && memcmp(&g, &f[i], 4) == 0;
    }
    ok = ok && get_i32(r) == a->n_ctx_orig;
    int32_t half = get_i32(r);
    int32_t want = a->freq_factors ? a->n_rot / 2 : 0;
    if (half != want || half < 0 || half > 4096) return false;
    for (int32_t i = 0; i < half; i++) {
        float g = get_f32(r);
        ok = ok && memcmp(&g, &a->freq_factors[i], 4) == 0;
    }
    return ok && !r->bad;
}

static const char *dname(int32_t t)
{
    const char *n = keel_dtype_name((keel_dtype)t);
    return n ? n : "?";
}

/* A stored column this memory can re-encode into its own (KEEL_SESSION_CONVERT). */
static bool readable(const sess_col *c)
{
    if (!tensor_dtype_valid(c->dtype) || keel_dtype_block_size(c->dtype) < 1 ||
        c->head_dim % keel_dtype_block_size(c->dtype))
        return false;
    if (c->dtype != KEEL_DTYPE_F32 && c->dtype != KEEL_DTYPE_F16 && c->dtype != KEEL_DTYPE_BF16 &&
        c->dtype != KEEL_DTYPE_Q8_0 && c->dtype != KEEL_DTYPE_Q4_0 && c->dtype != KEEL_DTYPE_Q4_1 &&
        c->dtype != KEEL_DTYPE_Q5_0 && c->dtype != KEEL_DTYPE_Q5_1)
        return false;
    int32_t b = c->rot_block;
    return !c->rot || (b >= 32 && b <= 512 && !(b & (b - 1)) && c->head_dim % b == 0);
}

static const char *col_name(mem_col_kind k)
{
    return k == MEM_COL_K ? "K" : k == MEM_COL_V ? "V" : "indexer";
}

/* One column's stored rotation (DESC) against this memory's column c of
 * stored dtype dt: the same, or (with convert) readable; fills sc. */
static keel_status read_col(keel_mem *m, rd *r, int32_t i, const mem_col *c, int32_t dt, bool convert, sess_col *sc)
{
    uint32_t en = get_u32(r);
    int32_t blk = get_i32(r);
    uint64_t seed = get_u64(r);
    if (r->bad) return base_err(m->err, KEEL_EFORMAT, "load: truncated descriptor of layer %d", i);
    bool same_rot = en == (uint32_t)c->rot.enabled && (!en || (blk == c->rot.block && seed == c->rot.seed));
    if (!convert && !same_rot)
        return base_err(m->err, KEEL_EUNSUPPORTED,
                        "load: layer %d %s: rotation %s (block %d, seed %llu) in the session, %s (block %d, "
                        "seed %llu) here",
                        i, col_name(c->kind), en ? "on" : "off", blk, (unsigned long long)seed,
                        c->rot.enabled ? "on" : "off", c->rot.block, (unsigned long long)c->rot.seed);
    sc->dtype = (keel_dtype)dt;
    sc->head_dim = c->head_dim;
    sc->n_heads = c->n_heads;
    sc->rot = en != 0;
    sc->rot_block = blk;
    sc->rot_seed = seed;
    if (en > 1 || !readable(sc))
        return base_err(m->err, KEEL_EFORMAT, "load: layer %d %s: stored as %s (rotation %s, block %d): not readable",
                        i, col_name(c->kind), dname(dt), en ? "on" : "off", blk);
    sc->row_bytes = tensor_row_bytes(sc->dtype, sc->head_dim);
    sc->same = same_rot && sc->dtype == c->dtype;
    return KEEL_OK;
}

/* DESC against this memory: the same layers stored the same way, or (with
 * convert) other dtypes / rotation that can be re-encoded. cols receives the
 * stored descriptors at 3 * layer + kind (K, V, IDX). */
static keel_status check_desc(keel_mem *m, const sect *d, bool whole, bool convert, sess_col *cols)
{
    rd r = d->body;
    int32_t nl = get_i32(&r), nseq = get_i32(&r);
    uint32_t unified = get_u32(&r);
    if (r.bad) return base_err(m->err, KEEL_EFORMAT, "load: truncated descriptor");
    if (nl != m->cfg.n_layers)
        return base_err(m->err, KEEL_EINVAL, "load: the session has %d layers, this memory %d", nl, m->cfg.n_layers);
    if (nseq < 1 || unified > 1) return base_err(m->err, KEEL_EFORMAT, "load: descriptor header");
    /* a whole memory's sequence sets are as wide as n_seq_max */
    if (whole && (nseq != m->cfg.n_seq_max || unified != (uint32_t)m->cfg.unified))
        return base_err(m->err, KEEL_EINVAL, "load: the session is of a memory with %d sequences (%s), this one %d (%s)",
                        nseq, unified ? "unified" : "split", m->cfg.n_seq_max, m->cfg.unified ? "unified" : "split");
    for (int32_t i = 0; i < nl; i++) {
        const keel_mem_layer *l = &m->layers[i];
        int32_t kind = get_i32(&r);
        if (kind != (int32_t)l->kind)
            return base_err(m->err, KEEL_EINVAL, "load: layer %d is kind %d in the session, %d here", i, kind, (int)l->kind);
        if (l->kind == KEEL_MEM_LAYER_NONE) continue;
        if (l->kind == KEEL_MEM_LAYER_RECURRENT) {
            int32_t ck = get_i32(&r), cc = get_i32(&r);
            uint64_t sf = get_u64(&r);
            if (r.bad) return base_err(m->err, KEEL_EFORMAT, "load: truncated descriptor of layer %d", i);
            if (ck != l->rs.conv_kernel || cc != l->rs.conv_channels || sf != (uint64_t)l->rs.state_floats)
                return base_err(m->err, KEEL_EINVAL,
                                "load: layer %d: recurrent state conv %d x %d, %llu state floats in the session, "
                                "conv %d x %d, %lld here",
                                i, ck, cc, (unsigned long long)sf, l->rs.conv_kernel, l->rs.conv_channels,
                                (long long)l->rs.state_floats);
            continue;
        }
        const mem_table *t = &m->groups[m->layer_group[i]].tables[0];
        const mem_col *kc = &t->cols[m->layer_col[i]], *vc = kc + 1;
        int32_t window = get_i32(&r), sinks = get_i32(&r), heads = get_i32(&r), dk = get_i32(&r), dv = get_i32(&r);
        int32_t kt = get_i32(&r), vt = get_i32(&r);
        if (r.bad) return base_err(m->err, KEEL_EFORMAT, "load: truncated descriptor of layer %d", i);
        if (window != (l->kind == KEEL_MEM_LAYER_SLIDING ? l->window : 0) ||
            sinks != (l->kind == KEEL_MEM_LAYER_SLIDING ? l->n_sink : 0))
            return base_err(m->err, KEEL_EINVAL, "load: layer %d: sliding window %d/%d sinks in the session, %d/%d here", i,
                            window, sinks, l->window, l->n_sink);
        if (heads != kc->n_heads || dk != kc->head_dim || dv != vc->head_dim)
            return base_err(m->err, KEEL_EINVAL, "load: layer %d: %d heads of %d/%d in the session, %d of %d/%d here", i,
                            heads, dk, dv, kc->n_heads, kc->head_dim, vc->head_dim);
        if (!convert && (kt != (int32_t)kc->dtype || vt != (int32_t)vc->dtype))
            return base_err(m->err, KEEL_EUNSUPPORTED,
                            "load: layer %d: the session stores K %s / V %s, this cache K %s / V %s (re-encoding is "
                            "not done implicitly: convert on request)",
                            i, dname(kt), dname(vt), dname((int32_t)kc->dtype), dname((int32_t)vc->dtype));
        keel_status st;
        if ((st = read_col(m, &r, i, kc, kt, convert, &cols[3 * i + MEM_COL_K])) != KEEL_OK ||
            (st = read_col(m, &r, i, vc, vt, convert, &cols[3 * i + MEM_COL_V])) != KEEL_OK)
            return st;
        if (!rope_same(&r, &kc->rope))
            return base_err(m->err, KEEL_EINVAL, "load: layer %d: the session's keys carry other RoPE parameters", i);
        /* the indexer column: present on both sides or on neither */
        uint32_t idx = get_u32(&r);
        bool here = mem_layer_n_cols(l) == 3;
        if (r.bad) return base_err(m->err, KEEL_EFORMAT, "load: truncated descriptor of layer %d", i);
        if (idx > 1 || (idx == 1) != here)
            return base_err(m->err, idx > 1 ? KEEL_EFORMAT : KEEL_EINVAL,
                            "load: layer %d: %s indexer column in the session, %s here", i,
                            idx == 1 ? "an" : idx == 0 ? "no" : "a bad", here ? "one" : "none");
        if (!here) continue;
        const mem_col *ic = kc + MEM_COL_IDX;
        int32_t di = get_i32(&r), it = get_i32(&r);
        if (r.bad) return base_err(m->err, KEEL_EFORMAT, "load: truncated descriptor of layer %d", i);
        if (di != ic->head_dim)
            return base_err(m->err, KEEL_EINVAL, "load: layer %d: indexer keys of %d dims in the session, %d here", i,
                            di, ic->head_dim);
        if (!convert && it != (int32_t)ic->dtype)
            return base_err(m->err, KEEL_EUNSUPPORTED,
                            "load: layer %d: the session stores indexer keys as %s, this cache as %s (re-encoding "
                            "is not done implicitly: convert on request)",
                            i, dname(it), dname((int32_t)ic->dtype));
        if ((st = read_col(m, &r, i, ic, it, convert, &cols[3 * i + MEM_COL_IDX])) != KEEL_OK) return st;
        if (!rope_same(&r, &ic->rope))
            return base_err(m->err, KEEL_EINVAL,
                            "load: layer %d: the session's indexer keys carry other RoPE parameters", i);
    }
    if (r.p != r.end) return base_err(m->err, KEEL_EFORMAT, "load: descriptor has trailing bytes");
    return KEEL_OK;
}

/* A GROUP section's header and sizes, checked. */
typedef struct grp_view {
    int32_t group, n_cells;
    rd meta;       /* n_cells x (pos, rank, flags[, seq words]) */
    rd rows;       /* every column's rows */
    size_t meta_bytes;
} grp_view;

static keel_status view_group(keel_mem *m, const parsed *ps, int32_t g, const sess_col *cols, grp_view *v)
{
    const sect *s = find(ps, SEC_GROUP, g);
    if (!s) return base_err(m->err, KEEL_EFORMAT, "load: group %d missing", g);
    rd r = s->body;
    v->group = get_i32(&r);
    v->n_cells = get_i32(&r);
    if (r.bad || v->group != g || v->n_cells < 0)
        return base_err(m->err, KEEL_EFORMAT, "load: group %d header", g);
    const mem_group *grp = &m->groups[g];
    int64_t cap_all = (int64_t)grp->tables[0].cap * grp->n_tables;
    if (v->n_cells > cap_all)
        return base_err(m->err, KEEL_EFULL, "load: group %d: %d cells, the tables hold %lld", g, v->n_cells,
                        (long long)cap_all);
    int32_t words = grp->tables[0].seq_words;
    size_t per = 12 + (ps->seq < 0 ? (size_t)words * 8 : 0);
    v->meta_bytes = per * (size_t)v->n_cells;
    size_t row_bytes = 0;
    for (int32_t ci = 0; ci < grp->tables[0].n_cols; ci++) {
        const mem_col *mc = &grp->tables[0].cols[ci];
        const sess_col *sc = &cols[3 * mc->layer + mc->kind];
        row_bytes += sc->row_bytes * (size_t)sc->n_heads;
    }
    size_t rows_bytes;
    if (!size_mul(row_bytes, (size_t)v->n_cells, &rows_bytes) || v->meta_bytes + rows_bytes != (size_t)(r.end - r.p))
        return base_err(m->err, KEEL_EFORMAT, "load: group %d: %zu bytes for %d cells, expected %zu", g,
                        (size_t)(r.end - r.p), v->n_cells, v->meta_bytes + rows_bytes);
    v->meta = (rd){r.p, r.p + v->meta_bytes, false};
    v->rows = (rd){r.p + v->meta_bytes, r.end, false};
    return KEEL_OK;
}

/* Re-encodes one stored head row (stored descriptor sc) into this memory's
 * column: decode, undo the stored rotation, then the column's own encode. */
static void convert_row(const sess_col *sc, const uint8_t *src, const mem_col *col, uint8_t *dst, float *x,
                        float *signs)
{
    tensor_dequantize_row_unchecked(sc->dtype, src, x, sc->head_dim);
    if (sc->rot) {
        const float *sg = NULL;
        if (sc->rot_seed) {
            tensor_wht_signs(sc->rot_seed, sc->rot_block, signs);
            sg = signs;
        }
        for (int32_t o = 0; o < sc->head_dim; o += sc->rot_block) tensor_wht_inverse(x + o, sc->rot_block, sg);
    }
    mem_col_encode(col, x, dst);
}

/* ---- the tables against each other, the recurrent half ------------------------------------------------------ */

static void sort_u64(uint64_t *a, int32_t n)
{
    /* heap sort: allocates nothing */
    for (int32_t start = n / 2 - 1, end = n;; ) {
        int32_t root;
        if (start >= 0) {
            root = start--;
        } else {
            if (--end <= 0) return;
            uint64_t t = a[0];
            a[0] = a[end];
            a[end] = t;
            root = 0;
        }
        for (int32_t child; (child = 2 * root + 1) < end; root = child) {
            if (child + 1 < end && a[child + 1] > a[child]) child++;
            if (a[root] >= a[child]) break;
            uint64_t t = a[root];
            a[root] = a[child];
            a[child] = t;
        }
    }
}


/* Cell i of a GROUP view: position and rank; whether sequence s holds it
 * (whole-memory blobs carry sequence sets, a sequence's blob holds one). */
static size_t meta_per(const keel_mem *m, int32_t g, bool whole)
{
    return 12 + (whole ? (size_t)m->groups[g].tables[0].seq_words * 8 : 0);
}

static bool view_cell(const grp_view *v, size_t per, bool whole, int32_t i, int32_t s, int32_t *pos, int32_t *rank)
{
    const uint8_t *p = v->meta.p + per * (size_t)i;
    *pos = rd_i32_at(p);
    *rank = rd_i32_at(p + 4);
    if (!whole) return true;
    uint64_t bits = rd_u64_at(p + 12 + (size_t)(s / 64) * 8);
    return (bits >> (s % 64)) & 1;
}

/* The smallest and largest position sequence s holds in the blob's tables
 * (-1, -1: none), s the blob's sequence index. */
static void view_span_group(const keel_mem *m, const grp_view *gv, int32_t g, bool whole, int32_t s, int32_t *lo,
                            int32_t *hi)
{
    *lo = *hi = -1;
    size_t per = meta_per(m, g, whole);
    for (int32_t i = 0; i < gv[g].n_cells; i++) {
        int32_t pos, rank;
        if (!view_cell(&gv[g], per, whole, i, s, &pos, &rank)) continue;
        if (*lo < 0 || pos < *lo) *lo = pos;
        if (pos > *hi) *hi = pos;
    }
}

static void view_span(const keel_mem *m, const grp_view *gv, bool whole, int32_t s, int32_t *lo, int32_t *hi)
{
    *lo = *hi = -1;
    for (int32_t g = 0; g < m->n_groups; g++) {
        int32_t a, b;
        view_span_group(m, gv, g, whole, s, &a, &b);
        if (b < 0) continue;
        if (*lo < 0 || a < *lo) *lo = a;
        *hi = BASE_MAX(*hi, b);
    }
}

static bool view_has(const keel_mem *m, const grp_view *gv, int32_t g, bool whole, int32_t s, int32_t pos,
                     int32_t rank)
{
    size_t per = meta_per(m, g, whole);
    for (int32_t i = 0; i < gv[g].n_cells; i++) {
        int32_t p, r;
        if (view_cell(&gv[g], per, whole, i, s, &p, &r) && p == pos && r == rank) return true;
    }
    return false;
}

/* The (position, rank) keys of the cells of blob sequence s in group g,
 * sorted, into keys; returns how many. */
static int32_t view_keys(const keel_mem *m, const grp_view *gv, int32_t g, bool whole, int32_t s, uint64_t *keys)
{
    size_t per = meta_per(m, g, whole);
    int32_t n = 0;
    for (int32_t i = 0; i < gv[g].n_cells; i++) {
        int32_t pos, rank;
        if (view_cell(&gv[g], per, whole, i, s, &pos, &rank)) keys[n++] = (uint64_t)(uint32_t)pos << 32 | (uint32_t)rank;
    }
    sort_u64(keys, n);
    return n;
}

/* What keel_mem_check requires of the groups of one sequence never
 * compacted (check.c, T4 and T5): every full group holds it up to at least
 * the last position any group holds, and each ring's (position, stamp)
 * multiset lies within the first full group's. kf, kr: room for the
 * largest group's cells. */
static keel_status check_cross(keel_mem *m, const grp_view *gv, bool whole, int32_t s, uint64_t *kf, uint64_t *kr)
{
    int32_t gf = -1, hi_any = -1;
    for (int32_t g = 0; g < m->n_groups; g++) {
        int32_t lo, hi;
        view_span_group(m, gv, g, whole, s, &lo, &hi);
        hi_any = BASE_MAX(hi_any, hi);
        if (gf < 0 && m->groups[g].kind == KEEL_MEM_LAYER_FULL) gf = g;
    }
    for (int32_t g = 0; g < m->n_groups; g++) {
        int32_t lo, hi;
        view_span_group(m, gv, g, whole, s, &lo, &hi);
        if (m->groups[g].kind == KEEL_MEM_LAYER_FULL && hi < hi_any)
            return base_err(m->err, KEEL_EFORMAT, "load: sequence %d: full group %d ends at %d, another group at %d", s,
                            g, hi, hi_any);
    }
    if (gf < 0) return KEEL_OK;
    int32_t nf = view_keys(m, gv, gf, whole, s, kf);
    for (int32_t g = 0; g < m->n_groups; g++) {
        if (!m->groups[g].tables[0].sliding) continue;
        int32_t nr = view_keys(m, gv, g, whole, s, kr);
        for (int32_t i = 0, j = 0; i < nr; i++, j++) {
            while (j < nf && kf[j] < kr[i]) j++;
            if (j == nf || kf[j] != kr[i])
                return base_err(m->err, KEEL_EFORMAT,
                                "load: sequence %d: sliding group %d holds a token at position %d that full group %d "
                                "does not",
                                s, g, (int32_t)(kr[i] >> 32), gf);
        }
    }
    return KEEL_OK;
}

static bool floats_finite(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float f;
        memcpy(&f, p + 4 * i, 4);
        if (!isfinite(f)) return false;
    }
    return true;
}

/* Bytes of one ring cell's rows as stored (the session's column types). */
static size_t stored_cell_bytes(const keel_mem *m, int32_t g, const sess_col *cols)
{
    const mem_table *t = &m->groups[g].tables[0];
    size_t b = 0;
    for (int32_t ci = 0; ci < t->n_cols; ci++) {
        const sess_col *sc = &cols[3 * t->cols[ci].layer + t->cols[ci].kind];
        b += sc->row_bytes * (size_t)sc->n_heads;
    }
    return b;
}

typedef struct rs_seq {
    uint32_t kind; /* 0 no state, 1 its own, 2 shared with an earlier sequence */
    int32_t share, lo, hi, rank;
} rs_seq;

/* Reads one sequence's RSTATE entry (bounds only; *floats: its state, or NULL). */
static void get_rs_seq(const keel_mem *m, rd *r, rs_seq *o, const uint8_t **floats)
{
    memset(o, 0, sizeof *o);
    *floats = NULL;
    o->kind = get_u32(r);
    if (o->kind == 0) return;
    o->share = get_i32(r);
    o->lo = get_i32(r);
    o->hi = get_i32(r);
    o->rank = get_i32(r);
    if (o->kind == 1) *floats = take(r, m->rs_slot_floats * sizeof(float));
}

static keel_status read_rs_seq(keel_mem *m, rd *r, int32_t i, uint64_t n_ranks, const rs_seq *prev, rs_seq *o)
{
    const uint8_t *f;
    get_rs_seq(m, r, o, &f);
    if (r->bad) return base_err(m->err, KEEL_EFORMAT, "load: sequence %d: truncated recurrent state", i);
    if (o->kind == 0) return KEEL_OK;
    if (o->kind > (m->n_rs_layers > 0 ? 2u : 1u) || o->lo < 0 || o->hi < o->lo || o->hi == INT32_MAX || o->rank < 0 ||
        (uint64_t)o->rank >= n_ranks || (o->kind == 1 && o->share != -1) ||
        (o->kind == 2 && (o->share < 0 || o->share >= i || prev[o->share].kind == 0)))
        return base_err(m->err, KEEL_EFORMAT, "load: sequence %d: recurrent state header (kind %u, shares %d, span %d..%d)",
                        i, o->kind, o->share, o->lo, o->hi);
    if (o->kind == 1 && !floats_finite(f, m->rs_slot_floats))
        return base_err(m->err, KEEL_EFORMAT, "load: sequence %d: non-finite recurrent state", i);
    return KEEL_OK;
}

/* One stored checkpoint: header checked against its sequence, the state
 * and ring cells checked (positions, ranks, finite rows); r is advanced
 * past it. *ord receives its take-order rank. */
static keel_status read_ckpt(keel_mem *m, rd *r, const grp_view *gv, const sess_col *cols, bool whole, int32_t i,
                             const rs_seq *q, int32_t exact, uint64_t n_ranks, int32_t *ord)
{
    int32_t pos = get_i32(r), pos_min = get_i32(r), rank = get_i32(r);
    *ord = get_i32(r);
    /* (an attention memory's rings forget its first positions: the span
     * start it was taken at is not checked) */
    bool rs = m->n_rs_layers > 0;
    int32_t gf = -1;
    for (int32_t g = 0; g < m->n_groups && gf < 0; g++)
        if (m->groups[g].kind == KEEL_MEM_LAYER_FULL) gf = g;
    if (r->bad || (rs && (pos_min != q->lo || pos <= q->lo)) || pos < 1 || pos_min < 0 ||
        ((rs || gf >= 0) && pos > q->hi + 1) || rank < 0 || (uint64_t)rank >= n_ranks || *ord < 0)
        return base_err(m->err, KEEL_EFORMAT, "load: sequence %d: checkpoint at %d (from %d) of span %d..%d", i, pos,
                        pos_min, q->lo, q->hi);
    const uint8_t *f = take(r, m->rs_slot_floats * sizeof(float));
    if (!f || !floats_finite(f, m->rs_slot_floats))
        return base_err(m->err, KEEL_EFORMAT, "load: sequence %d: checkpoint at %d: bad state", i, pos);
    /* R3: the token it was taken after is in the (first) full table */
    if (gf >= 0 && (rs || exact == 0) && !view_has(m, gv, gf, whole, i, pos - 1, rank))
        return base_err(m->err, KEEL_EFORMAT, "load: sequence %d: checkpoint at %d: its last token is not at %d", i,
                        pos, pos - 1);
    for (int32_t g = 0; g < m->n_groups; g++) {
        const mem_table *t = &m->groups[g].tables[0];
        if (!t->sliding) continue;
        int32_t nr = get_i32(r), forgot = get_i32(r);
        if (r->bad || nr < 0 || nr > m->ckpt_ring[g].max || (forgot != MEM_NO_EVICT && forgot < -INT32_MAX / 2))
            return base_err(m->err, KEEL_EFORMAT, "load: sequence %d: checkpoint at %d: %d ring cells in group %d", i,
                            pos, nr, g);
        for (int32_t j = 0; j < nr; j++) {
            int32_t p = get_i32(r), rk = get_i32(r);
            uint32_t fl = get_u32(r);
            if (r->bad || p < 0 || p >= pos || rk < 0 || (uint64_t)rk >= n_ranks || fl > 0xff)
                return base_err(m->err, KEEL_EFORMAT, "load: sequence %d: checkpoint at %d: ring cell %d", i, pos, j);
        }
        size_t cb = stored_cell_bytes(m, g, cols);
        const uint8_t *rows = take(r, (size_t)nr * cb);
        if (!rows) return base_err(m->err, KEEL_EFORMAT, "load: sequence %d: checkpoint at %d: truncated rows", i, pos);
        for (int32_t j = 0; j < nr; j++)
            for (int32_t ci = 0; ci < t->n_cols; ci++) {
                const sess_col *sc = &cols[3 * t->cols[ci].layer + t->cols[ci].kind];
                for (int32_t h = 0; h < sc->n_heads; h++, rows += sc->row_bytes)
                    if (!tensor_row_finite(sc->dtype, rows, sc->head_dim))
                        return base_err(m->err, KEEL_EFORMAT, "load: sequence %d: checkpoint at %d: non-finite ring row",
                                        i, pos);
            }
    }
    return KEEL_OK;
}

/* RSTATE and CKPT against the blob's tables and this memory's room. */
static keel_status check_rs(keel_mem *m, const parsed *ps, const grp_view *gv, const sess_col *cols, int32_t seq,
                            const int32_t *exact)
{
    bool whole = seq < 0;
    const sect *rs = find(ps, SEC_RSTATE, 0), *ck = find(ps, SEC_CKPT, 0);
    if (!rs || !ck) return base_err(m->err, KEEL_EFORMAT, "load: the recurrent sections are missing");
    int32_t nseq = whole ? m->cfg.n_seq_max : 1;
    rd r = rs->body;
    int32_t n = get_i32(&r);
    uint64_t nf = get_u64(&r);
    if (r.bad || n != nseq || nf != (uint64_t)m->rs_slot_floats)
        return base_err(m->err, KEEL_EFORMAT, "load: recurrent state of %d sequences, %llu floats (this memory: %d, %zu)",
                        n, (unsigned long long)nf, nseq, m->rs_slot_floats);
    rs_seq q[MEM_SEQ_MAX];
    int32_t need = 0;
    for (int32_t i = 0; i < nseq; i++) {
        keel_status st = read_rs_seq(m, &r, i, ps->n_ranks, q, &q[i]);
        if (st != KEEL_OK) return st;
        need += q[i].kind == 1 && m->n_rs_layers > 0;
        if (m->n_groups > 0) { /* R1, R2: a state iff tokens; the last token agrees */
            int32_t lo, hi;
            view_span(m, gv, whole, i, &lo, &hi);
            if ((q[i].kind != 0) != (hi >= 0) || (q[i].kind && (hi != q[i].hi || lo < q[i].lo)))
                return base_err(m->err, KEEL_EFORMAT,
                                "load: sequence %d: recurrent span %d..%d, attention cells %d..%d", i, q[i].lo, q[i].hi,
                                lo, hi);
        }
    }
    if (r.p != r.end) return base_err(m->err, KEEL_EFORMAT, "load: recurrent state has trailing bytes");
    int32_t avail = whole ? m->n_rs_slots : mem_rs_free_slots(m);
    if (!whole && m->seq_slot[seq] >= 0 && m->rs_refs[m->seq_slot[seq]] == 1) avail++;
    if (need > avail)
        return base_err(m->err, KEEL_EFULL, "load: %d recurrent states to restore, %d of n_rs_slots %d free", need, avail,
                        m->n_rs_slots);
    r = ck->body;
    if (get_i32(&r) != nseq || r.bad) return base_err(m->err, KEEL_EFORMAT, "load: checkpoint section header");
    int64_t total = 0;
    int32_t max_ord = -1;
    for (int32_t i = 0; i < nseq; i++) {
        int32_t nc = get_i32(&r), prev = -1;
        if (r.bad || nc < 0 || (nc > 0 && q[i].kind == 0))
            return base_err(m->err, KEEL_EFORMAT, "load: sequence %d: %d checkpoints", i, nc);
        for (int32_t j = 0; j < nc; j++) {
            int32_t ord;
            keel_status st = read_ckpt(m, &r, gv, cols, whole, i, &q[i], exact[i], ps->n_ranks, &ord);
            if (st != KEEL_OK) return st;
            if (ord <= prev) /* oldest first: take orders ascend */
                return base_err(m->err, KEEL_EFORMAT, "load: sequence %d: checkpoint take orders out of order", i);
            prev = ord;
            max_ord = BASE_MAX(max_ord, ord);
            total++;
        }
    }
    if (r.p != r.end) return base_err(m->err, KEEL_EFORMAT, "load: checkpoint section has trailing bytes");
    if (max_ord >= total) return base_err(m->err, KEEL_EFORMAT, "load: checkpoint take order %d of %lld", max_ord, (long long)total);
    return KEEL_OK;
}

/* Writes the validated recurrent sections into the memory (whose loaded
 * sequences hold nothing yet): states, shares, checkpoint records (the
 * newest n_ckpt of each sequence when it keeps fewer), stamps rebased. */
static void commit_rs(keel_mem *m, const parsed *ps, const sess_col *cols, int32_t seq, uint64_t base, float *x,
                      float *signs)
{
    bool whole = seq < 0;
    int32_t nseq = whole ? m->cfg.n_seq_max : 1, s0 = whole ? 0 : seq;
    rd r = find(ps, SEC_RSTATE, 0)->body;
    skip(&r, 12);
    rs_seq q[MEM_SEQ_MAX];
    for (int32_t i = 0; i < nseq; i++) {
        int32_t s = s0 + i;
        const uint8_t *f;
        get_rs_seq(m, &r, &q[i], &f); /* validated */
        if (q[i].kind == 0 || m->n_rs_layers == 0) continue; /* an attention memory: spans are its tables' */
        int32_t k;
        if (q[i].kind == 1) {
            k = mem_rs_take_slot(m); /* room validated */
            memcpy(mem_rs_slot(m, k), f, m->rs_slot_floats * sizeof(float));
        } else {
            k = m->seq_slot[s0 + q[i].share];
        }
        m->rs_refs[k]++;
        m->seq_slot[s] = k;
        m->rs_pos_min[s] = q[i].lo;
        m->rs_pos_max[s] = q[i].hi;
        m->rs_stamp[s] = base + (uint64_t)q[i].rank;
    }
    r = find(ps, SEC_CKPT, 0)->body;
    skip(&r, 4);
    int64_t total = 0;
    for (int32_t i = 0; i < nseq; i++) {
        int32_t s = s0 + i, nc = get_i32(&r);
        for (int32_t j = 0; j < nc; j++) {
            int32_t pos = get_i32(&r), pos_min = get_i32(&r), rank = get_i32(&r), ord = get_i32(&r);
            const uint8_t *f = take(&r, m->rs_slot_floats * sizeof(float));
            int32_t rec = j - (nc - m->n_ckpt); /* the newest n_ckpt are kept */
            uint8_t *data = rec >= 0 ? mem_ck_data(m, s, rec) : NULL;
            size_t bytes = m->rs_slot_floats * sizeof(float);
            if (data) memcpy(data, f, bytes);
            for (int32_t g = 0; g < m->n_groups; g++) {
                mem_table *t = &m->groups[g].tables[0];
                if (!t->sliding) continue;
                const mem_ckpt_ring *rr = &m->ckpt_ring[g];
                int32_t hdr[2] = {get_i32(&r), get_i32(&r)};
                const uint8_t *meta = take(&r, (size_t)hdr[0] * 12);
                size_t cb = stored_cell_bytes(m, g, cols);
                const uint8_t *rows = take(&r, (size_t)hdr[0] * cb);
                if (!data) continue;
                memcpy(data + rr->off, hdr, sizeof hdr);
                for (int32_t c = 0; c < hdr[0]; c++) {
                    int32_t p = rd_i32_at(meta + 12 * (size_t)c);
                    uint64_t stp = base + (uint64_t)rd_i32_at(meta + 12 * (size_t)c + 4);
                    memcpy(data + rr->pos_off + (size_t)c * 4, &p, 4);
                    memcpy(data + rr->stamp_off + (size_t)c * 8, &stp, 8);
                    data[rr->cflags_off + (size_t)c] = meta[12 * (size_t)c + 8];
                    uint8_t *dst = data + rr->rows_off + (size_t)c * rr->cell_bytes;
                    const uint8_t *src = rows + (size_t)c * cb;
                    for (int32_t ci = 0; ci < t->n_cols; ci++) {
                        const mem_col *col = &t->cols[ci];
                        const sess_col *sc = &cols[3 * col->layer + col->kind];
                        for (int32_t h = 0; h < col->n_heads; h++) {
                            if (sc->same)
                                memcpy(dst, src, col->head_row_bytes);
                            else
                                convert_row(sc, src, col, dst, x, signs);
                            dst += col->head_row_bytes;
                            src += sc->row_bytes;
                        }
                    }
                }
                bytes += (size_t)hdr[0] * (rr->cell_bytes + sizeof(int32_t) + sizeof(uint64_t) + 1);
            }
            total++;
            if (!data) continue;
            mem_ckpt *c = mem_ck(m, s, rec);
            c->pos = pos;
            c->pos_min = pos_min;
            c->stamp = base + (uint64_t)rank;
            c->order = m->ckpt_order + 1 + (uint64_t)ord;
            c->bytes = bytes;
            c->prio = 0; /* not saved: the caller sets it again */
        }
    }
    m->ckpt_order += (uint64_t)total;
}

/* The last position the one saved sequence holds in the blob (-1: none):
 * its cells' in any group, else (a memory of recurrent layers only) its
 * state's span. The sections were validated. */
static int32_t blob_seq_hi(const keel_mem *m, const parsed *ps, const grp_view *gv)
{
    int32_t lo = -1, hi = -1;
    if (m->n_groups > 0) {
        view_span(m, gv, false, 0, &lo, &hi);
    } else if (rs_sections(m)) {
        rd r = find(ps, SEC_RSTATE, 0)->body;
        skip(&r, 12);
        rs_seq q;
        const uint8_t *f;
        get_rs_seq(m, &r, &q, &f);
        if (q.kind != 0) hi = q.hi;
    }
    return hi;
}

/*
 * The token history (nt tokens, the last np not in the cache) against the
 * cells of the one saved sequence, before anything changes: the cache holds
 * nc = nt - np tokens of it. A sequence never compacted holds them exactly
 * at positions 0 .. nc-1: in every group each position at most once and
 * below nc, the last one at nc-1, and the (first) full group every one of
 * them (sliding rings forget the oldest; a memory of recurrent layers only
 * has its state's span). A compacted one (exact_from or compactions) holds a
 * summary the history can only extend: no group more cells than nc, each
 * position at most once, none at or past nc, some iff nc > 0. An empty
 * history records none and is checked only with need (the engine's slots).
 * keys: room for the largest group's cells.
 */
static keel_status check_history(keel_mem *m, const parsed *ps, const grp_view *gv, int32_t nt, int32_t np,
                                 bool compacted, bool need, uint64_t *keys)
{
    if (nt == 0 && !need) return KEEL_OK;
    int32_t nc = nt - np, hi = blob_seq_hi(m, ps, gv);
    if (nt == 0 && hi >= 0)
        return base_err(m->err, KEEL_EFORMAT,
                        "load: the session holds cells up to position %d but no token history (a slot needs the "
                        "history its cells hold)",
                        hi);
    if (hi < 0 && nc > 0)
        return base_err(m->err, KEEL_EFORMAT,
                        "load: token history disagrees with the cells: %d tokens (%d pending) leave %d in the cache, "
                        "the sequence holds no cells",
                        nt, np, nc);
    if (np > 0 && hi >= nc && hi < nt)
        return base_err(m->err, KEEL_EFORMAT,
                        "load: token history disagrees with the cells: %d of its %d tokens are pending (not in the "
                        "cache), but the cells reach position %d",
                        np, nt, hi);
    if (compacted ? hi >= nc : hi != nc - 1)
        return base_err(m->err, KEEL_EFORMAT,
                        "load: token history disagrees with the cells: %d tokens (%d pending) leave %d in the cache, "
                        "the %ssequence's cells end at position %d%s",
                        nt, np, nc, compacted ? "compacted " : "", hi,
                        compacted ? " (a compaction only lowers positions)" : "");
    int32_t gf = -1;
    for (int32_t g = 0; g < m->n_groups; g++) {
        if (gf < 0 && m->groups[g].kind == KEEL_MEM_LAYER_FULL) gf = g;
        int32_t n = view_keys(m, gv, g, false, 0, keys);
        if (n > nc)
            return base_err(m->err, KEEL_EFORMAT,
                            "load: token history disagrees with the cells: group %d holds %d cells, the history %d "
                            "tokens in the cache",
                            g, n, nc);
        for (int32_t i = 1; i < n; i++)
            if (keys[i] >> 32 == keys[i - 1] >> 32)
                return base_err(m->err, KEEL_EFORMAT,
                                "load: token history disagrees with the cells: group %d holds position %d twice (a "
                                "history has one token per position)",
                                g, (int32_t)(keys[i] >> 32));
        if (compacted || g != gf) continue;
        for (int32_t i = 0; i < nc; i++)
            if (i >= n || (int32_t)(keys[i] >> 32) != i)
                return base_err(m->err, KEEL_EFORMAT,
                                "load: token history disagrees with the cells: full group %d has no cell at position "
                                "%d, where the history has its token %d",
                                g, i, i);
    }
    return KEEL_OK;
}

keel_status keel_mem_load(keel_mem *m, int32_t seq, const void *buf, size_t len, uint64_t fingerprint,
                          unsigned flags, int32_t *tokens, int32_t cap_tokens, int32_t *n_tokens,
                          int32_t *n_pending)
{
    const mem_load_rules none = {0, false};
    return mem_session_load(m, seq, buf, len, fingerprint, flags, &none, tokens, cap_tokens, n_tokens, n_pending);
}

keel_status mem_session_load(keel_mem *m, int32_t seq, const void *buf, size_t len, uint64_t fingerprint,
                             unsigned flags, const mem_load_rules *rules, int32_t *tokens, int32_t cap_tokens,
                             int32_t *n_tokens, int32_t *n_pending)
{
    if (!m) return KEEL_EINVAL;
    m->err[0] = 0;
    if (!n_tokens) return base_err(m->err, KEEL_EINVAL, "load: n_tokens is NULL");
    if (!buf && len) return base_err(m->err, KEEL_EINVAL, "load: buf is NULL with len %zu", len);
    *n_tokens = 0;
    if (n_pending) *n_pending = 0;
    if (flags & ~(unsigned)KEEL_SESSION_CONVERT) return base_err(m->err, KEEL_EINVAL, "load: unknown flags %#x", flags);
    parsed ps;
    keel_status st = parse_blob(m, buf, len, fingerprint, &ps);
    if (st != KEEL_OK) return st;
    bool whole = ps.seq < 0;
    if (whole != (seq < 0))
        return base_err(m->err, KEEL_EINVAL, whole ? "load: the session holds the whole memory; load it with seq -1"
                                                   : "load: the session holds one sequence; load it into a sequence id");
    if (!whole && seq >= m->cfg.n_seq_max) return base_err(m->err, KEEL_EINVAL, "load: unknown sequence id %d", seq);
    /* scratch: the stored descriptors, a decoded row and a sign diagonal */
    base_arena_reset(&m->scratch);
    sess_col *cols = base_arena_take_n(&m->scratch, 3 * (size_t)m->cfg.n_layers, sizeof(sess_col));
    size_t x_floats = BASE_MAX((size_t)m->attn_dims.dk_max + (size_t)m->attn_dims.dv_max, (size_t)m->attn_dims.ik_max);
    float *x = base_arena_take_n(&m->scratch, x_floats, sizeof(float));
    float *signs = base_arena_take_n(&m->scratch, 512, sizeof(float));
    if (!cols || !x || !signs) return base_err(m->err, KEEL_ESCRATCH, "load: scratch exhausted");
    memset(cols, 0, 3 * (size_t)m->cfg.n_layers * sizeof(sess_col));
    /* validate every section before anything changes */
    const sect *desc = find(&ps, SEC_DESC, 0), *tok = find(&ps, SEC_TOKENS, 0), *sq = find(&ps, SEC_SEQ, 0);
    if (!desc || !tok || !sq) return base_err(m->err, KEEL_EFORMAT, "load: a section is missing");
    if ((st = check_desc(m, desc, whole, (flags & KEEL_SESSION_CONVERT) != 0, cols)) != KEEL_OK) return st;
    rd tr = tok->body;
    int32_t nt = get_i32(&tr), np = get_i32(&tr);
    if (tr.bad || nt < 0 || np < 0 || np > nt || (size_t)nt * 4 != (size_t)(tr.end - tr.p))
        return base_err(m->err, KEEL_EFORMAT, "load: token section size");
    if (nt > cap_tokens && tokens) return base_err(m->err, KEEL_ERANGE, "load: %d tokens, room for %d", nt, cap_tokens);
    if (rules->n_vocab > 0) /* rule 10: token ids are input too */
        for (int32_t i = 0; i < nt; i++) {
            int32_t id = get_i32(&tr);
            if (id < 0 || id >= rules->n_vocab)
                return base_err(m->err, KEEL_EFORMAT,
                                "load: token history: token %d is id %d, outside this model's vocabulary [0, %d)", i,
                                id, rules->n_vocab);
        }
    rd sr = sq->body;
    int32_t nseq = get_i32(&sr);
    if (sr.bad || nseq != (whole ? m->cfg.n_seq_max : 1) ||
        (size_t)(sr.end - sr.p) != (size_t)nseq * (4 + 8 + 4 + 4 * (size_t)m->n_groups))
        return base_err(m->err, KEEL_EFORMAT, "load: sequence section size");
    int32_t exact[MEM_SEQ_MAX];
    bool compacted = false; /* the one saved sequence's (exactness bound or compactions) */
    for (int32_t i = 0; i < nseq; i++) {
        int32_t ex = get_i32(&sr);
        exact[i] = ex;
        uint64_t nc = get_u64(&sr);
        compacted = ex > 0 || nc > 0;
        int32_t hi = get_i32(&sr);
        if (ex < 0 || nc > (uint64_t)INT64_MAX || hi < 0)
            return base_err(m->err, KEEL_EFORMAT, "load: sequence %d: exactness %d, compactions %llu, high %d", i, ex,
                            (unsigned long long)nc, hi);
        for (int32_t g = 0; g < m->n_groups; g++) {
            int32_t e = get_i32(&sr);
            if (e != MEM_NO_EVICT && e < -INT32_MAX / 2)
                return base_err(m->err, KEEL_EFORMAT, "load: sequence %d group %d: forgotten bound %d", i, g, e);
        }
    }
    int32_t want_sec = 3 + m->n_groups + (rs_sections(m) ? 2 : 0);
    if (ps.n != want_sec)
        return base_err(m->err, KEEL_EFORMAT, "load: %d sections, this memory's sessions have %d", ps.n, want_sec);
    grp_view gv[8];
    if (m->n_groups > 8) return base_err(m->err, KEEL_EUNSUPPORTED, "load: %d groups", m->n_groups);
    for (int32_t g = 0; g < m->n_groups; g++) {
        if ((st = view_group(m, &ps, g, cols, &gv[g])) != KEEL_OK) return st;
        /* rows: every one decodes to finite values (rule 10: nothing the
         * attention would turn into NaN gets in) */
        const uint8_t *rp = gv[g].rows.p;
        for (int32_t ci = 0; ci < m->groups[g].tables[0].n_cols; ci++) {
            const mem_col *mc = &m->groups[g].tables[0].cols[ci];
            const sess_col *sc = &cols[3 * mc->layer + mc->kind];
            size_t nrows = (size_t)gv[g].n_cells * (size_t)sc->n_heads;
            for (size_t i = 0; i < nrows; i++, rp += sc->row_bytes)
                if (!tensor_row_finite(sc->dtype, rp, sc->head_dim))
                    return base_err(m->err, KEEL_EFORMAT, "load: group %d: column %d: row %zu is not finite", g, ci, i);
        }
        /* cell metadata: positions, ranks, flags, sequence sets in range */
        rd mr = gv[g].meta;
        int32_t words = m->groups[g].tables[0].seq_words;
        for (int32_t i = 0; i < gv[g].n_cells; i++) {
            int32_t pos = get_i32(&mr), rank = get_i32(&mr);
            uint32_t fl = get_u32(&mr);
            if (pos < 0 || pos == INT32_MAX || rank < 0 || (uint64_t)rank >= ps.n_ranks || fl > 0xff)
                return base_err(m->err, KEEL_EFORMAT, "load: group %d cell %d: position %d rank %d flags %u", g, i, pos,
                                rank, fl);
            if (whole) {
                bool any = false;
                for (int32_t w = 0; w < words; w++) {
                    uint64_t bits = get_u64(&mr);
                    if (w == words - 1 && m->cfg.n_seq_max % 64 && (bits >> (m->cfg.n_seq_max % 64)))
                        return base_err(m->err, KEEL_EFORMAT, "load: group %d cell %d: sequence id out of range", g, i);
                    any |= bits != 0;
                }
                if (!any) return base_err(m->err, KEEL_EFORMAT, "load: group %d cell %d has no sequence", g, i);
            }
        }
        /* room */
        if (whole) {
            if (m->n_streams > 1)
                return base_err(m->err, KEEL_EUNSUPPORTED, "load: whole-memory sessions need a unified cache");
            if (gv[g].n_cells > m->groups[g].tables[0].cap)
                return base_err(m->err, KEEL_EFULL, "load: group %d: %d cells, %d in the table", g, gv[g].n_cells,
                                m->groups[g].tables[0].cap);
        } else {
            const mem_table *t = &m->groups[g].tables[m->n_streams == 1 ? 0 : seq];
            int32_t free_cells = t->cap - t->n_used;
            for (int32_t c = 0; c < t->cap; c++)
                free_cells += t->pos[c] >= 0 && mem_seq_has(t, c, seq) && mem_seq_count(t, c) == 1;
            if (gv[g].n_cells > free_cells)
                return base_err(m->err, KEEL_EFULL, "load: group %d: %d cells to restore, %d free", g, gv[g].n_cells,
                                free_cells);
        }
    }
    if (ps.n_ranks > (uint64_t)INT32_MAX) return base_err(m->err, KEEL_EFORMAT, "load: %llu ranks", (unsigned long long)ps.n_ranks);
    /* the groups against each other, as keel_mem_check holds them */
    int32_t cap_max = 1;
    for (int32_t g = 0; g < m->n_groups; g++) cap_max = BASE_MAX(cap_max, gv[g].n_cells);
    uint64_t *kf = base_arena_take_n(&m->scratch, (size_t)cap_max, sizeof(uint64_t));
    uint64_t *kr = base_arena_take_n(&m->scratch, (size_t)cap_max, sizeof(uint64_t));
    if (!kf || !kr) return base_err(m->err, KEEL_ESCRATCH, "load: scratch exhausted");
    for (int32_t i = 0; i < nseq; i++)
        if (exact[i] == 0 && (st = check_cross(m, gv, whole, i, kf, kr)) != KEEL_OK) return st;
    if (rs_sections(m) && (st = check_rs(m, &ps, gv, cols, seq, exact)) != KEEL_OK) return st;
    /* the history against the cells (a whole memory's names no sequence) */
    if (!whole && (st = check_history(m, &ps, gv, nt, np, compacted, rules->need_history, kf)) != KEEL_OK) return st;
    /* commit (cannot fail from here) */
    if (whole)
        keel_mem_clear(m);
    else if (keel_mem_seq_rm(m, seq, -1, -1) != KEEL_OK)
        return base_err(m->err, KEEL_EINTERNAL, "load: could not empty sequence %d", seq);
    uint64_t base = m->next_stamp;
    m->next_stamp += ps.n_ranks;
    for (int32_t g = 0; g < m->n_groups; g++) {
        mem_group *grp = &m->groups[g];
        mem_table *t = &grp->tables[m->n_streams == 1 ? 0 : (whole ? 0 : seq)];
        int32_t words = t->seq_words;
        rd mr = gv[g].meta, rr = gv[g].rows;
        /* cells first (in the blob's order), then the rows column by column */
        for (int32_t i = 0; i < gv[g].n_cells; i++) {
            int32_t pos = get_i32(&mr), rank = get_i32(&mr);
            uint32_t fl = get_u32(&mr);
            int32_t c = mem_table_find_free(t);
            t->pos[c] = pos;
            mem_table_mark_used(t, c);
            t->stamp[c] = base + (uint64_t)rank;
            t->cflags[c] = (uint8_t)fl;
            t->n_used++;
            t->newpos[c] = i; /* the cell's index in the blob, for the rows below */
            t->flags[c] = 1;
            if (whole) {
                for (int32_t w = 0; w < words; w++) t->seq[(size_t)c * (size_t)words + (size_t)w] = get_u64(&mr);
            } else {
                mem_seq_set(t, c, seq);
            }
            if (c > m->max_cell_touched) m->max_cell_touched = c;
        }
        for (int32_t ci = 0; ci < t->n_cols; ci++) {
            const mem_col *col = &t->cols[ci];
            const sess_col *sc = &cols[3 * col->layer + col->kind];
            for (int32_t h = 0; h < col->n_heads; h++) {
                const uint8_t *head_rows = rr.p + (size_t)h * (size_t)gv[g].n_cells * sc->row_bytes;
                for (int32_t c = 0; c < t->cap; c++) {
                    if (!t->flags[c]) continue;
                    const uint8_t *src = head_rows + (size_t)t->newpos[c] * sc->row_bytes;
                    uint8_t *dst = mem_col_row(t, col, h, c);
                    if (sc->same)
                        memcpy(dst, src, col->head_row_bytes);
                    else
                        convert_row(sc, src, col, dst, x, signs);
                }
            }
            rr.p += sc->row_bytes * (size_t)sc->n_heads * (size_t)gv[g].n_cells;
        }
        for (int32_t c = 0; c < t->cap; c++) t->flags[c] = 0;
        mem_table_refresh(t);
    }
    rd sr2 = sq->body;
    skip(&sr2, 4); /* the count, checked above */
    int32_t s0 = whole ? 0 : seq, s1 = whole ? m->cfg.n_seq_max : seq + 1;
    for (int32_t s = s0; s < s1; s++) {
        m->exact_from[s] = get_i32(&sr2);
        m->n_compact[s] = (int64_t)get_u64(&sr2);
        m->cells_high[s] = get_i32(&sr2);
        m->anchor_valid[s] = 0;
        for (int32_t g = 0; g < m->n_groups; g++) {
            int32_t e = get_i32(&sr2);
            mem_table *t = &m->groups[g].tables[m->n_streams == 1 ? 0 : s];
            if (t->sliding) t->evict_max[s] = e;
        }
    }
    if (rs_sections(m)) commit_rs(m, &ps, cols, seq, base, x, signs);
    if (tokens) {
        rd tr2 = tok->body;
        skip(&tr2, 8); /* the counts */
        for (int32_t i = 0; i < nt; i++) tokens[i] = get_i32(&tr2);
    }
    *n_tokens = nt;
    if (n_pending) *n_pending = np;
    return KEEL_OK;
}
