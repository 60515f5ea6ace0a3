/* K-quant dot kernels with Q8_K for AArch64, written once for two instruction sets.
 *
 * Included by quants_kquants_neon.c (plain Advanced SIMD) and quants_kquants_dotprod.c
 * (compiled with +dotprod), each defining first:
 *   KQ_FN(name)           the kernel's name with the file's suffix
 *   kq_dot16(acc, q, a)   acc (int32x4) plus the 16 products q[i]·a[i] spread over the lanes
 * Levels are made non-negative (0..63, so also valid int8) as in the AVX2 kernels: the offsets
 * of Q3_K (-4) and Q6_K (-32) and the mins of Q2_K/Q4_K/Q5_K go through the activation's bsums
 * once per super-block. Integer sums are exact; each super-block adds d·isum (- dmin·summs) to a
 * scalar fp32 sum, in the scalar kernel's order. */
#include <arm_neon.h>

#include "fp16.h"
#include "kquants.h"
#include "quants.h"

/* Σ_k w[k]·bsums[k] over the 16 groups (w: int16 per group). */
static inline int32_t kq_bsum_dot(const int16_t *bsums, int16x8_t w0, int16x8_t w1) {
    const int16x8_t b0 = vld1q_s16(bsums), b1 = vld1q_s16(bsums + 8);
    int32x4_t s = vmull_s16(vget_low_s16(b0), vget_low_s16(w0));
    s = vmlal_high_s16(s, b0, w0);
    s = vmlal_s16(s, vget_low_s16(b1), vget_low_s16(w1));
    s = vmlal_high_s16(s, b1, w1);
    return vaddvq_s32(s);
}

static void KQ_FN(vec_dot_q2_K_q8_K)(int64_t n, float *restrict s, const void *restrict vx,
                                     const void *restrict vy) {
    const pg_block_q2_K *x = vx;
    const pg_block_q8_K *y = vy;
    const uint8x16_t m3 = vdupq_n_u8(3), m4 = vdupq_n_u8(0xF);
    float sumf = 0;
    for (int64_t i = 0; i < n / PG_QK_K; i++) {
        const uint8x16_t sb = vld1q_u8(x[i].scales);
        const uint8x16_t mins = vshrq_n_u8(sb, 4);
        const int32_t summs = kq_bsum_dot(y[i].bsums,
                                          vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(mins))),
                                          vreinterpretq_s16_u16(vmovl_high_u8(mins)));
        uint8_t sc[16];
        vst1q_u8(sc, vandq_u8(sb, m4));
        const int8_t *a = y[i].qs;
        int32x4_t sum0 = vdupq_n_s32(0), sum1 = sum0;
        for (int h = 0; h < 2; h++) {
            const uint8x16_t q0 = vld1q_u8(x[i].qs + 32 * h), q1 = vld1q_u8(x[i].qs + 32 * h + 16);
            const uint8_t *sk = sc + 8 * h;
            const int8_t *ah = a + 128 * h;
#define Q2_STEP(j, sh)                                                                           \
    sum0 = vmlaq_n_s32(sum0, kq_dot16(vdupq_n_s32(0),                                            \
                                      vreinterpretq_s8_u8(vandq_u8(vshrq_n_u8(q0, sh), m3)),     \
                                      vld1q_s8(ah + 32 * (j))), sk[2 * (j)]);                    \
    sum1 = vmlaq_n_s32(sum1, kq_dot16(vdupq_n_s32(0),                                            \
                                      vreinterpretq_s8_u8(vandq_u8(vshrq_n_u8(q1, sh), m3)),     \
                                      vld1q_s8(ah + 32 * (j) + 16)), sk[2 * (j) + 1]);
            sum0 = vmlaq_n_s32(sum0, kq_dot16(vdupq_n_s32(0), vreinterpretq_s8_u8(vandq_u8(q0, m3)),
                                              vld1q_s8(ah)), sk[0]);
            sum1 = vmlaq_n_s32(sum1, kq_dot16(vdupq_n_s32(0), vreinterpretq_s8_u8(vandq_u8(q1, m3)),
                                              vld1q_s8(ah + 16)), sk[1]);
            Q2_STEP(1, 2)
            Q2_STEP(2, 4)
            Q2_STEP(3, 6)
#undef Q2_STEP
        }
        const int32_t isum = vaddvq_s32(vaddq_s32(sum0, sum1));
        const float dall = y[i].d * pg_fp16_to_fp32(x[i].d);
        const float dmin = y[i].d * pg_fp16_to_fp32(x[i].dmin);
        sumf += dall * (float)isum - dmin * (float)summs;
    }
    *s = sumf;
}

