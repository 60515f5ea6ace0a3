# Every SPIR-V module the Vulkan backend loads: name:source:defines (defines joined by '+').
# The Makefile compiles each to build/shaders/<name>.spv; a failing compile stops the build. The
# backend reads this file for the modules it needs and checks at discovery that each is present
# (pyggml/backend/vulkan/shaders.py), so keep it to plain `NAME := words` assignments; the
# Makefile does the expanding. pyggml/backend/vulkan/*.py builds the same names:
# <op>[_<type>][_sg][_s16].
#   _sg   subgroup-arithmetic reductions (chosen when the device supports them in compute)
#   _s16  fp16 stores through 16-bit storage (chosen with storageBuffer16BitAccess)
VK_TYPES := f32 f16 q4_0 q4_1 q5_0 q5_1 q8_0 q4_k q5_k q6_k iq4_nl iq4_xs mxfp4 \
    iq2_xxs iq2_xs iq2_s iq3_xxs iq3_s iq1_s iq1_m tq1_0 tq2_0

VK_SHADERS := \
    binary:binary.comp: unary:unary.comp: rope:rope.comp: \
    norm:norm.comp: norm_sg:norm.comp:-DUSE_SUBGROUP \
    soft_max:soft_max.comp: soft_max_sg:soft_max.comp:-DUSE_SUBGROUP \
    flash_attn:flash_attn.comp: flash_attn_sg:flash_attn.comp:-DUSE_SUBGROUP \
    cpy:cpy.comp: cpy_s16:cpy.comp:-DSTORE16 \
    set_rows:set_rows.comp: set_rows_s16:set_rows.comp:-DSTORE16 \
    concat:concat.comp: concat_s16:concat.comp:-DSTORE16 \
    argsort:argsort.comp: ssm_conv:ssm_conv.comp: \
    gated_delta:gated_delta.comp: gated_delta_sg:gated_delta.comp:-DUSE_SUBGROUP

# one module per type of VK_TYPES: '%' stands for the type (q4_k), '@' for it in capitals (Q4_K)
VK_TYPED_SHADERS := \
    get_rows_%:get_rows.comp:-DTYPE_@ \
    mul_mat_%:mul_mat.comp:-DTYPE_@ \
    mul_mat_vec_%:mul_mat_vec.comp:-DTYPE_@ \
    mul_mat_vec_%_sg:mul_mat_vec.comp:-DTYPE_@+-DUSE_SUBGROUP \
    mul_mat_id_%:mul_mat.comp:-DTYPE_@+-DMUL_MAT_ID \
    mul_mat_vec_id_%:mul_mat_vec.comp:-DTYPE_@+-DMUL_MAT_ID \
    mul_mat_vec_id_%_sg:mul_mat_vec.comp:-DTYPE_@+-DMUL_MAT_ID+-DUSE_SUBGROUP

# built but not loaded by the backend (a probe of the compiler's fp16 support)
VK_TOOL_SHADERS := probe_fp16:probe_fp16.comp:
