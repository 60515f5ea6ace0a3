/* IQ4_NL, IQ4_XS and MXFP4: the AVX-512 VNNI variants of the x86 kernels (iq4_x86_body.h):
 * integer dots of 32 bytes through 256-bit VPDPBUSD (IQ4_NL's and MXFP4's eight-row kernels
 * with the values + 128, IQ4_OFFSET128: 12.9 -> 15.1 and 11.5 -> 13.0 GB/s in cache), IQ4_XS's
 * scaled pair sums through VPDPWSSD and its eight-row kernel on 512-bit rows (below). Installed on the avx512 path only with AVX512-VNNI (without it the path keeps the
 * AVX2 kernels). The scalar kernels' bits, as on every path. */
#include "pg_internal.h"

#define PG_X86_DOT_US(u, s) _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s)
#define PG_X86_DOT_Q4_0(q, a)                                                                   \
    _mm256_sub_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), q, a),                         \
                     _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(8), a))
#define IQ4_DOT_SCALED(acc, u, s, sc) _mm256_dpwssd_epi32(acc, _mm256_maddubs_epi16(u, s), sc)
#define IQ4_OFFSET128 1
#include "iq4_x86_body.h"

/* ---- IQ4_XS · Q8_K on 512-bit rows ------------------------------------------------------------
 * 64 code bytes hold sub-blocks 4h..4h+3: their low nibbles (elements 0..15 of each) and high
 * nibbles (16..31) become one 128-bit lane per sub-block. The table holds the values + 128
 * (unsigned, for VPDPBUSD); the activations are regrouped once per block to the same lanes
 * (shared by the eight weight rows). Per sub-block ib, with a the activations:
 *     Σ v·a = Σ (v + 128)·a − 128·Σ a,   Σ a = bsums[2ib] + bsums[2ib + 1],
 * so isum = Σ_ib s_ib·Σ (v + 128)·a − 128·Σ_ib s_ib·(bsums pair), all exact in int32
 * (|lane| <= 8·241·128·32). */

static inline __m256i half_sum512(__m512i v) {
    return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

static inline __attribute__((always_inline)) void iq4xs_rows8_512_c(int64_t n, float *s,
        size_t bs, const void *vx, size_t bx, const void *vy, size_t by, const int C) {
    const char *x = vx;
    const __m512i m4 = _mm512_set1_epi8(0xF);
    const __m512i lut = _mm512_broadcast_i32x4(
        _mm_add_epi8(_mm_loadu_si128((const __m128i *)pg_kv_iq4nl), _mm_set1_epi8(-128)));
    const __m128i pick0 = _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m128i pick1 = _mm_setr_epi8(4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7);
    const __m128i pair = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    __m256 acc[IQX_MAX_C];
    IQX_UNROLL for (int j = 0; j < C; j++) acc[j] = _mm256_setzero_ps();
    const int64_t nb = n / PG_QK_K;
    const size_t share = iqx_share(bx, nb);
    for (int64_t b = 0; b < nb; b++) {
        iqx_prefetch(vx, bx, b, share);
        const pg_block_q8_K *yb[IQX_MAX_C];
        __m512i alo[IQX_MAX_C][2], ahi[IQX_MAX_C][2];
        __m256i bsum[IQX_MAX_C];
        IQX_UNROLL for (int j = 0; j < C; j++) {
            yb[j] = (const pg_block_q8_K *)((const char *)vy + (size_t)j * by) + b;
            IQX_UNROLL for (int h = 0; h < 2; h++) {
                const __m512i a0 = _mm512_loadu_si512(yb[j]->qs + 128 * h);
                const __m512i a1 = _mm512_loadu_si512(yb[j]->qs + 128 * h + 64);
                alo[j][h] = _mm512_shuffle_i64x2(a0, a1, _MM_SHUFFLE(2, 0, 2, 0));
                ahi[j][h] = _mm512_shuffle_i64x2(a0, a1, _MM_SHUFFLE(3, 1, 3, 1));
            }
            bsum[j] = _mm256_loadu_si256((const __m256i *)yb[j]->bsums);
        }
        __m256i is[IQX_MAX_C][8];
        IQX_UNROLL for (int r = 0; r < 8; r++) {
            const pg_block_iq4_xs *xr = (const pg_block_iq4_xs *)(x + (size_t)r * bx) + b;
            const __m128i sc8 = iq4xs_scales8(xr);
            const __m512i sc0 = _mm512_cvtepi8_epi32(_mm_shuffle_epi8(sc8, pick0));
            const __m512i sc1 = _mm512_cvtepi8_epi32(_mm_shuffle_epi8(sc8, pick1));
            const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, pair));
            __m512i ulo[2], uhi[2];
            IQX_UNROLL for (int h = 0; h < 2; h++) {
                const __m512i q = _mm512_loadu_si512(xr->qs + 64 * h);
                ulo[h] = _mm512_shuffle_epi8(lut, _mm512_and_si512(q, m4));
                uhi[h] = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(q, 4), m4));
            }
            IQX_UNROLL for (int j = 0; j < C; j++) {
                __m512i d[2];
                IQX_UNROLL for (int h = 0; h < 2; h++)
                    d[h] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ulo[h],
                                                                   alo[j][h]),
                                               uhi[h], ahi[j][h]);
                const __m512i t = _mm512_add_epi32(_mm512_mullo_epi32(d[0], sc0),
                                                   _mm512_mullo_epi32(d[1], sc1));
                const __m256i corr = _mm256_slli_epi32(_mm256_madd_epi16(bsum[j], sc16), 7);
                is[j][r] = _mm256_sub_epi32(half_sum512(t), corr);
            }
        }
        const __m256 dx = iqx_rows8_fp16(x, bx, b, sizeof(pg_block_iq4_xs));
        IQX_UNROLL for (int j = 0; j < C; j++) {
            const __m256 f = _mm256_cvtepi32_ps(iqx_fold8(is[j]));
            acc[j] = _mm256_add_ps(acc[j], _mm256_mul_ps(
                _mm256_mul_ps(dx, _mm256_set1_ps(yb[j]->d)), f));
        }
    }
    IQX_UNROLL for (int j = 0; j < C; j++)
        _mm256_storeu_ps((float *)((char *)s + (size_t)j * bs), acc[j]);
}

IQX_ROWS8_DISPATCH(iq4xs_rows8_512)
IQX_GEMM(gemm_iq4_xs_q8_K_512, iq4xs_rows8_512, vec_dot_iq4_xs_q8_K)

void pg_fill_iquants_avx512(pg_type_traits *tbl) {
    if (!(pg_g_cpu_features & PG_CPU_AVX512VNNI)) return;
    IQX_SET(tbl, PG_TYPE_IQ4_NL, vec_dot_iq4_nl_q8_0, vec_dot8_iq4_nl_q8_0, gemm_iq4_nl_q8_0);
    IQX_SET(tbl, PG_TYPE_MXFP4, vec_dot_mxfp4_q8_0, vec_dot8_mxfp4_q8_0, gemm_mxfp4_q8_0);
    IQX_SET(tbl, PG_TYPE_IQ4_XS, vec_dot_iq4_xs_q8_K, iq4xs_rows8_512, gemm_iq4_xs_q8_K_512);
}
