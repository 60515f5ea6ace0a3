/* legacy formats: NEON kernels (dotprod variants used when `features` has PG_CPU_DOTPROD). */
#include "quants.h"

void pg_fill_legacy_neon(pg_type_traits *tbl, uint32_t features) { (void)tbl; (void)features; }
