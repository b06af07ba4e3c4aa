/* bench_attention.cu — the attention benchmark of issue 41: comet's paged attention
 * (attention.h comet_cuda_paged_attention, the op a step runs once a layer) over a paged KV
 * cache of INT4 or INT8 codes with fp16 (scale, zero) pairs, or of fp16 values, on one layer
 * of the LLaMA-3-8B head shape (H 32, Hkv 8, D 128; --model 70b: H 64). The pool is filled
 * with random valid codes, scales and values straight on the device: no RoPE or KV append,
 * only the attention op (its kernel and, with key splits, the combine kernel) is timed.
 *
 * Decode: B sequences of L keys each, one query token a sequence (position L - 1), the key
 * splits and workspace of the engine's plan (comet_cuda_attention_splits over all SMs). INT4
 * decode runs on the tensor-core decode kernel; a format FORMAT:fp32 (the default list has
 * int4/16:fp32) runs its decode shapes on the fp32 decode kernel instead, in the same run,
 * by setting COMET_CUDA_ATTN_DECODE_MMA=0 around them (the other formats unset it).
 * Page ids are a shuffled permutation of the pool. So that no call finds its K/V in L2 (as
 * in a model, where the other layers' pages pass through L2 between two calls of one layer),
 * small shapes rotate through several copies of the cache, each call reading its own pages,
 * at least 256 MB of distinct K/V over the copies (at most 256 copies).
 *   bytes read = B * Hkv * L * 2 * (code_row + sz_row) + B * ceil(L / P) * 4
 *   (K and V of every key: INT4 D / 2 bytes of codes and (D / G) * 4 bytes of fp16
 *   (scale, zero) pairs a slot and head, INT8 D and (D / G) * 4, FP16 2 D and none; plus the
 *   page table's int32 ids; q, out and the split workspace are not counted)
 *   GB/s = bytes / time; % of peak against --peak-gbs.
 * Prefill: one sequence of T tokens attending causally to its own T keys in the paged cache
 * (positions 0 .. T - 1: the first chunk of a chunked prefill, after its KV append), on the
 * kernel the backend takes by default (the two-CTAs-an-SM one where an SM holds two of its
 * CTAs and it takes the cache, else the pipelined one) unless COMET_CUDA_ATTN_MMA=N asks for
 * another (0 the fp32 kernel, 1 the first tensor-core kernel, 2 the pipelined one, 3 the
 * two-CTAs-an-SM one: the step view's attn_mma, as the backend sets it); a format FORMAT:mmaN
 * runs prefill on kernel N in the same run (the default list has int4/16:mma1 and
 * int4/16:mma2, the A/Bs of the default). Each prefill row names its kernel (prefill_kernel:
 * 3 two CTAs an SM, 2 pipelined, 1 first tensor-core, 0 fp32).
 *   FLOPs = 4 * (T * T / 2) * D * H (QK^T and PV over the causal half, the FlashAttention
 *   convention); TFLOPS = FLOPs / time; % of the dense FP16 tensor-core peak --peak-tflops.
 * Mixed (--mixed B:L:T): the step of continuous batching with chunked prefill, B decode
 * sequences of L keys (one token each, as in decode) followed by one prefill chunk of T tokens
 * (positions 0 .. T - 1, as in prefill), in one op call with the plan's one key split count
 * for all of them; the decodes take attn_kernel, the chunk its tensor-core kernel (attn_kernel
 * too under 16 tokens). One copy of the cache (no rotation: a small step's K/V may stay in
 * L2, so its GB/s is not comparable with the decode rows'); bytes and FLOPs are the sums of
 * the two parts'.
 *
 * Timing: one untimed call, one call timed alone (its time sets the repetitions), then R
 * intervals of G back-to-back calls between two CUDA events on one stream, queued behind a
 * spin kernel so that host launch gaps stay out of the intervals; G makes an interval at
 * least about 200 us (at most 10 calls), R fits about 0.3 s of calls (3 to --reps). The time
 * is the median interval / G. After timing, every output must be finite.
 *
 * Output: one JSON object a line on stdout (the GPU first, then one per measurement or
 * skipped shape); progress, the human-readable rows and errors on stderr. A shape whose
 * buffers do not fit the free device memory is skipped with a "skipped" line that says so.
 * bench/attention/run.sh runs this and sdpa_torch.py and turns both into one Markdown table
 * (table.py). Exit status: 0 when every shape ran (or was skipped for memory) with finite
 * outputs, 1 when an output check failed, 2 on bad arguments or a CUDA / comet error (the
 * message names the call). Benchmark tooling, not engine.
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/attention.h"
#include "backend/cuda/cuda_kv.h"
#include "comet/status.h"

/* The shape being measured, named in every error message ("" before the first). */
static char g_where[160];

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "bench_attention: %s:%d: %s failed: %s (%s)%s%s\n", __FILE__,          \
                    __LINE__, #x, cudaGetErrorString(e_), cudaGetErrorName(e_),                    \
                    g_where[0] ? ", measuring " : "", g_where);                                    \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)
