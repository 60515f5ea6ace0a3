/* IQ4_NL, IQ4_XS and MXFP4 (iquants.h): the scalar reference kernels.
 *
 *   dequantize_row_*   bit-exact with ggml's (one fp32 multiply per value, the scale first
 *                      formed as ggml forms it)
 *   quantize_*         what llama-quantize writes without an importance matrix: ggml's
 *                      quantize_iq4_nl / quantize_iq4_xs (weights x², 7 scale tries each way)
 *                      and quantize_row_mxfp4_ref, bit for bit
 *   vec_dot            exact int32 block sums, one fp32 term per block in block order:
 *                      IQ4_NL, MXFP4 · Q8_0:  sum += (d_y · d_x) · isum      (ggml's generic)
 *                      IQ4_XS · Q8_K:         sum += (d_x · d_y) · Σ_ib (ls_ib − 32) · isum_ib
 *                      (ggml's generic adds a term per 32; its SIMD kernels sum the scaled
 *                      integers per super-block as here). Every SIMD path and every gemm
 *                      gives these bits.
 * Compiled with -ffp-contract=off: every expression is evaluated as written. */
#include <math.h>
#include <string.h>

#include "iquants.h"
#include "quants.h"

#define GROUP_MAX_EPS 1e-15f

static inline int nearest_int(float f) {
    const float v = f + 12582912.f;
    int32_t i;
    memcpy(&i, &v, sizeof(i));
    return (i & 0x007fffff) - 0x00400000;
}

/* The index of the value of val[0..n-1] (ascending) nearest x; ties to the upper one. */
static inline int best_index_int8(int n, const int8_t *val, float x) {
    if (x <= val[0]) return 0;
    if (x >= val[n - 1]) return n - 1;
    int ml = 0, mu = n - 1;
    while (mu - ml > 1) {
        const int mav = (ml + mu) / 2;
        if (x < val[mav]) mu = mav;
        else ml = mav;
    }
    return x - val[mu - 1] < val[mu] - x ? mu - 1 : mu;
}

/* ---- dequantization ------------------------------------------------------------------------ */

static void dequantize_row_iq4_nl(const void *restrict vx, float *restrict y, int64_t n) {
    const pg_block_iq4_nl *x = vx;
    for (int64_t i = 0; i < n / 32; i++, y += 32) {
        const float d = pg_fp16_to_fp32(x[i].d);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)pg_kv_iq4nl[x[i].qs[j] & 0xf];
            y[j + 16] = d * (float)pg_kv_iq4nl[x[i].qs[j] >> 4];
        }
    }
}

static void dequantize_row_iq4_xs(const void *restrict vx, float *restrict y, int64_t n) {
    const pg_block_iq4_xs *x = vx;
    for (int64_t i = 0; i < n / PG_QK_K; i++) {
        const float d = pg_fp16_to_fp32(x[i].d);
        const uint8_t *qs = x[i].qs;
        for (int ib = 0; ib < 8; ib++, y += 32, qs += 16) {
            const float dl = d * (float)pg_iq4xs_scale(&x[i], ib);
            for (int j = 0; j < 16; j++) {
                y[j] = dl * (float)pg_kv_iq4nl[qs[j] & 0xf];
                y[j + 16] = dl * (float)pg_kv_iq4nl[qs[j] >> 4];
            }
        }
    }
}

static void dequantize_row_mxfp4(const void *restrict vx, float *restrict y, int64_t n) {
    const pg_block_mxfp4 *x = vx;
    for (int64_t i = 0; i < n / 32; i++, y += 32) {
        const float d = pg_e8m0_half(x[i].e);
        for (int j = 0; j < 16; j++) {
            y[j] = (float)pg_kv_mxfp4[x[i].qs[j] & 0xf] * d;
            y[j + 16] = (float)pg_kv_mxfp4[x[i].qs[j] >> 4] * d;
        }
    }
}

/* ---- quantization ---------------------------------------------------------------------------- */

/* ggml's quantize_row_iq4_nl_impl without importance weights (weights x²): per block of 32 the
 * scale max/−127 refined by a least-squares fit (ntry 7, the file quantizer: over 15 trial
 * scales; ntry −1, ggml's row quantizer quantize_row_iq4_nl_ref that writes a KV cache: the
 * scale max/127 and one fit); with several blocks (IQ4_XS) the block scales are then quantized
 * to 6 bits against the largest. */
