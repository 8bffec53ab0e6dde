/*
 * bpe.c — byte-level BPE ("gpt2" tokenizers): the GPT-2 byte <-> code
 * point map, the merge table, the pre-tokenizer (regexes chosen by
 * tokenizer.ggml.pre, run with PCRE2 in UTF + UCP mode, JIT when
 * available), and the merge loop, following llama.cpp's
 * llm_tokenizer_bpe.
 *
 * Pre-tokenization applies the type's regexes in sequence: each regex
 * splits every piece from the previous one into its matches and the gaps
 * between them (gaps are pieces too), exactly as llama.cpp's
 * unicode_regex_split. Where llama.cpp rewrote a Hugging Face regex only to
 * suit std::regex (\p{Lu} classes emulated with lookaheads), the original
 * regex is used, since PCRE2 supports it. Invalid UTF-8 never matches a
 * regex item (PCRE2_MATCH_INVALID_UTF), so such bytes end up in gap pieces
 * and are encoded byte by byte: any input round-trips.
 *
 * Owns (in the tokenizer): merge texts, merge table and index, compiled
 * regexes and the PCRE2 context that routes PCRE2's memory through
 * base_alloc.
 */
#include "tok_int.h"

#include <string.h>

/* ---- GPT-2 byte map ------------------------------------------------------ */

/* Printable bytes map to themselves; the other 68 bytes (0..32, 127..160,
 * 173) to 256, 257, ... in byte order. */
static bool byte_is_printable(unsigned b)
{
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
}

uint32_t bpe_byte_to_cp(uint8_t b)
{
    if (byte_is_printable(b)) return b;
    uint32_t n = 0;
    for (unsigned i = 0; i < b; i++)
        n += !byte_is_printable(i);
    return 256 + n;
}

int bpe_cp_to_byte(uint32_t cp)
{
    if (cp < 256) return byte_is_printable(cp) ? (int)cp : -1;
    uint32_t n = cp - 256;
    for (unsigned i = 0; i < 256; i++)
        if (!byte_is_printable(i) && n-- == 0) return (int)i;
    return -1;
}

/* UTF-8 of a code point < 0x800 (all the map produces). */
static size_t cp_utf8(uint32_t cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xc0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3f));
    return 2;
}

size_t text_gpt2_byte_utf8(uint8_t b, char *out)
{
    return cp_utf8(bpe_byte_to_cp(b), out);
}

/* ---- pre-tokenizers --------------------------------------------------------- */

#define RE_GPT2         "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RE_CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define RE_LLAMA3                                                                                  \
    RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"   \
                    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2                                                                                   \
    RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"        \
                    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_UPPER   "[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]"
#define RE_LOWER   "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]"
#define RE_CONTR_I "(?i:'s|'t|'re|'ve|'m|'ll|'d)"

typedef struct pre_type {
    const char *id;    /* name reported in info.pre_used */
    const char *names; /* '|'-separated tokenizer.ggml.pre values */
    bool ignore_merges, add_bos, clean_spaces, no_bos;
    const char *re[TOK_MAX_REGEX]; /* NULL-terminated */
} pre_type;

