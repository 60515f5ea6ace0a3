/* Multi-row dot kernels (pg_type_traits.gemm): every gemm of every path this CPU can run against
 * the scalar pairwise vec_dot, on blocks of every shape nr × nc up to PG_GEMM_MAX_NR ×
 * PG_GEMM_MAX_NC (odd ones included),
 * rows of 1, 2, 7 blocks (legacy formats also 4, 5, 8 and 33: the SIMD kernels step 4 blocks at
 * a time), strided rows and outputs.
 *
 * What batching must not change (a token's MUL_MAT row computed among other tokens' rows, by a
 * gemm, has the bits of the same row computed alone, by vec_dot), all bit for bit (memcmp):
 *   - every gemm of every path equals the scalar vec_dot, and every vec_dot of every path the
 *     scalar vec_dot (the kernels repeat the scalar reference's fp32 operations in its order on
 *     exact integer block sums), on random data of every shape, odd ones included;
 *   - with every scale 1 (and integer mins / sums), all block terms are exact integers, which
 *     pins the integer sums;
 *   - a dot does not depend on the block it is computed in (shape, position);
 *   - MUL_MAT with n activation rows, 1 or 2 threads, odd sizes: every output equals the
 *     single-row (n = 1) MUL_MAT of that row;
 *   - nothing is written outside the nr × nc outputs, nothing read past the rows. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fp16.h"
#include "gemm.h"
#include "kquants.h"
#include "ops.h"
#include "pg_test.h"
#include "pyggml.h"
#include "quants.h"
#include "quants_legacy.h"

static uint64_t g_rng = 0x243F6A8885A308D3ull;
static uint64_t rnd(void) { return pg_test_splitmix(&g_rng); }
static float rndf(void) { return pg_test_unit(rnd()); }   /* uniform in [-1, 1) */

static const int32_t k_types[] = {PG_TYPE_Q4_0, PG_TYPE_Q4_1, PG_TYPE_Q5_0, PG_TYPE_Q5_1,
                                  PG_TYPE_Q8_0, PG_TYPE_Q2_K, PG_TYPE_Q3_K, PG_TYPE_Q4_K,
                                  PG_TYPE_Q5_K, PG_TYPE_Q6_K};
#define N_TYPES ((int)(sizeof(k_types) / sizeof(k_types[0])))
/* what every path must have */
static const int32_t k_required[] = {PG_TYPE_Q4_0, PG_TYPE_Q5_0, PG_TYPE_Q8_0, PG_TYPE_Q4_K,
                                     PG_TYPE_Q6_K};

static const char *tname(int32_t t) {
    switch (t) {
    case PG_TYPE_Q4_0: return "Q4_0"; case PG_TYPE_Q4_1: return "Q4_1";
    case PG_TYPE_Q5_0: return "Q5_0"; case PG_TYPE_Q5_1: return "Q5_1";
    case PG_TYPE_Q8_0: return "Q8_0"; case PG_TYPE_Q2_K: return "Q2_K";
    case PG_TYPE_Q3_K: return "Q3_K"; case PG_TYPE_Q4_K: return "Q4_K";
    case PG_TYPE_Q5_K: return "Q5_K"; case PG_TYPE_Q6_K: return "Q6_K";
    default: return "?";
    }
}

static const pg_type_traits *scalar_tr(int32_t type) {
    return pg_get_type_traits_for_path(type, PG_PATH_SCALAR);
}
static int is_k(int32_t type) { return scalar_tr(type)->block_size == PG_QK_K; }

/* Block counts per row tested for a type. */
static int block_counts(int32_t type, int *out) {
    static const int leg[] = {1, 2, 4, 5, 7, 8, 33}, kq[] = {1, 2, 7};
    const int *src = is_k(type) ? kq : leg;
    const int n = is_k(type) ? 3 : 7;
    memcpy(out, src, (size_t)n * sizeof(int));
    return n;
}

/* ---- data ------------------------------------------------------------------------------------ */

