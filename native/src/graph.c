/* The CPU graph executor: validation of a marshalled graph, work-buffer sizing, and the run loop
 * (every thread walks the node list; a barrier between nodes). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"
#include "ops_ssm.h"

size_t pg_type_row_size(int32_t type, int64_t n) {
    const pg_type_traits *tr = pg_get_type_traits(type);
    if (!tr || tr->block_size <= 0) return 0;
    return (size_t)(n / tr->block_size) * (size_t)tr->type_size;
}

static int is_view_op(int32_t op) {
    return op == PG_OP_NONE || op == PG_OP_RESHAPE || op == PG_OP_VIEW ||
           op == PG_OP_PERMUTE || op == PG_OP_TRANSPOSE;
}

/* ---- validation ----------------------------------------------------------------------------- */

#define FAIL(...) do { snprintf(reason, reason_size, __VA_ARGS__); return PG_ERR_UNSUPPORTED; } while (0)
#define BAD(...)  do { snprintf(reason, reason_size, __VA_ARGS__); return PG_ERR_INVALID_ARG; } while (0)

static int known_type(int32_t type) {
    const pg_type_traits *tr = pg_get_type_traits(type);
    return tr && tr->block_size > 0;
}

/* Bytes from the first to one past the last element (ggml_nbytes); -1 if the layout is bad. */
static int64_t span_bytes(const pg_tensor *t) {
    const pg_type_traits *tr = pg_get_type_traits(t->type);
    for (int i = 0; i < 4; i++) if (t->ne[i] < 0 || t->nb[i] < 0) return -1;
    for (int i = 0; i < 4; i++) if (t->ne[i] == 0) return 0;
    if (t->ne[0] % tr->block_size) return -1;
    int64_t n = t->ne[0] / tr->block_size * t->nb[0];
    for (int i = 1; i < 4; i++) n += (t->ne[i] - 1) * t->nb[i];
    return n;
}

static int dense_rows(const pg_tensor *t) {
    return t->nb[0] == (int64_t)pg_get_type_traits(t->type)->type_size;
}

static int same_ne(const pg_tensor *a, const pg_tensor *b) {
    return memcmp(a->ne, b->ne, sizeof(a->ne)) == 0;
}

static int can_repeat(const pg_tensor *b, const pg_tensor *a) {
    for (int i = 0; i < 4; i++) if (b->ne[i] <= 0 || a->ne[i] % b->ne[i]) return 0;
    return 1;
}

static int is_contiguous(const pg_tensor *t) {
    const pg_type_traits *tr = pg_get_type_traits(t->type);
    int64_t expect = tr->type_size;
    if (t->ne[0] != tr->block_size && t->nb[0] != expect) return 0;
    expect *= t->ne[0] / tr->block_size;
    for (int i = 1; i < 4; i++) {
        if (t->ne[i] != 1) {
            if (t->nb[i] != expect) return 0;
            expect *= t->ne[i];
        }
    }
    return 1;
}

