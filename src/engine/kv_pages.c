/* kv_pages.c — the page allocator, block tables and the batch builder (see kv_pages.h). */
#include "engine/kv_pages.h"

#include <stdlib.h>
#include <string.h>

comet_status comet_kv_pool_init(comet_kv_pool *pool, int n_pages, int page_size) {
    memset(pool, 0, sizeof *pool);
    if (n_pages <= 0 || page_size <= 0)
        return comet_set_error(COMET_ERR_INVALID_ARG, "kv pool: sizes must be positive");
    pool->free_ids = malloc((size_t)n_pages * sizeof *pool->free_ids);
    pool->refs = calloc((size_t)n_pages, sizeof *pool->refs);
    if (!pool->free_ids || !pool->refs) {
        comet_kv_pool_free(pool);
        return comet_set_error(COMET_ERR_NOMEM, "kv pool: out of memory");
    }
    pool->n_pages = n_pages;
    pool->page_size = page_size;
    pool->n_free = n_pages;
    /* lowest ids handed out first */
    for (int i = 0; i < n_pages; i++)
        pool->free_ids[i] = n_pages - 1 - i;
    return COMET_OK;
}

void comet_kv_pool_free(comet_kv_pool *pool) {
    if (!pool)
        return;
    free(pool->free_ids);
    free(pool->refs);
    memset(pool, 0, sizeof *pool);
}

comet_status comet_kv_seq_init(comet_kv_seq *seq, int max_tokens, int page_size) {
    memset(seq, 0, sizeof *seq);
    if (max_tokens <= 0 || page_size <= 0)
        return comet_set_error(COMET_ERR_INVALID_ARG, "kv seq: sizes must be positive");
    seq->max_pages = (max_tokens + page_size - 1) / page_size;
    seq->pages = malloc((size_t)seq->max_pages * sizeof *seq->pages);
    if (!seq->pages)
        return comet_set_error(COMET_ERR_NOMEM, "kv seq: out of memory");
    return COMET_OK;
}

void comet_kv_seq_free(comet_kv_seq *seq) {
    if (!seq)
        return;
    free(seq->pages);
    memset(seq, 0, sizeof *seq);
}

comet_status comet_kv_seq_reserve(comet_kv_pool *pool, comet_kv_seq *seq, int n) {
    COMET_ASSERT(n >= 0);
    int P = pool->page_size;
    int need = (seq->n_tokens + n + P - 1) / P - seq->n_pages;
    if (seq->n_pages + need > seq->max_pages)
        return comet_set_error(COMET_ERR_CONTEXT,
                               "kv seq: %d tokens exceed the sequence's capacity of %d",
                               seq->n_tokens + n, seq->max_pages * P);
    if (need > pool->n_free)
        return COMET_KV_FULL;
    for (int i = 0; i < need; i++) {
        int32_t id = pool->free_ids[--pool->n_free];
        COMET_ASSERT(pool->refs[id] == 0);
        pool->refs[id] = 1;
        seq->pages[seq->n_pages++] = id;
    }
    seq->n_tokens += n;
    return COMET_OK;
}

void comet_kv_seq_release(comet_kv_pool *pool, comet_kv_seq *seq) {
    for (int i = seq->n_pages - 1; i >= 0; i--) {
        int32_t id = seq->pages[i];
        COMET_ASSERT(pool->refs[id] > 0);
        if (--pool->refs[id] == 0) {
            COMET_ASSERT(pool->n_free < pool->n_pages);
            pool->free_ids[pool->n_free++] = id;
        }
    }
    seq->n_pages = 0;
    seq->n_tokens = 0;
}

comet_status comet_kv_seq_share(comet_kv_pool *pool, comet_kv_seq *dst, const comet_kv_seq *src,
                                int n_tokens) {
    int P = pool->page_size;
    if (dst->n_pages || dst->n_tokens)
        return comet_set_error(COMET_ERR_INVALID_ARG, "kv seq share: the destination is not empty");
    if (n_tokens < 0 || n_tokens > src->n_tokens || n_tokens % P)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "kv seq share: %d tokens; want a multiple of the page size %d up "
                               "to the source's %d tokens",
                               n_tokens, P, src->n_tokens);
    int n = n_tokens / P;
    if (n > dst->max_pages)
        return comet_set_error(COMET_ERR_CONTEXT,
                               "kv seq share: %d tokens exceed the destination's capacity of %d",
                               n_tokens, dst->max_pages * P);
    for (int i = 0; i < n; i++) {
        COMET_ASSERT(pool->refs[src->pages[i]] > 0);
        pool->refs[src->pages[i]]++;
        dst->pages[i] = src->pages[i];
    }
    dst->n_pages = n;
    dst->n_tokens = n_tokens;
    return COMET_OK;
}

