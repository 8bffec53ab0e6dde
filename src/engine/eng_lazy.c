/*
 * eng_lazy.c — lazy grammars (issue 24): a grammar that applies only from
 * the first trigger in the output on, and the tool-call grammar of a chat
 * request built from its tools (src/chat/toolgrammar.c).
 *
 * While a slot waits (sl->lazy) its matcher is untouched and no mask is
 * applied: the per-token work is the token's text appended to a small
 * window (the last bytes of the output, fewer than the longest trigger)
 * and a search of the triggers in it — no allocation, no trie walk. When
 * a trigger appears the matcher is fed the output from the trigger's first
 * byte to the end of the token (the grammar begins with the trigger) and
 * masks apply from the next token on. A trigger token id activates the
 * same way, with the token's text. If the text after the trigger does not
 * fit the grammar (a token that ran past the marker into something the
 * grammar refuses) the slot keeps waiting for the next trigger: the output
 * was already written, and a request is never failed for it.
 *
 * at_start triggers (llama3's bare JSON call) count only when the output,
 * whitespace aside, begins with them; once it begins otherwise the grammar
 * is never used (sl->lazy_dead).
 */
#include "eng.h"

#include "../grammar/grammar.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* ---- options -------------------------------------------------------------------- */

static keel_status add_word(eng_opts *o, const char *s, size_t n, char *err)
{
    if (n == 0 || n > ENG_LAZY_TRIGGER_MAX || memchr(s, 0, n))
        return base_err(err, KEEL_EINVAL, "grammar_triggers: a word must be 1 to %d bytes without NUL", ENG_LAZY_TRIGGER_MAX);
    if (o->n_trig >= ENG_LAZY_TRIGGERS)
        return base_err(err, KEEL_EINVAL, "grammar_triggers: at most %d words", ENG_LAZY_TRIGGERS);
    if (!o->trig && !(o->trig = base_calloc(ENG_LAZY_TRIGGERS, sizeof(char *))))
        return base_err(err, KEEL_ENOMEM, "out of memory");
    char *c = base_alloc(n + 1);
    if (!c) return base_err(err, KEEL_ENOMEM, "out of memory");
    memcpy(c, s, n);
    c[n] = 0;
    o->trig[o->n_trig++] = c;
    return KEEL_OK;
}

static keel_status add_token(const keel_engine *e, eng_opts *o, json_t *v, char *err)
{
    int32_t nv = e->model->w.hp.n_vocab;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= nv)
        return base_err(err, KEEL_EINVAL, "grammar_triggers: a token must be an id in [0, %d)", nv);
    if (o->n_trig_tok >= ENG_LAZY_TRIGGERS)
        return base_err(err, KEEL_EINVAL, "grammar_triggers: at most %d tokens", ENG_LAZY_TRIGGERS);
    if (!o->trig_tok && !(o->trig_tok = base_alloc(ENG_LAZY_TRIGGERS * sizeof(int32_t))))
        return base_err(err, KEEL_ENOMEM, "out of memory");
    o->trig_tok[o->n_trig_tok++] = (int32_t)json_integer_value(v);
    return KEEL_OK;
}

static void triggers_free(eng_opts *o)
{
    for (int32_t i = 0; i < o->n_trig; i++) base_free(o->trig[i], strlen(o->trig[i]) + 1);
    base_free(o->trig, o->trig ? ENG_LAZY_TRIGGERS * sizeof(char *) : 0);
    base_free(o->trig_tok, o->trig_tok ? ENG_LAZY_TRIGGERS * sizeof(int32_t) : 0);
    o->trig = NULL;
    o->trig_tok = NULL;
    o->n_trig = o->n_trig_tok = 0;
    o->trig_at_start = false;
}

