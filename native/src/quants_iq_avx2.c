/* IQ4_NL, IQ4_XS and MXFP4: the AVX2 kernels (the body: iq4_x86_body.h), integer dots through
 * maddubs, and eight-row decode kernels of their own (below: IQ4_NL and MXFP4 two blocks per
 * register, IQ4_XS with the activations regrouped once per super-block). The avx512 path takes
 * the VNNI variants (quants_iq_avx512.c) where the CPU has AVX512-VNNI, these otherwise. */
#define PG_X86_DOT_US(u, s) _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
#define PG_X86_DOT_Q4_0(q, a)                                                                   \
    _mm256_madd_epi16(_mm256_sub_epi16(_mm256_maddubs_epi16(q, a),                              \
                                       _mm256_maddubs_epi16(_mm256_set1_epi8(8), a)),           \
                      _mm256_set1_epi16(1))
#define IQ4_DOT_SCALED(acc, u, s, sc) \
    _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), sc))
#include "iq4_x86_body.h"

/* ---- IQ4_NL and MXFP4 · Q8_0, eight rows two blocks at a time ---------------------------------
 * The per-block kernel of the body spends as much on the fold of eight rows' partials and the
 * gather of eight scales per block as on the dot. Here a 256-bit register holds two consecutive
 * blocks of a row (128-bit lane k = block b + k's 16 code bytes, low nibbles elements 0..15,
 * high nibbles 16..31) and the activations are regrouped the same way once per two blocks for
 * the eight rows. maddubs takes |a| (once per activation block) and v with a's sign; each row
 * leaves lane k = 4 partials of block k, a transpose-add of four rows gives lane k = rows 0..3's
 * exact sums of block k (P; rows 4..7: Q), and [P lane k | Q lane k] is block k's eight rows.
 * The scales: scalar loads shifted into one 64-bit word per block (rows' d or e side by side,
 * 16 or 8 bits each; the integer units are idle, the vector ones are not), one vector step per
 * block (cvtph, or E8M0 -> fp32) for the eight rows. MXFP4's values (|v| <= 12) go + 12 into
 * maddubs without the sign step (mx2_dot). Each block's term
 * (d_y·d_x)·isum is the scalar kernel's, added in block order. Loads stay in the two blocks
 * (36 or 34 bytes); an odd last block goes through the per-block dot. */

/* the 16 bytes at p in lane 0, at p + stride in lane 1 */
static inline __m256i load2x16(const uint8_t *p, size_t stride) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)p)),
                                   _mm_loadu_si128((const __m128i *)(p + stride)), 1);
}

static inline __m256i tr2_add32(__m256i a, __m256i b) {
    return _mm256_add_epi32(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b));
}
static inline __m256i tr2_add64(__m256i a, __m256i b) {
    return _mm256_add_epi32(_mm256_unpacklo_epi64(a, b), _mm256_unpackhi_epi64(a, b));
}

/* Σ v·a of a 16-byte half as 8 int32 partials: |a| (aa, once per activation block) times v
 * with a's sign (v >= −127: exact; pairs of |a|·|v| <= 2·128·127 fit int16) */
static inline __m256i nl2_dot(__m256i v, __m256i a, __m256i aa) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(aa, _mm256_sign_epi8(v, a)), _mm256_set1_epi16(1));
}

/* MXFP4's values (|v| <= 12) + 12 are unsigned bytes 0..24: maddubs takes them against a as it
 * is (no sign step per row), and the pairs (<= 2·24·128) of both halves add up in int16 (into
 * int32 after two rows' transpose: tr2_add32_mx); Σ v·a = Σ (v + 12)·a − 12·Σa, the last term
 * once per activation block */
#define MX2_OFF 12
static inline __m256i mx2_dot(__m256i ulo, __m256i uhi, __m256i alo, __m256i ahi) {
    return _mm256_add_epi16(_mm256_maddubs_epi16(ulo, alo), _mm256_maddubs_epi16(uhi, ahi));
}

/* tr2_add32 of two rows' mx2_dot words (<= 4·24·128 each): the transpose on the int16 pairs,
 * their sums (<= 24576) into int32 by one madd for the two rows */
static inline __m256i tr2_add32_mx(__m256i a, __m256i b) {
    return _mm256_madd_epi16(_mm256_add_epi16(_mm256_unpacklo_epi32(a, b),
                                              _mm256_unpackhi_epi32(a, b)),
                             _mm256_set1_epi16(1));
}

