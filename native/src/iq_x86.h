/* Multi-row decode and gemm scaffolding of the x86 i-quant and ternary kernels
 * (quants_iq_avx2.c, quants_iq_grid_avx2.c, quants_iq_avx512.c, quants_tq_avx2.c; compiled with
 * at least AVX2 + FMA + F16C).
 *
 * vec_dot8 (quants.h): eight weight rows · nc activation rows. A type supplies ROW, which
 * decodes one weight row's block once and leaves, for each of C activation blocks, 8 int32
 * partial sums whose total is the scalar kernel's exact integer block sum; the template folds
 * the eight rows' partials into one register (lane r = row r), forms the scalar kernel's fp32
 * block term in each lane and adds the terms in block order: every lane has vec_dot's bits.
 * C activation rows share each decode (at most IQX_MAX_C at a time, their sums stay in
 * registers). While a group's block b is computed, the b-th share of the next group's bytes
 * is prefetched into L2 (why L2: kq_dot8_prefetch in kquants_x86.h).
 *
 * The gemm of these types is vec_dot8 for full groups of eight weight rows (the usual case:
 * MUL_MAT's blocks are cut at multiples of 8) and vec_dot pair by pair at a matrix's ragged
 * edge: the bits of vec_dot either way (quants.h). */
#ifndef PG_IQ_X86_H
#define PG_IQ_X86_H

#include <immintrin.h>
#include <string.h>

#include "kquants.h"
#include "quants.h"

#define IQX_MAX_C 4
#define IQX_UNROLL _Pragma("GCC unroll 8")
/* the eight rows of a 256-element block in a loop: unrolled, the codebook kernels' bodies
 * outgrow the uop cache (IQ2_XS 0.53x) and IQ4_XS gains nothing measurable (the 32-element
 * blocks' rows are unrolled: their bodies are a few instructions) */
#define ROWS_UNROLL _Pragma("GCC unroll 1")

/* lane r = Σ of the 8 lanes of p[r] (exact) */
static inline __m256i iqx_fold8(const __m256i p[8]) {
    const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20),
                            _mm256_permute2x128_si256(a, b, 0x31));
}

/* the fp16 field at byte 0 of block b of eight rows (bx bytes apart), as floats. The halves
 * are shifted into two 64-bit words: eight 2-byte stores read back as one vector fail store
 * forwarding, a stall every block on Zen 4 (as kq_rows8_fp16x2 found for the K-quants) */
static inline __m256 iqx_rows8_fp16(const char *x, size_t bx, int64_t b, size_t bsize) {
    uint64_t w[2] = {0, 0};
    IQX_UNROLL for (int r = 0; r < 8; r++) {
        uint16_t h;
        memcpy(&h, x + (size_t)r * bx + (size_t)b * bsize, 2);
        w[r / 4] |= (uint64_t)h << (16 * (r % 4));
    }
    return _mm256_cvtph_ps(_mm_set_epi64x((long long)w[1], (long long)w[0]));
}

static inline size_t iqx_share(size_t bx, int64_t nb) {
    return (8 * bx / (size_t)nb + 63) & ~(size_t)63;
}

static inline __attribute__((always_inline)) void iqx_prefetch(const void *x, size_t bx,
                                                              int64_t b, size_t share) {
    const char *p = (const char *)x + 8 * bx + (size_t)b * share;
    for (size_t o = 0; o < share; o += 64) _mm_prefetch(p + o, PG_DOT8_PREFETCH_HINT);
}

/* 32-byte vector with the 16-byte table v in both lanes (a vpshufb lookup table) */
static inline __m256i iqx_table(const int8_t *v) {
    const __m128i t = _mm_loadu_si128((const __m128i *)v);
    return _mm256_set_m128i(t, t);
}

/* Q8_K-activation types (IQ4_XS, the codebook types): block term (d_x·d_y)·isum, the sum times
 * FINAL at the end. ROW(xb, y, C, is): is[j] = partials of weight block xb · y[j].
 * DX(x, bx, b, block bytes) = the eight rows' d_x of block b as floats. */
