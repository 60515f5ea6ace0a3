/* FLASH_ATTN_EXT: the per-path inner kernels (attn.h) against the scalar ones, and the whole op
 * on every path against a float64 reference (q rounded to fp16 as the F16 K dots see it),
 * with GQA, several key blocks, a causal mask with a hole, softcap, ALiBi, 1 and 2 threads. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "fp16.h"
#include "ops.h"
#include "pg_test.h"
#include "pyggml.h"

static float frand(void) { return (float)rand() / (float)RAND_MAX * 2.0f - 1.0f; }

static int path_usable(int32_t path) {
    const int32_t was = pg_cpu_path();
    const int ok = pg_set_cpu_path(path) == PG_OK;
    pg_set_cpu_path(was);
    return ok;
}

PG_TEST(test_attn_kernels_match_scalar) {
    const pg_attn_kernels *ref = pg_get_attn_kernels_for_path(PG_PATH_SCALAR);
    static float q[9 * 260], k[9 * 260], v[9 * 260], p[9 * 16], ms[9];
    static float s0[9 * 16], s1[9 * 16], a0[9 * 260], a1[9 * 260], e0[40], e1[40];
    static uint16_t h[70000];
    static float f0[70000], f1[70000];
    srand(11);
    for (int i = 0; i < 9 * 260; i++) { q[i] = frand(); k[i] = frand(); v[i] = frand(); }
    for (int i = 0; i < 9 * 16; i++) p[i] = frand() > 0 ? frand() * frand() : 0.0f;
    for (int i = 0; i < 9; i++) ms[i] = i == 3 ? 0.0f : 0.5f + 0.1f * (float)i;
    for (int32_t path = 1; path < PG_PATH_COUNT; path++) {
        const pg_attn_kernels *kn = pg_get_attn_kernels_for_path(path);
        if (!kn || !path_usable(path)) continue;
        const int64_t Ds[] = {1, 7, 8, 15, 16, 33, 64, 200, 256};
        for (size_t di = 0; di < sizeof(Ds) / sizeof(Ds[0]); di++) {
            const int64_t D = Ds[di];
            for (int64_t nr = 1; nr <= 9; nr++)
                for (int64_t nc = 1; nc <= 9; nc++) {
                    /* rows D + 3 floats apart: no alignment assumed */
                    ref->qk(D, nr, nc, q, D + 3, k, D + 3, s0, 16);
                    kn->qk(D, nr, nc, q, D + 3, k, D + 3, s1, 16);
                    for (int64_t r = 0; r < nr; r++)
                        for (int64_t c = 0; c < nc; c++) {
                            double mag = 0;
                            for (int64_t i = 0; i < D; i++)
                                mag += fabs((double)q[r * (D + 3) + i] * k[c * (D + 3) + i]);
                            CHECK(fabs(s0[r * 16 + c] - s1[r * 16 + c]) <= 1e-6 * mag + 1e-30,
                                  "path %d qk D %lld nr %lld nc %lld (%lld,%lld): %g vs %g", path,
                                  (long long)D, (long long)nr, (long long)nc, (long long)r,
                                  (long long)c, s0[r * 16 + c], s1[r * 16 + c]);
                        }
                    for (int i = 0; i < 9 * 260; i++) a0[i] = a1[i] = 0.25f * (float)(i % 7) - 0.7f;
                    ref->pv(D, nr, nc, p, 16, v, D + 3, ms, a0, 260);
                    kn->pv(D, nr, nc, p, 16, v, D + 3, ms, a1, 260);
                    for (int64_t r = 0; r < 9; r++)
                        for (int64_t x = 0; x < 260; x++) {
                            const float want = a0[r * 260 + x], got = a1[r * 260 + x];
                            CHECK(fabsf(want - got) <= 1e-5f, "path %d pv D %lld nr %lld nc %lld "
                                  "(%lld,%lld): %g vs %g", path, (long long)D, (long long)nr,
                                  (long long)nc, (long long)r, (long long)x, want, got);
                        }
                }
        }
        /* exp: within 3 ulp-ish of libm on (-inf, 0], exactly 0 for -inf and far below */
        for (int64_t n = 1; n <= 40; n++) {
            for (int64_t i = 0; i < n; i++) e0[i] = e1[i] = frand() * 30.0f - 5.0f;
            e0[0] = e1[0] = -INFINITY;
            if (n > 2) e0[2] = e1[2] = -200.0f;
            const float m = 25.0f;
            const float t0 = ref->exp_sum(e0, n, m), t1 = kn->exp_sum(e1, n, m);
            for (int64_t i = 0; i < n; i++)
                CHECK(fabsf(e0[i] - e1[i]) <= 4e-7f * e0[i], "path %d exp(%g): %g vs %g", path,
                      (double)(e1[i] - m), e0[i], e1[i]);
            CHECK(e1[0] == 0.0f && (n <= 2 || e1[2] == 0.0f), "path %d exp(-inf)", path);
            CHECK(fabsf(t0 - t1) <= 1e-6f * t0 + 1e-30f, "path %d exp sum %g vs %g", path, t0, t1);
        }
        /* silu: within a few ulp of libm's x / (1 + expf(-x)), over the range models produce and
         * the far tails (x = ±100: x and −0 up to a denormal-sized term), every tail length */
        for (int64_t n = 1; n <= 40; n++) {
            float xs[40], y0[40], y1[40];
            for (int64_t i = 0; i < n; i++) xs[i] = frand() * 40.0f - 20.0f;
            xs[0] = 100.0f;
            if (n > 1) xs[1] = -100.0f;
            if (n > 2) xs[2] = 0.0f;
            ref->silu(xs, y0, n);
            kn->silu(xs, y1, n);
            for (int64_t i = 0; i < n; i++)
                CHECK(fabsf(y0[i] - y1[i]) <= 6e-7f * fabsf(y0[i]) + 1e-30f,
                      "path %d silu(%g): %g vs %g", path, (double)xs[i], y0[i], y1[i]);
        }
        /* scale + mask + max: a few ulp (the SIMD form fuses the multiply-add); -inf kept */
        for (int64_t n = 1; n <= 40; n++) {
            static float mk[40];
            for (int64_t i = 0; i < n; i++) {
                e0[i] = e1[i] = frand() * 10.0f;
                mk[i] = i % 3 == 1 ? -INFINITY : frand();
            }
            for (int with_mask = 0; with_mask < 2; with_mask++) {
                for (int64_t i = 0; i < n; i++) e1[i] = e0[i];
                static float w0[40];
                memcpy(w0, e0, sizeof(w0));
                const float m0 = ref->scale_max(w0, n, 0.3f, with_mask ? mk : NULL, 1.7f);
                const float m1 = kn->scale_max(e1, n, 0.3f, with_mask ? mk : NULL, 1.7f);
                for (int64_t i = 0; i < n; i++)
                    CHECK(w0[i] == e1[i] || fabsf(w0[i] - e1[i]) <= 1e-6f * (fabsf(w0[i]) + 1.7f),
                          "path %d scale_max [%lld]: %g vs %g", path, (long long)i, w0[i], e1[i]);
                CHECK(m0 == m1 || fabsf(m0 - m1) <= 1e-6f * (fabsf(m0) + 1.7f),
                      "path %d scale_max n %lld: max %g vs %g", path, (long long)n, m0, m1);
            }
        }
        /* fp16 conversions, bit for bit: every fp16 value, and values around fp16's range */
        for (int i = 0; i < 65536; i++) h[i] = (uint16_t)i;
        ref->f16_to_f32(h, f0, 65536);
        kn->f16_to_f32(h, f1, 65535 + 1);
        int bad = 0;
        for (int i = 0; i < 65536; i++)
            bad += isnan(f0[i]) ? !isnan(f1[i]) : memcmp(&f0[i], &f1[i], 4) != 0;
        CHECK(bad == 0, "path %d f16_to_f32: %d values differ", path, bad);
        for (int i = 0; i < 70000; i++) {
            const float mag = powf(2.0f, (float)(rand() % 48 - 30));
            f0[i] = frand() * mag;
        }
        f0[0] = 65519.0f; f0[1] = 65520.0f; f0[2] = -1e-8f; f0[3] = 5.9604645e-08f * 1.5f;
        static float r0[70000], r1[70000];
        for (int64_t n = 69993; n <= 70000; n += 7) {
            ref->round_f16(f0, r0, n);
            kn->round_f16(f0, r1, n);
            CHECK(memcmp(r0, r1, (size_t)n * 4) == 0, "path %d round_f16 n %lld", path, (long long)n);
        }
    }
}

