/* kquants formats: scalar reference kernels. (Filled in by the quantized-formats work.) */
#include "quants.h"

void pg_fill_kquants_scalar(pg_type_traits *tbl) { (void)tbl; }
