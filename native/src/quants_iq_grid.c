/* The codebook i-quants: IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M (256-element
 * super-blocks; layouts and codebooks are ggml's: ggml-common.h, iq_grids.h). Scalar
 * reference kernels; the dot partner is Q8_K for all of them, as in ggml.
 *
 * Every super-block decodes to 256 signed int8 levels (codebook bytes with their signs), one
 * scale nibble s per group of 8 elements and, for IQ1_*, a delta sign per group of 8:
 *
 *   IQ2_*    x = (d·(0.5 + s)·0.25) · level          = d·(2s+1)/8 · level
 *   IQ3_XXS  x = (d·(0.5 + s)·0.5) · level           = d·(2s+1)/4 · level
 *   IQ3_S    x = (d·(1 + 2s)) · level
 *   IQ1_*    x = (d·(2s + 1)) · (level ± 1/8)        = d·(2s+1)/8 · (8·level ± 1)
 *
 *   to_float   ggml's dequantize_row_* operation for operation (bit-exact with the gguf
 *              package's dequantizers: tests/test_quants_iq.py)
 *   vec_dot    the exact int32 sum T = Σ_groups (2s+1)·(m·Σ level·a ± Σ a) (m = 8 and the
 *              delta term for IQ1_*, m = 1 otherwise), one fp32 term (d·d_y)·T per super-block
 *              in block order, times the type's power of two at the end (1/8, 1/4 or 1);
 *              ggml's generic kernels regroup the same sums (their fp32 rounding differs only
 *              in the last bits)
 *   quantize   none: llama.cpp makes these types with an importance matrix (llama-quantize
 *              refuses most of them without one); files are read, not written
 */
#include <string.h>

#include "fp16.h"
#include "iq_blocks.h"
#include "iq_grids.h"
#include "kquants.h"
#include "quants.h"

#define IQ1_DELTA 0.125f

/* One decoded super-block: levels, the scale nibble and the delta sign (IQ1) per group of 8. */
typedef struct {
    int8_t  q[256];
    uint8_t s[32];
    int8_t  dsign[32];   /* IQ1_*: +1 / -1 (delta +1/8 / -1/8); 0 for the others */
    float   d;
} gblock;

static inline uint8_t grid_byte(uint64_t g, int j) { return (uint8_t)(g >> (8 * j)); }

/* 8 levels of a uint64 codebook entry, sign bit j of `signs` flipping level j */
static inline void put8(int8_t *q, uint64_t g, uint8_t signs) {
    for (int j = 0; j < 8; j++) {
        const int v = grid_byte(g, j);
        q[j] = (int8_t)(signs >> j & 1 ? -v : v);
    }
}

/* 4 + 4 levels of two uint32 codebook entries, sign bits 0..3 and 4..7 */
static inline void put4x2(int8_t *q, uint32_t g1, uint32_t g2, uint8_t signs) {
    for (int j = 0; j < 4; j++) {
        const int v1 = (uint8_t)(g1 >> (8 * j)), v2 = (uint8_t)(g2 >> (8 * j));
        q[j] = (int8_t)(signs >> j & 1 ? -v1 : v1);
        q[j + 4] = (int8_t)(signs >> (j + 4) & 1 ? -v2 : v2);
    }
}

static void decode_iq2_xxs(const void *p, gblock *g) {
    const pg_block_iq2_xxs *x = p;
    g->d = pg_fp16_to_fp32(x->d);
    for (int ib = 0; ib < 8; ib++) {
        uint32_t aux[2];
        memcpy(aux, x->qs + 4 * ib, 8);
        const uint8_t *idx = (const uint8_t *)aux;
        for (int l = 0; l < 4; l++) {
            put8(g->q + 32 * ib + 8 * l, pg_iq2xxs_grid[idx[l]],
                 pg_ksigns_iq2xs[(aux[1] >> 7 * l) & 127]);
            g->s[4 * ib + l] = (uint8_t)(aux[1] >> 28);
            g->dsign[4 * ib + l] = 0;
        }
    }
}

static void decode_iq2_xs(const void *p, gblock *g) {
    const pg_block_iq2_xs *x = p;
    g->d = pg_fp16_to_fp32(x->d);
    for (int ib = 0; ib < 8; ib++)
        for (int l = 0; l < 4; l++) {
            const uint16_t v = x->qs[4 * ib + l];
            put8(g->q + 32 * ib + 8 * l, pg_iq2xs_grid[v & 511], pg_ksigns_iq2xs[v >> 9]);
            g->s[4 * ib + l] = (uint8_t)(l < 2 ? x->scales[ib] & 0xf : x->scales[ib] >> 4);
            g->dsign[4 * ib + l] = 0;
        }
}

static void decode_iq2_s(const void *p, gblock *g) {
    const pg_block_iq2_s *x = p;
    const uint8_t *signs = x->qs + 32;
    g->d = pg_fp16_to_fp32(x->d);
    for (int ib = 0; ib < 8; ib++)
        for (int l = 0; l < 4; l++) {
            const int idx = x->qs[4 * ib + l] | ((x->qh[ib] << (8 - 2 * l)) & 0x300);
            put8(g->q + 32 * ib + 8 * l, pg_iq2s_grid[idx], signs[4 * ib + l]);
            g->s[4 * ib + l] = (uint8_t)(l < 2 ? x->scales[ib] & 0xf : x->scales[ib] >> 4);
            g->dsign[4 * ib + l] = 0;
        }
}