/* ---- the whole op -------------------------------------------------------------------------- */

enum { FD = 72, FDV = 40, FNQ = 21, FH = 8, FHKV = 2, FNKV = 150, FNQP = 24 };

static void set_t(pg_tensor *t, int32_t type, int32_t op, const int64_t ne[4], void *data) {
    memset(t, 0, sizeof(*t));
    t->type = type;
    t->op = op;
    const int64_t es = type == PG_TYPE_F16 ? 2 : 4;
    for (int i = 0; i < 4; i++) t->ne[i] = ne[i];
    t->nb[0] = es;
    for (int i = 1; i < 4; i++) t->nb[i] = t->nb[i - 1] * ne[i - 1];
    for (int i = 0; i < PG_MAX_SRC; i++) t->src[i] = -1;
    t->data = data;
}

/* out[Dv, H, n_q] for q [D, n_q, H], k [D, n_kv, Hkv] / v [Dv, n_kv, Hkv] in F16, mask F16 */
static void fa_run(pg_threadpool *tp, int nth, const float *q, const pg_fp16 *k,
                   const pg_fp16 *v, const pg_fp16 *m, float scale, float max_bias,
                   float softcap, float *out) {
    pg_tensor t[5];
    const int64_t nq[4] = {FD, FNQ, FH, 1}, nk[4] = {FD, FNKV, FHKV, 1};
    const int64_t nv[4] = {FDV, FNKV, FHKV, 1}, nm[4] = {FNKV, FNQP, 1, 1};
    const int64_t no[4] = {FDV, FH, FNQ, 1};
    set_t(&t[0], PG_TYPE_F32, PG_OP_NONE, nq, (void *)q);
    set_t(&t[1], PG_TYPE_F16, PG_OP_NONE, nk, (void *)k);
    set_t(&t[2], PG_TYPE_F16, PG_OP_NONE, nv, (void *)v);
    set_t(&t[3], PG_TYPE_F16, PG_OP_NONE, nm, (void *)m);
    set_t(&t[4], PG_TYPE_F32, PG_OP_FLASH_ATTN_EXT, no, out);
    for (int i = 0; i < 4; i++) t[4].src[i] = i;
    memcpy(&t[4].op_params[0], &scale, 4);
    memcpy(&t[4].op_params[1], &max_bias, 4);
    memcpy(&t[4].op_params[2], &softcap, 4);
    const int32_t order[1] = {4};
    size_t ws = 0;
    int32_t bad = -1;
    CHECK(pg_graph_work_size(t, 5, order, 1, 2, &ws) == PG_OK, "work size");
    void *work = calloc(1, ws + 64);
    CHECK(pg_graph_compute(t, 5, order, 1, tp, nth, work, ws, NULL, NULL, &bad) == PG_OK,
          "flash attention computes (bad node %d)", bad);
    free(work);
}

