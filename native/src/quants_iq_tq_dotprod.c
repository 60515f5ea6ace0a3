/* The kernels of quants_iq_tq_neon.c with the Armv8.2 dot-product extension (SDOT: one
 * instruction per 16 products). Compiled
 * with +dotprod and installed only when the CPU reports PG_CPU_DOTPROD. */
#include <arm_neon.h>

#include "quants.h"

static inline int32x4_t iqn_dot16(int8x16_t q, int8x16_t a) {
    return vdotq_s32(vdupq_n_s32(0), q, a);
}
#define IQN_FN(name) name##_dotprod
#include "iq_tq_neon_body.h"

void pg_fill_iq_tq_dotprod(pg_type_traits *tbl) { fill_iq_tq_dotprod(tbl); }
