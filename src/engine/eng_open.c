/*
 * eng_open.c — the public keel_engine: options, open and close, the
 * template and tool-call format, the synchronous keel_complete, the queue
 * entry points (submit, run, stop, cancel), stats and reset.
 *
 * Everything a step needs is allocated here, once: per slot the history
 * and prompt buffers (max_prompt_tokens tokens each, plus one scratch
 * prompt), the batch arrays; per request only what its size implies
 * (messages, the rendered prompt, the parser's output, a sampler).
 */
#include "eng.h"

#include <stdio.h>
#include <string.h>

/* ---- options ------------------------------------------------------------- */

typedef struct eng_open_opts {
    const char *model, *tokenizer, *chat_template, *tool_format;
    keel_context_params cp;
    int32_t n_slots, max_prompt_tokens, cache_ram_mib;
    double prefill_share;
    json_t *compact; /* borrowed */
    keel_spec_params spec;
    const char *model_draft;
    /* the shared prompt-cache tier (docs/cache-tier.md) */
    const char *cache_redis;
    int32_t redis_ttl, redis_max_mib, redis_timeout_ms, redis_chunk;
    keel_load load;
} eng_open_opts;

static keel_status get_i32(json_t *v, const char *k, int32_t lo, int32_t hi, int32_t *out, char *err)
{
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return base_err(err, KEEL_EINVAL, "option %s must be an integer in [%d, %d]", k, lo, hi);
    *out = (int32_t)json_integer_value(v);
    return KEEL_OK;
}

static keel_status get_str(json_t *v, const char *k, const char **out, char *err)
{
    if (!json_is_string(v)) return base_err(err, KEEL_EINVAL, "option %s must be a string", k);
    *out = json_string_value(v);
    return KEEL_OK;
}

static keel_status parse_open(json_t *o, eng_open_opts *p, char *err)
{
    memset(p, 0, sizeof *p);
    p->cp = keel_context_params_default();
    p->n_slots = 1;
    p->prefill_share = ENG_PREFILL_SHARE;
    p->spec = keel_spec_params_default();
    p->redis_ttl = ENG_REDIS_TTL;
    p->redis_max_mib = ENG_REDIS_MAX_MIB;
    p->redis_timeout_ms = ENG_REDIS_TIMEOUT_MS;
    p->redis_chunk = ENG_REDIS_CHUNK;
    if (!json_is_object(o)) return base_err(err, KEEL_EINVAL, "options must be a JSON object");
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        keel_status st = KEEL_OK;
        if (strcmp(k, "model") == 0) st = get_str(v, k, &p->model, err);
        else if (strcmp(k, "tokenizer") == 0) st = get_str(v, k, &p->tokenizer, err);
        else if (strcmp(k, "load") == 0) {
            const char *name = NULL;
            if ((st = get_str(v, k, &name, err)) == KEEL_OK && keel_load_from_name(name, &p->load) != KEEL_OK)
                st = base_err(err, KEEL_EINVAL, "option load: '%s' (need auto, mmap or read)", name);
        }
        else if (strcmp(k, "chat_template") == 0) st = get_str(v, k, &p->chat_template, err);
        else if (strcmp(k, "tool_format") == 0) st = get_str(v, k, &p->tool_format, err);
        else if (strcmp(k, "n_ctx") == 0) st = get_i32(v, k, 0, 1 << 26, &p->cp.n_ctx, err);
        else if (strcmp(k, "n_slots") == 0 || strcmp(k, "parallel") == 0) st = get_i32(v, k, 1, ENG_MAX_SLOTS, &p->n_slots, err);
        else if (strcmp(k, "n_batch") == 0) st = get_i32(v, k, 1, 1 << 20, &p->cp.n_batch, err);
        else if (strcmp(k, "n_ubatch") == 0) st = get_i32(v, k, 1, 1 << 20, &p->cp.n_ubatch, err);
        else if (strcmp(k, "n_threads") == 0) st = get_i32(v, k, 0, 256, &p->cp.n_threads, err);
        else if (strcmp(k, "rot_k") == 0) st = get_i32(v, k, -1, 1, &p->cp.rot_k, err);
        else if (strcmp(k, "rot_v") == 0) st = get_i32(v, k, -1, 1, &p->cp.rot_v, err);
        else if (strcmp(k, "swa_window") == 0) st = get_i32(v, k, 0, 1 << 26, &p->cp.swa_window, err);
        else if (strcmp(k, "swa_period") == 0) st = get_i32(v, k, 1, 1 << 16, &p->cp.swa_period, err);
        else if (strcmp(k, "swa_sinks") == 0) st = get_i32(v, k, 0, 1 << 16, &p->cp.n_sink, err);
        else if (strcmp(k, "max_prompt_tokens") == 0) st = get_i32(v, k, 1, 1 << 26, &p->max_prompt_tokens, err);
        else if (strcmp(k, "cache_ram_mib") == 0) st = get_i32(v, k, 0, 1 << 24, &p->cache_ram_mib, err);
        else if (strcmp(k, "cache_redis") == 0) st = get_str(v, k, &p->cache_redis, err);
        else if (strcmp(k, "cache_redis_ttl") == 0) st = get_i32(v, k, 1, 1 << 30, &p->redis_ttl, err);
        else if (strcmp(k, "cache_redis_max_mib") == 0) st = get_i32(v, k, 1, 1 << 20, &p->redis_max_mib, err);
        else if (strcmp(k, "cache_redis_timeout_ms") == 0) st = get_i32(v, k, 1, 600000, &p->redis_timeout_ms, err);
        else if (strcmp(k, "cache_redis_chunk") == 0) st = get_i32(v, k, 16, 1 << 16, &p->redis_chunk, err);
        else if (strcmp(k, "ctx_checkpoints") == 0) st = get_i32(v, k, -1, 4096, &p->cp.n_ctx_checkpoints, err);
        else if (strcmp(k, "checkpoint_every") == 0) st = get_i32(v, k, 0, 1 << 26, &p->cp.checkpoint_every, err);
        else if (strcmp(k, "prefill_share") == 0) {
            if (!json_is_number(v) || !(json_number_value(v) > 0.0) || json_number_value(v) > 1.0)
                st = base_err(err, KEEL_EINVAL, "option prefill_share must be a number in (0, 1]");
            else
                p->prefill_share = json_number_value(v);
        }
        else if (strcmp(k, "deterministic") == 0) {
            if (!json_is_boolean(v))
                st = base_err(err, KEEL_EINVAL, "option deterministic must be a boolean");
            else
                p->cp.deterministic = json_is_true(v);
        }
        else if (strcmp(k, "type_k") == 0 || strcmp(k, "type_v") == 0) {
            const char *name = NULL;
            if ((st = get_str(v, k, &name, err)) == KEEL_OK &&
                keel_dtype_from_name(name, k[5] == 'k' ? &p->cp.type_k : &p->cp.type_v) != KEEL_OK)
                st = base_err(err, KEEL_EINVAL, "option %s: unknown type '%s'", k, name);
        } else if (strcmp(k, "kv_compact") == 0) {
            p->compact = v;
        } else if (strcmp(k, "spec") == 0) {
            const char *name = NULL;
            if ((st = get_str(v, k, &name, err)) != KEEL_OK) {
            } else if (strcmp(name, "ngram") == 0) {
                p->spec.kind = KEEL_SPEC_NGRAM;
            } else if (strcmp(name, "draft") == 0) {
                p->spec.kind = KEEL_SPEC_DRAFT;
            } else if (strcmp(name, "none") == 0) {
                p->spec.kind = KEEL_SPEC_NONE;
            } else {
                st = base_err(err, KEEL_EINVAL, "option spec: '%s' (need ngram, draft or none)", name);
            }
        } else if (strcmp(k, "spec_max") == 0) {
            st = get_i32(v, k, 1, KEEL_SPEC_MAX_DRAFT, &p->spec.max_draft, err);
        } else if (strcmp(k, "spec_min_n") == 0) {
            st = get_i32(v, k, 1, 64, &p->spec.min_n, err);
        } else if (strcmp(k, "spec_max_n") == 0) {
            st = get_i32(v, k, 1, 64, &p->spec.max_n, err);
        } else if (strcmp(k, "spec_adaptive") == 0) {
            if (!json_is_boolean(v)) st = base_err(err, KEEL_EINVAL, "option spec_adaptive must be a boolean");
            else p->spec.adaptive = json_is_true(v);
        } else if (strcmp(k, "model_draft") == 0) {
            st = get_str(v, k, &p->model_draft, err);
        } else {
            st = base_err(err, KEEL_EINVAL, "unknown option '%s'", k);
        }
        if (st != KEEL_OK) return st;
    }
    if (!p->model) return base_err(err, KEEL_EINVAL, "option model (a GGUF path) is required");
    if (p->model_draft && p->spec.kind == KEEL_SPEC_NONE) p->spec.kind = KEEL_SPEC_DRAFT;
    if (p->spec.kind == KEEL_SPEC_DRAFT && !p->model_draft)
        return base_err(err, KEEL_EINVAL, "option spec \"draft\" needs model_draft (a GGUF path)");
    return KEEL_OK;
}

