/* Multi-row dot kernels (pg_type_traits.gemm) for AArch64, written once for two instruction sets.
 *
 * Included by gemm_neon.c (plain Advanced SIMD) and gemm_dotprod.c (compiled with +dotprod),
 * each defining first:
 *   GN_FN(name)            the kernel's name with the file's suffix
 *   gn_dot16(acc, q, a)    acc (int32x4) plus the 16 products q[i]·a[i] of signed bytes, spread
 *                          over the lanes (|q·a| <= 128·127: a pair of products fits int16)
 * Every call computes a 4 × 4 block (gemm.h). Per weight row the four activation rows' 4-lane
 * integer sums are folded with pairwise adds into one vector [c0 c1 c2 c3] (exact), converted
 * once and accumulated with the scales [d_x·d_y0 .. d_x·d_y3]: one fp32 accumulator per weight
 * row, lane j = the dot with activation row j.
 *   - legacy formats, per block: each weight block decoded once into signed levels (q − 8,
 *     q − 16, raw Q8_0; Q4_1/Q5_1 unsigned 0..31), each activation block loaded once;
 *   - K-quants, per super-block: each weight row decoded once into 256 signed levels (offsets of
 *     Q3_K/Q6_K applied) and its scales; per pair, one gn_dot16 and one multiply-add per group
 *     of 16 (per 32 for Q4_K/Q5_K); mins through the activation's bsums.
 * fp16 fields are converted in vectors of four by the hardware (exact). Integer sums exact;
 * each dot's block terms are the scalar kernel's fp32 operations, added to its running sum in
 * block order (a lane per dot): every dot has the bits of the vec_dot of its two rows (the
 * scalar reference's), so batching never changes a token's result (tests/test_gemm.c). */
#include <arm_neon.h>
#include <string.h>

#include "gemm.h"
#include "kquants.h"
#include "quants.h"
#include "quants_legacy.h"
#include "quants_legacy_neon.h"

#define GN_UNROLL _Pragma("GCC unroll 16")

/* [f(p0) f(p1) f(p2) f(p3)] of the fp16 values at p0..p3 */
static inline float32x4_t gn_fp16x4(const void *p0, const void *p1, const void *p2,
                                    const void *p3) {
    uint16_t h[4];
    memcpy(&h[0], p0, 2);
    memcpy(&h[1], p1, 2);
    memcpy(&h[2], p2, 2);
    memcpy(&h[3], p3, 2);
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h)));
}

/* [Σp0 Σp1 Σp2 Σp3] */
static inline int32x4_t gn_fold4(int32x4_t p0, int32x4_t p1, int32x4_t p2, int32x4_t p3) {
    return vpaddq_s32(vpaddq_s32(p0, p1), vpaddq_s32(p2, p3));
}

/* acc[i] lane j -> out[j][i] */
static inline void gn_store(float *s, size_t bs, const float32x4_t acc[PG_GR], int nr, int nc) {
    float rows[PG_GR][4], out[PG_GC][PG_GR];
    for (int i = 0; i < PG_GR; i++) vst1q_f32(rows[i], acc[i]);
    for (int j = 0; j < PG_GC; j++)
        for (int i = 0; i < PG_GR; i++) out[j][i] = rows[i][j];
    pg_gemm_store(s, bs, out, nr, nc);
}

/* ---- legacy formats ----------------------------------------------------------------------- */

/* XT: weight block; VALUES: its signed levels (quants_legacy_neon.h); HAS_M: Q4_1/Q5_1 with
 * Q8_1 activations; XY: the block term is isum·(d_x·d_y) (Q8_0), else isum·d_x·d_y or, with
 * HAS_M, (d_x·d_y)·isum + m_x·s_y: the scalar kernels' operations (quants_legacy.c). */
