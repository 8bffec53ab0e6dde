/*
 * session_fmt.h — what saving and loading a session (session.c, session_load.c)
 * both need: the blob's constants and section tags, a column as the blob
 * describes it, the bounds-checked byte reader and the unaligned field reads.
 * Private to src/memory; the format is in docs/formats.md, "Sessions".
 */
#ifndef KEEL_SESSION_FMT_H
#define KEEL_SESSION_FMT_H

#include "memory.h"

#include <string.h>

#define SESS_MAGIC "KEELSESS"
#define SESS_VERSION 2u /* 2: the indexer column's descriptor in DESC */
#define SESS_HEADER_BYTES 48u

enum { SEC_DESC = 1, SEC_TOKENS = 2, SEC_SEQ = 3, SEC_GROUP = 4, SEC_RSTATE = 5, SEC_CKPT = 6 };

/* A column as the session stored it (DESC), and what reading it takes. */
typedef struct sess_col {
    keel_dtype dtype;
    int32_t head_dim, n_heads;
    size_t row_bytes;      /* per head */
    bool rot;
    int32_t rot_block;
    uint64_t rot_seed;
    bool same;             /* stored exactly as this memory stores it: rows copied */
} sess_col;

/* ---- byte reader: every take is checked against what remains (rule 10) ---- */

typedef struct rd {
    const uint8_t *p, *end;
    bool bad;
} rd;

static inline const uint8_t *take(rd *r, size_t n)
{
    if (r->bad || n > (size_t)(r->end - r->p)) {
        r->bad = true;
        return NULL;
    }
    const uint8_t *q = r->p;
    r->p += n;
    return q;
}

static inline uint32_t get_u32(rd *r)
{
    const uint8_t *b = take(r, 4);
    return b ? (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24 : 0;
}

static inline int32_t get_i32(rd *r)
{
    return (int32_t)get_u32(r);
}

static inline uint64_t get_u64(rd *r)
{
    uint64_t lo = get_u32(r);
    return lo | (uint64_t)get_u32(r) << 32;
}

static inline void skip(rd *r, size_t n)
{
    if (!take(r, n)) r->bad = true;
}

static inline float get_f32(rd *r)
{
    uint32_t u = get_u32(r);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Memories whose sessions carry RSTATE and CKPT: recurrent states, or
 * checkpoints (an attention memory's hold ring rows only). */
static inline bool rs_sections(const keel_mem *m)
{
    return m->n_rs_layers > 0 || m->n_ckpt > 0;
}

static inline int32_t rd_i32_at(const uint8_t *p)
{
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline uint64_t rd_u64_at(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

#endif
