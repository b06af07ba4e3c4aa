/* test_gemm_w4ax_cuda.c — GPU test of the CUDA W4Ax GEMM against the scalar oracle
 * (comet_ref_gemm_w4ax). For each shape of the grid below (every value of M, N, K is
 * covered; the largest combinations are trimmed to keep the CPU oracle affordable) and
 * each kernel (the automatic plan, every kernel forced, forced split counts):
 *   - int32 block sums written by the kernel's debug mode equal the oracle's bit for bit;
 *   - fp32 outputs agree within fp32 rounding of the outer sum, fp16 outputs within fp16
 *     rounding, and two runs give identical bits (deterministic split-K);
 *   - guard words around every output stay intact, and poisoned outputs are all written;
 *   - outputs one element past an aligned address get the aligned run's bits.
 * Usage: test_gemm_w4ax_cuda [--quick | --no-sm90a | --pdl]
 *   --quick: a few shapes, for compute-sanitizer;
 *   --pdl: only the chained calls with programmatic dependent launch (test_pdl_chain);
 *   --no-sm90a: the quick shapes and the pdl chains, for a binary built without sm_90a code
 *     (a CMake build with CMAKE_CUDA_ARCHITECTURES=90, e.g. COMET_CUDA_ARCHS=90 with
 *     scripts/gpu/build.sh) run on an sm_90 GPU: the automatic
 *     plans must keep to the stream and tiled kernels and be right, forcing the wgmma kernel
 *     must be refused, and pdl (sm_90 code has its instructions) must hold.
 * The parts run as cmocka tests (cm_bad_args, cm_shared_workspace, cm_pdl_chain, cm_shapes;
 * COMET_TEST_FILTER=name runs one), each failing when one of its checks fails; a line per
 * check or case, then "N of M checks failed". Exit status 0 when every check passes. */
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
#include <cuda_runtime_api.h>

#include "backend/cpu/ref_gemm_w4ax.h"
#include "backend/cuda/gemm_w4ax.h"
#include "numerics/w4_plain.h"

#define CUDA_TEST_SEED 0x9E3779B97F4A7C15ull
#include "cuda_test_util.h"
#include "cuda_skip.h"

static int n_fail = 0, n_check = 0;
static int no_sm90a = 0; /* --no-sm90a */
static int g_quick = 0;  /* --quick or --no-sm90a: the sanitizer shapes (test_shapes) */

static float f16_round(float x) {
    /* round-to-nearest-even to binary16 precision, via the exact f16 grid (normal range) */
    if (x == 0.0f || !isfinite(x))
        return x;
    int e;
    frexpf(x, &e);
    if (e < -13)
        e = -13; /* subnormal spacing 2^-24 */
    float ulp = ldexpf(1.0f, e - 11);
    return rintf(x / ulp) * ulp;
}

/* Device buffer with guard words on both sides. */
typedef struct {
    uint32_t *raw;
    void *p;
    size_t bytes;
} guarded;

static guarded galloc(size_t bytes) {
    guarded g = {0};
    g.bytes = bytes;
    g.raw = guarded_raw_alloc((bytes + 3) / 4);
    g.p = g.raw + GUARD;
    return g;
}

/* Poison the payload (0xFF bytes: NaN for floats, -1 for ints). */
static void gpoison(guarded *g) { CUDA_OK(cudaMemset(g->p, 0xFF, g->bytes)); }

static int gcheck(const guarded *g, const char *what) {
    int bad = !guards_intact(g->raw, (g->bytes + 3) / 4);
    if (bad)
        fprintf(stderr, "  guard words around %s overwritten\n", what);
    return bad;
}

static void gfree(guarded *g) { cudaFree(g->raw); }

typedef struct {
    int M, N, K, B, n8;
} shape;

/* Random inputs of one shape: plain-layout codes (the first n8 blocks INT8, the rest INT4)
 * and scales on the host, for the oracle, and their packed copies on the device. */
typedef struct {
    uint8_t *qw;
    uint16_t *sw;
    int8_t *qa;
    float *sa;
    uint8_t *dqw;
    uint16_t *dsw;
    int8_t *dqa;
    float *dsa;
} inputs;

