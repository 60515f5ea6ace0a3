/* NEON helpers shared by quants_legacy_neon.c and quants_legacy_dotprod.c: unpacking of the
 * legacy blocks into signed bytes (elements 0..15 in q0, 16..31 in q1). */
#ifndef PG_QUANTS_LEGACY_NEON_H
#define PG_QUANTS_LEGACY_NEON_H

#include <arm_neon.h>
#include <string.h>

#include "quants_legacy.h"

static inline float h2f(pg_fp16 h) { return pg_fp16_to_fp32(h); }

/* 16 packed bytes -> low nibbles (elements 0..15) and high nibbles (16..31). */
static inline void unpack_nibbles(const uint8_t *qs, uint8x16_t *lo, uint8x16_t *hi) {
    const uint8x16_t v = vld1q_u8(qs);
    *lo = vandq_u8(v, vdupq_n_u8(0x0F));
    *hi = vshrq_n_u8(v, 4);
}

/* Bits 0..15 (lo) and 16..31 (hi) of qh as bytes 0xFF / 0x00. */
static inline void bits_to_bytes(const uint8_t *qh4, uint8x16_t *lo, uint8x16_t *hi) {
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t m = vld1q_u8(bit);
    *lo = vtstq_u8(vcombine_u8(vdup_n_u8(qh4[0]), vdup_n_u8(qh4[1])), m);
    *hi = vtstq_u8(vcombine_u8(vdup_n_u8(qh4[2]), vdup_n_u8(qh4[3])), m);
}

/* The signed 32 values of one weight block (elements 0..15 in q0, 16..31 in q1). */
static inline void q4_0_values(const pg_block_q4_0 *x, int8x16_t *q0, int8x16_t *q1) {
    uint8x16_t lo, hi;
    unpack_nibbles(x->qs, &lo, &hi);
    *q0 = vsubq_s8(vreinterpretq_s8_u8(lo), vdupq_n_s8(8));
    *q1 = vsubq_s8(vreinterpretq_s8_u8(hi), vdupq_n_s8(8));
}

static inline void q4_1_values(const pg_block_q4_1 *x, int8x16_t *q0, int8x16_t *q1) {
    uint8x16_t lo, hi;
    unpack_nibbles(x->qs, &lo, &hi);
    *q0 = vreinterpretq_s8_u8(lo);
    *q1 = vreinterpretq_s8_u8(hi);
}

/* Q5_0: q − 16 as a signed byte = nibble | (bit4 ? 0 : 0xF0). */
static inline void q5_0_values(const pg_block_q5_0 *x, int8x16_t *q0, int8x16_t *q1) {
    uint8x16_t lo, hi, blo, bhi;
    unpack_nibbles(x->qs, &lo, &hi);
    bits_to_bytes(x->qh, &blo, &bhi);
    *q0 = vreinterpretq_s8_u8(vorrq_u8(lo, vbicq_u8(vdupq_n_u8(0xF0), blo)));
    *q1 = vreinterpretq_s8_u8(vorrq_u8(hi, vbicq_u8(vdupq_n_u8(0xF0), bhi)));
}

static inline void q5_1_values(const pg_block_q5_1 *x, int8x16_t *q0, int8x16_t *q1) {
    uint8x16_t lo, hi, blo, bhi;
    unpack_nibbles(x->qs, &lo, &hi);
    bits_to_bytes(x->qh, &blo, &bhi);
    *q0 = vreinterpretq_s8_u8(vorrq_u8(lo, vandq_u8(blo, vdupq_n_u8(0x10))));
    *q1 = vreinterpretq_s8_u8(vorrq_u8(hi, vandq_u8(bhi, vdupq_n_u8(0x10))));
}

static inline void q8_0_values(const pg_block_q8_0 *x, int8x16_t *q0, int8x16_t *q1) {
    *q0 = vld1q_s8(x->qs);
    *q1 = vld1q_s8(x->qs + 16);
}

static inline void q8_1_values(const pg_block_q8_1 *x, int8x16_t *q0, int8x16_t *q1) {
    *q0 = vld1q_s8(x->qs);
    *q1 = vld1q_s8(x->qs + 16);
}

/* ---- the scalar reference's fp32 steps (quants_legacy.c) ----------------------------------- */

/* The dot kernels give the scalar reference's bits: per block the exact int32 sum, then the
 * block's fp32 term in the reference's operations, added to one running sum in block order.
 * Four blocks per step share one integer fold and one fp16 conversion per field. */

/* [Σp0 Σp1 Σp2 Σp3] (exact) */
static inline int32x4_t fold4_s32(int32x4_t p0, int32x4_t p1, int32x4_t p2, int32x4_t p3) {
    return vpaddq_s32(vpaddq_s32(p0, p1), vpaddq_s32(p2, p3));
}

