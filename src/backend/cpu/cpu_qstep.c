/* cpu_qstep.c — the CPU backend's integer path for W4Ax checkpoints (see cpu_qstep.h): the
 * weights packed once into the CPU layout, the quantizing step ops writing codes and scales,
 * and the matmuls on the integer GEMM. The fp32 pieces (residual add, RMSNorm, SiLU·mul) are
 * the backend's own primitives, as in the simulation, so the codes are the simulation's. */
#include "backend/cpu/cpu_qstep.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_prims.h"
#include "numerics/quant.h"

struct comet_cpu_qmodel {
    const comet_model *m;
    comet_threadpool *tp;
    comet_w4ax_isa isa;
    comet_w4ax_cpu *lin; /* [n_layer * COMET_ROLE_COUNT] */
    float *h;            /* [h_floats] rows before quantization */
    size_t h_floats;
};

static int linear_eligible(const comet_linear *lin) {
    return lin->fmt == COMET_WFMT_QSIM && lin->w_bits == 4 && lin->qw && lin->sw &&
           (lin->a_bits == 4 || lin->a_bits == 8) && (lin->block == 64 || lin->block == 128) &&
           lin->n_in % lin->block == 0;
}

int comet_cpu_qmodel_eligible(const comet_model *m) {
    if (!m->layers || m->synthetic_seed)
        return 0;
    for (int l = 0; l < m->cfg.n_layer; l++)
        for (int r = 0; r < COMET_ROLE_COUNT; r++)
            if (!linear_eligible(comet_model_linear(m, l, (comet_role)r)))
                return 0;
    return 1;
}

comet_status comet_cpu_qmodel_init(comet_backend *be, const comet_model *m, comet_w4ax_isa isa,
                                   comet_cpu_qmodel **out) {
    *out = NULL;
    COMET_ASSERT(comet_cpu_qmodel_eligible(m));
    if (!comet_w4ax_cpu_isa_supported(isa))
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "%s backend: the W4Ax instruction set '%s' is not on this CPU",
                               be->ops->name, comet_w4ax_cpu_isa_name(isa));
    comet_cpu_qmodel *q = calloc(1, sizeof *q);
    size_t n_lin = (size_t)m->cfg.n_layer * COMET_ROLE_COUNT;
    if (q)
        q->lin = calloc(n_lin, sizeof *q->lin);
    if (!q || !q->lin) {
        free(q);
        return comet_set_error(COMET_ERR_NOMEM, "%s backend: out of memory", be->ops->name);
    }
    q->m = m;
    q->tp = comet_cpu_backend_pool(be);
    q->isa = isa == COMET_W4AX_ISA_AUTO ? comet_w4ax_cpu_isa_best() : isa;
    for (int l = 0; l < m->cfg.n_layer; l++)
        for (int r = 0; r < COMET_ROLE_COUNT; r++) {
            const comet_linear *lin = comet_model_linear(m, l, (comet_role)r);
            comet_status st = comet_w4ax_cpu_pack(lin->n_out, lin->n_in, lin->block, lin->qw,
                                                  lin->sw, &q->lin[l * COMET_ROLE_COUNT + r]);
            if (st < 0) {
                comet_cpu_qmodel_free(q);
                return st;
            }
        }
    *out = q;
    return COMET_OK;
}

void comet_cpu_qmodel_free(comet_cpu_qmodel *q) {
    if (!q)
        return;
    for (int i = 0; q->lin && i < q->m->cfg.n_layer * COMET_ROLE_COUNT; i++)
        comet_w4ax_cpu_free(&q->lin[i]);
    free(q->lin);
    free(q->h);
    free(q);
}

size_t comet_cpu_qmodel_bytes(const comet_cpu_qmodel *q) {
    size_t n = 0;
    for (int i = 0; i < q->m->cfg.n_layer * COMET_ROLE_COUNT; i++)
        n += comet_w4ax_cpu_bytes(&q->lin[i]);
    return n;
}

