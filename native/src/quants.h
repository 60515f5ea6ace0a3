/* Per-type kernel traits, filled per kernel path at load time (ggml's type_traits + cpu traits).
 *
 * Each family of formats owns one fill function per path; dispatch.c builds the tables:
 *   scalar = legacy_scalar + kquants_scalar           (the reference for everything)
 *   avx2   = scalar, then legacy_avx2 + kquants_avx2 override what they implement
 *   avx512 = avx2,   then legacy_avx512 + kquants_avx512 (optional extras)
 *   amx    = avx512, plus the AMX tile gemms (gemm_amx.c) of the K-quants it has
 *   neon   = scalar, then legacy_neon + kquants_neon (which may use dotprod if `features` has it)
 * and each table last gets its gemm fill (gemm_scalar / _avx2 / _avx512 / _neon).
 * A fill function only sets the members it implements and leaves the others alone. */
#ifndef PG_QUANTS_H
#define PG_QUANTS_H

#include <stddef.h>
#include <stdint.h>

#include "pyggml.h"

/* Dequantize / convert n values (n a multiple of the block size) of a row to fp32. */
typedef void (*pg_to_float_fn)(const void *restrict x, float *restrict y, int64_t n);
/* Quantize / convert n fp32 values (n a multiple of the block size) into blocks. */
typedef void (*pg_from_float_fn)(const float *restrict x, void *restrict y, int64_t n);
/* *s = dot(x, y) over n elements; x in this type, y in vec_dot_type. */
typedef void (*pg_vec_dot_fn)(int64_t n, float *restrict s, const void *restrict x,
                              const void *restrict y);
/* A block of dots for prompt-sized MUL_MAT (gemm*.c): for i < nr weight rows (x, rows bx bytes
 * apart) and j < nc activation rows (y, in vec_dot_type, rows by bytes apart), over n elements,
 *     ((float *)((char *)s + j·bs))[i] = dot(x row i, y row j),
 * with 1 <= nr <= PG_GEMM_MAX_NR and 1 <= nc <= PG_GEMM_MAX_NC. Each dot is computed by the
 * same operations in the same order whatever nr, nc and the position in the block, so a
 * MUL_MAT's result does not depend on how it was tiled (or on the thread count). Every gemm
 * and every vec_dot of every path equals the scalar vec_dot bit for bit (exact integer block
 * sums, the scalar kernel's fp32 block terms added in block order): a token's MUL_MAT row is
 * the same bits whether it is computed alone (decode, vec_dot) or in a batch (gemm). */
typedef void (*pg_gemm_fn)(int64_t n, float *restrict s, size_t bs, const void *restrict x,
                           size_t bx, const void *restrict y, size_t by, int nr, int nc);
#define PG_GEMM_MAX_NR 8
#define PG_GEMM_MAX_NC 8
/* ((float *)((char *)s + j·bs))[i] = dot(x row i, y row j) for the 8 weight rows at x (rows bx
 * bytes apart) and nc (1..PG_DOT8_MAX_NC) activation rows at y (by bytes apart, vec_dot_type),
 * with the bits of vec_dot: decode's MUL_MAT, 8 weight rows at a time, and a few tokens at once
 * (speculative verification, a few server streams) reading each weight row once. */
typedef void (*pg_vec_dot8_fn)(int64_t n, float *restrict s, size_t bs, const void *restrict x,
                               size_t bx, const void *restrict y, size_t by, int nc);
#define PG_DOT8_MAX_NC 8
/* the x86 vec_dot8 kernels' prefetch of the next group of rows goes to L2 (kq_dot8_prefetch in
 * kquants_x86.h says why); expanded where immintrin.h is included */
#define PG_DOT8_PREFETCH_HINT _MM_HINT_T1
/* The AMX tile gemm (amx.h, gemm_amx.c): for nrows weight rows (x, rows bx bytes apart) and
 * the M activation rows packed in `act` (pg_amx_pack_act tiles),
 *     ((float *)((char *)s + m·bs))[i] = dot(x row i, activation row m),
 * with the bits of the type's vec_dot. scratch: pg_amx_scratch_bytes(n), the thread's own. */
typedef void (*pg_amx_gemm_fn)(int64_t n, const void *x, size_t bx, int64_t nrows,
                               const uint8_t *act, int64_t M, float *s, size_t bs,
                               void *scratch);

/* The repacked 16-row tile of prompt-sized K-quant MUL_MATs (gemm_tile_avx512.c says why):
 * tile_pack writes weight rows x (nr of them, 1..PG_TILE_ROWS, rows bx bytes apart, n elements)
 * into `tile` (PG_TILE_SB_BYTES per 256 elements); tile_gemm computes, for
 * i < nr and the nc activation rows y (vec_dot_type, by bytes apart),
 *     ((float *)((char *)s + j·bs))[i] = dot(x row i, y row j),
 * with the bits of the type's vec_dot. */
typedef void (*pg_tile_pack_fn)(int64_t n, const void *x, size_t bx, int nr, void *tile);
typedef void (*pg_tile_gemm_fn)(int64_t n, const void *tile, const void *y, size_t by,
                                int64_t nc, float *s, size_t bs, int nr);
