/* smooth.h — SmoothQuant's activation-to-weight migration, folded offline into a
 * floating-point model before FMPQ (docs/quantization.md "Smoothing").
 */
#ifndef COMET_QUANT_SMOOTH_H
#define COMET_QUANT_SMOOTH_H

#include "comet/model.h"
#include "comet/status.h"
#include "quant/fmpq.h"

/* For every layer and linear input group, s_j = max|X_j|^alpha / max|W_j|^(1 - alpha) (X's
 * maxima from cs); the group's weight columns are multiplied by s and its input divided
 * by s where the input is made (RMSNorm weights for qkv and gate_up, up_proj's rows for
 * down, v_proj's rows for o with one factor per KV head and dimension). cs is updated to
 * the smoothed model's statistics (salience / s, XᵀX / (s sᵀ)). In fp32 the logits are
 * unchanged. COMET_OK; COMET_ERR_INVALID_ARG (alpha outside [0, 1], a quantized model,
 * statistics of another shape or empty); COMET_ERR_NOMEM. */
comet_status comet_smooth(comet_model *m, comet_calib_stats *cs, float alpha);

#endif
