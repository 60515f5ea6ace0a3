/* Multi-row dot kernels (pg_type_traits.gemm) with AVX-512 VNNI; installed on the avx512 path
 * only when the CPU has AVX512-VNNI (this file is compiled with F/BW/VL/VNNI).
 *
 * What the pairwise vec_dot repeats per pair is done here once per weight row or activation
 * row of the block:
 *   - legacy formats, one block per step, up to 8 weight rows × 4 activation rows: each group
 *     of four weight rows shares two registers (one 128-bit lane per row), each activation
 *     row's 16-byte halves are broadcast to the four lanes, two VPDPBUSD per activation row and
 *     group give every row's partial sums at once, and a 4 × 4 transpose-add leaves a group's
 *     16 block dots in one register: one conversion, one scale product and one FMA per block
 *     for 16 dots; the two groups share the activation rows' loads, offsets and scales;
 *   - K-quants, one super-block per step, 4 × 4 blocks (twice for 8 weight rows) with 16 zmm
 *     accumulators: each weight row is decoded once into four 64-level rows and their int16
 *     sub-block scales; per pair, four maddubs + VPDPWSSD give the scaled integer sums, the
 *     mins (or the −4 / −32 offsets) come from the activation's bsums, and one FMA scales
 *     [Σ 8 lanes | min 8 lanes] by [d·dy | −dmin·dy].
 * Integer sums are exact; the fp32 scaling is accumulated per lane and summed at the end, an
 * order different from vec_dot's (same tolerance as the vec_dot kernels; tests/test_gemm.c). */
#include <immintrin.h>
#include <string.h>

#include "gemm.h"
#include "kquants.h"
#include "kquants_x86.h"
#include "pg_internal.h"
#include "quants.h"
#include "quants_legacy.h"

#define AINL static inline __attribute__((always_inline))
#define PG_UNROLL _Pragma("GCC unroll 16")

/* ---- shared pieces --------------------------------------------------------------------------- */

/* Lanes 0..7 = v[k], lanes 8..15 = v[k + 1] (v: up to 8 floats). */
AINL __m512 spread2(__m256 v, int k) {
    return _mm512_permutexvar_ps(_mm512_set_epi32(k + 1, k + 1, k + 1, k + 1, k + 1, k + 1, k + 1,
                                                  k + 1, k, k, k, k, k, k, k, k),
                                 _mm512_castps256_ps512(v));
}

/* Sums of the 16 lanes of a0..a3 as [Σa0, Σa1, Σa2, Σa3]. The adds of each vector form the
 * same tree whatever its neighbours hold. */
AINL __m128 reduce4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
#define PG_HALVES(v) _mm256_add_ps(_mm512_castps512_ps256(v),                                      \
                                   _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)))
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(PG_HALVES(a0), PG_HALVES(a1)),
                                    _mm256_hadd_ps(PG_HALVES(a2), PG_HALVES(a3)));
#undef PG_HALVES
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

AINL void store_acc(float *s, size_t bs, __m512 acc[PG_GR][PG_GC], int nr, int nc) {
    float out[PG_GC][PG_GR];
    PG_UNROLL for (int j = 0; j < PG_GC; j++)
        _mm_storeu_ps(out[j], reduce4(acc[0][j], acc[1][j], acc[2][j], acc[3][j]));
    pg_gemm_store(s, bs, out, nr, nc);
}

/* ---- legacy formats: four rows per register ------------------------------------------------- */

/* Per block b, the four weight rows' 32 levels go into two registers, one 128-bit lane per row:
 * W0 = [row 0 elements 0..15 | row 1 | row 2 | row 3], W1 the same for elements 16..31. Each
 * activation row's half t (16 bytes) is broadcast to the four lanes, so one VPDPBUSD per half
 * and activation row j gives, in lane (i, k), the partial dot of weight row i over bytes
 * 4k..4k+3 of the half. A 4 × 4 transpose-add turns the four activation rows' vectors into one
 * vector of the 16 block dots (lane 4i + j), converted and scaled once: one accumulator holds
 * all 16 dots. Unsigned levels q and Σ(q − c)·a = Σ q·a − Σ c·a (c = 8, 16; Q8_0 as q ^ 0x80
 * with c = 128), both exact. */

