/* FLASH_ATTN_EXT inner kernels, AVX-512F (see attn.h; the scalar reference is in ops_attn.c).
 * qk: 4 query rows × 4 keys per register tile (16 accumulators, each an fp32 dot over D in
 * 16-wide pieces), reduced by a transpose-add to 4 scores per row. pv: 4 rows × 64 outputs per
 * tile (16 accumulators), one broadcast weight per row and key. exp: Cephes' expf polynomial
 * (within 2 ulp of libm on the inputs here, which are <= 0). */
#include <immintrin.h>
#include <math.h>

#include "attn.h"

#define AI static inline __attribute__((always_inline))
/* the tile loops have constant trips: unrolled, the accumulators stay in registers */
#define PG_UNROLL _Pragma("GCC unroll 4")

static inline __mmask16 tail_mask(int64_t n) {   /* the first n (< 16) lanes */
    return (__mmask16)((1u << n) - 1u);
}

/* [Σa0, Σa1, Σa2, Σa3] */
AI __m128 hsum4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
#define HALF(a) _mm256_add_ps(_mm512_castps512_ps256(a), \
                              _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)))
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(HALF(a0), HALF(a1)),
                                    _mm256_hadd_ps(HALF(a2), HALF(a3)));
#undef HALF
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* 16 elements of row x (fp32, or fp16 bits when H) from element d; mk: the lanes to load */
AI __m512 load16(int H, const void *x, int64_t d, __mmask16 mk) {
    return H ? _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mk, (const uint16_t *)x + d))
             : _mm512_maskz_loadu_ps(mk, (const float *)x + d);
}

/* element i·ld of x (fp32, or fp16 when H): row i of rows ld apart, or element i with ld 1 */
AI const void *row_at(int H, const void *x, int64_t i, int64_t ld) {
    return H ? (const void *)((const uint16_t *)x + i * ld)
             : (const void *)((const float *)x + i * ld);
}

AI void qk_tile(int H, int R, int C, int64_t D, const float *q, int64_t ldq, const void *k,
                int64_t ldk, float *s, int64_t lds) {
    __m512 acc[4][4];
    PG_UNROLL
    for (int i = 0; i < R; i++)
        PG_UNROLL
        for (int j = 0; j < C; j++) acc[i][j] = _mm512_setzero_ps();
    int64_t d = 0;
    for (; d + 16 <= D; d += 16) {
        __m512 kv[4];
        PG_UNROLL
        for (int j = 0; j < C; j++) kv[j] = load16(H, row_at(H, k, j, ldk), d, 0xffff);
        PG_UNROLL
        for (int i = 0; i < R; i++) {
            const __m512 qv = _mm512_loadu_ps(q + i * ldq + d);
            PG_UNROLL
            for (int j = 0; j < C; j++) acc[i][j] = _mm512_fmadd_ps(qv, kv[j], acc[i][j]);
        }
    }
    if (d < D) {
        const __mmask16 mk = tail_mask(D - d);
        __m512 kv[4];
        PG_UNROLL
        for (int j = 0; j < C; j++) kv[j] = load16(H, row_at(H, k, j, ldk), d, mk);
        PG_UNROLL
        for (int i = 0; i < R; i++) {
            const __m512 qv = _mm512_maskz_loadu_ps(mk, q + i * ldq + d);
            PG_UNROLL
            for (int j = 0; j < C; j++) acc[i][j] = _mm512_fmadd_ps(qv, kv[j], acc[i][j]);
        }
    }
    PG_UNROLL
    for (int i = 0; i < R; i++) {
        if (C == 4) {
            _mm_storeu_ps(s + i * lds, hsum4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]));
        } else {
            PG_UNROLL
            for (int j = 0; j < C; j++)   /* hsum4's tree: a score is the same in a tail */
                s[i * lds + j] = _mm_cvtss_f32(hsum4(acc[i][j], acc[i][j], acc[i][j], acc[i][j]));
        }
    }
}

