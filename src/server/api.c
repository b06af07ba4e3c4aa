/* api.c — completions and chat completions over the engine (see api.h).
 *
 * Each request gets a `gen` shared by the engine callback (engine thread) and the HTTP
 * connection thread, with a reference count of two: whichever side lets go last frees it.
 * The callback only appends text and token records under the gen's mutex; JSON is built
 * on the connection thread.
 */
#define _GNU_SOURCE
#include "server/api.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comet/log.h"
#include "core/clock.h"

typedef struct tok_rec {
    int32_t id;
    int has_lp;
    float lp;
    int n_top;
    int32_t top_ids[COMET_ENGINE_MAX_TOP];
    float top_lps[COMET_ENGINE_MAX_TOP];
} tok_rec;

typedef struct recs {
    tok_rec *v;
    int n, cap;
} recs;

typedef enum stage {
    ST_FIRST,
    ST_BODY,
    ST_USAGE,
    ST_DONE_LINE,
    ST_END
} stage;

typedef struct gen {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;
    comet_api *api;
    comet_server *srv;
    comet_oai_request req;
    uint64_t rid;
    char id[64];
    long created;
    double t0, t_first, t_last;
    char *prompt_text; /* echo: the prompt as text */
    size_t prompt_text_len;
    /* filled by the engine callback */
    char *text;
    size_t text_len, text_cap;
    recs gen_recs, prompt_recs;
    comet_detok lp_dt; /* logprobs token strings: where they stand in the text */
    int finished;
    comet_finish_reason why;
    char error[256];
    int n_prompt, n_generated;
    int n_prompt_submitted;
    int oom;
    int client_gone; /* the client disconnected before the answer was delivered */
    /* stream state (connection thread) */
    stage st;
    size_t sent_text;
    int sent_recs;
    int sent_chars; /* streamed logprobs: characters of the choice text before the next
                     * record (its text_offset) */
    char *out;
    size_t out_len, out_off;
} gen;

comet_status comet_api_init(comet_api *a, comet_engine *e, const comet_model *m,
                            const char *model_id, const char *template_name) {
    memset(a, 0, sizeof *a);
    a->engine = e;
    a->model = m;
    a->model_id = model_id;
    a->chat = comet_chat_init(m->chat_template, template_name);
    if (!a->chat && (template_name || (m->chat_template && *m->chat_template)))
        return comet_last_status();
    a->has_tmpl = a->chat != NULL;
    if (a->chat)
        comet_log(COMET_LOG_INFO, "chat template: %s", comet_chat_describe(a->chat));
    if (m->cfg.bos_id >= 0) {
        int n = comet_tokenizer_token_bytes(m->tok, m->cfg.bos_id, 1, a->bos, sizeof a->bos - 1);
        a->bos[n > 0 && n < (int)sizeof a->bos ? n : 0] = '\0';
    }
    if (m->cfg.n_eos > 0) {
        int n = comet_tokenizer_token_bytes(m->tok, m->cfg.eos_ids[0], 1, a->eos, sizeof a->eos - 1);
        a->eos[n > 0 && n < (int)sizeof a->eos ? n : 0] = '\0';
    }
    return COMET_OK;
}

void comet_api_free(comet_api *a) {
    comet_chat_free(a->chat);
    a->chat = NULL;
    a->has_tmpl = 0;
}

void comet_api_gauges(void *user, comet_metrics_gauges *g) {
    comet_api *a = user;
    comet_engine_stats s;
    comet_engine_get_stats(a->engine, &s);
    g->requests_running = s.running;
    g->requests_waiting = s.waiting;
    g->kv_pages_used = s.pages_used;
    g->kv_pages_free = s.pages_free;
    g->preemptions = s.preemptions;
}

/* ---- gen lifetime ---- */

