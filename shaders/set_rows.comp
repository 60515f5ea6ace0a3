#version 450
#extension GL_GOOGLE_include_directive : require
// SET_ROWS (KV-cache writes): d[:, c[i1, i2 % c_ne1, i3 % c_ne2], i2, i3] = b[:, i1, i2, i3].
// b: F32 dense rows; c: I32; d: F32 or F16 (flags & 1), dense rows. One invocation per element
// of b. An index outside d writes nothing and sets `status` to `tag`.
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
    const uint i = wg_linear() * WG_SIZE + gl_LocalInvocationID.x;
    if (i >= p.ne0 * p.ne1 * p.ne2 * p.ne3) return;
    const uint i0 = i % p.ne0;
    const uint i1 = (i / p.ne0) % p.ne1;
    const uint i2 = (i / (p.ne0 * p.ne1)) % p.ne2;
    const uint i3 = i / (p.ne0 * p.ne1 * p.ne2);
    const int row = data_c[p.c_off + i1 * p.c_s0 + (i2 % p.c_ne1) * p.c_s1 + (i3 % p.c_ne2) * p.c_s2];
    if (row < 0 || uint(row) >= p.d_ne1) {
        atomicCompSwap(status[0], 0u, p.tag);
        return;
    }
    const uint v = data_b[p.b_off + i1 * p.b_s1 + i2 * p.b_s2 + i3 * p.b_s3 + i0];
    const uint di = p.d_off + uint(row) * p.d_s1 + i2 * p.d_s2 + i3 * p.d_s3 + i0;
    if ((p.flags & 1u) != 0u) store_f16_bits(di, f32_to_f16(uintBitsToFloat(v)));
    else data_d[di] = v;
}
