/* test_step_ops_cuda.c — what the op-test table (tests/test_backend_ops.c: every step op
 * of every backend against the scalar reference by relative norm error) does not check of
 * the CUDA backend's step ops: its activation codes and scales, exactly, against the CPU
 * backend (comet_backend_cpu_init(1)) with the same weights and the same inputs (backend.h
 * "step ops"):
 *
 * - rmsnorm_quant (QKV, GATE_UP, LM_HEAD groups, with and without residual): x keeps the
 *   bit-exact sum; a quantized group's INT8 codes equal the codes comet_quant_act gives for
 *   the CPU's gathered RMSNorm output except where the pre-rounding value x/s lies within
 *   1e-3 of a .5 boundary (the two norms sum in different orders), scales within 1e-5
 *   relative; an fp16 act within 1e-3 relative norm error of the CPU's fp32 one.
 * - act_quant (O): codes and scales bit-exact with comet_quant_act on the same gathered
 *   input; an fp16 act bit-exact with the input rounded to fp16.
 * - silu_mul_quant (DOWN): as act_quant, except that codes may differ within 1e-4 of a .5
 *   boundary and scales by 1e-6 relative: the CUDA expf and glibc's expf may differ by an
 *   ulp (the quantizer itself is checked bit-exact by act_quant).
 * - comet_cuda_rmsnorm_quant's forms (the row in shared memory, the early gather loads, the
 *   thread-block cluster of 2, 4 or 8 CTAs a row) against each other, bit for bit: one CTA a row
 *   with and without the row in shared memory at widths 4096 to 33024 and 1 to 65 rows; the
 *   cluster forms against one CTA a row at widths 2048 to 16384 (blocks of 128 and 64, odd
 *   widths) and 1 to 17 rows; W4Ax and fp16, with and without the residual.
 * - matmul of the W4Ax variants, every role of every layer, from one activation (the CPU's
 *   codes and scales uploaded in the CUDA layout): within 1e-4 relative norm error (exact
 *   int32 block sums on both sides) and 1e-3 relative per row.
 * Layouts assumed here, not asked from the backend: a W4Ax activation buffer holds int8
 * codes [T, K] at byte 0 and fp32 scales [T, K/B] at byte roundup(T*K, 256); an fp16 one
 * holds fp16 [T, K] at byte 0 (norm_quant.h). The attention ops' own checks are in
 * test_attention_cuda.c.
 * Every output is poisoned (0xFF bytes: NaN) before the op and framed by guard bytes.
 *
 * Exit 77 (ctest: skipped) when no CUDA device is usable. Models: a random 2-layer LLaMA
 * (C 256, F 512, H 6, Hkv 2, D 64, V 320) as fp32, FMPQ W4A4 (B 64, INT8 blocks),
 * W4A8 (B 128) and W16A16 (permuted, fp16 weights) (step_test_util.h). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_prims.h"
#include "backend/batch.h"
#include "backend/cuda/cuda_kv.h"
#include "backend/cuda/norm_quant.h"
#include "comet/model.h"
#include "engine/kv_pages.h"
#include "numerics/quant.h"

#include "cuda_skip.h"
#include "step_test_util.h"

static comet_backend *g_cuda, *g_cpu;

/* ---- the op table -------------------------------------------------------------------------- */

static void test_op_table(void **state) {
    (void)state;
    assert_string_equal(g_cuda->ops->name, "cuda");
    need_all(g_cuda);
    need_all(g_cpu);
    /* the CPU primitives used below as references */
    assert_non_null(comet_cpu_prims_of(g_cpu)->rmsnorm);
    assert_non_null(comet_cpu_prims_of(g_cpu)->silu_mul);
}

/* ---- models on both backends ------------------------------------------------------------- */

typedef struct variant {
    const char *name;
    int w_bits, a_bits, block; /* w_bits 0: the fp32 model as made */
} variant;

static const variant V_FP32 = {"fp32", 0, 0, 0};
static const variant V_W4A4 = {"w4a4 B64", 4, 4, 64};
static const variant V_W4A8 = {"w4a8 B128", 4, 8, 128};
static const variant V_W16 = {"w16a16 permuted", 16, 16, 64};

typedef struct pair {
    comet_model *m;
    comet_weights *wc, *wg; /* CPU, CUDA */
} pair;

static pair pair_make(const variant *v) {
    need_all(g_cuda);
    need_all(g_cpu);
    pair p;
    p.m = st_model(0x5EEDull + (uint64_t)v->w_bits * 131 + (uint64_t)v->a_bits * 7 + v->block, 2,
                   256, 512, 6, 2, 64, 320);
    if (v->w_bits)
        st_quantize(p.m, v->w_bits, v->a_bits, v->block);
    OP_OK(g_cpu, g_cpu->ops->weights_load(g_cpu, p.m, &p.wc), "weights_load");
    OP_OK(g_cuda, g_cuda->ops->weights_load(g_cuda, p.m, &p.wg), "weights_load");
    return p;
}

