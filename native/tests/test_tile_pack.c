/* The vectorized K-quant tile packs (gemm_tile_pack_avx512.c, gemm_tile_pack_avx2.c) write the
 * portable pack's tile (gemm_tile.c) byte for byte: Q4_K, Q5_K, Q6_K, 1..16 rows (rows past nr repeat row 0), 1 and
 * 3 super-blocks, padded row strides, random bytes with finite fp16 scales. The last row ends
 * at a guard page: no pack reads past the weights (Q6_K's block of 210 bytes ends 2 bytes into
 * the dword that holds its d). Each on a CPU that runs its path. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fp16.h"
#include "gemm_tile.h"
#include "kquants.h"
#include "pg_test.h"
#include "pyggml.h"
#include "quants.h"

#if defined(__x86_64__)
static uint64_t g_rng = 0x452821E638D01377ull;

static void set_h(uint8_t *p, float v) { const pg_fp16 h = pg_fp32_to_fp16(v); memcpy(p, &h, 2); }

static int runs(int32_t path) {
    if (!pg_path_compiled(path)) return 0;
    const int32_t cur = pg_cpu_path();
    const int ok = pg_set_cpu_path(path) == PG_OK;   /* this CPU has the path's ISA */
    pg_set_cpu_path(cur);
    return ok;
}

static void check_packs(int32_t path) {
    if (!runs(path)) return;
    const int v5 = path == PG_PATH_AVX512;
    const struct {
        int32_t type;
        size_t bsize;
        int d_off, m_off;   /* the fp16 fields (-1: none) */
        pg_tile_pack_fn ref, fast;
    } k[] = {
        {PG_TYPE_Q4_K, 144, 0, 2, pg_tile_pack_q4_K,
         v5 ? pg_tile_pack_q4_K_avx512 : pg_tile_pack_q4_K_avx2},
        {PG_TYPE_Q5_K, 176, 0, 2, pg_tile_pack_q5_K,
         v5 ? pg_tile_pack_q5_K_avx512 : pg_tile_pack_q5_K_avx2},
        {PG_TYPE_Q6_K, 210, 208, -1, pg_tile_pack_q6_K,
         v5 ? pg_tile_pack_q6_K_avx512 : pg_tile_pack_q6_K_avx2},
    };
    const long page = sysconf(_SC_PAGESIZE);
    const size_t span = 16 * (3 * 210 + 7) + (size_t)page;   /* 16 padded rows of 3 blocks */
    const size_t len = (span + (size_t)page - 1) / (size_t)page * (size_t)page;
    uint8_t *map = mmap(NULL, len + (size_t)page, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(map != MAP_FAILED, "mmap");
    CHECK(mprotect(map + len, (size_t)page, PROT_NONE) == 0, "guard page");
    uint8_t *t1 = aligned_alloc(64, 3 * PG_TILE_SB_BYTES), *t2 = aligned_alloc(64, 3 * PG_TILE_SB_BYTES);
    for (int it = 0; it < 3; it++)
        for (int nb = 1; nb <= 3; nb += 2)
            for (int pad = 0; pad <= 7; pad += 7)
                for (int nr = 1; nr <= 16; nr++) {
                    const size_t bx = (size_t)nb * k[it].bsize + (size_t)pad;
                    /* the rows end where the guard page starts */
                    uint8_t *x = map + len - ((size_t)(nr - 1) * bx + (size_t)nb * k[it].bsize);
                    for (int r = 0; r < nr; r++)
                        for (int b = 0; b < nb; b++) {
                            uint8_t *blk = x + (size_t)r * bx + (size_t)b * k[it].bsize;
                            for (size_t i = 0; i < k[it].bsize; i++)
                                blk[i] = (uint8_t)pg_test_splitmix(&g_rng);
                            set_h(blk + k[it].d_off, pg_test_unit(pg_test_splitmix(&g_rng)));
                            if (k[it].m_off >= 0)
                                set_h(blk + k[it].m_off, pg_test_unit(pg_test_splitmix(&g_rng)));
                        }
                    memset(t1, 0x5A, 3 * PG_TILE_SB_BYTES);
                    memset(t2, 0xA5, 3 * PG_TILE_SB_BYTES);
                    k[it].ref(nb * PG_QK_K, x, bx, nr, t1);
                    k[it].fast(nb * PG_QK_K, x, bx, nr, t2);
                    CHECK(memcmp(t1, t2, (size_t)nb * PG_TILE_SB_BYTES) == 0,
                          "path %d type %d, %d rows of %d blocks, stride %zu: the tiles differ",
                          (int)path, (int)k[it].type, nr, nb, bx);
                }
    munmap(map, len + (size_t)page);
    free(t1);
    free(t2);
}

PG_TEST(test_tile_pack_vectorized_equals_portable) {
    check_packs(PG_PATH_AVX2);
    check_packs(PG_PATH_AVX512);
}
#endif