static void iq4_impl(int super, const float *restrict x, pg_fp16 *dh, uint8_t *q4,
                     uint16_t *scales_h, uint8_t *scales_l, int ntry) {
    const int8_t *values = pg_kv_iq4nl;
    float scales[PG_QK_K / 32], weight[32];
    uint8_t L[PG_QK_K];
    memset(q4, 0, (size_t)super / 2);
    memset(L, 0, sizeof(L));
    *dh = pg_fp32_to_fp16(0.f);
    float max_scale = 0, amax_scale = 0;
    for (int ib = 0; ib < super / 32; ib++) {
        const float *xb = x + ib * 32;
        uint8_t *Lb = L + ib * 32;
        for (int j = 0; j < 32; j++) weight[j] = xb[j] * xb[j];
        float amax = 0, max = 0;
        for (int j = 0; j < 32; j++) {
            const float ax = fabsf(xb[j]);
            if (ax > amax) { amax = ax; max = xb[j]; }
        }
        if (amax < GROUP_MAX_EPS) {
            scales[ib] = 0;
            continue;
        }
        float d = ntry > 0 ? -max / (float)values[0] : max / (float)values[0];
        float id = 1 / d;
        float sumqx = 0, sumq2 = 0;
        for (int j = 0; j < 32; j++) {
            const int l = best_index_int8(16, values, id * xb[j]);
            Lb[j] = (uint8_t)l;
            const float q = values[l], w = weight[j];
            sumqx += w * q * xb[j];
            sumq2 += w * q * q;
        }
        d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
        float best = d * sumqx;
        for (int itry = -ntry; itry <= ntry; itry++) {
            id = (float)(itry + values[0]) / max;
            sumqx = sumq2 = 0;
            for (int j = 0; j < 32; j++) {
                const int l = best_index_int8(16, values, id * xb[j]);
                const float q = values[l], w = weight[j];
                sumqx += w * q * xb[j];
                sumq2 += w * q * q;
            }
            if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
                d = sumqx / sumq2;
                best = d * sumqx;
            }
        }
        scales[ib] = d;
        const float abs_d = fabsf(d);
        if (abs_d > amax_scale) { amax_scale = abs_d; max_scale = d; }
    }
    if (super > 32) {
        *scales_h = 0;
        const float d = -max_scale / 32;
        *dh = pg_fp32_to_fp16(d);
        const float id = d != 0 ? 1 / d : 0.f;
        for (int ib = 0; ib < super / 32; ib++) {
            int l = nearest_int(id * scales[ib]);
            l = l < -32 ? -32 : l > 31 ? 31 : l;
            const float dl = d * (float)l;
            const float idl = dl != 0 ? 1 / dl : 0.f;
            uint8_t *Lb = L + ib * 32;
            const float *xb = x + ib * 32;
            for (int j = 0; j < 32; j++) Lb[j] = (uint8_t)best_index_int8(16, values, idl * xb[j]);
            l += 32;
            const uint8_t l_l = l & 0xf, l_h = (uint8_t)(l >> 4);
            if (ib % 2 == 0) scales_l[ib / 2] = l_l;
            else scales_l[ib / 2] |= (uint8_t)(l_l << 4);
            *scales_h |= (uint16_t)(l_h << 2 * (ib % 8));
        }
    } else {
        *dh = pg_fp32_to_fp16(scales[0]);
        /* (ntry −1: the indices of the first pass stay, as ggml's; for an all-zero block
         * ggml leaves them unset (its stack), here 0: the same values, d being 0) */
        const float id = scales[0] != 0 ? 1 / scales[0] : 0;
        if (ntry > 0)
            for (int j = 0; j < super; j++) L[j] = (uint8_t)best_index_int8(16, values, id * x[j]);
    }
    for (int i = 0; i < super / 32; i++)
        for (int j = 0; j < 16; j++)
            q4[16 * i + j] = (uint8_t)(L[32 * i + j] | (L[32 * i + 16 + j] << 4));
}

static void quantize_row_iq4_nl(const float *restrict x, void *restrict vy, int64_t n) {
    pg_block_iq4_nl *y = vy;
    for (int64_t i = 0; i < n / 32; i++) iq4_impl(32, x + 32 * i, &y[i].d, y[i].qs, NULL, NULL, 7);
}

/* ggml's CPU from_float of IQ4_NL (quantize_row_iq4_nl_ref: ntry −1): what set_rows writes */
static void quantize_row_iq4_nl_rows(const float *restrict x, void *restrict vy, int64_t n) {
    pg_block_iq4_nl *y = vy;
    for (int64_t i = 0; i < n / 32; i++) iq4_impl(32, x + 32 * i, &y[i].d, y[i].qs, NULL, NULL, -1);
}

static void quantize_row_iq4_xs(const float *restrict x, void *restrict vy, int64_t n) {
    pg_block_iq4_xs *y = vy;
    for (int64_t i = 0; i < n / PG_QK_K; i++)
        iq4_impl(PG_QK_K, x + PG_QK_K * i, &y[i].d, y[i].qs, &y[i].scales_h, y[i].scales_l, 7);
}

