/*
 * cmd_chat.c — `keel chat`: a conversation in the terminal through the
 * model's chat template, on the engine (keel_complete, one slot).
 *
 * The conversation is an OpenAI messages array owned here; each turn sends
 * it whole and the engine reuses the longest cached prefix, so a turn
 * prefills only the new message. Answers stream as they come: reasoning
 * apart (dimmed on a terminal, "thinking: " before each of its lines
 * otherwise), tool calls with their arguments (nothing is executed; with
 * --tools the user types each call's result). Model text is written with
 * control characters other than newline and tab escaped, so it cannot
 * drive the terminal.
 *
 * Input: on a terminal, libedit (line editing, history) when it was found
 * at build time, else plain lines. A trailing backslash continues a message
 * on the next line, and lines that arrive together (a paste) form one
 * message. When stdin is not a terminal, each line is one message and each
 * answer is printed followed by a newline, so scripts can drive it.
 *
 * Ctrl-C: SIGINT's handler only writes a byte to a pipe; a watcher thread
 * reads it and calls keel_engine_cancel (thread-safe, not async-signal-safe),
 * so a prefill or an answer stops within a step and the conversation stays
 * (a partial answer is kept; a turn stopped before any answer drops its
 * message). At the prompt, Ctrl-C right after another Ctrl-C, Ctrl-D or
 * /exit leaves.
 *
 * /save F writes the slot's cache and token history in keel's session
 * format to F (keel_engine_slot_save: `keel serve`'s slot files) and the
 * conversation to F.json; /load F reads both back (the conversation is
 * checked first, the slot restore validates the file completely before the
 * cache changes), so the next turn reuses the restored cache.
 */
#include "cli.h"

#include <errno.h>
#include <jansson.h>
#include <locale.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef KEEL_HAVE_LIBEDIT
#include <histedit.h>
#endif

static const char *g_usage =
    "usage: keel chat -m MODEL [--system TEXT | -sys FILE] [--tools FILE.json] [options]\n"
    "A conversation through the model's chat template. On a terminal: line editing and history,\n"
    "a trailing \\ continues a message, Ctrl-C stops an answer (twice at the prompt, Ctrl-D or\n"
    "/exit leave); /help lists the commands. With stdin not a terminal: one message per line,\n"
    "one answer per message (followed by a newline) on stdout.";

static const char *g_help =
    "commands:\n"
    "  /help              this text\n"
    "  /exit, /quit       leave (Ctrl-D too)\n"
    "  /clear             forget the conversation (the system message stays) and empty the cache\n"
    "  /save FILE         save the conversation (FILE.json) and the cache (FILE, keel's session "
    "format)\n"
    "  /load FILE         load them back; the next turn reuses the cache\n"
    "  /kv                the KV cache: cells held per table, bytes, compactions, the last turn's\n"
    "                     cached tokens\n"
    "  /compact P [T [K]] KV compaction from the next turn on (P: none window keydiff knorm "
    "random;\n"
    "                     T trigger cells, K target; default -c per slot and half of it)\n"
    "  //text             a message that begins with '/'\n"
    "a line ending in \\ continues on the next; lines pasted together are one message\n";

/* ---- Ctrl-C ----------------------------------------------------------------------- */

static volatile sig_atomic_t g_sigint; /* a SIGINT since the flag was last cleared */
static volatile sig_atomic_t g_turn;   /* the running turn's id (1..100, cycling), 0 between turns */
static int g_sig_pipe[2] = {-1, -1};   /* the handler writes the turn id to [1]; the watcher reads [0] */

static void on_sigint(int sig)
{
    (void)sig;
    int e = errno;
    g_sigint = 1;
    char b = (char)g_turn; /* the watcher may read it late: it cancels only this turn */
    ssize_t w = write(g_sig_pipe[1], &b, 1); /* a full pipe: a cancel is already pending */
    (void)w;
    errno = e;
}

typedef struct watcher {
    keel_engine *e;
    atomic_int busy; /* the running turn's id: a Ctrl-C during it cancels it; 0: none */
} watcher;

static void *watch_main(void *arg)
{
    watcher *w = arg;
    char ch;
    for (;;) {
        ssize_t n = read(g_sig_pipe[0], &ch, 1);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0 || ch == 'q') break;
        /* a Ctrl-C read after its turn ended must not cancel the next one */
        int turn = atomic_load(&w->busy);
        if (turn && turn == (unsigned char)ch) keel_engine_cancel(w->e);
    }
    return NULL;
}

/* ---- the chat ----------------------------------------------------------------------- */

typedef enum out_part { OUT_NONE, OUT_CONTENT, OUT_REASONING, OUT_TOOL } out_part;

typedef struct chat {
    keel_engine *e;
    const cli_opts *o;
    json_t *msgs;         /* the conversation (OpenAI messages), owned */
    json_t *system;       /* the system message or NULL (kept by /clear), owned */
    char *tools;          /* --tools: the JSON array's text, or NULL */
    json_t *compact_next; /* kv_compact for the next turn (a /compact), or NULL */
    json_t *compact_cur;  /* the last /compact's value (re-sent after /clear), or NULL */
    json_t *tool_choice;  /* --tool-choice as the option's value, or NULL */
    char compact_name[32];
    bool tty_in, tty_out;
    /* the turn being streamed */
    out_part part;
    bool bol;   /* output at the start of a line */
    bool wrote; /* the turn printed something */
    bool write_failed;
    cli_progress prog;
    json_t *resp; /* the DONE event's response (owned), or NULL */
    /* the last turn, for /kv and the turn line */
    int32_t last_prompt, last_cached, last_gen;
    json_t *calls; /* tool calls waiting for results (array, owned), or NULL */
    size_t next_call;
#ifdef KEEL_HAVE_LIBEDIT
    EditLine *el;
    History *hist;
    char prompt[160];
#endif
} chat;

