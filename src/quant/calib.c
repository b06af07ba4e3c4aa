/* calib.c — calibration through a wrapping backend (see calib.h). */
#include "quant/calib.h"

#include "model/perplexity.h"

typedef struct calib_backend {
    comet_backend base; /* base.impl points back to this struct */
    comet_backend *inner;
    const comet_model *m;
    comet_calib_stats *cs;
} calib_backend;

static comet_backend *inner(comet_backend *be) { return ((calib_backend *)be->impl)->inner; }

static comet_status c_embed(comet_backend *be, const float *embd, int C, const int32_t *tokens,
                            int T, float *x) {
    comet_backend *in = inner(be);
    return in->ops->embed(in, embd, C, tokens, T, x);
}

static comet_status c_rmsnorm(comet_backend *be, const float *x, const float *w, int T, int C,
                              float eps, float *out) {
    comet_backend *in = inner(be);
    return in->ops->rmsnorm(in, x, w, T, C, eps, out);
}

/* Record the input of the first linear of each group, then run the linear. */
static comet_status c_linear(comet_backend *be, const comet_linear *lin, const float *x, int T,
                             float *y) {
    calib_backend *cb = be->impl;
    for (int l = 0; l < cb->m->cfg.n_layer; l++) {
        const comet_layer_weights *lw = &cb->m->layers[l];
        int g = lin == &lw->wq       ? COMET_QGROUP_QKV
                : lin == &lw->wo     ? COMET_QGROUP_O
                : lin == &lw->w_gate ? COMET_QGROUP_GATE_UP
                : lin == &lw->w_down ? COMET_QGROUP_DOWN
                                     : -1;
        if (g >= 0) {
            comet_calib_stats_observe(cb->cs, l, (comet_qgroup)g, x, T);
            break;
        }
    }
    return cb->inner->ops->linear(cb->inner, lin, x, T, y);
}

static comet_status c_rope(comet_backend *be, const comet_rope_params *rp,
                           const int32_t *positions, int T, float *q, int H, float *k, int Hkv) {
    comet_backend *in = inner(be);
    return in->ops->rope(in, rp, positions, T, q, H, k, Hkv);
}

static comet_status c_kv_append(comet_backend *be, comet_kv_cache *kv, int layer,
                                const comet_batch *b, const float *k, const float *v) {
    comet_backend *in = inner(be);
    return in->ops->kv_append(in, kv, layer, b, k, v);
}

static comet_status c_attention(comet_backend *be, const comet_kv_cache *kv, int layer,
                                const comet_batch *b, const float *q, int H, float *out) {
    comet_backend *in = inner(be);
    return in->ops->attention(in, kv, layer, b, q, H, out);
}

static comet_status c_silu_mul(comet_backend *be, const float *gate, const float *up, int T,
                               int F, float *out) {
    comet_backend *in = inner(be);
    return in->ops->silu_mul(in, gate, up, T, F, out);
}

static comet_status c_residual_add(comet_backend *be, float *x, const float *y, int T, int C) {
    comet_backend *in = inner(be);
    return in->ops->residual_add(in, x, y, T, C);
}

static comet_status c_logits(comet_backend *be, const float *x, const int32_t *rows, int n_rows,
                             const float *lm_head, int C, int V, float *logits) {
    comet_backend *in = inner(be);
    return in->ops->logits(in, x, rows, n_rows, lm_head, C, V, logits);
}

static const comet_backend_ops calib_ops = {
    .name = "calibration",
    .embed = c_embed,
    .rmsnorm = c_rmsnorm,
    .linear = c_linear,
    .rope = c_rope,
    .kv_append = c_kv_append,
    .attention = c_attention,
    .silu_mul = c_silu_mul,
    .residual_add = c_residual_add,
    .logits = c_logits,
};

comet_status comet_calib_run(const comet_model *m, comet_backend *be, const int32_t *tokens,
                             size_t n_tokens, int n_windows, int window_len,
                             comet_calib_stats *cs, double *ppl) {
    if (n_windows <= 0 || window_len < 2)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "calibration: %d windows of %d tokens; positive counts (windows "
                               "of at least 2 tokens) would work",
                               n_windows, window_len);
    calib_backend cb = {.inner = be, .m = m, .cs = cs};
    cb.base.ops = &calib_ops;
    cb.base.n_threads = be->n_threads;
    cb.base.impl = &cb;
    comet_ppl_params p = comet_ppl_default_params();
    p.ctx = window_len;
    p.max_windows = n_windows;
    comet_ppl_result r;
    COMET_TRY(comet_perplexity(m, &cb.base, tokens, n_tokens, &p, &r));
    if (ppl)
        *ppl = r.ppl;
    return COMET_OK;
}