static void KQ_FN(vec_dot_q3_K_q8_K)(int64_t n, float *restrict s, const void *restrict vx,
                                     const void *restrict vy) {
    const pg_block_q3_K *x = vx;
    const pg_block_q8_K *y = vy;
    const uint8x16_t m3 = vdupq_n_u8(3), m4 = vdupq_n_u8(4);
    float sumf = 0;
    for (int64_t i = 0; i < n / PG_QK_K; i++) {
        int8_t sc[16];
        pg_k3_unpack_scales(x[i].scales, sc);
        const int8x16_t sv = vld1q_s8(sc);
        /* level q = u - 4 with u = q2 + 4h in 0..7 */
        int32_t isum = -4 * kq_bsum_dot(y[i].bsums, vmovl_s8(vget_low_s8(sv)), vmovl_high_s8(sv));
        const uint8x16_t hm0 = vld1q_u8(x[i].hmask), hm1 = vld1q_u8(x[i].hmask + 16);
        int32x4_t sum0 = vdupq_n_s32(0), sum1 = sum0;
        for (int h = 0; h < 2; h++) {
            const uint8x16_t q0 = vld1q_u8(x[i].qs + 32 * h), q1 = vld1q_u8(x[i].qs + 32 * h + 16);
            const int8_t *sk = sc + 8 * h;
            const int8_t *ah = y[i].qs + 128 * h;
            /* hmask bit 4h + j of each byte, moved to bit 2 */
            uint8x16_t h0 = h ? vshrq_n_u8(hm0, 4) : hm0, h1 = h ? vshrq_n_u8(hm1, 4) : hm1;
            h0 = vshlq_n_u8(h0, 2);
            h1 = vshlq_n_u8(h1, 2);
#define Q3_STEP(j)                                                                               \
    sum0 = vmlaq_n_s32(sum0, kq_dot16(vdupq_n_s32(0), vreinterpretq_s8_u8(vorrq_u8(              \
                           vandq_u8(vshrq_n_u8(q0, 2 * (j)), m3), vandq_u8(h0, m4))),            \
                                      vld1q_s8(ah + 32 * (j))), sk[2 * (j)]);                    \
    sum1 = vmlaq_n_s32(sum1, kq_dot16(vdupq_n_s32(0), vreinterpretq_s8_u8(vorrq_u8(              \
                           vandq_u8(vshrq_n_u8(q1, 2 * (j)), m3), vandq_u8(h1, m4))),            \
                                      vld1q_s8(ah + 32 * (j) + 16)), sk[2 * (j) + 1]);           \
    h0 = vshrq_n_u8(h0, 1);                                                                      \
    h1 = vshrq_n_u8(h1, 1);
            sum0 = vmlaq_n_s32(sum0, kq_dot16(vdupq_n_s32(0), vreinterpretq_s8_u8(vorrq_u8(
                                   vandq_u8(q0, m3), vandq_u8(h0, m4))), vld1q_s8(ah)), sk[0]);
            sum1 = vmlaq_n_s32(sum1, kq_dot16(vdupq_n_s32(0), vreinterpretq_s8_u8(vorrq_u8(
                                   vandq_u8(q1, m3), vandq_u8(h1, m4))), vld1q_s8(ah + 16)), sk[1]);
            h0 = vshrq_n_u8(h0, 1);
            h1 = vshrq_n_u8(h1, 1);
            Q3_STEP(1)
            Q3_STEP(2)
            Q3_STEP(3)
#undef Q3_STEP
        }
        isum += vaddvq_s32(vaddq_s32(sum0, sum1));
        sumf += (pg_fp16_to_fp32(x[i].d) * y[i].d) * (float)isum;
    }
    *s = sumf;
}

/* Q4_K / Q5_K min term: Σ_j m_j·(bsums_2j + bsums_2j+1). */
static inline int32_t kq_k4_mins(const uint8_t sm[16], const int16_t *bsums) {
    const int16x8_t pairs = vpaddq_s16(vld1q_s16(bsums), vld1q_s16(bsums + 8));
    const int16x8_t m = vreinterpretq_s16_u16(vmovl_u8(vld1_u8(sm + 8)));
    int32x4_t s = vmull_s16(vget_low_s16(pairs), vget_low_s16(m));
    s = vmlal_high_s16(s, pairs, m);
    return vaddvq_s32(s);
}

