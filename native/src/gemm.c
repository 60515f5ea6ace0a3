/* Multi-row dot kernels (pg_type_traits.gemm, see quants.h): the scalar reference.
 *
 * A gemm computes an nr×nc block of dots: nr weight rows × nc activation rows (both at most 4).
 * What it saves over nr·nc vec_dot calls is the per-block work that the calls would repeat:
 * each weight block is decoded once into int8 levels (and its fp16 fields into floats), then
 * dotted with the nc activation blocks; each activation block is read once per weight block.
 *
 * Every dot is computed exactly as the scalar vec_dot computes it (quants_legacy.c,
 * quants_kquants.c; formulas of docs/FORMATS.md §2.4): the same exact int32 block sums and
 * the same fp32 expression per block, accumulated in the same order, so the results equal the
 * scalar vec_dot bit for bit (tests/test_gemm.c checks it). The SIMD gemms (gemm_avx2.c,
 * gemm_avx512.c, gemm_neon_body.h) repeat these fp32 operations lane by lane and give the same
 * bits. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kquants.h"
#include "quants.h"
#include "quants_legacy.h"

#define MR PG_GEMM_MAX_NR
#define MC PG_GEMM_MAX_NC

/* sums[i][j] -> s + j·bs (bytes) + i floats */
static inline void store_block(float *s, size_t bs, float sums[MR][MC], int nr, int nc) {
    for (int j = 0; j < nc; j++) {
        float *out = (float *)((char *)s + (size_t)j * bs);
        for (int i = 0; i < nr; i++) out[i] = sums[i][j];
    }
}

/* ---- legacy formats (32-element blocks) ---------------------------------------------------- */

/* One weight block as 32 int8 levels in element order (offset already applied), d and m. */
static inline void decode_q4_0(const void *p, int8_t q[32], float *d, float *m) {
    const pg_block_q4_0 *x = p;
    for (int j = 0; j < 16; j++) {
        q[j] = (int8_t)((x->qs[j] & 0xF) - 8);
        q[j + 16] = (int8_t)((x->qs[j] >> 4) - 8);
    }
    *d = pg_fp16_to_fp32(x->d);
    *m = 0.0f;
}

static inline void decode_q4_1(const void *p, int8_t q[32], float *d, float *m) {
    const pg_block_q4_1 *x = p;
    for (int j = 0; j < 16; j++) {
        q[j] = (int8_t)(x->qs[j] & 0xF);
        q[j + 16] = (int8_t)(x->qs[j] >> 4);
    }
    *d = pg_fp16_to_fp32(x->d);
    *m = pg_fp16_to_fp32(x->m);
}

static inline void decode_q5_0(const void *p, int8_t q[32], float *d, float *m) {
    const pg_block_q5_0 *x = p;
    const uint32_t qh = pg_load_qh(x->qh);
    for (int j = 0; j < 16; j++) {
        q[j] = (int8_t)(((x->qs[j] & 0xF) | (int)(((qh >> j) & 1) << 4)) - 16);
        q[j + 16] = (int8_t)(((x->qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4)) - 16);
    }
    *d = pg_fp16_to_fp32(x->d);
    *m = 0.0f;
}

static inline void decode_q5_1(const void *p, int8_t q[32], float *d, float *m) {
    const pg_block_q5_1 *x = p;
    const uint32_t qh = pg_load_qh(x->qh);
    for (int j = 0; j < 16; j++) {
        q[j] = (int8_t)((x->qs[j] & 0xF) | (int)(((qh >> j) & 1) << 4));
        q[j + 16] = (int8_t)((x->qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4));
    }
    *d = pg_fp16_to_fp32(x->d);
    *m = pg_fp16_to_fp32(x->m);
}

static inline void decode_q8_0(const void *p, int8_t q[32], float *d, float *m) {
    const pg_block_q8_0 *x = p;
    memcpy(q, x->qs, 32);
    *d = pg_fp16_to_fp32(x->d);
    *m = 0.0f;
}

/* The per-block fp32 step of each scalar vec_dot, verbatim (the order of the operations is
 * what makes the results bit-identical). */
#define STEP_Q4_0(sum, sumi, dx, mx, dy, sy) (sum) += (float)(sumi) * (dx) * (dy)
#define STEP_Q8_0(sum, sumi, dx, mx, dy, sy) (sum) += (float)(sumi) * ((dx) * (dy))
#define STEP_Q4_1(sum, sumi, dx, mx, dy, sy) (sum) += ((dx) * (dy)) * (float)(sumi) + (mx) * (sy)

static inline int32_t dot32_i8(const int8_t *q, const int8_t *a) {
    int32_t s = 0;
    for (int k = 0; k < 32; k++) s += (int32_t)q[k] * a[k];
    return s;
}

