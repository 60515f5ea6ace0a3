/* Legacy (32-element) formats and plain float types: AVX2 + FMA + F16C kernels.
 *
 * Exactness contract with the scalar reference (quants_legacy.c), checked by
 * tests/test_quants_legacy.c:
 *   - to_float: bit-exact (same single-rounding multiply, then add; no FMA here);
 *   - from_float (Q8_0, Q8_1, F16, BF16): bit-exact for finite input. Unlike ggml's x86 path
 *     (id = 127/amax, round-half-even; docs/FORMATS.md §2.5) we keep the reference's
 *     id = 1/d and round half away from zero, so activations never depend on the path;
 *   - vec_dot of the quantized formats: bit-exact. Integer block sums are exact, then each
 *     block's fp32 term is computed with the reference's operations in its order and added to
 *     one running sum in block order (quants_legacy_x86.h), so a dot has the same bits on every
 *     path and inside any gemm block: batching tokens never changes a token's result. Eight
 *     blocks per step share one integer fold, one fp16 conversion and one term computation.
 *   - float vec_dot (F32/F16/BF16): four 8-lane FMA chains (not the scalar order; those types
 *     have no gemm, so every MUL_MAT row is this same kernel whatever the batch). */
#include <immintrin.h>
#include <math.h>

#include "quants.h"
#include "quants_legacy.h"

/* ---- integer dots (shared with the VNNI variants in quants_legacy_avx512.c) ---------------- */

#ifndef PG_X86_DOT_US
/* Σ u_i·s_i over 32 bytes (u unsigned, s signed) as 8 int32 partial sums. maddubs saturates at
 * ±32767 per pair: safe here since u ≤ 31 (or u = |a| ≤ 128 with |s| ≤ 127). */
#define PG_X86_DOT_US(u, s) _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
/* Σ (q−8)·a = Σ q·a − 8·Σ a, both through maddubs with unsigned q (no sign tricks); the int16
 * difference fits (|15·127·2| + |8·128·2| < 32768). */
#define PG_X86_DOT_Q4_0(q, a)                                                                   \
    _mm256_madd_epi16(_mm256_sub_epi16(_mm256_maddubs_epi16(q, a),                              \
                                       _mm256_maddubs_epi16(_mm256_set1_epi8(8), a)),           \
                      _mm256_set1_epi16(1))
#endif
#include "quants_legacy_x86.h"

/* Float types: four independent FMA chains of 8 lanes, 32 elements per step. */
#define PG_FLOAT_DOT(name, T, LOAD)                                                             \
    static void name(int64_t n, float *restrict s, const void *restrict vx,                     \
                     const void *restrict vy) {                                                 \
        const T *x = vx, *y = vy;                                                               \
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                             \
        int64_t i = 0;                                                                          \
        for (; i + 32 <= n; i += 32) {                                                          \
            a0 = _mm256_fmadd_ps(LOAD(x + i), LOAD(y + i), a0);                                 \
            a1 = _mm256_fmadd_ps(LOAD(x + i + 8), LOAD(y + i + 8), a1);                         \
            a2 = _mm256_fmadd_ps(LOAD(x + i + 16), LOAD(y + i + 16), a2);                       \
            a3 = _mm256_fmadd_ps(LOAD(x + i + 24), LOAD(y + i + 24), a3);                       \
        }                                                                                       \
        for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(LOAD(x + i), LOAD(y + i), a0);          \
        float sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));       \
        for (; i < n; i++) sum += SCALAR_##T(x[i]) * SCALAR_##T(y[i]);                          \
        *s = sum;                                                                               \
    }

