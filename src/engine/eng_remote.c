/*
 * eng_remote.c — the engine's side of the shared prompt-cache tier
 * (src/cachetier, docs/cache-tier.md): a request that ends files its
 * slot's state (a session blob, as the RAM prompt cache keeps it); a
 * prompt at admission resumes from the tier's longest stored prefix when
 * that beats what the slot and the RAM cache share with it.
 *
 * Invariants: a state goes to the tier only from an idle slot whose
 * history is its cache (not lost, not compacted); what comes back is
 * loaded only through keel_mem's all-or-nothing load, after the tier's own
 * checks, into an idle slot whose old cache was offered to the RAM cache
 * first; a refusal anywhere costs reuse, never the request.
 */
#include "eng.h"

#include "../cachetier/tier.h"

#include <string.h>
#include <xxhash.h>

#define REMOTE_FP_VERSION 1u

/* What makes a state valid here: the model's fingerprint, and the bytes
 * of an empty sequence's session (the format version, every column's
 * layer, kind, heads, dims, K/V types, rotation and RoPE, the layer
 * groups), and the chunk. */
/* (at open every sequence is empty: sequence 0's session is the memory's shape) */
static keel_status config_fp(keel_engine *e, int32_t chunk, uint64_t *fp, char *err)
{
    keel_mem *mem = keel_context_memory(e->ctx);
    size_t n = 0;
    keel_status st = keel_mem_save(mem, 0, e->fingerprint, NULL, 0, 0, NULL, 0, &n);
    if (st != KEEL_ERANGE) return base_err(err, st == KEEL_OK ? KEEL_EINTERNAL : st, "cache_redis: %s", keel_mem_last_error(mem));
    uint8_t *b = base_alloc(n);
    if (!b) return KEEL_ENOMEM;
    size_t got = 0;
    st = keel_mem_save(mem, 0, e->fingerprint, NULL, 0, 0, b, n, &got);
    if (st == KEEL_OK) {
        uint64_t seed = e->fingerprint ^ ((uint64_t)REMOTE_FP_VERSION << 32) ^ (uint64_t)(uint32_t)chunk;
        *fp = XXH3_64bits_withSeed(b, got, seed);
    } else {
        base_err(err, st, "cache_redis: %s", keel_mem_last_error(mem));
    }
    base_free(b, n);
    return st;
}

keel_status eng_remote_open(keel_engine *e, const char *url, int32_t ttl_s, size_t max_bytes, int32_t timeout_ms,
                            int32_t chunk, char *err)
{
    tier_params p = {.url = url, .ttl_s = ttl_s, .max_bytes = max_bytes, .timeout_ms = timeout_ms, .chunk = chunk};
    keel_status st = config_fp(e, chunk, &p.config_fp, err);
    if (st != KEEL_OK) return st;
    return tier_open(&p, &e->tier, err);
}

void eng_remote_close(keel_engine *e)
{
    tier_close(e->tier);
    e->tier = NULL;
}

static int32_t common(const int32_t *a, int32_t na, const int32_t *b, int32_t nb)
{
    int32_t n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

void eng_remote_admit(keel_engine *e, eng_slot *sl, const int32_t *prompt, int32_t n, int32_t *lcp)
{
    uint8_t *blob = NULL;
    size_t len = 0;
    int32_t *hist = NULL, nh = 0;
    if (tier_fetch(e->tier, prompt, n, *lcp, &blob, &len, &hist, &nh) != KEEL_OK || !blob) return;
    int32_t l = common(hist, nh, prompt, n);
    base_free(hist, (size_t)nh * sizeof(int32_t));
    if (l <= *lcp || nh > e->hist_cap) { /* the tier verified the prefix: a state that does not beat *lcp is wrong */
        tier_fetched(e->tier, 0);
        base_free(blob, len);
        return;
    }
    eng_pc_keep(e, sl); /* the slot's cache is about to be replaced */
    char err[BASE_ERR_CAP];
    keel_status st = eng_slot_load_blob(e, sl, blob, len, err);
    base_free(blob, len);
    if (st != KEEL_OK) {
        base_log(KEEL_LOG_WARN, "remote cache: a state was refused by the memory: %s", err);
        tier_fetched(e->tier, 0);
        return;
    }
    *lcp = common(sl->hist, sl->n_hist, prompt, n);
    tier_fetched(e->tier, *lcp);
}

void eng_remote_store(keel_engine *e, eng_slot *sl)
{
    keel_mem *mem = keel_context_memory(e->ctx);
    /* the tier files a state at its boundaries: it needs at least one chunk */
    if (sl->hist_lost || sl->hist_compacted || sl->n_hist < tier_chunk(e->tier)) return;
    size_t n = 0;
    if (keel_mem_save(mem, sl->seq, e->fingerprint, sl->hist, sl->n_hist, 0, NULL, 0, &n) != KEEL_ERANGE) return;
    if (!tier_room(e->tier, n)) {
        tier_dropped(e->tier, n);
        return;
    }
    uint8_t *b = base_alloc(n);
    size_t got = 0;
    if (!b || keel_mem_save(mem, sl->seq, e->fingerprint, sl->hist, sl->n_hist, 0, b, n, &got) != KEEL_OK ||
        got != n) {
        base_free(b, n);
        tier_dropped(e->tier, n);
        return;
    }
    tier_store(e->tier, sl->hist, sl->n_hist, b, n);
}

json_t *eng_remote_stats(keel_engine *e)
{
    tier_stats s;
    tier_stats_get(e->tier, &s);
    return json_pack("{sbsIsIsIsIsIsIsIsIsIsIsI}", "up", s.up, "hits", (json_int_t)s.hits, "misses",
                     (json_int_t)s.misses, "hit_tokens", (json_int_t)s.hit_tokens, "bytes_in", (json_int_t)s.bytes_in,
                     "bytes_out", (json_int_t)s.bytes_out, "writes", (json_int_t)s.writes, "errors",
                     (json_int_t)s.errors, "timeouts", (json_int_t)s.timeouts, "rejected", (json_int_t)s.rejected,
                     "dropped", (json_int_t)s.dropped, "queue_bytes", (json_int_t)s.queue_bytes);
}
