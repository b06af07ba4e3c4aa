/* gemm_w4ax_wgmma.cuh — the warp-specialized wgmma kernel (M > 8 on sm_90a): a TMA / bulk-copy
 * producer warp, two consumer warpgroups on wgmma.m64nTOKk32, split-K in clusters or stream-K.
 * Part of gemm_w4ax.cu's one translation unit (it includes every gemm_w4ax_*.cuh in order), so
 * the kernels compile exactly as one file would.
 */
#pragma once

#include "backend/cuda/gemm_w4ax_tiled.cuh"

namespace {

/* Shared-memory matrix descriptor: K-major, swizzle 128 B (KPB 2) or 64 B (KPB 1); the
 * leading byte offset is unused in swizzled K-major layouts, the stride byte offset is the
 * distance between 8-row groups. */
template <int KPB>
__device__ __forceinline__ uint64_t smem_desc(uint32_t saddr) {
    const uint64_t layout = KPB == 2 ? 1 : 2, sbo = 8 * 64 * KPB;
    return ((saddr & 0x3FFFF) >> 4) | (1ull << 16) | ((sbo >> 4) << 32) | (layout << 62);
}

/* Warp-specialized wgmma kernel (sm_90a), M > 8. CTA = 3 warpgroups: warpgroup 0 is the
 * producer (one warp issues all copies, the others leave), warpgroups 1 and 2 are consumers
 * of 64 weight rows each, sharing one tile of TOK = 128, 64, 32 or 16 tokens (ws_auto_tok: no
 * half-empty tiles, less promotion, more stages and CTAs per SM); the CTA's
 * output tile is 128 weight rows x TOK tokens. One pipeline stage is one activation block:
 *  - the token tile (TOK rows x B bytes of codes), one TMA 2-D copy with the 128-byte (B=128)
 *    or 64-byte (B=64) swizzle that the wgmma descriptor reads; rows past M are zero-filled;
 *  - the 8 packed 16-row weight slices (KPB x 512 contiguous bytes each), 1-D bulk copies;
 *  - the block's TOK activation scales, 4-byte cp.async (strided in sa).
 * All three complete on the stage's `full` mbarrier (transaction bytes + 32 cp.async
 * arrivals + the producer's own arrival); consumers release a stage on its `empty` mbarrier
 * (every consumer thread arrives) after promoting it. Consumers unpack A (x16 trick), issue
 * 2*KPB wgmma.m64nTOKk32 into int32, wait, and promote into fp32; setmaxnreg moves
 * registers from the producer to the consumers. Each consumer warpgroup's chain per block
 * (wait for the stage, unpack, wgmma, wait for them, promote, release) is latency-bound: a
 * CTA takes ~1200 cycles per block at 32 tokens, ~1700 at 128, whatever the tile. So 32- and
 * 64-token tiles run two CTAs per SM (ws_ctas_per_sm: 80 registers at launch, consumers 104,
 * a shallower ring), four chains per SM instead of two: 0.68-0.96x the time of one CTA per SM
 * at M = 17-32 on every LLaMA-3 shape, 0.76-1.06x at M = 48-64; 16-token tiles
 * (M <= 16) three (56 registers at launch, consumers 72; ws_auto_tok says where). 128-token tiles
 * need ~170 registers per consumer thread, so one CTA per SM there (64-token tiles at two
 * per SM were 1.04-1.23x slower at M = 96-512).
 * Tiles are visited in groups of WS_GROUP token tiles so that a wave of CTAs reuses weights
 * and tokens from L2. A CTA's work is a list of segments (tile, blocks): one with split-K
 * (its tile and split), several with stream-K (SK: its share of all tiles x blocks, the ring
 * running on across them; partial tiles are summed by the last CTA to finish each). */
constexpr int WS_ROWS = 128, WS_THREADS = 384;
/* Consumers of 32-token tiles, and of 16-token tiles at B = 128: block x + 1's stage wait,
 * fragments and wgmma (committed and waited for one by one) before block x is promoted and
 * released. Same-run A/B in CUDA graphs with pdl, 8 LLaMA-3 shapes, M = 9-32 (
 * bench/results/gemm-history.md, step 11): 0.974x the time of one block at a time, in the
 * exact form of the loop below. Why is not understood. These measured no gain:
 *  - the order alone, with one wait per block: 1.004x;
 *  - the one-by-one waits alone: 1.00x at M = 16-64, 1.04-1.06x at M >= 256;
 *  - a tidier loop with both: 1.004x;
 *  - the next block's fragments loaded during this block's wgmma: 1.013x.
 * Two blocks' wgmma really in flight together do not fit the registers at B = 128 (104 / 72 per
 * consumer thread): ptxas serializes them (C7512), and build.sh refuses that. Other tiles: one
 * block at a time. */
[[maybe_unused]] constexpr bool WS_NEXT_FIRST = true; /* used by the sm_90a kernel body only */
/* Every consumer thread arrives on a stage's `empty` barrier after its last read of the stage
 * (256 arrivals), so each read is ordered before the producer's next copy into the slot by
 * the barrier itself. With one lane per warp after __syncwarp (CUTLASS's pattern)
 * compute-sanitizer's racecheck reported hazards on stage reuse; 256 arrivals cost
 * nothing measurable (same-run A/B, 32 prefill shapes: +0.5 %, within noise). */
[[maybe_unused]] constexpr int WS_RELEASE_ARRIVALS = 256; /* used by the sm_90a kernel body only */
[[maybe_unused]] constexpr int WS_GROUP = 8;              /* used by the sm_90a kernel body only */
constexpr int WS_RED_LD = WS_ROWS + 4; /* row stride (floats) of the cluster reduction tile */
/* CTAs per SM of the wgmma kernel by token tile: 32- and 64-token tiles run two per SM
 * (consumers within 104 registers, shallower rings: ws_stages), 16-token tiles three (72 registers,
 * a third of the ring). */
__host__ __device__ constexpr int ws_ctas_per_sm(int tok) {
    return tok == 16 ? 3 : tok <= 64 ? 2 : 1;
}
/* Pipeline depth by block size (kpb = B/64) and token-tile height (deeper rings measured no
 * faster at 128 tokens; the 32-token depths are untuned); at two CTAs per SM, what fits in
 * half an SM's 228 KB (each CTA also reserves 1 KB). */
__host__ __device__ constexpr int ws_stages(int kpb, int tok) {
    return tok == 16 ? (ws_ctas_per_sm(16) == 3 ? (kpb == 1 ? 12 : 6) : (kpb == 1 ? 16 : 10))
           : ws_ctas_per_sm(tok) == 2 ? (tok == 64 ? (kpb == 1 ? 12 : 6) : (kpb == 1 ? 15 : 8))
           : tok == 128               ? (kpb == 1 ? 8 : 5)
           : tok == 64                ? (kpb == 1 ? 12 : 8)
                                      : (kpb == 1 ? 16 : 10);
}
__host__ __device__ constexpr int ws_stage_bytes(int kpb, int tok) {
    return (tok * 64 * kpb + (WS_ROWS / 16) * kpb * 512 + tok * 4 + 1023) / 1024 * 1024;
}
__host__ __device__ constexpr int ws_smem_bytes(int kpb, int tok) {
    return ws_stages(kpb, tok) * ws_stage_bytes(kpb, tok) + 1024 + 2 * 8 * ws_stages(kpb, tok);
}
/* Persistent plans (make_plan: 128-token tiles past one wave, WS_PERSIST_* in
 * gemm_w4ax_plan.cuh): one CTA per SM runs tiles blockIdx.x, + gridDim.x, ... (the stream-K
 * instance, whole tiles), the ring running on across them, so the next tile's first stages load
 * while this one's epilogue runs, and no CTA starts, initializes or fills its ring per tile. The
 * epilogue goes through a staging tile of its own past the ring and its barriers (66 KiB more
 * shared memory, 171 / 192 KiB per CTA at B = 64 / 128, so a device whose opt-in limit is lower
 * keeps the grid); direct stores measured 0.998x the grid's time where the staged tile measured
 * 0.988x. Measurements: docs/gemm.md "Plan rules". */
__host__ __device__ constexpr int ws_persist_staging_offset(int kpb, int tok) {
    return ws_stages(kpb, tok) * ws_stage_bytes(kpb, tok) +
           256; /* past the ring's 2 x ST barriers */
}
__host__ __device__ constexpr int ws_persist_smem_bytes(int kpb, int tok) {
    return ws_persist_staging_offset(kpb, tok) + tok * (128 + 4) * 4 + 1024;
}

/* Split-K hand-off among the 256 consumer threads only (named barrier 1): like
 * splitk_last, for kernels whose producer warps have already left; true in the last of the
 * `pieces` CTAs that arrive on counter `idx` (which it resets). */
[[maybe_unused]] __device__ __forceinline__ bool splitk_last_consumers(const params &p, int ctid,
                                                                       int idx, int pieces) {
    __shared__ int last;
    __threadfence();
    asm volatile("bar.sync 1, 256;\n" ::: "memory");
    if (ctid == 0) {
        unsigned old = atomicAdd(&p.counter[idx], 1u);
        last = old == (unsigned)pieces - 1;
        if (last)
            p.counter[idx] = 0;
    }
    asm volatile("bar.sync 1, 256;\n" ::: "memory");
    if (last)
        __threadfence();
    return last;
}

template <int KPB, int TOK, bool BSUM, bool CL = false, bool SK = false>
__global__ void __launch_bounds__(WS_THREADS, ws_ctas_per_sm(TOK))
    w4ax_ws_kernel(const __grid_constant__ params p, const __grid_constant__ CUtensorMap tmap_a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int KS = 64 * KPB, A_BYTES = TOK * KS, W_BYTES = (WS_ROWS / 16) * KPB * 512;
    constexpr int ST = ws_stages(KPB, TOK), STAGE = ws_stage_bytes(KPB, TOK), NACC = TOK / 2;
    /* registers per thread after setmaxnreg: at one CTA per SM 168 at launch, 128 x 40 + 256 x
     * 232 <= 65536; at two, 80 at launch (384 x 80 per CTA), 128 x 24 + 256 x 104 <= 30720; at
     * three, 56 at launch, 128 x 24 + 256 x 72 = 384 x 56 */
    constexpr int CPS = ws_ctas_per_sm(TOK);
    constexpr int PRODUCER_REGS = CPS == 1 ? 40 : 24;
    constexpr int CONSUMER_REGS = CPS == 1 ? 232 : CPS == 2 ? 104 : 72;
    static_assert(128 * PRODUCER_REGS + 256 * CONSUMER_REGS <=
                      WS_THREADS * (65536 / (WS_THREADS * CPS) / 8 * 8),
                  "setmaxnreg asks for more registers than the launch gives the CTA");
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    uint64_t *full = reinterpret_cast<uint64_t *>(smem + ST * STAGE), *empty = full + ST;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

    /* tile id -> first token t0 and first 16-row weight slice nt0; grouped raster: WS_GROUP
     * token tiles x all weight tiles, token tile fastest */
    auto tile_origin = [&](int id, int &t0, int &nt0) {
        const int group = id / (WS_GROUP * p.tiles_n), first_m = group * WS_GROUP;
        const int gm = min(p.tiles_m - first_m, WS_GROUP), in = id % (WS_GROUP * p.tiles_n);
        t0 = (first_m + in % gm) * TOK, nt0 = (in / gm) * (WS_ROWS / 16);
    };
    const int np16 = p.Np / 16, k64 = p.K / 64;
    /* The CTA's work as segments f(tile, b0, b1), blocks [b0, b1) of one tile. Split-K: one
     * segment, tile blockIdx.x, split blockIdx.z. Stream-K (SK): the CTA's share
     * [W c / G, W (c + 1) / G) of all W = tiles x nb blocks, tile after tile. */
    auto for_each_segment = [&](auto &&f) {
        if constexpr (!SK) {
            const int s = blockIdx.z;
            f((int)blockIdx.x, s * p.nb / p.S, (s + 1) * p.nb / p.S);
        } else if (
            p.persist) { /* persistent: whole tiles, a wave's worth of consecutive ids at a time */
            for (int tile = blockIdx.x; tile < p.tiles_n * p.tiles_m; tile += gridDim.x)
                f(tile, 0, p.nb);
        } else {
            const long long W = (long long)p.tiles_n * p.tiles_m * p.nb;
            const long long r1 = W * (blockIdx.x + 1) / gridDim.x;
            for (long long w = W * blockIdx.x / gridDim.x; w < r1;) {
                const int tile = (int)(w / p.nb), b0 = (int)(w % p.nb);
                const int b1 = (int)min((long long)p.nb, b0 + (r1 - w));
                f(tile, b0, b1);
                w += b1 - b0;
            }
        }
    };

    pdl_trigger(); /* triggering after the consumers' K loop instead measured the same */
    if (tid == 0) {
        for (int i = 0; i < ST; i++)
            mbar_init(&full[i], 33), mbar_init(&empty[i], WS_RELEASE_ARRIVALS);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (warp < 4) { /* producer warpgroup */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(PRODUCER_REGS));
        if (warp != 0) {
            if (CL && p.S > 1) {
                cluster_sync();
                cluster_sync();
            }
            return;
        }
        { /* the first segment's first weights into L2, then wait for the previous kernel */
            bool first = p.pdl;
            for_each_segment([&](int tile, int b0, int b1) {
                if (!first)
                    return;
                first = false;
                int t0, nt0;
                tile_origin(tile, t0, nt0);
                if (lane < min(WS_ROWS / 16, np16 - nt0))
                    l2_prefetch(p.qw + ((size_t)(nt0 + lane) * k64 + (size_t)b0 * KPB) * 512,
                                min((unsigned)(b1 - b0) * KPB * 512u,
                                    pdl_prefetch_per_slice(WS_ROWS / 16)));
            });
            pdl_wait();
        }
        int q = 0; /* stage sequence number, over all segments */
        for_each_segment([&](int tile, int b0, int b1) {
            int t0, nt0;
            tile_origin(tile, t0, nt0);
            const int nvalid = min(WS_ROWS / 16, np16 - nt0);
            const unsigned tx = A_BYTES + nvalid * KPB * 512;
            const uint8_t *wsrc =
                p.qw + ((size_t)(nt0 + (lane < nvalid ? lane : 0)) * k64 + (size_t)b0 * KPB) * 512;
            for (int b = b0; b < b1; b++, q++) {
                const int slot = q % ST;
                if (q >= ST)
                    mbar_wait(&empty[slot], ((q / ST) - 1) & 1);
                uint8_t *st = smem + slot * STAGE;
                if (lane == 0) {
                    mbar_arrive_expect_tx(&full[slot], tx);
                    tma_load_2d(st, &tmap_a, b * KS, t0, &full[slot]);
                }
                __syncwarp();
                if (lane < nvalid)
                    bulk_load(st + A_BYTES + lane * KPB * 512, wsrc + (size_t)(b - b0) * KPB * 512,
                              KPB * 512, &full[slot]);
                constexpr int SA_PER_LANE = (TOK + 31) / 32; /* 16-token tiles: lanes 0-15 */
#pragma unroll
                for (int j = 0; j < SA_PER_LANE; j++) {
                    const int tt = lane * SA_PER_LANE + j, t = t0 + tt;
                    if (tt < TOK)
                        cp_async4(st + A_BYTES + W_BYTES + tt * 4,
                                  p.sa + (size_t)(t < p.M ? t : 0) * p.nb + b, t < p.M);
                }
                cp_async_mbar_arrive(&full[slot]);
            }
        });
        cp_async_wait<0>();
        __syncwarp();
        if (CL && p.S > 1) { /* every thread of the cluster takes part in its two barriers */
            cluster_sync();
            cluster_sync();
        }
        return;
    }

    /* consumers: warp cw (0..7) owns weight rows [16*(nt0 + cw), +16) */
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(CONSUMER_REGS));
    pdl_wait(); /* the consumers write the outputs and the workspace */
    const int ctid = tid - 128, cw = ctid >> 5, g = lane >> 2, tq = lane & 3;
    /* the current segment: tile origin, this thread's first weight row, blocks [b0, b0 + nblk) */
    int t0 = 0, nt0 = 0, nrow = 0, b0 = 0, nblk = 0;
    bool row_ok = false;
    const uint16_t *sw_src = p.sw;
    float acc[NACC];
    /* Fold the int32 sums dd of block b0 + x (stage q) into acc. */
    auto promote = [&](const int(&dd)[NACC], int q, int x, float sw0, float sw1) {
        const uint8_t *st = smem + (q % ST) * STAGE;
        const float *ss = reinterpret_cast<const float *>(st + A_BYTES + W_BYTES);
#pragma unroll
        for (int j = 0; j < TOK / 8; j++) {
            float2 sa2 = *reinterpret_cast<const float2 *>(ss + 8 * j + 2 * tq);
#pragma unroll
            for (int r = 0; r < 4; r++) {
                const float sa = (r & 1) ? sa2.y : sa2.x, sc = sa * ((r >> 1) ? sw1 : sw0);
                const float df = (float)dd[j * 4 + r];
                acc[j * 4 + r] = fmaf(df, sc, acc[j * 4 + r]);
                if (BSUM) {
                    int t = t0 + 8 * j + 2 * tq + (r & 1), n = nrow + (r >> 1) * 8;
                    if (t < p.M && n < p.N)
                        p.bsum[((size_t)t * p.N + n) * p.nb + b0 + x] = dd[j * 4 + r] >> 4;
                }
            }
        }
    };
    /* every consumer thread is done with stage q */
    auto release = [&](int q) { mbar_arrive(&empty[q % ST]); };
    /* The segment's tile (acc) through shared memory at red, token-major in rows of WS_RED_LD
     * floats, stored four columns at a time, contiguous in y. The first barrier holds the writes
     * until both consumer warpgroups are done with what red held (stages, or the last tile). */
    auto store_tile_staged = [&](float *red) {
        asm volatile("bar.sync 1, 256;\n" ::: "memory");
        store_acc_tile_t<TOK / 8>(red, 0, cw * 16, WS_RED_LD,
                                  *reinterpret_cast<float(*)[TOK / 8][4]>(acc), g, tq);
        asm volatile("bar.sync 1, 256;\n" ::: "memory");
        const int rv = min(TOK, p.M - t0), n0 = nt0 * 16;
        const bool out4 = out4_ok(p);
        for (int i = ctid; i < rv * (WS_ROWS / 4); i += 256) {
            const int row = i / (WS_ROWS / 4), c = (i % (WS_ROWS / 4)) * 4;
            store_out4(p, t0 + row, n0 + c,
                       *reinterpret_cast<const float4 *>(red + row * WS_RED_LD + c), out4);
        }
    };
    /* Weight scales (/16 for the x16 trick) of blocks x .. x+SWD-1 in registers: each is
     * loaded SWD blocks ahead of its use. Loaded in the step itself, the scale's DRAM latency
     * was exposed once per block (the sw rows of successive blocks are Np apart). */
    constexpr int SWD = 4;
    unsigned short swq[SWD][2] = {};
    auto load_sw = [&](int x, unsigned short(&w)[2]) {
        const bool ok = row_ok && x < nblk;
        const uint16_t *q = sw_src + (size_t)(b0 + (ok ? x : 0)) * p.Np;
        w[0] = ok ? ld_sw(q) : 0;
        w[1] = ok ? ld_sw(q + 8) : 0;
    };
    /* the weight scales of block x (/16), advancing the look-ahead queue */
    auto next_sw = [&](int x, float &sw0, float &sw1) {
        sw0 = f16f(swq[0][0]) * 0.0625f, sw1 = f16f(swq[0][1]) * 0.0625f;
#pragma unroll
        for (int i = 0; i + 1 < SWD; i++)
            swq[i][0] = swq[i + 1][0], swq[i][1] = swq[i + 1][1];
        load_sw(x + SWD, swq[SWD - 1]);
    };
    /* wait for stage q and unpack its weight fragments (A, x16 trick) */
    auto load_a = [&](int q, uint32_t(&af)[KPB][2][4]) {
        const int slot = q % ST;
        const uint8_t *st = smem + slot * STAGE;
        mbar_wait(&full[slot], (q / ST) & 1);
#pragma unroll
        for (int c = 0; c < KPB; c++) {
            uint4 wf =
                *reinterpret_cast<const uint4 *>(st + A_BYTES + (cw * KPB + c) * 512 + lane * 16);
            af[c][0][0] = lo16x(wf.x), af[c][0][1] = hi16x(wf.x), af[c][0][2] = lo16x(wf.y),
            af[c][0][3] = hi16x(wf.y);
            af[c][1][0] = lo16x(wf.z), af[c][1][1] = hi16x(wf.z), af[c][1][2] = lo16x(wf.w),
            af[c][1][3] = hi16x(wf.w);
        }
    };
    /* stage q's 2*KPB wgmma into dd, one commit group; serial: each committed and waited for in
     * turn, all complete on return */
    auto issue = [&](int q, const uint32_t(&af)[KPB][2][4], int(&dd)[NACC], bool serial = false) {
        const uint32_t b_base = smem_u32(smem + (q % ST) * STAGE);
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int c = 0; c < KPB; c++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                if constexpr (TOK == 128)
                    wgmma_128(dd, af[c][h][0], af[c][h][1], af[c][h][2], af[c][h][3],
                              smem_desc<KPB>(b_base + (c * 2 + h) * 32), c | h);
                else if constexpr (TOK == 64)
                    wgmma_64(dd, af[c][h][0], af[c][h][1], af[c][h][2], af[c][h][3],
                             smem_desc<KPB>(b_base + (c * 2 + h) * 32), c | h);
                else if constexpr (TOK == 16)
                    wgmma_16(dd, af[c][h][0], af[c][h][1], af[c][h][2], af[c][h][3],
                             smem_desc<KPB>(b_base + (c * 2 + h) * 32), c | h);
                else
                    wgmma_32(dd, af[c][h][0], af[c][h][1], af[c][h][2], af[c][h][3],
                             smem_desc<KPB>(b_base + (c * 2 + h) * 32), c | h);
        if (serial) { /* this one done before the next (and on return) */
            asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
            asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
            asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
        }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); /* (empty when serial) */
    };
    int q = 0; /* stage sequence number, over all segments */
    for_each_segment([&](int tile, int sb0, int sb1) {
        tile_origin(tile, t0, nt0);
        nrow = (nt0 + cw) * 16 + g, row_ok = nrow < p.Np, sw_src = p.sw + (row_ok ? nrow : 0);
        b0 = sb0, nblk = sb1 - sb0;
#pragma unroll
        for (int i = 0; i < NACC; i++)
            acc[i] = 0.0f;
#pragma unroll
        for (int i = 0; i < SWD; i++)
            load_sw(i, swq[i]);
        if constexpr (WS_NEXT_FIRST && (TOK == 32 || (TOK == 16 && KPB == 2))) {
            /* Block x + 1's stage wait, fragments and wgmma (each committed and waited for in
         * turn) before block x's promotion and release: two sets of sums and of fragments,
         * unrolled by two blocks. This is the form measured (WS_NEXT_FIRST above), wait_group
         * barriers included (no wgmma is pending at them); a loop of two-block steps with one
         * set of fragments and without them measured 1.004x the one-block loop. */
            int da[NACC], db[NACC];
            uint32_t afa[KPB][2][4], afb[KPB][2][4];
            auto finish = [&](const int(&dd)[NACC],
                              int x) { /* block x, stage q: promote, release */
                                       float sw0, sw1;
                                       next_sw(x, sw0, sw1);
                                       promote(dd, q, x, sw0, sw1);
                                       release(q);
                                       q++;
            };
            if (nblk > 0) {
                int x = 0;
                load_a(q, afa);
                issue(q, afa, da, true);
                for (; x + 2 < nblk; x += 2) {
                    load_a(q + 1, afb);
                    issue(q + 1, afb, db, true);
                    asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
                    finish(da, x);
                    load_a(q + 1, afa);
                    issue(q + 1, afa, da, true);
                    asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
                    finish(db, x + 1);
                }
                if (x + 1 < nblk) {
                    load_a(q + 1, afb);
                    issue(q + 1, afb, db, true);
                    asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
                    finish(da, x);
                    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
                    finish(db, x + 1);
                } else {
                    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
                    finish(da, x);
                }
            }
        } else {
            /* one block at a time: A from registers, issue, wait, promote, release */
            int d[NACC];
            for (int x = 0; x < nblk; x++, q++) {
                float sw0, sw1;
                next_sw(x, sw0, sw1);
                uint32_t af[KPB][2][4];
                load_a(q, af);
                issue(q, af, d);
                asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
                promote(d, q, x, sw0, sw1);
                release(q);
            }
        }

#define W4AX_WS_FOR_EACH(BODY)                                                                     \
    _Pragma("unroll")                                                                              \
    for (int j = 0; j < TOK / 8; j++)                                                              \
        _Pragma("unroll")                                                                          \
    for (int r = 0; r < 4; r++) {                                                                  \
        int t = t0 + 8 * j + 2 * tq + (r & 1), n = nrow + (r >> 1) * 8;                            \
        if (t < p.M && n < p.N) {                                                                  \
            BODY;                                                                                  \
        }                                                                                          \
    }
        if constexpr (SK) {
            if (nblk < p.nb) {
                /* A part of the tile. A CTA has at most two such pieces, its first and its last
             * segment: it leaves each in its own workspace slot (0 / 1), and the last of the
             * tile's CTAs to finish sums them in K order (CTA order) from 0.0f. */
                const long long W = (long long)p.tiles_n * p.tiles_m * p.nb, G = gridDim.x,
                                w0 = (long long)tile * p.nb;
                auto cta_of = [&](long long w) { /* the CTA whose share holds block w */
                                                 long long c = w * G / W;
                                                 while (c + 1 < G && W * (c + 1) / G <= w)
                                                     c++;
                                                 while (c > 0 && W * c / G > w)
                                                     c--;
                                                 return (int)c;
                };
                auto piece = [&](int c) { /* CTA c's slot for this tile */
                                          const int first_tile = (int)(W * c / G / p.nb);
                                          return p.part +
                                                 ((size_t)c * 2 + (first_tile == tile ? 0 : 1)) *
                                                     (256 * NACC);
                };
                float *mine = piece(blockIdx.x);
#pragma unroll
                for (int i = 0; i < NACC; i++)
                    mine[i * 256 + ctid] = acc[i];
                const int c0 = cta_of(w0), c1 = cta_of(w0 + p.nb - 1);
                if (!splitk_last_consumers(p, ctid, tile, c1 - c0 + 1))
                    return;
#pragma unroll
                for (int i = 0; i < NACC; i++)
                    acc[i] = 0.0f;
                for (int c = c0; c <= c1; c++) {
                    const float *pc = piece(c);
#pragma unroll
                    for (int i = 0; i < NACC; i++)
                        acc[i] += __ldcg(pc + i * 256 + ctid);
                }
            } else if (p.persist) {
                /* A persistent CTA's whole tile, stored as the S = 1 path below does but through its
             * own staging area past the ring (the producer is already filling the ring with the
             * next tile's blocks): the first barrier keeps this tile's writes behind the other
             * warpgroup's reads of the previous one. */
                store_tile_staged(
                    reinterpret_cast<float *>(smem + ws_persist_staging_offset(KPB, TOK)));
                return;
            }
            W4AX_WS_FOR_EACH(store_out(p, t, n, acc[j * 4 + r]))
            return;
        }
        if (p.S == 1) {
            if constexpr (TOK == 128) {
                /* The tile through the (now idle) stage memory, token-major as the cluster
             * reduction's below, stored four columns at a time, contiguous in y (
             * 0.985x the time at M = 512-8192; at 32-token tiles 1.07x on 70B gate_up, M = 24) */
                store_tile_staged(
                    reinterpret_cast<float *>(smem)); /* the stages are idle: the last segment */
            } else {
                W4AX_WS_FOR_EACH(store_out(p, t, n, acc[j * 4 + r]))
            }
            return;
        }
        if constexpr (CL) {
            /* The S splits of this tile are one cluster (dims 1 x 1 x S). Each CTA leaves its
         * fp32 tile in its own (now idle) stage memory, token-major with rows of WS_RED_LD
         * floats (conflict-free stores); CTA rank q then sums token rows [q*rv/S, (q+1)*rv/S)
         * of the S tiles through distributed shared memory, four columns per load, in split
         * order from 0.0f (the additions of the global path, so the same bits). */
            float *red = reinterpret_cast<float *>(smem);
            asm volatile("bar.sync 1, 256;\n" ::
                             : "memory"); /* both warpgroups are done with the stages */
            store_acc_tile_t<TOK / 8>(red, 0, cw * 16, WS_RED_LD,
                                      *reinterpret_cast<float(*)[TOK / 8][4]>(acc), g, tq);
            cluster_sync();
            const int q = (int)cluster_rank(), rv = min(TOK, p.M - t0);
            const bool out4 = out4_ok(p);
            const int r0 = q * rv / p.S, r1 = (q + 1) * rv / p.S, n0 = nt0 * 16;
            for (int i = ctid; i < (r1 - r0) * (WS_ROWS / 4); i += 256) {
                const int row = r0 + i / (WS_ROWS / 4), c = (i % (WS_ROWS / 4)) * 4;
                float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                for (int j = 0; j < p.S; j++) {
                    float4 x = ld_dsmem4(red + row * WS_RED_LD + c, j);
                    v.x += x.x, v.y += x.y, v.z += x.z, v.w += x.w;
                }
                store_out4(p, t0 + row, n0 + c, v, out4);
            }
            cluster_sync(); /* no CTA leaves while another still reads its shared memory */
        } else {
            W4AX_WS_FOR_EACH(p.part[((size_t)blockIdx.z * p.M + t) * p.N + n] = acc[j * 4 + r])
            if (!splitk_last_consumers(p, ctid, blockIdx.x, p.S))
                return;
            /* EB elements at a time, split-outer: EB loads in flight, each element still summed in
         * split order from 0.0f (fewer at two or three CTAs per SM: 16 spilled at 104 registers) */
            constexpr int EB = CPS == 1 ? 16 : 4;
#pragma unroll
            for (int jc = 0; jc < TOK / 8; jc += EB / 4) {
                float v[EB];
#pragma unroll
                for (int e = 0; e < EB; e++)
                    v[e] = 0.0f;
                for (int j2 = 0; j2 < p.S; j2++)
#pragma unroll
                    for (int e = 0; e < EB; e++) {
                        int t = t0 + 8 * (jc + e / 4) + 2 * tq + (e & 1),
                            n = nrow + ((e >> 1) & 1) * 8;
                        if (t < p.M && n < p.N)
                            v[e] += __ldcg(&p.part[((size_t)j2 * p.M + t) * p.N + n]);
                    }
#pragma unroll
                for (int e = 0; e < EB; e++) {
                    int t = t0 + 8 * (jc + e / 4) + 2 * tq + (e & 1), n = nrow + ((e >> 1) & 1) * 8;
                    if (t < p.M && n < p.N)
                        store_out(p, t, n, v[e]);
                }
            }
        }
    });
#undef W4AX_WS_FOR_EACH
#elif defined(__CUDA_ARCH__)
    /* Code for any other target has no body: has_wgmma() (which tells the two apart by this
     * body's registers) keeps plans off this kernel there, so reaching it is a bug that must
     * not pass for a result (y would be left unwritten). */
    __trap();
#endif
}

} // namespace