int32_t pg_node_supported(const pg_tensor *all, int32_t n, int32_t i, char *reason,
                          size_t reason_size) {
    char dummy[8];
    if (!reason || reason_size == 0) { reason = dummy; reason_size = sizeof(dummy); }
    reason[0] = 0;
    if (!all || i < 0 || i >= n) BAD("node index %d out of range [0, %d)", i, n);
    const pg_tensor *t = &all[i];
    if (t->op < 0 || t->op >= PG_OP_COUNT) BAD("unknown op %d", t->op);
    if (!known_type(t->type)) BAD("unknown type %d", t->type);
    const pg_tensor *s[PG_MAX_SRC] = {0};
    for (int k = 0; k < PG_MAX_SRC; k++) {
        if (t->src[k] == -1) continue;
        if (t->src[k] < 0 || t->src[k] >= n || t->src[k] == i) BAD("src[%d]=%d out of range", k, t->src[k]);
        s[k] = &all[t->src[k]];
        if (!known_type(s[k]->type)) BAD("src[%d] has unknown type %d", k, s[k]->type);
        if (span_bytes(s[k]) < 0) BAD("src[%d] has a bad shape or strides", k);
        if (!s[k]->data && span_bytes(s[k]) > 0) BAD("src[%d] '%.*s' has no data", k, PG_MAX_NAME, s[k]->name);
    }
    if (span_bytes(t) < 0) BAD("bad shape or strides");
    if (is_view_op(t->op)) return PG_OK;
    if (!t->data && span_bytes(t) > 0) BAD("no data");
    const pg_tensor *a = s[0], *b = s[1];
    const int32_t F32 = PG_TYPE_F32;
    switch (t->op) {
    case PG_OP_ADD: case PG_OP_SUB: case PG_OP_MUL: case PG_OP_DIV:
        if (!a || !b) BAD("needs two sources");
        if (t->type != F32 || a->type != F32 || b->type != F32) FAIL("only F32 inputs and output");
        if (!same_ne(a, t) || !can_repeat(b, a)) BAD("shapes do not broadcast");
        if (!dense_rows(a) || !dense_rows(b) || !dense_rows(t)) FAIL("rows must be dense (nb[0] == 4)");
        return PG_OK;
    case PG_OP_SQR: case PG_OP_SQRT: case PG_OP_SCALE: case PG_OP_GELU: case PG_OP_SILU:
    case PG_OP_TANH: case PG_OP_NORM: case PG_OP_RMS_NORM: case PG_OP_DIAG_MASK_INF:
    case PG_OP_SIGMOID: case PG_OP_CLAMP:
        if (!a) BAD("needs a source");
        if (t->type != F32 || a->type != F32) FAIL("only F32");
        if (!same_ne(a, t)) BAD("output shape differs from input");
        if (!dense_rows(a) || !dense_rows(t)) FAIL("rows must be dense (nb[0] == 4)");
        return PG_OK;
    case PG_OP_SOFT_MAX:
        if (!a || t->type != F32 || a->type != F32) FAIL("only F32");
        if (!same_ne(a, t) || !dense_rows(a) || !dense_rows(t)) FAIL("rows must be dense, same shape");
        if (b) {
            if (b->type != F32 && b->type != PG_TYPE_F16) FAIL("mask must be F16 or F32");
            if (b->ne[0] != a->ne[0] || b->ne[1] < a->ne[1] || a->ne[2] % b->ne[2] || a->ne[3] % b->ne[3])
                BAD("mask shape does not fit");
            if (!dense_rows(b)) FAIL("mask rows must be dense");
        }
        if (s[2] && (s[2]->type != F32 || s[2]->ne[0] < a->ne[2] || !dense_rows(s[2])))
            BAD("sinks must be F32 [>= ne[2]]");
        return PG_OK;
    case PG_OP_ROPE: {
        const int n_dims = t->op_params[1], mode = t->op_params[2];
        if (!a || !b) BAD("needs a and pos");
        if (t->type != F32 || a->type != F32) FAIL("only F32");
        if (b->type != PG_TYPE_I32 || b->ne[0] != a->ne[2] || !is_contiguous(b)) BAD("pos must be contiguous I32 [ne2]");
        if (!same_ne(a, t) || !dense_rows(a) || !dense_rows(t)) FAIL("rows must be dense, same shape");
        if (n_dims <= 0 || n_dims % 2 || n_dims > a->ne[0]) BAD("n_dims %d invalid", n_dims);
        if (mode != PG_ROPE_MODE_NORMAL && mode != PG_ROPE_MODE_NEOX) FAIL("rope mode %d", mode);
        if (s[2] && (s[2]->type != F32 || s[2]->ne[0] < n_dims / 2 || !is_contiguous(s[2])))
            BAD("freq_factors must be contiguous F32 with >= n_dims/2 values");
        return PG_OK;
    }
    case PG_OP_GET_ROWS:
        if (!a || !b || b->type != PG_TYPE_I32) BAD("needs a and I32 indices");
        if (t->ne[0] != a->ne[0] || t->ne[1] != b->ne[0] || t->ne[2] != b->ne[1] ||
            t->ne[3] != b->ne[2] || a->ne[2] != b->ne[1] || b->ne[3] != 1)
            BAD("shapes do not match get_rows");
        if (a->type == PG_TYPE_I32 ? t->type != PG_TYPE_I32 : t->type != F32) FAIL("output type");
        if (!pg_type_is_float(a->type) && a->type != PG_TYPE_I32 && !pg_get_type_traits(a->type)->to_float)
            FAIL("cannot dequantize type %d", a->type);
        if (!dense_rows(a) || !dense_rows(t)) FAIL("rows must be dense");
        return PG_OK;
    case PG_OP_SET_ROWS:
        if (!a || !b || b->type != PG_TYPE_I32 || a->type != F32) BAD("needs F32 rows and I32 indices");
        if (a->ne[0] != t->ne[0] || b->ne[0] != a->ne[1] || a->ne[2] != t->ne[2] || a->ne[3] != t->ne[3] ||
            a->ne[2] % b->ne[1] || a->ne[3] % b->ne[2])
            BAD("shapes do not match set_rows");
        if (!pg_type_is_float(t->type) && !pg_get_type_traits(t->type)->from_float)
            FAIL("cannot convert to type %d", t->type);
        if (!dense_rows(a) || !dense_rows(t)) FAIL("rows must be dense");
        return PG_OK;
    case PG_OP_CPY: case PG_OP_CONT: case PG_OP_DUP: {
        int64_t na = a ? a->ne[0] * a->ne[1] * a->ne[2] * a->ne[3] : -1;
        if (!a || na != t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]) BAD("element counts differ");
        if (pg_type_is_float(a->type) && pg_type_is_float(t->type)) return PG_OK;
        if (!same_ne(a, t) || !dense_rows(a) || !dense_rows(t)) FAIL("quantized copies need same shape, dense rows");
        if (a->type == t->type) return PG_OK;
        if (a->type == F32 && pg_get_type_traits(t->type)->from_float) return PG_OK;
        if (t->type == F32 && pg_get_type_traits(a->type)->to_float) return PG_OK;   /* dequant */
        FAIL("copy from type %d to type %d", a->type, t->type);
    }
    case PG_OP_CONCAT: {
        const int dim = t->op_params[0];
        if (!a || !b || dim < 0 || dim > 3) BAD("needs two sources and dim in 0..3");
        if (a->type != t->type || b->type != t->type || pg_get_type_traits(t->type)->block_size != 1)
            FAIL("same non-quantized type needed");
        for (int d = 0; d < 4; d++) {
            const int64_t want = d == dim ? a->ne[d] + b->ne[d] : a->ne[d];
            if (t->ne[d] != want || (d != dim && b->ne[d] != a->ne[d])) BAD("shapes do not concat");
        }
        return PG_OK;
    }
    case PG_OP_MUL_MAT: {
        if (!a || !b) BAD("needs two sources");
        const pg_type_traits *tr = pg_get_type_traits(a->type);
        if (!tr->vec_dot) FAIL("no dot kernel for weight type %d", a->type);
        if (b->type != F32 || t->type != F32) FAIL("activations and output must be F32");
        if (tr->vec_dot_type != F32 && !pg_get_type_traits(tr->vec_dot_type)->from_float)
            FAIL("no activation quantizer for type %d", tr->vec_dot_type);
        if (a->ne[0] != b->ne[0] || b->ne[2] % a->ne[2] || b->ne[3] % a->ne[3]) BAD("shapes do not multiply");
        if (t->ne[0] != a->ne[1] || t->ne[1] != b->ne[1] || t->ne[2] != b->ne[2] || t->ne[3] != b->ne[3])
            BAD("output shape is not [a.ne1, b.ne1, b.ne2, b.ne3]");
        if (!dense_rows(a) || !dense_rows(b) || !dense_rows(t)) FAIL("rows must be dense");
        return PG_OK;
    }
    case PG_OP_MUL_MAT_ID: {
        const pg_tensor *ids = s[2];
        if (!a || !b || !ids) BAD("needs as, b and ids");
        const pg_type_traits *tr = pg_get_type_traits(a->type);
        if (!tr->vec_dot) FAIL("no dot kernel for weight type %d", a->type);
        if (b->type != F32 || t->type != F32) FAIL("activations and output must be F32");
        if (tr->vec_dot_type != F32 && !pg_get_type_traits(tr->vec_dot_type)->from_float)
            FAIL("no activation quantizer for type %d", tr->vec_dot_type);
        if (ids->type != PG_TYPE_I32) BAD("ids must be I32");
        if (a->ne[3] != 1 || b->ne[3] != 1 || ids->ne[2] != 1 || ids->ne[3] != 1)
            BAD("as, b must be 3-D and ids 2-D");
        if (a->ne[0] != b->ne[0] || ids->ne[1] != b->ne[2] || b->ne[1] <= 0 || ids->ne[0] % b->ne[1])
            BAD("shapes do not fit mul_mat_id");
        if (ids->ne[0] * ids->ne[1] > INT32_MAX) BAD("too many (slot, token) entries");
        if (t->ne[0] != a->ne[1] || t->ne[1] != ids->ne[0] || t->ne[2] != b->ne[2] || t->ne[3] != 1)
            BAD("output shape is not [as.ne1, ids.ne0, b.ne2]");
        if (!dense_rows(a) || !dense_rows(b) || !dense_rows(t)) FAIL("rows must be dense");
        return PG_OK;
    }
    case PG_OP_SSM_CONV: case PG_OP_GATED_DELTA_NET: case PG_OP_SOFTPLUS:
        return pg_ssm_supported(t, s, reason, reason_size);
    case PG_OP_SUM_ROWS:
        if (!a || a->type != F32 || t->type != F32) FAIL("only F32");
        if (t->ne[0] != 1 || t->ne[1] != a->ne[1] || t->ne[2] != a->ne[2] || t->ne[3] != a->ne[3])
            BAD("output shape is not [1, ne1, ne2, ne3]");
        if (!dense_rows(a)) FAIL("rows must be dense");
        return PG_OK;
    case PG_OP_ARGSORT:
        if (!a || a->type != F32 || t->type != PG_TYPE_I32) FAIL("F32 input, I32 output only");
        if (!same_ne(a, t) || !dense_rows(a) || !dense_rows(t)) BAD("same shape, dense rows");
        if (a->ne[0] > INT32_MAX) BAD("rows longer than 2^31 - 1");
        if (t->op_params[0] != PG_SORT_ORDER_ASC && t->op_params[0] != PG_SORT_ORDER_DESC)
            BAD("sort order %d", t->op_params[0]);
        return PG_OK;
    case PG_OP_FLASH_ATTN_EXT: {
        const pg_tensor *v = s[2], *m = s[3];
        if (!a || !b || !v) BAD("needs q, k, v");
        if (a->type != F32 || t->type != F32) FAIL("q and output must be F32");
        /* any K type with a dot kernel (F16, F32, Q8_0 caches) that converts to fp32, whose
         * vec_dot_type does both ways (q is rounded through it), any V type with to_float */
        const pg_type_traits *tk = pg_get_type_traits(b->type);
        if (!tk->vec_dot || (b->type != F32 && !tk->to_float) ||
            (tk->vec_dot_type != F32 && (!pg_get_type_traits(tk->vec_dot_type)->from_float ||
                                         !pg_get_type_traits(tk->vec_dot_type)->to_float)))
            FAIL("no dot kernel for k type %d", b->type);
        if (v->type != F32 && !pg_get_type_traits(v->type)->to_float) FAIL("cannot convert v rows");
        if (b->ne[0] != a->ne[0] || v->ne[1] != b->ne[1] || v->ne[2] != b->ne[2] || b->ne[2] <= 0 ||
            a->ne[2] % b->ne[2] || a->ne[3] != b->ne[3] || v->ne[3] != b->ne[3])
            BAD("q, k, v shapes do not fit");
        if (a->ne[2] / b->ne[2] > 64) FAIL("more than 64 query heads per KV head");
        if (s[4] && (s[4]->type != F32 || s[4]->ne[0] < a->ne[2] || !dense_rows(s[4])))
            BAD("sinks must be F32 [>= heads]");
        if (t->ne[0] != v->ne[0] || t->ne[1] != a->ne[2] || t->ne[2] != a->ne[1] || t->ne[3] != a->ne[3])
            BAD("output shape is not [Dv, H, n_q, B]");
        if (m && ((m->type != F32 && m->type != PG_TYPE_F16) || m->ne[0] != b->ne[1] || m->ne[1] < a->ne[1] ||
                  a->ne[2] % m->ne[2] || a->ne[3] % m->ne[3] || !dense_rows(m)))
            BAD("mask shape or type does not fit");
        if (!dense_rows(a) || !dense_rows(b) || !dense_rows(v) || !dense_rows(t)) FAIL("rows must be dense");
        return PG_OK;
    }
    default:
        FAIL("op %d has no CPU kernel", t->op);
    }
}

