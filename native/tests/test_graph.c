/* The graph executor through its C entry points: a small graph computed with 1 and 2 threads
 * (identical bits), and validation of bad input (no crash, the bad node reported). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pg_test.h"
#include "pyggml.h"

static void set_f32(pg_tensor *t, int32_t op, int64_t ne0, int64_t ne1, void *data) {
    memset(t, 0, sizeof(*t));
    t->type = PG_TYPE_F32;
    t->op = op;
    t->ne[0] = ne0; t->ne[1] = ne1; t->ne[2] = 1; t->ne[3] = 1;
    t->nb[0] = 4; t->nb[1] = 4 * ne0; t->nb[2] = t->nb[1] * ne1; t->nb[3] = t->nb[2];
    for (int k = 0; k < PG_MAX_SRC; k++) t->src[k] = -1;
    t->data = data;
}

/* y = rms_norm(silu(w · x) + b): w [K, N], x [K, M], b [N] */
enum { K = 37, N = 19, M = 3 };

static int build(pg_tensor *t, float *w, float *x, float *b, float *mm, float *act, float *sum,
                 float *y) {
    set_f32(&t[0], PG_OP_NONE, K, N, w);
    set_f32(&t[1], PG_OP_NONE, K, M, x);
    set_f32(&t[2], PG_OP_NONE, N, 1, b);
    set_f32(&t[3], PG_OP_MUL_MAT, N, M, mm); t[3].src[0] = 0; t[3].src[1] = 1;
    set_f32(&t[4], PG_OP_SILU, N, M, act);   t[4].src[0] = 3;
    set_f32(&t[5], PG_OP_ADD, N, M, sum);    t[5].src[0] = 4; t[5].src[1] = 2;
    set_f32(&t[6], PG_OP_RMS_NORM, N, M, y); t[6].src[0] = 5;
    const float eps = 1e-6f;
    memcpy(&t[6].op_params[0], &eps, 4);
    return 7;
}

PG_TEST(test_graph_compute_threads_agree) {
    static float w[K * N], x[K * M], b[N], mm[N * M], act[N * M], sum[N * M], y1[N * M], y2[N * M];
    srand(3);
    for (int i = 0; i < K * N; i++) w[i] = (float)rand() / RAND_MAX - 0.5f;
    for (int i = 0; i < K * M; i++) x[i] = (float)rand() / RAND_MAX - 0.5f;
    for (int i = 0; i < N; i++) b[i] = 0.1f * (float)i;
    pg_tensor t[7];
    const int32_t order[4] = {3, 4, 5, 6};
    int32_t bad = 0;
    pg_threadpool *tp = pg_threadpool_new(2);
    CHECK(tp != NULL, "thread pool");
    CHECK(pg_threadpool_n_threads(tp) == 2, "n_threads");
    size_t ws = 0;
    build(t, w, x, b, mm, act, sum, y1);
    CHECK(pg_graph_work_size(t, 7, order, 4, 2, &ws) == PG_OK, "work size");
    void *work = calloc(1, ws + 1);
    CHECK(pg_graph_compute(t, 7, order, 4, tp, 1, work, ws, NULL, NULL, &bad) == PG_OK, "1 thread");
    build(t, w, x, b, mm, act, sum, y2);
    CHECK(pg_graph_compute(t, 7, order, 4, tp, 2, work, ws, NULL, NULL, &bad) == PG_OK, "2 threads");
    CHECK(memcmp(y1, y2, sizeof(y1)) == 0, "1 and 2 threads differ");
    /* against a direct computation */
    double max_err = 0;
    for (int m = 0; m < M; m++) {
        double r[N], ss = 0;
        for (int n = 0; n < N; n++) {
            double d = 0;
            for (int k = 0; k < K; k++) d += (double)w[n * K + k] * x[m * K + k];
            r[n] = d / (1 + exp(-d)) + b[n];
            ss += r[n] * r[n];
        }
        for (int n = 0; n < N; n++) {
            const double e = fabs(r[n] / sqrt(ss / N + 1e-6) - y2[m * N + n]);
            if (e > max_err) max_err = e;
        }
    }
    CHECK(max_err < 1e-4, "max error %g", max_err);
    free(work);
    pg_threadpool_free(tp);
}

