/* Legacy (32-element) formats: integer dots with the Armv8.2 dot-product extension (SDOT).
 * Compiled with +dotprod and only installed by pg_fill_legacy_neon when the CPU reports
 * PG_CPU_DOTPROD. Same contract as quants_legacy_neon.c: integer block sums exact, float scaling
 * in 4 lanes × 2 chains. */
#include <arm_neon.h>

#include "quants.h"
#include "quants_legacy.h"
#include "quants_legacy_neon.h"

static inline int32x4_t sdot32(int8x16_t q0, int8x16_t q1, const int8_t *a) {
    return vdotq_s32(vdotq_s32(vdupq_n_s32(0), q0, vld1q_s8(a)), q1, vld1q_s8(a + 16));
}

#define PG_SDOT_Q8_0(name, XT, VALUES)                                                          \
    static void name(int64_t n, float *restrict s, const void *restrict vx,                     \
                     const void *restrict vy) {                                                 \
        const XT *x = vx;                                                                       \
        const pg_block_q8_0 *y = vy;                                                            \
        const int64_t nb = n / PG_QK32;                                                         \
        float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = vdupq_n_f32(0.0f);                         \
        int64_t b = 0;                                                                          \
        for (; b + 2 <= nb; b += 2) {                                                           \
            int8x16_t q0, q1, r0, r1;                                                           \
            VALUES(&x[b], &q0, &q1);                                                            \
            VALUES(&x[b + 1], &r0, &r1);                                                        \
            const int32x4_t p0 = sdot32(q0, q1, y[b].qs), p1 = sdot32(r0, r1, y[b + 1].qs);     \
            acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(p0), h2f(x[b].d) * h2f(y[b].d));             \
            acc1 = vfmaq_n_f32(acc1, vcvtq_f32_s32(p1), h2f(x[b + 1].d) * h2f(y[b + 1].d));     \
        }                                                                                       \
        for (; b < nb; b++) {                                                                   \
            int8x16_t q0, q1;                                                                   \
            VALUES(&x[b], &q0, &q1);                                                            \
            acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(sdot32(q0, q1, y[b].qs)),                    \
                               h2f(x[b].d) * h2f(y[b].d));                                      \
        }                                                                                       \
        *s = vaddvq_f32(vaddq_f32(acc0, acc1));                                                 \
    }

#define PG_SDOT_Q8_1(name, XT, VALUES)                                                          \
    static void name(int64_t n, float *restrict s, const void *restrict vx,                     \
                     const void *restrict vy) {                                                 \
        const XT *x = vx;                                                                       \
        const pg_block_q8_1 *y = vy;                                                            \
        const int64_t nb = n / PG_QK32;                                                         \
        float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = vdupq_n_f32(0.0f);                         \
        float summs = 0.0f;                                                                     \
        for (int64_t b = 0; b < nb; b++) {                                                      \
            int8x16_t q0, q1;                                                                   \
            VALUES(&x[b], &q0, &q1);                                                            \
            const float32x4_t p = vcvtq_f32_s32(sdot32(q0, q1, y[b].qs));                       \
            const float d = h2f(x[b].d) * h2f(y[b].d);                                          \
            if (b & 1) acc1 = vfmaq_n_f32(acc1, p, d);                                          \
            else acc0 = vfmaq_n_f32(acc0, p, d);                                                \
            summs += h2f(x[b].m) * h2f(y[b].s);                                                 \
        }                                                                                       \
        *s = vaddvq_f32(vaddq_f32(acc0, acc1)) + summs;                                         \
    }

PG_SDOT_Q8_0(vec_dot_q4_0_q8_0, pg_block_q4_0, q4_0_values)
PG_SDOT_Q8_0(vec_dot_q5_0_q8_0, pg_block_q5_0, q5_0_values)
PG_SDOT_Q8_0(vec_dot_q8_0_q8_0, pg_block_q8_0, q8_0_values)
PG_SDOT_Q8_1(vec_dot_q4_1_q8_1, pg_block_q4_1, q4_1_values)
PG_SDOT_Q8_1(vec_dot_q5_1_q8_1, pg_block_q5_1, q5_1_values)

void pg_fill_legacy_dotprod(pg_type_traits *tbl) {
    tbl[PG_TYPE_Q4_0].vec_dot = vec_dot_q4_0_q8_0;
    tbl[PG_TYPE_Q4_1].vec_dot = vec_dot_q4_1_q8_1;
    tbl[PG_TYPE_Q5_0].vec_dot = vec_dot_q5_0_q8_0;
    tbl[PG_TYPE_Q5_1].vec_dot = vec_dot_q5_1_q8_1;
    tbl[PG_TYPE_Q8_0].vec_dot = vec_dot_q8_0_q8_0;
}
