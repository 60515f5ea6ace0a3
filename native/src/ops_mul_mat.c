/* MUL_MAT: dst[N, M, B2, B3] = src1[K, M, B2, B3] · src0[K, N, A2, A3]ᵀ, src0 broadcast over
 * B2/A2 and B3/A3 (ggml's convention). Activations (src1, F32) are converted once per row into the
 * weight type's vec_dot_type in the shared work buffer (all threads share the rows, then a
 * barrier); then each thread computes a contiguous range of the larger output dimension, so in
 * decode (M = 1) every thread streams its own weight rows and no row is read twice. */
#include <string.h>

#include "ops.h"

#define PG_MM_TILE_N 16   /* weight rows per tile */
#define PG_MM_TILE_M 16   /* activation rows per tile */

static size_t act_bytes(const pg_tensor *src0, const pg_tensor *src1, size_t *row_bytes) {
    const int32_t vdt = pg_get_type_traits(src0->type)->vec_dot_type;
    *row_bytes = pg_type_row_size(vdt, src1->ne[0]);
    if (vdt == src1->type) return 0;   /* F32 weights read the activations in place */
    return *row_bytes * (size_t)pg_nrows(src1);
}

size_t pg_mul_mat_work_size(const pg_tensor *all, const pg_tensor *t, int nth) {
    (void)nth;
    size_t rb;
    return act_bytes(PG_SRC(all, t, 0), PG_SRC(all, t, 1), &rb);
}

void pg_fwd_mul_mat(const pg_cparams *p, pg_tensor *all, pg_tensor *t) {
    const pg_tensor *w = PG_SRC(all, t, 0), *x = PG_SRC(all, t, 1);
    const pg_type_traits *tr = pg_get_type_traits(w->type);
    const int32_t vdt = tr->vec_dot_type;
    const int64_t K = w->ne[0], N = w->ne[1];
    const int64_t M = x->ne[1], B2 = x->ne[2], B3 = x->ne[3];
    const int64_t r2 = B2 / w->ne[2], r3 = B3 / w->ne[3];
    size_t rb;
    const int convert = act_bytes(w, x, &rb) != 0;

    if (convert) {
        const pg_type_traits *tv = pg_get_type_traits(vdt);
        int64_t a0, a1;
        pg_split(pg_nrows(x), p->ith, p->nth, &a0, &a1);
        for (int64_t r = a0; r < a1; r++) {
            const int64_t i1 = r % M, i2 = (r / M) % B2, i3 = r / (M * B2);
            tv->from_float(pg_ptr(x, 0, i1, i2, i3), p->work + (size_t)r * rb, K);
        }
        pg_sync(p);
    }

    /* split the larger output dimension: weight rows (N) or activation rows (M*B2*B3) */
    const int64_t MM = M * B2 * B3;
    const int split_n = N >= MM;
    int64_t n0 = 0, n1 = N, m0 = 0, m1 = MM;
    if (split_n) pg_split(N, p->ith, p->nth, &n0, &n1);
    else pg_split(MM, p->ith, p->nth, &m0, &m1);

    for (int64_t mt = m0; mt < m1; mt += PG_MM_TILE_M) {
        const int64_t mt1 = mt + PG_MM_TILE_M < m1 ? mt + PG_MM_TILE_M : m1;
        for (int64_t nt = n0; nt < n1; nt += PG_MM_TILE_N) {
            const int64_t nt1 = nt + PG_MM_TILE_N < n1 ? nt + PG_MM_TILE_N : n1;
            for (int64_t m = mt; m < mt1; m++) {
                const int64_t i1 = m % M, i2 = (m / M) % B2, i3 = m / (M * B2);
                const void *xr = convert ? (const void *)(p->work + (size_t)m * rb)
                                         : (const void *)pg_ptr(x, 0, i1, i2, i3);
                const uint8_t *wplane = pg_ptr(w, 0, 0, i2 / r2, i3 / r3);
                float *dst = pg_ptr(t, 0, i1, i2, i3);
                for (int64_t n = nt; n < nt1; n++)
                    tr->vec_dot(K, &dst[n], wplane + n * w->nb[1], xr);
            }
        }
    }
}
