/*
 * gguf.h — private interface of the GGUF reader (gguf.c) and writer
 * (gguf_write.c). The model runtime, the llama2.c converter, the tokenizers
 * and the tests build on it. docs/formats.md describes every check.
 *
 * File layout (GGUF v2/v3, little-endian; str = u64 length + bytes, no NUL):
 *
 *   | field            | type                    | notes                                   |
 *   |------------------|-------------------------|-----------------------------------------|
 *   | magic            | u32 "GGUF"              | bytes 47 47 55 46                       |
 *   | version          | u32                     | 2 or 3 (v1 refused)                     |
 *   | n_tensors        | u64                     |                                         |
 *   | n_kv             | u64                     |                                         |
 *   | kv[n_kv]         | str key, u32 type, value| value: scalar, str, or array:           |
 *   |                  |                         |   u32 elem type, u64 n, n elements      |
 *   | tensor[n_tensors]| str name, u32 n_dims,   | ne[0] fastest; offset relative to the   |
 *   |                  | u64 ne[n_dims], u32     | data section, a multiple of alignment   |
 *   |                  | dtype, u64 offset       |                                         |
 *   | padding          |                         | to general.alignment (default 32; a     |
 *   |                  |                         | power of two >= 8)                      |
 *   | data             |                         | tensor bytes in tensor-info order, each |
 *   |                  |                         | padded to the alignment (no gaps, no    |
 *   |                  |                         | overlap; only the last padding may be   |
 *   |                  |                         | cut short by the end of the file)       |
 *
 * Reader: a gguf is immutable after open. Every lookup is const and
 * thread-safe; nothing allocates after open. Strings inside the file are
 * views (pointer + length, not NUL-terminated) into the mapping, valid until
 * gguf_close. Keys and tensor names are copied once with a NUL so they can
 * be used as C strings.
 *
 * Errors: functions that can fail return keel_status and, when err is not
 * NULL, write a detail line into err[BASE_ERR_CAP] ("tensor
 * blk.3.attn_q.weight: offset 912 past end of file (800)", "missing key
 * llama.block_count"). err is untouched on success.
 */
#ifndef KEEL_MODEL_GGUF_H
#define KEEL_MODEL_GGUF_H

#include "../base/base.h"

#include <stdio.h>

#define GGUF_MAGIC             0x46554747u /* "GGUF" little-endian */
#define GGUF_VERSION           3
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MIN_ALIGNMENT     8     /* the spec: general.alignment is a multiple of 8 */
#define GGUF_MAX_DIMS          4
#define GGUF_MAX_NAME          256   /* bytes of a tensor name, NUL excluded */
#define GGUF_MAX_KEY           65535 /* bytes of a key */
#define GGUF_MAX_ARRAY_DEPTH   4     /* arrays of arrays nest at most this deep */

/* Value types; ids as in the GGUF spec. */
typedef enum gguf_type {
    GGUF_TYPE_UINT8 = 0,
    GGUF_TYPE_INT8 = 1,
    GGUF_TYPE_UINT16 = 2,
    GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4,
    GGUF_TYPE_INT32 = 5,
    GGUF_TYPE_FLOAT32 = 6,
    GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8,
    GGUF_TYPE_ARRAY = 9,
    GGUF_TYPE_UINT64 = 10,
    GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12,
    GGUF_TYPE_COUNT_ /* not a type */
} gguf_type;

/* "u32", "string", "array"...; "?" for an unknown id. Static storage. */
const char *gguf_type_name(gguf_type t);
/* Bytes of one scalar of type t; 0 for string, array and unknown ids. */
size_t gguf_type_size(gguf_type t);

/*
 * A view of one value inside the file. For scalars data points at the
 * little-endian bytes (possibly unaligned: read with memcpy or the helpers
 * below); for strings at the bytes; for arrays at the first element.
 */
typedef struct gguf_value {
    gguf_type type;       /* value type */
    gguf_type arr_type;   /* ARRAY: element type; else GGUF_TYPE_COUNT_ */
    uint64_t n;           /* ARRAY: element count; STRING: byte length; else 1 */
    const uint8_t *data;  /* payload (see above), inside the file */
    size_t nbytes;        /* payload bytes (for arrays: all elements) */
    const uint64_t *offs; /* top-level ARRAY of STRING: [n] element offsets
                             (from data, pointing at each u64 length) for
                             O(1) access; NULL otherwise */
} gguf_value;

