/* FLASH_ATTN_EXT: out[Dv, H, n_q, B] = softmax(q·kᵀ·scale (+softcap) + mask)·v per query row and
 * head, with an online softmax: the n_q × n_kv score matrix is never materialised.
 *
 * Work is done in tiles: up to PG_FA_QB query rows × the G = H/Hkv query heads that share one KV
 * head (FlashAttention-2's loop order). A tile walks the keys in blocks of up to PG_FA_KB; keys
 * the mask hides from the whole tile are dropped; the others' K and V rows are read in place
 * when F16 (qk_f16 / pv_f16 convert in registers: an fp32 copy of a block did not fit in L1
 * beside the rest and cost a third of a long decode) or else converted to fp32 once per tile
 * and block, and the per-path kernels (attn.h) compute the block's scores
 * S = Q·Kᵀ (rows × keys), the online-softmax weights P = exp(S - running max) and
 * acc = acc·rescale + P·V as small matrix products. q is converted to K's vec_dot_type and back
 * (e.g. rounded to fp16 for F16 K), so the scores see q as ggml's K dots do; a block-quantized K
 * (a quantized KV cache) is not converted at all: its scores are the type's own dots of the
 * quantized rows with q in its vec_dot_type (gemm / vec_dot), ggml's kq_vec_dot bit for bit.
 *
 * Chunks (split-KV): a tile's kept keys are cut into chunks of PG_FA_CHUNK kept keys (a whole
 * number of blocks). Each chunk runs its own online softmax from scratch and ends with a
 * partial (max, sum, Σ weight·v) per row; the partials are merged in chunk order (merge_chunk:
 * one formula, one order). The cut depends only on the keys and PG_FA_CHUNK, never on the
 * thread count, so how chunks are dealt does not change a bit:
 *   - prompts (many tiles): tiles are dealt to threads round-robin (tile i to thread i % nth;
 *     with a causal mask the later query tiles see more keys, and a contiguous split left one
 *     thread three quarters of the work); a thread walks its tile's chunks in order and merges
 *     each as it ends;
 *   - decode (n_q·B <= PG_FA_SPLIT_Q rows, few tiles: Qwen's 2 KV heads, Gemma's one): every
 *     (tile, chunk) is a work item dealt round-robin, so a 16k-key head is read by all threads;
 *     the chunk boundaries are found first (one scan of the mask per tile), the partials kept
 *     in the shared work buffer, then merged per tile after a barrier (split_kv).
 * A row with at most PG_FA_CHUNK visible keys has one chunk, and the merge copies it: its bits
 * are those of a plain online softmax over all its keys.
 *
 * Batch invariance: a row's result depends only on the keys it sees, in cell order, never on
 * the other rows of the batch or on cells it does not see (other sequences' KV cells). So
 *   - a tile only groups consecutive query rows whose visible key sets are nested (each row sees
 *     everything the previous one sees: the causal rows of one sequence), never rows of two
 *     sequences; its kept keys are then the last row's, and each row's keys a prefix of them;
 *   - a block is the next PG_FA_KB kept keys and a chunk the next PG_FA_CHUNK (not ranges of
 *     cells), so a row's blocks and chunks, its online-softmax rescale points and each key's
 *     place in its block are those of the row alone; hidden keys after a row's prefix add exact
 *     zeros, and a chunk the row sees nothing of is skipped by the merge;
 *   - the kernels compute each score, weight and output lane the same wherever the key or row
 *     sits in the block (attn_avx2.c, attn_avx512.c: one reduction tree for every score). */
#include <math.h>
#include <string.h>

#include "attn.h"
#include "fp16.h"
#include "ops.h"

#ifndef PG_FA_QB
#define PG_FA_QB 16   /* query rows per tile */
#endif
#ifndef PG_FA_KB
#define PG_FA_KB 64   /* keys per block */
#endif
#ifndef PG_FA_CHUNK
#define PG_FA_CHUNK 512   /* kept keys per chunk (part of the result's definition, see above) */
#endif
#ifndef PG_FA_SPLIT_Q
#define PG_FA_SPLIT_Q 8   /* query rows (n_q·B) up to which chunks are dealt to threads */
#endif
#define PG_FA_SPLIT_BYTES ((size_t)16 << 20)   /* the most shared work the split may take */
enum { FA_SPLIT_MAX_TILES = 512 };              /* the most tiles the split lists (on the stack) */
_Static_assert(PG_FA_CHUNK % PG_FA_KB == 0, "a chunk is a whole number of blocks");