/* ---- the template -------------------------------------------------------- */

static keel_status open_template(keel_engine *e, const char *spec, char *err)
{
    const char *src = NULL;
    size_t len = 0;
    char *file = NULL;
    size_t file_bytes = 0;
    if (!spec) {
        if (keel_model_chat_template(e->model, &src, &len) == KEEL_OK) {
            e->template_name = "model";
        } else {
            keel_status st = keel_chat_template_builtin("chatml", &src);
            if (st != KEEL_OK) return base_err(err, st, "built-in chatml template missing");
            len = strlen(src);
            e->template_name = "chatml";
        }
    } else if (keel_chat_template_builtin(spec, &src) == KEEL_OK) {
        len = strlen(src);
        /* the static name: spec points into the options JSON, freed after open */
        e->template_name = "builtin";
        for (const char *const *n = keel_chat_template_builtin_names(); *n; n++)
            if (strcmp(*n, spec) == 0) e->template_name = *n;
    } else if (strstr(spec, "{%") || strstr(spec, "{{")) {
        src = spec;
        len = strlen(spec);
        e->template_name = "inline";
    } else {
        FILE *f = fopen(spec, "rb");
        if (!f)
            return base_err(err, KEEL_EINVAL,
                            "chat_template '%s' is not a built-in name (chatml, llama3, gemma, mistral, qwen3), "
                            "template source or a readable file",
                            spec);
        size_t cap = 1 << 16;
        file = base_alloc(cap);
        while (file) {
            size_t r = fread(file + file_bytes, 1, cap - file_bytes, f);
            file_bytes += r;
            if (r == 0) break;
            if (file_bytes == cap) {
                if (cap >= (1u << 24)) break; /* 16 MiB: far beyond any template */
                char *g = base_realloc(file, cap, cap * 2);
                if (!g) {
                    base_free(file, cap);
                    file = NULL;
                    break;
                }
                file = g;
                cap *= 2;
            }
        }
        bool bad = ferror(f) != 0;
        fclose(f);
        if (!file) return base_err(err, KEEL_ENOMEM, "chat_template %s: out of memory", spec);
        if (bad) {
            base_free(file, cap);
            return base_err(err, KEEL_EIO, "chat_template %s: read error", spec);
        }
        src = file;
        len = file_bytes;
        e->template_name = "file";
        char jerr[JINJA_ERR_CAP];
        keel_status st = jinja_open(src, len, &e->tmpl, jerr);
        /* the format comes from the source wherever it was read from */
        e->tool_format = toolcall_detect(src, len);
        base_free(file, cap);
        if (st != KEEL_OK) return base_err(err, st, "chat_template %s: %s", spec, jerr);
        return KEEL_OK;
    }
    char jerr[JINJA_ERR_CAP];
    keel_status st = jinja_open(src, len, &e->tmpl, jerr);
    if (st != KEEL_OK) return base_err(err, st, "chat template (%s): %s", e->template_name, jerr);
    e->tool_format = toolcall_detect(src, len);
    return KEEL_OK;
}

