/*
 * gguf.c — the GGUF reader. Owns: the mapping (or an owned buffer), the
 * key and tensor tables, one pool of NUL-terminated key/tensor names, one
 * pool of string-array element offsets, and two hash indexes.
 *
 * Parsing runs twice over the header: pass 1 checks every count, length,
 * type and offset against the bytes that remain (design.md rule 10) and
 * counts what must be stored; only then are the tables allocated, with sizes
 * bounded by the file size, and pass 2 fills them (and rejects duplicates).
 * A malformed file therefore fails before any allocation. Recursion is
 * bounded by GGUF_MAX_ARRAY_DEPTH, never by input size.
 *
 * Invariants after open: every gguf_value/gguf_tensor view lies inside
 * [base, base + size); the alignment is a power of two >= 8 and tensor data
 * is aligned to it relative to the file start (so also in memory when the
 * file is mapped; gguf_open_buffer callers may pass any address, and the
 * kernels accept any); tensor data lies in tensor-info order, each tensor
 * at the previous one's padded end, and its byte size is what its dtype
 * and shape imply; keys and tensor names are unique.
 */
#include "gguf.h"

#include "../tensor/tensor.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

enum { OWN_NONE = 0, OWN_MMAP = 1, OWN_ALLOC = 2 };

typedef struct gguf_kv {
    const char *key; /* NUL-terminated, in names pool */
    size_t key_len;
    gguf_value v;
} gguf_kv;

struct gguf {
    const uint8_t *base; /* [size] file bytes */
    size_t size;
    int own; /* OWN_*: how base is released */
    uint32_t version;
    uint32_t alignment;
    size_t data_offset;
    int64_t n_kv;
    gguf_kv *kv; /* [n_kv] */
    int64_t n_tensors;
    gguf_tensor *tensors; /* [n_tensors] */
    char *names;          /* [names_bytes] NUL-terminated keys then names */
    size_t names_bytes;
    uint64_t *offs; /* [n_offs] string-array element offsets */
    size_t n_offs;
    uint32_t *kv_index;  /* [kv_index_cap] key index + 1, 0 = empty */
    size_t kv_index_cap; /* power of two */
    uint32_t *t_index;   /* [t_index_cap] tensor index + 1, 0 = empty */
    size_t t_index_cap;
};

/* ---- type table --------------------------------------------------------- */

static const char *const g_type_names[GGUF_TYPE_COUNT_] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
};
static const uint8_t g_type_sizes[GGUF_TYPE_COUNT_] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

const char *gguf_type_name(gguf_type t)
{
    return (unsigned)t < GGUF_TYPE_COUNT_ ? g_type_names[t] : "?";
}

size_t gguf_type_size(gguf_type t)
{
    return (unsigned)t < GGUF_TYPE_COUNT_ ? g_type_sizes[t] : 0;
}

static bool type_is_int(gguf_type t)
{
    switch (t) {
    case GGUF_TYPE_UINT8:
    case GGUF_TYPE_INT8:
    case GGUF_TYPE_UINT16:
    case GGUF_TYPE_INT16:
    case GGUF_TYPE_UINT32:
    case GGUF_TYPE_INT32:
    case GGUF_TYPE_UINT64:
    case GGUF_TYPE_INT64:
    case GGUF_TYPE_BOOL:
        return true;
    default:
        return false;
    }
}

/* Scalar at p of type t as int64; false if it is not an integer or does
 * not fit. */
static keel_status read_int(gguf_type t, const uint8_t *p, int64_t *out)
{
    switch (t) {
    case GGUF_TYPE_UINT8:
    case GGUF_TYPE_BOOL:
        *out = p[0];
        return KEEL_OK;
    case GGUF_TYPE_INT8:
        *out = (int8_t)p[0];
        return KEEL_OK;
    case GGUF_TYPE_UINT16: {
        uint16_t v;
        memcpy(&v, p, 2);
        *out = v;
        return KEEL_OK;
    }
    case GGUF_TYPE_INT16: {
        int16_t v;
        memcpy(&v, p, 2);
        *out = v;
        return KEEL_OK;
    }
    case GGUF_TYPE_UINT32: {
        uint32_t v;
        memcpy(&v, p, 4);
        *out = v;
        return KEEL_OK;
    }
    case GGUF_TYPE_INT32: {
        int32_t v;
        memcpy(&v, p, 4);
        *out = v;
        return KEEL_OK;
    }
    case GGUF_TYPE_UINT64: {
        uint64_t v;
        memcpy(&v, p, 8);
        if (v > (uint64_t)INT64_MAX) return KEEL_ERANGE;
        *out = (int64_t)v;
        return KEEL_OK;
    }
    case GGUF_TYPE_INT64:
        memcpy(out, p, 8);
        return KEEL_OK;
    default:
        return KEEL_EFORMAT;
    }
}

static keel_status read_float(gguf_type t, const uint8_t *p, double *out)
{
    if (t == GGUF_TYPE_FLOAT32) {
        float v;
        memcpy(&v, p, 4);
        *out = v;
        return KEEL_OK;
    }
    if (t == GGUF_TYPE_FLOAT64) {
        memcpy(out, p, 8);
        return KEEL_OK;
    }
    return KEEL_EFORMAT;
}

/* ---- parsing ------------------------------------------------------------ */

/* A printable copy of an untrusted name for error messages (at most 64
 * bytes, non-printable bytes as '?'). */
static const char *safe_name(const uint8_t *s, size_t n, char buf[80])
{
    size_t m = n < 64 ? n : 64, j = 0;
    for (size_t i = 0; i < m; i++)
        buf[j++] = (s[i] >= 0x20 && s[i] < 0x7f) ? (char)s[i] : '?';
    if (n > m) {
        memcpy(buf + j, "...", 3);
        j += 3;
    }
    buf[j] = '\0';
    return buf;
}