/* Writes n bytes of model text: newline and tab as they are, other control
 * characters (C0, DEL, C1) as \xHH; the text is valid UTF-8 (keel_event). */
static void put_text(chat *c, const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n && !c->write_failed) {
        size_t j = i;
        while (j < n && (u[j] >= 0x20 || u[j] == '\n' || u[j] == '\t') && u[j] != 0x7f &&
               !(u[j] == 0xc2 && j + 1 < n && u[j + 1] < 0xa0))
            j++;
        if (j > i && fwrite(u + i, 1, j - i, stdout) != j - i) c->write_failed = true;
        if (j < n && !c->write_failed) {
            size_t k = u[j] == 0xc2 ? 2 : 1;
            for (size_t q = 0; q < k; q++)
                if (fprintf(stdout, "\\x%02x", u[j + q]) < 0) c->write_failed = true;
            j += k;
        }
        i = j;
    }
}

static void put_str(chat *c, const char *s)
{
    if (!c->write_failed && fputs(s, stdout) == EOF) c->write_failed = true;
}

/* Reasoning text: dimmed on a terminal; else each line starts "thinking: ". */
static void put_reasoning(chat *c, const char *s, size_t n)
{
    if (c->tty_out) {
        put_text(c, s, n);
        return;
    }
    while (n > 0) {
        if (c->bol) put_str(c, "thinking: ");
        const char *nl = memchr(s, '\n', n);
        size_t k = nl ? (size_t)(nl - s) + 1 : n;
        put_text(c, s, k);
        c->bol = nl != NULL;
        s += k;
        n -= k;
    }
}

/* Moves the output to part p: closes the one before (colour, line). */
static void switch_part(chat *c, out_part p)
{
    if (c->part == p) return;
    if (c->part == OUT_NONE) cli_progress_end(&c->prog);
    if (c->part != OUT_NONE && c->tty_out) put_str(c, "\033[0m");
    if (c->part != OUT_NONE && !c->bol) {
        put_str(c, "\n");
        c->bol = true;
    }
    if (p == OUT_REASONING && c->tty_out) put_str(c, "\033[2m");
    if (p == OUT_TOOL && c->tty_out) put_str(c, "\033[36m");
    c->part = p;
}

static void put_model(chat *c, const char *s, size_t n)
{
    if (n == 0) return;
    put_text(c, s, n);
    c->bol = s[n - 1] == '\n';
    c->wrote = true;
}

static bool on_event(void *user, const keel_event *ev)
{
    chat *c = user;
    switch (ev->kind) {
    case KEEL_EVENT_PROMPT:
        cli_progress_begin(&c->prog);
        c->last_prompt = ev->n_prompt_tokens;
        c->last_cached = ev->n_cached_tokens;
        break;
    case KEEL_EVENT_PROGRESS:
        cli_progress_show(&c->prog, ev->n_processed - ev->n_cached_tokens,
                          ev->n_prompt_tokens - ev->n_cached_tokens);
        break;
    case KEEL_EVENT_CONTENT:
        switch_part(c, OUT_CONTENT);
        put_model(c, ev->text, ev->len);
        break;
    case KEEL_EVENT_REASONING:
        switch_part(c, OUT_REASONING);
        put_reasoning(c, ev->text, ev->len);
        c->wrote = true;
        break;
    case KEEL_EVENT_TOOL_BEGIN:
        switch_part(c, OUT_TOOL);
        put_str(c, "tool call: ");
        put_model(c, ev->name ? ev->name : "", ev->name ? strlen(ev->name) : 0);
        put_str(c, " ");
        c->bol = false;
        break;
    case KEEL_EVENT_TOOL_ARGS:
        put_model(c, ev->text, ev->len);
        break;
    case KEEL_EVENT_TOOL_END:
        if (ev->error) {
            put_str(c, " (malformed: ");
            put_model(c, ev->error, strlen(ev->error));
            put_str(c, ")");
        }
        put_str(c, "\n");
        c->bol = true;
        break;
    case KEEL_EVENT_DONE:
        if (ev->response && !c->resp) c->resp = json_loads(ev->response, JSON_ALLOW_NUL, NULL);
        break;
    default:
        break;
    }
    if (!c->write_failed && fflush(stdout) != 0) c->write_failed = true;
    return !g_sigint && !c->write_failed;
}

/* The options of a turn: -n, sampling, the progress events, a /compact. */
static json_t *turn_options(chat *c)
{
    const cli_opts *o = c->o;
    const keel_sampler_params *s = &o->samp;
    json_t *j =
        json_pack("{si sf si sf sf sI sf si sf sf sb}", "max_tokens", o->n_predict, "temperature",
                  (double)s->temp, "top_k", s->top_k, "top_p", (double)s->top_p, "min_p",
                  (double)s->min_p, "seed", (json_int_t)(s->seed > INT64_MAX ? INT64_MAX : s->seed),
                  "repeat_penalty", (double)s->repeat_penalty, "repeat_last_n", s->repeat_last_n,
                  "presence_penalty", (double)s->presence_penalty, "frequency_penalty",
                  (double)s->frequency_penalty, "ignore_eos", o->ignore_eos);
    if (j && c->prog.tty && json_object_set_new(j, "return_progress", json_true()) != 0) {
        json_decref(j);
        return NULL;
    }
    if (j && c->tool_choice && json_object_set(j, "tool_choice", c->tool_choice) != 0) {
        json_decref(j);
        return NULL;
    }
    if (j && c->compact_next && json_object_set(j, "kv_compact", c->compact_next) != 0) {
        json_decref(j);
        return NULL;
    }
    return j;
}

