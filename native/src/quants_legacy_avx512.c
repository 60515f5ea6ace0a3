/* Legacy formats: optional AVX-512 kernels (an extra beside AVX2, never required).
 *
 * Installed on the avx512 path only when the CPU also has AVX512-VNNI (this file is compiled
 * with F/BW/VL/VNNI; without VNNI the path keeps the AVX2 kernels).
 *
 * Four blocks per step in 512-bit registers:
 *   - the four blocks' bytes are read with two 64-byte loads per row (never past the 4th block),
 *     and one 2-source word permute (vpermt2w) pulls out what each step needs: the four fp16
 *     scales (and mins, and the 5th-bit words), or the 4-bit quants of two blocks laid out like
 *     the activations [block b: 32 bytes | block b+1: 32 bytes] — every field of these formats
 *     sits at an even offset, so word permutes suffice;
 *   - the x and y scales (and m, s) go through one fp16 conversion each and one multiply,
 *     giving d_x·d_y of the four blocks and, for Q4_1/Q5_1, m_x·s_y;
 *   - integer dots with VPDPBUSD (u8·s8, exact): unsigned weights q and Σ(q−c)·a =
 *     dpbusd(q, a) − dpbusd(c, a) for Q4_0 (c = 8), Q5_0 (16) and Q8_0 (stored as q ^ 0x80,
 *     c = 128), exact for every byte value.
 * Leftover blocks (n/32 not a multiple of 4) use the 256-bit VNNI kernels of
 * quants_legacy_x86.h. Same contract as the AVX2 kernels: integer block sums exact, float
 * scaling accumulated in another order than the scalar code. */
#include <immintrin.h>

#include "pg_internal.h"
#include "quants.h"

#define PG_X86_DOT_US(u, s) _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s)
#define PG_X86_DOT_Q4_0(q, a)                                                                   \
    _mm256_sub_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), q, a),                         \
                     _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(8), a))
#include "quants_legacy_x86.h"

/* ---- word gathers over a group of four blocks ---------------------------------------------- */

/* A group of four blocks of stride S bytes is read as R0 = bytes [0, 64) and
 * R1 = [OFF1, OFF1 + 64) with OFF1 = min(64, 4S − 64): both inside the group for S >= 16, and
 * together covering every field used below. WI(o) is the vpermt2w index of the word at byte o. */
#define OFF1(S) ((4 * (S) - 64) < 64 ? (4 * (S) - 64) : 64)
#define WI(o, S) ((o) + 2 <= 64 ? (o) / 2 : 32 + ((o) - OFF1(S)) / 2)

typedef struct { __m512i r0, r1; } group_bytes;

static inline group_bytes load_group(const void *p, int stride) {
    const char *c = p;
    return (group_bytes){_mm512_loadu_si512(c), _mm512_loadu_si512(c + OFF1(stride))};
}

static inline __m512i gather_words(group_bytes g, const uint16_t *idx) {
    return _mm512_permutex2var_epi16(g.r0, _mm512_loadu_si512(idx), g.r1);
}

/* Index tables. Scales: words 0..3 = d of blocks 0..3, 4..7 = the fp16 after d (m or s),
 * 8..15 = the 32-bit qh of blocks 0..3 (Q5 formats). Quants: 8 words (16 bytes) of block k,
 * twice, then of block k+1, twice. */
#define D4(S) WI(0, S), WI(S, S), WI(2 * (S), S), WI(3 * (S), S)
#define M4(S) WI(2, S), WI((S) + 2, S), WI(2 * (S) + 2, S), WI(3 * (S) + 2, S)
#define QH2(o, S) WI(o, S), WI((o) + 2, S)
#define QH8(q, S) QH2(q, S), QH2((S) + (q), S), QH2(2 * (S) + (q), S), QH2(3 * (S) + (q), S)
#define W8(o, S) WI(o, S), WI((o) + 2, S), WI((o) + 4, S), WI((o) + 6, S), WI((o) + 8, S),    \
                 WI((o) + 10, S), WI((o) + 12, S), WI((o) + 14, S)
#define QS2(k, qs, S) W8((k) * (S) + (qs), S), W8((k) * (S) + (qs), S),                          \
                      W8(((k) + 1) * (S) + (qs), S), W8(((k) + 1) * (S) + (qs), S)
#define ZERO16 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0
#define ZERO24 ZERO16, 0, 0, 0, 0, 0, 0, 0, 0

