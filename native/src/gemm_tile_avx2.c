/* The repacked 16-row tiles of prompt-sized K-quant MUL_MATs with AVX2 (no VNNI): the avx2
 * path's form of gemm_tile_avx512.c (layout: gemm_tile.h, pack: gemm_tile.c). Each 64-byte
 * tile vector is two halves of 8 rows (lane r of half h = weight row 8h + r).
 *
 * Per chunk of 4 elements and activation row, one maddubs of the 8 rows' levels with the
 * activation's 4 bytes broadcast gives int16 pair sums; the chunks of a scale group add up in
 * int16 as far as they cannot overflow (|q·a| pairs ≤ 2·max·128: 4 chunks for levels ≤ 31
 * (Q5_K) and ≤ 7 (Q3_K), 2 for Q6_K's ≤ 63, 4 for Q2_K's groups of 16), then one madd with the
 * rows' scales (int16 pairs) makes int32. Installed for Q2_K, Q3_K, Q5_K and Q6_K (1.1-1.4x
 * the avx2 gemm in cache on AMD Zen 4); for Q4_K it was no faster. Integer sums exact, the
 * scalar vec_dot's fp32 super-block term per row in block order: the bits of vec_dot
 * (native/tests/test_gemm_tile.c). */
#include <immintrin.h>
#include <string.h>

#include "gemm_tile.h"
#include "kquants.h"
#include "pg_internal.h"
#include "quants.h"

#define AINL static inline __attribute__((always_inline))
#ifdef __SANITIZE_ADDRESS__
/* under ASan GCC cannot honour the unroll request on the loops over a group's chunks and says so
   (an error with -Werror); unrolling changes no result, only speed */
#define PG_UNROLL
#else
#define PG_UNROLL _Pragma("GCC unroll 16")
#endif

