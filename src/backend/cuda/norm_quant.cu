/* norm_quant.cu — the CUDA backend's fused input kernels of the linears (norm_quant.h):
 * RMSNorm (with the residual add) or SwiGLU or a plain row, then the group's permutation
 * gather and the per-block activation quantization, one kernel per op.
 *
 * Numerics follow the CPU reference (src/backend/cpu, src/numerics/quant.c): wherever the
 * CPU rounds a value that becomes a code (activation block scales and codes) the kernels use
 * the _rn intrinsics, so nvcc does not contract them into FMAs and the same fp32 inputs give
 * the same codes. The RMSNorm sum of squares runs in a different order than the CPU's and
 * agrees up to fp32 rounding.
 *
 * RMSNorm takes one of two kernels: row_quant_kernel (one CTA a token row, any sm_80+ GPU) or,
 * for up to 16 rows on sm_90, norm_cluster_kernel (a thread-block cluster a row, its threads
 * doing row_quant_kernel's work over 2 to 8 SMs: the same bits); comet_cuda_rmsnorm_quant_form
 * names the one a call takes.
 *
 * What it does not do: any allocation (the caller owns every buffer).
 */
#include "backend/cuda/norm_quant.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>

#include "backend/cuda/env_switch.h"
#include "backend/cuda/kernel_util.cuh"
#include "backend/cuda/ptx.cuh"

