/* test_backend_cuda.c — GPU test of the CUDA backend's W4Ax path (src/backend/cuda/
 * cuda_backend.c, the functions weights_load and the step ops use, declared in
 * cuda_internal.h): random plain weights go through comet_cuda_be_w4ax_load,
 * comet_cuda_be_gemm_w4ax runs on the backend's stream, comet_backend_cuda_sync waits, and
 * y is compared with the scalar oracle comet_ref_gemm_w4ax (called directly) within fp32
 * rounding of the outer sum (the bound of test_gemm_w4ax_cuda.c). Shapes: M in {1, 3, 16, 33, 100, 256} x N in {8, 136, 4096} x
 * K in {64, 576, 4096} x B in {64, 128} (B dividing K) x n8 in {0, 1, all}. Outputs are
 * poisoned before each call (every element must be written) and have guard words on both
 * sides. Also: the error statuses (bad M, n8, NULLs, bad load shapes, a foreign weight,
 * misaligned qa, device out of range) and the workspace grow path (a small call, then one
 * needing a larger workspace, on a fresh backend), and that ops give the caller its CUDA
 * context back: a thread with a context of its own, and a thread with none. And
 * batch_invariant: rows of any call equal the same rows of a larger one, bit for bit.
 * Usage: test_backend_cuda [--quick]   (quick: a few shapes, for compute-sanitizer)
 * The parts run as cmocka tests (cm_errors, cm_caller_context, cm_shapes, cm_batch_invariant,
 * cm_workspace_grow; COMET_TEST_FILTER=name runs one), each failing when one of its checks
 * fails. Prints one line per check, "FAIL ..." for failures, then "N/N checks passed"; exit
 * status 0 when every check passes. */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cuda.h> /* driver types: the context checks reach the driver through the runtime */
#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "backend/cpu/ref_gemm_w4ax.h"
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/gemm_w4ax.h"
#include "numerics/w4_plain.h"

#define CUDA_TEST_SEED 0x2545F4914F6CDD1Dull
#include "cuda_test_util.h"
#include "cuda_skip.h"

static int n_fail = 0, n_check = 0;

