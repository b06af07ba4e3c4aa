/* numerics/qgroup.h — the linear input groups of a layer: the linears that read one
 * activation share its channel permutation, block size and INT8 blocks (docs/numerics.md
 * "Choosing INT8 blocks"). The quantizer chooses them per group, the checkpoint stores them
 * per group. */
#ifndef COMET_NUMERICS_QGROUP_H
#define COMET_NUMERICS_QGROUP_H

#include "comet/model.h"

/* Linear input groups: the linears that read one activation share its permutation. */
typedef enum comet_qgroup {
    COMET_QGROUP_QKV,     /* q_proj, k_proj, v_proj: input [T, C] */
    COMET_QGROUP_O,       /* o_proj: input [T, H*D] */
    COMET_QGROUP_GATE_UP, /* gate_proj, up_proj: input [T, C] */
    COMET_QGROUP_DOWN,    /* down_proj: input [T, F] */
    COMET_QGROUP_COUNT
} comet_qgroup;

/* Short group name ("qkv", "o", "gate_up", "down"). */
const char *comet_qgroup_name(comet_qgroup g);

/* Input width of group g for a model config (C, H*D, C, F). */
int comet_qgroup_width(const comet_model_config *cfg, comet_qgroup g);

/* INT8 block fractions of a quantized model: per group (INT8 blocks / all blocks over all
 * layers), overall by blocks, and overall weighted by GEMM work (blocks × N). */
void comet_qgroup_int8_fraction(const comet_model *m, double per_group[COMET_QGROUP_COUNT],
                                double *overall_blocks, double *overall_work);

/* The linears of group g in layer l (up to 3); returns how many. */
int comet_qgroup_linears(comet_layer_weights *lw, comet_qgroup g, comet_linear **out);

#endif