/* One tensor. ne[d] = 1 for d >= n_dims. */
typedef struct gguf_tensor {
    const char *name;          /* NUL-terminated, owned by the gguf */
    size_t name_len;           /* bytes, NUL excluded */
    keel_dtype dtype;          /* a type tensor_dtype_valid() accepts */
    uint32_t n_dims;           /* 1..GGUF_MAX_DIMS */
    int64_t ne[GGUF_MAX_DIMS]; /* elements per dimension, ne[0] fastest; all >= 1 */
    uint64_t offset;           /* bytes from the start of the data section */
    size_t nbytes;             /* bytes of data */
    const void *data;          /* inside the file; aligned to the file's alignment
                                  relative to its start */
} gguf_tensor;

typedef struct gguf gguf;

/* ---- open / close ------------------------------------------------------ */

/*
 * Maps the file read-only and parses it. Errors: KEEL_EIO (cannot open or
 * map; err names the path and errno text), KEEL_EFORMAT (malformed: err
 * names the field), KEEL_EUNSUPPORTED (GGUF v1, big-endian, later versions,
 * unknown tensor dtype), KEEL_ENOMEM. *out is NULL on failure.
 */
keel_status gguf_open_file(const char *path, gguf **out, char *err);

/*
 * Reads the whole file into memory from base_alloc (the default allocator
 * advises huge pages for it) and parses it; gguf_close frees it. Errors as
 * gguf_open_file, KEEL_EIO also for a read error or a file that changed
 * size while read.
 */
keel_status gguf_read_file(const char *path, gguf **out, char *err);

/* Whether the data is a mapping of a file (gguf_open_file). */
bool gguf_mapped(const gguf *g);

/*
 * Parses caller memory. data must stay valid and unchanged until
 * gguf_close; tensor data pointers point into it. Errors as above.
 */
keel_status gguf_open_buffer(const void *data, size_t size, gguf **out, char *err);

/*
 * As gguf_open_buffer, but takes ownership of data, a block of size bytes
 * from base_alloc: it is freed with base_free(data, size) by gguf_close,
 * or before returning when opening fails.
 */
keel_status gguf_open_owned(void *data, size_t size, gguf **out, char *err);

/* Releases everything (unmaps, frees an owned buffer). NULL is a no-op. */
void gguf_close(gguf *g);

/* ---- file-level facts -------------------------------------------------- */

uint32_t gguf_version(const gguf *g);
/* Alignment of the data section and of each tensor offset (a power of two). */
size_t gguf_alignment(const gguf *g);
/* Byte offset of the data section from the file start. */
size_t gguf_data_offset(const gguf *g);
/* The whole file: base pointer and size. */
const uint8_t *gguf_bytes(const gguf *g);
size_t gguf_size(const gguf *g);

/* ---- keys -------------------------------------------------------------- */

int64_t gguf_n_kv(const gguf *g);
/* Key i (0 <= i < n_kv), NUL-terminated; NULL when out of range. */
const char *gguf_key_at(const gguf *g, int64_t i);
/* Value of key i; NULL when out of range. */
const gguf_value *gguf_value_at(const gguf *g, int64_t i);
/* Index of key, or -1. O(1) expected (hash table). */
int64_t gguf_find_key(const gguf *g, const char *key);
/* Value of key, or NULL. */
const gguf_value *gguf_find_value(const gguf *g, const char *key);

/*
 * Typed getters. KEEL_ENOENT "missing key K" when absent, KEEL_EFORMAT
 * "key K: type f32, want u32" on a type mismatch. *out is unchanged on
 * failure, so callers may preset a default and ignore KEEL_ENOENT.
 */
keel_status gguf_get_u32(const gguf *g, const char *key, uint32_t *out, char *err);
keel_status gguf_get_i32(const gguf *g, const char *key, int32_t *out, char *err);
keel_status gguf_get_f32(const gguf *g, const char *key, float *out, char *err);
keel_status gguf_get_bool(const gguf *g, const char *key, bool *out, char *err);
/* String view (not NUL-terminated) and its length. */
keel_status gguf_get_str(const gguf *g, const char *key, const char **s, size_t *n, char *err);
/* The chat template (tokenizer.chat_template; bytes in the file, not
 * NUL-terminated): KEEL_ENOENT if the file has none, KEEL_EFORMAT if it is
 * not a string. */
