#version 450
#extension GL_GOOGLE_include_directive : require
// SET_ROWS (KV-cache writes): d[:, c[i1, i2 % c_ne1, i3 % c_ne2], i2, i3] = b[:, i1, i2, i3].
// b: F32 dense rows; c: I32; d: F32 or F16 (flags & 1), dense rows. Row grid over b (common.glsl),
// one invocation per element. An index outside d writes nothing and sets `status` to `tag`.
#define ROW_GRID
#include "common.glsl"

layout(binding = 0) readonly buffer B { uint data_b[]; };
layout(binding = 1) readonly buffer C { int data_c[]; };
layout(binding = 2) buffer D { uint data_d[]; };
layout(binding = 3) buffer S { uint status[]; };
#define D16_BINDING 2
#include "store16.glsl"

layout(push_constant) uniform P {
    uint ne0, ne1, ne2, ne3;               // b
    uint b_off, b_s1, b_s2, b_s3;
    uint c_off, c_ne1, c_ne2, c_s0, c_s1, c_s2;
    uint d_off, d_s1, d_s2, d_s3;          // elements of d's type
    uint d_ne1, flags, tag;
} p;

void main() {
    const uint row = grid_row();
    if (row >= p.ne1 * p.ne2 * p.ne3) return;
    const uint i1 = row % p.ne1, i2 = (row / p.ne1) % p.ne2, i3 = row / (p.ne1 * p.ne2);
    const int dst = data_c[p.c_off + i1 * p.c_s0 + (i2 % p.c_ne1) * p.c_s1 + (i3 % p.c_ne2) * p.c_s2];
    if (dst < 0 || uint(dst) >= p.d_ne1) {
        atomicCompSwap(status[0], 0u, p.tag);
        return;
    }
    const uint bb = p.b_off + i1 * p.b_s1 + i2 * p.b_s2 + i3 * p.b_s3;
    const uint db = p.d_off + uint(dst) * p.d_s1 + i2 * p.d_s2 + i3 * p.d_s3;
    for (uint e = 0u; e < EPT; e++) {
        const uint i0 = grid_col(e);
        if (i0 >= p.ne0) return;
        const uint v = data_b[bb + i0];
        if ((p.flags & 1u) != 0u) store_f16_bits(db + i0, f32_to_f16(uintBitsToFloat(v)));
        else data_d[db + i0] = v;
    }
}
