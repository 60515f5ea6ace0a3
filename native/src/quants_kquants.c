/* K-quants (Q2_K..Q6_K, Q8_K): the scalar reference kernels.
 *
 *   dequantize_row_*   exact: each value is (d*sc)*q - (dmin*m), single fp32 roundings, as gguf
 *   quantize_row_*_ref the reference quantizers without importance matrix (bit-exact with ggml's
 *                      quantize_row_q{2..6}_K_ref and quantize_row_q8_K_ref): least-squares
 *                      searches per sub-block, then 4/6/8-bit quantized scales
 *   vec_dot_*_q8_K     integer sums per sub-block, one fp32 multiply-add per super-block
 *
 * Floating-point order matters for bit-exactness: every expression below is evaluated exactly as
 * written, one rounding per operation. The library is compiled with -std=c11, which makes GCC
 * and Clang keep `a*b + c` as two operations (no FMA contraction); the numpy reference in
 * tests/test_quants_k.py follows the same order. */
#include <math.h>
#include <string.h>

#include "fp16.h"
#include "kquants.h"
#include "quants.h"

#define GROUP_MAX_EPS 1e-15f

/* Round to nearest, ties to even, for |f| < 2^22 (adds 1.5*2^23 and reads the mantissa). Outside
 * that range the result is meaningless but deterministic; the callers clamp it. */
static inline int nearest_int(float f) {
    const float v = f + 12582912.f;
    int32_t i;
    memcpy(&i, &v, sizeof(i));
    return (i & 0x007fffff) - 0x00400000;
}

static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* ---- reference quantization helpers ------------------------------------------------------ */

/* Symmetric quantization of n values to L in 0..2*nmax-1 (q = L - nmax) with weights x^2: start
 * from scale max/-nmax, then try 18 nearby scales and keep the one with the best weighted
 * least-squares fit. Returns the scale (ggml: make_qx_quants with rmse_type 1, no weights). */
static float make_qx_quants_x2(int n, int nmax, const float *x, int8_t *L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        const float ax = fabsf(x[i]);
        if (ax > amax) { amax = ax; max = x[i]; }
    }
    if (amax < GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    float iscale = (float)(-nmax) / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        const int l = clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)(l + nmax);
        const float w = x[i] * x[i];
        sumlx += w * x[i] * (float)l;
        suml2 += w * (float)l * (float)l;
    }
    float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        iscale = -((float)nmax + 0.1f * (float)is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            const int l = clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1);
            const float w = x[i] * x[i];
            sumlx += w * x[i] * (float)l;
            suml2 += w * (float)l * (float)l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++) {
                L[i] = (int8_t)(nmax + clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1));
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Q3_K's sub-block quantizer: start from scale max/-nmax, then up to 5 passes of coordinate
 * descent, each value moved to its best level given the others (weights x^2). L in 0..2*nmax-1.
 * (ggml: make_q3_quants with do_rmse.) */
