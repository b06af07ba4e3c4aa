/* gemm_w4ax_pipe.cuh — the pipe kernel (M <= 16 on sm_90 with N/16 at least the SM count, M <=
 * 32 up to 2x): persistent CTAs own whole 16-row weight tiles over all of K, each warp
 * streaming its share of K through a cp.async ring. Part of gemm_w4ax.cu's one translation unit
 * (it includes every gemm_w4ax_*.cuh in order), so the kernels compile exactly as one file
 * would.
 */
#pragma once

#include "backend/cuda/gemm_w4ax_stream.cuh"

namespace {

/* Pipe kernel (M <= 16 on sm_90 when N/16 >= the SM count, M = 17-32 up to 2x it: KERNEL_RULES). A
 * work item is PT 16-row weight tiles (plan_pipe) x one group of 8*MI tokens over all of K: no
 * split-K, nothing handed between CTAs; the PT tiles share one copy of the token rows and one
 * load of each block's B fragments (PT = 2 took 0.86-0.90x the time of PT = 1 at
 * M = 1-8 and 0.69-0.76x at M = 12-16, geomean). The grid is persistent, c CTAs per SM (make_plan
 * picks c so that the items spread evenly) walking the items blockIdx.x, + gridDim.x, ... Each
 * of the PP_WARPS warps owns every PP_WARPS-th 128-channel stage of an item and streams it
 * through its own ring of p.pp_depth shared-memory slots with cp.async (codes, weight scales
 * and token codes in 16-byte pieces, activation scales in 4-byte ones): the warp issues
 * position q + depth - 1 of its (item, stage) sequence before it computes position q, runs
 * ahead across item boundaries, and meets the other warps only once per item, when their
 * partial tiles are summed through shared memory in warp order (deterministic) and stored. So
 * the bytes in flight per SM are set by the rings, not by registers (the stream kernel's loads
 * are latency bound: three dependent rounds per warp, 24 % occupancy), and there is no split-K
 * hand-off. Its own limit is issue: 8 warps per CTA and 1-3 CTAs per SM (12.5-37.5 %
 * occupancy), which more tiles per item relieve (fewer instructions per weight byte); with one
 * tile per item it won at M = 9-16 only up to 3 tiles per SM, with 2-4 on every
 * LLaMA-3 shape.
 * Measured and dropped (bench/results/gemm-history.md, step 4): a producer warp issuing
 * 1-D bulk copies (TMA) into a CTA-wide ring on mbarriers (slower than the stream kernel on
 * every LLaMA-3 shape at M = 1 but one), 4 warps per CTA (8 are 3-5 % faster at M = 1-8); and
 * (bench/results/gemm-history.md, step 14) a CTA keeping its token group's rows
 * resident in shared memory for all its items, the rings carrying weights only (1.03-1.26x
 * the time at M = 1-16: the one-time copy and barrier sit on the critical path). */
constexpr int PP_WARPS = 8, PP_RS = 128 + 16, PP_MAX_DEPTH = 8, PP_MAX_TILES = 4;
constexpr int PP_MAX_CTAS = 3; /* CTAs per SM (__launch_bounds__: 85 registers) */
/* CTAs per SM that an instance with PT weight tiles per item is built for (__launch_bounds__):
 * its PT x MI x 4 accumulators, and the B fragments kept for the PT tiles, spill at the 85
 * registers of three CTAs from 12 accumulators up, and at the 128 of two with 32 (ptxas -v) */
__host__ __device__ constexpr int pp_max_ctas(int pt, int mi) {
    return pt * mi <= 2 ? PP_MAX_CTAS : pt * mi <= 6 ? 2 : 1;
}
/* slot of PT weight tiles: codes [PT tiles][2 chunks x 512], weight scales [PT][2 blocks x 16
 * rows] fp16, activation scales [2 blocks x 16 tokens] fp32, token codes [rows x PP_RS] (2
 * blocks: B = 64) */
__host__ __device__ constexpr int pp_sw_off(int pt) { return pt * 1024; }
__host__ __device__ constexpr int pp_sa_off(int pt) { return pp_sw_off(pt) + pt * 2 * 32; }
__host__ __device__ constexpr int pp_a_off(int pt) { return pp_sa_off(pt) + 2 * 16 * 4; }
/* Slots start on 128-byte boundaries: with 16- or 32-byte ones (token rows 2, 3, 5, 7) the kernel
 * ran 5-19 % slower (same-run A/B, 11 LLaMA shapes x M = 2-16: 0.81-1.00x the time, 0.955x
 * geomean, no case slower; bench/results/gemm-history.md, step 6). */
constexpr int PP_SLOT_ALIGN = 128;
__host__ __device__ constexpr int pp_slot_bytes(int rows, int pt) {
    return (pp_a_off(pt) + rows * PP_RS + PP_SLOT_ALIGN - 1) / PP_SLOT_ALIGN * PP_SLOT_ALIGN;
}
/* The partial tiles of an item's warps, double-buffered by item up to 16 x 16 outputs per warp
 * (one barrier per item), else single (two barriers). A warp's tile is token-major, rows of
 * pp_red_ld floats, so that the sum runs along the weight rows, four per thread, and its stores
 * are contiguous in y (weight-row-major before, one token row per lane, so that a
 * warp's store touched 16 token rows: 0.95x the time at M = 12-16 in geomean, 0.85x on 8B o at
 * M = 16, CUDA graphs with pdl). The fragment stores (4 tokens x 8 rows per warp store) would
 * hit the same banks for the 4 tokens; at 8-token groups the rows are padded to 16 PT + 4, at
 * 16 the weight row `row` of token tt sits at column pp_red_col instead: bits 3-4 (PT even; bit
 * 3 at PT odd, which keeps it among the tile's rows) XORed with bits 1-2 of the token, 32
 * banks at PT even and 2 ways at PT odd, with no padding, so that the 16-token plans' rings
 * get the room (padded rows left 8B gate_up and 70B qkv at M = 16 a ring slot
 * short, 0.92x / 0.97x the time with it; at 8-token groups the swizzle cost 1.01x in geomean,
 * 1.02x on 8B qkv at M = 1-4). Groups of
 * 4 rows stay 16-byte aligned. */
__host__ __device__ constexpr bool pp_red2(int mi, int pt) { return pt * mi <= 2; }
__host__ __device__ constexpr int pp_red_ld(int mi, int pt) { return 16 * pt + (mi == 1 ? 4 : 0); }
__host__ __device__ constexpr int pp_red_bytes(int mi, int pt) {
    return (pp_red2(mi, pt) ? 2 : 1) * PP_WARPS * pp_red_ld(mi, pt) * 8 * mi * 4;
}
template <int MI, int PT>
__device__ __forceinline__ int pp_red_col(int row, int tt) {
    return MI == 1 ? row : row ^ (((tt >> 1) & (PT % 2 ? 1 : 3)) << 3);
}

template <int MI, int KPB, int PT, bool BSUM>
__global__ void __launch_bounds__(PP_WARPS * 32, pp_max_ctas(PT, MI))
    w4ax_pipe_kernel(const __grid_constant__ params p) {
    constexpr int TT = 8 * MI, BPS = 2 / KPB; /* blocks per stage */
    constexpr int SW_OFF = pp_sw_off(PT), SA_OFF = pp_sa_off(PT), A_OFF = pp_a_off(PT);
    extern __shared__ __align__(16) uint8_t smem[];
    const int depth = p.pp_depth, slot_bytes = pp_slot_bytes(p.pp_rows, PT);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    uint8_t *ring = smem + (size_t)warp * depth * slot_bytes;
    float *red = reinterpret_cast<float *>(smem + (size_t)PP_WARPS * depth * slot_bytes);
    const int np16 = p.Np / 16, k64 = p.K / 64, nstage = (k64 + 1) / 2;
    const int ni = (np16 + PT - 1) / PT, n_items = ni * p.tiles_m; /* items along N, in all */
    const size_t tile_stride = (size_t)k64 * 512; /* bytes between two 16-row tiles' codes */
    const bool out4 = out4_ok(p);
    pdl_trigger();

    /* Copy position (l_item, l_s) of this warp's sequence into ring slot l_slot (one commit
     * group, empty past the last item) and step on. Everything that depends only on the lane
     * or the item is computed outside the per-stage path, which is 5-8 cp.async (PT = 1) and
     * pointer increments: the issue cost per byte decides this kernel's speed (ncu, 70B down at
     * M = 1: 78 % of issue slots busy, 255 instructions per KB of weights before this). */
    int l_item = warp < nstage ? (int)blockIdx.x : n_items, l_s = warp, l_npt = 0;
    const uint32_t ring_s = smem_u32(ring), ring_end = ring_s + depth * slot_bytes;
    uint32_t l_slot = ring_s;
    const uint8_t *l_w = nullptr, *l_a = nullptr;
    const uint16_t *l_sw = nullptr;
    const float *l_sa = nullptr;
    bool l_sa_ok = false;
    /* A slot's token rows as 16-byte pieces lane + 32 k: this lane copies bytes 16 (lane & 7)
     * of rows a_r0 + 4 k, from l_a + k a_step (global) to l_slot + d_a0 + k 4 PP_RS; l_a_rows
     * is the item's token rows past a_r0 (pieces 4 k < l_a_rows exist). One base and constant
     * strides: with an offset pair per piece (a 32-bit shared and a 64-bit global offset, four
     * pieces at 16 tokens) the registers ran out at 128 per thread and ptxas recomputed each
     * address in every position (~40 instructions for 4 copies, SASS of the 16-token
     * instances). */
    const int a_r0 = lane >> 3;
    const uint32_t d_a0 = A_OFF + a_r0 * PP_RS + (lane & 7) * 16;
    const size_t a_step = (size_t)4 * p.K;
    int l_a_rows = 0;
    /* this lane's weight codes (of the item's first tile) and scales at stage st of the item
     * whose first tile is nt0: lanes 4 pt + x copy 16 bytes of tile pt's scales (block x / 2,
     * rows 8 (x & 1) ...) */
    auto w_at = [&](int nt0, int st) {
        return p.qw + ((size_t)nt0 * k64 + 2 * (size_t)st) * 512 + lane * 16;
    };
    auto sw_at = [&](int nt0, int st) {
        return p.sw + (size_t)(st * BPS + ((lane & 3) >> 1)) * p.Np + (nt0 + (lane >> 2)) * 16 +
               (lane & 1) * 8;
    };
    auto start_item = [&]() { /* pointers at stage l_s of item l_item */
                              if (l_item >= n_items)
                                  return;
                              const int nt0 = l_item % ni * PT, t0 = l_item / ni * TT,
                                        ta = t0 + (lane & (TT - 1));
                              const int rows = min(TT, p.M - t0);
                              l_npt = PT == 1 ? 1 : min(PT, np16 - nt0);
                              l_w = w_at(nt0, l_s);
                              l_sw = sw_at(nt0, l_s);
                              l_sa =
                                  p.sa + (size_t)(ta < p.M ? ta : 0) * p.nb + l_s * BPS + lane / TT;
                              l_sa_ok = ta < p.M; /* tokens past M read as 0 */
                              l_a = reinterpret_cast<const uint8_t *>(p.qa) +
                                    (size_t)(t0 + a_r0) * p.K + (lane & 7) * 16 + (size_t)l_s * 128;
                              l_a_rows = rows - a_r0;
    };
    start_item();
    /* a position's weights: codes (one or two k64 chunks) and weight scales of the item's
     * tiles; the slots of tiles past np16 (the last item along N of PT > 1) are zero-filled,
     * so that the compute needs no case for them */
    auto copy_w = [&](uint32_t slot, const uint8_t *w, const uint16_t *sw, bool two, int npt) {
        if (PT == 1) {
            cp_async16_s(slot + lane * 16, w);
            if (two)
                cp_async16_s(slot + 512 + lane * 16, w + 512);
            if (lane < (two ? 2 * BPS : 2))
                cp_async16_s(slot + SW_OFF + lane * 16, sw);
        } else {
#pragma unroll
            for (int pt = 0; pt < PT; pt++) {
                const uint8_t *wp = pt < npt ? w + pt * tile_stride : w;
                cp_async16_sz(slot + pt * 1024 + lane * 16, wp, pt < npt);
                if (two)
                    cp_async16_sz(slot + pt * 1024 + 512 + lane * 16, wp + 512, pt < npt);
            }
            if ((lane >> 2) < PT && (lane & 3) < (two ? 2 * BPS : 2))
                cp_async16_sz(slot + SW_OFF + lane * 16, (lane >> 2) < npt ? sw : p.sw,
                              (lane >> 2) < npt);
        }
    };
    /* parts: 1 = the weights, 2 = the activations (scales, codes) and the commit, 3 = both */
    auto issue_next = [&](int parts) {
        if (l_item < n_items) {
            /* a half stage (one k64 chunk) only at the end of K with B = 64 */
            const bool two = KPB == 2 || 2 * l_s + 2 <= k64;
            if (parts & 1)
                copy_w(l_slot, l_w, l_sw, two, l_npt);
            if (parts & 2) {
                if (lane < (two ? BPS * TT : TT))
                    cp_async4_s(l_slot + SA_OFF + lane * 4, l_sa, l_sa_ok);
                constexpr int PIECES = TT / 4;
#pragma unroll
                for (int k = 0; k < PIECES; k++)
                    if (4 * k < l_a_rows && (two || (lane & 7) < 4))
                        cp_async16_tok_s(l_slot + d_a0 + k * 4 * PP_RS, l_a + k * a_step);
            }
            l_s += PP_WARPS;
            if (l_s < nstage) {
                l_w += PP_WARPS * 1024, l_a += PP_WARPS * 128, l_sa += PP_WARPS * BPS;
                l_sw += (size_t)PP_WARPS * BPS * p.Np;
            } else {
                l_item += gridDim.x, l_s = warp;
                start_item();
            }
            l_slot += slot_bytes;
            if (l_slot == ring_end)
                l_slot = ring_s;
        }
        if (parts & 2)
            cp_async_commit();
    };
    /* launched early: the weights of the first n_early positions go out before the wait, the
     * same walk as issue_next. They join the first position's commit group (cp.async groups
     * complete in order, and that position's token rows can only be copied after the wait), so
     * the first position waits for all of them: p.pp_early, at most depth - 1, is the plan's
     * (plan_pipe) */
    const int n_early = p.pdl ? min(depth - 1, p.pp_early) : 0;
    if (n_early > 0) {
        int it = l_item, st = l_s;
        for (int d = 0; d < n_early && it < n_items; d++) {
            const int nt0 = it % ni * PT;
            copy_w(ring_s + d * slot_bytes, w_at(nt0, st), sw_at(nt0, st),
                   KPB == 2 || 2 * st + 2 <= k64, min(PT, np16 - nt0));
            st += PP_WARPS;
            if (st >= nstage)
                it += gridDim.x, st = warp;
        }
    }
    pdl_wait(); /* everything below reads the activations */
    for (int d = 0; d < depth - 1; d++)
        issue_next(d < n_early ? 2 : 3);

    /* this lane's token row and byte offset in the ldmatrix.x4 of B fragments (load_b): matrix
     * lane / 8, row lane % 8; at 16 tokens matrices (tokens 0-7 | 8-15) x (k 0-15 | 16-31) of one
     * k32 step, at 8 tokens k 0-15 | 16-31 | 32-47 | 48-63 of two */
    const int ldsm_row = MI == 2 ? (lane >> 4) * 8 + (lane & 7) : lane & 7;
    const int ldsm_col = MI == 2 ? ((lane >> 3) & 1) * 16 : (lane >> 3) * 16;
    /* The items, with the ring depth D as a compile-time constant (DC: std::integral_constant):
     * the wait for a position (cp.async.wait_group takes an immediate) and the slot index then
     * cost no run-time dispatch. Dispatched once per kernel below; before, a
     * switch on the depth in every position, ~12 instructions and an indirect branch. */
    auto run_items = [&](auto DC) {
        constexpr int D = decltype(DC)::value;
        int slot = 0, par = 0;
        for (int item = blockIdx.x; item < n_items; item += gridDim.x) {
            const int nt0 = item % ni * PT, t0 = item / ni * TT, rows = min(TT, p.M - t0);
            const int ldsm_off =
                min(ldsm_row, rows - 1) * PP_RS + ldsm_col; /* rows past the tokens: the last */
            float acc[PT][MI][4];
#pragma unroll
            for (int pt = 0; pt < PT; pt++)
                zero_acc<MI>(acc[pt]);
            for (int s = warp; s < nstage; s += PP_WARPS) {
                issue_next(3);
                cp_async_wait<D - 1>(); /* this position has landed (this lane's copies) */
                __syncwarp();           /* ... and every lane's */
                const uint8_t *st = ring + slot * slot_bytes;
                const int nblk = KPB == 2 ? 1 : min(2, k64 - 2 * s);
#pragma unroll
                for (int j = 0; j < BPS; j++) {
                    if (j >= nblk)
                        break;
                    /* the block's B fragments (token codes) and activation scales, shared by the PT
                 * tiles: with PT = 1 loaded where the first tile uses them
                 * (loaded first, it ran 1.07-1.14x the time at M = 2-8); with PT > 1 all loaded
                 * first (where the first tile uses them, ptxas spilled 8-20 bytes). Both measured
                 * with one 4-byte load per fragment register, not since. */
                    constexpr bool LAZY = PT == 1;
                    uint32_t bf[2 * KPB][MI][2];
                    float2 sa2[MI];
                    const float *sas =
                        reinterpret_cast<const float *>(st + SA_OFF) + j * TT + tq * 2;
                    const int b = s * BPS + j;
                    /* The B fragments by ldmatrix.x4 (8 x 8 b16 matrices: lane l's 4 bytes of row
                 * l / 4 are the fragment's k 4 tq .. 4 tq + 3 of token g): at 16 tokens one
                 * k32 step's b0, b1 of both token groups, at 8 two steps' (x, x + 1). Four
                 * 4-byte loads per instruction (before, one per fragment register,
                 * zero for rows past the item's tokens). Those rows now read the item's last
                 * token row again (ldsm_off): their sums land in outputs that are never stored,
                 * scaled by activation scales the copies zero-filled. (Read unclamped, they lay
                 * past a slot of fewer rows -- in the next slot's weights, or past a warp's last
                 * slot in the next warp's ring or the reduction buffer -- and racecheck reported
                 * them against those copies.) */
                    auto load_b = [&](int x) { /* at x odd with 8 tokens: loaded with x - 1 */
                                               if (MI == 1 && (x & 1))
                                                   return;
                                               uint32_t r[4];
                                               ldsm_x4(r, st + A_OFF + j * KPB * 64 + x * 32 +
                                                              ldsm_off);
                                               bf[x][0][0] = r[0], bf[x][0][1] = r[1];
                                               bf[MI == 1 ? x + 1 : x][MI - 1][0] = r[2],
                                                                            bf[MI == 1 ? x + 1 : x]
                                                                              [MI - 1][1] = r[3];
                    };
                    if (!LAZY) {
#pragma unroll
                        for (int x = 0; x < 2 * KPB; x++)
                            load_b(x);
#pragma unroll
                        for (int f = 0; f < MI; f++)
                            sa2[f] = *reinterpret_cast<const float2 *>(sas + f * 8);
                    }
#pragma unroll
                    for (int pt = 0; pt < PT; pt++) {
                        /* PT = 1: one accumulator per k32 step, 2*KPB independent mma chains instead
                     * of one chain of 2*KPB (M = 1 was bound by the mma latency), summed exactly.
                     * PT > 1: one chain per tile and token group, PT*MI independent ones, which
                     * saves the integer add per output and block that two chains per tile
                     * cost: 0.979-0.987x the time at M = 12-32, 0.992-0.995x at
                     * M = 1-8 (same-run A/B in CUDA graphs with pdl, 8 LLaMA-3
                     * shapes); no production instance spills either way */
                        constexpr int NCH = PT == 1 ? 2 * KPB : 1;
                        int cs[NCH][MI][4];
#pragma unroll
                        for (int c = 0; c < KPB; c++) {
                            const uint8_t *wp = st + pt * 1024 + (j * KPB + c) * 512 + lane * 16;
                            const uint4 w = *reinterpret_cast<const uint4 *>(wp);
#pragma unroll
                            for (int k2 = 0; k2 < 2; k2++) {
                                const uint32_t w0 = k2 ? w.z : w.x, w1 = k2 ? w.w : w.y;
                                const int x = c * 2 + k2;
#pragma unroll
                                for (int f = 0; f < MI; f++) {
                                    if (LAZY && pt == 0 && f == 0)
                                        load_b(x);
                                    if (x < NCH)
#pragma unroll
                                        for (int r = 0; r < 4; r++)
                                            cs[x][f][r] = 0;
                                    mma_s8(cs[x % NCH][f], lo16x(w0), hi16x(w0), lo16x(w1),
                                           hi16x(w1), bf[x][f][0], bf[x][f][1]);
                                }
                            }
                        }
                        int ci[MI][4];
#pragma unroll
                        for (int f = 0; f < MI; f++)
#pragma unroll
                            for (int r = 0; r < 4; r++) {
                                ci[f][r] = cs[0][f][r];
#pragma unroll
                                for (int x = 1; x < NCH; x++)
                                    ci[f][r] += cs[x][f][r];
                            }
                        const unsigned short *swp = reinterpret_cast<const unsigned short *>(
                            st + SW_OFF + pt * 64 + j * 32);
                        const float swf[2] = {f16f(swp[g]) * 0.0625f, f16f(swp[g + 8]) * 0.0625f};
#pragma unroll
                        for (int f = 0; f < MI; f++) {
                            if (LAZY && pt == 0)
                                sa2[f] = *reinterpret_cast<const float2 *>(sas + f * 8);
#pragma unroll
                            for (int r = 0; r < 4; r++) {
                                const float sa = (r & 1) ? sa2[f].y : sa2[f].x;
                                acc[pt][f][r] =
                                    fmaf((float)ci[f][r], sa * swf[r >> 1], acc[pt][f][r]);
                                if (BSUM) {
                                    const int t = t0 + f * 8 + tq * 2 + (r & 1),
                                              n = (nt0 + pt) * 16 + g + (r >> 1) * 8;
                                    if (t < p.M && n < p.N)
                                        p.bsum[((size_t)t * p.N + n) * p.nb + b] = ci[f][r] >> 4;
                                }
                            }
                        }
                    }
                }
                __syncwarp(); /* the slot is refilled by the next issue */
                slot = slot + 1 == D ? 0 : slot + 1;
            }
            /* sum the warps' partial tiles in warp order; double-buffered by item, one barrier per
         * item suffices (a warp reaches the next item's barrier only after every warp has read
         * this item's buffer); single-buffered, the first barrier waits for the previous item's
         * reads. Tiles past np16 hold zeros and are not stored. */
            constexpr int ROWS = 16 * PT, LD = pp_red_ld(MI, PT);
            float *rb = red + (pp_red2(MI, PT) ? par : 0) * (PP_WARPS * TT * LD);
            if (!pp_red2(MI, PT))
                __syncthreads();
#pragma unroll
            for (int pt = 0; pt < PT; pt++)
                store_acc_tile_t<MI>(rb, warp * TT, pt * 16, LD, acc[pt], g, tq,
                                     [](int row, int tt) { return pp_red_col<MI, PT>(row, tt); });
            __syncthreads();
            for (int i = threadIdx.x; i < ROWS / 4 * TT; i += PP_WARPS * 32) {
                const int row = i % (ROWS / 4) * 4, tt = i / (ROWS / 4), t = t0 + tt;
                float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
                for (int w = 0; w < PP_WARPS; w++) {
                    const float4 x = *reinterpret_cast<const float4 *>(rb + (w * TT + tt) * LD +
                                                                       pp_red_col<MI, PT>(row, tt));
                    v.x += x.x, v.y += x.y, v.z += x.z, v.w += x.w;
                }
                if (t < p.M)
                    store_out4(p, t, nt0 * 16 + row, v, out4);
            }
            par ^= 1;
        }
    };
    static_assert(PP_MAX_DEPTH == 8, "one case per ring depth");
    switch (depth) {
    case 2: run_items(std::integral_constant<int, 2>{}); break;
    case 3: run_items(std::integral_constant<int, 3>{}); break;
    case 4: run_items(std::integral_constant<int, 4>{}); break;
    case 5: run_items(std::integral_constant<int, 5>{}); break;
    case 6: run_items(std::integral_constant<int, 6>{}); break;
    case 7: run_items(std::integral_constant<int, 7>{}); break;
    case 8: run_items(std::integral_constant<int, 8>{}); break;
    default: __trap(); /* plan_pipe clamps the depth to 2..PP_MAX_DEPTH */
    }
    cp_async_wait<0>();
}

} // namespace
