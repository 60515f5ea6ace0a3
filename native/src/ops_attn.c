/* FLASH_ATTN_EXT: out[Dv, H, n_q, B] = softmax(q·kᵀ·scale (+softcap) + mask)·v per query row and
 * head, with an online softmax: the n_q × n_kv score matrix is never materialised. Query head h
 * reads KV head h / (H / Hkv). Each thread owns whole (query, head) rows. q is converted to K's
 * vec_dot_type once per row so the K dots use the same kernels as MUL_MAT. */
#include <math.h>
#include <string.h>

#include "fp16.h"
#include "ops.h"

static size_t per_thread_bytes(const pg_tensor *all, const pg_tensor *t) {
    const pg_tensor *q = PG_SRC(all, t, 0), *k = PG_SRC(all, t, 1), *v = PG_SRC(all, t, 2);
    const int32_t vdt = pg_get_type_traits(k->type)->vec_dot_type;
    return ((size_t)v->ne[0] * 4 + pg_type_row_size(vdt, q->ne[0]) + (size_t)v->ne[0] * 4 + 63) & ~(size_t)63;
}

size_t pg_flash_attn_work_size(const pg_tensor *all, const pg_tensor *t, int nth) {
    return per_thread_bytes(all, t) * (size_t)nth;
}

void pg_fwd_flash_attn(const pg_cparams *p, pg_tensor *all, pg_tensor *t) {
    const pg_tensor *q = PG_SRC(all, t, 0), *k = PG_SRC(all, t, 1), *v = PG_SRC(all, t, 2);
    const pg_tensor *m = PG_SRC(all, t, 3);
    const pg_type_traits *tk = pg_get_type_traits(k->type);
    const pg_type_traits *tq = pg_get_type_traits(tk->vec_dot_type);
    const int64_t D = q->ne[0], Dv = v->ne[0], n_q = q->ne[1], H = q->ne[2], n_kv = k->ne[1];
    const int64_t group = H / k->ne[2];
    float scale = pg_op_f32(t, 0);
    const float max_bias = pg_op_f32(t, 1), softcap = pg_op_f32(t, 2);
    if (softcap != 0.0f) scale /= softcap;
    const uint32_t n_head_log2 = H ? 1u << (uint32_t)floor(log2((double)H)) : 1;
    const float m0 = powf(2.0f, -(max_bias) / (float)n_head_log2);
    const float m1 = powf(2.0f, -(max_bias / 2.0f) / (float)n_head_log2);

    uint8_t *scratch = p->work + per_thread_bytes(all, t) * (size_t)p->ith;
    float *acc = (float *)scratch;
    float *vrow = acc + Dv;
    void *qconv = vrow + Dv;

    int64_t r0, r1;
    pg_split(n_q * H * q->ne[3], p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const int64_t ih = r % H, iq = (r / H) % n_q, ib = r / (H * n_q);
        const int64_t ik2 = ih / group;
        const float slope = max_bias > 0.0f
            ? ((uint32_t)ih < n_head_log2 ? powf(m0, (float)(ih + 1))
                                          : powf(m1, (float)(2 * ((uint32_t)ih - n_head_log2) + 1)))
            : 1.0f;
        const float *qr = pg_ptr(q, 0, iq, ih, ib);
        const void *qd = qr;
        if (tk->vec_dot_type != PG_TYPE_F32) { tq->from_float(qr, qconv, D); qd = qconv; }
        const uint8_t *mrow = m ? pg_ptr(m, 0, iq, ih % m->ne[2], ib % m->ne[3]) : NULL;
        float vmax = -INFINITY, sum = 0.0f;
        memset(acc, 0, (size_t)Dv * sizeof(float));
        for (int64_t j = 0; j < n_kv; j++) {
            float mv = 0.0f;
            if (mrow) {
                mv = m->type == PG_TYPE_F16 ? pg_fp16_to_fp32(((const pg_fp16 *)mrow)[j])
                                            : ((const float *)mrow)[j];
                if (mv == -INFINITY) continue;
                mv *= slope;
            }
            float s;
            tk->vec_dot(D, &s, pg_ptr(k, 0, j, ik2, ib), qd);
            s *= scale;
            if (softcap != 0.0f) s = softcap * tanhf(s);
            s += mv;
            float ms = 1.0f, vs = 1.0f;
            if (s > vmax) {
                ms = expf(vmax - s);   /* rescale what was accumulated under the old max */
                vmax = s;
            } else {
                vs = expf(s - vmax);
            }
            const void *vr = pg_ptr(v, 0, j, ik2, ib);
            if (v->type == PG_TYPE_F16) {
                for (int64_t d = 0; d < Dv; d++) vrow[d] = pg_fp16_to_fp32(((const pg_fp16 *)vr)[d]);
            } else {
                memcpy(vrow, vr, (size_t)Dv * 4);
            }
            if (ms != 1.0f) for (int64_t d = 0; d < Dv; d++) acc[d] *= ms;
            for (int64_t d = 0; d < Dv; d++) acc[d] += vrow[d] * vs;
            sum = sum * ms + vs;
        }
        float *out = pg_ptr(t, 0, ih, iq, ib);
        const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
        for (int64_t d = 0; d < Dv; d++) out[d] = acc[d] * inv;
    }
}
