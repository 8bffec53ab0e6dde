/*
 * model_api.c — the public keel_model: opening GGUF files and llama2.c
 * checkpoints, model info, tokenizer and sampler wrappers.
 */
#include "engine.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

keel_model_params keel_model_params_default(void)
{
    keel_model_params p = {NULL, NULL, KEEL_LOAD_AUTO};
    return p;
}

keel_status keel_load_from_name(const char *name, keel_load *out)
{
    if (!name || !out) return KEEL_EINVAL;
    for (int l = KEEL_LOAD_AUTO; l <= KEEL_LOAD_READ; l++)
        if (strcmp(name, keel_load_name((keel_load)l)) == 0) {
            *out = (keel_load)l;
            return KEEL_OK;
        }
    return KEEL_EINVAL;
}

const char *keel_load_name(keel_load load)
{
    switch (load) {
    case KEEL_LOAD_AUTO:
        return "auto";
    case KEEL_LOAD_MMAP:
        return "mmap";
    case KEEL_LOAD_READ:
        return "read";
    }
    return "?";
}

bool engine_load_reads(const char *thp_enabled, unsigned long long mem_avail_kib, size_t bytes)
{
    bool thp = thp_enabled && (strstr(thp_enabled, "[always]") || strstr(thp_enabled, "[madvise]"));
    return thp && mem_avail_kib > 0 && (unsigned long long)bytes / 1024 <= mem_avail_kib / 4;
}

/* engine_load_reads with this system's values (Linux: the selected mode in
 * /sys/kernel/mm/transparent_hugepage/enabled, MemAvailable of
 * /proc/meminfo); anything unreadable means map. */
static bool auto_read(size_t bytes)
{
#ifdef __linux__
    char thp[256] = "", line[256];
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (f) {
        if (!fgets(thp, sizeof thp, f)) thp[0] = '\0';
        fclose(f);
    }
    unsigned long long avail_kib = 0;
    f = fopen("/proc/meminfo", "r");
    if (f) {
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %llu kB", &avail_kib) == 1) break;
        fclose(f);
    }
    return engine_load_reads(thp, avail_kib, bytes);
#else
    (void)bytes;
    return false;
#endif
}

static keel_status file_size(const char *path, size_t *bytes)
{
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size < 0) return KEEL_EIO;
    *bytes = (size_t)sb.st_size;
    return KEEL_OK;
}

keel_status keel_model_open(const keel_model_params *p, keel_model **out, char *err)
{
    if (!out) return KEEL_EINVAL;
    *out = NULL;
    if (!p || !p->path) return base_err(err, KEEL_EINVAL, "model path is NULL");
    keel_model *m = base_calloc(1, sizeof *m);
    if (!m) return base_err(err, KEEL_ENOMEM, "out of memory");
    if (p->load != KEEL_LOAD_AUTO && p->load != KEEL_LOAD_MMAP && p->load != KEEL_LOAD_READ) {
        base_free(m, sizeof *m);
        return base_err(err, KEEL_EINVAL, "load must be KEEL_LOAD_AUTO, KEEL_LOAD_MMAP or KEEL_LOAD_READ");
    }
    bool read = p->load == KEEL_LOAD_READ;
    size_t bytes;
    if (p->load == KEEL_LOAD_AUTO && file_size(p->path, &bytes) == KEEL_OK) read = auto_read(bytes);
    keel_status st = model_open_file(p->path, p->tokenizer_path, read, &m->g, err);
    if (st != KEEL_OK) {
        base_free(m, sizeof *m);
        return st;
    }
    st = model_load(m->g, &m->w, err);
    if (st == KEEL_OK) st = text_tokenizer_open(m->g, &m->tok, err);
    if (st == KEEL_OK) {
        const text_tokenizer_info *ti = text_tokenizer_get_info(m->tok);
        if (ti->n_vocab != m->w.hp.n_vocab)
            st = base_err(err, KEEL_EFORMAT, "tokenizer has %d tokens, the model %d", ti->n_vocab,
                          m->w.hp.n_vocab);
    }
    if (st != KEEL_OK) {
        keel_model_close(m);
        return st;
    }
    m->file_bytes = gguf_size(m->g);
    m->weights_read = !gguf_mapped(m->g);
    const char *nm;
    size_t nn;
    if (gguf_find_key(m->g, "general.name") >= 0 && gguf_get_str(m->g, "general.name", &nm, &nn, NULL) == KEEL_OK)
        snprintf(m->name, sizeof m->name, "%.*s", (int)BASE_MIN(nn, sizeof m->name - 1), nm);
    *out = m;
    return KEEL_OK;
}

