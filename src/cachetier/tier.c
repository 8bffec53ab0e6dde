/*
 * tier.c — the shared prompt-cache tier on Redis (tier.h, docs/cache-tier.md).
 *
 * Two hiredis connections, one per thread: the reading side belongs to the
 * caller's thread (the engine's stepping thread), the writing side to the
 * tier's writer thread. A failed exchange frees its connection and marks
 * the side down; the next attempt comes no sooner than TIER_RETRY_NS later,
 * unless the other side has found the server back since (then at once).
 *
 * Invariants: the write queue never holds more than max_bytes of states
 * (counted before a state is accepted); nothing is handed back that did not
 * pass every check of tier_unwrap (magic, version, fingerprint, lengths,
 * checksum, decompressed size); every counter a fault touches is counted
 * once per fault.
 */
#include "cachetier/tier.h"

#include "base/base.h"

#include <errno.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>
#include <zstd.h>

#define TIER_MAGIC "KEELRTC1"
#define TIER_VERSION 1u
#define TIER_HDR 56
#define TIER_FLAG_ZSTD 1u
#define TIER_RETRY_NS 1000000000ull
#define TIER_WRITE_TIMEOUT_MS 10000
#define TIER_ZSTD_LEVEL 1

typedef struct tier_item {
    struct tier_item *next;
    uint64_t *h;          /* the boundaries' chain, [n_h] */
    int32_t n_h;
    int32_t *hist;        /* [n_hist] */
    int32_t n_hist;
    uint8_t *blob;
    size_t len;
} tier_item;

struct tier {
    char host[256];
    int port, db;
    char password[128];
    int32_t ttl_s, timeout_ms, chunk;
    size_t max_bytes;
    uint64_t fp;
    char fp_hex[17];
    /* the reading side (the caller's thread) */
    redisContext *rc;
    uint64_t r_retry_at;
    /* the writing side */
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t cv, idle;
    tier_item *head, *tail;
    bool stop, writing;
    redisContext *wc;
    uint64_t w_retry_at;
    /* under mu */
    tier_stats st;
    bool said_down;       /* the log said the server is unreachable; the next success says it is back */
    uint64_t back_at;     /* when a success last ended an outage the log told (0: never) */
    uint64_t last_drop_log;
};

/* ---- keys and values ------------------------------------------------------------- */

void tier_chain(uint64_t config_fp, int32_t chunk, const int32_t *tokens, int32_t n, uint64_t *h)
{
    uint64_t x = config_fp;
    for (int32_t k = 0; chunk > 0 && (k + 1) * chunk <= n; k++) {
        x = XXH3_64bits_withSeed(tokens + (size_t)k * (size_t)chunk, (size_t)chunk * sizeof(int32_t), x);
        h[k] = x;
    }
}

