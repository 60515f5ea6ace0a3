/* Legacy (32-element) formats and float types: every SIMD kernel of every path this CPU can run
 * against the scalar reference, plus the public entry points of quants_api.c.
 *
 * Tolerances (the contract stated in quants_legacy_avx2.c / _neon.c):
 *   - to_float and the activation quantizers (from_float of Q8_0, Q8_1, F16, BF16): bit-exact;
 *   - vec_dot with every scale set to 1 (so every block term and the sum are exact integers):
 *     exactly equal, which pins the integer block sums;
 *   - vec_dot on random data: |simd − scalar| <= 1e-5 · Σ|block terms|, where a block term is
 *     |d_x·d_y|·Σ|q_x·q_y| (+ |m_x·s_y|) and for float types |x_i·y_i|. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pg_test.h"
#include "quants.h"
#include "quants_legacy.h"

static uint64_t g_rng = 0x9e3779b97f4a7c15ULL;

static uint64_t rnd(void) { return pg_test_splitmix(&g_rng); }
static float rndf(void) { return pg_test_unit(rnd()); }   /* uniform in [-1, 1) */

static const int32_t LEGACY_TYPES[] = {PG_TYPE_F32, PG_TYPE_F16, PG_TYPE_BF16, PG_TYPE_Q4_0,
                                       PG_TYPE_Q4_1, PG_TYPE_Q5_0, PG_TYPE_Q5_1, PG_TYPE_Q8_0,
                                       PG_TYPE_Q8_1};
#define N_LEGACY ((int)(sizeof(LEGACY_TYPES) / sizeof(LEGACY_TYPES[0])))

static const char *type_name(int32_t t) {
    switch (t) {
    case PG_TYPE_F32: return "F32";   case PG_TYPE_F16: return "F16";
    case PG_TYPE_BF16: return "BF16"; case PG_TYPE_Q4_0: return "Q4_0";
    case PG_TYPE_Q4_1: return "Q4_1"; case PG_TYPE_Q5_0: return "Q5_0";
    case PG_TYPE_Q5_1: return "Q5_1"; case PG_TYPE_Q8_0: return "Q8_0";
    case PG_TYPE_Q8_1: return "Q8_1"; default: return "?";
    }
}

/* Kernel variants compared with the scalar reference: every SIMD path this build has and this
 * CPU runs, plus on aarch64 the plain NEON kernels without the dot-product extension (a table of
 * our own, filled as on a CPU without SDOT). */
typedef struct {
    const char *name;
    int32_t path;                    /* table of a path, or ...                       */
    pg_type_traits *own;             /* ... a table built here (PG_TYPE_COUNT entries) */
} variant;

static const pg_type_traits *vtraits(const variant *v, int32_t type) {
    return v->own ? &v->own[type] : pg_get_type_traits_for_path(type, v->path);
}

static int variants(variant *out) {
    static const char *names[] = {"scalar", "avx2", "avx512", "neon"};
    const int32_t cur = pg_cpu_path();
    int n = 0;
    for (int32_t p = PG_PATH_AVX2; p <= PG_PATH_NEON; p++)
        if (pg_path_compiled(p) && pg_set_cpu_path(p) == PG_OK)
            out[n++] = (variant){names[p], p, NULL};
    pg_set_cpu_path(cur);
#if defined(__aarch64__)
    static pg_type_traits plain[PG_TYPE_COUNT];
    for (int32_t t = 0; t < PG_TYPE_COUNT; t++) plain[t] = *pg_get_type_traits_for_path(t, 0);
    pg_fill_legacy_neon(plain, PG_CPU_NEON);
    out[n++] = (variant){"neon-no-dotprod", PG_PATH_NEON, plain};
#endif
    return n;
}

/* Element counts tested per type: 1, 2, 7 (and 33) blocks; float types also odd lengths. */
static int lengths(int32_t type, int64_t *out) {
    const int64_t blk = pg_get_type_traits(type)->block_size;
    int n = 0;
    const int64_t nb[] = {1, 2, 7, 33};
    for (int i = 0; i < 4; i++) out[n++] = nb[i] * blk;
    if (blk == 1) { out[n++] = 224; out[n++] = 231; out[n++] = 4099; }
    return n;
}

