/* Recurrent-layer kernels of the hybrid models (LFM2's short convolution, Qwen 3.5's gated
 * DeltaNet): each op reads the state of the sequences in the ubatch, runs its tokens in order
 * (token t continues the state of sequence seq[t]) and writes the new states after the outputs,
 * so the graph stores them with SET_ROWS like KV rows. The recurrence is the same arithmetic
 * whatever the ubatch: a prompt evaluated in one batch gives the bits of token-by-token
 * evaluation. Threads split channels (conv) or heads × blocks of state rows (delta rule), never
 * time. The inner loops are per-path kernels (pg_ssm_kernels, ops_ssm.h); their arithmetic per
 * row or channel is fixed, so each path is batch-invariant bit for bit.
 *
 * Why no chunked (WY) form of the delta rule: at Dk = Dv = 128 it costs about the flops of the
 * token-by-token recurrence (~6·Dk·Dv a token and head), and its rounding would depend on where
 * the ubatch boundaries fall (a checkpoint resumed, or a prompt split, would not give the bits
 * of a cold run). What makes the recurrence slow is moving the 64 KiB state per token; here a
 * block of rows stays in L1 for all of a sequence's tokens in the ubatch.
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
 * In place (op_params[0] of SSM_CONV, op_params[1] of GATED_DELTA_NET nonzero): the state
 *   source is the cache itself, F32 [row, R] (R cells), and seq[t] is the cell token t
 *   continues; dst holds only the outputs (y [C, T] / o [Dv, H, T]). The cells a token names
 *   are read and updated where they are (nobody else reads them in the graph), the others are
 *   not touched; the arithmetic is the copying form's, bit for bit. This is the decode path of
 *   a model whose recurrent cache is in host memory: no state bytes copied per token, where the
 *   copying form moved each state three times (GET_ROWS, the op's copy, SET_ROWS).
 *
 * PG_OP_SOFTPLUS: src0 a F32 (dense rows), dst F32 of a's shape (dense rows): log(1 + exp(x)),
 *   x itself above 20 (ggml's op_softplus; Qwen 3.5's decay rate). Threads split rows. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ops.h"
#include "ops_ssm.h"

#define FAIL(...) do { snprintf(reason, reason_size, __VA_ARGS__); return PG_ERR_UNSUPPORTED; } while (0)
#define BAD(...)  do { snprintf(reason, reason_size, __VA_ARGS__); return PG_ERR_INVALID_ARG; } while (0)

/* the in-place form (see the top of the file) */
static int in_place(const pg_tensor *t) {
    return t->op_params[t->op == PG_OP_SSM_CONV ? 0 : 1] != 0;
}

/* n elements, contiguous (the in-place form's output: y [C, T] / o [Dv, H, T]) */
static int contiguous_n(const pg_tensor *t, int64_t n) {
    return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3] == n && t->nb[0] == 4 &&
           t->nb[1] == 4 * t->ne[0] && t->nb[2] == t->nb[1] * t->ne[1] &&
           t->nb[3] == t->nb[2] * t->ne[2];
}

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
        if (x->ne[2] != 1 || x->ne[3] != 1 || w->ne[1] != C || w->nb[1] != 4 * K || K < 2 || K > 64)
            BAD("x must be [C, T] and kernel [2 <= K <= 64, C] contiguous");
        if (st->ne[0] != (K - 1) * C || st->ne[2] != 1 || st->ne[3] != 1 || S < 1)
            BAD("state must be [(K-1)*C, S]");
        if (!contiguous_1d(seq, PG_TYPE_I32, T)) BAD("seq must be contiguous I32 [T]");
        if (in_place(t) ? !contiguous_n(t, C * T)
                        : t->ne[0] != C * T + (K - 1) * C * S || t->ne[1] != 1 ||
                          t->ne[2] != 1 || t->ne[3] != 1)
            BAD(in_place(t) ? "in place: output must be a contiguous [C, T]"
                            : "output must be 1-D [C*T + (K-1)*C*S]");
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
    if (in_place(t) ? !contiguous_n(t, Dv * H * T)
                    : t->ne[0] != Dv * H * T + Dk * Dv * H * S || t->ne[1] != 1 ||
                      t->ne[2] != 1 || t->ne[3] != 1)
        BAD(in_place(t) ? "in place: output must be a contiguous [Dv, H, T]"
                        : "output must be 1-D [Dv*H*T + Dk*Dv*H*S]");
    return PG_OK;
}

