/* Multi-row dot kernels (pg_type_traits.gemm) with NEON. */
#include <arm_neon.h>

#include "gemm.h"
#include "quants.h"

void pg_fill_gemm_neon(pg_type_traits *tbl, uint32_t features) {
    (void)features;
    for (int t = 0; t < PG_TYPE_COUNT; t++) tbl[t].gemm = NULL;
}
