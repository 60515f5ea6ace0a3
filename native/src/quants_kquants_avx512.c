/* K-quants: optional AVX-512 dot kernels (an extra beside AVX2, never required).
 *
 * Installed only on CPUs with AVX512-VNNI (besides F/BW/VL, which the path itself requires).
 * Same plan as the AVX2 kernels (unsigned levels, maddubs into int16 pairs, offsets and mins
 * through the bsums) on 64-element rows, with VPDPWSSD applying the per-sub-block int16 scales
 * and accumulating in one instruction. A 64-element row spans four 128-bit lanes: vpshufb masks
 * pick, per lane, the scale of the sub-block that lane holds. Integer sums are exact and each
 * super-block's fp32 term is the scalar kernel's, added in block order: the scalar kernel's
 * bits, as on every path (tests/test_gemm.c). */
#include <immintrin.h>

#include "kquants.h"
#include "kquants_x86.h"
#include "pg_internal.h"
#include "quants.h"

static inline __m512i loadu512(const void *p) { return _mm512_loadu_si512(p); }

/* the 16 int32 lanes of v summed pairwise into 8 (exact) */
static inline __m256i half_sum(__m512i v) {
    return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

/* k_lane16[m]: in 128-bit lane k, int16 number sel[m][k] of that lane, repeated. */
#define L2(k) 2 * (k), 2 * (k) + 1
#define L16(k) L2(k), L2(k), L2(k), L2(k), L2(k), L2(k), L2(k), L2(k)
static const uint8_t k_lane16[6][64] __attribute__((aligned(64))) = {
    /* Q4_K/Q5_K: a row of 64 = sub-blocks of 32 in lanes (0,1) and (2,3): 2m, 2m+1 */
    {L16(0), L16(0), L16(1), L16(1)}, {L16(2), L16(2), L16(3), L16(3)},
    {L16(4), L16(4), L16(5), L16(5)}, {L16(6), L16(6), L16(7), L16(7)},
    /* 16-element sub-blocks, one per lane: 0..3, then 4..7 */
    {L16(0), L16(1), L16(2), L16(3)}, {L16(4), L16(5), L16(6), L16(7)},
};
static inline __m512i lane16_mask(int m) { return _mm512_load_si512(k_lane16[m]); }

/* sumi += Σ per-lane scale · (64 levels · 64 activations) */
static inline __m512i dot64(__m512i sumi, __m512i q, const int8_t *a, __m512i sc, int m) {
    return _mm512_dpwssd_epi32(sumi, _mm512_maddubs_epi16(q, loadu512(a)),
                               _mm512_shuffle_epi8(sc, lane16_mask(m)));
}

/* ---- Q2_K / Q3_K: 2-bit rows of 32 bytes, levels of element 128h + 32j + l at bits 2j ----- */

/* Both 128-element halves of a Q2_K/Q3_K block as four 64-level rows, without the high bit:
 * rows (h, p) = elements 128h + 64p .. +63 */
#define KQ_LOW2(qs32, p) \
    _mm512_and_si512((p) ? _mm512_srli_epi16(qs32, 4) : (qs32), m3)

static inline void vec_dot_q2_K_q8_K_avx512_blk(const pg_block_q2_K *x, const pg_block_q8_K *y, int64_t i,
        kq_blk *o) {
    const __m512i m3 = _mm512_set1_epi8(3);
    const __m128i m4 = _mm_set1_epi8(0xF);
    const __m128 dd = k4_dmin(&x[i].d, y[i].d);   /* d, dmin */
    const __m128i s8 = _mm_loadu_si128((const __m128i *)x[i].scales);
    const __m256i sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(s8, m4));
    const __m256i mn16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s8, 4), m4));
    const __m256i summs = _mm256_madd_epi16(loadu(y[i].bsums), mn16);
    __m512i sumi = _mm512_setzero_si512();
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m256i q = loadu(x[i].qs + 32 * h);
        /* [q | q >> 2]: j = 0 and 1 in the two halves; >> 4 gives j = 2 and 3 */
        const __m512i qq = _mm512_inserti64x4(_mm512_castsi256_si512(q),
                                              _mm256_srli_epi16(q, 2), 1);
        const __m512i sc = _mm512_broadcast_i32x4(h ? _mm256_extracti128_si256(sc16, 1)
                                                    : _mm256_castsi256_si128(sc16));
        const int8_t *a = y[i].qs + 128 * h;
        sumi = dot64(sumi, KQ_LOW2(qq, 0), a, sc, 4);
        sumi = dot64(sumi, KQ_LOW2(qq, 1), a + 64, sc, 5);
    }
    o->is = half_sum(sumi);
    o->ms = summs;
    o->d = dd_d(dd);
    o->dmin = dd_dmin(dd);
}

