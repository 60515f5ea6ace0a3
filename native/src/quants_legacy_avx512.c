/* Legacy formats: the AVX-512 VNNI variant of the x86 dot kernels (quants_legacy_x86.h), with
 * the integer dots of 32 bytes through 256-bit VPDPBUSD (u8·s8, exact). Installed on the avx512
 * path only when the CPU also has AVX512-VNNI (this file is compiled with F/BW/VL/VNNI; without
 * VNNI the path keeps the AVX2 kernels). Same contract as the AVX2 kernels: the scalar
 * reference's bits (exact integer block sums, its fp32 operations in its order), so a row's dot
 * is the same on every path and in every gemm block (tests/test_gemm.c). */
#include <immintrin.h>

#include "pg_internal.h"
#include "quants.h"

#define PG_X86_DOT_US(u, s) _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s)
#define PG_X86_DOT_Q4_0(q, a)                                                                   \
    _mm256_sub_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), q, a),                         \
                     _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(8), a))
/* the 5th bits as a byte mask: one masked add (AVX512BW/VL) */
#define PG_X86_ADD_BIT4(q, qh4) \
    _mm256_mask_add_epi8(q, (__mmask32)pg_load_qh(qh4), q, _mm256_set1_epi8(0x10))
#define PG_X86_DOT_OFF16(q, a)                                                                  \
    _mm256_sub_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), q, a),                         \
                     _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(16), a))
#include "quants_legacy_x86.h"

void pg_fill_legacy_avx512(pg_type_traits *tbl) {
    if (!(pg_g_cpu_features & PG_CPU_AVX512VNNI)) return;
    tbl[PG_TYPE_Q4_0].vec_dot = vec_dot_q4_0_q8_0;
    tbl[PG_TYPE_Q4_1].vec_dot = vec_dot_q4_1_q8_1;
    tbl[PG_TYPE_Q5_0].vec_dot = vec_dot_q5_0_q8_0;
    tbl[PG_TYPE_Q5_1].vec_dot = vec_dot_q5_1_q8_1;
    tbl[PG_TYPE_Q8_0].vec_dot = vec_dot_q8_0_q8_0;
    PG_FILL_LEGACY_DOT8(tbl);
}
