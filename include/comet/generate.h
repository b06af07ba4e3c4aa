/* comet/generate.h — one-shot generation: prompt ids -> chunked prefill -> decode loop ->
 * streamed text, on a backend the caller opened (comet/backend.h). The serving engine
 * (comet/engine.h) is the batched, multi-request counterpart.
 *
 * Everything the loop needs (KV pages for prompt + max_tokens, the forward workspace,
 * the sampler, history and text buffers) is allocated before the first step; the decode
 * loop allocates nothing. Text goes through the streaming detokenizer (complete UTF-8
 * characters only) and is held back while it could still be the start of a stop string,
 * so a stop string never reaches the callback.
 *
 * Sampling (comet_sampler_params, comet/sampling.h), in the order of HF transformers:
 * logit_bias, then penalties (repetition, presence, frequency) on the raw logits, then
 * temperature, then top-k, top-p and min-p on the tempered distribution, then one draw from
 * what remains. A temperature below COMET_SAMPLER_GREEDY_BELOW (0 included) or top_k 1 is
 * greedy: the argmax of the adjusted logits, lowest id on ties, no random number consumed. The RNG is xoshiro256** seeded through splitmix64, so
 * a seed gives the same draws on every machine.
 */
#ifndef COMET_GENERATE_H
#define COMET_GENERATE_H

#include <stddef.h>
#include <stdint.h>

#include "comet/backend.h"
#include "comet/model.h"
#include "comet/sampling.h"
#include "comet/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* comet_sampler_params, its defaults, check and merge: comet/sampling.h. */

typedef struct comet_gen_params {
    int max_tokens; /* new tokens at most (> 0) */
    comet_sampler_params sampling;
    const char *const *stop; /* [n_stop] stop strings (not emitted); may be NULL; borrowed
                              * for the call */
    int n_stop;
    int prefill_chunk;   /* prompt tokens per prefill step (> 0) */
    int ignore_eos;      /* keep going past EOS ids (benchmarks) */
    int tensor_parallel; /* 0 (default): one device; N >= 1: the model split over N devices
                          * of the backend's kind (tensor parallelism: cuda:d..d+N-1, or N CPU
                          * ranks); N <= COMET_MAX_TENSOR_PARALLEL */
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

/* Receives generated text as it is decoded (`len` > 0 bytes of UTF-8, not NUL-terminated,
 * valid during the call). Return non-zero to stop generation. */
typedef int (*comet_gen_text_fn)(const char *text, size_t len, void *user);

/* Generate with `m` (borrowed) on `be` from `prompt` [n_prompt] ids (BOS and chat
 * template already applied: comet_chat_tokenize), calling on_text(text, len, user) on the
 * calling thread as text is released. Returns COMET_OK (*stats filled; stats may be NULL),
 * COMET_ERR_CONTEXT when the prompt does not fit the model's context (names both
 * numbers), COMET_ERR_INVALID_ARG for an empty prompt or bad params (named),
 * COMET_ERR_NOMEM, or the error of a failed step. */
comet_status comet_generate(const comet_model *m, comet_backend *be, const int32_t *prompt,
                            int n_prompt, const comet_gen_params *p, comet_gen_text_fn on_text,
                            void *user, comet_gen_stats *stats);

/* Name of a stop reason ("eos", "stop", "length", "cancelled"); never NULL. */
const char *comet_stop_reason_name(comet_stop_reason r);

#ifdef __cplusplus
}
#endif
#endif