/* Ends the turn's output: colours off, a newline, the turn line. */
static void end_output(chat *c, const char *note)
{
    cli_progress_end(&c->prog);
    if (c->part != OUT_NONE && c->tty_out) put_str(c, "\033[0m");
    if (note) {
        if (!c->bol) put_str(c, "\n");
        put_str(c, note);
        c->bol = false;
    }
    /* one answer, one newline (pipe mode: one answer per message) */
    if (!c->bol || !c->wrote || note) put_str(c, "\n");
    if (!c->write_failed && fflush(stdout) != 0) c->write_failed = true;
}

/* Drops the messages a failed turn added (the conversation before it). */
static void drop_from(chat *c, size_t n0)
{
    while (json_array_size(c->msgs) > n0)
        json_array_remove(c->msgs, json_array_size(c->msgs) - 1);
}

static const char *str_of(json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

/* The assistant's message of a response: content, reasoning, tool calls. */
static json_t *assistant_message(json_t *resp)
{
    json_t *m = json_pack("{ss ss%}", "role", "assistant", "content", str_of(resp, "content"),
                          json_string_length(json_object_get(resp, "content")));
    if (!m) return NULL;
    json_t *r = json_object_get(resp, "reasoning_content");
    json_t *tc = json_object_get(resp, "tool_calls");
    if ((json_is_string(r) && json_string_length(r) > 0 &&
         json_object_set(m, "reasoning_content", r) != 0) ||
        (json_is_array(tc) && json_array_size(tc) > 0 &&
         json_object_set(m, "tool_calls", tc) != 0)) {
        json_decref(m);
        return NULL;
    }
    return m;
}

/* One turn on the conversation as it stands (its last message is the
 * user's or a tool result). n0: the conversation's length before this
 * turn's input, restored when the turn fails. 0, or 1 when output failed. */
static int chat_turn(chat *c, watcher *w, size_t n0)
{
    cli_progress_begin(&c->prog); /* whether stderr is a terminal: progress events or none */
    json_t *opts = turn_options(c);
    char *mj = json_dumps(c->msgs, JSON_COMPACT);
    char *oj = opts ? json_dumps(opts, JSON_COMPACT) : NULL;
    json_decref(opts);
    if (!mj || !oj) {
        free(mj);
        free(oj);
        drop_from(c, n0);
        cli_fail("chat", KEEL_ENOMEM, NULL);
        return 0;
    }
    c->part = OUT_NONE;
    c->bol = true;
    c->wrote = false;
    c->resp = NULL;
    c->last_prompt = c->last_cached = c->last_gen = 0;
    cli_progress_begin(&c->prog);
    static int turn_id;
    turn_id = turn_id % 100 + 1; /* never 'q' (113), the watcher's quit byte */
    g_sigint = 0;
    g_turn = turn_id;
    atomic_store(&w->busy, turn_id);
    keel_status st = keel_complete(c->e, mj, oj, c->tools, on_event, c, NULL, 0);
    atomic_store(&w->busy, 0);
    g_turn = 0;
    free(mj);
    free(oj);
    if (c->write_failed) {
        json_decref(c->resp);
        c->resp = NULL;
        if (!cli_flush_stdout()) return 1; /* says why, once */
        return 1;
    }
    json_t *resp = c->resp;
    c->resp = NULL;
    const char *fin = str_of(resp, "finish_reason");
    bool cancelled = st == KEEL_ECANCELED || strcmp(fin, "cancelled") == 0;
    if (st != KEEL_OK && st != KEEL_ERANGE && !cancelled) {
        end_output(c, NULL);
        const char *why = keel_engine_last_error(c->e);
        json_t *er = json_object_get(resp, "error");
        if ((!why || !*why) && er)
            why = json_is_string(er) ? json_string_value(er) : str_of(er, "message");
        cli_fail("chat", st, why);
        drop_from(c, n0);
        json_decref(resp);
        return 0;
    }
    if (c->compact_next) { /* the slot keeps it from now on */
        json_decref(c->compact_next);
        c->compact_next = NULL;
    }
    json_t *usage = json_object_get(resp, "usage");
    c->last_gen = (int32_t)json_integer_value(json_object_get(usage, "completion_tokens"));
    if (json_object_get(usage, "cached_tokens"))
        c->last_cached = (int32_t)json_integer_value(json_object_get(usage, "cached_tokens"));
    if (json_object_get(usage, "prompt_tokens"))
        c->last_prompt = (int32_t)json_integer_value(json_object_get(usage, "prompt_tokens"));
    end_output(c, cancelled ? (c->tty_out ? "\033[2m[stopped]\033[0m" : "[stopped]") : NULL);
    json_t *am = resp ? assistant_message(resp) : NULL;
    bool empty =
        !am || (json_string_length(json_object_get(am, "content")) == 0 &&
                !json_object_get(am, "reasoning_content") && !json_object_get(am, "tool_calls"));
    if (cancelled && empty) {
        drop_from(c, n0); /* stopped before any answer: as if never sent */
        json_decref(am);
    } else if (am && json_array_append_new(c->msgs, am) == 0) {
        json_t *tc = json_object_get(am, "tool_calls");
        if (c->tools && !cancelled && json_array_size(tc) > 0) {
            c->calls = json_incref(tc);
            c->next_call = 0;
        }
    } else {
        drop_from(c, n0);
        cli_fail("chat", KEEL_ENOMEM, NULL);
    }
    json_t *tm = json_object_get(resp, "timings");
    double ps = json_number_value(json_object_get(tm, "predicted_per_second"));
    char line[256];
    int n =
        snprintf(line, sizeof line, "[prompt %d tokens, %d cached; %d generated, %.1f tok/s; %s]",
                 c->last_prompt, c->last_cached, c->last_gen, ps,
                 cancelled ? "stopped"
                 : *fin    ? fin
                           : "?");
    if (n > 0 && fprintf(stderr, c->prog.tty ? "\033[2m%s\033[0m\n" : "%s\n", line) < 0)
        c->prog.tty = false;
    json_decref(resp);
    return 0;
}

/* ---- commands ----------------------------------------------------------------------- */

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
}

