/*
 * context.c — the public keel_context: the memory plan, opening (one pool
 * shared by the forward pass and the memory core, every buffer reserved up
 * front), keel_decode (validation, ubatch splitting, placement, forward),
 * logits.
 */
#include "engine.h"

#include <math.h>
#include <string.h>

keel_context_params keel_context_params_default(void)
{
    keel_context_params p;
    memset(&p, 0, sizeof p);
    p.n_ctx = 0;
    p.n_batch = 512;
    p.n_ubatch = 512;
    p.n_seq_max = 1;
    p.n_outputs = 0;
    p.n_threads = 0;
    p.type_k = KEEL_DTYPE_F16;
    p.type_v = KEEL_DTYPE_F16;
    p.rot_k = -1;
    p.rot_v = 0;
    p.n_sink = 0;
    p.swa_window = 0;
    p.swa_period = 2;
    p.unified = true;
    p.compact = keel_compact_params_default();
    p.n_ctx_checkpoints = -1; /* 8 with recurrent layers, else none */
    p.checkpoint_every = 0;
    return p;
}

/* A compaction setting against the model and context. */
static keel_status check_compact(const keel_model *m, const keel_context_params *p,
                                 const keel_compact_params *cp, char *err)
{
    keel_status st = keel_compact_params_check(cp, err);
    if (st != KEEL_OK || cp->policy == KEEL_COMPACT_NONE) return st;
    if (cp->trigger > p->n_ctx)
        return base_err(err, KEEL_EINVAL, "compaction trigger %d exceeds n_ctx %d", cp->trigger,
                        p->n_ctx);
    const model_hp *hp = &m->w.hp;
    bool any_full = false, any_swa = false;
    int32_t window = p->swa_window > 0 ? p->swa_window : hp->n_swa;
    for (int32_t i = 0; i < hp->n_layer; i++) {
        if (m->w.layers[i].mixer != MODEL_MIXER_ATTN && m->w.layers[i].mixer != MODEL_MIXER_MLA)
            continue; /* recurrent: no KV */
        bool swa = p->swa_window > 0 ? !(i % p->swa_period == p->swa_period - 1) : m->w.layers[i].swa;
        any_full |= !swa;
        any_swa |= swa;
    }
    if (!any_full)
        return base_err(err, KEEL_EINVAL, "compaction needs full-attention layers; %s has none",
                        hp->arch_name);
    if (cp->renumber && any_swa) {
        int32_t recent = (int32_t)ceil((double)cp->recent * cp->target);
        if (recent < window || cp->n_sink < p->n_sink)
            return base_err(err, KEEL_EINVAL,
                            "compaction with renumbering keeps %d recent tokens and %d sinks; the "
                            "sliding layers need the last %d and %d sinks (raise --kv-recent or "
                            "--kv-target, or use --kv-positions keep)",
                            recent, cp->n_sink, window, p->n_sink);
    }
    return KEEL_OK;
}

/* Resolves defaults and checks ranges; fills the memory config. */
static keel_status resolve(const keel_model *m, const keel_context_params *in,
                           keel_context_params *p, char *err)
{
    *p = *in;
    const model_hp *hp = &m->w.hp;
    if (p->n_ctx == 0) p->n_ctx = BASE_MIN(hp->n_ctx_train, 4096);
    if (p->n_ctx < 1 || p->n_ctx > (1 << 26))
        return base_err(err, KEEL_EINVAL, "n_ctx %d (need 1..2^26)", p->n_ctx);
    if (p->n_batch < 1 || p->n_batch > (1 << 20))
        return base_err(err, KEEL_EINVAL, "n_batch %d (need 1..2^20)", p->n_batch);
    if (p->n_ubatch < 1 || p->n_ubatch > p->n_batch) p->n_ubatch = BASE_MIN(p->n_batch, 512);
    if (p->n_ubatch > p->n_ctx) p->n_ubatch = p->n_ctx;
    if (p->n_seq_max < 1 || p->n_seq_max > MEM_SEQ_MAX)
        return base_err(err, KEEL_EINVAL, "n_seq_max %d (need 1..%d)", p->n_seq_max, MEM_SEQ_MAX);
    if (p->n_outputs == 0) p->n_outputs = p->n_seq_max;
    if (p->n_outputs < 1 || p->n_outputs > p->n_batch)
        return base_err(err, KEEL_EINVAL, "n_outputs %d (need 1..n_batch %d)", p->n_outputs, p->n_batch);
    if (p->n_threads < 0 || p->n_threads > 256)
        return base_err(err, KEEL_EINVAL, "n_threads %d (need 0..256)", p->n_threads);
    if (p->n_threads == 0) p->n_threads = keel_cpu_count();
    if (p->n_sink < 0) return base_err(err, KEEL_EINVAL, "n_sink %d", p->n_sink);
    if (p->swa_window < 0 || (p->swa_window > 0 && p->swa_period < 1))
        return base_err(err, KEEL_EINVAL, "swa_window %d / swa_period %d", p->swa_window, p->swa_period);
    if (p->n_ctx_checkpoints < -1 || p->n_ctx_checkpoints > 4096)
        return base_err(err, KEEL_EINVAL, "n_ctx_checkpoints %d (need 0..4096, or -1: the default)",
                        p->n_ctx_checkpoints);
    if (p->checkpoint_every < 0 || p->checkpoint_every > (1 << 26))
        return base_err(err, KEEL_EINVAL, "checkpoint_every %d (need 0..2^26)", p->checkpoint_every);
    /* recurrent states rewind only through checkpoints: 8 by default; an
     * attention model's (ring rows, only with sliding layers) are sized in
     * prepare() */
    if (p->n_ctx_checkpoints < 0 && hp->n_recurrent > 0) p->n_ctx_checkpoints = 8;
    return check_compact(m, p, &p->compact, err);
}

