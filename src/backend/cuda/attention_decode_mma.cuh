/* attention_decode_mma.cuh — the tensor-core decode kernel over an INT4 cache
 * (attn_decode_mma_kernel): the steps whose every tile is one token, at head dims 64 and 128,
 * KV groups of 16, 32, 64 or 128 channels, GQA groups up to 8. The other decode steps (INT8 and
 * fp16 caches, other shapes, COMET_CUDA_ATTN_DECODE_MMA=0) take attn_decode_kernel. Its fused
 * form (template flag ROPE) also does the step's RoPE and KV append (rope_kv_append's
 * register kernel) itself: attention.h comet_cuda_rope_attention_quant.
 * Part of attention.cu's one translation unit (it includes every attention_*.cuh), so the
 * kernels compile exactly as one file would.
 */
#pragma once

#include "backend/cuda/attention_common.cuh"
#include "backend/cuda/ptx.cuh"
#include "backend/cuda/rope_kv.cuh"

namespace {

/* Four warps a CTA, each with its own ring of DMMA_STAGES 16-key tiles in shared memory. */
constexpr int DMMA_WARPS = 4, DMMA_THREADS = 32 * DMMA_WARPS, DMMA_STAGES = 3;
static_assert(DMMA_THREADS == ROPE_THREADS, "the fused form appends with kv_append_regs' threads");
/* Most query heads a CTA takes: the g rows of one m16 tile that are not padding */
constexpr int DMMA_MAX_G = 8;

__device__ __forceinline__ __half2 dmma_h2(uint32_t x) {
    return *reinterpret_cast<const __half2 *>(&x);
}
__device__ __forceinline__ uint32_t dmma_u32(__half2 x) {
    return *reinterpret_cast<const uint32_t *>(&x);
}

/* Two fp16 codes of w (nibbles at bits 0..3 and 16..19) less 8, as an exact half2 in -8..7:
 * the nibbles under the exponent of 1024 (one lop3), less 1032. */
__device__ __forceinline__ uint32_t dmma_nib2(uint32_t w) {
    uint32_t r;
    asm("lop3.b32 %0, %1, %2, %3, 0xea;\n" : "=r"(r) : "r"(w), "n"(0x000f000f), "n"(0x64006400));
    const __half2 h = __hsub2(*reinterpret_cast<const __half2 *>(&r), __float2half2_rn(1032.0f));
    return *reinterpret_cast<const uint32_t *>(&h);
}

/* (x0, x1) as an fp16 pair hi and the rest lo, hi + lo = x to about 2^-22 of it. */
__device__ __forceinline__ void dmma_split(float x0, float x1, uint32_t &hi, uint32_t &lo) {
    const __half2 h = __floats2half2_rn(x0, x1);
    const float2 f = __half22float2(h);
    const __half2 l = __floats2half2_rn(x0 - f.x, x1 - f.y);
    hi = *reinterpret_cast<const uint32_t *>(&h);
    lo = *reinterpret_cast<const uint32_t *>(&l);
}

/* The zeros of centred codes, z + 8 s, of two (scale, zero) words (fp16 s low, z high) as an
 * fp16 pair hi + lo = z + 8 s exactly (TwoSum of 8 s and z; fp16 arithmetic keeps subnormals,
 * so the sum's rounding error is exact in lo), so that s (c - 8) + hi + lo = s c + z. Exact
 * while |z| < 32768 and s < 2048 (the intermediates stay finite; checked over random fp16
 * pairs, subnormals included); groups with larger values give infinities or NaN. */
__device__ __forceinline__ void dmma_zero8(uint32_t w0, uint32_t w1, uint32_t &hi, uint32_t &lo) {
    const __half2 s = dmma_h2(__byte_perm(w0, w1, 0x5410)),
                  z = dmma_h2(__byte_perm(w0, w1, 0x7632));
    const __half2 e8 = __float2half2_rn(8.0f);
    const __half2 h = __hfma2(s, e8, z);           /* RN(8 s + z) */
    const __half2 zv = __hfma2(s, __hneg2(e8), h); /* RN(h - 8 s): z's share of h */
    const __half2 av = __hsub2(h, zv);             /* 8 s's share of h */
    const __half2 l = __hadd2(__hfma2(s, e8, __hneg2(av)), __hsub2(z, zv));
    hi = dmma_u32(h);
    lo = dmma_u32(l);
}

/* d = A B on mma.sync m16n8k16 (fp16 operands, fp32 d) with a zero accumulator, so that the
 * product needs no zeroed registers; A's fragment registers a0..a3. */
__device__ __forceinline__ void dmma_mma0(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                          uint32_t a3, uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
        "{%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(0.0f));
}

/* 2^x by the SFU alone (ex2.approx.ftz: about 2^-22 relative, results below 2^-126 flushed
 * to 0, 2^-inf = 0): the softmax weights, whose largest is 256, lose nothing to the flush. */
__device__ __forceinline__ float dmma_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* The fused form's arguments (ROPE): attention's, RoPE's table and the step's new k and v (k
 * before RoPE; neither is written). Derived from att_args, so that the kernel's parameter is
 * att_args itself in the plain form and its fields sit at the same offsets in both. */
struct att_rope_args : att_args {
    const double *inv_freq; /* [D / 2] */
    const float *k, *v;     /* [T, Hkv, D] */
};
template <bool ROPE>
using dmma_args = typename std::conditional<ROPE, att_rope_args, att_args>::type;

/* Flash-decoding over an INT4 paged cache on tensor cores (mma.sync m16n8k16, fp16 operands,
 * fp32 accumulators).
 *
 * Grid as attn_decode_kernel's (blockIdx.x = tile = one token, y = KV head, z = key split),
 * DMMA_THREADS threads. The g query heads of the KV head are the M rows of every mma (rows
 * g..15 are zeros: tensor-core math costs little here, the bytes and the instructions per key
 * are what count). Split z takes keys [z * chunk, (z + 1) * chunk) of 0..positions[t], chunk =
 * ceil(n_keys / n_splits) rounded up to 16; warp w of the CTA takes its 16-key tiles w, w + 4,
 * ... Each lane copies, per tile, half of one key's K and V rows (cp.async into the warp's
 * ring, three tiles deep, the page id of a tile loaded one iteration before its copy): code
 * rows as stored (rows padded by 16 bytes: the lanes' 32-bit reads fall in distinct banks),
 * the (scale, zero) words transposed to [group][key]. Keys past the split's end copy its last
 * key and are masked.
 * Scores. An INT4 code c less 8 is exact in fp16 (lop3 under the exponent of 1024, one half2
 * subtract of 1032 per two codes), so with K = s c + z = s (c - 8) + z8, z8 = z + 8 s, per
 * (key, group) a key's score is
 *   q . k = sum over groups of s (q_grp . (c_grp - 8)) + z8 sum(q_grp).
 * Centred, neither term is much larger than the score: with codes 0..15 and z near -8 s (a group
 * around 0) both would be about 8 s sum(q_grp) and cancel, and mma.sync's fp32 sums, which cut each
 * product and the accumulator toward zero at 2^-23 or so of the largest (not IEEE rounding), then
 * lose 2^-23 of the large terms in every partial sum: 1e-4 at 5000 keys instead of 3e-6
 * (scripts/decode_mma_emu.py --test-shapes). z8 enters as fp16 hi + lo, exact (dmma_zero8). k-step
 * b of the mma takes channels 16b .. 16b + 15 (one group or a part of one: G is 16, 32, 64 or 128,
 * NGR = D / G groups a key, a template parameter), its product with a fresh accumulator is scaled
 * by the keys' s in fp32 and added; the z terms are one more mma, of the per-group sums of q
 * against the keys' z8 (row gi: qz_hi against z8_hi (k columns 0..7) and z8_lo (8..15); row gi + 8,
 * a padding head: qz_lo z8_hi, added to row gi). q is held as fp16 hi + lo (two mmas per k-step; q
 * alone in fp16 misses the decode bound of 2e-5 by an order of magnitude), scaled first by a power
 * of two per head that puts its largest channel in [64, 128): the lo parts stay normal and the
 * group sums (at most 128 channels) stay below fp16's 65504. Within a k-step the channels are
 * permuted so that a lane's four of each key come from one 32-bit word of the code row (bytes t & 1
 * and (t & 1) + 2 of word 2b + t / 2 for lane column t); q's fragments follow the same order.
 * Softmax. fp32 online softmax in base 2 on the accumulator registers (a head's row is held by a
 * quad of lanes); P = 2^(s - max + 8) <= 256, so that P times a V scale stays an fp16 normal down
 * to tiny weights (the factor cancels in O / l and in the split combine) and finite for V scales
 * below 256 (groups whose values span less than 3840); the rescaling of O is skipped when no row's
 * max moved in the tile (it would multiply by 1).
 * O += P V, as O^T += V^T P^T: the 16 channels of block b are the M rows (no padding rows; the
 * heads are the 8 columns), keys the k16 step. V = s (c - 8) + z8 per (key, group) too (a mean-free
 * V averaged over thousands of keys would otherwise be the small difference of two sums 8 s P
 * each): the B operand is (P s)^T as fp16 hi + lo (hi = P_hi s rounded, lo = the rest of P_hi s by
 * an fp16 FMA, exact, plus P_lo s; P's accumulator layout of S is the B layout of P^T), the A
 * operand V's centred codes: a lane gathers byte gi of the block (channels 16b + 2gi, + 1) of four
 * keys' code rows with byte permutes, so one lop3 gives the pair of keys a register wants. The z
 * terms sum P z8 per (group, head) in two more mmas a tile (the keys' z8, hi in row gi and lo in
 * row gi + 8, against P^T hi and P^T lo), added to the group's channels at the end. Every product
 * is fp16 x fp16 exact in fp32; the roundings are fp16 hi + lo splits (about 2^-22) and fp32 sums
 * (mma.sync's truncating ones included); the lane-level index math and those roundings are emulated
 * on the CPU by scripts/decode_mma_emu.py.
 * End: the warps meet in shared memory and merge in warp order (deterministic); one split writes
 * the normalized rows (rotated back by H_D when the cache is rotated), several write the
 * unnormalized rows and (max in natural-log units, sum) to the workspace for attn_combine_kernel,
 * as attn_decode_kernel does.
 * ROPE (the fused form, a decode step of one token a sequence; q and the step's k and v as the
 * projections left them, att_rope_args): every CTA RoPEs its g staged query heads in shared
 * memory before the rotation, thread f < D / 2 taking pair (f, f + D / 2) of every head with
 * one angle (rope_cs, rope_pair: rope_row's operations, so the q rope_kv_append would leave).
 * The split whose keys end at the token's own key (position n_keys - 1; one split does) also
 * loads the page slot and v before staging q, RoPEs k into shared memory over the ring (no
 * copy has been issued yet) and appends k and v with kv_append_regs (rope_kv.cuh), the register
 * kernel's own code for its end: the same codes, scales and zeros in the slot. Its global
 * stores come before its ring's copies through the barrier after the heads' scaling (CTA
 * scope: the copies are this CTA's own reads). The ring's first page id is loaded early too.
 * The attention that follows is the plain form's, on the same values: the same bits. */
template <int D, int NGR, bool ROPE = false>
static __global__ void __launch_bounds__(DMMA_THREADS) attn_decode_mma_kernel(dmma_args<ROPE> a) {
    static_assert(D == 64 || D == 128, "head dims 64 and 128");
    static_assert(NGR >= 1 && NGR <= D / 16 && D % (16 * NGR) == 0, "groups of 16k channels");
    constexpr int G = D / NGR;     /* channels of a (scale, zero) group (a.L.G) */
    constexpr int CS = D / 2 + 16; /* bytes of a code row in shared memory (16 of padding) */
    constexpr int NB = D / 16;     /* 16-channel blocks: k-steps of S, m-tiles of O^T */
    constexpr int SZ = 32 * CS;    /* byte offset of the K (scale, zero) words in a stage */
    constexpr int STAGE = SZ + 2 * NB * 16 * 4; /* K, V codes; K, V [group][key] words */
    constexpr int RING = DMMA_WARPS * DMMA_STAGES * STAGE;
    constexpr int MERGE = DMMA_WARPS * DMMA_MAX_G * (D + 8 + 2) * 4;
    __shared__ __align__(16) unsigned char ring[RING > MERGE ? RING : MERGE];
    __shared__ __align__(16) float qs[DMMA_MAX_G * D]; /* [8, D] q (zeros past g), then out */
    __shared__ int qexp[DMMA_MAX_G];

    const kv_args &L = a.L;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int gi = lane >> 2, ti = lane & 3; /* the fragments' row (head) and column pair */
    const int kvh = blockIdx.y, split = blockIdx.z, g = a.g, H = a.H;
    const int t = a.tiles[2 * blockIdx.x], seq = a.tiles[2 * blockIdx.x + 1];
    const int n_keys = a.positions[t] + 1;
    const int chunk = ((n_keys + a.n_splits - 1) / a.n_splits + 15) & ~15;
    const int kbeg = min(n_keys, split * chunk), kend = min(n_keys, kbeg + chunk);
    const int pbase = a.page_indptr[seq];
    const size_t v_off = (size_t)L.Hkv * L.tile_bytes;

    /* ROPE: the step's own key (position n_keys - 1) belongs to exactly one split, the one
     * whose keys end at n_keys (the splits cut 0 .. n_keys - 1 into consecutive runs of chunk
     * keys; later splits are empty, kbeg = kend = n_keys). That CTA appends the token's K and
     * V of this KV head before its ring copies a key: its page slot and v are loaded first,
     * with the ring's first page id. */
    [[maybe_unused]] bool append = false;
    [[maybe_unused]] int pg_first = 0, aslot = 0;
    [[maybe_unused]] uint8_t *atile[2] = {NULL, NULL};
    [[maybe_unused]] float avr[KV_APPEND_R];
    if constexpr (ROPE) {
        append = kbeg < kend && kend == n_keys;
        if (kbeg + 16 * warp < kend) { /* page_of(kfirst), below */
            const int kp = min(kbeg + 16 * warp + (lane >> 1), kend - 1);
            pg_first = a.page_indices[pbase + (a.p_shift >= 0 ? kp >> a.p_shift : kp / L.P)];
        }
        if (append) {
            const int pos = n_keys - 1;
            const int page = a.page_indices[pbase + pos / L.P];
            aslot = pos % L.P;
            atile[0] = kv_tile(L, page, 0, kvh), atile[1] = kv_tile(L, page, 1, kvh);
            kv_append_load_v(a.v + ((size_t)t * L.Hkv + kvh) * D, D, tid, avr);
        }
    }

    /* q: staged, rotated, then each head scaled by 2^qe (largest channel in [64, 128)) */
    const float *qg = a.q + ((size_t)t * H + (size_t)kvh * g) * D; /* [g, D] */
    for (int i = tid; i < DMMA_MAX_G * D; i += DMMA_THREADS)
        qs[i] = i < g * D ? qg[i] : 0.0f;
    [[maybe_unused]] float cs = 0.0f, sn = 0.0f, kx0 = 0.0f, kx1 = 0.0f;
    if constexpr (ROPE) { /* thread f < D / 2: pair (f, f + D / 2)'s angle and k's pair */
        if (tid < D / 2) {
            rope_cs(n_keys - 1, a.inv_freq, tid, cs, sn);
            if (append) {
                const float *kr = a.k + ((size_t)t * L.Hkv + kvh) * D;
                kx0 = kr[tid], kx1 = kr[tid + D / 2];
            }
        }
    }
    __syncthreads();
    if constexpr (ROPE) {
        /* RoPE on the staged heads and on k (into ks, over the ring, which no copy has
         * written yet), rope_kv_append's operations on the same values (rope_row) */
        float *ks = reinterpret_cast<float *>(ring), *vs = ks + COMET_CUDA_KV_MAX_HEAD_DIM;
        auto runs = reinterpret_cast<kv_range(*)[COMET_CUDA_KV_MAX_HEAD_DIM / 8]>(
            vs + COMET_CUDA_KV_MAX_HEAD_DIM);
        if (tid < D / 2) {
            for (int h = 0; h < g; h++) {
                float *row = qs + h * D;
                rope_pair(row[tid], row[tid + D / 2], cs, sn, row[tid], row[tid + D / 2]);
            }
            if (append)
                rope_pair(kx0, kx1, cs, sn, ks[tid], ks[tid + D / 2]);
        }
        __syncthreads();
        /* its stores reach this CTA's own cp.async copies of the key: the barrier after the
         * heads' scaling below orders them before every copy (CTA scope, which covers the
         * copies' global reads; no other CTA reads the key) */
        if (append)
            kv_append_regs<4>(L, ks, vs, runs, avr, atile, aslot, a.rotate, tid, lane);
    }
    if (a.rotate)
        wht_smem(qs, g, D, D);
    for (int h = warp; h < DMMA_MAX_G; h += DMMA_WARPS) {
        float mx = 0.0f;
        for (int d = lane; d < D; d += 32)
            mx = fmaxf(mx, fabsf(qs[h * D + d]));
#pragma unroll
        for (int off = 16; off > 0; off >>= 1)
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
        if (lane == 0) {
            int ex = 0;
            if (mx > 0.0f)
                frexpf(mx, &ex); /* mx in [2^(ex-1), 2^ex) */
            qexp[h] = min(100, max(-100, 7 - ex));
        }
    }
    __syncthreads();
    const float qmul = ldexpf(1.0f, qexp[gi]);
    /* A fragments of q (row gi; rows gi + 8 are zeros): k-step b, columns 2ti, 2ti + 1 are
     * channels c0, c0 + 4, columns 2ti + 8, 2ti + 9 are c0 + 1, c0 + 5 (c0 = 16b + 8 (ti / 2)
     * + 2 (ti % 2)), the order the codes' B fragments take (below) */
    uint32_t qh[NB][2], ql[NB][2];
#pragma unroll
    for (int b = 0; b < NB; b++) {
        const float *qr = qs + gi * D + 16 * b + 8 * (ti >> 1) + 2 * (ti & 1);
        dmma_split(qr[0] * qmul, qr[4] * qmul, qh[b][0], ql[b][0]);
        dmma_split(qr[1] * qmul, qr[5] * qmul, qh[b][1], ql[b][1]);
    }
    /* A fragments of the per-group sums of q (columns 2ti, 2ti + 1: groups 2ti, 2ti + 1) */
    uint32_t qzh, qzl;
    {
        float qz[2];
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int grp = 2 * ti + e;
            float sum = 0.0f;
            if (grp < NGR)
                for (int d = 0; d < G; d++)
                    sum += qs[gi * D + grp * G + d];
            qz[e] = sum * qmul;
        }
        dmma_split(qz[0], qz[1], qzh, qzl);
    }
    /* scores to base-2 softmax units for this lane's head */
    const float fh = a.scale * 1.44269504088896341f * ldexpf(1.0f, -qexp[gi]);

