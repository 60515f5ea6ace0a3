/* The AMX tile gemm (gemm_amx.c) against the scalar vec_dot, bit for bit (memcmp): random
 * weight blocks (every byte value, so every level, scale and min), the extreme blocks (every
 * level and scale at its largest magnitude, with activations at ±127: the int32 plane sums at
 * their largest), odd N and M (padded weight blocks and activation tiles), nothing written
 * outside the N × M outputs. On a CPU without AMX the path must be refused. */
#if defined(__x86_64__)
#include <stdlib.h>
#include <string.h>

#include "amx.h"
#include "fp16.h"
#include "kquants.h"
#include "pg_test.h"
#include "pyggml.h"
#include "quants.h"

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) { return pg_test_splitmix(&g_rng); }
static float rndf(void) { return pg_test_unit(rnd()); }   /* uniform in [-1, 1) */

static void set_h(uint8_t *p, float v) { const pg_fp16 h = pg_fp32_to_fp16(v); memcpy(p, &h, 2); }

/* fp16 fields of a block: d at d_off, dmin at m_off (-1: none) */
static void fields(int32_t type, int *d_off, int *m_off) {
    *d_off = type == PG_TYPE_Q6_K ? 208 : 0;
    *m_off = type == PG_TYPE_Q6_K ? -1 : 2;
}

/* mode 0: random bytes; 1: every byte 0xFF; 2: every byte 0 except Q6_K's scales = −128 */
static void weight_rows(int32_t type, uint8_t *w, int64_t N, int64_t K, int mode) {
    const pg_type_traits *t = pg_get_type_traits_for_path(type, PG_PATH_SCALAR);
    const int64_t nb = N * K / PG_QK_K;
    int d_off, m_off;
    fields(type, &d_off, &m_off);
    for (int64_t i = 0; i < nb * t->type_size; i++)
        w[i] = mode == 0 ? (uint8_t)rnd() : mode == 1 ? 0xFF : 0;
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *blk = w + b * t->type_size;
        if (mode == 2 && type == PG_TYPE_Q6_K) memset(blk + 192, 0x80, 16);
        set_h(blk + d_off, mode == 0 ? rndf() * 0.05f : 0.01f);
        if (m_off >= 0) set_h(blk + m_off, mode == 0 ? rndf() * 0.05f : 0.01f);
    }
}

static void run_case(int32_t type, int64_t K, int64_t N, int64_t M, int mode) {
    const pg_type_traits *amx = pg_get_type_traits_for_path(type, PG_PATH_AMX);
    const pg_type_traits *ref = pg_get_type_traits_for_path(type, PG_PATH_SCALAR);
    const pg_type_traits *q8 = pg_get_type_traits_for_path(PG_TYPE_Q8_K, PG_PATH_AMX);
    const size_t rb = (size_t)(K / PG_QK_K) * ref->type_size, yb = (size_t)(K / PG_QK_K) * 292;
    const int64_t tiles = (M + PG_AMX_TILE_ROWS - 1) / PG_AMX_TILE_ROWS;
    const int64_t ld = N + 3;   /* output rows with 3 floats of canary after the N outputs */
    uint8_t *w = malloc(rb * (size_t)N), *y = malloc(yb * (size_t)M);
    float *x = malloc(sizeof(float) * (size_t)(K * M));
    uint8_t *act = aligned_alloc(64, ((size_t)tiles * pg_amx_act_tile_bytes(K) + 63) / 64 * 64);
    void *scratch = malloc(pg_amx_scratch_bytes(K));
    float *got = malloc(sizeof(float) * (size_t)(ld * M + 3));
    weight_rows(type, w, N, K, mode);
    for (int64_t i = 0; i < K * M; i++)
        x[i] = mode == 0 ? (rnd() % 16 == 0 ? 0.0f : rndf() * 3.0f) : mode == 1 ? 1.0f : -1.0f;
    for (int64_t a = 0; a < tiles; a++) {
        const int64_t m0 = a * PG_AMX_TILE_ROWS;
        const int nr = (int)(M - m0 < PG_AMX_TILE_ROWS ? M - m0 : PG_AMX_TILE_ROWS);
        pg_amx_pack_act(q8->from_float, (const char *)(x + m0 * K), sizeof(float) * (size_t)K,
                        K, nr, act + (size_t)a * pg_amx_act_tile_bytes(K), scratch);
    }
    for (int64_t i = 0; i < ld * M + 3; i++) got[i] = -7.25f;
    amx->amx_gemm(K, w, rb, N, act, M, got, sizeof(float) * (size_t)ld, scratch);
    int same = 1, inside = 1;
    for (int64_t m = 0; m < M; m++) {
        q8->from_float(x + m * K, y + (size_t)m * yb, K);
        for (int64_t i = 0; i < N; i++) {
            float want;
            ref->vec_dot(K, &want, w + (size_t)i * rb, y + (size_t)m * yb);
            same &= memcmp(&want, &got[m * ld + i], 4) == 0;
        }
        for (int64_t i = N; i < ld; i++) inside &= got[m * ld + i] == -7.25f;
    }
    for (int64_t i = ld * M; i < ld * M + 3; i++) inside &= got[i] == -7.25f;
    CHECK(same, "type %d K %lld N %lld M %lld mode %d: differs from the scalar vec_dot",
          (int)type, (long long)K, (long long)N, (long long)M, mode);
    CHECK(inside, "type %d N %lld M %lld: wrote outside the outputs", (int)type, (long long)N,
          (long long)M);
    free(w);
    free(y);
    free(x);
    free(act);
    free(scratch);
    free(got);
}

PG_TEST(test_amx_gemm_bits_equal_scalar) {
    const int32_t was = pg_cpu_path();
    if (pg_set_cpu_path(PG_PATH_AMX) != PG_OK) {
        CHECK(!(pg_cpu_features() & PG_CPU_AMXINT8) ||
                  !(pg_cpu_features() & PG_CPU_AVX512VNNI),
              "the CPU has AMX but the amx path is refused");
        fprintf(stderr, "  (no AMX on this CPU: the amx path is refused, as it must be)\n");
        return;
    }
    pg_set_cpu_path(was);
    static const int32_t types[] = {PG_TYPE_Q4_K, PG_TYPE_Q5_K, PG_TYPE_Q6_K};
    static const int64_t Ns[] = {1, 16, 17, 45}, Ms[] = {1, 8, 16, 31}, Ks[] = {256, 1792};
    for (int it = 0; it < 3; it++) {
        CHECK(pg_get_type_traits_for_path(types[it], PG_PATH_AMX)->amx_gemm != NULL,
              "type %d: no AMX kernel", (int)types[it]);
        CHECK(pg_get_type_traits_for_path(types[it], PG_PATH_AVX512)->amx_gemm == NULL,
              "type %d: an AMX kernel outside the amx path", (int)types[it]);
        for (int ik = 0; ik < 2; ik++)
            for (int in = 0; in < 4; in++)
                for (int im = 0; im < 4; im++) run_case(types[it], Ks[ik], Ns[in], Ms[im], 0);
        run_case(types[it], 768, 33, 20, 1);
        run_case(types[it], 768, 33, 20, 2);
    }
}
#endif