#define CKC(x)                                                                                     \
    do {                                                                                           \
        comet_status s_ = (x);                                                                     \
        if (s_ < 0) {                                                                              \
            fprintf(stderr, "bench_attention: %s:%d: %s failed: %s: %s%s%s\n", __FILE__, __LINE__, \
                    #x, comet_status_name(s_), comet_last_error(),                                 \
                    g_where[0] ? ", measuring " : "", g_where);                                    \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)

/* ---- device fills ------------------------------------------------------------------------ */

__device__ __forceinline__ uint32_t hash32(uint64_t i, uint32_t seed) {
    uint64_t x = i * 0x9E3779B97F4A7C15ull + (uint64_t)seed * 0xBF58476D1CE4E5B9ull;
    x ^= x >> 31;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 29;
    return (uint32_t)x;
}

/* n random 32-bit words: every bit pattern is a valid set of INT4 / INT8 codes */
static __global__ void fill_words(uint32_t *p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = hash32(i, seed);
}

/* n fp16 values in [-1, 1) */
static __global__ void fill_half(__half *p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = __float2half((float)(hash32(i, seed) & 0xFFFFu) * (1.0f / 32768.0f) - 1.0f);
}

/* n floats in [-1, 1) */
static __global__ void fill_float(float *p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = (float)(hash32(i, seed) & 0xFFFFu) * (1.0f / 32768.0f) - 1.0f;
}

/* The fp16 (scale, zero) pair of every group of every slot of n_tiles head tiles (cuda_kv.h:
 * tile + sz_offset + slot * sz_row + 4 * group): scale in [0.004, 0.016), zero = -7.5 scale,
 * so code * scale + zero lies within about +-0.12 around 0 for INT4 codes. */
static __global__ void fill_scales(uint8_t *base, size_t n_tiles, size_t tile_bytes,
                                   size_t sz_offset, int P, int sz_row, int n_groups,
                                   uint32_t seed) {
    const size_t per_tile = (size_t)P * n_groups, n = n_tiles * per_tile;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t tile = i / per_tile;
        const int r = (int)(i % per_tile), slot = r / n_groups, grp = r % n_groups;
        const float s = 0.004f + (float)(hash32(i, seed) & 1023u) * (0.012f / 1024.0f);
        *reinterpret_cast<__half2 *>(base + tile * tile_bytes + sz_offset + (size_t)slot * sz_row +
                                     4 * (size_t)grp) = __floats2half2_rn(s, -7.5f * s);
    }
}

/* Holds the GPU for about `ns` nanoseconds so that the host queues the timed calls behind it. */
static __global__ void spin(long long ns) {
    long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}

/* ---- options ------------------------------------------------------------------------------ */

struct kv_spec {
    int bits;         /* 4, 8 or 16 */
    int G;            /* channels per (scale, zero) group; D for fp16 */
    bool fp32_decode; /* decode on attn_decode_kernel (COMET_CUDA_ATTN_DECODE_MMA=0) */
    int mma;          /* prefill on the step view's attn_mma N (1 attn_mma_kernel, 2
                       * attn_mma2_kernel, 3 attn_mma3_kernel where it takes the format) from
                       * a ':mmaN' suffix; -1: as the backend chooses */
    std::string name;
};

struct opts {
    const char *model = "8b";
    int H = 32, Hkv = 8, D = 128, P = 16;
    std::vector<kv_spec> kv;
    std::vector<int> ctx = {1024, 8192, 32768}, batch = {1, 16, 64, 256},
                     prefill = {512, 2048, 8192};
    std::vector<std::array<int, 3>> mixed; /* (B, L, T) of --mixed; default none */
    const char *rotate = "auto"; /* auto: hadamard for codes, none for fp16 (kv_format.c) */
    double peak_gbs = 0, peak_tflops = 0;
    int max_reps = 15;
    int splits = 0; /* key splits of every row (--splits); 0: comet_cuda_attention_splits's */
};

static const int MAX_REPS = 32;
static const size_t ROT_BYTES = 256ull << 20; /* distinct K/V bytes over the rotated copies */
static const int MAX_SETS = 256;

static void usage(FILE *f) {
    fprintf(f,
            "usage: bench_attention [--model 8b|70b]\n"
            "         [--kv int4/16,int4/16:fp32,int4/16:mma1,int4/16:mma2,int4/128,fp16]\n"
            "         [--ctx 1024,8192,32768] [--batch 1,16,64,256] [--prefill 512,2048,8192]\n"
            "         [--page P] [--rotate auto|none|hadamard] [--peak-gbs X] [--peak-tflops X]\n"
            "         [--reps N] [--splits S] [--mixed B:L:T,...]\n"
            "  --model     8b: H 32, Hkv 8, D 128 (default); 70b: H 64, Hkv 8, D 128\n"
            "  --kv        KV formats, comma-separated: int4/G, int8/G (G channels per fp16\n"
            "              (scale, zero) pair; int4 alone: one pair per head vector, G = D) or\n"
            "              fp16 (default int4/16,int4/16:fp32,int4/16:mma1,int4/16:mma2,\n"
            "              int4/128,fp16: comet quantize's group and the synthetic llama3-8b's);\n"
            "              a ':fp32' suffix runs decode on the fp32 decode kernel\n"
            "              (COMET_CUDA_ATTN_DECODE_MMA=0, the A/B of the tensor-core one; named\n"
            "              FORMAT-fp32dec, no prefill rows); ':mmaN' runs prefill as\n"
            "              COMET_CUDA_ATTN_MMA=N does (1 the first tensor-core kernel, 2 the\n"
            "              pipelined one, 3 the two-CTAs-an-SM one of INT4 caches with groups\n"
            "              of at most D / 4 channels, elsewhere what that falls back to; named\n"
            "              FORMAT-mmaN, no decode rows); without it prefill takes the backend's\n"
            "              default (3 where an SM holds two of its CTAs, else 2)\n"
            "  --ctx, --batch  decode contexts L and batches B (every pair; an empty list: none)\n"
            "  --prefill   prefill lengths T (an empty list: none)\n"
            "  --page      KV page size in tokens (default 16, the engine's)\n"
            "  --rotate    the Hadamard rotation of the cache (auto: on for codes, off for fp16,\n"
            "              as the engine resolves a KV format)\n"
            "  --peak-gbs  memory bandwidth for %% of peak (default by GPU name: H200 4300,\n"
            "              H100 SXM 3350, H100 PCIe 2000)\n"
            "  --peak-tflops  dense FP16 tensor-core peak (default by name: 989, H100 PCIe 756)\n"
            "  --reps      most timed intervals a shape (default 15, at most %d)\n"
            "  --splits    key splits of every row, 1 to 64 (default 0: the backend's plan,\n"
            "              comet_cuda_attention_splits)\n"
            "  --mixed     mixed steps: B decode sequences of L keys and one prefill chunk of T\n"
            "              tokens in one call (default none; B >= 1, T >= 2)\n",
            MAX_REPS);
}

