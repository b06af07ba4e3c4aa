/* attention_test_util.h — what the CUDA attention tests share (test_attention_cuda.c,
 * test_attention_forms_cuda.c, test_attention_prefill_cuda.c): the backends under test, the
 * head shapes, ragged step schedules of chunked prefill and decode, the batch of one step,
 * inputs that depend on (sequence, position, head, channel) only, the CUDA cache mirrored
 * into the CPU's, one step on a backend with guard and NaN checks, and the whole CPU-vs-CUDA
 * run of a schedule (attention_steps_case). Static functions over static globals: each test
 * program holds its own copy, and its main() sets g_cuda, g_cpu (NULL where nothing runs on
 * the CPU), g_full and g_quick. */
#ifndef COMET_TESTS_CUDA_ATTENTION_TEST_UTIL_H
#define COMET_TESTS_CUDA_ATTENTION_TEST_UTIL_H

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/backend.h"
#include "backend/batch.h"
#include "backend/cuda/cuda_kv.h"
#include "comet/model.h"
#include "engine/kv_pages.h"
#include "numerics/quant.h"

#include "cuda_skip.h"
#include "step_test_util.h"

static comet_backend *g_cuda, *g_cpu;
static int g_full; /* COMET_CUDA_TEST_FULL=1 */
/* COMET_CUDA_TEST_QUICK=1: the sanitizer set (racecheck runs a kernel about 100x slower):
 * every head dim, KV format and GQA tile once, one rotation per KV format, instead of every
 * combination */
static int g_quick;

static inline int quick_rot(int bits_index, int rot) { return !g_quick || rot == bits_index % 2; }

enum {
    PAGE = 16
};

typedef struct att_cfg {
    const char *name;
    int D, H, Hkv, G; /* G 0: one group per head */
    comet_rope_scaling scaling;
    float theta;
} att_cfg;

static inline comet_rope_params rope_of(const att_cfg *c) {
    comet_rope_params rp = {.head_dim = c->D,
                            .theta = c->theta,
                            .scaling = c->scaling,
                            .factor = 1.0f,
                            .low_freq_factor = 1.0f,
                            .high_freq_factor = 4.0f,
                            .orig_ctx = 8192};
    if (c->scaling == COMET_ROPE_SCALING_LLAMA3)
        rp.factor = 8.0f;
    return rp;
}

enum {
    ATT_LAYERS = 2,
    ATT_LAYER = 1,
    MAX_SEQS = 256, /* the wide decode batch of test_attention_cuda.c */
    MAX_STEPS = 512
};

typedef struct chunk {
    int seq, start, n;
} chunk;

typedef struct step_plan {
    int n;
    int attend; /* 0: rope_kv_append only (a decode case's prefill fills the cache) */
    chunk c[MAX_SEQS];
} step_plan;

/* a[0..n) in a random order (Fisher-Yates on the test's stream) */
static inline void shuffle(int *a, int n) {
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(st_next() % (uint64_t)(i + 1)), t = a[i];
        a[i] = a[j], a[j] = t;
    }
}

/* Steps that bring sequences s to len[s] tokens: each step takes from each unfinished
 * sequence (in a shuffled order; one may sit a step out) a prefill chunk of 1..max_chunk
 * tokens, or a single decode token for its last two positions. */
static inline int make_schedule(const int *len, int n_seq, int max_chunk, step_plan *steps) {
    int pos[MAX_SEQS] = {0}, n_steps = 0;
    for (;;) {
        int active[MAX_SEQS], n_active = 0;
        for (int s = 0; s < n_seq; s++)
            if (pos[s] < len[s])
                active[n_active++] = s;
        if (!n_active)
            break;
        assert_true(n_steps < MAX_STEPS);
        shuffle(active, n_active);
        step_plan *sp = &steps[n_steps++];
        sp->n = 0;
        sp->attend = 1;
        for (int i = 0; i < n_active; i++) {
            int s = active[i];
            if (n_active > 1 && i > 0 && st_next() % 5 == 0)
                continue; /* sits this step out */
            int rem = len[s] - pos[s];
            int n =
                rem <= 2
                    ? 1
                    : 1 + (int)(st_next() % (uint64_t)(rem - 2 < max_chunk ? rem - 2 : max_chunk));
            sp->c[sp->n++] = (chunk){s, pos[s], n};
            pos[s] += n;
        }
    }
    return n_steps;
}

