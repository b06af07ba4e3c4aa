/* ref_ops.c — the scalar CPU reference backend: the oracle every fast path is tested
 * against. One screen per op, obvious loops, single-threaded, fp32 storage with double
 * accumulation where a sum runs long (norms, dot products, softmax). Speed is not a goal
 * here; clarity is. The fast backend lives in cpu_ops.c and cpu_attention.c.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_common.h"
#include "backend/cpu/cpu_prims.h"
#include "numerics/qlinear.h"
#include "numerics/quant.h"

static comet_status ref_embed(comet_backend *be, const float *embd, int C, const int32_t *tokens,
                              int T, float *x) {
    for (int t = 0; t < T; t++)
        memcpy(x + (size_t)t * C, embd + (size_t)tokens[t] * C, (size_t)C * sizeof(float));
    return COMET_OK;
}

static comet_status ref_rmsnorm(comet_backend *be, const float *x, const float *w, int T, int C,
                                float eps, float *out) {
    for (int t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * C;
        float *yr = out + (size_t)t * C;
        double ss = 0.0;
        for (int c = 0; c < C; c++)
            ss += (double)xr[c] * xr[c];
        float inv = (float)(1.0 / sqrt(ss / C + eps));
        for (int c = 0; c < C; c++)
            yr[c] = xr[c] * inv * w[c];
    }
    return COMET_OK;
}

static comet_status ref_linear(comet_backend *be, const comet_linear *lin, const float *x, int T,
                               float *y) {
    if (lin->fmt == COMET_WFMT_QSIM) /* quantized checkpoint, fp32 simulation */
        return comet_qlinear_sim(lin, x, T, y);
    COMET_ASSERT(lin->fmt == COMET_WFMT_F32);
    int N = lin->n_out, K = lin->n_in;
    for (int t = 0; t < T; t++)
        for (int n = 0; n < N; n++) {
            const float *w = lin->w + (size_t)n * K;
            const float *xr = x + (size_t)t * K;
            double acc = 0.0;
            for (int k = 0; k < K; k++)
                acc += (double)xr[k] * w[k];
            y[(size_t)t * N + n] = (float)acc;
        }
    return COMET_OK;
}

static void rope_rotate(float *v, int D, int pos, const double *inv_freq) {
    int half = D / 2;
    for (int i = 0; i < half; i++) {
        double a = (double)pos * inv_freq[i];
        float c = (float)cos(a), s = (float)sin(a);
        float x0 = v[i], x1 = v[i + half];
        v[i] = x0 * c - x1 * s;
        v[i + half] = x0 * s + x1 * c;
    }
}

static comet_status ref_rope(comet_backend *be, const comet_rope_params *rp,
                             const int32_t *positions, int T, float *q, int H, float *k, int Hkv) {
    int D = rp->head_dim;
    double inv_freq[COMET_CPU_MAX_HEAD_DIM / 2];
    COMET_ASSERT(D % 2 == 0 && D <= COMET_CPU_MAX_HEAD_DIM);
    comet_rope_inv_freq(rp, inv_freq);
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < H; h++)
            rope_rotate(q + ((size_t)t * H + h) * D, D, positions[t], inv_freq);
        for (int h = 0; h < Hkv; h++)
            rope_rotate(k + ((size_t)t * Hkv + h) * D, D, positions[t], inv_freq);
    }
    return COMET_OK;
}