/* Random rows. mode 0: uniform values times `scale` with zeros sprinkled in. mode 1 (ties):
 * per block one value ±127·p (p a power of two, so the Q8 reference gets d = p and id = 1/p
 * exactly) and the others (k + 0.5)·p, which land exactly on rounding ties. */
static void random_floats(float *x, int64_t n, float scale, int mode) {
    for (int64_t i = 0; i < n; i++) x[i] = rnd() % 16 == 0 ? 0.0f : rndf() * scale;
    if (mode != 1) return;
    for (int64_t b = 0; b + 32 <= n; b += 32) {
        const float p = ldexpf(1.0f, (int)(rnd() % 13) - 8);   /* fp16-safe: |x| < 2^11 */
        for (int j = 0; j < 32; j++) x[b + j] = ((float)(int)(rnd() % 253) - 126.0f + 0.5f) * p;
        x[b + rnd() % 32] = (rnd() & 1 ? 127.0f : -127.0f) * p;
    }
}

/* Random weights/activations of `type`: random floats through the scalar reference quantizer,
 * so every block is one the format really holds; Q8_0 weights additionally get raw random
 * bytes (including −128) when raw_bytes is set. */
static void make_row(int32_t type, int64_t n, void *out, int raw_bytes) {
    const pg_type_traits *ref = pg_get_type_traits_for_path(type, PG_PATH_SCALAR);
    float *x = malloc((size_t)n * sizeof(float));
    random_floats(x, n, (float)(1 << (rnd() % 8)), (int)(rnd() % 2));
    ref->from_float_ref(x, out, n);
    if (raw_bytes && type == PG_TYPE_Q8_0) {
        pg_block_q8_0 *b = out;
        for (int64_t k = 0; k < n / PG_QK32; k++)
            for (int j = 0; j < PG_QK32; j++) b[k].qs[j] = (int8_t)(rnd() & 0xff);
    }
    free(x);
}

static size_t row_size(int32_t type, int64_t n) {
    const pg_type_traits *t = pg_get_type_traits_for_path(type, PG_PATH_SCALAR);
    return (size_t)(n / t->block_size) * (size_t)t->type_size;
}

/* ---- dequantize: bit-exact ----------------------------------------------------------------- */

PG_TEST(test_legacy_to_float_simd_equals_scalar) {
    variant paths[8];
    const int np = variants(paths);
    int64_t lens[8];
    for (int ip = 0; ip < np; ip++) {
        for (int it = 0; it < N_LEGACY; it++) {
            const int32_t type = LEGACY_TYPES[it];
            const pg_type_traits *s = pg_get_type_traits_for_path(type, PG_PATH_SCALAR);
            const pg_type_traits *v = vtraits(&paths[ip], type);
            const int nl = lengths(type, lens);
            for (int il = 0; il < nl; il++) {
                const int64_t n = lens[il];
                void *q = malloc(row_size(type, n));
                float *a = malloc((size_t)n * 4), *b = malloc((size_t)n * 4);
                for (int rep = 0; rep < 4; rep++) {
                    make_row(type, n, q, 1);
                    s->to_float(q, a, n);
                    v->to_float(q, b, n);
                    CHECK(memcmp(a, b, (size_t)n * 4) == 0, "%s to_float %s n=%lld differs",
                          paths[ip].name, type_name(type), (long long)n);
                }
                free(q); free(a); free(b);
            }
        }
    }
}

/* Every fp16 bit pattern: exact for non-NaN, NaN stays NaN. */
PG_TEST(test_legacy_f16_to_float_all_values) {
    variant paths[8];
    const int np = variants(paths);
    pg_fp16 *h = malloc(65536 * 2);
    float *a = malloc(65536 * 4), *b = malloc(65536 * 4);
    for (int i = 0; i < 65536; i++) h[i] = (pg_fp16)i;
    pg_get_type_traits_for_path(PG_TYPE_F16, PG_PATH_SCALAR)->to_float(h, a, 65536);
    for (int ip = 0; ip < np; ip++) {
        vtraits(&paths[ip], PG_TYPE_F16)->to_float(h, b, 65536);
        int bad = 0;
        for (int i = 0; i < 65536; i++) {
            if (isnan(a[i])) bad += !isnan(b[i]);
            else bad += memcmp(&a[i], &b[i], 4) != 0;
        }
        CHECK(bad == 0, "%s: %d fp16 values convert differently", paths[ip].name, bad);
    }
    free(h); free(a); free(b);
}

