/* IQ2_XXS, IQ2_XS, IQ3_XXS, IQ3_S · Q8_K: the eight-row decode kernels (vec_dot8, and the
 * gemm over them) on 512-bit rows with the codebooks in registers, for CPUs with AVX512-VBMI and
 * AVX512-VNNI (besides the path's F/BW/VL; checked at fill time); elsewhere, and for the one-row
 * vec_dot, the avx512 path keeps the AVX2 kernels (quants_iq_grid_avx2.c). The scalar kernels'
 * bits, as on every path.
 *
 * Why registers: a codebook entry is 8 (IQ2) or 4 (IQ3) magnitudes out of 3 (IQ2: 8, 25, 43) or
 * 8 (IQ3) levels, so it packs into 16 bits of 2- or 3-bit level codes and a 256-entry codebook
 * is 512 bytes: 8 zmm (IQ2_XS, IQ3_S: 16, partly from memory), looked up 32 entries at once, 64 per VPERMT2W (the index's low 6 bits),
 * the quarter chosen by the index's high bits with bit selects. VPMULTISHIFTQB then moves one
 * weight's code to bits 0.. of its byte and its sign bit to bit 6, and VPERMI2B maps that byte
 * to the signed level. The AVX2 kernels load each entry with a scalar load and insert it (what
 * ggml's kernels do too): ~45 instructions per 32 weights; here ~75 per 256.
 *
 * Layout: 64 weights per register, qword k = 8 weights of sub-block k, so that the 2s+1 of a
 * dword lane is the same in all four registers of a block (one VPMULLD after the VPDPBUSDs;
 * IQ2_XS, with a scale per 16 weights: two). The activations are regrouped to that order once
 * per block for the eight rows, as |a| (u8: |-128| = 128 exact) and a's sign bit (XORed into
 * the weight's sign bit before the level lookup):
 *     Σ ±g·a = Σ |a| · (g with the sign of the product)    (VPDPBUSD: exact)
 * The lanes' total is the scalar kernel's T exactly; the block term (d·d_y)·T, the block order
 * and the final power of two are the scalar kernel's (the fold and fp32 steps of iq_x86.h).
 * No mask registers in the loop: on Zen 4 each write of one costs ~1.7 cycles. IQ2_S (1024
 * entries: 16 VPERMT2W and 15 selects per 32 entries) was no faster than its AVX2 kernel this
 * way and keeps it. */
#include <immintrin.h>
#include <string.h>

#include "iq_blocks.h"
#include "iq_grids.h"
#include "iq_x86.h"
#include "kquants.h"
#include "quants.h"

#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")

/* ---- tables (filled once by pg_fill_iq_grid_avx512) ------------------------------------------ */

/* packed codebooks: entry i as 2-bit (IQ2) or 3-bit (IQ3) level codes, element j at bit 2j / 3j */
static uint16_t k_iq2xxs_code[256] __attribute__((aligned(64)));
static uint16_t k_iq2xs_code[512] __attribute__((aligned(64)));
static uint16_t k_iq3xxs_code[256] __attribute__((aligned(64)));
static uint16_t k_iq3s_code[512] __attribute__((aligned(64)));
/* signed level of an index byte (VPERMI2B: its low 7 bits): code at bits 0..1 (IQ3: 0..2), the
 * sign at bit 6, bits 2..5 (3..5) whatever the neighbouring codes left there */
static int8_t k_lvl2s[128] __attribute__((aligned(64)));
static int8_t k_lvl3xxs[128] __attribute__((aligned(64)));
static int8_t k_lvl3s[128] __attribute__((aligned(64)));
static uint8_t k_ksigns[128] __attribute__((aligned(64)));

/* VPMULTISHIFTQB controls: k_code2[m] moves element j of word m of each qword (2-bit codes) to
 * byte j; k_code3[m] element j % 4 of word 2m' + j / 4 (3-bit codes, m' = m % 2); k_sign8[m]
 * bit 8m + j to bit 6 of byte j, k_sign16[m] bit 16m + j; k_fields (IQ2_XXS) the four 7-bit
 * sign fields at bit 32 of each qword, k_fields0 (IQ3_XXS) at bit 0 */
