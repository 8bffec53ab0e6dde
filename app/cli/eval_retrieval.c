/*
 * eval_retrieval.c — `keel eval-compaction --task retrieval`: does a cache
 * under compaction still hold an old, specific fact?
 *
 * Documents are built from the sentences of TEXT (-f). Document i is a pure
 * function of (TEXT, model tokenizer, --doc-seed + i, --doc-tokens, the
 * needle set): a contiguous run of TEXT's sentences (wrapping around), with
 * a needle sentence after its first 1-2 sentences ("There was a dog named
 * Spot." / "Her favorite toy was a blue kite."), filler sentences of the run
 * until about --doc-tokens tokens, and at the end the cue ("The dog named" /
 * "Her favorite toy was a"). The needle's tokens (" Spot") are scored
 * teacher-forced: mean log-probability, top-1 (argmax) rate, and documents
 * whose every needle token is top-1 (greedy decoding would emit the needle).
 * Sentences of TEXT that mention a needle word, "named" or "favorite" are not
 * used as filler, so the cue has one answer in the document; nor are
 * sentences without a letter or digit, or longer than RT_SENT_MAX bytes.
 *
 * Rows: every policy x budget (the whole document streamed in --chunk
 * prefill chunks under compaction), and three baselines without compaction:
 *   full         the document cut to the trained context T (the filler after
 *                the needle shortened until needle and cue fit in T tokens);
 *   prior        the same cut document without the needle sentence (what
 *                the model guesses without the fact);
 *   uncompacted  the whole document, positions running past T.
 * Needles: the candidates below that this model retrieves with full context
 * and does not guess without it, measured first on calibration documents of
 * their own seeds (stream 1 + candidate, the evaluation uses stream 0).
 */
#include "eval_compaction.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define RT_SENT_MAX 600   /* bytes of one usable sentence (longer ones are skipped) */
#define RT_KEEP_TOP1 0.7  /* a needle is kept: full-context top-1 rate >= this ... */
#define RT_KEEP_GAIN 1.0  /* ... and full log p - prior log p >= this (nats) */

typedef enum rt_family { RT_NAME, RT_TOY } rt_family;

typedef struct rt_needle {
    rt_family family;
    const char *word; /* the needle: a name, or a toy with its colour */
} rt_needle;

/* Names from the stories' world that TEXT (the fixture) does not use, and toys. */
static const rt_needle k_cands[] = {
    {RT_NAME, "Spot"},     {RT_NAME, "Tim"},       {RT_NAME, "Sue"},        {RT_NAME, "Bob"},
    {RT_NAME, "Jack"},     {RT_NAME, "Lucy"},      {RT_NAME, "Anna"},       {RT_NAME, "Sara"},
    {RT_NAME, "Molly"},    {RT_NAME, "Sally"},     {RT_NAME, "Timmy"},      {RT_NAME, "Kitty"},
    {RT_NAME, "Amy"},      {RT_NAME, "Joe"},       {RT_NAME, "Jane"},       {RT_NAME, "Kim"},
    {RT_NAME, "Zoe"},      {RT_NAME, "Pete"},      {RT_NAME, "Bill"},       {RT_NAME, "Rex"},
    {RT_NAME, "Buddy"},    {RT_NAME, "Fluffy"},    {RT_NAME, "Lola"},       {RT_NAME, "Bella"},
    {RT_TOY, "blue kite"}, {RT_TOY, "green car"},  {RT_TOY, "pink doll"},   {RT_TOY, "yellow boat"},
    {RT_TOY, "red drum"},  {RT_TOY, "purple hat"}, {RT_TOY, "white train"}, {RT_TOY, "orange truck"},
};
#define RT_N_CANDS ((int)(sizeof k_cands / sizeof k_cands[0]))

static const char *const k_kinds[] = {"dog", "cat", "bird", "fish", "frog", "duck", "bunny", "bear"};
#define RT_N_KINDS ((int)(sizeof k_kinds / sizeof k_kinds[0]))