#define PG_TILE_ROWS 16
#define PG_TILE_SB_BYTES 5760

typedef struct pg_type_traits {
    int32_t          block_size;     /* elements per block                                   */
    int32_t          type_size;      /* bytes per block                                      */
    pg_to_float_fn   to_float;       /* NULL: cannot dequantize                              */
    pg_from_float_fn from_float_ref; /* reference quantizer, bit-exact with gguf; NULL: none */
    pg_from_float_fn from_float;     /* fast quantizer (for activations); may equal the ref  */
    pg_vec_dot_fn    vec_dot;        /* NULL: no dot kernel for this type                    */
    int32_t          vec_dot_type;   /* type the other operand of vec_dot must be in         */
    pg_gemm_fn       gemm;           /* optional (NULL: MUL_MAT calls vec_dot pair by pair)  */
    pg_vec_dot8_fn   vec_dot8;       /* optional (NULL: decode calls vec_dot row by row)     */
    int32_t          vec_dot8_rows;  /* MUL_MAT takes vec_dot8 up to this many activation rows,
                                        the gemm beyond (tuned per kernel; 1: decode only)    */
    pg_amx_gemm_fn   amx_gemm;       /* the amx path only, for K-quants; NULL elsewhere      */
    pg_tile_pack_fn  tile_pack;      /* optional, with tile_gemm (K-quants, avx512 + VNNI)   */
    pg_tile_gemm_fn  tile_gemm;
} pg_type_traits;

/* Traits of `type` for the current path; NULL if type is out of range. */
const pg_type_traits *pg_get_type_traits(int32_t type);
/* Traits of `type` for a given path (tests compare paths); NULL if out of range or the path is
 * not compiled in. The table exists even if this CPU cannot run it: check pg_set_cpu_path. */
const pg_type_traits *pg_get_type_traits_for_path(int32_t type, int32_t path);

/* Fill functions (see the comment at the top). `tbl` has PG_TYPE_COUNT entries. */
void pg_fill_legacy_scalar(pg_type_traits *tbl);
void pg_fill_kquants_scalar(pg_type_traits *tbl);
void pg_fill_iquants_scalar(pg_type_traits *tbl);   /* IQ4_NL, IQ4_XS, MXFP4 (quants_iq.c) */
void pg_fill_iq_grid_scalar(pg_type_traits *tbl);   /* IQ1_*, IQ2_*, IQ3_* (quants_iq_grid.c) */
void pg_fill_tq_scalar(pg_type_traits *tbl);        /* TQ1_0, TQ2_0 (quants_tq.c) */
void pg_fill_gemm_scalar(pg_type_traits *tbl);
#if defined(__x86_64__)
void pg_fill_legacy_avx2(pg_type_traits *tbl);
void pg_fill_kquants_avx2(pg_type_traits *tbl);
void pg_fill_legacy_avx512(pg_type_traits *tbl);
void pg_fill_kquants_avx512(pg_type_traits *tbl);
/* The avx2 and neon gemm fills replace the whole gemm column: a type without a kernel on that
 * path gets NULL (the scalar gemm would be slower than the path's vec_dot). The avx512 fill
 * (only with VNNI) overrides the types it has and keeps the avx2 kernels of the others. */
void pg_fill_gemm_avx2(pg_type_traits *tbl);
void pg_fill_gemm_avx512(pg_type_traits *tbl);
void pg_fill_gemm_tile_avx512(pg_type_traits *tbl);   /* called by pg_fill_gemm_avx512 */
void pg_fill_gemm_tile_avx2(pg_type_traits *tbl);     /* called by pg_fill_gemm_avx2_for */
/* quants_iq_avx2.c: vec_dot, vec_dot8 and gemm of the iquants; called after the gemm fills */
void pg_fill_iquants_avx2(pg_type_traits *tbl);
void pg_fill_iq_grid_avx2(pg_type_traits *tbl);     /* quants_iq_grid_avx2.c */
void pg_fill_iquants_avx512(pg_type_traits *tbl);   /* quants_iq_avx512.c (VNNI only) */
void pg_fill_iq_grid_avx512(pg_type_traits *tbl);   /* quants_iq_grid_avx512.c (VBMI + VNNI) */
void pg_fill_tq_avx2(pg_type_traits *tbl);          /* quants_tq_avx2.c: TQ1_0, TQ2_0 */
#endif
#if defined(__aarch64__)
void pg_fill_legacy_neon(pg_type_traits *tbl, uint32_t features);
void pg_fill_kquants_neon(pg_type_traits *tbl, uint32_t features);
void pg_fill_gemm_neon(pg_type_traits *tbl, uint32_t features);
void pg_fill_iquants_neon(pg_type_traits *tbl, uint32_t features);   /* quants_iq_neon.c */
/* quants_iq_tq_neon.c: the codebook i-quants and TQ1_0/TQ2_0 (vec_dot, vec_dot8, gemm), the
 * dotprod ones (quants_iq_tq_dotprod.c) where `features` has it; called by pg_fill_iquants_neon */
void pg_fill_iq_tq_neon(pg_type_traits *tbl, uint32_t features);
void pg_fill_iq_tq_dotprod(pg_type_traits *tbl);
#endif

#endif
