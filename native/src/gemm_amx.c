/* AMX int8 tile gemms (the `amx` path: Xeons from Sapphire Rapids on, see cpu.c): prompt-sized
 * MUL_MAT of K-quant weights (Q4_K, Q5_K, Q6_K) with Q8_K activations on the tile unit.
 *
 * One TDPBUSD / TDPBSSD multiplies a 16 × 64 int8 tile by a 64 × 16 one into 16 × 16 int32:
 * 16,384 multiply-adds for one instruction, where a 512-bit VNNI dot does 64. The K-quants' scales
 * change every 16 or 32 elements of K, so the tile products cannot run over a super-block as
 * they are. Instead each weight block is unpacked once into a few *planes* of small products
 * level × digit, the digits being those of the sub-block scale in a small base, so that
 *     Σ_k y_k · q_k · sc_g(k)  =  Σ_p  base^p · Σ_k y_k · plane_p[k]
 * holds exactly in int32 and every plane fits int8:
 *   Q4_K  q 0..15, sc 0..63:   planes q·(sc mod 16), q·(sc div 16)      (products ≤ 225, u8)
 *   Q5_K  q 0..31, sc 0..63:   planes q·(sc mod 8),  q·(sc div 8)       (≤ 217, u8)
 *   both: summs = Σ_g mn_g · bsums_g is a 16-term int16 dot, done beside on the vector unit
 *   Q6_K  q−32 in −32..31, sc −128..127 written in balanced base 7 (three digits in −3..3):
 *         planes (q−32)·d0, (q−32)·d1, (q−32)·d2                        (|·| ≤ 96, s8)
 * so one super-block of one 16 × 16 tile is 8 (Q4_K, Q5_K) or 12 (Q6_K) tile products (2 or 3
 * planes × 4 chunks of 64) and one pass over their int32 results. The integer block sums equal
 * the scalar reference's (quants_kquants.c) exactly, and the fp32 block terms repeat its operations in its order, so
 * every output has the bits of the scalar vec_dot (and of every other path's vec_dot and
 * gemm): a token's row does not depend on the batch it is computed in.
 *
 * Roles: the weights are the tile A operand (16 weight rows × 64 bytes, each plane's chunk one
 * contiguous tile: no transposition when unpacking), the activations the B operand in the tile unit's
 * four-byte-interleaved layout (pg_amx_pack_act, once per MUL_MAT), so C is 16 weight rows ×
 * 16 activation rows. Activation tiles are padded with zero rows (their outputs are dropped)
 * and weight blocks with zero rows: any M and N work. */
#include <immintrin.h>
#include <string.h>

#include "amx.h"
#include "fp16.h"
#include "kquants.h"
#include "kquants_x86.h"

#define AINL static inline __attribute__((always_inline))
#define T 16   /* rows of a tile, both operands */

/* ---- layouts ---------------------------------------------------------------------------- */

/* Activation tile (16 rows × K): qs[K/64][16][64] — chunk c, row r holds k = 64c + 4r .. +3 of
 * the 16 activation rows, four bytes each — then d[K/256][16] (the rows' Q8_K scales), then
 * bsp[K/256][4][16]: for Q4_K / Q5_K's mins, the Q8_K sums of the 8 groups of 32 (bsums 2j and
 * 2j + 1 added) as int16 pairs (groups 2i, 2i + 1 in dword i) per row. */
#define ACT_QS(K) ((size_t)(K) * T)
#define ACT_BSP(K) (ACT_QS(K) + (size_t)((K) / PG_QK_K) * T * 4)
size_t pg_amx_act_tile_bytes(int64_t K) { return ACT_BSP(K) + (size_t)(K / PG_QK_K) * 4 * T * 4; }