typedef struct {
    int64_t D, Dv, n_q, H, n_kv, G, n_qb, Hkv, B;
    size_t  qrow_bytes;      /* one q row in K's vec_dot_type */
    int64_t rows;            /* rows per tile = QB * G */
    int64_t n_chunks;        /* the most chunks a tile can have */
    int64_t max_tiles;       /* the most tiles (one per query row and KV head) */
    int     split;           /* chunks dealt to threads (split_kv) */
} fa_dims;

static size_t align64(size_t n) { return (n + 63) / 64 * 64; }

/* The split's shared part of the work buffer: chunk starts int32 [max_tiles][n_chunks + 2],
 * then partials float [n_q·B·H rows][n_chunks][Dv + 2] (acc, then max and sum). */
static size_t split_starts_bytes(const fa_dims *d) {
    return align64((size_t)d->max_tiles * (size_t)(d->n_chunks + 2) * sizeof(int32_t));
}

static size_t split_bytes(const fa_dims *d) {
    return split_starts_bytes(d) + align64((size_t)(d->n_q * d->B * d->H) *
                                           (size_t)d->n_chunks * (size_t)(d->Dv + 2) *
                                           sizeof(float));
}

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
    d.n_chunks = (d.n_kv + PG_FA_CHUNK - 1) / PG_FA_CHUNK;
    d.max_tiles = d.B * d.n_q * d.Hkv;
    d.split = d.n_q * d.B <= PG_FA_SPLIT_Q && d.n_chunks > 1 && d.max_tiles <= FA_SPLIT_MAX_TILES;
    if (d.split) d.split = split_bytes(&d) <= PG_FA_SPLIT_BYTES;
    return d;
}

/* Per-thread scratch, in floats: acc[rows·Dv], qf[rows·D], s[rows·KB], kf[KB·D], vf[KB·Dv],
 * vmax[rows], sum[rows], ms[rows], mblk[KB], macc[rows·Dv], mmax[rows], msum[rows], the tile
 * starts (n_q + 1 int32); then the tile's q rows in K's vec_dot_type. */
static size_t float_count(const fa_dims *d) {
    return (size_t)(2 * d->rows * d->Dv + d->rows * d->D + d->rows * PG_FA_KB + PG_FA_KB * d->D +
                    PG_FA_KB * d->Dv + 5 * d->rows + PG_FA_KB + d->n_q + 1);
}

static size_t per_thread_bytes(const fa_dims *d) {
    return align64(float_count(d) * sizeof(float)) + d->qrow_bytes * (size_t)d->rows;
}

size_t pg_flash_attn_work_size(const pg_tensor *all, const pg_tensor *t, int nth) {
    const fa_dims d = dims_of(all, t);
    return per_thread_bytes(&d) * (size_t)nth + (d.split ? split_bytes(&d) : 0);
}

/* whether the mask hides key j (-inf), from the raw bits: fp16 -inf is 0xfc00 */
static int mask_hides(const pg_tensor *m, const uint8_t *mrow, int64_t j) {
    return m->type == PG_TYPE_F16 ? ((const pg_fp16 *)mrow)[j] == 0xfc00
                                  : ((const float *)mrow)[j] == -INFINITY;
}

/* the mask value of key j as fp32 */
static float mask_at(const pg_tensor *m, const uint8_t *mrow, int64_t j) {
    return m->type == PG_TYPE_F16 ? pg_fp16_to_fp32(((const pg_fp16 *)mrow)[j])
                                  : ((const float *)mrow)[j];
}

/* whether query row iq sees (in every mask head) every key that row iq − 1 sees */
static int sees_all_of_previous(const pg_tensor *m, int64_t iq, int64_t ib, int64_t n_kv) {
    for (int64_t h = 0; h < m->ne[2]; h++) {
        const uint8_t *a = pg_ptr(m, 0, iq - 1, h, ib % m->ne[3]);
        const uint8_t *b = pg_ptr(m, 0, iq, h, ib % m->ne[3]);
        for (int64_t j = 0; j < n_kv; j++)
            if (mask_hides(m, b, j) && !mask_hides(m, a, j)) return 0;
    }
    return 1;
}

/* Query rows [starts[i], starts[i + 1]) form tile group i of batch ib: at most qb rows, cut
 * where a row does not see every key its predecessor sees. Returns the number of groups. */
static int64_t tile_groups(const pg_tensor *m, const fa_dims *d, int64_t ib, int32_t *starts) {
    const int64_t qb = d->rows / d->G;
    int64_t n = 0;
    starts[n++] = 0;
    for (int64_t iq = 1; iq < d->n_q; iq++)
        if (iq - starts[n - 1] == qb || (m && !sees_all_of_previous(m, iq, ib, d->n_kv)))
            starts[n++] = (int32_t)iq;
    starts[n] = (int32_t)d->n_q;
    return n;
}