static void vec_dot_q2_K_q8_K_avx512(int64_t n, float *restrict s, const void *restrict vx,
        const void *restrict vy) {
    const pg_block_q2_K *x = vx;
    const pg_block_q8_K *y = vy;
    KQ_DOT_LOOP(vec_dot_q2_K_q8_K_avx512_blk, n / PG_QK_K, 1);
}

static inline void vec_dot_q3_K_q8_K_avx512_blk(const pg_block_q3_K *x, const pg_block_q8_K *y, int64_t i,
        kq_blk *o) {
    const __m512i m3 = _mm512_set1_epi8(3), m4b = _mm512_set1_epi8(4);
    const float d = h2f(x[i].d) * y[i].d;
    const __m256i sc16 = _mm256_cvtepi8_epi16(k3_scales(x[i].qs + 62));
    /* level q = u - 4 with u = q2 + 4h: subtract 4 Σ_k S_k bsum_k */
    const __m256i msum = _mm256_slli_epi32(_mm256_madd_epi16(loadu(y[i].bsums), sc16), 2);
    __m512i sumi = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_zextsi256_si512(msum));
    const __m256i hm = loadu(x[i].hmask);
    /* [hm | hm >> 1]: bit 4h + 2p of the low half and 4h + 2p + 1 of the high half line up */
    const __m512i hh = _mm512_inserti64x4(_mm512_castsi256_si512(hm),
                                          _mm256_srli_epi16(hm, 1), 1);
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m256i q = loadu(x[i].qs + 32 * h);
        const __m512i qq = _mm512_inserti64x4(_mm512_castsi256_si512(q),
                                              _mm256_srli_epi16(q, 2), 1);
        const __m512i sc = _mm512_broadcast_i32x4(h ? _mm256_extracti128_si256(sc16, 1)
                                                    : _mm256_castsi256_si128(sc16));
        const int8_t *a = y[i].qs + 128 * h;
        /* bit 4h (p = 0) or 4h + 2 (p = 1) moved to bit 2; bits shifted in from the
         * neighbouring byte land above bit 2 and are masked off */
        const __m512i h0 = h ? _mm512_srli_epi16(hh, 2) : _mm512_slli_epi16(hh, 2);
        const __m512i h1 = h ? _mm512_srli_epi16(hh, 4) : hh;
        sumi = dot64(sumi, _mm512_or_si512(KQ_LOW2(qq, 0), _mm512_and_si512(h0, m4b)), a,
                     sc, 4);
        sumi = dot64(sumi, _mm512_or_si512(KQ_LOW2(qq, 1), _mm512_and_si512(h1, m4b)), a + 64,
                     sc, 5);
    }
    o->is = half_sum(sumi);
    o->ms = _mm256_setzero_si256();
    o->d = d;
    o->dmin = 0.0f;
}

static void vec_dot_q3_K_q8_K_avx512(int64_t n, float *restrict s, const void *restrict vx,
        const void *restrict vy) {
    const pg_block_q3_K *x = vx;
    const pg_block_q8_K *y = vy;
    KQ_DOT_LOOP(vec_dot_q3_K_q8_K_avx512_blk, n / PG_QK_K, 0);
}

