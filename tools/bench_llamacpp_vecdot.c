/* llama.cpp's own CPU dot kernels next to pyggml's, on the same weight bytes: a 4096 x 4096
 * matvec (one activation row) per type, one thread, the weights streamed from DRAM and in cache.
 * For benchmarks only (BENCHMARKS.md, issue 32): llama.cpp is never a runtime or test
 * dependency of pyggml.
 *
 * llama.cpp side: ggml_get_type_traits_cpu(type) gives vec_dot, its vec_dot_type and that type's
 * from_float; one matvec = from_float of the activation row, then vec_dot row by row (what
 * ggml's MUL_MAT does for one activation row: these types have nrows 1 and no repacked layout
 * in llama.cpp 0.3.36, ggml-cpu/repack.cpp). pyggml side: pg_matvec (the activation row quantized
 * once, then decode's kernels: vec_dot8 eight rows at a time). Both get identical block bytes
 * (the GGUF layouts are the same): random codes with each block's fp16 d = 1/16 (IQ1_M: in its
 * scale words), as tools/bench_kernels.py makes them; the results are checked against each
 * other (they differ only by fp32 rounding order).
 *
 *   DRAM:  copies of the matrix cycled over >= 256 MiB; each run is one pass over all copies,
 *          paired with a read probe (pg_bench_read) of the same bytes right before it; GB/s of
 *          weights read and "of bw" = probe time / kernel time, medians of RUNS runs; the two
 *          libraries alternate run by run.
 *   cache: 4096 x 256 weights (well inside the 1 MiB L2), the best of TRIALS matvecs by the
 *          thread's CPU clock (robust to other processes), alternating.
 *
 * Build, against the llama.cpp build llama-bench uses (static, -march=native):
 *   LC=/work/main/build/llamacpp-tools/ggml/src
 *   gcc -O2 -I$LLAMA/ggml/include -Inative/include tools/bench_llamacpp_vecdot.c \
 *       $LC/libggml-cpu.a $LC/libggml-base.a -Lbuild/native -lpyggml -Wl,-rpath,$PWD/build/native \
 *       -lstdc++ -lgomp -lm -o /tmp/blv
 * or against llama-cpp-python's shared libraries (-L.../llama_cpp/lib -lggml-cpu -lggml-base
 * -Wl,-rpath,...). Run: /tmp/blv [types] (default iq2_xxs,iq2_xs,iq2_s,iq3_xxs,iq3_s,iq1_s,
 * iq1_m,q4_k); env RUNS (5), TRIALS (200), PYGGML_CPU_PATH. */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ggml-cpu.h"
#include "ggml.h"
#include "pyggml.h"

static const struct { const char *name; int type; } k_types[] = {
    {"iq2_xxs", GGML_TYPE_IQ2_XXS}, {"iq2_xs", GGML_TYPE_IQ2_XS}, {"iq2_s", GGML_TYPE_IQ2_S},
    {"iq3_xxs", GGML_TYPE_IQ3_XXS}, {"iq3_s", GGML_TYPE_IQ3_S}, {"iq1_s", GGML_TYPE_IQ1_S},
    {"iq1_m", GGML_TYPE_IQ1_M}, {"iq4_xs", GGML_TYPE_IQ4_XS}, {"iq4_nl", GGML_TYPE_IQ4_NL},
    {"q4_k", GGML_TYPE_Q4_K}, {"q4_0", GGML_TYPE_Q4_0}, {"q2_k", GGML_TYPE_Q2_K},
    {"q3_k", GGML_TYPE_Q3_K},
};