keel_status gguf_chat_template(const gguf *g, const char **s, size_t *n, char *err);
/* Any integer type (u8..i64, and bool as 0/1); KEEL_ERANGE if a u64 value
 * exceeds INT64_MAX. */
keel_status gguf_get_int(const gguf *g, const char *key, int64_t *out, char *err);
/* f32 or f64 (f64 narrowed). */
keel_status gguf_get_float(const gguf *g, const char *key, double *out, char *err);
/*
 * Array value with element type want (GGUF_TYPE_COUNT_: any). KEEL_ENOENT
 * when absent, KEEL_EFORMAT when not an array or of another element type.
 */
keel_status gguf_get_arr(const gguf *g, const char *key, gguf_type want, const gguf_value **out,
                         char *err);

/* True when the string view (s, n) equals the C string c. */
bool gguf_str_eq(const char *s, size_t n, const char *c);

/* Checks that payload[0..nbytes) is exactly one well-formed value of the
 * given type (the reader's rules). KEEL_EFORMAT with detail otherwise. */
keel_status gguf_check_value(gguf_type type, const void *payload, size_t nbytes, char *err);

/* ---- value helpers (views from the getters above; no allocation) ------- */

/*
 * Element i of an array as a value view. O(1) for fixed-size elements and
 * top-level string arrays; a linear walk for nested arrays.
 * KEEL_ERANGE when i >= n, KEEL_EINVAL when arr is not an array.
 */
keel_status gguf_arr_elem(const gguf_value *arr, uint64_t i, gguf_value *out);
/* String element i of a string array: view and length. */
keel_status gguf_arr_str(const gguf_value *arr, uint64_t i, const char **s, size_t *n);
/* Numeric element i of an array of any integer/bool type, as int64
 * (KEEL_ERANGE for a u64 above INT64_MAX). */
keel_status gguf_arr_int(const gguf_value *arr, uint64_t i, int64_t *out);
/* Numeric element i of an f32/f64 array, as double. */
keel_status gguf_arr_float(const gguf_value *arr, uint64_t i, double *out);
/* Scalar value as int64 / double (same type rules as gguf_get_int/float);
 * KEEL_EFORMAT for a non-matching type. */
keel_status gguf_value_int(const gguf_value *v, int64_t *out);
keel_status gguf_value_float(const gguf_value *v, double *out);

/* ---- tensors ----------------------------------------------------------- */

int64_t gguf_n_tensors(const gguf *g);
/* Tensor i in file order; NULL when out of range. */
const gguf_tensor *gguf_tensor_at(const gguf *g, int64_t i);
/* Tensor by name, or NULL. O(1) expected (hash table). */
const gguf_tensor *gguf_find_tensor(const gguf *g, const char *name);
/* As gguf_find_tensor, but KEEL_ENOENT "missing tensor NAME" into err. */
keel_status gguf_get_tensor(const gguf *g, const char *name, const gguf_tensor **out, char *err);

/* ======================================================================== */
/* Writer (gguf_write.c)                                                    */
/* ======================================================================== */

/*
 * Builds a GGUF v3 file: keys in the order added, then tensor infos and
 * data in the order added, each tensor padded to the alignment (32 unless
 * gguf_writer_set_alignment), exactly as llama.cpp and gguf-py lay files
 * out. Tensor data is borrowed (not copied): it must stay valid until the
 * last write call. A writer is used by one thread at a time.
 *
 * Errors: KEEL_EINVAL for a duplicate key or tensor name, an empty or
 * over-long name, a bad shape/dtype or data size (detail in
 * gguf_writer_last_error), KEEL_ENOMEM, KEEL_EIO for file errors.
 * A failed add changes nothing.
 */
typedef struct gguf_writer gguf_writer;

keel_status gguf_writer_open(gguf_writer **out);
void gguf_writer_close(gguf_writer *w);
/* Detail of the last failure ("" if none). Valid until the next call. */
const char *gguf_writer_last_error(const gguf_writer *w);

/* Alignment (power of two, 8..2^20, as the reader requires); stored as
 * general.alignment (u32) when not 32. Must be called before adding tensors. */
keel_status gguf_writer_set_alignment(gguf_writer *w, uint32_t alignment);

