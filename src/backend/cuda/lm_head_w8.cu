/* lm_head_w8.cu — the lm_head over INT8 per-row codes and fp16 scales (lm_head_w8.h):
 * logits[r, v] = s[v] * sum_k x[r, k] * q[v, k] on fp16 tensor cores (mma.sync m16n8k16,
 * fp32 accumulators), with the codes converted to fp16 in registers (exact).
 *
 * At decode (a few tokens) the op reads the codes once, 0.5 GB for a 128k x 4096 head, so the
 * kernel is a stream of 16-byte code loads kept deep in flight; with more tokens the same
 * kernel reuses each code for up to 64 tokens per CTA and becomes tensor-core bound. The
 * vocabulary rows are the MMA's M side (16 per tile), the tokens its N side (8 per tile).
 *
 * What it does not do: split K (the vocabulary is wide enough to fill the GPU), wgmma (sm_90a
 * warpgroup MMA, the way past mma.sync's rate at hundreds of tokens), programmatic dependent
 * launch, allocation.
 */
#include "backend/cuda/lm_head_w8.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <limits.h>

#include "backend/cuda/kernel_util.cuh"
#include "backend/cuda/ptx.cuh"

namespace {

using comet_ptx::cp_async16;
using comet_ptx::cp_async_commit;
using comet_ptx::cp_async_wait;
using comet_ptx::ld_stream;
using comet_ptx::mma_f16;

/* Warps per CTA: 8 (256 threads) fill a CTA's row block of 8 x 16 x MI rows. */
constexpr int WARPS = 8;

struct w8_args {
    const int8_t *q; /* [V, C] codes */
    const __half *s; /* [V] scales */
    const __half *x; /* [n, C] activations */
    float *logits;   /* [n, V] */
    int V, C, n;
    int ntg; /* token groups: CTA b has row block b / ntg, token group b % ntg */
};

/* Codes w = 4 int8 bytes (b0 lowest) -> fp16 pairs lo = (b0, b1), hi = (b2, b3), exactly.
 * The magic-number conversion: with u = b + 128 (b ^ 0x80, 0..255) in the low byte and 0x64
 * in the high byte, the fp16 bits 0x64uu are 1024 + u (exponent 10, u in the mantissa), and
 * subtracting 1152 (0x6480) leaves b. 5 instructions per 4 codes: LOP3, 2 PRMT, 2 HADD2. */
__device__ __forceinline__ void i8x4_to_f16x4(uint32_t w, uint32_t &lo, uint32_t &hi) {
    const uint32_t u = w ^ 0x80808080u;
    const uint32_t l = __byte_perm(u, 0x64646464u, 0x4140); /* bytes u0, 0x64, u1, 0x64 */
    const uint32_t h = __byte_perm(u, 0x64646464u, 0x4342); /* bytes u2, 0x64, u3, 0x64 */
    const __half2 bias = __halves2half2(__ushort_as_half(0x6480), __ushort_as_half(0x6480));
    const __half2 lf = __hsub2(*reinterpret_cast<const __half2 *>(&l), bias);
    const __half2 hf = __hsub2(*reinterpret_cast<const __half2 *>(&h), bias);
    lo = *reinterpret_cast<const uint32_t *>(&lf);
    hi = *reinterpret_cast<const uint32_t *>(&hf);
}

__device__ __forceinline__ uint32_t word(const uint4 &v, int j) {
    return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

/* The tensor-core kernel.
 *
 * Tiling: a CTA owns ROWS = 8 warps x 16 MI vocabulary rows and TOK = 8 NT tokens; warp w owns
 * rows [16 MI w, +16 MI) of the block as MI m16 tiles, and all NT n8 tiles of tokens, so each
 * thread holds MI x NT x 4 fp32 accumulators. The grid is 1-D, token group fastest: the
 * ceil(n / TOK) CTAs that read the same codes run side by side and share them through L2.
 *
 * K order: the sum over k is free, so inside each 64-wide chunk of k the MMA's k16 steps take
 * a permutation of k that A and B share. Thread (g = lane / 4, t = lane % 4) loads the 16 code
 * bytes [16 t, 16 t + 16) of the chunk for each of its rows (g and g + 8 of every m-tile), and
 * k-step j (0..3) uses bytes 4j .. 4j + 3: bytes 4j, 4j + 1 as the fragment's k pair
 * (2t, 2t + 1) and 4j + 2, 4j + 3 as (2t + 8, 2t + 9). Its B fragment for step j is then the
 * four fp16 x values at the same chunk offsets 16 t + 4j .. 16 t + 4j + 3, 8 contiguous
 * bytes, and one 16-byte shared load gives steps j = 2h and 2h + 1.
 *
 * Pipeline, in stages of KC chunks: the codes go straight from global memory to registers
 * (ld.global.nc with L1::no_allocate: each CTA reads them once, nothing to cache) through a
 * ring of R stages of registers; stage b + R - 1's loads issue before stage b's MMAs, so R - 1
 * to R stages (KC x 2 MI 16-byte loads each) are in flight per thread. The token rows are
 * staged in shared memory (cp.async, a ring of S stages, zero-filled past n and past C), not
 * read from global memory by each warp: every warp of the CTA needs the same x fragments, so
 * this is one L2 read per CTA instead of one per warp, and one 16-byte shared load per
 * fragment pair with no bank conflict (rows padded by 8 fp16, 16 bytes: the thread pairs
 * g, g + 1 of a quarter warp land on disjoint banks). One barrier per stage frees the slot of
 * stage b - 1 for stage b + S - 1.
 *
 * Edges: rows past V load row V - 1 (finite codes whose results are not stored); with KTAIL
 * (C % 64 != 0) a thread's 16 bytes past C load the row's last 16 bytes, which meet zero x
 * fragments (zero-filled shared memory), so they add 0; tokens past n have zero x rows and are
 * not stored; n-tiles wholly past n skip their MMAs. Epilogue: acc * fp32(s[v]) stored fp32. */
template <int NT, int MI, int KC, int R, int S, bool KTAIL>
__global__ void __launch_bounds__(WARPS * 32, NT *MI >= 16 ? 1 : 2) lm_head_w8_kernel(w8_args a) {
    constexpr int KB = 64 * KC;  /* k per stage */
    constexpr int SROW = KB + 8; /* fp16 per shared token row: 16 bytes of padding */
    constexpr int TOK = 8 * NT, ROWS = WARPS * 16 * MI;
    constexpr int UPR = KB / 8; /* 16-byte units per staged token row */
    static_assert(TOK * UPR % (WARPS * 32) == 0, "x copy: whole units per thread");
    extern __shared__ __align__(16) __half xs[]; /* S slots of [TOK][SROW] */

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int rb = blockIdx.x / a.ntg, tg = blockIdx.x % a.ntg;
    const int row0 = rb * ROWS + warp * 16 * MI, tok0 = tg * TOK;
    const int C = a.C, nch = (C + 63) / 64, nblk = (nch + KC - 1) / KC;
    const int ntl = min(NT, (a.n - tok0 + 7) / 8); /* n-tiles holding a token */

    /* this thread's bytes of rows g, g + 8 of each m-tile (clamped to V - 1) at k = 16 t */
    const int8_t *qp[MI][2];
#pragma unroll
    for (int m = 0; m < MI; m++)
#pragma unroll
        for (int r = 0; r < 2; r++)
            qp[m][r] = a.q + (size_t)min(row0 + 16 * m + 8 * r + g, a.V - 1) * C + 16 * t;

    /* Stage b's codes into buf; full: every chunk of the stage is below nch, no per-chunk
     * test (else chunks past nch load nothing and are never used). */
    auto load_codes = [&](uint4(&buf)[KC][MI][2], int b, bool full) {
#pragma unroll
        for (int cc = 0; cc < KC; cc++) {
            const int c = b * KC + cc;
            if (full || c < nch) {
                /* 64-bit stage offset plus a constant: one address add per row and stage */
                long long k = (long long)b * KB + 64 * cc;
                if (KTAIL) /* bytes past C: the row's last 16 instead (meet zero x) */
                    k = min(64 * c, C - 16 - 16 * t);
#pragma unroll
                for (int m = 0; m < MI; m++)
#pragma unroll
                    for (int r = 0; r < 2; r++)
                        buf[cc][m][r] = ld_stream(qp[m][r] + k);
            }
        }
    };
    /* Stage b's token rows into slot b % S. */
    auto copy_x = [&](int b) {
        __half *slot = xs + (b % S) * TOK * SROW;
#pragma unroll
        for (int i = 0; i < TOK * UPR / (WARPS * 32); i++) {
            const int u = threadIdx.x + i * WARPS * 32, row = u / UPR, col = (u % UPR) * 8;
            const int tok = tok0 + row, k = b * KB + col;
            const bool ok = tok < a.n && k < C;
            cp_async16(slot + row * SROW + col, ok ? a.x + (size_t)tok * C + k : a.x, ok);
        }
    };

    /* AS accumulator sets: with one or two MMA tiles per thread, k-steps 2h and 2h + 1 of
     * half h go to set h, two independent MMA chains instead of one; summed at the end. */
    constexpr int AS = NT * MI <= 2 ? 2 : 1;
    float acc[AS][MI][NT][4];
#pragma unroll
    for (int i = 0; i < AS * MI * NT * 4; i++)
        (&acc[0][0][0][0])[i] = 0.0f;

    /* Stage b: MMAs over its chunks from the codes in buf and slot b % S; full as above
     * (every stage but a short last one). */
    auto compute = [&](const uint4(&buf)[KC][MI][2], int b, bool full) {
        const __half *xb = xs + (b % S) * TOK * SROW + g * SROW + 16 * t;
#pragma unroll
        for (int cc = 0; cc < KC; cc++) {
            if (!full && b * KC + cc >= nch)
                continue;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                uint32_t af[MI][2][4]; /* k-steps 2h, 2h + 1 */
#pragma unroll
                for (int m = 0; m < MI; m++)
#pragma unroll
                    for (int jj = 0; jj < 2; jj++) {
                        i8x4_to_f16x4(word(buf[cc][m][0], 2 * h + jj), af[m][jj][0], af[m][jj][2]);
                        i8x4_to_f16x4(word(buf[cc][m][1], 2 * h + jj), af[m][jj][1], af[m][jj][3]);
                    }
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    /* 64 tokens a CTA: skip n-tiles past n (the last token group's); fewer
                     * tokens are memory-bound, where the test costs more than it saves */
                    if (NT == 8 && j >= ntl)
                        continue;
                    const uint4 bx =
                        *reinterpret_cast<const uint4 *>(xb + j * 8 * SROW + cc * 64 + 8 * h);
#pragma unroll
                    for (int m = 0; m < MI; m++) {
                        mma_f16(acc[h % AS][m][j], af[m][0], bx.x, bx.y);
                        mma_f16(acc[h % AS][m][j], af[m][1], bx.z, bx.w);
                    }
                }
            }
        }
    };
    /* One pipeline step: stage b + R - 1's codes into nxt (the buffer of stage b - 1, done),
     * wait for stage b's x (this thread's copies, then the barrier for everyone's; past it
     * every warp is done with stage b - 1, whose slot takes stage b + S - 1), then stage b's
     * MMAs. */
    const int nfull = nch / KC;
    auto step = [&](int b, const uint4(&cur)[KC][MI][2], uint4(&nxt)[KC][MI][2]) {
        if (b + R - 1 < nfull)
            load_codes(nxt, b + R - 1, true);
        else if (b + R - 1 < nblk)
            load_codes(nxt, b + R - 1, false);
        cp_async_wait<S - 2>();
        __syncthreads();
        if (b + S - 1 < nblk)
            copy_x(b + S - 1);
        cp_async_commit();
        if (b < nfull)
            compute(cur, b, true);
        else
            compute(cur, b, false);
    };

