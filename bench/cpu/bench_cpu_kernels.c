/* bench_cpu_kernels.c — single-thread timings of the CPU integer path's two hot decode ops,
 * in the shapes of the default model (SmolLM2-135M: 30 layers, C 576, F 1536, H 9, Hkv 3,
 * D 64, KV4 in groups of 16 with the Hadamard rotation, W4 blocks of 64):
 *   attention: one decode token's paged KV4 attention (comet_cpu_kv4_attention, one layer)
 *              at a given context, ns per call and cycles per key and KV head;
 *   gemm:      the 120 W4Ax matmuls of one decode step (M = 1; qkv, o, gate_up, down per
 *              layer, each its own weight, 53 MB of codes streamed from memory), ms per step
 *              as the sum of each matmul's minimum.
 * Each figure is the minimum over repetitions (the machine is shared: the minimum is the
 * least disturbed run); cycles come from the TSC. Random codes and activations: timings
 * only, no results are checked (tests/test_cpu_kv4.c and tests/test_w4ax_cpu.c do that).
 *
 *   bench_cpu_kernels [ctx (default 640)] [reps (default 200)]
 *                     [attention|attncold|gemm|gemmhot|gemm2|prefill]
 * (default: attention and gemm; attncold: attention with the KV read from memory; gemmhot:
 * the GEMM on cache-resident weights, its compute alone; gemm2: on 2 threads, as comet bench
 * runs it; prefill: one layer's matmuls at M = 512, x30)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <immintrin.h>
#include <x86intrin.h>

#include "backend/cpu/cpu_kv4.h"
#include "backend/cpu/w4ax_cpu.h"
#include "core/threads.h"
#include "engine/kv_pages.h"

#define HKV 3
#define H 9
#define D 64
#define P 16
#define LAYERS 30

static uint32_t rng = 12345;
static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 17;
    rng ^= rng << 5;
    return rng;
}
static float frnd(void) { return (float)(rnd() & 0xFFFF) / 32768.0f - 1.0f; }
static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

/* cold: a 64 MiB buffer is read between calls, so the KV comes from memory as it does in a
 * decode step (after the weights have passed through the caches) */
static void bench_attention(int ctx, int reps, int cold) {
    comet_kv_cache kv;
    memset(&kv, 0, sizeof kv);
    const int n_pages = (ctx + 1 + P - 1) / P + 1;
    kv.n_layer = 1, kv.n_pages = n_pages, kv.page_size = P, kv.n_head_kv = HKV, kv.head_dim = D;
    kv.kv = (comet_kv_format){COMET_KV_INT4, 16, COMET_KV_ROTATION_HADAMARD};
    comet_kv_pool pool;
    comet_kv_seq seq;
    comet_batch_builder bb;
    if (comet_cpu_kv4_init(&kv) || comet_kv_pool_init(&pool, n_pages, P) ||
        comet_kv_seq_init(&seq, n_pages * P, P) ||
        comet_batch_builder_init(&bb, ctx, 1, n_pages, P)) {
        fprintf(stderr, "attention set-up failed\n");
        exit(1);
    }
    int32_t *ids = calloc((size_t)ctx, sizeof *ids);
    float *k = malloc((size_t)ctx * HKV * D * 4), *v = malloc((size_t)ctx * HKV * D * 4);
    float *q = malloc((size_t)H * D * 4), *o = malloc((size_t)H * D * 4);
    for (size_t i = 0; i < (size_t)ctx * HKV * D; i++)
        k[i] = 3 * frnd(), v[i] = 2 * frnd();
    for (int i = 0; i < H * D; i++)
        q[i] = frnd();
    /* the context: ctx tokens appended in one step, then the decode token */
    comet_kv_seq_reserve(&pool, &seq, ctx);
    comet_batch_builder_add(&bb, &seq, ids, ctx, 1);
    comet_cpu_kv4_append(&kv, 0, &bb.batch, k, v);
    comet_batch_builder_reset(&bb);
    comet_kv_seq_reserve(&pool, &seq, 1);
    comet_batch_builder_add(&bb, &seq, ids, 1, 1);
    comet_cpu_kv4_append(&kv, 0, &bb.batch, k, v);
    double best = 1e9;
    uint64_t best_cyc = UINT64_MAX;
    const size_t flush_n = cold ? (size_t)64 << 20 : 0;
    uint8_t *flush = cold ? calloc(flush_n, 1) : NULL;
    volatile uint8_t flush_sink = 0;
    for (int r = 0; r < reps; r++) {
        for (size_t i = 0; i < flush_n; i += 64)
            flush_sink += flush[i];
        double t0 = now();
        uint64_t c0 = __rdtsc();
        comet_cpu_kv4_attention(NULL, &kv, 0, &bb.batch, q, H, o);
        uint64_t c1 = __rdtsc();
        double t1 = now();
        best = t1 - t0 < best ? t1 - t0 : best;
        best_cyc = c1 - c0 < best_cyc ? c1 - c0 : best_cyc;
    }
    const int n_keys = ctx + 1;
    uint32_t hash = 2166136261u; /* FNV-1a of the output's bytes: equal hashes, equal results */
    for (size_t i = 0; i < (size_t)H * D * sizeof *o; i++)
        hash = (hash ^ ((const uint8_t *)o)[i]) * 16777619u;
    free(flush);
    printf("attention%s ctx %d: %.1f us per layer (x%d layers: %.3f ms), %.0f TSC cycles per key "
           "and KV head; output hash %08x\n",
           cold ? " (KV from memory)" : "", n_keys, best * 1e6, LAYERS, best * 1e3 * LAYERS, (double)best_cyc / n_keys / HKV, hash);
    free(ids), free(k), free(v), free(q), free(o);
    comet_batch_builder_free(&bb);
    comet_kv_seq_free(&seq);
    comet_kv_pool_free(&pool);
    comet_cpu_kv4_free(&kv);
}

