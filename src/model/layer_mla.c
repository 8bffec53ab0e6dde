/*
 * layer_mla.c — multi-head latent attention (deepseek2), with the DSA
 * lightning indexer (deepseek32), in the absorbed MQA form llama.cpp runs:
 *
 *   qr      = rmsnorm(h Wq_a) * q_a_norm                        [q_lora]
 *   q       = qr Wq_b, per head [q_nope (nope) | q_pe (rope)]
 *             (without q LoRA, DeepSeek-V2-Lite: q = h Wq)
 *   kv      = h Wkv_a = [c (kv_lora) | k_pe (rope)]; c = rmsnorm(c) * kv_a_norm
 *   q_pe, k_pe = rope_norm(., pos)
 *   per head: q_abs = q_nope Wk_b[head]                         [kv_lora]
 *   Q       = per head [q_pe | q_abs],  K = [k_pe | c],  V = c  (one KV head)
 *   indexer (deepseek32 only; deepseek2 attends to every cell):
 *     iq    = qr Wiq_b, per indexer head [rope | nope]; rope_neox on its rope part
 *     ik    = layernorm(h Wik) * w + b; rope_neox on its rope part
 *     iw    = h Wproj / sqrt(idx_heads) / sqrt(idx_dim)
 *   memory: write K, V and ik (the table's third column, Hadamard-rotated
 *           there) at the tokens' cells; a = attend(Q) over the top_k cells
 *           the indexer keeps (keel_mem_attn.iq), scale 1 / sqrt(nope + rope)
 *           (times YaRN's mscale^2: arch_deepseek2.c)
 *   per head: o_h = a_h Wv_b[head]                               [v_head]
 *   o       = [o_0 | o_1 | ...] Wo
 *
 * llama.cpp stores K as [c | k_pe]; keel puts the rope part first so that
 * the memory's position edits (RoPE on a row's first n_rot dims) apply to
 * it: only the order of the dot product's terms differs. The Hadamard
 * rotation of the indexer's q and k is orthonormal: llama.cpp applies it
 * in the graph, keel's column stores H ik and rotates iq inside the
 * attention (the same scores up to rounding, the same stored f16 keys).
 *
 * Buffers come from the work arena and are released before returning.
 */
#include "model.h"

#include <math.h>
#include <string.h>

static bool has_mla(const model_w *w)
{
    for (int32_t i = 0; i < w->hp.n_layer; i++)
        if (w->layers[i].mixer == MODEL_MIXER_MLA) return true;
    return false;
}

size_t model_mla_floats(const model_w *w)
{
    if (!has_mla(w)) return 0;
    const model_hp *hp = &w->hp;
    size_t H = (size_t)hp->n_head, N = (size_t)hp->qk_nope, R = (size_t)hp->qk_rope;
    size_t KL = (size_t)hp->kv_lora, QL = (size_t)hp->q_lora, VH = (size_t)hp->v_head;
    size_t IH = (size_t)hp->idx_heads, ID = (size_t)hp->idx_dim;
    /* qr, q, kv, Q, K, V, a, ov, iq, ik, iw, and the per-head gathers
     * (q_nope rows, their absorbed rows, a head's output, its projection) */
    /* (+ 4: qr and the indexer's buffers are taken, a float at least, when absent) */
    return 4 + QL + H * (N + R) + (KL + R) + H * (R + KL) + (R + KL) + KL + H * KL + H * VH + IH * ID + ID + IH +
           N + KL + KL + VH;
}

static void rmsnorm_rows(float *y, const float *x, const float *wt, int32_t n, int64_t dim, int64_t stride,
                         float eps)
{
    for (int32_t i = 0; i < n; i++)
        tensor_rmsnorm(y + (size_t)i * (size_t)stride, x + (size_t)i * (size_t)stride, wt, dim, eps);
}

/* The matrix of head e of a per-head weight (stored like experts). */
static model_mat head_mat(const model_mat *m, int32_t e)
{
    model_mat r = *m;
    r.data = (const uint8_t *)m->data + (size_t)e * m->expert_bytes;
    r.nbytes = m->expert_bytes;
    r.n_expert = 0;
    return r;
}

