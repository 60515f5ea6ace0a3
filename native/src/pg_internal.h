/* Internal declarations shared by the library's translation units (not part of the ABI). */
#ifndef PG_INTERNAL_H
#define PG_INTERNAL_H

#include "pyggml.h"

/* Detected once at load time (constructor in cpu.c). */
extern uint32_t pg_g_cpu_features;
extern int32_t  pg_g_cpu_path;

/* Called whenever the path changes so per-ISA tables can be refilled. Defined in dispatch.c. */
void pg_dispatch_select(int32_t path);

#endif
