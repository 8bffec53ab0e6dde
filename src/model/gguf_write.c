/*
 * gguf_write.c — the GGUF v3 writer. Owns: the encoded key/value section
 * (a growable byte buffer with a maximum), copies of keys and tensor names,
 * and the tensor table (data borrowed from the caller).
 *
 * Layout written (what llama.cpp's gguf and gguf-py expect): header, keys in
 * insertion order, tensor infos in insertion order with offsets relative to
 * the data section, zero padding to the alignment, then each tensor's bytes
 * followed by zero padding to the alignment (the last tensor too).
 * Invariant: tensors[i].offset == sum of padded sizes of tensors[0..i).
 */
#include "gguf.h"

#include "../tensor/tensor.h"

#include <errno.h>
#include <inttypes.h>
#include <string.h>

#define WRITER_MAX_META ((size_t)1 << 31) /* bytes of keys + tensor infos */

typedef struct wtensor {
    char *name; /* owned copy, name_len + 1 bytes */
    size_t name_len;
    keel_dtype dtype;
    uint32_t n_dims;
    int64_t ne[GGUF_MAX_DIMS];
    const void *data; /* borrowed until the last write; NULL: deferred (filled at write) */
    size_t nbytes;
    uint64_t offset; /* in the data section */
} wtensor;

struct gguf_writer {
    uint8_t *kv; /* [kv_cap] encoded key/value pairs, kv_len used */
    size_t kv_len, kv_cap;
    int64_t n_kv;
    char **keys; /* [keys_cap] owned copies, for duplicate checks */
    size_t keys_cap;
    wtensor *tensors; /* [tensors_cap], n_tensors used */
    int64_t n_tensors;
    size_t tensors_cap;
    size_t infos_len;  /* bytes of the tensor info section */
    uint64_t data_len; /* bytes of the data section (padded) */
    uint32_t alignment;
    gguf_writer_fill_fn fill; /* supplies deferred tensors' bytes at write time */
    void *fill_user;
    size_t deferred_max; /* bytes of the largest deferred tensor (0: none) */
    char err[BASE_ERR_CAP];
};

keel_status gguf_writer_open(gguf_writer **out)
{
    if (!out) return KEEL_EINVAL;
    *out = NULL;
    gguf_writer *w = base_calloc(1, sizeof *w);
    if (!w) return KEEL_ENOMEM;
    w->alignment = GGUF_DEFAULT_ALIGNMENT;
    *out = w;
    return KEEL_OK;
}

void gguf_writer_close(gguf_writer *w)
{
    if (!w) return;
    for (int64_t i = 0; i < w->n_kv; i++)
        base_strfree(w->keys[i]);
    base_free(w->keys, w->keys_cap * sizeof *w->keys);
    for (int64_t i = 0; i < w->n_tensors; i++)
        base_free(w->tensors[i].name, w->tensors[i].name_len + 1);
    base_free(w->tensors, w->tensors_cap * sizeof *w->tensors);
    base_free(w->kv, w->kv_cap);
    base_free(w, sizeof *w);
}

const char *gguf_writer_last_error(const gguf_writer *w)
{
    return w ? w->err : "writer is NULL";
}

/* Grows *buf (of *cap bytes) to hold need bytes; doubling, bounded. */
static keel_status grow(void **buf, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return KEEL_OK;
    size_t nc = *cap ? *cap : 16;
    while (nc < need) {
        if (nc > SIZE_MAX / 2) return KEEL_EOVERFLOW;
        nc *= 2;
    }
    size_t old_bytes, new_bytes;
    if (!size_mul(*cap, elem, &old_bytes) || !size_mul(nc, elem, &new_bytes)) return KEEL_EOVERFLOW;
    void *p = base_realloc(*buf, old_bytes, new_bytes);
    if (!p) return KEEL_ENOMEM;
    *buf = p;
    *cap = nc;
    return KEEL_OK;
}

