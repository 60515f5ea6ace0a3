/* IQ4_NL, IQ4_XS and MXFP4 (iquants.h): the x86 dot kernels, included by quants_iq_avx2.c
 * (maddubs) and quants_iq_avx512.c (VNNI), which define before including
 *   PG_X86_DOT_US(u, s)                    (for quants_legacy_x86.h: Σ u·s per 4 bytes)
 *   IQ4_DOT_SCALED(acc, u, s, sc)          acc + Σ u·s per pair of bytes times the int16 sc
 *   IQ4_FILL                               the name of the fill function
 * Bit-exact with the scalar kernels (quants_iq.c): the 4-bit codes become int8 values by one
 * byte shuffle of the value table, the integer block sums are exact (maddubs or VPDPBUSD with
 * the sign moved onto the activations, as the Q8_0 · Q8_0 kernel does), and each block's fp32
 * term is the scalar kernel's, added in block order (vec_dot8 and the gemm: iq_x86.h). */
#include <immintrin.h>

#include "iq_x86.h"
#include "iquants.h"
#include "quants.h"

#include "quants_legacy_x86.h"

/* The 32 values of a block's 16 code bytes (low nibbles first) through the table lut. */
static inline __m256i lut32(const uint8_t *qs, __m256i lut) {
    return _mm256_shuffle_epi8(lut, unpack_nibbles(qs));
}

/* ---- IQ4_NL · Q8_0: the Q8_0 kernel's shape, the term (d_y · d_x) · isum ------------------- */

static inline __m256i iq4_nl_block(const pg_block_iq4_nl *x, const pg_block_q8_0 *y) {
    const __m256i q = lut32(x->qs, iqx_table(pg_kv_iq4nl));
    return dot_ss(q, _mm256_loadu_si256((const __m256i *)y->qs));
}

PG_DOT_Q8_0_KERNEL(vec_dot_iq4_nl_q8_0, pg_block_iq4_nl, iq4_nl_block, PG_TERM_XY, PG_STERM_XY)

#ifdef IQ4_OFFSET128
/* VNNI: the values + 128 (unsigned) straight into VPDPBUSD, no sign handling per row; the
 * 128·Σa this adds is the same for the eight rows and taken off after the fold (exact) */
static inline __m256i table128(const int8_t *v) {
    return _mm256_add_epi8(iqx_table(v), _mm256_set1_epi8(-128));
}

static inline __attribute__((always_inline)) void iq4_nl_row(const pg_block_iq4_nl *x,
        const pg_block_q8_0 *const *y, const int C, __m256i *is) {
    const __m256i u = lut32(x->qs, table128(pg_kv_iq4nl));
    IQX_UNROLL for (int j = 0; j < C; j++)
        is[j] = dot_us(u, _mm256_loadu_si256((const __m256i *)y[j]->qs));
}

/* f − 128·Σa in every lane */
static inline __m256i minus_128_sum(__m256i f, const pg_block_q8_0 *y) {
    __m256i sa = dot_us(_mm256_set1_epi8(1), _mm256_loadu_si256((const __m256i *)y->qs));
    sa = _mm256_add_epi32(sa, _mm256_permute2x128_si256(sa, sa, 1));
    sa = _mm256_add_epi32(sa, _mm256_shuffle_epi32(sa, _MM_SHUFFLE(1, 0, 3, 2)));
    sa = _mm256_add_epi32(sa, _mm256_shuffle_epi32(sa, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm256_sub_epi32(f, _mm256_slli_epi32(sa, 7));
}
#define IQ4_FIX minus_128_sum
#else
static inline __attribute__((always_inline)) void iq4_nl_row(const pg_block_iq4_nl *x,
        const pg_block_q8_0 *const *y, const int C, __m256i *is) {
    const __m256i q = lut32(x->qs, iqx_table(pg_kv_iq4nl)), qa = _mm256_sign_epi8(q, q);
    IQX_UNROLL for (int j = 0; j < C; j++)
        is[j] = dot_us(qa, _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)y[j]->qs), q));
}
#define IQ4_FIX IQX_AS_IS
#endif

#define IQ4_NL_DX8(x, bx, b) iqx_rows8_fp16(x, bx, b, sizeof(pg_block_iq4_nl))
IQX_ROWS8_Q8_0(vec_dot8_iq4_nl_q8_0, pg_block_iq4_nl, iq4_nl_row, IQ4_NL_DX8, IQ4_FIX)
IQX_GEMM(gemm_iq4_nl_q8_0, vec_dot8_iq4_nl_q8_0, vec_dot_iq4_nl_q8_0)

/* ---- MXFP4 · Q8_0 ---------------------------------------------------------------------------- */

static inline __m256i mxfp4_block(const pg_block_mxfp4 *x, const pg_block_q8_0 *y) {
    const __m256i q = lut32(x->qs, iqx_table(pg_kv_mxfp4));
    return dot_ss(q, _mm256_loadu_si256((const __m256i *)y->qs));
}

/* pg_e8m0_half of eight exponents (int32 lanes) in vector integer ops: (e − 1) << 23, and for
 * the two subnormal codes e < 2, 0x00200000 << e */
static inline __m256 e8m0x8_lanes(__m256i e) {
    const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __m256i sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    const __m256i is_sub = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, sub, is_sub));
}