static void pair_free(pair *p) {
    g_cpu->ops->weights_free(g_cpu, p->wc);
    g_cuda->ops->weights_free(g_cuda, p->wg);
    comet_model_free(p->m);
}

/* The CPU act (fp32 [T, K]) of a W4Ax group must be the dequantized reference codes: a
 * check that the reference below reads the CPU's path right. */
static void cpu_act_is_dequant(const float *act, const int8_t *q, const float *s, int T, int K,
                               int B, const char *what) {
    int nb = K / B;
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++) {
            float want = (float)q[(size_t)t * K + k] * s[(size_t)t * nb + k / B];
            if (memcmp(&want, &act[(size_t)t * K + k], 4))
                fail_msg("%s: the CPU act [%d, %d] = %.9g is not the reference code * scale %.9g "
                         "(the test's reading of the CPU path is off)",
                         what, t, k, act[(size_t)t * K + k], want);
        }
}

/* Compare the CUDA act `ag` of group g (layer l) with the reference made from xg [T, K]
 * (the gathered fp32 input of the quantizer, CPU side) and with the CPU's act `ac_h`. */
static void check_act(const pair *p, int l, comet_group g, const sbuf *ag, const float *ac_h,
                      const float *xg, int T, int K, double boundary_tol, double scale_rel,
                      double f16_nerr, const char *what) {
    if (st_group_w4ax(p->m, l, g)) {
        const comet_linear *lin = st_group_linear(p->m, l, g);
        int B = lin->block, nb = K / B;
        int8_t *qr = st_malloc((size_t)T * K), *qc = st_malloc((size_t)T * K);
        float *sr = st_malloc((size_t)T * nb * 4), *sc = st_malloc((size_t)T * nb * 4);
        comet_quant_act(xg, T, K, B, lin->n8, qr, sr);
        cpu_act_is_dequant(ac_h, qr, sr, T, K, B, what);
        st_fetch_w4ax_act(ag, T, K, B, qc, sc);
        st_qcmp r = st_compare_act(qc, sc, qr, sr, xg, T, K, B, boundary_tol, scale_rel);
        if (r.code_diff || r.max_scale_rel > 0)
            print_message("  %s: %ld of %ld codes differ (allowed: near .5), max scale rel %.3g\n",
                          what, r.code_diff, r.codes, r.max_scale_rel);
        if (r.code_diff_bad || r.scale_bad)
            fail_msg("%s (B %d, n8 %d): %ld codes and %ld scales out of tolerance; first: %s", what,
                     B, lin->n8, r.code_diff_bad, r.scale_bad, r.first_bad);
        free(qr), free(qc), free(sr), free(sc);
    } else {
        float *a16 = st_malloc((size_t)T * K * 4);
        st_fetch_f16_act(ag, T, K, a16);
        long nan_at = st_first_nan(a16, (size_t)T * K);
        if (nan_at >= 0)
            fail_msg("%s: fp16 act element %ld is NaN (unwritten?)", what, nan_at);
        if (f16_nerr == 0) { /* the fp16 rounding of the CPU's fp32 act, bit for bit */
            for (size_t i = 0; i < (size_t)T * K; i++)
                if (comet_quant_f16_round(ac_h[i]) != a16[i])
                    fail_msg("%s: fp16 act element %zu = %.9g, want fp16(%.9g) = %.9g", what, i,
                             a16[i], ac_h[i], comet_quant_f16_round(ac_h[i]));
        } else {
            double e = st_nerr(a16, ac_h, (size_t)T * K);
            if (!(e <= f16_nerr))
                fail_msg("%s: fp16 act relative norm error %.3g > %.3g", what, e, f16_nerr);
        }
        free(a16);
    }
}

/* ---- rmsnorm_quant, act_quant, silu_mul_quant ------------------------------------------- */