/* ---- activation quantizers: bit-exact with the scalar reference --------------------------- */

PG_TEST(test_legacy_from_float_simd_equals_reference) {
    variant paths[8];
    const int np = variants(paths);
    const int32_t types[] = {PG_TYPE_Q8_0, PG_TYPE_Q8_1, PG_TYPE_F16, PG_TYPE_BF16};
    int64_t lens[8];
    for (int ip = 0; ip < np; ip++) {
        for (int it = 0; it < 4; it++) {
            const int32_t type = types[it];
            const pg_type_traits *s = pg_get_type_traits_for_path(type, PG_PATH_SCALAR);
            const pg_type_traits *v = vtraits(&paths[ip], type);
            const int nl = lengths(type, lens);
            for (int il = 0; il < nl; il++) {
                const int64_t n = lens[il];
                const size_t rs = row_size(type, n);
                float *x = malloc((size_t)n * 4);
                unsigned char *a = malloc(rs), *b = malloc(rs);
                for (int rep = 0; rep < 8; rep++) {
                    /* magnitudes from 1e-30 to 1e30; every other row tie-rich */
                    const float scale = powf(10.0f, (float)((int)(rnd() % 61) - 30));
                    random_floats(x, n, scale, rep & 1);
                    if (rep == 7) for (int64_t i = 0; i < n; i++) x[i] = 0.0f;
                    s->from_float_ref(x, a, n);
                    v->from_float(x, b, n);
                    CHECK(memcmp(a, b, rs) == 0, "%s from_float %s n=%lld scale %g differs",
                          paths[ip].name, type_name(type), (long long)n, (double)scale);
                }
                free(x); free(a); free(b);
            }
        }
    }
}

/* Exact rounding ties: amax = 127 makes d = 1 and id = 1, so x*id = x. roundf rounds halves away
 * from zero (2.5 -> 3, -3.5 -> -4) where round-half-even would give 2 and -4. */
PG_TEST(test_legacy_q8_ties_round_away_from_zero) {
    float x[32];
    for (int j = 0; j < 32; j++) x[j] = (float)(j % 8) - 4.0f + 0.5f;   /* -3.5 .. 3.5 */
    x[31] = 127.0f;
    x[30] = 2.5f;
    x[29] = -126.5f;
    pg_block_q8_0 want;
    pg_get_type_traits_for_path(PG_TYPE_Q8_0, PG_PATH_SCALAR)->from_float_ref(x, &want, 32);
    CHECK(want.qs[30] == 3 && want.qs[29] == -127 && want.qs[0] == -4 && want.qs[4] == 1,
          "reference rounding: %d %d %d %d", want.qs[30], want.qs[29], want.qs[0], want.qs[4]);
    CHECK(want.d == 0x3c00, "d = %04x, expected fp16 1.0", want.d);
    variant paths[8];
    const int np = variants(paths);
    for (int ip = 0; ip < np; ip++) {
        pg_block_q8_0 got;
        pg_block_q8_1 got1, want1;
        vtraits(&paths[ip], PG_TYPE_Q8_0)->from_float(x, &got, 32);
        CHECK(memcmp(&got, &want, sizeof got) == 0, "%s Q8_0 ties", paths[ip].name);
        pg_get_type_traits_for_path(PG_TYPE_Q8_1, PG_PATH_SCALAR)->from_float_ref(x, &want1, 32);
        vtraits(&paths[ip], PG_TYPE_Q8_1)->from_float(x, &got1, 32);
        CHECK(memcmp(&got1, &want1, sizeof got1) == 0, "%s Q8_1 ties", paths[ip].name);
    }
}

/* ---- dot products ------------------------------------------------------------------------ */

