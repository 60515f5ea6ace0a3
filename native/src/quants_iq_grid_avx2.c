/* IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M · Q8_K: AVX2 dots with the scalar
 * kernel's bits (quants_iq_grid.c), and for the IQ2/IQ3 types vec_dot8 and the gemm
 * (iq_x86.h: eight weight rows, each group of 32 decoded once for up to four activation rows).
 * Per 32 elements: the four codebook entries (8 unsigned magnitudes each) in one vector, their
 * 32 sign bits as a byte mask, the scale 2s+1 per pair of elements (see GRID_ROW). The
 * codebook entries come by scalar loads (vpgatherdd / vpgatherdq were 1.5-2x slower on Zen 4);
 * the super-block term (d·d_y)·T and the final power of two are the scalar kernel's. IQ1_S /
 * IQ1_M: levels g in {-1, 0, 1} plus a delta of ±1/8 per group of 8; Σ g·a = Σ (g+1)·a − Σ a
 * (maddubs with g + 1 in 0..2: exact for a = −128), and the scalar kernel's
 * (2s+1)·(8·Σ g·a ± Σ a) per lane. (TQ1_0, TQ2_0 keep the scalar kernels.) */
#include <immintrin.h>
#include <string.h>

#include "iq_blocks.h"
#include "iq_grids.h"
#include "iq_x86.h"
#include "kquants.h"
#include "quants.h"

static inline int hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

/* 4 sign bytes (one per 8 elements) → 32 bytes, 0xFF where the element's sign bit is set */
static inline __m256i sign_mask(uint32_t s4) {
    const __m256i v = _mm256_set1_epi32((int)s4);
    const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                          2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    return _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(v, pick), bit), bit);
}

/* int32 lanes Σ_(4 elements) ±g·a (the IQ1 kernels) */
static inline __m256i signed_dot(__m256i g, __m256i m, __m256i a) {
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i all = _mm256_madd_epi16(_mm256_maddubs_epi16(g, a), ones);
    const __m256i neg = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_and_si256(g, m), a), ones);
    return _mm256_sub_epi32(all, _mm256_slli_epi32(neg, 1));
}

/* (2s+1) for the 8 lanes from the scale nibbles of the 4 groups of 8 (lanes 2k, 2k+1: group k) */
static inline __m256i lane_scales(int s0, int s1, int s2, int s3) {
    return _mm256_setr_epi32(2 * s0 + 1, 2 * s0 + 1, 2 * s1 + 1, 2 * s1 + 1, 2 * s2 + 1,
                             2 * s2 + 1, 2 * s3 + 1, 2 * s3 + 1);
}

static inline __m256i grid4(uint64_t g0, uint64_t g1, uint64_t g2, uint64_t g3) {
    return _mm256_setr_epi64x((long long)g0, (long long)g1, (long long)g2, (long long)g3);
}

/* ---- IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S: one group of 32 at a time -------------------------
 * SUB(x, ib, &g, &m, &sc) decodes group ib (elements 32ib .. 32ib + 31) of a super-block: the
 * codebook magnitudes g (bytes <= 62), the sign mask m (0xFF where the element is negative) and
 * the int16 multipliers sc = 2s+1 per pair of elements. Then, with a the activations,
 *     Σ ±g·a = Σ_(sign clear) g·a − Σ_(sign set) g·a
 * as two maddubs on the masked magnitudes (pairs <= 2·62·128, their difference fits int16),
 * and one madd by sc: exact int32 lanes whose total is the scalar kernel's T. */

/* k_sign_mask[f]: the 8 byte masks (0xFF: negative) of ksigns_iq2xs[f], filled once by the fill
 * function (one 8-byte load per group of 8 instead of a byte lookup and its expansion) */
static uint64_t k_sign_mask[128];

static void fill_sign_masks(void) {
    for (int f = 0; f < 128; f++) {
        uint64_t m = 0;
        for (int j = 0; j < 8; j++)
            if (pg_ksigns_iq2xs[f] >> j & 1) m |= 0xFFull << (8 * j);
        k_sign_mask[f] = m;
    }
}

/* the sign masks of the four groups of 8 whose 7-bit sign fields are at bits 0, 7, 14, 21 */
static inline __m256i sign_mask_fields(uint32_t aux) {
    return grid4(k_sign_mask[aux & 127], k_sign_mask[(aux >> 7) & 127],
                 k_sign_mask[(aux >> 14) & 127], k_sign_mask[(aux >> 21) & 127]);
}

