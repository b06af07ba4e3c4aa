/* cpu_common.c — the KV append and the KV rotation around attention, shared by the CPU
 * backends. */
#include "backend/cpu/cpu_common.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "comet/model.h"
#include "numerics/quant.h"

comet_status comet_cpu_kv_append(comet_backend *be, comet_kv_cache *kv, int layer,
                                 const comet_batch *b, const float *k, const float *v) {
    (void)be;
    int D = kv->head_dim, Hkv = kv->n_head_kv;
    size_t row = (size_t)Hkv * D;
    int G = kv->kv.group > 0 ? kv->kv.group : D, bits = comet_kv_type_bits(kv->kv.type);
    COMET_ASSERT(D % G == 0 && bits > 0);
    if (kv->kv.rotation == COMET_KV_ROTATION_NONE) {
        for (int s = 0; s < b->n_seqs; s++)
            for (int t = b->token_indptr[s]; t < b->token_indptr[s + 1]; t++) {
                size_t off = comet_kv_offset(kv, layer, b, s, b->positions[t], 0);
                comet_quant_kv_sim(k + (size_t)t * row, (int)(row / G), G, bits, kv->k + off);
                comet_quant_kv_sim(v + (size_t)t * row, (int)(row / G), G, bits, kv->v + off);
            }
        return COMET_OK;
    }
    COMET_ASSERT(kv->kv.rotation == COMET_KV_ROTATION_HADAMARD && comet_is_pow2(D) &&
                 D <= COMET_CPU_MAX_HEAD_DIM);
    float tmp[COMET_CPU_MAX_HEAD_DIM];
    for (int s = 0; s < b->n_seqs; s++)
        for (int t = b->token_indptr[s]; t < b->token_indptr[s + 1]; t++) {
            size_t off = comet_kv_offset(kv, layer, b, s, b->positions[t], 0);
            for (int h = 0; h < Hkv; h++)
                for (int which = 0; which < 2; which++) {
                    const float *src = (which ? v : k) + (size_t)t * row + (size_t)h * D;
                    float *dst = (which ? kv->v : kv->k) + off + (size_t)h * D;
                    memcpy(tmp, src, (size_t)D * sizeof *tmp);
                    comet_wht(tmp, D);
                    comet_quant_kv_sim(tmp, D / G, G, bits, dst);
                }
        }
    return COMET_OK;
}

comet_status comet_cpu_attention_rotated(comet_backend *be, const comet_kv_cache *kv, int layer,
                                         const comet_batch *b, const float *q, int H, float *out,
                                         comet_cpu_attention_fn attend) {
    if (kv->kv.rotation == COMET_KV_ROTATION_NONE)
        return attend(be, kv, layer, b, q, H, out);
    int D = kv->head_dim;
    COMET_ASSERT(kv->kv.rotation == COMET_KV_ROTATION_HADAMARD && comet_is_pow2(D));
    size_t heads = (size_t)b->n_tokens * H;
    float *qr = malloc(heads * D * sizeof *qr);
    if (!qr)
        return comet_set_error(COMET_ERR_NOMEM,
                               "cpu attention: no memory for %zu rotated "
                               "query heads",
                               heads);
    memcpy(qr, q, heads * D * sizeof *qr);
    for (size_t i = 0; i < heads; i++)
        comet_wht(qr + i * D, D); /* (H q)·(H k) = q·k */
    comet_status st = attend(be, kv, layer, b, qr, H, out);
    free(qr);
    if (st < 0)
        return st;
    for (size_t i = 0; i < heads; i++)
        comet_wht(out + i * D, D); /* sum_j p_j (H v_j) rotated back: H H = I */
    return COMET_OK;
}
