/* IQ4_NL, IQ4_XS and MXFP4 (iquants.h): AVX2 dot kernels, bit-exact with the scalar ones
 * (quants_iq.c): the 4-bit codes become int8 values by one byte shuffle of the value table,
 * the integer block sums are exact (maddubs with the sign moved onto the activations, as the
 * Q8_0 · Q8_0 kernel does), and each block's fp32 term is the scalar kernel's, added in block
 * order. The avx512 and amx paths take these too. */
#include <immintrin.h>

#include "iquants.h"
#include "quants.h"

#define PG_X86_DOT_US(u, s) _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
#define PG_X86_DOT_Q4_0(q, a)                                                                   \
    _mm256_madd_epi16(_mm256_sub_epi16(_mm256_maddubs_epi16(q, a),                              \
                                       _mm256_maddubs_epi16(_mm256_set1_epi8(8), a)),           \
                      _mm256_set1_epi16(1))
#include "quants_legacy_x86.h"

/* The 32 values of a block's 16 code bytes (low nibbles first) through the table lut. */
static inline __m256i lut32(const uint8_t *qs, __m256i lut) {
    return _mm256_shuffle_epi8(lut, unpack_nibbles(qs));
}

static inline __m256i table(const int8_t *v) {
    const __m128i t = _mm_loadu_si128((const __m128i *)v);
    return _mm256_set_m128i(t, t);
}

/* ---- IQ4_NL · Q8_0: the Q8_0 kernel's shape, the term (d_y · d_x) · isum ------------------- */


static inline __m256i iq4_nl_block(const pg_block_iq4_nl *x, const pg_block_q8_0 *y) {
    const __m256i q = lut32(x->qs, table(pg_kv_iq4nl));
    return dot_ss(q, _mm256_loadu_si256((const __m256i *)y->qs));
}

PG_DOT_Q8_0_KERNEL(vec_dot_iq4_nl_q8_0, pg_block_iq4_nl, iq4_nl_block, PG_TERM_XY, PG_STERM_XY)

/* ---- MXFP4 · Q8_0 ---------------------------------------------------------------------------- */

static inline __m256i mxfp4_block(const pg_block_mxfp4 *x, const pg_block_q8_0 *y) {
    const __m256i q = lut32(x->qs, table(pg_kv_mxfp4));
    return dot_ss(q, _mm256_loadu_si256((const __m256i *)y->qs));
}

/* pg_e8m0_half of 8 blocks' exponents in vector integer ops: (e − 1) << 23, and for the two
 * subnormal codes e < 2, 0x00200000 << e */
static inline __m256 e8m0x8(const pg_block_mxfp4 *x) {
    const __m256i e = _mm256_setr_epi32(x[0].e, x[1].e, x[2].e, x[3].e, x[4].e, x[5].e, x[6].e,
                                        x[7].e);
    const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __m256i sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    const __m256i is_sub = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, sub, is_sub));
}

static void vec_dot_mxfp4_q8_0(int64_t n, float *restrict s, const void *restrict vx,
                               const void *restrict vy) {
    const pg_block_mxfp4 *x = vx;
    const pg_block_q8_0 *y = vy;
    const int64_t nb = n / 32;
    float sum = 0.0f;
    int64_t b = 0;
    for (; b + 8 <= nb; b += 8) {
        const __m256i p = fold8(mxfp4_block(&x[b], &y[b]), mxfp4_block(&x[b + 1], &y[b + 1]),
                                mxfp4_block(&x[b + 2], &y[b + 2]), mxfp4_block(&x[b + 3], &y[b + 3]),
                                mxfp4_block(&x[b + 4], &y[b + 4]), mxfp4_block(&x[b + 5], &y[b + 5]),
                                mxfp4_block(&x[b + 6], &y[b + 6]), mxfp4_block(&x[b + 7], &y[b + 7]));
        const __m256 d = _mm256_mul_ps(fp16x8(&y[b], sizeof(*y)), e8m0x8(&x[b]));
        sum = add_in_order(sum, _mm256_mul_ps(d, _mm256_cvtepi32_ps(p)));
    }
    for (; b < nb; b++)
        sum += (h2f(y[b].d) * pg_e8m0_half(x[b].e)) * (float)hsum_epi32(mxfp4_block(&x[b], &y[b]));
    *s = sum;
}

/* ---- IQ4_XS · Q8_K: Σ_ib (ls_ib − 32) · isum_ib exact in int32, one term per super-block ---- */

static inline int32_t iq4_xs_isum(const pg_block_iq4_xs *x, const int8_t *a, __m256i lut) {
    __m256i acc = _mm256_setzero_si256();
    for (int ib = 0; ib < 8; ib++) {
        const __m256i q = lut32(x->qs + 16 * ib, lut);
        const __m256i av = _mm256_loadu_si256((const __m256i *)(a + 32 * ib));
        /* pairs of |q|·±a fit int16 (2·127·127); times the scale in the madd */
        const __m256i pr = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(av, q));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(pr, _mm256_set1_epi16((short)pg_iq4xs_scale(x, ib))));
    }
    return hsum_epi32(acc);
}

static void vec_dot_iq4_xs_q8_K(int64_t n, float *restrict s, const void *restrict vx,
                                const void *restrict vy) {
    const pg_block_iq4_xs *x = vx;
    const pg_block_q8_K *y = vy;
    const __m256i lut = table(pg_kv_iq4nl);
    float sum = 0;
    for (int64_t i = 0; i < n / PG_QK_K; i++)
        sum += (h2f(x[i].d) * y[i].d) * (float)iq4_xs_isum(&x[i], y[i].qs, lut);
    *s = sum;
}

void pg_fill_iquants_avx2(pg_type_traits *tbl) {
    tbl[PG_TYPE_IQ4_NL].vec_dot = vec_dot_iq4_nl_q8_0;
    tbl[PG_TYPE_MXFP4].vec_dot = vec_dot_mxfp4_q8_0;
    tbl[PG_TYPE_IQ4_XS].vec_dot = vec_dot_iq4_xs_q8_K;
}