/* s[r·KB + c] = K's own dot (the type's gemm / vec_dot, as ggml's kq_vec_dot) of kept key
 * keys[c] with q row r in K's vec_dot_type (qconv, rows qb bytes apart), for a block-quantized K:
 * no fp32 copy of K, and the scores are ggml's bits. Runs of consecutive cells go through gemm
 * (up to 8 keys × 8 rows a call), others through vec_dot: the same bits either way. */
static void qk_quantized(const pg_type_traits *tk, const pg_tensor *k, int64_t ik2, int64_t ib,
                         int64_t D, const int64_t *keys, int64_t nk, const uint8_t *qconv,
                         size_t qb, int64_t nr, float *s) {
    const size_t bx = (size_t)k->nb[1];
    for (int64_t c = 0; c < nk;) {
        int64_t run = 1;
        while (c + run < nk && run < PG_GEMM_MAX_NR && keys[c + run] == keys[c] + run) run++;
        const uint8_t *x = pg_ptr(k, 0, keys[c], ik2, ib);
        if (tk->gemm) {
            for (int64_t r = 0; r < nr; r += PG_GEMM_MAX_NC) {
                const int nc = (int)(nr - r < PG_GEMM_MAX_NC ? nr - r : PG_GEMM_MAX_NC);
                tk->gemm(D, s + r * PG_FA_KB + c, PG_FA_KB * sizeof(float), x, bx,
                         qconv + (size_t)r * qb, qb, (int)run, nc);
            }
        } else {
            for (int64_t i = 0; i < run; i++)
                for (int64_t r = 0; r < nr; r++)
                    tk->vec_dot(D, s + r * PG_FA_KB + c + i, x + (size_t)i * bx,
                                qconv + (size_t)r * qb);
        }
        c += run;
    }
}

/* one row of K or V as fp32 */
static void row_to_f32(const pg_attn_kernels *kern, const pg_type_traits *tt, int32_t type,
                       const void *x, float *y, int64_t n) {
    if (type == PG_TYPE_F32) memcpy(y, x, (size_t)n * sizeof(float));
    else if (type == PG_TYPE_F16) kern->f16_to_f32(x, y, n);
    else tt->to_float(x, y, n);
}

/* what every thread knows of one FLASH_ATTN_EXT call */
typedef struct {
    const pg_tensor *q, *k, *v, *m, *sinks;
    const pg_type_traits *tk, *tq, *tv;
    const pg_attn_kernels *kern;
    fa_dims d;
    int k_blocks;            /* scores by K's own dot (qk_quantized) */
    float scale, max_bias, softcap, m0, m1;
    uint32_t n_head_log2;
} fa_call;

/* one tile: query rows [q0, q1) of batch ib, KV head ik2; row r is query q0 + r / G, head
 * ik2·G + r % G */
typedef struct {
    int64_t ib, ik2, q0, q1, nr;
} fa_tile;

/* a thread's scratch (per_thread_bytes) and the tile it holds */
typedef struct {
    float *acc, *qf, *s, *kf, *vf, *vmax, *sum, *ms, *mblk, *macc, *mmax, *msum;
    int32_t *starts;
    uint8_t *qconv;
    const uint8_t *mrows[PG_FA_QB * 64];
    float slopes[PG_FA_QB * 64];
    int64_t keys[PG_FA_KB];
} fa_scratch;

enum { FA_MAX_ROWS = PG_FA_QB * 64 };   /* the validator allows G <= 64 */

static void scratch_of(const fa_dims *d, uint8_t *base, fa_scratch *w) {
    w->acc = (float *)base;
    w->qf = w->acc + d->rows * d->Dv;
    w->s = w->qf + d->rows * d->D;
    w->kf = w->s + d->rows * PG_FA_KB;
    w->vf = w->kf + PG_FA_KB * d->D;
    w->vmax = w->vf + PG_FA_KB * d->Dv;
    w->sum = w->vmax + d->rows;
    w->ms = w->sum + d->rows;
    w->mblk = w->ms + d->rows;
    w->macc = w->mblk + PG_FA_KB;
    w->mmax = w->macc + d->rows * d->Dv;
    w->msum = w->mmax + d->rows;
    w->starts = (int32_t *)(w->msum + d->rows);
    w->qconv = base + align64(float_count(d) * sizeof(float));
}

/* the tile's q rows in K's vec_dot_type (qf fp32, or qconv for a block-quantized K), its mask
 * rows and ALiBi slopes */
