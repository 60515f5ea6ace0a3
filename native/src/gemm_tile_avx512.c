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
 * The tile's layout is in gemm_tile.h, the K-quant packs in gemm_tile_pack_avx512.c (gathers,
 * the bytes of gemm_tile.c's portable pack). The legacy formats
 * without a min (Q4_0, Q5_0, Q8_0) have a tile per block of 32: signed levels, dotted (VPDPBUSD
 * wants one unsigned side) with the activations + 128, less 128·Σq of the row, kept in the tile.
 * The codebook types reuse both: IQ4_XS is a K-quant tile (groups of 32 with an offset), IQ4_NL
 * and MXFP4 are Q8_0's, their levels looked up from the 16-entry codebook by VPSHUFB. */
#include <immintrin.h>
#include <string.h>

#include "fp16.h"
#include "gemm_tile.h"
#include "iquants.h"
#include "kquants.h"
#include "quants_legacy.h"
#include "pg_internal.h"
#include "quants.h"

#define AINL static inline __attribute__((always_inline))
#define PG_UNROLL _Pragma("GCC unroll 16")

/* ---- the legacy formats' pack: 16 rows at once ----------------------------------------------- */

/* The legacy packs are vectorized (a block is only 32 elements, so the per-row work of a
 * portable pack would cost as much as the dots of ~100 activation rows): G(o) gathers the dword
 * at byte o of block b of the 16 rows (lane r = row r), and the scalar decode runs on 4 bytes
 * per lane. TYPE 0: Q4_0, 1: Q5_0, 2: Q8_0, 3: IQ4_NL, 4: MXFP4 (the codebook types: each
 * nibble's int8 value by a VPSHUFB lookup; the scale an fp16 d or MXFP4's E8M0 byte e). */
AINL void pack_leg(const int TYPE, size_t bsize, int64_t n, const void *x, size_t bx, int nr,
                   void *tile) {
    int32_t off[16];
    for (int r = 0; r < 16; r++) off[r] = r < nr ? (int32_t)((size_t)r * bx) : 0;
    const __m512i idx = _mm512_loadu_si512((const void *)off);
    const __m512i m4 = _mm512_set1_epi8(0x0F), ones = _mm512_set1_epi8(1);
    const __m512i lut = _mm512_broadcast_i32x4(
        _mm_loadu_si128((const __m128i *)(TYPE == 4 ? pg_kv_mxfp4 : pg_kv_iq4nl)));
#define G(o) _mm512_i32gather_epi32(idx, (const void *)(base + (o)), 1)
    for (int64_t b = 0; b < n / PG_QK32; b++) {
        const char *base = (const char *)x + (size_t)b * bsize;
        uint8_t *t = (uint8_t *)tile + (size_t)b * PG_TILE_LEG_BYTES;
        __m512i v[8];
        if (TYPE == 2) {
            PG_UNROLL for (int k = 0; k < 8; k++) v[k] = G(2 + 4 * k);
        } else {
            const __m512i qh = TYPE == 1 ? G(2) : _mm512_setzero_si512();
            PG_UNROLL for (int k = 0; k < 4; k++) {
                const __m512i q = G(TYPE == 1 ? 6 + 4 * k : TYPE == 4 ? 1 + 4 * k : 2 + 4 * k);
                __m512i lo = _mm512_and_si512(q, m4);
                __m512i hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
                if (TYPE == 1) {   /* qh bit j -> 0x10 of element j: 4 bits to 4 bytes */
                    const __m512i sp = _mm512_set1_epi32(0x00204081);
                    const __m512i b1 = _mm512_set1_epi32(0x01010101), f = _mm512_set1_epi32(0xF);
                    const __m512i hl = _mm512_and_si512(_mm512_srli_epi32(qh, 4 * k), f);
                    const __m512i hh = _mm512_and_si512(_mm512_srli_epi32(qh, 16 + 4 * k), f);
                    lo = _mm512_or_si512(
                        lo, _mm512_slli_epi32(_mm512_and_si512(_mm512_mullo_epi32(hl, sp), b1), 4));
                    hi = _mm512_or_si512(
                        hi, _mm512_slli_epi32(_mm512_and_si512(_mm512_mullo_epi32(hh, sp), b1), 4));
                }
                if (TYPE >= 3) {
                    v[k] = _mm512_shuffle_epi8(lut, lo);
                    v[4 + k] = _mm512_shuffle_epi8(lut, hi);
                    continue;
                }
                const __m512i c = _mm512_set1_epi8(TYPE == 1 ? 16 : 8);
                v[k] = _mm512_sub_epi8(lo, c);
                v[4 + k] = _mm512_sub_epi8(hi, c);
            }
        }
        __m512i sum = _mm512_setzero_si512();
        PG_UNROLL for (int k = 0; k < 8; k++) {
            _mm512_storeu_si512((void *)(t + PG_TILE_LV + 64 * k), v[k]);
            sum = _mm512_dpbusd_epi32(sum, ones, v[k]);
        }
        _mm512_storeu_si512((void *)(t + PG_TILE_LEG_CORR), _mm512_slli_epi32(sum, 7));
        if (TYPE == 4) {   /* pg_e8m0_half(e): 0x00200000 << e for e < 2, else (e − 1) << 23 */
            const __m512i e = _mm512_and_si512(G(0), _mm512_set1_epi32(0xFF));
            const __mmask16 sub = _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2));
            const __m512i nrm = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
            const __m512i den = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
            _mm512_storeu_si512((void *)(t + PG_TILE_LEG_D), _mm512_mask_blend_epi32(sub, nrm, den));
        } else {
            const __m256i h = _mm512_cvtepi32_epi16(G(0));   /* d: the low 16 bits of the dword */
            _mm512_storeu_ps((void *)(t + PG_TILE_LEG_D), _mm512_cvtph_ps(h));
        }
    }
