/* Multi-row dot kernels (pg_type_traits.gemm) with AVX-512 VNNI; installed on the avx512 path
 * only when the CPU has AVX512-VNNI (this file is compiled with F/BW/VL/VNNI).
 *
 * What the pairwise vec_dot repeats per pair is done here once per weight row or activation
 * row of the block:
 *   - legacy formats, one block per step, blocks of up to 8 × 8 (two groups of 4 weight rows ×
 *     two groups of 4 activation rows): each group of four weight rows shares two registers
 *     (one 128-bit lane per row), each activation row's 16-byte halves are broadcast to the
 *     four lanes, two VPDPBUSD per activation row and group give every row's partial sums at
 *     once, and a 4 × 4 transpose-add leaves 16 block dots in one register: one conversion,
 *     one scale product and one FMA per block for 16 dots. Weight groups are decoded once for
 *     all activation rows, activation rows loaded once for all weight groups;
 *   - K-quants, one super-block per step, the same layout: per 16-element slice one maddubs and
 *     one VPDPWSSD (with the weight rows' sub-block scales, one per lane) per activation row and
 *     group; mins (or the −4 / −32 offsets) through madd with the activation rows' bsums; a
 *     transpose-add and one conversion and FMA per group and super-block;
 *   - K-quant decode (vec_dot8: eight weight rows, 1..8 activation rows): the same four-rows-per-
 *     register form for many activation rows, and for a few (decode) a row-major form that
 *     reads each row's super-block as it lies, with the activations loaded once per super-block
 *     in the matching order (kquant_rm8).
 * Integer sums are exact; each dot's fp32 work is the scalar kernel's block term added to its
 * running sum in block order (one lane per dot), so every dot has the bits of the vec_dot of its
 * two rows on this path (the scalar reference's): a token's result never depends on its batch
 * (tests/test_gemm.c). */
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
                /* the scalar kernels' block terms (quants_legacy.c), one lane per dot */
                const __m512 isum = _mm512_cvtepi32_ps(dots);
                __m512 t;
                if (M)
                    t = _mm512_add_ps(_mm512_mul_ps(_mm512_mul_ps(dx[g], dy), isum),
                                      _mm512_mul_ps(fp16_grid(xg[0] + M, xg[1] + M, xg[2] + M,
                                                              xg[3] + M, 1),
                                                    sy));
                else if (Q8)
                    t = _mm512_mul_ps(isum, _mm512_mul_ps(dx[g], dy));
                else
                    t = _mm512_mul_ps(_mm512_mul_ps(isum, dx[g]), dy);
                acc[g][h] = _mm512_add_ps(acc[g][h], t);
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

/* ---- K-quants × Q8_K: four weight rows per register ----------------------------------------- */

/* As the legacy kernels: a group of 4 weight rows shares each register (row i in 128-bit lane
 * i), one 16-element slice t of the super-block at a time, and each activation row's 16 bytes
 * of the slice are broadcast to the four lanes. maddubs then VPDPWSSD with the slice's scale
 * (an int16 per lane, i.e. per weight row) accumulate row i's scaled partial sums in lane i;
 * the mins (or the −32 offset of Q6_K) go through madd of the rows' int16 mins / scales with the
 * activation row's bsums, also one lane per weight row. Per super-block a transpose-add per
 * group of 4 activation rows gives 16 integer dots in one register (lane 4i + j), converted and
 * scaled once. The slices are the outer loop, the activation rows the inner one: each level
 * vector is built once and feeds one maddubs per activation row. */

/* every 16-bit word of a 128-bit lane = byte k of that lane, zero-extended */
AINL __m512i bcast_byte16(__m512i v, int k) {
    return _mm512_shuffle_epi8(v, _mm512_set1_epi16((short)(0x8000 | k)));
}
/* every 16-bit word of a 128-bit lane = word k of that lane */
AINL __m512i bcast_word16(__m512i v, int k) {
    return _mm512_shuffle_epi8(v, _mm512_set1_epi16((short)((2 * k + 1) << 8 | 2 * k)));
}

/* A group of 4 weight rows of one super-block: per slice t, the levels come from `lv` (built
 * by the caller slice by slice), the scale from sc[t / per]; w16lo/w16hi: the int16 weights of
 * bsums 0..7 / 8..15 (mins of pairs, or Q6_K's scales); d (and dmin) grids. */
typedef struct {
    __m512i sc[16], w16lo, w16hi;
    __m512 d, dmin;
} kgroup;

/* The 16 bytes at byte o of the four rows' block b (blocks of type T) */
#define KQ_ROW(x, i, b, T, o) ((const char *)((const T *)(x)[i] + (b)) + (o))
#define KQ_LOAD4(x, b, T, o)                                                                       \
    load4x16(KQ_ROW(x, 0, b, T, o), KQ_ROW(x, 1, b, T, o), KQ_ROW(x, 2, b, T, o),                  \
             KQ_ROW(x, 3, b, T, o))

/* [lo 8 bytes of lanes 0..3 | hi 8 bytes of lanes 0..3] widened to int16 (signed or not) */
AINL void widen_lanes(__m512i v, int is_signed, __m512i *lo, __m512i *hi) {
    const __m512i t = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), v);
    *lo = is_signed ? _mm512_cvtepi8_epi16(_mm512_castsi512_si256(t))
                    : _mm512_cvtepu8_epi16(_mm512_castsi512_si256(t));
    *hi = is_signed ? _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(t, 1))
                    : _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(t, 1));
}