static void tile_setup(const fa_call *c, const fa_tile *tl, fa_scratch *w) {
    const fa_dims *d = &c->d;
    for (int64_t r = 0; r < tl->nr; r++) {
        const int64_t iq = tl->q0 + r / d->G, ih = tl->ik2 * d->G + r % d->G;
        const float *qr = pg_ptr(c->q, 0, iq, ih, tl->ib);
        float *qd = w->qf + r * d->D;
        if (c->tk->vec_dot_type == PG_TYPE_F32) {
            memcpy(qd, qr, (size_t)d->D * sizeof(float));
        } else if (c->tk->vec_dot_type == PG_TYPE_F16) {
            c->kern->round_f16(qr, qd, d->D);
        } else if (c->k_blocks) {
            c->tq->from_float(qr, w->qconv + (size_t)r * d->qrow_bytes, d->D);
        } else {
            c->tq->from_float(qr, w->qconv, d->D);
            c->tq->to_float(w->qconv, qd, d->D);
        }
        const pg_tensor *m = c->m;
        w->mrows[r] = m ? pg_ptr(m, 0, iq, ih % m->ne[2], tl->ib % m->ne[3]) : NULL;
        w->slopes[r] = c->max_bias > 0.0f
            ? ((uint32_t)ih < c->n_head_log2
                   ? powf(c->m0, (float)(ih + 1))
                   : powf(c->m1, (float)(2 * ((uint32_t)ih - c->n_head_log2) + 1)))
            : 1.0f;
    }
}

/* whether some row of the tile sees key j */
static int tile_keeps(const fa_call *c, const fa_tile *tl, const fa_scratch *w, int64_t j) {
    const pg_tensor *m = c->m;
    if (!m) return 1;
    for (int64_t r = 0; r < tl->nr; r += c->d.G)   /* heads of one query share a mask row */
        if (!mask_hides(m, w->mrows[r], j)) return 1;
    if (m->ne[2] > 1)
        for (int64_t r = 0; r < tl->nr; r++)
            if (!mask_hides(m, w->mrows[r], j)) return 1;
    return 0;
}

/* The next kept keys from cell j (before `end`): up to `max` cells into keys (NULL: only
 * counted). Returns how many; *next is the cell after the last one looked at. A tile of one
 * query row with one mask row for all its heads (decode) scans that row in a tight loop. */
static int64_t next_kept(const fa_call *c, const fa_tile *tl, const fa_scratch *w, int64_t j,
                         int64_t end, int64_t max, int64_t *keys, int64_t *next) {
    const pg_tensor *m = c->m;
    int64_t n = 0;
    if (!m) {
        for (; j < end && n < max; j++, n++)
            if (keys) keys[n] = j;
    } else if (tl->nr == c->d.G && m->ne[2] == 1 && m->type == PG_TYPE_F16) {
        const pg_fp16 *row = (const pg_fp16 *)w->mrows[0];
        for (; j < end && n < max; j++)
            if (row[j] != 0xfc00) {
                if (keys) keys[n] = j;
                n++;
            }
    } else {
        for (; j < end && n < max; j++)
            if (tile_keeps(c, tl, w, j)) {
                if (keys) keys[n] = j;
                n++;
            }
    }
    *next = j;
    return n;
}

/* rows keys[i] (i < nk) of K or V head ik2 as fp32, rows ld floats apart; runs of consecutive
 * cells in one conversion (the same values as row by row) */
static void rows_to_f32(const fa_call *c, const pg_tensor *x, const pg_type_traits *tt,
                        const fa_tile *tl, const int64_t *keys, int64_t nk, float *y, int64_t n) {
    const int dense = (size_t)x->nb[1] == pg_type_row_size(x->type, n);   /* rows back to back */
    for (int64_t i = 0; i < nk;) {
        int64_t run = 1;
        if (dense)
            while (i + run < nk && keys[i + run] == keys[i] + run) run++;
        row_to_f32(c->kern, tt, x->type, pg_ptr(x, 0, keys[i], tl->ik2, tl->ib), y + i * n,
                   n * run);
        i += run;
    }
}

/* asks for rows [j, j + n) of head ik2 of K or V to be brought into the cache (the kernels of a
 * block are busy long enough for them to arrive: a long cache is read from memory) */
static void prefetch_rows(const pg_tensor *x, int64_t j, int64_t n, int64_t row_bytes,
                          const fa_tile *tl) {
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *a = pg_ptr(x, 0, j + i, tl->ik2, tl->ib);
        for (int64_t o = 0; o < row_bytes; o += 64) __builtin_prefetch(a + o, 0, 3);
    }
}

/* the block's rows of an F16 K or V in place (rows *ld elements apart) when its keys are
 * consecutive cells, else gathered into buf (rows n apart) */
