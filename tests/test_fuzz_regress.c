/* test_fuzz_regress.c — replay fuzzing inputs through the parsers in the normal build.
 *
 * tests/fuzz/corpus/<fmt>/ holds the valid seeds (must parse). tests/fixtures/fuzz/<fmt>/
 * holds the saved fuzzing inputs (docs/fuzzing.md): the minimized corpus of the recorded
 * runs (one input per coverage feature, valid and invalid) plus any input that ever
 * crashed a target. Each must be handled with a status (and a message when it fails),
 * never a crash. The work per input is the fuzz targets' own (tests/fuzz/fuzz_exercise.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <dirent.h>

#include <cmocka.h>

#include "comet/model.h"
#include "fuzz/fuzz_exercise.h"
#include "test_util.h"

/* One replay: a check of the file at `path` that returns 1 when the input was accepted. */
typedef int (*replay_check)(const char *path, void *ctx);

/* Call `check` on every file in `rel`; returns the count, *n_ok how many were accepted. */
static int replay_dir(const char *rel, replay_check check, void *ctx, int *n_ok) {
    const char *dir = src_path(rel);
    DIR *d = opendir(dir);
    *n_ok = 0;
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        *n_ok += check(path, ctx);
        n++;
    }
    closedir(d);
    return n;
}

typedef struct {
    comet_status (*fn)(const uint8_t *, size_t);
    int must_parse;
} parse_ctx;

/* fn on the file's bytes: OK, or a status with a message (and OK for seeds). */
static int check_parse(const char *path, void *ctx) {
    const parse_ctx *c = ctx;
    size_t sz = 0;
    uint8_t *buf = read_file(path, &sz);
    assert_non_null(buf);
    comet_status st = c->fn(buf, sz);
    if (c->must_parse && st != COMET_OK)
        fail_msg("%s: seed does not parse: %s", path, comet_last_error());
    if (st != COMET_OK && (st < COMET_ERR_INTERNAL || comet_last_error()[0] == '\0'))
        fail_msg("%s: status %d without a message", path, st);
    free(buf);
    return st == COMET_OK;
}

/* Run every file in `rel` through `fn`; returns the count, *n_ok how many parsed. */
static int replay(const char *rel, comet_status (*fn)(const uint8_t *, size_t), int must_parse,
                  int *n_ok) {
    parse_ctx c = {fn, must_parse};
    return replay_dir(rel, check_parse, &c, n_ok);
}

/* comet_model_load on the file: a complete model or a status with a message. */
static int check_model(const char *path, void *ctx) {
    const int must_load = *(const int *)ctx;
    comet_model *m = NULL;
    comet_status st = comet_model_load(path, &m);
    if (st == COMET_OK) {
        assert_non_null(m);
        assert_non_null(m->tok);
        comet_model_free(m);
        return 1;
    }
    assert_null(m);
    if (must_load || st < COMET_ERR_INTERNAL || comet_last_error()[0] == '\0')
        fail_msg("%s: %s: %s", path, comet_status_name(st), comet_last_error());
    return 0;
}

/* comet_model_load on every file in `rel` (fuzz_gguf_model's inputs); returns the count,
 * *n_ok how many loaded. */
static int replay_models(const char *rel, int must_load, int *n_ok) {
    return replay_dir(rel, check_model, &must_load, n_ok);
}

static void test_model_inputs(void **state) {
    (void)state;
    int ok;
    assert_int_equal(replay_models("tests/fuzz/corpus/gguf_model", 1, &ok), 2);
    int n = replay_models("tests/fixtures/fuzz/gguf_model", 0, &ok);
    assert_true(n >= 20);
    assert_true(ok > 0 && ok < n);
}

static void test_seeds(void **state) {
    (void)state;
    int ok;
    assert_true(replay("tests/fuzz/corpus/gguf", fuzz_exercise_gguf, 1, &ok) >= 2);
    assert_true(replay("tests/fuzz/corpus/safetensors", fuzz_exercise_safetensors, 1, &ok) >= 2);
}

static void test_saved_inputs(void **state) {
    (void)state;
    int ok;
    int n = replay("tests/fixtures/fuzz/gguf", fuzz_exercise_gguf, 0, &ok);
    assert_true(n >= 100);         /* the saved corpus is present */
    assert_true(ok > 0 && ok < n); /* and exercises both accepted and refused inputs */
    n = replay("tests/fixtures/fuzz/safetensors", fuzz_exercise_safetensors, 0, &ok);
    assert_true(n >= 40);
    assert_true(ok > 0 && ok < n);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seeds),
        cmocka_unit_test(test_saved_inputs),
        cmocka_unit_test(test_model_inputs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