/* Per block: the q values (decoded with d = 1, m = 0 through the scalar to_float), d, m. */
static void decode_block(int32_t type, const unsigned char *blk, float q[32], float *d, float *m) {
    const pg_type_traits *t = pg_get_type_traits_for_path(type, PG_PATH_SCALAR);
    unsigned char tmp[64];
    memcpy(tmp, blk, (size_t)t->type_size);
    pg_fp16 h;
    memcpy(&h, tmp, 2);
    *d = pg_fp16_to_fp32(h);
    *m = 0.0f;
    const pg_fp16 one = 0x3c00, zero = 0;
    memcpy(tmp, &one, 2);
    if (type == PG_TYPE_Q4_1 || type == PG_TYPE_Q5_1 || type == PG_TYPE_Q8_1) {
        memcpy(&h, tmp + 2, 2);
        *m = pg_fp16_to_fp32(h);   /* m for weights, s for Q8_1 activations */
        if (type != PG_TYPE_Q8_1) memcpy(tmp + 2, &zero, 2);
    }
    t->to_float(tmp, q, 32);
}

/* Σ|block terms| bounding the float rounding of any summation order. */
static double dot_magnitude(int32_t type, int32_t vtype, int64_t n, const void *x, const void *y) {
    const pg_type_traits *t = pg_get_type_traits_for_path(type, PG_PATH_SCALAR);
    const pg_type_traits *vt = pg_get_type_traits_for_path(vtype, PG_PATH_SCALAR);
    double mag = 0.0;
    if (t->block_size == 1) {
        float *a = malloc((size_t)n * 4), *b = malloc((size_t)n * 4);
        t->to_float(x, a, n);
        vt->to_float(y, b, n);
        for (int64_t i = 0; i < n; i++) mag += fabs((double)a[i] * b[i]);
        free(a); free(b);
        return mag;
    }
    for (int64_t k = 0; k < n / PG_QK32; k++) {
        float qx[32], qy[32], dx, mx, dy, sy;
        decode_block(type, (const unsigned char *)x + k * t->type_size, qx, &dx, &mx);
        decode_block(vtype, (const unsigned char *)y + k * vt->type_size, qy, &dy, &sy);
        double s = 0.0;
        for (int j = 0; j < 32; j++) s += fabs((double)qx[j] * qy[j]);
        mag += fabs((double)dx * dy) * s + fabs((double)mx * sy);
    }
    return mag;
}

PG_TEST(test_legacy_vec_dot_simd_matches_scalar) {
    variant paths[8];
    const int np = variants(paths);
    int64_t lens[8];
    for (int ip = 0; ip < np; ip++) {
        for (int it = 0; it < N_LEGACY; it++) {
            const int32_t type = LEGACY_TYPES[it];
            const pg_type_traits *s = pg_get_type_traits_for_path(type, PG_PATH_SCALAR);
            const pg_type_traits *v = vtraits(&paths[ip], type);
            if (!s->vec_dot) continue;
            CHECK(v->vec_dot != NULL && v->vec_dot_type == s->vec_dot_type, "%s %s dot missing",
                  paths[ip].name, type_name(type));
            const int32_t vtype = s->vec_dot_type;
            const int nl = lengths(type, lens);
            for (int il = 0; il < nl; il++) {
                const int64_t n = lens[il];
                void *x = malloc(row_size(type, n)), *y = malloc(row_size(vtype, n));
                for (int rep = 0; rep < 8; rep++) {
                    make_row(type, n, x, 1);
                    make_row(vtype, n, y, 0);
                    float a = 0, b = 0;
                    s->vec_dot(n, &a, x, y);
                    v->vec_dot(n, &b, x, y);
                    const double tol = 1e-5 * dot_magnitude(type, vtype, n, x, y) + 1e-30;
                    CHECK(fabs((double)a - b) <= tol, "%s vec_dot %s n=%lld: %.9g vs %.9g (tol %g)",
                          paths[ip].name, type_name(type), (long long)n, (double)a,
                          (double)b, tol);
                }
                free(x); free(y);
            }
        }
    }
}

/* With every scale 1 (and integer m, s), all block terms are small integers: SIMD and scalar
 * must agree exactly, which checks the integer block sums bit for bit. */
