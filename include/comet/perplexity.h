/* comet/perplexity.h — perplexity of a model on a token stream. Two protocols:
 *
 * - COMET_PPL_COMET (docs/numerics.md "Accuracy protocol"): non-overlapping windows of ctx
 *   tokens, each evaluated from an empty KV cache, every token but the first of a window
 *   scored. For a model that adds BOS (bos_id >= 0) each window is BOS followed by the next
 *   ctx - 1 text tokens, all of them scored (transformers' fixed-length evaluation).
 * - COMET_PPL_LLAMA_CPP (llama.cpp's llama-perplexity): the stream is BOS (when the model
 *   adds one) and the text, cut into chunks of ctx tokens, each from an empty cache; a
 *   model that adds BOS gets BOS in place of each chunk's first token; only the second half
 *   is scored (positions ctx/2 .. ctx-2 predict the next token: ctx - 1 - ctx/2 a chunk);
 *   at least two chunks of text are required, as there.
 *
 * PPL = exp(mean NLL) accumulated in double. Windows are prefilled in chunks so the logits
 * buffer stays [chunk, V]. Progress goes through comet_log_progress with the running PPL.
 */
#ifndef COMET_PERPLEXITY_H
#define COMET_PERPLEXITY_H

#include <stddef.h>
#include <stdint.h>

#include "comet/backend.h"
#include "comet/model.h"
#include "comet/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum comet_ppl_protocol {
    COMET_PPL_COMET = 0,
    COMET_PPL_LLAMA_CPP = 1,
} comet_ppl_protocol;

typedef struct comet_ppl_params {
    int ctx;         /* tokens per window (> 1; > 3 for llama.cpp's) */
    int max_windows; /* evaluate at most this many windows; 0 = all full windows */
    int chunk;       /* tokens per prefill step (> 0) */
    comet_ppl_protocol protocol;
    int bos_id;          /* the BOS id when the model adds one (protocols above), else -1 */
    int tensor_parallel; /* 0 (default): one device; N >= 1: the model split over N devices
                          * of the backend's kind (tensor parallelism: cuda:d..d+N-1, or N CPU
                          * ranks); N <= COMET_MAX_TENSOR_PARALLEL */
    comet_kv_format kv;  /* the KV cache to simulate, on top of the model's m->kv
                          * (comet_kv_format_resolve): type -1 = the model's; group 0 and
                          * rotation -1 = automatic (the model's, or the default policy where
                          * a quantized cache is asked of a model without one) */
} comet_ppl_params;

/* ctx 2048, all windows, chunk 256, comet's protocol, bos_id -1, the model's KV format
 * (kv {-1, 0, -1}). */
comet_ppl_params comet_ppl_default_params(void);

typedef struct comet_ppl_result {
    double ppl;     /* exp(nll_sum / n_scored) */
    double nll_sum; /* sum of -log p(token), natural log */
    long n_scored; /* tokens scored: windows * (ctx - 1), llama.cpp's windows * (ctx - 1 - ctx/2) */
    int ctx;
    int windows;
} comet_ppl_result;

/* Perplexity of `m` (borrowed) on `be` over the text's `tokens` [n_tokens] ids, without
 * BOS: p->bos_id places it per the protocol. (With bos_id -1 and comet's protocol the
 * tokens are windowed as given, so a caller may also pass a stream it made itself.) Only
 * full windows are evaluated; a trailing partial window is dropped. The model runs with
 * the KV format p->kv resolved against m->kv; m is not changed. Fills *out and returns
 * COMET_OK, or COMET_ERR_INVALID_ARG when the text holds fewer tokens than one window (two
 * for llama.cpp's protocol), ctx exceeds the model's context, tensor_parallel is out of
 * range (the numbers named) or p->kv is a format the model's head dim cannot take
 * (comet_kv_format_check's message), or the error of a failed step
 * (COMET_ERR_NOMEM, COMET_ERR_CUDA, ...). */
comet_status comet_perplexity(const comet_model *m, comet_backend *be, const int32_t *tokens,
                              size_t n_tokens, const comet_ppl_params *p, comet_ppl_result *out);

#ifdef __cplusplus
}
#endif
#endif