int32_t pg_graph_validate(const pg_tensor *t, int32_t n_tensors, const int32_t *order,
                          int32_t n_nodes, int32_t *bad_node) {
    if (bad_node) *bad_node = -1;
    if (!t || n_tensors < 0 || n_nodes < 0 || (n_nodes > 0 && !order)) return PG_ERR_INVALID_ARG;
    for (int32_t k = 0; k < n_nodes; k++) {
        const int32_t st = pg_node_supported(t, n_tensors, order[k], NULL, 0);
        if (st != PG_OK) {
            if (bad_node) *bad_node = order[k];
            return st;
        }
    }
    return PG_OK;
}

static size_t node_work_size(const pg_tensor *all, const pg_tensor *t, int nth) {
    switch (t->op) {
    case PG_OP_MUL_MAT:        return pg_mul_mat_work_size(all, t, nth);
    case PG_OP_FLASH_ATTN_EXT: return pg_flash_attn_work_size(all, t, nth);
    case PG_OP_MUL_MAT_ID:     return pg_mul_mat_id_work_size(all, t, nth);
    case PG_OP_ROPE:           return (size_t)(t->ne[0] + 16) * sizeof(float) * (size_t)nth;
    case PG_OP_SSM_CONV: case PG_OP_GATED_DELTA_NET: return pg_ssm_work_size(all, t, nth);
    default:                   return 0;
    }
}

