/* IQ4_NL, IQ4_XS, MXFP4 (iquants.h): the scalar reference and every path against it, bit for
 * bit (memcmp of fp32 results):
 *   - to_float of every path equals the scalar one, which is the formula of iquants.h;
 *   - with all scales 1 the dot is the integer dot of the table values (pins the levels);
 *   - vec_dot of every path equals the scalar vec_dot on random data (rows of 1..33 blocks);
 *   - gemm (where a path has one) equals the scalar vec_dot for every nr × nc block shape, and
 *     writes nothing outside the block;
 *   - no kernel reads past a row that ends at an inaccessible page (guard page);
 *   - the quantizers' output dequantizes to within a block scale of the input, and IQ4_XS's
 *     levels are IQ4_NL's table.
 * (Bit-exactness of the quantizers with ggml's and of to_float with the gguf package's:
 * tests/test_quants_iq.py.) */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fp16.h"
#include "iquants.h"
#include "ops.h"
#include "pg_test.h"
#include "pg_test_dot8.h"
#include "pyggml.h"
#include "quants.h"

static uint64_t g_rng = 0x51ED270B4A6C2F11ull;
static uint64_t rnd(void) { return pg_test_splitmix(&g_rng); }
static float rndf(void) { return pg_test_unit(rnd()); }   /* [-1, 1) */

static const int32_t k_types[] = {PG_TYPE_IQ4_NL, PG_TYPE_IQ4_XS, PG_TYPE_MXFP4};
static const char *const k_names[] = {"IQ4_NL", "IQ4_XS", "MXFP4"};
#define NT 3
#define MAXB 33

static const pg_type_traits *str(int32_t t) { return pg_get_type_traits_for_path(t, PG_PATH_SCALAR); }

/* random weight blocks: random codes and scale bytes, fp16 d small and finite; MXFP4 exponents
 * around 2^-6 (some subnormal ones too) */
static void random_weights(int32_t type, uint8_t *buf, int nb) {
    const pg_type_traits *t = str(type);
    for (int i = 0; i < nb * t->type_size; i++) buf[i] = (uint8_t)rnd();
    for (int b = 0; b < nb; b++) {
        uint8_t *blk = buf + (size_t)b * t->type_size;
        if (type == PG_TYPE_MXFP4) {
            blk[0] = (uint8_t)(b % 11 == 5 ? rnd() % 3 : 115 + rnd() % 12);
        } else {
            const pg_fp16 h = pg_fp32_to_fp16(rndf() * 0.01f);
            memcpy(blk, &h, 2);
        }
    }
}

/* activations in the type's vec_dot_type, quantized from random floats */
static void random_act(int32_t type, uint8_t *buf, int64_t n) {
    float x[MAXB * 256];
    for (int64_t i = 0; i < n; i++) x[i] = rndf() * 3.0f;
    str(str(type)->vec_dot_type)->from_float(x, buf, n);
}

static size_t row_bytes(int32_t type, int64_t n) {
    const pg_type_traits *t = str(type);
    return (size_t)(n / t->block_size) * (size_t)t->type_size;
}

PG_TEST(test_iq_traits) {
    for (int it = 0; it < NT; it++) {
        const pg_type_traits *t = str(k_types[it]);
        CHECK(t->to_float && t->vec_dot && t->from_float_ref && t->gemm, "%s: kernels", k_names[it]);
        CHECK(t->vec_dot_type == (k_types[it] == PG_TYPE_IQ4_XS ? PG_TYPE_Q8_K : PG_TYPE_Q8_0),
              "%s: vec_dot_type %d", k_names[it], t->vec_dot_type);
    }
    CHECK(pg_e8m0_half(0) == ldexpf(1.0f, -128) && pg_e8m0_half(1) == ldexpf(1.0f, -127) &&
          pg_e8m0_half(127) == 0.5f && pg_e8m0_half(130) == 4.0f, "e8m0");
}

PG_TEST(test_iq_dequantize_formula) {
    uint8_t w[4 * 136];
    float y[4 * 256];
    for (int it = 0; it < NT; it++) {
        const int32_t type = k_types[it];
        const int bs = str(type)->block_size, ts = str(type)->type_size;
        random_weights(type, w, 4);
        str(type)->to_float(w, y, 4 * bs);
        for (int e = 0; e < 4 * bs; e++) {
            const uint8_t *blk = w + (size_t)(e / bs) * ts;
            const int k = e % bs, sub = k / 32, j = k % 32;
            float want;
            if (type == PG_TYPE_MXFP4) {
                const uint8_t c = j < 16 ? blk[1 + j] & 0xf : blk[1 + j - 16] >> 4;
                want = (float)pg_kv_mxfp4[c] * pg_e8m0_half(blk[0]);
            } else if (type == PG_TYPE_IQ4_NL) {
                const uint8_t c = j < 16 ? blk[2 + j] & 0xf : blk[2 + j - 16] >> 4;
                pg_fp16 h;
                memcpy(&h, blk, 2);
                want = pg_fp16_to_fp32(h) * (float)pg_kv_iq4nl[c];
            } else {
                const pg_block_iq4_xs *x = (const pg_block_iq4_xs *)blk;
                const uint8_t c = j < 16 ? x->qs[16 * sub + j] & 0xf : x->qs[16 * sub + j - 16] >> 4;
                want = (pg_fp16_to_fp32(x->d) * (float)pg_iq4xs_scale(x, sub)) * (float)pg_kv_iq4nl[c];
            }
            CHECK(memcmp(&want, &y[e], 4) == 0, "%s element %d: %g want %g", k_names[it], e,
                  (double)y[e], (double)want);
        }
    }
}

