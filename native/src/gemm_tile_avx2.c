/* The repacked 16-row tiles of prompt-sized K-quant MUL_MATs with AVX2 (no VNNI): the avx2
 * path's form of gemm_tile_avx512.c (layout: gemm_tile.h, pack: gemm_tile.c). Each 64-byte
 * tile vector is two halves of 8 rows (lane r of half h = weight row 8h + r).
 *
 * Per chunk of 4 elements and activation row, the activation's 4 bytes are broadcast once and
 * one maddubs per half (with the 8 rows' levels) gives int16 pair sums; the chunks of a scale
 * group add up in int16 as far as they cannot overflow (|q·a| pairs ≤ 2·max·128: all 8 of a
 * group of 32 for Q4_K's levels ≤ 15, 4 for levels ≤ 31 (Q5_K) and ≤ 7 (Q3_K), 2 for Q6_K's
 * ≤ 63, 4 for Q2_K's groups of 16), then one madd with the rows' scales (int16 pairs) makes
 * int32. Without VNNI that is one maddubs and one add per 32 products, and AMD Zen 4 issues a
 * maddubs + add pair per 0.63 cycles: the kernel is bound by those two, so everything else
 * (scales, mins, the fp32 term) is kept per group or per super-block, the level vectors are
 * reused by 3 activation rows and the activation broadcasts by both halves. In cache, 1
 * thread, Zen 4 forced to avx2: Q4_K 266 GOP/s against the avx2 gemm's 147 (36 of the 51
 * products per cycle the pairs allow). Integer sums exact, the scalar vec_dot's fp32
 * super-block term per row in block order: the bits of vec_dot (native/tests/test_gemm_tile.c).
 * Q4_0 and Q5_0 (Gemma's main type) have the legacy tile of gemm_tile_avx512.c, packed and
 * dotted below with maddubs: Q5_0 100 -> 135 / 149 GOP/s at 64 / 512 activation rows, Q4_0
 * 115 -> 139 / 149. The codebook types reuse both: MXFP4 (|q| <= 12) the legacy tile as it is,
 * IQ4_NL the legacy tile and IQ4_XS the K-quant one with signed codebook levels dotted as
 * maddubs(|a|, sign(q, a)): with |q| up to 127 a maddubs pair of q and a + 128 (or of q + 128,
 * as the avx512 tiles have them, and a) would saturate int16. */
#include <immintrin.h>
#include <string.h>

#include "gemm_tile.h"
#include "fp16.h"
#include "iquants.h"
#include "kquants.h"
#include "pg_internal.h"
#include "quants.h"
#include "quants_legacy.h"

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

/* v is taken as it is here: GCC would otherwise reassociate a chain of adds into a tree whose
 * products all wait in registers (spilled to the stack, twice slower); no instruction */
#define PG_IN_ORDER(v) __asm__("" : "+x"(v))

/* activation rows per pass over the tile: 3 keeps the 6 int16 partials, the 6 int32 sums, two
 * level vectors and a broadcast in the 16 registers (4: the int32 sums spill, 5% slower) */
#define PG_TILE2_C 3

/* y[j] (j < C): activation rows (Q8_K); out[j]: their 16 outputs (nr stored). GS: elements per
 * scale, CH: chunks per int16 partial sum, HAS_MIN as in the avx512 form. Both halves of the
 * tile per activation broadcast: a broadcast feeds two maddubs, a level vector C. */
