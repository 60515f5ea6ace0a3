/* Multi-row dot kernels (pg_type_traits.gemm) with AVX2 + FMA + F16C, in two forms: AVX2 only
 * (maddubs + madd: AMD Zen 2/3, Intel before Alder Lake) and AVX-VNNI (VPDPBUSD / VPDPWSSD on
 * ymm: Intel Alder Lake and later, Zen 5), installed when the CPU has it (PYGGML_AVXVNNI=0: not).
 * One body (gemm_avx2_body.h) compiled for both.
 *
 * Every dot has the bits of the vec_dot of its two rows (which are the scalar reference's,
 * quants_legacy_x86.h, quants_kquants_avx2.c): the same exact integer block sums, then the
 * block's fp32 term in the reference's operations, added to the dot's running sum in block
 * order. The fp32 work is elementwise over dots (a lane per dot), so a token's result never
 * depends on the batch it is computed in.
 *
 * A call computes up to 8 × 8 dots; the weights are decoded once for all its activation rows.
 *   - legacy formats, per 32-element block: a group of 4 weight rows in one register, 8 bytes
 *     per row and 64-bit lane ([row 0 | row 2 || row 1 | row 3]): w[q] holds elements 8q..8q+7
 *     of each row, and 8 bytes of an activation row are broadcast to the four lanes, so four
 *     VPDPBUSD (or maddubs, then one madd) leave each row's dot with that activation row in two
 *     int32 of its lane; one hadd per two activation rows gives 8 dots ((row, act) for 4 rows
 *     × 2 activation rows) in one register, converted and scaled once. What depends on the
 *     activation rows only (their d, s, and the offset c·Σa of Q4_0 / Q5_0, whose levels are
 *     q − c, or of Q8_0 stored + 128 on the VNNI form) is computed once per call and block
 *     (GA_CHUNK blocks at a time) for both groups of 4 rows;
 *   - K-quants, per super-block, the AVX-512 kernels' layout at half the width (gemm_avx512.c):
 *     a pair of weight rows shares each register, one 128-bit lane per row; slice by slice (16
 *     elements) the pair's levels, one maddubs per activation row with its 16 bytes broadcast
 *     to both lanes, then the slice's scale (an int16 per lane: per row) by madd (or VPDPWSSD);
 *     Q4_K / Q5_K add the maddubs of the two slices of a 32-element sub-block first (one
 *     scale). Mins (or the −4 / −32 offsets) through madd of the rows' int16 mins / scales with
 *     the activation rows' bsums; per super-block a 4 × 4 transpose-add of four activation
 *     rows' vectors leaves [row 2g: act 0..3 | row 2g + 1: act 0..3] in one register. Each pair
 *     against all 8 activation rows, pair after pair.
 * maddubs never saturates: unsigned levels <= 63 (or |q| <= 128 with |a| <= 127) times
 * activations in −128..127, two products per int16; where maddubs words are added first, the
 * levels are <= 31 and a word is at most 8·31·128 = 31744.
 * (Measured alternatives, in-cache: 8 rows in int32 lanes with no reduction was as fast at 64
 * activation rows of 2048 elements but 15–25% slower at 512 rows of 640; per-row-pair legacy
 * blocks with a transpose-add per block 20% slower; K-quant accumulators kept to 4 per pass
 * (fewer spills) 3% slower.) */
#include <immintrin.h>
#include <string.h>

#include "gemm.h"
#include "kquants.h"
#include "kquants_x86.h"
#include "pg_internal.h"
#include "quants.h"
#include "quants_legacy.h"

#define AINL static inline __attribute__((always_inline))
#define PG_UNROLL _Pragma("GCC unroll 16")
/* legacy blocks whose activation-row values are computed together (6 KiB on the stack) */
#define GA_CHUNK 16

/* ---- shared pieces --------------------------------------------------------------------------- */

AINL __m256i madd1(__m256i p16) { return _mm256_madd_epi16(p16, _mm256_set1_epi16(1)); }

/* The fp16 at p0..p3, twice: [f0 f1 f2 f3 | f0 f1 f2 f3] (hi = 0: upper half zero). */
AINL __m256 fp16x4x2(const void *p0, const void *p1, const void *p2, const void *p3, int hi) {
    uint16_t h[4];
    memcpy(&h[0], p0, 2);
    memcpy(&h[1], p1, 2);
    memcpy(&h[2], p2, 2);
    memcpy(&h[3], p3, 2);
    uint64_t u;
    memcpy(&u, h, 8);
    const __m128i v = _mm_cvtsi64_si128((long long)u);
    return _mm256_cvtph_ps(hi ? _mm_unpacklo_epi64(v, v) : v);
}