/* [Σ p0, Σ p1, Σ p2, Σ p3] within each 128-bit lane (lane i holds row i's partial sums) */
AINL __m512i transpose_add4(__m512i p0, __m512i p1, __m512i p2, __m512i p3) {
    const __m512i t01 = _mm512_add_epi32(_mm512_unpacklo_epi32(p0, p1),
                                         _mm512_unpackhi_epi32(p0, p1));
    const __m512i t23 = _mm512_add_epi32(_mm512_unpacklo_epi32(p2, p3),
                                         _mm512_unpackhi_epi32(p2, p3));
    return _mm512_add_epi32(_mm512_unpacklo_epi64(t01, t23), _mm512_unpackhi_epi64(t01, t23));
}

/* the 16 bytes at p0..p3 in lanes 0..3 */
AINL __m512i load4x16(const char *p0, const char *p1, const char *p2, const char *p3) {
    __m512i z = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)p0));
    z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)p1), 1);
    z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)p2), 2);
    return _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)p3), 3);
}

/* the fp16 at p0..p3 as floats, lane 4i + j = f(p_i) (rows = 1) or f(p_j) (rows = 0) */
AINL __m512 fp16_grid(const char *p0, const char *p1, const char *p2, const char *p3, int rows) {
    uint16_t h[4];
    memcpy(&h[0], p0, 2);
    memcpy(&h[1], p1, 2);
    memcpy(&h[2], p2, 2);
    memcpy(&h[3], p3, 2);
    uint64_t u;
    memcpy(&u, h, 8);
    const __m128 f = _mm_cvtph_ps(_mm_cvtsi64_si128((long long)u));
    const __m512i idx = rows ? _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3)
                             : _mm512_setr_epi32(0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3);
    return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(f));
}

/* 5th bits: bits 0..15 (elements 0..15) of the four rows' qh as the byte mask of W0 (lo) and
 * bits 16..31 as that of W1 (hi) */
AINL void qh_masks(const char *p0, const char *p1, const char *p2, const char *p3, __mmask64 *lo,
                   __mmask64 *hi) {
    uint32_t q[4];
    memcpy(&q[0], p0, 4);
    memcpy(&q[1], p1, 4);
    memcpy(&q[2], p2, 4);
    memcpy(&q[3], p3, 4);
    const __m128i v = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)q),
                                       _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11,
                                                     14, 15));
    *lo = _cvtu64_mask64((uint64_t)_mm_cvtsi128_si64(v));
    *hi = _cvtu64_mask64((uint64_t)_mm_extract_epi64(v, 1));
}

/* The levels of 4 weight rows for one block: w0 = elements 0..15, w1 = 16..31, row i in lane i.
 * QS, QH (0: none): offsets of qs and qh in the block; Q8: Q8_0 (signed bytes, stored + 128). */
AINL void leg_rows(const char *const *x, int QS, int QH, int Q8, __m512i *w0, __m512i *w1) {
    if (Q8) {
        const __m512i flip = _mm512_set1_epi8((char)0x80);
        *w0 = _mm512_xor_si512(load4x16(x[0] + QS, x[1] + QS, x[2] + QS, x[3] + QS), flip);
        *w1 = _mm512_xor_si512(load4x16(x[0] + QS + 16, x[1] + QS + 16, x[2] + QS + 16,
                                        x[3] + QS + 16), flip);
        return;
    }
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i z = load4x16(x[0] + QS, x[1] + QS, x[2] + QS, x[3] + QS);
    *w0 = _mm512_and_si512(z, m4);
    *w1 = _mm512_and_si512(_mm512_srli_epi16(z, 4), m4);
    if (QH) {
        __mmask64 klo, khi;
        qh_masks(x[0] + QH, x[1] + QH, x[2] + QH, x[3] + QH, &klo, &khi);
        const __m512i b4 = _mm512_set1_epi8(0x10);
        *w0 = _mm512_mask_add_epi8(*w0, klo, *w0, b4);
        *w1 = _mm512_mask_add_epi8(*w1, khi, *w1, b4);
    }
}

