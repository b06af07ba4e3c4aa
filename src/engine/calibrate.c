/* calibrate.c — the calibration run (see calibrate.h). */
#include "engine/calibrate.h"

#include "engine/perplexity.h"

/* The observer: the input of group g of layer `layer` into the statistics. */
static void observe(void *user, int layer, comet_group g, const float *x, int T) {
    COMET_ASSERT(g >= COMET_GROUP_QKV && g < COMET_GROUP_LAYER_COUNT);
    comet_calib_stats_observe(user, layer, g, x, T);
}

comet_status comet_calib_run(const comet_model *m, comet_backend *be, const int32_t *tokens,
                             size_t n_tokens, int n_windows, int window_len, comet_calib_stats *cs,
                             double *ppl) {
    if (n_windows <= 0 || window_len < 2)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "calibration: %d windows of %d tokens; positive counts (windows "
                               "of at least 2 tokens) would work",
                               n_windows, window_len);
    comet_ppl_params p = comet_ppl_default_params();
    p.ctx = window_len;
    p.max_windows = n_windows;
    comet_ppl_result r;
    COMET_TRY(comet_perplexity_observed(m, be, tokens, n_tokens, &p, observe, cs, &r));
    if (ppl)
        *ppl = r.ppl;
    return COMET_OK;
}
