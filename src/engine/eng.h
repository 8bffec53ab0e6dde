/*
 * eng.h — private interface of the chat engine (keel_engine, keel.h): slots
 * over one context, the request queue, prompt building and the scheduler
 * step. docs/engine.md explains the design.
 *
 *   eng_open.c    options, open/close, stats, reset
 *   eng_prompt.c  request JSON -> eng_req (options, messages -> prompt tokens)
 *   eng_sched.c   queue, slot choice and prefix reuse, the batched step,
 *                 output (stop strings, tool-call parsing), responses
 *
 * Threads: the queue (pending list, cancel flags, the running flag) is under
 * mu; everything else (slots, the context) belongs to the one thread that
 * steps the engine: keel_engine_run's, or keel_complete's caller when no loop
 * runs (e->driving marks that the caller steps).
 */
#ifndef KEEL_ENGINE_ENG_H
#define KEEL_ENGINE_ENG_H

#include "../chat/jinja.h"
#include "../chat/toolcall.h"
#include "engine.h"

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>

/* Requests are parsed with these flags: the engine can generate U+0000
 * (the response carries it as \u0000), so a client echoing its history
 * must be able to send it back. */
#define ENG_JSON_FLAGS (JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL)

#define ENG_MAX_SLOTS 256 /* = the memory's sequence limit */
#define ENG_PREFILL_SHARE 0.4 /* default prefill_share (docs/engine.md "Steps") */
#define ENG_TTFT_BUCKETS 12 /* 0.01 s .. 20 s, see eng_ttft_le */

/* Per-request options (request JSON or keel_complete's options_json). */
typedef enum eng_tool_choice {
    ENG_TOOLS_AUTO = 0,     /* the model decides */
    ENG_TOOLS_NONE = 1,     /* tools neither rendered nor parsed */
    ENG_TOOLS_REQUIRED = 2, /* a call is forced where the format allows it (tool_name: that one) */
} eng_tool_choice;

typedef struct eng_opts {
    keel_sampler_params samp;
    int32_t max_tokens;       /* -1: until end of generation or the budget */
    char **stop;              /* [n_stop] NUL-terminated, owned */
    int32_t n_stop;
    bool compact_set;         /* kv_compact given: applies to this slot from now on */
    keel_compact_params compact;
    bool add_generation_prompt;
    int8_t cont;              /* continue_final_message: -1 when the last message is the
                                 assistant's (default), 0 never, else a toolcall_cont */
    json_t *template_kwargs;  /* extra template variables (object) or NULL; owned ref */
    bool parse_tools;         /* false for raw prompts */
    bool parse_reasoning;     /* reasoning_format "none": reasoning markers stay in the content */
    bool json_answer;         /* response_format json_object / json_schema: a fenced answer is unwrapped */
    bool ignore_eos;          /* end-of-generation tokens are never sampled */
    bool return_progress;     /* KEEL_EVENT_PROGRESS during the prefill */
    eng_tool_choice tool_choice;
    char *tool_name;          /* tool_choice naming one tool (owned), else NULL */
    bool logprobs;            /* each generated token's log-probability in the response */
    int32_t top_logprobs;     /* 0..ENG_MAX_TOP_LOGPROBS most likely tokens beside it */
    int32_t *bias_tok;        /* logit_bias: [n_bias] distinct token ids (owned) */
    float *bias;              /* [n_bias] added to their logits; -100: -inf (banned) */
    int32_t n_bias;
    keel_grammar *grammar;    /* "grammar" (GBNF): the output is constrained to it (owned), or NULL */
    char *grammar_text;       /* its source (owned, grammar_len + 1 bytes): parked matchers are
                                 found by it */
    size_t grammar_len;
    /* lazy grammars (eng_lazy.c): the grammar applies from the first
     * trigger in the output on (the trigger's text is the grammar's first) */
    bool grammar_lazy;
    char **trig;              /* [n_trig] trigger strings (owned), at most ENG_LAZY_TRIGGERS */
    int32_t n_trig;
    int32_t *trig_tok;        /* [n_trig_tok] trigger token ids (owned) */
    int32_t n_trig_tok;
    bool trig_at_start;       /* triggers count only at the start of the output, whitespace aside */
    int8_t strict_tools;      /* "strict_tools": -1 auto (strict tools, forced calls), 0 off, 1 every tool */
    bool one_call;            /* "parallel_tool_calls": false: the tool grammar allows one call */
    bool tool_forced;         /* the grammar is the tool-call grammar of a forced call: active from
                                 the first token, after the forced opening the prompt ends with */
    char *tool_note;          /* the tool-call grammar: what it covers or why there is none (owned), or NULL */
    const char *const *markers; /* the tool grammar's markers (static, NULL-terminated): its matcher
                                   uses the engine's tool vocabulary, or NULL */
} eng_opts;