    uint4 cr[R][KC][MI][2]; /* the codes' register ring: stage b in cr[b % R] */
#pragma unroll
    for (int i = 0; i < R - 1; i++)
        if (i < nblk)
            load_codes(cr[i], i, false);
#pragma unroll
    for (int b = 0; b < S - 1; b++) {
        if (b < nblk)
            copy_x(b);
        cp_async_commit();
    }
    /* R steps per trip, so that every ring index is a constant: no register copies */
    for (int b = 0; b < nblk; b += R) {
#pragma unroll
        for (int i = 0; i < R; i++)
            if (b + i < nblk)
                step(b + i, cr[i], cr[(i + R - 1) % R]);
    }

#pragma unroll
    for (int m = 0; m < MI; m++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int v = row0 + 16 * m + 8 * r + g;
            if (v >= a.V)
                continue;
            const float sc = __half2float(a.s[v]);
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int tok = tok0 + 8 * j + 2 * t + e;
                    float sum = acc[0][m][j][2 * r + e];
                    if (AS == 2)
                        sum += acc[AS - 1][m][j][2 * r + e];
                    if (tok < a.n)
                        a.logits[(size_t)tok * a.V + v] = sum * sc;
                }
        }
}

/* The plain kernel (C % 16 != 0 or unaligned q, x): one warp per vocabulary row and 8 tokens
 * (grid: row blocks of 8 rows x token groups of 8, token group fastest); lanes stride over k
 * with scalar loads, fp32 sums, a warp reduction, then the scale. */
