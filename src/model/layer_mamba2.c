/*
 * layer_mamba2.c — the Mamba2 mixer (SSD selective scan, recurrent form):
 *
 *   [z | xBC | dt] = h Win                z [d_inner], xBC [d_inner + 2 G N], dt [H]
 *   xBC = silu(conv1d(conv state, xBC) + conv bias)
 *   x [H][P] (P = d_inner / H), B, C [G][N]; head h uses group h / (H / G)
 *   dt = softplus(dt + dt_bias);  per head, token by token:
 *     S = exp(dt A) S + dt x B^T;   y = S C + D x
 *   y = silu(z) * y;   y = rmsnorm per group (d_inner / G) * ssm_norm;   out = y Wout
 *
 * State per sequence (keel_mem_rs_state): conv [K - 1][d_inner + 2 G N]
 * and S [H][P][N]. The conv runs over channel ranges and the scan over
 * heads on the pool, each task walking the chunk's tokens in order (tokens
 * of several sequences update their own states). Buffers come from the
 * work arena and are released.
 */
#include "model.h"

#include <math.h>
#include <string.h>

size_t model_mamba2_floats(const model_w *w)
{
    const model_hp *hp = &w->hp;
    bool any = false;
    for (int32_t i = 0; i < hp->n_layer; i++) any |= w->layers[i].mixer == MODEL_MIXER_MAMBA2;
    if (!any) return 0;
    size_t C = (size_t)model_mamba2_conv_channels(hp), D = (size_t)hp->ssm_d_inner;
    size_t P = D + C + (size_t)hp->ssm_dt_rank; /* in projection */
    return P + C + D + (size_t)hp->ssm_dt_rank + 4;
}

typedef struct m2_ctx {
    const model_hp *hp;
    const model_layer *L;
    int32_t n, C, P, chans_per_task;
    const float *zx;   /* [n][P] in projection */
    float *co;         /* [n][C] conv outputs */
    float **conv, **state;
    const float *dt;   /* [n][H] softplus'd */
    float *y;          /* [n][d_inner] */
} m2_ctx;

static void conv_task(void *vctx, int64_t task, int thread)
{
    (void)thread;
    m2_ctx *x = vctx;
    int32_t K = x->hp->ssm_conv_kernel, C = x->C, off = x->hp->ssm_d_inner;
    int32_t c0 = (int32_t)task * x->chans_per_task, c1 = BASE_MIN(C, c0 + x->chans_per_task);
    for (int32_t i = 0; i < x->n; i++) {
        float *st = x->conv[i];
        const float *in = x->zx + (size_t)i * (size_t)x->P + (size_t)off;
        float *out = x->co + (size_t)i * (size_t)C;
        for (int32_t c = c0; c < c1; c++) {
            const float *wc = x->L->ssm_conv + (size_t)c * (size_t)K;
            float sum = 0.0f;
            for (int32_t k = 0; k < K - 1; k++) sum += st[(size_t)k * (size_t)C + (size_t)c] * wc[k];
            sum += in[c] * wc[K - 1];
            out[c] = sum + x->L->ssm_conv_b[c];
            for (int32_t k = 0; k + 1 < K - 1; k++)
                st[(size_t)k * (size_t)C + (size_t)c] = st[(size_t)(k + 1) * (size_t)C + (size_t)c];
            if (K > 1) st[(size_t)(K - 2) * (size_t)C + (size_t)c] = in[c];
        }
    }
}

static void scan_task(void *vctx, int64_t task, int thread)
{
    (void)thread;
    m2_ctx *x = vctx;
    const model_hp *hp = x->hp;
    int32_t h = (int32_t)task, H = hp->ssm_dt_rank, G = hp->ssm_n_group, N = hp->ssm_d_state;
    int32_t Pd = hp->ssm_d_inner / H, g = h / (H / G);
    size_t Din = (size_t)hp->ssm_d_inner;
    float A = x->L->ssm_a[h], Dh = x->L->ssm_d[h];
    for (int32_t i = 0; i < x->n; i++) {
        const float *row = x->co + (size_t)i * (size_t)x->C;
        const float *xh = row + (size_t)h * (size_t)Pd;
        const float *B = row + Din + (size_t)g * (size_t)N;
        const float *Cm = row + Din + (size_t)G * (size_t)N + (size_t)g * (size_t)N;
        float dt = x->dt[(size_t)i * (size_t)H + (size_t)h];
        float dA = expf(dt * A);
        float *S = x->state[i] + (size_t)h * (size_t)Pd * (size_t)N;
        float *y = x->y + (size_t)i * Din + (size_t)h * (size_t)Pd;
        for (int32_t p = 0; p < Pd; p++) {
            float xdt = xh[p] * dt, sum = 0.0f;
            float *Sp = S + (size_t)p * (size_t)N;
            for (int32_t j = 0; j < N; j++) {
                float s = Sp[j] * dA + B[j] * xdt;
                sum += s * Cm[j];
                Sp[j] = s;
            }
            y[p] = sum + xh[p] * Dh;
        }
    }
}