static void norm_case(const pair *p, int l, comet_group g, int T, int with_res) {
    const comet_model *m = p->m;
    const int C = m->cfg.n_embd;
    const size_t n = (size_t)T * C;
    char what[160];
    snprintf(what, sizeof what, "rmsnorm_quant layer %d group %d T %d%s", l, (int)g, T,
             with_res ? " +residual" : "");
    float *x0 = st_malloc(n * 4), *r0 = st_malloc(n * 4);
    st_fill_act(x0, T, C, 1.0f);
    st_fill_act(r0, T, C, 0.5f);

    sbuf xc = sb_from(g_cpu, x0, n * 4), rc = sb_from(g_cpu, r0, n * 4);
    sbuf ac = sb_alloc(g_cpu, comet_act_bytes(T, C));
    OP_OK(g_cpu,
          g_cpu->ops->rmsnorm_quant(g_cpu, p->wc, l, g, sb_f(&xc), with_res ? sb_f(&rc) : NULL, T,
                                    sb_ptr(&ac)),
          what);
    sbuf xg = sb_from(g_cuda, x0, n * 4), rg = sb_from(g_cuda, r0, n * 4);
    sbuf ag = sb_alloc(g_cuda, comet_act_bytes(T, C));
    OP_OK(g_cuda,
          g_cuda->ops->rmsnorm_quant(g_cuda, p->wg, l, g, sb_f(&xg), with_res ? sb_f(&rg) : NULL, T,
                                     sb_ptr(&ag)),
          what);
    st_sync_ok(g_cuda);

    float *xc_h = sb_fetch(&xc, n * 4), *xg_h = sb_fetch(&xg, n * 4);
    float *ac_h = sb_fetch(&ac, n * 4);
    if (memcmp(xc_h, xg_h, n * 4))
        fail_msg("%s: x after the op differs from the CPU's (%s)", what,
                 with_res ? "x + residual must be bit-exact" : "x must stay unchanged");
    if (!with_res && memcmp(xc_h, x0, n * 4))
        fail_msg("%s: the CPU changed x without a residual", what);

    /* the reference: the CPU's own RMSNorm of the CPU's x, gathered */
    float *h = st_malloc(n * 4), *hg = st_malloc(n * 4);
    OP_OK(g_cpu,
          comet_cpu_prims_of(g_cpu)->rmsnorm(g_cpu, xc_h, comet_model_norm(m, l, g), T, C, m->cfg.rms_eps, h),
          "rmsnorm");
    const comet_linear *lin = st_group_linear(m, l, g);
    st_gather(h, T, C, lin && lin->fmt == COMET_WFMT_QSIM ? lin->perm : NULL, hg);
    check_act(p, l, g, &ag, ac_h, hg, T, C, 1e-3, 1e-5, 1e-3, what);

    SB_CHECK_GUARDS(&xg, what);
    SB_CHECK_GUARDS(&ag, what);
    SB_CHECK_GUARDS(&ac, what);
    sb_free(&xc), sb_free(&rc), sb_free(&ac), sb_free(&xg), sb_free(&rg), sb_free(&ag);
    free(x0), free(r0), free(xc_h), free(xg_h), free(ac_h), free(h), free(hg);
}

static void act_quant_case(const pair *p, int l, int T) {
    const comet_model *m = p->m;
    const int K = comet_group_width(m, COMET_GROUP_O);
    const size_t n = (size_t)T * K;
    char what[96];
    snprintf(what, sizeof what, "act_quant layer %d (O) T %d", l, T);
    float *x0 = st_malloc(n * 4), *xg0 = st_malloc(n * 4);
    st_fill_act(x0, T, K, 0.7f);
    sbuf xc = sb_from(g_cpu, x0, n * 4), ac = sb_alloc(g_cpu, comet_act_bytes(T, K));
    sbuf xg = sb_from(g_cuda, x0, n * 4), ag = sb_alloc(g_cuda, comet_act_bytes(T, K));
    OP_OK(g_cpu, g_cpu->ops->act_quant(g_cpu, p->wc, l, COMET_GROUP_O, sb_f(&xc), T, sb_ptr(&ac)),
          what);
    OP_OK(g_cuda,
          g_cuda->ops->act_quant(g_cuda, p->wg, l, COMET_GROUP_O, sb_f(&xg), T, sb_ptr(&ag)), what);
    st_sync_ok(g_cuda);
    float *ac_h = sb_fetch(&ac, n * 4);
    const comet_linear *lin = st_group_linear(m, l, COMET_GROUP_O);
    st_gather(x0, T, K, lin->fmt == COMET_WFMT_QSIM ? lin->perm : NULL, xg0);
    check_act(p, l, COMET_GROUP_O, &ag, ac_h, xg0, T, K, 0, 0, 0, what); /* bit-exact */
    SB_CHECK_GUARDS(&ag, what);
    sb_free(&xc), sb_free(&ac), sb_free(&xg), sb_free(&ag);
    free(x0), free(xg0), free(ac_h);
}

