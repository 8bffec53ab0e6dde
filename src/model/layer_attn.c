/*
 * layer_attn.c — the attention mixer of every architecture:
 *
 *   q, k, v = h Wq (+bq), h Wk (+bk), h Wv (+bv)
 *   gated (qwen35, qwen3next): Wq yields per head [q | gate]
 *   phi3: Wq, Wk, Wv are row views of the fused attn_qkv
 *   q, k = rmsnorm per head * q_norm / k_norm        (qwen3, qwen35, qwen3next, gemma3)
 *   q, k = rope(q), rope(k) at each token's position  (first n_rot dims; gemma3's
 *          sliding layers with rope_swa; phi3 LongRoPE factors, attn_factor)
 *   memory: write k, v at the tokens' cells; a = attend(q)
 *           (causal, sequence and sliding masks, GQA, soft-cap, gpt-oss sinks)
 *   gated: a = a * sigmoid(gate)
 *   o = a Wo (+bo)
 *
 * Buffers are taken from the work arena and released before returning.
 */
#include "model.h"

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

static bool any_gated(const model_w *w)
{
    for (int32_t i = 0; i < w->hp.n_layer; i++)
        if (w->layers[i].mixer == MODEL_MIXER_ATTN && w->layers[i].attn_gate) return true;
    return false;
}

size_t model_attn_floats(const model_w *w)
{
    const model_hp *hp = &w->hp;
    bool any = false;
    for (int32_t i = 0; i < hp->n_layer; i++) any |= w->layers[i].mixer == MODEL_MIXER_ATTN;
    if (!any) return 0;
    size_t QD = (size_t)hp->n_head * (size_t)hp->hd_k, KD = (size_t)hp->n_head_kv * (size_t)hp->hd_k;
    size_t VD = (size_t)hp->n_head_kv * (size_t)hp->hd_v, OD = (size_t)hp->n_head * (size_t)hp->hd_v;
    return (any_gated(w) ? 4 * QD : QD) + KD + VD + OD;
}

keel_status model_attn(const model_fw *f, const float *h, float *o)
{
    const model_w *w = f->w;
    const model_hp *hp = &w->hp;
    const model_layer *L = &w->layers[f->l];
    const model_ubatch *ub = f->ub;
    int32_t n = ub->n, nrot = hp->rope.n_rot;
    int64_t E = hp->n_embd, QD = (int64_t)hp->n_head * hp->hd_k;
    int64_t KD = (int64_t)hp->n_head_kv * hp->hd_k, VD = (int64_t)hp->n_head_kv * hp->hd_v;
    int64_t OD = (int64_t)hp->n_head * hp->hd_v;
    size_t mark = base_arena_mark(f->work);
    keel_status st = KEEL_OK;
    float *qf = base_arena_take_n(f->work, (size_t)n * (size_t)(L->attn_gate ? 2 * QD : QD), sizeof(float));
    float *q = qf, *gate = NULL;
    if (L->attn_gate) {
        q = base_arena_take_n(f->work, (size_t)n * (size_t)QD, sizeof(float));
        gate = base_arena_take_n(f->work, (size_t)n * (size_t)QD, sizeof(float));
    }
    float *k = base_arena_take_n(f->work, (size_t)n * (size_t)KD, sizeof(float));
    float *v = base_arena_take_n(f->work, (size_t)n * (size_t)VD, sizeof(float));
    float *a = base_arena_take_n(f->work, (size_t)n * (size_t)OD, sizeof(float));
    if (!qf || !q || (L->attn_gate && !gate) || !k || !v || !a) {
        st = base_err(f->err, KEEL_ESCRATCH, "forward: layer %d: work arena too small for attention",
                      f->l);
        goto done;
    }
    {
        const model_mat *ms[3] = {&L->wq, &L->wk, &L->wv};
        float *ys[3] = {qf, k, v};
        if ((st = model_matmul_group(f, ms, ys, 3, h, n)) != KEEL_OK) goto done;
    }
    if (L->attn_gate) /* per head [q | gate] */
        for (int32_t i = 0; i < n; i++)
            for (int32_t hd = 0; hd < hp->n_head; hd++) {
                const float *src = qf + ((size_t)i * (size_t)hp->n_head + (size_t)hd) * 2 * (size_t)hp->hd_k;
                float *qd = q + (size_t)i * (size_t)QD + (size_t)hd * (size_t)hp->hd_k;
                float *gd = gate + (size_t)i * (size_t)QD + (size_t)hd * (size_t)hp->hd_k;
                for (int32_t j = 0; j < hp->hd_k; j++) {
                    qd[j] = src[j];
                    gd[j] = src[hp->hd_k + j];
                }
            }
    add_bias(q, L->bq, n, QD);
    add_bias(k, L->bk, n, KD);
    add_bias(v, L->bv, n, VD);
    if (L->q_norm) rmsnorm_rows(q, q, L->q_norm, n * hp->n_head, hp->hd_k, hp->norm_eps);
    if (L->k_norm) rmsnorm_rows(k, k, L->k_norm, n * hp->n_head_kv, hp->hd_k, hp->norm_eps);
    if (nrot > 0)
        for (int32_t i = 0; i < n; i++) {
            /* gemma3's sliding layers have their own base */
            const float *cs = (L->swa && f->cs_swa ? f->cs_swa : f->cs) + (size_t)i * (size_t)nrot;
            tensor_rope_apply(hp->rope.type, nrot, cs, q + (size_t)i * (size_t)QD, hp->n_head, hp->hd_k);
            tensor_rope_apply(hp->rope.type, nrot, cs, k + (size_t)i * (size_t)KD, hp->n_head_kv, hp->hd_k);
        }
    int32_t g = keel_mem_layer_group(f->mem, f->l);
    st = keel_mem_write(f->mem, f->l, n, ub->cells + (size_t)g * (size_t)n, k, v);
    if (st != KEEL_OK) {
        st = base_err(f->err, st, "forward: layer %d: %s", f->l, keel_mem_last_error(f->mem));
        goto done;
    }
    keel_mem_attn at = {n, hp->n_head, q, ub->pos, ub->seq, a, hp->attn_scale, hp->attn_softcap, L->sinks,
                        NULL, NULL, 0, 0, NULL};
    st = keel_mem_attend(f->mem, f->l, &at);
    if (st != KEEL_OK) {
        st = base_err(f->err, st, "forward: layer %d: %s", f->l, keel_mem_last_error(f->mem));
        goto done;
    }
    if (L->attn_gate) {
        tensor_sigmoid(gate, (int64_t)n * QD);
        tensor_mul_f32(a, gate, (int64_t)n * OD);
    }
    if ((st = model_matmul(f, &L->wo, a, n, o)) != KEEL_OK) goto done;
    add_bias(o, L->bo, n, E);
done:
    base_arena_rewind(f->work, mark);
    return st;
}