static bool parse_int(const char *s, int lo, int hi, int *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end || v < lo || v > hi)
        return false;
    *out = (int)v;
    return true;
}

/* The comma-separated items of arg ("a,b,c"; an empty arg has none) */
static std::vector<std::string> split_commas(const char *arg) {
    std::vector<std::string> items;
    std::string s(arg);
    size_t pos = 0;
    while (pos < s.size()) {
        size_t comma = s.find(',', pos);
        items.push_back(
            s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos));
        if (comma == std::string::npos)
            break;
        pos = comma + 1;
    }
    return items;
}

static bool parse_ints(const char *arg, const char *what, int lo, int hi, std::vector<int> *out) {
    out->clear();
    for (const std::string &item : split_commas(arg)) {
        int v;
        if (!parse_int(item.c_str(), lo, hi, &v)) {
            fprintf(stderr, "bench_attention: %s: '%s' is not an integer in %d..%d\n", what,
                    item.c_str(), lo, hi);
            return false;
        }
        out->push_back(v);
    }
    return true;
}

/* --mixed's "B:L:T,..." (B in 1..4096, L in 1..2^20, T in 2..2^17: a chunk of one token
 * would be a decode) into (B, L, T) triples. */
static bool parse_mixed(const char *arg, std::vector<std::array<int, 3>> *out) {
    static const int lo[3] = {1, 1, 2}, hi[3] = {4096, 1 << 20, 1 << 17};
    out->clear();
    for (const std::string &item : split_commas(arg)) {
        std::array<int, 3> m;
        bool ok = true;
        size_t at = 0;
        for (int f = 0; f < 3 && ok; f++) { /* three fields, ':' between them */
            const size_t end = f < 2 ? item.find(':', at) : item.size();
            ok = end != std::string::npos &&
                 parse_int(item.substr(at, end - at).c_str(), lo[f], hi[f], &m[f]);
            at = end + 1;
        }
        if (!ok) {
            fprintf(stderr,
                    "bench_attention: --mixed: '%s' is not B:L:T (B 1..4096, L 1..%d, "
                    "T 2..%d)\n",
                    item.c_str(), 1 << 20, 1 << 17);
            return false;
        }
        out->push_back(m);
    }
    return true;
}

static bool parse_kv(const char *arg, int D, std::vector<kv_spec> *out) {
    out->clear();
    for (std::string item : split_commas(arg)) {
        kv_spec k;
        k.fp32_decode = item.size() > 5 && item.compare(item.size() - 5, 5, ":fp32") == 0;
        k.mma = -1;
        for (int m = 1; m <= 3; m++)
            if (item.size() > 5 &&
                item.compare(item.size() - 5, 5, ":mma" + std::to_string(m)) == 0)
                k.mma = m;
        if (k.fp32_decode || k.mma > 0)
            item.resize(item.size() - 5);
        std::string type = item.substr(0, item.find('/'));
        k.bits = type == "int4" ? 4 : type == "int8" ? 8 : type == "fp16" ? 16 : 0;
        k.G = D;
        bool ok = k.bits != 0;
        if (ok && item.find('/') != std::string::npos)
            ok = k.bits != 16 && parse_int(item.substr(item.find('/') + 1).c_str(), 8, D, &k.G) &&
                 D % k.G == 0 && k.G % 8 == 0;
        if (!ok) {
            fprintf(stderr,
                    "bench_attention: --kv: '%s' is not a KV format: int4/G, int8/G (G a multiple "
                    "of 8 dividing the head dim %d), int4, int8 or fp16, each with an optional "
                    "':fp32' (the fp32 decode kernel), ':mma1' (the first tensor-core prefill "
                    "kernel), ':mma2' (the pipelined one) or ':mma3' (the two-CTAs-an-SM one)\n",
                    item.c_str(), D);
            return false;
        }
        k.name = k.bits == 16 ? "fp16" : (k.bits == 4 ? "int4/" : "int8/") + std::to_string(k.G);
        if (k.fp32_decode)
            k.name += "-fp32dec";
        if (k.mma > 0)
            k.name += "-mma" + std::to_string(k.mma);
        out->push_back(k);
    }
    return true;
}