AINL void kgroup_k4(const char *const *x, int64_t b, int is_q5, kgroup *k) {
    const size_t st = is_q5 ? sizeof(pg_block_q5_K) : sizeof(pg_block_q4_K);
    const char *p[4];
    PG_UNROLL for (int i = 0; i < 4; i++) p[i] = x[i] + (size_t)b * st;
    /* [sc0..7 m0..7] of row i in lane i (k4_scales reads 16 bytes from the scales: inside) */
    __m512i sm = _mm512_castsi128_si512(k4_scales((const uint8_t *)p[0] + 4));
    sm = _mm512_inserti32x4(sm, k4_scales((const uint8_t *)p[1] + 4), 1);
    sm = _mm512_inserti32x4(sm, k4_scales((const uint8_t *)p[2] + 4), 2);
    sm = _mm512_inserti32x4(sm, k4_scales((const uint8_t *)p[3] + 4), 3);
    PG_UNROLL for (int j = 0; j < 8; j++) k->sc[j] = bcast_byte16(sm, j);
    /* words m0 m0 m1 m1 m2 m2 m3 m3 and m4 m4 .. m7 m7: with bsums 0..7 / 8..15 in madd */
    k->w16lo = _mm512_shuffle_epi8(sm, _mm512_set4_epi32((int)0x800b800b, (int)0x800a800a,
                                                         (int)0x80098009, (int)0x80088008));
    k->w16hi = _mm512_shuffle_epi8(sm, _mm512_set4_epi32((int)0x800f800f, (int)0x800e800e,
                                                         (int)0x800d800d, (int)0x800c800c));
    k->d = fp16_grid(p[0], p[1], p[2], p[3], 1);
    k->dmin = fp16_grid(p[0] + 2, p[1] + 2, p[2] + 2, p[3] + 2, 1);
}

AINL void kgroup_q6(const char *const *x, int64_t b, kgroup *k) {
    const char *p[4];
    PG_UNROLL for (int i = 0; i < 4; i++) p[i] = x[i] + (size_t)b * sizeof(pg_block_q6_K);
    widen_lanes(load4x16(p[0] + 192, p[1] + 192, p[2] + 192, p[3] + 192), 1, &k->w16lo,
                &k->w16hi);
    PG_UNROLL for (int j = 0; j < 8; j++) {
        k->sc[j] = bcast_word16(k->w16lo, j);
        k->sc[8 + j] = bcast_word16(k->w16hi, j);
    }
    k->d = fp16_grid(p[0] + 208, p[1] + 208, p[2] + 208, p[3] + 208, 1);
    k->dmin = _mm512_setzero_ps();
}

AINL void kgroup_q2(const char *const *x, int64_t b, kgroup *k) {
    const char *p[4];
    PG_UNROLL for (int i = 0; i < 4; i++) p[i] = x[i] + (size_t)b * sizeof(pg_block_q2_K);
    const __m512i m4 = _mm512_set1_epi8(0xF);
    const __m512i sb = load4x16(p[0], p[1], p[2], p[3]);   /* scale | min << 4, per 16 */
    const __m512i sc = _mm512_and_si512(sb, m4);
    PG_UNROLL for (int j = 0; j < 16; j++) k->sc[j] = bcast_byte16(sc, j);
    widen_lanes(_mm512_and_si512(_mm512_srli_epi16(sb, 4), m4), 0, &k->w16lo, &k->w16hi);
    k->d = fp16_grid(p[0] + 80, p[1] + 80, p[2] + 80, p[3] + 80, 1);
    k->dmin = fp16_grid(p[0] + 82, p[1] + 82, p[2] + 82, p[3] + 82, 1);
}

AINL void kgroup_q3(const char *const *x, int64_t b, kgroup *k) {
    const char *p[4];
    PG_UNROLL for (int i = 0; i < 4; i++) p[i] = x[i] + (size_t)b * sizeof(pg_block_q3_K);
    /* k3_scales reads the 16 bytes before the block's d (scales at 96..107): inside */
    __m512i sb = _mm512_castsi128_si512(k3_scales((const uint8_t *)p[0] + 94));
    sb = _mm512_inserti32x4(sb, k3_scales((const uint8_t *)p[1] + 94), 1);
    sb = _mm512_inserti32x4(sb, k3_scales((const uint8_t *)p[2] + 94), 2);
    sb = _mm512_inserti32x4(sb, k3_scales((const uint8_t *)p[3] + 94), 3);
    widen_lanes(sb, 1, &k->w16lo, &k->w16hi);
    PG_UNROLL for (int j = 0; j < 8; j++) {
        k->sc[j] = bcast_word16(k->w16lo, j);
        k->sc[8 + j] = bcast_word16(k->w16hi, j);
    }
    k->d = fp16_grid(p[0] + 108, p[1] + 108, p[2] + 108, p[3] + 108, 1);
    k->dmin = _mm512_setzero_ps();
}