/* G groups of 4 weight rows (xr[0..4G)) × C groups of 4 activation rows (yr[0..4C)).
 * STRIDE: weight block bytes; M (0: none): offset of m, activations in Q8_1; OFF: offset c of the
 * levels. Each weight row group's levels and scales serve all activation rows; each activation
 * row's broadcasts, offset term and scales serve all weight row groups. */
AINL void legacy_512(int64_t n, float *s, size_t bs, const char *const *xr, const char *const *yr,
                     int nr, int nc, const int G, const int C, const int STRIDE, const int QS,
                     const int QH, const int M, const int OFF, const int Q8) {
    const int ys = M ? 36 : 34, yq = M ? 4 : 2;
    const __m512i c = _mm512_set1_epi8((char)OFF), z = _mm512_setzero_si512();
    __m512 acc[2][2];   /* [row group][column group], lane 4i + j */
    PG_UNROLL for (int g = 0; g < G; g++)
        PG_UNROLL for (int h = 0; h < C; h++) acc[g][h] = _mm512_setzero_ps();
    for (int64_t b = 0; b < n / PG_QK32; b++) {
        const char *x[8], *y[8];
        PG_UNROLL for (int i = 0; i < 4 * G; i++) x[i] = xr[i] + b * STRIDE;
        PG_UNROLL for (int j = 0; j < 4 * C; j++) y[j] = yr[j] + b * ys;
        __m512i w0[2], w1[2];
        __m512 dx[2];
        PG_UNROLL for (int g = 0; g < G; g++) {
            leg_rows(x + 4 * g, QS, QH, Q8, &w0[g], &w1[g]);
            dx[g] = fp16_grid(x[4 * g], x[4 * g + 1], x[4 * g + 2], x[4 * g + 3], 1);
        }
        PG_UNROLL for (int h = 0; h < C; h++) {
            const char *const *yh = y + 4 * h;
            __m512i p[2][4];
            PG_UNROLL for (int j = 0; j < 4; j++) {
                const __m512i a0 =
                    _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(yh[j] + yq)));
                const __m512i a1 =
                    _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(yh[j] + yq + 16)));
                /* the sums start from −c·Σa (the same for every weight row) */
                const __m512i o =
                    OFF ? _mm512_sub_epi32(
                              z, _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, c, a0), c, a1))
                        : z;
                PG_UNROLL for (int g = 0; g < G; g++)
                    p[g][j] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(o, w0[g], a0), w1[g], a1);
            }
            const __m512 dy = fp16_grid(yh[0], yh[1], yh[2], yh[3], 0);
            const __m512 sy = M ? fp16_grid(yh[0] + 2, yh[1] + 2, yh[2] + 2, yh[3] + 2, 0) : dy;
            PG_UNROLL for (int g = 0; g < G; g++) {
                const char *const *xg = x + 4 * g;
                const __m512i dots = transpose_add4(p[g][0], p[g][1], p[g][2], p[g][3]);
                acc[g][h] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots), _mm512_mul_ps(dx[g], dy),
                                            acc[g][h]);
                if (M)
                    acc[g][h] = _mm512_fmadd_ps(
                        fp16_grid(xg[0] + M, xg[1] + M, xg[2] + M, xg[3] + M, 1), sy, acc[g][h]);
            }
        }
    }
    float v[2][2][16];
    PG_UNROLL for (int g = 0; g < G; g++)
        PG_UNROLL for (int h = 0; h < C; h++) _mm512_storeu_ps(v[g][h], acc[g][h]);
    for (int j = 0; j < nc; j++) {   /* weight row 4g + i, activation row 4h + k: lane 4i + k */
        float *d = (float *)((char *)s + (size_t)j * bs);
        for (int i = 0; i < nr; i++) d[i] = v[i / 4][j / 4][4 * (i % 4) + j % 4];
    }
}

