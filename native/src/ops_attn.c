/* FLASH_ATTN_EXT: out[Dv, H, n_q, B] = softmax(q·kᵀ·scale (+softcap) + mask)·v per query row and
 * head, with an online softmax: the n_q × n_kv score matrix is never materialised.
 *
 * Work is done in tiles: up to PG_FA_QB query rows × the G = H/Hkv query heads that share one KV
 * head (FlashAttention-2's loop order). A tile walks the keys in blocks of up to PG_FA_KB; keys
 * the mask hides from the whole tile are dropped, the others' K and V rows are converted to fp32
 * once per tile and block, and the per-path kernels (attn.h) compute the block's scores
 * S = Q·Kᵀ (rows × keys), the online-softmax weights P = exp(S - running max) and
 * acc = acc·rescale + P·V as small matrix products. q is converted to K's vec_dot_type and back
 * (e.g. rounded to fp16 for F16 K), so the scores see q as ggml's K dots do; a block-quantized K
 * (a quantized KV cache) is not converted at all: its scores are the type's own dots of the
 * quantized rows with q in its vec_dot_type (gemm / vec_dot), ggml's kq_vec_dot bit for bit.
 *
 * Tiles are dealt to threads round-robin (tile i to thread i % nth): with a causal mask the
 * later query tiles see more keys, and a contiguous split left one thread three quarters of the
 * work. Each thread owns whole output rows, so results do not depend on the thread count.
 *
 * Batch invariance: a row's result depends only on the keys it sees, in cell order, never on
 * the other rows of the batch or on cells it does not see (other sequences' KV cells). So
 *   - a tile only groups consecutive query rows whose visible key sets are nested (each row sees
 *     everything the previous one sees: the causal rows of one sequence), never rows of two
 *     sequences; its kept keys are then the last row's, and each row's keys a prefix of them;
 *   - a block is the next PG_FA_KB kept keys (not a range of cells), so a row's blocks, its
 *     online-softmax rescale points and each key's place in its block are those of the row
 *     alone; hidden keys after a row's prefix add exact zeros;
 *   - the kernels compute each score, weight and output lane the same wherever the key or row
 *     sits in the block (attn_avx2.c, attn_avx512.c: one reduction tree for every score). */
#include <math.h>
#include <string.h>

#include "attn.h"
#include "fp16.h"
#include "ops.h"

#ifndef PG_FA_QB
#define PG_FA_QB 16   /* query rows per tile */
#endif
#ifndef PG_FA_KB
#define PG_FA_KB 64   /* keys per block */
#endif

typedef struct {
    int64_t D, Dv, n_q, H, n_kv, G, n_qb, Hkv, B;
    size_t  qrow_bytes;      /* one q row in K's vec_dot_type */
    int64_t rows;            /* rows per tile = QB * G */
} fa_dims;

static fa_dims dims_of(const pg_tensor *all, const pg_tensor *t) {
    const pg_tensor *q = PG_SRC(all, t, 0), *k = PG_SRC(all, t, 1), *v = PG_SRC(all, t, 2);
    fa_dims d;
    d.D = q->ne[0]; d.Dv = v->ne[0]; d.n_q = q->ne[1]; d.H = q->ne[2]; d.n_kv = k->ne[1];
    d.Hkv = k->ne[2]; d.B = q->ne[3];
    d.G = d.H / d.Hkv;
    const int64_t qb = d.n_q < PG_FA_QB ? d.n_q : PG_FA_QB;
    d.n_qb = (d.n_q + qb - 1) / qb;
    d.rows = qb * d.G;
    d.qrow_bytes = (pg_type_row_size(pg_get_type_traits(k->type)->vec_dot_type, d.D) + 63) & ~(size_t)63;
    return d;
}

/* Per-thread scratch, in floats: acc[rows·Dv], qf[rows·D], s[rows·KB], kf[KB·D], vf[KB·Dv],
 * vmax[rows], sum[rows], ms[rows], mblk[KB], the tile starts (n_q + 1 int32); then the tile's q
 * rows in K's vec_dot_type. */
