/* Legacy (32-element) formats and the plain float types: scalar reference kernels.
 *
 * These are the references every other path is tested against:
 *   - dequantize: each value is (float)q * d (or (float)q * d + m), one rounding per operation,
 *     no fused multiply-add (the build uses -std=c11, so the compiler does not contract);
 *   - quantize (from_float_ref): bit-exact with gguf.quants / ggml's quantize_row_*_ref
 *     (docs/FORMATS.md §2.5, §2.6);
 *   - dot products: ggml's generic formulas (§2.4), integer block sums, then per-block float
 *     scaling accumulated left to right; the float types accumulate in double.
 * Out-of-range inputs (non-finite values, blocks whose 1/d overflows) never reach an undefined
 * float-to-int conversion: quantized values are clamped to the format's range (ggml's C is
 * undefined there, so no reference exists to match). */
#include <math.h>

#include "quants.h"
#include "quants_legacy.h"

/* float -> integer for the quantizers, clamped so non-finite input stays defined.
 * For in-range finite values these equal C's (int)roundf(v) and (int)v exactly. */
static inline int8_t round_away_i8(float v) {
    const float r = roundf(v);
    if (r >= 127.0f) return 127;
    if (r <= -128.0f) return -128;
    if (r != r) return 0;
    return (int8_t)r;
}

static inline uint8_t trunc_clamp_u8(float v, int maxq) {
    if (!(v >= 0.0f)) return 0;   /* also NaN */
    if (v >= (float)maxq) return (uint8_t)maxq;
    return (uint8_t)v;
}

/* ---- plain float types ------------------------------------------------------------------- */

static void f32_to_float(const void *restrict x, float *restrict y, int64_t n) {
    memcpy(y, x, (size_t)n * sizeof(float));
}

static void f32_from_float(const float *restrict x, void *restrict y, int64_t n) {
    memcpy(y, x, (size_t)n * sizeof(float));
}

static void f16_to_float(const void *restrict vx, float *restrict y, int64_t n) {
    const pg_fp16 *x = vx;
    for (int64_t i = 0; i < n; i++) y[i] = pg_fp16_to_fp32(x[i]);
}

static void f16_from_float(const float *restrict x, void *restrict vy, int64_t n) {
    pg_fp16 *y = vy;
    for (int64_t i = 0; i < n; i++) y[i] = pg_fp32_to_fp16(x[i]);
}

static void bf16_to_float(const void *restrict vx, float *restrict y, int64_t n) {
    const pg_bf16 *x = vx;
    for (int64_t i = 0; i < n; i++) y[i] = pg_bf16_to_fp32(x[i]);
}

static void bf16_from_float(const float *restrict x, void *restrict vy, int64_t n) {
    pg_bf16 *y = vy;
    for (int64_t i = 0; i < n; i++) y[i] = pg_fp32_to_bf16(x[i]);
}

/* Each product is computed in fp32 (exact for f16*f16 and bf16*bf16), summed in double. */
static void vec_dot_f32(int64_t n, float *restrict s, const void *restrict vx,
                        const void *restrict vy) {
    const float *x = vx, *y = vy;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += (double)(x[i] * y[i]);
    *s = (float)sum;
}

static void vec_dot_f16(int64_t n, float *restrict s, const void *restrict vx,
                        const void *restrict vy) {
    const pg_fp16 *x = vx, *y = vy;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += (double)(pg_fp16_to_fp32(x[i]) * pg_fp16_to_fp32(y[i]));
    *s = (float)sum;
}

static void vec_dot_bf16(int64_t n, float *restrict s, const void *restrict vx,
                         const void *restrict vy) {
    const pg_bf16 *x = vx, *y = vy;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += (double)(pg_bf16_to_fp32(x[i]) * pg_bf16_to_fp32(y[i]));
    *s = (float)sum;
}

/* ---- dequantize -------------------------------------------------------------------------- */

static void q4_0_to_float(const void *restrict vx, float *restrict y, int64_t n) {
    const pg_block_q4_0 *x = vx;
    for (int64_t b = 0; b < n / PG_QK32; b++, y += PG_QK32) {
        const float d = pg_fp16_to_fp32(x[b].d);
        for (int j = 0; j < 16; j++) {
            y[j] = (float)((x[b].qs[j] & 0xF) - 8) * d;
            y[j + 16] = (float)((x[b].qs[j] >> 4) - 8) * d;
        }
    }
}

static void q4_1_to_float(const void *restrict vx, float *restrict y, int64_t n) {
    const pg_block_q4_1 *x = vx;
    for (int64_t b = 0; b < n / PG_QK32; b++, y += PG_QK32) {
        const float d = pg_fp16_to_fp32(x[b].d), m = pg_fp16_to_fp32(x[b].m);
        for (int j = 0; j < 16; j++) {
            y[j] = (float)(x[b].qs[j] & 0xF) * d + m;
            y[j + 16] = (float)(x[b].qs[j] >> 4) * d + m;
        }
    }
}

