/* rotate.h — rotating a floating-point model's residual stream, folded into its weights
 * (QuaRot / SpinQuant's offline rotation; docs/quantization.md "Residual rotation").
 */
#ifndef COMET_QUANT_ROTATE_H
#define COMET_QUANT_ROTATE_H

#include <stdint.h>

#include "comet/model.h"
#include "comet/status.h"
#include "quant/fmpq.h"

/* q_out [n, n] (row-major) = a random orthogonal matrix, uniformly distributed, the same
 * for a seed on every machine (a QR of a seeded Gaussian matrix, in double). COMET_OK,
 * COMET_ERR_NOMEM, COMET_ERR_INTERNAL (LAPACK failed). */
comet_status comet_rotation_orthogonal(int n, uint64_t seed, float *q_out);

/* Rewrite m (floating point, every linear plain fp32) in place so that its residual
 * stream is rotated by comet_rotation_orthogonal(n_embd, seed): every RMSNorm weight is
 * folded into the linears that read it and set to 1, the embedding and the linears that
 * read the stream (q, k, v, gate, up, lm_head) are multiplied by Q on the right, o and
 * down by Qᵀ on the left. The logits are those of the original model up to fp32
 * rounding. A tied lm_head becomes a separate array (owned by m; cfg.tie_embeddings 0).
 * COMET_OK; COMET_ERR_INVALID_ARG for a quantized model or a missing weight;
 * COMET_ERR_NOMEM. */
comet_status comet_rotate_residual(comet_model *m, uint64_t seed);

/* The same with Q the identity on the residual channels keep[0..n_keep) (distinct, in
 * 0..n_embd-1) and comet_rotation_orthogonal(n_embd - n_keep, seed) on the others, in
 * their index order: outlier channels left where FMPQ's INT8 blocks take them, the rest
 * spread. n_keep 0 is comet_rotate_residual. COMET_ERR_INVALID_ARG also for a bad keep
 * list. */
comet_status comet_rotate_residual_keeping(comet_model *m, uint64_t seed, const int *keep,
                                           int n_keep);

/* The n_keep residual channels with the largest activation outliers, from statistics cs
 * of m before any rotation: for each layer and each group that reads the residual stream
 * (qkv, gate_up), a channel's salience divided by |its RMSNorm weight| (the norm is folded
 * away by the rotation) and by the median over channels; a channel's score is its largest
 * over those. keep_out [n_keep] gets them, largest first. */
void comet_rotation_outliers(const comet_model *m, const comet_calib_stats *cs, int n_keep,
                             int *keep_out);

#endif