#undef G
}

static void pack_q4_0(int64_t n, const void *x, size_t bx, int nr, void *tile) {
    pack_leg(0, sizeof(pg_block_q4_0), n, x, bx, nr, tile);
}
static void pack_q5_0(int64_t n, const void *x, size_t bx, int nr, void *tile) {
    pack_leg(1, sizeof(pg_block_q5_0), n, x, bx, nr, tile);
}
static void pack_q8_0(int64_t n, const void *x, size_t bx, int nr, void *tile) {
    pack_leg(2, sizeof(pg_block_q8_0), n, x, bx, nr, tile);
}
static void pack_iq4_nl(int64_t n, const void *x, size_t bx, int nr, void *tile) {
    pack_leg(3, sizeof(pg_block_iq4_nl), n, x, bx, nr, tile);
}
static void pack_mxfp4(int64_t n, const void *x, size_t bx, int nr, void *tile) {
    pack_leg(4, sizeof(pg_block_mxfp4), n, x, bx, nr, tile);
}

/* ---- IQ4_XS: the K-quant tile with groups of 32 and an offset -------------------------------- */

/* The levels are the codebook values + 128 (1..241: VPDPBUSD's unsigned side), so a group's
 * dot has 128·Σa too; bw holds 128·(ls − 32) per 16-element half, which the kernel's
 * dot with the activations' bsums takes off (as Q3_K's and Q6_K's offsets): isum exactly. Per
 * super-block the 16 rows' dwords are gathered as in pack_leg: qs[16ib + 4k..] holds elements
 * 32ib + 4k.. (low nibbles) and 32ib + 16 + 4k.. (high). */
static void pack_iq4_xs(int64_t n, const void *x, size_t bx, int nr, void *tile) {
    int32_t off[16];
    for (int r = 0; r < 16; r++) off[r] = r < nr ? (int32_t)((size_t)r * bx) : 0;
    const __m512i idx = _mm512_loadu_si512((const void *)off);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i lut = _mm512_add_epi8(
        _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)pg_kv_iq4nl)),
        _mm512_set1_epi8((char)0x80));