/* splitmix64: documents are a function of their seed only */
static uint64_t rt_mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t rt_next(uint64_t *s)
{
    *s += 0x9e3779b97f4a7c15ull;
    return rt_mix(*s);
}

/* ---- text ---------------------------------------------------------------- */

typedef struct rt_buf {
    char *p;
    size_t len, cap;
} rt_buf;

static bool buf_add(rt_buf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (b->len + n + 1 > cap) cap *= 2;
        char *np = realloc(b->p, cap);
        if (!np) return false;
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return true;
}

/* Appends s, separated from what is there by one space. */
static bool buf_word(rt_buf *b, const char *s)
{
    return (b->len == 0 || buf_add(b, " ", 1)) && buf_add(b, s, strlen(s));
}

static bool is_alnum(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

static bool is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

/* w occurs in s as a whole word (or phrase) */
static bool has_word(const char *s, const char *w)
{
    size_t n = strlen(w);
    for (const char *p = strstr(s, w); p; p = strstr(p + 1, w))
        if ((p == s || !is_alnum(p[-1])) && !is_alnum(p[n])) return true;
    return false;
}

typedef struct rt_src {
    char **sent;     /* [n] usable sentences, whitespace collapsed */
    int32_t *n_tok;  /* [n] tokens of each (no BOS) */
    bool *can_start; /* [n] begins with a capital letter or a quote */
    int32_t n;
} rt_src;

static void src_free(rt_src *s)
{
    for (int32_t i = 0; i < s->n; i++) free(s->sent[i]);
    free(s->sent);
    free(s->n_tok);
    free(s->can_start);
}

/* Tokens of text (len bytes) into *ids (malloc'd). */
static keel_status rt_tokenize(const keel_model *m, const char *text, size_t len, bool bos,
                               int32_t **ids, int32_t *n)
{
    *ids = NULL;
    int32_t need = 0;
    keel_status st = keel_tokenize(m, text, len, bos, false, NULL, 0, &need);
    if (st != KEEL_OK && st != KEEL_ERANGE) return st;
    int32_t *v = malloc((size_t)(need > 0 ? need : 1) * sizeof(int32_t));
    if (!v) return KEEL_ENOMEM;
    st = keel_tokenize(m, text, len, bos, false, v, need, n);
    if (st != KEEL_OK) {
        free(v);
        return st;
    }
    *ids = v;
    return KEEL_OK;
}

static keel_status rt_count(const keel_model *m, const char *text, int32_t *n)
{
    int32_t *ids = NULL;
    keel_status st = rt_tokenize(m, text, strlen(text), false, &ids, n);
    free(ids);
    return st;
}

/* Splits text into sentences (ending at . ! ? and closing quotes before
 * whitespace, or at a blank line) and keeps the usable ones. */
static keel_status src_build(const keel_model *m, const char *text, size_t len, rt_src *out)
{
    memset(out, 0, sizeof *out);
    size_t cap = 0;
    keel_status st = KEEL_OK;
    char *one = malloc(RT_SENT_MAX + 1);
    if (!one) return KEEL_ENOMEM;
    size_t i = 0;
    while (i < len && st == KEEL_OK) {
        while (i < len && is_space(text[i])) i++;
        if (i >= len) break;
        size_t n = 0;
        bool too_long = false, ended = false;
        while (i < len && !ended) {
            char c = text[i++];
            if (is_space(c)) {
                /* a blank line ends the sentence; other whitespace is one space */
                bool blank = false;
                for (size_t j = i - 1, nl = 0; j < len && is_space(text[j]); j++)
                    if (text[j] == '\n' && ++nl == 2) blank = true;
                while (i < len && is_space(text[i])) i++;
                if (blank) break;
                c = ' ';
            }
            if (n < RT_SENT_MAX)
                one[n++] = c;
            else
                too_long = true;
            if (c == '.' || c == '!' || c == '?') {
                while (i < len && (text[i] == '"' || text[i] == '\'')) {
                    if (n < RT_SENT_MAX)
                        one[n++] = text[i];
                    else
                        too_long = true;
                    i++;
                }
                ended = i >= len || is_space(text[i]);
            }
        }
        while (n > 0 && one[n - 1] == ' ') n--;
        one[n] = 0;
        bool letter = false;
        for (size_t j = 0; j < n && !letter; j++) letter = is_alnum(one[j]);
        if (too_long || !letter || has_word(one, "named") || has_word(one, "favorite")) continue;
        bool skip = false;
        for (int k = 0; k < RT_N_CANDS && !skip; k++) skip = has_word(one, k_cands[k].word);
        if (skip) continue;
        if ((size_t)out->n == cap) {
            cap = cap ? cap * 2 : 64;
            char **ns = realloc(out->sent, cap * sizeof *ns);
            if (ns) out->sent = ns;
            int32_t *nt = realloc(out->n_tok, cap * sizeof *nt);
            if (nt) out->n_tok = nt;
            bool *nc = realloc(out->can_start, cap * sizeof *nc);
            if (nc) out->can_start = nc;
            if (!ns || !nt || !nc) {
                st = KEEL_ENOMEM;
                break;
            }
        }
        char *copy = malloc(n + 1);
        if (!copy) {
            st = KEEL_ENOMEM;
            break;
        }
        memcpy(copy, one, n + 1);
        int32_t k = out->n;
        out->sent[k] = copy;
        out->can_start[k] = (one[0] >= 'A' && one[0] <= 'Z') || one[0] == '"';
        out->n++;
        st = rt_count(m, copy, &out->n_tok[k]);
    }
    free(one);
    if (st != KEEL_OK) src_free(out);
    return st;
}

/* ---- documents ----------------------------------------------------------- */

typedef enum rt_variant { RT_LONG, RT_FIT, RT_PRIOR } rt_variant;

typedef struct rt_plan {
    int needle;      /* index into k_cands */
    int kind;        /* index into k_kinds (names) */
    int32_t start;   /* first sentence of the run */
    int32_t prefix;  /* sentences before the needle (1..2; fewer if they do not fit T) */
} rt_plan;

static rt_plan plan_make(const rt_src *src, uint64_t seed, uint64_t stream, int needle)
{
    uint64_t s = rt_mix(seed) ^ rt_mix(stream + 0x5eed);
    rt_plan p;
    p.needle = needle;
    p.kind = (int)(rt_next(&s) % RT_N_KINDS);
    p.start = (int32_t)(rt_next(&s) % (uint64_t)src->n);
    for (int32_t k = 0; k < src->n && !src->can_start[p.start]; k++) p.start = (p.start + 1) % src->n;
    p.prefix = 1 + (int32_t)(rt_next(&s) % 2);
    return p;
}

/* One document's tokens: ids [n] = BOS + text + needle, the needle being
 * the last n_needle ids. */
typedef struct rt_doc {
    int32_t *ids;
    int32_t n, n_needle;
} rt_doc;

/* The needle, cue and intro sentences of a plan. */
static void plan_texts(const rt_plan *p, char *intro, char *cue, char *needle, size_t cap)
{
    const rt_needle *nd = &k_cands[p->needle];
    if (nd->family == RT_NAME) {
        snprintf(intro, cap, "There was a %s named %s.", k_kinds[p->kind], nd->word);
        snprintf(cue, cap, "The %s named", k_kinds[p->kind]);
    } else {
        snprintf(intro, cap, "Her favorite toy was a %s.", nd->word);
        snprintf(cue, cap, "Her favorite toy was a");
    }
    snprintf(needle, cap, " %s", nd->word);
}

/* Text of the plan with f filler sentences after the needle sentence
 * (without it for RT_PRIOR), tokenized; the needle's ids must extend the
 * cue's ids (no token across the boundary). */
static keel_status doc_tokens(const keel_model *m, const rt_src *src, const rt_plan *p, bool intro_on,
                              int32_t f, rt_doc *d, char *err)
{
    char intro[128], cue[128], needle[128];
    plan_texts(p, intro, cue, needle, sizeof intro);
    rt_buf b = {NULL, 0, 0};
    bool ok = true;
    for (int32_t i = 0; i < p->prefix && ok; i++) ok = buf_word(&b, src->sent[(p->start + i) % src->n]);
    if (intro_on && ok) ok = buf_word(&b, intro);
    for (int32_t i = 0; i < f && ok; i++) ok = buf_word(&b, src->sent[(p->start + p->prefix + i) % src->n]);
    if (ok) ok = buf_word(&b, cue);
    size_t cue_end = b.len;
    if (ok) ok = buf_add(&b, needle, strlen(needle));
    keel_status st = ok ? KEEL_OK : KEEL_ENOMEM;
    int32_t *head = NULL, n_head = 0;
    d->ids = NULL;
    if (st == KEEL_OK) st = rt_tokenize(m, b.p, cue_end, true, &head, &n_head);
    if (st == KEEL_OK) st = rt_tokenize(m, b.p, b.len, true, &d->ids, &d->n);
    if (st == KEEL_OK && (d->n <= n_head || memcmp(head, d->ids, (size_t)n_head * sizeof(int32_t)) != 0)) {
        snprintf(err, 256, "the tokenizer joins the cue '%.64s' and the needle '%.64s' into one token", cue, needle);
        st = KEEL_EINVAL;
    }
    if (st == KEEL_OK) d->n_needle = d->n - n_head;
    if (st != KEEL_OK) {
        free(d->ids);
        d->ids = NULL;
    }
    free(head);
    free(b.p);
    return st;
}

/* Token estimate of a plan without filler (BOS, the sentences before the
 * needle, the needle sentence, the cue and the needle), from the pieces' own
 * counts; INT64_MAX if they cannot be tokenized. */
static int64_t plan_base(const keel_model *m, const rt_src *src, const rt_plan *p)
{
    char intro[128], cue[128], needle[128];
    plan_texts(p, intro, cue, needle, sizeof intro);
    int32_t a = 0, b = 0, c = 0;
    if (rt_count(m, intro, &a) != KEEL_OK || rt_count(m, cue, &b) != KEEL_OK ||
        rt_count(m, needle, &c) != KEEL_OK)
        return INT64_MAX;
    int64_t n = 1 + (int64_t)a + b + c;
    for (int32_t i = 0; i < p->prefix; i++) n += src->n_tok[(p->start + i) % src->n];
    return n;
}

/* Tokens of the i-th filler sentence of a plan. */
static int32_t filler_tokens(const rt_src *src, const rt_plan *p, int32_t i)
{
    return src->n_tok[((int64_t)p->start + p->prefix + i) % src->n];
}

/* The three variants of a plan: long (about target tokens), fit and prior
 * (at most T tokens, needle included). */
static keel_status doc_make(const keel_model *m, const rt_src *src, rt_plan plan, int32_t target,
                            int32_t T, rt_doc *lng, rt_doc *fit, rt_doc *prior, char *err)
{
    lng->ids = fit->ids = prior->ids = NULL;
    const rt_plan *p = &plan;
    /* fewer sentences before the needle when they would not fit T with it */
    while (plan.prefix > 0 && plan_base(m, src, p) > T) plan.prefix--;
    const int64_t base = plan_base(m, src, p);
    int32_t f = 0; /* filler of the long document: until about target tokens */
    for (int64_t n = base; f < EV_DOC_TOKENS_MAX && n < target; f++) n += filler_tokens(src, p, f);
    int32_t g = 0; /* of the cut one: while it fits T */
    for (int64_t n = base; g < f && n + filler_tokens(src, p, g) <= T; g++) n += filler_tokens(src, p, g);
    keel_status st = doc_tokens(m, src, p, true, f, lng, err);
    if (st != KEEL_OK) return st;
    for (;;) {
        st = doc_tokens(m, src, p, true, g, fit, err);
        if (st != KEEL_OK || fit->n <= T) break;
        free(fit->ids);
        fit->ids = NULL;
        if (g == 0) {
            snprintf(err, 256, "the needle sentence, %d sentences before it and the cue do not fit "
                     "the trained context (%d tokens)", p->prefix, T);
            st = KEEL_EINVAL;
            break;
        }
        g--;
    }
    if (st == KEEL_OK) st = doc_tokens(m, src, p, false, g, prior, err);
    if (st != KEEL_OK) {
        free(lng->ids);
        free(fit->ids);
        lng->ids = fit->ids = NULL;
    }
    return st;
}

static void doc_free(rt_doc *d)
{
    free(d->ids);
    d->ids = NULL;
}

/* ---- scoring ------------------------------------------------------------- */

typedef struct rt_acc {
    double lp_sum, lp_sq; /* over documents: mean log p of the needle's tokens, and its square */
    int64_t docs, tokens, top1, retrieved, compactions, doc_tokens;
} rt_acc;

typedef struct rt_score {
    double lp;       /* mean log p over the needle's tokens */
    int32_t top1;    /* needle tokens that were the argmax */
    int64_t compactions;
} rt_score;

/* Runs d through a fresh context (cp NULL or policy none: no compaction,
 * n_ctx = the document) and scores its needle. */
static keel_status doc_score(keel_model *m, const cli_opts *o, const rt_doc *d,
                             const keel_compact_params *cp, int32_t chunk, float *lp, rt_score *r,
                             char *err)
{
    const int32_t n = d->n - 1, first = n - d->n_needle; /* logits at t predict t + 1 */
    keel_context_params p = o->ctx;
    bool compact = cp && cp->policy != KEEL_COMPACT_NONE;
    if (compact) {
        if (chunk > cp->trigger - cp->target) chunk = cp->trigger - cp->target;
        p.n_ctx = cp->trigger;
        p.compact = *cp;
    } else {
        chunk = n;
        p.n_ctx = n;
        p.compact = keel_compact_params_default();
    }
    p.n_batch = chunk;
    p.n_ubatch = chunk < 512 ? chunk : 512;
    p.n_outputs = d->n_needle < chunk ? d->n_needle : chunk;
    keel_context *c = NULL;
    keel_status st = keel_context_open(m, &p, &c, err);
    if (st != KEEL_OK) return st;
    int8_t *flags = calloc((size_t)chunk, 1);
    if (!flags) st = KEEL_ENOMEM;
    keel_model_info mi;
    keel_model_info_get(m, &mi);
    double lp_sum = 0.0;
    r->top1 = 0;
    for (int32_t i = 0; i < n && st == KEEL_OK; i += chunk) {
        int32_t k = n - i < chunk ? n - i : chunk;
        for (int32_t j = 0; j < k; j++) flags[j] = i + j >= first;
        keel_batch b = {k, d->ids + i, NULL, NULL, flags};
        st = keel_decode(c, &b);
        if (st != KEEL_OK) {
            snprintf(err, 256, "decode: %s", keel_context_last_error(c));
            break;
        }
        for (int32_t j = 0; j < k; j++) {
            if (!flags[j]) continue;
            const float *l = keel_logits(c, j);
            int32_t want = d->ids[i + j + 1], arg = 0;
            for (int32_t v = 1; v < mi.n_vocab; v++)
                if (l[v] > l[arg]) arg = v;
            ev_log_softmax(l, mi.n_vocab, lp);
            lp_sum += lp[want];
            r->top1 += arg == want;
        }
    }
    r->compactions = st == KEEL_OK ? keel_mem_seq_compactions(keel_context_memory(c), 0) : 0;
    r->lp = lp_sum / (double)d->n_needle;
    free(flags);
    keel_context_close(c);
    return st;
}

static void acc_add(rt_acc *a, const rt_doc *d, const rt_score *s)
{
    a->lp_sum += s->lp;
    a->lp_sq += s->lp * s->lp;
    a->docs++;
    a->tokens += d->n_needle;
    a->top1 += s->top1;
    a->retrieved += s->top1 == d->n_needle;
    a->compactions += s->compactions;
    a->doc_tokens += d->n;
}

static double acc_mean(const rt_acc *a)
{
    return a->docs ? a->lp_sum / (double)a->docs : 0.0;
}

/* standard error of the mean over documents */
static double acc_se(const rt_acc *a)
{
    if (a->docs < 2) return 0.0;
    double mu = acc_mean(a), var = (a->lp_sq - (double)a->docs * mu * mu) / (double)(a->docs - 1);
    return var > 0 ? sqrt(var / (double)a->docs) : 0.0;
}

/* ---- the task ------------------------------------------------------------ */

typedef struct rt_row {
    const char *name;
    int32_t budget; /* 0: a baseline */
    keel_compact_policy policy;
    rt_acc acc;
} rt_row;

static void print_json_acc(const rt_acc *a)
{
    printf("\"docs\": %lld, \"mean_doc_tokens\": %.1f, \"needle_tokens\": %lld, \"logp\": %.4f, "
           "\"logp_se\": %.4f, \"top1\": %.4f, \"retrieved\": %.4f, \"compactions_per_doc\": %.2f",
           (long long)a->docs, a->docs ? (double)a->doc_tokens / (double)a->docs : 0.0,
           (long long)a->tokens, acc_mean(a), acc_se(a),
           a->tokens ? (double)a->top1 / (double)a->tokens : 0.0,
           a->docs ? (double)a->retrieved / (double)a->docs : 0.0,
           a->docs ? (double)a->compactions / (double)a->docs : 0.0);
}

int ev_retrieval(keel_model *m, const cli_opts *o, const ev_opts *e)
{
    keel_model_info mi;
    keel_model_info_get(m, &mi);
    const int32_t T = mi.n_ctx_train;
    int rc = 0;
    char err[256] = "";
    size_t len = 0;
    char *text = cli_read_file(o->file, &len);
    rt_src src;
    memset(&src, 0, sizeof src);
    float *lp = malloc((size_t)mi.n_vocab * sizeof(float));
    int n_rows = 3 + e->n_policies * e->n_budgets;
    rt_row *rows = calloc((size_t)n_rows, sizeof(rt_row));
    rt_acc cal_full[RT_N_CANDS], cal_prior[RT_N_CANDS];
    int kept[RT_N_CANDS], n_kept = 0;
    rt_doc lng = {NULL, 0, 0}, fit = {NULL, 0, 0}, prior = {NULL, 0, 0};
    if (!text) {
        fprintf(stderr, "keel eval-compaction: cannot read %s\n", o->file);
        rc = 1;
        goto done;
    }
    if (!lp || !rows) {
        rc = cli_fail("eval-compaction", KEEL_ENOMEM, NULL);
        goto done;
    }
    keel_status st = src_build(m, text, len, &src);
    if (st != KEEL_OK) {
        rc = cli_fail("eval-compaction", st, "splitting the text into sentences");
        goto done;
    }
    if (src.n < 8) {
        fprintf(stderr,
                "keel eval-compaction: %s: only %d usable sentences; the retrieval documents need at least 8 "
                "(sentences ending in . ! or ?, with a letter, without 'named', 'favorite' or a needle word)\n",
                o->file, src.n);
        rc = 2;
        goto done;
    }
    /* needles: retrieved with full context, not guessed without it */
    memset(cal_full, 0, sizeof cal_full);
    memset(cal_prior, 0, sizeof cal_prior);
    for (int c = 0; c < RT_N_CANDS; c++) {
        for (int j = 0; j < e->calib_docs; j++) {
            rt_plan p = plan_make(&src, e->doc_seed + (uint64_t)j, 1 + (uint64_t)c, c);
            rt_score sf, sp;
            st = doc_make(m, &src, p, e->doc_tokens, T, &lng, &fit, &prior, err);
            if (st == KEEL_OK) st = doc_score(m, o, &fit, NULL, 0, lp, &sf, err);
            if (st == KEEL_OK) st = doc_score(m, o, &prior, NULL, 0, lp, &sp, err);
            if (st == KEEL_OK) {
                acc_add(&cal_full[c], &fit, &sf);
                acc_add(&cal_prior[c], &prior, &sp);
            }
            doc_free(&lng);
            doc_free(&fit);
            doc_free(&prior);
            if (st != KEEL_OK) {
                rc = cli_fail("eval-compaction: needle calibration", st, err);
                goto done;
            }
        }
        const rt_acc *f = &cal_full[c];
        if ((double)f->top1 >= RT_KEEP_TOP1 * (double)f->tokens &&
            acc_mean(f) - acc_mean(&cal_prior[c]) >= RT_KEEP_GAIN)
            kept[n_kept++] = c;
    }
    if (n_kept == 0) {
        fprintf(stderr, "keel eval-compaction: no needle candidate is retrieved by %s with full context "
                        "(top-1 >= %.2f and a gain over the prior of >= %.1f nats); nothing to measure\n",
                o->model.path, RT_KEEP_TOP1, RT_KEEP_GAIN);
        rc = 1;
        goto done;
    }
    rows[0].name = "full";
    rows[1].name = "prior";
    rows[2].name = "uncompacted";
    for (int pi = 0; pi < e->n_policies; pi++)
        for (int bi = 0; bi < e->n_budgets; bi++) {
            rt_row *r = &rows[3 + pi * e->n_budgets + bi];
            r->policy = e->policies[pi];
            r->name = keel_compact_policy_name(r->policy);
            r->budget = e->budgets[bi];
        }
    const bool renumber = o->ctx.compact.renumber;
    for (int32_t i = 0; i < e->docs; i++) {
        uint64_t s = rt_mix(e->doc_seed + (uint64_t)i);
        rt_plan p = plan_make(&src, e->doc_seed + (uint64_t)i, 0, kept[s % (uint64_t)n_kept]);
        rt_score sc;
        st = doc_make(m, &src, p, e->doc_tokens, T, &lng, &fit, &prior, err);
        const char *what = "document";
        if (st == KEEL_OK && (st = doc_score(m, o, &fit, NULL, 0, lp, &sc, err)) == KEEL_OK)
            acc_add(&rows[0].acc, &fit, &sc);
        if (st == KEEL_OK && (st = doc_score(m, o, &prior, NULL, 0, lp, &sc, err)) == KEEL_OK)
            acc_add(&rows[1].acc, &prior, &sc);
        if (st == KEEL_OK && (st = doc_score(m, o, &lng, NULL, 0, lp, &sc, err)) == KEEL_OK)
            acc_add(&rows[2].acc, &lng, &sc);
        for (int r = 3; r < n_rows && st == KEEL_OK; r++) {
            keel_compact_params cp = ev_compact_params(o, rows[r].policy, rows[r].budget, renumber);
            what = rows[r].name;
            if ((st = doc_score(m, o, &lng, &cp, e->chunk, lp, &sc, err)) == KEEL_OK)
                acc_add(&rows[r].acc, &lng, &sc);
        }
        doc_free(&lng);
        doc_free(&fit);
        doc_free(&prior);
        if (st != KEEL_OK) {
            char what2[64];
            snprintf(what2, sizeof what2, "retrieval document %d (%.16s)", i, what);
            rc = cli_fail(what2, st, err);
            goto done;
        }
    }
    fprintf(stderr,
            "eval-compaction retrieval: %d documents (seeds %llu..%llu) of %.1f tokens on average from %d "
            "sentences of %s; full and prior cut to the trained context %d (%.1f tokens on average); "
            "%d of %d needle candidates kept\n",
            e->docs, (unsigned long long)e->doc_seed, (unsigned long long)(e->doc_seed + (uint64_t)e->docs - 1),
            (double)rows[2].acc.doc_tokens / (double)e->docs, src.n, o->file, T,
            (double)rows[0].acc.doc_tokens / (double)e->docs, n_kept, RT_N_CANDS);
    if (o->json) {
        printf("{\"task\": \"retrieval\", \"n_ctx_train\": %d, \"doc_seed\": %llu, \"positions\": \"%s\",\n"
               " \"rows\": [",
               T, (unsigned long long)e->doc_seed, renumber ? "renumber" : "keep");
        for (int r = 0; r < n_rows; r++) {
            char b[16] = "null";
            if (rows[r].budget) snprintf(b, sizeof b, "%d", rows[r].budget);
            printf("%s\n  {\"policy\": \"%s\", \"budget\": %s, ", r ? "," : "", rows[r].name, b);
            print_json_acc(&rows[r].acc);
            printf("}");
        }
        printf("\n ],\n \"needles\": [");
        for (int c = 0; c < RT_N_CANDS; c++) {
            bool k = false;
            for (int j = 0; j < n_kept; j++) k |= kept[j] == c;
            printf("%s\n  {\"needle\": \"%s\", \"kept\": %s, \"full_logp\": %.4f, \"full_top1\": %.4f, "
                   "\"prior_logp\": %.4f, \"prior_top1\": %.4f}",
                   c ? "," : "", k_cands[c].word, k ? "true" : "false", acc_mean(&cal_full[c]),
                   cal_full[c].tokens ? (double)cal_full[c].top1 / (double)cal_full[c].tokens : 0.0,
                   acc_mean(&cal_prior[c]),
                   cal_prior[c].tokens ? (double)cal_prior[c].top1 / (double)cal_prior[c].tokens : 0.0);
        }
        printf("\n ]\n}\n");
    } else {
        printf("| policy      | budget | positions | docs | tokens | log p needle | s.e.   | top-1  | retrieved | compactions/doc |\n");
        printf("|-------------|-------:|-----------|-----:|-------:|-------------:|-------:|-------:|----------:|----------------:|\n");
        for (int r = 0; r < n_rows; r++) {
            const rt_acc *a = &rows[r].acc;
            char b[16] = "-";
            if (rows[r].budget) snprintf(b, sizeof b, "%d", rows[r].budget);
            printf("| %-11s | %6s | %-9s | %4lld | %6.1f | %12.4f | %6.4f | %6.4f | %9.4f | %15.2f |\n",
                   rows[r].name, b, rows[r].budget ? (renumber ? "renumber" : "keep") : "-",
                   (long long)a->docs, (double)a->doc_tokens / (double)a->docs, acc_mean(a), acc_se(a),
                   (double)a->top1 / (double)a->tokens, (double)a->retrieved / (double)a->docs,
                   (double)a->compactions / (double)a->docs);
        }
        printf("\nneedle candidates (%d calibration documents each, cut to %d tokens):\n\n", e->calib_docs, T);
        printf("| needle       | kept | full log p | full top-1 | full retrieved | prior log p | prior top-1 | prior retrieved |\n");
        printf("|--------------|------|-----------:|-----------:|---------------:|------------:|------------:|----------------:|\n");
        for (int c = 0; c < RT_N_CANDS; c++) {
            bool k = false;
            for (int j = 0; j < n_kept; j++) k |= kept[j] == c;
            const rt_acc *f = &cal_full[c], *q = &cal_prior[c];
            printf("| %-12s | %-4s | %10.4f | %10.4f | %14.4f | %11.4f | %11.4f | %15.4f |\n", k_cands[c].word,
                   k ? "yes" : "no", acc_mean(f), (double)f->top1 / (double)f->tokens,
                   (double)f->retrieved / (double)f->docs, acc_mean(q), (double)q->top1 / (double)q->tokens,
                   (double)q->retrieved / (double)q->docs);
        }
    }
done:
    free(rows);
    free(lp);
    src_free(&src);
    free(text);
    return rc;
}
