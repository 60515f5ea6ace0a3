/* Recurrent-layer kernels of the hybrid models (LFM2's short convolution, Qwen 3.5's gated
 * DeltaNet): each op reads the state of the sequences in the ubatch, runs its tokens in order
 * (token t continues the state of sequence seq[t]) and writes the new states after the outputs,
 * so the graph stores them with SET_ROWS like KV rows. The recurrence is the same arithmetic
 * whatever the ubatch: a prompt evaluated in one batch gives the bits of token-by-token
 * evaluation. Threads split channels (conv) or heads (delta rule), never time.
 *
 * PG_OP_SSM_CONV: src0 x F32 [C, T] (dense rows), src1 kernel F32 [K, C] (contiguous), src2 state
 *   F32 [(K-1)·C, S] (dense rows; per channel the K-1 previous inputs, oldest first), src3 seq I32
 *   [T] in [0, S). dst F32 [C·T + (K-1)·C·S] contiguous: y [C, T], then the new states
 *   [(K-1)·C, S]. y[c, t] = Σ_{i<K} w[i] · kernel[i, c] with w the K-1 state values then x[c, t],
 *   summed from i = 0 (ggml_ssm_conv's order).
 *
 * PG_OP_GATED_DELTA_NET: src0 q F32 [Dk, Hk, T], src1 k F32 [Dk, Hk, T], src2 v F32 [Dv, H, T] (dense
 *   rows; head h reads q/k head h % Hk), src3 g F32 [H, T] (log decay), src4 beta F32 [H, T],
 *   src5 state F32 [Dk·Dv·H, S] (per head Dv rows of Dk: row j is column j of the state matrix
 *   S[i][j], ggml's layout), src6 seq I32 [T]. op_params[0]: the output scale (float). dst F32
 *   [Dv·H·T + Dk·Dv·H·S]: o [Dv, H, T], then the new states. Per token and head:
 *   S *= exp(g); d[j] = (v[j] - Σ_i S[i][j]·k[i])·beta; S[i][j] += k[i]·d[j];
 *   o[j] = scale · Σ_i S[i][j]·q[i] (ggml_gated_delta_net with K = 1 snapshot).
 *
 * PG_OP_SOFTPLUS: src0 a F32 (dense rows), dst F32 of a's shape (dense rows): log(1 + exp(x)),
 *   x itself above 20 (ggml's op_softplus; Qwen 3.5's decay rate). Threads split rows. */
#include <math.h>
#include <stdio.h>

#include "ops.h"
#include "ops_ssm.h"

#define FAIL(...) do { snprintf(reason, reason_size, __VA_ARGS__); return PG_ERR_UNSUPPORTED; } while (0)
#define BAD(...)  do { snprintf(reason, reason_size, __VA_ARGS__); return PG_ERR_INVALID_ARG; } while (0)

static int f32_dense(const pg_tensor *t) {
    return t && t->type == PG_TYPE_F32 && t->nb[0] == 4;
}

static int contiguous_1d(const pg_tensor *t, int32_t type, int64_t n) {
    const int64_t es = type == PG_TYPE_I32 || type == PG_TYPE_F32 ? 4 : 0;
    return t && t->type == type && t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3] == n &&
           t->nb[0] == es && (t->ne[1] == 1 || t->nb[1] == es * t->ne[0]);
}

