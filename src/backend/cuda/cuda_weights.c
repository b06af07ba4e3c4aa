/* cuda_weights.c — the CUDA backend's copy of a model (backend.h weights_load): W4Ax
 * linears packed on the device, FP16 copies of floating-point linears and the lm_head
 * (converted on the device through an fp32 staging buffer), fp32 norms and embedding, and
 * per linear input group its activation format and permutation; synthetic models get random
 * weights made on the device. */
#include "backend/backend.h"

#ifdef COMET_HAVE_CUDA

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/gemm_w4ax.h"
#include "backend/cuda/lm_head_w8.h"

#define CUDA_WEIGHTS_MAGIC 0x57415543u      /* "CUAW" */
#define F16_STAGE_FLOATS ((size_t)16 << 20) /* fp32 staging for the FP16 conversion (64 MiB) */

const char *const comet_cuda_role_names[COMET_ROLE_COUNT] = {
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
const char *const comet_cuda_group_names[COMET_GROUP_COUNT] = {"qkv", "o", "gate_up", "down",
                                                               "lm_head"};

/* The activation kind a linear reads; LIN_NONE for a layout this backend does not run. */
static cuda_lin_kind lin_kind(const comet_model *m, const comet_linear *lin) {
    int synthetic = m->synthetic_seed != 0; /* no host arrays: random weights on the device */
    if (lin->fmt == COMET_WFMT_F32 && (lin->w || synthetic))
        return LIN_F16;
    if (lin->fmt != COMET_WFMT_QSIM)
        return LIN_NONE;
    if (lin->a_bits == 16 && (lin->w || synthetic))
        return LIN_F16;
    if (lin->w_bits == 4 && (lin->a_bits == 4 || lin->a_bits == 8) &&
        ((lin->qw && lin->sw) || synthetic))
        return LIN_W4AX;
    return LIN_NONE;
}

static const int32_t *lin_perm(const comet_linear *lin) {
    return lin->fmt == COMET_WFMT_QSIM ? lin->perm : NULL;
}

static int same_perm(const int32_t *a, const int32_t *b, int K) {
    return a == b || (a && b && !memcmp(a, b, (size_t)K * sizeof *a));
}

/* The last error message prefixed with "cuda backend: <where>: "; returns st. */
comet_status comet_cuda_be_prefix_error(comet_status st, const char *fmt, ...) {
    char where[160], msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(where, sizeof where, fmt, ap);
    va_end(ap);
    snprintf(msg, sizeof msg, "%s", comet_last_error()); /* the next call overwrites it */
    return comet_set_error(st, "cuda backend: %s: %s", where, msg);
}

/* *dst = a new device copy of host src (bytes > 0). */
static comet_status upload_new(cuda_impl *im, void **dst, const void *src, size_t bytes,
                               const char *what) {
    CUDA_TRY(cudaMalloc(dst, bytes), what);
    CUDA_TRY(cudaMemcpyAsync(*dst, src, bytes, cudaMemcpyHostToDevice, im->stream), what);
    return COMET_OK;
}

/* dst [n] (device) = host fp32 src [n] as fp16, converted on the device through the fp32
 * staging buffer *stage (allocated on first need). */
static comet_status convert_f16(cuda_impl *im, uint16_t *dst, const float *src, size_t n,
                                float **stage, const char *what) {
    if (!*stage)
        CUDA_TRY(cudaMalloc((void **)stage, F16_STAGE_FLOATS * sizeof **stage), what);
    for (size_t off = 0; off < n; off += F16_STAGE_FLOATS) {
        size_t cnt = n - off < F16_STAGE_FLOATS ? n - off : F16_STAGE_FLOATS;
        /* from pageable memory: the copy waits for the stream (the previous conversion has
         * read the stage) and returns once src is staged */
        CUDA_TRY(cudaMemcpyAsync(*stage, src + off, cnt * sizeof *src, cudaMemcpyHostToDevice,
                                 im->stream),
                 what);
        COMET_TRY(comet_cuda_f32_to_f16(*stage, dst + off, cnt, im->stream));
    }
    return COMET_OK;
}

/* *dst = a new device fp16 copy of host fp32 src [n] (convert_f16). */
static comet_status upload_f16(cuda_impl *im, uint16_t **dst, const float *src, size_t n,
                               float **stage, const char *what) {
    CUDA_TRY(cudaMalloc((void **)dst, n * sizeof **dst), what);
    return convert_f16(im, *dst, src, n, stage, what);
}

void comet_cuda_be_weights_free(comet_backend *be, comet_weights *w) {
    if (!w)
        return;
    cuda_impl *im = impl_of(be);
    im->generation++;
    CUcontext prev;
    if (comet_cuda_be_enter(w->device, &prev) != cudaSuccess)
        cudaGetLastError();
    cudaStreamSynchronize(im->stream);
    size_t n_lin = (size_t)w->n_layer * COMET_ROLE_COUNT;
    for (size_t i = 0; w->lin && i < n_lin; i++) {
        if (w->lin[i].w4)
            comet_cuda_be_w4ax_free(be, w->lin[i].w4);
        if (w->lin[i].w16 && w->lin[i].row0 < 0)
            cudaFree(w->lin[i].w16);
    }
    size_t n_grp = (size_t)w->n_layer * LAYER_GROUPS + 1;
    for (size_t i = 0; w->grp && i < n_grp; i++) {
        if (w->grp[i].stack.w4)
            comet_cuda_be_w4ax_free(be, w->grp[i].stack.w4);
        if (w->grp[i].stack.w16)
            cudaFree(w->grp[i].stack.w16);
        if (w->grp[i].fmt.perm)
            cudaFree((void *)w->grp[i].fmt.perm);
        if (w->grp[i].norm)
            cudaFree(w->grp[i].norm);
    }
    if (w->embd)
        cudaFree(w->embd);
    if (w->lm_head)
        cudaFree(w->lm_head);
    if (w->lm_head_q8)
        cudaFree(w->lm_head_q8);
    if (w->lm_head_s8)
        cudaFree(w->lm_head_s8);
    if (w->lm_head_c16)
        cudaFree(w->lm_head_c16);
    comet_cuda_be_leave(prev);
    free(w->lin);
    free(w->grp);
    w->magic = 0;
    free(w);
}

/* *dst = a new device buffer of n elements of `kind` (comet_cuda_fill_random) drawn from
 * the model's synthetic seed mixed with `salt`. */
static comet_status synth_new(cuda_impl *im, void **dst, size_t n, int kind, float lo, float hi,
                              uint64_t seed, uint64_t salt, const char *what) {
    size_t elem = kind == COMET_CUDA_FILL_BYTES ? 1 : kind == COMET_CUDA_FILL_F16 ? 2 : 4;
    CUDA_TRY(cudaMalloc(dst, n * elem), what);
    return comet_cuda_fill_random(*dst, n, kind, lo, hi, seed * 0x100000001B3ull + salt,
                                  im->stream);
}

/* A synthetic W4Ax weight [N, K]: random packed codes (uniform codes in any layout) and
 * block scales around 1 / (4.6 sqrt(K)), so that a row has about unit norm (the codes'
 * standard deviation is 4.6). */
static comet_status synth_w4ax(comet_backend *be, int N, int K, int B, uint64_t seed, uint64_t salt,
                               comet_w4ax_weight **out) {
    cuda_impl *im = impl_of(be);
    comet_w4ax_weight *w = calloc(1, sizeof *w);
    if (!w)
        return comet_set_error(COMET_ERR_NOMEM, "cuda backend: weights_load: out of memory");
    w->magic = CUDA_W4AX_MAGIC;
    w->device = im->device;
    w->N = N, w->K = K, w->B = B;
    *out = w; /* released by comet_cuda_be_w4ax_free, also after a failure below */
    float s = 1.0f / (4.6f * sqrtf((float)K));
    COMET_TRY(synth_new(im, (void **)&w->qw, comet_cuda_w4ax_packed_qw_bytes(N, K),
                        COMET_CUDA_FILL_BYTES, 0, 0, seed, salt, "weights_load: synthetic codes"));
    return synth_new(im, (void **)&w->sw, comet_cuda_w4ax_packed_sw_bytes(N, K, B) / 2,
                     COMET_CUDA_FILL_F16, 0.8f * s, 1.2f * s, seed, salt + 1,
                     "weights_load: synthetic scales");
}

/* Group g of layer l: its activation format from the first linear, checked against the
 * others, its permutation and norm weight on the device. */
static comet_status load_group(comet_backend *be, comet_weights *w, int l, comet_group g) {
    cuda_impl *im = impl_of(be);
    const comet_model *m = w->m;
    cuda_grp *gr = &w->grp[(size_t)l * LAYER_GROUPS + g];
    const int K = comet_group_width(m, g);
    const comet_linear *first = NULL;
    comet_role first_role = COMET_ROLE_COUNT;
    for (int r = 0; r < COMET_ROLE_COUNT; r++) {
        if (comet_role_group((comet_role)r) != g)
            continue;
        const comet_linear *lin = comet_model_linear(m, l, (comet_role)r);
        cuda_lin_kind kind = lin_kind(m, lin);
        if (kind == LIN_NONE)
            return comet_set_error(COMET_ERR_UNSUPPORTED,
                                   "cuda backend: layer %d %s: weight format %s with w_bits %d, "
                                   "a_bits %d; the CUDA backend runs fp32 linears (as FP16), "
                                   "QSIM with w_bits 4 and a_bits 4 or 8 (W4Ax) and QSIM with "
                                   "a_bits 16 (as FP16)",
                                   l, comet_cuda_role_names[r],
                                   lin->fmt == COMET_WFMT_F32    ? "f32"
                                   : lin->fmt == COMET_WFMT_QSIM ? "qsim"
                                                                 : "unknown",
                                   lin->w_bits, lin->a_bits);
        if (lin->n_in != K)
            return comet_set_error(
                COMET_ERR_FORMAT, "cuda backend: layer %d %s: %d inputs; its group %s is %d wide",
                l, comet_cuda_role_names[r], lin->n_in, comet_cuda_group_names[g], K);
        if (!first) {
            first = lin;
            first_role = (comet_role)r;
            gr->fmt.kind = kind == LIN_W4AX ? COMET_CUDA_ACT_W4AX : COMET_CUDA_ACT_F16;
            gr->fmt.K = K;
            gr->fmt.B = kind == LIN_W4AX ? lin->block : 0;
            gr->fmt.n8 = kind == LIN_W4AX ? lin->n8 : 0;
            if (kind == LIN_W4AX && ((lin->block != 64 && lin->block != 128) || K % lin->block ||
                                     K % 64 || lin->n8 < 0 || lin->n8 > K / lin->block))
                return comet_set_error(COMET_ERR_UNSUPPORTED,
                                       "cuda backend: layer %d %s: W4Ax with K = %d, block %d, "
                                       "n8 = %d; the GEMM takes blocks of 64 or 128 dividing K, "
                                       "K a multiple of 64",
                                       l, comet_cuda_role_names[r], K, lin->block, lin->n8);
            continue;
        }
        cuda_lin_kind first_kind = lin_kind(m, first);
        if (kind != first_kind || !same_perm(lin_perm(lin), lin_perm(first), K) ||
            (kind == LIN_W4AX && (lin->block != first->block || lin->n8 != first->n8)))
            return comet_set_error(COMET_ERR_UNSUPPORTED,
                                   "cuda backend: layer %d: %s and %s read one activation (group "
                                   "%s) but differ in its format (kind, permutation, block or "
                                   "n8)",
                                   l, comet_cuda_role_names[first_role], comet_cuda_role_names[r],
                                   comet_cuda_group_names[g]);
    }
    const int32_t *perm = lin_perm(first);
    if (perm) {
        void *p = NULL;
        comet_status st =
            upload_new(im, &p, perm, (size_t)K * sizeof *perm, "weights_load: permutation");
        gr->fmt.perm = p; /* released by comet_cuda_be_weights_free, also after a failed copy */
        COMET_TRY(st);
    }
    if (g == COMET_GROUP_QKV || g == COMET_GROUP_GATE_UP) {
        const float *norm = comet_model_norm(m, l, g);
        if (m->synthetic_seed) /* RMSNorm weights of 1 */
            return synth_new(im, (void **)&gr->norm, (size_t)m->cfg.n_embd, COMET_CUDA_FILL_F32,
                             1.0f, 1.0f, m->synthetic_seed, 0, "weights_load: norm weight");
        COMET_TRY(upload_new(im, (void **)&gr->norm, norm, (size_t)m->cfg.n_embd * sizeof *norm,
                             "weights_load: norm weight"));
    }
    return COMET_OK;
}

/* Group g's linears (QKV: q, k, v; GATE_UP: gate, up) of layer l stacked by rows into the
 * group's stack: W4Ax codes and scales concatenated on the host and packed as one weight,
 * fp16 rows converted into one buffer (each role's w16 points at its rows). The group's
 * format check (load_group) has made them one kind, one K and one block. */
static comet_status load_stack(comet_backend *be, comet_weights *w, int l, comet_group g,
                               float **stage) {
    cuda_impl *im = impl_of(be);
    const comet_model *m = w->m;
    cuda_lin *st = &w->grp[(size_t)l * LAYER_GROUPS + g].stack;
    comet_role roles[3];
    const int n_roles = comet_group_roles(g, roles);
    const comet_linear *first = comet_model_linear(m, l, roles[0]);
    const int K = first->n_in, B = first->block;
    int N = 0;
    for (int i = 0; i < n_roles; i++) {
        const comet_linear *lin = comet_model_linear(m, l, roles[i]);
        cuda_lin *cl = &w->lin[(size_t)l * COMET_ROLE_COUNT + roles[i]];
        cl->kind = lin_kind(m, lin);
        cl->N = lin->n_out, cl->K = lin->n_in, cl->row0 = N;
        N += lin->n_out;
    }
    st->kind = lin_kind(m, first);
    st->N = N, st->K = K, st->row0 = -1;
    const uint64_t seed = m->synthetic_seed,
                   salt = 16 * ((uint64_t)l * COMET_ROLE_COUNT + roles[0]) + 2;
    if (st->kind == LIN_W4AX) {
        if (seed)
            return synth_w4ax(be, N, K, B, seed, salt, &st->w4);
        const size_t q_row = (size_t)K / 2, s_row = (size_t)K / B;
        uint8_t *qw = malloc((size_t)N * q_row);
        uint16_t *sw = malloc((size_t)N * s_row * sizeof *sw);
        comet_status r = COMET_OK;
        if (!qw || !sw) {
            r = comet_set_error(COMET_ERR_NOMEM, "cuda backend: weights_load: out of memory");
        } else {
            for (int i = 0; i < n_roles; i++) {
                const comet_linear *lin = comet_model_linear(m, l, roles[i]);
                const int row0 = w->lin[(size_t)l * COMET_ROLE_COUNT + roles[i]].row0;
                memcpy(qw + (size_t)row0 * q_row, lin->qw, (size_t)lin->n_out * q_row);
                memcpy(sw + (size_t)row0 * s_row, lin->sw, (size_t)lin->n_out * s_row * sizeof *sw);
            }
            r = comet_cuda_be_w4ax_load(be, N, K, B, qw, sw, &st->w4);
            if (r < 0)
                r = comet_cuda_be_prefix_error(r, "weights_load, layer %d %s", l,
                                               comet_cuda_group_names[g]);
        }
        free(qw);
        free(sw);
        return r;
    }
    CUDA_TRY(cudaMalloc((void **)&st->w16, (size_t)N * K * sizeof *st->w16),
             "weights_load: fp16 linears");
    for (int i = 0; i < n_roles; i++) {
        cuda_lin *cl = &w->lin[(size_t)l * COMET_ROLE_COUNT + roles[i]];
        cl->w16 = st->w16 + (size_t)cl->row0 * K;
    }
    if (seed) { /* uniform with the variance of N(0, 1/K) */
        float a = sqrtf(3.0f / (float)K);
        return comet_cuda_fill_random(st->w16, (size_t)N * K, COMET_CUDA_FILL_F16, -a, a,
                                      seed * 0x100000001B3ull + salt, im->stream);
    }
    for (int i = 0; i < n_roles; i++) {
        const comet_linear *lin = comet_model_linear(m, l, roles[i]);
        const cuda_lin *cl = &w->lin[(size_t)l * COMET_ROLE_COUNT + roles[i]];
        COMET_TRY(convert_f16(im, cl->w16, lin->w, (size_t)lin->n_out * K, stage,
                              "weights_load: fp16 linear"));
    }
    return COMET_OK;
}

static comet_status load_linear(comet_backend *be, comet_weights *w, int l, comet_role r,
                                float **stage) {
    cuda_impl *im = impl_of(be);
    const comet_linear *lin = comet_model_linear(w->m, l, r);
    cuda_lin *cl = &w->lin[(size_t)l * COMET_ROLE_COUNT + r];
    cl->kind = lin_kind(w->m, lin);
    cl->N = lin->n_out, cl->K = lin->n_in, cl->row0 = -1;
    uint64_t seed = w->m->synthetic_seed, salt = 16 * ((uint64_t)l * COMET_ROLE_COUNT + r) + 2;
    if (seed && cl->kind == LIN_W4AX)
        return synth_w4ax(be, lin->n_out, lin->n_in, lin->block, seed, salt, &cl->w4);
    if (seed) { /* uniform with the variance of N(0, 1/K) */
        float a = sqrtf(3.0f / (float)lin->n_in);
        return synth_new(im, (void **)&cl->w16, (size_t)lin->n_out * lin->n_in, COMET_CUDA_FILL_F16,
                         -a, a, seed, salt, "weights_load: fp16 linear");
    }
    if (cl->kind == LIN_W4AX) {
        comet_status st = comet_cuda_be_w4ax_load(be, lin->n_out, lin->n_in, lin->block, lin->qw,
                                                  lin->sw, &cl->w4);
        if (st < 0)
            return comet_cuda_be_prefix_error(st, "weights_load, layer %d %s", l,
                                              comet_cuda_role_names[r]);
        return COMET_OK;
    }
    return upload_f16(im, &cl->w16, lin->w, (size_t)lin->n_out * lin->n_in, stage,
                      "weights_load: fp16 linear");
}

/* The INT8 lm_head (docs/numerics.md "lm_head") of a synthetic model: uniform random codes
 * (standard deviation 74) and row scales around 1 / (74 sqrt(C)), rows of about unit norm
 * as the fp16 variant's. */
static comet_status synth_lm_head_q8(cuda_impl *im, comet_weights *w, uint64_t seed) {
    const float s = 1.0f / (74.0f * sqrtf((float)w->C));
    COMET_TRY(synth_new(im, (void **)&w->lm_head_q8, (size_t)w->V * w->C, COMET_CUDA_FILL_BYTES, 0,
                        0, seed, 2, "weights_load: lm_head codes"));
    return synth_new(im, (void **)&w->lm_head_s8, (size_t)w->V, COMET_CUDA_FILL_F16, 0.8f * s,
                     1.2f * s, seed, 3, "weights_load: lm_head scales");
}

/* The model's INT8 lm_head codes and scales, copied as they are. */
static comet_status upload_lm_head_q8(cuda_impl *im, comet_weights *w, const comet_model *m) {
    if (!m->lm_head_q8 || !m->lm_head_s8)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "cuda backend: weights_load: lm_head_bits 8 without its codes");
    COMET_TRY(upload_new(im, (void **)&w->lm_head_q8, m->lm_head_q8, (size_t)w->V * w->C,
                         "weights_load: lm_head codes"));
    return upload_new(im, (void **)&w->lm_head_s8, m->lm_head_s8, (size_t)w->V * 2,
                      "weights_load: lm_head scales");
}