#define ENG_LAZY_TRIGGERS 16    /* triggers of one request */
#define ENG_LAZY_TRIGGER_MAX 128 /* bytes of one trigger string */

/* One generated token's log-probability under the model (log-softmax of
 * its logits, before any sampling transform) and the most likely tokens
 * at that step. */
#define ENG_MAX_TOP_LOGPROBS 20
typedef struct eng_lp {
    int32_t tok;
    float lp;
    int32_t n_top;
    int32_t top_tok[ENG_MAX_TOP_LOGPROBS];
    float top_lp[ENG_MAX_TOP_LOGPROBS];
} eng_lp;

typedef enum eng_req_kind {
    ENG_REQ_CHAT = 0,   /* messages (+ tools) through the template */
    ENG_REQ_TEXT = 1,   /* raw prompt text (tokenized with BOS as the vocabulary says) */
    ENG_REQ_TOKENS = 2, /* prompt token ids */
} eng_req_kind;

/* How an admission used the slot's cache (keel_engine_stats "cache_reuse",
 * /metrics keel_cache_reuse_total). */
typedef enum eng_cache_kind {
    ENG_CACHE_NEW = 0,       /* nothing shared with the prompt */
    ENG_CACHE_REUSED,        /* everything shared was reused */
    ENG_CACHE_PARTIAL,       /* a checkpoint below the divergence was restored */
    ENG_CACHE_RESET_CKPT,    /* shared tokens, but no checkpoint covered the divergence */
    ENG_CACHE_RESET_COMPACT, /* the cache was compacted and the prompt does not extend it */
    ENG_CACHE_RESET_HIST,    /* the slot's history outgrew max_prompt_tokens */
    ENG_CACHE_KINDS
} eng_cache_kind;

extern const char *const eng_cache_kind_names[ENG_CACHE_KINDS];

/* Checkpoint priorities (keel_mem_ckpt_take_prio): where the next request
 * of a conversation is likely to diverge, most useful last. keel_decode's
 * own checkpoints (chunk ends, checkpoint_every) have ENG_PRIO_PERIODIC. */
enum {
    ENG_PRIO_PERIODIC = 0,
    ENG_PRIO_RECENT = 1, /* the end of the prompt, the starts of the last user messages */
    ENG_PRIO_BREAK = 2,  /* a cache_control breakpoint, the start of the first user message */
    ENG_PRIO_SYSTEM = 3, /* the end of the system prompt and tool definitions */
};

#define ENG_MAX_MARKS 8   /* checkpoint marks of one prompt */
#define ENG_MAX_BREAKS 4  /* cache_control breakpoints honoured (Anthropic allows 4) */
#define ENG_LAST_USERS 3  /* the starts of this many last user messages are marked */

/* A position of a prompt where a checkpoint is wanted (covers tokens < pos). */
typedef struct eng_mark {
    int32_t pos;
    int32_t prio;
} eng_mark;

/* A continued message's own text as the parse gives it ([0] content, [1]
 * reasoning): the client sent it, so the events and the response leave it
 * out. at[i]: bytes of text[i] the events have matched so far; a delta
 * that departs from it (the prefill's tail turned out to be a call's
 * opening, not text) ends the matching (at = len). */
typedef struct eng_pre {
    char *text[2]; /* base_alloc'd, len + 1 bytes, or NULL */
    size_t len[2], at[2];
} eng_pre;

