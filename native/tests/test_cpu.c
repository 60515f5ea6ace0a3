#include <stddef.h>
#include <string.h>

#include "pg_test.h"
#include "pyggml.h"

PG_TEST(test_cpu_paths) {
    CHECK(strcmp(pg_version(), PG_VERSION_STRING) == 0, "version %s", pg_version());
    CHECK(pg_path_compiled(PG_PATH_SCALAR), "scalar path must always be compiled");
    CHECK(pg_set_cpu_path(PG_PATH_SCALAR) == PG_OK, "scalar path must always be selectable");
    CHECK(pg_cpu_path() == PG_PATH_SCALAR, "path %d", pg_cpu_path());
    CHECK(pg_set_cpu_path(99) == PG_ERR_UNSUPPORTED, "unknown path accepted");
    CHECK(pg_set_cpu_path(-1) == PG_ERR_UNSUPPORTED, "negative path accepted");
#if defined(__aarch64__)
    CHECK(pg_cpu_features() & PG_CPU_NEON, "NEON is mandatory on aarch64");
    CHECK(pg_set_cpu_path(PG_PATH_NEON) == PG_OK, "neon path");
#endif
#if defined(__x86_64__)
    if ((pg_cpu_features() & (PG_CPU_AVX2 | PG_CPU_FMA | PG_CPU_F16C)) ==
        (PG_CPU_AVX2 | PG_CPU_FMA | PG_CPU_F16C)) {
        CHECK(pg_set_cpu_path(PG_PATH_AVX2) == PG_OK, "avx2 path on an AVX2 CPU");
    }
    CHECK(pg_set_cpu_path(PG_PATH_NEON) == PG_ERR_UNSUPPORTED, "neon on x86");
#endif
}

PG_TEST(test_struct_layout) {
    CHECK(sizeof(pg_tensor) == pg_tensor_struct_size(), "struct size");
    CHECK(sizeof(pg_tensor) % 8 == 0, "pg_tensor size %zu not 8-aligned", sizeof(pg_tensor));
    CHECK(pg_abi_version() == PG_ABI_VERSION, "abi %d", pg_abi_version());
    int64_t off[12] = {0};
    CHECK(pg_tensor_field_offsets(NULL, 0) == 10, "field count");
    CHECK(pg_tensor_field_offsets(off, 12) == 10, "field count");
    CHECK(off[2] == (int64_t)offsetof(pg_tensor, ne) && off[8] == (int64_t)offsetof(pg_tensor, data)
          && off[9] == (int64_t)offsetof(pg_tensor, name), "offsets");
    CHECK(off[10] == 0 && off[11] == 0, "wrote past the fields");
    int64_t one[1] = {-1};
    CHECK(pg_tensor_field_offsets(one, 1) == 10 && one[0] == 0, "n_max respected");
}