int32_t pg_ssm_supported(const pg_tensor *t, const pg_tensor *const *s, char *reason,
                         size_t reason_size) {
    if (t->type != PG_TYPE_F32 || t->nb[0] != 4) FAIL("output must be contiguous F32");
    if (t->op == PG_OP_SOFTPLUS) {
        const pg_tensor *a = s[0];
        if (!a) BAD("needs a source");
        if (!f32_dense(a)) FAIL("only F32 with dense rows");
        for (int d = 0; d < 4; d++)
            if (a->ne[d] != t->ne[d]) BAD("output shape differs from input");
        return PG_OK;
    }
    if (t->op == PG_OP_SSM_CONV) {
        const pg_tensor *x = s[0], *w = s[1], *st = s[2], *seq = s[3];
        if (!x || !w || !st || !seq) BAD("needs x, kernel, state and seq");
        if (!f32_dense(x) || !f32_dense(st) || !f32_dense(w)) FAIL("x, kernel and state must be F32 with dense rows");
        const int64_t C = x->ne[0], T = x->ne[1], K = w->ne[0], S = st->ne[1];
        if (x->ne[2] != 1 || x->ne[3] != 1 || w->ne[1] != C || w->nb[1] != 4 * K || K < 2)
            BAD("x must be [C, T] and kernel [K >= 2, C] contiguous");
        if (st->ne[0] != (K - 1) * C || st->ne[2] != 1 || st->ne[3] != 1 || S < 1)
            BAD("state must be [(K-1)*C, S]");
        if (!contiguous_1d(seq, PG_TYPE_I32, T)) BAD("seq must be contiguous I32 [T]");
        if (t->ne[0] != C * T + (K - 1) * C * S || t->ne[1] != 1 || t->ne[2] != 1 || t->ne[3] != 1)
            BAD("output must be 1-D [C*T + (K-1)*C*S]");
        return PG_OK;
    }
    const pg_tensor *q = s[0], *k = s[1], *v = s[2], *g = s[3], *b = s[4], *st = s[5], *seq = s[6];
    if (!q || !k || !v || !g || !b || !st || !seq) BAD("needs q, k, v, g, beta, state and seq");
    if (!f32_dense(q) || !f32_dense(k) || !f32_dense(v) || !f32_dense(st)) FAIL("q, k, v, state must be F32 with dense rows");
    const int64_t Dk = q->ne[0], Hk = q->ne[1], Dv = v->ne[0], H = v->ne[1], T = v->ne[2];
    if (k->ne[0] != Dk || k->ne[1] != Hk || q->ne[2] != T || k->ne[2] != T || H % Hk ||
        q->ne[3] != 1 || k->ne[3] != 1 || v->ne[3] != 1)
        BAD("q, k must be [Dk, Hk, T] and v [Dv, H, T] with H %% Hk == 0");
    if (!contiguous_1d(g, PG_TYPE_F32, H * T) || !contiguous_1d(b, PG_TYPE_F32, H * T))
        BAD("g and beta must be contiguous F32 [H, T]");
    const int64_t S = st->ne[1];
    if (st->ne[0] != Dk * Dv * H || st->ne[2] != 1 || st->ne[3] != 1 || S < 1)
        BAD("state must be [Dk*Dv*H, S]");
    if (!contiguous_1d(seq, PG_TYPE_I32, T)) BAD("seq must be contiguous I32 [T]");
    if (t->ne[0] != Dv * H * T + Dk * Dv * H * S || t->ne[1] != 1 || t->ne[2] != 1 || t->ne[3] != 1)
        BAD("output must be 1-D [Dv*H*T + Dk*Dv*H*S]");
    return PG_OK;
}

size_t pg_ssm_work_size(const pg_tensor *all, const pg_tensor *t, int nth) {
    if (t->op != PG_OP_GATED_DELTA_NET) return 0;
    const pg_tensor *v = PG_SRC(all, t, 2);
    return (size_t)(v->ne[0] + 16) * sizeof(float) * (size_t)nth;
}

static int seqs_ok(const pg_cparams *p, const int32_t *seq, int64_t T, int64_t S) {
    for (int64_t i = 0; i < T; i++)
        if (seq[i] < 0 || seq[i] >= S) {
            pg_report_bad_data(p);
            return 0;
        }
    return 1;
}

static void fwd_ssm_conv(const pg_cparams *p, pg_tensor *all, pg_tensor *t) {
    const pg_tensor *x = PG_SRC(all, t, 0), *w = PG_SRC(all, t, 1), *st = PG_SRC(all, t, 2);
    const int32_t *seq = PG_SRC(all, t, 3)->data;
    const int64_t C = x->ne[0], T = x->ne[1], K = w->ne[0], S = st->ne[1], n = K - 1;
    if (!seqs_ok(p, seq, T, S)) return;
    float *y = t->data, *ns = y + C * T;
    const float *kw = w->data;
    int64_t c0, c1;
    pg_split(C, p->ith, p->nth, &c0, &c1);
    for (int64_t s = 0; s < S; s++)
        memcpy(ns + s * n * C + c0 * n, (const char *)st->data + s * st->nb[1] + c0 * n * 4,
               (size_t)((c1 - c0) * n) * 4);
    for (int64_t i = 0; i < T; i++) {
        const float *xi = (const float *)((const char *)x->data + i * x->nb[1]);
        float *state = ns + seq[i] * n * C, *yi = y + i * C;
        for (int64_t c = c0; c < c1; c++) {
            float *sc = state + c * n;
            const float *kc = kw + c * K;
            float sum = 0.0f;
            for (int64_t j = 0; j < n; j++) sum += sc[j] * kc[j];
            sum += xi[c] * kc[n];
            yi[c] = sum;
            for (int64_t j = 0; j + 1 < n; j++) sc[j] = sc[j + 1];
            sc[n - 1] = xi[c];
        }
    }
}

