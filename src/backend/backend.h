/* backend.h — the op table: the one seam between the model's layer loop and hardware.
 *
 * The forward pass (src/model/forward.c) is written once as a loop over layers calling
 * the "step ops" below; the CPU backends (scalar reference + threaded fast paths) and the
 * CUDA backend each fill one table (docs/architecture.md "The op table"). A backend owns its
 * memory: it allocates, frees and copies its own buffers (alloc / free / upload /
 * download, with sync as the point where queued work is done), holds its own copy of a
 * model's weights in its own layout (weights_load), and its own KV page storage
 * (kv_init). Every pointer an op takes lives in that backend's memory (host for the CPU,
 * device for CUDA) unless its comment says "host".
 *
 * The table holds only what the layer loop (forward.c) and the runner call: memory, the
 * weights and the KV pool, the step ops, decode graphs, sampling and destroy (24 function
 * slots).
 * A backend's building blocks stay behind it: the CPU backends' fp32 primitives are in
 * backend/cpu/cpu_prims.h, the W4Ax GEMM has its own C API (backend/cpu/ref_gemm_w4ax.h,
 * backend/cpu/w4ax_cpu.h, backend/cuda/gemm_w4ax.h).
 *
 * Ops return COMET_OK or a negative status (never abort on a runtime failure); shape
 * violations are bugs and assert. A backend may leave an optional op NULL (matmul_group,
 * paged_attention_quant, the graph ops, sample); comet_forward_init refuses a backend without a step op, naming it.
 *
 * Shape letters: T tokens in the step, C hidden, F FFN, H/Hkv heads, D head dim, V vocab,
 * K a linear's input width, B activation block. Activations are row-major [T, width] fp32.
 */
#ifndef COMET_BACKEND_BACKEND_H
#define COMET_BACKEND_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "backend/batch.h"
#include "comet/backend.h"
#include "comet/model.h"
#include "comet/sampling.h"
#include "numerics/group.h"

typedef struct comet_rope_params {
    int head_dim; /* D (rotary over all D channels, rotate-half / NeoX pairing) */
    float theta;
    comet_rope_scaling scaling;
    float factor, low_freq_factor, high_freq_factor;
    int orig_ctx;
} comet_rope_params;

/* A model's weights in one backend's own layout and memory, made by weights_load. Opaque:
 * each backend defines the struct. */
typedef struct comet_weights comet_weights;

/* Bytes of an "activation" buffer for T rows of width K: the input of a group's linears
 * as a backend's GEMMs read it (CPU: fp32 [T, K]; CUDA: INT8 codes + fp32 block scales,
 * or fp16). Every backend's layout fits in 4 bytes per element plus 256. */
static inline size_t comet_act_bytes(int T, int K) { return (size_t)T * (size_t)K * 4 + 256; }

/* One step's batch as the ops see it (made by step_begin). */
typedef struct comet_step {
    comet_batch host; /* the batch with host arrays (the caller's, borrowed for the step) */
    comet_batch dev;  /* the same arrays in the backend's memory (CPU: equal to host) */
    int max_kv_len;   /* the longest KV length of a sequence after this step's append */
    int max_q_len;    /* the most tokens one sequence has in this step */
} comet_step;

/* One listed id of a row (the op `sample`): its logit becomes
 * comet_sampler_adjust(p, logit, count, bias): bias added (logit_bias; -100: -infinity),
 * then, when count > 0 (its occurrences in the penalty window), the penalties. */
typedef struct comet_sample_adj {
    int32_t id;
    int32_t count;
    float bias;
} comet_sample_adj;

/* One logits row to sample where the logits are (the op `sample`): the chain of
 * engine/sampler.h with the host's parameters and numbers, so that both sides compute the
 * same floats (comet_sampler_row fills it). The listed ids adj [n_adj] from adj_offset are
 * adjusted first (comet_sample_adj); then greedy rows take the argmax (lowest id on ties),
 * the others filter as comet_sampler_pick and draw with u. */
typedef struct comet_sample_row {
    comet_sampler_params p; /* the sequence's parameters (p.logit_bias is a host pointer the
                             * device does not read: the biases come in the listed ids) */
    int row;                /* logits row, < the step's n_logits */
    int greedy;             /* 1: argmax (comet_sampler_greedy) */
    float inv_temperature;  /* 1.0f / temperature, as the host divides it */
    float log_min_p;        /* logf(min_p) by the host's libm; -INFINITY: min-p off */
    int adj_offset, n_adj;  /* this row's listed ids */
    int has_ban;            /* some listed id has bias -100 (its logit becomes -infinity) */
    double u;               /* the draw in [0, 1) */
} comet_sample_row;

