/* model_ops.cu — the CUDA backend's model kernels (model_ops.h): everything of a layer but
 * the GEMMs. Elementwise work is fused into the quantization that follows it (RMSNorm or
 * SwiGLU + the group's permutation gather + per-block activation quantization, one kernel
 * per op) and RoPE is fused with the KV append. Attention over the pages is in
 * attention.cu; the helpers both files use are in paged_kv.cuh.
 *
 * Numerics follow the CPU reference (src/backend/cpu, src/numerics/quant.c): wherever the CPU
 * rounds a value that becomes a code (activation block scales and codes, KV scales, zeros
 * and codes, the Hadamard butterflies) the kernels use the _rn intrinsics, so nvcc does not
 * contract them into FMAs and the same fp32 inputs give the same codes. RoPE's products are
 * unfused too; the CPU build may fuse them (gcc contracts with -march=native), so K after
 * RoPE agrees up to an ulp. Reductions (the RMSNorm sum of squares, attention) run in a
 * different order than the CPU's and agree up to fp32 rounding.
 *
 * What it does not do: CUDA graphs, or any allocation (the caller owns every buffer).
 */
#include "backend/cuda/model_ops.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>

#include "backend/cuda/paged_kv.cuh"

namespace {

/* RMSNorm rows: one CTA per token row, as many threads as a CTA takes, so that a decode
 * row of 4096 channels is one pass of 4 values per thread (about 3 us, not 20 at 256) */
constexpr int NORM_THREADS = 1024;
/* SwiGLU and plain rows need no row-wide reduction: a CTA of 8 warps takes 8 activation
 * blocks (or 2048 fp16 values), so a 14336-wide decode row spreads over 14 CTAs */
constexpr int ROW_THREADS = 256;
constexpr int ROW_F16_PER_CTA = 2048;

/* ---- embedding ---- */

/* One CTA per token copies its row of the table (rows row0 .. row0 + V - 1 of the vocabulary;
 * zeros for a token outside them); float4 when C % 4 == 0. */
static __global__ void embed_kernel(const float *__restrict__ embd, int C, int row0, int V,
                                    const int32_t *__restrict__ tokens, float *__restrict__ x) {
    const int t = blockIdx.x;
    const int row = tokens[t] - row0;
    float *dst = x + (size_t)t * C;
    if (row < 0 || row >= V) {
        for (int i = threadIdx.x; i < C; i += blockDim.x)
            dst[i] = 0.0f;
        return;
    }
    const float *src = embd + (size_t)row * C;
    if ((C & 3) == 0) {
        const float4 *s4 = reinterpret_cast<const float4 *>(src);
        float4 *d4 = reinterpret_cast<float4 *>(dst);
        for (int i = threadIdx.x; i < C / 4; i += blockDim.x)
            d4[i] = s4[i];
    } else {
        for (int i = threadIdx.x; i < C; i += blockDim.x)
            dst[i] = src[i];
    }
}

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
    const int32_t *perm; /* [K] or NULL */
    int8_t *qa;          /* W4AX: [T, K] codes */
    float *sa;           /* W4AX: [T, K/B] scales */
    __half *h16;         /* F16: [T, K] */
};

/* Token row blockIdx.x. NORM runs one CTA of NORM_THREADS per row: it first adds the
 * residual (each thread a strided share of the row, written back to x) and reduces the sum
 * of squares through warp shuffles and shared memory to the row's inverse RMS. SILU and
 * PLAIN split a row along blockIdx.y (ROW_THREADS / 32 activation blocks, or
 * ROW_F16_PER_CTA fp16 values, a CTA). The row is produced in the group's permuted order,
 * each value recomputed from global memory at its source channel perm[k] (h = x * inv *
 * norm, or silu(gate) * up, or x): for W4AX each warp takes whole activation blocks (B / 32
 * consecutive channels per lane), reduces the block's amax with shuffles and writes the
 * lane's codes as one 2- or 4-byte store, lane 0 the scale; for F16 the threads stride over
 * their share of the row. */
