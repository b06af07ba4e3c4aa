/* request.c — a serving request's output (request.h): the events sent to its callback,
 * streaming detokenization with stop strings held back, and logprobs. The scheduling of
 * requests (engine.c) calls these; nothing here touches the engine's lists or the KV pool.
 */
#define _GNU_SOURCE
#include "engine/request.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

comet_status req_output_init(req *r, const comet_tokenizer *tok, const comet_request_params *rp) {
    size_t max_stop = 0;
    for (int i = 0; i < rp->n_stop; i++) {
        if (!rp->stop[i] || !rp->stop[i][0])
            return comet_set_error(COMET_ERR_INVALID_ARG,
                                   "request: stop strings must not be empty");
        r->stop[i] = strdup(rp->stop[i]);
        if (!r->stop[i])
            return comet_set_error(COMET_ERR_NOMEM, "request: out of memory");
        r->n_stop = i + 1;
        if (strlen(rp->stop[i]) > max_stop)
            max_stop = strlen(rp->stop[i]);
    }
    r->hold_cap = max_stop + 2 * REQ_PIECE_CAP;
    r->hold = malloc(r->hold_cap);
    r->out = malloc(r->hold_cap);
    if (!r->hold || !r->out)
        return comet_set_error(COMET_ERR_NOMEM, "request: out of memory");
    comet_detok_init(&r->dt, tok);
    return comet_detok_prime(&r->dt, r->tokens, (size_t)r->n_prompt); /* continued */
}

void req_free(req *r) {
    if (!r)
        return;
    free(r->tokens);
    comet_kv_seq_free(&r->seq);
    comet_sampler_free(r->smp);
    for (int i = 0; i < r->n_stop; i++)
        free(r->stop[i]);
    free(r->hold);
    free(r->out);
    free(r);
}

/* ---- events ---- */

void req_emit(req *r, comet_event_kind kind, int32_t tok, int has_lp, float lp, int n_top,
              const int32_t *top_ids, const float *top_lps, const char *text, size_t len) {
    comet_engine_event ev;
    memset(&ev, 0, sizeof ev);
    ev.kind = kind;
    ev.request_id = r->id;
    ev.token = tok;
    ev.has_logprob = has_lp;
    ev.logprob = lp;
    ev.n_top = n_top;
    ev.top_ids = top_ids;
    ev.top_logprobs = top_lps;
    ev.text = text ? text : "";
    ev.text_len = len;
    r->cb(r->user, &ev);
}

void req_emit_finished(req *r, comet_finish_reason why, const char *error, const char *text,
                       size_t len) {
    comet_engine_event ev;
    memset(&ev, 0, sizeof ev);
    ev.kind = COMET_EVENT_FINISHED;
    ev.request_id = r->id;
    ev.finish = why;
    ev.text = text ? text : "";
    ev.text_len = len;
    ev.n_prompt = r->n_prompt;
    ev.n_generated = r->n_generated;
    ev.n_preemptions = r->n_preempt;
    ev.error = error;
    r->cb(r->user, &ev);
}

/* ---- text: stop strings ---- */

/* Append a decoded piece to the held text; release into out[*n_out] what can no longer
 * start a stop string. Returns 1 when a stop string appeared (the text before it is
 * released, the rest dropped). */