static char *token_text_dup(const keel_model *m, int32_t id)
{
    size_t len = 0;
    const char *t = id >= 0 ? text_token_text(m->tok, id, &len) : NULL;
    char *s = base_alloc(len + 1);
    if (!s) return NULL;
    if (t) memcpy(s, t, len);
    s[len] = 0;
    return s;
}

/* ---- open / close ----------------------------------------------------------- */

keel_status keel_engine_open(const char *options_json, keel_engine **out, char *err)
{
    if (!out) return KEEL_EINVAL;
    *out = NULL;
    if (!options_json) return base_err(err, KEEL_EINVAL, "options are NULL");
    json_error_t je;
    json_t *o = json_loads(options_json, JSON_REJECT_DUPLICATES, &je);
    if (!o) return base_err(err, KEEL_EINVAL, "options: invalid JSON at line %d: %s", je.line, je.text);
    eng_open_opts p;
    keel_status st = parse_open(o, &p, err);
    keel_engine *e = NULL;
    if (st != KEEL_OK) goto fail;
    e = base_calloc(1, sizeof *e);
    if (!e) {
        st = base_err(err, KEEL_ENOMEM, "out of memory");
        goto fail;
    }
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    e->next_id = 1;
    e->max_queue = 1024;
    e->pf_share = p.prefill_share;
    keel_model_params mp = keel_model_params_default();
    mp.path = p.model;
    mp.tokenizer_path = p.tokenizer;
    mp.load = p.load;
    char merr[256] = "";
    if ((st = keel_model_open(&mp, &e->model, merr)) != KEEL_OK) {
        base_err(err, st, "model %s: %s", p.model, merr);
        goto fail;
    }
    keel_model_info mi;
    keel_model_info_get(e->model, &mi);
    e->n_slots = p.n_slots;
    e->cp = p.cp;
    e->cp.n_seq_max = p.n_slots;
    e->cp.n_outputs = p.n_slots;
    e->cp.unified = true;
    if (p.spec.kind != KEEL_SPEC_NONE) {
        /* every slot verifies its newest token and drafts: a logit row each */
        e->cp.speculative = true;
        e->cp.n_outputs = (int32_t)BASE_MIN((int64_t)p.n_slots * (p.spec.max_draft + 1), (int64_t)e->cp.n_batch);
        e->cp.n_outputs = BASE_MAX(e->cp.n_outputs, p.n_slots);
    }
    if (e->cp.n_ctx == 0) e->cp.n_ctx = BASE_MIN(mi.n_ctx_train, 4096) * p.n_slots;
    e->n_ctx_slot = BASE_MAX(1, e->cp.n_ctx / p.n_slots);
    if (e->cp.n_outputs > e->cp.n_batch) {
        st = base_err(err, KEEL_EINVAL, "n_batch %d is smaller than n_slots %d", e->cp.n_batch, p.n_slots);
        goto fail;
    }
    e->compact_default = keel_compact_params_default();
    if (p.compact) {
        eng_opts tmp;
        eng_opts_init(e, &tmp);
        json_t *wrap = json_pack("{sO}", "kv_compact", p.compact);
        st = wrap ? eng_opts_parse(e, wrap, false, &tmp, err) : KEEL_ENOMEM;
        if (wrap) json_decref(wrap);
        e->compact_default = tmp.compact;
        eng_opts_free(&tmp);
        if (st != KEEL_OK) goto fail;
    }
    e->cp.compact = e->compact_default;
    e->hist_cap = p.max_prompt_tokens ? p.max_prompt_tokens : 4 * e->n_ctx_slot;
    e->pc_limit = (size_t)p.cache_ram_mib << 20;
    e->fingerprint = keel_model_fingerprint(e->model);
    char cerr[256] = "";
    if ((st = keel_context_open(e->model, &e->cp, &e->ctx, cerr)) != KEEL_OK) {
        base_err(err, st, "context: %s", cerr);
        goto fail;
    }
    e->recurrent = keel_mem_is_recurrent(keel_context_memory(e->ctx));
    if (p.cache_redis && (st = eng_remote_open(e, p.cache_redis, p.redis_ttl, (size_t)p.redis_max_mib << 20,
                                               p.redis_timeout_ms, p.redis_chunk, err)) != KEEL_OK)
        goto fail;
    if (p.spec.kind != KEEL_SPEC_NONE) {
        if (p.model_draft) {
            mp = keel_model_params_default();
            mp.path = p.model_draft;
            mp.load = p.load;
            if ((st = keel_model_open(&mp, &e->draft_model, merr)) != KEEL_OK) {
                base_err(err, st, "model_draft %s: %s", p.model_draft, merr);
                goto fail;
            }
        }
        keel_context_params dcp = e->cp;
        dcp.speculative = false;
        dcp.compact.policy = KEEL_COMPACT_NONE;
        dcp.n_ctx_checkpoints = 0;
        dcp.n_outputs = p.n_slots;
        if ((st = keel_spec_open(&p.spec, e->model, e->draft_model, &dcp, p.n_slots, e->hist_cap + 1, &e->spec,
                                 cerr)) != KEEL_OK) {
            base_err(err, st, "%s", cerr);
            goto fail;
        }
    }
    /* slots (+ one scratch prompt buffer) and the batch */
    e->slots = base_calloc((size_t)p.n_slots + 1, sizeof(eng_slot));
    if (!e->slots) {
        st = base_err(err, KEEL_ENOMEM, "out of memory");
        goto fail;
    }
    for (int32_t i = 0; i <= p.n_slots; i++) {
        eng_slot *sl = &e->slots[i];
        sl->seq = i;
        sl->compact = e->compact_default;
        sl->hist = i < p.n_slots ? base_alloc((size_t)e->hist_cap * sizeof(int32_t)) : NULL;
        sl->prompt = base_alloc((size_t)e->hist_cap * sizeof(int32_t));
        if ((i < p.n_slots && !sl->hist) || !sl->prompt) {
            st = base_err(err, KEEL_ENOMEM, "slot buffers: out of memory");
            goto fail;
        }
    }
    size_t nb = (size_t)e->cp.n_batch;
    e->batch_tok = base_alloc(nb * sizeof(int32_t));
    e->batch_seq = base_alloc(nb * sizeof(int32_t));
    e->batch_slot = base_alloc(nb * sizeof(int32_t));
    e->batch_logits = base_alloc(nb);
    e->batch_row = base_alloc(nb * sizeof(int32_t));
    if (!e->batch_tok || !e->batch_seq || !e->batch_slot || !e->batch_logits || !e->batch_row) {
        st = base_err(err, KEEL_ENOMEM, "batch: out of memory");
        goto fail;
    }
    /* chat */
    if ((st = open_template(e, p.chat_template, err)) != KEEL_OK) goto fail;
    if (p.tool_format && toolcall_format_from_name(p.tool_format, &e->tool_format) != KEEL_OK) {
        st = base_err(err, KEEL_EINVAL, "tool_format '%s' unknown (%s)", p.tool_format, toolcall_format_names());
        goto fail;
    }
    for (int pass = 0; pass < 2; pass++) {
        int32_t k = 0;
        for (int32_t id = 0; id < mi.n_vocab; id++)
            if (keel_token_is_eog(e->model, id)) {
                if (pass) e->eog_ids[k] = id;
                k++;
            }
        if (pass == 0) {
            e->n_eog = k;
            e->eog_ids = base_alloc((size_t)(k ? k : 1) * sizeof(int32_t));
            if (!e->eog_ids) {
                st = base_err(err, KEEL_ENOMEM, "out of memory");
                goto fail;
            }
        }
    }
    e->bos_text = token_text_dup(e->model, mi.bos);
    e->eos_text = token_text_dup(e->model, mi.eos);
    if (!e->bos_text || !e->eos_text) {
        st = base_err(err, KEEL_ENOMEM, "out of memory");
        goto fail;
    }
    json_decref(o);
    *out = e;
    return KEEL_OK;
fail:
    json_decref(o);
    keel_engine_close(e);
    return st;
}

