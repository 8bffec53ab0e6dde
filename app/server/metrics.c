/*
 * metrics.c — GET /metrics: the engine's stats JSON (keel_engine_stats) as
 * Prometheus text exposition format 0.0.4, plus the process RSS beside the
 * memory plan.
 *
 * Known members get their own metric names (counters end in _total); the
 * objects "prompt_cache" and "checkpoints", whose members the engine grows
 * over time, are exported member by member (every number becomes
 * keel_<object>_<member>), so new engine statistics appear without a
 * server change. Missing members are simply not exported.
 */
#include "srv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

size_t srv_rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return 0;
    unsigned long long size = 0, rss = 0;
    int n = fscanf(f, "%llu %llu", &size, &rss);
    fclose(f);
    long page = sysconf(_SC_PAGESIZE);
    return n == 2 && page > 0 ? (size_t)(rss * (unsigned long long)page) : 0;
}

static void head(srv_buf *b, const char *name, const char *type, const char *help)
{
    srv_buf_addf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static double num(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : 0.0;
}

static void metric(srv_buf *b, const char *name, const char *type, const char *help, double v)
{
    head(b, name, type, help);
    srv_buf_addf(b, "%s %.17g\n", name, v);
}

/* Exports every number of obj as keel_<prefix>_<member> gauges (names
 * reduced to [a-z0-9_]). */
static void export_object(srv_buf *b, json_t *obj, const char *prefix)
{
    const char *k;
    json_t *v;
    json_object_foreach(obj, k, v) {
        if (!json_is_number(v) && !json_is_boolean(v)) continue;
        char name[160];
        int n = snprintf(name, sizeof name, "keel_%s_%s", prefix, k);
        if (n < 0 || (size_t)n >= sizeof name) continue;
        for (char *p = name; *p; p++)
            if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_')) *p = (*p >= 'A' && *p <= 'Z') ? (char)(*p + 32) : '_';
        char help[200];
        snprintf(help, sizeof help, "stats.%s.%s of the engine", prefix, k);
        metric(b, name, "gauge", help, json_is_boolean(v) ? (double)json_is_true(v) : json_number_value(v));
    }
}

char *srv_metrics_text(const char *stats_json, size_t rss_bytes)
{
    json_t *s = json_loads(stats_json, 0, NULL);
    if (!json_is_object(s)) {
        if (s) json_decref(s);
        return NULL;
    }
    srv_buf b = {0};
    metric(&b, "keel_requests_total", "counter", "Requests finished (all outcomes).", num(s, "requests"));
    metric(&b, "keel_requests_failed_total", "counter", "Requests that ended with an error.", num(s, "requests_failed"));
    metric(&b, "keel_requests_cancelled_total", "counter", "Requests cancelled (client gone, shutdown).",
           num(s, "requests_cancelled"));
    metric(&b, "keel_requests_deferred", "gauge", "Requests waiting for a slot.", num(s, "queued"));
    size_t i;
    json_t *sl;
    int busy = 0;
    double compactions = 0;
    json_array_foreach(json_object_get(s, "slots"), i, sl) {
        const char *st = json_string_value(json_object_get(sl, "state"));
        busy += st && strcmp(st, "idle") != 0;
        compactions += num(sl, "compactions");
    }
    metric(&b, "keel_requests_processing", "gauge", "Slots serving a request.", busy);
    metric(&b, "keel_slots", "gauge", "Slots.", num(s, "n_slots"));
    double pt = num(s, "prompt_tokens"), ct = num(s, "cached_tokens"), gt = num(s, "completion_tokens");
    double ps = num(s, "prompt_seconds"), gs = num(s, "predicted_seconds");
    metric(&b, "keel_prompt_tokens_total", "counter", "Prompt tokens of finished requests (tokens in).", pt);
    metric(&b, "keel_prompt_tokens_cached_total", "counter", "Prompt tokens reused from a slot's cache.", ct);
    metric(&b, "keel_tokens_predicted_total", "counter", "Generated tokens (tokens out).", gt);
    metric(&b, "keel_prompt_seconds_total", "counter", "Time spent on prompts (prefill, to the first token).", ps);
    metric(&b, "keel_tokens_predicted_seconds_total", "counter", "Time spent generating after the first token.", gs);
    metric(&b, "keel_prompt_tokens_seconds", "gauge", "Prompt processing speed: prefilled tokens per second.",
           ps > 0 ? (pt - ct) / ps : 0);
    metric(&b, "keel_predicted_tokens_seconds", "gauge", "Decode speed: generated tokens per second.", gs > 0 ? gt / gs : 0);
    json_t *tt = json_object_get(s, "ttft_seconds");
    if (json_is_object(tt)) {
        head(&b, "keel_time_to_first_token_seconds", "histogram", "Time to first token.");
        json_t *bk;
        json_array_foreach(json_object_get(tt, "buckets"), i, bk) {
            json_t *le = json_array_get(bk, 0), *cnt = json_array_get(bk, 1);
            if (!json_is_number(le) || !json_is_number(cnt)) continue;
            srv_buf_addf(&b, "keel_time_to_first_token_seconds_bucket{le=\"%g\"} %.17g\n", json_number_value(le),
                         json_number_value(cnt));
        }
        srv_buf_addf(&b, "keel_time_to_first_token_seconds_bucket{le=\"+Inf\"} %.17g\n", num(tt, "count"));
        srv_buf_addf(&b, "keel_time_to_first_token_seconds_sum %.17g\n", num(tt, "sum"));
        srv_buf_addf(&b, "keel_time_to_first_token_seconds_count %.17g\n", num(tt, "count"));
    }
    json_t *kv = json_object_get(s, "kv");
    if (json_is_object(kv)) {
        json_t *g;
        head(&b, "keel_kv_cells_used", "gauge", "KV cells in use, per cell table group.");
        json_array_foreach(json_object_get(kv, "groups"), i, g)
            srv_buf_addf(&b, "keel_kv_cells_used{group=\"%lld\"} %.17g\n", (long long)num(g, "group"), num(g, "cells_used"));
        head(&b, "keel_kv_cells_capacity", "gauge", "KV cells of each cell table group.");
        json_array_foreach(json_object_get(kv, "groups"), i, g)
            srv_buf_addf(&b, "keel_kv_cells_capacity{group=\"%lld\"} %.17g\n", (long long)num(g, "group"), num(g, "cells_cap"));
        metric(&b, "keel_kv_bytes_used", "gauge", "Column bytes of occupied KV cells.", num(kv, "bytes_used"));
        metric(&b, "keel_kv_bytes_total", "gauge", "Bytes the KV memory allocated.", num(kv, "bytes_total"));
    }
    head(&b, "keel_slot_cached_tokens", "gauge", "Tokens cached in each slot.");
    json_array_foreach(json_object_get(s, "slots"), i, sl)
        srv_buf_addf(&b, "keel_slot_cached_tokens{slot=\"%lld\"} %.17g\n", (long long)num(sl, "id"), num(sl, "cached_tokens"));
    metric(&b, "keel_kv_compactions_total", "counter", "KV compactions over all slots.", compactions);
    json_t *cr = json_object_get(s, "cache_reuse");
    if (json_is_object(cr)) {
        const char *k;
        json_t *v;
        head(&b, "keel_cache_reuse_total", "counter",
             "Requests by how they used their slot's cache: new, reused, partial (a checkpoint below the "
             "divergence), reset_* (shared tokens lost, by reason).");
        json_object_foreach(cr, k, v)
            if (json_is_number(v)) srv_buf_addf(&b, "keel_cache_reuse_total{result=\"%s\"} %.17g\n", k, json_number_value(v));
    }
    json_t *spec = json_object_get(s, "speculative");
    if (json_is_object(spec)) {
        metric(&b, "keel_spec_drafted_tokens_total", "counter", "Tokens drafted by speculative decoding and verified.",
               num(spec, "drafted_tokens"));
        metric(&b, "keel_spec_accepted_tokens_total", "counter", "Drafted tokens accepted.",
               num(spec, "accepted_tokens"));
    }
    metric(&b, "keel_cache_lost_tokens_total", "counter",
           "Prompt tokens shared with a slot's cache that were computed again (no checkpoint covered them).",
           num(s, "cache_lost_tokens"));
    metric(&b, "keel_checkpoint_failures_total", "counter", "Checkpoints at prompt marks that could not be taken.",
           num(s, "checkpoint_failures"));
    json_t *pc = json_object_get(s, "prompt_cache");
    if (json_is_object(pc)) export_object(&b, pc, "prompt_cache");
    json_t *rc = json_object_get(s, "remote_cache"); /* --cache-redis (docs/cache-tier.md) */
    if (json_is_object(rc)) {
        static const char *const counters[][2] = {
            {"hits", "Prompts resumed from the shared cache tier."},
            {"misses", "Prompts that looked in the shared cache tier and found nothing usable."},
            {"hit_tokens", "Prompt tokens resumed from the shared cache tier."},
            {"bytes_in", "Bytes read from the shared cache tier."},
            {"bytes_out", "Bytes written to the shared cache tier."},
            {"writes", "States written to the shared cache tier."},
            {"errors", "Exchanges with the shared cache tier that failed."},
            {"timeouts", "Exchanges with the shared cache tier that timed out."},
            {"rejected", "Values from the shared cache tier refused (corrupted, truncated, foreign)."},
            {"dropped", "States not written to the shared cache tier (queue full, or the server down)."},
        };
        for (size_t c = 0; c < sizeof counters / sizeof counters[0]; c++) {
            char name[96];
            snprintf(name, sizeof name, "keel_remote_cache_%s_total", counters[c][0]);
            metric(&b, name, "counter", counters[c][1], num(rc, counters[c][0]));
        }
        metric(&b, "keel_remote_cache_up", "gauge", "1 when the last exchange with the shared cache tier succeeded.",
               json_is_true(json_object_get(rc, "up")) ? 1.0 : 0.0);
        metric(&b, "keel_remote_cache_queue_bytes", "gauge", "State bytes waiting to be written to the shared cache tier.",
               num(rc, "queue_bytes"));
    }
    json_t *ck = json_object_get(s, "checkpoints");
    if (json_is_object(ck)) export_object(&b, ck, "checkpoints");
    json_t *plan = json_object_get(s, "plan");
    double planned = 0;
    if (json_is_object(plan)) {
        const char *k;
        json_t *v;
        head(&b, "keel_plan_bytes", "gauge", "The memory plan printed at start, by part.");
        json_object_foreach(plan, k, v) {
            if (!json_is_number(v)) continue;
            srv_buf_addf(&b, "keel_plan_bytes{part=\"%s\"} %.17g\n", k, json_number_value(v));
        }
        planned = num(plan, "weights_mapped") + num(plan, "context_bytes") + num(plan, "checkpoint_bytes") +
                  num(plan, "draft_weights_mapped") + num(plan, "draft_context_bytes");
    }
    planned += num(pc, "limit_bytes");
    metric(&b, "keel_plan_total_bytes", "gauge", "The weights, the context and the prompt cache's bound.", planned);
    metric(&b, "keel_rss_bytes", "gauge", "Resident set size of the process.", (double)rss_bytes);
    json_decref(s);
    if (b.overflow) {
        srv_buf_free(&b);
        return NULL;
    }
    return srv_buf_take(&b);
}