static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t get32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static uint64_t get64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* The header: magic[8], version u32, flags u32, fingerprint u64, boundary
 * i32, n_hist i32, raw length u64, stored length u64, xxhash64 u64 of the
 * whole value with this field zero (little-endian, as keel's sessions). */
keel_status tier_wrap(uint64_t config_fp, int32_t boundary, const int32_t *hist, int32_t n_hist, const uint8_t *blob,
                      size_t len, uint8_t **out, size_t *out_len)
{
    *out = NULL;
    *out_len = 0;
    size_t hb = (size_t)n_hist * sizeof(int32_t);
    size_t bound = ZSTD_compressBound(len);
    size_t cap;
    if (!size_add(TIER_HDR + hb, bound > len ? bound : len, &cap)) return KEEL_ENOMEM;
    uint8_t *v = base_alloc(cap);
    if (!v) return KEEL_ENOMEM;
    uint8_t *payload = v + TIER_HDR + hb;
    size_t stored = len;
    uint32_t flags = 0;
    size_t z = ZSTD_compress(payload, bound, blob, len, TIER_ZSTD_LEVEL);
    if (!ZSTD_isError(z) && z < len - len / 16) { /* it pays: at least 1/16 smaller */
        stored = z;
        flags |= TIER_FLAG_ZSTD;
    } else {
        memcpy(payload, blob, len);
    }
    memcpy(v, TIER_MAGIC, 8);
    put32(v + 8, TIER_VERSION);
    put32(v + 12, flags);
    put64(v + 16, config_fp);
    put32(v + 24, (uint32_t)boundary);
    put32(v + 28, (uint32_t)n_hist);
    put64(v + 32, len);
    put64(v + 40, stored);
    put64(v + 48, 0);
    if (hb) memcpy(v + TIER_HDR, hist, hb);
    size_t total = TIER_HDR + hb + stored;
    put64(v + 48, XXH64(v, total, 0));
    *out = v;
    *out_len = total;
    return KEEL_OK;
}

keel_status tier_unwrap(uint64_t config_fp, const uint8_t *v, size_t n, size_t max_bytes, int32_t *boundary,
                        int32_t **hist, int32_t *n_hist, uint8_t **payload, size_t *len, char *err)
{
    *hist = NULL;
    *payload = NULL;
    *n_hist = 0;
    *len = 0;
    if (n < TIER_HDR || memcmp(v, TIER_MAGIC, 8) != 0) return base_err(err, KEEL_EFORMAT, "not a keel cache value");
    if (get32(v + 8) != TIER_VERSION)
        return base_err(err, KEEL_EFORMAT, "cache value version %" PRIu32 " (this keel reads %u)", get32(v + 8),
                        TIER_VERSION);
    if (get64(v + 16) != config_fp) return base_err(err, KEEL_EFORMAT, "cache value of another model or configuration");
    uint32_t flags = get32(v + 12);
    int32_t b = (int32_t)get32(v + 24), nh = (int32_t)get32(v + 28);
    uint64_t raw = get64(v + 32), stored = get64(v + 40);
    if ((flags & ~TIER_FLAG_ZSTD) || nh <= 0 || b <= 0 || b > nh || raw == 0 || raw > max_bytes ||
        stored > n || (uint64_t)nh * 4 > n || TIER_HDR + (uint64_t)nh * 4 + stored != n ||
        (!(flags & TIER_FLAG_ZSTD) && stored != raw))
        return base_err(err, KEEL_EFORMAT, "cache value: inconsistent lengths (truncated or corrupted)");
    uint64_t want = get64(v + 48);
    XXH64_state_t *xs = XXH64_createState();
    if (!xs) return KEEL_ENOMEM;
    static const uint8_t zero[8] = {0};
    XXH64_reset(xs, 0);
    XXH64_update(xs, v, 48);
    XXH64_update(xs, zero, 8);
    XXH64_update(xs, v + TIER_HDR, n - TIER_HDR);
    uint64_t got = XXH64_digest(xs);
    XXH64_freeState(xs);
    if (got != want) return base_err(err, KEEL_EFORMAT, "cache value: checksum mismatch");
    int32_t *h = base_alloc((size_t)nh * sizeof(int32_t));
    uint8_t *p = base_alloc((size_t)raw);
    if (!h || !p) {
        base_free(h, (size_t)nh * sizeof(int32_t));
        base_free(p, (size_t)raw);
        return KEEL_ENOMEM;
    }
    memcpy(h, v + TIER_HDR, (size_t)nh * sizeof(int32_t));
    const uint8_t *src = v + TIER_HDR + (size_t)nh * sizeof(int32_t);
    if (flags & TIER_FLAG_ZSTD) {
        size_t z = ZSTD_decompress(p, (size_t)raw, src, (size_t)stored);
        if (ZSTD_isError(z) || z != raw) {
            base_free(h, (size_t)nh * sizeof(int32_t));
            base_free(p, (size_t)raw);
            return base_err(err, KEEL_EFORMAT, "cache value: the compressed state does not decompress to its size");
        }
    } else {
        memcpy(p, src, (size_t)raw);
    }
    *boundary = b;
    *hist = h;
    *n_hist = nh;
    *payload = p;
    *len = (size_t)raw;
    return KEEL_OK;
}

/* ---- connections ------------------------------------------------------------------ */

static keel_status parse_url(tier *t, const char *url, char *err)
{
    const char *p = url;
    if (strncmp(p, "redis://", 8) != 0)
        return base_err(err, KEEL_EINVAL, "cache_redis: '%.200s' is not redis://[:PASSWORD@]HOST[:PORT][/DB]", url);
    p += 8;
    const char *at = strchr(p, '@');
    if (at) {
        const char *colon = memchr(p, ':', (size_t)(at - p));
        const char *pw = colon ? colon + 1 : p;
        size_t n = (size_t)(at - pw);
        if (n == 0 || n >= sizeof t->password) return base_err(err, KEEL_EINVAL, "cache_redis: bad password in the URL");
        memcpy(t->password, pw, n);
        t->password[n] = 0;
        p = at + 1;
    }
    size_t hn = strcspn(p, ":/");
    if (hn == 0 || hn >= sizeof t->host) return base_err(err, KEEL_EINVAL, "cache_redis: '%.200s' has no host", url);
    memcpy(t->host, p, hn);
    t->host[hn] = 0;
    p += hn;
    t->port = 6379;
    if (*p == ':') {
        char *end;
        long v = strtol(p + 1, &end, 10);
        if (end == p + 1 || v < 1 || v > 65535) return base_err(err, KEEL_EINVAL, "cache_redis: bad port in '%.200s'", url);
        t->port = (int)v;
        p = end;
    }
    t->db = 0;
    if (*p == '/' && p[1]) {
        char *end;
        long v = strtol(p + 1, &end, 10);
        if (end == p + 1 || *end || v < 0 || v > 1 << 20) return base_err(err, KEEL_EINVAL, "cache_redis: bad database in '%.200s'", url);
        t->db = (int)v;
        p = end;
    } else if (*p == '/') {
        p++;
    }
    if (*p) return base_err(err, KEEL_EINVAL, "cache_redis: unexpected '%.40s' in the URL", p);
    return KEEL_OK;
}

/* A reply that is not an error, or NULL (the reply is freed). */
static bool reply_ok(redisReply *r)
{
    bool ok = r && r->type != REDIS_REPLY_ERROR;
    if (r) freeReplyObject(r);
    return ok;
}

static redisContext *connect_to(tier *t, int32_t timeout_ms, char *why, size_t cap)
{
    struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    redisContext *c = redisConnectWithTimeout(t->host, t->port, tv);
    if (!c || c->err) {
        snprintf(why, cap, "%s", c ? c->errstr : "out of memory");
        if (c) redisFree(c);
        return NULL;
    }
    if (redisSetTimeout(c, tv) != REDIS_OK || (t->password[0] && !reply_ok(redisCommand(c, "AUTH %s", t->password))) ||
        (t->db && !reply_ok(redisCommand(c, "SELECT %d", t->db)))) {
        snprintf(why, cap, "%s", c->err ? c->errstr : "AUTH or SELECT refused");
        redisFree(c);
        return NULL;
    }
    return c;
}

/* Counts one failed exchange (under no lock); says so in the log once. */
static void failed(tier *t, redisContext **c, uint64_t *retry_at, const char *what)
{
    bool timeout = *c && (*c)->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK || errno == ETIMEDOUT);
    char why[160];
    snprintf(why, sizeof why, "%s", *c && (*c)->err ? (*c)->errstr : what);
    if (*c) redisFree(*c);
    *c = NULL;
    *retry_at = base_time_ns() + TIER_RETRY_NS;
    pthread_mutex_lock(&t->mu);
    t->st.errors++;
    t->st.timeouts += timeout;
    t->st.up = false;
    bool say = !t->said_down;
    t->said_down = true;
    pthread_mutex_unlock(&t->mu);
    if (say)
        base_log(KEEL_LOG_WARN, "remote cache: redis://%s:%d/%d %s (%s): serving from the local cache, retrying", t->host,
                 t->port, t->db, timeout ? "timed out" : "failed", why);
}

