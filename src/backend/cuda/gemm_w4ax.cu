/* gemm_w4ax.cu — CUDA W4Ax GEMM for sm_80+ (tuned on the H200, sm_90a).
 *
 * INT4 weights are a storage format here: nibbles expand to INT8 in registers with the x16
 * trick (low nibble << 4, high nibble in place, masked by 0xF0F0F0F0: 16*w per byte, sign
 * for free) and meet the int8 activation codes on the INT8 tensor cores
 * (mma.sync.m16n8k32.s8). Products are 16x the true ones; every int32 block sum is a
 * multiple of 16, so S = acc >> 4 and float(acc) * 0.0625f == float(S), both exact; the
 * kernels fold the 1/16 into the weight scale (sw / 16 is exact, and sa * (sw / 16) is
 * sa * sw rounded, then / 16: the same product wherever |sa * sw| >= 2^-122, i.e. for any
 * real scales -- below, the /16 lands in fp32 subnormals and may round differently; one
 * instruction per block instead of per output). The
 * weights are the 16-row side of the MMA and tokens the 8-column side, which suits small M.
 *
 * Four kernels, chosen by M, N, K and the device at run time (make_plan()):
 *  - stream (M <= 8 on sm_90 where the pipe plan does not apply: below one tile per SM,
 *    caller-forced splits; M <= 32 on sm_80): each warp owns 16 weight rows and
 *    streams their packed codes from global memory straight into registers (16-byte loads, 4
 *    k64 chunks ahead of use); the CTA's tokens for its K range sit in shared memory. K is
 *    split across CTAs so all SMs stream.
 *  - pipe (M <= 16 on sm_90 with N/16 at least the SM count, M <= 32 up to 2x): persistent
 *    CTAs own items of 1-4 whole 16-row weight tiles over all of K (no split-K), which
 *    share one copy of the token rows; each warp streams its share of K through its own
 *    cp.async ring in shared memory. Token rows are copied through L1 (.ca), shared by the
 *    SM's CTAs.
 *  - wgmma (M > 8 on sm_90a where the pipe plan does not apply): warp-specialized; a
 *    producer warp fills a ring of stages with TMA (tokens, swizzled) and bulk copies
 *    (weights) on mbarriers, two consumer warpgroups own 64 weight rows each of a 128 x TOK
 *    tile (TOK = 16 / 32 / 64 / 128 tokens for M <= 16 with K >= 8192 / M <= 32 / M <= 64 /
 *    larger; three CTAs per SM at 16, two at 32 and 64; stream-K at 128 where the split plans
 *    leave SMs idle), weights as the register A operand of wgmma.m64nTOKk32.s8, tokens as B
 *    from shared memory.
 *  - tiled (M > 32 elsewhere, sm_80): 128x128 CTA tile, 8 warps of 64x32, a 4-stage cp.async
 *    pipeline of 64-deep K slices, activations read with ldmatrix.
 * Files: one kernel each in gemm_w4ax_{stream,pipe,tiled,wgmma}.cuh, their shared
 * device code in gemm_w4ax_common.cuh, the host plan in gemm_w4ax_plan.cuh, the PTX wrappers
 * in ptx.cuh; this file includes them all (one translation unit), instantiates the kernels
 * and launches them (launch_variant), and holds the C API of gemm_w4ax.h.
 * Measured speeds and what limits each kernel: docs/gemm.md, bench/results/.
 * All accumulate one activation block (B = 64 or 128 channels) in int32, then promote:
 * acc_f += float(S) * (sa[t, b] * sw[n, b]). Split-K partials are summed in split order, so
 * results are deterministic: on sm_90 the splits of a tile form a thread-block cluster and
 * reduce through distributed shared memory (wgmma up to 8 splits unless the plan takes global
 * partials or stream-K, stream for M > 8); otherwise they go to a workspace and the last CTA
 * of each tile (atomic counter, reset by that CTA) sums them.
 */
#include "backend/cuda/gemm_w4ax.h"
#include "backend/cuda/ptx.cuh"

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <mutex>
#include <type_traits>
#include <utility>
#include <stdio.h>
#include <string.h>

/* the kernels and the plan, in this order (each file names what it holds) */
#include "backend/cuda/gemm_w4ax_common.cuh"
#include "backend/cuda/gemm_w4ax_stream.cuh"
#include "backend/cuda/gemm_w4ax_pipe.cuh"
#include "backend/cuda/gemm_w4ax_tiled.cuh"
#include "backend/cuda/gemm_w4ax_wgmma.cuh"
#include "backend/cuda/gemm_w4ax_plan.cuh"