/* Weight block (16 rows × K): tiles[K/64][3][16][64] — for chunk c (k = 64c .. 64c + 63) the
 * planes' 16 × 64 tiles (2 used by Q4_K / Q5_K), each contiguous (a tile load then streams
 * 1 KiB: rows K bytes apart would fall into a few L1 sets) — then d[K/256][16],
 * dmin[K/256][16] and mnp[K/256][16][4] (Q4_K / Q5_K: the 8 mins as int16 pairs, as bsp). */
#define W_D(K) ((size_t)(K) / 64 * 3 * 1024)
#define W_DMIN(K) (W_D(K) + (size_t)((K) / PG_QK_K) * T * 4)
#define W_MNP(K) (W_DMIN(K) + (size_t)((K) / PG_QK_K) * T * 4)
static size_t wblock_bytes(int64_t K) { return W_MNP(K) + (size_t)(K / PG_QK_K) * T * 4 * 4; }

#define TILES_PER_PASS 16   /* see amx_gemm */

size_t pg_amx_scratch_bytes(int64_t K) {
    const size_t q8 = (size_t)(K / PG_QK_K) * sizeof(pg_block_q8_K);
    /* two weight blocks, their accumulators, two steps' products (amx_gemm) */
    const size_t w = 2 * wblock_bytes(K) + 2 * TILES_PER_PASS * T * T * sizeof(float) +
                     2 * 4 * T * T * sizeof(int32_t);
    return (w > q8 ? w : q8) + 64;
}

void pg_amx_pack_act(pg_from_float_fn q8k, const char *x, size_t bx, int64_t K, int nrows,
                     uint8_t *tile, void *scratch) {
    const int64_t nb = K / PG_QK_K;
    uint32_t *qs = (uint32_t *)tile;
    float *dd = (float *)(tile + ACT_QS(K));
    uint32_t *bsp = (uint32_t *)(tile + ACT_BSP(K));
    pg_block_q8_K *q8 = scratch;
    for (int m = 0; m < T; m++) {
        if (m >= nrows) {
            for (int64_t j = 0; j < K / 4; j++) qs[((j / 16) * T + j % 16) * T + m] = 0;
            for (int64_t b = 0; b < nb; b++) {
                dd[b * T + m] = 0.0f;
                for (int i = 0; i < 4; i++) bsp[(b * 4 + i) * T + m] = 0;
            }
            continue;
        }
        q8k((const float *)(x + (size_t)m * bx), q8, K);
        for (int64_t b = 0; b < nb; b++) {
            dd[b * T + m] = q8[b].d;
            for (int i = 0; i < 4; i++) {
                const int16_t *bs = q8[b].bsums + 4 * i;
                const uint16_t lo = (uint16_t)(int16_t)(bs[0] + bs[1]);
                const uint16_t hi = (uint16_t)(int16_t)(bs[2] + bs[3]);
                bsp[(b * 4 + i) * T + m] = (uint32_t)lo | (uint32_t)hi << 16;
            }
            const uint32_t *src = (const uint32_t *)(const void *)q8[b].qs;
            uint32_t *dst = qs + (size_t)b * 4 * T * T + m;   /* chunk 4b, row 0 */
            for (int j = 0; j < PG_QK_K / 4; j++) dst[(size_t)j * T] = src[j];
        }
    }
}

/* ---- unpacking a weight block ----------------------------------------------------------- */

/* bytes a·s (low byte of each product; the products fit a byte): a 64 bytes, s one int16 per
 * byte pair (both bytes of a pair have the same digit) */
AINL __m512i bytes_mul(__m512i a, __m512i s) {
    const __m512i lo = _mm512_and_si512(_mm512_mullo_epi16(a, s), _mm512_set1_epi16(0xFF));
    const __m512i hi = _mm512_mullo_epi16(_mm512_srli_epi16(a, 8), s);
    return _mm512_or_si512(lo, _mm512_slli_epi16(hi, 8));
}

