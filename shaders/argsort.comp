#version 450
#extension GL_GOOGLE_include_directive : require
// ARGSORT: d[:, i1, i2, i3] = the indices that sort row a[:, i1, i2, i3] (F32, dense rows, any
// row strides; d I32 dense rows). One workgroup per row: a bitonic sort of the row padded to
// n_pad (a power of two, at most MAX_N) in shared memory. The order is the CPU kernel's strict
// total order (ops_reduce.c): by value (op 0 ascending, 1 descending), equal values by index,
// NaNs last by index; padding slots after everything. A total order has one sorted
// permutation, so the result equals the CPU's whatever the sorting network.
#include "common.glsl"

#define MAX_N 1024u

layout(binding = 0) readonly buffer A { uint data_a[]; };
layout(binding = 1) buffer D { uint data_d[]; };

layout(push_constant) uniform P {
    uint ne0, ne1, ne2, ne3;
    uint a_off, a_s1, a_s2, a_s3;
    uint d_off, d_s1, d_s2, d_s3;
    uint desc, n_pad;
} p;

shared float key[MAX_N];
shared uint idx[MAX_N];

// slot x (value key[x], index idx[x]) comes before slot y
bool before(uint x, uint y) {
    const uint ix = idx[x], iy = idx[y];
    const bool px = ix >= p.ne0, py = iy >= p.ne0;           // padding
    if (px || py) return !px && py;
    const float a = key[x], b = key[y];
    const bool na = isnan(a), nb = isnan(b);
    if (na || nb) return na == nb ? ix < iy : nb;
    if (a != b) return p.desc != 0u ? a > b : a < b;
    return ix < iy;
}

void main() {
    const uint row = wg_linear();
    if (row >= p.ne1 * p.ne2 * p.ne3) return;       // whole workgroup: uniform
    const uint i1 = row % p.ne1, i2 = (row / p.ne1) % p.ne2, i3 = row / (p.ne1 * p.ne2);
    const uint ab = p.a_off + i1 * p.a_s1 + i2 * p.a_s2 + i3 * p.a_s3;
    const uint db = p.d_off + i1 * p.d_s1 + i2 * p.d_s2 + i3 * p.d_s3;
    const uint t = gl_LocalInvocationID.x;
    for (uint i = t; i < p.n_pad; i += WG_SIZE) {
        key[i] = i < p.ne0 ? uintBitsToFloat(data_a[ab + i]) : 0.0;
        idx[i] = i;
    }
    barrier();
    for (uint k = 2u; k <= p.n_pad; k <<= 1) {
        for (uint j = k >> 1; j > 0u; j >>= 1) {
            for (uint i = t; i < p.n_pad; i += WG_SIZE) {
                const uint l = i ^ j;
                if (l > i) {
                    // blocks with (i & k) == 0 sort forward, the others backward
                    const bool fwd = (i & k) == 0u;
                    if (fwd ? before(l, i) : before(i, l)) {
                        const float tk = key[i];
                        key[i] = key[l];
                        key[l] = tk;
                        const uint ti = idx[i];
                        idx[i] = idx[l];
                        idx[l] = ti;
                    }
                }
            }
            barrier();
        }
    }
    for (uint i = t; i < p.ne0; i += WG_SIZE) data_d[db + i] = idx[i];
}
