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
 * What it does not do: any allocation (the caller owns every buffer).
 */
#include "backend/cuda/norm_quant.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>

#include "backend/cuda/kernel_util.cuh"
#include "backend/cuda/env_switch.h"

namespace {

/* RMSNorm rows: one CTA per token row, as many threads as a CTA takes, so that a decode
 * row of 4096 channels is one pass of 4 values per thread (about 3 us, not 20 at 256) */
constexpr int NORM_THREADS = 1024;
/* Widest RMSNorm row kept in shared memory (128 KB, within every target's opt-in limit:
 * 163 KB on sm_80, 227 KB on sm_90); wider rows are read back from global memory */
constexpr int NORM_SMEM_MAX_K = 32768;
/* Most rows for which RMSNorm takes its low-latency form (row_quant_kernel PRE) */
constexpr int NORM_PRELOAD_MAX_T = 64;
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

comet_status row_quant_launch(int mode, row_args a, int T, const comet_cuda_act_fmt *f, void *act,
                              void *stream, const char *op) {
    if (T < 1 || !f || !act || f->K < 1)
        return comet_set_error(COMET_ERR_INVALID_ARG, "cuda backend: %s: T = %d, K = %d, act %p",
                               op, T, f ? f->K : 0, act);
    a.K = f->K, a.B = f->B, a.n8 = f->n8, a.kind = f->kind, a.perm = f->perm;
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
        /* COMET_CUDA_NORM_SMEM=0 (read at every call): x read back from global memory and
         * no early loads, for A/B runs; the same bits either way */
        const bool fast = !comet_cuda_env_off("COMET_CUDA_NORM_SMEM");
        a.smem_row = fast && f->K <= NORM_SMEM_MAX_K;
        const int smem = a.smem_row ? f->K * (int)sizeof(float) : 0;
        /* up to NORM_PRELOAD_MAX_T rows (each CTA has an SM to itself anyway) the form that
         * loads the gather's perm and norm entries first (52 registers: one CTA an SM);
         * beyond, the one that keeps two CTAs an SM */
        void (*kernel)(row_args) = fast && T <= NORM_PRELOAD_MAX_T
                                       ? row_quant_kernel<ROW_NORM, true>
                                       : row_quant_kernel<ROW_NORM, false>;
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