static keel_status meta_room(gguf_writer *w, size_t add)
{
    size_t total;
    if (!size_add(w->kv_len, add, &total) || !size_add(total, w->infos_len, &total) ||
        total > WRITER_MAX_META)
        return base_err(w->err, KEEL_EINVAL, "metadata larger than %zu bytes", WRITER_MAX_META);
    return KEEL_OK;
}

static bool key_exists(const gguf_writer *w, const char *key)
{
    for (int64_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->keys[i], key) == 0) return true;
    return false;
}

/*
 * Appends key + type + payload (payload given as up to two pieces: a
 * prefix and a body) as one atomic add.
 */
static keel_status add_kv(gguf_writer *w, const char *key, gguf_type type, const void *pre,
                          size_t pre_len, const void *body, size_t body_len)
{
    keel_status st;
    w->err[0] = '\0';
    if (!key || !*key) return base_err(w->err, KEEL_EINVAL, "empty key");
    size_t klen = strlen(key);
    if (klen > GGUF_MAX_KEY)
        return base_err(w->err, KEEL_EINVAL, "key longer than %d bytes", GGUF_MAX_KEY);
    if (key_exists(w, key)) return base_err(w->err, KEEL_EINVAL, "duplicate key %s", key);
    size_t add;
    if (!size_add(12 + klen + pre_len, body_len, &add))
        return base_err(w->err, KEEL_EINVAL, "key %s: value too large", key);
    if ((st = meta_room(w, add))) return st;
    if ((st = grow((void **)&w->kv, &w->kv_cap, w->kv_len + add, 1)) ||
        (st = grow((void **)&w->keys, &w->keys_cap, (size_t)w->n_kv + 1, sizeof *w->keys)))
        return base_err(w->err, st, "out of memory adding key %s", key);
    char *kc = base_strdup(key);
    if (!kc) return base_err(w->err, KEEL_ENOMEM, "out of memory adding key %s", key);
    uint8_t *p = w->kv + w->kv_len;
    uint64_t kl = klen;
    uint32_t t = (uint32_t)type;
    memcpy(p, &kl, 8);
    memcpy(p + 8, key, klen);
    memcpy(p + 8 + klen, &t, 4);
    if (pre_len) memcpy(p + 12 + klen, pre, pre_len);
    if (body_len) memcpy(p + 12 + klen + pre_len, body, body_len);
    w->kv_len += add;
    w->keys[w->n_kv++] = kc;
    return KEEL_OK;
}

#define SCALAR_ADDER(fn, ctype, gtype)                                                             \
    keel_status fn(gguf_writer *w, const char *key, ctype v)                                       \
    {                                                                                              \
        return add_kv(w, key, gtype, &v, sizeof v, NULL, 0);                                       \
    }

SCALAR_ADDER(gguf_writer_add_u8, uint8_t, GGUF_TYPE_UINT8)
SCALAR_ADDER(gguf_writer_add_i8, int8_t, GGUF_TYPE_INT8)
SCALAR_ADDER(gguf_writer_add_u16, uint16_t, GGUF_TYPE_UINT16)
SCALAR_ADDER(gguf_writer_add_i16, int16_t, GGUF_TYPE_INT16)
SCALAR_ADDER(gguf_writer_add_u32, uint32_t, GGUF_TYPE_UINT32)
SCALAR_ADDER(gguf_writer_add_i32, int32_t, GGUF_TYPE_INT32)
SCALAR_ADDER(gguf_writer_add_f32, float, GGUF_TYPE_FLOAT32)
SCALAR_ADDER(gguf_writer_add_u64, uint64_t, GGUF_TYPE_UINT64)
SCALAR_ADDER(gguf_writer_add_i64, int64_t, GGUF_TYPE_INT64)
SCALAR_ADDER(gguf_writer_add_f64, double, GGUF_TYPE_FLOAT64)

keel_status gguf_writer_add_bool(gguf_writer *w, const char *key, bool v)
{
    uint8_t b = v ? 1 : 0;
    return add_kv(w, key, GGUF_TYPE_BOOL, &b, 1, NULL, 0);
}