/* per format: stride, offset of qs, offset of qh (0: none) */
#define Q4_0_S 18
#define Q4_1_S 20
#define Q5_0_S 22
#define Q5_1_S 24
#define Q8_0_S 34
#define Q8_1_S 36

static const uint16_t k_sc_q4_0[32] = {D4(Q4_0_S), D4(Q4_0_S), ZERO24};
static const uint16_t k_sc_q4_1[32] = {D4(Q4_1_S), M4(Q4_1_S), ZERO24};
static const uint16_t k_sc_q5_0[32] = {D4(Q5_0_S), D4(Q5_0_S), QH8(2, Q5_0_S), ZERO16};
static const uint16_t k_sc_q5_1[32] = {D4(Q5_1_S), M4(Q5_1_S), QH8(4, Q5_1_S), ZERO16};
static const uint16_t k_sc_q8_0[32] = {D4(Q8_0_S), D4(Q8_0_S), ZERO24};
static const uint16_t k_sc_q8_1[32] = {D4(Q8_1_S), M4(Q8_1_S), ZERO24};
static const uint16_t k_qs_q4_0[2][32] = {{QS2(0, 2, Q4_0_S)}, {QS2(2, 2, Q4_0_S)}};
static const uint16_t k_qs_q4_1[2][32] = {{QS2(0, 4, Q4_1_S)}, {QS2(2, 4, Q4_1_S)}};
static const uint16_t k_qs_q5_0[2][32] = {{QS2(0, 6, Q5_0_S)}, {QS2(2, 6, Q5_0_S)}};
static const uint16_t k_qs_q5_1[2][32] = {{QS2(0, 8, Q5_1_S)}, {QS2(2, 8, Q5_1_S)}};

/* [d_x·d_y of blocks 0..3 | the products of the second fp16 fields (m_x·s_y) of 0..3]. */
static inline __m256 group_scales(__m512i xw, __m512i yw) {
    return _mm256_mul_ps(_mm256_cvtph_ps(_mm512_castsi512_si128(xw)),
                         _mm256_cvtph_ps(_mm512_castsi512_si128(yw)));
}

/* 4-bit quants of two blocks (from a QS2 gather: 16 bytes of each block twice) -> 64 bytes
 * 0..15: low nibbles (elements 0..15) in 128-bit lanes 0 and 2, high nibbles in 1 and 3. */
static inline __m512i split_nibbles(__m512i v) {
    const __m512i shift = _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0);   /* per 16-bit word */
    const __m512i counts = _mm512_or_si512(shift, _mm512_slli_epi64(shift, 16));
    const __m512i c = _mm512_or_si512(counts, _mm512_slli_epi64(counts, 32));
    return _mm512_and_si512(_mm512_srlv_epi16(v, c), _mm512_set1_epi8(0x0F));
}

/* Activations of blocks k and k+1: [a_k.qs | a_k+1.qs]. */
static inline __m512i load_act2(const int8_t *qs0, const int8_t *qs1) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)qs0)),
                              _mm256_loadu_si256((const __m256i *)qs1), 1);
}

static inline __m512i dpbusd(__m512i u, __m512i s) {
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, s);
}

/* Σ (u − c)·a per 4-byte group, u unsigned: dpbusd(u, a) − dpbusd(c, a). */
static inline __m512i dot_offset(__m512i u, __m512i a, char c) {
    return _mm512_sub_epi32(dpbusd(u, a), dpbusd(_mm512_set1_epi8(c), a));
}

/* Lanes [s_k × 8 | s_k+1 × 8] from the 4 scales in the low lanes of sc. */
static inline __m512 scale_pair(__m256 sc, int k) {
    const __m512i idx = _mm512_set_epi32(k + 1, k + 1, k + 1, k + 1, k + 1, k + 1, k + 1, k + 1,
                                         k, k, k, k, k, k, k, k);
    return _mm512_permutexvar_ps(idx, _mm512_castps256_ps512(sc));
}

/* ---- kernels ----------------------------------------------------------------------------- */

/* Q4_0 / Q5_0 (OFFSET = 8 / 16) · Q8_0. QH: whether the format has 5th bits (added as 0x10 by
 * a byte-masked add: the nibbles have bit 4 clear). */
