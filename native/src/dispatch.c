/* Per-path kernel tables (see quants.h). Built once at load time; pg_set_cpu_path only switches
 * which table pg_get_type_traits returns. */
#include <string.h>

#include "pg_internal.h"
#include "quants.h"

#define PG_N_PATHS 4

static pg_type_traits g_tables[PG_N_PATHS][PG_TYPE_COUNT];
static int g_built = 0;
static const pg_type_traits *g_current = g_tables[PG_PATH_SCALAR];

static void build_tables(void) {
    pg_type_traits *scalar = g_tables[PG_PATH_SCALAR];
    memset(g_tables, 0, sizeof(g_tables));
    pg_fill_legacy_scalar(scalar);
    pg_fill_kquants_scalar(scalar);
#if defined(__x86_64__)
    pg_type_traits *avx2 = g_tables[PG_PATH_AVX2], *avx512 = g_tables[PG_PATH_AVX512];
    memcpy(avx2, scalar, sizeof(g_tables[0]));
    pg_fill_legacy_avx2(avx2);
    pg_fill_kquants_avx2(avx2);
    memcpy(avx512, avx2, sizeof(g_tables[0]));
    pg_fill_legacy_avx512(avx512);
    pg_fill_kquants_avx512(avx512);
#endif
#if defined(__aarch64__)
    pg_type_traits *neon = g_tables[PG_PATH_NEON];
    memcpy(neon, scalar, sizeof(g_tables[0]));
    pg_fill_legacy_neon(neon, pg_g_cpu_features);
    pg_fill_kquants_neon(neon, pg_g_cpu_features);
#endif
    g_built = 1;
}

void pg_dispatch_select(int32_t path) {
    if (!g_built) build_tables();
    if (path >= 0 && path < PG_N_PATHS) g_current = g_tables[path];
}

const pg_type_traits *pg_get_type_traits(int32_t type) {
    if (type < 0 || type >= PG_TYPE_COUNT) return NULL;
    return &g_current[type];
}

const pg_type_traits *pg_get_type_traits_for_path(int32_t type, int32_t path) {
    if (type < 0 || type >= PG_TYPE_COUNT || !pg_path_compiled(path)) return NULL;
    if (!g_built) build_tables();
    return &g_tables[path][type];
}