keel_status gguf_writer_add_strn(gguf_writer *w, const char *key, const char *s, size_t n)
{
    if (!s && n) return base_err(w->err, KEEL_EINVAL, "key %s: string is NULL", key ? key : "");
    uint64_t len = n;
    return add_kv(w, key, GGUF_TYPE_STRING, &len, 8, s, n);
}

keel_status gguf_writer_add_str(gguf_writer *w, const char *key, const char *s)
{
    if (!s) return base_err(w->err, KEEL_EINVAL, "key %s: string is NULL", key ? key : "");
    return gguf_writer_add_strn(w, key, s, strlen(s));
}

keel_status gguf_writer_add_arr(gguf_writer *w, const char *key, gguf_type elem, const void *data,
                                uint64_t n)
{
    size_t es = gguf_type_size(elem), bytes;
    if (es == 0)
        return base_err(w->err, KEEL_EINVAL, "key %s: array element type %s is not a scalar",
                        key ? key : "", gguf_type_name(elem));
    if (n > SIZE_MAX || !size_mul((size_t)n, es, &bytes))
        return base_err(w->err, KEEL_EINVAL, "key %s: array too large", key ? key : "");
    if (!data && n) return base_err(w->err, KEEL_EINVAL, "key %s: data is NULL", key ? key : "");
    uint8_t pre[12];
    uint32_t t = (uint32_t)elem;
    memcpy(pre, &t, 4);
    memcpy(pre + 4, &n, 8);
    if (elem != GGUF_TYPE_BOOL) return add_kv(w, key, GGUF_TYPE_ARRAY, pre, 12, data, bytes);
    /* bools: normalise to 0/1 bytes */
    keel_status st = add_kv(w, key, GGUF_TYPE_ARRAY, pre, 12, data, bytes);
    if (st == KEEL_OK) {
        uint8_t *b = w->kv + w->kv_len - bytes;
        for (size_t i = 0; i < bytes; i++)
            b[i] = b[i] ? 1 : 0;
    }
    return st;
}

keel_status gguf_writer_add_arr_str(gguf_writer *w, const char *key, const char *const *strs,
                                    const size_t *lens, uint64_t n)
{
    keel_status st;
    if (!strs && n)
        return base_err(w->err, KEEL_EINVAL, "key %s: strings are NULL", key ? key : "");
    /* encode into a temporary block, then add atomically */
    size_t bytes = 12;
    for (uint64_t i = 0; i < n; i++) {
        size_t l = lens ? lens[i] : (strs[i] ? strlen(strs[i]) : 0);
        if (!strs[i] && l)
            return base_err(w->err, KEEL_EINVAL, "key %s: string %" PRIu64 " is NULL",
                            key ? key : "", i);
        if (!size_add(bytes, 8, &bytes) || !size_add(bytes, l, &bytes) || bytes > WRITER_MAX_META)
            return base_err(w->err, KEEL_EINVAL, "key %s: string array too large", key ? key : "");
    }
    uint8_t *buf = base_alloc(bytes);
    if (!buf) return base_err(w->err, KEEL_ENOMEM, "out of memory adding key %s", key ? key : "");
    uint32_t t = GGUF_TYPE_STRING;
    memcpy(buf, &t, 4);
    memcpy(buf + 4, &n, 8);
    uint8_t *p = buf + 12;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t l = lens ? lens[i] : (strs[i] ? strlen(strs[i]) : 0);
        memcpy(p, &l, 8);
        if (l) memcpy(p + 8, strs[i], (size_t)l);
        p += 8 + l;
    }
    st = add_kv(w, key, GGUF_TYPE_ARRAY, NULL, 0, buf, bytes);
    base_free(buf, bytes);
    return st;
}

keel_status gguf_writer_add_raw(gguf_writer *w, const char *key, gguf_type type,
                                const void *payload, size_t nbytes)
{
    keel_status st = gguf_check_value(type, payload, nbytes, w->err);
    if (st) return KEEL_EINVAL; /* detail already in w->err */
    return add_kv(w, key, type, NULL, 0, payload, nbytes);
}