/* [a × 4 | b × 4] */
AINL __m256 pair_ps(float a, float b) { return _mm256_set_m128(_mm_set1_ps(b), _mm_set1_ps(a)); }

AINL float fp16_at(const char *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return h2f(h);
}

/* [the 16 bytes at p0 | the 16 bytes at p1] */
AINL __m256i load2x16(const char *p0, const char *p1) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)p0)),
                                   _mm_loadu_si128((const __m128i *)p1), 1);
}

/* the 16 bytes at p in both lanes */
AINL __m256i bcast16(const void *p) {
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
}

/* [Σ p0, Σ p1, Σ p2, Σ p3] within each 128-bit lane (lane h holds row h's partial sums) */
AINL __m256i tadd4(__m256i p0, __m256i p1, __m256i p2, __m256i p3) {
    const __m256i t01 = _mm256_add_epi32(_mm256_unpacklo_epi32(p0, p1),
                                         _mm256_unpackhi_epi32(p0, p1));
    const __m256i t23 = _mm256_add_epi32(_mm256_unpacklo_epi32(p2, p3),
                                         _mm256_unpackhi_epi32(p2, p3));
    return _mm256_add_epi32(_mm256_unpacklo_epi64(t01, t23), _mm256_unpackhi_epi64(t01, t23));
}

/* Row pointers of a call: rows past nr (nc) repeat the first one. */
AINL void rows_of(const void *vx, size_t bx, const void *vy, size_t by, int nr, int nc,
                  const char **x, const char **y) {
    for (int i = 0; i < PG_GEMM_MAX_NR; i++)
        x[i] = (const char *)vx + (i < nr ? (size_t)i * bx : 0);
    for (int j = 0; j < PG_GEMM_MAX_NC; j++)
        y[j] = (const char *)vy + (j < nc ? (size_t)j * by : 0);
}

/* acc[g][h] lane 4k + j = dot (weight row 2g + k, activation row 4h + j) -> s */
AINL void store_pairs(float *s, size_t bs, const __m256 acc[PG_GEMM_MAX_NR / 2][2], int nr,
                      int nc) {
    float v[PG_GEMM_MAX_NR / 2][2][8];
    for (int g = 0; g < (nr + 1) / 2; g++)
        for (int h = 0; h < 2; h++) _mm256_storeu_ps(v[g][h], acc[g][h]);
    for (int j = 0; j < nc; j++) {
        float *d = (float *)((char *)s + (size_t)j * bs);
        for (int i = 0; i < nr; i++) d[i] = v[i / 2][j / 4][4 * (i % 2) + j % 4];
    }
}

/* ---- legacy formats: the levels of a group of 4 rows ---------------------------------------- */

/* the 8 bytes at p in every 64-bit lane */
AINL __m256i bcast8(const char *p) {
    int64_t v;
    memcpy(&v, p, 8);
    return _mm256_set1_epi64x(v);
}

/* Block p[0..3] of 4 weight rows: w[q] = elements 8q..8q+7 of the rows, in the 64-bit lanes
 * [row 0 | row 2 || row 1 | row 3]. QS, QH (0: none): offsets of qs and qh; Q8: Q8_0 (signed). */
