/* cpu_common.c — RoPE frequencies and the KV append shared by the CPU backends. */
#include "backend/cpu/cpu_common.h"

#include <math.h>

#include "quant/quant.h"

void comet_cpu_rope_inv_freq(const comet_rope_params *rp, double *inv_freq) {
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

comet_status comet_cpu_kv_append(comet_backend *be, comet_kv_cache *kv, int layer,
                                 const comet_batch *b, const float *k, const float *v) {
    (void)be;
    size_t row = (size_t)kv->n_head_kv * kv->head_dim;
    int G = kv->kv_group > 0 ? kv->kv_group : kv->head_dim;
    COMET_ASSERT(kv->head_dim % G == 0);
    for (int s = 0; s < b->n_seqs; s++)
        for (int t = b->token_indptr[s]; t < b->token_indptr[s + 1]; t++) {
            size_t off = comet_kv_offset(kv, layer, b, s, b->positions[t], 0);
            comet_quant_kv_sim(k + (size_t)t * row, (int)(row / G), G, kv->kv_bits, kv->k + off);
            comet_quant_kv_sim(v + (size_t)t * row, (int)(row / G), G, kv->kv_bits, kv->v + off);
        }
    return COMET_OK;
}