#define IQX_ROWS8_Q8K(name, BT, ROW, DX, FINAL)                                                 \
    static inline __attribute__((always_inline)) void name##_c(                                 \
        int64_t n, float *s, size_t bs, const void *vx, size_t bx, const void *vy, size_t by,   \
        const int C) {                                                                          \
        const char *x = vx;                                                                     \
        __m256 acc[IQX_MAX_C];                                                                  \
        IQX_UNROLL for (int j = 0; j < C; j++) acc[j] = _mm256_setzero_ps();                    \
        const int64_t nb = n / PG_QK_K;                                                         \
        const size_t share = iqx_share(bx, nb);                                                 \
        for (int64_t b = 0; b < nb; b++) {                                                      \
            iqx_prefetch(vx, bx, b, share);                                                     \
            const pg_block_q8_K *yb[IQX_MAX_C];                                                 \
            IQX_UNROLL for (int j = 0; j < C; j++)                                              \
                yb[j] = (const pg_block_q8_K *)((const char *)vy + (size_t)j * by) + b;         \
            __m256i is[IQX_MAX_C][8];                                                           \
            ROWS_UNROLL for (int r = 0; r < 8; r++) {                                           \
                __m256i ri[IQX_MAX_C];                                                          \
                ROW((const BT *)(x + (size_t)r * bx) + b, yb, C, ri);                           \
                IQX_UNROLL for (int j = 0; j < C; j++) is[j][r] = ri[j];                        \
            }                                                                                   \
            const __m256 dx = DX(x, bx, b, sizeof(BT));                                         \
            IQX_UNROLL for (int j = 0; j < C; j++) {                                            \
                const __m256 f = _mm256_cvtepi32_ps(iqx_fold8(is[j]));                          \
                acc[j] = _mm256_add_ps(acc[j], _mm256_mul_ps(                                   \
                    _mm256_mul_ps(dx, _mm256_set1_ps(yb[j]->d)), f));                           \
            }                                                                                   \
        }                                                                                       \
        IQX_UNROLL for (int j = 0; j < C; j++)                                                  \
            _mm256_storeu_ps((float *)((char *)s + (size_t)j * bs),                             \
                             _mm256_mul_ps(_mm256_set1_ps(FINAL), acc[j]));                     \
    }                                                                                           \
    IQX_ROWS8_DISPATCH(name)

/* Q8_0-activation types (IQ4_NL, MXFP4; 32-element blocks): block term (d_y·d_x)·isum.
 * ROW(xb, y, C, is) with y the C Q8_0 blocks; DX(x, bx, b) the eight rows' d_x of block b;
 * FIX(f, y) the eight rows' exact sums f made isum (a correction that depends on the
 * activation block y only, or f itself: IQX_AS_IS). */