static const pre_type g_pre[] = {
    {"default",
     "default",
     false,
     false,
     true,
     false,
     {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"}},
    {"gpt2",
     "gpt2|gpt-2|phi-2|jina-es|jina-de|gigachat|jina-v2-es|jina-v2-de|a.x-4.0|mellum|jina-v1-en|"
     "jina-v2-code|roberta-bpe|exaone4|mpt|olmo|jais",
     false,
     false,
     true,
     false,
     {RE_GPT2}},
    {"gpt2-noclean", "trillion|granite-docling", false, false, false, false, {RE_GPT2}},
    {"llama3",
     "llama3|llama-v3|llama-bpe|falcon3|falcon-h1|pixtral|midm-2.0|lfm2",
     true,
     true,
     true,
     false,
     {RE_LLAMA3}},
    {"dbrx", "dbrx|smaug-bpe", false, false, true, false, {RE_LLAMA3}},
    {"chatglm4", "chatglm-bpe|glm4", false, false, true, true, {RE_LLAMA3}},
    {"deepseek-llm",
     "deepseek-llm",
     false,
     false,
     false,
     false,
     {"[\r\n]",
      "\\s?[A-Za-z\\x{00B5}\\x{00C0}-\\x{00D6}\\x{00D8}-\\x{00F6}\\x{00F8}-\\x{01BA}"
      "\\x{01BC}-\\x{01BF}\\x{01C4}-\\x{0293}\\x{0295}-\\x{02AF}\\x{0370}-\\x{0373}"
      "\\x{0376}\\x{0377}\\x{037B}-\\x{037D}\\x{037F}\\x{0386}\\x{0388}-\\x{038A}"
      "\\x{038C}\\x{038E}-\\x{03A1}\\x{03A3}-\\x{03F5}\\x{03F7}-\\x{0481}\\x{048A}-\\x{052F}"
      "\\x{0531}-\\x{0556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}"
      "\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}"
      "\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}"
      "\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}"
      "\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}"
      "\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}"
      "\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}"
      "\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}"
      "\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}"
      "\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}"
      "\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}"
      "\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}"
      "\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044f}\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}"
      "\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}"
      "]+",
      "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+",
      "\\s+$", "[\\x{4E00}-\\x{9FA5}\\x{0800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+", "\\p{N}+"}},
    {"deepseek-coder",
     "deepseek-coder",
     false,
     false,
     false,
     false,
     {"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+",
      "[\\x{4E00}-\\x{9FA5}\\x{0800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+", "\\p{N}"}},
    {"deepseek-v3",
     "deepseek-v3|hunyuan-dense|joyai-llm",
     false,
     false,
     false,
     false,
     {"\\p{N}{1,3}", "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+",
      "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{"
      "M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"}},
    {"falcon",
     "falcon",
     false,
     false,
     true,
     false,
     {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]"}},
    {"starcoder",
     "starcoder|refact|codeshell|exaone|minerva-7b",
     false,
     false,
     true,
     false,
     {"\\p{N}", RE_GPT2}},
    {"starcoder-noclean", "command-r|smollm", false, false, false, false, {"\\p{N}", RE_GPT2}},
    {"qwen2",
     "qwen2|deepseek-r1-qwen|kormo|megrez|hunyuan|grok-2|solar-open",
     false,
     false,
     false,
     false,
     {RE_QWEN2}},
    {"stablelm2", "stablelm2", false, false, true, false, {RE_QWEN2}},
    {"poro",
     "poro-chat",
     false,
     false,
     false,
     false,
     {" ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{FF0C}\\x{3001}\\x{0964}\\x{06D4}\\x{060C})]+"}},
    {"bloom",
     "bloom|gpt3-finnish",
     false,
     false,
     true,
     false,
     {" ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{FF0C}\\x{3001}\\x{0964}\\x{06D4}\\x{060C})]+"}},
    {"viking",
     "viking",
     false,
     false,
     false,
     false,
     {" ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{FF0C}\\x{3001}\\x{0964}\\x{06D4}\\x{060C})]+", "\\p{N}"}},
    {"tekken",
     "tekken",
     true,
     true,
     false,
     false,
     {"[^\\r\\n\\p{L}\\p{N}]?" RE_UPPER "*" RE_LOWER "+|[^\\r\\n\\p{L}\\p{N}]?" RE_UPPER
      "+" RE_LOWER "*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    {"gpt-4o",
     "gpt-4o|o200k|llama4|minimax-m2|kanana2",
     false,
     false,
     false,
     false,
     {"[^\\r\\n\\p{L}\\p{N}]?" RE_UPPER "*" RE_LOWER "+" RE_CONTR_I
      "?|[^\\r\\n\\p{L}\\p{N}]?" RE_UPPER "+" RE_LOWER "*" RE_CONTR_I
      "?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|"
      "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    {"seed-coder",
     "seed-coder",
     false,
     false,
     false,
     false,
     {RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|"
                      "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    {"bailingmoe",
     "bailingmoe|bailingmoe2|llada-moe",
     false,
     false,
     false,
     false,
     {"'(?i:[sdmt]|ll|ve|re)|[^\\r\\n\\p{L}\\p{N}]?+\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]++[\\r\\n]*|"
      "\\s*[\\r\\n]|\\s+(?!\\S)|\\s+"}},
};

static bool name_in_list(const char *list, const char *name, size_t n)
{
    const char *p = list;
    while (*p) {
        const char *e = strchr(p, '|');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (l == n && memcmp(p, name, n) == 0) return true;
        if (!e) break;
        p = e + 1;
    }
    return false;
}

/* The pre-tokenizer for a tokenizer.ggml.pre value; gpt2 for NULL/unknown. */
static const pre_type *pre_find(const char *name, size_t n, bool *unknown)
{
    *unknown = false;
    if (name)
        for (size_t i = 0; i < sizeof g_pre / sizeof g_pre[0]; i++)
            if (name_in_list(g_pre[i].names, name, n)) return &g_pre[i];
    *unknown = true;
    return &g_pre[1];
}

/* ---- PCRE2 memory through base_alloc ---------------------------------------- */

#define RE_HDR 16 /* size prefix keeps 16-byte alignment */

static void *re_malloc(size_t n, void *user)
{
    (void)user;
    size_t total;
    if (!size_add(n, RE_HDR, &total)) return NULL;
    uint8_t *p = base_alloc(total);
    if (!p) return NULL;
    memcpy(p, &n, sizeof n);
    return p + RE_HDR;
}

static void re_free(void *q, void *user)
{
    (void)user;
    if (!q) return;
    uint8_t *p = (uint8_t *)q - RE_HDR;
    size_t n;
    memcpy(&n, p, sizeof n);
    base_free(p, n + RE_HDR);
}

/* ---- merges ------------------------------------------------------------------ */

static uint64_t pair_hash(const char *l, size_t ln, const char *r, size_t rn)
{
    return base_hash64(r, rn, base_hash64(l, ln, 0x6d65726765ull));
}

static int64_t merge_rank(const text_tokenizer *t, const char *l, size_t ln, const char *r,
                          size_t rn)
{
    if (!t->mindex) return -1;
    size_t mask = t->mindex_cap - 1, i = (size_t)pair_hash(l, ln, r, rn) & mask;
    while (t->mindex[i]) {
        const tok_merge *m = &t->merges[t->mindex[i] - 1];
        if (m->left_len == ln && m->right_len == rn && memcmp(t->mblob + m->off, l, ln) == 0 &&
            memcmp(t->mblob + m->off + ln, r, rn) == 0)
            return (int64_t)t->mindex[i] - 1;
        i = (i + 1) & mask;
    }
    return -1;
}

static keel_status load_merges(text_tokenizer *t, const gguf *g, char *err)
{
    const gguf_value *m;
    keel_status st = gguf_get_arr(g, "tokenizer.ggml.merges", GGUF_TYPE_STRING, &m, err);
    if (st == KEEL_ENOENT)
        return base_err(err, KEEL_EFORMAT, "gpt2 tokenizer: missing key tokenizer.ggml.merges");
    if (st) return st;
    if (m->n > UINT32_MAX / 4)
        return base_err(err, KEEL_EFORMAT, "too many merges (%llu)", (unsigned long long)m->n);
    size_t n = (size_t)m->n, bytes = 0;
    for (size_t i = 0; i < n; i++) {
        const char *s;
        size_t l;
        gguf_arr_str(m, i, &s, &l);
        bytes += l; /* <= file size */
    }
    if (bytes > UINT32_MAX) return base_err(err, KEEL_EFORMAT, "merges too large");
    t->mblob_bytes = bytes ? bytes : 1;
    t->mblob = base_alloc(t->mblob_bytes);
    t->merges = n ? base_alloc(n * sizeof *t->merges) : NULL;
    t->mindex_cap = 16;
    while (t->mindex_cap < 2 * n)
        t->mindex_cap <<= 1;
    t->mindex = base_calloc(t->mindex_cap, sizeof *t->mindex);
    t->info.n_merges = (int64_t)n; /* sizes for bpe_free */
    if (!t->mblob || (n && !t->merges) || !t->mindex)
        return base_err(err, KEEL_ENOMEM, "out of memory for %zu merges", n);
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        const char *s;
        size_t l;
        gguf_arr_str(m, i, &s, &l);
        /* "left right": split at the first space after the first byte; a
         * merge without one can never apply (llama.cpp stores ("", "")) */
        const char *sp = l > 1 ? memchr(s + 1, ' ', l - 1) : NULL;
        tok_merge *e = &t->merges[i];
        e->off = (uint32_t)off;
        if (!sp) {
            e->left_len = e->right_len = 0;
            continue;
        }
        size_t ln = (size_t)(sp - s), rn = l - ln - 1;
        memcpy(t->mblob + off, s, ln);
        memcpy(t->mblob + off + ln, sp + 1, rn);
        e->left_len = (uint32_t)ln;
        e->right_len = (uint32_t)rn;
        off += ln + rn;
        if (merge_rank(t, s, ln, sp + 1, rn) >= 0) continue; /* keep the first rank */
        size_t mask = t->mindex_cap - 1, j = (size_t)pair_hash(s, ln, sp + 1, rn) & mask;
        while (t->mindex[j])
            j = (j + 1) & mask;
        t->mindex[j] = (uint32_t)i + 1;
    }
    return KEEL_OK;
}

keel_status bpe_init(text_tokenizer *t, const gguf *g, char *err)
{
    keel_status st = load_merges(t, g, err);
    if (st) return st;
    bool unknown;
    bool has_pre = gguf_find_key(g, "tokenizer.ggml.pre") >= 0;
    const pre_type *p = pre_find(has_pre ? t->info.pre : NULL, strlen(t->info.pre), &unknown);
    t->info.pre_used = p->id;
    t->info.pre_unknown = unknown;
    t->info.ignore_merges = p->ignore_merges;
    t->info.clean_spaces = p->clean_spaces;
    if (p->add_bos) t->info.add_bos = true;
    if (p->no_bos) t->info.bos = TEXT_TOKEN_NULL;
    t->gctx = pcre2_general_context_create(re_malloc, re_free, NULL);
    if (!t->gctx) return base_err(err, KEEL_ENOMEM, "out of memory for the pre-tokenizer");
    pcre2_compile_context *cc = pcre2_compile_context_create(t->gctx);
    if (!cc) return base_err(err, KEEL_ENOMEM, "out of memory for the pre-tokenizer");
    for (int i = 0; i < TOK_MAX_REGEX && p->re[i]; i++) {
        int code;
        PCRE2_SIZE off;
        pcre2_code *re =
            pcre2_compile((PCRE2_SPTR)p->re[i], PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &code, &off, cc);
        if (!re) {
            pcre2_compile_context_free(cc);
            if (code == PCRE2_ERROR_HEAP_FAILED)
                return base_err(err, KEEL_ENOMEM, "out of memory compiling the pre-tokenizer");
            PCRE2_UCHAR msg[120];
            pcre2_get_error_message(code, msg, sizeof msg);
            return base_err(err, KEEL_EINTERNAL, "pre-tokenizer %s regex %d: %s at %zu", p->id, i,
                            (const char *)msg, (size_t)off);
        }
        t->re[t->n_re++] = re;
        /* JIT is an optimisation: without it the interpreter runs; only an
         * allocation failure is reported (as every other one is) */
        if (pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) == PCRE2_ERROR_NOMEMORY) {
            pcre2_compile_context_free(cc);
            return base_err(err, KEEL_ENOMEM, "out of memory compiling the pre-tokenizer");
        }
    }
    pcre2_compile_context_free(cc);
    return KEEL_OK;
}

void bpe_free(text_tokenizer *t)
{
    for (int i = 0; i < t->n_re; i++)
        pcre2_code_free(t->re[i]);
    t->n_re = 0;
    pcre2_general_context_free(t->gctx);
    t->gctx = NULL;
    base_free(t->mblob, t->mblob_bytes);
    base_free(t->merges, (size_t)t->info.n_merges * sizeof *t->merges);
    base_free(t->mindex, t->mindex_cap * sizeof *t->mindex);
    t->mblob = NULL;
    t->merges = NULL;
    t->mindex = NULL;
}

/* ---- encoding ----------------------------------------------------------------- */

typedef struct span {
    size_t off, len;
} span;

typedef struct span_vec {
    span *v;
    size_t n, cap;
} span_vec;

static keel_status span_push(span_vec *s, size_t off, size_t len)
{
    if (s->n == s->cap) {
        size_t nc = s->cap ? 2 * s->cap : 64;
        span *p = base_realloc(s->v, s->cap * sizeof *p, nc * sizeof *p);
        if (!p) return KEEL_ENOMEM;
        s->v = p;
        s->cap = nc;
    }
    s->v[s->n].off = off;
    s->v[s->n].len = len;
    s->n++;
    return KEEL_OK;
}

/* Splits each span of in with re into matches and gaps, appended to out. */
static keel_status regex_split(const pcre2_code *re, pcre2_match_data *md, const char *text,
                               const span_vec *in, span_vec *out)
{
    keel_status st;
    for (size_t k = 0; k < in->n; k++) {
        const char *s = text + in->v[k].off;
        size_t n = in->v[k].len, pos = 0, last = 0;
        while (pos < n) {
            int rc = pcre2_match(re, (PCRE2_SPTR)s, n, pos, 0, md, NULL);
            if (rc == PCRE2_ERROR_JIT_STACKLIMIT) /* the interpreter keeps its frames on the heap */
                rc = pcre2_match(re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_JIT, md, NULL);
            if (rc == PCRE2_ERROR_NOMEMORY || rc == PCRE2_ERROR_HEAPLIMIT) return KEEL_ENOMEM;
            if (rc < 0) break; /* no match (or the match limit): the rest is one gap */
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            size_t ms = ov[0], me = ov[1];
            if (me <= ms) { /* empty match: step one character */
                pos = ms + 1;
                while (pos < n && ((uint8_t)s[pos] & 0xc0) == 0x80)
                    pos++;
                continue;
            }
            if (ms > last && (st = span_push(out, in->v[k].off + last, ms - last))) return st;
            if ((st = span_push(out, in->v[k].off + ms, me - ms))) return st;
            last = pos = me;
        }
        if (last < n && (st = span_push(out, in->v[k].off + last, n - last))) return st;
    }
    return KEEL_OK;
}

typedef struct bpe_sym {
    int32_t prev, next;
    uint32_t off, n; /* in the encoded word */
} bpe_sym;

typedef struct bpe_pair {
    int64_t rank;
    int32_t left, right;
    uint32_t size;
} bpe_pair;

/* a pops before b: lower rank, then lower left index (llama.cpp) */
static bool bpair_before(const bpe_pair *a, const bpe_pair *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static void bheap_push(bpe_pair *h, size_t *n, bpe_pair v)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!bpair_before(&v, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static bpe_pair bheap_pop(bpe_pair *h, size_t *n)
{
    bpe_pair top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, best = i;
        const bpe_pair *bv = &last;
        if (l < *n && bpair_before(&h[l], bv)) best = l, bv = &h[l];
        if (r < *n && bpair_before(&h[r], bv)) best = r;
        if (best == i) break;
        h[i] = h[best];
        i = best;
    }
    if (*n) h[i] = last;
    return top;
}

typedef struct bpe_ctx {
    const text_tokenizer *t;
    char *enc; /* encoded word */
    bpe_sym *sym;
    bpe_pair *heap;
    size_t n_heap, heap_cap;
} bpe_ctx;

static void bpe_try_pair(bpe_ctx *c, int32_t left, int32_t right)
{
    if (left < 0 || right < 0) return;
    const bpe_sym *l = &c->sym[left], *r = &c->sym[right];
    int64_t rank = merge_rank(c->t, c->enc + l->off, l->n, c->enc + r->off, r->n);
    if (rank < 0 || c->n_heap >= c->heap_cap) return;
    bpe_pair p = {rank, left, right, l->n + r->n};
    bheap_push(c->heap, &c->n_heap, p);
}

static void bpe_word(bpe_ctx *c, const uint8_t *w, size_t n, tok_out *o)
{
    const text_tokenizer *t = c->t;
    size_t enc_len = 0;
    for (size_t i = 0; i < n; i++) {
        c->sym[i].off = (uint32_t)enc_len;
        c->sym[i].n = (uint32_t)cp_utf8(bpe_byte_to_cp(w[i]), c->enc + enc_len);
        enc_len += c->sym[i].n;
        c->sym[i].prev = (int32_t)i - 1;
        c->sym[i].next = i + 1 == n ? -1 : (int32_t)i + 1;
    }
    if (t->info.ignore_merges) {
        int32_t id = tok_lookup(t, c->enc, enc_len);
        if (id != TEXT_TOKEN_NULL) {
            tok_emit(o, id);
            return;
        }
    }
    c->n_heap = 0;
    for (size_t i = 1; i < n; i++)
        bpe_try_pair(c, (int32_t)i - 1, (int32_t)i);
    while (c->n_heap) {
        bpe_pair p = bheap_pop(c->heap, &c->n_heap);
        bpe_sym *l = &c->sym[p.left], *r = &c->sym[p.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != p.size) continue; /* stale */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) c->sym[r->next].prev = p.left;
        bpe_try_pair(c, l->prev, p.left);
        bpe_try_pair(c, p.left, l->next);
    }
    for (int32_t i = 0; i != -1; i = c->sym[i].next) {
        const bpe_sym *s = &c->sym[i];
        int32_t id = tok_lookup(t, c->enc + s->off, s->n);
        if (id != TEXT_TOKEN_NULL) {
            tok_emit(o, id);
            continue;
        }
        /* not a token: one token per byte (character of the encoding);
         * llama.cpp drops bytes without a token, we use unk when defined */
        for (uint32_t k = 0; k < s->n;) {
            size_t cl = tok_utf8_len((uint8_t)c->enc[s->off + k]);
            if (cl > s->n - k) cl = s->n - k;
            int32_t b = tok_lookup(t, c->enc + s->off + k, cl);
            if (b == TEXT_TOKEN_NULL) b = t->info.unk;
            if (b != TEXT_TOKEN_NULL) tok_emit(o, b);
            k += (uint32_t)cl;
        }
    }
}

keel_status bpe_encode(const text_tokenizer *t, const char *text, size_t len, tok_out *o)
{
    keel_status st = KEEL_OK;
    if (len == 0) return KEEL_OK;
    if (len > UINT32_MAX / 4) return KEEL_EINVAL;
    span_vec a = {0}, b = {0};
    pcre2_match_data *md = pcre2_match_data_create(2, t->gctx);
    if (!md) return KEEL_ENOMEM;
    if ((st = span_push(&a, 0, len))) goto done;
    for (int r = 0; r < t->n_re; r++) {
        b.n = 0;
        if ((st = regex_split(t->re[r], md, text, &a, &b))) goto done;
        span_vec tmp = a;
        a = b;
        b = tmp;
    }
    size_t max_word = 0;
    for (size_t i = 0; i < a.n; i++)
        max_word = BASE_MAX(max_word, a.v[i].len);
    bpe_ctx c = {.t = t, .heap_cap = 3 * max_word + 1};
    c.enc = base_alloc(2 * max_word + 1);
    c.sym = base_alloc((max_word + 1) * sizeof *c.sym);
    c.heap = base_alloc(c.heap_cap * sizeof *c.heap);
    if (c.enc && c.sym && c.heap) {
        for (size_t i = 0; i < a.n; i++)
            bpe_word(&c, (const uint8_t *)text + a.v[i].off, a.v[i].len, o);
    } else {
        st = KEEL_ENOMEM;
    }
    base_free(c.enc, 2 * max_word + 1);
    base_free(c.sym, (max_word + 1) * sizeof *c.sym);
    base_free(c.heap, c.heap_cap * sizeof *c.heap);
done:
    base_free(a.v, a.cap * sizeof *a.v);
    base_free(b.v, b.cap * sizeof *b.v);
    pcre2_match_data_free(md);
    return st;
}
