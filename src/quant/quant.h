/* quant.h — the FMPQ quantizer's steps (`comet quantize`): calibration statistics
 * (salience, XᵀX), channel reordering and the INT8 block choice, INT4/INT8 weight
 * quantization per output channel per block (RTN with a clipping search, and GPTQ). The
 * rounding primitives they share with the backends are in numerics/quant.h. It does not
 * run models: calibration (src/quant/calib.c) builds on this.
 *
 * Shape letters as in docs/numerics.md: T tokens, K input channels of a linear, N output
 * channels, B block size (channels). Every [T, K] array is row-major.
 */
#ifndef COMET_QUANT_QUANT_H
#define COMET_QUANT_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "comet/status.h"
#include "numerics/quant.h"

/* ---- Calibration statistics, reordering, INT8 block choice --------------------------- */

/* sal[k] = max(sal[k], max_t |x[t, k]|) for x [T, K]. */
void comet_quant_salience_update(float *sal, const float *x, int T, int K);

/* xtx [K, K] (full symmetric, row-major) += xᵀ x for x [T, K] (fp32 BLAS). */
void comet_quant_xtx_update(float *xtx, const float *x, int T, int K);

/* Block size for a model whose linears have input dims dims[0..n-1]: 128 when every dim
 * is a multiple of 128, else 64 when every dim is a multiple of 64; 0 if neither. */
int comet_quant_choose_block(const int *dims, int n);

/* The reordering and INT8 block choice of docs/numerics.md "Choosing INT8 blocks" for one
 * linear input group with K channels and block B (K % B == 0):
 * - reorder != 0: perm = channels sorted by salience, descending, ties by index
 *   (stable); reorder == 0: identity.
 * - n8 = the smallest number of leading blocks (in perm order) holding every channel whose
 *   salience exceeds tau * median(salience) (median of an even count: mean of the two
 *   middle values), capped at floor(budget * K/B + 1e-6) blocks.
 * perm [K]: x'[k] = x[perm[k]]. Returns COMET_ERR_INVALID_ARG for bad sizes or a budget
 * outside [0, 1]. */
comet_status comet_quant_reorder(const float *sal, int K, int B, float tau, float budget,
                                 int reorder, int32_t *perm, int *n8);

/* ---- Weights (docs/numerics.md "Weights") ------------------------------------------------- */

/* Clipping search grid: ratios 1.0, 0.98, ..., down to this (inclusive). */
#define COMET_QUANT_CLIP_MIN 0.50f
#define COMET_QUANT_CLIP_STEPS 26

/* Symmetric per-output-channel per-block quantization of w [N, K] (columns in the
 * permuted input order) to `bits` (4: codes [-8, 7]; 8: codes [-128, 127]) with blocks
 * of B input channels (K % B == 0; B = K gives one scale per output channel).
 * Round to nearest; with clip_search, each (n, b) scale is r * amax / qmax for the ratio
 * r of the grid above minimizing that block's squared error (ties: larger r). Scales are
 * fp16: q [N, K] codes (one per byte), s [N, K/B] fp16 bit patterns. Returns
 * COMET_ERR_INVALID_ARG for bad sizes/bits. */
comet_status comet_quant_w_rtn(const float *w, int N, int K, int B, int bits, int clip_search,
                               int8_t *q, uint16_t *s);

/* The fp16 scale (bit pattern) of one weight block w[n] with codes [-qmax-1, qmax]: amax/qmax
 * rounded up to fp16 (so no weight clips: |w - q*s| <= s/2, also where the scale is an fp16
 * subnormal, and a block too small for any fp16 scale gets the smallest, 2^-24), or with
 * clip_search the grid ratio r minimizing sum (w - q*s)^2 (r = 1: that scale; r < 1:
 * fp16(r*amax/qmax), to nearest). An all-zero block gives 0. A block holding a non-finite
 * weight, or whose amax/qmax exceeds 65504, gives COMET_QUANT_F16_NAN: the callers refuse
 * it (comet_quant_w_rtn, comet_quant_w_gptq). */
uint16_t comet_quant_w_block_scale(const float *w, int n, int qmax, int clip_search);

/* The same with the squared errors weighted: sum h[i] (w[i] - q[i]*s)^2 (h NULL: all 1). */
uint16_t comet_quant_w_block_scale_weighted(const float *w, const float *h, int n, int qmax,
                                            int clip_search);

/* COMET_OK unless sh (the scale comet_quant_w_block_scale gave block b of output channel n,
 * weights wb [B]) is COMET_QUANT_F16_NAN; then COMET_ERR_INVALID_ARG naming the channel, the
 * block and why (a non-finite weight, or the scale fp16 cannot hold), prefixed by `what`. */
comet_status comet_quant_w_scale_check(uint16_t sh, const float *wb, int B, int qmax, int n, int b,
                                       const char *what);

/* GPTQ (Frantar et al. 2022) of w [N, K] against the Hessian of the calibration inputs:
 * xtx [K, K] = Σ xᵀx over calibration tokens, in the same (permuted) channel order as w's
 * columns. Columns are quantized in order with lazy batch updates (batch of
 * max(B, 128) columns rounded to a multiple of B); each block's scales are chosen (with
 * the clipping search when clip_search) from the error-updated weights when the block's
 * first column is reached; the search weighs column i's squared error by 1/U_ii² (U the
 * upper Cholesky factor of H⁻¹), GPTQ's own loss for that column. Damping: damp * mean(diag) added to the diagonal (damp 0.01
 * is the usual choice), raised tenfold up to 3 times if the Cholesky factorization
 * (LAPACKE_dpotrf/dpotri) fails. Channels never seen (diag 0) get diag 1.
 * Writes q [N, K] and s [N, K/B] like comet_quant_w_rtn. Returns COMET_ERR_NOMEM,
 * COMET_ERR_INVALID_ARG, or COMET_ERR_INTERNAL if H stays singular. */
comet_status comet_quant_w_gptq(const float *w, int N, int K, const float *xtx, int B, int bits,
                                float damp, int clip_search, int8_t *q, uint16_t *s);

#endif
