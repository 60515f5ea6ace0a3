/* FLASH_ATTN_EXT inner kernels, AVX2 + FMA + F16C (see attn.h; the scalar reference is in
 * ops_attn.c). qk: 4 query rows × 2 keys per register tile (8 accumulators over D in 8-wide
 * pieces), reduced by hadd to 4 scores at a time. pv: 4 rows × 16 outputs per tile
 * (8 accumulators). exp: Cephes' expf polynomial, as attn_avx512.c. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "attn.h"

#define AI static inline __attribute__((always_inline))
/* the tile loops have constant trips: unrolled, the accumulators stay in registers */
#define PG_UNROLL _Pragma("GCC unroll 4")

static const int32_t k_mask_src[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};

static inline __m256i tail_mask(int64_t n) {   /* the first n (0..8) lanes */
    return _mm256_loadu_si256((const __m256i *)(k_mask_src + 8 - n));
}

/* [Σa0, Σa1, Σa2, Σa3] */
AI __m128 hsum4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* Σa in hsum4's tree, so a score does not depend on whether its key sits in a pair (R = 4, C = 2)
 * or in a tail: a key's score is the same wherever the block puts it (batch invariance) */
static inline float hsum1(__m256 a) { return _mm_cvtss_f32(hsum4(a, a, a, a)); }

/* element i·ld of x (fp32, or fp16 when H): row i of rows ld apart, or element i with ld 1 */
AI const void *row_at(int H, const void *x, int64_t i, int64_t ld) {
    return H ? (const void *)((const uint16_t *)x + i * ld)
             : (const void *)((const float *)x + i * ld);
}

/* 8 elements of x (fp32, or fp16 bits when H) from element d */
AI __m256 load8(int H, const void *x, int64_t d) {
    return H ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)x + d)))
             : _mm256_loadu_ps((const float *)x + d);
}

/* the first n (< 8) elements of x from element d, the other lanes 0 (mk: tail_mask(n)) */
AI __m256 load8_tail(int H, const void *x, int64_t d, int64_t n, __m256i mk) {
    if (!H) return _mm256_maskload_ps((const float *)x + d, mk);
    uint16_t h[8] = {0};
    memcpy(h, (const uint16_t *)x + d, (size_t)n * sizeof(uint16_t));
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
}

AI void qk_tile(int H, int R, int C, int64_t D, const float *q, int64_t ldq, const void *k,
                int64_t ldk, float *s, int64_t lds) {
    __m256 acc[4][2];
    PG_UNROLL
    for (int i = 0; i < R; i++)
        PG_UNROLL
        for (int j = 0; j < C; j++) acc[i][j] = _mm256_setzero_ps();
    int64_t d = 0;
    for (; d + 8 <= D; d += 8) {
        __m256 kv[2];
        PG_UNROLL
        for (int j = 0; j < C; j++) kv[j] = load8(H, row_at(H, k, j, ldk), d);
        PG_UNROLL
        for (int i = 0; i < R; i++) {
            const __m256 qv = _mm256_loadu_ps(q + i * ldq + d);
            PG_UNROLL
            for (int j = 0; j < C; j++) acc[i][j] = _mm256_fmadd_ps(qv, kv[j], acc[i][j]);
        }
    }
    if (d < D) {
        const __m256i mk = tail_mask(D - d);
        __m256 kv[2];
        PG_UNROLL
        for (int j = 0; j < C; j++) kv[j] = load8_tail(H, row_at(H, k, j, ldk), d, D - d, mk);
        PG_UNROLL
        for (int i = 0; i < R; i++) {
            const __m256 qv = _mm256_maskload_ps(q + i * ldq + d, mk);
            PG_UNROLL
            for (int j = 0; j < C; j++) acc[i][j] = _mm256_fmadd_ps(qv, kv[j], acc[i][j]);
        }
    }
    if (R == 4 && C == 2) {   /* rows (0, 1) then (2, 3): [s00 s01 s10 s11] */
        const __m128 a = hsum4(acc[0][0], acc[0][1], acc[1][0], acc[1][1]);
        const __m128 b = hsum4(acc[2][0], acc[2][1], acc[3][0], acc[3][1]);
        _mm_storel_pi((__m64 *)(s), a);
        _mm_storeh_pi((__m64 *)(s + lds), a);
        _mm_storel_pi((__m64 *)(s + 2 * lds), b);
        _mm_storeh_pi((__m64 *)(s + 3 * lds), b);
    } else {
        PG_UNROLL
        for (int i = 0; i < R; i++)
            PG_UNROLL
            for (int j = 0; j < C; j++) s[i * lds + j] = hsum1(acc[i][j]);
    }
}

