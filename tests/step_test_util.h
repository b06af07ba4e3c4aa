/* step_test_util.h — helpers of the step-op tests (test_backend_ops.c, tests/cuda; cmocka:
 * include after <cmocka.h>):
 * guarded and poisoned buffers in any backend's memory (through the op table's alloc /
 * upload / download, so the same code serves the CPU and the CUDA backend), a random
 * LLaMA model of chosen shape whose buffers the model owns (so comet_fmpq_quantize can
 * replace them and comet_model_free releases everything), its FMPQ-quantized variants, and
 * the comparison of a quantized activation (INT8 codes + fp32 block scales) with a
 * reference.
 *
 * Header-only (static functions): each test stays one executable. */
#ifndef COMET_TESTS_STEP_TEST_UTIL_H
#define COMET_TESTS_STEP_TEST_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "comet/model.h"
#include "quant/fmpq.h"
#include "numerics/quant.h"

/* ---- buffers in a backend's memory, with guards ------------------------------------------
 *
 * SB_GUARD bytes of a fixed pattern on each side of the payload (256, so that the payload
 * keeps alloc's 256-byte alignment). The payload is poisoned with one byte value before an
 * op writes it: 0xFF makes every fp32 / fp16 element a NaN (and every int8 code -1), so an
 * element the op leaves unwritten shows up as NaN or as a code / scale mismatch. */
#define SB_GUARD 256

typedef struct sbuf {
    comet_backend *be;
    uint8_t *raw; /* backend memory: [SB_GUARD | payload n | SB_GUARD] */
    size_t n;     /* payload bytes */
} sbuf;

static inline uint8_t sb_guard_byte(size_t i) { return (uint8_t)(0xA5u ^ (i * 29u)); }

static inline void *sb_ptr(const sbuf *b) { return b->raw + SB_GUARD; }
static inline float *sb_f(const sbuf *b) { return (float *)sb_ptr(b); }

/* n payload bytes (n > 0) with guards, payload poisoned with 0xFF. */
static inline sbuf sb_alloc(comet_backend *be, size_t n) {
    sbuf b = {be, NULL, n};
    size_t all = n + 2 * SB_GUARD;
    b.raw = be->ops->alloc(be, all);
    if (!b.raw)
        fail_msg("%s backend: alloc of %zu bytes failed: %s", be->ops->name, all,
                 comet_last_error());
    uint8_t *h = malloc(all);
    assert_non_null(h);
    for (size_t i = 0; i < SB_GUARD; i++)
        h[i] = h[SB_GUARD + n + i] = sb_guard_byte(i);
    memset(h + SB_GUARD, 0xFF, n);
    assert_int_equal(be->ops->upload(be, b.raw, h, all), COMET_OK);
    free(h);
    return b;
}

static inline void sb_upload(sbuf *b, const void *src, size_t n) {
    assert_true(n <= b->n);
    assert_int_equal(b->be->ops->upload(b->be, sb_ptr(b), src, n), COMET_OK);
}

/* A new buffer holding a copy of host src[n]. */
static inline sbuf sb_from(comet_backend *be, const void *src, size_t n) {
    sbuf b = sb_alloc(be, n);
    sb_upload(&b, src, n);
    return b;
}

static inline void sb_download(const sbuf *b, void *dst, size_t n) {
    assert_true(n <= b->n);
    if (b->be->ops->download(b->be, dst, sb_ptr(b), n) != COMET_OK)
        fail_msg("%s backend: download failed: %s", b->be->ops->name, comet_last_error());
}

/* 1 when both guards still hold their pattern. */
static inline int sb_guards_ok(const sbuf *b) {
    uint8_t h[SB_GUARD];
    int ok = 1;
    assert_int_equal(b->be->ops->download(b->be, h, b->raw, SB_GUARD), COMET_OK);
    for (size_t i = 0; i < SB_GUARD; i++)
        ok &= h[i] == sb_guard_byte(i);
    assert_int_equal(b->be->ops->download(b->be, h, b->raw + SB_GUARD + b->n, SB_GUARD), COMET_OK);
    for (size_t i = 0; i < SB_GUARD; i++)
        ok &= h[i] == sb_guard_byte(i);
    return ok;
}

static inline void sb_free(sbuf *b) {
    if (b->raw)
        b->be->ops->free(b->be, b->raw);
    b->raw = NULL;
}

