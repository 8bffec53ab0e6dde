/*
 * eng_slots.c — what the engine keeps of a slot beyond its live cache:
 * slot actions (save to a file, restore from one, erase: the server's
 * /slots) and the RAM prompt cache (a slot's cache kept as a session blob
 * when another conversation takes the slot, restored when a prompt with its
 * prefix comes back), both through keel_mem_save / keel_mem_load.
 *
 * Invariants: the prompt cache never holds more than pc_limit bytes (blob
 * and token history counted before they are allocated; least recently used
 * entries go first); an entry is restored only into an idle slot and only
 * when the memory validated it (keel_mem_load is all or nothing); a slot's
 * history and its memory agree after every action (on any failure the slot
 * is emptied rather than left with a partial state).
 */
#include "eng.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static keel_mem *mem_of(keel_engine *e)
{
    return keel_context_memory(e->ctx);
}

/* After a load of n history tokens (pending of them not in the cache) into
 * the slot: its history is what the cache holds; pending tokens (a file from
 * keel run) are the next prompt's to decode. */
static void slot_loaded(keel_engine *e, eng_slot *sl, int32_t n, int32_t pending)
{
    keel_mem *mem = mem_of(e);
    sl->n_hist = n - pending;
    sl->hist_lost = false;
    sl->hist_compacted = keel_mem_seq_compactions(mem, sl->seq) > 0 || mem->exact_from[sl->seq] > 0;
}

/* Loads blob into the slot; on success the slot's history is the blob's. */
keel_status eng_slot_load_blob(keel_engine *e, eng_slot *sl, const uint8_t *blob, size_t len, char *err)
{
    keel_mem *mem = mem_of(e);
    int32_t n = 0;
    int32_t pending = 0;
    /* the history must be the cells' and every id in the vocabulary */
    const mem_load_rules rules = {e->model->w.hp.n_vocab, true};
    keel_status st = mem_session_load(mem, sl->seq, blob, len, e->fingerprint, 0, &rules, sl->hist, e->hist_cap, &n,
                                      &pending);
    if (st != KEEL_OK) return base_err(err, st, "restore: %s", keel_mem_last_error(mem));
    slot_loaded(e, sl, n, pending);
    return KEEL_OK;
}

/* ---- actions ---------------------------------------------------------------------- */

static keel_status info_json(eng_ctl *c, json_t *o)
{
    if (!o) return KEEL_ENOMEM;
    keel_status st = KEEL_OK;
    if (c->info) {
        char *s = json_dumps(o, JSON_COMPACT);
        if (!s)
            st = KEEL_ENOMEM;
        else if (strlen(s) + 1 > c->info_cap)
            st = KEEL_ERANGE;
        else
            memcpy(c->info, s, strlen(s) + 1);
        chat_json_free(s);
    }
    json_decref(o);
    return st;
}

static void run_one(keel_engine *e, eng_ctl *c)
{
    if (c->slot < 0 || c->slot >= e->n_slots) {
        c->status = base_err(c->err, KEEL_EINVAL, "slot %d does not exist (0..%d)", c->slot, e->n_slots - 1);
        return;
    }
    eng_slot *sl = &e->slots[c->slot];
    if (sl->state != ENG_SLOT_IDLE) {
        c->status = base_err(c->err, KEEL_ESTATE, "slot %d is processing a request", c->slot);
        return;
    }
    uint64_t t0 = keel_time_ns();
    keel_status st = KEEL_OK;
    if (c->kind == ENG_CTL_ERASE) {
        int32_t n = sl->n_hist;
        eng_slot_clear(e, sl);
        c->status = info_json(c, json_pack("{sisi}", "id_slot", c->slot, "n_erased", n));
        return;
    }
    if (c->kind == ENG_CTL_SAVE) {
        if ((st = keel_session_save(e->ctx, sl->seq, sl->hist, sl->n_hist, 0, c->path)) != KEEL_OK) {
            c->status = base_err(c->err, st, "%s", keel_context_last_error(e->ctx));
            return;
        }
        struct stat sb;
        int64_t written = stat(c->path, &sb) == 0 ? (int64_t)sb.st_size : -1;
        c->status = info_json(c, json_pack("{sisisIs{sf}}", "id_slot", c->slot, "n_saved", sl->n_hist, "n_written",
                                           (json_int_t)written, "timings", "save_ms",
                                           (double)(keel_time_ns() - t0) * 1e-6));
        return;
    }
    /* restore: validated completely before the slot changes */
    int32_t n = 0, pending = 0;
    if ((st = engine_session_load(e->ctx, sl->seq, c->path, 0, true, sl->hist, e->hist_cap, &n, &pending)) !=
        KEEL_OK) {
        c->status = base_err(c->err, st, "%s", keel_context_last_error(e->ctx));
        return;
    }
    slot_loaded(e, sl, n, pending);
    struct stat sb;
    int64_t read_bytes = stat(c->path, &sb) == 0 ? (int64_t)sb.st_size : -1;
    st = info_json(c, json_pack("{sisisIs{sf}}", "id_slot", c->slot, "n_restored", sl->n_hist, "n_read",
                                (json_int_t)read_bytes, "timings", "restore_ms", (double)(keel_time_ns() - t0) * 1e-6));
    c->status = st;
}