static size_t graph_work_size(const pg_tensor *t, const int32_t *order, int32_t n_nodes,
                              int32_t n_threads) {
    size_t w = 0;
    for (int32_t k = 0; k < n_nodes; k++) {
        const size_t s = node_work_size(t, &t[order[k]], n_threads);
        if (s > w) w = s;
    }
    return w ? w + 64 : 0;
}

int32_t pg_graph_work_size(const pg_tensor *t, int32_t n_tensors, const int32_t *order,
                           int32_t n_nodes, int32_t n_threads, size_t *work_size) {
    if (!work_size || n_threads < 1 || n_threads > PG_MAX_THREADS) return PG_ERR_INVALID_ARG;
    int32_t bad;
    const int32_t st = pg_graph_validate(t, n_tensors, order, n_nodes, &bad);
    if (st != PG_OK) return st;
    *work_size = graph_work_size(t, order, n_nodes, n_threads);
    return PG_OK;
}


/* ---- schedule -------------------------------------------------------------------------------
 * Every thread walks the same node list. A barrier is needed before a node only where it could
 * touch bytes another thread is still reading or writing for a node since the last barrier; in
 * decode most nodes are one row, which pg_split gives to thread 0 whole, so a chain like
 * ADD -> RMS_NORM -> MUL runs on thread 0 without one. And an element-wise node right after a
 * MUL_MAT on the vec_dot8 path (bias, residual, SiLU/GELU gate, the gate's product) is fused into
 * it: each thread applies it to the output columns it has just computed (pg_fwd_epilogue).
 * Neither changes a result: every element is computed by the same arithmetic, only the time at
 * which another thread may look at it moves. The schedule is made once per compute (single
 * threaded, before the job is published), so all threads take the same barriers. */

enum { PART_NONE, PART_ROWS, PART_COLS };   /* how the threads divide a tensor's elements */

typedef struct {
    const uint8_t *lo, *hi;   /* bytes [lo, hi) */
    int            part;      /* PART_ROWS: pg_split of nrows; PART_COLS: pg_mul_mat_cols of ne0 */
    int32_t        type;      /* with data, ne0, nrows: equal keys mean the same thread owns */
    int64_t        ne0, nrows;/* each element on both sides */
} sched_access;

#define SCHED_MAX_RD  (PG_MAX_SRC + 2)
#define SCHED_WINDOW  16      /* units since the last barrier tracked; more: a barrier */

typedef struct {
    sched_access rd[SCHED_MAX_RD];
    sched_access wr[2];
    int          n_rd, n_wr;
    int64_t      work;        /* 0: no work buffer; > 0: each thread its own stride; -1: shared */
    int          opaque;      /* not analysed: a barrier before and after */
} sched_unit;

static sched_access access_of(const pg_tensor *s, int part) {
    sched_access a;
    const int64_t n = span_bytes(s);
    a.lo = (const uint8_t *)s->data;
    a.hi = a.lo + (n > 0 ? n : 0);
    a.part = part != PART_NONE && is_contiguous(s) ? part : PART_NONE;
    a.type = s->type;
    a.ne0 = s->ne[0];
    a.nrows = pg_nrows(s);
    return a;
}

static int overlap(const sched_access *a, const sched_access *b) {
    return a->lo < b->hi && b->lo < a->hi;
}

/* each element of a and b handled by the same thread on both sides */
static int same_owner(const sched_access *a, const sched_access *b) {
    return a->part != PART_NONE && a->part == b->part && a->lo == b->lo && a->hi == b->hi &&
           a->type == b->type && a->ne0 == b->ne0 && a->nrows == b->nrows;
}

static int row_op(int32_t op) {
    switch (op) {
    case PG_OP_ADD: case PG_OP_SUB: case PG_OP_MUL: case PG_OP_DIV:
    case PG_OP_SQR: case PG_OP_SQRT: case PG_OP_SCALE: case PG_OP_GELU: case PG_OP_SILU:
    case PG_OP_TANH: case PG_OP_SIGMOID: case PG_OP_CLAMP: case PG_OP_NORM: case PG_OP_RMS_NORM:
    case PG_OP_ROPE: case PG_OP_SOFT_MAX: case PG_OP_DIAG_MASK_INF:
        return 1;
    default:
        return 0;
    }
}

static int g_schedule = 2;   /* pg_graph_set_schedule */

void pg_graph_set_schedule(int32_t mode) {
    __atomic_store_n(&g_schedule, mode < 0 ? 0 : mode > 2 ? 2 : mode, __ATOMIC_RELAXED);
}