namespace {

/* RMSNorm rows: one CTA per token row, as many threads as a CTA takes, so that a decode
 * row of 4096 channels is one pass of 4 values per thread (about 3 us, not 20 at 256) */
constexpr int NORM_THREADS = 1024;
/* Widest RMSNorm row kept in shared memory (128 KB, within every target's opt-in limit:
 * 163 KB on sm_80, 227 KB on sm_90); wider rows are read back from global memory */
constexpr int NORM_SMEM_MAX_K = 32768;
/* Most rows for which RMSNorm takes its low-latency form (row_quant_kernel PRE) */
constexpr int NORM_PRELOAD_MAX_T = 64;
/* Most rows for which RMSNorm takes its cluster form (norm_cluster_kernel, sm_90): 16 rows of
 * clusters of up to 8 CTAs still give every CTA an SM of its own (128 of the H100's and H200's
 * 132); beyond that the clusters would share SMs, whose issue slots are what the form spreads */
constexpr int NORM_CLUSTER_MAX_T = 16;
/* CTAs a token row in the cluster form when COMET_CUDA_NORM_CLUSTER is unset: 8 warps an SM (2
 * a scheduler); 8 CTAs are as fast at one row and slower at 16 (8B decode on the H100: 4,794
 * against 4,813 tok/s at batch 16) */
constexpr int NORM_CLUSTER_DEFAULT = 4;
/* Cluster form: row values a thread loads at once (8 x and 8 residual loads in flight), and
 * gather slots a thread loads perm and norm for before the reduction */
[[maybe_unused]] constexpr int NORM_CLUSTER_BATCH = 8;
/* Dynamic shared memory a kernel may take without opting in */
constexpr int SMEM_DEFAULT_MAX = 48 * 1024;
/* SwiGLU and plain rows need no row-wide reduction: a CTA of 8 warps takes 8 activation
 * blocks (or 2048 fp16 values), so a 14336-wide decode row spreads over 14 CTAs */
constexpr int ROW_THREADS = 256;
constexpr int ROW_F16_PER_CTA = 2048;

/* ---- RMSNorm / SwiGLU / plain input + gather + activation quantization ---- */

enum row_mode {
    ROW_NORM = 0,
    ROW_PLAIN = 1,
    ROW_SILU = 2
};

struct row_args {
    float *x;              /* NORM: [T, K], gets the residual sum; PLAIN: [T, K] input */
    const float *residual; /* NORM: [T, K] or NULL */
    const float *norm;     /* NORM: [K] */
    float eps;
    const float *gate, *up; /* SILU: [T, K] */
    int K, B, n8;
    int kind;            /* comet_cuda_act_kind */
    int smem_row;        /* NORM: the row after the residual add kept in dynamic shared
                          * memory ([K] floats) for the gather */
    const int32_t *perm; /* [K] or NULL */
    int8_t *qa;          /* W4AX: [T, K] codes */
    float *sa;           /* W4AX: [T, K/B] scales */
    __half *h16;         /* F16: [T, K] */
    int pdl_trigger;     /* 1: the next kernel may launch from this one's start (step_trigger) */
};

/* Token row blockIdx.x. NORM runs one CTA of NORM_THREADS per row: it first adds the
 * residual (each thread a strided share of the row, written back to x and, with smem_row,
 * kept in shared memory) and reduces the sum of squares through warp shuffles and shared
 * memory to the row's inverse RMS. SILU and PLAIN split a row along blockIdx.y (ROW_THREADS /
 * 32 activation blocks, or ROW_F16_PER_CTA fp16 values, a CTA). The row is produced in the
 * group's permuted order, each value recomputed at its source channel perm[k] (h = x * inv *
 * norm with x from shared memory or global, or silu(gate) * up, or x): for W4AX each warp
 * takes whole activation blocks (B / 32 consecutive channels per lane), reduces the block's
 * amax with shuffles and writes the lane's codes as one 2- or 4-byte store, lane 0 the scale;
 * for F16 the threads stride over their share of the row. NORM's W4AX warps load their first
 * block's perm and norm entries before the reduction, so that after its two barriers a value
 * waits on shared memory only (without: perm, then x and norm at perm, two global round
 * trips in a row). */
template <int MODE, bool PRE>
static __global__ void __launch_bounds__(NORM_THREADS, PRE ? 1 : 2) row_quant_kernel(row_args a) {
    if (a.pdl_trigger)
        comet_ptx::pdl_trigger(); /* a GEMM after it may start on its weights (ptx.cuh) */
    extern __shared__ float xs[]; /* NORM with smem_row: [K] the row after the residual add */
    const int t = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int nthreads = blockDim.x, nwarps = nthreads >> 5;
    const int K = a.K;
    const size_t row = (size_t)t * K;
    const bool smem = MODE == ROW_NORM && a.smem_row;
    const int nb = K / a.B, per = a.B / 32; /* W4AX; per: 2 or 4 channels per lane */
    /* NORM, W4AX: the source channels and norm weights of this warp's first block */
    int p0[4] = {0, 0, 0, 0};
    float n0[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const int b0 = blockIdx.y * nwarps + warp;
    if (PRE && MODE == ROW_NORM && a.kind == COMET_CUDA_ACT_W4AX && b0 < nb) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            if (e < per) {
                const int k = b0 * a.B + lane * per + e;
                p0[e] = a.perm ? a.perm[k] : k;
                n0[e] = a.norm[p0[e]];
            }
        }
    }
    float inv = 0.0f;
    if (MODE == ROW_NORM) {
        __shared__ float red[32];
        float *xr = a.x + row;
        float ss = 0.0f;
        for (int c = tid; c < K; c += nthreads) {
            float v = xr[c];
            if (a.residual) {
                v = __fadd_rn(v, a.residual[row + c]);
                xr[c] = v;
            }
            if (smem)
                xs[c] = v;
            ss += v * v;
        }
        ss = warp_sum(ss);
        if (lane == 0)
            red[warp] = ss;
        __syncthreads(); /* also publishes the residual sums written above */
        if (warp == 0) {
            float v = lane < nwarps ? red[lane] : 0.0f;
            v = warp_sum(v);
            if (lane == 0)
                red[0] = v;
        }
        __syncthreads();
        inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(red[0], (float)K), a.eps)));
    }
    /* h at source channel p with norm weight w (NORM) */
    auto normed = [&](int p, float w) -> float {
        return __fmul_rn(__fmul_rn(smem ? xs[p] : a.x[row + p], inv), w);
    };
    auto value = [&](int k) -> float {
        const int p = a.perm ? a.perm[k] : k;
        if (MODE == ROW_NORM)
            return normed(p, a.norm[p]);
        if (MODE == ROW_SILU) {
            const float g = a.gate[row + p];
            return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), a.up[row + p]);
        }
        return a.x[row + p];
    };
    if (a.kind == COMET_CUDA_ACT_F16) {
        __half *dst = a.h16 + row;
        for (int k = blockIdx.y * nthreads + tid; k < K; k += gridDim.y * nthreads)
            dst[k] = __float2half_rn(value(k));
        return;
    }
    /* kernel_util.cuh's warp_quant_block, inline: nvcc 13.0 compiles this loop through the
     * helper into other machine code for the ROW_NORM forms (8 to 16 more FMUL, 4 to 8 more
     * LDG), and this form is the one measured */
    for (int b = b0; b < nb; b += gridDim.y * nwarps) {
        const int k0 = b * a.B + lane * per;
        float v[4];
        float amax = 0.0f;
        bool finite = true;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            v[e] = 0.0f;
            if (e < per)
                v[e] = PRE && b == b0 ? normed(p0[e], n0[e]) : value(k0 + e);
            finite &= isfinite(v[e]);
            amax = fmaxf(amax, fabsf(v[e]));
        }
        amax = warp_max(amax);
        finite = __all_sync(0xffffffffu, finite);
        const int qmax = b < a.n8 ? 127 : 7;
        int8_t q[4] = {0, 0, 0, 0};
        float s = finite ? 0.0f : __int_as_float(0x7fc00000); /* comet_quant_sym_block's NaN */
        if (finite && amax != 0.0f) {
            s = __fdiv_rn(amax, (float)qmax);
            const float sinv = __fdiv_rn(1.0f, s);
            const float lo = (float)(-qmax - 1), hi = (float)qmax;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float r = rintf(__fmul_rn(v[e], sinv));
                r = r < lo ? lo : r > hi ? hi : r;
                q[e] = (int8_t)r;
            }
        }
        int8_t *dst = a.qa + row + k0;
        if (per == 4)
            *reinterpret_cast<char4 *>(dst) = make_char4(q[0], q[1], q[2], q[3]);
        else
            *reinterpret_cast<char2 *>(dst) = make_char2(q[0], q[1]);
        if (lane == 0)
            a.sa[(size_t)t * nb + b] = s;
    }
}

