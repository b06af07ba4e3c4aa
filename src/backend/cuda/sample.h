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
 * modified: penalties applied) into ids[r] (device [n_rows]): the token,
 * COMET_SAMPLE_NONFINITE or COMET_SAMPLE_ON_HOST. pen_ids / pen_counts (device) hold the
 * rows' penalty pairs (comet_sample_row pen_offset, n_pen). Queued on `stream` (a
 * cudaStream_t); no allocation, no synchronization. COMET_OK, or COMET_ERR_CUDA when the
 * launch failed; COMET_ERR_INVALID_ARG for V < 1 or n_rows < 1. */
comet_status comet_cuda_sample(const comet_sample_row *rows, int n_rows, float *logits, int V,
                               const int32_t *pen_ids, const int32_t *pen_counts, int32_t *ids,
                               void *stream);

#ifdef __cplusplus
}
#endif

#endif
