/* Prompt-sized MUL_MAT of the K-quants with AVX-512 VNNI, 16 weight rows at a time through a
 * repacked tile (pg_type_traits.tile_pack / tile_gemm, quants.h; ops_mul_mat.c calls them).
 *
 * Why a tile: the four-rows-per-register gemm (gemm_avx512.c) needs a maddubs and a VPDPWSSD
 * (with the rows' scales) per 16 levels of 4 rows and activation row, two multiplies per 64
 * products. Here the levels of 16 weight rows are first rewritten, once per MUL_MAT, as bytes
 * interleaved 4 elements per row (one 64-byte chunk = elements 4e..4e+3 of rows 0..15), so one
 * VPDPBUSD with the activation row's 4 bytes broadcast gives all 16 rows' partial sums over 4
 * elements (64 products), and a group of elements that shares a scale (16, or 32 for Q4_K /
 * Q5_K) is summed by 4 (8) VPDPBUSD before one VPMULLD by the 16 rows' scales: 1.25 (1.125)
 * multiplies per 64 products. Lane r of every register is weight row r: no transposes, and the
 * 16 results of an activation row are one store. The tile is written once for all activation
 * rows of the MUL_MAT (ggml's repacked "extra buffer types" do it at load, for every MUL_MAT;
 * here nothing changes the weights in memory: decode keeps its row-streaming vec_dot8).
 *
 * Bits: the integer sums are exact whatever their grouping (|Σ| < 2^31 for every type), and each
 * dot's fp32 work is the scalar vec_dot's super-block term (quants_kquants.c) added to its
 * running sum in super-block order, one lane per weight row: every result equals the scalar
 * vec_dot of its two rows bit for bit, so a token's row does not depend on its batch or on the
 * kernel that computed it (native/tests/test_gemm_tile.c, tests/test_batch_invariance.py).
 *
 * Tile layout, per super-block (PG_TILE_SB_BYTES), all 64-byte vectors of 16 lanes (lane r =
 * weight row r; rows past nr repeat row 0 and are never stored):
 *   lv[64]:  uint8 levels (offset removed: 0..15 Q4_K, 0..31 Q5_K, 0..63 Q6_K, 0..3 Q2_K,
 *            0..7 Q3_K), chunk e = elements 4e..4e+3 of each row
 *   sc[16]:  int32 scale of group g (16 elements; Q4_K / Q5_K: g < 8, groups of 32)
 *   bw[8]:   int16 pairs (W[2k], W[2k+1]) per row, W the weight of bsums[g]: the min (Q2_K,
 *            Q4_K, Q5_K, scaled by dmin apart) or the level offset times the scale (Q3_K: 4·sc,
 *            Q6_K: 32·sc, subtracted from the level sum)
 *   d, dmin: float (fp16 fields converted; dmin 0 where there is none). */
#include <immintrin.h>
#include <string.h>

#include "fp16.h"
#include "kquants.h"
#include "pg_internal.h"
#include "quants.h"

#define AINL static inline __attribute__((always_inline))
#define PG_UNROLL _Pragma("GCC unroll 16")

enum { LV_OFF = 0, SC_OFF = 64 * 64, BW_OFF = SC_OFF + 16 * 64, D_OFF = BW_OFF + 8 * 64,
       DMIN_OFF = D_OFF + 64 };
_Static_assert(DMIN_OFF + 64 == PG_TILE_SB_BYTES, "tile super-block layout");

/* ---- pack: 16 rows' super-block b into the tile ----------------------------------------------- */

/* Gathers are done in the tile's own order: G(o) = the dword at byte o of block b of rows 0..15
 * (lane r), so every decode below is the scalar one on 4 bytes per lane. */
typedef struct {
    __m512i idx;   /* byte offset of row r (0 for rows past nr) */
    const char *base;
} rows16;

AINL __m512i gat(const rows16 *r, int o) {
    return _mm512_i32gather_epi32(r->idx, (const void *)(r->base + o), 1);
}

/* bytes of every lane shifted by s (may be negative) within each byte's own bits, then masked */
AINL __m512i shm(__m512i v, int s, int mask) {
    const __m512i t = s >= 0 ? _mm512_slli_epi16(v, (unsigned)s) : _mm512_srli_epi16(v, (unsigned)-s);
    return _mm512_and_si512(t, _mm512_set1_epi8((char)mask));
}