/* Levels of slice t (elements 16t..16t+15) of the four rows of super-block b. */
AINL __m512i kslice(const char *const *x, int64_t b, int type, int t) {
    const __m512i m4 = _mm512_set1_epi8(0xF);
    if (type == 2 || type == 3) {   /* element 128h + 32j + 16v + l: bits 2j of qs[32h + 16v + l] */
        const int h = t / 8, j = (t / 2) % 4, v = t % 2;
        const __m512i z = type == 2 ? KQ_LOAD4(x, b, pg_block_q2_K, 16 + 32 * h + 16 * v)
                                    : KQ_LOAD4(x, b, pg_block_q3_K, 32 + 32 * h + 16 * v);
        const __m512i q = _mm512_and_si512(_mm512_srli_epi16(z, 2 * j), _mm512_set1_epi8(3));
        if (type == 2) return q;
        /* Q3_K: + 4 where hmask[16v + l] has bit 4h + j (levels 0..7, offset −4) */
        const __m512i hm = KQ_LOAD4(x, b, pg_block_q3_K, 16 * v);
        const __mmask64 k = _mm512_test_epi8_mask(hm, _mm512_set1_epi8((char)(1 << (4 * h + j))));
        return _mm512_mask_add_epi8(q, k, q, _mm512_set1_epi8(4));
    }
    if (type == 6) {   /* element 128h + 32g + 16v + l */
        const int h = t / 8, g = (t / 2) % 4, v = t % 2;
        const __m512i l = KQ_LOAD4(x, b, pg_block_q6_K, 64 * h + 32 * (g & 1) + 16 * v);
        const __m512i qh = KQ_LOAD4(x, b, pg_block_q6_K, 128 + 32 * h + 16 * v);
        const __m512i lo = g < 2 ? _mm512_and_si512(l, m4)
                                 : _mm512_and_si512(_mm512_srli_epi16(l, 4), m4);
        const __m512i hi = g == 0 ? _mm512_slli_epi16(qh, 4)
                                  : g == 1 ? _mm512_slli_epi16(qh, 2)
                                           : g == 2 ? qh : _mm512_srli_epi16(qh, 2);
        return _mm512_or_si512(lo, _mm512_and_si512(hi, _mm512_set1_epi8(0x30)));
    }
    /* Q4_K / Q5_K: element 64c + 32u + 16v + l: nibble u of qs[32c + 16v + l] */
    const int c = t / 4, u = (t / 2) % 2, v = t % 2;
    if (type == 4) {
        const __m512i z = KQ_LOAD4(x, b, pg_block_q4_K, 16 + 32 * c + 16 * v);
        return u ? _mm512_and_si512(_mm512_srli_epi16(z, 4), m4) : _mm512_and_si512(z, m4);
    }
    const __m512i z = KQ_LOAD4(x, b, pg_block_q5_K, 48 + 32 * c + 16 * v);
    const __m512i lv = u ? _mm512_and_si512(_mm512_srli_epi16(z, 4), m4) : _mm512_and_si512(z, m4);
    const __m512i qh = KQ_LOAD4(x, b, pg_block_q5_K, 16 + 16 * v);   /* 5th bit: bit 2c + u */
    const __mmask64 k = _mm512_test_epi8_mask(qh, _mm512_set1_epi8((char)(1 << (2 * c + u))));
    return _mm512_mask_add_epi8(lv, k, lv, _mm512_set1_epi8(0x10));
}

/* the Q8_K scales of activation rows y[0..3] as a grid, lane 4i + j = d_j */
AINL __m512 kdy_grid(const char *const *y, int64_t b) {
    const __m128 d = _mm_setr_ps(((const pg_block_q8_K *)y[0] + b)->d,
                                 ((const pg_block_q8_K *)y[1] + b)->d,
                                 ((const pg_block_q8_K *)y[2] + b)->d,
                                 ((const pg_block_q8_K *)y[3] + b)->d);
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3),
                                 _mm512_castps128_ps512(d));
}

