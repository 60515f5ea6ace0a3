/* Memory-bandwidth probe for the benchmarks (pg_bench_read in pyggml.h): reads a buffer with
 * the loads of the current kernel path (64 bytes on avx512, 32 on avx2, else plain 16-byte
 * vectors; the widest measure the most on this machine), four independent accumulators, and
 * returns a checksum so the reads cannot be skipped. The checksum is the sum,
 * modulo 2^64, of the buffer's 8-byte little-endian words over the 64-byte-aligned middle plus
 * the bytes of the unaligned head and tail (tests check it). */
#include <stdint.h>
#include <string.h>

#include "pg_internal.h"

#if defined(__x86_64__)
#include <immintrin.h>

__attribute__((target("avx512f"))) static uint64_t sum_avx512(const void *p, size_t n64) {
    const __m512i *v = p;
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 4 <= n64; i += 4) {
        a0 = _mm512_add_epi64(a0, _mm512_load_si512(v + i));
        a1 = _mm512_add_epi64(a1, _mm512_load_si512(v + i + 1));
        a2 = _mm512_add_epi64(a2, _mm512_load_si512(v + i + 2));
        a3 = _mm512_add_epi64(a3, _mm512_load_si512(v + i + 3));
    }
    for (; i < n64; i++) a0 = _mm512_add_epi64(a0, _mm512_load_si512(v + i));
    a0 = _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3));
    uint64_t r[8], sum = 0;   /* unsigned sum: _mm512_reduce_add_epi64 adds as signed */
    memcpy(r, &a0, sizeof r);
    for (int k = 0; k < 8; k++) sum += r[k];
    return sum;
}

__attribute__((target("avx2"))) static uint64_t sum_avx2(const void *p, size_t n64) {
    const __m256i *v = p;
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 2 <= n64; i += 2) {   /* 128 bytes per step */
        a0 = _mm256_add_epi64(a0, _mm256_load_si256(v + 2 * i));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256(v + 2 * i + 1));
        a2 = _mm256_add_epi64(a2, _mm256_load_si256(v + 2 * i + 2));
        a3 = _mm256_add_epi64(a3, _mm256_load_si256(v + 2 * i + 3));
    }
    if (i < n64) {
        a0 = _mm256_add_epi64(a0, _mm256_load_si256(v + 2 * i));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256(v + 2 * i + 1));
    }
    const __m256i a = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    uint64_t r[4];
    memcpy(r, &a, sizeof r);
    return r[0] + r[1] + r[2] + r[3];
}
#endif

typedef uint64_t pg_u64x2 __attribute__((vector_size(16)));

static uint64_t sum_generic(const void *p, size_t n64) {
    const pg_u64x2 *v = p;
    pg_u64x2 a0 = {0, 0}, a1 = {0, 0}, a2 = {0, 0}, a3 = {0, 0};
    for (size_t i = 0; i < n64; i++) {
        a0 += v[4 * i];
        a1 += v[4 * i + 1];
        a2 += v[4 * i + 2];
        a3 += v[4 * i + 3];
    }
    const pg_u64x2 a = a0 + a1 + a2 + a3;
    return a[0] + a[1];
}

uint64_t pg_bench_read(const void *p, size_t nbytes) {
    if (!p) return 0;
    const unsigned char *c = p;
    uint64_t sum = 0;
    while (nbytes && ((uintptr_t)c & 63)) { sum += *c++; nbytes--; }
    const size_t n64 = nbytes / 64;
#if defined(__x86_64__)
    if (pg_g_cpu_path == PG_PATH_AVX512) sum += sum_avx512(c, n64);
    else if (pg_g_cpu_path == PG_PATH_AVX2) sum += sum_avx2(c, n64);
    else sum += sum_generic(c, n64);
#else
    sum += sum_generic(c, n64);
#endif
    for (size_t k = n64 * 64; k < nbytes; k++) sum += c[k];
    return sum;
}
