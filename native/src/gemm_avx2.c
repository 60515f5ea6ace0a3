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
 *   - legacy formats, per 32-element block: 8 weight rows in one register, one int32 lane per
 *     row: w[m] lane i holds elements 4m..4m+3 of row i (a 4 × 4 int32 transpose of the rows'
 *     bytes), and int32 m of an activation row is broadcast to all lanes, so eight VPDPBUSD (or
 *     maddubs, then one madd per four) give the 8 rows' block dots with that activation row in
 *     one register, with no reduction, converted and scaled once. What depends on the
 *     activation rows only (their d, s, and the offset c·Σa of Q4_0 / Q5_0, whose levels are
 *     q − c, or of Q8_0 stored + 128 on the VNNI form) is computed once per call and block
 *     (GA_CHUNK blocks at a time);
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
 * levels are <= 31 (or 15) and at most 8·31·128 = 31744 per word. */
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
/* legacy blocks whose activation-row values are computed together (1.5 KiB on the stack) */
#define GA_CHUNK 16

/* ---- shared pieces --------------------------------------------------------------------------- */

AINL __m256i madd1(__m256i p16) { return _mm256_madd_epi16(p16, _mm256_set1_epi16(1)); }

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

/* ---- legacy formats: the levels of 8 rows, one per int32 lane ------------------------------- */

/* the 4 bytes at p in every int32 lane */
AINL __m256i bcast4(const char *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* v[i] = [row i's int32 q | row i + 4's int32 q] (q = 0..3) -> t[q] = int32 q of rows 0..7 */
AINL void transpose8x4(const __m256i *v, __m256i *t) {
    const __m256i t0 = _mm256_unpacklo_epi32(v[0], v[1]), t1 = _mm256_unpackhi_epi32(v[0], v[1]);
    const __m256i t2 = _mm256_unpacklo_epi32(v[2], v[3]), t3 = _mm256_unpackhi_epi32(v[2], v[3]);
    t[0] = _mm256_unpacklo_epi64(t0, t2);
    t[1] = _mm256_unpackhi_epi64(t0, t2);
    t[2] = _mm256_unpacklo_epi64(t1, t3);
    t[3] = _mm256_unpackhi_epi64(t1, t3);
}

/* Block p[0..7] of 8 weight rows: w[m] lane i = elements 4m..4m+3 of row i. QS, QH (0: none):
 * offsets of qs and qh; Q8: Q8_0 (signed bytes). */
AINL void rows8_levels(const char *const *p, int QS, int QH, int Q8, __m256i *w) {
    __m256i v[4];
    PG_UNROLL for (int i = 0; i < 4; i++) v[i] = load2x16(p[i] + QS, p[i + 4] + QS);
    if (Q8) {
        transpose8x4(v, w);
        PG_UNROLL for (int i = 0; i < 4; i++) v[i] = load2x16(p[i] + QS + 16, p[i + 4] + QS + 16);
        transpose8x4(v, w + 4);
        return;
    }
    __m256i t[4];   /* qs bytes 4q..4q+3: low nibbles elements 4q.., high 16 + 4q.. */
    transpose8x4(v, t);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    PG_UNROLL for (int q = 0; q < 4; q++) {
        w[q] = _mm256_and_si256(t[q], m4);
        w[q + 4] = _mm256_and_si256(_mm256_srli_epi16(t[q], 4), m4);
    }
    if (QH) {   /* bit e of row i's qh -> 0x10 in the byte of element e */
        uint32_t h[8];
        PG_UNROLL for (int i = 0; i < 8; i++) memcpy(&h[i], p[i] + QH, 4);
        const __m256i hv = _mm256_loadu_si256((const __m256i *)h);
        /* bits 4m..4m+3 (in byte m / 2) to bits 4..7 of every byte of lane i: from hv for odd
         * m, from hv << 4 for even m; min(bit, 0x10) is 0x10 where the bit is set */
        const __m256i h4 = _mm256_slli_epi32(hv, 4), b4 = _mm256_set1_epi8(0x10);
        const __m256i bits = _mm256_set1_epi32((int)0x80402010);
        PG_UNROLL for (int m = 0; m < 8; m++) {
            const int k = m / 2;
            const __m256i pick = _mm256_setr_epi8(k, k, k, k, 4 + k, 4 + k, 4 + k, 4 + k, 8 + k,
                                                  8 + k, 8 + k, 8 + k, 12 + k, 12 + k, 12 + k,
                                                  12 + k, k, k, k, k, 4 + k, 4 + k, 4 + k, 4 + k,
                                                  8 + k, 8 + k, 8 + k, 8 + k, 12 + k, 12 + k,
                                                  12 + k, 12 + k);
            const __m256i sel = _mm256_and_si256(_mm256_shuffle_epi8(m % 2 ? hv : h4, pick), bits);
            w[m] = _mm256_or_si256(w[m], _mm256_min_epu8(sel, b4));
        }
    }
}

/* the fp16 at byte o of p[0..7] as floats, lane i = f(p[i] + o) */
AINL __m256 rows8_fp16(const char *const *p, int o) {
    uint16_t h[8];
    PG_UNROLL for (int i = 0; i < 8; i++) memcpy(&h[i], p[i] + o, 2);
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
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
}

void pg_fill_gemm_avx2(pg_type_traits *tbl) { pg_fill_gemm_avx2_for(tbl, pg_g_cpu_features); }