static inline __m256 load_f32(const float *p) { return _mm256_loadu_ps(p); }
static inline __m256 load_f16(const pg_fp16 *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
static inline __m256 load_bf16(const pg_bf16 *p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
typedef float f32_t;
typedef pg_fp16 f16_t;
typedef pg_bf16 bf16_t;
#define SCALAR_f32_t(v) (v)
#define SCALAR_f16_t(v) pg_fp16_to_fp32(v)
#define SCALAR_bf16_t(v) pg_bf16_to_fp32(v)

PG_FLOAT_DOT(vec_dot_f32, f32_t, load_f32)
PG_FLOAT_DOT(vec_dot_f16, f16_t, load_f16)
PG_FLOAT_DOT(vec_dot_bf16, bf16_t, load_bf16)

/* ---- activation quantizers (bit-exact with the reference for finite input) --------------- */

static inline __m256 abs_ps(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }

static inline float block_amax(const float *x) {
    const __m256 m01 = _mm256_max_ps(abs_ps(_mm256_loadu_ps(x)), abs_ps(_mm256_loadu_ps(x + 8)));
    const __m256 m23 = _mm256_max_ps(abs_ps(_mm256_loadu_ps(x + 16)),
                                     abs_ps(_mm256_loadu_ps(x + 24)));
    const __m256 m = _mm256_max_ps(m01, m23);
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

/* roundf (half away from zero) of v, clamped to [-128, 127], as int32 lanes:
 * t = trunc|v| and f = |v| − t are exact, so t + (f >= 0.5) is the exact rounding. */
static inline __m256i round_away(__m256 v) {
    const __m256 a = abs_ps(v);
    const __m256 t = _mm256_round_ps(a, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 up = _mm256_and_ps(_mm256_cmp_ps(_mm256_sub_ps(a, t), _mm256_set1_ps(0.5f),
                                                  _CMP_GE_OQ), _mm256_set1_ps(1.0f));
    __m256 r = _mm256_or_ps(_mm256_add_ps(t, up), _mm256_and_ps(v, _mm256_set1_ps(-0.0f)));
    r = _mm256_min_ps(_mm256_max_ps(r, _mm256_set1_ps(-128.0f)), _mm256_set1_ps(127.0f));
    return _mm256_cvtps_epi32(r);
}

/* Four vectors of 8 int32 (elements 0..31 in order) -> 32 int8 in order. */
static inline __m256i pack_i32x32(__m256i i0, __m256i i1, __m256i i2, __m256i i3) {
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
    /* packs works per 128-bit lane: dwords come out as 0 4 1 5 2 6 3 7 */
    return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

static inline __m256i quantize_block_q8(const float *x, float id, __m256i *sum) {
    const __m256 vid = _mm256_set1_ps(id);
    const __m256i i0 = round_away(_mm256_mul_ps(_mm256_loadu_ps(x), vid));
    const __m256i i1 = round_away(_mm256_mul_ps(_mm256_loadu_ps(x + 8), vid));
    const __m256i i2 = round_away(_mm256_mul_ps(_mm256_loadu_ps(x + 16), vid));
    const __m256i i3 = round_away(_mm256_mul_ps(_mm256_loadu_ps(x + 24), vid));
    if (sum) *sum = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
    return pack_i32x32(i0, i1, i2, i3);
}

static void q8_0_from_float(const float *restrict x, void *restrict vy, int64_t n) {
    pg_block_q8_0 *y = vy;
    for (int64_t b = 0; b < n / PG_QK32; b++, x += PG_QK32) {
        const float d = block_amax(x) / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = pg_fp32_to_fp16(d);
        _mm256_storeu_si256((__m256i *)y[b].qs, quantize_block_q8(x, id, NULL));
    }
}

static void q8_1_from_float(const float *restrict x, void *restrict vy, int64_t n) {
    pg_block_q8_1 *y = vy;
    for (int64_t b = 0; b < n / PG_QK32; b++, x += PG_QK32) {
        const float d = block_amax(x) / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        __m256i sum;
        _mm256_storeu_si256((__m256i *)y[b].qs, quantize_block_q8(x, id, &sum));
        y[b].d = pg_fp32_to_fp16(d);
        y[b].s = pg_fp32_to_fp16((float)hsum_epi32(sum) * d);
    }
}

/* F16C's conversion is IEEE round-to-nearest-even, like pg_fp32_to_fp16. */
static void f16_from_float(const float *restrict x, void *restrict vy, int64_t n) {
    pg_fp16 *y = vy;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) y[i] = pg_fp32_to_fp16(x[i]);
}

/* ---- dequantize (bit-exact: one multiply, then one add) ---------------------------------- */

/* 32 signed bytes -> 32 floats times d (plus m when add_m). */
static inline void store_i8x32(float *y, __m256i q, __m256 d, __m256 m, int add_m) {
    const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    const __m256i v[4] = {_mm256_cvtepi8_epi32(lo), _mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)),
                          _mm256_cvtepi8_epi32(hi), _mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))};
    for (int k = 0; k < 4; k++) {
        __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(v[k]), d);
        if (add_m) f = _mm256_add_ps(f, m);
        _mm256_storeu_ps(y + 8 * k, f);
    }
}