static __global__ void __launch_bounds__(WARPS * 32) lm_head_w8_plain_kernel(w8_args a) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int v = blockIdx.x / a.ntg * WARPS + warp, tok0 = blockIdx.x % a.ntg * 8;
    if (v >= a.V)
        return;
    const int nt = min(8, a.n - tok0);
    const int8_t *qv = a.q + (size_t)v * a.C;
    const __half *xt = a.x + (size_t)tok0 * a.C;
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    for (int k = lane; k < a.C; k += 32) {
        const float w = (float)qv[k];
#pragma unroll
        for (int i = 0; i < 8; i++)
            if (i < nt)
                acc[i] = fmaf(__half2float(xt[(size_t)i * a.C + k]), w, acc[i]);
    }
    const float sc = __half2float(a.s[v]);
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const float sum = warp_sum(acc[i]);
        if (lane == 0 && i < nt)
            a.logits[(size_t)(tok0 + i) * a.V + v] = sum * sc;
    }
}

/* The tensor-core kernel's forms, by tokens. Dynamic shared memory TOK x (64 KC + 8) x 2 x S
 * bytes stays under the 48 KB that needs no opt-in. Codes in flight per SM: 8 warps x 32
 * threads x (R - 1 .. R) x KC x 2 MI x 16 bytes per CTA; HBM needs ~44 KB per SM (H200: 4.8 TB/s
 * over 132 SMs at ~1.2 us loaded latency). Registers from ptxas -v (sm_90a, CUDA 13.0). */