static void gen_unref(gen *g) {
    pthread_mutex_lock(&g->mu);
    int left = --g->refs;
    pthread_mutex_unlock(&g->mu);
    if (left)
        return;
    comet_oai_request_free(&g->req);
    free(g->prompt_text);
    free(g->text);
    free(g->gen_recs.v);
    free(g->prompt_recs.v);
    free(g->out);
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

static int recs_push(recs *r, const comet_engine_event *ev) {
    if (r->n == r->cap) {
        int cap = r->cap ? r->cap * 2 : 32;
        tok_rec *v = realloc(r->v, (size_t)cap * sizeof *v);
        if (!v)
            return -1;
        r->v = v;
        r->cap = cap;
    }
    tok_rec *t = &r->v[r->n++];
    t->id = ev->token;
    t->has_lp = ev->has_logprob;
    t->lp = ev->logprob;
    t->n_top = ev->n_top;
    if (ev->n_top) {
        memcpy(t->top_ids, ev->top_ids, (size_t)ev->n_top * sizeof(int32_t));
        memcpy(t->top_lps, ev->top_logprobs, (size_t)ev->n_top * sizeof(float));
    }
    return 0;
}

static void on_event(void *user, const comet_engine_event *ev) {
    gen *g = user;
    pthread_mutex_lock(&g->mu);
    if (ev->text_len) {
        if (g->text_len + ev->text_len + 1 > g->text_cap) {
            size_t cap = (g->text_cap + ev->text_len + 1) * 2;
            char *t = realloc(g->text, cap);
            if (t) {
                g->text = t;
                g->text_cap = cap;
            }
        }
        if (g->text_len + ev->text_len + 1 <= g->text_cap) {
            memcpy(g->text + g->text_len, ev->text, ev->text_len);
            g->text_len += ev->text_len;
            g->text[g->text_len] = '\0';
        } else {
            g->oom = 1;
        }
    }
    if (ev->kind == COMET_EVENT_TOKEN) {
        if (g->t_first == 0)
            g->t_first = comet_now_s();
        g->t_last = comet_now_s();
        if (g->req.logprobs && recs_push(&g->gen_recs, ev))
            g->oom = 1;
    } else if (ev->kind == COMET_EVENT_PROMPT_TOKEN) {
        if (recs_push(&g->prompt_recs, ev))
            g->oom = 1;
    } else if (ev->kind == COMET_EVENT_FINISHED) {
        g->finished = 1;
        g->why = ev->finish;
        g->n_prompt = ev->n_prompt;
        g->n_generated = ev->n_generated;
        if (ev->error)
            snprintf(g->error, sizeof g->error, "%s", ev->error);
        if (g->t_last == 0)
            g->t_last = comet_now_s();
    }
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    if (ev->kind == COMET_EVENT_FINISHED)
        gen_unref(g);
}

/* ---- prompt ---- */

/* BOS prepended to tok[0..n) when the model wants one (as `comet generate` does); takes
 * ownership of tok. */
static comet_status with_bos(const comet_model *m, int32_t *tok, size_t n, int32_t **ids,
                             int *n_ids) {
    if (m->cfg.add_bos && m->cfg.bos_id >= 0 && (n == 0 || tok[0] != m->cfg.bos_id)) {
        int32_t *t2 = malloc((n + 1) * sizeof *t2);
        if (!t2) {
            free(tok);
            return comet_set_error(COMET_ERR_NOMEM, "out of memory");
        }
        t2[0] = m->cfg.bos_id;
        memcpy(t2 + 1, tok, n * sizeof *tok);
        free(tok);
        tok = t2;
        n++;
    }
    *ids = tok;
    *n_ids = (int)n;
    return COMET_OK;
}

/* A completions prompt, like `comet generate --raw`: special-token text parsed. */
static comet_status tokenize(const comet_model *m, const char *text, int32_t **ids, int *n_ids) {
    size_t n = 0;
    int32_t *tok = NULL;
    COMET_TRY(comet_tokenizer_encode(m->tok, text, strlen(text), 1, &tok, &n));
    return with_bos(m, tok, n, ids, n_ids);
}

/* The chat prompt of messages (and, for Jinja templates, their JSON and the tools). */
static comet_status chat_prompt(const comet_api *a, const comet_chat_message *msgs,
                                size_t n_msgs, const char *messages_json, const char *tools_json,
                                int32_t **ids, int *n_ids) {
    const comet_model *m = a->model;
    size_t n = 0;
    int32_t *tok = NULL;
    COMET_TRY(comet_chat_build(a->chat, m->tok, msgs, n_msgs, messages_json, tools_json, 1,
                               a->bos[0] ? a->bos : NULL, a->eos[0] ? a->eos : NULL,
                               a->allow_special_in_messages, NULL, &tok, &n));
    return with_bos(m, tok, n, ids, n_ids);
}

comet_status comet_api_chat_prompt(const comet_api *a, const comet_chat_message *msgs,
                                   size_t n_msgs, int32_t **ids, int *n_ids) {
    return chat_prompt(a, msgs, n_msgs, NULL, NULL, ids, n_ids);
}

/* Text of a token as it appears in output at the point `d` of the text (special tokens
 * rendered; SPM's dummy-prefix space dropped from the text's first token). malloc'd. */
static char *token_text(const comet_detok *d, int32_t id, size_t *len) {
    char buf[256];
    int n = comet_detok_piece(d, id, 1, buf, sizeof buf);
    if (n < 0)
        n = 0;
    char *s = malloc((size_t)n + 1);
    if (!s)
        return NULL;
    if (n > (int)sizeof buf) {
        comet_detok_piece(d, id, 1, s, (size_t)n + 1);
    } else {
        memcpy(s, buf, (size_t)n);
    }
    s[n] = '\0';
    *len = (size_t)n;
    return s;
}

/* ---- logprobs to builder records ---- */

typedef struct lp_view {
    comet_oai_token_lp *lps;
    comet_oai_top *tops;
    char **strs;
    int n, n_strs;
    int end_offset; /* the text_offset after the last record */
} lp_view;

/* Unicode code points whose first byte lies in s[0..n): the unit of text_offset, as the
 * OpenAI API counts positions in `text` (a token that ends inside a character counts it). */
static int utf8_chars(const char *s, size_t n) {
    int c = 0;
    for (size_t i = 0; i < n; i++)
        c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

static void lp_view_free(lp_view *v) {
    for (int i = 0; i < v->n_strs; i++)
        free(v->strs[i]);
    free(v->strs);
    free(v->lps);
    free(v->tops);
    memset(v, 0, sizeof *v);
}

/* Records a[0..na) then b[0..nb) as builder entries; text offsets, in characters (code
 * points), start at `offset`; v->end_offset is the offset after the last. The token
 * strings follow the text from `d`, which moves past the records. */
static int lp_view_build(lp_view *v, comet_detok *d, const tok_rec *a, int na, const tok_rec *b,
                         int nb, int offset) {
    memset(v, 0, sizeof *v);
    int n = na + nb;
    v->lps = calloc((size_t)n + 1, sizeof *v->lps);
    v->tops = calloc((size_t)n * COMET_ENGINE_MAX_TOP + 1, sizeof *v->tops);
    v->strs = calloc((size_t)n * (COMET_ENGINE_MAX_TOP + 1) + 1, sizeof *v->strs);
    if (!v->lps || !v->tops || !v->strs) {
        lp_view_free(v);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        const tok_rec *t = i < na ? &a[i] : &b[i - na];
        comet_oai_token_lp *o = &v->lps[i];
        char *s = token_text(d, t->id, &o->len);
        if (!s) {
            lp_view_free(v);
            return -1;
        }
        v->strs[v->n_strs++] = s;
        o->text = s;
        o->has_lp = t->has_lp;
        o->logprob = t->lp;
        o->text_offset = offset;
        offset += utf8_chars(s, o->len);
        o->n_top = t->n_top;
        o->top = v->tops + (size_t)i * COMET_ENGINE_MAX_TOP;
        for (int k = 0; k < t->n_top; k++) {
            comet_oai_top *tp = &v->tops[(size_t)i * COMET_ENGINE_MAX_TOP + k];
            char *ts = token_text(d, t->top_ids[k], &tp->len);
            if (!ts) {
                lp_view_free(v);
                return -1;
            }
            v->strs[v->n_strs++] = ts;
            tp->text = ts;
            tp->logprob = t->top_lps[k];
        }
        comet_detok_prime(d, &t->id, 1);
    }
    v->n = n;
    v->end_offset = offset;
    return 0;
}

static const char *finish_name(comet_finish_reason r) {
    return r == COMET_FINISH_STOP ? "stop" : "length";
}

/* Record the finished request in the server's metrics. */
static void record(gen *g, int status) {
    double ttft = g->t_first > 0 ? g->t_first - g->t0 : -1;
    double tpot =
        g->n_generated > 1 && g->t_first > 0 ? (g->t_last - g->t_first) / (g->n_generated - 1) : -1;
    double e2e = g->t_last > 0 ? g->t_last - g->t0 : -1;
    comet_server_metrics_record(comet_server_metrics_get(g->srv), status, g->n_prompt,
                                g->n_generated, ttft, tpot, e2e);
    /* one line per finished request (INFO: shown without --verbose) */
    const char *why = status == 200                      ? finish_name(g->why)
                      : g->client_gone                   ? "client_gone"
                      : g->why == COMET_FINISH_CANCELLED ? "cancelled"
                                                         : "error";
    char ttft_s[32];
    if (ttft >= 0)
        snprintf(ttft_s, sizeof ttft_s, "%.3f s", ttft);
    else
        snprintf(ttft_s, sizeof ttft_s, "-");
    comet_log(COMET_LOG_INFO,
              "%s: %d prompt + %d completion tokens, ttft %s, total %.3f s, "
              "finish %s",
              g->id, g->n_prompt, g->n_generated, ttft_s, comet_now_s() - g->t0, why);
}

/* ---- non-streaming ---- */

static void answer_whole(gen *g, comet_server_reply *reply) {
    pthread_mutex_lock(&g->mu);
    int cancelled = 0;
    while (!g->finished) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 250 * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&g->cv, &g->mu, &until);
        if (!g->finished && !cancelled && reply->client_gone && reply->client_gone(reply->client)) {
            /* nobody will read the answer: free the request's pages now */
            cancelled = 1;
            g->client_gone = 1;
            comet_engine_cancel(g->api->engine, g->rid);
        }
    }
    pthread_mutex_unlock(&g->mu);
    if (cancelled) {
        reply->status = 499; /* client closed request; never delivered */
        reply->body = comet_server_error_body(499, NULL, "client_closed", "the client went away");
        record(g, -1);
        return;
    }
    /* the engine is done with g: no lock needed below */
    if (g->why == COMET_FINISH_ERROR || g->oom) {
        reply->status = 500;
        reply->body = comet_server_error_body(500, NULL, NULL, "generation failed: %s",
                                              g->oom ? "out of memory" : g->error);
        record(g, 500);
        return;
    }
    if (g->why == COMET_FINISH_CANCELLED) {
        reply->status = 503;
        reply->body = comet_server_error_body(503, NULL, "shutting_down",
                                              "the server is shutting down; retry elsewhere");
        record(g, 503);
        return;
    }
    comet_oai_request *q = &g->req;
    int echo = q->kind == COMET_OAI_COMPLETION && q->echo;
    size_t pre = echo ? g->prompt_text_len : 0;
    char *text = malloc(pre + g->text_len + 1);
    lp_view v;
    memset(&v, 0, sizeof v);
    int lp_ok = 0;
    if (text && q->logprobs)
        lp_ok = !lp_view_build(&v, &g->lp_dt, g->prompt_recs.v, echo ? g->prompt_recs.n : 0,
                               g->gen_recs.v, g->gen_recs.n, 0);
    if (!text || (q->logprobs && !lp_ok)) {
        free(text);
        reply->status = 500;
        reply->body = comet_server_error_body(500, NULL, NULL, "out of memory");
        record(g, 500);
        return;
    }
    if (pre)
        memcpy(text, g->prompt_text, pre);
    if (g->text_len)
        memcpy(text + pre, g->text, g->text_len);
    comet_oai_result r = {g->id,
                          g->created,
                          g->api->model_id,
                          text,
                          pre + g->text_len,
                          finish_name(g->why),
                          q->logprobs ? v.lps : NULL,
                          v.n,
                          {g->n_prompt, g->n_generated}};
    reply->status = 200;
    reply->body = comet_oai_response_json(q->kind, &r);
    free(text);
    lp_view_free(&v);
    record(g, 200);
}