/* The kernel for up to 8 × 8 rows: one or two groups of 4 weight rows and of 4 activation rows
 * (the rows of a group past nr repeat the first weight row, past nc the first activation row).
 * Every dot takes the same instructions whatever the groups. */
#define PG_GEMM_LEGACY_512(name, STRIDE, QS, QH, M, OFF, Q8)                                       \
    static void name(int64_t n, float *restrict s, size_t bs, const void *restrict vx,             \
                     size_t bx, const void *restrict vy, size_t by, int nr, int nc) {              \
        const char *x[8], *y[8];                                                                   \
        for (int i = 0; i < 8; i++) x[i] = (const char *)vx + (i < nr ? (size_t)i * bx : 0);       \
        for (int j = 0; j < 8; j++) y[j] = (const char *)vy + (j < nc ? (size_t)j * by : 0);       \
        if (nr <= 4 && nc <= 4)                                                                    \
            legacy_512(n, s, bs, x, y, nr, nc, 1, 1, STRIDE, QS, QH, M, OFF, Q8);                  \
        else if (nr <= 4)                                                                          \
            legacy_512(n, s, bs, x, y, nr, nc, 1, 2, STRIDE, QS, QH, M, OFF, Q8);                  \
        else if (nc <= 4)                                                                          \
            legacy_512(n, s, bs, x, y, nr, nc, 2, 1, STRIDE, QS, QH, M, OFF, Q8);                  \
        else                                                                                       \
            legacy_512(n, s, bs, x, y, nr, nc, 2, 2, STRIDE, QS, QH, M, OFF, Q8);                  \
    }

PG_GEMM_LEGACY_512(gemm_q4_0_512, 18, 2, 0, 0, 8, 0)
PG_GEMM_LEGACY_512(gemm_q5_0_512, 22, 6, 2, 0, 16, 0)
PG_GEMM_LEGACY_512(gemm_q8_0_512, 34, 2, 0, 0, 128, 1)
PG_GEMM_LEGACY_512(gemm_q4_1_512, 20, 4, 0, 2, 0, 0)
PG_GEMM_LEGACY_512(gemm_q5_1_512, 24, 8, 4, 2, 0, 0)

/* ---- K-quants × Q8_K ------------------------------------------------------------------------ */

/* in 128-bit lane k, int16 number sel[m][k] of that lane over the whole lane */
#define L2(k) 2 * (k), 2 * (k) + 1
#define L16(k) L2(k), L2(k), L2(k), L2(k), L2(k), L2(k), L2(k), L2(k)
static const uint8_t k_lane16[6][64] __attribute__((aligned(64))) = {
    /* rows of 64 made of two sub-blocks of 32 (Q4_K, Q5_K): 2m over lanes 0-1, 2m+1 over 2-3 */
    {L16(0), L16(0), L16(1), L16(1)}, {L16(2), L16(2), L16(3), L16(3)},
    {L16(4), L16(4), L16(5), L16(5)}, {L16(6), L16(6), L16(7), L16(7)},
    /* rows of 64 made of four groups of 16 (Q2_K, Q3_K, Q6_K): 0..3, then 4..7 */
    {L16(0), L16(1), L16(2), L16(3)}, {L16(4), L16(5), L16(6), L16(7)},
};

AINL __m512i lane_scales(__m512i sc8x16, int m) {
    return _mm512_shuffle_epi8(sc8x16, _mm512_load_si512(k_lane16[m]));
}

/* One decoded weight super-block: four rows of 64 unsigned levels (elements 64r..64r+63), their
 * int16 scales per 128-bit lane, the int16 weights of the 16 bsums (mins, or scales for the
 * offset formats), and [d x8 | −dmin x8] (mins) or d (offsets). */
typedef struct { __m512i q[4], sc[4]; __m256i w16; __m512 dv; } krow;

