/*
 * layer_gdn.c — the Gated DeltaNet mixer (qwen35, qwen3next):
 *
 *   qkv = h Wqkv            [conv channels: q (n_k x d) | k (n_k x d) | v (n_v x d)]
 *   z = h Wz                [n_v x d] output gate
 *   beta = sigmoid(h Wbeta), g = softplus(h Walpha + dt_bias) * A   per v head
 *   c = silu(conv1d(conv state, qkv))   causal, kernel K, per channel
 *   q, k = l2norm per head; v head h reads k head h % n_k (llama.cpp tiles
 *   the k heads over the v heads; hp.gdn_kv_tiled)
 *   per v head, token by token (the delta rule with decay):
 *     S = exp(g) S;  u = v - S k;  S += beta u k^T;  o = S q / sqrt(d)
 *   o = rmsnorm(o per head) * ssm_norm * silu(z);   out = o Wout
 *
 * State per sequence (in the memory core, keel_mem_rs_state): conv
 * [K - 1][channels] (oldest first) and S [n_v][d][d] stored as M[j][i] =
 * S[i][j] (row j of M is column j of S: the two dots and the update read
 * rows). Tokens of several sequences may interleave in a chunk: each
 * updates its own state in order. The conv runs over channel ranges and
 * the delta rule over v heads on the pool (each task walks the chunk's
 * tokens in order). Buffers come from the work arena and are released.
 */
#include "model.h"

#include <math.h>
#include <string.h>

size_t model_gdn_floats(const model_w *w)
{
    const model_hp *hp = &w->hp;
    bool any = false;
    for (int32_t i = 0; i < hp->n_layer; i++) any |= w->layers[i].mixer == MODEL_MIXER_GDN;
    if (!any) return 0;
    size_t C = (size_t)model_gdn_conv_channels(hp), V = (size_t)hp->ssm_d_inner;
    size_t nv = (size_t)hp->ssm_dt_rank;
    /* qkv, conv out, z, core, beta, g (ba: 2 nv), two state pointers */
    return 2 * C + 2 * V + 4 * nv + 4;
}

typedef struct gdn_ctx {
    const model_hp *hp;
    const model_layer *L;
    int32_t n;
    const float *qkv;   /* [n][C] */
    float *co;          /* [n][C] conv outputs */
    float **conv;       /* [n] conv state of each token's sequence */
    float **state;      /* [n] delta state */
    const float *beta, *g; /* [n][nv] */
    float *core;        /* [n][V] */
    float *scratch;     /* [threads][d] */
    int32_t C, chans_per_task;
} gdn_ctx;

/* Conv over a range of channels, token by token (the state shifts). */
static void conv_task(void *vctx, int64_t task, int thread)
{
    (void)thread;
    gdn_ctx *x = vctx;
    int32_t K = x->hp->ssm_conv_kernel, C = x->C;
    int32_t c0 = (int32_t)task * x->chans_per_task, c1 = BASE_MIN(C, c0 + x->chans_per_task);
    for (int32_t i = 0; i < x->n; i++) {
        float *st = x->conv[i];
        const float *in = x->qkv + (size_t)i * (size_t)C;
        float *out = x->co + (size_t)i * (size_t)C;
        for (int32_t c = c0; c < c1; c++) {
            const float *wc = x->L->ssm_conv + (size_t)c * (size_t)K;
            float sum = 0.0f;
            for (int32_t k = 0; k < K - 1; k++) sum += st[(size_t)k * (size_t)C + (size_t)c] * wc[k];
            sum += in[c] * wc[K - 1];
            out[c] = sum;
            for (int32_t k = 0; k + 1 < K - 1; k++)
                st[(size_t)k * (size_t)C + (size_t)c] = st[(size_t)(k + 1) * (size_t)C + (size_t)c];
            if (K > 1) st[(size_t)(K - 2) * (size_t)C + (size_t)c] = in[c];
        }
    }
}

/* The delta rule of one v head over the chunk's tokens. */
static void delta_task(void *vctx, int64_t task, int thread)
{
    gdn_ctx *x = vctx;
    const model_hp *hp = x->hp;
    int32_t h = (int32_t)task, d = hp->ssm_d_state, nk = hp->ssm_n_group, nv = hp->ssm_dt_rank;
    int32_t kh = hp->gdn_kv_tiled ? h % nk : h / (nv / nk);
    size_t Kd = (size_t)nk * (size_t)d;
    float *delta = x->scratch + (size_t)thread * (size_t)d;
    float scale = 1.0f / sqrtf((float)d);
    for (int32_t i = 0; i < x->n; i++) {
        const float *row = x->co + (size_t)i * (size_t)x->C;
        const float *q = row + (size_t)kh * (size_t)d;
        const float *k = row + Kd + (size_t)kh * (size_t)d;
        const float *v = row + 2 * Kd + (size_t)h * (size_t)d;
        float *M = x->state[i] + (size_t)h * (size_t)d * (size_t)d;
        float b = x->beta[(size_t)i * (size_t)nv + (size_t)h];
        tensor_scale_f32(M, expf(x->g[(size_t)i * (size_t)nv + (size_t)h]), (int64_t)d * d);
        for (int32_t j = 0; j < d; j++)
            delta[j] = (v[j] - tensor_dot_f32(M + (size_t)j * (size_t)d, k, d)) * b;
        for (int32_t j = 0; j < d; j++) tensor_axpy_f32(M + (size_t)j * (size_t)d, delta[j], k, d);
        float *o = x->core + (size_t)i * (size_t)hp->ssm_d_inner + (size_t)h * (size_t)d;
        for (int32_t j = 0; j < d; j++) o[j] = tensor_dot_f32(M + (size_t)j * (size_t)d, q, d) * scale;
    }
}