void eng_run_controls(keel_engine *e)
{
    for (;;) {
        pthread_mutex_lock(&e->mu);
        eng_ctl *c = e->ctl_head;
        if (c) e->ctl_head = c->next;
        pthread_mutex_unlock(&e->mu);
        if (!c) return;
        run_one(e, c);
        pthread_mutex_lock(&e->mu);
        c->done = true;
        pthread_cond_broadcast(&e->cv);
        pthread_mutex_unlock(&e->mu);
    }
}

static keel_status slot_action(keel_engine *e, eng_ctl_kind kind, int32_t slot, const char *path, char *info,
                               size_t cap)
{
    if (!e) return KEEL_EINVAL;
    if (kind != ENG_CTL_ERASE && !path) return base_err(eng_err(e), KEEL_EINVAL, "slot action: path is NULL");
    keel_status st = eng_enter(e);
    if (st != KEEL_OK) return st;
    eng_ctl c;
    memset(&c, 0, sizeof c);
    c.kind = kind;
    c.slot = slot;
    c.path = path;
    c.info = info;
    c.info_cap = info ? cap : 0;
    pthread_mutex_lock(&e->mu);
    bool loop = e->running;
    if (!loop && e->driving) {
        pthread_mutex_unlock(&e->mu);
        st = base_err(eng_err(e), KEEL_ESTATE, "another call (keel_complete, a slot action) is running on this engine");
        eng_leave(e);
        return st;
    }
    if (!loop) e->driving = true;
    c.next = NULL;
    eng_ctl **pp = &e->ctl_head;
    while (*pp) pp = &(*pp)->next;
    *pp = &c;
    pthread_cond_broadcast(&e->cv);
    if (loop) {
        while (!c.done) pthread_cond_wait(&e->cv, &e->mu);
        pthread_mutex_unlock(&e->mu);
    } else {
        pthread_mutex_unlock(&e->mu);
        eng_run_controls(e);
        pthread_mutex_lock(&e->mu);
        e->driving = false;
        pthread_cond_broadcast(&e->cv);
        pthread_mutex_unlock(&e->mu);
    }
    if (c.status != KEEL_OK && c.err[0]) base_err(eng_err(e), c.status, "%s", c.err);
    eng_leave(e);
    return c.status;
}

keel_status keel_engine_slot_save(keel_engine *e, int32_t slot, const char *path, char *info, size_t cap)
{
    return slot_action(e, ENG_CTL_SAVE, slot, path, info, cap);
}

keel_status keel_engine_slot_restore(keel_engine *e, int32_t slot, const char *path, char *info, size_t cap)
{
    return slot_action(e, ENG_CTL_RESTORE, slot, path, info, cap);
}

keel_status keel_engine_slot_erase(keel_engine *e, int32_t slot, char *info, size_t cap)
{
    return slot_action(e, ENG_CTL_ERASE, slot, NULL, info, cap);
}

/* ---- the RAM prompt cache ------------------------------------------------------------ */

#define PC_MIN_TOKENS 16 /* shorter caches are not worth keeping */

static size_t pc_cost(size_t blob, int32_t n_tokens)
{
    return blob + (size_t)n_tokens * sizeof(int32_t) + sizeof(eng_pc_entry);
}

static void pc_drop(keel_engine *e, eng_pc_entry **pp)
{
    eng_pc_entry *x = *pp;
    *pp = x->next;
    pthread_mutex_lock(&e->mu); /* the counters are read by keel_engine_stats */
    e->pc_bytes -= pc_cost(x->blob_len, x->n_tokens);
    e->pc_entries--;
    pthread_mutex_unlock(&e->mu);
    base_free(x->blob, x->blob_len ? x->blob_len : 1);
    base_free(x->tokens, (size_t)(x->n_tokens ? x->n_tokens : 1) * sizeof(int32_t));
    base_free(x, sizeof *x);
}

/* Frees least recently used entries until need more bytes fit. */
static bool pc_make_room(keel_engine *e, size_t need)
{
    if (need > e->pc_limit) return false;
    while (e->pc_bytes + need > e->pc_limit && e->pc_head) {
        eng_pc_entry **lru = &e->pc_head;
        for (eng_pc_entry **pp = &e->pc_head; *pp; pp = &(*pp)->next)
            if ((*pp)->last_used < (*lru)->last_used) lru = pp;
        pc_drop(e, lru);
        pthread_mutex_lock(&e->mu);
        e->pc_evictions++;
        pthread_mutex_unlock(&e->mu);
    }
    return e->pc_bytes + need <= e->pc_limit;
}

