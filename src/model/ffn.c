/*
 * ffn.c — the feed-forward kinds:
 *
 *   dense:  o = act(h Wgate, h Wup) Wdown
 *           nemotron_h: o = (relu(h Wup + b_up)^2) Wdown + b_down (no gate)
 *   moe:    logits = h Wrouter (+ router bias)
 *           per token, the router picks n_expert_used experts and weights
 *           (model_router: softmax then top-k renormalized, top-k then
 *           softmax of the chosen logits, sigmoid with a selection bias;
 *           deepseek2's grouped routing first keeps the best groups);
 *           y_j = act(h Wgate_e (+b), h Wup_e (+b)) Wdown_e (+b) for each choice
 *           o = sum_j w_j y_j  (in the order of the choices, as llama.cpp sums)
 *           shared expert: o += sigmoid(h . g_shexp) * dense_shexp(h)
 *
 * act: silu(g) u, gelu(g) u, SwiGLU-OAI, or relu(u)^2 (no gate). Experts run over the tokens
 * that chose them (rows gathered, one matrix product per expert and
 * projection). Buffers come from the work arena and are released.
 */
#include "model.h"

#include <math.h>
#include <string.h>

static void act_apply(const model_hp *hp, float *g, const float *u, int64_t n)
{
    switch (hp->ffn_act) {
    case MODEL_ACT_GELU: tensor_geglu(g, u, n); break;
    case MODEL_ACT_SWIGLU_OAI:
        for (int64_t i = 0; i < n; i++) {
            float x = fminf(g[i], hp->oai_limit);
            float y = fminf(fmaxf(u[i], -hp->oai_limit), hp->oai_limit);
            g[i] = x / (1.0f + expf(-hp->oai_alpha * x)) * (y + 1.0f);
        }
        break;
    default: tensor_swiglu(g, u, n); break;
    }
}

static void add_bias_rows(float *y, const float *b, int32_t n, int64_t dim)
{
    if (!b) return;
    for (int32_t i = 0; i < n; i++) tensor_add_f32(y + (size_t)i * (size_t)dim, b, dim);
}

size_t model_ffn_floats(const model_w *w)
{
    const model_hp *hp = &w->hp;
    size_t E = (size_t)hp->n_embd, dense = 2 * (size_t)hp->n_ff, moe = 0;
    if (hp->n_expert > 0) {
        size_t k = (size_t)hp->n_expert_used, Fe = (size_t)hp->n_ff_exp, Fs = (size_t)hp->n_ff_shexp;
        moe = (size_t)hp->n_expert + 3 * k + 2 * E + 2 * Fe + k * E + (Fs ? 2 * Fs + E : 0);
    }
    return BASE_MAX(dense, moe);
}

/* The matrix of expert e. */
static model_mat expert(const model_mat *m, int32_t e)
{
    model_mat r = *m;
    r.data = (const uint8_t *)m->data + (size_t)e * m->expert_bytes;
    r.nbytes = m->expert_bytes;
    r.n_expert = 0;
    return r;
}

/* Grouped routing (deepseek2, llama.cpp's build_moe_ffn): a group's score
 * is the sum of its 2 best selection scores (top1 + top2); the experts of
 * all but the n_group_used best groups drop out of the selection (-inf). */
static void route_groups(const model_hp *hp, float *sel)
{
    int32_t G = hp->n_expert_groups, per = hp->n_expert / G;
    float score[256] = {0}; /* n_expert_groups <= 256 (arch_deepseek2.c) */
    int32_t best[256], top2[2];
    for (int32_t g = 0; g < G; g++) {
        tensor_topk(sel + (size_t)g * (size_t)per, per, 2, top2);
        score[g] = sel[g * per + top2[0]] + sel[g * per + top2[1]];
    }
    tensor_topk(score, G, hp->n_group_used, best);
    uint8_t keep[256] = {0};
    for (int32_t j = 0; j < hp->n_group_used; j++) keep[best[j]] = 1;
    for (int32_t g = 0; g < G; g++)
        if (!keep[g])
            for (int32_t e = 0; e < per; e++) sel[g * per + e] = -INFINITY;
}

/* Picks k experts of ne for one token from its logits (clobbered) and
 * writes their indices and weights. sel: [ne] scratch for the selection
 * scores (probabilities + the selection bias exp_probs_b). */