static inputs inputs_make(const shape *s) {
    const int M = s->M, N = s->N, K = s->K, B = s->B, nb = K / B, n8 = s->n8;
    const size_t qb = comet_w4_plain_bytes(N, K), pqb = comet_cuda_w4ax_packed_qw_bytes(N, K);
    const size_t psb = comet_cuda_w4ax_packed_sw_bytes(N, K, B);
    inputs in = {.qw = malloc(qb),
                 .sw = malloc((size_t)N * nb * 2),
                 .qa = malloc((size_t)M * K),
                 .sa = malloc((size_t)M * nb * 4)};
    uint8_t *pqw = malloc(pqb);
    uint16_t *psw = malloc(psb);
    for (size_t i = 0; i < qb; i++)
        in.qw[i] = (uint8_t)rnd();
    for (int i = 0; i < N * nb; i++) /* positive normal fp16 in [2^-9, 2^-2) */
        in.sw[i] = (uint16_t)(((6 + rnd() % 7) << 10) | (rnd() & 0x3FF));
    for (int t = 0; t < M; t++)
        for (int k = 0; k < K; k++)
            in.qa[(size_t)t * K + k] =
                k / B < n8 ? (int8_t)(rnd() & 0xFF) : (int8_t)((int)(rnd() % 16) - 8);
    for (int i = 0; i < M * nb; i++)
        in.sa[i] = (float)(rnd() % 1000 + 1) * 1e-4f;
    if (comet_cuda_w4ax_pack(N, K, B, in.qw, in.sw, pqw, psw) != COMET_OK) {
        fprintf(stderr, "pack failed: %s\n", comet_last_error());
        exit(2);
    }
    CUDA_OK(cudaMalloc((void **)&in.dqw, pqb));
    CUDA_OK(cudaMalloc((void **)&in.dsw, psb));
    CUDA_OK(cudaMalloc((void **)&in.dqa, (size_t)M * K));
    CUDA_OK(cudaMalloc((void **)&in.dsa, (size_t)M * nb * 4));
    CUDA_OK(cudaMemcpy(in.dqw, pqw, pqb, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(in.dsw, psw, psb, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(in.dqa, in.qa, (size_t)M * K, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(in.dsa, in.sa, (size_t)M * nb * 4, cudaMemcpyHostToDevice));
    free(pqw), free(psw);
    return in;
}

static void inputs_free(inputs *in) {
    free(in->qw), free(in->sw), free(in->qa), free(in->sa);
    cudaFree(in->dqw), cudaFree(in->dsw), cudaFree(in->dqa), cudaFree(in->dsa);
}

/* Launch g on stream st, exiting (status 2) if the launch fails. */
static void launch_or_die(const comet_cuda_w4ax_gemm *g, cudaStream_t st) {
    if (comet_cuda_gemm_w4ax(g, st) != COMET_OK) {
        fprintf(stderr, "  launch failed: %s\n", comet_last_error());
        exit(2);
    }
}

/* Run one kernel configuration and compare with the oracle. Returns failures. */
static int run_case(const shape *s, comet_w4ax_kernel kernel, int splits, int tok, int pt, int pdl,
                    const inputs *in, const float *y_ref, const int32_t *bs_ref,
                    const double *mag) {
    const int M = s->M, N = s->N, nb = s->K / s->B;
    size_t ny = (size_t)M * N, nbs = ny * nb;
    guarded gy = galloc(ny * 4), gy16 = galloc(ny * 2), gbs = galloc(nbs * 4);
    comet_cuda_w4ax_gemm g = {.M = M,
                              .N = N,
                              .K = s->K,
                              .B = s->B,
                              .n8 = s->n8,
                              .qw = in->dqw,
                              .sw = in->dsw,
                              .qa = in->dqa,
                              .sa = in->dsa,
                              .kernel = kernel,
                              .splits = splits,
                              .tile_tokens = tok,
                              .pipe_tiles = pt,
                              .pdl = pdl};
    size_t wsb = comet_cuda_gemm_w4ax_workspace_bytes(&g);
    void *ws = NULL;
    if (wsb) {
        CUDA_OK(cudaMalloc(&ws, wsb));
        CUDA_OK(cudaMemset(ws, 0, wsb));
    }
    g.workspace = ws, g.workspace_bytes = wsb;
    char plan[112];
    snprintf(plan, sizeof plan, "%s", comet_cuda_gemm_w4ax_plan_name(&g));
    int fails = 0;
    if (no_sm90a) {
        /* a build without sm_90a code: the automatic plan keeps to the sm_80 kernels, and the
         * wgmma kernel, whose body is empty there, is refused rather than run */
        if (kernel == COMET_W4AX_KERNEL_AUTO && strncmp(plan, "stream", 6) &&
            strncmp(plan, "tiled", 5)) {
            fprintf(stderr, "  the automatic plan is %s without sm_90a code\n", plan);
            fails++;
        }
        if (kernel == COMET_W4AX_KERNEL_WGMMA) {
            g.y = gy.p;
            if (comet_cuda_gemm_w4ax(&g, NULL) != COMET_ERR_UNSUPPORTED) {
                fprintf(stderr, "  the wgmma kernel was not refused: %s\n", comet_last_error());
                fails++;
            }
            n_check++;
            printf("%-4s M=%-5d N=%-5d K=%-6d B=%-3d n8=%-4d wgmma refused without sm_90a code\n",
                   fails ? "FAIL" : "ok", M, N, s->K, s->B, s->n8);
            gfree(&gy), gfree(&gy16), gfree(&gbs);
            cudaFree(ws);
            return fails;
        }
    }
    float *hy = malloc(ny * 4), *hy2 = malloc(ny * 4);
    uint16_t *hy16 = malloc(ny * 2);
    int32_t *hbs = malloc(nbs * 4);

    /* 1. debug mode: block sums + fp32 output */
    gpoison(&gy), gpoison(&gbs);
    g.y = gy.p, g.bsum = gbs.p;
    launch_or_die(&g, NULL);
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(hbs, gbs.p, nbs * 4, cudaMemcpyDeviceToHost));
    size_t bad_bs = 0, first = (size_t)-1;
    for (size_t i = 0; i < nbs; i++)
        if (hbs[i] != bs_ref[i]) {
            if (first == (size_t)-1)
                first = i;
            bad_bs++;
        }
    if (bad_bs) {
        size_t t = first / ((size_t)N * nb), n = first / nb % N, b = first % nb;
        fprintf(stderr, "  block sums: %zu of %zu differ; first t=%zu n=%zu b=%zu got %d want %d\n",
                bad_bs, nbs, t, n, b, hbs[first], bs_ref[first]);
        fails++;
    }
    fails += gcheck(&gbs, "bsum");

    /* 2. production mode, twice: fp32 + fp16 outputs, determinism */
    for (int rep = 0; rep < 2; rep++) {
        gpoison(&gy), gpoison(&gy16);
        g.bsum = NULL, g.y = gy.p, g.y_f16 = gy16.p;
        launch_or_die(&g, NULL);
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(cudaMemcpy(rep ? hy2 : hy, gy.p, ny * 4, cudaMemcpyDeviceToHost));
    }
    CUDA_OK(cudaMemcpy(hy16, gy16.p, ny * 2, cudaMemcpyDeviceToHost));
    if (memcmp(hy, hy2, ny * 4)) {
        fprintf(stderr, "  two runs differ (non-deterministic)\n");
        fails++;
    }
    /* 3. outputs one element past an aligned address (y 4-byte, y_f16 2-byte aligned): the
     * four-wide stores (store_out4) fall back to single ones, with the same bits */
    {
        guarded uy = galloc((ny + 1) * 4), uy16 = galloc((ny + 1) * 2);
        gpoison(&uy), gpoison(&uy16);
        g.y = (float *)uy.p + 1, g.y_f16 = (uint16_t *)uy16.p + 1;
        launch_or_die(&g, NULL);
        CUDA_OK(cudaDeviceSynchronize());
        uint16_t *u16 = malloc((ny + 1) * 2);
        uint32_t w0;
        CUDA_OK(cudaMemcpy(hy2, g.y, ny * 4, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(u16, uy16.p, (ny + 1) * 2, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(&w0, uy.p, 4, cudaMemcpyDeviceToHost));
        if (memcmp(hy, hy2, ny * 4) || memcmp(hy16, u16 + 1, ny * 2)) {
            fprintf(stderr, "  outputs at an unaligned address differ from the aligned run's\n");
            fails++;
        }
        if (w0 != 0xFFFFFFFFu || u16[0] != 0xFFFF) {
            fprintf(stderr, "  the element before the unaligned outputs was written\n");
            fails++;
        }
        fails += gcheck(&uy, "unaligned y") + gcheck(&uy16, "unaligned y_f16");
        free(u16);
        gfree(&uy), gfree(&uy16);
    }
    /* 4. the output split by columns into 2 or 3 parts (y_parts: a stacked GEMM's roles), the
     * middle one dropped (NULL) in a second run: each part holds exactly its columns of the
     * plain run's y, and nothing past it is written */
    if (N % 4 == 0 && N >= 8) {
        const int np = N >= 12 ? 3 : 2;
        int c0[4] = {0, N / np / 4 * 4, np == 3 ? 2 * N / 3 / 4 * 4 : N, N};
        for (int drop = 0; drop < 2; drop++) {
            guarded gp[3];
            comet_cuda_w4ax_gemm gs = g;
            gs.y = NULL, gs.y_f16 = NULL, gs.y_parts = np;
            for (int i = 0; i < np; i++) {
                gp[i] = galloc((size_t)M * (c0[i + 1] - c0[i]) * 4);
                gpoison(&gp[i]);
                gs.y_col0[i] = c0[i];
                gs.y_part[i] = drop && i == 1 ? NULL : (float *)gp[i].p;
            }
            gs.y_col0[np] = N;
            launch_or_die(&gs, NULL);
            CUDA_OK(cudaDeviceSynchronize());
            for (int i = 0; i < np; i++) {
                const int w = c0[i + 1] - c0[i];
                float *hp = malloc((size_t)M * w * 4);
                CUDA_OK(cudaMemcpy(hp, gp[i].p, (size_t)M * w * 4, cudaMemcpyDeviceToHost));
                size_t bad = 0;
                for (int t = 0; t < M; t++)
                    for (int c = 0; c < w; c++) {
                        uint32_t got, want = 0xFFFFFFFFu;
                        memcpy(&got, &hp[(size_t)t * w + c], 4);
                        if (!(drop && i == 1))
                            memcpy(&want, &hy[(size_t)t * N + c0[i] + c], 4);
                        bad += got != want;
                    }
                if (bad) {
                    fprintf(stderr, "  output part %d of %d (columns %d..%d%s): %zu values differ "
                            "from the plain output's\n", i, np, c0[i], c0[i + 1] - 1,
                            drop && i == 1 ? ", dropped" : "", bad);
                    fails++;
                }
                fails += gcheck(&gp[i], "y part");
                free(hp);
                gfree(&gp[i]);
            }
        }
    }
    size_t bad_y = 0, bad_16 = 0;
    double worst = 0;
    for (size_t i = 0; i < ny; i++) {
        /* outer sum over nb blocks in fp32: error <= ~nb * 2^-23 * sum |terms| */
        double tol = (nb + 2) * 1.2e-7 * mag[i] + 1e-30;
        double err = fabs((double)hy[i] - (double)y_ref[i]);
        if (!(err <= tol))
            bad_y++;
        if (err / tol > worst)
            worst = err / tol;
        float h = comet_ref_f16_to_f32(hy16[i]), want = f16_round(hy[i]);
        if (!(h == want || fabsf(h - want) <= fabsf(want) * 1.0e-3f + 1e-7f))
            bad_16++;
    }
    if (bad_y || bad_16) {
        fprintf(stderr, "  outputs: %zu fp32 and %zu fp16 out of tolerance (worst err/tol %.3g)\n",
                bad_y, bad_16, worst);
        fails++;
    }
    fails += gcheck(&gy, "y") + gcheck(&gy16, "y_f16");
    n_check++;
    printf("%-4s M=%-5d N=%-5d K=%-6d B=%-3d n8=%-4d %-32s err/tol %.3f\n", fails ? "FAIL" : "ok",
           M, N, s->K, s->B, s->n8, plan, worst);
    fflush(stdout);
    free(hy), free(hy2), free(hy16), free(hbs);
    gfree(&gy), gfree(&gy16), gfree(&gbs);
    cudaFree(ws);
    return fails;
}

static void test_shape(const shape *s, int quick) {
    const int M = s->M, N = s->N, K = s->K, B = s->B, nb = K / B, n8 = s->n8;
    inputs in = inputs_make(s);
    float *y_ref = malloc((size_t)M * N * 4);
    int32_t *bs_ref = malloc((size_t)M * N * nb * 4);
    double *mag = malloc((size_t)M * N * sizeof(double));
    ref_job job = {.M = M,
                   .N = N,
                   .K = K,
                   .B = B,
                   .n8 = n8,
                   .qw = in.qw,
                   .sw = in.sw,
                   .qa = in.qa,
                   .sa = in.sa,
                   .y = y_ref,
                   .bs = bs_ref};
    ref_threaded(job);
    for (int t = 0; t < M; t++)
        for (int n = 0; n < N; n++) {
            double m = 0;
            for (int b = 0; b < nb; b++)
                m += fabs((double)bs_ref[((size_t)t * N + n) * nb + b] * in.sa[t * nb + b] *
                          comet_ref_f16_to_f32(in.sw[(size_t)n * nb + b]));
            mag[(size_t)t * N + n] = m;
        }

    n_fail += run_case(s, COMET_W4AX_KERNEL_AUTO, 0, 0, 0, 0, &in, y_ref, bs_ref, mag) > 0;
    if (!quick || M <= 64) {
        /* every kernel on the same inputs, and a forced split count */
        for (int k = COMET_W4AX_KERNEL_STREAM; k < COMET_W4AX_KERNEL_COUNT; k++)
            n_fail += run_case(s, (comet_w4ax_kernel)k, 0, 0, 0, 0, &in, y_ref, bs_ref, mag) > 0;
        n_fail += run_case(s, M <= 32 ? COMET_W4AX_KERNEL_STREAM : COMET_W4AX_KERNEL_WGMMA,
                           nb > 3 ? 3 : nb, 0, 0, 0, &in, y_ref, bs_ref, mag) > 0;
        /* the pipe kernel launched with pdl: the weights of its first ring positions are copied
         * before it waits, by a walk of their own (items per CTA > 1 on the wide shapes) */
        n_fail += run_case(s, COMET_W4AX_KERNEL_PIPE, 0, 0, 0, 1, &in, y_ref, bs_ref, mag) > 0;
        /* the pipe kernel with each count of weight tiles per item, which share the token rows
         * (the last item along N short of them where N/16 is not a multiple: N = 8, 136, 168),
         * the 3- and 4-tile ones also with pdl (at 16 tokens fewer early positions than ring
         * slots - 1); the automatic plan takes 2-4 wherever N/16 >= 2 */
        for (int pt = 1; pt <= 4; pt++)
            n_fail += run_case(s, COMET_W4AX_KERNEL_PIPE, 0, 0, pt, 0, &in, y_ref, bs_ref, mag) > 0;
        n_fail += run_case(s, COMET_W4AX_KERNEL_PIPE, 0, 0, 3, 1, &in, y_ref, bs_ref, mag) > 0;
        n_fail += run_case(s, COMET_W4AX_KERNEL_PIPE, 0, 0, 4, 1, &in, y_ref, bs_ref, mag) > 0;
        /* the wgmma kernel with the token tiles that its automatic plan does not pick here */
        const int auto_tok = M <= 16 && s->K >= 8192 ? 16 : M <= 32 ? 32 : M <= 64 ? 64 : 128;
        for (int tok = 16; tok <= 128; tok *= 2)
            if (tok != auto_tok)
                n_fail +=
                    run_case(s, COMET_W4AX_KERNEL_WGMMA, 0, tok, 0, 0, &in, y_ref, bs_ref, mag) > 0;
        /* more splits than a cluster holds: the global-memory split-K path of each kernel
         * (for M <= 32 also the wgmma kernel's, with its 32-token tile) */
        if (nb >= 10) {
            n_fail += run_case(s, M <= 32 ? COMET_W4AX_KERNEL_STREAM : COMET_W4AX_KERNEL_WGMMA, 10,
                               0, 0, 0, &in, y_ref, bs_ref, mag) > 0;
            if (M <= 32)
                n_fail +=
                    run_case(s, COMET_W4AX_KERNEL_WGMMA, 10, 0, 0, 0, &in, y_ref, bs_ref, mag) > 0;
        }
    }
    inputs_free(&in);
    free(y_ref), free(bs_ref), free(mag);
}

/* Run the automatic plan of shape s on in's device inputs with workspace ws (a poisoned
 * output first); returns y on the host. */
static float *run_auto(const shape *s, const inputs *in, void *ws, size_t ws_bytes) {
    const size_t ny = (size_t)s->M * s->N;
    float *y;
    CUDA_OK(cudaMalloc((void **)&y, ny * 4));
    CUDA_OK(cudaMemset(y, 0xFF, ny * 4));
    comet_cuda_w4ax_gemm g = {.M = s->M,
                              .N = s->N,
                              .K = s->K,
                              .B = s->B,
                              .n8 = s->n8,
                              .qw = in->dqw,
                              .sw = in->dsw,
                              .qa = in->dqa,
                              .sa = in->dsa,
                              .y = y,
                              .workspace = ws,
                              .workspace_bytes = ws_bytes};
    launch_or_die(&g, NULL);
    float *h = malloc(ny * 4);
    CUDA_OK(cudaMemcpy(h, y, ny * 4, cudaMemcpyDeviceToHost));
    cudaFree(y);
    return h;
}

/* One workspace shared by calls of different plans, as the CUDA backend shares it: the
 * counters of one plan must not sit where another plan's partials went. A: global split-K
 * below one wave (80 tiles); B: stream-K (140 tiles), whose counters 128-139 lay on A's
 * partials while the counter region was sized per plan. Each run, after the other's, must
 * give the bits of a run on a fresh zeroed workspace. */
static void test_shared_workspace(void) {
    const shape sh[2] = {{40, 10240, 8192, 128, 8}, {65, 17920, 2048, 64, 8}};
    inputs in[2];
    comet_cuda_w4ax_gemm g[2];
    size_t wb[2], wmax = 0;
    for (int k = 0; k < 2; k++) {
        in[k] = inputs_make(&sh[k]);
        g[k] = (comet_cuda_w4ax_gemm){.M = sh[k].M, .N = sh[k].N, .K = sh[k].K, .B = sh[k].B};
        wb[k] = comet_cuda_gemm_w4ax_workspace_bytes(&g[k]);
        wmax = wb[k] > wmax ? wb[k] : wmax;
    }
    void *fresh, *shared;
    CUDA_OK(cudaMalloc(&fresh, wmax));
    CUDA_OK(cudaMalloc(&shared, wmax));
    CUDA_OK(cudaMemset(shared, 0, wmax));
    float *ref[2];
    for (int k = 0; k < 2; k++) {
        CUDA_OK(cudaMemset(fresh, 0, wmax));
        ref[k] = run_auto(&sh[k], &in[k], fresh, wmax);
    }
    int bad =
        wb[0] == 0 || wb[1] == 0; /* both plans must use the workspace for this to test anything */
    const int order[] = {0, 1, 1, 0, 1};
    for (int i = 0; i < 5; i++) {
        const int k = order[i];
        float *got = run_auto(&sh[k], &in[k], shared, wmax);
        bad |= memcmp(got, ref[k], (size_t)sh[k].M * sh[k].N * 4) != 0;
        free(got);
    }
    n_check++;
    n_fail += bad;
    char pa[112]; /* plan_name returns a static buffer */
    snprintf(pa, sizeof pa, "%s", comet_cuda_gemm_w4ax_plan_name(&g[0]));
    printf("%-4s one workspace shared by a global split-K and a stream-K plan (%s; %s)\n",
           bad ? "FAIL" : "ok", pa, comet_cuda_gemm_w4ax_plan_name(&g[1]));
    for (int k = 0; k < 2; k++)
        free(ref[k]), inputs_free(&in[k]);
    cudaFree(fresh), cudaFree(shared);
}

/* Programmatic dependent launch (comet_cuda_w4ax_gemm.pdl): a call launched with it may start
 * while the previous kernel runs, so it must wait for that kernel before it reads what that
 * kernel writes and before it writes what that kernel reads. A long first GEMM (4096 x 28672,
 * the stream kernel, which reads its activation scales until its end) writes y1 and reads sa1;
 * the call under test, pdl = 1 right behind it on one stream, reads y1 as its activation
 * scales and writes its output over sa1. Both results must equal, bit for bit, those of the
 * same two calls run one after the other with a synchronization between them (the kernels
 * are deterministic). In the cases marked qa_y1 the call under test also reads y1's bytes as
 * its activation codes (M x K <= 16 KB): the codes, which the pipe and stream kernels
 * copy through L1, must likewise be read only after the wait. Built with -DCOMET_PDL_NO_WAIT (bench/gemm/build_variant.sh), the
 * kernels skip the wait and these checks fail (checked on the H200). Both calls
 * share one workspace, as the CUDA backend's calls do. */
static void test_pdl_chain(void) {
    const shape s1 = {1, 4096, 28672, 128, 28};
    const int nb1 = s1.K / s1.B;
    inputs in1 = inputs_make(&s1);
    typedef struct {
        shape s;
        comet_w4ax_kernel kernel;
        int splits, tok, pt, qa_y1;
    } cfg;
    const cfg cases[] = {
        {{1, 8192, 4096, 128, 4}, COMET_W4AX_KERNEL_AUTO, 0, 0, 0, 0}, /* pipe (M = 1 with pdl) */
        {{1, 4096, 14336, 64, 28}, COMET_W4AX_KERNEL_AUTO, 0, 0, 0, 0},
        {{2, 8192, 4096, 128, 4}, COMET_W4AX_KERNEL_AUTO, 0, 0, 0, 0}, /* pipe, 2 tiles per item */
        {{8, 4096, 4096, 128, 4}, COMET_W4AX_KERNEL_AUTO, 0, 0, 0, 0}, /* pipe */
        {{8, 4096, 4096, 128, 4}, COMET_W4AX_KERNEL_STREAM, 0, 0, 0, 0}, /* global split-K */
        {{16, 4096, 4096, 128, 4}, COMET_W4AX_KERNEL_AUTO, 0, 0, 0, 0},  /* pipe, 16 tokens */
        /* 32 tokens, cluster split-K */
        {{16, 6144, 4096, 128, 4}, COMET_W4AX_KERNEL_WGMMA, 0, 0, 0, 0},
        {{16, 4096, 4096, 128, 4}, COMET_W4AX_KERNEL_WGMMA, 0, 16, 0, 0},
        {{16, 4096, 4096, 128, 4}, COMET_W4AX_KERNEL_STREAM, 0, 0, 0, 0}, /* cluster split-K */
        {{100, 4096, 4096, 128, 4}, COMET_W4AX_KERNEL_AUTO, 0, 0, 0, 0},
        {{100, 4096, 4096, 128, 4}, COMET_W4AX_KERNEL_WGMMA, 10, 0, 0, 0}, /* global split-K */
        {{100, 4096, 4096, 128, 4}, COMET_W4AX_KERNEL_TILED, 0, 0, 0, 0},
        {{65, 17920, 2048, 64, 8}, COMET_W4AX_KERNEL_AUTO, 0, 0, 0, 0}, /* stream-K */
        {{16, 4096, 4096, 128, 4}, COMET_W4AX_KERNEL_PIPE, 0, 0, 3, 0}, /* pipe, 3 tiles per item */
        /* pipe, 3 tiles per item, a 3-slot ring with one early position (8B gate_up at M = 16) */
        {{16, 28672, 4096, 128, 4}, COMET_W4AX_KERNEL_AUTO, 0, 0, 0, 0},
        /* activation codes written by the previous kernel */
        {{2, 8192, 4096, 128, 4}, COMET_W4AX_KERNEL_AUTO, 0, 0, 0, 1}, /* pipe */
        {{4, 4096, 4096, 128, 4}, COMET_W4AX_KERNEL_AUTO, 0, 0, 0, 1}, /* pipe */
        {{8, 4096, 2048, 64, 4}, COMET_W4AX_KERNEL_PIPE, 0, 0, 2, 1},  /* pipe, 2 tiles per item */
        {{8, 4096, 2048, 128, 4}, COMET_W4AX_KERNEL_STREAM, 0, 0, 0, 1},
        {{16, 4096, 1024, 128, 2}, COMET_W4AX_KERNEL_AUTO, 0, 0, 0, 1}, /* pipe, 16 tokens */
        {{16, 4096, 1024, 128, 2}, COMET_W4AX_KERNEL_WGMMA, 0, 16, 0, 1},
    };
    const size_t n_sa1 = 65 * 17920; /* the largest output written over sa1 */
    float *y1, *sa1, *y2;
    CUDA_OK(cudaMalloc((void **)&y1, (size_t)s1.N * 4));
    CUDA_OK(cudaMalloc((void **)&sa1, n_sa1 * 4));
    CUDA_OK(cudaMalloc((void **)&y2, n_sa1 * 4));
    cudaStream_t st;
    CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    comet_cuda_w4ax_gemm g1 = {.M = 1,
                               .N = s1.N,
                               .K = s1.K,
                               .B = s1.B,
                               .n8 = s1.n8,
                               .qw = in1.dqw,
                               .sw = in1.dsw,
                               .qa = in1.dqa,
                               .sa = sa1,
                               .y = y1,
                               .kernel = COMET_W4AX_KERNEL_STREAM};
    const size_t wsb1 = comet_cuda_gemm_w4ax_workspace_bytes(&g1);
    float *ref1 = malloc((size_t)s1.N * 4), *got1 = malloc((size_t)s1.N * 4);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        if (no_sm90a && cases[c].kernel == COMET_W4AX_KERNEL_WGMMA)
            continue; /* refused without sm_90a code (test_bad_args checks that) */
        const shape *s = &cases[c].s;
        const size_t ny = (size_t)s->M * s->N, nsa = (size_t)s->M * (s->K / s->B);
        inputs in2 = inputs_make(s);
        comet_cuda_w4ax_gemm g2 = {.M = s->M,
                                   .N = s->N,
                                   .K = s->K,
                                   .B = s->B,
                                   .n8 = s->n8,
                                   .qw = in2.dqw,
                                   .sw = in2.dsw,
                                   .qa = cases[c].qa_y1 ? (const int8_t *)y1 : in2.dqa,
                                   .sa = y1,
                                   .kernel = cases[c].kernel,
                                   .splits = cases[c].splits,
                                   .tile_tokens = cases[c].tok,
                                   .pipe_tiles = cases[c].pt,
                                   .pdl = 1};
        /* one workspace for both calls, as the CUDA backend shares one: the pdl call must not
         * touch the counters or partials before the previous call is done with them */
        const size_t wsb2 = comet_cuda_gemm_w4ax_workspace_bytes(&g2),
                     wsb = wsb1 > wsb2 ? wsb1 : wsb2;
        void *ws;
        CUDA_OK(cudaMalloc(&ws, wsb + 16));
        CUDA_OK(cudaMemset(ws, 0, wsb + 16));
        g1.workspace = g2.workspace = ws, g1.workspace_bytes = g2.workspace_bytes = wsb;
        /* with sm_90a code the call must run with pdl, else the chain tests nothing */
        char plan[112];
        snprintf(plan, sizeof plan, "%s", comet_cuda_gemm_w4ax_plan_name(&g2));
        const int qa_fits = !cases[c].qa_y1 || (size_t)s->M * s->K <= (size_t)s1.N * 4;
        if (nsa > (size_t)s1.N || !qa_fits || !strstr(plan, " pdl")) {
            fprintf(stderr, "  %s\n",
                    nsa > (size_t)s1.N ? "y1 cannot hold the activation scales"
                    : !qa_fits         ? "y1 cannot hold the activation codes"
                                       : "the plan does not launch with pdl");
            printf("FAIL pdl chain M=%-4d N=%-5d K=%-6d B=%-3d %s\n", s->M, s->N, s->K, s->B, plan);
            n_check++, n_fail++;
            cudaFree(ws);
            inputs_free(&in2);
            continue;
        }
        float *ref2 = malloc(ny * 4), *got2 = malloc(ny * 4);
        int bad = 0;
        /* one after the other: y1 = GEMM1(sa1), then y2 = GEMM2(sa = y1), synchronized between */
        CUDA_OK(cudaMemcpy(sa1, in1.dsa, (size_t)nb1 * 4, cudaMemcpyDeviceToDevice));
        CUDA_OK(cudaDeviceSynchronize()); /* a device-to-device copy does not wait for itself */
        launch_or_die(&g1, st);
        CUDA_OK(cudaStreamSynchronize(st));
        g2.y = y2; /* the same plan as chained, nothing to overlap */
        launch_or_die(&g2, st);
        CUDA_OK(cudaStreamSynchronize(st));
        CUDA_OK(cudaMemcpy(ref1, y1, (size_t)s1.N * 4, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(ref2, y2, ny * 4, cudaMemcpyDeviceToHost));
        /* chained: y1 zeroed (stale scales give zeros), GEMM2 right behind GEMM1, writing sa1 */
        int runs_bad = 0;
        for (int rep = 0; rep < 3; rep++) {
            CUDA_OK(cudaMemcpy(sa1, in1.dsa, (size_t)nb1 * 4, cudaMemcpyDeviceToDevice));
            CUDA_OK(cudaMemset(y1, 0, (size_t)s1.N * 4));
            CUDA_OK(cudaDeviceSynchronize());
            g2.y = sa1;
            launch_or_die(&g1, st);
            launch_or_die(&g2, st);
            CUDA_OK(cudaStreamSynchronize(st));
            CUDA_OK(cudaMemcpy(got1, y1, (size_t)s1.N * 4, cudaMemcpyDeviceToHost));
            CUDA_OK(cudaMemcpy(got2, sa1, ny * 4, cudaMemcpyDeviceToHost));
            const int war = memcmp(got1, ref1, (size_t)s1.N * 4) != 0,
                      raw = memcmp(got2, ref2, ny * 4) != 0;
            if (raw) {
                size_t nd = 0, first = 0;
                for (size_t i = ny; i-- > 0;)
                    if (memcmp(&got2[i], &ref2[i], 4))
                        nd++, first = i;
                fprintf(stderr,
                        "  chained run %d: the pdl call read activations before the previous call "
                        "wrote them (%zu of %zu outputs differ; first %zu: %g, want %g)\n",
                        rep, nd, ny, first, got2[first], ref2[first]);
            }
            if (war) {
                size_t nd = 0;
                for (size_t i = 0; i < (size_t)s1.N; i++)
                    nd += memcmp(&got1[i], &ref1[i], 4) != 0;
                fprintf(
                    stderr,
                    "  chained run %d: the pdl call wrote its output before the previous call read "
                    "it (%zu of %d of the previous call's outputs differ)\n",
                    rep, nd, s1.N);
            }
            runs_bad |= war || raw;
        }
        bad |= runs_bad;
        n_check++;
        n_fail += bad;
        printf("%-4s pdl chain M=%-4d N=%-5d K=%-6d B=%-3d %s%s\n", bad ? "FAIL" : "ok", s->M, s->N,
               s->K, s->B, plan, cases[c].qa_y1 ? " (codes from y1)" : "");
        free(ref2), free(got2);
        cudaFree(ws);
        inputs_free(&in2);
    }
    free(ref1), free(got1);
    cudaFree(y1), cudaFree(sa1), cudaFree(y2);
    CUDA_OK(cudaStreamDestroy(st));
    inputs_free(&in1);
}

/* In test_bad_args: `cond` must hold, else the check fails, naming its line. */
#define ARG_OK(cond)                                                                               \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "  line %d: %s (%s)\n", __LINE__, #cond, comet_last_error());          \
            bad = 1;                                                                               \
        }                                                                                          \
    } while (0)

/* API errors come back as statuses, not crashes. */
static void test_bad_args(void) {
    comet_cuda_w4ax_gemm g = {.M = 1, .N = 8, .K = 96, .B = 64};
    int bad = 0;
    ARG_OK(comet_cuda_gemm_w4ax(&g, NULL) == COMET_ERR_INVALID_ARG);
    g.K = 128;
    ARG_OK(comet_cuda_gemm_w4ax(&g, NULL) == COMET_ERR_INVALID_ARG); /* NULL pointers */
    /* scales off a 16-byte boundary (the pipe kernel copies them in 16-byte pieces) */
    void *buf = NULL;
    CUDA_OK(cudaMalloc(&buf, 1 << 16));
    comet_cuda_w4ax_gemm a = {.M = 1,
                              .N = 16,
                              .K = 128,
                              .B = 64,
                              .qw = (const uint8_t *)buf,
                              .sw = (const uint16_t *)((char *)buf + 4096 + 2),
                              .qa = (const int8_t *)buf + 8192,
                              .sa = (const float *)((char *)buf + 12288),
                              .y = (float *)((char *)buf + 16384)};
    ARG_OK(comet_cuda_gemm_w4ax(&a, NULL) == COMET_ERR_INVALID_ARG);
    a.sw = (const uint16_t *)((char *)buf + 4096);
    /* the same call, aligned (with the workspace its plan needs: none on sm_90a, where the
     * stream kernel's two splits reduce in a cluster; the global split-K path elsewhere) */
    void *ws = NULL;
    size_t wsb = comet_cuda_gemm_w4ax_workspace_bytes(&a);
    if (wsb) {
        CUDA_OK(cudaMalloc(&ws, wsb));
        CUDA_OK(cudaMemset(ws, 0, wsb));
    }
    a.workspace = ws, a.workspace_bytes = wsb;
    ARG_OK(comet_cuda_gemm_w4ax(&a, NULL) == COMET_OK);
    a.kernel = COMET_W4AX_KERNEL_COUNT; /* no such kernel */
    ARG_OK(comet_cuda_gemm_w4ax(&a, NULL) == COMET_ERR_INVALID_ARG);
    ARG_OK(comet_cuda_gemm_w4ax_workspace_bytes(&a) == 0);
    ARG_OK(strcmp(comet_cuda_gemm_w4ax_plan_name(&a), "invalid") == 0);
    a.kernel = COMET_W4AX_KERNEL_AUTO, a.pdl = 2; /* pdl is 0 or 1 */
    ARG_OK(comet_cuda_gemm_w4ax(&a, NULL) == COMET_ERR_INVALID_ARG);
    a.pdl = 1;
    ARG_OK(comet_cuda_gemm_w4ax(&a, NULL) == COMET_OK);
    a.pdl = 0;
    ARG_OK(comet_cuda_gemm_w4ax(&a, NULL) == COMET_OK);
    a.pipe_tiles = 5; /* 0 (automatic) or 1-4 */
    ARG_OK(comet_cuda_gemm_w4ax(&a, NULL) == COMET_ERR_INVALID_ARG);
    a.pipe_tiles = -1;
    ARG_OK(comet_cuda_gemm_w4ax(&a, NULL) == COMET_ERR_INVALID_ARG);
    a.pipe_tiles = 0;
    /* output parts (y_parts): 2 or 3, tiling 0 .. N at multiples of 4, 16-byte aligned, not
     * all NULL, no fp16 output beside them */
    comet_cuda_w4ax_gemm sp = a;
    float *p0 = (float *)((char *)buf + 20480), *p1 = (float *)((char *)buf + 24576);
    sp.y = NULL, sp.y_parts = 2, sp.y_col0[1] = 8, sp.y_col0[2] = 16;
    sp.y_part[0] = p0, sp.y_part[1] = p1;
    ARG_OK(comet_cuda_gemm_w4ax(&sp, NULL) == COMET_OK);
    sp.y_part[0] = NULL; /* one part dropped */
    ARG_OK(comet_cuda_gemm_w4ax(&sp, NULL) == COMET_OK);
    sp.y_part[1] = NULL; /* every part dropped */
    ARG_OK(comet_cuda_gemm_w4ax(&sp, NULL) == COMET_ERR_INVALID_ARG);
    sp.y_part[0] = p0, sp.y_part[1] = p1 + 1; /* 4-byte aligned */
    ARG_OK(comet_cuda_gemm_w4ax(&sp, NULL) == COMET_ERR_INVALID_ARG);
    sp.y_part[1] = p1, sp.y_col0[1] = 6; /* not a multiple of 4 */
    ARG_OK(comet_cuda_gemm_w4ax(&sp, NULL) == COMET_ERR_INVALID_ARG);
    sp.y_col0[1] = 8, sp.y_col0[2] = 12; /* short of N */
    ARG_OK(comet_cuda_gemm_w4ax(&sp, NULL) == COMET_ERR_INVALID_ARG);
    sp.y_col0[2] = 16, sp.y_parts = 1;
    ARG_OK(comet_cuda_gemm_w4ax(&sp, NULL) == COMET_ERR_INVALID_ARG);
    sp.y_parts = 2, sp.y_f16 = (uint16_t *)p1;
    ARG_OK(comet_cuda_gemm_w4ax(&sp, NULL) == COMET_ERR_INVALID_ARG);
    /* K past COMET_CUDA_W4AX_MAX_K: the kernels' split ranges are int arithmetic */
    comet_cuda_w4ax_gemm k = a;
    k.K = COMET_CUDA_W4AX_MAX_K + 64, k.kernel = COMET_W4AX_KERNEL_AUTO;
    ARG_OK(comet_cuda_gemm_w4ax(&k, NULL) == COMET_ERR_INVALID_ARG);
    ARG_OK(strcmp(comet_cuda_gemm_w4ax_plan_name(&k), "invalid") ==
           0); /* the shape check, not the workspace */
    /* token tiles past the grid's 65535 in y (the stream kernel forced at M = 2^22: 8-row
     * groups of 4) are refused before the launch, naming the limit */
    comet_cuda_w4ax_gemm m = {.M = 1 << 22,
                              .N = 16,
                              .K = 128,
                              .B = 64,
                              .qw = (const uint8_t *)buf,
                              .sw = (const uint16_t *)buf,
                              .qa = (const int8_t *)buf,
                              .sa = (const float *)buf,
                              .y = (float *)buf,
                              .kernel = COMET_W4AX_KERNEL_STREAM};
    ARG_OK(comet_cuda_gemm_w4ax(&m, NULL) == COMET_ERR_INVALID_ARG &&
           strstr(comet_last_error(), "65535"));
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaFree(buf));
    CUDA_OK(cudaFree(ws));
    /* outputs past 2^36: refused by the launch and the pure queries alike, every kernel
     * (their plans count tiles in int) */
    for (int k = COMET_W4AX_KERNEL_AUTO; k < COMET_W4AX_KERNEL_COUNT; k++) {
        comet_cuda_w4ax_gemm h = {
            .M = 1 << 30, .N = 135168, .K = 64, .B = 64, .kernel = (comet_w4ax_kernel)k};
        ARG_OK(comet_cuda_gemm_w4ax(&h, NULL) == COMET_ERR_INVALID_ARG);
        ARG_OK(comet_cuda_gemm_w4ax_workspace_bytes(&h) == 0);
        ARG_OK(strcmp(comet_cuda_gemm_w4ax_plan_name(&h), "invalid") == 0);
    }
    n_check++;
    n_fail += bad;
    printf("%-4s argument checks\n", bad ? "FAIL" : "ok");
}

/* The shape grid: with g_quick a few shapes that reach every kernel path (for
 * compute-sanitizer), else every value of M, N and K. */
static void test_shapes(void) {
    static const int Ms[] = {1, 2, 3, 7, 16, 33, 64, 100, 256, 1000, 4096};
    const int nM = sizeof Ms / sizeof Ms[0];
    int ci = 0;
    if (g_quick) {
        /* {16, 8192, 2112, 64, 4}, through every kernel: the pipe kernel with 2 items per CTA
         * (forced 1 or 3 tiles per item; the automatic plan takes 4, one item per CTA), rings
         * that wrap and a half last stage (K % 128 == 64), so that the sanitizers see those
         * paths */
        const shape q[] = {{1, 136, 576, 64, 3},
                           {7, 8, 1536, 128, 12},
                           {33, 136, 1536, 128, 0},
                           {100, 4096, 576, 64, 9},
                           {256, 136, 4096, 128, 32},
                           {16, 8192, 2112, 64, 4},
                           /* N % 8 == 4 and N odd: the four-output stores and their fallback
                            * (pipe kernel, and the wgmma kernel's 128-token tile without
                            * split-K at K = 64) */
                           {16, 100, 576, 64, 3},
                           {12, 13, 576, 64, 2},
                           {100, 13, 64, 64, 1},
                           /* one 16-row tile, 6 ring positions per warp: the pipe kernel's
                            * ring held to 3 slots, one early position with pdl (plan_pipe) */
                           {16, 8, 6144, 64, 12},
                           /* 140 tiles of 128 tokens, 32 blocks: the automatic plan runs
                            * stream-K (make_plan) */
                           {65, 17920, 2048, 64, 8},
                           /* 256 tiles of 128 tokens, 9 blocks: a persistent plan (make_plan),
                            * the last token tile 104 rows */
                           {1000, 4096, 576, 64, 3}};
        for (size_t i = 0; i < sizeof q / sizeof q[0]; i++)
            test_shape(&q[i], 1);
    } else {
        /* every M against the small N and K values, n8 cycling over 0, 1/4, 1/2, all */
        const int Ns[] = {8, 136}, Ks[] = {64, 576, 1536};
        for (int mi = 0; mi < nM; mi++)
            for (int ni = 0; ni < 2; ni++)
                for (int ki = 0; ki < 3; ki++, ci++) {
                    int K = Ks[ki], B = (K % 128 || ci % 2) ? 64 : 128, nb = K / B;
                    int n8s[] = {0, nb / 4, nb / 2, nb};
                    shape s = {Ms[mi], Ns[ni], K, B, n8s[ci % 4]};
                    test_shape(&s, 0);
                }
        /* the large N and K values (the oracle's cost bounds M here) */
        const shape big[] = {
            {1, 4096, 4096, 128, 4},
            {2, 6144, 4096, 128, 0},
            {3, 4096, 14336, 128, 14},
            {7, 6144, 14336, 64, 56},
            {16, 4096, 14336, 128, 28},
            {33, 6144, 4096, 64, 64},
            {64, 4096, 4096, 128, 8},
            {100, 6144, 1536, 64, 24},
            {256, 4096, 4096, 128, 4},
            {1000, 4096, 1536, 128, 3},
            {4096, 136, 14336, 128, 14},
            {1000, 6144, 576, 64, 9},
            {4096, 4096, 576, 64, 2},
            {16, 8, 14336, 64, 224},
            {4096, 8, 4096, 128, 0},
            /* below one wave, 7 splits in a cluster for the wgmma kernel (forced; S = 4
             * through global partials before the 32-token tiles ran two CTAs per SM); the
             * automatic plan runs the pipe kernel here */
            {24, 4096, 14336, 128, 28},
            /* below one wave with more splits than resident clusters allow: on a 132-SM H200
             * the automatic plan reduces S = 3 splits through global partials (make_plan) */
            {40, 10240, 8192, 128, 8},
            /* 140 tiles of 128 tokens, 32 blocks: stream-K (make_plan) */
            {65, 17920, 2048, 64, 8},
            /* N/16 = 11: the pipe kernel's last item along N holds 2 of 3 or 3 of 4 tiles (and
             * a half last stage at K = 576) */
            {7, 168, 4096, 128, 4},
            {16, 168, 576, 64, 3},
            {33, 168, 1536, 64, 6},
            /* N % 8 == 4 (outputs four at a time, the last four of a row alone) and N odd (one at
             * a time: the pipe kernel's and the split-K cluster's stores, store_out4) */
            {16, 100, 1536, 64, 6},
            {33, 100, 4096, 128, 8},
            {3, 13, 576, 64, 1},
            {16, 13, 1536, 128, 2},
            {33, 13, 4096, 128, 4},
            /* persistent (256 tiles, 9 blocks, 8 token tiles) with a partial last weight tile and
             * N % 8 == 4: the staged epilogue's four-output stores and their fallback */
            {1000, 4100, 576, 64, 3},
            /* one block (no split-K): the wgmma kernel's 128-token tile through shared memory */
            {100, 13, 64, 64, 1},
            {256, 100, 64, 64, 0}};
        for (size_t i = 0; i < sizeof big / sizeof big[0]; i++)
            test_shape(&big[i], 0);
    }
}

COUNTED_TEST(cm_bad_args, test_bad_args())
COUNTED_TEST(cm_shared_workspace, if (no_sm90a) skip(); test_shared_workspace())
COUNTED_TEST(cm_pdl_chain, if (g_quick && !no_sm90a) skip(); test_pdl_chain())
COUNTED_TEST(cm_shapes, test_shapes())

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--load-check")) /* the binary loads and sees a GPU */
        return cudaFree(0) == cudaSuccess ? 0 : 1;
    cuda_test_skip_if_no_device(); /* exit 77 (ctest: skipped) without a usable GPU */
    const char *mode = argc > 1 ? argv[1] : "";
    no_sm90a = !strcmp(mode, "--no-sm90a");
    g_quick = no_sm90a || !strcmp(mode, "--quick");
    if (*mode && !no_sm90a && !g_quick && strcmp(mode, "--pdl")) {
        fprintf(stderr,
                "usage: test_gemm_w4ax_cuda [--quick | --no-sm90a | --pdl | --load-check]\n");
        return 2;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(cm_bad_args),
        /* its two plans are the wgmma kernel's global split-K and stream-K */
        cmocka_unit_test(cm_shared_workspace),
        /* a 58 MB GEMM heads each chain: kept out of the sanitizer runs */
        cmocka_unit_test(cm_pdl_chain),
        cmocka_unit_test(cm_shapes),
    };
    if (!strcmp(mode, "--pdl")) /* the chained calls alone */
        cmocka_set_test_filter("cm_pdl_chain");
    else if (getenv("COMET_TEST_FILTER")) /* one test by name */
        cmocka_set_test_filter(getenv("COMET_TEST_FILTER"));
    const int rc = cmocka_run_group_tests(tests, NULL, NULL);
    printf("%d of %d checks failed\n", n_fail, n_check);
    return rc ? 1 : 0;
}