static void decode_iq3_xxs(const void *p, gblock *g) {
    const pg_block_iq3_xxs *x = p;
    g->d = pg_fp16_to_fp32(x->d);
    for (int ib = 0; ib < 8; ib++) {
        uint32_t aux;
        memcpy(&aux, x->qs + 64 + 4 * ib, 4);
        const uint8_t *qs = x->qs + 8 * ib;
        for (int l = 0; l < 4; l++) {
            put4x2(g->q + 32 * ib + 8 * l, pg_iq3xxs_grid[qs[2 * l]], pg_iq3xxs_grid[qs[2 * l + 1]],
                   pg_ksigns_iq2xs[(aux >> 7 * l) & 127]);
            g->s[4 * ib + l] = (uint8_t)(aux >> 28);
            g->dsign[4 * ib + l] = 0;
        }
    }
}

static void decode_iq3_s(const void *p, gblock *g) {
    const pg_block_iq3_s *x = p;
    g->d = pg_fp16_to_fp32(x->d);
    for (int ib = 0; ib < 8; ib++) {
        const uint8_t *qs = x->qs + 8 * ib, *signs = x->signs + 4 * ib;
        const int qh = x->qh[ib];
        for (int l = 0; l < 4; l++) {
            const int i1 = qs[2 * l] | ((qh << (8 - 2 * l)) & 256);
            const int i2 = qs[2 * l + 1] | ((qh << (7 - 2 * l)) & 256);
            put4x2(g->q + 32 * ib + 8 * l, pg_iq3s_grid[i1], pg_iq3s_grid[i2], signs[l]);
            g->s[4 * ib + l] = (uint8_t)(ib % 2 ? x->scales[ib / 2] >> 4 : x->scales[ib / 2] & 0xf);
            g->dsign[4 * ib + l] = 0;
        }
    }
}

static inline void put_iq1(int8_t *q, int idx) {
    const uint64_t gv = pg_iq1s_grid[idx];
    for (int j = 0; j < 8; j++) q[j] = (int8_t)grid_byte(gv, j);
}

static void decode_iq1_s(const void *p, gblock *g) {
    const pg_block_iq1_s *x = p;
    g->d = pg_fp16_to_fp32(x->d);
    for (int ib = 0; ib < 8; ib++) {
        const int qh = x->qh[ib];
        for (int l = 0; l < 4; l++) {
            put_iq1(g->q + 32 * ib + 8 * l, x->qs[4 * ib + l] | (((qh >> 3 * l) & 7) << 8));
            g->s[4 * ib + l] = (uint8_t)((qh >> 12) & 7);
            g->dsign[4 * ib + l] = (int8_t)(qh & 0x8000 ? -1 : 1);
        }
    }
}

static void decode_iq1_m(const void *p, gblock *g) {
    const pg_block_iq1_m *x = p;
    uint16_t sc[4];
    memcpy(sc, x->scales, 8);
    const pg_fp16 h = (pg_fp16)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) |
                                (sc[3] & 0xf000));
    g->d = pg_fp16_to_fp32(h);
    for (int ib = 0; ib < 8; ib++) {
        const uint8_t *qs = x->qs + 4 * ib, *qh = x->qh + 2 * ib;
        const int idx[4] = {qs[0] | ((qh[0] << 8) & 0x700), qs[1] | ((qh[0] << 4) & 0x700),
                            qs[2] | ((qh[1] << 8) & 0x700), qs[3] | ((qh[1] << 4) & 0x700)};
        const int neg[4] = {qh[0] & 0x08, qh[0] & 0x80, qh[1] & 0x08, qh[1] & 0x80};
        for (int l = 0; l < 4; l++) {
            put_iq1(g->q + 32 * ib + 8 * l, idx[l]);
            g->s[4 * ib + l] = (uint8_t)((sc[ib / 2] >> (6 * (ib % 2) + (l < 2 ? 0 : 3))) & 7);
            g->dsign[4 * ib + l] = (int8_t)(neg[l] ? -1 : 1);
        }
    }
}

/* ---- to_float: ggml's scale expression per type, then scale · level ------------------------ */

enum { K_IQ2, K_IQ3_XXS, K_IQ3_S, K_IQ1 };

static inline void dequant_block(const gblock *g, int kind, float *y) {
    for (int gi = 0; gi < 32; gi++) {
        const int s = g->s[gi];
        const int8_t *q = g->q + 8 * gi;
        float *yy = y + 8 * gi;
        if (kind == K_IQ1) {
            const float dl = g->d * (float)(2 * s + 1);
            const float delta = g->dsign[gi] < 0 ? -IQ1_DELTA : IQ1_DELTA;
            for (int j = 0; j < 8; j++) yy[j] = dl * ((float)q[j] + delta);
        } else {
            const float db = kind == K_IQ2     ? g->d * (0.5f + (float)s) * 0.25f
                           : kind == K_IQ3_XXS ? g->d * (0.5f + (float)s) * 0.5f
                                               : g->d * (float)(1 + 2 * s);
            /* ggml: db * grid * (±1.f); the sign flip is exact */
            for (int j = 0; j < 8; j++) {
                const float v = db * (float)(q[j] < 0 ? -q[j] : q[j]);
                yy[j] = q[j] < 0 ? -v : v;
            }
        }
    }
}