static inline uint32_t ksigns4(uint32_t aux) {
    return (uint32_t)pg_ksigns_iq2xs[aux & 127] | (uint32_t)pg_ksigns_iq2xs[(aux >> 7) & 127] << 8 |
           (uint32_t)pg_ksigns_iq2xs[(aux >> 14) & 127] << 16 |
           (uint32_t)pg_ksigns_iq2xs[(aux >> 21) & 127] << 24;
}

/* IQ2_XS, IQ2_S: a scale per 16 elements. The block's 16 scales as bytes 2s+1 (byte 2ib: the
 * low nibble of scales[ib], 2ib + 1: the high one) in both lanes, made once per block (the
 * unrolled groups share it), and group ib's [lo × 8 | hi × 8] as int16 by one VPSHUFB (a scalar
 * extract and two broadcasts per group before) */
static inline __m256i scale_bytes(const uint8_t *scales) {
    uint64_t v;
    memcpy(&v, scales, 8);
    const __m128i b = _mm_set_epi64x(0, (long long)v);
    const __m128i m4 = _mm_set1_epi8(0xf);
    const __m128i lh = _mm_unpacklo_epi8(_mm_and_si128(b, m4), _mm_and_si128(_mm_srli_epi16(b, 4), m4));
    const __m128i s = _mm_or_si128(_mm_add_epi8(lh, lh), _mm_set1_epi8(1));
    return _mm256_set_m128i(s, s);
}

static inline __m256i scales_lo_hi(__m256i sb, int ib) {
    const char l = (char)(2 * ib), h = (char)(2 * ib + 1), z = (char)0x80;
    return _mm256_shuffle_epi8(sb, _mm256_setr_epi8(l, z, l, z, l, z, l, z, l, z, l, z, l, z, l, z,
                                                    h, z, h, z, h, z, h, z, h, z, h, z, h, z, h, z));
}

static inline __attribute__((always_inline)) void sub_iq2_xxs(const pg_block_iq2_xxs *x, int ib,
        __m256i *g, __m256i *m, __m256i *sc) {
    uint32_t aux[2];
    memcpy(aux, x->qs + 4 * ib, 8);
    *g = grid4(pg_iq2xxs_grid[aux[0] & 0xff], pg_iq2xxs_grid[(aux[0] >> 8) & 0xff],
               pg_iq2xxs_grid[(aux[0] >> 16) & 0xff], pg_iq2xxs_grid[aux[0] >> 24]);
    *m = sign_mask_fields(aux[1]);
    *sc = _mm256_set1_epi16((short)(2 * (aux[1] >> 28) + 1));
}

static inline __attribute__((always_inline)) void sub_iq2_xs(const pg_block_iq2_xs *x, int ib,
        __m256i *g, __m256i *m, __m256i *sc) {
    const uint16_t *v = x->qs + 4 * ib;
    *g = grid4(pg_iq2xs_grid[v[0] & 511], pg_iq2xs_grid[v[1] & 511], pg_iq2xs_grid[v[2] & 511],
               pg_iq2xs_grid[v[3] & 511]);
    *m = grid4(k_sign_mask[v[0] >> 9], k_sign_mask[v[1] >> 9], k_sign_mask[v[2] >> 9],
               k_sign_mask[v[3] >> 9]);
    *sc = scales_lo_hi(scale_bytes(x->scales), ib);
}

static inline __attribute__((always_inline)) void sub_iq2_s(const pg_block_iq2_s *x, int ib,
        __m256i *g, __m256i *m, __m256i *sc) {
    const uint8_t *qs = x->qs + 4 * ib;
    const int qh = x->qh[ib];
    *g = grid4(pg_iq2s_grid[qs[0] | ((qh << 8) & 0x300)], pg_iq2s_grid[qs[1] | ((qh << 6) & 0x300)],
               pg_iq2s_grid[qs[2] | ((qh << 4) & 0x300)], pg_iq2s_grid[qs[3] | ((qh << 2) & 0x300)]);
    uint32_t s4;
    memcpy(&s4, x->qs + 32 + 4 * ib, 4);
    *m = sign_mask(s4);
    *sc = scales_lo_hi(scale_bytes(x->scales), ib);
}

