/* calibrate.h — the calibration run of `comet quantize`: the floating-point model over
 * calibration text, every linear group's input added to the statistics (quant/fmpq.h
 * comet_calib_stats: salience and, for GPTQ, XᵀX) through the forward pass's input observer
 * (model/forward.h), so the layer loop runs as in any other run. */
#ifndef COMET_ENGINE_CALIBRATE_H
#define COMET_ENGINE_CALIBRATE_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "quant/fmpq.h"

/* Run `m` (no quantized linear) over `n_windows` consecutive windows of `window_len` tokens
 * of `tokens` [n_tokens] (each from an empty KV cache, docs/numerics.md's perplexity
 * protocol, so the calibration text's perplexity comes out too: *ppl, may be NULL) on `be`,
 * a backend whose memory is the host's, adding every linear group's input to `cs`. Fails
 * with COMET_ERR_INVALID_ARG when the text holds fewer than one window (uses as many full
 * windows as there are, up to n_windows), COMET_ERR_UNSUPPORTED for a quantized model or a
 * device backend, or the forward pass's error. */
comet_status comet_calib_run(const comet_model *m, comet_backend *be, const int32_t *tokens,
                             size_t n_tokens, int n_windows, int window_len, comet_calib_stats *cs,
                             double *ppl);

#endif
