/* K-quants (Q2_K..Q6_K, Q8_K): layouts, the scalar reference, and every SIMD path against it.
 *
 * Tolerances:
 *   - to_float, from_float_ref, Q8_K from_float: exact (bytes / fp32 bit patterns);
 *   - vec_dot with exactly representable data (all scales 1, small activations, every partial
 *     an integer below 2^24): exact, and equal to the integer dot of the levels;
 *   - vec_dot on random data: |simd - scalar| <= 1e-5 * S, where S = Σ_e (|scale part_e| +
 *     |min part_e|)·|a_e| bounds every intermediate the kernels round (fp32 has 2^-24 relative
 *     precision; a row of 7 blocks rounds at most a few dozen times).
 * SIMD paths are tested only where this CPU can run them (pg_set_cpu_path says so); the
 * previous path is restored afterwards. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fp16.h"
#include "kquants.h"
#include "pg_test.h"
#include "pg_test_dot8.h"
#include "pyggml.h"
#include "quants.h"

#define NT 5
static const int32_t k_wtypes[NT] = {PG_TYPE_Q2_K, PG_TYPE_Q3_K, PG_TYPE_Q4_K, PG_TYPE_Q5_K,
                                     PG_TYPE_Q6_K};
static const char *const k_wnames[NT] = {"q2_K", "q3_K", "q4_K", "q5_K", "q6_K"};
static const int k_row_blocks[3] = {1, 2, 7};
#define MAXB 7
#define MAXN (MAXB * PG_QK_K)

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd32(void) {
    g_rng ^= g_rng << 13; g_rng ^= g_rng >> 7; g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 16);
}
static float urand(void) { return (float)(rnd32() >> 8) / 16777216.0f; }     /* [0, 1) */
static float srand1(void) { return 2.0f * urand() - 1.0f; }                 /* [-1, 1) */

/* Offsets of the fp16 fields in each weight block: d, and dmin (-1 when the type has none). */
static void fp16_fields(int32_t type, int *d_off, int *dmin_off) {
    switch (type) {
    case PG_TYPE_Q2_K: *d_off = 80; *dmin_off = 82; break;
    case PG_TYPE_Q3_K: *d_off = 108; *dmin_off = -1; break;
    case PG_TYPE_Q4_K: case PG_TYPE_Q5_K: *d_off = 0; *dmin_off = 2; break;
    default: *d_off = 208; *dmin_off = -1; break;
    }
}

static void set_h(uint8_t *p, float v) { const uint16_t h = pg_fp32_to_fp16(v); memcpy(p, &h, 2); }

/* Random weight blocks: random bytes, fp16 fields set to finite values of either sign. */
static void random_blocks(int32_t type, uint8_t *buf, int nb) {
    const pg_type_traits *t = pg_get_type_traits_for_path(type, PG_PATH_SCALAR);
    int d_off, dmin_off;
    fp16_fields(type, &d_off, &dmin_off);
    for (int i = 0; i < nb * t->type_size; i++) buf[i] = (uint8_t)rnd32();
    for (int b = 0; b < nb; b++) {
        uint8_t *blk = buf + b * t->type_size;
        set_h(blk + d_off, srand1() * 0.05f);
        if (dmin_off >= 0) set_h(blk + dmin_off, srand1() * 0.05f);
    }
}

/* Q8_K blocks with scale 1 and levels in -r..r; bsums consistent. */
static void small_q8K(pg_block_q8_K *y, int nb, int r) {
    for (int b = 0; b < nb; b++) {
        y[b].d = 1.0f;
        for (int e = 0; e < PG_QK_K; e++) y[b].qs[e] = (int8_t)((int)(rnd32() % (2 * r + 1)) - r);
        for (int k = 0; k < 16; k++) {
            int s = 0;
            for (int t = 0; t < 16; t++) s += y[b].qs[16 * k + t];
            y[b].bsums[k] = (int16_t)s;
        }
    }
}