/* G groups of 4 weight rows × C groups of 4 activation rows; type 2..6 = Q2_K..Q6_K. */
AINL void kquant_512(int64_t n, float *s, size_t bs, const char *const *xr, const char *const *yr,
                     int nr, int nc, const int G, const int C, const int type) {
    __m512 acc[2][2];
    PG_UNROLL for (int g = 0; g < G; g++)
        PG_UNROLL for (int h = 0; h < C; h++) acc[g][h] = _mm512_setzero_ps();
    for (int64_t b = 0; b < n / PG_QK_K; b++) {
        kgroup k[2];
        PG_UNROLL for (int g = 0; g < G; g++) {
            if (type == 2) kgroup_q2(xr + 4 * g, b, &k[g]);
            else if (type == 3) kgroup_q3(xr + 4 * g, b, &k[g]);
            else if (type == 6) kgroup_q6(xr + 4 * g, b, &k[g]);
            else kgroup_k4(xr + 4 * g, b, type == 5, &k[g]);
        }
        const pg_block_q8_K *y[8];
        PG_UNROLL for (int j = 0; j < 4 * C; j++) y[j] = (const pg_block_q8_K *)yr[j] + b;
        __m512i p[2][8];
        PG_UNROLL for (int g = 0; g < G; g++)
            PG_UNROLL for (int j = 0; j < 4 * C; j++) {
                /* mins·bsums (Q2_K, Q4_K, Q5_K) or the offset −2^shift·Σ sc·bsums (Q3_K: 4,
                 * Q6_K: 32), per weight row lane */
                const __m512i bl =
                    _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)y[j]->bsums));
                const __m512i bh =
                    _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(y[j]->bsums + 8)));
                const __m512i m = _mm512_add_epi32(_mm512_madd_epi16(k[g].w16lo, bl),
                                                   _mm512_madd_epi16(k[g].w16hi, bh));
                p[g][j] = type == 3 || type == 6
                              ? _mm512_sub_epi32(_mm512_setzero_si512(),
                                                 _mm512_slli_epi32(m, type == 3 ? 2 : 5))
                              : m;
            }
        __m512i mins[2][8];
        const int has_min = type == 2 || type == 4 || type == 5;
        if (has_min) {   /* the sums start from 0; the mins are kept apart (scaled by dmin) */
            PG_UNROLL for (int g = 0; g < G; g++)
                PG_UNROLL for (int j = 0; j < 4 * C; j++) {
                    mins[g][j] = p[g][j];
                    p[g][j] = _mm512_setzero_si512();
                }
        }
        PG_UNROLL for (int t = 0; t < 16; t++) {
            __m512i lv[2];
            PG_UNROLL for (int g = 0; g < G; g++) lv[g] = kslice(xr + 4 * g, b, type, t);
            PG_UNROLL for (int j = 0; j < 4 * C; j++) {
                const __m512i a =
                    _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(y[j]->qs + 16 * t)));
                PG_UNROLL for (int g = 0; g < G; g++)
                    p[g][j] = _mm512_dpwssd_epi32(p[g][j], _mm512_maddubs_epi16(lv[g], a),
                                                  k[g].sc[type == 4 || type == 5 ? t / 2 : t]);
            }
        }
        PG_UNROLL for (int h = 0; h < C; h++) {
            const __m512 dy = kdy_grid((const char *const *)yr + 4 * h, b);
            PG_UNROLL for (int g = 0; g < G; g++) {
                const __m512i *ph = p[g] + 4 * h;
                const __m512i dots = transpose_add4(ph[0], ph[1], ph[2], ph[3]);
                /* the scalar kernels' super-block terms (quants_kquants.c), one lane per dot */
                __m512 t = _mm512_mul_ps(_mm512_mul_ps(k[g].d, dy), _mm512_cvtepi32_ps(dots));
                if (has_min) {
                    const __m512i *mh = mins[g] + 4 * h;
                    const __m512i mm = transpose_add4(mh[0], mh[1], mh[2], mh[3]);
                    t = _mm512_sub_ps(t, _mm512_mul_ps(_mm512_mul_ps(k[g].dmin, dy),
                                                       _mm512_cvtepi32_ps(mm)));
                }
                acc[g][h] = _mm512_add_ps(acc[g][h], t);
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

#define PG_GEMM_KQUANT_512(name, TYPE)                                                             \
    static void name(int64_t n, float *restrict s, size_t bs, const void *restrict vx,             \
                     size_t bx, const void *restrict vy, size_t by, int nr, int nc) {              \
        const char *x[8], *y[8];                                                                   \
        for (int i = 0; i < 8; i++) x[i] = (const char *)vx + (i < nr ? (size_t)i * bx : 0);       \
        for (int j = 0; j < 8; j++) y[j] = (const char *)vy + (j < nc ? (size_t)j * by : 0);       \
        if (nr <= 4 && nc <= 4) kquant_512(n, s, bs, x, y, nr, nc, 1, 1, TYPE);                    \
        else if (nr <= 4) kquant_512(n, s, bs, x, y, nr, nc, 1, 2, TYPE);                          \
        else if (nc <= 4) kquant_512(n, s, bs, x, y, nr, nc, 2, 1, TYPE);                          \
        else kquant_512(n, s, bs, x, y, nr, nc, 2, 2, TYPE);                                       \
    }

PG_GEMM_KQUANT_512(gemm_q2_K_512, 2)
PG_GEMM_KQUANT_512(gemm_q3_K_512, 3)
PG_GEMM_KQUANT_512(gemm_q4_K_512, 4)
PG_GEMM_KQUANT_512(gemm_q5_K_512, 5)
PG_GEMM_KQUANT_512(gemm_q6_K_512, 6)

/* ---- vec_dot8 (decode): eight weight rows · one activation row, K-quants -------------------- */

/* p0 (rows 0..3), p1 (rows 4..7): each 128-bit lane one row's four int32 partial sums -> the
 * eight rows' totals (exact integers, any order) */
AINL __m256i rows8_totals(__m512i p0, __m512i p1) {
    p0 = _mm512_add_epi32(p0, _mm512_shuffle_epi32(p0, _MM_PERM_BADC));
    p1 = _mm512_add_epi32(p1, _mm512_shuffle_epi32(p1, _MM_PERM_BADC));
    p0 = _mm512_add_epi32(p0, _mm512_shuffle_epi32(p0, _MM_PERM_CDAB));
    p1 = _mm512_add_epi32(p1, _mm512_shuffle_epi32(p1, _MM_PERM_CDAB));
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_castsi512_si256(_mm512_permutex2var_epi32(p0, idx, p1));
}

/* Rows in lanes, each lane the scalar kernel's super-block terms added in block order (the
 * integer sums as kquant_512 forms them, one activation row broadcast to the four rows of a
 * register): the bits of vec_dot. C activation rows (1..PG_DOT8_MAX_NC) share each unpacked
 * slice of the weights, so a few tokens (speculative verification, a few server streams) read
 * and unpack the weights once. Only the level sums are accumulated in the slice loop; the
 * bsums terms (the mins, Q6_K's −32 offset) are exact integers added after it, which keeps
 * 2·C accumulators live (8 rows × 8 tokens fit the 32 registers). type 4, 5, 6 = Q4_K, Q5_K,
 * Q6_K. */
AINL void kquant_rows8(int64_t n, float *s, size_t bs, const void *vx, size_t bx, const void *vy,
                       size_t by, const int C, const int type) {
    const char *x[8];
    PG_UNROLL for (int i = 0; i < 8; i++) x[i] = (const char *)vx + (size_t)i * bx;
    const pg_block_q8_K *yr[PG_DOT8_MAX_NC];
    PG_UNROLL for (int j = 0; j < C; j++)
        yr[j] = (const pg_block_q8_K *)((const char *)vy + (size_t)j * by);
    const size_t bsize = kq_block_bytes(type);
    __m256 acc[PG_DOT8_MAX_NC];
    PG_UNROLL for (int j = 0; j < C; j++) acc[j] = _mm256_setzero_ps();
    const int64_t nb = n / PG_QK_K;
    const size_t share = kq_dot8_share(bx, nb);
    for (int64_t b = 0; b < nb; b++) {
        kq_dot8_prefetch(vx, bx, b, share);
        kgroup k[2];
        PG_UNROLL for (int g = 0; g < 2; g++) {
            if (type == 6) kgroup_q6(x + 4 * g, b, &k[g]);
            else kgroup_k4(x + 4 * g, b, type == 5, &k[g]);
        }
        __m512i p[2][PG_DOT8_MAX_NC];
        PG_UNROLL for (int g = 0; g < 2; g++)
            PG_UNROLL for (int j = 0; j < C; j++) p[g][j] = _mm512_setzero_si512();
        PG_UNROLL for (int t = 0; t < 16; t++) {
            __m512i lv[2];
            PG_UNROLL for (int g = 0; g < 2; g++) lv[g] = kslice(x + 4 * g, b, type, t);
            PG_UNROLL for (int j = 0; j < C; j++) {
                const __m512i a = _mm512_broadcast_i32x4(
                    _mm_loadu_si128((const __m128i *)((yr[j] + b)->qs + 16 * t)));
                PG_UNROLL for (int g = 0; g < 2; g++)
                    p[g][j] = _mm512_dpwssd_epi32(p[g][j], _mm512_maddubs_epi16(lv[g], a),
                                                  k[g].sc[type == 6 ? t : t / 2]);
            }
        }
        __m256 d, dmin;   /* see kquant_rm8 */
        if (type == 6) kq_rows8_fp16x2(x[0], bx, b, bsize, 206, &dmin, &d);
        else kq_rows8_fp16x2(x[0], bx, b, bsize, 0, &d, &dmin);
        PG_UNROLL for (int j = 0; j < C; j++) {
            const pg_block_q8_K *y = yr[j] + b;
            const __m512i bl = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)y->bsums));
            const __m512i bh =
                _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(y->bsums + 8)));
            __m512i m[2];   /* Σ mins·bsums (Q4_K, Q5_K) or Σ sc·bsums (Q6_K), per row lane */
            PG_UNROLL for (int g = 0; g < 2; g++)
                m[g] = _mm512_add_epi32(_mm512_madd_epi16(k[g].w16lo, bl),
                                        _mm512_madd_epi16(k[g].w16hi, bh));
            const __m256 dy = _mm256_set1_ps(y->d);
            __m256 term;
            if (type == 6) {   /* (d·dy)·isum, isum with the −32 offset of the levels */
                const __m256i off = _mm256_slli_epi32(rows8_totals(m[0], m[1]), 5);
                const __m256 fi =
                    _mm256_cvtepi32_ps(_mm256_sub_epi32(rows8_totals(p[0][j], p[1][j]), off));
                term = _mm256_mul_ps(_mm256_mul_ps(d, dy), fi);
            } else {           /* (dy·d)·isum − (dy·dmin)·summs */
                const __m256 fi = _mm256_cvtepi32_ps(rows8_totals(p[0][j], p[1][j]));
                const __m256 fm = _mm256_cvtepi32_ps(rows8_totals(m[0], m[1]));
                term = _mm256_sub_ps(_mm256_mul_ps(_mm256_mul_ps(dy, d), fi),
                                     _mm256_mul_ps(_mm256_mul_ps(dy, dmin), fm));
            }
            acc[j] = _mm256_add_ps(acc[j], term);
        }
    }
    PG_UNROLL for (int j = 0; j < C; j++)
        _mm256_storeu_ps((float *)((char *)s + (size_t)j * bs), acc[j]);
}

