/*
 * forward.c — the forward pass of the supported architectures, a loop over
 * layers (no graph, no recursion: design.md rule 8), on the memory core.
 *
 *   x = embed(tokens) * embd_scale
 *   for each layer:
 *     h = rmsnorm(x) * attn_norm
 *     q, k, v = h Wq (+bq), h Wk (+bk), h Wv (+bv)
 *     qwen3: q, k = rmsnorm per head * q_norm / k_norm
 *     q, k = rope(q), rope(k) at each token's position
 *     memory: write k, v at the tokens' cells; a = attend(q)   (masks, GQA, soft-cap)
 *     o = a Wo (+bo);  gemma2: o = rmsnorm(o) * post_attn_norm
 *     x = x + o
 *     h = rmsnorm(x) * ffn_norm
 *     f = (silu(h Wgate) * h Wup) Wdown      gemma2: gelu instead of silu, then
 *                                            f = rmsnorm(f) * post_ffw_norm
 *     x = x + f
 *   logits = (rmsnorm(x) * output_norm) Wout;  gemma2: final soft-cap
 *
 * All activations live in the work arena (model_work_bytes); nothing is
 * allocated here.
 */
#include "model.h"

#include <string.h>

typedef struct fw_bufs {
    float *x, *h, *q, *k, *v, *a, *o, *g, *u, *cs;
} fw_bufs;

static size_t fw_floats(const model_hp *hp, int32_t n)
{
    size_t E = (size_t)hp->n_embd, QD = (size_t)hp->n_head * (size_t)hp->hd_k;
    size_t KD = (size_t)hp->n_head_kv * (size_t)hp->hd_k, VD = (size_t)hp->n_head_kv * (size_t)hp->hd_v;
    size_t OD = (size_t)hp->n_head * (size_t)hp->hd_v, F = (size_t)hp->n_ff;
    size_t per_tok = 3 * E + QD + KD + VD + OD + 2 * F + (size_t)hp->rope.n_rot;
    return per_tok * (size_t)n + 16 * 10;
}

static size_t mm_scratch(const model_mat *m, int32_t n, int32_t threads)
{
    if (!m->data) return 0;
    return tensor_matmul_scratch_bytes(m->dtype, m->n_rows, m->n_cols, n, threads);
}

size_t model_work_bytes(const model_w *w, int32_t n_tokens, int32_t n_threads)
{
    const model_hp *hp = &w->hp;
    size_t s = fw_floats(hp, n_tokens) * sizeof(float) + 16 * BASE_ALIGN;
    size_t mm = 0;
    for (int32_t n = 1; n <= n_tokens; n = n < n_tokens ? BASE_MIN(n * 2, n_tokens) : n + 1) {
        /* scratch may depend on the batch size non-monotonically (paths):
         * take the max over the sizes that occur (powers of two and n_tokens) */
        mm = BASE_MAX(mm, mm_scratch(&w->output, n, n_threads));
        for (int32_t i = 0; i < hp->n_layer; i++) {
            const model_layer *L = &w->layers[i];
            const model_mat *ms[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->ffn_gate, &L->ffn_up, &L->ffn_down};
            for (int j = 0; j < 7; j++) mm = BASE_MAX(mm, mm_scratch(ms[j], n, n_threads));
        }
        if (n == n_tokens) break;
    }
    return s + mm + 4 * BASE_ALIGN;
}

/* Set by model_forward for the chunk it runs (on its thread): every product
 * through the dot tiles, whose rows do not depend on the batch size. */
static _Thread_local bool fw_deterministic;

static keel_status matmul(const model_mat *m, const float *X, int32_t n, float *Y, base_pool *pool,
                          base_arena *work)
{
    if (fw_deterministic)
        return tensor_matmul_path(TENSOR_GEMM_DOT_TILES, m->dtype, m->data, m->n_rows, m->n_cols, X, n, Y,
                                  pool, work);
    return tensor_matmul(m->dtype, m->data, m->n_rows, m->n_cols, X, n, Y, pool, work);
}

