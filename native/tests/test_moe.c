/* MUL_MAT_ID through the graph executor: every entry's row equals, bit for bit, the MUL_MAT of
 * its expert with the same activations (both convert activations with the same quantizer and
 * use the same dot: gemm for several rows, vec_dot for one); 1, 2 and 3 threads agree; strided
 * ids; an id outside the experts fails the graph naming the node and leaves a zero row. Run by
 * `make test-native` on the best path and on the forced scalar path, and under ASan. */
#include <stdlib.h>
#include <string.h>

#include "gemm_tile.h"
#include "pg_test.h"
#include "pyggml.h"
#include "ops.h"

enum { MK = 256, MN = 19, N_AS = 5, N_IDS = 3, N_TOK = 6, IDS_LD = 5 };

static void init(pg_tensor *t, int32_t type, int32_t op, const int64_t ne[4], void *data) {
    memset(t, 0, sizeof(*t));
    t->type = type;
    t->op = op;
    memcpy(t->ne, ne, sizeof(t->ne));
    t->nb[0] = pg_type_size(type);
    t->nb[1] = t->nb[0] * (ne[0] / pg_type_block_size(type));
    t->nb[2] = t->nb[1] * ne[1];
    t->nb[3] = t->nb[2] * ne[2];
    for (int k = 0; k < PG_MAX_SRC; k++) t->src[k] = -1;
    t->data = data;
}

/* out = mul_mat_id(w, x, ids) with n_threads; returns the status */
static int32_t run_mmid_tok(int32_t type, void *w, float *x, int32_t *ids, float *out,
                            pg_threadpool *tp, int n_threads, int32_t *bad, int64_t n_tok) {
    pg_tensor t[4];
    init(&t[0], type, PG_OP_NONE, (int64_t[4]){MK, MN, N_AS, 1}, w);
    init(&t[1], PG_TYPE_F32, PG_OP_NONE, (int64_t[4]){MK, 1, n_tok, 1}, x);
    init(&t[2], PG_TYPE_I32, PG_OP_NONE, (int64_t[4]){N_IDS, n_tok, 1, 1}, ids);
    t[2].nb[1] = IDS_LD * 4;                                /* a view of the first N_IDS columns */
    t[2].nb[2] = t[2].nb[3] = IDS_LD * 4 * n_tok;
    init(&t[3], PG_TYPE_F32, PG_OP_MUL_MAT_ID, (int64_t[4]){MN, N_IDS, n_tok, 1}, out);
    t[3].src[0] = 0; t[3].src[1] = 1; t[3].src[2] = 2;
    const int32_t order[1] = {3};
    size_t ws = 0;
    const int32_t st = pg_graph_work_size(t, 4, order, 1, 3, &ws);
    if (st != PG_OK) return st;
    void *work = malloc(ws);
    const int32_t r = pg_graph_compute(t, 4, order, 1, tp, n_threads, work, ws, NULL, NULL, bad);
    free(work);
    return r;
}

static int32_t run_mmid(int32_t type, void *w, float *x, int32_t *ids, float *out,
                        pg_threadpool *tp, int n_threads, int32_t *bad) {
    return run_mmid_tok(type, w, x, ids, out, tp, n_threads, bad, N_TOK);
}

/* out [MN, N_TOK] = mul_mat(expert plane, x) */
static int32_t run_mm(int32_t type, const void *plane, float *x, float *out) {
    pg_tensor t[3];
    init(&t[0], type, PG_OP_NONE, (int64_t[4]){MK, MN, 1, 1}, (void *)plane);
    init(&t[1], PG_TYPE_F32, PG_OP_NONE, (int64_t[4]){MK, N_TOK, 1, 1}, x);
    init(&t[2], PG_TYPE_F32, PG_OP_MUL_MAT, (int64_t[4]){MN, N_TOK, 1, 1}, out);
    t[2].src[0] = 0; t[2].src[1] = 1;
    const int32_t order[1] = {2};
    size_t ws = 0;
    int32_t bad;
    if (pg_graph_work_size(t, 3, order, 1, 1, &ws) != PG_OK) return PG_ERR_INTERNAL;
    void *work = malloc(ws + 1);
    const int32_t r = pg_graph_compute(t, 3, order, 1, NULL, 1, work, ws, NULL, NULL, &bad);
    free(work);
    return r;
}