static size_t float_count(const fa_dims *d) {
    return (size_t)(d->rows * d->Dv + d->rows * d->D + d->rows * PG_FA_KB + PG_FA_KB * d->D +
                    PG_FA_KB * d->Dv + 3 * d->rows + PG_FA_KB + d->n_q + 1);
}

static size_t per_thread_bytes(const fa_dims *d) {
    return (float_count(d) * sizeof(float) + 63) / 64 * 64 + d->qrow_bytes * (size_t)d->rows;
}

size_t pg_flash_attn_work_size(const pg_tensor *all, const pg_tensor *t, int nth) {
    const fa_dims d = dims_of(all, t);
    return per_thread_bytes(&d) * (size_t)nth;
}

/* whether the mask hides key j (-inf), from the raw bits: fp16 -inf is 0xfc00 */
static int mask_hides(const pg_tensor *m, const uint8_t *mrow, int64_t j) {
    return m->type == PG_TYPE_F16 ? ((const pg_fp16 *)mrow)[j] == 0xfc00
                                  : ((const float *)mrow)[j] == -INFINITY;
}

/* the mask value of key j as fp32 */
static float mask_at(const pg_tensor *m, const uint8_t *mrow, int64_t j) {
    return m->type == PG_TYPE_F16 ? pg_fp16_to_fp32(((const pg_fp16 *)mrow)[j])
                                  : ((const float *)mrow)[j];
}

/* whether query row iq sees (in every mask head) every key that row iq − 1 sees */
static int sees_all_of_previous(const pg_tensor *m, int64_t iq, int64_t ib, int64_t n_kv) {
    for (int64_t h = 0; h < m->ne[2]; h++) {
        const uint8_t *a = pg_ptr(m, 0, iq - 1, h, ib % m->ne[3]);
        const uint8_t *b = pg_ptr(m, 0, iq, h, ib % m->ne[3]);
        for (int64_t j = 0; j < n_kv; j++)
            if (mask_hides(m, b, j) && !mask_hides(m, a, j)) return 0;
    }
    return 1;
}

/* Query rows [starts[i], starts[i + 1]) form tile group i of batch ib: at most qb rows, cut
 * where a row does not see every key its predecessor sees. Returns the number of groups. */
static int64_t tile_groups(const pg_tensor *m, const fa_dims *d, int64_t ib, int32_t *starts) {
    const int64_t qb = d->rows / d->G;
    int64_t n = 0;
    starts[n++] = 0;
    for (int64_t iq = 1; iq < d->n_q; iq++)
        if (iq - starts[n - 1] == qb || (m && !sees_all_of_previous(m, iq, ib, d->n_kv)))
            starts[n++] = (int32_t)iq;
    starts[n] = (int32_t)d->n_q;
    return n;
}

/* s[r·KB + c] = K's own dot (the type's gemm / vec_dot, as ggml's kq_vec_dot) of kept key
 * keys[c] with q row r in K's vec_dot_type (qconv, rows qb bytes apart), for a block-quantized K:
 * no fp32 copy of K, and the scores are ggml's bits. Runs of consecutive cells go through gemm
 * (up to 8 keys × 8 rows a call), others through vec_dot: the same bits either way. */
static void qk_quantized(const pg_type_traits *tk, const pg_tensor *k, int64_t ik2, int64_t ib,
                         int64_t D, const int64_t *keys, int64_t nk, const uint8_t *qconv,
                         size_t qb, int64_t nr, float *s) {
    const size_t bx = (size_t)k->nb[1];
    for (int64_t c = 0; c < nk;) {
        int64_t run = 1;
        while (c + run < nk && run < PG_GEMM_MAX_NR && keys[c + run] == keys[c] + run) run++;
        const uint8_t *x = pg_ptr(k, 0, keys[c], ik2, ib);
        if (tk->gemm) {
            for (int64_t r = 0; r < nr; r += PG_GEMM_MAX_NC) {
                const int nc = (int)(nr - r < PG_GEMM_MAX_NC ? nr - r : PG_GEMM_MAX_NC);
                tk->gemm(D, s + r * PG_FA_KB + c, PG_FA_KB * sizeof(float), x, bx,
                         qconv + (size_t)r * qb, qb, (int)run, nc);
            }
        } else {
            for (int64_t i = 0; i < run; i++)
                for (int64_t r = 0; r < nr; r++)
                    tk->vec_dot(D, s + r * PG_FA_KB + c + i, x + (size_t)i * bx,
                                qconv + (size_t)r * qb);
        }
        c += run;
    }
}