/* Stops the engine's users before freeing it: a loop returns, a
 * keel_complete or slot action on another thread ends (its request
 * cancelled), and every public call in progress leaves. The mutex exists
 * whenever e does (initialized right after the calloc). */
void keel_engine_close(keel_engine *e)
{
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    e->closing = true;
    e->stop = true;
    for (eng_req *r = e->live_head; r; r = r->live_next) atomic_store(&r->cancel, 1);
    eng_cut_locked(e);
    pthread_cond_broadcast(&e->cv);
    while (e->running || e->driving || e->n_inside > 0) pthread_cond_wait(&e->cv, &e->mu);
    pthread_mutex_unlock(&e->mu);
    if (e->ctx) eng_finish_all(e, "cancelled");
    eng_reap(e); /* submitted requests that ended since the last step (nobody steps now) */
    eng_pc_free(e);
    eng_remote_close(e);
    if (e->slots)
        for (int32_t i = 0; i <= e->n_slots; i++) {
            base_free(e->slots[i].hist, (size_t)e->hist_cap * sizeof(int32_t));
            base_free(e->slots[i].prompt, (size_t)e->hist_cap * sizeof(int32_t));
        }
    base_free(e->slots, ((size_t)e->n_slots + 1) * sizeof(eng_slot));
    size_t nb = (size_t)e->cp.n_batch;
    base_free(e->batch_tok, nb * sizeof(int32_t));
    base_free(e->batch_seq, nb * sizeof(int32_t));
    base_free(e->batch_slot, nb * sizeof(int32_t));
    base_free(e->batch_row, nb * sizeof(int32_t));
    base_free(e->batch_logits, nb);
    jinja_close(e->tmpl);
    base_free(e->eog_ids, (size_t)(e->n_eog ? e->n_eog : 1) * sizeof(int32_t));
    for (int i = 0; i < ENG_GRAMMAR_PARK; i++) eng_gpark_free(&e->gpark[i]);
    keel_grammar_vocab_close(e->gvocab);
    keel_grammar_vocab_close(e->gvocab_tool);
    if (e->bos_text) base_free(e->bos_text, strlen(e->bos_text) + 1);
    if (e->eos_text) base_free(e->eos_text, strlen(e->eos_text) + 1);
    base_free(e->last_response, e->last_response_len + 1);
    keel_spec_close(e->spec);
    keel_context_close(e->ctx);
    keel_model_close(e->draft_model);
    keel_model_close(e->model);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    base_free(e, sizeof *e);
}

const keel_model *keel_engine_model(const keel_engine *e)
{
    return e ? e->model : NULL;
}

/* One buffer per thread, tagged with the engine whose call wrote it: a
 * thread reads its own call's text whatever other threads do on e. */
static _Thread_local struct {
    const keel_engine *e;
    char text[BASE_ERR_CAP];
} tls_err;

