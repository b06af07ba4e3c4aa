/* test_perplexity.c — `comet perplexity` on the default model and Pride and Prejudice
 * (2 windows of 512 tokens) against the independent HF transformers value stored in
 * tests/fixtures/ppl_reference.txt by scripts/ppl_reference.py: within ±0.5%, and the
 * result line has the documented format. Needs models/ and data/ (the setup script
 * fetches and extracts them). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>

static const char *src_dir(void) {
    const char *s = getenv("COMET_SOURCE_DIR");
    return s && s[0] ? s : ".";
}

/* PPL of `windows` windows of ctx 512 from the fixture */
static double reference_ppl(int windows) {
    char path[4096], line[512];
    snprintf(path, sizeof path, "%s/tests/fixtures/ppl_reference.txt", src_dir());
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    double ppl = -1;
    while (fgets(line, sizeof line, f)) {
        double v;
        long tokens;
        int ctx, w;
        if (sscanf(line, "PPL %lf tokens %ld ctx %d windows %d", &v, &tokens, &ctx, &w) == 4 &&
            ctx == 512 && w == windows)
            ppl = v;
    }
    fclose(f);
    assert_true(ppl > 0);
    return ppl;
}

static void test_ppl_two_windows(void **state) {
    const char *bin = getenv("COMET_BIN");
    assert_non_null(bin);
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "'%s' perplexity --model '%s/models/SmolLM2-135M-Instruct.Q4_1.gguf' "
             "--text '%s/data/austen/prideprejudice.txt' --ctx 512 --max-windows 2",
             bin, src_dir(), src_dir());
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char out[4096];
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    /* exactly one stdout line */
    assert_true(n > 0 && out[n - 1] == '\n' && strchr(out, '\n') == out + n - 1);
    double ppl;
    long tokens;
    int ctx, windows;
    assert_int_equal(
        sscanf(out, "PPL %lf tokens %ld ctx %d windows %d", &ppl, &tokens, &ctx, &windows), 4);
    assert_int_equal(ctx, 512);
    assert_int_equal(windows, 2);
    assert_int_equal(tokens, 2 * 511);
    double ref = reference_ppl(2);
    fprintf(stderr, "comet PPL %.4f, HF transformers %.4f (%+.3f%%)\n", ppl, ref,
            100 * (ppl - ref) / ref);
    assert_true(ppl > ref * 0.995 && ppl < ref * 1.005);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ppl_two_windows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
