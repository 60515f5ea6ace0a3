/* Multi-row dot kernels (pg_type_traits.gemm) with AVX2 + FMA + F16C.
 *
 * Every call computes a 4 × 4 block (gemm.h), and every dot in it has the bits of the vec_dot
 * of its two rows (which are the scalar reference's, quants_legacy_x86.h, quants_kquants_avx2.c):
 * the same exact integer block sums, then the block's fp32 term in the reference's operations,
 * added to the dot's running sum in block order. Only the loads and the weight decoding are
 * shared between the dots of the block; the fp32 work is elementwise over dots (a lane per dot),
 * so a token's result never depends on the batch it is computed in.
 *   - integer sums: per weight row the four activation rows' 8-lane sums are folded with two
 *     levels of hadd into [c0 c1 c2 c3 | c0 c1 c2 c3] (halves of each dot), and the halves of two
 *     weight rows added into [row i: c0..c3 | row i+1: c0..c3] (integer adds: exact);
 *   - legacy formats, per block: each weight block is decoded once (unsigned levels; Q8_0 keeps
 *     its signed bytes and uses the sign trick), each activation block loaded once; the offset
 *     c·Σa of Q4_0/Q5_0 (levels q − c) is folded once per block for the four columns;
 *   - K-quants, per super-block: each weight row is decoded once into eight 32-level rows and
 *     their int16 scales; per pair and 32 elements one maddubs, one madd, one add; mins (or the
 *     −4 / −32 offsets) through the activation's bsums, folded the same way.
 * maddubs never saturates: unsigned levels <= 63 (or |q| <= 128 with |a| <= 127) times
 * activations in −128..127, two products per int16. */
#include <immintrin.h>
#include <string.h>

#include "gemm.h"
#include "kquants.h"
#include "kquants_x86.h"
#include "quants.h"
#include "quants_legacy.h"

#define AINL static inline __attribute__((always_inline))
#define PG_UNROLL _Pragma("GCC unroll 16")

/* ---- shared pieces --------------------------------------------------------------------------- */

/* [Σp0 Σp1 Σp2 Σp3 | Σp0 Σp1 Σp2 Σp3] over each 128-bit half of the 8-lane int32 vectors */
AINL __m256i fold4(__m256i p0, __m256i p1, __m256i p2, __m256i p3) {
    return _mm256_hadd_epi32(_mm256_hadd_epi32(p0, p1), _mm256_hadd_epi32(p2, p3));
}

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

/* [Σ of dot (i, j) for j < 4 | Σ of dot (i + 1, j)] from the two rows' fold4 results */
AINL __m256i rows2(__m256i f0, __m256i f1) {
    return _mm256_add_epi32(_mm256_permute2x128_si256(f0, f1, 0x20),
                            _mm256_permute2x128_si256(f0, f1, 0x31));
}

/* [a × 4 | b × 4] */
AINL __m256 pair_ps(float a, float b) { return _mm256_set_m128(_mm_set1_ps(b), _mm_set1_ps(a)); }

/* acc[g] lane 4h + j = dot (2g + h, j) -> out[j][i] */
AINL void store_acc(float *s, size_t bs, const __m256 acc[PG_GR / 2], int nr, int nc) {
    float rows[PG_GR / 2][8], out[PG_GC][PG_GR];
    PG_UNROLL for (int g = 0; g < PG_GR / 2; g++) _mm256_storeu_ps(rows[g], acc[g]);
    for (int j = 0; j < PG_GC; j++)
        for (int i = 0; i < PG_GR; i++) out[j][i] = rows[i / 2][4 * (i % 2) + j];
    pg_gemm_store(s, bs, out, nr, nc);
}

/* ---- legacy formats -------------------------------------------------------------------------- */

/* 16 packed bytes -> 32 levels: low nibbles (elements 0..15) then high nibbles (16..31) */
AINL __m256i nibbles(const uint8_t *qs) {
    const __m128i t = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(0x0F));
}

/* bit j of the 32-bit qh -> 0x10 in byte j */
AINL __m256i fifth_bits(const uint8_t *qh4) {
    uint32_t u;
    memcpy(&u, qh4, 4);
    const __m256i v = _mm256_set1_epi32((int)u);
    const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                          2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(v, pick), bit), bit);
    return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

