/* The codebook i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) and the ternary
 * TQ1_0 / TQ2_0 · Q8_K on AArch64, written once for two instruction sets. Included by
 * quants_iq_tq_neon.c (plain Advanced SIMD) and quants_iq_tq_dotprod.c (+dotprod), each
 * defining first:
 *   IQN_FN(name)        the kernel's name with the file's suffix
 *   iqn_dot16(q, a)     int32x4 whose lanes add up to Σ q[i]·a[i] over 16 int8 pairs
 *
 * Bits of the scalar kernels (quants_iq_grid.c, quants_tq.c): each 32-element group decodes to
 * 32 signed int8 levels (codebook bytes with their signs; IQ1_*: 8·level ± 1, which fits int8
 * and makes the scalar (2s+1)·(8·Σ level·a ± Σ a) one dot), each 16 elements' lanes are scaled
 * by their 2s+1 (every type's scales and IQ1 delta signs are per 16 or coarser; IQ1_M's delta
 * sign per 8 is in the levels), and each super-block's exact int32 total T goes
 * into the scalar kernel's fp32 term (d·d_y)·T, added in block order, times the type's power
 * of two at the end. The 8-row kernel (vec_dot8) decodes a weight block once for up to four
 * activation rows; every one of its results is computed by the same fp32 operations as
 * vec_dot's (lanes of a float32x4 are independent, -ffp-contract=off). */
#include <arm_neon.h>
#include <string.h>

#include "fp16.h"
#include "iq_blocks.h"
#include "iq_grids.h"
#include "kquants.h"
#include "quants.h"

#define IQN_MAX_C 4

/* 0xFF in byte 8g + j where bit j of sign byte g (of s4's 4 bytes) is set: bytes 0..15 in *m0,
 * 16..31 in *m1 */
static inline void iqn_sign_masks(uint32_t s4, uint8x16_t *m0, uint8x16_t *m1) {
    static const uint8_t pick[32] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                     2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3};
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t v = vreinterpretq_u8_u32(vdupq_n_u32(s4)), b = vld1q_u8(bit);
    *m0 = vtstq_u8(vqtbl1q_u8(v, vld1q_u8(pick)), b);
    *m1 = vtstq_u8(vqtbl1q_u8(v, vld1q_u8(pick + 16)), b);
}

/* g where the mask is clear, −g where it is set (g <= 62: exact) */
static inline int8x16_t iqn_apply_signs(uint8x16_t g, uint8x16_t m) {
    return vreinterpretq_s8_u8(vsubq_u8(veorq_u8(g, m), m));
}

static inline uint8x16_t iqn_grid2(uint64_t a, uint64_t b) {
    return vcombine_u8(vcreate_u8(a), vcreate_u8(b));
}

static inline uint8x16_t iqn_grid4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
    const uint32_t t[4] = {a, b, c, d};
    return vreinterpretq_u8_u32(vld1q_u32(t));
}

/* the 7-bit sign fields at bits 0, 7, 14, 21 of aux as four ksigns_iq2xs bytes */
static inline uint32_t iqn_ksigns4(uint32_t aux) {
    return (uint32_t)pg_ksigns_iq2xs[aux & 127] | (uint32_t)pg_ksigns_iq2xs[(aux >> 7) & 127] << 8 |
           (uint32_t)pg_ksigns_iq2xs[(aux >> 14) & 127] << 16 |
           (uint32_t)pg_ksigns_iq2xs[(aux >> 21) & 127] << 24;
}

/* ---- one 32-element group ib of a super-block: levels q0 (elements 0..15), q1 (16..31) and
 * their multipliers 2s+1 in every lane of s0, s1 ---------------------------------------------- */