/* the digit of each byte pair of chunk c: group (64c + 2w) / 16 of the 16 per-16 digits */
AINL __m512i chunk_digits(__m256i dig, int c) {
    const __m512i idx = _mm512_set_epi16(
        4 * c + 3, 4 * c + 3, 4 * c + 3, 4 * c + 3, 4 * c + 3, 4 * c + 3, 4 * c + 3, 4 * c + 3,
        4 * c + 2, 4 * c + 2, 4 * c + 2, 4 * c + 2, 4 * c + 2, 4 * c + 2, 4 * c + 2, 4 * c + 2,
        4 * c + 1, 4 * c + 1, 4 * c + 1, 4 * c + 1, 4 * c + 1, 4 * c + 1, 4 * c + 1, 4 * c + 1,
        4 * c, 4 * c, 4 * c, 4 * c, 4 * c, 4 * c, 4 * c, 4 * c);
    return _mm512_permutexvar_epi16(idx, _mm512_castsi256_si512(dig));
}

/* floor(x / 7) for int16 lanes x in [−133, 130]: (x + 133)·9363 >> 16 is floor((x + 133) / 7)
 * = floor(x / 7) + 19 for 0 <= x + 133 <= 263 (9363 / 2^16 exceeds 1/7 by < 1/(7·263)) */
AINL __m256i floor_div7(__m256i x) {
    const __m256i q = _mm256_mulhi_epu16(_mm256_add_epi16(x, _mm256_set1_epi16(133)),
                                         _mm256_set1_epi16(9363));
    return _mm256_sub_epi16(q, _mm256_set1_epi16(19));
}

/* Levels of one super-block as 4 chunks of 64 bytes (element order), and per plane the digit
 * of each group of 16. `type` 4, 5, 6 = Q4_K, Q5_K, Q6_K. Planes 0, 1 multiply the levels by
 * their digits; Q4_K/Q5_K's plane 2 is the min of the group (levels taken as 1). */
AINL void decode_block(const void *blk, int type, __m512i lv[4], __m256i dig[3], int16_t mins[8],
                       float *d, float *dmin) {
    const __m512i m4 = _mm512_set1_epi8(0xF);
    if (type == 4 || type == 5) {
        const uint8_t *qs = type == 4 ? ((const pg_block_q4_K *)blk)->qs
                                      : ((const pg_block_q5_K *)blk)->qs;
        const uint8_t *scales = type == 4 ? ((const pg_block_q4_K *)blk)->scales
                                          : ((const pg_block_q5_K *)blk)->scales;
        const uint16_t *f = blk;   /* d, dmin lead both layouts */
        uint8_t sm[16];
        pg_k4_unpack_scales(scales, sm);
        /* words: scales 0..7, mins 8..15; the scale of group g (of 16) is scale g / 2 */
        const __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)sm));
        const __m256i sc = _mm256_permutexvar_epi16(
            _mm256_setr_epi16(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7), v);
        const int shift = type == 4 ? 4 : 3;
        dig[0] = _mm256_and_si256(sc, _mm256_set1_epi16((1 << shift) - 1));
        dig[1] = _mm256_srli_epi16(sc, shift);
        _mm_storeu_si128((__m128i *)mins, _mm256_extracti128_si256(v, 1));
        *d = _cvtsh_ss(f[0]);
        *dmin = _cvtsh_ss(f[1]);
        /* element 64c + l: low nibble of qs[32c + l]; 64c + 32 + l: its high nibble */
        __m512i hb = _mm512_setzero_si512();
        if (type == 5) hb = _mm512_broadcast_i64x4(_mm256_loadu_si256(
                               (const void *)((const pg_block_q5_K *)blk)->qh));
        for (int c = 0; c < 4; c++) {
            const __m256i q = _mm256_loadu_si256((const void *)(qs + 32 * c));
            const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(q),
                                                 _mm256_srli_epi16(q, 4), 1);
            __m512i v = _mm512_and_si512(z, m4);
            if (type == 5) {   /* 5th bit of element 64c + 32u + l: bit 2c + u of qh[l] */
                const __m512i bit = _mm512_inserti64x4(
                    _mm512_set1_epi8((char)(1 << (2 * c))),
                    _mm256_set1_epi8((char)(1 << (2 * c + 1))), 1);
                const __mmask64 k = _mm512_test_epi8_mask(hb, bit);
                v = _mm512_mask_add_epi8(v, k, v, _mm512_set1_epi8(0x10));
            }
            lv[c] = v;
        }
        return;
    }
    /* Q6_K: element 128h + 32g + l (g = 0..3) from ql[64h + l (+32 for odd g)] (low nibble for
     * g < 2, high for g ≥ 2) and 2 bits of qh[32h + l] at 2g; level − 32 */
    const pg_block_q6_K *x = blk;
    /* balanced base 7: sc = d0 + 7·d1 + 49·d2, each digit in −3..3 (d = s − 7·floor((s+3)/7)) */
    const __m256i s0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x->scales));
    const __m256i q0 = floor_div7(_mm256_add_epi16(s0, _mm256_set1_epi16(3)));
    const __m256i q1 = floor_div7(_mm256_add_epi16(q0, _mm256_set1_epi16(3)));
    dig[0] = _mm256_sub_epi16(s0, _mm256_mullo_epi16(q0, _mm256_set1_epi16(7)));
    dig[1] = _mm256_sub_epi16(q0, _mm256_mullo_epi16(q1, _mm256_set1_epi16(7)));
    dig[2] = q1;
    (void)mins;
    *d = _cvtsh_ss(x->d);
    *dmin = 0.0f;
    const __m256i off = _mm256_set1_epi8(32);
    for (int h = 0; h < 2; h++) {
        __m256i u[4];
        pg_q6k_half_levels(x, h, u);
        lv[2 * h] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_sub_epi8(u[0], off)),
                                       _mm256_sub_epi8(u[1], off), 1);
        lv[2 * h + 1] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_sub_epi8(u[2], off)),
                                           _mm256_sub_epi8(u[3], off), 1);
    }
}

