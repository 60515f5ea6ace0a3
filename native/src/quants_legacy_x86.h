/* x86 integer dot kernels of the legacy formats, shared by quants_legacy_avx2.c (maddubs) and
 * quants_legacy_avx512.c (VNNI dpbusd). The includer defines
 *   PG_X86_DOT_US(u, s)   8 int32 partial sums of Σ u_i·s_i over 32 bytes (u unsigned, s signed)
 *   PG_X86_DOT_Q4_0(q, a) 8 int32 partial sums of Σ (q_i − 8)·a_i (q the nibbles 0..15)
 * and may define PG_X86_ADD_BIT4 (5th bits into the levels) and PG_X86_DOT_OFF16 (Σ (q − 16)·a)
 * and gets static vec_dot_{q4_0,q5_0,q8_0}_q8_0 and vec_dot_{q4_1,q5_1}_q8_1 plus the helpers.
 * The dots give the scalar reference's bits (exact integer block sums, the reference's fp32
 * operations in its order; see below). */
#ifndef PG_QUANTS_LEGACY_X86_H
#define PG_QUANTS_LEGACY_X86_H

#include <immintrin.h>
#include <string.h>

#include "quants_legacy.h"

static inline float h2f(pg_fp16 h) { return _cvtsh_ss(h); }

static inline float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline int hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

/* The 16-bit words at p, p + S, p + 2S, p + 3S (the fp16 field of four consecutive blocks of
 * stride S) as words 0..3: load k starts at p + k·(S − 2), so its word k is the wanted one, and
 * three word blends merge them. Loads stay inside the four blocks (reads end at p + 3S + 10).
 * Vector loads and blends: no scalar shifts, no store-forwarding stalls. */
static inline __m128i fp16x4(const uint8_t *p, size_t stride) {
    const size_t step = stride - 2;
    __m128i v = _mm_loadu_si128((const __m128i *)p);
    v = _mm_blend_epi16(v, _mm_loadu_si128((const __m128i *)(p + step)), 0x02);
    v = _mm_blend_epi16(v, _mm_loadu_si128((const __m128i *)(p + 2 * step)), 0x04);
    return _mm_blend_epi16(v, _mm_loadu_si128((const __m128i *)(p + 3 * step)), 0x08);
}

/* 16 packed bytes -> 32 bytes: low nibbles (elements 0..15) in the low lane, high nibbles
 * (elements 16..31) in the high lane, each 0..15. */
static inline __m256i unpack_nibbles(const uint8_t *qs) {
    const __m128i t = _mm_loadu_si128((const __m128i *)qs);
    const __m256i both = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

/* Bit j of the 32-bit qh -> byte j = 0xFF (set) or 0x00. */
static inline __m256i bits_to_bytes(const uint8_t *qh4) {
    const __m256i v = _mm256_set1_epi32((int)pg_load_qh(qh4));
    const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                          2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    return _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(v, pick), bit), bit);
}

static inline __m256i dot_us(__m256i u, __m256i s) { return PG_X86_DOT_US(u, s); }

#ifndef PG_X86_ADD_BIT4
/* q | 0x10 in byte j where bit j of the 32-bit qh at qh4 is set (the nibbles have bit 4 clear) */
#define PG_X86_ADD_BIT4(q, qh4) \
    _mm256_or_si256(q, _mm256_and_si256(bits_to_bytes(qh4), _mm256_set1_epi8(0x10)))
/* Σ (q − 16)·a for unsigned q <= 31: Σ q·a − 16·Σ a through maddubs, the int16 difference fits
 * (|31·127·2| + |16·128·2| < 32768) */
#define PG_X86_DOT_OFF16(q, a)                                                                  \
    _mm256_madd_epi16(_mm256_sub_epi16(_mm256_maddubs_epi16(q, a),                              \
                                       _mm256_maddubs_epi16(_mm256_set1_epi8(16), a)),          \
                      _mm256_set1_epi16(1))
