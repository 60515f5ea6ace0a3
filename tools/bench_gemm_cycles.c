/* In-cache kernel throughput, robust to a busy machine: a MUL_MAT of a K×N weight with M
 * activation rows (M = 1: the vec_dot path, decode; M > 1: the gemm path, prompt), 1 thread,
 * timed by the thread's CPU clock (CLOCK_THREAD_CPUTIME_ID: time this thread was not running
 * does not count) as the minimum over many short trials (a trial hit by a context switch or a
 * busy hyperthread sibling is simply not the minimum). Prints GOP/s (2·K·N·M / s) per type.
 *
 * Build against a library and run (tools/bench_gemm_cycles.sh does both for two builds, A B A B):
 *   cc -O2 -Inative/include tools/bench_gemm_cycles.c -o /tmp/bgc -Lbuild/native -lpyggml \
 *      -Wl,-rpath,$PWD/build/native && /tmp/bgc q4_0,q4_k,q6_k 1,64 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pyggml.h"

static const struct { const char *name; int32_t type; } k_names[] = {
    {"q4_0", PG_TYPE_Q4_0}, {"q4_1", PG_TYPE_Q4_1}, {"q5_0", PG_TYPE_Q5_0},
    {"q5_1", PG_TYPE_Q5_1}, {"q8_0", PG_TYPE_Q8_0}, {"q2_k", PG_TYPE_Q2_K},
    {"q3_k", PG_TYPE_Q3_K}, {"q4_k", PG_TYPE_Q4_K}, {"q5_k", PG_TYPE_Q5_K},
    {"q6_k", PG_TYPE_Q6_K}, {"f16", PG_TYPE_F16}, {"iq4_nl", PG_TYPE_IQ4_NL},
    {"iq4_xs", PG_TYPE_IQ4_XS}, {"mxfp4", PG_TYPE_MXFP4}, {"tq2_0", PG_TYPE_TQ2_0},
    /* made only with an importance matrix: random codes, each block's fp16 d 1/16 */
    {"iq3_s", PG_TYPE_IQ3_S}, {"iq3_xxs", PG_TYPE_IQ3_XXS}, {"iq2_xxs", PG_TYPE_IQ2_XXS},
    {"iq2_xs", PG_TYPE_IQ2_XS}, {"iq2_s", PG_TYPE_IQ2_S}, {"iq1_s", PG_TYPE_IQ1_S},
};

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void tensor(pg_tensor *t, int32_t type, int32_t op, int64_t ne0, int64_t ne1, void *d) {
    memset(t, 0, sizeof(*t));
    t->type = type;
    t->op = op;
    t->ne[0] = ne0; t->ne[1] = ne1; t->ne[2] = 1; t->ne[3] = 1;
    t->nb[0] = pg_type_size(type);
    t->nb[1] = ne0 / pg_type_block_size(type) * pg_type_size(type);
    t->nb[2] = t->nb[1] * ne1; t->nb[3] = t->nb[2];
    for (int k = 0; k < PG_MAX_SRC; k++) t->src[k] = -1;
    t->data = d;
}

int main(int argc, char **argv) {
    const char *types = argc > 1 ? argv[1] : "q4_0,q8_0,q4_k,q6_k";
    const char *ms = argc > 2 ? argv[2] : "1,64";
    /* K and N (weight rows): BGC_K, BGC_N in the environment, default 2048, 256 (in cache); a real model's
     * 1536..8960 amortizes the activations' conversion over more rows */
    const int64_t K = getenv("BGC_K") ? atoll(getenv("BGC_K")) : 2048;
    const int64_t N = getenv("BGC_N") ? atoll(getenv("BGC_N")) : 256;
    /* a row of K elements must be whole blocks of every type (256: the k-quants' block) */
    if (K <= 0 || K % 256 != 0 || N <= 0) {
        fprintf(stderr, "bench_gemm_cycles: BGC_K=%lld must be a positive multiple of 256 and "
                "BGC_N=%lld positive\n", (long long)K, (long long)N);
        return 2;
    }
    float *wf = malloc(sizeof(float) * K * N), *x = malloc(sizeof(float) * K * 512);
    float *dst = malloc(sizeof(float) * N * 512);
    uint8_t *w = malloc((size_t)K * N * 4);
    srand(1);
    for (int64_t i = 0; i < K * N; i++) wf[i] = (float)rand() / RAND_MAX - 0.5f;
    for (int64_t i = 0; i < K * 512; i++) x[i] = (float)rand() / RAND_MAX - 0.5f;
    for (size_t it = 0; it < sizeof(k_names) / sizeof(k_names[0]); it++) {
        /* whole names: "q4_k" must not select iq4_k-like names by substring */
        char want[80];
        snprintf(want, sizeof want, ",%s,", k_names[it].name);
        char have[256];
        snprintf(have, sizeof have, ",%s,", types);
        if (!strstr(have, want)) continue;
        const int32_t type = k_names[it].type;
        const size_t row = (size_t)(K / pg_type_block_size(type)) * (size_t)pg_type_size(type);
        if (type == PG_TYPE_F16) pg_quantize_row_act(type, wf, w, K * N);
        else if (pg_quantize_row(type, wf, w, K) == PG_ERR_UNSUPPORTED)
            for (size_t b = 0; b < row * (size_t)N; b++)
                w[b] = b % (size_t)pg_type_size(type) == 0 ? 0x00
                     : b % (size_t)pg_type_size(type) == 1 ? 0x2C : (uint8_t)rand();
        else
            for (int64_t r = 0; r < N; r++)
                pg_quantize_row(type, wf + r * K, w + r * (K / pg_type_block_size(type)) *
                                                      pg_type_size(type), K);
        char buf[64];
        snprintf(buf, sizeof buf, "%s", ms);
        for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
            const int64_t M = atoi(tok);
            if (M < 1 || M > 512) {         /* the activations are allocated for 512 rows */
                fprintf(stderr, "bench_gemm_cycles: M=%s must be in 1..512\n", tok);
                return 2;
            }
            pg_tensor t[3];
            tensor(&t[0], type, PG_OP_NONE, K, N, w);
            tensor(&t[1], PG_TYPE_F32, PG_OP_NONE, K, M, x);
            tensor(&t[2], PG_TYPE_F32, PG_OP_MUL_MAT, N, M, dst);
            t[2].src[0] = 0;
            t[2].src[1] = 1;
            const int32_t order[1] = {2};
            size_t ws = 0;
            int32_t bad;
            pg_graph_work_size(t, 3, order, 1, 1, &ws);
            void *work = malloc(ws + 64);
            double best = 1e9;
            const int trials = M == 1 ? 3000 : 300;
            for (int k = 0; k < trials; k++) {
                const double t0 = now();
                pg_graph_compute(t, 3, order, 1, NULL, 1, work, ws, NULL, NULL, &bad);
                const double dt = now() - t0;
                if (dt < best) best = dt;
            }
            free(work);
            printf("%s M=%d %.1f\n", k_names[it].name, (int)M, 2.0 * K * N * M / best / 1e9);
        }
    }
    return 0;
}