typedef struct parser {
    gguf *g;
    const uint8_t *p;   /* cursor */
    const uint8_t *end; /* base + size */
    bool fill;          /* pass 2: store into g's tables */
    char *err;
    size_t names_used; /* pool bytes counted (pass 1) or written (pass 2) */
    size_t offs_used;  /* string-array offsets counted / written */
    uint32_t alignment;
    char what[96]; /* context for messages: "key general.name" */
} parser;

static size_t left(const parser *c)
{
    return (size_t)(c->end - c->p);
}

static keel_status need(parser *c, size_t n, const char *field)
{
    if (left(c) >= n) return KEEL_OK;
    return base_err(c->err, KEEL_EFORMAT, "%s: %s needs %zu bytes, %zu left in file (%zu)", c->what,
                    field, n, left(c), c->g->size);
}

static keel_status get_u32(parser *c, uint32_t *v, const char *field)
{
    keel_status st = need(c, 4, field);
    if (st) return st;
    memcpy(v, c->p, 4);
    c->p += 4;
    return KEEL_OK;
}

static keel_status get_u64(parser *c, uint64_t *v, const char *field)
{
    keel_status st = need(c, 8, field);
    if (st) return st;
    memcpy(v, c->p, 8);
    c->p += 8;
    return KEEL_OK;
}

/* A string: u64 length then bytes, length checked against what remains. */
static keel_status get_str(parser *c, const uint8_t **s, uint64_t *n, const char *field)
{
    keel_status st = get_u64(c, n, field);
    if (st) return st;
    if (*n > left(c))
        return base_err(c->err, KEEL_EFORMAT,
                        "%s: %s length %" PRIu64 " past end of file (%zu bytes left)", c->what,
                        field, *n, left(c));
    *s = c->p;
    c->p += *n;
    return KEEL_OK;
}

/*
 * One value of type t (the type id already read). depth counts array
 * nesting; record_offs asks for string-array element offsets (top-level
 * arrays). Fills *v in pass 2 when v is not NULL.
 */
static keel_status parse_value(parser *c, gguf_type t, int depth, bool record_offs, gguf_value *v)
{
    keel_status st;
    gguf_value tmp = {.type = t, .arr_type = GGUF_TYPE_COUNT_, .n = 1};
    if ((unsigned)t >= GGUF_TYPE_COUNT_)
        return base_err(c->err, KEEL_EFORMAT, "%s: unknown value type %u", c->what, (unsigned)t);
    if (t == GGUF_TYPE_STRING) {
        const uint8_t *s;
        uint64_t n;
        if ((st = get_str(c, &s, &n, "string"))) return st;
        tmp.data = s;
        tmp.n = n;
        tmp.nbytes = (size_t)n;
    } else if (t == GGUF_TYPE_ARRAY) {
        uint32_t et;
        uint64_t n;
        if ((st = get_u32(c, &et, "array type"))) return st;
        if ((st = get_u64(c, &n, "array count"))) return st;
        if (et >= GGUF_TYPE_COUNT_)
            return base_err(c->err, KEEL_EFORMAT, "%s: unknown array element type %u", c->what, et);
        if (et == GGUF_TYPE_ARRAY && depth + 1 >= GGUF_MAX_ARRAY_DEPTH)
            return base_err(c->err, KEEL_EFORMAT, "%s: arrays nested deeper than %d", c->what,
                            GGUF_MAX_ARRAY_DEPTH);
        tmp.arr_type = (gguf_type)et;
        tmp.n = n;
        tmp.data = c->p;
        size_t esize = gguf_type_size((gguf_type)et);
        /* the smallest encoding of one element bounds the count */
        size_t emin = esize ? esize : (et == GGUF_TYPE_STRING ? 8 : 12);
        if (n > left(c) / emin)
            return base_err(c->err, KEEL_EFORMAT,
                            "%s: array of %" PRIu64 " %s needs at least %" PRIu64
                            " bytes, %zu left in file",
                            c->what, n, gguf_type_name((gguf_type)et),
                            n > UINT64_MAX / emin ? UINT64_MAX : n * emin, left(c));
        if (esize) {
            c->p += (size_t)n * esize;
        } else if (et == GGUF_TYPE_STRING) {
            uint64_t *offs = NULL;
            if (record_offs && n) {
                if (c->fill) offs = c->g->offs + c->offs_used;
                c->offs_used += (size_t)n;
            }
            for (uint64_t i = 0; i < n; i++) {
                const uint8_t *s;
                uint64_t len;
                if (offs) offs[i] = (uint64_t)(c->p - tmp.data);
                if ((st = get_str(c, &s, &len, "array string"))) return st;
            }
            tmp.offs = offs;
        } else {
            /* each element is an array payload (u32 type, u64 n, items) */
            for (uint64_t i = 0; i < n; i++)
                if ((st = parse_value(c, GGUF_TYPE_ARRAY, depth + 1, false, NULL))) return st;
        }
        tmp.nbytes = (size_t)(c->p - tmp.data);
    } else {
        size_t sz = gguf_type_size(t);
        if ((st = need(c, sz, gguf_type_name(t)))) return st;
        tmp.data = c->p;
        tmp.nbytes = sz;
        c->p += sz;
    }
    if (v) *v = tmp;
    return KEEL_OK;
}

static bool str_has_nul(const uint8_t *s, size_t n)
{
    return memchr(s, 0, n) != NULL;
}

static uint64_t name_hash(const char *s, size_t n)
{
    return base_hash64(s, n, 0x6767756675ull);
}

