/* A tiny test harness. PG_TEST(name) defines a test that registers itself at load time, so a new
 * test file needs no edit elsewhere. CHECK records a failure with file:line and keeps going. */
#ifndef PG_TEST_H
#define PG_TEST_H
#include <stdint.h>
#include <stdio.h>

/* Deterministic test data: splitmix64 over a file's own state, and a float uniform in [-1, 1). */
static inline uint64_t pg_test_splitmix(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
static inline float pg_test_unit(uint64_t r) {
    return (float)((double)(r >> 11) / 9007199254740992.0) * 2 - 1;
}

extern int pg_test_failures;
extern int pg_test_checks;

typedef void (*pg_test_fn)(void);
void pg_test_register(const char *name, pg_test_fn fn);

#define PG_TEST(name) \
    static void name(void); \
    __attribute__((constructor)) static void name##_register(void) { pg_test_register(#name, name); } \
    static void name(void)

#define CHECK(cond, ...) do { \
    pg_test_checks++; \
    if (!(cond)) { \
        pg_test_failures++; \
        if (pg_test_failures < 50) { \
            fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); \
        } \
    } \
} while (0)

#endif
