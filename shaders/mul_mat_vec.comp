#version 450
#extension GL_GOOGLE_include_directive : require
// MUL_MAT, matrix-vector form for NUM_COLS (= p.M) activation rows: d[n, m, i2, i3] =
// sum_k a[k, n, i2/r2, i3/r3] * b[k, m, i2, i3]. One workgroup per NUM_ROWS weight rows (folded
// x/y grid), computed together so each activation value is loaded once for all of them;
// z = plane i2 + i3 * B2. A row is dequantized once and used for every activation row.
// a: TYPE_* with dense rows (offsets/strides in bytes when quantized, in elements for F32/F16);
// b and d: F32 with dense rows (strides in elements). `row0` is the first output row of this
// dispatch (a weight matrix larger than one binding is split by rows; a_off points at row0).
//
// With -DMUL_MAT_ID: MUL_MAT_ID, d[n, i, t] = sum_k a[k, n, ids[i, t]] * b[k, i % n_b, t], one
// workgroup per NUM_ROWS rows of one (slot i, token t) entry (z = i + n_ids * t; NUM_COLS = 1),
// so only the selected experts' rows are read. Stacked experts larger than one binding are
// split by experts: this dispatch sees experts [e0, e1) (a_off points at e0) and skips the
// others. An id outside [0, n_as) gives a zero row (written by the e0 == 0 dispatch) and sets
// `status` to `tag`. ids: I32, any strides.
#define NEED_REDUCE
#include "common.glsl"

layout(binding = 0) readonly buffer A { uint data_a[]; };
layout(binding = 1) readonly buffer B { uint data_b[]; };
layout(binding = 2) buffer D { uint data_d[]; };
#ifdef MUL_MAT_ID
layout(binding = 3) readonly buffer I { int data_ids[]; };
layout(binding = 4) buffer S { uint status[]; };
#endif

#include "dequant.glsl"

layout(constant_id = 1) const uint NUM_ROWS = 1;
layout(constant_id = 2) const uint NUM_COLS = 1;   // activation rows (p.M), a compile-time loop

#ifdef MUL_MAT_ID
layout(push_constant) uniform P {
    uint K, N;
    uint a_off, a_nb1, a_nb2;          // a_nb2: bytes (quantized) or elements between experts
    uint e0, e1, n_as;
    uint n_ids, n_b, n_ent;            // n_ent = n_ids * n_tokens (the grid's z)
    uint b_off, b_s1, b_s2;
    uint ids_off, ids_s0, ids_s1;
    uint d_off, d_s1, d_s2;
    uint tag;
} p;
#else
layout(push_constant) uniform P {
    uint K, N, M;
    uint a_off, a_nb1, a_nb2, a_nb3;
    uint r2, r3, B2;
    uint b_off, b_s1, b_s2, b_s3;
    uint d_off, d_s1, d_s2, d_s3;
    uint row0;
} p;
#endif

void main() {
    const uint n0 = wg_linear() * NUM_ROWS;
    if (n0 >= p.N) return;                              // whole workgroup
    const uint nr = min(NUM_ROWS, p.N - n0);            // rows of this workgroup (uniform)
    const uint t = gl_LocalInvocationID.x;
#ifdef MUL_MAT_ID
    const uint slot = gl_WorkGroupID.z % p.n_ids, tok = gl_WorkGroupID.z / p.n_ids;
    const int e = data_ids[p.ids_off + slot * p.ids_s0 + tok * p.ids_s1];   // uniform
    const uint db = p.d_off + n0 + slot * p.d_s1 + tok * p.d_s2;
    if (e < 0 || uint(e) >= p.n_as) {
        if (p.e0 == 0u) {
            for (uint r = t; r < nr; r += WG_SIZE) data_d[db + r] = 0u;
            if (t == 0u) atomicCompSwap(status[0], 0u, p.tag);
        }
        return;
    }
    if (uint(e) < p.e0 || uint(e) >= p.e1) return;     // another dispatch has this expert
    const uint ab = p.a_off + (uint(e) - p.e0) * p.a_nb2 + n0 * p.a_nb1;
    const uint bb = p.b_off + (slot % p.n_b) * p.b_s1 + tok * p.b_s2;
#else
    const uint i2 = gl_WorkGroupID.z % p.B2, i3 = gl_WorkGroupID.z / p.B2;
    const uint ab = p.a_off + n0 * p.a_nb1 + (i2 / p.r2) * p.a_nb2 + (i3 / p.r3) * p.a_nb3;
    const uint bb = p.b_off + i2 * p.b_s2 + i3 * p.b_s3;
#endif
    float acc[NUM_ROWS][NUM_COLS];
    [[unroll]] for (uint r = 0u; r < NUM_ROWS; r++) {
        [[unroll]] for (uint m = 0u; m < NUM_COLS; m++) acc[r][m] = 0.0;
    }
#ifdef IS_FLOAT_TYPE
    for (uint k = t; k < p.K; k += WG_SIZE) {
        float x[NUM_COLS];
        [[unroll]] for (uint m = 0u; m < NUM_COLS; m++) x[m] = uintBitsToFloat(data_b[bb + m * p.b_s1 + k]);
        [[unroll]] for (uint r = 0u; r < NUM_ROWS; r++) {
            // a row past the end re-reads the last row (its result is not written)
            const float w = load_a(ab + min(r, nr - 1u) * p.a_nb1 + k);
            [[unroll]] for (uint m = 0u; m < NUM_COLS; m++) acc[r][m] += w * x[m];
        }
    }
#else
    // consecutive invocations take consecutive groups of 4 elements (coalesced reads)
    for (uint e = 4u * t; e < p.K; e += 4u * WG_SIZE) {
        vec4 x[NUM_COLS];
        [[unroll]] for (uint m = 0u; m < NUM_COLS; m++) {
            const uint bi = bb + m * p.b_s1 + e;
            x[m] = vec4(uintBitsToFloat(data_b[bi]), uintBitsToFloat(data_b[bi + 1u]),
                        uintBitsToFloat(data_b[bi + 2u]), uintBitsToFloat(data_b[bi + 3u]));
        }
        const uint boff = (e / QK) * QBYTES;
        [[unroll]] for (uint r = 0u; r < NUM_ROWS; r++) {
            const vec4 w = dequant4(ab + min(r, nr - 1u) * p.a_nb1 + boff, e % QK);
            [[unroll]] for (uint m = 0u; m < NUM_COLS; m++) acc[r][m] += dot(w, x[m]);
        }
    }
#endif
    [[unroll]] for (uint r = 0u; r < NUM_ROWS; r++) {
        [[unroll]] for (uint m = 0u; m < NUM_COLS; m++) {
            const float s = wg_sum(acc[r][m]);
#ifdef MUL_MAT_ID
            if (t == 0u && r < nr) data_d[db + r] = floatBitsToUint(s);
#else
            if (t == 0u && r < nr) {
                data_d[p.d_off + p.row0 + n0 + r + m * p.d_s1 + i2 * p.d_s2 + i3 * p.d_s3] =
                    floatBitsToUint(s);
            }
#endif
        }
    }
}