typedef struct eng_req eng_req;
struct eng_req {
    uint64_t id;
    eng_req_kind kind;
    json_t *messages, *tools;  /* CHAT: owned refs (tools may be NULL) */
    toolcall_cont cont;        /* CHAT: the last (assistant) message is continued, not closed */
    int32_t breaks[ENG_MAX_BREAKS]; /* CHAT: messages marked cache_control (the last ones) */
    int32_t n_breaks;
    char *text;                /* TEXT: owned */
    size_t text_len;
    int32_t *tokens;           /* TOKENS: owned [n_tokens] */
    int32_t n_tokens;
    eng_opts o;
    keel_event_fn cb;
    void *user;
    atomic_int cancel;
    eng_req *next;             /* queue link, then the done list */
    eng_req *live_next;        /* every queued or running request (under mu) */
    bool keep;                 /* a keel_complete caller waits for it and frees it */
    /* completion (for a waiter on another thread) */
    bool done;
    keel_status status;
    char *response;            /* malloc'd by the engine (hooks), NUL-terminated */
    size_t response_len;
};

/* A slot action (keel_engine_slot_*), run by the stepping thread. */
typedef enum eng_ctl_kind { ENG_CTL_SAVE = 0, ENG_CTL_RESTORE = 1, ENG_CTL_ERASE = 2 } eng_ctl_kind;

typedef struct eng_ctl eng_ctl;
struct eng_ctl {
    eng_ctl_kind kind;
    int32_t slot;
    const char *path;      /* the caller's, valid while it waits */
    char *info;            /* the caller's buffer */
    size_t info_cap;
    bool done;
    keel_status status;
    char err[BASE_ERR_CAP];
    eng_ctl *next;
};

/* One entry of the RAM prompt cache: a saved slot (keel_mem_save blob)
 * and its token history. */
typedef struct eng_pc_entry eng_pc_entry;
struct eng_pc_entry {
    uint8_t *blob;
    size_t blob_len;
    int32_t *tokens;
    int32_t n_tokens;
    bool compacted;        /* the saved memory is a compacted summary: only extended */
    uint64_t last_used;
    eng_pc_entry *next;
};

typedef enum eng_slot_state {
    ENG_SLOT_IDLE = 0,
    ENG_SLOT_PREFILL = 1,
    ENG_SLOT_GEN = 2,
} eng_slot_state;

/* Output held back while it may still become a stop string. */
typedef struct eng_text {
    char *data;
    size_t len, cap;
} eng_text;

/* A grammar and a matcher over it: a request's, then parked for the
 * next request with the same source, so that its caches (stacks, token
 * masks: the trie walks) are paid once, not per request. */
#define ENG_GRAMMAR_PARK 4
typedef struct eng_gpark {
    keel_grammar *g;
    keel_grammar_matcher *m;
    char *text; /* len + 1 bytes */
    size_t len;
    const keel_grammar_vocab *v; /* the vocabulary m was opened with */
    uint64_t last_used;
} eng_gpark;

