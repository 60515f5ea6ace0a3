/* FLASH_ATTN_EXT: out[Dv, H, n_q, B] = softmax(q·kᵀ·scale (+softcap) + mask)·v per query row and
 * head, with an online softmax: the n_q × n_kv score matrix is never materialised.
 *
 * Work is done in tiles: up to PG_FA_QB query rows × the G = H/Hkv query heads that share one KV
 * head. Each key/value row is read and converted to fp32 once per tile and used by every row of
 * the tile; a key that the mask hides from the whole tile is skipped. q is converted to K's
 * vec_dot_type once per row so the K dots use the same kernels as MUL_MAT. Tiles are split
 * between threads; each thread owns whole output rows, so results do not depend on the thread
 * count. */
#include <math.h>
#include <string.h>

#include "fp16.h"
#include "ops.h"

#define PG_FA_QB 16   /* query rows per tile */

typedef struct {
    int64_t D, Dv, n_q, H, n_kv, G, n_qb, Hkv, B;
    size_t  qrow_bytes;      /* one converted q row */
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

/* per thread: acc[rows][Dv], vmax[rows], sum[rows], vrow[Dv], q rows converted */
static size_t per_thread_bytes(const fa_dims *d) {
    const size_t f = sizeof(float);
    return (((size_t)d->rows * (size_t)d->Dv + 2 * (size_t)d->rows + (size_t)d->Dv) * f + 63) / 64 * 64
           + (size_t)d->rows * d->qrow_bytes;
}

size_t pg_flash_attn_work_size(const pg_tensor *all, const pg_tensor *t, int nth) {
    const fa_dims d = dims_of(all, t);
    return per_thread_bytes(&d) * (size_t)nth;
}

static float mask_value(const pg_tensor *m, const uint8_t *mrow, int64_t j) {
    return m->type == PG_TYPE_F16 ? pg_fp16_to_fp32(((const pg_fp16 *)mrow)[j])
                                  : ((const float *)mrow)[j];
}

void pg_fwd_flash_attn(const pg_cparams *p, pg_tensor *all, pg_tensor *t) {
    const pg_tensor *q = PG_SRC(all, t, 0), *k = PG_SRC(all, t, 1), *v = PG_SRC(all, t, 2);
    const pg_tensor *m = PG_SRC(all, t, 3);
    const pg_type_traits *tk = pg_get_type_traits(k->type);
    const pg_type_traits *tq = pg_get_type_traits(tk->vec_dot_type);
    const pg_type_traits *tv = pg_get_type_traits(v->type);
    const fa_dims d = dims_of(all, t);
    float scale = pg_op_f32(t, 0);
    const float max_bias = pg_op_f32(t, 1), softcap = pg_op_f32(t, 2);
    if (softcap != 0.0f) scale /= softcap;
    const uint32_t n_head_log2 = d.H ? 1u << (uint32_t)floor(log2((double)d.H)) : 1;
    const float m0 = powf(2.0f, -(max_bias) / (float)n_head_log2);
    const float m1 = powf(2.0f, -(max_bias / 2.0f) / (float)n_head_log2);

    uint8_t *scratch = p->work + per_thread_bytes(&d) * (size_t)p->ith;
    float *acc = (float *)scratch;
    float *vmax = acc + d.rows * d.Dv;
    float *sum = vmax + d.rows;
    float *vrow = sum + d.rows;
    uint8_t *qconv = scratch + (((size_t)d.rows * (size_t)d.Dv + 2 * (size_t)d.rows + (size_t)d.Dv) * sizeof(float) + 63) / 64 * 64;

    /* row r of a tile: query iq = q0 + r / G, head h = ik2 * G + r % G */
    const uint8_t *mrows[PG_FA_QB * 64];
    float slopes[PG_FA_QB * 64];
    const void *qrows[PG_FA_QB * 64];
    const int64_t max_rows = (int64_t)(sizeof(slopes) / sizeof(slopes[0]));

    int64_t t0, t1;
    pg_split(d.B * d.Hkv * d.n_qb, p->ith, p->nth, &t0, &t1);
    for (int64_t tile = t0; tile < t1; tile++) {
        const int64_t iqb = tile % d.n_qb, ik2 = (tile / d.n_qb) % d.Hkv, ib = tile / (d.n_qb * d.Hkv);
        const int64_t q0 = iqb * (d.rows / d.G);
        const int64_t q1 = q0 + d.rows / d.G < d.n_q ? q0 + d.rows / d.G : d.n_q;
        const int64_t nr = (q1 - q0) * d.G;
        if (nr > max_rows) { pg_report_bad_data(p); return; }   /* G > 64: validator limit */
        for (int64_t r = 0; r < nr; r++) {
            const int64_t iq = q0 + r / d.G, ih = ik2 * d.G + r % d.G;
            const float *qr = pg_ptr(q, 0, iq, ih, ib);
            if (tk->vec_dot_type != PG_TYPE_F32) {
                tq->from_float(qr, qconv + (size_t)r * d.qrow_bytes, d.D);
                qrows[r] = qconv + (size_t)r * d.qrow_bytes;
            } else {
                qrows[r] = qr;
            }
            mrows[r] = m ? pg_ptr(m, 0, iq, ih % m->ne[2], ib % m->ne[3]) : NULL;
            slopes[r] = max_bias > 0.0f
                ? ((uint32_t)ih < n_head_log2 ? powf(m0, (float)(ih + 1))
                                              : powf(m1, (float)(2 * ((uint32_t)ih - n_head_log2) + 1)))
                : 1.0f;
            vmax[r] = -INFINITY;
            sum[r] = 0.0f;
        }
        memset(acc, 0, (size_t)nr * (size_t)d.Dv * sizeof(float));
        for (int64_t j = 0; j < d.n_kv; j++) {
            int any = !m;
            if (m) {
                for (int64_t r = 0; r < nr; r += d.G)   /* heads of one query share a mask row */
                    if (mask_value(m, mrows[r], j) != -INFINITY) { any = 1; break; }
                if (!any && m->ne[2] > 1)
                    for (int64_t r = 0; r < nr && !any; r++)
                        any = mask_value(m, mrows[r], j) != -INFINITY;
            }
            if (!any) continue;
            const void *kr = pg_ptr(k, 0, j, ik2, ib);
            const void *vr = pg_ptr(v, 0, j, ik2, ib);
            if (v->type == PG_TYPE_F32) memcpy(vrow, vr, (size_t)d.Dv * sizeof(float));
            else tv->to_float(vr, vrow, d.Dv);
            for (int64_t r = 0; r < nr; r++) {
                float mv = 0.0f;
                if (m) {
                    mv = mask_value(m, mrows[r], j);
                    if (mv == -INFINITY) continue;
                    mv *= slopes[r];
                }
                float s;
                tk->vec_dot(d.D, &s, kr, qrows[r]);
                s *= scale;
                if (softcap != 0.0f) s = softcap * tanhf(s);
                s += mv;
                float *a = acc + r * d.Dv;
                float vs = 1.0f;
                if (s > vmax[r]) {
                    const float ms = expf(vmax[r] - s);   /* rescale what the old max weighed */
                    vmax[r] = s;
                    sum[r] *= ms;
                    if (ms != 1.0f) for (int64_t x = 0; x < d.Dv; x++) a[x] *= ms;
                } else {
                    vs = expf(s - vmax[r]);
                }
                for (int64_t x = 0; x < d.Dv; x++) a[x] += vrow[x] * vs;
                sum[r] += vs;
            }
        }
        for (int64_t r = 0; r < nr; r++) {
            const int64_t iq = q0 + r / d.G, ih = ik2 * d.G + r % d.G;
            float *out = pg_ptr(t, 0, ih, iq, ib);
            const float inv = sum[r] > 0.0f ? 1.0f / sum[r] : 0.0f;
            const float *a = acc + r * d.Dv;
            for (int64_t x = 0; x < d.Dv; x++) out[x] = a[x] * inv;
        }
    }
}
