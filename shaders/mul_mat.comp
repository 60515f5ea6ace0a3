#version 450
#extension GL_GOOGLE_include_directive : require
// MUL_MAT, tiled form for many activation rows: a workgroup computes a BN (weight rows) x BM
// (activation rows) tile of d, each invocation TN x TM outputs; K is walked in steps of BK with
// both tiles staged in shared memory (weights dequantized once per tile). Same operands and
// push constants as mul_mat_vec.comp; the workgroup size must be (BN/TN) * (BM/TM).
#include "common.glsl"

layout(constant_id = 1) const uint BM = 32;
layout(constant_id = 2) const uint BN = 32;
#define BK 32u
#define TM 4u
#define TN 4u
#define LDS (BK + 1u)

layout(binding = 0) readonly buffer A { uint data_a[]; };
layout(binding = 1) readonly buffer B { uint data_b[]; };
layout(binding = 2) buffer D { uint data_d[]; };

#include "dequant.glsl"

layout(push_constant) uniform P {
    uint K, N, M;
    uint a_off, a_nb1, a_nb2, a_nb3;
    uint r2, r3, B2;
    uint b_off, b_s1, b_s2, b_s3;
    uint d_off, d_s1, d_s2, d_s3;
    uint row0;
} p;

shared float sa[BN * LDS];
shared float sb[BM * LDS];

void main() {
    const uint n0 = gl_WorkGroupID.x * BN;
    const uint m0 = gl_WorkGroupID.y * BM;
    const uint i2 = gl_WorkGroupID.z % p.B2, i3 = gl_WorkGroupID.z / p.B2;
    const uint ab = p.a_off + (i2 / p.r2) * p.a_nb2 + (i3 / p.r3) * p.a_nb3;
    const uint bb = p.b_off + i2 * p.b_s2 + i3 * p.b_s3;
    const uint t = gl_LocalInvocationID.x;
    const uint tx = t % (BN / TN), ty = t / (BN / TN);
    float acc[TM][TN];
    [[unroll]] for (uint i = 0u; i < TM; i++) {
        [[unroll]] for (uint j = 0u; j < TN; j++) acc[i][j] = 0.0;
    }
    for (uint k0 = 0u; k0 < p.K; k0 += BK) {
#ifdef IS_FLOAT_TYPE
        for (uint idx = t; idx < BN * BK; idx += WG_SIZE) {
            const uint r = idx / BK, c = idx % BK;
            const uint n = n0 + r, k = k0 + c;
            sa[r * LDS + c] = (n < p.N && k < p.K) ? load_a(ab + n * p.a_nb1 + k) : 0.0;
        }
#else
        for (uint idx = t; idx < BN * (BK / 4u); idx += WG_SIZE) {
            const uint r = idx / (BK / 4u), c = 4u * (idx % (BK / 4u));
            const uint n = n0 + r, k = k0 + c;
            vec4 v = vec4(0.0);
            if (n < p.N) v = dequant4(ab + n * p.a_nb1 + (k / QK) * QBYTES, k % QK);
            sa[r * LDS + c] = v.x;
            sa[r * LDS + c + 1u] = v.y;
            sa[r * LDS + c + 2u] = v.z;
            sa[r * LDS + c + 3u] = v.w;
        }
#endif
        for (uint idx = t; idx < BM * BK; idx += WG_SIZE) {
            const uint r = idx / BK, c = idx % BK;
            const uint m = m0 + r, k = k0 + c;
            sb[r * LDS + c] = (m < p.M && k < p.K) ? uintBitsToFloat(data_b[bb + m * p.b_s1 + k]) : 0.0;
        }
        barrier();
        for (uint kk = 0u; kk < BK; kk++) {
            float av[TN], bv[TM];
            [[unroll]] for (uint j = 0u; j < TN; j++) av[j] = sa[(tx + j * (BN / TN)) * LDS + kk];
            [[unroll]] for (uint i = 0u; i < TM; i++) bv[i] = sb[(ty + i * (BM / TM)) * LDS + kk];
            [[unroll]] for (uint i = 0u; i < TM; i++) {
                [[unroll]] for (uint j = 0u; j < TN; j++) acc[i][j] += bv[i] * av[j];
            }
        }
        barrier();
    }
    [[unroll]] for (uint i = 0u; i < TM; i++) {
        const uint m = m0 + ty + i * (BM / TM);
        [[unroll]] for (uint j = 0u; j < TN; j++) {
            const uint n = n0 + tx + j * (BN / TN);
            if (m < p.M && n < p.N) {
                data_d[p.d_off + p.row0 + n + m * p.d_s1 + i2 * p.d_s2 + i3 * p.d_s3] = floatBitsToUint(acc[i][j]);
            }
        }
    }
}