static uint8_t k_code2[4][64] __attribute__((aligned(64)));
static uint8_t k_code3[4][64] __attribute__((aligned(64)));
static uint8_t k_sign8[4][64] __attribute__((aligned(64)));
static uint8_t k_sign16[4][64] __attribute__((aligned(64)));
static uint8_t k_fields32[64] __attribute__((aligned(64)));
static uint8_t k_fields0[64] __attribute__((aligned(64)));
/* VPERMB controls to words (high bytes zeroed by the mask): index byte of entry (k, e) of
 * qs (sub-block k's bytes at 8k) to word 4k + e: IQ2_XXS e < 4 (bytes 8k + e), IQ3 e = 0..3
 * and 4..7 */
static uint8_t k_pick_lo[64] __attribute__((aligned(64)));
static uint8_t k_pick_hi[64] __attribute__((aligned(64)));
/* IQ3_S: word 4k + e (lo) / 4k + e - 4 (hi) takes qh byte k; shifted left by 8 - e: bit e → 8 */
static uint8_t k_pick_qh[64] __attribute__((aligned(64)));
static uint16_t k_qh_shl_lo[32] __attribute__((aligned(64)));
static uint16_t k_qh_shl_hi[32] __attribute__((aligned(64)));

static int pack_codes(const uint8_t *bytes, int per, const uint8_t *lv, int nlv, int bits) {
    int code = 0;
    for (int j = 0; j < per; j++) {
        int c = 0;
        while (c < nlv && lv[c] != bytes[j]) c++;
        if (c == nlv) return -1;
        code |= c << (bits * j);
    }
    return code;
}

static int pack_grid(const void *grid, int n, int per, const uint8_t *lv, int nlv, int bits,
                     uint16_t *out) {
    for (int i = 0; i < n; i++) {
        uint8_t b[8];
        memcpy(b, (const uint8_t *)grid + (size_t)i * per, (size_t)per);
        const int c = pack_codes(b, per, lv, nlv, bits);
        if (c < 0) return 0;
        out[i] = (uint16_t)c;
    }
    return 1;
}

static int fill_tables(void) {
    static const uint8_t lv2[3] = {8, 25, 43};
    static const uint8_t lv3xxs[8] = {4, 12, 20, 28, 36, 44, 52, 62};
    static const uint8_t lv3s[8] = {1, 3, 5, 7, 9, 11, 13, 15};
    /* the codebooks' values are these levels (checked here: else the avx512 path keeps AVX2) */
    if (!pack_grid(pg_iq2xxs_grid, 256, 8, lv2, 3, 2, k_iq2xxs_code) ||
        !pack_grid(pg_iq2xs_grid, 512, 8, lv2, 3, 2, k_iq2xs_code) ||
        !pack_grid(pg_iq3xxs_grid, 256, 4, lv3xxs, 8, 3, k_iq3xxs_code) ||
        !pack_grid(pg_iq3s_grid, 512, 4, lv3s, 8, 3, k_iq3s_code))
        return 0;
    for (int i = 0; i < 128; i++) {
        const int neg = i & 64;
        k_lvl2s[i] = (int8_t)((i & 3) == 3 ? 0 : neg ? -lv2[i & 3] : lv2[i & 3]);
        k_lvl3xxs[i] = (int8_t)(neg ? -lv3xxs[i & 7] : lv3xxs[i & 7]);
        k_lvl3s[i] = (int8_t)(neg ? -lv3s[i & 7] : lv3s[i & 7]);
    }
    memcpy(k_ksigns, pg_ksigns_iq2xs, 128);
    for (int q = 0; q < 8; q++)
        for (int j = 0; j < 8; j++) {
            const int b = 8 * q + j;
            k_fields32[b] = (uint8_t)(32 + 7 * (j & 3));
            k_fields0[b] = (uint8_t)(7 * (j & 3));
            for (int m = 0; m < 4; m++) {
                k_code2[m][b] = (uint8_t)(16 * m + 2 * j);
                k_code3[m][b] = (uint8_t)(16 * (2 * (m % 2) + j / 4) + 3 * (j % 4));
                k_sign8[m][b] = (uint8_t)((8 * m + j - 6) & 63);
                k_sign16[m][b] = (uint8_t)((16 * m + j - 6) & 63);
            }
        }
    for (int w = 0; w < 32; w++) {
        const int k = w / 4, e = w % 4;
        k_pick_lo[2 * w] = (uint8_t)(8 * k + e);
        k_pick_hi[2 * w] = (uint8_t)(8 * k + e + 4);
        k_pick_lo[2 * w + 1] = k_pick_hi[2 * w + 1] = 0;
        k_pick_qh[2 * w] = (uint8_t)k;
        k_pick_qh[2 * w + 1] = 0;
        k_qh_shl_lo[w] = (uint16_t)(8 - e);
        k_qh_shl_hi[w] = (uint16_t)(8 - (e + 4));
    }
    return 1;
}

