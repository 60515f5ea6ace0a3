/* Data movement: get_rows (dequantizing), set_rows (KV writes, converting), cpy/cont between
 * float types and into row-quantized types, concat. */
#include <string.h>

#include "fp16.h"
#include "ops.h"

int pg_type_is_float(int32_t type) {
    return type == PG_TYPE_F32 || type == PG_TYPE_F16 || type == PG_TYPE_BF16;
}

static inline float load_f(int32_t type, const void *p) {
    switch (type) {
    case PG_TYPE_F16:  return pg_fp16_to_fp32(*(const pg_fp16 *)p);
    case PG_TYPE_BF16: return pg_bf16_to_fp32(*(const pg_bf16 *)p);
    default:           return *(const float *)p;
    }
}

static inline void store_f(int32_t type, void *p, float v) {
    switch (type) {
    case PG_TYPE_F16:  *(pg_fp16 *)p = pg_fp32_to_fp16(v); break;
    case PG_TYPE_BF16: *(pg_bf16 *)p = pg_fp32_to_bf16(v); break;
    default:           *(float *)p = v; break;
    }
}

/* One dense row of n floats into `type` (float types or any type with from_float). */
static void row_from_f32(int32_t type, const float *x, void *y, int64_t n) {
    switch (type) {
    case PG_TYPE_F32: memcpy(y, x, (size_t)n * 4); return;
    case PG_TYPE_F16: for (int64_t i = 0; i < n; i++) ((pg_fp16 *)y)[i] = pg_fp32_to_fp16(x[i]); return;
    case PG_TYPE_BF16: for (int64_t i = 0; i < n; i++) ((pg_bf16 *)y)[i] = pg_fp32_to_bf16(x[i]); return;
    default: pg_get_type_traits(type)->from_float(x, y, n); return;
    }
}

static void row_to_f32(int32_t type, const void *x, float *y, int64_t n) {
    switch (type) {
    case PG_TYPE_F32: memcpy(y, x, (size_t)n * 4); return;
    case PG_TYPE_F16: for (int64_t i = 0; i < n; i++) y[i] = pg_fp16_to_fp32(((const pg_fp16 *)x)[i]); return;
    case PG_TYPE_BF16: for (int64_t i = 0; i < n; i++) y[i] = pg_bf16_to_fp32(((const pg_bf16 *)x)[i]); return;
    default: pg_get_type_traits(type)->to_float(x, y, n); return;
    }
}

/* ---- get_rows ----------------------------------------------------------------------------- */
void pg_fwd_get_rows(const pg_cparams *p, pg_tensor *all, pg_tensor *t) {
    const pg_tensor *a = PG_SRC(all, t, 0), *b = PG_SRC(all, t, 1);
    const int64_t n = b->ne[0] * b->ne[1] * b->ne[2];
    int64_t r0, r1;
    pg_split(n, p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const int64_t i10 = r % b->ne[0], i11 = (r / b->ne[0]) % b->ne[1], i12 = r / (b->ne[0] * b->ne[1]);
        const int32_t row = *(const int32_t *)pg_ptr(b, i10, i11, i12, 0);
        void *y = pg_ptr(t, 0, i10, i11, i12);
        if (row < 0 || row >= a->ne[1]) {   /* bad index data: zeros, and the graph fails */
            memset(y, 0, (size_t)t->ne[0] * 4);
            pg_report_bad_data(p);
            continue;
        }
        const void *x = pg_ptr(a, 0, row, i11, i12);
        if (t->type == PG_TYPE_I32) memcpy(y, x, (size_t)a->ne[0] * 4);
        else row_to_f32(a->type, x, y, a->ne[0]);
    }
}