/* hot: every layer uses layer 0's weights (1.8 MB, cache-resident): the compute alone */
static void bench_gemm(int reps, comet_threadpool *tp, int hot) {
    const int C = 576, F = 1536, B = 64;
    const int shape[4][2] = {{C + 2 * HKV * D, C}, {C, C}, {2 * F, C}, {C, F}}; /* N, K */
    comet_w4ax_cpu w[LAYERS][4];
    uint8_t *codes[LAYERS][4];
    size_t bytes = 0;
    for (int l = 0; l < LAYERS; l++)
        for (int i = 0; i < 4; i++) {
            const int N = shape[i][0], K = shape[i][1];
            codes[l][i] = malloc((size_t)N * K / 2);
            uint16_t *sw = malloc((size_t)N * (K / B) * 2);
            for (size_t j = 0; j < (size_t)N * K / 2; j++)
                codes[l][i][j] = (uint8_t)rnd();
            for (size_t j = 0; j < (size_t)N * (K / B); j++)
                sw[j] = 0x2000 + (rnd() & 0x3FF);
            if (comet_w4ax_cpu_pack(N, K, B, codes[l][i], sw, &w[l][i])) {
                fprintf(stderr, "pack failed\n");
                exit(1);
            }
            bytes += comet_w4ax_cpu_bytes(&w[l][i]);
            free(sw);
        }
    int8_t qa[2 * 1536];
    float sa[2 * 1536 / 64], y[2 * 1536];
    for (int j = 0; j < 2 * 1536; j++)
        qa[j] = (int8_t)((rnd() % 16) - 8);
    for (int j = 0; j < 2 * 1536 / 64; j++)
        sa[j] = 0.01f + 0.001f * (float)(rnd() % 100);
    const comet_w4ax_isa isas[] = {COMET_W4AX_ISA_AVX2, COMET_W4AX_ISA_AVXVNNI,
                                   COMET_W4AX_ISA_AVX512VNNI};
    for (size_t s = 0; s < sizeof isas / sizeof isas[0]; s++) {
        if (!comet_w4ax_cpu_isa_supported(isas[s]))
            continue;
        /* each matmul's own minimum over the repetitions, summed: a preempted call (the
         * machine is shared) spoils one sample of one matmul, not the step */
        static double call_best[LAYERS][4];
        for (int l = 0; l < LAYERS; l++)
            for (int i = 0; i < 4; i++)
                call_best[l][i] = 1e9;
        for (int r = 0; r < reps; r++)
            for (int l = 0; l < LAYERS; l++)
                for (int i = 0; i < 4; i++) {
                    double a = now();
                    const comet_w4ax_cpu *wp = hot ? &w[0][i] : &w[l][i];
                    float *yp = y;
                    comet_w4ax_cpu_gemm(tp, isas[s], 1, &wp, 1, 0, qa, sa, &yp, NULL);
                    a = now() - a;
                    call_best[l][i] = a < call_best[l][i] ? a : call_best[l][i];
                }
        double best = 0, sum[4] = {0};
        for (int l = 0; l < LAYERS; l++)
            for (int i = 0; i < 4; i++)
                sum[i] += call_best[l][i], best += call_best[l][i];
        printf("gemm %-12s %s%s: %.3f ms per decode step (%.1f MB, %.1f GB/s); qkv %.3f o %.3f "
               "gate_up %.3f down %.3f ms\n",
               comet_w4ax_cpu_isa_name(isas[s]), tp ? "2 threads" : "1 thread ",
               hot ? " (cached weights)" : "", best * 1e3, bytes / 1e6, bytes / best / 1e9,
               sum[0] * 1e3, sum[1] * 1e3, sum[2] * 1e3, sum[3] * 1e3);
    }
    /* the floor: the same codes only read (32-byte loads, OR-ed together; 8-byte ones
     * without AVX2), same order */
    double best = 1e9;
    uint64_t sink = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        for (int l = 0; l < LAYERS; l++)
            for (int i = 0; i < 4; i++) {
                const size_t n = (size_t)shape[i][0] * shape[i][1] / 2;
#ifdef __AVX2__
                __m256i acc = _mm256_setzero_si256();
                for (size_t j = 0; j + 32 <= n; j += 32)
                    acc = _mm256_or_si256(acc, _mm256_loadu_si256((const __m256i *)(codes[l][i] + j)));
                sink += (uint64_t)_mm256_extract_epi64(acc, 0);
#else
                uint64_t acc = 0, word;
                for (size_t j = 0; j + 8 <= n; j += 8) {
                    memcpy(&word, codes[l][i] + j, 8);
                    acc |= word;
                }
                sink += acc;
#endif
            }
        double t = now() - t0;
        best = t < best ? t : best;
    }
    printf("read floor      : %.3f ms per decode step (%.1f GB/s of codes) [%llx]\n", best * 1e3,
           bytes / best / 1e9, (unsigned long long)(sink & 0xF));
    for (int l = 0; l < LAYERS; l++)
        for (int i = 0; i < 4; i++)
            comet_w4ax_cpu_free(&w[l][i]), free(codes[l][i]);
}

