/* K-quants: AVX2 + FMA + F16C kernels (dots with Q8_K, the Q8_K activation quantizer).
 *
 * Exactness contract with the scalar reference (quants_kquants.c), checked by
 * tests/test_quants_kquants.c:
 *   - Q8_K from_float: bit-exact (same amax scan result, same nearest_int bit trick);
 *   - vec_dot: bit-exact. The integer sums of a super-block are exact; its fp32 term is the
 *     scalar kernel's (d·isum − dmin·summs, or d·isum), added to one running sum in block
 *     order (kquants_x86.h), so a dot has the same bits on every path and in every gemm block
 *     (tests/test_gemm.c).
 *
 * The dot kernels share one plan: weights become unsigned levels (0..2^b-1) so that
 * _mm256_maddubs_epi16 multiplies them with the signed Q8_K activations into int16 pairs (no
 * saturation: |pair| <= 2*63*127). _mm256_madd_epi16 then applies the per-sub-block scale and
 * widens to int32. Offsets of signed formats (Q3_K: -4, Q6_K: -32) and the mins of Q2_K, Q4_K and
 * Q5_K are applied once per super-block through the activation's bsums (Σ of 16 activations),
 * never per element. */
#include <immintrin.h>
#include <string.h>

#include "kquants.h"
#include "kquants_x86.h"
#include "quants.h"

/* ---- helpers ----------------------------------------------------------------------------- */

/* vpshufb masks (memory order), loaded from tables so that loops need no constant folding.
 * k_bcast[k]: int16 k of each 128-bit lane over that lane (sub-block k of 32: Q4_K, Q5_K).
 * k_pair[g]: int16 2g over the low lane and 2g+1 over the high lane (a 32-byte row of 16-element
 * sub-blocks covers sub-block 2g with its low half and 2g+1 with its high half: Q2_K, Q3_K,
 * Q6_K). */
#define PG_B2(k) 2 * (k), 2 * (k) + 1
#define PG_B16(k) PG_B2(k), PG_B2(k), PG_B2(k), PG_B2(k), PG_B2(k), PG_B2(k), PG_B2(k), PG_B2(k)
static const uint8_t k_bcast[8][32] __attribute__((aligned(32))) = {
    {PG_B16(0), PG_B16(0)}, {PG_B16(1), PG_B16(1)}, {PG_B16(2), PG_B16(2)},
    {PG_B16(3), PG_B16(3)}, {PG_B16(4), PG_B16(4)}, {PG_B16(5), PG_B16(5)},
    {PG_B16(6), PG_B16(6)}, {PG_B16(7), PG_B16(7)},
};
static const uint8_t k_pair[4][32] __attribute__((aligned(32))) = {
    {PG_B16(0), PG_B16(1)}, {PG_B16(2), PG_B16(3)}, {PG_B16(4), PG_B16(5)}, {PG_B16(6), PG_B16(7)},
};
static inline __m256i bcast16_mask(int k) {
    return _mm256_load_si256((const __m256i *)k_bcast[k]);
}
static inline __m256i pair16_mask(int g) { return _mm256_load_si256((const __m256i *)k_pair[g]); }

/* Σ_k scale_k · (32 levels · 32 activations), for the 8 int32 lanes of one 32-byte row.
 * q: unsigned levels, a: activations, sc: int16 scales laid out for `mask`. */
static inline __m256i dot32(__m256i q, const int8_t *a, __m256i sc, __m256i mask) {
    const __m256i p = _mm256_maddubs_epi16(q, loadu(a));
    return _mm256_madd_epi16(p, _mm256_shuffle_epi8(sc, mask));
}

/* ---- Q8_K activation quantizer ------------------------------------------------------------- */