/* phi3 LongRoPE: the long factors when a sequence may hold more positions
 * than the original context (llama.cpp's n_ctx_seq: n_ctx, divided among
 * the sequences unless unified). */
static bool ctx_rope_long(const keel_model *m, const keel_context_params *p)
{
    int32_t n_seq = p->unified || p->n_seq_max < 1 ? 1 : p->n_seq_max;
    return model_rope_long(&m->w, p->n_ctx / n_seq);
}

typedef struct ctx_sizes {
    keel_mem_config mc;
    keel_mem_layer *layers; /* caller's buffer */
    size_t mem, work, logits, small, total;
} ctx_sizes;

static keel_status sizes(const keel_model *m, const keel_context_params *p, ctx_sizes *z, char *err)
{
    const model_hp *hp = &m->w.hp;
    model_mem_layers(&m->w, p->type_k, p->type_v, p->rot_k, p->rot_v, p->n_sink, p->swa_window,
                     p->swa_period, ctx_rope_long(m, p), z->layers);
    z->mc = keel_mem_config_default();
    z->mc.layers = z->layers;
    z->mc.n_layers = hp->n_layer;
    z->mc.n_seq_max = p->n_seq_max;
    z->mc.n_ctx = p->n_ctx;
    z->mc.unified = p->unified;
    z->mc.n_batch_max = p->n_ubatch;
    z->mc.n_threads = p->n_threads;
    z->mc.deterministic = p->deterministic;
    bool sliding = false;
    for (int32_t i = 0; i < hp->n_layer; i++) sliding |= z->layers[i].kind == KEEL_MEM_LAYER_SLIDING;
    z->mc.n_ckpt = hp->n_recurrent > 0 || sliding ? p->n_ctx_checkpoints : 0; /* full attention needs none */
    z->mc.spec_snapshot = p->speculative;
    keel_status st = mem_config_bytes_shared(&z->mc, &z->mem, err);
    if (st != KEEL_OK) return st;
    z->work = model_work_bytes(&m->w, p->n_ubatch, p->n_threads);
    if (!size_mul((size_t)p->n_outputs * sizeof(float), (size_t)hp->n_vocab, &z->logits))
        return base_err(err, KEEL_EOVERFLOW, "logits buffer overflows");
    /* out_row [n_batch], pos/seq of the batch [n_batch] x 2, cells [n_groups][n_ubatch], out idx [n_ubatch] */
    /* + the speculative batch's tokens, sequences and positions, and a
     * rewind's tokens and sequences [n_batch] x 5 */
    z->small = ((size_t)p->n_batch * 8 + (size_t)p->n_ubatch * 3 + 64) * sizeof(int32_t) +
               (size_t)p->n_batch + (size_t)p->n_seq_max * sizeof(keel_compact_params) + 2 * BASE_ALIGN;
    size_t work_cap; /* base_arena_init rounds its reservation up */
    if (!size_align_up(z->work, BASE_ALIGN, &work_cap)) return base_err(err, KEEL_EOVERFLOW, "work arena overflows");
    z->total = sizeof(keel_context) + z->mem + work_cap + z->logits + z->small +
               base_pool_bytes(p->n_threads);
    return KEEL_OK;
}

/* Resolves the parameters and sizes everything; z->layers is allocated
 * (layers_bytes) and must be freed by the caller on success. */
static keel_status prepare(const keel_model *m, const keel_context_params *in,
                           keel_context_params *p, ctx_sizes *z, size_t *layers_bytes, char *err)
{
    keel_status st = resolve(m, in, p, err);
    if (st != KEEL_OK) return st;
    *layers_bytes = (size_t)m->w.hp.n_layer * sizeof(keel_mem_layer);
    z->layers = base_alloc(*layers_bytes);
    if (!z->layers) return base_err(err, KEEL_ENOMEM, "out of memory");
    if (p->n_ctx_checkpoints < 0) {
        /* automatic on an attention model: ring checkpoints (a copy of every
         * sliding ring each, reserved at open) where up to 8 of them cost
         * at most a quarter of the KV cache, else none */
        p->n_ctx_checkpoints = 1;
        st = sizes(m, p, z, err);
        int32_t n = 0;
        if (st == KEEL_OK) {
            size_t rs, ck, kv = mem_config_kv_bytes(&z->mc);
            mem_config_rs_bytes(&z->mc, &rs, &ck);
            if (ck > 0) n = (int32_t)BASE_MIN((size_t)8, kv / 4 / ck);
        }
        p->n_ctx_checkpoints = n;
    }
    st = sizes(m, p, z, err);
    if (st != KEEL_OK) {
        base_free(z->layers, *layers_bytes);
        z->layers = NULL;
    }
    return st;
}