AINL void tile_rows(int64_t n, const uint8_t *tile, const pg_block_q8_K *const *y,
                    const pg_block_q8_K *const *ynext, float **out, int nr, const int C,
                    const int GS, const int CH, const int HAS_MIN, const int SGN) {
    const int64_t nb = n / PG_QK_K;
    const __m256i lo16 = _mm256_set1_epi32(0xFFFF);
    float acc[PG_TILE2_C][16] __attribute__((aligned(32))) = {{0}};
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *t = tile + (size_t)b * PG_TILE_SB_BYTES;
        const pg_block_q8_K *yb[PG_TILE2_C];
        PG_UNROLL for (int j = 0; j < C; j++) yb[j] = y[j] + b;
        __m256i isum[2][PG_TILE2_C];
        PG_UNROLL for (int j = 0; j < C; j++) isum[0][j] = isum[1][j] = _mm256_setzero_si256();
        for (int g = 0; g < PG_QK_K / GS; g++) {
            /* the activations' next super-block (of these rows, or the next pass's first):
             * the rows are ~1-5 KB apart, each super-block 292 B; without this the loads wait
             * on L2 (M 512: 25% slower) */
            PG_UNROLL for (int j = 0; j < C; j++)
                if (g < 8)
                    _mm_prefetch((const char *)(b + 1 < nb ? yb[j] + 1 : ynext[j]) + 40 * g,
                                 _MM_HINT_T0);
            PG_UNROLL for (int p = 0; p < GS / 4 / CH; p++) {
                __m256i s16[2][PG_TILE2_C];
                PG_UNROLL for (int e = 0; e < CH; e++) {
                    const int ch = g * (GS / 4) + p * CH + e;
                    const __m256i lv0 = _mm256_loadu_si256((const void *)(t + PG_TILE_LV + 64 * ch));
                    const __m256i lv1 =
                        _mm256_loadu_si256((const void *)(t + PG_TILE_LV + 64 * ch + 32));
                    PG_UNROLL for (int j = 0; j < C; j++) {
                        const __m256i a = bcast32(yb[j]->qs + 4 * ch);
                        const __m256i p0 =
                            SGN ? _mm256_maddubs_epi16(_mm256_abs_epi8(a), _mm256_sign_epi8(lv0, a))
                                : _mm256_maddubs_epi16(lv0, a);
                        const __m256i p1 =
                            SGN ? _mm256_maddubs_epi16(_mm256_abs_epi8(a), _mm256_sign_epi8(lv1, a))
                                : _mm256_maddubs_epi16(lv1, a);
                        s16[0][j] = e ? _mm256_add_epi16(s16[0][j], p0) : p0;
                        s16[1][j] = e ? _mm256_add_epi16(s16[1][j], p1) : p1;
                        PG_IN_ORDER(s16[0][j]);
                        PG_IN_ORDER(s16[1][j]);
                    }
                }
                PG_UNROLL for (int h = 0; h < 2; h++) {
                    const __m256i s32 =
                        _mm256_loadu_si256((const void *)(t + PG_TILE_SC + 64 * g + 32 * h));
                    const __m256i scw = _mm256_or_si256(_mm256_and_si256(s32, lo16),
                                                        _mm256_slli_epi32(s32, 16));
                    PG_UNROLL for (int j = 0; j < C; j++)
                        isum[h][j] = _mm256_add_epi32(isum[h][j], _mm256_madd_epi16(s16[h][j], scw));
                }
            }
        }
        /* the bsums term of the 16 rows and C activation rows: each weight vector loaded once */
        __m256i m[2][PG_TILE2_C];
        PG_UNROLL for (int j = 0; j < C; j++) m[0][j] = m[1][j] = _mm256_setzero_si256();
        if (!SGN) PG_UNROLL for (int k = 0; k < 8; k++) {
            const __m256i w0 = _mm256_loadu_si256((const void *)(t + PG_TILE_BW + 64 * k));
            const __m256i w1 = _mm256_loadu_si256((const void *)(t + PG_TILE_BW + 64 * k + 32));
            PG_UNROLL for (int j = 0; j < C; j++) {
                const __m256i a = bcast32(yb[j]->bsums + 2 * k);
                const __m256i p0 = _mm256_madd_epi16(w0, a), p1 = _mm256_madd_epi16(w1, a);
                m[0][j] = k ? _mm256_add_epi32(m[0][j], p0) : p0;
                m[1][j] = k ? _mm256_add_epi32(m[1][j], p1) : p1;
                PG_IN_ORDER(m[0][j]);
                PG_IN_ORDER(m[1][j]);
            }
        }
        PG_UNROLL for (int h = 0; h < 2; h++) {
            const __m256 d = _mm256_loadu_ps((const void *)(t + PG_TILE_D + 32 * h));
            PG_UNROLL for (int j = 0; j < C; j++) {
                const __m256 dy = _mm256_set1_ps(yb[j]->d);
                __m256 term;
                if (HAS_MIN) {   /* (dy·d)·isum − (dy·dmin)·summs */
                    const __m256 dmin = _mm256_loadu_ps((const void *)(t + PG_TILE_DMIN + 32 * h));
                    term = _mm256_sub_ps(
                        _mm256_mul_ps(_mm256_mul_ps(dy, d), _mm256_cvtepi32_ps(isum[h][j])),
                        _mm256_mul_ps(_mm256_mul_ps(dy, dmin), _mm256_cvtepi32_ps(m[h][j])));
                } else {         /* (d·dy)·isum, isum with the levels' offset */
                    term = _mm256_mul_ps(_mm256_mul_ps(d, dy),
                                         _mm256_cvtepi32_ps(_mm256_sub_epi32(isum[h][j], m[h][j])));
                }
                float *a = acc[j] + 8 * h;
                _mm256_store_ps(a, _mm256_add_ps(_mm256_load_ps(a), term));
            }
        }
    }
    for (int j = 0; j < C; j++) memcpy(out[j], acc[j], (size_t)nr * sizeof(float));
}