static inline __m256 e8m0x8(const pg_block_mxfp4 *x) {
    return e8m0x8_lanes(_mm256_setr_epi32(x[0].e, x[1].e, x[2].e, x[3].e, x[4].e, x[5].e,
                                          x[6].e, x[7].e));
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

static inline __attribute__((always_inline)) void mxfp4_row(const pg_block_mxfp4 *x,
        const pg_block_q8_0 *const *y, const int C, __m256i *is) {
#ifdef IQ4_OFFSET128
    const __m256i u = lut32(x->qs, table128(pg_kv_mxfp4));
    IQX_UNROLL for (int j = 0; j < C; j++)
        is[j] = dot_us(u, _mm256_loadu_si256((const __m256i *)y[j]->qs));
#else
    const __m256i q = lut32(x->qs, iqx_table(pg_kv_mxfp4)), qa = _mm256_sign_epi8(q, q);
    IQX_UNROLL for (int j = 0; j < C; j++)
        is[j] = dot_us(qa, _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)y[j]->qs), q));
#endif
}

/* the eight rows' 2^(e − 128) of block b */
static inline __m256 mxfp4_dx8(const char *x, size_t bx, int64_t b) {
    const uint8_t *e = (const uint8_t *)x + (size_t)b * sizeof(pg_block_mxfp4);
    return e8m0x8_lanes(_mm256_setr_epi32(e[0], e[bx], e[2 * bx], e[3 * bx], e[4 * bx],
                                          e[5 * bx], e[6 * bx], e[7 * bx]));
}

IQX_ROWS8_Q8_0(vec_dot8_mxfp4_q8_0, pg_block_mxfp4, mxfp4_row, mxfp4_dx8, IQ4_FIX)
IQX_GEMM(gemm_mxfp4_q8_0, vec_dot8_mxfp4_q8_0, vec_dot_mxfp4_q8_0)

/* ---- IQ4_XS · Q8_K: Σ_ib (ls_ib − 32) · isum_ib exact in int32, one term per super-block ---- */

/* the eight scales ls_ib − 32 (6 bits: the nibble ib of scales_l, bits 2ib of scales_h) as
 * signed bytes 0..7, by spreading the bit fields to one per byte */
static inline __m128i iq4xs_scales8(const pg_block_iq4_xs *x) {
    uint32_t l32;
    memcpy(&l32, x->scales_l, 4);
    uint64_t l = l32, h = x->scales_h;
    l = (l | l << 16) & 0x0000FFFF0000FFFFull;
    l = (l | l << 8) & 0x00FF00FF00FF00FFull;
    l = (l | l << 4) & 0x0F0F0F0F0F0F0F0Full;
    h = (h | h << 24) & 0x000000FF000000FFull;
    h = (h | h << 12) & 0x000F000F000F000Full;
    h = (h | h << 6) & 0x0303030303030303ull;
    return _mm_sub_epi8(_mm_cvtsi64_si128((long long)(l | h << 4)), _mm_set1_epi8(32));
}

/* vpshufb masks: every int16 of the result = int16 number ib of the (lane-repeated) source */
#define IQ4_B2(k) 2 * (k), 2 * (k) + 1
#define IQ4_B16(k) IQ4_B2(k), IQ4_B2(k), IQ4_B2(k), IQ4_B2(k), IQ4_B2(k), IQ4_B2(k), IQ4_B2(k), \
                   IQ4_B2(k)
static const uint8_t k_iq4_bcast16[8][32] __attribute__((aligned(32))) = {
    {IQ4_B16(0), IQ4_B16(0)}, {IQ4_B16(1), IQ4_B16(1)}, {IQ4_B16(2), IQ4_B16(2)},
    {IQ4_B16(3), IQ4_B16(3)}, {IQ4_B16(4), IQ4_B16(4)}, {IQ4_B16(5), IQ4_B16(5)},
    {IQ4_B16(6), IQ4_B16(6)}, {IQ4_B16(7), IQ4_B16(7)},
};

static inline __attribute__((always_inline)) void iq4_xs_row(const pg_block_iq4_xs *x,
        const pg_block_q8_K *const *y, const int C, __m256i *is) {
    const __m256i lut = iqx_table(pg_kv_iq4nl);
    const __m256i sc = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(iq4xs_scales8(x)));
    IQX_UNROLL for (int j = 0; j < C; j++) is[j] = _mm256_setzero_si256();
    IQX_UNROLL for (int ib = 0; ib < 8; ib++) {
        const __m256i q = lut32(x->qs + 16 * ib, lut), qa = _mm256_sign_epi8(q, q);
        const __m256i s = _mm256_shuffle_epi8(sc, _mm256_load_si256((const __m256i *)k_iq4_bcast16[ib]));
        /* pairs of |q|·±a fit int16 (2·127·127); times the scale into int32 lanes */
        IQX_UNROLL for (int j = 0; j < C; j++)
            is[j] = IQ4_DOT_SCALED(is[j], qa, _mm256_sign_epi8(_mm256_loadu_si256(
                                       (const __m256i *)(y[j]->qs + 32 * ib)), q), s);
    }
}

static void vec_dot_iq4_xs_q8_K(int64_t n, float *restrict s, const void *restrict vx,
                                const void *restrict vy) {
    const pg_block_iq4_xs *x = vx;
    const pg_block_q8_K *y = vy;
    float sum = 0;
    for (int64_t i = 0; i < n / PG_QK_K; i++) {
        const pg_block_q8_K *yi = &y[i];
        __m256i is;
        iq4_xs_row(&x[i], &yi, 1, &is);
        sum += (h2f(x[i].d) * y[i].d) * (float)hsum_epi32(is);
    }
    *s = sum;
}

#define IQ4_XS_DX8(x, bx, b, size) iqx_rows8_fp16(x, bx, b, size)
IQX_ROWS8_Q8K(vec_dot8_iq4_xs_q8_K, pg_block_iq4_xs, iq4_xs_row, IQ4_XS_DX8, 1.0f)
IQX_GEMM(gemm_iq4_xs_q8_K, vec_dot8_iq4_xs_q8_K, vec_dot_iq4_xs_q8_K)