static void fill_plan(const keel_model *m, const ctx_sizes *z, keel_plan *out)
{
    out->weights_mapped = m->file_bytes;
    out->kv_bytes = mem_config_kv_bytes(&z->mc);
    out->mem_bytes = z->mem;
    out->work_bytes = z->work;
    out->logits_bytes = z->logits;
    out->total_bytes = z->total;
    mem_config_rs_bytes(&z->mc, &out->rs_bytes, &out->ckpt_bytes);
}

keel_status keel_context_plan(const keel_model *m, const keel_context_params *in, keel_plan *out,
                              char *err)
{
    if (!m || !in || !out) return KEEL_EINVAL;
    keel_context_params p;
    ctx_sizes z;
    size_t lb;
    keel_status st = prepare(m, in, &p, &z, &lb, err);
    if (st != KEEL_OK) return st;
    fill_plan(m, &z, out);
    base_free(z.layers, lb);
    return KEEL_OK;
}

keel_status keel_context_open(const keel_model *m, const keel_context_params *in,
                              keel_context **out, char *err)
{
    if (!out) return KEEL_EINVAL;
    *out = NULL;
    if (!m || !in) return base_err(err, KEEL_EINVAL, "model or params is NULL");
    keel_context_params p;
    ctx_sizes z;
    size_t lb;
    keel_status st = prepare(m, in, &p, &z, &lb, err);
    if (st != KEEL_OK) return st;
    keel_context *c = base_calloc(1, sizeof *c);
    if (!c) {
        st = base_err(err, KEEL_ENOMEM, "out of memory");
        goto fail;
    }
    c->model = m;
    c->p = p;
    st = base_pool_open(p.n_threads, &c->pool);
    if (st != KEEL_OK) {
        base_err(err, st, "cannot start %d threads", p.n_threads);
        goto fail;
    }
    st = mem_open_shared(&z.mc, c->pool, &c->mem, err);
    if (st != KEEL_OK) goto fail;
    st = base_arena_init(&c->work, z.work);
    if (st != KEEL_OK) {
        base_err(err, st, "cannot reserve %zu bytes of work memory", z.work);
        goto fail;
    }
    c->logits = base_alloc(z.logits);
    c->logits_bytes = z.logits;
    c->out_row = base_alloc(z.small);
    c->small_bytes = z.small;
    if (!c->logits || !c->out_row) {
        st = base_err(err, KEEL_ENOMEM, "cannot allocate logits (%zu bytes)", z.logits);
        goto fail;
    }
    c->ub_pos = c->out_row + p.n_batch;
    c->ub_seq = c->ub_pos + p.n_batch;
    c->ub_cells = c->ub_seq + p.n_batch;
    c->ub_out = c->ub_cells + 2 * (size_t)p.n_ubatch;
    c->spec_tok = c->ub_out + p.n_ubatch;
    c->spec_seq = c->spec_tok + p.n_batch;
    c->spec_pos = c->spec_seq + p.n_batch;
    c->re_tok = c->spec_pos + p.n_batch;
    c->re_seq = c->re_tok + p.n_batch;
    {
        uint8_t *tail = (uint8_t *)(c->re_seq + p.n_batch);
        size_t off = (size_t)(tail - (uint8_t *)c->out_row);
        off = (off + BASE_ALIGN - 1) & ~(size_t)(BASE_ALIGN - 1);
        c->compact = (keel_compact_params *)((uint8_t *)c->out_row + off);
        c->ub_prot = (uint8_t *)(c->compact + p.n_seq_max);
        for (int32_t s = 0; s < p.n_seq_max; s++) c->compact[s] = p.compact;
    }
    c->n_groups = keel_mem_n_groups(c->mem);
    if (c->n_groups > 2) {
        st = base_err(err, KEEL_EINTERNAL, "%d layer groups (at most 2 supported)", c->n_groups);
        goto fail;
    }
    fill_plan(m, &z, &c->plan);
    base_free(z.layers, lb);
    z.layers = NULL;
    *out = c;
    return KEEL_OK;
fail:
    if (z.layers) base_free(z.layers, lb);
    keel_context_close(c);
    return st;
}

void keel_context_close(keel_context *c)
{
    if (!c) return;
    keel_mem_close(c->mem);
    base_pool_close(c->pool);
    base_arena_free(&c->work);
    base_free(c->logits, c->logits_bytes);
    base_free(c->out_row, c->small_bytes);
    base_free(c, sizeof *c);
}

