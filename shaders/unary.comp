#version 450
#extension GL_GOOGLE_include_directive : require
// Element-wise F32 ops, any strides (in elements), one invocation per element:
// 0 SCALE (x*f0 + f1), 1 SILU, 2 GELU (ggml's fp16 table: input and output rounded to fp16,
// 0 / x outside (-10, 10)), 3 SQR, 4 SQRT, 5 TANH, 6 DIAG_MASK_INF (-inf where i0 > n_past + i1,
// n_past = floatBitsToInt(f0)).
#include "common.glsl"

layout(binding = 0) readonly buffer A { uint data_a[]; };
layout(binding = 1) buffer D { uint data_d[]; };
layout(binding = 2) readonly buffer T { uint gelu_table[]; };   // 65536 fp16, two per word

layout(push_constant) uniform P {
    uint ne0, ne1, ne2, ne3;
    uint a_off, a_s0, a_s1, a_s2, a_s3;
    uint d_off, d_s0, d_s1, d_s2, d_s3;
    uint op;
    float f0, f1;
} p;

void main() {
    const uint i = wg_linear() * WG_SIZE + gl_LocalInvocationID.x;
    if (i >= p.ne0 * p.ne1 * p.ne2 * p.ne3) return;
    const uint i0 = i % p.ne0;
    const uint i1 = (i / p.ne0) % p.ne1;
    const uint i2 = (i / (p.ne0 * p.ne1)) % p.ne2;
    const uint i3 = i / (p.ne0 * p.ne1 * p.ne2);
    const float x = uintBitsToFloat(data_a[p.a_off + i0 * p.a_s0 + i1 * p.a_s1 + i2 * p.a_s2 + i3 * p.a_s3]);
    float r;
    switch (p.op) {
    case 0u: r = x * p.f0 + p.f1; break;
    case 1u: r = x / (1.0 + exp(-x)); break;
    case 2u:
        if (x <= -10.0) r = 0.0;
        else if (x >= 10.0) r = x;
        else {
            const uint h = f32_to_f16(x);
            r = f16_to_f32((gelu_table[h >> 1] >> ((h & 1u) << 4)) & 0xffffu);
        }
        break;
    case 3u: r = x * x; break;
    case 4u: r = sqrt(x); break;
    case 5u: r = tanh(clamp(x, -15.0, 15.0)); break;
    default: r = int(i0) > floatBitsToInt(p.f0) + int(i1) ? -INF_F32 : x; break;
    }
    data_d[p.d_off + i0 * p.d_s0 + i1 * p.d_s1 + i2 * p.d_s2 + i3 * p.d_s3] = floatBitsToUint(r);
}