static void quantize_row_q8_K_avx2(const float *restrict x, void *restrict vy, int64_t n) {
    pg_block_q8_K *y = vy;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 magic = _mm256_set1_ps(12582912.f);
    const __m256i mant = _mm256_set1_epi32(0x007fffff), bias = _mm256_set1_epi32(0x00400000);
    const __m256i q127 = _mm256_set1_epi32(127), low8 = _mm256_set1_epi32(0xff);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    for (int64_t i = 0; i < n / PG_QK_K; i++, x += PG_QK_K) {
        /* amax; max_ps(|v|, acc) returns acc when |v| is NaN, like the scalar `ax > amax` */
        __m256 m0 = _mm256_setzero_ps(), m1 = m0, m2 = m0, m3 = m0;
        for (int j = 0; j < PG_QK_K; j += 32) {
            m0 = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)), m0);
            m1 = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + j + 8)), m1);
            m2 = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + j + 16)), m2);
            m3 = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + j + 24)), m3);
        }
        __m256 m = _mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        const float amax = _mm_cvtss_f32(h);
        if (amax == 0) {
            memset(&y[i], 0, sizeof(y[i]));
            continue;
        }
        /* the signed value at the first index reaching amax (the scalar scan's strict >) */
        const __m256 va = _mm256_set1_ps(amax);
        float max = 0;
        for (int j = 0; j < PG_QK_K; j += 8) {
            const __m256 v = _mm256_loadu_ps(x + j);
            const int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, v), va,
                                                              _CMP_EQ_OQ));
            if (mask) { max = x[j + __builtin_ctz((unsigned)mask)]; break; }
        }
        const float iscale = -127.f / max;
        const __m256 vs = _mm256_set1_ps(iscale);
        for (int j = 0; j < PG_QK_K; j += 32) {
            __m256i q[4];
            for (int k = 0; k < 4; k++) {
                const __m256 t = _mm256_add_ps(_mm256_mul_ps(vs, _mm256_loadu_ps(x + j + 8 * k)),
                                               magic);
                const __m256i r = _mm256_sub_epi32(_mm256_and_si256(_mm256_castps_si256(t), mant),
                                                   bias);
                /* keep the low byte, as the scalar (int8_t) cast does (matters only for
                 * garbage from non-finite scales); the unsigned packs then never saturate */
                q[k] = _mm256_and_si256(_mm256_min_epi32(r, q127), low8);
            }
            const __m256i p = _mm256_packus_epi16(_mm256_packus_epi32(q[0], q[1]),
                                                  _mm256_packus_epi32(q[2], q[3]));
            const __m256i b = _mm256_permutevar8x32_epi32(p, perm);
            _mm256_storeu_si256((__m256i *)(y[i].qs + j), b);
            /* bsums of the two groups of 16: bytes + 128 are unsigned; psadbw sums 8 of them */
            const __m256i sad = _mm256_sad_epu8(_mm256_xor_si256(b, flip), _mm256_setzero_si256());
            const __m128i lo = _mm256_castsi256_si128(sad), hi = _mm256_extracti128_si256(sad, 1);
            y[i].bsums[j / 16] = (int16_t)(_mm_cvtsi128_si32(lo) + _mm_extract_epi32(lo, 2) - 2048);
            y[i].bsums[j / 16 + 1] =
                (int16_t)(_mm_cvtsi128_si32(hi) + _mm_extract_epi32(hi, 2) - 2048);
        }
        y[i].d = 1 / iscale;
    }
}

/* ---- Q2_K -------------------------------------------------------------------------------- */

static inline void vec_dot_q2_K_q8_K_avx2_blk(const pg_block_q2_K *x, const pg_block_q8_K *y, int64_t i,
        kq_blk *o) {
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m128i m4 = _mm_set1_epi8(0xF);
    const __m128 dd = k4_dmin(&x[i].d, y[i].d);   /* d, dmin */
    const __m128i s8 = _mm_loadu_si128((const __m128i *)x[i].scales);
    const __m256i sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(s8, m4));
    const __m256i mn16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s8, 4), m4));
    const __m256i summs = _mm256_madd_epi16(loadu(y[i].bsums), mn16);
    __m256i sum0 = _mm256_setzero_si256(), sum1 = sum0;
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m256i sc = h ? _mm256_permute4x64_epi64(sc16, 0xEE)
                             : _mm256_permute4x64_epi64(sc16, 0x44);
        const __m256i qs = loadu(x[i].qs + 32 * h);
        const int8_t *a = y[i].qs + 128 * h;
        sum0 = _mm256_add_epi32(sum0, dot32(_mm256_and_si256(qs, m3), a, sc, pair16_mask(0)));
        sum1 = _mm256_add_epi32(sum1, dot32(_mm256_and_si256(_mm256_srli_epi16(qs, 2), m3),
                                            a + 32, sc, pair16_mask(1)));
        sum0 = _mm256_add_epi32(sum0, dot32(_mm256_and_si256(_mm256_srli_epi16(qs, 4), m3),
                                            a + 64, sc, pair16_mask(2)));
        sum1 = _mm256_add_epi32(sum1, dot32(_mm256_and_si256(_mm256_srli_epi16(qs, 6), m3),
                                            a + 96, sc, pair16_mask(3)));
    }
    o->is = _mm256_add_epi32(sum0, sum1);
    o->ms = summs;
    o->d = dd_d(dd);
    o->dmin = dd_dmin(dd);
}