/* ids the op `sample` returns instead of a token */
enum {
    COMET_SAMPLE_NONFINITE = -1, /* the row holds a NaN or an infinity */
    COMET_SAMPLE_ON_HOST = -2,   /* more candidates than the device sorts: pick on the host */
};

/* inv_freq[i] for i < D/2: theta^(-2i/D), then the model's scaling: LINEAR divides by
 * factor; LLAMA3 applies Llama-3.1's wavelength-dependent blend (HF
 * _compute_llama3_parameters). inv_freq has room for D/2 doubles. Every backend rotates
 * position p's pair i by the angle p * inv_freq[i], computed in double. */
void comet_rope_inv_freq(const comet_rope_params *rp, double *inv_freq);

/* How a step's ops run (graph_begin). */
enum {
    COMET_GRAPH_NONE = 0,
    COMET_GRAPH_CAPTURING = 1,
    COMET_GRAPH_REPLAYED = 2
};

typedef struct comet_backend_ops {
    const char *name;
    int host_memory; /* 1 when the backend's memory is the host's (CPU): its buffers are
                      * host pointers, so the forward pass writes logits straight into the
                      * caller's array */

    /* ---- memory ----
     * alloc: `bytes` (> 0) of the backend's memory, 256-byte aligned, contents undefined;
     * NULL + comet_last_error() (COMET_ERR_NOMEM) when it does not fit. free: NULL is a
     * no-op. upload copies `bytes` from host `src` to backend `dst` in stream order (src
     * may be reused when it returns); download copies backend `src` to host `dst` after
     * the work queued before it, and returns when dst holds the data. sync waits for the
     * queued work and reports a failure inside it (COMET_ERR_CUDA, named). */
    void *(*alloc)(comet_backend *be, size_t bytes);
    void (*free)(comet_backend *be, void *p);
    comet_status (*upload)(comet_backend *be, void *dst, const void *src, size_t bytes);
    comet_status (*download)(comet_backend *be, void *dst, const void *src, size_t bytes);
    comet_status (*sync)(comet_backend *be);

    /* ---- the model's weights and the KV page pool ----
     * weights_load: the backend's own copy of m's weights (the CPU borrows m's fp32
     * arrays; CUDA: W4Ax weights packed on the device, FP16 weights for floating-point
     * linears, fp32 norms and embedding table, an FP16 lm_head). m must outlive the
     * weights. COMET_OK; COMET_ERR_NOMEM; COMET_ERR_UNSUPPORTED naming a layout this
     * backend cannot run; COMET_ERR_CUDA. weights_free: NULL is a no-op.
     * kv_init: storage for kv's pool, whose fields n_layer .. kv_rotation the caller has
     * set (CPU: fp32 k and v; CUDA: kv->storage, INT4/INT8 codes with per-token fp16
     * scale and zero per group, or fp16 for kv_bits 0 / 16). kv_free releases it. */
    comet_status (*weights_load)(comet_backend *be, const comet_model *m, comet_weights **out);
    void (*weights_free)(comet_backend *be, comet_weights *w);
    comet_status (*kv_init)(comet_backend *be, comet_kv_cache *kv);
    void (*kv_free)(comet_backend *be, comet_kv_cache *kv);

    /* ---- step ops: what the layer loop calls ----
     *
     * step_begin: copy the host batch b (borrowed until the step's last op) to the
     * backend in one upload and describe it in *st (st->host = *b).
     * embed_tokens: x[t, :] = embd[tokens[t], :]; x [T, C].
     * rmsnorm_quant: when residual != NULL, x[T, C] += residual[T, C] first (x keeps the
     * sum); then h = RMSNorm(x) * norm of group g (comet_model_norm), and act = h as
     * group g's linears read it (a floating-point group: h itself; a quantized one: h
     * gathered by the group's permutation and quantized per token per block, docs/numerics.md
     * "Activations"). act: comet_act_bytes(T, C).
     * act_quant: act = x [T, K] as group g's linears read it (no norm; used for O).
     * silu_mul_quant: act = silu(gate) * up [T, F] as DOWN reads it (its permutation is
     * folded into gate / up offline).
     * matmul: y [T, N] = the linear of role r applied to act of its group (fp32 out).
     * rope_kv_append: RoPE on q [T, H, D] and k [T, Hkv, D] in place by the step's
     * positions, then k and v [T, Hkv, D] written into layer's pages of kv (rotated by the
     * KV Hadamard and quantized as kv says). q leaves rotated by RoPE only.
     * attention: causal GQA attention of q [T, H, D] over each token's own sequence,
     * positions 0..positions[t] (this step's K/V already appended), out [T, H, D]; the KV
     * rotation is undone inside: out equals attention over the unrotated cache.
     * lm_head: logits [n_logits, V] fp32 for the rows st->dev.logit_rows of act (group
     * LM_HEAD's input, [T, C]). */
    comet_status (*step_begin)(comet_backend *be, const comet_batch *b, comet_step *st);
    comet_status (*embed_tokens)(comet_backend *be, const comet_weights *w, const comet_step *st,
                                 float *x);
    comet_status (*rmsnorm_quant)(comet_backend *be, const comet_weights *w, int layer,
                                  comet_group g, float *x, const float *residual, int T, void *act);
    comet_status (*act_quant)(comet_backend *be, const comet_weights *w, int layer, comet_group g,
                              const float *x, int T, void *act);
    comet_status (*silu_mul_quant)(comet_backend *be, const comet_weights *w, int layer,
                                   const float *gate, const float *up, int T, void *act);
    comet_status (*matmul)(comet_backend *be, const comet_weights *w, int layer, comet_role r,
                           const void *act, int T, float *y);
    /* matmul_group (optional; NULL: the layer loop calls matmul per role): ys[i] [T, N_i]
     * = the linear of group g's i-th role (QKV: q, k, v; GATE_UP: gate, up) applied to act,
     * what matmul gives for each, with one pass over the weights of the whole group. */
    comet_status (*matmul_group)(comet_backend *be, const comet_weights *w, int layer,
                                 comet_group g, const void *act, int T, float *const *ys);
    comet_status (*rope_kv_append)(comet_backend *be, comet_kv_cache *kv, int layer,
                                   const comet_step *st, const comet_rope_params *rp, float *q,
                                   int H, float *k, const float *v);
    comet_status (*paged_attention)(comet_backend *be, const comet_kv_cache *kv, int layer,
                                    const comet_step *st, const float *q, int H, float *out);
    /* paged_attention_quant (optional; NULL: the layer loop calls paged_attention, then
     * act_quant of group O): both in one call, out [T, H, D] as paged_attention writes it
     * and act as act_quant(be, w, layer, COMET_GROUP_O, out, T, act) makes it from out, the
     * same bits; act: comet_act_bytes(T, H * D). A backend may fuse the two (CUDA: a decode
     * step's split merge with the quantization, attention.h). The layer loop calls it only
     * where nothing reads out between the two (not when a whole o_proj gathers every
     * rank's heads first). */
    comet_status (*paged_attention_quant)(comet_backend *be, const comet_kv_cache *kv, int layer,
                                          const comet_step *st, const float *q, int H, float *out,
                                          const comet_weights *w, void *act);
    /* rope_attention_quant (optional; NULL: the layer loop calls rope_kv_append, then
     * paged_attention_quant or its two ops): rope_kv_append(be, kv, layer, st, rp, q, H, k, v),
     * then paged_attention_quant(be, kv, layer, st, q, H, out, w, act), in one call: the same
     * bits in kv's pages, in out [T, H, D] and in act, and the same statuses. q [T, H, D] and
     * k [T, Hkv, D] leave unspecified (a backend may RoPE them in place or leave them as given:
     * CUDA fuses a decode step's RoPE and KV append into its decode attention kernel, which
     * only reads them). The layer loop calls it where it calls paged_attention_quant. */
    comet_status (*rope_attention_quant)(comet_backend *be, comet_kv_cache *kv, int layer,
                                         const comet_step *st, const comet_rope_params *rp,
                                         float *q, int H, float *k, const float *v, float *out,
                                         const comet_weights *w, void *act);
    comet_status (*lm_head)(comet_backend *be, const comet_weights *w, const void *act,
                            const comet_step *st, float *logits);

    /* ---- CUDA graphs of decode steps (optional; NULL where a backend has none) ----
     * graph_begin, after step_begin of a decode step (every sequence one token, logits for
     * every row in order), says in *mode how the step's ops run: COMET_GRAPH_REPLAYED (a
     * graph recorded for this step's shape, on the same workspace `owner` and KV pool, was
     * launched: skip the ops), COMET_GRAPH_CAPTURING (run the ops: they are recorded, then
     * call graph_end) or COMET_GRAPH_NONE (run them as usual; a shape is run once before it
     * is recorded). H is the model's query heads. graph_end(be, ops_status, &rerun) ends the
     * recording, and on success launches it; when recording failed (rerun = 1, the shape is
     * not recorded again) nothing ran and the caller runs the ops as usual. Returns
     * ops_status when that failed, else COMET_OK or the launch's failure. */
    comet_status (*graph_begin)(comet_backend *be, const void *owner, const comet_kv_cache *kv,
                                const comet_step *st, int H, int *mode);
    comet_status (*graph_end)(comet_backend *be, comet_status ops_status, int *rerun);

    /* ---- sampling where the logits are (optional; NULL: the caller samples on the host) --
     * sample: one id per row r < n_rows into host ids[r], for rows[r] over logits
     * [n_logits, V] in the backend's memory (comet_forward_logits; the rows are modified:
     * listed ids adjusted). adj [n_adj] (host) holds every row's listed ids
     * (comet_sample_adj, ids in [0, V)). ids[r] is the token, COMET_SAMPLE_NONFINITE, or
     * COMET_SAMPLE_ON_HOST (the row, adjusted, is to be downloaded and picked by
     * comet_sampler_pick with the same u). Returns when ids holds the results: COMET_OK,
     * COMET_ERR_INVALID_ARG, COMET_ERR_NOMEM, COMET_ERR_CUDA. */
    comet_status (*sample)(comet_backend *be, const float *logits, int V,
                           const comet_sample_row *rows, int n_rows, const comet_sample_adj *adj,
                           int n_adj, int32_t *ids);

    /* Release the backend's private state (be->impl) and be itself. */
    void (*destroy)(comet_backend *be);
} comet_backend_ops;