/* YT: pg_block_q8_0 (no s) or pg_block_q8_1. */
#define PG_GEMM_LEGACY(name, XT, YT, DECODE, STEP, HAS_S)                                          \
    static void name(int64_t n, float *restrict s, size_t bs, const void *restrict vx,             \
                     size_t bx, const void *restrict vy, size_t by, int nr, int nc) {              \
        float sums[MR][MC] = {{0}};                                                                \
        for (int64_t b = 0; b < n / PG_QK32; b++) {                                                \
            int8_t q[MR][32];                                                                      \
            float dx[MR], mx[MR];                                                                  \
            for (int i = 0; i < nr; i++)                                                           \
                DECODE((const XT *)((const char *)vx + (size_t)i * bx) + b, q[i], &dx[i],          \
                       &mx[i]);                                                                    \
            for (int j = 0; j < nc; j++) {                                                         \
                const YT *y = (const YT *)((const char *)vy + (size_t)j * by) + b;                 \
                const float dy = pg_fp16_to_fp32(y->d);                                            \
                const float sy = HAS_S ? pg_fp16_to_fp32(((const pg_fp16 *)y)[1]) : 0.0f;          \
                (void)sy;                                                                          \
                for (int i = 0; i < nr; i++) {                                                     \
                    const int32_t sumi = dot32_i8(q[i], y->qs);                                    \
                    STEP(sums[i][j], sumi, dx[i], mx[i], dy, sy);                                  \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
        store_block(s, bs, sums, nr, nc);                                                          \
    }

PG_GEMM_LEGACY(gemm_q4_0_q8_0, pg_block_q4_0, pg_block_q8_0, decode_q4_0, STEP_Q4_0, 0)
PG_GEMM_LEGACY(gemm_q5_0_q8_0, pg_block_q5_0, pg_block_q8_0, decode_q5_0, STEP_Q4_0, 0)
PG_GEMM_LEGACY(gemm_q8_0_q8_0, pg_block_q8_0, pg_block_q8_0, decode_q8_0, STEP_Q8_0, 0)
PG_GEMM_LEGACY(gemm_q4_1_q8_1, pg_block_q4_1, pg_block_q8_1, decode_q4_1, STEP_Q4_1, 1)
PG_GEMM_LEGACY(gemm_q5_1_q8_1, pg_block_q5_1, pg_block_q8_1, decode_q5_1, STEP_Q4_1, 1)

/* ---- K-quants (256-element super-blocks) × Q8_K ---------------------------------------------- */

/* One decoded super-block: levels q[256] (offsets applied), a scale per group of 16, and the
 * fp16 fields; for formats with mins (Q2_K, Q4_K, Q5_K) the min per group of 16. */
typedef struct {
    int8_t  q[PG_QK_K];
    int16_t sc[16];
    int16_t mn[16];
    float   d, dmin;
    int     has_min;
} kblock;

static void decode_q2_K(const void *p, kblock *k) {
    const pg_block_q2_K *x = p;
    for (int nn = 0; nn < 2; nn++)
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++)
                k->q[128 * nn + 32 * j + l] = (int8_t)((x->qs[32 * nn + l] >> (2 * j)) & 3);
    for (int g = 0; g < 16; g++) {
        k->sc[g] = x->scales[g] & 0xF;
        k->mn[g] = x->scales[g] >> 4;
    }
    k->d = pg_fp16_to_fp32(x->d);
    k->dmin = pg_fp16_to_fp32(x->dmin);
    k->has_min = 1;
}

static void decode_q3_K(const void *p, kblock *k) {
    const pg_block_q3_K *x = p;
    for (int nn = 0; nn < 2; nn++)
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++) {
                const int q2 = (x->qs[32 * nn + l] >> (2 * j)) & 3;
                const int h = (x->hmask[l] >> (4 * nn + j)) & 1;
                k->q[128 * nn + 32 * j + l] = (int8_t)(q2 - 4 + 4 * h);
            }
    int8_t sc[16];
    pg_k3_unpack_scales(x->scales, sc);
    for (int g = 0; g < 16; g++) k->sc[g] = sc[g];
    k->d = pg_fp16_to_fp32(x->d);
    k->has_min = 0;
}

/* Q4_K / Q5_K: the 8 scales and mins of groups of 32, as pairs of groups of 16. */
static void k4_scales_mins(const uint8_t *scales, kblock *k) {
    uint8_t sm[16];
    pg_k4_unpack_scales(scales, sm);
    for (int j = 0; j < 8; j++) {
        k->sc[2 * j] = k->sc[2 * j + 1] = sm[j];
        k->mn[2 * j] = k->mn[2 * j + 1] = sm[8 + j];
    }
    k->has_min = 1;
}

static void decode_q4_K(const void *p, kblock *k) {
    const pg_block_q4_K *x = p;
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            k->q[64 * c + l] = (int8_t)(x->qs[32 * c + l] & 0xF);
            k->q[64 * c + 32 + l] = (int8_t)(x->qs[32 * c + l] >> 4);
        }
    k4_scales_mins(x->scales, k);
    k->d = pg_fp16_to_fp32(x->d);
    k->dmin = pg_fp16_to_fp32(x->dmin);
}