/* Rows that exercise the quantizers: plain, zeros, ties, huge and tiny magnitudes. */
static void edge_row(float *x, int n, int mode) {
    for (int i = 0; i < n; i++) {
        float v = srand1();
        switch (mode) {
        case 0: break;
        case 1: v = v * v * v * 7.0f; break;                                  /* heavy tails   */
        case 2: v = (float)((int)(rnd32() % 9) - 4); break;                   /* integers      */
        case 3: v = 0.5f * (float)((int)(rnd32() % 17) - 8); break;           /* halves: ties  */
        case 4: v = (i / PG_QK_K) % 2 ? 0.0f : v; break;                      /* zero blocks   */
        case 5: v = v * ((i / PG_QK_K) % 2 ? 1e-38f : 1e-30f); break;        /* tiny          */
        case 6: v = v * 1e15f; break;                                         /* fp16 overflow */
        case 7: v = (rnd32() % 4) ? 0.0f : v + 2.0f; break;                   /* sparse, > 0   */
        default: v = v < 0 ? -1.0f : 1.0f; break;                             /* ±1 only       */
        }
        x[i] = v;
    }
}
#define N_EDGE 9

/* ---- layout and the scalar reference ----------------------------------------------------- */

PG_TEST(test_kquant_traits) {
    static const int32_t types[6] = {PG_TYPE_Q2_K, PG_TYPE_Q3_K, PG_TYPE_Q4_K, PG_TYPE_Q5_K,
                                     PG_TYPE_Q6_K, PG_TYPE_Q8_K};
    static const int32_t sizes[6] = {84, 110, 144, 176, 210, 292};
    for (int i = 0; i < 6; i++) {
        const pg_type_traits *t = pg_get_type_traits_for_path(types[i], PG_PATH_SCALAR);
        CHECK(t && t->block_size == 256 && t->type_size == sizes[i], "type %d: %d/%d", types[i],
              t ? t->block_size : -1, t ? t->type_size : -1);
        CHECK(t && t->to_float && t->from_float_ref && t->from_float, "type %d kernels", types[i]);
        CHECK(t && t->vec_dot_type == PG_TYPE_Q8_K, "type %d vec_dot_type", types[i]);
        CHECK(t && (i == 5 ? t->vec_dot == NULL : t->vec_dot != NULL), "type %d vec_dot", types[i]);
    }
}

/* Dequantization re-derived element by element from docs/FORMATS.md §2.3 (independent
 * of the kernels' loop structure), compared bit for bit. */
static float deq_formula(int32_t type, const uint8_t *b, int e) {
    uint16_t h0, h1;
    const int n = e / 128, j = (e % 128) / 32, l = e % 32;
    switch (type) {
    case PG_TYPE_Q2_K: {
        memcpy(&h0, b + 80, 2); memcpy(&h1, b + 82, 2);
        const uint8_t sc = b[e / 16];
        const int q = (b[16 + 32 * n + l] >> (2 * j)) & 3;
        return (pg_fp16_to_fp32(h0) * (float)(sc & 0xF)) * (float)q -
               pg_fp16_to_fp32(h1) * (float)(sc >> 4);
    }
    case PG_TYPE_Q3_K: {
        memcpy(&h0, b + 108, 2);
        const uint8_t *s = b + 96;
        const int i = e / 16;
        const int low4 = (s[i % 8] >> (4 * (i / 8))) & 0xF;
        const int high2 = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        const int S = (low4 | (high2 << 4)) - 32;
        const int q2 = (b[32 + 32 * n + l] >> (2 * j)) & 3, hb = (b[l] >> (4 * n + j)) & 1;
        return (pg_fp16_to_fp32(h0) * (float)S) * (float)(q2 - (hb ? 0 : 4));
    }
    case PG_TYPE_Q4_K: case PG_TYPE_Q5_K: {
        memcpy(&h0, b, 2); memcpy(&h1, b + 2, 2);
        const uint8_t *s = b + 4;
        const int c = e / 64, sb = (e % 64) < 32 ? 2 * c : 2 * c + 1;
        int sc, m;
        if (sb < 4) { sc = s[sb] & 63; m = s[sb + 4] & 63; }
        else {
            sc = (s[sb + 4] & 0xF) | ((s[sb - 4] >> 6) << 4);
            m = (s[sb + 4] >> 4) | ((s[sb] >> 6) << 4);
        }
        const uint8_t *qs = b + (type == PG_TYPE_Q4_K ? 16 : 48);
        int q = (e % 64) < 32 ? qs[32 * c + l] & 0xF : qs[32 * c + l] >> 4;
        if (type == PG_TYPE_Q5_K) q |= ((b[16 + l] >> sb) & 1) << 4;
        return (pg_fp16_to_fp32(h0) * (float)sc) * (float)q - pg_fp16_to_fp32(h1) * (float)m;
    }
    default: {   /* Q6_K */
        memcpy(&h0, b + 208, 2);
        const int r = e % 128, g = r / 32;
        const uint8_t lb = b[64 * n + (g == 1 || g == 3 ? 32 : 0) + l];
        const int lo4 = g < 2 ? lb & 0xF : lb >> 4;
        const int hi2 = (b[128 + 32 * n + l] >> (2 * g)) & 3;
        const int q = (lo4 | (hi2 << 4)) - 32;
        return (pg_fp16_to_fp32(h0) * (float)(int8_t)b[192 + e / 16]) * (float)q;
    }
    }
}

