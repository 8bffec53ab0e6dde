/*
 * eng_sched.c — the chat engine's scheduler: the request queue, admission
 * of a request to a slot (the idle slot whose cache shares the longest
 * prefix with the prompt; the cache truncated at the divergence where the
 * memory can rewind there, else reset), one batched step over all slots
 * (each generating slot's next token and a fair share of prefill chunks),
 * and the output path of a slot: detokenizer stream -> stop strings ->
 * tool-call / reasoning parser -> events, then the response JSON.
 *
 * Invariants (docs/engine.md):
 *   - slot->hist[0 .. n_hist) are exactly the tokens decoded into the
 *     slot's sequence, in order; without compaction the cache holds them at
 *     positions 0 .. n_hist-1, with it (hist_compacted) the memory holds a
 *     compacted summary that can only be extended, never truncated;
 *   - a slot is IDLE with no request, or serves exactly one;
 *   - every request admitted ends with exactly one DONE event.
 */
#include "eng.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const double eng_ttft_le[ENG_TTFT_BUCKETS] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 15, 20};

const char *const eng_cache_kind_names[ENG_CACHE_KINDS] = {
    "new", "reused", "partial", "reset_no_checkpoint", "reset_compacted", "reset_history_lost",
};

/* ---- small helpers ------------------------------------------------------- */

static keel_status text_append(eng_text *t, const char *s, size_t n)
{
    size_t need;
    if (!size_add(t->len, n, &need) || !size_add(need, 1, &need)) return KEEL_EOVERFLOW;
    if (need > t->cap) {
        size_t cap = t->cap ? t->cap : 256;
        while (cap < need)
            if (!size_mul(cap, 2, &cap)) return KEEL_EOVERFLOW;
        char *d = base_realloc(t->data, t->cap, cap);
        if (!d) return KEEL_ENOMEM;
        t->data = d;
        t->cap = cap;
    }
    memcpy(t->data + t->len, s, n);
    t->len += n;
    t->data[t->len] = 0;
    return KEEL_OK;
}

static void text_free(eng_text *t)
{
    base_free(t->data, t->cap);
    memset(t, 0, sizeof *t);
}

static int32_t common_prefix(const int32_t *a, int32_t na, const int32_t *b, int32_t nb)
{
    int32_t n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

static uint64_t now_ns(void)
{
    return keel_time_ns();
}

/* ---- events -------------------------------------------------------------- */

static void on_toolcall(void *user, const toolcall_event *tev)
{
    eng_slot *sl = user;
    eng_req *r = sl->req;
    keel_event ev;
    memset(&ev, 0, sizeof ev);
    ev.request = r->id;
    ev.index = tev->index;
    ev.text = tev->text;
    ev.len = tev->len;
    /* a continued message's own text: the client has it */
    if (tev->kind == TOOLCALL_EV_CONTENT || tev->kind == TOOLCALL_EV_REASONING) {
        eng_pre_skip(&sl->pre, tev->kind == TOOLCALL_EV_REASONING, &ev.text, &ev.len);
        if (ev.len == 0) return;
    }
    switch (tev->kind) {
    case TOOLCALL_EV_CONTENT: ev.kind = KEEL_EVENT_CONTENT; break;
    case TOOLCALL_EV_REASONING: ev.kind = KEEL_EVENT_REASONING; break;
    case TOOLCALL_EV_CALL_BEGIN:
        ev.kind = KEEL_EVENT_TOOL_BEGIN;
        ev.id = tev->id;
        ev.name = tev->name;
        break;
    case TOOLCALL_EV_CALL_ARGS: ev.kind = KEEL_EVENT_TOOL_ARGS; break;
    case TOOLCALL_EV_CALL_END:
        ev.kind = KEEL_EVENT_TOOL_END;
        ev.error = tev->error;
        break;
    }
    if (r->cb && !r->cb(r->user, &ev)) atomic_store(&r->cancel, 1);
}

/* ---- the response ----------------------------------------------------------- */

static int set_num(json_t *o, const char *k, double v)
{
    return json_object_set_new(o, k, json_real(v));
}

static int set_int(json_t *o, const char *k, int64_t v)
{
    return json_object_set_new(o, k, json_integer(v));
}

/* in[0..n) with every invalid byte replaced by U+FFFD; out has 3n bytes. */
static size_t utf8_clean(const char *in, size_t n, char *out);

/* {"token", "logprob", "bytes"} of one token (the piece's raw bytes; the
 * text with invalid UTF-8 as U+FFFD). NULL on OOM. */
static json_t *lp_token_json(const keel_engine *e, int32_t tok, float lp)
{
    char piece[256], clean[3 * 256];
    size_t n = 0;
    if (keel_token_piece(e->model, tok, piece, sizeof piece, &n) != KEEL_OK) n = 0;
    json_t *bytes = json_array();
    for (size_t i = 0; bytes && i < n; i++)
        if (json_array_append_new(bytes, json_integer((uint8_t)piece[i])) != 0) {
            json_decref(bytes);
            bytes = NULL;
        }
    if (!bytes) return NULL;
    size_t c = utf8_clean(piece, n, clean);
    return json_pack("{s:s%,s:f,s:o}", "token", clean, c, "logprob", (double)lp, "bytes", bytes);
}

/* {"token", "logprob", "bytes", "top_logprobs": [...]} of one entry. NULL
 * on OOM. */
static json_t *lp_entry_json(const keel_engine *e, const eng_lp *x)
{
    json_t *t = lp_token_json(e, x->tok, x->lp), *top = json_array();
    for (int32_t j = 0; t && top && j < x->n_top; j++)
        if (json_array_append_new(top, lp_token_json(e, x->top_tok[j], x->top_lp[j])) != 0) {
            json_decref(top);
            top = NULL;
        }
    if (!t || !top || json_object_set_new(t, "top_logprobs", top) != 0) {
        if (t) json_decref(t);
        else if (top) json_decref(top);
        t = NULL;
    }
    return t;
}

/* {"content": [entries]}: OpenAI's shape. NULL on OOM. */
static json_t *logprobs_json(const keel_engine *e, const eng_slot *sl)
{
    json_t *content = json_array();
    for (int32_t i = 0; content && i < sl->n_lp; i++)
        if (json_array_append_new(content, lp_entry_json(e, &sl->lp[i])) != 0) {
            json_decref(content);
            content = NULL;
        }
    return content ? json_pack("{s:o}", "content", content) : NULL;
}

/* The LOGPROB event of slot's newest entry (before its text goes out). */
static void emit_logprob(keel_engine *e, eng_slot *sl)
{
    eng_req *r = sl->req;
    const eng_lp *x = &sl->lp[sl->n_lp - 1];
    json_t *j = lp_entry_json(e, x);
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    if (j) json_decref(j);
    keel_event ev;
    memset(&ev, 0, sizeof ev);
    ev.kind = KEEL_EVENT_LOGPROB;
    ev.request = r->id;
    ev.index = -1;
    ev.text = s ? s : "{}";
    ev.len = strlen(ev.text);
    ev.token = x->tok;
    ev.logprob = x->lp;
    if (r->cb && !r->cb(r->user, &ev)) atomic_store(&r->cancel, 1);
    if (s) chat_json_free(s);
}

/* The log-sum-exp of the n logits (non-finite ones left out) and, into
 * out, their k largest as log-probabilities, descending (ties: the lower
 * id first). */
static double lp_row(const float *lg, int32_t n, int32_t k, eng_lp *out)
{
    float mx = -INFINITY;
    for (int32_t i = 0; i < n; i++)
        if (isfinite(lg[i]) && lg[i] > mx) mx = lg[i];
    double s = 0.0;
    for (int32_t i = 0; i < n; i++)
        if (isfinite(lg[i])) s += exp((double)lg[i] - mx);
    double lse = (double)mx + log(s);
    out->n_top = 0;
    for (int32_t i = 0; i < n && k > 0; i++) {
        float v = lg[i];
        if (!isfinite(v) || (out->n_top == k && v <= out->top_lp[k - 1])) continue;
        int32_t j = out->n_top < k ? out->n_top++ : k - 1;
        for (; j > 0 && out->top_lp[j - 1] < v; j--) {
            out->top_lp[j] = out->top_lp[j - 1];
            out->top_tok[j] = out->top_tok[j - 1];
        }
        out->top_lp[j] = v;
        out->top_tok[j] = i;
    }
    for (int32_t j = 0; j < out->n_top; j++) out->top_lp[j] = (float)((double)out->top_lp[j] - lse);
    return lse;
}

/* The response JSON of slot's request (status: how it ended). */
static char *build_response(keel_engine *e, eng_slot *sl, const toolcall_result *res, keel_status status,
                            const char *error, size_t *len)
{
    json_t *o = json_object(), *msg = NULL;
    char err[BASE_ERR_CAP];
    if (!o) return NULL;
    int bad = 0;
    bad |= set_int(o, "id", (int64_t)sl->req->id);
    if (res && toolcall_result_json(res, &msg, err) == KEEL_OK) {
        json_t *c = json_object_get(msg, "content");
        bad |= json_object_set(o, "content", c ? c : json_null());
        json_t *rc = json_object_get(msg, "reasoning_content");
        bad |= json_object_set(o, "reasoning_content", rc ? rc : json_null());
        json_t *tc = json_object_get(msg, "tool_calls");
        bad |= json_object_set_new(o, "tool_calls", tc ? json_incref(tc) : json_array());
        json_decref(msg);
    } else {
        bad |= json_object_set_new(o, "content", json_null());
        bad |= json_object_set_new(o, "reasoning_content", json_null());
        bad |= json_object_set_new(o, "tool_calls", json_array());
    }
    if (sl->lp) bad |= json_object_set_new(o, "logprobs", logprobs_json(e, sl));
    bad |= json_object_set_new(o, "finish_reason", json_string(sl->finish ? sl->finish : "error"));
    if (sl->req->o.tool_note) bad |= json_object_set_new(o, "tool_grammar", json_string(sl->req->o.tool_note));
    bad |= json_object_set_new(o, "stop_sequence", sl->stop_hit ? json_string(sl->stop_hit) : json_null());
    if (status != KEEL_OK) {
        bad |= json_object_set_new(o, "error", json_string(error && *error ? error : keel_strerror(status)));
        bad |= json_object_set_new(o, "status", json_string(keel_status_name(status)));
    }
    if (status == KEEL_ECONTEXT && sl->n_too_long > 0) bad |= set_int(o, "prompt_limit", sl->prompt_limit);
    json_t *u = json_object(), *t = json_object(), *m = json_object();
    if (!u || !t || !m) bad = 1;
    if (u) {
        bad |= set_int(u, "prompt_tokens", status == KEEL_ECONTEXT && sl->n_too_long > 0 ? sl->n_too_long : sl->n_prompt);
        bad |= set_int(u, "cached_tokens", sl->n_reused);
        bad |= set_int(u, "completion_tokens", sl->n_gen);
        if (e->spec) {
            bad |= set_int(u, "drafted_tokens", sl->n_drafted);
            bad |= set_int(u, "accepted_tokens", sl->n_accepted);
        }
        bad |= json_object_set_new(o, "usage", u);
    }
    if (t) {
        uint64_t t0 = sl->t_start, t1 = sl->t_prompt_end ? sl->t_prompt_end : sl->t_end, t2 = sl->t_end;
        double pms = (double)(t1 - t0) * 1e-6, gms = (double)(t2 - t1) * 1e-6;
        int32_t np = sl->n_fed - sl->n_reused;
        bad |= set_int(t, "prompt_n", np);
        bad |= set_num(t, "prompt_ms", pms);
        bad |= set_num(t, "prompt_per_second", pms > 0 ? np / (pms * 1e-3) : 0.0);
        bad |= set_int(t, "predicted_n", sl->n_gen);
        bad |= set_num(t, "predicted_ms", gms);
        bad |= set_num(t, "predicted_per_second", gms > 0 ? sl->n_gen / (gms * 1e-3) : 0.0);
        if (e->spec) { /* llama-server's names */
            bad |= set_int(t, "draft_n", sl->n_drafted);
            bad |= set_int(t, "draft_n_accepted", sl->n_accepted);
        }
        bad |= json_object_set_new(o, "timings", t);
    }
    if (m) {
        keel_mem *mem = keel_context_memory(e->ctx);
        bad |= set_int(m, "slot", sl->seq);
        bad |= set_int(m, "cells", keel_mem_seq_cells(mem, sl->seq));
        bad |= set_int(m, "compactions", keel_mem_seq_compactions(mem, sl->seq) - sl->compactions_at_start);
        bad |= json_object_set_new(m, "cache", json_string(sl->cache_note[0] ? sl->cache_note : "reused"));
        bad |= set_int(m, "shared_tokens", sl->n_shared);
        bad |= set_int(m, "reused_tokens", sl->n_reused);
        bad |= json_object_set_new(o, "memory", m);
    }
    char *s = bad ? NULL : json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!s) return NULL;
    size_t n = strlen(s);
    char *copy = base_alloc(n + 1);
    if (copy) {
        memcpy(copy, s, n + 1);
        *len = n;
    }
    chat_json_free(s);
    return copy;
}

