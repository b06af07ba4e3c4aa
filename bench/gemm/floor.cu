/* floor.cu — the decode floor: what any W4 GEMM must pay at M <= 16 in bench_gemm's timing
 * harness, next to cuBLAS FP16 in the same process and run.
 *
 * A W4Ax GEMM at small M has to read its packed weights and their scales once (N*K/2 +
 * N*K/B*2 bytes); everything else is small. This program times, per LLaMA shape:
 *  - empty:  a kernel of 132 x 256 threads that does nothing (launch and event overhead),
 *  - ld:     the best of several plain-load kernels that read exactly those bytes (16-byte
 *            ld.global.nc, U loads in flight per thread, several grid sizes),
 *  - bulk:   a persistent kernel, one CTA per SM, one thread streaming those bytes with
 *            cp.async.bulk into a ring of shared-memory slots on mbarriers,
 *  - fp16:   cuBLAS FP16 (cublasGemmEx, fp32 accumulate) at M = 1 and 16, as in bench_gemm,
 * with bench_gemm's method: CUDA events around each call, 5 warm-up calls, median of 30
 * queued behind a spin kernel, inputs rotated through >= 256 MB. The ratio fp16 / floor is
 * the most any W4 kernel can reach against cuBLAS FP16 at that shape here.
 *
 * `floor [B] --graph` times everything inside CUDA graphs instead (harness.cuh time_graph_us).
 *
 * Build: nvcc -O3 -Isrc -gencode=arch=compute_90a,code=sm_90a -o floor bench/gemm/floor.cu -lcublas
 */
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "backend/cuda/ptx.cuh"

using comet_ptx::bulk_load;
using comet_ptx::ld_stream;
using comet_ptx::mbar_arrive_expect_tx;
using comet_ptx::mbar_init;
using comet_ptx::mbar_wait;
#include "harness.cuh"

__global__ void empty_kernel(unsigned *sink) { (void)sink; }

/* Reads n16 16-byte vectors, each CTA a contiguous range, U loads in flight per thread; the
 * XOR of everything is written only if it equals a value it will not take, so the loads stay. */
template <int U>
__global__ void ld_kernel(const uint4 *p, size_t n16, unsigned *sink) {
    const size_t per = (n16 + gridDim.x - 1) / gridDim.x, b0 = blockIdx.x * per;
    const size_t b1 = min(n16, b0 + per);
    uint32_t x = 0;
    for (size_t i = b0 + threadIdx.x; i < b1; i += (size_t)U * blockDim.x) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; u++)
            if (i + (size_t)u * blockDim.x < b1)
                v[u] = ld_stream(p + i + (size_t)u * blockDim.x);
            else
                v[u] = make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < U; u++)
            x ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    if (x == 0x9e3779b9u)
        sink[blockIdx.x] = x;
}

/* One CTA per SM; thread 0 streams CTA b's contiguous byte range [b*per, (b+1)*per) in
 * CH-byte bulk copies through D slots; each landed slot is recycled at once (no consumer:
 * this is the arrival floor of the copy engine path). */
