/* The repacked 16-row tiles of prompt-sized MUL_MATs (pg_type_traits.tile_pack / tile_gemm,
 * gemm_tile*.c), on every path this CPU runs that has them:
 *   - every result has the scalar vec_dot's bits (memcmp), for every type with a tile (the
 *     K-quants, Q4_0, Q5_0, Q8_0, IQ4_XS, IQ4_NL, MXFP4), rows of 1, 2 and 7 super-blocks (legacy: 1, 2, 7, 33
 *     blocks), 1..16 weight rows, 1..19 activation rows (the kernels' 4- and 8-row passes and
 *     their tails), padded row strides;
 *   - all-ones scales with small integer levels: every term exact, which pins the integer sums
 *     (the −128 activations and the largest levels included);
 *   - nothing is written outside the nr outputs of each activation row;
 *   - MUL_MAT with enough activation rows to take the tiles, 1 and 2 threads, N not a multiple
 *     of 16, K not a multiple of 256 (legacy types): every row equals that row alone (decode's
 *     kernel), and nothing is written past the planned work buffer. */
#include <stdlib.h>
#include <string.h>

#include "fp16.h"
#include "kquants.h"
#include "ops.h"
#include "pg_test.h"
#include "pyggml.h"
#include "quants.h"

static uint64_t g_rng = 0x13198A2E03707344ull;
static uint64_t rnd(void) { return pg_test_splitmix(&g_rng); }
static float rndf(void) { return pg_test_unit(rnd()); }

static const int32_t k_types[] = {PG_TYPE_Q2_K,   PG_TYPE_Q3_K,   PG_TYPE_Q4_K, PG_TYPE_Q5_K,
                                  PG_TYPE_Q6_K,   PG_TYPE_Q4_0,   PG_TYPE_Q5_0, PG_TYPE_Q8_0,
                                  PG_TYPE_IQ4_XS, PG_TYPE_IQ4_NL, PG_TYPE_MXFP4};
#define N_TYPES ((int)(sizeof(k_types) / sizeof(k_types[0])))

static const pg_type_traits *scalar_tr(int32_t type) {
    return pg_get_type_traits_for_path(type, PG_PATH_SCALAR);
}

/* byte offsets of the fp16 fields d and dmin (-1: none) in a block */
static void fp16_fields(int32_t type, int *d_off, int *m_off) {
    *d_off = type == PG_TYPE_MXFP4 ? -1 : 0;
    *m_off = -1;
    if (type == PG_TYPE_Q2_K) { *d_off = 80; *m_off = 82; }
    else if (type == PG_TYPE_Q3_K) *d_off = 108;
    else if (type == PG_TYPE_Q6_K) *d_off = 208;
    else if (type == PG_TYPE_Q4_K || type == PG_TYPE_Q5_K) *m_off = 2;
}

static void set_h(uint8_t *p, float v) { const pg_fp16 h = pg_fp32_to_fp16(v); memcpy(p, &h, 2); }

/* a weight row of nb blocks: random bytes (every level and scale pattern), finite fp16 fields
 * (exact: all 1) */
static void weight_row(int32_t type, uint8_t *w, int nb, int exact) {
    const int ts = scalar_tr(type)->type_size;
    int d_off, m_off;
    fp16_fields(type, &d_off, &m_off);
    for (int i = 0; i < nb * ts; i++) w[i] = (uint8_t)rnd();
    for (int b = 0; b < nb; b++) {
        if (d_off >= 0) set_h(w + b * ts + d_off, exact ? 1.0f : rndf() * 0.05f);
        /* MXFP4's E8M0 scale 2^(e − 128): 1 (exact), else 2^-10..2^5 and now and then the
         * subnormal e 0, 1 */
        if (type == PG_TYPE_MXFP4)
            w[b * ts] = (uint8_t)(exact ? 128 : rnd() % 8 == 0 ? rnd() % 2 : 118 + rnd() % 16);
        if (m_off >= 0) set_h(w + b * ts + m_off, exact ? 1.0f : rndf() * 0.05f);
    }
}

/* an activation row of n elements in vec_dot_type vt (Q8_K or Q8_0): the quantizer on random
 * floats, or (exact) d = 1 with levels in {−128, −2..2, 127} (and their bsums) */
