/* The K-quant packs of the repacked 16-row tiles (layout: gemm_tile.h; why and the legacy
 * formats' packs: gemm_tile_avx512.c): portable C on 32-bit words (each word of a block's
 * bytes holds 4 consecutive elements of the row, so every decode is the scalar kernel's on 4 bytes at once; shifts and masks never mix
 * bytes), installed by the avx2 path (avx512 packs the same bytes 16 rows at a time by gathers:
 * gemm_tile_pack_avx512.c; Q2_K and Q3_K take these there too). A row's super-block costs a
 * few hundred operations, once per MUL_MAT, against 16 rows × every activation row of dots. */
#include <string.h>

#include "fp16.h"
#include "gemm_tile.h"
#include "kquants.h"

static inline uint32_t ld32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* each byte of v shifted by s (left if s > 0) within its own bits, then masked by mask8 */
static inline uint32_t shm(uint32_t v, int s, uint32_t mask8) {
    return (s >= 0 ? v << s : v >> -s) & (mask8 * 0x01010101u);
}

static inline void put(uint8_t *t, int chunk, int r, uint32_t v) {
    memcpy(t + PG_TILE_LV + 64 * chunk + 4 * r, &v, 4);
}

/* ---- K-quants -------------------------------------------------------------------------------- */

static void levels_k(int32_t type, const uint8_t *p, int r, uint8_t *t) {
    switch (type) {
    case PG_TYPE_Q4_K:   /* qs[32c + 4k..]: elements 64c + 4k (low nibbles), + 32 (high) */
        for (int c = 0; c < 4; c++)
            for (int k = 0; k < 8; k++) {
                const uint32_t q = ld32(p + 16 + 32 * c + 4 * k);
                put(t, 16 * c + k, r, shm(q, 0, 0x0F));
                put(t, 16 * c + 8 + k, r, shm(q, -4, 0x0F));
            }
        break;
    case PG_TYPE_Q5_K:   /* as Q4_K, the 5th bit from qh[4k..] bit 2c (low) / 2c + 1 (high) */
        for (int k = 0; k < 8; k++) {
            const uint32_t h = ld32(p + 16 + 4 * k);
            for (int c = 0; c < 4; c++) {
                const uint32_t q = ld32(p + 48 + 32 * c + 4 * k);
                put(t, 16 * c + k, r, shm(q, 0, 0x0F) | shm(h, 4 - 2 * c, 0x10));
                put(t, 16 * c + 8 + k, r, shm(q, -4, 0x0F) | shm(h, 3 - 2 * c, 0x10));
            }
        }
        break;
    case PG_TYPE_Q6_K:   /* element 128h + 32g + 4k: ql nibbles, qh bits 2g */
        for (int h = 0; h < 2; h++)
            for (int k = 0; k < 8; k++) {
                const uint32_t a = ld32(p + 64 * h + 4 * k), b = ld32(p + 64 * h + 32 + 4 * k);
                const uint32_t q = ld32(p + 128 + 32 * h + 4 * k);
                put(t, 32 * h + k, r, shm(a, 0, 0x0F) | shm(q, 4, 0x30));
                put(t, 32 * h + 8 + k, r, shm(b, 0, 0x0F) | shm(q, 2, 0x30));
                put(t, 32 * h + 16 + k, r, shm(a, -4, 0x0F) | shm(q, 0, 0x30));
                put(t, 32 * h + 24 + k, r, shm(b, -4, 0x0F) | shm(q, -2, 0x30));
            }
        break;
    case PG_TYPE_Q3_K:   /* element 128h + 32j + 4k: bits 2j of qs, + 4 where hmask bit 4h + j */
        for (int k = 0; k < 8; k++) {
            const uint32_t m = ld32(p + 4 * k);
            for (int h = 0; h < 2; h++) {
                const uint32_t q = ld32(p + 32 + 32 * h + 4 * k);
                for (int j = 0; j < 4; j++)
                    put(t, 32 * h + 8 * j + k, r, shm(q, -2 * j, 3) | shm(m, 2 - (4 * h + j), 4));
            }
        }
        break;
    default:             /* Q2_K: element 128h + 32j + 4k: bits 2j of qs */
        for (int h = 0; h < 2; h++)
            for (int k = 0; k < 8; k++) {
                const uint32_t q = ld32(p + 16 + 32 * h + 4 * k);
                for (int j = 0; j < 4; j++) put(t, 32 * h + 8 * j + k, r, shm(q, -2 * j, 3));
            }
        break;
    }
}