AINL void tile_gemm(int64_t n, const void *tile, const void *y, size_t by, int64_t nc, float *s,
                    size_t bs, int nr, const int GS, const int CH, const int HAS_MIN,
                    const int SGN) {
    for (int64_t j0 = 0; j0 < nc; j0 += PG_TILE2_C) {
        const int c = (int)(nc - j0 < PG_TILE2_C ? nc - j0 : PG_TILE2_C);
        const pg_block_q8_K *yr[PG_TILE2_C], *yn[PG_TILE2_C];
        float *out[PG_TILE2_C];
        for (int j = 0; j < PG_TILE2_C; j++) {   /* past c: row j0 again (same bits, stored twice) */
            const int64_t jj = j0 + (j < c ? j : 0), jn = j0 + PG_TILE2_C + j;
            yr[j] = (const pg_block_q8_K *)((const char *)y + (size_t)jj * by);
            yn[j] = (const pg_block_q8_K *)((const char *)y + (size_t)(jn < nc ? jn : jj) * by);
            out[j] = (float *)((char *)s + (size_t)jj * bs);
        }
        tile_rows(n, (const uint8_t *)tile, yr, yn, out, nr, PG_TILE2_C, GS, CH, HAS_MIN, SGN);
    }
}

#define PG_TILE2_GEMM(name, GS, CH, HAS_MIN, SGN)                                                  \
    static void name(int64_t n, const void *tile, const void *y, size_t by, int64_t nc,           \
                     float *s, size_t bs, int nr) {                                                \
        tile_gemm(n, tile, y, by, nc, s, bs, nr, GS, CH, HAS_MIN, SGN);                            \
    }
PG_TILE2_GEMM(tile_q2_K, 16, 4, 1, 0)
PG_TILE2_GEMM(tile_q3_K, 16, 4, 0, 0)
PG_TILE2_GEMM(tile_q4_K, 32, 8, 1, 0)
PG_TILE2_GEMM(tile_q5_K, 32, 4, 1, 0)
PG_TILE2_GEMM(tile_q6_K, 16, 2, 0, 0)
/* IQ4_XS: signed codebook levels (|q| <= 127; + 128 as the avx512 tile has them, a maddubs pair
 * would saturate), so maddubs(|a|, sign(q, a)) (pairs <= 2·128·127, one chunk per partial), no
 * offset: the bsums term is 0 */
PG_TILE2_GEMM(tile_iq4_xs, 32, 1, 0, 1)

/* The IQ4_XS pack, 8 rows at a time by gathers (as pack_leg below): qs[16ib + 4k..] holds
 * elements 32ib + 4k.. (low nibbles) and 32ib + 16 + 4k.. (high); sc[ib] = ls − 32; bw unused. */
