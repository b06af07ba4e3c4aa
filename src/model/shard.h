/* shard.h — one rank's part of a model under tensor parallelism (engine/tp.h).
 *
 * The split (docs/architecture.md "Scale-out", Megatron-style, adapted to FMPQ):
 *   - q, k, v by heads: rank r takes KV heads [r*Hkv/N, (r+1)*Hkv/N) and their query heads
 *     (GQA groups stay whole; ranks may differ by one KV head). Their rows of Wq, Wk, Wv
 *     share the full input's permutation and INT8 blocks, so each rank quantizes the same
 *     activation the one-device model does.
 *   - gate, up by output rows and down by input columns, in the stored FFN order (down's
 *     permutation is folded into gate / up), cut at down's block boundaries: down's
 *     activation blocks stay whole and its leading INT8 blocks stay leading in each shard.
 *     The ranks' down outputs are partial sums, added by one all-reduce.
 *   - o_proj: floating-point (every layer), split by input columns, the rank's heads, like
 *     down_proj, its partial sums added by an all-reduce. Quantized: whole on every rank,
 *     after a gather of every rank's heads: its permutation mixes channels of all heads
 *     into its activation blocks, so a split would need re-quantization; the gather keeps
 *     its activation quantization exactly the one-device one.
 *   - the embedding and lm_head by vocabulary rows (tied or not): a rank embeds the tokens
 *     of its rows and zeros for the others, added by an all-reduce; its lm_head gives its
 *     rows' logits, gathered on rank 0. The norms whole.
 * No weight is re-quantized and no new format is needed: a rank's tensors are rows of the
 * model's (borrowed) or column slices of down_proj (copied).
 */
#ifndef COMET_MODEL_SHARD_H
#define COMET_MODEL_SHARD_H

#include "comet/model.h"

typedef struct comet_shard {
    comet_model m; /* the rank's model: cfg.n_head, n_head_kv, n_ff and n_vocab are the
                    * shard's; tensors borrowed from the full model except the slices */
    int o_split;   /* o_proj holds the shard's heads' input columns only */
    void **owned;  /* down_proj (and o_proj) slices, freed by comet_shard_free */
    int n_owned;
} comet_shard;

/* COMET_OK when m splits over n ranks; else COMET_ERR_INVALID_ARG / COMET_ERR_UNSUPPORTED
 * naming why (fewer KV heads than ranks, fewer down_proj blocks than ranks, a down_proj
 * whose input permutation is not folded into gate / up). */
comet_status comet_shard_check(const comet_model *m, int n);

/* Rank `rank`'s shard of m (borrowed: it must outlive the shard) over n ranks. COMET_OK,
 * the errors of comet_shard_check, COMET_ERR_NOMEM. On failure *s owns nothing. */
comet_status comet_shard_make(const comet_model *m, int n, int rank, comet_shard *s);

void comet_shard_free(comet_shard *s);

/* 1 when m's o_proj splits by input columns (floating-point in every layer), so that no
 * rank needs the other ranks' heads (comet_shard.o_split). */
int comet_shard_o_split(const comet_model *m);

/* The vocabulary rows of each rank: rank r holds col0[r] .. col0[r+1]-1; col0[n] = V.
 * col0 has n + 1 entries. */
void comet_shard_vocab_cols(const comet_model *m, int n, int *col0);

/* The columns of the attention output [T, H*D] each rank computes: col0[r] = D * the first
 * query head of rank r, col0[n] = H*D. col0 has n + 1 entries. */
void comet_shard_att_cols(const comet_model *m, int n, int *col0);

#endif
