/* The K-quant tile packs (layout: gemm_tile.h) for AVX2: gemm_tile_pack_avx512.c's gathers, 8
 * rows at a time (rows 0..7 fill the low 32 bytes of every 64-byte chunk, rows 8..15 the high
 * 32); the portable pack's bytes (native/tests/test_tile_pack.c). */
#include <immintrin.h>
#include <stdint.h>

#include "gemm_tile.h"
#include "kquants.h"
#include "pg_internal.h"
#include "quants.h"

#define AINL static inline __attribute__((always_inline))
#define PG_UNROLL _Pragma("GCC unroll 16")

/* each byte of v shifted by s (left if s > 0) within its own bits, then masked by m8 */
AINL __m256i shm(__m256i v, const int s, const int m8) {
    if (s > 0) v = _mm256_slli_epi32(v, (unsigned)s);
    if (s < 0) v = _mm256_srli_epi32(v, (unsigned)-s);
    return _mm256_and_si256(v, _mm256_set1_epi8((char)m8));
}

/* the fp16 in the low half of each dword, as float */
AINL __m256 half_to_ps(__m256i v) {
    v = _mm256_and_si256(v, _mm256_set1_epi32(0xFFFF));
    const __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(v, v), 0x08);
    return _mm256_cvtph_ps(_mm256_castsi256_si128(p));
}

AINL void put(uint8_t *t, int off, __m256i v) { _mm256_storeu_si256((__m256i *)(t + off), v); }

/* byte j of every dword of v, as int32 (SIGNED: sign-extended) */
AINL __m256i byte_of(__m256i v, const int j, const int SIGNED) {
    if (SIGNED) return _mm256_srai_epi32(_mm256_slli_epi32(v, (unsigned)(24 - 8 * j)), 24);
    return _mm256_and_si256(_mm256_srli_epi32(v, (unsigned)(8 * j)), _mm256_set1_epi32(0xFF));
}

