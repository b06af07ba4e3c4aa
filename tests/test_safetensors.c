/* test_safetensors.c — safetensors reader: files written by the `safetensors` package
 * (tests/fixtures/tiny_hf*, scripts/make_tiny_fixtures.py) read back to the formula the
 * script used, and bad input: header length past the end, bad JSON, unknown dtype,
 * offsets out of range, wrong byte counts, duplicate names.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "format/safetensors.h"
#include "test_util.h"

/* The fixture formula: tensor number t, element i. */
static float formula(int t, int64_t i) { return (float)((37 * i + 11 * t) % 129 - 64) / 64.0f; }

static void test_read_fixture(void **state) {
    (void)state;
    comet_safetensors *st;
    assert_int_equal(comet_st_open(src_path("tests/fixtures/tiny_hf/model.safetensors"), &st),
                     COMET_OK);
    assert_int_equal(st->n_tensors, 3 + 2 * 9);
    const comet_st_tensor *t = comet_st_find(st, "model.layers.1.self_attn.k_proj.weight");
    assert_non_null(t);
    assert_int_equal(t->dtype, COMET_ST_BF16);
    assert_int_equal(t->n_dims, 2);
    assert_int_equal(t->shape[0], 16); /* Hkv * D */
    assert_int_equal(t->shape[1], 32); /* C */
    float *x = malloc((size_t)t->n_elements * sizeof *x);
    assert_int_equal(comet_st_to_f32(st, t, x), COMET_OK);
    /* Tensor number of layer 1's k_proj in the script's NAMES order: 3 + 9 + 2. */
    for (int64_t i = 0; i < t->n_elements; i++)
        if (x[i] != formula(14, i))
            fail_msg("k_proj[%lld] = %g, want %g", (long long)i, x[i], formula(14, i));
    free(x);
    assert_null(comet_st_find(st, "__metadata__"));
    comet_st_free(st);

    assert_int_equal(comet_st_open(src_path("tests/fixtures/tiny_hf_sharded/"
                                            "model-00001-of-00002.safetensors"),
                                   &st),
                     COMET_OK);
    t = &st->tensors[0];
    assert_int_equal(t->dtype, COMET_ST_F16);
    comet_st_free(st);
}

/* Write [len][header][data] and parse it; return the status. */
static comet_status parse_hdr(const char *hdr, uint64_t claimed_len, size_t data_bytes,
                              const char **path_out) {
    const char *p = tmp_file("x.safetensors");
    size_t hl = strlen(hdr);
    size_t n = 8 + hl + data_bytes;
    uint8_t *b = calloc(1, n);
    memcpy(b, &claimed_len, 8);
    memcpy(b + 8, hdr, hl);
    write_file(p, b, n);
    free(b);
    comet_safetensors *st = NULL;
    comet_status rc = comet_st_open(p, &st);
    if (rc == COMET_OK)
        comet_st_free(st);
    *path_out = p;
    return rc;
}

static void expect(const char *hdr, int64_t claimed_len, size_t data_bytes, comet_status want,
                   const char *frag1, const char *frag2) {
    const char *p;
    uint64_t len = claimed_len == -1 ? strlen(hdr) : (uint64_t)claimed_len;
    comet_status got = parse_hdr(hdr, len, data_bytes, &p);
    if (got != want)
        fail_msg("header %s: got %s want %s (%s)", hdr, comet_status_name(got),
                 comet_status_name(want), comet_last_error());
    if (want == COMET_OK)
        return;
    const char *msg = comet_last_error();
    if (!strstr(msg, p) || (frag1 && !strstr(msg, frag1)) || (frag2 && !strstr(msg, frag2)))
        fail_msg("message '%s' lacks '%s' / '%s'", msg, frag1 ? frag1 : "", frag2 ? frag2 : "");
}

static void test_bad_input(void **state) {
    (void)state;
    const char *ok = "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}";
    expect(ok, -1, 16, COMET_OK, NULL, NULL);
    /* Padding spaces after the JSON are allowed; other trailing bytes are not. */
    expect("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}    ", -1, 8, COMET_OK,
           NULL, NULL);
    expect("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}xx", -1, 8,
           COMET_ERR_FORMAT, "trailing", NULL);
    /* Header length past the end of the file. */
    expect(ok, 1 << 20, 16, COMET_ERR_FORMAT, "header length", "past the end");
    expect(ok, -2 /* huge */, 16, COMET_ERR_FORMAT, "header length", NULL);
    /* Bad JSON / not an object. */
    expect("{\"w\":{\"dtype\":", -1, 0, COMET_ERR_FORMAT, "not a JSON object", NULL);
    expect("[1,2]", -1, 0, COMET_ERR_FORMAT, "not a JSON object", NULL);
    /* Unknown dtype, named. */
    expect("{\"w\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,1]}}", -1, 1,
           COMET_ERR_UNSUPPORTED, "'w'", "unknown dtype 'Q4'");
    /* Offsets out of range / inverted / wrong length for the shape. */
    expect("{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", -1, 8,
           COMET_ERR_FORMAT, "'w'", "out of range");
    expect("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", -1, 8,
           COMET_ERR_FORMAT, "'w'", "out of range");
    expect("{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", -1, 8,
           COMET_ERR_FORMAT, "'w'", "needs 12");
    expect("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", -1, 8,
           COMET_ERR_FORMAT, "'w'", "data_offsets");
    /* Shapes: negative, fractional, overflowing. */
    expect("{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,0]}}", -1, 0,
           COMET_ERR_FORMAT, "'w'", "shape[0]");
    expect("{\"w\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,0]}}", -1, 0,
           COMET_ERR_FORMAT, "'w'", "shape[0]");
    expect("{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],"
           "\"data_offsets\":[0,0]}}",
           -1, 0, COMET_ERR_FORMAT, "'w'", "overflows");
    /* Missing fields, duplicates. */
    expect("{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", -1, 4, COMET_ERR_FORMAT, "'w'",
           "dtype");
    expect("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
           "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
           -1, 4, COMET_ERR_FORMAT, "'w'", "twice");
    /* A file shorter than the length field. */
    const char *p = tmp_file("short.safetensors");
    write_file(p, "abc", 3);
    comet_safetensors *st = NULL;
    assert_int_equal(comet_st_open(p, &st), COMET_ERR_FORMAT);
    assert_non_null(strstr(comet_last_error(), p));
    /* Integer tensors parse but do not convert to fp32. */
    const char *ih = "{\"n\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    size_t hl = strlen(ih);
    uint8_t b[256] = {0};
    uint64_t l64 = hl;
    memcpy(b, &l64, 8);
    memcpy(b + 8, ih, hl);
    assert_int_equal(comet_st_parse(b, 8 + hl + 8, "ints", &st), COMET_OK);
    float f[2];
    assert_int_equal(comet_st_to_f32(st, &st->tensors[0], f), COMET_ERR_UNSUPPORTED);
    assert_non_null(strstr(comet_last_error(), "'n'"));
    assert_non_null(strstr(comet_last_error(), "I32"));
    comet_st_free(st);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_read_fixture),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
