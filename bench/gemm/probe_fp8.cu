/* probe_fp8.cu -- is FP8 (e4m3) tensor-core accumulation exact for INT4 x INT4 block sums?
 *
 * The question behind it (docs/gemm.md, "What would close the gaps", prefill): the wgmma kernel
 * promotes every 128-channel block's int32 sums with three instructions per output (I2FP,
 * FMUL, FFMA). FP8 MMAs accumulate in fp32 registers, which would drop the conversion -- if
 * the tensor core's fp32 accumulation of the integer-valued products is exact. NVIDIA does not
 * document the accumulator's internal precision (DeepSeek-V3 reports ~14 bits on H800 for
 * general data); INT4 block sums need up to 14 significant bits (|sum| <= 128 x 64 = 2^13).
 *
 * Method: the same operand bytes go through the s8 MMA (int32, exact) and the e4m3 MMA, with
 * every INT4 code v mapped byte for byte to an e4m3 encoding of v. Both instructions read
 * 8-bit operands in the same fragment and shared-memory layouts, so element (i, j) of the
 * two results must agree: D_e4m3 * unit == D_s8. Two encodings:
 *  - "int":  the e4m3 value v itself (normal numbers; |v| <= 8 is exact), unit 1;
 *  - "sub":  sign << 7 | |v| (subnormals and 2^-6 for |v| = 8: v x 2^-9 for every v, the
 *            encoding an unpacking with masks would produce), unit 2^-18.
 * Instructions: mma.sync m16n8k32 (sm_89+) and wgmma m64n8k32 with A from registers (sm_90a),
 * 4 k32 steps accumulated in the MMA's fp32 accumulator (one 128-channel block), plus single
 * steps. Inputs: uniform random codes in [-8, 7], all -8 (sum 2^13), and chunked patterns that
 * make large partial sums followed by small or cancelling ones.
 *
 * Build: nvcc -std=c++17 -O2 -gencode=arch=compute_90a,code=sm_90a -o probe_fp8 probe_fp8.cu
 * Run:   ./probe_fp8   (prints mismatches per instruction, encoding and pattern; exit 0) */
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));             \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

constexpr int KB = 128;      /* one block: 4 k32 steps */
constexpr int TRIALS = 4096; /* per pattern */
constexpr int A_ROWS = 64, B_ROWS = 8;

__device__ __forceinline__ uint32_t ld32(const uint8_t *p) {
    return *reinterpret_cast<const uint32_t *>(p);
}

/* The m16n8k32 (and wgmma A-from-registers) A fragment of k32 step s for lane (g, tq) of a
 * 16-row slice a (rows KB bytes apart): rows g and g + 8, k 4 tq .. and 16 + 4 tq .. */
__device__ __forceinline__ void load_a(uint32_t (&r)[4], const uint8_t *a, int s, int g, int tq) {
    const int k = s * 32 + tq * 4;
    r[0] = ld32(a + g * KB + k), r[1] = ld32(a + (g + 8) * KB + k);
    r[2] = ld32(a + g * KB + k + 16), r[3] = ld32(a + (g + 8) * KB + k + 16);
}

/* this thread's four results of trial blockIdx.x: the fp32 ones (fp8) or the int32 ones */
__device__ __forceinline__ void store_d(int *di, float *df, int fp8, const int (&ci)[4],
                                        const float (&cf)[4]) {
    const size_t o = ((size_t)blockIdx.x * 128 + threadIdx.x) * 4;
    for (int r = 0; r < 4; r++) {
        if (fp8)
            df[o + r] = cf[r];
        else
            di[o + r] = ci[r];
    }
}

