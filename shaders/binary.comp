#version 450
#extension GL_GOOGLE_include_directive : require
// ADD, SUB, MUL, DIV: d = a op b, b broadcast over a (b.ne[i] divides a.ne[i]); F32, any strides
// (in elements). Row grid (common.glsl): one invocation per output element.
#define ROW_GRID
#include "common.glsl"

layout(binding = 0) readonly buffer A { uint data_a[]; };
layout(binding = 1) readonly buffer B { uint data_b[]; };
layout(binding = 2) buffer D { uint data_d[]; };

layout(push_constant) uniform P {
    uint ne0, ne1, ne2, ne3;
    uint a_off, a_s0, a_s1, a_s2, a_s3;
    uint b_ne0, b_ne1, b_ne2, b_ne3;
    uint b_off, b_s0, b_s1, b_s2, b_s3;
    uint d_off, d_s0, d_s1, d_s2, d_s3;
    uint op;          // 0 add, 1 sub, 2 mul, 3 div
} p;

void main() {
    const uint row = grid_row();
    if (row >= p.ne1 * p.ne2 * p.ne3) return;
    const uint i1 = row % p.ne1, i2 = (row / p.ne1) % p.ne2, i3 = row / (p.ne1 * p.ne2);
    const uint ab = p.a_off + i1 * p.a_s1 + i2 * p.a_s2 + i3 * p.a_s3;
    const uint bb = p.b_off + (i1 % p.b_ne1) * p.b_s1 + (i2 % p.b_ne2) * p.b_s2 + (i3 % p.b_ne3) * p.b_s3;
    const uint db = p.d_off + i1 * p.d_s1 + i2 * p.d_s2 + i3 * p.d_s3;
    for (uint e = 0u; e < EPT; e++) {
        const uint i0 = grid_col(e);
        if (i0 >= p.ne0) return;
        uint j0 = i0;
        if (p.b_ne0 != p.ne0) j0 = i0 % p.b_ne0;      // uniform: no division when not repeated
        const float x = uintBitsToFloat(data_a[ab + i0 * p.a_s0]);
        const float y = uintBitsToFloat(data_b[bb + j0 * p.b_s0]);
        float r;
        if (p.op == 0u) r = x + y;
        else if (p.op == 1u) r = x - y;
        else if (p.op == 2u) r = x * y;
        else r = x / y;
        data_d[db + i0 * p.d_s0] = floatBitsToUint(r);
    }
}