struct comet_backend {
    const comet_backend_ops *ops;
    int n_threads; /* CPU: worker threads */
    /* 1: every token's arithmetic is the same whatever else is in its step and however its
     * sequence was cut into prefill chunks, bit for bit (docs/numerics.md
     * "Reproducibility"). The CPU backends always are, and ignore it. CUDA: the W4Ax GEMMs take
     * a plan fixed by the weight's shape (batch_invariant in gemm_w4ax.h) and attention cuts
     * every row's keys into spans at fixed positions, merged in order (attention.cu); FP16 linears and lm_head
     * (cuBLAS) stay plan-by-shape, so FP models are invariant up to fp rounding only. Costs
     * speed (bench/results); 0 by default. Set it (comet_backend_set_batch_invariant) before
     * the backend's first step. */
    int batch_invariant;
    /* 1: the CPU backend runs a quantized checkpoint by its fp32 simulation (the reference)
     * instead of integer codes (comet_backend_set_simulate); ignored elsewhere. */
    int simulate;
    void *impl; /* backend-private state */
};

/* The CPU backends. `ref` is the scalar single-threaded oracle; the default one uses
 * threads and OpenBLAS. n_threads <= 0 means all cores. comet_backend_cpu_init sets
 * OpenBLAS to one thread, process-wide (it threads around BLAS calls itself): code that
 * wants a threaded BLAS call afterwards sets openblas_set_num_threads() around it.
 * A backend is driven by one thread at a time (ops keep per-thread scratch). */
