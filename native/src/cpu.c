/* Runtime CPU feature detection and kernel-path selection. One build runs on any x86-64 (or any
 * aarch64) CPU: per-ISA kernels are compiled with their own flags and only called when the CPU
 * reports the features they need. */
#include <stdlib.h>
#include <string.h>

#include "pg_internal.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#define PG_X86 1
#elif defined(__aarch64__)
#include <sys/auxv.h>
#include <asm/hwcap.h>
#define PG_ARM64 1
#endif

uint32_t pg_g_cpu_features = 0;
int32_t  pg_g_cpu_path = PG_PATH_SCALAR;

#ifdef PG_X86
static uint64_t xgetbv0(void) {
    uint32_t eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((uint64_t)edx << 32) | eax;
}

static int amx_permitted(void) {
#if defined(__linux__) && defined(__x86_64__)
    const long arch_req_xcomp_perm = 0x1023, xfeature_xtiledata = 18;
    return syscall(SYS_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) == 0;
#else
    return 0;
#endif
}

static uint32_t detect_features(void) {
    uint32_t f = 0, a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    const int osxsave = (c >> 27) & 1;
    if (c & (1u << 0)) f |= PG_CPU_SSE3;
    /* AVX state (XMM|YMM) must be enabled by the OS, not just present in the CPU. */
    const uint64_t xcr0 = osxsave ? xgetbv0() : 0;
    const int os_avx = (xcr0 & 0x6) == 0x6;
    const int os_avx512 = (xcr0 & 0xe6) == 0xe6;
    if (os_avx && (c & (1u << 28))) f |= PG_CPU_AVX;
    if (os_avx && (c & (1u << 12))) f |= PG_CPU_FMA;
    if (os_avx && (c & (1u << 29))) f |= PG_CPU_F16C;
    if (__get_cpuid_max(0, NULL) >= 7) {
        __cpuid_count(7, 0, a, b, c, d);
        const uint32_t max_subleaf = a;
        if (os_avx && (b & (1u << 5))) f |= PG_CPU_AVX2;
        if (os_avx512) {
            if (b & (1u << 16)) f |= PG_CPU_AVX512F;
            if (b & (1u << 30)) f |= PG_CPU_AVX512BW;
            if (b & (1u << 31)) f |= PG_CPU_AVX512VL;
            if (c & (1u << 11)) f |= PG_CPU_AVX512VNNI;
        }
        /* AMX: the CPU has AMX-TILE (edx bit 24) and AMX-INT8 (bit 25), XCR0 enables the tile
         * state (bits 17, 18), and Linux lets this process use it (the tile data is 8 KiB of
         * per-thread state, granted on request: arch_prctl ARCH_REQ_XCOMP_PERM) */
        const int os_amx = (xcr0 & 0x60000) == 0x60000;
        if (os_avx512 && os_amx && (d & (1u << 24)) && (d & (1u << 25)) && amx_permitted())
            f |= PG_CPU_AMXINT8;
        /* AVX-VNNI (VEX-encoded VPDPBUSD / VPDPWSSD on ymm, without AVX-512): leaf 7 subleaf 1,
         * eax bit 4 (Alder Lake and later, Zen 5) */
        if (max_subleaf >= 1) {
            __cpuid_count(7, 1, a, b, c, d);
            if (os_avx && (a & (1u << 4))) f |= PG_CPU_AVXVNNI;
        }
    }
    return f;
}
#elif defined(PG_ARM64)
static uint32_t detect_features(void) {
    uint32_t f = PG_CPU_NEON;   /* Advanced SIMD is mandatory on AArch64 */
    const unsigned long hw = getauxval(AT_HWCAP);
#ifdef HWCAP_ASIMDDP
    if (hw & HWCAP_ASIMDDP) f |= PG_CPU_DOTPROD;
#endif
#ifdef HWCAP_ASIMDHP
    if (hw & HWCAP_ASIMDHP) f |= PG_CPU_FP16;
#endif
    (void)hw;
    return f;
}
#else
static uint32_t detect_features(void) { return 0; }
#endif

int32_t pg_path_compiled(int32_t path) {
    switch (path) {
    case PG_PATH_SCALAR: return 1;
#ifdef PG_X86
    case PG_PATH_AVX2:   return 1;
    case PG_PATH_AVX512: return 1;
#endif
#if defined(__x86_64__)
    case PG_PATH_AMX:    return 1;
#endif
#ifdef PG_ARM64
    case PG_PATH_NEON:   return 1;
#endif
    default: return 0;
    }
}

