/* test_gguf.c — GGUF reader: golden values from the `gguf` Python package, every
 * dequantized type against gguf.quants, and bad input (truncation at each section, wrong
 * magic/version, offsets past the end, overflowing shapes, unknown/unsupported types).
 *
 * Golden fixtures: tests/fixtures/gguf_golden.txt and quant_blocks.txt, written by
 * scripts/golden_gguf.py from the default model. The default model must be present.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>

#include <cmocka.h>

#include "format/gguf.h"
#include "test_util.h"

static float *dequant_all(const comet_gguf *g, const comet_gguf_tensor *t) {
    float *x = malloc((size_t)t->n_elements * sizeof *x);
    assert_non_null(x);
    assert_int_equal(comet_gguf_dequant(g, t, x), COMET_OK);
    return x;
}

static void sums(const float *x, int64_t rows, int64_t cols, double *s, double *ws) {
    *s = *ws = 0;
    for (int64_t r = 0; r < rows; r++) {
        double rs = 0;
        for (int64_t c = 0; c < cols; c++)
            rs += x[r * cols + c];
        *s += rs;
        *ws += (double)(r + 1) * rs;
    }
}

static void assert_close(double got, double want, double rel, const char *what) {
    if (fabs(got - want) > rel * (fabs(want) + 1.0))
        fail_msg("%s: got %.17g want %.17g", what, got, want);
}

/* Every "raw" line: type, element count, first 64 values bit-exact, sums. */
static void test_golden_raw(void **state) {
    (void)state;
    comet_gguf *g;
    assert_int_equal(comet_gguf_open(default_model_path(), &g), COMET_OK);
    assert_int_equal(g->version, 3);
    size_t n = 0;
    char *txt = read_file(src_path("tests/fixtures/gguf_golden.txt"), &n);
    assert_non_null(txt);
    int n_raw = 0;
    for (char *line = strtok(txt, "\n"); line; line = strtok(NULL, "\n")) {
        char key[64], name[96], type[16];
        long long v;
        if (sscanf(line, "meta %63s %lld", key, &v) == 2) {
            if (!strcmp(key, "n_tensors"))
                assert_int_equal(g->n_tensors, v);
            if (!strcmp(key, "n_kv"))
                assert_int_equal(g->n_kv, v);
            continue;
        }
        int off;
        long long n_el;
        double s, ws;
        if (sscanf(line, "raw %95s %15s %lld %lf %lf%n", name, type, &n_el, &s, &ws, &off) != 5)
            continue;
        const comet_gguf_tensor *t = comet_gguf_find_tensor(g, name);
        assert_non_null(t);
        assert_string_equal(comet_gguf_type_name(t->type), type);
        assert_int_equal(t->n_elements, n_el);
        float *x = dequant_all(g, t);
        char *p = line + off;
        for (int i = 0; i < 64; i++) {
            float want = strtof(p, &p);
            if (x[i] != want)
                fail_msg("%s[%d]: got %.9g want %.9g", name, i, x[i], want);
        }
        double gs, gws;
        sums(x, t->n_elements / t->ne[0], t->ne[0], &gs, &gws);
        assert_close(gs, s, 1e-9, name);
        assert_close(gws, ws, 1e-9, name);
        free(x);
        n_raw++;
    }
    assert_true(n_raw >= 6);
    free(txt);
    comet_gguf_free(g);
}

