/*
 * compact.c — KV compaction: evict cells of one sequence from the
 * full-attention table so that a long session stays inside a budget
 * (docs/compaction.md).
 *
 * A compaction of sequence s to `target` cells:
 *   1. orders s's cells by (position, stamp) and reserves the sinks (lowest
 *      n_sink), the recent tokens (highest ceil(recent * target)) and,
 *      budget permitting, protected cells (newest first);
 *   2. scores the other cells with the policy and keeps the best;
 *   3. validates everything that could fail (sliding rings must hold only
 *      kept tokens when renumbering; copies for shared cells need room;
 *      scratch) and only then evicts through the table (every column) and
 *      renumbers kept positions to 0..target-1 with exact key corrections
 *      (the same re-encoding as seq_add, one delta per cell).
 *
 * Scores (higher is kept) are per cell, averaged over every full-attention
 * layer and KV head: the table holds one keep-set per sequence, so per-head
 * preferences are combined by their mean (docs/compaction.md explains why a
 * per-head keep-set would need a head-mask column and break the budget).
 *   window   position (most recent first)
 *   keydiff  -cos(k, a): k the pre-RoPE key (decoded, rotation undone, RoPE
 *            undone at its position), a the sequence's anchor, the mean of
 *            its normalized pre-RoPE keys
 *   knorm    -|k| (rotations preserve norms: no decoding of RoPE needed)
 *   random   a hash of (seed, compaction count, stamp)
 *
 * KeyDiff anchors are running sums of normalized pre-RoPE keys per
 * (sequence, layer, head): cells placed since the last event are added,
 * evicted cells subtracted. Pre-RoPE keys do not change when positions are
 * renumbered, so edits never touch the anchor; any other removal (seq_rm,
 * seq_keep, clear) invalidates it and the next event rebuilds it.
 */
#include "memory.h"

#include <math.h>
#include <string.h>
#include <strings.h>

keel_compact_params keel_compact_params_default(void)
{
    keel_compact_params p;
    memset(&p, 0, sizeof p);
    p.policy = KEEL_COMPACT_NONE;
    p.n_sink = 4;
    p.recent = 0.25f;
    p.renumber = true;
    p.protect = true;
    p.seed = 1;
    return p;
}

static const char *const g_policy_names[] = {"none", "window", "keydiff", "knorm", "random"};

const char *keel_compact_policy_name(keel_compact_policy p)
{
    if ((unsigned)p >= BASE_ARRAY_LEN(g_policy_names)) return "unknown";
    return g_policy_names[p];
}

keel_status keel_compact_policy_from_name(const char *name, keel_compact_policy *out)
{
    if (!name || !out) return KEEL_EINVAL;
    for (size_t i = 0; i < BASE_ARRAY_LEN(g_policy_names); i++)
        if (strcasecmp(name, g_policy_names[i]) == 0) {
            *out = (keel_compact_policy)i;
            return KEEL_OK;
        }
    return KEEL_EINVAL;
}

static int32_t n_recent_of(const keel_compact_params *p)
{
    return (int32_t)ceil((double)p->recent * (double)p->target);
}

keel_status keel_compact_params_check(const keel_compact_params *p, char *err)
{
    if (!p) return base_err(err, KEEL_EINVAL, "compaction parameters are NULL");
    if ((unsigned)p->policy >= BASE_ARRAY_LEN(g_policy_names))
        return base_err(err, KEEL_EINVAL, "unknown compaction policy %d", (int)p->policy);
    if (p->policy == KEEL_COMPACT_NONE) return KEEL_OK;
    if (p->target < 1) return base_err(err, KEEL_EINVAL, "compaction target %d must be >= 1", p->target);
    if (p->trigger <= p->target)
        return base_err(err, KEEL_EINVAL, "compaction trigger %d must be greater than target %d",
                        p->trigger, p->target);
    if (p->n_sink < 0 || p->n_sink >= p->target)
        return base_err(err, KEEL_EINVAL, "compaction sinks %d must be in [0, target %d)", p->n_sink,
                        p->target);
    if (!(p->recent >= 0.0f && p->recent < 1.0f))
        return base_err(err, KEEL_EINVAL, "compaction recent fraction %g must be in [0, 1)",
                        (double)p->recent);
    if ((int64_t)p->n_sink + n_recent_of(p) > (int64_t)p->target)
        return base_err(err, KEEL_EINVAL,
                        "compaction sinks %d + recent %d exceed target %d", p->n_sink,
                        n_recent_of(p), p->target);
    return KEEL_OK;
}