const char *keel_context_last_error(const keel_context *c)
{
    return c ? c->err : "context is NULL";
}

void keel_context_plan_get(const keel_context *c, keel_plan *out)
{
    if (c) *out = c->plan;
}

keel_mem *keel_context_memory(keel_context *c)
{
    return c ? c->mem : NULL;
}

void keel_cancel(keel_context *c)
{
    if (c) atomic_store(&c->cancel, 1);
}

/* Positions of tokens [from, to): each continues its sequence, from the
 * previous token of the sequence in that range or else from pmax[s] (the
 * plan's) or, pmax NULL, the memory. KEEL_ERANGE (nothing placed yet)
 * when a position would reach INT32_MAX (the memory's positions are
 * 0..INT32_MAX-1): without renumbering, the positions of a long session
 * only grow. */
static keel_status continue_positions(keel_context *c, int32_t from, int32_t to, const int32_t *pmax)
{
    for (int32_t i = from; i < to; i++) {
        int32_t s = c->ub_seq[i], prev = -1;
        for (int32_t j = i - 1; j >= from && prev < 0; j--)
            if (c->ub_seq[j] == s) prev = c->ub_pos[j];
        if (prev < 0) prev = pmax ? pmax[s] : keel_mem_seq_pos_max(c->mem, s);
        if (prev >= INT32_MAX - 1)
            return base_err(c->err, KEEL_ERANGE,
                            "decode: sequence %d: position %d is the last one (positions are int32; "
                            "compaction with renumbering keeps them small)",
                            s, prev);
        c->ub_pos[i] = prev + 1;
    }
    return KEEL_OK;
}

/* Tokens of the ubatch that starts at batch token start: ub at most, cut
 * before a prompt's token at a multiple of checkpoint_every (a periodic
 * checkpoint at position P is taken after the ubatch that ends just before
 * the token at P). */
static int32_t ubatch_len(const keel_context *c, int32_t start, int32_t n, int32_t ub, bool ckpt,
                          const uint8_t *prompt)
{
    int32_t m = BASE_MIN(ub, n - start), every = c->p.checkpoint_every;
    for (int32_t i = start + 1; ckpt && every > 0 && i < start + m; i++)
        if (prompt[c->ub_seq[i]] && c->ub_pos[i] % every == 0) return i - start;
    return m;
}

/*
 * All or nothing (design.md rule 6): before the first ubatch changes
 * anything, walks the ubatches as keel_decode will cut them and checks
 * that every one fits: the recurrent state slots of the whole batch (a
 * slot, once made a sequence's own, stays its own), the compactions each
 * ubatch triggers (what they free and the copies they need, counting the
 * cells they share with other sequences: mem_compact_est_apply, exact
 * unless a policy keeps shared cells in place, else conservative), the
 * cells each ubatch takes, and the positions placement will accept. It
 * writes the positions it continues to ub_pos (the caller restores
 * them). Not planned: the sliding rings' room for copies of shared ring
 * cells a renumbering compaction moves (keel_mem_compact still checks it
 * itself).
 */
