/* Per-path kernel tables. Filled for the chosen path at load time and on pg_set_cpu_path. */
#include "pg_internal.h"

void pg_dispatch_select(int32_t path) {
    (void)path;  /* kernel tables arrive with the quantized-formats work */
}
