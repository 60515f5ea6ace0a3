/* vec_dot8 of every compiled path against the scalar vec_dot, bit for bit: what the range-end
 * tests of the K-quant and i-quant kernels check after making their rows. */
#ifndef PG_TEST_DOT8_H
#define PG_TEST_DOT8_H
#include <string.h>

#include "pg_test.h"
#include "pyggml.h"
#include "quants.h"

/* Eight weight rows of `type` (wstride bytes apart) times 1..max_nc (<= PG_DOT8_MAX_NC)
 * activation rows (astride bytes apart): on every compiled path with a vec_dot8, each of its
 * dots has the scalar path's vec_dot bits. `what` names the case in a failure. Returns how many
 * (path, activation rows) pairs were checked. */
static inline int pg_test_dot8_paths(int32_t type, int64_t n, const void *w, size_t wstride,
                                     const void *a, size_t astride, int max_nc,
                                     const char *what) {
    const pg_type_traits *ts = pg_get_type_traits_for_path(type, PG_PATH_SCALAR);
    int tested = 0;
    for (int32_t p = 0; p < PG_PATH_COUNT; p++) {
        if (!pg_path_compiled(p)) continue;
        const pg_type_traits *tp = pg_get_type_traits_for_path(type, p);
        if (!tp->vec_dot8) continue;
        for (int nc = 1; nc <= max_nc; nc++) {
            float got[PG_DOT8_MAX_NC][8], want[PG_DOT8_MAX_NC][8];
            tp->vec_dot8(n, &got[0][0], sizeof(got[0]), w, wstride, a, astride, nc);
            int same = 1;
            for (int j = 0; j < nc; j++)
                for (int i = 0; i < 8; i++) {
                    ts->vec_dot(n, &want[j][i], (const char *)w + (size_t)i * wstride,
                                (const char *)a + (size_t)j * astride);
                    same &= memcmp(&got[j][i], &want[j][i], 4) == 0;
                }
            CHECK(same, "%s, path %d, %d activation rows at the range ends: vec_dot8 differs "
                  "from the scalar vec_dot", what, p, nc);
            tested++;
        }
    }
    return tested;
}

#endif