keel_status model_gdn(const model_fw *f, const float *h, float *o)
{
    const model_w *w = f->w;
    const model_hp *hp = &w->hp;
    const model_layer *L = &w->layers[f->l];
    const model_ubatch *ub = f->ub;
    int32_t n = ub->n, nv = hp->ssm_dt_rank, nk = hp->ssm_n_group, d = hp->ssm_d_state;
    int32_t C = model_gdn_conv_channels(hp), V = hp->ssm_d_inner;
    int threads = f->pool ? base_pool_threads(f->pool) : 1;
    size_t mark = base_arena_mark(f->work);
    keel_status st = KEEL_OK;
    base_arena *ar = f->work;
    float *qkv = base_arena_take_n(ar, (size_t)n * (size_t)C, sizeof(float));
    float *co = base_arena_take_n(ar, (size_t)n * (size_t)C, sizeof(float));
    float *z = base_arena_take_n(ar, (size_t)n * (size_t)V, sizeof(float));
    float *core = base_arena_take_n(ar, (size_t)n * (size_t)V, sizeof(float));
    float *beta = base_arena_take_n(ar, (size_t)n * (size_t)nv * 2, sizeof(float));
    float *g = base_arena_take_n(ar, (size_t)n * (size_t)nv * 2, sizeof(float));
    float **convp = base_arena_take_n(ar, (size_t)n, sizeof(float *));
    float **statep = base_arena_take_n(ar, (size_t)n, sizeof(float *));
    float *scratch = base_arena_take_n(ar, (size_t)threads * (size_t)d, sizeof(float));
    if (!qkv || !co || !z || !core || !beta || !g || !convp || !statep || !scratch) {
        st = base_err(f->err, KEEL_ESCRATCH, "forward: layer %d: work arena too small for the "
                      "delta net", f->l);
        goto done;
    }
    if ((st = model_matmul(f, &L->ssm_qkv, h, n, qkv)) != KEEL_OK) goto done;
    if ((st = model_matmul(f, &L->ssm_z, h, n, z)) != KEEL_OK) goto done;
    if (L->ssm_ba.data) {
        /* fused: per k head [beta (r) | alpha (r)], r = n_v / n_k */
        float *ba = core; /* free until the delta rule */
        int32_t r = nv / nk;
        if ((st = model_matmul(f, &L->ssm_ba, h, n, ba)) != KEEL_OK) goto done;
        for (int32_t i = 0; i < n; i++)
            for (int32_t kg = 0; kg < nk; kg++)
                for (int32_t j = 0; j < r; j++) {
                    const float *src = ba + (size_t)i * 2 * (size_t)nv + (size_t)kg * 2 * (size_t)r;
                    beta[(size_t)i * (size_t)nv + (size_t)(kg * r + j)] = src[j];
                    g[(size_t)i * (size_t)nv + (size_t)(kg * r + j)] = src[r + j];
                }
    } else {
        if ((st = model_matmul(f, &L->ssm_beta, h, n, beta)) != KEEL_OK) goto done;
        if ((st = model_matmul(f, &L->ssm_alpha, h, n, g)) != KEEL_OK) goto done;
    }
    tensor_sigmoid(beta, (int64_t)n * nv);
    for (int32_t i = 0; i < n; i++) {
        float *gi = g + (size_t)i * (size_t)nv;
        tensor_add_f32(gi, L->ssm_dt_b, nv);
        tensor_softplus(gi, nv);
        tensor_mul_f32(gi, L->ssm_a, nv);
    }
    for (int32_t i = 0; i < n; i++) {
        st = keel_mem_rs_state(f->mem, f->l, ub->seq[i], &convp[i], &statep[i]);
        if (st != KEEL_OK) {
            st = base_err(f->err, st, "forward: layer %d: %s", f->l, keel_mem_last_error(f->mem));
            goto done;
        }
    }
    gdn_ctx x = {hp, L, n, qkv, co, convp, statep, beta, g, core, scratch, C, 0};
    x.chans_per_task = BASE_MAX(64, (C + threads * 4 - 1) / (threads * 4));
    int64_t n_conv = (C + x.chans_per_task - 1) / x.chans_per_task;
    base_pool_run(n_conv > 1 && (int64_t)n * C >= 4096 ? f->pool : NULL, n_conv, conv_task, &x);
    tensor_silu(co, (int64_t)n * C);
    for (int32_t i = 0; i < n; i++)
        for (int32_t hh = 0; hh < 2 * nk; hh++) /* q and k heads */
            tensor_l2norm(co + (size_t)i * (size_t)C + (size_t)hh * (size_t)d, d, hp->norm_eps);
    base_pool_run((int64_t)n * nv * d * d >= 16384 ? f->pool : NULL, nv, delta_task, &x);
    for (int32_t i = 0; i < n; i++)
        for (int32_t hh = 0; hh < nv; hh++) {
            float *oh = core + (size_t)i * (size_t)V + (size_t)hh * (size_t)d;
            float *zh = z + (size_t)i * (size_t)V + (size_t)hh * (size_t)d;
            tensor_rmsnorm(oh, oh, L->ssm_norm, d, hp->norm_eps);
            tensor_silu(zh, d);
            tensor_mul_f32(oh, zh, d);
        }
    st = model_matmul(f, &L->ssm_out, core, n, o);
done:
    base_arena_rewind(f->work, mark);
    return st;
}
