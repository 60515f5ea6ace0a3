/* The KV attention mask of a ubatch, written straight into the graph's fp16 input. It runs for
 * every ubatch before the device may start, so its time is on each token's critical path: in
 * numpy it took ~8 array passes and ~50 us a decoded token; here one pass over the cells. */
#include "pyggml.h"

#define FP16_ZERO    0x0000u
#define FP16_NEG_INF 0xFC00u

int32_t pg_kv_mask(const int64_t *cell_pos, const uint64_t *cell_seqs, int64_t n_kv,
                   const int32_t *pos, const int64_t *seq_ids, int64_t n_tokens,
                   int64_t window, uint16_t *out, int64_t row_stride) {
    if (n_kv < 0 || n_tokens < 0 || row_stride < n_kv || window < 0) return PG_ERR_INVALID_ARG;
    if ((n_kv && (!cell_pos || !cell_seqs)) || (n_tokens && (!pos || !seq_ids || !out)))
        return PG_ERR_INVALID_ARG;
    for (int64_t t = 0; t < n_tokens; t++)
        if (seq_ids[t] < 0 || seq_ids[t] > 63) return PG_ERR_INVALID_ARG;
    for (int64_t t = 0; t < n_tokens; t++) {
        const int64_t p = pos[t];
        const uint64_t bits = 1ull << seq_ids[t];
        uint16_t *row = out + t * row_stride;
        for (int64_t j = 0; j < n_kv; j++) {
            const int64_t c = cell_pos[j];
            const int ok = (cell_seqs[j] & bits) != 0 && c >= 0 && c <= p &&
                           (window == 0 || p - c < window);
            row[j] = ok ? FP16_ZERO : FP16_NEG_INF;
        }
    }
    return PG_OK;
}
