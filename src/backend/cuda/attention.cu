/* attention.cu — paged attention over the KV pool (attention.h comet_cuda_paged_attention):
 * the launch of its kernel family, one translation unit built from
 *   attention_common.cuh   launch constants, kernel arguments, K/V code reads, span merge
 *   attention_prefill.cuh  the general flash-attention kernel (tiles of several tokens)
 *   attention_mma.cuh      the tensor-core kernel of prefill chunks (fp16 mma, fp32 softmax)
 *   attention_mma2.cuh     its pipelined form (128 query rows a CTA, two K/V stages)
 *   attention_mma3.cuh     its two-CTAs-an-SM form for INT4 caches (COMET_CUDA_ATTN_MMA=3)
 *   attention_decode.cuh   the flash-decoding kernel (steps of one-token tiles)
 *   attention_decode_mma.cuh  the tensor-core flash-decoding kernel of INT4 caches
 *   attention_combine.cuh  the combine kernel of split keys
 *   attention_quant.cuh    the combine of a decode step's splits fused with the
 *                          quantization of the output for o_proj (attn_quant_kernel)
 *   attention_plan.cuh     the tile list, decode-or-tile choice, key splits, workspace
 * K/V are read as codes and dequantized in registers (cuda_kv.h layout, paged_kv.cuh
 * helpers, the code width dispatched by with_kv_bits); fp32 throughout, except the prefill
 * chunks' Q, V and P, which attn_mma_kernel rounds to fp16 for the tensor cores (K as an
 * fp16 hi + lo pair from INT4 / INT8 codes, as stored from an fp16 cache).
 */
#include "backend/cuda/attention.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>

#include <atomic>

#include "backend/cuda/attention_common.cuh"
#include "backend/cuda/attention_prefill.cuh"
#include "backend/cuda/attention_mma.cuh"
#include "backend/cuda/attention_mma2.cuh"
#include "backend/cuda/attention_mma3.cuh"
#include "backend/cuda/attention_decode.cuh"
#include "backend/cuda/attention_decode_mma.cuh"
#include "backend/cuda/attention_combine.cuh"
#include "backend/cuda/attention_quant.cuh"
#include "backend/cuda/attention_plan.cuh"
#include "backend/cuda/rope_kv.h"

namespace {

template <int BITS>
void attn_decode_launch(const att_args &a, dim3 grid, cudaStream_t s) {
    if (a.g <= 1)
        attn_decode_kernel<BITS, 1><<<grid, DEC_THREADS, 0, s>>>(a);
    else if (a.g <= 2)
        attn_decode_kernel<BITS, 2><<<grid, DEC_THREADS, 0, s>>>(a);
    else if (a.g <= 4)
        attn_decode_kernel<BITS, 4><<<grid, DEC_THREADS, 0, s>>>(a);
    else
        attn_decode_kernel<BITS, 8><<<grid, DEC_THREADS, 0, s>>>(a);
}

/* f(D, NGR) as std::integral_constant values for head dim D (64 or 128) with ngr (scale, zero)
 * groups a key (D / 16 at most, a power of two: att_decode_mma's layouts): the instances of
 * attn_decode_mma_kernel. */
template <typename F>
void with_dmma_shape(int D, int ngr, F &&f) {
    using std::integral_constant;
    if (D == 64) {
        if (ngr == 4)
            f(integral_constant<int, 64>{}, integral_constant<int, 4>{});
        else if (ngr == 2)
            f(integral_constant<int, 64>{}, integral_constant<int, 2>{});
        else
            f(integral_constant<int, 64>{}, integral_constant<int, 1>{});
    } else {
        if (ngr == 8)
            f(integral_constant<int, 128>{}, integral_constant<int, 8>{});
        else if (ngr == 4)
            f(integral_constant<int, 128>{}, integral_constant<int, 4>{});
        else if (ngr == 2)
            f(integral_constant<int, 128>{}, integral_constant<int, 2>{});
        else
            f(integral_constant<int, 128>{}, integral_constant<int, 1>{});
    }
}

/* attn_decode_mma_kernel, or with rope (its inv_freq, k and v) its fused form, at head dim D
 * with ngr groups a key */
void attn_decode_mma_launch(int D, int ngr, const att_args &a, const att_rope_args *rope, dim3 grid,
                            cudaStream_t s) {
    with_dmma_shape(D, ngr, [&](auto d, auto n) {
        constexpr int DD = decltype(d)::value, NGR = decltype(n)::value;
        if (rope) {
            att_rope_args p = *rope;
            static_cast<att_args &>(p) = a;
            attn_decode_mma_kernel<DD, NGR, true><<<grid, DMMA_THREADS, 0, s>>>(p);
        } else {
            attn_decode_mma_kernel<DD, NGR><<<grid, DMMA_THREADS, 0, s>>>(a);
        }
    });
}

int dmma_ctas_per_sm(int D) {
    /* [D == 128][device], 0 = not asked yet; atomic: backends on other threads plan too */
    static std::atomic<int> cached[2][16];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 16) {
        cudaGetLastError();
        return 2;
    }
    std::atomic<int> &slot = cached[D == 128][dev];
    int n = slot.load(std::memory_order_relaxed);
    if (!n) {
        int c = 0;
        const cudaError_t e =
            D == 128 ? cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                           &c, attn_decode_mma_kernel<128, 1>, DMMA_THREADS, 0)
                     : cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                           &c, attn_decode_mma_kernel<64, 1>, DMMA_THREADS, 0);
        if (e != cudaSuccess)
            cudaGetLastError();
        n = e == cudaSuccess && c >= 1 ? c : 2;
        slot.store(n, std::memory_order_relaxed);
    }
    return n;
}

