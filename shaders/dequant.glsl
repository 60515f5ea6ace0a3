// Dequantization of ggml blocks read from the word array `data_a` (declare it before including).
// Layouts: docs/FORMATS.md §2.2-2.3 (byte-identical to GGUF).
//
// One of TYPE_Q4_0, TYPE_Q4_1, TYPE_Q5_0, TYPE_Q5_1, TYPE_Q8_0, TYPE_Q4_K, TYPE_Q5_K, TYPE_Q6_K,
// TYPE_IQ4_NL, TYPE_IQ4_XS, TYPE_MXFP4, TYPE_IQ2_XXS, TYPE_IQ2_XS, TYPE_IQ2_S, TYPE_IQ3_XXS,
// TYPE_IQ3_S, TYPE_IQ1_S, TYPE_IQ1_M, TYPE_TQ1_0, TYPE_TQ2_0
// (quantized: QK elements in QBYTES bytes; dequant4(b, j) returns elements j..j+3 of the block
// at byte offset b, j % 4 == 0), or TYPE_F32 / TYPE_F16 (plain: load_a(i) reads element i of the
// array, i in elements).
//
// Every scale is computed in fp32 first (d*sc, dmin*m), then one multiply (and one subtract) per
// element, the order ggml's CPU code uses.

#if defined(TYPE_F32)
#define IS_FLOAT_TYPE 1
float load_a(uint i) { return uintBitsToFloat(data_a[i]); }
#elif defined(TYPE_F16)
#define IS_FLOAT_TYPE 1
float load_a(uint i) { return f16_to_f32((data_a[i >> 1] >> ((i & 1u) << 4)) & 0xffffu); }

#elif defined(TYPE_Q4_0)
#define QK 32u
#define QBYTES 18u
vec4 dequant4(uint b, uint j) {
    const float d = RD_F16(data_a, b);
    const uint q = RD_U32A2(data_a, b + 2u + (j & 15u));
    const uint sh = j < 16u ? 0u : 4u;
    const uvec4 n = (uvec4(q, q >> 8, q >> 16, q >> 24) >> sh) & 0xfu;
    return (vec4(n) - 8.0) * d;
}

#elif defined(TYPE_Q4_1)
#define QK 32u
#define QBYTES 20u
vec4 dequant4(uint b, uint j) {
    const float d = RD_F16(data_a, b);
    const float m = RD_F16(data_a, b + 2u);
    const uint q = RD_U32A2(data_a, b + 4u + (j & 15u));
    const uint sh = j < 16u ? 0u : 4u;
    const uvec4 n = (uvec4(q, q >> 8, q >> 16, q >> 24) >> sh) & 0xfu;
    return vec4(n) * d + m;
}

#elif defined(TYPE_Q5_0)
#define QK 32u
#define QBYTES 22u
vec4 dequant4(uint b, uint j) {
    const float d = RD_F16(data_a, b);
    const uint qh = RD_U32A2(data_a, b + 2u) >> j;
    const uint q = RD_U32A2(data_a, b + 6u + (j & 15u));
    const uint sh = j < 16u ? 0u : 4u;
    const uvec4 lo = (uvec4(q, q >> 8, q >> 16, q >> 24) >> sh) & 0xfu;
    const uvec4 hi = (uvec4(qh, qh >> 1, qh >> 2, qh >> 3) & 1u) << 4;
    return (vec4(lo | hi) - 16.0) * d;
}

#elif defined(TYPE_Q5_1)
#define QK 32u
#define QBYTES 24u
vec4 dequant4(uint b, uint j) {
    const float d = RD_F16(data_a, b);
    const float m = RD_F16(data_a, b + 2u);
    const uint qh = RD_U32A2(data_a, b + 4u) >> j;
    const uint q = RD_U32A2(data_a, b + 8u + (j & 15u));
    const uint sh = j < 16u ? 0u : 4u;
    const uvec4 lo = (uvec4(q, q >> 8, q >> 16, q >> 24) >> sh) & 0xfu;
    const uvec4 hi = (uvec4(qh, qh >> 1, qh >> 2, qh >> 3) & 1u) << 4;
    return vec4(lo | hi) * d + m;
}