/* Metadata getters against the values the Python reader saw. */
static void test_metadata(void **state) {
    (void)state;
    comet_gguf *g;
    assert_int_equal(comet_gguf_open(default_model_path(), &g), COMET_OK);
    uint32_t u;
    float f;
    int b;
    comet_gguf_str s;
    const comet_gguf_kv *kv;
    assert_int_equal(comet_gguf_get_u32(g, "llama.block_count", &u), COMET_OK);
    assert_int_equal(u, 30);
    assert_int_equal(comet_gguf_get_f32(g, "llama.rope.freq_base", &f), COMET_OK);
    assert_true(f == 100000.0f);
    assert_int_equal(comet_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b), COMET_OK);
    assert_int_equal(b, 0);
    assert_int_equal(comet_gguf_get_str(g, "general.architecture", &s), COMET_OK);
    assert_int_equal(s.len, 5);
    assert_memory_equal(s.s, "llama", 5);
    assert_int_equal(comet_gguf_get_arr(g, "tokenizer.ggml.tokens", COMET_GGUF_STRING, &kv),
                     COMET_OK);
    assert_int_equal(kv->arr_n, 49152);
    char **tok;
    assert_int_equal(comet_gguf_arr_strings(kv, &tok), COMET_OK);
    assert_string_equal(tok[2], "<|im_end|>"); /* eos_token_id 2 of SmolLM2-Instruct */
    free(tok);
    /* Type mismatch and missing keys name the key. */
    assert_int_equal(comet_gguf_get_u32(g, "general.architecture", &u), COMET_ERR_FORMAT);
    assert_non_null(strstr(comet_last_error(), "general.architecture"));
    assert_non_null(strstr(comet_last_error(), "string"));
    assert_int_equal(comet_gguf_get_f32(g, "llama.no_such_key", &f), COMET_ERR_FORMAT);
    assert_non_null(strstr(comet_last_error(), "llama.no_such_key"));
    assert_int_equal(comet_gguf_get_arr(g, "tokenizer.ggml.tokens", COMET_GGUF_I32, &kv),
                     COMET_ERR_FORMAT);
    comet_gguf_free(g);
}

static int hexval(char c) { return c <= '9' ? c - '0' : c - 'a' + 10; }

/* Random blocks of every supported type vs gguf.quants.dequantize. */
static void test_quant_blocks(void **state) {
    (void)state;
    size_t n = 0;
    char *txt = read_file(src_path("tests/fixtures/quant_blocks.txt"), &n);
    assert_non_null(txt);
    char *save = NULL;
    int n_types = 0;
    for (char *line = strtok_r(txt, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char name[16];
        unsigned type;
        int n_el, off;
        assert_int_equal(sscanf(line, "%15s %u %d %n", name, &type, &n_el, &off), 3);
        assert_string_equal(comet_gguf_type_name(type), name);
        assert_true(comet_gguf_type_supported(type));
        const char *hex = line + off;
        size_t nb = strlen(hex) / 2;
        size_t bb;
        int blk = comet_gguf_type_block(type, &bb);
        assert_int_equal(nb, (size_t)n_el / (size_t)blk * bb);
        uint8_t *raw = malloc(nb);
        for (size_t i = 0; i < nb; i++)
            raw[i] = (uint8_t)(hexval(hex[2 * i]) << 4 | hexval(hex[2 * i + 1]));
        float *y = malloc((size_t)n_el * sizeof *y);
        assert_int_equal(comet_gguf_dequant_row(type, raw, y, n_el), COMET_OK);
        char *vals = strtok_r(NULL, "\n", &save);
        assert_non_null(vals);
        for (int i = 0; i < n_el; i++) {
            float want = strtof(vals, &vals);
            if (!(y[i] == want || fabsf(y[i] - want) <= 1e-6f * fabsf(want)))
                fail_msg("%s[%d]: got %.9g want %.9g", name, i, y[i], want);
        }
        free(raw);
        free(y);
        n_types++;
    }
    assert_int_equal(n_types, 12);
    free(txt);
}

static void test_fp16(void **state) {
    (void)state;
    assert_true(comet_fp16_to_fp32(0x3c00) == 1.0f);
    assert_true(comet_fp16_to_fp32(0xc000) == -2.0f);
    assert_true(comet_fp16_to_fp32(0x0001) == ldexpf(1.0f, -24)); /* smallest subnormal */
    assert_true(comet_fp16_to_fp32(0x03ff) == ldexpf(1023.0f, -24));
    assert_true(comet_fp16_to_fp32(0x7bff) == 65504.0f);
    assert_true(isinf(comet_fp16_to_fp32(0x7c00)));
    assert_true(isnan(comet_fp16_to_fp32(0x7e00)));
    assert_true(comet_bf16_to_fp32(0x3f80) == 1.0f);
}

/* ---- bad input ---------------------------------------------------------------------- */

/* Open `path`, expect `st`, and every fragment in the message. */
static void expect_open(const char *path, comet_status st, const char *frag1, const char *frag2) {
    comet_gguf *g = NULL;
    comet_status got = comet_gguf_open(path, &g);
    if (got != st)
        fail_msg("%s: got %s want %s (%s)", path, comet_status_name(got), comet_status_name(st),
                 comet_last_error());
    assert_null(g);
    const char *msg = comet_last_error();
    if (!strstr(msg, path) || (frag1 && !strstr(msg, frag1)) || (frag2 && !strstr(msg, frag2)))
        fail_msg("message '%s' lacks '%s' / '%s' / '%s'", msg, path, frag1 ? frag1 : "",
                 frag2 ? frag2 : "");
}

/* The real model cut at points inside each section. */
static void test_truncated(void **state) {
    (void)state;
    comet_gguf *g;
    assert_int_equal(comet_gguf_open(default_model_path(), &g), COMET_OK);
    size_t data_off = (size_t)g->data_offset;
    const comet_gguf_tensor *last = &g->tensors[g->n_tensors - 1];
    size_t end = data_off + (size_t)last->offset + (size_t)last->n_bytes;
    struct {
        size_t cut;
        const char *frag;
    } cuts[] = {
        {0, "shorter than"},               /* empty file */
        {2, "shorter than"},               /* mid-magic */
        {6, "header version"},             /* mid-version */
        {20, "header metadata count"},     /* mid-counts */
        {100, "truncated"},                /* mid-metadata (architecture key) */
        {1000000, "truncated"},            /* mid-metadata (token list) */
        {data_off - 40, "truncated"},      /* mid-tensor-info */
        {data_off + 1000, "past the end"}, /* mid-data */
        {end - 1, "past the end"},         /* one byte short */
    };
    FILE *f = fopen(default_model_path(), "rb");
    assert_non_null(f);
    uint8_t *buf = malloc(data_off + 1000);
    assert_int_equal(fread(buf, 1, data_off + 1000, f), data_off + 1000);
    fclose(f);
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        const char *p = tmp_file("cut.gguf");
        if (cuts[i].cut <= data_off + 1000) {
            write_file(p, buf, cuts[i].cut);
            expect_open(p, COMET_ERR_FORMAT, cuts[i].frag, NULL);
        } else {
            /* Parse an in-memory prefix of the mapped file instead of copying 80 MB. */
            comet_gguf *h = NULL;
            assert_int_equal(comet_gguf_parse(g->buf, cuts[i].cut, "cut.gguf", &h),
                             COMET_ERR_FORMAT);
            assert_non_null(strstr(comet_last_error(), cuts[i].frag));
            assert_non_null(strstr(comet_last_error(), last->name));
        }
    }
    free(buf);
    comet_gguf_free(g);
}

