/* numerics/group.h — the linear groups of a layer, the one vocabulary the model, the
 * quantizer, the checkpoint, the backends and the forward pass share (docs/numerics.md
 * "Names", "Choosing INT8 blocks"). The linears of a group read one activation, so they
 * share its channel permutation, block size and INT8 blocks; the quantizer chooses those per
 * group and the checkpoint stores them per group. A linear's role names it inside its group.
 * What a group's activation looks like on a backend (fp32, INT8 codes, fp16) is not here:
 * that is the backend's (backend/backend.h). */
#ifndef COMET_NUMERICS_GROUP_H
#define COMET_NUMERICS_GROUP_H

#include "comet/model.h"

/* The linear input groups. The groups inside a layer come first (the quantizer's and the
 * checkpoint's per-layer groups, COMET_GROUP_LAYER_COUNT of them); the lm_head's input (the
 * final RMSNorm's output) is a group of its own after them. */
typedef enum comet_group {
    COMET_GROUP_QKV,     /* q, k, v from attn_norm(x): input [T, C] */
    COMET_GROUP_O,       /* o from the attention output: input [T, H*D] */
    COMET_GROUP_GATE_UP, /* gate, up from ffn_norm(x): input [T, C] */
    COMET_GROUP_DOWN,    /* down from silu(gate) * up: input [T, F] */
    COMET_GROUP_LM_HEAD, /* lm_head from output_norm(x): input [T, C]; not per layer */
    COMET_GROUP_COUNT
} comet_group;

/* Groups inside one layer: QKV, O, GATE_UP, DOWN. */
#define COMET_GROUP_LAYER_COUNT COMET_GROUP_LM_HEAD

/* The linears of a layer, by role. */
typedef enum comet_role {
    COMET_ROLE_Q,
    COMET_ROLE_K,
    COMET_ROLE_V,
    COMET_ROLE_O,
    COMET_ROLE_GATE,
    COMET_ROLE_UP,
    COMET_ROLE_DOWN,
    COMET_ROLE_COUNT
} comet_role;

/* Short group name ("qkv", "o", "gate_up", "down", "lm_head"); "?" out of range. The
 * checkpoint's metadata uses the names of the layer groups. */
const char *comet_group_name(comet_group g);

/* The group a role's linear reads. */
comet_group comet_role_group(comet_role r);

/* The roles of group g's linears, in role order (QKV: q, k, v; O: o; GATE_UP: gate, up;
 * DOWN: down; LM_HEAD: none), into roles[]; returns how many (at most 3). */
int comet_group_roles(comet_group g, comet_role roles[3]);

/* Input width K of group g by a model config: C, H*D, C, F, C (the unsharded widths). */
int comet_group_config_width(const comet_model_config *cfg, comet_group g);

/* The input width K of group g of a loaded model: as comet_group_config_width, except O,
 * which is o_proj's input width as loaded (all H heads, also on a rank of fewer,
 * model/shard.h). */
int comet_group_width(const comet_model *m, comet_group g);

/* The linears of layer group g (not LM_HEAD) of one layer (up to 3, role order) into out;
 * returns how many. */
int comet_group_linears(comet_layer_weights *lw, comet_group g, comet_linear **out);

/* The linear of `r` in layer l of m. */
const comet_linear *comet_model_linear(const comet_model *m, int l, comet_role r);

/* The RMSNorm weight [C] in front of group g of layer l (QKV: attn_norm, GATE_UP:
 * ffn_norm, LM_HEAD: output_norm, l ignored); NULL for O and DOWN, which have none. */
const float *comet_model_norm(const comet_model *m, int l, comet_group g);

/* INT8 block fractions of a quantized model: per layer group (INT8 blocks / all blocks over
 * all layers), overall by blocks, and overall weighted by GEMM work (blocks × N). */
void comet_group_int8_fraction(const comet_model *m, double per_group[COMET_GROUP_LAYER_COUNT],
                               double *overall_blocks, double *overall_work);

#endif