static void act_row(int32_t vt, uint8_t *y, int64_t n, int exact) {
    if (!exact) {
        float x[7 * PG_QK_K];
        const float scale = (float)(1 << (rnd() % 6));
        for (int64_t i = 0; i < n; i++) x[i] = rnd() % 16 == 0 ? 0.0f : rndf() * scale;
        scalar_tr(vt)->from_float_ref(x, y, n);
        return;
    }
    const int bs = scalar_tr(vt)->block_size, ts = scalar_tr(vt)->type_size;
    for (int64_t b = 0; b < n / bs; b++) {
        uint8_t *blk = y + b * ts;
        int8_t *qs = (int8_t *)(blk + (vt == PG_TYPE_Q8_K ? 4 : 2));
        for (int e = 0; e < bs; e++) {
            const int r = (int)(rnd() % 16);
            qs[e] = (int8_t)(r == 0 ? -128 : r == 1 ? 127 : (int)(rnd() % 5) - 2);
        }
        if (vt != PG_TYPE_Q8_K) {
            set_h(blk, 1.0f);
            continue;
        }
        pg_block_q8_K *a = (pg_block_q8_K *)blk;
        a->d = 1.0f;
        for (int g = 0; g < 16; g++) {
            int sum = 0;
            for (int e = 0; e < 16; e++) sum += a->qs[16 * g + e];
            a->bsums[g] = (int16_t)sum;
        }
    }
}

enum { MAXN = 16, MAXM = 19, OUTS = 19 /* output row stride (floats): 16 dots and 3 guards */ };

PG_TEST(test_tile_gemm_bits_and_bounds) {
    static const int counts[] = {1, 2, 7, 33};
    static const int nrs[] = {1, 5, 15, 16};
    static const int ncs[] = {1, 3, 4, 5, 8, 9, 16, 19};
    const float guard = -12345.678f;
    int tested = 0;
    for (int32_t path = PG_PATH_SCALAR; path < PG_PATH_COUNT; path++) {
        if (!pg_path_compiled(path)) continue;
        for (int it = 0; it < N_TYPES; it++) {
            const int32_t type = k_types[it];
            const pg_type_traits *tr = pg_get_type_traits_for_path(type, path);
            if (!tr->tile_pack) continue;
            CHECK(tr->tile_gemm != NULL, "path %d type %d: tile_pack without tile_gemm",
                  (int)path, (int)type);
            const int ts = tr->type_size, bsz = tr->block_size;
            const int32_t vt = tr->vec_dot_type;
            for (int ic = 0; ic < (bsz == PG_QK_K ? 3 : 4); ic++)
                for (int exact = 0; exact < 2; exact++) {
                    const int nb = counts[ic];
                    const int64_t n = (int64_t)nb * bsz;
                    const size_t bx = (size_t)nb * ts + 12;
                    const size_t by = pg_type_row_size(vt, n) + 8;
                    uint8_t *w = malloc(bx * MAXN), *y = malloc(by * MAXM);
                    void *tile = malloc((size_t)(n / 256 + 1) * PG_TILE_SB_BYTES);
                    float out[MAXM * OUTS], want[MAXM][MAXN];
                    for (int i = 0; i < MAXN; i++) weight_row(type, w + i * bx, nb, exact);
                    for (int j = 0; j < MAXM; j++) act_row(vt, y + j * by, n, exact);
                    for (int j = 0; j < MAXM; j++)
                        for (int i = 0; i < MAXN; i++)
                            scalar_tr(type)->vec_dot(n, &want[j][i], w + i * bx, y + j * by);
                    for (int ir = 0; ir < 4; ir++)
                        for (int jc = 0; jc < 8; jc++) {
                            const int nr = nrs[ir], nc = ncs[jc];
                            for (int k = 0; k < MAXM * OUTS; k++) out[k] = guard;
                            tr->tile_pack(n, w, bx, nr, tile);
                            tr->tile_gemm(n, tile, y, by, nc, out, OUTS * sizeof(float), nr);
                            int same = 1, clean = 1;
                            for (int j = 0; j < MAXM; j++)
                                for (int k = 0; k < OUTS; k++) {
                                    const float v = out[j * OUTS + k];
                                    if (j < nc && k < nr) same &= memcmp(&v, &want[j][k], 4) == 0;
                                    else clean &= v == guard;
                                }
                            CHECK(same, "path %d type %d nb=%d nr=%d nc=%d exact=%d: a dot "
                                  "differs from the scalar vec_dot", (int)path, (int)type, nb, nr,
                                  nc, exact);
                            CHECK(clean, "path %d type %d nb=%d nr=%d nc=%d: written outside",
                                  (int)path, (int)type, nb, nr, nc);
                            tested++;
                        }
                    free(w);
                    free(y);
                    free(tile);
                }
        }
    }
#if defined(__x86_64__)
    /* with VNNI the avx512 path has a tile for every type listed here */
    if (pg_cpu_features() & PG_CPU_AVX512VNNI)
        for (int it = 0; it < N_TYPES; it++)
            CHECK(pg_get_type_traits_for_path(k_types[it], PG_PATH_AVX512)->tile_pack != NULL,
                  "type %d: no tile on the avx512 path of a CPU with AVX512-VNNI",
                  (int)k_types[it]);
    /* AVX2 has them for all but Q8_0 (the gemm is as fast there) */
    if (pg_path_compiled(PG_PATH_AVX2))
        for (int it = 0; it < N_TYPES; it++)
            CHECK(k_types[it] == PG_TYPE_Q8_0 ||
                      pg_get_type_traits_for_path(k_types[it], PG_PATH_AVX2)->tile_pack != NULL,
                  "type %d: no tile on the avx2 path", (int)k_types[it]);
#endif
}