/* The engine's stats as JSON (NULL: the failure printed). */
static json_t *engine_stats(chat *c, const char *what)
{
    size_t n = 0;
    keel_status st = keel_engine_stats(c->e, NULL, 0, &n);
    char *buf = st == KEEL_ERANGE ? malloc(n) : NULL;
    if (!buf || (st = keel_engine_stats(c->e, buf, n, &n)) != KEEL_OK) {
        free(buf);
        cli_fail(what, st == KEEL_ERANGE ? KEEL_ENOMEM : st, keel_engine_last_error(c->e));
        return NULL;
    }
    json_t *j = json_loads(buf, 0, NULL);
    free(buf);
    if (!j) cli_fail(what, KEEL_ENOMEM, NULL);
    return j;
}

static void cmd_kv(chat *c)
{
    json_t *j = engine_stats(c, "/kv");
    if (!j) return;
    json_t *kv = json_object_get(j, "kv"), *sl = json_array_get(json_object_get(j, "slots"), 0);
    say("kv: %lld of %lld cells, %.2f of %.2f MiB\n",
        (long long)json_integer_value(json_object_get(kv, "cells_used")),
        (long long)json_integer_value(json_object_get(kv, "cells_cap")),
        (double)json_integer_value(json_object_get(kv, "bytes_used")) / (1 << 20),
        (double)json_integer_value(json_object_get(kv, "bytes_total")) / (1 << 20));
    size_t i;
    json_t *g;
    json_array_foreach(json_object_get(kv, "groups"), i, g)
        say("  table %lld: %lld of %lld cells\n",
            (long long)json_integer_value(json_object_get(g, "group")),
            (long long)json_integer_value(json_object_get(g, "cells_used")),
            (long long)json_integer_value(json_object_get(g, "cells_cap")));
    say("conversation: %lld tokens cached in %lld cells, %lld compactions (compaction: %s)\n",
        (long long)json_integer_value(json_object_get(sl, "cached_tokens")),
        (long long)json_integer_value(json_object_get(sl, "cells")),
        (long long)json_integer_value(json_object_get(sl, "compactions")), c->compact_name);
    say("last turn: prompt %d tokens, %d cached, %d generated\n", c->last_prompt, c->last_cached,
        c->last_gen);
    json_decref(j);
}

/* "/compact P [TRIGGER [TARGET]]": checked here, so that a bad setting is
 * refused now rather than failing every later turn. */
static void cmd_compact(chat *c, char *arg)
{
    const cli_opts *o = c->o;
    char *name = strtok(arg, " \t"), *tr = strtok(NULL, " \t"), *ta = strtok(NULL, " \t");
    keel_compact_params p = keel_compact_params_default();
    int32_t trigger = 0, target = 0;
    if (!name || keel_compact_policy_from_name(name, &p.policy) != KEEL_OK || strtok(NULL, " \t") ||
        (tr && !cli_parse_i32(tr, &trigger)) || (ta && !cli_parse_i32(ta, &target))) {
        say("/compact: give P [TRIGGER [TARGET]], P one of none window keydiff knorm random\n");
        return;
    }
    json_t *j = json_pack("{ss}", "policy", keel_compact_policy_name(p.policy));
    if (!j) {
        cli_fail("/compact", KEEL_ENOMEM, NULL);
        return;
    }
    if (p.policy != KEEL_COMPACT_NONE) {
        json_t *stats = engine_stats(c, "/compact");
        if (!stats) {
            json_decref(j);
            return;
        }
        int32_t slot = (int32_t)json_integer_value(
            json_object_get(json_object_get(stats, "model"), "n_ctx_slot"));
        json_decref(stats);
        p.trigger = tr ? trigger : o->kv_trigger_set ? o->ctx.compact.trigger : slot;
        p.target = ta ? target : o->kv_target_set ? o->ctx.compact.target : p.trigger / 2;
        char why[256] = "";
        if (keel_compact_params_check(&p, why) != KEEL_OK) {
            say("/compact: %s (compaction unchanged)\n", why);
            json_decref(j);
            return;
        }
        if (json_object_set_new(j, "trigger", json_integer(p.trigger)) != 0 ||
            json_object_set_new(j, "target", json_integer(p.target)) != 0) {
            json_decref(j);
            cli_fail("/compact", KEEL_ENOMEM, NULL);
            return;
        }
    }
    json_decref(c->compact_next);
    json_decref(c->compact_cur);
    c->compact_next = j;
    c->compact_cur = json_incref(j);
    snprintf(c->compact_name, sizeof c->compact_name, "%s", keel_compact_policy_name(p.policy));
    if (p.policy != KEEL_COMPACT_NONE)
        say("compaction: %s from the next turn (trigger %d cells, target %d)\n", c->compact_name,
            p.trigger, p.target);
    else
        say("compaction: none from the next turn\n");
}

/* Writes text to path atomically (a temporary file renamed into place). */
static bool write_atomic(const char *path, const char *text)
{
    size_t n = strlen(path) + 16;
    char *tmp = malloc(n);
    if (!tmp) return false;
    snprintf(tmp, n, "%s.tmpXXXXXX", path);
    int fd = mkstemp(tmp);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        say("keel: /save %s: %s\n", path, strerror(errno));
        if (fd >= 0) close(fd);
        if (fd >= 0) unlink(tmp);
        free(tmp);
        return false;
    }
    bool ok = cli_write(f, text, strlen(text), path) && cli_close(f, path);
    if (ok && rename(tmp, path) != 0) {
        say("keel: /save %s: %s\n", path, strerror(errno));
        ok = false;
    }
    if (!ok) unlink(tmp);
    free(tmp);
    return ok;
}

