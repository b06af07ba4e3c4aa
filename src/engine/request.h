/* request.h — one request of the serving engine (engine.c) and its output: streaming
 * detokenization, stop strings held back until they cannot start, logprobs, and the events
 * sent to the request's callback (request.c). The scheduling state (KV sequence, tokens
 * computed, preemptions) lives here too, but only engine.c changes it.
 */
#ifndef COMET_ENGINE_REQUEST_H
#define COMET_ENGINE_REQUEST_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "comet/engine.h"
#include "comet/tokenizer.h"
#include "engine/kv_pages.h"
#include "engine/sampler.h"

#define REQ_PIECE_CAP 256 /* bytes one token's text can take */

typedef struct req {
    uint64_t id;
    comet_engine_cb cb;
    void *user;
    int32_t *tokens; /* [cap] prompt, then generated */
    int n_tokens, cap, n_prompt, max_new, n_generated, n_computed;
    int prompt_lp_sent; /* prompt tokens reported (prompt_logprobs) */
    int logprobs, top_logprobs, prompt_logprobs, ignore_eos;
    comet_kv_seq seq;
    comet_sampler *smp;
    comet_detok dt;
    char *stop[COMET_ENGINE_MAX_STOP];
    int n_stop;
    char *hold; /* text held while it may start a stop string */
    char *out;  /* text released by one token [hold_cap] */
    size_t n_hold, hold_cap;
    atomic_int cancel;
    int n_preempt;
} req;

/* The output side of r from rp: stop strings copied (each non-empty), the hold and out
 * buffers, the detokenizer of `tok` primed with r->tokens [n_prompt] (already copied).
 * COMET_OK, COMET_ERR_INVALID_ARG (an empty stop string), COMET_ERR_NOMEM; r keeps what
 * it allocated (req_free releases it). */
comet_status req_output_init(req *r, const comet_tokenizer *tok, const comet_request_params *rp);

/* Release r and all it owns except its KV pages (the engine's pool returns them). NULL is
 * a no-op. */
void req_free(req *r);

/* Send r a PROMPT_TOKEN or TOKEN event (see comet_engine_event; text may be NULL). */
void req_emit(req *r, comet_event_kind kind, int32_t tok, int has_lp, float lp, int n_top,
              const int32_t *top_ids, const float *top_lps, const char *text, size_t len);

/* Send r its FINISHED event with the rest of its text. */
void req_emit_finished(req *r, comet_finish_reason why, const char *error, const char *text,
                       size_t len);

/* Detokenize the generated token id, release into r->out the text that can no longer start
 * a stop string, and send it in a TOKEN event with the logprobs given. Returns 1 when a
 * stop string appeared (the text before it was sent, the rest dropped). */
int req_output_token(req *r, int32_t id, int has_lp, float lp, int n_top, const int32_t *top_ids,
                     const float *top_lps);

/* The text still held (detokenizer tail and stop-string hold) into r->out, at the end of
 * the request; returns its length, and *stopped = 1 when a stop string appeared in it. */
size_t req_output_flush(req *r, int *stopped);

/* log(sum(exp(x))) of x [n], in double. */
float req_log_sum_exp(const float *x, int n);

/* The n best ids of x [V] (descending, lowest id first on ties) into ids / vals [n]. */
void req_top_n(const float *x, int V, int n, int32_t *ids, float *vals);

/* Report r's prompt-token logprobs from the logits rows [k, V] of a chunk starting at
 * position p0 (row j predicts token p0 + j + 1), in order, each once. */
void req_report_prompt_logprobs(req *r, int V, int p0, int k, const float *rows);

#endif
