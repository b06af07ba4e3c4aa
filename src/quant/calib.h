/* calib.h — calibration: run the floating-point model over calibration text and collect,
 * for every layer and linear input group, the per-channel salience (max |x|) and, for
 * GPTQ, XᵀX (docs/numerics.md "Choosing INT8 blocks").
 *
 * The statistics are gathered by wrapping the backend: a calibration backend forwards
 * every op to the real one and, in `linear`, records the input of q_proj, o_proj,
 * gate_proj and down_proj (one per group) before forwarding. The forward pass itself is
 * untouched, so calibration adds nothing to the hot path of normal runs. */
#ifndef COMET_QUANT_CALIB_H
#define COMET_QUANT_CALIB_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "quant/fmpq.h"

/* Run `m` (fp32 linears) over `n_windows` consecutive windows of `window_len` tokens of
 * `tokens` [n_tokens] (each from an empty KV cache, docs/numerics.md's perplexity protocol, so
 * the calibration text's perplexity comes out too: *ppl, may be NULL) on backend `be`,
 * adding every linear input to `cs`. Fails with COMET_ERR_INVALID_ARG when the text holds
 * fewer than one window; uses as many full windows as there are, up to n_windows. */
comet_status comet_calib_run(const comet_model *m, comet_backend *be, const int32_t *tokens,
                             size_t n_tokens, int n_windows, int window_len,
                             comet_calib_stats *cs, double *ppl);

/* Where statistics came from, checked when they are read back. */
typedef struct comet_calib_meta {
    char model[256];  /* model path as given */
    char corpus[256]; /* calibration text path */
    int windows, window_len;
} comet_calib_meta;

/* Save `cs` with `meta` to `path` (a raw little-endian file: header, salience, XᵀX when
 * present) so that several quantizations can share one calibration run. COMET_ERR_IO
 * naming the path on failure. */
comet_status comet_calib_stats_save(const comet_calib_stats *cs, const comet_calib_meta *meta,
                                    const char *path);

/* Read statistics saved by comet_calib_stats_save for a model with config `cfg`. Returns
 * COMET_OK and *out, or COMET_ERR_IO, COMET_ERR_FORMAT (not a statistics file, truncated),
 * or COMET_ERR_INVALID_ARG when the file was made for another model shape, corpus,
 * window count or length than `want`, or lacks XᵀX while need_xtx is set (the message
 * names the mismatch). */
comet_status comet_calib_stats_load(const char *path, const comet_model_config *cfg,
                                    const comet_calib_meta *want, int need_xtx,
                                    comet_calib_stats **out);

#endif