#define G(o) _mm512_i32gather_epi32(idx, (const void *)(base + (o)), 1)
    for (int64_t b = 0; b < n / PG_QK_K; b++) {
        const char *base = (const char *)x + (size_t)b * sizeof(pg_block_iq4_xs);
        uint8_t *t = (uint8_t *)tile + (size_t)b * PG_TILE_SB_BYTES;
        PG_UNROLL for (int ib = 0; ib < 8; ib++)
            PG_UNROLL for (int k = 0; k < 4; k++) {
                const __m512i q = G(8 + 16 * ib + 4 * k);
                const __m512i lo = _mm512_and_si512(q, m4);
                const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
                _mm512_storeu_si512((void *)(t + PG_TILE_LV + 64 * (8 * ib + k)),
                                    _mm512_shuffle_epi8(lut, lo));
                _mm512_storeu_si512((void *)(t + PG_TILE_LV + 64 * (8 * ib + 4 + k)),
                                    _mm512_shuffle_epi8(lut, hi));
            }
        const __m512i w0 = G(0), sl = G(4);   /* d | scales_h << 16; scales_l[0..3] */
        PG_UNROLL for (int ib = 0; ib < 8; ib++) {
            const __m512i lo4 = _mm512_and_si512(_mm512_srli_epi32(sl, 4 * ib), _mm512_set1_epi32(0xF));
            const __m512i hi2 = _mm512_and_si512(_mm512_srli_epi32(w0, 16 + 2 * ib), _mm512_set1_epi32(3));
            const __m512i sc = _mm512_sub_epi32(_mm512_or_si512(lo4, _mm512_slli_epi32(hi2, 4)),
                                                _mm512_set1_epi32(32));
            _mm512_storeu_si512((void *)(t + PG_TILE_SC + 64 * ib), sc);
            const __m512i w = _mm512_and_si512(_mm512_slli_epi32(sc, 7), _mm512_set1_epi32(0xFFFF));
            _mm512_storeu_si512((void *)(t + PG_TILE_BW + 64 * ib),
                                _mm512_or_si512(w, _mm512_slli_epi32(w, 16)));
        }
        _mm512_storeu_ps((void *)(t + PG_TILE_D), _mm512_cvtph_ps(_mm512_cvtepi32_epi16(w0)));
    }