/* Inserts entry idx (key s, n) into an index; false if the name exists. */
static bool index_insert(uint32_t *index, size_t cap, uint32_t idx, const char *s, size_t n,
                         const char *(*name_of)(const gguf *, uint32_t), const gguf *g)
{
    size_t mask = cap - 1, i = (size_t)name_hash(s, n) & mask;
    while (index[i]) {
        const char *o = name_of(g, index[i] - 1);
        if (strlen(o) == n && memcmp(o, s, n) == 0) return false;
        i = (i + 1) & mask;
    }
    index[i] = idx + 1;
    return true;
}

static const char *kv_name(const gguf *g, uint32_t i)
{
    return g->kv[i].key;
}

static const char *tensor_name(const gguf *g, uint32_t i)
{
    return g->tensors[i].name;
}

/* Copies a name into the pool (pass 2) or counts it (pass 1). */
static const char *pool_name(parser *c, const uint8_t *s, size_t n)
{
    const char *r = NULL;
    if (c->fill) {
        char *d = c->g->names + c->names_used;
        memcpy(d, s, n);
        d[n] = '\0';
        r = d;
    }
    c->names_used += n + 1;
    return r;
}

static keel_status parse_kvs(parser *c, uint64_t n_kv)
{
    keel_status st;
    for (uint64_t i = 0; i < n_kv; i++) {
        const uint8_t *k;
        uint64_t klen;
        char nb[80];
        snprintf(c->what, sizeof c->what, "key %" PRIu64, i);
        if ((st = get_str(c, &k, &klen, "key"))) return st;
        if (klen == 0 || klen > GGUF_MAX_KEY)
            return base_err(c->err, KEEL_EFORMAT,
                            "key %" PRIu64 ": length %" PRIu64 " outside 1..%d", i, klen,
                            GGUF_MAX_KEY);
        if (str_has_nul(k, (size_t)klen))
            return base_err(c->err, KEEL_EFORMAT, "key %" PRIu64 " (%s): contains a NUL byte", i,
                            safe_name(k, (size_t)klen, nb));
        snprintf(c->what, sizeof c->what, "key %s", safe_name(k, (size_t)klen, nb));
        uint32_t t;
        if ((st = get_u32(c, &t, "value type"))) return st;
        gguf_value v;
        if ((st = parse_value(c, (gguf_type)t, 0, true, &v))) return st;
        const char *key = pool_name(c, k, (size_t)klen);
        if (c->fill) {
            gguf *g = c->g;
            g->kv[i].key = key;
            g->kv[i].key_len = (size_t)klen;
            g->kv[i].v = v;
            if (!index_insert(g->kv_index, g->kv_index_cap, (uint32_t)i, key, (size_t)klen, kv_name,
                              g))
                return base_err(c->err, KEEL_EFORMAT, "duplicate key %s", nb);
        }
        if (klen == strlen("general.alignment") &&
            memcmp(k, "general.alignment", (size_t)klen) == 0) {
            int64_t a;
            if (!type_is_int(v.type) || v.type == GGUF_TYPE_BOOL || read_int(v.type, v.data, &a))
                return base_err(c->err, KEEL_EFORMAT,
                                "key general.alignment: type %s, want an integer",
                                gguf_type_name(v.type));
            /* The GGUF spec requires a multiple of 8 (llama.cpp takes any
             * power of two): smaller values would leave f32 and f16 tensor
             * data misaligned. */
            if (a < GGUF_MIN_ALIGNMENT || a > (1 << 30) || (a & (a - 1)) != 0)
                return base_err(c->err, KEEL_EFORMAT,
                                "key general.alignment: %" PRId64 " is not a power of two in "
                                "%d..2^30 (GGUF requires a multiple of %d)",
                                a, GGUF_MIN_ALIGNMENT, GGUF_MIN_ALIGNMENT);
            c->alignment = (uint32_t)a;
        }
    }
    return KEEL_OK;
}

