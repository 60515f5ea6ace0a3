/* IQ4_NL, IQ4_XS and MXFP4: the AVX-512 VNNI variants of the x86 kernels (iq4_x86_body.h):
 * integer dots of 32 bytes through 256-bit VPDPBUSD (the one-row vec_dot), IQ4_XS's scaled pair
 * sums through VPDPWSSD, and the eight-row decode kernels (vec_dot8, and the gemm over them) on
 * 512-bit rows (below): IQ4_XS a super-block's half per register, IQ4_NL and MXFP4 four blocks
 * per register. Installed on the avx512 path only with AVX512-VNNI (without it the path keeps
 * the AVX2 kernels). The scalar kernels' bits, as on every path. */
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

/* ---- IQ4_NL and MXFP4 · Q8_0 on 512-bit rows, four blocks at a time ---------------------------
 * The 32-element blocks' 256-bit kernel above spends most of its time outside the dot: a fold of
 * eight rows' partials and a gather of eight fp16 scales per block. Here one 512-bit register
 * holds four consecutive blocks of a row (128-bit lane k = block b + k's 16 code bytes; low
 * nibbles are elements 0..15, high nibbles 16..31), and the activations are regrouped the same
 * way once per four blocks (shared by the eight rows). With the values + 128 (unsigned, for
 * VPDPBUSD) a row leaves lane k = 4 partials of block k; a transpose-add of four rows gives lane
 * k = the exact sums of block k for rows 0..3 (P) and 4..7 (Q), and −128·Σa of block k is taken
 * off per lane. The scales come out in the same layout: one 512-bit load at each row's first
 * block, its four fp16 d (IQ4_NL; bytes 0, 18, 36, 54) or E8M0 e (MXFP4; 0, 17, 34, 51) picked
 * by VPERMT2W two rows at a time and interleaved. Each block's fp32 term (d_y·d_x)·isum is the
 * scalar kernel's and is added to the row's sum in block order: the scalar bits on every lane.
 * Loads stay inside the four blocks (a group is 72 or 68 bytes), the ragged last 1..3 blocks of
 * a row go through the 256-bit block dot.
 * With AVX512-VBMI (checked at fill time) a row's four blocks come from two loads and one
 * VPERMI2B, its scales from the same first load (a VPERMI2B per two rows), and its nibbles look
 * up by VPERMB without masking: in cache IQ4_NL 72 -> 87, MXFP4 68 -> 85 GOP/s (decode,
 * 4096 x 256). MXFP4's E8M0 scale is applied as
 * VSCALEFPS(d_y, e - 128): one rounding of d_y·2^(e-128), the scalar product's bits. */

/* the 16 bytes at p + k·stride in 128-bit lane k */
static inline __m512i load4x16(const uint8_t *p, size_t stride) {
    __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)p));
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p + stride)), 1);
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p + 2 * stride)), 2);
    return _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p + 3 * stride)), 3);
}

/* pairs of rows -> per 128-bit lane [Σ a0+a2, Σ b0+b2, Σ a1+a3, Σ b1+b3] (exact) */
static inline __m512i tr_add32(__m512i a, __m512i b) {
    return _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
}
static inline __m512i tr_add64(__m512i a, __m512i b) {
    return _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
}

/* the upper 8 floats (AVX512F: no DQ on this path) */
static inline __m256 hi256_ps(__m512 v) {
    return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
}

/* the eight rows' scales of blocks b .. b + 3, lane k element r = row r (r < 4: the first
 * result, r >= 4: the second, in elements 0..3 of lane k), from rows[r] = the 64 bytes at row
 * r's block b: IQ4_NL's d_x as floats; MXFP4's e − 128 as floats, the power of two that
 * VSCALEFPS applies (dy·2^(e−128) rounded once: the bits of the scalar dy·pg_e8m0_half(e), whose
 * factor is exact for every e, the two subnormal ones included) */
