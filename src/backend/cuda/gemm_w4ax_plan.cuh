/* gemm_w4ax_plan.cuh — the W4Ax GEMM's host side before the launch: the plan (make_plan: which
 * kernel, tile, split and grid for M, N, K and the device, each rule with its reason and
 * measurement), the device queries it caches, the workspace layout and the argument checks.
 * Part of gemm_w4ax.cu's one translation unit (it includes every gemm_w4ax_*.cuh in order), so
 * the kernels compile exactly as one file would.
 */
#pragma once

#include "backend/cuda/gemm_w4ax_wgmma.cuh"

#include <mutex>
#include <stdio.h>
#include <string.h>

namespace {

constexpr int STREAM_WARPS = 4;
constexpr int STREAM_MAX_RANGE = 2048; /* bytes of K per CTA (bounds shared memory) */
constexpr int STREAM_MAX_CLUSTER = 8;  /* portable cluster size */
constexpr int WS_MAX_CLUSTER = 8;
/* Wave-filling global split-K (make_plan): the per-CTA fixed cost (start-up, pipeline fill,
 * epilogue) in units of one block's time, and the most splits considered. */
constexpr int WS_CTA_COST = 2, WS_MAX_GLOBAL_SPLITS = 16;
/* Stream-K (make_plan): a CTA's cost of its partial tiles in blocks, the percent of the other
 * plan's modelled time it must reach, and the most waves of 128-token tiles it is tried for. */
constexpr int WS_SK_COST = 12, WS_SK_GAIN = 90, WS_SK_MAX_WAVES = 4;
/* Global split-K (make_plan): the percent of the cluster plan's modelled time it must reach */
constexpr int WS_GLOBAL_GAIN = 90;

struct plan_t {
    comet_w4ax_kernel kernel;
    int MI, S;
    int tok; /* wgmma: tokens per CTA tile (16, 32, 64 or 128) */
    int tiles_n, tiles_m;
    int pp_depth, pp_rows,
        pp_ctas;    /* pipe: ring slots per warp, token rows per slot, CTAs per SM */
    int pp_tiles;   /* pipe: 16-row weight tiles per item (1..PP_MAX_TILES) */
    int pp_early;   /* pipe, with pdl only: positions whose weights go before the wait */
    bool cluster;   /* stream: the S splits of a tile form a cluster and reduce on chip */
    bool streamk;   /* wgmma: one CTA per SM, each with an equal share of tiles x blocks */
    bool persist;   /* wgmma, 128-token tiles past one wave: one CTA per SM, whole tiles in turn */
    bool pdl;       /* launch with programmatic stream serialization (g->pdl where pdl_supported) */
    bool invariant; /* the batch-invariant plan (batch_invariant_call) */
    int carveout;   /* shared memory asked of each SM, % of its maximum (a launch hint); 0: none */
    dim3 grid, block;
    size_t smem, ws_bytes;
};

/* Devices whose properties the host code caches (per-device tables; a device past this is
 * asked again on every call). */
constexpr int MAX_DEV = 16;

/* The current device's ordinal, or -1 (error cleared) when there is none. */
int current_device() {
    int dev = -1;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        cudaGetLastError(); /* clear */
        return -1;
    }
    return dev;
}

/* An attribute of the current device (SM count, compute capability major, shared memory per
 * SM and per block with opt-in), cached per device (the plans ask for them on every call);
 * `fallback` when the query fails. */
int device_attr(cudaDeviceAttr attr, int fallback) {
    static const cudaDeviceAttr kinds[] = {
        cudaDevAttrMultiProcessorCount, cudaDevAttrComputeCapabilityMajor,
        cudaDevAttrMaxSharedMemoryPerMultiprocessor, cudaDevAttrMaxSharedMemoryPerBlockOptin};
    constexpr int NK = sizeof kinds / sizeof kinds[0];
    static std::mutex mu;
    static int cache[MAX_DEV][NK];
    int v = 0, k = 0;
    while (k < NK - 1 && kinds[k] != attr)
        k++;
    const int dev = current_device();
    if (dev < 0)
        return fallback;
    if (dev < MAX_DEV && kinds[k] == attr) {
        std::lock_guard<std::mutex> lock(mu);
        if (cache[dev][k] == 0 && cudaDeviceGetAttribute(&v, attr, dev) == cudaSuccess && v > 0)
            cache[dev][k] = v;
        v = cache[dev][k];
    } else if (cudaDeviceGetAttribute(&v, attr, dev) != cudaSuccess) {
        v = 0;
    }
    if (v < 1)
        cudaGetLastError();
    return v > 0 ? v : fallback;
}

int sm_count() { return device_attr(cudaDevAttrMultiProcessorCount, 132); }