void keel_model_close(keel_model *m)
{
    if (!m) return;
    text_tokenizer_close(m->tok);
    model_free(&m->w);
    gguf_close(m->g);
    base_free(m, sizeof *m);
}

void keel_model_info_get(const keel_model *m, keel_model_info *o)
{
    memset(o, 0, sizeof *o);
    if (!m) return;
    const model_hp *hp = &m->w.hp;
    const text_tokenizer_info *ti = text_tokenizer_get_info(m->tok);
    o->arch = hp->arch_name;
    o->name = m->name;
    o->n_vocab = hp->n_vocab;
    o->n_ctx_train = hp->n_ctx_train;
    o->n_embd = hp->n_embd;
    o->n_layer = hp->n_layer;
    o->n_head = hp->n_head;
    o->n_head_kv = hp->n_head_kv;
    o->head_dim_k = hp->hd_k;
    o->head_dim_v = hp->hd_v;
    o->n_ff = hp->n_ff;
    o->n_swa = hp->n_swa;
    for (int32_t i = 0; i < hp->n_layer; i++) o->n_swa_layers += m->w.layers[i].swa;
    o->rope = hp->rope;
    o->norm_eps = hp->norm_eps;
    o->attn_softcap = hp->attn_softcap;
    o->final_softcap = hp->final_softcap;
    o->dtype = m->w.main_dtype;
    o->n_params = m->w.n_params;
    o->weight_bytes = m->w.weight_bytes;
    o->bos = ti->bos;
    o->eos = ti->eos;
    o->add_bos = ti->add_bos;
    o->tokenizer = ti->type == TEXT_VOCAB_SPM ? "spm" : "bpe";
    o->n_recurrent_layers = hp->n_recurrent;
    if (hp->n_recurrent > 0) {
        o->ssm_d_state = hp->ssm_d_state;
        o->ssm_d_inner = hp->ssm_d_inner;
        o->ssm_conv_kernel = hp->ssm_conv_kernel;
        o->ssm_n_group = hp->ssm_n_group;
    }
    if (hp->n_expert > 0) {
        o->n_expert = hp->n_expert;
        o->n_expert_used = hp->n_expert_used;
        o->n_ff_expert = hp->n_ff_exp;
        o->n_ff_shared_expert = hp->n_ff_shexp;
        o->n_expert_groups = hp->n_expert_groups;
        o->n_group_used = hp->n_group_used;
        o->expert_sigmoid = hp->router == MODEL_ROUTER_SIGMOID;
    }
    o->attn_scale = hp->attn_scale;
    o->weights_read = m->weights_read;
    o->q_lora_rank = hp->q_lora;
    o->kv_lora_rank = hp->kv_lora;
    if (hp->idx_top_k > 0) {
        o->indexer_heads = hp->idx_heads;
        o->indexer_dim = hp->idx_dim;
        o->indexer_top_k = hp->idx_top_k;
    }
}

/* Tensor names come from the file: bytes outside printable ASCII (control
 * characters could drive a terminal) and backslashes become \xHH. */
static void escape_name(const char *s, size_t n, char *out, size_t cap)
{
    size_t k = 0;
    for (size_t i = 0; i < n && k + 5 <= cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7f && c != '\\')
            out[k++] = (char)c;
        else
            k += (size_t)snprintf(out + k, cap - k, "\\x%02x", c);
    }
    out[k] = 0;
}

