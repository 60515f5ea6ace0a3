#version 450
#extension GL_GOOGLE_include_directive : require
// GET_ROWS: d[:, i10, i11, i12] = a[:, b[i10, i11, i12], i11, i12], dequantized to F32 (or I32
// rows copied as words). a: one TYPE_* (see dequant.glsl), dense rows; b: I32; d: dense rows.
// Rows of a outside [row0, row1) are left to another dispatch (a matrix larger than one storage
// buffer binding is split by rows; a_off is then the offset of row0). An index outside a gives a
// zero row and sets `status` to `tag` (the backend raises after the graph, naming the node).
// Row grid (common.glsl) over output rows; x walks elements (groups of 4 when quantized).
#define ROW_GRID
#include "common.glsl"

layout(binding = 0) readonly buffer A { uint data_a[]; };
layout(binding = 1) readonly buffer B { int data_b[]; };
layout(binding = 2) buffer D { uint data_d[]; };
layout(binding = 3) buffer S { uint status[]; };

#include "dequant.glsl"

layout(push_constant) uniform P {
    uint ne0;                          // elements per row
    uint n_idx, b_ne0, b_ne1;          // n_idx = b.ne0 * b.ne1 * b.ne2
    uint a_off, a_nb1, a_nb2, a_nb3;   // bytes (quantized) or elements (F32/F16/I32)
    uint a_ne1, row0, row1;
    uint b_off, b_s0, b_s1, b_s2;
    uint d_off, d_s1, d_s2, d_s3;
    uint tag;
} p;

void main() {
#ifdef IS_FLOAT_TYPE
    const uint per_row = p.ne0;
#else
    const uint per_row = p.ne0 / 4u;
#endif
    const uint r = grid_row();
    if (r >= p.n_idx) return;
    const uint i10 = r % p.b_ne0, i11 = (r / p.b_ne0) % p.b_ne1, i12 = r / (p.b_ne0 * p.b_ne1);
    const int row = data_b[p.b_off + i10 * p.b_s0 + i11 * p.b_s1 + i12 * p.b_s2];
    const uint db = p.d_off + i10 * p.d_s1 + i11 * p.d_s2 + i12 * p.d_s3;
    const bool bad = row < 0 || uint(row) >= p.a_ne1;
    if (bad) {
        if (p.row0 != 0u) return;
        if (gl_LocalInvocationID.x == 0u) atomicCompSwap(status[0], 0u, p.tag);
    } else if (uint(row) < p.row0 || uint(row) >= p.row1) {
        return;                                  // another dispatch has this row
    }
    const uint ab = p.a_off + (uint(row) - p.row0) * p.a_nb1 + i11 * p.a_nb2 + i12 * p.a_nb3;
    for (uint e = 0u; e < EPT; e++) {
        const uint u = grid_col(e);
        if (u >= per_row) return;
#if defined(IS_FLOAT_TYPE)
        if (bad) { data_d[db + u] = 0u; continue; }
#if defined(TYPE_F32)
        data_d[db + u] = data_a[ab + u];         // bit copy (also I32)
#else
        data_d[db + u] = floatBitsToUint(load_a(ab + u));
#endif
#else
        const uint c = 4u * u;
        vec4 v = vec4(0.0);
        if (!bad) v = dequant4(ab + (c / QK) * QBYTES, c % QK);
        data_d[db + c] = floatBitsToUint(v.x);
        data_d[db + c + 1u] = floatBitsToUint(v.y);
        data_d[db + c + 2u] = floatBitsToUint(v.z);
        data_d[db + c + 3u] = floatBitsToUint(v.w);
#endif
    }
}
