/* Runs every registered test (optionally only those whose name contains argv[1]).
 * Exit status: 0 when every check passed. */
#include <stdlib.h>
#include <string.h>

#include "pg_test.h"
#include "pyggml.h"

int pg_test_failures = 0;
int pg_test_checks = 0;

#define PG_MAX_TESTS 256
static struct { const char *name; pg_test_fn fn; } g_tests[PG_MAX_TESTS];
static int g_n_tests = 0;

void pg_test_register(const char *name, pg_test_fn fn) {
    if (g_n_tests < PG_MAX_TESTS) {
        g_tests[g_n_tests].name = name;
        g_tests[g_n_tests].fn = fn;
        g_n_tests++;
    }
}

static const char *path_name(int32_t p) {
    static const char *names[] = {"scalar", "avx2", "avx512", "neon"};
    return p >= 0 && p < 4 ? names[p] : "?";
}

int main(int argc, char **argv) {
    const char *only = argc > 1 ? argv[1] : NULL;
    const int32_t path = pg_cpu_path();
    printf("libpyggml %s, cpu features 0x%x, best path %s\n", pg_version(), pg_cpu_features(),
           path_name(path));
    for (int i = 0; i < g_n_tests; i++) {
        if (only && !strstr(g_tests[i].name, only)) continue;
        const int before = pg_test_failures;
        pg_set_cpu_path(path);  /* every test starts on the best path */
        g_tests[i].fn();
        printf("  %-44s %s\n", g_tests[i].name, pg_test_failures == before ? "ok" : "FAILED");
    }
    printf("%d tests, %d checks, %d failures\n", g_n_tests, pg_test_checks, pg_test_failures);
    return pg_test_failures ? 1 : 0;
}