static void silu_case(const pair *p, int l, int T) {
    const comet_model *m = p->m;
    const int F = m->cfg.n_ff;
    const size_t n = (size_t)T * F;
    char what[96];
    snprintf(what, sizeof what, "silu_mul_quant layer %d T %d", l, T);
    float *gate = st_malloc(n * 4), *up = st_malloc(n * 4), *h = st_malloc(n * 4),
          *hg = st_malloc(n * 4);
    st_fill_act(gate, T, F, 4.0f);
    st_fill_act(up, T, F, 1.0f);
    sbuf gc = sb_from(g_cpu, gate, n * 4), uc = sb_from(g_cpu, up, n * 4);
    sbuf ac = sb_alloc(g_cpu, comet_act_bytes(T, F));
    sbuf gg = sb_from(g_cuda, gate, n * 4), ug = sb_from(g_cuda, up, n * 4);
    sbuf ag = sb_alloc(g_cuda, comet_act_bytes(T, F));
    OP_OK(g_cpu, g_cpu->ops->silu_mul_quant(g_cpu, p->wc, l, sb_f(&gc), sb_f(&uc), T, sb_ptr(&ac)),
          what);
    OP_OK(g_cuda,
          g_cuda->ops->silu_mul_quant(g_cuda, p->wg, l, sb_f(&gg), sb_f(&ug), T, sb_ptr(&ag)),
          what);
    st_sync_ok(g_cuda);
    float *ac_h = sb_fetch(&ac, n * 4);
    OP_OK(g_cpu, comet_cpu_prims_of(g_cpu)->silu_mul(g_cpu, gate, up, T, F, h), "silu_mul");
    const comet_linear *lin = st_group_linear(m, l, COMET_GROUP_DOWN);
    /* down's permutation is folded into gate / up offline (perm NULL): gathering is a copy */
    st_gather(h, T, F, lin->fmt == COMET_WFMT_QSIM ? lin->perm : NULL, hg);
    check_act(p, l, COMET_GROUP_DOWN, &ag, ac_h, hg, T, F, 1e-4, 1e-6, 1e-3, what);
    SB_CHECK_GUARDS(&ag, what);
    sb_free(&gc), sb_free(&uc), sb_free(&ac), sb_free(&gg), sb_free(&ug), sb_free(&ag);
    free(gate), free(up), free(h), free(hg), free(ac_h);
}

static void test_act_ops(void **state) {
    const variant *v = *state;
    pair p = pair_make(v);
    static const int Ts[] = {1, 5, 130};
    for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) {
        int T = Ts[i];
        for (int l = 0; l < p.m->cfg.n_layer; l++) {
            for (int res = 0; res < 2; res++) {
                norm_case(&p, l, COMET_GROUP_QKV, T, res);
                norm_case(&p, l, COMET_GROUP_GATE_UP, T, res);
            }
            act_quant_case(&p, l, T);
            silu_case(&p, l, T);
        }
        norm_case(&p, 0, COMET_GROUP_LM_HEAD, T, 0);
        norm_case(&p, 0, COMET_GROUP_LM_HEAD, T, 1);
    }
    print_message("%s: rmsnorm_quant / act_quant / silu_mul_quant ok\n", v->name);
    pair_free(&p);
}

/* ---- rmsnorm_quant's forms ------------------------------------------------------------------ */

/* A setting of comet_cuda_rmsnorm_quant's two switches (NULL: unset) */
typedef struct norm_setting {
    const char *smem, *cluster; /* COMET_CUDA_NORM_SMEM, COMET_CUDA_NORM_CLUSTER */
} norm_setting;

static const norm_setting NS_GLOBAL = {"0", NULL}; /* one CTA a row, x read back from global */
static const norm_setting NS_ROW = {NULL, "0"};    /* one CTA a row, the row in shared memory */
static const norm_setting NS_DEFAULT = {NULL, NULL};
static const norm_setting NS_C2 = {NULL, "2"}, NS_C8 = {NULL, "8"};

static void set_env(const char *name, const char *value) {
    if (value)
        setenv(name, value, 1);
    else
        unsetenv(name);
}

/* 1 when the cluster form must engage (an sm_90 device; the build's default architectures
 * "90a;80" hold its sm_90 code) */
static int g_cluster_device = -1;

static int cluster_device(void) {
    if (g_cluster_device < 0) {
        int major = 0;
        g_cluster_device = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) ==
                                   cudaSuccess &&
                               major == 9;
    }
    return g_cluster_device;
}

/* comet_cuda_rmsnorm_quant on T rows of K channels (a random permutation, n8 = K / B / 4 INT8
 * blocks of B, or fp16) under each setting in `set` (set[0] the reference): x after the residual
 * add, the codes and the scales (or the fp16 values) must be the same bits in every setting; x +
 * residual bit-exact with the host's sum, and the scales within 1e-5 of the host's
 * double-precision RMSNorm (a wrong gather or channel moves them by far more). On an sm_90
 * device a setting that allows the cluster form must name it (comet_cuda_rmsnorm_quant_form)
 * at up to 16 rows of up to 32768 channels, and one CTA a row beyond. */