static void route(const model_hp *hp, const model_layer *L, float *lg, int32_t *idx, float *wt,
                  float *sel)
{
    int32_t ne = hp->n_expert, k = hp->n_expert_used;
    if (L->gate_inp_b) tensor_add_f32(lg, L->gate_inp_b, ne);
    if (hp->router == MODEL_ROUTER_SOFTMAX_WEIGHT) {
        tensor_topk(lg, ne, k, idx);
        for (int32_t j = 0; j < k; j++) wt[j] = lg[idx[j]];
        tensor_softmax(wt, k);
    } else {
        if (hp->router == MODEL_ROUTER_SIGMOID)
            tensor_sigmoid(lg, ne);
        else
            tensor_softmax(lg, ne);
        for (int32_t e = 0; e < ne; e++) sel[e] = lg[e] + (L->exp_probs_b ? L->exp_probs_b[e] : 0.0f);
        if (hp->n_expert_groups > 1) route_groups(hp, sel);
        tensor_topk(sel, ne, k, idx);
        for (int32_t j = 0; j < k; j++) wt[j] = lg[idx[j]];
    }
    if (hp->router_norm && hp->router != MODEL_ROUTER_SOFTMAX_WEIGHT) {
        float sum = 0.0f;
        for (int32_t j = 0; j < k; j++) sum += wt[j];
        sum = fmaxf(sum, 6.103515625e-5f); /* llama.cpp's clamp: f16's smallest normal */
        for (int32_t j = 0; j < k; j++) wt[j] /= sum;
    }
    if (hp->expert_scale != 1.0f)
        for (int32_t j = 0; j < k; j++) wt[j] *= hp->expert_scale;
}

static keel_status ffn_dense(const model_fw *f, const model_mat *gate, const model_mat *up,
                             const model_mat *down, const float *h, float *o, float *g, float *u)
{
    const model_hp *hp = &f->w->hp;
    int32_t n = f->ub->n;
    keel_status st;
    if (!gate->data) { /* ReLU^2 without a gate (nemotron_h), optional biases */
        const model_layer *L = &f->w->layers[f->l];
        int64_t F = up->n_rows, m = (int64_t)n * F;
        if ((st = model_matmul(f, up, h, n, u)) != KEEL_OK) return st;
        add_bias_rows(u, L->ffn_up_b, n, F);
        for (int64_t i = 0; i < m; i++) {
            float r = u[i] > 0.0f ? u[i] : 0.0f;
            u[i] = r * r;
        }
        if ((st = model_matmul(f, down, u, n, o)) != KEEL_OK) return st;
        add_bias_rows(o, L->ffn_down_b, n, hp->n_embd);
        return KEEL_OK;
    }
    const model_mat *ms[2] = {gate, up};
    float *ys[2] = {g, u};
    if ((st = model_matmul_group(f, ms, ys, 2, h, n)) != KEEL_OK) return st;
    act_apply(hp, g, u, (int64_t)n * gate->n_rows);
    return model_matmul(f, down, g, n, o);
}

/* Decode (one token, not deterministic): the chosen experts' gate and up
 * products in one pool run on the shared activation, then their down
 * products in another, each on its own activation, instead of 3 k runs;
 * the same products as tensor_matvec's (bit for bit), and the same sum:
 * o = w_0 y_0 + w_1 y_1 + ... in the order of the choices. y: [k][n_embd]. */
