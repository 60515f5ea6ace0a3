/* Multi-row dot kernels (pg_type_traits.gemm) with AVX-512 VNNI; installed on the avx512 path
 * only when the CPU has AVX512-VNNI (this file is compiled with F/BW/VL/VNNI).
 *
 * Every call computes a 4 × 4 block (gemm.h): 4 weight rows × 4 activation rows, 16 zmm
 * accumulators. What the pairwise vec_dot repeats per pair is done here once per row or column:
 *   - legacy formats, 4 blocks per step: each weight row's 4 blocks are read with two 64-byte
 *     loads and rearranged with word permutes (vpermt2w) into unsigned levels laid out like the
 *     activations [block b: 32 bytes | block b+1: 32 bytes], plus their fp16 scales (and mins,
 *     5th bits) converted once; each activation row's blocks, scales and offset correction are
 *     loaded once. Per pair and two blocks: one VPDPBUSD (started from the column's offset
 *     term −c·Σa, so Σ(q − c)·a comes out exact for c = 8, 16 and for Q8_0's q ^ 0x80 − 128),
 *     one conversion, one scale product d_x·d_y and one FMA;
 *   - K-quants, one super-block per step: each weight row is decoded once into four 64-level
 *     rows and their int16 sub-block scales; per pair, four maddubs + VPDPWSSD give the scaled
 *     integer sums, the mins (or the −4 / −32 offsets) come from the activation's bsums, and
 *     one FMA scales [Σ 8 lanes | min 8 lanes] by [d·dy | −dmin·dy].
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

/* [v0 | v1] of two 32-byte loads */
AINL __m512i load2x32(const void *p0, const void *p1) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p0)),
                              _mm256_loadu_si256((const __m256i *)p1), 1);
}

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

/* ---- legacy formats: word gathers over four blocks ------------------------------------------ */

/* Four consecutive blocks of stride S are read as two 64-byte windows, at 0 and at
 * OFF1(S) = min(64, 4S − 64): both inside the four blocks, together covering every field
 * gathered below. WI(o, S): the vpermt2w index of the 16-bit word at byte o of the group. */
#define OFF1(S) ((4 * (S) - 64) < 64 ? (4 * (S) - 64) : 64)
#define WI(o, S) ((o) + 2 <= 64 ? (o) / 2 : 32 + ((o) - OFF1(S)) / 2)

typedef struct { __m512i lo, hi; } group64;

AINL group64 load_group(const char *p, int stride) {
    return (group64){_mm512_loadu_si512(p), _mm512_loadu_si512(p + OFF1(stride))};
}

AINL __m512i gather_words(group64 g, const uint16_t *idx) {
    return _mm512_permutex2var_epi16(g.lo, _mm512_loadu_si512(idx), g.hi);
}

/* words 0..3: the fp16 at byte F of blocks 0..3; words 4..7: at byte G; 8..15: the 32-bit qh
 * at byte H (two words per block) */
#define D4(F, S) WI(F, S), WI((S) + (F), S), WI(2 * (S) + (F), S), WI(3 * (S) + (F), S)
#define H8(H, S) WI(H, S), WI((H) + 2, S), WI((S) + (H), S), WI((S) + (H) + 2, S),                 \
                 WI(2 * (S) + (H), S), WI(2 * (S) + (H) + 2, S), WI(3 * (S) + (H), S),             \
                 WI(3 * (S) + (H) + 2, S)
/* 16 bytes at byte o as 8 words */
#define W8(o, S) WI(o, S), WI((o) + 2, S), WI((o) + 4, S), WI((o) + 6, S), WI((o) + 8, S),         \
                 WI((o) + 10, S), WI((o) + 12, S), WI((o) + 14, S)
/* the 16 qs bytes (at byte Q) of blocks k and k+1, each twice: [qs_k | qs_k | qs_k+1 | qs_k+1] */
#define QS2(k, Q, S) W8((k) * (S) + (Q), S), W8((k) * (S) + (Q), S),                               \
                     W8(((k) + 1) * (S) + (Q), S), W8(((k) + 1) * (S) + (Q), S)
#define Z8 0, 0, 0, 0, 0, 0, 0, 0