/* A host copy of the first n bytes (malloc'ed). */
static inline void *sb_fetch(const sbuf *b, size_t n) {
    void *h = malloc(n ? n : 1);
    assert_non_null(h);
    sb_download(b, h, n);
    return h;
}

/* Fail naming `what` when a guard changed. */
#define SB_CHECK_GUARDS(b, what)                                                                   \
    do {                                                                                           \
        if (!sb_guards_ok(b))                                                                      \
            fail_msg("%s backend: %s wrote outside its buffer (guard bytes changed)",              \
                     (b)->be->ops->name, what);                                                    \
    } while (0)

/* Fail naming the op and the backend's message unless st == COMET_OK. */
#define OP_OK(be, call, what)                                                                      \
    do {                                                                                           \
        comet_status op_ok_st_ = (call);                                                           \
        if (op_ok_st_ != COMET_OK)                                                                 \
            fail_msg("%s backend: %s returned %d: %s", (be)->ops->name, what, (int)op_ok_st_,      \
                     comet_last_error());                                                          \
    } while (0)

/* ---- numbers ------------------------------------------------------------------------------ */

static uint64_t st_rng = 0x853C49E6748FEA9Bull;

static inline void st_seed(uint64_t s) { st_rng = s ? s : 1; }

/* splitmix64 of a key: a value that depends only on the key (inputs that are the same
 * whatever batch a token lands in). */