static void check_type(int32_t type) {
    const size_t row = (size_t)(MK / pg_type_block_size(type)) * (size_t)pg_type_size(type);
    const size_t plane = row * MN;
    uint8_t *w = malloc(plane * N_AS);
    static float x[N_TOK * MK], wf[MK], o1[N_TOK * N_IDS * MN], o2[sizeof(o1) / 4],
        o3[sizeof(o1) / 4], ref[N_TOK * MN];
    srand(11);
    for (int r = 0; r < MN * N_AS; r++) {
        for (int k = 0; k < MK; k++) wf[k] = (float)rand() / RAND_MAX - 0.5f;
        CHECK(pg_quantize_row(type, wf, w + (size_t)r * row, MK) == PG_OK, "quantize");
    }
    for (int i = 0; i < N_TOK * MK; i++) x[i] = (float)rand() / RAND_MAX - 0.5f;
    /* experts 0 and 2 have many entries (gemm), expert 4 one entry (vec_dot), 1 and 3 none */
    int32_t ids[N_TOK * IDS_LD];
    for (int i = 0; i < N_TOK * IDS_LD; i++) ids[i] = -7;       /* the unused columns */
    const int32_t pick[N_TOK][N_IDS] = {{0, 2, 0}, {2, 0, 4}, {0, 2, 2}, {2, 0, 0}, {0, 0, 2},
                                        {2, 2, 0}};
    for (int t = 0; t < N_TOK; t++)
        for (int i = 0; i < N_IDS; i++) ids[t * IDS_LD + i] = pick[t][i];

    pg_threadpool *tp = pg_threadpool_new(3);
    int32_t bad = 0;
    CHECK(run_mmid(type, w, x, ids, o1, tp, 1, &bad) == PG_OK, "type %d, 1 thread", type);
    CHECK(run_mmid(type, w, x, ids, o2, tp, 2, &bad) == PG_OK, "2 threads");
    CHECK(run_mmid(type, w, x, ids, o3, tp, 3, &bad) == PG_OK, "3 threads");
    CHECK(memcmp(o1, o2, sizeof(o1)) == 0 && memcmp(o1, o3, sizeof(o1)) == 0,
          "type %d: thread counts differ", type);
    /* experts with several entries: bit-equal to MUL_MAT over all tokens (gemm both) */
    for (int e = 0; e <= 2; e += 2) {
        CHECK(run_mm(type, w + (size_t)e * plane, x, ref) == PG_OK, "mul_mat");
        for (int t = 0; t < N_TOK; t++)
            for (int i = 0; i < N_IDS; i++)
                if (pick[t][i] == e)
                    CHECK(memcmp(&o1[(t * N_IDS + i) * MN], &ref[t * MN], MN * 4) == 0,
                          "type %d expert %d token %d slot %d differs from mul_mat", type, e, t, i);
    }
    {
        /* the one-entry expert: bit-equal to MUL_MAT of that one token (vec_dot both) */
        pg_tensor t[3];
        init(&t[0], type, PG_OP_NONE, (int64_t[4]){MK, MN, 1, 1}, w + 4 * plane);
        init(&t[1], PG_TYPE_F32, PG_OP_NONE, (int64_t[4]){MK, 1, 1, 1}, x + 1 * MK);
        init(&t[2], PG_TYPE_F32, PG_OP_MUL_MAT, (int64_t[4]){MN, 1, 1, 1}, ref);
        t[2].src[0] = 0; t[2].src[1] = 1;
        const int32_t order[1] = {2};
        size_t ws = 0;
        CHECK(pg_graph_work_size(t, 3, order, 1, 1, &ws) == PG_OK, "ws");
        void *work = malloc(ws + 1);
        CHECK(pg_graph_compute(t, 3, order, 1, NULL, 1, work, ws, NULL, NULL, &bad) == PG_OK, "mm1");
        free(work);
        CHECK(memcmp(&o1[(1 * N_IDS + 2) * MN], ref, MN * 4) == 0,
              "type %d: the one-entry expert differs from mul_mat of one row", type);
    }
    /* one token at a time (decode: each thread groups and converts privately): every token's
     * rows have the bits they have among all tokens, with 1, 2 and 3 threads */
    for (int tk = 0; tk < N_TOK; tk++)
        for (int nth = 1; nth <= 3; nth++) {
            float one[N_IDS * MN];
            CHECK(run_mmid_tok(type, w, x + tk * MK, ids + tk * IDS_LD, one, tp, nth, &bad, 1) ==
                      PG_OK, "one token");
            CHECK(memcmp(one, &o1[tk * N_IDS * MN], sizeof(one)) == 0,
                  "type %d token %d alone, %d threads: differs from the batch", type, tk, nth);
        }
    {   /* a bad id in decode: the graph fails naming the node, that slot's row is zero */
        int32_t ids1[IDS_LD] = {2, N_AS + 3, 0, -7, -7};
        float one[N_IDS * MN];
        memset(one, 0x7f, sizeof(one));
        CHECK(run_mmid_tok(type, w, x, ids1, one, tp, 2, &bad, 1) == PG_ERR_INVALID_ARG &&
                  bad == 3, "decode bad id: status, node %d", bad);
        int zero = 1;
        for (int n = 0; n < MN; n++) zero &= one[MN + n] == 0.0f;
        CHECK(zero, "decode: the bad slot's row is not zero");
    }
    /* a bad id: the graph fails naming the node, that entry's row is zero */
    ids[3 * IDS_LD + 1] = N_AS;
    memset(o2, 0x7f, sizeof(o2));
    CHECK(run_mmid(type, w, x, ids, o2, tp, 2, &bad) == PG_ERR_INVALID_ARG && bad == 3,
          "bad id: status, node %d", bad);
    int zero = 1;
    for (int n = 0; n < MN; n++) zero &= o2[(3 * N_IDS + 1) * MN + n] == 0.0f;
    CHECK(zero, "the bad entry's row is not zero");
    CHECK(memcmp(o2, o1, (3 * N_IDS + 1) * MN * 4) == 0, "rows before the bad entry changed");
    pg_threadpool_free(tp);
    free(w);
}

