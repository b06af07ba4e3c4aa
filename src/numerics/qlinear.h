/* qlinear.h — simulated execution of a COMET_WFMT_QSIM linear (comet/model.h) on the CPU:
 * the fp32 quantize->dequantize model of the W4Ax GEMM with exactly docs/numerics.md's rounding.
 * The integer GEMM backends computes the same codes and scales; this path multiplies
 * their dequantized values instead, so perplexity and generation work on quantized
 * checkpoints without an integer backend. */
#ifndef COMET_NUMERICS_QLINEAR_H
#define COMET_NUMERICS_QLINEAR_H

#include "comet/model.h"

/* xq [T, K] = activations as the GEMM sees them: xq[t, k] = x[t, perm[k]] (identity when
 * perm is NULL), then, when lin->a_bits < 16, quantized->dequantized per token per block
 * (blocks 0..n8-1 INT8, the rest INT4). x [T, K]; xq must not alias x. */
void comet_qlinear_input(const comet_linear *lin, const float *x, int T, float *xq);

/* y [T, N] = comet_qlinear_input(x) · lin->wᵀ (OpenBLAS SGEMM). Allocates a [T, K]
 * scratch; returns COMET_ERR_NOMEM if that fails. lin->fmt must be COMET_WFMT_QSIM. */
comet_status comet_qlinear_sim(const comet_linear *lin, const float *x, int T, float *y);

#endif