/* rows [0, nrows) of the block at w (rows bw bytes apart) into buf (wblock_bytes layout); rows
 * nrows..15 become zeros */
AINL void unpack_block(const char *w, size_t bw, int nrows, int64_t K, int type, uint8_t *buf) {
    const int64_t nb = K / PG_QK_K;
    const int np = type == 6 ? 3 : 2;
    const size_t bsize = type == 4 ? sizeof(pg_block_q4_K)
                                   : type == 5 ? sizeof(pg_block_q5_K) : sizeof(pg_block_q6_K);
    float *wd = (float *)(buf + W_D(K)), *wdm = (float *)(buf + W_DMIN(K));
    int16_t *mnp = (int16_t *)(buf + W_MNP(K));
    for (int i = 0; i < T; i++) {
        if (i >= nrows) {
            for (int64_t cc = 0; cc < K / 64; cc++)
                for (int p = 0; p < np; p++) memset(buf + ((size_t)cc * 3 + p) * 1024 + 64 * i, 0, 64);
            for (int64_t b = 0; b < nb; b++) {
                wd[b * T + i] = wdm[b * T + i] = 0.0f;
                memset(mnp + (b * T + i) * 8, 0, 16);
            }
            continue;
        }
        for (int64_t b = 0; b < nb; b++) {
            __m512i lv[4];
            __m256i dig[3];
            decode_block(w + (size_t)i * bw + (size_t)b * bsize, type, lv, dig,
                         mnp + (b * T + i) * 8, &wd[b * T + i], &wdm[b * T + i]);
            for (int c = 0; c < 4; c++)
                for (int p = 0; p < np; p++) {
                    uint8_t *dst = buf + ((size_t)(4 * b + c) * 3 + p) * 1024 + 64 * i;
                    _mm512_store_si512((void *)dst, bytes_mul(lv[c], chunk_digits(dig[p], c)));
                }
        }
    }
}

/* ---- the tile kernel -------------------------------------------------------------------- */