static void cmd_save(chat *c, const char *path)
{
    if (!*path) {
        say("/save: give a file name\n");
        return;
    }
    char info[512];
    keel_status st = keel_engine_slot_save(c->e, 0, path, info, sizeof info);
    if (st != KEEL_OK && st != KEEL_ERANGE) {
        cli_fail("/save", st, keel_engine_last_error(c->e));
        return;
    }
    json_t *doc = json_pack("{si sO}", "keel_chat", 1, "messages", c->msgs);
    char *text = doc ? json_dumps(doc, JSON_INDENT(1)) : NULL;
    json_decref(doc);
    size_t n = strlen(path) + 6;
    char *jp = malloc(n);
    if (!text || !jp) {
        free(text);
        free(jp);
        cli_fail("/save", KEEL_ENOMEM, NULL);
        return;
    }
    snprintf(jp, n, "%s.json", path);
    if (write_atomic(jp, text)) {
        json_t *ij = json_loads(info, 0, NULL);
        say("saved %zu messages to %s, %lld cached tokens to %s\n", json_array_size(c->msgs), jp,
            (long long)json_integer_value(json_object_get(ij, "n_saved")), path);
        json_decref(ij);
    }
    free(text);
    free(jp);
}

static void cmd_load(chat *c, const char *path)
{
    if (!*path) {
        say("/load: give a file name\n");
        return;
    }
    size_t n = strlen(path) + 6, len = 0;
    char *jp = malloc(n);
    if (!jp) {
        cli_fail("/load", KEEL_ENOMEM, NULL);
        return;
    }
    snprintf(jp, n, "%s.json", path);
    char *text = cli_read_file(jp, &len);
    if (!text) {
        say("keel: /load %s: %s\n", jp, strerror(errno));
        free(jp);
        return;
    }
    json_error_t je;
    json_t *doc = json_loadb(text, len, JSON_ALLOW_NUL, &je);
    free(text);
    json_t *msgs = json_object_get(doc, "messages");
    bool ok = json_is_array(msgs) && json_integer_value(json_object_get(doc, "keel_chat")) == 1;
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) ok &= json_is_string(json_object_get(m, "role"));
    if (!ok) {
        say("keel: /load %s: not a keel chat file (%s)\n", jp,
            doc ? "no messages array of role objects" : je.text);
        json_decref(doc);
        free(jp);
        return;
    }
    char info[512];
    keel_status st = keel_engine_slot_restore(c->e, 0, path, info, sizeof info);
    if (st != KEEL_OK && st != KEEL_ERANGE) {
        cli_fail("/load", st,
                 keel_engine_last_error(c->e)); /* the conversation and cache are as they were */
        json_decref(doc);
        free(jp);
        return;
    }
    json_decref(c->msgs);
    c->msgs = json_incref(msgs);
    json_decref(c->calls);
    c->calls = NULL;
    json_t *ij = json_loads(info, 0, NULL);
    say("loaded %zu messages from %s, %lld cached tokens from %s\n", json_array_size(msgs), jp,
        (long long)json_integer_value(json_object_get(ij, "n_restored")), path);
    json_decref(ij);
    json_decref(doc);
    free(jp);
}

static void cmd_clear(chat *c)
{
    json_array_clear(c->msgs);
    if (c->system) json_array_append(c->msgs, c->system);
    json_decref(c->calls);
    c->calls = NULL;
    keel_status st = keel_engine_reset(c->e);
    if (c->compact_cur && !c->compact_next)
        c->compact_next = json_incref(c->compact_cur); /* reset forgot it */
    if (st != KEEL_OK)
        cli_fail("/clear", st, keel_engine_last_error(c->e));
    else
        say("the conversation and the cache are cleared\n");
}

/* A command line (starting with '/'): 1 to leave, else 0. */
static int command(chat *c, char *line)
{
    char *arg = line + strcspn(line, " \t");
    if (*arg) *arg++ = 0;
    arg += strspn(arg, " \t");
    for (size_t n = strlen(arg); n > 0 && (arg[n - 1] == ' ' || arg[n - 1] == '\t'); n--)
        arg[n - 1] = 0;
    if (strcmp(line, "/exit") == 0 || strcmp(line, "/quit") == 0) return 1;
    if (strcmp(line, "/help") == 0)
        say("%s", g_help);
    else if (strcmp(line, "/clear") == 0)
        cmd_clear(c);
    else if (strcmp(line, "/save") == 0)
        cmd_save(c, arg);
    else if (strcmp(line, "/load") == 0)
        cmd_load(c, arg);
    else if (strcmp(line, "/kv") == 0)
        cmd_kv(c);
    else if (strcmp(line, "/compact") == 0)
        cmd_compact(c, arg);
    else
        say("unknown command %s (/help lists them)\n", line);
    return 0;
}

/* ---- input ----------------------------------------------------------------------------- */

/* Text grown by appending (the message being read). */
typedef struct text_buf {
    char *p;
    size_t n, cap;
} text_buf;

static bool text_add(text_buf *t, const char *s, size_t n)
{
    if (t->n + n + 1 > t->cap) {
        size_t cap = 2 * (t->n + n + 1);
        char *q = realloc(t->p, cap);
        if (!q) return false;
        t->p = q;
        t->cap = cap;
    }
    memcpy(t->p + t->n, s, n);
    t->n += n;
    t->p[t->n] = 0;
    return true;
}

/* Input waits on stdin now (a paste's next line). */
static bool input_pending(void)
{
    struct pollfd p = {STDIN_FILENO, POLLIN, 0};
    return poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
}

#ifdef KEEL_HAVE_LIBEDIT
static const char *el_prompt(EditLine *el)
{
    chat *c = NULL;
    el_get(el, EL_CLIENTDATA, &c);
    return c ? c->prompt : "> ";
}
#endif

typedef enum read_result { READ_MSG, READ_EOF, READ_INTR, READ_ERR } read_result;