static void vec_dot_q2_K_q8_K_avx2(int64_t n, float *restrict s, const void *restrict vx,
        const void *restrict vy) {
    const pg_block_q2_K *x = vx;
    const pg_block_q8_K *y = vy;
    KQ_DOT_LOOP(vec_dot_q2_K_q8_K_avx2_blk, n / PG_QK_K, 1);
}

/* ---- Q3_K -------------------------------------------------------------------------------- */

/* hmask bit b of each byte moved to bit 2 (the level's third bit: u = q2 + 4h, 0..7) */
#define Q3_HBIT(hm, b) \
    ((b) >= 2 ? _mm256_and_si256(_mm256_srli_epi16(hm, (b) - 2), m4b) \
              : _mm256_and_si256(_mm256_slli_epi16(hm, 2 - (b)), m4b))

static inline void vec_dot_q3_K_q8_K_avx2_blk(const pg_block_q3_K *x, const pg_block_q8_K *y, int64_t i,
        kq_blk *o) {
    const __m256i m3 = _mm256_set1_epi8(3), m4b = _mm256_set1_epi8(4);
    const float d = h2f(x[i].d) * y[i].d;
    const __m256i sc16 = _mm256_cvtepi8_epi16(k3_scales(x[i].qs + 62));
    /* level q = u - 4: Σ S_k Σ q·a = Σ S_k Σ u·a - 4 Σ S_k bsum_k */
    __m256i sum0 = _mm256_slli_epi32(_mm256_madd_epi16(loadu(y[i].bsums), sc16), 2);
    sum0 = _mm256_sub_epi32(_mm256_setzero_si256(), sum0);
    __m256i sum1 = _mm256_setzero_si256();
    const __m256i hm = loadu(x[i].hmask);
    {
        const __m256i sc = _mm256_permute4x64_epi64(sc16, 0x44);
        const __m256i qs = loadu(x[i].qs);
        const int8_t *a = y[i].qs;
        const __m256i u0 = _mm256_or_si256(_mm256_and_si256(qs, m3), Q3_HBIT(hm, 0));
        const __m256i u1 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qs, 2), m3),
                                           Q3_HBIT(hm, 1));
        const __m256i u2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qs, 4), m3),
                                           Q3_HBIT(hm, 2));
        const __m256i u3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qs, 6), m3),
                                           Q3_HBIT(hm, 3));
        sum0 = _mm256_add_epi32(sum0, dot32(u0, a, sc, pair16_mask(0)));
        sum1 = _mm256_add_epi32(sum1, dot32(u1, a + 32, sc, pair16_mask(1)));
        sum0 = _mm256_add_epi32(sum0, dot32(u2, a + 64, sc, pair16_mask(2)));
        sum1 = _mm256_add_epi32(sum1, dot32(u3, a + 96, sc, pair16_mask(3)));
    }
    {
        const __m256i sc = _mm256_permute4x64_epi64(sc16, 0xEE);
        const __m256i qs = loadu(x[i].qs + 32);
        const int8_t *a = y[i].qs + 128;
        const __m256i u0 = _mm256_or_si256(_mm256_and_si256(qs, m3), Q3_HBIT(hm, 4));
        const __m256i u1 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qs, 2), m3),
                                           Q3_HBIT(hm, 5));
        const __m256i u2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qs, 4), m3),
                                           Q3_HBIT(hm, 6));
        const __m256i u3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qs, 6), m3),
                                           Q3_HBIT(hm, 7));
        sum0 = _mm256_add_epi32(sum0, dot32(u0, a, sc, pair16_mask(0)));
        sum1 = _mm256_add_epi32(sum1, dot32(u1, a + 32, sc, pair16_mask(1)));
        sum0 = _mm256_add_epi32(sum0, dot32(u2, a + 64, sc, pair16_mask(2)));
        sum1 = _mm256_add_epi32(sum1, dot32(u3, a + 96, sc, pair16_mask(3)));
    }
    o->is = _mm256_add_epi32(sum0, sum1);
    o->ms = _mm256_setzero_si256();
    o->d = d;
    o->dmin = 0.0f;
}