/* 8 int16 scales of `half` (0: groups 0..7, 1: 8..15) of a 16 × int16 vector, per lane */
AINL __m512i half_scales(__m256i sc16, int half) {
    return _mm512_broadcast_i32x4(half ? _mm256_extracti128_si256(sc16, 1)
                                       : _mm256_castsi256_si128(sc16));
}

/* [d x8 | −dmin x8] from the fp16 pair at p (d, then dmin) */
AINL __m512 d_negdmin(const uint16_t *p) {
    uint32_t u;
    memcpy(&u, p, 4);
    const __m512 v = spread2(_mm256_castps128_ps256(_mm_cvtph_ps(_mm_cvtsi32_si128((int)u))), 0);
    return _mm512_mask_sub_ps(v, 0xFF00, _mm512_setzero_ps(), v);
}

AINL krow decode_q2_K(const pg_block_q2_K *x) {
    krow k;
    const __m512i m3 = _mm512_set1_epi8(3);
    const __m128i s8 = _mm_loadu_si128((const __m128i *)x->scales);
    const __m128i m4 = _mm_set1_epi8(0xF);
    const __m256i sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(s8, m4));
    k.w16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s8, 4), m4));
    PG_UNROLL for (int h = 0; h < 2; h++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * h));
        /* [q | q >> 2]: bits 2j of elements 128h + 32j + l, j = 0 and 1; >> 4 gives j = 2, 3 */
        const __m512i qq = _mm512_inserti64x4(_mm512_castsi256_si512(q), _mm256_srli_epi16(q, 2),
                                              1);
        const __m512i sc = half_scales(sc16, h);
        k.q[2 * h] = _mm512_and_si512(qq, m3);
        k.q[2 * h + 1] = _mm512_and_si512(_mm512_srli_epi16(qq, 4), m3);
        k.sc[2 * h] = lane_scales(sc, 4);
        k.sc[2 * h + 1] = lane_scales(sc, 5);
    }
    k.dv = d_negdmin(&x->d);
    return k;
}

AINL krow decode_q3_K(const pg_block_q3_K *x) {
    krow k;
    const __m512i m3 = _mm512_set1_epi8(3), four = _mm512_set1_epi8(4);
    const __m256i sc16 = _mm256_cvtepi8_epi16(k3_scales(x->qs + 62));
    k.w16 = sc16;
    const __m512i hm = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)x->hmask));
    PG_UNROLL for (int h = 0; h < 2; h++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * h));
        const __m512i qq = _mm512_inserti64x4(_mm512_castsi256_si512(q), _mm256_srli_epi16(q, 2),
                                              1);
        const __m512i sc = half_scales(sc16, h);
        PG_UNROLL for (int p = 0; p < 2; p++) {
            /* elements 128h + 64p + l (j = 2p) and + 32 (j = 2p + 1): hmask bit 4h + j */
            const int b0 = 4 * h + 2 * p;
            const __m512i bits = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << b0)),
                                                    _mm256_set1_epi8((char)(1 << (b0 + 1))), 1);
            const __m512i lv = _mm512_and_si512(p ? _mm512_srli_epi16(qq, 4) : qq, m3);
            k.q[2 * h + p] = _mm512_mask_add_epi8(lv, _mm512_test_epi8_mask(hm, bits), lv, four);
            k.sc[2 * h + p] = lane_scales(sc, 4 + p);
        }
    }
    k.dv = _mm512_set1_ps(h2f(x->d));
    return k;
}

/* Q4_K / Q5_K: the 64-byte half h of qs holds chunks 2h and 2h+1 (low nibbles: sub-block 2c,
 * high: 2c+1); row c = [lo(chunk c) | hi(chunk c)] = elements 64c..64c+63. */
AINL __m512i k4_chunk(__m512i lo, __m512i hi, int second) {
    return second ? _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(3, 2, 3, 2))
                  : _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(1, 0, 1, 0));
}