static inline uint64_t st_mix(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline uint64_t st_next(void) { return st_mix(st_rng++); }

/* uniform in [-1, 1) */
static inline float st_u(void) { return (float)((st_next() >> 40) * (2.0 / 16777216.0) - 1.0); }

/* uniform in [-1, 1) from a key */
static inline float st_ukey(uint64_t key) {
    return (float)((st_mix(key) >> 40) * (2.0 / 16777216.0) - 1.0);
}

/* n floats: uniform * scale, and about one channel in 16 (fixed by its index k % width)
 * ten times larger: activations with outlier channels, which the INT8 blocks are for. */
static inline void st_fill_act(float *x, int rows, int width, float scale) {
    for (int t = 0; t < rows; t++)
        for (int k = 0; k < width; k++)
            x[(size_t)t * width + k] =
                st_u() * scale * ((st_mix((uint64_t)k * 7919u) & 15) ? 1.0f : 10.0f);
}

/* ||a - b|| / ||b|| in double; NaN anywhere gives +inf */
static inline double st_nerr(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (a[i] != a[i] || b[i] != b[i])
            return INFINITY;
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* The first NaN in x[n], or -1. */
static inline long st_first_nan(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (x[i] != x[i])
            return (long)i;
    return -1;
}

static inline void *st_malloc(size_t n) {
    void *p = malloc(n ? n : 1);
    assert_non_null(p);
    return p;
}

/* ---- batches ------------------------------------------------------------------------------ */

/* Host arrays of one step's batch (st_batch_make); freed by st_batch_free. */
typedef struct st_batch {
    comet_batch b;
    int32_t *tokens, *positions, *token_indptr, *page_indptr, *page_indices, *last_page_len,
        *logit_rows;
    int *tok_seq; /* [T] sequence of each token */
} st_batch;

static inline void st_batch_free(st_batch *h) {
    free(h->tokens), free(h->positions), free(h->token_indptr), free(h->page_indptr);
    free(h->page_indices), free(h->last_page_len), free(h->logit_rows), free(h->tok_seq);
    memset(h, 0, sizeof *h);
}

/* Sequences s < n_seq with tokens start[s] .. start[s] + n[s] - 1 in this step, their pages
 * of P tokens pages[s][0..]; tok_seq[t] is seq_ids[s] (NULL: s). Token ids: with V > 0 the
 * first two 0 and V - 1, then random below V (st_next); V <= 0: all 0. Logits for
 * rows[0..n_rows). */
static inline st_batch st_batch_make(int P, int n_seq, const int *start, const int *n,
                                     int32_t *const *pages, const int *seq_ids, int V,
                                     const int32_t *rows, int n_rows) {
    st_batch h;
    memset(&h, 0, sizeof h);
    int T = 0, np = 0;
    for (int s = 0; s < n_seq; s++)
        T += n[s], np += (start[s] + n[s] + P - 1) / P;
    h.tokens = st_malloc((size_t)T * 4);
    h.positions = st_malloc((size_t)T * 4);
    h.tok_seq = st_malloc((size_t)T * sizeof(int));
    h.token_indptr = st_malloc((size_t)(n_seq + 1) * 4);
    h.page_indptr = st_malloc((size_t)(n_seq + 1) * 4);
    h.page_indices = st_malloc((size_t)np * 4);
    h.last_page_len = st_malloc((size_t)n_seq * 4);
    h.logit_rows = st_malloc((size_t)(n_rows > 0 ? n_rows : 1) * 4);
    int t = 0, p = 0;
    h.token_indptr[0] = h.page_indptr[0] = 0;
    for (int s = 0; s < n_seq; s++) {
        for (int j = 0; j < n[s]; j++, t++) {
            h.tokens[t] = V <= 0 || t == 0 ? 0
                          : t == 1     ? V - 1
                                       : (int32_t)(st_next() % (uint64_t)V);
            h.positions[t] = start[s] + j;
            h.tok_seq[t] = seq_ids ? seq_ids[s] : s;
        }
        int len = start[s] + n[s], n_pages = (len + P - 1) / P;
        for (int j = 0; j < n_pages; j++)
            h.page_indices[p++] = pages[s][j];
        h.last_page_len[s] = len - (n_pages - 1) * P;
        h.token_indptr[s + 1] = t;
        h.page_indptr[s + 1] = p;
    }
    if (n_rows)
        memcpy(h.logit_rows, rows, (size_t)n_rows * 4);
    h.b = (comet_batch){.n_tokens = T,
                        .n_seqs = n_seq,
                        .tokens = h.tokens,
                        .positions = h.positions,
                        .token_indptr = h.token_indptr,
                        .page_indptr = h.page_indptr,
                        .page_indices = h.page_indices,
                        .last_page_len = h.last_page_len,
                        .n_logits = n_rows,
                        .logit_rows = h.logit_rows};
    return h;
}

/* ---- models ------------------------------------------------------------------------------- */

static inline float *st_own_rand(comet_model *m, size_t n, float scale, float offset) {
    float *p = comet_model_own(m, malloc(n * sizeof *p));
    assert_non_null(p);
    for (size_t i = 0; i < n; i++)
        p[i] = offset + st_u() * scale;
    return p;
}

static inline comet_linear st_linear(comet_model *m, int n_out, int n_in) {
    comet_linear l = {.n_out = n_out,
                      .n_in = n_in,
                      .fmt = COMET_WFMT_F32,
                      .w = st_own_rand(m, (size_t)n_out * n_in, 1.0f / sqrtf((float)n_in), 0.0f)};
    return l;
}

/* A random LLaMA with fp32 linears (COMET_WFMT_F32); free with comet_model_free. */
static inline comet_model *st_model(uint64_t seed, int n_layer, int C, int F, int H, int Hkv, int D,
                                    int V) {
    st_seed(seed);
    comet_model *m = calloc(1, sizeof *m);
    assert_non_null(m);
    comet_model_config *c = &m->cfg;
    c->arch = COMET_ARCH_LLAMA;
    c->n_layer = n_layer;
    c->n_embd = C;
    c->n_ff = F;
    c->n_head = H;
    c->n_head_kv = Hkv;
    c->head_dim = D;
    c->n_vocab = V;
    c->n_ctx = 8192;
    c->rms_eps = 1e-5f;
    c->rope_theta = 10000.0f;
    c->rope_scaling = COMET_ROPE_SCALING_NONE;
    c->bos_id = -1;
    m->tok_embd = st_own_rand(m, (size_t)V * C, 1.0f, 0.0f);
    m->output_norm = st_own_rand(m, C, 0.5f, 1.0f);
    m->lm_head = st_own_rand(m, (size_t)V * C, 0.3f, 0.0f);
    m->layers = calloc((size_t)n_layer, sizeof *m->layers);
    assert_non_null(m->layers);
    for (int l = 0; l < n_layer; l++) {
        comet_layer_weights *w = &m->layers[l];
        w->attn_norm = st_own_rand(m, C, 0.2f, 1.0f);
        w->ffn_norm = st_own_rand(m, C, 0.2f, 1.0f);
        w->wq = st_linear(m, H * D, C);
        w->wk = st_linear(m, Hkv * D, C);
        w->wv = st_linear(m, Hkv * D, C);
        w->wo = st_linear(m, C, H * D);
        w->w_gate = st_linear(m, F, C);
        w->w_up = st_linear(m, F, C);
        w->w_down = st_linear(m, C, F);
    }
    return m;
}

/* FMPQ on m in place (RTN with the clipping search, no GPTQ): w_bits, a_bits, block B
 * (64 / 128). Salience is random with ~2 % outlier channels, so the permutations are far
 * from the identity and with a_bits 4 some groups get INT8 blocks (n8 > 0). */
static inline void st_quantize(comet_model *m, int w_bits, int a_bits, int block) {
    comet_calib_stats *cs = comet_calib_stats_init(&m->cfg, 0);
    assert_non_null(cs);
    for (int g = 0; g < COMET_GROUP_LAYER_COUNT; g++)
        for (size_t i = 0; i < (size_t)m->cfg.n_layer * cs->width[g]; i++)
            cs->sal[g][i] = (0.5f + 0.5f * st_u()) * (st_next() % 50 == 0 ? 50.0f : 1.0f);
    cs->n_tokens = 1;
    comet_fmpq_params p = comet_fmpq_default_params();
    p.w_bits = w_bits;
    p.a_bits = a_bits;
    p.kv.type = COMET_KV_INT4;
    p.block = block;
    p.gptq = 0;
    p.clip_search = 1;
    if (comet_fmpq_quantize(m, cs, &p) != COMET_OK)
        fail_msg("comet_fmpq_quantize (w%d a%d B%d): %s", w_bits, a_bits, block,
                 comet_last_error());
    comet_calib_stats_free(cs);
}

/* ---- activations ---------------------------------------------------------------------- */

/* The first linear of group g in layer l (its permutation, block, n8, a_bits are the
 * group's); NULL for LM_HEAD. */
static inline const comet_linear *st_group_linear(const comet_model *m, int l, comet_group g) {
    static const comet_role first[COMET_GROUP_COUNT] = {COMET_ROLE_Q, COMET_ROLE_O, COMET_ROLE_GATE,
                                                        COMET_ROLE_DOWN, COMET_ROLE_COUNT};
    return g == COMET_GROUP_LM_HEAD ? NULL : comet_model_linear(m, l, first[g]);
}

/* 1 when group g of layer l is read as INT8 codes + scales (the W4Ax GEMM) on CUDA: a QSIM
 * group with quantized activations. Otherwise the CUDA act is fp16 [T, K]. */
static inline int st_group_w4ax(const comet_model *m, int l, comet_group g) {
    const comet_linear *lin = st_group_linear(m, l, g);
    return lin && lin->fmt == COMET_WFMT_QSIM && lin->a_bits < 16;
}

/* The CUDA act layout (norm_quant.h, assumed here, not asked from the backend): int8 codes
 * [T, K] at byte 0, fp32 scales [T, K/B] at byte roundup(T*K, 256). */
static inline size_t st_act_scales_offset(int T, int K) {
    return ((size_t)T * K + 255) & ~(size_t)255;
}

/* xg [T, K] = x [T, K] gathered by perm (NULL: identity). */
static inline void st_gather(const float *x, int T, int K, const int32_t *perm, float *xg) {
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++)
            xg[(size_t)t * K + k] = x[(size_t)t * K + (perm ? perm[k] : k)];
}

typedef struct st_qcmp {
    long codes, code_diff, code_diff_bad; /* all codes, differing codes, those not allowed */
    long scales, scale_bad;               /* all scales, those out of tolerance */
    double max_scale_rel;
    char first_bad[256]; /* the first problem, for the failure message */
} st_qcmp;

/* Compare an activation's codes qc [T, K] and scales sc [T, K/B] with the reference qr, sr
 * made by comet_quant_act from xg [T, K] (gathered fp32 rows). A code may differ from the
 * reference by one only where the reference's pre-rounding value |xg * (1/s)| lies within
 * boundary_tol of a .5 boundary (boundary_tol 0: codes bit-exact); a scale must be within
 * scale_rel of the reference (0: bit-exact). */
static inline st_qcmp st_compare_act(const int8_t *qc, const float *sc, const int8_t *qr,
                                     const float *sr, const float *xg, int T, int K, int B,
                                     double boundary_tol, double scale_rel) {
    st_qcmp r;
    memset(&r, 0, sizeof r);
    int nb = K / B;
    for (int t = 0; t < T; t++)
        for (int b = 0; b < nb; b++) {
            float s_ref = sr[(size_t)t * nb + b], s = sc[(size_t)t * nb + b];
            r.scales++;
            double rel =
                s_ref != 0 ? fabs((double)s - s_ref) / fabs(s_ref) : (s == 0 ? 0 : INFINITY);
            if (s != s)
                rel = INFINITY;
            if (rel > r.max_scale_rel)
                r.max_scale_rel = rel;
            int bad_s = scale_rel == 0 ? memcmp(&s, &s_ref, 4) != 0 : !(rel <= scale_rel);
            if (bad_s) {
                if (!r.scale_bad && !r.code_diff_bad)
                    snprintf(r.first_bad, sizeof r.first_bad,
                             "scale [t %d, block %d] = %.9g, reference %.9g (rel %.3g)", t, b, s,
                             s_ref, rel);
                r.scale_bad++;
            }
            for (int k = b * B; k < (b + 1) * B; k++) {
                size_t i = (size_t)t * K + k;
                r.codes++;
                if (qc[i] == qr[i])
                    continue;
                r.code_diff++;
                double v = s_ref != 0 ? fabs((double)(xg[i] * (1.0f / s_ref))) : 0;
                double frac = v - floor(v);
                int ok = boundary_tol > 0 && abs((int)qc[i] - (int)qr[i]) == 1 &&
                         fabs(frac - 0.5) <= boundary_tol;
                if (!ok) {
                    if (!r.scale_bad && !r.code_diff_bad)
                        snprintf(r.first_bad, sizeof r.first_bad,
                                 "code [t %d, k %d] = %d, reference %d (x/s = %.7f)", t, k, qc[i],
                                 qr[i], xg[i] * (1.0f / s_ref));
                    r.code_diff_bad++;
                }
            }
        }
    return r;
}

/* Download a W4Ax act [T, K] whose fp32 scales start at byte `off` (codes at 0) into host
 * qc [T*K], sc [T*K/B]. */
static inline void st_fetch_w4ax_act_at(const sbuf *act, int T, int K, int B, size_t off,
                                        int8_t *qc, float *sc) {
    size_t ns = (size_t)T * (K / B);
    uint8_t *h = sb_fetch(act, off + ns * 4);
    memcpy(qc, h, (size_t)T * K);
    memcpy(sc, h + off, ns * 4);
    free(h);
}

/* Download a CUDA W4Ax act [T, K] (codes + scales) into host qc [T*K], sc [T*K/B]. */
static inline void st_fetch_w4ax_act(const sbuf *act, int T, int K, int B, int8_t *qc, float *sc) {
    st_fetch_w4ax_act_at(act, T, K, B, st_act_scales_offset(T, K), qc, sc);
}

/* Download a CUDA fp16 act [T, K] as fp32. */
static inline void st_fetch_f16_act(const sbuf *act, int T, int K, float *out) {
    size_t n = (size_t)T * K;
    uint16_t *h = sb_fetch(act, n * 2);
    for (size_t i = 0; i < n; i++)
        out[i] = comet_quant_f16_value(h[i]);
    free(h);
}

/* Every op the forward pass calls is present in be's table. */
#define NEED(be, op)                                                                               \
    do {                                                                                           \
        if (!(be)->ops->op)                                                                        \
            fail_msg("backend '%s' has no '%s' op", (be)->ops->name, #op);                         \
    } while (0)

static inline void need_all(comet_backend *be) {
    NEED(be, alloc);
    NEED(be, free);
    NEED(be, upload);
    NEED(be, download);
    NEED(be, sync);
    NEED(be, weights_load);
    NEED(be, weights_free);
    NEED(be, kv_init);
    NEED(be, kv_free);
    NEED(be, step_begin);
    NEED(be, embed_tokens);
    NEED(be, rmsnorm_quant);
    NEED(be, act_quant);
    NEED(be, silu_mul_quant);
    NEED(be, matmul);
    NEED(be, rope_kv_append);
    NEED(be, paged_attention);
    NEED(be, lm_head);
}

/* Wait for the CUDA backend's queued work, failing the test on an error. */
static inline void st_sync_ok(comet_backend *be) { OP_OK(be, be->ops->sync(be), "sync"); }

#endif