/* The full-attention table of s (NULL if the memory has no full layers). */
static mem_table *full_table(const keel_mem *m, int32_t s, int32_t *group)
{
    for (int32_t g = 0; g < m->n_groups; g++)
        if (m->groups[g].kind == KEEL_MEM_LAYER_FULL) {
            if (group) *group = g;
            return &m->groups[g].tables[m->n_streams == 1 ? 0 : s];
        }
    return NULL;
}

int32_t keel_mem_seq_cells(const keel_mem *m, int32_t s)
{
    if (!m || s < 0 || s >= m->cfg.n_seq_max) return 0;
    const mem_table *t = full_table(m, s, NULL);
    return t ? t->seq_cells[s] : 0;
}

int64_t keel_mem_seq_compactions(const keel_mem *m, int32_t s)
{
    if (!m || s < 0 || s >= m->cfg.n_seq_max) return 0;
    return m->n_compact[s];
}

/* ---- scratch ------------------------------------------------------------- */

static void dims(const keel_mem_config *cfg, int32_t *hd, int32_t *nrot)
{
    *hd = 1;
    *nrot = 2;
    for (int32_t i = 0; i < cfg->n_layers; i++) {
        const keel_mem_layer *l = &cfg->layers[i];
        if (!mem_layer_has_kv(l)) continue;
        *hd = BASE_MAX(*hd, l->head_dim_k);
        if (l->rope.type != KEEL_ROPE_NONE) *nrot = BASE_MAX(*nrot, l->rope.n_rot);
    }
}

/*
 * The scratch of one compaction of a sequence holding n cells, laid out in
 * the order keel_mem_compact takes it (every take BASE_ALIGN-aligned):
 * seven per-cell arrays, then one block per thread that serves the key
 * decoding of scoring and anchors and, after them, the renumbering pass
 * (mem_edit_marked). keel_mem_compact takes exactly these; open plans the
 * arena for n = n_ctx, the most a full table holds.
 */
static const size_t g_cell_elems[] = {
    sizeof(int32_t),  /* order: s's cells by (pos, stamp) */
    sizeof(int32_t),  /* cand: candidate cells, then kept order indices by stamp */
    sizeof(int32_t),  /* rank: order index of each candidate */
    sizeof(float),    /* scores */
    1,                /* keep, by order index */
    sizeof(uint64_t), /* kst: stamps, by order index */
    sizeof(int32_t),  /* knew: new positions, by order index (first a permutation) */
};

static size_t thread_block_bytes(const keel_mem_config *cfg)
{
    int32_t hd, nrot;
    dims(cfg, &hd, &nrot);
    size_t keys = ((size_t)hd + (size_t)nrot + 16) * sizeof(float);
    size_t b = BASE_MAX(keys, mem_edit_thread_bytes(cfg));
    return (b + BASE_ALIGN - 1) & ~(size_t)(BASE_ALIGN - 1);
}

static size_t compact_scratch(const keel_mem_config *cfg, size_t n, int32_t n_threads)
{
    size_t total = 0;
    for (size_t i = 0; i < BASE_ARRAY_LEN(g_cell_elems); i++)
        total += (n * g_cell_elems[i] + BASE_ALIGN - 1) & ~(size_t)(BASE_ALIGN - 1);
    return total + thread_block_bytes(cfg) * (size_t)n_threads;
}

size_t mem_compact_scratch_bytes(const keel_mem_config *cfg, int32_t n_threads)
{
    return compact_scratch(cfg, (size_t)cfg->n_ctx, n_threads);
}

/* ---- orders ---------------------------------------------------------------- */

static bool less_pos(const void *ctx, int32_t a, int32_t b)
{
    const mem_table *t = ctx;
    return t->pos[a] < t->pos[b] || (t->pos[a] == t->pos[b] && t->stamp[a] < t->stamp[b]);
}

typedef struct score_order {
    const mem_table *t;
    const float *score; /* indexed by cell list position */
    const int32_t *cell;
} score_order;

/* "a ranks below b": lower score, or equal score and older */
static bool less_score(const void *ctx, int32_t a, int32_t b)
{
    const score_order *o = ctx;
    if (o->score[a] != o->score[b]) return o->score[a] < o->score[b];
    return less_pos(o->t, o->cell[a], o->cell[b]);
}

static bool less_u64(const void *ctx, int32_t a, int32_t b)
{
    const uint64_t *k = ctx;
    return k[a] < k[b];
}