/* ---- streaming ---- */

static int out_append(gen *g, const char *s, size_t n) {
    char *o = realloc(g->out, g->out_len + n + 1);
    if (!o)
        return -1;
    g->out = o;
    memcpy(g->out + g->out_len, s, n);
    g->out_len += n;
    g->out[g->out_len] = '\0';
    return 0;
}

static int out_event(gen *g, char *json) {
    if (!json)
        return -1;
    int r =
        out_append(g, "data: ", 6) || out_append(g, json, strlen(json)) || out_append(g, "\n\n", 2);
    free(json);
    return r ? -1 : 0;
}

/* Produce the next SSE events into g->out. Returns 0, or -1 at the end of the stream. */
static int stream_fill(gen *g) {
    comet_oai_request *q = &g->req;
    comet_oai_chunk k;
    memset(&k, 0, sizeof k);
    k.id = g->id;
    k.created = g->created;
    k.model = g->api->model_id;
    k.usage_null = q->include_usage;
    if (g->st == ST_END)
        return -1;
    if (g->st == ST_FIRST) {
        /* chat: the role chunk; completions with echo: the prompt (and its logprobs) */
        g->st = ST_BODY;
        if (q->kind == COMET_OAI_CHAT) {
            k.first = 1;
            k.text = "";
            return out_event(g, comet_oai_chunk_json(q->kind, &k));
        }
        if (q->echo) {
            /* the prompt first, with its logprobs (they arrive with the prefill) */
            lp_view v;
            memset(&v, 0, sizeof v);
            pthread_mutex_lock(&g->mu);
            while (q->logprobs && !g->finished && g->prompt_recs.n < g->n_prompt_submitted)
                pthread_cond_wait(&g->cv, &g->mu);
            int bad = q->logprobs &&
                      lp_view_build(&v, &g->lp_dt, g->prompt_recs.v, g->prompt_recs.n, NULL, 0, 0);
            /* the generated tokens' offsets continue after the echoed prompt */
            g->sent_chars = q->logprobs && !bad ? v.end_offset : 0;
            pthread_mutex_unlock(&g->mu);
            k.text = g->prompt_text;
            k.text_len = g->prompt_text_len;
            k.lps = q->logprobs && !bad ? v.lps : NULL;
            k.n_lps = k.lps ? v.n : 0;
            int r = out_event(g, comet_oai_chunk_json(q->kind, &k));
            lp_view_free(&v);
            return r;
        }
        return 0;
    }
    if (g->st == ST_BODY) {
        pthread_mutex_lock(&g->mu);
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 1;
        while (!g->finished && g->text_len == g->sent_text && g->gen_recs.n == g->sent_recs) {
            if (pthread_cond_timedwait(&g->cv, &g->mu, &until)) {
                pthread_mutex_unlock(&g->mu);
                /* an SSE comment: lets a vanished client be noticed while we wait */
                return out_append(g, ": keep-alive\n\n", 14);
            }
        }
        int fin = g->finished;
        lp_view v;
        memset(&v, 0, sizeof v);
        int n_new = g->gen_recs.n - g->sent_recs;
        int bad = q->logprobs && n_new > 0 &&
                  lp_view_build(&v, &g->lp_dt, NULL, 0, g->gen_recs.v + g->sent_recs, n_new,
                                g->sent_chars);
        if (q->logprobs && n_new > 0 && !bad)
            g->sent_chars = v.end_offset;
        if (g->text_len > g->sent_text || n_new > 0) {
            k.text = g->text ? g->text + g->sent_text : "";
            k.text_len = g->text_len - g->sent_text;
            k.lps = q->logprobs && !bad ? v.lps : NULL;
            k.n_lps = k.lps ? v.n : 0;
            if (out_event(g, comet_oai_chunk_json(q->kind, &k)))
                bad = 1;
            g->sent_text = g->text_len;
            g->sent_recs = g->gen_recs.n;
        }
        pthread_mutex_unlock(&g->mu);
        lp_view_free(&v);
        if (bad)
            return -1;
        if (fin) {
            if (g->why == COMET_FINISH_ERROR || g->why == COMET_FINISH_CANCELLED || g->oom) {
                char *e = comet_server_error_body(500, NULL, NULL, "generation ended: %s",
                                                  g->oom ? "out of memory"
                                                  : g->why == COMET_FINISH_CANCELLED ? "cancelled"
                                                                                     : g->error);
                out_event(g, e);
                g->st = ST_DONE_LINE;
                return 0;
            }
            k.text = "";
            k.text_len = 0;
            k.lps = NULL;
            k.n_lps = 0;
            k.finish_reason = finish_name(g->why);
            if (out_event(g, comet_oai_chunk_json(q->kind, &k)))
                return -1;
            g->st = q->include_usage ? ST_USAGE : ST_DONE_LINE;
        }
        return 0;
    }
    if (g->st == ST_USAGE) {
        comet_oai_usage u = {g->n_prompt, g->n_generated};
        k.usage = &u;
        g->st = ST_DONE_LINE;
        return out_event(g, comet_oai_chunk_json(q->kind, &k));
    }
    g->st = ST_END;
    return out_append(g, "data: [DONE]\n\n", 14);
}