static void test_wrong_magic_and_version(void **state) {
    (void)state;
    FILE *f = fopen(default_model_path(), "rb");
    assert_non_null(f);
    uint8_t buf[4096];
    assert_int_equal(fread(buf, 1, sizeof buf, f), sizeof buf);
    fclose(f);
    const char *p = tmp_file("bad.gguf");
    memcpy(buf, "GGML", 4);
    write_file(p, buf, sizeof buf);
    expect_open(p, COMET_ERR_FORMAT, "magic", "GGUF");
    memcpy(buf, "GGUF", 4);
    for (uint32_t v = 1; v <= 4; v++) {
        if (v == 3)
            continue;
        memcpy(buf + 4, &v, 4);
        write_file(p, buf, sizeof buf);
        char frag[32];
        snprintf(frag, sizeof frag, "version %u", v);
        expect_open(p, COMET_ERR_UNSUPPORTED, frag, "only version 3");
    }
    uint32_t be = 0x03000000u;
    memcpy(buf + 4, &be, 4);
    write_file(p, buf, sizeof buf);
    expect_open(p, COMET_ERR_UNSUPPORTED, "big-endian", NULL);
}

/* A one-tensor GGUF built by hand. */
static gbuf one_tensor(const char *name, uint64_t ne0, uint64_t ne1, uint32_t type, uint64_t offset,
                       size_t data_bytes) {
    gbuf b = {0};
    gb_header(&b, 3, 1, 1);
    kv_str(&b, "general.architecture", "llama");
    ti(&b, name, ne0, ne1, type, offset);
    gb_align(&b, 32);
    uint8_t z[256] = {0};
    while (data_bytes) {
        size_t k = data_bytes < sizeof z ? data_bytes : sizeof z;
        gb_put(&b, z, k);
        data_bytes -= k;
    }
    return b;
}