static void q4_0_to_float(const void *restrict vx, float *restrict y, int64_t n) {
    const pg_block_q4_0 *x = vx;
    for (int64_t b = 0; b < n / PG_QK32; b++, y += PG_QK32) {
        const __m256i q = _mm256_sub_epi8(unpack_nibbles(x[b].qs), _mm256_set1_epi8(8));
        store_i8x32(y, q, _mm256_set1_ps(h2f(x[b].d)), _mm256_setzero_ps(), 0);
    }
}

static void q4_1_to_float(const void *restrict vx, float *restrict y, int64_t n) {
    const pg_block_q4_1 *x = vx;
    for (int64_t b = 0; b < n / PG_QK32; b++, y += PG_QK32)
        store_i8x32(y, unpack_nibbles(x[b].qs), _mm256_set1_ps(h2f(x[b].d)),
                    _mm256_set1_ps(h2f(x[b].m)), 1);
}

static void q5_0_to_float(const void *restrict vx, float *restrict y, int64_t n) {
    const pg_block_q5_0 *x = vx;
    for (int64_t b = 0; b < n / PG_QK32; b++, y += PG_QK32) {
        const __m256i hi = _mm256_andnot_si256(bits_to_bytes(x[b].qh),
                                               _mm256_set1_epi8((char)0xF0));
        store_i8x32(y, _mm256_or_si256(unpack_nibbles(x[b].qs), hi),
                    _mm256_set1_ps(h2f(x[b].d)), _mm256_setzero_ps(), 0);
    }
}

static void q5_1_to_float(const void *restrict vx, float *restrict y, int64_t n) {
    const pg_block_q5_1 *x = vx;
    for (int64_t b = 0; b < n / PG_QK32; b++, y += PG_QK32) {
        const __m256i hi = _mm256_and_si256(bits_to_bytes(x[b].qh), _mm256_set1_epi8(0x10));
        store_i8x32(y, _mm256_or_si256(unpack_nibbles(x[b].qs), hi),
                    _mm256_set1_ps(h2f(x[b].d)), _mm256_set1_ps(h2f(x[b].m)), 1);
    }
}

static void q8_0_to_float(const void *restrict vx, float *restrict y, int64_t n) {
    const pg_block_q8_0 *x = vx;
    for (int64_t b = 0; b < n / PG_QK32; b++, y += PG_QK32)
        store_i8x32(y, _mm256_loadu_si256((const __m256i *)x[b].qs), _mm256_set1_ps(h2f(x[b].d)),
                    _mm256_setzero_ps(), 0);
}

static void q8_1_to_float(const void *restrict vx, float *restrict y, int64_t n) {
    const pg_block_q8_1 *x = vx;
    for (int64_t b = 0; b < n / PG_QK32; b++, y += PG_QK32)
        store_i8x32(y, _mm256_loadu_si256((const __m256i *)x[b].qs), _mm256_set1_ps(h2f(x[b].d)),
                    _mm256_setzero_ps(), 0);
}

static void f16_to_float(const void *restrict vx, float *restrict y, int64_t n) {
    const pg_fp16 *x = vx;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, load_f16(x + i));
    for (; i < n; i++) y[i] = pg_fp16_to_fp32(x[i]);
}

static void bf16_to_float(const void *restrict vx, float *restrict y, int64_t n) {
    const pg_bf16 *x = vx;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, load_bf16(x + i));
    for (; i < n; i++) y[i] = pg_bf16_to_fp32(x[i]);
}

void pg_fill_legacy_avx2(pg_type_traits *tbl) {
    PG_FILL_LEGACY_KERNELS(tbl);
    PG_FILL_LEGACY_DOT8(tbl);
}