keel_status gguf_writer_set_alignment(gguf_writer *w, uint32_t alignment)
{
    if (alignment < GGUF_MIN_ALIGNMENT || alignment > (1u << 20) || (alignment & (alignment - 1)))
        return base_err(w->err, KEEL_EINVAL, "alignment %u is not a power of two in %d..2^20",
                        alignment, GGUF_MIN_ALIGNMENT);
    if (w->n_tensors)
        return base_err(w->err, KEEL_EINVAL, "alignment must be set before adding tensors");
    if (alignment == w->alignment && alignment == GGUF_DEFAULT_ALIGNMENT) return KEEL_OK;
    keel_status st = gguf_writer_add_u32(w, "general.alignment", alignment);
    if (st == KEEL_OK) w->alignment = alignment;
    return st;
}

static keel_status add_tensor(gguf_writer *w, const char *name, keel_dtype dtype, uint32_t n_dims,
                              const int64_t *ne, const void *data, size_t nbytes, bool deferred)
{
    keel_status st;
    w->err[0] = '\0';
    if (!name || !*name) return base_err(w->err, KEEL_EINVAL, "empty tensor name");
    size_t nlen = strlen(name);
    if (nlen > GGUF_MAX_NAME)
        return base_err(w->err, KEEL_EINVAL, "tensor %s: name longer than %d bytes", name,
                        GGUF_MAX_NAME);
    if (!tensor_dtype_valid(dtype))
        return base_err(w->err, KEEL_EINVAL, "tensor %s: unknown dtype %d", name, (int)dtype);
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS || !ne)
        return base_err(w->err, KEEL_EINVAL, "tensor %s: n_dims %u outside 1..%d", name, n_dims,
                        GGUF_MAX_DIMS);
    int64_t nel = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] < 1 || __builtin_mul_overflow(nel, ne[d], &nel))
            return base_err(w->err, KEEL_EINVAL, "tensor %s: bad ne[%u] = %" PRId64, name, d,
                            ne[d]);
    }
    size_t row = tensor_row_bytes(dtype, ne[0]), want;
    if (row == 0 || !size_mul(row, (size_t)(nel / ne[0]), &want))
        return base_err(w->err, KEEL_EINVAL,
                        "tensor %s: ne[0] = %" PRId64 " not a multiple of the %s block", name,
                        ne[0], keel_dtype_name(dtype));
    if (deferred) nbytes = want;
    if (nbytes != want || (!deferred && !data && nbytes))
        return base_err(w->err, KEEL_EINVAL, "tensor %s: %zu data bytes, shape needs %zu", name,
                        nbytes, want);
    for (int64_t i = 0; i < w->n_tensors; i++)
        if (strcmp(w->tensors[i].name, name) == 0)
            return base_err(w->err, KEEL_EINVAL, "duplicate tensor %s", name);
    size_t info = 8 + nlen + 4 + 8 * (size_t)n_dims + 4 + 8, padded;
    if ((st = meta_room(w, info))) return st;
    if (!size_align_up(nbytes, w->alignment, &padded) || w->data_len > UINT64_MAX - padded)
        return base_err(w->err, KEEL_EINVAL, "tensor %s: data section overflows", name);
    if ((st = grow((void **)&w->tensors, &w->tensors_cap, (size_t)w->n_tensors + 1,
                   sizeof *w->tensors)))
        return base_err(w->err, st, "out of memory adding tensor %s", name);
    char *nc = base_alloc(nlen + 1);
    if (!nc) return base_err(w->err, KEEL_ENOMEM, "out of memory adding tensor %s", name);
    memcpy(nc, name, nlen + 1);
    wtensor *t = &w->tensors[w->n_tensors++];
    memset(t, 0, sizeof *t);
    t->name = nc;
    t->name_len = nlen;
    t->dtype = dtype;
    t->n_dims = n_dims;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++)
        t->ne[d] = d < n_dims ? ne[d] : 1;
    t->data = deferred ? NULL : data;
    t->nbytes = nbytes;
    t->offset = w->data_len;
    w->data_len += padded;
    w->infos_len += info;
    if (deferred && nbytes > w->deferred_max) w->deferred_max = nbytes;
    return KEEL_OK;
}