static inline __attribute__((always_inline)) void nl4_dx(const __m512i rows[8], const int mx,
                                                         __m512 *dp, __m512 *dq) {
    /* word index of each block's scale: IQ4_NL's d at bytes 18k (words 9k), MXFP4's e at bytes
     * 17k (low byte of word 0, high of 8, low of 17, high of 25); two rows interleaved (the
     * second row's words from 32 on) */
    const __m512i pick = mx ? _mm512_setr_epi32(0 | 32 << 16, 8 | 40 << 16, 17 | 49 << 16,
                                                25 | 57 << 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
                            : _mm512_setr_epi32(0 | 32 << 16, 9 | 41 << 16, 18 | 50 << 16,
                                                27 | 59 << 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    __m128i w[4];
    IQX_UNROLL for (int r = 0; r < 8; r += 2)
        w[r / 2] = _mm512_castsi512_si128(_mm512_permutex2var_epi16(rows[r], pick, rows[r + 1]));
    /* [blk0 rows 0..3 | blk1 rows 0..3], [blk2 | blk3] as words; the same for rows 4..7 */
    const __m256i p16 = _mm256_set_m128i(_mm_unpackhi_epi32(w[0], w[1]), _mm_unpacklo_epi32(w[0], w[1]));
    const __m256i q16 = _mm256_set_m128i(_mm_unpackhi_epi32(w[2], w[3]), _mm_unpacklo_epi32(w[2], w[3]));
    if (mx) {
        /* blocks 1 and 3 have their e in the high byte */
        const __m512i sh = _mm512_setr_epi32(0, 0, 0, 0, 8, 8, 8, 8, 0, 0, 0, 0, 8, 8, 8, 8);
        const __m512i ff = _mm512_set1_epi32(0xFF);
        const __m512 bias = _mm512_set1_ps(128.0f);
        *dp = _mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_and_si512(
            _mm512_srlv_epi32(_mm512_cvtepu16_epi32(p16), sh), ff)), bias);
        *dq = _mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_and_si512(
            _mm512_srlv_epi32(_mm512_cvtepu16_epi32(q16), sh), ff)), bias);
    } else {
        *dp = _mm512_cvtph_ps(p16);
        *dq = _mm512_cvtph_ps(q16);
    }
}

/* VPERMI2B (AVX512-VBMI): byte i of the result = byte idx[i] of the 128 bytes [a | b]. Written
 * as asm so that the kernels of CPUs without VBMI, compiled from the same body, never hold the
 * instruction (the caller checks the CPU at fill time); the compiler does not emit it itself. */
static inline __m512i perm2b(__m512i idx, __m512i a, __m512i b) {
    __asm__("vpermi2b %2, %1, %0" : "+v"(idx) : "v"(a), "v"(b));
    return idx;
}

/* VPERMB (AVX512-VBMI): byte i of the result = byte idx[i] % 64 of t (asm: see perm2b). With the
 * 16-entry table repeated four times in t, the low nibble of any byte looks up without masking
 * the bits above it (VPSHUFB zeroes a byte whose bit 7 is set). */
static inline __m512i perm1b(__m512i idx, __m512i t) {
    __m512i r;
    __asm__("vpermb %2, %1, %0" : "=v"(r) : "v"(idx), "v"(t));
    return r;
}

/* perm2b indexes of the vbmi kernels ([a | b] = 128 bytes).
 * Codes (IQ4_NL, MXFP4): a = a row's first 64 bytes of the group, b = the fourth block's 16 code
 * bytes; lane k = block k's codes. */
static const uint8_t k_nl4_codes[2][64] __attribute__((aligned(64))) = {
    {2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17,
     20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35,
     38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53,
     64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79},
    {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
     18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33,
     35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50,
     64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79},
};
/* scales of two rows [row r | row r + 1] (their first 64 bytes): IQ4_NL's fp16 d of block k to
 * word 4k + r % 4 (r even: table 0, words 4k, 4k + 1; table 1: 4k + 2, 4k + 3), MXFP4's e to
 * byte 4k + r % 4 the same way; the other positions are blended away */