static inline __attribute__((always_inline)) void sub_iq2_xxs(const pg_block_iq2_xxs *x, int ib,
        int8x16_t *q0, int8x16_t *q1, int32x4_t *s0, int32x4_t *s1) {
    uint32_t aux[2];
    memcpy(aux, x->qs + 4 * ib, 8);
    uint8x16_t m0, m1;
    iqn_sign_masks(iqn_ksigns4(aux[1]), &m0, &m1);
    *q0 = iqn_apply_signs(iqn_grid2(pg_iq2xxs_grid[aux[0] & 0xff], pg_iq2xxs_grid[(aux[0] >> 8) & 0xff]), m0);
    *q1 = iqn_apply_signs(iqn_grid2(pg_iq2xxs_grid[(aux[0] >> 16) & 0xff], pg_iq2xxs_grid[aux[0] >> 24]), m1);
    *s0 = *s1 = vdupq_n_s32(2 * (int)(aux[1] >> 28) + 1);
}

static inline __attribute__((always_inline)) void sub_iq2_xs(const pg_block_iq2_xs *x, int ib,
        int8x16_t *q0, int8x16_t *q1, int32x4_t *s0, int32x4_t *s1) {
    const uint16_t *v = x->qs + 4 * ib;
    const uint32_t s4 = (uint32_t)pg_ksigns_iq2xs[v[0] >> 9] | (uint32_t)pg_ksigns_iq2xs[v[1] >> 9] << 8 |
                        (uint32_t)pg_ksigns_iq2xs[v[2] >> 9] << 16 | (uint32_t)pg_ksigns_iq2xs[v[3] >> 9] << 24;
    uint8x16_t m0, m1;
    iqn_sign_masks(s4, &m0, &m1);
    *q0 = iqn_apply_signs(iqn_grid2(pg_iq2xs_grid[v[0] & 511], pg_iq2xs_grid[v[1] & 511]), m0);
    *q1 = iqn_apply_signs(iqn_grid2(pg_iq2xs_grid[v[2] & 511], pg_iq2xs_grid[v[3] & 511]), m1);
    *s0 = vdupq_n_s32(2 * (x->scales[ib] & 0xf) + 1);
    *s1 = vdupq_n_s32(2 * (x->scales[ib] >> 4) + 1);
}

static inline __attribute__((always_inline)) void sub_iq2_s(const pg_block_iq2_s *x, int ib,
        int8x16_t *q0, int8x16_t *q1, int32x4_t *s0, int32x4_t *s1) {
    const uint8_t *qs = x->qs + 4 * ib;
    const int qh = x->qh[ib];
    uint32_t s4;
    memcpy(&s4, x->qs + 32 + 4 * ib, 4);
    uint8x16_t m0, m1;
    iqn_sign_masks(s4, &m0, &m1);
    *q0 = iqn_apply_signs(iqn_grid2(pg_iq2s_grid[qs[0] | ((qh << 8) & 0x300)],
                                    pg_iq2s_grid[qs[1] | ((qh << 6) & 0x300)]), m0);
    *q1 = iqn_apply_signs(iqn_grid2(pg_iq2s_grid[qs[2] | ((qh << 4) & 0x300)],
                                    pg_iq2s_grid[qs[3] | ((qh << 2) & 0x300)]), m1);
    *s0 = vdupq_n_s32(2 * (x->scales[ib] & 0xf) + 1);
    *s1 = vdupq_n_s32(2 * (x->scales[ib] >> 4) + 1);
}

static inline __attribute__((always_inline)) void sub_iq3_xxs(const pg_block_iq3_xxs *x, int ib,
        int8x16_t *q0, int8x16_t *q1, int32x4_t *s0, int32x4_t *s1) {
    uint32_t aux;
    memcpy(&aux, x->qs + 64 + 4 * ib, 4);
    const uint8_t *q = x->qs + 8 * ib;
    uint8x16_t m0, m1;
    iqn_sign_masks(iqn_ksigns4(aux), &m0, &m1);
    *q0 = iqn_apply_signs(iqn_grid4(pg_iq3xxs_grid[q[0]], pg_iq3xxs_grid[q[1]], pg_iq3xxs_grid[q[2]],
                                    pg_iq3xxs_grid[q[3]]), m0);
    *q1 = iqn_apply_signs(iqn_grid4(pg_iq3xxs_grid[q[4]], pg_iq3xxs_grid[q[5]], pg_iq3xxs_grid[q[6]],
                                    pg_iq3xxs_grid[q[7]]), m1);
    *s0 = *s1 = vdupq_n_s32(2 * (int)(aux >> 28) + 1);
}

