#version 450
#extension GL_GOOGLE_include_directive : require
// ROPE, modes NORMAL (pairs 2k, 2k+1) and NEOX (pairs k, k + n_dims/2), as ggml's CPU code:
// theta_k = pos[i2] * theta_scale^k by iterated fp32 products, divided by freq_factors[k] when
// given, YaRN blend when ext_factor != 0; elements from n_dims on are copied. F32, dense rows.
// One invocation per pair (and per copied tail element), so it may run in place. Row grid
// (common.glsl): x walks the n_dims/2 + (ne0 - n_dims) slots of a row.
#define ROW_GRID
#include "common.glsl"

layout(binding = 0) readonly buffer A { uint data_a[]; };
layout(binding = 1) readonly buffer Pos { int data_pos[]; };
layout(binding = 2) readonly buffer F { uint data_ff[]; };
layout(binding = 3) buffer D { uint data_d[]; };

layout(push_constant) uniform P {
    uint ne0, ne1, ne2, ne3;
    uint a_off, a_s1, a_s2, a_s3;
    uint d_off, d_s1, d_s2, d_s3;
    uint pos_off, ff_off;
    uint n_dims, flags;            // flags: 1 NEOX, 2 has freq_factors
    float theta_scale, freq_scale, ext_factor, attn_factor, mscale_ext, corr0, corr1;
} p;

void slot(const uint k, const uint ab, const uint db, const uint i2) {
    if (k >= p.n_dims / 2u) {
        const uint e = p.n_dims + (k - p.n_dims / 2u);
        data_d[db + e] = data_a[ab + e];
        return;
    }
    precise float theta = float(data_pos[p.pos_off + i2]);
    for (uint j = 0u; j < k; j++) theta = theta * p.theta_scale;
    const float f = (p.flags & 2u) != 0u ? uintBitsToFloat(data_ff[p.ff_off + k]) : 1.0;
    const float extrap = theta / f;
    const float interp = p.freq_scale * extrap;
    float th = interp;
    float msc = p.attn_factor;
    if (p.ext_factor != 0.0) {
        const float y = (float(k) - p.corr0) / max(0.001, p.corr1 - p.corr0);
        const float mix = (1.0 - min(1.0, max(0.0, y))) * p.ext_factor;
        th = interp * (1.0 - mix) + extrap * mix;
        msc = p.mscale_ext;
    }
    const vec2 sc = sincos_accurate(th);
    const float c = sc.y * msc, s = sc.x * msc;
    const uint j0 = (p.flags & 1u) != 0u ? k : 2u * k;
    const uint j1 = (p.flags & 1u) != 0u ? k + p.n_dims / 2u : 2u * k + 1u;
    const float x0 = uintBitsToFloat(data_a[ab + j0]);
    const float x1 = uintBitsToFloat(data_a[ab + j1]);
    data_d[db + j0] = floatBitsToUint(x0 * c - x1 * s);
    data_d[db + j1] = floatBitsToUint(x0 * s + x1 * c);
}

void main() {
    const uint slots = p.n_dims / 2u + (p.ne0 - p.n_dims);
    const uint row = grid_row();
    if (row >= p.ne1 * p.ne2 * p.ne3) return;
    const uint i1 = row % p.ne1, i2 = (row / p.ne1) % p.ne2, i3 = row / (p.ne1 * p.ne2);
    const uint ab = p.a_off + i1 * p.a_s1 + i2 * p.a_s2 + i3 * p.a_s3;
    const uint db = p.d_off + i1 * p.d_s1 + i2 * p.d_s2 + i3 * p.d_s3;
    for (uint e = 0u; e < EPT; e++) {
        const uint k = grid_col(e);
        if (k >= slots) return;
        slot(k, ab, db, i2);
    }
}
