/* IQ4_NL, IQ4_XS and MXFP4: the AVX-512 VNNI variants of the x86 kernels (iq4_x86_body.h):
 * integer dots of 32 bytes through 256-bit VPDPBUSD, IQ4_XS's scaled pair sums through
 * VPDPWSSD. Installed on the avx512 path only with AVX512-VNNI (without it the path keeps the
 * AVX2 kernels). The scalar kernels' bits, as on every path. */
#include "pg_internal.h"

#define PG_X86_DOT_US(u, s) _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s)
#define PG_X86_DOT_Q4_0(q, a)                                                                   \
    _mm256_sub_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), q, a),                         \
                     _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(8), a))
#define IQ4_DOT_SCALED(acc, u, s, sc) _mm256_dpwssd_epi32(acc, _mm256_maddubs_epi16(u, s), sc)
#include "iq4_x86_body.h"

void pg_fill_iquants_avx512(pg_type_traits *tbl) {
    if (!(pg_g_cpu_features & PG_CPU_AVX512VNNI)) return;
    IQX_SET(tbl, PG_TYPE_IQ4_NL, vec_dot_iq4_nl_q8_0, vec_dot8_iq4_nl_q8_0, gemm_iq4_nl_q8_0);
    IQX_SET(tbl, PG_TYPE_MXFP4, vec_dot_mxfp4_q8_0, vec_dot8_mxfp4_q8_0, gemm_mxfp4_q8_0);
    IQX_SET(tbl, PG_TYPE_IQ4_XS, vec_dot_iq4_xs_q8_K, vec_dot8_iq4_xs_q8_K, gemm_iq4_xs_q8_K);
}