static keel_status experts_one_token(const model_fw *f, const model_layer *L, const float *h,
                                     const int32_t *idx, const float *wt, float *y, float *o)
{
    const model_hp *hp = &f->w->hp;
    int32_t k = hp->n_expert_used;
    int64_t E = hp->n_embd, Fe = hp->n_ff_exp;
    float *g = base_arena_take_n(f->work, 2 * (size_t)k * (size_t)Fe, sizeof(float));
    if (!g)
        return base_err(f->err, KEEL_ESCRATCH, "forward: layer %d: work arena too small for experts", f->l);
    float *u = g + (size_t)k * (size_t)Fe;
    tensor_mv_job jobs[TENSOR_MV_MULTI_MAX];
    for (int32_t j = 0; j < k; j++) {
        model_mat mg = expert(&L->gate_exps, idx[j]), mu = expert(&L->up_exps, idx[j]);
        jobs[2 * j] = (tensor_mv_job){mg.dtype, mg.data, Fe, g + (size_t)j * (size_t)Fe, NULL};
        jobs[2 * j + 1] = (tensor_mv_job){mu.dtype, mu.data, Fe, u + (size_t)j * (size_t)Fe, NULL};
    }
    keel_status st = tensor_matvec_multi(jobs, 2 * k, E, h, f->pool, f->work);
    if (st != KEEL_OK)
        return base_err(f->err, st, "forward: layer %d: expert products failed (%s)", f->l, keel_strerror(st));
    for (int32_t j = 0; j < k; j++) {
        if (L->gate_exps_b) tensor_add_f32(g + (size_t)j * (size_t)Fe, L->gate_exps_b + (size_t)idx[j] * (size_t)Fe, Fe);
        if (L->up_exps_b) tensor_add_f32(u + (size_t)j * (size_t)Fe, L->up_exps_b + (size_t)idx[j] * (size_t)Fe, Fe);
    }
    act_apply(hp, g, u, (int64_t)k * Fe);
    for (int32_t j = 0; j < k; j++) {
        model_mat md = expert(&L->down_exps, idx[j]);
        jobs[j] = (tensor_mv_job){md.dtype, md.data, E, y + (size_t)j * (size_t)E, g + (size_t)j * (size_t)Fe};
    }
    if ((st = tensor_matvec_multi(jobs, k, Fe, NULL, f->pool, f->work)) != KEEL_OK)
        return base_err(f->err, st, "forward: layer %d: expert products failed (%s)", f->l, keel_strerror(st));
    for (int32_t j = 0; j < k; j++) {
        float *yj = y + (size_t)j * (size_t)E;
        if (L->down_exps_b) tensor_add_f32(yj, L->down_exps_b + (size_t)idx[j] * (size_t)E, E);
        for (int64_t c = 0; c < E; c++) yj[c] *= wt[j];
    }
    memcpy(o, y, (size_t)E * sizeof(float));
    for (int32_t j = 1; j < k; j++) tensor_add_f32(o, y + (size_t)j * (size_t)E, E);
    return KEEL_OK;
}

