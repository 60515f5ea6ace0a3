/* Recurrent-layer kernels (ops_ssm.c): SSM_CONV, GATED_DELTA_NET and SOFTPLUS. */
#ifndef PG_OPS_SSM_H
#define PG_OPS_SSM_H

#include "ops.h"

/* PG_OK if node t (sources s[0..]) can run; else a status and a reason (graph.c's contract). */
int32_t pg_ssm_supported(const pg_tensor *t, const pg_tensor *const *s, char *reason,
                         size_t reason_size);
size_t  pg_ssm_work_size(const pg_tensor *all, const pg_tensor *t, int nth);
void    pg_fwd_ssm(const pg_cparams *p, pg_tensor *all, pg_tensor *t);

#endif
