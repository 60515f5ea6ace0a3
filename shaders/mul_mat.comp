#version 450
#extension GL_GOOGLE_include_directive : require
// MUL_MAT, tiled form for many activation rows: a workgroup computes a BN (weight rows) x BM
// (activation rows) tile of d, each invocation TN x TM outputs; K is walked in steps of BK with
// both tiles staged in shared memory (weights dequantized once per tile). Same operands and
// push constants as mul_mat_vec.comp; the workgroup size must be (BN/TN) * (BM/TM).
#include "common.glsl"

layout(constant_id = 1) const uint BM = 32;
layout(constant_id = 2) const uint BN = 32;
#define BK 32u
#define TM 4u
#define TN 4u
#define LDS (BK + 1u)

layout(binding = 0) readonly buffer A { uint data_a[]; };
layout(binding = 1) readonly buffer B { uint data_b[]; };
layout(binding = 2) buffer D { uint data_d[]; };
#ifdef MUL_MAT_ID
layout(binding = 3) readonly buffer I { int data_ids[]; };
layout(binding = 4) buffer S { uint status[]; };
#endif

#include "dequant.glsl"

#ifdef MUL_MAT_ID
layout(push_constant) uniform P {
    uint K, N;
    uint a_off, a_nb1, a_nb2;
    uint e0, e1, n_as;
    uint n_ids, n_b, n_ent;            // n_ent = n_ids * n_tokens
    uint b_off, b_s1, b_s2;
    uint ids_off, ids_s0, ids_s1;
    uint d_off, d_s1, d_s2;
    uint tag;
} p;
shared uint rows[BM];          // entries (slot + n_ids * token) of the current tile
shared uint part[WG_SIZE];     // entries of this expert in each invocation's chunk
uint mc;                       // valid rows of the current tile
#else
layout(push_constant) uniform P {
    uint K, N, M;
    uint a_off, a_nb1, a_nb2, a_nb3;
    uint r2, r3, B2;
    uint b_off, b_s1, b_s2, b_s3;
    uint d_off, d_s1, d_s2, d_s3;
    uint row0;
} p;
uint m0, bb, i2, i3;
#endif

shared float sa[BN * LDS];
shared float sb[BM * LDS];

// word index of activation row r of the current tile (valid rows only), of output row r
#ifdef MUL_MAT_ID
bool row_ok(uint r) { return r < mc; }
uint brow(uint r) {
    const uint en = rows[r];
    return p.b_off + ((en % p.n_ids) % p.n_b) * p.b_s1 + (en / p.n_ids) * p.b_s2;
}
uint drow(uint r) {
    const uint en = rows[r];
    return p.d_off + (en % p.n_ids) * p.d_s1 + (en / p.n_ids) * p.d_s2;
}
#else
bool row_ok(uint r) { return m0 + r < p.M; }
uint brow(uint r) { return bb + (m0 + r) * p.b_s1; }
uint drow(uint r) { return p.d_off + p.row0 + (m0 + r) * p.d_s1 + i2 * p.d_s2 + i3 * p.d_s3; }
#endif

