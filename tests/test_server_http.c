/* test_server_http.c — the HTTP plumbing over a real loopback socket: routes, 404/405,
 * Bearer auth, 413 before the body is read (Content-Length) and while a chunked body
 * streams in, 400 on bad JSON, 503 without a generate hook, /metrics text, that the
 * server keeps serving after each refusal, and that each refusal is logged (method, path,
 * status, reason) and counted in /metrics by status class. Generation itself is tested with the engine
 * (tests/test_serve_openai.py). */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pthread.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cmocka.h>
#include <cjson/cJSON.h>

#include "comet/log.h"
#include "server/server.h"

static comet_server *srv;

/* Log lines the server wrote (its connection threads call the sink), newline-separated. */
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static char log_text[1 << 16];

static void log_sink(comet_log_level level, int progress, const char *msg, void *user) {
    (void)level, (void)progress, (void)user;
    pthread_mutex_lock(&log_mu);
    size_t n = strlen(log_text);
    snprintf(log_text + n, sizeof log_text - n, "%s\n", msg);
    pthread_mutex_unlock(&log_mu);
}

static int logged(const char *needle) {
    pthread_mutex_lock(&log_mu);
    int yes = strstr(log_text, needle) != NULL;
    pthread_mutex_unlock(&log_mu);
    return yes;
}

/* Send `req` (all of it, unless `send_n` < its length), read the answer until the server
 * closes or 10 s pass. Returns the status code; *body_out gets a malloc'd copy of the body. */
static int http(const char *req, size_t send_n, char **body_out) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct timeval tv = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)comet_server_port(srv));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    size_t n = strlen(req);
    if (send_n < n)
        n = send_n;
    assert_int_equal(send(fd, req, n, MSG_NOSIGNAL), (ssize_t)n);
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    for (int i = 0; i < 1000; i++) {
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
    if (sscanf(buf, "HTTP/1.%*d %d", &status) != 1)
        status = -1;
    char *body = strstr(buf, "\r\n\r\n");
    if (body_out)
        *body_out = strdup(body ? body + 4 : "");
    free(buf);
    return status;
}

static int get(const char *path, char **body) {
    char req[512];
    snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", path);
    return http(req, (size_t)-1, body);
}

static int post(const char *path, const char *auth, const char *json, char **body) {
    char *req;
    int n = asprintf(&req,
                     "POST %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: "
                     "application/json\r\n%s%s%sContent-Length: %zu\r\n\r\n%s",
                     path, auth ? "Authorization: Bearer " : "", auth ? auth : "",
                     auth ? "\r\n" : "", strlen(json), json);
    assert_true(n > 0);
    int st = http(req, (size_t)-1, body);
    free(req);
    return st;
}

/* The OpenAI error object of a body, checked for shape; returns its "param" or "". */
static const char *error_param(const char *body, char *param_buf, size_t cap) {
    cJSON *o = cJSON_Parse(body);
    assert_non_null(o);
    cJSON *e = cJSON_GetObjectItem(o, "error");
    assert_non_null(e);
    assert_true(cJSON_IsString(cJSON_GetObjectItem(e, "message")));
    assert_true(cJSON_IsString(cJSON_GetObjectItem(e, "type")));
    cJSON *p = cJSON_GetObjectItem(e, "param");
    assert_non_null(p);
    assert_non_null(cJSON_GetObjectItem(e, "code"));
    snprintf(param_buf, cap, "%s", cJSON_IsString(p) ? p->valuestring : "");
    cJSON_Delete(o);
    return param_buf;
}

static int setup(void **state) {
    (void)state;
    comet_server_params p = comet_server_default_params();
    p.port = 0;
    p.api_key = "sekrit";
    p.model_id = "smol";
    p.n_vocab = 49152;
    p.max_body_bytes = 4000;
    comet_log_set(log_sink, NULL, COMET_LOG_INFO);
    srv = comet_server_start(&p);
    return srv ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    comet_server_stop(srv);
    return 0;
}

static void test_get_routes(void **state) {
    (void)state;
    char *b, pb[64];
    assert_int_equal(get("/health", &b), 200);
    assert_non_null(strstr(b, "ok"));
    free(b);
    assert_int_equal(get("/v1/models", &b), 401); /* /v1 needs the key */
    free(b);
    assert_int_equal(http("GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                          "Authorization: Bearer sekrit\r\n\r\n",
                          (size_t)-1, &b),
                     200);
    cJSON *o = cJSON_Parse(b);
    assert_non_null(o);
    cJSON *m = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "data"), 0);
    assert_string_equal(cJSON_GetObjectItem(m, "id")->valuestring, "smol");
    cJSON_Delete(o);
    free(b);
    assert_int_equal(get("/metrics", &b), 200);
    assert_non_null(strstr(b, "# TYPE comet_time_to_first_token_seconds histogram"));
    free(b);
    assert_int_equal(get("/nope", &b), 404);
    error_param(b, pb, sizeof pb);
    free(b);
    assert_int_equal(get("/v1/completions", &b), 405);
    free(b);
}