/* one row of K or V as fp32 */
static void row_to_f32(const pg_attn_kernels *kern, const pg_type_traits *tt, int32_t type,
                       const void *x, float *y, int64_t n) {
    if (type == PG_TYPE_F32) memcpy(y, x, (size_t)n * sizeof(float));
    else if (type == PG_TYPE_F16) kern->f16_to_f32(x, y, n);
    else tt->to_float(x, y, n);
}

void pg_fwd_flash_attn(const pg_cparams *p, pg_tensor *all, pg_tensor *t) {
    const pg_tensor *q = PG_SRC(all, t, 0), *k = PG_SRC(all, t, 1), *v = PG_SRC(all, t, 2);
    const pg_tensor *m = PG_SRC(all, t, 3);
    const pg_tensor *sinks = PG_SRC(all, t, 4);   /* F32 [>= H]: one extra logit per head */
    const pg_type_traits *tk = pg_get_type_traits(k->type);
    const pg_type_traits *tq = pg_get_type_traits(tk->vec_dot_type);
    const pg_type_traits *tv = pg_get_type_traits(v->type);
    const pg_attn_kernels *kern = pg_get_attn_kernels();
    const fa_dims d = dims_of(all, t);
    const int k_blocks = tk->block_size > 1;     /* scores by K's own dot (qk_quantized) */
    float scale = pg_op_f32(t, 0);
    const float max_bias = pg_op_f32(t, 1), softcap = pg_op_f32(t, 2);
    if (softcap != 0.0f) scale /= softcap;
    const uint32_t n_head_log2 = d.H ? 1u << (uint32_t)floor(log2((double)d.H)) : 1;
    const float m0 = powf(2.0f, -(max_bias) / (float)n_head_log2);
    const float m1 = powf(2.0f, -(max_bias / 2.0f) / (float)n_head_log2);

    uint8_t *scratch = p->work + per_thread_bytes(&d) * (size_t)p->ith;
    float *acc = (float *)scratch;
    float *qf = acc + d.rows * d.Dv;
    float *s = qf + d.rows * d.D;
    float *kf = s + d.rows * PG_FA_KB;
    float *vf = kf + PG_FA_KB * d.D;
    float *vmax = vf + PG_FA_KB * d.Dv;
    float *sum = vmax + d.rows;
    float *ms = sum + d.rows;
    float *mblk = ms + d.rows;
    int32_t *starts = (int32_t *)(mblk + PG_FA_KB);
    uint8_t *qconv = scratch + (float_count(&d) * sizeof(float) + 63) / 64 * 64;

    /* row r of a tile: query iq = q0 + r / G, head h = ik2 * G + r % G */
    const uint8_t *mrows[PG_FA_QB * 64];
    float slopes[PG_FA_QB * 64];
    int64_t keys[PG_FA_KB];
    const int64_t max_rows = (int64_t)(sizeof(slopes) / sizeof(slopes[0]));

    int64_t tile = -1;
    for (int64_t ib = 0; ib < d.B; ib++) {
        const int64_t n_groups = tile_groups(m, &d, ib, starts);
        for (int64_t tl = 0; tl < n_groups * d.Hkv; tl++) {
            if (++tile % p->nth != p->ith) continue;
            const int64_t ig = tl / d.Hkv, ik2 = tl % d.Hkv;
            const int64_t q0 = starts[ig], q1 = starts[ig + 1];
            const int64_t nr = (q1 - q0) * d.G;
            if (nr > max_rows) { pg_report_bad_data(p); return; }   /* G > 64: validator limit */
            for (int64_t r = 0; r < nr; r++) {
                const int64_t iq = q0 + r / d.G, ih = ik2 * d.G + r % d.G;
                const float *qr = pg_ptr(q, 0, iq, ih, ib);
                float *qd = qf + r * d.D;
                if (tk->vec_dot_type == PG_TYPE_F32) {
                    memcpy(qd, qr, (size_t)d.D * sizeof(float));
                } else if (tk->vec_dot_type == PG_TYPE_F16) {
                    kern->round_f16(qr, qd, d.D);
                } else if (k_blocks) {
                    tq->from_float(qr, qconv + (size_t)r * d.qrow_bytes, d.D);
                } else {
                    tq->from_float(qr, qconv, d.D);
                    tq->to_float(qconv, qd, d.D);
                }
                mrows[r] = m ? pg_ptr(m, 0, iq, ih % m->ne[2], ib % m->ne[3]) : NULL;
                slopes[r] = max_bias > 0.0f
                    ? ((uint32_t)ih < n_head_log2
                           ? powf(m0, (float)(ih + 1))
                           : powf(m1, (float)(2 * ((uint32_t)ih - n_head_log2) + 1)))
                    : 1.0f;
                vmax[r] = -INFINITY;
                sum[r] = 0.0f;
            }
            memset(acc, 0, (size_t)nr * (size_t)d.Dv * sizeof(float));
            for (int64_t jn = 0; jn < d.n_kv;) {   /* blocks of up to PG_FA_KB kept keys */
                int64_t nk = 0;
                for (; jn < d.n_kv && nk < PG_FA_KB; jn++) {
                    int any = !m;
                    if (m) {
                        /* heads of one query share a mask row */
                        for (int64_t r = 0; r < nr; r += d.G)
                            if (!mask_hides(m, mrows[r], jn)) { any = 1; break; }
                        if (!any && m->ne[2] > 1)
                            for (int64_t r = 0; r < nr && !any; r++)
                                any = !mask_hides(m, mrows[r], jn);
                    }
                    if (any) keys[nk++] = jn;
                }
                if (!nk) break;
                for (int64_t c = 0; c < nk; c++) {
                    if (!k_blocks)
                        row_to_f32(kern, tk, k->type, pg_ptr(k, 0, keys[c], ik2, ib),
                                   kf + c * d.D, d.D);
                    row_to_f32(kern, tv, v->type, pg_ptr(v, 0, keys[c], ik2, ib), vf + c * d.Dv,
                               d.Dv);
                }
                if (k_blocks)
                    qk_quantized(tk, k, ik2, ib, d.D, keys, nk, qconv, d.qrow_bytes, nr, s);
                else
                    kern->qk(d.D, nr, nk, qf, d.D, kf, d.D, s, PG_FA_KB);
                const uint8_t *mlast = NULL;
                for (int64_t r = 0; r < nr; r++) {
                    float *sr = s + r * PG_FA_KB;
                    if (m && mrows[r] != mlast) {   /* the block's mask values of the kept keys */
                        mlast = mrows[r];
                        for (int64_t c = 0; c < nk; c++) mblk[c] = mask_at(m, mlast, keys[c]);
                    }
                    float sc = scale;
                    if (softcap != 0.0f) {
                        for (int64_t c = 0; c < nk; c++) sr[c] = softcap * tanhf(sr[c] * scale);
                        sc = 1.0f;
                    }
                    const float bmax = kern->scale_max(sr, nk, sc, m ? mblk : NULL, slopes[r]);
                    if (bmax == -INFINITY) {   /* every key of the block hidden from this row */
                        memset(sr, 0, (size_t)nk * sizeof(float));
                        ms[r] = 1.0f;
                        continue;
                    }
                    const float mnew = bmax > vmax[r] ? bmax : vmax[r];
                    /* rescale what the old max weighed (0 at first) */
                    ms[r] = expf(vmax[r] - mnew);
                    vmax[r] = mnew;
                    sum[r] = sum[r] * ms[r] + kern->exp_sum(sr, nk, mnew);
                }
                kern->pv(d.Dv, nr, nk, s, PG_FA_KB, vf, d.Dv, ms, acc, d.Dv);
            }
            for (int64_t r = 0; r < nr; r++) {
                const int64_t iq = q0 + r / d.G, ih = ik2 * d.G + r % d.G;
                float *out = pg_ptr(t, 0, ih, iq, ib);
                float *a = acc + r * d.Dv;
                if (sinks) {   /* ggml's order: a sink above the max rescales what was summed */
                    const float sv = ((const float *)sinks->data)[ih];
                    if (sv > vmax[r]) {
                        const float msr = expf(vmax[r] - sv);
                        for (int64_t x = 0; x < d.Dv; x++) a[x] *= msr;
                        sum[r] = sum[r] * msr + 1.0f;
                    } else {
                        sum[r] = sum[r] + expf(sv - vmax[r]);
                    }
                }
                const float inv = sum[r] > 0.0f ? 1.0f / sum[r] : 0.0f;
                for (int64_t x = 0; x < d.Dv; x++) out[x] = a[x] * inv;
            }
        }
    }
}