static void pack_iq4_xs(int64_t n, const void *x, size_t bx, int nr, void *tile) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), f = _mm256_set1_epi32(0xF);
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)pg_kv_iq4nl));
    for (int hh = 0; hh < 2; hh++) {
        int32_t off[8];
        for (int r = 0; r < 8; r++)
            off[r] = 8 * hh + r < nr ? (int32_t)((size_t)(8 * hh + r) * bx) : 0;
        const __m256i idx = _mm256_loadu_si256((const void *)off);
        for (int64_t b = 0; b < n / PG_QK_K; b++) {
            const char *base = (const char *)x + (size_t)b * sizeof(pg_block_iq4_xs);
            uint8_t *t = (uint8_t *)tile + (size_t)b * PG_TILE_SB_BYTES;
#define G(o) _mm256_i32gather_epi32((const int *)(const void *)(base + (o)), idx, 1)
            for (int ib = 0; ib < 8; ib++)
                PG_UNROLL for (int k = 0; k < 4; k++) {
                    const __m256i q = G(8 + 16 * ib + 4 * k);
                    const __m256i lo = _mm256_and_si256(q, m4);
                    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                    _mm256_storeu_si256((void *)(t + PG_TILE_LV + 64 * (8 * ib + k) + 32 * hh),
                                        _mm256_shuffle_epi8(lut, lo));
                    _mm256_storeu_si256((void *)(t + PG_TILE_LV + 64 * (8 * ib + 4 + k) + 32 * hh),
                                        _mm256_shuffle_epi8(lut, hi));
                }
            const __m256i w0 = G(0), sl = G(4);   /* d | scales_h << 16; scales_l[0..3] */
            for (int ib = 0; ib < 8; ib++) {
                const __m256i lo4 = _mm256_and_si256(_mm256_srli_epi32(sl, 4 * ib), f);
                const __m256i hi2 =
                    _mm256_and_si256(_mm256_srli_epi32(w0, 16 + 2 * ib), _mm256_set1_epi32(3));
                const __m256i sc = _mm256_sub_epi32(_mm256_or_si256(lo4, _mm256_slli_epi32(hi2, 4)),
                                                    _mm256_set1_epi32(32));
                _mm256_storeu_si256((void *)(t + PG_TILE_SC + 64 * ib + 32 * hh), sc);
            }
            const __m256i d16 =
                _mm256_packus_epi32(_mm256_and_si256(w0, _mm256_set1_epi32(0xFFFF)),
                                    _mm256_setzero_si256());
            const __m128i h = _mm256_castsi256_si128(_mm256_permute4x64_epi64(d16, 0x08));
            _mm256_storeu_ps((void *)(t + PG_TILE_D + 32 * hh), _mm256_cvtph_ps(h));
#undef G
        }
    }
}

/* ---- Q4_0 and Q5_0: a tile per block of 32 (layout: gemm_tile.h) -------------------------- */

/* The pack, 8 rows at a time (as gemm_tile_avx512.c's, at half the width): G(o) gathers the
 * dword at byte o of block b of the 8 rows, the scalar decode runs on 4 bytes per lane, the 5th
 * bit of Q5_0 spread from qh by a multiply; Σq per row by maddubs with ones. TYPE 0: Q4_0,
 * 1: Q5_0, 3: IQ4_NL, 4: MXFP4 (as gemm_tile_avx512.c: the levels by VPSHUFB from the codebook,
 * MXFP4's scale its E8M0 byte). (A pack in 32-bit words per row cost 30% of the dots of 64
 * activation rows.) */