static bool slot_output(keel_engine *e, eng_slot *sl, const char *s, size_t n, keel_status *st);

/* ---- finishing a request ------------------------------------------------------ */

static void release_request(keel_engine *e, eng_slot *sl)
{
    base_free(sl->lp, (size_t)sl->cap_lp * sizeof(eng_lp));
    sl->lp = NULL;
    sl->n_lp = sl->cap_lp = 0;
    keel_sampler_close(sl->samp);
    sl->samp = NULL;
    if (sl->gm) { /* parked for the next request with this grammar (the oldest leaves) */
        eng_gpark *dst = NULL;
        if (keel_grammar_matcher_reset(sl->gm) == KEEL_OK) {
            dst = &e->gpark[0];
            for (int i = 0; i < ENG_GRAMMAR_PARK; i++) {
                if (!e->gpark[i].m) {
                    dst = &e->gpark[i];
                    break;
                }
                if (e->gpark[i].last_used < dst->last_used) dst = &e->gpark[i];
            }
            eng_gpark_free(dst);
            *dst = sl->gp;
            dst->last_used = ++e->clock;
        } else {
            eng_gpark_free(&sl->gp);
        }
        memset(&sl->gp, 0, sizeof sl->gp);
        sl->gm = NULL;
        sl->lazy = false;
    }
    toolcall_close(sl->tp);
    sl->tp = NULL;
    eng_slot_prefill_free(sl);
    eng_pre_free(&sl->pre);
    text_free(&sl->pend);
    sl->stop_hit = NULL;
    sl->req = NULL;
    sl->state = ENG_SLOT_IDLE;
    sl->last_used = ++e->clock;
}

/* Hands the response to the request's waiter, or (a submitted request:
 * its DONE event carried it) queues the request to be freed. Takes mu. */
