/* sampler.h — next-token sampling from logits: the chain and RNG comet/generate.h
 * describes. All scratch is allocated at init; sampling never allocates.
 */
#ifndef COMET_ENGINE_SAMPLER_H
#define COMET_ENGINE_SAMPLER_H

#include <stdint.h>

#include "comet/generate.h"
#include "comet/status.h"

/* comet_sampler_params and comet_sampler_default_params are public (comet/generate.h). */

typedef struct comet_sampler comet_sampler;

/* A sampler over a vocabulary of n_vocab ids. NULL + last error on bad params
 * (COMET_ERR_INVALID_ARG naming the field) or no memory. */
comet_sampler *comet_sampler_init(const comet_sampler_params *p, int n_vocab);
void comet_sampler_free(comet_sampler *s);

/* Restart the random stream from `seed`. */
void comet_sampler_reseed(comet_sampler *s, uint64_t seed);

/* Pick the next token. `logits` [n_vocab] is modified in place (penalties applied).
 * `history` [n_history] holds the tokens so far (prompt and generated), oldest first;
 * may be NULL when n_history is 0. */
int32_t comet_sampler_sample(comet_sampler *s, float *logits, const int32_t *history,
                             int n_history);

/* The next uniform double in [0, 1) of the sampler's stream. comet_sampler_sample takes
 * one for each token it does not pick greedily. */
double comet_sampler_uniform(comet_sampler *s);

/* The pieces of comet_sampler_sample, for a backend that samples where the logits are
 * (backend.h "sample"): comet_sampler_sample(s, logits, h, n) is
 *     apply the penalty list of (h, n) to logits with comet_sampler_penalize, then
 *     comet_sampler_greedy(s) ? the argmax : comet_sampler_pick(s, logits, comet_sampler_uniform(s)).
 *
 * penalty_list: the distinct ids of the penalty window of history [n] (the last
 * repeat_last_n tokens, ids outside the vocabulary skipped) in order of first occurrence,
 * with their counts in the window, into ids / counts (room for min(n, n_vocab) each);
 * returns how many, 0 when every penalty is off.
 * penalize: the penalized logit of a token seen `count` times: divided by repeat_penalty
 * when positive, else multiplied; minus presence + frequency * count (one fmaf).
 * greedy: 1 when the sampler takes the argmax (temperature 0 or top_k 1).
 * pick: the chain after the penalties on logits [n_vocab] (not modified) with the draw u in
 * [0, 1) (unused when greedy). */
int comet_sampler_penalty_list(comet_sampler *s, const int32_t *history, int n_history,
                               int32_t *ids, int32_t *counts);
float comet_sampler_penalize(const comet_sampler_params *p, float logit, int32_t count);
int comet_sampler_greedy(const comet_sampler *s);
const comet_sampler_params *comet_sampler_get_params(const comet_sampler *s);
int32_t comet_sampler_pick(comet_sampler *s, const float *logits, double u);

#endif
