/* The recurrent ops' per-path kernels (ops_ssm.h) against the scalar ones: the gated delta rule
 * run through 12 tokens on blocks of rows (state, outputs within float tolerance of the scalar
 * kernel, each path's result independent of how the rows are blocked), the short convolution
 * bit for bit (the same operations in the same order on every path). */
#include <math.h>
#include <string.h>

#include "ops_ssm.h"
#include "pg_test.h"
#include "pyggml.h"

static uint64_t g_rng = 33;
static float urand(void) { return pg_test_unit(pg_test_splitmix(&g_rng)); }

static int path_usable(int32_t path) {
    const int32_t was = pg_cpu_path();
    const int ok = pg_set_cpu_path(path) == PG_OK;
    pg_set_cpu_path(was);
    return ok;
}

enum { NTOK = 12, MAXD = 133, MAXR = 19 };

/* nt tokens of the delta rule on n rows of Dk, called on blocks of `blk` rows; o [NTOK][MAXR] */
static void run_delta(const pg_ssm_kernels *kn, int64_t Dk, int64_t n, int64_t blk, float *state,
                      const float *k, const float *q, const float *v, const float *g,
                      const float *b, float *o) {
    for (int64_t r0 = 0; r0 < n; r0 += blk)
        for (int t = 0; t < NTOK; t++)
            kn->delta_rows(Dk, n - r0 < blk ? n - r0 : blk, state + r0 * Dk, k + t * MAXD,
                           q + t * MAXD, v + t * MAXR + r0, expf(g[t]), b[t], 0.125f,
                           o + t * MAXR + r0);
}

PG_TEST(test_ssm_delta_rows_match_scalar) {
    const pg_ssm_kernels *ref = pg_get_ssm_kernels_for_path(PG_PATH_SCALAR);
    static float k[NTOK * MAXD], q[NTOK * MAXD], v[NTOK * MAXR], g[NTOK], b[NTOK];
    static float s0[MAXR * MAXD], s1[MAXR * MAXD], s2[MAXR * MAXD], init[MAXR * MAXD];
    static float o0[NTOK * MAXR], o1[NTOK * MAXR], o2[NTOK * MAXR];
    for (int i = 0; i < NTOK * MAXD; i++) { k[i] = urand(); q[i] = urand(); }
    for (int i = 0; i < NTOK * MAXR; i++) v[i] = urand();
    for (int t = 0; t < NTOK; t++) { g[t] = -0.3f * fabsf(urand()); b[t] = 0.5f + 0.4f * urand(); }
    for (int i = 0; i < MAXR * MAXD; i++) init[i] = 0.3f * urand();
    for (int32_t path = 1; path < PG_PATH_COUNT; path++) {
        const pg_ssm_kernels *kn = pg_get_ssm_kernels_for_path(path);
        if (!kn || !path_usable(path)) continue;
        const int64_t Ds[] = {1, 3, 4, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 128, 133};
        for (size_t di = 0; di < sizeof(Ds) / sizeof(Ds[0]); di++) {
            const int64_t Dk = Ds[di], n = MAXR;
            /* k l2-normed as the models feed it: the recurrence stays bounded */
            static float kn_[NTOK * MAXD];
            for (int t = 0; t < NTOK; t++) {
                double ss = 0;
                for (int64_t e = 0; e < Dk; e++) ss += (double)k[t * MAXD + e] * k[t * MAXD + e];
                for (int64_t e = 0; e < Dk; e++)
                    kn_[t * MAXD + e] = k[t * MAXD + e] / (float)sqrt(ss);
            }
            memcpy(s0, init, sizeof(init));
            memcpy(s1, init, sizeof(init));
            memcpy(s2, init, sizeof(init));
            run_delta(ref, Dk, n, n, s0, kn_, q, v, g, b, o0);
            run_delta(kn, Dk, n, n, s1, kn_, q, v, g, b, o1);
            run_delta(kn, Dk, n, 5, s2, kn_, q, v, g, b, o2);
            for (int64_t i = 0; i < n * Dk; i++)
                CHECK(fabsf(s0[i] - s1[i]) <= 2e-5f * (1.0f + fabsf(s0[i])),
                      "path %d Dk %lld state %lld: %g vs %g", path, (long long)Dk, (long long)i,
                      s0[i], s1[i]);
            for (int t = 0; t < NTOK; t++)
                for (int64_t r = 0; r < n; r++) {
                    const float want = o0[t * MAXR + r], got = o1[t * MAXR + r];
                    CHECK(fabsf(want - got) <= 2e-5f * (1.0f + sqrtf((float)Dk)),
                          "path %d Dk %lld token %d row %lld: %g vs %g", path, (long long)Dk, t,
                          (long long)r, want, got);
                }
            CHECK(memcmp(s1, s2, sizeof(s1)) == 0 && memcmp(o1, o2, sizeof(o1)) == 0,
                  "path %d Dk %lld: rows blocked by 5 differ from one block", path, (long long)Dk);
        }
    }
}

PG_TEST(test_ssm_conv_rows_match_scalar_bits) {
    const pg_ssm_kernels *ref = pg_get_ssm_kernels_for_path(PG_PATH_SCALAR);
    enum { N = 70, NK = 5 };
    static float hist[NK][N], x[N], w[(NK + 1) * 80], y0[N], y1[N];
    for (int j = 0; j < NK; j++)
        for (int c = 0; c < N; c++) hist[j][c] = urand();
    for (int c = 0; c < N; c++) x[c] = urand();
    for (int i = 0; i < (NK + 1) * 80; i++) w[i] = urand();
    hist[0][3] = -0.0f;                          /* 0 + (-0)·w: the sign of a zero sum too */
    const float *h[NK];
    for (int j = 0; j < NK; j++) h[j] = hist[j];
    for (int32_t path = 1; path < PG_PATH_COUNT; path++) {
        const pg_ssm_kernels *kn = pg_get_ssm_kernels_for_path(path);
        if (!kn || !path_usable(path)) continue;
        for (int64_t nk = 1; nk <= NK; nk++)
            for (int64_t n = 1; n <= N; n += (n < 20 ? 1 : 7)) {
                memset(y0, 0, sizeof(y0)); memset(y1, 0, sizeof(y1));
                ref->conv_rows(n, nk, h, x, w, 80, y0);
                kn->conv_rows(n, nk, h, x, w, 80, y1);
                CHECK(memcmp(y0, y1, sizeof(y0)) == 0, "path %d conv nk %lld n %lld differs",
                      path, (long long)nk, (long long)n);
            }
    }
}
