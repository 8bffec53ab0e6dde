/*
 * forward.c — the forward pass of every supported architecture: a loop over
 * layers (no graph, no recursion: design.md rule 8) on the memory core.
 * Each layer is a mixer (attention, Gated DeltaNet, Mamba2, multi-head
 * latent attention or a gated short convolution: layer_attn.c,
 * layer_gdn.c, layer_mamba2.c, layer_mla.c, layer_shortconv.c)
 * and an optional FFN (dense or mixture of experts: ffn.c):
 *
 *   x = embed(tokens) * embd_scale
 *   for each layer:
 *     if the layer has a mixer (nemotron_h's MLP blocks have none):
 *       h = rmsnorm(x) * attn_norm
 *       o = mixer(h)                gemma2/3: o = rmsnorm(o) * post_attn_norm
 *       x = x + o
 *     if the layer has an FFN:
 *       h = rmsnorm(x) * ffn_norm   (qwen35 / qwen3next / gpt-oss: the tensor is
 *                                    post_attention_norm; nemotron_h: attn_norm)
 *       o = ffn(h)                  gemma2/3: o = rmsnorm(o) * post_ffw_norm
 *       x = x + o
 *   logits = (rmsnorm(x) * output_norm) Wout;  gemma2: final soft-cap
 *
 * Activations live in the work arena (model_work_bytes): x, h, o and the
 * RoPE tables for the whole chunk, then each layer function takes its own
 * buffers above them and releases them (mark / rewind) before returning,
 * so the reservation is the shared part plus the largest layer kind plus
 * the largest matrix product's scratch. Nothing is allocated here.
 */
#include "model.h"

#include <string.h>

static size_t mm_scratch(const model_mat *m, int32_t n, int32_t threads)
{
    if (!m->data) return 0;
    return tensor_matmul_scratch_bytes(m->dtype, m->n_rows, m->n_cols, n, threads);
}

int32_t model_layer_mats(const model_layer *L, const model_mat **out, int32_t cap)
{
    const model_mat *all[] = {&L->wq,        &L->wk,         &L->wv,        &L->wo,
                              &L->ssm_in,    &L->ssm_qkv,    &L->ssm_z,     &L->ssm_beta,
                              &L->ssm_alpha, &L->ssm_ba,     &L->ssm_out,   &L->ffn_gate,
                              &L->ffn_up,    &L->ffn_down,   &L->gate_inp,  &L->gate_exps,
                              &L->up_exps,   &L->down_exps,  &L->gate_shexp, &L->up_shexp,
                              &L->down_shexp, &L->wq_a,      &L->wq_b,      &L->wkv_a,
                              &L->wk_b,      &L->wv_b,       &L->idx_wq_b,  &L->idx_wk,
                              &L->idx_proj};
    int32_t n = 0;
    for (size_t i = 0; i < BASE_ARRAY_LEN(all) && n < cap; i++)
        if (all[i]->data) out[n++] = all[i];
    return n;
}

/* Scratch of decode's grouped products (model_matmul_group): q/k/v,
 * gate/up, the shared expert's gate/up, the chosen experts. */
static size_t group_scratch(const model_layer *L, int32_t n_used)
{
    const model_mat *g[3][3] = {{&L->wq, &L->wk, &L->wv}, {&L->ffn_gate, &L->ffn_up, NULL},
                                {&L->gate_shexp, &L->up_shexp, NULL}};
    size_t mm = 0;
    for (int i = 0; i < 3; i++) {
        tensor_mv_job jobs[3];
        int k = 0;
        for (int j = 0; j < 3 && g[i][j] && g[i][j]->data; j++)
            jobs[k++] = (tensor_mv_job){g[i][j]->dtype, g[i][j]->data, g[i][j]->n_rows, NULL, NULL};
        if (k > 0) mm = BASE_MAX(mm, tensor_matvec_multi_scratch_bytes(jobs, k, g[i][0]->n_cols));
    }
    /* the chosen experts (ffn.c): gate and up on one activation, then the
     * downs each on its own (distinct pointers stand for distinct rows) */
    int32_t ku = L->gate_exps.data ? (int32_t)BASE_MIN(n_used, TENSOR_MV_MULTI_MAX / 2) : 0;
    if (ku > 0) {
        static const float own[TENSOR_MV_MULTI_MAX];
        tensor_mv_job jobs[TENSOR_MV_MULTI_MAX];
        for (int32_t j = 0; j < ku; j++) {
            jobs[2 * j] = (tensor_mv_job){L->gate_exps.dtype, L->gate_exps.data, L->gate_exps.n_rows, NULL, NULL};
            jobs[2 * j + 1] = (tensor_mv_job){L->up_exps.dtype, L->up_exps.data, L->up_exps.n_rows, NULL, NULL};
        }
        mm = BASE_MAX(mm, tensor_matvec_multi_scratch_bytes(jobs, 2 * ku, L->gate_exps.n_cols));
        for (int32_t j = 0; j < ku; j++)
            jobs[j] = (tensor_mv_job){L->down_exps.dtype, L->down_exps.data, L->down_exps.n_rows, NULL, own + j};
        mm = BASE_MAX(mm, tensor_matvec_multi_scratch_bytes(jobs, ku, L->down_exps.n_cols));
    }
    return mm;
}

