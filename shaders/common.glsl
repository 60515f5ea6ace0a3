// Shared by every pyggml compute shader. Include after `#version 450`.
//
// Portability rules (nothing here may depend on one driver's behaviour):
// - Buffers are read and written as 32-bit words (`uint`): no 8/16-bit storage is needed to read
//   fp16 or quantized blocks. Only shaders compiled with -DSTORE16 (chosen when the device has
//   storageBuffer16BitAccess) write fp16 through a uint16_t alias; the others use word atomics.
// - fp16 <-> fp32 conversions are done with integer arithmetic: Vulkan leaves the rounding mode
//   of float16 conversions and the handling of fp16 denormals implementation-defined, ggml's CPU
//   code rounds to nearest even and keeps denormals.
// - The workgroup size is specialization constant 0 (chosen per device from its limits).
// - Workgroup grids larger than maxComputeWorkGroupCount[0] are folded into y (see wg_linear).

#extension GL_EXT_control_flow_attributes : enable

layout(local_size_x_id = 0, local_size_y = 1, local_size_z = 1) in;
layout(constant_id = 0) const uint WG_SIZE = 64;

#define INF_F32 uintBitsToFloat(0x7f800000u)

// Linear workgroup index of a 2-D folded grid.
uint wg_linear() {
    return gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
}

// Row grids of element-wise kernels (define ROW_GRID): x walks along a row, each invocation
// taking EPT elements (specialization constant 1) WG_SIZE apart, so neighbouring invocations
// touch neighbouring elements; y and z fold the row index. Splitting a row index into
// (i1, i2, i3) then costs a few divisions per workgroup instead of several per element (integer
// division has no SIMD form on CPUs), and per-invocation costs spread over EPT elements.
#ifdef ROW_GRID
layout(constant_id = 1) const uint EPT = 1;

uint grid_row() {
    return gl_WorkGroupID.z * gl_NumWorkGroups.y + gl_WorkGroupID.y;
}

uint grid_col(uint e) {
    return (gl_WorkGroupID.x * EPT + e) * WG_SIZE + gl_LocalInvocationID.x;
}
#endif

// ---- fp16 ------------------------------------------------------------------------------------

// Exact fp16 -> fp32: the conversion instruction for normal numbers, inf and nan; denormals
// (which a device may flush) from the integer mantissa.
float f16_to_f32(uint h) {
    const float v = unpackHalf2x16(h).x;
    if ((h & 0x7c00u) != 0u || (h & 0x3ffu) == 0u) return v;
    const float d = float(h & 0x3ffu) * 5.9604644775390625e-8;   // m * 2^-24, exact
    return (h & 0x8000u) != 0u ? -d : d;
}

// fp32 -> fp16 bits, round to nearest even, overflow to inf, denormals produced.
uint f32_to_f16(float f) {
    const uint x = floatBitsToUint(f);
    const uint sign = (x >> 16) & 0x8000u;
    const uint ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return sign | 0x7e00u | ((ax >> 13) & 0x3ffu);   // nan (quiet)
    if (ax >= 0x47800000u) return sign | 0x7c00u;                            // >= 65536: inf
    if (ax >= 0x38800000u) {                                                 // normal half
        uint r = ax - 0x38000000u;
        r += 0xfffu + ((r >> 13) & 1u);
        return sign | (r >> 13);                                             // may carry to inf
    }
    const uint e = ax >> 23;
    if (e < 102u) return sign;                                               // < 2^-25: zero
    const uint m = (ax & 0x7fffffu) | 0x800000u;
    const uint shift = 126u - e;                                             // 14..24
    uint r = m >> shift;
    const uint rem = m & ((1u << shift) - 1u);
    const uint half_ = 1u << (shift - 1u);
    if (rem > half_ || (rem == half_ && (r & 1u) != 0u)) r += 1u;
    return sign | r;
}

float round_f16(float f) {
    return f16_to_f32(f32_to_f16(f));
}

// ---- byte-addressed reads from word arrays (`buf` is a uint[] buffer member) -----------------
// u8 at any byte offset; u16 at an even offset; u32 at an even offset (two words when unaligned).
#define RD_U8(buf, off) ((buf[(off) >> 2] >> (((off) & 3u) << 3)) & 0xffu)
#define RD_U16(buf, off) ((buf[(off) >> 2] >> (((off) & 2u) << 3)) & 0xffffu)
#define RD_U32A2(buf, off) ((((off) & 2u) == 0u) ? buf[(off) >> 2] \
    : ((buf[(off) >> 2] >> 16) | (buf[((off) >> 2) + 1u] << 16)))
