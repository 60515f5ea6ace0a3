/* MUL_MAT_ID (ggml_mul_mat_id, the expert FFN of a mixture of experts):
 *   dst[:, i, t] = as[:, :, ids[i, t]] · b[:, i % b.ne1, t]
 * as: stacked expert weights [K, N, n_as]; b: F32 [K, n_b, n_tok]; ids: I32 [n_ids, n_tok] (any
 * strides); dst: F32 [N, n_ids, n_tok].
 *
 * Three phases, with a barrier after each of the first two:
 *   1. thread 0 groups the (slot, token) entries by expert: a counting sort, so each expert's
 *      entries keep token order (as ggml's row mapping); entries with an id outside [0, n_as)
 *      get a zero output row and make the graph fail (bad index data);
 *   2. all threads convert the activation row of every entry into the weight type's
 *      vec_dot_type, stored grouped by expert (rows rb bytes apart), so an expert's activations
 *      are one strided block a gemm kernel can take;
 *   3. for each expert that has entries, every thread computes its own range of the N weight
 *      rows for all of that expert's entries, so only the selected experts' rows are read and
 *      no weight row is read by two threads. One entry: vec_dot8 / vec_dot (decode); several: the
 *      weight type's gemm in blocks of PG_GEMM_MAX_NR rows x PG_GEMM_MAX_NC entries (each block
 *      decodes a weight block once for all its entries), with outer blocks of about
 *      PG_MMID_ACT_BYTES of activations that the weight rows then reuse from cache; from
 *      pg_tile_min_rows entries on (prompts), dense MUL_MAT's repacked 16-row tiles
 *      (pg_tile_product, gemm_tile.h): each thread packs 16 of the expert's rows at a time into
 *      its own scratch and the tile serves all the expert's entries (the weights are not
 *      copied: mapped experts stay mapped).
 * Each dot is computed the same way whatever the thread count (ranges are cut at multiples of
 * the gemm block or tile), and every kernel has the bits of the type's vec_dot, so results
 * depend neither on the thread count nor on how many tokens an expert got.
 *
 * Work buffer: [n_as + 1] int64 offsets | [E] int32 entries (slot + n_ids * token) | [E] their
 * output rows | E converted activation rows (64-byte aligned), E = n_ids * n_tok; then, when
 * an expert may take the tiles, each thread's tile.
 *
 * Decode (one token: E = n_ids, a handful of rows): every thread does phases 1 and 2 itself, in
 * its own copy of that layout, and no barrier is needed (two per node fewer per token; on a busy
 * machine a barrier between two threads sharing a core costs a context switch). */
#include <stdint.h>
#include <string.h>

#include "gemm_tile.h"
#include "ops.h"

#define PG_MMID_ACT_BYTES (256u << 10)

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

typedef struct {
    int64_t n_as, n_ids, n_tok, E;
    size_t  rb;               /* bytes of one converted activation row */
    size_t  off_entries, off_out, off_rows, total;
    int     tiles;            /* an expert may take the tiles: each thread's tile after total */
    size_t  tile_bytes;
} mmid_layout;

static mmid_layout layout_of(const pg_tensor *as, const pg_tensor *b, const pg_tensor *ids) {
    mmid_layout L;
    L.n_as = as->ne[2];
    L.n_ids = ids->ne[0];
    L.n_tok = ids->ne[1];
    L.E = L.n_ids * L.n_tok;
    L.rb = pg_type_row_size(pg_get_type_traits(as->type)->vec_dot_type, b->ne[0]);
    L.off_entries = align64((size_t)(L.n_as + 1) * sizeof(int64_t));
    L.off_out = L.off_entries + align64((size_t)L.E * sizeof(int32_t));
    L.off_rows = L.off_out + align64((size_t)L.E * sizeof(float *));
    L.total = L.off_rows + (size_t)L.E * L.rb;
    /* one token (decode) groups privately and never has enough rows for an expert's tile */
    L.tiles = L.n_tok > 1 && L.E >= PG_TILE_MIN_ROWS_FAST && b->type == PG_TYPE_F32 &&
              pg_tile_type_possible(as->type);
    L.tile_bytes = L.tiles ? pg_tile_scratch_bytes(as->ne[0]) : 0;
    return L;
}

