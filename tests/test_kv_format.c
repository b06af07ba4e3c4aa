/* test_kv_format.c — the KV format's one check and one default policy (comet/kv_format.h):
 * the type <-> bits mapping the checkpoint and the CLIs use, every refusal of
 * comet_kv_format_check named by field, and comet_kv_format_resolve's cases as the quantizer
 * (no base) and perplexity's override (the model's format as base) meet them.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "comet/kv_format.h"

static comet_kv_format fmt(int type, int group, int rotation) {
    return (comet_kv_format){.type = type, .group = group, .rotation = rotation};
}

static void expect_format(comet_kv_format got, int type, int group, int rotation) {
    assert_int_equal(got.type, type);
    assert_int_equal(got.group, group);
    assert_int_equal(got.rotation, rotation);
}

static void test_type_names_and_bits(void **st) {
    (void)st;
    static const int bits[] = {16, 8, 4};
    for (int t = 0; t < COMET_KV_TYPE_COUNT; t++) {
        assert_non_null(comet_kv_type_name(t));
        assert_int_equal(comet_kv_type_bits(t), bits[t]);
        assert_int_equal(comet_kv_type_from_bits(bits[t]), t);
        assert_int_equal(comet_kv_type_quantized(t), t != COMET_KV_F16);
    }
    assert_null(comet_kv_type_name(COMET_KV_TYPE_COUNT));
    assert_null(comet_kv_type_name(-1));
    assert_int_equal(comet_kv_type_bits(COMET_KV_TYPE_COUNT), 0);
    assert_int_equal(comet_kv_type_from_bits(0), -1);
    assert_int_equal(comet_kv_type_from_bits(32), -1);
    assert_int_equal(comet_kv_rotation_parse("hadamard"), COMET_KV_ROTATION_HADAMARD);
    assert_int_equal(comet_kv_rotation_parse("none"), COMET_KV_ROTATION_NONE);
    assert_int_equal(comet_kv_rotation_parse("Hadamard"), -1);
    assert_int_equal(comet_kv_rotation_parse(NULL), -1);
    assert_string_equal(comet_kv_rotation_name(COMET_KV_ROTATION_HADAMARD), "hadamard");
    assert_null(comet_kv_rotation_name(2));
    assert_int_equal(comet_kv_default_group(64), 16);
    assert_int_equal(comet_kv_default_group(40), 0);
}

/* A refusal: COMET_ERR_INVALID_ARG with `who` first and the words that name the field. */
static void expect_refused(comet_kv_format f, int D, const char *words) {
    assert_int_equal(comet_kv_format_check(&f, D, "here"), COMET_ERR_INVALID_ARG);
    const char *msg = comet_last_error();
    assert_int_equal(strncmp(msg, "here: ", 6), 0);
    if (!strstr(msg, words))
        fail_msg("'%s' does not say '%s'", msg, words);
}

static void test_check(void **st) {
    (void)st;
    comet_kv_format zero = {0};
    assert_int_equal(comet_kv_format_check(&zero, 64, "here"), COMET_OK); /* F16, G = D */
    comet_kv_format ok = fmt(COMET_KV_INT4, 16, COMET_KV_ROTATION_HADAMARD);
    assert_int_equal(comet_kv_format_check(&ok, 64, "here"), COMET_OK);
    ok = fmt(COMET_KV_INT8, 48, COMET_KV_ROTATION_NONE); /* D 48: any divisor, no rotation */
    assert_int_equal(comet_kv_format_check(&ok, 48, "here"), COMET_OK);
    expect_refused(fmt(COMET_KV_TYPE_COUNT, 0, 0), 64, "KV cache type 3");
    expect_refused(fmt(-1, 0, 0), 64, "KV cache type -1"); /* a request, not a format */
    expect_refused(fmt(COMET_KV_INT4, 12, 0), 64, "KV group 12 does not divide the head dim 64");
    expect_refused(fmt(COMET_KV_INT4, 128, 0), 64, "KV group 128");
    expect_refused(fmt(COMET_KV_INT4, -2, 0), 64, "KV group -2");
    expect_refused(fmt(COMET_KV_INT4, 0, 2), 64, "KV rotation 2");
    expect_refused(fmt(COMET_KV_INT4, 0, -1), 64, "KV rotation -1");
    expect_refused(fmt(COMET_KV_INT4, 0, COMET_KV_ROTATION_HADAMARD), 48,
                   "power-of-two head dim, not 48");
    expect_refused(zero, 0, "head dim 0");
}