AINL void put(uint8_t *tile, int chunk, __m512i v) {
    _mm512_storeu_si512((void *)(tile + LV_OFF + 64 * chunk), v);
}

static void levels_q4_K(const rows16 *r, uint8_t *t) {
    PG_UNROLL for (int c = 0; c < 4; c++)
        PG_UNROLL for (int k = 0; k < 8; k++) {   /* qs[32c + 4k..]: elements 64c + 4k (lo), +32 (hi) */
            const __m512i q = gat(r, 16 + 32 * c + 4 * k);
            put(t, 16 * c + k, shm(q, 0, 0x0F));
            put(t, 16 * c + 8 + k, shm(q, -4, 0x0F));
        }
}

static void levels_q5_K(const rows16 *r, uint8_t *t) {
    PG_UNROLL for (int k = 0; k < 8; k++) {
        const __m512i h = gat(r, 16 + 4 * k);   /* qh[4k..]: bit 2c (lo) / 2c + 1 (hi) */
        PG_UNROLL for (int c = 0; c < 4; c++) {
            const __m512i q = gat(r, 48 + 32 * c + 4 * k);
            put(t, 16 * c + k, _mm512_or_si512(shm(q, 0, 0x0F), shm(h, 4 - 2 * c, 0x10)));
            put(t, 16 * c + 8 + k, _mm512_or_si512(shm(q, -4, 0x0F), shm(h, 3 - 2 * c, 0x10)));
        }
    }
}

static void levels_q6_K(const rows16 *r, uint8_t *t) {
    PG_UNROLL for (int h = 0; h < 2; h++)
        PG_UNROLL for (int k = 0; k < 8; k++) {   /* element 128h + 32g + 4k, g = 0..3 */
            const __m512i a = gat(r, 64 * h + 4 * k), b = gat(r, 64 * h + 32 + 4 * k);
            const __m512i q = gat(r, 128 + 32 * h + 4 * k);
            put(t, 32 * h + k, _mm512_or_si512(shm(a, 0, 0x0F), shm(q, 4, 0x30)));
            put(t, 32 * h + 8 + k, _mm512_or_si512(shm(b, 0, 0x0F), shm(q, 2, 0x30)));
            put(t, 32 * h + 16 + k, _mm512_or_si512(shm(a, -4, 0x0F), shm(q, 0, 0x30)));
            put(t, 32 * h + 24 + k, _mm512_or_si512(shm(b, -4, 0x0F), shm(q, -2, 0x30)));
        }
}

static void levels_q2_K(const rows16 *r, uint8_t *t) {
    PG_UNROLL for (int h = 0; h < 2; h++)
        PG_UNROLL for (int k = 0; k < 8; k++) {   /* element 128h + 32j + 4k: bits 2j of qs */
            const __m512i q = gat(r, 16 + 32 * h + 4 * k);
            PG_UNROLL for (int j = 0; j < 4; j++) put(t, 32 * h + 8 * j + k, shm(q, -2 * j, 3));
        }
}

static void levels_q3_K(const rows16 *r, uint8_t *t) {
    PG_UNROLL for (int k = 0; k < 8; k++) {
        const __m512i m = gat(r, 4 * k);   /* hmask[4k..]: bit 4h + j adds 4 */
        PG_UNROLL for (int h = 0; h < 2; h++) {
            const __m512i q = gat(r, 32 + 32 * h + 4 * k);
            PG_UNROLL for (int j = 0; j < 4; j++) {
                const int bit = 4 * h + j;
                put(t, 32 * h + 8 * j + k,
                    _mm512_or_si512(shm(q, -2 * j, 3), shm(m, 2 - bit, 4)));
            }
        }
    }
}

/* The per-row fields of one row's super-block p into lane r of the tile's sc, bw, d, dmin. */
static void fields_row(int type, const uint8_t *p, int r, uint8_t *t) {
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
    for (int g = 0; g < 16; g++) memcpy(t + SC_OFF + 64 * g + 4 * r, &sc[g], 4);
    for (int k = 0; k < 8; k++) memcpy(t + BW_OFF + 64 * k + 4 * r, &w[2 * k], 4);
    memcpy(t + D_OFF + 4 * r, &d, 4);
    memcpy(t + DMIN_OFF + 4 * r, &dmin, 4);
}