/* ---- shared pieces ----------------------------------------------------------------------------- */

#define LD(p) _mm512_load_si512((const void *)(p))

static inline __m256i half_sum512(__m512i v) {
    return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

/* all-ones words where bit `bit` of the word is set */
#define WORD_BIT(v, bit) _mm512_srai_epi16(_mm512_slli_epi16(v, 15 - (bit)), 15)
/* imm 0xCA: A ? B : C bitwise */
#define SELECT(m, a, b) _mm512_ternarylogic_epi32(m, a, b, 0xCA)

/* 16-bit codes of 32 entries: idx = 32 word indices into the 256-entry table T (8 zmm, 64
 * entries per VPERMT2W), the quarter chosen by the index's bits 6 and 7 through bit selects (no
 * mask registers: on Zen 4 each write of one costs ~1.7 cycles) */
static inline __m512i lookup256(__m512i idx, const uint16_t *T) {
    const __m512i c0 = _mm512_permutex2var_epi16(LD(T), idx, LD(T + 32));
    const __m512i c1 = _mm512_permutex2var_epi16(LD(T + 64), idx, LD(T + 96));
    const __m512i c2 = _mm512_permutex2var_epi16(LD(T + 128), idx, LD(T + 160));
    const __m512i c3 = _mm512_permutex2var_epi16(LD(T + 192), idx, LD(T + 224));
    const __m512i b6 = WORD_BIT(idx, 6), b7 = WORD_BIT(idx, 7);
    return SELECT(b7, SELECT(b6, c3, c2), SELECT(b6, c1, c0));
}

static inline __m512i lookup512(__m512i idx, const uint16_t *T) {
    return SELECT(WORD_BIT(idx, 8), lookup256(idx, T + 256), lookup256(idx, T));
}

/* One decoded 256-weight block: vector m (64 weights), qword k = weights 32k + 8m .. + 7 (of
 * sub-block k; the activations are regrouped to match once per block). ix[m] bytes: the level
 * code at bits 0..1 (IQ3: 0..2) and the weight's sign at bit 6 (the signed-level table repeats
 * over the other bits); sc[h]: 2s+1 of the scale group of qword k in both its dwords, h = 0 for
 * m = 0, 1 and h = 1 for m = 2, 3 (the same unless the type has a scale per 16 weights). */
typedef struct {
    __m512i ix[4], sc[2];
} zblock;

/* ix for vector m: CODE's element moved to bits 0.. by the code control, SIGNS' bit to bit 6 */
static inline __m512i zix(__m512i code, const uint8_t *code_ctl, __m512i sgn, const uint8_t *sgn_ctl) {
    return SELECT(_mm512_set1_epi8(0x40), _mm512_multishift_epi64_epi8(LD(sgn_ctl), sgn),
                  _mm512_multishift_epi64_epi8(LD(code_ctl), code));
}

/* 2s+1 (s: 4 bits of v at `shift`) in both dwords of each qword */
static inline __m512i zscale(__m512i v, int shift) {
    const __m512i s = _mm512_and_si512(_mm512_srli_epi64(v, shift), _mm512_set1_epi64(15));
    const __m512i t = _mm512_or_si512(_mm512_add_epi64(s, s), _mm512_set1_epi64(1));
    return _mm512_or_si512(t, _mm512_slli_epi64(t, 32));
}

/* ---- the five types ----------------------------------------------------------------------------
 * IQ2_XXS qs: per sub-block k, 4 index bytes then a uint32 aux: four 7-bit sign fields (bit 7f;
 *         the eighth sign is the parity: ggml's ksigns table) and the scale at bit 28 */
static inline __attribute__((always_inline)) void decode_iq2_xxs(const pg_block_iq2_xxs *x, zblock *z) {
    const __m512i q = _mm512_loadu_si512(x->qs);
    const __m512i idx = _mm512_maskz_permutexvar_epi8(0x5555555555555555ull, LD(k_pick_lo), q);
    const __m512i code = lookup256(idx, k_iq2xxs_code);
    const __m512i sgn = _mm512_permutex2var_epi8(
        LD(k_ksigns), _mm512_multishift_epi64_epi8(LD(k_fields32), q), LD(k_ksigns + 64));
    z->sc[0] = z->sc[1] = zscale(q, 60);
    IQX_UNROLL for (int m = 0; m < 4; m++) z->ix[m] = zix(code, k_code2[m], sgn, k_sign8[m]);
}

/* IQ2_XS qs: uint16 per entry: index (9 bits), sign field (7 bits); scales: two nibbles per
 *         sub-block (elements 0..15, 16..31) */
static inline __attribute__((always_inline)) void decode_iq2_xs(const pg_block_iq2_xs *x, zblock *z) {
    const __m512i q = _mm512_loadu_si512(x->qs);
    const __m512i code = lookup512(_mm512_and_si512(q, _mm512_set1_epi16(511)), k_iq2xs_code);
    const __m512i sgn = _mm512_permutex2var_epi8(LD(k_ksigns), _mm512_srli_epi16(q, 9),
                                                 LD(k_ksigns + 64));
    const __m512i sc = _mm512_cvtepu8_epi64(_mm_loadl_epi64((const __m128i *)x->scales));
    z->sc[0] = zscale(sc, 0);
    z->sc[1] = zscale(sc, 4);
    IQX_UNROLL for (int m = 0; m < 4; m++) z->ix[m] = zix(code, k_code2[m], sgn, k_sign16[m]);
}

/* IQ3_XXS qs: 64 index bytes (8 per sub-block), then a uint32 aux per sub-block as IQ2_XXS's
 *         (a sign field per 8 elements, scale at bit 28) */
static inline __attribute__((always_inline)) void decode_iq3_xxs(const pg_block_iq3_xxs *x, zblock *z) {
    const __m512i q = _mm512_loadu_si512(x->qs);
    const __m512i lo = lookup256(_mm512_maskz_permutexvar_epi8(0x5555555555555555ull, LD(k_pick_lo), q),
                                 k_iq3xxs_code);
    const __m512i hi = lookup256(_mm512_maskz_permutexvar_epi8(0x5555555555555555ull, LD(k_pick_hi), q),
                                 k_iq3xxs_code);
    const __m512i aux = _mm512_cvtepu32_epi64(_mm256_loadu_si256((const __m256i *)(x->qs + 64)));
    const __m512i sgn = _mm512_permutex2var_epi8(
        LD(k_ksigns), _mm512_multishift_epi64_epi8(LD(k_fields0), aux), LD(k_ksigns + 64));
    z->sc[0] = z->sc[1] = zscale(aux, 28);
    IQX_UNROLL for (int m = 0; m < 4; m++)
        z->ix[m] = zix(m < 2 ? lo : hi, k_code3[m], sgn, k_sign8[m]);
}

/* IQ3_S qs: 64 index bytes, qh: their 9th bits (bit e of byte k: entry e of sub-block k), signs:
 *         a byte per 8 elements, scales: a nibble per sub-block */
static inline __attribute__((always_inline)) void decode_iq3_s(const pg_block_iq3_s *x, zblock *z) {
    const __m512i q = _mm512_loadu_si512(x->qs);
    const __m512i qh = _mm512_maskz_permutexvar_epi8(
        0x5555555555555555ull, LD(k_pick_qh),
        _mm512_castsi128_si512(_mm_loadl_epi64((const __m128i *)x->qh)));
    const __m512i b8 = _mm512_set1_epi16(256);
    const __m512i ilo = _mm512_ternarylogic_epi32(
        _mm512_maskz_permutexvar_epi8(0x5555555555555555ull, LD(k_pick_lo), q),
        _mm512_sllv_epi16(qh, LD(k_qh_shl_lo)), b8, 0xF8);   /* A | (B & C) */
    const __m512i ihi = _mm512_ternarylogic_epi32(
        _mm512_maskz_permutexvar_epi8(0x5555555555555555ull, LD(k_pick_hi), q),
        _mm512_sllv_epi16(qh, LD(k_qh_shl_hi)), b8, 0xF8);
    const __m512i lo = lookup512(ilo, k_iq3s_code), hi = lookup512(ihi, k_iq3s_code);
    const __m512i sgn = _mm512_cvtepu32_epi64(_mm256_loadu_si256((const __m256i *)x->signs));
    uint32_t sc4;
    memcpy(&sc4, x->scales, 4);
    /* qword k: the scale byte of sub-block k shifted so that its nibble is at bit 0 */
    const __m512i sv = _mm512_srlv_epi64(_mm512_set1_epi64(sc4),
                                         _mm512_setr_epi64(0, 4, 8, 12, 16, 20, 24, 28));
    z->sc[0] = z->sc[1] = zscale(sv, 0);
    IQX_UNROLL for (int m = 0; m < 4; m++)
        z->ix[m] = zix(m < 2 ? lo : hi, k_code3[m], sgn, k_sign8[m]);
}

/* int32 lanes whose total is the block's T for one activation block: aa = |a|, s6 = a's sign
 * at bit 6 of each byte (else 0), both regrouped like the weights; lv = the signed-level table.
 * VPDPBUSD: |a| (u8, 128 for a = -128) times the level with the sign of the product (|v| <= 62)
 * summed by 4: exact; then 2s+1 per lane (|lane| <= 16·128·62·31, exact). */
static inline __m512i zdot(const zblock *z, const __m512i *aa, const __m512i *s6,
                           __m512i lv_lo, __m512i lv_hi, const int split) {
    __m512i acc0 = _mm512_setzero_si512(), acc1 = _mm512_setzero_si512();
    IQX_UNROLL for (int m = 0; m < 4; m++) {
        const __m512i v = _mm512_permutex2var_epi8(lv_lo, _mm512_xor_si512(z->ix[m], s6[m]), lv_hi);
        if (split && m >= 2) acc1 = _mm512_dpbusd_epi32(acc1, aa[m], v);
        else acc0 = _mm512_dpbusd_epi32(acc0, aa[m], v);
    }
    if (!split) return _mm512_mullo_epi32(acc0, z->sc[0]);
    return _mm512_add_epi32(_mm512_mullo_epi32(acc0, z->sc[0]), _mm512_mullo_epi32(acc1, z->sc[1]));
}

/* activations of one block regrouped: vector m, qword k = elements 32k + 8m .. + 7 */
static inline void regroup_act(const int8_t *a, __m512i *aa, __m512i *s6) {
    const __m512i a0 = _mm512_loadu_si512(a), a1 = _mm512_loadu_si512(a + 64);
    const __m512i a2 = _mm512_loadu_si512(a + 128), a3 = _mm512_loadu_si512(a + 192);
    IQX_UNROLL for (int m = 0; m < 4; m++) {
        /* qwords k = 0..3 from a0 (k = 0, 1) and a1 (k = 2, 3): source qwords m, 4 + m */
        const __m512i pick = _mm512_setr_epi64(m, 4 + m, 8 + m, 12 + m, m, 4 + m, 8 + m, 12 + m);
        const __m512i lo = _mm512_permutex2var_epi64(a0, pick, a1);
        const __m512i hi = _mm512_permutex2var_epi64(a2, pick, a3);
        const __m512i v = _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(1, 0, 1, 0));
        aa[m] = _mm512_abs_epi8(v);
        s6[m] = _mm512_and_si512(_mm512_srli_epi16(v, 1), _mm512_set1_epi8(0x40));
    }
}

