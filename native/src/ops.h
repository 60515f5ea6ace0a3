/* Internal interface of the CPU op kernels. Each kernel is called by all nth threads of a job
 * with its thread index; it computes its share of the output rows, and may synchronise with
 * pg_sync (all threads must reach every pg_sync of a kernel). */
#ifndef PG_OPS_H
#define PG_OPS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "pyggml.h"
#include "quants.h"
#include "threadpool.h"

typedef struct pg_cparams {
    int            ith, nth;
    uint8_t       *work;        /* shared scratch of work_size bytes */
    size_t         work_size;
    pg_threadpool *tp;
    atomic_int    *error_node;  /* set to the node index by a kernel that meets bad data */
    int32_t        node_index;
    const pg_tensor *epi;       /* MUL_MAT only: the element-wise node fused after it (graph.c's
                                 * schedule), applied by each thread to the columns it computed;
                                 * NULL for none */
} pg_cparams;

static inline void pg_sync(const pg_cparams *p) {
    if (p->nth > 1) pg_threadpool_barrier(p->tp, p->nth);
}

/* [i0, i1) of n items for thread ith of nth: contiguous, balanced, deterministic. */
static inline void pg_split(int64_t n, int ith, int nth, int64_t *i0, int64_t *i1) {
    const int64_t per = (n + nth - 1) / nth;
    *i0 = per * ith < n ? per * ith : n;
    *i1 = *i0 + per < n ? *i0 + per : n;
}

static inline void pg_report_bad_data(const pg_cparams *p) {
    int expected = -1;
    atomic_compare_exchange_strong(p->error_node, &expected, p->node_index);
}

/* ((float *)((char *)dst + j·dbs))[n] = dot(weight row n, activation row j) for n in [n0, n1),
 * j < nc, weight rows nb1 bytes apart from w, activation rows xbs bytes apart from xr: vec_dot8
 * for groups of eight weight rows where the type has it (PG_DOT8_MAX_NC activation rows a call,
 * the group's bytes still in L1 for the next call), vec_dot for the rest (the same bits) */
static inline void pg_dot_rows(const pg_type_traits *tr, int64_t K, float *dst, size_t dbs,
                               const uint8_t *w, size_t nb1, int64_t n0, int64_t n1,
                               const void *xr, size_t xbs, int nc) {
    int64_t n = n0;
    if (tr->vec_dot8)
        for (; n + 8 <= n1; n += 8)
            for (int j = 0; j < nc; j += PG_DOT8_MAX_NC)
                tr->vec_dot8(K, (float *)((char *)dst + (size_t)j * dbs) + n, dbs,
                             w + (size_t)n * nb1, nb1, (const char *)xr + (size_t)j * xbs, xbs,
                             nc - j < PG_DOT8_MAX_NC ? nc - j : PG_DOT8_MAX_NC);
    for (int j = 0; j < nc; j++) {
        float *d = (float *)((char *)dst + (size_t)j * dbs);
        const void *x = (const char *)xr + (size_t)j * xbs;
        for (int64_t r = n; r < n1; r++) tr->vec_dot(K, &d[r], w + (size_t)r * nb1, x);
    }
}

#define PG_SRC(all, t, k) ((t)->src[k] >= 0 ? &(all)[(t)->src[k]] : NULL)

static inline void *pg_ptr(const pg_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    return (uint8_t *)t->data + i0 * t->nb[0] + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
}

static inline int64_t pg_nrows(const pg_tensor *t) { return t->ne[1] * t->ne[2] * t->ne[3]; }

static inline float pg_op_f32(const pg_tensor *t, int i) {
    float f;
    memcpy(&f, &t->op_params[i], 4);
    return f;
}

size_t pg_type_row_size(int32_t type, int64_t n);   /* bytes of n elements (n % block == 0) */
int    pg_type_is_float(int32_t type);               /* F32, F16, BF16 */
float  pg_gelu_f32(float x);                         /* ggml's fp16-table GELU */

/* kernels */
void pg_fwd_binary(const pg_cparams *p, pg_tensor *all, pg_tensor *t);
void pg_fwd_unary(const pg_cparams *p, pg_tensor *all, pg_tensor *t);
void pg_fwd_norm(const pg_cparams *p, pg_tensor *all, pg_tensor *t);
void pg_fwd_soft_max(const pg_cparams *p, pg_tensor *all, pg_tensor *t);
void pg_fwd_rope(const pg_cparams *p, pg_tensor *all, pg_tensor *t);
void pg_fwd_diag_mask_inf(const pg_cparams *p, pg_tensor *all, pg_tensor *t);
void pg_fwd_get_rows(const pg_cparams *p, pg_tensor *all, pg_tensor *t);
void pg_fwd_set_rows(const pg_cparams *p, pg_tensor *all, pg_tensor *t);
void pg_fwd_cpy(const pg_cparams *p, pg_tensor *all, pg_tensor *t);
void pg_fwd_concat(const pg_cparams *p, pg_tensor *all, pg_tensor *t);
void pg_fwd_mul_mat(const pg_cparams *p, pg_tensor *all, pg_tensor *t);
void pg_fwd_flash_attn(const pg_cparams *p, pg_tensor *all, pg_tensor *t);
void pg_fwd_mul_mat_id(const pg_cparams *p, pg_tensor *all, pg_tensor *t);
void pg_fwd_sum_rows(const pg_cparams *p, pg_tensor *all, pg_tensor *t);
void pg_fwd_argsort(const pg_cparams *p, pg_tensor *all, pg_tensor *t);

size_t pg_mul_mat_work_size(const pg_tensor *all, const pg_tensor *t, int nth);
/* How a MUL_MAT splits its work, for graph.c's schedule: *cols 1 when each thread computes the
 * columns split_units(ne0, 8) of every output row (the vec_dot8 path of decode, which applies
 * p->epi); *work_stride the bytes of work each thread uses at ith·stride when only that
 * (activations converted privately), 0 when it uses none, -1 when the threads share it. */
void pg_mul_mat_schedule_info(const pg_tensor *all, const pg_tensor *t, int *cols,
                              int64_t *work_stride);
/* [*n0, *n1): the columns thread ith of nth computes in a MUL_MAT with *cols (see above) */
void pg_mul_mat_cols(int64_t N, int ith, int nth, int64_t *n0, int64_t *n1);
/* The fused element-wise node e (ADD/SUB/MUL/DIV with the MUL_MAT output t as one source, or
 * SILU/GELU of it) on columns [n0, n1) of every row: the same arithmetic per element as
 * pg_fwd_binary/pg_fwd_unary, so the bits do not change. */
void pg_fwd_epilogue(pg_tensor *all, const pg_tensor *t, const pg_tensor *e, int64_t n0,
                     int64_t n1);
size_t pg_flash_attn_work_size(const pg_tensor *all, const pg_tensor *t, int nth);
size_t pg_mul_mat_id_work_size(const pg_tensor *all, const pg_tensor *t, int nth);

#endif