static const uint16_t k_fields_q4_0[32] = {D4(0, 18), D4(0, 18), Z8, Z8, Z8};
static const uint16_t k_fields_q4_1[32] = {D4(0, 20), D4(2, 20), Z8, Z8, Z8};
static const uint16_t k_fields_q5_0[32] = {D4(0, 22), D4(0, 22), H8(2, 22), Z8, Z8};
static const uint16_t k_fields_q5_1[32] = {D4(0, 24), D4(2, 24), H8(4, 24), Z8, Z8};
static const uint16_t k_fields_q8_0[32] = {D4(0, 34), D4(0, 34), Z8, Z8, Z8};
static const uint16_t k_fields_q8_1[32] = {D4(0, 36), D4(2, 36), Z8, Z8, Z8};
static const uint16_t k_qs_q4_0[2][32] = {{QS2(0, 2, 18)}, {QS2(2, 2, 18)}};
static const uint16_t k_qs_q4_1[2][32] = {{QS2(0, 4, 20)}, {QS2(2, 4, 20)}};
static const uint16_t k_qs_q5_0[2][32] = {{QS2(0, 6, 22)}, {QS2(2, 6, 22)}};
static const uint16_t k_qs_q5_1[2][32] = {{QS2(0, 8, 24)}, {QS2(2, 8, 24)}};

/* [qs_k | qs_k | qs_k+1 | qs_k+1] -> low nibbles in 128-bit lanes 0 and 2, high nibbles in 1
 * and 3: the 32 levels of block k, then of block k+1, in element order. */
AINL __m512i split_nibbles(__m512i v) {
    const __m512i cnt = _mm512_setr_epi64(0, 0, 0x0004000400040004LL, 0x0004000400040004LL, 0, 0,
                                          0x0004000400040004LL, 0x0004000400040004LL);
    return _mm512_and_si512(_mm512_srlv_epi16(v, cnt), _mm512_set1_epi8(0x0F));
}

/* One weight row over a step: unsigned levels of blocks (0,1) and (2,3), d_x spread per block,
 * and for Q4_1/Q5_1 m_x in lanes 0 and 8 only. */
typedef struct { __m512i q01, q23; __m512 d01, d23, m01, m23; } wstep;
/* One activation row over a step: levels, the offset term −c·Σa per 4-byte group, d_y, s_y. */
typedef struct { __m512i a01, a23, o01, o23; __m512 d01, d23, s01, s23; } astep;

/* Weight kinds: 0 = 4-bit (Q4_0, Q4_1), 1 = 5-bit (Q5_0, Q5_1), 2 = Q8_0. */
AINL wstep load_w4(const char *p, int stride, int kind, int has_m, const uint16_t *fields,
                   const uint16_t (*qs)[32]) {
    wstep w;
    __m256 f;
    if (kind == 2) {
        const pg_block_q8_0 *x = (const pg_block_q8_0 *)p;
        const __m512i flip = _mm512_set1_epi8((char)0x80);
        w.q01 = _mm512_xor_si512(load2x32(x[0].qs, x[1].qs), flip);
        w.q23 = _mm512_xor_si512(load2x32(x[2].qs, x[3].qs), flip);
        f = _mm256_cvtph_ps(_mm512_castsi512_si128(gather_words(load_group(p, stride), fields)));
    } else {
        const group64 g = load_group(p, stride);
        const __m512i hw = gather_words(g, fields);
        w.q01 = split_nibbles(gather_words(g, qs[0]));
        w.q23 = split_nibbles(gather_words(g, qs[1]));
        if (kind == 1) {
            const __m128i qh = _mm512_extracti32x4_epi32(hw, 1);
            const __m512i bit4 = _mm512_set1_epi8(0x10);
            w.q01 = _mm512_mask_add_epi8(w.q01, _cvtu64_mask64((uint64_t)_mm_cvtsi128_si64(qh)),
                                         w.q01, bit4);
            w.q23 = _mm512_mask_add_epi8(w.q23,
                                         _cvtu64_mask64((uint64_t)_mm_extract_epi64(qh, 1)),
                                         w.q23, bit4);
        }
        f = _mm256_cvtph_ps(_mm512_castsi512_si128(hw));
    }
    w.d01 = spread2(f, 0);
    w.d23 = spread2(f, 2);
    if (has_m) {
        w.m01 = _mm512_maskz_mov_ps(0x0101, spread2(f, 4));
        w.m23 = _mm512_maskz_mov_ps(0x0101, spread2(f, 6));
    } else {
        w.m01 = w.m23 = _mm512_setzero_ps();
    }
    return w;
}

