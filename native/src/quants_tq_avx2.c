/* TQ1_0 and TQ2_0 · Q8_K: the AVX2 dots (vec_dot, vec_dot8, gemm through iq_x86.h) with the
 * scalar kernels' bits (quants_tq.c). Levels t − 1 with t the codes (0..2 for TQ1_0's trits,
 * 0..3 for TQ2_0's 2-bit fields): Σ (t − 1)·a = Σ t·a − Σ a, Σ t·a by maddubs with t unsigned
 * (at most sixteen products |t·a| <= 3·128 per int16 lane: <= 6144), Σ a from the
 * activation block's bsums; exact int32 lanes, the block term (d·d_y)·isum in block order.
 * TQ1_0's trit n of a byte b is the top trit of b·3^n mod 256, i.e. (q·3) >> 8 of
 * q = b·3^n mod 256, which is [q > 85] + [q > 170]; b·3 mod 256 is two byte adds. */
#include <immintrin.h>
#include <string.h>

#include "iq_x86.h"
#include "kquants.h"
#include "quants.h"

typedef struct { uint8_t qs[64]; uint16_t d; } pg_block_tq2_0_x86;
_Static_assert(sizeof(pg_block_tq2_0_x86) == 66, "TQ2_0 block must be 66 bytes");
typedef struct { uint8_t qs[48]; uint8_t qh[4]; uint16_t d; } pg_block_tq1_0_x86;
_Static_assert(sizeof(pg_block_tq1_0_x86) == 54, "TQ1_0 block must be 54 bytes");

/* b·3 mod 256 per byte; on x = b ^ 0x80 it gives 3b ^ 0x80 (3·128 = 128 mod 256), so the codes
 * are kept with their top bit flipped and compared signed */
static inline __m256i times3(__m256i b) { return _mm256_add_epi8(b, _mm256_add_epi8(b, b)); }
static inline __m128i times3_128(__m128i b) { return _mm_add_epi8(b, _mm_add_epi8(b, b)); }

/* the top trit (0..2) of every byte q = x ^ 0x80: (q·3) >> 8 = [q > 85] + [q > 170] */
static inline __m256i top_trit(__m256i x) {
    const __m256i m1 = _mm256_cmpgt_epi8(x, _mm256_set1_epi8((char)(85 ^ 0x80)));
    const __m256i m2 = _mm256_cmpgt_epi8(x, _mm256_set1_epi8((char)(170 ^ 0x80)));
    return _mm256_sub_epi8(_mm256_sub_epi8(_mm256_setzero_si256(), m1), m2);
}

/* Element 32n + m is trit n of qs[m] (m < 32), 160 + 16n + m of qs[32 + m] (m < 16), 240 + 4n + j
 * of qh[j]: eight 32-element vectors of codes, in element order — five from qs[0..31], then
 * [trit 0 | trit 1] and [trit 2 | trit 3] of qs[32..47], then [its trit 4 | the 16 of qh]. */
static inline __attribute__((always_inline)) void tq1_row(const pg_block_tq1_0_x86 *x,
        const pg_block_q8_K *const *y, const int C, __m256i *is) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc16[IQX_MAX_C];
    IQX_UNROLL for (int j = 0; j < C; j++) acc16[j] = _mm256_setzero_si256();
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    __m256i q = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)x->qs), flip);
    IQX_UNROLL for (int n = 0; n < 5; n++) {
        const __m256i t = top_trit(q);
        IQX_UNROLL for (int j = 0; j < C; j++)
            acc16[j] = _mm256_add_epi16(acc16[j], _mm256_maddubs_epi16(t, _mm256_loadu_si256(
                (const __m256i *)(y[j]->qs + 32 * n))));
        if (n < 4) q = times3(q);
    }
    const __m128i c = _mm_xor_si128(_mm_loadu_si128((const __m128i *)(x->qs + 32)),
                                    _mm256_castsi256_si128(flip));
    const __m256i w0 = _mm256_set_m128i(times3_128(c), c);       /* trits 0 | 1 */
    const __m256i w1 = times3(times3(w0));                        /* trits 2 | 3 */
    /* qh's byte j times 3^n in byte 4n + j: one multiplier per 16-bit lane, the low and the
     * high byte multiplied apart (mod 256 each) */
    uint32_t h4;
    memcpy(&h4, x->qh, 4);
    const __m128i h = _mm_set1_epi32((int)h4), pw = _mm_setr_epi16(1, 1, 3, 3, 9, 9, 27, 27);
    const __m128i hp = _mm_xor_si128(
        _mm_or_si128(_mm_and_si128(_mm_mullo_epi16(h, pw), _mm_set1_epi16(0xff)),
                     _mm_mullo_epi16(_mm_and_si128(h, _mm_set1_epi16((short)0xff00)), pw)),
        _mm256_castsi256_si128(flip));
    const __m128i c81 = times3_128(times3_128(_mm256_castsi256_si128(w1)));
    const __m256i w2 = _mm256_set_m128i(hp, c81);                 /* trit 4 | qh */
    const __m256i t0 = top_trit(w0), t1 = top_trit(w1), t2 = top_trit(w2);
    IQX_UNROLL for (int j = 0; j < C; j++) {
        const int8_t *a = y[j]->qs;
        acc16[j] = _mm256_add_epi16(acc16[j], _mm256_maddubs_epi16(t0, _mm256_loadu_si256((const __m256i *)(a + 160))));
        acc16[j] = _mm256_add_epi16(acc16[j], _mm256_maddubs_epi16(t1, _mm256_loadu_si256((const __m256i *)(a + 192))));
        acc16[j] = _mm256_add_epi16(acc16[j], _mm256_maddubs_epi16(t2, _mm256_loadu_si256((const __m256i *)(a + 224))));
        is[j] = _mm256_sub_epi32(_mm256_madd_epi16(acc16[j], ones),
                                 _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y[j]->bsums),
                                                   ones));
    }
}

