/* test_spm_space.c — SentencePiece's dummy-prefix space belongs to the start of the whole
 * text, not to the start of each generation. A tiny one-layer LLaMA GGUF is written here on
 * a small SPM vocabulary (scores, "▁" for spaces, <0x0A> byte fallback), with weights set
 * so that greedy decoding always emits "▁c". Checked: the streaming detokenizer primed
 * with a prompt keeps the space of the next piece, and only the text's first piece loses
 * it; `comet_generate`, the engine and the server's completions (plain, streamed, echo
 * with logprobs, token-id prompts) all give prompt text + completion text ==
 * decode(prompt ids + generated ids); echo's token strings join to the text, the lone
 * dummy-prefix token "▁" being "". */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cmocka.h>
#include <cjson/cJSON.h>

#include "backend/backend.h"
#include "comet/engine.h"
#include "comet/model.h"
#include "comet/tokenizer.h"
#include "engine/generate.h"
#include "server/api.h"
#include "server/server.h"
#include "test_util.h"

/* ---- the model --------------------------------------------------------------------- */

enum {
    T_UNK,
    T_BOS,
    T_EOS,
    T_SP,
    T_A,
    T_B,
    T_C,
    T_SA,
    T_SB,
    T_SC,
    T_NL,
    T_ONE,
    T_DOT,
    V
};
static const char *const VOCAB[V] = {"<unk>",
                                     "<s>",
                                     "</s>",
                                     "\xe2\x96\x81",
                                     "a",
                                     "b",
                                     "c",
                                     "\xe2\x96\x81"
                                     "a",
                                     "\xe2\x96\x81"
                                     "b",
                                     "\xe2\x96\x81"
                                     "c",
                                     "<0x0A>",
                                     "1",
                                     "."};
static const int32_t TYPES[V] = {2, 3, 3, 1, 1, 1, 1, 1, 1, 1, 6, 1, 1};
#define X T_SC /* the token greedy decoding always picks */

static comet_model *model;

static void kv_arr_num(gbuf *b, const char *k, uint32_t type, int n, const void *v) {
    gb_str(b, k);
    gb_u32(b, 9);
    gb_u32(b, type);
    gb_u64(b, (uint64_t)n);
    gb_put(b, v, (size_t)n * 4);
}

/* As /work/shared/repro/mk_tiny_models.py: attention and FFN zero, every embedding starts
 * with 10, output row X with 100, so the logit of X dominates at every position. */
