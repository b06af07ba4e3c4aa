/* numerics/qgroup.c — the linear input groups of a layer (qgroup.h). */
#include "numerics/qgroup.h"

const char *comet_qgroup_name(comet_qgroup g) {
    static const char *names[COMET_QGROUP_COUNT] = {"qkv", "o", "gate_up", "down"};
    return g >= 0 && g < COMET_QGROUP_COUNT ? names[g] : "?";
}

int comet_qgroup_width(const comet_model_config *cfg, comet_qgroup g) {
    switch (g) {
    case COMET_QGROUP_QKV: return cfg->n_embd;
    case COMET_QGROUP_O: return cfg->n_head * cfg->head_dim;
    case COMET_QGROUP_GATE_UP: return cfg->n_embd;
    case COMET_QGROUP_DOWN: return cfg->n_ff;
    default: return 0;
    }
}

int comet_qgroup_linears(comet_layer_weights *lw, comet_qgroup g, comet_linear **out) {
    switch (g) {
    case COMET_QGROUP_QKV: out[0] = &lw->wq, out[1] = &lw->wk, out[2] = &lw->wv; return 3;
    case COMET_QGROUP_O: out[0] = &lw->wo; return 1;
    case COMET_QGROUP_GATE_UP: out[0] = &lw->w_gate, out[1] = &lw->w_up; return 2;
    case COMET_QGROUP_DOWN: out[0] = &lw->w_down; return 1;
    default: return 0;
    }
}

void comet_qgroup_int8_fraction(const comet_model *m, double per_group[COMET_QGROUP_COUNT],
                                double *overall_blocks, double *overall_work) {
    double all8 = 0, all = 0, work8 = 0, work = 0;
    for (int g = 0; g < COMET_QGROUP_COUNT; g++) {
        double b8 = 0, b = 0;
        for (int l = 0; l < m->cfg.n_layer; l++) {
            comet_linear *lins[3];
            int n = comet_qgroup_linears(&m->layers[l], (comet_qgroup)g, lins);
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