AINL krow decode_k4(const uint8_t *qs, const uint8_t *scales, const uint16_t *d,
                    const uint8_t *qh) {
    krow k;
    const __m512i m4 = _mm512_set1_epi8(0xF);
    const __m128i sm = k4_scales(scales);
    const __m512i sc = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(sm));
    /* mins m_j for the pairs of bsums 2j, 2j + 1 */
    k.w16 = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(
        sm, _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15)));
    const __m512i hq = qh ? _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)qh))
                          : _mm512_setzero_si512();
    PG_UNROLL for (int h = 0; h < 2; h++) {
        const __m512i b = _mm512_loadu_si512(qs + 64 * h);
        const __m512i lo = _mm512_and_si512(b, m4);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(b, 4), m4);
        PG_UNROLL for (int t = 0; t < 2; t++) {
            const int c = 2 * h + t;
            __m512i lv = k4_chunk(lo, hi, t);
            if (qh) {   /* 5th bit: bit 2c of qh[l] (low half), 2c + 1 (high half) */
                const __m512i bits = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << (2 * c))),
                                                        _mm256_set1_epi8((char)(2 << (2 * c))), 1);
                lv = _mm512_mask_add_epi8(lv, _mm512_test_epi8_mask(hq, bits), lv,
                                          _mm512_set1_epi8(0x10));
            }
            k.q[c] = lv;
            k.sc[c] = lane_scales(sc, c);
        }
    }
    k.dv = d_negdmin(d);
    return k;
}

AINL krow decode_q6_K(const pg_block_q6_K *x) {
    krow k;
    const __m512i m4 = _mm512_set1_epi8(0xF), m30 = _mm512_set1_epi8(0x30);
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x->scales));
    k.w16 = sc16;
    const __m512i q = _mm512_loadu_si512(x->qh), q2 = _mm512_srli_epi16(q, 2);
    PG_UNROLL for (int h = 0; h < 2; h++) {
        /* [qh_h | qh_h >> 2] (qh_h = 32 bytes): groups g and g + 1 share one mask */
        const __m512i hb = h ? _mm512_shuffle_i64x2(q, q2, _MM_SHUFFLE(3, 2, 3, 2))
                             : _mm512_shuffle_i64x2(q, q2, _MM_SHUFFLE(1, 0, 1, 0));
        const __m512i l = _mm512_loadu_si512(x->ql + 64 * h);
        k.q[2 * h] = _mm512_or_si512(_mm512_and_si512(l, m4),
                                     _mm512_and_si512(_mm512_slli_epi16(hb, 4), m30));
        k.q[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                                         _mm512_and_si512(hb, m30));
        const __m512i sc = half_scales(sc16, h);
        k.sc[2 * h] = lane_scales(sc, 4);
        k.sc[2 * h + 1] = lane_scales(sc, 5);
    }
    k.dv = _mm512_set1_ps(h2f(x->d));
    return k;
}

/* Σ_r scale · (64 levels · 64 activations), 16 int32 lanes, started from init */
AINL __m512i kdot(const krow *k, const pg_block_q8_K *y, __m512i init) {
    __m512i s = init;
    PG_UNROLL for (int r = 0; r < 4; r++)
        s = _mm512_dpwssd_epi32(
            s, _mm512_maddubs_epi16(k->q[r], _mm512_loadu_si512(y->qs + 64 * r)), k->sc[r]);
    return s;
}

/* Formats with mins: acc += [Σ halves of the scaled sums | mins·bsums] · [d·dy | −dmin·dy] */
AINL __m512 kstep_mins(__m512 acc, const krow *k, const pg_block_q8_K *y) {
    const __m512i s = kdot(k, y, _mm512_setzero_si512());
    const __m256i s8 = _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
    const __m256i mn = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->bsums), k->w16);
    const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(s8), mn, 1);
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(both), _mm512_mul_ps(k->dv, _mm512_set1_ps(y->d)),
                           acc);
}