namespace {

/* f(KPB, TOK) with the wgmma kernel's compile-time parameters -- kpb = B / 64 in {1, 2}, the
 * token tile in {16, 32, 64, 128} -- as std::integral_constant values: the one place where the
 * run-time values select template instances. */
template <typename F>
auto with_ws_config(int kpb, int tok, F &&f) {
    using k1 = std::integral_constant<int, 1>;
    using k2 = std::integral_constant<int, 2>;
    using t16 = std::integral_constant<int, 16>;
    using t32 = std::integral_constant<int, 32>;
    using t64 = std::integral_constant<int, 64>;
    using t128 = std::integral_constant<int, 128>;
    if (kpb == 1)
        return tok == 16   ? f(k1{}, t16{})
               : tok == 32 ? f(k1{}, t32{})
               : tok == 64 ? f(k1{}, t64{})
                           : f(k1{}, t128{});
    return tok == 16   ? f(k2{}, t16{})
           : tok == 32 ? f(k2{}, t32{})
           : tok == 64 ? f(k2{}, t64{})
                       : f(k2{}, t128{});
}

/* f(MI, KPB) for the pipe kernel's instances: MI (token groups of 8) and kpb =
 * B / 64, each 1 or 2, as std::integral_constant values. */
template <typename F>
auto with_mi_kpb(int mi, int kpb, F &&f) {
    using one = std::integral_constant<int, 1>;
    using two = std::integral_constant<int, 2>;
    if (mi == 1)
        return kpb == 1 ? f(one{}, one{}) : f(one{}, two{});
    return kpb == 1 ? f(two{}, one{}) : f(two{}, two{});
}

/* Clusters of S CTAs of the wgmma kernel (cluster reduction instance) that can be resident
 * at once on this device; cached. A failed query counts as "enough". */
int ws_cluster_capacity(int kpb, int tok, int S) {
    static std::mutex mu;
    static int cap[MAX_DEV][3][4][WS_MAX_CLUSTER + 1]; /* per device: GPUs differ in SMs and GPCs */
    const int dev = current_device();
    std::lock_guard<std::mutex> lock(mu);
    int uncached = 0;
    int &c = dev >= 0 && dev < MAX_DEV ? cap[dev][kpb][tok == 16   ? 0
                                                       : tok == 32 ? 1
                                                       : tok == 64 ? 2
                                                                   : 3][S]
                                       : uncached;
    if (c == 0) {
        void (*kern)(params, CUtensorMap) = with_ws_config(kpb, tok, [](auto k, auto t) {
            return &w4ax_ws_kernel<decltype(k)::value, decltype(t)::value, false, true>;
        });
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = 1, attr[0].val.clusterDim.y = 1,
        attr[0].val.clusterDim.z = (unsigned)S;
        cfg.gridDim = dim3(1, 1, S), cfg.blockDim = dim3(WS_THREADS),
        cfg.dynamicSmemBytes = ws_smem_bytes(kpb, tok);
        cfg.attrs = attr, cfg.numAttrs = 1;
        int n = 0;
        if (allow_smem((const void *)kern, cfg.dynamicSmemBytes) != cudaSuccess ||
            cudaOccupancyMaxActiveClusters(&n, kern, &cfg) != cudaSuccess || n < 1) {
            cudaGetLastError(); /* clear */
            n = 1 << 30;
        }
        c = n;
    }
    return c;
}

/* Launch `kernel(args...)` with the plan's grid, allowing the shared memory it needs. */
template <typename... KA, typename... A>
cudaError_t launch(void (*kernel)(KA...), const plan_t &pl, cudaStream_t st, A... args) {
    cudaError_t e = allow_smem((const void *)kernel, pl.smem);
    if (e != cudaSuccess)
        return e;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = pl.grid, cfg.blockDim = pl.block, cfg.dynamicSmemBytes = pl.smem, cfg.stream = st;
    cudaLaunchAttribute attr[3];
    unsigned n = 0;
    if (pl.carveout > 0) { /* a hint: the driver rounds up to a carveout the SM has */
        attr[n].id = cudaLaunchAttributePreferredSharedMemoryCarveout;
        attr[n].val.sharedMemCarveout = (unsigned)(pl.carveout < 100 ? pl.carveout : 100);
        n++;
    }
    if (pl.cluster) { /* the S splits of a tile form one cluster (dims 1 x 1 x S) */
        attr[n].id = cudaLaunchAttributeClusterDimension;
        attr[n].val.clusterDim.x = 1, attr[n].val.clusterDim.y = 1,
        attr[n].val.clusterDim.z = (unsigned)pl.S;
        n++;
    }
    if (pl.pdl) { /* may start once every CTA of the previous kernel has begun (pdl_trigger) */
        attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[n].val.programmaticStreamSerializationAllowed = 1;
        n++;
    }
    cfg.attrs = n ? attr : nullptr, cfg.numAttrs = n;
    e = cudaLaunchKernelEx(&cfg, kernel, args...);
    if (e != cudaSuccess && pl.carveout > 0) { /* a driver without the hint: launch without it */
        cudaGetLastError();                    /* clear */
        cfg.attrs = n > 1 ? attr + 1 : nullptr, cfg.numAttrs = n - 1;
        e = cudaLaunchKernelEx(&cfg, kernel, args...);
    }
    return e;
}

/* TMA descriptor of the activation codes qa [M, K] (bytes): boxes of B bytes x tok rows,
 * swizzled as the wgmma descriptor expects, rows past M read as zeros. cuTensorMapEncodeTiled
 * is a host function of the driver, reached through the runtime (no -lcuda). */
comet_status make_tmap_a(const comet_cuda_w4ax_gemm *g, int tok, CUtensorMap *map) {
    static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
    static std::once_flag once;
    std::call_once(once, [] {
        cudaDriverEntryPointQueryResult q;
        void *fn = nullptr;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                             cudaEnableDefault, &q) == cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            encode = (PFN_cuTensorMapEncodeTiled_v12000)fn;
    });
    if (!encode)
        return comet_set_error(COMET_ERR_CUDA,
                               "gemm_w4ax: the driver has no cuTensorMapEncodeTiled");
    cuuint64_t dims[2] = {(cuuint64_t)g->K, (cuuint64_t)g->M}, strides[1] = {(cuuint64_t)g->K};
    cuuint32_t box[2] = {(cuuint32_t)g->B, (cuuint32_t)tok}, estr[2] = {1, 1};
    CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, (void *)g->qa, dims, strides, box,
                        estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                        g->B == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return comet_set_error(COMET_ERR_CUDA,
                               "gemm_w4ax: cuTensorMapEncodeTiled failed (%d) for M=%d K=%d",
                               (int)r, g->M, g->K);
    return COMET_OK;
}

