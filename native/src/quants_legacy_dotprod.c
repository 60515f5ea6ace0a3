/* Legacy (32-element) formats: integer dots with the Armv8.2 dot-product extension (SDOT).
 * Compiled with +dotprod and only installed by pg_fill_legacy_neon when the CPU reports
 * PG_CPU_DOTPROD. Same contract as quants_legacy_neon.c: the scalar reference's bits. */
#include <arm_neon.h>

#include "quants.h"
#include "quants_legacy.h"
#include "quants_legacy_neon.h"

static inline int32x4_t sdot32(int8x16_t q0, int8x16_t q1, const int8_t *a) {
    return vdotq_s32(vdotq_s32(vdupq_n_s32(0), q0, vld1q_s8(a)), q1, vld1q_s8(a + 16));
}

PG_NEON_DOT_Q8_0(vec_dot_q4_0_q8_0, pg_block_q4_0, q4_0_values, sdot32, 0)
PG_NEON_DOT_Q8_0(vec_dot_q5_0_q8_0, pg_block_q5_0, q5_0_values, sdot32, 0)
PG_NEON_DOT_Q8_0(vec_dot_q8_0_q8_0, pg_block_q8_0, q8_0_values, sdot32, 1)
PG_NEON_DOT_Q8_1(vec_dot_q4_1_q8_1, pg_block_q4_1, q4_1_values, sdot32)
PG_NEON_DOT_Q8_1(vec_dot_q5_1_q8_1, pg_block_q5_1, q5_1_values, sdot32)

void pg_fill_legacy_dotprod(pg_type_traits *tbl) {
    tbl[PG_TYPE_Q4_0].vec_dot = vec_dot_q4_0_q8_0;
    tbl[PG_TYPE_Q4_1].vec_dot = vec_dot_q4_1_q8_1;
    tbl[PG_TYPE_Q5_0].vec_dot = vec_dot_q5_0_q8_0;
    tbl[PG_TYPE_Q5_1].vec_dot = vec_dot_q5_1_q8_1;
    tbl[PG_TYPE_Q8_0].vec_dot = vec_dot_q8_0_q8_0;
}