PG_TEST(test_kquant_dequantize_formula) {
    static uint8_t buf[MAXB * 210];
    static float y[MAXN];
    for (int t = 0; t < NT; t++) {
        const pg_type_traits *tr = pg_get_type_traits_for_path(k_wtypes[t], PG_PATH_SCALAR);
        random_blocks(k_wtypes[t], buf, MAXB);
        tr->to_float(buf, y, MAXN);
        int bad = 0;
        for (int e = 0; e < MAXN; e++) {
            const float want = deq_formula(k_wtypes[t], buf + (e / 256) * tr->type_size, e % 256);
            if (memcmp(&want, &y[e], 4) != 0) bad++;
        }
        CHECK(bad == 0, "%s: %d values differ from the documented formula", k_wnames[t], bad);
    }
}

/* Quantize → dequantize keeps the signal (error relative to the row's rms), zero rows stay zero,
 * and quantizing twice gives the same bytes. */
PG_TEST(test_kquant_quantize_roundtrip) {
    static const double max_rel_rms[NT] = {0.45, 0.25, 0.12, 0.06, 0.03};
    static float x[MAXN], y[MAXN];
    static uint8_t q1[MAXB * 210], q2[MAXB * 210];
    for (int t = 0; t < NT; t++) {
        const pg_type_traits *tr = pg_get_type_traits_for_path(k_wtypes[t], PG_PATH_SCALAR);
        for (int i = 0; i < MAXN; i++) x[i] = srand1() + 0.3f * srand1();
        tr->from_float_ref(x, q1, MAXN);
        tr->from_float_ref(x, q2, MAXN);
        CHECK(memcmp(q1, q2, (size_t)(MAXB * tr->type_size)) == 0, "%s not deterministic",
              k_wnames[t]);
        tr->to_float(q1, y, MAXN);
        double err = 0, ref = 0;
        for (int i = 0; i < MAXN; i++) {
            err += (double)(x[i] - y[i]) * (x[i] - y[i]);
            ref += (double)x[i] * x[i];
        }
        const double rel = sqrt(err / ref);
        CHECK(rel < max_rel_rms[t], "%s: relative rms error %.4f >= %.2f", k_wnames[t], rel,
              max_rel_rms[t]);
        memset(x, 0, sizeof(x));
        tr->from_float_ref(x, q1, MAXN);
        tr->to_float(q1, y, MAXN);
        int nonzero = 0;
        for (int i = 0; i < MAXN; i++) nonzero += y[i] != 0.0f;
        CHECK(nonzero == 0, "%s: zero row dequantizes to %d non-zeros", k_wnames[t], nonzero);
    }
}