/* RMSNorm of token row blockIdx.y by a cluster of C CTAs (grid (C, T), cluster (C, 1, 1): the
 * rank is blockIdx.x) of NORM_THREADS / C threads, sm_90: the same bits as row_quant_kernel
 * (ROW_NORM, smem_row) with the row's latency chain spread over C SMs.
 *
 * The cluster's threads are row_quant_kernel's 1024 threads: virtual thread vt = rank *
 * (1024 / C) + threadIdx.x adds the residual and sums the squares of channels vt, vt + 1024,
 * ... in that order (one fma each), each CTA's warps are whole virtual warps (the same shuffle
 * tree), and the 32 warp sums reach every CTA's `red` at their warp's index, so that each warp
 * reduces them with row_quant_kernel's last shuffle tree to the same inverse RMS. Each thread
 * loads NORM_CLUSTER_BATCH values of x and the residual before it uses one (row_quant_kernel's
 * loop waits for each load in turn: its store to x may alias the next load), writes the sums
 * back to x and pushes each value into the row copy `xs` of every CTA of the cluster (its own
 * by a plain store, the others by coalesced st.shared::cluster), so that the permuted gather
 * reads local shared memory only (the SM-to-SM network wants coalesced accesses; the gather's
 * are random). One cluster barrier publishes the row and the warp sums; nothing crosses CTAs
 * after it, so a CTA leaves when it is done. A start-up handshake (arrive at entry, wait
 * before the first remote store) keeps remote stores off a CTA that is not running yet.
 *
 * Before the reduction each thread also loads perm and norm of its first NORM_CLUSTER_BATCH
 * gather slots (W4AX: the lane's channels of its virtual warp's first two blocks, b = vw and
 * vw + 32; F16: outputs vt, vt + 1024, ...), so that after the barrier those values wait on
 * shared memory only. Then each virtual warp quantizes blocks vw, vw + 32, ... (warp_quant_block,
 * row_quant_kernel's operations) or writes its fp16 outputs. Code for targets below sm_90 has
 * no body (a trap): cluster_form_runs() keeps launches off it. */