static void succeeded(tier *t)
{
    pthread_mutex_lock(&t->mu);
    t->st.up = true;
    bool say = t->said_down;
    t->said_down = false;
    if (say) t->back_at = base_time_ns();
    pthread_mutex_unlock(&t->mu);
    if (say) base_log(KEEL_LOG_WARN, "remote cache: redis://%s:%d/%d reachable again", t->host, t->port, t->db);
}

/* Whether a side down until retry_at may try now: the time has come, or
 * the other side reached the server after this one failed (failed() set
 * retry_at to the failure's time + TIER_RETRY_NS), so a server that came
 * back costs the reads no wait once a write found it, and the other way
 * round. Under mu. */
static bool retry_due(const tier *t, uint64_t retry_at)
{
    return base_time_ns() >= retry_at || t->back_at + TIER_RETRY_NS > retry_at;
}

/* The side's connection, connecting when the retry time has come; NULL
 * while down. */
static redisContext *side(tier *t, redisContext **c, uint64_t *retry_at, int32_t timeout_ms)
{
    if (*c) return *c;
    pthread_mutex_lock(&t->mu);
    bool due = retry_due(t, *retry_at);
    pthread_mutex_unlock(&t->mu);
    if (!due) return NULL;
    char why[160] = "";
    *c = connect_to(t, timeout_ms, why, sizeof why);
    if (!*c) failed(t, c, retry_at, why);
    return *c;
}