/* ---- vec_dot against Q8_K ------------------------------------------------------------------- */

static inline int32_t block_isum(const gblock *g, const int8_t *a, int iq1) {
    int32_t T = 0;
    for (int gi = 0; gi < 32; gi++) {
        int32_t s = 0, sa = 0;
        for (int j = 0; j < 8; j++) {
            s += (int32_t)g->q[8 * gi + j] * a[8 * gi + j];
            sa += a[8 * gi + j];
        }
        T += (2 * g->s[gi] + 1) * (iq1 ? 8 * s + g->dsign[gi] * sa : s);
    }
    return T;
}

#define PG_IQ_GRID_KERNELS(name, BT, DECODE, KIND, FINAL)                                       \
    static void dequantize_row_##name(const void *restrict vx, float *restrict y, int64_t n) { \
        const BT *x = vx;                                                                      \
        gblock g;                                                                              \
        for (int64_t i = 0; i < n / PG_QK_K; i++) {                                            \
            DECODE(&x[i], &g);                                                                 \
            dequant_block(&g, KIND, y + 256 * i);                                              \
        }                                                                                      \
    }                                                                                          \
    static void vec_dot_##name##_q8_K(int64_t n, float *restrict s, const void *restrict vx,   \
                                      const void *restrict vy) {                               \
        const BT *x = vx;                                                                      \
        const pg_block_q8_K *y = vy;                                                           \
        gblock g;                                                                              \
        float sum = 0;                                                                         \
        for (int64_t i = 0; i < n / PG_QK_K; i++) {                                            \
            DECODE(&x[i], &g);                                                                 \
            sum += (g.d * y[i].d) * (float)block_isum(&g, y[i].qs, KIND == K_IQ1);             \
        }                                                                                      \
        *s = (FINAL) * sum;                                                                    \
    }

PG_IQ_GRID_KERNELS(iq2_xxs, pg_block_iq2_xxs, decode_iq2_xxs, K_IQ2, 0.125f)
PG_IQ_GRID_KERNELS(iq2_xs, pg_block_iq2_xs, decode_iq2_xs, K_IQ2, 0.125f)
PG_IQ_GRID_KERNELS(iq2_s, pg_block_iq2_s, decode_iq2_s, K_IQ2, 0.125f)
PG_IQ_GRID_KERNELS(iq3_xxs, pg_block_iq3_xxs, decode_iq3_xxs, K_IQ3_XXS, 0.25f)
PG_IQ_GRID_KERNELS(iq3_s, pg_block_iq3_s, decode_iq3_s, K_IQ3_S, 1.0f)
PG_IQ_GRID_KERNELS(iq1_s, pg_block_iq1_s, decode_iq1_s, K_IQ1, 0.125f)
PG_IQ_GRID_KERNELS(iq1_m, pg_block_iq1_m, decode_iq1_m, K_IQ1, 0.125f)

void pg_fill_iq_grid_scalar(pg_type_traits *tbl) {
    static const struct {
        int32_t type, type_size;
        pg_to_float_fn to_float;
        pg_vec_dot_fn vec_dot;
    } k[] = {
        {PG_TYPE_IQ2_XXS, sizeof(pg_block_iq2_xxs), dequantize_row_iq2_xxs, vec_dot_iq2_xxs_q8_K},
        {PG_TYPE_IQ2_XS, sizeof(pg_block_iq2_xs), dequantize_row_iq2_xs, vec_dot_iq2_xs_q8_K},
        {PG_TYPE_IQ2_S, sizeof(pg_block_iq2_s), dequantize_row_iq2_s, vec_dot_iq2_s_q8_K},
        {PG_TYPE_IQ3_XXS, sizeof(pg_block_iq3_xxs), dequantize_row_iq3_xxs, vec_dot_iq3_xxs_q8_K},
        {PG_TYPE_IQ3_S, sizeof(pg_block_iq3_s), dequantize_row_iq3_s, vec_dot_iq3_s_q8_K},
        {PG_TYPE_IQ1_S, sizeof(pg_block_iq1_s), dequantize_row_iq1_s, vec_dot_iq1_s_q8_K},
        {PG_TYPE_IQ1_M, sizeof(pg_block_iq1_m), dequantize_row_iq1_m, vec_dot_iq1_m_q8_K},
    };
    for (size_t i = 0; i < sizeof(k) / sizeof(k[0]); i++) {
        pg_type_traits *t = &tbl[k[i].type];
        t->block_size = PG_QK_K;
        t->type_size = k[i].type_size;
        t->to_float = k[i].to_float;
        t->vec_dot = k[i].vec_dot;
        t->vec_dot_type = PG_TYPE_Q8_K;
    }
}
