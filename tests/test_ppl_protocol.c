/* test_ppl_protocol.c — the two perplexity protocols of engine/perplexity.h on a tiny random
 * model (CPU backend, whose per-token arithmetic does not depend on the step: a position's
 * logits are the same bits in a window of any length):
 *
 * - llama.cpp's: a window's NLL is that of its second half, i.e. comet's NLL over the whole
 *   window minus comet's over its first ctx/2 + 1 tokens; with BOS, the window as
 *   llama-perplexity builds it ([BOS] + text cut into chunks, BOS in place of each chunk's
 *   first token); ctx - 1 - ctx/2 tokens scored a window; fewer than two windows of text
 *   refused by name.
 * - comet's with BOS: each window is BOS and the next ctx - 1 text tokens, every text token
 *   scored; the same NLL, bit for bit, as comet's without BOS over that stream made by hand.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "backend/backend.h"
#include "comet/status.h"
#include "cpu_test_util.h"
#include "engine/perplexity.h"

#define CTX 40 /* even, not a multiple of the 16-slot page */
#define N_TEXT (3 * CTX + 5)
#define BOS 3

static comet_model *model;
static comet_backend *be;
static int32_t text[N_TEXT];

static comet_ppl_result ppl(const int32_t *tokens, size_t n, int ctx, int windows,
                            comet_ppl_protocol protocol, int bos) {
    comet_ppl_params p = comet_ppl_default_params();
    p.ctx = ctx;
    p.max_windows = windows;
    p.chunk = 16; /* several prefill steps a window */
    p.protocol = protocol;
    p.bos_id = bos;
    comet_ppl_result r;
    memset(&r, 0, sizeof r);
    assert_int_equal(comet_perplexity(model, be, tokens, n, &p, &r), COMET_OK);
    return r;
}

/* The second half of `win` [CTX] under comet's protocol: the whole minus the first half. */
static double second_half_nll(const int32_t *win) {
    double whole = ppl(win, CTX, CTX, 1, COMET_PPL_COMET, -1).nll_sum;
    double head = ppl(win, CTX / 2 + 1, CTX / 2 + 1, 1, COMET_PPL_COMET, -1).nll_sum;
    return whole - head;
}

static void check_llama(int bos) {
    comet_ppl_result r = ppl(text, N_TEXT, CTX, 0, COMET_PPL_LLAMA_CPP, bos);
    const int windows = (N_TEXT + (bos >= 0)) / CTX;
    assert_int_equal(r.windows, windows);
    assert_int_equal(r.n_scored, (long)windows * (CTX - 1 - CTX / 2));
    double want = 0.0;
    for (int w = 0; w < windows; w++) {
        int32_t win[CTX];
        for (int j = 0; j < CTX; j++) { /* the stream [BOS] + text, or the text */
            int k = w * CTX + j;
            win[j] = bos >= 0 ? (k == 0 ? bos : text[k - 1]) : text[k];
        }
        if (bos >= 0)
            win[0] = bos;
        want += second_half_nll(win);
    }
    printf("llama.cpp protocol, bos %d: NLL %.12f, by hand %.12f\n", bos, r.nll_sum, want);
    assert_true(fabs(r.nll_sum - want) <= 1e-9 * fabs(want));
}

static void test_llama_cpp_protocol(void **state) {
    (void)state;
    check_llama(-1);
    check_llama(BOS);
}

static void test_llama_cpp_needs_two_windows(void **state) {
    (void)state;
    comet_ppl_params p = comet_ppl_default_params();
    p.ctx = CTX;
    p.protocol = COMET_PPL_LLAMA_CPP;
    comet_ppl_result r;
    assert_int_equal(comet_perplexity(model, be, text, 2 * CTX - 1, &p, &r), COMET_ERR_INVALID_ARG);
    assert_non_null(strstr(comet_last_error(), "two windows"));
    p.bos_id = BOS; /* BOS counts toward the stream, as in llama-perplexity */
    assert_int_equal(comet_perplexity(model, be, text, 2 * CTX - 1, &p, &r), COMET_OK);
    assert_int_equal(r.windows, 2);
}

static void test_comet_protocol_bos_per_window(void **state) {
    (void)state;
    comet_ppl_result r = ppl(text, N_TEXT, CTX, 0, COMET_PPL_COMET, BOS);
    const int windows = N_TEXT / (CTX - 1);
    assert_int_equal(r.windows, windows);
    assert_int_equal(r.n_scored, (long)windows * (CTX - 1));
    int32_t stream[N_TEXT + N_TEXT / (CTX - 1) + 1];
    size_t n = 0;
    for (int w = 0; w < windows; w++) {
        stream[n++] = BOS;
        memcpy(stream + n, text + (size_t)w * (CTX - 1), (CTX - 1) * sizeof *stream);
        n += CTX - 1;
    }
    comet_ppl_result h = ppl(stream, n, CTX, 0, COMET_PPL_COMET, -1);
    assert_int_equal(h.windows, windows);
    assert_memory_equal(&r.nll_sum, &h.nll_sum, sizeof r.nll_sum);
}

static int setup(void **state) {
    (void)state;
    model = tu_tiny_model(77);
    be = comet_backend_cpu_init(1);
    tu_seed(5);
    for (int i = 0; i < N_TEXT; i++)
        text[i] = tu_int(model->cfg.n_vocab);
    return model && be ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    comet_backend_free(be);
    tu_model_free(model);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama_cpp_protocol),
        cmocka_unit_test(test_llama_cpp_needs_two_windows),
        cmocka_unit_test(test_comet_protocol_bos_per_window),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