PG_TEST(test_legacy_vec_dot_integer_parts_exact) {
    variant paths[8];
    const int np = variants(paths);
    const int32_t types[] = {PG_TYPE_Q4_0, PG_TYPE_Q4_1, PG_TYPE_Q5_0, PG_TYPE_Q5_1, PG_TYPE_Q8_0};
    const int64_t nbs[] = {1, 2, 7};
    for (int ip = 0; ip < np; ip++) {
        for (int it = 0; it < 5; it++) {
            const int32_t type = types[it];
            const pg_type_traits *s = pg_get_type_traits_for_path(type, PG_PATH_SCALAR);
            const pg_type_traits *v = vtraits(&paths[ip], type);
            const int32_t vtype = s->vec_dot_type;
            const int ts = s->type_size;
            const int vs = pg_get_type_traits_for_path(vtype, PG_PATH_SCALAR)->type_size;
            for (int in = 0; in < 3; in++) {
                const int64_t n = nbs[in] * PG_QK32;
                unsigned char *x = malloc((size_t)(nbs[in] * ts));
                unsigned char *y = malloc((size_t)(nbs[in] * vs));
                for (int rep = 0; rep < 16; rep++) {
                    for (int64_t k = 0; k < nbs[in] * ts; k++) x[k] = (unsigned char)rnd();
                    for (int64_t k = 0; k < nbs[in] * vs; k++) y[k] = (unsigned char)rnd();
                    for (int64_t k = 0; k < nbs[in]; k++) {
                        const pg_fp16 one = 0x3c00;
                        const pg_fp16 m = pg_fp32_to_fp16((float)((int)(rnd() % 7) - 3));
                        const pg_fp16 sy = pg_fp32_to_fp16((float)((int)(rnd() % 2001) - 1000));
                        memcpy(x + k * ts, &one, 2);
                        memcpy(y + k * vs, &one, 2);
                        if (vtype == PG_TYPE_Q8_1) {
                            memcpy(x + k * ts + 2, &m, 2);
                            memcpy(y + k * vs + 2, &sy, 2);
                        }
                        /* activations in −127..127 (what every Q8 quantizer produces) */
                        for (int j = vs - 32; j < vs; j++)
                            if (y[k * vs + j] == 0x80) y[k * vs + j] = 0x81;
                    }
                    float a = 0, b = 0;
                    s->vec_dot(n, &a, x, y);
                    v->vec_dot(n, &b, x, y);
                    CHECK(a == b && a == floorf(a), "%s %s %lld blocks: %.1f vs %.1f",
                          paths[ip].name, type_name(type), (long long)nbs[in], (double)a,
                          (double)b);
                }
                free(x); free(y);
            }
        }
    }
}

/* The scalar reference dot against a float64 evaluation of ggml's formula for one case each. */
PG_TEST(test_legacy_scalar_dot_formula) {
    const int32_t types[] = {PG_TYPE_Q4_0, PG_TYPE_Q4_1, PG_TYPE_Q5_0, PG_TYPE_Q5_1, PG_TYPE_Q8_0};
    for (int it = 0; it < 5; it++) {
        const int32_t type = types[it];
        const pg_type_traits *s = pg_get_type_traits_for_path(type, PG_PATH_SCALAR);
        const int32_t vtype = s->vec_dot_type;
        const int64_t n = 7 * PG_QK32;
        void *x = malloc(row_size(type, n)), *y = malloc(row_size(vtype, n));
        make_row(type, n, x, 0);
        make_row(vtype, n, y, 0);
        double want = 0.0;
        const int ts = s->type_size;
        const int vs = pg_get_type_traits_for_path(vtype, PG_PATH_SCALAR)->type_size;
        for (int k = 0; k < 7; k++) {
            float qx[32], qy[32], dx, mx, dy, sy;
            decode_block(type, (unsigned char *)x + k * ts, qx, &dx, &mx);
            decode_block(vtype, (unsigned char *)y + k * vs, qy, &dy, &sy);
            double isum = 0.0;
            for (int j = 0; j < 32; j++) isum += (double)qx[j] * qy[j];
            want += (double)dx * dy * isum + (double)mx * sy;
        }
        float got = 0;
        s->vec_dot(n, &got, x, y);
        const double mag = dot_magnitude(type, vtype, n, x, y);
        CHECK(fabs(got - want) <= 1e-5 * mag + 1e-30, "%s: %.9g vs %.9g", type_name(type),
              (double)got, want);
        free(x); free(y);
    }
}

/* ---- public entry points ------------------------------------------------------------------- */

