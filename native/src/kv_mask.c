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

/* ---- the decode step (pyggml.h) ------------------------------------------------------------ */
#include <string.h>
#include <time.h>

size_t pg_decode_step_args_size(void) { return sizeof(pg_decode_step_args); }

static int log_cell(pg_decode_step_args *a, int32_t space, int64_t cell) {
    if (a->n_undo >= PG_STEP_MAX_UNDO) return -1;
    pg_cell_undo *u = &a->undo[a->n_undo++];
    u->space = space;
    u->pad_ = 0;
    u->cell = cell;
    u->pos = a->cell_pos[space][cell];
    u->seqs = a->cell_seqs[space][cell];
    return 0;
}

void pg_decode_step_undo(pg_decode_step_args *a) {
    for (int64_t i = a->n_undo - 1; i >= 0; i--) {
        const pg_cell_undo *u = &a->undo[i];
        a->cell_pos[u->space][u->cell] = u->pos;
        a->cell_seqs[u->space][u->cell] = u->seqs;
    }
    a->n_undo = 0;
}

/* the full space's cell for a token of the sequence with bit `bit` (CellSpace.find_slot_ordered
 * of one token), -1 if none is free */
static int64_t full_cell(const int64_t *cpos, const uint64_t *cseq, int64_t n, uint64_t bit) {
    int64_t floor = 0;
    for (int64_t j = n - 1; j >= 0; j--)
        if (cseq[j] & bit) { floor = j + 1; break; }
    for (int64_t j = floor; j < n; j++)
        if (cpos[j] < 0) return j;
    for (int64_t j = 0; j < floor; j++)
        if (cpos[j] < 0) return j;
    return -1;
}

/* Cells the attention reads in a space: to its last used cell, rounded up to kv_pad (CellSpace.n_kv) */
static int64_t space_n_kv(const int64_t *cpos, int64_t n, int64_t pad) {
    int64_t last = 1;
    for (int64_t j = n - 1; j >= 0; j--)
        if (cpos[j] >= 0) { last = j + 1; break; }
    const int64_t r = (last + pad - 1) / pad * pad;
    return r < n ? r : n;
}

/* Places the token: PG_OK with cells[] set and every change logged, or PG_STEP_FALLBACK with
 * nothing changed. */
static int32_t place(pg_decode_step_args *a, int64_t pos, int32_t seq_id, int64_t cells[2]) {
    const uint64_t bit = 1ull << seq_id;
    cells[1] = -1;
    cells[0] = full_cell(a->cell_pos[0], a->cell_seqs[0], a->n_cells[0], bit);
    if (cells[0] < 0) return PG_STEP_FALLBACK;   /* the general path reports the overflow */
    int64_t n_drop = 0;
    if (a->n_spaces > 1) {
        /* CellSpace.forget_outside_window, then find_slot_ring, first without changing a cell */
        const int64_t *cpos = a->cell_pos[1];
        const uint64_t *cseq = a->cell_seqs[1];
        const int64_t n = a->n_cells[1], last = pos - a->window;
        for (int64_t j = 0; j < n; j++) {
            if (cseq[j] == 0 && cpos[j] >= 0) return PG_STEP_FALLBACK;   /* not seen in practice */
            n_drop += (cseq[j] & bit) && cpos[j] <= last;
        }
        if (n_drop + 2 > PG_STEP_MAX_UNDO) return PG_STEP_FALLBACK;
#define FREE_AFTER(j) (cpos[j] < 0 || ((cseq[j] & bit) && cpos[j] <= last && !(cseq[j] & ~bit)))
        int64_t c = (int64_t)seq_id * a->ring + pos % a->ring;
        if (!(c < n && FREE_AFTER(c))) {
            c = -1;
            for (int64_t j = 0; j < n && c < 0; j++)
                if (FREE_AFTER(j)) c = j;
            if (c < 0) return PG_STEP_FALLBACK;
        }
#undef FREE_AFTER
        cells[1] = c;
    }
    a->n_undo = 0;
    if (n_drop) {
        int64_t *cpos = a->cell_pos[1];
        uint64_t *cseq = a->cell_seqs[1];
        const int64_t last = pos - a->window;
        for (int64_t j = 0; j < a->n_cells[1]; j++) {
            if ((cseq[j] & bit) && cpos[j] <= last) {
                log_cell(a, 1, j);
                cseq[j] &= ~bit;
                if (!cseq[j]) cpos[j] = -1;
            }
        }
    }
    for (int32_t s = 0; s < a->n_spaces; s++) {
        log_cell(a, s, cells[s]);
        a->cell_pos[s][cells[s]] = pos;
        a->cell_seqs[s][cells[s]] = bit;
    }
    return PG_OK;
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int32_t pg_decode_step(pg_decode_step_args *a, int32_t token, int32_t pos, int32_t seq_id,
                       float *out) {
    if (!a || !out || !a->plan || !a->logits || a->n_vocab <= 0 || a->n_spaces < 1 ||
        a->n_spaces > 2 || seq_id < 0 || seq_id > 63 || pos < 0 || a->kv_pad <= 0 ||
        (a->n_spaces > 1 && (a->ring <= 0 || a->window < 0)))
        return PG_ERR_INVALID_ARG;
    a->bad_node = -1;
    a->n_undo = 0;
    int64_t cells[2];
    int32_t st = place(a, pos, seq_id, cells);
    if (st != PG_OK) return st;
    for (int32_t s = 0; s < a->n_spaces; s++) {
        if (space_n_kv(a->cell_pos[s], a->n_cells[s], a->kv_pad) != a->n_kv[s]) {
            pg_decode_step_undo(a);
            return PG_STEP_OTHER_GRAPH;
        }
    }
    if (a->inp_tokens) a->inp_tokens[0] = token;
    if (a->inp_pos) a->inp_pos[0] = pos;
    for (int32_t s = 0; s < 2; s++)
        if (a->inp_kv_idxs[s]) a->inp_kv_idxs[s][0] = (int32_t)cells[s];
    if (a->inp_out_ids) a->inp_out_ids[0] = 0;
    const int64_t sid = seq_id;
    for (int32_t m = 0; m < 2; m++) {
        if (!a->mask[m]) continue;
        const int64_t sp = a->mask_space[m], nkv = a->mask_n_kv[m];
        if (sp < 0 || sp >= a->n_spaces || nkv > a->n_cells[sp]) { st = PG_ERR_INVALID_ARG; break; }
        st = pg_kv_mask(a->cell_pos[sp], a->cell_seqs[sp], nkv, &pos, &sid, 1, a->mask_window[m],
                        a->mask[m], nkv);
        if (st != PG_OK) break;
    }
    int32_t not_finite = 0;
    if (st == PG_OK) {
        const int64_t t0 = now_ns();
        st = pg_plan_compute_out(a->plan, a->tp, a->n_threads, a->work, a->work_size,
                                 &a->bad_node, a->logits, out, a->n_vocab, &not_finite);
        a->t_compute_ns += now_ns() - t0;
    }
    if (st != PG_OK) {
        pg_decode_step_undo(a);
        return st;
    }
    if (not_finite) {
        pg_decode_step_undo(a);
        return PG_STEP_NOT_FINITE;
    }
    return PG_OK;
}
