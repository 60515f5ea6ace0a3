/* IQ4_NL, IQ4_XS and MXFP4: the AVX2 kernels (the body: iq4_x86_body.h), integer dots through
 * maddubs. The avx512 path takes the VNNI variants (quants_iq_avx512.c) where the CPU has
 * AVX512-VNNI, these otherwise. */
#define PG_X86_DOT_US(u, s) _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
#define PG_X86_DOT_Q4_0(q, a)                                                                   \
    _mm256_madd_epi16(_mm256_sub_epi16(_mm256_maddubs_epi16(q, a),                              \
                                       _mm256_maddubs_epi16(_mm256_set1_epi8(8), a)),           \
                      _mm256_set1_epi16(1))
#define IQ4_DOT_SCALED(acc, u, s, sc) \
    _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), sc))
#include "iq4_x86_body.h"

void pg_fill_iquants_avx2(pg_type_traits *tbl) {
    IQX_SET(tbl, PG_TYPE_IQ4_NL, vec_dot_iq4_nl_q8_0, vec_dot8_iq4_nl_q8_0, gemm_iq4_nl_q8_0);
    IQX_SET(tbl, PG_TYPE_MXFP4, vec_dot_mxfp4_q8_0, vec_dot8_mxfp4_q8_0, gemm_mxfp4_q8_0);
    IQX_SET(tbl, PG_TYPE_IQ4_XS, vec_dot_iq4_xs_q8_K, vec_dot8_iq4_xs_q8_K, gemm_iq4_xs_q8_K);
}