static void norm_forms_case(int T, int K, int B, int kind, int with_res, uint64_t seed,
                            const norm_setting *set, int n_set) {
    const int n8 = K / B / 4;
    const size_t n = (size_t)T * K;
    char what[160];
    snprintf(what, sizeof what, "rmsnorm_quant forms T %d K %d %s B %d%s", T, K,
             kind == COMET_CUDA_ACT_W4AX ? "w4ax" : "f16", B, with_res ? " +residual" : "");
    st_seed(seed);
    float *x0 = st_malloc(n * 4), *r0 = st_malloc(n * 4), *nw = st_malloc((size_t)K * 4);
    int32_t *perm = st_malloc((size_t)K * 4);
    st_fill_act(x0, T, K, 1.0f);
    st_fill_act(r0, T, K, 0.5f);
    for (int k = 0; k < K; k++) {
        nw[k] = 0.5f + 0.5f * st_u();
        perm[k] = k;
    }
    for (int k = K - 1; k > 0; k--) {
        const int j = (int)(st_next() % (uint64_t)(k + 1));
        const int32_t t = perm[k];
        perm[k] = perm[j], perm[j] = t;
    }
    const size_t act_bytes = comet_act_bytes(T, K);
    const size_t used = kind == COMET_CUDA_ACT_W4AX
                            ? st_act_scales_offset(T, K) + (size_t)T * (K / B) * 4
                            : n * 2;
    sbuf rg = sb_from(g_cuda, r0, n * 4), ng = sb_from(g_cuda, nw, (size_t)K * 4);
    sbuf pg = sb_from(g_cuda, perm, (size_t)K * 4);
    uint8_t *act[8];
    float *xo[8];
    char forms[256] = "";
    assert_true(n_set >= 1 && n_set <= 8);
    for (int form = 0; form < n_set; form++) {
        sbuf xg = sb_from(g_cuda, x0, n * 4), ag = sb_alloc(g_cuda, act_bytes);
        st_sync_ok(g_cuda);
        const comet_cuda_act_fmt f = {.kind = kind, .K = K, .B = B, .n8 = n8,
                                      .perm = (const int32_t *)sb_ptr(&pg)};
        set_env("COMET_CUDA_NORM_SMEM", set[form].smem);
        set_env("COMET_CUDA_NORM_CLUSTER", set[form].cluster);
        const char *name = comet_cuda_rmsnorm_quant_form(T, K);
        const comet_status r = comet_cuda_rmsnorm_quant(
            sb_f(&xg), with_res ? sb_f(&rg) : NULL, sb_f(&ng), 1e-5f, T, &f, sb_ptr(&ag), NULL);
        unsetenv("COMET_CUDA_NORM_SMEM");
        unsetenv("COMET_CUDA_NORM_CLUSTER");
        if (r != COMET_OK || !name)
            fail_msg("%s: %s", what, comet_last_error());
        const int may_cluster = !(set[form].smem && !strcmp(set[form].smem, "0")) &&
                                !(set[form].cluster && !strcmp(set[form].cluster, "0"));
        const int is_cluster = !strncmp(name, "cluster", 7);
        if (cluster_device() && is_cluster != (may_cluster && T <= 16 && K <= 32768))
            fail_msg("%s: COMET_CUDA_NORM_SMEM=%s COMET_CUDA_NORM_CLUSTER=%s takes the form "
                     "\"%s\" on this sm_90 device",
                     what, set[form].smem ? set[form].smem : "(unset)",
                     set[form].cluster ? set[form].cluster : "(unset)", name);
        snprintf(forms + strlen(forms), sizeof forms - strlen(forms), "%s%s", form ? ", " : "",
                 name);
        if (cudaDeviceSynchronize() != cudaSuccess)
            fail_msg("%s: %s (%s)", what, cudaGetErrorString(cudaGetLastError()), name);
        xo[form] = sb_fetch(&xg, n * 4);
        act[form] = sb_fetch(&ag, act_bytes);
        SB_CHECK_GUARDS(&xg, what);
        SB_CHECK_GUARDS(&ag, what);
        sb_free(&xg), sb_free(&ag);
        if (memcmp(xo[0], xo[form], n * 4))
            fail_msg("%s: x after the op differs between the forms %s", what, forms);
        for (size_t i = 0; i < used; i++)
            if (act[0][i] != act[form][i])
                fail_msg("%s: activation byte %zu of %zu differs between the forms %s: %02x vs "
                         "%02x",
                         what, i, used, forms, act[0][i], act[form][i]);
    }
    const int last = n_set - 1;
    double worst = 0;
    for (int t = 0; t < T; t++) {
        double ss = 0;
        for (int k = 0; k < K; k++) {
            const size_t i = (size_t)t * K + k;
            const float v = with_res ? x0[i] + r0[i] : x0[i];
            if (memcmp(&v, &xo[last][i], 4))
                fail_msg("%s: x[%d, %d] = %.9g, the host's sum %.9g", what, t, k, xo[last][i], v);
            ss += (double)v * v;
        }
        const double inv = 1.0 / sqrt(ss / K + 1e-5);
        for (int b = 0; kind == COMET_CUDA_ACT_W4AX && b < K / B; b++) {
            double amax = 0;
            for (int k = b * B; k < (b + 1) * B; k++)
                amax = fmax(amax, fabs(xo[last][(size_t)t * K + perm[k]] * inv * nw[perm[k]]));
            float sc;
            memcpy(&sc, act[last] + st_act_scales_offset(T, K) + ((size_t)t * (K / B) + b) * 4,
                   4);
            const double want = amax / (b < n8 ? 127.0 : 7.0);
            const double e = fabs(sc - want) / want;
            if (!(e <= 1e-5))
                fail_msg("%s: row %d block %d scale %.9g, the host's %.9g", what, t, b, sc, want);
            worst = fmax(worst, e);
        }
    }
    print_message("  %s: the forms (%s) agree bit for bit; scales within %.3g of the host\n",
                  what, forms, worst);
    sb_free(&rg), sb_free(&ng), sb_free(&pg);
    free(x0), free(r0), free(nw), free(perm);
    for (int form = 0; form < n_set; form++)
        free(xo[form]), free(act[form]);
}