/* The group's first linear: its permutation, block and n8 are the group's. */
static const comet_linear *group_linear(const comet_model *m, int layer, comet_group g) {
    static const comet_role first[COMET_GROUP_COUNT - 1] = {COMET_ROLE_Q, COMET_ROLE_O,
                                                            COMET_ROLE_GATE, COMET_ROLE_DOWN};
    COMET_ASSERT(g >= 0 && g < COMET_GROUP_LM_HEAD);
    return comet_model_linear(m, layer, first[g]);
}

static float *scratch(comet_cpu_qmodel *q, size_t n) {
    if (q->h_floats < n) {
        float *p = realloc(q->h, n * sizeof *p);
        if (!p) {
            comet_set_error(COMET_ERR_NOMEM, "cpu backend: cannot grow scratch to %zu MiB",
                            n * sizeof *p >> 20);
            return NULL;
        }
        q->h = p;
        q->h_floats = n;
    }
    return q->h;
}

typedef struct {
    const comet_linear *lin;
    const float *x; /* [T, K] */
    int8_t *codes;  /* [T, K] */
    float *scales;  /* [T, K/B] */
} quant_job;

/* Row t: x gathered by the group's permutation block by block, each block quantized with
 * comet_quant_sym_block (INT8 for blocks < n8, else INT4): comet_quant_act's codes of the
 * gathered row, without writing the gathered row. */
static void quant_row(void *ctx, int t, int tid) {
    (void)tid;
    const quant_job *j = ctx;
    const comet_linear *lin = j->lin;
    const int K = lin->n_in, B = lin->block, nb = K / B;
    const int n8 = lin->n8; /* a_bits 8: every block (model.h) */
    const float *x = j->x + (size_t)t * K;
    float buf[128];
    for (int b = 0; b < nb; b++) {
        const float *src = x + (size_t)b * B;
        if (lin->perm) {
            for (int i = 0; i < B; i++)
                buf[i] = x[lin->perm[b * B + i]];
            src = buf;
        }
        j->scales[(size_t)t * nb + b] =
            comet_quant_sym_block(src, B, b < n8 ? 127 : 7, j->codes + (size_t)t * K + (size_t)b * B);
    }
}

static void quantize(comet_cpu_qmodel *q, const comet_linear *lin, const float *x, int T,
                     void *act) {
    quant_job j = {lin, x, act, (float *)((char *)act + comet_cpu_qact_scale_offset(T, lin->n_in))};
    if ((size_t)T * lin->n_in >= 16384)
        comet_parallel_for(q->tp, T, quant_row, &j);
    else
        for (int t = 0; t < T; t++)
            quant_row(&j, t, 0);
}

comet_status comet_cpu_q_rmsnorm_quant(comet_backend *be, comet_cpu_qmodel *q, int layer,
                                       comet_group g, float *x, const float *residual, int T,
                                       void *act) {
    const comet_model *m = q->m;
    const int C = m->cfg.n_embd;
    if (residual)
        COMET_TRY(comet_cpu_prims_of(be)->residual_add(be, x, residual, T, C));
    float *h = scratch(q, (size_t)T * C);
    if (!h)
        return COMET_ERR_NOMEM;
    COMET_TRY(comet_cpu_prims_of(be)->rmsnorm(be, x, comet_model_norm(m, layer, g), T, C, m->cfg.rms_eps, h));
    quantize(q, group_linear(m, layer, g), h, T, act);
    return COMET_OK;
}

comet_status comet_cpu_q_act_quant(comet_backend *be, comet_cpu_qmodel *q, int layer,
                                   comet_group g, const float *x, int T, void *act) {
    (void)be;
    quantize(q, group_linear(q->m, layer, g), x, T, act);
    return COMET_OK;
}

comet_status comet_cpu_q_silu_mul_quant(comet_backend *be, comet_cpu_qmodel *q, int layer,
                                        const float *gate, const float *up, int T, void *act) {
    const int F = q->m->cfg.n_ff;
    float *h = scratch(q, (size_t)T * F);
    if (!h)
        return COMET_ERR_NOMEM;
    COMET_TRY(comet_cpu_prims_of(be)->silu_mul(be, gate, up, T, F, h));
    quantize(q, group_linear(q->m, layer, COMET_GROUP_DOWN), h, T, act);
    return COMET_OK;
}

