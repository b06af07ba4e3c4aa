/* tp.h — tensor parallelism: one model split over N ranks of one backend kind, each a
 * thread of this process with its own backend (GPU r = the first backend's GPU + r, or a
 * CPU backend), its shard of the weights (model/shard.h), its KV heads' share of the KV
 * pages, and its forward context; the ranks meet in two collectives per layer (comm.h:
 * NCCL between GPUs, shared memory between CPU ranks).
 *
 * Rank 0 runs on the caller's thread and is the scheduler: the caller builds each step's
 * batch once (host arrays, the same page ids for every rank) and comet_tp_step hands it to
 * the other ranks, which run the same step and return. Rank 0 holds the logits. One rank
 * (N = 1) runs the same path as N ranks, and gives bit for bit the one-device results.
 */
#ifndef COMET_ENGINE_TP_H
#define COMET_ENGINE_TP_H

#include "backend/backend.h"
#include "backend/batch.h"
#include "comet/model.h"
#include "model/forward.h"

typedef struct comet_tp comet_tp;

/* Split m over n ranks, rank 0 on be0 (borrowed; the others are opened here: cuda:(d + r)
 * for be0 on GPU d, else CPU backends like be0, with be0's batch_invariant). Each rank gets
 * workspace for max_batch_tokens tokens and a KV pool of n_pages pages of page_size tokens
 * for its KV heads, in format `kv` (the caller's choice, usually m->kv). m and be0 must
 * outlive the group. COMET_OK and *out;
 * the errors of comet_shard_check, comet_backend_open, comet_forward_init and
 * comet_comm_group_create, named with the rank; COMET_ERR_NOMEM. */
comet_status comet_tp_init(const comet_model *m, comet_backend *be0, int n, int max_batch_tokens,
                           int n_pages, int page_size, comet_kv_format kv, comet_tp **out);

/* Stop the ranks' threads and release everything the group opened. NULL: no-op. */
void comet_tp_free(comet_tp *tp);

/* Rank 0's forward context: its logits buffer (comet_forward_logits) holds each step's full
 * logits rows. */
comet_forward_ctx *comet_tp_rank0(comet_tp *tp);

/* Run one step on every rank, as comet_forward does for one device (same arguments and
 * statuses; logits come from rank 0). The batch is checked once before any rank starts.
 * When a rank fails inside a step, the others stop at their next collective and the first
 * failure is returned, naming its rank; a CPU group can run further steps, a NCCL group,
 * whose communicators are then aborted, answers every later step with COMET_ERR_INTERNAL. */
comet_status comet_tp_step(comet_tp *tp, const comet_batch *b, float *logits);

#endif