AINL __m256i bcast32(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

#define PG_TILE2_C 4   /* activation rows per pass over the tile */

/* y[j] (j < C): activation rows (Q8_K); acc[j][16]: their running sums. GS: elements per scale,
 * CH: chunks per int16 partial sum, HAS_MIN as in the avx512 form. */
AINL void tile_rows(int64_t n, const uint8_t *tile, const pg_block_q8_K *const *y,
                    float acc[PG_TILE2_C][16], const int GS, const int CH, const int HAS_MIN) {
    const int C = PG_TILE2_C;
    const __m256i lo16 = _mm256_set1_epi32(0xFFFF);
    for (int64_t b = 0; b < n / PG_QK_K; b++) {
        const uint8_t *t = tile + (size_t)b * PG_TILE_SB_BYTES;
        const pg_block_q8_K *yb[PG_TILE2_C];
        PG_UNROLL for (int j = 0; j < C; j++) yb[j] = y[j] + b;
        for (int h = 0; h < 2; h++) {
            __m256i isum[PG_TILE2_C];
            PG_UNROLL for (int j = 0; j < C; j++) isum[j] = _mm256_setzero_si256();
            for (int g = 0; g < PG_QK_K / GS; g++) {
                const __m256i s32 =
                    _mm256_loadu_si256((const void *)(t + PG_TILE_SC + 64 * g + 32 * h));
                const __m256i scw = _mm256_or_si256(_mm256_and_si256(s32, lo16),
                                                    _mm256_slli_epi32(s32, 16));
                PG_UNROLL for (int p = 0; p < GS / 4 / CH; p++) {
                    __m256i s16[PG_TILE2_C];
                    PG_UNROLL for (int j = 0; j < C; j++) s16[j] = _mm256_setzero_si256();
                    PG_UNROLL for (int e = 0; e < CH; e++) {
                        const int ch = g * (GS / 4) + p * CH + e;
                        const __m256i lv =
                            _mm256_loadu_si256((const void *)(t + PG_TILE_LV + 64 * ch + 32 * h));
                        PG_UNROLL for (int j = 0; j < C; j++)
                            s16[j] = _mm256_add_epi16(
                                s16[j], _mm256_maddubs_epi16(lv, bcast32(yb[j]->qs + 4 * ch)));
                    }
                    PG_UNROLL for (int j = 0; j < C; j++)
                        isum[j] = _mm256_add_epi32(isum[j], _mm256_madd_epi16(s16[j], scw));
                }
            }
            const __m256 d = _mm256_loadu_ps((const void *)(t + PG_TILE_D + 32 * h));
            PG_UNROLL for (int j = 0; j < C; j++) {
                __m256i m = _mm256_setzero_si256();
                PG_UNROLL for (int k = 0; k < 8; k++)
                    m = _mm256_add_epi32(
                        m, _mm256_madd_epi16(
                               _mm256_loadu_si256((const void *)(t + PG_TILE_BW + 64 * k + 32 * h)),
                               bcast32(yb[j]->bsums + 2 * k)));
                const __m256 dy = _mm256_set1_ps(yb[j]->d);
                __m256 term;
                if (HAS_MIN) {   /* (dy·d)·isum − (dy·dmin)·summs */
                    const __m256 dmin = _mm256_loadu_ps((const void *)(t + PG_TILE_DMIN + 32 * h));
                    term = _mm256_sub_ps(
                        _mm256_mul_ps(_mm256_mul_ps(dy, d), _mm256_cvtepi32_ps(isum[j])),
                        _mm256_mul_ps(_mm256_mul_ps(dy, dmin), _mm256_cvtepi32_ps(m)));
                } else {         /* (d·dy)·isum, isum with the levels' offset */
                    term = _mm256_mul_ps(_mm256_mul_ps(d, dy),
                                         _mm256_cvtepi32_ps(_mm256_sub_epi32(isum[j], m)));
                }
                float *a = acc[j] + 8 * h;
                _mm256_storeu_ps(a, _mm256_add_ps(_mm256_loadu_ps(a), term));
            }
        }
    }
}

AINL void tile_gemm(int64_t n, const void *tile, const void *y, size_t by, int64_t nc, float *s,
                    size_t bs, int nr, const int GS, const int CH, const int HAS_MIN) {
    for (int64_t j0 = 0; j0 < nc; j0 += PG_TILE2_C) {
        const int c = (int)(nc - j0 < PG_TILE2_C ? nc - j0 : PG_TILE2_C);
        const pg_block_q8_K *yr[PG_TILE2_C];
        for (int j = 0; j < PG_TILE2_C; j++)   /* past c: row j0 again, never stored */
            yr[j] = (const pg_block_q8_K *)((const char *)y + (size_t)(j0 + (j < c ? j : 0)) * by);
        float acc[PG_TILE2_C][16] = {{0}};
        tile_rows(n, (const uint8_t *)tile, yr, acc, GS, CH, HAS_MIN);
        for (int j = 0; j < c; j++)
            memcpy((char *)s + (size_t)(j0 + j) * bs, acc[j], (size_t)nr * sizeof(float));
    }
}

#define PG_TILE2_GEMM(name, GS, CH, HAS_MIN)                                                       \
    static void name(int64_t n, const void *tile, const void *y, size_t by, int64_t nc,           \
                     float *s, size_t bs, int nr) {                                                \
        tile_gemm(n, tile, y, by, nc, s, bs, nr, GS, CH, HAS_MIN);                                 \
    }
PG_TILE2_GEMM(tile_q2_K, 16, 4, 1)
PG_TILE2_GEMM(tile_q3_K, 16, 4, 0)
PG_TILE2_GEMM(tile_q5_K, 32, 4, 1)
PG_TILE2_GEMM(tile_q6_K, 16, 2, 0)

void pg_fill_gemm_tile_avx2(pg_type_traits *tbl) {
    tbl[PG_TYPE_Q2_K].tile_pack = pg_tile_pack_q2_K;
    tbl[PG_TYPE_Q2_K].tile_gemm = tile_q2_K;
    tbl[PG_TYPE_Q3_K].tile_pack = pg_tile_pack_q3_K;
    tbl[PG_TYPE_Q3_K].tile_gemm = tile_q3_K;
    /* not Q4_K: measured no faster than the avx2 gemm here (in cache, 1 thread, K 1536, M 512,
     * AMD Zen 4: 145 GOP/s both, with 8 or 4 chunks per int16 partial) */
    tbl[PG_TYPE_Q5_K].tile_pack = pg_tile_pack_q5_K;
    tbl[PG_TYPE_Q5_K].tile_gemm = tile_q5_K;
    tbl[PG_TYPE_Q6_K].tile_pack = pg_tile_pack_q6_K;
    tbl[PG_TYPE_Q6_K].tile_gemm = tile_q6_K;
}
