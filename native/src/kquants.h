/* K-quant block layouts (256-element super-blocks) shared by the scalar and per-ISA kernels.
 * Byte-identical with GGUF; see docs/FORMATS.md §2.3 for the element mapping.
 * Every block struct has a static size assertion: a layout change breaks the build, not files. */
#ifndef PG_KQUANTS_H
#define PG_KQUANTS_H

#include <stdint.h>
#include <string.h>

#define PG_QK_K 256

typedef struct {
    uint8_t  scales[16];   /* low nibble: scale, high nibble: min, per 16 elements */
    uint8_t  qs[64];       /* 2-bit quants, 4 per byte                              */
    uint16_t d;            /* fp16 super-block scale for the scales                 */
    uint16_t dmin;         /* fp16 super-block scale for the mins                   */
} pg_block_q2_K;
_Static_assert(sizeof(pg_block_q2_K) == 84, "Q2_K block must be 84 bytes");

typedef struct {
    uint8_t  hmask[32];    /* high bit of each quant (set: no -4 offset)            */
    uint8_t  qs[64];       /* low 2 bits                                            */
    uint8_t  scales[12];   /* 16 signed 6-bit scales, offset by 32                  */
    uint16_t d;            /* fp16                                                  */
} pg_block_q3_K;
_Static_assert(sizeof(pg_block_q3_K) == 110, "Q3_K block must be 110 bytes");

typedef struct {
    uint16_t d;            /* fp16 scale of the 6-bit scales                        */
    uint16_t dmin;         /* fp16 scale of the 6-bit mins                          */
    uint8_t  scales[12];   /* 8 scales + 8 mins, 6 bits each                        */
    uint8_t  qs[128];      /* 4-bit quants                                          */
} pg_block_q4_K;
_Static_assert(sizeof(pg_block_q4_K) == 144, "Q4_K block must be 144 bytes");

typedef struct {
    uint16_t d;
    uint16_t dmin;
    uint8_t  scales[12];
    uint8_t  qh[32];       /* 5th bit: bit j of qh[l] belongs to sub-block j        */
    uint8_t  qs[128];
} pg_block_q5_K;
_Static_assert(sizeof(pg_block_q5_K) == 176, "Q5_K block must be 176 bytes");

typedef struct {
    uint8_t  ql[128];      /* low 4 bits                                            */
    uint8_t  qh[64];       /* high 2 bits                                           */
    int8_t   scales[16];   /* signed 8-bit scale per 16 elements                    */
    uint16_t d;            /* fp16                                                  */
} pg_block_q6_K;
_Static_assert(sizeof(pg_block_q6_K) == 210, "Q6_K block must be 210 bytes");

typedef struct {
    float    d;            /* fp32 scale                                            */
    int8_t   qs[256];
    int16_t  bsums[16];    /* sum of qs over each group of 16                       */
} pg_block_q8_K;
_Static_assert(sizeof(pg_block_q8_K) == 292, "Q8_K block must be 292 bytes");

/* Q4_K / Q5_K: the 12 scale bytes as 8 scales (out[0..7]) and 8 mins (out[8..15]), 6 bits each.
 * Bytes 0..3: sc0..3 + top bits of sc4..7; 4..7: m0..3 + top bits of m4..7; 8..11: low nibbles
 * of sc4..7 (low half) and m4..7 (high half). Done on 32-bit words, little-endian. */
static inline void pg_k4_unpack_scales(const uint8_t *b, uint8_t out[16]) {
    uint32_t u[3], r[4];
    memcpy(u, b, 12);
    r[0] = u[0] & 0x3f3f3f3fu;                                          /* sc0..3 */
    r[1] = (u[2] & 0x0f0f0f0fu) | ((u[0] >> 2) & 0x30303030u);          /* sc4..7 */
    r[2] = u[1] & 0x3f3f3f3fu;                                          /* m0..3  */
    r[3] = ((u[2] >> 4) & 0x0f0f0f0fu) | ((u[1] >> 2) & 0x30303030u);   /* m4..7  */
    memcpy(out, r, 16);
}

/* Q3_K: the 12 scale bytes as 16 signed scales (value - 32), i = 0..15. */
static inline void pg_k3_unpack_scales(const uint8_t *b, int8_t out[16]) {
    uint32_t u[3], r[4];
    memcpy(u, b, 12);
    r[0] = (u[0] & 0x0f0f0f0fu)        | ((u[2] << 4) & 0x30303030u);
    r[1] = (u[1] & 0x0f0f0f0fu)        | ((u[2] << 2) & 0x30303030u);
    r[2] = ((u[0] >> 4) & 0x0f0f0f0fu) | (u[2] & 0x30303030u);
    r[3] = ((u[1] >> 4) & 0x0f0f0f0fu) | ((u[2] >> 2) & 0x30303030u);
    uint8_t v[16];
    memcpy(v, r, 16);
    for (int k = 0; k < 16; k++) out[k] = (int8_t)(v[k] - 32);
}

#if defined(__aarch64__)
/* quants_kquants_dotprod.c: SDOT dot kernels over a NEON table (called by pg_fill_kquants_neon
 * when the CPU has the dot-product extension). */
struct pg_type_traits;
void pg_fill_kquants_dotprod(struct pg_type_traits *tbl);
#endif

#endif