static const uint8_t k_nl4_scales[2][2][64] __attribute__((aligned(64))) = {
    {
        {0, 1, 64, 65, 0, 0, 0, 0, 18, 19, 82, 83, 0, 0, 0, 0,
         36, 37, 100, 101, 0, 0, 0, 0, 54, 55, 118, 119, 0, 0, 0, 0,
         0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
         0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
        {0, 0, 0, 0, 0, 1, 64, 65, 0, 0, 0, 0, 18, 19, 82, 83,
         0, 0, 0, 0, 36, 37, 100, 101, 0, 0, 0, 0, 54, 55, 118, 119,
         0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
         0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    },
    {
        {0, 64, 0, 0, 17, 81, 0, 0, 34, 98, 0, 0, 51, 115, 0, 0,
         0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
         0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
         0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
        {0, 0, 0, 64, 0, 0, 17, 81, 0, 0, 34, 98, 0, 0, 51, 115,
         0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
         0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
         0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    },
};

/* vbmi: a row's four blocks by two loads (its first 64 bytes, the last block's 16 code bytes)
 * and one VPERMI2B instead of four 16-byte loads and three inserts; the scales come out of the
 * first load. Otherwise a second 64-byte load per row for the scales. */
static inline __attribute__((always_inline)) void nl4_rows8_512_c(int64_t n, float *s,
        size_t bs, const void *vx, size_t bx, const void *vy, size_t by, const int C,
        const int mx, const int vbmi) {
    const char *x = vx;
    const size_t BS = mx ? sizeof(pg_block_mxfp4) : sizeof(pg_block_iq4_nl), QO = mx ? 1 : 2;
    const __m512i m4 = _mm512_set1_epi8(0xF), ones = _mm512_set1_epi8(1);
    const __m512i lut = _mm512_broadcast_i32x4(_mm_add_epi8(
        _mm_loadu_si128((const __m128i *)(mx ? pg_kv_mxfp4 : pg_kv_iq4nl)), _mm_set1_epi8(-128)));
    /* lane k of the fp32 terms: [P lane k | Q lane k] = rows 0..7 of block k */
    const __m512i i01 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i i23 = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29,
                                          30, 31);
    const __m512i bcast4 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m512i cidx = _mm512_load_si512(k_nl4_codes[mx]);
    __m256 acc[IQX_MAX_C];
    IQX_UNROLL for (int j = 0; j < C; j++) acc[j] = _mm256_setzero_ps();
    const int64_t nb = n / 32, nb4 = nb & ~(int64_t)3;
    const size_t share = iqx_share(bx, nb);
    for (int64_t b = 0; b < nb4; b += 4) {
        IQX_UNROLL for (int k = 0; k < 4; k++) iqx_prefetch(vx, bx, b + k, share);
        __m512i alo[IQX_MAX_C], ahi[IQX_MAX_C], corr[IQX_MAX_C];
        __m512 dy[IQX_MAX_C];
        IQX_UNROLL for (int j = 0; j < C; j++) {
            const uint8_t *yb = (const uint8_t *)vy + (size_t)j * by + (size_t)b * sizeof(pg_block_q8_0);
            alo[j] = load4x16(yb + 2, sizeof(pg_block_q8_0));
            ahi[j] = load4x16(yb + 18, sizeof(pg_block_q8_0));
            __m512i sa = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ones,
                                                                 alo[j]), ones, ahi[j]);
            sa = _mm512_add_epi32(sa, _mm512_shuffle_epi32(sa, _MM_PERM_BADC));
            sa = _mm512_add_epi32(sa, _mm512_shuffle_epi32(sa, _MM_PERM_CDAB));
            corr[j] = _mm512_slli_epi32(sa, 7);
            dy[j] = _mm512_permutexvar_ps(bcast4, _mm512_castps128_ps512(
                _mm_cvtph_ps(fp16x4(yb, sizeof(pg_block_q8_0)))));
        }
        __m512i half[IQX_MAX_C][2], pq[IQX_MAX_C][2], rows[8], wsc[4];
        IQX_UNROLL for (int r = 0; r < 8; r += 2) {
            __m512i d0[IQX_MAX_C], d1[IQX_MAX_C];
            IQX_UNROLL for (int h = 0; h < 2; h++) {
                const uint8_t *xr = (const uint8_t *)x + (size_t)(r + h) * bx + (size_t)b * BS;
                __m512i q;
                if (vbmi) {
                    rows[r + h] = _mm512_loadu_si512(xr);
                    q = perm2b(cidx, rows[r + h], _mm512_castsi128_si512(
                        _mm_loadu_si128((const __m128i *)(xr + 4 * BS - 16))));
                } else {
                    q = load4x16(xr + QO, BS);
                }
                __m512i ulo, uhi;
                if (vbmi) {
                    ulo = perm1b(q, lut);
                    uhi = perm1b(_mm512_srli_epi16(q, 4), lut);
                } else {
                    ulo = _mm512_shuffle_epi8(lut, _mm512_and_si512(q, m4));
                    uhi = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(q, 4), m4));
                }
                IQX_UNROLL for (int j = 0; j < C; j++) {
                    const __m512i d = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(
                        _mm512_setzero_si512(), ulo, alo[j]), uhi, ahi[j]);
                    if (h) d1[j] = d; else d0[j] = d;
                }
            }
            if (vbmi)
                wsc[r / 2] = perm2b(_mm512_load_si512(k_nl4_scales[mx][(r / 2) % 2]), rows[r],
                                    rows[r + 1]);
            IQX_UNROLL for (int j = 0; j < C; j++) half[j][(r / 2) % 2] = tr_add32(d0[j], d1[j]);
            if (r % 4 == 2)
                IQX_UNROLL for (int j = 0; j < C; j++)
                    pq[j][r / 4] = _mm512_sub_epi32(tr_add64(half[j][0], half[j][1]), corr[j]);
        }
        __m512 dp, dq;
        if (vbmi && mx) {
            const __m512 bias = _mm512_set1_ps(128.0f);
            const __m128i ep = _mm_blend_epi16(_mm512_castsi512_si128(wsc[0]),
                                               _mm512_castsi512_si128(wsc[1]), 0xAA);
            const __m128i eq = _mm_blend_epi16(_mm512_castsi512_si128(wsc[2]),
                                               _mm512_castsi512_si128(wsc[3]), 0xAA);
            dp = _mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(ep)), bias);
            dq = _mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(eq)), bias);
        } else if (vbmi) {
            dp = _mm512_cvtph_ps(_mm256_blend_epi32(_mm512_castsi512_si256(wsc[0]),
                                                    _mm512_castsi512_si256(wsc[1]), 0xAA));
            dq = _mm512_cvtph_ps(_mm256_blend_epi32(_mm512_castsi512_si256(wsc[2]),
                                                    _mm512_castsi512_si256(wsc[3]), 0xAA));
        } else {
            IQX_UNROLL for (int r = 0; r < 8; r++)
                rows[r] = _mm512_loadu_si512(x + (size_t)r * bx + (size_t)b * BS);
            nl4_dx(rows, mx, &dp, &dq);
        }
        IQX_UNROLL for (int j = 0; j < C; j++) {
            const __m512 sp = mx ? _mm512_scalef_ps(dy[j], dp) : _mm512_mul_ps(dy[j], dp);
            const __m512 sq = mx ? _mm512_scalef_ps(dy[j], dq) : _mm512_mul_ps(dy[j], dq);
            const __m512 tp = _mm512_mul_ps(sp, _mm512_cvtepi32_ps(pq[j][0]));
            const __m512 tq = _mm512_mul_ps(sq, _mm512_cvtepi32_ps(pq[j][1]));
            const __m512 t01 = _mm512_permutex2var_ps(tp, i01, tq);
            const __m512 t23 = _mm512_permutex2var_ps(tp, i23, tq);
            acc[j] = _mm256_add_ps(acc[j], _mm512_castps512_ps256(t01));
            acc[j] = _mm256_add_ps(acc[j], hi256_ps(t01));
            acc[j] = _mm256_add_ps(acc[j], _mm512_castps512_ps256(t23));
            acc[j] = _mm256_add_ps(acc[j], hi256_ps(t23));
        }
    }
    IQX_UNROLL for (int j = 0; j < C; j++) {
        float *sj = (float *)((char *)s + (size_t)j * bs);
        _mm256_storeu_ps(sj, acc[j]);
        const pg_block_q8_0 *yj = (const pg_block_q8_0 *)((const char *)vy + (size_t)j * by);
        for (int r = 0; r < 8 && nb4 < nb; r++) {
            const char *xr = x + (size_t)r * bx;
            float sum = sj[r];
            for (int64_t b = nb4; b < nb; b++) {
                if (mx) {
                    const pg_block_mxfp4 *xb = (const pg_block_mxfp4 *)xr + b;
                    sum += (h2f(yj[b].d) * pg_e8m0_half(xb->e)) * (float)hsum_epi32(mxfp4_block(xb, &yj[b]));
                } else {
                    const pg_block_iq4_nl *xb = (const pg_block_iq4_nl *)xr + b;
                    sum += (h2f(yj[b].d) * h2f(xb->d)) * (float)hsum_epi32(iq4_nl_block(xb, &yj[b]));
                }
            }
            sj[r] = sum;
        }
    }
}