/* Offsets of the fp16 fields of a weight block: d and the second one (m / dmin; -1: none). */
static void fp16_fields(int32_t type, int *d_off, int *m_off) {
    *d_off = 0;
    *m_off = -1;
    switch (type) {
    case PG_TYPE_Q4_1: case PG_TYPE_Q5_1: *m_off = 2; break;
    case PG_TYPE_Q2_K: *d_off = 80; *m_off = 82; break;
    case PG_TYPE_Q3_K: *d_off = 108; break;
    case PG_TYPE_Q4_K: case PG_TYPE_Q5_K: *m_off = 2; break;
    case PG_TYPE_Q6_K: *d_off = 208; break;
    default: break;
    }
}

static void set_h(uint8_t *p, float v) { const pg_fp16 h = pg_fp32_to_fp16(v); memcpy(p, &h, 2); }

/* A weight row of nb blocks. Legacy: random floats through the reference quantizer (Q8_0 also
 * raw random bytes, −128 included). K-quants: random bytes with finite fp16 fields. */
static void weight_row(int32_t type, uint8_t *w, int nb) {
    const pg_type_traits *t = scalar_tr(type);
    const int n = nb * t->block_size;
    if (is_k(type)) {
        int d_off, m_off;
        fp16_fields(type, &d_off, &m_off);
        for (int i = 0; i < nb * t->type_size; i++) w[i] = (uint8_t)rnd();
        for (int b = 0; b < nb; b++) {
            set_h(w + b * t->type_size + d_off, rndf() * 0.05f);
            if (m_off >= 0) set_h(w + b * t->type_size + m_off, rndf() * 0.05f);
        }
        return;
    }
    float *x = malloc((size_t)n * sizeof(float));
    const float scale = (float)(1 << (rnd() % 8));
    for (int i = 0; i < n; i++) x[i] = rnd() % 16 == 0 ? 0.0f : rndf() * scale;
    t->from_float_ref(x, w, n);
    if (type == PG_TYPE_Q8_0 && rnd() % 2) {
        pg_block_q8_0 *b = (pg_block_q8_0 *)w;
        for (int k = 0; k < nb; k++)
            for (int j = 0; j < PG_QK32; j++) b[k].qs[j] = (int8_t)(rnd() & 0xff);
    }
    free(x);
}

/* An activation row of nb blocks in the vec_dot_type (the scalar quantizer of random floats). */
static void act_row(int32_t type, uint8_t *y, int nb) {
    const pg_type_traits *t = scalar_tr(type);
    const int n = nb * t->block_size;
    float *x = malloc((size_t)n * sizeof(float));
    const float scale = (float)(1 << (rnd() % 6));
    for (int i = 0; i < n; i++) x[i] = rnd() % 16 == 0 ? 0.0f : rndf() * scale;
    scalar_tr(t->vec_dot_type)->from_float_ref(x, y, n);
    free(x);
}

/* Rows whose every block term is an exact integer: all d (and dmin) 1, integer m / s, K-quant
 * activations with scale 1 and levels in −2..2. */
static void exact_rows(int32_t type, uint8_t *w, uint8_t *y, int nb) {
    const pg_type_traits *t = scalar_tr(type);
    const int32_t vt = t->vec_dot_type;
    const int ts = t->type_size, vs = scalar_tr(vt)->type_size;
    int d_off, m_off;
    fp16_fields(type, &d_off, &m_off);
    for (int i = 0; i < nb * ts; i++) w[i] = (uint8_t)rnd();
    for (int b = 0; b < nb; b++) {
        set_h(w + b * ts + d_off, 1.0f);
        if (m_off >= 0)
            set_h(w + b * ts + m_off, is_k(type) ? 1.0f : (float)((int)(rnd() % 7) - 3));
    }
    if (vt == PG_TYPE_Q8_K) {
        pg_block_q8_K *a = (pg_block_q8_K *)y;
        for (int b = 0; b < nb; b++) {
            a[b].d = 1.0f;
            for (int e = 0; e < PG_QK_K; e++) a[b].qs[e] = (int8_t)((int)(rnd() % 5) - 2);
            for (int g = 0; g < 16; g++) {
                int s = 0;
                for (int e = 0; e < 16; e++) s += a[b].qs[16 * g + e];
                a[b].bsums[g] = (int16_t)s;
            }
        }
        return;
    }
    for (int i = 0; i < nb * vs; i++) y[i] = (uint8_t)rnd();
    for (int b = 0; b < nb; b++) {
        set_h(y + b * vs, 1.0f);
        if (vt == PG_TYPE_Q8_1) set_h(y + b * vs + 2, (float)((int)(rnd() % 2001) - 1000));
        /* activations in −127..127, what every Q8 quantizer produces */
        for (int j = vs - 32; j < vs; j++)
            if (y[b * vs + j] == 0x80) y[b * vs + j] = 0x81;
    }
}

