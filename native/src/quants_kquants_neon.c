/* K-quants: AArch64 Advanced SIMD kernels (the Q8_K quantizer, dots with Q8_K). Where the CPU has
 * the dot-product extension, quants_kquants_dotprod.c replaces the dots.
 *
 * Exactness contract with the scalar reference (quants_kquants.c), checked by
 * tests/test_quants_kquants.c: Q8_K from_float bit-exact; dots with exact integer sums and the
 * scalar kernel's per-super-block fp32 order. */
#include <arm_neon.h>
#include <math.h>
#include <string.h>

#include "kquants.h"
#include "quants.h"

/* 16 products of int8 lanes into 4 int32 lanes: widening multiplies, pairwise accumulate. */
static inline int32x4_t kq_dot16(int32x4_t acc, int8x16_t q, int8x16_t a) {
    const int16x8_t p = vmlal_high_s8(vmull_s8(vget_low_s8(q), vget_low_s8(a)), q, a);
    return vpadalq_s16(acc, p);
}
#define KQ_FN(name) name##_neon
#include "kquants_neon_body.h"

static void quantize_row_q8_K_neon(const float *restrict x, void *restrict vy, int64_t n) {
    pg_block_q8_K *y = vy;
    const float32x4_t magic = vdupq_n_f32(12582912.f);
    const int32x4_t mant = vdupq_n_s32(0x007fffff), bias = vdupq_n_s32(0x00400000);
    const int32x4_t q127 = vdupq_n_s32(127);
    for (int64_t i = 0; i < n / PG_QK_K; i++, x += PG_QK_K) {
        /* vmaxnm ignores a NaN operand, like the scalar `ax > amax` */
        float32x4_t m0 = vdupq_n_f32(0), m1 = m0, m2 = m0, m3 = m0;
        for (int j = 0; j < PG_QK_K; j += 16) {
            m0 = vmaxnmq_f32(m0, vabsq_f32(vld1q_f32(x + j)));
            m1 = vmaxnmq_f32(m1, vabsq_f32(vld1q_f32(x + j + 4)));
            m2 = vmaxnmq_f32(m2, vabsq_f32(vld1q_f32(x + j + 8)));
            m3 = vmaxnmq_f32(m3, vabsq_f32(vld1q_f32(x + j + 12)));
        }
        const float amax = vmaxnmvq_f32(vmaxnmq_f32(vmaxnmq_f32(m0, m1), vmaxnmq_f32(m2, m3)));
        if (amax == 0) {
            memset(&y[i], 0, sizeof(y[i]));
            continue;
        }
        float max = 0;   /* the signed value at the first index reaching amax */
        for (int j = 0; j < PG_QK_K; j++) {
            if (fabsf(x[j]) == amax) { max = x[j]; break; }
        }
        const float iscale = -127.f / max;
        const float32x4_t vs = vdupq_n_f32(iscale);
        for (int j = 0; j < PG_QK_K; j += 16) {
            int16x8_t h[2];
            for (int k = 0; k < 2; k++) {
                int32x4_t r[2];
                for (int t = 0; t < 2; t++) {
                    const float32x4_t v = vaddq_f32(vmulq_f32(vs, vld1q_f32(x + j + 8 * k + 4 * t)),
                                                    magic);
                    r[t] = vminq_s32(vsubq_s32(vandq_s32(vreinterpretq_s32_f32(v), mant), bias),
                                     q127);
                }
                h[k] = vcombine_s16(vmovn_s32(r[0]), vmovn_s32(r[1]));   /* keeps low bits */
            }
            const int8x16_t q = vcombine_s8(vmovn_s16(h[0]), vmovn_s16(h[1]));
            vst1q_s8(y[i].qs + j, q);
            y[i].bsums[j / 16] = vaddlvq_s8(q);
        }
        y[i].d = 1 / iscale;
    }
}

void pg_fill_kquants_neon(pg_type_traits *tbl, uint32_t features) {
    tbl[PG_TYPE_Q8_K].from_float = quantize_row_q8_K_neon;
    tbl[PG_TYPE_Q2_K].vec_dot = vec_dot_q2_K_q8_K_neon;
    tbl[PG_TYPE_Q3_K].vec_dot = vec_dot_q3_K_q8_K_neon;
    tbl[PG_TYPE_Q4_K].vec_dot = vec_dot_q4_K_q8_K_neon;
    tbl[PG_TYPE_Q5_K].vec_dot = vec_dot_q5_K_q8_K_neon;
    tbl[PG_TYPE_Q6_K].vec_dot = vec_dot_q6_K_q8_K_neon;
    if (features & PG_CPU_DOTPROD) pg_fill_kquants_dotprod(tbl);
}
