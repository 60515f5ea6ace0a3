/* Row-wise F32 kernels: binary ops with broadcasting, unary ops, norms, softmax, rope,
 * diag_mask_inf. Sources may be strided (views, permutes) as long as each row is dense
 * (nb[0] == 4); the validator enforces that. Every thread owns whole output rows, so results do
 * not depend on the thread count. */
#include <math.h>
#include <pthread.h>

#include "fp16.h"
#include "attn.h"
#include "ops.h"

/* ---- binary ------------------------------------------------------------------------------ */
void pg_fwd_binary(const pg_cparams *p, pg_tensor *all, pg_tensor *t) {
    const pg_tensor *a = PG_SRC(all, t, 0), *b = PG_SRC(all, t, 1);
    const int64_t ne0 = t->ne[0], ne1 = t->ne[1], ne2 = t->ne[2];
    int64_t r0, r1;
    pg_split(pg_nrows(t), p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const int64_t i1 = r % ne1, i2 = (r / ne1) % ne2, i3 = r / (ne1 * ne2);
        float *y = pg_ptr(t, 0, i1, i2, i3);
        const float *x = pg_ptr(a, 0, i1, i2, i3);
        const float *z = pg_ptr(b, 0, i1 % b->ne[1], i2 % b->ne[2], i3 % b->ne[3]);
        const int64_t nb0 = b->ne[0];
        if (nb0 == ne0) {
            switch (t->op) {
            case PG_OP_ADD: for (int64_t i = 0; i < ne0; i++) y[i] = x[i] + z[i]; break;
            case PG_OP_SUB: for (int64_t i = 0; i < ne0; i++) y[i] = x[i] - z[i]; break;
            case PG_OP_MUL: for (int64_t i = 0; i < ne0; i++) y[i] = x[i] * z[i]; break;
            default:        for (int64_t i = 0; i < ne0; i++) y[i] = x[i] / z[i]; break;
            }
        } else {
            for (int64_t i = 0; i < ne0; i++) {
                const float zv = z[i % nb0];
                switch (t->op) {
                case PG_OP_ADD: y[i] = x[i] + zv; break;
                case PG_OP_SUB: y[i] = x[i] - zv; break;
                case PG_OP_MUL: y[i] = x[i] * zv; break;
                default:        y[i] = x[i] / zv; break;
                }
            }
        }
    }
}

/* ---- unary ------------------------------------------------------------------------------- */
static pg_fp16 g_gelu_table[1 << 16];
static pthread_once_t g_gelu_once = PTHREAD_ONCE_INIT;

static float gelu_exact_f32(float x) {
    const float c = 0.79788456080286535587989211986876f;   /* sqrt(2/pi) */
    return 0.5f * x * (1.0f + tanhf(c * x * (1.0f + 0.044715f * x * x)));
}

static void gelu_table_init(void) {
    for (uint32_t h = 0; h < (1u << 16); h++)
        g_gelu_table[h] = pg_fp32_to_fp16(gelu_exact_f32(pg_fp16_to_fp32((pg_fp16)h)));
}

/* ggml CPU builds evaluate GELU through a table over fp16 inputs (GGML_GELU_FP16): the input and
 * output are rounded to fp16; outside [-10, 10] it is 0 or x. We do the same to match. */
float pg_gelu_f32(float x) {
    if (x <= -10.0f) return 0.0f;
    if (x >= 10.0f) return x;
    pthread_once(&g_gelu_once, gelu_table_init);
    return pg_fp16_to_fp32(g_gelu_table[pg_fp32_to_fp16(x)]);
}

