/* generate.h — one-shot generation: prompt ids -> chunked prefill -> decode loop ->
 * streamed text.
 *
 * Everything the loop needs (KV pages for prompt + max_tokens, the forward workspace,
 * the sampler, history and text buffers) is allocated before the first step; the decode
 * loop allocates nothing. Text goes through the streaming detokenizer (complete UTF-8
 * characters only) and is held back while it could still be the start of a stop string,
 * so a stop string never reaches the callback.
 */
#ifndef COMET_ENGINE_GENERATE_H
#define COMET_ENGINE_GENERATE_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "comet/model.h"
#include "engine/sampler.h"

typedef struct comet_gen_params {
    int max_tokens; /* new tokens at most (> 0) */
    comet_sampler_params sampling;
    const char *const *stop; /* [n_stop] stop strings (not emitted); may be NULL */
    int n_stop;
    int prefill_chunk; /* prompt tokens per prefill step (> 0) */
    int ignore_eos;    /* keep going past EOS ids (benchmarks) */
} comet_gen_params;

/* max_tokens 256, default sampling, no stop strings, prefill_chunk 512. */
comet_gen_params comet_gen_default_params(void);

typedef enum comet_stop_reason {
    COMET_STOP_EOS,       /* the model produced one of cfg.eos_ids */
    COMET_STOP_STRING,    /* a stop string appeared */
    COMET_STOP_LENGTH,    /* max_tokens, or the model's context is full */
    COMET_STOP_CANCELLED, /* the callback asked to stop */
    COMET_STOP_REASON_COUNT
} comet_stop_reason;

typedef struct comet_gen_stats {
    int n_prompt;       /* prompt tokens prefilled */
    int n_generated;    /* tokens sampled (including a final EOS) */
    int n_decode_steps; /* forward steps after the prefill */
    double prefill_s;   /* prefill forward steps + first sample, seconds */
    double decode_s;    /* decode steps + sampling, seconds */
    comet_stop_reason stop;
} comet_gen_stats;

/* Receives generated text as it is decoded (`len` bytes of UTF-8, not NUL-terminated).
 * Return non-zero to stop generation. */
typedef int (*comet_gen_text_fn)(const char *text, size_t len, void *user);

/* Generate from `prompt` [n_prompt] ids (BOS and chat template already applied).
 * Returns COMET_OK (stats filled, may be NULL), COMET_ERR_CONTEXT when the prompt does
 * not fit the model's context (names both numbers), COMET_ERR_INVALID_ARG for an empty
 * prompt or bad params, COMET_ERR_NOMEM. */
comet_status comet_generate(const comet_model *m, comet_backend *be, const int32_t *prompt,
                            int n_prompt, const comet_gen_params *p, comet_gen_text_fn on_text,
                            void *user, comet_gen_stats *stats);

/* Name of a stop reason ("eos", "stop", "length", "cancelled"). */
const char *comet_stop_reason_name(comet_stop_reason r);

#endif