static int32_t lcp(const int32_t *a, int32_t na, const int32_t *b, int32_t nb)
{
    int32_t n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

/* The entry sharing the longest prefix with prompt (a compacted cache
 * counts only when the prompt extends its whole history). */
static eng_pc_entry *pc_best(keel_engine *e, const int32_t *prompt, int32_t n, int32_t *len)
{
    eng_pc_entry *best = NULL;
    *len = 0;
    for (eng_pc_entry *x = e->pc_head; x; x = x->next) {
        int32_t l = lcp(x->tokens, x->n_tokens, prompt, n);
        if (x->compacted && l < x->n_tokens) l = 0;
        if (l > *len) {
            best = x;
            *len = l;
        }
    }
    return best;
}

/* Keeps the slot's cache: an entry with the same history is refreshed, one
 * whose history is a prefix of it is replaced. */
static void pc_store(keel_engine *e, eng_slot *sl)
{
    if (sl->n_hist < PC_MIN_TOKENS || sl->hist_lost) return;
    for (eng_pc_entry **pp = &e->pc_head; *pp;) {
        eng_pc_entry *x = *pp;
        int32_t l = lcp(x->tokens, x->n_tokens, sl->hist, sl->n_hist);
        if (l == sl->n_hist && x->n_tokens >= sl->n_hist) { /* already held (or more) */
            x->last_used = ++e->clock;
            return;
        }
        if (l == x->n_tokens) { /* the slot extends it: the new entry replaces it */
            pc_drop(e, pp);
            continue;
        }
        pp = &x->next;
    }
    size_t n = 0;
    keel_mem *mem = mem_of(e);
    if (keel_mem_save(mem, sl->seq, e->fingerprint, sl->hist, sl->n_hist, 0, NULL, 0, &n) != KEEL_ERANGE) return;
    size_t cost = pc_cost(n, sl->n_hist);
    if (!pc_make_room(e, cost)) return; /* accounted before allocating */
    eng_pc_entry *x = base_calloc(1, sizeof *x);
    uint8_t *b = x ? base_alloc(n) : NULL;
    int32_t *t = b ? base_alloc((size_t)sl->n_hist * sizeof(int32_t)) : NULL;
    size_t got = 0;
    if (!t || keel_mem_save(mem, sl->seq, e->fingerprint, sl->hist, sl->n_hist, 0, b, n, &got) != KEEL_OK) {
        base_free(t, (size_t)sl->n_hist * sizeof(int32_t));
        base_free(b, n);
        base_free(x, sizeof *x);
        return;
    }
    memcpy(t, sl->hist, (size_t)sl->n_hist * sizeof(int32_t));
    x->blob = b;
    x->blob_len = n;
    x->tokens = t;
    x->n_tokens = sl->n_hist;
    x->compacted = sl->hist_compacted;
    x->last_used = ++e->clock;
    x->next = e->pc_head;
    e->pc_head = x;
    pthread_mutex_lock(&e->mu);
    e->pc_bytes += cost;
    e->pc_entries++;
    e->pc_saves++;
    pthread_mutex_unlock(&e->mu);
}

void eng_pc_keep(keel_engine *e, eng_slot *sl)
{
    if (e->pc_limit > 0 && sl->n_hist >= PC_MIN_TOKENS) pc_store(e, sl);
}

void eng_pc_admit(keel_engine *e, eng_slot *sl, const int32_t *prompt, int32_t n, int32_t sys_end, int32_t *reuse)
{
    if (e->pc_limit == 0) return;
    /* the best entry for this prompt */
    int32_t best_l = 0;
    eng_pc_entry *best = pc_best(e, prompt, n, &best_l);
    bool restore = best && best_l > *reuse && best_l >= PC_MIN_TOKENS;
    /* the slot's cache is about to be mostly lost: keep it first, unless
     * this prompt is the same conversation edited after its system prompt
     * and tools (an agent's rewritten reminder or todo list): the old
     * cache would never be hit, and saving it costs a copy of the whole
     * cache per turn */
    bool edited = sys_end > 0 && *reuse >= sys_end && !restore;
    if (!edited && (restore || sl->n_hist - *reuse >= PC_MIN_TOKENS)) pc_store(e, sl);
    if (!restore) return;
    /* the entry may have been refreshed or replaced by pc_store: find it again */
    best = pc_best(e, prompt, n, &best_l);
    if (!best || best_l <= *reuse) return;
    char err[BASE_ERR_CAP];
    if (eng_slot_load_blob(e, sl, best->blob, best->blob_len, err) != KEEL_OK) {
        /* refused (no room, or it no longer matches the memory): the slot is
         * as it was; this request just reuses less */
        return;
    }
    best->last_used = ++e->clock;
    pthread_mutex_lock(&e->mu);
    e->pc_hits++;
    e->pc_hit_tokens += best_l;
    pthread_mutex_unlock(&e->mu);
    *reuse = lcp(sl->hist, sl->n_hist, prompt, n);
}

void eng_pc_free(keel_engine *e)
{
    while (e->pc_head) pc_drop(e, &e->pc_head);
}
