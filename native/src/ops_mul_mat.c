/* MUL_MAT: dst[N, M, B2, B3] = src1[K, M, B2, B3] · src0[K, N, A2, A3]ᵀ, src0 broadcast over
 * B2/A2 and B3/A3 (ggml's convention). Activations (src1, F32) are converted once per row into the
 * weight type's vec_dot_type in the shared work buffer (all threads share the rows, then a
 * barrier; in decode each thread converts the row itself, see PG_MM_PRIVATE_ROWS); then each
 * thread computes a contiguous range of the larger output dimension, so in decode (M = 1) every
 * thread streams its own weight rows and no row is read twice.
 *
 * With a few activation rows (up to the type's vec_dot8_rows: decode, a speculative round's
 * verification, a few server streams), each thread takes a range of weight rows and vec_dot8
 * reads and unpacks each weight row once for all of them.
 *
 * With more activation rows and a gemm kernel for the weight type, the dots are
 * computed in blocks of up to PG_GEMM_MAX_NR weight rows × PG_GEMM_MAX_NC activation rows (each
 * block one gemm call, which decodes every weight block once for all its activation rows); the
 * threads' ranges are cut at multiples of the block size. A gemm computes each dot the same way
 * whatever block it falls in, and with the bits of the type's vec_dot (quants.h), so results
 * depend neither on the thread count nor on how many activation rows (tokens) there are. */
#include <string.h>

#include "amx.h"
#include "gemm_tile.h"
#include "ops.h"

#define PG_MM_TILE_N 16   /* weight rows per tile */
#define PG_MM_TILE_M 16   /* activation rows per tile */

static size_t act_bytes(const pg_tensor *src0, const pg_tensor *src1, size_t *row_bytes) {
    const int32_t vdt = pg_get_type_traits(src0->type)->vec_dot_type;
    *row_bytes = pg_type_row_size(vdt, src1->ne[0]);
    if (vdt == src1->type) return 0;   /* F32 weights read the activations in place */
    return *row_bytes * (size_t)pg_nrows(src1);
}

/* With at most this many activation rows (decode), every thread converts all of them into its
 * own part of the work buffer: the others would wait for one thread's conversion anyway, and
 * no barrier is needed before the dots (one per MUL_MAT fewer per token; on a busy machine a
 * barrier between two threads sharing a core costs a context switch). */
#define PG_MM_PRIVATE_ROWS 2

static int private_act(const pg_tensor *x) { return pg_nrows(x) <= PG_MM_PRIVATE_ROWS; }

/* [*a0, *a1) of [0, n) for thread ith of nth, cut at multiples of `unit` */
static void split_units(int64_t n, int64_t unit, int ith, int nth, int64_t *a0, int64_t *a1) {
    int64_t u0, u1;
    pg_split((n + unit - 1) / unit, ith, nth, &u0, &u1);
    *a0 = u0 * unit < n ? u0 * unit : n;
    *a1 = u1 * unit < n ? u1 * unit : n;
}

/* The amx path's tile gemm (amx.h) from this many activation rows on. Below, unpacking each
 * weight block for a tile that is mostly padding costs more than the VNNI gemm (in-cache, one
 * thread, 1536 × 1536: at 16 rows Q4_K 144 vs 130-176 GOP/s, Q6_K 120 vs 110-117; at 32 rows
 * 243 vs 125-179 and 197 vs 114-160). */
#define PG_AMX_MIN_ROWS 16

static int amx_shape(const pg_tensor *w, const pg_tensor *x) {
    return x->ne[1] >= PG_AMX_MIN_ROWS && x->ne[2] == 1 && x->ne[3] == 1 && w->ne[2] == 1 &&
           w->ne[3] == 1 && x->type == PG_TYPE_F32;
}

static int use_amx(const pg_tensor *w, const pg_tensor *x) {
    return amx_shape(w, x) && pg_get_type_traits(w->type)->amx_gemm;
}

/* whether the amx path could run this MUL_MAT: the work size covers it whatever the current
 * path, so a graph planned on one path may run on another (tests switch paths) */
static int amx_possible(const pg_tensor *w, const pg_tensor *x) {
    const pg_type_traits *tr = pg_get_type_traits_for_path(w->type, PG_PATH_AMX);
    return amx_shape(w, x) && tr && tr->amx_gemm;
}

#if defined(__x86_64__)