template <int C>
static __global__ void __launch_bounds__(NORM_THREADS / C) norm_cluster_kernel(row_args a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    using namespace comet_ptx;
    if (a.pdl_trigger)
        pdl_trigger(); /* a GEMM after it may start on its weights (ptx.cuh) */
    constexpr int NT = NORM_THREADS / C, U = NORM_CLUSTER_BATCH;
    extern __shared__ float xs[]; /* [K] the row after the residual add, in every CTA */
    __shared__ float red[32];     /* the 32 virtual warps' sums of squares, in every CTA */
    cluster_arrive_relaxed();
    const unsigned rank = blockIdx.x;
    const int t = blockIdx.y, lane = threadIdx.x & 31;
    const int vt = (int)rank * NT + (int)threadIdx.x, vw = vt >> 5;
    const int K = a.K;
    const size_t row = (size_t)t * K;
    const bool w4ax = a.kind == COMET_CUDA_ACT_W4AX;
    const int nb = w4ax ? K / a.B : 0, per = w4ax ? a.B / 32 : 0;
    /* the channel (output position) of gather slot s, or -1 */
    auto slot_k = [&](int s) -> int {
        if (w4ax) {
            const int b = vw + 32 * (s >> 2), e = s & 3;
            return b < nb && e < per ? b * a.B + lane * per + e : -1;
        }
        const int k = vt + NORM_THREADS * s;
        return k < K ? k : -1;
    };
    int pp[U];
    float pn[U];
#pragma unroll
    for (int s = 0; s < U; s++) {
        const int k = slot_k(s);
        pp[s] = k >= 0 && a.perm ? a.perm[k] : k;
    }
    float *xr = a.x + row;
    const float *rr = a.residual ? a.residual + row : nullptr;
    float xv[U], rv[U];
    auto load = [&](int c0) {
#pragma unroll
        for (int e = 0; e < U; e++) {
            const int c = c0 + NORM_THREADS * e;
            xv[e] = c < K ? xr[c] : 0.0f;
            rv[e] = rr && c < K ? rr[c] : 0.0f;
        }
    };
    load(vt);
#pragma unroll
    for (int s = 0; s < U; s++)
        pn[s] = pp[s] >= 0 ? a.norm[pp[s]] : 0.0f;
    uint32_t peer[C]; /* xs in CTA (rank + q) % C, q >= 1 */
#pragma unroll
    for (int q = 1; q < C; q++)
        peer[q] = dsmem_addr(xs, (rank + q) % C);
    float ss = 0.0f;
    auto use = [&](int c0) {
#pragma unroll
        for (int e = 0; e < U; e++) {
            const int c = c0 + NORM_THREADS * e;
            if (c < K) {
                float v = xv[e];
                if (rr) {
                    v = __fadd_rn(v, rv[e]);
                    xr[c] = v;
                }
                ss = __fmaf_rn(v, v, ss);
                xs[c] = v;
#pragma unroll
                for (int q = 1; q < C; q++)
                    st_dsmem(peer[q] + 4u * (uint32_t)c, v);
            }
        }
    };
    cluster_wait(); /* every CTA of the cluster runs: its shared memory takes remote stores */
    use(vt);
    for (int c0 = vt + U * NORM_THREADS; c0 < K; c0 += U * NORM_THREADS) {
        load(c0);
        use(c0);
    }
    ss = warp_sum(ss);
    if (lane < C)
        st_dsmem(dsmem_addr(&red[vw], (unsigned)lane), ss);
    cluster_arrive(); /* publishes xs and red across the cluster */
    cluster_wait();
    const float sum = warp_sum(red[lane]);
    const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(sum, (float)K), a.eps)));
    auto normed = [&](int p, float w) -> float { return __fmul_rn(__fmul_rn(xs[p], inv), w); };
    auto source = [&](int k) -> int { return a.perm ? a.perm[k] : k; };
    if (!w4ax) {
        __half *dst = a.h16 + row;
#pragma unroll
        for (int s = 0; s < U; s++)
            if (pp[s] >= 0)
                dst[vt + NORM_THREADS * s] = __float2half_rn(normed(pp[s], pn[s]));
        for (int k = vt + U * NORM_THREADS; k < K; k += NORM_THREADS) {
            const int p = source(k);
            dst[k] = __float2half_rn(normed(p, a.norm[p]));
        }
        return;
    }
