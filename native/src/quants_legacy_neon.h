/* NEON helpers shared by quants_legacy_neon.c and quants_legacy_dotprod.c: unpacking of the
 * legacy blocks into signed bytes (elements 0..15 in q0, 16..31 in q1). */
#ifndef PG_QUANTS_LEGACY_NEON_H
#define PG_QUANTS_LEGACY_NEON_H

#include <arm_neon.h>

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

#endif