static void q5_0_to_float(const void *restrict vx, float *restrict y, int64_t n) {
    const pg_block_q5_0 *x = vx;
    for (int64_t b = 0; b < n / PG_QK32; b++, y += PG_QK32) {
        const float d = pg_fp16_to_fp32(x[b].d);
        const uint32_t qh = pg_load_qh(x[b].qh);
        for (int j = 0; j < 16; j++) {
            const int q0 = (x[b].qs[j] & 0xF) | (int)(((qh >> j) & 1) << 4);
            const int q1 = (x[b].qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            y[j] = (float)(q0 - 16) * d;
            y[j + 16] = (float)(q1 - 16) * d;
        }
    }
}

static void q5_1_to_float(const void *restrict vx, float *restrict y, int64_t n) {
    const pg_block_q5_1 *x = vx;
    for (int64_t b = 0; b < n / PG_QK32; b++, y += PG_QK32) {
        const float d = pg_fp16_to_fp32(x[b].d), m = pg_fp16_to_fp32(x[b].m);
        const uint32_t qh = pg_load_qh(x[b].qh);
        for (int j = 0; j < 16; j++) {
            const int q0 = (x[b].qs[j] & 0xF) | (int)(((qh >> j) & 1) << 4);
            const int q1 = (x[b].qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            y[j] = (float)q0 * d + m;
            y[j + 16] = (float)q1 * d + m;
        }
    }
}

static void q8_0_to_float(const void *restrict vx, float *restrict y, int64_t n) {
    const pg_block_q8_0 *x = vx;
    for (int64_t b = 0; b < n / PG_QK32; b++, y += PG_QK32) {
        const float d = pg_fp16_to_fp32(x[b].d);
        for (int j = 0; j < PG_QK32; j++) y[j] = (float)x[b].qs[j] * d;
    }
}

static void q8_1_to_float(const void *restrict vx, float *restrict y, int64_t n) {
    const pg_block_q8_1 *x = vx;
    for (int64_t b = 0; b < n / PG_QK32; b++, y += PG_QK32) {
        const float d = pg_fp16_to_fp32(x[b].d);
        for (int j = 0; j < PG_QK32; j++) y[j] = (float)x[b].qs[j] * d;
    }
}

/* ---- reference quantizers (bit-exact with gguf.quants) ----------------------------------- */

/* The signed value of largest magnitude (first one on ties), as ggml's Q4_0/Q5_0 quantizers. */
static float signed_absmax(const float *x) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < PG_QK32; j++) {
        if (amax < fabsf(x[j])) { amax = fabsf(x[j]); max = x[j]; }
    }
    return max;
}

static void q4_0_from_float_ref(const float *restrict x, void *restrict vy, int64_t n) {
    pg_block_q4_0 *y = vy;
    for (int64_t b = 0; b < n / PG_QK32; b++, x += PG_QK32) {
        const float d = signed_absmax(x) / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = pg_fp32_to_fp16(d);
        for (int j = 0; j < 16; j++) {
            const uint8_t q0 = trunc_clamp_u8(x[j] * id + 8.5f, 15);
            const uint8_t q1 = trunc_clamp_u8(x[j + 16] * id + 8.5f, 15);
            y[b].qs[j] = (uint8_t)(q0 | q1 << 4);
        }
    }
}

static void q4_1_from_float_ref(const float *restrict x, void *restrict vy, int64_t n) {
    pg_block_q4_1 *y = vy;
    for (int64_t b = 0; b < n / PG_QK32; b++, x += PG_QK32) {
        float min = x[0], max = x[0];
        for (int j = 1; j < PG_QK32; j++) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        const float d = (max - min) / 15.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = pg_fp32_to_fp16(d);
        y[b].m = pg_fp32_to_fp16(min);
        for (int j = 0; j < 16; j++) {
            const uint8_t q0 = trunc_clamp_u8((x[j] - min) * id + 0.5f, 15);
            const uint8_t q1 = trunc_clamp_u8((x[j + 16] - min) * id + 0.5f, 15);
            y[b].qs[j] = (uint8_t)(q0 | q1 << 4);
        }
    }
}

static void store_q5(uint8_t qs[16], uint8_t qh_out[4], const uint8_t q[32]) {
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)((q[j] & 0xF) | (q[j + 16] & 0xF) << 4);
        qh |= (uint32_t)(q[j] >> 4) << j;
        qh |= (uint32_t)(q[j + 16] >> 4) << (j + 16);
    }
    for (int k = 0; k < 4; k++) qh_out[k] = (uint8_t)(qh >> (8 * k));
}