static int hold_push(req *r, const char *piece, size_t len, char *out, size_t *n_out) {
    COMET_ASSERT(r->n_hold + len <= r->hold_cap);
    memcpy(r->hold + r->n_hold, piece, len);
    r->n_hold += len;
    *n_out = 0;
    size_t first = r->n_hold;
    for (int i = 0; i < r->n_stop; i++) {
        size_t sl = strlen(r->stop[i]);
        for (size_t at = 0; at + sl <= r->n_hold && at < first; at++)
            if (!memcmp(r->hold + at, r->stop[i], sl)) {
                first = at;
                break;
            }
    }
    if (first < r->n_hold) {
        memcpy(out, r->hold, first);
        *n_out = first;
        r->n_hold = 0;
        return 1;
    }
    size_t keep = 0; /* longest tail that is a proper prefix of a stop string */
    for (int i = 0; i < r->n_stop; i++) {
        size_t sl = strlen(r->stop[i]);
        for (size_t k = sl - 1; k > keep; k--)
            if (k <= r->n_hold && !memcmp(r->hold + r->n_hold - k, r->stop[i], k)) {
                keep = k;
                break;
            }
    }
    *n_out = r->n_hold - keep;
    memcpy(out, r->hold, *n_out);
    memmove(r->hold, r->hold + *n_out, keep);
    r->n_hold = keep;
    return 0;
}

int req_output_token(req *r, int32_t id, int has_lp, float lp, int n_top, const int32_t *top_ids,
                     const float *top_lps) {
    char piece[REQ_PIECE_CAP];
    size_t n_out = 0;
    int len = comet_detok_push(&r->dt, id, piece, sizeof piece);
    int stopped = len > 0 && hold_push(r, piece, (size_t)len, r->out, &n_out);
    req_emit(r, COMET_EVENT_TOKEN, id, has_lp, lp, n_top, top_ids, top_lps, r->out, n_out);
    return stopped;
}

size_t req_output_flush(req *r, int *stopped) {
    char piece[REQ_PIECE_CAP];
    size_t n = 0;
    *stopped = 0;
    int len = comet_detok_flush(&r->dt, piece, sizeof piece);
    if (len > 0 && hold_push(r, piece, (size_t)len, r->out, &n)) {
        *stopped = 1;
        return n;
    }
    memcpy(r->out + n, r->hold, r->n_hold);
    n += r->n_hold;
    r->n_hold = 0;
    return n;
}

/* ---- logprobs ---- */

float req_log_sum_exp(const float *x, int n) {
    float mx = x[0];
    for (int i = 1; i < n; i++)
        if (x[i] > mx)
            mx = x[i];
    double s = 0;
    for (int i = 0; i < n; i++)
        s += exp((double)(x[i] - mx));
    return mx + (float)log(s);
}

void req_top_n(const float *x, int V, int n, int32_t *ids, float *vals) {
    int have = 0;
    for (int i = 0; i < V; i++) {
        if (have == n && x[i] <= vals[n - 1])
            continue;
        int j = have < n ? have++ : n - 1;
        while (j > 0 && vals[j - 1] < x[i]) {
            vals[j] = vals[j - 1];
            ids[j] = ids[j - 1];
            j--;
        }
        vals[j] = x[i];
        ids[j] = i;
    }
}

void req_report_prompt_logprobs(req *r, int V, int p0, int k, const float *rows) {
    int32_t ids[COMET_ENGINE_MAX_TOP];
    float vals[COMET_ENGINE_MAX_TOP];
    if (r->prompt_lp_sent == 0 && p0 == 0) {
        req_emit(r, COMET_EVENT_PROMPT_TOKEN, r->tokens[0], 0, 0, 0, NULL, NULL, NULL, 0);
        r->prompt_lp_sent = 1;
    }
    for (int j = 0; j < k; j++) {
        int t = p0 + j + 1; /* the token row j predicts */
        if (t >= r->n_prompt || t != r->prompt_lp_sent)
            continue;
        const float *x = rows + (size_t)j * V;
        float lse = req_log_sum_exp(x, V);
        int n = r->top_logprobs;
        if (n > 0)
            req_top_n(x, V, n, ids, vals);
        for (int i = 0; i < n; i++)
            vals[i] -= lse;
        req_emit(r, COMET_EVENT_PROMPT_TOKEN, r->tokens[t], 1, x[r->tokens[t]] - lse, n, ids, vals,
                 NULL, 0);
        r->prompt_lp_sent++;
    }
}