static void mm_tensor(pg_tensor *t, int32_t type, int32_t op, int64_t ne0, int64_t ne1,
                      void *data) {
    memset(t, 0, sizeof(*t));
    t->type = type;
    t->op = op;
    t->ne[0] = ne0; t->ne[1] = ne1; t->ne[2] = 1; t->ne[3] = 1;
    t->nb[0] = scalar_tr(type)->type_size;
    t->nb[1] = (int64_t)pg_type_row_size(type, ne0);
    t->nb[2] = t->nb[1] * ne1; t->nb[3] = t->nb[2];
    for (int k = 0; k < PG_MAX_SRC; k++) t->src[k] = -1;
    t->data = data;
}

static int mul_mat(pg_threadpool *tp, int nth, int32_t type, int64_t K, int64_t N, int64_t M,
                   void *w, float *x, float *dst) {
    pg_tensor t[3];
    mm_tensor(&t[0], type, PG_OP_NONE, K, N, w);
    mm_tensor(&t[1], PG_TYPE_F32, PG_OP_NONE, K, M, x);
    mm_tensor(&t[2], PG_TYPE_F32, PG_OP_MUL_MAT, N, M, dst);
    t[2].src[0] = 0;
    t[2].src[1] = 1;
    const int32_t order[1] = {2};
    size_t ws = 0;
    int32_t bad = 0;
    if (pg_graph_work_size(t, 3, order, 1, nth, &ws) != PG_OK) return 0;
    uint8_t *work = malloc(ws + 64), canary[64];
    memset(canary, 0xA5, sizeof canary);
    memcpy(work + ws, canary, sizeof canary);   /* the bytes after the planned work buffer */
    const int ok = pg_graph_compute(t, 3, order, 1, tp, nth, work, ws, NULL, NULL, &bad) == PG_OK;
    CHECK(memcmp(work + ws, canary, sizeof canary) == 0, "written past the work buffer (%zu B)",
          ws);
    free(work);
    return ok;
}

/* a batch large enough for the tiles, N = 37 (two full tiles and a tail of 5; uneven split
 * between 2 threads): each row equals the row alone, on every path */
PG_TEST(test_tile_mul_mat_row_independent_of_batch) {
    /* K: whole super-blocks for the K-quants, 20 blocks of 32 for the legacy types (Gemma's 640:
     * not a multiple of 256, the tile's size rounds up) */
    enum { KMAX = 640, N = 37, M = 45 };
    pg_threadpool *tp = pg_threadpool_new(2);
    CHECK(tp != NULL, "thread pool");
    const int32_t cur = pg_cpu_path();
    float *x = malloc(sizeof(float) * KMAX * M), *batch = malloc(sizeof(float) * N * M);
    float alone[N];
    uint8_t *w = malloc((size_t)N * 34 * (KMAX / 32));   /* the largest row: Q8_0 */
    for (int32_t path = PG_PATH_SCALAR; path < PG_PATH_COUNT; path++) {
        if (!pg_path_compiled(path) || pg_set_cpu_path(path) != PG_OK) continue;
        for (int it = 0; it < N_TYPES; it++) {
            const int32_t type = k_types[it];
            const int64_t K = scalar_tr(type)->block_size == PG_QK_K ? 512 : KMAX;
            const size_t rb = pg_type_row_size(type, K);
            for (int i = 0; i < N; i++)
                weight_row(type, w + i * rb, K / scalar_tr(type)->block_size, 0);
            for (int i = 0; i < K * M; i++) x[i] = rnd() % 16 == 0 ? 0.0f : rndf() * 3.0f;
            for (int nth = 1; nth <= 2; nth++) {
                CHECK(mul_mat(tp, nth, type, K, N, M, w, x, batch), "mul_mat");
                int same = 1;
                for (int m = 0; m < M; m++) {
                    CHECK(mul_mat(tp, 1, type, K, N, 1, w, x + m * K, alone), "mul_mat 1");
                    same &= memcmp(alone, batch + m * N, sizeof alone) == 0;
                }
                CHECK(same, "path %d type %d M=%d %d threads: a row differs from the row alone",
                      (int)path, (int)type, M, nth);
            }
        }
    }
    pg_set_cpu_path(cur);
    pg_threadpool_free(tp);
    free(x);
    free(batch);
    free(w);
}
