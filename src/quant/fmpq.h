/* fmpq.h — FMPQ applied to a whole model: calibration statistics per linear input group,
 * then, per layer and group, the channel permutation and INT8 block count
 * (comet_quant_reorder), the permutation folded into the weights (down_proj's into the
 * gate/up output rows, docs/numerics.md), and the weights quantized with RTN-clip or GPTQ.
 * The model is converted in place to COMET_WFMT_QSIM linears ready for simulated
 * execution and for the checkpoint writer (src/format/checkpoint.h). Collecting the
 * statistics (running the FP model) is calib.h's job. */
#ifndef COMET_QUANT_FMPQ_H
#define COMET_QUANT_FMPQ_H

#include "comet/model.h"
#include "comet/quantize.h"
#include "numerics/group.h"

/* Calibration statistics of every layer and group. */
typedef struct comet_calib_stats {
    int n_layer;
    int width[COMET_GROUP_LAYER_COUNT];  /* K of each group */
    float *sal[COMET_GROUP_LAYER_COUNT]; /* [n_layer, K] max |x| per channel */
    float *xtx[COMET_GROUP_LAYER_COUNT]; /* [n_layer, K, K] Σ xᵀx, or NULL when not collected */
    long n_tokens;                  /* tokens observed (per layer and group) */
} comet_calib_stats;

/* Allocate zeroed statistics for `cfg`; with_xtx also allocates the XᵀX sums (GPTQ).
 * NULL + COMET_ERR_NOMEM message on failure. */
comet_calib_stats *comet_calib_stats_init(const comet_model_config *cfg, int with_xtx);
void comet_calib_stats_free(comet_calib_stats *cs);

/* Record the input x [T, K] of group g in layer `layer`. */
void comet_calib_stats_observe(comet_calib_stats *cs, int layer, comet_group g, const float *x,
                               int T);

/* comet_fmpq_params and comet_fmpq_default_params are public (comet/quantize.h). */

/* Quantize `m` (fp32 F32 linears) in place with statistics `cs`. Afterwards every linear
 * is COMET_WFMT_QSIM, the embedding / lm_head are rounded to fp16 (w_bits <= 16), m->quant is set
 * (calibration fields left for the caller) and m->kv = m->quant->kv, p->kv resolved by
 * comet_kv_format_resolve (no base: the default policy). Logs one
 * progress line per layer. Returns COMET_ERR_INVALID_ARG (bad params, dims not
 * multiples of the block, GPTQ without XᵀX), COMET_ERR_NOMEM, COMET_ERR_INTERNAL
 * (GPTQ failure); on failure the model is partly converted and must be freed. */
comet_status comet_fmpq_quantize(comet_model *m, const comet_calib_stats *cs,
                                 const comet_fmpq_params *p);

#endif