template <int MI, int KPB, bool BSUM>
cudaError_t launch_pipe(const plan_t &pl, const params &p, cudaStream_t st) {
    static_assert(PP_MAX_TILES == 4, "one instance per tile count");
    return pl.pp_tiles == 4   ? launch(w4ax_pipe_kernel<MI, KPB, 4, BSUM>, pl, st, p)
           : pl.pp_tiles == 3 ? launch(w4ax_pipe_kernel<MI, KPB, 3, BSUM>, pl, st, p)
           : pl.pp_tiles == 2 ? launch(w4ax_pipe_kernel<MI, KPB, 2, BSUM>, pl, st, p)
                              : launch(w4ax_pipe_kernel<MI, KPB, 1, BSUM>, pl, st, p);
}

template <int MI, int KPB, bool BSUM>
cudaError_t launch_stream(const plan_t &pl, const params &p, cudaStream_t st) {
    constexpr int G = 4; /* k64 chunks per round of loads (registers: 2 x G x 16 B); G = 8 measured
                          * slower at M = 1 (168 registers: the grid no longer fits one wave) */
    return pl.cluster
               ? launch(w4ax_stream_kernel<MI, KPB, STREAM_WARPS, BSUM, true, G>, pl, st, p)
               : launch(w4ax_stream_kernel<MI, KPB, STREAM_WARPS, BSUM, false, G>, pl, st, p);
}

template <int KPB, int TOK, bool BSUM>
cudaError_t launch_ws(const plan_t &pl, const params &p, const CUtensorMap &tmap, cudaStream_t st) {
    if constexpr (TOK == 128)
        if (pl.streamk || pl.persist)
            return launch(w4ax_ws_kernel<KPB, TOK, BSUM, false, true>, pl, st, p, tmap);
    return pl.cluster ? launch(w4ax_ws_kernel<KPB, TOK, BSUM, true>, pl, st, p, tmap)
                      : launch(w4ax_ws_kernel<KPB, TOK, BSUM>, pl, st, p, tmap);
}

