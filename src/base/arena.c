/*
 * arena.c — bounded bump arenas. Invariant: used <= cap always; a take that
 * does not fit returns NULL and leaves the arena unchanged.
 */
#include "base.h"

keel_status base_arena_init(base_arena *a, size_t cap)
{
    a->data = NULL;
    a->cap = a->used = a->high = 0;
    if (cap == 0) return KEEL_OK;
    size_t rounded;
    if (!size_align_up(cap, BASE_ALIGN, &rounded)) return KEEL_EOVERFLOW;
    a->data = base_alloc(rounded);
    if (!a->data) return KEEL_ENOMEM;
    a->cap = rounded;
    return KEEL_OK;
}

void base_arena_free(base_arena *a)
{
    if (!a) return;
    base_free(a->data, a->cap);
    a->data = NULL;
    a->cap = a->used = a->high = 0;
}

void *base_arena_take(base_arena *a, size_t size, size_t align)
{
    if (align == 0) align = 1;
    if (align > BASE_ALIGN || (align & (align - 1))) return NULL;
    size_t start;
    if (!size_align_up(a->used, align, &start)) return NULL;
    size_t end;
    if (!size_add(start, size, &end) || end > a->cap) return NULL;
    a->used = end;
    if (end > a->high) a->high = end;
    return a->data + start;
}

void *base_arena_take_n(base_arena *a, size_t n, size_t elem)
{
    size_t bytes;
    if (!size_mul(n, elem, &bytes)) return NULL;
    return base_arena_take(a, bytes, BASE_ALIGN);
}