/* ---- writing ------------------------------------------------------------------------ */

static void item_free(tier_item *x)
{
    if (!x) return;
    base_free(x->h, (size_t)(x->n_h ? x->n_h : 1) * sizeof(uint64_t));
    base_free(x->hist, (size_t)(x->n_hist ? x->n_hist : 1) * sizeof(int32_t));
    base_free(x->blob, x->len ? x->len : 1);
    base_free(x, sizeof *x);
}

/* SET the state, then its index keys, pipelined; true when every reply was
 * not an error. */
static bool write_item(tier *t, redisContext *c, const tier_item *x, size_t *sent)
{
    uint8_t *v = NULL;
    size_t vn = 0;
    int32_t boundary = x->n_h * t->chunk;
    if (tier_wrap(t->fp, boundary, x->hist, x->n_hist, x->blob, x->len, &v, &vn) != KEEL_OK) return false;
    char key[64], name[17];
    snprintf(name, sizeof name, "%016" PRIx64, x->h[x->n_h - 1]);
    snprintf(key, sizeof key, "keel:%s:s:%s", t->fp_hex, name);
    bool ok = redisAppendCommand(c, "SET %s %b EX %d", key, v, vn, t->ttl_s) == REDIS_OK;
    base_free(v, vn);
    /* its history alone: a reader checks what it shares before moving the state */
    snprintf(key, sizeof key, "keel:%s:t:%s", t->fp_hex, name);
    ok = ok && redisAppendCommand(c, "SET %s %b EX %d", key, (const void *)x->hist,
                                  (size_t)x->n_hist * sizeof(int32_t), t->ttl_s) == REDIS_OK;
    int32_t n_cmd = 2;
    for (int32_t k = 0; ok && k < x->n_h; k++) {
        snprintf(key, sizeof key, "keel:%s:i:%016" PRIx64, t->fp_hex, x->h[k]);
        ok = redisAppendCommand(c, "SET %s %s EX %d", key, name, t->ttl_s) == REDIS_OK;
        n_cmd++;
    }
    bool all = ok;
    for (int32_t i = 0; ok && i < n_cmd; i++) {
        redisReply *r = NULL;
        if (redisGetReply(c, (void **)&r) != REDIS_OK) {
            ok = all = false;
            break;
        }
        all &= r && r->type != REDIS_REPLY_ERROR;
        freeReplyObject(r);
    }
    *sent = vn;
    return ok && all;
}

static void *writer(void *arg)
{
    tier *t = arg;
    pthread_mutex_lock(&t->mu);
    for (;;) {
        while (!t->head && !t->stop) pthread_cond_wait(&t->cv, &t->mu);
        if (!t->head) break; /* stopping and nothing left */
        tier_item *x = t->head;
        t->head = x->next;
        if (!t->head) t->tail = NULL;
        t->writing = true;
        pthread_mutex_unlock(&t->mu);
        size_t sent = 0;
        bool ok = false;
        /* down: wait for the retry time (a close, or the reads finding the
         * server back, cuts it short), then one try */
        pthread_mutex_lock(&t->mu);
        while (!t->wc && !t->stop && !retry_due(t, t->w_retry_at)) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 20000000;
            if (ts.tv_nsec >= 1000000000) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000;
            }
            pthread_cond_timedwait(&t->cv, &t->mu, &ts);
        }
        pthread_mutex_unlock(&t->mu);
        redisContext *c = side(t, &t->wc, &t->w_retry_at, TIER_WRITE_TIMEOUT_MS);
        if (c) {
            ok = write_item(t, c, x, &sent);
            if (ok)
                succeeded(t);
            else if (t->wc->err)
                failed(t, &t->wc, &t->w_retry_at, "write");
            else {
                pthread_mutex_lock(&t->mu);
                t->st.errors++; /* an error reply (e.g. OOM with maxmemory and no eviction) */
                pthread_mutex_unlock(&t->mu);
            }
        }
        pthread_mutex_lock(&t->mu);
        t->st.queue_bytes -= (int64_t)x->len;
        if (ok) {
            t->st.writes++;
            t->st.bytes_out += (int64_t)sent;
        } else {
            t->st.dropped++; /* down or refused: this state is not kept */
        }
        t->writing = false;
        pthread_cond_broadcast(&t->idle);
        pthread_mutex_unlock(&t->mu);
        item_free(x);
        pthread_mutex_lock(&t->mu);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