static void complete(keel_engine *e, eng_req *r, keel_status status, char *resp, size_t len)
{
    pthread_mutex_lock(&e->mu);
    for (eng_req **pp = &e->live_head; *pp; pp = &(*pp)->live_next)
        if (*pp == r) {
            *pp = r->live_next;
            break;
        }
    r->status = status;
    r->response = resp;
    r->response_len = len;
    r->done = true;
    if (!r->keep) {
        r->next = e->done_head;
        e->done_head = r;
    }
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

void eng_reap(keel_engine *e)
{
    pthread_mutex_lock(&e->mu);
    eng_req *list = e->done_head;
    e->done_head = NULL;
    pthread_mutex_unlock(&e->mu);
    while (list) {
        eng_req *next = list->next;
        eng_req_free(list);
        list = next;
    }
}

/* Ends the slot's request: flushes the output, parses the rest, sends DONE.
 * status != OK: a failure (error text in the response). */
static void finish(keel_engine *e, eng_slot *sl, const char *reason, keel_status status, const char *error)
{
    eng_req *r = sl->req;
    if (!r) return;
    sl->finish = reason;
    char piece[1024];
    size_t pn = 0;
    toolcall_result res;
    bool have = false;
    if (sl->tp) {
        keel_status st = KEEL_OK;
        /* the stream's last bytes go through the same path (UTF-8, stop strings) */
        if (status == KEEL_OK && !sl->stop_hit && keel_detok_stream_flush(&sl->ds, piece, sizeof piece, &pn) == KEEL_OK &&
            pn && slot_output(e, sl, piece, pn, &st))
            reason = sl->finish = "stop";
        /* text held back for a stop string that never came is output */
        if (st == KEEL_OK && sl->pend.len && !sl->stop_hit) st = toolcall_feed(sl->tp, sl->pend.data, sl->pend.len);
        sl->pend.len = 0;
        if (st == KEEL_OK) st = toolcall_finish(sl->tp, &res);
        have = st == KEEL_OK;
        if (st != KEEL_OK && status == KEEL_OK) {
            status = st;
            error = "output parser failed";
        }
    }
    if (have) { /* the response carries the new text, not the prefill the client sent */
        const eng_pre *pp = &sl->pre;
        if (pp->len[0] && res.content_len >= pp->len[0] && memcmp(res.content, pp->text[0], pp->len[0]) == 0) {
            res.content += pp->len[0];
            res.content_len -= pp->len[0];
        }
        if (pp->len[1] && res.reasoning_len >= pp->len[1] && memcmp(res.reasoning, pp->text[1], pp->len[1]) == 0) {
            res.reasoning += pp->len[1];
            res.reasoning_len -= pp->len[1];
        }
    }
    if (have && res.n_calls > 0 && strcmp(reason, "stop") == 0) sl->finish = "tool_calls";
    sl->t_end = now_ns();
    size_t len = 0;
    char *resp = build_response(e, sl, have ? &res : NULL, status, error, &len);
    /* a cancelled request ends without an error in its response, but with
     * KEEL_ECANCELED as its status */
    if (strcmp(reason, "cancelled") == 0 && status == KEEL_OK) status = KEEL_ECANCELED;
    /* every counter of the request before its DONE event: a client that
     * reads the stats (/metrics) after its response sees this request */
    pthread_mutex_lock(&e->mu);
    e->n_requests++;
    e->n_failed += status != KEEL_OK && status != KEEL_ECANCELED;
    e->n_cancelled += status == KEEL_ECANCELED;
    e->n_prompt_tokens += sl->n_prompt;
    e->n_cached_tokens += sl->n_reused;
    e->n_gen_tokens += sl->n_gen;
    e->n_drafted += sl->n_drafted;
    e->n_accepted += sl->n_accepted;
    if (sl->t_prompt_end) {
        double ttft = (double)(sl->t_prompt_end - sl->t_start) * 1e-9;
        e->prompt_seconds += ttft;
        e->predicted_seconds += (double)(sl->t_end - sl->t_prompt_end) * 1e-9;
        for (int32_t b = 0; b < ENG_TTFT_BUCKETS; b++) e->ttft_counts[b] += ttft <= eng_ttft_le[b];
        e->ttft_counts[ENG_TTFT_BUCKETS]++;
        e->ttft_sum += ttft;
    }
    pthread_mutex_unlock(&e->mu);
    keel_event ev;
    memset(&ev, 0, sizeof ev);
    ev.kind = KEEL_EVENT_DONE;
    ev.request = r->id;
    ev.index = -1;
    ev.response = resp ? resp : "{\"error\":\"out of memory\"}";
    ev.status = resp ? status : KEEL_ENOMEM;
    if (r->cb) r->cb(r->user, &ev);
    release_request(e, sl);
    complete(e, r, resp ? status : KEEL_ENOMEM, resp, len);
    if (e->tier && status == KEEL_OK) eng_remote_store(e, sl);
}

/* A request that never reached a slot (or failed at admission; a prompt
 * too long: n_too_long tokens > limit, else 0, 0). */
void eng_finish_error(keel_engine *e, eng_slot *sl, keel_status st, const char *why)
{
    finish(e, sl, "error", st, why);
}

static void fail_unstarted(keel_engine *e, eng_req *r, keel_status status, const char *error, int64_t n_too_long,
                           int32_t limit)
{
    eng_slot tmp;
    memset(&tmp, 0, sizeof tmp);
    tmp.n_too_long = n_too_long;
    tmp.prompt_limit = limit;
    tmp.req = r;
    tmp.seq = -1;
    tmp.finish = strcmp(error, "cancelled") == 0 ? "cancelled" : "error";
    tmp.t_start = tmp.t_end = now_ns();
    size_t len = 0;
    char *resp = build_response(e, &tmp, NULL, status, error, &len);
    keel_event ev;
    memset(&ev, 0, sizeof ev);
    ev.kind = KEEL_EVENT_DONE;
    ev.request = r->id;
    ev.index = -1;
    ev.response = resp ? resp : "{\"error\":\"out of memory\"}";
    ev.status = status;
    /* counted as finish() counts: requests = ok + failed + cancelled */
    pthread_mutex_lock(&e->mu);
    e->n_requests++;
    e->n_failed += status != KEEL_OK && status != KEEL_ECANCELED;
    e->n_cancelled += status == KEEL_ECANCELED;
    pthread_mutex_unlock(&e->mu);
    if (r->cb) r->cb(r->user, &ev);
    complete(e, r, status, resp, len);
}

void eng_gpark_free(eng_gpark *p)
{
    keel_grammar_matcher_close(p->m);
    keel_grammar_close(p->g);
    base_free(p->text, p->len + 1);
    memset(p, 0, sizeof *p);
}

void eng_slot_clear(keel_engine *e, eng_slot *sl)
{
    keel_mem *mem = keel_context_memory(e->ctx);
    if (keel_mem_seq_rm(mem, sl->seq, -1, -1) != KEEL_OK) {
        /* cannot happen for a slot's own sequence id; if it did, nothing
         * cached can be trusted: every slot starts over */
        keel_mem_clear(mem);
        for (int32_t i = 0; i < e->n_slots; i++) {
            e->slots[i].n_hist = 0;
            e->slots[i].hist_compacted = e->slots[i].hist_lost = false;
        }
    }
    sl->n_hist = 0;
    sl->hist_compacted = sl->hist_lost = false;
}

void eng_finish_all(keel_engine *e, const char *why)
{
    for (int32_t i = 0; i < e->n_slots; i++)
        if (e->slots[i].req) finish(e, &e->slots[i], why, KEEL_OK, NULL);
    for (;;) {
        pthread_mutex_lock(&e->mu);
        eng_req *r = e->queue_head;
        if (r) {
            e->queue_head = r->next;
            if (!e->queue_head) e->queue_tail = NULL;
            e->n_queued--;
        }
        pthread_mutex_unlock(&e->mu);
        if (!r) break;
        fail_unstarted(e, r, KEEL_ECANCELED, "cancelled", 0, 0);
    }
}

/* ---- output path: UTF-8, stop strings, then the parser -------------------------- */

/* in[0..n) with every invalid byte replaced by U+FFFD; out has 3n bytes.
 * The detokenizer stream never splits a character across pieces, so
 * cleaning piece by piece equals cleaning the whole text. */
static size_t utf8_clean(const char *in, size_t n, char *out)
{
    const uint8_t *s = (const uint8_t *)in;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        size_t k = base_utf8_len(s + i, n - i);
        if (k == 0) {
            memcpy(out + o, "\xef\xbf\xbd", 3);
            o += 3;
            i++;
        } else {
            memcpy(out + o, s + i, k);
            o += k;
            i += k;
        }
    }
    return o;
}

/* Releases pend's text that can no longer start a stop string; returns
 * true when a stop string matched (the request ends "stop"). */
static bool slot_output(keel_engine *e, eng_slot *sl, const char *s, size_t n, keel_status *st)
{
    (void)e;
    char clean[3 * 1024];
    if (n <= 1024) {
        n = utf8_clean(s, n, clean);
        s = clean;
    } else {
        *st = KEEL_EINTERNAL; /* pieces are at most 1 KiB (the caller's buffer) */
        return false;
    }
    *st = text_append(&sl->pend, s, n);
    if (*st != KEEL_OK) return false;
    const eng_opts *o = &sl->req->o;
    size_t release = sl->pend.len;
    bool hit = false;
    if (o->n_stop > 0) {
        size_t best = SIZE_MAX;
        int32_t which = -1;
        for (int32_t i = 0; i < o->n_stop; i++) {
            const char *p = memmem(sl->pend.data, sl->pend.len, o->stop[i], strlen(o->stop[i]));
            if (p && (size_t)(p - sl->pend.data) < best) {
                best = (size_t)(p - sl->pend.data);
                which = i;
            }
        }
        if (which >= 0) {
            release = best;
            hit = true;
            sl->stop_hit = o->stop[which];
        } else {
            /* hold back the longest suffix that is a proper prefix of a stop string */
            size_t keep = 0;
            for (int32_t i = 0; i < o->n_stop; i++) {
                size_t L = strlen(o->stop[i]);
                for (size_t k = L - 1 < sl->pend.len ? L - 1 : sl->pend.len; k > keep; k--)
                    if (memcmp(sl->pend.data + sl->pend.len - k, o->stop[i], k) == 0) {
                        keep = k;
                        break;
                    }
            }
            release = sl->pend.len - keep;
        }
    }
    if (release > 0) {
        *st = toolcall_feed(sl->tp, sl->pend.data, release);
        memmove(sl->pend.data, sl->pend.data + release, sl->pend.len - release);
        sl->pend.len -= release;
    }
    if (hit) sl->pend.len = 0; /* the stop string and what follows are not output */
    return hit;
}

