/* Recurrent-op kernels, NEON (armv8-a; see ops_ssm.h, the scalar reference is in ops_ssm.c):
 * delta_rows in two passes over Dk in 4-wide pieces with four accumulators and one fixed
 * reduction tree, the last Dk % 4 elements in scalar; the first pass (row·decay against k)
 * stores nothing, the second computes row·decay again (a multiply is cheaper than a store);
 * conv_rows the scalar order on 4 channels at a time (multiply, then add: the same bits). */
#include <arm_neon.h>

#include "ops_ssm.h"

static inline float hsum4(float32x4_t a0, float32x4_t a1, float32x4_t a2, float32x4_t a3) {
    return vaddvq_f32(vaddq_f32(vaddq_f32(a0, a1), vaddq_f32(a2, a3)));
}

static void delta_rows_neon(int64_t Dk, int64_t n, float *rows, const float *k, const float *q,
                            const float *v, float decay, float beta, float scale, float *o) {
    const int64_t D16 = Dk & ~(int64_t)15, D4 = Dk & ~(int64_t)3;
    for (int64_t r = 0; r < n; r++) {
        float *row = rows + r * Dk;
        float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0;
        int64_t e = 0;
        for (; e < D16; e += 16) {
            const float32x4_t x0 = vmulq_n_f32(vld1q_f32(row + e), decay);
            const float32x4_t x1 = vmulq_n_f32(vld1q_f32(row + e + 4), decay);
            const float32x4_t x2 = vmulq_n_f32(vld1q_f32(row + e + 8), decay);
            const float32x4_t x3 = vmulq_n_f32(vld1q_f32(row + e + 12), decay);
            a0 = vfmaq_f32(a0, x0, vld1q_f32(k + e));
            a1 = vfmaq_f32(a1, x1, vld1q_f32(k + e + 4));
            a2 = vfmaq_f32(a2, x2, vld1q_f32(k + e + 8));
            a3 = vfmaq_f32(a3, x3, vld1q_f32(k + e + 12));
        }
        for (; e < D4; e += 4) {
            const float32x4_t x = vmulq_n_f32(vld1q_f32(row + e), decay);
            a0 = vfmaq_f32(a0, x, vld1q_f32(k + e));
        }
        float sum = hsum4(a0, a1, a2, a3);
        for (; e < Dk; e++) sum += row[e] * decay * k[e];
        const float d = (v[r] - sum) * beta;
        a0 = a1 = a2 = a3 = vdupq_n_f32(0.0f);
        for (e = 0; e < D16; e += 16) {
            const float32x4_t x0 = vfmaq_n_f32(vmulq_n_f32(vld1q_f32(row + e), decay),
                                                 vld1q_f32(k + e), d);
            const float32x4_t x1 = vfmaq_n_f32(vmulq_n_f32(vld1q_f32(row + e + 4), decay),
                                                 vld1q_f32(k + e + 4), d);
            const float32x4_t x2 = vfmaq_n_f32(vmulq_n_f32(vld1q_f32(row + e + 8), decay),
                                                 vld1q_f32(k + e + 8), d);
            const float32x4_t x3 = vfmaq_n_f32(vmulq_n_f32(vld1q_f32(row + e + 12), decay),
                                                 vld1q_f32(k + e + 12), d);
            vst1q_f32(row + e, x0);
            vst1q_f32(row + e + 4, x1);
            vst1q_f32(row + e + 8, x2);
            vst1q_f32(row + e + 12, x3);
            a0 = vfmaq_f32(a0, x0, vld1q_f32(q + e));
            a1 = vfmaq_f32(a1, x1, vld1q_f32(q + e + 4));
            a2 = vfmaq_f32(a2, x2, vld1q_f32(q + e + 8));
            a3 = vfmaq_f32(a3, x3, vld1q_f32(q + e + 12));
        }
        for (; e < D4; e += 4) {
            const float32x4_t x = vfmaq_n_f32(vmulq_n_f32(vld1q_f32(row + e), decay),
                                                 vld1q_f32(k + e), d);
            vst1q_f32(row + e, x);
            a0 = vfmaq_f32(a0, x, vld1q_f32(q + e));
        }
        sum = hsum4(a0, a1, a2, a3);
        for (; e < Dk; e++) {
            row[e] = row[e] * decay + k[e] * d;
            sum += row[e] * q[e];
        }
        o[r] = sum * scale;
    }
}

static void conv_rows_neon(int64_t n, int64_t nk, const float *const *hist, const float *x,
                           const float *w, int64_t ldw, float *y) {
    int64_t c = 0;
    for (; c + 4 <= n; c += 4) {
        float32x4_t sum = vdupq_n_f32(0.0f);
        for (int64_t j = 0; j < nk; j++)
            sum = vaddq_f32(sum, vmulq_f32(vld1q_f32(hist[j] + c), vld1q_f32(w + j * ldw + c)));
        sum = vaddq_f32(sum, vmulq_f32(vld1q_f32(x + c), vld1q_f32(w + nk * ldw + c)));
        vst1q_f32(y + c, sum);
    }
    for (; c < n; c++) {
        float sum = 0.0f;
        for (int64_t j = 0; j < nk; j++) sum += hist[j][c] * w[j * ldw + c];
        sum += x[c] * w[nk * ldw + c];
        y[c] = sum;
    }
}

void pg_fill_ssm_neon(pg_ssm_kernels *k) {
    k->delta_rows = delta_rows_neon;
    k->conv_rows = conv_rows_neon;
}