static void vec_dot_q3_K_q8_K_avx2(int64_t n, float *restrict s, const void *restrict vx,
        const void *restrict vy) {
    const pg_block_q3_K *x = vx;
    const pg_block_q8_K *y = vy;
    KQ_DOT_LOOP(vec_dot_q3_K_q8_K_avx2_blk, n / PG_QK_K, 0);
}

/* ---- Q4_K / Q5_K ------------------------------------------------------------------------- */

static inline void vec_dot_q4_K_q8_K_avx2_blk(const pg_block_q4_K *x, const pg_block_q8_K *y, int64_t i,
        kq_blk *o) {
    const __m256i m4 = _mm256_set1_epi8(0xF);
    const __m128 dd = k4_dmin(&x[i].d, y[i].d);   /* d, dmin */
    const __m128i sm = k4_scales(x[i].scales);
    const __m256i summs = k4_mins(sm, y[i].bsums);
    const __m256i sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));
    const uint8_t *q = x[i].qs;
    const int8_t *a = y[i].qs;
    __m256i sum0 = _mm256_setzero_si256(), sum1 = sum0;
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        const __m256i b = loadu(q + 32 * c);
        sum0 = _mm256_add_epi32(sum0, dot32(_mm256_and_si256(b, m4), a + 64 * c, sc,
                                            bcast16_mask(2 * c)));
        sum1 = _mm256_add_epi32(sum1, dot32(_mm256_and_si256(_mm256_srli_epi16(b, 4), m4),
                                            a + 64 * c + 32, sc, bcast16_mask(2 * c + 1)));
    }
    o->is = _mm256_add_epi32(sum0, sum1);
    o->ms = summs;
    o->d = dd_d(dd);
    o->dmin = dd_dmin(dd);
}

static void vec_dot_q4_K_q8_K_avx2(int64_t n, float *restrict s, const void *restrict vx,
        const void *restrict vy) {
    const pg_block_q4_K *x = vx;
    const pg_block_q8_K *y = vy;
    KQ_DOT_LOOP(vec_dot_q4_K_q8_K_avx2_blk, n / PG_QK_K, 1);
}

static inline void vec_dot_q5_K_q8_K_avx2_blk(const pg_block_q5_K *x, const pg_block_q8_K *y, int64_t i,
        kq_blk *o) {
    const __m256i m4 = _mm256_set1_epi8(0xF), m16 = _mm256_set1_epi8(0x10);
    const __m128 dd = k4_dmin(&x[i].d, y[i].d);   /* d, dmin */
    const __m128i sm = k4_scales(x[i].scales);
    const __m256i summs = k4_mins(sm, y[i].bsums);
    const __m256i sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));
    const uint8_t *q = x[i].qs;
    const int8_t *a = y[i].qs;
    /* bit 2c of qh[l] is the 5th bit of sub-block 2c, bit 2c+1 of 2c+1: shift right by 2 per
     * chunk (bits crossing into a byte from its neighbour only reach bits 6..7, never used) */
    __m256i h = loadu(x[i].qh);
    __m256i sum0 = _mm256_setzero_si256(), sum1 = sum0;
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        const __m256i b = loadu(q + 32 * c);
        const __m256i lo = _mm256_or_si256(_mm256_and_si256(b, m4),
                                           _mm256_and_si256(_mm256_slli_epi16(h, 4), m16));
        const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b, 4), m4),
                                           _mm256_and_si256(_mm256_slli_epi16(h, 3), m16));
        h = _mm256_srli_epi16(h, 2);
        sum0 = _mm256_add_epi32(sum0, dot32(lo, a + 64 * c, sc, bcast16_mask(2 * c)));
        sum1 = _mm256_add_epi32(sum1, dot32(hi, a + 64 * c + 32, sc, bcast16_mask(2 * c + 1)));
    }
    o->is = _mm256_add_epi32(sum0, sum1);
    o->ms = summs;
    o->d = dd_d(dd);
    o->dmin = dd_dmin(dd);
}

static void vec_dot_q5_K_q8_K_avx2(int64_t n, float *restrict s, const void *restrict vx,
        const void *restrict vy) {
    const pg_block_q5_K *x = vx;
    const pg_block_q8_K *y = vy;
    KQ_DOT_LOOP(vec_dot_q5_K_q8_K_avx2_blk, n / PG_QK_K, 1);
}

/* ---- Q6_K -------------------------------------------------------------------------------- */