/* every scale 1: the dot is Σ value·a exactly */
PG_TEST(test_iq_integer_dot) {
    uint8_t w[8 * 136], a[8 * 292];
    for (int it = 0; it < NT; it++) {
        const int32_t type = k_types[it];
        const pg_type_traits *t = str(type);
        const int nb = 8, n = nb * t->block_size;
        random_weights(type, w, nb);
        for (int b = 0; b < nb; b++) {
            uint8_t *blk = w + (size_t)b * t->type_size;
            if (type == PG_TYPE_MXFP4) blk[0] = 128;   /* 2^(128-128) = 1 */
            else {
                const pg_fp16 one = pg_fp32_to_fp16(1.0f);
                memcpy(blk, &one, 2);
                if (type == PG_TYPE_IQ4_XS) {   /* every ls = 33: scale 1 */
                    pg_block_iq4_xs *x = (pg_block_iq4_xs *)blk;
                    x->scales_h = 0x5555;
                    memset(x->scales_l, 0x11, 4);
                }
            }
        }
        float f[8 * 256], ya[8 * 256];
        random_act(type, a, n);
        t->to_float(w, f, n);
        str(t->vec_dot_type)->to_float(a, ya, n);
        /* Q8 activations with their scale: Σ f·q8 · d per block, here computed in double */
        double want = 0;
        for (int e = 0; e < n; e++) want += (double)f[e] * ya[e];
        for (int32_t p = 0; p < PG_PATH_COUNT; p++) {
            const pg_type_traits *tp = pg_get_type_traits_for_path(type, p);
            if (!tp || !tp->vec_dot) continue;
            float s;
            tp->vec_dot(n, &s, w, a);
            CHECK(fabs((double)s - want) <= 1e-5 * fabs(want) + 1e-3, "%s path %d: %g want %g",
                  k_names[it], p, (double)s, want);
        }
    }
}

PG_TEST(test_iq_vec_dot_bits_on_every_path) {
    static uint8_t w[MAXB * 136], a[MAXB * 292];
    const int nbs[] = {1, 2, 3, 7, 8, 9, 16, 33};
    int paths = 0;
    for (int32_t p = 1; p < PG_PATH_COUNT; p++) {
        if (!pg_path_compiled(p)) continue;
        paths++;
        for (int it = 0; it < NT; it++) {
            const int32_t type = k_types[it];
            const pg_type_traits *ts = str(type), *tp = pg_get_type_traits_for_path(type, p);
            for (int k = 0; k < 8; k++) {
                int nb = nbs[k];
                if (ts->block_size == 256 && nb > 9) nb = nb / 4;
                const int64_t n = (int64_t)nb * ts->block_size;
                random_weights(type, w, nb);
                random_act(type, a, n);
                float s0, s1, y0[MAXB * 32], y1[MAXB * 32];
                ts->vec_dot(n, &s0, w, a);
                tp->vec_dot(n, &s1, w, a);
                CHECK(memcmp(&s0, &s1, 4) == 0, "%s path %d nb %d: %.9g scalar %.9g",
                      k_names[it], p, nb, (double)s1, (double)s0);
                if (ts->block_size == 32) {
                    ts->to_float(w, y0, n);
                    tp->to_float(w, y1, n);
                    CHECK(memcmp(y0, y1, (size_t)n * 4) == 0, "%s path %d: to_float", k_names[it], p);
                }
            }
        }
    }
    printf("    (iquant SIMD tables tested: %d)\n", paths);
}