static void write_model(const char *path) {
    enum {
        C = 32,
        H = 4,
        HKV = 2,
        D = 8,
        F = 64
    };
    float scores[V];
    for (int i = 0; i < V; i++)
        scores[i] = -(float)i;
    gbuf b = {0};
    const char *tn[] = {
        "token_embd.weight",      "output_norm.weight",       "output.weight",
        "blk.0.attn_norm.weight", "blk.0.attn_q.weight",      "blk.0.attn_k.weight",
        "blk.0.attn_v.weight",    "blk.0.attn_output.weight", "blk.0.ffn_norm.weight",
        "blk.0.ffn_gate.weight",  "blk.0.ffn_up.weight",      "blk.0.ffn_down.weight"};
    const uint64_t ne[][2] = {{C, V},       {C, 0},     {C, V}, {C, 0}, {C, H * D}, {C, HKV * D},
                              {C, HKV * D}, {H * D, C}, {C, 0}, {C, F}, {C, F},     {F, C}};
    enum {
        NT = 12
    };
    gb_header(&b, 3, NT, 17);
    kv_str(&b, "general.architecture", "llama");
    kv_u32(&b, "llama.block_count", 1);
    kv_u32(&b, "llama.context_length", 256);
    kv_u32(&b, "llama.embedding_length", C);
    kv_u32(&b, "llama.feed_forward_length", F);
    kv_u32(&b, "llama.attention.head_count", H);
    kv_u32(&b, "llama.attention.head_count_kv", HKV);
    kv_u32(&b, "llama.rope.dimension_count", D);
    kv_f32(&b, "llama.rope.freq_base", 10000.0f);
    kv_f32(&b, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    kv_str(&b, "tokenizer.ggml.model", "llama");
    kv_arr_str(&b, "tokenizer.ggml.tokens", V, VOCAB);
    kv_arr_num(&b, "tokenizer.ggml.scores", 6, V, scores);
    kv_arr_num(&b, "tokenizer.ggml.token_type", 5, V, TYPES);
    kv_u32(&b, "tokenizer.ggml.bos_token_id", T_BOS);
    kv_u32(&b, "tokenizer.ggml.eos_token_id", T_EOS);
    kv_u32(&b, "tokenizer.ggml.unknown_token_id", T_UNK);
    uint64_t off = 0, size[NT];
    for (int i = 0; i < NT; i++) {
        size[i] = ne[i][0] * (ne[i][1] ? ne[i][1] : 1) * 4;
        ti(&b, tn[i], ne[i][0], ne[i][1], 0, off);
        off += (size[i] + 31) / 32 * 32;
    }
    gb_align(&b, 32);
    for (int i = 0; i < NT; i++) {
        size_t n = (size_t)size[i] / 4;
        float *w = calloc(n, sizeof *w);
        if (i == 0) {
            uint64_t s = 1;
            for (int v = 0; v < V; v++) {
                w[v * C] = 10.0f;
                for (int j = 1; j < C; j++) {
                    s = s * 6364136223846793005ull + 1442695040888963407ull;
                    w[v * C + j] = 0.02f * ((float)(s >> 40) / (float)(1 << 24) - 0.5f);
                }
            }
        } else if (i == 2) {
            w[X * C] = 100.0f;
        } else if (ne[i][1] == 0) {
            for (size_t j = 0; j < n; j++)
                w[j] = 1.0f; /* norms */
        }
        gb_put(&b, w, n * 4);
        gb_align(&b, 32);
        free(w);
    }
    write_file(path, b.p, b.n);
    free(b.p);
}

static int setup(void **state) {
    (void)state;
    const char *path = tmp_file("spm_tiny.gguf");
    write_model(path);
    if (comet_model_load(path, &model) != COMET_OK) {
        fprintf(stderr, "cannot load %s: %s\n", path, comet_last_error());
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    comet_model_free(model);
    tmp_dir_remove();
    return 0;
}

/* ---- helpers ----------------------------------------------------------------------- */

/* decode(ids): the whole text through one fresh detokenizer (malloc'd). */
static char *decode(const int32_t *ids, size_t n) {
    comet_detok d;
    comet_detok_init(&d, model->tok);
    size_t cap = 256 * (n + 1), len = 0;
    char *s = malloc(cap);
    for (size_t i = 0; i < n; i++) {
        int k = comet_detok_push(&d, ids[i], s + len, cap - len);
        assert_true(k >= 0);
        len += (size_t)k;
    }
    len += (size_t)comet_detok_flush(&d, s + len, cap - len);
    s[len] = '\0';
    return s;
}

/* BOS + the text's ids, as `comet generate` and the server build a prompt. */
static size_t prompt_ids(const char *text, int32_t *out, size_t cap) {
    int32_t *ids;
    size_t n;
    assert_int_equal(comet_tokenizer_encode(model->tok, text, strlen(text), 1, &ids, &n), COMET_OK);
    assert_true(n + 1 <= cap);
    out[0] = T_BOS;
    memcpy(out + 1, ids, n * sizeof *ids);
    free(ids);
    return n + 1;
}

/* ---- detokenizer ------------------------------------------------------------------- */

static void test_detok_continues_prompt(void **state) {
    (void)state;
    int32_t p[16];
    size_t n = prompt_ids("a b", p, 16);
    int32_t want[] = {T_BOS, T_SA, T_SB};
    assert_int_equal(n, 3);
    assert_memory_equal(p, want, sizeof want);
    char *whole = decode(p, n);
    assert_string_equal(whole, "a b"); /* the text's first piece loses its dummy prefix */
    free(whole);

    char out[256];
    comet_detok d;
    comet_detok_init(&d, model->tok);
    assert_int_equal(comet_detok_prime(&d, p, n), 0);
    assert_int_equal(comet_detok_push(&d, T_SC, out, sizeof out), 2);
    assert_string_equal(out, " c"); /* a continuation keeps it */
    assert_int_equal(comet_detok_push(&d, T_SC, out, sizeof out), 2);
    assert_string_equal(out, " c");

    /* only control tokens before: still the start of the text */
    int32_t bos = T_BOS;
    comet_detok_init(&d, model->tok);
    assert_int_equal(comet_detok_prime(&d, &bos, 1), 0);
    assert_int_equal(comet_detok_push(&d, T_SC, out, sizeof out), 1);
    assert_string_equal(out, "c");
    assert_true(comet_detok_prime(&d, (const int32_t[]){V}, 1) < 0);

    /* per-token strings: the dummy-prefix token alone is "", BOS renders, others keep */
    n = prompt_ids("\n1. b", p, 16);
    int32_t want2[] = {T_BOS, T_SP, T_NL, T_ONE, T_DOT, T_SB};
    assert_int_equal(n, 6);
    assert_memory_equal(p, want2, sizeof want2);
    const char *pieces[] = {"<s>", "", "\n", "1", ".", " b"};
    comet_detok_init(&d, model->tok);
    for (size_t i = 0; i < n; i++) {
        int k = comet_detok_piece(&d, p[i], 1, out, sizeof out);
        assert_true(k >= 0);
        out[k] = '\0';
        assert_string_equal(out, pieces[i]);
        assert_int_equal(comet_detok_prime(&d, &p[i], 1), 0);
    }
    comet_detok_init(&d, model->tok);
    assert_int_equal(comet_detok_piece(&d, T_SA, 1, out, sizeof out), 1);
    assert_int_equal(comet_detok_piece(&d, T_SA, 1, out, 0), 1); /* length only */
    assert_int_equal(comet_detok_prime(&d, (const int32_t[]){T_SA}, 1), 0);
    assert_int_equal(comet_detok_piece(&d, T_SA, 1, out, sizeof out), 2);
    assert_true(comet_detok_piece(&d, V, 1, out, sizeof out) < 0);
}

/* ---- comet_generate ---------------------------------------------------------------- */

typedef struct {
    char text[1024];
    size_t n;
} sink;

static int collect(const char *t, size_t len, void *user) {
    sink *s = user;
    assert_true(s->n + len < sizeof s->text);
    memcpy(s->text + s->n, t, len);
    s->n += len;
    s->text[s->n] = '\0';
    return 0;
}

/* Generate 3 tokens greedily after `prompt` and check the text rule. */
static void generate_case(comet_backend *be, const int32_t *p, size_t n, const char *prompt_text,
                          const char *want) {
    comet_gen_params gp = comet_gen_default_params();
    gp.max_tokens = 3;
    gp.sampling.temperature = 0.0f;
    gp.ignore_eos = 1;
    sink s = {{0}, 0};
    assert_int_equal(comet_generate(model, be, p, (int)n, &gp, collect, &s, NULL), COMET_OK);
    assert_string_equal(s.text, want);
    int32_t all[32];
    memcpy(all, p, n * sizeof *p);
    for (int i = 0; i < 3; i++)
        all[n + (size_t)i] = X;
    char *whole = decode(all, n + 3);
    char joined[1100];
    snprintf(joined, sizeof joined, "%s%s", prompt_text, s.text);
    assert_string_equal(joined, whole);
    free(whole);
}

static void test_generate_keeps_space(void **state) {
    (void)state;
    comet_backend *be = comet_backend_cpu_init(1);
    assert_non_null(be);
    int32_t p[16];
    size_t n = prompt_ids("a b", p, 16);
    generate_case(be, p, n, "a b", " c c c");
    int32_t bos = T_BOS; /* nothing before: the first piece starts the text */
    generate_case(be, &bos, 1, "", "c c c");
    comet_backend_free(be);
}

/* ---- the server (engine + OpenAI routes) ------------------------------------------- */

static comet_server *srv;

static char *post(const char *json) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct timeval tv = {20, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)comet_server_port(srv));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    char *req;
    int n = asprintf(&req,
                     "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
                     strlen(json), json);
    assert_true(n > 0);
    assert_int_equal(send(fd, req, (size_t)n, MSG_NOSIGNAL), n);
    free(req);
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (len + 1 >= cap)
            buf = realloc(buf, cap *= 2);
        ssize_t r = recv(fd, buf + len, cap - len - 1, 0);
        if (r <= 0)
            break;
        len += (size_t)r;
    }
    close(fd);
    buf[len] = '\0';
    int status = 0;
    assert_int_equal(sscanf(buf, "HTTP/1.%*d %d", &status), 1);
    if (status != 200)
        fail_msg("status %d: %s", status, buf);
    char *body = strstr(buf, "\r\n\r\n");
    assert_non_null(body);
    char *out = strdup(body + 4);
    free(buf);
    return out;
}

