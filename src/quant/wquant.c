/* wquant.c — round-to-nearest weight quantization, symmetric per output channel per block,
 * with a per-block clipping search (docs/numerics.md "Weights"), and its dequantization. */
#include <math.h>

#include "quant/quant.h"

uint16_t comet_quant_w_block_scale(const float *w, int n, int qmax, int clip_search) {
    return comet_quant_w_block_scale_weighted(w, NULL, n, qmax, clip_search);
}

uint16_t comet_quant_w_block_scale_weighted(const float *w, const float *h, int n, int qmax,
                                            int clip_search) {
    float amax = 0.0f;
    int finite = 1;
    for (int i = 0; i < n; i++) {
        finite &= isfinite(w[i]) != 0;
        if (fabsf(w[i]) > amax)
            amax = fabsf(w[i]);
    }
    if (!finite || amax / (float)qmax > COMET_QUANT_F16_MAX)
        return COMET_QUANT_F16_NAN;
    if (amax == 0.0f)
        return comet_quant_f16_bits(0.0f);
    uint16_t best = comet_quant_f16_bits_up(amax / (float)qmax);
    if (best == 0) /* below fp16's smallest subnormal: that one (error <= 2^-25) */
        best = 1;
    if (!clip_search)
        return best;
    double best_err = INFINITY;
    const uint16_t unclipped = best;
    for (int step = 0; step < COMET_QUANT_CLIP_STEPS; step++) {
        float r = 1.0f - (1.0f - COMET_QUANT_CLIP_MIN) * (float)step / (COMET_QUANT_CLIP_STEPS - 1);
        uint16_t sh = step == 0 ? unclipped : comet_quant_f16_bits(r * amax / (float)qmax);
        float s = comet_quant_f16_value(sh);
        if (s == 0.0f)
            continue;
        double err = 0.0;
        for (int i = 0; i < n; i++) {
            float d = w[i] - (float)comet_quant_w_code(w[i], s, qmax) * s;
            err += (h ? (double)h[i] : 1.0) * d * d;
        }
        if (err < best_err) {
            best_err = err;
            best = sh;
        }
    }
    return best;
}

static comet_status check_args(const char *what, int N, int K, int B, int bits) {
    if (N <= 0 || K <= 0 || B <= 0 || K % B)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "%s: bad shape N=%d K=%d block=%d (K must be a multiple of block)",
                               what, N, K, B);
    if (bits != 4 && bits != 8)
        return comet_set_error(COMET_ERR_INVALID_ARG, "%s: %d-bit weights; 4 or 8 would work", what,
                               bits);
    return COMET_OK;
}

comet_status comet_quant_w_scale_check(uint16_t sh, const float *wb, int B, int qmax, int n, int b,
                                       const char *what) {
    if (sh != COMET_QUANT_F16_NAN)
        return COMET_OK;
    float amax = 0.0f;
    for (int i = 0; i < B; i++) {
        if (!isfinite(wb[i]))
            return comet_set_error(COMET_ERR_INVALID_ARG,
                                   "%s: output channel %d, block %d (input channels %d..%d in "
                                   "the permuted order) holds a non-finite weight (%g)",
                                   what, n, b, b * B, b * B + B - 1, (double)wb[i]);
        amax = fmaxf(amax, fabsf(wb[i]));
    }
    return comet_set_error(COMET_ERR_INVALID_ARG,
                           "%s: output channel %d, block %d (input channels %d..%d in the "
                           "permuted order): |w| up to %g needs a scale of %g, past fp16's "
                           "largest (65504)",
                           what, n, b, b * B, b * B + B - 1, (double)amax, (double)amax / qmax);
}

comet_status comet_quant_w_rtn(const float *w, int N, int K, int B, int bits, int clip_search,
                               int8_t *q, uint16_t *s) {
    COMET_TRY(check_args("rtn", N, K, B, bits));
    int qmax = bits == 4 ? 7 : 127, nb = K / B;
    for (int n = 0; n < N; n++)
        for (int b = 0; b < nb; b++) {
            const float *wb = w + (size_t)n * K + (size_t)b * B;
            uint16_t sh = comet_quant_w_block_scale(wb, B, qmax, clip_search);
            COMET_TRY(comet_quant_w_scale_check(sh, wb, B, qmax, n, b, "rtn"));
            float sc = comet_quant_f16_value(sh);
            s[(size_t)n * nb + b] = sh;
            int8_t *qb = q + (size_t)n * K + (size_t)b * B;
            for (int i = 0; i < B; i++)
                qb[i] = comet_quant_w_code(wb[i], sc, qmax);
        }
    return COMET_OK;
}
