/* fmpq.c — FMPQ over a whole model (see fmpq.h): calibration statistics storage, and the
 * per-layer conversion of fp32 linears into quantized (COMET_WFMT_QSIM) ones. */
#include "quant/fmpq.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comet/log.h"
#include "numerics/pack.h"
#include "quant/quant.h"

comet_calib_stats *comet_calib_stats_init(const comet_model_config *cfg, int with_xtx) {
    comet_calib_stats *cs = calloc(1, sizeof *cs);
    if (!cs)
        goto oom;
    cs->n_layer = cfg->n_layer;
    for (int g = 0; g < COMET_GROUP_LAYER_COUNT; g++) {
        size_t K = (size_t)comet_group_config_width(cfg, (comet_group)g);
        cs->width[g] = (int)K;
        cs->sal[g] = calloc((size_t)cfg->n_layer * K, sizeof(float));
        if (!cs->sal[g])
            goto oom;
        if (with_xtx) {
            cs->xtx[g] = calloc((size_t)cfg->n_layer * K * K, sizeof(float));
            if (!cs->xtx[g])
                goto oom;
        }
    }
    return cs;
oom:
    comet_calib_stats_free(cs);
    comet_set_error(COMET_ERR_NOMEM, "calibration: out of memory for the statistics of %d layers%s",
                    cfg->n_layer, with_xtx ? " (with XᵀX for GPTQ)" : "");
    return NULL;
}

void comet_calib_stats_free(comet_calib_stats *cs) {
    if (!cs)
        return;
    for (int g = 0; g < COMET_GROUP_LAYER_COUNT; g++) {
        free(cs->sal[g]);
        free(cs->xtx[g]);
    }
    free(cs);
}

void comet_calib_stats_observe(comet_calib_stats *cs, int layer, comet_group g, const float *x,
                               int T) {
    COMET_ASSERT(layer >= 0 && layer < cs->n_layer && g >= 0 && g < COMET_GROUP_LAYER_COUNT);
    size_t K = (size_t)cs->width[g];
    comet_quant_salience_update(cs->sal[g] + (size_t)layer * K, x, T, (int)K);
    if (cs->xtx[g])
        comet_quant_xtx_update(cs->xtx[g] + (size_t)layer * K * K, x, T, (int)K);
    if (layer == 0 && g == COMET_GROUP_QKV)
        cs->n_tokens += T;
}

comet_fmpq_params comet_fmpq_default_params(void) {
    comet_fmpq_params p = {
        .w_bits = 4,
        .a_bits = 4,
        .kv.type = COMET_KV_INT4,
        .kv.group = 0,
        .kv.rotation = -1,
        .block = -1,
        .reorder = 1,
        .tau = 2.0f,
        .int8_budget = 0.25f,
        .gptq = 1,
        .clip_search = 1,
        .gptq_damp = 0.01f,
    };
    return p;
}

static comet_status check_params(const comet_model *m, const comet_calib_stats *cs,
                                 const comet_fmpq_params *p, int *block, comet_kv_format *kv) {
    if (p->w_bits != 4 && p->w_bits != 8 && p->w_bits != 16 && p->w_bits != 32)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "quantize: %d-bit weights; 4, 8, 16 or 32 would work", p->w_bits);
    if (p->a_bits != 4 && p->a_bits != 8 && p->a_bits != 16)
        return comet_set_error(
            COMET_ERR_INVALID_ARG,
            "quantize: %d-bit activations; 4 (INT4 with INT8 outlier blocks), 8 or 16 would work",
            p->a_bits);
    COMET_TRY(comet_kv_format_resolve(&p->kv, NULL, m->cfg.head_dim, "quantize", kv));
    if (!(p->int8_budget >= 0.0f && p->int8_budget <= 1.0f) || !(p->tau >= 0.0f))
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "quantize: INT8 budget %g must be in [0, 1] and tau %g >= 0",
                               (double)p->int8_budget, (double)p->tau);
    if (cs->n_layer != m->cfg.n_layer)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "quantize: statistics for %d layers, model has %d", cs->n_layer,
                               m->cfg.n_layer);
    if (p->gptq && p->w_bits >= 16)
        return comet_set_error(COMET_ERR_INVALID_ARG, "quantize: GPTQ needs 4- or 8-bit weights");
    if (p->lm_head_bits != 0 && p->lm_head_bits != 8 && p->lm_head_bits != 16)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "quantize: a %d-bit lm_head; 8 (INT8 rows) or 16 would work",
                               p->lm_head_bits);
    for (int g = 0; g < COMET_GROUP_LAYER_COUNT; g++)
        if (p->gptq && !cs->xtx[g])
            return comet_set_error(
                COMET_ERR_INVALID_ARG,
                "quantize: GPTQ needs XᵀX statistics (calibration with Hessians)");
    int dims[COMET_GROUP_LAYER_COUNT];
    for (int g = 0; g < COMET_GROUP_LAYER_COUNT; g++)
        dims[g] = comet_group_config_width(&m->cfg, (comet_group)g);
    *block = p->block;
    if (p->block < 0) {
        *block = comet_quant_choose_block(dims, COMET_GROUP_LAYER_COUNT);
        if (!*block)
            return comet_set_error(COMET_ERR_UNSUPPORTED,
                                   "quantize: input widths %d, %d, %d are not all multiples of 64; "
                                   "--block 0 (one block per row) would work",
                                   dims[0], dims[1], dims[3]);
    }
    for (int g = 0; g < COMET_GROUP_LAYER_COUNT; g++) {
        if (*block > 0 && dims[g] % *block)
            return comet_set_error(COMET_ERR_INVALID_ARG,
                                   "quantize: %s input width %d is not a multiple of block %d",
                                   comet_group_name((comet_group)g), dims[g], *block);
        if (dims[g] % 2)
            return comet_set_error(COMET_ERR_UNSUPPORTED, "quantize: %s input width %d is odd",
                                   comet_group_name((comet_group)g), dims[g]);
    }
    for (int l = 0; l < m->cfg.n_layer; l++)
        for (int g = 0; g < COMET_GROUP_LAYER_COUNT; g++) {
            comet_linear *lin[3];
            int n = comet_group_linears(&m->layers[l], (comet_group)g, lin);
            for (int i = 0; i < n; i++)
                if (lin[i]->fmt != COMET_WFMT_F32 || lin[i]->n_in != dims[g])
                    return comet_set_error(
                        COMET_ERR_INVALID_ARG,
                        "quantize: layer %d %s: an fp32 linear with %d inputs expected", l,
                        comet_group_name((comet_group)g), dims[g]);
        }
    return COMET_OK;
}

