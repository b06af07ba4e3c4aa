/* backend_ops_table.c — the op-test table's data and rows (backend_ops_table.h). */
#include "backend_ops_table.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "numerics/group.h"

const char *const OP_NAME[OP_COUNT] = {
    "embed_tokens", "rmsnorm_quant", "act_quant", "silu_mul_quant",        "matmul",
    "matmul_group", "attention",     "lm_head",   "paged_attention_quant", "rope_attention_quant"};

const variant VARIANTS[N_VARIANTS] = {
    {"fp32", 0, 0, 0}, {"w4a4", 4, 4, 64}, {"w4a8", 4, 8, 128}, {"w16", 16, 16, 64}};

const char *const ROLE_NAME[COMET_ROLE_COUNT] = {"q", "k", "v", "o", "gate", "up", "down"};

const att_shape ATT_SHAPES[] = {
    {"D64H6/2", 64, 6, 2, 0, COMET_ROPE_SCALING_NONE, 10000.0f},
    {"D128H8/8G32llama3", 128, 8, 8, 32, COMET_ROPE_SCALING_LLAMA3, 500000.0f},
    {"D32H4/1", 32, 4, 1, 0, COMET_ROPE_SCALING_NONE, 10000.0f},
    {"D256H2/1G64", 256, 2, 1, 64, COMET_ROPE_SCALING_NONE, 1000000.0f},
};
const int N_ATT_SHAPES = (int)(sizeof ATT_SHAPES / sizeof ATT_SHAPES[0]);

const att_batch ATT_BATCHES[] = {
    {"decode", 4, {40, 0, 16, 300}, {1, 1, 1, 1}},
    {"prefill", 1, {0}, {130}},
    {"mixed", 4, {0, 33, 7, 0}, {17, 1, 3, 1}},
    {"chunks", 2, {20, 5}, {45, 8}},
    {"many", 8, {2, 1, 4, 0, 3, 1, 2, 5}, {1, 1, 1, 1, 1, 1, 1, 1}},
    {"long", 1, {256}, {128}},
    /* decodes first, as engine.c schedules them, with enough keys to split on a big GPU, then
     * a chunk over a prefix (continuous batching with chunked prefill); index 6, named by the
     * quantized attention rows */
    {"decodes+chunk", 4, {300, 129, 64, 300}, {1, 1, 1, 48}},
};
const int N_ATT_BATCHES = (int)(sizeof ATT_BATCHES / sizeof ATT_BATCHES[0]);

/* Bounds, per variant: the CUDA backend keeps fp32 and W16 linears in fp16 (activations
 * and weights, cuBLAS), so their outputs carry fp16 rounding (act 2^-11 relative, matmul and
 * lm_head 2e-2). A W4Ax act may differ from the reference's by one code where x/s lies within
 * rounding of a .5 boundary (the norms sum in different orders): one such INT4 code in a
 * T = 1 row of 256 is ~3e-2 of the row's norm, an INT8 one ~2e-3; an act that is wrong
 * (permutation, scale, block) is off by O(1). act_quant's W4Ax act is the same quantizer on
 * the same input: bit-exact. */
double act_tol(int v) { return v == V_W4A4 ? 5e-2 : v == V_W4A8 ? 1e-2 : 1e-3; }
double matmul_tol(int v) { return v == V_W4A4 || v == V_W4A8 ? 1e-3 : 2e-2; }

/* ---- the rows ---------------------------------------------------------------------------- */

static row *g_rows;
static int g_n_rows, g_cap_rows;

static row *add_row(op_id op, int v, int T, double tol) {
    if (g_n_rows == g_cap_rows) {
        g_cap_rows = g_cap_rows ? 2 * g_cap_rows : 64;
        g_rows = realloc(g_rows, (size_t)g_cap_rows * sizeof *g_rows);
        assert_non_null(g_rows);
    }
    row *r = &g_rows[g_n_rows++];
    memset(r, 0, sizeof *r);
    r->op = op, r->variant = v, r->T = T, r->tol = tol, r->layer = 1;
    return r;
}