/* Whether element-wise node e can be computed inside MUL_MAT t's threads (pg_fwd_epilogue). */
static int can_fuse(pg_tensor *all, int32_t ti, const pg_tensor *e) {
    const pg_tensor *t = &all[ti];
    int cols;
    int64_t ws;
    if (t->op != PG_OP_MUL_MAT) return 0;
    pg_mul_mat_schedule_info(all, t, &cols, &ws);
    if (!cols || !is_contiguous(t) || t->ne[2] != 1 || t->ne[3] != 1) return 0;
    if (e->type != PG_TYPE_F32 || !same_ne(e, t) || !is_contiguous(e)) return 0;
    const sched_access ea = access_of(e, PART_NONE), ta = access_of(t, PART_NONE);
    if (overlap(&ea, &ta) && (e->data != t->data)) return 0;     /* in place on t: fine */
    for (int k = 0; k < 2; k++) {                               /* weights, activations */
        const sched_access sa = access_of(&all[t->src[k]], PART_NONE);
        if (overlap(&ea, &sa)) return 0;
    }
    if (e->op == PG_OP_SILU || e->op == PG_OP_GELU) return e->src[0] == ti;
    if (e->op != PG_OP_ADD && e->op != PG_OP_SUB && e->op != PG_OP_MUL && e->op != PG_OP_DIV)
        return 0;
    if (e->src[0] != ti && e->src[1] != ti) return 0;
    const pg_tensor *o = &all[e->src[e->src[0] == ti ? 1 : 0]];
    if (o->type != PG_TYPE_F32 || o->ne[0] != t->ne[0] || !dense_rows(o) || o->ne[2] != 1 ||
        o->ne[3] != 1 || (o->ne[1] != 1 && o->ne[1] != t->ne[1]))
        return 0;
    const sched_access oa = access_of(o, PART_NONE);
    /* written in place over the other source: each element read before it is written, by the
     * same thread */
    if (overlap(&ea, &oa) && !(e->data == o->data && same_ne(e, o) &&
                               memcmp(e->nb, o->nb, sizeof(e->nb)) == 0))
        return 0;
    return 1;
}

/* What unit (node t, fused node e or NULL) reads and writes, and how the threads divide it. */
static void unit_of(pg_tensor *all, const pg_tensor *t, const pg_tensor *e, sched_unit *u) {
    memset(u, 0, sizeof(*u));
    if (t->op == PG_OP_MUL_MAT) {
        int cols;
        pg_mul_mat_schedule_info(all, t, &cols, &u->work);
        for (int k = 0; k < 2; k++) u->rd[u->n_rd++] = access_of(&all[t->src[k]], PART_NONE);
        const int part = cols ? PART_COLS : PART_NONE;
        u->wr[u->n_wr++] = access_of(t, part);
        if (e) {
            for (int k = 0; k < 2; k++) {
                if (e->src[k] < 0 || &all[e->src[k]] == t) continue;
                const pg_tensor *o = &all[e->src[k]];
                u->rd[u->n_rd++] = access_of(o, same_ne(o, t) ? PART_COLS : PART_NONE);
            }
            u->wr[u->n_wr++] = access_of(e, PART_COLS);
        }
        return;
    }
    if (row_op(t->op) || t->op == PG_OP_GET_ROWS || t->op == PG_OP_SET_ROWS) {
        for (int k = 0; k < PG_MAX_SRC; k++) {
            if (t->src[k] < 0) continue;
            const pg_tensor *s = &all[t->src[k]];
            /* row r of the output reads row r of a source of its shape (SET_ROWS: its row r of
             * src[0], pg_split over src[0]'s rows) */
            const int rows = (row_op(t->op) && same_ne(s, t)) || (t->op == PG_OP_SET_ROWS && k == 0);
            u->rd[u->n_rd++] = access_of(s, rows ? PART_ROWS : PART_NONE);
        }
        u->wr[u->n_wr++] = access_of(t, t->op == PG_OP_SET_ROWS ? PART_NONE : PART_ROWS);
        if (t->op == PG_OP_ROPE) u->work = (int64_t)(t->ne[0] + 16) * (int64_t)sizeof(float);
        return;
    }
    u->opaque = 1;
}

/* whether u may start on one thread while v is still running on another */
static int conflict(const sched_unit *u, const sched_unit *v) {
    if (u->opaque || v->opaque) return 1;
    for (int i = 0; i < v->n_wr; i++) {
        for (int j = 0; j < u->n_rd; j++)
            if (overlap(&v->wr[i], &u->rd[j]) && !same_owner(&v->wr[i], &u->rd[j])) return 1;
        for (int j = 0; j < u->n_wr; j++)
            if (overlap(&v->wr[i], &u->wr[j]) && !same_owner(&v->wr[i], &u->wr[j])) return 1;
    }
    for (int i = 0; i < u->n_wr; i++)
        for (int j = 0; j < v->n_rd; j++)
            if (overlap(&u->wr[i], &v->rd[j]) && !same_owner(&u->wr[i], &v->rd[j])) return 1;
    if (u->work && v->work && (u->work < 0 || v->work < 0 || u->work != v->work)) return 1;
    return 0;
}

enum { SCHED_BARRIER = 1, SCHED_SKIP = 2 };

typedef struct {
    uint8_t *flags;   /* per position of order: SCHED_BARRIER before it, SCHED_SKIP (fused) */
    int32_t *epi;     /* per position: the tensor index of the node fused into it, or -1 */
    int32_t *pf;      /* per barrier position: the next MUL_MAT on the vec_dot8 path, or -1 */
    int32_t  n_barriers, n_fused;
} schedule;

static void free_schedule(schedule *sc) {
    free(sc->flags);
    free(sc->epi);
    free(sc->pf);
}