__global__ void bulk_kernel(const uint8_t *p, size_t bytes, int CH, int D, unsigned *sink) {
#if __CUDA_ARCH__ >= 900 /* bulk copies and tx-count mbarriers: sm_90 (main() skips it elsewhere) */
    extern __shared__ __align__(128) uint8_t smem[];
    __shared__ __align__(8) uint64_t bar[16];
    if (threadIdx.x != 0)
        return;
    const size_t per = ((bytes + gridDim.x - 1) / gridDim.x + 15) / 16 * 16, b0 = blockIdx.x * per;
    const size_t b1 = min(bytes, b0 + per);
    if (b0 >= b1)
        return;
    const int nch = (int)((b1 - b0 + CH - 1) / CH);
    for (int d = 0; d < D; d++)
        mbar_init(&bar[d], 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    auto issue = [&](int c) {
        const int d = c % D;
        const size_t off = b0 + (size_t)c * CH;
        const unsigned n = (unsigned)min((size_t)CH, b1 - off);
        mbar_arrive_expect_tx(&bar[d], n);
        bulk_load(smem + (size_t)d * CH, p + off, n, &bar[d]);
    };
    for (int c = 0; c < D && c < nch; c++)
        issue(c);
    uint32_t x = 0;
    for (int c = 0; c < nch; c++) {
        const int d = c % D;
        mbar_wait(&bar[d], (unsigned)(c / D) & 1u);
        x ^= *reinterpret_cast<const uint32_t *>(smem + (size_t)d * CH);
        if (c + D < nch)
            issue(c + D);
    }
    if (x == 0x9e3779b9u)
        sink[blockIdx.x] = x;
#endif
}

int main(int argc, char **argv) {
    if (argc == 5 &&
        !strcmp(argv[1], "--ld")) { /* --ld BYTES CTAS THREADS: a few U = 4 calls, for ncu */
        const size_t bytes = strtoull(argv[2], nullptr, 10);
        uint8_t *p;
        unsigned *sk;
        CK(cudaMalloc(&p, bytes));
        CK(cudaMalloc(&sk, 65536 * sizeof(unsigned)));
        fill_bytes<<<1024, 256>>>(p, bytes, 1u);
        for (int i = 0; i < 5; i++)
            ld_kernel<4><<<atoi(argv[3]), atoi(argv[4])>>>(reinterpret_cast<const uint4 *>(p),
                                                           bytes / 16, sk);
        CK(cudaDeviceSynchronize());
        return 0;
    }
    /* floor [B] [--graph]: --graph times every kernel and cuBLAS inside CUDA graphs of 20
     * calls (harness.cuh time_graph_us), as bench_gemm --graph does */
    const bool graph = argc > 1 && !strcmp(argv[argc - 1], "--graph");
    const int B = argc > 1 + graph ? atoi(argv[1]) : 128;
    cudaStream_t st = 0;
    if (graph)
        CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    auto timed = [&](auto &&call, int nsets) {
        return graph ? time_graph_us(call, nsets, st) : time_us(call, nsets);
    };
    struct shape {
        const char *model, *name;
        int N, K;
    } shapes[] = {
        {"LLaMA-3-8B", "qkv", 6144, 4096},       {"LLaMA-3-8B", "o", 4096, 4096},
        {"LLaMA-3-8B", "gate_up", 28672, 4096},  {"LLaMA-3-8B", "down", 4096, 14336},
        {"LLaMA-3-70B", "qkv", 10240, 8192},     {"LLaMA-3-70B", "o", 8192, 8192},
        {"LLaMA-3-70B", "gate_up", 57344, 8192}, {"LLaMA-3-70B", "down", 8192, 28672},
    };
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    const int sms = prop.multiProcessorCount;
    const size_t pool = (size_t)256 << 20, total = (size_t)2 << 30; /* 2 GB: two fp16 70B gate_up */
    uint8_t *buf;
    CK(cudaMalloc(&buf, total));
    fill_bytes<<<1024, 256>>>(buf, total, 12345u);
    unsigned *sink;
    CK(cudaMalloc(&sink, 4096 * sizeof(unsigned)));
    CK(cudaFuncSetAttribute(bulk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
    cublasHandle_t blas;
    CKB(cublasCreate(&blas));
    CKB(cublasSetStream(blas, st));
    __half *x16, *c16;
    CK(cudaMalloc(&x16, 16 * 65536 * sizeof(__half)));
    CK(cudaMalloc(&c16, 16 * 65536 * sizeof(__half)));
    CK(cudaMemset(x16, 0x3c, 16 * 65536 * sizeof(__half)));

    printf("# decode floor, %s (%d SMs), B = %d: weights + scales read once, us (%s)\n\n",
           prop.name, sms, B,
           graph ? "per call inside CUDA graphs of 20 calls, median of 15 replays"
                 : "median of 30");
    printf("| shape | N | K | MB | empty | ld (best config) | bulk (best config) | floor GB/s | "
           "fp16 M=1 | fp16 "
           "M=16 | fp16(1)/floor | fp16(16)/floor |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    double gm1 = 0, gm16 = 0;
    int ns = 0;
    for (const shape &s : shapes) {
        const size_t bytes = (size_t)s.N * s.K / 2 + (size_t)s.N * (s.K / B) * 2;
        const size_t stride = (bytes + 4095) / 4096 * 4096;
        const int nsets = (int)std::max<size_t>(1, std::min<size_t>(pool / stride, 64));
        const double t_empty = timed([&](int) { empty_kernel<<<sms, 256, 0, st>>>(sink); }, 1);
        double t_ld = 1e30, t_bulk = 1e30;
        char ld_cfg[64] = "", bulk_cfg[64] = "";
        const int ctas[] = {1, 2, 4, 8};
        const int thr[] = {256, 512, 1024};
        for (int c : ctas)
            for (int th : thr)
                for (int u : {2, 4, 8}) {
                    if (c * th > 2048)
                        continue;
                    auto run = [&](int set) {
                        const uint4 *p =
                            reinterpret_cast<const uint4 *>(buf + (size_t)set * stride);
                        if (u == 2)
                            ld_kernel<2><<<c * sms, th, 0, st>>>(p, bytes / 16, sink);
                        else if (u == 4)
                            ld_kernel<4><<<c * sms, th, 0, st>>>(p, bytes / 16, sink);
                        else
                            ld_kernel<8><<<c * sms, th, 0, st>>>(p, bytes / 16, sink);
                    };
                    double t = timed(run, nsets);
                    if (t < t_ld)
                        t_ld = t, snprintf(ld_cfg, sizeof ld_cfg, "%dx%d U=%d", c * sms, th, u);
                }
        for (int ch : {4096, 8192, 16384, 32768})
            for (int d : {2, 4, 6, 8, 12, 16}) {
                if ((size_t)ch * d > 200 * 1024 || prop.major < 9)
                    continue;
                auto run = [&](int set) {
                    bulk_kernel<<<sms, 32, (size_t)ch * d, st>>>(buf + (size_t)set * stride, bytes,
                                                                 ch, d, sink);
                };
                double t = timed(run, nsets);
                if (t < t_bulk)
                    t_bulk = t, snprintf(bulk_cfg, sizeof bulk_cfg, "%d KB x %d", ch / 1024, d);
            }
        /* cuBLAS FP16 with the same rotation: the fp16 weights are 4x the W4 bytes */
        const size_t wbytes = (size_t)s.N * s.K * 2;
        const int nw = (int)std::max<size_t>(1, std::min<size_t>(total / wbytes, 64));
        double t16[2];
        for (int mi = 0; mi < 2; mi++) {
            const int M = mi ? 16 : 1;
            float one = 1.0f, zero = 0.0f;
            t16[mi] = timed(
                [&](int set) {
                    CKB(cublasGemmEx(
                        blas, CUBLAS_OP_T, CUBLAS_OP_N, s.N, M, s.K, &one,
                        reinterpret_cast<const __half *>(buf + (size_t)(set % nw) * wbytes),
                        CUDA_R_16F, s.K, x16, CUDA_R_16F, s.K, &zero, c16, CUDA_R_16F, s.N,
                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
                },
                nw);
        }
        const double fl = std::min(t_ld, t_bulk); /* t_bulk stays 1e30 before sm_90 */
        char bulk[96] = "n/a (needs sm_90)";
        if (t_bulk < 1e29)
            snprintf(bulk, sizeof bulk, "%.2f (%s)", t_bulk, bulk_cfg);
        printf("| %s %s | %d | %d | %.1f | %.2f | %.2f (%s) | %s | %.0f | %.2f | %.2f | %.2f | "
               "%.2f |\n",
               s.model, s.name, s.N, s.K, bytes / 1e6, t_empty, t_ld, ld_cfg, bulk,
               bytes / fl / 1e3, t16[0], t16[1], t16[0] / fl, t16[1] / fl);
        gm1 += log(t16[0] / fl), gm16 += log(t16[1] / fl), ns++;
    }
    printf("\ngeomean of fp16 / floor over the %d shapes: M = 1: %.2f, M = 16: %.2f\n", ns,
           exp(gm1 / ns), exp(gm16 / ns));
    return 0;
}