template <bool BSUM>
cudaError_t launch_variant(const plan_t &pl, int kpb, const params &p, const CUtensorMap &tmap,
                           cudaStream_t st) {
    if (pl.kernel == COMET_W4AX_KERNEL_WGMMA)
        return with_ws_config(kpb, pl.tok, [&](auto k, auto t) {
            return launch_ws<decltype(k)::value, decltype(t)::value, BSUM>(pl, p, tmap, st);
        });
    if (pl.kernel == COMET_W4AX_KERNEL_PIPE)
        return with_mi_kpb(pl.MI, kpb, [&](auto m, auto k) {
            return launch_pipe<decltype(m)::value, decltype(k)::value, BSUM>(pl, p, st);
        });
    if (pl.kernel == COMET_W4AX_KERNEL_TILED)
        return kpb == 1 ? launch(w4ax_tiled_kernel<1, BSUM>, pl, st, p)
                        : launch(w4ax_tiled_kernel<2, BSUM>, pl, st, p);
    if (pl.MI == 1)
        return kpb == 1 ? launch_stream<1, 1, BSUM>(pl, p, st)
                        : launch_stream<1, 2, BSUM>(pl, p, st);
    if (pl.MI == 2)
        return kpb == 1 ? launch_stream<2, 1, BSUM>(pl, p, st)
                        : launch_stream<2, 2, BSUM>(pl, p, st);
    return kpb == 1 ? launch_stream<4, 1, BSUM>(pl, p, st) : launch_stream<4, 2, BSUM>(pl, p, st);
}

comet_status check_args(const comet_cuda_w4ax_gemm *g) {
    if (!g || g->M < 1 || g->N < 1 || g->K < 64 || g->K % 64 || (g->B != 64 && g->B != 128) ||
        g->K % g->B || g->n8 < 0 || g->n8 > g->K / g->B || g->M > COMET_CUDA_W4AX_MAX_DIM ||
        g->N > COMET_CUDA_W4AX_MAX_DIM || g->K > COMET_CUDA_W4AX_MAX_K ||
        (int64_t)g->M * g->N > COMET_CUDA_W4AX_MAX_OUTPUT)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "gemm_w4ax: bad shape M=%d N=%d K=%d B=%d n8=%d; need M, N >= 1, "
                               "K a multiple of 64 and of B in {64, 128}, 0 <= n8 <= K/B, "
                               "M, N <= 2^30, K <= 2^20, M * N <= 2^36",
                               g ? g->M : 0, g ? g->N : 0, g ? g->K : 0, g ? g->B : 0,
                               g ? g->n8 : 0);
    if (g->pdl != 0 && g->pdl != 1)
        return comet_set_error(COMET_ERR_INVALID_ARG, "gemm_w4ax: pdl %d is neither 0 nor 1",
                               g->pdl);
    if ((int)g->kernel < 0 || g->kernel >= COMET_W4AX_KERNEL_COUNT || g->splits < 0 ||
        (g->tile_tokens != 0 && g->tile_tokens != 16 && g->tile_tokens != 32 &&
         g->tile_tokens != 64 && g->tile_tokens != 128) ||
        g->pipe_tiles < 0 || g->pipe_tiles > PP_MAX_TILES)
        return comet_set_error(
            COMET_ERR_INVALID_ARG,
            "gemm_w4ax: kernel %d / splits %d / tile_tokens %d / pipe_tiles %d out of range",
            (int)g->kernel, g->splits, g->tile_tokens, g->pipe_tiles);
    return COMET_OK;
}

/* The column split of the output (y_parts), when there is one. */
comet_status check_parts(const comet_cuda_w4ax_gemm *g) {
    if (g->y_parts == 0)
        return COMET_OK;
    if (g->y_parts < 2 || g->y_parts > 3 || g->y_f16)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "gemm_w4ax: y_parts %d: 0, or 2 or 3 without y_f16", g->y_parts);
    int any = 0;
    for (int i = 0; i < g->y_parts; i++) {
        const int c0 = g->y_col0[i], c1 = g->y_col0[i + 1];
        if ((i == 0 && c0 != 0) || c1 <= c0 || c0 % 4 || c1 % 4 ||
            (i == g->y_parts - 1 && c1 != g->N))
            return comet_set_error(COMET_ERR_INVALID_ARG,
                                   "gemm_w4ax: output part %d has columns %d .. %d of N = %d; "
                                   "the parts must tile 0 .. N in order at multiples of 4",
                                   i, c0, c1 - 1, g->N);
        if ((uintptr_t)g->y_part[i] % 16)
            return comet_set_error(COMET_ERR_INVALID_ARG,
                                   "gemm_w4ax: output part %d is not 16-byte aligned", i);
        any |= g->y_part[i] != NULL;
    }
    if (!any)
        return comet_set_error(COMET_ERR_INVALID_ARG, "gemm_w4ax: every output part is NULL");
    return COMET_OK;
}