PG_TEST(test_quants_api_validation) {
    float x[64] = {0}, out[4];
    unsigned char q[256] = {0};
    float s = 0;
    CHECK(pg_quantize_row(PG_TYPE_Q4_0, NULL, q, 32) == PG_ERR_INVALID_ARG, "NULL x");
    CHECK(pg_quantize_row(PG_TYPE_Q4_0, x, NULL, 32) == PG_ERR_INVALID_ARG, "NULL y");
    CHECK(pg_quantize_row(PG_TYPE_Q4_0, x, q, -32) == PG_ERR_INVALID_ARG, "n < 0");
    CHECK(pg_quantize_row(PG_TYPE_Q4_0, x, q, 33) == PG_ERR_INVALID_ARG, "n not a multiple of 32");
    CHECK(pg_quantize_row(4, x, q, 32) == PG_ERR_UNSUPPORTED, "retired type id 4");
    CHECK(pg_quantize_row(-1, x, q, 32) == PG_ERR_UNSUPPORTED, "negative type");
    CHECK(pg_quantize_row(PG_TYPE_COUNT, x, q, 32) == PG_ERR_UNSUPPORTED, "type out of range");
    CHECK(pg_quantize_row(PG_TYPE_IQ2_XXS, x, q, 256) == PG_ERR_UNSUPPORTED, "IQ2_XXS");
    CHECK(pg_quantize_row(PG_TYPE_Q4_0, x, q, 0) == PG_OK, "n = 0 is an empty row");
    CHECK(pg_quantize_row(PG_TYPE_Q4_0, x, q, 64) == PG_OK, "ok");
    CHECK(pg_quantize_row_act(PG_TYPE_Q8_0, x, q, 64) == PG_OK, "act ok");
    CHECK(pg_quantize_row_act(PG_TYPE_Q8_0, x, q, 48) == PG_ERR_INVALID_ARG, "act n %% 32 != 0");
    CHECK(pg_dequantize_row(PG_TYPE_Q8_1, q, out, 3) == PG_ERR_INVALID_ARG, "deq n %% 32 != 0");
    CHECK(pg_dequantize_row(PG_TYPE_F32, q, NULL, 1) == PG_ERR_INVALID_ARG, "deq NULL");
    CHECK(pg_dequantize_row(PG_TYPE_I32, q, out, 1) == PG_ERR_UNSUPPORTED, "I32 has no kernel");
    CHECK(pg_dequantize_row(PG_TYPE_F32, q, out, 4) == PG_OK, "deq f32");
    CHECK(pg_vec_dot_type(PG_TYPE_Q4_1) == PG_TYPE_Q8_1, "Q4_1 pairs with Q8_1");
    CHECK(pg_vec_dot_type(PG_TYPE_Q5_0) == PG_TYPE_Q8_0, "Q5_0 pairs with Q8_0");
    CHECK(pg_vec_dot_type(PG_TYPE_F16) == PG_TYPE_F16, "F16 pairs with F16");
    CHECK(pg_vec_dot_type(PG_TYPE_Q8_1) == -1, "Q8_1 has no dot kernel");
    CHECK(pg_vec_dot_type(99) == -1, "unknown type");
    CHECK(pg_vec_dot(PG_TYPE_Q8_1, 32, &s, q, q) == PG_ERR_UNSUPPORTED, "Q8_1 dot");
    CHECK(pg_vec_dot(PG_TYPE_Q4_0, 31, &s, q, q) == PG_ERR_INVALID_ARG, "dot n %% 32 != 0");
    CHECK(pg_vec_dot(PG_TYPE_Q4_0, 32, NULL, q, q) == PG_ERR_INVALID_ARG, "dot NULL s");
    CHECK(pg_vec_dot(PG_TYPE_Q4_0, 0, &s, q, q) == PG_OK && s == 0.0f, "empty dot");
    CHECK(pg_type_block_size(PG_TYPE_Q5_1) == 32 && pg_type_size(PG_TYPE_Q5_1) == 24, "Q5_1");
    CHECK(pg_type_block_size(PG_TYPE_Q8_1) == 32 && pg_type_size(PG_TYPE_Q8_1) == 36, "Q8_1");
    CHECK(pg_type_block_size(4) == 0 && pg_type_size(-3) == 0, "unknown types have no layout");
    const size_t ss = pg_matvec_scratch_size(PG_TYPE_Q4_0, 64);
    CHECK(ss == 68, "scratch for 64 Q8_0 activations: %zu", ss);
    CHECK(pg_matvec(PG_TYPE_Q4_0, 64, 2, q, 36, x, out, q + 128, ss - 1) == PG_ERR_INVALID_ARG,
          "small scratch");
    CHECK(pg_matvec(PG_TYPE_Q4_0, 64, 2, q, 35, x, out, q + 128, ss) == PG_ERR_INVALID_ARG,
          "short row stride");
    CHECK(pg_matvec(PG_TYPE_Q8_1, 64, 2, q, 72, x, out, q + 128, ss) == PG_ERR_UNSUPPORTED,
          "Q8_1 weights");
    CHECK(pg_matvec(PG_TYPE_Q4_0, 48, 2, q, 36, x, out, q + 128, ss) == PG_ERR_INVALID_ARG,
          "ne0 not a multiple of 32");
}