void pg_fwd_unary(const pg_cparams *p, pg_tensor *all, pg_tensor *t) {
    const pg_tensor *a = PG_SRC(all, t, 0);
    const int64_t ne0 = t->ne[0], ne1 = t->ne[1], ne2 = t->ne[2];
    const float s = pg_op_f32(t, 0), bias = pg_op_f32(t, 1);
    if (t->op == PG_OP_GELU) pthread_once(&g_gelu_once, gelu_table_init);
    int64_t r0, r1;
    pg_split(pg_nrows(t), p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const int64_t i1 = r % ne1, i2 = (r / ne1) % ne2, i3 = r / (ne1 * ne2);
        float *y = pg_ptr(t, 0, i1, i2, i3);
        const float *x = pg_ptr(a, 0, i1, i2, i3);
        switch (t->op) {
        case PG_OP_SQR:   for (int64_t i = 0; i < ne0; i++) y[i] = x[i] * x[i]; break;
        case PG_OP_SQRT:  for (int64_t i = 0; i < ne0; i++) y[i] = sqrtf(x[i]); break;
        case PG_OP_SCALE: for (int64_t i = 0; i < ne0; i++) y[i] = x[i] * s + bias; break;
        case PG_OP_SILU:  pg_get_attn_kernels()->silu(x, y, ne0); break;
        case PG_OP_TANH:  for (int64_t i = 0; i < ne0; i++) y[i] = tanhf(x[i]); break;
        case PG_OP_SIGMOID: for (int64_t i = 0; i < ne0; i++) y[i] = 1.0f / (1.0f + expf(-x[i])); break;
        case PG_OP_CLAMP:   /* s = min, bias = max; ggml's MAX(MIN(x, max), min): NaN -> max */
            for (int64_t i = 0; i < ne0; i++) {
                const float v = x[i] < bias ? x[i] : bias;
                y[i] = v > s ? v : s;
            }
            break;
        case PG_OP_GELU:
            for (int64_t i = 0; i < ne0; i++) {
                const float v = x[i];
                y[i] = v <= -10.0f ? 0.0f : v >= 10.0f ? v
                     : pg_fp16_to_fp32(g_gelu_table[pg_fp32_to_fp16(v)]);
            }
            break;
        default: break;
        }
    }
}

/* ---- norms ------------------------------------------------------------------------------- */
void pg_fwd_norm(const pg_cparams *p, pg_tensor *all, pg_tensor *t) {
    const pg_tensor *a = PG_SRC(all, t, 0);
    const int64_t ne0 = t->ne[0], ne1 = t->ne[1], ne2 = t->ne[2];
    const float eps = pg_op_f32(t, 0);
    int64_t r0, r1;
    pg_split(pg_nrows(t), p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const int64_t i1 = r % ne1, i2 = (r / ne1) % ne2, i3 = r / (ne1 * ne2);
        float *y = pg_ptr(t, 0, i1, i2, i3);
        const float *x = pg_ptr(a, 0, i1, i2, i3);
        if (t->op == PG_OP_RMS_NORM) {
            double sum = 0.0;   /* products in fp32, summed in double, as ggml */
            for (int64_t i = 0; i < ne0; i++) sum += (double)(x[i] * x[i]);
            const float mean = (float)(sum / (double)ne0);
            const float scale = 1.0f / sqrtf(mean + eps);
            for (int64_t i = 0; i < ne0; i++) y[i] = x[i] * scale;
        } else {
            double sum = 0.0;
            for (int64_t i = 0; i < ne0; i++) sum += (double)x[i];
            const float mean = (float)(sum / (double)ne0);
            double sum2 = 0.0;
            for (int64_t i = 0; i < ne0; i++) {
                const float v = x[i] - mean;
                y[i] = v;
                sum2 += (double)(v * v);
            }
            const float scale = 1.0f / sqrtf((float)(sum2 / (double)ne0) + eps);
            for (int64_t i = 0; i < ne0; i++) y[i] *= scale;
        }
    }
}