static keel_status parse_tensor_infos(parser *c, uint64_t n_tensors)
{
    keel_status st;
    gguf *g = c->g;
    for (uint64_t i = 0; i < n_tensors; i++) {
        const uint8_t *s;
        uint64_t slen;
        char nb[80];
        snprintf(c->what, sizeof c->what, "tensor %" PRIu64, i);
        if ((st = get_str(c, &s, &slen, "name"))) return st;
        if (slen == 0 || slen > GGUF_MAX_NAME)
            return base_err(c->err, KEEL_EFORMAT,
                            "tensor %" PRIu64 ": name length %" PRIu64 " outside 1..%d", i, slen,
                            GGUF_MAX_NAME);
        safe_name(s, (size_t)slen, nb);
        if (str_has_nul(s, (size_t)slen))
            return base_err(c->err, KEEL_EFORMAT, "tensor %s: name contains a NUL byte", nb);
        snprintf(c->what, sizeof c->what, "tensor %s", nb);
        uint32_t n_dims;
        if ((st = get_u32(c, &n_dims, "n_dims"))) return st;
        if (n_dims < 1 || n_dims > GGUF_MAX_DIMS)
            return base_err(c->err, KEEL_EFORMAT, "tensor %s: n_dims %u outside 1..%d", nb, n_dims,
                            GGUF_MAX_DIMS);
        int64_t ne[GGUF_MAX_DIMS] = {1, 1, 1, 1};
        int64_t nel = 1;
        for (uint32_t d = 0; d < n_dims; d++) {
            uint64_t v;
            if ((st = get_u64(c, &v, "ne"))) return st;
            if (v == 0 || v > (uint64_t)INT64_MAX)
                return base_err(c->err, KEEL_EFORMAT,
                                "tensor %s: ne[%u] = %" PRIu64 " outside 1..INT64_MAX", nb, d, v);
            ne[d] = (int64_t)v;
            if (__builtin_mul_overflow(nel, ne[d], &nel))
                return base_err(c->err, KEEL_EFORMAT, "tensor %s: element count overflows", nb);
        }
        uint32_t type;
        uint64_t offset;
        if ((st = get_u32(c, &type, "dtype"))) return st;
        if ((st = get_u64(c, &offset, "offset"))) return st;
        if (!tensor_dtype_valid((keel_dtype)type))
            return base_err(c->err, KEEL_EUNSUPPORTED, "tensor %s: unknown dtype id %u", nb, type);
        int64_t bs = keel_dtype_block_size((keel_dtype)type);
        if (ne[0] % bs != 0)
            return base_err(c->err, KEEL_EFORMAT,
                            "tensor %s: ne[0] = %" PRId64
                            " is not a multiple of the %s block (%" PRId64 ")",
                            nb, ne[0], keel_dtype_name((keel_dtype)type), bs);
        size_t row = tensor_row_bytes((keel_dtype)type, ne[0]), nbytes;
        if (row == 0 || !size_mul(row, (size_t)(nel / ne[0]), &nbytes))
            return base_err(c->err, KEEL_EFORMAT, "tensor %s: byte size overflows", nb);
        const char *name = pool_name(c, s, (size_t)slen);
        if (c->fill) {
            gguf_tensor *t = &g->tensors[i];
            t->name = name;
            t->name_len = (size_t)slen;
            t->dtype = (keel_dtype)type;
            t->n_dims = n_dims;
            memcpy(t->ne, ne, sizeof ne);
            t->offset = offset;
            t->nbytes = nbytes;
            if (!index_insert(g->t_index, g->t_index_cap, (uint32_t)i, name, (size_t)slen,
                              tensor_name, g))
                return base_err(c->err, KEEL_EFORMAT, "duplicate tensor %s", nb);
        }
    }
    return KEEL_OK;
}

/* "f32 [4096, 32]": dtype and shape of t, for messages. */
static const char *tensor_desc(const gguf_tensor *t, char buf[96])
{
    const char *dn = keel_dtype_name(t->dtype);
    int k = snprintf(buf, 96, "%s [%" PRId64, dn ? dn : "?", t->ne[0]);
    for (uint32_t d = 1; d < t->n_dims && k > 0 && k < 96; d++)
        k += snprintf(buf + k, 96 - (size_t)k, ", %" PRId64, t->ne[d]);
    if (k > 0 && k < 95) snprintf(buf + k, 96 - (size_t)k, "]");
    return buf;
}

/*
 * Checks each tensor's data range and sets data pointers (pass 2, on the
 * stored infos). As llama.cpp's gguf reader requires, tensor data lies in
 * file order, each tensor at the previous one's end padded to the
 * alignment: that rules out overlap, gaps, and a size (dtype x shape) that
 * disagrees with the space the file gives the tensor. The last tensor's
 * size is checked against the end of the file: at most its padding may
 * follow it.
 */
static keel_status check_tensor_data(parser *c)
{
    gguf *g = c->g;
    size_t room = g->size - g->data_offset; /* data_offset <= size checked by caller */
    size_t expect = 0; /* where the next tensor must start */
    char d0[96];
    for (int64_t i = 0; i < g->n_tensors; i++) {
        gguf_tensor *t = &g->tensors[i];
        const gguf_tensor *prev = i > 0 ? &g->tensors[i - 1] : NULL;
        if (t->offset % g->alignment != 0)
            return base_err(c->err, KEEL_EFORMAT,
                            "tensor %s: offset %" PRIu64 " not a multiple of the alignment %u",
                            t->name, t->offset, g->alignment);
        if (t->offset > room)
            return base_err(c->err, KEEL_EFORMAT,
                            "tensor %s: offset %" PRIu64 " past end of file (%zu)", t->name,
                            t->offset, g->size);
        if (t->nbytes > room - (size_t)t->offset)
            return base_err(c->err, KEEL_EFORMAT,
                            "tensor %s: %zu bytes at offset %" PRIu64 " run past end of file (%zu)",
                            t->name, t->nbytes, t->offset, g->size);
        if (!prev && t->offset != 0)
            return base_err(c->err, KEEL_EFORMAT,
                            "tensor %s: offset %" PRIu64
                            ", expected 0 (the first tensor starts the data section)",
                            t->name, t->offset);
        if (prev && t->offset < expect)
            return base_err(c->err, KEEL_EFORMAT,
                            "tensor %s: data at offset %" PRIu64 " overlaps tensor %s (%zu bytes "
                            "of %s at offset %" PRIu64 ")",
                            t->name, t->offset, prev->name, prev->nbytes, tensor_desc(prev, d0),
                            prev->offset);
        if (prev && t->offset > expect)
            return base_err(c->err, KEEL_EFORMAT,
                            "tensor %s: offset %" PRIu64 ", expected %zu: the file leaves %" PRIu64
                            " bytes for tensor %s, which as %s needs %zu",
                            t->name, t->offset, expect, t->offset - prev->offset, prev->name,
                            tensor_desc(prev, d0), prev->nbytes);
        /* offset + nbytes <= room, so neither sum overflows a size_t that
         * holds the file size, except in the padding: checked */
        if (!size_align_up((size_t)t->offset + t->nbytes, g->alignment, &expect))
            return base_err(c->err, KEEL_EFORMAT, "tensor %s: data end overflows", t->name);
        t->data = g->base + g->data_offset + t->offset;
    }
    if (g->n_tensors > 0 && room > expect) {
        const gguf_tensor *last = &g->tensors[g->n_tensors - 1];
        size_t end = (size_t)last->offset + last->nbytes;
        return base_err(c->err, KEEL_EFORMAT,
                        "%zu bytes follow the data of the last tensor %s (%s, %zu bytes at offset "
                        "%" PRIu64 "), more than its %zu bytes of padding: its dtype or shape does "
                        "not match its data",
                        room - end, last->name, tensor_desc(last, d0), last->nbytes,
                        last->offset, expect - end);
    }
    return KEEL_OK;
}