#endif

/* Σ a_i·b_i for signed a, b (a != -128): |a| times b with a's sign moved onto b. */
static inline __m256i dot_ss(__m256i a, __m256i b) {
    return dot_us(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));
}

/* ---- dot products ------------------------------------------------------------------------ */

static inline __m256i q4_0_block(const pg_block_q4_0 *x, const pg_block_q8_0 *y) {
    const __m256i q = unpack_nibbles(x->qs);
    const __m256i a = _mm256_loadu_si256((const __m256i *)y->qs);
    return PG_X86_DOT_Q4_0(q, a);
}

/* The dots follow the scalar reference (quants_legacy.c) operation for operation, so every
 * path gives its bits: per block the exact int32 sum, then the block's fp32 term in the
 * reference's order, added to one running fp32 sum in block order. Eight blocks per step: their
 * integer sums in one vector (fold8), the terms of the eight in one vector (elementwise IEEE
 * multiplies and adds are the scalar ones), then eight scalar adds in order. */

/* [Σp0 .. Σp7]: the full sums of eight 8-lane vectors, in order */
static inline __m256i fold8(__m256i p0, __m256i p1, __m256i p2, __m256i p3, __m256i p4,
                            __m256i p5, __m256i p6, __m256i p7) {
    /* per 128-bit half: [Σlo p0 .. Σlo p3 | Σhi p0 .. Σhi p3] */
    const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(p0, p1), _mm256_hadd_epi32(p2, p3));
    const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(p4, p5), _mm256_hadd_epi32(p6, p7));
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20),
                            _mm256_permute2x128_si256(a, b, 0x31));
}

/* The fp16 fields at p + k·stride, k = 0..7, as floats (fp16x4 reads stay inside the blocks). */
static inline __m256 fp16x8(const void *p, size_t stride) {
    const uint8_t *c = p;
    return _mm256_cvtph_ps(_mm_unpacklo_epi64(fp16x4(c, stride), fp16x4(c + 4 * stride, stride)));
}

/* sum + t0 + t1 + ... + t7, left to right (the scalar loop's order) */
static inline float add_in_order(float sum, __m256 t) {
    float v[8];
    _mm256_storeu_ps(v, t);
    for (int k = 0; k < 8; k++) sum += v[k];
    return sum;
}

/* Block terms of the Q8_0-activation formats: TERM(isum, dx, dy) as in the scalar kernel,
 *   Q4_0, Q5_0: (float)isum · d_x · d_y          Q8_0: (float)isum · (d_x · d_y) */
#define PG_TERM_X_Y(f, dx, dy) _mm256_mul_ps(_mm256_mul_ps(f, dx), dy)
#define PG_TERM_XY(f, dx, dy) _mm256_mul_ps(f, _mm256_mul_ps(dx, dy))
#define PG_STERM_X_Y(f, dx, dy) ((f) * (dx) * (dy))
#define PG_STERM_XY(f, dx, dy) ((f) * ((dx) * (dy)))

#define PG_DOT_Q8_0_KERNEL(name, XT, BLOCK, TERM, STERM)                                        \
    static void name(int64_t n, float *restrict s, const void *restrict vx,                     \
                     const void *restrict vy) {                                                 \
        const XT *x = vx;                                                                       \
        const pg_block_q8_0 *y = vy;                                                            \
        const int64_t nb = n / PG_QK32;                                                         \
        float sum = 0.0f;                                                                       \
        int64_t b = 0;                                                                          \
        for (; b + 8 <= nb; b += 8) {                                                           \
            const __m256i p = fold8(BLOCK(&x[b], &y[b]), BLOCK(&x[b + 1], &y[b + 1]),           \
                                    BLOCK(&x[b + 2], &y[b + 2]), BLOCK(&x[b + 3], &y[b + 3]),   \
                                    BLOCK(&x[b + 4], &y[b + 4]), BLOCK(&x[b + 5], &y[b + 5]),   \
                                    BLOCK(&x[b + 6], &y[b + 6]), BLOCK(&x[b + 7], &y[b + 7]));  \
            const __m256 dx = fp16x8(&x[b], sizeof(XT)), dy = fp16x8(&y[b], sizeof(*y));        \
            sum = add_in_order(sum, TERM(_mm256_cvtepi32_ps(p), dx, dy));                       \
        }                                                                                       \
        for (; b < nb; b++)                                                                     \
            sum += STERM((float)hsum_epi32(BLOCK(&x[b], &y[b])), h2f(x[b].d), h2f(y[b].d));     \
        *s = sum;                                                                               \
    }