PG_TEST(test_flash_attn_paths_against_reference) {
    static float q[FD * FNQ * FH], out1[FDV * FH * FNQ], out2[FDV * FH * FNQ];
    static pg_fp16 k[FD * FNKV * FHKV], v[FDV * FNKV * FHKV], m[FNKV * FNQP];
    static double ref[FDV * FH * FNQ], sc[FNKV];
    srand(5);
    for (int i = 0; i < FD * FNQ * FH; i++) q[i] = frand();
    for (int i = 0; i < FD * FNKV * FHKV; i++) k[i] = pg_fp32_to_fp16(frand());
    for (int i = 0; i < FDV * FNKV * FHKV; i++) v[i] = pg_fp32_to_fp16(frand());
    /* causal with the queries at the end of the cache, a sliding-window hole in query 3, and
     * the whole first key block hidden from every query (skipped) */
    for (int i = 0; i < FNQP; i++)
        for (int j = 0; j < FNKV; j++) {
            const int hidden = j > FNKV - FNQ + i || j < 64 || (i == 3 && j < 100);
            m[i * FNKV + j] = pg_fp32_to_fp16(hidden ? -INFINITY : 0.01f * (float)(j % 5));
        }
    pg_threadpool *tp = pg_threadpool_new(2);
    const float cases[3][3] = {{0.125f, 0.0f, 0.0f}, {0.3f, 0.0f, 20.0f}, {0.125f, 8.0f, 0.0f}};
    for (int ci = 0; ci < 3; ci++) {
        const float scale = cases[ci][0], max_bias = cases[ci][1], softcap = cases[ci][2];
        double maxref = 0;
        for (int iq = 0; iq < FNQ; iq++)
            for (int ih = 0; ih < FH; ih++) {
                const int hk = ih / (FH / FHKV);
                /* ALiBi with H = 8 heads: n_head_log2 = 8, slope m0^(h+1), m0 = 2^(-max_bias/8) */
                const double slope = max_bias > 0 ? pow(pow(2.0, -max_bias / 8.0), ih + 1) : 1.0;
                double mx = -INFINITY;
                for (int j = 0; j < FNKV; j++) {
                    double d = 0;
                    for (int x = 0; x < FD; x++)
                        d += (double)pg_fp16_to_fp32(pg_fp32_to_fp16(q[(ih * FNQ + iq) * FD + x])) *
                             pg_fp16_to_fp32(k[(hk * FNKV + j) * FD + x]);
                    d *= scale;
                    if (softcap != 0.0f) d = softcap * tanh(d / softcap);
                    sc[j] = d + slope * pg_fp16_to_fp32(m[iq * FNKV + j]);
                    if (sc[j] > mx) mx = sc[j];
                }
                double tot = 0;
                for (int j = 0; j < FNKV; j++) { sc[j] = exp(sc[j] - mx); tot += sc[j]; }
                for (int x = 0; x < FDV; x++) {
                    double a = 0;
                    for (int j = 0; j < FNKV; j++)
                        a += sc[j] * pg_fp16_to_fp32(v[(hk * FNKV + j) * FDV + x]);
                    ref[(iq * FH + ih) * FDV + x] = a / tot;
                    if (fabs(a / tot) > maxref) maxref = fabs(a / tot);
                }
            }
        for (int32_t path = 0; path < PG_PATH_COUNT; path++) {
            if (!path_usable(path)) continue;
            pg_set_cpu_path(path);
            fa_run(tp, 1, q, k, v, m, scale, max_bias, softcap, out1);
            fa_run(tp, 2, q, k, v, m, scale, max_bias, softcap, out2);
            CHECK(memcmp(out1, out2, sizeof(out1)) == 0, "path %d case %d: 1 and 2 threads differ",
                  path, ci);
            double err = 0;
            for (int i = 0; i < FDV * FH * FNQ; i++) {
                const double e = fabs(out1[i] - ref[i]);
                if (!(e <= err)) err = e;
            }
            CHECK(err <= 2e-6 * maxref, "path %d case %d: max error %g (max |ref| %g)", path, ci,
                  err, maxref);
        }
    }
    pg_threadpool_free(tp);
}

