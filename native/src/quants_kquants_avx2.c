/* kquants formats: AVX2 + FMA + F16C kernels. */
#include "quants.h"

void pg_fill_kquants_avx2(pg_type_traits *tbl) { (void)tbl; }