/* Both recurrent ops visit each sequence's tokens in order: order[] lists the ubatch's token
 * indices grouped by sequence (stable), sequence s at order[off[s] .. off[s + 1]). Each thread
 * builds its own copy in its work area (T + S + 1 ints: cheaper than a barrier). */
static size_t order_bytes(int64_t T, int64_t S) {
    return ((size_t)(T + S + 1) * sizeof(int32_t) + 63) & ~(size_t)63;
}

static void group_by_seq(const int32_t *seq, int64_t T, int64_t S, int32_t *order, int32_t *off) {
    for (int64_t s = 0; s <= S; s++) off[s] = 0;
    for (int64_t i = 0; i < T; i++) off[seq[i] + 1]++;
    for (int64_t s = 0; s < S; s++) off[s + 1] += off[s];
    for (int64_t i = 0; i < T; i++) order[off[seq[i]]++] = (int32_t)i;
    for (int64_t s = S; s > 0; s--) off[s] = off[s - 1];
    off[0] = 0;
}

/* Conv: per thread, the kernel transposed to channel-inner rows [K][C] and each sequence's
 * history transposed to [S][K-1][C] (ops_ssm.h: conv_rows reads channel-inner rows). */
static size_t conv_floats(int64_t C, int64_t K, int64_t S) {
    return (((size_t)(K * C + S * (K - 1) * C)) + 15) & ~(size_t)15;
}

size_t pg_ssm_work_size(const pg_tensor *all, const pg_tensor *t, int nth) {
    if (t->op == PG_OP_SOFTPLUS) return 0;
    if (t->op == PG_OP_SSM_CONV) {
        const pg_tensor *x = PG_SRC(all, t, 0), *w = PG_SRC(all, t, 1), *st = PG_SRC(all, t, 2);
        const int64_t C = x->ne[0], T = x->ne[1], K = w->ne[0], S = st->ne[1];
        return (conv_floats(C, K, S) * sizeof(float) + order_bytes(T, S)) * (size_t)nth;
    }
    const pg_tensor *v = PG_SRC(all, t, 2), *st = PG_SRC(all, t, 5);
    return order_bytes(v->ne[2], st->ne[1]) * (size_t)nth;
}

static int seqs_ok(const pg_cparams *p, const int32_t *seq, int64_t T, int64_t S) {
    for (int64_t i = 0; i < T; i++)
        if (seq[i] < 0 || seq[i] >= S) {
            pg_report_bad_data(p);
            return 0;
        }
    return 1;
}

/* The convolution needs no state carried through arithmetic: token p of a sequence reads the
 * window [history, x_0 .. x_{p-1}] at items p .. p+K-2, each a channel-inner row (of the
 * transposed history or of x). Threads split channels; every channel's sums are the same
 * operations whatever the ubatch. */
/* A few tokens (decode): transposing kernel and history would cost more than the sums, so
 * each channel runs in its own layout (the same operations as conv_rows: the same bits). */