AI void qk_any(int H, int64_t D, int64_t nr, int64_t nc, const float *q, int64_t ldq,
               const void *k, int64_t ldk, float *s, int64_t lds) {
    for (int64_t r = 0; r < nr; r += 4) {
        const int R = nr - r < 4 ? (int)(nr - r) : 4;
        const float *qr = q + r * ldq;
        for (int64_t c = 0; c < nc; c += 4) {
            const int C = nc - c < 4 ? (int)(nc - c) : 4;
            const void *kc = row_at(H, k, c, ldk);
            float *sc = s + r * lds + c;
#define QK(RR, CC) case RR * 8 + CC: qk_tile(H, RR, CC, D, qr, ldq, kc, ldk, sc, lds); break;
            switch (R * 8 + C) {
            QK(4, 4) QK(4, 3) QK(4, 2) QK(4, 1)
            QK(3, 4) QK(3, 3) QK(3, 2) QK(3, 1)
            QK(2, 4) QK(2, 3) QK(2, 2) QK(2, 1)
            QK(1, 4) QK(1, 3) QK(1, 2) QK(1, 1)
            default: break;
            }
#undef QK
        }
    }
}

static void qk_avx512(int64_t D, int64_t nr, int64_t nc, const float *q, int64_t ldq,
                      const float *k, int64_t ldk, float *s, int64_t lds) {
    qk_any(0, D, nr, nc, q, ldq, k, ldk, s, lds);
}

static void qk_f16_avx512(int64_t D, int64_t nr, int64_t nc, const float *q, int64_t ldq,
                          const uint16_t *k, int64_t ldk, float *s, int64_t lds) {
    qk_any(1, D, nr, nc, q, ldq, k, ldk, s, lds);
}

/* acc rows r < R, outputs [x, x + 16·NV) of v's rows (the last piece masked by mk) */
AI void pv_tile(int H, int R, int NV, __mmask16 mk, int64_t nc, const float *p, int64_t ldp,
                const void *v, int64_t ldv, const float *ms, float *acc, int64_t lda) {
    __m512 a[4][4];
    PG_UNROLL
    for (int i = 0; i < R; i++) {
        const __m512 sc = _mm512_set1_ps(ms[i]);
        PG_UNROLL
        for (int u = 0; u < NV; u++) {
            const __mmask16 mu = u == NV - 1 ? mk : (__mmask16)0xffff;
            a[i][u] = _mm512_mul_ps(_mm512_maskz_loadu_ps(mu, acc + i * lda + 16 * u), sc);
        }
    }
    for (int64_t c = 0; c < nc; c++) {
        __m512 vv[4];
        PG_UNROLL
        for (int u = 0; u < NV; u++) {
            const __mmask16 mu = u == NV - 1 ? mk : (__mmask16)0xffff;
            vv[u] = load16(H, row_at(H, v, c, ldv), 16 * u, mu);
        }
        PG_UNROLL
        for (int i = 0; i < R; i++) {
            const __m512 w = _mm512_set1_ps(p[i * ldp + c]);
            PG_UNROLL
            for (int u = 0; u < NV; u++) a[i][u] = _mm512_fmadd_ps(w, vv[u], a[i][u]);
        }
    }
    PG_UNROLL
    for (int i = 0; i < R; i++)
        PG_UNROLL
        for (int u = 0; u < NV; u++) {
            const __mmask16 mu = u == NV - 1 ? mk : (__mmask16)0xffff;
            _mm512_mask_storeu_ps(acc + i * lda + 16 * u, mu, a[i][u]);
        }
}

AI void pv_any(int H, int64_t Dv, int64_t nr, int64_t nc, const float *p, int64_t ldp,
               const void *v, int64_t ldv, const float *ms, float *acc, int64_t lda) {
    for (int64_t r = 0; r < nr; r += 4) {
        const int R = nr - r < 4 ? (int)(nr - r) : 4;
        const float *pr = p + r * ldp;
        float *ar = acc + r * lda;
        int64_t x = 0;
        for (; x + 64 <= Dv; x += 64) {
#define PV(RR) case RR: \
    pv_tile(H, RR, 4, 0xffff, nc, pr, ldp, row_at(H, v, x, 1), ldv, ms + r, ar + x, lda); break;
            switch (R) { PV(4) PV(3) PV(2) PV(1) default: break; }
#undef PV
        }
        for (; x < Dv; x += 16) {   /* 16 at a time, the last one masked */
            const __mmask16 mk = Dv - x >= 16 ? (__mmask16)0xffff : tail_mask(Dv - x);
#define PV(RR) case RR: \
    pv_tile(H, RR, 1, mk, nc, pr, ldp, row_at(H, v, x, 1), ldv, ms + r, ar + x, lda); break;
            switch (R) { PV(4) PV(3) PV(2) PV(1) default: break; }
#undef PV
        }
    }
}