/* 0 on success; -1 when out of memory (the caller runs a barrier after every node) */
static int make_schedule(pg_tensor *all, const int32_t *order, int32_t n_nodes, schedule *sc) {
    sc->flags = calloc((size_t)n_nodes + 1, 1);
    sc->epi = malloc(((size_t)n_nodes + 1) * sizeof(int32_t));
    sc->pf = malloc(((size_t)n_nodes + 1) * sizeof(int32_t));
    sc->n_barriers = sc->n_fused = 0;
    sched_unit *w = malloc(sizeof(sched_unit) * SCHED_WINDOW);
    if (!sc->flags || !sc->epi || !sc->pf || !w) { free_schedule(sc); free(w); return -1; }
    int n_win = 0;
    for (int32_t k = 0; k < n_nodes; k++) {
        sc->epi[k] = -1;
        pg_tensor *t = &all[order[k]];
        if (is_view_op(t->op) || (sc->flags[k] & SCHED_SKIP)) continue;
        const pg_tensor *e = NULL;
        if (t->op == PG_OP_MUL_MAT) {
            int32_t j = k + 1;
            while (j < n_nodes && is_view_op(all[order[j]].op)) j++;
            if (j < n_nodes && can_fuse(all, order[k], &all[order[j]])) {
                e = &all[order[j]];
                sc->epi[k] = order[j];
                sc->flags[j] |= SCHED_SKIP;
                sc->n_fused++;
            }
        }
        sched_unit u;
        unit_of(all, t, e, &u);
        int need = n_win == SCHED_WINDOW;
        for (int i = 0; i < n_win && !need; i++) need = conflict(&u, &w[i]);
        if (need) {
            sc->flags[k] |= SCHED_BARRIER;
            sc->n_barriers++;
            n_win = 0;
        }
        w[n_win++] = u;
    }
    free(w);
    int32_t next_mm = -1;
    for (int32_t k = n_nodes - 1; k >= 0; k--) {
        sc->pf[k] = -1;
        const pg_tensor *t = &all[order[k]];
        if (is_view_op(t->op) || (sc->flags[k] & SCHED_SKIP)) continue;
        if (t->op == PG_OP_MUL_MAT) {
            int cols;
            int64_t ws;
            pg_mul_mat_schedule_info(all, t, &cols, &ws);
            if (cols) next_mm = order[k];
        }
        if (sc->flags[k] & SCHED_BARRIER) sc->pf[k] = next_mm;
    }
    return 0;
}

/* Bytes of its next weight rows a thread asks L2 for when it reaches a barrier before the
 * others: the memory would otherwise idle while one thread runs the one-row nodes of decode. */
#define SCHED_PREFETCH_BYTES (64 << 10)

static void prefetch_weights(const pg_cparams *p, const pg_tensor *all, int32_t mm) {
    const pg_tensor *t = &all[mm], *w = &all[t->src[0]];
    int64_t n0, n1;
    pg_mul_mat_cols(t->ne[0], p->ith, p->nth, &n0, &n1);
    const char *a = (const char *)w->data + n0 * w->nb[1];
    int64_t len = (n1 - n0) * w->nb[1];
    if (len > SCHED_PREFETCH_BYTES) len = SCHED_PREFETCH_BYTES;
    for (int64_t i = 0; i < len; i += 64) __builtin_prefetch(a + i, 0, 2);
}

/* ---- kept plans -----------------------------------------------------------------------------
 * A graph computed again and again (decode: every token) keeps its schedule and work size here
 * instead of making them per compute (make_schedule: ~40 us a token on Gemma 3 270M's graph).
 * The schedule depends on every field of the marshalled tensors and on the order; the caller
 * never changes the fields other than the data addresses after creating the plan (pg_plan_new's
 * contract), and the addresses are fingerprinted on every compute: a plan whose tensors moved
 * makes its schedule again before running. */
struct pg_plan {
    pg_tensor     *t;
    int32_t        n_tensors;
    const int32_t *order;
    int32_t        n_nodes;
    int            have_schedule;    /* sc holds a schedule made for `fingerprint` */
    uint64_t       fingerprint;
    schedule       sc;
    int32_t        work_threads;     /* work_need is graph_work_size for this many (0: none yet) */
    size_t         work_need;
    int64_t        n_schedules;      /* schedules made (tests: reuse and invalidation) */
};

static uint64_t data_fingerprint(const pg_tensor *t, int32_t n) {
    uint64_t h = 0xcbf29ce484222325ull ^ (uint64_t)n;
    for (int32_t i = 0; i < n; i++) h = (h ^ (uint64_t)(uintptr_t)t[i].data) * 0x100000001b3ull;
    return h;
}

/* the plan's schedule for its tensors' current addresses (made again when they moved), or NULL
 * when out of memory (the caller then runs a barrier after every node) */
static const schedule *plan_schedule(pg_plan *p) {
    const uint64_t fp = data_fingerprint(p->t, p->n_tensors);
    if (p->have_schedule && p->fingerprint == fp) return &p->sc;
    if (p->have_schedule) free_schedule(&p->sc);
    p->have_schedule = make_schedule(p->t, p->order, p->n_nodes, &p->sc) == 0;
    p->fingerprint = fp;
    p->n_schedules++;
    return p->have_schedule ? &p->sc : NULL;
}

/* ---- run ------------------------------------------------------------------------------------ */

typedef struct {
    pg_tensor     *all;
    const int32_t *order;
    int32_t        n_nodes;
    uint8_t       *work;
    size_t         work_size;
    pg_threadpool *tp;
    pg_eval_cb     cb;
    void          *cb_user;
    atomic_int     error_node;
    atomic_int     stop;
    const schedule *sched;   /* NULL: a barrier after every node (and no fusion) */
    int            prefetch; /* a thread early at a barrier prefetches its next weight rows */
    const float   *out_src;  /* after the graph: out_n floats copied to out_dst (NULL: none) */
    float         *out_dst;
    int64_t        out_n;
    atomic_uint    out_bad;  /* a copied float was NaN or +inf */
} graph_job;

/* Whether one of n floats (as bits) is NaN or +inf (-inf, a token that cannot come, is
 * allowed); a loop the compiler vectorizes at -O3. */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("O3")))
#endif
static uint32_t not_finite_bits(const uint32_t *u, int64_t n) {
    uint32_t bad = 0;
    for (int64_t i = 0; i < n; i++)
        bad |= ((u[i] & 0x7fffffffu) > 0x7f800000u) | (u[i] == 0x7f800000u);
    return bad;
}

/* This thread's share of the output copy: the columns pg_mul_mat_cols gives it, as a decode
 * MUL_MAT over out_n columns (the logits) did, so mostly bytes it wrote itself; in blocks
 * checked while they are in L1. */
