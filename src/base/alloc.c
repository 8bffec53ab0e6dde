/*
 * alloc.c — the allocator hook. All library memory goes through
 * base_alloc/base_realloc/base_free, which call the installed keel_alloc_fn
 * (told the old size, as Lua's lua_Alloc). The default is aligned_alloc.
 * Invariant: every block of >= 64 bytes is BASE_ALIGN aligned.
 */
#include "base.h"

#include <stdlib.h>
#include <string.h>

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