/* pg_matvec equals quantize-then-vec_dot row by row, with a padded row stride. */
PG_TEST(test_quants_api_matvec_matches_vec_dot) {
    const int32_t types[] = {PG_TYPE_Q4_0, PG_TYPE_Q4_1, PG_TYPE_Q5_0, PG_TYPE_Q5_1, PG_TYPE_Q8_0,
                             PG_TYPE_F16, PG_TYPE_BF16, PG_TYPE_F32};
    const int64_t ne0 = 128, nrows = 5;
    float *w = malloc(ne0 * nrows * 4), x[128], out[5];
    random_floats(w, ne0 * nrows, 3.0f, 0);
    random_floats(x, ne0, 2.0f, 1);
    for (int it = 0; it < 8; it++) {
        const int32_t type = types[it];
        const size_t rb = row_size(type, ne0), stride = rb + 8;
        unsigned char *wq = calloc(nrows, stride);
        for (int64_t r = 0; r < nrows; r++)
            CHECK(pg_quantize_row(type, w + r * ne0, wq + r * stride, ne0) == PG_OK, "quantize");
        const int32_t vt = pg_vec_dot_type(type);
        const size_t ss = pg_matvec_scratch_size(type, ne0);
        unsigned char *scratch = malloc(ss), *xq = malloc(ss);
        CHECK(pg_matvec(type, ne0, nrows, wq, stride, x, out, scratch, ss) == PG_OK, "matvec %s",
              type_name(type));
        CHECK(pg_quantize_row_act(vt, x, xq, ne0) == PG_OK, "act");
        for (int64_t r = 0; r < nrows; r++) {
            float want = 0;
            pg_vec_dot(type, ne0, &want, wq + r * stride, xq);
            CHECK(out[r] == want, "%s row %lld: %g vs %g", type_name(type), (long long)r,
                  (double)out[r], (double)want);
        }
        free(wq); free(scratch); free(xq);
    }
    free(w);
}

PG_TEST(test_quants_api_bench_read) {
    _Alignas(64) unsigned char buf[4096 + 64];
    memset(buf, 0, sizeof buf);
    CHECK(pg_bench_read(buf, sizeof buf) == 0, "zeros");
    memset(buf, 1, sizeof buf);
    /* 128 aligned bytes = 16 words of 0x0101010101010101 */
    CHECK(pg_bench_read(buf, 128) == 16 * 0x0101010101010101ULL, "aligned ones");
    CHECK(pg_bench_read(buf + 1, 15) == 15, "head bytes only");
    CHECK(pg_bench_read(NULL, 10) == 0, "NULL");
    /* random contents, offsets and lengths against the documented checksum, on every path */
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (unsigned char)rnd();
    const int32_t cur = pg_cpu_path();
    for (int rep = 0; rep < 64 * 4; rep++) {
        if (pg_set_cpu_path(rep % 4) != PG_OK) continue;
        const size_t off = rnd() % 64, len = rnd() % (sizeof buf - off);
        const unsigned char *p = buf + off;
        const size_t head = (64 - off % 64) % 64 < len ? (64 - off % 64) % 64 : len;
        const size_t mid = (len - head) / 64 * 64;
        uint64_t want = 0;
        for (size_t k = 0; k < head; k++) want += p[k];
        for (size_t k = head; k < head + mid; k += 8) {
            uint64_t w;
            memcpy(&w, p + k, 8);
            want += w;
        }
        for (size_t k = head + mid; k < len; k++) want += p[k];
        CHECK(pg_bench_read(p, len) == want, "path %d: checksum off %zu len %zu", rep % 4, off,
              len);
    }
    pg_set_cpu_path(cur);
}