static inline void vec_dot_q6_K_q8_K_avx2_blk(const pg_block_q6_K *x, const pg_block_q8_K *y, int64_t i,
        kq_blk *o) {
    const float d = h2f(x[i].d) * y[i].d;
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x[i].scales));
    /* level q = u - 32 with u = lo4 | hi2 << 4 in 0..63: subtract 32 Σ_k sc_k bsum_k */
    __m256i sum0 = _mm256_slli_epi32(_mm256_madd_epi16(loadu(y[i].bsums), sc16), 5);
    sum0 = _mm256_sub_epi32(_mm256_setzero_si256(), sum0);
    __m256i sum1 = _mm256_setzero_si256();
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m256i sc = h ? _mm256_permute4x64_epi64(sc16, 0xEE)
                             : _mm256_permute4x64_epi64(sc16, 0x44);
        const int8_t *a = y[i].qs + 128 * h;
        __m256i u[4];
        pg_q6k_half_levels(&x[i], h, u);
        sum0 = _mm256_add_epi32(sum0, dot32(u[0], a, sc, pair16_mask(0)));
        sum1 = _mm256_add_epi32(sum1, dot32(u[1], a + 32, sc, pair16_mask(1)));
        sum0 = _mm256_add_epi32(sum0, dot32(u[2], a + 64, sc, pair16_mask(2)));
        sum1 = _mm256_add_epi32(sum1, dot32(u[3], a + 96, sc, pair16_mask(3)));
    }
    o->is = _mm256_add_epi32(sum0, sum1);
    o->ms = _mm256_setzero_si256();
    o->d = d;
    o->dmin = 0.0f;
}

static void vec_dot_q6_K_q8_K_avx2(int64_t n, float *restrict s, const void *restrict vx,
        const void *restrict vy) {
    const pg_block_q6_K *x = vx;
    const pg_block_q8_K *y = vy;
    KQ_DOT_LOOP(vec_dot_q6_K_q8_K_avx2_blk, n / PG_QK_K, 0);
}

/* ---- vec_dot8: eight weight rows · up to PG_DOT8_MAX_NC activation rows --------------------- */

/* Each weight row's super-block is unpacked once and dotted with every activation row (the
 * integer sums as the vec_dots above form them); then, per activation row, the eight rows'
 * exact sums are folded into one register (lane r = row r) and the scalar kernel's block terms
 * are formed in lanes and added in block order: every lane has vec_dot's bits. Decode (one
 * row) gains the prefetch of the next group of rows and no per-row horizontal reductions; a
 * few tokens (speculative verification, a few server streams) read and unpack the weights
 * once. */

#define KQ_UNROLL _Pragma("GCC unroll 8")

/* C activation rows at a time (at most 4: 8 rows × C partial sums, in L1) */
#define KQ_ROWS8_MAX_C 4

/* a, b: kq_fold4 of rows 0..3 and 4..7 -> lane r = row r's total (exact) */
static inline __m256i kq_halves8(__m256i a, __m256i b) {
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20),
                            _mm256_permute2x128_si256(a, b, 0x31));
}

/* k4_scales of two blocks' scales (p0, p1: 4 bytes into each block), one per lane */
static inline __m256i kq_scales2(const char *p0, const char *p1) {
    const __m256i u = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)p0)),
        _mm_loadu_si128((const __m128i *)p1), 1);
    const __m256i a = _mm256_srlv_epi32(_mm256_shuffle_epi32(u, _MM_SHUFFLE(2, 1, 2, 0)),
                                        _mm256_setr_epi32(0, 0, 0, 4, 0, 0, 0, 4));
    const __m256i h = _mm256_srli_epi32(_mm256_shuffle_epi32(u, _MM_SHUFFLE(1, 1, 0, 0)), 2);
    const __m256i lo = _mm256_and_si256(a, _mm256_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f,
                                                             0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f,
                                                             0x3f3f3f3f, 0x0f0f0f0f));
    const __m256i hi = _mm256_and_si256(h, _mm256_setr_epi32(0, 0x30303030, 0, 0x30303030, 0,
                                                             0x30303030, 0, 0x30303030));
    return _mm256_or_si256(lo, hi);
}

/* the mins' totals of rows 0..7 from the hadds of kq_rows8 (f0: rows 0..3, f1: rows 4..7, each
 * lane 0 = rows 4h, 4h + 2, lane 1 = rows 4h + 1, 4h + 3, two partials each) */