/* ---- the bound S of the float rounding ------------------------------------------------------- */

static double magnitude(int32_t type, const uint8_t *w, const uint8_t *y, int nb) {
    const pg_type_traits *t = scalar_tr(type);
    const pg_type_traits *vt = scalar_tr(t->vec_dot_type);
    const int ts = t->type_size, vs = vt->type_size, bsz = t->block_size;
    int d_off, m_off;
    fp16_fields(type, &d_off, &m_off);
    uint8_t wb[292], yb[292];
    float wf[PG_QK_K], yf[PG_QK_K];
    double mag = 0.0;
    for (int b = 0; b < nb; b++) {
        if (is_k(type)) {
            vt->to_float(y + b * vs, yf, bsz);
            for (int pass = 0; pass < (m_off >= 0 ? 2 : 1); pass++) {
                memcpy(wb, w + b * ts, (size_t)ts);
                if (m_off >= 0) set_h(wb + (pass ? d_off : m_off), 0.0f);
                t->to_float(wb, wf, bsz);
                for (int e = 0; e < bsz; e++) mag += fabs((double)wf[e] * yf[e]);
            }
            continue;
        }
        /* legacy: |d_x·d_y|·Σ|q_x·q_y| + |m_x·s_y|, levels decoded with d = 1, m = 0 */
        pg_fp16 h;
        memcpy(wb, w + b * ts, (size_t)ts);
        memcpy(yb, y + b * vs, (size_t)vs);
        memcpy(&h, wb, 2);
        const double dx = pg_fp16_to_fp32(h);
        memcpy(&h, yb, 2);
        const double dy = pg_fp16_to_fp32(h);
        double mx = 0, sy = 0;
        if (m_off >= 0) {
            memcpy(&h, wb + 2, 2);
            mx = pg_fp16_to_fp32(h);
            memcpy(&h, yb + 2, 2);
            sy = pg_fp16_to_fp32(h);
            set_h(wb + 2, 0.0f);
        }
        set_h(wb, 1.0f);
        set_h(yb, 1.0f);
        t->to_float(wb, wf, 32);
        vt->to_float(yb, yf, 32);
        double s = 0;
        for (int e = 0; e < 32; e++) s += fabs((double)wf[e] * yf[e]);
        mag += fabs(dx * dy) * s + fabs(mx * sy);
    }
    return mag;
}

/* ---- variants: the tables to test ------------------------------------------------------------ */

typedef struct {
    const char *name;
    const pg_type_traits *tbl;   /* PG_TYPE_COUNT entries */
} variant;

static int variants(variant *out) {
    static const char *names[] = {"scalar", "avx2", "avx512", "neon", "amx"};
    const int32_t cur = pg_cpu_path();
    int n = 0;
    for (int32_t p = PG_PATH_SCALAR; p < PG_PATH_COUNT; p++)
        if (pg_path_compiled(p) && pg_set_cpu_path(p) == PG_OK)
            out[n++] = (variant){names[p], pg_get_type_traits_for_path(0, p)};
    pg_set_cpu_path(cur);
#if defined(__x86_64__)
    /* the avx2 path installs the AVX-VNNI form of its gemms where the CPU has it (and
     * PYGGML_AVXVNNI is not 0): both forms, whichever the path took */
    if (pg_set_cpu_path(PG_PATH_AVX2) == PG_OK) {
        pg_set_cpu_path(cur);
        static pg_type_traits plain[PG_TYPE_COUNT], vnni[PG_TYPE_COUNT];
        for (int32_t t = 0; t < PG_TYPE_COUNT; t++)
            plain[t] = vnni[t] = *pg_get_type_traits_for_path(t, PG_PATH_AVX2);
        pg_fill_gemm_avx2_for(plain, 0);
        out[n++] = (variant){"avx2-no-vnni", plain};
        if (pg_cpu_features() & PG_CPU_AVXVNNI) {
            pg_fill_gemm_avx2_for(vnni, PG_CPU_AVXVNNI);
            out[n++] = (variant){"avx2-vnni", vnni};
        }
    }
#endif
#if defined(__aarch64__)
    /* the neon path uses the dotprod kernels where the CPU has them: the plain ones too */
    static pg_type_traits plain[PG_TYPE_COUNT];
    for (int32_t t = 0; t < PG_TYPE_COUNT; t++) plain[t] = *pg_get_type_traits_for_path(t, 0);
    pg_fill_gemm_neon(plain, PG_CPU_NEON);
    out[n++] = (variant){"neon-no-dotprod", plain};
#endif
    return n;
}

