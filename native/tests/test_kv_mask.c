/* pg_kv_mask: a hand-worked case (two sequences, a window), the fp16 bit patterns, and the
 * arguments it refuses. */
#include "pg_test.h"
#include "pyggml.h"

PG_TEST(test_kv_mask_cases) {
    /* cells: pos 0,1,2 of seq 0; pos 0 of seq 1; an empty cell; pos 3 shared by seqs 0 and 1 */
    const int64_t cell_pos[6] = {0, 1, 2, 0, -1, 3};
    const uint64_t cell_seqs[6] = {1, 1, 1, 2, 0, 3};
    const int32_t pos[2] = {2, 3};
    const int64_t bits[2] = {0, 1};         /* token 0: seq 0 at pos 2; token 1: seq 1 at 3 */
    uint16_t out[2 * 8];
    const uint16_t Z = 0x0000, N = 0xFC00;  /* fp16 0 and -inf */
    const uint16_t want_full[12] = {Z, Z, Z, N, N, N,   N, N, N, Z, N, Z};
    const uint16_t want_win2[12] = {N, Z, Z, N, N, N,   N, N, N, N, N, Z};
    CHECK(pg_kv_mask(cell_pos, cell_seqs, 6, pos, bits, 2, 0, out, 6) == PG_OK, "no window");
    for (int i = 0; i < 12; i++) CHECK(out[i] == want_full[i], "no window, element %d", i);
    CHECK(pg_kv_mask(cell_pos, cell_seqs, 6, pos, bits, 2, 2, out, 6) == PG_OK, "window 2");
    for (int i = 0; i < 12; i++) CHECK(out[i] == want_win2[i], "window 2, element %d", i);
    /* a row stride beyond n_kv leaves the padding alone */
    for (int i = 0; i < 16; i++) out[i] = 0x1234;
    CHECK(pg_kv_mask(cell_pos, cell_seqs, 6, pos, bits, 2, 0, out, 8) == PG_OK, "stride 8");
    CHECK(out[6] == 0x1234 && out[7] == 0x1234 && out[8 + 3] == Z, "stride 8 rows");
    CHECK(pg_kv_mask(cell_pos, cell_seqs, 6, pos, bits, 2, 0, out, 5) == PG_ERR_INVALID_ARG,
          "row stride < n_kv");
    CHECK(pg_kv_mask(cell_pos, cell_seqs, 6, pos, bits, 2, -1, out, 6) == PG_ERR_INVALID_ARG,
          "negative window");
    CHECK(pg_kv_mask(NULL, cell_seqs, 6, pos, bits, 2, 0, out, 6) == PG_ERR_INVALID_ARG,
          "no cells");
    CHECK(pg_kv_mask(cell_pos, cell_seqs, 0, pos, bits, 2, 0, out, 0) == PG_OK, "n_kv 0");
    const int64_t bad_seq[2] = {0, 64};
    CHECK(pg_kv_mask(cell_pos, cell_seqs, 6, pos, bad_seq, 2, 0, out, 6) == PG_ERR_INVALID_ARG,
          "sequence id 64");
}
