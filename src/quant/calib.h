/* calib.h — calibration statistics on disk: the per-channel salience (max |x|) and, for
 * GPTQ, XᵀX of every layer and linear input group (docs/numerics.md "Choosing INT8
 * blocks"), saved so that several quantizations share one calibration run. The run itself
 * (the model over calibration text) is src/engine/calibrate.h. */
#ifndef COMET_QUANT_CALIB_H
#define COMET_QUANT_CALIB_H

#include <stddef.h>
#include <stdint.h>

#include "quant/fmpq.h"

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