bool tier_room(tier *t, size_t len)
{
    pthread_mutex_lock(&t->mu);
    bool ok = len <= t->max_bytes && (size_t)t->st.queue_bytes + len <= t->max_bytes;
    pthread_mutex_unlock(&t->mu);
    return ok;
}

void tier_dropped(tier *t, size_t len)
{
    pthread_mutex_lock(&t->mu);
    t->st.dropped++;
    uint64_t now = base_time_ns();
    bool say = now - t->last_drop_log > 10 * TIER_RETRY_NS || t->last_drop_log == 0;
    if (say) t->last_drop_log = now;
    int64_t q = t->st.queue_bytes;
    pthread_mutex_unlock(&t->mu);
    if (say)
        base_log(KEEL_LOG_WARN, "remote cache: a state of %zu bytes not written (queue %" PRId64 " of %zu bytes)", len, q,
                 t->max_bytes);
}

void tier_store(tier *t, const int32_t *hist, int32_t n_hist, uint8_t *blob, size_t len)
{
    int32_t n_h = n_hist / t->chunk;
    tier_item *x = n_h > 0 ? base_calloc(1, sizeof *x) : NULL;
    if (x) {
        x->h = base_alloc((size_t)n_h * sizeof(uint64_t));
        x->hist = base_alloc((size_t)n_hist * sizeof(int32_t));
    }
    if (!x || !x->h || !x->hist) {
        if (x) {
            base_free(x->h, (size_t)n_h * sizeof(uint64_t));
            base_free(x->hist, (size_t)n_hist * sizeof(int32_t));
            base_free(x, sizeof *x);
        }
        base_free(blob, len ? len : 1);
        if (n_h > 0) tier_dropped(t, len);
        return;
    }
    x->n_h = n_h;
    tier_chain(t->fp, t->chunk, hist, n_hist, x->h);
    memcpy(x->hist, hist, (size_t)n_hist * sizeof(int32_t));
    x->n_hist = n_hist;
    x->blob = blob;
    x->len = len;
    pthread_mutex_lock(&t->mu);
    bool fits = len <= t->max_bytes && (size_t)t->st.queue_bytes + len <= t->max_bytes;
    if (fits) {
        t->st.queue_bytes += (int64_t)len;
        if (t->tail)
            t->tail->next = x;
        else
            t->head = x;
        t->tail = x;
        pthread_cond_signal(&t->cv);
    }
    pthread_mutex_unlock(&t->mu);
    if (!fits) {
        item_free(x);
        tier_dropped(t, len);
    }
}

int32_t tier_chunk(const tier *t)
{
    return t->chunk;
}

bool tier_drain(tier *t, int32_t ms)
{
    uint64_t until = base_time_ns() + (uint64_t)ms * 1000000ull;
    pthread_mutex_lock(&t->mu);
    while ((t->head || t->writing) && base_time_ns() < until) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 10000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&t->idle, &t->mu, &ts);
    }
    bool empty = !t->head && !t->writing;
    pthread_mutex_unlock(&t->mu);
    return empty;
}

/* ---- reading ------------------------------------------------------------------------ */

static void count(tier *t, int64_t *field, int64_t by)
{
    pthread_mutex_lock(&t->mu);
    *field += by;
    pthread_mutex_unlock(&t->mu);
}