/* Floats per token of the shared activations: x, h, o and two RoPE tables
 * (global and sliding layers). */
static size_t shared_floats(const model_hp *hp)
{
    return 3 * (size_t)hp->n_embd + 2 * (size_t)(hp->rope.n_rot > 0 ? hp->rope.n_rot : 1);
}

/* Whether the sliding layers rotate with their own RoPE (gemma3). */
static bool own_swa_rope(const model_hp *hp)
{
    return hp->n_swa > 0 && (hp->rope_swa.freq_base != hp->rope.freq_base ||
                             hp->rope_swa.freq_scale != hp->rope.freq_scale);
}

size_t model_work_bytes(const model_w *w, int32_t n_tokens, int32_t n_threads)
{
    const model_hp *hp = &w->hp;
    size_t layer = BASE_MAX(BASE_MAX(model_attn_floats(w), model_gdn_floats(w)),
                            BASE_MAX(BASE_MAX(model_mamba2_floats(w), model_mla_floats(w)),
                                     BASE_MAX(model_shortconv_floats(w), model_ffn_floats(w))));
    /* per token, plus one BASE_ALIGN of padding per buffer taken (at most 32
     * per layer function, 4 shared) */
    size_t s = (shared_floats(hp) + layer) * (size_t)n_tokens * sizeof(float) + 40 * BASE_ALIGN;
    /* buffers not per token: the delta rule's per-thread row, the router's
     * selection scores, decode's gate and up rows of the chosen experts */
    s += ((size_t)n_threads * (size_t)BASE_MAX(hp->ssm_d_state, 1) + (size_t)hp->n_expert +
          2 * (size_t)hp->n_expert_used * (size_t)hp->n_ff_exp) * sizeof(float);
    size_t mm = 0;
    for (int32_t n = 1; n <= n_tokens; n = n < n_tokens ? BASE_MIN(n * 2, n_tokens) : n + 1) {
        /* scratch may depend on the batch size non-monotonically (paths):
         * take the max over the sizes that occur (powers of two and n_tokens;
         * experts see any count up to n_tokens, bounded by the same max) */
        mm = BASE_MAX(mm, mm_scratch(&w->output, n, n_threads));
        for (int32_t i = 0; i < hp->n_layer; i++) {
            const model_mat *ms[32];
            int32_t k = model_layer_mats(&w->layers[i], ms, 32);
            for (int j = 0; j < k; j++) mm = BASE_MAX(mm, mm_scratch(ms[j], n, n_threads));
            if (n == 1) mm = BASE_MAX(mm, group_scratch(&w->layers[i], hp->n_expert_used));
        }
        if (n == n_tokens) break;
    }
    return s + mm + 4 * BASE_ALIGN;
}

/* With ub->deterministic every product goes through tensor_matvec_batch:
 * each token's row is bit for bit tensor_matvec's on that token, so it
 * does not depend on the batch size (decode runs the row kernels, a verify
 * batch or a prompt reads each weight row once per 16 tokens). */
keel_status model_matmul(const model_fw *f, const model_mat *m, const float *x, int32_t n, float *y)
{
    keel_status st = f->ub->deterministic
                         ? tensor_matmul_path(TENSOR_GEMM_MATVEC_BATCH, m->dtype, m->data, m->n_rows,
                                              m->n_cols, x, n, y, f->pool, f->work)
                         : tensor_matmul(m->dtype, m->data, m->n_rows, m->n_cols, x, n, y, f->pool, f->work);
    if (st != KEEL_OK)
        return base_err(f->err, st, "forward: layer %d: matrix product failed (%s)", f->l,
                        keel_strerror(st));
    return KEEL_OK;
}