PG_TEST(test_mul_mat_id_equals_mul_mat_per_expert) {
    check_type(PG_TYPE_Q4_0);
    check_type(PG_TYPE_Q8_0);
    check_type(PG_TYPE_Q4_K);
    check_type(PG_TYPE_Q6_K);
}

PG_TEST(test_mul_mat_id_validation) {
    static float x[N_TOK * MK], out[N_TOK * N_IDS * MN];
    static uint8_t w[MK * MN * N_AS * 4];
    int32_t ids[N_TOK * IDS_LD] = {0};
    pg_tensor t[4];
    init(&t[0], PG_TYPE_F32, PG_OP_NONE, (int64_t[4]){MK, MN, N_AS, 1}, w);
    init(&t[1], PG_TYPE_F32, PG_OP_NONE, (int64_t[4]){MK, 1, N_TOK, 1}, x);
    init(&t[2], PG_TYPE_I32, PG_OP_NONE, (int64_t[4]){N_IDS, N_TOK, 1, 1}, ids);
    init(&t[3], PG_TYPE_F32, PG_OP_MUL_MAT_ID, (int64_t[4]){MN, N_IDS, N_TOK, 1}, out);
    t[3].src[0] = 0; t[3].src[1] = 1; t[3].src[2] = 2;
    const int32_t order[1] = {3};
    int32_t bad = -1;
    char reason[128];
    CHECK(pg_graph_validate(t, 4, order, 1, &bad) == PG_OK, "valid graph");
    t[3].src[2] = -1;
    CHECK(pg_graph_validate(t, 4, order, 1, &bad) == PG_ERR_INVALID_ARG && bad == 3, "no ids");
    t[3].src[2] = 2;
    t[2].type = PG_TYPE_F32;
    CHECK(pg_node_supported(t, 4, 3, reason, sizeof(reason)) == PG_ERR_INVALID_ARG &&
          strstr(reason, "I32"), "F32 ids: '%s'", reason);
    t[2].type = PG_TYPE_I32;
    t[3].ne[1] = N_IDS + 1;
    CHECK(pg_node_supported(t, 4, 3, reason, sizeof(reason)) == PG_ERR_INVALID_ARG &&
          strstr(reason, "output shape"), "output shape: '%s'", reason);
    t[3].ne[1] = N_IDS;
    t[1].ne[1] = 2;                                          /* N_IDS % 2 != 0 */
    CHECK(pg_node_supported(t, 4, 3, reason, sizeof(reason)) == PG_ERR_INVALID_ARG, "n_b");
}