static void write_gbuf(const char *path, gbuf *b) {
    write_file(path, b->p, b->n);
    free(b->p);
}

static void test_bad_tensors(void **state) {
    (void)state;
    const char *p = tmp_file("t.gguf");
    /* Sanity: the hand-built file parses when nothing is wrong. */
    gbuf b = one_tensor("w", 32, 2, COMET_GGML_F32, 0, 256);
    write_gbuf(p, &b);
    comet_gguf *g;
    assert_int_equal(comet_gguf_open(p, &g), COMET_OK);
    assert_int_equal(g->n_tensors, 1);
    assert_int_equal(g->tensors[0].n_bytes, 256);
    comet_gguf_free(g);

    b = one_tensor("w.past_end", 32, 2, COMET_GGML_F32, 1 << 20, 256);
    write_gbuf(p, &b);
    expect_open(p, COMET_ERR_FORMAT, "'w.past_end'", "past the end");

    b = one_tensor("w.overflow", 1ull << 40, 1ull << 40, COMET_GGML_F32, 0, 0);
    write_gbuf(p, &b);
    expect_open(p, COMET_ERR_FORMAT, "'w.overflow'", "overflow");

    b = one_tensor("w.huge", 1ull << 62, 1, COMET_GGML_F32, 0, 0); /* bytes overflow */
    write_gbuf(p, &b);
    expect_open(p, COMET_ERR_FORMAT, "'w.huge'", "overflow");

    b = one_tensor("w.unknown", 32, 1, 99, 0, 256);
    write_gbuf(p, &b);
    expect_open(p, COMET_ERR_UNSUPPORTED, "'w.unknown'", "type id 99");

    b = one_tensor("w.unaligned", 32, 1, COMET_GGML_F32, 4, 256);
    write_gbuf(p, &b);
    expect_open(p, COMET_ERR_FORMAT, "'w.unaligned'", "alignment");

    b = one_tensor("w.block", 33, 1, COMET_GGML_Q8_0, 0, 256);
    write_gbuf(p, &b);
    expect_open(p, COMET_ERR_FORMAT, "'w.block'", "block size");

    /* Known to ggml but not converted by comet: parses, dequant refuses by name. */
    b = one_tensor("w.iq2", 256, 1, 16 /* IQ2_XXS */, 0, 256);
    write_gbuf(p, &b);
    assert_int_equal(comet_gguf_open(p, &g), COMET_OK);
    float out[256];
    assert_int_equal(comet_gguf_dequant(g, &g->tensors[0], out), COMET_ERR_UNSUPPORTED);
    assert_non_null(strstr(comet_last_error(), "'w.iq2'"));
    assert_non_null(strstr(comet_last_error(), "IQ2_XXS"));
    assert_non_null(strstr(comet_last_error(), p));
    comet_gguf_free(g);

    /* 5 dimensions. */
    b = (gbuf){0};
    gb_header(&b, 3, 1, 0);
    gb_str(&b, "w.5d");
    gb_u32(&b, 5);
    for (int i = 0; i < 5; i++)
        gb_u64(&b, 1);
    gb_u32(&b, 0);
    gb_u64(&b, 0);
    write_gbuf(p, &b);
    expect_open(p, COMET_ERR_FORMAT, "'w.5d'", "5 dimensions");

    /* Duplicate tensor names. */
    b = (gbuf){0};
    gb_header(&b, 3, 2, 0);
    ti(&b, "dup", 8, 0, COMET_GGML_F32, 0);
    ti(&b, "dup", 8, 0, COMET_GGML_F32, 32);
    gb_align(&b, 32);
    gb_put(&b, (uint8_t[64]){0}, 64);
    write_gbuf(p, &b);
    expect_open(p, COMET_ERR_FORMAT, "'dup'", "twice");
}