keel_status eng_lazy_triggers(const keel_engine *e, json_t *v, eng_opts *o, char *err)
{
    triggers_free(o);
    if (json_is_null(v)) return KEEL_OK;
    if (!json_is_array(v)) return base_err(err, KEEL_EINVAL, "grammar_triggers must be an array");
    size_t i;
    json_t *t;
    json_array_foreach(v, i, t) {
        keel_status st = KEEL_OK;
        if (json_is_string(t)) {
            st = add_word(o, json_string_value(t), json_string_length(t), err);
        } else if (json_is_object(t)) {
            json_t *ty = json_object_get(t, "type"), *val = json_object_get(t, "value");
            const char *ts = json_string_value(ty);
            /* llama-server: 0 token, 1 word (2, 3: patterns, not supported) */
            bool tok = (ts && strcmp(ts, "token") == 0) || (json_is_integer(ty) && json_integer_value(ty) == 0);
            bool word = (ts && strcmp(ts, "word") == 0) || (json_is_integer(ty) && json_integer_value(ty) == 1);
            bool start = ts && strcmp(ts, "start") == 0;
            if (tok) {
                st = add_token(e, o, json_object_get(t, "token") ? json_object_get(t, "token") : val, err);
            } else if ((word || start) && json_is_string(val)) {
                if (start && o->n_trig > 0 && !o->trig_at_start)
                    st = base_err(err, KEEL_EINVAL, "grammar_triggers: start triggers cannot be mixed with words");
                else if (word && o->trig_at_start)
                    st = base_err(err, KEEL_EINVAL, "grammar_triggers: start triggers cannot be mixed with words");
                else if ((st = add_word(o, json_string_value(val), json_string_length(val), err)) == KEEL_OK)
                    o->trig_at_start = start;
            } else {
                st = base_err(err, KEEL_EINVAL,
                              "grammar_triggers[%zu] must be a string or {\"type\": \"word\" | \"token\" | \"start\", "
                              "\"value\": ...} (patterns are not supported)",
                              i);
            }
        } else {
            st = base_err(err, KEEL_EINVAL, "grammar_triggers[%zu] must be a string or an object", i);
        }
        if (st) {
            triggers_free(o);
            return st;
        }
    }
    return KEEL_OK;
}

/* Frees what eng_opts holds for lazy grammars (eng_opts_free calls it). */
void eng_lazy_opts_free(eng_opts *o)
{
    triggers_free(o);
    base_strfree(o->tool_note);
    o->tool_note = NULL;
    o->markers = NULL;
}

/* ---- the tool-call grammar of a request --------------------------------------------- */

static keel_status set_note(eng_opts *o, const char *fmt, ...) BASE_PRINTF(2, 3);
static keel_status set_note(eng_opts *o, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    base_strfree(o->tool_note);
    o->tool_note = base_strdup(buf);
    return o->tool_note ? KEEL_OK : KEEL_ENOMEM;
}

static bool any_strict(json_t *tools)
{
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *f = json_object_get(t, "function");
        if (json_is_true(json_object_get(json_is_object(f) ? f : t, "strict"))) return true;
    }
    return false;
}

/* Once per engine: the log line of a request whose tool calls stay unconstrained. */
static void log_once(keel_engine *e, const char *note)
{
    if (!atomic_exchange(&e->tool_logged, true)) base_log(KEEL_LOG_WARN, "tool calls: %s (logged once)", note);
}