static inline __attribute__((always_inline)) void sub_iq3_xxs(const pg_block_iq3_xxs *x, int ib,
        __m256i *g, __m256i *m, __m256i *sc) {
    uint32_t aux;
    memcpy(&aux, x->qs + 64 + 4 * ib, 4);
    const uint8_t *q = x->qs + 8 * ib;
    *g = _mm256_setr_epi32((int)pg_iq3xxs_grid[q[0]], (int)pg_iq3xxs_grid[q[1]],
                           (int)pg_iq3xxs_grid[q[2]], (int)pg_iq3xxs_grid[q[3]],
                           (int)pg_iq3xxs_grid[q[4]], (int)pg_iq3xxs_grid[q[5]],
                           (int)pg_iq3xxs_grid[q[6]], (int)pg_iq3xxs_grid[q[7]]);
    *m = sign_mask_fields(aux);
    *sc = _mm256_set1_epi16((short)(2 * (aux >> 28) + 1));
}

static inline __attribute__((always_inline)) void sub_iq3_s(const pg_block_iq3_s *x, int ib,
        __m256i *g, __m256i *m, __m256i *sc) {
    /* index k = qs[k] | bit k of qh at bit 8 (scalar loads: faster than vpgatherdd on Zen 4) */
    const uint8_t *q = x->qs + 8 * ib;
    const uint32_t h = x->qh[ib];
    *g = _mm256_setr_epi32((int)pg_iq3s_grid[q[0] | ((h << 8) & 256)],
                           (int)pg_iq3s_grid[q[1] | ((h << 7) & 256)],
                           (int)pg_iq3s_grid[q[2] | ((h << 6) & 256)],
                           (int)pg_iq3s_grid[q[3] | ((h << 5) & 256)],
                           (int)pg_iq3s_grid[q[4] | ((h << 4) & 256)],
                           (int)pg_iq3s_grid[q[5] | ((h << 3) & 256)],
                           (int)pg_iq3s_grid[q[6] | ((h << 2) & 256)],
                           (int)pg_iq3s_grid[q[7] | ((h << 1) & 256)]);
    uint32_t s4;
    memcpy(&s4, x->signs + 4 * ib, 4);
    *m = sign_mask(s4);
    const int sb = ib % 2 ? x->scales[ib / 2] >> 4 : x->scales[ib / 2] & 0xf;
    *sc = _mm256_set1_epi16((short)(2 * sb + 1));
}

/* ROW for iq_x86.h: is[j] = the 8 partial lanes of T for activation block y[j] */
#define GRID_ROW(name, BT, SUB)                                                                 \
    static inline __attribute__((always_inline)) void name(const BT *x,                        \
            const pg_block_q8_K *const *y, const int C, __m256i *is) {                          \
        IQX_UNROLL for (int j = 0; j < C; j++) is[j] = _mm256_setzero_si256();                  \
        IQX_UNROLL for (int ib = 0; ib < 8; ib++) {                                             \
            __m256i g, m, sc;                                                                   \
            SUB(x, ib, &g, &m, &sc);                                                            \
            const __m256i gp = _mm256_andnot_si256(m, g), gn = _mm256_and_si256(m, g);          \
            IQX_UNROLL for (int j = 0; j < C; j++) {                                            \
                const __m256i a = _mm256_loadu_si256((const __m256i *)(y[j]->qs + 32 * ib));    \
                is[j] = _mm256_add_epi32(is[j], _mm256_madd_epi16(_mm256_sub_epi16(              \
                    _mm256_maddubs_epi16(gp, a), _mm256_maddubs_epi16(gn, a)), sc));            \
            }                                                                                   \
        }                                                                                       \
    }

GRID_ROW(row_iq2_xxs, pg_block_iq2_xxs, sub_iq2_xxs)
GRID_ROW(row_iq2_xs, pg_block_iq2_xs, sub_iq2_xs)
GRID_ROW(row_iq2_s, pg_block_iq2_s, sub_iq2_s)
GRID_ROW(row_iq3_xxs, pg_block_iq3_xxs, sub_iq3_xxs)
GRID_ROW(row_iq3_s, pg_block_iq3_s, sub_iq3_s)

/* vec_dot (one row), vec_dot8 and the gemm of a codebook type; FINAL: the type's power of two,
 * D(x) a block's scale d, DX8(x, bx, b, size) the eight rows' d of block b */
