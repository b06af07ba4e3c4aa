/* gemm_w4ax_decode.cuh — the decode kernel (chosen only when a caller forces it): CTAs own
 * 16-row weight tiles over all of K, their warps split K. Part of gemm_w4ax.cu's one
 * translation unit (it includes every gemm_w4ax_*.cuh in order), so the kernels compile exactly
 * as one file would.
 */
#pragma once

#include "backend/cuda/gemm_w4ax_pipe.cuh"

namespace {

/* Decode kernel (chosen only when forced: the pipe kernel runs M = 1), built to what a
 * kernel that only reads the weights costs (bench/gemm/floor.cu). A CTA of DK_WARPS warps owns dk_wt(MI) 16-row weight
 * tiles x all of K x 8*MI tokens (blockIdx.y); the DK_WARPS / wt warps of a tile split its
 * blocks evenly. Each warp issues the 16-byte loads of DK_U k64 chunks of its share at once,
 * straight into registers, before anything waits (then the CTA copies its tokens' codes and
 * scales and its tiles' weight scales into shared memory); a longer share goes in rounds of
 * DK_U. The warps' partial tiles are summed in shared memory in K order (deterministic).
 * Measured and dropped (bench/results/2026-12-01-h200-gemm-s6.md): split-K through a cluster
 * (DSMEM reduction; 10-50 % slower at M = 1), two buffers of 4 chunks refilled in turn (up
 * to 9 % slower than one of 8), a CTA of 1 tile at M = 9-16 (copying the token rows cost more
 * than loading the weights); at M = 4-16 with pdl in CUDA graphs, split-K through
 * a cluster with 4 tiles per CTA (each CTA's token slice then serves 64 weight rows): 0.85-0.98x
 * the automatic plan's time on 5 of 24 points (2 splits: 70B o, down and qkv at M = 4-8),
 * 1.01-1.74x elsewhere with 2 splits, up to 2.59x with 4 and 4.65x with 8. */
#ifndef COMET_DK_WARPS /* experiments: bench/gemm/build_variant.sh -DCOMET_DK_WARPS=16 -DCOMET_DK_U=4 */
#define COMET_DK_WARPS 8
#define COMET_DK_U 8
#endif
#ifndef COMET_DK_MINB1 /* CTAs per SM the MI = 1 instances are built for (registers) */
#define COMET_DK_MINB1 3
#endif
constexpr int DK_WARPS = COMET_DK_WARPS, DK_U = COMET_DK_U;

/* Shared memory of the decode kernel, in bytes from the start: token codes [rows x (K + 16)],
 * activation scales [rows x nb] fp32, weight scales [nb x wt*16] fp16, then the warps'
 * partial tiles [DK_WARPS x 16 x tt] fp32; rows = min(M, tt). */
struct dk_layout {
    int sa, sw, red, bytes;
    __host__ __device__ dk_layout(int rows, int tt, int K, int nb, int wt) {
        sa = (rows * (K + 16) + 15) / 16 * 16;
        sw = sa + (rows * nb * 4 + 15) / 16 * 16;
        red = sw + (nb * wt * 32 + 15) / 16 * 16;
        bytes = red + DK_WARPS * 16 * tt * 4;
    }
};

/* 16-row tiles per CTA: 1 for one token group of 8 (the CTA's warps all split K), 4 for 16
 * (the token slice in shared memory then serves 4 tiles: with 1, copying it cost more than
 * the weights' load, measured) */
__host__ __device__ constexpr int dk_wt(int mi) { return mi == 1 ? 1 : 4; }

template <int MI, int KPB, bool BSUM>
__global__ void __launch_bounds__(DK_WARPS * 32, MI == 1 ? COMET_DK_MINB1 : 16 / DK_WARPS)
    w4ax_decode_kernel(const __grid_constant__ params p) {
    constexpr int TT = 8 * MI, B = KPB * 64, NBU = DK_U / KPB, WT = dk_wt(MI), WK = DK_WARPS / WT;
    extern __shared__ __align__(16) uint8_t smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, tq = lane & 3;
    const int nt = blockIdx.x * WT + warp % WT, kw = warp / WT, np16 = p.Np / 16;
    const int b0 = kw * p.nb / WK, nbw = (kw + 1) * p.nb / WK - b0; /* this warp's blocks */
    const bool active = nt < np16;
    const int nch = active ? nbw * KPB : 0;
    pdl_trigger();

    /* first, the weight loads: the first DK_U chunks of the share in flight from here on */
    const uint8_t *wp =
        p.qw + ((size_t)(active ? nt : 0) * (p.K / 64) + (size_t)b0 * KPB) * 512 + lane * 16;
    uint4 w[DK_U];
    auto issue = [&](int c0) { /* chunks [c0, c0 + DK_U) of this warp's share */
#pragma unroll
                               for (int j = 0; j < DK_U; j++)
                                   if (c0 + j < nch)
                                       w[j] = ld_stream(wp + (size_t)(c0 + j) * 512);
    };
    issue(0);

    /* then the CTA's token codes, activation scales and its tiles' weight scales */
    const int t0 = blockIdx.y * TT, rows = min(TT, p.M - t0), RS = p.K + 16;
    const dk_layout L(min(TT, p.M), TT, p.K, p.nb, WT);
    if (!(p.ablate & 32)) { /* profiling: 32 = no copies */
        const int live =
            min(WT, np16 - (int)blockIdx.x * WT) * 2; /* 16-byte pieces per block row */
        const uint16_t *sw = p.sw + blockIdx.x * WT * 16;
        for (int i = threadIdx.x; i < p.nb * WT * 2; i += DK_WARPS * 32) {
            const int b = i / (WT * 2), piece = i % (WT * 2);
            if (piece < live)
                cp_async16(smem + L.sw + i * 16, sw + (size_t)b * p.Np + piece * 8, true);
        }
        pdl_wait(); /* the weights above may be read while the previous kernel runs, nothing else */
        const int8_t *qa = p.qa + (size_t)t0 * p.K;
        for (int row = 0; row < rows; row++)
            for (int col = threadIdx.x * 16; col < p.K; col += DK_WARPS * 32 * 16)
                cp_async16_tok(smem + row * RS + col, qa + (size_t)row * p.K + col);
        const float *sa = p.sa + (size_t)t0 * p.nb;
        for (int row = 0; row < rows; row++)
            for (int b = threadIdx.x; b < p.nb; b += DK_WARPS * 32)
                cp_async4(smem + L.sa + (row * p.nb + b) * 4, sa + (size_t)row * p.nb + b, true);
    } else {
        pdl_wait();
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();

    float acc[MI][4];
    zero_acc<MI>(acc);
    const uint8_t *act = smem + (size_t)b0 * B + tq * 4;
    /* this lane's activation-scale rows (tokens f*8 + tq*2 + e; rows past M read as 0) */
    const float *sap[MI][2];
    bool sa_ok[MI][2];
#pragma unroll
    for (int f = 0; f < MI; f++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int tt = f * 8 + tq * 2 + e;
            sa_ok[f][e] = tt < rows;
            sap[f][e] =
                reinterpret_cast<const float *>(smem + L.sa) + (sa_ok[f][e] ? tt : 0) * p.nb + b0;
        }
    const unsigned short *sws =
        reinterpret_cast<const unsigned short *>(smem + L.sw) + b0 * WT * 16 + (warp % WT) * 16 + g;
    /* chunks [c0, c0 + DK_U): MMA per k32 step, promotion per block */
    auto compute = [&](int c0) {
        if (p.ablate & 16) { /* profiling: the weights are loaded and folded, no MMA */
#pragma unroll
            for (int j = 0; j < DK_U; j++)
                if (c0 + j < nch)
                    acc[0][0] = __int_as_float(__float_as_int(acc[0][0]) ^
                                               (int)(w[j].x ^ w[j].y ^ w[j].z ^ w[j].w));
            return;
        }
#pragma unroll
        for (int jb = 0; jb < NBU; jb++) {
            if (c0 + jb * KPB >= nch)
                break;
            /* two independent mma chains per block (k32 steps alternate), summed exactly */
            int cs[2][MI][4];
#pragma unroll
            for (int f = 0; f < MI; f++)
#pragma unroll
                for (int r = 0; r < 4; r++)
                    cs[0][f][r] = 0, cs[1][f][r] = 0;
#pragma unroll
            for (int c = 0; c < KPB; c++) {
                const int j = jb * KPB + c;
#pragma unroll
                for (int st = 0; st < 2; st++) {
                    const uint32_t w0 = st ? w[j].z : w[j].x, w1 = st ? w[j].w : w[j].y;
                    const uint32_t a0 = lo16x(w0), a1 = hi16x(w0), a2 = lo16x(w1), a3 = hi16x(w1);
#pragma unroll
                    for (int f = 0; f < MI; f++) {
                        const uint8_t *q = act + (f * 8 + g) * RS + (size_t)(c0 + j) * 64 + st * 32;
                        const bool live = f * 8 + g < rows;
                        const uint32_t bb0 = live ? *reinterpret_cast<const uint32_t *>(q) : 0u;
                        const uint32_t bb1 =
                            live ? *reinterpret_cast<const uint32_t *>(q + 16) : 0u;
                        mma_s8(cs[st][f], a0, a1, a2, a3, bb0, bb1);
                    }
                }
            }
            const int bl = c0 / KPB + jb; /* block index within the warp's share */
            /* x 1/16 (exact) for the x16 weight codes */
            const float swf[2] = {f16f(sws[bl * WT * 16]) * 0.0625f,
                                  f16f(sws[bl * WT * 16 + 8]) * 0.0625f};
#pragma unroll
            for (int f = 0; f < MI; f++)
#pragma unroll
                for (int r = 0; r < 4; r++) {
                    const int ci = cs[0][f][r] + cs[1][f][r], tt = f * 8 + tq * 2 + (r & 1);
                    const float sa = sa_ok[f][r & 1] ? sap[f][r & 1][bl] : 0.0f;
                    acc[f][r] = fmaf((float)ci, sa * swf[r >> 1], acc[f][r]);
                    if (BSUM) {
                        const int t = t0 + tt, n = nt * 16 + g + (r >> 1) * 8;
                        if (t < p.M && n < p.N)
                            p.bsum[((size_t)t * p.N + n) * p.nb + b0 + bl] = ci >> 4;
                    }
                }
        }
    };
    for (int c0 = 0; c0 < nch; c0 += DK_U) {
        if (c0 > 0)
            issue(c0);
        compute(c0);
    }
    if (p.ablate & 8) { /* profiling: no reduction; the sums stay live through this store */
        if (acc[0][0] == 1.2345e-30f)
            store_out(p, 0, 0, acc[0][1]);
        return;
    }

    /* the warps' partial tiles, summed over the WK warps of each tile in K order */
    float *red = reinterpret_cast<float *>(smem + L.red);
    store_acc_tile<MI>(red, warp * 16, TT, acc, g, tq);
    __syncthreads();
    for (int i = threadIdx.x; i < WT * 16 * TT; i += DK_WARPS * 32) {
        const int ti = i / (16 * TT), row = i / TT % 16, tt = i % TT;
        float v = 0.0f;
#pragma unroll
        for (int k = 0; k < WK; k++)
            v += red[((k * WT + ti) * 16 + row) * TT + tt];
        const int n = (blockIdx.x * WT + ti) * 16 + row, t = t0 + tt;
        if (t < p.M && n < p.N)
            store_out(p, t, n, v);
    }
}

} // namespace
