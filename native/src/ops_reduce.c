/* Row reductions and sorting on F32 rows (dense rows, any row strides): SUM_ROWS, ARGSORT.
 * Every thread owns whole rows, so results do not depend on the thread count. */
#include <math.h>

#include "ops.h"

/* ---- sum_rows ------------------------------------------------------------------------------ */
void pg_fwd_sum_rows(const pg_cparams *p, pg_tensor *all, pg_tensor *t) {
    const pg_tensor *a = PG_SRC(all, t, 0);
    const int64_t ne0 = a->ne[0], ne1 = a->ne[1], ne2 = a->ne[2];
    int64_t r0, r1;
    pg_split(pg_nrows(a), p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const int64_t i1 = r % ne1, i2 = (r / ne1) % ne2, i3 = r / (ne1 * ne2);
        const float *x = pg_ptr(a, 0, i1, i2, i3);
        double sum = 0.0;   /* summed in double, as ggml_vec_sum_f32 */
        for (int64_t i = 0; i < ne0; i++) sum += (double)x[i];
        *(float *)pg_ptr(t, 0, i1, i2, i3) = (float)sum;
    }
}

/* ---- argsort ------------------------------------------------------------------------------- */
/* The order: by value (ascending or descending), equal values by index, NaNs last by index. A
 * strict total order, so any correct sort gives this one permutation (the Vulkan shader's
 * bitonic sort included); ggml's std::sort leaves the order of ties unspecified. */
static inline int before(const float *x, int32_t a, int32_t b, int desc) {
    const float xa = x[a], xb = x[b];
    const int na = isnan(xa), nb = isnan(xb);
    if (na || nb) return na == nb ? a < b : nb;
    if (xa != xb) return desc ? xa > xb : xa < xb;
    return a < b;
}

static void sift_down(int32_t *idx, int64_t root, int64_t n, const float *x, int desc) {
    for (;;) {
        int64_t c = 2 * root + 1;
        if (c >= n) return;
        if (c + 1 < n && before(x, idx[c], idx[c + 1], desc)) c++;
        if (!before(x, idx[root], idx[c], desc)) return;
        const int32_t tmp = idx[root];
        idx[root] = idx[c];
        idx[c] = tmp;
        root = c;
    }
}

void pg_fwd_argsort(const pg_cparams *p, pg_tensor *all, pg_tensor *t) {
    const pg_tensor *a = PG_SRC(all, t, 0);
    const int64_t n = a->ne[0], ne1 = a->ne[1], ne2 = a->ne[2];
    const int desc = t->op_params[0] == PG_SORT_ORDER_DESC;
    int64_t r0, r1;
    pg_split(pg_nrows(a), p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const int64_t i1 = r % ne1, i2 = (r / ne1) % ne2, i3 = r / (ne1 * ne2);
        const float *x = pg_ptr(a, 0, i1, i2, i3);
        int32_t *idx = pg_ptr(t, 0, i1, i2, i3);
        for (int64_t i = 0; i < n; i++) idx[i] = (int32_t)i;
        /* heapsort: in place (kernels never allocate), O(n log n) for any input */
        for (int64_t i = n / 2; i-- > 0;) sift_down(idx, i, n, x, desc);
        for (int64_t end = n - 1; end > 0; end--) {
            const int32_t tmp = idx[0];
            idx[0] = idx[end];
            idx[end] = tmp;
            sift_down(idx, 0, end, x, desc);
        }
    }
}