static void copy_out(graph_job *job, const pg_cparams *p) {
    int64_t n0, n1;
    pg_mul_mat_cols(job->out_n, p->ith, p->nth, &n0, &n1);
    uint32_t bad = 0;
    for (int64_t i = n0; i < n1; i += 4096) {
        const int64_t m = n1 - i < 4096 ? n1 - i : 4096;
        memcpy(job->out_dst + i, job->out_src + i, (size_t)m * sizeof(float));
        bad |= not_finite_bits((const uint32_t *)(job->out_dst + i), m);
    }
    if (bad) atomic_fetch_or(&job->out_bad, 1u);
}

static void forward(const pg_cparams *p, pg_tensor *all, pg_tensor *t) {
    switch (t->op) {
    case PG_OP_ADD: case PG_OP_SUB: case PG_OP_MUL: case PG_OP_DIV: pg_fwd_binary(p, all, t); break;
    case PG_OP_SQR: case PG_OP_SQRT: case PG_OP_SCALE: case PG_OP_GELU: case PG_OP_SILU:
    case PG_OP_TANH: case PG_OP_SIGMOID: case PG_OP_CLAMP: pg_fwd_unary(p, all, t); break;
    case PG_OP_NORM: case PG_OP_RMS_NORM: pg_fwd_norm(p, all, t); break;
    case PG_OP_SOFT_MAX: pg_fwd_soft_max(p, all, t); break;
    case PG_OP_ROPE: pg_fwd_rope(p, all, t); break;
    case PG_OP_DIAG_MASK_INF: pg_fwd_diag_mask_inf(p, all, t); break;
    case PG_OP_GET_ROWS: pg_fwd_get_rows(p, all, t); break;
    case PG_OP_SET_ROWS: pg_fwd_set_rows(p, all, t); break;
    case PG_OP_CPY: case PG_OP_CONT: case PG_OP_DUP: pg_fwd_cpy(p, all, t); break;
    case PG_OP_CONCAT: pg_fwd_concat(p, all, t); break;
    case PG_OP_MUL_MAT: pg_fwd_mul_mat(p, all, t); break;
    case PG_OP_FLASH_ATTN_EXT: pg_fwd_flash_attn(p, all, t); break;
    case PG_OP_MUL_MAT_ID: pg_fwd_mul_mat_id(p, all, t); break;
    case PG_OP_SUM_ROWS: pg_fwd_sum_rows(p, all, t); break;
    case PG_OP_ARGSORT: pg_fwd_argsort(p, all, t); break;
    case PG_OP_SSM_CONV: case PG_OP_GATED_DELTA_NET: case PG_OP_SOFTPLUS: pg_fwd_ssm(p, all, t); break;
    default: break;
    }
}

static void graph_worker(void *arg, int ith, int nth) {
    graph_job *job = arg;
    pg_cparams p = {ith, nth, job->work, job->work_size, job->tp, &job->error_node, -1, NULL};
    const schedule *sc = job->sched;
    if (sc) {
        for (int32_t k = 0; k < job->n_nodes; k++) {
            pg_tensor *t = &job->all[job->order[k]];
            if (is_view_op(t->op) || (sc->flags[k] & SCHED_SKIP)) continue;
            if (sc->flags[k] & SCHED_BARRIER) {
                /* not the last to arrive: use the wait to start the next weights' reads */
                if (sc->pf[k] >= 0 && nth > 1 && job->prefetch &&
                    atomic_load_explicit(&job->tp->bar_count, memory_order_relaxed) < nth - 1)
                    prefetch_weights(&p, job->all, sc->pf[k]);
                pg_sync(&p);
            }
            p.node_index = job->order[k];
            p.epi = sc->epi[k] >= 0 ? &job->all[sc->epi[k]] : NULL;
            forward(&p, job->all, t);
        }
        if (job->out_dst) {     /* every node done by every thread first */
            pg_sync(&p);
            copy_out(job, &p);
        }
        return;   /* pg_threadpool_run returns once every thread has */
    }
    for (int32_t k = 0; k < job->n_nodes; k++) {
        pg_tensor *t = &job->all[job->order[k]];
        if (is_view_op(t->op)) continue;
        p.node_index = job->order[k];
        forward(&p, job->all, t);
        pg_sync(&p);
        if (job->cb) {
            if (ith == 0 && job->cb(job->order[k], t, job->cb_user) != 0) atomic_store(&job->stop, 1);
            pg_sync(&p);
            if (atomic_load(&job->stop)) break;
        }
    }
    if (job->out_dst) copy_out(job, &p);     /* after the last node's barrier */
}

/* pg_graph_compute with tp acquired (or NULL); validate: check every node first (0: the caller
 * did, pg_graph_compute_validated); plan: the kept plan of t and order (pg_plan_compute: its
 * schedule and work size are reused), or NULL to make them for this compute */
