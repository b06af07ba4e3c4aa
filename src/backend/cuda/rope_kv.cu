/* rope_kv.cu — RoPE fused with the paged KV append (rope_kv.h): q and k rotated in place,
 * then every token's k and v rotated by H_D (when the cache is), quantized per group and
 * written into its page slot in the layout of cuda_kv.h. Two kernels give the same bits: the
 * register form (rope_kv_append_reg_kernel, the default: shuffles for the butterflies and the
 * group ranges) and the shared-memory form (rope_kv_append_kernel, COMET_CUDA_ROPE_KV_REG=0,
 * for A/B runs). Attention over the pages is in attention.cu; the paged KV helpers both use
 * are in paged_kv.cuh.
 *
 * Numerics follow the CPU reference (src/backend/cpu, src/numerics/quant.c): KV scales,
 * zeros and codes and the Hadamard butterflies use the _rn intrinsics, so nvcc does not
 * contract them into FMAs and the same fp32 inputs give the same codes. RoPE's products are
 * unfused too; the CPU build may fuse them (gcc contracts with -march=native), so K after
 * RoPE agrees up to an ulp.
 *
 * What it does not do: any allocation (the caller owns every buffer).
 */
#include "backend/cuda/rope_kv.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>

#include "backend/cuda/paged_kv.cuh"
#include "backend/cuda/rope_kv.cuh"
#include "backend/cuda/env_switch.h"

