/* cpu_test_util.h — small helpers shared by the CPU tests: a deterministic RNG, a tiny
 * random LLaMA model built in memory, guarded buffers and a normalized error.
 * Header-only (static functions) so every test stays one executable. */
#ifndef COMET_CPU_TEST_UTIL_H
#define COMET_CPU_TEST_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "comet/model.h"

static uint64_t tu_rng_state = 0x9e3779b97f4a7c15ull;

static inline void tu_seed(uint64_t s) { tu_rng_state = s ? s : 1; }

static inline uint64_t tu_next(void) {
    uint64_t x = tu_rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return tu_rng_state = x;
}

/* uniform in [-1, 1) */
static inline float tu_uniform(void) {
    return (float)((tu_next() >> 40) * (2.0 / 16777216.0) - 1.0);
}

static inline int tu_int(int n) { return (int)(tu_next() % (uint64_t)n); }

static inline void tu_fill(float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++)
        x[i] = tu_uniform() * scale;
}

/* Guarded buffer: n floats with TU_GUARD canary floats on each side. */
#define TU_GUARD 16
static const uint32_t tu_canary_bits = 0x7fc0beefu; /* a NaN no op produces */

static inline float *tu_guarded_alloc(size_t n) {
    float *raw = malloc((n + 2 * TU_GUARD) * sizeof(float));
    for (size_t i = 0; i < n + 2 * TU_GUARD; i++)
        memcpy(raw + i, &tu_canary_bits, 4);
    return raw + TU_GUARD;
}

/* 1 when every canary is intact. */
static inline int tu_guard_ok(const float *p, size_t n) {
    const float *raw = p - TU_GUARD;
    for (size_t i = 0; i < TU_GUARD; i++)
        if (memcmp(raw + i, &tu_canary_bits, 4) || memcmp(p + n + i, &tu_canary_bits, 4))
            return 0;
    return 1;
}

static inline void tu_guarded_free(float *p) {
    if (p)
        free(p - TU_GUARD);
}

/* ||a - b|| / ||b|| (0 when both are zero) */
static inline double tu_nerr(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    if (den == 0)
        return sqrt(num);
    return sqrt(num / den);
}

/* max |a - b| / max |b| */
static inline double tu_max_rel(const float *a, const float *b, size_t n) {
    double md = 0, mb = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > md || d != d)
            md = d;
        if (fabs(b[i]) > mb)
            mb = fabs(b[i]);
    }
    return mb > 0 ? md / mb : md;
}

static inline float *tu_rand_buf(size_t n, float scale) {
    float *p = malloc(n * sizeof(float));
    tu_fill(p, n, scale);
    return p;
}

static inline comet_linear tu_linear(int n_out, int n_in) {
    comet_linear l = {.n_out = n_out,
                      .n_in = n_in,
                      .fmt = COMET_WFMT_F32,
                      .w = tu_rand_buf((size_t)n_out * n_in, 1.0f / sqrtf((float)n_in))};
    return l;
}

/* The shape of a random LLaMA (tu_shaped_model). */
typedef struct tu_shape {
    int n_layer, C, F, H, Hkv, D, V;
} tu_shape;

/* A random LLaMA of shape `sh` (context 256, no BOS, RoPE theta 1e4), weights from `seed`.
 * Free with tu_model_free. */
static inline comet_model *tu_shaped_model(uint64_t seed, tu_shape sh) {
    tu_seed(seed);
    comet_model *m = calloc(1, sizeof *m);
    comet_model_config *c = &m->cfg;
    c->arch = COMET_ARCH_LLAMA;
    c->n_layer = sh.n_layer;
    c->n_embd = sh.C;
    c->n_ff = sh.F;
    c->n_head = sh.H;
    c->n_head_kv = sh.Hkv;
    c->head_dim = sh.D;
    c->n_vocab = sh.V;
    c->n_ctx = 256;
    c->rms_eps = 1e-5f;
    c->rope_theta = 10000.0f;
    c->rope_scaling = COMET_ROPE_SCALING_NONE;
    c->bos_id = -1;
    int C = c->n_embd, F = c->n_ff, HD = c->n_head * c->head_dim, KD = c->n_head_kv * c->head_dim;
    m->tok_embd = tu_rand_buf((size_t)c->n_vocab * C, 1.0f);
    m->output_norm = tu_rand_buf(C, 0.5f);
    for (int i = 0; i < C; i++)
        m->output_norm[i] += 1.0f;
    m->lm_head = tu_rand_buf((size_t)c->n_vocab * C, 0.3f);
    m->layers = calloc((size_t)c->n_layer, sizeof *m->layers);
    for (int l = 0; l < c->n_layer; l++) {
        comet_layer_weights *w = &m->layers[l];
        w->attn_norm = tu_rand_buf(C, 0.2f);
        w->ffn_norm = tu_rand_buf(C, 0.2f);
        for (int i = 0; i < C; i++) {
            w->attn_norm[i] += 1.0f;
            w->ffn_norm[i] += 1.0f;
        }
        w->wq = tu_linear(HD, C);
        w->wk = tu_linear(KD, C);
        w->wv = tu_linear(KD, C);
        w->wo = tu_linear(C, HD);
        w->w_gate = tu_linear(F, C);
        w->w_up = tu_linear(F, C);
        w->w_down = tu_linear(C, F);
    }
    return m;
}

/* A tiny random LLaMA: 2 layers, C = 44, F = 72, H = 6, Hkv = 2 (GQA 3), D = 8, V = 97.
 * Free with tu_model_free. */
static inline comet_model *tu_tiny_model(uint64_t seed) {
    return tu_shaped_model(
        seed, (tu_shape){.n_layer = 2, .C = 44, .F = 72, .H = 6, .Hkv = 2, .D = 8, .V = 97});
}

static inline void tu_model_free(comet_model *m) {
    for (int l = 0; l < m->cfg.n_layer; l++) {
        comet_layer_weights *w = &m->layers[l];
        free(w->attn_norm);
        free(w->ffn_norm);
        free(w->wq.w);
        free(w->wk.w);
        free(w->wv.w);
        free(w->wo.w);
        free(w->w_gate.w);
        free(w->w_up.w);
        free(w->w_down.w);
    }
    free(m->layers);
    free(m->tok_embd);
    free(m->output_norm);
    free(m->lm_head);
    free(m);
}

#endif
