/* cpu_common.c — the KV append, the KV rotation around attention and the
 * W4Ax weight loading, shared by the CPU backends. */
#include "backend/cpu/cpu_common.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/ref_gemm_w4ax.h"
#include "comet/model.h"
#include "numerics/quant.h"
#include "numerics/w4_plain.h"

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

comet_status comet_cpu_w4ax_load(comet_backend *be, int N, int K, int B, const uint8_t *qw_plain,
                                 const uint16_t *sw_plain, comet_w4ax_weight **out) {
    COMET_TRY(comet_w4ax_check_load(be, N, K, B, qw_plain, sw_plain, out));
    size_t qw_bytes = comet_w4_plain_bytes(N, K), n_scales = (size_t)N * (size_t)(K / B);
    comet_w4ax_weight *w = calloc(1, sizeof *w);
    if (w) {
        w->qw = malloc(qw_bytes);
        w->sw = malloc(n_scales * sizeof *w->sw);
        w->sw_f32 = malloc(n_scales * sizeof *w->sw_f32);
    }
    if (!w || !w->qw || !w->sw || !w->sw_f32) {
        comet_cpu_w4ax_free(be, w);
        return comet_set_error(COMET_ERR_NOMEM,
                               "w4ax_load (backend '%s'): out of memory for an N=%d K=%d weight "
                               "(%zu MiB)",
                               be->ops->name, N, K, (qw_bytes + n_scales * 6) >> 20);
    }
    w->magic = COMET_CPU_W4AX_MAGIC;
    w->N = N, w->K = K, w->B = B;
    memcpy(w->qw, qw_plain, qw_bytes);
    memcpy(w->sw, sw_plain, n_scales * sizeof *w->sw);
    for (size_t i = 0; i < n_scales; i++)
        w->sw_f32[i] = comet_ref_f16_to_f32(sw_plain[i]);
    *out = w;
    return COMET_OK;
}

void comet_cpu_w4ax_free(comet_backend *be, comet_w4ax_weight *w) {
    if (!w)
        return;
    w->magic = 0;
    free(w->qw);
    free(w->sw);
    free(w->sw_f32);
    free(w);
}

comet_status comet_cpu_w4ax_check(comet_backend *be, const comet_w4ax_weight *w, int M, int n8,
                                  const int8_t *qa, const float *sa, const float *y) {
    if (w && w->magic != COMET_CPU_W4AX_MAGIC)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "gemm_w4ax (backend '%s'): the weight was not made by a CPU "
                               "backend's w4ax_load",
                               be->ops->name);
    COMET_TRY(comet_w4ax_check_gemm(be, w, w ? w->K : 0, w ? w->B : 0, M, n8, qa, sa, y));
    const int K = w->K;
    for (int t = 0; t < M; t++) {
        const int8_t *row = qa + (size_t)t * K;
        int bad = 0;
        for (int k = n8 * w->B; k < K; k++) /* no early exit: the loop vectorizes */
            bad |= row[k] < -8 || row[k] > 7;
        if (bad)
            for (int k = n8 * w->B; k < K; k++)
                if (row[k] < -8 || row[k] > 7)
                    return comet_set_error(COMET_ERR_INVALID_ARG,
                                           "gemm_w4ax (backend '%s'): qa[%d, %d] = %d lies in "
                                           "INT4 block %d (n8 = %d) but is outside [-8, 7]",
                                           be->ops->name, t, k, row[k], k / w->B, n8);
    }
    return COMET_OK;
}