/* Steps that fill sequence s's cache to len[s] - n_dec tokens in prefill chunks of up to
 * max_chunk (shuffled sequence order, attention not run), then n_dec decode-only steps:
 * step d takes one token of every sequence at position len[s] - n_dec + d (when that is
 * >= 0), so the last step attends over exactly len[s] keys of each sequence. */
static inline int make_decode_schedule(const int *len, int n_seq, int max_chunk, int n_dec,
                                       step_plan *steps) {
    int pos[MAX_SEQS] = {0}, n_steps = 0;
    for (;;) {
        int active[MAX_SEQS], n_active = 0;
        for (int s = 0; s < n_seq; s++)
            if (pos[s] < len[s] - n_dec)
                active[n_active++] = s;
        if (!n_active)
            break;
        assert_true(n_steps < MAX_STEPS);
        shuffle(active, n_active);
        step_plan *sp = &steps[n_steps++];
        sp->n = 0;
        sp->attend = 0;
        for (int i = 0; i < n_active; i++) {
            int s = active[i], rem = len[s] - n_dec - pos[s];
            int n = 1 + (int)(st_next() % (uint64_t)(rem < max_chunk ? rem : max_chunk));
            sp->c[sp->n++] = (chunk){s, pos[s], n};
            pos[s] += n;
        }
    }
    for (int d = 0; d < n_dec; d++) {
        assert_true(n_steps < MAX_STEPS);
        step_plan *sp = &steps[n_steps];
        sp->n = 0;
        sp->attend = 1;
        for (int s = 0; s < n_seq; s++)
            if (len[s] - n_dec + d >= 0)
                sp->c[sp->n++] = (chunk){s, len[s] - n_dec + d, 1};
        n_steps += sp->n > 0;
    }
    return n_steps;
}

/* The batch of one step; `only` >= 0 keeps that sequence's chunk alone (-1: all). pages[s]
 * lists sequence s's pages in position order; token ids are 0, no logits. Returns 0 (rb
 * untouched) when the step has no tokens. */
static inline int rbatch_build(st_batch *rb, const step_plan *sp, int32_t *const *pages, int only) {
    int start[MAX_SEQS], n[MAX_SEQS], seq[MAX_SEQS], S = 0, T = 0;
    int32_t *pg[MAX_SEQS];
    for (int i = 0; i < sp->n; i++)
        if (only < 0 || sp->c[i].seq == only) {
            start[S] = sp->c[i].start, n[S] = sp->c[i].n, seq[S] = sp->c[i].seq;
            pg[S++] = pages[sp->c[i].seq];
            T += sp->c[i].n;
        }
    if (!T)
        return 0;
    *rb = st_batch_make(PAGE, S, start, n, pg, seq, 0, NULL, 0);
    rb->b.logit_rows = NULL; /* no logits: as the engine's steps without them */
    return T;
}

/* q [T, H, D], k, v [T, Hkv, D] of the batch's tokens: each value a function of (seed,
 * sequence, position, head, channel) only, so a token's inputs do not depend on the batch
 * it is in. k has a per-channel bias (the outlier channels KV quantization meets). */
static inline uint64_t key5(uint64_t a, uint64_t b, uint64_t c, uint64_t d, uint64_t e) {
    return st_mix(st_mix(st_mix(st_mix(a) + b) + c) + d) + e;
}

static inline void gen_qkv(const att_cfg *cfg, const st_batch *rb, uint64_t seed, float *q, float *k,
                           float *v) {
    const int D = cfg->D, H = cfg->H, Hkv = cfg->Hkv;
    for (int t = 0; t < rb->b.n_tokens; t++) {
        uint64_t s = (uint64_t)rb->tok_seq[t], pos = (uint64_t)rb->positions[t];
        for (int h = 0; h < H; h++)
            for (int d = 0; d < D; d++)
                q[((size_t)t * H + h) * D + d] =
                    2.0f * st_ukey(key5(seed, s, pos, 0 * 1024 + h, (uint64_t)d));
        for (int h = 0; h < Hkv; h++)
            for (int d = 0; d < D; d++) {
                float bias = 1.5f * st_ukey(key5(seed, 999, 999, 3 * 1024 + h, (uint64_t)d));
                k[((size_t)t * Hkv + h) * D + d] =
                    st_ukey(key5(seed, s, pos, 1 * 1024 + h, (uint64_t)d)) + bias;
                v[((size_t)t * Hkv + h) * D + d] =
                    st_ukey(key5(seed, s, pos, 2 * 1024 + h, (uint64_t)d));
            }
    }
}

