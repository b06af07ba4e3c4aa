/* rope.c — the RoPE frequency table every backend rotates by (backend.h), computed once on
 * the host in double so that all backends use exactly the same angles. */
#include <math.h>

#include "backend/backend.h"

void comet_rope_inv_freq(const comet_rope_params *rp, double *inv_freq) {
    int D = rp->head_dim;
    for (int i = 0; i < D / 2; i++) {
        double f = pow((double)rp->theta, -(double)(2 * i) / D);
        if (rp->scaling == COMET_ROPE_SCALING_LINEAR) {
            f /= rp->factor;
        } else if (rp->scaling == COMET_ROPE_SCALING_LLAMA3) {
            double low_wavelen = rp->orig_ctx / rp->low_freq_factor;
            double high_wavelen = rp->orig_ctx / rp->high_freq_factor;
            double wavelen = 2.0 * M_PI / f;
            if (wavelen > low_wavelen) {
                f /= rp->factor;
            } else if (wavelen >= high_wavelen) {
                double smooth = (rp->orig_ctx / wavelen - rp->low_freq_factor) /
                                (rp->high_freq_factor - rp->low_freq_factor);
                f = (1.0 - smooth) * f / rp->factor + smooth * f;
            }
        }
        inv_freq[i] = f;
    }
}