static size_t pow2_at_least(size_t n)
{
    size_t c = 8;
    while (c < n)
        c <<= 1;
    return c;
}

static void free_tables(gguf *g)
{
    base_free(g->kv, (size_t)g->n_kv * sizeof *g->kv);
    base_free(g->tensors, (size_t)g->n_tensors * sizeof *g->tensors);
    base_free(g->names, g->names_bytes);
    base_free(g->offs, g->n_offs * sizeof *g->offs);
    base_free(g->kv_index, g->kv_index_cap * sizeof *g->kv_index);
    base_free(g->t_index, g->t_index_cap * sizeof *g->t_index);
}

static void release_base(gguf *g)
{
    if (g->own == OWN_MMAP)
        munmap((void *)g->base, g->size);
    else if (g->own == OWN_ALLOC)
        base_free((void *)g->base, g->size);
    g->own = OWN_NONE;
}

void gguf_close(gguf *g)
{
    if (!g) return;
    free_tables(g);
    release_base(g);
    base_free(g, sizeof *g);
}

/* Parses g->base[0..size). On failure frees the tables (not the base). */
static keel_status parse(gguf *g, char *err)
{
    keel_status st;
    parser c = {.g = g, .p = g->base, .end = g->base + g->size, .err = err};
    snprintf(c.what, sizeof c.what, "header");
    uint32_t version;
    uint64_t n_tensors, n_kv;
    if (g->size < 4 || memcmp(g->base, "GGUF", 4) != 0) {
        if (g->size >= 4 && memcmp(g->base, "FUGG", 4) == 0)
            return base_err(err, KEEL_EUNSUPPORTED, "big-endian GGUF is not supported");
        return base_err(err, KEEL_EFORMAT, "not a GGUF file (bad magic)");
    }
    c.p += 4;
    if ((st = get_u32(&c, &version, "version"))) return st;
    if (version == 1)
        return base_err(err, KEEL_EUNSUPPORTED, "GGUF v1 is not supported (v2 and v3 are)");
    if (version == 0x03000000u || version == 0x02000000u)
        return base_err(err, KEEL_EUNSUPPORTED, "big-endian GGUF is not supported");
    if (version != 2 && version != 3)
        return base_err(err, KEEL_EUNSUPPORTED, "GGUF version %u is not supported (2 and 3 are)",
                        version);
    if ((st = get_u64(&c, &n_tensors, "tensor count"))) return st;
    if ((st = get_u64(&c, &n_kv, "key count"))) return st;
    /* smallest key: u64 len + 1 byte + u32 type + 1 byte value = 14 bytes;
     * smallest tensor info: 8 + 1 + 4 + 8 + 4 + 8 = 33 bytes */
    if (n_kv > left(&c) / 14)
        return base_err(err, KEEL_EFORMAT, "header: %" PRIu64 " keys cannot fit in %zu bytes", n_kv,
                        left(&c));
    if (n_tensors > left(&c) / 33)
        return base_err(err, KEEL_EFORMAT, "header: %" PRIu64 " tensors cannot fit in %zu bytes",
                        n_tensors, left(&c));
    if (n_kv > INT32_MAX || n_tensors > INT32_MAX)
        return base_err(err, KEEL_EFORMAT, "header: more than 2^31 keys or tensors");
    const uint8_t *body = c.p;

    /* pass 1: validate and count */
    c.alignment = GGUF_DEFAULT_ALIGNMENT;
    if ((st = parse_kvs(&c, n_kv))) return st;
    if ((st = parse_tensor_infos(&c, n_tensors))) return st;
    size_t info_end = (size_t)(c.p - g->base), data_offset;
    if (!size_align_up(info_end, c.alignment, &data_offset))
        return base_err(err, KEEL_EFORMAT, "data offset overflows");
    if (n_tensors > 0 && data_offset > g->size)
        return base_err(err, KEEL_EFORMAT, "data section offset %zu past end of file (%zu)",
                        data_offset, g->size);

    /* allocate: every size is bounded by the file size (counted above) */
    g->n_kv = (int64_t)n_kv;
    g->n_tensors = (int64_t)n_tensors;
    g->names_bytes = c.names_used;
    g->n_offs = c.offs_used;
    g->kv_index_cap = pow2_at_least(2 * (size_t)n_kv);
    g->t_index_cap = pow2_at_least(2 * (size_t)n_tensors);
    g->kv = n_kv ? base_calloc((size_t)n_kv, sizeof *g->kv) : NULL;
    g->tensors = n_tensors ? base_calloc((size_t)n_tensors, sizeof *g->tensors) : NULL;
    g->names = g->names_bytes ? base_alloc(g->names_bytes) : NULL;
    g->offs = g->n_offs ? base_alloc(g->n_offs * sizeof *g->offs) : NULL;
    g->kv_index = base_calloc(g->kv_index_cap, sizeof *g->kv_index);
    g->t_index = base_calloc(g->t_index_cap, sizeof *g->t_index);
    if ((n_kv && !g->kv) || (n_tensors && !g->tensors) || (g->names_bytes && !g->names) ||
        (g->n_offs && !g->offs) || !g->kv_index || !g->t_index) {
        st = base_err(err, KEEL_ENOMEM, "out of memory for %" PRIu64 " keys, %" PRIu64 " tensors",
                      n_kv, n_tensors);
        goto fail;
    }

    /* pass 2: fill, index, reject duplicates */
    c.p = body;
    c.fill = true;
    c.names_used = 0;
    c.offs_used = 0;
    c.alignment = GGUF_DEFAULT_ALIGNMENT;
    if ((st = parse_kvs(&c, n_kv))) goto fail;
    if ((st = parse_tensor_infos(&c, n_tensors))) goto fail;
    g->version = version;
    g->alignment = c.alignment;
    g->data_offset = data_offset;
    snprintf(c.what, sizeof c.what, "tensor data");
    if ((st = check_tensor_data(&c))) goto fail;
    return KEEL_OK;
fail:
    free_tables(g);
    g->kv = NULL;
    g->tensors = NULL;
    g->names = NULL;
    g->offs = NULL;
    g->kv_index = g->t_index = NULL;
    g->n_kv = g->n_tensors = 0;
    g->names_bytes = g->n_offs = g->kv_index_cap = g->t_index_cap = 0;
    return st;
}

