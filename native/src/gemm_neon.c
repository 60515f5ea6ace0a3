/* Multi-row dot kernels (pg_type_traits.gemm), AArch64 Advanced SIMD without the dot-product
 * extension (kernels in gemm_neon_body.h); on CPUs with it, gemm_dotprod.c's replace them. */
#include <arm_neon.h>

#include "quants.h"

/* 16 products of signed bytes into 4 int32 lanes: widening multiplies (a pair of products
 * fits int16: |q·a| <= 128·127), then pairwise widening adds. */
static inline int32x4_t gn_dot16(int32x4_t acc, int8x16_t q, int8x16_t a) {
    return vpadalq_s16(acc, vmlal_high_s8(vmull_s8(vget_low_s8(q), vget_low_s8(a)), q, a));
}
#define GN_FN(name) name##_neon
#include "gemm_neon_body.h"

void pg_fill_gemm_neon(pg_type_traits *tbl, uint32_t features) {
    for (int t = 0; t < PG_TYPE_COUNT; t++) tbl[t].gemm = NULL;
    fill_neon(tbl);
    if (features & PG_CPU_DOTPROD) pg_fill_gemm_dotprod(tbl);
}
