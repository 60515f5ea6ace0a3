#version 450
// Feature probe: compiles only where 16-bit storage and float16 arithmetic are available in the
// toolchain. The Vulkan backend loads it to confirm that the SPIR-V toolchain works and checks
// the device's 16-bit storage feature before choosing f16 pipelines.
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require

layout(local_size_x = 1) in;
layout(binding = 0) readonly buffer A { float16_t a[]; };
layout(binding = 1) writeonly buffer B { float b[]; };

void main() {
    b[gl_GlobalInvocationID.x] = float(a[gl_GlobalInvocationID.x]);
}