/* One line into t (without its newline): the terminal's editor, or stdin. */
static read_result read_line(chat *c, const char *prompt, text_buf *t, bool *more)
{
    *more = false;
#ifdef KEEL_HAVE_LIBEDIT
    if (c->el) {
        snprintf(c->prompt, sizeof c->prompt, "%s", prompt);
        int n = 0;
        /* the terminal stays in edit mode until the message ends, so the
         * next lines of a paste wait in the tty, seen by input_pending (if
         * this fails a paste's lines come as separate messages) */
        bool prep = el_set(c->el, EL_PREP_TERM, 1) == 0;
        const char *l = el_gets(c->el, &n);
        if (!l) {
            if (prep && el_set(c->el, EL_PREP_TERM, 0) != 0) return READ_ERR;
            if (n < 0 && errno == EINTR) return READ_INTR;
            return READ_EOF;
        }
        size_t k = (size_t)n;
        while (k > 0 && (l[k - 1] == '\n' || l[k - 1] == '\r'))
            k--;
        if (!text_add(t, l, k)) return READ_ERR;
        *more = input_pending();
        if (!*more && prep && el_set(c->el, EL_PREP_TERM, 0) != 0) return READ_ERR;
        return READ_MSG;
    }
#endif
    if (c->tty_in && c->tty_out && (fputs(prompt, stdout) == EOF || fflush(stdout) != 0))
        return READ_ERR;
    char *line = NULL;
    size_t cap = 0;
    errno = 0;
    ssize_t n = getline(&line, &cap, stdin);
    if (n < 0) {
        free(line);
        bool intr = errno == EINTR;
        clearerr(stdin);
        if (intr) {
            if (c->tty_in && fputs("\n", stdout) == EOF) return READ_ERR;
            return READ_INTR;
        }
        return READ_EOF;
    }
    size_t k = (size_t)n;
    while (k > 0 && (line[k - 1] == '\n' || line[k - 1] == '\r'))
        k--;
    bool ok = text_add(t, line, k);
    free(line);
    if (!ok) return READ_ERR;
    *more = c->tty_in && input_pending();
    return READ_MSG;
}

/* One message: lines joined while one ends with a backslash or more lines
 * are already waiting (a paste). */
static read_result read_message(chat *c, const char *prompt, text_buf *t)
{
    t->n = 0;
    if (!text_add(t, "", 0)) return READ_ERR;
    const char *pr = prompt;
    for (;;) {
        bool more;
        size_t start = t->n;
        read_result r = read_line(c, pr, t, &more);
        if (r == READ_EOF && t->n > 0) return READ_MSG; /* a last line without its end */
        if (r != READ_MSG) {
#ifdef KEEL_HAVE_LIBEDIT
            if (r == READ_INTR && c->el && fputs("\n", stdout) == EOF) return READ_ERR;
#endif
            return r;
        }
        bool cont = t->n > start && t->p[t->n - 1] == '\\';
        if (cont) t->p[--t->n] = 0;
        if (!cont && !more) return READ_MSG;
        if (!text_add(t, "\n", 1)) return READ_ERR;
        pr = "... ";
    }
}

/* ---- setup --------------------------------------------------------------------------------- */

typedef struct chat_flags {
    const char *system, *system_file, *tools, *templ, *tool_choice;
} chat_flags;

static bool chat_extra(cli_opts *o, const char *a, const char *v, bool *takes)
{
    chat_flags *f = o->user;
    (void)takes;
    if (strcmp(a, "--system") == 0)
        f->system = v;
    else if (strcmp(a, "-sys") == 0 || strcmp(a, "--system-file") == 0)
        f->system_file = v;
    else if (strcmp(a, "--tools") == 0)
        f->tools = v;
    else if (strcmp(a, "--chat-template") == 0)
        f->templ = v;
    else if (strcmp(a, "--tool-choice") == 0)
        f->tool_choice = v;
    else
        return false;
    return true;
}

/* The engine's options from the flags (as keel run takes them). */
static char *engine_options(const cli_opts *o, const char *templ)
{
    const keel_context_params *p = &o->ctx;
    json_t *j = json_pack(
        "{ss si si si ss ss si si si si si si si}", "model", o->model.path, "n_batch", p->n_batch,
        "n_ubatch", p->n_ubatch, "n_threads", p->n_threads, "type_k", keel_dtype_name(p->type_k),
        "type_v", keel_dtype_name(p->type_v), "rot_k", p->rot_k, "rot_v", p->rot_v, "swa_window",
        p->swa_window, "swa_period", p->swa_period, "swa_sinks", p->n_sink, "ctx_checkpoints",
        p->n_ctx_checkpoints, "checkpoint_every", p->checkpoint_every);
    int bad = !j;
    if (j && o->model.tokenizer_path)
        bad |= json_object_set_new(j, "tokenizer", json_string(o->model.tokenizer_path));
    if (j && p->n_ctx > 0) bad |= json_object_set_new(j, "n_ctx", json_integer(p->n_ctx));
    if (j && templ) bad |= json_object_set_new(j, "chat_template", json_string(templ));
    if (j && p->compact.policy != KEEL_COMPACT_NONE) {
        const keel_compact_params *cp = &p->compact;
        json_t *k = json_pack("{ss si sf ss sI}", "policy", keel_compact_policy_name(cp->policy),
                              "sinks", cp->n_sink, "recent", (double)cp->recent, "positions",
                              cp->renumber ? "renumber" : "keep", "seed",
                              (json_int_t)(cp->seed > INT64_MAX ? INT64_MAX : cp->seed));
        if (k && o->kv_trigger_set)
            bad |= json_object_set_new(k, "trigger", json_integer(cp->trigger));
        if (k && o->kv_target_set)
            bad |= json_object_set_new(k, "target", json_integer(cp->target));
        bad |= !k || json_object_set_new(j, "kv_compact", k);
    }
    char *s = bad ? NULL : json_dumps(j, JSON_COMPACT);
    json_decref(j);
    return s;
}

