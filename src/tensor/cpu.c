/*
 * cpu.c — CPU feature detection (cpuid + xgetbv) and the process-wide SIMD
 * switch. The AVX2 paths need AVX2, FMA, F16C and BMI2 (the flags the
 * *_avx2.c files are compiled with) and OS support for the YMM state.
 * Invariant: tensor_simd_level_ is -1 (not yet known), 0 (scalar) or 1
 * (AVX2), and is 1 only when the CPU and OS support every AVX2-path flag.
 */
#include "tensor_impl.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define TENSOR_X86 1
#else
#define TENSOR_X86 0
#endif

_Atomic int tensor_simd_level_ = -1;
static _Atomic int g_simd_enabled = 1;

static tensor_cpu g_cpu;
static _Atomic int g_cpu_ready;

#if TENSOR_X86
static uint64_t cpu_xgetbv0(void)
{
    uint32_t eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((uint64_t)edx << 32) | eax;
}
#endif

static void cpu_detect(tensor_cpu *c)
{
    memset(c, 0, sizeof *c);
#if TENSOR_X86
    unsigned a, b, cx, d;
    if (!__get_cpuid(1, &a, &b, &cx, &d)) return;
    bool osxsave = (cx >> 27) & 1, avx = (cx >> 28) & 1;
    bool fma = (cx >> 12) & 1, f16c = (cx >> 29) & 1;
    if (!osxsave || !avx) return;
    uint64_t xcr0 = cpu_xgetbv0();
    bool ymm_os = (xcr0 & 0x6) == 0x6;   /* SSE + AVX state */
    bool zmm_os = (xcr0 & 0xE6) == 0xE6; /* + opmask, ZMM_Hi256, Hi16_ZMM */
    if (!ymm_os) return;
    c->fma = fma;
    c->f16c = f16c;
    if (__get_cpuid_max(0, NULL) < 7) return;
    __cpuid_count(7, 0, a, b, cx, d);
    c->avx2 = (b >> 5) & 1;
    c->bmi2 = (b >> 8) & 1;
    if (zmm_os) {
        c->avx512f = (b >> 16) & 1;
        c->avx512bw = (b >> 30) & 1;
        c->avx512vl = (b >> 31) & 1;
        c->avx512vnni = (cx >> 11) & 1;
    }
    unsigned max_sub = a;
    if (max_sub >= 1) {
        __cpuid_count(7, 1, a, b, cx, d);
        c->avxvnni = (a >> 4) & 1;
    }
#endif
}

const tensor_cpu *tensor_cpu_features(void)
{
    if (!atomic_load_explicit(&g_cpu_ready, memory_order_acquire)) {
        tensor_cpu c;
        cpu_detect(&c);
        /* Racing first callers compute the same value; the copy is benign. */
        g_cpu = c;
        atomic_store_explicit(&g_cpu_ready, 1, memory_order_release);
    }
    return &g_cpu;
}

static bool cpu_has_avx2_path(void)
{
    const tensor_cpu *c = tensor_cpu_features();
    return c->avx2 && c->fma && c->f16c && c->bmi2;
}

int tensor_simd_init_(void)
{
    int l = atomic_load(&g_simd_enabled) && cpu_has_avx2_path() ? 1 : 0;
    atomic_store_explicit(&tensor_simd_level_, l, memory_order_relaxed);
    return l;
}

bool tensor_set_simd(bool enabled)
{
    bool prev = atomic_exchange(&g_simd_enabled, enabled ? 1 : 0) != 0;
    tensor_simd_init_();
    return prev;
}

bool tensor_simd_active(void)
{
    return tensor_use_avx2();
}

const char *tensor_simd_name(void)
{
    return tensor_use_avx2() ? "avx2+fma" : "scalar";
}