PG_TEST(test_kquant_q8K_reference) {
    static float x[2 * PG_QK_K];
    static pg_block_q8_K y[2];
    const pg_type_traits *tr = pg_get_type_traits_for_path(PG_TYPE_Q8_K, PG_PATH_SCALAR);
    /* block 0: max = 127 exactly, so iscale = -1 and the halves are ties (to even);
     * block 1: all zero */
    for (int i = 0; i < PG_QK_K; i++) x[i] = (float)(i % 64) - 31.5f;
    x[7] = 127.0f;
    x[8] = -127.0f;          /* same |x|, later index: max stays +127 */
    for (int i = PG_QK_K; i < 2 * PG_QK_K; i++) x[i] = 0.0f;
    memset(y, 0x5a, sizeof(y));
    tr->from_float(x, y, 2 * PG_QK_K);
    CHECK(y[0].d == -1.0f, "d %g", (double)y[0].d);
    CHECK(y[0].qs[7] == -127 && y[0].qs[8] == 127, "extremes %d %d", y[0].qs[7], y[0].qs[8]);
    /* x = k - 31.5, iscale·x = 31.5 - k: ties to even */
    CHECK(y[0].qs[0] == 32 && y[0].qs[1] == 30 && y[0].qs[2] == 30 && y[0].qs[3] == 28,
          "ties: %d %d %d %d", y[0].qs[0], y[0].qs[1], y[0].qs[2], y[0].qs[3]);
    int bs_ok = 1;
    for (int k = 0; k < 16; k++) {
        int s = 0;
        for (int t = 0; t < 16; t++) s += y[0].qs[16 * k + t];
        bs_ok &= s == y[0].bsums[k];
        bs_ok &= y[1].bsums[k] == 0;
    }
    CHECK(bs_ok, "bsums");
    int z = 1;
    for (int e = 0; e < PG_QK_K; e++) z &= y[1].qs[e] == 0;
    CHECK(z && y[1].d == 0.0f, "zero block");
}

/* The scalar dot equals the float64 dot of the dequantized operands (both exact inputs). */
PG_TEST(test_kquant_scalar_dot) {
    static uint8_t w[MAXB * 210];
    static pg_block_q8_K a[MAXB];
    static float xa[MAXN], wf[MAXN], af[MAXN];
    const pg_type_traits *q8 = pg_get_type_traits_for_path(PG_TYPE_Q8_K, PG_PATH_SCALAR);
    for (int t = 0; t < NT; t++) {
        const pg_type_traits *tr = pg_get_type_traits_for_path(k_wtypes[t], PG_PATH_SCALAR);
        for (int r = 0; r < 3; r++) {
            const int nb = k_row_blocks[r], n = nb * PG_QK_K;
            random_blocks(k_wtypes[t], w, nb);
            for (int i = 0; i < n; i++) xa[i] = srand1();
            q8->from_float(xa, a, n);
            tr->to_float(w, wf, n);
            q8->to_float(a, af, n);
            double want = 0, mag = 0;
            for (int i = 0; i < n; i++) {
                want += (double)wf[i] * af[i];
                mag += fabs((double)wf[i] * af[i]);
            }
            float got = 0;
            tr->vec_dot(n, &got, w, a);
            CHECK(fabs(got - want) <= 1e-5 * mag + 1e-30, "%s nb=%d: %.9g vs %.9g (mag %g)",
                  k_wnames[t], nb, (double)got, want, mag);
        }
    }
}

/* ---- every SIMD path against the scalar one ---------------------------------------------- */

/* S = Σ_e (|scale part| + |min part|)·|a_e|: the scale part is the row dequantized with dmin=0,
 * the min part with d=0. */
static double dot_magnitude(int32_t type, const uint8_t *w, const pg_block_q8_K *a, int nb) {
    static uint8_t tmp[MAXB * 210];
    static float part[MAXN], af[MAXN];
    const pg_type_traits *tr = pg_get_type_traits_for_path(type, PG_PATH_SCALAR);
    const int n = nb * PG_QK_K;
    int d_off, dmin_off;
    fp16_fields(type, &d_off, &dmin_off);
    pg_get_type_traits_for_path(PG_TYPE_Q8_K, PG_PATH_SCALAR)->to_float(a, af, n);
    double s = 0;
    for (int pass = 0; pass < (dmin_off >= 0 ? 2 : 1); pass++) {
        memcpy(tmp, w, (size_t)(nb * tr->type_size));
        if (dmin_off >= 0) {
            const int off = pass ? d_off : dmin_off;
            for (int b = 0; b < nb; b++) set_h(tmp + b * tr->type_size + off, 0);
        }
        tr->to_float(tmp, part, n);
        for (int i = 0; i < n; i++) s += fabs((double)part[i] * af[i]);
    }
    return s;
}

/* A kernel table to check: a path's table, or (tbl != NULL) one filled here, so that the plain
 * NEON kernels are tested even on a CPU whose neon path uses the dotprod ones. */
typedef struct {
    const char *name;
    int32_t path;
    const pg_type_traits *tbl;
} kq_variant;

static const pg_type_traits *variant_traits(const kq_variant *v, int32_t type) {
    return v->tbl ? &v->tbl[type] : pg_get_type_traits_for_path(type, v->path);
}

