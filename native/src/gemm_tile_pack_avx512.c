/* The K-quant tile packs (layout: gemm_tile.h) for AVX-512, 16 rows at once: every dword of
 * the tile is 4 bytes of one row (lane r = row r), so a gather of the dword at byte o of the 16
 * rows' super-block gives a whole 64-byte chunk after the same shifts and masks that the
 * portable pack (gemm_tile.c) applies to one row's word. The portable pack writes the tile 4
 * bytes at a time (about 90 scattered stores per row and super-block); a tile costs it the dots
 * of ~22 (Q4_K) to ~35 (Q5_K) activation rows (in cache, Zen 4, K 2048), which decides when a
 * mixture-of-experts expert with few routed rows gains from the tiles (ops_moe.c). The result
 * is the portable pack's, byte for byte (native/tests/test_gemm_tile.c compares them). Q2_K and
 * Q3_K keep the portable pack. */
#include <immintrin.h>
#include <stdint.h>

#include "gemm_tile.h"
#include "kquants.h"
#include "pg_internal.h"
#include "quants.h"

#define AINL static inline __attribute__((always_inline))
#define PG_UNROLL _Pragma("GCC unroll 16")

/* each byte of v shifted by s (left if s > 0) within its own bits, then masked by m8 */
AINL __m512i shm(__m512i v, const int s, const int m8) {
    if (s > 0) v = _mm512_slli_epi32(v, (unsigned)s);
    if (s < 0) v = _mm512_srli_epi32(v, (unsigned)-s);
    return _mm512_and_si512(v, _mm512_set1_epi8((char)m8));
}

AINL void put(uint8_t *t, int off, __m512i v) { _mm512_storeu_si512((void *)(t + off), v); }

/* byte j of every dword of v, as int32 (SIGNED: sign-extended) */
AINL __m512i byte_of(__m512i v, const int j, const int SIGNED) {
    if (SIGNED) return _mm512_srai_epi32(_mm512_slli_epi32(v, (unsigned)(24 - 8 * j)), 24);
    return _mm512_and_si512(_mm512_srli_epi32(v, (unsigned)(8 * j)), _mm512_set1_epi32(0xFF));
}