static inline __m256i kq_mins8(__m256i f0, __m256i f1) {
    return _mm256_permutevar8x32_epi32(_mm256_hadd_epi32(f0, f1),
                                       _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* The partial integer sums of one weight row's super-block x with C activation blocks y[j]:
 * is[j] (levels · activations, scaled; with Q6_K's −32 offset). Q4_K, Q5_K: sb is the row's
 * k4_scales in both lanes, and the mins · bsums are the caller's (ms[j] zero). */
static inline __attribute__((always_inline)) void kq_row_dots(const void *xb,
        const pg_block_q8_K *const *y, __m256i sb, const int C, const int type, __m256i *is,
        __m256i *ms) {
    const __m256i m4 = _mm256_set1_epi8(0xF);
    if (type == 6) {
        const pg_block_q6_K *x = xb;
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x->scales));
        KQ_UNROLL for (int j = 0; j < C; j++) {
            is[j] = _mm256_sub_epi32(_mm256_setzero_si256(),
                                     _mm256_slli_epi32(_mm256_madd_epi16(loadu(y[j]->bsums),
                                                                         sc16), 5));
            ms[j] = _mm256_setzero_si256();
        }
        KQ_UNROLL for (int h = 0; h < 2; h++) {
            const __m256i sc = h ? _mm256_permute4x64_epi64(sc16, 0xEE)
                                 : _mm256_permute4x64_epi64(sc16, 0x44);
            __m256i u[4];
            pg_q6k_half_levels(x, h, u);
            KQ_UNROLL for (int g = 0; g < 4; g++) {
                const __m256i s = _mm256_shuffle_epi8(sc, pair16_mask(g));
                KQ_UNROLL for (int j = 0; j < C; j++)
                    is[j] = _mm256_add_epi32(is[j], _mm256_madd_epi16(_mm256_maddubs_epi16(
                        u[g], loadu(y[j]->qs + 128 * h + 32 * g)), s));
            }
        }
        return;
    }
    const pg_block_q4_K *x4 = xb;
    const pg_block_q5_K *x5 = xb;
    const uint8_t *scales = type == 4 ? x4->scales : x5->scales;
    const uint8_t *q = type == 4 ? x4->qs : x5->qs;
    (void)scales;   /* sb: this row's k4_scales in both lanes; the mins are the caller's */
    KQ_UNROLL for (int j = 0; j < C; j++) {
        is[j] = _mm256_setzero_si256();
        ms[j] = _mm256_setzero_si256();
    }
    const __m256i m16 = _mm256_set1_epi8(0x10);
    __m256i h = type == 5 ? loadu(x5->qh) : _mm256_setzero_si256();
    /* The products of each 32-element sub-block summed in int16 before the scales: maddubs
     * (pairs), one hadd of the two sub-blocks of a 64-byte step (fours), a second hadd of two
     * steps (eights: |·| ≤ 8·31·128 < 2^15, Q5_K too), then one madd with the scales per two
     * steps, words [sc0 sc0 sc1 sc1 sc2 sc2 sc3 sc3] in each lane (sub-blocks 0..3 in that
     * order after the hadds), instead of a madd and a scale broadcast per sub-block (in cache,
     * Zen 4, 1 thread, K 4096, 1 row GOP/s: Q4_K 69 -> 74, Q5_K 49 -> 57) */
    const __m256i s01 = _mm256_shuffle_epi8(sb, _mm256_setr_epi8(
        0, -1, 0, -1, 1, -1, 1, -1, 2, -1, 2, -1, 3, -1, 3, -1,
        0, -1, 0, -1, 1, -1, 1, -1, 2, -1, 2, -1, 3, -1, 3, -1));
    const __m256i s23 = _mm256_shuffle_epi8(sb, _mm256_setr_epi8(
        4, -1, 4, -1, 5, -1, 5, -1, 6, -1, 6, -1, 7, -1, 7, -1,
        4, -1, 4, -1, 5, -1, 5, -1, 6, -1, 6, -1, 7, -1, 7, -1));
    __m256i hc[KQ_ROWS8_MAX_C];
    KQ_UNROLL for (int c = 0; c < 4; c++) {
        const __m256i b = loadu(q + 32 * c);
        __m256i lo = _mm256_and_si256(b, m4), hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), m4);
        if (type == 5) {
            lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(h, 4), m16));
            hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(h, 3), m16));
            h = _mm256_srli_epi16(h, 2);
        }
        KQ_UNROLL for (int j = 0; j < C; j++) {
            const int8_t *a = y[j]->qs + 64 * c;
            const __m256i hh = _mm256_hadd_epi16(_mm256_maddubs_epi16(lo, loadu(a)),
                                                 _mm256_maddubs_epi16(hi, loadu(a + 32)));
            if (c % 2 == 0) {
                hc[j] = hh;
            } else {
                is[j] = _mm256_add_epi32(is[j], _mm256_madd_epi16(_mm256_hadd_epi16(hc[j], hh),
                                                                  c == 1 ? s01 : s23));
            }
        }
    }
}