/* ---- Q4_K / Q5_K ------------------------------------------------------------------------- */

/* qs bytes 64h..64h+63 hold chunks 2h and 2h+1 (32 bytes each: low nibbles = sub-block 2c,
 * high = 2c+1). Regrouped so that each row is 64 consecutive elements:
 *   row 0 = [lo(chunk 2h) | hi(chunk 2h)], row 1 = [lo(chunk 2h+1) | hi(chunk 2h+1)] */
static inline __m512i k4_row(__m512i lo, __m512i hi, int r) {
    return r ? _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(3, 2, 3, 2))
             : _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(1, 0, 1, 0));
}

static inline void vec_dot_q4_K_q8_K_avx512_blk(const pg_block_q4_K *x, const pg_block_q8_K *y, int64_t i,
        kq_blk *o) {
    const __m512i m4 = _mm512_set1_epi8(0xF);
    const __m128 dd = k4_dmin(&x[i].d, y[i].d);   /* d, dmin */
    const __m128i sm = k4_scales(x[i].scales);
    const __m256i summs = k4_mins(sm, y[i].bsums);
    const __m512i sc = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(sm));
    __m512i sumi = _mm512_setzero_si512();
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m512i b = loadu512(x[i].qs + 64 * h);
        const __m512i lo = _mm512_and_si512(b, m4);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(b, 4), m4);
        const int8_t *a = y[i].qs + 128 * h;
        sumi = dot64(sumi, k4_row(lo, hi, 0), a, sc, 2 * h);
        sumi = dot64(sumi, k4_row(lo, hi, 1), a + 64, sc, 2 * h + 1);
    }
    o->is = half_sum(sumi);
    o->ms = summs;
    o->d = dd_d(dd);
    o->dmin = dd_dmin(dd);
}

static void vec_dot_q4_K_q8_K_avx512(int64_t n, float *restrict s, const void *restrict vx,
        const void *restrict vy) {
    const pg_block_q4_K *x = vx;
    const pg_block_q8_K *y = vy;
    KQ_DOT_LOOP(vec_dot_q4_K_q8_K_avx512_blk, n / PG_QK_K, 1);
}

static inline void vec_dot_q5_K_q8_K_avx512_blk(const pg_block_q5_K *x, const pg_block_q8_K *y, int64_t i,
        kq_blk *o) {
    const __m512i m4 = _mm512_set1_epi8(0xF), m16 = _mm512_set1_epi8(0x10);
    /* the 5th bits of chunks 2h (bits 4h, 4h+1) and 2h+1 (bits 4h+2, 4h+3) to bits 0, 1 */
    const __m512i shift[2] = {
        _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1),
        _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(6), 1),
    };
    const __m128 dd = k4_dmin(&x[i].d, y[i].d);   /* d, dmin */
    const __m128i sm = k4_scales(x[i].scales);
    const __m256i summs = k4_mins(sm, y[i].bsums);
    const __m512i sc = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(sm));
    const __m512i qh = _mm512_broadcast_i64x4(loadu(x[i].qh));
    __m512i sumi = _mm512_setzero_si512();
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m512i b = loadu512(x[i].qs + 64 * h);
        /* word shifts by <= 6: bits 0 and 1 of each byte still come from that byte */
        const __m512i hb = _mm512_srlv_epi16(qh, shift[h]);
        const __m512i lo = _mm512_or_si512(_mm512_and_si512(b, m4),
                                           _mm512_and_si512(_mm512_slli_epi16(hb, 4), m16));
        const __m512i hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(b, 4), m4),
                                           _mm512_and_si512(_mm512_slli_epi16(hb, 3), m16));
        const int8_t *a = y[i].qs + 128 * h;
        sumi = dot64(sumi, k4_row(lo, hi, 0), a, sc, 2 * h);
        sumi = dot64(sumi, k4_row(lo, hi, 1), a + 64, sc, 2 * h + 1);
    }
    o->is = half_sum(sumi);
    o->ms = summs;
    o->d = dd_d(dd);
    o->dmin = dd_dmin(dd);
}