static void check_path(const kq_variant *var) {
    const char *pname = var->name;
    static uint8_t w[MAXB * 292], qa[MAXB * 292], qb[MAXB * 292];
    static pg_block_q8_K a[MAXB];
    static float x[MAXN], ya[MAXN], yb[MAXN];
    for (int t = 0; t < NT + 1; t++) {
        const int32_t type = t < NT ? k_wtypes[t] : PG_TYPE_Q8_K;
        const char *name = t < NT ? k_wnames[t] : "q8_K";
        const pg_type_traits *ts = pg_get_type_traits_for_path(type, PG_PATH_SCALAR);
        const pg_type_traits *tp = variant_traits(var, type);
        CHECK(tp != NULL, "%s: no %s table", name, pname);
        if (!tp) continue;
        for (int r = 0; r < 3; r++) {
            const int nb = k_row_blocks[r], n = nb * PG_QK_K;
            const size_t bytes = (size_t)(nb * ts->type_size);
            /* quantizers (reference and fast) and dequantization: exact on edge rows */
            for (int mode = 0; mode < N_EDGE; mode++) {
                edge_row(x, n, mode);
                memset(qa, 0x11, bytes); memset(qb, 0x22, bytes);
                ts->from_float_ref(x, qa, n);
                tp->from_float_ref(x, qb, n);
                CHECK(memcmp(qa, qb, bytes) == 0, "%s %s nb=%d mode %d: from_float_ref differs",
                      pname, name, nb, mode);
                memset(qb, 0x22, bytes);
                tp->from_float(x, qb, n);
                CHECK(memcmp(qa, qb, bytes) == 0, "%s %s nb=%d mode %d: from_float differs",
                      pname, name, nb, mode);
                ts->to_float(qa, ya, n);
                tp->to_float(qa, yb, n);
                CHECK(memcmp(ya, yb, (size_t)n * 4) == 0, "%s %s nb=%d mode %d: to_float differs",
                      pname, name, nb, mode);
            }
            if (type == PG_TYPE_Q8_K) continue;
            /* exactly representable dots: d = dmin = 1, activations -2..2, scale 1 */
            random_blocks(type, w, nb);
            int d_off, dmin_off;
            fp16_fields(type, &d_off, &dmin_off);
            for (int b = 0; b < nb; b++) {
                set_h(w + b * ts->type_size + d_off, 1.0f);
                if (dmin_off >= 0) set_h(w + b * ts->type_size + dmin_off, 1.0f);
            }
            small_q8K(a, nb, 2);
            ts->to_float(w, ya, n);
            double exact = 0;
            for (int i = 0; i < n; i++) exact += (double)ya[i] * a[i / PG_QK_K].qs[i % PG_QK_K];
            float fs = -1, fp = -2;
            ts->vec_dot(n, &fs, w, a);
            tp->vec_dot(n, &fp, w, a);
            CHECK(fs == fp && (double)fs == exact, "%s %s nb=%d exact dot: scalar %.9g %s %.9g, "
                  "integer %.0f", pname, name, nb, (double)fs, pname, (double)fp, exact);
            /* random data */
            for (int rep = 0; rep < 4; rep++) {
                random_blocks(type, w, nb);
                for (int i = 0; i < n; i++) x[i] = srand1() * (rep + 1);
                pg_get_type_traits_for_path(PG_TYPE_Q8_K, PG_PATH_SCALAR)->from_float(x, a, n);
                ts->vec_dot(n, &fs, w, a);
                tp->vec_dot(n, &fp, w, a);
                const double mag = dot_magnitude(type, w, a, nb);
                CHECK(fabs((double)fs - fp) <= 1e-5 * mag, "%s %s nb=%d: scalar %.9g %s %.9g "
                      "(S %.3g)", pname, name, nb, (double)fs, pname, (double)fp, mag);
            }
        }
    }
}

