/* The AVX2 path's gemm kernels, included twice by gemm_avx2.c (which defines the helpers used
 * here and documents the layout):
 *   GA_VNNI 0: AVX2 only: unsigned × signed bytes by maddubs (int16 pairs), then madd (int32);
 *   GA_VNNI 1: AVX-VNNI (under #pragma GCC target("avxvnni")): VPDPBUSD (four byte products
 *              into an int32, no int16 step) and VPDPWSSD (madd and add in one).
 * Both forms give the same exact integer sums, so the same bits. GA_FN(name) names the
 * kernels of the form. No include guard: meant to be included once per form. */

/* ---- the integer steps of the two forms ------------------------------------------------------ */

#if GA_VNNI
/* acc + Σ over each 4-byte group of w0·a0 + w1·a1 (unsigned w, signed a) */
AINL __m256i GA_FN(dot2)(__m256i acc, __m256i w0, __m256i a0, __m256i w1, __m256i a1) {
    return _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(acc, w0, a0), w1, a1);
}
/* acc + madd(p16, sc) */
AINL __m256i GA_FN(dotw)(__m256i acc, __m256i p16, __m256i sc) {
    return _mm256_dpwssd_avx_epi32(acc, p16, sc);
}
#else
/* the two maddubs' int16 words are added before the madd: with levels <= 31 (or the offsets
 * c <= 16) and |a| <= 128 a word is at most 4·31·128 = 15872 */
AINL __m256i GA_FN(dot2)(__m256i acc, __m256i w0, __m256i a0, __m256i w1, __m256i a1) {
    return _mm256_add_epi32(acc, madd1(_mm256_add_epi16(_mm256_maddubs_epi16(w0, a0),
                                                        _mm256_maddubs_epi16(w1, a1))));
}
AINL __m256i GA_FN(dotw)(__m256i acc, __m256i p16, __m256i sc) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p16, sc));
}
#endif

/* ---- legacy formats -------------------------------------------------------------------------- */

/* Σ over q of w[q]·a[q] per 4-byte group (w unsigned, a signed). The AVX2-only form adds the
 * four maddubs' words before the madd: with w <= 31 (levels, or the offsets c <= 16) and
 * |a| <= 128 a word is at most 8·31·128 = 31744. */
AINL __m256i GA_FN(dot4)(const __m256i *w, const __m256i *a) {
#if GA_VNNI
    __m256i p = _mm256_setzero_si256();
    PG_UNROLL for (int q = 0; q < 4; q++) p = _mm256_dpbusd_avx_epi32(p, w[q], a[q]);
    return p;
#else
    return madd1(_mm256_add_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(w[0], a[0]),
                                                   _mm256_maddubs_epi16(w[1], a[1])),
                                  _mm256_add_epi16(_mm256_maddubs_epi16(w[2], a[2]),
                                                   _mm256_maddubs_epi16(w[3], a[3]))));
#endif
}

/* Per block, what the activation rows give every group of 4 weight rows, in the layout of the
 * dots of pair v of activation rows (2v, 2v + 1): [2v 2v 2v+1 2v+1 | the same]. */
typedef struct {
    __m256 dy[4], sy[4];   /* d (and s) of the rows */
    __m256i off[4];        /* c·Σa of the rows (OFF: the levels' offset c) */
} GA_FN(leg_act);

/* G groups of 4 weight rows (xr[0..4G)) × 2·NV activation rows (yr), see the legacy comment in
 * gemm_avx2.c. STRIDE: weight block bytes; QS, QH (0: none), M (0: none): offsets of qs, qh and
 * m in the block (M: activations in Q8_1); OFF: offset c of the levels (Q8_0 on the VNNI form:
 * its bytes + 128); Q8: Q8_0. */