/* ---- admission ------------------------------------------------------------------ */

/* The idle slot to serve prompt: longest reusable prefix, then least
 * recently used. NULL when none is idle. */
static eng_slot *pick_slot(keel_engine *e, const int32_t *prompt, int32_t n, int32_t *lcp_out)
{
    eng_slot *best = NULL;
    int32_t best_lcp = -1;
    for (int32_t i = 0; i < e->n_slots; i++) {
        eng_slot *sl = &e->slots[i];
        if (sl->state != ENG_SLOT_IDLE) continue;
        int32_t lcp = common_prefix(sl->hist, sl->n_hist, prompt, n);
        if (sl->hist_compacted && lcp < sl->n_hist) lcp = 0; /* a compacted cache only extends */
        if (lcp > best_lcp || (lcp == best_lcp && sl->last_used < best->last_used)) {
            best = sl;
            best_lcp = lcp;
        }
    }
    *lcp_out = best_lcp < 0 ? 0 : best_lcp;
    return best;
}

static void note(eng_slot *sl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(eng_slot *sl, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sl->cache_note, sizeof sl->cache_note, fmt, ap);
    va_end(ap);
}

/* Makes the slot's cache the longest usable prefix of its prompt: truncates
 * at the divergence when the memory can rewind there exactly, else to the
 * newest checkpoint at or before it, else resets. Says how in
 * sl->cache_note and returns the kind. */
static keel_status reuse_prefix(keel_engine *e, eng_slot *sl, int32_t lcp, eng_cache_kind *kind, char *err)
{
    keel_mem *mem = keel_context_memory(e->ctx);
    if (lcp >= sl->n_prompt) lcp = sl->n_prompt - 1; /* the last prompt token gives the logits */
    sl->n_shared = lcp;
    *kind = ENG_CACHE_REUSED;
    note(sl, "reused");
    if (sl->hist_lost) {
        eng_slot_clear(e, sl);
        *kind = ENG_CACHE_RESET_HIST;
        note(sl, "reset: the slot's history outgrew max_prompt_tokens");
    } else if (sl->hist_compacted) {
        if (lcp < sl->n_hist) {
            eng_slot_clear(e, sl);
            *kind = ENG_CACHE_RESET_COMPACT;
            note(sl, "reset: the cache was compacted and the prompt does not extend it");
        }
    } else if (lcp < sl->n_hist) {
        /* exact where the memory still holds what the divergence needs; else
         * the newest checkpoint at or before it (a recurrent state, or the
         * sliding rings' rows); else from nothing */
        int32_t resume = lcp;
        keel_status st = keel_context_rewind(e->ctx, sl->seq, lcp, &resume);
        if (st != KEEL_OK) return base_err(err, st, "cache: %s", keel_context_last_error(e->ctx));
        sl->n_hist = BASE_MIN(resume, lcp);
        if (sl->n_hist == 0 && lcp > 0) {
            *kind = ENG_CACHE_RESET_CKPT;
            note(sl, "reset: the prompt diverges at token %d %s", lcp,
                 keel_mem_is_recurrent(mem) ? "and no recurrent-state checkpoint lies at or before it"
                                            : "where the sliding layers no longer hold the tokens and no "
                                              "checkpoint covers it");
        } else if (sl->n_hist < lcp) {
            *kind = ENG_CACHE_PARTIAL;
            note(sl, "partial: the prompt diverges at token %d; resumed from the checkpoint at %d", lcp,
                 sl->n_hist);
        }
    }
    sl->n_fed = sl->n_hist;
    sl->n_reused = sl->n_hist;
    if (*kind == ENG_CACHE_REUSED && sl->n_reused == 0) {
        *kind = ENG_CACHE_NEW;
        note(sl, "new");
    }
    return KEEL_OK;
}

/* A checkpoint the engine wanted and could not take or rank costs only
 * reuse later: counted (keel_engine_stats checkpoint_failures), not fatal. */
static void ckpt_failure(keel_engine *e)
{
    pthread_mutex_lock(&e->mu);
    e->ckpt_failed++;
    pthread_mutex_unlock(&e->mu);
}

/* The slot's checkpoints get the priorities of this prompt's marks (0
 * elsewhere): those where this conversation may diverge next are kept
 * longest. Priorities do not survive a session blob (the RAM prompt
 * cache), so they are set again at each admission. */
static void prioritize_checkpoints(keel_engine *e, eng_slot *sl)
{
    keel_mem *mem = keel_context_memory(e->ctx);
    keel_mem_ckpt_info local[64], *ck = local;
    int32_t n = 0;
    keel_mem_ckpt_list(mem, sl->seq, NULL, 0, &n);
    if (n > 64 && !(ck = base_alloc((size_t)n * sizeof *ck))) { /* --ctx-checkpoints above 64 */
        ckpt_failure(e);
        return;
    }
    int32_t got = 0;
    keel_mem_ckpt_list(mem, sl->seq, ck, BASE_MAX(n, 64), &got);
    for (int32_t i = 0; i < BASE_MIN(n, got); i++) {
        int32_t prio = ENG_PRIO_PERIODIC;
        for (int32_t j = 0; j < sl->n_marks; j++)
            if (sl->marks[j].pos == ck[i].pos) prio = sl->marks[j].prio;
        if (ck[i].priority != prio && keel_mem_ckpt_set_prio(mem, sl->seq, ck[i].pos, prio) != KEEL_OK)
            ckpt_failure(e);
    }
    if (ck != local) base_free(ck, (size_t)n * sizeof *ck);
}

/* After a chunk: a checkpoint where the prefill reached one of its marks. */
static void checkpoint_marks(keel_engine *e, eng_slot *sl)
{
    if (keel_mem_ckpt_record_bytes(keel_context_memory(e->ctx)) == 0) return; /* marks for the prompt cache only */
    for (int32_t j = 0; j < sl->n_marks; j++)
        if (sl->marks[j].pos == sl->n_fed &&
            keel_mem_ckpt_take_prio(keel_context_memory(e->ctx), sl->seq, sl->marks[j].prio) != KEEL_OK)
            ckpt_failure(e);
}

/* The next mark past what the slot has fed, or the prompt's end. */
static int32_t next_mark(const keel_engine *e, const eng_slot *sl)
{
    if (keel_mem_ckpt_record_bytes(keel_context_memory(e->ctx)) == 0) return sl->n_prompt;
    for (int32_t j = 0; j < sl->n_marks; j++)
        if (sl->marks[j].pos > sl->n_fed) return sl->marks[j].pos;
    return sl->n_prompt;
}

/* Frees the caches of idle slots (least recently used first) until the
 * full-attention tables have need free cells or nothing is left to free.
 * Returns the free cells. */
static int32_t make_room(keel_engine *e, int32_t need)
{
    keel_mem *mem = keel_context_memory(e->ctx);
    int32_t room = mem_room(mem, 0);
    while (room < need) {
        eng_slot *lru = NULL;
        for (int32_t i = 0; i < e->n_slots; i++) {
            eng_slot *sl = &e->slots[i];
            if (sl->state == ENG_SLOT_IDLE && sl->n_hist > 0 && (!lru || sl->last_used < lru->last_used)) lru = sl;
        }
        if (!lru) break;
        eng_slot_clear(e, lru);
        room = mem_room(mem, 0);
    }
    return room;
}

/* KEEL_EVENT_PROMPT (admitted, before the prefill) or KEEL_EVENT_PROGRESS
 * (return_progress: the prefill advanced) for slot sl's request. A callback
 * returning false cancels the request. */