/* ---- a block of rows ------------------------------------------------------------------------- */

#define MAXR PG_GEMM_MAX_NR   /* weight rows */
#define MAXC PG_GEMM_MAX_NC   /* activation rows */
#define OUTS 11                /* output row stride (floats) of the tests' blocks */
#define ROWMAX 2048   /* bytes of the longest row: 7 × 292 (Q8_K), 33 × 36 (Q8_1) */
#define PAD 8         /* bytes between rows (a multiple of 4: the block structs' alignment) */

typedef struct {
    int32_t type;
    int nb;
    size_t wrow, yrow, bx, by;
    uint8_t w[MAXR * (ROWMAX + PAD)];
    uint8_t y[MAXC * (ROWMAX + PAD)];
} rowset;

static void rowset_init(rowset *r, int32_t type, int nb, int pad) {
    const pg_type_traits *t = scalar_tr(type);
    r->type = type;
    r->nb = nb;
    r->wrow = (size_t)nb * (size_t)t->type_size;
    r->yrow = (size_t)nb * (size_t)scalar_tr(t->vec_dot_type)->type_size;
    r->bx = r->wrow + (size_t)pad;
    r->by = r->yrow + (size_t)pad;
}

static int64_t rowset_n(const rowset *r) { return (int64_t)r->nb * scalar_tr(r->type)->block_size; }

/* want[j][i] = scalar vec_dot(weight row i, activation row j) */
static void reference(const rowset *r, float want[MAXC][MAXR]) {
    for (int j = 0; j < MAXC; j++)
        for (int i = 0; i < MAXR; i++)
            scalar_tr(r->type)->vec_dot(rowset_n(r), &want[j][i], r->w + i * r->bx,
                                        r->y + j * r->by);
}

/* Runs gemm on rows (i0.., j0..) as an nr × nc block into an output of row stride OUTS floats
 * pre-filled with a guard value; checks nothing else was written. got[j][i] for the block. */
static int run_block(pg_gemm_fn gemm, const rowset *r, int i0, int j0, int nr, int nc,
                     float got[MAXC][MAXR]) {
    float out[MAXC * OUTS];
    const float guard = -12345.678f;
    for (int k = 0; k < MAXC * OUTS; k++) out[k] = guard;
    gemm(rowset_n(r), out, OUTS * sizeof(float), r->w + i0 * r->bx, r->bx, r->y + j0 * r->by,
         r->by, nr, nc);
    int clean = 1;
    for (int j = 0; j < MAXC; j++)
        for (int k = 0; k < OUTS; k++) {
            if (j < nc && k < nr) got[j][k] = out[j * OUTS + k];
            else clean &= out[j * OUTS + k] == guard;
        }
    return clean;
}

/* ---- tests ----------------------------------------------------------------------------------- */