#elif defined(TYPE_Q8_0)
#define QK 32u
#define QBYTES 34u
vec4 dequant4(uint b, uint j) {
    const float d = RD_F16(data_a, b);
    const uint q = RD_U32A2(data_a, b + 2u + j);
    return vec4(sbyte(q, 0u), sbyte(q, 1u), sbyte(q, 2u), sbyte(q, 3u)) * d;
}

#elif defined(TYPE_Q4_K) || defined(TYPE_Q5_K)
#define QK 256u
#if defined(TYPE_Q4_K)
#define QBYTES 144u
#define QS_OFF 16u
#else
#define QBYTES 176u
#define QS_OFF 48u
#endif
// 6-bit scale and min of sub-block s (0..7) from the 12 scale bytes at b + 4.
uvec2 scale_min_k4(uint b, uint s) {
    const uint sb = b + 4u;
    if (s < 4u) {
        return uvec2(RD_U8(data_a, sb + s) & 63u, RD_U8(data_a, sb + s + 4u) & 63u);
    }
    const uint x = RD_U8(data_a, sb + s + 4u);
    return uvec2((x & 0xfu) | ((RD_U8(data_a, sb + s - 4u) >> 6) << 4),
                 (x >> 4) | ((RD_U8(data_a, sb + s) >> 6) << 4));
}
vec4 dequant4(uint b, uint j) {
    const uint c = j >> 6;                 // 64-element chunk
    const uint hi = (j & 32u) >> 5;        // high nibble half of the chunk
    const uint l = j & 31u;
    const uint s = 2u * c + hi;            // sub-block
    const uvec2 sm = scale_min_k4(b, s);
    const float d = RD_F16(data_a, b) * float(sm.x);
    const float m = RD_F16(data_a, b + 2u) * float(sm.y);
    const uint q = RD_U32A2(data_a, b + QS_OFF + 32u * c + l) >> (4u * hi);
    uvec4 n = uvec4(q, q >> 8, q >> 16, q >> 24) & 0xfu;
#if defined(TYPE_Q5_K)
    const uint h = RD_U32A2(data_a, b + 16u + l) >> s;
    n |= (uvec4(h, h >> 8, h >> 16, h >> 24) & 1u) << 4;
#endif
    return vec4(n) * d - m;
}

#elif defined(TYPE_Q6_K)
#define QK 256u
#define QBYTES 210u
vec4 dequant4(uint b, uint j) {
    const uint n = j >> 7;
    const uint r = j & 127u;
    const uint g = r >> 5;
    const uint l = r & 31u;
    const uint ql = RD_U32A2(data_a, b + 64u * n + 32u * (g & 1u) + l) >> (4u * (g >> 1));
    const uint qh = RD_U32A2(data_a, b + 128u + 32u * n + l) >> (2u * g);
    const uvec4 lo = uvec4(ql, ql >> 8, ql >> 16, ql >> 24) & 0xfu;
    const uvec4 hi = (uvec4(qh, qh >> 8, qh >> 16, qh >> 24) & 3u) << 4;
    const int sc = sbyte(RD_U8(data_a, b + 192u + (j >> 4)), 0u);
    const float d = RD_F16(data_a, b + 208u) * float(sc);
    return (vec4(ivec4(lo | hi)) - 32.0) * d;
}
#elif defined(TYPE_IQ4_NL) || defined(TYPE_IQ4_XS)
// non-linear 4-bit codes (ggml's kvalues_iq4nl); nibbles per 32 elements laid out as Q4_0
const float KV_IQ4NL[16] = float[16](-127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0,
                                     1.0, 13.0, 25.0, 38.0, 53.0, 69.0, 89.0, 113.0);