/* Tile counters at the start of the workspace; partials follow. The counter region has the
 * same size, WS_COUNTERS, in every plan: a workspace is shared by the calls of a stream (the
 * CUDA backend keeps one), and with a region sized per plan one call's partials landed on
 * the next call's counters (LLaMA-3-8B down and qkv at M = 384, both stream-K: qkv's tiles
 * 128-143 were never stored, found in review). A plan with more tiles than that
 * gets a larger region, which comet_cuda_gemm_w4ax zeroes before the launch. */
constexpr size_t WS_COUNTERS = 1 << 16;
size_t counters_needed(const plan_t &pl) {
    return pl.streamk ? (size_t)pl.tiles_n * pl.tiles_m : (size_t)pl.grid.x * pl.grid.y;
}
size_t counter_bytes(const plan_t &pl) {
    const size_t n = counters_needed(pl);
    return ((n > WS_COUNTERS ? n : WS_COUNTERS) * sizeof(unsigned) + 255) / 256 * 256;
}

/* test(attributes of `kernel` on the current device), cached per device in `known` (0 not
 * read yet, 1 true, 2 false); cudaFuncGetAttributes makes no copy and does not synchronize,
 * so this is safe while a CUDA graph is being captured. A failed query is not cached and
 * reads as false. */
template <typename T>
bool device_code_has(std::mutex &mu, int (&known)[MAX_DEV], const void *kernel, T &&test) {
    const int dev = current_device();
    std::lock_guard<std::mutex> lock(mu);
    if (dev >= 0 && dev < MAX_DEV && known[dev])
        return known[dev] == 1;
    cudaFuncAttributes a;
    if (cudaFuncGetAttributes(&a, kernel) != cudaSuccess) {
        cudaGetLastError(); /* clear */
        return false;
    }
    const bool yes = test(a);
    if (dev >= 0 && dev < MAX_DEV)
        known[dev] = yes ? 1 : 2;
    return yes;
}

/* The wgmma kernel runs here: an sm_90 device that loaded this file's sm_90a code. A build
 * for plain sm_90 (CMAKE_CUDA_ARCHITECTURES=90 or native) or sm_80 alone gives that kernel
 * no body (a trap); the plans then use the stream and tiled kernels (sm_80 rules), and
 * forcing the wgmma kernel is refused. Which code the device loaded shows in the kernel's
 * registers, read with cudaFuncGetAttributes (no copy, no synchronization: safe while a CUDA
 * graph is being captured): the instance asked, 128-token tiles at B = 128, holds 168 per
 * thread in sm_90a code (launch bounds: one CTA of 384 threads, the whole register file),
 * the trap 4 (24 in a -G debug build). Cached per device (device_code_has); a failed query
 * plans as without sm_90a code. */
constexpr int WS_MIN_REGS = 96;
bool has_wgmma() {
    if (device_attr(cudaDevAttrComputeCapabilityMajor, 0) != 9)
        return false;
    static std::mutex mu;
    static int known[MAX_DEV];
    return device_code_has(mu, known, (const void *)w4ax_ws_kernel<2, 128, false>,
                           [](const cudaFuncAttributes &a) { return a.numRegs >= WS_MIN_REGS; });
}

/* Whether this device runs kernels of this file that hold the programmatic-dependent-launch
 * instructions (pdl_trigger / pdl_wait exist from sm_90 code on): the device must be sm_90 or
 * newer AND the loaded code compiled for it. A "90a;80" build on a newer GPU runs the
 * compute_80 PTX, JIT-compiled, which has no wait: launched early it would race. Read from a
 * kernel's PTX version, cached per device (device_code_has). */
bool pdl_supported() {
    if (device_attr(cudaDevAttrComputeCapabilityMajor, 0) < 9)
        return false;
    static std::mutex mu;
    static int known[MAX_DEV];
    return device_code_has(mu, known, (const void *)w4ax_pipe_kernel<1, 1, 1, false>,
                           [](const cudaFuncAttributes &a) { return a.ptxVersion >= 90; });
}

int ws_cluster_capacity(int kpb, int tok, int S);

/* The device facts make_plan reads, and all it reads of the device: production takes them
 * from the CUDA queries above (current_plan_device, each cached per device). */
struct plan_device {
    int sms;        /* SM count */
    int smem_sm;    /* shared memory per SM, bytes */
    int smem_optin; /* opt-in shared memory per block, bytes */
    bool wgmma;     /* an sm_90 device running this file's sm_90a code (has_wgmma) */
    bool pdl;       /* programmatic dependent launch works here (pdl_supported) */
    int (*cluster_capacity)(int kpb, int tok, int S); /* wgmma clusters of S resident at once */
};