/* off: the weights' offset c (0: none); q8_1: activations in Q8_1 (with s). */
AINL astep load_a4(const char *p, int off, int q8_1) {
    astep a;
    const int stride = q8_1 ? 36 : 34;
    const int qs = q8_1 ? 4 : 2;
    a.a01 = load2x32(p + qs, p + stride + qs);
    a.a23 = load2x32(p + 2 * stride + qs, p + 3 * stride + qs);
    const __m256 f = _mm256_cvtph_ps(_mm512_castsi512_si128(
        gather_words(load_group(p, stride), q8_1 ? k_fields_q8_1 : k_fields_q8_0)));
    a.d01 = spread2(f, 0);
    a.d23 = spread2(f, 2);
    a.s01 = q8_1 ? spread2(f, 4) : _mm512_setzero_ps();
    a.s23 = q8_1 ? spread2(f, 6) : _mm512_setzero_ps();
    const __m512i z = _mm512_setzero_si512(), c = _mm512_set1_epi8((char)off);
    a.o01 = off ? _mm512_sub_epi32(z, _mm512_dpbusd_epi32(z, c, a.a01)) : z;
    a.o23 = off ? _mm512_sub_epi32(z, _mm512_dpbusd_epi32(z, c, a.a23)) : z;
    return a;
}

/* The last blocks one at a time, in the low 256 bits (the high half is zero everywhere, so it
 * adds exact zeros). */
AINL wstep load_w1(const char *p, int kind, int has_m) {
    wstep w;
    float d, m = 0.0f;
    __m256i q;
    if (kind == 2) {
        const pg_block_q8_0 *x = (const pg_block_q8_0 *)p;
        q = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)x->qs),
                             _mm256_set1_epi8((char)0x80));
        d = h2f(x->d);
    } else {
        const int qs_off = kind == 1 ? (has_m ? 8 : 6) : (has_m ? 4 : 2);
        const __m128i t = _mm_loadu_si128((const __m128i *)(p + qs_off));
        q = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(0x0F));
        if (kind == 1) {
            uint32_t qh;
            memcpy(&qh, p + (has_m ? 4 : 2), 4);
            q = _mm256_mask_add_epi8(q, _cvtu32_mask32(qh), q, _mm256_set1_epi8(0x10));
        }
        uint16_t h;
        memcpy(&h, p, 2);
        d = h2f(h);
        if (has_m) {
            memcpy(&h, p + 2, 2);
            m = h2f(h);
        }
    }
    w.q01 = _mm512_zextsi256_si512(q);
    w.d01 = _mm512_maskz_broadcastss_ps(0x00FF, _mm_set_ss(d));
    w.m01 = _mm512_maskz_broadcastss_ps(0x0001, _mm_set_ss(m));
    w.q23 = _mm512_setzero_si512();
    w.d23 = w.m23 = _mm512_setzero_ps();
    return w;
}

AINL astep load_a1(const char *p, int off, int q8_1) {
    astep a;
    uint16_t h;
    a.a01 = _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)(p + (q8_1 ? 4 : 2))));
    memcpy(&h, p, 2);
    a.d01 = _mm512_maskz_broadcastss_ps(0x00FF, _mm_set_ss(h2f(h)));
    memcpy(&h, p + 2, 2);
    a.s01 = q8_1 ? _mm512_maskz_broadcastss_ps(0x00FF, _mm_set_ss(h2f(h))) : _mm512_setzero_ps();
    const __m512i z = _mm512_setzero_si512();
    a.o01 = off ? _mm512_sub_epi32(z, _mm512_dpbusd_epi32(z, _mm512_set1_epi8((char)off), a.a01))
                : z;
    a.a23 = a.o23 = z;
    a.d23 = a.s23 = _mm512_setzero_ps();
    return a;
}

/* acc += (Σ(q − c)·a)·(d_x·d_y) per lane [+ m_x·s_y in lanes 0 and 8] */
AINL __m512 leg_step(__m512 acc, __m512i q, __m512 dx, __m512 mx, __m512i a, __m512i o,
                     __m512 dy, __m512 sy, int has_m) {
    const __m512i p = _mm512_dpbusd_epi32(o, q, a);
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dx, dy), acc);
    return has_m ? _mm512_fmadd_ps(mx, sy, acc) : acc;
}

