/* K-quants: AArch64 dot kernels with the dot-product extension (SDOT), compiled with
 * -march=armv8.2-a+dotprod and installed by pg_fill_kquants_neon only when the CPU reports it.
 * Same kernels as quants_kquants_neon.c (kquants_neon_body.h), one SDOT per 16 products. */
#include <arm_neon.h>

#include "kquants.h"
#include "quants.h"

static inline int32x4_t kq_dot16(int32x4_t acc, int8x16_t q, int8x16_t a) {
    return vdotq_s32(acc, q, a);
}
#define KQ_FN(name) name##_dotprod
#include "kquants_neon_body.h"

void pg_fill_kquants_dotprod(pg_type_traits *tbl) {
    tbl[PG_TYPE_Q2_K].vec_dot = vec_dot_q2_K_q8_K_dotprod;
    tbl[PG_TYPE_Q3_K].vec_dot = vec_dot_q3_K_q8_K_dotprod;
    tbl[PG_TYPE_Q4_K].vec_dot = vec_dot_q4_K_q8_K_dotprod;
    tbl[PG_TYPE_Q5_K].vec_dot = vec_dot_q5_K_q8_K_dotprod;
    tbl[PG_TYPE_Q6_K].vec_dot = vec_dot_q6_K_q8_K_dotprod;
}
