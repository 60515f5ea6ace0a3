/* The layout of the repacked 16-row tiles (pg_type_traits.tile_pack / tile_gemm; quants.h),
 * shared by the pack (gemm_tile.c, portable) and the kernels (gemm_tile_avx512.c). Every field
 * is a 64-byte vector of 16 lanes, lane r = weight row r (rows past nr repeat row 0 and are
 * never stored).
 *
 * K-quants, per super-block of 256 elements (PG_TILE_SB_BYTES):
 *   lv[64]:  uint8 levels, offset removed (0..15 Q4_K, 0..31 Q5_K, 0..63 Q6_K, 0..3 Q2_K,
 *            0..7 Q3_K); chunk e = elements 4e..4e+3 of each row
 *   sc[16]:  int32 scale of group g (16 elements; Q4_K / Q5_K: g < 8, groups of 32)
 *   bw[8]:   int16 pairs (W[2k], W[2k+1]) per row, W the weight of the activations' bsums[g]:
 *            the min (Q2_K, Q4_K, Q5_K; scaled by dmin apart) or the levels' offset times the
 *            scale (Q3_K: 4·sc, Q6_K: 32·sc; subtracted from the level sum)
 *   d, dmin: float (the fp16 fields; dmin 0 where there is none)
 *   IQ4_XS (gemm_tile_avx512.c) has the same layout: levels the codebook values + 128, sc[g]
 *   ls − 32 (g < 8), bw 128·sc, no dmin; gemm_tile_avx2.c's keeps the signed codebook values
 *   (its maddubs takes |a| and the levels signed as a) and no bw.
 * Legacy formats without a min (Q4_0, Q5_0, Q8_0; IQ4_NL, MXFP4 with the codebook's levels and
 * d the fp32 scale), per block of 32 (PG_TILE_LEG_BYTES):
 *   lv[8]:   int8 levels q (−8..7, −16..15, −128..127); chunk e = elements 4e..4e+3
 *   corr:    int32 128·Σq (the kernels dot the levels with the activations + 128, unsigned)
 *   d:       float */
#ifndef PG_GEMM_TILE_H
#define PG_GEMM_TILE_H

#include <stddef.h>
#include <stdint.h>

#include "quants.h"

enum {
    PG_TILE_LV = 0,
    PG_TILE_SC = 64 * 64,
    PG_TILE_BW = PG_TILE_SC + 16 * 64,
    PG_TILE_D = PG_TILE_BW + 8 * 64,
    PG_TILE_DMIN = PG_TILE_D + 64,
    PG_TILE_LEG_CORR = 8 * 64,
    PG_TILE_LEG_D = PG_TILE_LEG_CORR + 64,
    PG_TILE_LEG_BYTES = PG_TILE_LEG_D + 64,
};
_Static_assert(PG_TILE_DMIN + 64 == PG_TILE_SB_BYTES, "K-quant tile layout");
_Static_assert(PG_TILE_LEG_BYTES * 8 <= PG_TILE_SB_BYTES, "a legacy tile fits the K-quants'");

/* gemm_tile.c: the K-quant packs (pg_tile_pack_fn) */
void pg_tile_pack_q2_K(int64_t n, const void *x, size_t bx, int nr, void *tile);
void pg_tile_pack_q3_K(int64_t n, const void *x, size_t bx, int nr, void *tile);
void pg_tile_pack_q4_K(int64_t n, const void *x, size_t bx, int nr, void *tile);
void pg_tile_pack_q5_K(int64_t n, const void *x, size_t bx, int nr, void *tile);
void pg_tile_pack_q6_K(int64_t n, const void *x, size_t bx, int nr, void *tile);
/* gemm_tile_pack_avx512.c: the same tiles, 16 rows at once by gathers (x86-64 only) */
void pg_tile_pack_q4_K_avx512(int64_t n, const void *x, size_t bx, int nr, void *tile);
void pg_tile_pack_q5_K_avx512(int64_t n, const void *x, size_t bx, int nr, void *tile);
void pg_tile_pack_q6_K_avx512(int64_t n, const void *x, size_t bx, int nr, void *tile);
/* gemm_tile_pack_avx2.c: the same tiles, 8 rows at a time by gathers (x86-64 only) */
void pg_tile_pack_q4_K_avx2(int64_t n, const void *x, size_t bx, int nr, void *tile);
void pg_tile_pack_q5_K_avx2(int64_t n, const void *x, size_t bx, int nr, void *tile);
void pg_tile_pack_q6_K_avx2(int64_t n, const void *x, size_t bx, int nr, void *tile);

/* ---- using the tiles (ops_mul_mat.c; MUL_MAT and MUL_MAT_ID share them) --------------------
 * Nothing changes the weights in memory: each thread packs 16 weight rows at a time into its
 * own scratch (pg_tile_scratch_bytes(K)), once per MUL_MAT (per expert for MUL_MAT_ID), and the
 * tile serves every activation row of the product; mapped weights stay mapped. */

/* Activation rows from which a product takes the tiles: each tile is written once per product
 * and pays off over the rows it serves (dense MUL_MAT: rows of the matrix, always from
 * PG_TILE_MIN_ROWS; MUL_MAT_ID: rows routed to the expert, from pg_tile_min_rows). */
#define PG_TILE_MIN_ROWS 32
#define PG_TILE_MIN_ROWS_FAST 12
/* PG_TILE_MIN_ROWS for the portable K-quant packs, 24 for avx2's K-quant gathers,
 * PG_TILE_MIN_ROWS_FAST for the other vectorized packs (ops_mul_mat.c says why) */
int64_t pg_tile_min_rows(const pg_type_traits *tr);

/* whether some path has tiles for this weight type (work sizes cover every path's needs) */
int pg_tile_type_possible(int32_t type);
/* one thread's tile scratch for rows of K elements */
size_t pg_tile_scratch_bytes(int64_t K);
/* Weight rows [n0, n1) of w (rows wnb1 bytes apart, K elements, tr's type, tr->tile_pack set)
 * times M activation rows act (tr's vec_dot_type, rb bytes apart), 16 weight rows at a time
 * through `tile`: activation row m's dot with weight row n goes to
 *   out_rows ? out_rows[m][n] : ((float *)((char *)dst + m·bs))[n],
 * with the bits of the type's vec_dot. */
void pg_tile_product(const pg_type_traits *tr, int64_t K, const uint8_t *w, size_t wnb1,
                     int64_t n0, int64_t n1, const uint8_t *act, size_t rb, int64_t M,
                     float *dst, size_t bs, float *const *out_rows, void *tile);

#endif