static void add_bias(float *y, const float *b, int32_t n, int64_t dim)
{
    if (!b) return;
    for (int32_t i = 0; i < n; i++) tensor_add_f32(y + (size_t)i * (size_t)dim, b, dim);
}

static void rmsnorm_rows(float *y, const float *x, const float *wt, int32_t n, int64_t dim, float eps)
{
    for (int32_t i = 0; i < n; i++)
        tensor_rmsnorm(y + (size_t)i * (size_t)dim, x + (size_t)i * (size_t)dim, wt, dim, eps);
}

keel_status model_forward(const model_w *w, keel_mem *mem, const model_ubatch *ub,
                          base_pool *pool, base_arena *work, const volatile int *cancel,
                          char *err)
{
    const model_hp *hp = &w->hp;
    int32_t n = ub->n;
    int64_t E = hp->n_embd, QD = (int64_t)hp->n_head * hp->hd_k;
    int64_t KD = (int64_t)hp->n_head_kv * hp->hd_k, VD = (int64_t)hp->n_head_kv * hp->hd_v;
    int64_t OD = (int64_t)hp->n_head * hp->hd_v, F = hp->n_ff;
    int32_t nrot = hp->rope.n_rot;
    fw_deterministic = ub->deterministic;
    base_arena_reset(work);
    fw_bufs b;
    b.x = base_arena_take_n(work, (size_t)n * (size_t)E, sizeof(float));
    b.h = base_arena_take_n(work, (size_t)n * (size_t)E, sizeof(float));
    b.o = base_arena_take_n(work, (size_t)n * (size_t)E, sizeof(float));
    b.q = base_arena_take_n(work, (size_t)n * (size_t)QD, sizeof(float));
    b.k = base_arena_take_n(work, (size_t)n * (size_t)KD, sizeof(float));
    b.v = base_arena_take_n(work, (size_t)n * (size_t)VD, sizeof(float));
    b.a = base_arena_take_n(work, (size_t)n * (size_t)OD, sizeof(float));
    b.g = base_arena_take_n(work, (size_t)n * (size_t)F, sizeof(float));
    b.u = base_arena_take_n(work, (size_t)n * (size_t)F, sizeof(float));
    b.cs = base_arena_take_n(work, (size_t)n * (size_t)(nrot > 0 ? nrot : 1), sizeof(float));
    if (!b.x || !b.h || !b.o || !b.q || !b.k || !b.v || !b.a || !b.g || !b.u || !b.cs)
        return base_err(err, KEEL_ESCRATCH, "forward: work arena too small for %d tokens", n);
    keel_status st;

    /* embeddings */
    size_t erow = tensor_row_bytes(w->tok_embd.dtype, E);
    for (int32_t i = 0; i < n; i++) {
        const uint8_t *row = (const uint8_t *)w->tok_embd.data + (size_t)ub->tokens[i] * erow;
        st = tensor_dequantize_row(w->tok_embd.dtype, row, b.x + (size_t)i * (size_t)E, E);
        if (st != KEEL_OK) return base_err(err, st, "forward: token_embd row %d", ub->tokens[i]);
        if (hp->embd_scale != 1.0f) tensor_scale_f32(b.x + (size_t)i * (size_t)E, hp->embd_scale, E);
    }
    if (nrot > 0)
        for (int32_t i = 0; i < n; i++)
            tensor_rope_cos_sin(w->rope_rates, nrot, (double)ub->pos[i], w->rope_mscale,
                                b.cs + (size_t)i * (size_t)nrot);

    for (int32_t l = 0; l < hp->n_layer; l++) {
        if (cancel && *cancel) return base_err(err, KEEL_ECANCELED, "forward: canceled at layer %d", l);
        const model_layer *L = &w->layers[l];
        rmsnorm_rows(b.h, b.x, L->attn_norm, n, E, hp->norm_eps);
        if ((st = matmul(&L->wq, b.h, n, b.q, pool, work)) != KEEL_OK) goto mm_fail;
        if ((st = matmul(&L->wk, b.h, n, b.k, pool, work)) != KEEL_OK) goto mm_fail;
        if ((st = matmul(&L->wv, b.h, n, b.v, pool, work)) != KEEL_OK) goto mm_fail;
        add_bias(b.q, L->bq, n, QD);
        add_bias(b.k, L->bk, n, KD);
        add_bias(b.v, L->bv, n, VD);
        if (L->q_norm)
            rmsnorm_rows(b.q, b.q, L->q_norm, n * hp->n_head, hp->hd_k, hp->norm_eps);
        if (L->k_norm)
            rmsnorm_rows(b.k, b.k, L->k_norm, n * hp->n_head_kv, hp->hd_k, hp->norm_eps);
        if (nrot > 0)
            for (int32_t i = 0; i < n; i++) {
                const float *cs = b.cs + (size_t)i * (size_t)nrot;
                tensor_rope_apply(hp->rope.type, nrot, cs, b.q + (size_t)i * (size_t)QD, hp->n_head, hp->hd_k);
                tensor_rope_apply(hp->rope.type, nrot, cs, b.k + (size_t)i * (size_t)KD, hp->n_head_kv, hp->hd_k);
            }
        int32_t g = keel_mem_layer_group(mem, l);
        st = keel_mem_write(mem, l, n, ub->cells + (size_t)g * (size_t)n, b.k, b.v);
        if (st != KEEL_OK) return base_err(err, st, "forward: layer %d: %s", l, keel_mem_last_error(mem));
        keel_mem_attn at = {n, hp->n_head, b.q, ub->pos, ub->seq, b.a, hp->attn_scale, hp->attn_softcap, NULL};
        st = keel_mem_attend(mem, l, &at);
        if (st != KEEL_OK) return base_err(err, st, "forward: layer %d: %s", l, keel_mem_last_error(mem));
        if ((st = matmul(&L->wo, b.a, n, b.o, pool, work)) != KEEL_OK) goto mm_fail;
        add_bias(b.o, L->bo, n, E);
        if (L->post_attn_norm) rmsnorm_rows(b.o, b.o, L->post_attn_norm, n, E, hp->norm_eps);
        tensor_add_f32(b.x, b.o, (int64_t)n * E);

        rmsnorm_rows(b.h, b.x, L->ffn_norm, n, E, hp->norm_eps);
        if ((st = matmul(&L->ffn_gate, b.h, n, b.g, pool, work)) != KEEL_OK) goto mm_fail;
        if ((st = matmul(&L->ffn_up, b.h, n, b.u, pool, work)) != KEEL_OK) goto mm_fail;
        if (hp->arch == MODEL_ARCH_GEMMA2)
            tensor_geglu(b.g, b.u, (int64_t)n * F);
        else
            tensor_swiglu(b.g, b.u, (int64_t)n * F);
        if ((st = matmul(&L->ffn_down, b.g, n, b.o, pool, work)) != KEEL_OK) goto mm_fail;
        if (L->post_ffw_norm) rmsnorm_rows(b.o, b.o, L->post_ffw_norm, n, E, hp->norm_eps);
        tensor_add_f32(b.x, b.o, (int64_t)n * E);
    }

    /* logits of the requested rows */
    if (ub->n_out > 0) {
        for (int32_t r = 0; r < ub->n_out; r++)
            tensor_rmsnorm(b.h + (size_t)r * (size_t)E, b.x + (size_t)ub->out_idx[r] * (size_t)E,
                           w->output_norm, E, hp->norm_eps);
        if ((st = matmul(&w->output, b.h, ub->n_out, ub->logits, pool, work)) != KEEL_OK) goto mm_fail;
        if (hp->final_softcap > 0.0f)
            tensor_softcap(ub->logits, (int64_t)ub->n_out * hp->n_vocab, hp->final_softcap);
    }
    return KEEL_OK;
mm_fail:
    return base_err(err, st, "forward: matrix product failed (%s)", keel_strerror(st));
}