comet_status check_pointers(const comet_cuda_w4ax_gemm *g) {
    COMET_TRY(check_parts(g));
    if (!g->qw || !g->sw || !g->qa || !g->sa || (!g->y && !g->y_f16 && !g->y_parts))
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "gemm_w4ax: qw, sw, qa, sa and one of y, y_f16 must be non-NULL");
    if ((uintptr_t)g->qw % 16 || (uintptr_t)g->qa % 16 || (uintptr_t)g->sw % 16)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "gemm_w4ax: qw, sw and qa must be 16-byte aligned");
    return COMET_OK;
}

} // namespace

extern "C" size_t comet_cuda_gemm_w4ax_workspace_bytes(const comet_cuda_w4ax_gemm *g) {
    if (check_args(g) < 0) {
        comet_clear_error();
        return 0;
    }
    return make_plan(g).ws_bytes;
}

extern "C" const char *comet_cuda_gemm_w4ax_plan_name(const comet_cuda_w4ax_gemm *g) {
    static thread_local char buf[112]; /* per thread: the launch's error messages use it too */
    if (check_args(g) < 0) {
        comet_clear_error();
        return "invalid";
    }
    plan_t pl = make_plan(g);
    char cl[64] = "";
    if (pl.cluster && pl.kernel == COMET_W4AX_KERNEL_WGMMA)
        snprintf(cl, sizeof cl, " cluster(fit %d)", ws_cluster_capacity(g->B / 64, pl.tok, pl.S));
    else if (pl.streamk)
        snprintf(cl, sizeof cl, " stream-K");
    else if (pl.persist)
        snprintf(cl, sizeof cl, " persistent");
    else if (pl.cluster)
        snprintf(cl, sizeof cl, " cluster");
    else if (pl.kernel == COMET_W4AX_KERNEL_PIPE) {
        snprintf(cl, sizeof cl, " %d/SM ring=%d tiles=%d", pl.pp_ctas, pl.pp_depth, pl.pp_tiles);
        if (pl.pdl &&
            pl.pp_early < pl.pp_depth - 1) /* fewer early positions than the kernel could take */
            snprintf(cl + strlen(cl), sizeof cl - strlen(cl), " early=%d", pl.pp_early);
        if (pl.carveout > 0) /* the shared-memory carveout hint, % */
            snprintf(cl + strlen(cl), sizeof cl - strlen(cl), " carve=%d", pl.carveout);
    }
    if (pl.pdl)
        snprintf(cl + strlen(cl), sizeof cl - strlen(cl), " pdl");
    if (pl.invariant)
        snprintf(cl + strlen(cl), sizeof cl - strlen(cl), " invariant");
    snprintf(buf, sizeof buf, "%s MI=%d S=%d%s grid=%ux%ux%u",
             pl.kernel == COMET_W4AX_KERNEL_STREAM  ? "stream"
             : pl.kernel == COMET_W4AX_KERNEL_PIPE  ? "pipe"
             : pl.kernel == COMET_W4AX_KERNEL_WGMMA ? "wgmma"
                                                    : "tiled",
             pl.MI, pl.S, cl, pl.grid.x, pl.grid.y, pl.grid.z);
    return buf;
}