comet_status comet_batch_builder_init(comet_batch_builder *bb, int max_tokens, int max_seqs,
                                      int max_pages, int page_size) {
    memset(bb, 0, sizeof *bb);
    bb->max_tokens = max_tokens;
    bb->max_seqs = max_seqs;
    bb->max_pages = max_pages;
    bb->page_size = page_size;
    bb->tokens = malloc((size_t)max_tokens * sizeof(int32_t));
    bb->positions = malloc((size_t)max_tokens * sizeof(int32_t));
    bb->logit_rows = malloc((size_t)max_tokens * sizeof(int32_t));
    bb->token_indptr = malloc((size_t)(max_seqs + 1) * sizeof(int32_t));
    bb->page_indptr = malloc((size_t)(max_seqs + 1) * sizeof(int32_t));
    bb->last_page_len = malloc((size_t)max_seqs * sizeof(int32_t));
    bb->page_indices = malloc((size_t)max_pages * sizeof(int32_t));
    if (!bb->tokens || !bb->positions || !bb->logit_rows || !bb->token_indptr || !bb->page_indptr ||
        !bb->last_page_len || !bb->page_indices) {
        comet_batch_builder_free(bb);
        return comet_set_error(COMET_ERR_NOMEM, "batch builder: out of memory");
    }
    comet_batch_builder_reset(bb);
    return COMET_OK;
}

void comet_batch_builder_free(comet_batch_builder *bb) {
    if (!bb)
        return;
    free(bb->tokens);
    free(bb->positions);
    free(bb->logit_rows);
    free(bb->token_indptr);
    free(bb->page_indptr);
    free(bb->last_page_len);
    free(bb->page_indices);
    memset(bb, 0, sizeof *bb);
}

void comet_batch_builder_reset(comet_batch_builder *bb) {
    bb->token_indptr[0] = 0;
    bb->page_indptr[0] = 0;
    bb->batch = (comet_batch){
        .tokens = bb->tokens,
        .positions = bb->positions,
        .token_indptr = bb->token_indptr,
        .page_indptr = bb->page_indptr,
        .page_indices = bb->page_indices,
        .last_page_len = bb->last_page_len,
        .logit_rows = bb->logit_rows,
    };
}

comet_status comet_batch_builder_add(comet_batch_builder *bb, const comet_kv_seq *seq,
                                     const int32_t *tokens, int n, int logits) {
    comet_batch *b = &bb->batch;
    int s = b->n_seqs, T = b->n_tokens, np = b->page_indptr[s];
    COMET_ASSERT(n > 0 && n <= seq->n_tokens);
    COMET_ASSERT(seq->n_pages == (seq->n_tokens + bb->page_size - 1) / bb->page_size);
    if (s + 1 > bb->max_seqs || T + n > bb->max_tokens || np + seq->n_pages > bb->max_pages)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "batch builder: step exceeds its capacity (%d tokens, %d seqs, %d "
                               "pages)",
                               bb->max_tokens, bb->max_seqs, bb->max_pages);
    int first = seq->n_tokens - n;
    for (int i = 0; i < n; i++) {
        bb->tokens[T + i] = tokens[i];
        bb->positions[T + i] = first + i;
        if (logits == 2 || (logits == 1 && i == n - 1))
            bb->logit_rows[b->n_logits++] = T + i;
    }
    memcpy(bb->page_indices + np, seq->pages, (size_t)seq->n_pages * sizeof(int32_t));
    bb->token_indptr[s + 1] = T + n;
    bb->page_indptr[s + 1] = np + seq->n_pages;
    bb->last_page_len[s] = seq->n_tokens - (seq->n_pages - 1) * bb->page_size;
    b->n_seqs = s + 1;
    b->n_tokens = T + n;
    return COMET_OK;
}