static inline __attribute__((always_inline)) void sub_iq3_s(const pg_block_iq3_s *x, int ib,
        int8x16_t *q0, int8x16_t *q1, int32x4_t *s0, int32x4_t *s1) {
    /* index k = qs[k] | bit k of qh at bit 8 */
    const uint8_t *q = x->qs + 8 * ib;
    const uint32_t h = x->qh[ib];
    uint32_t s4;
    memcpy(&s4, x->signs + 4 * ib, 4);
    uint8x16_t m0, m1;
    iqn_sign_masks(s4, &m0, &m1);
    *q0 = iqn_apply_signs(iqn_grid4(pg_iq3s_grid[q[0] | ((h << 8) & 256)], pg_iq3s_grid[q[1] | ((h << 7) & 256)],
                                    pg_iq3s_grid[q[2] | ((h << 6) & 256)], pg_iq3s_grid[q[3] | ((h << 5) & 256)]), m0);
    *q1 = iqn_apply_signs(iqn_grid4(pg_iq3s_grid[q[4] | ((h << 4) & 256)], pg_iq3s_grid[q[5] | ((h << 3) & 256)],
                                    pg_iq3s_grid[q[6] | ((h << 2) & 256)], pg_iq3s_grid[q[7] | ((h << 1) & 256)]), m1);
    const int sb = ib % 2 ? x->scales[ib / 2] >> 4 : x->scales[ib / 2] & 0xf;
    *s0 = *s1 = vdupq_n_s32(2 * sb + 1);
}

/* IQ1: 8·level + dsign per element (level −1, 0, 1; dsign ±1 per group of 8 in d) */
static inline int8x16_t iqn_iq1_levels(uint64_t ga, uint64_t gb, int8x16_t d) {
    return vaddq_s8(vshlq_n_s8(vreinterpretq_s8_u8(iqn_grid2(ga, gb)), 3), d);
}

static inline __attribute__((always_inline)) void sub_iq1_s(const pg_block_iq1_s *x, int ib,
        int8x16_t *q0, int8x16_t *q1, int32x4_t *s0, int32x4_t *s1) {
    const int qh = x->qh[ib];
    const uint8_t *qs = x->qs + 4 * ib;
    const int8x16_t d = vdupq_n_s8(qh & 0x8000 ? -1 : 1);
    *q0 = iqn_iq1_levels(pg_iq1s_grid[qs[0] | ((qh & 7) << 8)],
                         pg_iq1s_grid[qs[1] | (((qh >> 3) & 7) << 8)], d);
    *q1 = iqn_iq1_levels(pg_iq1s_grid[qs[2] | (((qh >> 6) & 7) << 8)],
                         pg_iq1s_grid[qs[3] | (((qh >> 9) & 7) << 8)], d);
    *s0 = *s1 = vdupq_n_s32(2 * ((qh >> 12) & 7) + 1);
}

static inline __attribute__((always_inline)) void sub_iq1_m(const pg_block_iq1_m *x, int ib,
        int8x16_t *q0, int8x16_t *q1, int32x4_t *s0, int32x4_t *s1) {
    uint16_t sc[4];
    memcpy(sc, x->scales, 8);
    const uint8_t *qs = x->qs + 4 * ib, *qh = x->qh + 2 * ib;
    const int8x16_t d0 = vcombine_s8(vdup_n_s8(qh[0] & 0x08 ? -1 : 1), vdup_n_s8(qh[0] & 0x80 ? -1 : 1));
    const int8x16_t d1 = vcombine_s8(vdup_n_s8(qh[1] & 0x08 ? -1 : 1), vdup_n_s8(qh[1] & 0x80 ? -1 : 1));
    *q0 = iqn_iq1_levels(pg_iq1s_grid[qs[0] | ((qh[0] << 8) & 0x700)],
                         pg_iq1s_grid[qs[1] | ((qh[0] << 4) & 0x700)], d0);
    *q1 = iqn_iq1_levels(pg_iq1s_grid[qs[2] | ((qh[1] << 8) & 0x700)],
                         pg_iq1s_grid[qs[3] | ((qh[1] << 4) & 0x700)], d1);
    const int sh = 6 * (ib % 2);
    *s0 = vdupq_n_s32(2 * ((sc[ib / 2] >> sh) & 7) + 1);
    *s1 = vdupq_n_s32(2 * ((sc[ib / 2] >> (sh + 3)) & 7) + 1);
}