/* ---- experts through the repacked tiles ---------------------------------------------------- */

enum { TK_N = 37, TK_AS = 4, TK_IDS = 2, TK_TOK = 48 };

/* out [TK_N, TK_IDS, n_tok] = mul_mat_id(w [K, TK_N, TK_AS], x [K, 1, n_tok], ids) with nth
 * threads; *ws the planned work size; fails the check if anything past it was written */
static int32_t run_tiles(int32_t type, int64_t K, const void *w, const float *x,
                         const int32_t *ids, float *out, pg_threadpool *tp, int nth,
                         int64_t n_tok, size_t *ws) {
    pg_tensor t[4];
    int32_t bad = 0;
    init(&t[0], type, PG_OP_NONE, (int64_t[4]){K, TK_N, TK_AS, 1}, (void *)w);
    init(&t[1], PG_TYPE_F32, PG_OP_NONE, (int64_t[4]){K, 1, n_tok, 1}, (void *)x);
    init(&t[2], PG_TYPE_I32, PG_OP_NONE, (int64_t[4]){TK_IDS, n_tok, 1, 1}, (void *)ids);
    init(&t[3], PG_TYPE_F32, PG_OP_MUL_MAT_ID, (int64_t[4]){TK_N, TK_IDS, n_tok, 1}, out);
    t[3].src[0] = 0; t[3].src[1] = 1; t[3].src[2] = 2;
    const int32_t order[1] = {3};
    const int32_t st = pg_graph_work_size(t, 4, order, 1, nth, ws);
    if (st != PG_OK) return st;
    uint8_t *work = malloc(*ws + 64), canary[64];
    memset(canary, 0xA5, sizeof canary);
    memcpy(work + *ws, canary, sizeof canary);
    const int32_t r = pg_graph_compute(t, 4, order, 1, tp, nth, work, *ws, NULL, NULL, &bad);
    CHECK(memcmp(work + *ws, canary, sizeof canary) == 0, "written past the work buffer");
    free(work);
    return r;
}

/* Prompt-sized MUL_MAT_ID: experts with 49 and 35 entries take the tiles (an expert picked
 * twice by one token included), one with 12 the gemm, one with 1 vec_dot; N = 37 (two tiles and
 * a tail, uneven between threads), K not a multiple of 256 for the block-32 types. On every path
 * this CPU runs, for every type with tiles: 1, 2 and 3 threads agree, and every entry's row has
 * the bits of its token computed alone (decode: one token, vec_dot8) — a row's value depends
 * neither on the batch nor on how many tokens its expert got. */