keel_status eng_tool_grammar(keel_engine *e, eng_req *r, char *err)
{
    eng_opts *o = &r->o;
    if (r->kind != ENG_REQ_CHAT || !r->tools || o->tool_choice == ENG_TOOLS_NONE || !o->parse_tools) return KEEL_OK;
    bool forced = o->tool_choice == ENG_TOOLS_REQUIRED, strict = any_strict(r->tools);
    bool all = o->strict_tools == 1 || forced;
    if (o->strict_tools == 0 || (!all && !strict)) return KEEL_OK;
    toolcall_format f = e->tool_format;
    keel_status st;
    if (o->grammar) {
        if ((st = set_note(o, "unconstrained: the request has its own grammar")) != KEEL_OK) goto oom;
        return KEEL_OK;
    }
    if (!toolcall_grammar_supported(f)) {
        if ((st = set_note(o, "unconstrained: format '%s' has no tool-call grammar", toolcall_format_name(f))) != KEEL_OK)
            goto oom;
        log_once(e, o->tool_note);
        return KEEL_OK;
    }
    toolcall_grammar tg;
    char why[BASE_ERR_CAP] = "";
    st = toolcall_grammar_build(f, r->tools, forced ? o->tool_name : NULL, all, !o->one_call, &tg, why);
    if (st == KEEL_ENOMEM) goto oom;
    if (st == KEEL_OK) {
        keel_grammar *g = NULL;
        if ((st = keel_grammar_compile(tg.gbnf, tg.n_gbnf, &g, why)) != KEEL_OK) {
            toolcall_grammar_free(&tg);
            if (st == KEEL_ENOMEM) goto oom;
        } else {
            o->grammar = g;
            o->grammar_text = tg.gbnf; /* owned now (n_gbnf + 1 bytes) */
            o->grammar_len = tg.n_gbnf;
            o->grammar_lazy = !forced;
            o->tool_forced = forced;
            for (int32_t i = 0; i < tg.n_triggers && st == KEEL_OK; i++)
                st = add_word(o, tg.triggers[i], strlen(tg.triggers[i]), err);
            o->trig_at_start = tg.at_start;
            o->markers = tg.markers && tg.markers[0] ? tg.markers : NULL;
            if (st) return st;
            if (tg.note[0]) log_once(e, tg.note);
            st = set_note(o, "%s: %d of %zu tools constrained (%s)%s%s", forced ? "forced" : "lazy", (int)tg.n_constrained,
                          json_array_size(r->tools), toolcall_format_name(f), tg.note[0] ? "; " : "", tg.note);
            return st == KEEL_OK ? KEEL_OK : base_err(err, st, "out of memory");
        }
    }
    /* a strict tool whose schema the compiler refuses is the request's error
     * (a 400 at the server); otherwise the calls go unconstrained */
    if (strict && (st == KEEL_EUNSUPPORTED || st == KEEL_EFORMAT || st == KEEL_ERANGE))
        return base_err(err, KEEL_EINVAL, "tools: %s", why);
    if ((st = set_note(o, "unconstrained: %s", why)) != KEEL_OK) goto oom;
    log_once(e, o->tool_note);
    return KEEL_OK;
oom:
    return base_err(err, KEEL_ENOMEM, "tool grammar: out of memory");
}

/* ---- the slot --------------------------------------------------------------------- */

/* The earliest trigger in s[0..n) (the longest among those starting there):
 * its offset, or -1. */
static ptrdiff_t find_trigger(const eng_opts *o, const char *s, size_t n)
{
    ptrdiff_t best = -1;
    size_t best_len = 0;
    for (int32_t i = 0; i < o->n_trig; i++) {
        size_t L = strlen(o->trig[i]);
        const char *p = L <= n ? memmem(s, n, o->trig[i], L) : NULL;
        if (!p) continue;
        ptrdiff_t at = p - s;
        if (best < 0 || at < best || (at == best && L > best_len)) {
            best = at;
            best_len = L;
        }
    }
    return best;
}

static size_t max_trigger(const eng_opts *o)
{
    size_t m = 0;
    for (int32_t i = 0; i < o->n_trig; i++) m = BASE_MAX(m, strlen(o->trig[i]));
    return m;
}

/* Feeds s[0..n) (the output from a trigger on) to the matcher: masks apply
 * from now on. Text the grammar refuses leaves the slot waiting. */
static void activate(eng_slot *sl, const char *s, size_t n)
{
    if (engine_grammar_matcher_feed(sl->gm, s, n) != KEEL_OK) return; /* the state is unchanged */
    sl->lazy = false;
    sl->n_win = 0;
}