static int32_t run_graph(pg_tensor *t, int32_t n_tensors, const int32_t *order, int32_t n_nodes,
                         pg_threadpool *tp, int32_t n_threads, void *work, size_t work_size,
                         pg_eval_cb cb, void *cb_user, int32_t *bad_node, int validate,
                         pg_plan *plan, const float *out_src, float *out_dst, int64_t out_n,
                         int32_t *not_finite) {
    if (!tp) n_threads = 1;
    else if (n_threads > tp->n_max) n_threads = tp->n_max;
    if (validate) {
        const int32_t st = pg_graph_validate(t, n_tensors, order, n_nodes, bad_node);
        if (st != PG_OK) return st;
    } else if (!t || n_tensors < 0 || n_nodes < 0 || (n_nodes > 0 && !order)) {
        return PG_ERR_INVALID_ARG;
    }
    size_t need;
    if (plan && plan->work_threads == n_threads) {
        need = plan->work_need;
    } else {
        need = graph_work_size(t, order, n_nodes, n_threads);
        if (plan) { plan->work_threads = n_threads; plan->work_need = need; }
    }
    if (need > 0 && (!work || work_size < need)) return PG_ERR_INVALID_ARG;
    /* with an eval callback every node is complete (and alone) when the callback sees it */
    schedule own;
    const schedule *sc = NULL;
    const int mode = __atomic_load_n(&g_schedule, __ATOMIC_RELAXED);
    if (!cb && mode > 0) {
        if (plan) sc = plan_schedule(plan);
        else if (make_schedule(t, order, n_nodes, &own) == 0) sc = &own;
    }
    graph_job job = {t, order, n_nodes, work, work_size, tp, cb, cb_user, -1, 0, sc, mode >= 2,
                     out_src, out_dst, out_n, 0};
    if (tp) pg_threadpool_run(tp, graph_worker, &job, n_threads);
    else graph_worker(&job, 0, 1);
    if (sc == &own) free_schedule(&own);
    if (not_finite) *not_finite = atomic_load(&job.out_bad) != 0;
    const int err = atomic_load(&job.error_node);
    if (err >= 0) {
        if (bad_node) *bad_node = err;
        return PG_ERR_INVALID_ARG;
    }
    if (atomic_load(&job.stop)) return PG_ERR_ABORTED;
    return PG_OK;
}

static int32_t compute(pg_tensor *t, int32_t n_tensors, const int32_t *order, int32_t n_nodes,
                       pg_threadpool *tp, int32_t n_threads, void *work, size_t work_size,
                       pg_eval_cb cb, void *cb_user, int32_t *bad_node, int validate,
                       pg_plan *plan, const float *out_src, float *out_dst, int64_t out_n,
                       int32_t *not_finite) {
    if (bad_node) *bad_node = -1;
    if (n_threads < 1 || n_threads > PG_MAX_THREADS) return PG_ERR_INVALID_ARG;
    /* a freed pool is refused here, before anything reads through the handle */
    if (tp && pg_threadpool_acquire(tp) != PG_OK) return PG_ERR_CLOSED;
    const int32_t st = run_graph(t, n_tensors, order, n_nodes, tp, n_threads, work, work_size,
                                 cb, cb_user, bad_node, validate, plan, out_src, out_dst, out_n,
                                 not_finite);
    if (tp) pg_threadpool_release(tp);
    return st;
}

int32_t pg_graph_compute(pg_tensor *t, int32_t n_tensors, const int32_t *order, int32_t n_nodes,
                         pg_threadpool *tp, int32_t n_threads, void *work, size_t work_size,
                         pg_eval_cb cb, void *cb_user, int32_t *bad_node) {
    return compute(t, n_tensors, order, n_nodes, tp, n_threads, work, work_size, cb, cb_user,
                   bad_node, 1, NULL, NULL, NULL, 0, NULL);
}

int32_t pg_graph_compute_validated(pg_tensor *t, int32_t n_tensors, const int32_t *order,
                                   int32_t n_nodes, pg_threadpool *tp, int32_t n_threads,
                                   void *work, size_t work_size, pg_eval_cb cb, void *cb_user,
                                   int32_t *bad_node) {
    return compute(t, n_tensors, order, n_nodes, tp, n_threads, work, work_size, cb, cb_user,
                   bad_node, 0, NULL, NULL, NULL, 0, NULL);
}

int32_t pg_graph_schedule_stats(pg_tensor *t, int32_t n_tensors, const int32_t *order,
                                int32_t n_nodes, int32_t *n_barriers, int32_t *n_fused) {
    int32_t bad;
    if (!n_barriers || !n_fused) return PG_ERR_INVALID_ARG;
    const int32_t st = pg_graph_validate(t, n_tensors, order, n_nodes, &bad);
    if (st != PG_OK) return st;
    schedule sc;
    if (make_schedule(t, order, n_nodes, &sc) != 0) return PG_ERR_NOMEM;
    *n_barriers = sc.n_barriers;
    *n_fused = sc.n_fused;
    free_schedule(&sc);
    return PG_OK;
}

pg_plan *pg_plan_new(pg_tensor *t, int32_t n_tensors, const int32_t *order, int32_t n_nodes) {
    if (!t || n_tensors < 0 || n_nodes < 0 || (n_nodes > 0 && !order)) return NULL;
    pg_plan *p = calloc(1, sizeof(*p));
    if (!p) return NULL;
    p->t = t;
    p->n_tensors = n_tensors;
    p->order = order;
    p->n_nodes = n_nodes;
    return p;
}

void pg_plan_free(pg_plan *p) {
    if (!p) return;
    if (p->have_schedule) free_schedule(&p->sc);
    free(p);
}

int64_t pg_plan_n_schedules(const pg_plan *p) {
    return p ? p->n_schedules : -1;
}

int32_t pg_plan_compute(pg_plan *p, pg_threadpool *tp, int32_t n_threads, void *work,
                        size_t work_size, int32_t *bad_node) {
    if (bad_node) *bad_node = -1;
    if (!p) return PG_ERR_INVALID_ARG;
    /* the plan is read and its schedule (re)made under the pool: computes on one pool, and so
     * on one backend's plans, are serialized */
    return compute(p->t, p->n_tensors, p->order, p->n_nodes, tp, n_threads, work, work_size,
                   NULL, NULL, bad_node, 0, p, NULL, NULL, 0, NULL);
}

int32_t pg_plan_compute_out(pg_plan *p, pg_threadpool *tp, int32_t n_threads, void *work,
                            size_t work_size, int32_t *bad_node, const float *src, float *dst,
                            int64_t n, int32_t *not_finite) {
    if (bad_node) *bad_node = -1;
    if (!p || !src || !dst || n < 0 || !not_finite) return PG_ERR_INVALID_ARG;
    *not_finite = 0;
    return compute(p->t, p->n_tensors, p->order, p->n_nodes, tp, n_threads, work, work_size,
                   NULL, NULL, bad_node, 0, p, src, dst, n, not_finite);
}