    /* O^T [16 channels of block b, heads]: rows gi and gi + 8 are channels 16b + 2gi and
     * 16b + 2gi + 1, columns 2ti and 2ti + 1 heads; za^T [groups, heads] the z terms */
    float ot[NB][4], za[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int b = 0; b < NB; b++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            ot[b][e] = 0.0f;
    float m_r = -INFINITY, l_r = 0.0f;

    /* the warp's tiles: keys k0 .. k0 + 15, k0 = kbeg + 16 (warp + 4 i); lane copies half
     * (hh) of key r's rows */
    unsigned char *wring = ring + warp * DMMA_STAGES * STAGE;
    const uint32_t wring_s = comet_ptx::smem_u32(wring);
    const int r = lane >> 1, hh = lane & 1;
    const int kfirst = kbeg + 16 * warp, kstep = 16 * DMMA_WARPS;
    auto page_of = [&](int k0) {
        if (k0 >= kend)
            return 0;
        const int kp = min(k0 + r, kend - 1);
        return a.page_indices[pbase + (a.p_shift >= 0 ? kp >> a.p_shift : kp / L.P)];
    };
    auto issue = [&](int k0, int pg, int st) {
        if (k0 < kend) {
            const int kp = min(k0 + r, kend - 1);
            const int slot = a.p_shift >= 0 ? kp & (L.P - 1) : kp % L.P;
            const uint8_t *kt = L.base + ((size_t)pg * 2 * L.Hkv + kvh) * L.tile_bytes;
            const uint8_t *vt = kt + v_off;
            const uint32_t sb = wring_s + st * STAGE;
            const size_t crow = (size_t)slot * L.code_row,
                         srow = L.sz_offset + (size_t)slot * L.sz_row;
#pragma unroll
            for (int c = hh; c < D / 32; c += 2) { /* 16-byte chunks of a code row */
                comet_ptx::cp_async16_s(sb + r * CS + 16 * c, kt + crow + 16 * c);
                comet_ptx::cp_async16_s(sb + (16 + r) * CS + 16 * c, vt + crow + 16 * c);
            }
#pragma unroll
            for (int w = hh; w < NGR; w += 2) {
                comet_ptx::cp_async4_s(sb + SZ + (w * 16 + r) * 4, kt + srow + 4 * w, true);
                comet_ptx::cp_async4_s(sb + SZ + NB * 64 + (w * 16 + r) * 4, vt + srow + 4 * w,
                                       true);
            }
        }
        comet_ptx::cp_async_commit();
    };
    int pg_next = ROPE ? pg_first : page_of(kfirst);
    issue(kfirst, pg_next, 0);
    pg_next = page_of(kfirst + kstep);
    issue(kfirst + kstep, pg_next, 1);
    pg_next = page_of(kfirst + 2 * kstep);

    /* this lane's byte of a V code word (byte gi % 4 of keys 2ti (+8) and 2ti + 1 (+9) into
     * bytes 0 and 2) */
    const uint32_t vsel =
        (uint32_t)((gi & 3) | (gi & 3) << 4 | (4 + (gi & 3)) << 8 | (4 + (gi & 3)) << 12);
    const uint32_t ksh = 8u * (uint32_t)(ti & 1); /* bytes ti % 2 and ti % 2 + 2 of a word */
    int st = 0;
    for (int k0 = kfirst; k0 < kend; k0 += kstep) {
        issue(k0 + 2 * kstep, pg_next, st == 0 ? 2 : st - 1);
        pg_next = page_of(k0 + 3 * kstep);
        comet_ptx::cp_async_wait<2>();
        __syncwarp();
        const unsigned char *sb = wring + st * STAGE;
        const uint32_t *ksz = reinterpret_cast<const uint32_t *>(sb + SZ);           /* [grp][16] */
        const uint32_t *vsz = reinterpret_cast<const uint32_t *>(sb + SZ + NB * 64); /* [grp][16] */

        /* S [heads, 16 keys]: n-tile n holds keys 8n + 2ti, 8n + 2ti + 1 of head gi */
        float s[2][4];
#pragma unroll
        for (int n = 0; n < 2; n++) {
            const int key = 8 * n + gi; /* this lane's B column */
            const uint32_t z0 = 2 * ti < NGR ? ksz[2 * ti * 16 + key] : 0u;
            const uint32_t z1 = 2 * ti + 1 < NGR ? ksz[(2 * ti + 1) * 16 + key] : 0u;
            uint32_t zh, zl; /* the zeros z + 8 s of groups 2ti, 2ti + 1 as fp16 hi + lo */
            dmma_zero8(z0, z1, zh, zl);
            /* row gi: qz_hi (z_hi + z_lo) (k columns 0..7 against zh, 8..15 against zl); row
             * gi + 8 (a padding head): qz_lo z_hi, added to row gi */
            dmma_mma0(s[n], qzh, qzl, qzh, 0u, zh, zl);
            s[n][0] += s[n][2];
            s[n][1] += s[n][3];
            const unsigned char *crow = sb + key * CS + 4 * (ti >> 1);
#pragma unroll
            for (int b = 0; b < NB; b++) {
                const uint32_t w = *reinterpret_cast<const uint32_t *>(crow + 8 * b) >> ksh;
                const uint32_t b0 = dmma_nib2(w), b1 = dmma_nib2(w >> 4);
                float c[4];
                const uint32_t al[4] = {ql[b][0], 0u, ql[b][1], 0u};
                dmma_mma0(c, qh[b][0], 0u, qh[b][1], 0u, b0, b1);
                comet_ptx::mma_f16(c, al, b0, b1);
                const uint2 sc =
                    *reinterpret_cast<const uint2 *>(ksz + (16 * b / G) * 16 + 8 * n + 2 * ti);
                s[n][0] = fmaf(__low2float(dmma_h2(sc.x)), c[0], s[n][0]);
                s[n][1] = fmaf(__low2float(dmma_h2(sc.y)), c[1], s[n][1]);
            }
        }

        /* online softmax of head gi over the tile (its quad holds the 16 keys) */
        float mx = -INFINITY;
#pragma unroll
        for (int n = 0; n < 2; n++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                s[n][e] = k0 + 8 * n + 2 * ti + e < kend ? s[n][e] * fh : -INFINITY;
                mx = fmaxf(mx, s[n][e]);
            }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float mnew = fmaxf(m_r, mx); /* finite: a tile has a key before kend */
        if (__any_sync(0xffffffffu, mnew != m_r)) {
            const float corr = dmma_exp2(m_r - mnew); /* 0 from -inf */
            /* O^T's columns are heads 2ti and 2ti + 1: the rows of lanes 8ti and 8ti + 4 */
            const float c0 = __shfl_sync(0xffffffffu, corr, 8 * ti);
            const float c1 = __shfl_sync(0xffffffffu, corr, 8 * ti + 4);
#pragma unroll
            for (int b = 0; b < NB; b++) {
                ot[b][0] *= c0, ot[b][1] *= c1;
                ot[b][2] *= c0, ot[b][3] *= c1;
            }
            za[0] *= c0, za[1] *= c1;
            za[2] *= c0, za[3] *= c1;
            l_r *= corr;
            m_r = mnew;
        }
        const float mref = m_r - 8.0f;
        float p[2][2];
#pragma unroll
        for (int n = 0; n < 2; n++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                p[n][e] = dmma_exp2(s[n][e] - mref);
                l_r += p[n][e];
            }
        /* P^T as B fragments (column gi; keys 2ti, 2ti + 1 and 2ti + 8, 2ti + 9), hi + lo */
        uint32_t ph0, pl0, ph2, pl2;
        dmma_split(p[0][0], p[0][1], ph0, pl0);
        dmma_split(p[1][0], p[1][1], ph2, pl2);

        /* the z terms: za^T [groups, heads] += Zv^T P^T (A row gi: group gi's zeros) */
        {
            uint2 z01 = make_uint2(0u, 0u), z89 = z01;
            if (gi < NGR) {
                z01 = *reinterpret_cast<const uint2 *>(vsz + gi * 16 + 2 * ti);
                z89 = *reinterpret_cast<const uint2 *>(vsz + gi * 16 + 8 + 2 * ti);
            }
            /* z + 8 s as fp16 hi (row gi) + lo (row gi + 8: za[2], za[3], added at the end) */
            uint32_t az[4];
            dmma_zero8(z01.x, z01.y, az[0], az[1]);
            dmma_zero8(z89.x, z89.y, az[2], az[3]);
            comet_ptx::mma_f16(za, az, ph0, ph2);
            comet_ptx::mma_f16(za, az, pl0, pl2);
        }
        /* block b: O^T += V^T (P s)^T, V^T's rows gi and gi + 8 the codes of channels
         * 16b + 2gi and 16b + 2gi + 1 (low and high nibble of byte gi of the block) */
        const unsigned char *v01 = sb + (16 + 2 * ti) * CS + 4 * (gi >> 2);
#pragma unroll
        for (int b = 0; b < NB; b++) {
            const uint2 s01 = *reinterpret_cast<const uint2 *>(vsz + (16 * b / G) * 16 + 2 * ti);
            const uint2 s89 =
                *reinterpret_cast<const uint2 *>(vsz + (16 * b / G) * 16 + 8 + 2 * ti);
            const __half2 sa = dmma_h2(__byte_perm(s01.x, s01.y, 0x5410)); /* keys 2ti, +1 */
            const __half2 sb8 = dmma_h2(__byte_perm(s89.x, s89.y, 0x5410));
            const __half2 h0 = __hmul2(dmma_h2(ph0), sa), h2 = __hmul2(dmma_h2(ph2), sb8);
            const __half2 l0 = __hfma2(dmma_h2(pl0), sa, __hfma2(dmma_h2(ph0), sa, __hneg2(h0)));
            const __half2 l2 = __hfma2(dmma_h2(pl2), sb8, __hfma2(dmma_h2(ph2), sb8, __hneg2(h2)));
            const unsigned char *vr = v01 + 8 * b;
            const uint32_t w0 = *reinterpret_cast<const uint32_t *>(vr);
            const uint32_t w1 = *reinterpret_cast<const uint32_t *>(vr + CS);
            const uint32_t w8 = *reinterpret_cast<const uint32_t *>(vr + 8 * CS);
            const uint32_t w9 = *reinterpret_cast<const uint32_t *>(vr + 9 * CS);
            const uint32_t x01 = __byte_perm(w0, w1, vsel), x89 = __byte_perm(w8, w9, vsel);
            const uint32_t av[4] = {dmma_nib2(x01), dmma_nib2(x01 >> 4), dmma_nib2(x89),
                                    dmma_nib2(x89 >> 4)};
            comet_ptx::mma_f16(ot[b], av, dmma_u32(h0), dmma_u32(h2));
            comet_ptx::mma_f16(ot[b], av, dmma_u32(l0), dmma_u32(l2));
        }
        __syncwarp(); /* the stage is read before a later iteration's copy overwrites it */
        st = st == DMMA_STAGES - 1 ? 0 : st + 1;
    }
    l_r += __shfl_xor_sync(0xffffffffu, l_r, 1);
    l_r += __shfl_xor_sync(0xffffffffu, l_r, 2);

    /* merge the warps: rows, z terms and (max, sum) to shared memory over the ring */
    comet_ptx::cp_async_wait<0>();
    __syncthreads();
    float *ow = reinterpret_cast<float *>(ring);  /* [W, 8, D] */
    float *zw = ow + DMMA_WARPS * DMMA_MAX_G * D; /* [W, 8, 8] */
    float *mw = zw + DMMA_WARPS * DMMA_MAX_G * 8; /* [W, 8, 2] (max in base 2, sum) */
    {
        float *o0 = ow + (warp * DMMA_MAX_G + 2 * ti) * D + 2 * gi, *o1 = o0 + D;
#pragma unroll
        for (int b = 0; b < NB; b++) {
            *reinterpret_cast<float2 *>(o0 + 16 * b) = make_float2(ot[b][0], ot[b][2]);
            *reinterpret_cast<float2 *>(o1 + 16 * b) = make_float2(ot[b][1], ot[b][3]);
        }
        zw[(warp * DMMA_MAX_G + 2 * ti) * 8 + gi] = za[0] + za[2];
        zw[(warp * DMMA_MAX_G + 2 * ti + 1) * 8 + gi] = za[1] + za[3];
        if (ti == 0) {
            mw[2 * (warp * DMMA_MAX_G + gi)] = m_r;
            mw[2 * (warp * DMMA_MAX_G + gi) + 1] = l_r;
        }
    }
    __syncthreads();
    const bool partial = a.n_splits > 1;
    for (int i = tid; i < g * D; i += DMMA_THREADS) {
        const int h = i / D, d = i - h * D, grp = d / G;
        float M = -INFINITY;
        for (int w = 0; w < DMMA_WARPS; w++)
            M = fmaxf(M, mw[2 * (w * DMMA_MAX_G + h)]);
        float sum = 0.0f, acc = 0.0f;
        for (int w = 0; w < DMMA_WARPS; w++) {
            const int row = w * DMMA_MAX_G + h;
            const float mj = mw[2 * row];
            if (mj == -INFINITY)
                continue;
            const float wt = exp2f(mj - M);
            sum += mw[2 * row + 1] * wt;
            acc += (ow[row * D + d] + zw[row * 8 + grp]) * wt;
        }
        if (partial) {
            const size_t slot = ((size_t)t * H + (size_t)kvh * g + h) * a.n_splits + split;
            a.ws_acc[slot * D + d] = acc;
            if (d == 0) {
                a.ws_ml[2 * slot] = M * 0.693147180559945f; /* -inf stays -inf */
                a.ws_ml[2 * slot + 1] = sum;
            }
        } else {
            qs[i] = sum > 0.0f ? acc / sum : 0.0f;
        }
    }
    if (partial)
        return;
    __syncthreads();
    if (a.rotate)
        wht_smem(qs, g, D, D);
    float *og = a.out + ((size_t)t * H + (size_t)kvh * g) * D; /* [g, D] */
    for (int i = tid; i < g * D; i += DMMA_THREADS)
        og[i] = qs[i];
}

} /* namespace */
