/* legacy formats: optional AVX-512 kernels (an extra beside AVX2, never required). */
#include "quants.h"

void pg_fill_legacy_avx512(pg_type_traits *tbl) { (void)tbl; }
