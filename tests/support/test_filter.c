/* test_filter.c — linked into every cmocka test executable (tests/ and tests/cuda/): with
 * COMET_TEST_FILTER=<pattern> in the environment only the tests whose names match run
 * (cmocka_set_test_filter: the name itself, or a pattern with * and ?), e.g.
 *   COMET_TEST_FILTER=test_help build/tests/test_cli
 * It runs before main (a constructor), so no test's main has to ask for it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>

#include <cmocka.h>

__attribute__((constructor)) static void comet_test_filter_from_env(void) {
    const char *pattern = getenv("COMET_TEST_FILTER");
    if (pattern && pattern[0])
        cmocka_set_test_filter(pattern);
}