static keel_status plan_batch(keel_context *c, const keel_batch *b, int32_t ub, bool ckpt,
                              const uint8_t *prompt)
{
    int32_t n = b->n_tokens, ns = c->p.n_seq_max, n_room = c->p.unified ? 1 : ns;
    keel_mem_batch whole = {n, c->ub_pos, c->ub_seq, NULL, NULL, NULL};
    keel_status st = mem_rs_place_check(c->mem, &whole);
    if (st != KEEL_OK)
        return base_err(c->err, st, "decode: %s%s; nothing changed",
                        st == KEEL_EFULL ? "context full: " : "", keel_mem_last_error(c->mem));
    int32_t pmax[MEM_SEQ_MAX], cells[MEM_SEQ_MAX], cnt[MEM_SEQ_MAX];
    int64_t room[MEM_SEQ_MAX];
    uint8_t known[MEM_SEQ_MAX];
    mem_compact_est est[MEM_SEQ_MAX];
    for (int32_t s = 0; s < ns; s++) {
        pmax[s] = keel_mem_seq_pos_max(c->mem, s);
        cells[s] = keel_mem_seq_cells(c->mem, s);
        cnt[s] = 0;
        known[s] = 0;
    }
    for (int32_t k = 0; k < n_room; k++) room[k] = mem_room(c->mem, k);
    for (int32_t start = 0, m = 0; start < n; start += m) {
        m = ubatch_len(c, start, n, ub, ckpt, prompt);
        for (int32_t i = start; i < start + m; i++) cnt[c->ub_seq[i]]++;
        /* the compactions before the ubatch, in keel_decode's order */
        for (int32_t i = start; i < start + m; i++) {
            int32_t s = c->ub_seq[i], k = c->p.unified ? 0 : s;
            const keel_compact_params *cp = &c->compact[s];
            if (cp->policy == KEEL_COMPACT_NONE || cells[s] + cnt[s] <= cp->trigger) continue;
            if (!known[s]) { /* the cells placed so far in the plan are its own */
                mem_compact_est_init(c->mem, s, cp, &est[s]);
                known[s] = 1;
            }
            est[s].cells = cells[s];
            int32_t change = mem_compact_est_apply(&est[s], cp);
            if (room[k] + change < 0)
                return base_err(c->err, KEEL_EFULL,
                                "decode: context full (n_ctx %d): compacting sequence %d before batch "
                                "token %d takes %d cells more than it frees (the kept cells it "
                                "shares with other sequences are copied, the evicted ones stay "
                                "theirs), %lld free; nothing changed",
                                c->p.n_ctx, s, i, -change, (long long)room[k]);
            room[k] += change;
            cells[s] = est[s].cells;
            if (cp->renumber) pmax[s] = cp->target - 1; /* kept positions 0..target-1 */
        }
        if (!b->pos) {
            st = continue_positions(c, start, start + m, pmax);
            if (st != KEEL_OK) return st;
        }
        /* placement: continuing positions, then the cells */
        for (int32_t i = start; i < start + m; i++) {
            int32_t s = c->ub_seq[i], p = c->ub_pos[i];
            if (p < 0 || p == INT32_MAX)
                return base_err(c->err, KEEL_EINVAL, "decode: token %d has position %d", i, p);
            if (pmax[s] >= 0 && p != pmax[s] + 1)
                return base_err(c->err, KEEL_EINVAL,
                                "decode: token %d: sequence %d continues at position %d, got %d "
                                "(position gap or reorder%s); nothing changed",
                                i, s, pmax[s] + 1, p,
                                c->compact[s].policy != KEEL_COMPACT_NONE && c->compact[s].renumber
                                    ? ", or positions renumbered by a compaction in the batch"
                                    : "");
            pmax[s] = p;
        }
        for (int32_t i = start; i < start + m; i++) {
            int32_t s = c->ub_seq[i];
            room[c->p.unified ? 0 : s]--;
            cells[s]++;
            cnt[s] = 0;
        }
        for (int32_t k = 0; k < n_room; k++)
            if (room[k] < 0)
                return base_err(c->err, KEEL_EFULL,
                                "decode: context full (n_ctx %d): batch tokens %d..%d are %lld cells "
                                "short%s; nothing changed",
                                c->p.n_ctx, start, start + m - 1, (long long)-room[k],
                                c->p.unified ? "" : " in their sequence's stream");
    }
    return KEEL_OK;
}

/* Logit rows [row0, row0 + nout) of a ubatch must be finite: NaN or
 * infinite logits come from invalid weights or hyperparameters, and a
 * sampler fed with them fails far from the cause. */
static keel_status check_logits(keel_context *c, int32_t start, int32_t row0, int32_t nout)
{
    size_t V = (size_t)c->model->w.hp.n_vocab;
    for (int32_t j = 0; j < nout; j++) {
        const float *row = c->logits + (size_t)(row0 + j) * V;
        uint32_t bad = 0;
        for (size_t v = 0; v < V; v++) {
            uint32_t u;
            memcpy(&u, &row[v], sizeof u);
            bad |= (u & 0x7f800000u) == 0x7f800000u; /* exponent all ones: inf or NaN */
        }
        if (!bad) continue;
        bool nan = false;
        for (size_t v = 0; v < V && !nan; v++) nan = isnan(row[v]);
        int32_t i = start + c->ub_out[j];
        return base_err(c->err, KEEL_EFORMAT,
                        "decode: logits are %s at position %d (sequence %d, batch token %d): the "
                        "model's weights or hyperparameters are invalid",
                        nan ? "NaN" : "infinite", c->ub_pos[i], c->ub_seq[i], i);
    }
    return KEEL_OK;
}

/* keel_decode, and keel_decode_spec (spec[s]: sequence s's tokens are
 * drafts: no prompt checkpoint; the snapshots are the caller's). */