static inline int best_index_mxfp4(float x, float e) {
    int best = 0;
    float best_err = fabsf((float)pg_kv_mxfp4[0] * e - x);
    for (int i = 1; i < 16; i++) {
        const float err = fabsf((float)pg_kv_mxfp4[i] * e - x);
        if (err < best_err) { best = i; best_err = err; }
    }
    return best;
}

static void quantize_row_mxfp4(const float *restrict x, void *restrict vy, int64_t n) {
    pg_block_mxfp4 *y = vy;
    for (int64_t i = 0; i < n / 32; i++, x += 32) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++)
            if (amax < fabsf(x[j])) amax = fabsf(x[j]);
        /* (as ggml: the float converted to an integer, kept modulo 256) */
        const uint8_t e = amax > 0.0f ? (uint8_t)(int)(floorf(log2f(amax)) - 2 + 127) : 0;
        const float d = pg_e8m0_half(e);
        y[i].e = e;
        for (int j = 0; j < 16; j++)
            y[i].qs[j] = (uint8_t)(best_index_mxfp4(x[j], d) | best_index_mxfp4(x[j + 16], d) << 4);
    }
}

/* ---- dot products -------------------------------------------------------------------------- */

static inline int32_t dot32_lut(const uint8_t *qs, const int8_t *lut, const int8_t *a) {
    int32_t s = 0;
    for (int j = 0; j < 16; j++) s += (int32_t)lut[qs[j] & 0xf] * a[j];
    for (int j = 0; j < 16; j++) s += (int32_t)lut[qs[j] >> 4] * a[j + 16];
    return s;
}

static void vec_dot_iq4_nl_q8_0(int64_t n, float *restrict s, const void *restrict vx,
                                const void *restrict vy) {
    const pg_block_iq4_nl *x = vx;
    const pg_block_q8_0 *y = vy;
    float sum = 0;
    for (int64_t i = 0; i < n / 32; i++) {
        const float d = pg_fp16_to_fp32(y[i].d) * pg_fp16_to_fp32(x[i].d);
        sum += d * (float)dot32_lut(x[i].qs, pg_kv_iq4nl, y[i].qs);
    }
    *s = sum;
}

static void vec_dot_mxfp4_q8_0(int64_t n, float *restrict s, const void *restrict vx,
                               const void *restrict vy) {
    const pg_block_mxfp4 *x = vx;
    const pg_block_q8_0 *y = vy;
    float sum = 0;
    for (int64_t i = 0; i < n / 32; i++) {
        const float d = pg_fp16_to_fp32(y[i].d) * pg_e8m0_half(x[i].e);
        sum += d * (float)dot32_lut(x[i].qs, pg_kv_mxfp4, y[i].qs);
    }
    *s = sum;
}

static void vec_dot_iq4_xs_q8_K(int64_t n, float *restrict s, const void *restrict vx,
                                const void *restrict vy) {
    const pg_block_iq4_xs *x = vx;
    const pg_block_q8_K *y = vy;
    float sum = 0;
    for (int64_t i = 0; i < n / PG_QK_K; i++) {
        int32_t isum = 0;
        for (int ib = 0; ib < 8; ib++)
            isum += pg_iq4xs_scale(&x[i], ib) *
                    dot32_lut(x[i].qs + 16 * ib, pg_kv_iq4nl, y[i].qs + 32 * ib);
        sum += (pg_fp16_to_fp32(x[i].d) * y[i].d) * (float)isum;
    }
    *s = sum;
}

/* ---- gemm (pg_gemm_fn): each weight block decoded once for the nc activation rows --------- */

#define MR PG_GEMM_MAX_NR
#define MC PG_GEMM_MAX_NC

static inline void decode32(const uint8_t *qs, const int8_t *lut, int8_t q[32]) {
    for (int j = 0; j < 16; j++) {
        q[j] = lut[qs[j] & 0xf];
        q[j + 16] = lut[qs[j] >> 4];
    }
}

static inline int32_t dot32(const int8_t *q, const int8_t *a) {
    int32_t s = 0;
    for (int k = 0; k < 32; k++) s += (int32_t)q[k] * a[k];
    return s;
}

static inline void store_block(float *s, size_t bs, float sums[MR][MC], int nr, int nc) {
    for (int j = 0; j < nc; j++) {
        float *out = (float *)((char *)s + (size_t)j * bs);
        for (int i = 0; i < nr; i++) out[i] = sums[i][j];
    }
}