static const uint16_t *f16_rows(const pg_tensor *x, const fa_tile *tl, const int64_t *keys,
                                int64_t nk, int64_t n, uint16_t *buf, int64_t *ld) {
    if (keys[nk - 1] - keys[0] == nk - 1 && x->nb[1] % sizeof(uint16_t) == 0) {
        *ld = (int64_t)(x->nb[1] / sizeof(uint16_t));
        return pg_ptr(x, 0, keys[0], tl->ik2, tl->ib);
    }
    for (int64_t i = 0; i < nk; i++)
        memcpy(buf + i * n, pg_ptr(x, 0, keys[i], tl->ik2, tl->ib), (size_t)n * sizeof(uint16_t));
    *ld = n;
    return buf;
}

/* One chunk: an online softmax from scratch over the next PG_FA_CHUNK kept keys from cell j0
 * (cells before `end`), leaving per row its max (vmax, -inf when it saw nothing), sum and
 * Σ weight·v (acc). Returns the cell after the chunk's last key. */
static int64_t run_chunk(const fa_call *c, const fa_tile *tl, fa_scratch *w, int64_t j0,
                         int64_t end) {
    const fa_dims *d = &c->d;
    const pg_tensor *m = c->m;
    const int64_t nr = tl->nr;
    for (int64_t r = 0; r < nr; r++) {
        w->vmax[r] = -INFINITY;
        w->sum[r] = 0.0f;
    }
    memset(w->acc, 0, (size_t)nr * (size_t)d->Dv * sizeof(float));
    int64_t jn = j0;
    for (int64_t kept = 0; kept < PG_FA_CHUNK && jn < end;) {   /* blocks of PG_FA_KB keys */
        const int64_t nk = next_kept(c, tl, w, jn, end, PG_FA_KB, w->keys, &jn);
        if (!nk) break;
        kept += nk;
        if (jn < end) {   /* the next block's K and V rows, if its cells follow on */
            const int64_t np = end - jn < PG_FA_KB ? end - jn : PG_FA_KB;
            prefetch_rows(c->k, jn, np, (int64_t)pg_type_row_size(c->k->type, d->D), tl);
            prefetch_rows(c->v, jn, np, (int64_t)pg_type_row_size(c->v->type, d->Dv), tl);
        }
        if (c->k_blocks) {
            qk_quantized(c->tk, c->k, tl->ik2, tl->ib, d->D, w->keys, nk, w->qconv,
                         d->qrow_bytes, nr, w->s);
        } else if (c->k->type == PG_TYPE_F16) {
            int64_t ldk;
            const uint16_t *kh = f16_rows(c->k, tl, w->keys, nk, d->D, (uint16_t *)w->kf, &ldk);
            c->kern->qk_f16(d->D, nr, nk, w->qf, d->D, kh, ldk, w->s, PG_FA_KB);
        } else {
            rows_to_f32(c, c->k, c->tk, tl, w->keys, nk, w->kf, d->D);
            c->kern->qk(d->D, nr, nk, w->qf, d->D, w->kf, d->D, w->s, PG_FA_KB);
        }
        const uint8_t *mlast = NULL;
        for (int64_t r = 0; r < nr; r++) {
            float *sr = w->s + r * PG_FA_KB;
            if (m && w->mrows[r] != mlast) {   /* the block's mask values of the kept keys */
                mlast = w->mrows[r];
                for (int64_t i = 0; i < nk; i++) w->mblk[i] = mask_at(m, mlast, w->keys[i]);
            }
            float sc = c->scale;
            if (c->softcap != 0.0f) {
                for (int64_t i = 0; i < nk; i++) sr[i] = c->softcap * tanhf(sr[i] * c->scale);
                sc = 1.0f;
            }
            const float bmax = c->kern->scale_max(sr, nk, sc, m ? w->mblk : NULL, w->slopes[r]);
            if (bmax == -INFINITY) {   /* every key of the block hidden from this row */
                memset(sr, 0, (size_t)nk * sizeof(float));
                w->ms[r] = 1.0f;
                continue;
            }
            const float mnew = bmax > w->vmax[r] ? bmax : w->vmax[r];
            /* rescale what the old max weighed (0 at first) */
            w->ms[r] = expf(w->vmax[r] - mnew);
            w->vmax[r] = mnew;
            w->sum[r] = w->sum[r] * w->ms[r] + c->kern->exp_sum(sr, nk, mnew);
        }
        if (c->v->type == PG_TYPE_F16) {
            int64_t ldv;
            const uint16_t *vh = f16_rows(c->v, tl, w->keys, nk, d->Dv, (uint16_t *)w->vf, &ldv);
            c->kern->pv_f16(d->Dv, nr, nk, w->s, PG_FA_KB, vh, ldv, w->ms, w->acc, d->Dv);
        } else {
            rows_to_f32(c, c->v, c->tv, tl, w->keys, nk, w->vf, d->Dv);
            c->kern->pv(d->Dv, nr, nk, w->s, PG_FA_KB, w->vf, d->Dv, w->ms, w->acc, d->Dv);
        }
    }
    return jn;
}