/* Takes base (released by how) and parses it. */
static keel_status open_common(const void *data, size_t size, int own, gguf **out, char *err)
{
    *out = NULL;
    gguf *g = base_calloc(1, sizeof *g);
    if (!g) {
        gguf tmp = {.base = data, .size = size, .own = own};
        release_base(&tmp);
        return base_err(err, KEEL_ENOMEM, "out of memory");
    }
    g->base = data;
    g->size = size;
    g->own = own;
    keel_status st = parse(g, err);
    if (st != KEEL_OK) {
        gguf_close(g);
        return st;
    }
    *out = g;
    return KEEL_OK;
}

keel_status gguf_open_buffer(const void *data, size_t size, gguf **out, char *err)
{
    if (!out) return base_err(err, KEEL_EINVAL, "out is NULL");
    *out = NULL;
    if (!data && size) return base_err(err, KEEL_EINVAL, "data is NULL");
    return open_common(data, size, OWN_NONE, out, err);
}

keel_status gguf_open_owned(void *data, size_t size, gguf **out, char *err)
{
    if (!out) {
        base_free(data, size);
        return base_err(err, KEEL_EINVAL, "out is NULL");
    }
    *out = NULL;
    if (!data) return base_err(err, KEEL_EINVAL, "data is NULL");
    return open_common(data, size, OWN_ALLOC, out, err);
}

/* Opens path read-only as a non-empty regular file: *fd and *size, or an
 * error (nothing left open). */
static keel_status open_regular(const char *path, int *fd, size_t *size, char *err)
{
    *fd = open(path, O_RDONLY | O_CLOEXEC);
    if (*fd < 0) return base_err(err, KEEL_EIO, "%s: %s", path, strerror(errno));
    struct stat sb;
    keel_status st = KEEL_OK;
    if (fstat(*fd, &sb) != 0)
        st = base_err(err, KEEL_EIO, "%s: %s", path, strerror(errno));
    else if (!S_ISREG(sb.st_mode))
        st = base_err(err, KEEL_EIO, "%s: not a regular file", path);
    else if (sb.st_size <= 0)
        st = base_err(err, KEEL_EFORMAT, "%s: empty file", path);
    if (st != KEEL_OK) {
        close(*fd);
        *fd = -1;
        return st;
    }
    *size = (size_t)sb.st_size;
    return KEEL_OK;
}

keel_status gguf_open_file(const char *path, gguf **out, char *err)
{
    if (!out || !path) return base_err(err, KEEL_EINVAL, "path or out is NULL");
    *out = NULL;
    int fd;
    size_t size;
    keel_status st = open_regular(path, &fd, &size, err);
    if (st != KEEL_OK) return st;
    void *m = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (m == MAP_FAILED) return base_err(err, KEEL_EIO, "%s: mmap: %s", path, strerror(e));
    return open_common(m, size, OWN_MMAP, out, err);
}

keel_status gguf_read_file(const char *path, gguf **out, char *err)
{
    if (!out || !path) return base_err(err, KEEL_EINVAL, "path or out is NULL");
    *out = NULL;
    int fd;
    size_t size, got = 0;
    keel_status st = open_regular(path, &fd, &size, err);
    if (st != KEEL_OK) return st;
    uint8_t *buf = base_alloc(size);
    if (!buf) st = base_err(err, KEEL_ENOMEM, "%s: cannot allocate %zu bytes to read it into", path, size);
    while (st == KEEL_OK && got < size) {
        ssize_t r = read(fd, buf + got, size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0)
            st = base_err(err, KEEL_EIO, "%s: read: %s", path, strerror(errno));
        else if (r == 0)
            st = base_err(err, KEEL_EIO, "%s: the file ended at %zu of %zu bytes (changed while read)", path, got,
                          size);
        else
            got += (size_t)r;
    }
    close(fd); /* read-only: nothing of ours is lost if close reports an error */
    if (st != KEEL_OK) {
        base_free(buf, size);
        return st;
    }
    return open_common(buf, size, OWN_ALLOC, out, err);
}

keel_status gguf_check_value(gguf_type type, const void *payload, size_t nbytes, char *err)
{
    gguf dummy = {.base = payload, .size = nbytes};
    parser c = {.g = &dummy, .p = payload, .end = (const uint8_t *)payload + nbytes, .err = err};
    snprintf(c.what, sizeof c.what, "value");
    if (!payload && nbytes) return base_err(err, KEEL_EINVAL, "payload is NULL");
    keel_status st = parse_value(&c, type, 0, false, NULL);
    if (st) return st;
    if (c.p != c.end)
        return base_err(err, KEEL_EFORMAT, "value: %zu trailing bytes", (size_t)(c.end - c.p));
    return KEEL_OK;
}

