/* comet/sampling.h — the sampling parameters: one struct, used as is by every layer that
 * carries them (comet_generate, the serving engine's requests, the OpenAI server's request
 * and defaults, the model's generation_config.json, the device's sample row), with one
 * validation and one merge.
 *
 * The chain, in the order of HF transformers (comet/generate.h): logit_bias added to the
 * raw logits; penalties (repetition, presence, frequency); temperature; top-k, top-p and
 * min-p on the tempered distribution; one draw from what remains. A temperature below
 * COMET_SAMPLER_GREEDY_BELOW (or top_k 1) is greedy.
 *
 * A new parameter goes: a field and its default here and in comet_sampler_default_params,
 * a COMET_SAMPLER_* bit, its check and merge (engine/sampler.c), its step of the chain
 * (engine/sampler.c and the CUDA kernel, backend/cuda/sample.cu, which reads it from the
 * row's embedded params), its JSON key (server/openai.c) and its CLI option.
 */
#ifndef COMET_SAMPLING_H
#define COMET_SAMPLING_H

#include <stdint.h>

#include "comet/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A temperature below this is greedy (the argmax; no random number consumed). Below it the
 * tempered distribution is one-hot to double precision except between logits closer than
 * 37 * 1e-5 (exp(-37) < 2^-53, the resolution of the draw), while 1 / temperature no longer
 * fits the logits: at 1e-38 a logit of 4 already overflows float to infinity. vLLM uses the
 * same epsilon (_SAMPLING_EPS). */
#define COMET_SAMPLER_GREEDY_BELOW 1e-5f

/* Ranges, one for every front end (CLI, server, generation_config.json): the OpenAI API's. */
#define COMET_SAMPLER_MAX_TEMPERATURE 2.0f
#define COMET_SAMPLER_MAX_PENALTY 2.0f      /* |presence|, |frequency| (OpenAI: [-2, 2]) */
#define COMET_SAMPLER_MAX_LOGIT_BIAS 100.0f /* |bias| (OpenAI: [-100, 100]) */
#define COMET_SAMPLER_MAX_BIASED 1024       /* logit_bias entries at most */

/* One logit_bias entry (the OpenAI API's): `bias` is added to token `id`'s logit before
 * the chain; -100 bans the token (its logit becomes -infinity: never picked, greedy or
 * not); +100 all but selects it. */
typedef struct comet_logit_bias {
    int32_t id;
    float bias;
} comet_logit_bias;

typedef struct comet_sampler_params {
    float temperature; /* [0, 2]; below COMET_SAMPLER_GREEDY_BELOW: greedy */
    int top_k;         /* keep the k most likely; 0 = off */
    float top_p;       /* keep the smallest set with mass >= top_p, (0, 1]; 1 = off */
    float min_p;       /* drop tokens with p < min_p * p_max, [0, 1]; 0 = off */
    uint64_t seed;
    float repeat_penalty;    /* > 0, 1 = off; logit > 0 divided by it, logit < 0 multiplied
                              * (CTRL) */
    int repeat_last_n;       /* history window the penalties look at; -1 = all of it */
    float presence_penalty;  /* [-2, 2]: subtracted once from every token seen (OpenAI); 0 = off */
    float frequency_penalty; /* [-2, 2]: subtracted per occurrence (OpenAI); 0 = off */
    const comet_logit_bias *logit_bias; /* [n_logit_bias] ids in [0, n_vocab), distinct,
                                         * bias in [-100, 100]; borrowed: a sampler copies
                                         * it at init; NULL when n_logit_bias is 0 */
    int n_logit_bias;                   /* 0..COMET_SAMPLER_MAX_BIASED */
} comet_sampler_params;

/* One bit per field of comet_sampler_params: a "given" mask says which fields a source
 * (a request, the command line, generation_config.json) set. */
enum {
    COMET_SAMPLER_TEMPERATURE = 1u << 0,
    COMET_SAMPLER_TOP_K = 1u << 1,
    COMET_SAMPLER_TOP_P = 1u << 2,
    COMET_SAMPLER_MIN_P = 1u << 3,
    COMET_SAMPLER_SEED = 1u << 4,
    COMET_SAMPLER_REPEAT_PENALTY = 1u << 5,
    COMET_SAMPLER_REPEAT_LAST_N = 1u << 6,
    COMET_SAMPLER_PRESENCE_PENALTY = 1u << 7,
    COMET_SAMPLER_FREQUENCY_PENALTY = 1u << 8,
    COMET_SAMPLER_LOGIT_BIAS = 1u << 9, /* logit_bias and n_logit_bias */
    COMET_SAMPLER_ALL = (1u << 10) - 1
};

/* temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, seed 0, penalties off,
 * repeat_last_n 64, no logit_bias. */
comet_sampler_params comet_sampler_default_params(void);

/* Check every field against its range (above) for a vocabulary of n_vocab ids (0: not
 * known yet, logit_bias ids are then only checked to be >= 0 and distinct). Returns
 * COMET_OK, or COMET_ERR_INVALID_ARG with comet_last_error() naming the field, its value
 * and the range ("temperature must be in [0, 2], got 3"), and *bad (may be NULL) set to
 * the field's COMET_SAMPLER_* bit. */
comet_status comet_sampler_params_check(const comet_sampler_params *p, int n_vocab, unsigned *bad);

/* Copy into *dst the fields of *src whose bits are set in `given` (pointers are copied,
 * not what they point to). */
void comet_sampler_params_merge(comet_sampler_params *dst, const comet_sampler_params *src,
                                unsigned given);

/* The field's name as the OpenAI API and generation_config.json spell it ("temperature",
 * "top_k", ..., "repetition_penalty", "logit_bias") for one COMET_SAMPLER_* bit; "?"
 * otherwise. */
const char *comet_sampler_field_name(unsigned bit);

#ifdef __cplusplus
}
#endif
#endif
