/* IQ4_NL, IQ4_XS and MXFP4 (iquants.h): NEON dot kernels (armv8-a, no dot-product extension
 * needed), bit-exact with the scalar ones (quants_iq.c): the 4-bit codes become int8 values by
 * one table lookup (vqtbl1q_s8), exact int32 block sums (widening multiplies, pairwise adds),
 * then the scalar kernel's fp32 term per block in block order. Tested under qemu-aarch64.
 * The fill also installs the codebook and ternary kernels (quants_iq_tq_neon.c). */
#include <arm_neon.h>

#include "iquants.h"
#include "quants.h"

/* Σ lut[code]·a over a 32-element block: 16 code bytes (low nibbles elements 0..15) */
static inline int32_t dot32_lut(const uint8_t *qs, int8x16_t lut, const int8_t *a) {
    const uint8x16_t b = vld1q_u8(qs);
    const int8x16_t lo = vqtbl1q_s8(lut, vandq_u8(b, vdupq_n_u8(0x0f)));
    const int8x16_t hi = vqtbl1q_s8(lut, vshrq_n_u8(b, 4));
    const int8x16_t a0 = vld1q_s8(a), a1 = vld1q_s8(a + 16);
    int32x4_t acc = vdupq_n_s32(0);
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(lo), vget_low_s8(a0)));
    acc = vpadalq_s16(acc, vmull_s8(vget_high_s8(lo), vget_high_s8(a0)));
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(hi), vget_low_s8(a1)));
    acc = vpadalq_s16(acc, vmull_s8(vget_high_s8(hi), vget_high_s8(a1)));
    return vaddvq_s32(acc);
}

static void vec_dot_iq4_nl_q8_0(int64_t n, float *restrict s, const void *restrict vx,
                                const void *restrict vy) {
    const pg_block_iq4_nl *x = vx;
    const pg_block_q8_0 *y = vy;
    const int8x16_t lut = vld1q_s8(pg_kv_iq4nl);
    float sum = 0;
    for (int64_t i = 0; i < n / 32; i++) {
        const float d = pg_fp16_to_fp32(y[i].d) * pg_fp16_to_fp32(x[i].d);
        sum += d * (float)dot32_lut(x[i].qs, lut, y[i].qs);
    }
    *s = sum;
}

static void vec_dot_mxfp4_q8_0(int64_t n, float *restrict s, const void *restrict vx,
                               const void *restrict vy) {
    const pg_block_mxfp4 *x = vx;
    const pg_block_q8_0 *y = vy;
    const int8x16_t lut = vld1q_s8(pg_kv_mxfp4);
    float sum = 0;
    for (int64_t i = 0; i < n / 32; i++) {
        const float d = pg_fp16_to_fp32(y[i].d) * pg_e8m0_half(x[i].e);
        sum += d * (float)dot32_lut(x[i].qs, lut, y[i].qs);
    }
    *s = sum;
}

static void vec_dot_iq4_xs_q8_K(int64_t n, float *restrict s, const void *restrict vx,
                                const void *restrict vy) {
    const pg_block_iq4_xs *x = vx;
    const pg_block_q8_K *y = vy;
    const int8x16_t lut = vld1q_s8(pg_kv_iq4nl);
    float sum = 0;
    for (int64_t i = 0; i < n / PG_QK_K; i++) {
        int32_t isum = 0;
        for (int ib = 0; ib < 8; ib++)
            isum += pg_iq4xs_scale(&x[i], ib) * dot32_lut(x[i].qs + 16 * ib, lut, y[i].qs + 32 * ib);
        sum += (pg_fp16_to_fp32(x[i].d) * y[i].d) * (float)isum;
    }
    *s = sum;
}

void pg_fill_iquants_neon(pg_type_traits *tbl, uint32_t features) {
    tbl[PG_TYPE_IQ4_NL].vec_dot = vec_dot_iq4_nl_q8_0;
    tbl[PG_TYPE_MXFP4].vec_dot = vec_dot_mxfp4_q8_0;
    tbl[PG_TYPE_IQ4_XS].vec_dot = vec_dot_iq4_xs_q8_K;
    pg_fill_iq_tq_neon(tbl, features);
}