/* Quantize one linear whose fp32 weights, already permuted, are in wp [N, K]; writes the
 * dequantized weights into lin->w and attaches codes and scales. */
static comet_status quantize_linear(comet_model *m, comet_linear *lin, const float *wp,
                                    const float *hp, int B, const comet_fmpq_params *p) {
    int N = lin->n_out, K = lin->n_in;
    if (p->w_bits >= 16) {
        for (size_t i = 0; i < (size_t)N * K; i++)
            lin->w[i] = p->w_bits == 16 ? comet_quant_f16_round(wp[i]) : wp[i];
        lin->qw = NULL, lin->sw = NULL;
        return COMET_OK;
    }
    int8_t *q = malloc((size_t)N * K);
    uint16_t *s = comet_model_own(m, malloc((size_t)N * (K / B) * sizeof *s));
    if (!q || !s) {
        free(q);
        return comet_set_error(COMET_ERR_NOMEM, "quantize: out of memory for a %dx%d linear", N, K);
    }
    comet_status st =
        p->gptq ? comet_quant_w_gptq(wp, N, K, hp, B, p->w_bits, p->gptq_damp, p->clip_search, q, s)
                : comet_quant_w_rtn(wp, N, K, B, p->w_bits, p->clip_search, q, s);
    if (st < 0) {
        free(q);
        return st;
    }
    comet_quant_w_dequant(q, s, N, K, B, lin->w);
    if (p->w_bits == 4) {
        lin->qw = comet_model_own(m, malloc((size_t)N * (K / 2)));
        if (lin->qw)
            comet_w4_pack(q, N, K, lin->qw);
        free(q);
    } else {
        lin->qw = comet_model_own(m, (uint8_t *)q);
    }
    if (!lin->qw)
        return comet_set_error(COMET_ERR_NOMEM, "quantize: out of memory for a %dx%d linear", N, K);
    lin->sw = s;
    return COMET_OK;
}

