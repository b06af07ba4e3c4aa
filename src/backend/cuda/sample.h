/* sample.h — next-token sampling over logits rows in device memory (sample.cu), the kernel
 * behind the CUDA backend's op `sample` (backend.h). Plain C, callable from the host
 * compiler's files.
 */
#ifndef COMET_BACKEND_CUDA_SAMPLE_H
#define COMET_BACKEND_CUDA_SAMPLE_H

#include <stdint.h>

#include "backend/backend.h"
#include "comet/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Sample rows[r] (device array [n_rows]) from logits [*, V] (device; each sampled row is
 * modified: its listed ids adjusted) into ids[r] (device [n_rows]): the token,
 * COMET_SAMPLE_NONFINITE or COMET_SAMPLE_ON_HOST. adj (device) holds the rows' listed ids
 * (comet_sample_row adj_offset, n_adj; ids in [0, V)). Queued on `stream` (a cudaStream_t);
 * no allocation, no synchronization. COMET_OK, or COMET_ERR_CUDA when the launch failed;
 * COMET_ERR_INVALID_ARG for V < 1 or n_rows < 1. */
comet_status comet_cuda_sample(const comet_sample_row *rows, int n_rows, float *logits, int V,
                               const comet_sample_adj *adj, int32_t *ids, void *stream);

#ifdef __cplusplus
}
#endif

#endif
