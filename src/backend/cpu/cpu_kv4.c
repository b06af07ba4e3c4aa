/* cpu_kv4.c — the CPU's quantized paged KV cache and its attention (see cpu_kv4.h).
 *
 * Attention runs one item per (token, KV head): the item's query heads (H / Hkv of them,
 * GQA) share each key's and value's unpacking. Scores use the factored dot product
 * q·k = sum_g (scale_g * sum_{c in g} q_c * code_c + zero_g * sum_{c in g} q_c), and the
 * values accumulate as out_c += (p * scale_g) * code_c + p * zero_g, so the codes are never
 * written back in a wider format. Per key it reads D/2 + 4 D/G bytes of K and as many of V
 * (48 + 48 bytes for D 64, G 16 at 4 bits, against 512 for fp32), which keeps a decode
 * step's attention cost low as the context grows. */
#include "backend/cpu/cpu_kv4.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_kv.h"
#include "numerics/quant.h"

#define KV4_MAX_D 256
#define KV4_MAX_GQA 32

static comet_cuda_kv_layout layout(const comet_kv_cache *kv) {
    return comet_cuda_kv_layout_make(kv->n_layer, kv->n_pages, kv->page_size, kv->n_head_kv,
                                     kv->head_dim, kv->kv.bits, kv->kv.group);
}

comet_status comet_cpu_kv4_init(comet_kv_cache *kv) {
    const int D = kv->head_dim, G = kv->kv.group > 0 ? kv->kv.group : D;
    if ((kv->kv.bits != 4 && kv->kv.bits != 8) || D < 2 || D % 2 || D > KV4_MAX_D || D % G ||
        (kv->kv.rotation == COMET_KV_ROTATION_HADAMARD && !comet_is_pow2(D)))
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "cpu KV cache: %d-bit codes for head dim %d in groups of %d "
                               "(rotation %s): need 4 or 8 bits, an even head dim up to %d that "
                               "the group divides, a power of two with the Hadamard rotation",
                               kv->kv.bits, D, G, comet_kv_rotation_name(kv->kv.rotation),
                               KV4_MAX_D);
    comet_cuda_kv_layout L = layout(kv);
    kv->storage = calloc(1, L.total_bytes);
    if (!kv->storage)
        return comet_set_error(COMET_ERR_NOMEM, "cpu KV cache: cannot allocate %zu MiB",
                               L.total_bytes >> 20);
    kv->storage_bytes = L.total_bytes;
    kv->k = kv->v = NULL;
    return COMET_OK;
}

void comet_cpu_kv4_free(comet_kv_cache *kv) {
    if (!kv)
        return;
    free(kv->storage);
    kv->storage = NULL;
    kv->storage_bytes = 0;
}

static uint8_t *head_tile(const comet_cuda_kv_layout *L, void *storage, int layer, int page,
                          int which, int h) {
    return (uint8_t *)storage +
           ((((size_t)layer * L->n_pages + page) * 2 + which) * L->Hkv + h) * L->head_tile_bytes;
}

/* Quantize x [D] (already rotated) into slot `slot` of a head tile. */
static void store_slot(const comet_cuda_kv_layout *L, uint8_t *tile, int slot, const float *x) {
    uint8_t codes[KV4_MAX_D];
    uint16_t *sz = (uint16_t *)(tile + L->sz_offset + (size_t)slot * L->sz_row_bytes);
    for (int i = 0; i < L->D / L->G; i++)
        comet_quant_kv_group(x + i * L->G, L->G, L->bits, codes + i * L->G, &sz[2 * i],
                             &sz[2 * i + 1]);
    uint8_t *row = tile + (size_t)slot * L->code_row_bytes;
    if (L->bits == 4)
        for (int c = 0; c < L->D / 2; c++)
            row[c] = (uint8_t)(codes[2 * c] | codes[2 * c + 1] << 4);
    else
        memcpy(row, codes, (size_t)L->D);
}

comet_status comet_cpu_kv4_append(comet_kv_cache *kv, int layer, const comet_batch *b,
                                  const float *k, const float *v) {
    const comet_cuda_kv_layout L = layout(kv);
    const int D = L.D, P = L.P;
    float tmp[KV4_MAX_D];
    for (int s = 0; s < b->n_seqs; s++)
        for (int t = b->token_indptr[s]; t < b->token_indptr[s + 1]; t++) {
            int pos = b->positions[t];
            int page = b->page_indices[b->page_indptr[s] + pos / P];
            for (int h = 0; h < L.Hkv; h++)
                for (int which = 0; which < 2; which++) {
                    memcpy(tmp, (which ? v : k) + ((size_t)t * L.Hkv + h) * D, D * sizeof *tmp);
                    if (kv->kv.rotation == COMET_KV_ROTATION_HADAMARD)
                        comet_wht(tmp, D);
                    store_slot(&L, head_tile(&L, kv->storage, layer, page, which, h), pos % P,
                               tmp);
                }
        }
    return COMET_OK;
}

/* codes of slot `slot` of a head tile as floats (0 .. 2^bits - 1) */
static inline void load_codes(const comet_cuda_kv_layout *L, const uint8_t *tile, int slot,
                              float *dst) {
    const uint8_t *row = tile + (size_t)slot * L->code_row_bytes;
    if (L->bits == 4)
        for (int c = 0; c < L->D / 2; c++) {
            dst[2 * c] = (float)(row[c] & 15);
            dst[2 * c + 1] = (float)(row[c] >> 4);
        }
    else
        for (int c = 0; c < L->D; c++)
            dst[c] = (float)row[c];
}

static inline const uint16_t *slot_sz(const comet_cuda_kv_layout *L, const uint8_t *tile,
                                      int slot) {
    return (const uint16_t *)(tile + L->sz_offset + (size_t)slot * L->sz_row_bytes);
}