enum form_id {
    FORM_T8,  /* n <= 8: NT 1, MI 1, KC 4, R 2, S 4: 17 KB, ~120 regs, 2 CTAs/SM, 64-128 KB */
    FORM_T16, /* n <= 16: NT 2, MI 1, KC 2, R 3, S 4: 17 KB, ~122 regs, 2 CTAs/SM, 64-96 KB */
    FORM_T32, /* n <= 32: NT 4, MI 1, KC 2, R 3, S 4: 34 KB, ~128 regs, 2 CTAs/SM, 64-96 KB */
    FORM_T64, /* more: NT 8, MI 2, KC 1, R 3, S 4: 37 KB, ~250 regs, 1 CTA/SM, 32-48 KB;
               * 256 rows x 64 tokens per CTA: 16 MMAs per 16-byte code load */
    FORM_PLAIN
};

inline bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

inline form_id pick_form(const int8_t *q, int C, const uint16_t *x, int n) {
    if (C % 16 != 0 || !aligned16(q) || !aligned16(x))
        return FORM_PLAIN;
    return n <= 8 ? FORM_T8 : n <= 16 ? FORM_T16 : n <= 32 ? FORM_T32 : FORM_T64;
}

/* a.ntg = token groups of tok tokens, *grid = those x the row blocks of `rows` vocabulary
 * rows; COMET_ERR_INVALID_ARG when that is more CTAs than a grid holds. */
comet_status grid_of(w8_args &a, int tok, int rows, unsigned *grid) {
    const long long nrb = (a.V + rows - 1) / rows;
    a.ntg = (a.n + tok - 1) / tok;
    if (nrb * a.ntg > INT_MAX)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "cuda backend: lm_head (W8): V = %d, n = %d need %lld CTAs, "
                               "more than a grid holds",
                               a.V, a.n, nrb * a.ntg);
    *grid = (unsigned)(nrb * a.ntg);
    return COMET_OK;
}