/* Merges one row's chunk partial (max cm, sum cs, Σ weight·v ca[Dv]) into what the row's earlier
 * chunks left (*M, *S, A; *M = -inf before the first): the first seen is copied, later ones
 * are weighed by exp(max - the new max). One formula for every thread count and path. */
static void merge_chunk(int64_t Dv, float cm, float cs, const float *ca, float *M, float *S,
                        float *A) {
    if (cm == -INFINITY) return;   /* the row saw no key of this chunk */
    if (*M == -INFINITY) {
        *M = cm;
        *S = cs;
        memcpy(A, ca, (size_t)Dv * sizeof(float));
        return;
    }
    const float mn = cm > *M ? cm : *M;
    const float a = expf(*M - mn), b = expf(cm - mn);
    for (int64_t x = 0; x < Dv; x++) {
        const float t = A[x] * a;
        A[x] = t + ca[x] * b;
    }
    const float t = *S * a;
    *S = t + cs * b;
    *M = mn;
}

/* the tile's rows from their merged (max, sum, acc): sinks, 1 / sum, written out */
static void finish_tile(const fa_call *c, const fa_tile *tl, pg_tensor *t, const float *vmax,
                        float *sum, float *acc) {
    const fa_dims *d = &c->d;
    for (int64_t r = 0; r < tl->nr; r++) {
        const int64_t iq = tl->q0 + r / d->G, ih = tl->ik2 * d->G + r % d->G;
        float *out = pg_ptr(t, 0, ih, iq, tl->ib);
        float *a = acc + r * d->Dv;
        if (c->sinks) {   /* ggml's order: a sink above the max rescales what was summed */
            const float sv = ((const float *)c->sinks->data)[ih];
            if (sv > vmax[r]) {
                const float msr = expf(vmax[r] - sv);
                for (int64_t x = 0; x < d->Dv; x++) a[x] *= msr;
                sum[r] = sum[r] * msr + 1.0f;
            } else {
                sum[r] = sum[r] + expf(sv - vmax[r]);
            }
        }
        const float inv = sum[r] > 0.0f ? 1.0f / sum[r] : 0.0f;
        for (int64_t x = 0; x < d->Dv; x++) out[x] = a[x] * inv;
    }
}

/* Prompts: tiles round-robin, each walked chunk by chunk by one thread. */
static void by_tiles(const pg_cparams *p, const fa_call *c, fa_scratch *w, pg_tensor *t) {
    const fa_dims *d = &c->d;
    int64_t n = -1;
    for (int64_t ib = 0; ib < d->B; ib++) {
        const int64_t n_groups = tile_groups(c->m, d, ib, w->starts);
        for (int64_t i = 0; i < n_groups * d->Hkv; i++) {
            if (++n % p->nth != p->ith) continue;
            const int64_t ig = i / d->Hkv;
            fa_tile tl = {ib, i % d->Hkv, w->starts[ig], w->starts[ig + 1], 0};
            tl.nr = (tl.q1 - tl.q0) * d->G;
            if (tl.nr > FA_MAX_ROWS) { pg_report_bad_data(p); return; }
            tile_setup(c, &tl, w);
            for (int64_t r = 0; r < tl.nr; r++) w->mmax[r] = -INFINITY, w->msum[r] = 0.0f;
            memset(w->macc, 0, (size_t)tl.nr * (size_t)d->Dv * sizeof(float));
            for (int64_t jn = 0; jn < d->n_kv;) {
                jn = run_chunk(c, &tl, w, jn, d->n_kv);
                for (int64_t r = 0; r < tl.nr; r++)
                    merge_chunk(d->Dv, w->vmax[r], w->sum[r], w->acc + r * d->Dv, &w->mmax[r],
                                &w->msum[r], w->macc + r * d->Dv);
            }
            finish_tile(c, &tl, t, w->mmax, w->msum, w->macc);
        }
    }
}

/* Decode: every thread lists the same tiles (few rows: cheap); (1) each tile's chunk starts,
 * tiles round-robin; (2) every (tile, chunk) round-robin, its partial to the shared buffer;
 * (3) each tile's partials merged in chunk order, tiles round-robin. Every thread reaches both
 * barriers. */