static int parse_args(int argc, char **argv, opts *o) {
    const char *kv_arg = "int4/16,int4/16:fp32,int4/16:mma1,int4/16:mma2,int4/128,fp16";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            exit(0);
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "bench_attention: %s: unknown option or missing value\n", a);
            usage(stderr);
            return 2;
        }
        const char *v = argv[++i];
        bool ok = true;
        if (!strcmp(a, "--model")) {
            o->model = v;
            if (!strcmp(v, "8b"))
                o->H = 32;
            else if (!strcmp(v, "70b"))
                o->H = 64;
            else {
                fprintf(stderr, "bench_attention: --model: '%s' is not 8b or 70b\n", v);
                ok = false;
            }
        } else if (!strcmp(a, "--kv"))
            kv_arg = v;
        else if (!strcmp(a, "--ctx"))
            ok = parse_ints(v, a, 1, 1 << 20, &o->ctx);
        else if (!strcmp(a, "--batch"))
            ok = parse_ints(v, a, 1, 4096, &o->batch);
        else if (!strcmp(a, "--prefill"))
            ok = parse_ints(v, a, 1, 1 << 17, &o->prefill);
        else if (!strcmp(a, "--page"))
            ok = parse_int(v, 1, COMET_CUDA_KV_MAX_PAGE_SIZE, &o->P);
        else if (!strcmp(a, "--reps"))
            ok = parse_int(v, 3, MAX_REPS, &o->max_reps);
        else if (!strcmp(a, "--splits"))
            ok = parse_int(v, 0, 64, &o->splits);
        else if (!strcmp(a, "--mixed"))
            ok = parse_mixed(v, &o->mixed);
        else if (!strcmp(a, "--rotate")) {
            o->rotate = v;
            ok = !strcmp(v, "auto") || !strcmp(v, "none") || !strcmp(v, "hadamard");
        } else if (!strcmp(a, "--peak-gbs") || !strcmp(a, "--peak-tflops")) {
            char *end;
            double x = strtod(v, &end);
            ok = end != v && !*end && x > 0;
            (!strcmp(a, "--peak-gbs") ? o->peak_gbs : o->peak_tflops) = x;
        } else {
            fprintf(stderr, "bench_attention: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
        if (!ok) {
            fprintf(stderr, "bench_attention: bad value '%s' for %s (see --help)\n", v, a);
            return 2;
        }
    }
    if (!parse_kv(kv_arg, o->D, &o->kv))
        return 2;
    if (o->kv.empty()) {
        fprintf(stderr, "bench_attention: --kv: no KV format given (e.g. int4/16,fp16)\n");
        return 2;
    }
    return 0;
}

/* ---- timing ------------------------------------------------------------------------------- */

static cudaStream_t g_st;
static cudaEvent_t g_ev[2 * MAX_REPS];

struct timing {
    double us; /* median per call */
    int calls; /* G: calls an interval */
    int reps;  /* R: intervals */
};

/* The median time of one call(i) (i counts calls from 0; each queues on g_st), as the file
 * comment says. */
template <typename F>
static timing time_op(F &&call, int max_reps) {
    call(0);
    CK(cudaStreamSynchronize(g_st));
    CK(cudaGetLastError());
    CK(cudaEventRecord(g_ev[0], g_st));
    call(1);
    CK(cudaEventRecord(g_ev[1], g_st));
    CK(cudaEventSynchronize(g_ev[1]));
    float ms;
    CK(cudaEventElapsedTime(&ms, g_ev[0], g_ev[1]));
    const double est = std::max(1.0, 1000.0 * ms);
    timing t;
    t.calls = std::min(10, std::max(1, (int)std::ceil(200.0 / est)));
    t.reps = std::min(max_reps, std::max(3, (int)(3e5 / (t.calls * est))));
    /* 2 ms plus 20 us of host time a queued call: the launches all sit behind the spin */
    spin<<<1, 1, 0, g_st>>>((2000LL + 20LL * t.calls * t.reps) * 1000LL);
    CK(cudaGetLastError());
    int k = 2;
    for (int r = 0; r < t.reps; r++) {
        CK(cudaEventRecord(g_ev[2 * r], g_st));
        for (int j = 0; j < t.calls; j++)
            call(k++);
        CK(cudaEventRecord(g_ev[2 * r + 1], g_st));
    }
    CK(cudaEventSynchronize(g_ev[2 * t.reps - 1]));
    CK(cudaGetLastError());
    std::vector<float> v(t.reps);
    for (int r = 0; r < t.reps; r++)
        CK(cudaEventElapsedTime(&v[r], g_ev[2 * r], g_ev[2 * r + 1]));
    std::sort(v.begin(), v.end());
    const int n = t.reps;
    const double med = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    t.us = 1000.0 * med / t.calls;
    return t;
}

/* ---- device buffers ------------------------------------------------------------------------ */

/* The device buffers of one shape, freed together; alloc returns NULL when the device is out
 * of memory (the error cleared), and exits on any other error. */
struct dbufs {
    std::vector<void *> p;
    void *alloc(size_t bytes) {
        void *q = NULL;
        cudaError_t e = cudaMalloc(&q, bytes ? bytes : 16);
        if (e == cudaErrorMemoryAllocation) {
            cudaGetLastError();
            return NULL;
        }
        CK(e);
        p.push_back(q);
        return q;
    }
    ~dbufs() {
        for (void *q : p)
            cudaFree(q);
    }
};