typedef struct eng_slot {
    int32_t seq;              /* the context's sequence id */
    eng_slot_state state;
    /* the cache: tokens decoded into this sequence, in order (the logical
     * history; with compaction the memory holds fewer cells) */
    int32_t *hist;            /* [hist_cap] */
    int32_t n_hist;
    bool hist_compacted;      /* a compaction ran: the memory only extends the history */
    bool hist_lost;           /* the history outgrew hist_cap: the cache cannot be reused */
    keel_compact_params compact; /* this slot's compaction (sticky across requests) */
    uint64_t last_used;       /* LRU among equals */
    /* the request being served */
    eng_req *req;
    int32_t *prompt;          /* [hist_cap] the request's prompt tokens */
    int32_t n_prompt;
    int32_t n_fed;            /* prompt tokens in the cache (reused + prefilled) */
    int32_t n_reused;         /* prompt tokens reused from the cache */
    char cache_note[192];     /* "new", "reused", "partial: ..." or "reset: why" */
    int32_t n_shared;         /* prompt tokens the slot's history shared with the prompt */
    int64_t n_too_long;       /* KEEL_ECONTEXT at admission: the prompt's length in tokens
                                 (an estimate for a rendering past its bound), else 0 */
    int32_t prompt_limit;     /* with n_too_long: the most tokens the prompt may have */
    eng_lp *lp;               /* [cap_lp] with logprobs, else NULL */
    int32_t n_lp, cap_lp;
    eng_mark marks[ENG_MAX_MARKS]; /* the request's checkpoint marks, ascending pos */
    int32_t n_marks;
    char forced[320];         /* a forced tool call's opening, appended to the prompt */
    size_t n_forced;          /* 0: none */
    char *prefill;            /* a continued message's text, appended to the prompt (owned,
                                 n_prefill + 1 bytes), or NULL */
    size_t n_prefill;
    eng_pre pre;              /* what the prefill parses to: left out of events and response */
    keel_sampler *samp;
    keel_grammar_matcher *gm; /* the request's grammar state, or NULL */
    bool lazy;                /* gm waits for a trigger: no masks, the output is free text */
    bool lazy_dead;           /* an at-start trigger can no longer come: gm stays unused */
    size_t n_win;             /* bytes in win */
    char win[ENG_LAZY_TRIGGER_MAX + 1024]; /* while lazy: the output's last bytes (a trigger's
                                 length less one) and the newest token's */
    eng_gpark gp;             /* gm's grammar and source, owned while the request runs */
    keel_detok_stream ds;
    toolcall_parser *tp;
    int32_t last_tok;         /* sampled, not yet decoded */
    int32_t n_gen;
    eng_text pend;            /* generated text not yet released (stop-string holdback) */
    char *stop_hit;           /* the stop string that ended the request, or NULL */
    const char *finish;       /* finish_reason once decided */
    uint64_t t_start, t_prompt_end, t_end;
    int64_t compactions_at_start;
    /* speculative decoding: this step's drafts, and the request's counts */
    int32_t draft[KEEL_SPEC_MAX_DRAFT];
    int32_t n_draft;          /* drafts in this step's batch */
    int32_t n_hist0;          /* n_hist before this step's batch */
    int32_t n_acc;            /* drafts accepted so far this step */
    bool spec_stop;           /* this step's rows are done (a rejection or the end) */
    int64_t n_drafted, n_accepted;
    /* snapshot for other threads (keel_engine_stats), under mu */
    eng_slot_state stat_state;
    int32_t stat_hist, stat_cells;
    int32_t stat_prompt, stat_fed, stat_reused; /* the request's prompt: tokens, in the cache, reused */
    bool stat_compacted;
    int64_t stat_compactions;
} eng_slot;

/* eng_cost.c: a decode-only step's time against its batch's tokens, T(n)
 * = f + u n, least squares with exponential forgetting. */
typedef struct eng_cost {
    double w, sn, snn, st, snt; /* decayed sums: steps, n, n^2, ns, n ns */
} eng_cost;

