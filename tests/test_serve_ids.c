/* test_serve_ids.c — the engine and the OpenAI server over a model whose tokenizer has no
 * vocabulary (comet_tokenizer_ids, what synthetic models carry): the default model's
 * weights on the CPU with its tokenizer swapped for the id-only one. A text prompt gets a
 * 400 naming the problem, a chat request a 400 (no vocabulary, or no template), and a
 * token-id prompt runs: the text of greedy tokens is " <id>" per token, the same ids a
 * direct engine run gives. */
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

#include "comet/engine.h"
#include "comet/model.h"
#include "comet/server.h"
#include "comet/tokenizer.h"

static comet_model *model;
static comet_engine *engine;
static comet_openai_server *server;

static int http_post(const char *path, const char *json, char **body_out) {
    char *req;
    int n = asprintf(&req,
                     "POST %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: "
                     "application/json\r\nContent-Length: %zu\r\n\r\n%s",
                     path, strlen(json), json);
    assert_true(n > 0);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct timeval tv = {120, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)comet_openai_server_port(server));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(send(fd, req, (size_t)n, MSG_NOSIGNAL), (ssize_t)n);
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
    int status = -1;
    sscanf(buf, "HTTP/1.%*d %d", &status);
    char *body = strstr(buf, "\r\n\r\n");
    *body_out = strdup(body ? body + 4 : "");
    free(buf);
    return status;
}

static int setup(void **state) {
    (void)state;
    const char *dir = getenv("COMET_SOURCE_DIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/models/SmolLM2-135M-Instruct.Q4_1.gguf", dir ? dir : ".");
    if (comet_model_load(path, &model) != COMET_OK) {
        fprintf(stderr, "test_serve_ids: cannot load %s: %s\n", path, comet_last_error());
        return -1;
    }
    comet_tokenizer_free(model->tok);
    model->tok = comet_tokenizer_ids("synthetic", "smollm2-ids", model->cfg.n_vocab,
                                     model->cfg.bos_id, model->cfg.eos_ids[0]);
    if (!model->tok)
        return -1;
    comet_engine_params ep = comet_engine_default_params();
    ep.n_threads = 2;
    engine = comet_engine_init(model, &ep);
    if (!engine)
        return -1;
    comet_openai_server_params sp = comet_openai_server_default_params();
    sp.port = 0;
    sp.model_id = "ids";
    return comet_openai_server_start(engine, model, &sp, &server) < 0 ? -1 : 0;
}

static int teardown(void **state) {
    (void)state;
    comet_openai_server_stop(server);
    comet_engine_free(engine);
    comet_model_free(model);
    return 0;
}

static void test_text_prompt_refused(void **state) {
    (void)state;
    char *body;
    int st = http_post("/v1/completions", "{\"model\":\"ids\",\"prompt\":\"Hello there\"}", &body);
    if (st != 400 || !strstr(body, "synthetic model smollm2-ids has no vocabulary: send token ids"))
        fail_msg("status %d, body %s", st, body);
    free(body);
    st = http_post("/v1/chat/completions",
                   "{\"model\":\"ids\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
                   &body);
    if (st != 400 || !strstr(body, "send token ids"))
        fail_msg("chat: status %d, body %s", st, body);
    free(body);
}

typedef struct collect {
    int32_t toks[16];
    int n;
} collect;

static void on_event(void *user, const comet_engine_event *ev) {
    collect *c = user;
    if (ev->kind == COMET_EVENT_TOKEN && c->n < 16)
        c->toks[c->n++] = ev->token;
}

static void test_token_prompt_runs(void **state) {
    (void)state;
    const int32_t prompt[] = {1, 504, 3458, 314, 260, 1345};
    char *body;
    int st = http_post("/v1/completions",
                       "{\"model\":\"ids\",\"prompt\":[1,504,3458,314,260,1345],"
                       "\"max_tokens\":6,\"temperature\":0,\"ignore_eos\":true}",
                       &body);
    if (st != 200)
        fail_msg("status %d, body %s", st, body);
    cJSON *doc = cJSON_Parse(body);
    assert_non_null(doc);
    const cJSON *text = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "choices"), 0),
                                            "text");
    assert_true(cJSON_IsString(text));
    /* the same request straight through the engine */
    collect c = {0};
    comet_request_params rp = comet_request_default_params();
    rp.prompt = prompt;
    rp.n_prompt = 6;
    rp.max_tokens = 6;
    rp.sampling.temperature = 0;
    rp.ignore_eos = 1;
    assert_int_equal(comet_engine_submit(engine, &rp, on_event, &c, NULL), COMET_OK);
    assert_true(comet_engine_wait_idle(engine, 120));
    assert_int_equal(c.n, 6);
    char want[256] = "";
    for (int i = 0; i < c.n; i++) {
        char piece[32];
        if (c.toks[i] == model->cfg.bos_id || c.toks[i] == model->cfg.eos_ids[0])
            continue; /* control tokens have no text */
        snprintf(piece, sizeof piece, " <%d>", (int)c.toks[i]);
        strcat(want, piece);
    }
    assert_string_equal(text->valuestring, want);
    cJSON_Delete(doc);
    free(body);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_prompt_refused),
        cmocka_unit_test(test_token_prompt_runs),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