keel_status keel_model_tensors(const keel_model *m, keel_write_fn out, void *user)
{
    if (!m || !out) return KEEL_EINVAL;
    char line[1024], name[4 * 200 + 8];
    int n = snprintf(line, sizeof line, "%-40s %-6s %-28s %12s\n", "tensor", "dtype", "shape", "bytes");
    out(user, line, (size_t)n);
    for (int64_t i = 0; i < gguf_n_tensors(m->g); i++) {
        const gguf_tensor *t = gguf_tensor_at(m->g, i);
        char shape[96];
        int k = snprintf(shape, sizeof shape, "[%lld", (long long)t->ne[0]);
        for (uint32_t d = 1; d < t->n_dims && k < (int)sizeof shape; d++)
            k += snprintf(shape + k, sizeof shape - (size_t)k, ", %lld", (long long)t->ne[d]);
        if (k < (int)sizeof shape) snprintf(shape + k, sizeof shape - (size_t)k, "]");
        const char *dn = keel_dtype_name(t->dtype);
        escape_name(t->name, BASE_MIN(t->name_len, (size_t)200), name, sizeof name);
        n = snprintf(line, sizeof line, "%-40s %-6s %-28s %12zu\n", name, dn ? dn : "?", shape, t->nbytes);
        out(user, line, (size_t)BASE_MIN((size_t)n, sizeof line - 1));
    }
    return KEEL_OK;
}

keel_status keel_tokenize(const keel_model *m, const char *text, size_t len, bool add_special,
                          bool parse_special, int32_t *ids, int32_t cap, int32_t *n_out)
{
    if (!m || (!text && len) || !n_out || cap < 0) return KEEL_EINVAL;
    int64_t n = 0;
    keel_status st = text_tokenize(m->tok, text ? text : "", len, add_special, parse_special, ids, cap, &n, NULL);
    if (n > INT32_MAX) return KEEL_ERANGE;
    *n_out = (int32_t)n;
    return st;
}

keel_status keel_detokenize(const keel_model *m, const int32_t *ids, int32_t n, char *buf,
                            size_t cap, size_t *n_out)
{
    if (!m || (!ids && n) || n < 0 || !n_out) return KEEL_EINVAL;
    return text_detokenize(m->tok, ids, n, 0, buf, cap, n_out, NULL);
}

keel_status keel_token_piece(const keel_model *m, int32_t id, char *buf, size_t cap, size_t *n_out)
{
    if (!m || !n_out) return KEEL_EINVAL;
    return text_token_to_piece(m->tok, id, true, buf, cap, n_out);
}

bool keel_token_is_eog(const keel_model *m, int32_t id)
{
    return m && text_token_is_eog(m->tok, id);
}

_Static_assert(sizeof(text_stream) <= sizeof(keel_detok_stream), "keel_detok_stream too small");

void keel_detok_stream_init(keel_detok_stream *s, const keel_model *m)
{
    memset(s, 0, sizeof *s);
    text_stream_init((text_stream *)(void *)s, m->tok, 0);
}

keel_status keel_detok_stream_init_after(keel_detok_stream *s, const keel_model *m,
                                         const int32_t *prev, int32_t n_prev)
{
    if (!s || !m) return KEEL_EINVAL;
    memset(s, 0, sizeof *s);
    return text_stream_init_after((text_stream *)(void *)s, m->tok, 0, prev, n_prev);
}

keel_status keel_detok_stream_push(keel_detok_stream *s, int32_t id, char *buf, size_t cap,
                                   size_t *n_out)
{
    return text_stream_push((text_stream *)(void *)s, id, buf, cap, n_out);
}

keel_status keel_detok_stream_flush(keel_detok_stream *s, char *buf, size_t cap, size_t *n_out)
{
    return text_stream_flush((text_stream *)(void *)s, buf, cap, n_out);
}

/* ---- sampling ------------------------------------------------------------ */

keel_sampler_params keel_sampler_params_default(void)
{
    sampler_params d = sampler_params_default();
    keel_sampler_params p;
    p.temp = d.temperature;
    p.top_k = d.top_k;
    p.top_p = d.top_p;
    p.min_p = d.min_p;
    p.repeat_penalty = d.repeat_penalty;
    p.repeat_last_n = d.penalty_last_n;
    p.presence_penalty = d.presence_penalty;
    p.frequency_penalty = d.frequency_penalty;
    p.seed = d.seed;
    return p;
}

