/* sample.cu — next-token sampling where the logits are (sample.h), one CTA per row.
 *
 * The chain is engine/sampler.c's, on the row's parameters (comet_sample_row.p, the host's
 * comet_sampler_params) with the host's floats (1 / temperature, logf(min_p)) passed in, so
 * that every filter decision is taken on the same fp32 values:
 *
 *   1. the listed ids (comet_sample_adj): logit_bias added (-100: -infinity, a ban), then
 *      the penalties (the host's comet_sampler_adjust, unfused ops);
 *   2. one pass: val = logit (greedy) or logit * (1 / temperature), its maximum and argmax
 *      (lowest id on ties), and whether any logit is not finite (then the row reports
 *      COMET_SAMPLE_NONFINITE). Greedy rows end here.
 *   3. Without top-k and top-p the host draws in id order over the candidates (min-p:
 *      val >= max + logf(min_p)): each thread sums the masses exp(val - max) (double) of a
 *      contiguous slice, a block scan gives every slice its offset, and the slice holding
 *      u * total walks to the first id whose running sum passes it.
 *   4. Otherwise the host walks the candidates sorted (val descending, id ascending). The
 *      kernel finds a threshold t whose set {val >= t} holds at most SMP_CAP candidates and
 *      still every one the filters can keep: with top-k at least k of them (bisection on
 *      the order-preserving integer image of val, stopping as soon as the count is in
 *      [k, SMP_CAP]); without top-k, t starts at the min-p floor, and top-p needs the set's
 *      mass to reach top_p of the whole row's. The set is sorted in shared memory (CUB
 *      block radix sort on (val, ~id) keys); top-k, top-p (block scan of the normalized
 *      masses), min-p and the draw (block scan of the masses) are then prefix cuts of it.
 *      A row whose set cannot be bounded (a flat distribution at a high temperature with
 *      only top-p) reports COMET_SAMPLE_ON_HOST.
 *
 * Sums run in double as on the host, in another order: a draw lands on another token only
 * when u * total falls within rounding (~1e-16 relative) of a boundary.
 */
#include "backend/cuda/sample.h"

#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>