/* ---- vec_dot8, row-major form (decode and a few tokens) ------------------------------------ */

/* Each weight row's super-block is read as it lies (two or four 64-byte loads, no per-slice
 * inserts), its levels split into four 64-byte vectors L0..L3; the activations are loaded once
 * per super-block in the matching order (A0..A3) and shared by the eight rows. One VPDPBUSD per
 * level vector gives dword partial sums of 4 products each (|·| ≤ 4·63·128 < 2^15, also with
 * Q6_K's −32 offset folded in: (q − 32)·a, |·| ≤ 4·32·128), which VPACKSSDW packs two vectors
 * at a time into int16 words without saturating; one VPDPWSSD per packed pair applies each
 * word's sub-block scale and accumulates. Per super-block a joint 4-row transpose-add and a
 * final lane fold give the eight rows' exact integer sums (any order: integers), then the
 * scalar kernel's fp32 term per row, added in block order: vec_dot's bits.
 *
 * Layouts (lane = 128 bits = 4 dword partials of one sub-block's 16 consecutive elements, or a
 * quarter of a 32-element one):
 *   Q4_K/Q5_K: qs[0..63] → L0 = low nibbles (elements 0..31 | 64..95: sub-blocks 0 | 2),
 *     L1 = high nibbles (32..63 | 96..127: 1 | 3); qs[64..127] → L2 (4 | 6), L3 (5 | 7);
 *     A0 = a[0..31 | 64..95], A1 = a[32..63 | 96..127], A2, A3 the same +128. A packed pair
 *     (L0, L1) holds in lane k the words of sub-blocks (0, 1) for k < 2, (2, 3) for k ≥ 2.
 *   Q6_K: ql[0..63] low nibbles with qh[0..31] bits 0-1 | 2-3 → L0 = elements 0..63 (16-element
 *     sub-blocks 0..3, one per lane), high nibbles with bits 4-5 | 6-7 → L1 = 64..127 (4..7);
 *     ql[64..127] and qh[32..63] → L2, L3 (8..11, 12..15); A0..A3 = a[0..255] as it lies. A
 *     packed pair (L0, L1) holds in lane k the words of sub-blocks (k, 4 + k). */

