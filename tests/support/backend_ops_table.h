/* backend_ops_table.h — the op-test table of test_backend_ops.c (its columns and its rows),
 * apart from the runner that runs each row on every backend against the reference. */
#ifndef COMET_TESTS_BACKEND_OPS_TABLE_H
#define COMET_TESTS_BACKEND_OPS_TABLE_H

#include "backend/backend.h"
#include "comet/model.h"

enum {
    MAX_SEQS = 8 /* sequences of an attention row's batch */
};

/* ---- the table's columns ------------------------------------------------------------------ */

typedef enum op_id {
    OP_EMBED_TOKENS,
    OP_RMSNORM_QUANT,
    OP_ACT_QUANT,
    OP_SILU_MUL_QUANT,
    OP_MATMUL,
    OP_MATMUL_GROUP,
    OP_ATTENTION, /* rope_kv_append, then paged_attention */
    OP_LM_HEAD,
    OP_ATTENTION_QUANT,      /* rope_kv_append, then paged_attention_quant (the reference and a
                         * backend without it: paged_attention, then act_quant of O) */
    OP_ROPE_ATTENTION_QUANT, /* rope_attention_quant (the reference and a backend without it:
                              * OP_ATTENTION_QUANT's ops) */
    OP_COUNT
} op_id;

/* Whether op is one of the three attention ops (a KV pool, a step of sequences, no GEMM). */
static inline int op_is_attention(op_id op) {
    return op == OP_ATTENTION || op == OP_ATTENTION_QUANT || op == OP_ROPE_ATTENTION_QUANT;
}


typedef struct variant {
    const char *name;
    int w_bits, a_bits, block; /* w_bits 0: the fp32 model as made */
} variant;

enum {
    V_FP32,
    V_W4A4,
    V_W4A8,
    V_W16,
    N_VARIANTS
};

/* Head shapes of the attention rows (D, H, Hkv, KV group G: 0 = one group per head). */
typedef struct att_shape {
    const char *name;
    int D, H, Hkv, G;
    comet_rope_scaling scaling;
    float theta;
} att_shape;


/* Ragged batches of the attention rows: per sequence the tokens already cached (appended
 * by an earlier step) and the tokens of the tested step. */
typedef struct att_batch {
    const char *name;
    int n_seq;
    int old[MAX_SEQS], add[MAX_SEQS];
} att_batch;


typedef struct row {
    op_id op;
    int variant;   /* VARIANTS index (attention rows: unused, no weights) */
    int T;         /* tokens (attention rows: of the tested step) */
    int kv_bits;   /* attention rows: 4, 8 or 16 */
    int kv_rot;    /* attention rows: COMET_KV_ROTATION_* */
    double tol;    /* relative norm error bound; 0: bit-exact */
    int layer;     /* per-layer ops */
    int group;     /* rmsnorm_quant, matmul_group: comet_group */
    int role;      /* matmul: comet_role */
    int residual;  /* rmsnorm_quant: with a residual */
    int att_shape; /* attention rows: ATT_SHAPES index */
    int att_batch; /* attention rows: ATT_BATCHES index */
    char name[96];
} row;

extern const char *const OP_NAME[OP_COUNT];
extern const variant VARIANTS[N_VARIANTS];
extern const char *const ROLE_NAME[COMET_ROLE_COUNT];
extern const att_shape ATT_SHAPES[];
extern const int N_ATT_SHAPES;
extern const att_batch ATT_BATCHES[];
extern const int N_ATT_BATCHES;

double act_tol(int v);
double matmul_tol(int v);

/* Every row of the table, in order (*n of them); the caller frees the array. */
row *backend_ops_rows(int *n);

#endif