PG_DOT_Q8_0_KERNEL(vec_dot_q4_0_q8_0, pg_block_q4_0, q4_0_block, PG_TERM_X_Y, PG_STERM_X_Y)

/* Q5_0: unsigned levels q = nibble | bit4 << 4 (0..31), Σ (q − 16)·a. */
static inline __m256i q5_0_block(const pg_block_q5_0 *x, const pg_block_q8_0 *y) {
    const __m256i q = PG_X86_ADD_BIT4(unpack_nibbles(x->qs), x->qh);
    const __m256i a = _mm256_loadu_si256((const __m256i *)y->qs);
    return PG_X86_DOT_OFF16(q, a);
}

PG_DOT_Q8_0_KERNEL(vec_dot_q5_0_q8_0, pg_block_q5_0, q5_0_block, PG_TERM_X_Y, PG_STERM_X_Y)

static inline __m256i q8_0_block(const pg_block_q8_0 *x, const pg_block_q8_0 *y) {
    const __m256i q = _mm256_loadu_si256((const __m256i *)x->qs);
    const __m256i a = _mm256_loadu_si256((const __m256i *)y->qs);
    return dot_ss(q, a);
}

/* dot_ss is exact for any weight byte (|−128| reads as 128 through maddubs's unsigned side) and
 * activations in −127..127, which is all any Q8 quantizer produces for finite input. */
PG_DOT_Q8_0_KERNEL(vec_dot_q8_0_q8_0, pg_block_q8_0, q8_0_block, PG_TERM_XY, PG_STERM_XY)

/* Q4_1 / Q5_1 · Q8_1: unsigned q straight into maddubs; block term (d_x·d_y)·isum + m_x·s_y. */
static inline __m256i q4_1_block(const pg_block_q4_1 *x, const pg_block_q8_1 *y) {
    const __m256i a = _mm256_loadu_si256((const __m256i *)y->qs);
    return dot_us(unpack_nibbles(x->qs), a);
}

static inline __m256i q5_1_block(const pg_block_q5_1 *x, const pg_block_q8_1 *y) {
    const __m256i q = PG_X86_ADD_BIT4(unpack_nibbles(x->qs), x->qh);
    const __m256i a = _mm256_loadu_si256((const __m256i *)y->qs);
    return dot_us(q, a);
}