#pragma unroll
    for (int j = 0; j < U / 4; j++) {
        const int b = vw + 32 * j;
        if (b < nb) {
            float v[4];
#pragma unroll
            for (int e = 0; e < 4; e++)
                v[e] = e < per ? normed(pp[4 * j + e], pn[4 * j + e]) : 0.0f;
            warp_quant_block(v, per, b < a.n8 ? 127 : 7, lane, a.qa + (size_t)t * K + b * a.B,
                             a.sa + (size_t)t * nb + b);
        }
    }
    for (int b = vw + 32 * (U / 4); b < nb; b += 32) {
        const int k0 = b * a.B + lane * per;
        float v[4];
#pragma unroll
        for (int e = 0; e < 4; e++) {
            v[e] = 0.0f;
            if (e < per) {
                const int p = source(k0 + e);
                v[e] = normed(p, a.norm[p]);
            }
        }
        warp_quant_block(v, per, b < a.n8 ? 127 : 7, lane, a.qa + (size_t)t * K + b * a.B,
                             a.sa + (size_t)t * nb + b);
    }
#elif defined(__CUDA_ARCH__)
    __trap();
#endif
}

/* How comet_cuda_rmsnorm_quant runs a call: the cluster form with `cluster` CTAs a row, or
 * row_quant_kernel with the row kept in shared memory (smem_row) and the early gather loads
 * (pre) or without. */
struct norm_form {
    int cluster; /* 0, 2, 4 or 8 */
    bool smem_row, pre;
};

/* Whether this device runs norm_cluster_kernel's sm_90 code: an sm_90 or newer GPU that loaded
 * code compiled for sm_90 (a "90a;80" build on a newer GPU runs the compute_80 PTX, whose
 * cluster kernels trap). Read from the kernel's PTX version (cudaFuncGetAttributes: no copy, no
 * synchronization, safe during graph capture), cached per device. */
bool cluster_form_runs() {
    constexpr int MAX_DEV = 64;
    static std::atomic<int> known[MAX_DEV]; /* 0 not read yet, 1 yes, 2 no */
    int dev = -1;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0) {
        cudaGetLastError(); /* clear */
        return false;
    }
    if (dev < MAX_DEV && known[dev].load())
        return known[dev].load() == 1;
    int major = 0;
    cudaFuncAttributes fa;
    const bool yes =
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
        major >= 9 &&
        cudaFuncGetAttributes(&fa, norm_cluster_kernel<NORM_CLUSTER_DEFAULT>) == cudaSuccess &&
        fa.ptxVersion >= 90;
    if (!yes)
        cudaGetLastError(); /* clear a failed query */
    if (dev < MAX_DEV)
        known[dev].store(yes ? 1 : 2);
    return yes;
}

/* The form for T rows of K channels under the environment, both read at every call:
 * COMET_CUDA_NORM_SMEM=0 (x read back from global memory, no early loads) and
 * COMET_CUDA_NORM_CLUSTER (0: no cluster form; 2, 4 or 8: its CTAs a row; unset:
 * NORM_CLUSTER_DEFAULT). Every form gives the same bits. COMET_ERR_INVALID_ARG for another
 * COMET_CUDA_NORM_CLUSTER value. */