static ssize_t stream_read(void *ctx, char *buf, size_t max) {
    gen *g = ctx;
    while (g->out_off >= g->out_len) {
        g->out_len = g->out_off = 0;
        if (stream_fill(g) < 0)
            return -1;
    }
    size_t n = g->out_len - g->out_off;
    if (n > max)
        n = max;
    memcpy(buf, g->out + g->out_off, n);
    g->out_off += n;
    return (ssize_t)n;
}

static void stream_close(void *ctx, int finished) {
    gen *g = ctx;
    if (!finished) { /* the client went away: free the request's pages now */
        g->client_gone = 1;
        comet_engine_cancel(g->api->engine, g->rid);
    }
    pthread_mutex_lock(&g->mu);
    while (!g->finished)
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
    int ok = finished && g->why != COMET_FINISH_ERROR && g->why != COMET_FINISH_CANCELLED;
    record(g, ok ? 200 : g->why == COMET_FINISH_CANCELLED || !finished ? -1 : 500);
    gen_unref(g);
}

/* The prompt's text for echo: the request's text, or its ids decoded. */
static char *prompt_as_text(const comet_model *m, const comet_oai_request *q, size_t *len) {
    if (q->prompt) {
        *len = strlen(q->prompt);
        return strdup(q->prompt);
    }
    size_t cap = 64, n = 0;
    char *s = malloc(cap);
    comet_detok d; /* the ids' strings as echo's logprobs give them */
    comet_detok_init(&d, m->tok);
    for (int i = 0; s && i < q->n_prompt_ids; i++) {
        size_t tl;
        char *t = token_text(&d, q->prompt_ids[i], &tl);
        comet_detok_prime(&d, &q->prompt_ids[i], 1);
        if (!t) {
            free(s);
            return NULL;
        }
        if (n + tl + 1 > cap) {
            cap = (n + tl + 1) * 2;
            char *s2 = realloc(s, cap);
            if (!s2) {
                free(t);
                free(s);
                return NULL;
            }
            s = s2;
        }
        memcpy(s + n, t, tl);
        n += tl;
        free(t);
    }
    if (s)
        s[n] = '\0';
    *len = n;
    return s;
}