static inline __attribute__((always_inline)) void kq_rows8(int64_t n, float *s, size_t bs,
        const void *vx, size_t bx, const void *vy, size_t by, const int C, const int type) {
    const size_t bsize = kq_block_bytes(type);
    const char *x = vx;
    __m256 acc[KQ_ROWS8_MAX_C];
    KQ_UNROLL for (int j = 0; j < C; j++) acc[j] = _mm256_setzero_ps();
    const int64_t nb = n / PG_QK_K;
    const size_t share = kq_dot8_share(bx, nb);
    for (int64_t b = 0; b < nb; b++) {
        kq_dot8_prefetch(vx, bx, b, share);
        const pg_block_q8_K *yb[KQ_ROWS8_MAX_C];
        KQ_UNROLL for (int j = 0; j < C; j++)
            yb[j] = (const pg_block_q8_K *)((const char *)vy + (size_t)j * by) + b;
        /* rows folded as they come (kq_fold4's hadds: pairs, then four rows), one pair of rows
         * at a time (not unrolled), so fewer partial vectors are live than with all eight
         * rows' kept for one fold (in cache, Zen 4, 1 thread, K 4096, GOP/s: 1 row the same,
         * 2 rows Q4_K 90 -> 94, Q5_K 66 -> 74; 3 rows Q5_K 86 -> 95) */
        /* Q4_K, Q5_K: the scales and mins of two rows at a time (k4_scales, one row per lane),
         * Σ mins·bsums through pairs of bsums (one word per sub-block, |·| ≤ 4096) and one madd
         * per two rows, instead of per row (in cache, 1 row: Q4_K 74 -> 83 GOP/s, Q5_K 57 -> 61) */
        __m256i bp[KQ_ROWS8_MAX_C];
        if (type != 6)
            KQ_UNROLL for (int j = 0; j < C; j++) {
                const __m256i p = _mm256_madd_epi16(loadu(yb[j]->bsums), _mm256_set1_epi16(1));
                bp[j] = _mm256_broadcastsi128_si256(_mm_packs_epi32(
                    _mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1)));
            }
        __m256i fi[KQ_ROWS8_MAX_C][2], fm[KQ_ROWS8_MAX_C][2];
        _Pragma("GCC unroll 1") for (int h = 0; h < 2; h++) {
            __m256i pi[KQ_ROWS8_MAX_C][2], pm[KQ_ROWS8_MAX_C][2];
            _Pragma("GCC unroll 1") for (int q = 0; q < 2; q++) {
                const char *xr = x + (size_t)(4 * h + 2 * q) * bx + (size_t)b * bsize;
                __m256i sm = _mm256_setzero_si256();
                if (type != 6) {
                    sm = kq_scales2(xr + 4, xr + bx + 4);
                    const __m256i mw = _mm256_shuffle_epi8(sm, _mm256_setr_epi8(
                        8, -1, 9, -1, 10, -1, 11, -1, 12, -1, 13, -1, 14, -1, 15, -1,
                        8, -1, 9, -1, 10, -1, 11, -1, 12, -1, 13, -1, 14, -1, 15, -1));
                    KQ_UNROLL for (int j = 0; j < C; j++) pm[j][q] = _mm256_madd_epi16(mw, bp[j]);
                }
                __m256i ri[2][KQ_ROWS8_MAX_C], rm[2][KQ_ROWS8_MAX_C];
                KQ_UNROLL for (int e = 0; e < 2; e++)
                    kq_row_dots(xr + (size_t)e * bx, yb,
                                _mm256_permute2x128_si256(sm, sm, e ? 0x11 : 0x00), C, type,
                                ri[e], rm[e]);
                KQ_UNROLL for (int j = 0; j < C; j++)
                    pi[j][q] = _mm256_hadd_epi32(ri[0][j], ri[1][j]);
            }
            KQ_UNROLL for (int j = 0; j < C; j++) {
                fi[j][h] = _mm256_hadd_epi32(pi[j][0], pi[j][1]);
                /* lane 0: rows 4h, 4h + 2 (two partials each), lane 1: rows 4h + 1, 4h + 3 */
                if (type != 6) fm[j][h] = _mm256_hadd_epi32(pm[j][0], pm[j][1]);
            }
        }
        /* the scalar kernels' terms (d_x·d_y)·isum − (dmin_x·d_y)·summs, or (d_x·d_y)·isum */
        /* d, dmin (Q4_K, Q5_K: bytes 0..3); Q6_K's d: the second fp16 of bytes 206..209 */
        __m256 dx, mx;
        if (type == 6) kq_rows8_fp16x2(x, bx, b, bsize, 206, &mx, &dx);
        else kq_rows8_fp16x2(x, bx, b, bsize, 0, &dx, &mx);
        KQ_UNROLL for (int j = 0; j < C; j++) {
            const __m256 dy = _mm256_set1_ps(yb[j]->d);
            const __m256 si = _mm256_cvtepi32_ps(kq_halves8(fi[j][0], fi[j][1]));
            __m256 term = _mm256_mul_ps(_mm256_mul_ps(dx, dy), si);
            if (type != 6)
                term = _mm256_sub_ps(term, _mm256_mul_ps(_mm256_mul_ps(mx, dy),
                                                         _mm256_cvtepi32_ps(
                                                             kq_mins8(fm[j][0], fm[j][1]))));
            acc[j] = _mm256_add_ps(acc[j], term);
        }
    }
    KQ_UNROLL for (int j = 0; j < C; j++)
        _mm256_storeu_ps((float *)((char *)s + (size_t)j * bs), acc[j]);
}