/* TYPE 4: Q4_K, 5: Q5_K, 6: Q6_K; rows 8·hf.. into bytes 32·hf.. of every chunk */
AINL void pack_half(const int TYPE, size_t bsize, int64_t n, const void *x, size_t bx, int nr,
                    void *tile, int hf) {
    int32_t off[8];
    for (int i = 0; i < 8; i++)
        off[i] = 8 * hf + i < nr ? (int32_t)((size_t)(8 * hf + i) * bx) : 0;
    const __m256i idx = _mm256_loadu_si256((const __m256i *)off);
    const __m256i lo16 = _mm256_set1_epi32(0xFFFF);
#define G(o) _mm256_i32gather_epi32((const int *)(base + (o)), idx, 1)
    for (int64_t b = 0; b < n / PG_QK_K; b++) {
        const char *base = (const char *)x + (size_t)b * bsize;
        uint8_t *t = (uint8_t *)tile + (size_t)b * PG_TILE_SB_BYTES + 32 * hf;
        if (TYPE == 6) {   /* element 128h + 32g + 4k: ql nibbles, qh bits 2g */
            PG_UNROLL for (int h = 0; h < 2; h++)
                PG_UNROLL for (int k = 0; k < 8; k++) {
                    const __m256i a = G(64 * h + 4 * k), c = G(64 * h + 32 + 4 * k);
                    const __m256i q = G(128 + 32 * h + 4 * k);
                    const int lv = PG_TILE_LV + 64 * (32 * h + k);
                    put(t, lv, _mm256_or_si256(shm(a, 0, 0x0F), shm(q, 4, 0x30)));
                    put(t, lv + 64 * 8, _mm256_or_si256(shm(c, 0, 0x0F), shm(q, 2, 0x30)));
                    put(t, lv + 64 * 16, _mm256_or_si256(shm(a, -4, 0x0F), shm(q, 0, 0x30)));
                    put(t, lv + 64 * 24, _mm256_or_si256(shm(c, -4, 0x0F), shm(q, -2, 0x30)));
                }
            PG_UNROLL for (int j = 0; j < 4; j++) {   /* int8 scales at 192; w = 32·sc */
                const __m256i s4 = G(192 + 4 * j);
                __m256i sc[4];
                PG_UNROLL for (int i = 0; i < 4; i++) {
                    sc[i] = byte_of(s4, i, 1);
                    put(t, PG_TILE_SC + 64 * (4 * j + i), sc[i]);
                }
                PG_UNROLL for (int i = 0; i < 2; i++)
                    put(t, PG_TILE_BW + 64 * (2 * j + i),
                        _mm256_or_si256(_mm256_and_si256(_mm256_slli_epi32(sc[2 * i], 5), lo16),
                                        _mm256_slli_epi32(sc[2 * i + 1], 21)));
            }
            /* d: the fp16 at 208, read as the high half of the dword at 206 (the block ends
             * at 210: a dword at 208 would read past the last row) */
            _mm256_storeu_ps((void *)(t + PG_TILE_D),
                             half_to_ps(_mm256_srli_epi32(G(206), 16)));
            _mm256_storeu_ps((void *)(t + PG_TILE_DMIN), _mm256_setzero_ps());
            continue;
        }
        if (TYPE == 4) {   /* qs[32c + 4k..]: elements 64c + 4k (low nibbles), + 32 (high) */
            PG_UNROLL for (int c = 0; c < 4; c++)
                PG_UNROLL for (int k = 0; k < 8; k++) {
                    const __m256i q = G(16 + 32 * c + 4 * k);
                    put(t, PG_TILE_LV + 64 * (16 * c + k), shm(q, 0, 0x0F));
                    put(t, PG_TILE_LV + 64 * (16 * c + 8 + k), shm(q, -4, 0x0F));
                }
        } else {           /* Q5_K: as Q4_K, the 5th bit from qh[4k..] bit 2c (low) / 2c + 1 */
            PG_UNROLL for (int k = 0; k < 8; k++) {
                const __m256i h = G(16 + 4 * k);
                PG_UNROLL for (int c = 0; c < 4; c++) {
                    const __m256i q = G(48 + 32 * c + 4 * k);
                    put(t, PG_TILE_LV + 64 * (16 * c + k),
                        _mm256_or_si256(shm(q, 0, 0x0F), shm(h, 4 - 2 * c, 0x10)));
                    put(t, PG_TILE_LV + 64 * (16 * c + 8 + k),
                        _mm256_or_si256(shm(q, -4, 0x0F), shm(h, 3 - 2 * c, 0x10)));
                }
            }
        }
        /* the 12 scale bytes at 4 (pg_k4_unpack_scales on 16 rows): sc0..7, m0..7 */
        const __m256i u0 = G(4), u1 = G(8), u2 = G(12);
        const __m256i m6 = _mm256_set1_epi8(0x3F), m4 = _mm256_set1_epi8(0x0F),
                      m30 = _mm256_set1_epi8(0x30);
        const __m256i r[4] = {
            _mm256_and_si256(u0, m6),
            _mm256_or_si256(_mm256_and_si256(u2, m4),
                            _mm256_and_si256(_mm256_srli_epi32(u0, 2), m30)),
            _mm256_and_si256(u1, m6),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u2, 4), m4),
                            _mm256_and_si256(_mm256_srli_epi32(u1, 2), m30)),
        };
        PG_UNROLL for (int g = 0; g < 8; g++) {
            put(t, PG_TILE_SC + 64 * g, byte_of(r[g / 4], g % 4, 0));
            put(t, PG_TILE_SC + 64 * (8 + g), _mm256_setzero_si256());
            const __m256i m = byte_of(r[2 + g / 4], g % 4, 0);
            put(t, PG_TILE_BW + 64 * g, _mm256_or_si256(m, _mm256_slli_epi32(m, 16)));
        }
        const __m256i w0 = G(0);   /* d | dmin << 16 */
        _mm256_storeu_ps((void *)(t + PG_TILE_D), half_to_ps(w0));
        _mm256_storeu_ps((void *)(t + PG_TILE_DMIN),
                         half_to_ps(_mm256_srli_epi32(w0, 16)));
    }
#undef G
}

AINL void pack_k(const int TYPE, size_t bsize, int64_t n, const void *x, size_t bx, int nr,
                 void *tile) {
    pack_half(TYPE, bsize, n, x, bx, nr, tile, 0);
    pack_half(TYPE, bsize, n, x, bx, nr, tile, 1);
}

void pg_tile_pack_q4_K_avx2(int64_t n, const void *x, size_t bx, int nr, void *tile) {
    pack_k(4, sizeof(pg_block_q4_K), n, x, bx, nr, tile);
}
void pg_tile_pack_q5_K_avx2(int64_t n, const void *x, size_t bx, int nr, void *tile) {
    pack_k(5, sizeof(pg_block_q5_K), n, x, bx, nr, tile);
}
void pg_tile_pack_q6_K_avx2(int64_t n, const void *x, size_t bx, int nr, void *tile) {
    pack_k(6, sizeof(pg_block_q6_K), n, x, bx, nr, tile);
}