/* Weight kinds: 0 = 4-bit (Q4_0, Q4_1), 1 = 5-bit (Q5_0, Q5_1), 2 = Q8_0 (signed). */
AINL __m256i w_levels(const char *blk, int kind, int has_m) {
    if (kind == 2) return _mm256_loadu_si256((const __m256i *)((const pg_block_q8_0 *)blk)->qs);
    const int qs_off = kind == 1 ? (has_m ? 8 : 6) : (has_m ? 4 : 2);
    __m256i q = nibbles((const uint8_t *)blk + qs_off);
    if (kind == 1) q = _mm256_or_si256(q, fifth_bits((const uint8_t *)blk + (has_m ? 4 : 2)));
    return q;
}

AINL float fp16_at(const char *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return h2f(h);
}

/* STRIDE: weight block bytes; KIND: as w_levels; OFF: offset c of the levels (Q4_0: 8, Q5_0:
 * 16, else 0); HAS_M: Q4_1/Q5_1 with Q8_1 activations. Block terms as the scalar kernels:
 * Q4_0/Q5_0 isum·d_x·d_y, Q8_0 isum·(d_x·d_y), Q4_1/Q5_1 (d_x·d_y)·isum + m_x·s_y. */
#define PG_GEMM_LEGACY_AVX2(name, STRIDE, KIND, OFF, HAS_M)                                        \
    static void name##_4(int64_t n, float *restrict s, size_t bs, const void *restrict vx,         \
                     size_t bx, const void *restrict vy, size_t by, int nr, int nc) {              \
        const pg_gemm_rows r = pg_gemm_rows_of(vx, bx, vy, by, nr, nc);                            \
        const int ys = HAS_M ? 36 : 34, yq = HAS_M ? 4 : 2;                                        \
        __m256 acc[PG_GR / 2];                                                                     \
        PG_UNROLL for (int g = 0; g < PG_GR / 2; g++) acc[g] = _mm256_setzero_ps();                \
        for (int64_t b = 0; b < n / PG_QK32; b++) {                                                \
            const char *y0 = r.y[0] + b * ys, *y1 = r.y[1] + b * ys, *y2 = r.y[2] + b * ys,        \
                       *y3 = r.y[3] + b * ys;                                                      \
            const __m256i a[4] = {_mm256_loadu_si256((const __m256i *)(y0 + yq)),                  \
                                  _mm256_loadu_si256((const __m256i *)(y1 + yq)),                  \
                                  _mm256_loadu_si256((const __m256i *)(y2 + yq)),                  \
                                  _mm256_loadu_si256((const __m256i *)(y3 + yq))};                 \
            const __m256 dy = fp16x4x2(y0, y1, y2, y3, 1);                                         \
            __m256i off = _mm256_setzero_si256();                                                  \
            if (OFF) {                                                                             \
                const __m256i c = _mm256_set1_epi8(OFF);                                           \
                off = fold4(madd1(_mm256_maddubs_epi16(c, a[0])),                                  \
                            madd1(_mm256_maddubs_epi16(c, a[1])),                                  \
                            madd1(_mm256_maddubs_epi16(c, a[2])),                                  \
                            madd1(_mm256_maddubs_epi16(c, a[3])));                                 \
            }                                                                                      \
            const __m256 sy = HAS_M ? fp16x4x2(y0 + 2, y1 + 2, y2 + 2, y3 + 2, 1)                  \
                                    : _mm256_setzero_ps();                                         \
            PG_UNROLL for (int g = 0; g < PG_GR / 2; g++) {                                        \
                __m256i f[2];                                                                      \
                PG_UNROLL for (int h = 0; h < 2; h++) {                                            \
                    const __m256i q = w_levels(r.x[2 * g + h] + b * STRIDE, KIND, HAS_M);          \
                    __m256i p[4];                                                                  \
                    PG_UNROLL for (int j = 0; j < 4; j++)                                          \
                        p[j] = KIND == 2 ? madd1(_mm256_maddubs_epi16(_mm256_sign_epi8(q, q),      \
                                                                      _mm256_sign_epi8(a[j], q)))  \
                                         : madd1(_mm256_maddubs_epi16(q, a[j]));                   \
                    f[h] = _mm256_sub_epi32(fold4(p[0], p[1], p[2], p[3]), off);                   \
                }                                                                                  \
                const __m256 isum = _mm256_cvtepi32_ps(rows2(f[0], f[1]));                         \
                const char *x0 = r.x[2 * g] + b * STRIDE, *x1 = r.x[2 * g + 1] + b * STRIDE;       \
                const __m256 dx = pair_ps(fp16_at(x0), fp16_at(x1));                               \
                __m256 t;                                                                          \
                if (HAS_M)                                                                         \
                    t = _mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(dx, dy), isum),                  \
                                      _mm256_mul_ps(pair_ps(fp16_at(x0 + 2), fp16_at(x1 + 2)),     \
                                                    sy));                                          \
                else if (KIND == 2)                                                                \
                    t = _mm256_mul_ps(isum, _mm256_mul_ps(dx, dy));                                \
                else                                                                               \
                    t = _mm256_mul_ps(_mm256_mul_ps(isum, dx), dy);                                \
                acc[g] = _mm256_add_ps(acc[g], t);                                                 \
            }                                                                                      \
        }                                                                                          \
        store_acc(s, bs, acc, nr, nc);                                                             \
    }                                                                                              \
    PG_GEMM_BY4(name, name##_4)

PG_GEMM_LEGACY_AVX2(gemm_q4_0_avx2, 18, 0, 8, 0)
PG_GEMM_LEGACY_AVX2(gemm_q5_0_avx2, 22, 1, 16, 0)
PG_GEMM_LEGACY_AVX2(gemm_q8_0_avx2, 34, 2, 0, 0)
PG_GEMM_LEGACY_AVX2(gemm_q4_1_avx2, 20, 0, 0, 1)
PG_GEMM_LEGACY_AVX2(gemm_q5_1_avx2, 24, 1, 0, 1)

/* ---- K-quants × Q8_K ------------------------------------------------------------------------- */

/* One decoded weight super-block: eight rows of 32 unsigned levels (elements 32k..32k+31) with
 * their int16 scales ([scale of the low 16 | of the high 16]), the int16 weights of the 16 bsums
 * (mins, or the scales for the offset formats), d and dmin. */
typedef struct {
    __m256i q[8], sc[8];
    __m256i w16;
    float d, dmin;
} krow;

/* [s_lo x8 | s_hi x8] */
AINL __m256i scale_pair(int16_t lo, int16_t hi) {
    return _mm256_set_m128i(_mm_set1_epi16(hi), _mm_set1_epi16(lo));
}

AINL void decode_q2_K(const pg_block_q2_K *x, krow *k) {
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m128i s8 = _mm_loadu_si128((const __m128i *)x->scales), m4 = _mm_set1_epi8(0xF);
    int16_t sc[16];
    _mm256_storeu_si256((__m256i *)sc, _mm256_cvtepu8_epi16(_mm_and_si128(s8, m4)));
    k->w16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s8, 4), m4));
    PG_UNROLL for (int h = 0; h < 2; h++) {
        const __m256i qs = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * h));
        PG_UNROLL for (int j = 0; j < 4; j++) {   /* elements 128h + 32j + l: bits 2j */
            k->q[4 * h + j] = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * j), m3);
            k->sc[4 * h + j] = scale_pair(sc[8 * h + 2 * j], sc[8 * h + 2 * j + 1]);
        }
    }
    k->d = h2f(x->d);
    k->dmin = h2f(x->dmin);
}

