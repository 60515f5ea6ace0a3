/* Helpers shared by the x86 K-quant kernels (quants_kquants_avx2.c, quants_kquants_avx512.c,
 * gemm_*.c; all compiled with at least AVX2 + FMA + F16C). */
#ifndef PG_KQUANTS_X86_H
#define PG_KQUANTS_X86_H

#include <immintrin.h>
#include <string.h>

#include "kquants.h"
#include "quants.h"

static inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

/* Q6_K half h (elements 128h .. 128h + 127) of a block as unsigned levels 0..63 (the −32 offset
 * not applied): u[g] holds elements 128h + 32g .. +31, from the low or high nibbles of ql and two
 * bits of qh */
static inline void pg_q6k_half_levels(const pg_block_q6_K *x, int h, __m256i u[4]) {
    const __m256i m4 = _mm256_set1_epi8(0xF), m30 = _mm256_set1_epi8(0x30);
    const __m256i l0 = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * h));
    const __m256i l1 = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * h + 32));
    const __m256i qh = _mm256_loadu_si256((const __m256i *)(x->qh + 32 * h));
    u[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
    u[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
    u[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                           _mm256_and_si256(qh, m30));
    u[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                           _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
}

static inline float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline __m256i loadu(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* bytes of a super-block of the x86 kernels' type numbers 4, 5, 6 = Q4_K, Q5_K, Q6_K */
static inline size_t kq_block_bytes(int type) {
    return type == 4 ? sizeof(pg_block_q4_K)
                     : type == 5 ? sizeof(pg_block_q5_K) : sizeof(pg_block_q6_K);
}

/* vec_dot8's prefetch: decode calls it for consecutive groups of 8 weight rows (8·bx bytes), and
 * while a group's super-block b of nb is computed, the b-th share of the next group's bytes is
 * fetched (rows of a few hundred bytes are too short for the hardware prefetcher to catch up
 * within a row, and eight rows read side by side are eight short streams). Into L2
 * (prefetcht1), not L1: a prefetch into L1 holds one of the core's few L1 miss buffers until its
 * line arrives from memory, so the ~18 lines a super-block step requests (Qwen 1.5B) left the
 * demand loads waiting on AMD Zen 4 (decode 0.72x of the plain per-row vec_dot, which the
 * hardware streamer feeds); an L2 prefetch is handed to L2, which has many more in flight, and
 * the next group's lines come from L2 when they are needed (Zen 4, 2 threads: Qwen 1.5B decode
 * 22 -> 27 t/s, the read limit; BENCHMARKS.md, "Decode on AMD Zen 4"). always_inline: GCC 12
 * finds a function whose only effect is a prefetch "const" and deletes its calls before it
 * would inline it (decode was 0.75x with plain inline; tests/test_native_build.py checks the
 * kernels still prefetch, into L2). */
static inline size_t kq_dot8_share(size_t bx, int64_t nb) {
    return (8 * bx / (size_t)nb + 63) & ~(size_t)63;
}
static inline __attribute__((always_inline)) void kq_dot8_prefetch(const void *x, size_t bx,
                                                                  int64_t b, size_t share) {
    const char *p = (const char *)x + 8 * bx + (size_t)b * share;
    for (size_t o = 0; o < share; o += 64) _mm_prefetch(p + o, PG_DOT8_PREFETCH_HINT);
}

/* The two fp16 at byte o of super-block b of eight rows (row r at x + r·bx) as floats: lo[r] the
 * first, hi[r] the second. One 32-bit load per row combined by unpacks: eight 2-byte stores read
 * back as one vector fail store forwarding and stalled every super-block of vec_dot8 (Zen 4,
 * in-cache Q4_K vec_dot8 ~20% slower). */
static inline __attribute__((always_inline)) void kq_rows8_fp16x2(const char *x, size_t bx,
        int64_t b, size_t bsize, int o, __m256 *lo, __m256 *hi) {
    __m128i v[8];
    _Pragma("GCC unroll 8") for (int r = 0; r < 8; r++) {
        int32_t u;
        memcpy(&u, x + (size_t)r * bx + (size_t)b * bsize + (size_t)o, 4);
        v[r] = _mm_cvtsi32_si128(u);
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++)
        v[r] = _mm_unpacklo_epi32(v[2 * r], v[2 * r + 1]);
    /* f0 = [a0 b0 a1 b1 a2 b2 a3 b3], f1 the same for rows 4..7 */
    const __m256 f0 = _mm256_cvtph_ps(_mm_unpacklo_epi64(v[0], v[1]));
    const __m256 f1 = _mm256_cvtph_ps(_mm_unpacklo_epi64(v[2], v[3]));
    /* [a0 a1 a4 a5 | a2 a3 a6 a7] -> rows in order */
    *lo = _mm256_castpd_ps(_mm256_permute4x64_pd(
        _mm256_castps_pd(_mm256_shuffle_ps(f0, f1, _MM_SHUFFLE(2, 0, 2, 0))), 0xD8));
    *hi = _mm256_castpd_ps(_mm256_permute4x64_pd(
        _mm256_castps_pd(_mm256_shuffle_ps(f0, f1, _MM_SHUFFLE(3, 1, 3, 1))), 0xD8));
}

static inline int32_t hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

/* The dot of a row, super-block by super-block, with the scalar kernel's fp32 operations
 * (quants_kquants.c): each super-block's term d·isum − dmin·summs (or d·isum) from its exact
 * integer sums, added to one fp32 sum in block order, so every path gives the scalar kernel's
 * bits. The integer reductions are done four super-blocks at a time: each block leaves its
 * 8-lane partial sums (kq_blk), and one fold gives the four blocks' exact sums. */
/* what a kernel's block function leaves for one super-block */
typedef struct {
    __m256i is, ms;      /* 8-lane partials of isum and summs (ms: zero without mins) */
    float d, dmin;       /* d = d_x·d_y, dmin = dmin_x·d_y */
} kq_blk;

static inline __m256i kq_fold4(__m256i p0, __m256i p1, __m256i p2, __m256i p3) {
    return _mm256_hadd_epi32(_mm256_hadd_epi32(p0, p1), _mm256_hadd_epi32(p2, p3));
}

/* the exact [Σp0 Σp1 Σp2 Σp3] as floats */
static inline __m128 kq_sums4(__m256i p0, __m256i p1, __m256i p2, __m256i p3) {
    const __m256i f = kq_fold4(p0, p1, p2, p3);
    return _mm_cvtepi32_ps(_mm_add_epi32(_mm256_castsi256_si128(f),
                                         _mm256_extracti128_si256(f, 1)));
}

/* sum + the terms of the first `n` of four super-blocks, in order. With mins, one fold gives
 * [isum_0..3 | summs_0..3] and one multiply by [d_0..3 | dmin_0..3] both products. */
static inline float kq_add4(float sum, const kq_blk *b, int n, int has_min) {
    __m128 t;
    if (has_min) {
        const __m256i lo = kq_fold4(b[0].is, b[1].is, b[2].is, b[3].is);
        const __m256i hi = kq_fold4(b[0].ms, b[1].ms, b[2].ms, b[3].ms);
        /* [Σ is | Σ ms]: the 128-bit halves of each fold added */
        const __m256i f = _mm256_add_epi32(_mm256_permute2x128_si256(lo, hi, 0x20),
                                           _mm256_permute2x128_si256(lo, hi, 0x31));
        const __m256 dd = _mm256_setr_ps(b[0].d, b[1].d, b[2].d, b[3].d, b[0].dmin, b[1].dmin,
                                         b[2].dmin, b[3].dmin);
        const __m256 pr = _mm256_mul_ps(dd, _mm256_cvtepi32_ps(f));
        t = _mm_sub_ps(_mm256_castps256_ps128(pr), _mm256_extractf128_ps(pr, 1));
    } else {
        t = _mm_mul_ps(_mm_setr_ps(b[0].d, b[1].d, b[2].d, b[3].d),
                       kq_sums4(b[0].is, b[1].is, b[2].is, b[3].is));
    }
    float v[4];
    _mm_storeu_ps(v, t);
    for (int k = 0; k < n; k++) sum += v[k];
    return sum;
}

/* *s = the dot over nb super-blocks, BLK(x, y, i, &kq_blk) computing block i */
#define KQ_DOT_LOOP(BLK, nb, HAS_MIN)                                                           \
    do {                                                                                        \
        float sum_ = 0.0f;                                                                      \
        int64_t i_ = 0;                                                                         \
        kq_blk b_[4];                                                                           \
        for (; i_ + 4 <= (nb); i_ += 4) {                                                       \
            BLK(x, y, i_, &b_[0]);                                                              \
            BLK(x, y, i_ + 1, &b_[1]);                                                          \
            BLK(x, y, i_ + 2, &b_[2]);                                                          \
            BLK(x, y, i_ + 3, &b_[3]);                                                          \
            sum_ = kq_add4(sum_, b_, 4, HAS_MIN);                                               \
        }                                                                                       \
        if (i_ < (nb)) {                                                                        \
            const int left_ = (int)((nb) - i_);                                                 \
            for (int k_ = 0; k_ < 4; k_++) {                                                    \
                b_[k_].is = b_[k_].ms = _mm256_setzero_si256();                                 \
                b_[k_].d = b_[k_].dmin = 0.0f;                                                  \
            }                                                                                   \
            for (int k_ = 0; k_ < left_; k_++) BLK(x, y, i_ + k_, &b_[k_]);                     \
            sum_ = kq_add4(sum_, b_, left_, HAS_MIN);                                           \
        }                                                                                       \
        *s = sum_;                                                                              \
    } while (0)

/* dd = k4_dmin(...): d in lane 0, dmin in lane 1 */
static inline float dd_d(__m128 dd) { return _mm_cvtss_f32(dd); }
static inline float dd_dmin(__m128 dd) { return _mm_cvtss_f32(_mm_movehdup_ps(dd)); }

/* [d·dy, dmin·dy, 0, 0] from the two fp16 fields at p (d, then dmin) and the activation scale */
static inline __m128 k4_dmin(const uint16_t *p, float dy) {
    uint32_t u;
    memcpy(&u, p, 4);
    return _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi32_si128((int)u)), _mm_set1_ps(dy));
}

/* dmin (lane 1 of k4_dmin's result) in all 8 lanes */
static inline __m256 bcast_dmin(__m128 dd) { return _mm256_broadcastss_ps(_mm_movehdup_ps(dd)); }

/* The 16 signed scales of a Q3_K block from the 12 bytes at p + 2 (p = 2 bytes before the
 * scales, so the 16-byte load stays inside the block). Dwords u0 u1 u2, see kquants.h:
 *   S0..3 = (u0 & 0f) | ((u2 << 4) & 30)      S4..7   = (u1 & 0f) | ((u2 << 2) & 30)
 *   S8..11 = ((u0 >> 4) & 0f) | (u2 & 30)     S12..15 = ((u1 >> 4) & 0f) | ((u2 >> 2) & 30) */
static inline __m128i k3_scales(const uint8_t *p) {
    const __m128i u = _mm_srli_si128(_mm_loadu_si128((const __m128i *)p), 2);
    const __m128i lo = _mm_and_si128(_mm_srlv_epi32(_mm_shuffle_epi32(u, _MM_SHUFFLE(1, 0, 1, 0)),
                                                    _mm_setr_epi32(0, 0, 4, 4)),
                                     _mm_set1_epi32(0x0f0f0f0f));
    const __m128i u2 = _mm_shuffle_epi32(u, _MM_SHUFFLE(2, 2, 2, 2));
    const __m128i hi = _mm_and_si128(_mm_srlv_epi32(_mm_sllv_epi32(u2, _mm_setr_epi32(4, 2, 0, 0)),
                                                    _mm_setr_epi32(0, 0, 0, 2)),
                                     _mm_set1_epi32(0x30303030));
    return _mm_sub_epi8(_mm_or_si128(lo, hi), _mm_set1_epi8(32));
}

/* The 12 scale bytes as 16 bytes: sc0..7, m0..7 (see pg_k4_unpack_scales). The 16-byte load
 * reads 4 bytes past the scales, still inside the block (the quants follow). Dwords u0 u1 u2:
 *   sc0..3 = u0 & 3f                    sc4..7 = (u2 & 0f) | ((u0 >> 2) & 30)
 *   m0..3  = u1 & 3f                    m4..7  = ((u2 >> 4) & 0f) | ((u1 >> 2) & 30) */
static inline __m128i k4_scales(const uint8_t *b) {
    const __m128i u = _mm_loadu_si128((const __m128i *)b);
    /* dwords u0, u2, u1, u2 >> 4 */
    const __m128i a = _mm_srlv_epi32(_mm_shuffle_epi32(u, _MM_SHUFFLE(2, 1, 2, 0)),
                                     _mm_setr_epi32(0, 0, 0, 4));
    const __m128i h = _mm_srli_epi32(_mm_shuffle_epi32(u, _MM_SHUFFLE(1, 1, 0, 0)), 2);
    const __m128i lo = _mm_and_si128(a, _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f,
                                                       0x0f0f0f0f));
    const __m128i hi = _mm_and_si128(h, _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
    return _mm_or_si128(lo, hi);
}

/* min term of one Q4_K/Q5_K block: 8 int32 lanes, lane j = m_j·(bsums_2j + bsums_2j+1) */
static inline __m256i k4_mins(__m128i sm, const int16_t *bsums) {
    const __m128i dup = _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
    const __m256i m16 = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(sm, dup));
    return _mm256_madd_epi16(loadu(bsums), m16);
}

#endif