namespace {

/* The last sequence s with token_indptr[s] <= t (token_indptr is non-decreasing). When
 * token_indptr[t] == t < token_indptr[t + 1], that is t itself: a decode step's tokens take
 * two independent loads instead of log2(n_seqs) dependent ones. */
__device__ __forceinline__ int seq_of_token(const int32_t *token_indptr, int n_seqs, int t) {
    if (t < n_seqs && token_indptr[t] == t && token_indptr[t + 1] > t)
        return t;
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

/* The shared-memory form (COMET_CUDA_ROPE_KV_REG=0).
 * Grid (T, H + Hkv), 128 threads, thread f owning the RoPE pairs f, f + 128, ... of a head.
 * Blocks y < H rotate a query head in place and finish. Blocks y >= H rotate KV head
 * y - H of k in place and keep it, with v, in shared memory; with `rotate` both go through
 * the Walsh-Hadamard butterflies there; then one thread per (K or V, group) finds the
 * group's min and max and writes its fp16 scale and zero, and the threads write the codes
 * (two channels per byte at 4 bits) or the fp16 values into the token's page slot. BITS is
 * the layout's code width (L.bits, dispatched by with_kv_bits). */
template <int BITS>
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
    rope_row(row, ks, !is_q, pos, inv_freq, half, tid, blockDim.x);
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
    if constexpr (BITS == 16) {
        for (int i = tid; i < 2 * D; i += blockDim.x) {
            const int which = i / D, c = i % D;
            __half *dst = reinterpret_cast<__half *>(tile[which] + (size_t)slot * L.code_row);
            dst[c] = __float2half_rn(which ? vs[c] : ks[c]);
        }
        return;
    }
    const int n_grp = D / L.G, levels = (1 << BITS) - 1;
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
        __half hs, hz;
        kv_scale_zero(mn, mx, ok, levels, hs, hz);
        __half *dst =
            reinterpret_cast<__half *>(tile[which] + L.sz_offset + (size_t)slot * L.sz_row + 4 * g);
        dst[0] = hs;
        dst[1] = hz;
        sz[which][g][0] = __half2float(hs);
        sz[which][g][1] = __half2float(hz);
    }
    __syncthreads();
    auto code = [&](int which, int c) -> unsigned {
        return kv_code(true, which ? vs[c] : ks[c], sz[which][c / L.G][1], sz[which][c / L.G][0],
                       levels);
    };
    if constexpr (BITS == 4) {
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

/* ---- the register form ---------------------------------------------------------------- */

/* Grid (T, H + Hkv), ROPE_THREADS threads; the same results, bit for bit, as
 * rope_kv_append_kernel (COMET_CUDA_ROPE_KV_REG=0 runs that one), in fewer serial steps.
 * Blocks y < H rotate a query head in place and finish. A block y >= H (KV head y - H) first
 * issues the loads its end needs (the token's sequence and page slot, v into registers), then
 * RoPE on k as the query blocks do (angles in double from the CPU's table, cos and sin rounded
 * to float), k to shared memory; after one barrier thread i holds channels e = i + 128 r of k
 * and v in registers. With `rotate` the butterflies of stages h < 32 run across lanes
 * (shuffles), stages 32 and 64 through one exchange in shared memory (each thread reads the
 * four values its two stages combine), stage 128 inside the thread, each butterfly the
 * operation wht_smem does on the same operands. Each group's min and max (and whether every
 * value fits fp16) come from an 8-lane shuffle reduction and, for groups wider than 8
 * channels, the fold of their 8-channel runs in channel order through shared memory, ties
 * kept as the CPU's scan keeps them (kv_range_cat); every thread then derives its group's
 * fp16 scale and zero itself (the same operations as the group's first channel, which stores
 * them) and its code; at 4 bits the even channel's thread stores the byte with its neighbour's
 * code. */
template <int BITS>
static __global__ void __launch_bounds__(ROPE_THREADS)
    rope_kv_append_reg_kernel(kv_args L, const int32_t *__restrict__ positions,
                              const int32_t *__restrict__ token_indptr, int n_seqs,
                              const int32_t *__restrict__ page_indptr,
                              const int32_t *__restrict__ page_indices,
                              const double *__restrict__ inv_freq, float *q, int H, float *k,
                              const float *__restrict__ v, int rotate) {
    __shared__ float ks[COMET_CUDA_KV_MAX_HEAD_DIM], vs[COMET_CUDA_KV_MAX_HEAD_DIM];
    __shared__ kv_range runs[2][COMET_CUDA_KV_MAX_HEAD_DIM / 8];
    const int t = blockIdx.x, y = blockIdx.y, D = L.D, half = D / 2, tid = threadIdx.x;
    const int lane = tid & 31;
    const int pos = positions[t];
    const bool is_q = y < H;
    const int kvh = y - H;
    float *row = is_q ? q + ((size_t)t * H + y) * D : k + ((size_t)t * L.Hkv + kvh) * D;
    /* the KV block's page slot and v, loaded while RoPE computes its angles */
    uint8_t *tile[2] = {NULL, NULL};
    int slot = 0;
    float vr[KV_APPEND_R];
    if (!is_q) {
        const int s = seq_of_token(token_indptr, n_seqs, t);
        const int page = page_indices[page_indptr[s] + pos / L.P];
        slot = pos % L.P;
        tile[0] = kv_tile(L, page, 0, kvh), tile[1] = kv_tile(L, page, 1, kvh);
        kv_append_load_v(v + ((size_t)t * L.Hkv + kvh) * D, D, tid, vr);
    }
    rope_row(row, ks, !is_q, pos, inv_freq, half, tid, ROPE_THREADS);
    if (is_q)
        return;
    __syncthreads();
    kv_append_regs<BITS>(L, ks, vs, runs, vr, tile, slot, rotate, tid, lane);
}

} /* namespace */

extern "C" {

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
    /* COMET_CUDA_ROPE_KV_REG=0 (read at every call): the shared-memory form, for A/B runs;
     * the same bits either way */
    const bool reg = !comet_cuda_env_off("COMET_CUDA_ROPE_KV_REG");
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    with_kv_bits(L->bits, [&](auto bits) {
        constexpr int BITS = decltype(bits)::value;
        if (reg)
            rope_kv_append_reg_kernel<BITS><<<grid, ROPE_THREADS, 0, s>>>(
                ka, st->positions, st->token_indptr, st->n_seqs, st->page_indptr, st->page_indices,
                inv_freq, q, H, k, v, rotate);
        else
            rope_kv_append_kernel<BITS><<<grid, ROPE_THREADS, 0, s>>>(
                ka, st->positions, st->token_indptr, st->n_seqs, st->page_indptr, st->page_indices,
                inv_freq, q, H, k, v, rotate);
    });
    return launch_check("rope_kv_append");
}

} /* extern "C" */