/* lane r of sc, bw, d, dmin from the row's super-block p */
static void fields_k(int32_t type, const uint8_t *p, int r, uint8_t *t) {
    int32_t sc[16] = {0};
    int16_t w[16];
    float d, dmin = 0.0f;
    pg_fp16 h;
    switch (type) {
    case PG_TYPE_Q4_K:
    case PG_TYPE_Q5_K: {
        uint8_t sm[16];
        pg_k4_unpack_scales(p + 4, sm);
        for (int g = 0; g < 8; g++) {
            sc[g] = sm[g];
            w[2 * g] = w[2 * g + 1] = sm[8 + g];
        }
        memcpy(&h, p, 2);
        d = pg_fp16_to_fp32(h);
        memcpy(&h, p + 2, 2);
        dmin = pg_fp16_to_fp32(h);
        break;
    }
    case PG_TYPE_Q6_K:
        for (int g = 0; g < 16; g++) {
            sc[g] = (int8_t)p[192 + g];
            w[g] = (int16_t)(32 * sc[g]);
        }
        memcpy(&h, p + 208, 2);
        d = pg_fp16_to_fp32(h);
        break;
    case PG_TYPE_Q3_K: {
        int8_t s8[16];
        pg_k3_unpack_scales(p + 96, s8);
        for (int g = 0; g < 16; g++) {
            sc[g] = s8[g];
            w[g] = (int16_t)(4 * s8[g]);
        }
        memcpy(&h, p + 108, 2);
        d = pg_fp16_to_fp32(h);
        break;
    }
    default:   /* Q2_K */
        for (int g = 0; g < 16; g++) {
            sc[g] = p[g] & 0xF;
            w[g] = (int16_t)(p[g] >> 4);
        }
        memcpy(&h, p + 80, 2);
        d = pg_fp16_to_fp32(h);
        memcpy(&h, p + 82, 2);
        dmin = pg_fp16_to_fp32(h);
        break;
    }
    for (int g = 0; g < 16; g++) memcpy(t + PG_TILE_SC + 64 * g + 4 * r, &sc[g], 4);
    for (int k = 0; k < 8; k++) memcpy(t + PG_TILE_BW + 64 * k + 4 * r, &w[2 * k], 4);
    memcpy(t + PG_TILE_D + 4 * r, &d, 4);
    memcpy(t + PG_TILE_DMIN + 4 * r, &dmin, 4);
}

static void pack_k(int32_t type, size_t bsize, int64_t n, const void *x, size_t bx, int nr,
                   void *tile) {
    for (int64_t b = 0; b < n / PG_QK_K; b++) {
        uint8_t *t = (uint8_t *)tile + (size_t)b * PG_TILE_SB_BYTES;
        for (int r = 0; r < PG_TILE_ROWS; r++) {
            const uint8_t *p =
                (const uint8_t *)x + (size_t)(r < nr ? r : 0) * bx + (size_t)b * bsize;
            levels_k(type, p, r, t);
            fields_k(type, p, r, t);
        }
    }
}

void pg_tile_pack_q2_K(int64_t n, const void *x, size_t bx, int nr, void *tile) {
    pack_k(PG_TYPE_Q2_K, sizeof(pg_block_q2_K), n, x, bx, nr, tile);
}
void pg_tile_pack_q3_K(int64_t n, const void *x, size_t bx, int nr, void *tile) {
    pack_k(PG_TYPE_Q3_K, sizeof(pg_block_q3_K), n, x, bx, nr, tile);
}
void pg_tile_pack_q4_K(int64_t n, const void *x, size_t bx, int nr, void *tile) {
    pack_k(PG_TYPE_Q4_K, sizeof(pg_block_q4_K), n, x, bx, nr, tile);
}
void pg_tile_pack_q5_K(int64_t n, const void *x, size_t bx, int nr, void *tile) {
    pack_k(PG_TYPE_Q5_K, sizeof(pg_block_q5_K), n, x, bx, nr, tile);
}
void pg_tile_pack_q6_K(int64_t n, const void *x, size_t bx, int nr, void *tile) {
    pack_k(PG_TYPE_Q6_K, sizeof(pg_block_q6_K), n, x, bx, nr, tile);
}
