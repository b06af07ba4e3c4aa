/* perplexity.h — comet_perplexity (comet/perplexity.h) with an observer of every linear's
 * input, for calibration. */
#ifndef COMET_ENGINE_PERPLEXITY_H
#define COMET_ENGINE_PERPLEXITY_H

#include "backend/backend.h"
#include "comet/perplexity.h"
#include "model/forward.h"

/* comet_perplexity, with `observer` (NULL: none) seeing every linear's input
 * (comet_forward_set_input_observer; user passed through). Same returns, plus
 * COMET_ERR_UNSUPPORTED when an observer is given for a model or backend that has no such
 * inputs, and COMET_ERR_INVALID_ARG for an observer with tensor_parallel != 0 (a rank sees
 * only its slice of a split linear). */
comet_status comet_perplexity_observed(const comet_model *m, comet_backend *be,
                                       const int32_t *tokens, size_t n_tokens,
                                       const comet_ppl_params *p, comet_forward_input_fn observer,
                                       void *observer_user, comet_ppl_result *out);

#endif