typedef struct {
    uint8_t  palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t  rows[16];
} __attribute__((packed, aligned(64))) tilecfg;

/* Q4_K / Q5_K: a step covers two weight blocks (32 rows) × one activation tile, which the two
 * share: tiles 0..3 the products (block 0 plane 0, 1; block 1 plane 0, 1; int32, 16 weight rows
 * × 16 activation rows), 4 the activation chunk, 5..7 the planes in turn. Each activation chunk
 * then comes from L2 once per 32 weight rows (tile loads from L2 are what limits a step: with
 * one weight block per step the tile unit ran at a quarter of its rate). Q6_K: one block per
 * step, 0..2 its three products, 3 the activation chunk, 4..6 the planes. */
static void tiles_config(void) {
    tilecfg cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.palette = 1;
    for (int i = 0; i < 8; i++) {
        cfg.colsb[i] = 64;
        cfg.rows[i] = T;
    }
    _tile_loadconfig(&cfg);
}

/* The int32 plane products of one step: Q4_K / Q5_K c[2w + p] = block w, plane p; Q6_K c[p]. */
typedef struct {
    int32_t c[4][T][T];
} __attribute__((aligned(64))) products;

/* Tile part of a step: super-block b of the unpacked weight blocks wb0 (and wb1: Q4_K / Q5_K) ×
 * activation tile at -> pr. */
AINL void superblock_products(int type, int64_t b, const uint8_t *wb0, const uint8_t *wb1,
                              const uint8_t *at, products *pr) {
    if (type == 6) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        for (int c = 0; c < 4; c++) {
            const size_t cc = 4 * (size_t)b + (size_t)c;
            const uint8_t *wt = wb0 + cc * 3 * 1024;
            _tile_loadd(3, at + cc * 1024, 64);
            _tile_loadd(4, wt, 64);
            _tile_loadd(5, wt + 1024, 64);
            _tile_loadd(6, wt + 2048, 64);
            _tile_dpbssd(0, 4, 3);
            _tile_dpbssd(1, 5, 3);
            _tile_dpbssd(2, 6, 3);
        }
        _tile_stored(0, pr->c[0], 64);
        _tile_stored(1, pr->c[1], 64);
        _tile_stored(2, pr->c[2], 64);
        return;
    }
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int c = 0; c < 4; c++) {
        const size_t cc = 4 * (size_t)b + (size_t)c;
        const uint8_t *w0 = wb0 + cc * 3 * 1024, *w1 = wb1 + cc * 3 * 1024;
        _tile_loadd(4, at + cc * 1024, 64);
        _tile_loadd(5, w0, 64);
        _tile_loadd(6, w0 + 1024, 64);
        _tile_dpbusd(0, 5, 4);
        _tile_dpbusd(1, 6, 4);
        _tile_loadd(7, w1, 64);
        _tile_loadd(5, w1 + 1024, 64);
        _tile_dpbusd(2, 7, 4);
        _tile_dpbusd(3, 5, 4);
    }
    _tile_stored(0, pr->c[0], 64);
    _tile_stored(1, pr->c[1], 64);
    _tile_stored(2, pr->c[2], 64);
    _tile_stored(3, pr->c[3], 64);
}

/* Vector part, for one weight block: acc[i][m] += the block term of dot(weight row i,
 * activation row m) for super-block b, from its plane products c[0..2] */