/* the eight-row kernel: DECODE(x, &z) one block, LV its signed-level table, SPLIT: a scale per
 * 16 elements */
#define ZROWS8(name, BT, DECODE, LV, SPLIT, FINAL)                                               \
    static inline __attribute__((always_inline)) void name##_c(                                 \
        int64_t n, float *s, size_t bs, const void *vx, size_t bx, const void *vy, size_t by,   \
        const int C) {                                                                          \
        const char *x = vx;                                                                     \
        const __m512i lv_lo = LD(LV), lv_hi = LD(LV + 64);                                      \
        __m256 acc[IQX_MAX_C];                                                                  \
        IQX_UNROLL for (int j = 0; j < C; j++) acc[j] = _mm256_setzero_ps();                    \
        const int64_t nb = n / PG_QK_K;                                                         \
        const size_t share = iqx_share(bx, nb);                                                 \
        for (int64_t b = 0; b < nb; b++) {                                                      \
            iqx_prefetch(vx, bx, b, share);                                                     \
            const pg_block_q8_K *yb[IQX_MAX_C];                                                 \
            __m512i aa[IQX_MAX_C][4], s6[IQX_MAX_C][4];                                         \
            IQX_UNROLL for (int j = 0; j < C; j++) {                                            \
                yb[j] = (const pg_block_q8_K *)((const char *)vy + (size_t)j * by) + b;         \
                regroup_act(yb[j]->qs, aa[j], s6[j]);                                           \
            }                                                                                   \
            __m256i is[IQX_MAX_C][8];                                                           \
            ROWS_UNROLL for (int r = 0; r < 8; r++) {                                           \
                zblock z;                                                                       \
                DECODE((const BT *)(x + (size_t)r * bx) + b, &z);                               \
                IQX_UNROLL for (int j = 0; j < C; j++)                                          \
                    is[j][r] = half_sum512(zdot(&z, aa[j], s6[j], lv_lo, lv_hi, SPLIT));        \
            }                                                                                   \
            const __m256 dx = iqx_rows8_fp16(x, bx, b, sizeof(BT));                             \
            IQX_UNROLL for (int j = 0; j < C; j++) {                                            \
                const __m256 f = _mm256_cvtepi32_ps(iqx_fold8(is[j]));                          \
                acc[j] = _mm256_add_ps(acc[j], _mm256_mul_ps(                                   \
                    _mm256_mul_ps(dx, _mm256_set1_ps(yb[j]->d)), f));                           \
            }                                                                                   \
        }                                                                                       \
        IQX_UNROLL for (int j = 0; j < C; j++)                                                  \
            _mm256_storeu_ps((float *)((char *)s + (size_t)j * bs),                             \
                             _mm256_mul_ps(_mm256_set1_ps(FINAL), acc[j]));                     \
    }                                                                                           \
    IQX_ROWS8_DISPATCH(name)