static void pv_avx512(int64_t Dv, int64_t nr, int64_t nc, const float *p, int64_t ldp,
                      const float *v, int64_t ldv, const float *ms, float *acc, int64_t lda) {
    pv_any(0, Dv, nr, nc, p, ldp, v, ldv, ms, acc, lda);
}

static void pv_f16_avx512(int64_t Dv, int64_t nr, int64_t nc, const float *p, int64_t ldp,
                          const uint16_t *v, int64_t ldv, const float *ms, float *acc,
                          int64_t lda) {
    pv_any(1, Dv, nr, nc, p, ldp, v, ldv, ms, acc, lda);
}

/* exp(x), Cephes' expf: x = n·ln2 + f, |f| <= ln2/2, exp(f) by a degree-6 polynomial, 2^n
 * built in the exponent field; 0 below ln(2^-126) (also for -inf). */
static inline __m512 exp512(__m512 x) {
    const __m512 lo = _mm512_set1_ps(-87.33654f);
    const __mmask16 zero = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    x = _mm512_min_ps(_mm512_max_ps(x, lo), _mm512_set1_ps(88.3762626647949f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    f = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), f);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(f, f), _mm512_add_ps(f, _mm512_set1_ps(1.0f)));
    /* 2^n with n in [-126, 127]: (n + 127) << 23; the max clamp keeps n <= 127 */
    const __m512i e =
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mul_ps((__mmask16)~zero, y, _mm512_castsi512_ps(e));
}

static float scale_max_avx512(float *s, int64_t n, float scale, const float *mask, float slope) {
    const __m512 sc = _mm512_set1_ps(scale), sl = _mm512_set1_ps(slope);
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int64_t c = 0; c < n; c += 16) {
        const __mmask16 mk = n - c >= 16 ? (__mmask16)0xffff : tail_mask(n - c);
        __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, s + c), sc);
        if (mask) x = _mm512_fmadd_ps(sl, _mm512_maskz_loadu_ps(mk, mask + c), x);
        _mm512_mask_storeu_ps(s + c, mk, x);
        mx = _mm512_mask_max_ps(mx, mk, mx, x);
    }
    return _mm512_reduce_max_ps(mx);
}

static float exp_sum_avx512(float *s, int64_t n, float m) {
    const __m512 mv = _mm512_set1_ps(m);
    __m512 total = _mm512_setzero_ps();
    for (int64_t c = 0; c < n; c += 16) {
        const __mmask16 mk = n - c >= 16 ? (__mmask16)0xffff : tail_mask(n - c);
        const __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, s + c), mv));
        _mm512_mask_storeu_ps(s + c, mk, e);
        total = _mm512_add_ps(total, _mm512_maskz_mov_ps(mk, e));
    }
    return _mm512_reduce_add_ps(total);
}

static void f16_to_f32_avx512(const uint16_t *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + i))));
    if (i < n) {
        const __mmask16 mk = tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, mk, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mk, x + i)));
    }
}

static void round_f16_avx512(const float *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i < n; i += 16) {
        const __mmask16 mk = n - i >= 16 ? (__mmask16)0xffff : tail_mask(n - i);
        const __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(mk, x + i), _MM_FROUND_TO_NEAREST_INT);
        _mm512_mask_storeu_ps(y + i, mk, _mm512_cvtph_ps(h));
    }
}

static void silu_avx512(const float *x, float *y, int64_t n) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 mk = n - i >= 16 ? (__mmask16)0xffff : tail_mask(n - i);
        const __m512 v = _mm512_maskz_loadu_ps(mk, x + i);
        const __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), v));
        _mm512_mask_storeu_ps(y + i, mk, _mm512_div_ps(v, _mm512_add_ps(one, e)));
    }
}

void pg_fill_attn_avx512(pg_attn_kernels *k) {
    k->silu = silu_avx512;
    k->qk = qk_avx512;
    k->pv = pv_avx512;
    k->qk_f16 = qk_f16_avx512;
    k->pv_f16 = pv_f16_avx512;
    k->scale_max = scale_max_avx512;
    k->exp_sum = exp_sum_avx512;
    k->f16_to_f32 = f16_to_f32_avx512;
    k->round_f16 = round_f16_avx512;
}