PG_TEST(test_iq_gemm_equals_vec_dot) {
    enum { NB = 9, NR = PG_GEMM_MAX_NR, NC = PG_GEMM_MAX_NC };
    static uint8_t w[NR][NB * 136], a[NC][NB * 292];
    for (int32_t p = 0; p < PG_PATH_COUNT; p++) {
        if (!pg_path_compiled(p)) continue;
        for (int it = 0; it < NT; it++) {
            const int32_t type = k_types[it];
            const pg_type_traits *ts = str(type), *tp = pg_get_type_traits_for_path(type, p);
            if (!tp->gemm) continue;
            const int nb = ts->block_size == 256 ? 3 : NB;
            const int64_t n = (int64_t)nb * ts->block_size;
            for (int i = 0; i < NR; i++) random_weights(type, w[i], nb);
            for (int j = 0; j < NC; j++) random_act(type, a[j], n);
            for (int nr = 1; nr <= NR; nr++)
                for (int nc = 1; nc <= NC; nc++) {
                    float out[NC + 1][NR + 1];
                    memset(out, 0x7f, sizeof(out));
                    tp->gemm(n, &out[0][0], sizeof(out[0]), w[0], sizeof(w[0]), a[0], sizeof(a[0]),
                             nr, nc);
                    for (int j = 0; j <= NC; j++)
                        for (int i = 0; i <= NR; i++) {
                            if (i < nr && j < nc) {
                                float s;
                                ts->vec_dot(n, &s, w[i], a[j]);
                                CHECK(memcmp(&s, &out[j][i], 4) == 0, "%s path %d gemm %dx%d [%d][%d]",
                                      k_names[it], p, nr, nc, i, j);
                            } else {
                                uint32_t u;
                                memcpy(&u, &out[j][i], 4);
                                CHECK(u == 0x7f7f7f7fu, "%s path %d gemm %dx%d wrote [%d][%d]",
                                      k_names[it], p, nr, nc, i, j);
                            }
                        }
                }
        }
    }
}

static unsigned char *row_before_guard(size_t bytes, void **map, size_t *map_size) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t data_pages = (bytes + page - 1) / page;
    *map_size = (data_pages + 1) * page;
    unsigned char *m = mmap(NULL, *map_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                            -1, 0);
    if (m == MAP_FAILED) return NULL;
    mprotect(m + data_pages * page, page, PROT_NONE);
    *map = m;
    return m + data_pages * page - bytes;
}

PG_TEST(test_iq_kernels_stay_inside_rows) {
    const int nbs[] = {1, 2, 4, 7, 8, 33};
    for (int32_t p = 0; p < PG_PATH_COUNT; p++) {
        if (!pg_path_compiled(p)) continue;
        for (int it = 0; it < NT; it++) {
            const int32_t type = k_types[it];
            const pg_type_traits *tp = pg_get_type_traits_for_path(type, p);
            for (int k = 0; k < 6; k++) {
                const int nb = str(type)->block_size == 256 ? (nbs[k] + 3) / 4 : nbs[k];
                const int64_t n = (int64_t)nb * str(type)->block_size;
                void *mx, *my;
                size_t sx, sy;
                unsigned char *x = row_before_guard(row_bytes(type, n), &mx, &sx);
                unsigned char *y = row_before_guard(row_bytes(tp->vec_dot_type, n), &my, &sy);
                CHECK(x && y, "mmap failed");
                if (!x || !y) return;
                random_weights(type, x, nb);
                random_act(type, y, n);
                float out[9 * 256], s = 0;
                tp->to_float(x, out, n);
                tp->vec_dot(n, &s, x, y);
                if (tp->gemm) tp->gemm(n, &s, 4, x, 0, y, 0, 1, 1);
                CHECK(s == s, "%s path %d: NaN", k_names[it], p);
                munmap(mx, sx);
                munmap(my, sy);
            }
        }
    }
}

PG_TEST(test_iq_quantize_roundtrip) {
    float x[4 * 256], y[4 * 256];
    uint8_t q[32 * 18];
    for (int it = 0; it < NT; it++) {
        const int32_t type = k_types[it];
        const pg_type_traits *t = str(type);
        for (int mode = 0; mode < 3; mode++) {
            for (int e = 0; e < 1024; e++)
                x[e] = mode == 0 ? rndf() : mode == 1 ? 0.0f : rndf() * (e % 64 < 32 ? 1e-3f : 10.f);
            t->from_float_ref(x, q, 1024);
            t->to_float(q, y, 1024);
            for (int b = 0; b < 32; b++) {
                float amax = 0, err = 0;
                for (int e = 32 * b; e < 32 * b + 32; e++) {
                    amax = fmaxf(amax, fabsf(x[e]));
                    err = fmaxf(err, fabsf(x[e] - y[e]));
                }
                /* the coarsest step: 24/127 of the block max (IQ4), a third of it (MXFP4's 4 → 6
                 * at 2^e): a value is never further from its level than that */
                const float bound = (type == PG_TYPE_MXFP4 ? 0.34f : 0.19f) * amax + 1e-6f;
                CHECK(err <= bound || (type == PG_TYPE_IQ4_XS && mode == 2),
                      "%s mode %d block %d: err %g amax %g", k_names[it], mode, b, (double)err,
                      (double)amax);
            }
        }
    }
}