// u32 at any byte offset (blocks of odd size: MXFP4's 17 bytes)
#define RD_U32U(buf, off) ((((off) & 3u) == 0u) ? buf[(off) >> 2] \
    : ((buf[(off) >> 2] >> (((off) & 3u) << 3)) \
       | (buf[((off) >> 2) + 1u] << (32u - (((off) & 3u) << 3)))))
#define RD_F16(buf, off) f16_to_f32(RD_U16(buf, off))
#define RD_F32(buf, word) uintBitsToFloat(buf[word])

// Signed bytes of a word, sign-extended: byte k of w.
int sbyte(uint w, uint k) {
    return int(w << (24u - 8u * k)) >> 24;
}

// ---- accurate sin/cos ------------------------------------------------------------------------
// Vulkan only bounds sin/cos on [-pi, pi] to 2^-11 absolute error; ggml's CPU uses libm. Reduce
// by pi/2 (three-part Cody-Waite constant, good to |x| ~ 1e5) and use minimax polynomials on
// [-pi/4, pi/4] (~1 ulp).
vec2 sincos_accurate(float x) {
    const float k = floor(x * 0.63661977236758134 + 0.5);
    precise float r = x - k * 1.5703125;
    r = r - k * 4.837512969970703125e-4;
    r = r - k * 7.54978995489188216e-8;
    const float r2 = r * r;
    const float s = r + r * r2 * (-1.6666654611e-1 + r2 * (8.3321608736e-3 + r2 * -1.9515295891e-4));
    const float c = 1.0 - 0.5 * r2 + r2 * r2 * (4.166664568298827e-2 + r2 * (-1.388731625493765e-3
                    + r2 * 2.443315711809948e-5));
    const int q = int(k) & 3;
    // x = k*pi/2 + r: sin/cos rotate by quadrant
    if (q == 0) return vec2(s, c);
    if (q == 1) return vec2(c, -s);
    if (q == 2) return vec2(-s, -c);
    return vec2(-c, s);
}

// ---- workgroup reductions --------------------------------------------------------------------
// Define NEED_REDUCE before including. With USE_SUBGROUP, subgroup arithmetic reduces inside a
// subgroup and shared memory combines subgroups (correct for any subgroup size, including
// devices whose subgroups are smaller than the workgroup); without it, a shared-memory tree.
// Every invocation of the workgroup must call these (uniform control flow).
#ifdef NEED_REDUCE
#ifdef USE_SUBGROUP
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif
shared float red_buf[WG_SIZE];

float wg_sum(float v) {
#ifdef USE_SUBGROUP
    v = subgroupAdd(v);
    if (gl_NumSubgroups == 1u) return v;
    barrier();
    if (subgroupElect()) red_buf[gl_SubgroupID] = v;
    barrier();
    float s = 0.0;
    for (uint i = 0u; i < gl_NumSubgroups; i++) s += red_buf[i];
    return s;
#else
    const uint t = gl_LocalInvocationID.x;
    barrier();
    red_buf[t] = v;
    barrier();
    for (uint h = WG_SIZE / 2u; h > 0u; h >>= 1) {
        if (t < h) red_buf[t] += red_buf[t + h];
        barrier();
    }
    return red_buf[0];
#endif
}

float wg_max(float v) {
#ifdef USE_SUBGROUP
    v = subgroupMax(v);
    if (gl_NumSubgroups == 1u) return v;
    barrier();
    if (subgroupElect()) red_buf[gl_SubgroupID] = v;
    barrier();
    float s = -INF_F32;
    for (uint i = 0u; i < gl_NumSubgroups; i++) s = max(s, red_buf[i]);
    return s;
#else
    const uint t = gl_LocalInvocationID.x;
    barrier();
    red_buf[t] = v;
    barrier();
    for (uint h = WG_SIZE / 2u; h > 0u; h >>= 1) {
        if (t < h) red_buf[t] = max(red_buf[t], red_buf[t + h]);
        barrier();
    }
    return red_buf[0];
#endif
}
#endif