AINL void grp4_levels(const char *const *p, int QS, int QH, int Q8, __m256i *w) {
    if (Q8) {
        const __m256i a0 = load2x16(p[0] + QS, p[1] + QS), b0 = load2x16(p[2] + QS, p[3] + QS);
        const __m256i a1 = load2x16(p[0] + QS + 16, p[1] + QS + 16);
        const __m256i b1 = load2x16(p[2] + QS + 16, p[3] + QS + 16);
        w[0] = _mm256_unpacklo_epi64(a0, b0);
        w[1] = _mm256_unpackhi_epi64(a0, b0);
        w[2] = _mm256_unpacklo_epi64(a1, b1);
        w[3] = _mm256_unpackhi_epi64(a1, b1);
        return;
    }
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i a = load2x16(p[0] + QS, p[1] + QS), b = load2x16(p[2] + QS, p[3] + QS);
    const __m256i lo = _mm256_unpacklo_epi64(a, b), hi = _mm256_unpackhi_epi64(a, b);
    w[0] = _mm256_and_si256(lo, m4);                          /* low nibbles: elements 0..15 */
    w[1] = _mm256_and_si256(hi, m4);
    w[2] = _mm256_and_si256(_mm256_srli_epi16(lo, 4), m4);    /* high: 16..31 */
    w[3] = _mm256_and_si256(_mm256_srli_epi16(hi, 4), m4);
    if (QH) {   /* bit e of a row's qh -> 0x10 in the byte of element e */
        uint32_t h[4];
        PG_UNROLL for (int i = 0; i < 4; i++) memcpy(&h[i], p[i] + QH, 4);
        const __m256i v = _mm256_setr_epi32((int)h[0], (int)h[2], 0, 0, (int)h[1], (int)h[3], 0, 0);
        const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
        const __m256i b4 = _mm256_set1_epi8(0x10);
        PG_UNROLL for (int q = 0; q < 4; q++) {   /* byte q of each row's qh, 8 times */
            const __m256i pick = _mm256_setr_epi8(q, q, q, q, q, q, q, q, 4 + q, 4 + q, 4 + q,
                                                  4 + q, 4 + q, 4 + q, 4 + q, 4 + q, q, q, q, q,
                                                  q, q, q, q, 4 + q, 4 + q, 4 + q, 4 + q, 4 + q,
                                                  4 + q, 4 + q, 4 + q);
            const __m256i sel = _mm256_and_si256(_mm256_shuffle_epi8(v, pick), bit);
            w[q] = _mm256_or_si256(w[q], _mm256_and_si256(_mm256_cmpeq_epi8(sel, bit), b4));
        }
    }
}

/* the fp16 at p0..p3 as floats in the dots' layout, [f0 f2 f0 f2 | f1 f3 f1 f3] */
AINL __m256 grp4_fp16(const char *p0, const char *p1, const char *p2, const char *p3) {
    const __m256 f = fp16x4x2(p0, p1, p2, p3, 0);
    return _mm256_permutevar8x32_ps(f, _mm256_setr_epi32(0, 2, 0, 2, 1, 3, 1, 3));
}

/* acc[g][v]: the dots of weight rows 4g..4g+3 and activation rows 2v, 2v + 1, lanes [(0, 2v)
 * (2, 2v) (0, 2v+1) (2, 2v+1) | (1, 2v) (3, 2v) (1, 2v+1) (3, 2v+1)] (row in the group, act) */
AINL void store_grp4(float *s, size_t bs, const __m256 acc[PG_GEMM_MAX_NR / 4][4], int nr,
                     int nc) {
    static const int lane_of_row[4] = {0, 4, 1, 5};
    float v[PG_GEMM_MAX_NR / 4][4][8];
    for (int g = 0; g < (nr + 3) / 4; g++)
        for (int k = 0; k < (nc + 1) / 2; k++) _mm256_storeu_ps(v[g][k], acc[g][k]);
    for (int j = 0; j < nc; j++) {
        float *d = (float *)((char *)s + (size_t)j * bs);
        for (int i = 0; i < nr; i++) d[i] = v[i / 4][j / 2][lane_of_row[i % 4] + 2 * (j % 2)];
    }
}

/* ---- K-quants: a row pair's super-block ------------------------------------------------------ */

/* Scales of one super-block of a row pair: sc[t] the int16 scale of slice t (Q4_K / Q5_K: of
 * sub-block t), one per lane (row); w16lo / w16hi the int16 weights of bsums 0..7 / 8..15 (mins
 * of pairs, or the scales of the offset formats); d, dmin as [row 2g × 4 | row 2g + 1 × 4]. */
typedef struct {
    __m256i sc[16], w16lo, w16hi;
    __m256 d, dmin;
} kpair;