/* The codebook i-quants (quants_iq_grid.c): every path's to_float and vec_dot have the scalar
 * bits, and no kernel reads past a row ending at a guard page. Random bytes are valid blocks;
 * fp16 d small (IQ1_M: its scale words' top nibbles). */
static const int32_t k_grid[] = {PG_TYPE_IQ2_XXS, PG_TYPE_IQ2_XS, PG_TYPE_IQ2_S, PG_TYPE_IQ3_XXS,
                                 PG_TYPE_IQ3_S, PG_TYPE_IQ1_S, PG_TYPE_IQ1_M, PG_TYPE_TQ1_0,
                                 PG_TYPE_TQ2_0};

static void random_grid(int32_t type, uint8_t *buf, int nb) {
    const pg_type_traits *t = str(type);
    for (int i = 0; i < nb * t->type_size; i++) buf[i] = (uint8_t)rnd();
    for (int b = 0; b < nb; b++) {
        uint8_t *blk = buf + (size_t)b * t->type_size;
        const pg_fp16 h = pg_fp32_to_fp16(rndf() * 0.01f);
        if (type == PG_TYPE_TQ1_0 || type == PG_TYPE_TQ2_0) {   /* d last */
            memcpy(blk + t->type_size - 2, &h, 2);
        } else if (type == PG_TYPE_IQ1_M) {
            uint16_t sc[4];
            memcpy(sc, blk + 48, 8);
            for (int k = 0; k < 4; k++)
                sc[k] = (uint16_t)((sc[k] & 0x0fff) | (((h >> (4 * k)) & 0xf) << 12));
            memcpy(blk + 48, sc, 8);
        } else {
            memcpy(blk, &h, 2);
        }
    }
}

/* The kernel tables the grid / ternary tests check: every compiled path's and, on AArch64, one
 * filled as on a CPU without the dot-product extension (the neon path takes the dotprod kernels
 * where the CPU has them, as under qemu: the plain ones are checked here too). */
typedef struct {
    const char *name;
    const pg_type_traits *tbl;   /* PG_TYPE_COUNT entries */
} iq_table;

static int iq_tables(iq_table *out) {
    static const char *names[PG_PATH_COUNT] = {"scalar", "avx2", "avx512", "neon", "amx"};
    int n = 0;
    for (int32_t p = 0; p < PG_PATH_COUNT; p++)
        if (pg_path_compiled(p)) out[n++] = (iq_table){names[p], pg_get_type_traits_for_path(0, p)};
#if defined(__aarch64__)
    static pg_type_traits plain[PG_TYPE_COUNT];
    for (int32_t t = 0; t < PG_TYPE_COUNT; t++) plain[t] = *str(t);
    pg_fill_iquants_neon(plain, PG_CPU_NEON);
    out[n++] = (iq_table){"neon-no-dotprod", plain};
#endif
    return n;
}
#define IQ_MAX_TABLES (PG_PATH_COUNT + 1)

PG_TEST(test_iq_grid_paths_and_bounds) {
    static uint8_t w[9 * 110], a[9 * 292];   /* (110: the largest of these blocks) */
    static float y0[9 * 256], y1[9 * 256];
    iq_table tabs[IQ_MAX_TABLES];
    const int ntab = iq_tables(tabs);
    for (int it = 0; it < 9; it++) {
        const int32_t type = k_grid[it];
        const pg_type_traits *ts = str(type);
        CHECK(ts->to_float && ts->vec_dot && ts->vec_dot_type == PG_TYPE_Q8_K &&
                  !ts->from_float_ref == (it < 7),
              "type %d traits", type);
        for (int p = 0; p < ntab; p++) {
            const pg_type_traits *tp = &tabs[p].tbl[type];
            for (int k = 0; k < 9; k++) {
                const int nb = 1 + 4 * (k % 3);   /* 1, 5, 9 blocks, three times each */
                const int64_t n = (int64_t)nb * 256;
                random_grid(type, w, nb);
                random_act(type, a, n);
                float s0, s1;
                ts->vec_dot(n, &s0, w, a);
                tp->vec_dot(n, &s1, w, a);
                CHECK(memcmp(&s0, &s1, 4) == 0, "type %d %s nb %d: dot %.9g scalar %.9g", type, tabs[p].name, nb,
                      (double)s1, (double)s0);
                ts->to_float(w, y0, n);
                tp->to_float(w, y1, n);
                CHECK(memcmp(y0, y1, (size_t)n * 4) == 0, "type %d %s: to_float", type, tabs[p].name);
                void *mx, *my;
                size_t sx, sy;
                unsigned char *x = row_before_guard(row_bytes(type, n), &mx, &sx);
                unsigned char *y = row_before_guard(row_bytes(PG_TYPE_Q8_K, n), &my, &sy);
                if (!x || !y) return;
                memcpy(x, w, row_bytes(type, n));
                memcpy(y, a, row_bytes(PG_TYPE_Q8_K, n));
                tp->to_float(x, y1, n);
                tp->vec_dot(n, &s1, x, y);
                CHECK(memcmp(&s0, &s1, 4) == 0, "type %d %s: guarded dot", type, tabs[p].name);
                munmap(mx, sx);
                munmap(my, sy);
            }
        }
    }
}

