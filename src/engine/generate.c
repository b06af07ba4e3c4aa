/* generate.c — the one-shot generation loop (see generate.h). */
#define _POSIX_C_SOURCE 200809L
#include "engine/generate.h"

#include <stdlib.h>
#include <string.h>

#include "comet/tokenizer.h"
#include "core/clock.h"
#include "engine/runner.h"

#define PIECE_CAP 256

comet_gen_params comet_gen_default_params(void) {
    return (comet_gen_params){
        .max_tokens = 256,
        .sampling = comet_sampler_default_params(),
        .stop = NULL,
        .n_stop = 0,
        .prefill_chunk = 512,
        .ignore_eos = 0,
    };
}

const char *comet_stop_reason_name(comet_stop_reason r) {
    static const char *names[] = {"eos", "stop", "length", "cancelled"};
    return r >= 0 && r < COMET_STOP_REASON_COUNT ? names[r] : "?";
}

/* Text held back from the callback while it may be the start of a stop string. */
typedef struct text_out {
    char *hold;
    size_t n, cap;
    const char *const *stop;
    int n_stop;
    comet_gen_text_fn fn;
    void *user;
    int cancelled;
} text_out;

static void emit(text_out *o, const char *s, size_t n) {
    if (n && !o->cancelled && o->fn && o->fn(s, n, o->user))
        o->cancelled = 1;
}

/* Append a decoded piece; returns 1 when a stop string was found (text before it emitted). */
static int text_push(text_out *o, const char *piece, size_t len) {
    COMET_ASSERT(o->n + len <= o->cap);
    memcpy(o->hold + o->n, piece, len);
    o->n += len;
    if (o->n_stop == 0) {
        emit(o, o->hold, o->n);
        o->n = 0;
        return 0;
    }
    size_t first = o->n;
    for (int i = 0; i < o->n_stop; i++) {
        size_t sl = strlen(o->stop[i]);
        for (size_t at = 0; sl && at + sl <= o->n && at < first; at++)
            if (!memcmp(o->hold + at, o->stop[i], sl)) {
                first = at;
                break;
            }
    }
    if (first < o->n) {
        emit(o, o->hold, first);
        o->n = 0;
        return 1;
    }
    /* keep the longest tail that is a proper prefix of some stop string */
    size_t keep = 0;
    for (int i = 0; i < o->n_stop; i++) {
        size_t sl = strlen(o->stop[i]);
        for (size_t k = sl > 0 ? sl - 1 : 0; k > keep; k--)
            if (k <= o->n && !memcmp(o->hold + o->n - k, o->stop[i], k)) {
                keep = k;
                break;
            }
    }
    emit(o, o->hold, o->n - keep);
    memmove(o->hold, o->hold + o->n - keep, keep);
    o->n = keep;
    return 0;
}

/* The pool is sized for the whole generation, so a full pool is a bug here. */
static comet_status reserve(comet_kv_pool *pool, comet_kv_seq *seq, int n) {
    comet_status st = comet_kv_seq_reserve(pool, seq, n);
    COMET_ASSERT(st != COMET_KV_FULL);
    return st;
}

static int is_eos(const comet_model_config *c, int32_t id) {
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos_ids[i] == id)
            return 1;
    return 0;
}

