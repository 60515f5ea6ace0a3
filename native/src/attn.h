/* Per-path inner kernels of FLASH_ATTN_EXT (ops_attn.c drives them over tiles of query rows and
 * blocks of keys). One table per kernel path, built in dispatch.c like the type traits:
 *   scalar (ops_attn.c, the reference), avx2 (attn_avx2.c), avx512 (attn_avx512.c);
 * neon uses the scalar table (plain loops the compiler vectorizes for NEON).
 * All matrices are fp32, row-major, rows `ld*` floats apart. */
#ifndef PG_ATTN_H
#define PG_ATTN_H

#include <stdint.h>

typedef struct pg_attn_kernels {
    /* s[r·lds + c] = Σ_d q[r·ldq + d] · k[c·ldk + d] over d < D, for r < nr, c < nc. */
    void (*qk)(int64_t D, int64_t nr, int64_t nc, const float *q, int64_t ldq, const float *k,
               int64_t ldk, float *s, int64_t lds);
    /* acc[r·lda + x] = acc[r·lda + x] · ms[r] + Σ_c p[r·ldp + c] · v[c·ldv + x], x < Dv. */
    void (*pv)(int64_t Dv, int64_t nr, int64_t nc, const float *p, int64_t ldp, const float *v,
               int64_t ldv, const float *ms, float *acc, int64_t lda);
    /* qk and pv with K / V rows as fp16 bits (an F16 cache read in place, no fp32 copy): the
     * same results as converting the rows first */
    void (*qk_f16)(int64_t D, int64_t nr, int64_t nc, const float *q, int64_t ldq,
                   const uint16_t *k, int64_t ldk, float *s, int64_t lds);
    void (*pv_f16)(int64_t Dv, int64_t nr, int64_t nc, const float *p, int64_t ldp,
                   const uint16_t *v, int64_t ldv, const float *ms, float *acc, int64_t lda);
    /* s[c] = s[c]·scale + slope·mask[c] (mask NULL: no term) for c < n; returns max s[c]. */
    float (*scale_max)(float *s, int64_t n, float scale, const float *mask, float slope);
    /* s[c] = exp(s[c] - m) for c < n (exp(-inf) = 0); returns Σ s[c]. */
    float (*exp_sum)(float *s, int64_t n, float m);
    /* y[i] = fp32 of the fp16 bits x[i] (bit-exact) */
    void (*f16_to_f32)(const uint16_t *x, float *y, int64_t n);
    /* y[i] = x[i] rounded to fp16 (RNE) and back: q rows as the F16 K dots of ggml see them */
    void (*round_f16)(const float *x, float *y, int64_t n);
    /* y[i] = x[i] / (1 + exp(-x[i])) (SILU; not attention's, but it needs the same exp: here
     * beside exp_sum rather than a second per-path table for one kernel) */
    void (*silu)(const float *x, float *y, int64_t n);
} pg_attn_kernels;

/* The table of the current path / of a given path (NULL if not compiled in). */
const pg_attn_kernels *pg_get_attn_kernels(void);
const pg_attn_kernels *pg_get_attn_kernels_for_path(int32_t path);

void pg_fill_attn_scalar(pg_attn_kernels *k);
#if defined(__x86_64__)
void pg_fill_attn_avx2(pg_attn_kernels *k);
void pg_fill_attn_avx512(pg_attn_kernels *k);
#endif

#endif