#define PG_DOT_Q8_1_KERNEL(name, XT, BLOCK)                                                       \
    static void name(int64_t n, float *restrict s, const void *restrict vx,                     \
                     const void *restrict vy) {                                                 \
        const XT *x = vx;                                                                       \
        const pg_block_q8_1 *y = vy;                                                            \
        const int64_t nb = n / PG_QK32;                                                         \
        float sum = 0.0f;                                                                       \
        int64_t b = 0;                                                                          \
        for (; b + 8 <= nb; b += 8) {                                                           \
            const __m256i p = fold8(BLOCK(&x[b], &y[b]), BLOCK(&x[b + 1], &y[b + 1]),           \
                                    BLOCK(&x[b + 2], &y[b + 2]), BLOCK(&x[b + 3], &y[b + 3]),   \
                                    BLOCK(&x[b + 4], &y[b + 4]), BLOCK(&x[b + 5], &y[b + 5]),   \
                                    BLOCK(&x[b + 6], &y[b + 6]), BLOCK(&x[b + 7], &y[b + 7]));  \
            const __m256 dd = _mm256_mul_ps(fp16x8(&x[b], sizeof(XT)), fp16x8(&y[b], sizeof(*y))); \
            const __m256 ms = _mm256_mul_ps(fp16x8((const char *)&x[b] + 2, sizeof(XT)),        \
                                            fp16x8((const char *)&y[b] + 2, sizeof(*y)));       \
            sum = add_in_order(sum, _mm256_add_ps(_mm256_mul_ps(dd, _mm256_cvtepi32_ps(p)), ms)); \
        }                                                                                       \
        for (; b < nb; b++) {                                                                   \
            const float dd = h2f(x[b].d) * h2f(y[b].d);                                         \
            sum += dd * (float)hsum_epi32(BLOCK(&x[b], &y[b])) + h2f(x[b].m) * h2f(y[b].s);     \
        }                                                                                       \
        *s = sum;                                                                               \
    }

PG_DOT_Q8_1_KERNEL(vec_dot_q4_1_q8_1, pg_block_q4_1, q4_1_block)
PG_DOT_Q8_1_KERNEL(vec_dot_q5_1_q8_1, pg_block_q5_1, q5_1_block)

/* vec_dot8 (decode): eight weight rows (rows bx bytes apart) · one activation row, row r in lane
 * r. Each lane adds its row's block terms in block order, the terms as above: every lane has the
 * bits of vec_dot (and of the scalar kernel). What it saves over eight vec_dot calls: the
 * activation block is loaded once for eight rows, the block terms need no horizontal reduction
 * and no in-order scalar adds, and short rows have no tail (Gemma's output matrix: 262,144 rows
 * of 20 blocks). */
/* decode calls a vec_dot8 for consecutive groups of 8 rows: while one group's block b is
 * computed, its share of the next group's bytes is fetched into L2 (rows of a few hundred bytes
 * are too short for the hardware prefetcher to catch up within a row; into L2, not L1, for the
 * reason given at kq_dot8_prefetch in kquants_x86.h) */
#define PG_PREFETCH_SHARE(p, share)                                                             \
    for (size_t o_ = 0; o_ < (share); o_ += 64) _mm_prefetch((p) + o_, PG_DOT8_PREFETCH_HINT)
#define PG_ROW8(xb, bx, r, XT) ((const XT *)((const char *)(xb) + (size_t)(r) * (bx)))
#define PG_FOLD_ROWS8(BLOCK, xb, bx, yb, XT)                                                    \
    fold8(BLOCK(PG_ROW8(xb, bx, 0, XT), yb), BLOCK(PG_ROW8(xb, bx, 1, XT), yb),                 \
          BLOCK(PG_ROW8(xb, bx, 2, XT), yb), BLOCK(PG_ROW8(xb, bx, 3, XT), yb),                 \
          BLOCK(PG_ROW8(xb, bx, 4, XT), yb), BLOCK(PG_ROW8(xb, bx, 5, XT), yb),                 \
          BLOCK(PG_ROW8(xb, bx, 6, XT), yb), BLOCK(PG_ROW8(xb, bx, 7, XT), yb))

/* the block terms of eight rows, one per lane (as the scalar kernels form them, see above) */
#define PG_TERM8_X_Y(p, xb, bx, yb)                                                             \
    PG_TERM_X_Y(_mm256_cvtepi32_ps(p), fp16x8(xb, bx), _mm256_set1_ps(h2f((yb)->d)))
#define PG_TERM8_XY(p, xb, bx, yb)                                                              \
    PG_TERM_XY(_mm256_cvtepi32_ps(p), fp16x8(xb, bx), _mm256_set1_ps(h2f((yb)->d)))