/* ROW(x, y, C, isum): isum[j] = the scalar kernel's exact block total T of weight block x with
 * activation block y[j], j < C */
#define IQN_GRID_ROW(name, BT, SUB)                                                             \
    static inline __attribute__((always_inline)) void name(const BT *x,                        \
            const pg_block_q8_K *const *y, const int C, int32_t *isum) {                        \
        int32x4_t t[IQN_MAX_C];                                                                 \
        for (int j = 0; j < C; j++) t[j] = vdupq_n_s32(0);                                      \
        for (int ib = 0; ib < 8; ib++) {                                                        \
            int8x16_t q0, q1;                                                                   \
            int32x4_t s0, s1;                                                                   \
            SUB(x, ib, &q0, &q1, &s0, &s1);                                                     \
            for (int j = 0; j < C; j++) {                                                       \
                const int8_t *a = y[j]->qs + 32 * ib;                                           \
                t[j] = vmlaq_s32(t[j], iqn_dot16(q0, vld1q_s8(a)), s0);                         \
                t[j] = vmlaq_s32(t[j], iqn_dot16(q1, vld1q_s8(a + 16)), s1);                    \
            }                                                                                   \
        }                                                                                       \
        for (int j = 0; j < C; j++) isum[j] = vaddvq_s32(t[j]);                                 \
    }

IQN_GRID_ROW(row_iq2_xxs, pg_block_iq2_xxs, sub_iq2_xxs)
IQN_GRID_ROW(row_iq2_xs, pg_block_iq2_xs, sub_iq2_xs)
IQN_GRID_ROW(row_iq2_s, pg_block_iq2_s, sub_iq2_s)
IQN_GRID_ROW(row_iq3_xxs, pg_block_iq3_xxs, sub_iq3_xxs)
IQN_GRID_ROW(row_iq3_s, pg_block_iq3_s, sub_iq3_s)
IQN_GRID_ROW(row_iq1_s, pg_block_iq1_s, sub_iq1_s)
IQN_GRID_ROW(row_iq1_m, pg_block_iq1_m, sub_iq1_m)

/* ---- TQ1_0, TQ2_0 (layouts: quants_tq.c) ------------------------------------------------------ */

typedef struct { uint8_t qs[48]; uint8_t qh[4]; pg_fp16 d; } iqn_block_tq1_0;
typedef struct { uint8_t qs[64]; pg_fp16 d; } iqn_block_tq2_0;
_Static_assert(sizeof(iqn_block_tq1_0) == 54, "TQ1_0 block must be 54 bytes");
_Static_assert(sizeof(iqn_block_tq2_0) == 66, "TQ2_0 block must be 66 bytes");

/* b·3 mod 256 per byte: the next trit moves to the top */
static inline uint8x16_t iqn_times3(uint8x16_t b) { return vaddq_u8(b, vaddq_u8(b, b)); }

/* level (trit − 1) of each byte q: the trit is (q·3) >> 8 = [q >= 86] + [q >= 171] */
static inline int8x16_t iqn_trit_level(uint8x16_t q) {
    const uint8x16_t m1 = vcgeq_u8(q, vdupq_n_u8(86)), m2 = vcgeq_u8(q, vdupq_n_u8(171));
    return vreinterpretq_s8_u8(vsubq_u8(vsubq_u8(vdupq_n_u8(0xff), m1), m2));
}

/* element 32n + m is trit n of qs[m] (m < 32), 160 + 16n + m of qs[32 + m] (m < 16),
 * 240 + 4n + j of qh[j] */