vec4 iq4_codes(uint q, uint sh) {
    const uvec4 n = (uvec4(q, q >> 8, q >> 16, q >> 24) >> sh) & 0xfu;
    return vec4(KV_IQ4NL[n.x], KV_IQ4NL[n.y], KV_IQ4NL[n.z], KV_IQ4NL[n.w]);
}
#if defined(TYPE_IQ4_NL)
#define QK 32u
#define QBYTES 18u
vec4 dequant4(uint b, uint j) {
    const float d = RD_F16(data_a, b);
    return iq4_codes(RD_U32A2(data_a, b + 2u + (j & 15u)), j < 16u ? 0u : 4u) * d;
}
#else
#define QK 256u
#define QBYTES 136u
// x = (d * (ls - 32)) * code: the sub-block scale formed in fp32 first, as ggml
vec4 dequant4(uint b, uint j) {
    const uint ib = j >> 5;
    const uint ls = ((RD_U8(data_a, b + 4u + (ib >> 1)) >> (4u * (ib & 1u))) & 0xfu)
                  | (((RD_U16(data_a, b + 2u) >> (2u * ib)) & 3u) << 4);
    const float dl = RD_F16(data_a, b) * float(int(ls) - 32);
    const uint l = j & 31u;
    return iq4_codes(RD_U32A2(data_a, b + 8u + 16u * ib + (l & 15u)), l < 16u ? 0u : 4u) * dl;
}
#endif

#elif defined(TYPE_MXFP4)
#define QK 32u
#define QBYTES 17u
// E2M1 codes doubled (ggml's kvalues_mxfp4) times 2^(e - 128): E8M0 halved; e < 2 are the
// subnormal scales (exact as bits; a device that flushes denormals gives 0 for them)
const float KV_MXFP4[16] = float[16](0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0,
                                     0.0, -1.0, -2.0, -3.0, -4.0, -6.0, -8.0, -12.0);
vec4 dequant4(uint b, uint j) {
    const uint e = RD_U8(data_a, b);
    const float d = uintBitsToFloat(e < 2u ? 0x00200000u << e : (e - 1u) << 23);
    const uint q = RD_U32U(data_a, b + 1u + (j & 15u));
    const uvec4 n = (uvec4(q, q >> 8, q >> 16, q >> 24) >> (j < 16u ? 0u : 4u)) & 0xfu;
    return vec4(KV_MXFP4[n.x], KV_MXFP4[n.y], KV_MXFP4[n.z], KV_MXFP4[n.w]) * d;
}

#elif defined(TYPE_IQ2_XXS) || defined(TYPE_IQ2_XS) || defined(TYPE_IQ2_S) \
    || defined(TYPE_IQ3_XXS) || defined(TYPE_IQ3_S) || defined(TYPE_IQ1_S) || defined(TYPE_IQ1_M)