namespace {

constexpr int SMP_THREADS = 1024;
/* candidates a row sorts in shared memory, two keys a thread: the default top-k (40) and
 * min-p (0.05) keep far fewer */
constexpr int SMP_CAP = 2048;
constexpr int SMP_ITEMS = SMP_CAP / SMP_THREADS;

/* The unsigned image of a finite float that keeps its order (-0 counted as +0). */
__device__ __forceinline__ uint32_t ord_of(float v) {
    const uint32_t b = __float_as_uint(v == 0.0f ? 0.0f : v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ float float_of(uint32_t k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

struct arg_max {
    float v;
    int id;
};

struct arg_max_op {
    __device__ arg_max operator()(const arg_max &a, const arg_max &b) const {
        return (b.v > a.v || (b.v == a.v && b.id < a.id)) ? b : a;
    }
};

struct min_op {
    __device__ int operator()(int a, int b) const { return a < b ? a : b; }
};

struct max_op {
    __device__ int operator()(int a, int b) const { return a > b ? a : b; }
};

using block_argmax = cub::BlockReduce<arg_max, SMP_THREADS>;
using block_int = cub::BlockReduce<int, SMP_THREADS>;
using block_double = cub::BlockReduce<double, SMP_THREADS>;
using block_dscan = cub::BlockScan<double, SMP_THREADS>;
using block_sort = cub::BlockRadixSort<unsigned long long, SMP_THREADS, SMP_ITEMS>;

struct sample_smem {
    union {
        block_argmax::TempStorage am;
        block_int::TempStorage i;
        block_double::TempStorage d;
        block_dscan::TempStorage scan;
        block_sort::TempStorage sort;
        unsigned long long keys[SMP_CAP]; /* the gathered set, in registers before the sort */
    } t;
    int n_keys;
    int bi;    /* a block result broadcast to every thread */
    double bd; /* likewise */
    arg_max am;
};

/* v, valid in thread 0, in every thread (slot: shared memory). */
template <typename T>
__device__ T broadcast(T *slot, T v) {
    if (threadIdx.x == 0)
        *slot = v;
    __syncthreads();
    const T out = *slot;
    __syncthreads();
    return out;
}

/* The block's sum (int), in every thread. */
__device__ int all_sum(sample_smem &sm, int v) {
    return broadcast(&sm.bi, block_int(sm.t.i).Sum(v));
}

template <typename Op>
__device__ int all_reduce(sample_smem &sm, int v, Op op) {
    return broadcast(&sm.bi, block_int(sm.t.i).Reduce(v, op));
}

__device__ double all_dsum(sample_smem &sm, double v) {
    return broadcast(&sm.bd, block_double(sm.t.d).Sum(v));
}

__device__ __forceinline__ float tempered(const float *x, int i, const comet_sample_row &R) {
    return __fmul_rn(x[i], R.inv_temperature);
}

/* How many ids of the row have ord(val) >= key. */
__device__ int count_from(sample_smem &sm, const float *x, int V, const comet_sample_row &R,
                          uint32_t key) {
    int c = 0;
    for (int i = threadIdx.x; i < V; i += SMP_THREADS)
        c += ord_of(tempered(x, i, R)) >= key;
    return all_sum(sm, c);
}

/* The mass sum of exp(val - zmax) over the ids with ord(val) >= key. */
__device__ double mass_from(sample_smem &sm, const float *x, int V, const comet_sample_row &R,
                            uint32_t key, float zmax) {
    double m = 0.0;
    for (int i = threadIdx.x; i < V; i += SMP_THREADS) {
        const float v = tempered(x, i, R);
        if (ord_of(v) >= key)
            m += exp((double)v - (double)zmax);
    }
    return all_dsum(sm, m);
}

/* Step 3 of the file comment: the draw in id order over val >= floor_z. */
__device__ int draw_in_id_order(sample_smem &sm, const float *x, int V, const comet_sample_row &R,
                                float zmax, float floor_z) {
    const int chunk = (V + SMP_THREADS - 1) / SMP_THREADS;
    const int b0 = min(V, (int)threadIdx.x * chunk), b1 = min(V, b0 + chunk);
    double m = 0.0;
    int last = -1;
    for (int i = b0; i < b1; i++) {
        const float v = tempered(x, i, R);
        if (v >= floor_z) {
            m += exp((double)v - (double)zmax);
            last = i;
        }
    }
    double pre, total;
    block_dscan(sm.t.scan).ExclusiveSum(m, pre, total);
    __syncthreads();
    const double target = R.u * broadcast(&sm.bd, total);
    int pick = INT_MAX;
    if (pre <= target) {
        double acc = pre;
        for (int i = b0; i < b1; i++) {
            const float v = tempered(x, i, R);
            if (v >= floor_z) {
                acc += exp((double)v - (double)zmax);
                if (target < acc) {
                    pick = i;
                    break;
                }
            }
        }
    }
    __syncthreads();
    pick = all_reduce(sm, pick, min_op());
    last = all_reduce(sm, last, max_op());
    return pick != INT_MAX ? pick : last; /* past the end by rounding: the last candidate */
}

/* Step 4: the sorted walk. Returns the token or COMET_SAMPLE_ON_HOST. */
__device__ int draw_sorted(sample_smem &sm, const float *x, int V, const comet_sample_row &R,
                           float zmax, float floor_z) {
    const int tid = threadIdx.x;
    const bool topk = R.p.top_k > 0 && R.p.top_k < V;
    const bool topp = R.p.top_p < 1.0f;
    /* the whole row's mass: top-p's normalizer when no top-k comes first */
    const double z_all = !topk && topp ? mass_from(sm, x, V, R, 0u, zmax) : 0.0;

    /* the threshold: with top-k, the top-p normalizer needs the whole top-k set, floor or
     * not; without it nothing under the min-p floor can be kept */
    uint32_t lo = topk ? 0u : ord_of(floor_z);
    int n_lo = count_from(sm, x, V, R, lo);
    uint32_t key = lo;
    if (n_lo > SMP_CAP) {
        /* bisection: count(lo) > SMP_CAP >= count(hi) */
        uint32_t hi = ord_of(zmax);
        int n_hi = count_from(sm, x, V, R, hi);
        if (n_hi > SMP_CAP)
            return COMET_SAMPLE_ON_HOST; /* more than SMP_CAP ties at the maximum */
        while (hi - lo > 1 && !(topk && n_hi >= R.p.top_k)) {
            const uint32_t mid = lo + (hi - lo) / 2;
            const int n = count_from(sm, x, V, R, mid);
            if (n > SMP_CAP) {
                lo = mid;
            } else {
                hi = mid;
                n_hi = n;
                /* enough mass for top-p: a lower threshold only adds candidates */
                if (!topk && topp &&
                    mass_from(sm, x, V, R, hi, zmax) >= (double)R.p.top_p * z_all * (1.0 + 1e-9))
                    break;
            }
        }
        key = hi;
        if (topk ? n_hi < R.p.top_k
                 : !(topp &&
                     mass_from(sm, x, V, R, key, zmax) >= (double)R.p.top_p * z_all * (1.0 + 1e-9)))
            return COMET_SAMPLE_ON_HOST;
    }
    const bool whole = key == lo; /* the set holds every id from lo up */

    /* gather and sort (val descending, then id ascending) */
    if (tid == 0)
        sm.n_keys = 0;
    __syncthreads();
    for (int i = tid; i < V; i += SMP_THREADS) {
        const uint32_t k = ord_of(tempered(x, i, R));
        if (k >= key) {
            const int pos = atomicAdd(&sm.n_keys, 1);
            sm.t.keys[pos] = ((unsigned long long)k << 32) | (0xffffffffu - (uint32_t)i);
        }
    }
    __syncthreads();
    const int nc = sm.n_keys;
    unsigned long long k[SMP_ITEMS];
#pragma unroll
    for (int j = 0; j < SMP_ITEMS; j++) {
        const int r = tid * SMP_ITEMS + j;
        k[j] = r < nc ? sm.t.keys[r] : 0ull;
    }
    __syncthreads();
    block_sort(sm.t.sort).SortDescending(k);
    __syncthreads();

    float v[SMP_ITEMS];
    int id[SMP_ITEMS];
#pragma unroll
    for (int j = 0; j < SMP_ITEMS; j++) {
        v[j] = float_of((uint32_t)(k[j] >> 32));
        id[j] = (int)(0xffffffffu - (uint32_t)k[j]);
    }
    int n = topk && R.p.top_k < nc ? R.p.top_k : nc;

    double w[SMP_ITEMS], cum[SMP_ITEMS];
    if (topp) {
        double z = z_all;
        if (topk) {
            double part = 0.0;
#pragma unroll
            for (int j = 0; j < SMP_ITEMS; j++)
                if (tid * SMP_ITEMS + j < n)
                    part += exp((double)v[j] - (double)zmax);
            z = all_dsum(sm, part);
        }
#pragma unroll
        for (int j = 0; j < SMP_ITEMS; j++)
            w[j] = tid * SMP_ITEMS + j < n ? exp((double)v[j] - (double)zmax) / z : 0.0;
        block_dscan(sm.t.scan).InclusiveSum(w, cum);
        __syncthreads();
        int cut = INT_MAX;
#pragma unroll
        for (int j = 0; j < SMP_ITEMS; j++)
            if (tid * SMP_ITEMS + j < n && cum[j] >= (double)R.p.top_p && cut == INT_MAX)
                cut = tid * SMP_ITEMS + j;
        cut = all_reduce(sm, cut, min_op());
        if (cut != INT_MAX)
            n = cut + 1;
        else if (!topk && !whole)
            return COMET_SAMPLE_ON_HOST; /* the cut lies past the set (rounding) */
    }
    /* min-p: a prefix, the set being sorted */
    int below = INT_MAX;
#pragma unroll
    for (int j = 0; j < SMP_ITEMS; j++)
        if (tid * SMP_ITEMS + j < n && !(v[j] >= floor_z) && below == INT_MAX)
            below = tid * SMP_ITEMS + j;
    below = all_reduce(sm, below, min_op());
    if (below < n)
        n = below;
    if (n < 1)
        return COMET_SAMPLE_ON_HOST; /* cannot happen: the maximum passes every filter */

        /* the draw: the first rank whose running mass passes u * total */
#pragma unroll
    for (int j = 0; j < SMP_ITEMS; j++)
        w[j] = tid * SMP_ITEMS + j < n ? exp((double)v[j] - (double)zmax) : 0.0;
    double total;
    block_dscan(sm.t.scan).InclusiveSum(w, cum, total);
    __syncthreads();
    const double target = R.u * broadcast(&sm.bd, total);
    int pick = INT_MAX;
#pragma unroll
    for (int j = 0; j < SMP_ITEMS; j++)
        if (tid * SMP_ITEMS + j < n && target < cum[j] && pick == INT_MAX)
            pick = tid * SMP_ITEMS + j;
    pick = all_reduce(sm, pick, min_op());
    if (pick == INT_MAX)
        pick = n - 1; /* past the end by rounding: the last candidate, as the host */
#pragma unroll
    for (int j = 0; j < SMP_ITEMS; j++)
        if (tid * SMP_ITEMS + j == pick)
            sm.bi = id[j];
    __syncthreads();
    return sm.bi;
}

__global__ void __launch_bounds__(SMP_THREADS)
    sample_kernel(const comet_sample_row *__restrict__ rows, float *__restrict__ logits, int V,
                  const comet_sample_adj *__restrict__ adj, int32_t *__restrict__ ids) {
    __shared__ sample_smem sm;
    const comet_sample_row R = rows[blockIdx.x];
    float *x = logits + (size_t)R.row * V;
    const int tid = threadIdx.x;

    /* step 1: the listed ids, as comet_sampler_adjust; their raw logits are checked here,
     * as a ban's -infinity is not a fault */
    int bad = 0;
    for (int i = tid; i < R.n_adj; i += SMP_THREADS) {
        const comet_sample_adj a = adj[R.adj_offset + i];
        float l = x[a.id];
        bad |= !isfinite(l);
        if (a.bias == -COMET_SAMPLER_MAX_LOGIT_BIAS) {
            l = -INFINITY;
        } else {
            if (a.bias != 0.0f)
                l = __fadd_rn(l, a.bias);
            if (a.count > 0) {
                l = l > 0.0f ? __fdiv_rn(l, R.p.repeat_penalty) : __fmul_rn(l, R.p.repeat_penalty);
                l = __fsub_rn(
                    l, __fmaf_rn(R.p.frequency_penalty, (float)a.count, R.p.presence_penalty));
            }
        }
        x[a.id] = l;
    }
    __syncthreads();

    arg_max best = {-INFINITY, INT_MAX};
    for (int i = tid; i < V; i += SMP_THREADS) {
        const float l = x[i];
        /* -infinity is a ban in a row that has one (a raw -infinity elsewhere in such a row
         * then counts as a zero probability, not as a fault) */
        bad |= isnan(l) || l == INFINITY || (l == -INFINITY && !R.has_ban);
        const arg_max c = {R.greedy ? l : __fmul_rn(l, R.inv_temperature), i};
        best = arg_max_op()(best, c);
    }
    if (__syncthreads_or(bad)) {
        if (tid == 0)
            ids[blockIdx.x] = COMET_SAMPLE_NONFINITE;
        return;
    }
    best = broadcast(&sm.am, block_argmax(sm.t.am).Reduce(best, arg_max_op()));
    if (R.greedy) {
        if (tid == 0)
            ids[blockIdx.x] = best.id;
        return;
    }
    const float zmax = best.v;
    const float floor_z = R.log_min_p == -INFINITY ? -INFINITY : __fadd_rn(zmax, R.log_min_p);
    const int out = R.p.top_p < 1.0f || (R.p.top_k > 0 && R.p.top_k < V)
                        ? draw_sorted(sm, x, V, R, zmax, floor_z)
                        : draw_in_id_order(sm, x, V, R, zmax, floor_z);
    if (tid == 0)
        ids[blockIdx.x] = out;
}

} /* namespace */

extern "C" comet_status comet_cuda_sample(const comet_sample_row *rows, int n_rows, float *logits,
                                          int V, const comet_sample_adj *adj, int32_t *ids,
                                          void *stream) {
    if (V < 1 || n_rows < 1)
        return comet_set_error(COMET_ERR_INVALID_ARG, "cuda backend: sample: V = %d, %d rows", V,
                               n_rows);
    sample_kernel<<<n_rows, SMP_THREADS, 0, static_cast<cudaStream_t>(stream)>>>(rows, logits, V,
                                                                                 adj, ids);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return comet_set_error(COMET_ERR_CUDA, "cuda backend: sample: launch failed: %s",
                               cudaGetErrorString(e));
    return COMET_OK;
}