PG_TEST(test_gemm_tables) {
    variant v[8];
    const int nv = variants(v);
    for (int iv = 0; iv < nv; iv++) {
        for (int k = 0; k < (int)(sizeof(k_required) / sizeof(k_required[0])); k++)
            CHECK(v[iv].tbl[k_required[k]].gemm != NULL, "%s: no %s gemm", v[iv].name,
                  tname(k_required[k]));
        for (int it = 0; it < N_TYPES; it++) {
            const pg_type_traits *t = &v[iv].tbl[k_types[it]];
            CHECK(t->vec_dot_type == scalar_tr(k_types[it])->vec_dot_type, "%s %s vec_dot_type",
                  v[iv].name, tname(k_types[it]));
            if (iv > 0 && t->gemm)   /* a SIMD path never falls back to the scalar gemm */
                CHECK(t->gemm != scalar_tr(k_types[it])->gemm, "%s %s: scalar gemm installed",
                      v[iv].name, tname(k_types[it]));
        }
    }
    CHECK(pg_get_type_traits_for_path(PG_TYPE_F32, PG_PATH_SCALAR)->gemm == NULL, "F32 gemm?");
}

/* Every shape of block against the scalar vec_dot (random data, strided rows, guarded output). */
PG_TEST(test_gemm_matches_vec_dot) {
    variant v[8];
    const int nv = variants(v);
    static rowset r;
    int counts[8];
    for (int iv = 0; iv < nv; iv++) {
        for (int it = 0; it < N_TYPES; it++) {
            const int32_t type = k_types[it];
            const pg_gemm_fn gemm = v[iv].tbl[type].gemm;
            if (!gemm) continue;
            const int nbc = block_counts(type, counts);
            for (int ic = 0; ic < nbc; ic++) {
                rowset_init(&r, type, counts[ic], (ic % 2) * PAD);
                for (int i = 0; i < MAXR; i++) weight_row(type, r.w + i * r.bx, r.nb);
                for (int j = 0; j < MAXC; j++) act_row(type, r.y + j * r.by, r.nb);
                float want[MAXC][MAXR], got[MAXC][MAXR];
                reference(&r, want);
                for (int nr = 1; nr <= MAXR; nr++) {
                    for (int nc = 1; nc <= MAXC; nc++) {
                        const int i0 = MAXR - nr, j0 = (nr + nc) % (MAXC - nc + 1);
                        CHECK(run_block(gemm, &r, i0, j0, nr, nc, got),
                              "%s %s %d blocks %dx%d: wrote outside the block", v[iv].name,
                              tname(type), r.nb, nr, nc);
                        for (int j = 0; j < nc; j++)
                            for (int i = 0; i < nr; i++) {
                                const float a = want[j0 + j][i0 + i], b = got[j][i];
                                /* the scalar vec_dot's bits, and so the path's own vec_dot's
                                 * (test_vec_dot_bits_on_every_path) */
                                CHECK(memcmp(&a, &b, 4) == 0, "%s %s %d blocks %dx%d (%d,%d): "
                                      "%.9g vs vec_dot %.9g", v[iv].name, tname(type), r.nb, nr,
                                      nc, i, j, (double)b, (double)a);
                            }
                    }
                }
            }
        }
    }
}

/* All block terms exact integers: every gemm equals the scalar vec_dot exactly. */
PG_TEST(test_gemm_integer_parts_exact) {
    variant v[8];
    const int nv = variants(v);
    static rowset r;
    int counts[8];
    for (int iv = 0; iv < nv; iv++) {
        for (int it = 0; it < N_TYPES; it++) {
            const int32_t type = k_types[it];
            const pg_gemm_fn gemm = v[iv].tbl[type].gemm;
            if (!gemm) continue;
            const int nbc = block_counts(type, counts);
            for (int ic = 0; ic < nbc; ic++) {
                rowset_init(&r, type, counts[ic], 0);
                for (int k = 0; k < MAXR; k++)
                    exact_rows(type, r.w + k * r.bx, r.y + (k % MAXC) * r.by, r.nb);
                float want[MAXC][MAXR], got[MAXC][MAXR];
                reference(&r, want);
                run_block(gemm, &r, 0, 0, MAXR, MAXC, got);
                int ok = 1;
                for (int j = 0; j < MAXC; j++)
                    for (int i = 0; i < MAXR; i++)
                        ok &= got[j][i] == want[j][i] && want[j][i] == floorf(want[j][i]);
                CHECK(ok, "%s %s %d blocks: integer dots differ (e.g. %.1f vs %.1f)", v[iv].name,
                      tname(type), r.nb, (double)got[0][0], (double)want[0][0]);
            }
        }
    }
}