typedef struct step_out {
    float *q, *k, *out; /* host copies after the step: roped q, roped k, attention output */
} step_out;

/* Overwrites layer ATT_LAYER of the CPU cache kvc with the values of the CUDA cache kvg
 * (kv_bits `bits`), read from the device storage in the layout of cuda_kv.h and dequantized
 * on the host: the CPU attention then reads the very K and V the CUDA kernel reads, so the
 * comparison measures the attention alone (a RoPE ulp that moves a code to the next level
 * changes the CPU's own cache by a whole step). */
static inline void mirror_cuda_cache(comet_kv_cache *kvc, const comet_kv_cache *kvg,
                                     const att_cfg *cfg, int bits) {
    const int D = cfg->D, Hkv = cfg->Hkv, P = PAGE, n_pages = kvc->n_pages;
    const comet_cuda_kv_layout L =
        comet_cuda_kv_layout_make(ATT_LAYERS, n_pages, P, Hkv, D, bits, cfg->G > 0 ? cfg->G : D);
    uint8_t *store = st_malloc(L.total_bytes);
    OP_OK(g_cuda, g_cuda->ops->download(g_cuda, store, kvg->storage, L.total_bytes),
          "download (KV)");
    for (int page = 0; page < n_pages; page++)
        for (int kvsel = 0; kvsel < 2; kvsel++)
            for (int h = 0; h < Hkv; h++) {
                const size_t tile_id = (((size_t)ATT_LAYER * n_pages + page) * 2 + kvsel) * Hkv + h;
                const uint8_t *tile = store + tile_id * L.head_tile_bytes;
                for (int j = 0; j < P; j++) {
                    const uint8_t *codes = tile + (size_t)j * L.code_row_bytes;
                    float *dst = (kvsel ? kvc->v : kvc->k) +
                                 ((((size_t)ATT_LAYER * n_pages + page) * P + j) * Hkv + h) * D;
                    for (int c = 0; c < D; c++) {
                        if (L.bits == 16) {
                            uint16_t x;
                            memcpy(&x, codes + 2 * c, 2);
                            dst[c] = (float)comet_quant_f16_value(x);
                            continue;
                        }
                        uint16_t sh, zh;
                        const uint8_t *sz =
                            tile + L.sz_offset + (size_t)j * L.sz_row_bytes + 4 * (size_t)(c / L.G);
                        memcpy(&sh, sz, 2);
                        memcpy(&zh, sz + 2, 2);
                        const int code =
                            bits == 8 ? codes[c] : (codes[c / 2] >> (c % 2 ? 4 : 0)) & 15;
                        dst[c] = (float)code * (float)comet_quant_f16_value(sh) +
                                 (float)comet_quant_f16_value(zh);
                    }
                }
            }
    free(store);
}

/* One step on backend be: upload q, k, v, step_begin, rope_kv_append, paged_attention
 * (when `attend`; out is NULL otherwise), download. With `mirror` (be the CPU) the cache
 * takes the CUDA cache's values (mirror_cuda_cache) between the append and the attention.
 * Checks guards and that every output element was written. */