static void KQ_FN(vec_dot_q4_K_q8_K)(int64_t n, float *restrict s, const void *restrict vx,
                                     const void *restrict vy) {
    const pg_block_q4_K *x = vx;
    const pg_block_q8_K *y = vy;
    const uint8x16_t m4 = vdupq_n_u8(0xF);
    float sumf = 0;
    for (int64_t i = 0; i < n / PG_QK_K; i++) {
        uint8_t sm[16];
        pg_k4_unpack_scales(x[i].scales, sm);
        const int32_t summs = kq_k4_mins(sm, y[i].bsums);
        const uint8_t *q = x[i].qs;
        const int8_t *a = y[i].qs;
        int32x4_t sum0 = vdupq_n_s32(0), sum1 = sum0;
        for (int c = 0; c < 4; c++) {
            const uint8x16_t b0 = vld1q_u8(q + 32 * c), b1 = vld1q_u8(q + 32 * c + 16);
            const int8_t *ac = a + 64 * c;
            int32x4_t p = kq_dot16(vdupq_n_s32(0), vreinterpretq_s8_u8(vandq_u8(b0, m4)),
                                   vld1q_s8(ac));
            p = kq_dot16(p, vreinterpretq_s8_u8(vandq_u8(b1, m4)), vld1q_s8(ac + 16));
            sum0 = vmlaq_n_s32(sum0, p, sm[2 * c]);
            p = kq_dot16(vdupq_n_s32(0), vreinterpretq_s8_u8(vshrq_n_u8(b0, 4)), vld1q_s8(ac + 32));
            p = kq_dot16(p, vreinterpretq_s8_u8(vshrq_n_u8(b1, 4)), vld1q_s8(ac + 48));
            sum1 = vmlaq_n_s32(sum1, p, sm[2 * c + 1]);
        }
        const int32_t isum = vaddvq_s32(vaddq_s32(sum0, sum1));
        const float d = y[i].d * pg_fp16_to_fp32(x[i].d);
        const float dmin = y[i].d * pg_fp16_to_fp32(x[i].dmin);
        sumf += d * (float)isum - dmin * (float)summs;
    }
    *s = sumf;
}

static void KQ_FN(vec_dot_q5_K_q8_K)(int64_t n, float *restrict s, const void *restrict vx,
                                     const void *restrict vy) {
    const pg_block_q5_K *x = vx;
    const pg_block_q8_K *y = vy;
    const uint8x16_t m4 = vdupq_n_u8(0xF), m16 = vdupq_n_u8(0x10);
    float sumf = 0;
    for (int64_t i = 0; i < n / PG_QK_K; i++) {
        uint8_t sm[16];
        pg_k4_unpack_scales(x[i].scales, sm);
        const int32_t summs = kq_k4_mins(sm, y[i].bsums);
        const uint8_t *q = x[i].qs;
        const int8_t *a = y[i].qs;
        /* bit 2c of qh[l]: 5th bit of sub-block 2c (low nibbles), bit 2c+1: of 2c+1 (high) */
        uint8x16_t h0 = vld1q_u8(x[i].qh), h1 = vld1q_u8(x[i].qh + 16);
        int32x4_t sum0 = vdupq_n_s32(0), sum1 = sum0;
        for (int c = 0; c < 4; c++) {
            const uint8x16_t b0 = vld1q_u8(q + 32 * c), b1 = vld1q_u8(q + 32 * c + 16);
            const int8_t *ac = a + 64 * c;
            const uint8x16_t l0 = vorrq_u8(vandq_u8(b0, m4), vandq_u8(vshlq_n_u8(h0, 4), m16));
            const uint8x16_t l1 = vorrq_u8(vandq_u8(b1, m4), vandq_u8(vshlq_n_u8(h1, 4), m16));
            const uint8x16_t u0 = vorrq_u8(vshrq_n_u8(b0, 4), vandq_u8(vshlq_n_u8(h0, 3), m16));
            const uint8x16_t u1 = vorrq_u8(vshrq_n_u8(b1, 4), vandq_u8(vshlq_n_u8(h1, 3), m16));
            h0 = vshrq_n_u8(h0, 2);
            h1 = vshrq_n_u8(h1, 2);
            int32x4_t p = kq_dot16(vdupq_n_s32(0), vreinterpretq_s8_u8(l0), vld1q_s8(ac));
            p = kq_dot16(p, vreinterpretq_s8_u8(l1), vld1q_s8(ac + 16));
            sum0 = vmlaq_n_s32(sum0, p, sm[2 * c]);
            p = kq_dot16(vdupq_n_s32(0), vreinterpretq_s8_u8(u0), vld1q_s8(ac + 32));
            p = kq_dot16(p, vreinterpretq_s8_u8(u1), vld1q_s8(ac + 48));
            sum1 = vmlaq_n_s32(sum1, p, sm[2 * c + 1]);
        }
        const int32_t isum = vaddvq_s32(vaddq_s32(sum0, sum1));
        const float d = y[i].d * pg_fp16_to_fp32(x[i].d);
        const float dmin = y[i].d * pg_fp16_to_fp32(x[i].dmin);
        sumf += d * (float)isum - dmin * (float)summs;
    }
    *s = sumf;
}