static void prompt_event(eng_slot *sl, keel_event_kind kind)
{
    eng_req *r = sl->req;
    keel_event ev;
    memset(&ev, 0, sizeof ev);
    ev.kind = kind;
    ev.request = r->id;
    ev.index = -1;
    ev.n_prompt_tokens = sl->n_prompt;
    ev.n_cached_tokens = sl->n_reused;
    if (kind == KEEL_EVENT_PROGRESS) {
        ev.n_processed = BASE_MIN(sl->n_fed, sl->n_prompt);
        ev.elapsed_ms = (double)(now_ns() - sl->t_start) * 1e-6;
    }
    if (r->cb && !r->cb(r->user, &ev)) atomic_store(&r->cancel, 1);
}

/* Starts r on the best idle slot; a request that cannot start ends here
 * with its DONE event (so the caller has nothing to handle). */
static void start_request(keel_engine *e, eng_req *r, jinja_buf *rendered)
{
    char err[BASE_ERR_CAP] = "";
    keel_status st;
    /* the prompt, into the scratch slot's buffer */
    eng_slot tmp;
    memset(&tmp, 0, sizeof tmp);
    tmp.prompt = e->slots[e->n_slots].prompt;
    if ((st = eng_prompt_tokens(e, &tmp, r, err, rendered)) != KEEL_OK) {
        eng_slot_prefill_free(&tmp);
        fail_unstarted(e, r, st, err, tmp.n_too_long, tmp.prompt_limit);
        return;
    }
    if (r->o.compact.policy == KEEL_COMPACT_NONE && tmp.n_prompt > e->cp.n_ctx) {
        eng_slot_prefill_free(&tmp);
        snprintf(err, sizeof err, "prompt: %d tokens, more than the cache's %d cells (no compaction)", tmp.n_prompt,
                 e->cp.n_ctx);
        fail_unstarted(e, r, KEEL_ECONTEXT, err, tmp.n_prompt, eng_prompt_limit(e, r));
        return;
    }
    keel_mem *mem = keel_context_memory(e->ctx);
    /* marks: where to checkpoint, and (the prompt cache) where a
     * conversation's fixed part ends */
    if ((keel_mem_ckpt_record_bytes(mem) > 0 || e->pc_limit > 0) &&
        (st = eng_prompt_marks(e, &tmp, r, rendered->data ? rendered->data : "", rendered->len)) != KEEL_OK) {
        eng_slot_prefill_free(&tmp);
        fail_unstarted(e, r, st, "checkpoint marks: out of memory", 0, 0);
        return;
    }
    int32_t lcp = 0;
    eng_slot *sl = pick_slot(e, tmp.prompt, tmp.n_prompt, &lcp);
    if (!sl) { /* the caller only admits with an idle slot */
        eng_slot_prefill_free(&tmp);
        fail_unstarted(e, r, KEEL_EINTERNAL, "no idle slot", 0, 0);
        return;
    }
    int32_t sys_end = 0; /* the end of the system prompt and tools, if marked */
    for (int32_t i = 0; i < tmp.n_marks; i++)
        if (tmp.marks[i].prio == ENG_PRIO_SYSTEM) sys_end = tmp.marks[i].pos;
    eng_pc_admit(e, sl, tmp.prompt, tmp.n_prompt, sys_end, &lcp);
    if (e->tier) eng_remote_admit(e, sl, tmp.prompt, tmp.n_prompt, &lcp);
    memcpy(sl->prompt, tmp.prompt, (size_t)tmp.n_prompt * sizeof(int32_t));
    sl->n_prompt = tmp.n_prompt;
    memcpy(sl->forced, tmp.forced, sizeof sl->forced);
    sl->n_forced = tmp.n_forced;
    sl->prefill = tmp.prefill; /* the slot owns it now */
    sl->n_prefill = tmp.n_prefill;
    memcpy(sl->marks, tmp.marks, sizeof sl->marks);
    sl->n_marks = tmp.n_marks;
    sl->req = r;
    sl->n_gen = 0;
    sl->n_drafted = sl->n_accepted = 0;
    sl->n_draft = 0;
    keel_spec_reset(e->spec, sl->seq);
    sl->finish = NULL;
    sl->stop_hit = NULL;
    sl->t_start = now_ns();
    sl->t_prompt_end = sl->t_end = 0;
    if (r->o.logprobs) { /* one entry per token the request may generate */
        int32_t cap = r->o.max_tokens >= 0 ? BASE_MIN(r->o.max_tokens, e->n_ctx_slot) : e->n_ctx_slot;
        sl->cap_lp = BASE_MAX(cap, 1);
        if (!(sl->lp = base_alloc((size_t)sl->cap_lp * sizeof(eng_lp)))) {
            sl->cap_lp = 0;
            st = base_err(err, KEEL_ENOMEM, "logprobs: out of memory");
            goto fail;
        }
        sl->n_lp = 0;
    }
    if (r->o.compact_set) sl->compact = r->o.compact;
    if ((st = keel_context_set_compact(e->ctx, sl->seq, &sl->compact)) != KEEL_OK) {
        snprintf(err, sizeof err, "kv_compact: %s", keel_context_last_error(e->ctx));
        goto fail;
    }
    eng_cache_kind kind;
    if ((st = reuse_prefix(e, sl, lcp, &kind, err)) != KEEL_OK) goto fail;
    pthread_mutex_lock(&e->mu);
    e->cache_counts[kind]++;
    e->cache_lost_tokens += sl->n_shared - sl->n_reused;
    pthread_mutex_unlock(&e->mu);
    if (sl->n_marks > 0 && keel_mem_ckpt_record_bytes(mem) > 0) prioritize_checkpoints(e, sl);
    sl->compactions_at_start = keel_mem_seq_compactions(mem, sl->seq);
    if ((st = keel_sampler_open(&r->o.samp, e->model->w.hp.n_vocab, &sl->samp)) != KEEL_OK) {
        keel_sampler_params_check(&r->o.samp, err);
        goto fail;
    }
    if (r->o.grammar) {
        /* a parked matcher of the same grammar keeps its caches; else the
         * request's grammar gets one (the vocabulary trie: once per engine;
         * this thread owns the slots and the park) */
        for (int i = 0; i < ENG_GRAMMAR_PARK && !sl->gm; i++) {
            eng_gpark *p = &e->gpark[i];
            if (p->m && p->len == r->o.grammar_len && memcmp(p->text, r->o.grammar_text, p->len) == 0 &&
                p->v == (r->o.markers ? e->gvocab_tool : e->gvocab)) {
                sl->gp = *p;
                memset(p, 0, sizeof *p);
                sl->gm = sl->gp.m;
            }
        }
        if (!sl->gm) {
            if (!e->gvocab && (st = keel_grammar_vocab_open(e->model, &e->gvocab, err)) != KEEL_OK) goto fail;
            /* a tool grammar: its markers may be the model's special tokens */
            if (r->o.markers && !e->gvocab_tool &&
                (st = engine_grammar_vocab_open_marked(e->model, r->o.markers, &e->gvocab_tool, err)) != KEEL_OK)
                goto fail;
            sl->gp.v = r->o.markers ? e->gvocab_tool : e->gvocab;
            if ((st = keel_grammar_matcher_open(r->o.grammar, sl->gp.v, &sl->gp.m, err)) != KEEL_OK) goto fail;
            sl->gp.g = r->o.grammar; /* the slot owns them now */
            sl->gp.text = r->o.grammar_text;
            sl->gp.len = r->o.grammar_len;
            r->o.grammar = NULL;
            r->o.grammar_text = NULL;
            r->o.grammar_len = 0;
            sl->gm = sl->gp.m;
        }
        if ((st = eng_lazy_begin(e, sl, err)) != KEEL_OK) goto fail;
    }
    int32_t look = r->o.samp.repeat_last_n;
    for (int32_t i = sl->n_prompt > look ? sl->n_prompt - look : 0; i < sl->n_prompt; i++)
        if ((st = keel_sampler_accept(sl->samp, sl->prompt[i])) != KEEL_OK) goto fail;
    {
        const char *text = r->kind == ENG_REQ_CHAT && rendered->data ? rendered->data : "";
        size_t len = r->kind == ENG_REQ_CHAT ? rendered->len : 0;
        const char *tail;
        size_t n_tail;
        eng_slot_tail(sl, &tail, &n_tail);
        if ((st = eng_chat_parser_open(e, r, text, len, tail, n_tail, sl->prefill != NULL, on_toolcall, sl, &sl->tp,
                                       &sl->pre, err)) != KEEL_OK)
            goto fail;
    }
    if ((st = keel_detok_stream_init_after(&sl->ds, e->model, sl->prompt, sl->n_prompt)) != KEEL_OK) {
        snprintf(err, sizeof err, "prompt: a token id is out of range");
        goto fail;
    }
    sl->state = ENG_SLOT_PREFILL;
    /* admitted: the client may answer now (headers, the prompt's usage)
     * instead of after the prefill */
    prompt_event(sl, KEEL_EVENT_PROMPT);
    return;
fail:
    finish(e, sl, "error", st, err);
}