#define NL4_KERNEL(name, mx, vbmi)                                                              \
    static inline __attribute__((always_inline)) void name##_c(int64_t n, float *s, size_t bs,  \
            const void *vx, size_t bx, const void *vy, size_t by, const int C) {                \
        nl4_rows8_512_c(n, s, bs, vx, bx, vy, by, C, mx, vbmi);                                 \
    }                                                                                           \
    IQX_ROWS8_DISPATCH(name)
NL4_KERNEL(iq4nl_rows8_512, 0, 0)
NL4_KERNEL(mxfp4_rows8_512, 1, 0)
NL4_KERNEL(iq4nl_rows8_vbmi, 0, 1)
NL4_KERNEL(mxfp4_rows8_vbmi, 1, 1)
IQX_GEMM(gemm_iq4_nl_q8_0_512, iq4nl_rows8_512, vec_dot_iq4_nl_q8_0)
IQX_GEMM(gemm_mxfp4_q8_0_512, mxfp4_rows8_512, vec_dot_mxfp4_q8_0)
IQX_GEMM(gemm_iq4_nl_q8_0_vbmi, iq4nl_rows8_vbmi, vec_dot_iq4_nl_q8_0)
IQX_GEMM(gemm_mxfp4_q8_0_vbmi, mxfp4_rows8_vbmi, vec_dot_mxfp4_q8_0)

void pg_fill_iquants_avx512(pg_type_traits *tbl) {
    if (!(pg_g_cpu_features & PG_CPU_AVX512VNNI)) return;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512vbmi")) {
        IQX_SET(tbl, PG_TYPE_IQ4_NL, vec_dot_iq4_nl_q8_0, iq4nl_rows8_vbmi, gemm_iq4_nl_q8_0_vbmi);
        IQX_SET(tbl, PG_TYPE_MXFP4, vec_dot_mxfp4_q8_0, mxfp4_rows8_vbmi, gemm_mxfp4_q8_0_vbmi);
    } else {
        IQX_SET(tbl, PG_TYPE_IQ4_NL, vec_dot_iq4_nl_q8_0, iq4nl_rows8_512, gemm_iq4_nl_q8_0_512);
        IQX_SET(tbl, PG_TYPE_MXFP4, vec_dot_mxfp4_q8_0, mxfp4_rows8_512, gemm_mxfp4_q8_0_512);
    }
    IQX_SET(tbl, PG_TYPE_IQ4_XS, vec_dot_iq4_xs_q8_K, iq4xs_rows8_512, gemm_iq4_xs_q8_K_512);
}
