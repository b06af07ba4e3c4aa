/* gemm_w4ax_plan.cuh — the W4Ax GEMM's plan: which kernel, tile, split and grid for M, N, K, B
 * and the device (make_plan). Its rules are the tables and constants below, each with one line
 * of reason and one number; the measurements behind them are in docs/gemm.md "Plan rules". Also
 * here: the device facts the plan reads (plan_device, cached per device), the workspace layout
 * and the shared-memory limits. Part of gemm_w4ax.cu's one translation unit (it includes every
 * gemm_w4ax_*.cuh in order), so the kernels compile exactly as one file would.
 */
#pragma once

#include "backend/cuda/gemm_w4ax_wgmma.cuh"

#include <climits>
#include <mutex>
#include <stdio.h>
#include <string.h>

namespace {

/* ---- Limits of the kernels ---- */
constexpr int STREAM_WARPS = 4;
constexpr int STREAM_MAX_RANGE = 2048; /* bytes of K per stream CTA (bounds its shared memory) */
constexpr int STREAM_MAX_CLUSTER = 8, WS_MAX_CLUSTER = 8; /* portable cluster size */
/* Dynamic shared memory per CTA, at most (static_asserts below; the persistent wgmma tiles
 * alone go to MAX_SMEM_SM90, sm_90's opt-in limit). */
constexpr int MAX_SMEM = 160 * 1024, MAX_SMEM_SM90 = 227 * 1024;

/* ---- Tuned constants: the reason and one number each (docs/gemm.md "Plan rules") ---- */
/* stream: split K until the grid has this many CTAs per SM, so that every SM streams */
constexpr int STREAM_CTAS_PER_SM = 4;
/* pipe: 8-token groups up to this M; two of them at M = 9-16 took 1.33-1.42x the time */
constexpr int PP_MI1_MAX_M = 8;
/* pipe, M <= 8: weight tiles per item; 0.86-0.90x the time of one tile per item */
constexpr int PP_AUTO_TILES_M8 = 2;
/* pipe: ring budget of a CTA alone on its SM; the opt-in limit's deeper rings took 1.02x */
constexpr int PP_MAX_RING = MAX_SMEM;
/* pipe: shared memory the driver reserves per CTA (bytes) */
constexpr int PP_CTA_RESERVE = 1024;
/* wgmma: a CTA's fixed cost (start-up, ring fill, epilogue) in the makespan model, in blocks */
constexpr int WS_CTA_COST = 2;
/* wgmma: the most global splits tried; cluster splits stop at WS_MAX_CLUSTER */
constexpr int WS_MAX_GLOBAL_SPLITS = 16;
/* wgmma: global splits at <= this % of the cluster plan's modelled time; 70B qkv M = 24: 0.85x */
constexpr int WS_GLOBAL_GAIN = 90;
/* wgmma past one wave: 2 splits at <= this % of the modelled time; 70B qkv M = 256: 0.88x */
constexpr int WS_PAIR_GAIN = 80;
/* stream-K: a CTA's cost of its partial tiles, in blocks; fitted to M = 96-512: 12 */
constexpr int WS_SK_COST = 12;
/* stream-K at <= this % of the split plan's modelled time; 0.75-0.95x where it is taken */
constexpr int WS_SK_GAIN = 90;
/* stream-K up to this many waves of 128-token tiles; its fit covered 3.4 (8B gate_up M = 256) */
constexpr int WS_SK_MAX_WAVES = 4;
/* persistent 128-token tiles up to this many blocks per tile; 70B down (224) took 1.015x */
constexpr int WS_PERSIST_MAX_NB = 64;
/* persistent 128-token tiles from this many token tiles; 4 took 1.09-1.17x on LLaMA-2-7B */
constexpr int WS_PERSIST_MIN_TILES_M = 8;

/* ---- The automatic kernel: the first row that matches ---- */
struct kernel_rule {
    bool wgmma;               /* the device runs this file's sm_90a code */
    int max_m;                /* M at most */
    int min_tiles, max_tiles; /* N/16 from min_tiles to max_tiles x the SMs (0: no bound) */
    comet_w4ax_kernel kernel; /* the pipe kernel has no split-K: its rows need splits 0 */
};
constexpr int ANY_M = INT_MAX;
constexpr kernel_rule KERNEL_RULES[] = {
    /* whole weight tiles per SM over all of K: 0.71-0.98x the time at M = 12-16 */
    {true, 16, 1, 0, COMET_W4AX_KERNEL_PIPE},
    /* two 16-token groups, N/16 up to 2x the SMs: 0.72-0.84x the wgmma kernel's time */
    {true, 32, 1, 2, COMET_W4AX_KERNEL_PIPE},
    /* below one 16-row tile per SM (N < 2112 on 132 SMs) split-K keeps every SM streaming */
    {true, 8, 0, 0, COMET_W4AX_KERNEL_STREAM},
    /* the tensor-core kernel from M = 9 where the pipe kernel does not run: M = 64 1.52x FP16 */
    {true, ANY_M, 0, 0, COMET_W4AX_KERNEL_WGMMA},
    /* sm_80 (untuned): streaming up to the stream kernel's largest token group, M = 32 */
    {false, 32, 0, 0, COMET_W4AX_KERNEL_STREAM},
    /* sm_80: 128 x 128 mma.sync tiles from M = 33 */
    {false, ANY_M, 0, 0, COMET_W4AX_KERNEL_TILED},
};

/* ---- The wgmma kernel's token tile: the first row with M <= max_m and K >= min_k ---- */
struct tok_rule {
    int max_m, min_k, tok;
};
constexpr tok_rule WS_TOK_RULES[] = {
    {16, 8192, 16},  /* three CTAs per SM where K is long: 0.81-0.91x the time on 70B */
    {32, 0, 32},     /* two CTAs per SM: 0.68-0.96x the time of one at M = 17-32 */
    {64, 0, 64},     /* two CTAs per SM: 0.76-1.06x the time of one at M = 48-64 */
    {ANY_M, 0, 128}, /* one CTA per SM; 64-token tiles took 1.04-1.23x at M = 96-512 */
};

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

/* Tile counters at the start of the workspace, partials after. The counter region is
 * WS_COUNTERS in every plan, so that calls sharing a stream's workspace never put partials on
 * another call's counters; a plan with more tiles gets a larger region, which
 * comet_cuda_gemm_w4ax zeroes before the launch. */
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

/* The wgmma kernel runs here: an sm_90 device that loaded this file's sm_90a code. A build for
 * plain sm_90 or sm_80 alone gives that kernel no body (a trap); the plans then follow the
 * sm_80 rules and forcing the wgmma kernel is refused. The loaded code shows in the kernel's
 * registers (cudaFuncGetAttributes: safe during graph capture): the instance asked holds 168
 * per thread in sm_90a code, the trap 4 (24 in a -G build). */
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
 * instructions (sm_90 code on an sm_90 or newer device). A "90a;80" build on a newer GPU runs
 * the JIT-compiled compute_80 PTX, which has no wait: launched early it would race. Read from
 * a kernel's PTX version. */
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

/* The current device's facts for make_plan. */
plan_device current_plan_device() {
    return {device_attr(cudaDevAttrMultiProcessorCount, 132),
            device_attr(cudaDevAttrMaxSharedMemoryPerMultiprocessor, 228 * 1024),
            device_attr(cudaDevAttrMaxSharedMemoryPerBlockOptin, MAX_SMEM),
            has_wgmma(),
            pdl_supported(),
            ws_cluster_capacity};
}

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

int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* The automatic kernel for g (KERNEL_RULES). */
comet_w4ax_kernel auto_kernel(const comet_cuda_w4ax_gemm *g, int np16, const plan_device &dev) {
    for (const kernel_rule &r : KERNEL_RULES)
        if (r.wgmma == dev.wgmma && g->M <= r.max_m &&
            (r.kernel != COMET_W4AX_KERNEL_PIPE || g->splits == 0) &&
            (long)np16 >= (long)r.min_tiles * dev.sms &&
            (r.max_tiles == 0 || (long)np16 <= (long)r.max_tiles * dev.sms))
            return r.kernel;
    return COMET_W4AX_KERNEL_TILED; /* not reached: the last rows take any M */
}

/* The wgmma kernel's automatic token tile (WS_TOK_RULES). */
int ws_auto_tok(int M, int K) {
    for (const tok_rule &r : WS_TOK_RULES)
        if (M <= r.max_m && K >= r.min_k)
            return r.tok;
    return 128; /* not reached: the last row takes any M */
}

/* The stream kernel's splits for a grid of `ctas`: STREAM_CTAS_PER_SM per SM (or `forced`), at
 * least those that keep a CTA's K range within STREAM_MAX_RANGE, at most one per block. */
int stream_min_splits(int nb, int B) {
    return (nb + STREAM_MAX_RANGE / B - 1) / (STREAM_MAX_RANGE / B);
}
int stream_splits(int ctas, int forced, int nb, int B, int sms) {
    const int min_s = stream_min_splits(nb, B);
    const int S = forced > 0 ? forced : (STREAM_CTAS_PER_SM * sms + ctas - 1) / ctas;
    return clampi(S < min_s ? min_s : S, 1, nb);
}

/* The batch-invariant plan (g->batch_invariant): a token row's outputs must not depend on M.
 * The stream, wgmma and tiled kernels give the same bits for the same split count S (split s
 * sums blocks [s nb / S, (s + 1) nb / S) in order; the splits are summed in split order from
 * 0.0f, through a cluster or the workspace alike), so S is the stream plan's at M = 1, fixed by
 * N, K, B and the device, and M picks only among those kernels: a fixed S leaves out the pipe
 * kernel (warps own strided stages), and so does it stream-K (shares cut by M). */
void batch_invariant_call(comet_cuda_w4ax_gemm &gi, const plan_device &dev) {
    const int np16 = (gi.N + 15) / 16, ctas = (np16 + STREAM_WARPS - 1) / STREAM_WARPS;
    gi.splits = stream_splits(ctas, 0, gi.K / gi.B, gi.B, dev.sms);
    gi.kernel = auto_kernel(&gi, np16, dev);
}

/* The stream kernel's plan: token groups of 8 MI, S splits of K; on sm_90 from M = 9 the splits
 * reduce on chip in a power-of-two cluster (M = 16: 1.31x cuBLAS FP16 against 1.15x). */
void plan_stream(plan_t &pl, const comet_cuda_w4ax_gemm *g, int np16, const plan_device &dev) {
    const int nb = g->K / g->B, min_s = stream_min_splits(nb, g->B);
    pl.MI = g->M <= 8 ? 1 : g->M <= 16 ? 2 : 4;
    pl.grid =
        dim3((np16 + STREAM_WARPS - 1) / STREAM_WARPS, (g->M + 8 * pl.MI - 1) / (8 * pl.MI), 1);
    int S = stream_splits((int)(pl.grid.x * pl.grid.y), g->splits, nb, g->B, dev.sms);
    if (g->splits == 0 && dev.wgmma && g->M > 8 && S > 1 && min_s <= STREAM_MAX_CLUSTER) {
        int c = 2;
        while (c < S && c < STREAM_MAX_CLUSTER)
            c *= 2;
        while (c > nb)
            c /= 2;
        S = c < min_s ? min_s : c;
    }
    pl.S = S;
    pl.cluster = S > 1 && dev.wgmma && S <= STREAM_MAX_CLUSTER && (S & (S - 1)) == 0;
    const int range = (nb + S - 1) / S * g->B;
    pl.block = dim3(STREAM_WARPS * 32);
    pl.smem = ((size_t)8 * pl.MI * (range + 16) + 15) / 16 * 16;
    if (pl.cluster)
        pl.smem += (size_t)STREAM_WARPS * 16 * 8 * pl.MI * sizeof(float);
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

/* The pipe kernel's plan: items of PT 16-row weight tiles x a token group of 8 MI, dealt to CTAs
 * round robin (pp_spread_items); each warp's ring gets its part of the SM's shared memory split
 * among the CTAs (at most PP_MAX_DEPTH slots). */
void plan_pipe(plan_t &pl, const comet_cuda_w4ax_gemm *g, int np16, const plan_device &dev) {
    pl.MI = g->M <= PP_MI1_MAX_M ? 1 : 2;
    const int tt = 8 * pl.MI, smem_sm = dev.smem_sm, sms = dev.sms;
    pl.tiles_m = (g->M + tt - 1) / tt;
    pl.pp_rows = g->M < tt ? g->M : tt;
    /* items, slot bytes per CTA, CTAs per SM and their spread for PT tiles per item */
    auto items_of = [&](int pt) { return (long)((np16 + pt - 1) / pt) * pl.tiles_m; };
    auto slot_of = [&](int pt) { return PP_WARPS * pp_slot_bytes(pl.pp_rows, pt); };
    auto spread_of = [&](int pt) {
        int cmax = pp_max_ctas(pt, pl.MI);
        while (cmax > 1 &&
               smem_sm / cmax - PP_CTA_RESERVE < pp_red_bytes(pl.MI, pt) + 2 * slot_of(pt))
            cmax--;
        return pp_spread_items(items_of(pt), cmax, sms);
    };
    auto busiest = [&](int t) { return spread_of(t).share * t; }; /* tiles on the busiest SM */
    int pt = g->pipe_tiles;
    if (pt == 0) {
        long best = -1;
        pt = 1;
        /* 8-token groups: PP_AUTO_TILES_M8 tiles per item */
        if (pl.MI == 1 && np16 >= PP_AUTO_TILES_M8) {
            pt = PP_AUTO_TILES_M8, best = busiest(pt);
        } else if (pl.MI > 1) {
            /* 16-token groups: of 2-4 tiles the fewest on the busiest SM, ties to more tiles (the
             * fastest on all 8 shapes at M = 12; one tile per item took 1.3-1.8x) */
            for (int t = 2; t <= PP_MAX_TILES && t <= np16; t++) {
                const long tiles = busiest(t);
                if (best < 0 || tiles <= best)
                    best = tiles, pt = t;
            }
        }
        /* one tile per item where that halves the busiest SM's tiles (N/16 below ~1.5x SMs) */
        if (best > 0 && 2 * busiest(1) <= best)
            pt = 1;
    }
    const long items = items_of(pt);
    const int slot = slot_of(pt), fixed = pp_red_bytes(pl.MI, pt), c = spread_of(pt).ctas;
    int budget = smem_sm / c - PP_CTA_RESERVE;
    budget = budget < PP_MAX_RING ? budget : PP_MAX_RING;
    pl.pp_tiles = pt;
    pl.pp_depth = clampi((budget - fixed) / slot, 2, PP_MAX_DEPTH);
    pl.pp_ctas = c;
    pl.grid = dim3((unsigned)(items < (long)sms * c ? items : (long)sms * c), 1, 1);
    /* One CTA per SM: a ring no deeper than its warps' P positions can overlap, P - 1 slots (at
     * least 3) at 8-token groups, P / 2 (at least 2) at 16: 8B o 0.85-0.90x the time at M = 1-12.
     * With pdl the first pp_early positions' weights go before the wait: one at 16-token groups,
     * whose early weights share the first position's cp.async group (0.98x on 8B down). */
    const long per_cta = (items + pl.grid.x - 1) / pl.grid.x;
    const long P = per_cta * (((g->K / 64 + 1) / 2 + PP_WARPS - 1) / PP_WARPS);
    const long cap_d = pl.MI == 1 ? (P - 1 > 3 ? P - 1 : 3) : (P / 2 > 2 ? P / 2 : 2);
    if (c == 1 && pl.pp_depth > cap_d)
        pl.pp_depth = (int)cap_d;
    pl.pp_early = pl.MI == 1 ? pl.pp_depth - 1 : 1;
    pl.block = dim3(PP_WARPS * 32);
    pl.smem = (size_t)pl.pp_depth * slot + fixed;
    pl.S = 1;
    /* the carveout of the plan's c CTAs and no more, the rest of the SM left to L1: 8B qkv at
     * M = 12 took 5.04 us with this hint, 6.30 without */
    pl.carveout = (int)((100L * c * ((long)pl.smem + PP_CTA_RESERVE) + smem_sm - 1) / smem_sm);
}

/* The wgmma kernel's plan: 128 x tok tiles; S splits that fill one wave, in clusters that fit,
 * or global splits, stream-K or persistent tiles where the makespan models say they pay. */
void plan_wgmma(plan_t &pl, const comet_cuda_w4ax_gemm *g, int np16, const plan_device &dev) {
    const int nb = g->K / g->B, sms = dev.sms, kpb = g->B / 64;
    pl.tok = g->tile_tokens ? g->tile_tokens : ws_auto_tok(g->M, g->K);
    pl.MI = pl.tok / 8;
    pl.tiles_n = (np16 + WS_ROWS / 16 - 1) / (WS_ROWS / 16);
    pl.tiles_m = (g->M + pl.tok - 1) / pl.tok;
    const int ctas = pl.tiles_n * pl.tiles_m;
    /* CTAs resident at once, every one a slot (counting 80 % of them took 1.07x the time) */
    const int slots = sms * ws_ctas_per_sm(pl.tok);
    /* the modelled time of s splits, in blocks: rounds of slots x (blocks per split + the fixed
     * cost of a CTA) */
    auto makespan = [&](int s) {
        return (long long)((ctas * s + slots - 1) / slots) * ((nb + s - 1) / s + WS_CTA_COST);
    };
    /* as many splits as fill one wave (8B down M = 64: S = 7, 0.78x the time of S = 3) */
    int S = clampi(ctas >= slots ? 1 : slots / ctas, 1, WS_MAX_CLUSTER);
    bool global_splits = false;
    if (g->splits > 0) {
        S = g->splits;
    } else {
        /* ... whose clusters all fit at once (8B o M = 64 ran S = 4 at 3 us per block else) */
        while (S > 1 && dev.cluster_capacity(kpb, pl.tok, S) < ctas)
            S--;
        if (ctas >= slots && nb >= 2) {
            /* past one wave: 2 splits, half the work per round, when they save enough rounds */
            const int cap = clampi(dev.cluster_capacity(kpb, pl.tok, 2), 1, slots / 2);
            if (50 * ((ctas + cap - 1) / cap) <= WS_PAIR_GAIN * ((ctas + slots - 1) / slots))
                S = 2;
        } else if (ctas < slots && nb >= 2) {
            /* below one wave: global splits, one CTA per tile then reading S partials back
             * (sg x tok / 32 blocks), where they beat the cluster splits that fit */
            const long long cur = makespan(S);
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
    }
    pl.S = clampi(S, 1, nb);
    pl.cluster = pl.S > 1 && pl.S <= WS_MAX_CLUSTER && !global_splits;
    pl.grid = dim3(ctas, 1, 1);
    /* stream-K: one CTA per SM, an equal share of tiles x blocks + WS_SK_COST, against the plan
     * above */
    if (g->splits == 0 && pl.tok == 128 && ctas <= WS_SK_MAX_WAVES * sms &&
        (long long)ctas * nb >= sms) {
        const long long sk = ((long long)ctas * nb + sms - 1) / sms + WS_SK_COST;
        if (100 * sk <= WS_SK_GAIN * makespan(pl.S))
            pl.streamk = true, pl.S = 1, pl.cluster = false, pl.grid = dim3((unsigned)sms, 1, 1);
    }
    pl.block = dim3(WS_THREADS);
    pl.smem = (size_t)ws_smem_bytes(kpb, pl.tok);
    /* persistent tiles past one wave: the ring runs on across a CTA's tiles (M >= 1024: 0.974x) */
    const int persist_smem = ws_persist_smem_bytes(kpb, pl.tok);
    if (!pl.streamk && pl.S == 1 && g->splits == 0 && pl.tok == 128 && ctas > slots &&
        nb <= WS_PERSIST_MAX_NB && pl.tiles_m >= WS_PERSIST_MIN_TILES_M &&
        dev.smem_optin >= persist_smem)
        pl.persist = true, pl.grid = dim3((unsigned)slots, 1, 1), pl.smem = (size_t)persist_smem;
}

/* The plan for g on the device `dev` describes. */
plan_t make_plan(const comet_cuda_w4ax_gemm *g, const plan_device &dev) {
    plan_t pl = {};
    comet_cuda_w4ax_gemm gi;
    if (g->batch_invariant && g->kernel == COMET_W4AX_KERNEL_AUTO && g->splits == 0) {
        gi = *g;
        batch_invariant_call(gi, dev);
        g = &gi;
        pl.invariant = true;
    }
    const int nb = g->K / g->B, np16 = (g->N + 15) / 16;
    pl.kernel = g->kernel != COMET_W4AX_KERNEL_AUTO ? g->kernel : auto_kernel(g, np16, dev);
    if (pl.kernel == COMET_W4AX_KERNEL_STREAM) {
        plan_stream(pl, g, np16, dev);
    } else if (pl.kernel == COMET_W4AX_KERNEL_PIPE) {
        plan_pipe(pl, g, np16, dev);
    } else if (pl.kernel == COMET_W4AX_KERNEL_WGMMA) {
        plan_wgmma(pl, g, np16, dev);
    } else { /* tiled: 128 x 128 tiles, splits that fill the SMs */
        pl.MI = 4;
        pl.grid = dim3((np16 + TBN / 16 - 1) / (TBN / 16), (g->M + TBM - 1) / TBM, 1);
        const int ctas = (int)(pl.grid.x * pl.grid.y);
        const int S = g->splits > 0 ? g->splits : ctas >= dev.sms ? 1 : dev.sms / ctas;
        pl.S = clampi(S, 1, nb);
        pl.block = dim3(256);
        pl.smem = TSMEM_BYTES;
    }
    pl.grid.z = pl.S;
    /* programmatic dependent launch where the device and its loaded code have it; elsewhere
     * a plain launch */
    pl.pdl = g->pdl && dev.pdl;
    if (pl.S > 1 && !pl.cluster)
        pl.ws_bytes = counter_bytes(pl) + (size_t)pl.S * g->M * g->N * sizeof(float);
    if (pl.streamk) /* two partial tiles per CTA */
        pl.ws_bytes = counter_bytes(pl) + (size_t)pl.grid.x * 2 * WS_ROWS * pl.tok * sizeof(float);
    return pl;
}

/* The plan for g on the current device. */
plan_t make_plan(const comet_cuda_w4ax_gemm *g) { return make_plan(g, current_plan_device()); }

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

} // namespace