static void split_kv(const pg_cparams *p, const fa_call *c, fa_scratch *w, pg_tensor *t) {
    const fa_dims *d = &c->d;
    const int64_t nc1 = d->n_chunks + 2, pstride = d->n_chunks * (d->Dv + 2);
    int32_t *cstart = (int32_t *)(p->work + per_thread_bytes(d) * (size_t)p->nth);
    float *part = (float *)((uint8_t *)cstart + split_starts_bytes(d));
    fa_tile tiles[FA_SPLIT_MAX_TILES];
    int64_t roff[FA_SPLIT_MAX_TILES + 1];   /* the tiles' first rows among all rows */
    int64_t nt = 0;
    roff[0] = 0;
    for (int64_t ib = 0; ib < d->B; ib++) {
        const int64_t n_groups = tile_groups(c->m, d, ib, w->starts);
        for (int64_t i = 0; i < n_groups * d->Hkv; i++, nt++) {   /* nt < max_tiles */
            const int64_t ig = i / d->Hkv;
            fa_tile tl = {ib, i % d->Hkv, w->starts[ig], w->starts[ig + 1], 0};
            tl.nr = (tl.q1 - tl.q0) * d->G;
            tiles[nt] = tl;
            roff[nt + 1] = roff[nt] + tl.nr;
        }
    }
    /* (1) chunk starts: cs[0] = the tile's chunk count n, cs[1 + i] = the cell of its
     * (i·CHUNK)-th kept key, cs[1 + n] = n_kv */
    for (int64_t i = p->ith; i < nt; i += p->nth) {
        int32_t *cs = cstart + i * nc1;
        tile_setup(c, &tiles[i], w);
        int64_t n = 0;
        for (int64_t j = 0; j < d->n_kv;) {
            int64_t first = 0;
            if (!next_kept(c, &tiles[i], w, j, d->n_kv, 1, &first, &j)) break;
            cs[1 + n++] = (int32_t)first;
            int64_t more;   /* the chunk's other kept keys, counted */
            next_kept(c, &tiles[i], w, j, d->n_kv, PG_FA_CHUNK - 1, NULL, &more);
            j = more;
        }
        cs[0] = (int32_t)n;
        cs[1 + n] = (int32_t)d->n_kv;
    }
    pg_sync(p);
    /* (2) the partials (a tile with every key hidden has no chunk) */
    int64_t unit = -1;
    for (int64_t i = 0; i < nt; i++) {
        const int32_t *cs = cstart + i * nc1;
        for (int64_t ch = 0; ch < cs[0]; ch++) {
            if (++unit % p->nth != p->ith) continue;
            tile_setup(c, &tiles[i], w);
            run_chunk(c, &tiles[i], w, cs[1 + ch], cs[2 + ch]);
            for (int64_t r = 0; r < tiles[i].nr; r++) {
                float *pp = part + (roff[i] + r) * pstride + ch * (d->Dv + 2);
                memcpy(pp, w->acc + r * d->Dv, (size_t)d->Dv * sizeof(float));
                pp[d->Dv] = w->vmax[r];
                pp[d->Dv + 1] = w->sum[r];
            }
        }
    }
    pg_sync(p);
    /* (3) merge and write out */
    for (int64_t i = p->ith; i < nt; i += p->nth) {
        const int64_t n = cstart[i * nc1];
        const fa_tile *tl = &tiles[i];
        for (int64_t r = 0; r < tl->nr; r++) {
            w->mmax[r] = -INFINITY;
            w->msum[r] = 0.0f;
            memset(w->macc + r * d->Dv, 0, (size_t)d->Dv * sizeof(float));
            for (int64_t ch = 0; ch < n; ch++) {
                const float *pp = part + (roff[i] + r) * pstride + ch * (d->Dv + 2);
                merge_chunk(d->Dv, pp[d->Dv], pp[d->Dv + 1], pp, &w->mmax[r], &w->msum[r],
                            w->macc + r * d->Dv);
            }
        }
        finish_tile(c, tl, t, w->mmax, w->msum, w->macc);
    }
}

void pg_fwd_flash_attn(const pg_cparams *p, pg_tensor *all, pg_tensor *t) {
    fa_call c;
    c.q = PG_SRC(all, t, 0);
    c.k = PG_SRC(all, t, 1);
    c.v = PG_SRC(all, t, 2);
    c.m = PG_SRC(all, t, 3);
    c.sinks = PG_SRC(all, t, 4);   /* F32 [>= H]: one extra logit per head */
    c.tk = pg_get_type_traits(c.k->type);
    c.tq = pg_get_type_traits(c.tk->vec_dot_type);
    c.tv = pg_get_type_traits(c.v->type);
    c.kern = pg_get_attn_kernels();
    c.d = dims_of(all, t);
    c.k_blocks = c.tk->block_size > 1;
    c.scale = pg_op_f32(t, 0);
    c.max_bias = pg_op_f32(t, 1);
    c.softcap = pg_op_f32(t, 2);
    if (c.softcap != 0.0f) c.scale /= c.softcap;
    c.n_head_log2 = c.d.H ? 1u << (uint32_t)floor(log2((double)c.d.H)) : 1;
    c.m0 = powf(2.0f, -(c.max_bias) / (float)c.n_head_log2);
    c.m1 = powf(2.0f, -(c.max_bias / 2.0f) / (float)c.n_head_log2);

    fa_scratch w;
    scratch_of(&c.d, p->work + per_thread_bytes(&c.d) * (size_t)p->ith, &w);
    if (c.d.split && p->nth > 1) split_kv(p, &c, &w, t);
    else by_tiles(p, &c, &w, t);
}