static inline __attribute__((always_inline)) void nl2_rows8_c(int64_t n, float *s, size_t bs,
        const void *vx, size_t bx, const void *vy, size_t by, const int C, const int mx) {
    const char *x = vx;
    const size_t BS = mx ? sizeof(pg_block_mxfp4) : sizeof(pg_block_iq4_nl), QO = mx ? 1 : 2;
    const int8_t *kv = mx ? pg_kv_mxfp4 : pg_kv_iq4nl;
    const __m256i m4 = _mm256_set1_epi8(0xF);
    /* MXFP4: the values + 12 (0..24, unsigned) */
    const __m256i lut = mx ? _mm256_add_epi8(iqx_table(kv), _mm256_set1_epi8(MX2_OFF)) : iqx_table(kv);
    __m256 acc[IQX_MAX_C];
    IQX_UNROLL for (int j = 0; j < C; j++) acc[j] = _mm256_setzero_ps();
    const int64_t nb = n / 32, nb2 = nb & ~(int64_t)1;
    const size_t share = iqx_share(bx, nb);
    for (int64_t b = 0; b < nb2; b += 2) {
        iqx_prefetch(vx, bx, b, share);
        iqx_prefetch(vx, bx, b + 1, share);
        __m256i alo[IQX_MAX_C], ahi[IQX_MAX_C], aalo[IQX_MAX_C], aahi[IQX_MAX_C], corr[IQX_MAX_C];
        IQX_UNROLL for (int j = 0; j < C; j++) {
            const uint8_t *yb = (const uint8_t *)vy + (size_t)j * by + (size_t)b * sizeof(pg_block_q8_0);
            alo[j] = load2x16(yb + 2, sizeof(pg_block_q8_0));
            ahi[j] = load2x16(yb + 18, sizeof(pg_block_q8_0));
            if (mx) {
                /* 12·Σa of block k in every int32 of lane k */
                const __m256i ones = _mm256_set1_epi8(1);
                __m256i sa = _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(ones, alo[j]),
                                                                _mm256_maddubs_epi16(ones, ahi[j])),
                                               _mm256_set1_epi16(1));
                sa = _mm256_add_epi32(sa, _mm256_shuffle_epi32(sa, _MM_SHUFFLE(1, 0, 3, 2)));
                sa = _mm256_add_epi32(sa, _mm256_shuffle_epi32(sa, _MM_SHUFFLE(2, 3, 0, 1)));
                corr[j] = _mm256_mullo_epi32(sa, _mm256_set1_epi32(MX2_OFF));
            } else {
                aalo[j] = _mm256_abs_epi8(alo[j]);
                aahi[j] = _mm256_abs_epi8(ahi[j]);
            }
        }
        __m256i half[IQX_MAX_C][2], pq[IQX_MAX_C][2];
        /* block k's scales of the eight rows: sc[k] (MXFP4: sc[k][0], a byte per row) */
        uint64_t sc[2][2] = {{0, 0}, {0, 0}};
        IQX_UNROLL for (int r = 0; r < 8; r += 2) {
            __m256i d0[IQX_MAX_C], d1[IQX_MAX_C];
            IQX_UNROLL for (int h = 0; h < 2; h++) {
                const uint8_t *xr = (const uint8_t *)x + (size_t)(r + h) * bx + (size_t)b * BS;
                const __m256i q = load2x16(xr + QO, BS);
                const __m256i lo = _mm256_and_si256(q, m4);
                const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                const __m256i vlo = _mm256_shuffle_epi8(lut, lo), vhi = _mm256_shuffle_epi8(lut, hi);
                IQX_UNROLL for (int j = 0; j < C; j++) {
                    const __m256i d = mx ? mx2_dot(vlo, vhi, alo[j], ahi[j])
                                         : _mm256_add_epi32(nl2_dot(vlo, alo[j], aalo[j]),
                                                            nl2_dot(vhi, ahi[j], aahi[j]));
                    if (h) d1[j] = d; else d0[j] = d;
                }
                /* the row's two scales into byte (e) or word (d) r of the blocks' words */
                const int sh = mx ? 8 * (r + h) : 16 * ((r + h) % 4);
                uint16_t v0, v1;
                if (mx) {
                    v0 = xr[0];
                    v1 = xr[17];
                } else {
                    memcpy(&v0, xr, 2);
                    memcpy(&v1, xr + 18, 2);
                }
                sc[0][mx ? 0 : (r + h) / 4] |= (uint64_t)v0 << sh;
                sc[1][mx ? 0 : (r + h) / 4] |= (uint64_t)v1 << sh;
            }
            IQX_UNROLL for (int j = 0; j < C; j++)
                half[j][(r / 2) % 2] = mx ? tr2_add32_mx(d0[j], d1[j]) : tr2_add32(d0[j], d1[j]);
            if (r % 4 == 2)
                IQX_UNROLL for (int j = 0; j < C; j++) {
                    pq[j][r / 4] = tr2_add64(half[j][0], half[j][1]);
                    if (mx) pq[j][r / 4] = _mm256_sub_epi32(pq[j][r / 4], corr[j]);
                }
        }
        __m256 dx[2];
        if (mx) {
            dx[0] = e8m0x8_lanes(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc[0][0])));
            dx[1] = e8m0x8_lanes(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc[1][0])));
        } else {
            dx[0] = _mm256_cvtph_ps(_mm_set_epi64x((long long)sc[0][1], (long long)sc[0][0]));
            dx[1] = _mm256_cvtph_ps(_mm_set_epi64x((long long)sc[1][1], (long long)sc[1][0]));
        }
        IQX_UNROLL for (int j = 0; j < C; j++) {
            const pg_block_q8_0 *yb = (const pg_block_q8_0 *)((const char *)vy + (size_t)j * by) + b;
            const __m256i z0 = _mm256_permute2x128_si256(pq[j][0], pq[j][1], 0x20);
            const __m256i z1 = _mm256_permute2x128_si256(pq[j][0], pq[j][1], 0x31);
            acc[j] = _mm256_add_ps(acc[j], _mm256_mul_ps(_mm256_mul_ps(
                _mm256_set1_ps(h2f(yb[0].d)), dx[0]), _mm256_cvtepi32_ps(z0)));
            acc[j] = _mm256_add_ps(acc[j], _mm256_mul_ps(_mm256_mul_ps(
                _mm256_set1_ps(h2f(yb[1].d)), dx[1]), _mm256_cvtepi32_ps(z1)));
        }
    }
    IQX_UNROLL for (int j = 0; j < C; j++) {
        float *sj = (float *)((char *)s + (size_t)j * bs);
        _mm256_storeu_ps(sj, acc[j]);
        if (nb2 == nb) continue;
        const pg_block_q8_0 *yb = (const pg_block_q8_0 *)((const char *)vy + (size_t)j * by) + nb2;
        for (int r = 0; r < 8; r++) {
            const char *xr = x + (size_t)r * bx + (size_t)nb2 * BS;
            if (mx) {
                const pg_block_mxfp4 *xb = (const pg_block_mxfp4 *)xr;
                sj[r] += (h2f(yb->d) * pg_e8m0_half(xb->e)) * (float)hsum_epi32(mxfp4_block(xb, yb));
            } else {
                const pg_block_iq4_nl *xb = (const pg_block_iq4_nl *)xr;
                sj[r] += (h2f(yb->d) * h2f(xb->d)) * (float)hsum_epi32(iq4_nl_block(xb, yb));
            }
        }
    }
}