AINL void GA_FN(legacy)(int64_t n, float *s, size_t bs, const char *const *xr,
                        const char *const *yr, int nr, int nc, const int NV, const int STRIDE,
                        const int QS, const int QH, const int M, const int OFF, const int Q8) {
    const int ys = M ? 36 : 34, yq = M ? 4 : 2;
    const int64_t nb = n / PG_QK32;
    const int ngrp = (nr + 3) / 4;
    __m256 acc[PG_GEMM_MAX_NR / 4][4];
    GA_FN(leg_act) act[GA_CHUNK];
    for (int64_t b0 = 0; b0 < nb; b0 += GA_CHUNK) {
        const int nbc = nb - b0 < GA_CHUNK ? (int)(nb - b0) : GA_CHUNK;
        for (int k = 0; k < nbc; k++) {
            PG_UNROLL for (int h = 0; h < NV / 2; h++) {   /* activation rows 4h..4h+3 */
                const char *y[4];
                PG_UNROLL for (int j = 0; j < 4; j++) y[j] = yr[4 * h + j] + (b0 + k) * ys;
                const __m256 d4 = fp16x4x2(y[0], y[1], y[2], y[3], 1);
                act[k].dy[2 * h] = _mm256_unpacklo_ps(d4, d4);
                act[k].dy[2 * h + 1] = _mm256_unpackhi_ps(d4, d4);
                if (M) {
                    const __m256 s4 = fp16x4x2(y[0] + 2, y[1] + 2, y[2] + 2, y[3] + 2, 1);
                    act[k].sy[2 * h] = _mm256_unpacklo_ps(s4, s4);
                    act[k].sy[2 * h + 1] = _mm256_unpackhi_ps(s4, s4);
                }
                if (OFF) {
                    const __m256i c = _mm256_set1_epi8((char)OFF), z = _mm256_setzero_si256();
                    __m256i o[4];
                    PG_UNROLL for (int j = 0; j < 4; j++)
                        o[j] = GA_FN(dot2)(z, c, bcast16(y[j] + yq), c, bcast16(y[j] + yq + 16));
                    const __m256i o4 = tadd4(o[0], o[1], o[2], o[3]);
                    act[k].off[2 * h] = _mm256_unpacklo_epi32(o4, o4);
                    act[k].off[2 * h + 1] = _mm256_unpackhi_epi32(o4, o4);
                }
            }
        }
        for (int g = 0; g < ngrp; g++) {
            const char *const *x = xr + 4 * g;
            __m256 a[4];
            PG_UNROLL for (int v = 0; v < NV; v++)
                a[v] = b0 ? acc[g][v] : _mm256_setzero_ps();
            for (int k = 0; k < nbc; k++) {
                const int64_t b = b0 + k;
                const char *p[4];
                PG_UNROLL for (int i = 0; i < 4; i++) p[i] = x[i] + b * STRIDE;
                __m256i w[4];   /* w[q]: elements 8q..8q+7 of rows 0, 2 | 1, 3 */
                grp4_levels(p, QS, QH, Q8, w);
                if (Q8 && GA_VNNI)
                    PG_UNROLL for (int q = 0; q < 4; q++)
                        w[q] = _mm256_xor_si256(w[q], _mm256_set1_epi8((char)0x80));
                __m256i u[4];
                if (Q8 && !GA_VNNI)
                    PG_UNROLL for (int q = 0; q < 4; q++) u[q] = _mm256_abs_epi8(w[q]);
                const __m256 dx = grp4_fp16(p[0], p[1], p[2], p[3]);
                const __m256 mx = M ? grp4_fp16(p[0] + M, p[1] + M, p[2] + M, p[3] + M) : dx;
                PG_UNROLL for (int v = 0; v < NV; v++) {
                    __m256i pj[2];
                    PG_UNROLL for (int e = 0; e < 2; e++) {
                        const char *y = yr[2 * v + e] + b * ys + yq;
                        __m256i c[4];
                        PG_UNROLL for (int q = 0; q < 4; q++) c[q] = bcast8(y + 8 * q);
                        if (Q8 && !GA_VNNI) {   /* signed weights: |w| × a·sign(w), a word each */
                            pj[e] = _mm256_setzero_si256();
                            PG_UNROLL for (int q = 0; q < 4; q++) {
                                const __m256i sa = _mm256_sign_epi8(c[q], w[q]);
                                pj[e] = _mm256_add_epi32(pj[e],
                                                         madd1(_mm256_maddubs_epi16(u[q], sa)));
                            }
                        } else {
                            pj[e] = GA_FN(dot4)(w, c);
                        }
                    }
                    /* [row 0 · 2v, row 2 · 2v, row 0 · 2v+1, row 2 · 2v+1 | rows 1, 3] */
                    __m256i dots = _mm256_hadd_epi32(pj[0], pj[1]);
                    if (OFF) dots = _mm256_sub_epi32(dots, act[k].off[v]);
                    /* the scalar kernels' block terms (quants_legacy.c), one lane per dot */
                    const __m256 isum = _mm256_cvtepi32_ps(dots), dy = act[k].dy[v];
                    __m256 t;
                    if (M)
                        t = _mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(dx, dy), isum),
                                          _mm256_mul_ps(mx, act[k].sy[v]));
                    else if (Q8)
                        t = _mm256_mul_ps(isum, _mm256_mul_ps(dx, dy));
                    else
                        t = _mm256_mul_ps(_mm256_mul_ps(isum, dx), dy);
                    a[v] = _mm256_add_ps(a[v], t);
                }
            }
            PG_UNROLL for (int v = 0; v < NV; v++) acc[g][v] = a[v];
        }
    }
    store_grp4(s, bs, acc, nr, nc);
}