AINL void decode_q3_K(const pg_block_q3_K *x, krow *k) {
    const __m256i m3 = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
    const __m256i sc16 = _mm256_cvtepi8_epi16(k3_scales(x->qs + 62));
    int16_t sc[16];
    _mm256_storeu_si256((__m256i *)sc, sc16);
    k->w16 = sc16;
    const __m256i hm = _mm256_loadu_si256((const __m256i *)x->hmask);
    PG_UNROLL for (int h = 0; h < 2; h++) {
        const __m256i qs = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * h));
        PG_UNROLL for (int j = 0; j < 4; j++) {   /* third bit: hmask bit 4h + j */
            const __m256i bit = _mm256_set1_epi8((char)(1 << (4 * h + j)));
            const __m256i hb = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit),
                                                four);
            k->q[4 * h + j] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qs, 2 * j), m3),
                                              hb);
            k->sc[4 * h + j] = scale_pair(sc[8 * h + 2 * j], sc[8 * h + 2 * j + 1]);
        }
    }
    k->d = h2f(x->d);
    k->dmin = 0.0f;
}

/* Q4_K / Q5_K: chunk c of 32 qs bytes: low nibbles = elements 64c + l (sub-block 2c), high =
 * 64c + 32 + l (2c + 1); the 5th bit of Q5_K: bit 2c (2c + 1) of qh[l]. */