comet_status comet_generate(const comet_model *m, comet_backend *be, const int32_t *prompt,
                            int n_prompt, const comet_gen_params *p, comet_gen_text_fn on_text,
                            void *user, comet_gen_stats *stats) {
    const comet_model_config *c = &m->cfg;
    const int P = 16;
    if (n_prompt <= 0)
        return comet_set_error(COMET_ERR_INVALID_ARG, "generate: the prompt is empty");
    if (n_prompt >= c->n_ctx)
        return comet_set_error(COMET_ERR_CONTEXT,
                               "generate: the prompt has %d tokens but the model's context holds "
                               "%d (including at least one generated token)",
                               n_prompt, c->n_ctx);
    if (p->max_tokens <= 0 || p->prefill_chunk <= 0)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "generate: max_tokens and prefill_chunk must be positive");
    if (p->tensor_parallel < 0 || p->tensor_parallel > COMET_MAX_TENSOR_PARALLEL)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "generate: tensor_parallel must be 0 (one device) or 1..%d ranks, "
                               "got %d",
                               COMET_MAX_TENSOR_PARALLEL, p->tensor_parallel);
    int max_new = p->max_tokens;
    if (max_new > c->n_ctx - n_prompt)
        max_new = c->n_ctx - n_prompt;
    int max_len = n_prompt + max_new; /* KV positions needed, with one spare */
    int chunk = p->prefill_chunk < n_prompt ? p->prefill_chunk : n_prompt;
    int n_pages = (max_len + P - 1) / P;
    size_t max_stop = 0;
    for (int i = 0; i < p->n_stop; i++)
        if (strlen(p->stop[i]) > max_stop)
            max_stop = strlen(p->stop[i]);

    comet_status st = COMET_OK;
    comet_runner run = {0};
    comet_kv_seq seq = {0};
    comet_sampler *smp = NULL;
    float *logits = malloc((size_t)c->n_vocab * sizeof(float));
    int32_t *hist = malloc((size_t)max_len * sizeof(int32_t));
    text_out out = {.cap = max_stop + 2 * PIECE_CAP,
                    .stop = p->stop,
                    .n_stop = p->n_stop,
                    .fn = on_text,
                    .user = user};
    out.hold = malloc(out.cap);
    if (!logits || !hist || !out.hold) {
        st = comet_set_error(COMET_ERR_NOMEM, "generate: out of memory");
        goto done;
    }
    comet_runner_params rp = {.max_batch_tokens = chunk,
                              .max_seqs = 1,
                              .n_pages = n_pages,
                              .page_size = P,
                              .tensor_parallel = p->tensor_parallel};
    if ((st = comet_runner_init(&run, m, be, &rp)) < 0 ||
        (st = comet_kv_seq_init(&seq, max_len, P)) < 0)
        goto done;
    comet_batch_builder *bb = &run.bb;
    smp = comet_sampler_init(&p->sampling, c->n_vocab);
    if (!smp) {
        st = COMET_ERR_INVALID_ARG; /* bad sampling params (or no memory), named */
        goto done;
    }
    memcpy(hist, prompt, (size_t)n_prompt * sizeof(int32_t));
    comet_gen_stats gs = {.n_prompt = n_prompt, .stop = COMET_STOP_LENGTH};

    double t0 = comet_now_s();
    int32_t id = 0; /* the next token, picked by the step that computed its logits */
    for (int done = 0; done < n_prompt;) {
        int n = n_prompt - done < chunk ? n_prompt - done : chunk;
        int last = done + n == n_prompt;
        comet_runner_draw draw = {smp, hist, n_prompt};
        if ((st = reserve(&run.pool, &seq, n)) < 0)
            goto done;
        comet_batch_builder_reset(bb);
        if ((st = comet_batch_builder_add(bb, &seq, prompt + done, n, last)) < 0 ||
            (st = last ? comet_runner_step_sample(&run, &draw, logits, &id)
                       : comet_runner_step(&run, logits)) < 0)
            goto done;
        done += n;
    }
    comet_detok dt;
    comet_detok_init(&dt, m->tok);
    if ((st = comet_detok_prime(&dt, prompt, (size_t)n_prompt)) < 0) /* text continues it */
        goto done;
    char piece[PIECE_CAP];
    int n_hist = n_prompt;
    double t1 = comet_now_s();
    for (;;) {
        if (id == COMET_SAMPLE_NONFINITE) { /* the row is in `logits`: name its value */
            st = comet_logits_check(logits, c->n_vocab);
            COMET_ASSERT(st < 0);
            goto done;
        }
        hist[n_hist++] = id;
        gs.n_generated++;
        if (gs.n_generated == 1) {
            t1 = comet_now_s();
            gs.prefill_s = t1 - t0;
        }
        if (!p->ignore_eos && is_eos(c, id)) {
            gs.stop = COMET_STOP_EOS;
            break;
        }
        int len = comet_detok_push(&dt, id, piece, sizeof piece);
        if (len > 0 && text_push(&out, piece, (size_t)len)) {
            gs.stop = COMET_STOP_STRING;
            break;
        }
        if (out.cancelled) {
            gs.stop = COMET_STOP_CANCELLED;
            break;
        }
        if (gs.n_generated >= max_new)
            break;
        if ((st = reserve(&run.pool, &seq, 1)) < 0)
            goto done;
        comet_batch_builder_reset(bb);
        comet_runner_draw draw = {smp, hist, n_hist};
        if ((st = comet_batch_builder_add(bb, &seq, &id, 1, 1)) < 0 ||
            (st = comet_runner_step_sample(&run, &draw, logits, &id)) < 0)
            goto done;
        gs.n_decode_steps++;
    }
    if (gs.stop != COMET_STOP_STRING && gs.stop != COMET_STOP_CANCELLED) {
        int len = comet_detok_flush(&dt, piece, sizeof piece);
        if (len > 0 && text_push(&out, piece, (size_t)len))
            gs.stop = COMET_STOP_STRING;
        if (gs.stop != COMET_STOP_STRING)
            emit(&out, out.hold, out.n); /* the end: held text cannot start a stop any more */
    }
    gs.decode_s = comet_now_s() - t1;
    if (stats)
        *stats = gs;
    st = COMET_OK;
done:
    comet_sampler_free(smp);
    comet_kv_seq_free(&seq);
    comet_runner_free(&run);
    free(out.hold);
    free(hist);
    free(logits);
    return st;
}