/* ---- softmax ----------------------------------------------------------------------------- */
void pg_fwd_soft_max(const pg_cparams *p, pg_tensor *all, pg_tensor *t) {
    const pg_tensor *a = PG_SRC(all, t, 0), *m = PG_SRC(all, t, 1);
    const pg_tensor *sk = PG_SRC(all, t, 2);   /* attention sinks: one logit per head (ne[2]) */
    const int64_t ne0 = t->ne[0], ne1 = t->ne[1], ne2 = t->ne[2];
    const float scale = pg_op_f32(t, 0), max_bias = pg_op_f32(t, 1);
    /* ALiBi slopes per head (ne[2]), as ggml */
    const uint32_t n_head = (uint32_t)ne2;
    const uint32_t n_head_log2 = n_head ? 1u << (uint32_t)floor(log2((double)n_head)) : 1;
    const float m0 = powf(2.0f, -(max_bias) / (float)n_head_log2);
    const float m1 = powf(2.0f, -(max_bias / 2.0f) / (float)n_head_log2);
    int64_t r0, r1;
    pg_split(pg_nrows(t), p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const int64_t i1 = r % ne1, i2 = (r / ne1) % ne2, i3 = r / (ne1 * ne2);
        float *y = pg_ptr(t, 0, i1, i2, i3);
        const float *x = pg_ptr(a, 0, i1, i2, i3);
        const uint32_t h = (uint32_t)i2;
        const float slope = max_bias > 0.0f
            ? (h < n_head_log2 ? powf(m0, (float)(h + 1)) : powf(m1, (float)(2 * (h - n_head_log2) + 1)))
            : 1.0f;
        float vmax = -INFINITY;
        for (int64_t i = 0; i < ne0; i++) {
            float w = x[i] * scale;
            if (m) {
                const void *mr = pg_ptr(m, 0, i1, i2 % m->ne[2], i3 % m->ne[3]);
                w += slope * (m->type == PG_TYPE_F16 ? pg_fp16_to_fp32(((const pg_fp16 *)mr)[i])
                                                     : ((const float *)mr)[i]);
            }
            y[i] = w;
            if (w > vmax) vmax = w;
        }
        const float sink = sk ? ((const float *)sk->data)[i2] : -INFINITY;
        if (sink > vmax) vmax = sink;   /* as ggml: the sink joins the max and the sum */
        if (vmax == -INFINITY) {   /* fully masked row: no probability mass anywhere */
            for (int64_t i = 0; i < ne0; i++) y[i] = 0.0f;
            continue;
        }
        double sum = 0.0;
        for (int64_t i = 0; i < ne0; i++) {
            const float e = expf(y[i] - vmax);
            y[i] = e;
            sum += (double)e;
        }
        if (sk) sum += (double)expf(sink - vmax);
        const float inv = (float)(1.0 / sum);
        for (int64_t i = 0; i < ne0; i++) y[i] *= inv;
    }
}

/* ---- rope -------------------------------------------------------------------------------- */
static float rope_yarn_ramp(float low, float high, int i0) {
    const float y = (float)(i0 / 2 - low) / fmaxf(0.001f, high - low);
    return 1.0f - fminf(1.0f, fmaxf(0.0f, y));
}

static float rope_corr_dim(int n_dims, int n_ctx_orig, float n_rot, float base) {
    return (float)n_dims * logf((float)n_ctx_orig / (n_rot * 2.0f * (float)M_PI)) / (2.0f * logf(base));
}

void pg_fwd_rope(const pg_cparams *p, pg_tensor *all, pg_tensor *t) {
    const pg_tensor *a = PG_SRC(all, t, 0), *pos = PG_SRC(all, t, 1), *ff = PG_SRC(all, t, 2);
    const int n_dims = t->op_params[1], mode = t->op_params[2], n_ctx_orig = t->op_params[4];
    const float freq_base = pg_op_f32(t, 5), freq_scale = pg_op_f32(t, 6);
    const float ext_factor = pg_op_f32(t, 7), attn_factor = pg_op_f32(t, 8);
    const float beta_fast = pg_op_f32(t, 9), beta_slow = pg_op_f32(t, 10);
    const int64_t ne0 = t->ne[0], ne1 = t->ne[1], ne2 = t->ne[2];
    const float theta_scale = powf(freq_base, -2.0f / (float)n_dims);
    float corr[2] = {0.0f, 0.0f};
    if (ext_factor != 0.0f) {
        corr[0] = fmaxf(0.0f, floorf(rope_corr_dim(n_dims, n_ctx_orig, beta_fast, freq_base)));
        corr[1] = fminf((float)(n_dims - 1), ceilf(rope_corr_dim(n_dims, n_ctx_orig, beta_slow, freq_base)));
    }
    const float *freq = ff ? (const float *)ff->data : NULL;
    float *cache = (float *)(p->work + (size_t)p->ith * (size_t)(ne0 + 16) * sizeof(float));
    int64_t cached = -1;
    int64_t r0, r1;
    pg_split(pg_nrows(t), p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const int64_t i1 = r % ne1, i2 = (r / ne1) % ne2, i3 = r / (ne1 * ne2);
        if (i2 + i3 * ne2 != cached) {
            cached = i2 + i3 * ne2;
            /* iterated fp32 angles, as ggml: theta_{k+1} = theta_k * theta_scale */
            float theta = (float)((const int32_t *)pos->data)[i2];
            for (int64_t i0 = 0; i0 < n_dims; i0 += 2) {
                const float f = freq ? freq[i0 / 2] : 1.0f;
                const float extrap = theta / f;
                const float interp = freq_scale * extrap;
                float th = interp, msc = attn_factor;
                if (ext_factor != 0.0f) {
                    const float mix = rope_yarn_ramp(corr[0], corr[1], (int)i0) * ext_factor;
                    th = interp * (1.0f - mix) + extrap * mix;
                    msc *= 1.0f + 0.1f * logf(1.0f / freq_scale);
                }
                cache[i0] = cosf(th) * msc;
                cache[i0 + 1] = sinf(th) * msc;
                theta *= theta_scale;
            }
        }
        float *y = pg_ptr(t, 0, i1, i2, i3);
        const float *x = pg_ptr(a, 0, i1, i2, i3);
        if (mode == PG_ROPE_MODE_NEOX) {
            const int64_t half = n_dims / 2;
            for (int64_t i0 = 0; i0 < n_dims; i0 += 2) {
                const float c = cache[i0], s = cache[i0 + 1];
                const float x0 = x[i0 / 2], x1 = x[i0 / 2 + half];
                y[i0 / 2] = x0 * c - x1 * s;
                y[i0 / 2 + half] = x0 * s + x1 * c;
            }
        } else {
            for (int64_t i0 = 0; i0 < n_dims; i0 += 2) {
                const float c = cache[i0], s = cache[i0 + 1];
                const float x0 = x[i0], x1 = x[i0 + 1];
                y[i0] = x0 * c - x1 * s;
                y[i0 + 1] = x0 * s + x1 * c;
            }
        }
        for (int64_t i0 = n_dims; i0 < ne0; i0++) y[i0] = x[i0];
    }
}