keel_status tier_fetch(tier *t, const int32_t *prompt, int32_t n, int32_t min_len, uint8_t **blob, size_t *len,
                       int32_t **hist, int32_t *n_hist)
{
    *blob = NULL;
    *len = 0;
    *hist = NULL;
    *n_hist = 0;
    /* boundaries k0 + 1 .. n_b are worth a look: a state found by the
     * boundary at or below min_len may still share more than min_len */
    int32_t n_b = n / t->chunk, k0 = min_len / t->chunk > 0 ? min_len / t->chunk - 1 : 0;
    if (n_b <= k0 || n <= min_len) return KEEL_OK;
    redisContext *c = side(t, &t->rc, &t->r_retry_at, t->timeout_ms);
    if (!c) {
        count(t, &t->st.misses, 1);
        return KEEL_OK;
    }
    uint64_t *h = base_alloc((size_t)n_b * sizeof(uint64_t));
    int32_t n_args = n_b - k0 + 1;
    char **argv = base_calloc((size_t)n_args, sizeof(char *));
    size_t *argl = base_calloc((size_t)n_args, sizeof(size_t));
    char *keys = base_alloc((size_t)n_args * 48);
    keel_status st = KEEL_OK;
    redisReply *r = NULL;
    if (!h || !argv || !argl || !keys) {
        st = KEEL_ENOMEM;
        goto done;
    }
    tier_chain(t->fp, t->chunk, prompt, n, h);
    argv[0] = "MGET";
    argl[0] = 4;
    for (int32_t k = k0; k < n_b; k++) {
        char *key = keys + (size_t)(k - k0) * 48;
        argl[k - k0 + 1] = (size_t)snprintf(key, 48, "keel:%s:i:%016" PRIx64, t->fp_hex, h[k]);
        argv[k - k0 + 1] = key;
    }
    r = redisCommandArgv(c, n_args, (const char **)argv, argl);
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != (size_t)(n_b - k0)) {
        if (!r)
            failed(t, &t->rc, &t->r_retry_at, "MGET");
        else
            count(t, &t->st.errors, 1);
        count(t, &t->st.misses, 1);
        goto done;
    }
    char name[17] = "";
    int32_t found = -1; /* the index found: boundary (found + 1) * chunk */
    for (int32_t k = n_b - 1; k >= k0 && !name[0]; k--) {
        redisReply *e = r->element[k - k0];
        if (e->type != REDIS_REPLY_STRING) continue;
        if (e->len != 16 || strspn(e->str, "0123456789abcdef") != 16) { /* not a state's name: garbage */
            count(t, &t->st.rejected, 1);
            continue;
        }
        memcpy(name, e->str, 16);
        name[16] = 0;
        found = k;
    }
    freeReplyObject(r);
    r = NULL;
    if (!name[0]) {
        succeeded(t);
        count(t, &t->st.misses, 1);
        goto done;
    }
    /* what the state shares with the prompt, from its history alone */
    r = redisCommand(c, "GET keel:%s:t:%s", t->fp_hex, name);
    if (!r) {
        failed(t, &t->rc, &t->r_retry_at, "GET");
        count(t, &t->st.misses, 1);
        goto done;
    }
    if (r->type != REDIS_REPLY_STRING || r->len % sizeof(int32_t) != 0) {
        if (r->type == REDIS_REPLY_STRING) count(t, &t->st.rejected, 1);
        count(t, &t->st.misses, 1);
        goto done;
    }
    count(t, &t->st.bytes_in, (int64_t)r->len);
    {
        int32_t nt = (int32_t)(r->len / sizeof(int32_t)), shared = 0;
        const char *q = r->str;
        while (shared < nt && shared < n) {
            int32_t tok;
            memcpy(&tok, q + (size_t)shared * sizeof(int32_t), sizeof tok);
            if (tok != prompt[shared]) break;
            shared++;
        }
        if (shared <= min_len) { /* no better than what the caller has */
            count(t, &t->st.misses, 1);
            goto done;
        }
    }
    freeReplyObject(r);
    r = redisCommand(c, "GET keel:%s:s:%s", t->fp_hex, name);
    if (!r) {
        failed(t, &t->rc, &t->r_retry_at, "GET");
        count(t, &t->st.misses, 1);
        goto done;
    }
    succeeded(t);
    if (r->type != REDIS_REPLY_STRING) { /* expired or evicted since the index was read */
        count(t, &t->st.misses, 1);
        goto done;
    }
    count(t, &t->st.bytes_in, (int64_t)r->len);
    char err[BASE_ERR_CAP];
    int32_t boundary = 0;
    st = tier_unwrap(t->fp, (const uint8_t *)r->str, r->len, t->max_bytes, &boundary, hist, n_hist, blob, len, err);
    int32_t need = (found + 1) * t->chunk;
    if (st == KEEL_OK && (*n_hist < boundary || boundary % t->chunk != 0 || boundary < need)) {
        st = KEEL_EFORMAT;
        snprintf(err, sizeof err, "cache value: its boundary does not cover the index it was found by");
    }
    if (st == KEEL_OK) {
        /* the state's history must begin with the prompt's chunks up to the
         * boundary it was found by (a value filed under another key fails) */
        uint64_t *hh = base_alloc((size_t)(found + 1) * sizeof(uint64_t));
        if (!hh) {
            st = KEEL_ENOMEM;
        } else {
            tier_chain(t->fp, t->chunk, *hist, need, hh);
            if (hh[found] != h[found]) {
                st = KEEL_EFORMAT;
                snprintf(err, sizeof err, "cache value: its history is not the prompt's prefix (filed under another key)");
            }
            base_free(hh, (size_t)(found + 1) * sizeof(uint64_t));
        }
    }
    if (st != KEEL_OK) {
        if (st == KEEL_EFORMAT) base_log(KEEL_LOG_WARN, "remote cache: value %s refused: %s", name, err);
        base_free(*blob, *len);
        base_free(*hist, (size_t)*n_hist * sizeof(int32_t));
        *blob = NULL;
        *hist = NULL;
        *len = 0;
        *n_hist = 0;
        count(t, st == KEEL_EFORMAT ? &t->st.rejected : &t->st.errors, 1);
        count(t, &t->st.misses, 1);
        st = KEEL_OK;
    }