/* kernel<<<grid, threads, smem, s>>>(a) after raising its dynamic shared memory limit to smem
 * bytes; `what` names the kernel in the error when the device refuses them. */
comet_status launch_smem(void (*kernel)(att_args), dim3 grid, int threads, size_t smem,
                         cudaStream_t s, const char *what, const att_args &a) {
    cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess)
        return comet_set_error(COMET_ERR_CUDA,
                               "cuda backend: paged_attention%s: %zu bytes of shared memory "
                               "refused: %s",
                               what, smem, cudaGetErrorString(e));
    kernel<<<grid, threads, smem, s>>>(a);
    return COMET_OK;
}

template <int BITS>
comet_status attn_mma_launch(int D, const att_args &a, dim3 grid, cudaStream_t s) {
    return D == 64 ? launch_smem(attn_mma_kernel<64, BITS>, grid, MMA_THREADS,
                                 mma_smem_bytes(64, BITS), s, " (tensor cores)", a)
                   : launch_smem(attn_mma_kernel<128, BITS>, grid, MMA_THREADS,
                                 mma_smem_bytes(128, BITS), s, " (tensor cores)", a);
}

template <int BITS>
comet_status attn_mma2_launch(int D, const att_args &a, dim3 grid, cudaStream_t s) {
    return D == 64 ? launch_smem(attn_mma2_kernel<64, BITS>, grid, MMA2_THREADS,
                                 mma2_smem_bytes(64, BITS), s, " (pipelined tensor cores)", a)
                   : launch_smem(attn_mma2_kernel<128, BITS>, grid, MMA2_THREADS,
                                 mma2_smem_bytes(128, BITS), s, " (pipelined tensor cores)", a);
}

/* attn_mma3_kernel at head dim D (64 or 128; an INT4 cache: att_mma3) */
using att_kernel_fn = void (*)(att_args);
att_kernel_fn mma3_kernel(int D) { return D == 64 ? attn_mma3_kernel<64> : attn_mma3_kernel<128>; }

/* Asks the largest shared-memory carveout for attn_mma3_kernel<D>: its two CTAs an SM need more
 * than the next smaller one (196 KB on sm_90). */
cudaError_t mma3_carveout(int D) {
    return cudaFuncSetAttribute(mma3_kernel(D), cudaFuncAttributePreferredSharedMemoryCarveout,
                                cudaSharedmemCarveoutMaxShared);
}

comet_status attn_mma3_launch(int D, const att_args &a, dim3 grid, cudaStream_t s) {
    const cudaError_t e = mma3_carveout(D);
    if (e != cudaSuccess)
        return comet_set_error(COMET_ERR_CUDA,
                               "cuda backend: paged_attention (two-CTA tensor cores): the shared "
                               "memory carveout refused: %s",
                               cudaGetErrorString(e));
    return launch_smem(mma3_kernel(D), grid, MMA3_THREADS, mma3_smem_bytes(D), s,
                       " (two-CTA tensor cores)", a);
}

