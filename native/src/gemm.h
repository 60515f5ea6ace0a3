/* Helpers shared by the gemm kernel files (gemm.c and the per-ISA gemm_*.c; see quants.h for
 * the contract of pg_type_traits.gemm).
 *
 * Most SIMD kernels are written for blocks of PG_GR = 4 weight rows × PG_GC = 4 activation
 * rows and always compute a full one: a smaller block repeats its first row (or column) in the
 * unused slots, and only the nr × nc wanted dots are stored. PG_GEMM_BY4 makes such a kernel
 * one of up to PG_GEMM_MAX_NR × PG_GEMM_MAX_NC (4 × 4 at a time). One compiled body per type,
 * and every dot goes through the same instructions whatever the block's shape (results
 * independent of tiling). Repeated rows are read again, never rows past the caller's. */
#ifndef PG_GEMM_H
#define PG_GEMM_H

#include <stddef.h>

#include "quants.h"

#define PG_GR 4
#define PG_GC 4

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

/* name: a gemm of up to PG_GEMM_MAX_NR × PG_GEMM_MAX_NC rows from body4, one of up to
 * PG_GR × PG_GC (called for each group of 4 weight rows and 4 activation rows) */
#define PG_GEMM_BY4(name, body4)                                                                   \
    static void name(int64_t n, float *restrict s, size_t bs, const void *restrict x, size_t bx,   \
                     const void *restrict y, size_t by, int nr, int nc) {                          \
        for (int j0 = 0; j0 < nc; j0 += PG_GC)                                                     \
            for (int i0 = 0; i0 < nr; i0 += PG_GR)                                                 \
                body4(n, (float *)((char *)s + (size_t)j0 * bs) + i0, bs,                          \
                      (const char *)x + (size_t)i0 * bx, bx, (const char *)y + (size_t)j0 * by,    \
                      by, nr - i0 < PG_GR ? nr - i0 : PG_GR, nc - j0 < PG_GC ? nc - j0 : PG_GC);   \
    }

#if defined(__x86_64__)
/* gemm_avx2.c: the avx2 path's gemm column for a CPU with `features` (PG_CPU_AVXVNNI: the
 * AVX-VNNI form, else the AVX2-only one); pg_fill_gemm_avx2 passes this CPU's. Tests fill both. */
void pg_fill_gemm_avx2_for(pg_type_traits *tbl, uint32_t features);
#endif

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
