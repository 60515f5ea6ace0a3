/* Thread pool lifetime and sharing: a freed pool is refused (PG_ERR_CLOSED, never a hang or a
 * read of freed memory), a second free is a no-op, computes from two threads on one pool are
 * serialized and both correct, and a free while a compute is in flight waits for it. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pg_test.h"
#include "pyggml.h"

enum { K = 64, N = 48, M = 5 };

/* y = w · x as a 3-tensor graph: w [K, N], x [K, M] -> y [N, M] */
typedef struct {
    float w[K * N], x[K * M], y[N * M];
    pg_tensor t[3];
    int32_t order[1];
    uint8_t work[1 << 16];
} mm_graph;

static void set_f32(pg_tensor *t, int32_t op, int64_t ne0, int64_t ne1, void *data) {
    memset(t, 0, sizeof(*t));
    t->type = PG_TYPE_F32;
    t->op = op;
    t->ne[0] = ne0; t->ne[1] = ne1; t->ne[2] = 1; t->ne[3] = 1;
    t->nb[0] = 4; t->nb[1] = 4 * ne0; t->nb[2] = t->nb[1] * ne1; t->nb[3] = t->nb[2];
    for (int k = 0; k < PG_MAX_SRC; k++) t->src[k] = -1;
    t->data = data;
}

static void mm_init(mm_graph *g, unsigned seed) {
    srand(seed);
    for (int i = 0; i < K * N; i++) g->w[i] = (float)rand() / RAND_MAX - 0.5f;
    for (int i = 0; i < K * M; i++) g->x[i] = (float)rand() / RAND_MAX - 0.5f;
    set_f32(&g->t[0], PG_OP_NONE, K, N, g->w);
    set_f32(&g->t[1], PG_OP_NONE, K, M, g->x);
    set_f32(&g->t[2], PG_OP_MUL_MAT, N, M, g->y);
    g->t[2].src[0] = 0;
    g->t[2].src[1] = 1;
    g->order[0] = 2;
}

static int32_t mm_run(mm_graph *g, pg_threadpool *tp, int nth) {
    int32_t bad = -1;
    memset(g->y, 0, sizeof(g->y));
    return pg_graph_compute(g->t, 3, g->order, 1, tp, nth, g->work, sizeof(g->work), NULL, NULL,
                            &bad);
}

static double mm_err(const mm_graph *g) {
    double e = 0;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double d = 0;
            for (int k = 0; k < K; k++) d += (double)g->w[n * K + k] * g->x[m * K + k];
            const double a = d - g->y[m * N + n];
            if ((a < 0 ? -a : a) > e) e = a < 0 ? -a : a;
        }
    return e;
}

PG_TEST(test_threadpool_freed_is_refused) {
    static mm_graph g;
    mm_init(&g, 5);
    pg_threadpool *tp = pg_threadpool_new(3);
    CHECK(tp && pg_threadpool_n_threads(tp) == 3, "pool of 3");
    CHECK(mm_run(&g, tp, 3) == PG_OK && mm_err(&g) < 1e-4, "compute on a live pool");
    pg_threadpool_free(tp);
    /* the stale handle: refused without reading through it (ASan would report it) */
    CHECK(mm_run(&g, tp, 3) == PG_ERR_CLOSED, "compute on a freed pool");
    CHECK(pg_threadpool_n_threads(tp) == 0, "n_threads of a freed pool");
    pg_threadpool_free(tp);                         /* a second free: no-op */
    pg_threadpool_free(NULL);
    int not_a_pool;
    CHECK(mm_run(&g, (pg_threadpool *)&not_a_pool, 2) == PG_ERR_CLOSED, "an unknown handle");
    CHECK(mm_run(&g, NULL, 1) == PG_OK && mm_err(&g) < 1e-4, "no pool: one thread");
}

typedef struct {
    pg_threadpool *tp;
    mm_graph g;
    int n_ok, n_closed, n_other;
    double max_err;
} worker_state;

static void *compute_loop(void *p) {
    worker_state *s = p;
    for (int i = 0; i < 200; i++) {
        const int32_t st = mm_run(&s->g, s->tp, 2);
        if (st == PG_OK) {
            s->n_ok++;
            const double e = mm_err(&s->g);
            if (e > s->max_err) s->max_err = e;
        } else if (st == PG_ERR_CLOSED) {
            s->n_closed++;
        } else {
            s->n_other++;
        }
    }
    return NULL;
}

PG_TEST(test_threadpool_shared_by_two_threads) {
    pg_threadpool *tp = pg_threadpool_new(2);
    static worker_state s[2];
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        memset(&s[i], 0, sizeof(s[i]));
        s[i].tp = tp;
        mm_init(&s[i].g, 11 + (unsigned)i);
        pthread_create(&th[i], NULL, compute_loop, &s[i]);
    }
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 2; i++) {
        CHECK(s[i].n_ok == 200 && s[i].n_other == 0 && s[i].n_closed == 0,
              "thread %d: ok %d closed %d other %d", i, s[i].n_ok, s[i].n_closed, s[i].n_other);
        CHECK(s[i].max_err < 1e-4, "thread %d: max error %g", i, s[i].max_err);
    }
    pg_threadpool_free(tp);
}

PG_TEST(test_threadpool_free_while_computing) {
    /* computes run while the pool is freed: each one either completes correctly or is refused
     * with PG_ERR_CLOSED; free waits for the one in flight, nothing hangs or crashes */
    static worker_state s[2];
    pthread_t th[2];
    pg_threadpool *tp = pg_threadpool_new(2);
    for (int i = 0; i < 2; i++) {
        memset(&s[i], 0, sizeof(s[i]));
        s[i].tp = tp;
        mm_init(&s[i].g, 21 + (unsigned)i);
        pthread_create(&th[i], NULL, compute_loop, &s[i]);
    }
    const struct timespec pause = {0, 2 * 1000 * 1000};     /* 2 ms: let some computes run */
    nanosleep(&pause, NULL);
    pg_threadpool_free(tp);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 2; i++) {
        CHECK(s[i].n_ok + s[i].n_closed == 200 && s[i].n_other == 0,
              "thread %d: ok %d closed %d other %d", i, s[i].n_ok, s[i].n_closed, s[i].n_other);
        CHECK(s[i].max_err < 1e-4, "thread %d: max error %g", i, s[i].max_err);
    }
}
