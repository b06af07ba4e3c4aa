/* test_generate.c — the generation loop on a tiny random model with a one-character
 * byte-level vocabulary: max_tokens, EOS ids, stop strings (text before the stop is
 * streamed, the stop itself never is, even when it spans tokens), cancellation from the
 * callback, determinism per seed, and the context check. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

#include <cmocka.h>

#include "comet/tokenizer.h"
#include "cpu_test_util.h"
#include "engine/generate.h"

typedef struct {
    char text[4096];
    size_t n;
    int pieces;
    int cancel_after; /* pieces; 0 = never */
} sink;

static int collect(const char *t, size_t len, void *user) {
    sink *s = user;
    assert_true(s->n + len < sizeof s->text);
    memcpy(s->text + s->n, t, len);
    s->n += len;
    s->text[s->n] = '\0';
    s->pieces++;
    return s->cancel_after && s->pieces >= s->cancel_after;
}

typedef struct {
    comet_model *m;
    comet_backend *be;
} fixture;

/* 97 tokens: '!'..'~' (94 one-byte tokens), space, newline, and a control token. */
static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    f->m = tu_tiny_model(11);
    static char strs[94][2];
    const char *tokens[97];
    int32_t attr[97];
    for (int i = 0; i < 94; i++) {
        strs[i][0] = (char)('!' + i);
        strs[i][1] = '\0';
        tokens[i] = strs[i];
        attr[i] = COMET_TOKEN_NORMAL;
    }
    tokens[94] = "\xc4\xa0"; /* byte-level 'Ġ' = space */
    tokens[95] = "\xc4\x8a"; /* byte-level 'Ċ' = newline */
    tokens[96] = "<end>";
    attr[94] = attr[95] = COMET_TOKEN_NORMAL;
    attr[96] = COMET_TOKEN_CONTROL;
    comet_vocab_desc d = {.type = COMET_TOK_BPE,
                          .n_tokens = 97,
                          .tokens = tokens,
                          .token_attr = attr,
                          .n_merges = 0,
                          .merges = NULL,
                          .pre = "gpt2",
                          .bos_id = -1,
                          .eos_id = 96,
                          .unk_id = -1,
                          .pad_id = -1};
    f->m->tok = comet_tokenizer_init(&d);
    if (!f->m->tok)
        fail_msg("%s", comet_last_error());
    f->m->cfg.n_eos = 1;
    f->m->cfg.eos_ids[0] = 96;
    f->be = comet_backend_cpu_init(2);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    comet_tokenizer_free(f->m->tok);
    tu_model_free(f->m);
    comet_backend_free(f->be);
    free(f);
    return 0;
}

static const int32_t prompt[] = {10, 20, 30, 40, 50, 60, 70};
#define N_PROMPT 7

static comet_gen_params params(int max_tokens) {
    comet_gen_params p = comet_gen_default_params();
    p.max_tokens = max_tokens;
    p.sampling.temperature = 1.0f;
    p.sampling.top_k = 0;
    p.sampling.top_p = 1.0f;
    p.sampling.min_p = 0.0f;
    p.sampling.seed = 5;
    p.prefill_chunk = 3; /* several prefill steps */
    p.ignore_eos = 1;
    return p;
}

static void gen(fixture *f, const comet_gen_params *p, sink *s, comet_gen_stats *st) {
    memset(s->text, 0, sizeof s->text);
    s->n = 0;
    s->pieces = 0;
    assert_int_equal(comet_generate(f->m, f->be, prompt, N_PROMPT, p, collect, s, st), COMET_OK);
}

static void test_length_and_seed(void **state) {
    fixture *f = *state;
    comet_gen_params p = params(40);
    sink a = {0}, b = {0};
    comet_gen_stats st;
    gen(f, &p, &a, &st);
    assert_int_equal(st.stop, COMET_STOP_LENGTH);
    assert_int_equal(st.n_generated, 40);
    assert_int_equal(st.n_prompt, N_PROMPT);
    assert_int_equal(st.n_decode_steps, 39);
    gen(f, &p, &b, &st);
    assert_string_equal(a.text, b.text); /* same seed, same text */
    p.sampling.seed = 6;
    gen(f, &p, &b, &st);
    assert_string_not_equal(a.text, b.text);
}

static void test_stop_string(void **state) {
    fixture *f = *state;
    comet_gen_params p = params(60);
    sink full = {0}, s = {0};
    comet_gen_stats st;
    gen(f, &p, &full, &st);
    assert_true(full.n >= 30);
    /* a 3-character stop taken from the middle of the text: spans 2-3 tokens */
    char stop[4];
    memcpy(stop, full.text + 20, 3);
    stop[3] = '\0';
    const char *stops[] = {"no such stop string", stop};
    p.stop = stops;
    p.n_stop = 2;
    gen(f, &p, &s, &st);
    size_t first = (size_t)(strstr(full.text, stop) - full.text);
    assert_int_equal(st.stop, COMET_STOP_STRING);
    assert_int_equal(s.n, first);
    assert_memory_equal(s.text, full.text, first);
    assert_null(strstr(s.text, stop));
}

static void test_eos_and_cancel(void **state) {
    fixture *f = *state;
    comet_gen_params p = params(30);
    sink full = {0}, s = {0};
    comet_gen_stats st;
    gen(f, &p, &full, &st);
    /* make the 6th generated character's token an EOS id: generation stops there */
    char c = full.text[5];
    int32_t id = c == ' ' ? 94 : c == '\n' ? 95 : c - '!';
    f->m->cfg.n_eos = 2;
    f->m->cfg.eos_ids[1] = id;
    p.ignore_eos = 0;
    gen(f, &p, &s, &st);
    f->m->cfg.n_eos = 1;
    assert_int_equal(st.stop, COMET_STOP_EOS);
    assert_int_equal(s.n, (size_t)(strchr(full.text, c) - full.text));
    assert_memory_equal(s.text, full.text, s.n);

    sink cs = {.cancel_after = 4};
    comet_gen_params p2 = params(30);
    gen(f, &p2, &cs, &st);
    assert_int_equal(st.stop, COMET_STOP_CANCELLED);
    assert_int_equal(cs.pieces, 4);
}

static void test_context(void **state) {
    fixture *f = *state;
    int n = f->m->cfg.n_ctx;
    int32_t *ids = calloc((size_t)n, sizeof *ids);
    comet_gen_params p = params(10);
    sink s = {0};
    assert_int_equal(comet_generate(f->m, f->be, ids, n, &p, collect, &s, NULL), COMET_ERR_CONTEXT);
    assert_non_null(strstr(comet_last_error(), "256"));
    assert_int_equal(comet_generate(f->m, f->be, ids, 0, &p, collect, &s, NULL),
                     COMET_ERR_INVALID_ARG);
    /* a prompt that leaves 2 positions: generation stops at the context, not past it */
    comet_gen_stats st;
    assert_int_equal(comet_generate(f->m, f->be, ids, n - 2, &p, collect, &s, &st), COMET_OK);
    assert_int_equal(st.n_generated, 2);
    assert_int_equal(st.stop, COMET_STOP_LENGTH);
    free(ids);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_length_and_seed),
        cmocka_unit_test(test_stop_string),
        cmocka_unit_test(test_eos_and_cancel),
        cmocka_unit_test(test_context),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
