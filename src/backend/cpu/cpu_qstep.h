/* cpu_qstep.h — the CPU backend's integer path for a W4Ax checkpoint: the step ops of the
 * quantized linear groups on INT4 weight codes and INT8/INT4 activation codes
 * (backend/cpu/w4ax_cpu.h), in place of the fp32 simulation (numerics/qlinear.h).
 *
 * The activation of a quantized group (the `act` buffer of backend.h) then holds the group's
 * codes and scales: int8 codes [T, K] from byte 0, fp32 block scales [T, K/B] from byte
 * comet_cpu_qact_scale_offset(T, K) — within comet_act_bytes(T, K). The codes and scales are
 * the simulation's (the same RMSNorm, gather and comet_quant_act rounding), so only the
 * GEMM's fp32 rounding differs from it. Floating-point groups (the lm_head's input) are the
 * caller's as before. The simulation stays the reference: a backend with `simulate` set, or
 * the scalar reference backend, never takes this path.
 */
#ifndef COMET_BACKEND_CPU_QSTEP_H
#define COMET_BACKEND_CPU_QSTEP_H

#include "backend/backend.h"
#include "backend/cpu/w4ax_cpu.h"
#include "core/threads.h"

typedef struct comet_cpu_qmodel comet_cpu_qmodel;

/* The thread pool of the threaded CPU backend; NULL for any other backend (cpu_ops.c). */
comet_threadpool *comet_cpu_backend_pool(comet_backend *be);

/* 1 when every linear of m is a W4 weight (COMET_WFMT_QSIM, w_bits 4, codes and scales in
 * memory) with quantized activations (a_bits 4 or 8) and a block of 64 or 128: the models
 * this path runs. */
int comet_cpu_qmodel_eligible(const comet_model *m);

/* Pack every linear of m (eligible) into the CPU layout for backend be (its pool threads the
 * ops; isa AUTO: the best the CPU has). *out is owned by the caller (comet_cpu_qmodel_free);
 * m must outlive it. COMET_OK, COMET_ERR_INVALID_ARG (isa unsupported), COMET_ERR_NOMEM. */
comet_status comet_cpu_qmodel_init(comet_backend *be, const comet_model *m, comet_w4ax_isa isa,
                                   comet_cpu_qmodel **out);
void comet_cpu_qmodel_free(comet_cpu_qmodel *q);

/* Bytes of packed weights the path holds. */
size_t comet_cpu_qmodel_bytes(const comet_cpu_qmodel *q);

/* Byte offset of the fp32 scales in a quantized group's act buffer of T rows of width K. */
static inline size_t comet_cpu_qact_scale_offset(int T, int K) {
    return ((size_t)T * (size_t)K + 63) / 64 * 64;
}

/* The step ops of backend.h for a quantized group g (not COMET_GROUP_LM_HEAD) on this path:
 * the same contracts, with act in the layout above. rmsnorm_quant adds residual into x first
 * when given and normalizes with m's norm of group g; act_quant reads x [T, K]; silu_mul_quant
 * reads gate, up [T, F]; matmul / matmul_group write fp32 [T, N]. COMET_OK or
 * COMET_ERR_NOMEM (growing scratch). */
comet_status comet_cpu_q_rmsnorm_quant(comet_backend *be, comet_cpu_qmodel *q, int layer,
                                       comet_group g, float *x, const float *residual, int T,
                                       void *act);
comet_status comet_cpu_q_act_quant(comet_backend *be, comet_cpu_qmodel *q, int layer,
                                   comet_group g, const float *x, int T, void *act);
comet_status comet_cpu_q_silu_mul_quant(comet_backend *be, comet_cpu_qmodel *q, int layer,
                                        const float *gate, const float *up, int T, void *act);
comet_status comet_cpu_q_matmul_group(comet_backend *be, comet_cpu_qmodel *q, int layer,
                                      comet_group g, const void *act, int T, float *const *ys);
comet_status comet_cpu_q_matmul(comet_backend *be, comet_cpu_qmodel *q, int layer, comet_role r,
                                const void *act, int T, float *y);



/* The embedding and lm_head of a model loaded with keep_codes_only (fp16 tok_embd_f16 /
 * lm_head_f16, comet/model.h): x [T, C] = the rows of tokens [T] (fp16 -> fp32 is exact, so
 * x equals the fp32 table's rows); logits [n_rows, V] = act[rows[r], :] · lm_headᵀ with act
 * [T, C] fp32, threaded over the vocabulary, each logit one fixed sequence of fp32 fmas
 * (independent of the thread count). COMET_OK. */
comet_status comet_cpu_q_embed_f16(comet_backend *be, const comet_model *m, const int32_t *tokens,
                                   int T, float *x);
comet_status comet_cpu_q_lm_head_f16(comet_backend *be, const comet_model *m, const float *act,
                                     const int32_t *rows, int n_rows, float *logits);

/* The INT8 lm_head (docs/numerics.md "lm_head") on the threaded backend be: logits [n_rows, V]
 * with logits[r, v] = s[v] * (act[rows[r], :] · q[v, :]), act [T, C] fp32, codes q [V, C],
 * fp16 scale bits s [V]; threaded over the vocabulary, each logit one fixed sequence of fp32
 * fmas (independent of the thread count and of n_rows). COMET_OK. */
comet_status comet_cpu_q_lm_head_q8(comet_backend *be, const float *act, const int32_t *rows,
                                    int n_rows, const int8_t *q, const uint16_t *s, int C, int V,
                                    float *logits);
#endif