/* ---- file-level accessors ------------------------------------------------ */

uint32_t gguf_version(const gguf *g)
{
    return g->version;
}

size_t gguf_alignment(const gguf *g)
{
    return g->alignment;
}

size_t gguf_data_offset(const gguf *g)
{
    return g->data_offset;
}

const uint8_t *gguf_bytes(const gguf *g)
{
    return g->base;
}

size_t gguf_size(const gguf *g)
{
    return g->size;
}

bool gguf_mapped(const gguf *g)
{
    return g->own == OWN_MMAP;
}

/* ---- keys ---------------------------------------------------------------- */

int64_t gguf_n_kv(const gguf *g)
{
    return g->n_kv;
}

const char *gguf_key_at(const gguf *g, int64_t i)
{
    return (i >= 0 && i < g->n_kv) ? g->kv[i].key : NULL;
}

const gguf_value *gguf_value_at(const gguf *g, int64_t i)
{
    return (i >= 0 && i < g->n_kv) ? &g->kv[i].v : NULL;
}

int64_t gguf_find_key(const gguf *g, const char *key)
{
    if (!key || !g->kv_index) return -1;
    size_t n = strlen(key), mask = g->kv_index_cap - 1, i = (size_t)name_hash(key, n) & mask;
    while (g->kv_index[i]) {
        const gguf_kv *kv = &g->kv[g->kv_index[i] - 1];
        if (kv->key_len == n && memcmp(kv->key, key, n) == 0) return g->kv_index[i] - 1;
        i = (i + 1) & mask;
    }
    return -1;
}

const gguf_value *gguf_find_value(const gguf *g, const char *key)
{
    int64_t i = gguf_find_key(g, key);
    return i < 0 ? NULL : &g->kv[i].v;
}

static keel_status lookup(const gguf *g, const char *key, const gguf_value **v, char *err)
{
    *v = gguf_find_value(g, key);
    if (!*v) return base_err(err, KEEL_ENOENT, "missing key %s", key ? key : "(null)");
    return KEEL_OK;
}

static keel_status want_type(const char *key, const gguf_value *v, gguf_type t, char *err)
{
    if (v->type == t) return KEEL_OK;
    return base_err(err, KEEL_EFORMAT, "key %s: type %s, want %s", key, gguf_type_name(v->type),
                    gguf_type_name(t));
}

keel_status gguf_get_u32(const gguf *g, const char *key, uint32_t *out, char *err)
{
    const gguf_value *v;
    keel_status st = lookup(g, key, &v, err);
    if (!st) st = want_type(key, v, GGUF_TYPE_UINT32, err);
    if (!st) memcpy(out, v->data, 4);
    return st;
}

keel_status gguf_get_i32(const gguf *g, const char *key, int32_t *out, char *err)
{
    const gguf_value *v;
    keel_status st = lookup(g, key, &v, err);
    if (!st) st = want_type(key, v, GGUF_TYPE_INT32, err);
    if (!st) memcpy(out, v->data, 4);
    return st;
}

keel_status gguf_get_f32(const gguf *g, const char *key, float *out, char *err)
{
    const gguf_value *v;
    keel_status st = lookup(g, key, &v, err);
    if (!st) st = want_type(key, v, GGUF_TYPE_FLOAT32, err);
    if (!st) memcpy(out, v->data, 4);
    return st;
}

keel_status gguf_get_bool(const gguf *g, const char *key, bool *out, char *err)
{
    const gguf_value *v;
    keel_status st = lookup(g, key, &v, err);
    if (!st) st = want_type(key, v, GGUF_TYPE_BOOL, err);
    if (!st) *out = v->data[0] != 0;
    return st;
}

keel_status gguf_get_str(const gguf *g, const char *key, const char **s, size_t *n, char *err)
{
    const gguf_value *v;
    keel_status st = lookup(g, key, &v, err);
    if (!st) st = want_type(key, v, GGUF_TYPE_STRING, err);
    if (!st) {
        *s = (const char *)v->data;
        *n = v->nbytes;
    }
    return st;
}

keel_status gguf_get_int(const gguf *g, const char *key, int64_t *out, char *err)
{
    const gguf_value *v;
    keel_status st = lookup(g, key, &v, err);
    if (st) return st;
    int64_t x;
    st = gguf_value_int(v, &x);
    if (st == KEEL_ERANGE) return base_err(err, st, "key %s: value does not fit in int64", key);
    if (st)
        return base_err(err, st, "key %s: type %s, want an integer", key, gguf_type_name(v->type));
    *out = x;
    return KEEL_OK;
}

keel_status gguf_get_float(const gguf *g, const char *key, double *out, char *err)
{
    const gguf_value *v;
    keel_status st = lookup(g, key, &v, err);
    if (st) return st;
    if (gguf_value_float(v, out))
        return base_err(err, KEEL_EFORMAT, "key %s: type %s, want f32 or f64", key,
                        gguf_type_name(v->type));
    return KEEL_OK;
}

keel_status gguf_get_arr(const gguf *g, const char *key, gguf_type want, const gguf_value **out,
                         char *err)
{
    const gguf_value *v;
    keel_status st = lookup(g, key, &v, err);
    if (st) return st;
    if (v->type != GGUF_TYPE_ARRAY)
        return base_err(err, KEEL_EFORMAT, "key %s: type %s, want an array", key,
                        gguf_type_name(v->type));
    if (want != GGUF_TYPE_COUNT_ && v->arr_type != want)
        return base_err(err, KEEL_EFORMAT, "key %s: array of %s, want array of %s", key,
                        gguf_type_name(v->arr_type), gguf_type_name(want));
    *out = v;
    return KEEL_OK;
}