#undef G
}

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
                const __m512i lv = _mm512_loadu_si512((const void *)(t + PG_TILE_LV + 64 * ch));
                PG_UNROLL for (int j = 0; j < C; j++)
                    s[j] = _mm512_dpbusd_epi32(s[j], lv, bcast32(yb[j]->qs + 4 * ch));
            }
            const __m512i sc = _mm512_loadu_si512((const void *)(t + PG_TILE_SC + 64 * g));
            PG_UNROLL for (int j = 0; j < C; j++)
                isum[j] = _mm512_add_epi32(isum[j], _mm512_mullo_epi32(s[j], sc));
        }
        const __m512 d = _mm512_loadu_ps((const void *)(t + PG_TILE_D));
        PG_UNROLL for (int j = 0; j < C; j++) {
            __m512i m = _mm512_setzero_si512();
            PG_UNROLL for (int k = 0; k < 8; k++)
                m = _mm512_dpwssd_epi32(
                    m, _mm512_loadu_si512((const void *)(t + PG_TILE_BW + 64 * k)),
                    bcast32(yb[j]->bsums + 2 * k));
            const __m512 dy = _mm512_set1_ps(yb[j]->d);
            __m512 term;
            if (HAS_MIN) {   /* (dy·d)·isum − (dy·dmin)·summs */
                const __m512 dmin = _mm512_loadu_ps((const void *)(t + PG_TILE_DMIN));
                term = _mm512_sub_ps(
                    _mm512_mul_ps(_mm512_mul_ps(dy, d), _mm512_cvtepi32_ps(isum[j])),
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

/* Legacy formats: y[j] activation rows (Q8_0). Per block, Σ (a + 128)·q by VPDPBUSD less
 * 128·Σq, then the scalar kernel's block term: ((float)sumi·dx)·dy (Q4_0, Q5_0) or
 * (float)sumi·(dx·dy) (Q8_0, Q8 = 1), added in block order. */
AINL void tile_rows_leg(int64_t n, const uint8_t *tile, const pg_block_q8_0 *const *y,
                        float **out, int nr, const int C, const int Q8) {
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    __m512 acc[8];
    PG_UNROLL for (int j = 0; j < C; j++) acc[j] = _mm512_setzero_ps();
    for (int64_t b = 0; b < n / PG_QK32; b++) {
        const uint8_t *t = tile + (size_t)b * PG_TILE_LEG_BYTES;
        /* the sums start at −128·Σq (exact modulo 2^32, as every partial sum) */
        const __m512i ncorr = _mm512_sub_epi32(
            _mm512_setzero_si512(), _mm512_loadu_si512((const void *)(t + PG_TILE_LEG_CORR)));
        __m512i s[8];
        PG_UNROLL for (int j = 0; j < C; j++) s[j] = ncorr;
        PG_UNROLL for (int e = 0; e < 8; e++) {
            const __m512i lv = _mm512_loadu_si512((const void *)(t + PG_TILE_LV + 64 * e));
            PG_UNROLL for (int j = 0; j < C; j++)
                s[j] = _mm512_dpbusd_epi32(
                    s[j], _mm512_xor_si512(bcast32(y[j][b].qs + 4 * e), flip), lv);
        }
        const __m512 dx = _mm512_loadu_ps((const void *)(t + PG_TILE_LEG_D));
        PG_UNROLL for (int j = 0; j < C; j++) {
            const __m512 dy = _mm512_set1_ps(_cvtsh_ss(y[j][b].d));
            const __m512 si = _mm512_cvtepi32_ps(s[j]);
            const __m512 term = Q8 ? _mm512_mul_ps(si, _mm512_mul_ps(dx, dy))
                                   : _mm512_mul_ps(_mm512_mul_ps(si, dx), dy);
            acc[j] = _mm512_add_ps(acc[j], term);
        }
    }
    const __mmask16 keep = (__mmask16)((1u << nr) - 1u);
    PG_UNROLL for (int j = 0; j < C; j++) _mm512_mask_storeu_ps(out[j], keep, acc[j]);
}

#define PG_TILE_C 8   /* activation rows per pass over the tile */

/* KIND: 0 K-quant groups of 16 with a min (Q2_K), 1 of 16 with an offset (Q3_K, Q6_K), 2 of
 * 32 with a min (Q4_K, Q5_K), 5 of 32 with an offset (IQ4_XS); 3 Q4_0 / Q5_0, 4 Q8_0, IQ4_NL,
 * MXFP4 */
AINL void tile_gemm(int64_t n, const void *tile, const void *y, size_t by, int64_t nc, float *s,
                    size_t bs, int nr, const int KIND) {
    for (int64_t j0 = 0; j0 < nc; j0 += PG_TILE_C) {
        const int c = (int)(nc - j0 < PG_TILE_C ? nc - j0 : PG_TILE_C);
        const void *yr[PG_TILE_C];
        float *out[PG_TILE_C];
        for (int j = 0; j < PG_TILE_C; j++) {   /* past c: row j0 again (same bits, stored twice) */
            const int64_t jj = j0 + (j < c ? j : 0);
            yr[j] = (const char *)y + (size_t)jj * by;
            out[j] = (float *)((char *)s + (size_t)jj * bs);
        }
        const int C = c > 4 ? PG_TILE_C : 4;
        if (KIND < 3 || KIND == 5) {
            const pg_block_q8_K *yk[PG_TILE_C];
            for (int j = 0; j < PG_TILE_C; j++) yk[j] = yr[j];
            const int GS = KIND >= 2 ? 32 : 16, HAS_MIN = KIND == 0 || KIND == 2;
            if (C == PG_TILE_C) tile_rows(n, tile, yk, out, nr, PG_TILE_C, GS, HAS_MIN);
            else tile_rows(n, tile, yk, out, nr, 4, GS, HAS_MIN);
        } else {
            const pg_block_q8_0 *yl[PG_TILE_C];
            for (int j = 0; j < PG_TILE_C; j++) yl[j] = yr[j];
            if (C == PG_TILE_C) tile_rows_leg(n, tile, yl, out, nr, PG_TILE_C, KIND == 4);
            else tile_rows_leg(n, tile, yl, out, nr, 4, KIND == 4);
        }
    }
}

#define PG_TILE_GEMM(name, KIND)                                                                   \
    static void name(int64_t n, const void *tile, const void *y, size_t by, int64_t nc,           \
                     float *s, size_t bs, int nr) {                                                \
        tile_gemm(n, tile, y, by, nc, s, bs, nr, KIND);                                            \
    }
PG_TILE_GEMM(tile_g16_min, 0)   /* Q2_K */
PG_TILE_GEMM(tile_g16_off, 1)   /* Q3_K, Q6_K */
PG_TILE_GEMM(tile_g32_min, 2)   /* Q4_K, Q5_K */
PG_TILE_GEMM(tile_leg, 3)       /* Q4_0, Q5_0 */
PG_TILE_GEMM(tile_leg_q8, 4)    /* Q8_0, IQ4_NL, MXFP4 */
PG_TILE_GEMM(tile_g32_off, 5)   /* IQ4_XS */

void pg_fill_gemm_tile_avx512(pg_type_traits *tbl) {
    if (!(pg_g_cpu_features & PG_CPU_AVX512VNNI)) return;
    tbl[PG_TYPE_Q2_K].tile_pack = pg_tile_pack_q2_K;
    tbl[PG_TYPE_Q2_K].tile_gemm = tile_g16_min;
    tbl[PG_TYPE_Q3_K].tile_pack = pg_tile_pack_q3_K;
    tbl[PG_TYPE_Q3_K].tile_gemm = tile_g16_off;
    tbl[PG_TYPE_Q4_K].tile_pack = pg_tile_pack_q4_K_avx512;
    tbl[PG_TYPE_Q4_K].tile_gemm = tile_g32_min;
    tbl[PG_TYPE_Q5_K].tile_pack = pg_tile_pack_q5_K_avx512;
    tbl[PG_TYPE_Q5_K].tile_gemm = tile_g32_min;
    tbl[PG_TYPE_Q6_K].tile_pack = pg_tile_pack_q6_K_avx512;
    tbl[PG_TYPE_Q6_K].tile_gemm = tile_g16_off;
    tbl[PG_TYPE_Q4_0].tile_pack = pack_q4_0;
    tbl[PG_TYPE_Q4_0].tile_gemm = tile_leg;
    tbl[PG_TYPE_Q5_0].tile_pack = pack_q5_0;
    tbl[PG_TYPE_Q5_0].tile_gemm = tile_leg;
    tbl[PG_TYPE_Q8_0].tile_pack = pack_q8_0;
    tbl[PG_TYPE_Q8_0].tile_gemm = tile_leg_q8;
    /* the codebook types: IQ4_NL and MXFP4's (d_y·d_x)·isum is Q8_0's term (products commute) */
    tbl[PG_TYPE_IQ4_XS].tile_pack = pack_iq4_xs;
    tbl[PG_TYPE_IQ4_XS].tile_gemm = tile_g32_off;
    tbl[PG_TYPE_IQ4_NL].tile_pack = pack_iq4_nl;
    tbl[PG_TYPE_IQ4_NL].tile_gemm = tile_leg_q8;
    tbl[PG_TYPE_MXFP4].tile_pack = pack_mxfp4;
    tbl[PG_TYPE_MXFP4].tile_gemm = tile_leg_q8;
}