static void upload(void *dst, const void *src, size_t bytes) {
    CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, g_st));
}

static unsigned grid_for(size_t n) {
    return (unsigned)std::max<size_t>(1, std::min<size_t>((n + 255) / 256, 132 * 16));
}

/* Random valid contents for every layer-0 head tile of the pool (cuda_kv.h layout). */
static void fill_pool(const comet_cuda_kv_layout &L, void *storage, uint32_t seed) {
    if (L.bits == 16) {
        const size_t n = L.total_bytes / 2;
        fill_half<<<grid_for(n), 256, 0, g_st>>>((__half *)storage, n, seed);
    } else {
        const size_t n = L.total_bytes / 4, tiles = (size_t)L.n_pages * 2 * L.Hkv;
        const int n_groups = L.D / L.G;
        fill_words<<<grid_for(n), 256, 0, g_st>>>((uint32_t *)storage, n, seed);
        CK(cudaGetLastError());
        fill_scales<<<grid_for(tiles * L.P * n_groups), 256, 0, g_st>>>(
            (uint8_t *)storage, tiles, L.head_tile_bytes, L.sz_offset, L.P, L.sz_row_bytes,
            n_groups, seed + 1);
    }
    CK(cudaGetLastError());
}

/* A permutation of 0 .. n-1 (Fisher-Yates on a fixed xorshift stream). */
static std::vector<int32_t> shuffled(int n, uint64_t seed) {
    std::vector<int32_t> a(n);
    for (int i = 0; i < n; i++)
        a[i] = i;
    uint64_t x = seed | 1;
    for (int i = n - 1; i > 0; i--) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        std::swap(a[i], a[(int)(x % (uint64_t)(i + 1))]);
    }
    return a;
}

/* Non-finite entries among the n floats at d. */
static size_t count_nonfinite(const float *d, size_t n) {
    std::vector<float> h(n);
    CK(cudaMemcpyAsync(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost, g_st));
    CK(cudaStreamSynchronize(g_st));
    size_t bad = 0;
    for (float v : h)
        bad += !std::isfinite(v);
    return bad;
}

/* ---- the three modes ----------------------------------------------------------------------- */

struct gpu_info {
    char name[256];
    int n_sm;
    int mma3_ctas; /* attn_mma3_kernel's CTAs an SM at D 128 (2 on sm_90): whether it is the default */
    double peak_gbs, peak_tflops;
};

static int g_failed; /* an output check failed */

static int rotate_of(const opts &o, const kv_spec &k) {
    if (!strcmp(o.rotate, "auto"))
        return k.bits != 16 && (o.D & (o.D - 1)) == 0;
    return !strcmp(o.rotate, "hadamard");
}

static void print_skip(const opts &o, const kv_spec &k, const char *mode, int B, int L, int T,
                       const char *why, double need_gb, double free_gb) {
    printf("{\"type\":\"result\",\"src\":\"comet\",\"mode\":\"%s\",\"model\":\"%s\",\"kv\":\"%s\","
           "\"B\":%d,\"L\":%d,\"T\":%d,\"status\":\"skipped\",\"reason\":\"%s: needs %.2f GB, "
           "%.2f GB free\"}\n",
           mode, o.model, k.name.c_str(), B, L, T, why, need_gb, free_gb);
    fflush(stdout);
    fprintf(stderr, "  %-6s %-9s B %4d L %6d T %5d: skipped, %s (needs %.2f GB, %.2f GB free)\n",
            mode, k.name.c_str(), B, L, T, why, need_gb, free_gb);
}

/* Bytes that must fit: the buffers plus 256 MB for the context and the fills. */
static bool fits(size_t need, double *free_gb) {
    size_t free_b, total_b;
    CK(cudaMemGetInfo(&free_b, &total_b));
    *free_gb = free_b / 1e9;
    return need + (256ull << 20) <= free_b;
}

/* One measurement: a shape (decode: B sequences of L keys; prefill: T tokens; mixed: both,
 * the B decodes first) in format k. Decode when T == 0, mixed when `mixed`. */