/* ---- set_rows ----------------------------------------------------------------------------- */
void pg_fwd_set_rows(const pg_cparams *p, pg_tensor *all, pg_tensor *t) {
    const pg_tensor *b = PG_SRC(all, t, 0), *c = PG_SRC(all, t, 1);
    const int64_t n = b->ne[1] * b->ne[2] * b->ne[3];
    int64_t r0, r1;
    pg_split(n, p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const int64_t i1 = r % b->ne[1], i2 = (r / b->ne[1]) % b->ne[2], i3 = r / (b->ne[1] * b->ne[2]);
        const int32_t row = *(const int32_t *)pg_ptr(c, i1, i2 % c->ne[1], i3 % c->ne[2], 0);
        if (row < 0 || row >= t->ne[1]) { pg_report_bad_data(p); continue; }
        row_from_f32(t->type, pg_ptr(b, 0, i1, i2, i3), pg_ptr(t, 0, row, i2, i3), b->ne[0]);
    }
}

/* ---- cpy / cont ---------------------------------------------------------------------------- */
void pg_fwd_cpy(const pg_cparams *p, pg_tensor *all, pg_tensor *t) {
    const pg_tensor *a = PG_SRC(all, t, 0);
    const int same_shape = memcmp(a->ne, t->ne, sizeof(a->ne)) == 0;
    const int64_t ne0 = a->ne[0], ne1 = a->ne[1], ne2 = a->ne[2];
    int64_t r0, r1;
    pg_split(pg_nrows(a), p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const int64_t i1 = r % ne1, i2 = (r / ne1) % ne2, i3 = r / (ne1 * ne2);
        if (!pg_type_is_float(t->type) || !pg_type_is_float(a->type)) {
            /* row-wise: same type (copy bytes), quantized -> F32 (dequantize: a quantized KV
             * cache read without flash attention) or float -> quantized (validator: same
             * shape, dense rows) */
            if (a->type == t->type) {
                memcpy(pg_ptr(t, 0, i1, i2, i3), pg_ptr(a, 0, i1, i2, i3),
                       pg_type_row_size(a->type, ne0));
            } else if (t->type == PG_TYPE_F32) {
                row_to_f32(a->type, pg_ptr(a, 0, i1, i2, i3), pg_ptr(t, 0, i1, i2, i3), ne0);
            } else {
                row_from_f32(t->type, pg_ptr(a, 0, i1, i2, i3), pg_ptr(t, 0, i1, i2, i3), ne0);
            }
            continue;
        }
        if (same_shape) {
            for (int64_t i0 = 0; i0 < ne0; i0++)
                store_f(t->type, pg_ptr(t, i0, i1, i2, i3), load_f(a->type, pg_ptr(a, i0, i1, i2, i3)));
        } else {
            /* different shapes, same element count: walk the flat index */
            int64_t flat = ((i3 * ne2 + i2) * ne1 + i1) * ne0;
            for (int64_t i0 = 0; i0 < ne0; i0++, flat++) {
                int64_t f = flat;
                const int64_t j0 = f % t->ne[0]; f /= t->ne[0];
                const int64_t j1 = f % t->ne[1]; f /= t->ne[1];
                const int64_t j2 = f % t->ne[2]; f /= t->ne[2];
                store_f(t->type, pg_ptr(t, j0, j1, j2, f), load_f(a->type, pg_ptr(a, i0, i1, i2, i3)));
            }
        }
    }
}

/* ---- concat -------------------------------------------------------------------------------- */
void pg_fwd_concat(const pg_cparams *p, pg_tensor *all, pg_tensor *t) {
    const pg_tensor *a = PG_SRC(all, t, 0), *b = PG_SRC(all, t, 1);
    const int dim = t->op_params[0];
    const size_t es = (size_t)pg_type_row_size(t->type, 1);
    const int64_t ne0 = t->ne[0], ne1 = t->ne[1], ne2 = t->ne[2];
    int64_t r0, r1;
    pg_split(pg_nrows(t), p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        int64_t i[4] = {0, r % ne1, (r / ne1) % ne2, r / (ne1 * ne2)};
        for (i[0] = 0; i[0] < ne0; i[0]++) {
            const pg_tensor *s = a;
            int64_t j[4] = {i[0], i[1], i[2], i[3]};
            if (j[dim] >= a->ne[dim]) { s = b; j[dim] -= a->ne[dim]; }
            memcpy(pg_ptr(t, i[0], i[1], i[2], i[3]), pg_ptr(s, j[0], j[1], j[2], j[3]), es);
        }
    }
}
