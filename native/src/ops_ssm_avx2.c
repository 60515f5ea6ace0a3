/* Recurrent-op kernels, AVX2 + FMA (see ops_ssm.h; the scalar reference is in ops_ssm.c).
 * delta_rows: tiles of 4 rows (k and q loaded once for the four, eight independent chains),
 * per row two passes over Dk in 8-wide pieces and one fixed reduction tree (a row's result
 * depends on Dk only, not on the ubatch or on its place in a tile). conv_rows: the scalar
 * order of operations on 8 channels at a time (multiply, then add; the same bits). */
#include <immintrin.h>

#include "ops_ssm.h"

static const int32_t k_mask_src[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};

static inline __m256i tail_mask(int64_t n) {   /* the first n (0..8) lanes */
    return _mm256_loadu_si256((const __m256i *)(k_mask_src + 8 - n));
}

#define AI static inline __attribute__((always_inline))
#define PG_UNROLL _Pragma("GCC unroll 4")

/* [Σa0, Σa1, Σa2, Σa3], each sum in the same tree (attn_avx2.c's hsum4) */
AI __m128 hsum4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* Σ y·x for R rows over Dk: 8-wide pieces, even pieces into one accumulator and odd ones
 * into another (two chains per row, R rows interleaved), then hsum4's tree. A row's sum is the
 * same operations whether it sits in a tile of 4 or alone. first: y = row·decay, not stored
 * (the update pass computes it again: a multiply is cheaper than a store), x = k; else
 * y = row·decay + k·d (d per row), stored, x = q. */
AI __m128 tile_pass(int R, int first, int64_t Dk, float *const *row, const float *k,
                    const float *x, __m256 vdec, const __m256 *vd, __m256i mk) {
    __m256 ae[4], ao[4];
    PG_UNROLL
    for (int r = 0; r < R; r++) ae[r] = ao[r] = _mm256_setzero_ps();
#define STEP(ACC, E, LOAD, STORE)                                                          \
    do {                                                                                    \
        const __m256 kv = LOAD(k + (E)), xv = first ? kv : LOAD(x + (E));                   \
        PG_UNROLL                                                                           \
        for (int r = 0; r < R; r++) {                                                       \
            const __m256 dec = _mm256_mul_ps(LOAD(row[r] + (E)), vdec);                     \
            const __m256 y = first ? dec : _mm256_fmadd_ps(kv, vd[r], dec);                  \
            if (!first) STORE(row[r] + (E), y);                                              \
            ACC[r] = _mm256_fmadd_ps(y, xv, ACC[r]);                                        \
        }                                                                                   \
    } while (0)
#define LD(p) _mm256_loadu_ps(p)
#define ST(p, y) _mm256_storeu_ps(p, y)
#define LDM(p) _mm256_maskload_ps(p, mk)
#define STM(p, y) _mm256_maskstore_ps(p, mk, y)
    int64_t e = 0;
    for (; e + 16 <= Dk; e += 16) {
        STEP(ae, e, LD, ST);
        STEP(ao, e + 8, LD, ST);
    }
    if (e + 8 <= Dk) {
        STEP(ae, e, LD, ST);
        e += 8;
        if (e < Dk) STEP(ao, e, LDM, STM);
    } else if (e < Dk) {
        STEP(ae, e, LDM, STM);
    }
#undef STEP
#undef LD
#undef ST
#undef LDM
#undef STM
    __m256 s[4];
    PG_UNROLL
    for (int r = 0; r < R; r++) s[r] = _mm256_add_ps(ae[r], ao[r]);
    return R == 4 ? hsum4(s[0], s[1], s[2], s[3]) : hsum4(s[0], s[0], s[0], s[0]);
}

AI void delta_tile(int R, int64_t Dk, float *rows, const float *k, const float *q,
                   const float *v, float decay, float beta, float scale, float *o, __m256i mk) {
    float *row[4];
    PG_UNROLL
    for (int r = 0; r < R; r++) row[r] = rows + r * Dk;
    const __m256 vdec = _mm256_set1_ps(decay);
    float sum[4], d[4];
    _mm_storeu_ps(sum, tile_pass(R, 1, Dk, row, k, k, vdec, NULL, mk));
    __m256 vd[4];
    PG_UNROLL
    for (int r = 0; r < R; r++) {
        d[r] = (v[r] - sum[r]) * beta;
        vd[r] = _mm256_set1_ps(d[r]);
    }
    _mm_storeu_ps(sum, tile_pass(R, 0, Dk, row, k, q, vdec, vd, mk));
    PG_UNROLL
    for (int r = 0; r < R; r++) o[r] = sum[r] * scale;
}

static void delta_rows_avx2(int64_t Dk, int64_t n, float *rows, const float *k, const float *q,
                            const float *v, float decay, float beta, float scale, float *o) {
    const __m256i mk = tail_mask(Dk & 7);
    int64_t r = 0;
    for (; r + 4 <= n; r += 4)
        delta_tile(4, Dk, rows + r * Dk, k, q, v + r, decay, beta, scale, o + r, mk);
    for (; r < n; r++)
        delta_tile(1, Dk, rows + r * Dk, k, q, v + r, decay, beta, scale, o + r, mk);
}

static void conv_rows_avx2(int64_t n, int64_t nk, const float *const *hist, const float *x,
                           const float *w, int64_t ldw, float *y) {
    int64_t c = 0;
    for (; c + 8 <= n; c += 8) {
        __m256 sum = _mm256_setzero_ps();
        for (int64_t j = 0; j < nk; j++)
            sum = _mm256_add_ps(sum, _mm256_mul_ps(_mm256_loadu_ps(hist[j] + c),
                                                   _mm256_loadu_ps(w + j * ldw + c)));
        sum = _mm256_add_ps(sum, _mm256_mul_ps(_mm256_loadu_ps(x + c),
                                               _mm256_loadu_ps(w + nk * ldw + c)));
        _mm256_storeu_ps(y + c, sum);
    }
    for (; c < n; c++) {
        float sum = 0.0f;
        for (int64_t j = 0; j < nk; j++) sum += hist[j][c] * w[j * ldw + c];
        sum += x[c] * w[nk * ldw + c];
        y[c] = sum;
    }
}

void pg_fill_ssm_avx2(pg_ssm_kernels *k) {
    k->delta_rows = delta_rows_avx2;
    k->conv_rows = conv_rows_avx2;
}