#define PG_GEMM_Q8_0(name, XT, LUT, SCALE)                                                         \
    static void name(int64_t n, float *restrict s, size_t bs, const void *restrict vx,             \
                     size_t bx, const void *restrict vy, size_t by, int nr, int nc) {              \
        float sums[MR][MC] = {{0}};                                                                \
        for (int64_t b = 0; b < n / 32; b++) {                                                     \
            int8_t q[MR][32];                                                                      \
            float dx[MR];                                                                          \
            for (int i = 0; i < nr; i++) {                                                         \
                const XT *x = (const XT *)((const char *)vx + (size_t)i * bx) + b;                 \
                decode32(x->qs, LUT, q[i]);                                                        \
                dx[i] = SCALE(x);                                                                  \
            }                                                                                      \
            for (int j = 0; j < nc; j++) {                                                         \
                const pg_block_q8_0 *y = (const pg_block_q8_0 *)((const char *)vy + (size_t)j * by) + b; \
                const float dy = pg_fp16_to_fp32(y->d);                                            \
                for (int i = 0; i < nr; i++)                                                       \
                    sums[i][j] += (dy * dx[i]) * (float)dot32(q[i], y->qs);                        \
            }                                                                                      \
        }                                                                                          \
        store_block(s, bs, sums, nr, nc);                                                          \
    }

#define IQ4NL_SCALE(x) pg_fp16_to_fp32((x)->d)
#define MXFP4_SCALE(x) pg_e8m0_half((x)->e)
PG_GEMM_Q8_0(gemm_iq4_nl_q8_0, pg_block_iq4_nl, pg_kv_iq4nl, IQ4NL_SCALE)
PG_GEMM_Q8_0(gemm_mxfp4_q8_0, pg_block_mxfp4, pg_kv_mxfp4, MXFP4_SCALE)

static void gemm_iq4_xs_q8_K(int64_t n, float *restrict s, size_t bs, const void *restrict vx,
                             size_t bx, const void *restrict vy, size_t by, int nr, int nc) {
    float sums[MR][MC] = {{0}};
    for (int64_t b = 0; b < n / PG_QK_K; b++) {
        int8_t q[MR][PG_QK_K];
        int32_t sc[MR][8];
        float dx[MR];
        for (int i = 0; i < nr; i++) {
            const pg_block_iq4_xs *x = (const pg_block_iq4_xs *)((const char *)vx + (size_t)i * bx) + b;
            for (int ib = 0; ib < 8; ib++) {
                decode32(x->qs + 16 * ib, pg_kv_iq4nl, q[i] + 32 * ib);
                sc[i][ib] = pg_iq4xs_scale(x, ib);
            }
            dx[i] = pg_fp16_to_fp32(x->d);
        }
        for (int j = 0; j < nc; j++) {
            const pg_block_q8_K *y = (const pg_block_q8_K *)((const char *)vy + (size_t)j * by) + b;
            for (int i = 0; i < nr; i++) {
                int32_t isum = 0;
                for (int ib = 0; ib < 8; ib++) isum += sc[i][ib] * dot32(q[i] + 32 * ib, y->qs + 32 * ib);
                sums[i][j] += (dx[i] * y->d) * (float)isum;
            }
        }
    }
    store_block(s, bs, sums, nr, nc);
}

/* ---- traits -------------------------------------------------------------------------------- */

void pg_fill_iquants_scalar(pg_type_traits *tbl) {
    static const struct {
        int32_t type, block_size, type_size, vec_dot_type;
        pg_to_float_fn to_float;
        pg_from_float_fn from_float;
        pg_vec_dot_fn vec_dot;
        pg_gemm_fn gemm;
    } k[] = {
        {PG_TYPE_IQ4_NL, 32, sizeof(pg_block_iq4_nl), PG_TYPE_Q8_0, dequantize_row_iq4_nl,
         quantize_row_iq4_nl, vec_dot_iq4_nl_q8_0, gemm_iq4_nl_q8_0},
        {PG_TYPE_IQ4_XS, PG_QK_K, sizeof(pg_block_iq4_xs), PG_TYPE_Q8_K, dequantize_row_iq4_xs,
         quantize_row_iq4_xs, vec_dot_iq4_xs_q8_K, gemm_iq4_xs_q8_K},
        {PG_TYPE_MXFP4, 32, sizeof(pg_block_mxfp4), PG_TYPE_Q8_0, dequantize_row_mxfp4,
         quantize_row_mxfp4, vec_dot_mxfp4_q8_0, gemm_mxfp4_q8_0},
    };
    for (size_t i = 0; i < sizeof(k) / sizeof(k[0]); i++) {
        pg_type_traits *t = &tbl[k[i].type];
        t->block_size = k[i].block_size;
        t->type_size = k[i].type_size;
        t->to_float = k[i].to_float;
        t->from_float_ref = k[i].from_float;
        t->from_float = k[i].from_float;
        t->vec_dot = k[i].vec_dot;
        t->vec_dot_type = k[i].vec_dot_type;
        t->gemm = k[i].gemm;
    }
    /* ggml's CPU traits quantize IQ4_NL rows without the scale search (llama-quantize's files
     * with it): a KV cache of IQ4_NL holds what llama.cpp's would */
    tbl[PG_TYPE_IQ4_NL].from_float = quantize_row_iq4_nl_rows;
}