/* ---- batch invariance ------------------------------------------------------------------------ */

enum { BD = 64, BH = 4, BHKV = 2, BKV = 200, BQA = 7, BQB = 5 };

/* out[Dv = BD, BH, n_q] of q [BD, n_q, BH], k / v [BD, n_kv, BHKV] F16, mask [n_kv, n_q] F16 */
static void fa_any(pg_threadpool *tp, int nth, int64_t n_q, int64_t n_kv, const float *q,
                   const pg_fp16 *k, const pg_fp16 *v, const pg_fp16 *m, float *out) {
    pg_tensor t[5];
    const int64_t nq[4] = {BD, n_q, BH, 1}, nk[4] = {BD, n_kv, BHKV, 1};
    const int64_t nm[4] = {n_kv, n_q, 1, 1}, no[4] = {BD, BH, n_q, 1};
    set_t(&t[0], PG_TYPE_F32, PG_OP_NONE, nq, (void *)q);
    set_t(&t[1], PG_TYPE_F16, PG_OP_NONE, nk, (void *)k);
    set_t(&t[2], PG_TYPE_F16, PG_OP_NONE, nk, (void *)v);
    set_t(&t[3], PG_TYPE_F16, PG_OP_NONE, nm, (void *)m);
    set_t(&t[4], PG_TYPE_F32, PG_OP_FLASH_ATTN_EXT, no, out);
    for (int i = 0; i < 4; i++) t[4].src[i] = i;
    const float scale = 0.125f, zero = 0.0f;
    memcpy(&t[4].op_params[0], &scale, 4);
    memcpy(&t[4].op_params[1], &zero, 4);
    memcpy(&t[4].op_params[2], &zero, 4);
    const int32_t order[1] = {4};
    size_t ws = 0;
    int32_t bad = -1;
    CHECK(pg_graph_work_size(t, 5, order, 1, 2, &ws) == PG_OK, "work size");
    void *work = calloc(1, ws + 64);
    CHECK(pg_graph_compute(t, 5, order, 1, tp, nth, work, ws, NULL, NULL, &bad) == PG_OK,
          "flash attention computes (bad node %d)", bad);
    free(work);
}