/* Every SIMD table has its own vec_dot, vec_dot8 and gemm for each codebook and ternary type
 * (not the scalar kernels it starts from); on AArch64 the neon path's are the dotprod ones
 * where the CPU has the extension, and the plain table's are NEON kernels too. */
PG_TEST(test_iq_tq_simd_kernels_installed) {
    iq_table tabs[IQ_MAX_TABLES];
    const int ntab = iq_tables(tabs);
    int simd = 0;
    for (int p = 1; p < ntab; p++) {   /* tabs[0]: the scalar path */
        simd++;
        for (int it = 0; it < 9; it++) {
            const int32_t type = k_grid[it];
            const pg_type_traits *tp = &tabs[p].tbl[type];
            CHECK(tp->vec_dot && tp->vec_dot != str(type)->vec_dot && tp->vec_dot8 &&
                      tp->vec_dot8_rows >= 1 && tp->gemm,
                  "%s type %d: no SIMD vec_dot / vec_dot8 / gemm", tabs[p].name, type);
        }
    }
#if defined(__aarch64__)
    const pg_type_traits *neon = pg_get_type_traits_for_path(PG_TYPE_IQ2_XXS, PG_PATH_NEON);
    CHECK((neon->vec_dot != tabs[ntab - 1].tbl[PG_TYPE_IQ2_XXS].vec_dot) ==
              !!(pg_cpu_features() & PG_CPU_DOTPROD),
          "neon path: dotprod kernels %s", pg_cpu_features() & PG_CPU_DOTPROD ? "missing" : "on a CPU without SDOT");
#endif
#if defined(__x86_64__) || defined(__aarch64__)
    CHECK(simd > 0, "no SIMD table compiled");
#endif
}

/* ---- multi-row decode and batches (every i-quant type and every path that has the kernel) --- */

static const int32_t k_every[] = {PG_TYPE_IQ4_NL, PG_TYPE_IQ4_XS, PG_TYPE_MXFP4, PG_TYPE_IQ2_XXS,
                                  PG_TYPE_IQ2_XS, PG_TYPE_IQ2_S, PG_TYPE_IQ3_XXS, PG_TYPE_IQ3_S,
                                  PG_TYPE_IQ1_S, PG_TYPE_IQ1_M, PG_TYPE_TQ1_0, PG_TYPE_TQ2_0};
#define N_EVERY ((int)(sizeof(k_every) / sizeof(k_every[0])))

static void random_row(int32_t type, uint8_t *buf, int nb) {
    if (type == PG_TYPE_IQ4_NL || type == PG_TYPE_IQ4_XS || type == PG_TYPE_MXFP4)
        random_weights(type, buf, nb);
    else random_grid(type, buf, nb);
}

/* vec_dot8: every result has the scalar vec_dot's bits, for 1..PG_DOT8_MAX_NC activation rows
 * at a padded stride; the eight weight rows end at a guard page (nothing read past the eighth
 * row), the activation rows too, and nothing is written outside the nc × 8 outputs. */
PG_TEST(test_iq_vec_dot8_bits_and_bounds) {
    static const int counts32[] = {1, 2, 7, 20, 33}, counts256[] = {1, 2, 3};
    int tested = 0;
    iq_table tabs[IQ_MAX_TABLES];
    const int ntab = iq_tables(tabs);
    for (int p = 0; p < ntab; p++) {
        for (int it = 0; it < N_EVERY; it++) {
            const int32_t type = k_every[it];
            const pg_type_traits *ts = str(type), *tp = &tabs[p].tbl[type];
            if (!tp->vec_dot8) continue;
            const int big = ts->block_size == 256, ncount = big ? 3 : 5;
            for (int ic = 0; ic < ncount; ic++)
                for (int nc = 1; nc <= PG_DOT8_MAX_NC; nc++) {
                    const int nb = big ? counts256[ic] : counts32[ic];
                    const int64_t n = (int64_t)nb * ts->block_size;
                    const size_t wrow = row_bytes(type, n), yrow = row_bytes(ts->vec_dot_type, n);
                    const size_t ystride = yrow + 8 * (size_t)(nc > 1);
                    void *mw, *my;
                    size_t sw, sy;
                    unsigned char *w = row_before_guard(wrow * 8, &mw, &sw);
                    unsigned char *y = row_before_guard(ystride * (size_t)(nc - 1) + yrow, &my, &sy);
                    CHECK(w && y, "mmap failed");
                    if (!w || !y) return;
                    for (int i = 0; i < 8; i++) random_row(type, w + (size_t)i * wrow, nb);
                    for (int j = 0; j < nc; j++) random_act(type, y + (size_t)j * ystride, n);
                    enum { S = 11 };   /* output row stride in floats: 8 dots and 3 guards */
                    float got[PG_DOT8_MAX_NC + 1][S], want[PG_DOT8_MAX_NC + 1][S];
                    for (int j = 0; j <= PG_DOT8_MAX_NC; j++)
                        for (int i = 0; i < S; i++) got[j][i] = want[j][i] = -7.25f;
                    tp->vec_dot8(n, &got[0][0], sizeof(got[0]), w, wrow, y, ystride, nc);
                    for (int j = 0; j < nc; j++)
                        for (int i = 0; i < 8; i++)
                            ts->vec_dot(n, &want[j][i], w + (size_t)i * wrow,
                                        y + (size_t)j * ystride);
                    CHECK(memcmp(got, want, sizeof(got)) == 0, "type %d %s, %d blocks, %d "
                          "activation rows: vec_dot8 differs from the scalar vec_dot (or wrote "
                          "outside)", type, tabs[p].name, nb, nc);
                    tested++;
                    munmap(mw, sw);
                    munmap(my, sy);
                }
        }
    }
#if defined(__x86_64__) || defined(__aarch64__)
    CHECK(tested > 0, "no path has an i-quant vec_dot8");
#endif
}

