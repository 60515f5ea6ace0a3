#version 450
#extension GL_GOOGLE_include_directive : require
// Element-wise F32 ops, any strides (in elements), one invocation per element:
// 0 SCALE (x*f0 + f1), 1 SILU, 2 GELU (ggml's fp16 table: input and output rounded to fp16,
// 0 / x outside (-10, 10)), 3 SQR, 4 SQRT, 5 TANH, 6 DIAG_MASK_INF (-inf where i0 > n_past + i1,
// n_past = floatBitsToInt(f0)), 7 SIGMOID, 8 CLAMP (max(min(x, f1), f0) with the comparisons of
// ggml's MIN/MAX macros, so NaN becomes f1), 9 SOFTPLUS (log(1 + exp(x)), x itself above 20).
// Row grid (common.glsl).
#define ROW_GRID
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

float op(const float x, const uint i0, const uint i1) {
    switch (p.op) {
    case 0u: return x * p.f0 + p.f1;
    case 1u: return x / (1.0 + exp(-x));
    case 2u:
        if (x <= -10.0) return 0.0;
        if (x >= 10.0) return x;
        {
            const uint h = f32_to_f16(x);
            return f16_to_f32((gelu_table[h >> 1] >> ((h & 1u) << 4)) & 0xffffu);
        }
    case 3u: return x * x;
    case 4u: return sqrt(x);
    case 5u: return tanh(clamp(x, -15.0, 15.0));
    case 7u: return 1.0 / (1.0 + exp(-x));
    case 8u: {
        const float v = x < p.f1 ? x : p.f1;
        return v > p.f0 ? v : p.f0;
    }
    case 9u: return x > 20.0 ? x : log(1.0 + exp(x));
    case 6u: return int(i0) > floatBitsToInt(p.f0) + int(i1) ? -INF_F32 : x;
    default: return x;
    }
}

void main() {
    const uint row = grid_row();
    if (row >= p.ne1 * p.ne2 * p.ne3) return;
    const uint i1 = row % p.ne1, i2 = (row / p.ne1) % p.ne2, i3 = row / (p.ne1 * p.ne2);
    const uint ab = p.a_off + i1 * p.a_s1 + i2 * p.a_s2 + i3 * p.a_s3;
    const uint db = p.d_off + i1 * p.d_s1 + i2 * p.d_s2 + i3 * p.d_s3;
    for (uint e = 0u; e < EPT; e++) {
        const uint i0 = grid_col(e);
        if (i0 >= p.ne0) return;
        const float x = uintBitsToFloat(data_a[ab + i0 * p.a_s0]);
        data_d[db + i0 * p.d_s0] = floatBitsToUint(op(x, i0, i1));
    }
}