static inline __attribute__((always_inline)) void row_tq1_0(const iqn_block_tq1_0 *x,
        const pg_block_q8_K *const *y, const int C, int32_t *isum) {
    int32x4_t t[IQN_MAX_C];
    for (int j = 0; j < C; j++) t[j] = vdupq_n_s32(0);
    uint8x16_t b0 = vld1q_u8(x->qs), b1 = vld1q_u8(x->qs + 16), c = vld1q_u8(x->qs + 32);
    uint32_t h4;
    memcpy(&h4, x->qh, 4);
    static const uint8_t pw[16] = {1, 1, 1, 1, 3, 3, 3, 3, 9, 9, 9, 9, 27, 27, 27, 27};
    const uint8x16_t h = vmulq_u8(vreinterpretq_u8_u32(vdupq_n_u32(h4)), vld1q_u8(pw));
    for (int n = 0; n < 5; n++) {
        const int8x16_t l0 = iqn_trit_level(b0), l1 = iqn_trit_level(b1), l2 = iqn_trit_level(c);
        for (int j = 0; j < C; j++) {
            const int8_t *a = y[j]->qs;
            t[j] = vaddq_s32(t[j], iqn_dot16(l0, vld1q_s8(a + 32 * n)));
            t[j] = vaddq_s32(t[j], iqn_dot16(l1, vld1q_s8(a + 32 * n + 16)));
            t[j] = vaddq_s32(t[j], iqn_dot16(l2, vld1q_s8(a + 160 + 16 * n)));
        }
        b0 = iqn_times3(b0);
        b1 = iqn_times3(b1);
        c = iqn_times3(c);
    }
    const int8x16_t lh = iqn_trit_level(h);
    for (int j = 0; j < C; j++) {
        t[j] = vaddq_s32(t[j], iqn_dot16(lh, vld1q_s8(y[j]->qs + 240)));
        isum[j] = vaddvq_s32(t[j]);
    }
}

/* element 128h + 32l + m is bits 2l of qs[32h + m], level q − 1 */
static inline __attribute__((always_inline)) void row_tq2_0(const iqn_block_tq2_0 *x,
        const pg_block_q8_K *const *y, const int C, int32_t *isum) {
    int32x4_t t[IQN_MAX_C];
    for (int j = 0; j < C; j++) t[j] = vdupq_n_s32(0);
    const uint8x16_t m3 = vdupq_n_u8(3), one = vdupq_n_u8(1);
    for (int hh = 0; hh < 2; hh++) {
        const uint8x16_t b0 = vld1q_u8(x->qs + 32 * hh), b1 = vld1q_u8(x->qs + 32 * hh + 16);
        for (int l = 0; l < 4; l++) {
            const int8x16_t sh = vdupq_n_s8((int8_t)(-2 * l));
            const int8x16_t l0 = vreinterpretq_s8_u8(vsubq_u8(vandq_u8(vshlq_u8(b0, sh), m3), one));
            const int8x16_t l1 = vreinterpretq_s8_u8(vsubq_u8(vandq_u8(vshlq_u8(b1, sh), m3), one));
            for (int j = 0; j < C; j++) {
                const int8_t *a = y[j]->qs + 128 * hh + 32 * l;
                t[j] = vaddq_s32(t[j], iqn_dot16(l0, vld1q_s8(a)));
                t[j] = vaddq_s32(t[j], iqn_dot16(l1, vld1q_s8(a + 16)));
            }
        }
    }
    for (int j = 0; j < C; j++) isum[j] = vaddvq_s32(t[j]);
}

/* ---- the kernels: vec_dot, vec_dot8 (8 weight rows), gemm ------------------------------------- */

static inline float iqn_d_fp16(const void *x) {   /* a d at byte 0 */
    pg_fp16 h;
    memcpy(&h, x, 2);
    return pg_fp16_to_fp32(h);
}
static inline float iqn_d_iq1_m(const void *vx) {   /* the top nibbles of the four scale words */
    const pg_block_iq1_m *x = vx;
    uint16_t sc[4];
    memcpy(sc, x->scales, 8);
    return pg_fp16_to_fp32((pg_fp16)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) |
                                     ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000)));
}
static inline float iqn_d_tq1_0(const void *x) { return pg_fp16_to_fp32(((const iqn_block_tq1_0 *)x)->d); }
static inline float iqn_d_tq2_0(const void *x) { return pg_fp16_to_fp32(((const iqn_block_tq2_0 *)x)->d); }

