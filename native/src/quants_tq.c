/* Ternary formats TQ1_0 and TQ2_0 (256-element blocks; ggml's layouts): the scalar reference.
 *
 *   TQ1_0  54 bytes: 48 bytes of five trits each (a byte b holds the trit string of
 *          ceil(b'·243/256)), 4 bytes of four, fp16 d; x = (t − 1)·d
 *   TQ2_0  66 bytes: 2 bits per element (64 bytes), fp16 d; x = (q − 1)·d
 *
 *   to_float   ggml's dequantize_row_tq*_0 (element order and fp32 ops), bit-exact with gguf
 *   quantize   ggml's quantize_row_tq*_0_ref (d = max|x|, lroundf(x/d)), bit-exact with gguf
 *   vec_dot    · Q8_K: the exact int32 sum of levels · activations, (d·d_y)·isum per block
 */
#include <math.h>
#include <string.h>

#include "fp16.h"
#include "kquants.h"
#include "quants.h"

typedef struct { uint8_t qs[48]; uint8_t qh[4]; pg_fp16 d; } pg_block_tq1_0;
typedef struct { uint8_t qs[64]; pg_fp16 d; } pg_block_tq2_0;
_Static_assert(sizeof(pg_block_tq1_0) == 54, "TQ1_0 block must be 54 bytes");
_Static_assert(sizeof(pg_block_tq2_0) == 66, "TQ2_0 block must be 66 bytes");

static const uint8_t k_pow3[6] = {1, 3, 9, 27, 81, 243};

static inline int trit(uint8_t b, int n) {          /* the n-th trit (0..2) of a packed byte */
    const uint8_t q = (uint8_t)(b * k_pow3[n]);
    return ((uint16_t)q * 3) >> 8;
}

/* levels −1, 0, 1 in element order */
static void decode_tq1_0(const pg_block_tq1_0 *x, int8_t q[256]) {
    int e = 0;
    for (int n = 0; n < 5; n++)
        for (int m = 0; m < 32; m++) q[e++] = (int8_t)(trit(x->qs[m], n) - 1);
    for (int n = 0; n < 5; n++)
        for (int m = 0; m < 16; m++) q[e++] = (int8_t)(trit(x->qs[32 + m], n) - 1);
    for (int n = 0; n < 4; n++)
        for (int j = 0; j < 4; j++) q[e++] = (int8_t)(trit(x->qh[j], n) - 1);
}

static void decode_tq2_0(const pg_block_tq2_0 *x, int8_t q[256]) {
    int e = 0;
    for (int j = 0; j < 64; j += 32)
        for (int l = 0; l < 4; l++)
            for (int m = 0; m < 32; m++) q[e++] = (int8_t)(((x->qs[j + m] >> (2 * l)) & 3) - 1);
}

static void dequantize_row_tq1_0(const void *restrict vx, float *restrict y, int64_t n) {
    const pg_block_tq1_0 *x = vx;
    int8_t q[256];
    for (int64_t i = 0; i < n / PG_QK_K; i++) {
        const float d = pg_fp16_to_fp32(x[i].d);
        decode_tq1_0(&x[i], q);
        for (int e = 0; e < 256; e++) y[256 * i + e] = (float)q[e] * d;
    }
}

static void dequantize_row_tq2_0(const void *restrict vx, float *restrict y, int64_t n) {
    const pg_block_tq2_0 *x = vx;
    int8_t q[256];
    for (int64_t i = 0; i < n / PG_QK_K; i++) {
        const float d = pg_fp16_to_fp32(x[i].d);
        decode_tq2_0(&x[i], q);
        for (int e = 0; e < 256; e++) y[256 * i + e] = (float)q[e] * d;
    }
}

static float block_amax(const float *x) {
    float amax = 0.0f;
    for (int j = 0; j < 256; j++) amax = fmaxf(amax, fabsf(x[j]));
    return amax;
}