static inline __attribute__((always_inline)) void iq4nl_rows8_2b_c(int64_t n, float *s,
        size_t bs, const void *vx, size_t bx, const void *vy, size_t by, const int C) {
    nl2_rows8_c(n, s, bs, vx, bx, vy, by, C, 0);
}
static inline __attribute__((always_inline)) void mxfp4_rows8_2b_c(int64_t n, float *s,
        size_t bs, const void *vx, size_t bx, const void *vy, size_t by, const int C) {
    nl2_rows8_c(n, s, bs, vx, bx, vy, by, C, 1);
}
IQX_ROWS8_DISPATCH(iq4nl_rows8_2b)
IQX_ROWS8_DISPATCH(mxfp4_rows8_2b)
IQX_GEMM(gemm_iq4_nl_q8_0_2b, iq4nl_rows8_2b, vec_dot_iq4_nl_q8_0)
IQX_GEMM(gemm_mxfp4_q8_0_2b, mxfp4_rows8_2b, vec_dot_mxfp4_q8_0)

/* ---- IQ4_XS · Q8_K, eight rows: the activations regrouped once per super-block -----------------
 * 32 code bytes hold sub-blocks 2k (lane 0) and 2k + 1 (lane 1): their low nibbles (elements
 * 0..15) and high nibbles (16..31) are one register each. The activations are regrouped to the
 * same lanes, with their absolute values, once per super-block for the eight rows; a row then
 * costs per pair of sub-blocks two value lookups, and per activation row two signs, two maddubs
 * (|a| times v with a's sign: exact, pairs <= 2·128·127) and two madds by the scale pair — where
 * the body's per-row kernel unpacks each sub-block on its own and takes |v|, ±a per activation
 * row. Σ_ib (ls_ib − 32)·isum_ib is exact in int32; the super-block term and its fold are the
 * body's (IQX_ROWS8_Q8K): the scalar bits. */