done:
    if (r) freeReplyObject(r);
    base_free(h, (size_t)(n_b ? n_b : 1) * sizeof(uint64_t));
    base_free(argv, (size_t)n_args * sizeof(char *));
    base_free(argl, (size_t)n_args * sizeof(size_t));
    base_free(keys, (size_t)n_args * 48);
    return st;
}

void tier_fetched(tier *t, int32_t tokens)
{
    pthread_mutex_lock(&t->mu);
    if (tokens > 0) {
        t->st.hits++;
        t->st.hit_tokens += tokens;
    } else {
        t->st.rejected++;
        t->st.misses++;
    }
    pthread_mutex_unlock(&t->mu);
}

/* ---- the tier ----------------------------------------------------------------------- */

keel_status tier_open(const tier_params *p, tier **out, char *err)
{
    *out = NULL;
    if (p->chunk < 16 || p->ttl_s <= 0 || p->max_bytes == 0 || p->timeout_ms <= 0)
        return base_err(err, KEEL_EINVAL, "cache_redis: chunk >= 16, ttl, max bytes and timeout > 0 required");
    tier *t = base_calloc(1, sizeof *t);
    if (!t) return KEEL_ENOMEM;
    keel_status st = parse_url(t, p->url, err);
    if (st != KEEL_OK) {
        base_free(t, sizeof *t);
        return st;
    }
    t->ttl_s = p->ttl_s;
    t->timeout_ms = p->timeout_ms;
    t->chunk = p->chunk;
    t->max_bytes = p->max_bytes;
    t->fp = p->config_fp;
    snprintf(t->fp_hex, sizeof t->fp_hex, "%016" PRIx64, t->fp);
    if (pthread_mutex_init(&t->mu, NULL) != 0) {
        base_free(t, sizeof *t);
        return base_err(err, KEEL_ENOMEM, "cache_redis: mutex");
    }
    if (pthread_cond_init(&t->cv, NULL) != 0 || pthread_cond_init(&t->idle, NULL) != 0 ||
        pthread_create(&t->thread, NULL, writer, t) != 0) {
        tier_close(t);
        return base_err(err, KEEL_ENOMEM, "cache_redis: the writer thread could not start");
    }
    t->started = true;
    *out = t;
    return KEEL_OK;
}

void tier_close(tier *t)
{
    if (!t) return;
    if (t->started) {
        pthread_mutex_lock(&t->mu);
        /* what is queued is dropped: a closing engine does not wait on the network */
        for (tier_item *x = t->head, *nx; x; x = nx) {
            nx = x->next;
            t->st.queue_bytes -= (int64_t)x->len;
            item_free(x);
        }
        t->head = t->tail = NULL;
        t->stop = true;
        pthread_cond_broadcast(&t->cv);
        pthread_mutex_unlock(&t->mu);
        pthread_join(t->thread, NULL);
    }
    if (t->rc) redisFree(t->rc);
    if (t->wc) redisFree(t->wc);
    pthread_cond_destroy(&t->cv);
    pthread_cond_destroy(&t->idle);
    pthread_mutex_destroy(&t->mu);
    base_free(t, sizeof *t);
}

void tier_stats_get(tier *t, tier_stats *s)
{
    pthread_mutex_lock(&t->mu);
    *s = t->st;
    pthread_mutex_unlock(&t->mu);
}