AINL void tile_pack(int type, size_t bsize, int64_t n, const void *x, size_t bx, int nr,
                    void *tile) {
    int32_t off[16];
    for (int r = 0; r < 16; r++) off[r] = r < nr ? (int32_t)((size_t)r * bx) : 0;
    rows16 rr = {_mm512_loadu_si512((const void *)off), NULL};
    for (int64_t b = 0; b < n / PG_QK_K; b++) {
        uint8_t *t = (uint8_t *)tile + (size_t)b * PG_TILE_SB_BYTES;
        rr.base = (const char *)x + (size_t)b * bsize;
        switch (type) {
        case PG_TYPE_Q4_K: levels_q4_K(&rr, t); break;
        case PG_TYPE_Q5_K: levels_q5_K(&rr, t); break;
        case PG_TYPE_Q6_K: levels_q6_K(&rr, t); break;
        case PG_TYPE_Q3_K: levels_q3_K(&rr, t); break;
        default: levels_q2_K(&rr, t); break;
        }
        for (int r = 0; r < 16; r++)
            fields_row(type, (const uint8_t *)rr.base + off[r], r, t);
    }
}

#define PG_TILE_PACK(name, TYPE, BLOCK)                                                            \
    static void name(int64_t n, const void *x, size_t bx, int nr, void *tile) {                    \
        tile_pack(TYPE, sizeof(BLOCK), n, x, bx, nr, tile);                                        \
    }
PG_TILE_PACK(pack_q2_K, PG_TYPE_Q2_K, pg_block_q2_K)
PG_TILE_PACK(pack_q3_K, PG_TYPE_Q3_K, pg_block_q3_K)
PG_TILE_PACK(pack_q4_K, PG_TYPE_Q4_K, pg_block_q4_K)
PG_TILE_PACK(pack_q5_K, PG_TYPE_Q5_K, pg_block_q5_K)
PG_TILE_PACK(pack_q6_K, PG_TYPE_Q6_K, pg_block_q6_K)

/* ---- the kernel: a tile × C activation rows ------------------------------------------------- */