#define GN_GEMM_LEGACY(name, XT, VALUES, HAS_M, XY)                                                  \
    static void GN_FN(name##_4)(int64_t n, float *restrict s, size_t bs, const void *restrict vx,  \
                            size_t bx, const void *restrict vy, size_t by, int nr, int nc) {       \
        const pg_gemm_rows r = pg_gemm_rows_of(vx, bx, vy, by, nr, nc);                            \
        const size_t ys = HAS_M ? sizeof(pg_block_q8_1) : sizeof(pg_block_q8_0);                   \
        const size_t yq = HAS_M ? 4 : 2;                                                           \
        float32x4_t acc[PG_GR];                                                                    \
        GN_UNROLL for (int i = 0; i < PG_GR; i++) acc[i] = vdupq_n_f32(0.0f);                      \
        for (int64_t b = 0; b < n / PG_QK32; b++) {                                                \
            const char *y[4];                                                                      \
            int8x16_t a0[4], a1[4];                                                                \
            GN_UNROLL for (int j = 0; j < 4; j++) {                                                \
                y[j] = r.y[j] + (size_t)b * ys;                                                    \
                a0[j] = vld1q_s8((const int8_t *)(y[j] + yq));                                     \
                a1[j] = vld1q_s8((const int8_t *)(y[j] + yq + 16));                                \
            }                                                                                      \
            const float32x4_t dy = gn_fp16x4(y[0], y[1], y[2], y[3]);                              \
            const XT *x[4];                                                                        \
            GN_UNROLL for (int i = 0; i < 4; i++) x[i] = (const XT *)r.x[i] + b;                   \
            const float32x4_t dx = gn_fp16x4(x[0], x[1], x[2], x[3]);                              \
            float32x4_t sy = vdupq_n_f32(0.0f), mx = sy;                                           \
            if (HAS_M) {                                                                           \
                sy = gn_fp16x4(y[0] + 2, y[1] + 2, y[2] + 2, y[3] + 2);                            \
                mx = gn_fp16x4((const char *)x[0] + 2, (const char *)x[1] + 2,                     \
                               (const char *)x[2] + 2, (const char *)x[3] + 2);                    \
            }                                                                                      \
            GN_UNROLL for (int i = 0; i < 4; i++) {                                                \
                int8x16_t q0, q1;                                                                  \
                VALUES(x[i], &q0, &q1);                                                            \
                int32x4_t p[4];                                                                    \
                GN_UNROLL for (int j = 0; j < 4; j++)                                              \
                    p[j] = gn_dot16(gn_dot16(vdupq_n_s32(0), q0, a0[j]), q1, a1[j]);               \
                const float32x4_t f = vcvtq_f32_s32(gn_fold4(p[0], p[1], p[2], p[3]));             \
                float32x4_t t;                                                                     \
                if (HAS_M)                                                                         \
                    t = vaddq_f32(vmulq_f32(vmulq_laneq_f32(dy, dx, i), f),                        \
                                  vmulq_laneq_f32(sy, mx, i));                                     \
                else if (XY)                                                                       \
                    t = vmulq_f32(f, vmulq_laneq_f32(dy, dx, i));                                  \
                else                                                                               \
                    t = vmulq_f32(vmulq_laneq_f32(f, dx, i), dy);                                  \
                acc[i] = vaddq_f32(acc[i], t);                                                     \
            }                                                                                      \
        }                                                                                          \
        gn_store(s, bs, acc, nr, nc);                                                              \
    }                                                                                              \
    PG_GEMM_BY4(GN_FN(name), GN_FN(name##_4))

GN_GEMM_LEGACY(gemm_q4_0, pg_block_q4_0, q4_0_values, 0, 0)
GN_GEMM_LEGACY(gemm_q5_0, pg_block_q5_0, q5_0_values, 0, 0)
GN_GEMM_LEGACY(gemm_q8_0, pg_block_q8_0, q8_0_values, 0, 1)
GN_GEMM_LEGACY(gemm_q4_1, pg_block_q4_1, q4_1_values, 1, 0)
GN_GEMM_LEGACY(gemm_q5_1, pg_block_q5_1, q5_1_values, 1, 0)

/* ---- K-quants × Q8_K ------------------------------------------------------------------------- */

/* One decoded weight super-block: signed levels in element order, a scale per group of 16
 * (int32 for vmlaq_n), the int16 weights of the 16 bsums (mins; zero without), d and dmin. */
typedef struct {
    int8_t q[PG_QK_K];
    int32_t sc[16];
    int16_t mn[16];
    float d, dmin;
} gn_krow;

static inline void gn_decode_q2_K(const pg_block_q2_K *x, gn_krow *k) {
    const uint8x16_t m3 = vdupq_n_u8(3);
    for (int h = 0; h < 2; h++) {
        const uint8x16_t q0 = vld1q_u8(x->qs + 32 * h), q1 = vld1q_u8(x->qs + 32 * h + 16);
        GN_UNROLL for (int j = 0; j < 4; j++) {   /* elements 128h + 32j + l: bits 2j */
            const int sh = 2 * j;
            int8_t *dst = k->q + 128 * h + 32 * j;
            vst1q_s8(dst, vreinterpretq_s8_u8(vandq_u8(vshlq_u8(q0, vdupq_n_s8((int8_t)-sh)), m3)));
            vst1q_s8(dst + 16,
                     vreinterpretq_s8_u8(vandq_u8(vshlq_u8(q1, vdupq_n_s8((int8_t)-sh)), m3)));
        }
    }
    for (int g = 0; g < 16; g++) {
        k->sc[g] = x->scales[g] & 0xF;
        k->mn[g] = (int16_t)(x->scales[g] >> 4);
    }
    k->d = pg_fp16_to_fp32(x->d);
    k->dmin = pg_fp16_to_fp32(x->dmin);
}

static inline void gn_decode_q3_K(const pg_block_q3_K *x, gn_krow *k) {
    const uint8x16_t m3 = vdupq_n_u8(3), m4 = vdupq_n_u8(4);
    const uint8x16_t hm0 = vld1q_u8(x->hmask), hm1 = vld1q_u8(x->hmask + 16);
    for (int h = 0; h < 2; h++) {
        const uint8x16_t q0 = vld1q_u8(x->qs + 32 * h), q1 = vld1q_u8(x->qs + 32 * h + 16);
        GN_UNROLL for (int j = 0; j < 4; j++) {
            /* q = q2 + 4·hbit − 4, hbit = bit 4h + j of hmask[l] */
            const int8x16_t sh = vdupq_n_s8((int8_t)(-2 * j));
            const uint8x16_t b = vdupq_n_u8((uint8_t)(1 << (4 * h + j)));
            int8_t *dst = k->q + 128 * h + 32 * j;
            const uint8x16_t u0 = vorrq_u8(vandq_u8(vshlq_u8(q0, sh), m3),
                                           vandq_u8(vtstq_u8(hm0, b), m4));
            const uint8x16_t u1 = vorrq_u8(vandq_u8(vshlq_u8(q1, sh), m3),
                                           vandq_u8(vtstq_u8(hm1, b), m4));
            vst1q_s8(dst, vsubq_s8(vreinterpretq_s8_u8(u0), vdupq_n_s8(4)));
            vst1q_s8(dst + 16, vsubq_s8(vreinterpretq_s8_u8(u1), vdupq_n_s8(4)));
        }
    }
    int8_t sc[16];
    pg_k3_unpack_scales(x->scales, sc);
    for (int g = 0; g < 16; g++) {
        k->sc[g] = sc[g];
        k->mn[g] = 0;
    }
    k->d = pg_fp16_to_fp32(x->d);
    k->dmin = 0.0f;
}

/* Q4_K / Q5_K: chunk c of 32 qs bytes: low nibbles = elements 64c + l, high = 64c + 32 + l;
 * the 5th bit of Q5_K: bit 2c (low) / 2c + 1 (high) of qh[l]. */
static inline void gn_decode_k4(const uint8_t *qs, const uint8_t *scales, uint16_t d,
                                uint16_t dmin, const uint8_t *qh, gn_krow *k) {
    const uint8x16_t m4 = vdupq_n_u8(0xF), b5 = vdupq_n_u8(0x10);
    const uint8x16_t h0 = qh ? vld1q_u8(qh) : vdupq_n_u8(0), h1 = qh ? vld1q_u8(qh + 16) : h0;
    GN_UNROLL for (int c = 0; c < 4; c++) {
        GN_UNROLL for (int v = 0; v < 2; v++) {
            const uint8x16_t b = vld1q_u8(qs + 32 * c + 16 * v), hv = v ? h1 : h0;
            uint8x16_t lo = vandq_u8(b, m4), hi = vshrq_n_u8(b, 4);
            if (qh) {
                lo = vorrq_u8(lo, vandq_u8(vtstq_u8(hv, vdupq_n_u8((uint8_t)(1 << (2 * c)))), b5));
                hi = vorrq_u8(hi, vandq_u8(vtstq_u8(hv, vdupq_n_u8((uint8_t)(2 << (2 * c)))), b5));
            }
            vst1q_s8(k->q + 64 * c + 16 * v, vreinterpretq_s8_u8(lo));
            vst1q_s8(k->q + 64 * c + 32 + 16 * v, vreinterpretq_s8_u8(hi));
        }
    }
    uint8_t sm[16];
    pg_k4_unpack_scales(scales, sm);
    for (int j = 0; j < 8; j++) {
        k->sc[2 * j] = k->sc[2 * j + 1] = sm[j];
        k->mn[2 * j] = k->mn[2 * j + 1] = sm[8 + j];
    }
    k->d = pg_fp16_to_fp32(d);
    k->dmin = pg_fp16_to_fp32(dmin);
}

static inline void gn_decode_q4_K(const pg_block_q4_K *x, gn_krow *k) {
    gn_decode_k4(x->qs, x->scales, x->d, x->dmin, NULL, k);
}

static inline void gn_decode_q5_K(const pg_block_q5_K *x, gn_krow *k) {
    gn_decode_k4(x->qs, x->scales, x->d, x->dmin, x->qh, k);
}

static inline void gn_decode_q6_K(const pg_block_q6_K *x, gn_krow *k) {
    const uint8x16_t m4 = vdupq_n_u8(0xF), m30 = vdupq_n_u8(0x30);
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = x->ql + 64 * h, *qh = x->qh + 32 * h;
        int8_t *dst = k->q + 128 * h;
        GN_UNROLL for (int v = 0; v < 2; v++) {
            const uint8x16_t l0 = vld1q_u8(ql + 16 * v), l1 = vld1q_u8(ql + 32 + 16 * v);
            const uint8x16_t hb = vld1q_u8(qh + 16 * v);
            const uint8x16_t u[4] = {
                vorrq_u8(vandq_u8(l0, m4), vandq_u8(vshlq_n_u8(hb, 4), m30)),
                vorrq_u8(vandq_u8(l1, m4), vandq_u8(vshlq_n_u8(hb, 2), m30)),
                vorrq_u8(vshrq_n_u8(l0, 4), vandq_u8(hb, m30)),
                vorrq_u8(vshrq_n_u8(l1, 4), vandq_u8(vshrq_n_u8(hb, 2), m30)),
            };
            GN_UNROLL for (int g = 0; g < 4; g++)
                vst1q_s8(dst + 32 * g + 16 * v,
                         vsubq_s8(vreinterpretq_s8_u8(u[g]), vdupq_n_s8(32)));
        }
    }
    for (int g = 0; g < 16; g++) {
        k->sc[g] = x->scales[g];
        k->mn[g] = 0;
    }
    k->d = pg_fp16_to_fp32(x->d);
    k->dmin = 0.0f;
}

/* Σ_g mn[g]·bsums[g] spread over 4 int32 lanes */
static inline int32x4_t gn_mins(const int16_t *mn, const int16_t *bsums) {
    const int16x8_t m0 = vld1q_s16(mn), m1 = vld1q_s16(mn + 8);
    const int16x8_t b0 = vld1q_s16(bsums), b1 = vld1q_s16(bsums + 8);
    int32x4_t s = vmull_s16(vget_low_s16(b0), vget_low_s16(m0));
    s = vmlal_high_s16(s, b0, m0);
    s = vmlal_s16(s, vget_low_s16(b1), vget_low_s16(m1));
    return vmlal_high_s16(s, b1, m1);
}

/* G32: the scale is shared by groups 2k and 2k + 1 (Q4_K, Q5_K); MINS: the format has mins. */
#define GN_GEMM_KQUANT(name, XT, DECODE, G32, MINS)                                                \
    static void GN_FN(name##_4)(int64_t n, float *restrict s, size_t bs, const void *restrict vx,  \
                            size_t bx, const void *restrict vy, size_t by, int nr, int nc) {       \
        const pg_gemm_rows r = pg_gemm_rows_of(vx, bx, vy, by, nr, nc);                            \
        float32x4_t acc[PG_GR];                                                                    \
        GN_UNROLL for (int i = 0; i < PG_GR; i++) acc[i] = vdupq_n_f32(0.0f);                      \
        gn_krow k;                                                                                 \
        for (int64_t b = 0; b < n / PG_QK_K; b++) {                                                \
            const pg_block_q8_K *y[4];                                                             \
            GN_UNROLL for (int j = 0; j < 4; j++) y[j] = (const pg_block_q8_K *)r.y[j] + b;        \
            const float dyv[4] = {y[0]->d, y[1]->d, y[2]->d, y[3]->d};                             \
            const float32x4_t dy = vld1q_f32(dyv);                                                 \
            GN_UNROLL for (int i = 0; i < 4; i++) {                                                \
                DECODE((const XT *)r.x[i] + b, &k);                                                \
                int32x4_t p[4];                                                                    \
                GN_UNROLL for (int j = 0; j < 4; j++) p[j] = vdupq_n_s32(0);                       \
                for (int g = 0; g < 16; g += G32 ? 2 : 1) {                                        \
                    const int8x16_t q0 = vld1q_s8(k.q + 16 * g);                                   \
                    const int8x16_t q1 = G32 ? vld1q_s8(k.q + 16 * g + 16) : q0;                   \
                    GN_UNROLL for (int j = 0; j < 4; j++) {                                        \
                        int32x4_t t = gn_dot16(vdupq_n_s32(0), q0, vld1q_s8(y[j]->qs + 16 * g));   \
                        if (G32) t = gn_dot16(t, q1, vld1q_s8(y[j]->qs + 16 * g + 16));            \
                        p[j] = vmlaq_n_s32(p[j], t, k.sc[g]);                                      \
                    }                                                                              \
                }                                                                                  \
                const float32x4_t f = vcvtq_f32_s32(gn_fold4(p[0], p[1], p[2], p[3]));             \
                float32x4_t t = vmulq_f32(vmulq_n_f32(dy, k.d), f);                                \
                if (MINS) {                                                                        \
                    const int32x4_t m = gn_fold4(gn_mins(k.mn, y[0]->bsums),                       \
                                                 gn_mins(k.mn, y[1]->bsums),                       \
                                                 gn_mins(k.mn, y[2]->bsums),                       \
                                                 gn_mins(k.mn, y[3]->bsums));                      \
                    t = vsubq_f32(t, vmulq_f32(vmulq_n_f32(dy, k.dmin), vcvtq_f32_s32(m)));        \
                }                                                                                  \
                acc[i] = vaddq_f32(acc[i], t);                                                     \
            }                                                                                      \
        }                                                                                          \
        gn_store(s, bs, acc, nr, nc);                                                              \
    }                                                                                              \
    PG_GEMM_BY4(GN_FN(name), GN_FN(name##_4))

GN_GEMM_KQUANT(gemm_q2_K, pg_block_q2_K, gn_decode_q2_K, 0, 1)
GN_GEMM_KQUANT(gemm_q3_K, pg_block_q3_K, gn_decode_q3_K, 0, 0)
GN_GEMM_KQUANT(gemm_q4_K, pg_block_q4_K, gn_decode_q4_K, 1, 1)
GN_GEMM_KQUANT(gemm_q5_K, pg_block_q5_K, gn_decode_q5_K, 1, 1)
GN_GEMM_KQUANT(gemm_q6_K, pg_block_q6_K, gn_decode_q6_K, 0, 0)

/* Installs this file's kernels. */
static void GN_FN(fill)(pg_type_traits *tbl) {
    tbl[PG_TYPE_Q4_0].gemm = GN_FN(gemm_q4_0);
    tbl[PG_TYPE_Q4_1].gemm = GN_FN(gemm_q4_1);
    tbl[PG_TYPE_Q5_0].gemm = GN_FN(gemm_q5_0);
    tbl[PG_TYPE_Q5_1].gemm = GN_FN(gemm_q5_1);
    tbl[PG_TYPE_Q8_0].gemm = GN_FN(gemm_q8_0);
    tbl[PG_TYPE_Q2_K].gemm = GN_FN(gemm_q2_K);
    tbl[PG_TYPE_Q3_K].gemm = GN_FN(gemm_q3_K);
    tbl[PG_TYPE_Q4_K].gemm = GN_FN(gemm_q4_K);
    tbl[PG_TYPE_Q5_K].gemm = GN_FN(gemm_q5_K);
    tbl[PG_TYPE_Q6_K].gemm = GN_FN(gemm_q6_K);
}
