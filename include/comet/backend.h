/* comet/backend.h — the hardware a model runs on, chosen by device name.
 *
 * A backend holds its own copy of a model's weights and its own KV cache; one is opened
 * per device and handed to the runs that use it (comet_perplexity, comet_generate,
 * comet_bench; the serving engine opens its own from comet_engine_params.device). The
 * struct is opaque: its op table is internal (src/backend/backend.h).
 */
#ifndef COMET_BACKEND_H
#define COMET_BACKEND_H

#include "comet/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct comet_backend comet_backend;

/* The backend named `device`: "cpu" (NULL too: the threaded CPU backend with n_threads
 * worker threads, <= 0 meaning all cores), "cpu-ref" (the scalar single-threaded oracle),
 * "cuda" (GPU 0) or "cuda:N" (GPU N). A backend is driven by one thread at a time.
 * Returns a backend owned by the caller (comet_backend_free), or NULL + comet_last_error():
 * COMET_ERR_INVALID_ARG for another name, COMET_ERR_UNSUPPORTED for a build without CUDA,
 * COMET_ERR_CUDA when no usable GPU answers, COMET_ERR_NOMEM. */
comet_backend *comet_backend_open(const char *device, int n_threads);

/* The CPU threads each of `tensor_parallel` ranks gets out of n_threads in all (<= 0: all
 * cores): n_threads / tensor_parallel, at least 1; n_threads itself for tensor_parallel 0.
 * Open rank 0's CPU backend with this count: the other ranks take the same. */
int comet_backend_rank_threads(int n_threads, int tensor_parallel);

/* Release a backend. NULL is a no-op. */
void comet_backend_free(comet_backend *be);

/* 1 (on) or 0 (off, the default): every token's arithmetic is the same whatever else is
 * in its step and however its sequence was cut into prefill chunks, bit for bit
 * (docs/numerics.md "Reproducibility"); slower on the GPU, free on the CPU, which always
 * is. Set before the backend's first step. NULL is a no-op. */
void comet_backend_set_batch_invariant(comet_backend *be, int on);

/* 1 (on) or 0 (off, the default): the threaded CPU backend runs a W4Ax checkpoint by the
 * fp32 simulation of its quantization (the accuracy reference) instead of on its INT4 codes
 * with integer dot products. The model must then hold its dequantized weights
 * (comet_model_load, not keep_codes_only). Set before the model's weights are loaded on the
 * backend. Ignored by the other backends (cpu-ref always simulates; CUDA runs the codes).
 * NULL is a no-op. */
void comet_backend_set_simulate(comet_backend *be, int on);

/* The CPU worker threads the backend runs with (1 for a GPU backend's host side). */
int comet_backend_n_threads(const comet_backend *be);

#ifdef __cplusplus
}
#endif
#endif