template <int DMAX, bool SPANS>
comet_status attn_launch(const att_args &a, dim3 grid, cudaStream_t s) {
    return launch_smem(attn_kernel<DMAX, SPANS>, grid, ATT_THREADS, att_smem_bytes(DMAX), s, "",
                       a);
}

template <bool SPANS>
comet_status attn_launch_dmax(int dmax, const att_args &a, dim3 grid, cudaStream_t s) {
    return dmax == 64    ? attn_launch<64, SPANS>(a, grid, s)
           : dmax == 128 ? attn_launch<128, SPANS>(a, grid, s)
                         : attn_launch<256, SPANS>(a, grid, s);
}

/* comet_cuda_paged_attention, with the combine of split keys left to the caller when
 * `combine` is false (the partial rows and their (max, sum) then wait in workspace:
 * comet_cuda_paged_attention_quant's fused kernel merges them). With rope (inv_freq, k and v;
 * its attention arguments unused) the step, which att_rope_fused takes, runs
 * attn_decode_mma_kernel's fused form: RoPE and the KV append of the step's k and v happen inside,
 * q is read before RoPE. */
comet_status paged_attention_run(const comet_cuda_kv_layout *L, const void *storage, int layer,
                                 const comet_cuda_step_view *st, const float *q, int H, float *out,
                                 int rotate, int n_splits, void *workspace, bool combine,
                                 const att_rope_args *rope, cudaStream_t s) {
    const int D = L->D;
    if (D > COMET_CUDA_KV_MAX_HEAD_DIM || D % 8 || L->P > COMET_CUDA_KV_MAX_PAGE_SIZE ||
        (rotate && (D & (D - 1))) || (L->bits != 16 && L->G % 8))
        return comet_set_error(COMET_ERR_UNSUPPORTED,
                               "cuda backend: paged_attention: head dim %d, page size %d, group "
                               "%d%s; the kernel takes D <= %d with D %% 8 == 0 (a power of two "
                               "with the hadamard rotation), P <= %d, groups of a multiple of 8 "
                               "channels",
                               D, L->P, L->G, rotate ? ", hadamard" : "",
                               COMET_CUDA_KV_MAX_HEAD_DIM, COMET_CUDA_KV_MAX_PAGE_SIZE);
    if (H < 1 || L->Hkv < 1 || H % L->Hkv || st->n_tokens < 1 || layer < 0 || layer >= L->n_layer ||
        n_splits < 1 || (n_splits > 1 && !workspace))
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "cuda backend: paged_attention: H = %d, Hkv = %d, T = %d, layer %d "
                               "of %d, %d splits",
                               H, L->Hkv, st->n_tokens, layer, L->n_layer, n_splits);
    const int g = H / L->Hkv, dmax = att_dmax(D);
    if (g > att_rows(dmax))
        return comet_set_error(COMET_ERR_UNSUPPORTED,
                               "cuda backend: paged_attention: %d query heads per KV head; the "
                               "kernel takes at most %d at head dim %d",
                               g, att_rows(dmax), D);
    if (st->n_tiles < 1)
        return COMET_OK;
    att_args a;
    a.L = kv_args_make(L, storage, layer);
    a.positions = st->positions, a.token_indptr = st->token_indptr;
    a.page_indptr = st->page_indptr, a.page_indices = st->page_indices, a.tiles = st->tiles;
    a.H = H, a.g = g, a.n_splits = n_splits, a.rotate = rotate;
    a.span = st->batch_invariant && n_splits > 1 ? ATT_SPAN : 0;
    a.tc_min = 0;
    att_tiling(D, g, &a.tt, &a.n_sub);
    a.lk_log2 = 2; /* lanes a key: D / 8 rounded up to a power of two, at least 4 */
    while ((8 << a.lk_log2) < D)
        a.lk_log2++;
    a.p_shift = -1;
    for (int p = 0; (1 << p) <= L->P && a.p_shift < 0; p++)
        if (L->P == 1 << p)
            a.p_shift = p;
    a.scale = 1.0f / sqrtf((float)D);
    a.q = q, a.out = out;
    a.ws_acc = static_cast<float *>(workspace);
    a.ws_ml = a.ws_acc ? a.ws_acc + (size_t)st->n_tokens * H * n_splits * D : NULL;
    /* rope: the caller checked att_rope_fused, which implies both (a bug otherwise: RoPE and
     * the append would not happen) */
    COMET_ASSERT(!rope || (att_decode_step(st, g) && att_decode_mma(L, g)));
    if (att_decode_step(st, g)) {
        dim3 grid((unsigned)st->n_tiles, L->Hkv, n_splits);
        if (att_decode_mma(L, g)) {
            attn_decode_mma_launch(D, D / L->G, a, rope, grid, s);
        } else {
            with_kv_bits(L->bits,
                         [&](auto bits) { attn_decode_launch<decltype(bits)::value>(a, grid, s); });
        }
        COMET_TRY(launch_check("paged_attention (decode)"));
    } else {
        dim3 grid((unsigned)st->n_tiles * a.n_sub, L->Hkv, n_splits);
        const bool mma = att_mma_step(st, D, q, out);
        a.tc_min = mma ? ATT_MMA_MIN_TOKENS : 0;
        if (mma) {
            const bool mma2 = att_mma2(st, g);
            comet_status r =
                att_mma3(L, st, g)
                    ? attn_mma3_launch(D, a, grid, s)
                    : with_kv_bits(L->bits, [&](auto bits) {
                          return mma2 ? attn_mma2_launch<decltype(bits)::value>(D, a, grid, s)
                                      : attn_mma_launch<decltype(bits)::value>(D, a, grid, s);
                      });
            if (r < 0)
                return r;
            COMET_TRY(launch_check("paged_attention (tensor cores)"));
        }
        /* with every sequence a chunk the tensor-core kernel took, each of attn_kernel's CTAs
         * would return at once (4 us a layer at 512 tokens of the LLaMA-3-8B shape on an H100) */
        if (!(mma && st->min_q_len >= ATT_MMA_MIN_TOKENS && att_plan_waves())) {
            comet_status r = st->batch_invariant && n_splits == 1
                                 ? attn_launch_dmax<true>(dmax, a, grid, s)
                                 : attn_launch_dmax<false>(dmax, a, grid, s);
            if (r < 0)
                return r;
            COMET_TRY(launch_check("paged_attention"));
        }
    }
    if (n_splits > 1 && combine) {
        const int threads = (D + 31) / 32 * 32;
        attn_combine_kernel<<<dim3(st->n_tokens, H), threads, 0, s>>>(
            a.ws_acc, a.ws_ml, H, D, n_splits, rotate, a.span > 0, out);
        COMET_TRY(launch_check("paged_attention (split combine)"));
    }
    return COMET_OK;
}

