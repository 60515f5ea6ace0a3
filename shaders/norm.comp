#version 450
#extension GL_GOOGLE_include_directive : require
// RMS_NORM (op 0) and NORM (op 1) over ne0, one workgroup per row; F32, any strides.
// SUM_ROWS (op 2): d[0, i1, i2, i3] = the row's sum (fp32 partial sums, then the workgroup
// reduction; the CPU sums in double).
#define NEED_REDUCE
#include "common.glsl"

layout(binding = 0) readonly buffer A { uint data_a[]; };
layout(binding = 1) buffer D { uint data_d[]; };

layout(push_constant) uniform P {
    uint ne0, ne1, ne2, ne3;
    uint a_off, a_s0, a_s1, a_s2, a_s3;
    uint d_off, d_s0, d_s1, d_s2, d_s3;
    uint op;
    float eps;
} p;

void main() {
    const uint row = wg_linear();
    if (row >= p.ne1 * p.ne2 * p.ne3) return;       // whole workgroup: uniform
    const uint i1 = row % p.ne1, i2 = (row / p.ne1) % p.ne2, i3 = row / (p.ne1 * p.ne2);
    const uint ab = p.a_off + i1 * p.a_s1 + i2 * p.a_s2 + i3 * p.a_s3;
    const uint db = p.d_off + i1 * p.d_s1 + i2 * p.d_s2 + i3 * p.d_s3;
    const uint t = gl_LocalInvocationID.x;
    if (p.op == 2u) {
        float s = 0.0;
        for (uint i = t; i < p.ne0; i += WG_SIZE) s += uintBitsToFloat(data_a[ab + i * p.a_s0]);
        s = wg_sum(s);
        if (t == 0u) data_d[db] = floatBitsToUint(s);
        return;
    }
    float mean = 0.0;
    if (p.op == 1u) {
        float s = 0.0;
        for (uint i = t; i < p.ne0; i += WG_SIZE) s += uintBitsToFloat(data_a[ab + i * p.a_s0]);
        mean = wg_sum(s) / float(p.ne0);
    }
    float s2 = 0.0;
    for (uint i = t; i < p.ne0; i += WG_SIZE) {
        const float v = uintBitsToFloat(data_a[ab + i * p.a_s0]) - mean;
        s2 += v * v;
    }
    const float scale = 1.0 / sqrt(wg_sum(s2) / float(p.ne0) + p.eps);
    for (uint i = t; i < p.ne0; i += WG_SIZE) {
        const float v = uintBitsToFloat(data_a[ab + i * p.a_s0]) - mean;
        data_d[db + i * p.d_s0] = floatBitsToUint(v * scale);
    }
}
