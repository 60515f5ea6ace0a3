/* Per-type kernel traits, filled per kernel path at load time (ggml's type_traits + cpu traits).
 *
 * Each family of formats owns one fill function per path; dispatch.c builds the tables:
 *   scalar = legacy_scalar + kquants_scalar           (the reference for everything)
 *   avx2   = scalar, then legacy_avx2 + kquants_avx2 override what they implement
 *   avx512 = avx2,   then legacy_avx512 + kquants_avx512 (optional extras)
 *   neon   = scalar, then legacy_neon + kquants_neon (which may use dotprod if `features` has it)
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

typedef struct pg_type_traits {
    int32_t          block_size;     /* elements per block                                   */
    int32_t          type_size;      /* bytes per block                                      */
    pg_to_float_fn   to_float;       /* NULL: cannot dequantize                              */
    pg_from_float_fn from_float_ref; /* reference quantizer, bit-exact with gguf; NULL: none */
    pg_from_float_fn from_float;     /* fast quantizer (for activations); may equal the ref  */
    pg_vec_dot_fn    vec_dot;        /* NULL: no dot kernel for this type                    */
    int32_t          vec_dot_type;   /* type the other operand of vec_dot must be in         */
} pg_type_traits;

/* Traits of `type` for the current path; NULL if type is out of range. */
const pg_type_traits *pg_get_type_traits(int32_t type);
/* Traits of `type` for a given path (tests compare paths); NULL if out of range or the path is
 * not compiled in. The table exists even if this CPU cannot run it: check pg_set_cpu_path. */
const pg_type_traits *pg_get_type_traits_for_path(int32_t type, int32_t path);

/* Fill functions (see the comment at the top). `tbl` has PG_TYPE_COUNT entries. */
void pg_fill_legacy_scalar(pg_type_traits *tbl);
void pg_fill_kquants_scalar(pg_type_traits *tbl);
#if defined(__x86_64__)
void pg_fill_legacy_avx2(pg_type_traits *tbl);
void pg_fill_kquants_avx2(pg_type_traits *tbl);
void pg_fill_legacy_avx512(pg_type_traits *tbl);
void pg_fill_kquants_avx512(pg_type_traits *tbl);
#endif
#if defined(__aarch64__)
void pg_fill_legacy_neon(pg_type_traits *tbl, uint32_t features);
void pg_fill_kquants_neon(pg_type_traits *tbl, uint32_t features);
#endif

#endif