/* A completion's choice text, and its logprobs tokens joined from index `from` (NULL when
 * there are none). */
static void completion(const char *json, char *text, size_t cap, char *tokens, size_t tcap,
                       int from, char *first_tokens, size_t fcap) {
    char *body = post(json);
    cJSON *o = cJSON_Parse(body);
    if (!o)
        fail_msg("not JSON: %s", body);
    cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
    assert_non_null(c);
    snprintf(text, cap, "%s", cJSON_GetStringValue(cJSON_GetObjectItem(c, "text")));
    cJSON *t = cJSON_GetObjectItem(cJSON_GetObjectItem(c, "logprobs"), "tokens");
    size_t n = 0, fn = 0;
    tokens[0] = '\0';
    first_tokens[0] = '\0';
    for (int i = 0; t && i < cJSON_GetArraySize(t); i++) {
        const char *s = cJSON_GetStringValue(cJSON_GetArrayItem(t, i));
        if (i >= from)
            n += (size_t)snprintf(tokens + n, tcap - n, "%s", s);
        if (i < 2)
            fn += (size_t)snprintf(first_tokens + fn, fcap - fn, "[%s]", s);
    }
    cJSON_Delete(o);
    free(body);
}

/* The texts of an SSE stream, concatenated. */
static void streamed(const char *json, char *text, size_t cap) {
    char *body = post(json);
    size_t n = 0;
    text[0] = '\0';
    for (char *l = strstr(body, "data: "); l; l = strstr(l + 1, "data: ")) {
        if (strncmp(l + 6, "[DONE]", 6) == 0)
            break;
        cJSON *o = cJSON_Parse(l + 6); /* cJSON stops at the end of the object */
        assert_non_null(o);
        cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
        const char *s = c ? cJSON_GetStringValue(cJSON_GetObjectItem(c, "text")) : NULL;
        if (s)
            n += (size_t)snprintf(text + n, cap - n, "%s", s);
        cJSON_Delete(o);
    }
    free(body);
}

