/* IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, TQ1_0, TQ2_0 · Q8_K on AArch64 without
 * the dot-product extension (kernels in iq_tq_neon_body.h); where the CPU has it,
 * quants_iq_tq_dotprod.c's replace them. Installed by pg_fill_iquants_neon. */
#include <arm_neon.h>

#include "quants.h"

/* 16 products (exact in int16) into 4 int32 lanes: widening multiplies, pairwise adds */
static inline int32x4_t iqn_dot16(int8x16_t q, int8x16_t a) {
    return vpadalq_s16(vpaddlq_s16(vmull_s8(vget_low_s8(q), vget_low_s8(a))), vmull_high_s8(q, a));
}
#define IQN_FN(name) name##_neon
#include "iq_tq_neon_body.h"

void pg_fill_iq_tq_neon(pg_type_traits *tbl, uint32_t features) {
    fill_iq_tq_neon(tbl);
    if (features & PG_CPU_DOTPROD) pg_fill_iq_tq_dotprod(tbl);
}