PG_TEST(test_mul_mat_id_tiles_row_independent_of_batch) {
    static const int32_t types[] = {PG_TYPE_Q2_K,   PG_TYPE_Q3_K,   PG_TYPE_Q4_K, PG_TYPE_Q5_K,
                                    PG_TYPE_Q6_K,   PG_TYPE_Q4_0,   PG_TYPE_Q5_0, PG_TYPE_Q8_0,
                                    PG_TYPE_IQ4_XS, PG_TYPE_IQ4_NL, PG_TYPE_MXFP4};
    enum { KMAX = 640 };
    static float x[TK_TOK * KMAX], wf[KMAX], o1[TK_TOK * TK_IDS * TK_N], o2[sizeof(o1) / 4];
    int32_t ids[TK_TOK * TK_IDS];
    for (int t = 0; t < TK_TOK; t++) {
        ids[t * TK_IDS] = 0;
        ids[t * TK_IDS + 1] = t < 35 ? 1 : t < 47 ? 2 : 0;
    }
    uint8_t *w = malloc((size_t)TK_N * TK_AS * 34 * (KMAX / 32));   /* the largest: Q8_0 */
    pg_threadpool *tp = pg_threadpool_new(3);
    const int32_t cur = pg_cpu_path();
    uint64_t rng = 0x243F6A8885A308D3ull;
    int tiled = 0;
    for (size_t it = 0; it < sizeof(types) / sizeof(types[0]); it++) {
        const int32_t type = types[it];
        const int64_t K = pg_type_block_size(type) == 256 ? 512 : KMAX;
        const size_t row = pg_type_row_size(type, K);
        for (int r = 0; r < TK_N * TK_AS; r++) {
            for (int k = 0; k < K; k++) wf[k] = pg_test_unit(pg_test_splitmix(&rng)) * 0.5f;
            CHECK(pg_quantize_row(type, wf, w + (size_t)r * row, K) == PG_OK, "quantize %d", type);
        }
        for (int i = 0; i < TK_TOK * K; i++) x[i] = pg_test_unit(pg_test_splitmix(&rng)) * 2.0f;
        for (int32_t path = PG_PATH_SCALAR; path < PG_PATH_COUNT; path++) {
            if (!pg_path_compiled(path) || pg_set_cpu_path(path) != PG_OK) continue;
            const pg_type_traits *tr = pg_get_type_traits(type);
            tiled += tr->tile_pack != NULL;
            size_t ws = 0, wsn = 0, ws1 = 0;
            CHECK(run_tiles(type, K, w, x, ids, o1, tp, 1, TK_TOK, &ws) == PG_OK, "1 thread");
            for (int nth = 2; nth <= 3; nth++) {
                CHECK(run_tiles(type, K, w, x, ids, o2, tp, nth, TK_TOK, &wsn) == PG_OK, "batch");
                CHECK(memcmp(o1, o2, sizeof(o1)) == 0, "path %d type %d: %d threads differ",
                      path, type, nth);
                /* each thread's tile scratch is planned, on every path (graphs switch paths),
                 * where some path of this build has the type's tiles (none on aarch64) */
                const size_t tile = pg_tile_type_possible(type) ? pg_tile_scratch_bytes(K) : 0;
                CHECK(wsn - ws == tile * (size_t)(nth - 1),
                      "type %d: %zu B of work for %d threads, %zu for 1", type, wsn, nth, ws);
            }
            int same = 1;
            for (int tk = 0; tk < TK_TOK; tk++) {
                float one[TK_IDS * TK_N];
                CHECK(run_tiles(type, K, w, x + (size_t)tk * K, ids + tk * TK_IDS, one, tp, 2, 1,
                                &ws1) == PG_OK, "one token");
                same &= memcmp(one, &o1[tk * TK_IDS * TK_N], sizeof(one)) == 0;
            }
            CHECK(same, "path %d type %d: a token's rows in the batch differ from the token alone",
                  path, type);
        }
    }
    /* the tiles ran: every type has them on the best path of an AVX-512 VNNI or AVX2 CPU */
#if defined(__x86_64__)
    CHECK(!pg_path_compiled(PG_PATH_AVX2) || tiled > 0, "no path took the tiles");
#endif
    (void)tiled;
    pg_set_cpu_path(cur);
    pg_threadpool_free(tp);
    free(w);
}
