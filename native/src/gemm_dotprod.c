/* Multi-row dot kernels (pg_type_traits.gemm) with the Armv8.2 dot-product extension (SDOT):
 * compiled with +dotprod and installed by pg_fill_gemm_neon only when the CPU reports it.
 * Same kernels as gemm_neon.c (gemm_neon_body.h), one SDOT per 16 products. */
#include <arm_neon.h>

#include "quants.h"

static inline int32x4_t gn_dot16(int32x4_t acc, int8x16_t q, int8x16_t a) {
    return vdotq_s32(acc, q, a);
}
#define GN_FN(name) name##_dotprod
#include "gemm_neon_body.h"

void pg_fill_gemm_dotprod(pg_type_traits *tbl) { fill_dotprod(tbl); }