static void fwd_gated_delta(const pg_cparams *p, pg_tensor *all, pg_tensor *t) {
    const pg_tensor *q = PG_SRC(all, t, 0), *k = PG_SRC(all, t, 1), *v = PG_SRC(all, t, 2);
    const float *g = PG_SRC(all, t, 3)->data, *beta = PG_SRC(all, t, 4)->data;
    const pg_tensor *st = PG_SRC(all, t, 5);
    const int32_t *seq = PG_SRC(all, t, 6)->data;
    const int64_t Dk = q->ne[0], Hk = q->ne[1], Dv = v->ne[0], H = v->ne[1], T = v->ne[2];
    const int64_t S = st->ne[1], hs = Dk * Dv;
    if (!seqs_ok(p, seq, T, S)) return;
    const float scale = pg_op_f32(t, 0);
    float *o = t->data, *ns = o + Dv * H * T;
    float *d = (float *)(p->work + (size_t)p->ith * (size_t)(Dv + 16) * sizeof(float));
    int64_t h0, h1;
    pg_split(H, p->ith, p->nth, &h0, &h1);
    for (int64_t s = 0; s < S; s++)
        memcpy(ns + s * hs * H + h0 * hs, (const char *)st->data + s * st->nb[1] + h0 * hs * 4,
               (size_t)((h1 - h0) * hs) * 4);
    for (int64_t i = 0; i < T; i++) {
        for (int64_t h = h0; h < h1; h++) {
            float *M = ns + (seq[i] * H + h) * hs;
            const float *qd = (const float *)((const char *)q->data + i * q->nb[2] + (h % Hk) * q->nb[1]);
            const float *kd = (const float *)((const char *)k->data + i * k->nb[2] + (h % Hk) * k->nb[1]);
            const float *vd = (const float *)((const char *)v->data + i * v->nb[2] + h * v->nb[1]);
            const float decay = expf(g[i * H + h]), b = beta[i * H + h];
            for (int64_t e = 0; e < hs; e++) M[e] *= decay;
            for (int64_t j = 0; j < Dv; j++) {
                const float *row = M + j * Dk;
                float sum = 0.0f;
                for (int64_t e = 0; e < Dk; e++) sum += row[e] * kd[e];
                d[j] = (vd[j] - sum) * b;
            }
            for (int64_t j = 0; j < Dv; j++) {
                float *row = M + j * Dk;
                for (int64_t e = 0; e < Dk; e++) row[e] += kd[e] * d[j];
            }
            float *od = o + (i * H + h) * Dv;
            for (int64_t j = 0; j < Dv; j++) {
                const float *row = M + j * Dk;
                float sum = 0.0f;
                for (int64_t e = 0; e < Dk; e++) sum += row[e] * qd[e];
                od[j] = sum * scale;
            }
        }
    }
}

static void fwd_softplus(const pg_cparams *p, pg_tensor *all, pg_tensor *t) {
    const pg_tensor *a = PG_SRC(all, t, 0);
    const int64_t n0 = t->ne[0], nr = t->ne[1] * t->ne[2] * t->ne[3];
    int64_t r0, r1;
    pg_split(nr, p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const int64_t i1 = r % t->ne[1], i2 = (r / t->ne[1]) % t->ne[2], i3 = r / (t->ne[1] * t->ne[2]);
        const float *x = (const float *)((const char *)a->data + i1 * a->nb[1] + i2 * a->nb[2] + i3 * a->nb[3]);
        float *y = (float *)((char *)t->data + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3]);
        for (int64_t i = 0; i < n0; i++) y[i] = x[i] > 20.0f ? x[i] : logf(1.0f + expf(x[i]));
    }
}

void pg_fwd_ssm(const pg_cparams *p, pg_tensor *all, pg_tensor *t) {
    if (t->op == PG_OP_SOFTPLUS) fwd_softplus(p, all, t);
    else if (t->op == PG_OP_SSM_CONV) fwd_ssm_conv(p, all, t);
    else fwd_gated_delta(p, all, t);
}