static keel_status decode(keel_context *c, const keel_batch *b, const uint8_t *spec)
{
    c->err[0] = 0;
    atomic_store(&c->cancel, 0);
    if (!b || !b->tokens) return base_err(c->err, KEEL_EINVAL, "decode: batch or tokens is NULL");
    const model_hp *hp = &c->model->w.hp;
    int32_t n = b->n_tokens;
    if (n < 1 || n > c->p.n_batch)
        return base_err(c->err, KEEL_EINVAL, "decode: %d tokens (need 1..n_batch %d)", n, c->p.n_batch);
    int32_t n_out = 0;
    c->n_last = 0;
    for (int32_t i = 0; i < n; i++) {
        int32_t t = b->tokens[i];
        if (t < 0 || t >= hp->n_vocab)
            return base_err(c->err, KEEL_EINVAL, "decode: token %d: id %d out of range (n_vocab %d)",
                            i, t, hp->n_vocab);
        int32_t s = b->seq ? b->seq[i] : 0;
        if (s < 0 || s >= c->p.n_seq_max)
            return base_err(c->err, KEEL_EINVAL, "decode: token %d: sequence %d out of range (n_seq_max %d)",
                            i, s, c->p.n_seq_max);
        bool want = b->logits ? b->logits[i] != 0 : i == n - 1;
        c->out_row[i] = want ? n_out++ : -1;
        c->ub_seq[i] = s;
    }
    if (n_out > c->p.n_outputs)
        return base_err(c->err, KEEL_EINVAL, "decode: %d logit rows requested (n_outputs %d)", n_out,
                        c->p.n_outputs);
    /* positions: given, or each sequence continues */
    if (b->pos) {
        memcpy(c->ub_pos, b->pos, (size_t)n * sizeof(int32_t));
    } else {
        keel_status st = continue_positions(c, 0, n, NULL);
        if (st != KEEL_OK) return st;
    }
    /* ubatch size: with compaction, a ubatch must fit between target and
     * trigger, so compacting before it keeps every sequence <= trigger */
    int32_t ub = c->p.n_ubatch;
    bool any_compact = false;
    for (int32_t i = 0; i < n; i++) {
        const keel_compact_params *cp = &c->compact[c->ub_seq[i]];
        if (cp->policy == KEEL_COMPACT_NONE) continue;
        any_compact = true;
        ub = BASE_MIN(ub, cp->trigger - cp->target);
    }
    const text_tokenizer *tok = c->model->tok;
    for (int32_t i = 0; i < n; i++) {
        text_token_type tt = text_token_get_type(tok, b->tokens[i]);
        c->ub_prot[i] = tt == TEXT_TOKEN_CONTROL || tt == TEXT_TOKEN_USER_DEFINED;
    }
    int32_t row0 = 0, every = c->p.checkpoint_every;
    bool ckpt = keel_mem_ckpt_record_bytes(c->mem) > 0;
    /* sequences given several tokens: a prompt, checkpointed at its end */
    uint8_t prompt[MEM_SEQ_MAX];
    memset(prompt, 0, sizeof prompt);
    for (int32_t i = 0, cnt[MEM_SEQ_MAX] = {0}; ckpt && i < n; i++)
        if (++cnt[c->ub_seq[i]] > 1 && !(spec && spec[c->ub_seq[i]])) prompt[c->ub_seq[i]] = 1;
    /* all or nothing: every ubatch must fit before the first one changes
     * anything; the plan continues positions, so they start over */
    {
        keel_status st = plan_batch(c, b, ub, ckpt, prompt);
        if (st == KEEL_OK && !b->pos) st = continue_positions(c, 0, n, NULL);
        if (st != KEEL_OK) return st;
    }
    for (int32_t start = 0, m = 0; start < n; start += m) {
        m = ubatch_len(c, start, n, ub, ckpt, prompt);
        if (any_compact) {
            /* bounded prefill: compact every sequence this ubatch would push
             * past its trigger, between chunks */
            for (int32_t i = 0; i < m; i++) {
                int32_t s = c->ub_seq[start + i];
                const keel_compact_params *cp = &c->compact[s];
                if (cp->policy == KEEL_COMPACT_NONE) continue;
                int32_t cnt = 0;
                for (int32_t j = 0; j < m; j++) cnt += c->ub_seq[start + j] == s;
                if (keel_mem_seq_cells(c->mem, s) + cnt <= cp->trigger) continue;
                keel_status st = keel_mem_compact(c->mem, s, cp);
                if (st != KEEL_OK)
                    return base_err(c->err, st, "decode: compaction of sequence %d: %s", s,
                                    keel_mem_last_error(c->mem));
            }
            /* positions of sequences renumbered by the compaction continue */
            if (!b->pos) {
                keel_status st = continue_positions(c, start, start + m, NULL);
                if (st != KEEL_OK) return st;
            }
        }
        keel_mem_batch mb = {m, c->ub_pos + start, c->ub_seq + start, NULL, NULL, c->ub_prot + start};
        keel_status st = keel_mem_place(c->mem, &mb, c->ub_cells);
        if (st != KEEL_OK) {
            if (st == KEEL_EFULL)
                return base_err(c->err, st, "decode: context full (n_ctx %d): %s", c->p.n_ctx,
                                keel_mem_last_error(c->mem));
            return base_err(c->err, st, "decode: %s", keel_mem_last_error(c->mem));
        }
        int32_t nout = 0;
        for (int32_t i = 0; i < m; i++)
            if (c->out_row[start + i] >= 0) c->ub_out[nout++] = i;
        model_ubatch mu = {m, b->tokens + start, c->ub_pos + start, c->ub_seq + start,
                           c->ub_cells, nout, c->ub_out,
                           c->logits + (size_t)row0 * (size_t)hp->n_vocab, c->p.deterministic,
                           ctx_rope_long(c->model, &c->p)};
        st = model_forward(&c->model->w, c->mem, &mu, c->pool, &c->work, &c->cancel, c->err);
        if (st != KEEL_OK && hp->n_recurrent > 0 && st != KEEL_ECANCELED) {
            /* a failure inside the chunk left some layers' states updated:
             * drop the chunk's sequences rather than keep half a state */
            for (int32_t i = 0; i < m; i++) {
                keel_status st2 = keel_mem_seq_rm(c->mem, c->ub_seq[start + i], -1, -1);
                if (st2 != KEEL_OK) break; /* removing a whole sequence cannot fail */
            }
            return st;
        }
        if (st == KEEL_OK) st = check_logits(c, start, row0, nout);
        if (st != KEEL_OK) return st;
        row0 += nout;
        c->n_last = start + m;
        if (ckpt && every > 0)
            for (int32_t i = start; i < start + m; i++) {
                int32_t s = c->ub_seq[i];
                if (!prompt[s] || (keel_mem_seq_pos_max(c->mem, s) + 1) % every != 0) continue;
                if ((st = keel_mem_ckpt_take(c->mem, s)) != KEEL_OK)
                    return base_err(c->err, st, "decode: checkpoint of sequence %d: %s", s,
                                    keel_mem_last_error(c->mem));
            }
    }
    for (int32_t s = 0; ckpt && s < c->p.n_seq_max; s++) {
        if (!prompt[s]) continue;
        keel_status st = keel_mem_ckpt_take(c->mem, s); /* a no-op where one was just taken */
        if (st != KEEL_OK)
            return base_err(c->err, st, "decode: checkpoint of sequence %d: %s", s,
                            keel_mem_last_error(c->mem));
    }
    return KEEL_OK;
}