/* The system message and the tools from the flags. 0 or an exit code. */
static int chat_inputs(chat *c, const chat_flags *f)
{
    if (f->system && f->system_file)
        return cli_fail("chat", KEEL_EINVAL, "give --system or -sys, not both");
    char *sys = NULL;
    size_t n = 0;
    if (f->system_file && !(sys = cli_read_file(f->system_file, &n))) {
        fprintf(stderr, "keel: -sys %s: %s\n", f->system_file, strerror(errno));
        return 1;
    }
    const char *st = sys ? sys : f->system;
    if (st && *st) {
        n = strlen(st);
        while (n > 0 && (st[n - 1] == '\n' || st[n - 1] == '\r'))
            n--;
        c->system = json_pack("{ss ss%}", "role", "system", "content", st, n);
        if (!c->system || json_array_append(c->msgs, c->system) != 0) {
            free(sys);
            return cli_fail("chat", KEEL_ENOMEM, NULL);
        }
    }
    free(sys);
    if (f->tool_choice) {
        const char *tc = f->tool_choice;
        if (!f->tools) return cli_fail("chat", KEEL_EINVAL, "--tool-choice needs --tools");
        bool word =
            strcmp(tc, "auto") == 0 || strcmp(tc, "none") == 0 || strcmp(tc, "required") == 0;
        c->tool_choice = word ? json_string(tc) : json_pack("{ss}", "name", tc);
        if (!c->tool_choice) return cli_fail("chat", KEEL_ENOMEM, NULL);
    }
    if (f->tools) {
        char *text = cli_read_file(f->tools, &n);
        if (!text) {
            fprintf(stderr, "keel: --tools %s: %s\n", f->tools, strerror(errno));
            return 1;
        }
        json_error_t je;
        json_t *t = json_loadb(text, n, 0, &je);
        free(text);
        if (!json_is_array(t)) {
            fprintf(stderr, "keel: --tools %s: %s\n", f->tools,
                    t ? "not a JSON array (an OpenAI tools array: [{\"type\": \"function\", ...}])"
                      : je.text);
            json_decref(t);
            return 1;
        }
        c->tools = json_dumps(t, JSON_COMPACT);
        json_decref(t);
        if (!c->tools) return cli_fail("chat", KEEL_ENOMEM, NULL);
    }
    return 0;
}

/* The SIGINT handler, restarting interrupted calls or not. At the prompt
 * it must not (a read returns on Ctrl-C); everywhere else it must (a
 * Ctrl-C during a write to stdout is not a write error). */
static bool sigint_restart(bool restart, struct sigaction *old)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sa.sa_flags = restart ? SA_RESTART : 0;
    sigemptyset(&sa.sa_mask);
    return sigaction(SIGINT, &sa, old) == 0;
}

/* Installs the SIGINT handler (restarting: see sigint_restart). */
static bool signals_on(struct sigaction *old)
{
    if (pipe(g_sig_pipe) != 0) return false;
    return sigint_restart(true, old);
}

/* The conversation loop. 0 or an exit code. */
static int chat_loop(chat *c, watcher *w)
{
    text_buf t = {NULL, 0, 0};
    bool intr_before = false;
    int rc = 0;
    for (;;) {
        char prompt[160];
        bool tool = c->calls && c->next_call < json_array_size(c->calls);
        json_t *call = tool ? json_array_get(c->calls, c->next_call) : NULL;
        if (tool)
            snprintf(prompt, sizeof prompt, "result of %s> ",
                     str_of(json_object_get(call, "function"), "name"));
        else
            snprintf(prompt, sizeof prompt, "> ");
        g_sigint = 0;
        bool sig_ok = sigint_restart(false, NULL);
        read_result r = read_message(c, prompt, &t);
        if (sig_ok && !sigint_restart(true, NULL)) {
            rc = cli_fail("chat", KEEL_EINTERNAL, "sigaction failed");
            break;
        }
        if (r == READ_ERR) {
            rc = cli_fail("chat", KEEL_ENOMEM, "reading input");
            break;
        }
        if (r == READ_EOF) break;
        if (r == READ_INTR) {
            if (intr_before) break;
            intr_before = true;
            say("(Ctrl-C again, Ctrl-D or /exit to leave)\n");
            continue;
        }
        intr_before = false;
        if (t.n == 0 && !tool) continue;
        size_t n0 = json_array_size(c->msgs);
        if (t.p[0] == '/' && t.p[1] != '/') {
            if (command(c, t.p)) break;
            continue;
        }
        const char *text = t.p[0] == '/' ? t.p + 1 : t.p;
#ifdef KEEL_HAVE_LIBEDIT
        HistEvent he;
        if (c->hist && !tool && history(c->hist, &he, H_ENTER, t.p) < 0)
            say("keel: the line could not be added to the history\n");
#endif
        json_t *m = tool ? json_pack("{ss ss ss}", "role", "tool", "tool_call_id",
                                     str_of(call, "id"), "content", text)
                         : json_pack("{ss ss}", "role", "user", "content", text);
        if (!m || json_array_append_new(c->msgs, m) != 0) {
            rc = cli_fail("chat", KEEL_ENOMEM, NULL);
            break;
        }
        if (tool && ++c->next_call < json_array_size(c->calls)) continue; /* more results to type */
        json_t *calls = NULL;
        if (tool) {
            /* the results follow the assistant's calls: a failed turn drops
             * them too, and they are asked for again */
            n0 -= c->next_call - 1;
            calls = c->calls;
            c->calls = NULL;
        }
        if (chat_turn(c, w, n0)) {
            json_decref(calls);
            rc = 1;
            break;
        }
        if (calls && json_array_size(c->msgs) == n0 && !c->calls) {
            c->calls = calls;
            c->next_call = 0;
        } else {
            json_decref(calls);
        }
        intr_before = g_sigint != 0; /* a Ctrl-C that stopped the answer counts as the first */
    }
    free(t.p);
    return rc;
}