/* the fp16 at p + k·stride, k = 0..3, as floats */
static inline float32x4_t fp16x4_at(const void *p, size_t stride) {
    const uint8_t *c = p;
    uint16_t h[4];
    for (int k = 0; k < 4; k++) memcpy(&h[k], c + (size_t)k * stride, 2);
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h)));
}

/* sum + t0 + t1 + t2 + t3, left to right */
static inline float add_in_order4(float sum, float32x4_t t) {
    sum += vgetq_lane_f32(t, 0);
    sum += vgetq_lane_f32(t, 1);
    sum += vgetq_lane_f32(t, 2);
    return sum + vgetq_lane_f32(t, 3);
}

/* DOT32(q0, q1, a): int32x4 partial sums of one block's 32 products (the includer's).
 * XY: Q8_0's term isum·(d_x·d_y), else isum·d_x·d_y (Q4_0, Q5_0). */
#define PG_NEON_DOT_Q8_0(name, XT, VALUES, DOT32, XY)                                           \
    static void name(int64_t n, float *restrict s, const void *restrict vx,                     \
                     const void *restrict vy) {                                                 \
        const XT *x = vx;                                                                       \
        const pg_block_q8_0 *y = vy;                                                            \
        const int64_t nb = n / PG_QK32;                                                         \
        float sum = 0.0f;                                                                       \
        int64_t b = 0;                                                                          \
        for (; b + 4 <= nb; b += 4) {                                                           \
            int32x4_t p[4];                                                                     \
            for (int k = 0; k < 4; k++) {                                                       \
                int8x16_t q0, q1;                                                               \
                VALUES(&x[b + k], &q0, &q1);                                                    \
                p[k] = DOT32(q0, q1, y[b + k].qs);                                              \
            }                                                                                   \
            const float32x4_t f = vcvtq_f32_s32(fold4_s32(p[0], p[1], p[2], p[3]));             \
            const float32x4_t dx = fp16x4_at(&x[b], sizeof(XT));                                \
            const float32x4_t dy = fp16x4_at(&y[b], sizeof(pg_block_q8_0));                     \
            sum = add_in_order4(sum, XY ? vmulq_f32(f, vmulq_f32(dx, dy))                       \
                                        : vmulq_f32(vmulq_f32(f, dx), dy));                     \
        }                                                                                       \
        for (; b < nb; b++) {                                                                   \
            int8x16_t q0, q1;                                                                   \
            VALUES(&x[b], &q0, &q1);                                                            \
            const float f = (float)vaddvq_s32(DOT32(q0, q1, y[b].qs));                          \
            sum += XY ? f * (h2f(x[b].d) * h2f(y[b].d)) : f * h2f(x[b].d) * h2f(y[b].d);       \
        }                                                                                       \
        *s = sum;                                                                               \
    }

/* Q4_1 / Q5_1 · Q8_1: block term (d_x·d_y)·isum + m_x·s_y. */
#define PG_NEON_DOT_Q8_1(name, XT, VALUES, DOT32)                                               \
    static void name(int64_t n, float *restrict s, const void *restrict vx,                     \
                     const void *restrict vy) {                                                 \
        const XT *x = vx;                                                                       \
        const pg_block_q8_1 *y = vy;                                                            \
        const int64_t nb = n / PG_QK32;                                                         \
        float sum = 0.0f;                                                                       \
        int64_t b = 0;                                                                          \
        for (; b + 4 <= nb; b += 4) {                                                           \
            int32x4_t p[4];                                                                     \
            for (int k = 0; k < 4; k++) {                                                       \
                int8x16_t q0, q1;                                                               \
                VALUES(&x[b + k], &q0, &q1);                                                    \
                p[k] = DOT32(q0, q1, y[b + k].qs);                                              \
            }                                                                                   \
            const float32x4_t f = vcvtq_f32_s32(fold4_s32(p[0], p[1], p[2], p[3]));             \
            const float32x4_t dd = vmulq_f32(fp16x4_at(&x[b], sizeof(XT)),                      \
                                             fp16x4_at(&y[b], sizeof(pg_block_q8_1)));          \
            const float32x4_t ms = vmulq_f32(fp16x4_at((const char *)&x[b] + 2, sizeof(XT)),    \
                                             fp16x4_at((const char *)&y[b] + 2,                 \
                                                       sizeof(pg_block_q8_1)));                 \
            sum = add_in_order4(sum, vaddq_f32(vmulq_f32(dd, f), ms));                          \
        }                                                                                       \
        for (; b < nb; b++) {                                                                   \
            int8x16_t q0, q1;                                                                   \
            VALUES(&x[b], &q0, &q1);                                                            \
            const float dd = h2f(x[b].d) * h2f(y[b].d);                                         \
            sum += dd * (float)vaddvq_s32(DOT32(q0, q1, y[b].qs)) + h2f(x[b].m) * h2f(y[b].s);  \
        }                                                                                       \
        *s = sum;                                                                               \
    }

#endif