static void q5_0_from_float_ref(const float *restrict x, void *restrict vy, int64_t n) {
    pg_block_q5_0 *y = vy;
    for (int64_t b = 0; b < n / PG_QK32; b++, x += PG_QK32) {
        const float d = signed_absmax(x) / -16.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint8_t q[PG_QK32];
        for (int j = 0; j < PG_QK32; j++) q[j] = trunc_clamp_u8(x[j] * id + 16.5f, 31);
        y[b].d = pg_fp32_to_fp16(d);
        store_q5(y[b].qs, y[b].qh, q);
    }
}

static void q5_1_from_float_ref(const float *restrict x, void *restrict vy, int64_t n) {
    pg_block_q5_1 *y = vy;
    for (int64_t b = 0; b < n / PG_QK32; b++, x += PG_QK32) {
        float min = x[0], max = x[0];
        for (int j = 1; j < PG_QK32; j++) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        const float d = (max - min) / 31.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint8_t q[PG_QK32];
        for (int j = 0; j < PG_QK32; j++) q[j] = trunc_clamp_u8((x[j] - min) * id + 0.5f, 31);
        y[b].d = pg_fp32_to_fp16(d);
        y[b].m = pg_fp32_to_fp16(min);
        store_q5(y[b].qs, y[b].qh, q);
    }
}