static void reply_error(comet_server_reply *reply, comet_server *srv, int status, const char *param,
                        const char *code, const char *msg) {
    reply->status = status;
    reply->body = comet_server_error_body(status, param, code, "%s", msg);
    comet_server_metrics_record(comet_server_metrics_get(srv), status, 0, 0, -1, -1, -1);
}

void comet_api_generate(void *user, comet_server *srv, comet_oai_request *req,
                        comet_server_reply *reply) {
    comet_api *a = user;
    const comet_model *m = a->model;
    int32_t *ids = NULL;
    int n_ids = 0;
    const char *prompt_param = req->kind == COMET_OAI_CHAT ? "messages" : "prompt";
    char msg[512];

    /* prompt tokens */
    if (req->kind == COMET_OAI_CHAT) {
        if (!a->has_tmpl) {
            reply_error(reply, srv, 400, "messages", NULL,
                        "this model has no chat template the server knows; use /v1/completions "
                        "or start the server with --chat-template");
            comet_oai_request_free(req);
            return;
        }
        if (chat_prompt(a, req->messages, (size_t)req->n_messages, req->messages_json,
                        req->tools_json, &ids, &n_ids) < 0) {
            /* the template refused the conversation (raise_exception) or a bad message */
            reply_error(reply, srv, 400, "messages", NULL, comet_last_error());
            comet_oai_request_free(req);
            return;
        }
    } else if (req->prompt) {
        comet_status st = tokenize(m, req->prompt, &ids, &n_ids);
        if (st < 0) {
            /* a tokenizer without a vocabulary refuses text: the client's to fix */
            if (st == COMET_ERR_INVALID_ARG)
                reply_error(reply, srv, 400, "prompt", NULL, comet_last_error());
            else
                reply_error(reply, srv, 500, NULL, NULL, "cannot tokenize the prompt");
            comet_oai_request_free(req);
            return;
        }
    } else {
        ids = malloc((size_t)req->n_prompt_ids * sizeof *ids);
        if (ids)
            memcpy(ids, req->prompt_ids, (size_t)req->n_prompt_ids * sizeof *ids);
        n_ids = req->n_prompt_ids;
    }
    int n_ctx = m->cfg.n_ctx;
    if (!ids || n_ids == 0) {
        reply_error(reply, srv, 400, prompt_param, NULL,
                    ids ? "the prompt is empty: give at least one token of text" : "out of memory");
        free(ids);
        comet_oai_request_free(req);
        return;
    }
    /* a default max_tokens (not the request's) is cut to what the context and the KV pool
     * leave; a request's own max_tokens that does not fit is refused */
    int room = a->kv_tokens > 0 && a->kv_tokens < n_ctx ? a->kv_tokens : n_ctx;
    if (!req->max_tokens_given && req->max_tokens > 0 && n_ids < room &&
        n_ids + req->max_tokens > room)
        req->max_tokens = room - n_ids;
    if (n_ids >= n_ctx || (req->max_tokens > 0 && n_ids + req->max_tokens > n_ctx)) {
        if (req->max_tokens > 0)
            snprintf(msg, sizeof msg,
                     "This model's maximum context length is %d tokens. However, you requested "
                     "%d tokens (%d in the %s, %d for the completion). Please reduce the length "
                     "of the %s or the completion.",
                     n_ctx, n_ids + req->max_tokens, n_ids, prompt_param, req->max_tokens,
                     prompt_param);
        else
            snprintf(msg, sizeof msg,
                     "This model's maximum context length is %d tokens. However, your %s has %d "
                     "tokens. Please reduce the length of the %s.",
                     n_ctx, prompt_param, n_ids, prompt_param);
        reply_error(reply, srv, 400, prompt_param, "context_length_exceeded", msg);
        free(ids);
        comet_oai_request_free(req);
        return;
    }

    gen *g = calloc(1, sizeof *g);
    if (!g) {
        reply_error(reply, srv, 500, NULL, NULL, "out of memory");
        free(ids);
        comet_oai_request_free(req);
        return;
    }
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->refs = 1;
    g->api = a;
    g->srv = srv;
    g->req = *req; /* takes ownership */
    memset(req, 0, sizeof *req);
    g->t0 = comet_now_s();
    g->created = (long)time(NULL);
    g->n_prompt = n_ids;
    g->n_prompt_submitted = n_ids;
    static unsigned long long counter;
    unsigned long long serial = __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED);
    snprintf(g->id, sizeof g->id, "%s-%llx%06llx",
             g->req.kind == COMET_OAI_CHAT ? "chatcmpl" : "cmpl", (unsigned long long)g->created,
             serial);
    comet_oai_request *q = &g->req;
    if (q->kind == COMET_OAI_COMPLETION && q->echo) {
        g->prompt_text = prompt_as_text(m, q, &g->prompt_text_len);
        if (!g->prompt_text) {
            reply_error(reply, srv, 500, NULL, NULL, "out of memory");
            free(ids);
            gen_unref(g);
            return;
        }
    }

    comet_request_params rp = comet_request_default_params();
    rp.prompt = ids;
    rp.n_prompt = n_ids;
    rp.max_tokens = q->max_tokens >= 0 ? q->max_tokens : 0; /* -1: up to the context */
    rp.sampling = q->sampling; /* logit_bias: borrowed, the engine copies it */
    rp.has_seed = (q->given & COMET_SAMPLER_SEED) != 0;
    rp.stop = (const char *const *)q->stop;
    rp.n_stop = q->n_stop;
    rp.logprobs = q->logprobs;
    rp.ignore_eos = q->ignore_eos;
    rp.top_logprobs = q->top_logprobs;
    rp.prompt_logprobs = q->kind == COMET_OAI_COMPLETION && q->echo && q->logprobs;
    comet_detok_init(&g->lp_dt, m->tok); /* echo's logprobs start at the prompt's first token */
    if (!rp.prompt_logprobs)
        comet_detok_prime(&g->lp_dt, ids, (size_t)n_ids);
    if (q->max_tokens == 0 && !rp.prompt_logprobs) {
        /* echo without logprobs and nothing to generate: the answer is the prompt */
        g->finished = 1;
        g->why = COMET_FINISH_LENGTH;
        g->t_last = comet_now_s();
        free(ids);
        if (q->stream) {
            g->refs = 1;
            reply->stream = (comet_server_stream){stream_read, stream_close, g};
        } else {
            answer_whole(g, reply);
            gen_unref(g);
        }
        return;
    }
    g->refs = 2; /* the engine's reference goes with its FINISHED event */
    comet_status st = comet_engine_submit(a->engine, &rp, on_event, g, &g->rid);
    free(ids);
    if (st != COMET_OK) {
        g->refs = 1;
        if (st == COMET_QUEUE_FULL)
            reply_error(reply, srv, 503, NULL, "queue_full",
                        "the server's request queue is full; retry later");
        else if (st == COMET_ERR_CONTEXT)
            reply_error(reply, srv, 400, prompt_param, "context_length_exceeded",
                        comet_last_error());
        else
            reply_error(reply, srv, st == COMET_ERR_INVALID_ARG ? 400 : 500, NULL, NULL,
                        comet_last_error());
        gen_unref(g);
        return;
    }
    if (q->stream) {
        reply->stream = (comet_server_stream){stream_read, stream_close, g};
        return;
    }
    answer_whole(g, reply);
    gen_unref(g);
}