comet_status comet_cpu_q_matmul_group(comet_backend *be, comet_cpu_qmodel *q, int layer,
                                      comet_group g, const void *act, int T, float *const *ys) {
    (void)be;
    comet_role roles[3];
    int n = comet_group_roles(g, roles);
    const comet_w4ax_cpu *ws[3];
    for (int i = 0; i < n; i++)
        ws[i] = &q->lin[layer * COMET_ROLE_COUNT + roles[i]];
    const comet_linear *lin = group_linear(q->m, layer, g);
    const int K = lin->n_in;
    return comet_w4ax_cpu_gemm(q->tp, q->isa, n, ws, T, lin->n8, act,
                               (const float *)((const char *)act +
                                               comet_cpu_qact_scale_offset(T, K)),
                               ys, NULL);
}

comet_status comet_cpu_q_matmul(comet_backend *be, comet_cpu_qmodel *q, int layer, comet_role r,
                                const void *act, int T, float *y) {
    (void)be;
    const comet_linear *lin = comet_model_linear(q->m, layer, r);
    const comet_w4ax_cpu *ws[1] = {&q->lin[layer * COMET_ROLE_COUNT + r]};
    float *ys[1] = {y};
    const int K = lin->n_in;
    return comet_w4ax_cpu_gemm(q->tp, q->isa, 1, ws, T, lin->n8, act,
                               (const float *)((const char *)act +
                                               comet_cpu_qact_scale_offset(T, K)),
                               ys, NULL);
}

comet_status comet_cpu_q_embed_f16(comet_backend *be, const comet_model *m, const int32_t *tokens,
                                   int T, float *x) {
    (void)be;
    const int C = m->cfg.n_embd;
    for (int t = 0; t < T; t++) {
        const uint16_t *row = m->tok_embd_f16 + (size_t)tokens[t] * C;
        for (int c = 0; c < C; c++)
            x[(size_t)t * C + c] = comet_quant_f16_value(row[c]);
    }
    return COMET_OK;
}

#define LM_ROWS 64 /* vocabulary rows per work item */

typedef struct {
    const uint16_t *w; /* [V, C] fp16, or NULL with q8 */
    const float *act;  /* [T, C] */
    const int32_t *rows;
    float *logits; /* [n_rows, V] */
    int n_rows, V, C;
    const int8_t *q8;   /* [V, C] INT8 lm_head codes (w NULL) */
    const uint16_t *s8; /* [V] their fp16 row scales */
} lm_job;

/* a · w over n values, w fp16 (dot_lm), INT8 codes (dot_lm_q8) or either already in fp32
 * (dot_lm_row, wf [n], for many rows against one vocabulary row): 16-wide blocks into 16
 * fp32 fma lanes (lane l takes elements l, l + 16, ...), the lanes summed in order 0..15,
 * then the tail (lm_finish_row). The vector and the scalar code, from any of the three, run
 * this same sequence of roundings, so a logit has one value. */
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define LM_VEC 1
#endif

static float lm_finish_row(const float lane[16], const float *a, const float *wf, int i, int n) {
    float s = 0.0f;
    for (int l = 0; l < 16; l++)
        s += lane[l];
    for (; i < n; i++)
        s = fmaf(a[i], wf[i], s);
    return s;
}

static float dot_lm(const float *a, const uint16_t *w, int n) {
    float lane[16] = {0}, tail[16];
    int i = 0;
#ifdef LM_VEC
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + i)));
        __m256 w1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + i + 8)));
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), w0, s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), w1, s1);
    }
    _mm256_storeu_ps(lane, s0);
    _mm256_storeu_ps(lane + 8, s1);
#else
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++)
            lane[l] = fmaf(a[i + l], comet_quant_f16_value(w[i + l]), lane[l]);
#endif
    for (int k = i; k < n; k++) /* the tail, at most 15 values */
        tail[k - i] = comet_quant_f16_value(w[k]);
    return lm_finish_row(lane, a + i, tail, 0, n - i);
}