/* the activations of super-block y in the kernel's order, and Q6_K's −32·Σa per dword */
AINL void rm_acts(const pg_block_q8_K *y, int type, __m512i a[4], __m512i off[4]) {
    if (type == 6) {
        const __m512i c32 = _mm512_set1_epi8(32);
        PG_UNROLL for (int k = 0; k < 4; k++) {
            a[k] = _mm512_loadu_si512(y->qs + 64 * k);
            off[k] = _mm512_sub_epi32(_mm512_setzero_si512(),
                                      _mm512_dpbusd_epi32(_mm512_setzero_si512(), c32, a[k]));
        }
        return;
    }
    /* k = 2h + u: a[128h + 32u ..] | a[128h + 64 + 32u ..] */
    PG_UNROLL for (int k = 0; k < 4; k++) {
        const int8_t *p = y->qs + 128 * (k / 2) + 32 * (k % 2);
        a[k] = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p)),
            _mm256_loadu_si256((const __m256i *)(p + 64)), 1);
        off[k] = _mm512_setzero_si512();
    }
}

/* one weight row's super-block: the level vectors, the two scale-word vectors matching the
 * packed pairs, and (Q4_K, Q5_K) the mins as words m0 m0 m1 m1 .. m7 m7 (madd with bsums) */
AINL void rm_row(const char *p, int type, __m512i sb, __m512i l[4], __m512i sc[2]) {
    const __m512i m4 = _mm512_set1_epi8(0xF);
    if (type == 6) {
        const __m512i q0 = _mm512_loadu_si512(p), q1 = _mm512_loadu_si512(p + 64);
        const __m512i qh = _mm512_loadu_si512(p + 128);
        const __m512i m30 = _mm512_set1_epi8(0x30);
        /* per 256-bit half: the two bits of qh for the low nibbles (<< 4, << 2) and for the
         * high nibbles (<< 0, >> 2) */
        const __m512i sl = _mm512_setr_epi64(0x0004000400040004, 0x0004000400040004,
                                             0x0004000400040004, 0x0004000400040004,
                                             0x0002000200020002, 0x0002000200020002,
                                             0x0002000200020002, 0x0002000200020002);
        const __m512i sr = _mm512_setr_epi64(0, 0, 0, 0, 0x0002000200020002,
                                             0x0002000200020002, 0x0002000200020002,
                                             0x0002000200020002);
        PG_UNROLL for (int h = 0; h < 2; h++) {
            const __m512i q = h ? q1 : q0;
            const __m512i hh = _mm512_shuffle_i64x2(qh, qh, h ? 0xEE : 0x44);
            const __m512i lo_hi = _mm512_and_si512(_mm512_sllv_epi16(hh, sl), m30);
            const __m512i hi_hi = _mm512_and_si512(_mm512_srlv_epi16(hh, sr), m30);
            l[2 * h] = _mm512_ternarylogic_epi32(q, m4, lo_hi, 0xEA);   /* (q & m4) | lo_hi */
            l[2 * h + 1] =
                _mm512_ternarylogic_epi32(_mm512_srli_epi16(q, 4), m4, hi_hi, 0xEA);
        }
        /* int8 scales as words; pair (L0, L1) lane k: sub-blocks k, 4 + k; (L2, L3): 8 + k,
         * 12 + k */
        const __m512i s16 = _mm512_castsi256_si512(
            _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + 192))));
        sc[0] = _mm512_permutexvar_epi16(
            _mm512_setr_epi64(0x0000000000000000, 0x0004000400040004, 0x0001000100010001,
                              0x0005000500050005, 0x0002000200020002, 0x0006000600060006,
                              0x0003000300030003, 0x0007000700070007),
            s16);
        sc[1] = _mm512_permutexvar_epi16(
            _mm512_setr_epi64(0x0008000800080008, 0x000c000c000c000c, 0x0009000900090009,
                              0x000d000d000d000d, 0x000a000a000a000a, 0x000e000e000e000e,
                              0x000b000b000b000b, 0x000f000f000f000f),
            s16);
        return;
    }
    const int qs = type == 4 ? 16 : 48;
    const __m512i z0 = _mm512_loadu_si512(p + qs), z1 = _mm512_loadu_si512(p + qs + 64);
    l[0] = _mm512_and_si512(z0, m4);
    l[1] = _mm512_and_si512(_mm512_srli_epi16(z0, 4), m4);
    l[2] = _mm512_and_si512(z1, m4);
    l[3] = _mm512_and_si512(_mm512_srli_epi16(z1, 4), m4);
    if (type == 5) {   /* element 64c + 32u + l: + 16 where qh[l] has bit 2c + u */
        const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(p + 16)));
        const __m512i b16 = _mm512_set1_epi8(0x10);
        /* L_k = (c, u) = (2(k/2), k%2) | (2(k/2)+1, k%2) */
        PG_UNROLL for (int k = 0; k < 4; k++) {
            const int bit = 4 * (k / 2) + k % 2;
            const __m512i t = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << bit)),
                                                 _mm256_set1_epi8((char)(1 << (bit + 2))), 1);
            l[k] = _mm512_mask_add_epi8(l[k], _mm512_test_epi8_mask(qh, t), l[k], b16);
        }
    }
    /* sb: the row's [sc0..7 m0..7] in every lane; words: lanes 0, 1 sc(2h) ×4, sc(2h + 1) ×4,
     * lanes 2, 3 the next two */
    sc[0] = _mm512_shuffle_epi8(sb, _mm512_setr_epi64(
        (long long)0x8000800080008000ull, (long long)0x8001800180018001ull,
        (long long)0x8000800080008000ull, (long long)0x8001800180018001ull,
        (long long)0x8002800280028002ull, (long long)0x8003800380038003ull,
        (long long)0x8002800280028002ull, (long long)0x8003800380038003ull));
    sc[1] = _mm512_shuffle_epi8(sb, _mm512_setr_epi64(
        (long long)0x8004800480048004ull, (long long)0x8005800580058005ull,
        (long long)0x8004800480048004ull, (long long)0x8005800580058005ull,
        (long long)0x8006800680068006ull, (long long)0x8007800780078007ull,
        (long long)0x8006800680068006ull, (long long)0x8007800780078007ull));
}