static void KQ_FN(vec_dot_q6_K_q8_K)(int64_t n, float *restrict s, const void *restrict vx,
                                     const void *restrict vy) {
    const pg_block_q6_K *x = vx;
    const pg_block_q8_K *y = vy;
    const uint8x16_t m4 = vdupq_n_u8(0xF), m30 = vdupq_n_u8(0x30);
    float sumf = 0;
    for (int64_t i = 0; i < n / PG_QK_K; i++) {
        const int8_t *sc = x[i].scales;
        const int8x16_t sv = vld1q_s8(sc);
        /* level q = u - 32 with u = lo4 | hi2 << 4 in 0..63 */
        int32_t isum = -32 * kq_bsum_dot(y[i].bsums, vmovl_s8(vget_low_s8(sv)), vmovl_high_s8(sv));
        int32x4_t sum0 = vdupq_n_s32(0), sum1 = sum0;
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = x[i].ql + 64 * h, *qh = x[i].qh + 32 * h;
            const int8_t *sk = sc + 8 * h;
            const int8_t *ah = y[i].qs + 128 * h;
            for (int v = 0; v < 2; v++) {    /* 16-byte halves: sub-blocks 2g + v */
                const uint8x16_t l0 = vld1q_u8(ql + 16 * v), l1 = vld1q_u8(ql + 32 + 16 * v);
                const uint8x16_t hb = vld1q_u8(qh + 16 * v);
                const uint8x16_t u0 = vorrq_u8(vandq_u8(l0, m4), vandq_u8(vshlq_n_u8(hb, 4), m30));
                const uint8x16_t u1 = vorrq_u8(vandq_u8(l1, m4), vandq_u8(vshlq_n_u8(hb, 2), m30));
                const uint8x16_t u2 = vorrq_u8(vshrq_n_u8(l0, 4), vandq_u8(hb, m30));
                const uint8x16_t u3 = vorrq_u8(vshrq_n_u8(l1, 4), vandq_u8(vshrq_n_u8(hb, 2), m30));
                const int8_t *av = ah + 16 * v;
                sum0 = vmlaq_n_s32(sum0, kq_dot16(vdupq_n_s32(0), vreinterpretq_s8_u8(u0),
                                                  vld1q_s8(av)), sk[v]);
                sum1 = vmlaq_n_s32(sum1, kq_dot16(vdupq_n_s32(0), vreinterpretq_s8_u8(u1),
                                                  vld1q_s8(av + 32)), sk[2 + v]);
                sum0 = vmlaq_n_s32(sum0, kq_dot16(vdupq_n_s32(0), vreinterpretq_s8_u8(u2),
                                                  vld1q_s8(av + 64)), sk[4 + v]);
                sum1 = vmlaq_n_s32(sum1, kq_dot16(vdupq_n_s32(0), vreinterpretq_s8_u8(u3),
                                                  vld1q_s8(av + 96)), sk[6 + v]);
            }
        }
        isum += vaddvq_s32(vaddq_s32(sum0, sum1));
        sumf += (pg_fp16_to_fp32(x[i].d) * y[i].d) * (float)isum;
    }
    *s = sumf;
}