static void run_shape(const opts &o, const gpu_info &gi, const kv_spec &k, int B, int Lctx, int T,
                      bool mixed = false) {
    const bool decode = T == 0;
    if ((k.fp32_decode && !decode) || (k.mma > 0 && decode))
        return; /* the switches move decode steps, prefill steps only */
    if (k.fp32_decode)
        setenv("COMET_CUDA_ATTN_DECODE_MMA", "0", 1);
    else
        unsetenv("COMET_CUDA_ATTN_DECODE_MMA");
    const char *mode = decode ? "decode" : mixed ? "mixed" : "prefill";
    const int P = o.P, H = o.H, Hkv = o.Hkv, D = o.D;
    const int n_dec = decode || mixed ? B : 0;  /* decode sequences, first */
    const int n_seq = n_dec + (decode ? 0 : 1); /* and the prefill chunk */
    const int n_tok = n_dec + (decode ? 0 : T);
    const int keys = std::max(n_dec ? Lctx : 0, decode ? 0 : T); /* the longest sequence's */
    const int jB = decode || mixed ? B : 1, jL = decode || mixed ? Lctx : T, jT = decode ? 1 : T;
    snprintf(g_where, sizeof g_where, "%s %s B %d L %d T %d", mode, k.name.c_str(), jB, jL, jT);
    /* a sequence's tokens and keys: a decode's one token at position L - 1, the chunk's T at
     * 0 .. T - 1 */
    auto seq_keys = [&](int s) { return s < n_dec ? Lctx : T; };
    long total_keys = 0, set_pages = 0; /* set_pages: pages a copy of the cache */
    for (int s = 0; s < n_seq; s++) {
        total_keys += seq_keys(s);
        set_pages += (seq_keys(s) + P - 1) / P;
    }
    const comet_cuda_kv_layout L1 = comet_cuda_kv_layout_make(1, 1, P, Hkv, D, k.bits, k.G);
    const double kv_bytes = (double)total_keys * Hkv * 2.0 * (L1.code_row_bytes + L1.sz_row_bytes);
    const double pt_bytes = (double)set_pages * 4.0;
    int n_sets = 1;
    if (decode)
        n_sets = (int)std::min<double>(MAX_SETS, std::max(1.0, std::ceil(ROT_BYTES / kv_bytes)));
    if ((long)n_sets * set_pages > 0x7fffffffL) {
        print_skip(o, k, mode, jB, jL, jT, "more than 2^31 pages", 0, 0);
        return;
    }
    const int n_pages = (int)(n_sets * set_pages);
    std::vector<int32_t> token_indptr(n_seq + 1), page_indptr(n_seq + 1);
    for (int s = 0; s < n_seq; s++) { /* within int32: set_pages <= n_pages */
        token_indptr[s + 1] = token_indptr[s] + (s < n_dec ? 1 : T);
        page_indptr[s + 1] = page_indptr[s] + (seq_keys(s) + P - 1) / P;
    }
    const comet_cuda_kv_layout L = comet_cuda_kv_layout_make(1, n_pages, P, Hkv, D, k.bits, k.G);

    /* the step's positions; copies of the cache differ in their page ids only */
    std::vector<int32_t> positions(n_tok);
    for (int s = 0; s < n_seq; s++)
        for (int t = token_indptr[s]; t < token_indptr[s + 1]; t++)
            positions[t] = s < n_dec ? Lctx - 1 : t - token_indptr[s];
    const int n_tiles = comet_cuda_attention_tiles(token_indptr.data(), n_seq, NULL);
    std::vector<int32_t> tiles(2 * (size_t)n_tiles);
    comet_cuda_attention_tiles(token_indptr.data(), n_seq, tiles.data());
    const std::vector<int32_t> page_ids = shuffled(n_pages, 0x5EEDull + (uint64_t)n_pages);

    comet_cuda_step_view view = {};
    view.n_tokens = n_tok, view.n_seqs = n_seq, view.n_tiles = n_tiles;
    view.max_kv_len = keys, view.batch_invariant = 0;
    /* prefill on kernel N for a ':mmaN' format, else on the kernel the backend's steps take, as
     * comet_backend_cuda_init settles it: COMET_CUDA_ATTN_MMA "0".."3" asks for that kernel (3
     * falls back to 2 where attn_mma3_kernel does not fit an SM), anything else is the default:
     * 3 where an SM holds two of its CTAs, taken only where its CTAs outnumber the SMs, else 2 */
    const char *attn_mma = getenv("COMET_CUDA_ATTN_MMA");
    const int asked = k.mma > 0                            ? k.mma
                      : attn_mma && !strcmp(attn_mma, "0") ? 0
                      : attn_mma && !strcmp(attn_mma, "1") ? 1
                      : attn_mma && !strcmp(attn_mma, "2") ? 2
                      : attn_mma && !strcmp(attn_mma, "3") ? 3
                                                           : -1;
    view.attn_mma = asked < 0                        ? (gi.mma3_ctas >= 2 ? 3 : 2)
                    : asked == 3 && gi.mma3_ctas < 1 ? 2
                                                     : asked;
    view.mma3_min_ctas = asked < 0 && view.attn_mma == 3 ? gi.n_sm : 0;
    view.min_q_len = n_dec ? 1 : T;
    /* a chunk under the tensor-core kernels' fewest tokens runs on attn_kernel */
    const int kernel = decode ? -1
                       : mixed && T < COMET_CUDA_ATTN_MMA_MIN_TOKENS
                           ? 0
                           : comet_cuda_attention_prefill_kernel(&L, &view, H);
    const int splits = o.splits > 0 ? o.splits : comet_cuda_attention_splits(&L, &view, H, gi.n_sm);
    const size_t ws_bytes = comet_cuda_attention_workspace_bytes(&L, &view, H, splits);
    const size_t qo_bytes = (size_t)n_tok * H * D * sizeof(float);
    const size_t idx_bytes = sizeof(int32_t) * (positions.size() + 2 * (size_t)(n_seq + 1) +
                                                tiles.size() + page_ids.size());
    const size_t need = L.total_bytes + ws_bytes + 2 * qo_bytes + idx_bytes + 5 * 256;
    double free_gb;
    if (!fits(need, &free_gb)) {
        print_skip(o, k, mode, jB, jL, jT, "does not fit the free device memory", need / 1e9,
                   free_gb);
        return;
    }
    dbufs bufs;
    void *storage = bufs.alloc(L.total_bytes);
    float *q = (float *)bufs.alloc(qo_bytes), *out = (float *)bufs.alloc(qo_bytes);
    void *ws = splits > 1 ? bufs.alloc(ws_bytes) : NULL;
    int32_t *d_pos = (int32_t *)bufs.alloc(positions.size() * 4);
    int32_t *d_tind = (int32_t *)bufs.alloc(token_indptr.size() * 4);
    int32_t *d_pind = (int32_t *)bufs.alloc(page_indptr.size() * 4);
    int32_t *d_tiles = (int32_t *)bufs.alloc(tiles.size() * 4);
    int32_t *d_pages = (int32_t *)bufs.alloc(page_ids.size() * 4);
    if (!storage || !q || !out || (splits > 1 && !ws) || !d_pos || !d_tind || !d_pind || !d_tiles ||
        !d_pages) {
        print_skip(o, k, mode, jB, jL, jT, "cudaMalloc ran out of memory", need / 1e9, free_gb);
        return;
    }
    upload(d_pos, positions.data(), positions.size() * 4);
    upload(d_tind, token_indptr.data(), token_indptr.size() * 4);
    upload(d_pind, page_indptr.data(), page_indptr.size() * 4);
    upload(d_tiles, tiles.data(), tiles.size() * 4);
    upload(d_pages, page_ids.data(), page_ids.size() * 4);
    fill_pool(L, storage, 1234u + (uint32_t)k.bits);
    const size_t n_q = (size_t)n_tok * H * D;
    fill_float<<<grid_for(n_q), 256, 0, g_st>>>(q, n_q, 99u);
    CK(cudaGetLastError());
    CK(cudaMemsetAsync(out, 0xFF, qo_bytes, g_st)); /* NaN until the op writes it */
    CK(cudaStreamSynchronize(g_st));

    std::vector<comet_cuda_step_view> views(n_sets, view);
    for (int s = 0; s < n_sets; s++) {
        comet_cuda_step_view &v = views[s];
        v.positions = d_pos, v.token_indptr = d_tind, v.page_indptr = d_pind, v.tiles = d_tiles;
        v.page_indices = d_pages + (size_t)s * set_pages;
    }
    const int rot = rotate_of(o, k);
    /* a shape the op refuses is a failed row, not the end of the run */
    const comet_status st =
        comet_cuda_paged_attention(&L, storage, 0, &views[0], q, H, out, rot, splits, ws, g_st);
    if (st < 0) {
        g_failed = 1;
        printf("{\"type\":\"result\",\"src\":\"comet\",\"mode\":\"%s\",\"model\":\"%s\","
               "\"kv\":\"%s\",\"B\":%d,\"L\":%d,\"T\":%d,\"status\":\"failed\",\"reason\":"
               "\"comet_cuda_paged_attention: %s\"}\n",
               mode, o.model, k.name.c_str(), jB, jL, jT, comet_status_name(st));
        fflush(stdout);
        fprintf(stderr, "bench_attention: %s: comet_cuda_paged_attention failed: %s\n", g_where,
                comet_last_error());
        comet_clear_error();
        return;
    }
    CK(cudaStreamSynchronize(g_st)); /* a fault in the kernel surfaces here, naming the shape */
    const timing tm = time_op(
        [&](int i) {
            CKC(comet_cuda_paged_attention(&L, storage, 0, &views[i % n_sets], q, H, out, rot,
                                           splits, ws, g_st));
        },
        o.max_reps);
    const size_t bad = count_nonfinite(out, n_q);
    if (bad) {
        g_failed = 1;
        fprintf(stderr,
                "bench_attention: %s %s B %d L %d T %d: %zu of %zu outputs are not finite\n", mode,
                k.name.c_str(), B, Lctx, T, bad, n_q);
    }

    const double bytes = kv_bytes + pt_bytes, gbs = bytes / (tm.us * 1e3);
    /* the chunk's causal half and each decode token's L keys (QK^T and PV) */
    const double flops =
        decode ? 0.0 : 4.0 * ((double)T * T / 2.0) * D * H + 4.0 * n_dec * (double)Lctx * D * H;
    const double tflops = decode ? 0.0 : flops / (tm.us * 1e6);
    printf("{\"type\":\"result\",\"src\":\"comet\",\"mode\":\"%s\",\"model\":\"%s\",\"H\":%d,"
           "\"Hkv\":%d,\"D\":%d,\"P\":%d,\"kv\":\"%s\",\"bits\":%d,\"G\":%d,\"rotate\":\"%s\","
           "\"B\":%d,\"L\":%d,\"T\":%d,\"splits\":%d,\"sets\":%d,\"calls\":%d,\"reps\":%d,"
           "\"us\":%.3f,\"bytes\":%.0f,\"gbs\":%.1f,\"pct_peak\":%.1f,\"flops\":%.0f,"
           "\"tflops\":%.2f,\"pct_tc\":%.1f,\"prefill_kernel\":%d,\"check\":\"%s\","
           "\"status\":\"ok\"}\n",
           mode, o.model, H, Hkv, D, P, k.name.c_str(), k.bits, k.G, rot ? "hadamard" : "none", jB,
           jL, jT, splits, n_sets, tm.calls, tm.reps, tm.us, bytes, gbs, 100.0 * gbs / gi.peak_gbs,
           flops, tflops, 100.0 * tflops / gi.peak_tflops, kernel,
           bad ? "non-finite outputs" : "ok");
    fflush(stdout);
    if (decode)
        fprintf(stderr,
                "  decode  %-9s B %4d L %6d: %10.2f us %9.1f MB %8.1f GB/s %5.1f %% (splits %d, "
                "copies %d)\n",
                k.name.c_str(), B, Lctx, tm.us, bytes / 1e6, gbs, 100.0 * gbs / gi.peak_gbs, splits,
                n_sets);
    else {
        const char *kname = kernel == 3   ? "mma3"
                            : kernel == 2 ? "mma2"
                            : kernel == 1 ? "mma"
                                          : "fp32";
        if (mixed)
            fprintf(stderr,
                    "  mixed   %-9s B %4d L %6d + T %5d: %10.2f us %8.2f TFLOPS %9.1f GB/s "
                    "(splits %d, chunk on %s)\n",
                    k.name.c_str(), B, Lctx, T, tm.us, tflops, gbs, splits, kname);
        else
            fprintf(
                stderr,
                "  prefill %-9s T %5d: %10.2f us %8.2f TFLOPS %5.1f %% (splits %d, kernel %s)\n",
                k.name.c_str(), T, tm.us, tflops, 100.0 * tflops / gi.peak_tflops, splits, kname);
    }
}

