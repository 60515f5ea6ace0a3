/* Helpers shared by the gemm kernel files (gemm.c and the per-ISA gemm_*.c; see quants.h for
 * the contract of pg_type_traits.gemm).
 *
 * The SIMD kernels always compute a full PG_GEMM_MAX_NR × PG_GEMM_MAX_NC block: a smaller block
 * repeats its first row (or column) in the unused slots, and only the nr × nc wanted dots are
 * stored. One compiled body per type, and every dot goes through the same instructions whatever
 * the block's shape (results independent of tiling). Repeated rows are read again, never rows
 * past the caller's. */
#ifndef PG_GEMM_H
#define PG_GEMM_H

#include <stddef.h>

#include "quants.h"

#define PG_GR PG_GEMM_MAX_NR
#define PG_GC PG_GEMM_MAX_NC

/* Row pointers of the block: x[i] = weight row i, y[j] = activation row j. */
typedef struct {
    const char *x[PG_GR];
    const char *y[PG_GC];
} pg_gemm_rows;

static inline pg_gemm_rows pg_gemm_rows_of(const void *x, size_t bx, const void *y, size_t by,
                                           int nr, int nc) {
    pg_gemm_rows r;
    for (int i = 0; i < PG_GR; i++) r.x[i] = (const char *)x + (i < nr ? (size_t)i * bx : 0);
    for (int j = 0; j < PG_GC; j++) r.y[j] = (const char *)y + (j < nc ? (size_t)j * by : 0);
    return r;
}

#if defined(__aarch64__)
/* gemm_dotprod.c: the SDOT kernels, installed by pg_fill_gemm_neon when the CPU has them. */
void pg_fill_gemm_dotprod(pg_type_traits *tbl);
#endif

/* out[j][i] -> s + j·bs (bytes) + i floats, for i < nr, j < nc. */
static inline void pg_gemm_store(float *s, size_t bs, const float out[PG_GC][PG_GR], int nr,
                                 int nc) {
    for (int j = 0; j < nc; j++) {
        float *d = (float *)((char *)s + (size_t)j * bs);
        for (int i = 0; i < nr; i++) d[i] = out[j][i];
    }
}

#endif