/* Two sequences A and B share one KV cache, their cells interleaved irregularly (as a unified
 * cache places a batch); a batch of query rows [B0, A0..A6, B1..B4] (causal within each
 * sequence) gives every A row exactly the bits of (1) A's rows computed alone over a cache of
 * only A's cells, in order, and (2) each A row alone (n_q = 1, decode): other sequences' cells
 * and rows never change a sequence's result. Every path, 1 and 2 threads. */
PG_TEST(test_flash_attn_row_independent_of_batch) {
    static float q[BD * (BQA + BQB) * BH], qa[BD * BQA * BH], q1[BD * BH];
    static pg_fp16 k[BD * BKV * BHKV], v[BD * BKV * BHKV], ka[BD * BKV * BHKV],
        va[BD * BKV * BHKV];
    static pg_fp16 m[BKV * (BQA + BQB)], ma[BKV * BQA], m1[BKV];
    static float out[BD * BH * (BQA + BQB)], outa[BD * BH * BQA], out1[BD * BH];
    enum { NQ = BQA + BQB };
    srand(17);
    int seq[BKV], pos[BKV], na = 0, nb = 0, acell[BKV];
    for (int j = 0; j < BKV; j++) {   /* A owns ~2/3 of the cells, in runs of varying length */
        seq[j] = (rand() % 3 == 0) ? 1 : 0;
        if (seq[j] == 0) { acell[na] = j; pos[j] = na++; }
        else pos[j] = nb++;
    }
    for (int i = 0; i < BD * BKV * BHKV; i++) {
        k[i] = pg_fp32_to_fp16(frand());
        v[i] = pg_fp32_to_fp16(frand());
    }
    /* batch rows: row 0 = B at position nb - BQB, rows 1..7 = A at na - 7 .. na - 1, rows
     * 8..11 = B at nb - 4 .. nb - 1 */
    int rseq[NQ], rpos[NQ], arow[BQA];
    rseq[0] = 1; rpos[0] = nb - BQB;
    for (int i = 0; i < BQA; i++) { rseq[1 + i] = 0; rpos[1 + i] = na - BQA + i; arow[i] = 1 + i; }
    for (int i = 0; i < BQB - 1; i++) { rseq[8 + i] = 1; rpos[8 + i] = nb - BQB + 1 + i; }
    for (int r = 0; r < NQ; r++)
        for (int j = 0; j < BKV; j++)
            m[r * BKV + j] = pg_fp32_to_fp16(seq[j] == rseq[r] && pos[j] <= rpos[r] ? 0.0f
                                                                                    : -INFINITY);
    for (int i = 0; i < BD * NQ * BH; i++) q[i] = frand();
    /* A alone: its cells compacted in order, its rows, causal */
    for (int h = 0; h < BHKV; h++)
        for (int c = 0; c < na; c++) {
            memcpy(&ka[(h * na + c) * BD], &k[(h * BKV + acell[c]) * BD], BD * 2);
            memcpy(&va[(h * na + c) * BD], &v[(h * BKV + acell[c]) * BD], BD * 2);
        }
    for (int h = 0; h < BH; h++)
        for (int i = 0; i < BQA; i++)
            memcpy(&qa[(h * BQA + i) * BD], &q[(h * NQ + arow[i]) * BD], BD * 4);
    for (int i = 0; i < BQA; i++)
        for (int c = 0; c < na; c++)
            ma[i * na + c] = pg_fp32_to_fp16(c <= rpos[arow[i]] ? 0.0f : -INFINITY);
    pg_threadpool *tp = pg_threadpool_new(2);
    const int32_t was = pg_cpu_path();
    for (int32_t path = 0; path < PG_PATH_COUNT; path++) {
        if (!path_usable(path)) continue;
        pg_set_cpu_path(path);
        for (int nth = 1; nth <= 2; nth++) {
            fa_any(tp, nth, NQ, BKV, q, k, v, m, out);
            fa_any(tp, nth, BQA, na, qa, ka, va, ma, outa);
            int same = 1, same1 = 1;
            for (int i = 0; i < BQA; i++) {
                same &= memcmp(&out[arow[i] * BH * BD], &outa[i * BH * BD], BH * BD * 4) == 0;
                for (int h = 0; h < BH; h++)
                    memcpy(&q1[h * BD], &qa[(h * BQA + i) * BD], BD * 4);
                memcpy(m1, &ma[i * na], (size_t)na * 2);
                fa_any(tp, nth, 1, na, q1, ka, va, m1, out1);
                same1 &= memcmp(out1, &outa[i * BH * BD], BH * BD * 4) == 0;
            }
            CHECK(same, "path %d, %d threads: an A row in the batch differs from A alone", path,
                  nth);
            CHECK(same1, "path %d, %d threads: an A row alone (decode) differs from A's rows",
                  path, nth);
        }
    }
    pg_set_cpu_path(was);
    pg_threadpool_free(tp);
}

