/* numerics/group.c — the linear groups of a layer and their roles (group.h). */
#include "numerics/group.h"

#include <stddef.h>

const char *comet_group_name(comet_group g) {
    static const char *names[COMET_GROUP_COUNT] = {"qkv", "o", "gate_up", "down", "lm_head"};
    return g >= 0 && g < COMET_GROUP_COUNT ? names[g] : "?";
}

comet_group comet_role_group(comet_role r) {
    switch (r) {
    case COMET_ROLE_Q:
    case COMET_ROLE_K:
    case COMET_ROLE_V: return COMET_GROUP_QKV;
    case COMET_ROLE_O: return COMET_GROUP_O;
    case COMET_ROLE_GATE:
    case COMET_ROLE_UP: return COMET_GROUP_GATE_UP;
    case COMET_ROLE_DOWN: return COMET_GROUP_DOWN;
    case COMET_ROLE_COUNT: break;
    }
    COMET_ASSERT(!"comet_role_group: invalid role");
    return COMET_GROUP_COUNT;
}

int comet_group_roles(comet_group g, comet_role roles[3]) {
    int n = 0;
    for (int r = 0; r < COMET_ROLE_COUNT; r++)
        if (g != COMET_GROUP_LM_HEAD && comet_role_group((comet_role)r) == g)
            roles[n++] = (comet_role)r;
    return n;
}

int comet_group_config_width(const comet_model_config *cfg, comet_group g) {
    switch (g) {
    case COMET_GROUP_QKV: return cfg->n_embd;
    case COMET_GROUP_O: return cfg->n_head * cfg->head_dim;
    case COMET_GROUP_GATE_UP: return cfg->n_embd;
    case COMET_GROUP_DOWN: return cfg->n_ff;
    case COMET_GROUP_LM_HEAD: return cfg->n_embd;
    default: return 0;
    }
}

int comet_group_width(const comet_model *m, comet_group g) {
    const comet_model_config *c = &m->cfg;
    if (g == COMET_GROUP_O && m->layers && c->n_layer > 0)
        return m->layers[0].wo.n_in; /* all H heads, also on a rank of fewer (model/shard.h) */
    return comet_group_config_width(c, g);
}

int comet_group_linears(comet_layer_weights *lw, comet_group g, comet_linear **out) {
    switch (g) {
    case COMET_GROUP_QKV: out[0] = &lw->wq, out[1] = &lw->wk, out[2] = &lw->wv; return 3;
    case COMET_GROUP_O: out[0] = &lw->wo; return 1;
    case COMET_GROUP_GATE_UP: out[0] = &lw->w_gate, out[1] = &lw->w_up; return 2;
    case COMET_GROUP_DOWN: out[0] = &lw->w_down; return 1;
    default: return 0;
    }
}

const comet_linear *comet_model_linear(const comet_model *m, int l, comet_role r) {
    COMET_ASSERT(l >= 0 && l < m->cfg.n_layer);
    const comet_layer_weights *w = &m->layers[l];
    const comet_linear *lins[COMET_ROLE_COUNT] = {&w->wq,     &w->wk,   &w->wv,    &w->wo,
                                                  &w->w_gate, &w->w_up, &w->w_down};
    COMET_ASSERT((unsigned)r < COMET_ROLE_COUNT);
    return lins[r];
}

const float *comet_model_norm(const comet_model *m, int l, comet_group g) {
    switch (g) {
    case COMET_GROUP_QKV: return m->layers[l].attn_norm;
    case COMET_GROUP_GATE_UP: return m->layers[l].ffn_norm;
    case COMET_GROUP_LM_HEAD: return m->output_norm;
    default: return NULL;
    }
}

void comet_group_int8_fraction(const comet_model *m, double per_group[COMET_GROUP_LAYER_COUNT],
                               double *overall_blocks, double *overall_work) {
    double all8 = 0, all = 0, work8 = 0, work = 0;
    for (int g = 0; g < COMET_GROUP_LAYER_COUNT; g++) {
        double b8 = 0, b = 0;
        for (int l = 0; l < m->cfg.n_layer; l++) {
            comet_linear *lins[3];
            int n = comet_group_linears(&m->layers[l], (comet_group)g, lins);
            const comet_linear *lin = lins[0];
            if (lin->fmt != COMET_WFMT_QSIM || lin->a_bits >= 16)
                continue;
            int nb = lin->n_in / lin->block;
            b8 += lin->n8, b += nb;
            for (int i = 0; i < n; i++)
                work8 += (double)lin->n8 * lins[i]->n_out, work += (double)nb * lins[i]->n_out;
        }
        per_group[g] = b > 0 ? b8 / b : 0.0;
        all8 += b8, all += b;
    }
    *overall_blocks = all > 0 ? all8 / all : 0.0;
    *overall_work = work > 0 ? work8 / work : 0.0;
}
