/* rotate.h — rotating a floating-point model's residual stream, folded into its weights
 * (QuaRot / SpinQuant's offline rotation; docs/quantization.md "Residual rotation").
 */
#ifndef COMET_QUANT_ROTATE_H
#define COMET_QUANT_ROTATE_H

#include <stdint.h>

#include "comet/model.h"
#include "comet/status.h"

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

#endif