/* work buffer: the packed activation tiles, then each thread's scratch (64-byte aligned) */
static size_t amx_tiles_bytes(const pg_tensor *x) {
    const int64_t tiles = (x->ne[1] + PG_AMX_TILE_ROWS - 1) / PG_AMX_TILE_ROWS;
    return ((size_t)tiles * pg_amx_act_tile_bytes(x->ne[0]) + 63) / 64 * 64;
}

static size_t amx_scratch_bytes(const pg_tensor *x) {
    return (pg_amx_scratch_bytes(x->ne[0]) + 63) / 64 * 64;
}

static void mul_mat_amx(const pg_cparams *p, pg_tensor *t, const pg_tensor *w,
                        const pg_tensor *x) {
    const int64_t K = x->ne[0], M = x->ne[1], N = w->ne[1];
    const size_t tile_bytes = pg_amx_act_tile_bytes(K);
    uint8_t *scratch = p->work + amx_tiles_bytes(x) + amx_scratch_bytes(x) * (size_t)p->ith;
    int64_t a0, a1;
    pg_split((M + PG_AMX_TILE_ROWS - 1) / PG_AMX_TILE_ROWS, p->ith, p->nth, &a0, &a1);
    const pg_from_float_fn q8k = pg_get_type_traits(PG_TYPE_Q8_K)->from_float;
    for (int64_t a = a0; a < a1; a++) {
        const int64_t m0 = a * PG_AMX_TILE_ROWS;
        const int nrows = (int)(M - m0 < PG_AMX_TILE_ROWS ? M - m0 : PG_AMX_TILE_ROWS);
        pg_amx_pack_act(q8k, pg_ptr(x, 0, m0, 0, 0), (size_t)x->nb[1], K, nrows,
                        p->work + (size_t)a * tile_bytes, scratch);
    }
    pg_sync(p);
    int64_t n0, n1;
    split_units(N, PG_AMX_TILE_ROWS, p->ith, p->nth, &n0, &n1);
    if (n1 > n0)
        pg_get_type_traits(w->type)->amx_gemm(K, pg_ptr(w, 0, n0, 0, 0), (size_t)w->nb[1],
                                              n1 - n0, p->work, M, (float *)t->data + n0,
                                              (size_t)t->nb[1], scratch);
}

#else   /* the amx path exists on x86-64 only (gemm_amx.c): never taken, amx_gemm is NULL */
static size_t amx_tiles_bytes(const pg_tensor *x) { (void)x; return 0; }
static size_t amx_scratch_bytes(const pg_tensor *x) { (void)x; return 0; }
static void mul_mat_amx(const pg_cparams *p, pg_tensor *t, const pg_tensor *w,
                        const pg_tensor *x) { (void)p; (void)t; (void)w; (void)x; }
#endif

/* ---- the repacked 16-row tiles, shared with MUL_MAT_ID (gemm_tile.h) ----------------------- */

/* Whether some path has tiles for this weight type: work sizes cover the tile scratch on every
 * path, as for amx, so a graph planned on one path may run on another (tests switch paths). */
int pg_tile_type_possible(int32_t type) {
    for (int32_t path = 0; path < PG_PATH_COUNT; path++) {
        const pg_type_traits *tr = pg_get_type_traits_for_path(type, path);
        if (tr && tr->tile_pack) return 1;
    }
    return 0;
}

/* one thread's tile (K rounded up to whole super-blocks: a legacy type's tile of K / 32 blocks
 * is smaller than that) */
size_t pg_tile_scratch_bytes(int64_t K) { return (size_t)((K + 255) / 256) * PG_TILE_SB_BYTES; }

/* Where the tiles start to pay off for an expert of a MUL_MAT_ID (Zen 4; BENCHMARKS.md, "MoE
 * prompts through the tiles"): a tile costs its pack once per product, against ~0.18 us
 * (avx512) / 0.25 us (avx2) per activation row of its dots at K 2048, ~1.35x faster per row
 * than the gemm. The portable K-quant packs (gemm_tile.c, 4 bytes at a time) cost 3.9 (Q4_K)
 * to 6.5 us (Q5_K) in cache, the dots of 22-35 rows: from 32 rows. The packs by gathers cost
 * 1.7-2.4 us (2.1 us with the rows in L3): on avx512 from 12 rows (MXFP4 1.07x the gemm at 8
 * rows, Q4_K about even from 12 to 32, 1.1-1.6x from 48); avx2's K-quant gathers lost to the
 * gemm at 12-16 rows and won from 24. */