/* one token: each thread groups and converts privately (see the top) */
static int private_phases(const mmid_layout *L) { return L->n_tok == 1; }

size_t pg_mul_mat_id_work_size(const pg_tensor *all, const pg_tensor *t, int nth) {
    const mmid_layout L = layout_of(PG_SRC(all, t, 0), PG_SRC(all, t, 1), PG_SRC(all, t, 2));
    if (private_phases(&L)) return align64(L.total) * (size_t)nth;
    return L.tiles ? align64(L.total) + L.tile_bytes * (size_t)nth : L.total;
}

static inline int32_t id_at(const pg_tensor *ids, int64_t i, int64_t tok) {
    return *(const int32_t *)pg_ptr(ids, i, tok, 0, 0);
}

/* phase 1 (thread 0, or every thread in decode): offs[e] .. offs[e + 1] are expert e's entries
 * in `entries` */
static void group_by_expert(const pg_cparams *p, const mmid_layout *L, const pg_tensor *ids,
                            pg_tensor *t, int64_t *offs, int32_t *entries, float **out) {
    memset(offs, 0, (size_t)(L->n_as + 1) * sizeof(int64_t));
    for (int64_t tok = 0; tok < L->n_tok; tok++) {
        for (int64_t i = 0; i < L->n_ids; i++) {
            const int32_t e = id_at(ids, i, tok);
            if (e < 0 || e >= L->n_as) {   /* thread 0 zeroes and reports (decode: all group) */
                if (p->ith == 0) {
                    memset(pg_ptr(t, 0, i, tok, 0), 0, (size_t)t->ne[0] * sizeof(float));
                    pg_report_bad_data(p);
                }
                continue;
            }
            offs[e + 1]++;
        }
    }
    for (int64_t e = 0; e < L->n_as; e++) offs[e + 1] += offs[e];
    /* fill in token order; offs[e] runs up to the end of e's range, then shifts back */
    for (int64_t tok = 0; tok < L->n_tok; tok++) {
        for (int64_t i = 0; i < L->n_ids; i++) {
            const int32_t e = id_at(ids, i, tok);
            if (e < 0 || e >= L->n_as) continue;
            entries[offs[e]] = (int32_t)(i + L->n_ids * tok);
            out[offs[e]++] = pg_ptr(t, 0, i, tok, 0);
        }
    }
    for (int64_t e = L->n_as; e > 0; e--) offs[e] = offs[e - 1];
    offs[0] = 0;
}

/* [*a0, *a1) of [0, n) for thread ith of nth, cut at multiples of `unit` */
static void split_units(int64_t n, int64_t unit, int ith, int nth, int64_t *a0, int64_t *a1) {
    int64_t u0, u1;
    pg_split((n + unit - 1) / unit, ith, nth, &u0, &u1);
    *a0 = u0 * unit < n ? u0 * unit : n;
    *a1 = u1 * unit < n ? u1 * unit : n;
}

static int expert_tiles(const pg_type_traits *tr, const mmid_layout *L, int64_t cnt) {
    return L->tiles && tr->tile_pack && cnt >= pg_tile_min_rows(tr);
}