static comet_status quantize_layer(comet_model *m, const comet_calib_stats *cs, int l, int B,
                                   const comet_fmpq_params *p, int *n8_out) {
    comet_layer_weights *lw = &m->layers[l];
    int32_t *perm[COMET_GROUP_LAYER_COUNT];
    int n8[COMET_GROUP_LAYER_COUNT];
    for (int g = 0; g < COMET_GROUP_LAYER_COUNT; g++) {
        int K = cs->width[g], Bg = B ? B : K;
        perm[g] = comet_model_own(m, malloc((size_t)K * sizeof(int32_t)));
        if (!perm[g])
            return comet_set_error(COMET_ERR_NOMEM, "quantize: out of memory");
        COMET_TRY(comet_quant_reorder(cs->sal[g] + (size_t)l * K, K, Bg, p->tau, p->int8_budget,
                                      p->reorder, perm[g], &n8[g]));
        if (p->a_bits == 8)
            n8[g] = K / Bg;
        else if (p->a_bits == 16)
            n8[g] = 0;
        n8_out[g] = n8[g];
    }
    const int32_t *pdown = perm[COMET_GROUP_DOWN];
    for (int g = 0; g < COMET_GROUP_LAYER_COUNT; g++) {
        int K = cs->width[g], Bg = B ? B : K;
        float *hp = NULL;
        if (p->gptq) {
            hp = malloc((size_t)K * K * sizeof *hp);
            if (!hp)
                return comet_set_error(COMET_ERR_NOMEM,
                                       "quantize: out of memory for a %dx%d Hessian", K, K);
            const float *h = cs->xtx[g] + (size_t)l * K * K;
            for (int a = 0; a < K; a++)
                for (int b = 0; b < K; b++)
                    hp[(size_t)a * K + b] = h[(size_t)perm[g][a] * K + perm[g][b]];
        }
        comet_linear *lins[3];
        int n_lin = comet_group_linears(lw, (comet_group)g, lins);
        comet_status st = COMET_OK;
        for (int i = 0; i < n_lin && st == COMET_OK; i++) {
            comet_linear *lin = lins[i];
            int N = lin->n_out;
            float *wp = malloc((size_t)N * K * sizeof *wp);
            if (!wp) {
                st = comet_set_error(COMET_ERR_NOMEM, "quantize: out of memory");
                break;
            }
            int fold_rows = g == COMET_GROUP_GATE_UP; /* rows in down_proj's input order */
            for (int n = 0; n < N; n++) {
                const float *src = lin->w + (size_t)(fold_rows ? pdown[n] : n) * K;
                float *dst = wp + (size_t)n * K;
                for (int a = 0; a < K; a++)
                    dst[a] = src[perm[g][a]];
            }
            st = quantize_linear(m, lin, wp, hp, Bg, p);
            free(wp);
            if (st < 0) { /* name the tensor: the quantizer names the channel and block */
                static const char *const names[COMET_GROUP_LAYER_COUNT][3] = {
                    {"q_proj", "k_proj", "v_proj"},
                    {"o_proj"},
                    {"gate_proj", "up_proj"},
                    {"down_proj"}};
                char why[512];
                snprintf(why, sizeof why, "%s", comet_last_error());
                st = comet_set_error(st, "quantize: layer %d %s: %s", l, names[g][i], why);
                break;
            }
            lin->fmt = COMET_WFMT_QSIM;
            lin->perm = g == COMET_GROUP_DOWN ? NULL : perm[g];
            lin->perm_folded = g == COMET_GROUP_DOWN ? perm[g] : NULL;
            lin->block = Bg;
            lin->n8 = n8[g];
            lin->a_bits = p->a_bits;
            lin->w_bits = p->w_bits;
        }
        free(hp);
        COMET_TRY(st);
    }
    return COMET_OK;
}

comet_status comet_fmpq_quantize(comet_model *m, const comet_calib_stats *cs,
                                 const comet_fmpq_params *p) {
    int B = 0;
    comet_kv_format kv;
    COMET_TRY(check_params(m, cs, p, &B, &kv));
    comet_quant_config *qc = comet_model_own(m, calloc(1, sizeof *qc));
    if (!qc)
        return comet_set_error(COMET_ERR_NOMEM, "quantize: out of memory");
    for (int l = 0; l < m->cfg.n_layer; l++) {
        int n8[COMET_GROUP_LAYER_COUNT];
        COMET_TRY(quantize_layer(m, cs, l, B, p, n8));
        char suffix[96];
        snprintf(suffix, sizeof suffix, "INT8 blocks qkv %d o %d gate_up %d down %d", n8[0], n8[1],
                 n8[2], n8[3]);
        comet_log_progress("quantize layers", l + 1, m->cfg.n_layer, suffix);
    }
    size_t n_embd = (size_t)m->cfg.n_vocab * m->cfg.n_embd;
    for (size_t i = 0; i < n_embd && p->w_bits <= 16; i++)
        m->tok_embd[i] = comet_quant_f16_round(m->tok_embd[i]);
    if (m->lm_head && m->lm_head != m->tok_embd)
        for (size_t i = 0; i < n_embd && p->w_bits <= 16; i++)
            m->lm_head[i] = comet_quant_f16_round(m->lm_head[i]);
    qc->format_version = COMET_QUANT_FORMAT_VERSION;
    qc->lm_head_bits = p->lm_head_bits ? p->lm_head_bits : p->w_bits <= 8 ? 8 : 16;
    if (qc->lm_head_bits == 8) /* from the fp16-rounded lm_head the checkpoint stores */
        COMET_TRY(comet_model_lm_head_quantize(m));
    qc->w_bits = p->w_bits;
    qc->a_bits = p->a_bits;
    qc->kv = kv;
    qc->block = B;
    qc->reorder = p->reorder;
    qc->tau = p->tau;
    qc->int8_budget = p->int8_budget;
    snprintf(qc->wmethod, sizeof qc->wmethod, "%s",
             p->w_bits == 16 ? "none"
             : p->gptq       ? "gptq"
                             : "rtn");
    qc->clip_search = p->clip_search;
    qc->gptq_damp = p->gptq_damp;
    m->quant = qc;
    m->kv = kv;
    return COMET_OK;
}