comet_status pick_norm_form(int T, int K, norm_form *nf) {
    const bool fast = !comet_cuda_env_off("COMET_CUDA_NORM_SMEM");
    const char *cl = getenv("COMET_CUDA_NORM_CLUSTER");
    int cluster = NORM_CLUSTER_DEFAULT;
    if (cl && cl[0]) {
        if (!strcmp(cl, "0") || !strcmp(cl, "2") || !strcmp(cl, "4") || !strcmp(cl, "8"))
            cluster = cl[0] - '0';
        else
            return comet_set_error(COMET_ERR_INVALID_ARG,
                                   "cuda backend: rmsnorm_quant: COMET_CUDA_NORM_CLUSTER=%s; "
                                   "expected 0 (off), 2, 4 or 8 (CTAs a token row)",
                                   cl);
    }
    nf->smem_row = fast && K <= NORM_SMEM_MAX_K;
    /* up to NORM_PRELOAD_MAX_T rows (each CTA has an SM to itself anyway) the form that loads
     * the gather's perm and norm entries first (45 to 52 registers: one CTA an SM); beyond, the
     * one that keeps two CTAs an SM */
    nf->pre = fast && T <= NORM_PRELOAD_MAX_T;
    nf->cluster = nf->smem_row && T <= NORM_CLUSTER_MAX_T && cluster && cluster_form_runs()
                      ? cluster
                      : 0;
    return COMET_OK;
}

/* norm_cluster_kernel<C> over T rows: grid (C, T), clusters (C, 1, 1), smem bytes of the row. */
comet_status norm_cluster_launch(int C, const row_args &a, int T, int smem, cudaStream_t s,
                                 const char *op) {
    void (*kernel)(row_args) = C == 2   ? norm_cluster_kernel<2>
                               : C == 8 ? norm_cluster_kernel<8>
                                        : norm_cluster_kernel<4>;
    cudaError_t e = cudaSuccess;
    if (smem > SMEM_DEFAULT_MAX)
        e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess)
        return comet_set_error(COMET_ERR_CUDA,
                               "cuda backend: %s: %d bytes of shared memory refused: %s", op, smem,
                               cudaGetErrorString(e));
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)C, (unsigned)T), cfg.blockDim = dim3(NORM_THREADS / C);
    cfg.dynamicSmemBytes = (size_t)smem, cfg.stream = s;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = (unsigned)C, attr[0].val.clusterDim.y = 1,
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr, cfg.numAttrs = 1;
    e = cudaLaunchKernelEx(&cfg, kernel, a);
    if (e != cudaSuccess)
        return comet_set_error(COMET_ERR_CUDA,
                               "cuda backend: %s: launch of %d rows in clusters of %d failed: %s",
                               op, T, C, cudaGetErrorString(e));
    return launch_check(op);
}

