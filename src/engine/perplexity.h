/* perplexity.h — perplexity of a model on a token stream, exactly as NUMERICS.md
 * "Accuracy protocol": non-overlapping windows of ctx tokens, each evaluated from an
 * empty KV cache, every token but the first of a window scored, PPL = exp(mean NLL)
 * accumulated in double. Windows are prefilled in chunks so the logits buffer stays
 * [chunk, V]. Progress goes through comet_log_progress with the running PPL.
 */
#ifndef COMET_ENGINE_PERPLEXITY_H
#define COMET_ENGINE_PERPLEXITY_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "comet/model.h"

typedef struct comet_ppl_params {
    int ctx;         /* tokens per window (> 1) */
    int max_windows; /* evaluate at most this many windows; 0 = all full windows */
    int chunk;       /* tokens per prefill step (> 0) */
} comet_ppl_params;

/* ctx 2048, all windows, chunk 256. */
comet_ppl_params comet_ppl_default_params(void);

typedef struct comet_ppl_result {
    double ppl;      /* exp(nll_sum / n_scored) */
    double nll_sum;  /* sum of -log p(token), natural log */
    long n_scored;   /* tokens scored: windows * (ctx - 1) */
    int ctx;
    int windows;
} comet_ppl_result;

/* Perplexity over `tokens` [n_tokens] (BOS, if the model uses one, already at the start).
 * Only full windows are evaluated; a trailing partial window is dropped. Returns
 * COMET_OK, or COMET_ERR_INVALID_ARG when the text holds fewer than ctx tokens or ctx
 * exceeds the model's context (both numbers named). */
comet_status comet_perplexity(const comet_model *m, comet_backend *be, const int32_t *tokens,
                              size_t n_tokens, const comet_ppl_params *p, comet_ppl_result *out);

#endif