template <int NT, int MI, int KC, int R, int S>
comet_status launch_mma(w8_args a, cudaStream_t st) {
    constexpr int TOK = 8 * NT, ROWS = WARPS * 16 * MI;
    constexpr size_t smem = (size_t)TOK * (64 * KC + 8) * 2 * S;
    static_assert(smem <= 48 * 1024, "dynamic shared memory past the default limit");
    unsigned grid = 0;
    COMET_TRY(grid_of(a, TOK, ROWS, &grid));
    if (a.C % 64 == 0)
        lm_head_w8_kernel<NT, MI, KC, R, S, false><<<grid, WARPS * 32, smem, st>>>(a);
    else
        lm_head_w8_kernel<NT, MI, KC, R, S, true><<<grid, WARPS * 32, smem, st>>>(a);
    return launch_check("lm_head (W8)");
}

comet_status launch_plain(w8_args a, cudaStream_t st) {
    unsigned grid = 0;
    COMET_TRY(grid_of(a, 8, WARPS, &grid));
    lm_head_w8_plain_kernel<<<grid, WARPS * 32, 0, st>>>(a);
    return launch_check("lm_head (W8, plain)");
}

/* dst[i] = src[i] as fp16 (exact for every int8), a grid-stride loop. */
static __global__ void codes_f16_kernel(const int8_t *src, __half *dst, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __int2half_rn(src[i]);
}

/* logits[r, v] *= s[v] over [n, V], a grid-stride loop. */
static __global__ void scale_rows_kernel(float *logits, const __half *s, int V, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        logits[i] *= __half2float(s[i % (size_t)V]);
}

/* Blocks of the two grid-stride kernels: 4 per SM of a 132-SM GPU keep them at memory
 * speed. */
constexpr unsigned STRIDE_BLOCKS = 528;

} /* namespace */

extern "C" {

comet_status comet_cuda_lm_head_codes_f16(const int8_t *q, size_t n, uint16_t *out, void *stream) {
    if (!q || !out)
        return comet_set_error(COMET_ERR_INVALID_ARG, "cuda backend: lm_head codes: NULL %s",
                               !q ? "codes" : "output");
    if (n == 0)
        return COMET_OK;
    codes_f16_kernel<<<STRIDE_BLOCKS, 256, 0, static_cast<cudaStream_t>(stream)>>>(
        q, reinterpret_cast<__half *>(out), n);
    return launch_check("lm_head codes to fp16");
}

comet_status comet_cuda_lm_head_scale(float *logits, const uint16_t *s, int V, int n,
                                      void *stream) {
    if (!logits || !s || V < 1 || n < 1)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "cuda backend: lm_head scale: V = %d, n = %d, logits %p, s %p", V, n,
                               (void *)logits, (const void *)s);
    scale_rows_kernel<<<STRIDE_BLOCKS, 256, 0, static_cast<cudaStream_t>(stream)>>>(
        logits, reinterpret_cast<const __half *>(s), V, (size_t)n * V);
    return launch_check("lm_head scale");
}

comet_status comet_cuda_lm_head_w8(const int8_t *q, const uint16_t *s, int V, int C,
                                   const uint16_t *x, int n, float *logits, void *stream) {
    if (V < 1 || C < 1 || n < 1)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "cuda backend: lm_head (W8): V = %d, C = %d, n = %d; each must be "
                               "at least 1",
                               V, C, n);
    if (!q || !s || !x || !logits)
        return comet_set_error(COMET_ERR_INVALID_ARG, "cuda backend: lm_head (W8): NULL %s",
                               !q   ? "codes q"
                               : !s ? "scales s"
                               : !x ? "activations x"
                                    : "logits");
    w8_args a;
    a.q = q, a.s = reinterpret_cast<const __half *>(s), a.x = reinterpret_cast<const __half *>(x);
    a.logits = logits, a.V = V, a.C = C, a.n = n, a.ntg = 1;
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    switch (pick_form(q, C, x, n)) {
    case FORM_T8: return launch_mma<1, 1, 4, 2, 4>(a, st);
    case FORM_T16: return launch_mma<2, 1, 2, 3, 4>(a, st);
    case FORM_T32: return launch_mma<4, 1, 2, 3, 4>(a, st);
    case FORM_T64: return launch_mma<8, 2, 1, 3, 4>(a, st);
    default: return launch_plain(a, st);
    }
}

const char *comet_cuda_lm_head_w8_form(const int8_t *q, int C, const uint16_t *x, int n) {
    static const char *const names[] = {"mma t8 r128 k256", "mma t16 r128 k128",
                                        "mma t32 r128 k128", "mma t64 r256 k64", "plain"};
    return names[pick_form(q, C, x, n)];
}

} /* extern "C" */