/* qk_f16 / pv_f16 (K and V read as fp16 in place) give exactly the bits of qk / pv on the same
 * rows converted to fp32, on every path, for every tail shape */
PG_TEST(test_attn_f16_kernels_equal_converted) {
    static float q[9 * 260], kf[9 * 260], vf[9 * 260], p[9 * 16], ms[9];
    static uint16_t kh[9 * 260], vh[9 * 260];
    static float s0[9 * 16], s1[9 * 16], a0[9 * 260], a1[9 * 260];
    srand(23);
    for (int i = 0; i < 9 * 260; i++) {
        q[i] = frand();
        kh[i] = pg_fp32_to_fp16(frand());
        vh[i] = pg_fp32_to_fp16(frand());
        kf[i] = pg_fp16_to_fp32(kh[i]);
        vf[i] = pg_fp16_to_fp32(vh[i]);
    }
    for (int i = 0; i < 9 * 16; i++) p[i] = frand() > 0 ? frand() * frand() : 0.0f;
    for (int i = 0; i < 9; i++) ms[i] = i == 3 ? 0.0f : 0.5f + 0.1f * (float)i;
    for (int32_t path = 0; path < PG_PATH_COUNT; path++) {
        const pg_attn_kernels *kn = pg_get_attn_kernels_for_path(path);
        if (!kn || !path_usable(path)) continue;
        const int64_t Ds[] = {1, 7, 8, 15, 16, 33, 64, 200, 256};
        for (size_t di = 0; di < sizeof(Ds) / sizeof(Ds[0]); di++) {
            const int64_t D = Ds[di];
            for (int64_t nr = 1; nr <= 9; nr++)
                for (int64_t nc = 1; nc <= 9; nc++) {
                    kn->qk(D, nr, nc, q, D + 3, kf, D + 3, s0, 16);
                    kn->qk_f16(D, nr, nc, q, D + 3, kh, D + 3, s1, 16);
                    int same = 1;
                    for (int64_t r = 0; r < nr; r++)
                        same &= memcmp(s0 + r * 16, s1 + r * 16, (size_t)nc * 4) == 0;
                    CHECK(same, "path %d qk_f16 D %lld nr %lld nc %lld", path, (long long)D,
                          (long long)nr, (long long)nc);
                    for (int i = 0; i < 9 * 260; i++) a0[i] = a1[i] = 0.25f * (float)(i % 7) - 0.7f;
                    kn->pv(D, nr, nc, p, 16, vf, D + 3, ms, a0, 260);
                    kn->pv_f16(D, nr, nc, p, 16, vh, D + 3, ms, a1, 260);
                    CHECK(memcmp(a0, a1, sizeof(a0)) == 0, "path %d pv_f16 D %lld nr %lld nc %lld",
                          path, (long long)D, (long long)nr, (long long)nc);
                }
        }
    }
}

