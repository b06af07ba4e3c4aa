/* kv_cache.c — the KV page pool's storage on a backend (kv_cache.h). */
#include "backend/kv_cache.h"

#include <stdlib.h>
#include <string.h>

comet_status comet_kv_cache_init(comet_kv_cache *kv, int n_layer, int n_pages, int page_size,
                                 int n_head_kv, int head_dim) {
    memset(kv, 0, sizeof *kv);
    if (n_layer <= 0 || n_pages <= 0 || page_size <= 0 || n_head_kv <= 0 || head_dim <= 0)
        return comet_set_error(COMET_ERR_INVALID_ARG, "kv cache: sizes must be positive");
    size_t n = (size_t)n_layer * n_pages * page_size * n_head_kv * head_dim;
    kv->k = malloc(n * sizeof(float));
    kv->v = malloc(n * sizeof(float));
    if (!kv->k || !kv->v) {
        comet_kv_cache_free(kv);
        return comet_set_error(COMET_ERR_NOMEM,
                               "kv cache: cannot allocate 2 x %zu MiB for %d pages",
                               n * sizeof(float) >> 20, n_pages);
    }
    kv->n_layer = n_layer;
    kv->n_pages = n_pages;
    kv->page_size = page_size;
    kv->n_head_kv = n_head_kv;
    kv->head_dim = head_dim;
    return COMET_OK;
}

void comet_kv_cache_free(comet_kv_cache *kv) {
    if (!kv)
        return;
    free(kv->k);
    free(kv->v);
    memset(kv, 0, sizeof *kv);
}

comet_status comet_kv_cache_init_on(comet_backend *be, comet_kv_cache *kv, int n_layer, int n_pages,
                                    int page_size, int n_head_kv, int head_dim,
                                    comet_kv_format fmt) {
    memset(kv, 0, sizeof *kv);
    if (n_layer <= 0 || n_pages <= 0 || page_size <= 0 || n_head_kv <= 0 || head_dim <= 0)
        return comet_set_error(COMET_ERR_INVALID_ARG, "kv cache: sizes must be positive");
    COMET_TRY(comet_kv_format_check(&fmt, head_dim, "kv cache"));
    kv->n_layer = n_layer;
    kv->n_pages = n_pages;
    kv->page_size = page_size;
    kv->n_head_kv = n_head_kv;
    kv->head_dim = head_dim;
    kv->kv = fmt;
    comet_status st = be->ops->kv_init(be, kv);
    if (st < 0)
        memset(kv, 0, sizeof *kv);
    return st;
}

void comet_kv_cache_free_on(comet_backend *be, comet_kv_cache *kv) {
    if (!kv || !be)
        return;
    be->ops->kv_free(be, kv);
    memset(kv, 0, sizeof *kv);
}