/* comet_cuda_paged_attention_quant, and with rope comet_cuda_rope_attention_quant's fused
 * path (paged_attention_run's rope) */
comet_status attention_quant_run(const comet_cuda_kv_layout *L, const void *storage, int layer,
                                 const comet_cuda_step_view *st, const float *q, int H, float *out,
                                 int rotate, int n_splits, void *workspace,
                                 const comet_cuda_act_fmt *f, void *act, const att_rope_args *rope,
                                 cudaStream_t s) {
    if (!att_quant_fused(L, st, H, n_splits, f, out)) {
        COMET_TRY(paged_attention_run(L, storage, layer, st, q, H, out, rotate, n_splits, workspace,
                                      true, rope, s));
        return comet_cuda_act_quant(out, st->n_tokens, f, act, s);
    }
    if (!act)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "cuda backend: paged_attention_quant: no activation buffer");
    COMET_TRY(paged_attention_run(L, storage, layer, st, q, H, out, rotate, n_splits, workspace,
                                  false, rope, s));
    const int T = st->n_tokens, D = L->D;
    aq_args a = {};
    a.ws_acc = static_cast<const float *>(workspace);
    a.ws_ml = a.ws_acc + (size_t)T * H * n_splits * D;
    a.H = H, a.n_splits = n_splits, a.rotate = rotate, a.out = out;
    a.perm = f->perm, a.K = f->K, a.B = f->B, a.n8 = f->n8;
    a.pdl_trigger = comet_ptx::step_trigger(T);
    a.qa = static_cast<int8_t *>(act);
    a.sa =
        reinterpret_cast<float *>(static_cast<char *>(act) + comet_cuda_act_scales_offset(T, f->K));
    int threads = (f->K / 4 + 31) / 32 * 32;
    threads = threads < AQ_THREADS ? threads : AQ_THREADS;
    const size_t smem = aq_smem_bytes(H, D, n_splits);
    void (*kernel)(aq_args) = D == 64 ? attn_quant_kernel<64> : attn_quant_kernel<128>;
    if (smem > 48u << 10) {
        const cudaError_t e =
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess)
            return comet_set_error(COMET_ERR_CUDA,
                                   "cuda backend: paged_attention_quant: %zu bytes of shared "
                                   "memory refused: %s",
                                   smem, cudaGetErrorString(e));
    }
    kernel<<<T, threads, smem, s>>>(a);
    return launch_check("paged_attention_quant (split combine + quantization)");
}

} /* namespace */