keel_status keel_decode(keel_context *c, const keel_batch *b)
{
    if (!c) return KEEL_EINVAL;
    c->spec_n = 0;
    return decode(c, b, NULL);
}

keel_status keel_decode_spec(keel_context *c, const keel_batch *b)
{
    if (!c) return KEEL_EINVAL;
    c->err[0] = 0;
    c->spec_n = 0;
    if (!b || !b->tokens) return base_err(c->err, KEEL_EINVAL, "decode_spec: batch or tokens is NULL");
    int32_t n = b->n_tokens;
    if (n < 1 || n > c->p.n_batch)
        return base_err(c->err, KEEL_EINVAL, "decode_spec: %d tokens (need 1..n_batch %d)", n, c->p.n_batch);
    if (b->pos) return base_err(c->err, KEEL_EINVAL, "decode_spec: positions must continue each sequence (pos NULL)");
    /* a sequence of two or more tokens that all ask for logits is drafted */
    int32_t cnt[MEM_SEQ_MAX] = {0};
    uint8_t spec[MEM_SEQ_MAX], all[MEM_SEQ_MAX];
    memset(all, 1, sizeof all);
    for (int32_t i = 0; i < n; i++) {
        int32_t s = b->seq ? b->seq[i] : 0;
        if (s < 0 || s >= c->p.n_seq_max)
            return base_err(c->err, KEEL_EINVAL, "decode_spec: token %d: sequence %d out of range (n_seq_max %d)", i,
                            s, c->p.n_seq_max);
        cnt[s]++;
        if (!(b->logits ? b->logits[i] != 0 : i == n - 1)) all[s] = 0;
    }
    bool rec = keel_mem_is_recurrent(c->mem);
    for (int32_t s = 0; s < c->p.n_seq_max; s++) {
        spec[s] = cnt[s] > 1 && all[s];
        if (!spec[s]) continue;
        if (rec && !c->p.speculative)
            return base_err(c->err, KEEL_EUNSUPPORTED,
                            "decode_spec: a model with recurrent layers needs the context opened with "
                            "speculative (a state snapshot per sequence)");
        /* a compaction inside the batch would make its tail impossible to
         * take back exactly: the caller drafts only below the trigger */
        const keel_compact_params *cp = &c->compact[s];
        if (cp->policy != KEEL_COMPACT_NONE && keel_mem_seq_cells(c->mem, s) + cnt[s] > cp->trigger)
            return base_err(c->err, KEEL_EFULL,
                            "decode_spec: sequence %d would pass its compaction trigger (%d cells + %d "
                            "tokens > %d): decode fewer drafts",
                            s, keel_mem_seq_cells(c->mem, s), cnt[s], cp->trigger);
    }
    /* the snapshots come first; they change nothing a failed decode must
     * undo (only a rewind reads one) */
    for (int32_t s = 0; rec && s < c->p.n_seq_max; s++) {
        if (!spec[s] || keel_mem_seq_pos_max(c->mem, s) < 0) continue;
        keel_status st = keel_mem_spec_save(c->mem, s);
        if (st != KEEL_OK) return base_err(c->err, st, "decode_spec: %s", keel_mem_last_error(c->mem));
    }
    int32_t pmax[MEM_SEQ_MAX];
    for (int32_t s = 0; s < c->p.n_seq_max; s++) pmax[s] = cnt[s] ? keel_mem_seq_pos_max(c->mem, s) : -1;
    keel_status st = decode(c, b, spec);
    if (st != KEEL_OK) return st;
    for (int32_t i = 0; i < n; i++) {
        int32_t s = b->seq ? b->seq[i] : 0;
        c->spec_tok[i] = b->tokens[i];
        c->spec_seq[i] = spec[s] ? s : -1;
        c->spec_pos[i] = ++pmax[s];
    }
    c->spec_n = n;
    return KEEL_OK;
}