#define PG_AVX512_DOT_Q8_0(name, XT, SC, QS, OFFSET, QH, TAIL_BLOCK)                           \
    static void name(int64_t n, float *restrict s, const void *restrict vx,                     \
                     const void *restrict vy) {                                                 \
        const XT *x = vx;                                                                       \
        const pg_block_q8_0 *y = vy;                                                            \
        const int64_t nb = n / PG_QK32;                                                         \
        __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();                          \
        int64_t b = 0;                                                                          \
        for (; b + 4 <= nb; b += 4) {                                                           \
            const group_bytes gx = load_group(&x[b], sizeof(XT));                               \
            const __m512i xw = gather_words(gx, SC);                                            \
            const __m256 sc = group_scales(xw, gather_words(load_group(&y[b], Q8_0_S),          \
                                                            k_sc_q8_0));                        \
            __m512i q01 = split_nibbles(gather_words(gx, QS[0]));                               \
            __m512i q23 = split_nibbles(gather_words(gx, QS[1]));                               \
            if (QH) {                                                                           \
                const __m128i qh = _mm512_extracti32x4_epi32(xw, 1);                            \
                const __m512i bit4 = _mm512_set1_epi8(0x10);                                    \
                q01 = _mm512_mask_add_epi8(q01, _cvtu64_mask64((uint64_t)_mm_cvtsi128_si64(qh)), \
                                          q01, bit4);                                           \
                q23 = _mm512_mask_add_epi8(q23,                                                  \
                                          _cvtu64_mask64((uint64_t)_mm_extract_epi64(qh, 1)),   \
                                          q23, bit4);                                           \
            }                                                                                   \
            const __m512i p01 = dot_offset(q01, load_act2(y[b].qs, y[b + 1].qs), OFFSET);       \
            const __m512i p23 = dot_offset(q23, load_act2(y[b + 2].qs, y[b + 3].qs), OFFSET);   \
            acc0 = _mm512_fmadd_ps(scale_pair(sc, 0), _mm512_cvtepi32_ps(p01), acc0);           \
            acc1 = _mm512_fmadd_ps(scale_pair(sc, 2), _mm512_cvtepi32_ps(p23), acc1);           \
        }                                                                                       \
        __m256 tail = _mm256_setzero_ps();                                                      \
        for (; b < nb; b++)                                                                     \
            tail = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[b].d) * h2f(y[b].d)),                   \
                                   _mm256_cvtepi32_ps(TAIL_BLOCK(&x[b], &y[b])), tail);         \
        *s = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) + hsum_ps(tail);                   \
    }

PG_AVX512_DOT_Q8_0(vec_dot_q4_0_q8_0_512, pg_block_q4_0, k_sc_q4_0, k_qs_q4_0, 8, 0, q4_0_block)
PG_AVX512_DOT_Q8_0(vec_dot_q5_0_q8_0_512, pg_block_q5_0, k_sc_q5_0, k_qs_q5_0, 16, 1, q5_0_block)

/* Q4_1 / Q5_1 · Q8_1: unsigned q, plus Σ m_x·s_y from the upper half of group_scales. */
#define PG_AVX512_DOT_Q8_1(name, XT, SC, QS, QH, TAIL_BLOCK)                                   \
    static void name(int64_t n, float *restrict s, const void *restrict vx,                     \
                     const void *restrict vy) {                                                 \
        const XT *x = vx;                                                                       \
        const pg_block_q8_1 *y = vy;                                                            \
        const int64_t nb = n / PG_QK32;                                                         \
        __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();                          \
        __m256 ms = _mm256_setzero_ps();                                                        \
        int64_t b = 0;                                                                          \
        for (; b + 4 <= nb; b += 4) {                                                           \
            const group_bytes gx = load_group(&x[b], sizeof(XT));                               \
            const __m512i xw = gather_words(gx, SC);                                            \
            const __m256 sc = group_scales(xw, gather_words(load_group(&y[b], Q8_1_S),          \
                                                            k_sc_q8_1));                        \
            ms = _mm256_add_ps(ms, sc);                                                         \
            __m512i q01 = split_nibbles(gather_words(gx, QS[0]));                               \
            __m512i q23 = split_nibbles(gather_words(gx, QS[1]));                               \
            if (QH) {                                                                           \
                const __m128i qh = _mm512_extracti32x4_epi32(xw, 1);                            \
                const __m512i bit4 = _mm512_set1_epi8(0x10);                                    \
                q01 = _mm512_mask_add_epi8(q01, _cvtu64_mask64((uint64_t)_mm_cvtsi128_si64(qh)), \
                                          q01, bit4);                                           \
                q23 = _mm512_mask_add_epi8(q23,                                                  \
                                          _cvtu64_mask64((uint64_t)_mm_extract_epi64(qh, 1)),   \
                                          q23, bit4);                                           \
            }                                                                                   \
            const __m512i p01 = dpbusd(q01, load_act2(y[b].qs, y[b + 1].qs));                   \
            const __m512i p23 = dpbusd(q23, load_act2(y[b + 2].qs, y[b + 3].qs));               \
            acc0 = _mm512_fmadd_ps(scale_pair(sc, 0), _mm512_cvtepi32_ps(p01), acc0);           \
            acc1 = _mm512_fmadd_ps(scale_pair(sc, 2), _mm512_cvtepi32_ps(p23), acc1);           \
        }                                                                                       \
        __m256 tail = _mm256_setzero_ps();                                                      \
        float summs = 0.0f;                                                                     \
        for (; b < nb; b++) {                                                                   \
            tail = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[b].d) * h2f(y[b].d)),                   \
                                   TAIL_BLOCK(&x[b], &y[b]), tail);                             \
            summs += h2f(x[b].m) * h2f(y[b].s);                                                 \
        }                                                                                       \
        const __m128 m4 = _mm256_extractf128_ps(ms, 1);   /* lanes 4..7: m·s of each slot */   \
        __m128 t = _mm_add_ps(m4, _mm_movehl_ps(m4, m4));                                       \
        t = _mm_add_ss(t, _mm_movehdup_ps(t));                                                  \
        *s = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) + hsum_ps(tail) +                  \
             (_mm_cvtss_f32(t) + summs);                                                        \
    }