extern "C" comet_status comet_cuda_gemm_w4ax(const comet_cuda_w4ax_gemm *g, void *stream) {
    COMET_TRY(check_args(g));
    COMET_TRY(check_pointers(g));
#ifndef COMET_W4AX_TEST_INSTANCES
    if (g->bsum)
        return comet_set_error(COMET_ERR_UNSUPPORTED,
                               "gemm_w4ax: bsum (the tests' block sums) exists only in the tests' "
                               "build of this file (COMET_W4AX_TEST_INSTANCES)");
#endif
    plan_t pl = make_plan(g);
    if (pl.kernel == COMET_W4AX_KERNEL_WGMMA && !has_wgmma())
        return comet_set_error(
            COMET_ERR_UNSUPPORTED,
            "gemm_w4ax: the wgmma kernel needs an sm_90 GPU and a build with sm_90a code "
            "(CMAKE_CUDA_ARCHITECTURES with 90a, e.g. \"90a;80\"; plain 90 or native "
            "has no wgmma)");
    /* tiles along grid y (token tiles of the stream and tiled kernels) and splits along z */
    if (pl.grid.y > 65535 || pl.grid.z > 65535)
        return comet_set_error(
            COMET_ERR_INVALID_ARG,
            "gemm_w4ax: M=%d N=%d K=%d is past the grid limits of the %s plan (grid %ux%ux%u, "
            "at most 65535 in y and z); split the call along M",
            g->M, g->N, g->K, comet_cuda_gemm_w4ax_plan_name(g), pl.grid.x, pl.grid.y, pl.grid.z);
    const int smem_optin = device_attr(cudaDevAttrMaxSharedMemoryPerBlockOptin, MAX_SMEM);
    if (pl.smem > (size_t)smem_optin)
        return comet_set_error(
            COMET_ERR_UNSUPPORTED,
            "gemm_w4ax: the %s plan needs %zu bytes of shared memory per CTA, this GPU "
            "allows %d",
            comet_cuda_gemm_w4ax_plan_name(g), pl.smem, smem_optin);
    if (pl.ws_bytes > 0 && (!g->workspace || g->workspace_bytes < pl.ws_bytes))
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "gemm_w4ax: the plan needs %zu workspace bytes, got %zu; size it "
                               "with comet_cuda_gemm_w4ax_workspace_bytes",
                               pl.ws_bytes, g->workspace ? g->workspace_bytes : (size_t)0);
    params p;
    p.M = g->M, p.N = g->N, p.Np = (g->N + 15) / 16 * 16, p.K = g->K, p.nb = g->K / g->B,
    p.S = pl.S;
    p.qw = g->qw, p.sw = g->sw, p.qa = g->qa, p.sa = g->sa, p.y = g->y, p.y16 = g->y_f16;
    p.y_parts = g->y_parts;
    if (g->y_parts) {
        p.y = nullptr;
        for (int i = 0; i <= g->y_parts; i++)
            p.y_col0[i] = g->y_col0[i];
        for (int i = 0; i < 3; i++)
            p.y_part[i] = i < g->y_parts ? g->y_part[i] : nullptr;
    }
    p.bsum = g->bsum;
    p.counter = (unsigned *)g->workspace;
    p.part = pl.ws_bytes ? (float *)((char *)g->workspace + counter_bytes(pl)) : nullptr;
    p.tiles_n = pl.tiles_n, p.tiles_m = pl.tiles_m;
    p.pp_depth = pl.pp_depth, p.pp_rows = pl.pp_rows, p.pp_early = pl.pp_early, p.pdl = pl.pdl;
    p.persist = pl.persist;
    CUtensorMap tmap;
    memset(&tmap, 0, sizeof tmap);
    if (pl.kernel == COMET_W4AX_KERNEL_WGMMA)
        COMET_TRY(make_tmap_a(g, pl.tok, &tmap));
    cudaStream_t st = (cudaStream_t)stream;
    const int kpb = g->B / 64;
    cudaError_t e;
    if (pl.ws_bytes > 0 && counters_needed(pl) > WS_COUNTERS &&
        (e = cudaMemsetAsync(g->workspace, 0, counter_bytes(pl), st)) != cudaSuccess)
        return comet_set_error(COMET_ERR_CUDA,
                               "gemm_w4ax: zeroing %zu workspace counters failed: %s",
                               counters_needed(pl), cudaGetErrorString(e));
#ifdef COMET_W4AX_TEST_INSTANCES
    e = g->bsum ? launch_variant<true>(pl, kpb, p, tmap, st)
                : launch_variant<false>(pl, kpb, p, tmap, st);
#else
    e = launch_variant<false>(pl, kpb, p, tmap, st);
#endif
    if (e != cudaSuccess)
        return comet_set_error(COMET_ERR_CUDA, "gemm_w4ax: launch of %s failed: %s",
                               comet_cuda_gemm_w4ax_plan_name(g), cudaGetErrorString(e));
    return COMET_OK;
}