/* every 16-bit word of a 128-bit lane = byte k of that lane, zero-extended */
AINL __m256i bcast_byte16(__m256i v, int k) {
    return _mm256_shuffle_epi8(v, _mm256_set1_epi16((short)(0x8000 | k)));
}
/* every 16-bit word of a 128-bit lane = word k of that lane */
AINL __m256i bcast_word16(__m256i v, int k) {
    return _mm256_shuffle_epi8(v, _mm256_set1_epi16((short)((2 * k + 1) << 8 | 2 * k)));
}
/* [row 2g bytes 0..7 | row 2g + 1 bytes 0..7] (lo) and bytes 8..15 (hi) widened to int16 */
AINL void widen2(__m256i v, int is_signed, __m256i *lo, __m256i *hi) {
    const __m256i t = _mm256_permute4x64_epi64(v, _MM_SHUFFLE(3, 1, 2, 0));
    *lo = is_signed ? _mm256_cvtepi8_epi16(_mm256_castsi256_si128(t))
                    : _mm256_cvtepu8_epi16(_mm256_castsi256_si128(t));
    *hi = is_signed ? _mm256_cvtepi8_epi16(_mm256_extracti128_si256(t, 1))
                    : _mm256_cvtepu8_epi16(_mm256_extracti128_si256(t, 1));
}

AINL size_t kblock_bytes(int type) {
    return type == 2 ? sizeof(pg_block_q2_K) : type == 3 ? sizeof(pg_block_q3_K)
         : type == 4 ? sizeof(pg_block_q4_K) : type == 5 ? sizeof(pg_block_q5_K)
                     : sizeof(pg_block_q6_K);
}

/* the 16 bytes at byte o of block b of rows x0 and x1 */
#define KP_LOAD2(o) load2x16(x0 + b * kblock_bytes(type) + (o), x1 + b * kblock_bytes(type) + (o))

AINL void kpair_decode(const char *x0, const char *x1, int64_t b, const int type, kpair *k) {
    const char *p0 = x0 + b * kblock_bytes(type), *p1 = x1 + b * kblock_bytes(type);
    const __m256i m4 = _mm256_set1_epi8(0xF);
    if (type == 4 || type == 5) {
        /* [sc0..7 m0..7] of each row (k4_scales reads 16 bytes from the scales: inside) */
        const __m256i sm = _mm256_set_m128i(k4_scales((const uint8_t *)p1 + 4),
                                            k4_scales((const uint8_t *)p0 + 4));
        PG_UNROLL for (int j = 0; j < 8; j++) k->sc[j] = bcast_byte16(sm, j);
        /* words m0 m0 m1 m1 m2 m2 m3 m3 and m4 m4 .. m7 m7: with bsums 0..7 / 8..15 in madd */
        const __m128i lo = _mm_setr_epi32((int)0x80088008, (int)0x80098009, (int)0x800a800a,
                                          (int)0x800b800b);
        const __m128i hi = _mm_setr_epi32((int)0x800c800c, (int)0x800d800d, (int)0x800e800e,
                                          (int)0x800f800f);
        k->w16lo = _mm256_shuffle_epi8(sm, _mm256_set_m128i(lo, lo));
        k->w16hi = _mm256_shuffle_epi8(sm, _mm256_set_m128i(hi, hi));
        k->d = pair_ps(fp16_at(p0), fp16_at(p1));
        k->dmin = pair_ps(fp16_at(p0 + 2), fp16_at(p1 + 2));
    } else if (type == 6) {
        widen2(load2x16(p0 + 192, p1 + 192), 1, &k->w16lo, &k->w16hi);
        PG_UNROLL for (int j = 0; j < 8; j++) {
            k->sc[j] = bcast_word16(k->w16lo, j);
            k->sc[8 + j] = bcast_word16(k->w16hi, j);
        }
        k->d = pair_ps(fp16_at(p0 + 208), fp16_at(p1 + 208));
        k->dmin = _mm256_setzero_ps();
    } else if (type == 2) {
        const __m256i sb = load2x16(p0, p1);   /* scale | min << 4, per 16 elements */
        const __m256i sc = _mm256_and_si256(sb, m4);
        PG_UNROLL for (int j = 0; j < 16; j++) k->sc[j] = bcast_byte16(sc, j);
        widen2(_mm256_and_si256(_mm256_srli_epi16(sb, 4), m4), 0, &k->w16lo, &k->w16hi);
        k->d = pair_ps(fp16_at(p0 + 80), fp16_at(p1 + 80));
        k->dmin = pair_ps(fp16_at(p0 + 82), fp16_at(p1 + 82));
    } else {
        /* k3_scales reads the 16 bytes before the block's d (scales at 96..107): inside */
        widen2(_mm256_set_m128i(k3_scales((const uint8_t *)p1 + 94),
                                k3_scales((const uint8_t *)p0 + 94)),
               1, &k->w16lo, &k->w16hi);
        PG_UNROLL for (int j = 0; j < 8; j++) {
            k->sc[j] = bcast_word16(k->w16lo, j);
            k->sc[8 + j] = bcast_word16(k->w16hi, j);
        }
        k->d = pair_ps(fp16_at(p0 + 108), fp16_at(p1 + 108));
        k->dmin = _mm256_setzero_ps();
    }
}