keel_status gguf_writer_add_u8(gguf_writer *w, const char *key, uint8_t v);
keel_status gguf_writer_add_i8(gguf_writer *w, const char *key, int8_t v);
keel_status gguf_writer_add_u16(gguf_writer *w, const char *key, uint16_t v);
keel_status gguf_writer_add_i16(gguf_writer *w, const char *key, int16_t v);
keel_status gguf_writer_add_u32(gguf_writer *w, const char *key, uint32_t v);
keel_status gguf_writer_add_i32(gguf_writer *w, const char *key, int32_t v);
keel_status gguf_writer_add_f32(gguf_writer *w, const char *key, float v);
keel_status gguf_writer_add_bool(gguf_writer *w, const char *key, bool v);
keel_status gguf_writer_add_u64(gguf_writer *w, const char *key, uint64_t v);
keel_status gguf_writer_add_i64(gguf_writer *w, const char *key, int64_t v);
keel_status gguf_writer_add_f64(gguf_writer *w, const char *key, double v);
/* NUL-terminated string. */
keel_status gguf_writer_add_str(gguf_writer *w, const char *key, const char *s);
/* String of n bytes (may contain any bytes). */
keel_status gguf_writer_add_strn(gguf_writer *w, const char *key, const char *s, size_t n);
/* Array of n scalars of type elem (not string/array), from native values
 * (e.g. float[] for f32, uint8_t with 0/1 for bool). */
keel_status gguf_writer_add_arr(gguf_writer *w, const char *key, gguf_type elem, const void *data,
                                uint64_t n);
/* Array of n strings; lens[i] gives each length (lens NULL: strlen). */
keel_status gguf_writer_add_arr_str(gguf_writer *w, const char *key, const char *const *strs,
                                    const size_t *lens, uint64_t n);
/* A value already encoded as GGUF bytes (type id, then payload exactly as
 * in a file), e.g. nested arrays. The bytes are checked with the reader's
 * rules (KEEL_EINVAL when malformed) and copied. */
keel_status gguf_writer_add_raw(gguf_writer *w, const char *key, gguf_type type,
                                const void *payload, size_t nbytes);

/*
 * Adds a tensor of n_dims (1..4) dimensions ne[] (each >= 1, ne[0] a
 * multiple of the dtype's block) whose nbytes bytes of data (exactly the
 * dtype's row bytes times the rows) are borrowed until the last write.
 */
keel_status gguf_writer_add_tensor(gguf_writer *w, const char *name, keel_dtype dtype,
                                   uint32_t n_dims, const int64_t *ne, const void *data,
                                   size_t nbytes);

/*
 * Deferred tensors, for files larger than the caller wants to hold in
 * memory at once (keel gen-model): a tensor added with
 * gguf_writer_add_tensor_deferred has no data until write time, when the
 * fill function (gguf_writer_set_fill) is called once for it, in file
 * order, with buf of exactly nbytes bytes to fill (the shape's size).
 * Memory outputs are filled in place; a file output goes through one
 * scratch block of the largest deferred tensor's size. A fill that returns
 * an error stops the write, which returns that status (a memory output is
 * freed, a file is left partly written). Writing deferred tensors without
 * a fill function is KEEL_EINVAL.
 */
typedef keel_status (*gguf_writer_fill_fn)(void *user, int64_t index, const char *name, void *buf,
                                           size_t nbytes);

/* As gguf_writer_add_tensor, with the data supplied at write time. */
keel_status gguf_writer_add_tensor_deferred(gguf_writer *w, const char *name, keel_dtype dtype,
                                            uint32_t n_dims, const int64_t *ne);
/* Sets (or with fn NULL, clears) the fill function of deferred tensors. */
void gguf_writer_set_fill(gguf_writer *w, gguf_writer_fill_fn fn, void *user);

/* Bytes the file will have. */
keel_status gguf_writer_size(const gguf_writer *w, size_t *out);
/* Writes the file into buf (cap >= gguf_writer_size, else KEEL_ERANGE). */
keel_status gguf_writer_write_buf(gguf_writer *w, void *buf, size_t cap);
/* Writes into a new base_alloc block; caller frees it with
 * base_free(*data, *size) or hands it to gguf_open_owned. */
keel_status gguf_writer_write_mem(gguf_writer *w, void **data, size_t *size);
/* Streams to an open stdio file / a path (created or truncated). */
keel_status gguf_writer_write_file(gguf_writer *w, FILE *f);
keel_status gguf_writer_write_path(gguf_writer *w, const char *path);

#endif /* KEEL_MODEL_GGUF_H */