AINL void superblock_terms(int type, int64_t K, int64_t b, const uint8_t *wb, const uint8_t *at,
                           const int32_t (*c)[T][T], float acc[T][T]) {
    const float *wd = (const float *)(wb + W_D(K)), *wdm = (const float *)(wb + W_DMIN(K));
    const int32_t *mnp = (const int32_t *)(wb + W_MNP(K));
    const float *ad = (const float *)(at + ACT_QS(K));
    const __m512i *bsp = (const __m512i *)(at + ACT_BSP(K)) + 4 * b;
    const __m512i bs0 = _mm512_loadu_si512(bsp), bs1 = _mm512_loadu_si512(bsp + 1);
    const __m512i bs2 = _mm512_loadu_si512(bsp + 2), bs3 = _mm512_loadu_si512(bsp + 3);
    const __m512 dy = _mm512_loadu_ps(ad + b * T);
    _Pragma("GCC unroll 4") for (int i = 0; i < T; i++) {
        const __m512i a0 = _mm512_load_si512((const void *)c[0][i]);
        const __m512i a1 = _mm512_load_si512((const void *)c[1][i]);
        const __m512 dx = _mm512_set1_ps(wd[b * T + i]);
        __m512 t;
        if (type == 6) {   /* isum = C0 + 7·C1 + 49·C2; (d·dy)·isum */
            const __m512i a2 = _mm512_load_si512((const void *)c[2][i]);
            const __m512i isum = _mm512_add_epi32(
                a0, _mm512_add_epi32(_mm512_mullo_epi32(a1, _mm512_set1_epi32(7)),
                                     _mm512_mullo_epi32(a2, _mm512_set1_epi32(49))));
            t = _mm512_mul_ps(_mm512_mul_ps(dx, dy), _mm512_cvtepi32_ps(isum));
        } else {           /* isum = C0 + base·C1; (dy·d)·isum − (dy·dmin)·summs */
            const __m512i isum = _mm512_add_epi32(a0, _mm512_slli_epi32(a1, type == 4 ? 4 : 3));
            const int32_t *mn = mnp + (b * T + i) * 4;
            /* two chains of two (the dot's latency, not its throughput, would bound a chain) */
            const __m512i s01 = _mm512_dpwssd_epi32(
                _mm512_madd_epi16(_mm512_set1_epi32(mn[0]), bs0), _mm512_set1_epi32(mn[1]), bs1);
            const __m512i s23 = _mm512_dpwssd_epi32(
                _mm512_madd_epi16(_mm512_set1_epi32(mn[2]), bs2), _mm512_set1_epi32(mn[3]), bs3);
            const __m512i summs = _mm512_add_epi32(s01, s23);
            const __m512 dm = _mm512_set1_ps(wdm[b * T + i]);
            t = _mm512_sub_ps(_mm512_mul_ps(_mm512_mul_ps(dy, dx), _mm512_cvtepi32_ps(isum)),
                              _mm512_mul_ps(_mm512_mul_ps(dy, dm), _mm512_cvtepi32_ps(summs)));
        }
        _mm512_store_ps(acc[i], _mm512_add_ps(_mm512_load_ps(acc[i]), t));
    }
}

/* acc[i][m] (16 × 16) -> dst rows m < nm, columns i < nr (a transpose: 16 rows stored as 16) */
AINL void store_outputs(const float acc[T][T], float *dst, size_t bd, int nr, int nm) {
    for (int m = 0; m < nm; m++) {
        const __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(m),
                                             _mm512_mullo_epi32(_mm512_set1_epi32(T),
                                                                _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7,
                                                                                  8, 9, 10, 11, 12, 13, 14, 15)));
        const __m512 col = _mm512_i32gather_ps(idx, (const float *)acc, 4);
        _mm512_mask_storeu_ps((char *)dst + (size_t)m * bd, (__mmask16)((1u << nr) - 1), col);
    }
}

/* Activation tiles per pass over the weight blocks (TILES_PER_PASS): their accumulators (1 KiB
 * each per block) live in the scratch; super-block b of the weight blocks stays in L1 while the
 * group's tiles use it. The steps (b, tile) are software-pipelined: step s's tile products are
 * issued before step s − 1's vector terms, so the tile unit and the vector unit work at once
 * (the vector part of a step is hundreds of instructions: in program order after it, the next
 * step's tile instructions would wait for it to leave the reorder window). */
