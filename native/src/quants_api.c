/* Public row-level entry points over the per-type kernel tables (see pyggml.h, "quantized
 * formats"). Everything goes through pg_get_type_traits, so these work for every type whose
 * traits some fill function provides, on whichever path is current. Input is validated here;
 * the kernels themselves assume valid arguments. */
#include <string.h>

#include "ops.h"
#include "quants.h"

/* Traits of a type that has at least a block layout filled in; NULL otherwise. */
static const pg_type_traits *known(int32_t type) {
    const pg_type_traits *t = pg_get_type_traits(type);
    return t && t->block_size > 0 && t->type_size > 0 ? t : NULL;
}

static int32_t check_len(const pg_type_traits *t, int64_t n) {
    return n < 0 || n % t->block_size ? PG_ERR_INVALID_ARG : PG_OK;
}

int32_t pg_type_block_size(int32_t type) {
    const pg_type_traits *t = known(type);
    return t ? t->block_size : 0;
}

int32_t pg_type_size(int32_t type) {
    const pg_type_traits *t = known(type);
    return t ? t->type_size : 0;
}

static int32_t quantize(int32_t type, const float *x, void *y, int64_t n, int fast) {
    const pg_type_traits *t = known(type);
    if (!t) return PG_ERR_UNSUPPORTED;
    const pg_from_float_fn f = fast ? t->from_float : t->from_float_ref;
    if (!f) return PG_ERR_UNSUPPORTED;
    if (!x || !y || check_len(t, n)) return PG_ERR_INVALID_ARG;
    if (n) f(x, y, n);
    return PG_OK;
}

int32_t pg_quantize_row(int32_t type, const float *x, void *y, int64_t n) {
    return quantize(type, x, y, n, 0);
}

int32_t pg_quantize_row_act(int32_t type, const float *x, void *y, int64_t n) {
    return quantize(type, x, y, n, 1);
}

int32_t pg_dequantize_row(int32_t type, const void *x, float *y, int64_t n) {
    const pg_type_traits *t = known(type);
    if (!t || !t->to_float) return PG_ERR_UNSUPPORTED;
    if (!x || !y || check_len(t, n)) return PG_ERR_INVALID_ARG;
    if (n) t->to_float(x, y, n);
    return PG_OK;
}

/* The traits of type and of its vec_dot_type when a dot kernel exists; NULL otherwise. */
static const pg_type_traits *dot_traits(int32_t type, const pg_type_traits **vt) {
    const pg_type_traits *t = known(type);
    if (!t || !t->vec_dot) return NULL;
    *vt = known(t->vec_dot_type);
    return *vt ? t : NULL;
}

int32_t pg_vec_dot_type(int32_t type) {
    const pg_type_traits *vt;
    const pg_type_traits *t = dot_traits(type, &vt);
    return t ? t->vec_dot_type : -1;
}

int32_t pg_vec_dot(int32_t type, int64_t n, float *s, const void *x, const void *y) {
    const pg_type_traits *vt;
    const pg_type_traits *t = dot_traits(type, &vt);
    if (!t) return PG_ERR_UNSUPPORTED;
    if (!s || !x || !y || check_len(t, n) || check_len(vt, n)) return PG_ERR_INVALID_ARG;
    if (n == 0) { *s = 0.0f; return PG_OK; }
    t->vec_dot(n, s, x, y);
    return PG_OK;
}

size_t pg_matvec_scratch_size(int32_t type, int64_t ne0) {
    const pg_type_traits *vt;
    const pg_type_traits *t = dot_traits(type, &vt);
    if (!t || ne0 < 0 || check_len(vt, ne0)) return 0;
    return (size_t)(ne0 / vt->block_size) * (size_t)vt->type_size;
}

int32_t pg_matvec(int32_t type, int64_t ne0, int64_t nrows, const void *w, size_t row_stride,
                  const float *x, float *out, void *scratch, size_t scratch_size) {
    const pg_type_traits *vt;
    const pg_type_traits *t = dot_traits(type, &vt);
    if (!t || !vt->from_float) return PG_ERR_UNSUPPORTED;
    if (!w || !x || !out || !scratch || ne0 <= 0 || nrows < 0) return PG_ERR_INVALID_ARG;
    if (check_len(t, ne0) || check_len(vt, ne0)) return PG_ERR_INVALID_ARG;
    const size_t row_bytes = (size_t)(ne0 / t->block_size) * (size_t)t->type_size;
    if (row_stride < row_bytes) return PG_ERR_INVALID_ARG;
    if (scratch_size < (size_t)(ne0 / vt->block_size) * (size_t)vt->type_size)
        return PG_ERR_INVALID_ARG;
    vt->from_float(x, scratch, ne0);
    /* decode's kernels (vec_dot8 for groups of eight rows where the type has it): the same
     * bits as vec_dot row by row, and what a benchmark of this should measure */
    pg_dot_rows(t, ne0, out, 0, w, row_stride, 0, nrows, scratch, 0, 1);
    return PG_OK;
}