static comet_status ref_attention_stored(comet_backend *be, const comet_kv_cache *kv, int layer,
                                         const comet_batch *b, const float *q, int H, float *out) {
    int D = kv->head_dim, Hkv = kv->n_head_kv, group = H / Hkv;
    double scale = 1.0 / sqrt((double)D);
    for (int s = 0; s < b->n_seqs; s++)
        for (int t = b->token_indptr[s]; t < b->token_indptr[s + 1]; t++)
            for (int h = 0; h < H; h++) {
                int n = b->positions[t] + 1;
                const float *qh = q + ((size_t)t * H + h) * D;
                double *p = malloc((size_t)n * sizeof *p);
                COMET_ASSERT(p);
                double mx = -INFINITY, sum = 0.0;
                for (int j = 0; j < n; j++) {
                    const float *kj = kv->k + comet_kv_offset(kv, layer, b, s, j, h / group);
                    double dot = 0.0;
                    for (int d = 0; d < D; d++)
                        dot += (double)qh[d] * kj[d];
                    p[j] = dot * scale;
                    if (p[j] > mx)
                        mx = p[j];
                }
                for (int j = 0; j < n; j++)
                    sum += (p[j] = exp(p[j] - mx));
                float *oh = out + ((size_t)t * H + h) * D;
                for (int d = 0; d < D; d++) {
                    double acc = 0.0;
                    for (int j = 0; j < n; j++)
                        acc += p[j] * kv->v[comet_kv_offset(kv, layer, b, s, j, h / group) + d];
                    oh[d] = (float)(acc / sum);
                }
                free(p);
            }
    return COMET_OK;
}

static comet_status ref_silu_mul(comet_backend *be, const float *gate, const float *up, int T,
                                 int F, float *out) {
    for (size_t i = 0; i < (size_t)T * F; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
    return COMET_OK;
}

static comet_status ref_residual_add(comet_backend *be, float *x, const float *y, int T, int C) {
    for (size_t i = 0; i < (size_t)T * C; i++)
        x[i] += y[i];
    return COMET_OK;
}

static comet_status ref_logits(comet_backend *be, const float *x, const int32_t *rows, int n_rows,
                               const float *lm_head, int C, int V, float *logits) {
    for (int r = 0; r < n_rows; r++) {
        const float *xr = x + (size_t)rows[r] * C;
        for (int v = 0; v < V; v++) {
            double acc = 0.0;
            for (int c = 0; c < C; c++)
                acc += (double)xr[c] * lm_head[(size_t)v * C + c];
            logits[(size_t)r * V + v] = (float)acc;
        }
    }
    return COMET_OK;
}

static comet_status ref_logits_q8(comet_backend *be, const float *x, const int32_t *rows,
                                  int n_rows, const int8_t *q, const uint16_t *s, int C, int V,
                                  float *logits) {
    for (int r = 0; r < n_rows; r++) {
        const float *xr = x + (size_t)rows[r] * C;
        for (int v = 0; v < V; v++) {
            double acc = 0.0;
            for (int c = 0; c < C; c++)
                acc += (double)xr[c] * q[(size_t)v * C + c];
            logits[(size_t)r * V + v] = (float)(acc * comet_quant_f16_value(s[v]));
        }
    }
    return COMET_OK;
}

static void ref_destroy(comet_backend *be) { free(be); }

/* attention as the primitives table has it: the KV rotation (if any) around ref_attention_stored */
static comet_status ref_attention(comet_backend *be, const comet_kv_cache *kv, int layer,
                                  const comet_batch *b, const float *q, int H, float *out) {
    return comet_cpu_attention_rotated(be, kv, layer, b, q, H, out, ref_attention_stored);
}

static const comet_cpu_prims ref_prims = {
    .embed = ref_embed,
    .rmsnorm = ref_rmsnorm,
    .linear = ref_linear,
    .rope = ref_rope,
    .kv_append = comet_cpu_kv_append,
    .attention = ref_attention,
    .silu_mul = ref_silu_mul,
    .residual_add = ref_residual_add,
    .logits = ref_logits,
    .logits_q8 = ref_logits_q8,
};

static const comet_backend_ops ref_ops = {
    .name = "cpu-ref",
    COMET_CPU_STEP_OPS,
    .destroy = ref_destroy,
};

/* The reference backend's whole private state: its primitives (never written). */
static comet_cpu_state ref_state = {&ref_prims};

comet_backend *comet_backend_cpu_ref_init(void) {
    comet_backend *be = calloc(1, sizeof *be);
    if (!be) {
        comet_set_error(COMET_ERR_NOMEM, "cpu-ref backend: out of memory");
        return NULL;
    }
    be->ops = &ref_ops;
    be->impl = &ref_state;
    be->n_threads = 1;
    return be;
}
