/* backend.c — backend-independent helpers of the op table: releasing a backend, the model's linears / norms / groups by role, and the argument checks
 * of the W4Ax ops, shared so that every backend refuses the same calls with the same
 * messages. Depends on core/status.c only (the GPU machine's nvcc/gcc build of the
 * CUDA backend, bench/gemm/build.sh, links it without the rest of the library). */
#include "backend/backend.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

void comet_backend_free(comet_backend *be) {
    if (be)
        be->ops->destroy(be);
}

void comet_backend_set_batch_invariant(comet_backend *be, int on) {
    if (be)
        be->batch_invariant = on ? 1 : 0;
}

void comet_backend_set_simulate(comet_backend *be, int on) {
    if (be)
        be->simulate = on ? 1 : 0;
}

int comet_backend_n_threads(const comet_backend *be) { return be->n_threads; }

comet_status comet_w4ax_check_load(const comet_backend *be, int N, int K, int B,
                                   const uint8_t *qw_plain, const uint16_t *sw_plain,
                                   comet_w4ax_weight **out) {
    const char *name = be->ops->name;
    if (out)
        *out = NULL;
    if (!qw_plain || !sw_plain || !out)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "w4ax_load (backend '%s'): qw_plain, sw_plain and out must be "
                               "non-NULL",
                               name);
    if (N < 1 || N > COMET_W4AX_MAX_DIM)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "w4ax_load (backend '%s'): N = %d output channels; need 1 <= N <= "
                               "%d",
                               name, N, COMET_W4AX_MAX_DIM);
    if (K < 64 || K % 64 || K > COMET_W4AX_MAX_DIM)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "w4ax_load (backend '%s'): K = %d input channels; need a positive "
                               "multiple of 64, at most %d",
                               name, K, COMET_W4AX_MAX_DIM);
    if (B != 64 && B != 128)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "w4ax_load (backend '%s'): block size B = %d; need 64 or 128", name,
                               B);
    if (K % B)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "w4ax_load (backend '%s'): K = %d is not a multiple of the block "
                               "size B = %d",
                               name, K, B);
    return COMET_OK;
}

comet_status comet_w4ax_check_gemm(const comet_backend *be, const comet_w4ax_weight *w, int K,
                                   int B, int M, int n8, const int8_t *qa, const float *sa,
                                   const float *y) {
    const char *name = be->ops->name;
    if (!w || !qa || !sa || !y)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "gemm_w4ax (backend '%s'): w, qa, sa and y must be non-NULL "
                               "(got w=%p qa=%p sa=%p y=%p)",
                               name, (const void *)w, (const void *)qa, (const void *)sa,
                               (const void *)y);
    if (M < 1 || M > COMET_W4AX_MAX_DIM)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "gemm_w4ax (backend '%s'): M = %d tokens; need 1 <= M <= %d", name,
                               M, COMET_W4AX_MAX_DIM);
    if (n8 < 0 || n8 > (B > 0 ? K / B : 0))
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "gemm_w4ax (backend '%s'): n8 = %d INT8 blocks is outside "
                               "[0, K/B = %d]",
                               name, n8, K / B);
    return COMET_OK;
}

comet_group comet_role_group(comet_role r) {
    switch (r) {
    case COMET_ROLE_Q:
    case COMET_ROLE_K:
    case COMET_ROLE_V: return COMET_GROUP_QKV;
    case COMET_ROLE_O: return COMET_GROUP_O;
    case COMET_ROLE_GATE:
    case COMET_ROLE_UP: return COMET_GROUP_GATE_UP;
    case COMET_ROLE_DOWN: return COMET_GROUP_DOWN;
    case COMET_ROLE_COUNT: break;
    }
    COMET_ASSERT(!"comet_role_group: invalid role");
    return COMET_GROUP_COUNT;
}

int comet_group_roles(comet_group g, comet_role roles[3]) {
    int n = 0;
    for (int r = 0; r < COMET_ROLE_COUNT; r++)
        if (g != COMET_GROUP_LM_HEAD && comet_role_group((comet_role)r) == g)
            roles[n++] = (comet_role)r;
    return n;
}

const comet_linear *comet_model_linear(const comet_model *m, int l, comet_role r) {
    COMET_ASSERT(l >= 0 && l < m->cfg.n_layer);
    const comet_layer_weights *w = &m->layers[l];
    const comet_linear *lins[COMET_ROLE_COUNT] = {&w->wq,     &w->wk,   &w->wv,    &w->wo,
                                                  &w->w_gate, &w->w_up, &w->w_down};
    COMET_ASSERT((unsigned)r < COMET_ROLE_COUNT);
    return lins[r];
}

const float *comet_model_norm(const comet_model *m, int l, comet_group g) {
    switch (g) {
    case COMET_GROUP_QKV: return m->layers[l].attn_norm;
    case COMET_GROUP_GATE_UP: return m->layers[l].ffn_norm;
    case COMET_GROUP_LM_HEAD: return m->output_norm;
    default: return NULL;
    }
}

int comet_group_width(const comet_model *m, comet_group g) {
    const comet_model_config *c = &m->cfg;
    switch (g) {
    case COMET_GROUP_O: /* o_proj's input: all H heads, also on a rank of fewer (model/shard.h) */
        return m->layers && c->n_layer > 0 ? m->layers[0].wo.n_in : c->n_head * c->head_dim;
    case COMET_GROUP_DOWN: return c->n_ff;
    default: return c->n_embd;
    }
}