static inline step_out run_step(comet_backend *be, comet_kv_cache *kv, const att_cfg *cfg,
                                const comet_rope_params *rp, const st_batch *rb, const float *q,
                                const float *k, const float *v, const char *what, int attend,
                                const comet_kv_cache *mirror, int bits) {
    const int T = rb->b.n_tokens;
    const size_t nq = (size_t)T * cfg->H * cfg->D, nk = (size_t)T * cfg->Hkv * cfg->D;
    sbuf qb = sb_from(be, q, nq * 4), kb = sb_from(be, k, nk * 4), vb = sb_from(be, v, nk * 4);
    sbuf ob = sb_alloc(be, nq * 4);
    comet_step st;
    OP_OK(be, be->ops->step_begin(be, &rb->b, &st), "step_begin");
    OP_OK(be,
          be->ops->rope_kv_append(be, kv, ATT_LAYER, &st, rp, sb_f(&qb), cfg->H, sb_f(&kb),
                                  sb_f(&vb)),
          what);
    if (attend && mirror)
        mirror_cuda_cache(kv, mirror, cfg, bits);
    if (attend)
        OP_OK(be, be->ops->paged_attention(be, kv, ATT_LAYER, &st, sb_f(&qb), cfg->H, sb_f(&ob)),
              what);
    OP_OK(be, be->ops->sync(be), "sync");
    step_out r = {sb_fetch(&qb, nq * 4), sb_fetch(&kb, nk * 4),
                  attend ? sb_fetch(&ob, nq * 4) : NULL};
    long nan_at = attend ? st_first_nan(r.out, nq) : -1;
    if (nan_at >= 0)
        fail_msg("%s (%s backend): attention output element %ld of %zu is NaN (unwritten?)", what,
                 be->ops->name, nan_at, nq);
    SB_CHECK_GUARDS(&qb, "rope_kv_append (q)");
    SB_CHECK_GUARDS(&kb, "rope_kv_append (k)");
    SB_CHECK_GUARDS(&vb, "rope_kv_append (v)");
    SB_CHECK_GUARDS(&ob, "paged_attention");
    sb_free(&qb), sb_free(&kb), sb_free(&vb), sb_free(&ob);
    return r;
}

static inline void step_out_free(step_out *o) { free(o->q), free(o->k), free(o->out); }

static inline void kv_make(comet_backend *be, comet_kv_cache *kv, const att_cfg *cfg, int n_pages,
                           int bits, int rot) {
    const comet_kv_format fmt = {
        .type = comet_kv_type_from_bits(bits), .group = cfg->G, .rotation = rot};
    if (comet_kv_cache_init_on(be, kv, ATT_LAYERS, n_pages, PAGE, cfg->Hkv, cfg->D, fmt) !=
        COMET_OK)
        fail_msg("%s backend: KV pool (%s, kv_bits %d, rotation %d): %s", be->ops->name, cfg->name,
                 bits, rot, comet_last_error());
}

/* The whole ragged run for one configuration: CPU and CUDA step by step, then each
 * sequence alone on CUDA against its outputs inside the batch. given NULL: n_decode 0,
 * make_schedule's steps, attention compared at every one; n_decode > 0,
 * make_decode_schedule's, attention compared at its n_decode decode-only steps within 2e-5,
 * the CPU reading the CUDA cache's values. given: its n_given steps (sequences 0..n_seq-1
 * growing to len[s]), attention compared at every step that attends, over the CUDA cache's
 * values when `mirror`. Steps that are not all decode are held to 1e-3 (kv 4 / 8) and 2e-3
 * (kv 16). */