AINL void decode_k4(const uint8_t *qs, const uint8_t *scales, const uint16_t *dd,
                    const uint8_t *qh, krow *k) {
    const __m256i m4 = _mm256_set1_epi8(0xF), b5 = _mm256_set1_epi8(0x10);
    const __m128i sm = k4_scales(scales);
    int16_t sc[8];
    _mm_storeu_si128((__m128i *)sc, _mm_cvtepu8_epi16(sm));
    k->w16 = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(
        sm, _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15)));
    const __m256i h = qh ? _mm256_loadu_si256((const __m256i *)qh) : _mm256_setzero_si256();
    PG_UNROLL for (int c = 0; c < 4; c++) {
        const __m256i b = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
        __m256i lo = _mm256_and_si256(b, m4), hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), m4);
        if (qh) {
            const __m256i bl = _mm256_set1_epi8((char)(1 << (2 * c)));
            const __m256i bh = _mm256_set1_epi8((char)(2 << (2 * c)));
            lo = _mm256_or_si256(lo, _mm256_and_si256(
                                         _mm256_cmpeq_epi8(_mm256_and_si256(h, bl), bl), b5));
            hi = _mm256_or_si256(hi, _mm256_and_si256(
                                         _mm256_cmpeq_epi8(_mm256_and_si256(h, bh), bh), b5));
        }
        k->q[2 * c] = lo;
        k->q[2 * c + 1] = hi;
        k->sc[2 * c] = _mm256_set1_epi16(sc[2 * c]);
        k->sc[2 * c + 1] = _mm256_set1_epi16(sc[2 * c + 1]);
    }
    k->d = h2f(dd[0]);
    k->dmin = h2f(dd[1]);
}

AINL void decode_q4_K(const pg_block_q4_K *x, krow *k) {
    decode_k4(x->qs, x->scales, &x->d, NULL, k);
}
AINL void decode_q5_K(const pg_block_q5_K *x, krow *k) {
    decode_k4(x->qs, x->scales, &x->d, x->qh, k);
}

/* Q6_K: half h, 32-byte rows: l0 = ql[64h..], l1 = ql[64h + 32..], qh_h = qh[32h..];
 * elements 128h + 32g + l: g = 0: l0 low | qh bits 0-1, g = 1: l1 low | bits 2-3,
 * g = 2: l0 high | bits 4-5, g = 3: l1 high | bits 6-7. */
