/* kv_cache.h — allocating the storage of the paged KV cache (backend/batch.h
 * comet_kv_cache) on a backend; the page allocator over it lives in engine/kv_pages.h.
 */
#ifndef COMET_BACKEND_KV_CACHE_H
#define COMET_BACKEND_KV_CACHE_H

#include "backend/backend.h"
#include "backend/batch.h"
#include "comet/status.h"

/* Allocate FP32 storage for n_pages pages of page_size tokens, all layers.
 * kv is caller-owned; returns COMET_ERR_NOMEM (named size) on failure. */
comet_status comet_kv_cache_init(comet_kv_cache *kv, int n_layer, int n_pages, int page_size,
                                 int n_head_kv, int head_dim);
/* Release the storage (the struct itself is the caller's). NULL or zeroed: no-op. */
void comet_kv_cache_free(comet_kv_cache *kv);

/* The KV pool of backend `be` (backend.h kv_init): n_pages pages of page_size tokens for
 * every layer, stored as `fmt` says (comet/kv_format.h: F16 unquantized, fp32 on the CPU,
 * fp16 on CUDA; INT8 / INT4 quantized per token per KV head in groups of fmt.group
 * channels, 0 = head_dim) after the rotation fmt.rotation. kv is caller-owned; release with
 * comet_kv_cache_free_on and the same backend. COMET_OK, COMET_ERR_INVALID_ARG (sizes, or
 * a format comet_kv_format_check refuses), COMET_ERR_UNSUPPORTED (a format the backend does
 * not store), COMET_ERR_NOMEM (size named), or the backend's failure. */
comet_status comet_kv_cache_init_on(comet_backend *be, comet_kv_cache *kv, int n_layer, int n_pages,
                                    int page_size, int n_head_kv, int head_dim,
                                    comet_kv_format fmt);
void comet_kv_cache_free_on(comet_backend *be, comet_kv_cache *kv);

#endif