/* ---- scalar kernels (the reference of attn_avx2.c / attn_avx512.c) ---------------------------- */

static void qk_scalar(int64_t D, int64_t nr, int64_t nc, const float *q, int64_t ldq,
                      const float *k, int64_t ldk, float *s, int64_t lds) {
    for (int64_t r = 0; r < nr; r++)
        for (int64_t c = 0; c < nc; c++) {
            const float *a = q + r * ldq, *b = k + c * ldk;
            float acc = 0.0f;
            for (int64_t i = 0; i < D; i++) acc += a[i] * b[i];
            s[r * lds + c] = acc;
        }
}

static void pv_scalar(int64_t Dv, int64_t nr, int64_t nc, const float *p, int64_t ldp,
                      const float *v, int64_t ldv, const float *ms, float *acc, int64_t lda) {
    for (int64_t r = 0; r < nr; r++) {
        float *a = acc + r * lda;
        for (int64_t x = 0; x < Dv; x++) a[x] *= ms[r];
        for (int64_t c = 0; c < nc; c++) {
            const float w = p[r * ldp + c];
            const float *vr = v + c * ldv;
            for (int64_t x = 0; x < Dv; x++) a[x] += w * vr[x];
        }
    }
}

static void qk_f16_scalar(int64_t D, int64_t nr, int64_t nc, const float *q, int64_t ldq,
                          const uint16_t *k, int64_t ldk, float *s, int64_t lds) {
    for (int64_t r = 0; r < nr; r++)
        for (int64_t c = 0; c < nc; c++) {
            const float *a = q + r * ldq;
            const uint16_t *b = k + c * ldk;
            float acc = 0.0f;
            for (int64_t i = 0; i < D; i++) acc += a[i] * pg_fp16_to_fp32(b[i]);
            s[r * lds + c] = acc;
        }
}

static void pv_f16_scalar(int64_t Dv, int64_t nr, int64_t nc, const float *p, int64_t ldp,
                          const uint16_t *v, int64_t ldv, const float *ms, float *acc,
                          int64_t lda) {
    for (int64_t r = 0; r < nr; r++) {
        float *a = acc + r * lda;
        for (int64_t x = 0; x < Dv; x++) a[x] *= ms[r];
        for (int64_t c = 0; c < nc; c++) {
            const float w = p[r * ldp + c];
            const uint16_t *vr = v + c * ldv;
            for (int64_t x = 0; x < Dv; x++) a[x] += w * pg_fp16_to_fp32(vr[x]);
        }
    }
}

static float scale_max_scalar(float *s, int64_t n, float scale, const float *mask, float slope) {
    float mx = -INFINITY;
    for (int64_t c = 0; c < n; c++) {
        s[c] = mask ? s[c] * scale + slope * mask[c] : s[c] * scale;
        mx = s[c] > mx ? s[c] : mx;
    }
    return mx;
}

static void silu_scalar(const float *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = x[i] / (1.0f + expf(-x[i]));
}

static float exp_sum_scalar(float *s, int64_t n, float m) {
    float total = 0.0f;
    for (int64_t c = 0; c < n; c++) {
        s[c] = expf(s[c] - m);
        total += s[c];
    }
    return total;
}

static void f16_to_f32_scalar(const uint16_t *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = pg_fp16_to_fp32(x[i]);
}

static void round_f16_scalar(const float *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = pg_fp16_to_fp32(pg_fp32_to_fp16(x[i]));
}

void pg_fill_attn_scalar(pg_attn_kernels *k) {
    k->qk = qk_scalar;
    k->pv = pv_scalar;
    k->qk_f16 = qk_f16_scalar;
    k->pv_f16 = pv_f16_scalar;
    k->scale_max = scale_max_scalar;
    k->exp_sum = exp_sum_scalar;
    k->silu = silu_scalar;
    k->f16_to_f32 = f16_to_f32_scalar;
    k->round_f16 = round_f16_scalar;
}
