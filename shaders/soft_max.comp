#version 450
#extension GL_GOOGLE_include_directive : require
// SOFT_MAX: d = softmax(a * scale + slope * mask) over ne0, one workgroup per row. a and d: F32
// with dense rows; mask (optional, F32 or F16, dense rows): row i1, plane (i2 % m_ne2, i3 % m_ne3).
// ALiBi slope per head i2 as ggml (1 when max_bias == 0). Attention sinks (flags & 8, F32 [ne2],
// gpt-oss): one more logit per head i2 that joins the max and the sum, its weight dropped. A row
// whose every entry (and sink) is -inf gives 0.
#define NEED_REDUCE
#include "common.glsl"

layout(binding = 0) readonly buffer A { uint data_a[]; };
layout(binding = 1) readonly buffer M { uint data_m[]; };
layout(binding = 2) buffer D { uint data_d[]; };
layout(binding = 3) readonly buffer SK { uint data_s[]; };

layout(push_constant) uniform P {
    uint ne0, ne1, ne2, ne3;
    uint a_off, a_s1, a_s2, a_s3;
    uint m_off, m_ne2, m_ne3, m_s1, m_s2, m_s3;     // elements of the mask type
    uint d_off, d_s1, d_s2, d_s3;
    uint flags;                              // 1: has mask, 2: mask is F16, 4: alibi, 8: sinks
    float scale, m0, m1;
    uint n_head_log2;
    uint s_off;                                      // the sinks' first element
} p;

float mask_at(uint mb, uint i) {
    if ((p.flags & 1u) == 0u) return 0.0;
    if ((p.flags & 2u) != 0u) {
        const uint e = mb + i;
        return f16_to_f32((data_m[e >> 1] >> ((e & 1u) << 4)) & 0xffffu);
    }
    return uintBitsToFloat(data_m[mb + i]);
}

void main() {
    const uint row = wg_linear();
    if (row >= p.ne1 * p.ne2 * p.ne3) return;
    const uint i1 = row % p.ne1, i2 = (row / p.ne1) % p.ne2, i3 = row / (p.ne1 * p.ne2);
    const uint ab = p.a_off + i1 * p.a_s1 + i2 * p.a_s2 + i3 * p.a_s3;
    const uint db = p.d_off + i1 * p.d_s1 + i2 * p.d_s2 + i3 * p.d_s3;
    const uint mb = p.m_off + i1 * p.m_s1 + (i2 % p.m_ne2) * p.m_s2 + (i3 % p.m_ne3) * p.m_s3;
    float slope = 1.0;
    if ((p.flags & 4u) != 0u) {
        slope = i2 < p.n_head_log2 ? pow(p.m0, float(i2 + 1u))
                                   : pow(p.m1, float(2u * (i2 - p.n_head_log2) + 1u));
    }
    const uint t = gl_LocalInvocationID.x;
    float vmax = -INF_F32;
    for (uint i = t; i < p.ne0; i += WG_SIZE) {
        const float w = uintBitsToFloat(data_a[ab + i]) * p.scale + slope * mask_at(mb, i);
        vmax = max(vmax, w);
    }
    vmax = wg_max(vmax);
    const float sink = (p.flags & 8u) != 0u ? uintBitsToFloat(data_s[p.s_off + i2]) : -INF_F32;
    vmax = max(vmax, sink);
    if (vmax == -INF_F32) {          // fully masked row (uniform)
        for (uint i = t; i < p.ne0; i += WG_SIZE) data_d[db + i] = 0u;
        return;
    }
    float sum = 0.0;
    for (uint i = t; i < p.ne0; i += WG_SIZE) {
        const float w = uintBitsToFloat(data_a[ab + i]) * p.scale + slope * mask_at(mb, i);
        sum += w == -INF_F32 ? 0.0 : exp(w - vmax);
    }
    sum = wg_sum(sum);
    if ((p.flags & 8u) != 0u) sum += exp(sink - vmax);
    const float inv = 1.0 / sum;
    for (uint i = t; i < p.ne0; i += WG_SIZE) {
        const float w = uintBitsToFloat(data_a[ab + i]) * p.scale + slope * mask_at(mb, i);
        data_d[db + i] = floatBitsToUint((w == -INF_F32 ? 0.0 : exp(w - vmax)) * inv);
    }
}