/* ---- keys --------------------------------------------------------------- */

/* The pre-RoPE key of head h at cell: decoded, rotation undone, RoPE undone
 * at the cell's position (magnitude 1; a YaRN magnitude scales the key
 * uniformly and normalization removes it). */
static void key_pre_rope(const mem_table *t, const mem_col *c, int32_t h, int32_t cell, float *x,
                         float *cs)
{
    mem_col_decode(c, mem_col_row(t, c, h, cell), x);
    if (c->rope.type == KEEL_ROPE_NONE || !c->rope_rates) return;
    tensor_rope_cos_sin(c->rope_rates, c->rope.n_rot, -(double)t->pos[cell], 1.0f, cs);
    tensor_rope_apply(c->rope.type, c->rope.n_rot, cs, x, 1, c->head_dim);
}

/* anchor += sign * normalized pre-RoPE keys of cell, every K column and head */
static void anchor_add(keel_mem *m, const mem_table *t, int32_t s, int32_t cell, float sign, float *x,
                       float *cs)
{
    float *a = m->anchor + (size_t)s * m->anchor_floats;
    for (int32_t ci = 0; ci < t->n_cols; ci++) {
        const mem_col *c = &t->cols[ci];
        if (c->kind != MEM_COL_K) continue;
        size_t off = m->anchor_off[c->layer];
        for (int32_t h = 0; h < c->n_heads; h++) {
            key_pre_rope(t, c, h, cell, x, cs);
            float n = sqrtf(tensor_dot_f32(x, x, c->head_dim));
            if (n > 0.0f) tensor_axpy_f32(a + off + (size_t)h * (size_t)c->head_dim, sign / n, x, c->head_dim);
        }
    }
}

typedef struct score_ctx {
    keel_mem *m;
    const mem_table *t;
    int32_t s;
    keel_compact_policy policy;
    const int32_t *cells;
    float *scores;
    uint8_t *thread_scratch;
    size_t thread_bytes;
    int32_t hd; /* largest head_dim: the cos/sin table follows x[hd] */
    uint64_t salt;
} score_ctx;

static void score_task(void *vctx, int64_t i, int thread)
{
    score_ctx *sc = vctx;
    const mem_table *t = sc->t;
    int32_t cell = sc->cells[i];
    float *x = (float *)(sc->thread_scratch + (size_t)thread * sc->thread_bytes);
    float *cs = x + sc->hd;
    double sum = 0.0;
    int32_t cnt = 0;
    switch (sc->policy) {
    case KEEL_COMPACT_WINDOW:
        sc->scores[i] = (float)t->pos[cell];
        return;
    case KEEL_COMPACT_RANDOM: {
        uint64_t key[2] = {sc->salt, t->stamp[cell]};
        sc->scores[i] = (float)(base_hash64(key, sizeof key, 0x72616e64) >> 40);
        return;
    }
    default:
        break;
    }
    const float *anchor = sc->m->anchor + (size_t)sc->s * sc->m->anchor_floats;
    for (int32_t ci = 0; ci < t->n_cols; ci++) {
        const mem_col *c = &t->cols[ci];
        if (c->kind != MEM_COL_K) continue;
        for (int32_t h = 0; h < c->n_heads; h++) {
            if (sc->policy == KEEL_COMPACT_KNORM) {
                mem_col_decode(c, mem_col_row(t, c, h, cell), x);
                sum -= sqrt((double)tensor_dot_f32(x, x, c->head_dim));
            } else {
                key_pre_rope(t, c, h, cell, x, cs);
                const float *a = anchor + sc->m->anchor_off[c->layer] + (size_t)h * (size_t)c->head_dim;
                double kn = sqrt((double)tensor_dot_f32(x, x, c->head_dim));
                double an = sqrt((double)tensor_dot_f32(a, a, c->head_dim));
                if (kn > 0.0 && an > 0.0) sum -= (double)tensor_dot_f32(x, a, c->head_dim) / (kn * an);
            }
            cnt++;
        }
    }
    sc->scores[i] = cnt ? (float)(sum / cnt) : 0.0f;
}

