/* Block layouts of the 32-element ("legacy") formats, byte-identical to GGUF / ggml
 * (docs/FORMATS.md §2.2), plus small helpers shared by the scalar and SIMD files. */
#ifndef PG_QUANTS_LEGACY_H
#define PG_QUANTS_LEGACY_H

#include <assert.h>
#include <stdint.h>
#include <string.h>

#include "fp16.h"

#define PG_QK32 32 /* elements per block of every legacy format */

typedef struct { pg_fp16 d; uint8_t qs[PG_QK32 / 2]; } pg_block_q4_0;                /* 18 B */
typedef struct { pg_fp16 d, m; uint8_t qs[PG_QK32 / 2]; } pg_block_q4_1;             /* 20 B */
typedef struct { pg_fp16 d; uint8_t qh[4]; uint8_t qs[PG_QK32 / 2]; } pg_block_q5_0;  /* 22 B */
typedef struct { pg_fp16 d, m; uint8_t qh[4]; uint8_t qs[PG_QK32 / 2]; } pg_block_q5_1; /* 24 B */
typedef struct { pg_fp16 d; int8_t qs[PG_QK32]; } pg_block_q8_0;                     /* 34 B */
/* s = fp16(d * sum(qs)): CPU-internal activation format (never in files). */
typedef struct { pg_fp16 d, s; int8_t qs[PG_QK32]; } pg_block_q8_1;                  /* 36 B */

static_assert(sizeof(pg_block_q4_0) == 18, "block_q4_0 must be 18 bytes");
static_assert(sizeof(pg_block_q4_1) == 20, "block_q4_1 must be 20 bytes");
static_assert(sizeof(pg_block_q5_0) == 22, "block_q5_0 must be 22 bytes");
static_assert(sizeof(pg_block_q5_1) == 24, "block_q5_1 must be 24 bytes");
static_assert(sizeof(pg_block_q8_0) == 34, "block_q8_0 must be 34 bytes");
static_assert(sizeof(pg_block_q8_1) == 36, "block_q8_1 must be 36 bytes");

/* qh is stored unaligned (offset 2 or 4 in the block): read it as little-endian bytes. */
static inline uint32_t pg_load_qh(const uint8_t qh[4]) {
    return (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
}

#if defined(__aarch64__)
#include "quants.h"
/* SDOT integer dots (quants_legacy_dotprod.c); pg_fill_legacy_neon calls it when the CPU has
 * the dot-product extension. */
void pg_fill_legacy_dotprod(pg_type_traits *tbl);
#endif


/* Enter the kernels an instruction-set file defines (static, under these names) into the traits
 * table: the AVX2 and NEON files define the same set, so the table is written once, here. */
#define PG_FILL_LEGACY_KERNELS(tbl) do {                                                      \
    (tbl)[PG_TYPE_F32].vec_dot = vec_dot_f32;                                                 \
    (tbl)[PG_TYPE_F16].vec_dot = vec_dot_f16;                                                 \
    (tbl)[PG_TYPE_F16].to_float = f16_to_float;                                               \
    (tbl)[PG_TYPE_F16].from_float = f16_from_float;                                           \
    (tbl)[PG_TYPE_BF16].vec_dot = vec_dot_bf16;                                               \
    (tbl)[PG_TYPE_BF16].to_float = bf16_to_float;                                             \
    (tbl)[PG_TYPE_Q4_0].vec_dot = vec_dot_q4_0_q8_0;                                          \
    (tbl)[PG_TYPE_Q4_0].to_float = q4_0_to_float;                                             \
    (tbl)[PG_TYPE_Q4_1].vec_dot = vec_dot_q4_1_q8_1;                                          \
    (tbl)[PG_TYPE_Q4_1].to_float = q4_1_to_float;                                             \
    (tbl)[PG_TYPE_Q5_0].vec_dot = vec_dot_q5_0_q8_0;                                          \
    (tbl)[PG_TYPE_Q5_0].to_float = q5_0_to_float;                                             \
    (tbl)[PG_TYPE_Q5_1].vec_dot = vec_dot_q5_1_q8_1;                                          \
    (tbl)[PG_TYPE_Q5_1].to_float = q5_1_to_float;                                             \
    (tbl)[PG_TYPE_Q8_0].vec_dot = vec_dot_q8_0_q8_0;                                          \
    (tbl)[PG_TYPE_Q8_0].to_float = q8_0_to_float;                                             \
    (tbl)[PG_TYPE_Q8_0].from_float = q8_0_from_float;                                         \
    (tbl)[PG_TYPE_Q8_1].to_float = q8_1_to_float;                                             \
    (tbl)[PG_TYPE_Q8_1].from_float = q8_1_from_float;                                         \
} while (0)

#endif