/* ---- split-KV: long caches, any thread count ------------------------------------------------- */

enum { LD = 64, LH = 8, LHKV = 2, LKV = 2300, LQ = 12 };

/* out[LD, LH, n_q] of q [LD, n_q, LH] over k / v [LD, LKV, LHKV] of type kt / vt in the KV
 * cache's layout (a cell's heads side by side), mask F16 [LKV, n_q] */
static void fa_long(pg_threadpool *tp, int nth, int64_t n_q, const float *q, int32_t kt,
                    const void *k, int32_t vt, const void *v, const pg_fp16 *m, float *out) {
    pg_tensor t[5];
    const int64_t nq[4] = {LD, n_q, LH, 1}, nk[4] = {LD, LKV, LHKV, 1};
    const int64_t nm[4] = {LKV, n_q, 1, 1}, no[4] = {LD, LH, n_q, 1};
    set_t(&t[0], PG_TYPE_F32, PG_OP_NONE, nq, (void *)q);
    set_t(&t[1], kt, PG_OP_NONE, nk, (void *)k);
    set_t(&t[2], vt, PG_OP_NONE, nk, (void *)v);
    for (int i = 1; i <= 2; i++) {
        const size_t row = pg_type_row_size(t[i].type, LD);
        t[i].nb[0] = (int64_t)pg_type_size(t[i].type);
        t[i].nb[1] = (int64_t)(row * LHKV);
        t[i].nb[2] = (int64_t)row;
        t[i].nb[3] = t[i].nb[1] * LKV;
    }
    set_t(&t[3], PG_TYPE_F16, PG_OP_NONE, nm, (void *)m);
    set_t(&t[4], PG_TYPE_F32, PG_OP_FLASH_ATTN_EXT, no, out);
    for (int i = 0; i < 4; i++) t[4].src[i] = i;
    const float scale = 0.125f, zero = 0.0f;
    memcpy(&t[4].op_params[0], &scale, 4);
    memcpy(&t[4].op_params[1], &zero, 4);
    memcpy(&t[4].op_params[2], &zero, 4);
    const int32_t order[1] = {4};
    size_t ws = 0;
    int32_t bad = -1;
    CHECK(pg_graph_work_size(t, 5, order, 1, nth, &ws) == PG_OK, "work size");
    void *work = calloc(1, ws + 64);
    CHECK(pg_graph_compute(t, 5, order, 1, tp, nth, work, ws, NULL, NULL, &bad) == PG_OK,
          "flash attention computes (bad node %d)", bad);
    free(work);
}

/* A 2300-cell cache (several PG_FA_CHUNK chunks), one sequence causal over it with holes (the
 * cells of another sequence): (1) one query row (decode: chunks dealt to threads) gives the same
 * bits on 1, 2, 3 and 4 threads, and (2) those of the same row inside a 12-row batch (a prompt:
 * tiles dealt to threads, each walking its chunks), on every path, for F16, Q8_0 and Q4_0 K/V;
 * (3) F16 within 2e-6 of a float64 softmax. */