#define KQ_ROWS8(name, TYPE)                                                                    \
    static void name(int64_t n, float *restrict s, size_t bs, const void *restrict x,          \
                     size_t bx, const void *restrict y, size_t by, int nc) {                   \
        for (int j = 0; j < nc; j += KQ_ROWS8_MAX_C) {                                          \
            const int c = nc - j < KQ_ROWS8_MAX_C ? nc - j : KQ_ROWS8_MAX_C;                    \
            float *sj = (float *)((char *)s + (size_t)j * bs);                                  \
            const char *yj = (const char *)y + (size_t)j * by;                                  \
            if (c == 1) kq_rows8(n, sj, bs, x, bx, yj, by, 1, TYPE);                            \
            else if (c == 2) kq_rows8(n, sj, bs, x, bx, yj, by, 2, TYPE);                       \
            else if (c == 3) kq_rows8(n, sj, bs, x, bx, yj, by, 3, TYPE);                       \
            else kq_rows8(n, sj, bs, x, bx, yj, by, 4, TYPE);                                   \
        }                                                                                       \
    }

KQ_ROWS8(rows8_q4_K_avx2, 4)
KQ_ROWS8(rows8_q5_K_avx2, 5)
KQ_ROWS8(rows8_q6_K_avx2, 6)

/* ---- traits ------------------------------------------------------------------------------ */

void pg_fill_kquants_avx2(pg_type_traits *tbl) {
    tbl[PG_TYPE_Q8_K].from_float = quantize_row_q8_K_avx2;
    tbl[PG_TYPE_Q2_K].vec_dot = vec_dot_q2_K_q8_K_avx2;
    tbl[PG_TYPE_Q3_K].vec_dot = vec_dot_q3_K_q8_K_avx2;
    tbl[PG_TYPE_Q4_K].vec_dot = vec_dot_q4_K_q8_K_avx2;
    tbl[PG_TYPE_Q5_K].vec_dot = vec_dot_q5_K_q8_K_avx2;
    tbl[PG_TYPE_Q6_K].vec_dot = vec_dot_q6_K_q8_K_avx2;
    tbl[PG_TYPE_Q4_K].vec_dot8 = rows8_q4_K_avx2;
    tbl[PG_TYPE_Q5_K].vec_dot8 = rows8_q5_K_avx2;
    tbl[PG_TYPE_Q6_K].vec_dot8 = rows8_q6_K_avx2;
    /* up to 3 rows, the AVX2 gemm beyond (in cache, 1 thread, K 1536, best of 2, GOP/s: Q4_K
     * 1 row 54 against vec_dot's 40; 2 rows 71 against the gemm's 47-49 (AVX2 / AVX-VNNI
     * form), 4 rows 81 vs 89-94, 8 rows 80 vs 103-112; Q6_K 2 rows 58 vs 29-42) */
    tbl[PG_TYPE_Q4_K].vec_dot8_rows = tbl[PG_TYPE_Q5_K].vec_dot8_rows =
        tbl[PG_TYPE_Q6_K].vec_dot8_rows = 3;
}
