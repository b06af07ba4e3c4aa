/* bench_gemm.cu — W4Ax GEMM vs cuBLAS FP16 (cublasGemmEx, fp32 accumulate, fp16 out) and
 * cuBLASLt INT8 (int32 accumulate and out) in one process, on LLaMA-3-8B, LLaMA-3-70B and
 * LLaMA-2-7B linear shapes, M from 1 to 8192, INT8 block fraction 0 / 12.5 / 25 %.
 *
 * C[M, N] = X[M, K] · W[N, K]^T for every method. Timing: CUDA events around each call,
 * 5 warm-up calls, median of 30 (queued behind a 3 ms spin kernel so that host launch gaps
 * stay out of the events); weights and activations rotate through several copies of
 * random data so that each call reads at least 256 MB of distinct inputs (> the 60 MB L2).
 * Ours writes fp16 output (as the FP16 baseline does).
 *
 * --graph times each method as an engine replays a decode step instead: 20 calls (rotating
 * inputs as above) captured in one CUDA graph, per-call time = replay time / 20, median of 15
 * replays queued behind the spin kernel. No events sit between the calls, so the per-call
 * launch and event overhead of the default method (~3.5 us, bench/gemm/floor.cu) is replaced
 * by what back-to-back graph nodes cost. Same inputs, same baselines, same process.
 *
 * --pdl launches our calls with programmatic dependent launch (comet_cuda_w4ax_gemm.pdl):
 * inside a graph (--graph --pdl) each call's first weight loads then overlap the previous
 * call's end, as in an engine whose kernels all allow it; the cuBLAS baselines launch as
 * cuBLAS does. With events around each call (no --graph) there is nothing to overlap.
 *
 * --chain times a model's four linear layers in turn (qkv, o, gate_up, down; LLaMA-3-8B and
 * -70B, 12.5 % INT8), as a decode step runs them: 20 calls, five layers' worth, in one CUDA graph
 * (with --pdl ours chained by programmatic dependent launch), each call on its own rotated
 * inputs; the time per layer (four calls) against the same chain of cuBLAS FP16 calls. Unlike
 * --graph, each call follows a different shape, so what one kernel leaves on the SMs (registers,
 * shared memory, its carveout) meets the next one's plan.
 *
 * Usage: bench_gemm [--quick] [--graph] [--pdl] [--chain] [--out results.md] [--ms 1,16]
 *        [--fracs 0.125] [--shapes 8] [--kernel K] [--splits S] [--tok T] [--pipe-tiles PT]
 *        [--one M N K kernel]
 * Prints one row per (shape, M, fraction), then the summary; --out also writes the markdown
 * table (with GPU, date) to the given file. */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "backend/cuda/gemm_w4ax.h"

#include "harness.cuh"

static const double BW = 4.3e12, PEAK = 1.94e15; /* docs/hopper.md ceilings */
static const size_t ROT = 256ull << 20;          /* bytes of distinct inputs per rotation */

__global__ void fill_half(__half *p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = __float2half((float)(hash32(i, seed) % 2001) * 1e-3f - 1.0f);
}
__global__ void fill_scale_f16(uint16_t *p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = __half_as_ushort(__float2half((float)(hash32(i, seed) % 1000 + 1) * 1e-5f));
}
__global__ void fill_scale_f32(float *p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = (float)(hash32(i, seed) % 1000 + 1) * 1e-4f;
}
/* Activation codes [rows, K]: INT8 range in blocks < n8, INT4 range after. */
__global__ void fill_codes(int8_t *p, size_t n, int K, int B, int n8, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = hash32(i, seed);
        p[i] = (int)(i % K) / B < n8 ? (int8_t)(h & 0xFF) : (int8_t)((int)(h % 16) - 8);
    }
}

static void *dmalloc(size_t b) {
    void *p;
    CK(cudaMalloc(&p, b));
    return p;
}

struct ctx_t {
    int M, N, K, B, n8;
    int nsw, nsx; /* weight sets, activation sets */
    size_t wstride, xstride, swstride, sastride;
    cublasHandle_t blas;
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t ltdesc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
    bool algo_ok;
    void *ltws;
    size_t ltws_bytes;
    __half *w16, *x16, *c16;
    int8_t *w8, *x8;
    int32_t *c32;
    uint8_t *qw;
    uint16_t *sw, *y16;
    int8_t *qa;
    float *sa;
    void *ws;
    size_t ws_bytes;
};

