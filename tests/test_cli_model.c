/* test_cli_model.c — the comet binary ($COMET_BIN) on bad model files: truncated GGUF,
 * wrong magic, wrong version, tensor offset past the end, overflowing dimensions, unknown
 * tensor type, unknown architecture, missing tokenizer, unknown HF architecture. Each must
 * end `comet generate` with a non-zero exit, nothing on stdout and one error line on
 * stderr naming the file and the problem (library-level details: test_gguf.c,
 * test_loader.c). The corrupt files are generated here into a temp dir.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "test_util.h"

typedef struct {
    int rc;
    char out[8192];
    char err[16384];
} result;

static void slurp(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(buf, 1, cap - 1, f) : 0;
    buf[n] = '\0';
    if (f)
        fclose(f);
}

/* `$COMET_BIN generate --model <model> --prompt hi --max-tokens 1` with output captured. */
static void run_generate(const char *model, result *r) {
    const char *bin = getenv("COMET_BIN");
    assert_non_null(bin);
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "'%s' generate --model '%s' --prompt hi --max-tokens 1 >'%s' 2>'%s'"
             " </dev/null",
             bin, model, tmp_file("out"), tmp_file("err"));
    int st = system(cmd);
    r->rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    slurp(tmp_file("out"), r->out, sizeof r->out);
    slurp(tmp_file("err"), r->err, sizeof r->err);
}

/* Non-zero exit (not a signal), empty stdout, and the last stderr line is the only error:
 * "comet generate: ..." containing `path` and `problem`. */
static void expect_error(const char *path, const char *problem) {
    result r;
    run_generate(path, &r);
    size_t len = strlen(r.err);
    const char *last = r.err;
    for (const char *p = r.err; len && p < r.err + len - 1; p++)
        if (*p == '\n')
            last = p + 1;
    int n_errors = 0;
    for (const char *p = r.err; (p = strstr(p, "comet generate:")); p++)
        n_errors++;
    int ok = r.rc != 0 && r.rc < 128 && !r.out[0] && len && r.err[len - 1] == '\n' &&
             !strncmp(last, "comet generate: ", 16) && strstr(last, path) &&
             strstr(last, problem) && n_errors == 1;
    if (!ok)
        fail_msg("%s: rc %d, stdout '%s', stderr '%s' (wanted '%s')", path, r.rc, r.out, r.err,
                 problem);
}

static gbuf one_tensor(const char *name, uint64_t ne0, uint64_t ne1, uint32_t type,
                       uint64_t offset) {
    gbuf b = {0};
    gb_header(&b, 3, 1, 1);
    kv_str(&b, "general.architecture", "llama");
    ti(&b, name, ne0, ne1, type, offset);
    gb_align(&b, 32);
    gb_put(&b, (uint8_t[256]){0}, 256);
    return b;
}

static void save(const char *path, gbuf *b) {
    write_file(path, b->p, b->n);
    free(b->p);
}

static void test_bad_gguf_files(void **state) {
    (void)state;
    size_t n = 4 << 20;
    uint8_t *head = malloc(n);
    FILE *f = fopen(default_model_path(), "rb");
    assert_non_null(f);
    assert_int_equal(fread(head, 1, n, f), n);
    fclose(f);

    const char *p = tmp_file("truncated.gguf");
    write_file(p, head, n);
    expect_error(p, "past the end");
    p = tmp_file("truncated_meta.gguf");
    write_file(p, head, 100000);
    expect_error(p, "truncated");

    memcpy(head, "GGML", 4);
    p = tmp_file("magic.gguf");
    write_file(p, head, 4096);
    expect_error(p, "magic");
    memcpy(head, "GGUF\x02\x00\x00\x00", 8);
    p = tmp_file("version.gguf");
    write_file(p, head, 4096);
    expect_error(p, "GGUF version 2 is not supported");
    free(head);

    gbuf b = one_tensor("w.past_end", 32, 2, 0, 1 << 20);
    save(p = tmp_file("offset.gguf"), &b);
    expect_error(p, "past the end");
    b = one_tensor("w.overflow", 1ull << 40, 1ull << 40, 0, 0);
    save(p = tmp_file("overflow.gguf"), &b);
    expect_error(p, "overflow");
    b = one_tensor("w.unknown", 32, 1, 99, 0);
    save(p = tmp_file("type.gguf"), &b);
    expect_error(p, "unknown ggml type id 99");
}

static void test_bad_model_metadata(void **state) {
    (void)state;
    gbuf b = {0};
    gb_header(&b, 3, 0, 1);
    kv_str(&b, "general.architecture", "gpt2");
    const char *p = tmp_file("arch.gguf");
    save(p, &b);
    expect_error(p, "architecture 'gpt2' is not supported");

    b = (gbuf){0};
    gb_header(&b, 3, 0, 7);
    kv_str(&b, "general.architecture", "llama");
    kv_u32(&b, "llama.block_count", 1);
    kv_u32(&b, "llama.embedding_length", 32);
    kv_u32(&b, "llama.feed_forward_length", 64);
    kv_u32(&b, "llama.attention.head_count", 4);
    kv_u32(&b, "llama.context_length", 64);
    kv_f32(&b, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    p = tmp_file("notok.gguf");
    save(p, &b);
    expect_error(p, "has no tokenizer (tokenizer.ggml.tokens missing)");

    /* HF directory whose config.json names an unsupported architecture. */
    char dir[512];
    snprintf(dir, sizeof dir, "%s/hf_arch", tmp_dir());
    mkdir(dir, 0755);
    char cfg[600];
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    const char *json = "{\"architectures\": [\"Qwen2ForCausalLM\"], \"hidden_size\": 32}";
    write_file(cfg, json, strlen(json));
    expect_error(dir, "architecture 'Qwen2ForCausalLM' is not supported");
    /* A file that is neither GGUF nor a directory. */
    p = tmp_file("model.bin");
    write_file(p, "hello", 5);
    expect_error(p, "neither a GGUF file");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_gguf_files),
        cmocka_unit_test(test_bad_model_metadata),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