PG_AVX512_DOT_Q8_1(vec_dot_q4_1_q8_1_512, pg_block_q4_1, k_sc_q4_1, k_qs_q4_1, 0, q4_1_block)
PG_AVX512_DOT_Q8_1(vec_dot_q5_1_q8_1_512, pg_block_q5_1, k_sc_q5_1, k_qs_q5_1, 1, q5_1_block)

/* Q8_0 · Q8_0: weights as q ^ 0x80 (= q + 128, unsigned), minus 128·Σa. */
static void vec_dot_q8_0_q8_0_512(int64_t n, float *restrict s, const void *restrict vx,
                                  const void *restrict vy) {
    const pg_block_q8_0 *x = vx;
    const pg_block_q8_0 *y = vy;
    const int64_t nb = n / PG_QK32;
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int64_t b = 0;
    for (; b + 4 <= nb; b += 4) {
        const __m256 sc = group_scales(gather_words(load_group(&x[b], Q8_0_S), k_sc_q8_0),
                                       gather_words(load_group(&y[b], Q8_0_S), k_sc_q8_0));
        const __m512i q01 = _mm512_xor_si512(load_act2(x[b].qs, x[b + 1].qs), flip);
        const __m512i q23 = _mm512_xor_si512(load_act2(x[b + 2].qs, x[b + 3].qs), flip);
        const __m512i p01 = dot_offset(q01, load_act2(y[b].qs, y[b + 1].qs), (char)0x80);
        const __m512i p23 = dot_offset(q23, load_act2(y[b + 2].qs, y[b + 3].qs), (char)0x80);
        acc0 = _mm512_fmadd_ps(scale_pair(sc, 0), _mm512_cvtepi32_ps(p01), acc0);
        acc1 = _mm512_fmadd_ps(scale_pair(sc, 2), _mm512_cvtepi32_ps(p23), acc1);
    }
    __m256 tail = _mm256_setzero_ps();
    for (; b < nb; b++)
        tail = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[b].d) * h2f(y[b].d)),
                               _mm256_cvtepi32_ps(q8_0_block(&x[b], &y[b])), tail);
    *s = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) + hsum_ps(tail);
}

void pg_fill_legacy_avx512(pg_type_traits *tbl) {
    if (!(pg_g_cpu_features & PG_CPU_AVX512VNNI)) return;
    tbl[PG_TYPE_Q4_0].vec_dot = vec_dot_q4_0_q8_0_512;
    tbl[PG_TYPE_Q4_1].vec_dot = vec_dot_q4_1_q8_1_512;
    tbl[PG_TYPE_Q5_0].vec_dot = vec_dot_q5_0_q8_0_512;
    tbl[PG_TYPE_Q5_1].vec_dot = vec_dot_q5_1_q8_1_512;
    tbl[PG_TYPE_Q8_0].vec_dot = vec_dot_q8_0_q8_0_512;
}