PG_TEST(test_kquant_simd_paths) {
    const int32_t prev = pg_cpu_path();
    static const char *names[4] = {"scalar", "avx2", "avx512", "neon"};
    int tested = 0;
    for (int32_t p = PG_PATH_AVX2; p <= PG_PATH_NEON; p++) {
        if (!pg_path_compiled(p) || pg_set_cpu_path(p) != PG_OK) continue;
        pg_set_cpu_path(prev);
        const kq_variant v = {names[p], p, NULL};
        check_path(&v);
        tested++;
    }
#if defined(__aarch64__)
    /* the neon path above uses the dotprod kernels where the CPU has them: check the plain ones */
    static pg_type_traits plain[PG_TYPE_COUNT];
    for (int32_t t = 0; t < PG_TYPE_COUNT; t++) plain[t] = *pg_get_type_traits_for_path(t, 0);
    pg_fill_kquants_neon(plain, PG_CPU_NEON);
    const kq_variant v = {"neon-plain", PG_PATH_NEON, plain};
    check_path(&v);
    tested++;
    CHECK(pg_get_type_traits_for_path(PG_TYPE_Q4_K, PG_PATH_NEON)->vec_dot !=
              plain[PG_TYPE_Q4_K].vec_dot ||
          !(pg_cpu_features() & PG_CPU_DOTPROD), "dotprod CPU without the dotprod kernels");
#endif
    pg_set_cpu_path(prev);
    CHECK(pg_cpu_path() == prev, "path not restored");
    printf("    (kquant SIMD kernel sets tested: %d)\n", tested);
}

/* vec_dot8 at the ends of the integer ranges: weight rows whose every byte is 0xFF (the top
 * levels, scales and mins: 15, 31, 63 and Q6_K's scale -1), 0x00 (Q6_K's level -32), alternating
 * bytes of 0x7F / 0x80 (Q6_K's scales +127 / -128) or random; activations mostly -128 (valid
 * bytes, never made by the quantizer), some 127 and 0, bsums as the quantizer sets them. Every
 * path's vec_dot8, 1..PG_DOT8_MAX_NC activation rows, has the scalar vec_dot's bits: the
 * row-major AVX-512 kernels pack sums of four products into int16 words (|·| ≤ 4·63·128, or
 * 4·32·128 with Q6_K's offset) and must not saturate. */
PG_TEST(test_kquant_vec_dot8_extremes) {
    enum { NB = 3 };
    static uint8_t w[8][NB * 256];
    static pg_block_q8_K a[PG_DOT8_MAX_NC][NB];
    int tested = 0;
    for (int it = 0; it < NT; it++) {
        const int32_t type = k_wtypes[it];
        const pg_type_traits *ts = pg_get_type_traits_for_path(type, PG_PATH_SCALAR);
        const size_t bsz = ts->type_size, row = NB * bsz;
        const int64_t n = NB * PG_QK_K;
        int d_off, m_off;
        fp16_fields(type, &d_off, &m_off);
        for (int i = 0; i < 8; i++) {
            for (size_t k = 0; k < row; k++) {
                const int kind = (i + (int)(k / bsz)) % 4;
                w[i][k] = kind == 0 ? 0xFF : kind == 1 ? 0x00 : kind == 2 ? (k % 2 ? 0x7F : 0x80)
                                                                           : (uint8_t)rnd32();
            }
            for (int b = 0; b < NB; b++) {
                set_h(&w[i][(size_t)b * bsz + (size_t)d_off], 0.01f * (float)(i + 1));
                if (m_off >= 0)
                    set_h(&w[i][(size_t)b * bsz + (size_t)m_off], 0.003f * (float)(8 - i));
            }
        }
        for (int j = 0; j < PG_DOT8_MAX_NC; j++)
            for (int b = 0; b < NB; b++) {
                pg_block_q8_K *q = &a[j][b];
                q->d = 0.0125f * (float)(j + 1);
                for (int e = 0; e < PG_QK_K; e++) {
                    const uint32_t r = rnd32() % 8;   /* mostly -128, some 127 and 0 */
                    q->qs[e] = (int8_t)(r < 5   ? -128
                                        : r == 5 ? 127
                                        : r == 6 ? 0
                                                 : (int)(rnd32() % 256) - 128);
                }
                for (int g = 0; g < 16; g++) {
                    int sum = 0;
                    for (int e = 0; e < 16; e++) sum += q->qs[16 * g + e];
                    q->bsums[g] = (int16_t)sum;
                }
            }
        tested += pg_test_dot8_paths(type, n, w, sizeof(w[0]), a, sizeof(a[0]), PG_DOT8_MAX_NC,
                                     k_wnames[it]);
    }
#if defined(__x86_64__)
    CHECK(tested > 0, "no path has a K-quant vec_dot8");
#endif
}