PG_TEST(test_flash_attn_split_kv_any_thread_count) {
    static float q[LD * LQ * LH], q1[LD * LH], kf[LD * LKV * LHKV], vf[LD * LKV * LHKV];
    static uint8_t kb[LD * LKV * LHKV * 2], vb[LD * LKV * LHKV * 2];
    static pg_fp16 m[LKV * LQ];
    static float out[4][LD * LH * LQ], one[4][LD * LH], sc[LKV];
    srand(29);
    for (int i = 0; i < LD * LQ * LH; i++) q[i] = frand() * 2.0f;
    for (int i = 0; i < LD * LKV * LHKV; i++) { kf[i] = frand(); vf[i] = frand(); }
    int other[LKV];
    for (int j = 0; j < LKV; j++) other[j] = (j % 97) < 13 || (j > 700 && j < 760);
    for (int i = 0; i < LQ; i++)   /* row i at the end of the cache, causal, skipping `other` */
        for (int j = 0; j < LKV; j++)
            m[i * LKV + j] = pg_fp32_to_fp16(other[j] || j > LKV - LQ + i ? -INFINITY : 0.0f);
    const int last = LQ - 1;   /* the row tested alone */
    for (int h = 0; h < LH; h++) memcpy(&q1[h * LD], &q[(h * LQ + last) * LD], LD * 4);
    pg_threadpool *tp = pg_threadpool_new(4);
    const int32_t was = pg_cpu_path();
    const int32_t types[3] = {PG_TYPE_F16, PG_TYPE_Q8_0, PG_TYPE_Q4_0};
    for (int ti = 0; ti < 3; ti++) {
        const pg_type_traits *tt = pg_get_type_traits(types[ti]);
        for (int64_t r = 0; r < (int64_t)LKV * LHKV; r++) {   /* cell-major rows, head inner */
            tt->from_float(kf + r * LD, kb + (size_t)r * pg_type_row_size(types[ti], LD), LD);
            tt->from_float(vf + r * LD, vb + (size_t)r * pg_type_row_size(types[ti], LD), LD);
        }
        for (int32_t path = 0; path < PG_PATH_COUNT; path++) {
            if (!path_usable(path)) continue;
            pg_set_cpu_path(path);
            for (int nth = 1; nth <= 4; nth++) {
                fa_long(tp, nth, 1, q1, types[ti], kb, types[ti], vb, m + last * LKV,
                        one[nth - 1]);
                fa_long(tp, nth, LQ, q, types[ti], kb, types[ti], vb, m, out[nth - 1]);
                CHECK(memcmp(one[nth - 1], one[0], sizeof(one[0])) == 0,
                      "type %d path %d: decode row on %d threads differs from 1 thread",
                      types[ti], path, nth);
                CHECK(memcmp(out[nth - 1], out[0], sizeof(out[0])) == 0,
                      "type %d path %d: batch on %d threads differs from 1 thread", types[ti],
                      path, nth);
                CHECK(memcmp(one[nth - 1], &out[nth - 1][last * LH * LD], sizeof(one[0])) == 0,
                      "type %d path %d, %d threads: the row alone differs from the row in the "
                      "batch", types[ti], path, nth);
            }
            if (types[ti] != PG_TYPE_F16) continue;
            double err = 0, maxref = 0;
            for (int h = 0; h < LH; h++) {
                const int hk = h / (LH / LHKV);
                double mx = -INFINITY, tot = 0;
                for (int j = 0; j < LKV; j++) {
                    double d = 0;
                    for (int x = 0; x < LD; x++)
                        d += (double)pg_fp16_to_fp32(pg_fp32_to_fp16(q1[h * LD + x])) *
                             pg_fp16_to_fp32(((const pg_fp16 *)kb)[(j * LHKV + hk) * LD + x]);
                    sc[j] = other[j] ? -INFINITY : d * 0.125;
                    if (sc[j] > mx) mx = sc[j];
                }
                for (int j = 0; j < LKV; j++) { sc[j] = exp(sc[j] - mx); tot += sc[j]; }
                for (int x = 0; x < LD; x++) {
                    double a = 0;
                    for (int j = 0; j < LKV; j++)
                        a += sc[j] *
                             pg_fp16_to_fp32(((const pg_fp16 *)vb)[(j * LHKV + hk) * LD + x]);
                    const double e = fabs(one[0][h * LD + x] - a / tot);
                    if (!(e <= err)) err = e;
                    if (fabs(a / tot) > maxref) maxref = fabs(a / tot);
                }
            }
            CHECK(err <= 2e-6 * maxref, "path %d: max error %g (max |ref| %g)", path, err, maxref);
        }
    }
    pg_set_cpu_path(was);
    pg_threadpool_free(tp);
}
