#version 450
#extension GL_GOOGLE_include_directive : require
// FLASH_ATTN_EXT: d[:, h, iq, ib] = softmax(q·kᵀ·scale (softcap) + slope·mask)·v for query row iq,
// head h, KV head h / group, with an online softmax over chunks of WG_SIZE keys (the n_q x n_kv
// score matrix is never stored). One workgroup per (iq, h) (folded x/y grid), z = batch ib.
// q: F32; k, v: both F32 or both F16 (flags & 1; q is rounded to fp16 for the K dots then, as
// ggml's CPU code); mask F32/F16 (flags & 2 present, & 4 F16); d: F32 contiguous
// [Dv, H, n_q, B]. Keys whose mask is -inf are skipped; a row with every key masked gives 0.
// Attention sinks (flags & 16, F32 [H], gpt-oss): one more logit per head, joined after the keys
// in ggml's order (a sink above the running max rescales what was summed); its weight is dropped.
// Head sizes up to MAX_D.
#define NEED_REDUCE
#include "common.glsl"

#define MAX_D 512u

layout(binding = 0) readonly buffer Q { uint data_q[]; };
layout(binding = 1) readonly buffer K { uint data_k[]; };
layout(binding = 2) readonly buffer V { uint data_v[]; };
layout(binding = 3) readonly buffer M { uint data_m[]; };
layout(binding = 4) buffer D { uint data_d[]; };
layout(binding = 5) readonly buffer SK { uint data_s[]; };

layout(push_constant) uniform P {
    uint D, Dv, n_q, n_kv, H, group;
    uint q_off, q_s1, q_s2, q_s3;
    uint k_off, k_s1, k_s2, k_s3;
    uint v_off, v_s1, v_s2, v_s3;
    uint m_off, m_s1, m_s2, m_s3, m_ne2, m_ne3;
    uint d_off;
    uint flags;                // 1 kv F16, 2 mask, 4 mask F16, 8 alibi, 16 sinks; n_head_log2 << 16
    float scale, softcap, m0, m1;
    uint s_off;
} p;

shared float sq[MAX_D];
shared float sacc[MAX_D];
shared float sp[WG_SIZE];

float ld_kv_k(uint e) {
    if ((p.flags & 1u) != 0u) return f16_to_f32((data_k[e >> 1] >> ((e & 1u) << 4)) & 0xffffu);
    return uintBitsToFloat(data_k[e]);
}

float ld_kv_v(uint e) {
    if ((p.flags & 1u) != 0u) return f16_to_f32((data_v[e >> 1] >> ((e & 1u) << 4)) & 0xffffu);
    return uintBitsToFloat(data_v[e]);
}

void main() {
    const uint r = wg_linear();
    if (r >= p.n_q * p.H) return;               // whole workgroup
    const uint ih = r % p.H, iq = r / p.H, ib = gl_WorkGroupID.z;
    const uint ik2 = ih / p.group;
    const uint t = gl_LocalInvocationID.x;
    float slope = 1.0;
    if ((p.flags & 8u) != 0u) {
        const uint nl2 = p.flags >> 16;
        slope = ih < nl2 ? pow(p.m0, float(ih + 1u)) : pow(p.m1, float(2u * (ih - nl2) + 1u));
    }
    const uint qb = p.q_off + iq * p.q_s1 + ih * p.q_s2 + ib * p.q_s3;
    for (uint d = t; d < p.D; d += WG_SIZE) {
        const float x = uintBitsToFloat(data_q[qb + d]);
        sq[d] = (p.flags & 1u) != 0u ? round_f16(x) : x;
    }
    for (uint d = t; d < p.Dv; d += WG_SIZE) sacc[d] = 0.0;
    const uint kb = p.k_off + ik2 * p.k_s2 + ib * p.k_s3;
    const uint vb = p.v_off + ik2 * p.v_s2 + ib * p.v_s3;
    const uint mb = p.m_off + iq * p.m_s1 + (ih % p.m_ne2) * p.m_s2 + (ib % p.m_ne3) * p.m_s3;
    barrier();
    float m_run = -INF_F32, l = 0.0;
    for (uint j0 = 0u; j0 < p.n_kv; j0 += WG_SIZE) {
        const uint j = j0 + t;
        float s = -INF_F32;
        if (j < p.n_kv) {
            float mv = 0.0;
            if ((p.flags & 2u) != 0u) {
                const uint e = mb + j;
                mv = (p.flags & 4u) != 0u ? f16_to_f32((data_m[e >> 1] >> ((e & 1u) << 4)) & 0xffffu)
                                          : uintBitsToFloat(data_m[e]);
            }
            if (mv != -INF_F32) {
                const uint kr = kb + j * p.k_s1;
                float dotv = 0.0;
                for (uint d = 0u; d < p.D; d++) dotv += sq[d] * ld_kv_k(kr + d);
                s = dotv * p.scale;
                if (p.softcap != 0.0) s = p.softcap * tanh(clamp(s, -15.0, 15.0));
                s += mv * slope;
            }
        }
        const float m_new = max(m_run, wg_max(s));
        if (m_new == -INF_F32) continue;        // uniform: nothing unmasked yet
        const float pj = s == -INF_F32 ? 0.0 : exp(s - m_new);
        const float ms = m_run == -INF_F32 ? 0.0 : exp(m_run - m_new);
        sp[t] = pj;
        l = l * ms + wg_sum(pj);                // its barriers publish sp
        const uint n_here = min(WG_SIZE, p.n_kv - j0);
        for (uint d = t; d < p.Dv; d += WG_SIZE) {
            float a = sacc[d] * ms;
            for (uint jj = 0u; jj < n_here; jj++) {
                const float w = sp[jj];
                if (w != 0.0) a += w * ld_kv_v(vb + (j0 + jj) * p.v_s1 + d);
            }
            sacc[d] = a;
        }
        m_run = m_new;
        barrier();
    }
    float sink_scale = 1.0;
    if ((p.flags & 16u) != 0u) {
        const float sv = uintBitsToFloat(data_s[p.s_off + ih]);
        if (sv > m_run) {
            sink_scale = m_run == -INF_F32 ? 0.0 : exp(m_run - sv);
            l = l * sink_scale + 1.0;
        } else {
            l = l + exp(sv - m_run);
        }
    }
    const float inv = l > 0.0 ? 1.0 / l : 0.0;
    const uint db = p.d_off + (ih + p.H * (iq + p.n_q * ib)) * p.Dv;
    for (uint d = t; d < p.Dv; d += WG_SIZE) {
        data_d[db + d] = floatBitsToUint(sacc[d] * sink_scale * inv);
    }
}