#define GRID_KERNELS_D(name, BT, ROW, FINAL, D, DX8)                                            \
    static void vec_dot_##name##_q8_K(int64_t n, float *restrict s, const void *restrict vx,   \
                                      const void *restrict vy) {                               \
        const BT *x = vx;                                                                      \
        const pg_block_q8_K *y = vy;                                                           \
        float sum = 0;                                                                         \
        for (int64_t i = 0; i < n / PG_QK_K; i++) {                                            \
            const pg_block_q8_K *yi = &y[i];                                                   \
            __m256i is;                                                                        \
            ROW(&x[i], &yi, 1, &is);                                                           \
            sum += (D(&x[i]) * y[i].d) * (float)hsum_i32(is);                                  \
        }                                                                                      \
        *s = (FINAL) * sum;                                                                    \
    }                                                                                          \
    IQX_ROWS8_Q8K(vec_dot8_##name##_q8_K, BT, ROW, DX8, FINAL)                                 \
    IQX_GEMM(gemm_##name##_q8_K, vec_dot8_##name##_q8_K, vec_dot_##name##_q8_K)
#define GRID_D(x) pg_fp16_to_fp32((x)->d)
#define GRID_KERNELS(name, BT, ROW, FINAL) GRID_KERNELS_D(name, BT, ROW, FINAL, GRID_D, GRID_DX8)

/* the fp16 d at byte 0 of every one of these blocks */
#define GRID_DX8(x, bx, b, size) iqx_rows8_fp16(x, bx, b, size)

/* IQ1: per weight the level v = 8g + dsign (g in {-1, 0, 1}, dsign = ±1 per group of 8: the
 * scalar kernel's 8·Σ g·a + dsign·Σ a per group), so T = Σ_scale groups (2s+1)·Σ v·a. VPMADDUBSW
 * takes v + 9 (0..18, unsigned; pairs <= 2·18·128) and the 9·Σ a per scale group comes back
 * from the Q8_K bsums (exact sums of 16 activations, made by the quantizer that MUL_MAT runs;
 * the IQ4_XS kernels rely on them too). k_iq1_v9[i] = entry i of the codebook as 8g + 9. */
static uint64_t k_iq1_v9[2048];

static void fill_iq1_table(void) {
    for (int i = 0; i < 2048; i++) {
        uint64_t v = 0;
        for (int j = 0; j < 8; j++)
            v |= (uint64_t)(uint8_t)(8 * (int8_t)(pg_iq1s_grid[i] >> 8 * j) + 9) << 8 * j;
        k_iq1_v9[i] = v;
    }
}

/* int16 pairs Σ (v + 9)·a, times the int16 scales: int32 lanes */
static inline __m256i iq1_lanes(__m256i v9, const int8_t *q8, __m256i sc16) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(v9, _mm256_loadu_si256((const __m256i *)q8)), sc16);
}

/* IQ1_S: the table's 8g + 9 without the delta, which goes into the correction with the scale:
 * (2s+1)·(Σ (8g + 9)·a − (9 − dsign)·Σ a) = (2s+1)·(8·Σ g·a + dsign·Σ a), the per-group
 * coefficients (9 − dsign)·(2s+1) <= 150 as int16 against the 16 bsums by one VPMADDWD per block
 * (a scalar multiply-add and a ±1 vector per group before). */
