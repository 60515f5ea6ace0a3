/* Legacy formats: optional AVX-512 kernels (an extra beside AVX2, never required).
 *
 * On CPUs with AVX512-VNNI the integer dots use 256-bit VPDPBUSD (one instruction for the
 * u8·s8 products and their 4-way sums, exact, no int16 saturation) instead of AVX2's
 * maddubs + madd pair; everything else is the shared x86 code of quants_legacy_x86.h, so the
 * results equal the AVX2 kernels' bit for bit. Without VNNI this path keeps the AVX2 kernels. */
#include <immintrin.h>

#include "pg_internal.h"
#include "quants.h"

#define PG_X86_DOT_US(u, s) _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s)
#define PG_X86_DOT_Q4_0(q, a)                                                                   \
    _mm256_sub_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), q, a),                         \
                     _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(8), a))
#include "quants_legacy_x86.h"

void pg_fill_legacy_avx512(pg_type_traits *tbl) {
    if (!(pg_g_cpu_features & PG_CPU_AVX512VNNI)) return;
    tbl[PG_TYPE_Q4_0].vec_dot = vec_dot_q4_0_q8_0;
    tbl[PG_TYPE_Q4_1].vec_dot = vec_dot_q4_1_q8_1;
    tbl[PG_TYPE_Q5_0].vec_dot = vec_dot_q5_0_q8_0;
    tbl[PG_TYPE_Q5_1].vec_dot = vec_dot_q5_1_q8_1;
    tbl[PG_TYPE_Q8_0].vec_dot = vec_dot_q8_0_q8_0;
}
