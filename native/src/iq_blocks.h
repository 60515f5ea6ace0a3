/* Block layouts of the codebook i-quants (ggml-common.h), shared by quants_iq_grid.c (scalar)
 * and quants_iq_grid_avx2.c. */
#ifndef PG_IQ_BLOCKS_H
#define PG_IQ_BLOCKS_H

#include <stdint.h>

#include "fp16.h"

typedef struct { pg_fp16 d; uint16_t qs[32]; } pg_block_iq2_xxs;
typedef struct { pg_fp16 d; uint16_t qs[32]; uint8_t scales[8]; } pg_block_iq2_xs;
typedef struct { pg_fp16 d; uint8_t qs[64]; uint8_t qh[8]; uint8_t scales[8]; } pg_block_iq2_s;
typedef struct { pg_fp16 d; uint8_t qs[96]; } pg_block_iq3_xxs;
typedef struct {
    pg_fp16 d; uint8_t qs[64]; uint8_t qh[8]; uint8_t signs[32]; uint8_t scales[4];
} pg_block_iq3_s;
typedef struct { pg_fp16 d; uint8_t qs[32]; uint16_t qh[8]; } pg_block_iq1_s;
typedef struct { uint8_t qs[32]; uint8_t qh[16]; uint8_t scales[8]; } pg_block_iq1_m;
_Static_assert(sizeof(pg_block_iq2_xxs) == 66, "IQ2_XXS block must be 66 bytes");
_Static_assert(sizeof(pg_block_iq2_xs) == 74, "IQ2_XS block must be 74 bytes");
_Static_assert(sizeof(pg_block_iq2_s) == 82, "IQ2_S block must be 82 bytes");
_Static_assert(sizeof(pg_block_iq3_xxs) == 98, "IQ3_XXS block must be 98 bytes");
_Static_assert(sizeof(pg_block_iq3_s) == 110, "IQ3_S block must be 110 bytes");
_Static_assert(sizeof(pg_block_iq1_s) == 50, "IQ1_S block must be 50 bytes");
_Static_assert(sizeof(pg_block_iq1_m) == 56, "IQ1_M block must be 56 bytes");

#endif
