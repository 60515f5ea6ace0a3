#version 450
#extension GL_GOOGLE_include_directive : require
// CPY / CONT / DUP between F32 and F16 (flags: 1 source F16, 2 destination F16), any strides (in
// elements of each type). Shapes may differ with equal element counts (flags & 4): element i of
// the source in ne order goes to element i of the destination; else the indices are the same.
// F16 -> F16 and F32 -> F32 copy bits (so I32 -> I32 runs as F32 -> F32: MoE expert ids).
// Row grid over the source (common.glsl).
#define ROW_GRID
#include "common.glsl"

layout(binding = 0) readonly buffer A { uint data_a[]; };
layout(binding = 1) buffer D { uint data_d[]; };
#define D16_BINDING 1
#include "store16.glsl"

layout(push_constant) uniform P {
    uint a_ne0, a_ne1, a_ne2, a_ne3;
    uint a_off, a_s0, a_s1, a_s2, a_s3;
    uint d_ne0, d_ne1, d_ne2, d_ne3;
    uint d_off, d_s0, d_s1, d_s2, d_s3;
    uint flags;
} p;

void main() {
    const uint row = grid_row();
    if (row >= p.a_ne1 * p.a_ne2 * p.a_ne3) return;
    const uint a1 = row % p.a_ne1, a2 = (row / p.a_ne1) % p.a_ne2, a3 = row / (p.a_ne1 * p.a_ne2);
    const uint ab = p.a_off + a1 * p.a_s1 + a2 * p.a_s2 + a3 * p.a_s3;
    const uint db = p.d_off + a1 * p.d_s1 + a2 * p.d_s2 + a3 * p.d_s3;   // same shapes
    for (uint e = 0u; e < EPT; e++) {
        const uint a0 = grid_col(e);
        if (a0 >= p.a_ne0) return;
        uint di = db + a0 * p.d_s0;
        if ((p.flags & 4u) != 0u) {                  // uniform: shapes differ
            uint f = row * p.a_ne0 + a0;
            const uint d0 = f % p.d_ne0; f /= p.d_ne0;
            const uint d1 = f % p.d_ne1; f /= p.d_ne1;
            const uint d2 = f % p.d_ne2;
            const uint d3 = f / p.d_ne2;
            di = p.d_off + d0 * p.d_s0 + d1 * p.d_s1 + d2 * p.d_s2 + d3 * p.d_s3;
        }
        const uint ai = ab + a0 * p.a_s0;
        if ((p.flags & 1u) != 0u) {
            const uint h = (data_a[ai >> 1] >> ((ai & 1u) << 4)) & 0xffffu;
            if ((p.flags & 2u) != 0u) store_f16_bits(di, h);
            else data_d[di] = floatBitsToUint(f16_to_f32(h));
        } else {
            const uint v = data_a[ai];
            if ((p.flags & 2u) != 0u) store_f16_bits(di, f32_to_f16(uintBitsToFloat(v)));
            else data_d[di] = v;
        }
    }
}