keel_status model_mla(const model_fw *f, const float *h, float *o)
{
    const model_w *w = f->w;
    const model_hp *hp = &w->hp;
    const model_layer *L = &w->layers[f->l];
    const model_ubatch *ub = f->ub;
    int32_t n = ub->n, H = hp->n_head, N = hp->qk_nope, R = hp->qk_rope, KL = hp->kv_lora;
    int32_t QL = hp->q_lora, VH = hp->v_head, IH = hp->idx_heads, ID = hp->idx_dim;
    int32_t QH = N + R, DK = R + KL; /* q_b's head row; the cache's K row */
    size_t mark = base_arena_mark(f->work);
    keel_status st = KEEL_OK;
    base_arena *ar = f->work;
    size_t nn = (size_t)n;
    float *qr = base_arena_take_n(ar, nn * (size_t)BASE_MAX(QL, 1), sizeof(float));
    float *q = base_arena_take_n(ar, nn * (size_t)H * (size_t)QH, sizeof(float));
    float *kv = base_arena_take_n(ar, nn * (size_t)(KL + R), sizeof(float));
    float *Q = base_arena_take_n(ar, nn * (size_t)H * (size_t)DK, sizeof(float));
    float *K = base_arena_take_n(ar, nn * (size_t)DK, sizeof(float));
    float *V = base_arena_take_n(ar, nn * (size_t)KL, sizeof(float));
    float *a = base_arena_take_n(ar, nn * (size_t)H * (size_t)KL, sizeof(float));
    float *ov = base_arena_take_n(ar, nn * (size_t)H * (size_t)VH, sizeof(float));
    float *iq = base_arena_take_n(ar, nn * (size_t)BASE_MAX(IH * ID, 1), sizeof(float));
    float *ik = base_arena_take_n(ar, nn * (size_t)BASE_MAX(ID, 1), sizeof(float));
    float *iw = base_arena_take_n(ar, nn * (size_t)BASE_MAX(IH, 1), sizeof(float));
    float *g_in = base_arena_take_n(ar, nn * (size_t)BASE_MAX(N, KL), sizeof(float));
    float *g_out = base_arena_take_n(ar, nn * (size_t)BASE_MAX(KL, VH), sizeof(float));
    if (!qr || !q || !kv || !Q || !K || !V || !a || !ov || !iq || !ik || !iw || !g_in || !g_out) {
        st = base_err(f->err, KEEL_ESCRATCH, "forward: layer %d: work arena too small for attention", f->l);
        goto done;
    }
    /* queries and the compressed KV */
    if (QL > 0) {
        if ((st = model_matmul(f, &L->wq_a, h, n, qr)) != KEEL_OK) goto done;
        rmsnorm_rows(qr, qr, L->q_a_norm, n, QL, QL, hp->norm_eps);
        if ((st = model_matmul(f, &L->wq_b, qr, n, q)) != KEEL_OK) goto done;
    } else if ((st = model_matmul(f, &L->wq, h, n, q)) != KEEL_OK) {
        goto done;
    }
    if ((st = model_matmul(f, &L->wkv_a, h, n, kv)) != KEEL_OK) goto done;
    rmsnorm_rows(kv, kv, L->kv_a_norm, n, KL, KL + R, hp->norm_eps);
    for (int32_t i = 0; i < n; i++) {
        const float *cs = f->cs + (size_t)i * (size_t)R;
        float *qi = q + (size_t)i * (size_t)H * (size_t)QH, *kvi = kv + (size_t)i * (size_t)(KL + R);
        float *Ki = K + (size_t)i * (size_t)DK;
        for (int32_t hd = 0; hd < H; hd++) {
            float *Qh = Q + ((size_t)i * (size_t)H + (size_t)hd) * (size_t)DK;
            memcpy(Qh, qi + (size_t)hd * (size_t)QH + (size_t)N, (size_t)R * sizeof(float));
            tensor_rope_apply(hp->rope.type, R, cs, Qh, 1, DK);
        }
        memcpy(Ki, kvi + KL, (size_t)R * sizeof(float));
        tensor_rope_apply(hp->rope.type, R, cs, Ki, 1, DK);
        memcpy(Ki + R, kvi, (size_t)KL * sizeof(float));
        memcpy(V + (size_t)i * (size_t)KL, kvi, (size_t)KL * sizeof(float));
    }
    /* absorption: per head, q_nope Wk_b into the kv_lora space */
    for (int32_t hd = 0; hd < H; hd++) {
        for (int32_t i = 0; i < n; i++)
            memcpy(g_in + (size_t)i * (size_t)N, q + ((size_t)i * (size_t)H + (size_t)hd) * (size_t)QH,
                   (size_t)N * sizeof(float));
        model_mat wk = head_mat(&L->wk_b, hd);
        if ((st = model_matmul(f, &wk, g_in, n, g_out)) != KEEL_OK) goto done;
        for (int32_t i = 0; i < n; i++)
            memcpy(Q + ((size_t)i * (size_t)H + (size_t)hd) * (size_t)DK + R, g_out + (size_t)i * (size_t)KL,
                   (size_t)KL * sizeof(float));
    }
    /* the lightning indexer: queries from qr, one key and the head weights from h */
    if (IH > 0) {
        if ((st = model_matmul(f, &L->idx_wq_b, qr, n, iq)) != KEEL_OK) goto done;
        if ((st = model_matmul(f, &L->idx_wk, h, n, ik)) != KEEL_OK) goto done;
        if ((st = model_matmul(f, &L->idx_proj, h, n, iw)) != KEEL_OK) goto done;
        float wscale = 1.0f / sqrtf((float)IH) / sqrtf((float)ID);
        for (int32_t i = 0; i < n; i++) {
            const float *cs = f->cs + (size_t)i * (size_t)R;
            float *iki = ik + (size_t)i * (size_t)ID;
            tensor_layernorm(iki, iki, L->idx_k_norm, L->idx_k_norm_b, ID, hp->idx_norm_eps);
            tensor_rope_apply(KEEL_ROPE_NEOX, R, cs, iki, 1, ID);
            tensor_rope_apply(KEEL_ROPE_NEOX, R, cs, iq + (size_t)i * (size_t)IH * (size_t)ID, IH, ID);
            tensor_scale_f32(iw + (size_t)i * (size_t)IH, wscale, IH);
        }
    }
    int32_t g = keel_mem_layer_group(f->mem, f->l);
    st = keel_mem_write_kvi(f->mem, f->l, n, ub->cells + (size_t)g * (size_t)n, K, V, IH ? ik : NULL);
    if (st != KEEL_OK) {
        st = base_err(f->err, st, "forward: layer %d: %s", f->l, keel_mem_last_error(f->mem));
        goto done;
    }
    keel_mem_attn at;
    memset(&at, 0, sizeof at);
    at.n_tokens = n;
    at.n_heads = H;
    at.q = Q;
    at.pos = ub->pos;
    at.seq = ub->seq;
    at.out = a;
    at.scale = hp->attn_scale;
    if (IH > 0) {
        at.iq = iq;
        at.iw = iw;
        at.n_iq_heads = IH;
    }
    st = keel_mem_attend(f->mem, f->l, &at);
    if (st != KEEL_OK) {
        st = base_err(f->err, st, "forward: layer %d: %s", f->l, keel_mem_last_error(f->mem));
        goto done;
    }
    /* per head, back from the kv_lora space to the value dims */
    for (int32_t hd = 0; hd < H; hd++) {
        for (int32_t i = 0; i < n; i++)
            memcpy(g_in + (size_t)i * (size_t)KL, a + ((size_t)i * (size_t)H + (size_t)hd) * (size_t)KL,
                   (size_t)KL * sizeof(float));
        model_mat wv = head_mat(&L->wv_b, hd);
        if ((st = model_matmul(f, &wv, g_in, n, g_out)) != KEEL_OK) goto done;
        for (int32_t i = 0; i < n; i++)
            memcpy(ov + ((size_t)i * (size_t)H + (size_t)hd) * (size_t)VH, g_out + (size_t)i * (size_t)VH,
                   (size_t)VH * sizeof(float));
    }
    st = model_matmul(f, &L->wo, ov, n, o);
done:
    base_arena_rewind(f->work, mark);
    return st;
}