keel_status gguf_writer_add_tensor(gguf_writer *w, const char *name, keel_dtype dtype,
                                   uint32_t n_dims, const int64_t *ne, const void *data,
                                   size_t nbytes)
{
    return add_tensor(w, name, dtype, n_dims, ne, data, nbytes, false);
}

keel_status gguf_writer_add_tensor_deferred(gguf_writer *w, const char *name, keel_dtype dtype,
                                            uint32_t n_dims, const int64_t *ne)
{
    return add_tensor(w, name, dtype, n_dims, ne, NULL, 0, true);
}

void gguf_writer_set_fill(gguf_writer *w, gguf_writer_fill_fn fn, void *user)
{
    w->fill = fn;
    w->fill_user = user;
}

/* ---- output ------------------------------------------------------------- */

static size_t header_bytes(const gguf_writer *w)
{
    return 24 + w->kv_len + w->infos_len;
}

keel_status gguf_writer_size(const gguf_writer *w, size_t *out)
{
    size_t h, total;
    if (!size_align_up(header_bytes(w), w->alignment, &h)) return KEEL_EOVERFLOW;
    if (w->n_tensors == 0) h = header_bytes(w);
    if (w->data_len > SIZE_MAX || !size_add(h, (size_t)w->data_len, &total)) return KEEL_EOVERFLOW;
    *out = total;
    return KEEL_OK;
}

/* A byte sink: memory (buf != NULL) or stdio. */
typedef struct sink {
    uint8_t *buf;
    size_t cap, len;
    FILE *f;
    bool failed;         /* a stdio write failed */
    keel_status fill_st; /* a fill callback failed (the write stops) */
    uint8_t *scratch;    /* [scratch_bytes] deferred tensors' bytes for a file sink */
    size_t scratch_bytes;
} sink;

static void put(sink *s, const void *p, size_t n)
{
    if (s->failed || n == 0) return;
    if (s->f) {
        if (fwrite(p, 1, n, s->f) != n) s->failed = true;
    } else {
        memcpy(s->buf + s->len, p, n);
    }
    s->len += n;
}

static void put_zeros(sink *s, size_t n)
{
    static const uint8_t zeros[256];
    while (n) {
        size_t k = n < sizeof zeros ? n : sizeof zeros;
        put(s, zeros, k);
        n -= k;
    }
}

/* Writes tensor i's bytes: borrowed data, or filled by the callback
 * (straight into a memory sink, through scratch for a file). */
static void put_tensor(gguf_writer *w, sink *s, int64_t i)
{
    const wtensor *t = &w->tensors[i];
    if (t->data || t->nbytes == 0) {
        put(s, t->data, t->nbytes);
        return;
    }
    if (s->failed || s->fill_st) return;
    uint8_t *dst = s->f ? s->scratch : s->buf + s->len;
    keel_status st = w->fill(w->fill_user, i, t->name, dst, t->nbytes);
    if (st) {
        s->fill_st = st;
        if (!w->err[0]) base_err(w->err, st, "tensor %s: fill failed", t->name);
        return;
    }
    if (s->f)
        put(s, dst, t->nbytes);
    else
        s->len += t->nbytes;
}