/* Record one check: prints "ok"/"FAIL" and the description. Returns ok. */
static int check(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int check(int ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%-4s ", ok ? "ok" : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
    va_end(ap);
    n_check++;
    n_fail += !ok;
    return ok;
}

/* ---- inputs ---- */

typedef struct {
    int N, K, B;
    uint8_t *qw;  /* [N, K/2] plain codes */
    uint16_t *sw; /* [N, K/B] fp16 bits */
    comet_w4ax_weight *w;
} weight;

static weight weight_make(comet_backend *be, int N, int K, int B) {
    weight w = {N, K, B, malloc(comet_w4_plain_bytes(N, K)), malloc((size_t)N * (K / B) * 2), NULL};
    for (size_t i = 0; i < comet_w4_plain_bytes(N, K); i++)
        w.qw[i] = (uint8_t)rnd();
    for (int i = 0; i < N * (K / B); i++) /* fp16 of both signs, magnitude in [2^-9, 2^-2) */
        w.sw[i] = (uint16_t)(((rnd() & 1) << 15) | ((6 + rnd() % 7) << 10) | (rnd() & 0x3FF));
    comet_status st = comet_cuda_be_w4ax_load(be, N, K, B, w.qw, w.sw, &w.w);
    if (st != COMET_OK) {
        fprintf(stderr, "w4ax_load N=%d K=%d B=%d failed: %s\n", N, K, B, comet_last_error());
        exit(2);
    }
    return w;
}

static void weight_free(comet_backend *be, weight *w) {
    comet_cuda_be_w4ax_free(be, w->w);
    free(w->qw);
    free(w->sw);
}

/* Activations for M tokens: INT8 codes in blocks < n8, INT4 codes after; host and device
 * copies. */
typedef struct {
    int M, K, B, n8;
    int8_t *qa, *dqa; /* [M, K] */
    float *sa, *dsa;  /* [M, K/B] */
} acts;

static acts acts_make(int M, int K, int B, int n8) {
    int nb = K / B;
    acts a = {M, K, B, n8, malloc((size_t)M * K), NULL, malloc((size_t)M * nb * 4), NULL};
    for (int t = 0; t < M; t++)
        for (int k = 0; k < K; k++)
            a.qa[(size_t)t * K + k] =
                k / B < n8 ? (int8_t)(rnd() & 0xFF) : (int8_t)((int)(rnd() % 16) - 8);
    for (int i = 0; i < M * nb; i++)
        a.sa[i] = (float)(rnd() % 1000 + 1) * 1e-4f;
    CUDA_OK(cudaMalloc((void **)&a.dqa, (size_t)M * K + 16)); /* +16: room for a misaligned view */
    CUDA_OK(cudaMalloc((void **)&a.dsa, (size_t)M * nb * 4));
    CUDA_OK(cudaMemcpy(a.dqa, a.qa, (size_t)M * K, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(a.dsa, a.sa, (size_t)M * nb * 4, cudaMemcpyHostToDevice));
    return a;
}

static void acts_free(acts *a) {
    free(a->qa), free(a->sa);
    cudaFree(a->dqa), cudaFree(a->dsa);
}

/* Device y [M, N] with guard words around it. */
typedef struct {
    uint32_t *raw;
    float *y;
    size_t n;
} gout;

static gout gout_make(size_t n) {
    gout g = {guarded_raw_alloc(n), NULL, n};
    g.y = (float *)(g.raw + GUARD);
    return g;
}

static int gout_guards_ok(const gout *g) { return guards_intact(g->raw, g->n); }

/* ---- one GEMM through the backend against the oracle ---- */

/* Run gemm_w4ax for (w, a) and compare with the oracle; hy receives y. Returns 1 when y is
 * within tolerance everywhere, the guards are intact and every status was COMET_OK. */
static int run_and_compare(comet_backend *be, const weight *w, const acts *a, float *hy,
                           const char *label) {
    const int M = a->M, N = w->N, K = w->K, B = w->B, nb = K / B;
    size_t ny = (size_t)M * N;
    float *y_ref = malloc(ny * 4);
    int32_t *bs = malloc(ny * nb * 4);
    ref_job job = {.M = M,
                   .N = N,
                   .K = K,
                   .B = B,
                   .n8 = a->n8,
                   .qw = w->qw,
                   .sw = w->sw,
                   .qa = a->qa,
                   .sa = a->sa,
                   .y = y_ref,
                   .bs = bs};
    ref_threaded(job);
    gout g = gout_make(ny);
    CUDA_OK(cudaMemset(g.y, 0xFF, ny * 4)); /* NaN: every element must be written */
    /* the setup copies and memsets ran on the legacy default stream, which the backend's
     * non-blocking stream does not wait for */
    CUDA_OK(cudaDeviceSynchronize());
    comet_status st = comet_cuda_be_gemm_w4ax(be, w->w, M, a->n8, a->dqa, a->dsa, g.y);
    comet_status st_sync = st == COMET_OK ? comet_backend_cuda_sync(be) : st;
    int ok = st == COMET_OK && st_sync == COMET_OK;
    size_t bad = 0, first = 0;
    double worst = 0;
    if (ok) {
        CUDA_OK(cudaMemcpy(hy, g.y, ny * 4, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < ny; i++) {
            size_t t = i / N, n = i % N;
            double mag = 0;
            for (int b = 0; b < nb; b++)
                mag += fabs((double)bs[i * nb + b] * a->sa[t * nb + b] *
                            comet_ref_f16_to_f32(w->sw[n * nb + b]));
            /* outer sum over nb blocks in fp32: error <= ~nb * 2^-23 * sum |terms| */
            double tol = (nb + 2) * 1.2e-7 * mag + 1e-30;
            double err = fabs((double)hy[i] - (double)y_ref[i]);
            if (!(err <= tol) && bad++ == 0)
                first = i;
            if (err / tol > worst)
                worst = err / tol;
        }
        ok = bad == 0;
    }
    int guards = gout_guards_ok(&g);
    ok &= guards;
    if (st != COMET_OK || st_sync != COMET_OK)
        check(0, "%s M=%-4d N=%-5d K=%-5d B=%-3d n8=%-3d status %s / sync %s: %s", label, M, N, K,
              B, a->n8, comet_status_name(st), comet_status_name(st_sync), comet_last_error());
    else if (bad)
        check(0,
              "%s M=%-4d N=%-5d K=%-5d B=%-3d n8=%-3d %zu of %zu out of tolerance; first "
              "y[%zu, %zu] = %.9g want %.9g",
              label, M, N, K, B, a->n8, bad, ny, first / N, first % N, hy[first], y_ref[first]);
    else
        check(guards, "%s M=%-4d N=%-5d K=%-5d B=%-3d n8=%-3d err/tol %.3f%s", label, M, N, K, B,
              a->n8, worst, guards ? "" : " guard words overwritten");
    cudaFree(g.raw);
    free(y_ref), free(bs);
    return ok;
}

static void test_shapes(comet_backend *be, int quick) {
    static const int Ms[] = {1, 3, 16, 33, 100, 256}, Ns[] = {8, 136, 4096}, Ks[] = {64, 576, 4096};
    if (quick) {
        const int q[][5] = {{1, 136, 576, 64, 1},
                            {16, 8, 4096, 128, 32},
                            {33, 136, 576, 64, 0},
                            {256, 4096, 64, 64, 1},
                            {100, 4096, 4096, 128, 1}};
        for (size_t i = 0; i < sizeof q / sizeof q[0]; i++) {
            weight w = weight_make(be, q[i][1], q[i][2], q[i][3]);
            acts a = acts_make(q[i][0], q[i][2], q[i][3], q[i][4]);
            float *hy = malloc((size_t)q[i][0] * q[i][1] * 4);
            run_and_compare(be, &w, &a, hy, "gemm");
            free(hy);
            acts_free(&a);
            weight_free(be, &w);
        }
        return;
    }
    for (int ni = 0; ni < 3; ni++)
        for (int ki = 0; ki < 3; ki++)
            for (int B = 64; B <= 128; B += 64) {
                int N = Ns[ni], K = Ks[ki], nb = K / B;
                if (K % B)
                    continue;
                weight w = weight_make(be, N, K, B); /* loaded once, used by every M and n8 */
                for (int mi = 0; mi < 6; mi++) {
                    const int n8s[] = {0, 1, nb};
                    for (int i = 0; i < (nb > 1 ? 3 : 2); i++) {
                        acts a = acts_make(Ms[mi], K, B, n8s[i]);
                        float *hy = malloc((size_t)Ms[mi] * N * 4);
                        run_and_compare(be, &w, &a, hy, "gemm");
                        free(hy);
                        acts_free(&a);
                    }
                }
                weight_free(be, &w);
            }
}

/* batch_invariant: a token row's outputs are the same bits whatever M the call has and
 * wherever the row sits in it. One call of M_MAX rows on a (N, K, B) weight (the default
 * model's q/k/v stack, o and down, and LLaMA-3-8B qkv and down shapes), then calls of M rows
 * starting at row `first`, for M across the stream (M <= 8) and wgmma plans; each must equal
 * the big call's rows bit for bit. The big call is also checked against the oracle. */
static void test_batch_invariant(comet_backend *be, int quick) {
    enum {
        M_MAX = 300
    };
    static const int shapes[][4] = {{960, 576, 64, 2},
                                    {576, 576, 64, 1},
                                    {576, 1536, 64, 3},
                                    {6144, 4096, 128, 3},
                                    {4096, 14336, 128, 4}};
    static const int Ms[][2] = {{1, 0},   {1, 299},  {2, 7},   {5, 100}, {8, 0},     {9, 3},
                                {16, 40}, {17, 200}, {37, 11}, {64, 0},  {129, 171}, {256, 1}};
    const int n_shapes = quick ? 2 : (int)(sizeof shapes / sizeof shapes[0]);
    comet_backend_set_batch_invariant(be, 1);
    for (int si = 0; si < n_shapes; si++) {
        const int N = shapes[si][0], K = shapes[si][1], B = shapes[si][2], n8 = shapes[si][3];
        weight w = weight_make(be, N, K, B);
        acts a = acts_make(M_MAX, K, B, n8);
        float *all = malloc((size_t)M_MAX * N * 4), *part = malloc((size_t)M_MAX * N * 4);
        if (!run_and_compare(be, &w, &a, all, "gemm batch-invariant")) {
            free(all), free(part), acts_free(&a), weight_free(be, &w);
            continue;
        }
        gout g = gout_make((size_t)M_MAX * N);
        int bad = 0;
        for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
            const int M = Ms[mi][0], first = Ms[mi][1];
            CUDA_OK(cudaMemset(g.y, 0xFF, (size_t)M * N * 4));
            CUDA_OK(cudaDeviceSynchronize());
            comet_status st = comet_cuda_be_gemm_w4ax(be, w.w, M, n8, a.dqa + (size_t)first * K,
                                                 a.dsa + (size_t)first * (K / B), g.y);
            if (st == COMET_OK)
                st = comet_backend_cuda_sync(be);
            int same = st == COMET_OK;
            if (same) {
                CUDA_OK(cudaMemcpy(part, g.y, (size_t)M * N * 4, cudaMemcpyDeviceToHost));
                same = !memcmp(part, all + (size_t)first * N, (size_t)M * N * 4);
            }
            comet_cuda_w4ax_gemm plan = {
                .M = M, .N = N, .K = K, .B = B, .n8 = n8, .batch_invariant = 1};
            if (!same || mi == 0 || mi == 5)
                check(same,
                      "batch-invariant N=%-5d K=%-5d B=%-3d rows %d..%d alone (M=%d, %s) "
                      "== the same rows of M=%d: %s",
                      N, K, B, first, first + M - 1, M, comet_cuda_gemm_w4ax_plan_name(&plan),
                      M_MAX,
                      st != COMET_OK ? comet_last_error()
                      : same         ? "bit for bit"
                                     : "bits differ");
            bad += !same;
        }
        check(bad == 0 && gout_guards_ok(&g),
              "batch-invariant N=%d K=%d B=%d: %zu row ranges, %d "
              "differ",
              N, K, B, sizeof Ms / sizeof Ms[0], bad);
        cudaFree(g.raw);
        free(all), free(part);
        acts_free(&a);
        weight_free(be, &w);
    }
    comet_backend_set_batch_invariant(be, 0);
}

/* A fresh backend: a call with a small (or no) workspace, then one whose plan needs more,
 * then the small one again and the large one twice more (reuse; deterministic bits). */
static void test_workspace_grow(int device) {
    comet_backend *be = comet_backend_cuda_init(device);
    if (!check(be != NULL, "grow: fresh backend (%s)", be ? "" : comet_last_error()))
        return;
    /* the large call: the stream kernel with global split-K -- M = 2 and N/16 half the SM
     * count, so that the pipe kernel (no workspace; below one tile per SM it is not chosen)
     * does not run and the split count (~32) is past what a cluster reduces */
    int sms = 0;
    CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    const int NL = 16 * (sms / 2 > 1 ? sms / 2 : 1);
    weight ws = weight_make(be, 8, 64, 64), wl = weight_make(be, NL, 4096, 128);
    acts as = acts_make(1, 64, 64, 1), al = acts_make(2, 4096, 128, 2);
    comet_cuda_w4ax_gemm gs = {.M = 1, .N = 8, .K = 64, .B = 64, .n8 = 1};
    comet_cuda_w4ax_gemm gl = {.M = 2, .N = NL, .K = 4096, .B = 128, .n8 = 2};
    size_t need_s = comet_cuda_gemm_w4ax_workspace_bytes(&gs);
    size_t need_l = comet_cuda_gemm_w4ax_workspace_bytes(&gl);
    check(need_l > need_s, "grow: the second call's plan needs more workspace (%zu > %zu bytes)",
          need_l, need_s);
    float *hs = malloc(8 * 4), *hl = malloc((size_t)2 * NL * 4), *hl2 = malloc((size_t)2 * NL * 4);
    run_and_compare(be, &ws, &as, hs, "grow small");
    run_and_compare(be, &wl, &al, hl, "grow large");
    run_and_compare(be, &ws, &as, hs, "grow small again");
    run_and_compare(be, &wl, &al, hl2, "grow large again");
    check(!memcmp(hl, hl2, (size_t)2 * NL * 4), "grow: the large call gives the same bits twice");
    free(hs), free(hl), free(hl2);
    acts_free(&as), acts_free(&al);
    weight_free(be, &ws), weight_free(be, &wl);
    comet_backend_free(be);
}

/* Bad arguments come back as statuses naming the problem; nothing is launched. */
static void test_errors(comet_backend *be, int device) {
    weight w = weight_make(be, 136, 576, 64);
    acts a = acts_make(3, 576, 64, 1);
    gout g = gout_make((size_t)3 * 136);
    CUDA_OK(cudaDeviceSynchronize());
    const int nb = 576 / 64;
    struct {
        int M, n8;
        int null_w, null_qa, null_sa, null_y, misalign;
        const char *says;
    } bad[] = {
        {0, 1, 0, 0, 0, 0, 0, "M = 0"},    {-5, 1, 0, 0, 0, 0, 0, "M = -5"},
        {3, -1, 0, 0, 0, 0, 0, "n8 = -1"}, {3, nb + 1, 0, 0, 0, 0, 0, "n8 = 10"},
        {3, 1, 1, 0, 0, 0, 0, "non-NULL"}, {3, 1, 0, 1, 0, 0, 0, "non-NULL"},
        {3, 1, 0, 0, 1, 0, 0, "non-NULL"}, {3, 1, 0, 0, 0, 1, 0, "non-NULL"},
        {3, 1, 0, 0, 0, 0, 1, "aligned"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        comet_clear_error();
        comet_status st = comet_cuda_be_gemm_w4ax(
            be, bad[i].null_w ? NULL : w.w, bad[i].M, bad[i].n8,
            bad[i].null_qa ? NULL : a.dqa + bad[i].misalign, bad[i].null_sa ? NULL : a.dsa,
            bad[i].null_y ? NULL : g.y);
        check(st == COMET_ERR_INVALID_ARG && strstr(comet_last_error(), bad[i].says),
              "error: gemm_w4ax M=%d n8=%d NULL w/qa/sa/y %d%d%d%d misaligned %d -> %s \"%s\"",
              bad[i].M, bad[i].n8, bad[i].null_w, bad[i].null_qa, bad[i].null_sa, bad[i].null_y,
              bad[i].misalign, comet_status_name(st), comet_last_error());
    }
    uint32_t foreign[32] = {0x34415743u}; /* not the tag of comet_cuda_be_w4ax_load */
    comet_status st =
        comet_cuda_be_gemm_w4ax(be, (const comet_w4ax_weight *)foreign, 3, 1, a.dqa, a.dsa, g.y);
    check(st == COMET_ERR_INVALID_ARG, "error: a weight not made by a CUDA backend -> %s \"%s\"",
          comet_status_name(st), comet_last_error());

    const struct {
        int N, K, B;
        const char *says;
    } bad_load[] = {{0, 128, 64, "N = 0"},
                    {8, 96, 64, "K = 96"},
                    {8, 128, 32, "B = 32"},
                    {8, 192, 128, "K = 192 is not a multiple"},
                    {8, (1 << 20) + 64, 64, "K <= 1048576"}}; /* the CUDA GEMM's K limit */
    for (size_t i = 0; i < sizeof bad_load / sizeof bad_load[0]; i++) {
        comet_w4ax_weight *out = (comet_w4ax_weight *)foreign;
        st = comet_cuda_be_w4ax_load(be, bad_load[i].N, bad_load[i].K, bad_load[i].B, w.qw, w.sw, &out);
        check(st == COMET_ERR_INVALID_ARG && out == NULL &&
                  strstr(comet_last_error(), bad_load[i].says),
              "error: w4ax_load N=%d K=%d B=%d -> %s \"%s\"", bad_load[i].N, bad_load[i].K,
              bad_load[i].B, comet_status_name(st), comet_last_error());
    }
    comet_w4ax_weight *out = NULL;
    st = comet_cuda_be_w4ax_load(be, 8, 128, 64, NULL, w.sw, &out);
    check(st == COMET_ERR_INVALID_ARG, "error: w4ax_load with NULL codes -> %s",
          comet_status_name(st));
    comet_cuda_be_w4ax_free(be, NULL);
    check(gout_guards_ok(&g), "error: nothing was written by the refused calls' y");
    check(comet_backend_cuda_sync(be) == COMET_OK,
          "error: the stream is healthy after the refused calls");

    int n_dev = 0;
    CUDA_OK(cudaGetDeviceCount(&n_dev));
    comet_backend *none = comet_backend_cuda_init(n_dev);
    check(none == NULL && strstr(comet_last_error(), "out of range"),
          "error: comet_backend_cuda_init(%d) on %d device(s) -> \"%s\"", n_dev, n_dev,
          comet_last_error());
    comet_backend_free(none);
    (void)device;
    cudaFree(g.raw);
    acts_free(&a);
    weight_free(be, &w);
}

/* ---- the caller's CUDA context ---- */

static void *driver_fn(const char *name, unsigned version) {
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion(name, &fn, version, cudaEnableDefault, &q) !=
            cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
        return NULL;
    return fn;
}

typedef CUresult (*ctx_get_fn)(CUcontext *);
typedef CUresult (*ctx_set_fn)(CUcontext);
typedef CUresult (*ctx_create_fn)(CUcontext *, unsigned, CUdevice); /* cuCtxCreate_v2 */
typedef CUresult (*ctx_destroy_fn)(CUcontext);

typedef struct {
    comet_backend *be;
    int had_none, op_ok;
} fresh_thread;

/* A thread that never chose a device (no context current) runs an op: nothing to give back,
 * and the op works (with several GPUs, restoring "device 0" here would have created a
 * context on GPU 0; one GPU cannot show that). */
static void *fresh_thread_main(void *p) {
    fresh_thread *t = p;
    ctx_get_fn get = (ctx_get_fn)driver_fn("cuCtxGetCurrent", 4000);
    CUcontext c = (CUcontext)1;
    t->had_none = get && get(&c) == CUDA_SUCCESS && c == NULL;
    t->op_ok = comet_backend_cuda_sync(t->be) == COMET_OK;
    return NULL;
}

static void test_caller_context(comet_backend *be, int device) {
    ctx_get_fn get = (ctx_get_fn)driver_fn("cuCtxGetCurrent", 4000);
    ctx_set_fn set = (ctx_set_fn)driver_fn("cuCtxSetCurrent", 4000);
    ctx_create_fn create = (ctx_create_fn)driver_fn("cuCtxCreate", 3020);
    ctx_destroy_fn destroy = (ctx_destroy_fn)driver_fn("cuCtxDestroy", 4000);
    if (!check(get && set && create && destroy,
               "context: the driver's context functions are reachable"))
        return;
    CUcontext primary = NULL, mine = NULL, now = NULL;
    CUDA_OK(cudaSetDevice(device));
    CUDA_OK(cudaFree(0)); /* the runtime's primary context, current */
    get(&primary);
    /* a context of the caller's own (not the primary one) is current across an op */
    if (!check(create(&mine, 0, device) == CUDA_SUCCESS && mine != NULL,
               "context: a context of our own"))
        return;
    set(mine);
    comet_status st = comet_backend_cuda_sync(be);
    get(&now);
    check(st == COMET_OK && now == mine && now != primary,
          "context: the caller's own context is current again after an op (%s)",
          comet_status_name(st));
    set(primary);
    destroy(mine);
    /* a thread with no context */
    fresh_thread t = {.be = be};
    pthread_t th;
    pthread_create(&th, NULL, fresh_thread_main, &t);
    pthread_join(th, NULL);
    check(t.had_none && t.op_ok, "context: a thread without a context runs an op");
    get(&now);
    check(now == primary, "context: this thread's context is untouched by the other thread's op");
}

static comet_backend *g_be;
static int g_quick; /* --quick */
static const int g_device = 0;

COUNTED_TEST(cm_errors, test_errors(g_be, g_device))
COUNTED_TEST(cm_caller_context, test_caller_context(g_be, g_device))
COUNTED_TEST(cm_shapes, test_shapes(g_be, g_quick))
COUNTED_TEST(cm_batch_invariant, test_batch_invariant(g_be, g_quick))
COUNTED_TEST(cm_workspace_grow, test_workspace_grow(g_device))

int main(int argc, char **argv) {
    cuda_test_skip_if_no_device(); /* exit 77 (ctest: skipped) without a usable GPU */
    g_quick = argc > 1 && !strcmp(argv[1], "--quick");
    g_be = comet_backend_cuda_init(g_device);
    if (!check(g_be != NULL, "comet_backend_cuda_init(%d)%s%s", g_device, g_be ? "" : ": ",
               g_be ? "" : comet_last_error())) {
        printf("%d/%d checks passed\n", n_check - n_fail, n_check);
        return 1;
    }
    check(!strcmp(g_be->ops->name, "cuda") && g_be->ops->embed_tokens && g_be->ops->sample,
          "the table: name 'cuda', embed_tokens and sample set");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(cm_errors),         cmocka_unit_test(cm_caller_context),
        cmocka_unit_test(cm_shapes),         cmocka_unit_test(cm_batch_invariant),
        cmocka_unit_test(cm_workspace_grow),
    };
    if (getenv("COMET_TEST_FILTER")) /* one test by name */
        cmocka_set_test_filter(getenv("COMET_TEST_FILTER"));
    const int rc = cmocka_run_group_tests(tests, NULL, NULL);
    comet_backend_free(g_be);
    printf("%d/%d checks passed\n", n_check - n_fail, n_check);
    return rc || n_fail ? 1 : 0;
}
