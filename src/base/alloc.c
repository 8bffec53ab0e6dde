/*
 * alloc.c — the allocator hook. All library memory goes through
 * base_alloc/base_realloc/base_free, which call the installed keel_alloc_fn
 * (told the old size, as Lua's lua_Alloc). The default is aligned_alloc;
 * on Linux it also asks for transparent huge pages on blocks of
 * BASE_HUGE_MIN bytes or more (the cache's rows, the scratch arenas).
 * Invariant: every block of >= 64 bytes is BASE_ALIGN aligned.
 */
#include "base.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __linux__
#include <sys/mman.h>
#endif

#define BASE_HUGE_MIN ((size_t)4 << 20)

/* Advice only: the pages of [p, p + size) that lie in whole 2 MiB pages
 * may be backed by transparent huge pages when the system allows them on
 * request (/sys/kernel/mm/transparent_hugepage/enabled = madvise, the
 * default of many distributions). Decode attention streams the cache's
 * rows once per token; with 4 KiB pages every 4 KiB of each K and V stream
 * costs a TLB miss and, under virtualization, a two-level page walk: on a
 * Zen 4 VM the AVX-512 decode kernel read rows from DRAM 12% faster with
 * huge pages (docs/kernel-passes-2.md, sixteenth pass). The memory is the same and
 * is touched by its owner as before, so what the caller counts does not
 * change; where the advice is refused (no THP, another OS) the block works
 * with small pages, so its result is not a status. */
static void advise_huge(void *p, size_t size)
{
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    uintptr_t b = ((uintptr_t)p + 4095) & ~(uintptr_t)4095, e = ((uintptr_t)p + size) & ~(uintptr_t)4095;
    if (e > b && madvise((void *)b, e - b, MADV_HUGEPAGE) != 0) {
        /* refused: small pages, same memory */
    }
#else
    (void)p;
    (void)size;
#endif
}

static void *default_alloc(void *user, void *ptr, size_t old_size, size_t new_size)
{
    (void)user;
    if (new_size == 0) {
        free(ptr);
        return NULL;
    }
    size_t rounded;
    if (!size_align_up(new_size, BASE_ALIGN, &rounded)) return NULL;
    void *p = aligned_alloc(BASE_ALIGN, rounded);
    if (!p) return NULL;
    if (rounded >= BASE_HUGE_MIN) advise_huge(p, rounded);
    if (ptr) {
        memcpy(p, ptr, old_size < new_size ? old_size : new_size);
        free(ptr);
    }
    return p;
}

static keel_alloc_fn g_alloc = default_alloc;
static void *g_alloc_user = NULL;

void keel_set_allocator(keel_alloc_fn fn, void *user)
{
    g_alloc = fn ? fn : default_alloc;
    g_alloc_user = fn ? user : NULL;
}

void *base_alloc(size_t size)
{
    if (size == 0) return NULL;
    return g_alloc(g_alloc_user, NULL, 0, size);
}

void *base_calloc(size_t n, size_t size)
{
    size_t total;
    if (!size_mul(n, size, &total) || total == 0) return NULL;
    void *p = base_alloc(total);
    if (p) memset(p, 0, total);
    return p;
}

void *base_realloc(void *ptr, size_t old_size, size_t new_size)
{
    if (!ptr) return base_alloc(new_size);
    if (new_size == 0) {
        g_alloc(g_alloc_user, ptr, old_size, 0);
        return NULL;
    }
    return g_alloc(g_alloc_user, ptr, old_size, new_size);
}

void base_free(void *ptr, size_t size)
{
    if (ptr) g_alloc(g_alloc_user, ptr, size, 0);
}

char *base_strdup(const char *s)
{
    if (!s) return NULL;
    size_t n = strlen(s) + 1;
    char *d = base_alloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

void base_strfree(char *s)
{
    if (s) base_free(s, strlen(s) + 1);
}