static void decode_q5_K(const void *p, kblock *k) {
    const pg_block_q5_K *x = p;
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            const int h = x->qh[l] >> (2 * c);
            k->q[64 * c + l] = (int8_t)((x->qs[32 * c + l] & 0xF) | ((h & 1) << 4));
            k->q[64 * c + 32 + l] = (int8_t)((x->qs[32 * c + l] >> 4) | ((h & 2) << 3));
        }
    k4_scales_mins(x->scales, k);
    k->d = pg_fp16_to_fp32(x->d);
    k->dmin = pg_fp16_to_fp32(x->dmin);
}

static void decode_q6_K(const void *p, kblock *k) {
    const pg_block_q6_K *x = p;
    for (int nn = 0; nn < 2; nn++) {
        const uint8_t *ql = x->ql + 64 * nn, *qh = x->qh + 32 * nn;
        int8_t *qq = k->q + 128 * nn;
        for (int l = 0; l < 32; l++) {
            qq[l] = (int8_t)(((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32);
            qq[l + 32] = (int8_t)(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
            qq[l + 64] = (int8_t)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
            qq[l + 96] = (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
        }
    }
    for (int g = 0; g < 16; g++) k->sc[g] = x->scales[g];
    k->d = pg_fp16_to_fp32(x->d);
    k->has_min = 0;
}

/* The scalar vec_dot's per-super-block step: exact int32 sums, then
 *   with mins:    sum += (dy·d)·isum − (dy·dmin)·summs
 *   without:      sum += (d·dy)·isum                                                          */
static inline void kstep(float *sum, const kblock *k, const pg_block_q8_K *y) {
    int32_t isum = 0;
    for (int g = 0; g < 16; g++) {
        int32_t t = 0;
        for (int e = 0; e < 16; e++) t += (int32_t)k->q[16 * g + e] * y->qs[16 * g + e];
        isum += k->sc[g] * t;
    }
    if (k->has_min) {
        int32_t summs = 0;
        for (int g = 0; g < 16; g++) summs += k->mn[g] * y->bsums[g];
        const float d = y->d * k->d, dmin = y->d * k->dmin;
        *sum += d * (float)isum - dmin * (float)summs;
    } else {
        *sum += (k->d * y->d) * (float)isum;
    }
}

#define PG_GEMM_KQUANT(name, XT, DECODE)                                                           \
    static void name(int64_t n, float *restrict s, size_t bs, const void *restrict vx,             \
                     size_t bx, const void *restrict vy, size_t by, int nr, int nc) {              \
        float sums[MR][MC] = {{0}};                                                                \
        kblock k[MR];                                                                              \
        for (int64_t b = 0; b < n / PG_QK_K; b++) {                                                \
            for (int i = 0; i < nr; i++)                                                           \
                DECODE((const XT *)((const char *)vx + (size_t)i * bx) + b, &k[i]);                \
            for (int j = 0; j < nc; j++) {                                                         \
                const pg_block_q8_K *y =                                                           \
                    (const pg_block_q8_K *)((const char *)vy + (size_t)j * by) + b;                \
                for (int i = 0; i < nr; i++) kstep(&sums[i][j], &k[i], y);                         \
            }                                                                                      \
        }                                                                                          \
        store_block(s, bs, sums, nr, nc);                                                          \
    }

PG_GEMM_KQUANT(gemm_q2_K_q8_K, pg_block_q2_K, decode_q2_K)
PG_GEMM_KQUANT(gemm_q3_K_q8_K, pg_block_q3_K, decode_q3_K)
PG_GEMM_KQUANT(gemm_q4_K_q8_K, pg_block_q4_K, decode_q4_K)
PG_GEMM_KQUANT(gemm_q5_K_q8_K, pg_block_q5_K, decode_q5_K)
PG_GEMM_KQUANT(gemm_q6_K_q8_K, pg_block_q6_K, decode_q6_K)

/* ---- table ------------------------------------------------------------------------------- */

void pg_fill_gemm_scalar(pg_type_traits *tbl) {
    tbl[PG_TYPE_Q4_0].gemm = gemm_q4_0_q8_0;
    tbl[PG_TYPE_Q4_1].gemm = gemm_q4_1_q8_1;
    tbl[PG_TYPE_Q5_0].gemm = gemm_q5_0_q8_0;
    tbl[PG_TYPE_Q5_1].gemm = gemm_q5_1_q8_1;
    tbl[PG_TYPE_Q8_0].gemm = gemm_q8_0_q8_0;
    tbl[PG_TYPE_Q2_K].gemm = gemm_q2_K_q8_K;
    tbl[PG_TYPE_Q3_K].gemm = gemm_q3_K_q8_K;
    tbl[PG_TYPE_Q4_K].gemm = gemm_q4_K_q8_K;
    tbl[PG_TYPE_Q5_K].gemm = gemm_q5_K_q8_K;
    tbl[PG_TYPE_Q6_K].gemm = gemm_q6_K_q8_K;
}