/* Signed formats stored as levels u = q + 2^SHIFT: the sums start from −2^SHIFT·Σ sc_k·bsum_k */
AINL __m512 kstep_offset(__m512 acc, const krow *k, const pg_block_q8_K *y, int shift) {
    const __m256i o = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->bsums), k->w16);
    const __m256i init = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(o, shift));
    const __m512i s = kdot(k, y, _mm512_zextsi256_si512(init));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(k->dv, _mm512_set1_ps(y->d)), acc);
}

/* SHIFT < 0: format with mins; else the offset 2^SHIFT. */
#define PG_GEMM_KQUANT_512(name, XT, DECODE, SHIFT)                                                \
    static void name##_4(int64_t n, float *restrict s, size_t bs, const void *restrict vx,         \
                     size_t bx, const void *restrict vy, size_t by, int nr, int nc) {              \
        const pg_gemm_rows r = pg_gemm_rows_of(vx, bx, vy, by, nr, nc);                            \
        __m512 acc[PG_GR][PG_GC];                                                                  \
        PG_UNROLL for (int i = 0; i < PG_GR; i++)                                                  \
            PG_UNROLL for (int j = 0; j < PG_GC; j++) acc[i][j] = _mm512_setzero_ps();             \
        for (int64_t b = 0; b < n / PG_QK_K; b++) {                                                \
            PG_UNROLL for (int i = 0; i < PG_GR; i++) {                                            \
                const krow k = DECODE((const XT *)r.x[i] + b);                                     \
                PG_UNROLL for (int j = 0; j < PG_GC; j++) {                                        \
                    const pg_block_q8_K *y = (const pg_block_q8_K *)r.y[j] + b;                    \
                    acc[i][j] = SHIFT < 0 ? kstep_mins(acc[i][j], &k, y)                           \
                                          : kstep_offset(acc[i][j], &k, y, SHIFT);                 \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
        store_acc(s, bs, acc, nr, nc);                                                             \
    }                                                                                              \
    PG_GEMM_BY4(name, name##_4)

AINL krow decode_q4_K(const pg_block_q4_K *x) { return decode_k4(x->qs, x->scales, &x->d, NULL); }
AINL krow decode_q5_K(const pg_block_q5_K *x) {
    return decode_k4(x->qs, x->scales, &x->d, x->qh);
}

PG_GEMM_KQUANT_512(gemm_q2_K_512, pg_block_q2_K, decode_q2_K, -1)
PG_GEMM_KQUANT_512(gemm_q3_K_512, pg_block_q3_K, decode_q3_K, 2)
PG_GEMM_KQUANT_512(gemm_q4_K_512, pg_block_q4_K, decode_q4_K, -1)
PG_GEMM_KQUANT_512(gemm_q5_K_512, pg_block_q5_K, decode_q5_K, -1)
PG_GEMM_KQUANT_512(gemm_q6_K_512, pg_block_q6_K, decode_q6_K, 5)

/* ---- table ------------------------------------------------------------------------------- */

void pg_fill_gemm_avx512(pg_type_traits *tbl) {
    if (!(pg_g_cpu_features & PG_CPU_AVX512VNNI)) return;
    tbl[PG_TYPE_Q4_0].gemm = gemm_q4_0_512;
    tbl[PG_TYPE_Q4_1].gemm = gemm_q4_1_512;
    tbl[PG_TYPE_Q5_0].gemm = gemm_q5_0_512;
    tbl[PG_TYPE_Q5_1].gemm = gemm_q5_1_512;
    tbl[PG_TYPE_Q8_0].gemm = gemm_q8_0_512;
    tbl[PG_TYPE_Q2_K].gemm = gemm_q2_K_512;
    tbl[PG_TYPE_Q3_K].gemm = gemm_q3_K_512;
    tbl[PG_TYPE_Q4_K].gemm = gemm_q4_K_512;
    tbl[PG_TYPE_Q5_K].gemm = gemm_q5_K_512;
    tbl[PG_TYPE_Q6_K].gemm = gemm_q6_K_512;
}