#define GA_LEGACY(name, STRIDE, QS, QH, M, OFF, Q8)                                                \
    static void GA_FN(name)(int64_t n, float *restrict s, size_t bs, const void *restrict vx,      \
                            size_t bx, const void *restrict vy, size_t by, int nr, int nc) {       \
        const char *x[PG_GEMM_MAX_NR], *y[PG_GEMM_MAX_NC];                                         \
        rows_of(vx, bx, vy, by, nr, nc, x, y);                                                     \
        if (nc <= 4) GA_FN(legacy)(n, s, bs, x, y, nr, nc, 2, STRIDE, QS, QH, M, OFF, Q8);         \
        else GA_FN(legacy)(n, s, bs, x, y, nr, nc, 4, STRIDE, QS, QH, M, OFF, Q8);                 \
    }

GA_LEGACY(gemm_q4_0, 18, 2, 0, 0, 8, 0)
GA_LEGACY(gemm_q5_0, 22, 6, 2, 0, 16, 0)
GA_LEGACY(gemm_q8_0, 34, 2, 0, 0, GA_VNNI ? 128 : 0, 1)
GA_LEGACY(gemm_q4_1, 20, 4, 0, 2, 0, 0)
GA_LEGACY(gemm_q5_1, 24, 8, 4, 2, 0, 0)

/* ---- K-quants × Q8_K ----------------------------------------------------------------------- */

/* One weight row pair × C groups of 4 activation rows at a time, super-block by super-block
 * (see kquant_avx2's comment in gemm_avx2.c); type 2..6 = Q2_K..Q6_K. */