/* name: vec_dot_<name>_q8_K, vec_dot8_…, gemm_…; D(block) its d; FINAL the type's power of two */
#define IQN_KERNELS(name, BT, ROW, D, FINAL)                                                    \
    static void IQN_FN(vec_dot_##name##_q8_K)(int64_t n, float *restrict s,                    \
                                              const void *restrict vx, const void *restrict vy) { \
        const BT *x = vx;                                                                       \
        const pg_block_q8_K *y = vy;                                                            \
        float sum = 0;                                                                          \
        for (int64_t i = 0; i < n / PG_QK_K; i++) {                                             \
            const pg_block_q8_K *yi = &y[i];                                                    \
            int32_t is;                                                                         \
            ROW(&x[i], &yi, 1, &is);                                                            \
            sum += (D(&x[i]) * y[i].d) * (float)is;                                             \
        }                                                                                       \
        *s = (FINAL) * sum;                                                                     \
    }                                                                                           \
    static inline __attribute__((always_inline)) void IQN_FN(name##_rows8_c)(                   \
        int64_t n, float *s, size_t bs, const char *x, size_t bx, const char *vy, size_t by,    \
        const int C) {                                                                          \
        float32x4_t acc[IQN_MAX_C][2];                                                          \
        for (int j = 0; j < C; j++) acc[j][0] = acc[j][1] = vdupq_n_f32(0);                     \
        for (int64_t b = 0; b < n / PG_QK_K; b++) {                                             \
            const pg_block_q8_K *yb[IQN_MAX_C];                                                 \
            for (int j = 0; j < C; j++)                                                         \
                yb[j] = (const pg_block_q8_K *)(vy + (size_t)j * by) + b;                       \
            int32_t is[IQN_MAX_C][8];                                                           \
            float dx[8];                                                                        \
            for (int r = 0; r < 8; r++) {                                                       \
                const BT *xb = (const BT *)(x + (size_t)r * bx) + b;                            \
                int32_t ri[IQN_MAX_C];                                                          \
                ROW(xb, yb, C, ri);                                                             \
                for (int j = 0; j < C; j++) is[j][r] = ri[j];                                   \
                dx[r] = D(xb);                                                                  \
            }                                                                                   \
            const float32x4_t dx0 = vld1q_f32(dx), dx1 = vld1q_f32(dx + 4);                     \
            for (int j = 0; j < C; j++) {                                                       \
                const float32x4_t dy = vdupq_n_f32(yb[j]->d);                                   \
                acc[j][0] = vaddq_f32(acc[j][0], vmulq_f32(vmulq_f32(dx0, dy),                  \
                                                          vcvtq_f32_s32(vld1q_s32(is[j]))));   \
                acc[j][1] = vaddq_f32(acc[j][1], vmulq_f32(vmulq_f32(dx1, dy),                  \
                                                          vcvtq_f32_s32(vld1q_s32(is[j] + 4)))); \
            }                                                                                   \
        }                                                                                       \
        const float32x4_t f = vdupq_n_f32(FINAL);                                               \
        for (int j = 0; j < C; j++) {                                                           \
            float *sj = (float *)((char *)s + (size_t)j * bs);                                  \
            vst1q_f32(sj, vmulq_f32(f, acc[j][0]));                                             \
            vst1q_f32(sj + 4, vmulq_f32(f, acc[j][1]));                                         \
        }                                                                                       \
    }                                                                                           \
    static void IQN_FN(vec_dot8_##name##_q8_K)(int64_t n, float *restrict s, size_t bs,         \
                                               const void *restrict x, size_t bx,               \
                                               const void *restrict y, size_t by, int nc) {     \
        for (int j = 0; j < nc; j += IQN_MAX_C) {                                               \
            const int c = nc - j < IQN_MAX_C ? nc - j : IQN_MAX_C;                              \
            float *sj = (float *)((char *)s + (size_t)j * bs);                                  \
            const char *yj = (const char *)y + (size_t)j * by;                                  \
            if (c == 1) IQN_FN(name##_rows8_c)(n, sj, bs, x, bx, yj, by, 1);                    \
            else if (c == 2) IQN_FN(name##_rows8_c)(n, sj, bs, x, bx, yj, by, 2);               \
            else if (c == 3) IQN_FN(name##_rows8_c)(n, sj, bs, x, bx, yj, by, 3);               \
            else IQN_FN(name##_rows8_c)(n, sj, bs, x, bx, yj, by, 4);                           \
        }                                                                                       \
    }                                                                                           \
    static void IQN_FN(gemm_##name##_q8_K)(int64_t n, float *restrict s, size_t bs,             \
                                           const void *restrict x, size_t bx,                   \
                                           const void *restrict y, size_t by, int nr, int nc) { \
        if (nr == 8) {                                                                          \
            IQN_FN(vec_dot8_##name##_q8_K)(n, s, bs, x, bx, y, by, nc);                         \
            return;                                                                             \
        }                                                                                       \
        for (int j = 0; j < nc; j++)                                                            \
            for (int i = 0; i < nr; i++)                                                        \
                IQN_FN(vec_dot_##name##_q8_K)(n, (float *)((char *)s + (size_t)j * bs) + i,     \
                                              (const char *)x + (size_t)i * bx,                 \
                                              (const char *)y + (size_t)j * by);                \
    }

IQN_KERNELS(iq2_xxs, pg_block_iq2_xxs, row_iq2_xxs, iqn_d_fp16, 0.125f)
IQN_KERNELS(iq2_xs, pg_block_iq2_xs, row_iq2_xs, iqn_d_fp16, 0.125f)
IQN_KERNELS(iq2_s, pg_block_iq2_s, row_iq2_s, iqn_d_fp16, 0.125f)
IQN_KERNELS(iq3_xxs, pg_block_iq3_xxs, row_iq3_xxs, iqn_d_fp16, 0.25f)
IQN_KERNELS(iq3_s, pg_block_iq3_s, row_iq3_s, iqn_d_fp16, 1.0f)
IQN_KERNELS(iq1_s, pg_block_iq1_s, row_iq1_s, iqn_d_fp16, 0.125f)
IQN_KERNELS(iq1_m, pg_block_iq1_m, row_iq1_m, iqn_d_iq1_m, 0.125f)
IQN_KERNELS(tq1_0, iqn_block_tq1_0, row_tq1_0, iqn_d_tq1_0, 1.0f)
IQN_KERNELS(tq2_0, iqn_block_tq2_0, row_tq2_0, iqn_d_tq2_0, 1.0f)

#define IQN_SET(tbl, type, name)                                                                \
    do {                                                                                        \
        (tbl)[type].vec_dot = IQN_FN(vec_dot_##name##_q8_K);                                    \
        (tbl)[type].vec_dot8 = IQN_FN(vec_dot8_##name##_q8_K);                                  \
        (tbl)[type].vec_dot8_rows = PG_DOT8_MAX_NC;                                             \
        (tbl)[type].gemm = IQN_FN(gemm_##name##_q8_K);                                          \
    } while (0)

static void IQN_FN(fill_iq_tq)(pg_type_traits *tbl) {
    IQN_SET(tbl, PG_TYPE_IQ2_XXS, iq2_xxs);
    IQN_SET(tbl, PG_TYPE_IQ2_XS, iq2_xs);
    IQN_SET(tbl, PG_TYPE_IQ2_S, iq2_s);
    IQN_SET(tbl, PG_TYPE_IQ3_XXS, iq3_xxs);
    IQN_SET(tbl, PG_TYPE_IQ3_S, iq3_s);
    IQN_SET(tbl, PG_TYPE_IQ1_S, iq1_s);
    IQN_SET(tbl, PG_TYPE_IQ1_M, iq1_m);
    IQN_SET(tbl, PG_TYPE_TQ1_0, tq1_0);
    IQN_SET(tbl, PG_TYPE_TQ2_0, tq2_0);
}