keel_status model_matmul_group(const model_fw *f, const model_mat *const *ms, float *const *ys, int n_m,
                               const float *x, int32_t n)
{
    /* tensor_matvec_multi gives each matrix tensor_matvec's bits:
     * deterministic mode may take it too */
    bool multi = n == 1 && n_m >= 1 && n_m <= TENSOR_MV_MULTI_MAX;
    for (int j = 0; j < n_m && multi; j++) multi = ms[j]->n_cols == ms[0]->n_cols && ms[j]->n_expert == 0;
    if (multi) {
        tensor_mv_job jobs[TENSOR_MV_MULTI_MAX];
        for (int j = 0; j < n_m; j++) jobs[j] = (tensor_mv_job){ms[j]->dtype, ms[j]->data, ms[j]->n_rows, ys[j], NULL};
        keel_status st = tensor_matvec_multi(jobs, n_m, ms[0]->n_cols, x, f->pool, f->work);
        if (st != KEEL_OK)
            return base_err(f->err, st, "forward: layer %d: matrix products failed (%s)", f->l,
                            keel_strerror(st));
        return KEEL_OK;
    }
    /* a verify batch: the activations quantized and packed once, one pool
     * run for all the matrices, each one's bits model_matmul's (the
     * batched kernel's, which both deterministic mode and AUTO take here) */
    bool bmulti = n > 1 && n <= TENSOR_MV_BATCH_MAX && n_m >= 2 && n_m <= TENSOR_MV_MULTI_MAX;
    for (int j = 0; j < n_m && bmulti; j++)
        bmulti = ms[j]->n_cols == ms[0]->n_cols && ms[j]->n_expert == 0 && ms[j]->dtype == ms[0]->dtype;
    if (bmulti && !f->ub->deterministic)
        bmulti = tensor_matmul_auto_path(ms[0]->dtype, n) == TENSOR_GEMM_MATVEC_BATCH;
    if (bmulti) {
        tensor_mv_job jobs[TENSOR_MV_MULTI_MAX];
        for (int j = 0; j < n_m; j++) jobs[j] = (tensor_mv_job){ms[j]->dtype, ms[j]->data, ms[j]->n_rows, ys[j], NULL};
        keel_status st = tensor_matvec_batch_multi(jobs, n_m, ms[0]->n_cols, x, n, f->pool, f->work);
        if (st != KEEL_OK)
            return base_err(f->err, st, "forward: layer %d: matrix products failed (%s)", f->l,
                            keel_strerror(st));
        return KEEL_OK;
    }
    for (int j = 0; j < n_m; j++) {
        keel_status st = model_matmul(f, ms[j], x, n, ys[j]);
        if (st != KEEL_OK) return st;
    }
    return KEEL_OK;
}

static void rmsnorm_rows(float *y, const float *x, const float *wt, int32_t n, int64_t dim, float eps)
{
    for (int32_t i = 0; i < n; i++)
        tensor_rmsnorm(y + (size_t)i * (size_t)dim, x + (size_t)i * (size_t)dim, wt, dim, eps);
}