int64_t pg_tile_min_rows(const pg_type_traits *tr) {
    const pg_tile_pack_fn f = tr->tile_pack;
    if (f == pg_tile_pack_q2_K || f == pg_tile_pack_q3_K || f == pg_tile_pack_q4_K ||
        f == pg_tile_pack_q5_K || f == pg_tile_pack_q6_K)
        return PG_TILE_MIN_ROWS;
#if defined(__x86_64__)
    if (f == pg_tile_pack_q4_K_avx2 || f == pg_tile_pack_q5_K_avx2 || f == pg_tile_pack_q6_K_avx2)
        return 24;
#endif
    return PG_TILE_MIN_ROWS_FAST;
}

/* activation rows per tile_gemm call when the outputs are scattered: 4 KiB of results */
#define PG_TILE_SCATTER_ROWS 64

void pg_tile_product(const pg_type_traits *tr, int64_t K, const uint8_t *w, size_t wnb1,
                     int64_t n0, int64_t n1, const uint8_t *act, size_t rb, int64_t M,
                     float *dst, size_t bs, float *const *out_rows, void *tile) {
    const size_t row_bytes = (size_t)(K / tr->block_size) * (size_t)tr->type_size;
    for (int64_t n = n0; n < n1; n += PG_TILE_ROWS) {
        const int nr = (int)(n1 - n < PG_TILE_ROWS ? n1 - n : PG_TILE_ROWS);
        tr->tile_pack(K, w + (size_t)n * wnb1, wnb1, nr, tile);
        /* the next tile's weight rows towards the cache while this one's dots run: the pack
         * reads 16 rows side by side, more streams than the hardware prefetcher follows */
        for (int64_t r = n + PG_TILE_ROWS; r < n1 && r < n + 2 * PG_TILE_ROWS; r++)
            for (size_t o = 0; o < row_bytes; o += 64)
                __builtin_prefetch(w + (size_t)r * wnb1 + o, 0, 2);
        if (!out_rows) {
            tr->tile_gemm(K, tile, act, rb, M, dst + n, bs, nr);
            continue;
        }
        float tmp[PG_TILE_SCATTER_ROWS][PG_TILE_ROWS];
        for (int64_t m = 0; m < M; m += PG_TILE_SCATTER_ROWS) {
            const int64_t mc = M - m < PG_TILE_SCATTER_ROWS ? M - m : PG_TILE_SCATTER_ROWS;
            tr->tile_gemm(K, tile, act + (size_t)m * rb, rb, mc, &tmp[0][0], sizeof(tmp[0]), nr);
            for (int64_t j = 0; j < mc; j++)
                memcpy(out_rows[m + j] + n, tmp[j], (size_t)nr * sizeof(float));
        }
    }
}

/* MUL_MAT takes the tiles from PG_TILE_MIN_ROWS activation rows on (gemm_tile.h) */
static int tile_shape(const pg_tensor *w, const pg_tensor *x) {
    return x->ne[1] >= PG_TILE_MIN_ROWS && x->ne[2] == 1 && x->ne[3] == 1 && w->ne[2] == 1 &&
           w->ne[3] == 1 && x->type == PG_TYPE_F32;
}

static int tile_possible(const pg_tensor *w, const pg_tensor *x) {
    return tile_shape(w, x) && pg_tile_type_possible(w->type);
}

static size_t tile_offset(size_t act) { return (act + 63) / 64 * 64; }

size_t pg_mul_mat_work_size(const pg_tensor *all, const pg_tensor *t, int nth) {
    size_t rb;
    const pg_tensor *x = PG_SRC(all, t, 1);
    const size_t bytes = act_bytes(PG_SRC(all, t, 0), x, &rb);
    size_t plain = private_act(x) ? (bytes + 63) / 64 * 64 * (size_t)nth : bytes;
    if (tile_possible(PG_SRC(all, t, 0), x))
        plain = tile_offset(bytes) + pg_tile_scratch_bytes(x->ne[0]) * (size_t)nth;
    if (!amx_possible(PG_SRC(all, t, 0), x)) return plain;
    const size_t amx = amx_tiles_bytes(x) + amx_scratch_bytes(x) * (size_t)nth;
    return amx > plain ? amx : plain;
}

