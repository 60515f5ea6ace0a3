/* Legacy (32-element) formats and plain float types: NEON kernels (baseline Armv8-A).
 * When the CPU has the dot-product extension, the integer dots are replaced by the SDOT ones in
 * quants_legacy_dotprod.c (compiled with +dotprod, only called when the CPU reports it).
 *
 * Exactness contract with the scalar reference (quants_legacy.c), as on x86:
 *   - to_float: bit-exact (separate multiply and add, never fused);
 *   - from_float (Q8_0, Q8_1, F16): bit-exact for finite input. FCVTAS rounds to nearest with
 *     ties away from zero — exactly roundf — and id = 1/d as in the reference (ggml's NEON path
 *     rounds ties to even instead; docs/FORMATS.md §2.5);
 *   - vec_dot of the quantized formats: bit-exact (exact integer block sums, the reference's
 *     fp32 block terms added in block order; quants_legacy_neon.h), so a dot has the same bits
 *     on every path and in every gemm block. F16 dots convert to fp32 and accumulate in fp32
 *     (ggml uses fp16 FMA on CPUs with FP16 arithmetic). */
#include <arm_neon.h>

#include "quants.h"
#include "quants_legacy.h"
#include "quants_legacy_neon.h"

/* Σ q_i·a_i over one block's 32 int8 pairs as 4 int32 lanes, without the dot-product
 * extension: every product fits int16 (|−128·−128| = 16384), pairs are widened before adding. */
static inline int32x4_t dot32(int8x16_t q0, int8x16_t q1, const int8_t *a) {
    const int8x16_t b0 = vld1q_s8(a), b1 = vld1q_s8(a + 16);
    int32x4_t s = vpaddlq_s16(vmull_s8(vget_low_s8(q0), vget_low_s8(b0)));
    s = vpadalq_s16(s, vmull_high_s8(q0, b0));
    s = vpadalq_s16(s, vmull_s8(vget_low_s8(q1), vget_low_s8(b1)));
    return vpadalq_s16(s, vmull_high_s8(q1, b1));
}

PG_NEON_DOT_Q8_0(vec_dot_q4_0_q8_0, pg_block_q4_0, q4_0_values, dot32, 0)
PG_NEON_DOT_Q8_0(vec_dot_q5_0_q8_0, pg_block_q5_0, q5_0_values, dot32, 0)
PG_NEON_DOT_Q8_0(vec_dot_q8_0_q8_0, pg_block_q8_0, q8_0_values, dot32, 1)
PG_NEON_DOT_Q8_1(vec_dot_q4_1_q8_1, pg_block_q4_1, q4_1_values, dot32)
PG_NEON_DOT_Q8_1(vec_dot_q5_1_q8_1, pg_block_q5_1, q5_1_values, dot32)

/* ---- float types --------------------------------------------------------------------------- */

static inline float32x4_t load_f32(const float *p) { return vld1q_f32(p); }
static inline float32x4_t load_f16(const pg_fp16 *p) {
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)));
}
static inline float32x4_t load_bf16(const pg_bf16 *p) {
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16));
}
typedef float f32_t;
typedef pg_fp16 f16_t;
typedef pg_bf16 bf16_t;
#define SCALAR_f32_t(v) (v)
#define SCALAR_f16_t(v) pg_fp16_to_fp32(v)
#define SCALAR_bf16_t(v) pg_bf16_to_fp32(v)

/* Four FMA chains of 4 lanes, 16 elements per step. */
#define PG_NEON_FLOAT_DOT(name, T, LOAD)                                                        \
    static void name(int64_t n, float *restrict s, const void *restrict vx,                     \
                     const void *restrict vy) {                                                 \
        const T *x = vx, *y = vy;                                                               \
        float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0;                          \
        int64_t i = 0;                                                                          \
        for (; i + 16 <= n; i += 16) {                                                          \
            a0 = vfmaq_f32(a0, LOAD(x + i), LOAD(y + i));                                       \
            a1 = vfmaq_f32(a1, LOAD(x + i + 4), LOAD(y + i + 4));                               \
            a2 = vfmaq_f32(a2, LOAD(x + i + 8), LOAD(y + i + 8));                               \
            a3 = vfmaq_f32(a3, LOAD(x + i + 12), LOAD(y + i + 12));                             \
        }                                                                                       \
        for (; i + 4 <= n; i += 4) a0 = vfmaq_f32(a0, LOAD(x + i), LOAD(y + i));                \
        float sum = vaddvq_f32(vaddq_f32(vaddq_f32(a0, a1), vaddq_f32(a2, a3)));                \
        for (; i < n; i++) sum += SCALAR_##T(x[i]) * SCALAR_##T(y[i]);                          \
        *s = sum;                                                                               \
    }

PG_NEON_FLOAT_DOT(vec_dot_f32, f32_t, load_f32)
PG_NEON_FLOAT_DOT(vec_dot_f16, f16_t, load_f16)
PG_NEON_FLOAT_DOT(vec_dot_bf16, bf16_t, load_bf16)

/* ---- activation quantizers ----------------------------------------------------------------- */

static inline float block_amax(const float *x) {
    float32x4_t m = vabsq_f32(vld1q_f32(x));
    for (int j = 4; j < PG_QK32; j += 4) m = vmaxq_f32(m, vabsq_f32(vld1q_f32(x + j)));
    return vmaxvq_f32(m);
}