/* Activations at the ends of Q8_K's range (-128 never comes out of the quantizer but is a valid
 * byte; 127, 0): every path's vec_dot8 of the codebook types still has the scalar bits (the
 * AVX-512 kernels take |a|, -128 included, as an unsigned byte; the IQ1 kernels take Σ a from
 * the bsums, set here as the quantizer sets them) */
PG_TEST(test_iq_grid_vec_dot8_extreme_activations) {
    enum { NB = 2 };
    static uint8_t w[8][NB * 110];
    static pg_block_q8_K a[4][NB];
    static const int32_t types[] = {PG_TYPE_IQ2_XXS, PG_TYPE_IQ2_XS, PG_TYPE_IQ2_S, PG_TYPE_IQ3_XXS,
                                    PG_TYPE_IQ3_S, PG_TYPE_IQ1_S, PG_TYPE_IQ1_M};
    int tested = 0;
    for (int it = 0; it < 7; it++) {
        const int32_t type = types[it];
        const int64_t n = NB * 256;
        for (int i = 0; i < 8; i++) random_grid(type, w[i], NB);
        for (int j = 0; j < 4; j++)
            for (int b = 0; b < NB; b++) {
                pg_block_q8_K *q = &a[j][b];
                q->d = 0.0123f * (float)(j + 1);
                for (int e = 0; e < 256; e++) {
                    const uint64_t r = rnd() % 8;   /* mostly -128, some 127 and 0, some random */
                    q->qs[e] = (int8_t)(r < 4 ? -128 : r == 4 ? 127 : r == 5 ? 0 : (int8_t)rnd());
                }
                for (int g = 0; g < 16; g++) {
                    int sum = 0;
                    for (int e = 0; e < 16; e++) sum += q->qs[16 * g + e];
                    q->bsums[g] = (int16_t)sum;
                }
            }
        char what[32];
        snprintf(what, sizeof(what), "type %d (activations -128/127/0)", type);
        tested += pg_test_dot8_paths(type, n, w, sizeof(w[0]), a, sizeof(a[0]), 4, what);
    }
#if defined(__x86_64__)
    CHECK(tested > 0, "no path has a codebook vec_dot8");
#endif
}

/* IQ4_NL, IQ4_XS, MXFP4 at the ends of their ranges: activations mostly at the low end (Q8_K:
 * -128; Q8_0: -127), 127 and 0, activation and weight fp16 scales down to subnormals, and
 * MXFP4 exponents from 0 (2^-128, subnormal) to 254; every path's vec_dot8 has the scalar bits.
 * This pins the kernels' integer tricks (values + 128 or + 12 with Σa taken off, |a| with the
 * sign moved onto the values) where int16 pair sums come closest to saturating, and the vector
 * forms of d_y·2^(e-128) where the product is subnormal. 7 blocks of 32: the 512-bit kernels'
 * groups of four and a ragged three, the 256-bit ones' pairs and an odd one. */
