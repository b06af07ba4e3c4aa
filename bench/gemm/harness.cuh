/* harness.cuh — the benchmark harness shared by bench_gemm.cu and floor.cu: error checks,
 * random fills, the spin kernel, the per-call median (CUDA events around each call,
 * queued behind the spin kernel so that host launch gaps stay out of the events) and the
 * per-call time inside a CUDA graph (bench_gemm --graph). Benchmark
 * tooling, not engine. */
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));     \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)
#define CKB(x)                                                                                     \
    do {                                                                                           \
        cublasStatus_t s_ = (x);                                                                   \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                         \
            fprintf(stderr, "%s:%d %s: cublas status %d\n", __FILE__, __LINE__, #x, (int)s_);      \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)

__device__ __forceinline__ uint32_t hash32(uint64_t i, uint32_t seed) {
    uint64_t x = i * 0x9E3779B97F4A7C15ull + seed * 0xBF58476D1CE4E5B9ull;
    x ^= x >> 31;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 29;
    return (uint32_t)x;
}
/* n random bytes (grid-stride) */
static __global__ void fill_bytes(uint8_t *p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = (uint8_t)hash32(i, seed);
}

/* Holds the GPU for about `ns` nanoseconds so that the host can queue the timed calls and
 * their events behind it: the events then time back-to-back GPU work, not launch gaps. */
static __global__ void spin(long long ns) {
    long long t0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    for (;;) {
        long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        if (t - t0 > ns)
            break;
    }
}

/* Median time in microseconds of n (<= 64) timed launches, launch(i) for i < n, each between
 * two events on stream st, queued behind the spin kernel; each interval divided by `per`
 * (calls per launch). */
template <typename F>
double median_us(F &&launch, int n, cudaStream_t st, double per) {
    static cudaEvent_t ev[2 * 64];
    static bool init = false;
    if (!init) {
        for (auto &e : ev)
            CK(cudaEventCreate(&e));
        init = true;
    }
    std::vector<float> t(n);
    spin<<<1, 1, 0, st>>>(3000000);
    for (int i = 0; i < n; i++) {
        CK(cudaEventRecord(ev[2 * i], st));
        launch(i);
        CK(cudaEventRecord(ev[2 * i + 1], st));
    }
    CK(cudaEventSynchronize(ev[2 * n - 1]));
    CK(cudaGetLastError());
    for (int i = 0; i < n; i++)
        CK(cudaEventElapsedTime(&t[i], ev[2 * i], ev[2 * i + 1]));
    std::sort(t.begin(), t.end());
    return 1000.0 * (n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2])) / per;
}

/* Median time in microseconds of `iters` (<= 64) timed calls call(set) after `warm` untimed
 * ones, on the legacy default stream; set cycles through [0, nsets) (the caller's rotated
 * input copies). */
template <typename F>
double time_us(F &&call, int nsets, int warm = 5, int iters = 30) {
    for (int i = 0; i < warm; i++)
        call(i % nsets);
    return median_us([&](int i) { call((i + warm) % nsets); }, iters, 0, 1);
}

/* The per-call time (µs) of `call` as an engine replays a decode step: G = 20 calls (set
 * cycling as in time_us) captured on stream st into one CUDA graph, median over 15 replays
 * of replay time / G, after 5 eager warm-up calls. call must launch on st. */
template <typename F>
double time_graph_us(F &&call, int nsets, cudaStream_t st) {
    constexpr int G = 20, R = 15, WARM = 5;
    CK(cudaDeviceSynchronize()); /* inputs and workspace set up on other streams are complete */
    for (int i = 0; i < WARM; i++)
        call(i % nsets);
    CK(cudaStreamSynchronize(st));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < G; i++)
        call((WARM + i) % nsets);
    CK(cudaStreamEndCapture(st, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    CK(cudaGraphLaunch(exec, st)); /* upload and warm */
    CK(cudaStreamSynchronize(st));
    const double us = median_us([&](int) { CK(cudaGraphLaunch(exec, st)); }, R, st, G);
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    return us;
}