/* k4_scales of four rows at once: lane i = [sc0..7 m0..7] of the block at p[i] (Q4_K, Q5_K) */
AINL __m512i rm_scales4(const char *p0, const char *p1, const char *p2, const char *p3) {
    const __m512i u = load4x16(p0 + 4, p1 + 4, p2 + 4, p3 + 4);
    /* dwords u0, u2, u1, u2 >> 4 and (u0, u0, u1, u1) >> 2, as k4_scales */
    const __m512i a = _mm512_srlv_epi32(_mm512_shuffle_epi32(u, (_MM_PERM_ENUM)0x98),
                                        _mm512_set4_epi32(4, 0, 0, 0));
    const __m512i h = _mm512_srli_epi32(_mm512_shuffle_epi32(u, (_MM_PERM_ENUM)0x50), 2);
    const __m512i lo = _mm512_and_si512(a, _mm512_set4_epi32(0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f,
                                                              0x3f3f3f3f));
    return _mm512_ternarylogic_epi32(lo, h, _mm512_set4_epi32(0x30303030, 0, 0x30303030, 0),
                                     0xF8);   /* lo | (h & mask) */
}

/* lanes of the 8 rows' totals: g0 (rows 0..3) and g1 (rows 4..7) as transpose_add4 leaves
 * them, each 128-bit lane [r0 r1 r2 r3] partials -> [Σ r0 .. Σ r7] */