AI void qk_any(int H, int64_t D, int64_t nr, int64_t nc, const float *q, int64_t ldq,
               const void *k, int64_t ldk, float *s, int64_t lds) {
    for (int64_t r = 0; r < nr; r += 4) {
        const int R = nr - r < 4 ? (int)(nr - r) : 4;
        const float *qr = q + r * ldq;
        for (int64_t c = 0; c < nc; c += 2) {
            const int C = nc - c < 2 ? (int)(nc - c) : 2;
            const void *kc = row_at(H, k, c, ldk);
            float *sc = s + r * lds + c;
#define QK(RR, CC) case RR * 8 + CC: qk_tile(H, RR, CC, D, qr, ldq, kc, ldk, sc, lds); break;
            switch (R * 8 + C) {
            QK(4, 2) QK(4, 1) QK(3, 2) QK(3, 1) QK(2, 2) QK(2, 1) QK(1, 2) QK(1, 1)
            default: break;
            }
#undef QK
        }
    }
}

static void qk_avx2(int64_t D, int64_t nr, int64_t nc, const float *q, int64_t ldq,
                    const float *k, int64_t ldk, float *s, int64_t lds) {
    qk_any(0, D, nr, nc, q, ldq, k, ldk, s, lds);
}

static void qk_f16_avx2(int64_t D, int64_t nr, int64_t nc, const float *q, int64_t ldq,
                        const uint16_t *k, int64_t ldk, float *s, int64_t lds) {
    qk_any(1, D, nr, nc, q, ldq, k, ldk, s, lds);
}

/* acc rows r < R, outputs [0, 8·NV) of the given pointers; `full` false: only n < 8 lanes of
 * a single piece (NV = 1) */
AI void pv_tile(int H, int R, int NV, int full, int64_t n, __m256i mk, int64_t nc,
                const float *p, int64_t ldp, const void *v, int64_t ldv, const float *ms,
                float *acc, int64_t lda) {
    __m256 a[4][2];
    PG_UNROLL
    for (int i = 0; i < R; i++) {
        const __m256 sc = _mm256_set1_ps(ms[i]);
        PG_UNROLL
        for (int u = 0; u < NV; u++)
            a[i][u] = _mm256_mul_ps(full ? _mm256_loadu_ps(acc + i * lda + 8 * u)
                                         : _mm256_maskload_ps(acc + i * lda, mk), sc);
    }
    for (int64_t c = 0; c < nc; c++) {
        __m256 vv[2];
        PG_UNROLL
        for (int u = 0; u < NV; u++)
            vv[u] = full ? load8(H, row_at(H, v, c, ldv), 8 * u)
                         : load8_tail(H, row_at(H, v, c, ldv), 0, n, mk);
        PG_UNROLL
        for (int i = 0; i < R; i++) {
            const __m256 w = _mm256_broadcast_ss(p + i * ldp + c);
            PG_UNROLL
            for (int u = 0; u < NV; u++) a[i][u] = _mm256_fmadd_ps(w, vv[u], a[i][u]);
        }
    }
    PG_UNROLL
    for (int i = 0; i < R; i++)
        PG_UNROLL
        for (int u = 0; u < NV; u++) {
            if (full) _mm256_storeu_ps(acc + i * lda + 8 * u, a[i][u]);
            else _mm256_maskstore_ps(acc + i * lda, mk, a[i][u]);
        }
}

AI void pv_any(int H, int64_t Dv, int64_t nr, int64_t nc, const float *p, int64_t ldp,
               const void *v, int64_t ldv, const float *ms, float *acc, int64_t lda) {
    const __m256i all = tail_mask(8);
    for (int64_t r = 0; r < nr; r += 4) {
        const int R = nr - r < 4 ? (int)(nr - r) : 4;
        const float *pr = p + r * ldp;
        float *ar = acc + r * lda;
        int64_t x = 0;
        for (; x + 16 <= Dv; x += 16) {
#define PV(RR) case RR: \
    pv_tile(H, RR, 2, 1, 8, all, nc, pr, ldp, row_at(H, v, x, 1), ldv, ms + r, ar + x, lda); break;
            switch (R) { PV(4) PV(3) PV(2) PV(1) default: break; }
#undef PV
        }
        for (; x + 8 <= Dv; x += 8) {
#define PV(RR) case RR: \
    pv_tile(H, RR, 1, 1, 8, all, nc, pr, ldp, row_at(H, v, x, 1), ldv, ms + r, ar + x, lda); break;
            switch (R) { PV(4) PV(3) PV(2) PV(1) default: break; }
#undef PV
        }
        if (x < Dv) {
            const __m256i mk = tail_mask(Dv - x);
#define PV(RR) case RR: \
    pv_tile(H, RR, 1, 0, Dv - x, mk, nc, pr, ldp, row_at(H, v, x, 1), ldv, ms + r, ar + x, lda); \
    break;
            switch (R) { PV(4) PV(3) PV(2) PV(1) default: break; }
#undef PV
        }
    }
}