static keel_status ffn_moe(const model_fw *f, const float *h, float *o)
{
    const model_w *w = f->w;
    const model_hp *hp = &w->hp;
    const model_layer *L = &w->layers[f->l];
    int32_t n = f->ub->n, ne = hp->n_expert, k = hp->n_expert_used;
    int64_t E = hp->n_embd, Fe = hp->n_ff_exp, Fs = hp->n_ff_shexp;
    keel_status st = KEEL_OK;
    base_arena *ar = f->work;
    float *lg = base_arena_take_n(ar, (size_t)n * (size_t)ne, sizeof(float));
    float *sel = base_arena_take_n(ar, (size_t)ne, sizeof(float));
    int32_t *idx = base_arena_take_n(ar, (size_t)n * (size_t)k, sizeof(int32_t));
    float *wt = base_arena_take_n(ar, (size_t)n * (size_t)k, sizeof(float));
    int32_t *rows = base_arena_take_n(ar, (size_t)n * (size_t)k, sizeof(int32_t));
    float *xs = base_arena_take_n(ar, (size_t)n * (size_t)E, sizeof(float));
    float *gs = base_arena_take_n(ar, (size_t)n * (size_t)Fe, sizeof(float));
    float *us = base_arena_take_n(ar, (size_t)n * (size_t)Fe, sizeof(float));
    float *ys = base_arena_take_n(ar, (size_t)n * (size_t)E, sizeof(float));
    float *slot = base_arena_take_n(ar, (size_t)n * (size_t)k * (size_t)E, sizeof(float));
    if (!lg || !sel || !idx || !wt || !rows || !xs || !gs || !us || !ys || !slot)
        return base_err(f->err, KEEL_ESCRATCH, "forward: layer %d: work arena too small for experts",
                        f->l);
    if ((st = model_matmul(f, &L->gate_inp, h, n, lg)) != KEEL_OK) return st;
    for (int32_t i = 0; i < n; i++)
        route(hp, L, lg + (size_t)i * (size_t)ne, idx + (size_t)i * (size_t)k, wt + (size_t)i * (size_t)k,
              sel);
    if (n == 1 && !f->ub->deterministic && 2 * k <= TENSOR_MV_MULTI_MAX) {
        st = experts_one_token(f, L, h, idx, wt, slot, o);
        if (st != KEEL_OK) return st;
        ne = 0; /* done: on to the shared expert */
    }
    /* each expert over the tokens that chose it */
    for (int32_t e = 0; e < ne; e++) {
        int32_t m = 0;
        for (int32_t r = 0; r < n * k; r++)
            if (idx[r] == e) rows[m++] = r;
        if (m == 0) continue;
        for (int32_t j = 0; j < m; j++)
            memcpy(xs + (size_t)j * (size_t)E, h + (size_t)(rows[j] / k) * (size_t)E, (size_t)E * sizeof(float));
        model_mat mg = expert(&L->gate_exps, e), mu = expert(&L->up_exps, e), md = expert(&L->down_exps, e);
        /* gate and up share their input: one pool run when decoding */
        const model_mat *gu[2] = {&mg, &mu};
        float *gu_y[2] = {gs, us};
        if ((st = model_matmul_group(f, gu, gu_y, 2, xs, m)) != KEEL_OK) return st;
        if (L->gate_exps_b) add_bias_rows(gs, L->gate_exps_b + (size_t)e * (size_t)Fe, m, Fe);
        if (L->up_exps_b) add_bias_rows(us, L->up_exps_b + (size_t)e * (size_t)Fe, m, Fe);
        act_apply(hp, gs, us, (int64_t)m * Fe);
        if ((st = model_matmul(f, &md, gs, m, ys)) != KEEL_OK) return st;
        if (L->down_exps_b) add_bias_rows(ys, L->down_exps_b + (size_t)e * (size_t)E, m, E);
        for (int32_t j = 0; j < m; j++) {
            float *dst = slot + (size_t)rows[j] * (size_t)E;
            const float *src = ys + (size_t)j * (size_t)E;
            float wj = wt[rows[j]];
            for (int64_t c = 0; c < E; c++) dst[c] = src[c] * wj;
        }
    }
    for (int32_t i = 0; i < n && ne > 0; i++) {
        float *oi = o + (size_t)i * (size_t)E;
        memcpy(oi, slot + (size_t)i * (size_t)k * (size_t)E, (size_t)E * sizeof(float));
        for (int32_t j = 1; j < k; j++) tensor_add_f32(oi, slot + ((size_t)i * (size_t)k + (size_t)j) * (size_t)E, E);
    }
    if (L->up_shexp.data) {
        float *sg = base_arena_take_n(ar, (size_t)n * (size_t)Fs, sizeof(float));
        float *su = base_arena_take_n(ar, (size_t)n * (size_t)Fs, sizeof(float));
        float *sd = base_arena_take_n(ar, (size_t)n * (size_t)E, sizeof(float));
        if (!sg || !su || !sd)
            return base_err(f->err, KEEL_ESCRATCH,
                            "forward: layer %d: work arena too small for the shared expert", f->l);
        if ((st = ffn_dense(f, &L->gate_shexp, &L->up_shexp, &L->down_shexp, h, sd, sg, su)) != KEEL_OK)
            return st;
        for (int32_t i = 0; i < n; i++) {
            float *si = sd + (size_t)i * (size_t)E;
            if (L->shexp_gate) {
                float gt = tensor_dot_f32(h + (size_t)i * (size_t)E, L->shexp_gate, E);
                tensor_scale_f32(si, 1.0f / (1.0f + expf(-gt)), E);
            }
            tensor_add_f32(o + (size_t)i * (size_t)E, si, E);
        }
    }
    return KEEL_OK;
}

keel_status model_ffn(const model_fw *f, const float *h, float *o)
{
    const model_layer *L = &f->w->layers[f->l];
    int32_t n = f->ub->n;
    size_t mark = base_arena_mark(f->work);
    keel_status st;
    if (L->ffn == MODEL_FFN_MOE) {
        st = ffn_moe(f, h, o);
    } else {
        int64_t F = L->ffn_up.n_rows;
        float *g = base_arena_take_n(f->work, (size_t)n * (size_t)F, sizeof(float));
        float *u = base_arena_take_n(f->work, (size_t)n * (size_t)F, sizeof(float));
        if (!g || !u)
            st = base_err(f->err, KEEL_ESCRATCH, "forward: layer %d: work arena too small for the FFN",
                          f->l);
        else
            st = ffn_dense(f, &L->ffn_gate, &L->ffn_up, &L->ffn_down, h, o, g, u);
    }
    base_arena_rewind(f->work, mark);
    return st;
}