static void test_auth(void **state) {
    (void)state;
    char *b, pb[64];
    const char *ok = "{\"model\":\"smol\",\"prompt\":\"hi\"}";
    assert_int_equal(post("/v1/completions", NULL, ok, &b), 401);
    free(b);
    assert_int_equal(post("/v1/completions", "wrong", ok, &b), 401);
    error_param(b, pb, sizeof pb);
    free(b);
    /* valid request, right key, no generate hook in this test: 503 */
    assert_int_equal(post("/v1/completions", "sekrit", ok, &b), 503);
    free(b);
}

static void test_bad_requests(void **state) {
    (void)state;
    char *b, pb[64];
    assert_int_equal(post("/v1/completions", "sekrit", "{\"model\":\"smol\",", &b), 400);
    free(b);
    assert_int_equal(post("/v1/chat/completions", "sekrit", "{\"model\":\"smol\"}", &b), 400);
    assert_string_equal(error_param(b, pb, sizeof pb), "messages");
    free(b);
    assert_int_equal(
        post("/v1/chat/completions", "sekrit",
             "{\"model\":\"other\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}", &b),
        404);
    assert_string_equal(error_param(b, pb, sizeof pb), "model");
    free(b);
    assert_int_equal(post("/v1/completions", "sekrit",
                          "{\"model\":\"smol\",\"prompt\":\"a\",\"max_tokens\":-5}", &b),
                     400);
    assert_string_equal(error_param(b, pb, sizeof pb), "max_tokens");
    free(b);
    assert_int_equal(
        post("/v1/completions", "sekrit", "{\"model\":\"smol\",\"prompt\":\"\xff\"}", &b), 400);
    free(b);
    /* still serving */
    assert_int_equal(get("/health", &b), 200);
    free(b);
}

/* The value of the sample `series` (name with labels) in a /metrics text; -1 if absent. */
static double sample(const char *text, const char *series) {
    size_t n = strlen(series);
    for (const char *p = text; (p = strstr(p, series)); p += n)
        if ((p == text || p[-1] == '\n') && p[n] == ' ')
            return strtod(p + n + 1, NULL);
    return -1;
}

static void metrics_now(double *c2, double *c4, double *errors) {
    char *b;
    assert_int_equal(get("/metrics", &b), 200);
    *c2 = sample(b, "comet_http_responses_total{class=\"2xx\"}");
    *c4 = sample(b, "comet_http_responses_total{class=\"4xx\"}");
    *errors = sample(b, "comet_requests_total{outcome=\"error\"}");
    free(b);
}

/* Each refusal gets an INFO log line naming method, path, status and reason, and counts in
 * comet_http_responses_total by class; a refused generation request also counts as a
 * failed one (comet_requests_total{outcome="error"}), whether refused before its body is
 * parsed (401) or after (400). */
static void test_refusals_logged_and_counted(void **state) {
    (void)state;
    char *b;
    double c2, c4, errors, c2b, c4b, errors_b;
    metrics_now(&c2, &c4, &errors);
    assert_true(c2 >= 0 && c4 >= 0 && errors >= 0);
    assert_int_equal(post("/v1/completions", "wrong", "{\"model\":\"smol\",\"prompt\":\"a\"}", &b),
                     401);
    free(b);
    assert_int_equal(get("/no/such/route", &b), 404);
    free(b);
    assert_int_equal(post("/v1/completions", "sekrit",
                          "{\"model\":\"smol\",\"prompt\":\"a\",\"temperature\":-1}", &b),
                     400);
    free(b);
    assert_int_equal(get("/health", &b), 200);
    free(b);
    metrics_now(&c2b, &c4b, &errors_b);
    assert_true(c4b == c4 + 3);
    assert_true(c2b == c2 + 2); /* /health and the first /metrics */
    assert_true(errors_b == errors + 2);
    assert_true(logged("http: POST /v1/completions -> 401: missing or wrong API key"));
    assert_true(logged("http: GET /no/such/route -> 404: no route for this path"));
    assert_true(logged("http: POST /v1/completions -> 400: 'temperature'"));
    assert_false(logged("http: GET /health"));
}

static void test_body_limits(void **state) {
    (void)state;
    char *b;
    /* 10 MB announced, only the headers sent: refused before any body byte is read */
    const char *big = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                      "Authorization: Bearer sekrit\r\nContent-Length: 10485760\r\n\r\n";
    assert_int_equal(http(big, (size_t)-1, &b), 413);
    assert_non_null(strstr(b, "request_too_large"));
    free(b);
    /* chunked body passing the 4000-byte limit */
    char *req;
    char chunk[1100];
    memset(chunk, ' ', sizeof chunk - 1);
    chunk[sizeof chunk - 1] = '\0';
    assert_true(asprintf(&req,
                         "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                         "Authorization: Bearer sekrit\r\nTransfer-Encoding: chunked\r\n\r\n"
                         "44b\r\n%s\r\n44b\r\n%s\r\n44b\r\n%s\r\n44b\r\n%s\r\n0\r\n\r\n",
                         chunk, chunk, chunk, chunk) > 0);
    assert_int_equal(http(req, (size_t)-1, &b), 413);
    free(req);
    free(b);
    assert_int_equal(get("/health", &b), 200);
    free(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_get_routes),
        cmocka_unit_test(test_auth),
        cmocka_unit_test(test_bad_requests),
        cmocka_unit_test(test_body_limits),
        cmocka_unit_test(test_refusals_logged_and_counted),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
