/* Scalar fp16 / bf16 <-> fp32 conversions (bit-exact, RNE), usable from every translation unit. */
#ifndef PG_FP16_H
#define PG_FP16_H

#include <stdint.h>
#include <string.h>

typedef uint16_t pg_fp16;   /* IEEE binary16 bits */
typedef uint16_t pg_bf16;   /* upper half of an fp32 */

static inline float pg_bits_to_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t pg_f32_to_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static inline float pg_fp16_to_fp32(pg_fp16 h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (exp == 0x1f) return pg_bits_to_f32(sign | 0x7f800000u | (man << 13));   /* inf / nan */
    if (exp == 0) {
        if (man == 0) return pg_bits_to_f32(sign);
        /* subnormal: normalize */
        exp = 127 - 15 + 1;
        while (!(man & 0x400)) { man <<= 1; exp--; }
        man &= 0x3ff;
        return pg_bits_to_f32(sign | (exp << 23) | (man << 13));
    }
    return pg_bits_to_f32(sign | ((exp + 127 - 15) << 23) | (man << 13));
}

static inline pg_fp16 pg_fp32_to_fp16(float f) {
    const uint32_t u = pg_f32_to_bits(f);
    const uint32_t sign = (u >> 16) & 0x8000;
    const uint32_t absu = u & 0x7fffffffu;
    if (absu > 0x7f800000u) return (pg_fp16)(sign | 0x7e00 | ((absu >> 13) & 0x3ff));  /* nan */
    if (absu >= 0x477ff000u) return (pg_fp16)(sign | 0x7c00);   /* rounds to >= 65520: inf */
    if (absu < 0x38800000u) {                                   /* fp16 subnormal or zero */
        if (absu < 0x33000000u) return (pg_fp16)sign;           /* < 2^-25: rounds to 0 */
        const uint32_t e = absu >> 23;
        const uint32_t m = (absu & 0x7fffff) | 0x800000;
        const uint32_t shift = 126 - e;   /* 14 - (e - 127) + 13 - 1 ... as below */
        /* value = m * 2^(e-150); fp16 subnormal unit = 2^-24 -> q = m >> (150-24-e) = m >> (126-e) */
        uint32_t q = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return (pg_fp16)(sign | q);
    }
    /* normal: rebias exponent, round mantissa to 10 bits (RNE); carry may bump the exponent */
    uint32_t r = absu - ((127 - 15) << 23);
    r += 0xfff + ((r >> 13) & 1);
    return (pg_fp16)(sign | (r >> 13));
}

static inline float pg_bf16_to_fp32(pg_bf16 h) { return pg_bits_to_f32((uint32_t)h << 16); }

static inline pg_bf16 pg_fp32_to_bf16(float f) {
    const uint32_t u = pg_f32_to_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (pg_bf16)((u >> 16) | 0x40);   /* quiet nan */
    return (pg_bf16)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

#endif