static void conv_direct(const pg_tensor *x, const float *kw, const pg_tensor *st,
                        const int32_t *seq, int64_t C, int64_t T, int64_t K, int64_t S,
                        int64_t c0, int64_t c1, float *y, float *ns) {
    const int64_t n = K - 1;
    if (ns)
        for (int64_t s = 0; s < S; s++)
            memcpy(ns + s * n * C + c0 * n, (const char *)st->data + s * st->nb[1] + c0 * n * 4,
                   (size_t)((c1 - c0) * n) * 4);
    for (int64_t i = 0; i < T; i++) {
        const float *xi = (const float *)((const char *)x->data + i * x->nb[1]);
        /* ns NULL: in place, the cell's own row */
        float *state = ns ? ns + seq[i] * n * C : (float *)((char *)st->data + seq[i] * st->nb[1]);
        float *yi = y + i * C;
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

static void fwd_ssm_conv(const pg_cparams *p, pg_tensor *all, pg_tensor *t) {
    const pg_tensor *x = PG_SRC(all, t, 0), *w = PG_SRC(all, t, 1), *st = PG_SRC(all, t, 2);
    const int32_t *seq = PG_SRC(all, t, 3)->data;
    const int64_t C = x->ne[0], T = x->ne[1], K = w->ne[0], S = st->ne[1], n = K - 1;
    if (!seqs_ok(p, seq, T, S)) return;
    const int inpl = in_place(t);
    float *y = t->data, *ns = inpl ? NULL : y + C * T;
    const float *kw = w->data;
    int64_t c0, c1;
    pg_split(C, p->ith, p->nth, &c0, &c1);
    if (c0 >= c1) return;
    if (T <= K) {
        conv_direct(x, kw, st, seq, C, T, K, S, c0, c1, y, ns);
        return;
    }
    const int64_t nc = c1 - c0;
    const size_t per_thread = conv_floats(C, K, S) * sizeof(float) + order_bytes(T, S);
    float *wt = (float *)(p->work + (size_t)p->ith * per_thread);      /* [K][nc] */
    float *hist = wt + K * nc;                                         /* [S][n][nc] */
    int32_t *order = (int32_t *)((char *)wt + conv_floats(C, K, S) * sizeof(float));
    int32_t *off = order + T;
    group_by_seq(seq, T, S, order, off);
    for (int64_t c = 0; c < nc; c++)
        for (int64_t j = 0; j < K; j++) wt[j * nc + c] = kw[(c0 + c) * K + j];
    const pg_ssm_kernels *kn = pg_get_ssm_kernels();
    const float *items[64];                       /* graph.c bounds K (pg_ssm_supported) */
    for (int64_t s = 0; s < S; s++) {
        const int32_t *tok = order + off[s];
        const int64_t P = off[s + 1] - off[s];
        if (inpl && P == 0) continue;          /* a cell no token continues: left as it is */
        float *st_s = (float *)((char *)st->data + s * st->nb[1]);
        float *h = hist + s * n * nc;          /* a copy: in place, st_s is rewritten below */
        for (int64_t c = 0; c < nc; c++)
            for (int64_t j = 0; j < n; j++) h[j * nc + c] = st_s[(c0 + c) * n + j];
        /* item g of the sequence's window list: history row g, then x of its token g - n */
#define ITEM(g) ((g) < n ? h + (g) * nc \
                         : (const float *)((const char *)x->data + tok[(g) - n] * x->nb[1]) + c0)
        for (int64_t m = 0; m < P; m++) {
            for (int64_t j = 0; j < n; j++) items[j] = ITEM(m + j);
            kn->conv_rows(nc, n, items, ITEM(m + n), wt, nc, y + tok[m] * C + c0);
        }
        float *ns_s = inpl ? st_s : ns + s * n * C;
        for (int64_t j = 0; j < n; j++) {
            const float *src = ITEM(P + j);
            for (int64_t c = 0; c < nc; c++) ns_s[(c0 + c) * n + j] = src[c];
        }
#undef ITEM
    }
}

/* Work items are (head, block of DELTA_ROWS state rows): rows evolve independently (row j of a
 * head depends only on v[j] and the head's q, k, g, beta), so a block stays in L1 while it runs
 * through all of its sequence's tokens, and threads split items without changing any row's
 * arithmetic. */
enum { DELTA_ROWS = 16 };

static void fwd_gated_delta(const pg_cparams *p, pg_tensor *all, pg_tensor *t) {
    const pg_tensor *q = PG_SRC(all, t, 0), *k = PG_SRC(all, t, 1), *v = PG_SRC(all, t, 2);
    const float *g = PG_SRC(all, t, 3)->data, *beta = PG_SRC(all, t, 4)->data;
    const pg_tensor *st = PG_SRC(all, t, 5);
    const int32_t *seq = PG_SRC(all, t, 6)->data;
    const int64_t Dk = q->ne[0], Hk = q->ne[1], Dv = v->ne[0], H = v->ne[1], T = v->ne[2];
    const int64_t S = st->ne[1], hs = Dk * Dv;
    if (!seqs_ok(p, seq, T, S)) return;
    const float scale = pg_op_f32(t, 0);
    const int inpl = in_place(t);
    float *o = t->data, *ns = inpl ? NULL : o + Dv * H * T;
    int32_t *order = (int32_t *)(p->work + (size_t)p->ith * order_bytes(T, S));
    int32_t *off = order + T;
    group_by_seq(seq, T, S, order, off);
    const pg_ssm_kernels *kn = pg_get_ssm_kernels();
    const int64_t nblk = (Dv + DELTA_ROWS - 1) / DELTA_ROWS;
    int64_t w0, w1;
    pg_split(H * nblk, p->ith, p->nth, &w0, &w1);
    for (int64_t wi = w0; wi < w1; wi++) {
        const int64_t h = wi / nblk, j0 = (wi % nblk) * DELTA_ROWS;
        const int64_t nr = Dv - j0 < DELTA_ROWS ? Dv - j0 : DELTA_ROWS;
        for (int64_t s = 0; s < S; s++) {
            float *cell = (float *)((char *)st->data + s * st->nb[1]) + h * hs + j0 * Dk;
            float *rows;
            if (inpl) {                 /* the cell's own rows; a cell without tokens untouched */
                if (off[s] == off[s + 1]) continue;
                rows = cell;
            } else {
                rows = ns + (s * H + h) * hs + j0 * Dk;
                memcpy(rows, cell, (size_t)(nr * Dk) * 4);
            }
            for (int32_t m = off[s]; m < off[s + 1]; m++) {
                const int64_t i = order[m];
                const char *qb = (const char *)q->data, *kb = (const char *)k->data;
                const float *qd = (const float *)(qb + i * q->nb[2] + (h % Hk) * q->nb[1]);
                const float *kd = (const float *)(kb + i * k->nb[2] + (h % Hk) * k->nb[1]);
                const float *vd = (const float *)((const char *)v->data + i * v->nb[2] +
                                                  h * v->nb[1]);
                kn->delta_rows(Dk, nr, rows, kd, qd, vd + j0, expf(g[i * H + h]), beta[i * H + h],
                               scale, o + (i * H + h) * Dv + j0);
            }
        }
    }
}

/* ---- the scalar kernels: the reference every path is tested against ------------------------ */

static void delta_rows_scalar(int64_t Dk, int64_t n, float *rows, const float *k, const float *q,
                              const float *v, float decay, float beta, float scale, float *o) {
    for (int64_t r = 0; r < n; r++) {
        float *row = rows + r * Dk;
        for (int64_t e = 0; e < Dk; e++) row[e] *= decay;
        float sum = 0.0f;
        for (int64_t e = 0; e < Dk; e++) sum += row[e] * k[e];
        const float d = (v[r] - sum) * beta;
        for (int64_t e = 0; e < Dk; e++) row[e] += k[e] * d;
        sum = 0.0f;
        for (int64_t e = 0; e < Dk; e++) sum += row[e] * q[e];
        o[r] = sum * scale;
    }
}

static void conv_rows_scalar(int64_t n, int64_t nk, const float *const *hist, const float *x,
                             const float *w, int64_t ldw, float *y) {
    for (int64_t c = 0; c < n; c++) {
        float sum = 0.0f;
        for (int64_t j = 0; j < nk; j++) sum += hist[j][c] * w[j * ldw + c];
        sum += x[c] * w[nk * ldw + c];
        y[c] = sum;
    }
}

void pg_fill_ssm_scalar(pg_ssm_kernels *k) {
    k->delta_rows = delta_rows_scalar;
    k->conv_rows = conv_rows_scalar;
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
