/*
 * tier.h — the shared prompt-cache tier on Redis (docs/cache-tier.md).
 *
 * Several keel processes file sequence states (session blobs, as the RAM
 * prompt cache keeps them) in one Redis under keys derived from their token
 * prefixes, and resume from the longest stored prefix of a new prompt. The
 * tier knows nothing of the memory: it moves opaque blobs, each wrapped with
 * a header (magic, version, the configuration's fingerprint, the token
 * history, an xxhash64 of the payload, zstd where it pays) that is checked
 * before anything is handed back.
 *
 * Keys (C = chunk tokens, h_0 = the configuration's fingerprint,
 * h_k = xxh3(tokens[(k-1)C .. kC), seed h_{k-1})):
 *   keel:<fp>:s:<h_b>  a state whose history has b..b+C-1 tokens (b = kC)
 *   keel:<fp>:t:<h_b>  its history alone (int32 little-endian)
 *   keel:<fp>:i:<h_k>  for every k <= b / C: the name (<h_b>) of the newest
 *                      state filed whose history starts with those kC tokens
 * A prompt reads the index keys of its boundaries in one MGET, then the
 * history of the state behind the longest one present, and the state only
 * when that history shares more with the prompt than the caller has.
 *
 * Threads: tier_fetch and tier_store are called by one thread (the
 * engine's stepping thread); a writer thread of the tier's own does the
 * compression and the writes. tier_stats may be called from any thread.
 * Nothing here blocks longer than the configured timeout; nothing aborts or
 * prints (transitions go to base_log once each).
 */
#ifndef KEEL_CACHETIER_TIER_H
#define KEEL_CACHETIER_TIER_H

#include "keel.h"

#include <stddef.h>
#include <stdint.h>

typedef struct tier tier;

typedef struct tier_params {
    const char *url;     /* redis://[:PASSWORD@]HOST[:PORT][/DB] */
    int32_t ttl_s;       /* expiry of every key written (> 0) */
    size_t max_bytes;    /* the write queue's bound; also the largest state moved either way */
    int32_t timeout_ms;  /* connect and each command, on the reading side */
    int32_t chunk;       /* C: tokens between boundaries */
    uint64_t config_fp;  /* what makes a state valid here (model, K/V types, rotation, layers, format) */
} tier_params;

typedef struct tier_stats {
    bool up;              /* the last exchange with the server succeeded */
    int64_t hits, misses, hit_tokens;
    int64_t bytes_in, bytes_out;
    int64_t writes;       /* states written */
    int64_t errors;       /* exchanges that failed (connection refused or lost, error replies) */
    int64_t timeouts;     /* of which timed out */
    int64_t rejected;     /* values refused: corrupted, truncated, foreign, or refused by the memory */
    int64_t dropped;      /* states not written: the queue was full, or the state is larger than the bound */
    int64_t queue_bytes;  /* waiting to be written now */
} tier_stats;

/* Parses the URL (KEEL_EINVAL naming what is wrong) and starts the writer
 * thread. The server need not be up: the tier connects when it is used
 * and again after failures (at most once a second per side). */
keel_status tier_open(const tier_params *p, tier **out, char *err);
void tier_close(tier *t);

/* The longest stored state for prompt[0 .. n) whose boundary is above
 * min_len tokens: *blob (base_alloc'd, *len bytes; the caller frees it
 * with base_free(*blob, *len)) is the payload as stored, *hist its token
 * history (base_alloc'd, *n_hist entries). KEEL_OK with *blob NULL: none
 * (a miss, the server down or slow, a value refused: counted). */
keel_status tier_fetch(tier *t, const int32_t *prompt, int32_t n, int32_t min_len, uint8_t **blob, size_t *len,
                       int32_t **hist, int32_t *n_hist);
/* The caller used (tokens > 0: counted as a hit of that many tokens) or
 * refused (tokens 0: counted as rejected) what tier_fetch returned. */
void tier_fetched(tier *t, int32_t tokens);
/* Whether a state of len bytes would be queued now (false: it would be
 * dropped, so the caller need not copy it). */
bool tier_room(tier *t, size_t len);
/* Queues the state whose history is hist[0 .. n_hist) (blob: base_alloc'd,
 * taken in every case) to be filed at its boundaries. Never blocks: a full
 * queue drops it (counted, logged). */
void tier_store(tier *t, const int32_t *hist, int32_t n_hist, uint8_t *blob, size_t len);
/* A state of len bytes was not offered (no room, or it could not be
 * copied): counted and logged as dropped. */
void tier_dropped(tier *t, size_t len);
/* The chunk (tokens between boundaries). */
int32_t tier_chunk(const tier *t);
void tier_stats_get(tier *t, tier_stats *s);
/* Waits until the queue is empty or ms milliseconds passed (tests, close). */
bool tier_drain(tier *t, int32_t ms);

/* Exposed for tests: the wrapped value of a state, and its unwrapping
 * (KEEL_EFORMAT naming the fault; *payload and *hist base_alloc'd). */
keel_status tier_wrap(uint64_t config_fp, int32_t boundary, const int32_t *hist, int32_t n_hist, const uint8_t *blob,
                      size_t len, uint8_t **out, size_t *out_len);
keel_status tier_unwrap(uint64_t config_fp, const uint8_t *v, size_t n, size_t max_bytes, int32_t *boundary,
                        int32_t **hist, int32_t *n_hist, uint8_t **payload, size_t *len, char *err);
/* h_k for k = 1 .. n / chunk into h[0 .. n / chunk). */
void tier_chain(uint64_t config_fp, int32_t chunk, const int32_t *tokens, int32_t n, uint64_t *h);

#endif
