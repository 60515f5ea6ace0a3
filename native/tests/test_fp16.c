/* fp16/bf16 conversions: exhaustive fp16 -> fp32 -> fp16 round trip, and RNE on midpoints. */
#include <math.h>

#include "fp16.h"
#include "pg_test.h"

PG_TEST(test_fp16_roundtrip_exhaustive) {
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        const float f = pg_fp16_to_fp32((pg_fp16)h);
        const pg_fp16 back = pg_fp32_to_fp16(f);
        const int is_nan = ((h >> 10) & 0x1f) == 0x1f && (h & 0x3ff);
        if (is_nan ? ((back & 0x7c00) != 0x7c00 || !(back & 0x3ff)) : back != h) bad++;
    }
    CHECK(bad == 0, "%d fp16 values did not round-trip", bad);
}

PG_TEST(test_fp16_rounding) {
    CHECK(pg_fp32_to_fp16(1.0f) == 0x3c00, "1.0");
    CHECK(pg_fp32_to_fp16(65504.0f) == 0x7bff, "max");
    CHECK(pg_fp32_to_fp16(65520.0f) == 0x7c00, "65520 rounds to inf");
    CHECK(pg_fp32_to_fp16(65519.0f) == 0x7bff, "65519 rounds to max");
    CHECK(pg_fp32_to_fp16(1.0f + 1.0f / 2048) == 0x3c00, "tie to even (down)");
    CHECK(pg_fp32_to_fp16(1.0f + 3.0f / 2048) == 0x3c02, "tie to even (up)");
    CHECK(pg_fp32_to_fp16(5.9604645e-08f) == 0x0001, "smallest subnormal");
    CHECK(pg_fp32_to_fp16(2.9802322e-08f) == 0x0000, "half of smallest subnormal ties to 0");
    CHECK(pg_fp32_to_fp16(-0.0f) == 0x8000, "-0");
    CHECK(pg_fp32_to_fp16(INFINITY) == 0x7c00, "inf");
    CHECK(pg_fp32_to_bf16(1.0f) == 0x3f80, "bf16 1.0");
    CHECK(pg_bf16_to_fp32(0x3f80) == 1.0f, "bf16 back");
    CHECK((pg_fp32_to_bf16(NAN) & 0x7fc0) == 0x7fc0, "bf16 nan stays nan");
}