#define PG_TERM8_Q8_1(p, xb, bx, yb)                                                            \
    _mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(fp16x8(xb, bx), _mm256_set1_ps(h2f((yb)->d))),    \
                                _mm256_cvtepi32_ps(p)),                                         \
                  _mm256_mul_ps(fp16x8((const char *)(xb) + 2, bx), _mm256_set1_ps(h2f((yb)->s))))

/* nc activation rows (1..PG_DOT8_MAX_NC) one after the other, the group's weight bytes in L1
 * after the first; MUL_MAT takes the gemm for several rows of these formats (vec_dot8_rows = 1) */
#define PG_DOT8_KERNEL(name, XT, YT, BLOCK, TERM8)                                              \
    static void name(int64_t n, float *restrict s, size_t bs, const void *restrict vx,          \
                     size_t bx, const void *restrict vy, size_t by, int nc) {                   \
        const int64_t nb = n / PG_QK32;                                                         \
        const size_t next = 8 * bx, share = (next / (size_t)nb + 63) & ~(size_t)63;             \
        for (int j = 0; j < nc; j++) {                                                          \
            const YT *y = (const YT *)((const char *)vy + (size_t)j * by);                      \
            __m256 acc = _mm256_setzero_ps();                                                   \
            for (int64_t b = 0; b < nb; b++) {                                                  \
                if (j == 0) PG_PREFETCH_SHARE((const char *)vx + next + (size_t)b * share, share); \
                const XT *xb = (const XT *)vx + b;                                              \
                const __m256i p = PG_FOLD_ROWS8(BLOCK, xb, bx, &y[b], XT);                      \
                acc = _mm256_add_ps(acc, TERM8(p, xb, bx, &y[b]));                              \
            }                                                                                   \
            _mm256_storeu_ps((float *)((char *)s + (size_t)j * bs), acc);                       \
        }                                                                                       \
    }

PG_DOT8_KERNEL(vec_dot8_q4_0_q8_0, pg_block_q4_0, pg_block_q8_0, q4_0_block, PG_TERM8_X_Y)
PG_DOT8_KERNEL(vec_dot8_q5_0_q8_0, pg_block_q5_0, pg_block_q8_0, q5_0_block, PG_TERM8_X_Y)
PG_DOT8_KERNEL(vec_dot8_q8_0_q8_0, pg_block_q8_0, pg_block_q8_0, q8_0_block, PG_TERM8_XY)
PG_DOT8_KERNEL(vec_dot8_q4_1_q8_1, pg_block_q4_1, pg_block_q8_1, q4_1_block, PG_TERM8_Q8_1)
PG_DOT8_KERNEL(vec_dot8_q5_1_q8_1, pg_block_q5_1, pg_block_q8_1, q5_1_block, PG_TERM8_Q8_1)

/* decode only: for several rows the gemm (in cache, 1 thread, K 1536, at 2 / 4 rows: 45-56 vs
 * 46-55, 57-67 vs 85-109 GOP/s) */
#define PG_FILL_LEGACY_DOT8(tbl) do {                                                           \
    static const int32_t types_[] = {PG_TYPE_Q4_0, PG_TYPE_Q4_1, PG_TYPE_Q5_0, PG_TYPE_Q5_1,    \
                                     PG_TYPE_Q8_0};                                             \
    static const pg_vec_dot8_fn dots_[] = {vec_dot8_q4_0_q8_0, vec_dot8_q4_1_q8_1,              \
                                           vec_dot8_q5_0_q8_0, vec_dot8_q5_1_q8_1,              \
                                           vec_dot8_q8_0_q8_0};                                 \
    for (int i_ = 0; i_ < 5; i_++) {                                                            \
        (tbl)[types_[i_]].vec_dot8 = dots_[i_];                                                 \
        (tbl)[types_[i_]].vec_dot8_rows = 1;                                                    \
    }                                                                                           \
} while (0)

#endif