// one BN x BM tile of d: weight rows n0.. (ab: the plane's first row) x the tile's rows
void tile(const uint n0, const uint ab) {
    const uint t = gl_LocalInvocationID.x;
    const uint tx = t % (BN / TN), ty = t / (BN / TN);
    float acc[TM][TN];
    [[unroll]] for (uint i = 0u; i < TM; i++) {
        [[unroll]] for (uint j = 0u; j < TN; j++) acc[i][j] = 0.0;
    }
    for (uint k0 = 0u; k0 < p.K; k0 += BK) {
#ifdef IS_FLOAT_TYPE
        for (uint idx = t; idx < BN * BK; idx += WG_SIZE) {
            const uint r = idx / BK, c = idx % BK;
            const uint n = n0 + r, k = k0 + c;
            sa[r * LDS + c] = (n < p.N && k < p.K) ? load_a(ab + n * p.a_nb1 + k) : 0.0;
        }
#else
        for (uint idx = t; idx < BN * (BK / 4u); idx += WG_SIZE) {
            const uint r = idx / (BK / 4u), c = 4u * (idx % (BK / 4u));
            const uint n = n0 + r, k = k0 + c;
            vec4 v = vec4(0.0);
            if (n < p.N) v = dequant4(ab + n * p.a_nb1 + (k / QK) * QBYTES, k % QK);
            sa[r * LDS + c] = v.x;
            sa[r * LDS + c + 1u] = v.y;
            sa[r * LDS + c + 2u] = v.z;
            sa[r * LDS + c + 3u] = v.w;
        }
#endif
        for (uint idx = t; idx < BM * BK; idx += WG_SIZE) {
            const uint r = idx / BK, c = idx % BK;
            const uint k = k0 + c;
            sb[r * LDS + c] = (row_ok(r) && k < p.K) ? uintBitsToFloat(data_b[brow(r) + k]) : 0.0;
        }
        barrier();
        for (uint kk = 0u; kk < BK; kk++) {
            float av[TN], bv[TM];
            [[unroll]] for (uint j = 0u; j < TN; j++) av[j] = sa[(tx + j * (BN / TN)) * LDS + kk];
            [[unroll]] for (uint i = 0u; i < TM; i++) bv[i] = sb[(ty + i * (BM / TM)) * LDS + kk];
            [[unroll]] for (uint i = 0u; i < TM; i++) {
                [[unroll]] for (uint j = 0u; j < TN; j++) acc[i][j] += bv[i] * av[j];
            }
        }
        barrier();
    }
    [[unroll]] for (uint i = 0u; i < TM; i++) {
        const uint r = ty + i * (BM / TM);
        [[unroll]] for (uint j = 0u; j < TN; j++) {
            const uint n = n0 + tx + j * (BN / TN);
            if (row_ok(r) && n < p.N) data_d[drow(r) + n] = floatBitsToUint(acc[i][j]);
        }
    }
}

#ifdef MUL_MAT_ID
int id_of(uint en) {
    return data_ids[p.ids_off + (en % p.n_ids) * p.ids_s0 + (en / p.n_ids) * p.ids_s1];
}

void main() {
    const uint n0 = gl_WorkGroupID.x * BN;
    const uint z = gl_WorkGroupID.z;
    const int e = int(p.e0 + z);
    const uint t = gl_LocalInvocationID.x;
    const bool report = p.e0 == 0u && z == 0u && gl_WorkGroupID.x == 0u;
    // this invocation's chunk of entries; how many of them are this expert's
    const uint chunk = (p.n_ent + WG_SIZE - 1u) / WG_SIZE;
    const uint c0 = min(t * chunk, p.n_ent), c1 = min(c0 + chunk, p.n_ent);
    uint mine = 0u;
    for (uint en = c0; en < c1; en++) {
        const int id = id_of(en);
        if (id == e) {
            mine++;
        } else if (report && (id < 0 || uint(id) >= p.n_as)) {
            const uint db = p.d_off + (en % p.n_ids) * p.d_s1 + (en / p.n_ids) * p.d_s2;
            for (uint n = 0u; n < p.N; n++) data_d[db + n] = 0u;
            atomicCompSwap(status[0], 0u, p.tag);
        }
    }
    part[t] = mine;
    barrier();
    uint first = 0u, total = 0u;               // rank of this chunk's first entry; all entries
    for (uint i = 0u; i < WG_SIZE; i++) {
        const uint c = part[i];
        if (i < t) first += c;
        total += c;
    }
    const uint ab = p.a_off + z * p.a_nb2;
    for (uint m0 = 0u; m0 < total; m0 += BM) {   // total is uniform: so are the barriers
        barrier();                               // the previous tile is done with rows[]
        uint r = first;
        for (uint en = c0; en < c1 && r < m0 + BM; en++) {
            if (id_of(en) == e) {
                if (r >= m0) rows[r - m0] = en;
                r++;
            }
        }
        barrier();
        mc = min(BM, total - m0);
        tile(n0, ab);
    }
}
#else
void main() {
    const uint n0 = gl_WorkGroupID.x * BN;
    m0 = gl_WorkGroupID.y * BM;
    i2 = gl_WorkGroupID.z % p.B2;
    i3 = gl_WorkGroupID.z / p.B2;
    bb = p.b_off + i2 * p.b_s2 + i3 * p.b_s3;
    tile(n0, p.a_off + (i2 / p.r2) * p.a_nb2 + (i3 / p.r3) * p.a_nb3);
}
#endif