static void emit(gguf_writer *w, sink *s)
{
    uint32_t magic = GGUF_MAGIC, version = GGUF_VERSION;
    uint64_t nt = (uint64_t)w->n_tensors, nk = (uint64_t)w->n_kv;
    put(s, &magic, 4);
    put(s, &version, 4);
    put(s, &nt, 8);
    put(s, &nk, 8);
    put(s, w->kv, w->kv_len);
    for (int64_t i = 0; i < w->n_tensors; i++) {
        const wtensor *t = &w->tensors[i];
        uint64_t nl = t->name_len;
        uint32_t type = (uint32_t)t->dtype;
        put(s, &nl, 8);
        put(s, t->name, t->name_len);
        put(s, &t->n_dims, 4);
        for (uint32_t d = 0; d < t->n_dims; d++) {
            uint64_t v = (uint64_t)t->ne[d];
            put(s, &v, 8);
        }
        put(s, &type, 4);
        put(s, &t->offset, 8);
    }
    if (w->n_tensors == 0) return;
    size_t h = header_bytes(w);
    put_zeros(s, (w->alignment - h % w->alignment) % w->alignment);
    for (int64_t i = 0; i < w->n_tensors && !s->fill_st; i++) {
        const wtensor *t = &w->tensors[i];
        put_tensor(w, s, i);
        put_zeros(s, (w->alignment - t->nbytes % w->alignment) % w->alignment);
    }
}

/* Deferred tensors need a fill function. */
static keel_status check_fill(gguf_writer *w)
{
    if (w->deferred_max && !w->fill)
        return base_err(w->err, KEEL_EINVAL, "deferred tensors but no fill function");
    return KEEL_OK;
}

keel_status gguf_writer_write_buf(gguf_writer *w, void *buf, size_t cap)
{
    size_t need;
    w->err[0] = '\0';
    keel_status st = gguf_writer_size(w, &need);
    if (st) return base_err(w->err, st, "file size overflows");
    if (!buf || cap < need)
        return base_err(w->err, KEEL_ERANGE, "buffer of %zu bytes, file needs %zu", cap, need);
    if ((st = check_fill(w))) return st;
    sink s = {.buf = buf, .cap = cap};
    emit(w, &s);
    return s.fill_st;
}

keel_status gguf_writer_write_mem(gguf_writer *w, void **data, size_t *size)
{
    size_t need;
    *data = NULL;
    *size = 0;
    w->err[0] = '\0';
    keel_status st = gguf_writer_size(w, &need);
    if (st) return base_err(w->err, st, "file size overflows");
    if ((st = check_fill(w))) return st;
    void *buf = base_alloc(need);
    if (!buf) return base_err(w->err, KEEL_ENOMEM, "out of memory for %zu bytes", need);
    sink s = {.buf = buf, .cap = need};
    emit(w, &s);
    if (s.fill_st) {
        base_free(buf, need);
        return s.fill_st;
    }
    *data = buf;
    *size = need;
    return KEEL_OK;
}

keel_status gguf_writer_write_file(gguf_writer *w, FILE *f)
{
    if (!f) return base_err(w->err, KEEL_EINVAL, "file is NULL");
    w->err[0] = '\0';
    keel_status st = check_fill(w);
    if (st) return st;
    sink s = {.f = f};
    if (w->deferred_max) {
        s.scratch_bytes = w->deferred_max;
        s.scratch = base_alloc(s.scratch_bytes);
        if (!s.scratch)
            return base_err(w->err, KEEL_ENOMEM, "out of memory for %zu bytes of tensor data",
                            s.scratch_bytes);
    }
    emit(w, &s);
    base_free(s.scratch, s.scratch_bytes);
    if (s.fill_st) return s.fill_st;
    if (s.failed || fflush(f) != 0)
        return base_err(w->err, KEEL_EIO, "write failed: %s", strerror(errno));
    return KEEL_OK;
}

keel_status gguf_writer_write_path(gguf_writer *w, const char *path)
{
    if (!path) return base_err(w->err, KEEL_EINVAL, "path is NULL");
    FILE *f = fopen(path, "wb");
    if (!f) return base_err(w->err, KEEL_EIO, "%s: %s", path, strerror(errno));
    keel_status st = gguf_writer_write_file(w, f);
    if (fclose(f) != 0 && st == KEEL_OK)
        st = base_err(w->err, KEEL_EIO, "%s: %s", path, strerror(errno));
    return st;
}