AINL void GA_FN(kquant)(int64_t n, float *s, size_t bs, const char *const *xr,
                        const char *const *yr, int nr, int nc, const int C, const int type) {
    const int64_t nb = n / PG_QK_K;
    const int npair = (nr + 1) / 2;
    const int has_min = type == 2 || type == 4 || type == 5;
    const int shift = type == 3 ? 2 : 5;   /* the offset types' 2^shift (Q3_K: 4, Q6_K: 32) */
    /* Q4_K / Q5_K: the two slices of a 32-element sub-block share its scale: their maddubs
     * words are added before the scale is applied (a word: at most 4·31·128 = 15872) */
    const int pairs = type == 4 || type == 5;
    __m256 acc[PG_GEMM_MAX_NR / 2][2];
    for (int g = 0; g < npair; g++) {
        const char *x0 = xr[2 * g], *x1 = xr[2 * g + 1];
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            kpair k;
            kpair_decode(x0, x1, b, type, &k);
            const pg_block_q8_K *y[PG_GEMM_MAX_NC];
            PG_UNROLL for (int j = 0; j < 4 * C; j++) y[j] = (const pg_block_q8_K *)yr[j] + b;
            __m256i p[PG_GEMM_MAX_NC];
            PG_UNROLL for (int j = 0; j < 4 * C; j++) p[j] = _mm256_setzero_si256();
            PG_UNROLL for (int t = 0; t < 16; t += 1 + pairs) {
                const __m256i l0 = kpair_slice(x0, x1, b, type, t);
                const __m256i l1 = pairs ? kpair_slice(x0, x1, b, type, t + 1) : l0;
                const __m256i sc = k.sc[pairs ? t / 2 : t];
                PG_UNROLL for (int j = 0; j < 4 * C; j++) {
                    __m256i w = _mm256_maddubs_epi16(l0, bcast16(y[j]->qs + 16 * t));
                    if (pairs)
                        w = _mm256_add_epi16(w, _mm256_maddubs_epi16(
                                                    l1, bcast16(y[j]->qs + 16 * t + 16)));
                    p[j] = GA_FN(dotw)(p[j], w, sc);
                }
            }
            /* per row lane: Σ mins·bsums (Q2_K, Q4_K, Q5_K) or Σ scales·bsums (Q3_K, Q6_K) */
            __m256i m[PG_GEMM_MAX_NC];
            PG_UNROLL for (int j = 0; j < 4 * C; j++)
                m[j] = _mm256_add_epi32(_mm256_madd_epi16(k.w16lo, bcast16(y[j]->bsums)),
                                        _mm256_madd_epi16(k.w16hi, bcast16(y[j]->bsums + 8)));
            PG_UNROLL for (int h = 0; h < C; h++) {
                const __m256i *ph = p + 4 * h, *mh = m + 4 * h;
                const __m256i mm = tadd4(mh[0], mh[1], mh[2], mh[3]);
                __m256i dots = tadd4(ph[0], ph[1], ph[2], ph[3]);
                if (!has_min) dots = _mm256_sub_epi32(dots, _mm256_slli_epi32(mm, shift));
                const __m128 d4 = _mm_setr_ps(y[4 * h]->d, y[4 * h + 1]->d, y[4 * h + 2]->d,
                                              y[4 * h + 3]->d);
                const __m256 dy = _mm256_set_m128(d4, d4);
                /* the scalar kernels' super-block terms (quants_kquants.c), one lane per dot */
                __m256 t = _mm256_mul_ps(_mm256_mul_ps(k.d, dy), _mm256_cvtepi32_ps(dots));
                if (has_min)
                    t = _mm256_sub_ps(t, _mm256_mul_ps(_mm256_mul_ps(k.dmin, dy),
                                                       _mm256_cvtepi32_ps(mm)));
                if (h == 0) a0 = _mm256_add_ps(a0, t);
                else a1 = _mm256_add_ps(a1, t);
            }
        }
        acc[g][0] = a0;
        acc[g][1] = a1;
    }
    store_pairs(s, bs, acc, nr, nc);
}

#define GA_KQUANT(name, TYPE)                                                                      \
    static void GA_FN(name)(int64_t n, float *restrict s, size_t bs, const void *restrict vx,      \
                            size_t bx, const void *restrict vy, size_t by, int nr, int nc) {       \
        const char *x[PG_GEMM_MAX_NR], *y[PG_GEMM_MAX_NC];                                         \
        rows_of(vx, bx, vy, by, nr, nc, x, y);                                                     \
        if (nc <= 4) GA_FN(kquant)(n, s, bs, x, y, nr, nc, 1, TYPE);                               \
        else GA_FN(kquant)(n, s, bs, x, y, nr, nc, 2, TYPE);                                       \
    }

GA_KQUANT(gemm_q2_K, 2)
GA_KQUANT(gemm_q3_K, 3)
GA_KQUANT(gemm_q4_K, 4)
GA_KQUANT(gemm_q5_K, 5)
GA_KQUANT(gemm_q6_K, 6)

#undef GA_LEGACY
#undef GA_KQUANT

static void GA_FN(fill)(pg_type_traits *tbl) {
    tbl[PG_TYPE_Q4_0].gemm = GA_FN(gemm_q4_0);
    tbl[PG_TYPE_Q4_1].gemm = GA_FN(gemm_q4_1);
    tbl[PG_TYPE_Q5_0].gemm = GA_FN(gemm_q5_0);
    tbl[PG_TYPE_Q5_1].gemm = GA_FN(gemm_q5_1);
    tbl[PG_TYPE_Q8_0].gemm = GA_FN(gemm_q8_0);
    tbl[PG_TYPE_Q2_K].gemm = GA_FN(gemm_q2_K);
    tbl[PG_TYPE_Q3_K].gemm = GA_FN(gemm_q3_K);
    tbl[PG_TYPE_Q4_K].gemm = GA_FN(gemm_q4_K);
    tbl[PG_TYPE_Q5_K].gemm = GA_FN(gemm_q5_K);
    tbl[PG_TYPE_Q6_K].gemm = GA_FN(gemm_q6_K);
}