/* mma.sync m16n8k32: warp w of the CTA takes A rows 16(w&3).., all of B; steps = 1 or 4 */
__global__ void k_mma(const uint8_t *A, const uint8_t *B, int steps, int *di, float *df, int fp8) {
    const int trial = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2,
              tq = lane & 3;
    const uint8_t *a = A + (size_t)trial * A_ROWS * KB + (size_t)(warp * 16) * KB;
    const uint8_t *b = B + (size_t)trial * B_ROWS * KB;
    int ci[4] = {0, 0, 0, 0};
    float cf[4] = {0.f, 0.f, 0.f, 0.f};
    for (int s = 0; s < steps; s++) {
        uint32_t af[4];
        load_a(af, a, s, g, tq);
        const uint32_t b0 = ld32(b + g * KB + s * 32 + tq * 4),
                       b1 = ld32(b + g * KB + s * 32 + 16 + tq * 4);
        if (fp8)
            asm volatile(
                "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                "{%8,%9}, {%0,%1,%2,%3};\n"
                : "+f"(cf[0]), "+f"(cf[1]), "+f"(cf[2]), "+f"(cf[3])
                : "r"(af[0]), "r"(af[1]), "r"(af[2]), "r"(af[3]), "r"(b0), "r"(b1));
        else
            asm volatile(
                "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                "{%8,%9}, {%0,%1,%2,%3};\n"
                : "+r"(ci[0]), "+r"(ci[1]), "+r"(ci[2]), "+r"(ci[3])
                : "r"(af[0]), "r"(af[1]), "r"(af[2]), "r"(af[3]), "r"(b0), "r"(b1));
    }
    store_d(di, df, fp8, ci, cf);
}

/* wgmma m64n8k32, A (64 x 32 per step) from registers, B (8 x 32 per step) from shared memory
 * without swizzle: core matrices of 8 rows x 16 bytes, the two of a step 128 bytes apart */
__global__ void k_wgmma(const uint8_t *A, const uint8_t *B, int steps, int *di, float *df,
                        int fp8) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    __shared__ __align__(128) uint8_t sb[KB / 32][2][B_ROWS][16];
    const int trial = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2,
              tq = lane & 3;
    const uint8_t *a = A + (size_t)trial * A_ROWS * KB + (size_t)(warp * 16) * KB;
    const uint8_t *b = B + (size_t)trial * B_ROWS * KB;
    for (int i = threadIdx.x; i < B_ROWS * KB; i += 128) {
        const int r = i / KB, k = i % KB;
        sb[k / 32][(k % 32) / 16][r][k % 16] = b[r * KB + k];
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    int ci[4] = {0, 0, 0, 0};
    float cf[4] = {0.f, 0.f, 0.f, 0.f};
    for (int s = 0; s < steps; s++) {
        uint32_t af[4];
        load_a(af, a, s, g, tq);
        const uint32_t addr = (uint32_t)__cvta_generic_to_shared(&sb[s][0][0][0]);
        const uint64_t desc = ((uint64_t)((addr & 0x3FFFF) >> 4)) | ((uint64_t)(128 >> 4) << 16) |
                              ((uint64_t)(256 >> 4) << 32);
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
        if (fp8)
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
                         "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0,%1,%2,%3}, "
                         "{%4,%5,%6,%7}, %8, p, "
                         "1, 1;\n}\n"
                         : "+f"(cf[0]), "+f"(cf[1]), "+f"(cf[2]), "+f"(cf[3])
                         : "r"(af[0]), "r"(af[1]), "r"(af[2]), "r"(af[3]), "l"(desc), "r"(s));
        else
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
                         "wgmma.mma_async.sync.aligned.m64n8k32.s32.s8.s8 {%0,%1,%2,%3}, "
                         "{%4,%5,%6,%7}, %8, p;\n}\n"
                         : "+r"(ci[0]), "+r"(ci[1]), "+r"(ci[2]), "+r"(ci[3])
                         : "r"(af[0]), "r"(af[1]), "r"(af[2]), "r"(af[3]), "l"(desc), "r"(s));
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    }
    store_d(di, df, fp8, ci, cf);
#endif
}

static uint32_t rng = 12345;
static int rnd(int lo, int hi) /* uniform in [lo, hi] */
{
    rng = rng * 1664525u + 1013904223u;
    return lo + (int)((rng >> 8) % (uint32_t)(hi - lo + 1));
}

static uint8_t enc_int(int v) {
    return (uint8_t)__nv_cvt_float_to_fp8((float)v, __NV_SATFINITE, __NV_E4M3);
}
static uint8_t enc_sub(int v) { return (uint8_t)(v < 0 ? 0x80 | -v : v); }