/* The INT8 lm_head (docs/numerics.md "lm_head") multiplies dot_lm_q8's or dot_lm_row's sum
 * of the codes (exact in fp32) by the row scale. */
static float dot_lm_row(const float *a, const float *wf, int n) {
    float lane[16] = {0};
    int i = 0;
#ifdef LM_VEC
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(wf + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(wf + i + 8), s1);
    }
    _mm256_storeu_ps(lane, s0);
    _mm256_storeu_ps(lane + 8, s1);
#else
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++)
            lane[l] = fmaf(a[i + l], wf[i + l], lane[l]);
#endif
    return lm_finish_row(lane, a, wf, i, n);
}

static float dot_lm_q8(const float *a, const int8_t *q, int n) {
    float lane[16] = {0}, tail[16];
    int i = 0;
#ifdef LM_VEC
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        __m128i q16 = _mm_loadu_si128((const __m128i *)(q + i));
        __m256 w0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q16));
        __m256 w1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q16, 8)));
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), w0, s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), w1, s1);
    }
    _mm256_storeu_ps(lane, s0);
    _mm256_storeu_ps(lane + 8, s1);
#else
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++)
            lane[l] = fmaf(a[i + l], (float)q[i + l], lane[l]);
#endif
    for (int k = i; k < n; k++) /* the tail, at most 15 values */
        tail[k - i] = (float)q[k];
    return lm_finish_row(lane, a + i, tail, 0, n - i);
}

#define LM_MAX_C 8192 /* widest row converted once for many logit rows */

static void lm_task(void *ctx, int item, int tid) {
    (void)tid;
    const lm_job *j = ctx;
    const int v0 = item * LM_ROWS, v1 = v0 + LM_ROWS < j->V ? v0 + LM_ROWS : j->V;
    float wf[LM_MAX_C];
    const int convert = j->n_rows > 1 && j->C <= LM_MAX_C;
    if (j->q8) {
        for (int v = v0; v < v1; v++) {
            const int8_t *q = j->q8 + (size_t)v * j->C;
            const float s = comet_quant_f16_value(j->s8[v]);
            for (int c = 0; convert && c < j->C; c++)
                wf[c] = (float)q[c];
            for (int r = 0; r < j->n_rows; r++) {
                const float *a = j->act + (size_t)j->rows[r] * j->C;
                j->logits[(size_t)r * j->V + v] =
                    s * (convert ? dot_lm_row(a, wf, j->C) : dot_lm_q8(a, q, j->C));
            }
        }
        return;
    }
    for (int v = v0; v < v1; v++) {
        const uint16_t *w = j->w + (size_t)v * j->C;
        if (convert)
            for (int c = 0; c < j->C; c++)
                wf[c] = comet_quant_f16_value(w[c]);
        for (int r = 0; r < j->n_rows; r++) {
            const float *a = j->act + (size_t)j->rows[r] * j->C;
            j->logits[(size_t)r * j->V + v] =
                convert ? dot_lm_row(a, wf, j->C) : dot_lm(a, w, j->C);
        }
    }
}

comet_status comet_cpu_q_lm_head_f16(comet_backend *be, const comet_model *m, const float *act,
                                     const int32_t *rows, int n_rows, float *logits) {
    const int C = m->cfg.n_embd, V = m->cfg.n_vocab;
    lm_job j = {m->lm_head_f16, act, rows, logits, n_rows, V, C, NULL, NULL};
    comet_parallel_for(comet_cpu_backend_pool(be), (V + LM_ROWS - 1) / LM_ROWS, lm_task, &j);
    return COMET_OK;
}

comet_status comet_cpu_q_lm_head_q8(comet_backend *be, const float *act, const int32_t *rows,
                                    int n_rows, const int8_t *q, const uint16_t *s, int C, int V,
                                    float *logits) {
    lm_job j = {NULL, act, rows, logits, n_rows, V, C, q, s};
    comet_parallel_for(comet_cpu_backend_pool(be), (V + LM_ROWS - 1) / LM_ROWS, lm_task, &j);
    return COMET_OK;
}