// The codebook i-quants (native/src/quants_iq_grid.c): per group of 8 elements a codebook entry
// (8 levels, or two entries of 4 for IQ3_*), 8 sign bits (IQ1: a delta sign) and a scale nibble s;
// x = db * level with ggml's scale expression per type, the sign flipped after the multiply.
// The codebooks are one table the backend binds at binding 5 (iq_grids.glsl).
#define QK 256u
#include "iq_grids.glsl"
#if defined(TYPE_IQ2_XXS) || defined(TYPE_IQ2_XS) || defined(TYPE_IQ3_XXS)
uint ksigns(uint i) { return (KSIGNS_IQ2XS(i >> 2) >> (8u * (i & 3u))) & 0xffu; }
#endif
// levels (unsigned bytes of `w`) times db, negated where bit k of `sg` (4 bits) is set
vec4 signed_levels(uint w, uint sg, float db) {
    const vec4 v = vec4(float(w & 0xffu), float((w >> 8) & 0xffu), float((w >> 16) & 0xffu),
                        float(w >> 24)) * db;
    return vec4((sg & 1u) != 0u ? -v.x : v.x, (sg & 2u) != 0u ? -v.y : v.y,
                (sg & 4u) != 0u ? -v.z : v.z, (sg & 8u) != 0u ? -v.w : v.w);
}
#if defined(TYPE_IQ2_XXS)
#define QBYTES 66u
vec4 dequant4(uint b, uint j) {
    const uint ib = j >> 5, l = (j >> 3) & 3u, h = (j >> 2) & 1u;
    const uint a0 = RD_U32A2(data_a, b + 2u + 8u * ib), a1 = RD_U32A2(data_a, b + 6u + 8u * ib);
    const uint idx = (a0 >> (8u * l)) & 0xffu;
    const float db = RD_F16(data_a, b) * (0.5 + float(a1 >> 28)) * 0.25;
    const uint sg = ksigns((a1 >> (7u * l)) & 127u) >> (4u * h);
    return signed_levels(IQ2XXS_GRID(2u * idx + h), sg, db);
}
#elif defined(TYPE_IQ2_XS)
#define QBYTES 74u
vec4 dequant4(uint b, uint j) {
    const uint ib = j >> 5, l = (j >> 3) & 3u, h = (j >> 2) & 1u;
    const uint v = RD_U16(data_a, b + 2u + 2u * (4u * ib + l));
    const uint sc = RD_U8(data_a, b + 66u + ib);
    const float db = RD_F16(data_a, b) * (0.5 + float(l < 2u ? sc & 0xfu : sc >> 4)) * 0.25;
    return signed_levels(IQ2XS_GRID(2u * (v & 511u) + h), ksigns(v >> 9) >> (4u * h), db);
}
#elif defined(TYPE_IQ2_S)
#define QBYTES 82u
vec4 dequant4(uint b, uint j) {
    const uint ib = j >> 5, l = (j >> 3) & 3u, h = (j >> 2) & 1u;
    const uint idx = RD_U8(data_a, b + 2u + 4u * ib + l)
                   | ((RD_U8(data_a, b + 66u + ib) << (8u - 2u * l)) & 0x300u);
    const uint sg = RD_U8(data_a, b + 34u + 4u * ib + l) >> (4u * h);
    const uint sc = RD_U8(data_a, b + 74u + ib);
    const float db = RD_F16(data_a, b) * (0.5 + float(l < 2u ? sc & 0xfu : sc >> 4)) * 0.25;
    return signed_levels(IQ2S_GRID(2u * idx + h), sg, db);
}
#elif defined(TYPE_IQ3_XXS)
#define QBYTES 98u
vec4 dequant4(uint b, uint j) {
    const uint ib = j >> 5, l = (j >> 3) & 3u, h = (j >> 2) & 1u;
    const uint aux = RD_U32A2(data_a, b + 66u + 4u * ib);
    const uint idx = RD_U8(data_a, b + 2u + 8u * ib + 2u * l + h);
    const float db = RD_F16(data_a, b) * (0.5 + float(aux >> 28)) * 0.5;
    const uint sg = ksigns((aux >> (7u * l)) & 127u) >> (4u * h);
    return signed_levels(IQ3XXS_GRID(idx), sg, db);
}
#elif defined(TYPE_IQ3_S)
#define QBYTES 110u
vec4 dequant4(uint b, uint j) {
    const uint ib = j >> 5, l = (j >> 3) & 3u, h = (j >> 2) & 1u;
    const uint qh = RD_U8(data_a, b + 66u + ib);
    const uint idx = RD_U8(data_a, b + 2u + 8u * ib + 2u * l + h)
                   | ((qh << (8u - 2u * l - h)) & 256u);
    const uint sg = RD_U8(data_a, b + 74u + 4u * ib + l) >> (4u * h);
    const uint sc = RD_U8(data_a, b + 106u + (ib >> 1));
    const float db = RD_F16(data_a, b) * float(1u + 2u * ((ib & 1u) != 0u ? sc >> 4 : sc & 0xfu));
    return signed_levels(IQ3S_GRID(idx), sg, db);
}
#else
// IQ1_*: signed levels -1, 0, 1; x = (d * (2s + 1)) * (level +- 1/8)
vec4 iq1_levels(uint idx, uint h, float dl, float delta) {
    const uint w = IQ1S_GRID(2u * idx + h);
    return dl * (vec4(float(sbyte(w, 0u)), float(sbyte(w, 1u)), float(sbyte(w, 2u)),
                      float(sbyte(w, 3u))) + delta);
}
#if defined(TYPE_IQ1_S)
#define QBYTES 50u
vec4 dequant4(uint b, uint j) {
    const uint ib = j >> 5, l = (j >> 3) & 3u, h = (j >> 2) & 1u;
    const uint qh = RD_U16(data_a, b + 34u + 2u * ib);
    const uint idx = RD_U8(data_a, b + 2u + 4u * ib + l) | (((qh >> (3u * l)) & 7u) << 8);
    const float dl = RD_F16(data_a, b) * float(2u * ((qh >> 12) & 7u) + 1u);
    return iq1_levels(idx, h, dl, (qh & 0x8000u) != 0u ? -0.125 : 0.125);
}
#else
#define QBYTES 56u
vec4 dequant4(uint b, uint j) {
    const uint ib = j >> 5, l = (j >> 3) & 3u, h = (j >> 2) & 1u;
    const uint d16 = (RD_U16(data_a, b + 48u) >> 12) | ((RD_U16(data_a, b + 50u) >> 8) & 0xf0u)
                   | ((RD_U16(data_a, b + 52u) >> 4) & 0xf00u)
                   | (RD_U16(data_a, b + 54u) & 0xf000u);
    const uint qh = RD_U8(data_a, b + 32u + 2u * ib + (l >> 1));
    const uint idx = RD_U8(data_a, b + 4u * ib + l) | ((qh << ((l & 1u) != 0u ? 4u : 8u)) & 0x700u);
    const bool neg = (qh & ((l & 1u) != 0u ? 0x80u : 0x08u)) != 0u;
    const uint sc = RD_U16(data_a, b + 48u + 2u * (ib >> 1));
    const uint s = (sc >> (6u * (ib & 1u) + (l < 2u ? 0u : 3u))) & 7u;
    const float dl = f16_to_f32(d16) * float(2u * s + 1u);
    return iq1_levels(idx, h, dl, neg ? -0.125 : 0.125);
}
#endif
#endif