comet_status row_quant_launch(int mode, row_args a, int T, const comet_cuda_act_fmt *f, void *act,
                              void *stream, const char *op) {
    if (T < 1 || !f || !act || f->K < 1)
        return comet_set_error(COMET_ERR_INVALID_ARG, "cuda backend: %s: T = %d, K = %d, act %p",
                               op, T, f ? f->K : 0, act);
    a.K = f->K, a.B = f->B, a.n8 = f->n8, a.kind = f->kind, a.perm = f->perm;
    a.pdl_trigger = comet_ptx::step_trigger(T);
    if (f->kind == COMET_CUDA_ACT_W4AX) {
        if ((f->B != 64 && f->B != 128) || f->K % f->B || f->n8 < 0 || f->n8 > f->K / f->B)
            return comet_set_error(COMET_ERR_INVALID_ARG,
                                   "cuda backend: %s: K = %d, B = %d, n8 = %d is not a W4Ax "
                                   "activation layout",
                                   op, f->K, f->B, f->n8);
        a.qa = static_cast<int8_t *>(act);
        a.sa = reinterpret_cast<float *>(static_cast<char *>(act) +
                                         comet_cuda_act_scales_offset(T, f->K));
    } else if (f->kind == COMET_CUDA_ACT_F16) {
        a.h16 = static_cast<__half *>(act);
    } else {
        return comet_set_error(COMET_ERR_INVALID_ARG, "cuda backend: %s: activation kind %d", op,
                               (int)f->kind);
    }
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    const int parts = f->kind == COMET_CUDA_ACT_F16
                          ? (f->K + ROW_F16_PER_CTA - 1) / ROW_F16_PER_CTA
                          : (f->K / f->B + ROW_THREADS / 32 - 1) / (ROW_THREADS / 32);
    if (mode == ROW_NORM) {
        norm_form nf = {};
        COMET_TRY(pick_norm_form(T, f->K, &nf));
        a.smem_row = nf.smem_row;
        const int smem = a.smem_row ? f->K * (int)sizeof(float) : 0;
        if (nf.cluster)
            return norm_cluster_launch(nf.cluster, a, T, smem, s, op);
        void (*kernel)(row_args) =
            nf.pre ? row_quant_kernel<ROW_NORM, true> : row_quant_kernel<ROW_NORM, false>;
        if (smem > SMEM_DEFAULT_MAX) {
            cudaError_t e =
                cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
            if (e != cudaSuccess)
                return comet_set_error(COMET_ERR_CUDA,
                                       "cuda backend: %s: %d bytes of shared memory refused: %s",
                                       op, smem, cudaGetErrorString(e));
        }
        kernel<<<T, NORM_THREADS, smem, s>>>(a);
    } else if (mode == ROW_SILU) {
        row_quant_kernel<ROW_SILU, false><<<dim3(T, parts), ROW_THREADS, 0, s>>>(a);
    } else {
        row_quant_kernel<ROW_PLAIN, false><<<dim3(T, parts), ROW_THREADS, 0, s>>>(a);
    }
    return launch_check(op);
}

} /* namespace */

extern "C" {

comet_status comet_cuda_rmsnorm_quant(float *x, const float *residual, const float *norm, float eps,
                                      int T, const comet_cuda_act_fmt *f, void *act, void *stream) {
    row_args a = {};
    a.x = x, a.residual = residual, a.norm = norm, a.eps = eps;
    return row_quant_launch(ROW_NORM, a, T, f, act, stream, "rmsnorm_quant");
}

const char *comet_cuda_rmsnorm_quant_form(int T, int K) {
    if (T < 1 || K < 1) {
        comet_set_error(COMET_ERR_INVALID_ARG, "cuda backend: rmsnorm_quant form: T = %d, K = %d",
                        T, K);
        return NULL;
    }
    norm_form nf = {};
    if (pick_norm_form(T, K, &nf) != COMET_OK)
        return NULL;
    if (nf.cluster)
        return nf.cluster == 2 ? "cluster 2" : nf.cluster == 8 ? "cluster 8" : "cluster 4";
    if (nf.smem_row)
        return nf.pre ? "row shared early" : "row shared";
    return nf.pre ? "row global early" : "row global";
}

comet_status comet_cuda_act_quant(const float *x, int T, const comet_cuda_act_fmt *f, void *act,
                                  void *stream) {
    row_args a = {};
    a.x = const_cast<float *>(x); /* read only in ROW_PLAIN */
    return row_quant_launch(ROW_PLAIN, a, T, f, act, stream, "act_quant");
}

comet_status comet_cuda_silu_mul_quant(const float *gate, const float *up, int T,
                                       const comet_cuda_act_fmt *f, void *act, void *stream) {
    row_args a = {};
    a.gate = gate, a.up = up;
    return row_quant_launch(ROW_SILU, a, T, f, act, stream, "silu_mul_quant");
}

} /* extern "C" */