/* 32 values times id, rounded half away from zero (FCVTAS), saturated to int8; *sum gets Σq. */
static inline void quantize_block_q8(const float *x, float id, int8_t *q, int *sum) {
    int16x8_t h[4];
    for (int k = 0; k < 4; k++) {
        const int32x4_t i0 = vcvtaq_s32_f32(vmulq_n_f32(vld1q_f32(x + 8 * k), id));
        const int32x4_t i1 = vcvtaq_s32_f32(vmulq_n_f32(vld1q_f32(x + 8 * k + 4), id));
        h[k] = vcombine_s16(vqmovn_s32(i0), vqmovn_s32(i1));
    }
    const int8x16_t q0 = vcombine_s8(vqmovn_s16(h[0]), vqmovn_s16(h[1]));
    const int8x16_t q1 = vcombine_s8(vqmovn_s16(h[2]), vqmovn_s16(h[3]));
    vst1q_s8(q, q0);
    vst1q_s8(q + 16, q1);
    if (sum) *sum = vaddlvq_s8(q0) + vaddlvq_s8(q1);
}

static void q8_0_from_float(const float *restrict x, void *restrict vy, int64_t n) {
    pg_block_q8_0 *y = vy;
    for (int64_t b = 0; b < n / PG_QK32; b++, x += PG_QK32) {
        const float d = block_amax(x) / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = pg_fp32_to_fp16(d);
        quantize_block_q8(x, id, y[b].qs, NULL);
    }
}

static void q8_1_from_float(const float *restrict x, void *restrict vy, int64_t n) {
    pg_block_q8_1 *y = vy;
    for (int64_t b = 0; b < n / PG_QK32; b++, x += PG_QK32) {
        const float d = block_amax(x) / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        int sum;
        quantize_block_q8(x, id, y[b].qs, &sum);
        y[b].d = pg_fp32_to_fp16(d);
        y[b].s = pg_fp32_to_fp16((float)sum * d);
    }
}

/* FCVTN rounds with the FPCR mode (nearest-even by default), like pg_fp32_to_fp16. */
static void f16_from_float(const float *restrict x, void *restrict vy, int64_t n) {
    pg_fp16 *y = vy;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        vst1_u16(y + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(x + i))));
    for (; i < n; i++) y[i] = pg_fp32_to_fp16(x[i]);
}

/* ---- dequantize (bit-exact) ---------------------------------------------------------------- */

/* 16 signed bytes -> 16 floats (q·d, or q·d + m when add_m). */
static inline void store_i8x16(float *y, int8x16_t q, float d, float m, int add_m) {
    const int16x8_t h0 = vmovl_s8(vget_low_s8(q)), h1 = vmovl_high_s8(q);
    const int32x4_t v[4] = {vmovl_s16(vget_low_s16(h0)), vmovl_high_s16(h0),
                            vmovl_s16(vget_low_s16(h1)), vmovl_high_s16(h1)};
    for (int k = 0; k < 4; k++) {
        float32x4_t f = vmulq_n_f32(vcvtq_f32_s32(v[k]), d);
        if (add_m) f = vaddq_f32(f, vdupq_n_f32(m));
        vst1q_f32(y + 4 * k, f);
    }
}

#define PG_NEON_TO_FLOAT(name, XT, VALUES, HAS_M)                                               \
    static void name(const void *restrict vx, float *restrict y, int64_t n) {                   \
        const XT *x = vx;                                                                       \
        for (int64_t b = 0; b < n / PG_QK32; b++, y += PG_QK32) {                               \
            int8x16_t q0, q1;                                                                   \
            VALUES(&x[b], &q0, &q1);                                                            \
            const float d = h2f(x[b].d), m = HAS_M ? h2f(((const pg_fp16 *)&x[b])[1]) : 0.0f;   \
            store_i8x16(y, q0, d, m, HAS_M);                                                    \
            store_i8x16(y + 16, q1, d, m, HAS_M);                                               \
        }                                                                                       \
    }

PG_NEON_TO_FLOAT(q4_0_to_float, pg_block_q4_0, q4_0_values, 0)
PG_NEON_TO_FLOAT(q4_1_to_float, pg_block_q4_1, q4_1_values, 1)
PG_NEON_TO_FLOAT(q5_0_to_float, pg_block_q5_0, q5_0_values, 0)
PG_NEON_TO_FLOAT(q5_1_to_float, pg_block_q5_1, q5_1_values, 1)
PG_NEON_TO_FLOAT(q8_0_to_float, pg_block_q8_0, q8_0_values, 0)
PG_NEON_TO_FLOAT(q8_1_to_float, pg_block_q8_1, q8_1_values, 0)

static void f16_to_float(const void *restrict vx, float *restrict y, int64_t n) {
    const pg_fp16 *x = vx;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, load_f16(x + i));
    for (; i < n; i++) y[i] = pg_fp16_to_fp32(x[i]);
}

static void bf16_to_float(const void *restrict vx, float *restrict y, int64_t n) {
    const pg_bf16 *x = vx;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, load_bf16(x + i));
    for (; i < n; i++) y[i] = pg_bf16_to_fp32(x[i]);
}

void pg_fill_legacy_neon(pg_type_traits *tbl, uint32_t features) {
    PG_FILL_LEGACY_KERNELS(tbl);
    if (features & PG_CPU_DOTPROD) pg_fill_legacy_dotprod(tbl);
}