/* Activation rows per outer block: about PG_MM_GEMM_ACT_BYTES of converted rows, which every
 * block of weight rows then reuses from cache (L2-sized: with 128 KiB, pp512 of a 4096 × 4096
 * Q6_K matrix ran 25% slower on the 2-core benchmark machine, 384 KiB was no faster). */
#define PG_MM_GEMM_ACT_BYTES (256u << 10)

static void mul_mat_gemm(const pg_cparams *p, pg_tensor *t, const pg_tensor *w,
                         const pg_tensor *x, pg_gemm_fn gemm, const uint8_t *act,
                         size_t ystride) {
    const int64_t K = w->ne[0], N = w->ne[1];
    const int64_t M = x->ne[1], B2 = x->ne[2], B3 = x->ne[3];
    const int64_t r2 = B2 / w->ne[2], r3 = B3 / w->ne[3];
    const int64_t MM = M * B2 * B3;
    int64_t n0 = 0, n1 = N, m0 = 0, m1 = MM;
    if (N >= MM) split_units(N, PG_GEMM_MAX_NR, p->ith, p->nth, &n0, &n1);
    else split_units(MM, PG_GEMM_MAX_NC, p->ith, p->nth, &m0, &m1);
    int64_t mblk = (int64_t)(PG_MM_GEMM_ACT_BYTES / (ystride ? ystride : 1));
    mblk = mblk < PG_GEMM_MAX_NC ? PG_GEMM_MAX_NC : mblk - mblk % PG_GEMM_MAX_NC;

    for (int64_t mb = m0; mb < m1; mb += mblk) {
        const int64_t mbe = mb + mblk < m1 ? mb + mblk : m1;
        for (int64_t n = n0; n < n1; n += PG_GEMM_MAX_NR) {
            const int nr = (int)(n1 - n < PG_GEMM_MAX_NR ? n1 - n : PG_GEMM_MAX_NR);
            int64_t nc;
            for (int64_t m = mb; m < mbe; m += nc) {
                const int64_t i1 = m % M, i2 = (m / M) % B2, i3 = m / (M * B2);
                nc = mbe - m < M - i1 ? mbe - m : M - i1;   /* stay inside one (i2, i3) plane */
                if (nc > PG_GEMM_MAX_NC) nc = PG_GEMM_MAX_NC;
                const void *xr = act ? (const void *)(act + (size_t)m * ystride)
                                     : (const void *)pg_ptr(x, 0, i1, i2, i3);
                const uint8_t *wr = pg_ptr(w, 0, 0, i2 / r2, i3 / r3) + n * w->nb[1];
                float *dst = pg_ptr(t, 0, i1, i2, i3);
                gemm(K, &dst[n], (size_t)t->nb[1], wr, (size_t)w->nb[1], xr, ystride, nr, (int)nc);
            }
        }
    }
}

/* decode and a few tokens: each thread its weight rows (columns of the output), vec_dot8 */
static int dot8_path(const pg_type_traits *tr, const pg_tensor *x) {
    return x->ne[2] == 1 && x->ne[3] == 1 && tr->vec_dot8 && x->ne[1] <= tr->vec_dot8_rows;
}

void pg_mul_mat_cols(int64_t N, int ith, int nth, int64_t *n0, int64_t *n1) {
    split_units(N, 8, ith, nth, n0, n1);
}

void pg_mul_mat_schedule_info(const pg_tensor *all, const pg_tensor *t, int *cols,
                              int64_t *work_stride) {
    const pg_tensor *w = PG_SRC(all, t, 0), *x = PG_SRC(all, t, 1);
    const pg_type_traits *tr = pg_get_type_traits(w->type);
    size_t rb;
    const size_t bytes = act_bytes(w, x, &rb);
    *cols = !use_amx(w, x) && dot8_path(tr, x);
    if (use_amx(w, x)) *work_stride = -1;
    else if (bytes == 0) *work_stride = 0;
    else *work_stride = private_act(x) ? (int64_t)((bytes + 63) / 64 * 64) : -1;
}