/* vec_dot8 and the gemm of a type; the gemm's ragged edge is the path's one-row vec_dot (the
 * AVX2 kernel: the same bits) */
#define ZKERNELS(name, BT, LV, SPLIT, FINAL)                                                    \
    static pg_vec_dot_fn name##_vec_dot;                                                        \
    static void name##_edge(int64_t n, float *restrict s, const void *restrict x,               \
                            const void *restrict y) {                                           \
        name##_vec_dot(n, s, x, y);                                                             \
    }                                                                                           \
    ZROWS8(vec_dot8_##name##_z, BT, decode_##name, LV, SPLIT, FINAL)                            \
    IQX_GEMM(gemm_##name##_z, vec_dot8_##name##_z, name##_edge)

ZKERNELS(iq2_xxs, pg_block_iq2_xxs, k_lvl2s, 0, 0.125f)
ZKERNELS(iq2_xs, pg_block_iq2_xs, k_lvl2s, 1, 0.125f)
ZKERNELS(iq3_xxs, pg_block_iq3_xxs, k_lvl3xxs, 0, 0.25f)
ZKERNELS(iq3_s, pg_block_iq3_s, k_lvl3s, 0, 1.0f)

#define ZSET(tbl, type, name)                                                                   \
    do {                                                                                        \
        name##_vec_dot = (tbl)[type].vec_dot;                                                   \
        IQX_SET(tbl, type, name##_vec_dot, vec_dot8_##name##_z, gemm_##name##_z);              \
    } while (0)

void pg_fill_iq_grid_avx512(pg_type_traits *tbl) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512vbmi") || !__builtin_cpu_supports("avx512vnni")) return;
    if (!fill_tables()) return;
    ZSET(tbl, PG_TYPE_IQ2_XXS, iq2_xxs);
    ZSET(tbl, PG_TYPE_IQ2_XS, iq2_xs);
    ZSET(tbl, PG_TYPE_IQ3_XXS, iq3_xxs);
    ZSET(tbl, PG_TYPE_IQ3_S, iq3_s);
}