AINL __m256i rm_fold(__m512i g0, __m512i g1) {
    const __m512i s = _mm512_add_epi32(_mm512_shuffle_i32x4(g0, g1, _MM_SHUFFLE(1, 0, 1, 0)),
                                       _mm512_shuffle_i32x4(g0, g1, _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512i t = _mm512_add_epi32(_mm512_shuffle_i32x4(s, s, _MM_SHUFFLE(2, 0, 2, 0)),
                                       _mm512_shuffle_i32x4(s, s, _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_castsi512_si256(t);
}

AINL void kquant_rm8(int64_t n, float *s, size_t bs, const void *vx, size_t bx, const void *vy,
                     size_t by, const int C, const int type) {
    const char *x = vx, *xr[8];
    PG_UNROLL for (int i = 0; i < 8; i++) xr[i] = x + (size_t)i * bx;
    const size_t bsize = kq_block_bytes(type);
    __m256 acc[PG_DOT8_MAX_NC];
    PG_UNROLL for (int j = 0; j < C; j++) acc[j] = _mm256_setzero_ps();
    const int64_t nb = n / PG_QK_K;
    const size_t share = kq_dot8_share(bx, nb);
    for (int64_t b = 0; b < nb; b++) {
        kq_dot8_prefetch(vx, bx, b, share);
        const pg_block_q8_K *y[PG_DOT8_MAX_NC];
        PG_UNROLL for (int j = 0; j < C; j++)
            y[j] = (const pg_block_q8_K *)((const char *)vy + (size_t)j * by) + b;
        __m512i a[PG_DOT8_MAX_NC][4], off[PG_DOT8_MAX_NC][4];
        PG_UNROLL for (int j = 0; j < C; j++) rm_acts(y[j], type, a[j], off[j]);
        __m512i g[2][PG_DOT8_MAX_NC], mm[2][PG_DOT8_MAX_NC];
        /* Q4_K, Q5_K: the bsums in pairs (one word per 32-element sub-block, |·| ≤ 4096) */
        __m512i bp[PG_DOT8_MAX_NC];
        if (type != 6)
            PG_UNROLL for (int j = 0; j < C; j++) {
                const __m256i s = _mm256_madd_epi16(
                    _mm256_loadu_si256((const __m256i *)y[j]->bsums), _mm256_set1_epi16(1));
                bp[j] = _mm512_broadcast_i32x4(_mm_packs_epi32(_mm256_castsi256_si128(s),
                                                               _mm256_extracti128_si256(s, 1)));
            }
        PG_UNROLL for (int h = 0; h < 2; h++) {
            const char *p[4];
            PG_UNROLL for (int i = 0; i < 4; i++) p[i] = xr[4 * h + i] + (size_t)b * bsize;
            __m512i sm = _mm512_setzero_si512();
            if (type != 6) {   /* four rows' scales and mins, and Σ mins·bsums (lane i: row i) */
                sm = rm_scales4(p[0], p[1], p[2], p[3]);
                const __m512i mw = _mm512_shuffle_epi8(   /* words m0..m7 */
                    sm, _mm512_set4_epi32((int)0x800f800e, (int)0x800d800c, (int)0x800b800a,
                                          (int)0x80098008));
                PG_UNROLL for (int j = 0; j < C; j++) mm[h][j] = _mm512_madd_epi16(mw, bp[j]);
            }
            __m512i r4[4][PG_DOT8_MAX_NC];
            PG_UNROLL for (int i = 0; i < 4; i++) {
                __m512i l[4], sc[2];
                rm_row(p[i], type, _mm512_shuffle_i32x4(sm, sm, 0x55 * i), l, sc);
                PG_UNROLL for (int j = 0; j < C; j++) {
                    __m512i d[4];
                    PG_UNROLL for (int k = 0; k < 4; k++)
                        d[k] = _mm512_dpbusd_epi32(off[j][k], l[k], a[j][k]);
                    r4[i][j] = _mm512_dpwssd_epi32(
                        _mm512_madd_epi16(_mm512_packs_epi32(d[0], d[1]), sc[0]),
                        _mm512_packs_epi32(d[2], d[3]), sc[1]);
                }
            }
            PG_UNROLL for (int j = 0; j < C; j++)
                g[h][j] = transpose_add4(r4[0][j], r4[1][j], r4[2][j], r4[3][j]);
        }
        /* d, dmin (Q4_K, Q5_K: bytes 0..3); Q6_K's d: the second fp16 of bytes 206..209 */
        __m256 d, dmin;
        if (type == 6) kq_rows8_fp16x2(x, bx, b, bsize, 206, &dmin, &d);
        else kq_rows8_fp16x2(x, bx, b, bsize, 0, &d, &dmin);
        PG_UNROLL for (int j = 0; j < C; j++) {
            const __m256 dy = _mm256_set1_ps(y[j]->d);
            const __m256 fi = _mm256_cvtepi32_ps(rm_fold(g[0][j], g[1][j]));
            __m256 term;
            if (type == 6) {   /* (d·dy)·isum */
                term = _mm256_mul_ps(_mm256_mul_ps(d, dy), fi);
            } else {           /* (dy·d)·isum − (dy·dmin)·summs */
                const __m256 fm = _mm256_cvtepi32_ps(rows8_totals(mm[0][j], mm[1][j]));
                term = _mm256_sub_ps(_mm256_mul_ps(_mm256_mul_ps(dy, d), fi),
                                     _mm256_mul_ps(_mm256_mul_ps(dy, dmin), fm));
            }
            acc[j] = _mm256_add_ps(acc[j], term);
        }
    }
    PG_UNROLL for (int j = 0; j < C; j++)
        _mm256_storeu_ps((float *)((char *)s + (size_t)j * bs), acc[j]);
}

/* one compiled body per activation-row count: C is a constant in each. The row-major form up
 * to RM activation rows, the four-rows-per-register form beyond (its accumulators fit the
 * registers for 8 tokens; in cache, 1 thread, K 4096, GOP/s row-major vs four-row: Q4_K 3 rows
 * 151 vs 134, 4 rows 151 vs 145, 6 rows 138 vs 153; Q6_K 3 rows 127 vs 108, 4 rows 94-108 vs
 * 121) */
#define PG_ROWS8_KQUANT(name, TYPE, RM)                                                            \
    static void name(int64_t n, float *restrict s, size_t bs, const void *restrict x, size_t bx,   \
                     const void *restrict y, size_t by, int nc) {                                  \
        switch (nc) {                                                                              \
        case 1: kquant_rm8(n, s, bs, x, bx, y, by, 1, TYPE); break;                                \
        case 2: kquant_rm8(n, s, bs, x, bx, y, by, 2, TYPE); break;                                \
        case 3: kquant_rm8(n, s, bs, x, bx, y, by, 3, TYPE); break;                                \
        case 4:                                                                                    \
            if (RM >= 4) kquant_rm8(n, s, bs, x, bx, y, by, 4, TYPE);                              \
            else kquant_rows8(n, s, bs, x, bx, y, by, 4, TYPE);                                    \
            break;                                                                                 \
        case 5: kquant_rows8(n, s, bs, x, bx, y, by, 5, TYPE); break;                              \
        case 6: kquant_rows8(n, s, bs, x, bx, y, by, 6, TYPE); break;                              \
        case 7: kquant_rows8(n, s, bs, x, bx, y, by, 7, TYPE); break;                              \
        default: kquant_rows8(n, s, bs, x, bx, y, by, 8, TYPE); break;                             \
        }                                                                                          \
    }

PG_ROWS8_KQUANT(rows8_q4_K, 4, 4)
PG_ROWS8_KQUANT(rows8_q5_K, 5, 4)
PG_ROWS8_KQUANT(rows8_q6_K, 6, 3)

/* ---- table ------------------------------------------------------------------------------- */

void pg_fill_gemm_avx512(pg_type_traits *tbl) {
    if (!(pg_g_cpu_features & PG_CPU_AVX512VNNI)) return;
    pg_fill_gemm_tile_avx512(tbl);
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
    tbl[PG_TYPE_Q4_K].vec_dot8 = rows8_q4_K;
    tbl[PG_TYPE_Q5_K].vec_dot8 = rows8_q5_K;
    tbl[PG_TYPE_Q6_K].vec_dot8 = rows8_q6_K;
    /* up to 8 rows (in cache, 1 thread, K 1536, Q4_K GOP/s against the gemm: 2 rows 92 vs
     * 61-69, 5 rows 108-142 vs 81-105, 8 rows 150 vs 119-158; the weights are read once either
     * way, and decode (1 row) 57 vs 39-51 before the bsums terms left the slice loop) */
    tbl[PG_TYPE_Q4_K].vec_dot8_rows = tbl[PG_TYPE_Q5_K].vec_dot8_rows =
        tbl[PG_TYPE_Q6_K].vec_dot8_rows = PG_DOT8_MAX_NC;
}