char *eng_err(const keel_engine *e)
{
    if (tls_err.e != e) {
        tls_err.e = e;
        tls_err.text[0] = 0;
    }
    return tls_err.text;
}

const char *keel_engine_last_error(const keel_engine *e)
{
    if (!e) return "engine is NULL";
    return tls_err.e == e ? tls_err.text : "";
}

keel_status eng_enter(keel_engine *e)
{
    pthread_mutex_lock(&e->mu);
    bool closing = e->closing;
    if (!closing) e->n_inside++;
    pthread_mutex_unlock(&e->mu);
    return closing ? base_err(eng_err(e), KEEL_ECANCELED, "the engine is closing") : KEEL_OK;
}

void eng_leave(keel_engine *e)
{
    pthread_mutex_lock(&e->mu);
    e->n_inside--;
    if (e->closing) pthread_cond_broadcast(&e->cv); /* keel_engine_close waits for 0 */
    pthread_mutex_unlock(&e->mu);
}

/* ---- the queue --------------------------------------------------------------- */

static keel_status enqueue(keel_engine *e, eng_req *r, uint64_t *id)
{
    pthread_mutex_lock(&e->mu);
    if ((e->stop && e->running) || e->closing) {
        pthread_mutex_unlock(&e->mu);
        return KEEL_ECANCELED;
    }
    if (e->n_queued >= e->max_queue) {
        pthread_mutex_unlock(&e->mu);
        return KEEL_EFULL;
    }
    r->id = e->next_id++;
    if (id) *id = r->id;
    if (e->queue_tail)
        e->queue_tail->next = r;
    else
        e->queue_head = r;
    e->queue_tail = r;
    e->n_queued++;
    r->live_next = e->live_head;
    e->live_head = r;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return KEEL_OK;
}

/* A request from its JSON text (keel_engine_submit's and
 * keel_engine_count_tokens' argument). KEEL_EINVAL named in err. */
static keel_status req_from_text(keel_engine *e, const char *request_json, eng_req **out, char *err)
{
    json_error_t je;
    json_t *j = json_loads(request_json, ENG_JSON_FLAGS, &je);
    if (!j) return base_err(err, KEEL_EINVAL, "request: invalid JSON at line %d: %s", je.line, je.text);
    keel_status st = eng_req_make(e, j, out, err);
    json_decref(j);
    return st;
}

keel_status keel_engine_submit(keel_engine *e, const char *request_json, keel_event_fn cb, void *user,
                               uint64_t *id)
{
    if (!e) return KEEL_EINVAL;
    if (id) *id = 0;
    if (!request_json) return base_err(eng_err(e), KEEL_EINVAL, "request is NULL");
    keel_status st = eng_enter(e);
    if (st != KEEL_OK) return st;
    char err[BASE_ERR_CAP] = "";
    eng_req *r = NULL;
    if ((st = req_from_text(e, request_json, &r, err)) != KEEL_OK) goto out;
    r->cb = cb;
    r->user = user;
    /* a submitted request is owned by the engine: freed after DONE */
    r->o.parse_tools = r->o.parse_tools && r->kind == ENG_REQ_CHAT;
    st = enqueue(e, r, id);
    if (st != KEEL_OK) {
        eng_req_free(r);
        if (st == KEEL_EFULL)
            base_err(err, st, "request queue full (%d)", e->max_queue);
        else
            base_err(err, st, "engine stopping");
    }
out:
    if (st != KEEL_OK) base_err(eng_err(e), st, "%s", err);
    eng_leave(e);
    return st;
}

keel_status keel_engine_count_tokens(keel_engine *e, const char *request_json, int64_t *n_tokens)
{
    if (!e || !n_tokens) return KEEL_EINVAL;
    *n_tokens = 0;
    if (!request_json) return base_err(eng_err(e), KEEL_EINVAL, "request is NULL");
    keel_status st = eng_enter(e);
    if (st != KEEL_OK) return st;
    char err[BASE_ERR_CAP] = "";
    eng_req *r = NULL;
    st = req_from_text(e, request_json, &r, err);
    if (st == KEEL_OK) st = eng_count_tokens(e, r, n_tokens, err);
    eng_req_free(r);
    if (st != KEEL_OK) base_err(eng_err(e), st, "%s", err);
    eng_leave(e);
    return st;
}

keel_status keel_engine_run(keel_engine *e)
{
    if (!e) return KEEL_EINVAL;
    pthread_mutex_lock(&e->mu);
    if (e->closing || e->running) {
        bool closing = e->closing;
        pthread_mutex_unlock(&e->mu);
        if (closing) return base_err(eng_err(e), KEEL_ECANCELED, "the engine is closing");
        return base_err(eng_err(e), KEEL_EINVAL, "a loop already runs on this engine");
    }
    e->running = true; /* keel_engine_close waits for it to clear */
    e->stop = false;
    /* a keel_complete stepping on its own thread finishes its request
     * first (calls from now on submit and wait): one stepping thread */
    while (e->driving) pthread_cond_wait(&e->cv, &e->mu);
    pthread_mutex_unlock(&e->mu);
    for (;;) {
        pthread_mutex_lock(&e->mu);
        while (!e->stop && !e->queue_head && !e->ctl_head) { /* slot actions wake it too */
            bool busy = false;
            for (int32_t i = 0; i < e->n_slots && !busy; i++) busy = e->slots[i].state != ENG_SLOT_IDLE;
            if (busy) break;
            pthread_cond_wait(&e->cv, &e->mu);
        }
        bool stop = e->stop;
        pthread_mutex_unlock(&e->mu);
        if (stop) break;
        eng_step(e);
        eng_reap(e);
    }
    eng_finish_all(e, "cancelled");
    eng_reap(e);
    /* slot actions queued before running clears: their callers wait (one
     * queued after a last look without the lock would wait forever) */
    for (;;) {
        eng_run_controls(e);
        pthread_mutex_lock(&e->mu);
        if (!e->ctl_head) break;
        pthread_mutex_unlock(&e->mu);
    }
    e->running = false;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return KEEL_OK;
}

