// Dequantization of ggml blocks read from the word array `data_a` (declare it before including).
// Layouts: docs/FORMATS.md §2.2-2.3 (byte-identical to GGUF).
//
// One of TYPE_Q4_0, TYPE_Q4_1, TYPE_Q5_0, TYPE_Q5_1, TYPE_Q8_0, TYPE_Q4_K, TYPE_Q5_K, TYPE_Q6_K,
// TYPE_IQ4_NL, TYPE_IQ4_XS, TYPE_MXFP4
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

#else
#error "dequant.glsl: define one TYPE_*"
#endif