#define IQX_AS_IS(f, y) (f)
#define IQX_ROWS8_Q8_0(name, BT, ROW, DX, FIX)                                                  \
    static inline __attribute__((always_inline)) void name##_c(                                 \
        int64_t n, float *s, size_t bs, const void *vx, size_t bx, const void *vy, size_t by,   \
        const int C) {                                                                          \
        const char *x = vx;                                                                     \
        __m256 acc[IQX_MAX_C];                                                                  \
        IQX_UNROLL for (int j = 0; j < C; j++) acc[j] = _mm256_setzero_ps();                    \
        const int64_t nb = n / 32;                                                              \
        const size_t share = iqx_share(bx, nb);                                                 \
        for (int64_t b = 0; b < nb; b++) {                                                      \
            iqx_prefetch(vx, bx, b, share);                                                     \
            const pg_block_q8_0 *yb[IQX_MAX_C];                                                 \
            IQX_UNROLL for (int j = 0; j < C; j++)                                              \
                yb[j] = (const pg_block_q8_0 *)((const char *)vy + (size_t)j * by) + b;         \
            /* iqx_fold8's first hadds as each pair of rows comes (fewer live registers) */    \
            __m256i h[IQX_MAX_C][4];                                                            \
            IQX_UNROLL for (int r = 0; r < 8; r += 2) {                                         \
                __m256i p0[IQX_MAX_C], p1[IQX_MAX_C];                                           \
                ROW((const BT *)(x + (size_t)r * bx) + b, yb, C, p0);                           \
                ROW((const BT *)(x + (size_t)(r + 1) * bx) + b, yb, C, p1);                     \
                IQX_UNROLL for (int j = 0; j < C; j++) h[j][r / 2] = _mm256_hadd_epi32(p0[j], p1[j]); \
            }                                                                                   \
            const __m256 dx = DX(x, bx, b);                                                     \
            IQX_UNROLL for (int j = 0; j < C; j++) {                                            \
                const __m256i a = _mm256_hadd_epi32(h[j][0], h[j][1]);                          \
                const __m256i c = _mm256_hadd_epi32(h[j][2], h[j][3]);                          \
                const __m256i sums = _mm256_add_epi32(_mm256_permute2x128_si256(a, c, 0x20),    \
                                                      _mm256_permute2x128_si256(a, c, 0x31));   \
                const __m256 f = _mm256_cvtepi32_ps(FIX(sums, yb[j]));                          \
                const __m256 dy = _mm256_set1_ps(_cvtsh_ss(yb[j]->d));                          \
                acc[j] = _mm256_add_ps(acc[j], _mm256_mul_ps(_mm256_mul_ps(dy, dx), f));        \
            }                                                                                   \
        }                                                                                       \
        IQX_UNROLL for (int j = 0; j < C; j++)                                                  \
            _mm256_storeu_ps((float *)((char *)s + (size_t)j * bs), acc[j]);                    \
    }                                                                                           \
    IQX_ROWS8_DISPATCH(name)

/* the pg_vec_dot8_fn: nc activation rows, IQX_MAX_C at a time */
#define IQX_ROWS8_DISPATCH(name)                                                                \
    static void name(int64_t n, float *restrict s, size_t bs, const void *restrict x,          \
                     size_t bx, const void *restrict y, size_t by, int nc) {                   \
        for (int j = 0; j < nc; j += IQX_MAX_C) {                                               \
            const int c = nc - j < IQX_MAX_C ? nc - j : IQX_MAX_C;                              \
            float *sj = (float *)((char *)s + (size_t)j * bs);                                  \
            const char *yj = (const char *)y + (size_t)j * by;                                  \
            if (c == 1) name##_c(n, sj, bs, x, bx, yj, by, 1);                                  \
            else if (c == 2) name##_c(n, sj, bs, x, bx, yj, by, 2);                             \
            else if (c == 3) name##_c(n, sj, bs, x, bx, yj, by, 3);                             \
            else name##_c(n, sj, bs, x, bx, yj, by, 4);                                         \
        }                                                                                       \
    }

/* the pg_gemm_fn over a vec_dot8 and the vec_dot of the same bits */
#define IQX_GEMM(name, DOT8, VEC_DOT)                                                           \
    static void name(int64_t n, float *restrict s, size_t bs, const void *restrict x,          \
                     size_t bx, const void *restrict y, size_t by, int nr, int nc) {           \
        if (nr == 8) {                                                                          \
            DOT8(n, s, bs, x, bx, y, by, nc);                                                   \
            return;                                                                             \
        }                                                                                       \
        for (int j = 0; j < nc; j++)                                                            \
            for (int i = 0; i < nr; i++)                                                        \
                VEC_DOT(n, (float *)((char *)s + (size_t)j * bs) + i,                           \
                        (const char *)x + (size_t)i * bx, (const char *)y + (size_t)j * by);    \
    }

/* what MUL_MAT takes the vec_dot8 for: every batch up to PG_DOT8_MAX_NC rows (the gemm is the
 * same kernel beyond) */
#define IQX_SET(tbl, type, DOT, DOT8, GEMM)                                                     \
    do {                                                                                        \
        (tbl)[type].vec_dot = DOT;                                                              \
        (tbl)[type].vec_dot8 = DOT8;                                                            \
        (tbl)[type].vec_dot8_rows = PG_DOT8_MAX_NC;                                             \
        (tbl)[type].gemm = GEMM;                                                                \
    } while (0)

#endif