/* element 128h + 32l + m is bits 2l of qs[32h + m] */
static inline __attribute__((always_inline)) void tq2_row(const pg_block_tq2_0_x86 *x,
        const pg_block_q8_K *const *y, const int C, __m256i *is) {
    const __m256i m3 = _mm256_set1_epi8(3), ones = _mm256_set1_epi16(1);
    __m256i acc16[IQX_MAX_C];
    IQX_UNROLL for (int j = 0; j < C; j++) acc16[j] = _mm256_setzero_si256();
    IQX_UNROLL for (int h = 0; h < 2; h++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * h));
        IQX_UNROLL for (int l = 0; l < 4; l++) {
            const __m256i u = _mm256_and_si256(_mm256_srli_epi16(q, 2 * l), m3);
            IQX_UNROLL for (int j = 0; j < C; j++)
                acc16[j] = _mm256_add_epi16(acc16[j], _mm256_maddubs_epi16(u, _mm256_loadu_si256(
                    (const __m256i *)(y[j]->qs + 128 * h + 32 * l))));
        }
    }
    IQX_UNROLL for (int j = 0; j < C; j++)
        is[j] = _mm256_sub_epi32(_mm256_madd_epi16(acc16[j], ones),
                                 _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y[j]->bsums),
                                                   ones));
}

static inline int32_t hsum8(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

static void vec_dot_tq2_0_q8_K(int64_t n, float *restrict s, const void *restrict vx,
                               const void *restrict vy) {
    const pg_block_tq2_0_x86 *x = vx;
    const pg_block_q8_K *y = vy;
    float sum = 0;
    for (int64_t i = 0; i < n / PG_QK_K; i++) {
        const pg_block_q8_K *yi = &y[i];
        __m256i is;
        tq2_row(&x[i], &yi, 1, &is);
        sum += (_cvtsh_ss(x[i].d) * y[i].d) * (float)hsum8(is);
    }
    *s = sum;
}

static void vec_dot_tq1_0_q8_K(int64_t n, float *restrict s, const void *restrict vx,
                               const void *restrict vy) {
    const pg_block_tq1_0_x86 *x = vx;
    const pg_block_q8_K *y = vy;
    float sum = 0;
    for (int64_t i = 0; i < n / PG_QK_K; i++) {
        const pg_block_q8_K *yi = &y[i];
        __m256i is;
        tq1_row(&x[i], &yi, 1, &is);
        sum += (_cvtsh_ss(x[i].d) * y[i].d) * (float)hsum8(is);
    }
    *s = sum;
}

/* d is the block's last field (both types) */
#define TQ2_DX8(x, bx, b, size) iqx_rows8_fp16((x) + (size) - 2, bx, b, size)
IQX_ROWS8_Q8K(vec_dot8_tq2_0_q8_K, pg_block_tq2_0_x86, tq2_row, TQ2_DX8, 1.0f)
IQX_GEMM(gemm_tq2_0_q8_K, vec_dot8_tq2_0_q8_K, vec_dot_tq2_0_q8_K)
IQX_ROWS8_Q8K(vec_dot8_tq1_0_q8_K, pg_block_tq1_0_x86, tq1_row, TQ2_DX8, 1.0f)
IQX_GEMM(gemm_tq1_0_q8_K, vec_dot8_tq1_0_q8_K, vec_dot_tq1_0_q8_K)

void pg_fill_tq_avx2(pg_type_traits *tbl) {
    IQX_SET(tbl, PG_TYPE_TQ1_0, vec_dot_tq1_0_q8_K, vec_dot8_tq1_0_q8_K, gemm_tq1_0_q8_K);
    IQX_SET(tbl, PG_TYPE_TQ2_0, vec_dot_tq2_0_q8_K, vec_dot8_tq2_0_q8_K, gemm_tq2_0_q8_K);
}