static void test_bad_metadata(void **state) {
    (void)state;
    const char *p = tmp_file("m.gguf");
    gbuf b = {0};
    /* Bad value type. */
    gb_header(&b, 3, 0, 1);
    gb_str(&b, "k.badtype");
    gb_u32(&b, 13);
    write_gbuf(p, &b);
    expect_open(p, COMET_ERR_FORMAT, "k.badtype", "invalid value type 13");
    /* String longer than the file. */
    b = (gbuf){0};
    gb_header(&b, 3, 0, 1);
    gb_str(&b, "k.longstr");
    gb_u32(&b, 8);
    gb_u64(&b, 1ull << 60);
    write_gbuf(p, &b);
    expect_open(p, COMET_ERR_FORMAT, "k.longstr", "truncated");
    /* Array count too large for the file. */
    b = (gbuf){0};
    gb_header(&b, 3, 0, 1);
    gb_str(&b, "k.bigarr");
    gb_u32(&b, 9);
    gb_u32(&b, 4);
    gb_u64(&b, 1ull << 40);
    write_gbuf(p, &b);
    expect_open(p, COMET_ERR_FORMAT, "k.bigarr", "array of");
    /* Counts in the header that cannot fit. */
    b = (gbuf){0};
    gb_header(&b, 3, 1ull << 50, 1ull << 50);
    write_gbuf(p, &b);
    expect_open(p, COMET_ERR_FORMAT, "cannot fit", NULL);
    /* Nested arrays: [[1, 2], [3]] parse; deeper than the limit does not. */
    b = (gbuf){0};
    gb_header(&b, 3, 0, 1);
    gb_str(&b, "k.nested");
    gb_u32(&b, 9);
    gb_u32(&b, 9);
    gb_u64(&b, 2);
    gb_u32(&b, 5);
    gb_u64(&b, 2);
    gb_u32(&b, 1);
    gb_u32(&b, 2);
    gb_u32(&b, 5);
    gb_u64(&b, 1);
    gb_u32(&b, 3);
    write_file(p, b.p, b.n);
    comet_gguf *g;
    assert_int_equal(comet_gguf_open(p, &g), COMET_OK);
    const comet_gguf_kv *kv = comet_gguf_find(g, "k.nested");
    assert_non_null(kv);
    assert_int_equal(kv->arr_type, COMET_GGUF_ARRAY);
    assert_int_equal(kv->arr_n, 2);
    assert_int_equal(kv->arr_bytes, 2 * 12 + 3 * 4);
    comet_gguf_free(g);
    /* ... cut one byte short: truncated inside the nested array. */
    write_file(p, b.p, b.n - 1);
    expect_open(p, COMET_ERR_FORMAT, "k.nested", "truncated");
    free(b.p);
    b = (gbuf){0};
    gb_header(&b, 3, 0, 1);
    gb_str(&b, "k.deep");
    gb_u32(&b, 9);
    for (int i = 0; i < 20; i++) {
        gb_u32(&b, 9);
        gb_u64(&b, 1);
    }
    write_gbuf(p, &b);
    expect_open(p, COMET_ERR_FORMAT, "k.deep", "nested deeper");
    /* Bad alignment value. */
    b = (gbuf){0};
    gb_header(&b, 3, 0, 1);
    kv_u32(&b, "general.alignment", 24);
    write_gbuf(p, &b);
    expect_open(p, COMET_ERR_FORMAT, "general.alignment", "power of two");
    /* Duplicate keys. */
    b = (gbuf){0};
    gb_header(&b, 3, 0, 2);
    kv_u32(&b, "k.twice", 1);
    kv_u32(&b, "k.twice", 2);
    write_gbuf(p, &b);
    expect_open(p, COMET_ERR_FORMAT, "k.twice", "twice");
    /* A nonexistent file is an IO error naming it. */
    expect_open(tmp_file("does_not_exist.gguf"), COMET_ERR_IO, "cannot open", NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp16),        cmocka_unit_test(test_quant_blocks),
        cmocka_unit_test(test_golden_raw),  cmocka_unit_test(test_metadata),
        cmocka_unit_test(test_truncated),   cmocka_unit_test(test_wrong_magic_and_version),
        cmocka_unit_test(test_bad_tensors), cmocka_unit_test(test_bad_metadata),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
