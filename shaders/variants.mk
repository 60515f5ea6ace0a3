# Every SPIR-V module the Vulkan backend loads: name:source:defines (defines joined by '+').
# The Makefile compiles each to build/shaders/<name>.spv; a failing compile stops the build. The
# backend checks at discovery that every module it needs is present (pyggml/backend/vulkan_*.py
# builds the same names: <op>[_<type>][_sg][_s16]).
#   _sg   subgroup-arithmetic reductions (chosen when the device supports them in compute)
#   _s16  fp16 stores through 16-bit storage (chosen with storageBuffer16BitAccess)
VK_TYPES := f32 f16 q4_0 q4_1 q5_0 q5_1 q8_0 q4_k q5_k q6_k
vk_uc = $(subst q,Q,$(subst k,K,$(subst f,F,$(1))))

VK_VARIANTS := probe_fp16:probe_fp16.comp: \
    binary:binary.comp: unary:unary.comp: rope:rope.comp: \
    norm:norm.comp: norm_sg:norm.comp:-DUSE_SUBGROUP \
    soft_max:soft_max.comp: soft_max_sg:soft_max.comp:-DUSE_SUBGROUP \
    flash_attn:flash_attn.comp: flash_attn_sg:flash_attn.comp:-DUSE_SUBGROUP \
    cpy:cpy.comp: cpy_s16:cpy.comp:-DSTORE16 \
    set_rows:set_rows.comp: set_rows_s16:set_rows.comp:-DSTORE16 \
    concat:concat.comp: concat_s16:concat.comp:-DSTORE16 \
    argsort:argsort.comp:
VK_VARIANTS += $(foreach t,$(VK_TYPES),get_rows_$(t):get_rows.comp:-DTYPE_$(call vk_uc,$(t)))
VK_VARIANTS += $(foreach t,$(VK_TYPES),mul_mat_$(t):mul_mat.comp:-DTYPE_$(call vk_uc,$(t)))
VK_VARIANTS += $(foreach t,$(VK_TYPES),mul_mat_vec_$(t):mul_mat_vec.comp:-DTYPE_$(call vk_uc,$(t)))
VK_VARIANTS += $(foreach t,$(VK_TYPES),mul_mat_vec_$(t)_sg:mul_mat_vec.comp:-DTYPE_$(call vk_uc,$(t))+-DUSE_SUBGROUP)
VK_VARIANTS += $(foreach t,$(VK_TYPES),mul_mat_id_$(t):mul_mat.comp:-DTYPE_$(call vk_uc,$(t))+-DMUL_MAT_ID)
VK_VARIANTS += $(foreach t,$(VK_TYPES),mul_mat_vec_id_$(t):mul_mat_vec.comp:-DTYPE_$(call vk_uc,$(t))+-DMUL_MAT_ID)
VK_VARIANTS += $(foreach t,$(VK_TYPES),mul_mat_vec_id_$(t)_sg:mul_mat_vec.comp:-DTYPE_$(call vk_uc,$(t))+-DMUL_MAT_ID+-DUSE_SUBGROUP)
