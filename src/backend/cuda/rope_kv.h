/* rope_kv.h — RoPE fused with the paged KV append (rope_kv.cu): the step op
 * rope_kv_append of backend.h on the CUDA backend.
 *
 * Plain C header, no CUDA types: streams travel as void * (a cudaStream_t). Every pointer
 * is device memory owned by the caller unless marked "host". Launchers run on the current
 * device, queue their kernels on `stream` and return COMET_OK, COMET_ERR_INVALID_ARG /
 * COMET_ERR_UNSUPPORTED for shapes they do not take, or COMET_ERR_CUDA naming the op when
 * a launch fails; errors inside a kernel surface at the next synchronizing call.
 */
#ifndef COMET_BACKEND_CUDA_ROPE_KV_H
#define COMET_BACKEND_CUDA_ROPE_KV_H

#include <stddef.h>
#include <stdint.h>

#include "backend/cuda/cuda_kv.h"
#include "comet/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* RoPE (rotate-half pairs (f, f + D/2), angle positions[t] * inv_freq[f] in double, cos
 * and sin rounded to float) on q [T, H, D] and k [T, Hkv, D] in place, then k and v
 * [T, Hkv, D] of every token written into `layer`'s pages of storage (layout L, cuda_kv.h)
 * at the token's position: rotated by the normalized Walsh-Hadamard transform when
 * `rotate` (comet_wht's butterfly order, D a power of two), then quantized per group like
 * comet_quant_kv_group (bit for bit the same codes, scales and zeros for the same input)
 * or stored as fp16. inv_freq [D/2] doubles. One kernel. */
comet_status comet_cuda_rope_kv_append(const comet_cuda_kv_layout *L, void *storage, int layer,
                                       const comet_cuda_step_view *st, const double *inv_freq,
                                       float *q, int H, float *k, const float *v, int rotate,
                                       void *stream);

#ifdef __cplusplus
}
#endif
#endif
