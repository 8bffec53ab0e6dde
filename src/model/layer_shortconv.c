/*
 * layer_shortconv.c — lfm2's gated short convolution (recurrent form):
 *
 *   [B | C | x] = h Win                       each [n_embd]
 *   bx = B * x
 *   c = depthwise causal conv of bx over the sequence, L = l_cache taps:
 *       c[t] = sum_k w[k] bx[t - (L - 1) + k]   (tap L - 1: the current token)
 *   y = C * c;   out = y Wout
 *
 * State per sequence (keel_mem_rs_state): conv [L - 1][n_embd], the last
 * L - 1 values of bx, oldest first (zero for a new sequence, as llama.cpp's
 * cleared conv state); no SSM state (state_floats 0). The conv has no
 * bias. Checkpoints, rewinds, forks and sessions keep the state through
 * the memory core's recurrent half like the other recurrent mixers'.
 *
 * The conv runs over channel ranges on the pool, each task walking the
 * chunk's tokens in order (tokens of several sequences update their own
 * states). Buffers come from the work arena and are released.
 */
#include "model.h"

size_t model_shortconv_floats(const model_w *w)
{
    const model_hp *hp = &w->hp;
    bool any = false;
    for (int32_t i = 0; i < hp->n_layer; i++) any |= w->layers[i].mixer == MODEL_MIXER_SHORTCONV;
    if (!any) return 0;
    return 4 * (size_t)hp->n_embd; /* in projection [B | C | x], conv output */
}

typedef struct sc_ctx {
    const model_layer *L;
    int32_t n, E, K, chans_per_task;
    const float *bcx; /* [n][3 E] */
    float *y;         /* [n][E] C * conv(B * x) */
    float **conv;     /* [n] each token's sequence state [K - 1][E] */
} sc_ctx;

static void conv_task(void *vctx, int64_t task, int thread)
{
    (void)thread;
    sc_ctx *x = vctx;
    size_t E = (size_t)x->E;
    int32_t K = x->K;
    int32_t c0 = (int32_t)task * x->chans_per_task, c1 = BASE_MIN(x->E, c0 + x->chans_per_task);
    for (int32_t i = 0; i < x->n; i++) {
        float *st = x->conv[i];
        const float *B = x->bcx + (size_t)i * 3 * E, *C = B + E, *X = B + 2 * E;
        float *y = x->y + (size_t)i * E;
        for (int32_t c = c0; c < c1; c++) {
            const float *wc = x->L->ssm_conv + (size_t)c * (size_t)K;
            float bx = B[c] * X[c];
            float sum = 0.0f;
            for (int32_t k = 0; k < K - 1; k++) sum += st[(size_t)k * E + (size_t)c] * wc[k];
            sum += bx * wc[K - 1];
            y[c] = C[c] * sum;
            for (int32_t k = 0; k + 1 < K - 1; k++) st[(size_t)k * E + (size_t)c] = st[(size_t)(k + 1) * E + (size_t)c];
            st[(size_t)(K - 2) * E + (size_t)c] = bx;
        }
    }
}

keel_status model_shortconv(const model_fw *f, const float *h, float *o)
{
    const model_w *w = f->w;
    const model_hp *hp = &w->hp;
    const model_layer *L = &w->layers[f->l];
    const model_ubatch *ub = f->ub;
    int32_t n = ub->n, E = hp->n_embd;
    int threads = f->pool ? base_pool_threads(f->pool) : 1;
    size_t mark = base_arena_mark(f->work);
    keel_status st = KEEL_OK;
    float *bcx = base_arena_take_n(f->work, (size_t)n * 3 * (size_t)E, sizeof(float));
    float *y = base_arena_take_n(f->work, (size_t)n * (size_t)E, sizeof(float));
    float **convp = base_arena_take_n(f->work, (size_t)n, sizeof(float *));
    if (!bcx || !y || !convp) {
        st = base_err(f->err, KEEL_ESCRATCH, "forward: layer %d: work arena too small for shortconv", f->l);
        goto done;
    }
    if ((st = model_matmul(f, &L->ssm_in, h, n, bcx)) != KEEL_OK) goto done;
    for (int32_t i = 0; i < n; i++) {
        float *state = NULL;
        st = keel_mem_rs_state(f->mem, f->l, ub->seq[i], &convp[i], &state);
        if (st != KEEL_OK) {
            st = base_err(f->err, st, "forward: layer %d: %s", f->l, keel_mem_last_error(f->mem));
            goto done;
        }
        if (!convp[i]) { /* l_cache >= 2 at load: the memory was made for another model */
            st = base_err(f->err, KEEL_ESTATE, "forward: layer %d: the memory layer has no conv state", f->l);
            goto done;
        }
    }
    sc_ctx x = {L, n, E, hp->ssm_conv_kernel, 0, bcx, y, convp};
    x.chans_per_task = BASE_MAX(64, (E + threads * 4 - 1) / (threads * 4));
    int64_t n_tasks = (E + x.chans_per_task - 1) / x.chans_per_task;
    base_pool_run(n_tasks > 1 && (int64_t)n * E >= 4096 ? f->pool : NULL, n_tasks, conv_task, &x);
    st = model_matmul(f, &L->ssm_out, y, n, o);
done:
    base_arena_rewind(f->work, mark);
    return st;
}
