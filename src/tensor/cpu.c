/*
 * cpu.c — CPU feature detection (cpuid + xgetbv) and the process-wide SIMD
 * level every kernel dispatch (tensor and attention) follows.
 *
 * Levels: scalar (0), avx2 (1: AVX2, FMA, F16C and BMI2, the flags the
 * *_avx2.c files are compiled with, plus OS support for the YMM state) and
 * avx512 (2: the avx2 level plus AVX-512 F/BW/VL/VNNI and the ZMM state;
 * the attention kernels of attn_avx512.c, the AVX2 tensor kernels). The
 * level in force is min(requested, best the CPU has). The request starts
 * as KEEL_SIMD from the environment (scalar|avx2|avx512|auto, read once, at
 * the first feature query; an unknown value is ignored) or the best level,
 * and keel_set_simd / tensor_simd_force change it.
 * Invariant: tensor_simd_level_ is -1 (not yet known) or a level the CPU
 * and OS support.
 */
#include "tensor_impl.h"

#include <stdlib.h>
#include <strings.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define TENSOR_X86 1
#else
#define TENSOR_X86 0
#endif

_Atomic int tensor_simd_level_ = -1;
static _Atomic int g_simd_request = -1; /* -1: not yet read from the environment */
static _Atomic int g_simd_default = -1; /* the environment's request (or the best) */

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

tensor_simd tensor_simd_best(void)
{
    const tensor_cpu *c = tensor_cpu_features();
    if (!(c->avx2 && c->fma && c->f16c && c->bmi2)) return TENSOR_SIMD_SCALAR;
    if (c->avx512f && c->avx512bw && c->avx512vl && c->avx512vnni) return TENSOR_SIMD_AVX512;
    return TENSOR_SIMD_AVX2;
}

static const char *const g_simd_names[] = {"scalar", "avx2", "avx512"};

bool tensor_simd_from_name(const char *name, tensor_simd *out)
{
    if (!name) return false;
    for (int i = 0; i < 3; i++)
        if (strcasecmp(name, g_simd_names[i]) == 0) {
            *out = (tensor_simd)i;
            return true;
        }
    if (strcasecmp(name, "auto") == 0) {
        *out = tensor_simd_best();
        return true;
    }
    return false;
}

/* The request from KEEL_SIMD (once), else the best level. */
static int simd_default(void)
{
    int d = atomic_load(&g_simd_default);
    if (d >= 0) return d;
    tensor_simd want = tensor_simd_best();
    const char *env = getenv("KEEL_SIMD");
    tensor_simd e;
    if (env && env[0] && tensor_simd_from_name(env, &e)) want = e;
    int expected = -1;
    atomic_compare_exchange_strong(&g_simd_default, &expected, (int)want);
    return atomic_load(&g_simd_default);
}

int tensor_simd_init_(void)
{
    int req = atomic_load(&g_simd_request);
    if (req < 0) {
        int expected = -1;
        atomic_compare_exchange_strong(&g_simd_request, &expected, simd_default());
        req = atomic_load(&g_simd_request);
    }
    int best = (int)tensor_simd_best();
    int l = req < best ? req : best;
    atomic_store_explicit(&tensor_simd_level_, l, memory_order_relaxed);
    return l;
}

tensor_simd tensor_simd_level(void)
{
    int l = atomic_load_explicit(&tensor_simd_level_, memory_order_relaxed);
    if (BASE_UNLIKELY(l < 0)) l = tensor_simd_init_();
    return (tensor_simd)l;
}

tensor_simd tensor_simd_force(tensor_simd level)
{
    tensor_simd prev = tensor_simd_level();
    atomic_store(&g_simd_request, (int)level);
    tensor_simd_init_();
    return prev;
}

bool tensor_set_simd(bool enabled)
{
    bool prev = tensor_simd_level() != TENSOR_SIMD_SCALAR;
    tensor_simd_force(enabled ? (tensor_simd)simd_default() : TENSOR_SIMD_SCALAR);
    return prev;
}

bool tensor_simd_active(void)
{
    return tensor_use_avx2();
}

const char *tensor_simd_name(void)
{
    return g_simd_names[tensor_simd_level()];
}

keel_status keel_set_simd(const char *name)
{
    tensor_simd want = tensor_simd_best();
    if (name && name[0] && !tensor_simd_from_name(name, &want)) return KEEL_EINVAL;
    if (want > tensor_simd_best()) return KEEL_EUNSUPPORTED;
    tensor_simd_force(want);
    return KEEL_OK;
}

const char *keel_simd_name(void)
{
    return tensor_simd_name();
}
