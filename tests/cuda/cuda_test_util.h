/* cuda_test_util.h — shared by tests/cuda's kernel tests: the CUDA_OK check, a
 * seeded xorshift generator (each test defines CUDA_TEST_SEED before including this header),
 * the cmocka adapter COUNTED_TEST and the scalar oracle comet_ref_gemm_w4ax threaded over
 * token rows. */
#ifndef COMET_TESTS_CUDA_TEST_UTIL_H
#define COMET_TESTS_CUDA_TEST_UTIL_H

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "backend/cpu/ref_gemm_w4ax.h"

#ifndef CUDA_TEST_SEED
#error "define CUDA_TEST_SEED before including cuda_test_util.h"
#endif

/* Exit with status 2 (not a test failure: the GPU or driver failed) on a CUDA error. */
#define CUDA_OK(call)                                                                              \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorString(e_), __FILE__,      \
                    __LINE__, #call);                                                              \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)

/* A cmocka test that runs `body`, a part of a test that counts its checks in n_fail (it
 * prints one line per check or case), and fails when the part added failed checks. */
#define COUNTED_TEST(name, body)                                                                   \
    static void name(void **state) {                                                               \
        (void)state;                                                                               \
        const int fail0_ = n_fail;                                                                 \
        body;                                                                                      \
        if (n_fail > fail0_)                                                                       \
            fail_msg("%d checks failed", n_fail - fail0_);                                         \
    }

static uint64_t rng = CUDA_TEST_SEED;
static inline uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

/* Device buffers with GUARD words of GUARD_WORD on each side of a payload of `words`
 * 32-bit words: guarded_raw_alloc returns the raw allocation (payload at raw + GUARD, also
 * GUARD_WORD-filled); guards_intact returns 1 while no guard word has changed. */
#define GUARD 64
#define GUARD_WORD 0x5A5A5A5Au

static inline uint32_t *guarded_raw_alloc(size_t words) {
    size_t all = words + 2 * GUARD;
    uint32_t *raw, *h = malloc(all * 4);
    if (!h) {
        fprintf(stderr, "out of host memory\n");
        exit(2);
    }
    CUDA_OK(cudaMalloc((void **)&raw, all * 4));
    for (size_t i = 0; i < all; i++)
        h[i] = GUARD_WORD;
    CUDA_OK(cudaMemcpy(raw, h, all * 4, cudaMemcpyHostToDevice));
    free(h);
    return raw;
}

static inline int guards_intact(const uint32_t *raw, size_t words) {
    uint32_t h[GUARD];
    int ok = 1;
    CUDA_OK(cudaMemcpy(h, raw, sizeof h, cudaMemcpyDeviceToHost));
    for (int i = 0; i < GUARD; i++)
        ok &= h[i] == GUARD_WORD;
    CUDA_OK(cudaMemcpy(h, raw + GUARD + words, sizeof h, cudaMemcpyDeviceToHost));
    for (int i = 0; i < GUARD; i++)
        ok &= h[i] == GUARD_WORD;
    return ok;
}

/* One slice of token rows [t0, t1) of an oracle call. */
typedef struct {
    int M, N, K, B, n8;
    const uint8_t *qw;
    const uint16_t *sw;
    const int8_t *qa;
    const float *sa;
    float *y;
    int32_t *bs;
    int t0, t1;
    comet_status st;
} ref_job;

static inline void *ref_worker(void *arg) {
    ref_job *j = arg;
    int nb = j->K / j->B;
    j->st =
        j->t1 > j->t0
            ? comet_ref_gemm_w4ax(j->t1 - j->t0, j->N, j->K, j->B, j->n8, j->qw, j->sw,
                                  j->qa + (size_t)j->t0 * j->K, j->sa + (size_t)j->t0 * nb,
                                  j->y + (size_t)j->t0 * j->N, j->bs + (size_t)j->t0 * j->N * nb)
            : COMET_OK;
    return NULL;
}

/* The oracle on 16 threads (rows are independent); y and bs as in comet_ref_gemm_w4ax.
 * Exits with status 2 if the oracle refuses the inputs. */
static inline void ref_threaded(ref_job proto) {
    enum {
        NT = 16
    };
    pthread_t th[NT];
    ref_job jobs[NT];
    for (int i = 0; i < NT; i++) {
        jobs[i] = proto;
        jobs[i].t0 = (int)((long)proto.M * i / NT);
        jobs[i].t1 = (int)((long)proto.M * (i + 1) / NT);
        pthread_create(&th[i], NULL, ref_worker, &jobs[i]);
    }
    for (int i = 0; i < NT; i++) {
        pthread_join(th[i], NULL);
        if (jobs[i].st != COMET_OK) {
            fprintf(stderr,
                    "oracle failed on token rows [%d, %d): status %d (bad shape or an INT4 "
                    "code out of range)\n",
                    jobs[i].t0, jobs[i].t1, (int)jobs[i].st);
            exit(2);
        }
    }
}

#endif
