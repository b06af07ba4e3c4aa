/* smooth.c — SmoothQuant's migration of activation outliers into the weights, folded
 * (smooth.h).
 *
 * For a linear input group with input X [T, K] and weights W_i [N_i, K], any s > 0 [K]
 * gives X·Wᵀ = (X·diag(1/s))·(W·diag(s))ᵀ. SmoothQuant picks
 *   s_j = max_t |X_tj|^alpha / max_i,n |W_i[n, j]|^(1 - alpha)
 * so that a channel with large activations hands part of its range to the weights. The
 * 1/s has to live where X is made, so that the runtime computes nothing new:
 *   - qkv, gate_up: X = RMSNorm(x)·diag(g): g := g / s;
 *   - down: X = silu(gate)·up: up_proj's output row j := row j / s_j (SwiGLU is
 *     elementwise in up);
 *   - o: X is attention's output, linear in V; channel (head h, dim d) comes from V of the
 *     KV head h / (H / Hkv), shared by that KV head's query heads, so s is shared by them
 *     (the largest of their s) and v_proj's output row (kv head, d) := row / s.
 * The calibration statistics move with the model: salience_j / s_j, XᵀX scaled by
 * 1/(s_j s_k): what a new calibration of the smoothed model would measure, without one.
 */
#include "quant/smooth.h"

#include <math.h>
#include <stdlib.h>

/* largest |w[n, j]| over the rows of the linears lins[0..n_lins) (all [*, K]) into wmax */
static void col_max(const comet_linear *const *lins, int n_lins, int K, float *wmax) {
    for (int j = 0; j < K; j++)
        wmax[j] = 0.0f;
    for (int i = 0; i < n_lins; i++)
        for (size_t n = 0; n < (size_t)lins[i]->n_out; n++)
            for (int j = 0; j < K; j++)
                wmax[j] = fmaxf(wmax[j], fabsf(lins[i]->w[n * K + j]));
}

/* s [K] from the activation maxima sal and weight maxima wmax; 1 where either is 0 */
static void factors(const float *sal, const float *wmax, int K, float alpha, float *s) {
    for (int j = 0; j < K; j++) {
        double a = sal[j], w = wmax[j];
        s[j] = a > 0 && w > 0 ? (float)(pow(a, alpha) / pow(w, 1.0 - alpha)) : 1.0f;
        if (!(s[j] > 0) || !isfinite(s[j]))
            s[j] = 1.0f;
    }
}

/* columns j of the linears times s_j, the statistics of their input divided */
static void apply(comet_linear *const *lins, int n_lins, int K, const float *s,
                  comet_calib_stats *cs, comet_group g, int layer) {
    for (int i = 0; i < n_lins; i++)
        for (size_t n = 0; n < (size_t)lins[i]->n_out; n++)
            for (int j = 0; j < K; j++)
                lins[i]->w[n * K + j] *= s[j];
    float *sal = cs->sal[g] + (size_t)layer * K;
    for (int j = 0; j < K; j++)
        sal[j] /= s[j];
    if (cs->xtx[g]) {
        float *x = cs->xtx[g] + (size_t)layer * K * K;
        for (int j = 0; j < K; j++)
            for (int k = 0; k < K; k++)
                x[(size_t)j * K + k] /= s[j] * s[k];
    }
}

comet_status comet_smooth(comet_model *m, comet_calib_stats *cs, float alpha) {
    const comet_model_config *c = &m->cfg;
    if (!(alpha >= 0.0f && alpha <= 1.0f))
        return comet_set_error(COMET_ERR_INVALID_ARG, "smooth: alpha %g outside [0, 1]",
                               (double)alpha);
    if (m->quant || cs->n_layer != c->n_layer || cs->n_tokens == 0)
        return comet_set_error(COMET_ERR_INVALID_ARG, "smooth: needs a floating-point model "
                                                      "and calibration statistics of it");
    const int C = c->n_embd, F = c->n_ff, D = c->head_dim, H = c->n_head, Hkv = c->n_head_kv;
    const int HD = H * D, widest = HD > F ? (HD > C ? HD : C) : (F > C ? F : C);
    float *wmax = malloc((size_t)widest * sizeof *wmax), *s = malloc((size_t)widest * sizeof *s);
    if (!wmax || !s) {
        free(wmax);
        free(s);
        return comet_set_error(COMET_ERR_NOMEM, "smooth: out of memory");
    }
    for (int l = 0; l < c->n_layer; l++) {
        comet_layer_weights *lw = &m->layers[l];
        comet_linear *qkv[3] = {&lw->wq, &lw->wk, &lw->wv}, *gu[2] = {&lw->w_gate, &lw->w_up};
        comet_linear *o[1] = {&lw->wo}, *down[1] = {&lw->w_down};
        const comet_linear *all[7] = {qkv[0], qkv[1], qkv[2], gu[0], gu[1], o[0], down[0]};
        for (int i = 0; i < 7; i++)
            if (all[i]->fmt != COMET_WFMT_F32 || !all[i]->w) {
                free(wmax);
                free(s);
                return comet_set_error(COMET_ERR_INVALID_ARG,
                                       "smooth: layer %d has a linear "
                                       "that is not plain fp32",
                                       l);
            }
        /* qkv and gate_up: 1/s into the RMSNorm weight */
        col_max((const comet_linear *const *)qkv, 3, C, wmax);
        factors(cs->sal[COMET_GROUP_QKV] + (size_t)l * C, wmax, C, alpha, s);
        apply(qkv, 3, C, s, cs, COMET_GROUP_QKV, l);
        for (int j = 0; j < C; j++)
            lw->attn_norm[j] /= s[j];
        col_max((const comet_linear *const *)gu, 2, C, wmax);
        factors(cs->sal[COMET_GROUP_GATE_UP] + (size_t)l * C, wmax, C, alpha, s);
        apply(gu, 2, C, s, cs, COMET_GROUP_GATE_UP, l);
        for (int j = 0; j < C; j++)
            lw->ffn_norm[j] /= s[j];
        /* down: 1/s into up_proj's output rows */
        col_max((const comet_linear *const *)down, 1, F, wmax);
        factors(cs->sal[COMET_GROUP_DOWN] + (size_t)l * F, wmax, F, alpha, s);
        apply(down, 1, F, s, cs, COMET_GROUP_DOWN, l);
        for (int j = 0; j < F; j++)
            for (int k = 0; k < C; k++)
                lw->w_up.w[(size_t)j * C + k] /= s[j];
        /* o: one factor per (KV head, dim), the largest over its query heads */
        col_max((const comet_linear *const *)o, 1, HD, wmax);
        factors(cs->sal[COMET_GROUP_O] + (size_t)l * HD, wmax, HD, alpha, s);
        const int g = H / Hkv;
        for (int kh = 0; kh < Hkv; kh++)
            for (int d = 0; d < D; d++) {
                float v = 0.0f;
                for (int i = 0; i < g; i++)
                    v = fmaxf(v, s[(kh * g + i) * D + d]);
                for (int i = 0; i < g; i++)
                    s[(kh * g + i) * D + d] = v;
                for (int k = 0; k < C; k++)
                    lw->wv.w[((size_t)kh * D + d) * C + k] /= v;
            }
        apply(o, 1, HD, s, cs, COMET_GROUP_O, l);
    }
    free(wmax);
    free(s);
    return COMET_OK;
}
