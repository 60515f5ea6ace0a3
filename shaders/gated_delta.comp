#version 450
#extension GL_GOOGLE_include_directive : require
// GATED_DELTA_NET: the gated delta rule (Qwen 3.5's linear attention), the contract of
// native/src/ops_ssm.c. q, k F32 [Dk, Hk, T] (dense rows; head h reads q/k head h % Hk), v F32
// [Dv, H, T] (dense rows), g (log decay) and beta F32 [H, T] contiguous, state F32 [Dk*Dv*H, S]
// (dense rows; per head Dv rows of Dk: row j is column j of the state matrix S[i][j]), seq I32 [T]
// contiguous. d F32 contiguous: o [Dv, H, T], then the new states. Per token and head:
//   S *= exp(g); d_j = (v_j - sum_i S[i][j] k_i) * beta; S[i][j] += k_i d_j;
//   o_j = scale * sum_i S[i][j] q_i.
// Column j of a head's state only meets k, q, v_j: one workgroup per (column, head) (folded x/y
// grid) walks the tokens in order, its invocations owning state words i = t, t + WG_SIZE, ...
// in d, the two sums per token reduced over the workgroup. Decode (T = 1) and a prompt (any T,
// one dispatch) run the same arithmetic per token, so batching does not change the bits. A seq
// outside [0, S) sets `status` to `tag`.
#define NEED_REDUCE
#include "common.glsl"

layout(binding = 0) readonly buffer Q { uint data_q[]; };
layout(binding = 1) readonly buffer K { uint data_k[]; };
layout(binding = 2) readonly buffer V { uint data_v[]; };
layout(binding = 3) readonly buffer G { uint data_g[]; };
layout(binding = 4) readonly buffer BE { uint data_beta[]; };
layout(binding = 5) readonly buffer ST { uint data_st[]; };
layout(binding = 6) readonly buffer SQ { int data_seq[]; };
layout(binding = 7) buffer D { uint data_d[]; };
layout(binding = 8) buffer S { uint status[]; };

layout(push_constant) uniform P {
    uint Dk, Hk, Dv, H, T, S;
    uint q_off, q_s1, q_s2;
    uint k_off, k_s1, k_s2;
    uint v_off, v_s1, v_s2;
    uint g_off, beta_off;
    uint st_off, st_s1;
    uint seq_off;
    uint d_off;
    uint tag;
    float scale;
} p;

void main() {
    const uint r = wg_linear();
    if (r >= p.H * p.Dv) return;                      // whole workgroup
    const uint h = r / p.Dv, j = r % p.Dv;
    const uint t = gl_LocalInvocationID.x;
    const uint hs = p.Dk * p.Dv;
    const uint ns = p.d_off + p.Dv * p.H * p.T;       // the new states
    for (uint s = 0u; s < p.S; s++) {
        const uint src = p.st_off + s * p.st_s1 + h * hs + j * p.Dk;
        const uint dst = ns + (s * p.H + h) * hs + j * p.Dk;
        for (uint e = t; e < p.Dk; e += WG_SIZE) data_d[dst + e] = data_st[src + e];
    }
    const uint hk = h % p.Hk;
    for (uint i = 0u; i < p.T; i++) {
        const int sq = data_seq[p.seq_off + i];       // uniform
        if (sq < 0 || uint(sq) >= p.S) {
            if (t == 0u) atomicCompSwap(status[0], 0u, p.tag);
            return;
        }
        const uint mb = ns + (uint(sq) * p.H + h) * hs + j * p.Dk;
        const uint qb = p.q_off + i * p.q_s2 + hk * p.q_s1;
        const uint kb = p.k_off + i * p.k_s2 + hk * p.k_s1;
        const float decay = exp(uintBitsToFloat(data_g[p.g_off + i * p.H + h]));
        const float b = uintBitsToFloat(data_beta[p.beta_off + i * p.H + h]);
        float part = 0.0;
        for (uint e = t; e < p.Dk; e += WG_SIZE) {
            const float m = uintBitsToFloat(data_d[mb + e]) * decay;
            data_d[mb + e] = floatBitsToUint(m);
            part += m * uintBitsToFloat(data_k[kb + e]);
        }
        const float vj = uintBitsToFloat(data_v[p.v_off + i * p.v_s2 + h * p.v_s1 + j]);
        const float dj = (vj - wg_sum(part)) * b;
        part = 0.0;
        for (uint e = t; e < p.Dk; e += WG_SIZE) {
            const float m = uintBitsToFloat(data_d[mb + e]) + uintBitsToFloat(data_k[kb + e]) * dj;
            data_d[mb + e] = floatBitsToUint(m);
            part += m * uintBitsToFloat(data_q[qb + e]);
        }
        const float o = wg_sum(part) * p.scale;
        if (t == 0u) data_d[p.d_off + (i * p.H + h) * p.Dv + j] = floatBitsToUint(o);
    }
}
