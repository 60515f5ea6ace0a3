/* TQ2_0 · Q8_K: the AVX2 dot (vec_dot, vec_dot8, gemm through iq_x86.h) with the scalar
 * kernel's bits (quants_tq.c). Levels q − 1 with q the 2-bit codes (0..3): Σ (q − 1)·a =
 * Σ q·a − Σ a, Σ q·a by maddubs with q unsigned (eight products of |q·a| <= 3·128 per int16
 * lane, summed in int16: <= 6144), Σ a from the activation block's bsums; exact int32 lanes,
 * the block term (d·d_y)·isum in block order. (TQ1_0 keeps the scalar kernel.) */
#include <immintrin.h>
#include <string.h>

#include "iq_x86.h"
#include "kquants.h"
#include "quants.h"

typedef struct { uint8_t qs[64]; uint16_t d; } pg_block_tq2_0_x86;
_Static_assert(sizeof(pg_block_tq2_0_x86) == 66, "TQ2_0 block must be 66 bytes");

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

/* d is the block's last field */
#define TQ2_DX8(x, bx, b, size) iqx_rows8_fp16((x) + (size) - 2, bx, b, size)
IQX_ROWS8_Q8K(vec_dot8_tq2_0_q8_K, pg_block_tq2_0_x86, tq2_row, TQ2_DX8, 1.0f)
IQX_GEMM(gemm_tq2_0_q8_K, vec_dot8_tq2_0_q8_K, vec_dot_tq2_0_q8_K)

void pg_fill_tq_avx2(pg_type_traits *tbl) {
    IQX_SET(tbl, PG_TYPE_TQ2_0, vec_dot_tq2_0_q8_K, vec_dot8_tq2_0_q8_K, gemm_tq2_0_q8_K);
}