static inline void attention_steps_case(const att_cfg *cfg, int bits, int rot, const int *len,
                                        int n_seq, int max_chunk, int n_decode,
                                        const step_plan *given, int n_given, int mirror,
                                        uint64_t seed) {
    const int D = cfg->D, H = cfg->H, HD = H * D;
    const comet_rope_params rp = rope_of(cfg);
    char what[160];
    snprintf(what, sizeof what, "attention%s %s kv%d %s%s",
             n_decode ? " (decode)"
             : given  ? " (prefill)"
                      : "",
             cfg->name, bits, rot ? "hadamard" : "none",
             mirror && given ? ", CUDA cache mirrored" : "");

    /* pages: shuffled ids, a few left unused */
    int n_pages = 3;
    for (int s = 0; s < n_seq; s++)
        n_pages += (len[s] + PAGE - 1) / PAGE;
    int32_t *ids = st_malloc((size_t)n_pages * 4);
    for (int i = 0; i < n_pages; i++)
        ids[i] = i;
    st_seed(seed);
    for (int i = n_pages - 1; i > 0; i--) {
        int j = (int)(st_next() % (uint64_t)(i + 1));
        int32_t t = ids[i];
        ids[i] = ids[j], ids[j] = t;
    }
    int32_t *pages[MAX_SEQS];
    for (int s = 0, o = 0; s < n_seq; s++) {
        pages[s] = ids + o;
        o += (len[s] + PAGE - 1) / PAGE;
    }
    step_plan *steps = st_malloc(MAX_STEPS * sizeof *steps);
    int n_steps = given      ? n_given
                  : n_decode ? make_decode_schedule(len, n_seq, max_chunk, n_decode, steps)
                             : make_schedule(len, n_seq, max_chunk, steps);
    assert_true(n_steps <= MAX_STEPS);
    if (given)
        memcpy(steps, given, (size_t)n_given * sizeof *steps);

    comet_kv_cache kvc, kvg;
    kv_make(g_cpu, &kvc, cfg, n_pages, bits, rot);
    kv_make(g_cuda, &kvg, cfg, n_pages, bits, rot);

    /* the CUDA outputs of each sequence inside the batch, by position (0 where not attended) */
    float *mixed[MAX_SEQS];
    for (int s = 0; s < n_seq; s++) {
        mixed[s] = st_malloc((size_t)len[s] * HD * 4);
        memset(mixed[s], 0, (size_t)len[s] * HD * 4);
    }
    /* decode cases compare over the same cache (mirror_cuda_cache): fp32 rounding only */
    const double tol = n_decode ? 2e-5 : bits == 4 || bits == 8 ? 1e-3 : 2e-3;
    double worst = 0, worst_q = 0;
    int max_T = 0, max_S = 0, n_attended = 0;
    for (int i = 0; i < n_steps; i++) {
        st_batch rb;
        memset(&rb, 0, sizeof rb);
        int T = rbatch_build(&rb, &steps[i], pages, -1);
        max_T = T > max_T ? T : max_T;
        max_S = rb.b.n_seqs > max_S ? rb.b.n_seqs : max_S;
        const size_t nq = (size_t)T * HD, nk = (size_t)T * cfg->Hkv * D;
        float *q = st_malloc(nq * 4), *k = st_malloc(nk * 4), *v = st_malloc(nk * 4);
        gen_qkv(cfg, &rb, seed, q, k, v);
        char swhat[224];
        snprintf(swhat, sizeof swhat, "%s, step %d (T %d, %d seqs)", what, i, T, rb.b.n_seqs);
        const int attend = steps[i].attend;
        step_out og = run_step(g_cuda, &kvg, cfg, &rp, &rb, q, k, v, swhat, attend, NULL, bits);
        step_out oc = run_step(g_cpu, &kvc, cfg, &rp, &rb, q, k, v, swhat, attend,
                               mirror ? &kvg : NULL, bits);
        double eq = st_nerr(og.q, oc.q, nq), ek = st_nerr(og.k, oc.k, nk);
        if (!(eq <= 1e-6) || !(ek <= 1e-6))
            fail_msg("%s: after RoPE q differs by %.3g, k by %.3g (relative norm; want <= 1e-6; q "
                     "leaves rotated by RoPE only)",
                     swhat, eq, ek);
        worst_q = fmax(worst_q, fmax(eq, ek));
        if (!attend) {
            step_out_free(&oc), step_out_free(&og);
            free(q), free(k), free(v);
            st_batch_free(&rb);
            continue;
        }
        n_attended++;
        for (int s = 0, t0 = 0; s < rb.b.n_seqs; s++) {
            int t1 = rb.token_indptr[s + 1];
            double e =
                st_nerr(og.out + (size_t)t0 * HD, oc.out + (size_t)t0 * HD, (size_t)(t1 - t0) * HD);
            if (!(e <= tol))
                fail_msg(
                    "%s: sequence %d (positions %d..%d): attention relative norm error %.3g > %.3g",
                    swhat, rb.tok_seq[t0], rb.positions[t0], rb.positions[t1 - 1], e, tol);
            worst = fmax(worst, e);
            t0 = t1;
        }
        double e_all = st_nerr(og.out, oc.out, nq);
        if (!(e_all <= tol))
            fail_msg("%s: attention relative norm error %.3g > %.3g", swhat, e_all, tol);
        for (int t = 0; t < T; t++)
            memcpy(mixed[rb.tok_seq[t]] + (size_t)rb.positions[t] * HD, og.out + (size_t)t * HD,
                   (size_t)HD * 4);
        step_out_free(&oc), step_out_free(&og);
        free(q), free(k), free(v);
        st_batch_free(&rb);
    }

    /* each sequence alone (same chunks, fresh pool) on CUDA */
    double worst_alone = 0;
    for (int only = 0; only < n_seq && n_seq > 1; only++) {
        comet_kv_cache kv1;
        kv_make(g_cuda, &kv1, cfg, n_pages, bits, rot);
        float *alone = st_malloc((size_t)len[only] * HD * 4);
        memset(alone, 0, (size_t)len[only] * HD * 4);
        for (int i = 0; i < n_steps; i++) {
            st_batch rb;
            memset(&rb, 0, sizeof rb);
            int T = rbatch_build(&rb, &steps[i], pages, only);
            if (!T)
                continue;
            const size_t nq = (size_t)T * HD, nk = (size_t)T * cfg->Hkv * D;
            float *q = st_malloc(nq * 4), *k = st_malloc(nk * 4), *v = st_malloc(nk * 4);
            gen_qkv(cfg, &rb, seed, q, k, v);
            step_out og =
                run_step(g_cuda, &kv1, cfg, &rp, &rb, q, k, v, what, steps[i].attend, NULL, bits);
            if (steps[i].attend)
                memcpy(alone + (size_t)rb.positions[0] * HD, og.out, nq * 4);
            step_out_free(&og);
            free(q), free(k), free(v);
            st_batch_free(&rb);
        }
        double e = st_nerr(alone, mixed[only], (size_t)len[only] * HD);
        if (!(e <= 1e-5))
            fail_msg("%s: sequence %d (%d tokens) alone and inside the ragged batch differ by %.3g "
                     "(relative norm; want <= 1e-5)",
                     what, only, len[only], e);
        worst_alone = fmax(worst_alone, e);
        free(alone);
        comet_kv_cache_free_on(g_cuda, &kv1);
    }
    print_message("  %s: %d steps, attention at %d (up to %d tokens, %d seqs): worst error %.3g, "
                  "rope %.3g, alone vs batch %.3g\n",
                  what, n_steps, n_attended, max_T, max_S, worst, worst_q, worst_alone);
    for (int s = 0; s < n_seq; s++)
        free(mixed[s]);
    comet_kv_cache_free_on(g_cpu, &kvc);
    comet_kv_cache_free_on(g_cuda, &kvg);
    free(steps);
    free(ids);
}

