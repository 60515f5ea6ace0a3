/* Recurrent-layer kernels (ops_ssm.c): SSM_CONV, GATED_DELTA_NET and SOFTPLUS. */
#ifndef PG_OPS_SSM_H
#define PG_OPS_SSM_H

#include "ops.h"

/* PG_OK if node t (sources s[0..]) can run; else a status and a reason (graph.c's contract). */
int32_t pg_ssm_supported(const pg_tensor *t, const pg_tensor *const *s, char *reason,
                         size_t reason_size);
size_t  pg_ssm_work_size(const pg_tensor *all, const pg_tensor *t, int nth);
void    pg_fwd_ssm(const pg_cparams *p, pg_tensor *all, pg_tensor *t);

/* Per-path inner kernels of the recurrent ops, one table per kernel path, built in dispatch.c
 * like the attention table: scalar (ops_ssm.c, the reference), avx2 (ops_ssm_avx2.c), avx512
 * (ops_ssm_avx512.c), neon (ops_ssm_neon.c). A kernel's arithmetic depends only on its own
 * arguments, never on how many tokens or threads the op has: batch invariance holds per path. */
typedef struct pg_ssm_kernels {
    /* One token of the gated delta rule on n rows of one head's state (row r at rows + r·Dk
     * holds column j0 + r of S[i][j]): per row,
     *   row *= decay; d = (v[r] - Σ_i row[i]·k[i])·beta; row += k·d;
     *   o[r] = scale·Σ_i row[i]·q[i] */
    void (*delta_rows)(int64_t Dk, int64_t n, float *rows, const float *k, const float *q,
                       const float *v, float decay, float beta, float scale, float *o);
    /* One token of the short convolution on n channels, K-1 = nk taps of history:
     *   y[c] = Σ_{j<nk} hist[j][c]·w[j][c] + x[c]·w[nk][c], summed from j = 0 (ggml's order);
     * hist[j] and w[j] are rows of n floats (channel-inner, so it vectorizes over channels). */
    void (*conv_rows)(int64_t n, int64_t nk, const float *const *hist, const float *x,
                      const float *w, int64_t ldw, float *y);
} pg_ssm_kernels;

const pg_ssm_kernels *pg_get_ssm_kernels(void);
const pg_ssm_kernels *pg_get_ssm_kernels_for_path(int32_t path);

void pg_fill_ssm_scalar(pg_ssm_kernels *k);
#if defined(__x86_64__)
void pg_fill_ssm_avx2(pg_ssm_kernels *k);
void pg_fill_ssm_avx512(pg_ssm_kernels *k);
#endif
#if defined(__aarch64__)
void pg_fill_ssm_neon(pg_ssm_kernels *k);
#endif

#endif