struct keel_engine {
    keel_model *model;
    keel_context *ctx;
    keel_context_params cp;
    int32_t n_slots, n_ctx_slot;
    bool recurrent;           /* the model has recurrent layers: rewinds go through checkpoints */
    int32_t hist_cap;         /* most prompt + generated tokens a slot tracks */
    eng_slot *slots;
    int32_t *batch_tok, *batch_seq; /* [n_batch] */
    int8_t *batch_logits;
    int32_t *batch_slot;      /* [n_batch] slot of each token with logits, else -1 */
    int32_t *batch_row;       /* [n_batch] a generating slot's row: 0 its newest token, r > 0 its
                                 draft r - 1 (the row verifies draft r), else -1 */
    /* chat */
    jinja_template *tmpl;
    toolcall_format tool_format;
    char *bos_text, *eos_text;
    bool template_builtin;
    const char *template_name; /* static text: "model", "chatml", a built-in name, "inline", "file" */
    /* default options of every request */
    keel_compact_params compact_default;
    int32_t *eog_ids;         /* [n_eog] end-of-generation tokens (ignore_eos) */
    keel_grammar_vocab *gvocab; /* the vocabulary trie of grammars, built by the stepping thread
                                   at the first request with a grammar, or NULL */
    keel_grammar_vocab *gvocab_tool; /* the same with the tool-call format's marker tokens given their
                                   text (tool grammars), or NULL */
    eng_gpark gpark[ENG_GRAMMAR_PARK]; /* idle matchers by grammar source (stepping thread) */
    atomic_bool tool_logged;  /* a request's tool calls went unconstrained: logged (once) */
    int32_t n_eog;
    /* queue */
    pthread_mutex_t mu;
    pthread_cond_t cv;        /* work arrived / a request finished */
    eng_req *queue_head, *queue_tail;
    eng_req *live_head;       /* queued and running requests (cancel by id) */
    eng_ctl *ctl_head;        /* slot actions waiting for the stepping thread */
    eng_req *done_head;       /* finished submitted requests, freed by the stepping thread */
    int32_t n_queued, max_queue;
    uint64_t next_id;
    bool running;             /* a keel_engine_run loop owns the stepping */
    bool driving;             /* a keel_complete caller steps (no loop) */
    bool stop;
    bool closing;             /* keel_engine_close began: new calls are refused */
    int32_t n_inside;         /* public calls in progress (eng_enter .. eng_leave) */
    uint64_t clock;           /* LRU counter */
    /* stats (under mu) */
    int64_t n_requests, n_failed, n_cancelled, n_prompt_tokens, n_cached_tokens, n_gen_tokens;
    double prompt_seconds, predicted_seconds;
    int64_t ttft_counts[ENG_TTFT_BUCKETS + 1]; /* time to first token, cumulative buckets + total */
    double ttft_sum;
    /* memory snapshot for other threads (under mu) */
    keel_mem_stats mem_stats;
    int64_t group_used[8], group_cap[8];
    int32_t n_group_stat;
    uint64_t fingerprint;     /* the model's, stored in and checked against sessions */
    /* how each admission reused the slot's cache (eng_cache_kind), and the
     * shared prompt tokens that had to be computed again (under mu) */
    int64_t cache_counts[ENG_CACHE_KINDS];
    int64_t cache_lost_tokens;
    int64_t ckpt_failed;      /* checkpoints at marks that could not be taken */
    /* RAM prompt cache (eng_slots.c) */
    size_t pc_limit, pc_bytes;
    eng_pc_entry *pc_head;
    int64_t pc_entries, pc_hits, pc_hit_tokens, pc_saves, pc_evictions;
    /* the shared tier on Redis (eng_remote.c), or NULL */
    struct tier *tier;
    /* tests: the logits each request's first token is sampled from */
    void (*debug_logits)(void *user, uint64_t request, const float *logits, int32_t n_vocab);
    void *debug_user;
    /* the last keel_complete's response (under mu) */
    char *last_response;
    size_t last_response_len;
    /* fairness (eng_sched.c, docs/engine.md "Steps"): while a slot
     * generates, the prefill chunks of a step may take about pf_share of
     * the step's time, estimated from the engine's own steps (stepping
     * thread only) */
    double pf_share;          /* (0, 1]; 1: prefill fills the batch whatever generates */
    eng_cost dec_cost;        /* a decode-only step's time against its tokens */
    double pf_tok_ns;         /* cost of one prefill token in a mixed step (EWMA); 0: unknown */
    int32_t pf_last;          /* prefill tokens of the last mixed step */
    int32_t pf_mixed;         /* mixed steps since the last decode-only one */
    double pf_credit;         /* prefill time earned and not spent (ns; < 0: a debt) */
    /* the batch keel_decode is running (under mu): a stop, or a cancel of
     * every request in it, interrupts the decode (keel_cancel) */
    bool in_decode;
    int32_t n_batch_req;
    eng_req *batch_req[ENG_MAX_SLOTS];
    /* speculative decoding (eng_spec.c): the draft source, or NULL */
    keel_spec *spec;
    keel_model *draft_model;  /* spec draft: its model, or NULL */
    int64_t n_drafted, n_accepted; /* over every request (under mu) */
};