static void quantize_row_tq1_0(const float *restrict x, void *restrict vy, int64_t n) {
    pg_block_tq1_0 *y = vy;
    for (int64_t i = 0; i < n / PG_QK_K; i++, x += 256) {
        const float d = block_amax(x), id = d != 0 ? 1.0f / d : 0.0f;
        y[i].d = pg_fp32_to_fp16(d);
        for (int m = 0; m < 32; m++) {
            uint8_t q = 0;
            for (int t = 0; t < 5; t++) q = (uint8_t)(q * 3 + (int)lroundf(x[m + 32 * t] * id) + 1);
            y[i].qs[m] = (uint8_t)(((uint16_t)q * 256 + 242) / 243);
        }
        for (int m = 0; m < 16; m++) {
            uint8_t q = 0;
            for (int t = 0; t < 5; t++)
                q = (uint8_t)(q * 3 + (int)lroundf(x[160 + m + 16 * t] * id) + 1);
            y[i].qs[32 + m] = (uint8_t)(((uint16_t)q * 256 + 242) / 243);
        }
        for (int j = 0; j < 4; j++) {
            uint8_t q = 0;
            for (int t = 0; t < 4; t++)
                q = (uint8_t)(q * 3 + (int)lroundf(x[240 + j + 4 * t] * id) + 1);
            q = (uint8_t)(q * 3);
            y[i].qh[j] = (uint8_t)(((uint16_t)q * 256 + 242) / 243);
        }
    }
}

static void quantize_row_tq2_0(const float *restrict x, void *restrict vy, int64_t n) {
    pg_block_tq2_0 *y = vy;
    for (int64_t i = 0; i < n / PG_QK_K; i++, x += 256) {
        const float d = block_amax(x), id = d != 0 ? 1.0f / d : 0.0f;
        y[i].d = pg_fp32_to_fp16(d);
        for (int j = 0; j < 64; j += 32)
            for (int m = 0; m < 32; m++) {
                uint8_t q = 0;
                for (int t = 0; t < 4; t++)
                    q = (uint8_t)(q + ((((int)lroundf(x[4 * j + m + 32 * t] * id) + 1) & 3) << (2 * t)));
                y[i].qs[j + m] = q;
            }
    }
}

#define PG_TQ_DOT(name, BT, DECODE)                                                             \
    static void name(int64_t n, float *restrict s, const void *restrict vx,                    \
                     const void *restrict vy) {                                                \
        const BT *x = vx;                                                                      \
        const pg_block_q8_K *y = vy;                                                           \
        float sum = 0;                                                                         \
        int8_t q[256];                                                                         \
        for (int64_t i = 0; i < n / PG_QK_K; i++) {                                            \
            DECODE(&x[i], q);                                                                  \
            int32_t isum = 0;                                                                  \
            for (int e = 0; e < 256; e++) isum += (int32_t)q[e] * y[i].qs[e];                  \
            sum += (pg_fp16_to_fp32(x[i].d) * y[i].d) * (float)isum;                           \
        }                                                                                      \
        *s = sum;                                                                              \
    }

PG_TQ_DOT(vec_dot_tq1_0_q8_K, pg_block_tq1_0, decode_tq1_0)
PG_TQ_DOT(vec_dot_tq2_0_q8_K, pg_block_tq2_0, decode_tq2_0)

void pg_fill_tq_scalar(pg_type_traits *tbl) {
    pg_type_traits *t1 = &tbl[PG_TYPE_TQ1_0], *t2 = &tbl[PG_TYPE_TQ2_0];
    t1->block_size = t2->block_size = PG_QK_K;
    t1->type_size = sizeof(pg_block_tq1_0);
    t2->type_size = sizeof(pg_block_tq2_0);
    t1->to_float = dequantize_row_tq1_0;
    t2->to_float = dequantize_row_tq2_0;
    t1->from_float_ref = t1->from_float = quantize_row_tq1_0;
    t2->from_float_ref = t2->from_float = quantize_row_tq2_0;
    t1->vec_dot = vec_dot_tq1_0_q8_K;
    t2->vec_dot = vec_dot_tq2_0_q8_K;
    t1->vec_dot_type = t2->vec_dot_type = PG_TYPE_Q8_K;
}