/* A rewind of a recurrent sequence into the last speculative batch: the
 * snapshot restored, the batch's tokens below p0 decoded again. */
static keel_status rewind_spec(keel_context *c, int32_t seq, int32_t p0)
{
    int32_t p = keel_mem_spec_pos(c->mem, seq), end = keel_mem_seq_pos_max(c->mem, seq) + 1;
    if (c->spec_n == 0 || p < 0 || p0 < p || p0 >= end) return KEEL_ENOENT;
    /* the tokens of seq at positions [p, p0), in order, from the batch */
    int32_t m = 0;
    for (int32_t i = 0; i < c->spec_n; i++)
        if (c->spec_seq[i] == seq && c->spec_pos[i] >= p && c->spec_pos[i] < p0) {
            c->re_tok[m] = c->spec_tok[i];
            c->re_seq[m++] = seq;
        }
    if (m != p0 - p) return KEEL_ENOENT; /* the batch does not hold them all */
    keel_status st = keel_mem_spec_restore(c->mem, seq, NULL);
    if (st == KEEL_ESTATE) return KEEL_ENOENT; /* nothing changed: the usual rewind */
    if (st != KEEL_OK) return base_err(c->err, st, "rewind: %s", keel_mem_last_error(c->mem));
    for (int32_t i = 0; i < c->spec_n; i++)
        if (c->spec_seq[i] == seq) c->spec_seq[i] = -1; /* the other sequences' stay */
    if (m == 0) return KEEL_OK;
    keel_batch b = {m, c->re_tok, NULL, c->re_seq, NULL};
    uint8_t spec[MEM_SEQ_MAX] = {0};
    spec[seq] = 1;
    st = decode(c, &b, spec);
    if (st != KEEL_OK) {
        /* half a state is no state: the sequence starts over */
        keel_status st2 = keel_mem_seq_rm(c->mem, seq, -1, -1);
        if (st2 != KEEL_OK) return base_err(c->err, st2, "rewind: %s", keel_mem_last_error(c->mem));
    }
    return st;
}

keel_status keel_context_rewind(keel_context *c, int32_t seq, int32_t p0, int32_t *resume)
{
    if (resume) *resume = 0;
    if (!c) return KEEL_EINVAL;
    c->err[0] = 0;
    if (seq < 0 || seq >= c->p.n_seq_max)
        return base_err(c->err, KEEL_EINVAL, "rewind: sequence %d out of range (n_seq_max %d)", seq,
                        c->p.n_seq_max);
    if (p0 < 0) p0 = 0;
    keel_status st;
    if (keel_mem_is_recurrent(c->mem) && (st = rewind_spec(c, seq, p0)) != KEEL_ENOENT) {
        /* into the last speculative batch: its snapshot, its tokens again */
        if (st != KEEL_OK) {
            if (resume) *resume = keel_mem_seq_pos_max(c->mem, seq) + 1;
            return st;
        }
    } else if (keel_mem_is_recurrent(c->mem)) {
        st = keel_mem_seq_rm(c->mem, seq, p0, -1);
    } else if (p0 >= keel_mem_seq_rewind_min(c->mem, seq)) {
        st = keel_mem_seq_rm(c->mem, seq, p0, -1); /* exact */
    } else {
        /* the rings forgot tokens the query at p0 needs: a checkpoint of
         * them at or before p0 */
        st = keel_mem_ckpt_restore(c->mem, seq, p0, NULL);
    }
    if (st == KEEL_ESTATE) /* no checkpoint covers p0: recompute from the start */
        st = keel_mem_seq_rm(c->mem, seq, -1, -1);
    if (st != KEEL_OK) return base_err(c->err, st, "rewind: %s", keel_mem_last_error(c->mem));
    if (resume) *resume = keel_mem_seq_pos_max(c->mem, seq) + 1;
    return KEEL_OK;
}

keel_status keel_context_set_compact(keel_context *c, int32_t seq, const keel_compact_params *p)
{
    if (!c) return KEEL_EINVAL;
    c->err[0] = 0;
    if (seq >= c->p.n_seq_max)
        return base_err(c->err, KEEL_EINVAL, "set_compact: sequence %d out of range", seq);
    keel_status st = check_compact(c->model, &c->p, p, c->err);
    if (st != KEEL_OK) return st;
    for (int32_t s = 0; s < c->p.n_seq_max; s++)
        if (seq < 0 || s == seq) c->compact[s] = *p;
    return KEEL_OK;
}

const float *keel_logits(const keel_context *c, int32_t i)
{
    if (!c || i < 0 || i >= c->n_last || c->out_row[i] < 0) return NULL;
    return c->logits + (size_t)c->out_row[i] * (size_t)c->model->w.hp.n_vocab;
}