static inline __attribute__((always_inline)) void row_iq1_s(const pg_block_iq1_s *x,
        const pg_block_q8_K *const *y, const int C, __m256i *is) {
    const __m128i qh = _mm_loadu_si128((const __m128i *)x->qh);
    /* 2s+1 per group (int16 lane ib), then (9 - dsign)·(2s+1): 8·sc, + 2·sc where bit 15 */
    const __m128i sc = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(qh, 11), _mm_set1_epi16(14)),
                                    _mm_set1_epi16(1));
    const __m128i coef = _mm_add_epi16(_mm_slli_epi16(sc, 3),
                                       _mm_and_si128(_mm_srai_epi16(qh, 15), _mm_add_epi16(sc, sc)));
    const __m256i coef2 = _mm256_set_m128i(_mm_unpackhi_epi16(coef, coef), _mm_unpacklo_epi16(coef, coef));
    const __m256i sc2 = _mm256_set_m128i(sc, sc);
    IQX_UNROLL for (int j = 0; j < C; j++)
        is[j] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_madd_epi16(
            _mm256_loadu_si256((const __m256i *)y[j]->bsums), coef2));
    IQX_UNROLL for (int ib = 0; ib < 8; ib++) {
        const int h = x->qh[ib];
        const uint8_t *qs = x->qs + 4 * ib;
        const __m256i g = grid4(k_iq1_v9[qs[0] | ((h << 8) & 0x700)], k_iq1_v9[qs[1] | ((h << 5) & 0x700)],
                                k_iq1_v9[qs[2] | ((h << 2) & 0x700)], k_iq1_v9[qs[3] | ((h >> 1) & 0x700)]);
        /* (2s+1) of group ib in every int16 lane */
        const __m256i scv = _mm256_shuffle_epi8(sc2, _mm256_set1_epi16((short)(2 * ib | (2 * ib + 1) << 8)));
        IQX_UNROLL for (int j = 0; j < C; j++)
            is[j] = _mm256_add_epi32(is[j], iq1_lanes(g, y[j]->qs + 32 * ib, scv));
    }
}

/* IQ1_M: the 16 scales (one per 16 elements, as the bsums) as int16 2s+1 by vector ops on the
 * broadcast scale words, the 9·Σ (2s+1)·bsum correction by one VPMADDWD per block */
static inline __attribute__((always_inline)) void row_iq1_m(const pg_block_iq1_m *x,
        const pg_block_q8_K *const *y, const int C, __m256i *is) {
    uint64_t sc64;
    memcpy(&sc64, x->scales, 8);
    /* int16 lane k: word k/4, its 3-bit field k%4 moved to bits 13..15 by a multiply */
    const __m256i w = _mm256_shuffle_epi8(_mm256_set1_epi64x((long long)sc64),
        _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3,
                         4, 5, 4, 5, 4, 5, 4, 5, 6, 7, 6, 7, 6, 7, 6, 7));
    const __m256i s3 = _mm256_srli_epi16(_mm256_mullo_epi16(w, _mm256_set1_epi64x(
        (long long)(8192 | 1024ull << 16 | 128ull << 32 | 16ull << 48))), 13);
    const __m256i sc = _mm256_or_si256(_mm256_add_epi16(s3, s3), _mm256_set1_epi16(1));
    const __m256i sc9 = _mm256_add_epi16(_mm256_slli_epi16(sc, 3), sc);
    /* the 16 scales as bytes in both lanes */
    const __m256i scb = _mm256_permute4x64_epi64(_mm256_packus_epi16(sc, sc), _MM_SHUFFLE(2, 0, 2, 0));
    IQX_UNROLL for (int j = 0; j < C; j++)
        is[j] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_madd_epi16(
            _mm256_loadu_si256((const __m256i *)y[j]->bsums), sc9));
    /* byte n of dl: the delta of entry n % 4 of group n / 4 (-1 where bit 3 + 4·(n % 2) of
     * qh[n / 2] is set, else +1), for the whole block at once; group ib's four deltas spread
     * over its four qwords by one VPSHUFB from the lane that holds them (6 vector ops per
     * group before) */
    const __m128i qhv = _mm_loadu_si128((const __m128i *)x->qh);
    const __m256i dbit = _mm256_set1_epi16(0x8008);
    const __m256i dpair = _mm256_set_m128i(_mm_unpackhi_epi8(qhv, qhv), _mm_unpacklo_epi8(qhv, qhv));
    const __m256i dl = _mm256_or_si256(_mm256_cmpeq_epi8(_mm256_and_si256(dpair, dbit), dbit),
                                       _mm256_set1_epi8(1));
    const __m256i dlo = _mm256_permute2x128_si256(dl, dl, 0x00), dhi = _mm256_permute2x128_si256(dl, dl, 0x11);
    IQX_UNROLL for (int ib = 0; ib < 8; ib++) {
        const uint8_t *qs = x->qs + 4 * ib;
        uint16_t hw;
        memcpy(&hw, x->qh + 2 * ib, 2);
        const long long k = 0x0101010101010101LL * (4 * (ib % 4));
        const __m256i dsel = _mm256_shuffle_epi8(ib < 4 ? dlo : dhi, _mm256_setr_epi64x(
            k, k + 0x0101010101010101LL, k + 0x0202020202020202LL, k + 0x0303030303030303LL));
        const __m256i g = _mm256_add_epi8(
            grid4(k_iq1_v9[qs[0] | ((hw << 8) & 0x700)], k_iq1_v9[qs[1] | ((hw << 4) & 0x700)],
                  k_iq1_v9[qs[2] | (hw & 0x700)], k_iq1_v9[qs[3] | ((hw >> 4) & 0x700)]),
            dsel);
        /* lanes 0..7: scale 2ib, 8..15: scale 2ib + 1, by one VPSHUFB of the scale bytes */
        const char l = (char)(2 * ib), hb = (char)(2 * ib + 1), z = (char)0x80;
        const __m256i scv = _mm256_shuffle_epi8(scb, _mm256_setr_epi8(
            l, z, l, z, l, z, l, z, l, z, l, z, l, z, l, z, hb, z, hb, z, hb, z, hb, z, hb, z, hb, z, hb, z, hb, z));
        IQX_UNROLL for (int j = 0; j < C; j++)
            is[j] = _mm256_add_epi32(is[j], iq1_lanes(g, y[j]->qs + 32 * ib, scv));
    }
}