int cmd_chat(int argc, char **argv)
{
    cli_opts o;
    cli_opts_init(&o);
    o.groups = CLI_G_MODEL | CLI_G_GEN | CLI_G_SAMPLE | CLI_G_SEED | CLI_G_CTX | CLI_G_THREADS |
               CLI_G_KV | CLI_G_COMPACT | CLI_G_BUDGET;
    o.n_predict = -1;
    chat_flags f = {NULL, NULL, NULL, NULL, NULL};
    o.user = &f;
    o.extra = chat_extra;
    o.extra_help =
        "  --system TEXT                  the system message\n"
        "  -sys, --system-file FILE       the system message from a file\n"
        "  --tools FILE.json              tools the model may call (an OpenAI tools array); "
        "nothing is\n"
        "                                 executed: you type each call's result\n"
        "  --tool-choice C                auto, none, required, or a tool's name (auto)\n"
        "  --chat-template T              a built-in template name, a file or template source\n"
        "                                 (default: the model's, else chatml)";
    int rc = cli_parse(argc, argv, &o, g_usage);
    if (rc) return rc == 1 ? 0 : rc;
    if (!o.model.path) return cli_fail("chat", KEEL_EINVAL, "-m MODEL is required");
    if (o.logits_out || o.ids_out)
        return cli_fail("chat", KEEL_EINVAL, "--logits-out and --ids-out are for keel run");
    if (o.kv_flag && o.ctx.compact.policy == KEEL_COMPACT_NONE) {
        fprintf(stderr, "keel: %s needs --kv-compact P\n", o.kv_flag);
        return 2;
    }
    char err[256] = "";
    keel_status st = keel_sampler_params_check(&o.samp, err);
    if (st != KEEL_OK) return cli_fail("sampler", st, err);
    setlocale(LC_CTYPE, ""); /* libedit reads and shows UTF-8 by the locale */
    chat c;
    memset(&c, 0, sizeof c);
    c.o = &o;
    c.tty_in = isatty(STDIN_FILENO) == 1;
    c.tty_out = isatty(STDOUT_FILENO) == 1;
    snprintf(c.compact_name, sizeof c.compact_name, "%s",
             keel_compact_policy_name(o.ctx.compact.policy));
    watcher w;
    w.e = NULL;
    atomic_init(&w.busy, 0);
    pthread_t th;
    bool th_on = false, sig_on = false;
    struct sigaction old_sa;
    if (!(c.msgs = json_array())) return cli_fail("chat", KEEL_ENOMEM, NULL);
    if ((rc = chat_inputs(&c, &f))) goto done;
    char *eo = engine_options(&o, f.templ);
    if (!eo) {
        rc = cli_fail("chat", KEEL_ENOMEM, NULL);
        goto done;
    }
    st = keel_engine_open(eo, &c.e, err);
    free(eo);
    if (st != KEEL_OK) {
        rc = cli_fail("chat", st, err);
        goto done;
    }
    w.e = c.e;
    if (!(sig_on = signals_on(&old_sa))) {
        rc = cli_fail("chat", KEEL_EIO, strerror(errno));
        goto done;
    }
    if (pthread_create(&th, NULL, watch_main, &w) != 0) {
        rc = cli_fail("chat", KEEL_ENOMEM, "cannot start the Ctrl-C watcher thread");
        goto done;
    }
    th_on = true;
#ifdef KEEL_HAVE_LIBEDIT
    if (c.tty_in && c.tty_out) {
        c.el = el_init("keel", stdin, stdout, stderr);
        c.hist = history_init();
        if (c.el) {
            HistEvent he;
            bool ok = el_set(c.el, EL_CLIENTDATA, &c) == 0 &&
                      el_set(c.el, EL_PROMPT, el_prompt) == 0 &&
                      el_set(c.el, EL_EDITOR, "emacs") == 0;
            if (ok && c.hist && history(c.hist, &he, H_SETSIZE, 1000) >= 0 &&
                el_set(c.el, EL_HIST, history, c.hist) != 0)
                say("keel: no line history (libedit refused it)\n");
            const char *home = getenv("HOME"); /* the user's ~/.editrc, if there is one */
            char rcp[4096];
            if (ok && home && snprintf(rcp, sizeof rcp, "%s/.editrc", home) < (int)sizeof rcp &&
                access(rcp, R_OK) == 0 && el_source(c.el, rcp) != 0)
                say("keel: %s: libedit could not read it\n", rcp);
            if (!ok) { /* plain lines then */
                el_end(c.el);
                c.el = NULL;
            }
        }
    }
#endif
    if (c.tty_in) {
        keel_model_info mi;
        keel_model_info_get(keel_engine_model(c.e), &mi);
        say("keel chat: %s (%s); /help for commands, Ctrl-C stops an answer, Ctrl-D leaves\n",
            mi.name, mi.arch);
    }
    rc = chat_loop(&c, &w);
done:
    if (th_on) {
        ssize_t q = write(g_sig_pipe[1], "q", 1);
        /* the watcher ends on 'q'; if that cannot be sent it is left behind */
        if (q != 1 || pthread_join(th, NULL) != 0) say("keel: the Ctrl-C watcher did not stop\n");
    }
    if (sig_on && sigaction(SIGINT, &old_sa, NULL) != 0 && !rc)
        rc = cli_fail("chat", KEEL_EIO, strerror(errno));
#ifdef KEEL_HAVE_LIBEDIT
    if (c.el) el_end(c.el);
    if (c.hist) history_end(c.hist);
#endif
    keel_engine_close(c.e);
    json_decref(c.msgs);
    json_decref(c.system);
    json_decref(c.compact_next);
    json_decref(c.compact_cur);
    json_decref(c.calls);
    json_decref(c.tool_choice);
    free(c.tools);
    return rc;
}