/* Each variant really installs its own kernels (so the comparisons above test SIMD code). */
PG_TEST(test_legacy_simd_tables_filled) {
    variant paths[8];
    const int np = variants(paths);
    const int32_t types[] = {PG_TYPE_F32, PG_TYPE_F16, PG_TYPE_BF16, PG_TYPE_Q4_0, PG_TYPE_Q4_1,
                             PG_TYPE_Q5_0, PG_TYPE_Q5_1, PG_TYPE_Q8_0};
    for (int ip = 0; ip < np; ip++) {
        for (int it = 0; it < 8; it++) {
            const pg_type_traits *s = pg_get_type_traits_for_path(types[it], PG_PATH_SCALAR);
            const pg_type_traits *v = vtraits(&paths[ip], types[it]);
            CHECK(v->vec_dot && v->vec_dot != s->vec_dot, "%s %s: no SIMD dot", paths[ip].name,
                  type_name(types[it]));
            if (types[it] != PG_TYPE_F32)
                CHECK(v->to_float != s->to_float, "%s %s: no SIMD to_float", paths[ip].name,
                      type_name(types[it]));
        }
        CHECK(vtraits(&paths[ip], PG_TYPE_Q8_0)->from_float !=
              pg_get_type_traits_for_path(PG_TYPE_Q8_0, PG_PATH_SCALAR)->from_float,
              "%s: no SIMD Q8_0 quantizer", paths[ip].name);
        CHECK(vtraits(&paths[ip], PG_TYPE_Q8_1)->from_float !=
              pg_get_type_traits_for_path(PG_TYPE_Q8_1, PG_PATH_SCALAR)->from_float,
              "%s: no SIMD Q8_1 quantizer", paths[ip].name);
    }
#if defined(__aarch64__)
    if (pg_cpu_features() & PG_CPU_DOTPROD)
        CHECK(pg_get_type_traits_for_path(PG_TYPE_Q4_0, PG_PATH_NEON)->vec_dot !=
              vtraits(&paths[np - 1], PG_TYPE_Q4_0)->vec_dot, "dotprod kernels not installed");
#endif
}

/* No kernel reads past the end of its rows: each row ends exactly at a page followed by an
 * inaccessible page, for 1, 2, 4, 7, 8 and 33 blocks (kernels that step 4 or 8 blocks at a
 * time end a step exactly at the row's end for 4 and 8); a stray read crashes the test run. */
#include <sys/mman.h>
#include <unistd.h>

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

PG_TEST(test_legacy_kernels_stay_inside_rows) {
    variant paths[8];
    const int np = variants(paths);
    const int64_t nbs[] = {1, 2, 4, 7, 8, 33};
    for (int ip = 0; ip < np; ip++) {
        for (int it = 0; it < N_LEGACY; it++) {
            const int32_t type = LEGACY_TYPES[it];
            const pg_type_traits *v = vtraits(&paths[ip], type);
            const int32_t vtype = pg_get_type_traits_for_path(type, PG_PATH_SCALAR)->vec_dot_type;
            for (int in = 0; in < 6; in++) {
                const int64_t n = nbs[in] * pg_get_type_traits_for_path(type, 0)->block_size;
                void *mx, *my;
                size_t sx, sy;
                unsigned char *x = row_before_guard(row_size(type, n), &mx, &sx);
                unsigned char *y = row_before_guard(row_size(vtype, n), &my, &sy);
                CHECK(x && y, "mmap failed");
                if (!x || !y) return;
                make_row(type, n, x, 0);
                make_row(vtype, n, y, 0);
                float out[33 * 32], s = 0;
                v->to_float(x, out, n);
                if (v->vec_dot) v->vec_dot(n, &s, x, y);
                CHECK(s == s, "%s %s: NaN", paths[ip].name, type_name(type));
                munmap(mx, sx);
                munmap(my, sy);
            }
        }
    }
}