keel_status model_mamba2(const model_fw *f, const float *h, float *o)
{
    const model_w *w = f->w;
    const model_hp *hp = &w->hp;
    const model_layer *L = &w->layers[f->l];
    const model_ubatch *ub = f->ub;
    int32_t n = ub->n, H = hp->ssm_dt_rank, G = hp->ssm_n_group, Din = hp->ssm_d_inner;
    int32_t C = model_mamba2_conv_channels(hp), P = Din + C + H;
    int threads = f->pool ? base_pool_threads(f->pool) : 1;
    size_t mark = base_arena_mark(f->work);
    keel_status st = KEEL_OK;
    base_arena *ar = f->work;
    float *zx = base_arena_take_n(ar, (size_t)n * (size_t)P, sizeof(float));
    float *co = base_arena_take_n(ar, (size_t)n * (size_t)C, sizeof(float));
    float *y = base_arena_take_n(ar, (size_t)n * (size_t)Din, sizeof(float));
    float *dt = base_arena_take_n(ar, (size_t)n * (size_t)H, sizeof(float));
    float **convp = base_arena_take_n(ar, (size_t)n, sizeof(float *));
    float **statep = base_arena_take_n(ar, (size_t)n, sizeof(float *));
    if (!zx || !co || !y || !dt || !convp || !statep) {
        st = base_err(f->err, KEEL_ESCRATCH, "forward: layer %d: work arena too small for mamba2",
                      f->l);
        goto done;
    }
    if ((st = model_matmul(f, &L->ssm_in, h, n, zx)) != KEEL_OK) goto done;
    for (int32_t i = 0; i < n; i++) {
        st = keel_mem_rs_state(f->mem, f->l, ub->seq[i], &convp[i], &statep[i]);
        if (st != KEEL_OK) {
            st = base_err(f->err, st, "forward: layer %d: %s", f->l, keel_mem_last_error(f->mem));
            goto done;
        }
        float *di = dt + (size_t)i * (size_t)H;
        memcpy(di, zx + (size_t)i * (size_t)P + (size_t)(Din + C), (size_t)H * sizeof(float));
        tensor_add_f32(di, L->ssm_dt_b, H);
        tensor_softplus(di, H);
    }
    m2_ctx x = {hp, L, n, C, P, 0, zx, co, convp, statep, dt, y};
    x.chans_per_task = BASE_MAX(64, (C + threads * 4 - 1) / (threads * 4));
    int64_t n_conv = (C + x.chans_per_task - 1) / x.chans_per_task;
    base_pool_run(n_conv > 1 && (int64_t)n * C >= 4096 ? f->pool : NULL, n_conv, conv_task, &x);
    tensor_silu(co, (int64_t)n * C);
    base_pool_run((int64_t)n * Din * hp->ssm_d_state >= 16384 ? f->pool : NULL, H, scan_task, &x);
    int32_t gs = Din / G;
    for (int32_t i = 0; i < n; i++) {
        float *yi = y + (size_t)i * (size_t)Din;
        float *zi = zx + (size_t)i * (size_t)P; /* z: the first d_inner */
        tensor_silu(zi, Din);
        tensor_mul_f32(yi, zi, Din);
        for (int32_t gg = 0; gg < G; gg++)
            tensor_rmsnorm(yi + (size_t)gg * (size_t)gs, yi + (size_t)gg * (size_t)gs,
                           L->ssm_norm + (size_t)gg * (size_t)gs, gs, hp->norm_eps);
    }
    st = model_matmul(f, &L->ssm_out, y, n, o);
done:
    base_arena_rewind(f->work, mark);
    return st;
}