static double wall(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double cpu(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng = 88172645463325252ull;
static uint64_t next(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return rng;
}

/* one row of nb blocks: quantized from data where pyggml can, else random codes, d = 1/16 */
static void fill_row(int type, uint8_t *w, const float *x, int64_t k) {
    const size_t bs = ggml_type_size(type), nb = (size_t)(k / ggml_blck_size(type));
    if (pg_quantize_row(type, x, w, k) == PG_OK) return;
    for (size_t b = 0; b < nb * bs; b++) w[b] = (uint8_t)next();
    for (size_t b = 0; b < nb; b++) {
        uint8_t *blk = w + b * bs;
        if (type == GGML_TYPE_IQ1_M) {
            /* fp16 d = 0x2C00 in the top nibbles of the four scale words (bytes 48..55) */
            static const uint8_t nib[4] = {0x0, 0x0, 0xC, 0x2};
            for (int i = 0; i < 4; i++) blk[48 + 2 * i + 1] = (uint8_t)((blk[48 + 2 * i + 1] & 0x0F) | nib[i] << 4);
        } else {
            blk[0] = 0x00;
            blk[1] = 0x2C;
        }
    }
}

typedef struct {
    int type;
    int64_t k, n;
    size_t rb;
    const struct ggml_type_traits_cpu *tr;
    void *act;        /* llama.cpp's activation row (vec_dot_type) */
    void *scratch;    /* pyggml's */
    size_t scratch_size;
} ctx;

static void llama_matvec(const ctx *c, const uint8_t *w, const float *x, float *out) {
    const struct ggml_type_traits_cpu *vt = ggml_get_type_traits_cpu(c->tr->vec_dot_type);
    vt->from_float(x, c->act, c->k);
    for (int64_t r = 0; r < c->n; r++)
        c->tr->vec_dot((int)c->k, out + r, 0, w + (size_t)r * c->rb, 0, c->act, 0, 1);
}

static void pg_matvec_(const ctx *c, const uint8_t *w, const float *x, float *out) {
    if (pg_matvec(c->type, c->k, c->n, w, c->rb, x, out, c->scratch, c->scratch_size) != PG_OK) {
        fprintf(stderr, "pg_matvec failed for type %d\n", c->type);
        exit(1);
    }
}

static int cmp_d(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof(double), cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv) {
    const char *types = argc > 1 ? argv[1] : "iq2_xxs,iq2_xs,iq2_s,iq3_xxs,iq3_s,iq1_s,iq1_m,q4_k";
    const int runs = getenv("RUNS") ? atoi(getenv("RUNS")) : 5;
    const int trials = getenv("TRIALS") ? atoi(getenv("TRIALS")) : 200;
    const int64_t K = 4096, N = 4096, NC = 256;   /* NC: rows of the in-cache matrix */
    const size_t min_bytes = (size_t)256 << 20;
    ggml_cpu_init();
    static const char *paths[] = {"scalar", "avx2", "avx512", "neon", "amx"};
    double l[3];
    if (getloadavg(l, 3) != 3) l[0] = l[1] = l[2] = -1;
    printf("pyggml path %s; matvec %lld x %lld, 1 thread; DRAM: median of %d runs over >= 256 MiB; "
           "cache: %lld x %lld, best of %d; load %.2f %.2f %.2f\n",
           paths[pg_cpu_path()], (long long)N, (long long)K, runs, (long long)NC, (long long)K,
           trials, l[0], l[1], l[2]);
    printf("%-8s %8s %8s %6s %6s %8s | %8s %8s %6s\n", "type", "llama", "pyggml", "llama", "pyggml",
           "pg/llama", "llama", "pyggml", "pg/ll");
    printf("%-8s %8s %8s %6s %6s %8s | %8s %8s %6s\n", "", "GB/s", "GB/s", "of bw", "of bw", "",
           "GB/s $", "GB/s $", "");
    float *x = malloc(sizeof(float) * K), *wf = malloc(sizeof(float) * K);
    float *o1 = malloc(sizeof(float) * N), *o2 = malloc(sizeof(float) * N);
    for (int64_t i = 0; i < K; i++) x[i] = (float)((double)(next() >> 11) / 9007199254740992.0 - 0.5);
    for (size_t it = 0; it < sizeof(k_types) / sizeof(k_types[0]); it++) {
        char want[32], have[512];
        snprintf(want, sizeof want, ",%s,", k_types[it].name);
        snprintf(have, sizeof have, ",%s,", types);
        if (!strstr(have, want)) continue;
        ctx c = {.type = k_types[it].type, .k = K, .n = N};
        c.tr = ggml_get_type_traits_cpu(c.type);
        c.rb = ggml_row_size(c.type, K);
        c.act = malloc(ggml_row_size(c.tr->vec_dot_type, K));
        c.scratch_size = pg_matvec_scratch_size(c.type, K);
        c.scratch = malloc(c.scratch_size);
        const size_t mbytes = c.rb * (size_t)N;
        const size_t copies = (min_bytes + mbytes - 1) / mbytes;
        uint8_t *w = aligned_alloc(64, (mbytes * copies + 63) & ~(size_t)63);
        for (int64_t r = 0; r < N; r++) {
            for (int64_t i = 0; i < K; i++)
                wf[i] = (float)((double)(next() >> 11) / 9007199254740992.0 - 0.5);
            fill_row(c.type, w + (size_t)r * c.rb, wf, K);
        }
        for (size_t cp = 1; cp < copies; cp++) memcpy(w + cp * mbytes, w, mbytes);
        /* the two libraries compute the same products (up to fp32 rounding order) */
        llama_matvec(&c, w, x, o1);
        pg_matvec_(&c, w, x, o2);
        double err = 0, mag = 0;
        for (int64_t r = 0; r < N; r++) {
            err = fmax(err, fabs((double)o1[r] - o2[r]));
            mag = fmax(mag, fabs((double)o1[r]));
        }
        if (err > 1e-3 * mag + 1e-6) {
            fprintf(stderr, "%s: llama.cpp and pyggml differ (max |diff| %g, max |y| %g)\n",
                    k_types[it].name, err, mag);
            return 1;
        }
        double *gl = malloc(sizeof(double) * runs), *gp = malloc(sizeof(double) * runs);
        double *rl = malloc(sizeof(double) * runs), *rp = malloc(sizeof(double) * runs);
        for (int run = 0; run < runs; run++) {
            for (int side = 0; side < 2; side++) {
                double t0 = wall();
                volatile uint64_t sink = pg_bench_read(w, mbytes * copies);
                (void)sink;
                const double tr = wall() - t0;
                t0 = wall();
                for (size_t cp = 0; cp < copies; cp++) {
                    if (side == 0) llama_matvec(&c, w + cp * mbytes, x, o1);
                    else pg_matvec_(&c, w + cp * mbytes, x, o2);
                }
                const double tk = wall() - t0;
                (side == 0 ? gl : gp)[run] = (double)(mbytes * copies) / tk / 1e9;
                (side == 0 ? rl : rp)[run] = tr / tk;
            }
        }
        /* in cache: NC rows of the first copy, the best trial */
        ctx cc = c;
        cc.n = NC;
        double bl = 1e9, bp = 1e9;
        for (int t = 0; t < trials; t++) {
            double t0 = cpu();
            llama_matvec(&cc, w, x, o1);
            double dt = cpu() - t0;
            if (dt < bl) bl = dt;
            t0 = cpu();
            pg_matvec_(&cc, w, x, o2);
            dt = cpu() - t0;
            if (dt < bp) bp = dt;
        }
        const double cb = (double)(c.rb * (size_t)NC);
        const double ml = median(gl, runs), mp = median(gp, runs);
        printf("%-8s %8.2f %8.2f %5.0f%% %5.0f%% %8.2f | %8.2f %8.2f %6.2f\n", k_types[it].name,
               ml, mp, 100 * median(rl, runs), 100 * median(rp, runs), mp / ml, cb / bl / 1e9,
               cb / bp / 1e9, bl / bp);
        fflush(stdout);
        free(gl); free(gp); free(rl); free(rp);
        free(w); free(c.act); free(c.scratch);
    }
    if (getloadavg(l, 3) == 3) printf("load at end %.2f %.2f %.2f\n", l[0], l[1], l[2]);
    return 0;
}