AINL void pack_leg(const int TYPE, size_t bsize, int64_t n, const void *x, size_t bx, int nr,
                   void *tile) {
    const int Q5 = TYPE == 1;
    const __m256i m4 = _mm256_set1_epi8(0x0F), ones8 = _mm256_set1_epi8(1);
    const __m256i ones16 = _mm256_set1_epi16(1), c = _mm256_set1_epi8(Q5 ? 16 : 8);
    const __m256i lut = _mm256_broadcastsi128_si256(
        _mm_loadu_si128((const __m128i *)(TYPE == 4 ? pg_kv_mxfp4 : pg_kv_iq4nl)));
    __m256i idx[2];
    for (int hh = 0; hh < 2; hh++) {
        int32_t off[8];
        for (int r = 0; r < 8; r++)
            off[r] = 8 * hh + r < nr ? (int32_t)((size_t)(8 * hh + r) * bx) : 0;
        idx[hh] = _mm256_loadu_si256((const void *)off);
    }
    for (int64_t b = 0; b < n / PG_QK32; b++) {
        const char *base = (const char *)x + (size_t)b * bsize;
        uint8_t *t = (uint8_t *)tile + (size_t)b * PG_TILE_LEG_BYTES;
        for (int hh = 0; hh < 2; hh++) {
#define G(o) _mm256_i32gather_epi32((const int *)(const void *)(base + (o)), idx[hh], 1)
            const __m256i qh = Q5 ? G(2) : _mm256_setzero_si256();
            __m256i s16 = _mm256_setzero_si256();
            PG_UNROLL for (int k = 0; k < 4; k++) {
                const __m256i q = G(Q5 ? 6 + 4 * k : TYPE == 4 ? 1 + 4 * k : 2 + 4 * k);
                __m256i lo = _mm256_and_si256(q, m4);
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                if (Q5) {   /* qh bit j -> 0x10 of element j: 4 bits to 4 bytes */
                    const __m256i sp = _mm256_set1_epi32(0x00204081);
                    const __m256i b1 = _mm256_set1_epi32(0x01010101), f = _mm256_set1_epi32(0xF);
                    const __m256i hl = _mm256_and_si256(_mm256_srli_epi32(qh, 4 * k), f);
                    const __m256i hu = _mm256_and_si256(_mm256_srli_epi32(qh, 16 + 4 * k), f);
                    lo = _mm256_or_si256(
                        lo, _mm256_slli_epi32(_mm256_and_si256(_mm256_mullo_epi32(hl, sp), b1), 4));
                    hi = _mm256_or_si256(
                        hi, _mm256_slli_epi32(_mm256_and_si256(_mm256_mullo_epi32(hu, sp), b1), 4));
                }
                const __m256i vl = TYPE >= 3 ? _mm256_shuffle_epi8(lut, lo) : _mm256_sub_epi8(lo, c);
                const __m256i vh = TYPE >= 3 ? _mm256_shuffle_epi8(lut, hi) : _mm256_sub_epi8(hi, c);
                _mm256_storeu_si256((void *)(t + PG_TILE_LV + 64 * k + 32 * hh), vl);
                _mm256_storeu_si256((void *)(t + PG_TILE_LV + 64 * (4 + k) + 32 * hh), vh);
                s16 = _mm256_add_epi16(s16, _mm256_add_epi16(_mm256_maddubs_epi16(ones8, vl),
                                                              _mm256_maddubs_epi16(ones8, vh)));
            }
            _mm256_storeu_si256((void *)(t + PG_TILE_LEG_CORR + 32 * hh),
                                _mm256_slli_epi32(_mm256_madd_epi16(s16, ones16), 7));
            if (TYPE == 4) {   /* pg_e8m0_half(e): 0x00200000 << e for e < 2, else (e − 1) << 23 */
                const __m256i e = _mm256_and_si256(G(0), _mm256_set1_epi32(0xFF));
                const __m256i sub = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
                const __m256i nrm = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
                const __m256i den = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
                _mm256_storeu_si256((void *)(t + PG_TILE_LEG_D + 32 * hh),
                                    _mm256_blendv_epi8(nrm, den, sub));
                continue;
            }
            /* d: the low 16 bits of the dword at 0, packed to 8 words in order */
            const __m256i d16 =
                _mm256_packus_epi32(_mm256_and_si256(G(0), _mm256_set1_epi32(0xFFFF)),
                                    _mm256_setzero_si256());
            const __m128i h = _mm256_castsi256_si128(_mm256_permute4x64_epi64(d16, 0x08));
            _mm256_storeu_ps((void *)(t + PG_TILE_LEG_D + 32 * hh), _mm256_cvtph_ps(h));
#undef G
        }
    }
}

static void pack_q4_0(int64_t n, const void *x, size_t bx, int nr, void *tile) {
    pack_leg(0, sizeof(pg_block_q4_0), n, x, bx, nr, tile);
}
static void pack_q5_0(int64_t n, const void *x, size_t bx, int nr, void *tile) {
    pack_leg(1, sizeof(pg_block_q5_0), n, x, bx, nr, tile);
}
static void pack_iq4_nl(int64_t n, const void *x, size_t bx, int nr, void *tile) {
    pack_leg(3, sizeof(pg_block_iq4_nl), n, x, bx, nr, tile);
}
static void pack_mxfp4(int64_t n, const void *x, size_t bx, int nr, void *tile) {
    pack_leg(4, sizeof(pg_block_mxfp4), n, x, bx, nr, tile);
}