#elif defined(TYPE_TQ1_0) || defined(TYPE_TQ2_0)
// ternary levels -1, 0, 1 times d (native/src/quants_tq.c)
#define QK 256u
#if defined(TYPE_TQ2_0)
#define QBYTES 66u
// element e: byte 32 * (e / 128) + e % 32, bits 2 * ((e / 32) % 4)
vec4 dequant4(uint b, uint j) {
    const uint q = RD_U32A2(data_a, b + 32u * (j >> 7) + (j & 31u)) >> (2u * ((j >> 5) & 3u));
    const uvec4 n = uvec4(q, q >> 8, q >> 16, q >> 24) & 3u;
    return (vec4(n) - 1.0) * RD_F16(data_a, b + 64u);
}
#else
#define QBYTES 54u
// the n-th trit (0..2) of a packed byte: ((byte * 3^n mod 256) * 3) >> 8
float trit(uint byte_, uint n) {
    const uint p3[5] = uint[5](1u, 3u, 9u, 27u, 81u);
    return float((((byte_ * p3[n]) & 0xffu) * 3u) >> 8) - 1.0;
}
// elements 0..159: 5 trits of bytes 0..31; 160..239: 5 of bytes 32..47; 240..255: 4 of qh[0..3]
vec4 dequant4(uint b, uint j) {
    uint off, n;
    if (j < 160u) {
        off = j & 31u; n = j >> 5;
    } else if (j < 240u) {
        off = 32u + ((j - 160u) & 15u); n = (j - 160u) >> 4;
    } else {
        off = 48u; n = (j - 240u) >> 2;
    }
    const uint q = RD_U32A2(data_a, b + off);
    const float d = RD_F16(data_a, b + 52u);
    return vec4(trit(q & 0xffu, n), trit((q >> 8) & 0xffu, n), trit((q >> 16) & 0xffu, n),
                trit(q >> 24, n)) * d;
}
#endif

#else
#error "dequant.glsl: define one TYPE_*"
#endif