/* pattern p fills codes for one trial: A [64 x 128], B [8 x 128] */
static void fill(int p, int8_t *a, int8_t *b) {
    for (int i = 0; i < A_ROWS * KB; i++) {
        const int k = i % KB, c = k / 32;
        a[i] =
            p == 0   ? rnd(-8, 7)
            : p == 1 ? -8
            : p == 2 ? (c == 0 ? -8 : rnd(-1, 1)) /* big first chunk, then small */
            : p == 3
                ? (c < 2 ? -8 : (c == 2 ? 7 : rnd(-8, 7))) /* +2^12 then -7/8 of it, then random */
                : (rnd(0, 15) == 0 ? rnd(-8, 7) : -8);     /* mostly max, some random */
    }
    for (int i = 0; i < B_ROWS * KB; i++) {
        const int k = i % KB, c = k / 32;
        b[i] = p == 0   ? rnd(-8, 7)
               : p == 1 ? -8
               : p == 2 ? (c == 0 ? -8 : rnd(-8, 7))
               : p == 3 ? (c < 2 ? -8 : (c == 2 ? -8 : rnd(-8, 7)))
                        : (rnd(0, 15) == 0 ? rnd(-8, 7) : -8);
    }
}

int main() {
    const char *pname[] = {"random", "all -8", "big chunk, small rest", "big, cancel, random",
                           "mostly -8"};
    const int NP = 5;
    const size_t na = (size_t)TRIALS * A_ROWS * KB, nbb = (size_t)TRIALS * B_ROWS * KB,
                 no = (size_t)TRIALS * 512;
    std::vector<int8_t> a(na), b(nbb);
    std::vector<uint8_t> ea(na), eb(nbb);
    std::vector<int> hi(no);
    std::vector<float> hf(no);
    uint8_t *dA, *dB;
    int *di;
    float *df;
    CK(cudaMalloc(&dA, na));
    CK(cudaMalloc(&dB, nbb));
    CK(cudaMalloc(&di, no * 4));
    CK(cudaMalloc(&df, no * 4));
    int total_bad = 0;
    for (int inst = 0; inst < 2; inst++)
        for (int enc = 0; enc < 2; enc++)
            for (int p = 0; p < NP; p++)
                for (int steps = 1; steps <= 4; steps += 3) {
                    for (int t = 0; t < TRIALS; t++)
                        fill(p, &a[(size_t)t * A_ROWS * KB], &b[(size_t)t * B_ROWS * KB]);
                    auto run = [&](const uint8_t *ha, const uint8_t *hb, int fp8) {
                        CK(cudaMemcpy(dA, ha, na, cudaMemcpyHostToDevice));
                        CK(cudaMemcpy(dB, hb, nbb, cudaMemcpyHostToDevice));
                        if (inst == 0)
                            k_mma<<<TRIALS, 128>>>(dA, dB, steps, di, df, fp8);
                        else
                            k_wgmma<<<TRIALS, 128>>>(dA, dB, steps, di, df, fp8);
                        CK(cudaGetLastError());
                        CK(cudaDeviceSynchronize());
                    };
                    run(reinterpret_cast<const uint8_t *>(a.data()),
                        reinterpret_cast<const uint8_t *>(b.data()), 0);
                    CK(cudaMemcpy(hi.data(), di, no * 4, cudaMemcpyDeviceToHost));
                    for (size_t i = 0; i < na; i++)
                        ea[i] = enc ? enc_sub(a[i]) : enc_int(a[i]);
                    for (size_t i = 0; i < nbb; i++)
                        eb[i] = enc ? enc_sub(b[i]) : enc_int(b[i]);
                    run(ea.data(), eb.data(), 1);
                    CK(cudaMemcpy(hf.data(), df, no * 4, cudaMemcpyDeviceToHost));
                    const double unit = enc ? 1.0 / (1 << 18) : 1.0;
                    size_t bad = 0, first = (size_t)-1;
                    int maxabs = 0;
                    for (size_t i = 0; i < no; i++) {
                        maxabs = abs(hi[i]) > maxabs ? abs(hi[i]) : maxabs;
                        if ((double)hf[i] != hi[i] * unit) {
                            bad++;
                            if (first == (size_t)-1)
                                first = i;
                        }
                    }
                    total_bad += bad > 0;
                    printf("%-6s %-3s %-24s steps=%d  max|sum| %5d  mismatches %zu of %zu",
                           inst ? "wgmma" : "mma", enc ? "sub" : "int", pname[p], steps, maxabs,
                           bad, no);
                    if (bad)
                        printf("  (first: s8 %d, e4m3 %.9g units)", hi[first], hf[first] / unit);
                    printf("\n");
                }
    printf("%s: %d of %d configurations with mismatches\n", total_bad ? "INEXACT" : "EXACT",
           total_bad, 2 * 2 * NP * 2);
    return 0;
}