static inline void attention_case(const att_cfg *cfg, int bits, int rot, const int *len, int n_seq,
                                  int max_chunk, int n_decode, uint64_t seed) {
    attention_steps_case(cfg, bits, rot, len, n_seq, max_chunk, n_decode, NULL, 0, n_decode > 0,
                         seed);
}

/* main()'s set-up: exit 77 (ctest: skipped) without a usable GPU; g_full and g_quick from
 * COMET_CUDA_TEST_FULL and COMET_CUDA_TEST_QUICK; g_cuda on device 0; g_cpu, the reference
 * (the contract's fp32 simulation: an fp32 cache, not the CPU's integer path with its own KV
 * pages), on one thread, or on full_threads with COMET_CUDA_TEST_FULL (0: every core), or none
 * (NULL) when full_threads < 0. Returns 0, or 1 after printing which backend failed. */
static inline int att_test_init(int full_threads) {
    cuda_test_skip_if_no_device();
    const char *full = getenv("COMET_CUDA_TEST_FULL");
    g_full = full && *full && strcmp(full, "0");
    const char *quick = getenv("COMET_CUDA_TEST_QUICK");
    g_quick = quick && *quick && strcmp(quick, "0");
    g_cuda = comet_backend_cuda_init(0);
    if (!g_cuda) {
        fprintf(stderr, "comet_backend_cuda_init(0) failed: %s\n", comet_last_error());
        return 1;
    }
    g_cpu = NULL;
    if (full_threads < 0)
        return 0;
    g_cpu = comet_backend_cpu_init(g_full ? full_threads : 1);
    if (!g_cpu) {
        fprintf(stderr, "comet_backend_cpu_init failed: %s\n", comet_last_error());
        return 1;
    }
    comet_backend_set_simulate(g_cpu, 1);
    return 0;
}

#endif
