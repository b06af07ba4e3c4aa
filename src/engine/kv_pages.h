/* kv_pages.h — the KV page pool: page allocator, per-sequence block tables,
 * and the step's batch descriptor built from them.
 *
 * Storage (comet_kv_cache, backend/batch.h, allocated through backend/kv_cache.h) and the
 * pool are sized once at start-up; a step never allocates. Pages are handed out from a free list; a sequence's block table
 * lists its pages in position order. When the pool cannot hold a step the allocator
 * answers COMET_KV_FULL (a soft status: the caller decides — wait, preempt, or fail) and
 * changes nothing. Pages carry reference counts so that sequences can share the full
 * pages of a common prefix (comet_kv_seq_share); a page returns to the free list when its
 * last holder releases it. Preemption policy lives in the engine (engine.c).
 */
#ifndef COMET_ENGINE_KV_PAGES_H
#define COMET_ENGINE_KV_PAGES_H

#include <stdint.h>

#include "backend/backend.h"
#include "backend/batch.h"
#include "backend/kv_cache.h"
#include "comet/status.h"

/* The page allocator: a stack of free page ids. */
typedef struct comet_kv_pool {
    int n_pages;
    int page_size; /* P */
    int n_free;
    int32_t *free_ids; /* [n_pages]; free_ids[0 .. n_free-1] are free */
    int32_t *refs;     /* [n_pages] block tables holding each page; 0 = free */
} comet_kv_pool;

comet_status comet_kv_pool_init(comet_kv_pool *pool, int n_pages, int page_size);
void comet_kv_pool_free(comet_kv_pool *pool);

/* One sequence's block table. */
typedef struct comet_kv_seq {
    int n_tokens;   /* positions reserved so far (KV written or about to be in this step) */
    int n_pages;    /* pages held */
    int max_pages;  /* capacity of `pages` */
    int32_t *pages; /* [max_pages] page ids in position order */
} comet_kv_seq;

/* A block table for up to max_tokens positions (capacity allocated here, once). */
comet_status comet_kv_seq_init(comet_kv_seq *seq, int max_tokens, int page_size);
void comet_kv_seq_free(comet_kv_seq *seq);

/* Reserve room for n more tokens at the end of seq (positions seq->n_tokens ..
 * seq->n_tokens + n - 1), taking pages from the pool as needed. All or nothing:
 * COMET_OK, or COMET_KV_FULL when the pool lacks free pages, or COMET_ERR_CONTEXT when
 * the sequence's table capacity would be exceeded; on either nothing changes. */
comet_status comet_kv_seq_reserve(comet_kv_pool *pool, comet_kv_seq *seq, int n);

/* Drop seq's hold on each of its pages (a page whose count reaches 0 returns to the
 * pool) and empty it (its capacity stays). */
void comet_kv_seq_release(comet_kv_pool *pool, comet_kv_seq *seq);

/* Make the empty `dst` start with the first n_tokens positions of `src`, sharing its
 * pages (reference counts + 1) instead of copying them. n_tokens must be a multiple of
 * the page size (a partly filled page would be written by both) and <= src->n_tokens.
 * COMET_OK, COMET_ERR_INVALID_ARG (named) or COMET_ERR_CONTEXT (dst too small). */
comet_status comet_kv_seq_share(comet_kv_pool *pool, comet_kv_seq *dst, const comet_kv_seq *src,
                                int n_tokens);

/* Builds one step's comet_batch from block tables. Arrays are sized once for
 * max_tokens tokens, max_seqs sequences and max_pages page entries in total. */
typedef struct comet_batch_builder {
    int max_tokens, max_seqs, max_pages, page_size;
    int32_t *tokens, *positions, *token_indptr, *page_indptr, *page_indices, *last_page_len;
    int32_t *logit_rows;
    comet_batch batch;
} comet_batch_builder;

comet_status comet_batch_builder_init(comet_batch_builder *bb, int max_tokens, int max_seqs,
                                      int max_pages, int page_size);
void comet_batch_builder_free(comet_batch_builder *bb);

/* Start an empty step. */
void comet_batch_builder_reset(comet_batch_builder *bb);

/* Add n tokens of `seq` to the step; they take the last n reserved positions of seq
 * (call comet_kv_seq_reserve(n) first). `logits`: 0 none, 1 the last token only, 2 every
 * token. Returns COMET_ERR_INVALID_ARG when the builder's capacity would be exceeded. */
comet_status comet_batch_builder_add(comet_batch_builder *bb, const comet_kv_seq *seq,
                                     const int32_t *tokens, int n, int logits);

#endif