keel_status eng_lazy_begin(keel_engine *e, eng_slot *sl, char *err)
{
    (void)e;
    const eng_opts *o = &sl->req->o;
    sl->lazy = o->grammar_lazy;
    sl->lazy_dead = false;
    sl->n_win = 0;
    if (sl->lazy && !o->trig_at_start && sl->prefill && sl->n_prefill > 0) {
        /* a continued message (prefill) that opened a call: the grammar
         * starts at its last trigger, as if the model had written it */
        ptrdiff_t last = -1;
        for (ptrdiff_t at = find_trigger(o, sl->prefill, sl->n_prefill); at >= 0;) {
            last = at;
            size_t from = (size_t)at + 1;
            ptrdiff_t next = find_trigger(o, sl->prefill + from, sl->n_prefill - from);
            at = next < 0 ? -1 : next + (ptrdiff_t)from;
        }
        if (last >= 0) activate(sl, sl->prefill + last, sl->n_prefill - (size_t)last);
    }
    if (!o->tool_forced || sl->n_forced == 0) return KEEL_OK;
    /* a forced call: the prompt ends with the call's opening, which the
     * grammar must have read (from its marker on: the opening may close
     * the reasoning first) */
    ptrdiff_t at = find_trigger(o, sl->forced, sl->n_forced);
    if (at < 0) return KEEL_OK; /* an opening without the marker: the grammar starts with the model */
    keel_status st = engine_grammar_matcher_feed(sl->gm, sl->forced + at, sl->n_forced - (size_t)at);
    if (st) return base_err(err, st, "tool grammar: the forced opening does not fit it: %s",
                            keel_grammar_matcher_last_error(sl->gm));
    return KEEL_OK;
}

keel_status eng_lazy_step(keel_engine *e, eng_slot *sl, int32_t tok)
{
    const eng_opts *o = &sl->req->o;
    if (sl->lazy_dead || keel_token_is_eog(e->model, tok)) return KEEL_OK;
    char buf[1024];
    const char *piece;
    size_t pn = 0;
    /* the grammar vocabulary's copy of the token's bytes (a lookup); control
     * tokens, which it holds without bytes, rendered as their text: some
     * markers are single special tokens */
    engine_grammar_token_bytes(e->gvocab, tok, &piece, &pn);
    if (pn == 0) {
        keel_status st = text_token_to_piece(e->model->tok, tok, true, buf, sizeof buf, &pn);
        if (st) return st;
        piece = buf;
    }
    if (pn > sizeof buf) pn = sizeof buf; /* the window holds one piece of at most 1 KiB */
    for (int32_t i = 0; i < o->n_trig_tok; i++)
        if (o->trig_tok[i] == tok) {
            activate(sl, piece, pn);
            if (!sl->lazy) return KEEL_OK;
        }
    if (o->n_trig == 0) return KEEL_OK;
    if (o->trig_at_start) {
        /* whitespace before the output begins is skipped; then the output
         * must be a prefix of a trigger or begin with one */
        size_t i = 0;
        if (sl->n_win == 0)
            while (i < pn && (piece[i] == ' ' || piece[i] == '\n' || piece[i] == '\t' || piece[i] == '\r')) i++;
        size_t k = BASE_MIN(pn - i, sizeof sl->win - sl->n_win);
        memcpy(sl->win + sl->n_win, piece + i, k);
        sl->n_win += k;
        bool prefix = false;
        for (int32_t t = 0; t < o->n_trig; t++) {
            size_t L = strlen(o->trig[t]);
            if (sl->n_win >= L && memcmp(sl->win, o->trig[t], L) == 0) {
                activate(sl, sl->win, sl->n_win);
                if (sl->lazy) sl->lazy_dead = true;
                return KEEL_OK;
            }
            prefix |= sl->n_win < L && memcmp(sl->win, o->trig[t], sl->n_win) == 0;
        }
        if (!prefix && sl->n_win > 0) sl->lazy_dead = true;
        return KEEL_OK;
    }
    /* keep the window's last (longest trigger - 1) bytes, then the piece */
    size_t keep = max_trigger(o) - 1;
    if (sl->n_win > keep) {
        memmove(sl->win, sl->win + sl->n_win - keep, keep);
        sl->n_win = keep;
    }
    memcpy(sl->win + sl->n_win, piece, pn);
    sl->n_win += pn;
    ptrdiff_t at = find_trigger(o, sl->win, sl->n_win);
    while (at >= 0 && sl->lazy) {
        activate(sl, sl->win + at, sl->n_win - (size_t)at);
        if (!sl->lazy || sl->lazy_dead) break;
        /* refused: look for a later trigger in the rest */
        size_t from = (size_t)at + 1;
        ptrdiff_t next = find_trigger(o, sl->win + from, sl->n_win - from);
        at = next < 0 ? -1 : next + (ptrdiff_t)from;
    }
    return KEEL_OK;
}