static void vec_dot_q5_K_q8_K_avx512(int64_t n, float *restrict s, const void *restrict vx,
        const void *restrict vy) {
    const pg_block_q5_K *x = vx;
    const pg_block_q8_K *y = vy;
    KQ_DOT_LOOP(vec_dot_q5_K_q8_K_avx512_blk, n / PG_QK_K, 1);
}

/* ---- Q6_K -------------------------------------------------------------------------------- */

static inline void vec_dot_q6_K_q8_K_avx512_blk(const pg_block_q6_K *x, const pg_block_q8_K *y, int64_t i,
        kq_blk *o) {
    const __m512i m4 = _mm512_set1_epi8(0xF), m30 = _mm512_set1_epi8(0x30);
    const float d = h2f(x[i].d) * y[i].d;
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x[i].scales));
    /* level q = u - 32 with u = lo4 | hi2 << 4: subtract 32 Σ_k sc_k bsum_k */
    const __m256i msum = _mm256_slli_epi32(_mm256_madd_epi16(loadu(y[i].bsums), sc16), 5);
    __m512i sumi = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_zextsi256_si512(msum));
    /* per half h: [qh_h | qh_h >> 2], so that groups g and g+1 share one mask */
    const __m512i q = loadu512(x[i].qh), qs2 = _mm512_srli_epi16(q, 2);
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m512i hb = h ? _mm512_shuffle_i64x2(q, qs2, _MM_SHUFFLE(3, 2, 3, 2))
                             : _mm512_shuffle_i64x2(q, qs2, _MM_SHUFFLE(1, 0, 1, 0));
        const __m512i l = loadu512(x[i].ql + 64 * h);
        const __m512i u01 = _mm512_or_si512(_mm512_and_si512(l, m4),
                                            _mm512_and_si512(_mm512_slli_epi16(hb, 4), m30));
        const __m512i u23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                                            _mm512_and_si512(hb, m30));
        const __m512i sc = _mm512_broadcast_i32x4(h ? _mm256_extracti128_si256(sc16, 1)
                                                    : _mm256_castsi256_si128(sc16));
        const int8_t *a = y[i].qs + 128 * h;
        sumi = dot64(sumi, u01, a, sc, 4);
        sumi = dot64(sumi, u23, a + 64, sc, 5);
    }
    o->is = half_sum(sumi);
    o->ms = _mm256_setzero_si256();
    o->d = d;
    o->dmin = 0.0f;
}

static void vec_dot_q6_K_q8_K_avx512(int64_t n, float *restrict s, const void *restrict vx,
        const void *restrict vy) {
    const pg_block_q6_K *x = vx;
    const pg_block_q8_K *y = vy;
    KQ_DOT_LOOP(vec_dot_q6_K_q8_K_avx512_blk, n / PG_QK_K, 0);
}

/* ---- traits ------------------------------------------------------------------------------ */

void pg_fill_kquants_avx512(pg_type_traits *tbl) {
    if (!(pg_g_cpu_features & PG_CPU_AVX512VNNI)) return;
    tbl[PG_TYPE_Q2_K].vec_dot = vec_dot_q2_K_q8_K_avx512;
    tbl[PG_TYPE_Q3_K].vec_dot = vec_dot_q3_K_q8_K_avx512;
    tbl[PG_TYPE_Q4_K].vec_dot = vec_dot_q4_K_q8_K_avx512;
    tbl[PG_TYPE_Q5_K].vec_dot = vec_dot_q5_K_q8_K_avx512;
    tbl[PG_TYPE_Q6_K].vec_dot = vec_dot_q6_K_q8_K_avx512;
}