comet_status comet_cuda_be_weights_load(comet_backend *be, const comet_model *m,
                                        comet_weights **out) {
    cuda_impl *im = impl_of(be);
    const comet_model_config *c = &m->cfg;
    *out = NULL;
    const float *lm = m->lm_head ? m->lm_head : m->tok_embd;
    if (!m->synthetic_seed && (!m->tok_embd || !lm || !m->output_norm))
        return comet_set_error(COMET_ERR_INVALID_ARG, "cuda backend: weights_load: the model has "
                                                      "no token embedding, lm_head or output norm");
    comet_weights *w = calloc(1, sizeof *w);
    if (!w)
        return comet_set_error(COMET_ERR_NOMEM, "cuda backend: weights_load: out of memory");
    w->magic = CUDA_WEIGHTS_MAGIC;
    w->device = im->device;
    w->m = m;
    w->n_layer = c->n_layer, w->C = c->n_embd, w->V = c->n_vocab;
    w->lin = calloc((size_t)c->n_layer * COMET_ROLE_COUNT, sizeof *w->lin);
    w->grp = calloc((size_t)c->n_layer * LAYER_GROUPS + 1, sizeof *w->grp);
    if (!w->lin || !w->grp) {
        free(w->lin);
        free(w->grp);
        free(w);
        return comet_set_error(COMET_ERR_NOMEM, "cuda backend: weights_load: out of memory");
    }
    CUcontext prev;
    cudaError_t e = comet_cuda_be_enter(im->device, &prev);
    if (e != cudaSuccess) {
        comet_cuda_be_weights_free(be, w);
        return comet_cuda_be_fail(e, "weights_load: cudaSetDevice");
    }
    float *stage = NULL;
    comet_status st = COMET_OK;
    for (int l = 0; l < c->n_layer && st >= 0; l++) {
        for (int g = 0; g < LAYER_GROUPS && st >= 0; g++)
            st = load_group(be, w, l, (comet_group)g);
        for (int g = 0; g < LAYER_GROUPS && st >= 0; g++)
            if (g == COMET_GROUP_QKV || g == COMET_GROUP_GATE_UP)
                st = load_stack(be, w, l, (comet_group)g, &stage);
        for (int r = 0; r < COMET_ROLE_COUNT && st >= 0; r++)
            if (comet_role_group((comet_role)r) == COMET_GROUP_O ||
                comet_role_group((comet_role)r) == COMET_GROUP_DOWN)
                st = load_linear(be, w, l, (comet_role)r, &stage);
    }
    if (st >= 0) {
        cuda_grp *lg = &w->grp[(size_t)c->n_layer * LAYER_GROUPS];
        lg->fmt.kind = COMET_CUDA_ACT_F16;
        lg->fmt.K = c->n_embd;
        st = m->synthetic_seed
                 ? synth_new(im, (void **)&lg->norm, (size_t)c->n_embd, COMET_CUDA_FILL_F32, 1.0f,
                             1.0f, m->synthetic_seed, 0, "weights_load: output norm")
                 : upload_new(im, (void **)&lg->norm, m->output_norm,
                              (size_t)c->n_embd * sizeof(float), "weights_load: output norm");
    }
    size_t vc = (size_t)c->n_vocab * c->n_embd;
    float ea = sqrtf(3.0f / (float)c->n_embd);
    if (st >= 0)
        st = m->synthetic_seed ? synth_new(im, (void **)&w->embd, vc, COMET_CUDA_FILL_F32, -1.0f,
                                           1.0f, m->synthetic_seed, 1, "weights_load: embedding")
                               : upload_new(im, (void **)&w->embd, m->tok_embd, vc * sizeof(float),
                                            "weights_load: token embedding");
    if (st >= 0 && m->lm_head_bits == 8) { /* INT8 rows: codes and fp16 scales */
        st = m->synthetic_seed ? synth_lm_head_q8(im, w, m->synthetic_seed)
                               : upload_lm_head_q8(im, w, m);
        if (st >= 0) /* the codes as fp16 for cuBLAS at many rows (lm_head_w8.h) */
            st = (e = cudaMalloc((void **)&w->lm_head_c16, vc * 2)) != cudaSuccess
                     ? comet_cuda_be_fail(e, "weights_load: lm_head codes as fp16")
                     : comet_cuda_lm_head_codes_f16(w->lm_head_q8, vc, w->lm_head_c16, im->stream);
    } else if (st >= 0)
        st = m->synthetic_seed
                 ? synth_new(im, (void **)&w->lm_head, vc, COMET_CUDA_FILL_F16, -ea, ea,
                             m->synthetic_seed, 2, "weights_load: lm_head")
                 : upload_f16(im, &w->lm_head, lm, vc, &stage, "weights_load: lm_head");
    if (st >= 0 && (e = cudaStreamSynchronize(im->stream)) != cudaSuccess)
        st = comet_cuda_be_fail(e, "weights_load: copying the weights");
    if (stage) {
        cudaStreamSynchronize(im->stream);
        cudaFree(stage);
    }
    comet_cuda_be_leave(prev);
    if (st < 0) {
        comet_cuda_be_weights_free(be, w);
        return st;
    }
    *out = w;
    return COMET_OK;
}

comet_status comet_cuda_be_check_weights(const cuda_impl *im, const comet_weights *w,
                                         const char *op) {
    if (!w || w->magic != CUDA_WEIGHTS_MAGIC || w->device != im->device)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "cuda backend: %s: the weights were not "
                               "loaded by a CUDA backend of device %d",
                               op, im->device);
    return COMET_OK;
}

#endif