AINL __m512i bcast32(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* y[j] (j < C): activation rows (Q8_K); out[j]: their 16 outputs (nr stored). GS: elements per
 * scale (16 or 32); HAS_MIN: the bsums term is a min scaled by dmin, else an offset in the
 * integer sum. */
AINL void tile_rows(int64_t n, const uint8_t *tile, const pg_block_q8_K *const *y, float **out,
                    int nr, const int C, const int GS, const int HAS_MIN) {
    __m512 acc[8];
    PG_UNROLL for (int j = 0; j < C; j++) acc[j] = _mm512_setzero_ps();
    for (int64_t b = 0; b < n / PG_QK_K; b++) {
        const uint8_t *t = tile + (size_t)b * PG_TILE_SB_BYTES;
        const pg_block_q8_K *yb[8];
        PG_UNROLL for (int j = 0; j < C; j++) yb[j] = y[j] + b;
        __m512i isum[8];
        PG_UNROLL for (int j = 0; j < C; j++) isum[j] = _mm512_setzero_si512();
        for (int g = 0; g < PG_QK_K / GS; g++) {
            __m512i s[8];
            PG_UNROLL for (int j = 0; j < C; j++) s[j] = _mm512_setzero_si512();
            PG_UNROLL for (int e = 0; e < GS / 4; e++) {
                const int ch = g * (GS / 4) + e;
                const __m512i lv = _mm512_loadu_si512((const void *)(t + LV_OFF + 64 * ch));
                PG_UNROLL for (int j = 0; j < C; j++)
                    s[j] = _mm512_dpbusd_epi32(s[j], lv, bcast32(yb[j]->qs + 4 * ch));
            }
            const __m512i sc = _mm512_loadu_si512((const void *)(t + SC_OFF + 64 * g));
            PG_UNROLL for (int j = 0; j < C; j++)
                isum[j] = _mm512_add_epi32(isum[j], _mm512_mullo_epi32(s[j], sc));
        }
        const __m512 d = _mm512_loadu_ps((const void *)(t + D_OFF));
        PG_UNROLL for (int j = 0; j < C; j++) {
            __m512i m = _mm512_setzero_si512();
            PG_UNROLL for (int k = 0; k < 8; k++)
                m = _mm512_dpwssd_epi32(m, _mm512_loadu_si512((const void *)(t + BW_OFF + 64 * k)),
                                        bcast32(yb[j]->bsums + 2 * k));
            const __m512 dy = _mm512_set1_ps(yb[j]->d);
            __m512 term;
            if (HAS_MIN) {   /* (dy·d)·isum − (dy·dmin)·summs */
                const __m512 dmin = _mm512_loadu_ps((const void *)(t + DMIN_OFF));
                term = _mm512_sub_ps(_mm512_mul_ps(_mm512_mul_ps(dy, d), _mm512_cvtepi32_ps(isum[j])),
                                     _mm512_mul_ps(_mm512_mul_ps(dy, dmin), _mm512_cvtepi32_ps(m)));
            } else {         /* (d·dy)·isum, isum with the levels' offset */
                term = _mm512_mul_ps(_mm512_mul_ps(d, dy),
                                     _mm512_cvtepi32_ps(_mm512_sub_epi32(isum[j], m)));
            }
            acc[j] = _mm512_add_ps(acc[j], term);
        }
    }
    const __mmask16 keep = (__mmask16)((1u << nr) - 1u);
    PG_UNROLL for (int j = 0; j < C; j++) _mm512_mask_storeu_ps(out[j], keep, acc[j]);
}

#define PG_TILE_C 8   /* activation rows per pass over the tile */

AINL void tile_gemm(int64_t n, const void *tile, const void *y, size_t by, int64_t nc, float *s,
                    size_t bs, int nr, const int GS, const int HAS_MIN) {
    for (int64_t j0 = 0; j0 < nc; j0 += PG_TILE_C) {
        const int c = (int)(nc - j0 < PG_TILE_C ? nc - j0 : PG_TILE_C);
        const pg_block_q8_K *yr[PG_TILE_C];
        float *out[PG_TILE_C];
        for (int j = 0; j < PG_TILE_C; j++) {   /* past c: row j0 again (same bits, stored twice) */
            const int64_t jj = j0 + (j < c ? j : 0);
            yr[j] = (const pg_block_q8_K *)((const char *)y + (size_t)jj * by);
            out[j] = (float *)((char *)s + (size_t)jj * bs);
        }
        if (c > 4) tile_rows(n, tile, yr, out, nr, PG_TILE_C, GS, HAS_MIN);
        else tile_rows(n, tile, yr, out, nr, 4, GS, HAS_MIN);
    }
}

#define PG_TILE_GEMM(name, GS, HAS_MIN)                                                            \
    static void name(int64_t n, const void *tile, const void *y, size_t by, int64_t nc,           \
                     float *s, size_t bs, int nr) {                                                \
        tile_gemm(n, tile, y, by, nc, s, bs, nr, GS, HAS_MIN);                                     \
    }
PG_TILE_GEMM(tile_g16_min, 16, 1)    /* Q2_K */
PG_TILE_GEMM(tile_g16_off, 16, 0)    /* Q3_K, Q6_K */
PG_TILE_GEMM(tile_g32_min, 32, 1)    /* Q4_K, Q5_K */

void pg_fill_gemm_tile_avx512(pg_type_traits *tbl) {
    if (!(pg_g_cpu_features & PG_CPU_AVX512VNNI)) return;
    tbl[PG_TYPE_Q2_K].tile_pack = pack_q2_K;
    tbl[PG_TYPE_Q2_K].tile_gemm = tile_g16_min;
    tbl[PG_TYPE_Q3_K].tile_pack = pack_q3_K;
    tbl[PG_TYPE_Q3_K].tile_gemm = tile_g16_off;
    tbl[PG_TYPE_Q4_K].tile_pack = pack_q4_K;
    tbl[PG_TYPE_Q4_K].tile_gemm = tile_g32_min;
    tbl[PG_TYPE_Q5_K].tile_pack = pack_q5_K;
    tbl[PG_TYPE_Q5_K].tile_gemm = tile_g32_min;
    tbl[PG_TYPE_Q6_K].tile_pack = pack_q6_K;
    tbl[PG_TYPE_Q6_K].tile_gemm = tile_g16_off;
}