static int path_supported(int32_t path, uint32_t f) {
    if (!pg_path_compiled(path)) return 0;
    const uint32_t avx2 = PG_CPU_AVX2 | PG_CPU_FMA | PG_CPU_F16C;
    switch (path) {
    case PG_PATH_SCALAR: return 1;
    case PG_PATH_AVX2:   return (f & avx2) == avx2;
    case PG_PATH_AVX512: {
        const uint32_t need = avx2 | PG_CPU_AVX512F | PG_CPU_AVX512BW | PG_CPU_AVX512VL;
        return (f & need) == need;
    }
    case PG_PATH_AMX: {
        const uint32_t need = avx2 | PG_CPU_AVX512F | PG_CPU_AVX512BW | PG_CPU_AVX512VL |
                              PG_CPU_AVX512VNNI | PG_CPU_AMXINT8;
        return (f & need) == need;
    }
    case PG_PATH_NEON:   return (f & PG_CPU_NEON) != 0;
    default: return 0;
    }
}

static int32_t best_path(uint32_t f) {
    /* AVX-512 kernels are an extra beside AVX2, never required: prefer it only when present;
     * the same for the AMX tile gemms beside AVX-512. */
    if (path_supported(PG_PATH_AMX, f)) return PG_PATH_AMX;
    if (path_supported(PG_PATH_AVX512, f)) return PG_PATH_AVX512;
    if (path_supported(PG_PATH_AVX2, f)) return PG_PATH_AVX2;
    if (path_supported(PG_PATH_NEON, f)) return PG_PATH_NEON;
    return PG_PATH_SCALAR;
}

static int32_t path_from_name(const char *s) {
    if (!s) return -1;
    if (strcmp(s, "scalar") == 0) return PG_PATH_SCALAR;
    if (strcmp(s, "avx2") == 0) return PG_PATH_AVX2;
    if (strcmp(s, "avx512") == 0) return PG_PATH_AVX512;
    if (strcmp(s, "amx") == 0) return PG_PATH_AMX;
    if (strcmp(s, "neon") == 0) return PG_PATH_NEON;
    return -1;
}

__attribute__((constructor)) static void pg_cpu_init(void) {
    pg_g_cpu_features = detect_features();
    /* PYGGML_AVXVNNI=0: behave as a CPU without AVX-VNNI (the avx2 path's gemms then take their
     * maddubs + madd form, as on CPUs without it: tests and benchmarks compare both forms) */
    const char *vnni = getenv("PYGGML_AVXVNNI");
    if (vnni && strcmp(vnni, "0") == 0) pg_g_cpu_features &= ~(uint32_t)PG_CPU_AVXVNNI;
    int32_t path = best_path(pg_g_cpu_features);
    /* An unknown or unsupported name keeps the best path; Python reports the mismatch. */
    const int32_t forced = path_from_name(getenv("PYGGML_CPU_PATH"));
    if (forced >= 0 && path_supported(forced, pg_g_cpu_features)) path = forced;
    pg_g_cpu_path = path;
    pg_dispatch_select(path);
}

const char *pg_version(void) { return PG_VERSION_STRING; }
int32_t pg_abi_version(void) { return PG_ABI_VERSION; }
uint32_t pg_cpu_features(void) { return pg_g_cpu_features; }
int32_t pg_cpu_path(void) { return pg_g_cpu_path; }

int32_t pg_set_cpu_path(int32_t path) {
    if (!path_supported(path, pg_g_cpu_features)) return PG_ERR_UNSUPPORTED;
    pg_g_cpu_path = path;
    pg_dispatch_select(path);
    return PG_OK;
}

size_t pg_tensor_struct_size(void) { return sizeof(pg_tensor); }

int32_t pg_tensor_field_offsets(int64_t *offsets, int32_t n_max) {
    const int64_t all[] = {
        offsetof(pg_tensor, type), offsetof(pg_tensor, op), offsetof(pg_tensor, ne),
        offsetof(pg_tensor, nb), offsetof(pg_tensor, op_params), offsetof(pg_tensor, src),
        offsetof(pg_tensor, flags), offsetof(pg_tensor, pad_), offsetof(pg_tensor, data),
        offsetof(pg_tensor, name),
    };
    const int32_t n = (int32_t)(sizeof(all) / sizeof(all[0]));
    for (int32_t i = 0; offsets && i < n && i < n_max; i++) offsets[i] = all[i];
    return n;
}