/* vpshufb masks: lane 0 = int16 number 2k of the (lane-repeated) scales, lane 1 = number 2k + 1 */
#define XS2_W(k) 2 * (k), 2 * (k) + 1
#define XS2_L(k) XS2_W(k), XS2_W(k), XS2_W(k), XS2_W(k), XS2_W(k), XS2_W(k), XS2_W(k), XS2_W(k)
static const uint8_t k_xs2_pair[4][32] __attribute__((aligned(32))) = {
    {XS2_L(0), XS2_L(1)}, {XS2_L(2), XS2_L(3)}, {XS2_L(4), XS2_L(5)}, {XS2_L(6), XS2_L(7)},
};

static inline __attribute__((always_inline)) void iq4xs_rows8_2s_c(int64_t n, float *s,
        size_t bs, const void *vx, size_t bx, const void *vy, size_t by, const int C) {
    const char *x = vx;
    const __m256i m4 = _mm256_set1_epi8(0xF), lut = iqx_table(pg_kv_iq4nl);
    __m256 acc[IQX_MAX_C];
    IQX_UNROLL for (int j = 0; j < C; j++) acc[j] = _mm256_setzero_ps();
    const int64_t nb = n / PG_QK_K;
    const size_t share = iqx_share(bx, nb);
    for (int64_t b = 0; b < nb; b++) {
        iqx_prefetch(vx, bx, b, share);
        const pg_block_q8_K *yb[IQX_MAX_C];
        /* [activation row][pair k][lo, hi, |lo|, |hi|] */
        __m256i a[IQX_MAX_C][4][4];
        IQX_UNROLL for (int j = 0; j < C; j++) {
            yb[j] = (const pg_block_q8_K *)((const char *)vy + (size_t)j * by) + b;
            IQX_UNROLL for (int k = 0; k < 4; k++) {
                const __m256i a0 = _mm256_loadu_si256((const __m256i *)(yb[j]->qs + 64 * k));
                const __m256i a1 = _mm256_loadu_si256((const __m256i *)(yb[j]->qs + 64 * k + 32));
                a[j][k][0] = _mm256_permute2x128_si256(a0, a1, 0x20);
                a[j][k][1] = _mm256_permute2x128_si256(a0, a1, 0x31);
                a[j][k][2] = _mm256_abs_epi8(a[j][k][0]);
                a[j][k][3] = _mm256_abs_epi8(a[j][k][1]);
            }
        }
        __m256i is[IQX_MAX_C][8];
        ROWS_UNROLL for (int r = 0; r < 8; r++) {
            const pg_block_iq4_xs *xr = (const pg_block_iq4_xs *)(x + (size_t)r * bx) + b;
            const __m256i sc = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(iq4xs_scales8(xr)));
            __m256i ri[IQX_MAX_C];
            IQX_UNROLL for (int j = 0; j < C; j++) ri[j] = _mm256_setzero_si256();
            IQX_UNROLL for (int k = 0; k < 4; k++) {
                const __m256i q = _mm256_loadu_si256((const __m256i *)(xr->qs + 32 * k));
                const __m256i vlo = _mm256_shuffle_epi8(lut, _mm256_and_si256(q, m4));
                const __m256i vhi = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(q, 4), m4));
                const __m256i s2 = _mm256_shuffle_epi8(sc, _mm256_load_si256((const __m256i *)k_xs2_pair[k]));
                IQX_UNROLL for (int j = 0; j < C; j++) {
                    const __m256i plo = _mm256_maddubs_epi16(a[j][k][2], _mm256_sign_epi8(vlo, a[j][k][0]));
                    const __m256i phi = _mm256_maddubs_epi16(a[j][k][3], _mm256_sign_epi8(vhi, a[j][k][1]));
                    ri[j] = _mm256_add_epi32(ri[j], _mm256_add_epi32(_mm256_madd_epi16(plo, s2),
                                                                     _mm256_madd_epi16(phi, s2)));
                }
            }
            IQX_UNROLL for (int j = 0; j < C; j++) is[j][r] = ri[j];
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
IQX_ROWS8_DISPATCH(iq4xs_rows8_2s)
IQX_GEMM(gemm_iq4_xs_q8_K_2s, iq4xs_rows8_2s, vec_dot_iq4_xs_q8_K)

void pg_fill_iquants_avx2(pg_type_traits *tbl) {
    IQX_SET(tbl, PG_TYPE_IQ4_NL, vec_dot_iq4_nl_q8_0, iq4nl_rows8_2b, gemm_iq4_nl_q8_0_2b);
    IQX_SET(tbl, PG_TYPE_MXFP4, vec_dot_mxfp4_q8_0, mxfp4_rows8_2b, gemm_mxfp4_q8_0_2b);
    IQX_SET(tbl, PG_TYPE_IQ4_XS, vec_dot_iq4_xs_q8_K, iq4xs_rows8_2s, gemm_iq4_xs_q8_K_2s);
}