PG_TEST(test_iq4_vec_dot8_extremes) {
    enum { NB32 = 7, NBK = 2, ROWB = NBK * 136 };
    static const uint16_t halves[] = {0x0001, 0x0203, 0x03FF, 0x0400, 0x1C00, 0x3800, 0xB800};
    static const uint8_t exps[] = {0, 1, 2, 3, 100, 127, 128, 140, 200, 254};
    static uint8_t w[8][ROWB];
    static uint8_t a[4][NBK * sizeof(pg_block_q8_K)];
    int tested = 0;
    for (int it = 0; it < NT; it++) {
        const int32_t type = k_types[it];
        const pg_type_traits *ts = str(type);
        const int nb = ts->block_size == 256 ? NBK : NB32;
        const int64_t n = (int64_t)nb * ts->block_size;
        for (int rep = 0; rep < 4; rep++) {
            for (int i = 0; i < 8; i++) {
                random_weights(type, w[i], nb);
                for (int b = 0; b < nb; b++) {
                    uint8_t *blk = w[i] + (size_t)b * ts->type_size;
                    if (type == PG_TYPE_MXFP4) blk[0] = exps[rnd() % sizeof(exps)];
                    else if (rnd() % 2) memcpy(blk, &halves[rnd() % 7], 2);
                }
            }
            for (int j = 0; j < 4; j++) {
                for (int b = 0; b < nb; b++) {
                    int8_t *qs;
                    if (ts->vec_dot_type == PG_TYPE_Q8_K) {
                        pg_block_q8_K *q = (pg_block_q8_K *)a[j] + b;
                        q->d = rnd() % 2 ? 1e-40f : 0.0123f;   /* fp32: subnormal or not */
                        qs = q->qs;
                    } else {
                        pg_block_q8_0 *q = (pg_block_q8_0 *)a[j] + b;
                        memcpy(&q->d, &halves[rnd() % 7], 2);
                        qs = q->qs;
                    }
                    /* Q8_0's end is -127: its x86 one-row kernels take the sign trick on the
                     * activations (as ggml's do), and its quantizer never writes -128 */
                    const int lo = ts->vec_dot_type == PG_TYPE_Q8_K ? -128 : -127;
                    for (int e = 0; e < ts->block_size; e++) {
                        const uint64_t r = rnd() % 8;
                        qs[e] = (int8_t)(r < 4 ? lo : r == 4 ? 127 : r == 5 ? 0
                                         : lo + (int)(rnd() % (size_t)(128 - lo)));
                    }
                    if (ts->vec_dot_type == PG_TYPE_Q8_K) {
                        pg_block_q8_K *q = (pg_block_q8_K *)a[j] + b;
                        for (int g = 0; g < 16; g++) {
                            int sum = 0;
                            for (int e = 0; e < 16; e++) sum += q->qs[16 * g + e];
                            q->bsums[g] = (int16_t)sum;
                        }
                    }
                }
            }
            const size_t wrow = row_bytes(type, n), arow = row_bytes(ts->vec_dot_type, n);
            /* rows packed at their own size: the kernels' strides are the row sizes */
            static uint8_t wp[8 * ROWB], ap[4 * sizeof(a[0])];
            for (int i = 0; i < 8; i++) memcpy(wp + (size_t)i * wrow, w[i], wrow);
            for (int j = 0; j < 4; j++) memcpy(ap + (size_t)j * arow, a[j], arow);
            tested += pg_test_dot8_paths(type, n, wp, wrow, ap, arow, 4, k_names[it]);
        }
    }
#if defined(__x86_64__)
    CHECK(tested > 0, "no path has an IQ4 / MXFP4 vec_dot8");
#endif
}

/* every gemm of every path: each nr × nc block (PG_GEMM_MAX_NR × PG_GEMM_MAX_NC at most) equals
 * the scalar vec_dot pair by pair, and nothing outside the block is written */
PG_TEST(test_iq_every_gemm_equals_vec_dot) {
    enum { NR = PG_GEMM_MAX_NR, NC = PG_GEMM_MAX_NC, NB = 3 };
    static uint8_t w[NR][NB * 256], a[NC][NB * 292];
    iq_table tabs[IQ_MAX_TABLES];
    const int ntab = iq_tables(tabs);
    for (int p = 0; p < ntab; p++) {
        for (int it = 0; it < N_EVERY; it++) {
            const int32_t type = k_every[it];
            const pg_type_traits *ts = str(type), *tp = &tabs[p].tbl[type];
            if (!tp->gemm) continue;
            const int nb = ts->block_size == 256 ? 2 : NB * 3;
            const int64_t n = (int64_t)nb * ts->block_size;
            for (int i = 0; i < NR; i++) random_row(type, w[i], nb);
            for (int j = 0; j < NC; j++) random_act(type, a[j], n);
            int same = 1, clean = 1;
            for (int nr = 1; nr <= NR; nr++)
                for (int nc = 1; nc <= NC; nc++) {
                    float out[NC + 1][NR + 1];
                    memset(out, 0x7f, sizeof(out));
                    tp->gemm(n, &out[0][0], sizeof(out[0]), w[NR - nr], sizeof(w[0]), a[0],
                             sizeof(a[0]), nr, nc);
                    for (int j = 0; j <= NC; j++)
                        for (int i = 0; i <= NR; i++) {
                            if (i < nr && j < nc) {
                                float s;
                                ts->vec_dot(n, &s, w[NR - nr + i], a[j]);
                                same &= memcmp(&s, &out[j][i], 4) == 0;
                            } else {
                                uint32_t u;
                                memcpy(&u, &out[j][i], 4);
                                clean &= u == 0x7f7f7f7fu;
                            }
                        }
                }
            CHECK(same && clean, "type %d %s: gemm %s", type, tabs[p].name,
                  same ? "wrote outside its block" : "differs from the scalar vec_dot");
        }
    }
}