/* eng_open.c */
/* The calling thread's error buffer for e (BASE_ERR_CAP bytes): what
 * keel_engine_last_error(e) returns on this thread. Per thread, so calls
 * on one engine from several threads never write one buffer. */
char *eng_err(const keel_engine *e);
/* Marks a public call in progress on e (keel_engine_close waits for it to
 * leave). KEEL_ECANCELED, with the text in eng_err(e), once close began. */
keel_status eng_enter(keel_engine *e);
void eng_leave(keel_engine *e);

/* eng_prompt.c */
void eng_opts_init(const keel_engine *e, eng_opts *o);
void eng_opts_free(eng_opts *o);
/* Parses the options members of obj (unknown members are skipped only when
 * allow_other is set: the request object also holds messages/tools).
 * KEEL_EINVAL with the member named in err. */
keel_status eng_opts_parse(const keel_engine *e, json_t *obj, bool allow_other, eng_opts *o,
                           char *err);
/* A request from its JSON parts. KEEL_EINVAL named in err, KEEL_ENOMEM. */
keel_status eng_req_make(keel_engine *e, json_t *request, eng_req **out, char *err);
void eng_req_free(eng_req *r);
/* The most prompt tokens request r may have: what a slot tracks (hist_cap)
 * and, without compaction, what the cache holds (n_ctx). */
int32_t eng_prompt_limit(const keel_engine *e, const eng_req *r);
/* The request's prompt tokens into slot->prompt (at most e->hist_cap):
 * renders the template (chat requests: the text into *rendered, reused
 * buffer), tokenizes. KEEL_EINVAL (template), KEEL_ECONTEXT (longer than
 * what the request may have; sl->n_too_long and prompt_limit say by how much;
 * a rendering past its bound counts as too long), KEEL_ENOMEM. */
keel_status eng_prompt_tokens(keel_engine *e, eng_slot *sl, const eng_req *r, char *err,
                              jinja_buf *rendered);

/* Where a checkpoint of this chat prompt (sl->prompt, rendered as text)
 * is worth keeping, into sl->marks: the end of the system prompt and
 * tools, the start of the first and of the last ENG_LAST_USERS user
 * messages, the end of each cache_control message, the start of the
 * generation prompt, the end of the prompt.
 * A mark is the longest token prefix the prompt shares with the rendering
 * of the messages before it, so a later prompt that changes only what
 * follows shares it too. Renders and tokenizes on the calling thread;
 * marks that cannot be found (a template refusing a partial conversation)
 * are left out. Only KEEL_ENOMEM fails. */
keel_status eng_prompt_marks(keel_engine *e, eng_slot *sl, const eng_req *r, const char *text, size_t len);

/* The number of tokens r's prompt has (as eng_prompt_tokens would make
 * it), with no slot and no bound from the context: renders and tokenizes on
 * the calling thread. KEEL_EINVAL (template), KEEL_ENOMEM. */
keel_status eng_count_tokens(keel_engine *e, const eng_req *r, int64_t *n, char *err);
/* A chat request's prompt text into out, as it is tokenized: the template's
 * rendering, or for a continued message (r->cont) the rendering up to the
 * message and, in *prefill (base_alloc'd, *n_prefill + 1 bytes; NULL when
 * none), the message's text that follows it (toolcall_continuation).
 * slot_bound: the rendering is bounded by what a slot can hold.
 * KEEL_ENOMEM, or the template's status with its error in jerr. */
keel_status eng_chat_render(keel_engine *e, const eng_req *r, bool slot_bound, jinja_buf *out, char **prefill,
                            size_t *n_prefill, char *jerr);

/* ---- the output parser of a chat turn (eng_chat.c) ---- */

/* Opens r's output parser as a slot's admission does: the engine's format
 * (content only for raw prompts and tool_choice none), reasoning as
 * prompt[0..prompt_len) leaves it, the request's tools; then feeds tail
 * (a continued message's prefill, or a forced call's opening) as the
 * model's own output. pre (may be NULL): for a prefill, set before it is
 * fed to what it parses to alone (eng_pre), for fn to leave out of the
 * events. Events go to fn (may be NULL). KEEL_EINVAL, KEEL_ENOMEM, with err. */