template <int MODE>
static __global__ void __launch_bounds__(NORM_THREADS) row_quant_kernel(row_args a) {
    const int t = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int nthreads = blockDim.x, nwarps = nthreads >> 5;
    const int K = a.K;
    const size_t row = (size_t)t * K;
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
    auto value = [&](int k) -> float {
        const int p = a.perm ? a.perm[k] : k;
        if (MODE == ROW_NORM)
            return __fmul_rn(__fmul_rn(a.x[row + p], inv), a.norm[p]);
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
    const int nb = K / a.B, per = a.B / 32; /* per: 2 or 4 channels per lane */
    for (int b = blockIdx.y * nwarps + warp; b < nb; b += gridDim.y * nwarps) {
        const int k0 = b * a.B + lane * per;
        float v[4];
        float amax = 0.0f;
        bool finite = true;
        for (int e = 0; e < per; e++) {
            v[e] = value(k0 + e);
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
            for (int e = 0; e < per; e++) {
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
    if (mode == ROW_NORM)
        row_quant_kernel<ROW_NORM><<<T, NORM_THREADS, 0, s>>>(a);
    else if (mode == ROW_SILU)
        row_quant_kernel<ROW_SILU><<<dim3(T, parts), ROW_THREADS, 0, s>>>(a);
    else
        row_quant_kernel<ROW_PLAIN><<<dim3(T, parts), ROW_THREADS, 0, s>>>(a);
    return launch_check(op);
}

/* ---- small copies ---- */

/* One CTA per gathered row; threads stride over the row's fp16 values. */
static __global__ void gather_rows_f16_kernel(const __half *__restrict__ src, int C,
                                              const int32_t *__restrict__ rows,
                                              __half *__restrict__ dst) {
    const int r = blockIdx.x;
    const __half *s = src + (size_t)rows[r] * C;
    __half *d = dst + (size_t)r * C;
    for (int i = threadIdx.x; i < C; i += blockDim.x)
        d[i] = s[i];
}

/* Grid-stride conversion, one element per thread per step. */
static __global__ void f32_to_f16_kernel(const float *__restrict__ src, __half *__restrict__ dst,
                                         size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2half_rn(src[i]);
}

/* Synthetic weights: element i gets a value from a counter-based hash of (seed, i), so any
 * grid fills the same values. kind 0: raw bytes (dst uint8, uniform: random INT4 codes in
 * any packed layout); 1: fp16 uniform in [lo, hi); 2: fp32 uniform in [lo, hi). */
static __device__ __forceinline__ uint32_t hash_u32(uint64_t seed, uint64_t i) {
    uint64_t z = seed + 0x9E3779B97F4A7C15ull * (i + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (uint32_t)((z ^ (z >> 31)) >> 16);
}

static __global__ void fill_random_kernel(void *dst, size_t n, int kind, float lo, float hi,
                                          uint64_t seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = hash_u32(seed, i);
        float u = (float)(h & 0xFFFFFF) * (1.0f / 16777216.0f);
        if (kind == 0)
            static_cast<uint8_t *>(dst)[i] = (uint8_t)h;
        else if (kind == 1)
            static_cast<__half *>(dst)[i] = __float2half_rn(lo + (hi - lo) * u);
        else
            static_cast<float *>(dst)[i] = lo + (hi - lo) * u;
    }
}

/* ---- paged KV (paged_kv.cuh holds the layout helpers) ---- */

/* The last sequence s with token_indptr[s] <= t. */
__device__ __forceinline__ int seq_of_token(const int32_t *token_indptr, int n_seqs, int t) {
    int lo = 0, hi = n_seqs - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (token_indptr[mid] <= t)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* Grid (T, H + Hkv), 128 threads, thread f owning the RoPE pairs f, f + 128, ... of a head.
 * Blocks y < H rotate a query head in place and finish. Blocks y >= H rotate KV head
 * y - H of k in place and keep it, with v, in shared memory; with `rotate` both go through
 * the Walsh-Hadamard butterflies there; then one thread per (K or V, group) finds the
 * group's min and max and writes its fp16 scale and zero, and the threads write the codes
 * (two channels per byte at 4 bits) or the fp16 values into the token's page slot. */
static __global__ void rope_kv_append_kernel(kv_args L, const int32_t *__restrict__ positions,
                                             const int32_t *__restrict__ token_indptr, int n_seqs,
                                             const int32_t *__restrict__ page_indptr,
                                             const int32_t *__restrict__ page_indices,
                                             const double *__restrict__ inv_freq, float *q, int H,
                                             float *k, const float *__restrict__ v, int rotate) {
    __shared__ float ks[COMET_CUDA_KV_MAX_HEAD_DIM], vs[COMET_CUDA_KV_MAX_HEAD_DIM];
    __shared__ float sz[2][COMET_CUDA_KV_MAX_HEAD_DIM / 8][2];
    const int t = blockIdx.x, y = blockIdx.y, D = L.D, half = D / 2, tid = threadIdx.x;
    const int pos = positions[t];
    const bool is_q = y < H;
    float *row = is_q ? q + ((size_t)t * H + y) * D : k + ((size_t)t * L.Hkv + (y - H)) * D;
    for (int f = tid; f < half; f += blockDim.x) {
        const double ang = (double)pos * inv_freq[f];
        const float cs = (float)cos(ang), sn = (float)sin(ang);
        const float x0 = row[f], x1 = row[f + half];
        const float r0 = __fsub_rn(__fmul_rn(x0, cs), __fmul_rn(x1, sn));
        const float r1 = __fadd_rn(__fmul_rn(x0, sn), __fmul_rn(x1, cs));
        row[f] = r0;
        row[f + half] = r1;
        if (!is_q) {
            ks[f] = r0;
            ks[f + half] = r1;
        }
    }
    if (is_q)
        return;
    const int kvh = y - H;
    const float *vr = v + ((size_t)t * L.Hkv + kvh) * D;
    for (int c = tid; c < D; c += blockDim.x)
        vs[c] = vr[c];
    __syncthreads();
    if (rotate) {
        wht_smem(ks, 1, D, 0);
        wht_smem(vs, 1, D, 0);
    }
    const int s = seq_of_token(token_indptr, n_seqs, t);
    const int page = page_indices[page_indptr[s] + pos / L.P], slot = pos % L.P;
    uint8_t *tile[2] = {kv_tile(L, page, 0, kvh), kv_tile(L, page, 1, kvh)};
    if (L.bits == 16) {
        for (int i = tid; i < 2 * D; i += blockDim.x) {
            const int which = i / D, c = i % D;
            __half *dst = reinterpret_cast<__half *>(tile[which] + (size_t)slot * L.code_row);
            dst[c] = __float2half_rn(which ? vs[c] : ks[c]);
        }
        return;
    }
    const int n_grp = D / L.G, levels = (1 << L.bits) - 1;
    for (int i = tid; i < 2 * n_grp; i += blockDim.x) {
        const int which = i / n_grp, g = i % n_grp;
        const float *x = (which ? vs : ks) + g * L.G;
        float mn = x[0], mx = x[0];
        bool ok = true;
        for (int c = 0; c < L.G; c++) {
            ok &= fabsf(x[c]) <= 65504.0f; /* false for NaN and infinities too */
            mn = x[c] < mn ? x[c] : mn;
            mx = x[c] > mx ? x[c] : mx;
        }
        /* comet_quant_kv_group: zero rounded down, scale up; a NaN scale for a group fp16
         * cannot hold */
        __half hs = __ushort_as_half((unsigned short)0x7e00u), hz = __ushort_as_half(0);
        if (ok) {
            hz = __float2half_rd(mn);
            hs = __float2half_ru(__fdiv_rn(__fsub_rn(mx, __half2float(hz)), (float)levels));
        }
        __half *dst =
            reinterpret_cast<__half *>(tile[which] + L.sz_offset + (size_t)slot * L.sz_row + 4 * g);
        dst[0] = hs;
        dst[1] = hz;
        sz[which][g][0] = __half2float(hs);
        sz[which][g][1] = __half2float(hz);
    }
    __syncthreads();
    auto code = [&](int which, int c) -> unsigned {
        const float sc = sz[which][c / L.G][0], z = sz[which][c / L.G][1];
        if (sc == 0.0f || sc != sc)
            return 0u;
        const float x = which ? vs[c] : ks[c];
        float r = rintf(__fmul_rn(__fsub_rn(x, z), __fdiv_rn(1.0f, sc)));
        r = r < 0.0f ? 0.0f : r > (float)levels ? (float)levels : r;
        return (unsigned)r;
    };
    if (L.bits == 4) {
        for (int i = tid; i < D; i += blockDim.x) { /* i: (which, byte) over 2 * D/2 bytes */
            const int which = i / half, b = i % half;
            tile[which][(size_t)slot * L.code_row + b] =
                (uint8_t)(code(which, 2 * b) | (code(which, 2 * b + 1) << 4));
        }
    } else {
        for (int i = tid; i < 2 * D; i += blockDim.x) {
            const int which = i / D, c = i % D;
            tile[which][(size_t)slot * L.code_row + c] = (uint8_t)code(which, c);
        }
    }
}

/* ---- stacked GEMM output ---- */

struct unstack_args {
    const float *y;
    int N, n_parts;
    int col0[4];
    float *out[3];
};

/* Grid (column blocks, T): ys[i][t, c - col0[i]] = y[t, c] for the columns c of part i. */
static __global__ void unstack_kernel(unstack_args a) {
    const int t = blockIdx.y;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < a.N; c += gridDim.x * blockDim.x) {
        int i = 0;
        while (i + 1 < a.n_parts && c >= a.col0[i + 1])
            i++;
        float *o = a.out[i];
        if (o)
            o[(size_t)t * (a.col0[i + 1] - a.col0[i]) + (c - a.col0[i])] = a.y[(size_t)t * a.N + c];
    }
}

} /* namespace */

extern "C" {

comet_status comet_cuda_embed(const float *embd, int C, int row0, int V, const int32_t *tokens,
                              int T, float *x, void *stream) {
    if (T < 1 || C < 1)
        return comet_set_error(COMET_ERR_INVALID_ARG, "cuda backend: embed_tokens: T = %d, C = %d",
                               T, C);
    embed_kernel<<<T, 256, 0, static_cast<cudaStream_t>(stream)>>>(embd, C, row0, V, tokens, x);
    return launch_check("embed_tokens");
}

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

comet_status comet_cuda_gather_rows_f16(const uint16_t *src, int C, const int32_t *rows, int n_rows,
                                        uint16_t *dst, void *stream) {
    if (n_rows < 1)
        return COMET_OK;
    gather_rows_f16_kernel<<<n_rows, 256, 0, static_cast<cudaStream_t>(stream)>>>(
        reinterpret_cast<const __half *>(src), C, rows, reinterpret_cast<__half *>(dst));
    return launch_check("lm_head (row gather)");
}

comet_status comet_cuda_f32_to_f16(const float *src, uint16_t *dst, size_t n, void *stream) {
    if (n == 0)
        return COMET_OK;
    size_t blocks = (n + 255) / 256;
    if (blocks > 65536)
        blocks = 65536;
    f32_to_f16_kernel<<<(unsigned)blocks, 256, 0, static_cast<cudaStream_t>(stream)>>>(
        src, reinterpret_cast<__half *>(dst), n);
    return launch_check("weights_load (fp16 conversion)");
}

comet_status comet_cuda_fill_random(void *dst, size_t n, int kind, float lo, float hi,
                                    uint64_t seed, void *stream) {
    if (n == 0)
        return COMET_OK;
    size_t blocks = (n + 255) / 256;
    if (blocks > 65536)
        blocks = 65536;
    fill_random_kernel<<<(unsigned)blocks, 256, 0, static_cast<cudaStream_t>(stream)>>>(
        dst, n, kind, lo, hi, seed);
    return launch_check("weights_load (synthetic weights)");
}

comet_status comet_cuda_rope_kv_append(const comet_cuda_kv_layout *L, void *storage, int layer,
                                       const comet_cuda_step_view *st, const double *inv_freq,
                                       float *q, int H, float *k, const float *v, int rotate,
                                       void *stream) {
    if (L->D > COMET_CUDA_KV_MAX_HEAD_DIM || L->D % 8 || L->P > COMET_CUDA_KV_MAX_PAGE_SIZE ||
        (rotate && (L->D & (L->D - 1))) || (L->bits != 16 && (L->G % 8 || L->D % L->G)))
        return comet_set_error(COMET_ERR_UNSUPPORTED,
                               "cuda backend: rope_kv_append: head dim %d, page size %d, group "
                               "%d%s; the kernel takes D <= %d with D %% 8 == 0 (a power of two "
                               "with the hadamard rotation), P <= %d, groups of a multiple of 8 "
                               "channels dividing D",
                               L->D, L->P, L->G, rotate ? ", hadamard" : "",
                               COMET_CUDA_KV_MAX_HEAD_DIM, COMET_CUDA_KV_MAX_PAGE_SIZE);
    if (st->n_tokens < 1 || H < 1 || layer < 0 || layer >= L->n_layer)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "cuda backend: rope_kv_append: T = %d, H = %d, layer %d of %d",
                               st->n_tokens, H, layer, L->n_layer);
    kv_args ka = kv_args_make(L, storage, layer);
    dim3 grid(st->n_tokens, H + L->Hkv);
    rope_kv_append_kernel<<<grid, 128, 0, static_cast<cudaStream_t>(stream)>>>(
        ka, st->positions, st->token_indptr, st->n_seqs, st->page_indptr, st->page_indices,
        inv_freq, q, H, k, v, rotate);
    return launch_check("rope_kv_append");
}

comet_status comet_cuda_unstack(const float *y, int T, int N, int n_parts, const int *widths,
                                float *const *outs, void *stream) {
    unstack_args a = {};
    if (T < 1 || n_parts < 1 || n_parts > 3)
        return comet_set_error(COMET_ERR_INVALID_ARG, "cuda backend: unstack: T = %d, %d parts", T,
                               n_parts);
    a.y = y, a.N = N, a.n_parts = n_parts;
    for (int i = 0; i < n_parts; i++) {
        a.col0[i + 1] = a.col0[i] + widths[i];
        a.out[i] = outs[i];
    }
    if (a.col0[n_parts] != N)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "cuda backend: unstack: parts of %d "
                               "columns in all, the stack has %d",
                               a.col0[n_parts], N);
    const unsigned blocks = (unsigned)((N + 1023) / 1024 < 64 ? (N + 1023) / 1024 : 64);
    unstack_kernel<<<dim3(blocks, T), 256, 0, static_cast<cudaStream_t>(stream)>>>(a);
    return launch_check("matmul (stack split)");
}

} /* extern "C" */