extern "C" {

comet_status comet_cuda_paged_attention(const comet_cuda_kv_layout *L, const void *storage,
                                        int layer, const comet_cuda_step_view *st, const float *q,
                                        int H, float *out, int rotate, int n_splits,
                                        void *workspace, void *stream) {
    return paged_attention_run(L, storage, layer, st, q, H, out, rotate, n_splits, workspace, true,
                               NULL, static_cast<cudaStream_t>(stream));
}

size_t comet_cuda_attention_mma3_cta_bytes(void) { return (size_t)mma3_smem_bytes(128); }

int comet_cuda_attention_mma3_ctas_per_sm(void) {
    int c = 0;
    if (mma3_carveout(128) != cudaSuccess ||
        cudaFuncSetAttribute(mma3_kernel(128), cudaFuncAttributeMaxDynamicSharedMemorySize,
                             mma3_smem_bytes(128)) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&c, mma3_kernel(128), MMA3_THREADS,
                                                      mma3_smem_bytes(128)) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return c;
}

int comet_cuda_attention_quant_fused(const comet_cuda_kv_layout *L, const comet_cuda_step_view *st,
                                     int H, int n_splits, const comet_cuda_act_fmt *f,
                                     const void *out) {
    return att_quant_fused(L, st, H, n_splits, f, out);
}

comet_status comet_cuda_paged_attention_quant(const comet_cuda_kv_layout *L, const void *storage,
                                              int layer, const comet_cuda_step_view *st,
                                              const float *q, int H, float *out, int rotate,
                                              int n_splits, void *workspace,
                                              const comet_cuda_act_fmt *f, void *act,
                                              void *stream) {
    return attention_quant_run(L, storage, layer, st, q, H, out, rotate, n_splits, workspace, f,
                               act, NULL, static_cast<cudaStream_t>(stream));
}

int comet_cuda_rope_attention_fused(const comet_cuda_kv_layout *L, const comet_cuda_step_view *st,
                                    int layer, int H) {
    return att_rope_fused(L, st, layer, H);
}

comet_status comet_cuda_rope_attention_quant(const comet_cuda_kv_layout *L, void *storage,
                                             int layer, const comet_cuda_step_view *st,
                                             const double *inv_freq, float *q, int H, float *k,
                                             const float *v, float *out, int rotate, int n_splits,
                                             void *workspace, const comet_cuda_act_fmt *f,
                                             void *act, void *stream) {
    if (!att_rope_fused(L, st, layer, H)) {
        COMET_TRY(
            comet_cuda_rope_kv_append(L, storage, layer, st, inv_freq, q, H, k, v, rotate, stream));
        return comet_cuda_paged_attention_quant(L, storage, layer, st, q, H, out, rotate, n_splits,
                                                workspace, f, act, stream);
    }
    att_rope_args rope;
    rope.inv_freq = inv_freq, rope.k = k, rope.v = v;
    return attention_quant_run(L, storage, layer, st, q, H, out, rotate, n_splits, workspace, f,
                               act, &rope, static_cast<cudaStream_t>(stream));
}

} /* extern "C" */
