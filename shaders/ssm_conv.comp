#version 450
#extension GL_GOOGLE_include_directive : require
// SSM_CONV: the short causal convolution with state (LFM2's shortconv, Qwen 3.5's conv1d), the
// contract of native/src/ops_ssm.c. x F32 [C, T] (dense rows), kernel F32 [K, C] contiguous,
// state F32 [(K-1)*C, S] (dense rows; per channel the K-1 previous inputs, oldest first), seq I32
// [T] contiguous (token t continues the state of sequence seq[t]). d F32 contiguous: y [C, T],
// then the new states [(K-1)*C, S]. y[c, t] = sum over j < K-1 of state[j]*kernel[j, c], then
// + x[c, t]*kernel[K-1, c] (ggml's order). One invocation per channel walks the tokens in order
// on its own state words in d (no other invocation touches them), so a prompt in one dispatch
// gives the bits of token-by-token evaluation. A seq outside [0, S) sets `status` to `tag`.
// Row grid (common.glsl) over channels.
#define ROW_GRID
#include "common.glsl"

layout(binding = 0) readonly buffer X { uint data_x[]; };
layout(binding = 1) readonly buffer W { uint data_w[]; };
layout(binding = 2) readonly buffer ST { uint data_st[]; };
layout(binding = 3) readonly buffer SQ { int data_seq[]; };
layout(binding = 4) buffer D { uint data_d[]; };
layout(binding = 5) buffer S { uint status[]; };

layout(push_constant) uniform P {
    uint C, T, K, S;
    uint x_off, x_s1;
    uint w_off;
    uint st_off, st_s1;
    uint seq_off;
    uint d_off;
    uint tag;
} p;

void main() {
    const uint n = p.K - 1u;
    const uint ns = p.d_off + p.C * p.T;                 // the new states
    for (uint e = 0u; e < EPT; e++) {
        const uint c = grid_col(e);
        if (c >= p.C) return;
        for (uint s = 0u; s < p.S; s++) {
            for (uint j = 0u; j < n; j++) {
                data_d[ns + (s * p.C + c) * n + j] = data_st[p.st_off + s * p.st_s1 + c * n + j];
            }
        }
        const uint wb = p.w_off + c * p.K;
        for (uint i = 0u; i < p.T; i++) {
            const int sq = data_seq[p.seq_off + i];
            if (sq < 0 || uint(sq) >= p.S) {
                atomicCompSwap(status[0], 0u, p.tag);
                return;
            }
            const uint sb = ns + (uint(sq) * p.C + c) * n;
            const float xi = uintBitsToFloat(data_x[p.x_off + i * p.x_s1 + c]);
            float sum = 0.0;
            for (uint j = 0u; j < n; j++) {
                sum += uintBitsToFloat(data_d[sb + j]) * uintBitsToFloat(data_w[wb + j]);
            }
            sum += xi * uintBitsToFloat(data_w[wb + n]);
            data_d[p.d_off + i * p.C + c] = floatBitsToUint(sum);
            for (uint j = 0u; j + 1u < n; j++) data_d[sb + j] = data_d[sb + j + 1u];
            data_d[sb + n - 1u] = floatBitsToUint(xi);
        }
    }
}