static cudaStream_t g_stream = 0; /* --graph: a stream that can be captured; else legacy 0 */

static void run_fp16(void *p, int set) {
    ctx_t *c = (ctx_t *)p;
    float one = 1.0f, zero = 0.0f;
    CKB(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, c->N, c->M, c->K, &one,
                     c->w16 + (set % c->nsw) * c->wstride, CUDA_R_16F, c->K,
                     c->x16 + (set % c->nsx) * c->xstride, CUDA_R_16F, c->K, &zero, c->c16,
                     CUDA_R_16F, c->N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

static void run_int8(void *p, int set) {
    ctx_t *c = (ctx_t *)p;
    int32_t one = 1, zero = 0;
    CKB(cublasLtMatmul(c->lt, c->ltdesc, &one, c->w8 + (set % c->nsw) * c->wstride, c->la,
                       c->x8 + (set % c->nsx) * c->xstride, c->lb, &zero, c->c32, c->lc, c->c32,
                       c->lc, &c->algo, c->ltws, c->ltws_bytes, g_stream));
}

static comet_w4ax_kernel g_kernel = COMET_W4AX_KERNEL_AUTO; /* --kernel: force one */
static int g_splits = 0;                                    /* --splits: force the split-K count */
static int g_tok = 0; /* --tok: force the wgmma kernel's token tile (32, 64 or 128) */
static int g_pt = 0;  /* --pipe-tiles: force the pipe kernel's weight tiles per item (1-4) */
static int g_pdl = 0; /* --pdl: programmatic dependent launch for our calls */

/* our call's shape and the command line's plan options, no buffers (the plan, its name and its
 * workspace depend on exactly these) */
static comet_cuda_w4ax_gemm ours_call(const ctx_t *c) {
    comet_cuda_w4ax_gemm g = {};
    g.M = c->M, g.N = c->N, g.K = c->K, g.B = c->B, g.n8 = c->n8, g.kernel = g_kernel,
    g.splits = g_splits;
    g.tile_tokens = g_tok, g.pipe_tiles = g_pt, g.pdl = g_pdl;
    return g;
}

/* c's workspace grown (and zeroed) to what our call g needs */
static void ensure_ws(ctx_t &c, const comet_cuda_w4ax_gemm &g) {
    const size_t need = comet_cuda_gemm_w4ax_workspace_bytes(&g);
    if (need > c.ws_bytes) {
        cudaFree(c.ws);
        c.ws = dmalloc(need);
        c.ws_bytes = need;
    }
    if (c.ws)
        CK(cudaMemset(c.ws, 0, c.ws_bytes));
}

static void run_ours(void *p, int set) {
    ctx_t *c = (ctx_t *)p;
    comet_cuda_w4ax_gemm g = ours_call(c);
    g.qw = c->qw + (set % c->nsw) * c->wstride;
    g.sw = c->sw + (set % c->nsw) * c->swstride;
    g.qa = c->qa + (set % c->nsx) * c->xstride;
    g.sa = c->sa + (set % c->nsx) * c->sastride;
    g.y_f16 = c->y16;
    g.workspace = c->ws, g.workspace_bytes = c->ws_bytes;
    if (comet_cuda_gemm_w4ax(&g, g_stream) != COMET_OK) {
        fprintf(stderr, "ours failed: %s\n", comet_last_error());
        exit(2);
    }
}

struct shape_t {
    const char *model, *layer;
    int N, K;
};

struct row_t {
    shape_t s;
    int M;
    double frac, us, fp16_us, int8_us, bytes, ops;
    std::string plan;
};

static int sets_for(size_t bytes) {
    return (int)std::min<size_t>(64, std::max<size_t>(2, (ROT + bytes - 1) / bytes));
}

/* --chain (see the top): per M, the time of one layer's four calls of each model, ours and
 * cuBLAS FP16, as a markdown table on stdout */
static void chain_bench(const shape_t *shapes, const std::vector<int> &Ms, cublasHandle_t blas) {
    const int B = 128;
    printf("| model | M | ours µs per layer | cuBLAS FP16 µs per layer | × FP16 | plans "
           "|\n|---|---|---|---|---|---|\n");
    for (int model = 0; model < 2; model++) {
        ctx_t cs[4] = {};
        int ns4[4], ns16[4];
        size_t w4s[4];
        const int Mmax = Ms.back();
        for (int l = 0; l < 4; l++) {
            ctx_t &c = cs[l];
            const shape_t &s = shapes[4 * model + l];
            c.N = s.N, c.K = s.K, c.B = B, c.n8 = (int)std::lround(0.125 * (s.K / B)),
            c.blas = blas;
            const size_t w16b = (size_t)c.N * c.K * 2,
                         w4b = comet_cuda_w4ax_packed_qw_bytes(c.N, c.K);
            const size_t swb = comet_cuda_w4ax_packed_sw_bytes(c.N, c.K, B);
            ns16[l] = sets_for(w16b), ns4[l] = sets_for(w4b + swb);
            c.w16 = (__half *)dmalloc(w16b * ns16[l]);
            c.qw = (uint8_t *)dmalloc(w4b * ns4[l]);
            c.sw = (uint16_t *)dmalloc(swb * ns4[l]);
            w4s[l] = w4b, c.swstride = swb / 2;
            fill_half<<<1024, 256>>>(c.w16, w16b / 2 * ns16[l], 11 + l);
            fill_bytes<<<1024, 256>>>(c.qw, w4b * ns4[l], 21 + l);
            fill_scale_f16<<<1024, 256>>>(c.sw, swb / 2 * ns4[l], 31 + l);
            c.nsx = 8; /* activations: 8 rotated sets of the largest M */
            c.x16 = (__half *)dmalloc((size_t)c.nsx * Mmax * c.K * 2);
            c.qa = (int8_t *)dmalloc((size_t)c.nsx * Mmax * c.K);
            c.sa = (float *)dmalloc((size_t)c.nsx * Mmax * (c.K / B) * 4);
            fill_half<<<1024, 256>>>(c.x16, (size_t)c.nsx * Mmax * c.K, 41 + l);
            fill_codes<<<1024, 256>>>(c.qa, (size_t)c.nsx * Mmax * c.K, c.K, B, c.n8, 51 + l);
            fill_scale_f32<<<1024, 256>>>(c.sa, (size_t)c.nsx * Mmax * (c.K / B), 61 + l);
            c.c16 = (__half *)dmalloc((size_t)Mmax * c.N * 2);
            c.y16 = (uint16_t *)dmalloc((size_t)Mmax * c.N * 2);
        }
        for (int M : Ms) {
            std::string plans;
            for (int l = 0; l < 4; l++) {
                ctx_t &c = cs[l];
                c.M = M, c.xstride = (size_t)M * c.K, c.sastride = (size_t)M * (c.K / B);
                const comet_cuda_w4ax_gemm g = ours_call(&c);
                ensure_ws(c, g);
                plans += std::string(l ? "; " : "") + comet_cuda_gemm_w4ax_plan_name(&g);
            }
            CK(cudaDeviceSynchronize());
            /* call index i: layer i % 4, its weight set (i / 4) % its sets (count and stride
             * differ between the packed and the fp16 weights) */
            auto ours_layer = [&](int i) {
                ctx_t &c = cs[i % 4];
                c.nsw = ns4[i % 4], c.wstride = w4s[i % 4];
                run_ours(&c, i / 4);
            };
            auto fp16_layer = [&](int i) {
                ctx_t &c = cs[i % 4];
                c.nsw = ns16[i % 4], c.wstride = (size_t)c.N * c.K;
                run_fp16(&c, i / 4);
            };
            const double ours = 4 * time_graph_us(ours_layer, 4 * 64, g_stream);
            const double fp16 = 4 * time_graph_us(fp16_layer, 4 * 64, g_stream);
            printf("| LLaMA-3-%s | %d | %.2f | %.2f | %.2f | %s |\n", model ? "70B" : "8B", M, ours,
                   fp16, fp16 / ours, plans.c_str());
            fflush(stdout);
        }
        for (ctx_t &c : cs) {
            cudaFree(c.w16), cudaFree(c.qw), cudaFree(c.sw), cudaFree(c.x16), cudaFree(c.qa),
                cudaFree(c.sa);
            cudaFree(c.c16), cudaFree(c.y16), cudaFree(c.ws);
        }
    }
}

int main(int argc, char **argv) {
    bool quick = false, graph = false, chain = false;
    const char *out = NULL;
    int one_m = 0, one_n = 0, one_k = 0, one_kernel = 0, n_shapes_arg = 0;
    const char *ms_arg = NULL, *fr_arg = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick"))
            quick = true;
        else if (!strcmp(argv[i], "--graph")) /* per-call time inside CUDA graphs */
            graph = true;
        else if (!strcmp(argv[i], "--pdl")) /* our calls with programmatic dependent launch */
            g_pdl = 1;
        else if (!strcmp(argv[i], "--chain")) /* a model's four layers in turn, in CUDA graphs */
            chain = graph = true;
        else if (!strcmp(argv[i], "--one") && i + 4 < argc) /* --one M N K kernel: profiling */
            one_m = atoi(argv[i + 1]), one_n = atoi(argv[i + 2]), one_k = atoi(argv[i + 3]),
            one_kernel = atoi(argv[i + 4]), i += 4;
        else if (!strcmp(argv[i], "--out") && i + 1 < argc)
            out = argv[++i];
        else if (!strcmp(argv[i], "--ms") && i + 1 < argc) /* --ms 1,16,256: only these M */
            ms_arg = argv[++i];
        else if (!strcmp(argv[i], "--fracs") && i + 1 < argc) /* --fracs 0.125: INT8 fractions */
            fr_arg = argv[++i];
        else if (!strcmp(argv[i], "--kernel") && i + 1 < argc) /* --kernel 4: force a kernel */
            g_kernel = (comet_w4ax_kernel)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--splits") && i + 1 < argc) /* --splits S: force split-K */
            g_splits = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tok") && i + 1 < argc) /* --tok 32|64|128: wgmma token tile */
            g_tok = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--pipe-tiles") &&
                 i + 1 < argc) /* --pipe-tiles 1-4: pipe kernel */
            g_pt = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--shapes") && i + 1 < argc) /* --shapes 8: first 8 shapes */
            n_shapes_arg = atoi(argv[++i]);
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    const shape_t shapes[] = {
        {"LLaMA-3-8B", "qkv", 6144, 4096},       {"LLaMA-3-8B", "o", 4096, 4096},
        {"LLaMA-3-8B", "gate_up", 28672, 4096},  {"LLaMA-3-8B", "down", 4096, 14336},
        {"LLaMA-3-70B", "qkv", 10240, 8192},     {"LLaMA-3-70B", "o", 8192, 8192},
        {"LLaMA-3-70B", "gate_up", 57344, 8192}, {"LLaMA-3-70B", "down", 8192, 28672},
        {"LLaMA-2-7B", "qkv", 12288, 4096},      {"LLaMA-2-7B", "o", 4096, 4096},
        {"LLaMA-2-7B", "gate_up", 22016, 4096},  {"LLaMA-2-7B", "down", 4096, 11008}};
    if (one_m) { /* a few calls of one configuration, for ncu */
        comet_cuda_w4ax_gemm g = {};
        g.M = one_m, g.N = one_n, g.K = one_k, g.B = 128, g.n8 = one_k / 128 / 8;
        g.kernel = (comet_w4ax_kernel)one_kernel;
        g.qw = (uint8_t *)dmalloc(comet_cuda_w4ax_packed_qw_bytes(one_n, one_k));
        g.sw = (uint16_t *)dmalloc(comet_cuda_w4ax_packed_sw_bytes(one_n, one_k, 128));
        g.qa = (int8_t *)dmalloc((size_t)one_m * one_k);
        g.sa = (float *)dmalloc((size_t)one_m * one_k / 128 * 4);
        g.y_f16 = (uint16_t *)dmalloc((size_t)one_m * one_n * 2);
        fill_bytes<<<1024, 256>>>((uint8_t *)g.qw, comet_cuda_w4ax_packed_qw_bytes(one_n, one_k),
                                  1);
        fill_scale_f16<<<1024, 256>>>((uint16_t *)g.sw,
                                      comet_cuda_w4ax_packed_sw_bytes(one_n, one_k, 128) / 2, 2);
        fill_codes<<<1024, 256>>>((int8_t *)g.qa, (size_t)one_m * one_k, one_k, 128, g.n8, 3);
        fill_scale_f32<<<1024, 256>>>((float *)g.sa, (size_t)one_m * one_k / 128, 4);
        g.workspace_bytes = comet_cuda_gemm_w4ax_workspace_bytes(&g);
        if (g.workspace_bytes) {
            g.workspace = dmalloc(g.workspace_bytes);
            CK(cudaMemset(g.workspace, 0, g.workspace_bytes));
        }
        for (int i = 0; i < 3; i++)
            if (comet_cuda_gemm_w4ax(&g, NULL) != COMET_OK)
                return 2;
        CK(cudaDeviceSynchronize());
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        std::vector<float> ts;
        for (int i = 0; i < 21; i++) {
            CK(cudaEventRecord(e0, 0));
            comet_cuda_gemm_w4ax(&g, NULL);
            CK(cudaEventRecord(e1, 0));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            ts.push_back(ms);
        }
        std::sort(ts.begin(), ts.end());
        printf("one: M=%d N=%d K=%d %-32s %9.2f us %7.1f TOPS\n", one_m, one_n, one_k,
               comet_cuda_gemm_w4ax_plan_name(&g), ts[10] * 1e3,
               2.0 * one_m * one_n * one_k / (ts[10] * 1e9));
        return 0;
    }
    std::vector<int> Ms = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192};
    if (quick)
        Ms = {1, 16, 64, 256, 2048};
    if (ms_arg) {
        Ms.clear();
        for (const char *q = ms_arg; *q; q += strcspn(q, ","), q += *q == ',')
            Ms.push_back(atoi(q));
        std::sort(Ms.begin(), Ms.end());
    }
    std::vector<double> fracs = {0.0, 0.125, 0.25};
    if (fr_arg) {
        fracs.clear();
        for (const char *q = fr_arg; *q; q += strcspn(q, ","), q += *q == ',')
            fracs.push_back(atof(q));
    }
    const int B = 128;
    std::vector<row_t> rows;

    ctx_t c = {};
    CKB(cublasCreate(&c.blas));
    CKB(cublasLtCreate(&c.lt));
    c.ltws_bytes = 32 << 20;
    c.ltws = dmalloc(c.ltws_bytes);
    if (graph) { /* before the workspace: cublasSetStream resets it to the default pool */
        CK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
        CKB(cublasSetStream(c.blas, g_stream));
    }
    CKB(cublasSetWorkspace(c.blas, dmalloc(32 << 20), 32 << 20));
    if (chain) {
        chain_bench(shapes, Ms, c.blas);
        return 0;
    }
    /* the timing method of every row */
    auto timed = [&](auto &&call, int nsets) {
        return graph ? time_graph_us(call, nsets, g_stream) : time_us(call, nsets);
    };
    printf("%-12s %-8s %6s %6s %5s %5s %10s %8s %8s %10s %10s %7s %7s %6s  %s\n", "model", "layer",
           "N", "K", "M", "int8%", "ours_us", "TOPS", "GB/s", "fp16_us", "int8_us", "x_fp16",
           "x_int8", "roofl", "plan");
    int shape_i = 0;
    for (const shape_t &s : shapes) {
        if (n_shapes_arg > 0 && shape_i++ >= n_shapes_arg)
            break;
        const int N = s.N, K = s.K, nb = K / B, Mmax = Ms.back();
        c.N = N, c.K = K, c.B = B;
        /* weights: fp16, int8, packed int4 (random bytes are random codes in any layout) */
        size_t w16b = (size_t)N * K * 2, w8b = (size_t)N * K,
               w4b = comet_cuda_w4ax_packed_qw_bytes(N, K);
        size_t swb = comet_cuda_w4ax_packed_sw_bytes(N, K, B);
        int ns16 = sets_for(w16b), ns8 = sets_for(w8b), ns4 = sets_for(w4b + swb);
        c.w16 = (__half *)dmalloc(w16b * ns16);
        c.w8 = (int8_t *)dmalloc(w8b * ns8);
        c.qw = (uint8_t *)dmalloc(w4b * ns4);
        c.sw = (uint16_t *)dmalloc(swb * ns4);
        fill_half<<<1024, 256>>>(c.w16, (size_t)N * K * ns16, 1);
        fill_bytes<<<1024, 256>>>((uint8_t *)c.w8, w8b * ns8, 2);
        fill_bytes<<<1024, 256>>>(c.qw, w4b * ns4, 3);
        fill_scale_f16<<<1024, 256>>>(c.sw, swb / 2 * ns4, 4);
        /* activation pools */
        size_t xpool = std::max(ROT, (size_t)2 * Mmax * K * 2);
        c.x16 = (__half *)dmalloc(xpool);
        c.x8 = (int8_t *)dmalloc(xpool / 2);
        c.qa = (int8_t *)dmalloc(xpool / 2);
        size_t sapool = xpool / 2 / B * 4;
        c.sa = (float *)dmalloc(sapool);
        fill_half<<<1024, 256>>>(c.x16, xpool / 2, 5);
        fill_bytes<<<1024, 256>>>((uint8_t *)c.x8, xpool / 2, 6);
        fill_scale_f32<<<1024, 256>>>(c.sa, sapool / 4, 7);
        c.c16 = (__half *)dmalloc((size_t)Mmax * N * 2);
        c.c32 = (int32_t *)dmalloc((size_t)Mmax * N * 4);
        c.y16 = (uint16_t *)dmalloc((size_t)Mmax * N * 2);
        CK(cudaDeviceSynchronize());
        for (int M : Ms) {
            c.M = M;
            /* cuBLASLt INT8 descriptors: C^T[N, M] = W[K, N]^T (col-major) · X^T[K, M] */
            cublasOperation_t tA = CUBLAS_OP_T, tB = CUBLAS_OP_N;
            CKB(cublasLtMatmulDescCreate(&c.ltdesc, CUBLAS_COMPUTE_32I, CUDA_R_32I));
            CKB(cublasLtMatmulDescSetAttribute(c.ltdesc, CUBLASLT_MATMUL_DESC_TRANSA, &tA,
                                               sizeof tA));
            CKB(cublasLtMatmulDescSetAttribute(c.ltdesc, CUBLASLT_MATMUL_DESC_TRANSB, &tB,
                                               sizeof tB));
            CKB(cublasLtMatrixLayoutCreate(&c.la, CUDA_R_8I, K, N, K));
            CKB(cublasLtMatrixLayoutCreate(&c.lb, CUDA_R_8I, K, M, K));
            CKB(cublasLtMatrixLayoutCreate(&c.lc, CUDA_R_32I, N, M, N));
            cublasLtMatmulPreference_t pref;
            CKB(cublasLtMatmulPreferenceCreate(&pref));
            CKB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                     &c.ltws_bytes, sizeof c.ltws_bytes));
            cublasLtMatmulHeuristicResult_t heur;
            int nres = 0;
            cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(c.lt, c.ltdesc, c.la, c.lb, c.lc,
                                                               c.lc, pref, 1, &heur, &nres);
            c.algo_ok = hs == CUBLAS_STATUS_SUCCESS && nres > 0;
            if (c.algo_ok)
                c.algo = heur.algo;
            cublasLtMatmulPreferenceDestroy(pref);

            c.wstride = (size_t)N * K;
            c.xstride = (size_t)M * K;
            c.nsx = (int)std::min<size_t>(64, std::max<size_t>(1, xpool / 2 / c.xstride));
            c.nsw = ns16;
            double t16 = timed([&](int set) { run_fp16(&c, set); }, 64);
            c.nsw = ns8;
            double t8 = c.algo_ok ? timed([&](int set) { run_int8(&c, set); }, 64) : NAN;
            for (double fr : fracs) {
                c.n8 = (int)std::lround(fr * nb);
                fill_codes<<<1024, 256>>>(c.qa, xpool / 2, K, B, c.n8, 8);
                c.wstride = w4b, c.swstride = swb / 2, c.nsw = ns4;
                c.sastride = (size_t)M * nb;
                const comet_cuda_w4ax_gemm g = ours_call(&c);
                ensure_ws(c, g);
                double t4 = timed([&](int set) { run_ours(&c, set); }, 64);
                row_t r;
                r.s = s, r.M = M, r.frac = fr, r.us = t4, r.fp16_us = t16, r.int8_us = t8;
                r.ops = 2.0 * M * N * K;
                r.bytes = (double)N * K / 2 + (double)N * nb * 2 + (double)M * K +
                          (double)M * nb * 4 + (double)M * N * 2;
                r.plan = comet_cuda_gemm_w4ax_plan_name(&g);
                double roof = std::max(r.bytes / BW, r.ops / PEAK) * 1e6;
                printf("%-12s %-8s %6d %6d %5d %5.1f %10.2f %8.1f %8.0f %10.2f %10.2f %7.2f %7.2f "
                       "%6.2f  %s\n",
                       s.model, s.layer, N, K, M, fr * 100, t4, r.ops / t4 * 1e-6,
                       r.bytes / t4 * 1e-3, t16, t8, t16 / t4, t8 / t4, roof / t4, r.plan.c_str());
                fflush(stdout);
                rows.push_back(r);
            }
            cublasLtMatrixLayoutDestroy(c.la), cublasLtMatrixLayoutDestroy(c.lb),
                cublasLtMatrixLayoutDestroy(c.lc);
            cublasLtMatmulDescDestroy(c.ltdesc);
        }
        cudaFree(c.w16), cudaFree(c.w8), cudaFree(c.qw), cudaFree(c.sw), cudaFree(c.x16),
            cudaFree(c.x8);
        cudaFree(c.qa), cudaFree(c.sa), cudaFree(c.c16), cudaFree(c.c32), cudaFree(c.y16);
    }

    /* summary: geomean over the 8 LLaMA-3 shapes at 12.5 % INT8, per M */
    std::string sum;
    char line[256];
    snprintf(line, sizeof line,
             "\nSummary: geomean over the 8 LLaMA-3 shapes, 12.5%% INT8 blocks\n\n"
             "| M | x cuBLAS FP16 | x cuBLASLt INT8 | min x FP16 (shape) |\n|---|---|---|---|\n");
    sum += line;
    double worst_all = 1e9;
    for (int M : Ms) {
        double l16 = 0, l8 = 0, mn = 1e9;
        int n = 0;
        std::string mn_name;
        for (const row_t &r : rows) {
            if (r.M != M || r.frac != 0.125 || strncmp(r.s.model, "LLaMA-3", 7))
                continue;
            l16 += std::log(r.fp16_us / r.us), l8 += std::log(r.int8_us / r.us), n++;
            if (r.fp16_us / r.us < mn)
                mn = r.fp16_us / r.us, mn_name = std::string(r.s.model) + " " + r.s.layer;
        }
        for (const row_t &r : rows)
            if (r.M == M)
                worst_all = std::min(worst_all, r.fp16_us / r.us);
        snprintf(line, sizeof line, "| %d | %.2f | %.2f | %.2f (%s) |\n", M, std::exp(l16 / n),
                 std::exp(l8 / n), mn, mn_name.c_str());
        sum += line;
    }
    snprintf(line, sizeof line,
             "\nLowest ratio vs cuBLAS FP16 over every shape, M and fraction: %.2f\n", worst_all);
    sum += line;
    printf("%s", sum.c_str());

    if (out) {
        FILE *f = fopen(out, "w");
        if (!f) {
            fprintf(stderr, "cannot write %s\n", out);
            return 2;
        }
        time_t now = time(NULL);
        char date[32];
        strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", gmtime(&now));
        fprintf(
            f, "GPU: %s (%d SMs, L2 %d MB), date %s, timing: %s\n%s\n\n", prop.name,
            prop.multiProcessorCount, prop.l2CacheSize >> 20, date,
            graph
                ? (g_pdl ? "per call inside CUDA graphs of 20 calls, ours with programmatic "
                           "dependent launch (--graph --pdl)"
                         : "per call inside CUDA graphs of 20 calls (--graph)")
                : (g_pdl ? "CUDA events around each call, ours with pdl (--pdl; nothing to overlap)"
                         : "CUDA events around each call"),
            sum.c_str());
        fprintf(f,
                "| model | layer | N | K | M | INT8 %% | ours µs | TOPS | GB/s | cuBLAS FP16 µs | "
                "cuBLASLt INT8 µs | × FP16 | × INT8 | roofline frac | plan |\n"
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
        for (const row_t &r : rows) {
            double roof = std::max(r.bytes / BW, r.ops / PEAK) * 1e6;
            fprintf(f,
                    "| %s | %s | %d | %d | %d | %.1f | %.2f | %.1f | %.0f | %.2f | %.2f | %.2f | "
                    "%.2f | %.2f | %s |\n",
                    r.s.model, r.s.layer, r.s.N, r.s.K, r.M, r.frac * 100, r.us,
                    r.ops / r.us * 1e-6, r.bytes / r.us * 1e-3, r.fp16_us, r.int8_us,
                    r.fp16_us / r.us, r.int8_us / r.us, roof / r.us, r.plan.c_str());
        }
        fclose(f);
    }
    return 0;
}
