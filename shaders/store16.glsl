// fp16 stores into the word array `data_d` (binding D16_BINDING): through a uint16_t alias when
// compiled with -DSTORE16 (device has storageBuffer16BitAccess), else with two word atomics that
// touch only the 16 bits written (safe against neighbours writing the other half concurrently).
#ifdef STORE16
#extension GL_EXT_shader_16bit_storage : require
layout(binding = D16_BINDING) buffer D16 { uint16_t data_d16[]; };
#endif

void store_f16_bits(uint i, uint bits) {
#ifdef STORE16
    data_d16[i] = uint16_t(bits);
#else
    const uint w = i >> 1;
    const uint sh = (i & 1u) << 4;
    atomicAnd(data_d[w], ~(0xffffu << sh));
    atomicOr(data_d[w], (bits & 0xffffu) << sh);
#endif
}