keel_status eng_chat_parser_open(const keel_engine *e, const eng_req *r, const char *prompt, size_t prompt_len,
                                 const char *tail, size_t n_tail, bool tail_is_prefill, toolcall_event_fn fn,
                                 void *user, toolcall_parser **out, eng_pre *pre, char *err);
/* Drops from the delta *s[0..*n) of stream which (0 content, 1 reasoning)
 * the bytes that repeat the prefill. */
void eng_pre_skip(eng_pre *pre, int which, const char **s, size_t *n);
/* Frees pre's texts (zeroes it). */
void eng_pre_free(eng_pre *pre);
/* Frees a slot's prefill (NULL is fine). */
void eng_slot_prefill_free(eng_slot *sl);
/* What a slot's prompt ends with after the rendering: a continued
 * message's prefill, else a forced call's opening (n 0: nothing). */
static inline void eng_slot_tail(const eng_slot *sl, const char **tail, size_t *n)
{
    *tail = sl->prefill ? sl->prefill : sl->forced;
    *n = sl->prefill ? sl->n_prefill : sl->n_forced;
}
/* For the conformance tests (tests/test_chat_conformance.c): renders
 * request_json's chat exactly as a request is prompted, then parses
 * output[0..n) as the model's generation, fed chunk bytes at a time (0:
 * whole). *full: the parsed message (prefill included) as
 * toolcall_result_json gives it, after toolcall_finish unless partial;
 * *streamed: the message the events built (content, reasoning_content,
 * tool_calls with their id, name, arguments), prefill included; *prompt
 * (may be NULL): the prompt text, prefill included, as a JSON string. New
 * references. */
keel_status eng_chat_parse_output(keel_engine *e, const char *request_json, const char *output, size_t n,
                                  size_t chunk, bool partial, json_t **full, json_t **streamed, json_t **prompt,
                                  char *err);

/* Upper bounds (seconds) of the time-to-first-token histogram buckets. */
extern const double eng_ttft_le[ENG_TTFT_BUCKETS];

/* eng_sched.c */
/* One scheduler step over the slots (the stepping thread only): admits
 * queued requests to idle slots, decodes one batch, emits events. Returns
 * true when any slot is busy or a request is queued. */
bool eng_step(keel_engine *e);
void eng_finish_all(keel_engine *e, const char *why);
/* Interrupts the running keel_decode (keel_cancel) when the loop stops or
 * every request in its batch is cancelled. Called with mu held, after the
 * cancel flags are set. */
void eng_cut_locked(keel_engine *e);
void eng_slot_clear(keel_engine *e, eng_slot *sl);
/* Frees a parked or owned grammar and matcher (zeroes p). */
void eng_gpark_free(eng_gpark *p);

/* eng_lazy.c: lazy grammars and the tool-call grammar of a request. */
/* "grammar_triggers": strings, or {"type": "word" | "token" | "start", "value"} (llama-server's
 * numeric types 0 token, 1 word too). */
keel_status eng_lazy_triggers(const keel_engine *e, json_t *v, eng_opts *o, char *err);
void eng_lazy_opts_free(eng_opts *o);
/* The tool-call grammar of a chat request with tools, when strict_tools, a strict tool or a
 * forced call asks for one (into r->o.grammar, lazy unless forced). KEEL_EINVAL for a strict
 * tool whose schema is refused; else the request goes on unconstrained, r->o.tool_note says why. */
keel_status eng_tool_grammar(keel_engine *e, eng_req *r, char *err);
/* A request's matcher was opened for slot sl: the lazy state, and a forced call's opening fed. */
keel_status eng_lazy_begin(keel_engine *e, eng_slot *sl, char *err);
/* The sampled token tok of a waiting slot (sl->lazy): activates the grammar when a trigger
 * appears. KEEL_OK unless the detokenizer fails. */
keel_status eng_lazy_step(keel_engine *e, eng_slot *sl, int32_t tok);
/* eng_cost.c */
/* Learns a decode-only step of n tokens that took ns. */
void eng_cost_add(eng_cost *c, int32_t n, double ns);
/* The line: f and u, true; false while the slope is unknown (every step
 * had about one count): f the mean time, u 0. */