typedef struct {
    const comet_kv_cache *kv;
    comet_cuda_kv_layout L;
    int layer, H, T, max_len;
    const comet_batch *b;
    const int32_t *seq_of; /* [T] */
    const float *q;
    float *out;
    float *scores; /* [n_threads][gqa * max_len] */
} attn_job;

static void attn_item(void *ctx, int item, int tid) {
    const attn_job *j = ctx;
    const comet_cuda_kv_layout *L = &j->L;
    const int D = L->D, G = L->G, ng = D / G, Hkv = L->Hkv, gqa = j->H / Hkv, P = L->P;
    const int t = item / Hkv, kvh = item % Hkv, s = j->seq_of[t];
    const int n_keys = j->b->positions[t] + 1;
    const int32_t *pages = j->b->page_indices + j->b->page_indptr[s];
    const int rotated = j->kv->kv.rotation == COMET_KV_ROTATION_HADAMARD;
    const float inv_sqrt_d = 1.0f / sqrtf((float)D);
    float qr[KV4_MAX_GQA][KV4_MAX_D], qsum[KV4_MAX_GQA][KV4_MAX_D], acc[KV4_MAX_GQA][KV4_MAX_D];
    float codes[KV4_MAX_D], sum[KV4_MAX_GQA];
    float *sc = j->scores + (size_t)tid * gqa * j->max_len;
    for (int i = 0; i < gqa; i++) {
        memcpy(qr[i], j->q + ((size_t)t * j->H + kvh * gqa + i) * D, D * sizeof(float));
        if (rotated)
            comet_wht(qr[i], D);
        for (int g = 0; g < ng; g++) {
            float z = 0.0f;
            for (int c = 0; c < G; c++)
                z += qr[i][g * G + c];
            qsum[i][g] = z;
        }
    }
    for (int p = 0; p < n_keys; p++) {
        const uint8_t *tile = head_tile(L, j->kv->storage, j->layer, pages[p / P], 0, kvh);
        load_codes(L, tile, p % P, codes);
        const uint16_t *sz = slot_sz(L, tile, p % P);
        for (int i = 0; i < gqa; i++) {
            float d = 0.0f;
            for (int g = 0; g < ng; g++) {
                float part = 0.0f;
                for (int c = 0; c < G; c++)
                    part += qr[i][g * G + c] * codes[g * G + c];
                d += comet_quant_f16_value(sz[2 * g]) * part +
                     comet_quant_f16_value(sz[2 * g + 1]) * qsum[i][g];
            }
            sc[(size_t)i * j->max_len + p] = d * inv_sqrt_d;
        }
    }
    for (int i = 0; i < gqa; i++) {
        float *si = sc + (size_t)i * j->max_len, m = -INFINITY, z = 0.0f;
        for (int p = 0; p < n_keys; p++)
            m = si[p] > m ? si[p] : m;
        for (int p = 0; p < n_keys; p++) {
            si[p] = expf(si[p] - m);
            z += si[p];
        }
        sum[i] = z;
        memset(acc[i], 0, D * sizeof(float));
    }
    for (int p = 0; p < n_keys; p++) {
        const uint8_t *tile = head_tile(L, j->kv->storage, j->layer, pages[p / P], 1, kvh);
        load_codes(L, tile, p % P, codes);
        const uint16_t *sz = slot_sz(L, tile, p % P);
        for (int i = 0; i < gqa; i++) {
            const float w = sc[(size_t)i * j->max_len + p];
            for (int g = 0; g < ng; g++) {
                const float a = w * comet_quant_f16_value(sz[2 * g]);
                const float bz = w * comet_quant_f16_value(sz[2 * g + 1]);
                for (int c = 0; c < G; c++)
                    acc[i][g * G + c] += a * codes[g * G + c] + bz;
            }
        }
    }
    for (int i = 0; i < gqa; i++) {
        const float inv = 1.0f / sum[i];
        for (int c = 0; c < D; c++)
            acc[i][c] *= inv;
        if (rotated)
            comet_wht(acc[i], D);
        memcpy(j->out + ((size_t)t * j->H + kvh * gqa + i) * D, acc[i], D * sizeof(float));
    }
}

comet_status comet_cpu_kv4_attention(comet_threadpool *tp, const comet_kv_cache *kv, int layer,
                                     const comet_batch *b, const float *q, int H, float *out) {
    const int T = b->n_tokens, Hkv = kv->n_head_kv;
    COMET_ASSERT(H % Hkv == 0 && H / Hkv <= KV4_MAX_GQA && kv->storage);
    int max_len = 1;
    for (int t = 0; t < T; t++)
        max_len = b->positions[t] + 1 > max_len ? b->positions[t] + 1 : max_len;
    const int n_threads = tp ? comet_threadpool_size(tp) : 1;
    int32_t *seq_of = malloc((size_t)T * sizeof *seq_of);
    float *scores = malloc((size_t)n_threads * (H / Hkv) * max_len * sizeof *scores);
    if (!seq_of || !scores) {
        free(seq_of);
        free(scores);
        return comet_set_error(COMET_ERR_NOMEM, "cpu attention: no memory for %d keys", max_len);
    }
    for (int s = 0; s < b->n_seqs; s++)
        for (int t = b->token_indptr[s]; t < b->token_indptr[s + 1]; t++)
            seq_of[t] = s;
    attn_job j = {kv, layout(kv), layer, H, T, max_len, b, seq_of, q, out, scores};
    comet_parallel_for(tp, T * Hkv, attn_item, &j);
    free(seq_of);
    free(scores);
    return COMET_OK;
}