static float make_q3_quants(int n, int nmax, const float *x, int8_t *L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        const float ax = fabsf(x[i]);
        if (ax > amax) { amax = ax; max = x[i]; }
    }
    if (amax < GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    const float iscale = (float)(-nmax) / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        const int l = clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)l;
        const float w = x[i] * x[i];
        sumlx += w * x[i] * (float)l;
        suml2 += w * (float)l * (float)l;
    }
    for (int itry = 0; itry < 5; itry++) {
        int n_changed = 0;
        for (int i = 0; i < n; i++) {
            const float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * (float)L[i];
            if (slx > 0) {
                float sl2 = suml2 - w * (float)L[i] * (float)L[i];
                const int new_l = clampi(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
                if (new_l != L[i]) {
                    slx += w * x[i] * (float)new_l;
                    sl2 += w * (float)new_l * (float)new_l;
                    if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (int8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed++;
                    }
                }
            }
        }
        if (!n_changed) break;
    }
    for (int i = 0; i < n; i++) L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* Asymmetric quantization x ~ scale*L - the_min with L in 0..nmax: a grid search over nstep+1
 * candidate scales, each refined by a weighted least-squares fit of scale and min (min clamped
 * to <= 0); error measured as weighted |diff| (use_mad) or diff^2. (ggml: make_qkx2_quants.) */
static float make_qkx2_quants(int n, int nmax, const float *x, const float *weights, uint8_t *L,
                              float *the_min, uint8_t *Laux, float rmin, float rdelta, int nstep,
                              int use_mad) {
    float min = x[0], max = x[0];
    float sum_w = weights[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        const float w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        memset(L, 0, (size_t)n);
        *the_min = -min;
        return 0.f;
    }
    float iscale = (float)nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (int i = 0; i < n; i++) {
        const int l = nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t)clampi(l, 0, nmax);
        float diff = scale * (float)L[i] + min - x[i];
        diff = use_mad ? fabsf(diff) : diff * diff;
        best_error += weights[i] * diff;
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * (float)is + (float)nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            const int l = clampi(nearest_int(iscale * (x[i] - min)), 0, nmax);
            Laux[i] = (uint8_t)l;
            const float w = weights[i];
            sum_l += w * (float)l;
            sum_l2 += w * (float)l * (float)l;
            sum_xl += w * (float)l * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; i++) {
                float diff = this_scale * (float)Laux[i] + this_min - x[i];
                diff = use_mad ? fabsf(diff) : diff * diff;
                cur_error += weights[i] * diff;
            }
            if (cur_error < best_error) {
                memcpy(L, Laux, (size_t)n);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

/* Pack 256 levels (0..3) four to a byte: element 128n + 32j + l goes to bits 2j of qs[32n + l]. */
static void pack_2bit(const uint8_t *L, uint8_t *qs) {
    for (int n = 0; n < 2; n++) {
        for (int l = 0; l < 32; l++) {
            const uint8_t *p = L + 128 * n + l;
            qs[32 * n + l] = (uint8_t)(p[0] | (p[32] << 2) | (p[64] << 4) | (p[96] << 6));
        }
    }
}

/* Q4_K / Q5_K: store 8 six-bit scales and mins in the 12-byte packing (see kquants.h). */
static void pack_k4_scales(const uint8_t ls[8], const uint8_t lm[8], uint8_t *b) {
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            b[j] = ls[j];
            b[j + 4] = lm[j];
        } else {
            b[j + 4] = (uint8_t)((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
            b[j - 4] |= (uint8_t)((ls[j] >> 4) << 6);
            b[j] |= (uint8_t)((lm[j] >> 4) << 6);
        }
    }
}

/* ---- Q2_K -------------------------------------------------------------------------------- */

static void quantize_row_q2_K_ref(const float *restrict x, void *restrict vy, int64_t n) {
    pg_block_q2_K *y = vy;
    const float q4scale = 15.f;
    for (int64_t i = 0; i < n / PG_QK_K; i++, x += PG_QK_K) {
        uint8_t L[PG_QK_K], Laux[16];
        float weights[16], mins[16], scales[16];
        float max_scale = 0, max_min = 0;
        for (int j = 0; j < 16; j++) {
            for (int l = 0; l < 16; l++) weights[l] = fabsf(x[16 * j + l]);
            scales[j] = make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux,
                                         -0.5f, 0.1f, 15, 1);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        if (max_scale > 0) {
            const float iscale = q4scale / max_scale;
            for (int j = 0; j < 16; j++) y[i].scales[j] = (uint8_t)nearest_int(iscale * scales[j]);
            y[i].d = pg_fp32_to_fp16(max_scale / q4scale);
        } else {
            memset(y[i].scales, 0, 16);
            y[i].d = pg_fp32_to_fp16(0.f);
        }
        if (max_min > 0) {
            const float iscale = q4scale / max_min;
            for (int j = 0; j < 16; j++) {
                /* unsigned shift: garbage levels from non-finite scales may be negative */
                y[i].scales[j] |= (uint8_t)((unsigned)nearest_int(iscale * mins[j]) << 4);
            }
            y[i].dmin = pg_fp32_to_fp16(max_min / q4scale);
        } else {
            y[i].dmin = pg_fp32_to_fp16(0.f);
        }
        for (int j = 0; j < 16; j++) {
            const float d = pg_fp16_to_fp32(y[i].d) * (float)(y[i].scales[j] & 0xF);
            if (d == 0) continue;
            const float dm = pg_fp16_to_fp32(y[i].dmin) * (float)(y[i].scales[j] >> 4);
            for (int l = 0; l < 16; l++) {
                L[16 * j + l] = (uint8_t)clampi(nearest_int((x[16 * j + l] + dm) / d), 0, 3);
            }
        }
        pack_2bit(L, y[i].qs);
    }
}

static void dequantize_row_q2_K(const void *restrict vx, float *restrict y, int64_t n) {
    const pg_block_q2_K *x = vx;
    for (int64_t i = 0; i < n / PG_QK_K; i++, y += PG_QK_K) {
        const float d = pg_fp16_to_fp32(x[i].d), dmin = pg_fp16_to_fp32(x[i].dmin);
        for (int k = 0; k < 16; k++) {       /* sub-block of 16: e = 16k + t */
            const uint8_t sc = x[i].scales[k];
            const float dl = d * (float)(sc & 0xF), ml = dmin * (float)(sc >> 4);
            const int nn = k / 8, j = (k % 8) / 2, l0 = 16 * (k % 2);
            for (int t = 0; t < 16; t++) {
                const int q = (x[i].qs[32 * nn + l0 + t] >> (2 * j)) & 3;
                y[16 * k + t] = dl * (float)q - ml;
            }
        }
    }
}

/* ---- Q3_K -------------------------------------------------------------------------------- */

static void quantize_row_q3_K_ref(const float *restrict x, void *restrict vy, int64_t n) {
    pg_block_q3_K *y = vy;
    for (int64_t i = 0; i < n / PG_QK_K; i++, x += PG_QK_K) {
        int8_t L[PG_QK_K];
        float scales[16];
        float max_scale = 0, amax = 0;
        for (int j = 0; j < 16; j++) {
            scales[j] = make_q3_quants(16, 4, x + 16 * j, L + 16 * j);
            const float scale = fabsf(scales[j]);
            if (scale > amax) { amax = scale; max_scale = scales[j]; }
        }
        memset(y[i].scales, 0, 12);
        if (max_scale != 0) {
            const float iscale = -32.f / max_scale;
            for (int j = 0; j < 16; j++) {
                int8_t l = (int8_t)nearest_int(iscale * scales[j]);
                l = (int8_t)(clampi(l, -32, 31) + 32);
                if (j < 8) y[i].scales[j] = (uint8_t)(l & 0xF);
                else y[i].scales[j - 8] |= (uint8_t)((l & 0xF) << 4);
                l = (int8_t)(l >> 4);
                y[i].scales[j % 4 + 8] |= (uint8_t)(l << (2 * (j / 4)));
            }
            y[i].d = pg_fp32_to_fp16(1 / iscale);
        } else {
            y[i].d = pg_fp32_to_fp16(0.f);
        }
        for (int j = 0; j < 16; j++) {
            int sc = j < 8 ? y[i].scales[j] & 0xF : y[i].scales[j - 8] >> 4;
            sc = (sc | (((y[i].scales[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32;
            const float d = pg_fp16_to_fp32(y[i].d) * (float)sc;
            if (d == 0) continue;
            for (int l = 0; l < 16; l++) {
                L[16 * j + l] = (int8_t)(clampi(nearest_int(x[16 * j + l] / d), -4, 3) + 4);
            }
        }
        /* high bit of element e goes to bit e/32 of hmask[e%32]; the low 2 bits like Q2_K */
        memset(y[i].hmask, 0, 32);
        uint8_t L2[PG_QK_K];
        for (int e = 0; e < PG_QK_K; e++) {
            const int l = L[e];
            if (l > 3) y[i].hmask[e % 32] |= (uint8_t)(1u << (e / 32));
            L2[e] = (uint8_t)(l > 3 ? l - 4 : l);
        }
        pack_2bit(L2, y[i].qs);
    }
}

static void dequantize_row_q3_K(const void *restrict vx, float *restrict y, int64_t n) {
    const pg_block_q3_K *x = vx;
    for (int64_t i = 0; i < n / PG_QK_K; i++, y += PG_QK_K) {
        const float d = pg_fp16_to_fp32(x[i].d);
        int8_t sc[16];
        pg_k3_unpack_scales(x[i].scales, sc);
        for (int k = 0; k < 16; k++) {
            const float dl = d * (float)sc[k];
            const int nn = k / 8, j = (k % 8) / 2, l0 = 16 * (k % 2);
            for (int t = 0; t < 16; t++) {
                const int l = l0 + t;
                const int q2 = (x[i].qs[32 * nn + l] >> (2 * j)) & 3;
                const int h = (x[i].hmask[l] >> (4 * nn + j)) & 1;
                y[16 * k + t] = dl * (float)(q2 - (h ? 0 : 4));
            }
        }
    }
}

/* ---- Q4_K / Q5_K ------------------------------------------------------------------------- */

/* The part Q4_K and Q5_K share: per sub-block of 32, weights av_x + |x|, make_qkx2_quants, then
 * 6-bit scales and mins, then requantization of every value with the rounded scales. */
static void quantize_k4_common(const float *x, int nmax, float rmin, float rdelta, int nstep,
                               uint16_t *d_out, uint16_t *dmin_out, uint8_t *scales_out,
                               uint8_t L[PG_QK_K]) {
    uint8_t Laux[32];
    float weights[32], mins[8], scales[8];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += x[32 * j + l] * x[32 * j + l];
        const float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) weights[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux,
                                     rmin, rdelta, nstep, 0);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    uint8_t ls[8], lm[8];
    for (int j = 0; j < 8; j++) {
        ls[j] = (uint8_t)nearest_int(inv_scale * scales[j]);
        lm[j] = (uint8_t)nearest_int(inv_min * mins[j]);
        if (ls[j] > 63) ls[j] = 63;
        if (lm[j] > 63) lm[j] = 63;
    }
    pack_k4_scales(ls, lm, scales_out);
    *d_out = pg_fp32_to_fp16(max_scale / 63.f);
    *dmin_out = pg_fp32_to_fp16(max_min / 63.f);
    for (int j = 0; j < 8; j++) {
        const float d = pg_fp16_to_fp32(*d_out) * (float)ls[j];
        if (d == 0) continue;
        const float dm = pg_fp16_to_fp32(*dmin_out) * (float)lm[j];
        for (int l = 0; l < 32; l++) {
            L[32 * j + l] = (uint8_t)clampi(nearest_int((x[32 * j + l] + dm) / d), 0, nmax);
        }
    }
}

static void quantize_row_q4_K_ref(const float *restrict x, void *restrict vy, int64_t n) {
    pg_block_q4_K *y = vy;
    for (int64_t i = 0; i < n / PG_QK_K; i++, x += PG_QK_K) {
        uint8_t L[PG_QK_K];
        quantize_k4_common(x, 15, -1.f, 0.1f, 20, &y[i].d, &y[i].dmin, y[i].scales, L);
        for (int c = 0; c < 4; c++) {
            for (int l = 0; l < 32; l++) {
                y[i].qs[32 * c + l] = (uint8_t)(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
            }
        }
    }
}

static void dequantize_row_q4_K(const void *restrict vx, float *restrict y, int64_t n) {
    const pg_block_q4_K *x = vx;
    for (int64_t i = 0; i < n / PG_QK_K; i++, y += PG_QK_K) {
        const float d = pg_fp16_to_fp32(x[i].d), dmin = pg_fp16_to_fp32(x[i].dmin);
        uint8_t sm[16];
        pg_k4_unpack_scales(x[i].scales, sm);
        for (int c = 0; c < 4; c++) {
            const float d1 = d * (float)sm[2 * c], m1 = dmin * (float)sm[8 + 2 * c];
            const float d2 = d * (float)sm[2 * c + 1], m2 = dmin * (float)sm[8 + 2 * c + 1];
            const uint8_t *q = x[i].qs + 32 * c;
            for (int l = 0; l < 32; l++) y[64 * c + l] = d1 * (float)(q[l] & 0xF) - m1;
            for (int l = 0; l < 32; l++) y[64 * c + 32 + l] = d2 * (float)(q[l] >> 4) - m2;
        }
    }
}

static void quantize_row_q5_K_ref(const float *restrict x, void *restrict vy, int64_t n) {
    pg_block_q5_K *y = vy;
    for (int64_t i = 0; i < n / PG_QK_K; i++, x += PG_QK_K) {
        uint8_t L[PG_QK_K];
        quantize_k4_common(x, 31, -0.5f, 0.1f, 15, &y[i].d, &y[i].dmin, y[i].scales, L);
        memset(y[i].qh, 0, 32);
        for (int c = 0; c < 4; c++) {
            for (int l = 0; l < 32; l++) {
                const int l1 = L[64 * c + l], l2 = L[64 * c + 32 + l];
                y[i].qh[l] |= (uint8_t)(((l1 >> 4) << (2 * c)) | ((l2 >> 4) << (2 * c + 1)));
                y[i].qs[32 * c + l] = (uint8_t)((l1 & 0xF) | ((l2 & 0xF) << 4));
            }
        }
    }
}

static void dequantize_row_q5_K(const void *restrict vx, float *restrict y, int64_t n) {
    const pg_block_q5_K *x = vx;
    for (int64_t i = 0; i < n / PG_QK_K; i++, y += PG_QK_K) {
        const float d = pg_fp16_to_fp32(x[i].d), dmin = pg_fp16_to_fp32(x[i].dmin);
        uint8_t sm[16];
        pg_k4_unpack_scales(x[i].scales, sm);
        for (int c = 0; c < 4; c++) {
            const float d1 = d * (float)sm[2 * c], m1 = dmin * (float)sm[8 + 2 * c];
            const float d2 = d * (float)sm[2 * c + 1], m2 = dmin * (float)sm[8 + 2 * c + 1];
            const uint8_t *q = x[i].qs + 32 * c;
            for (int l = 0; l < 32; l++) {
                const int q1 = (q[l] & 0xF) | (((x[i].qh[l] >> (2 * c)) & 1) << 4);
                const int q2 = (q[l] >> 4) | (((x[i].qh[l] >> (2 * c + 1)) & 1) << 4);
                y[64 * c + l] = d1 * (float)q1 - m1;
                y[64 * c + 32 + l] = d2 * (float)q2 - m2;
            }
        }
    }
}

/* ---- Q6_K -------------------------------------------------------------------------------- */

static void quantize_row_q6_K_ref(const float *restrict x, void *restrict vy, int64_t n) {
    pg_block_q6_K *y = vy;
    for (int64_t i = 0; i < n / PG_QK_K; i++, x += PG_QK_K) {
        int8_t L[PG_QK_K];
        float scales[16];
        float max_scale = 0, max_abs_scale = 0;
        for (int ib = 0; ib < 16; ib++) {
            scales[ib] = make_qx_quants_x2(16, 32, x + 16 * ib, L + 16 * ib);
            const float abs_scale = fabsf(scales[ib]);
            if (abs_scale > max_abs_scale) { max_abs_scale = abs_scale; max_scale = scales[ib]; }
        }
        if (max_abs_scale < GROUP_MAX_EPS) {
            memset(&y[i], 0, sizeof(y[i]));
            continue;
        }
        const float iscale = -128.f / max_scale;
        y[i].d = pg_fp32_to_fp16(1 / iscale);
        for (int ib = 0; ib < 16; ib++) {
            const int v = nearest_int(iscale * scales[ib]);
            y[i].scales[ib] = (int8_t)(v < 127 ? v : 127);
        }
        for (int j = 0; j < 16; j++) {
            const float d = pg_fp16_to_fp32(y[i].d) * (float)y[i].scales[j];
            if (d == 0) continue;
            for (int l = 0; l < 16; l++) {
                L[16 * j + l] = (int8_t)(clampi(nearest_int(x[16 * j + l] / d), -32, 31) + 32);
            }
        }
        for (int nn = 0; nn < 2; nn++) {
            uint8_t *ql = y[i].ql + 64 * nn, *qh = y[i].qh + 32 * nn;
            const uint8_t *p = (const uint8_t *)L + 128 * nn;
            for (int l = 0; l < 32; l++) {
                ql[l] = (uint8_t)((p[l] & 0xF) | ((p[l + 64] & 0xF) << 4));
                ql[l + 32] = (uint8_t)((p[l + 32] & 0xF) | ((p[l + 96] & 0xF) << 4));
                qh[l] = (uint8_t)((p[l] >> 4) | ((p[l + 32] >> 4) << 2) | ((p[l + 64] >> 4) << 4) |
                                  ((p[l + 96] >> 4) << 6));
            }
        }
    }
}

static void dequantize_row_q6_K(const void *restrict vx, float *restrict y, int64_t n) {
    const pg_block_q6_K *x = vx;
    for (int64_t i = 0; i < n / PG_QK_K; i++, y += PG_QK_K) {
        const float d = pg_fp16_to_fp32(x[i].d);
        for (int nn = 0; nn < 2; nn++) {
            const uint8_t *ql = x[i].ql + 64 * nn, *qh = x[i].qh + 32 * nn;
            const int8_t *sc = x[i].scales + 8 * nn;
            float *yy = y + 128 * nn;
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                yy[l] = d * (float)sc[is] * (float)q1;
                yy[l + 32] = d * (float)sc[is + 2] * (float)q2;
                yy[l + 64] = d * (float)sc[is + 4] * (float)q3;
                yy[l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
        }
    }
}

/* ---- Q8_K (activations) ------------------------------------------------------------------ */

static void quantize_row_q8_K_ref(const float *restrict x, void *restrict vy, int64_t n) {
    pg_block_q8_K *y = vy;
    for (int64_t i = 0; i < n / PG_QK_K; i++, x += PG_QK_K) {
        float max = 0, amax = 0;
        for (int j = 0; j < PG_QK_K; j++) {
            const float ax = fabsf(x[j]);
            if (ax > amax) { amax = ax; max = x[j]; }
        }
        if (amax == 0) {
            memset(&y[i], 0, sizeof(y[i]));
            continue;
        }
        const float iscale = -127.f / max;
        for (int j = 0; j < PG_QK_K; j++) {
            const int v = nearest_int(iscale * x[j]);
            y[i].qs[j] = (int8_t)(v < 127 ? v : 127);
        }
        for (int k = 0; k < 16; k++) {
            int sum = 0;
            for (int t = 0; t < 16; t++) sum += y[i].qs[16 * k + t];
            y[i].bsums[k] = (int16_t)sum;
        }
        y[i].d = 1 / iscale;
    }
}

static void dequantize_row_q8_K(const void *restrict vx, float *restrict y, int64_t n) {
    const pg_block_q8_K *x = vx;
    for (int64_t i = 0; i < n / PG_QK_K; i++, y += PG_QK_K) {
        for (int j = 0; j < PG_QK_K; j++) y[j] = x[i].d * (float)x[i].qs[j];
    }
}

/* ---- dot products with Q8_K -------------------------------------------------------------- */
/* Each kernel decodes a weight block into int8 levels q[256] and per-16 scales, forms exact
 * int32 sums, and does one fp32 multiply-add per super-block (two with a min term). */

/* Σ_k scale[k] · Σ_{t<16} q[16k+t]·a[16k+t] over the 16 groups of 16. */
static inline int32_t dot_groups16(const int8_t *q, const int8_t *a, const int16_t *scale) {
    int32_t sum = 0;
    for (int k = 0; k < 16; k++) {
        int32_t s = 0;
        for (int t = 0; t < 16; t++) s += (int32_t)q[16 * k + t] * a[16 * k + t];
        sum += scale[k] * s;
    }
    return sum;
}

static void vec_dot_q2_K_q8_K(int64_t n, float *restrict s, const void *restrict vx,
                              const void *restrict vy) {
    const pg_block_q2_K *x = vx;
    const pg_block_q8_K *y = vy;
    float sumf = 0;
    for (int64_t i = 0; i < n / PG_QK_K; i++) {
        int8_t q[PG_QK_K];
        int16_t sc[16];
        int32_t summs = 0;
        for (int nn = 0; nn < 2; nn++) {
            for (int j = 0; j < 4; j++) {
                for (int l = 0; l < 32; l++) {
                    q[128 * nn + 32 * j + l] = (int8_t)((x[i].qs[32 * nn + l] >> (2 * j)) & 3);
                }
            }
        }
        for (int k = 0; k < 16; k++) {
            sc[k] = x[i].scales[k] & 0xF;
            summs += (x[i].scales[k] >> 4) * y[i].bsums[k];
        }
        const int32_t isum = dot_groups16(q, y[i].qs, sc);
        const float dall = y[i].d * pg_fp16_to_fp32(x[i].d);
        const float dmin = y[i].d * pg_fp16_to_fp32(x[i].dmin);
        sumf += dall * (float)isum - dmin * (float)summs;
    }
    *s = sumf;
}

static void vec_dot_q3_K_q8_K(int64_t n, float *restrict s, const void *restrict vx,
                              const void *restrict vy) {
    const pg_block_q3_K *x = vx;
    const pg_block_q8_K *y = vy;
    float sumf = 0;
    for (int64_t i = 0; i < n / PG_QK_K; i++) {
        int8_t q[PG_QK_K], sc8[16];
        int16_t sc[16];
        for (int nn = 0; nn < 2; nn++) {
            for (int j = 0; j < 4; j++) {
                for (int l = 0; l < 32; l++) {
                    const int q2 = (x[i].qs[32 * nn + l] >> (2 * j)) & 3;
                    const int h = (x[i].hmask[l] >> (4 * nn + j)) & 1;
                    q[128 * nn + 32 * j + l] = (int8_t)(q2 - 4 + 4 * h);
                }
            }
        }
        pg_k3_unpack_scales(x[i].scales, sc8);
        for (int k = 0; k < 16; k++) sc[k] = sc8[k];
        const int32_t isum = dot_groups16(q, y[i].qs, sc);
        sumf += (pg_fp16_to_fp32(x[i].d) * y[i].d) * (float)isum;
    }
    *s = sumf;
}

/* Q4_K and Q5_K once the levels are decoded: 8 scales over groups of 32 = 16 groups of 16. */
static inline float dot_k4_block(const int8_t *q, const uint8_t sm[16], uint16_t d16,
                                 uint16_t dmin16, const pg_block_q8_K *y) {
    int16_t sc[16];
    int32_t summs = 0;
    for (int j = 0; j < 8; j++) {
        sc[2 * j] = sc[2 * j + 1] = sm[j];
        summs += sm[8 + j] * (y->bsums[2 * j] + y->bsums[2 * j + 1]);
    }
    const int32_t isum = dot_groups16(q, y->qs, sc);
    const float d = y->d * pg_fp16_to_fp32(d16);
    const float dmin = y->d * pg_fp16_to_fp32(dmin16);
    return d * (float)isum - dmin * (float)summs;
}

static void vec_dot_q4_K_q8_K(int64_t n, float *restrict s, const void *restrict vx,
                              const void *restrict vy) {
    const pg_block_q4_K *x = vx;
    const pg_block_q8_K *y = vy;
    float sumf = 0;
    for (int64_t i = 0; i < n / PG_QK_K; i++) {
        int8_t q[PG_QK_K];
        uint8_t sm[16];
        for (int c = 0; c < 4; c++) {
            for (int l = 0; l < 32; l++) {
                q[64 * c + l] = (int8_t)(x[i].qs[32 * c + l] & 0xF);
                q[64 * c + 32 + l] = (int8_t)(x[i].qs[32 * c + l] >> 4);
            }
        }
        pg_k4_unpack_scales(x[i].scales, sm);
        sumf += dot_k4_block(q, sm, x[i].d, x[i].dmin, &y[i]);
    }
    *s = sumf;
}

static void vec_dot_q5_K_q8_K(int64_t n, float *restrict s, const void *restrict vx,
                              const void *restrict vy) {
    const pg_block_q5_K *x = vx;
    const pg_block_q8_K *y = vy;
    float sumf = 0;
    for (int64_t i = 0; i < n / PG_QK_K; i++) {
        int8_t q[PG_QK_K];
        uint8_t sm[16];
        for (int c = 0; c < 4; c++) {
            for (int l = 0; l < 32; l++) {
                const int h = x[i].qh[l] >> (2 * c);
                q[64 * c + l] = (int8_t)((x[i].qs[32 * c + l] & 0xF) | ((h & 1) << 4));
                q[64 * c + 32 + l] = (int8_t)((x[i].qs[32 * c + l] >> 4) | ((h & 2) << 3));
            }
        }
        pg_k4_unpack_scales(x[i].scales, sm);
        sumf += dot_k4_block(q, sm, x[i].d, x[i].dmin, &y[i]);
    }
    *s = sumf;
}

static void vec_dot_q6_K_q8_K(int64_t n, float *restrict s, const void *restrict vx,
                              const void *restrict vy) {
    const pg_block_q6_K *x = vx;
    const pg_block_q8_K *y = vy;
    float sumf = 0;
    for (int64_t i = 0; i < n / PG_QK_K; i++) {
        int8_t q[PG_QK_K];
        int16_t sc[16];
        for (int nn = 0; nn < 2; nn++) {
            const uint8_t *ql = x[i].ql + 64 * nn, *qh = x[i].qh + 32 * nn;
            int8_t *qq = q + 128 * nn;
            for (int l = 0; l < 32; l++) {
                qq[l] = (int8_t)(((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32);
                qq[l + 32] = (int8_t)(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
                qq[l + 64] = (int8_t)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                qq[l + 96] = (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
            }
        }
        for (int k = 0; k < 16; k++) sc[k] = x[i].scales[k];
        const int32_t isum = dot_groups16(q, y[i].qs, sc);
        sumf += (pg_fp16_to_fp32(x[i].d) * y[i].d) * (float)isum;
    }
    *s = sumf;
}

/* ---- traits ------------------------------------------------------------------------------ */

void pg_fill_kquants_scalar(pg_type_traits *tbl) {
    static const struct {
        int32_t type, type_size;
        pg_to_float_fn to_float;
        pg_from_float_fn from_float;
        pg_vec_dot_fn vec_dot;
    } k[] = {
        {PG_TYPE_Q2_K, sizeof(pg_block_q2_K), dequantize_row_q2_K, quantize_row_q2_K_ref,
         vec_dot_q2_K_q8_K},
        {PG_TYPE_Q3_K, sizeof(pg_block_q3_K), dequantize_row_q3_K, quantize_row_q3_K_ref,
         vec_dot_q3_K_q8_K},
        {PG_TYPE_Q4_K, sizeof(pg_block_q4_K), dequantize_row_q4_K, quantize_row_q4_K_ref,
         vec_dot_q4_K_q8_K},
        {PG_TYPE_Q5_K, sizeof(pg_block_q5_K), dequantize_row_q5_K, quantize_row_q5_K_ref,
         vec_dot_q5_K_q8_K},
        {PG_TYPE_Q6_K, sizeof(pg_block_q6_K), dequantize_row_q6_K, quantize_row_q6_K_ref,
         vec_dot_q6_K_q8_K},
        {PG_TYPE_Q8_K, sizeof(pg_block_q8_K), dequantize_row_q8_K, quantize_row_q8_K_ref, NULL},
    };
    for (size_t i = 0; i < sizeof(k) / sizeof(k[0]); i++) {
        pg_type_traits *t = &tbl[k[i].type];
        t->block_size = PG_QK_K;
        t->type_size = k[i].type_size;
        t->to_float = k[i].to_float;
        t->from_float_ref = k[i].from_float;
        t->from_float = k[i].from_float;
        t->vec_dot = k[i].vec_dot;
        t->vec_dot_type = PG_TYPE_Q8_K;
    }
}
