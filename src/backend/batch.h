/* batch.h — one forward step's batch descriptor and the paged KV cache.
 *
 * A step runs tokens of several sequences at once: prefill chunks and decode tokens
 * alike (chunked prefill). The vocabulary is FlashInfer's: a ragged token batch
 * described by token_indptr, and per-sequence page tables (block tables) described by
 * page_indptr / page_indices / last_page_len. See docs/architecture.md "Batches and the KV
 * cache". This header holds data layouts only; the page manager that hands out pages
 * lives in src/engine.
 */
#ifndef COMET_BACKEND_BATCH_H
#define COMET_BACKEND_BATCH_H

#include <stddef.h>
#include <stdint.h>

#include "comet/model.h"

/* The batch of one step. Token t belongs to sequence s when
 * token_indptr[s] <= t < token_indptr[s+1]; tokens of a sequence are consecutive
 * positions. After this step's K/V append, sequence s holds
 * kv_len(s) = (page_indptr[s+1] - page_indptr[s] - 1) * page_size + last_page_len[s]
 * tokens, and the KV of position p sits in page page_indices[page_indptr[s] + p / P] at
 * slot p % P. Token t attends to positions 0..positions[t] of its own sequence (causal).
 * All arrays are borrowed; the caller keeps them alive for the step. */
typedef struct comet_batch {
    int n_tokens; /* T */
    int n_seqs;
    const int32_t *tokens;        /* [T] token ids */
    const int32_t *positions;     /* [T] absolute position of each token in its sequence */
    const int32_t *token_indptr;  /* [n_seqs + 1] */
    const int32_t *page_indptr;   /* [n_seqs + 1] */
    const int32_t *page_indices;  /* [page_indptr[n_seqs]] page ids, in position order */
    const int32_t *last_page_len; /* [n_seqs] tokens in each sequence's last page, 1..P */
    int n_logits;                 /* rows of logits wanted */
    const int32_t *logit_rows;    /* [n_logits] token indices t whose logits are computed */
} comet_batch;

/* The KV cache storage: a pool of pages shared by all sequences. A page id covers one
 * page in every layer (vLLM-style). The storage belongs to the backend that made it
 * (backend.h kv_init). CPU backends: fp32, per layer
 *   k[layer][page][slot][Hkv][D], v likewise,
 * holding quantized->dequantized values when kv_bits is 4 or 8 (the simulation: cpu-ref, or
 * the threaded backend with simulate set); the threaded backend otherwise keeps 4- or 8-bit
 * caches as codes in host `storage` (k, v NULL), in the CUDA layout (cpu/cpu_kv4.h). CUDA:
 * `storage` in device memory, the codes with their fp16 scale and zero
 * (src/backend/cuda/cuda_kv.h). */
typedef struct comet_kv_cache {
    int n_layer;
    int n_pages;   /* pool size */
    int page_size; /* P tokens per page */
    int n_head_kv; /* Hkv */
    int head_dim;  /* D */
    float *k;      /* [n_layer, n_pages, P, Hkv, D] */
    float *v;      /* [n_layer, n_pages, P, Hkv, D] */
    /* The storage format, set from the model's by whoever sets up the cache. bits 0 or 16:
     * stored as given; 4 or 8: kv_append quantizes->dequantizes each token's K/V per KV head
     * (docs/numerics.md "KV cache", simulated in fp32 on the CPU). rotation hadamard:
     * kv_append stores H_D·k and H_D·v per KV head (then quantizes them) and attention uses
     * H_D·q and rotates its output back by H_D; D must be a power of two. */
    comet_kv_format kv;
    void *storage; /* a non-CPU backend's page storage (NULL on the CPU) */
    size_t storage_bytes;
} comet_kv_cache;

/* Tokens held by sequence s of batch b after the step's append (see comet_batch). */
static inline int comet_batch_kv_len(const comet_batch *b, int page_size, int s) {
    return (b->page_indptr[s + 1] - b->page_indptr[s] - 1) * page_size + b->last_page_len[s];
}

/* Float offset into kv->k / kv->v of position `pos` of sequence s of batch b, KV head
 * `kvh`, channel 0, in `layer`. */
static inline size_t comet_kv_offset(const comet_kv_cache *kv, int layer, const comet_batch *b,
                                     int s, int pos, int kvh) {
    int page = b->page_indices[b->page_indptr[s] + pos / kv->page_size];
    return ((((size_t)layer * kv->n_pages + page) * kv->page_size + pos % kv->page_size) *
                kv->n_head_kv +
            kvh) *
           kv->head_dim;
}

#endif