/* y[j]: activation rows (Q8_0). Per block, Σ (a + 128)·q by maddubs (the activation side is the
 * unsigned one), int16 partials over CH chunks (pairs ≤ 2·255·16: 4 chunks for Q5_0, 8 for
 * Q4_0's |q| ≤ 8, 4 for MXFP4's ≤ 12), madd by ones, less 128·Σq; then the scalar kernel's
 * ((float)sumi·dx)·dy added in block order ((float)sumi·(dx·dy) for Q8: IQ4_NL, MXFP4).
 * SGN (IQ4_NL, |q| ≤ 127: a pair 2·255·127 would saturate): maddubs(|a|, q signed as a) instead,
 * pairs ≤ 2·128·127 (|−128| is 128 unsigned, q is never −128), madd per chunk, no 128·Σq. */
AINL void tile_rows_leg(int64_t n, const uint8_t *tile, const pg_block_q8_0 *const *y,
                        float **out, int nr, const int C, const int CH, const int Q8,
                        const int SGN) {
    const __m256i flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    float acc[PG_TILE2_C][16] __attribute__((aligned(32))) = {{0}};
    for (int64_t b = 0; b < n / PG_QK32; b++) {
        const uint8_t *t = tile + (size_t)b * PG_TILE_LEG_BYTES;
        PG_UNROLL for (int j = 0; j < C; j++) _mm_prefetch((const char *)(y[j] + b) + 160, _MM_HINT_T0);
        __m256i isum[2][PG_TILE2_C];
        PG_UNROLL for (int p = 0; p < 8 / CH; p++) {
            __m256i s16[2][PG_TILE2_C];
            PG_UNROLL for (int e = 0; e < CH; e++) {
                const int ch = p * CH + e;
                const __m256i lv0 = _mm256_loadu_si256((const void *)(t + PG_TILE_LV + 64 * ch));
                const __m256i lv1 = _mm256_loadu_si256((const void *)(t + PG_TILE_LV + 64 * ch + 32));
                PG_UNROLL for (int j = 0; j < C; j++) {
                    const __m256i ar = bcast32(y[j][b].qs + 4 * ch);
                    const __m256i a = SGN ? _mm256_abs_epi8(ar) : _mm256_xor_si256(ar, flip);
                    const __m256i p0 =
                        _mm256_maddubs_epi16(a, SGN ? _mm256_sign_epi8(lv0, ar) : lv0);
                    const __m256i p1 =
                        _mm256_maddubs_epi16(a, SGN ? _mm256_sign_epi8(lv1, ar) : lv1);
                    s16[0][j] = e ? _mm256_add_epi16(s16[0][j], p0) : p0;
                    s16[1][j] = e ? _mm256_add_epi16(s16[1][j], p1) : p1;
                    PG_IN_ORDER(s16[0][j]);
                    PG_IN_ORDER(s16[1][j]);
                }
            }
            PG_UNROLL for (int h = 0; h < 2; h++)
                PG_UNROLL for (int j = 0; j < C; j++) {
                    const __m256i v = _mm256_madd_epi16(s16[h][j], ones);
                    isum[h][j] = p ? _mm256_add_epi32(isum[h][j], v) : v;
                }
        }
        PG_UNROLL for (int h = 0; h < 2; h++) {
            const __m256i corr =
                SGN ? _mm256_setzero_si256()
                    : _mm256_loadu_si256((const void *)(t + PG_TILE_LEG_CORR + 32 * h));
            const __m256 dx = _mm256_loadu_ps((const void *)(t + PG_TILE_LEG_D + 32 * h));
            PG_UNROLL for (int j = 0; j < C; j++) {
                pg_fp16 hd;
                memcpy(&hd, &y[j][b].d, 2);
                const __m256 dy = _mm256_set1_ps(pg_fp16_to_fp32(hd));
                const __m256 si = _mm256_cvtepi32_ps(_mm256_sub_epi32(isum[h][j], corr));
                float *a = acc[j] + 8 * h;
                const __m256 term = Q8 ? _mm256_mul_ps(si, _mm256_mul_ps(dx, dy))
                                       : _mm256_mul_ps(_mm256_mul_ps(si, dx), dy);
                _mm256_store_ps(a, _mm256_add_ps(_mm256_load_ps(a), term));
            }
        }
    }
    for (int j = 0; j < C; j++) memcpy(out[j], acc[j], (size_t)nr * sizeof(float));
}