/* bit `bit` of each byte of v moved to bit `to` (other bits: garbage, to be masked; the shift is
 * inside each byte for bit, to <= 7) */
AINL __m256i bit_to(__m256i v, int bit, int to) {
    return bit >= to ? _mm256_srli_epi16(v, bit - to) : _mm256_slli_epi16(v, to - bit);
}

/* The levels of slice t (elements 16t..16t+15) of super-block b: [row 2g | row 2g + 1]. */
AINL __m256i kpair_slice(const char *x0, const char *x1, int64_t b, const int type, int t) {
    const __m256i m4 = _mm256_set1_epi8(0xF);
    if (type == 2 || type == 3) {   /* element 128h + 32j + 16v + l: bits 2j of qs[32h + 16v + l] */
        const int h = t / 8, j = (t / 2) % 4, v = t % 2;
        const __m256i z = KP_LOAD2((type == 2 ? 16 : 32) + 32 * h + 16 * v);
        const __m256i q = _mm256_and_si256(_mm256_srli_epi16(z, 2 * j), _mm256_set1_epi8(3));
        if (type == 2) return q;
        /* Q3_K: + 4 where hmask[16v + l] has bit 4h + j (levels 0..7, offset −4) */
        const __m256i hm = KP_LOAD2(16 * v);
        return _mm256_or_si256(q, _mm256_and_si256(bit_to(hm, 4 * h + j, 2),
                                                   _mm256_set1_epi8(4)));
    }
    if (type == 6) {   /* element 128h + 32g + 16v + l */
        const int h = t / 8, g = (t / 2) % 4, v = t % 2;
        const __m256i l = KP_LOAD2(64 * h + 32 * (g & 1) + 16 * v);
        const __m256i qh = KP_LOAD2(128 + 32 * h + 16 * v);
        const __m256i lo = g < 2 ? _mm256_and_si256(l, m4)
                                 : _mm256_and_si256(_mm256_srli_epi16(l, 4), m4);
        return _mm256_or_si256(lo, _mm256_and_si256(bit_to(qh, 2 * g, 4), _mm256_set1_epi8(0x30)));
    }
    /* Q4_K / Q5_K: element 64c + 32u + 16v + l: nibble u of qs[32c + 16v + l] */
    const int c = t / 4, u = (t / 2) % 2, v = t % 2;
    const __m256i z = KP_LOAD2((type == 4 ? 16 : 48) + 32 * c + 16 * v);
    const __m256i lv = u ? _mm256_and_si256(_mm256_srli_epi16(z, 4), m4) : _mm256_and_si256(z, m4);
    if (type == 4) return lv;
    const __m256i qh = KP_LOAD2(16 + 16 * v);   /* 5th bit: bit 2c + u of qh[16v + l] */
    return _mm256_or_si256(lv, _mm256_and_si256(bit_to(qh, 2 * c + u, 4), _mm256_set1_epi8(0x10)));
}

/* ---- the two forms --------------------------------------------------------------------------- */

#define GA_VNNI 0
#define GA_FN(name) name##_avx2
#include "gemm_avx2_body.h"
#undef GA_VNNI
#undef GA_FN

#pragma GCC push_options
#pragma GCC target("avxvnni")
#define GA_VNNI 1
#define GA_FN(name) name##_avxvnni
#include "gemm_avx2_body.h"
#undef GA_VNNI
#undef GA_FN
#pragma GCC pop_options

/* ---- table ------------------------------------------------------------------------------- */

void pg_fill_gemm_avx2_for(pg_type_traits *tbl, uint32_t features) {
    for (int t = 0; t < PG_TYPE_COUNT; t++) tbl[t].gemm = NULL;
    if (features & PG_CPU_AVXVNNI) fill_avxvnni(tbl);
    else fill_avx2(tbl);
    pg_fill_gemm_tile_avx2(tbl);
}

void pg_fill_gemm_avx2(pg_type_traits *tbl) { pg_fill_gemm_avx2_for(tbl, pg_g_cpu_features); }