static void test_server_completions(void **state) {
    (void)state;
    comet_engine_params ep = comet_engine_default_params();
    ep.n_threads = 1;
    ep.n_pages = 64;
    comet_engine *e = comet_engine_init(model, &ep);
    assert_non_null(e);
    comet_api api;
    assert_int_equal(comet_api_init(&api, e, model, "spm", "llama2"), COMET_OK);
    comet_server_params sp = comet_server_default_params();
    sp.port = 0;
    sp.model_id = "spm";
    sp.n_ctx = model->cfg.n_ctx;
    sp.n_vocab = model->cfg.n_vocab;
    sp.generate = comet_api_generate;
    sp.gauges = comet_api_gauges;
    sp.user = &api;
    srv = comet_server_start(&sp);
    assert_non_null(srv);

    char text[512], toks[512], first[128];
#define REQ(x) "{\"model\": \"spm\", \"max_tokens\": 3, \"temperature\": 0, " x "}"
    completion(REQ("\"prompt\": \"a b\", \"logprobs\": 1"), text, sizeof text, toks, sizeof toks, 0,
               first, sizeof first);
    assert_string_equal(text, " c c c"); /* "a b" + " c c c" == decode(prompt + generated) */
    assert_string_equal(toks, text);
    streamed(REQ("\"prompt\": \"a b\", \"stream\": true, \"logprobs\": 1"), text, sizeof text);
    assert_string_equal(text, " c c c");
    completion(REQ("\"prompt\": [1, 7, 8]"), text, sizeof text, toks, sizeof toks, 0, first,
               sizeof first);
    assert_string_equal(text, " c c c");
    completion(REQ("\"prompt\": [1], \"logprobs\": 1"), text, sizeof text, toks, sizeof toks, 0,
               first, sizeof first);
    assert_string_equal(text, "c c c"); /* nothing before: the text starts here */
    assert_string_equal(toks, text);

    /* echo: the prompt's token strings (from the second: BOS is not in the text) and the
     * completion's join to the text */
    completion(REQ("\"prompt\": \"\\n1. b\", \"echo\": true, \"logprobs\": 1"), text, sizeof text,
               toks, sizeof toks, 1, first, sizeof first);
    assert_string_equal(text, "\n1. b c c c");
    assert_string_equal(toks, text);
    assert_string_equal(first, "[<s>][]"); /* the lone dummy-prefix token is "" */
    /* a token-id prompt's echo is its token strings */
    completion(REQ("\"prompt\": [1, 7, 8], \"echo\": true, \"logprobs\": 1"), text, sizeof text,
               toks, sizeof toks, 0, first, sizeof first);
    assert_string_equal(text, "<s>a b c c c");
    assert_string_equal(toks, text);
    streamed(REQ("\"prompt\": \"\\n1. b\", \"echo\": true, \"logprobs\": 1, \"stream\": true"),
             text, sizeof text);
    assert_string_equal(text, "\n1. b c c c");
#undef REQ
    comet_server_stop(srv);
    comet_engine_free(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_detok_continues_prompt),
        cmocka_unit_test(test_generate_keeps_space),
        cmocka_unit_test(test_server_completions),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