/* A dot is the same bits whatever block computes it: every shape at every position against
 * the full block. */
PG_TEST(test_gemm_independent_of_tiling) {
    variant v[8];
    const int nv = variants(v);
    static rowset r;
    for (int iv = 0; iv < nv; iv++) {
        for (int it = 0; it < N_TYPES; it++) {
            const int32_t type = k_types[it];
            const pg_gemm_fn gemm = v[iv].tbl[type].gemm;
            if (!gemm) continue;
            rowset_init(&r, type, is_k(type) ? 2 : 7, 0);
            for (int i = 0; i < MAXR; i++) weight_row(type, r.w + i * r.bx, r.nb);
            for (int j = 0; j < MAXC; j++) act_row(type, r.y + j * r.by, r.nb);
            float full[MAXC][MAXR], got[MAXC][MAXR];
            run_block(gemm, &r, 0, 0, MAXR, MAXC, full);
            int same = 1;
            for (int nr = 1; nr <= MAXR; nr++)
                for (int nc = 1; nc <= MAXC; nc++)
                    for (int i0 = 0; i0 + nr <= MAXR; i0++)
                        for (int j0 = 0; j0 + nc <= MAXC; j0++) {
                            run_block(gemm, &r, i0, j0, nr, nc, got);
                            for (int j = 0; j < nc; j++)
                                for (int i = 0; i < nr; i++)
                                    same &= memcmp(&got[j][i], &full[j0 + j][i0 + i], 4) == 0;
                        }
            CHECK(same, "%s %s: a dot depends on its block", v[iv].name, tname(type));
        }
    }
}

/* No kernel reads past its rows: the block's last weight row and last activation row each end
 * exactly at an inaccessible page (a stray read crashes the run). */
static uint8_t *rows_before_guard(size_t bytes, void **map, size_t *map_size) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t data_pages = (bytes + page - 1) / page;
    *map_size = (data_pages + 1) * page;
    uint8_t *m = mmap(NULL, *map_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return NULL;
    mprotect(m + data_pages * page, page, PROT_NONE);
    *map = m;
    return m + data_pages * page - bytes;
}

PG_TEST(test_gemm_stays_inside_rows) {
    variant v[8];
    const int nv = variants(v);
    int counts[8];
    for (int iv = 0; iv < nv; iv++) {
        for (int it = 0; it < N_TYPES; it++) {
            const int32_t type = k_types[it];
            const pg_gemm_fn gemm = v[iv].tbl[type].gemm;
            if (!gemm) continue;
            const pg_type_traits *t = scalar_tr(type);
            const int nbc = block_counts(type, counts);
            for (int ic = 0; ic < nbc; ic++) {
                const int nb = counts[ic];
                const size_t wrow = (size_t)nb * (size_t)t->type_size;
                const size_t yrow = (size_t)nb * (size_t)scalar_tr(t->vec_dot_type)->type_size;
                for (int shape = 0; shape < 4; shape++) {
                    static const int shapes[4][2] = {{1, 4}, {3, 2}, {4, 1}, {MAXR, MAXC}};
                    const int nr = shapes[shape][0], nc = shapes[shape][1];
                    void *mw, *my;
                    size_t sw, sy;
                    uint8_t *w = rows_before_guard(wrow * (size_t)nr, &mw, &sw);
                    uint8_t *y = rows_before_guard(yrow * (size_t)nc, &my, &sy);
                    CHECK(w && y, "mmap failed");
                    if (!w || !y) return;
                    for (int i = 0; i < nr; i++) weight_row(type, w + (size_t)i * wrow, nb);
                    for (int j = 0; j < nc; j++) act_row(type, y + (size_t)j * yrow, nb);
                    float out[MAXC * MAXR];
                    gemm((int64_t)nb * t->block_size, out, MAXR * sizeof(float), w, wrow, y, yrow,
                         nr, nc);
                    int finite = 1;
                    for (int k = 0; k < nc; k++)
                        for (int i = 0; i < nr; i++)
                            finite &= out[MAXR * k + i] == out[MAXR * k + i];
                    CHECK(finite, "%s %s: NaN", v[iv].name, tname(type));
                    munmap(mw, sw);
                    munmap(my, sy);
                }
            }
        }
    }
}

