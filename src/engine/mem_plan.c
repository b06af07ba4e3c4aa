/* mem_plan.c — sizing the KV page pool from device memory (comet_engine_plan_memory in
 * comet/engine.h): the one formula the engine's check before loading and its sizing after
 * loading share. The estimates here (weights, workspace) only decide whether loading is
 * worth trying; the pool the engine allocates is sized from the device's free memory after
 * the weights and workspace are there.
 */
#include <stdio.h>
#include <string.h>

#include "backend/cuda/cuda_kv.h"
#include "comet/engine.h"
#include "comet/kv_format.h"
#include "model/forward.h"
#include "numerics/group.h"

#define GIB(x) ((double)(x) / (double)(1u << 30))

/* Device bytes of one linear as the CUDA backend holds it: W4Ax packed 4-bit codes and
 * fp16 scales per block of B inputs (rows padded to 16), else fp16 weights. */
static size_t linear_bytes(const comet_linear *lin) {
    size_t N = (size_t)lin->n_out, K = (size_t)lin->n_in;
    if (lin->fmt == COMET_WFMT_QSIM && lin->w_bits == 4 && (lin->a_bits == 4 || lin->a_bits == 8) &&
        lin->block > 0)
        return N * K / 2 + ((N + 15) / 16 * 16) * (K / (size_t)lin->block) * 2;
    return N * K * 2;
}

static size_t weights_estimate(const comet_model *m) {
    const comet_model_config *c = &m->cfg;
    size_t n = 0;
    for (int l = 0; l < c->n_layer; l++) {
        const comet_layer_weights *w = &m->layers[l];
        const comet_linear *lins[] = {&w->wq, &w->wk, &w->wv, &w->wo,
                                      &w->w_gate, &w->w_up, &w->w_down};
        for (size_t i = 0; i < sizeof lins / sizeof lins[0]; i++)
            n += linear_bytes(lins[i]);
    }
    size_t VC = (size_t)c->n_vocab * (size_t)c->n_embd;
    n += VC * 4; /* fp32 embedding */
    /* INT8 codes, fp16 row scales and the codes as fp16 (for cuBLAS at many rows), or fp16 */
    n += m->lm_head_bits == 8 ? VC * 3 + (size_t)c->n_vocab * 2 : VC * 2;
    n += (size_t)(2 * c->n_layer + 1) * c->n_embd * 4; /* RMSNorm weights */
    return n;
}

/* The widest output of a stacked group (QKV or gate/up), in columns. */
static size_t widest_stack(const comet_model_config *c) {
    size_t qkv = (size_t)(c->n_head + 2 * c->n_head_kv) * (size_t)c->head_dim;
    size_t gu = 2 * (size_t)c->n_ff;
    return qkv > gu ? qkv : gu;
}

static int ceil_div(long a, long b) { return (int)((a + b - 1) / b); }

comet_status comet_engine_plan_memory(const comet_model *m, const comet_engine_params *p,
                                      size_t device_total, size_t device_free, int loaded,
                                      comet_engine_memory_plan *out) {
    const comet_model_config *c = &m->cfg;
    memset(out, 0, sizeof *out);
    double frac = p->gpu_memory_fraction;
    if (!(frac > 0.0 && frac <= 1.0))
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "engine: gpu_memory_fraction %g is outside (0, 1]; it is the "
                               "share of the device's memory comet may use (e.g. 0.9)",
                               frac);
    if (device_total == 0)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "engine: no device memory to plan the KV pool in (a host-memory "
                               "backend keeps a fixed pool: give n_pages)");
    if (p->page_size <= 0 || p->max_batch_tokens <= 0)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "engine: page_size %d and max_batch_tokens %d must be positive",
                               p->page_size, p->max_batch_tokens);
    const int P = p->page_size;
    const int kv_bits = comet_kv_type_bits(m->kv.type);
    comet_cuda_kv_layout L = comet_cuda_kv_layout_make(c->n_layer, 1, P, c->n_head_kv,
                                                       c->head_dim, kv_bits, m->kv.group);
    out->page_size = P;
    out->page_bytes = L.total_bytes;
    out->budget = (size_t)(frac * (double)device_total);
    out->used = device_total > device_free ? device_total - device_free : 0;
    out->weights = weights_estimate(m);
    out->workspace = comet_forward_workspace_bytes(m, p->max_batch_tokens, 0);
    out->headroom = COMET_ENGINE_HEADROOM_BYTES +
                    2 * (size_t)p->max_batch_tokens * widest_stack(c) * sizeof(float);
    out->pages_per_seq = ceil_div(c->n_ctx, P);
    size_t taken = out->used + out->headroom + (loaded ? 0 : out->weights + out->workspace);
    size_t left = out->budget > taken ? out->budget - taken : 0;
    size_t pages = left / out->page_bytes;
    out->n_pages = pages > (size_t)(1 << 30) ? 1 << 30 : (int)pages;
    out->max_seqs_ctx = out->n_pages / out->pages_per_seq;
    out->max_seqs_2048 = out->n_pages / ceil_div(2048, P);
    if (out->n_pages < out->pages_per_seq) {
        char est[96] = "";
        if (!loaded)
            snprintf(est, sizeof est, ", the weights ~%.2f GiB and the workspace %.2f GiB",
                     GIB(out->weights), GIB(out->workspace));
        return comet_set_error(
            COMET_ERR_NOMEM,
            "engine: the KV pool cannot hold one sequence of the model's context (%d tokens "
            "= %d pages of %d, %.2f GiB): %g of the device's %.2f GiB is %.2f GiB; %.2f GiB "
            "are in use already%s, %.2f GiB stay free for the backend's scratch, which "
            "leaves %.2f GiB. Raise --gpu-memory-fraction, serve a W4AxKV4 checkpoint "
            "(comet quantize), lower --max-batch-tokens or use a larger GPU",
            c->n_ctx, out->pages_per_seq, P, GIB((size_t)out->pages_per_seq * out->page_bytes),
            frac, GIB(device_total), GIB(out->budget), GIB(out->used), est, GIB(out->headroom),
            GIB(left));
    }
    return COMET_OK;
}