/* ---- the step ------------------------------------------------------------------- */

/* Cells the batch needs in the shared full-attention tables, as keel_decode
 * counts them (a compacting sequence needs at most its trigger). */
static int32_t batch_need(keel_engine *e, const int32_t *cnt)
{
    keel_mem *mem = keel_context_memory(e->ctx);
    int64_t need = 0;
    for (int32_t i = 0; i < e->n_slots; i++) {
        if (!cnt[i]) continue;
        const keel_compact_params *cp = &e->slots[i].compact;
        int64_t c = cnt[i];
        if (cp->policy != KEEL_COMPACT_NONE) c = BASE_MIN(c, BASE_MAX(0, cp->trigger - keel_mem_seq_cells(mem, i)));
        need += c;
    }
    return (int32_t)BASE_MIN(need, INT32_MAX);
}

/* Processes a sampled token of a generating slot (logged: its logprobs
 * entry is the slot's newest). */
static void take_token(keel_engine *e, eng_slot *sl, int32_t tok, bool logged)
{
    eng_req *r = sl->req;
    keel_status st = keel_sampler_accept(sl->samp, tok);
    if (st != KEEL_OK) {
        finish(e, sl, "error", st, "sampler: token out of range");
        return;
    }
    sl->n_gen++;
    if (keel_token_is_eog(e->model, tok)) {
        if (logged) sl->n_lp--; /* not part of the answer */
        finish(e, sl, "stop", KEEL_OK, NULL);
        return;
    }
    if (logged) emit_logprob(e, sl);
    char piece[1024];
    size_t pn = 0;
    st = keel_detok_stream_push(&sl->ds, tok, piece, sizeof piece, &pn);
    if (st != KEEL_OK) {
        finish(e, sl, "error", st, "detokenizer failed");
        return;
    }
    if (pn > 0 && slot_output(e, sl, piece, pn, &st)) {
        finish(e, sl, "stop", KEEL_OK, NULL);
        return;
    }
    if (st != KEEL_OK) {
        finish(e, sl, "error", st, "output parser failed");
        return;
    }
    if (r->o.max_tokens >= 0 && sl->n_gen >= r->o.max_tokens) {
        finish(e, sl, "length", KEEL_OK, NULL);
        return;
    }
    sl->last_tok = tok;
    sl->state = ENG_SLOT_GEN;
}

/* ---- fairness: the prefill budget of a step with generating slots ---------------- */

#define ENG_PF_REFRESH 16 /* mixed steps between decode-only steps (which time the decode tokens) */
#define ENG_PF_FIRST 4    /* prefill tokens of the first mixed step */
#define ENG_PF_BURST 4.0  /* a mixed step's prefill costs at most this many steps' allowance */

static double ewma(double old, double x)
{
    return old > 0 ? 0.75 * old + 0.25 * x : x;
}

/* The prefill time a step with n_gen generating slots earns: pf_share / (1
 * - pf_share) of a decode-only step of their n_gen tokens (drafts aside;
 * while the slope is unknown, of the decode-only steps as they were), so
 * that decoding keeps 1 - pf_share of the time; 0 before any decode-only
 * step. */
static double pf_allow(const keel_engine *e, int32_t n_gen)
{
    return eng_cost_at(&e->dec_cost, n_gen) * e->pf_share / (1.0 - e->pf_share);
}

/* Most prefill tokens in a step beside n_gen generating slots. Prefill
 * time is a budget (pf_credit): every step with generating slots earns
 * pf_allow, a mixed step spends what its prefill tokens added to the
 * decode-only time of its decode tokens. A step runs prefill only out of a
 * non-negative credit, and then as many tokens as cost about ENG_PF_BURST
 * allowances (bigger chunks are cheaper per token; the debt is paid back
 * by decode-only steps), at least one, growing at most twofold per step.
 * 0 (a decode-only step) while in debt, or when no decode-only step has
 * been timed or one is due (every ENG_PF_REFRESH mixed steps). */
static int32_t pf_budget(keel_engine *e, int32_t n_gen)
{
    if (e->pf_share >= 1.0) return INT32_MAX;
    double allow = pf_allow(e, n_gen);
    if (allow <= 0 || e->pf_mixed >= ENG_PF_REFRESH || e->pf_credit < 0) return 0;
    if (e->pf_tok_ns <= 0) return ENG_PF_FIRST;
    double b = ENG_PF_BURST * allow / e->pf_tok_ns;
    double grow = 2.0 * (double)BASE_MAX(e->pf_last, ENG_PF_FIRST / 2);
    if (b > grow) b = grow;
    return b < 1.0 ? 1 : (int32_t)BASE_MIN(b, (double)INT32_MAX);
}

/* Learns from a decoded batch of n_dec generating tokens (n_gen slots and
 * their drafts) and n_pf prefill tokens that took ns. */
static void pf_measure(keel_engine *e, int32_t n_gen, int32_t n_dec, int32_t n_pf, double ns)
{
    if (n_dec == 0) {
        e->pf_credit = 0;
        return;
    }
    if (n_pf == 0) eng_cost_add(&e->dec_cost, n_dec, ns);
    double allow = pf_allow(e, n_gen);
    if (n_pf == 0) {
        e->pf_mixed = 0;
        e->pf_credit += allow;
    } else {
        double ref = eng_cost_at(&e->dec_cost, n_dec);
        if (ref > 0) {
            /* what the prefill tokens added to a decode-only step of the
             * same decode tokens (a floor keeps a step timed faster than
             * the reference from costing nothing) */
            double extra = BASE_MAX(ns - ref, 0.05 * ref);
            e->pf_tok_ns = ewma(e->pf_tok_ns, extra / n_pf);
            e->pf_credit += allow - extra;
            e->pf_last = n_pf;
        }
        e->pf_mixed++;
    }
    /* no hoarding past one burst; a step slowed by something else costs at
     * most a few steps of prefill */
    e->pf_credit = BASE_MAX(-2.0 * ENG_PF_BURST * allow, BASE_MIN(e->pf_credit, ENG_PF_BURST * allow));
}

/* After an interrupted keel_decode: slot sl's sequence goes back to the
 * tokens of its history (what the batch placed is removed), or is emptied
 * where that is not exact. A request still running continues from there:
 * a prefill re-feeds what was lost, a generation that lost its cache
 * fails. */
static void undo_batch(keel_engine *e, eng_slot *sl)
{
    keel_mem *mem = keel_context_memory(e->ctx);
    int32_t keep = sl->n_hist, resume = 0;
    if (sl->hist_compacted || keel_mem_seq_compactions(mem, sl->seq) > sl->compactions_at_start ||
        keel_context_rewind(e->ctx, sl->seq, keep, &resume) != KEEL_OK)
        resume = 0;
    if (resume <= 0)
        eng_slot_clear(e, sl);
    else
        sl->n_hist = BASE_MIN(resume, keep); /* a checkpoint's prefix is still the history's */
    if (!sl->req) return;
    if (sl->state == ENG_SLOT_PREFILL) {
        sl->n_fed = BASE_MIN(sl->n_fed, sl->n_hist);
        sl->n_reused = BASE_MIN(sl->n_reused, sl->n_hist);
    } else if (sl->n_hist < keep && !atomic_load(&sl->req->cancel)) {
        finish(e, sl, "error", KEEL_ECANCELED, "decode interrupted and the cache could not be kept");
    }
}