bool gguf_str_eq(const char *s, size_t n, const char *c)
{
    return strlen(c) == n && memcmp(s, c, n) == 0;
}

/* ---- value helpers ------------------------------------------------------- */

keel_status gguf_value_int(const gguf_value *v, int64_t *out)
{
    if (!type_is_int(v->type)) return KEEL_EFORMAT;
    return read_int(v->type, v->data, out);
}

keel_status gguf_value_float(const gguf_value *v, double *out)
{
    return read_float(v->type, v->data, out);
}

/* Bytes of the (already validated) array payload starting at p. */
static size_t skip_array(const uint8_t *p)
{
    uint32_t et;
    uint64_t n;
    memcpy(&et, p, 4);
    memcpy(&n, p + 4, 8);
    const uint8_t *q = p + 12;
    size_t es = gguf_type_size((gguf_type)et);
    if (es) return 12 + (size_t)n * es;
    for (uint64_t i = 0; i < n; i++) {
        if (et == GGUF_TYPE_STRING) {
            uint64_t len;
            memcpy(&len, q, 8);
            q += 8 + len;
        } else {
            q += skip_array(q); /* depth bounded by GGUF_MAX_ARRAY_DEPTH */
        }
    }
    return (size_t)(q - p);
}

keel_status gguf_arr_elem(const gguf_value *arr, uint64_t i, gguf_value *out)
{
    if (!arr || arr->type != GGUF_TYPE_ARRAY) return KEEL_EINVAL;
    if (i >= arr->n) return KEEL_ERANGE;
    gguf_value e = {.type = arr->arr_type, .arr_type = GGUF_TYPE_COUNT_, .n = 1};
    size_t es = gguf_type_size(arr->arr_type);
    if (es) {
        e.data = arr->data + (size_t)i * es;
        e.nbytes = es;
    } else if (arr->arr_type == GGUF_TYPE_STRING) {
        const uint8_t *p = arr->data;
        if (arr->offs) {
            p += arr->offs[i];
        } else {
            for (uint64_t j = 0; j < i; j++) {
                uint64_t len;
                memcpy(&len, p, 8);
                p += 8 + len;
            }
        }
        uint64_t len;
        memcpy(&len, p, 8);
        e.data = p + 8;
        e.n = len;
        e.nbytes = (size_t)len;
    } else {
        const uint8_t *p = arr->data;
        for (uint64_t j = 0; j < i; j++)
            p += skip_array(p);
        uint32_t et;
        uint64_t n;
        memcpy(&et, p, 4);
        memcpy(&n, p + 4, 8);
        e.arr_type = (gguf_type)et;
        e.n = n;
        e.data = p + 12;
        e.nbytes = skip_array(p) - 12;
    }
    *out = e;
    return KEEL_OK;
}

keel_status gguf_arr_str(const gguf_value *arr, uint64_t i, const char **s, size_t *n)
{
    if (!arr || arr->type != GGUF_TYPE_ARRAY || arr->arr_type != GGUF_TYPE_STRING)
        return KEEL_EINVAL;
    gguf_value e;
    keel_status st = gguf_arr_elem(arr, i, &e);
    if (st) return st;
    *s = (const char *)e.data;
    *n = e.nbytes;
    return KEEL_OK;
}

keel_status gguf_arr_int(const gguf_value *arr, uint64_t i, int64_t *out)
{
    if (!arr || arr->type != GGUF_TYPE_ARRAY || !type_is_int(arr->arr_type)) return KEEL_EINVAL;
    if (i >= arr->n) return KEEL_ERANGE;
    return read_int(arr->arr_type, arr->data + (size_t)i * gguf_type_size(arr->arr_type), out);
}

keel_status gguf_arr_float(const gguf_value *arr, uint64_t i, double *out)
{
    if (!arr || arr->type != GGUF_TYPE_ARRAY ||
        (arr->arr_type != GGUF_TYPE_FLOAT32 && arr->arr_type != GGUF_TYPE_FLOAT64))
        return KEEL_EINVAL;
    if (i >= arr->n) return KEEL_ERANGE;
    return read_float(arr->arr_type, arr->data + (size_t)i * gguf_type_size(arr->arr_type), out);
}

/* ---- tensors ------------------------------------------------------------- */

int64_t gguf_n_tensors(const gguf *g)
{
    return g->n_tensors;
}

const gguf_tensor *gguf_tensor_at(const gguf *g, int64_t i)
{
    return (i >= 0 && i < g->n_tensors) ? &g->tensors[i] : NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf *g, const char *name)
{
    if (!name || !g->t_index) return NULL;
    size_t n = strlen(name), mask = g->t_index_cap - 1, i = (size_t)name_hash(name, n) & mask;
    while (g->t_index[i]) {
        const gguf_tensor *t = &g->tensors[g->t_index[i] - 1];
        if (t->name_len == n && memcmp(t->name, name, n) == 0) return t;
        i = (i + 1) & mask;
    }
    return NULL;
}

keel_status gguf_get_tensor(const gguf *g, const char *name, const gguf_tensor **out, char *err)
{
    const gguf_tensor *t = gguf_find_tensor(g, name);
    if (!t) return base_err(err, KEEL_ENOENT, "missing tensor %s", name ? name : "(null)");
    *out = t;
    return KEEL_OK;
}

keel_status gguf_chat_template(const gguf *g, const char **s, size_t *n, char *err)
{
    const gguf_value *v = gguf_find_value(g, "tokenizer.chat_template");
    if (!v) return base_err(err, KEEL_ENOENT, "the model has no tokenizer.chat_template");
    return gguf_get_str(g, "tokenizer.chat_template", s, n, err);
}