keel_status keel_sampler_params_check(const keel_sampler_params *p, char *err)
{
    if (!p) return base_err(err, KEEL_EINVAL, "sampler params is NULL");
    const struct {
        const char *name, *note;
        float v;
    } f[] = {
        {"temp", " (<= 0: greedy)", p->temp},
        {"top_p", " (>= 1: off)", p->top_p},
        {"min_p", " (<= 0: off)", p->min_p},
        {"repeat_penalty", " (1: off)", p->repeat_penalty},
        {"presence_penalty", " (0: off)", p->presence_penalty},
        {"frequency_penalty", " (0: off)", p->frequency_penalty},
    };
    for (size_t i = 0; i < BASE_ARRAY_LEN(f); i++)
        if (!isfinite(f[i].v))
            return base_err(err, KEEL_EINVAL, "%s %g: must be finite%s", f[i].name, (double)f[i].v,
                            f[i].note);
    if (!(p->repeat_penalty > 0))
        return base_err(err, KEEL_EINVAL, "repeat_penalty %g: must be > 0 (1: off)",
                        (double)p->repeat_penalty);
    if (p->repeat_last_n < 0)
        return base_err(err, KEEL_EINVAL, "repeat_last_n %d: must be >= 0 (0: off)", p->repeat_last_n);
    return KEEL_OK;
}

keel_status keel_sampler_open(const keel_sampler_params *p, int32_t n_vocab, keel_sampler **out)
{
    if (!p || !out) return KEEL_EINVAL;
    *out = NULL;
    keel_status st = keel_sampler_params_check(p, NULL);
    if (st != KEEL_OK) return st;
    sampler_params d = sampler_params_default();
    d.temperature = p->temp;
    d.top_k = p->top_k;
    d.top_p = p->top_p;
    d.min_p = p->min_p;
    d.repeat_penalty = p->repeat_penalty;
    d.penalty_last_n = p->repeat_last_n;
    d.presence_penalty = p->presence_penalty;
    d.frequency_penalty = p->frequency_penalty;
    d.seed = p->seed;
    sampler *s = NULL;
    st = sampler_open(&d, n_vocab, &s, NULL);
    *out = (keel_sampler *)s;
    return st;
}

void keel_sampler_close(keel_sampler *s)
{
    sampler_close((sampler *)s);
}

keel_status keel_sampler_sample(keel_sampler *s, const float *logits, int32_t *token)
{
    if (!s || !logits || !token) return KEEL_EINVAL;
    return sampler_sample((sampler *)s, logits, token);
}

keel_status keel_sampler_sample_draft(keel_sampler *s, const float *logits, int32_t draft, int32_t *token)
{
    if (!s || !logits || !token) return KEEL_EINVAL;
    return sampler_sample_draft((sampler *)s, logits, draft, token);
}

keel_status keel_sampler_accept(keel_sampler *s, int32_t token)
{
    if (!s) return KEEL_EINVAL;
    return sampler_accept((sampler *)s, token);
}

void keel_sampler_reset(keel_sampler *s)
{
    if (s) sampler_reset((sampler *)s);
}

uint64_t keel_model_fingerprint(const keel_model *m)
{
    if (!m) return 0;
    const model_hp *hp = &m->w.hp;
    uint64_t h = base_hash64(hp->arch_name, strlen(hp->arch_name), 0x666970);
    int32_t dims[10] = {hp->n_vocab, hp->n_ctx_train, hp->n_embd, hp->n_layer, hp->n_head, hp->n_head_kv,
                        hp->hd_k, hp->hd_v, hp->n_ff, hp->n_swa};
    h = base_hash64(dims, sizeof dims, h);
    float fl[6] = {hp->norm_eps, hp->rope.freq_base, hp->rope.freq_scale, hp->attn_softcap, hp->final_softcap,
                   hp->attn_scale};
    h = base_hash64(fl, sizeof fl, h);
    for (int64_t i = 0; i < gguf_n_tensors(m->g); i++) {
        const gguf_tensor *t = gguf_tensor_at(m->g, i);
        h = base_hash64(t->name, t->name_len, h);
        int64_t meta[3 + GGUF_MAX_DIMS] = {(int64_t)t->dtype, (int64_t)t->n_dims, (int64_t)t->offset};
        for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) meta[3 + d] = t->ne[d];
        h = base_hash64(meta, sizeof meta, h);
    }
    uint64_t size = m->file_bytes;
    h = base_hash64(&size, sizeof size, h);
    return h ? h : 1; /* 0 means "no fingerprint" to keel_mem_load */
}