void eng_cut_locked(keel_engine *e)
{
    if (!e->in_decode || !e->ctx) return;
    bool all = (e->stop && e->running) || e->closing;
    if (!all) {
        all = e->n_batch_req > 0;
        for (int32_t i = 0; i < e->n_batch_req && all; i++) all = atomic_load(&e->batch_req[i]->cancel) != 0;
    }
    if (all) keel_cancel(e->ctx);
}

bool eng_step(keel_engine *e)
{
    keel_mem *mem = keel_context_memory(e->ctx);
    eng_run_controls(e);
    /* admit queued requests to idle slots */
    jinja_buf rendered = {NULL, 0, 0};
    for (;;) {
        bool idle = false;
        for (int32_t i = 0; i < e->n_slots && !idle; i++) idle = e->slots[i].state == ENG_SLOT_IDLE;
        if (!idle) break;
        pthread_mutex_lock(&e->mu);
        eng_req *r = e->queue_head;
        if (r) {
            e->queue_head = r->next;
            if (!e->queue_head) e->queue_tail = NULL;
            e->n_queued--;
        }
        pthread_mutex_unlock(&e->mu);
        if (!r) break;
        if (atomic_load(&r->cancel)) {
            fail_unstarted(e, r, KEEL_ECANCELED, "cancelled", 0, 0);
            continue;
        }
        start_request(e, r, &rendered);
    }
    jinja_buf_free(&rendered);
    /* cancellations */
    for (int32_t i = 0; i < e->n_slots; i++) {
        eng_slot *sl = &e->slots[i];
        if (sl->req && atomic_load(&sl->req->cancel))
            finish(e, sl, "cancelled", KEEL_OK, NULL);
    }
    /* the batch: one token per generating slot, then prefill chunks */
    int32_t nb = e->cp.n_batch, n = 0, n_pref = 0, n_gen = 0;
    int32_t cnt[ENG_MAX_SLOTS], chunk[ENG_MAX_SLOTS];
    for (int32_t i = 0; i < e->n_slots; i++) {
        cnt[i] = e->slots[i].state == ENG_SLOT_GEN;
        chunk[i] = 0;
        n_gen += cnt[i];
        n_pref += e->slots[i].state == ENG_SLOT_PREFILL;
    }
    /* room for the generating slots first (idle caches are evicted for it);
     * one without compaction that still has none ends "length" */
    for (;;) {
        int32_t need = batch_need(e, cnt);
        if (make_room(e, need) >= need) break;
        eng_slot *victim = NULL;
        for (int32_t i = 0; i < e->n_slots; i++)
            if (cnt[i] && e->slots[i].compact.policy == KEEL_COMPACT_NONE &&
                (!victim || e->slots[i].n_hist > victim->n_hist))
                victim = &e->slots[i];
        if (!victim) break;
        cnt[victim->seq] = 0;
        n_gen--;
        finish(e, victim, "length", KEEL_OK, NULL);
    }
    /* prefill: fair shares of the rest of the batch, bounded while slots
     * generate (pf_budget: their decoding keeps its share of the time),
     * within the room */
    if (n_pref > 0) {
        int32_t cap = nb - n_gen;
        if (n_gen > 0) cap = BASE_MIN(cap, pf_budget(e, n_gen));
        int32_t budget = cap, share = cap / n_pref > 0 ? cap / n_pref : 1;
        int32_t tot[ENG_MAX_SLOTS];
        for (int32_t i = 0; i < e->n_slots && budget > 0; i++) {
            eng_slot *sl = &e->slots[i];
            if (sl->state != ENG_SLOT_PREFILL) continue;
            /* a chunk ends at the next mark: keel_decode checkpoints a chunk's
             * end, and checkpoint_marks gives it the mark's priority */
            chunk[i] = BASE_MIN(share, BASE_MIN(budget, next_mark(e, sl) - sl->n_fed));
            /* a recurrent model checkpoints the end of each chunk of two or
             * more tokens: the chunks stop so that one such run ends at
             * n_prompt - 1, where the same prompt sent again (or one
             * extending it) resumes */
            int32_t left = sl->n_prompt - 1 - sl->n_fed;
            if (e->recurrent && left >= 2) {
                chunk[i] = BASE_MIN(chunk[i], left);
                if (left - chunk[i] == 1) chunk[i] = chunk[i] > 1 ? chunk[i] - 1 : 2;
                chunk[i] = BASE_MIN(chunk[i], budget);
            }
            budget -= chunk[i];
        }
        for (int32_t i = 0; i < e->n_slots; i++) tot[i] = cnt[i] + chunk[i];
        int32_t need = batch_need(e, tot), room = make_room(e, need);
        /* shrink the chunks of slots without compaction, last first, to fit */
        for (int32_t i = e->n_slots - 1; i >= 0 && need > room; i--) {
            if (!chunk[i] || e->slots[i].compact.policy != KEEL_COMPACT_NONE) continue;
            int32_t cut = BASE_MIN(chunk[i], need - room);
            chunk[i] -= cut;
            tot[i] -= cut;
            need = batch_need(e, tot);
        }
        int32_t progress = n_gen;
        for (int32_t i = 0; i < e->n_slots; i++) progress += chunk[i];
        if (need > room || progress == 0) {
            /* nothing fits and nothing else runs that could free cells: the
             * prefilling slot with the most left fails, named */
            eng_slot *worst = NULL;
            for (int32_t i = 0; i < e->n_slots; i++) {
                eng_slot *sl = &e->slots[i];
                if (sl->state == ENG_SLOT_PREFILL &&
                    (!worst || sl->n_prompt - sl->n_fed > worst->n_prompt - worst->n_fed))
                    worst = sl;
            }
            if (worst && (need > room || n_gen == 0)) {
                char why[BASE_ERR_CAP];
                snprintf(why, sizeof why, "context full: the prompt needs %d more cells, %d free (n_ctx %d)",
                         worst->n_prompt - worst->n_fed, mem_room(mem, 0), e->cp.n_ctx);
                chunk[worst->seq] = 0;
                finish(e, worst, "error", KEEL_EFULL, why);
            }
        }
    }
    eng_spec_plan(e, cnt, chunk);
    bool drafted = false;
    for (int32_t i = 0; i < e->n_slots; i++) {
        eng_slot *sl = &e->slots[i];
        if (cnt[i] && sl->state == ENG_SLOT_GEN) {
            eng_spec_begin(sl);
            for (int32_t r = 0; r <= sl->n_draft; r++) {
                e->batch_tok[n] = r == 0 ? sl->last_tok : sl->draft[r - 1];
                e->batch_seq[n] = sl->seq;
                e->batch_logits[n] = 1;
                e->batch_slot[n] = i;
                e->batch_row[n] = r;
                n++;
            }
            drafted |= sl->n_draft > 0;
        }
    }
    for (int32_t i = 0; i < e->n_slots; i++) {
        eng_slot *sl = &e->slots[i];
        if (sl->state != ENG_SLOT_PREFILL || chunk[i] <= 0) continue;
        for (int32_t j = 0; j < chunk[i]; j++) {
            int32_t k = sl->n_fed + j;
            e->batch_tok[n] = sl->prompt[k];
            e->batch_seq[n] = sl->seq;
            e->batch_logits[n] = k == sl->n_prompt - 1;
            e->batch_slot[n] = e->batch_logits[n] ? i : -1;
            e->batch_row[n] = -1;
            n++;
        }
    }
    if (n > 0) {
        keel_batch b = {n, e->batch_tok, NULL, e->batch_seq, e->batch_logits};
        int32_t n_pf = 0;
        for (int32_t i = 0; i < e->n_slots; i++) n_pf += chunk[i];
        /* a stop or a cancel of every request in the batch interrupts it */
        pthread_mutex_lock(&e->mu);
        e->n_batch_req = 0;
        for (int32_t i = 0; i < e->n_slots; i++)
            if (e->slots[i].req && (chunk[i] > 0 || (cnt[i] && e->slots[i].state == ENG_SLOT_GEN)))
                e->batch_req[e->n_batch_req++] = e->slots[i].req;
        e->in_decode = true;
        pthread_mutex_unlock(&e->mu);
        uint64_t t0 = now_ns();
        keel_status st = drafted ? keel_decode_spec(e->ctx, &b) : keel_decode(e->ctx, &b);
        uint64_t t1 = now_ns();
        pthread_mutex_lock(&e->mu);
        e->in_decode = false;
        e->n_batch_req = 0;
        pthread_mutex_unlock(&e->mu);
        if (st == KEEL_OK) pf_measure(e, n_gen, n - n_pf, n_pf, (double)(t1 - t0));
        if (st == KEEL_ECANCELED) {
            /* interrupted (stop or cancel): each slot's cache goes back to
             * its history before the batch; the cancelled requests end at
             * the next step (or as the loop stops) */
            for (int32_t i = 0; i < e->n_slots; i++) {
                eng_slot *sl = &e->slots[i];
                bool in = false;
                for (int32_t j = 0; j < n && !in; j++) in = e->batch_seq[j] == sl->seq;
                if (in) undo_batch(e, sl);
            }
        } else if (st != KEEL_OK) {
            /* the batch may have reached the cache in part: every slot in it
             * restarts from an empty cache and its request fails, named */
            char why[BASE_ERR_CAP];
            snprintf(why, sizeof why, "decode: %s", keel_context_last_error(e->ctx));
            for (int32_t i = 0; i < e->n_slots; i++) {
                eng_slot *sl = &e->slots[i];
                bool in = false;
                for (int32_t j = 0; j < n && !in; j++) in = e->batch_seq[j] == sl->seq;
                if (!in) continue;
                eng_slot_clear(e, sl);
                if (sl->req) finish(e, sl, "error", st, why);
            }
        } else {
            /* the cache now holds the batch: extend the histories */
            for (int32_t j = 0; j < n; j++) {
                eng_slot *sl = &e->slots[e->batch_seq[j]];
                if (sl->n_hist < e->hist_cap)
                    sl->hist[sl->n_hist++] = e->batch_tok[j];
                else
                    sl->hist_lost = true; /* the memory holds more than the history: reset on reuse */
            }
            for (int32_t i = 0; i < e->n_slots; i++) {
                eng_slot *sl = &e->slots[i];
                if (sl->state == ENG_SLOT_PREFILL && chunk[i] > 0) {
                    sl->n_fed += chunk[i];
                    checkpoint_marks(e, sl);
                    if (sl->req && sl->req->o.return_progress) prompt_event(sl, KEEL_EVENT_PROGRESS);
                }
                if (sl->req && keel_mem_seq_compactions(mem, sl->seq) > sl->compactions_at_start)
                    sl->hist_compacted = true;
            }
            for (int32_t j = 0; j < n; j++) {
                int32_t si = e->batch_slot[j];
                if (si < 0) continue;
                eng_slot *sl = &e->slots[si];
                if (!sl->req) continue;
                /* a drafted slot's rows after a rejection verify nothing */
                int32_t row = e->batch_row[j];
                if (row > 0 && sl->spec_stop) continue;
                int32_t draft = row >= 0 && row < sl->n_draft ? sl->draft[row] : -1;
                if (sl->state == ENG_SLOT_PREFILL) {
                    sl->t_prompt_end = now_ns();
                    sl->state = ENG_SLOT_GEN;
                    if (sl->req->o.max_tokens == 0) {
                        finish(e, sl, "length", KEEL_OK, NULL);
                        continue;
                    }
                }
                int32_t tok;
                const float *lg = keel_logits(e->ctx, j);
                eng_lp *ent = sl->lp && lg && sl->n_lp < sl->cap_lp ? &sl->lp[sl->n_lp] : NULL;
                double lse = ent ? lp_row(lg, e->model->w.hp.n_vocab, sl->req->o.top_logprobs, ent) : 0.0;
                if (lg && (sl->req->o.ignore_eos || sl->req->o.n_bias > 0)) {
                    /* the context's own logits row, the engine's to change:
                     * logit_bias (-100 bans), then ignore_eos */
                    float *w = e->ctx->logits + (lg - e->ctx->logits);
                    const eng_opts *o = &sl->req->o;
                    for (int32_t q = 0; q < o->n_bias; q++)
                        w[o->bias_tok[q]] = o->bias[q] <= -100.0f ? -INFINITY : w[o->bias_tok[q]] + o->bias[q];
                    for (int32_t q = 0; o->ignore_eos && q < e->n_eog; q++) w[e->eog_ids[q]] = -INFINITY;
                }
                if (lg && sl->gm && !sl->lazy) {
                    /* the grammar: a complete text that nothing can extend
                     * ends here; else the tokens it does not allow are
                     * banned (greedy included) */
                    if (keel_grammar_matcher_done(sl->gm)) {
                        finish(e, sl, "stop", KEEL_OK, NULL);
                        continue;
                    }
                    float *w = e->ctx->logits + (lg - e->ctx->logits);
                    if ((st = keel_grammar_matcher_apply(sl->gm, w)) != KEEL_OK) {
                        char why[BASE_ERR_CAP];
                        snprintf(why, sizeof why, "grammar: %s", keel_grammar_matcher_last_error(sl->gm));
                        finish(e, sl, "error", st, why);
                        continue;
                    }
                }
                if (sl->n_gen == 0 && e->debug_logits)
                    e->debug_logits(e->debug_user, sl->req->id, lg, e->model->w.hp.n_vocab);
                st = draft >= 0 ? keel_sampler_sample_draft(sl->samp, lg, draft, &tok)
                                : keel_sampler_sample(sl->samp, lg, &tok);
                if (st == KEEL_OK && row >= 0) {
                    if (draft >= 0 && tok == draft) sl->n_acc++;
                    else sl->spec_stop = true;
                }
                if (st != KEEL_OK) {
                    finish(e, sl, "error", st,
                           sl->gm ? "sampler: no token the grammar allows has a finite logit" : "sampler: no finite logit");
                    continue;
                }
                if (sl->gm && !sl->lazy && (st = keel_grammar_matcher_accept(sl->gm, tok)) != KEEL_OK) {
                    char why[BASE_ERR_CAP];
                    snprintf(why, sizeof why, "grammar: %s", keel_grammar_matcher_last_error(sl->gm));
                    finish(e, sl, "error", st, why);
                    continue;
                } else if (sl->gm && sl->lazy && (st = eng_lazy_step(e, sl, tok)) != KEEL_OK) {
                    finish(e, sl, "error", st, "lazy grammar: the token has no text");
                    continue;
                }
                if (ent) { /* the model's logit: ignore_eos never touches a sampled token, a bias is undone */
                    double logit = lg[tok];
                    for (int32_t q = 0; q < sl->req->o.n_bias; q++)
                        if (sl->req->o.bias_tok[q] == tok) logit -= sl->req->o.bias[q];
                    ent->tok = tok;
                    ent->lp = (float)(logit - lse);
                    sl->n_lp++;
                }
                take_token(e, sl, tok, ent != NULL);
                /* a draft that ended the request stays out of the cache, as
                 * the last token of a request without drafts does */
                if (!sl->req && draft >= 0 && tok == draft) sl->n_acc--;
            }
            for (int32_t i = 0; i < e->n_slots; i++)
                if (cnt[i]) eng_spec_settle(e, &e->slots[i], n_pf == 0 ? t1 - t0 : 0, n_gen, n - n_pf);
        }
    }
    bool busy = false;
    pthread_mutex_lock(&e->mu);
    for (int32_t i = 0; i < e->n_slots; i++) {
        eng_slot *sl = &e->slots[i];
        busy |= sl->state != ENG_SLOT_IDLE;
        sl->stat_state = sl->state;
        sl->stat_hist = sl->n_hist;
        if (sl->req) { /* the current prompt's, else the last one's */
            sl->stat_prompt = sl->n_prompt;
            sl->stat_fed = BASE_MIN(sl->n_fed, sl->n_prompt);
            sl->stat_reused = sl->n_reused;
        }
        sl->stat_compacted = sl->hist_compacted;
        sl->stat_cells = keel_mem_seq_cells(mem, sl->seq);
        sl->stat_compactions = keel_mem_seq_compactions(mem, sl->seq);
    }
    keel_mem_stats_get(mem, &e->mem_stats);
    e->n_group_stat = BASE_MIN(keel_mem_n_groups(mem), 8);
    for (int32_t g = 0; g < e->n_group_stat; g++) {
        e->group_used[g] = keel_mem_group_cells_used(mem, g);
        e->group_cap[g] = 0;
        for (int32_t k = 0; k < mem->groups[g].n_tables; k++) e->group_cap[g] += mem->groups[g].tables[k].cap;
    }
    busy |= e->queue_head != NULL;
    pthread_mutex_unlock(&e->mu);
    return busy;
}
