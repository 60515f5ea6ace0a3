/* The AMX int8 tile gemm of the `amx` path (gemm_amx.c), driven by MUL_MAT (ops_mul_mat.c):
 *   1. the activation rows (F32) are packed once per MUL_MAT, 16 rows per tile, into the tile
 *      unit's operand layout (Q8_K levels and scales: pg_amx_pack_act);
 *   2. each thread runs pg_type_traits.amx_gemm on its share of the weight rows (16 at a time,
 *      each block unpacked once into its scratch of pg_amx_scratch_bytes) for all tiles.
 * Outputs have the bits of the type's vec_dot (quants.h). */
#ifndef PG_AMX_H
#define PG_AMX_H

#include <stddef.h>
#include <stdint.h>

#include "quants.h"

#define PG_AMX_TILE_ROWS 16

/* bytes of one packed activation tile (16 rows of K elements) */
size_t pg_amx_act_tile_bytes(int64_t K);
/* per-thread scratch of amx_gemm and pg_amx_pack_act (an unpacked weight block, a Q8_K row) */
size_t pg_amx_scratch_bytes(int64_t K);
/* Rows [0, nrows) (nrows <= 16) of x (F32, rows bx bytes apart, K elements) quantized by q8k
 * (the path's Q8_K from_float) into one tile; rows nrows..15 are zeros. */
void pg_amx_pack_act(pg_from_float_fn q8k, const char *x, size_t bx, int64_t K, int nrows,
                     uint8_t *tile, void *scratch);

#if defined(__x86_64__)
void pg_fill_gemm_amx(pg_type_traits *tbl);
#endif

#endif
