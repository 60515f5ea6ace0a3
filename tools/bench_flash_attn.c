/* FLASH_ATTN_EXT alone through pg_graph_compute, at Gemma 3 270M's prompt shape (head dim 256,
 * 4 query heads on 1 KV head, F16 K/V in the KV cache's layout: a cell's heads side by side,
 * causal F16 mask): best of `reps` runs, and GFLOP/s
 * counting 4·D·H flops per visible (query, key) pair. Links against a libpyggml.so, so two
 * builds can be compared by LD_LIBRARY_PATH:
 *   gcc -O2 -Inative/include -Inative/src tools/bench_flash_attn.c -o /tmp/bench_fa \
 *       -Lbuild/native -lpyggml -lm
 *   LD_LIBRARY_PATH=build/native /tmp/bench_fa [n_q 512] [n_kv 512] [threads 1] [reps 5] [path]
 *       [D 256] [H 4] [H_kv 1]
 * path: 0 scalar, 1 avx2, 2 avx512, 3 neon (-1: the best one, the default). The last three give
 * another model's shape, e.g. Qwen2.5 0.5B's decode: 1 16384 2 5 -1 64 14 2. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fp16.h"
#include "pyggml.h"

static void set_t(pg_tensor *t, int32_t type, int32_t op, const int64_t ne[4], void *data) {
    memset(t, 0, sizeof(*t));
    t->type = type;
    t->op = op;
    for (int i = 0; i < 4; i++) t->ne[i] = ne[i];
    t->nb[0] = type == PG_TYPE_F16 ? 2 : 4;
    for (int i = 1; i < 4; i++) t->nb[i] = t->nb[i - 1] * ne[i - 1];
    for (int i = 0; i < PG_MAX_SRC; i++) t->src[i] = -1;
    t->data = data;
}

static float frand(void) { return (float)rand() / (float)RAND_MAX - 0.5f; }

int main(int argc, char **argv) {
    const int D = argc > 6 ? atoi(argv[6]) : 256, H = argc > 7 ? atoi(argv[7]) : 4;
    const int HKV = argc > 8 ? atoi(argv[8]) : 1;
    const int NQ = argc > 1 ? atoi(argv[1]) : 512, NKV = argc > 2 ? atoi(argv[2]) : 512;
    const int nth = argc > 3 ? atoi(argv[3]) : 1, reps = argc > 4 ? atoi(argv[4]) : 5;
    if (argc > 5 && atoi(argv[5]) >= 0 && pg_set_cpu_path(atoi(argv[5])) != PG_OK) {
        fprintf(stderr, "path %s not available\n", argv[5]);
        return 2;
    }
    float *q = malloc(sizeof(float) * D * NQ * H), *out = malloc(sizeof(float) * D * NQ * H);
    pg_fp16 *k = malloc(2L * D * NKV * HKV), *v = malloc(2L * D * NKV * HKV);
    pg_fp16 *m = malloc(2L * NKV * NQ);
    for (long i = 0; i < (long)D * NQ * H; i++) q[i] = frand();
    for (long i = 0; i < (long)D * NKV * HKV; i++) {
        k[i] = pg_fp32_to_fp16(frand());
        v[i] = pg_fp32_to_fp16(frand());
    }
    for (int i = 0; i < NQ; i++)   /* the queries are the last NQ positions of the cache */
        for (int j = 0; j < NKV; j++)
            m[i * NKV + j] = pg_fp32_to_fp16(j > NKV - NQ + i ? -INFINITY : 0.0f);
    pg_tensor t[5];
    const int64_t nq[4] = {D, NQ, H, 1}, nk[4] = {D, NKV, HKV, 1}, nm[4] = {NKV, NQ, 1, 1};
    const int64_t no[4] = {D, H, NQ, 1};
    set_t(&t[0], PG_TYPE_F32, PG_OP_NONE, nq, q);
    set_t(&t[1], PG_TYPE_F16, PG_OP_NONE, nk, k);
    set_t(&t[2], PG_TYPE_F16, PG_OP_NONE, nk, v);
    for (int i = 1; i <= 2; i++) {   /* the KV cache's layout: a cell's heads side by side */
        t[i].nb[1] = 2L * D * HKV;
        t[i].nb[2] = 2L * D;
    }
    set_t(&t[3], PG_TYPE_F16, PG_OP_NONE, nm, m);
    set_t(&t[4], PG_TYPE_F32, PG_OP_FLASH_ATTN_EXT, no, out);
    for (int i = 0; i < 4; i++) t[4].src[i] = i;
    const float scale = 0.0625f;
    memcpy(&t[4].op_params[0], &scale, 4);
    const int32_t order[1] = {4};
    size_t ws = 0;
    int32_t bad = -1;
    if (pg_graph_work_size(t, 5, order, 1, nth, &ws) != PG_OK) return 1;
    void *work = calloc(1, ws + 64);
    pg_threadpool *tp = pg_threadpool_new(nth);
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        if (pg_graph_compute(t, 5, order, 1, tp, nth, work, ws, NULL, NULL, &bad) != PG_OK) {
            fprintf(stderr, "compute failed (node %d)\n", bad);
            return 1;
        }
        clock_gettime(CLOCK_MONOTONIC, &b);
        const double ms = (double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) / 1e6;
        if (ms < best) best = ms;
    }
    const double pairs = (double)NQ * NKV - (double)NQ * (NQ - 1) / 2;
    printf("path %d n_q %d n_kv %d threads %d: best %.2f ms (%.1f GFLOP/s)\n", pg_cpu_path(), NQ,
           NKV, nth, best, 4.0 * D * H * pairs / best / 1e6);
    pg_threadpool_free(tp);
    free(work); free(q); free(out); free(k); free(v); free(m);
    return 0;
}