AINL void amx_gemm(int type, int64_t K, const void *w, size_t bw, int64_t nrows,
                   const uint8_t *act, int64_t M, float *dst, size_t bd, void *scratch) {
    uint8_t *wb[2];
    wb[0] = (uint8_t *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    wb[1] = wb[0] + wblock_bytes(K);
    float (*acc)[TILES_PER_PASS][T][T] = (float (*)[TILES_PER_PASS][T][T])(wb[1] + wblock_bytes(K));
    products *pr = (products *)(acc + 2);
    const size_t tile_bytes = pg_amx_act_tile_bytes(K);
    const int64_t nb = K / PG_QK_K, tiles = (M + T - 1) / T;
    const int nw = type == 6 ? 1 : 2;   /* weight blocks per step */
    tiles_config();
    for (int64_t n0 = 0; n0 < nrows; n0 += T * nw) {
        int nr[2];
        for (int k = 0; k < nw; k++) {
            const int64_t left = nrows - n0 - T * k;
            nr[k] = (int)(left < 0 ? 0 : left < T ? left : T);
            unpack_block((const char *)w + (size_t)(n0 + T * k) * bw, bw, nr[k], K, type, wb[k]);
        }
        for (int64_t g0 = 0; g0 < tiles; g0 += TILES_PER_PASS) {
            const int ng = (int)(tiles - g0 < TILES_PER_PASS ? tiles - g0 : TILES_PER_PASS);
            const uint8_t *at0 = act + (size_t)g0 * tile_bytes;
            for (int k = 0; k < nw; k++) memset(acc[k], 0, sizeof(acc[k][0]) * (size_t)ng);
            const int64_t steps = nb * ng;
            for (int64_t s = 0; s <= steps; s++) {
                if (s < steps)
                    superblock_products(type, s / ng, wb[0], wb[1],
                                        at0 + (size_t)(s % ng) * tile_bytes, &pr[s & 1]);
                if (s > 0) {
                    const int64_t q = s - 1;
                    const uint8_t *at = at0 + (size_t)(q % ng) * tile_bytes;
                    for (int k = 0; k < nw; k++)
                        superblock_terms(type, K, q / ng, wb[k], at,
                                         (const int32_t (*)[T][T])pr[q & 1].c[2 * k],
                                         acc[k][q % ng]);
                }
            }
            for (int g = 0; g < ng; g++) {
                const int64_t m0 = (g0 + g) * T;
                const int nm = (int)(M - m0 < T ? M - m0 : T);
                for (int k = 0; k < nw; k++)
                    if (nr[k] > 0)
                        store_outputs(acc[k][g], (float *)((char *)dst + (size_t)m0 * bd) + n0 + T * k,
                                      bd, nr[k], nm);
            }
        }
    }
    _tile_release();
}

static void amx_gemm_q4_K(int64_t K, const void *w, size_t bw, int64_t nrows, const uint8_t *act,
                          int64_t M, float *dst, size_t bd, void *scratch) {
    amx_gemm(4, K, w, bw, nrows, act, M, dst, bd, scratch);
}
static void amx_gemm_q5_K(int64_t K, const void *w, size_t bw, int64_t nrows, const uint8_t *act,
                          int64_t M, float *dst, size_t bd, void *scratch) {
    amx_gemm(5, K, w, bw, nrows, act, M, dst, bd, scratch);
}
static void amx_gemm_q6_K(int64_t K, const void *w, size_t bw, int64_t nrows, const uint8_t *act,
                          int64_t M, float *dst, size_t bd, void *scratch) {
    amx_gemm(6, K, w, bw, nrows, act, M, dst, bd, scratch);
}

void pg_fill_gemm_amx(pg_type_traits *tbl) {
    tbl[PG_TYPE_Q4_K].amx_gemm = amx_gemm_q4_K;
    tbl[PG_TYPE_Q5_K].amx_gemm = amx_gemm_q5_K;
    tbl[PG_TYPE_Q6_K].amx_gemm = amx_gemm_q6_K;
}