bool eng_cost_line(const eng_cost *c, double *f, double *u);
/* The predicted time of a decode-only step of n tokens (the mean while
 * the slope is unknown); 0 before the first step. */
double eng_cost_at(const eng_cost *c, int32_t n);
/* One sequence's share of a decode-only step of n_tok tokens over n_seq
 * sequences that took ns, k of the tokens its drafts: ns (f / n_seq +
 * u (1 + k)) / (f + u n_tok) (its part of what every step pays, and its
 * own tokens); ns with one sequence; ns / n_seq while the slope is
 * unknown. The shares of a step add up to ns. */
double eng_cost_share(const eng_cost *c, double ns, int32_t n_seq, int32_t n_tok, int32_t k);

/* eng_spec.c: speculative decoding in the step. */
/* Drafts for each generating slot (cnt: slots generating this step,
 * chunk: prefill tokens per slot) within what the step can spare, into
 * sl->draft / sl->n_draft. */
void eng_spec_plan(keel_engine *e, const int32_t *cnt, const int32_t *chunk);
/* The slot's rows are about to be read (n_hist0, the acceptance state). */
void eng_spec_begin(eng_slot *sl);
/* After the slot's rows: counts, the back-off's feedback (timed on the
 * slot's share of a decode-only step of n_tok tokens over n_seq slots
 * that took step_ns; 0: untimed), the rejected drafts rewound (a failure
 * ends the request, named). */
void eng_spec_settle(keel_engine *e, eng_slot *sl, uint64_t step_ns, int32_t n_seq, int32_t n_tok);
/* Ends sl's request with an error (eng_sched.c's finish). */
void eng_finish_error(keel_engine *e, eng_slot *sl, keel_status st, const char *why);
/* Frees finished submitted requests (the stepping thread, outside callbacks). */
void eng_reap(keel_engine *e);

/* eng_slots.c */
/* Runs the queued slot actions (the stepping thread). */
void eng_run_controls(keel_engine *e);
/* The prompt cache, at admission: before slot sl (whose cache shares *lcp
 * tokens with prompt) is taken for prompt, saves its cache when it would be
 * lost to another conversation, and restores a cached entry that shares
 * more. sys_end (0: unknown) is where the prompt's system prompt and tools
 * end: a prompt sharing the slot's cache past it continues that
 * conversation, edited, and the old cache (which no later prompt would
 * share more of) is not kept. Updates *lcp. Never fails the request: a
 * cache problem only costs reuse. */
void eng_pc_admit(keel_engine *e, eng_slot *sl, const int32_t *prompt, int32_t n, int32_t sys_end, int32_t *lcp);
void eng_pc_free(keel_engine *e);
/* Keeps slot sl's cache in the RAM prompt cache (when on and worth it). */
void eng_pc_keep(keel_engine *e, eng_slot *sl);
/* Loads a session blob into the idle slot sl (all or nothing). */
keel_status eng_slot_load_blob(keel_engine *e, eng_slot *sl, const uint8_t *blob, size_t len, char *err);

/* eng_remote.c: the shared prompt-cache tier (docs/cache-tier.md) */
#define ENG_REDIS_TTL 3600
#define ENG_REDIS_MAX_MIB 512
#define ENG_REDIS_TIMEOUT_MS 2000
#define ENG_REDIS_CHUNK 256
keel_status eng_remote_open(keel_engine *e, const char *url, int32_t ttl_s, size_t max_bytes, int32_t timeout_ms,
                            int32_t chunk, char *err);
void eng_remote_close(keel_engine *e);
/* At admission, after the RAM cache: resumes slot sl from the tier's
 * longest stored prefix of prompt when it beats *lcp (updated). */
void eng_remote_admit(keel_engine *e, eng_slot *sl, const int32_t *prompt, int32_t n, int32_t *lcp);
/* A request ended: queues slot sl's state for the tier. */
void eng_remote_store(keel_engine *e, eng_slot *sl);
json_t *eng_remote_stats(keel_engine *e);

#endif