void pg_fwd_mul_mat(const pg_cparams *p, pg_tensor *all, pg_tensor *t) {
    const pg_tensor *w = PG_SRC(all, t, 0), *x = PG_SRC(all, t, 1);
    const pg_type_traits *tr = pg_get_type_traits(w->type);
    const int32_t vdt = tr->vec_dot_type;
    const int64_t K = w->ne[0], N = w->ne[1];
    const int64_t M = x->ne[1], B2 = x->ne[2], B3 = x->ne[3];
    const int64_t r2 = B2 / w->ne[2], r3 = B3 / w->ne[3];
    size_t rb;
    if (use_amx(w, x)) {
        mul_mat_amx(p, t, w, x);
        return;
    }
    const int convert = act_bytes(w, x, &rb) != 0;

    uint8_t *act = p->work;   /* the converted activation rows */
    if (convert) {
        const pg_type_traits *tv = pg_get_type_traits(vdt);
        const int priv = private_act(x);
        int64_t a0 = 0, a1 = pg_nrows(x);
        if (priv) act += (rb * (size_t)a1 + 63) / 64 * 64 * (size_t)p->ith;
        else pg_split(pg_nrows(x), p->ith, p->nth, &a0, &a1);
        for (int64_t r = a0; r < a1; r++) {
            const int64_t i1 = r % M, i2 = (r / M) % B2, i3 = r / (M * B2);
            tv->from_float(pg_ptr(x, 0, i1, i2, i3), act + (size_t)r * rb, K);
        }
        if (!priv) pg_sync(p);
    }

    /* decode and a few tokens (speculative verification, a few server streams): each thread
     * its weight rows, each weight row read once for all activation rows (vec_dot8) */
    const int64_t MM = M * B2 * B3;
    if (dot8_path(tr, x)) {
        int64_t n0, n1;
        pg_mul_mat_cols(N, p->ith, p->nth, &n0, &n1);
        const void *xr = convert ? (const void *)act : (const void *)x->data;
        pg_dot_rows(tr, K, (float *)t->data, (size_t)t->nb[1], (const uint8_t *)w->data,
                    (size_t)w->nb[1], n0, n1, xr, convert ? rb : (size_t)x->nb[1], (int)M);
        /* the fused element-wise node on this thread's columns, while they are in L1 and
         * without a barrier: no other thread reads or writes them (graph.c) */
        if (p->epi && n1 > n0) pg_fwd_epilogue(all, t, p->epi, n0, n1);
        return;
    }
    /* many activation rows: each thread its weight rows, 16 at a time repacked into a tile
     * that serves every activation row */
    if (tr->tile_pack && convert && tile_shape(w, x)) {
        int64_t n0, n1;
        split_units(N, PG_TILE_ROWS, p->ith, p->nth, &n0, &n1);
        uint8_t *tile =
            p->work + tile_offset(rb * (size_t)M) + pg_tile_scratch_bytes(K) * (size_t)p->ith;
        pg_tile_product(tr, K, (const uint8_t *)w->data, (size_t)w->nb[1], n0, n1, act, rb, M,
                        (float *)t->data, (size_t)t->nb[1], NULL, tile);
        return;
    }
    /* split the larger output dimension: weight rows (N) or activation rows (M*B2*B3) */
    if (M > 1 && tr->gemm) {
        const size_t ystride = convert ? rb : (size_t)x->nb[1];
        mul_mat_gemm(p, t, w, x, tr->gemm, convert ? act : NULL, ystride);
        return;
    }
    const int split_n = N >= MM;
    int64_t n0 = 0, n1 = N, m0 = 0, m1 = MM;
    if (split_n) pg_split(N, p->ith, p->nth, &n0, &n1);
    else pg_split(MM, p->ith, p->nth, &m0, &m1);

    for (int64_t mt = m0; mt < m1; mt += PG_MM_TILE_M) {
        const int64_t mt1 = mt + PG_MM_TILE_M < m1 ? mt + PG_MM_TILE_M : m1;
        for (int64_t nt = n0; nt < n1; nt += PG_MM_TILE_N) {
            const int64_t nt1 = nt + PG_MM_TILE_N < n1 ? nt + PG_MM_TILE_N : n1;
            for (int64_t m = mt; m < mt1; m++) {
                const int64_t i1 = m % M, i2 = (m / M) % B2, i3 = m / (M * B2);
                const void *xr = convert ? (const void *)(act + (size_t)m * rb)
                                         : (const void *)pg_ptr(x, 0, i1, i2, i3);
                const uint8_t *wplane = pg_ptr(w, 0, 0, i2 / r2, i3 / r3);
                float *dst = pg_ptr(t, 0, i1, i2, i3);
                pg_dot_rows(tr, K, dst, 0, wplane, (size_t)w->nb[1], nt, nt1, xr, 0, 1);
            }
        }
    }
}