static void mm_tensor(pg_tensor *t, int32_t type, int32_t op, int64_t ne0, int64_t ne1,
                      void *data) {
    memset(t, 0, sizeof(*t));
    t->type = type;
    t->op = op;
    t->ne[0] = ne0; t->ne[1] = ne1; t->ne[2] = 1; t->ne[3] = 1;
    t->nb[0] = str(type)->type_size;
    t->nb[1] = (int64_t)pg_type_row_size(type, ne0);
    t->nb[2] = t->nb[1] * ne1; t->nb[3] = t->nb[2];
    for (int k = 0; k < PG_MAX_SRC; k++) t->src[k] = -1;
    t->data = data;
}

/* dst [N, M] = MUL_MAT(w [K, N] of `type`, x [K, M] F32) with n_threads threads of tp */
static int mul_mat(pg_threadpool *tp, int n_threads, int32_t type, int64_t K, int64_t N,
                   int64_t M, void *w, float *x, float *dst) {
    pg_tensor t[3];
    mm_tensor(&t[0], type, PG_OP_NONE, K, N, w);
    mm_tensor(&t[1], PG_TYPE_F32, PG_OP_NONE, K, M, x);
    mm_tensor(&t[2], PG_TYPE_F32, PG_OP_MUL_MAT, N, M, dst);
    t[2].src[0] = 0;
    t[2].src[1] = 1;
    const int32_t order[1] = {2};
    size_t ws = 0;
    int32_t bad = 0;
    if (pg_graph_work_size(t, 3, order, 1, n_threads, &ws) != PG_OK) return 0;
    void *work = malloc(ws + 64);
    const int ok = pg_graph_compute(t, 3, order, 1, tp, n_threads, work, ws, NULL, NULL, &bad) ==
                   PG_OK;
    free(work);
    return ok;
}

/* Batch invariance: on every path, MUL_MAT over M activation rows (decode's vec_dot8 up to the
 * type's vec_dot8_rows, the gemm or vec_dot beyond; 1 and 2 threads; N = 37: a ragged group of
 * weight rows) gives each row the bits of that row computed alone (M = 1, 1 thread). */
PG_TEST(test_iq_mul_mat_row_independent_of_batch) {
    static const int64_t Ms[] = {2, 3, 5, 8, 9, 19};
    enum { K = 512, N = 37, MMAX = 19 };
    const int32_t cur = pg_cpu_path();
    pg_threadpool *tp = pg_threadpool_new(2);
    CHECK(tp != NULL, "thread pool");
    float *x = malloc(sizeof(float) * K * MMAX);
    float *batch = malloc(sizeof(float) * N * MMAX), *alone = malloc(sizeof(float) * N);
    uint8_t *w = malloc((size_t)N * K);
    for (int32_t path = PG_PATH_SCALAR; path < PG_PATH_COUNT; path++) {
        if (!pg_path_compiled(path) || pg_set_cpu_path(path) != PG_OK) continue;
        for (int it = 0; it < N_EVERY; it++) {
            const int32_t type = k_every[it];
            const size_t rb = pg_type_row_size(type, K);
            for (int i = 0; i < N; i++) random_row(type, w + (size_t)i * rb, K / str(type)->block_size);
            for (int i = 0; i < K * MMAX; i++) x[i] = rnd() % 16 == 0 ? 0.0f : rndf() * 3.0f;
            for (int im = 0; im < (int)(sizeof(Ms) / sizeof(Ms[0])); im++) {
                const int64_t M = Ms[im];
                for (int nth = 1; nth <= 2; nth++) {
                    CHECK(mul_mat(tp, nth, type, K, N, M, w, x, batch), "mul_mat");
                    int same = 1;
                    for (int64_t m = 0; m < M; m++) {
                        CHECK(mul_mat(tp, 1, type, K, N, 1, w, x + m * K, alone), "mul_mat 1");
                        same &= memcmp(alone, batch + m * N, sizeof(float) * N) == 0;
                    }
                    CHECK(same, "path %d type %d M=%d %d threads: a row differs from the row "
                          "alone", (int)path, type, (int)M, nth);
                }
            }
        }
    }
    pg_set_cpu_path(cur);
    pg_threadpool_free(tp);
    free(x);
    free(batch);
    free(alone);
    free(w);
}