comet_backend *comet_backend_cpu_ref_init(void);
comet_backend *comet_backend_cpu_init(int n_threads);
/* comet_backend_open, comet_backend_free (through ops->destroy),
 * comet_backend_set_batch_invariant (be->batch_invariant) and comet_backend_n_threads
 * (be->n_threads) are declared in comet/backend.h. */

/* The CUDA backend on GPU `device` (0-based), with its own non-blocking cudaStream and a
 * GEMM workspace it owns (allocated and zero-filled on first need, grown when a call needs
 * more). Ops run on that stream, which does not wait for the legacy default stream: device
 * inputs written elsewhere (cudaMemcpy, other streams) must be complete before the call.
 * Like the CPU backends it is driven by one thread at a time (its workspace grows without a
 * lock); two threads use two backends. Each op makes `device` current and gives a calling
 * thread that had a CUDA context that context back (a thread with none is left with the
 * backend's device current). It implements the whole op table (docs/cuda.md). Returns NULL
 * + comet_last_error() when this build has no CUDA (COMET_ERR_UNSUPPORTED), no CUDA device
 * is usable (COMET_ERR_CUDA), `device` is out of range (COMET_ERR_INVALID_ARG) or memory
 * runs out.
 * Always linkable: without CUDA it is a stub that fails. */
comet_backend *comet_backend_cuda_init(int device);

/* The GPU a CUDA backend runs on; -1 for another backend. */
int comet_backend_cuda_device(const comet_backend *be);

/* The memory of the device `be` runs on, as the device reports it now: *total_bytes its
 * size and *free_bytes what no one (this process or another) holds (cudaMemGetInfo). A
 * backend whose memory is the host's answers 0 and 0 (unknown: the engine does not size
 * its KV pool from host memory). COMET_OK, or COMET_ERR_CUDA naming the failure. */
comet_status comet_backend_device_memory(comet_backend *be, size_t *free_bytes,
                                         size_t *total_bytes);

/* Wait for the work queued on a CUDA backend's stream. Returns COMET_OK, COMET_ERR_CUDA
 * with the CUDA error named when a kernel failed, or COMET_ERR_INVALID_ARG when `be` is
 * not a CUDA backend. */
comet_status comet_backend_cuda_sync(comet_backend *be);

#endif
