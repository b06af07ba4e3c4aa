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
#include "backend/batch.h"
#include "comet/model.h"

typedef struct comet_forward_ctx comet_forward_ctx;

/* Bind a model to a backend: load the backend's copy of the weights and reserve workspace
 * for steps of up to max_batch_tokens tokens (plus, on a backend whose memory is not the
 * host's, a [max_batch_tokens, V] fp32 logits buffer there). m and be are borrowed and must
 * outlive the context. NULL + comet_last_error() on failure: COMET_ERR_UNSUPPORTED when the
 * backend lacks an op of the layer loop ("backend 'x' has no 'matmul' op yet") or cannot
 * hold a weight format, COMET_ERR_INVALID_ARG, COMET_ERR_NOMEM, COMET_ERR_CUDA. */
comet_forward_ctx *comet_forward_init(const comet_model *m, comet_backend *be,
                                      int max_batch_tokens);
void comet_forward_free(comet_forward_ctx *fc);

int comet_forward_max_tokens(const comet_forward_ctx *fc);

/* What fc holds in its backend's memory: *weights_bytes the device memory its weights took
 * (the drop in the device's free memory across weights_load, so it is a measurement that
 * counts allocation granularity; 0 on a backend whose memory is the host's, whose weights
 * are the model's own arrays), *workspace_bytes the activation and logits buffers as
 * allocated (comet_forward_workspace_bytes). */
void comet_forward_memory(const comet_forward_ctx *fc, size_t *weights_bytes,
                          size_t *workspace_bytes);

/* The workspace bytes comet_forward_init allocates for model m and max_batch_tokens rows
 * (host_memory: the backend's ops->host_memory, which drops the device logits buffer). For
 * planning memory before a context exists. */
size_t comet_forward_workspace_bytes(const comet_model *m, int max_batch_tokens,
                                     int host_memory);

/* The logits buffer [max_batch_tokens, V] fp32 in the backend's memory, which the latest
 * step filled (rows 0 .. n_logits - 1); NULL on a backend whose memory is the host's. */
const float *comet_forward_logits(const comet_forward_ctx *fc);

/* The backend the context runs on (borrowed). */
comet_backend *comet_forward_backend(const comet_forward_ctx *fc);

/* Tensor parallelism (engine/tp.h): fc runs one rank's shard (model/shard.h) and calls the
 * collectives of `comm` (borrowed; the rank's endpoint) inside each step: an all-reduce of
 * the embeddings (each rank embeds the tokens of its vocabulary rows), one of down_proj's
 * partial sums, for o_proj either a gather of every rank's attention heads before a whole
 * o_proj (att_cols [ranks + 1]: rank r's columns of the [T, H*D] attention output,
 * comet_shard_att_cols) or, with att_cols NULL (o_proj split by input rows like down_proj),
 * an all-reduce of its partial sums, and a gather of the lm_head's logits on rank 0
 * (vocab_cols [ranks + 1], comet_shard_vocab_cols). Rank 0's logits buffer then holds the
 * whole vocabulary; the other ranks return no logits. Every rank of the group must run the
 * same steps. comm, att_cols and vocab_cols are borrowed and must outlive fc. COMET_OK,
 * COMET_ERR_INVALID_ARG (columns or rows that do not match the rank's shard, an input
 * observer set), COMET_ERR_NOMEM. */
struct comet_comm;
comet_status comet_forward_set_comm(comet_forward_ctx *fc, struct comet_comm *comm,
                                    const int *att_cols, const int *vocab_cols);

/* A profiler hook: comet_forward calls fn(user, "op name") before each op of a step and
 * fn(user, NULL) after the last, so fn can close the previous op's interval (e.g. sync the
 * backend and read a clock). The names are the step ops' (backend.h), matmul with
 * its role ("matmul q"), and "logits download". NULL turns it off. */
typedef void (*comet_forward_op_fn)(void *user, const char *op);
void comet_forward_set_profiler(comet_forward_ctx *fc, comet_forward_op_fn fn, void *user);

/* An observer of the linears' inputs (calibration): comet_forward calls fn(user, layer, g, x,
 * T) in every layer with the input of group g (QKV, O, GATE_UP, DOWN) before its matmul:
 * x [T, K] fp32 in host memory, K the group's input width, in the model's channel order;
 * borrowed for the call. Only a floating-point model (no quantized linear) on a backend
 * whose memory is the host's has such inputs: otherwise COMET_ERR_UNSUPPORTED naming why,
 * and nothing is set. NULL turns it off (COMET_OK). */
typedef void (*comet_forward_input_fn)(void *user, int layer, comet_group g, const float *x, int T);
comet_status comet_forward_set_input_observer(comet_forward_ctx *fc, comet_forward_input_fn fn,
                                              void *user);

/* Run one step: append the K/V of every token of `b` (host arrays) into `kv` (at the
 * positions given by b's page tables) and write logits [b->n_logits, V] for the rows
 * b->logit_rows into `logits` (host memory). logits may be NULL when n_logits == 0, or on a
 * backend whose memory is not the host's: the rows then stay in comet_forward_logits for
 * the backend's op `sample`, and the call returns once the step is queued. Otherwise it
 * returns when the step is done. COMET_OK, or COMET_ERR_INVALID_ARG (a token id out of the vocabulary, a
 * step larger than the workspace, a position beyond the KV pages given, a KV cache of
 * another backend) with the problem named; a backend's failure (COMET_ERR_CUDA, ...). */
comet_status comet_forward(comet_forward_ctx *fc, comet_kv_cache *kv, const comet_batch *b,
                           float *logits);

/* The checks comet_forward makes of a step before it runs any op: COMET_OK, or
 * COMET_ERR_INVALID_ARG naming the problem (the errors listed above). */
comet_status comet_forward_check_batch(const comet_forward_ctx *fc, const comet_kv_cache *kv,
                                       const comet_batch *b);

#endif