/* One CTA a row with the row read back from global memory, kept in shared memory, and the
 * default, at widths up to 33024 (past the shared-memory row) and 1 to 65 rows (past the early
 * loads' 64). */
static void test_norm_forms(void **state) {
    (void)state;
    /* the launches below run on the legacy stream of the backend's device (0) */
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    const norm_setting set[] = {NS_GLOBAL, NS_ROW, NS_DEFAULT};
    static const int Ks[] = {4096, 8192, 16384, 32768, 33024};
    static const int Ts[] = {1, 3, 64, 65};
    for (int ki = 0; ki < 5; ki++)
        for (int ti = 0; ti < 4; ti++) {
            if (Ks[ki] > 16384 && Ts[ti] > 3)
                continue;
            const uint64_t seed = 0x4E0F0000ull + (uint64_t)ki * 10 + (uint64_t)ti;
            norm_forms_case(Ts[ti], Ks[ki], 128, COMET_CUDA_ACT_W4AX, ti % 2, seed, set, 3);
            if (ti == 0)
                norm_forms_case(Ts[ti], Ks[ki], 128, COMET_CUDA_ACT_F16, 1, seed + 5, set, 3);
        }
}

/* The cluster form (default 4 CTAs a row, and 2 and 8) against one CTA a row (the row in shared
 * memory, COMET_CUDA_NORM_CLUSTER=0), bit for bit: LLaMA widths 2048 to 16384 (one to two
 * batches of 8 row values a thread; 16 to 128 blocks of 128, so virtual warps with one to four
 * blocks, past the two whose perm and norm load early), 1, 2, 3 and 16 rows and 17 (one CTA a
 * row in every setting), with and without the residual; blocks of 64 at 4096, 4160 (65
 * blocks: K not a multiple of 128, warps without a block) and 8192; fp16 at 4096, 4100 (K not a
 * multiple of 32) and 14336. A COMET_CUDA_NORM_CLUSTER that is not 0, 2, 4 or 8 is refused.
 * COMET_CUDA_TEST_QUICK=1 (the sanitizer set) keeps K 4096 at 1 and 2 rows (with and without
 * the residual), 16384 at 3 (a second batch of row values, four blocks a warp), 4160 in
 * blocks of 64 and fp16 at 4100. */