AINL void decode_q6_K(const pg_block_q6_K *x, krow *k) {
    const __m256i m4 = _mm256_set1_epi8(0xF), m30 = _mm256_set1_epi8(0x30);
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x->scales));
    int16_t sc[16];
    _mm256_storeu_si256((__m256i *)sc, sc16);
    k->w16 = sc16;
    PG_UNROLL for (int h = 0; h < 2; h++) {
        const __m256i l0 = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * h));
        const __m256i l1 = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * h + 32));
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(x->qh + 32 * h));
        k->q[4 * h] = _mm256_or_si256(_mm256_and_si256(l0, m4),
                                      _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
        k->q[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                          _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
        k->q[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                          _mm256_and_si256(qh, m30));
        k->q[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                          _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
        PG_UNROLL for (int g = 0; g < 4; g++)
            k->sc[4 * h + g] = scale_pair(sc[8 * h + 2 * g], sc[8 * h + 2 * g + 1]);
    }
    k->d = h2f(x->d);
    k->dmin = 0.0f;
}

/* SHIFT < 0: format with mins, term d·isum − dmin·summs (d = d_x·d_y, dmin = dmin_x·d_y); else
 * levels offset by 2^SHIFT (isum − 2^SHIFT·Σ sc·bsums exact), term (d_x·d_y)·isum: the scalar
 * kernels' operations (quants_kquants.c). */
#define PG_GEMM_KQUANT_AVX2(name, XT, DECODE, SHIFT)                                               \
    static void name##_4(int64_t n, float *restrict s, size_t bs, const void *restrict vx,         \
                     size_t bx, const void *restrict vy, size_t by, int nr, int nc) {              \
        const pg_gemm_rows r = pg_gemm_rows_of(vx, bx, vy, by, nr, nc);                            \
        __m256 acc[PG_GR / 2];                                                                     \
        PG_UNROLL for (int g = 0; g < PG_GR / 2; g++) acc[g] = _mm256_setzero_ps();                \
        for (int64_t b = 0; b < n / PG_QK_K; b++) {                                                \
            const pg_block_q8_K *y[4];                                                             \
            PG_UNROLL for (int j = 0; j < 4; j++) y[j] = (const pg_block_q8_K *)r.y[j] + b;        \
            const __m128 d4 = _mm_setr_ps(y[0]->d, y[1]->d, y[2]->d, y[3]->d);                     \
            const __m256 dy = _mm256_set_m128(d4, d4);                                             \
            PG_UNROLL for (int g = 0; g < PG_GR / 2; g++) {                                        \
                __m256i f[2], fm[2];                                                               \
                float d[2], dmin[2];                                                               \
                PG_UNROLL for (int h = 0; h < 2; h++) {                                            \
                    krow k;                                                                        \
                    DECODE((const XT *)r.x[2 * g + h] + b, &k);                                    \
                    d[h] = k.d;                                                                    \
                    dmin[h] = k.dmin;                                                              \
                    __m256i p[4], o[4];                                                            \
                    PG_UNROLL for (int j = 0; j < 4; j++) {                                        \
                        p[j] = _mm256_setzero_si256();                                             \
                        o[j] = _mm256_madd_epi16(                                                  \
                            _mm256_loadu_si256((const __m256i *)y[j]->bsums), k.w16);              \
                    }                                                                              \
                    PG_UNROLL for (int c = 0; c < 8; c++)                                          \
                        PG_UNROLL for (int j = 0; j < 4; j++) {                                    \
                            const __m256i a =                                                      \
                                _mm256_loadu_si256((const __m256i *)(y[j]->qs + 32 * c));          \
                            p[j] = _mm256_add_epi32(p[j], _mm256_madd_epi16(                       \
                                                              _mm256_maddubs_epi16(k.q[c], a),     \
                                                              k.sc[c]));                           \
                        }                                                                          \
                    f[h] = fold4(p[0], p[1], p[2], p[3]);                                          \
                    fm[h] = fold4(o[0], o[1], o[2], o[3]);                                         \
                    if (SHIFT >= 0)                                                                \
                        f[h] = _mm256_sub_epi32(f[h],                                              \
                                                _mm256_slli_epi32(fm[h], SHIFT >= 0 ? SHIFT : 0)); \
                }                                                                                  \
                const __m256 isum = _mm256_cvtepi32_ps(rows2(f[0], f[1]));                         \
                const __m256 dd = _mm256_mul_ps(pair_ps(d[0], d[1]), dy);                          \
                __m256 t = _mm256_mul_ps(dd, isum);                                                \
                if (SHIFT < 0)                                                                     \
                    t = _mm256_sub_ps(t, _mm256_mul_ps(_mm256_mul_ps(pair_ps(dmin[0], dmin[1]),    \
                                                                     dy),                          \
                                                       _mm256_cvtepi32_ps(rows2(fm[0], fm[1]))));  \
                acc[g] = _mm256_add_ps(acc[g], t);                                                 \
            }                                                                                      \
        }                                                                                          \
        store_acc(s, bs, acc, nr, nc);                                                             \
    }                                                                                              \
    PG_GEMM_BY4(name, name##_4)

PG_GEMM_KQUANT_AVX2(gemm_q2_K_avx2, pg_block_q2_K, decode_q2_K, -1)
PG_GEMM_KQUANT_AVX2(gemm_q3_K_avx2, pg_block_q3_K, decode_q3_K, 2)
PG_GEMM_KQUANT_AVX2(gemm_q4_K_avx2, pg_block_q4_K, decode_q4_K, -1)
PG_GEMM_KQUANT_AVX2(gemm_q5_K_avx2, pg_block_q5_K, decode_q5_K, -1)
PG_GEMM_KQUANT_AVX2(gemm_q6_K_avx2, pg_block_q6_K, decode_q6_K, 5)

/* ---- table ------------------------------------------------------------------------------- */

void pg_fill_gemm_avx2(pg_type_traits *tbl) {
    for (int t = 0; t < PG_TYPE_COUNT; t++) tbl[t].gemm = NULL;
    tbl[PG_TYPE_Q4_0].gemm = gemm_q4_0_avx2;
    tbl[PG_TYPE_Q4_1].gemm = gemm_q4_1_avx2;
    tbl[PG_TYPE_Q5_0].gemm = gemm_q5_0_avx2;
    tbl[PG_TYPE_Q5_1].gemm = gemm_q5_1_avx2;
    tbl[PG_TYPE_Q8_0].gemm = gemm_q8_0_avx2;
    tbl[PG_TYPE_Q2_K].gemm = gemm_q2_K_avx2;
    tbl[PG_TYPE_Q3_K].gemm = gemm_q3_K_avx2;
    tbl[PG_TYPE_Q4_K].gemm = gemm_q4_K_avx2;
    tbl[PG_TYPE_Q5_K].gemm = gemm_q5_K_avx2;
    tbl[PG_TYPE_Q6_K].gemm = gemm_q6_K_avx2;
}