int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* The most dynamic shared memory any plan asks of one CTA (the wgmma kernel's rings, the pipe
 * kernel's ring budget at one CTA per SM): static_asserts and plan_pipe hold the plans to it. The persistent wgmma plans alone go past it,
 * to at most MAX_SMEM_SM90 (they exist on sm_90 only, whose opt-in limit is 227 KB). Raising
 * MAX_SMEM itself deepens the pipe kernel's rings at one CTA per SM, which measured slower
 * (the 8B chain at M = 12-16 ran 2.98x FP16 with it against 3.09x,
 * bench/results/2026-12-03-h200-gemm-s19.md). */
constexpr int MAX_SMEM = 160 * 1024, MAX_SMEM_SM90 = 227 * 1024;

/* Allow `kernel` `bytes` of dynamic shared memory on the current device. Above 48 KB this
 * must be set per kernel and per device (the attribute lives in the device's context), and
 * it may not exceed the device's opt-in limit (227 KB on sm_90, 163 KB on sm_80, 99 KB on
 * sm_86 / 89 / 120). The largest value set is remembered per (device, kernel). */
cudaError_t allow_smem(const void *kernel, size_t bytes) {
    if (bytes <= 48 * 1024)
        return cudaSuccess;
    struct entry {
        int dev;
        const void *kernel;
        size_t bytes;
    };
    static std::mutex mu;
    static entry done[1024]; /* 137 kernel instances per device today */
    static int n_done = 0;
    const int dev = current_device();
    std::lock_guard<std::mutex> lock(mu);
    int i = 0;
    while (i < n_done && !(done[i].dev == dev && done[i].kernel == kernel))
        i++;
    if (i < n_done && done[i].bytes >= bytes)
        return cudaSuccess;
    cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (e != cudaSuccess)
        return e;
    if (i < n_done)
        done[i].bytes = bytes;
    else if (n_done < 1024)
        done[n_done++] = entry{dev, kernel, bytes};
    return cudaSuccess;
}

/* Shared memory of one SM (bytes), for sizing the pipe kernel's rings. */
int sm_smem_bytes() { return device_attr(cudaDevAttrMaxSharedMemoryPerMultiprocessor, 228 * 1024); }

/* The current device's facts for make_plan. */
plan_device current_plan_device() {
    return {sm_count(),
            sm_smem_bytes(),
            device_attr(cudaDevAttrMaxSharedMemoryPerBlockOptin, MAX_SMEM),
            has_wgmma(),
            pdl_supported(),
            ws_cluster_capacity};
}

/* Where the automatic plan runs the pipe kernel (sm_90), measured on the H200 in same-run A/Bs
 * (CUDA graphs with pdl, 8 LLaMA-3 shapes; bench/results/2026-12-02-h200-gemm-s13). Below one
 * 16-row tile per SM the stream kernel's split-K is needed. Since items hold several weight
 * tiles that share one copy of the token rows (before, the pipe kernel won at
 * M = 9-16 only up to 3 tiles per SM and lost to the wgmma kernel's 16- and 32-token tiles
 * above), it takes 0.71-0.98x the time of the plan without multi-tile items at M = 12-16
 * on all 8 shapes (the
 * wgmma kernel on the 70B shapes and the gate_ups, one-tile pipe items on 8B qkv, o and down),
 * and at M = 17-32 0.72-0.84x the wgmma kernel's on the two with N/16 <= 2x the SMs (8B o and
 * down; 8B qkv, at 2.9x, 1.12x with its best tile count). At M = 17-32 the items are two
 * 16-token groups, so each weight tile is read twice (32-token items were slower: 1.13-1.30x).
 * Not measured: more than 27 tiles per SM (70B gate_up), e.g. an lm_head, where the rule
 * extrapolates. */
constexpr int PP_AUTO_M32_MAX_TILES_PER_SM = 2;
bool pipe_auto(int M, int np16, int sms) {
    return np16 >= sms && (M <= 16 || (M <= 32 && np16 <= PP_AUTO_M32_MAX_TILES_PER_SM * sms));
}

/* The pipe kernel's CTAs per SM for `items` work items: ceil(items / SMs) (one item per CTA)
 * when that many CTAs fit on an SM (cmax), else the value from 2 up to cmax that minimizes the
 * largest share (ties: more CTAs, more warps streaming); with its items per SM (the share). */
struct pp_spread {
    int ctas;
    long share;
};
pp_spread pp_spread_items(long items, int cmax, int sms) {
    const long need = (items + sms - 1) / sms;
    if (need <= cmax)
        return {(int)need, need};
    pp_spread best = {cmax, -1};
    for (int k = cmax < 2 ? cmax : 2; k <= cmax; k++) {
        const long share = (items + (long)sms * k - 1) / ((long)sms * k) * k;
        if (best.share < 0 || share <= best.share)
            best = {k, share};
    }
    return best;
}

/* The pipe kernel's plan: weight tiles per item (PT), CTAs per SM and ring depth. Items (PT
 * 16-row tiles x a token group of 8 MI) are dealt to CTAs round robin (pp_spread_items); each
 * warp's ring then gets its part of the SM's shared memory split c ways (at most PP_MAX_DEPTH
 * slots). The automatic PT (same-run A/B of PT = 1-4 forced, CUDA graphs with pdl,
 * 8 LLaMA-3 shapes): at M <= 8, 2 -- 0.86-0.90x the time of PT = 1 at M = 1-8 (geomean),
 * per shape within 6 % of the best PT (geomean over M; up to 10 % at single points, where 3 or
 * 4 won); from M = 9 (16-token groups), of PT = 2-4 the one whose busiest SM gets the fewest
 * weight tiles, ties to more tiles per item: the fastest of PT = 1-4 on all 8 shapes at M = 12
 * (e.g. 70B qkv: 3, 6 tiles on the busiest SM against 8 with PT = 2, 0.80 against 0.92x the
 * time of the plan without multi-tile items), on 6 of 8 at M = 16 (PT = 3 cost 1.03x on
 * 70B qkv and 1.04x on
 * 8B gate_up). PT = 1 is left out there: its 16 token rows fill most of each ring slot, and it
 * took 1.3-1.8x the time of PT = 2 at M = 12-16 (8B gate_up, which the tile count alone would
 * give PT = 1: 1.21 / 1.33x the wgmma kernel's time at M = 12 / 16) -- unless it halves the
 * busiest SM's tiles (fewer items than SMs otherwise: N/16 below ~1.5x the SMs, no LLaMA-3
 * shape; not measured). */
constexpr int PP_AUTO_TILES_M8 = 2;
/* Token groups of 8 (MI = 1) up to this M; M = 9-16 as two 8-token groups (each weight tile
 * read twice) took 1.33-1.42x the time of 16-token items. */
constexpr int PP_MI1_MAX_M = 8;
void plan_pipe(plan_t &pl, const comet_cuda_w4ax_gemm *g, int np16, const plan_device &dev) {
    pl.MI = g->M <= PP_MI1_MAX_M ? 1 : 2;
    const int tt = 8 * pl.MI, reserve = 1024, smem_sm = dev.smem_sm, sms = dev.sms;
    pl.tiles_m = (g->M + tt - 1) / tt;
    pl.pp_rows = g->M < tt ? g->M : tt;
    /* items, slot bytes per CTA, CTAs per SM and their spread for PT tiles per item */
    auto items_of = [&](int pt) { return (long)((np16 + pt - 1) / pt) * pl.tiles_m; };
    auto slot_of = [&](int pt) { return PP_WARPS * pp_slot_bytes(pl.pp_rows, pt); };
    auto spread_of = [&](int pt) {
        int cmax = pp_max_ctas(pt, pl.MI);
        while (cmax > 1 && smem_sm / cmax - reserve < pp_red_bytes(pl.MI, pt) + 2 * slot_of(pt))
            cmax--;
        return pp_spread_items(items_of(pt), cmax, sms);
    };
    int pt = g->pipe_tiles;
    if (pt == 0) {
        auto busiest = [&](int t) { return spread_of(t).share * t; }; /* tiles on the busiest SM */
        long best = -1;
        pt = 1;
        if (pl.MI == 1 && np16 >= PP_AUTO_TILES_M8) {
            pt = PP_AUTO_TILES_M8, best = busiest(pt);
        } else if (pl.MI > 1) {
            for (int t = 2; t <= PP_MAX_TILES && t <= np16; t++) {
                const long tiles = busiest(t);
                if (best < 0 || tiles <= best)
                    best = tiles, pt = t;
            }
        }
        /* one tile per item where that halves the busiest SM's tiles: fewer items than SMs
         * otherwise (N/16 below ~1.5x the SMs; no LLaMA-3 shape, not measured) */
        if (best > 0 && 2 * busiest(1) <= best)
            pt = 1;
    }
    const long items = items_of(pt);
    const int slot = slot_of(pt), fixed = pp_red_bytes(pl.MI, pt), c = spread_of(pt).ctas;
    int budget = smem_sm / c - reserve;
    /* MAX_SMEM even for a CTA alone on its SM: the opt-in limit's deeper rings measured 1.02x
     * slower */
    budget = budget < MAX_SMEM ? budget : MAX_SMEM;
    pl.pp_tiles = pt;
    pl.pp_depth = clampi((budget - fixed) / slot, 2, PP_MAX_DEPTH);
    pl.pp_ctas = c;
    pl.grid = dim3((unsigned)(items < (long)sms * c ? items : (long)sms * c), 1, 1);
    /* A ring deeper than a warp's work has nothing to overlap: all of it is in flight at once
     * and the compute runs after the last bytes land. Where one CTA runs per SM and its warps
     * have P ring positions each (items x positions per item), the ring is held to P - 1 slots
     * at 8-token groups (at least 3) and P / 2 at 16 (at least 2). With pdl, the weights of the
     * first pp_early positions go out before the wait; they share the first position's cp.async
     * group (kernel above), so at 16-token groups only one does. Same-run A/Bs (CUDA
     * graphs with pdl, 8 LLaMA-3 shapes, bench/results/2026-12-02-h200-gemm-s17.md; the capped
     * ones are 8B qkv and o, P = 4): the caps take 8B o to 0.85-0.90x the time at M = 1-12 and
     * 8B qkv to 0.97x at M = 12; one early position instead of depth - 1 0.98-0.99x at
     * M = 10-16 (8B down 0.98x), none at all 1.02-1.07x at M = 1-8 and 1.02x at M = 10-16; at
     * 8-token groups one or two cost 1.02x on 8B gate_up (M = 1). Measured only where one CTA
     * runs per SM: with two (8B qkv at M <= 8, ring 4) a cap to 3 measured 0.98-1.01x against
     * none, not separated from other changes, so it is left out there. */
    {
        const long per_cta = (items + pl.grid.x - 1) / pl.grid.x;
        const long P = per_cta * (((g->K / 64 + 1) / 2 + PP_WARPS - 1) / PP_WARPS);
        const long cap_d = pl.MI == 1 ? (P - 1 > 3 ? P - 1 : 3) : (P / 2 > 2 ? P / 2 : 2);
        if (c == 1 && pl.pp_depth > cap_d)
            pl.pp_depth = (int)cap_d;
        pl.pp_early = pl.MI == 1 ? pl.pp_depth - 1 : 1;
    }
    pl.block = dim3(PP_WARPS * 32);
    pl.smem = (size_t)pl.pp_depth * slot + fixed;
    pl.S = 1;
    /* The shared memory of the plan's c CTAs and no more, the rest of the SM's 256 KB left to
     * L1. Without it the driver sizes the split for as many CTAs as the shared memory allows, so
     * a ring of 106 KB got a 228 KB carveout and 28 KB of L1: 8B qkv at M = 12 with a 2-slot ring
     * took 6.30 us, 5.04 with this hint, and the whole
     * carveout for shared memory cost 1.03-1.12x the time on 8B o and down at M = 8-16. In
     * CUDA graphs with pdl: without the hint at 8-token groups, one shape repeated, 8B o at
     * M = 1-8 (its ring capped) took 1.08-1.14x the time, the others 0.991-1.002x; in a chain of
     * a model's four layers (bench_gemm --chain, each kernel after one with another carveout)
     * 0.99x at M = 1-4 on 8B, and without the hint on any plan 0.99x there but 1.11x at M = 12
     * (70B: 1.00x). The hint on 16-token groups and capped rings only measured the same as on
     * every plan (0.999x, chain 1.00x), so every plan sends it. */
    pl.carveout = (int)((100L * c * ((long)pl.smem + reserve) + smem_sm - 1) / smem_sm);
}

/* The wgmma kernel's token tile by M (and K at M <= 16). 16-token tiles (three CTAs per SM)
 * against 32-token ones (two) at M = 9-16, same-run A/B on the 8 LLaMA-3 shapes:
 * 0.81-0.91x the time on the 70B shapes (K >= 8192), 1.01-1.10x on the 8B ones with
 * K = 4096, 1.01x on 8B down (K = 14336). */
constexpr int WS_TOK16_MIN_K = 8192;
int ws_auto_tok(int M, int K) {
    return M <= 16 ? (K >= WS_TOK16_MIN_K ? 16 : 32) : M <= 32 ? 32 : M <= 64 ? 64 : 128;
}

/* The kernel of the automatic plan. sm_90: where the 16-row tiles at least fill the SMs, the
 * pipe kernel at M <= 16 (and to 32 on narrow shapes: pipe_auto); below one tile per SM the
 * stream kernel's split-K keeps every SM streaming up to M = 8; from M = 9 otherwise the wgmma
 * kernel. sm_80: the stream kernel up to M = 32, then the tiled one. */
comet_w4ax_kernel auto_kernel(const comet_cuda_w4ax_gemm *g, int np16, const plan_device &dev) {
    const int sms = dev.sms;
    if (!dev.wgmma)
        return g->M <= 32 ? COMET_W4AX_KERNEL_STREAM : COMET_W4AX_KERNEL_TILED;
    if (g->splits == 0 && pipe_auto(g->M, np16, sms))
        return COMET_W4AX_KERNEL_PIPE;
    return g->M <= 8 ? COMET_W4AX_KERNEL_STREAM : COMET_W4AX_KERNEL_WGMMA;
}

/* The batch-invariant plan (g->batch_invariant): a token row's outputs must not depend on M.
 * The stream, wgmma and tiled kernels give the same bits for the same split count S (split s
 * sums blocks [s nb / S, (s + 1) nb / S) in order from 0; the splits are summed in split order
 * from 0.0f, through a cluster or the workspace alike), so S is fixed by N, K and B -- the
 * stream plan's split at M = 1, which keeps decode streaming from every SM -- and M picks only
 * among those kernels. The pipe kernel (warps own strided stages) and stream-K (shares cut by
 * M) would change the sums. */
void batch_invariant_call(comet_cuda_w4ax_gemm &gi, const plan_device &dev) {
    const int sms = dev.sms;
    const int nb = gi.K / gi.B, ctas = ((gi.N + 15) / 16 + STREAM_WARPS - 1) / STREAM_WARPS;
    const int min_s = (nb + STREAM_MAX_RANGE / gi.B - 1) / (STREAM_MAX_RANGE / gi.B);
    const int S = (4 * sms + ctas - 1) / ctas;
    gi.splits = clampi(S < min_s ? min_s : S, 1, nb);
    if (dev.wgmma)
        gi.kernel = gi.M <= 8 ? COMET_W4AX_KERNEL_STREAM : COMET_W4AX_KERNEL_WGMMA;
    else
        gi.kernel = gi.M <= 32 ? COMET_W4AX_KERNEL_STREAM : COMET_W4AX_KERNEL_TILED;
}

/* The plan for g on the device `dev` describes. */
plan_t make_plan(const comet_cuda_w4ax_gemm *g, const plan_device &dev) {
    plan_t pl = {};
    const int sms = dev.sms;
    comet_cuda_w4ax_gemm gi;
    if (g->batch_invariant && g->kernel == COMET_W4AX_KERNEL_AUTO && g->splits == 0) {
        gi = *g;
        batch_invariant_call(gi, dev);
        g = &gi;
        pl.invariant = true;
    }
    const int nb = g->K / g->B, np16 = (g->N + 15) / 16;
    /* programmatic dependent launch where the device and the loaded code have it; asked for
     * elsewhere, the call runs as a plain launch */
    const bool pdl = g->pdl && dev.pdl;
    pl.kernel = g->kernel != COMET_W4AX_KERNEL_AUTO ? g->kernel : auto_kernel(g, np16, dev);
    if (pl.kernel == COMET_W4AX_KERNEL_STREAM) {
        pl.MI = g->M <= 8 ? 1 : g->M <= 16 ? 2 : 4;
        pl.grid =
            dim3((np16 + STREAM_WARPS - 1) / STREAM_WARPS, (g->M + 8 * pl.MI - 1) / (8 * pl.MI), 1);
        int ctas = (int)(pl.grid.x * pl.grid.y);
        int S = (4 * sms + ctas - 1) / ctas;
        int min_s = (nb + STREAM_MAX_RANGE / g->B - 1) / (STREAM_MAX_RANGE / g->B);
        S = g->splits > 0 ? g->splits : S;
        S = clampi(S < min_s ? min_s : S, 1, nb);
        if (g->splits == 0 && dev.wgmma && g->M > 8 && S > 1 && min_s <= STREAM_MAX_CLUSTER) {
            /* sm_90, M > 8: reduce the splits on chip, a power-of-two cluster of at most 8
             * CTAs (measured: M = 16 1.15x -> 1.31x cuBLAS FP16, M = 32 0.75x -> 0.85x; at
             * M <= 8 the global-memory reduction with unrounded S was faster, 2.17x vs 2.04x) */
            int c = 2;
            while (c < S && c < STREAM_MAX_CLUSTER)
                c *= 2;
            while (c > nb)
                c /= 2;
            S = c < min_s ? min_s : c;
        }
        pl.S = S;
        pl.cluster = S > 1 && dev.wgmma && S <= STREAM_MAX_CLUSTER && (S & (S - 1)) == 0;
        int range = (nb + S - 1) / S * g->B;
        pl.block = dim3(STREAM_WARPS * 32);
        pl.smem = ((size_t)8 * pl.MI * (range + 16) + 15) / 16 * 16;
        if (pl.cluster)
            pl.smem += (size_t)STREAM_WARPS * 16 * 8 * pl.MI * sizeof(float);
    } else if (pl.kernel == COMET_W4AX_KERNEL_PIPE) {
        plan_pipe(pl, g, np16, dev);
    } else if (pl.kernel == COMET_W4AX_KERNEL_WGMMA) {
        pl.tok = g->tile_tokens ? g->tile_tokens : ws_auto_tok(g->M, g->K);
        pl.MI = pl.tok / 8;
        pl.tiles_n = (np16 + WS_ROWS / 16 - 1) / (WS_ROWS / 16);
        pl.tiles_m = (g->M + pl.tok - 1) / pl.tok;
        int ctas = pl.tiles_n * pl.tiles_m;
        /* CTAs resident at once: every one counts as a slot (counting 80 % or 67 % of them
         * made M = 9-64 1.07x / 1.11x slower) */
        const int slots = sms * ws_ctas_per_sm(pl.tok);
        /* the modelled time of s splits, in blocks: rounds of resident CTAs x (blocks per split
         * + a CTA's fixed cost) */
        auto makespan = [&](int s) {
            return (long long)((ctas * s + slots - 1) / slots) * ((nb + s - 1) / s + WS_CTA_COST);
        };
        /* as many splits as fit in one wave (ws_ctas_per_sm CTAs per SM): 8B o at M = 128, 32
         * tiles: S = 4, 128 CTAs, rather than 5 in two waves; at two CTAs per SM the wave
         * counts both (8B down at M = 64: S = 7, 224 CTAs, 0.78x the time of S = 3 at one
         * CTA per SM; 70B o: S = 3, 1.06x that of S = 2 -- measured, not modelled) */
        int S = ctas >= slots ? 1 : slots / ctas;
        S = clampi(S, 1, WS_MAX_CLUSTER);
        /* ... and whose clusters of S CTAs can all be resident at once (a GPC holds whole
         * clusters only; measured: 8B o at M = 64 ran S = 4 at 3 us per block) */
        while (g->splits == 0 && S > 1 && dev.cluster_capacity(g->B / 64, pl.tok, S) < ctas)
            S--;
        /* Past one wave, 2 splits when the last wave is nearly empty: S = 2 takes
         * ceil(tiles / resident pairs) rounds of half the work; used when that saves >= 20 %
         * of the rounds (measured: 70B qkv at M = 256, 160 tiles, 2 rounds -> 3 half rounds:
         * 113 -> 99 us; at a 12-17 % saving, 8B gate_up M = 256 and 70B qkv M = 512, it lost
         * or tied; 8 splits at 15 resident clusters ran 8B qkv M = 256 at half speed) */
        if (g->splits == 0 && ctas >= slots && nb >= 2) {
            const int cap = clampi(dev.cluster_capacity(g->B / 64, pl.tok, 2), 1, slots / 2);
            if (10 * ((ctas + cap - 1) / cap) <= 16 * ((ctas + slots - 1) / slots))
                S = 2;
        }
        /* Below one wave, the cluster splits are capped by the clusters that fit (LLaMA-3-70B
         * qkv at M = 64: 80 tiles, S = 1, 52 SMs idle). Splits reduced through global
         * partials have no such cap, but one CTA per tile then reads back S partial tiles:
         * take them when a model of the makespan -- rounds x (blocks per split + WS_CTA_COST)
         * + S x TOK / 32 blocks for the reduction -- saves >= 10 %. Measured (same-run A/B):
         * 70B qkv M = 24 / 48 / 64 -15 / -11 / -9 %, 8B down M = 24 -12 %; without the
         * reduction term it also split 8B o (+7..+52 %) and every such shape at 128 tokens.
         * With two CTAs per SM a 10 % threshold instead of 15 % moved 70B qkv and
         * down at M = 40-64 to global splits (0.81-0.87x the time) and changed nothing else
         * by more than 1 % at M = 17-64. */
        bool global_splits = false;
        if (g->splits == 0 && ctas < slots && nb >= 2) {
            const long long cur = makespan(S); /* one round: the cluster splits fit */
            long long best = cur;
            int best_s = 0;
            for (int sg = 2; sg <= nb && sg <= WS_MAX_GLOBAL_SPLITS; sg++) {
                const long long t = makespan(sg) + sg * pl.tok / 32;
                if (t < best)
                    best = t, best_s = sg;
            }
            if (best_s && 100 * best <= WS_GLOBAL_GAIN * cur)
                S = best_s, global_splits = true;
        }
        S = g->splits > 0 ? g->splits : S;
        pl.S = clampi(S, 1, nb);
        /* sm_90: the splits of a tile reduce on chip in a cluster (no workspace) */
        pl.cluster = pl.S > 1 && pl.S <= WS_MAX_CLUSTER && !global_splits;
        pl.grid = dim3(ctas, 1, 1);
        /* Stream-K (128-token tiles, up to WS_SK_MAX_WAVES waves): one CTA per SM, each with
         * an equal share of the tiles x blocks, when a model of the makespan says it beats the
         * plan above by >= 10 %: rounds x (blocks per split + WS_CTA_COST) against the share +
         * WS_SK_COST, the cost of a CTA's partial tiles (written to the workspace and summed by
         * the last CTA of each tile), fitted to a same-run A/B of stream-K at every plan with
         * M = 96-512 on the 8 LLaMA-3 shapes: about 12 blocks. Where the model
         * takes it, it measured 0.75-0.95x the time (70B qkv at M = 96-512, 70B gate_up at
         * M = 96-128, 8B qkv at M = 384-512, 8B gate_up at M = 192-256, 8B down at M = 384);
         * where it does not, stream-K was 1.0-1.36x (cluster splits already fill the SMs). */
        if (g->splits == 0 && pl.tok == 128 && ctas <= WS_SK_MAX_WAVES * sms &&
            (long long)ctas * nb >= sms) {
            const long long sk = ((long long)ctas * nb + sms - 1) / sms + WS_SK_COST;
            if (100 * sk <= WS_SK_GAIN * makespan(pl.S))
                pl.streamk = true, pl.S = 1, pl.cluster = false,
                pl.grid = dim3((unsigned)sms, 1, 1);
        }
        pl.block = dim3(WS_THREADS);
        pl.smem = (size_t)ws_smem_bytes(g->B / 64, pl.tok);
        const int persist_smem = ws_persist_smem_bytes(g->B / 64, pl.tok);
        if (!pl.streamk && pl.S == 1 && g->splits == 0 && pl.tok == 128 && ctas > slots &&
            nb <= WS_PERSIST_MAX_NB && pl.tiles_m >= WS_PERSIST_MIN_TILES_M &&
            dev.smem_optin >= persist_smem)
            pl.persist = true, pl.grid = dim3((unsigned)slots, 1, 1),
            pl.smem = (size_t)persist_smem;
    } else {
        pl.MI = 4;
        pl.grid = dim3((np16 + TBN / 16 - 1) / (TBN / 16), (g->M + TBM - 1) / TBM, 1);
        int ctas = (int)(pl.grid.x * pl.grid.y);
        int S = ctas >= sms ? 1 : sms / ctas;
        S = g->splits > 0 ? g->splits : S;
        pl.S = clampi(S, 1, nb);
        pl.block = dim3(256);
        pl.smem = TSMEM_BYTES;
    }
    pl.grid.z = pl.S;
    pl.pdl = pdl;
    if (pl.S > 1 && !pl.cluster)
        pl.ws_bytes = counter_bytes(pl) + (size_t)pl.S * g->M * g->N * sizeof(float);
    if (pl.streamk) /* two partial tiles per CTA */
        pl.ws_bytes = counter_bytes(pl) + (size_t)pl.grid.x * 2 * WS_ROWS * pl.tok * sizeof(float);
    return pl;
}

static_assert(TSMEM_BYTES <= MAX_SMEM &&
                  8 * 4 * (STREAM_MAX_RANGE + 16) + STREAM_WARPS * 16 * 32 * 4 + 16 <= MAX_SMEM &&
                  ws_smem_bytes(2, 128) <= MAX_SMEM && ws_smem_bytes(1, 128) <= MAX_SMEM &&
                  ws_smem_bytes(2, 64) <= MAX_SMEM && ws_smem_bytes(1, 64) <= MAX_SMEM &&
                  ws_smem_bytes(2, 32) <= MAX_SMEM && ws_smem_bytes(1, 32) <= MAX_SMEM &&
                  ws_smem_bytes(2, 16) <= MAX_SMEM && ws_smem_bytes(1, 16) <= MAX_SMEM,
              "shared memory plans exceed MAX_SMEM");
static_assert(ws_persist_smem_bytes(1, 128) <= MAX_SMEM_SM90 &&
                  ws_persist_smem_bytes(2, 128) <= MAX_SMEM_SM90 &&
                  2 * 8 * ws_stages(1, 128) <= 256 && 2 * 8 * ws_stages(2, 128) <= 256,
              "the persistent wgmma plans' staging tile does not fit");
/* the CTAs that ws_ctas_per_sm puts on one SM fit its 228 KB (each also reserves 1 KB) */
constexpr bool ws_fits_sm(int kpb, int tok) {
    return ws_ctas_per_sm(tok) * (ws_smem_bytes(kpb, tok) + 1024) <= 228 * 1024;
}
static_assert(ws_fits_sm(1, 16) && ws_fits_sm(2, 16) && ws_fits_sm(1, 32) && ws_fits_sm(2, 32) &&
                  ws_fits_sm(1, 64) && ws_fits_sm(2, 64) && ws_fits_sm(1, 128) &&
                  ws_fits_sm(2, 128),
              "the wgmma kernel's CTAs per SM do not fit in shared memory");
static_assert(128 * WS_RED_LD * 4 <= ws_stages(1, 128) * ws_stage_bytes(1, 128) &&
                  128 * WS_RED_LD * 4 <= ws_stages(2, 128) * ws_stage_bytes(2, 128) &&
                  64 * WS_RED_LD * 4 <= ws_stages(1, 64) * ws_stage_bytes(1, 64) &&
                  64 * WS_RED_LD * 4 <= ws_stages(2, 64) * ws_stage_bytes(2, 64) &&
                  32 * WS_RED_LD * 4 <= ws_stages(1, 32) * ws_stage_bytes(1, 32) &&
                  32 * WS_RED_LD * 4 <= ws_stages(2, 32) * ws_stage_bytes(2, 32) &&
                  16 * WS_RED_LD * 4 <= ws_stages(1, 16) * ws_stage_bytes(1, 16) &&
                  16 * WS_RED_LD * 4 <= ws_stages(2, 16) * ws_stage_bytes(2, 16),
              "the cluster reduction tile must fit in the stage memory");

/* The plan for g on the current device. */
plan_t make_plan(const comet_cuda_w4ax_gemm *g) { return make_plan(g, current_plan_device()); }

} // namespace
