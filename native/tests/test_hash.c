/* FNV-1a 64 against the published test vectors (Fowler/Noll/Vo reference implementation). */
#include <string.h>

#include "pg_test.h"
#include "pyggml.h"

PG_TEST(test_fnv1a64_vectors) {
    CHECK(pg_fnv1a64("", 0) == 0xcbf29ce484222325ULL, "empty input gives the offset basis");
    CHECK(pg_fnv1a64("a", 1) == 0xaf63dc4c8601ec8cULL, "\"a\"");
    CHECK(pg_fnv1a64("foobar", 6) == 0x85944171f73967e8ULL, "\"foobar\"");
}