static inline float iq1m_d(const pg_block_iq1_m *x) {
    uint16_t sc[4];
    memcpy(sc, x->scales, 8);
    return pg_fp16_to_fp32((pg_fp16)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) |
                                     ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000)));
}

GRID_KERNELS(iq2_xxs, pg_block_iq2_xxs, row_iq2_xxs, 0.125f)
GRID_KERNELS(iq2_xs, pg_block_iq2_xs, row_iq2_xs, 0.125f)
GRID_KERNELS(iq2_s, pg_block_iq2_s, row_iq2_s, 0.125f)
GRID_KERNELS(iq3_xxs, pg_block_iq3_xxs, row_iq3_xxs, 0.25f)
GRID_KERNELS(iq3_s, pg_block_iq3_s, row_iq3_s, 1.0f)
GRID_KERNELS(iq1_s, pg_block_iq1_s, row_iq1_s, 0.125f)

/* IQ1_M's d: the top nibbles of its four scale words */
static inline __m256 iq1m_dx8(const char *x, size_t bx, int64_t b, size_t size) {
    uint16_t h[8];
    for (int r = 0; r < 8; r++) {
        uint16_t sc[4];
        memcpy(sc, x + (size_t)r * bx + (size_t)b * size + 48, 8);
        h[r] = (uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) |
                          (sc[3] & 0xf000));
    }
    /* F16C (exact, as pg_fp16_to_fp32): the scalar conversion's loop cost 8 calls per block */
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
}
GRID_KERNELS_D(iq1_m, pg_block_iq1_m, row_iq1_m, 0.125f, iq1m_d, iq1m_dx8)

void pg_fill_iq_grid_avx2(pg_type_traits *tbl) {
    fill_sign_masks();
    fill_iq1_table();
    IQX_SET(tbl, PG_TYPE_IQ2_XXS, vec_dot_iq2_xxs_q8_K, vec_dot8_iq2_xxs_q8_K, gemm_iq2_xxs_q8_K);
    IQX_SET(tbl, PG_TYPE_IQ2_XS, vec_dot_iq2_xs_q8_K, vec_dot8_iq2_xs_q8_K, gemm_iq2_xs_q8_K);
    IQX_SET(tbl, PG_TYPE_IQ2_S, vec_dot_iq2_s_q8_K, vec_dot8_iq2_s_q8_K, gemm_iq2_s_q8_K);
    IQX_SET(tbl, PG_TYPE_IQ3_XXS, vec_dot_iq3_xxs_q8_K, vec_dot8_iq3_xxs_q8_K, gemm_iq3_xxs_q8_K);
    IQX_SET(tbl, PG_TYPE_IQ3_S, vec_dot_iq3_s_q8_K, vec_dot8_iq3_s_q8_K, gemm_iq3_s_q8_K);
    IQX_SET(tbl, PG_TYPE_IQ1_S, vec_dot_iq1_s_q8_K, vec_dot8_iq1_s_q8_K, gemm_iq1_s_q8_K);
    IQX_SET(tbl, PG_TYPE_IQ1_M, vec_dot_iq1_m_q8_K, vec_dot8_iq1_m_q8_K, gemm_iq1_m_q8_K);
}