/* phase 3 for one expert: weight rows [n0, n1) x its `cnt` entries (out: their output rows) */
static void expert_rows(const pg_type_traits *tr, const uint8_t *w, size_t wnb1, int64_t K,
                        int64_t n0, int64_t n1, float *const *out, int64_t cnt,
                        const uint8_t *rows, size_t rb, void *tile) {
    if (tile) {
        pg_tile_product(tr, K, w, wnb1, n0, n1, rows, rb, cnt, NULL, 0, out, tile);
        return;
    }
    if (cnt == 1 || !tr->gemm) {
        for (int64_t j = 0; j < cnt; j++)
            pg_dot_rows(tr, K, out[j], 0, w, wnb1, n0, n1, rows + (size_t)j * rb, 0, 1);
        return;
    }
    int64_t mblk = (int64_t)(PG_MMID_ACT_BYTES / (rb ? rb : 1));
    mblk = mblk < PG_GEMM_MAX_NC ? PG_GEMM_MAX_NC : mblk - mblk % PG_GEMM_MAX_NC;
    float tmp[PG_GEMM_MAX_NC][PG_GEMM_MAX_NR];
    for (int64_t mb = 0; mb < cnt; mb += mblk) {
        const int64_t mbe = mb + mblk < cnt ? mb + mblk : cnt;
        for (int64_t n = n0; n < n1; n += PG_GEMM_MAX_NR) {
            const int nr = (int)(n1 - n < PG_GEMM_MAX_NR ? n1 - n : PG_GEMM_MAX_NR);
            for (int64_t m = mb; m < mbe; m += PG_GEMM_MAX_NC) {
                const int nc = (int)(mbe - m < PG_GEMM_MAX_NC ? mbe - m : PG_GEMM_MAX_NC);
                tr->gemm(K, &tmp[0][0], sizeof(tmp[0]), w + (size_t)n * wnb1, wnb1,
                         rows + (size_t)m * rb, rb, nr, nc);
                for (int j = 0; j < nc; j++)   /* entries' output rows are scattered */
                    memcpy(out[m + j] + n, tmp[j], (size_t)nr * sizeof(float));
            }
        }
    }
}

void pg_fwd_mul_mat_id(const pg_cparams *p, pg_tensor *all, pg_tensor *t) {
    const pg_tensor *as = PG_SRC(all, t, 0), *b = PG_SRC(all, t, 1), *ids = PG_SRC(all, t, 2);
    const pg_type_traits *tr = pg_get_type_traits(as->type);
    const int32_t vdt = tr->vec_dot_type;
    const mmid_layout L = layout_of(as, b, ids);
    const int64_t K = as->ne[0], N = as->ne[1], n_b = b->ne[1];
    const int priv = private_phases(&L);
    /* the executor adds 64 bytes of slack to the work size: room to align the start */
    uint8_t *base = (uint8_t *)(((uintptr_t)p->work + 63) & ~(uintptr_t)63);
    if (priv) base += align64(L.total) * (size_t)p->ith;
    int64_t *offs = (int64_t *)base;
    int32_t *entries = (int32_t *)(base + L.off_entries);
    float **out = (float **)(base + L.off_out);
    uint8_t *rows = base + L.off_rows;
    void *tile = L.tiles ? base + align64(L.total) + L.tile_bytes * (size_t)p->ith : NULL;

    if (p->ith == 0 || priv) group_by_expert(p, &L, ids, t, offs, entries, out);
    if (!priv) pg_sync(p);

    /* phase 2: activation rows in expert order, converted to vec_dot_type */
    const int64_t n_ok = offs[L.n_as];
    int64_t r0 = 0, r1 = n_ok;
    if (!priv) pg_split(n_ok, p->ith, p->nth, &r0, &r1);
    const pg_type_traits *tv = pg_get_type_traits(vdt);
    for (int64_t r = r0; r < r1; r++) {
        const int32_t en = entries[r];
        const float *x = pg_ptr(b, 0, (en % L.n_ids) % n_b, en / L.n_ids, 0);
        if (vdt == PG_TYPE_F32) memcpy(rows + (size_t)r * L.rb, x, (size_t)K * sizeof(float));
        else tv->from_float(x, rows + (size_t)r * L.rb, K);
    }
    if (!priv) pg_sync(p);

    /* phase 3: each expert's weight rows split over the threads */
    for (int64_t e = 0; e < L.n_as; e++) {
        const int64_t cnt = offs[e + 1] - offs[e];
        if (cnt == 0) continue;
        const int tiles = expert_tiles(tr, &L, cnt);
        int64_t n0, n1;
        if (tiles) split_units(N, PG_TILE_ROWS, p->ith, p->nth, &n0, &n1);
        else if (cnt > 1 && tr->gemm) split_units(N, PG_GEMM_MAX_NR, p->ith, p->nth, &n0, &n1);
        else pg_split(N, p->ith, p->nth, &n0, &n1);
        if (n0 >= n1) continue;
        expert_rows(tr, pg_ptr(as, 0, 0, e, 0), (size_t)as->nb[1], K, n0, n1, out + offs[e],
                    cnt, rows + (size_t)offs[e] * L.rb, L.rb, tiles ? tile : NULL);
    }
}