/* Q8_0 / Q8_1 reference (§2.5): d = amax/127, id = 1/d, q = roundf(x*id) (half away from 0). */
static void q8_0_from_float_ref(const float *restrict x, void *restrict vy, int64_t n) {
    pg_block_q8_0 *y = vy;
    for (int64_t b = 0; b < n / PG_QK32; b++, x += PG_QK32) {
        float amax = 0.0f;
        for (int j = 0; j < PG_QK32; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = pg_fp32_to_fp16(d);
        for (int j = 0; j < PG_QK32; j++) y[b].qs[j] = round_away_i8(x[j] * id);
    }
}

static void q8_1_from_float_ref(const float *restrict x, void *restrict vy, int64_t n) {
    pg_block_q8_1 *y = vy;
    for (int64_t b = 0; b < n / PG_QK32; b++, x += PG_QK32) {
        float amax = 0.0f;
        for (int j = 0; j < PG_QK32; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int j = 0; j < PG_QK32; j++) {
            y[b].qs[j] = round_away_i8(x[j] * id);
            sum += y[b].qs[j];
        }
        y[b].d = pg_fp32_to_fp16(d);
        y[b].s = pg_fp32_to_fp16((float)sum * d);
    }
}

/* ---- dot products (ggml's generic formulas, §2.4) ---------------------------------------- */

static void vec_dot_q4_0_q8_0(int64_t n, float *restrict s, const void *restrict vx,
                              const void *restrict vy) {
    const pg_block_q4_0 *x = vx;
    const pg_block_q8_0 *y = vy;
    float sumf = 0.0f;
    for (int64_t b = 0; b < n / PG_QK32; b++) {
        int sumi = 0;
        for (int j = 0; j < 16; j++) {
            sumi += ((x[b].qs[j] & 0xF) - 8) * y[b].qs[j];
            sumi += ((x[b].qs[j] >> 4) - 8) * y[b].qs[j + 16];
        }
        sumf += (float)sumi * pg_fp16_to_fp32(x[b].d) * pg_fp16_to_fp32(y[b].d);
    }
    *s = sumf;
}

static void vec_dot_q4_1_q8_1(int64_t n, float *restrict s, const void *restrict vx,
                              const void *restrict vy) {
    const pg_block_q4_1 *x = vx;
    const pg_block_q8_1 *y = vy;
    float sumf = 0.0f;
    for (int64_t b = 0; b < n / PG_QK32; b++) {
        int sumi = 0;
        for (int j = 0; j < 16; j++) {
            sumi += (x[b].qs[j] & 0xF) * y[b].qs[j];
            sumi += (x[b].qs[j] >> 4) * y[b].qs[j + 16];
        }
        const float dd = pg_fp16_to_fp32(x[b].d) * pg_fp16_to_fp32(y[b].d);
        sumf += dd * (float)sumi + pg_fp16_to_fp32(x[b].m) * pg_fp16_to_fp32(y[b].s);
    }
    *s = sumf;
}

static void vec_dot_q5_0_q8_0(int64_t n, float *restrict s, const void *restrict vx,
                              const void *restrict vy) {
    const pg_block_q5_0 *x = vx;
    const pg_block_q8_0 *y = vy;
    float sumf = 0.0f;
    for (int64_t b = 0; b < n / PG_QK32; b++) {
        const uint32_t qh = pg_load_qh(x[b].qh);
        int sumi = 0;
        for (int j = 0; j < 16; j++) {
            const int q0 = ((x[b].qs[j] & 0xF) | (int)(((qh >> j) & 1) << 4)) - 16;
            const int q1 = ((x[b].qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4)) - 16;
            sumi += q0 * y[b].qs[j] + q1 * y[b].qs[j + 16];
        }
        sumf += (float)sumi * pg_fp16_to_fp32(x[b].d) * pg_fp16_to_fp32(y[b].d);
    }
    *s = sumf;
}

static void vec_dot_q5_1_q8_1(int64_t n, float *restrict s, const void *restrict vx,
                              const void *restrict vy) {
    const pg_block_q5_1 *x = vx;
    const pg_block_q8_1 *y = vy;
    float sumf = 0.0f;
    for (int64_t b = 0; b < n / PG_QK32; b++) {
        const uint32_t qh = pg_load_qh(x[b].qh);
        int sumi = 0;
        for (int j = 0; j < 16; j++) {
            const int q0 = (x[b].qs[j] & 0xF) | (int)(((qh >> j) & 1) << 4);
            const int q1 = (x[b].qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            sumi += q0 * y[b].qs[j] + q1 * y[b].qs[j + 16];
        }
        const float dd = pg_fp16_to_fp32(x[b].d) * pg_fp16_to_fp32(y[b].d);
        sumf += dd * (float)sumi + pg_fp16_to_fp32(x[b].m) * pg_fp16_to_fp32(y[b].s);
    }
    *s = sumf;
}

static void vec_dot_q8_0_q8_0(int64_t n, float *restrict s, const void *restrict vx,
                              const void *restrict vy) {
    const pg_block_q8_0 *x = vx;
    const pg_block_q8_0 *y = vy;
    float sumf = 0.0f;
    for (int64_t b = 0; b < n / PG_QK32; b++) {
        int sumi = 0;
        for (int j = 0; j < PG_QK32; j++) sumi += x[b].qs[j] * y[b].qs[j];
        sumf += (float)sumi * (pg_fp16_to_fp32(x[b].d) * pg_fp16_to_fp32(y[b].d));
    }
    *s = sumf;
}

/* ---- table ------------------------------------------------------------------------------- */

static void set(pg_type_traits *t, int32_t block_size, int32_t type_size, pg_to_float_fn to_float,
                pg_from_float_fn ref, pg_from_float_fn fast, pg_vec_dot_fn dot, int32_t dot_type) {
    t->block_size = block_size;
    t->type_size = type_size;
    t->to_float = to_float;
    t->from_float_ref = ref;
    t->from_float = fast;
    t->vec_dot = dot;
    t->vec_dot_type = dot_type;
}

void pg_fill_legacy_scalar(pg_type_traits *tbl) {
    set(&tbl[PG_TYPE_F32], 1, 4, f32_to_float, f32_from_float, f32_from_float, vec_dot_f32,
        PG_TYPE_F32);
    set(&tbl[PG_TYPE_F16], 1, 2, f16_to_float, f16_from_float, f16_from_float, vec_dot_f16,
        PG_TYPE_F16);
    set(&tbl[PG_TYPE_BF16], 1, 2, bf16_to_float, bf16_from_float, bf16_from_float, vec_dot_bf16,
        PG_TYPE_BF16);
    set(&tbl[PG_TYPE_Q4_0], PG_QK32, sizeof(pg_block_q4_0), q4_0_to_float, q4_0_from_float_ref,
        q4_0_from_float_ref, vec_dot_q4_0_q8_0, PG_TYPE_Q8_0);
    set(&tbl[PG_TYPE_Q4_1], PG_QK32, sizeof(pg_block_q4_1), q4_1_to_float, q4_1_from_float_ref,
        q4_1_from_float_ref, vec_dot_q4_1_q8_1, PG_TYPE_Q8_1);
    set(&tbl[PG_TYPE_Q5_0], PG_QK32, sizeof(pg_block_q5_0), q5_0_to_float, q5_0_from_float_ref,
        q5_0_from_float_ref, vec_dot_q5_0_q8_0, PG_TYPE_Q8_0);
    set(&tbl[PG_TYPE_Q5_1], PG_QK32, sizeof(pg_block_q5_1), q5_1_to_float, q5_1_from_float_ref,
        q5_1_from_float_ref, vec_dot_q5_1_q8_1, PG_TYPE_Q8_1);
    set(&tbl[PG_TYPE_Q8_0], PG_QK32, sizeof(pg_block_q8_0), q8_0_to_float, q8_0_from_float_ref,
        q8_0_from_float_ref, vec_dot_q8_0_q8_0, PG_TYPE_Q8_0);
    /* Q8_1 is only ever an activation: no dot kernel of its own (as ggml). */
    set(&tbl[PG_TYPE_Q8_1], PG_QK32, sizeof(pg_block_q8_1), q8_1_to_float, q8_1_from_float_ref,
        q8_1_from_float_ref, NULL, PG_TYPE_Q8_1);
}