/* Every vec_dot of every path equals the scalar vec_dot bit for bit, so decode (n = 1) gives the
 * same bits as the gemm of a batch on every path (and across paths). */
PG_TEST(test_vec_dot_bits_on_every_path) {
    variant v[8];
    const int nv = variants(v);
    static rowset r;
    static const int counts[] = {1, 2, 3, 7, 8, 9, 16, 17, 33};
    for (int iv = 0; iv < nv; iv++) {
        for (int it = 0; it < N_TYPES; it++) {
            const int32_t type = k_types[it];
            for (int ic = 0; ic < (int)(sizeof(counts) / sizeof(counts[0])); ic++) {
                const int nb = is_k(type) ? (counts[ic] + 1) / 2 : counts[ic];
                if ((size_t)nb * scalar_tr(scalar_tr(type)->vec_dot_type)->type_size > ROWMAX)
                    continue;
                rowset_init(&r, type, nb, 0);
                weight_row(type, r.w, r.nb);
                act_row(type, r.y, r.nb);
                float want, got;
                scalar_tr(type)->vec_dot(rowset_n(&r), &want, r.w, r.y);
                v[iv].tbl[type].vec_dot(rowset_n(&r), &got, r.w, r.y);
                CHECK(memcmp(&want, &got, 4) == 0, "%s %s vec_dot, %d blocks: %.9g vs scalar "
                      "%.9g", v[iv].name, tname(type), nb, (double)got, (double)want);
            }
        }
    }
}

/* ---- MUL_MAT: a row among others = the row alone ------------------------------------------ */

