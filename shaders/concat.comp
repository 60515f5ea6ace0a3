#version 450
#extension GL_GOOGLE_include_directive : require
// CONCAT along dim: d[i] = i[dim] < a_ne_dim ? a[i] : b[i - a_ne_dim along dim]. Elements of 4
// bytes (F32, I32) or F16 (flags & 1), any strides (in elements). Row grid over d (common.glsl).
#define ROW_GRID
#include "common.glsl"

layout(binding = 0) readonly buffer A { uint data_a[]; };
layout(binding = 1) readonly buffer B { uint data_b[]; };
layout(binding = 2) buffer D { uint data_d[]; };
#define D16_BINDING 2
#include "store16.glsl"

layout(push_constant) uniform P {
    uint ne0, ne1, ne2, ne3;
    uint a_off, a_s0, a_s1, a_s2, a_s3;
    uint b_off, b_s0, b_s1, b_s2, b_s3;
    uint d_off, d_s0, d_s1, d_s2, d_s3;
    uint dim, a_ne_dim, flags;
} p;

uint rd(bool from_a, uint e) {
    if ((p.flags & 1u) != 0u) {
        const uint w = from_a ? data_a[e >> 1] : data_b[e >> 1];
        return (w >> ((e & 1u) << 4)) & 0xffffu;
    }
    return from_a ? data_a[e] : data_b[e];
}

void main() {
    const uint row = grid_row();
    if (row >= p.ne1 * p.ne2 * p.ne3) return;
    uint ix[4];
    ix[1] = row % p.ne1;
    ix[2] = (row / p.ne1) % p.ne2;
    ix[3] = row / (p.ne1 * p.ne2);
    for (uint e = 0u; e < EPT; e++) {
        ix[0] = grid_col(e);
        if (ix[0] >= p.ne0) return;
        uint j[4] = ix;
        const uint di = p.d_off + j[0] * p.d_s0 + j[1] * p.d_s1 + j[2] * p.d_s2 + j[3] * p.d_s3;
        const bool from_a = j[p.dim] < p.a_ne_dim;
        if (!from_a) j[p.dim] -= p.a_ne_dim;
        const uint s = from_a ? p.a_off + j[0] * p.a_s0 + j[1] * p.a_s1 + j[2] * p.a_s2 + j[3] * p.a_s3
                              : p.b_off + j[0] * p.b_s0 + j[1] * p.b_s1 + j[2] * p.b_s2 + j[3] * p.b_s3;
        const uint v = rd(from_a, s);
        if ((p.flags & 1u) != 0u) store_f16_bits(di, v);
        else data_d[di] = v;
    }
}