static void test_norm_cluster_forms(void **state) {
    (void)state;
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    const char *q = getenv("COMET_CUDA_TEST_QUICK");
    const int quick = q && *q && strcmp(q, "0"); /* the sanitizer set: every path once */
    const norm_setting set[] = {NS_ROW, NS_DEFAULT, NS_C2, NS_C8};
    static const int Ks[] = {2048, 4096, 5120, 8192, 14336, 16384};
    static const int Ts[] = {1, 2, 3, 16, 17};
    for (int ki = 0; ki < 6; ki++)
        for (int ti = 0; ti < 5; ti++) {
            if (quick && !((Ks[ki] == 4096 && Ts[ti] <= 2) || (Ks[ki] == 16384 && Ts[ti] == 3)))
                continue;
            norm_forms_case(Ts[ti], Ks[ki], 128, COMET_CUDA_ACT_W4AX, (ki + ti) % 2,
                            0x4E0C0000ull + (uint64_t)ki * 10 + (uint64_t)ti, set, 4);
        }
    static const int K64[] = {4096, 4160, 8192};
    for (int ki = quick; ki < 3 - quick; ki++) {
        norm_forms_case(1, K64[ki], 64, COMET_CUDA_ACT_W4AX, 1, 0x4E0C0100ull + (uint64_t)ki, set,
                        4);
        if (!quick)
            norm_forms_case(16, K64[ki], 64, COMET_CUDA_ACT_W4AX, 0, 0x4E0C0110ull + (uint64_t)ki,
                            set, 4);
    }
    static const int K16[] = {4096, 4100, 14336};
    static const int T16[] = {1, 3, 17};
    for (int ki = quick; ki < 3 - quick; ki++)
        for (int ti = 0; ti < 3 - 2 * quick; ti++)
            norm_forms_case(T16[ti], K16[ki], 128, COMET_CUDA_ACT_F16, ti != 1,
                            0x4E0C0200ull + (uint64_t)ki * 10 + (uint64_t)ti, set, 4);
    /* a bad switch value is an error, not a silent default */
    setenv("COMET_CUDA_NORM_CLUSTER", "3", 1);
    const char *name = comet_cuda_rmsnorm_quant_form(1, 4096);
    const comet_cuda_act_fmt f = {.kind = COMET_CUDA_ACT_F16, .K = 4096, .B = 128, .n8 = 0};
    sbuf xg = sb_alloc(g_cuda, 4096 * 4), ng = sb_alloc(g_cuda, 4096 * 4),
         ag = sb_alloc(g_cuda, comet_act_bytes(1, 4096));
    const comet_status r =
        comet_cuda_rmsnorm_quant(sb_f(&xg), NULL, sb_f(&ng), 1e-5f, 1, &f, sb_ptr(&ag), NULL);
    unsetenv("COMET_CUDA_NORM_CLUSTER");
    if (name || r != COMET_ERR_INVALID_ARG)
        fail_msg("COMET_CUDA_NORM_CLUSTER=3: form %s, status %s (want NULL and invalid_arg)",
                 name ? name : "NULL", comet_status_name(r));
    if (!strstr(comet_last_error(), "COMET_CUDA_NORM_CLUSTER"))
        fail_msg("COMET_CUDA_NORM_CLUSTER=3: the error does not name the switch: %s",
                 comet_last_error());
    sb_free(&xg), sb_free(&ng), sb_free(&ag);
}

/* ---- matmul ---------------------------------------------------------------------------- */

/* y [T, N] of role r from acts ac (CPU) and ag (CUDA); returns the CUDA and CPU outputs. */
static void run_matmul(const pair *p, int l, comet_role r, int T, const sbuf *ac, const sbuf *ag,
                       float **yg_out, float **yc_out, const char *what) {
    const int N = comet_model_linear(p->m, l, r)->n_out;
    const size_t n = (size_t)T * N;
    sbuf yc = sb_alloc(g_cpu, n * 4), yg = sb_alloc(g_cuda, n * 4);
    OP_OK(g_cpu, g_cpu->ops->matmul(g_cpu, p->wc, l, r, sb_ptr(ac), T, sb_f(&yc)), what);
    OP_OK(g_cuda, g_cuda->ops->matmul(g_cuda, p->wg, l, r, sb_ptr(ag), T, sb_f(&yg)), what);
    st_sync_ok(g_cuda);
    *yc_out = sb_fetch(&yc, n * 4);
    *yg_out = sb_fetch(&yg, n * 4);
    long nan_at = st_first_nan(*yg_out, n);
    if (nan_at >= 0)
        fail_msg("%s: CUDA output element %ld of %zu is NaN (unwritten?)", what, nan_at, n);
    SB_CHECK_GUARDS(&yg, what);
    sb_free(&yc), sb_free(&yg);
}