/* The quantizer's policy: no base. */
static void test_resolve_without_base(void **st) {
    (void)st;
    comet_kv_format out;
    comet_kv_format req = fmt(COMET_KV_INT4, 0, -1);
    assert_int_equal(comet_kv_format_resolve(&req, NULL, 64, "q", &out), COMET_OK);
    expect_format(out, COMET_KV_INT4, 16, COMET_KV_ROTATION_HADAMARD);
    /* D 40: one group per head (D), no rotation */
    assert_int_equal(comet_kv_format_resolve(&req, NULL, 40, "q", &out), COMET_OK);
    expect_format(out, COMET_KV_INT4, 40, COMET_KV_ROTATION_NONE);
    /* unquantized: one group per head, no rotation */
    req = fmt(COMET_KV_F16, 0, -1);
    assert_int_equal(comet_kv_format_resolve(&req, NULL, 64, "q", &out), COMET_OK);
    expect_format(out, COMET_KV_F16, 64, COMET_KV_ROTATION_NONE);
    /* type -1 without a base: F16 */
    req = fmt(-1, 0, -1);
    assert_int_equal(comet_kv_format_resolve(&req, NULL, 64, "q", &out), COMET_OK);
    expect_format(out, COMET_KV_F16, 64, COMET_KV_ROTATION_NONE);
    /* a fully given request comes back as it is */
    req = fmt(COMET_KV_INT8, 32, COMET_KV_ROTATION_NONE);
    assert_int_equal(comet_kv_format_resolve(&req, NULL, 64, "q", &out), COMET_OK);
    expect_format(out, COMET_KV_INT8, 32, COMET_KV_ROTATION_NONE);
    /* a refused result leaves *out alone */
    out = fmt(7, 7, 7);
    req = fmt(COMET_KV_INT4, 0, COMET_KV_ROTATION_HADAMARD);
    assert_int_equal(comet_kv_format_resolve(&req, NULL, 40, "q", &out), COMET_ERR_INVALID_ARG);
    expect_format(out, 7, 7, 7);
}

/* Perplexity's override: the model's format as base. */
static void test_resolve_on_a_model(void **st) {
    (void)st;
    comet_kv_format out;
    const comet_kv_format fp = {0}; /* a floating-point model */
    const comet_kv_format q4 = fmt(COMET_KV_INT4, 64, COMET_KV_ROTATION_NONE);
    comet_kv_format keep = fmt(-1, 0, -1);
    assert_int_equal(comet_kv_format_resolve(&keep, &fp, 64, "p", &out), COMET_OK);
    expect_format(out, COMET_KV_F16, 64, COMET_KV_ROTATION_NONE);
    assert_int_equal(comet_kv_format_resolve(&keep, &q4, 64, "p", &out), COMET_OK);
    expect_format(out, COMET_KV_INT4, 64, COMET_KV_ROTATION_NONE);
    /* --kv-bits 4 on a floating-point model: the quantizer's defaults */
    comet_kv_format req = fmt(COMET_KV_INT4, 0, -1);
    assert_int_equal(comet_kv_format_resolve(&req, &fp, 64, "p", &out), COMET_OK);
    expect_format(out, COMET_KV_INT4, 16, COMET_KV_ROTATION_HADAMARD);
    /* --kv-bits 8 on a KV4 model: the model's group and rotation stay */
    req = fmt(COMET_KV_INT8, 0, -1);
    assert_int_equal(comet_kv_format_resolve(&req, &q4, 64, "p", &out), COMET_OK);
    expect_format(out, COMET_KV_INT8, 64, COMET_KV_ROTATION_NONE);
    /* --kv-bits 16 on a KV4 model: unquantized, the model's rotation stays */
    const comet_kv_format q4h = fmt(COMET_KV_INT4, 16, COMET_KV_ROTATION_HADAMARD);
    req = fmt(COMET_KV_F16, 0, -1);
    assert_int_equal(comet_kv_format_resolve(&req, &q4h, 64, "p", &out), COMET_OK);
    expect_format(out, COMET_KV_F16, 16, COMET_KV_ROTATION_HADAMARD);
    /* given fields win over the model's and the policy */
    req = fmt(COMET_KV_INT4, 32, COMET_KV_ROTATION_NONE);
    assert_int_equal(comet_kv_format_resolve(&req, &fp, 64, "p", &out), COMET_OK);
    expect_format(out, COMET_KV_INT4, 32, COMET_KV_ROTATION_NONE);
    /* --kv-group that does not divide D: refused with the caller's name */
    req = fmt(-1, 24, -1);
    assert_int_equal(comet_kv_format_resolve(&req, &q4, 64, "perplexity", &out),
                     COMET_ERR_INVALID_ARG);
    assert_non_null(strstr(comet_last_error(), "perplexity: KV group 24"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_type_names_and_bits),
        cmocka_unit_test(test_check),
        cmocka_unit_test(test_resolve_without_base),
        cmocka_unit_test(test_resolve_on_a_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