/* Binary search of stamp in sorted stamps[0..n); index or -1. */
static int32_t find_stamp(const uint64_t *stamps, const int32_t *order, int32_t n, uint64_t st)
{
    int32_t lo = 0, hi = n - 1;
    while (lo <= hi) {
        int32_t mid = lo + (hi - lo) / 2;
        uint64_t v = stamps[order[mid]];
        if (v == st) return order[mid];
        if (v < st)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

keel_status keel_mem_compact(keel_mem *m, int32_t s, const keel_compact_params *p)
{
    if (!m) return KEEL_EINVAL;
    m->err[0] = 0;
    if (s < 0 || s >= m->cfg.n_seq_max)
        return base_err(m->err, KEEL_EINVAL, "compact: unknown sequence id %d", s);
    keel_status st = keel_compact_params_check(p, m->err);
    if (st != KEEL_OK) return st;
    if (p->policy == KEEL_COMPACT_NONE) return KEEL_OK;
    int32_t gfull = -1;
    mem_table *T = full_table(m, s, &gfull);
    if (!T || T->seq_cells[s] <= p->target) return KEEL_OK;
    int32_t n = T->seq_cells[s];

    /* scratch: everything the compaction and its renumbering pass use,
     * taken before anything changes (compact_scratch plans the same takes) */
    base_arena *ar = &m->scratch;
    base_arena_reset(ar);
    void *arr[BASE_ARRAY_LEN(g_cell_elems)];
    bool got = true;
    for (size_t i = 0; i < BASE_ARRAY_LEN(g_cell_elems); i++)
        got &= (arr[i] = base_arena_take_n(ar, (size_t)n, g_cell_elems[i])) != NULL;
    int32_t *order = arr[0], *cand = arr[1], *rank = arr[2];
    float *scores = arr[3];
    uint8_t *keep = arr[4];
    uint64_t *kst = arr[5];
    int32_t *knew = arr[6];
    int32_t hd, nrot;
    dims(&m->cfg, &hd, &nrot);
    size_t tb = thread_block_bytes(&m->cfg);
    uint8_t *ts = base_arena_take(ar, tb * (size_t)m->n_threads, BASE_ALIGN);
    if (!got || !ts)
        return base_err(m->err, KEEL_ESCRATCH,
                        "compact: scratch exhausted (%zu bytes needed for %d cells, %zu reserved)",
                        compact_scratch(&m->cfg, (size_t)n, m->n_threads), n, ar->cap);

    /* 1. order s's cells and reserve sinks, recent and protected */
    int32_t k = 0;
    for (int32_t c = 0; c < T->cap; c++)
        if (T->pos[c] >= 0 && mem_seq_has(T, c, s)) {
            if (k < n) order[k] = c;
            k++;
        }
    if (k != n)
        return base_err(m->err, KEEL_EINTERNAL, "compact: sequence %d has %d cells, statistics say %d",
                        s, k, n);
    mem_heap_sort(order, n, less_pos, T);
    memset(keep, 0, (size_t)n);
    int32_t kept = 0, n_sink = BASE_MIN(p->n_sink, n), n_recent = BASE_MIN(n_recent_of(p), n);
    /* a recurrent state ends on the sequence's last token (the newest at
     * its largest position): the attention half keeps it too, so the next
     * token continues both at the same position */
    if (m->n_rs_layers > 0 && n_recent < 1) n_recent = 1;
    for (int32_t i = 0; i < n_sink; i++) keep[i] = 1;
    for (int32_t i = n - n_recent; i < n; i++) keep[i] = 1;
    for (int32_t i = 0; i < n; i++) kept += keep[i];
    if (p->protect)
        for (int32_t i = n - 1; i >= 0 && kept < p->target; i--)
            if (!keep[i] && (T->cflags[order[i]] & MEM_CELL_PROTECTED)) {
                keep[i] = 1;
                kept++;
            }

    /* 2. score the rest and keep the best */
    int32_t nc = 0;
    for (int32_t i = 0; i < n; i++)
        if (!keep[i]) {
            rank[nc] = i; /* order index of candidate nc */
            cand[nc++] = order[i];
        }
    int32_t want = p->target - kept;
    if (want > 0 && nc > 0) {
        if (p->policy == KEEL_COMPACT_KEYDIFF) {
            /* bring the anchor up to date: new cells since the last event */
            float *x = (float *)ts, *cs = x + hd;
            if (!m->anchor_valid[s]) {
                memset(m->anchor + (size_t)s * m->anchor_floats, 0, m->anchor_floats * sizeof(float));
                m->anchor_stamp[s] = 0;
            }
            uint64_t newest = m->anchor_stamp[s];
            for (int32_t i = 0; i < n; i++) {
                int32_t c = order[i];
                if (T->stamp[c] > m->anchor_stamp[s]) {
                    anchor_add(m, T, s, c, 1.0f, x, cs);
                    if (T->stamp[c] > newest) newest = T->stamp[c];
                }
            }
            m->anchor_stamp[s] = newest;
            m->anchor_valid[s] = 1;
        }
        score_ctx sc = {m, T, s, p->policy, cand, scores, ts, tb, hd,
                        p->seed ^ ((uint64_t)m->n_compact[s] << 32)};
        base_pool_run(nc >= 32 && p->policy != KEEL_COMPACT_WINDOW ? m->pool : NULL, nc, score_task, &sc);
        /* candidates by score, best last */
        int32_t *perm = knew; /* reuse as a permutation of candidate indices */
        for (int32_t i = 0; i < nc; i++) perm[i] = i;
        score_order so = {T, scores, cand};
        mem_heap_sort(perm, nc, less_score, &so);
        for (int32_t i = nc - 1; i >= 0 && want > 0; i--, want--) {
            keep[rank[perm[i]]] = 1;
            kept++;
        }
    }

    /* 3. validate the commit: renumbering, rings, room for copies */
    int32_t nk = 0;
    for (int32_t i = 0; i < n; i++) {
        knew[i] = -1;
        if (keep[i]) {
            knew[i] = p->renumber ? nk : T->pos[order[i]];
            nk++;
        }
        kst[i] = T->stamp[order[i]];
    }
    /* kept order indices sorted by stamp, for ring lookups (in cand) */
    int32_t nks = 0;
    for (int32_t i = 0; i < n; i++)
        if (keep[i]) cand[nks++] = i;
    mem_heap_sort(cand, nks, less_u64, kst);
    int32_t freed = 0, need = 0;
    for (int32_t i = 0; i < n; i++) {
        int32_t c = order[i];
        bool shared = mem_seq_count(T, c) > 1;
        if (!keep[i] && !shared) freed++;
        if (keep[i] && shared && knew[i] != T->pos[c]) need++;
    }
    if (need > T->cap - T->n_used + freed)
        return base_err(m->err, KEEL_EFULL,
                        "compact: %d kept cells shared with other sequences need copies, %d free",
                        need, T->cap - T->n_used + freed);
    int32_t next = keel_mem_seq_pos_max(m, s) + 1; /* the next query position (before renumbering) */
    if (p->renumber) {
        for (int32_t g = 0; g < m->n_groups; g++) {
            if (g == gfull || m->groups[g].kind != KEEL_MEM_LAYER_SLIDING) continue;
            mem_table *R = &m->groups[g].tables[m->n_streams == 1 ? 0 : s];
            mem_table_update_sinks(R, R->n_seq);
            int32_t rneed = 0;
            for (int32_t c = 0; c < R->cap; c++) {
                if (R->pos[c] < 0 || !mem_seq_has(R, c, s)) continue;
                int32_t oi = find_stamp(kst, cand, nks, R->stamp[c]);
                if (oi < 0) {
                    /* a ring token the compaction drops: fine if the next
                     * query would not see it anyway (the ring forgets it
                     * now instead of at the next placement) */
                    bool sink = mem_table_is_sink(R, c, s);
                    if (sink || (int64_t)R->pos[c] > (int64_t)next - R->window)
                        return base_err(m->err, KEEL_EINVAL,
                                        "compact: the sliding layers still need position %d (window "
                                        "%d, %s), which the compaction would drop: keep at least the "
                                        "window in recent tokens (recent * target >= %d) and as many "
                                        "sinks",
                                        R->pos[c], R->window, sink ? "a sink" : "recent", R->window);
                    continue;
                }
                if (mem_seq_count(R, c) > 1 && knew[oi] != R->pos[c]) rneed++;
            }
            if (rneed > R->cap - R->n_used)
                return base_err(m->err, KEEL_EFULL,
                                "compact: sliding group %d: %d shared cells need copies, %d free", g,
                                rneed, R->cap - R->n_used);
        }
    }
    /* 4. commit: anchor, evict, renumber */
    if (p->policy == KEEL_COMPACT_KEYDIFF && m->anchor_valid[s]) {
        float *x = (float *)ts, *cs = x + hd;
        for (int32_t i = 0; i < n; i++)
            if (!keep[i]) anchor_add(m, T, s, order[i], -1.0f, x, cs);
    }
    for (int32_t i = 0; i < n; i++) {
        if (keep[i]) continue;
        int32_t c = order[i];
        mem_seq_unset(T, c, s);
        if (mem_seq_empty(T, c)) mem_table_free_cell(T, c);
    }
    if (p->renumber) {
        int32_t marked = 0;
        for (int32_t i = 0; i < n; i++) {
            if (!keep[i]) continue;
            int32_t c = order[i];
            if (knew[i] == T->pos[c]) continue;
            c = mem_table_split(T, c, s);
            if (c > m->max_cell_touched) m->max_cell_touched = c;
            T->newpos[c] = knew[i];
            T->flags[c] = 1;
            marked++;
        }
        if (marked) mem_edit_marked(m, T, 0, 0, true, ts);
        for (int32_t g = 0; g < m->n_groups; g++) {
            if (g == gfull || m->groups[g].kind != KEEL_MEM_LAYER_SLIDING) continue;
            mem_table *R = &m->groups[g].tables[m->n_streams == 1 ? 0 : s];
            int32_t rm = 0;
            for (int32_t c = 0; c < R->cap; c++) {
                if (R->pos[c] < 0 || !mem_seq_has(R, c, s) || R->flags[c]) continue;
                int32_t oi = find_stamp(kst, cand, nks, R->stamp[c]);
                if (oi < 0) { /* not needed by the next query: forget it now */
                    mem_seq_unset(R, c, s);
                    if (mem_seq_empty(R, c)) mem_table_free_cell(R, c);
                    continue;
                }
                if (knew[oi] == R->pos[c]) continue;
                int32_t cell = mem_table_split(R, c, s);
                if (cell > m->max_cell_touched) m->max_cell_touched = cell;
                R->newpos[cell] = knew[oi];
                R->flags[cell] = 1;
                rm++;
            }
            if (rm) mem_edit_marked(m, R, 0, 0, true, ts);
            R->evict_max[s] = MEM_NO_EVICT; /* exact_from below bounds rewinding */
            mem_table_refresh(R);
        }
    }
    mem_table_refresh(T);
    mem_rs_after_compact(m, s);
    m->exact_from[s] = keel_mem_seq_pos_max(m, s) + 1;
    m->n_compact[s]++;
    return KEEL_OK;
}

/* ---- planning (keel_decode's all-or-nothing check) ------------------------ */

void mem_compact_est_init(keel_mem *m, int32_t s, const keel_compact_params *p, mem_compact_est *e)
{
    e->cells = keel_mem_seq_cells(m, s);
    e->shared = e->fixed = 0;
    const mem_table *T = full_table(m, s, NULL);
    if (!T || e->cells == 0) return;
    int32_t lo, hi, n_low = 0;
    mem_table_seq_extent(T, s, &lo, &hi);
    base_arena_reset(&m->scratch);
    int32_t n_sink = p->policy == KEEL_COMPACT_NONE || !p->renumber ? 0 : p->n_sink;
    /* s's cells below position n_sink, in (position, stamp) order, are the
     * first of the compaction's order: sink j stays in place iff it holds
     * position j (the batch only adds higher positions) */
    int32_t *low = n_sink > 0 ? base_arena_take_n(&m->scratch, (size_t)e->cells, sizeof(int32_t)) : NULL;
    for (int32_t c = lo; c < hi; c++) {
        if (T->pos[c] < 0 || !mem_seq_has(T, c, s)) continue;
        e->shared += mem_seq_count(T, c) > 1;
        if (low && T->pos[c] < n_sink && n_low < e->cells) low[n_low++] = c;
    }
    if (!low) return; /* no scratch: no sink counted in place (conservative) */
    mem_heap_sort(low, n_low, less_pos, T);
    for (int32_t j = 0; j < n_low && j < n_sink; j++)
        e->fixed += T->pos[low[j]] == j && mem_seq_count(T, low[j]) > 1;
}

int32_t mem_compact_est_apply(mem_compact_est *e, const keel_compact_params *p)
{
    /* kept = target exactly (cells > target): freed = own - kept own,
     * copies = kept shared cells whose position changes, so freed - copies
     * = own - target + (kept shared cells left in place) >= own - target +
     * fixed; without renumbering nothing is copied and freed >= own - target */
    int32_t own = e->cells - e->shared;
    int32_t change = own - p->target;
    if (p->renumber)
        change += e->fixed;
    else if (change < 0)
        change = 0;
    e->cells = p->target;
    e->shared = BASE_MIN(e->shared, p->target);
    e->fixed = BASE_MIN(e->fixed, e->shared);
    return change;
}