static void test_matmul(void **state) {
    const variant *v = *state;
    pair p = pair_make(v);
    const comet_model_config *c = &p.m->cfg;
    static const int Ts[] = {1, 7, 70};
    static const char *const role_name[COMET_ROLE_COUNT] = {"q",    "k",  "v",   "o",
                                                            "gate", "up", "down"};
    double worst = 0;
    int n_cases = 0;
    for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++)
        for (int l = 0; l < c->n_layer; l++)
            for (int r = 0; r < COMET_ROLE_COUNT; r++) {
                const int T = Ts[ti];
                const comet_group g = comet_role_group((comet_role)r);
                const int K = comet_group_width(p.m, g);
                const int N = comet_model_linear(p.m, l, (comet_role)r)->n_out;
                const int w4ax = st_group_w4ax(p.m, l, g);
                char what[128];
                float *yg, *yc;
                if (w4ax) {
                    /* one activation for both: the CPU's codes and scales, dequantized for the
                     * CPU and in the CUDA layout for the GEMM */
                    const comet_linear *lin = st_group_linear(p.m, l, g);
                    const int B = lin->block, nb = K / B;
                    snprintf(what, sizeof what, "%s: matmul %s layer %d T %d (one act)", v->name,
                             role_name[r], l, T);
                    float *x = st_malloc((size_t)T * K * 4), *deq = st_malloc((size_t)T * K * 4);
                    int8_t *q = st_malloc((size_t)T * K);
                    float *s = st_malloc((size_t)T * nb * 4);
                    st_fill_act(x, T, K, 1.0f);
                    comet_quant_act(x, T, K, B, lin->n8, q, s);
                    for (int t = 0; t < T; t++)
                        for (int k = 0; k < K; k++)
                            deq[(size_t)t * K + k] =
                                (float)q[(size_t)t * K + k] * s[(size_t)t * nb + k / B];
                    size_t bytes = comet_act_bytes(T, K), off = st_act_scales_offset(T, K);
                    uint8_t *img = calloc(1, bytes);
                    assert_non_null(img);
                    memcpy(img, q, (size_t)T * K);
                    memcpy(img + off, s, (size_t)T * nb * 4);
                    sbuf ac = sb_from(g_cpu, deq, (size_t)T * K * 4),
                         ag = sb_from(g_cuda, img, bytes);
                    run_matmul(&p, l, (comet_role)r, T, &ac, &ag, &yg, &yc, what);
                    double e = st_nerr(yg, yc, (size_t)T * N);
                    if (!(e <= 1e-4))
                        fail_msg("%s: relative norm error %.3g > 1e-4 (B %d, n8 %d)", what, e, B,
                                 lin->n8);
                    for (int t = 0; t < T; t++) {
                        double md = 0, mb = 0;
                        for (int j = 0; j < N; j++) {
                            md = fmax(md,
                                      fabs((double)yg[(size_t)t * N + j] - yc[(size_t)t * N + j]));
                            mb = fmax(mb, fabs((double)yc[(size_t)t * N + j]));
                        }
                        if (!(md <= 1e-3 * mb))
                            fail_msg("%s: row %d max |diff| %.3g > 1e-3 * max |y| %.3g", what, t,
                                     md, mb);
                    }
                    worst = fmax(worst, e);
                    n_cases++;
                    sb_free(&ac), sb_free(&ag);
                    free(x), free(deq), free(q), free(s), free(img), free(yg), free(yc);
                }
            }
    assert_true(n_cases > 0); /* the variant has W4Ax groups */
    print_message("%s: matmul ok (%d cases), worst relative norm error %.3g\n", v->name, n_cases,
                  worst);
    pair_free(&p);
}

/* ---- main ------------------------------------------------------------------------------- */

int main(void) {
    cuda_test_skip_if_no_device(); /* exit 77 (ctest: skipped) without a usable GPU */
    g_cuda = comet_backend_cuda_init(0);
    if (!g_cuda) {
        fprintf(stderr, "comet_backend_cuda_init(0) failed: %s\n", comet_last_error());
        return 1;
    }
    g_cpu = comet_backend_cpu_init(1); /* one CPU thread as the reference */
    if (!g_cpu) {
        fprintf(stderr, "comet_backend_cpu_init failed: %s\n", comet_last_error());
        return 1;
    }
    /* the reference is the contract's fp32 simulation (acts as values, an fp32 cache), not
     * the CPU's integer path */
    comet_backend_set_simulate(g_cpu, 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_op_table),
        cmocka_unit_test_prestate(test_act_ops, (void *)&V_FP32),
        cmocka_unit_test_prestate(test_act_ops, (void *)&V_W4A4),
        cmocka_unit_test_prestate(test_act_ops, (void *)&V_W4A8),
        cmocka_unit_test_prestate(test_act_ops, (void *)&V_W16),
        cmocka_unit_test_prestate(test_matmul, (void *)&V_W4A4),
        cmocka_unit_test_prestate(test_matmul, (void *)&V_W4A8),
        cmocka_unit_test(test_norm_forms),
        cmocka_unit_test(test_norm_cluster_forms),
    };
    if (getenv("COMET_TEST_FILTER")) /* one test by name (sanitizer runs) */
        cmocka_set_test_filter(getenv("COMET_TEST_FILTER"));
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    comet_backend_free(g_cpu);
    comet_backend_free(g_cuda);
    return rc;
}