static void mm_tensor(pg_tensor *t, int32_t type, int32_t op, int64_t ne0, int64_t ne1,
                      void *data) {
    memset(t, 0, sizeof(*t));
    const pg_type_traits *tr = scalar_tr(type);
    t->type = type;
    t->op = op;
    t->ne[0] = ne0; t->ne[1] = ne1; t->ne[2] = 1; t->ne[3] = 1;
    t->nb[0] = tr->type_size;
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

/* On every path this CPU runs, for every weight type with a dot kernel (the quantized ones go
 * through vec_dot8 up to PG_DOT8_MAX_NC rows where the type has it and through the gemm beyond,
 * the float ones through vec_dot): a batch of M activation rows,
 * with 1 and 2 threads, gives each row exactly the bits of that row alone (M = 1, 1 thread).
 * Odd N and M (partial gemm blocks, uneven thread splits), M on both sides of the decode
 * threshold where each thread converts the activations itself. */
PG_TEST(test_mul_mat_row_independent_of_batch) {
    static const int32_t types[] = {PG_TYPE_Q4_0, PG_TYPE_Q4_1, PG_TYPE_Q5_0, PG_TYPE_Q5_1,
                                    PG_TYPE_Q8_0, PG_TYPE_Q2_K, PG_TYPE_Q3_K, PG_TYPE_Q4_K,
                                    PG_TYPE_Q5_K, PG_TYPE_Q6_K, PG_TYPE_F16, PG_TYPE_F32};
    static const int64_t Ms[] = {2, 3, 4, 5, 8, 9, 19, 35};
    enum { K = 768, N = 37, MMAX = 35 };
    const int32_t cur = pg_cpu_path();
    pg_threadpool *tp = pg_threadpool_new(2);
    CHECK(tp != NULL, "thread pool");
    float *x = malloc(sizeof(float) * K * MMAX);
    float *batch = malloc(sizeof(float) * N * MMAX), *alone = malloc(sizeof(float) * N);
    uint8_t *w = malloc((size_t)N * pg_type_row_size(PG_TYPE_F32, K));
    for (int32_t path = PG_PATH_SCALAR; path < PG_PATH_COUNT; path++) {
        if (!pg_path_compiled(path) || pg_set_cpu_path(path) != PG_OK) continue;
        for (int it = 0; it < (int)(sizeof(types) / sizeof(types[0])); it++) {
            const int32_t type = types[it];
            const size_t rb = pg_type_row_size(type, K);
            if (type == PG_TYPE_F32 || type == PG_TYPE_F16) {
                for (int i = 0; i < N * K; i++) {
                    const float v = rndf();
                    if (type == PG_TYPE_F32) memcpy(w + 4 * (size_t)i, &v, 4);
                    else {
                        const pg_fp16 h = pg_fp32_to_fp16(v);
                        memcpy(w + 2 * (size_t)i, &h, 2);
                    }
                }
            } else {
                for (int i = 0; i < N; i++)
                    weight_row(type, w + (size_t)i * rb, K / scalar_tr(type)->block_size);
            }
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
                    CHECK(same, "path %d %s M=%d %d threads: a row differs from the row alone",
                          (int)path, scalar_tr(type)->block_size == 1 ? "float" : tname(type),
                          (int)M, nth);
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

/* vec_dot8 (decode, eight weight rows at a time, 1..PG_DOT8_MAX_NC activation rows) on every
 * path that has it: each result has the scalar vec_dot's bits, for rows of 1, 2, 7, 20 (Gemma's
 * output rows) and 33 blocks, with output and activation rows at padded strides; the weight
 * rows right before a guard page (nothing read past the eighth row), the activation rows too
 * (nothing read past row nc), and nothing written outside the nc output rows. */
PG_TEST(test_vec_dot8_bits_and_bounds) {
    variant v[8];
    const int nv = variants(v);
    static const int counts[] = {1, 2, 7, 20, 33};
    int tested = 0;
    for (int iv = 0; iv < nv; iv++) {
        for (int it = 0; it < N_TYPES; it++) {
            const int32_t type = k_types[it];
            const pg_vec_dot8_fn dot8 = v[iv].tbl[type].vec_dot8;
            if (!dot8) continue;
            const pg_type_traits *t = scalar_tr(type);
            for (int ic = 0; ic < 5; ic++)
                for (int nc = 1; nc <= PG_DOT8_MAX_NC; nc++) {
                    const int nb = counts[ic];
                    const size_t wrow = (size_t)nb * (size_t)t->type_size;
                    const size_t yrow = (size_t)nb * (size_t)scalar_tr(t->vec_dot_type)->type_size;
                    const size_t ystride = yrow + 8 * (size_t)(nc > 1);   /* padded rows */
                    const size_t ybytes = ystride * (size_t)(nc - 1) + yrow;
                    void *mw, *my;
                    size_t sw, sy;
                    uint8_t *w = rows_before_guard(wrow * 8, &mw, &sw);
                    uint8_t *y = rows_before_guard(ybytes, &my, &sy);
                    CHECK(w && y, "mmap failed");
                    if (!w || !y) return;
                    for (int i = 0; i < 8; i++) weight_row(type, w + (size_t)i * wrow, nb);
                    for (int j = 0; j < nc; j++) act_row(type, y + (size_t)j * ystride, nb);
                    const int64_t n = (int64_t)nb * t->block_size;
                    enum { S = 11 };   /* output row stride in floats: 8 dots and 3 guards */
                    float got[PG_DOT8_MAX_NC + 1][S], want[PG_DOT8_MAX_NC + 1][S];
                    for (int j = 0; j <= PG_DOT8_MAX_NC; j++)
                        for (int i = 0; i < S; i++) got[j][i] = want[j][i] = -7.25f;
                    dot8(n, &got[0][0], sizeof(got[0]), w, wrow, y, ystride, nc);
                    for (int j = 0; j < nc; j++)
                        for (int i = 0; i < 8; i++)
                            t->vec_dot(n, &want[j][i], w + (size_t)i * wrow,
                                       y + (size_t)j * ystride);
                    CHECK(memcmp(got, want, sizeof(got)) == 0, "%s %s %d blocks, %d activation "
                          "rows: vec_dot8 differs from the scalar vec_dot (or wrote outside)",
                          v[iv].name, tname(type), nb, nc);
                    tested++;
                    munmap(mw, sw);
                    munmap(my, sy);
                }
        }
    }
#if defined(__x86_64__)
    CHECK(tested > 0, "no path has a vec_dot8 kernel");
#endif
}