/* The tokens ATT_BATCHES[bi]'s step adds: the row's T */
static int att_batch_tokens(int bi) {
    int T = 0;
    for (int s = 0; s < ATT_BATCHES[bi].n_seq; s++)
        T += ATT_BATCHES[bi].add[s];
    return T;
}

row *backend_ops_rows(int *n) {
    static const int Ts_act[] = {1, 5, 130}, Ts_mm[] = {1, 7, 70}, Ts_lm[] = {1, 9, 40, 130};
    for (int v = 0; v < N_VARIANTS; v++) {
        const char *vn = VARIANTS[v].name;
        for (int ti = 0; ti < 4; ti++) { /* 130 rows: the INT8 lm_head through cuBLAS */
            int T = Ts_lm[ti];
            row *r = add_row(OP_EMBED_TOKENS, v, T, 0);
            snprintf(r->name, sizeof r->name, "embed_tokens/%s/T%d", vn, T);
            r = add_row(OP_LM_HEAD, v, T, 2e-2);
            snprintf(r->name, sizeof r->name, "lm_head/%s/T%d", vn, T);
        }
        for (int ti = 0; ti < 3; ti++) {
            const int T = Ts_act[ti];
            static const comet_group gs[3] = {COMET_GROUP_QKV, COMET_GROUP_GATE_UP,
                                              COMET_GROUP_LM_HEAD};
            for (int gi = 0; gi < 3; gi++)
                for (int res = 0; res < 2; res++) {
                    row *r = add_row(OP_RMSNORM_QUANT, v, T, act_tol(v));
                    r->group = gs[gi], r->residual = res;
                    if (gs[gi] == COMET_GROUP_LM_HEAD)
                        r->layer = 0;
                    snprintf(r->name, sizeof r->name, "rmsnorm_quant/%s/%s%s/T%d", vn,
                             comet_group_name(gs[gi]), res ? "+res" : "", T);
                }
            const int w4ax = v == V_W4A4 || v == V_W4A8;
            row *r = add_row(OP_ACT_QUANT, v, T, w4ax ? 0 : act_tol(v));
            snprintf(r->name, sizeof r->name, "act_quant/%s/o/T%d", vn, T);
            r = add_row(OP_SILU_MUL_QUANT, v, T, act_tol(v));
            snprintf(r->name, sizeof r->name, "silu_mul_quant/%s/down/T%d", vn, T);
        }
        for (int ti = 0; ti < 3; ti++) {
            const int T = Ts_mm[ti];
            for (int role = 0; role < COMET_ROLE_COUNT; role++) {
                row *r = add_row(OP_MATMUL, v, T, matmul_tol(v));
                r->role = role;
                snprintf(r->name, sizeof r->name, "matmul/%s/%s/T%d", vn, ROLE_NAME[role], T);
            }
            static const comet_group gs[2] = {COMET_GROUP_QKV, COMET_GROUP_GATE_UP};
            for (int gi = 0; gi < 2; gi++) {
                row *r = add_row(OP_MATMUL_GROUP, v, T, matmul_tol(v));
                r->group = gs[gi];
                snprintf(r->name, sizeof r->name, "matmul_group/%s/%s/T%d", vn,
                         comet_group_name(gs[gi]), T);
            }
        }
    }
    /* attention: the KV formats on every head shape and batch; 16 = fp32 on the CPU, fp16 on
     * CUDA (2e-3); 4 and 8 quantized by the same rule on both, but RoPE and the Hadamard
     * rotation round in another order, so a K or V code whose value lies within rounding of
     * a .5 boundary may differ by one: one INT4 step (1/15 of a group's range) in a V row
     * that the early queries of a T = 130 prefill attend alone moves the output by ~3e-4 of
     * its norm, an INT8 step by 1/17 of that; a few such flips fit 5e-3 (INT4) and 1e-3
     * (INT8), while a wrong page, position, scale or rotation is off by 1e-1 or more. */
    static const int bits[3] = {4, 8, 16};
    for (int a = 0; a < N_ATT_SHAPES; a++)
        for (int bi = 0; bi < N_ATT_BATCHES; bi++)
            for (int kb = 0; kb < 3; kb++)
                for (int rot = 0; rot < 2; rot++) {
                    const int T = att_batch_tokens(bi);
                    row *r = add_row(OP_ATTENTION, 0, T,
                                      bits[kb] == 16 ? 2e-3 : bits[kb] == 8 ? 1e-3 : 5e-3);
                    r->kv_bits = bits[kb];
                    r->kv_rot = rot ? COMET_KV_ROTATION_HADAMARD : COMET_KV_ROTATION_NONE;
                    r->att_shape = a, r->att_batch = bi;
                    snprintf(r->name, sizeof r->name, "attention/kv%d%s/%s/%s/T%d", bits[kb],
                             rot ? "h" : "", ATT_SHAPES[a].name, ATT_BATCHES[bi].name, T);
                }
    /* paged_attention_quant at the models' heads (ATT_SHAPES[0]: D 64, H 6, Hkv 2), the
     * quantized o_proj inputs and the fp16 one: decode steps (on a 132-SM GPU with kv 4, the
     * first splits its keys 4 ways: the fused kernel) and two mixed ones, one with its decodes
     * first (the two kernels); the output as attention's rows, the act as rmsnorm_quant's (its
     * input carries attention's rounding) */
    static const int qv[3] = {V_W4A4, V_W4A8, V_W16}, qb[4] = {0, 4, 2, 6};
    for (int vi = 0; vi < 3; vi++)
        for (int bi = 0; bi < 4; bi++)
            for (int kb = 0; kb < 2; kb++) {
                const int T = att_batch_tokens(qb[bi]);
                row *r = add_row(OP_ATTENTION_QUANT, qv[vi], T, bits[kb] == 8 ? 1e-3 : 5e-3);
                r->kv_bits = bits[kb];
                r->kv_rot =
                    (vi + bi + kb) % 2 ? COMET_KV_ROTATION_HADAMARD : COMET_KV_ROTATION_NONE;
                r->att_shape = 0, r->att_batch = qb[bi];
                snprintf(r->name, sizeof r->name, "paged_attention_quant/%s/kv%d%s/%s/%s/T%d",
                         VARIANTS[qv[vi]].name, bits[kb], r->kv_rot ? "h" : "", ATT_SHAPES[0].name,
                         ATT_BATCHES[qb[bi]].name, T);
            }
    /* rope_attention_quant, the same rows (CUDA: the decode steps with kv 4 take the decode
     * kernel's fused form, one split and several; the others the two ops' paths) */
    for (int vi = 0; vi < 2; vi++)
        for (int bi = 0; bi < 4; bi++)
            for (int kb = 0; kb < 2; kb++) {
                const int T = att_batch_tokens(qb[bi]);
                row *r = add_row(OP_ROPE_ATTENTION_QUANT, qv[vi], T, bits[kb] == 8 ? 1e-3 : 5e-3);
                r->kv_bits = bits[kb];
                r->kv_rot =
                    (vi + bi + kb + 1) % 2 ? COMET_KV_ROTATION_HADAMARD : COMET_KV_ROTATION_NONE;
                r->att_shape = 0, r->att_batch = qb[bi];
                snprintf(r->name, sizeof r->name, "rope_attention_quant/%s/kv%d%s/%s/%s/T%d",
                         VARIANTS[qv[vi]].name, bits[kb], r->kv_rot ? "h" : "", ATT_SHAPES[0].name,
                         ATT_BATCHES[qb[bi]].name, T);
            }
    *n = g_n_rows;
    row *all = g_rows;
    g_rows = NULL, g_n_rows = g_cap_rows = 0;
    return all;
}