keel_status model_forward(const model_w *w, keel_mem *mem, const model_ubatch *ub,
                          base_pool *pool, base_arena *work, const atomic_int *cancel,
                          char *err)
{
    const model_hp *hp = &w->hp;
    int32_t n = ub->n;
    int64_t E = hp->n_embd;
    int32_t nrot = hp->rope.n_rot;
    base_arena_reset(work);
    float *x = base_arena_take_n(work, (size_t)n * (size_t)E, sizeof(float));
    float *h = base_arena_take_n(work, (size_t)n * (size_t)E, sizeof(float));
    float *o = base_arena_take_n(work, (size_t)n * (size_t)E, sizeof(float));
    float *cs = base_arena_take_n(work, (size_t)n * (size_t)(nrot > 0 ? nrot : 1), sizeof(float));
    if (!x || !h || !o || !cs)
        return base_err(err, KEEL_ESCRATCH, "forward: work arena too small for %d tokens", n);
    keel_status st;
    bool swa_rope = nrot > 0 && own_swa_rope(hp);
    float *cs_swa = swa_rope ? base_arena_take_n(work, (size_t)n * (size_t)nrot, sizeof(float)) : NULL;
    if (swa_rope && !cs_swa)
        return base_err(err, KEEL_ESCRATCH, "forward: work arena too small for %d tokens", n);
    model_fw f = {w, mem, ub, pool, work, err, -1, cs, cs_swa};

    /* embeddings */
    size_t erow = tensor_row_bytes(w->tok_embd.dtype, E);
    for (int32_t i = 0; i < n; i++) {
        const uint8_t *row = (const uint8_t *)w->tok_embd.data + (size_t)ub->tokens[i] * erow;
        st = tensor_dequantize_row(w->tok_embd.dtype, row, x + (size_t)i * (size_t)E, E);
        if (st != KEEL_OK) return base_err(err, st, "forward: token_embd row %d", ub->tokens[i]);
        if (hp->embd_scale != 1.0f) tensor_scale_f32(x + (size_t)i * (size_t)E, hp->embd_scale, E);
    }
    if (nrot > 0) {
        /* phi3 LongRoPE: the long factors when the context asks for them */
        bool lg = ub->rope_long && hp->rope_long.type != KEEL_ROPE_NONE;
        const double *rates = lg ? w->rope_rates_long : w->rope_rates;
        float ms = lg ? w->rope_mscale_long : w->rope_mscale;
        for (int32_t i = 0; i < n; i++) {
            tensor_rope_cos_sin(rates, nrot, (double)ub->pos[i], ms, cs + (size_t)i * (size_t)nrot);
            if (cs_swa)
                tensor_rope_cos_sin(w->rope_rates_swa, nrot, (double)ub->pos[i], w->rope_mscale_swa,
                                    cs_swa + (size_t)i * (size_t)nrot);
        }
    }

    for (int32_t l = 0; l < hp->n_layer; l++) {
        /* a recurrent state is updated in place: a chunk runs through every
         * layer or none */
        if (cancel && atomic_load_explicit(cancel, memory_order_relaxed) && (l == 0 || hp->n_recurrent == 0))
            return base_err(err, KEEL_ECANCELED, "forward: canceled at layer %d", l);
        const model_layer *L = &w->layers[l];
        f.l = l;
        if (L->mixer != MODEL_MIXER_NONE) {
            rmsnorm_rows(h, x, L->attn_norm, n, E, hp->norm_eps);
            switch (L->mixer) {
            case MODEL_MIXER_GDN: st = model_gdn(&f, h, o); break;
            case MODEL_MIXER_MAMBA2: st = model_mamba2(&f, h, o); break;
            case MODEL_MIXER_MLA: st = model_mla(&f, h, o); break;
            case MODEL_MIXER_SHORTCONV: st = model_shortconv(&f, h, o); break;
            default: st = model_attn(&f, h, o); break;
            }
            if (st != KEEL_OK) return st;
            if (L->post_attn_norm) rmsnorm_rows(o, o, L->post_attn_norm, n, E, hp->norm_eps);
            tensor_add_f32(x, o, (int64_t)n * E);
        }
        if (L->ffn == MODEL_FFN_NONE) continue;
        rmsnorm_rows(h, x, L->ffn_norm, n, E, hp->norm_eps);
        if ((st = model_ffn(&f, h, o)) != KEEL_OK) return st;
        if (L->post_ffw_norm) rmsnorm_rows(o, o, L->post_ffw_norm, n, E, hp->norm_eps);
        tensor_add_f32(x, o, (int64_t)n * E);
    }

    /* logits of the requested rows */
    if (ub->n_out > 0) {
        for (int32_t r = 0; r < ub->n_out; r++)
            tensor_rmsnorm(h + (size_t)r * (size_t)E, x + (size_t)ub->out_idx[r] * (size_t)E,
                           w->output_norm, E, hp->norm_eps);
        f.l = hp->n_layer;
        if ((st = model_matmul(&f, &w->output, h, ub->n_out, ub->logits)) != KEEL_OK) return st;
        if (hp->final_softcap > 0.0f)
            tensor_softcap(ub->logits, (int64_t)ub->n_out * hp->n_vocab, hp->final_softcap);
    }
    return KEEL_OK;
}
