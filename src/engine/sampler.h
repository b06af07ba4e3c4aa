/* sampler.h — next-token sampling from logits: the chain and RNG comet/generate.h
 * describes. All scratch is allocated at init; sampling never allocates.
 */
#ifndef COMET_ENGINE_SAMPLER_H
#define COMET_ENGINE_SAMPLER_H

#include <stdint.h>

#include "backend/backend.h"
#include "comet/sampling.h"
#include "comet/status.h"

/* comet_sampler_params, its defaults, check and merge are public (comet/sampling.h). */

typedef struct comet_sampler comet_sampler;

/* A sampler over a vocabulary of n_vocab ids; p is checked (comet_sampler_params_check)
 * and copied, logit_bias included. NULL + last error on bad params (COMET_ERR_INVALID_ARG
 * naming the field) or no memory. */
comet_sampler *comet_sampler_init(const comet_sampler_params *p, int n_vocab);
void comet_sampler_free(comet_sampler *s);

/* Restart the random stream from `seed`. */
void comet_sampler_reseed(comet_sampler *s, uint64_t seed);

/* Pick the next token. `logits` [n_vocab] is modified in place (logit_bias and penalties
 * applied).
 * `history` [n_history] holds the tokens so far (prompt and generated), oldest first;
 * may be NULL when n_history is 0. */
int32_t comet_sampler_sample(comet_sampler *s, float *logits, const int32_t *history,
                             int n_history);

/* The next uniform double in [0, 1) of the sampler's stream. comet_sampler_sample takes
 * one for each token it does not pick greedily. */
double comet_sampler_uniform(comet_sampler *s);

/* The pieces of comet_sampler_sample, for a backend that samples where the logits are
 * (backend.h "sample"): comet_sampler_sample(s, logits, h, n) is
 *     replace each listed id's logit (comet_sampler_adjust_list of (h, n)) by
 *     comet_sampler_adjust, then
 *     comet_sampler_greedy(s) ? the argmax : comet_sampler_pick(s, logits, comet_sampler_uniform(s)).
 *
 * adjust_list: the ids whose logits change before the chain, into adj (room for
 * comet_sampler_adjust_cap(s, n) entries): the distinct ids of the penalty window of
 * history [n] (the last repeat_last_n tokens, ids outside the vocabulary skipped) in order
 * of first occurrence, with their counts in the window, when a penalty is on; then the
 * logit_bias ids not listed yet (count 0), ascending. Every entry carries its bias (0 when
 * it has none). Returns how many.
 * adjust: the adjusted logit: logit + bias (-infinity for a bias of -100), then, when
 * count > 0, divided by repeat_penalty when positive, else multiplied, minus presence +
 * frequency * count (one fmaf).
 * greedy: 1 when the sampler takes the argmax (temperature below COMET_SAMPLER_GREEDY_BELOW,
 * or top_k 1).
 * pick: the chain after the adjustments on logits [n_vocab] (not modified) with the draw u
 * in [0, 1) (unused when greedy).
 * row: the device's row (backend.h comet_sample_row) for logits row `row` whose listed ids
 * are adj [n_adj] from adj_offset; takes the draw u from the stream when not greedy. */
int comet_sampler_adjust_cap(const comet_sampler *s, int n_history);
int comet_sampler_adjust_list(comet_sampler *s, const int32_t *history, int n_history,
                              comet_sample_adj *adj);
float comet_sampler_adjust(const comet_sampler_params *p, float logit, int32_t count, float bias);
int comet_sampler_greedy(const comet_sampler *s);
const comet_sampler_params *comet_sampler_get_params(const comet_sampler *s);
int32_t comet_sampler_pick(comet_sampler *s, const float *logits, double u);
comet_sample_row comet_sampler_row(comet_sampler *s, int row, int adj_offset, int n_adj);

#endif