/* ---- diag_mask_inf ------------------------------------------------------------------------ */
void pg_fwd_diag_mask_inf(const pg_cparams *p, pg_tensor *all, pg_tensor *t) {
    const pg_tensor *a = PG_SRC(all, t, 0);
    const int64_t ne0 = t->ne[0], ne1 = t->ne[1], ne2 = t->ne[2];
    const int64_t n_past = t->op_params[0];
    int64_t r0, r1;
    pg_split(pg_nrows(t), p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const int64_t i1 = r % ne1, i2 = (r / ne1) % ne2, i3 = r / (ne1 * ne2);
        float *y = pg_ptr(t, 0, i1, i2, i3);
        const float *x = pg_ptr(a, 0, i1, i2, i3);
        for (int64_t i = 0; i < ne0; i++) y[i] = i > n_past + i1 ? -INFINITY : x[i];
    }
}

/* ---- a MUL_MAT's fused element-wise node ---------------------------------------------------- */
void pg_fwd_epilogue(pg_tensor *all, const pg_tensor *t, const pg_tensor *e, int64_t n0,
                     int64_t n1) {
    const int64_t M = t->ne[1], n = n1 - n0;
    const int32_t ti = (int32_t)(t - all);
    for (int64_t m = 0; m < M; m++) {
        float *y = (float *)pg_ptr(e, n0, m, 0, 0);
        const float *x = (const float *)pg_ptr(t, n0, m, 0, 0);
        if (e->op == PG_OP_SILU) { pg_get_attn_kernels()->silu(x, y, n); continue; }
        if (e->op == PG_OP_GELU) {   /* pg_fwd_unary's GELU */
            pthread_once(&g_gelu_once, gelu_table_init);
            for (int64_t i = 0; i < n; i++) {
                const float v = x[i];
                y[i] = v <= -10.0f ? 0.0f : v >= 10.0f ? v
                     : pg_fp16_to_fp32(g_gelu_table[pg_fp32_to_fp16(v)]);
            }
            continue;
        }
        /* binary: t is src0 or src1; the other source has the same row length, one row or M */
        const int mm_first = e->src[0] == ti;
        const pg_tensor *o = &all[e->src[mm_first ? 1 : 0]];
        const float *z = (const float *)pg_ptr(o, n0, m % o->ne[1], 0, 0);
        const float *a = mm_first ? x : z, *b = mm_first ? z : x;
        switch (e->op) {
        case PG_OP_ADD: for (int64_t i = 0; i < n; i++) y[i] = a[i] + b[i]; break;
        case PG_OP_SUB: for (int64_t i = 0; i < n; i++) y[i] = a[i] - b[i]; break;
        case PG_OP_MUL: for (int64_t i = 0; i < n; i++) y[i] = a[i] * b[i]; break;
        default:        for (int64_t i = 0; i < n; i++) y[i] = a[i] / b[i]; break;
        }
    }
}