/* TYPE 4: Q4_K, 5: Q5_K, 6: Q6_K */
AINL void pack_k(const int TYPE, size_t bsize, int64_t n, const void *x, size_t bx, int nr,
                 void *tile) {
    int32_t off[16];
    for (int r = 0; r < 16; r++) off[r] = r < nr ? (int32_t)((size_t)r * bx) : 0;
    const __m512i idx = _mm512_loadu_si512((const void *)off);
    const __m512i lo16 = _mm512_set1_epi32(0xFFFF);
#define G(o) _mm512_i32gather_epi32(idx, (const void *)(base + (o)), 1)
    for (int64_t b = 0; b < n / PG_QK_K; b++) {
        const char *base = (const char *)x + (size_t)b * bsize;
        uint8_t *t = (uint8_t *)tile + (size_t)b * PG_TILE_SB_BYTES;
        if (TYPE == 6) {   /* element 128h + 32g + 4k: ql nibbles, qh bits 2g */
            PG_UNROLL for (int h = 0; h < 2; h++)
                PG_UNROLL for (int k = 0; k < 8; k++) {
                    const __m512i a = G(64 * h + 4 * k), c = G(64 * h + 32 + 4 * k);
                    const __m512i q = G(128 + 32 * h + 4 * k);
                    const int lv = PG_TILE_LV + 64 * (32 * h + k);
                    put(t, lv, _mm512_or_si512(shm(a, 0, 0x0F), shm(q, 4, 0x30)));
                    put(t, lv + 64 * 8, _mm512_or_si512(shm(c, 0, 0x0F), shm(q, 2, 0x30)));
                    put(t, lv + 64 * 16, _mm512_or_si512(shm(a, -4, 0x0F), shm(q, 0, 0x30)));
                    put(t, lv + 64 * 24, _mm512_or_si512(shm(c, -4, 0x0F), shm(q, -2, 0x30)));
                }
            PG_UNROLL for (int j = 0; j < 4; j++) {   /* int8 scales at 192; w = 32·sc */
                const __m512i s4 = G(192 + 4 * j);
                __m512i sc[4];
                PG_UNROLL for (int i = 0; i < 4; i++) {
                    sc[i] = byte_of(s4, i, 1);
                    put(t, PG_TILE_SC + 64 * (4 * j + i), sc[i]);
                }
                PG_UNROLL for (int i = 0; i < 2; i++)
                    put(t, PG_TILE_BW + 64 * (2 * j + i),
                        _mm512_or_si512(_mm512_and_si512(_mm512_slli_epi32(sc[2 * i], 5), lo16),
                                        _mm512_slli_epi32(sc[2 * i + 1], 21)));
            }
            /* d: the fp16 at 208, read as the high half of the dword at 206 (the block ends
             * at 210: a dword at 208 would read past the last row) */
            _mm512_storeu_ps((void *)(t + PG_TILE_D),
                             _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(G(206), 16))));
            _mm512_storeu_ps((void *)(t + PG_TILE_DMIN), _mm512_setzero_ps());
            continue;
        }
        if (TYPE == 4) {   /* qs[32c + 4k..]: elements 64c + 4k (low nibbles), + 32 (high) */
            PG_UNROLL for (int c = 0; c < 4; c++)
                PG_UNROLL for (int k = 0; k < 8; k++) {
                    const __m512i q = G(16 + 32 * c + 4 * k);
                    put(t, PG_TILE_LV + 64 * (16 * c + k), shm(q, 0, 0x0F));
                    put(t, PG_TILE_LV + 64 * (16 * c + 8 + k), shm(q, -4, 0x0F));
                }
        } else {           /* Q5_K: as Q4_K, the 5th bit from qh[4k..] bit 2c (low) / 2c + 1 */
            PG_UNROLL for (int k = 0; k < 8; k++) {
                const __m512i h = G(16 + 4 * k);
                PG_UNROLL for (int c = 0; c < 4; c++) {
                    const __m512i q = G(48 + 32 * c + 4 * k);
                    put(t, PG_TILE_LV + 64 * (16 * c + k),
                        _mm512_or_si512(shm(q, 0, 0x0F), shm(h, 4 - 2 * c, 0x10)));
                    put(t, PG_TILE_LV + 64 * (16 * c + 8 + k),
                        _mm512_or_si512(shm(q, -4, 0x0F), shm(h, 3 - 2 * c, 0x10)));
                }
            }
        }
        /* the 12 scale bytes at 4 (pg_k4_unpack_scales on 16 rows): sc0..7, m0..7 */
        const __m512i u0 = G(4), u1 = G(8), u2 = G(12);
        const __m512i m6 = _mm512_set1_epi8(0x3F), m4 = _mm512_set1_epi8(0x0F),
                      m30 = _mm512_set1_epi8(0x30);
        const __m512i r[4] = {
            _mm512_and_si512(u0, m6),
            _mm512_or_si512(_mm512_and_si512(u2, m4),
                            _mm512_and_si512(_mm512_srli_epi32(u0, 2), m30)),
            _mm512_and_si512(u1, m6),
            _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u2, 4), m4),
                            _mm512_and_si512(_mm512_srli_epi32(u1, 2), m30)),
        };
        PG_UNROLL for (int g = 0; g < 8; g++) {
            put(t, PG_TILE_SC + 64 * g, byte_of(r[g / 4], g % 4, 0));
            put(t, PG_TILE_SC + 64 * (8 + g), _mm512_setzero_si512());
            const __m512i m = byte_of(r[2 + g / 4], g % 4, 0);
            put(t, PG_TILE_BW + 64 * g, _mm512_or_si512(m, _mm512_slli_epi32(m, 16)));
        }
        const __m512i w0 = G(0);   /* d | dmin << 16 */
        _mm512_storeu_ps((void *)(t + PG_TILE_D), _mm512_cvtph_ps(_mm512_cvtepi32_epi16(w0)));
        _mm512_storeu_ps((void *)(t + PG_TILE_DMIN),
                         _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(w0, 16))));
    }
#undef G
}

void pg_tile_pack_q4_K_avx512(int64_t n, const void *x, size_t bx, int nr, void *tile) {
    pack_k(4, sizeof(pg_block_q4_K), n, x, bx, nr, tile);
}
void pg_tile_pack_q5_K_avx512(int64_t n, const void *x, size_t bx, int nr, void *tile) {
    pack_k(5, sizeof(pg_block_q5_K), n, x, bx, nr, tile);
}
void pg_tile_pack_q6_K_avx512(int64_t n, const void *x, size_t bx, int nr, void *tile) {
    pack_k(6, sizeof(pg_block_q6_K), n, x, bx, nr, tile);
}
