/* The CPU graph executor: validation of a marshalled graph, work-buffer sizing, and the run loop
 * (every thread walks the node list; a barrier between nodes). */
#include <stdio.h>
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
} graph_job;

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
    pg_cparams p = {ith, nth, job->work, job->work_size, job->tp, &job->error_node, -1};
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
}

/* pg_graph_compute with tp acquired (or NULL); validate: check every node first (0: the caller
 * did, pg_graph_compute_validated) */
static int32_t run_graph(pg_tensor *t, int32_t n_tensors, const int32_t *order, int32_t n_nodes,
                         pg_threadpool *tp, int32_t n_threads, void *work, size_t work_size,
                         pg_eval_cb cb, void *cb_user, int32_t *bad_node, int validate) {
    if (!tp) n_threads = 1;
    else if (n_threads > tp->n_max) n_threads = tp->n_max;
    if (validate) {
        const int32_t st = pg_graph_validate(t, n_tensors, order, n_nodes, bad_node);
        if (st != PG_OK) return st;
    } else if (!t || n_tensors < 0 || n_nodes < 0 || (n_nodes > 0 && !order)) {
        return PG_ERR_INVALID_ARG;
    }
    const size_t need = graph_work_size(t, order, n_nodes, n_threads);
    if (need > 0 && (!work || work_size < need)) return PG_ERR_INVALID_ARG;
    graph_job job = {t, order, n_nodes, work, work_size, tp, cb, cb_user, -1, 0};
    if (tp) pg_threadpool_run(tp, graph_worker, &job, n_threads);
    else graph_worker(&job, 0, 1);
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
                       pg_eval_cb cb, void *cb_user, int32_t *bad_node, int validate) {
    if (bad_node) *bad_node = -1;
    if (n_threads < 1 || n_threads > PG_MAX_THREADS) return PG_ERR_INVALID_ARG;
    /* a freed pool is refused here, before anything reads through the handle */
    if (tp && pg_threadpool_acquire(tp) != PG_OK) return PG_ERR_CLOSED;
    const int32_t st = run_graph(t, n_tensors, order, n_nodes, tp, n_threads, work, work_size,
                                 cb, cb_user, bad_node, validate);
    if (tp) pg_threadpool_release(tp);
    return st;
}

int32_t pg_graph_compute(pg_tensor *t, int32_t n_tensors, const int32_t *order, int32_t n_nodes,
                         pg_threadpool *tp, int32_t n_threads, void *work, size_t work_size,
                         pg_eval_cb cb, void *cb_user, int32_t *bad_node) {
    return compute(t, n_tensors, order, n_nodes, tp, n_threads, work, work_size, cb, cb_user,
                   bad_node, 1);
}

int32_t pg_graph_compute_validated(pg_tensor *t, int32_t n_tensors, const int32_t *order,
                                   int32_t n_nodes, pg_threadpool *tp, int32_t n_threads,
                                   void *work, size_t work_size, pg_eval_cb cb, void *cb_user,
                                   int32_t *bad_node) {
    return compute(t, n_tensors, order, n_nodes, tp, n_threads, work, work_size, cb, cb_user,
                   bad_node, 0);
}