/* the entry point for a validated plan: the same bits; the work buffer still checked */
PG_TEST(test_graph_compute_validated) {
    static float w[K * N], x[K * M], b[N], mm[N * M], act[N * M], sum[N * M], y1[N * M], y2[N * M];
    uint64_t st = 11;
    for (int i = 0; i < K * N; i++) w[i] = pg_test_unit(pg_test_splitmix(&st));
    for (int i = 0; i < K * M; i++) x[i] = pg_test_unit(pg_test_splitmix(&st));
    for (int i = 0; i < N; i++) b[i] = 0.1f * (float)i;
    pg_tensor t[7];
    const int32_t order[4] = {3, 4, 5, 6};
    int32_t bad = 0;
    pg_threadpool *tp = pg_threadpool_new(2);
    size_t ws = 0;
    build(t, w, x, b, mm, act, sum, y1);
    CHECK(pg_graph_work_size(t, 7, order, 4, 2, &ws) == PG_OK, "work size");
    void *work = calloc(1, ws + 1);
    CHECK(pg_graph_compute(t, 7, order, 4, tp, 2, work, ws, NULL, NULL, &bad) == PG_OK, "compute");
    build(t, w, x, b, mm, act, sum, y2);
    for (int rep = 0; rep < 3; rep++)
        CHECK(pg_graph_compute_validated(t, 7, order, 4, tp, 2, work, ws, NULL, NULL, &bad) ==
              PG_OK, "validated compute");
    CHECK(memcmp(y1, y2, sizeof(y1)) == 0, "validated compute differs");
    if (ws > 0)
        CHECK(pg_graph_compute_validated(t, 7, order, 4, tp, 2, work, ws - 1, NULL, NULL, &bad) ==
              PG_ERR_INVALID_ARG, "short work buffer accepted");
    CHECK(pg_graph_compute_validated(NULL, 7, order, 4, tp, 2, work, ws, NULL, NULL, &bad) ==
          PG_ERR_INVALID_ARG, "NULL graph accepted");
    CHECK(pg_graph_compute_validated(t, 7, NULL, 4, tp, 2, work, ws, NULL, NULL, &bad) ==
          PG_ERR_INVALID_ARG, "NULL order accepted");
    CHECK(pg_graph_compute_validated(t, 7, order, 4, tp, 0, work, ws, NULL, NULL, &bad) ==
          PG_ERR_INVALID_ARG, "0 threads accepted");
    free(work);
    pg_threadpool_free(tp);
}

PG_TEST(test_graph_validation_rejects_bad_input) {
    static float w[K * N], x[K * M], b[N], mm[N * M], act[N * M], sum[N * M], y[N * M];
    pg_tensor t[7];
    const int32_t order[4] = {3, 4, 5, 6};
    int32_t bad = -1;
    char reason[128];

    build(t, w, x, b, mm, act, sum, y);
    t[5].src[1] = 42;                                   /* src index out of range */
    CHECK(pg_graph_validate(t, 7, order, 4, &bad) == PG_ERR_INVALID_ARG && bad == 5, "bad src %d", bad);

    build(t, w, x, b, mm, act, sum, y);
    t[4].data = NULL;                                   /* no data */
    CHECK(pg_graph_validate(t, 7, order, 4, &bad) == PG_ERR_INVALID_ARG && bad == 4, "no data %d", bad);

    build(t, w, x, b, mm, act, sum, y);
    t[3].ne[0] = N + 1;                                 /* wrong output shape */
    CHECK(pg_graph_validate(t, 7, order, 4, &bad) == PG_ERR_INVALID_ARG && bad == 3, "shape %d", bad);

    build(t, w, x, b, mm, act, sum, y);
    t[6].op = 999;                                      /* unknown op */
    CHECK(pg_node_supported(t, 7, 6, reason, sizeof(reason)) == PG_ERR_INVALID_ARG, "op");
    CHECK(strstr(reason, "unknown op") != NULL, "reason '%s'", reason);

    build(t, w, x, b, mm, act, sum, y);
    t[0].type = 77;                                     /* unknown type */
    CHECK(pg_graph_validate(t, 7, order, 4, &bad) == PG_ERR_INVALID_ARG, "type");

    build(t, w, x, b, mm, act, sum, y);
    t[1].ne[1] = -3;                                    /* negative dimension */
    CHECK(pg_graph_validate(t, 7, order, 4, &bad) == PG_ERR_INVALID_ARG, "negative ne");

    build(t, w, x, b, mm, act, sum, y);
    t[4].type = PG_TYPE_F16;                            /* F16 silu: no kernel */
    t[4].nb[0] = 2;
    CHECK(pg_graph_validate(t, 7, order, 4, &bad) == PG_ERR_UNSUPPORTED && bad == 4, "f16 silu");

    build(t, w, x, b, mm, act, sum, y);
    t[0].type = PG_TYPE_F16;                            /* F16 weights: activations converted */
    t[0].nb[0] = 2; t[0].nb[1] = 2 * K; t[0].nb[2] = t[0].nb[3] = 2 * K * N;
    CHECK(pg_graph_compute(t, 7, order, 4, NULL, 1, NULL, 0, NULL, NULL, &bad) == PG_ERR_INVALID_ARG,
          "mul_mat of F16 weights needs a work buffer");
    CHECK(pg_graph_compute(t, 7, order, 4, NULL, 0, NULL, 0, NULL, NULL, &bad) == PG_ERR_INVALID_ARG,
          "0 threads");
    CHECK(pg_graph_validate(NULL, 7, order, 4, &bad) == PG_ERR_INVALID_ARG, "NULL tensors");
    CHECK(pg_threadpool_new(0) == NULL && pg_threadpool_new(100000) == NULL, "pool sizes");
}

static int32_t stop_after_two(int32_t i, const pg_tensor *t, void *user) {
    (void)t;
    int *n = user;
    (*n)++;
    return *n >= 2 && i >= 0;
}

PG_TEST(test_graph_eval_callback_stops) {
    static float w[K * N], x[K * M], b[N], mm[N * M], act[N * M], sum[N * M], y[N * M];
    pg_tensor t[7];
    const int32_t order[4] = {3, 4, 5, 6};
    int32_t bad = -1;
    int calls = 0;
    build(t, w, x, b, mm, act, sum, y);
    static uint8_t work[1 << 16];
    CHECK(pg_graph_compute(t, 7, order, 4, NULL, 1, work, sizeof(work), stop_after_two, &calls,
                           &bad) == PG_ERR_ABORTED, "callback stop");
    CHECK(calls == 2, "calls %d", calls);
}