/* ---- main --------------------------------------------------------------------------------- */

static bool has(const char *s, const char *sub) { return strstr(s, sub) != NULL; }

int main(int argc, char **argv) {
    opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc)
        return rc;
    int n_dev = 0;
    cudaError_t e = cudaGetDeviceCount(&n_dev);
    if (e != cudaSuccess || n_dev < 1) {
        fprintf(stderr, "bench_attention: no usable CUDA device (%s)\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return 2;
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    gpu_info gi;
    snprintf(gi.name, sizeof gi.name, "%s", prop.name);
    gi.n_sm = prop.multiProcessorCount;
    /* defaults by name: H200 4.3 TB/s (docs/hopper.md's measured ceiling, as bench_gemm);
     * H100 SXM 3.35 TB/s and PCIe 2.0 TB/s (datasheets); dense FP16 tensor cores 989 TFLOPS
     * (H100 SXM, H200), 756 (H100 PCIe) */
    const bool pcie = has(gi.name, "PCIe"), known = has(gi.name, "H200") || has(gi.name, "H100");
    gi.peak_gbs = o.peak_gbs > 0                 ? o.peak_gbs
                  : has(gi.name, "H200")         ? 4300.0
                  : has(gi.name, "H100") && pcie ? 2000.0
                  : has(gi.name, "H100")         ? 3350.0
                                                 : 4300.0;
    gi.peak_tflops = o.peak_tflops > 0              ? o.peak_tflops
                     : has(gi.name, "H100") && pcie ? 756.0
                                                    : 989.0;
    if (!known && (o.peak_gbs <= 0 || o.peak_tflops <= 0))
        fprintf(stderr,
                "bench_attention: WARNING: %s is neither an H100 nor an H200: the peaks %.0f GB/s "
                "and %.0f TFLOPS are guesses; pass --peak-gbs and --peak-tflops\n",
                gi.name, gi.peak_gbs, gi.peak_tflops);
    CK(cudaSetDevice(0));
    CK(cudaStreamCreateWithFlags(&g_st, cudaStreamNonBlocking));
    for (auto &ev : g_ev)
        CK(cudaEventCreate(&ev));
    size_t free_b, total_b;
    CK(cudaMemGetInfo(&free_b, &total_b));
    int rt = 0, drv = 0;
    CK(cudaRuntimeGetVersion(&rt));
    CK(cudaDriverGetVersion(&drv));
    gi.mma3_ctas = comet_cuda_attention_mma3_ctas_per_sm();
    printf("{\"type\":\"env\",\"src\":\"comet\",\"gpu\":\"%s\",\"sm\":%d,\"cc\":\"%d.%d\","
           "\"mem_total_gb\":%.1f,\"mem_free_gb\":%.1f,\"cuda_runtime\":%d,\"cuda_driver\":%d,"
           "\"peak_gbs\":%.0f,\"peak_tflops\":%.0f,\"model\":\"%s\",\"H\":%d,\"Hkv\":%d,\"D\":%d,"
           "\"P\":%d,\"mma3_ctas_sm\":%d}\n",
           gi.name, gi.n_sm, prop.major, prop.minor, total_b / 1e9, free_b / 1e9, rt, drv,
           gi.peak_gbs, gi.peak_tflops, o.model, o.H, o.Hkv, o.D, o.P, gi.mma3_ctas);
    fflush(stdout);
    fprintf(stderr,
            "bench_attention: %s, %d SMs, %.1f GB (%.1f free); peaks %.0f GB/s, %.0f TFLOPS; "
            "H %d, Hkv %d, D %d, page %d; attn_mma3_kernel %d CTAs an SM at D 128\n",
            gi.name, gi.n_sm, total_b / 1e9, free_b / 1e9, gi.peak_gbs, gi.peak_tflops, o.H, o.Hkv,
            o.D, o.P, gi.mma3_ctas);

    for (int B : o.batch)
        for (int L : o.ctx)
            for (const kv_spec &k : o.kv)
                run_shape(o, gi, k, B, L, 0);
    for (int T : o.prefill)
        for (const kv_spec &k : o.kv)
            run_shape(o, gi, k, 0, 0, T);
    for (const auto &m : o.mixed)
        for (const kv_spec &k : o.kv)
            run_shape(o, gi, k, m[0], m[1], m[2], true);
    CK(cudaStreamDestroy(g_st));
    return g_failed ? 1 : 0;
}