/* The 4 matmuls of one layer at M = 512 prompt tokens (prefill; compute-bound: a row
 * group's codes stay in L1 across a tile of tokens), x30 layers, ms, one thread. */
static void bench_prefill(int reps) {
    const int C = 576, F = 1536, B = 64, M = 512;
    const int shape[4][2] = {{C + 2 * HKV * D, C}, {C, C}, {2 * F, C}, {C, F}}; /* N, K */
    int8_t *qa = malloc((size_t)M * F);
    float *sa = malloc((size_t)M * F / B * sizeof *sa), *y = malloc((size_t)M * 2 * F * sizeof *y);
    for (size_t j = 0; j < (size_t)M * F; j++)
        qa[j] = (int8_t)((rnd() % 16) - 8);
    for (size_t j = 0; j < (size_t)M * F / B; j++)
        sa[j] = 0.01f + 0.001f * (float)(rnd() % 100);
    double total = 0, part[4];
    for (int i = 0; i < 4; i++) {
        const int N = shape[i][0], K = shape[i][1];
        uint8_t *codes = malloc((size_t)N * K / 2);
        uint16_t *sw = malloc((size_t)N * (K / B) * 2);
        for (size_t j = 0; j < (size_t)N * K / 2; j++)
            codes[j] = (uint8_t)rnd();
        for (size_t j = 0; j < (size_t)N * (K / B); j++)
            sw[j] = 0x2000 + (rnd() & 0x3FF);
        comet_w4ax_cpu w;
        if (comet_w4ax_cpu_pack(N, K, B, codes, sw, &w)) {
            fprintf(stderr, "pack failed\n");
            exit(1);
        }
        const comet_w4ax_cpu *wp = &w;
        part[i] = 1e9;
        for (int r = 0; r < reps; r++) {
            double a = now();
            comet_w4ax_cpu_gemm(NULL, COMET_W4AX_ISA_AUTO, 1, &wp, M, 0, qa, sa, &y, NULL);
            a = now() - a;
            part[i] = a < part[i] ? a : part[i];
        }
        total += part[i] * LAYERS;
        comet_w4ax_cpu_free(&w);
        free(codes), free(sw);
    }
    printf("prefill gemm (%s, M %d, 1 thread): %.1f ms for 30 layers; qkv %.2f o %.2f gate_up %.2f "
           "down %.2f ms per layer\n",
           comet_w4ax_cpu_isa_name(comet_w4ax_cpu_isa_best()), M, total * 1e3, part[0] * 1e3,
           part[1] * 1e3, part[2] * 1e3, part[3] * 1e3);
    free(qa), free(sa), free(y);
}

int main(int argc, char **argv) {
    const int ctx = argc > 1 ? atoi(argv[1]) : 640, reps = argc > 2 ? atoi(argv[2]) : 200;
    const char *only = argc > 3 ? argv[3] : "";
    const int greps = reps / 10 > 3 ? reps / 10 : 3;
    if (!*only || !strcmp(only, "attention"))
        bench_attention(ctx, reps, 0);
    if (!strcmp(only, "attncold"))
        bench_attention(ctx, reps, 1);
    if (!*only || !strcmp(only, "gemm"))
        bench_gemm(greps, NULL, 0);
    if (!strcmp(only, "prefill"))
        bench_prefill(reps / 20 > 3 ? reps / 20 : 3);
    if (!strcmp(only, "gemmhot"))
        bench_gemm(greps, NULL, 1);
    if (!strcmp(only, "gemm2")) { /* the decode GEMM on 2 threads, as comet bench runs it */
        comet_threadpool *tp = comet_threadpool_init(2);
        bench_gemm(greps, tp, 0);
        comet_threadpool_free(tp);
    }
    return 0;
}