static void pv_avx2(int64_t Dv, int64_t nr, int64_t nc, const float *p, int64_t ldp,
                    const float *v, int64_t ldv, const float *ms, float *acc, int64_t lda) {
    pv_any(0, Dv, nr, nc, p, ldp, v, ldv, ms, acc, lda);
}

static void pv_f16_avx2(int64_t Dv, int64_t nr, int64_t nc, const float *p, int64_t ldp,
                        const uint16_t *v, int64_t ldv, const float *ms, float *acc,
                        int64_t lda) {
    pv_any(1, Dv, nr, nc, p, ldp, v, ldv, ms, acc, lda);
}

/* exp(x) as exp512 in attn_avx512.c: 0 below ln(2^-126) (also for -inf) */
static inline __m256 exp256(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.33654f);
    const __m256 keep = _mm256_cmp_ps(x, lo, _CMP_GE_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, lo), _mm256_set1_ps(88.3762626647949f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    f = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), f);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(f, f), _mm256_add_ps(f, _mm256_set1_ps(1.0f)));
    const __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(keep, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}

static float scale_max_avx2(float *s, int64_t n, float scale, const float *mask, float slope) {
    const __m256 sc = _mm256_set1_ps(scale), sl = _mm256_set1_ps(slope);
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    __m256 mx = ninf;
    for (int64_t c = 0; c < n; c += 8) {
        const __m256i mk = tail_mask(n - c >= 8 ? 8 : n - c);
        __m256 x = _mm256_mul_ps(_mm256_maskload_ps(s + c, mk), sc);
        if (mask) x = _mm256_fmadd_ps(sl, _mm256_maskload_ps(mask + c, mk), x);
        _mm256_maskstore_ps(s + c, mk, x);
        mx = _mm256_max_ps(mx, _mm256_blendv_ps(ninf, x, _mm256_castsi256_ps(mk)));
    }
    const __m128 a = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    const __m128 b = _mm_max_ps(a, _mm_movehl_ps(a, a));
    return _mm_cvtss_f32(_mm_max_ss(b, _mm_movehdup_ps(b)));
}

static float exp_sum_avx2(float *s, int64_t n, float m) {
    const __m256 mv = _mm256_set1_ps(m);
    __m256 total = _mm256_setzero_ps();
    for (int64_t c = 0; c < n; c += 8) {
        const __m256i mk = tail_mask(n - c >= 8 ? 8 : n - c);
        const __m256 e = _mm256_and_ps(_mm256_castsi256_ps(mk),
                                       exp256(_mm256_sub_ps(_mm256_maskload_ps(s + c, mk), mv)));
        _mm256_maskstore_ps(s + c, mk, e);
        total = _mm256_add_ps(total, e);
    }
    return hsum1(total);
}

static void f16_to_f32_avx2(const uint16_t *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
    for (; i < n; i++) y[i] = _cvtsh_ss(x[i]);
}

static void round_f16_avx2(const float *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(x + i),
                                                                 _MM_FROUND_TO_NEAREST_INT)));
    for (; i < n; i++) y[i] = _cvtsh_ss(_cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT));
}

static void silu_avx2(const float *x, float *y, int64_t n) {
    const __m256 one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), v));
        _mm256_storeu_ps(y + i, _mm256_div_ps(v, _mm256_add_ps(one, e)));
    }
    if (i < n) {
        const __m256i mk = tail_mask(n - i);
        const __m256 v = _mm256_maskload_ps(x + i, mk);
        const __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), v));
        _mm256_maskstore_ps(y + i, mk, _mm256_div_ps(v, _mm256_add_ps(one, e)));
    }
}

void pg_fill_attn_avx2(pg_attn_kernels *k) {
    k->silu = silu_avx2;
    k->qk = qk_avx2;
    k->pv = pv_avx2;
    k->qk_f16 = qk_f16_avx2;
    k->pv_f16 = pv_f16_avx2;
    k->scale_max = scale_max_avx2;
    k->exp_sum = exp_sum_avx2;
    k->f16_to_f32 = f16_to_f32_avx2;
    k->round_f16 = round_f16_avx2;
}