AINL void leg_pairs(__m512 acc[PG_GR][PG_GC], const wstep *w, const astep *a, int has_m,
                    int two) {
    PG_UNROLL for (int i = 0; i < PG_GR; i++) {
        PG_UNROLL for (int j = 0; j < PG_GC; j++) {
            acc[i][j] = leg_step(acc[i][j], w[i].q01, w[i].d01, w[i].m01, a[j].a01, a[j].o01,
                                 a[j].d01, a[j].s01, has_m);
            if (two)
                acc[i][j] = leg_step(acc[i][j], w[i].q23, w[i].d23, w[i].m23, a[j].a23,
                                     a[j].o23, a[j].d23, a[j].s23, has_m);
        }
    }
}

/* STRIDE: weight block bytes; KIND: 0/1/2 as load_w4; OFF: offset c of the levels; HAS_M:
 * Q4_1/Q5_1 (activations in Q8_1). */
#define PG_GEMM_LEGACY_512(name, STRIDE, KIND, OFF, HAS_M, FIELDS, QS)                             \
    static void name(int64_t n, float *restrict s, size_t bs, const void *restrict vx,             \
                     size_t bx, const void *restrict vy, size_t by, int nr, int nc) {              \
        const pg_gemm_rows r = pg_gemm_rows_of(vx, bx, vy, by, nr, nc);                            \
        const int ystride = HAS_M ? 36 : 34;                                                       \
        const int64_t nb = n / PG_QK32;                                                            \
        __m512 acc[PG_GR][PG_GC];                                                                  \
        PG_UNROLL for (int i = 0; i < PG_GR; i++)                                                  \
            PG_UNROLL for (int j = 0; j < PG_GC; j++) acc[i][j] = _mm512_setzero_ps();             \
        int64_t b = 0;                                                                             \
        for (; b + 4 <= nb; b += 4) {                                                              \
            astep a[PG_GC];                                                                        \
            wstep w[PG_GR];                                                                        \
            PG_UNROLL for (int j = 0; j < PG_GC; j++)                                              \
                a[j] = load_a4(r.y[j] + b * ystride, OFF, HAS_M);                                  \
            PG_UNROLL for (int i = 0; i < PG_GR; i++)                                              \
                w[i] = load_w4(r.x[i] + b * STRIDE, STRIDE, KIND, HAS_M, FIELDS, QS);              \
            leg_pairs(acc, w, a, HAS_M, 1);                                                        \
        }                                                                                          \
        for (; b < nb; b++) {                                                                      \
            astep a[PG_GC];                                                                        \
            wstep w[PG_GR];                                                                        \
            PG_UNROLL for (int j = 0; j < PG_GC; j++)                                              \
                a[j] = load_a1(r.y[j] + b * ystride, OFF, HAS_M);                                  \
            PG_UNROLL for (int i = 0; i < PG_GR; i++)                                              \
                w[i] = load_w1(r.x[i] + b * STRIDE, KIND, HAS_M);                                  \
            leg_pairs(acc, w, a, HAS_M, 0);                                                        \
        }                                                                                          \
        store_acc(s, bs, acc, nr, nc);                                                             \
    }

PG_GEMM_LEGACY_512(gemm_q4_0_512, 18, 0, 8, 0, k_fields_q4_0, k_qs_q4_0)
PG_GEMM_LEGACY_512(gemm_q5_0_512, 22, 1, 16, 0, k_fields_q5_0, k_qs_q5_0)
PG_GEMM_LEGACY_512(gemm_q8_0_512, 34, 2, 128, 0, k_fields_q8_0, k_qs_q4_0)
PG_GEMM_LEGACY_512(gemm_q4_1_512, 20, 0, 0, 1, k_fields_q4_1, k_qs_q4_1)
PG_GEMM_LEGACY_512(gemm_q5_1_512, 24, 1, 0, 1, k_fields_q5_1, k_qs_q5_1)

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
    static void name(int64_t n, float *restrict s, size_t bs, const void *restrict vx,             \
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
    }

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