void keel_engine_stop(keel_engine *e)
{
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    e->stop = true;
    eng_cut_locked(e);
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

keel_status keel_engine_cancel_request(keel_engine *e, uint64_t id)
{
    if (!e) return KEEL_EINVAL;
    keel_status st = KEEL_ENOENT;
    pthread_mutex_lock(&e->mu);
    for (eng_req *r = e->live_head; r; r = r->live_next)
        if (r->id == id) {
            atomic_store(&r->cancel, 1);
            st = KEEL_OK;
        }
    eng_cut_locked(e);
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return st;
}

/* Marks the requests live now; a request queued later is not affected (a
 * sticky engine-wide flag would cancel the next keel_complete, or every
 * later request of a loop). */
void keel_engine_cancel(keel_engine *e)
{
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    for (eng_req *r = e->live_head; r; r = r->live_next) atomic_store(&r->cancel, 1);
    eng_cut_locked(e);
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

/* ---- keel_complete ------------------------------------------------------------ */

keel_status keel_complete(keel_engine *e, const char *messages_json, const char *options_json,
                          const char *tools_json, keel_event_fn cb, void *user, char *response, size_t cap)
{
    if (!e) return KEEL_EINVAL;
    eng_err(e)[0] = 0;
    keel_status st = eng_enter(e);
    if (st != KEEL_OK) return st;
    char err[BASE_ERR_CAP] = "";
    json_t *req = json_object(), *opts = NULL, *msgs = NULL, *tools = NULL;
    json_error_t je;
    eng_req *r = NULL;
    if (!req) {
        st = base_err(err, KEEL_ENOMEM, "out of memory");
        goto out;
    }
    if (options_json && *options_json) {
        opts = json_loads(options_json, ENG_JSON_FLAGS, &je);
        if (!opts) {
            st = base_err(err, KEEL_EINVAL, "options: invalid JSON at line %d: %s", je.line, je.text);
            goto out;
        }
        eng_opts check;
        eng_opts_init(e, &check);
        st = eng_opts_parse(e, opts, false, &check, err); /* unknown options are errors here */
        eng_opts_free(&check);
        if (st != KEEL_OK) goto out;
        if (json_object_update(req, opts) != 0) {
            st = base_err(err, KEEL_ENOMEM, "out of memory");
            goto out;
        }
    }
    bool has_prompt = opts && (json_object_get(opts, "prompt") || json_object_get(opts, "prompt_tokens"));
    if (!has_prompt) {
        if (!messages_json) {
            st = base_err(err, KEEL_EINVAL, "messages are NULL (and no prompt option)");
            goto out;
        }
        msgs = json_loads(messages_json, ENG_JSON_FLAGS, &je);
        if (!msgs) {
            st = base_err(err, KEEL_EINVAL, "messages: invalid JSON at line %d: %s", je.line, je.text);
            goto out;
        }
        if (json_object_set(req, "messages", msgs) != 0) {
            st = base_err(err, KEEL_ENOMEM, "out of memory");
            goto out;
        }
        if (tools_json && *tools_json) {
            tools = json_loads(tools_json, ENG_JSON_FLAGS, &je);
            if (!tools) {
                st = base_err(err, KEEL_EINVAL, "tools: invalid JSON at line %d: %s", je.line, je.text);
                goto out;
            }
            if (json_object_set(req, "tools", tools) != 0) {
                st = base_err(err, KEEL_ENOMEM, "out of memory");
                goto out;
            }
        }
    }
    if ((st = eng_req_make(e, req, &r, err)) != KEEL_OK) goto out;
    r->cb = cb;
    r->user = user;
    pthread_mutex_lock(&e->mu);
    bool loop = e->running;
    if (!loop && e->driving) {
        pthread_mutex_unlock(&e->mu);
        st = base_err(err, KEEL_ESTATE, "another keel_complete is running on this engine");
        goto out;
    }
    if (!loop) e->driving = true;
    pthread_mutex_unlock(&e->mu);
    r->keep = true; /* this thread frees it */
    if ((st = enqueue(e, r, NULL)) != KEEL_OK) {
        pthread_mutex_lock(&e->mu);
        if (!loop) e->driving = false;
        pthread_cond_broadcast(&e->cv);
        pthread_mutex_unlock(&e->mu);
        st = base_err(err, st, "cannot queue the request");
        goto out;
    }
    if (loop) {
        pthread_mutex_lock(&e->mu);
        while (!r->done) pthread_cond_wait(&e->cv, &e->mu);
        pthread_mutex_unlock(&e->mu);
    } else {
        for (;;) {
            pthread_mutex_lock(&e->mu);
            bool done = r->done;
            pthread_mutex_unlock(&e->mu);
            if (done) break;
            eng_step(e);
        }
        eng_reap(e);
        pthread_mutex_lock(&e->mu);
        e->driving = false;
        pthread_cond_broadcast(&e->cv); /* a keel_engine_run waiting to start */
        pthread_mutex_unlock(&e->mu);
    }
    st = r->status;
    if (st == KEEL_OK && atomic_load(&r->cancel)) st = KEEL_ECANCELED;
    if (response && r->response) {
        if (cap < r->response_len + 1) {
            if (st == KEEL_OK) st = KEEL_ERANGE;
            if (cap) response[0] = 0;
        } else {
            memcpy(response, r->response, r->response_len + 1);
        }
    }
    if (st != KEEL_OK && st != KEEL_ERANGE && r->response) {
        json_t *rj = json_loads(r->response, JSON_ALLOW_NUL, NULL);
        const char *m = rj ? json_string_value(json_object_get(rj, "error")) : NULL;
        base_err(err, st, "%s", m ? m : keel_strerror(st));
        if (rj) json_decref(rj);
    }
    /* keep the response for keel_engine_response; with a loop running,
     * other threads' keel_complete calls swap it too: under mu */
    if (r->response) {
        pthread_mutex_lock(&e->mu);
        char *old = e->last_response;
        size_t old_len = e->last_response_len;
        e->last_response = r->response;
        e->last_response_len = r->response_len;
        pthread_mutex_unlock(&e->mu);
        base_free(old, old_len + 1);
        r->response = NULL;
        r->response_len = 0;
    }
out:
    if (st != KEEL_OK && err[0]) base_err(eng_err(e), st, "%s", err);
    eng_req_free(r);
    if (req) json_decref(req);
    if (opts) json_decref(opts);
    if (msgs) json_decref(msgs);
    if (tools) json_decref(tools);
    eng_leave(e);
    return st;
}

keel_status keel_engine_response(keel_engine *e, char *buf, size_t cap, size_t *n_out)
{
    if (!e || !n_out) return KEEL_EINVAL;
    keel_status st = KEEL_OK;
    pthread_mutex_lock(&e->mu); /* all it reads is under mu: close waits for the lock */
    if (!e->last_response) {
        st = KEEL_ENOENT;
    } else {
        *n_out = e->last_response_len + 1;
        if (!buf || cap < *n_out)
            st = KEEL_ERANGE;
        else
            memcpy(buf, e->last_response, *n_out);
    }
    pthread_mutex_unlock(&e->mu);
    return st;
}

keel_status keel_engine_reset(keel_engine *e)
{
    if (!e) return KEEL_EINVAL;
    keel_status st = eng_enter(e);
    if (st != KEEL_OK) return st;
    pthread_mutex_lock(&e->mu);
    bool busy = e->queue_head != NULL || e->ctl_head != NULL || e->driving || e->running;
    for (int32_t i = 0; i < e->n_slots && !busy; i++) busy = e->slots[i].state != ENG_SLOT_IDLE;
    /* this thread steps the engine while it clears: a keel_complete or slot
     * action started meanwhile is refused instead of running beside it */
    if (!busy) e->driving = true;
    pthread_mutex_unlock(&e->mu);
    if (busy) {
        st = base_err(eng_err(e), KEEL_ESTATE, "reset: requests are running (or a loop runs)");
        eng_leave(e);
        return st;
    }
    keel_mem *mem = keel_context_memory(e->ctx);
    keel_mem_clear(mem);
    pthread_mutex_lock(&e->mu);
    for (int32_t i = 0; i < e->n_slots; i++) {
        eng_slot *sl = &e->slots[i];
        sl->n_hist = 0;
        sl->hist_compacted = sl->hist_lost = false;
        sl->compact = e->compact_default;
        /* keel_engine_stats reads the snapshot, not the slot */
        sl->stat_hist = 0;
        sl->stat_prompt = sl->stat_fed = sl->stat_reused = 0;
        sl->stat_compacted = false;
        sl->stat_cells = keel_mem_seq_cells(mem, sl->seq);
        sl->stat_compactions = keel_mem_seq_compactions(mem, sl->seq);
    }
    e->driving = false;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    eng_leave(e);
    return KEEL_OK;
}

static keel_status engine_stats(keel_engine *e, char *buf, size_t cap, size_t *n_out);

keel_status keel_engine_stats(keel_engine *e, char *buf, size_t cap, size_t *n_out)
{
    if (!e || !n_out) return KEEL_EINVAL;
    keel_status st = eng_enter(e);
    if (st != KEEL_OK) return st;
    st = engine_stats(e, buf, cap, n_out);
    eng_leave(e);
    return st;
}

static keel_status engine_stats(keel_engine *e, char *buf, size_t cap, size_t *n_out)
{
    keel_plan plan;
    keel_context_plan_get(e->ctx, &plan);
    json_t *o = json_object(), *slots = json_array();
    if (!o || !slots) {
        if (o) json_decref(o);
        if (slots) json_decref(slots);
        return KEEL_ENOMEM;
    }
    pthread_mutex_lock(&e->mu);
    int bad = 0;
    for (int32_t i = 0; i < e->n_slots; i++) {
        const eng_slot *sl = &e->slots[i];
        bad |= json_array_append_new(
            slots, json_pack("{sisssisbsIsis{sisisi}}", "id", i, "state",
                             sl->stat_state == ENG_SLOT_IDLE ? "idle" : sl->stat_state == ENG_SLOT_PREFILL ? "prefill" : "generating",
                             "cached_tokens", sl->stat_hist, "compacted", sl->stat_compacted, "compactions",
                             (json_int_t)sl->stat_compactions, "cells", sl->stat_cells, "prompt_progress", "total",
                             sl->stat_prompt, "cache", sl->stat_reused, "processed", sl->stat_fed));
    }
    bad |= json_object_set_new(o, "slots", slots);
    bad |= json_object_set_new(o, "n_slots", json_integer(e->n_slots));
    bad |= json_object_set_new(o, "n_ctx", json_integer(e->cp.n_ctx));
    bad |= json_object_set_new(o, "requests", json_integer(e->n_requests));
    bad |= json_object_set_new(o, "queued", json_integer(e->n_queued));
    bad |= json_object_set_new(o, "prompt_tokens", json_integer(e->n_prompt_tokens));
    bad |= json_object_set_new(o, "cached_tokens", json_integer(e->n_cached_tokens));
    bad |= json_object_set_new(o, "completion_tokens", json_integer(e->n_gen_tokens));
    bad |= json_object_set_new(o, "requests_failed", json_integer(e->n_failed));
    bad |= json_object_set_new(o, "requests_cancelled", json_integer(e->n_cancelled));
    json_t *cr = json_object();
    if (!cr) bad = 1;
    for (int32_t k = 0; cr && k < ENG_CACHE_KINDS; k++)
        bad |= json_object_set_new(cr, eng_cache_kind_names[k], json_integer(e->cache_counts[k]));
    if (cr) bad |= json_object_set_new(o, "cache_reuse", cr);
    bad |= json_object_set_new(o, "cache_lost_tokens", json_integer(e->cache_lost_tokens));
    if (e->spec) {
        const keel_spec_params *sp = keel_spec_params_get(e->spec);
        json_t *so = json_pack("{s:s,s:i,s:I,s:I}", "kind", sp->kind == KEEL_SPEC_NGRAM ? "ngram" : "draft",
                               "max_draft", (int)sp->max_draft, "drafted_tokens", (json_int_t)e->n_drafted,
                               "accepted_tokens", (json_int_t)e->n_accepted);
        bad |= !so || json_object_set_new(o, "speculative", so);
    }
    bad |= json_object_set_new(o, "checkpoint_failures", json_integer(e->ckpt_failed));
    bad |= json_object_set_new(o, "prompt_seconds", json_real(e->prompt_seconds));
    bad |= json_object_set_new(o, "predicted_seconds", json_real(e->predicted_seconds));
    json_t *tt = json_object(), *bk = json_array();
    if (!tt || !bk) bad = 1;
    for (int32_t b = 0; bk && b < ENG_TTFT_BUCKETS; b++)
        bad |= json_array_append_new(bk, json_pack("[fI]", eng_ttft_le[b], (json_int_t)e->ttft_counts[b]));
    if (tt) {
        bad |= json_object_set_new(tt, "buckets", bk);
        bad |= json_object_set_new(tt, "count", json_integer(e->ttft_counts[ENG_TTFT_BUCKETS]));
        bad |= json_object_set_new(tt, "sum", json_real(e->ttft_sum));
        bad |= json_object_set_new(o, "ttft_seconds", tt);
    } else if (bk) {
        json_decref(bk);
    }
    json_t *kv = json_object(), *tabs = json_array();
    if (!kv || !tabs) bad = 1;
    for (int32_t g = 0; tabs && g < e->n_group_stat; g++)
        bad |= json_array_append_new(tabs, json_pack("{sisIsI}", "group", g, "cells_used", (json_int_t)e->group_used[g],
                                                     "cells_cap", (json_int_t)e->group_cap[g]));
    if (kv) {
        bad |= json_object_set_new(kv, "cells_used", json_integer(e->mem_stats.cells_used));
        bad |= json_object_set_new(kv, "cells_cap", json_integer(e->mem_stats.cells_cap));
        bad |= json_object_set_new(kv, "bytes_used", json_integer((json_int_t)e->mem_stats.bytes_used));
        bad |= json_object_set_new(kv, "bytes_total", json_integer((json_int_t)e->mem_stats.bytes_total));
        bad |= json_object_set_new(kv, "groups", tabs);
        bad |= json_object_set_new(o, "kv", kv);
    } else if (tabs) {
        json_decref(tabs);
    }
    pthread_mutex_unlock(&e->mu);
    keel_model_info mi;
    keel_model_info_get(e->model, &mi);
    bad |= json_object_set_new(o, "model", json_pack("{sssssIsisisiss}", "name", mi.name, "arch", mi.arch, "n_params",
                                                     (json_int_t)mi.n_params, "n_ctx_train", mi.n_ctx_train, "n_vocab",
                                                     mi.n_vocab, "n_ctx_slot", e->n_ctx_slot, "weights",
                                                     mi.weights_read ? "read" : "mapped"));
    json_t *pj = json_pack("{sIsIsIsIsIsI}", "weights_mapped", (json_int_t)plan.weights_mapped, "kv_bytes",
                           (json_int_t)plan.kv_bytes, "mem_bytes", (json_int_t)plan.mem_bytes, "work_bytes",
                           (json_int_t)plan.work_bytes, "logits_bytes", (json_int_t)plan.logits_bytes,
                           "context_bytes", (json_int_t)plan.total_bytes);
    const keel_context *dc = spec_draft_context(e->spec);
    if (pj && dc) { /* the draft model: its weights and context, beside the model's */
        keel_plan dp;
        keel_context_plan_get(dc, &dp);
        bad |= json_object_set_new(pj, "draft_weights_mapped", json_integer((json_int_t)dp.weights_mapped));
        bad |= json_object_set_new(pj, "draft_context_bytes", json_integer((json_int_t)dp.total_bytes));
    }
    bad |= json_object_set_new(o, "plan", pj);
    pthread_mutex_lock(&e->mu);
    bad |= json_object_set_new(o, "prompt_cache",
                               json_pack("{sIsIsIsIsIsIsI}", "entries", (json_int_t)e->pc_entries, "bytes",
                                         (json_int_t)e->pc_bytes, "limit_bytes", (json_int_t)e->pc_limit, "hits",
                                         (json_int_t)e->pc_hits, "hit_tokens", (json_int_t)e->pc_hit_tokens, "saves",
                                         (json_int_t)e->pc_saves, "evictions", (json_int_t)e->pc_evictions));
    pthread_mutex_unlock(&e->mu);
    if (e->tier) bad |= json_object_set_new(o, "remote_cache", eng_remote_stats(e));
    bad |= json_object_set_new(o, "chat_template", json_string(e->template_name));
    bad |= json_object_set_new(o, "tool_format", json_string(toolcall_format_name(e->tool_format)));
    char *s = bad ? NULL : json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!s) return KEEL_ENOMEM;
    size_t n = strlen(s) + 1;
    *n_out = n;
    keel_status st = KEEL_OK;
    if (!buf || cap < n)
        st = KEEL_ERANGE;
    else
        memcpy(buf, s, n);
    chat_json_free(s);
    return st;
}
