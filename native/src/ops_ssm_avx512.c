/* Recurrent-op kernels, AVX-512F (see ops_ssm.h; the scalar reference is in ops_ssm.c), as
 * ops_ssm_avx2.c on 16 lanes: delta_rows in tiles of 4 rows, two passes over Dk (the first
 * does not store), a masked tail, one fixed reduction tree per row; conv_rows the scalar order
 * on 16 channels at a time. */
#include <immintrin.h>

#include "ops_ssm.h"

#define AI static inline __attribute__((always_inline))
#define PG_UNROLL _Pragma("GCC unroll 4")

/* [Σa0, Σa1, Σa2, Σa3]: each 16 lanes folded to 8 (low + high), then ops_ssm_avx2.c's tree */
AI __m128 hsum4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
#define FOLD(a) _mm256_add_ps(_mm512_castps512_ps256(a), \
                              _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)))
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(FOLD(a0), FOLD(a1)),
                                    _mm256_hadd_ps(FOLD(a2), FOLD(a3)));
#undef FOLD
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* as tile_pass in ops_ssm_avx2.c, on 16-wide pieces with a masked tail */
AI __m128 tile_pass(int R, int first, int64_t Dk, float *const *row, const float *k,
                    const float *x, __m512 vdec, const __m512 *vd, __mmask16 mk) {
    __m512 ae[4], ao[4];
    PG_UNROLL
    for (int r = 0; r < R; r++) ae[r] = ao[r] = _mm512_setzero_ps();
#define STEP(ACC, E, M)                                                                     \
    do {                                                                                    \
        const __m512 kv = LOAD(M, k + (E));                                                 \
        const __m512 xv = first ? kv : LOAD(M, x + (E));                                    \
        PG_UNROLL                                                                           \
        for (int r = 0; r < R; r++) {                                                       \
            const __m512 dec = _mm512_mul_ps(LOAD(M, row[r] + (E)), vdec);                  \
            const __m512 y = first ? dec : _mm512_fmadd_ps(kv, vd[r], dec);                  \
            if (!first) STORE(row[r] + (E), M, y);                                           \
            ACC[r] = _mm512_fmadd_ps(y, xv, ACC[r]);                                        \
        }                                                                                   \
    } while (0)
    /* the full pieces unmasked (M = 0 stands for all lanes): masked moves cost more on Zen 4 */
#define LOAD(M, p) ((M) ? _mm512_maskz_loadu_ps(M, p) : _mm512_loadu_ps(p))
#define STORE(p, M, y) ((M) ? _mm512_mask_storeu_ps(p, M, y) : _mm512_storeu_ps(p, y))
    const __mmask16 all = 0;
    int64_t e = 0;
    for (; e + 32 <= Dk; e += 32) {
        STEP(ae, e, all);
        STEP(ao, e + 16, all);
    }
    if (e + 16 <= Dk) {
        STEP(ae, e, all);
        e += 16;
        if (e < Dk) STEP(ao, e, mk);
    } else if (e < Dk) {
        STEP(ae, e, mk);
    }
#undef STEP
#undef LOAD
#undef STORE
    __m512 s[4];
    PG_UNROLL
    for (int r = 0; r < R; r++) s[r] = _mm512_add_ps(ae[r], ao[r]);
    return R == 4 ? hsum4(s[0], s[1], s[2], s[3]) : hsum4(s[0], s[0], s[0], s[0]);
}

AI void delta_tile(int R, int64_t Dk, float *rows, const float *k, const float *q,
                   const float *v, float decay, float beta, float scale, float *o, __mmask16 mk) {
    float *row[4];
    PG_UNROLL
    for (int r = 0; r < R; r++) row[r] = rows + r * Dk;
    const __m512 vdec = _mm512_set1_ps(decay);
    float sum[4];
    _mm_storeu_ps(sum, tile_pass(R, 1, Dk, row, k, k, vdec, NULL, mk));
    __m512 vd[4];
    PG_UNROLL
    for (int r = 0; r < R; r++) vd[r] = _mm512_set1_ps((v[r] - sum[r]) * beta);
    _mm_storeu_ps(sum, tile_pass(R, 0, Dk, row, k, q, vdec, vd, mk));
    PG_UNROLL
    for (int r = 0; r < R; r++) o[r] = sum[r] * scale;
}

static void delta_rows_avx512(int64_t Dk, int64_t n, float *rows, const float *k, const float *q,
                              const float *v, float decay, float beta, float scale, float *o) {
    const __mmask16 mk = (__mmask16)((1u << (Dk & 15)) - 1u);
    int64_t r = 0;
    for (; r + 4 <= n; r += 4)
        delta_tile(4, Dk, rows + r * Dk, k, q, v + r, decay, beta, scale, o + r, mk);
    for (; r < n; r++)
        delta_tile(1, Dk, rows + r * Dk, k, q, v + r, decay, beta, scale, o + r, mk);
}

static void conv_rows_avx512(int64_t n, int64_t nk, const float *const *hist, const float *x,
                             const float *w, int64_t ldw, float *y) {
    int64_t c = 0;
    for (; c < n; c += 16) {
        const __mmask16 m = n - c >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - c)) - 1u);
        __m512 sum = _mm512_setzero_ps();
        for (int64_t j = 0; j < nk; j++)
            sum = _mm512_add_ps(sum, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, hist[j] + c),
                                                   _mm512_maskz_loadu_ps(m, w + j * ldw + c)));
        sum = _mm512_add_ps(sum, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + c),
                                               _mm512_maskz_loadu_ps(m, w + nk * ldw + c)));
        _mm512_mask_storeu_ps(y + c, m, sum);
    }
}

void pg_fill_ssm_avx512(pg_ssm_kernels *k) {
    k->delta_rows = delta_rows_avx512;
    k->conv_rows = conv_rows_avx512;
}
