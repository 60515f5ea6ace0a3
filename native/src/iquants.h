/* Non-linear 4-bit formats (IQ4_NL, IQ4_XS) and MXFP4: block layouts, value tables and scale
 * conversions shared by the scalar kernels (quants_iq.c) and the per-ISA ones (quants_iq_*.c).
 * Byte-identical with GGUF (ggml-common.h); every block struct has a static size assertion.
 *
 *   IQ4_NL  32 elements: fp16 d, 16 bytes of nibbles; x = d · kv_iq4nl[nibble]
 *           (low nibbles elements 0..15, high nibbles 16..31, as Q4_0)
 *   IQ4_XS  256 elements: fp16 d, 8 sub-block scales of 6 bits (low 4 in scales_l, high 2 in
 *           scales_h), 128 bytes of nibbles laid out per 32 as IQ4_NL;
 *           x = (d · (ls − 32)) · kv_iq4nl[nibble]
 *   MXFP4   32 elements: E8M0 exponent e, 16 bytes of nibbles (E2M1 codes, doubled values in
 *           kv_mxfp4); x = kv_mxfp4[nibble] · 2^(e − 128)
 *
 * The dot partners are ggml's: IQ4_NL and MXFP4 with Q8_0, IQ4_XS with Q8_K. */
#ifndef PG_IQUANTS_H
#define PG_IQUANTS_H

#include <stdint.h>
#include <string.h>

#include "fp16.h"
#include "kquants.h"
#include "quants_legacy.h"

typedef struct { pg_fp16 d; uint8_t qs[16]; } pg_block_iq4_nl;
_Static_assert(sizeof(pg_block_iq4_nl) == 18, "IQ4_NL block must be 18 bytes");

typedef struct {
    pg_fp16  d;
    uint16_t scales_h;     /* high 2 bits of the 8 scales, 2 bits each                       */
    uint8_t  scales_l[4];  /* low 4 bits: sub-block 2k in the low nibble of byte k, 2k+1 high */
    uint8_t  qs[128];
} pg_block_iq4_xs;
_Static_assert(sizeof(pg_block_iq4_xs) == 136, "IQ4_XS block must be 136 bytes");

typedef struct { uint8_t e; uint8_t qs[16]; } pg_block_mxfp4;
_Static_assert(sizeof(pg_block_mxfp4) == 17, "MXFP4 block must be 17 bytes");

static const int8_t pg_kv_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                       1,    13,   25,  38,  53,  69,  89,  113};
static const int8_t pg_kv_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* 2^(e − 128) = E8M0 / 2 (the E2M1 values in kv_mxfp4 are doubled); e < 2 are subnormals. */
static inline float pg_e8m0_half(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* IQ4_XS: the 6-bit scale of sub-block ib (0..7), minus 32. */
static inline int pg_iq4xs_scale(const pg_block_iq4_xs *x, int ib) {
    const int ls = ((x->scales_l[ib / 2] >> 4 * (ib % 2)) & 0xf) |
                   (((x->scales_h >> 2 * ib) & 3) << 4);
    return ls - 32;
}

#endif