/* ---- scalar kernels (the reference of attn_avx2.c / attn_avx512.c) ---------------------------- */

static void qk_scalar(int64_t D, int64_t nr, int64_t nc, const float *q, int64_t ldq,
                      const float *k, int64_t ldk, float *s, int64_t lds) {
    for (int64_t r = 0; r < nr; r++)
        for (int64_t c = 0; c < nc; c++) {
            const float *a = q + r * ldq, *b = k + c * ldk;
            float acc = 0.0f;
            for (int64_t i = 0; i < D; i++) acc += a[i] * b[i];
            s[r * lds + c] = acc;
        }
}

static void pv_scalar(int64_t Dv, int64_t nr, int64_t nc, const float *p, int64_t ldp,
                      const float *v, int64_t ldv, const float *ms, float *acc, int64_t lda) {
    for (int64_t r = 0; r < nr; r++) {
        float *a = acc + r * lda;
        for (int64_t x = 0; x < Dv; x++) a[x] *= ms[r];
        for (int64_t c = 0; c < nc; c++) {
            const float w = p[r * ldp + c];
            const float *vr = v + c * ldv;
            for (int64_t x = 0; x < Dv; x++) a[x] += w * vr[x];
        }
    }
}

static float scale_max_scalar(float *s, int64_t n, float scale, const float *mask, float slope) {
    float mx = -INFINITY;
    for (int64_t c = 0; c < n; c++) {
        s[c] = mask ? s[c] * scale + slope * mask[c] : s[c] * scale;
        mx = s[c] > mx ? s[c] : mx;
    }
    return mx;
}

static void silu_scalar(const float *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = x[i] / (1.0f + expf(-x[i]));
}

static float exp_sum_scalar(float *s, int64_t n, float m) {
    float total = 0.0f;
    for (int64_t c = 0; c < n; c++) {
        s[c] = expf(s[c] - m);
        total += s[c];
    }
    return total;
}

static void f16_to_f32_scalar(const uint16_t *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = pg_fp16_to_fp32(x[i]);
}

static void round_f16_scalar(const float *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = pg_fp16_to_fp32(pg_fp32_to_fp16(x[i]));
}

void pg_fill_attn_scalar(pg_attn_kernels *k) {
    k->qk = qk_scalar;
    k->pv = pv_scalar;
    k->scale_max = scale_max_scalar;
    k->exp_sum = exp_sum_scalar;
    k->silu = silu_scalar;
    k->f16_to_f32 = f16_to_f32_scalar;
    k->round_f16 = round_f16_scalar;
}