AINL void tile_gemm_leg(int64_t n, const void *tile, const void *y, size_t by, int64_t nc,
                        float *s, size_t bs, int nr, const int CH, const int Q8,
                        const int SGN) {
    for (int64_t j0 = 0; j0 < nc; j0 += PG_TILE2_C) {
        const int c = (int)(nc - j0 < PG_TILE2_C ? nc - j0 : PG_TILE2_C);
        const pg_block_q8_0 *yr[PG_TILE2_C];
        float *out[PG_TILE2_C];
        for (int j = 0; j < PG_TILE2_C; j++) {   /* past c: row j0 again (same bits, stored twice) */
            const int64_t jj = j0 + (j < c ? j : 0);
            yr[j] = (const pg_block_q8_0 *)((const char *)y + (size_t)jj * by);
            out[j] = (float *)((char *)s + (size_t)jj * bs);
        }
        tile_rows_leg(n, (const uint8_t *)tile, yr, out, nr, PG_TILE2_C, CH, Q8, SGN);
    }
}

static void tile_q4_0(int64_t n, const void *tile, const void *y, size_t by, int64_t nc, float *s,
                      size_t bs, int nr) {
    tile_gemm_leg(n, tile, y, by, nc, s, bs, nr, 8, 0, 0);
}
static void tile_q5_0(int64_t n, const void *tile, const void *y, size_t by, int64_t nc, float *s,
                      size_t bs, int nr) {
    tile_gemm_leg(n, tile, y, by, nc, s, bs, nr, 4, 0, 0);
}
/* the codebook types: (d_y·d_x)·isum as Q8_0's term (products commute) */
static void tile_iq4_nl(int64_t n, const void *tile, const void *y, size_t by, int64_t nc,
                        float *s, size_t bs, int nr) {
    tile_gemm_leg(n, tile, y, by, nc, s, bs, nr, 1, 1, 1);
}
static void tile_mxfp4(int64_t n, const void *tile, const void *y, size_t by, int64_t nc,
                       float *s, size_t bs, int nr) {
    tile_gemm_leg(n, tile, y, by, nc, s, bs, nr, 4, 1, 0);
}

void pg_fill_gemm_tile_avx2(pg_type_traits *tbl) {
    tbl[PG_TYPE_Q2_K].tile_pack = pg_tile_pack_q2_K;
    tbl[PG_TYPE_Q2_K].tile_gemm = tile_q2_K;
    tbl[PG_TYPE_Q3_K].tile_pack = pg_tile_pack_q3_K;
    tbl[PG_TYPE_Q3_K].tile_gemm = tile_q3_K;
    tbl[PG_TYPE_Q4_K].tile_pack = pg_tile_pack_q4_K_avx2;
    tbl[PG_TYPE_Q4_K].tile_gemm = tile_q4_K;
    tbl[PG_TYPE_Q5_K].tile_pack = pg_tile_pack_q5_K_avx2;
    tbl[PG_TYPE_Q5_K].tile_gemm = tile_q5_K;
    tbl[PG_TYPE_Q6_K].tile_pack = pg_tile_pack_q6_K_avx2;
    tbl[PG_TYPE_Q6_K].tile_gemm = tile_q6_K;
    tbl[PG_TYPE_Q4_0].tile_pack = pack_q4_0;
    tbl[PG_TYPE_Q4_0].tile_gemm = tile_q4_0;
    tbl[PG_TYPE_Q5_0].tile_pack = pack_q5_0;
    tbl[PG_TYPE_Q5_0].tile_gemm = tile_q5_0;
    tbl[PG_TYPE_IQ4_XS].tile_pack = pack_iq4_xs;
    tbl[PG_TYPE_IQ4_XS].tile_gemm = tile_iq4_xs;
    tbl[PG_TYPE_IQ4_NL].tile_pack = pack_iq4_nl;
    tbl[PG_TYPE_IQ4_NL].tile_gemm = tile_iq4_nl;
    tbl[PG_TYPE_MXFP4].tile_pack = pack_mxfp4;
    tbl[PG_TYPE_MXFP4].tile_gemm = tile_mxfp4;
}
