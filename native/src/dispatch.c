/* Per-path kernel tables (see quants.h). Built once at load time; pg_set_cpu_path only switches
 * which table pg_get_type_traits returns. */
#include <string.h>

#include "amx.h"
#include "attn.h"
#include "ops_ssm.h"
#include "pg_internal.h"
#include "quants.h"

#define PG_N_PATHS PG_PATH_COUNT

static pg_type_traits g_tables[PG_N_PATHS][PG_TYPE_COUNT];
static pg_attn_kernels g_attn[PG_N_PATHS];
static pg_ssm_kernels g_ssm[PG_N_PATHS];
static int g_built = 0;
static const pg_type_traits *g_current = g_tables[PG_PATH_SCALAR];
static const pg_attn_kernels *g_attn_current = &g_attn[PG_PATH_SCALAR];
static const pg_ssm_kernels *g_ssm_current = &g_ssm[PG_PATH_SCALAR];

/* Sizes of every type GGUF files may hold, computable or not (values as pyggml/types.py). */
static const struct { int32_t type, block_size, type_size; } k_sizes[] = {
    {PG_TYPE_F32, 1, 4}, {PG_TYPE_F16, 1, 2}, {PG_TYPE_BF16, 1, 2}, {PG_TYPE_F64, 1, 8},
    {PG_TYPE_I8, 1, 1}, {PG_TYPE_I16, 1, 2}, {PG_TYPE_I32, 1, 4}, {PG_TYPE_I64, 1, 8},
    {PG_TYPE_Q4_0, 32, 18}, {PG_TYPE_Q4_1, 32, 20}, {PG_TYPE_Q5_0, 32, 22},
    {PG_TYPE_Q5_1, 32, 24}, {PG_TYPE_Q8_0, 32, 34}, {PG_TYPE_Q8_1, 32, 36},
    {PG_TYPE_Q2_K, 256, 84}, {PG_TYPE_Q3_K, 256, 110}, {PG_TYPE_Q4_K, 256, 144},
    {PG_TYPE_Q5_K, 256, 176}, {PG_TYPE_Q6_K, 256, 210}, {PG_TYPE_Q8_K, 256, 292},
    {PG_TYPE_IQ2_XXS, 256, 66}, {PG_TYPE_IQ2_XS, 256, 74}, {PG_TYPE_IQ3_XXS, 256, 98},
    {PG_TYPE_IQ1_S, 256, 50}, {PG_TYPE_IQ4_NL, 32, 18}, {PG_TYPE_IQ3_S, 256, 110},
    {PG_TYPE_IQ2_S, 256, 82}, {PG_TYPE_IQ4_XS, 256, 136}, {PG_TYPE_IQ1_M, 256, 56},
    {PG_TYPE_TQ1_0, 256, 54}, {PG_TYPE_TQ2_0, 256, 66}, {PG_TYPE_MXFP4, 32, 17},
    {PG_TYPE_NVFP4, 64, 36}, {PG_TYPE_Q1_0, 128, 18},
};

static void build_tables(void) {
    pg_type_traits *scalar = g_tables[PG_PATH_SCALAR];
    memset(g_tables, 0, sizeof(g_tables));
    for (size_t i = 0; i < sizeof(k_sizes) / sizeof(k_sizes[0]); i++) {
        scalar[k_sizes[i].type].block_size = k_sizes[i].block_size;
        scalar[k_sizes[i].type].type_size = k_sizes[i].type_size;
        scalar[k_sizes[i].type].vec_dot_type = -1;
    }
    pg_fill_legacy_scalar(scalar);
    pg_fill_kquants_scalar(scalar);
    pg_fill_iquants_scalar(scalar);
    pg_fill_iq_grid_scalar(scalar);
    pg_fill_tq_scalar(scalar);
    pg_fill_gemm_scalar(scalar);
    for (int i = 0; i < PG_N_PATHS; i++) pg_fill_attn_scalar(&g_attn[i]);
    for (int i = 0; i < PG_N_PATHS; i++) pg_fill_ssm_scalar(&g_ssm[i]);
#if defined(__x86_64__)
    pg_type_traits *avx2 = g_tables[PG_PATH_AVX2], *avx512 = g_tables[PG_PATH_AVX512];
    memcpy(avx2, scalar, sizeof(g_tables[0]));
    pg_fill_legacy_avx2(avx2);
    pg_fill_kquants_avx2(avx2);
    pg_fill_gemm_avx2(avx2);
    pg_fill_iquants_avx2(avx2);
    pg_fill_iq_grid_avx2(avx2);
    pg_fill_tq_avx2(avx2);
    pg_fill_attn_avx2(&g_attn[PG_PATH_AVX2]);
    pg_fill_ssm_avx2(&g_ssm[PG_PATH_AVX2]);
    memcpy(avx512, avx2, sizeof(g_tables[0]));
    pg_fill_legacy_avx512(avx512);
    pg_fill_kquants_avx512(avx512);
    pg_fill_gemm_avx512(avx512);
    pg_fill_iquants_avx512(avx512);
    pg_fill_iq_grid_avx512(avx512);
    pg_fill_attn_avx512(&g_attn[PG_PATH_AVX512]);
    pg_fill_ssm_avx512(&g_ssm[PG_PATH_AVX512]);
    pg_type_traits *amx = g_tables[PG_PATH_AMX];
    memcpy(amx, avx512, sizeof(g_tables[0]));
    pg_fill_gemm_amx(amx);
    g_attn[PG_PATH_AMX] = g_attn[PG_PATH_AVX512];
    g_ssm[PG_PATH_AMX] = g_ssm[PG_PATH_AVX512];
#endif
#if defined(__aarch64__)
    pg_type_traits *neon = g_tables[PG_PATH_NEON];
    memcpy(neon, scalar, sizeof(g_tables[0]));
    pg_fill_legacy_neon(neon, pg_g_cpu_features);
    pg_fill_kquants_neon(neon, pg_g_cpu_features);
    pg_fill_gemm_neon(neon, pg_g_cpu_features);
    pg_fill_iquants_neon(neon, pg_g_cpu_features);
    pg_fill_ssm_neon(&g_ssm[PG_PATH_NEON]);
#endif
    g_built = 1;
}

void pg_dispatch_select(int32_t path) {
    if (!g_built) build_tables();
    if (path >= 0 && path < PG_N_PATHS) {
        g_current = g_tables[path];
        g_attn_current = &g_attn[path];
        g_ssm_current = &g_ssm[path];
    }
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

const pg_attn_kernels *pg_get_attn_kernels(void) { return g_attn_current; }

const pg_attn_kernels *pg_get_attn_kernels_for_path(int32_t path) {
    if (path < 0 || path >= PG_N_PATHS || !pg_path_compiled(path)) return NULL;
    if (!g_built) build_tables();
    return &g_attn[path];
}

const pg_ssm_kernels *pg_get_ssm_kernels(void) { return g_ssm_current; }

const pg_ssm_kernels *pg_get_ssm_kernels_for_path(int32_t path) {
    if (path < 0 || path >= PG_N_PATHS || !pg_path_compiled(path)) return NULL;
    if (!g_built) build_tables();
    return &g_ssm[path];
}
