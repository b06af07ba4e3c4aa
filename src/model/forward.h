/* forward.h — the LLaMA forward pass: one step over a ragged batch.
 *
 * The layer loop is written once (forward.c) and calls only the backend's op table, so
 * every backend runs the same model. A step takes tokens of several sequences at once —
 * prefill chunks and decode tokens mixed — described by a comet_batch whose page tables
 * point into a comet_kv_cache. The activation workspace is reserved at init for
 * max_batch_tokens tokens; a step allocates nothing.
 */
#ifndef COMET_MODEL_FORWARD_H
#define COMET_MODEL_FORWARD_H

#include "backend/backend.h"
#include "comet/model.h"
#include "model/batch.h"

typedef struct comet_forward_ctx comet_forward_ctx;

/* Bind a model to a backend with workspace for steps of up to max_batch_tokens tokens.
 * Both are borrowed and must outlive the context. NULL + comet_last_error() on failure:
 * COMET_ERR_UNSUPPORTED when the backend lacks an op of the layer loop ("backend 'cuda'
 * has no 'embed' op yet"), COMET_ERR_INVALID_ARG, COMET_ERR_NOMEM. */
comet_forward_ctx *comet_forward_init(const comet_model *m, comet_backend *be,
                                      int max_batch_tokens);
void comet_forward_free(comet_forward_ctx *fc);

int comet_forward_max_tokens(const comet_forward_ctx *fc);

/* Run one step: append the K/V of every token of `b` into `kv` (at the positions given by
 * b's page tables) and write logits [b->n_logits, V] for the rows b->logit_rows into
 * `logits` (host memory, may be NULL when n_logits == 0). Returns COMET_OK, or
 * COMET_ERR_INVALID_ARG (a token id out of the vocabulary, a step larger than the
 * workspace, a position beyond the KV pages given) with the problem named. */
comet_status comet_forward(comet_forward_ctx *fc, comet_kv_cache *kv, const comet_batch *b,
                           float *logits);

#endif
