/*
 * test_gguf.c — src/model GGUF reader and writer: round trip of every value
 * type and tensor data, alignment, fixtures, and bad input (every
 * truncation, random bit flips, oversized counts, hand-made malformed
 * headers, alignments below 8, tensor data out of order, overlapping or of
 * the wrong size), failing-allocator sweeps.
 */
#include "testutil.h"
#include "base/base.h"
#include "model/gguf.h"
#include "model/llama2c.h"
#include "tensor/tensor.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- a small file with every value type --------------------------------- */

static float g_t0[6] = {1, 2, 3, 4, 5, 6};
static uint16_t g_t1[4] = {0x3c00, 0x4000, 0xbc00, 0};
static uint8_t g_t2[2 * 34];
static int32_t g_t3[10] = {1, -2, 3, -4, 5, -6, 7, -8, 9, -10};

/* Nested array payload: array of 2 arrays of strings {"a","bc"}, {"def"}. */
static size_t nested_payload(uint8_t *buf)
{
    uint8_t *p = buf;
    uint32_t t = GGUF_TYPE_ARRAY;
    uint64_t n = 2;
    memcpy(p, &t, 4), p += 4;
    memcpy(p, &n, 8), p += 8;
    const char *inner[2][2] = {{"a", "bc"}, {"def", NULL}};
    uint64_t counts[2] = {2, 1};
    for (int i = 0; i < 2; i++) {
        t = GGUF_TYPE_STRING;
        memcpy(p, &t, 4), p += 4;
        memcpy(p, &counts[i], 8), p += 8;
        for (uint64_t j = 0; j < counts[i]; j++) {
            uint64_t l = strlen(inner[i][j]);
            memcpy(p, &l, 8), p += 8;
            memcpy(p, inner[i][j], l), p += l;
        }
    }
    return (size_t)(p - buf);
}

static keel_status build_small(uint32_t alignment, void **data, size_t *size)
{
    gguf_writer *w = NULL;
    keel_status st = gguf_writer_open(&w);
    if (st) return st;
    for (int i = 0; i < 68; i++)
        g_t2[i] = (uint8_t)(i * 7);
    const float fa[3] = {0.5f, -1.5f, 2.25f};
    const int32_t ia[4] = {-1, 0, 1, 2147483647};
    const uint8_t ba[3] = {1, 0, 1};
    const double da[2] = {1e300, -2.5};
    const uint64_t ua[2] = {0, UINT64_MAX};
    const char *strs[4] = {"hello", "", "w\xc3\xb6rld", "x"};
    uint8_t nested[128];
    size_t nn = nested_payload(nested);
    int64_t ne0[2] = {3, 2}, ne1[1] = {4}, ne2[2] = {32, 2}, ne3[4] = {5, 1, 1, 2};
    if ((alignment != GGUF_DEFAULT_ALIGNMENT && (st = gguf_writer_set_alignment(w, alignment))) ||
        (st = gguf_writer_add_str(w, "general.architecture", "llama")) ||
        (st = gguf_writer_add_u8(w, "t.u8", 200)) || (st = gguf_writer_add_i8(w, "t.i8", -100)) ||
        (st = gguf_writer_add_u16(w, "t.u16", 60000)) ||
        (st = gguf_writer_add_i16(w, "t.i16", -30000)) ||
        (st = gguf_writer_add_u32(w, "t.u32", 4000000000u)) ||
        (st = gguf_writer_add_i32(w, "t.i32", -2000000000)) ||
        (st = gguf_writer_add_f32(w, "t.f32", 3.5f)) ||
        (st = gguf_writer_add_bool(w, "t.bool", true)) ||
        (st = gguf_writer_add_u64(w, "t.u64", UINT64_MAX)) ||
        (st = gguf_writer_add_i64(w, "t.i64", INT64_MIN)) ||
        (st = gguf_writer_add_f64(w, "t.f64", -1.0 / 3.0)) ||
        (st = gguf_writer_add_strn(w, "t.bin", "a\0b", 3)) ||
        (st = gguf_writer_add_str(w, "t.empty", "")) ||
        (st = gguf_writer_add_arr(w, "a.f32", GGUF_TYPE_FLOAT32, fa, 3)) ||
        (st = gguf_writer_add_arr(w, "a.i32", GGUF_TYPE_INT32, ia, 4)) ||
        (st = gguf_writer_add_arr(w, "a.bool", GGUF_TYPE_BOOL, ba, 3)) ||
        (st = gguf_writer_add_arr(w, "a.f64", GGUF_TYPE_FLOAT64, da, 2)) ||
        (st = gguf_writer_add_arr(w, "a.u64", GGUF_TYPE_UINT64, ua, 2)) ||
        (st = gguf_writer_add_arr(w, "a.empty", GGUF_TYPE_UINT8, NULL, 0)) ||
        (st = gguf_writer_add_arr_str(w, "a.str", strs, NULL, 4)) ||
        (st = gguf_writer_add_raw(w, "a.nested", GGUF_TYPE_ARRAY, nested, nn)) ||
        (st = gguf_writer_add_tensor(w, "t0", KEEL_DTYPE_F32, 2, ne0, g_t0, sizeof g_t0)) ||
        (st = gguf_writer_add_tensor(w, "t1.f16", KEEL_DTYPE_F16, 1, ne1, g_t1, sizeof g_t1)) ||
        (st = gguf_writer_add_tensor(w, "blk.0.q8", KEEL_DTYPE_Q8_0, 2, ne2, g_t2, sizeof g_t2)) ||
        (st = gguf_writer_add_tensor(w, "t3", KEEL_DTYPE_I32, 4, ne3, g_t3, sizeof g_t3)))
        goto done;
    st = gguf_writer_write_mem(w, data, size);
done:
    gguf_writer_close(w);
    return st;
}

static void check_small(const gguf *g, uint32_t alignment)
{
    char err[BASE_ERR_CAP] = "";
    assert_int_equal(gguf_version(g), 3);
    assert_int_equal(gguf_alignment(g), alignment);
    assert_int_equal(gguf_n_kv(g), alignment == 32 ? 22 : 23);
    assert_int_equal(gguf_n_tensors(g), 4);
    const char *s;
    size_t n;
    assert_ok(gguf_get_str(g, "general.architecture", &s, &n, err));
    assert_true(gguf_str_eq(s, n, "llama"));
    int64_t i64;
    double d;
    uint32_t u32;
    int32_t i32;
    float f32;
    bool b;
    assert_ok(gguf_get_int(g, "t.u8", &i64, err));
    assert_int_equal(i64, 200);
    assert_ok(gguf_get_int(g, "t.i8", &i64, err));
    assert_int_equal(i64, -100);
    assert_ok(gguf_get_int(g, "t.u16", &i64, err));
    assert_int_equal(i64, 60000);
    assert_ok(gguf_get_int(g, "t.i16", &i64, err));
    assert_int_equal(i64, -30000);
    assert_ok(gguf_get_u32(g, "t.u32", &u32, err));
    assert_int_equal(u32, 4000000000u);
    assert_ok(gguf_get_int(g, "t.u32", &i64, err));
    assert_int_equal(i64, 4000000000ll);
    assert_ok(gguf_get_i32(g, "t.i32", &i32, err));
    assert_int_equal(i32, -2000000000);
    assert_ok(gguf_get_f32(g, "t.f32", &f32, err));
    assert_true(f32 == 3.5f);
    assert_ok(gguf_get_bool(g, "t.bool", &b, err));
    assert_true(b);
    assert_status(gguf_get_int(g, "t.u64", &i64, err), KEEL_ERANGE);
    assert_ok(gguf_get_int(g, "t.i64", &i64, err));
    assert_true(i64 == INT64_MIN);
    assert_ok(gguf_get_float(g, "t.f64", &d, err));
    assert_true(d == -1.0 / 3.0);
    assert_ok(gguf_get_float(g, "t.f32", &d, err));
    assert_true(d == 3.5);
    assert_ok(gguf_get_str(g, "t.bin", &s, &n, err));
    assert_int_equal(n, 3);
    assert_memory_equal(s, "a\0b", 3);
    assert_ok(gguf_get_str(g, "t.empty", &s, &n, err));
    assert_int_equal(n, 0);
    const gguf_value *v = gguf_find_value(g, "t.u64");
    assert_non_null(v);
    uint64_t u64;
    memcpy(&u64, v->data, 8);
    assert_true(u64 == UINT64_MAX);

    /* type and presence errors, with details */
    assert_status(gguf_get_u32(g, "t.i32", &u32, err), KEEL_EFORMAT);
    assert_string_equal(err, "key t.i32: type i32, want u32");
    assert_status(gguf_get_u32(g, "llama.block_count", &u32, err), KEEL_ENOENT);
    assert_string_equal(err, "missing key llama.block_count");
    assert_status(gguf_get_int(g, "t.f32", &i64, err), KEEL_EFORMAT);
    assert_status(gguf_get_str(g, "t.u8", &s, &n, err), KEEL_EFORMAT);
    assert_status(gguf_get_arr(g, "t.u8", GGUF_TYPE_COUNT_, &v, err), KEEL_EFORMAT);
    assert_status(gguf_get_arr(g, "a.f32", GGUF_TYPE_INT32, &v, err), KEEL_EFORMAT);
    assert_string_equal(err, "key a.f32: array of f32, want array of i32");

    /* arrays */
    assert_ok(gguf_get_arr(g, "a.f32", GGUF_TYPE_FLOAT32, &v, err));
    assert_int_equal(v->n, 3);
    assert_ok(gguf_arr_float(v, 1, &d));
    assert_true(d == -1.5);
    assert_status(gguf_arr_float(v, 3, &d), KEEL_ERANGE);
    assert_status(gguf_arr_int(v, 0, &i64), KEEL_EINVAL);
    assert_ok(gguf_get_arr(g, "a.i32", GGUF_TYPE_INT32, &v, err));
    assert_ok(gguf_arr_int(v, 3, &i64));
    assert_int_equal(i64, 2147483647);
    assert_ok(gguf_arr_int(v, 0, &i64));
    assert_int_equal(i64, -1);
    assert_ok(gguf_get_arr(g, "a.bool", GGUF_TYPE_BOOL, &v, err));
    assert_ok(gguf_arr_int(v, 1, &i64));
    assert_int_equal(i64, 0);
    assert_ok(gguf_arr_int(v, 2, &i64));
    assert_int_equal(i64, 1);
    assert_ok(gguf_get_arr(g, "a.f64", GGUF_TYPE_FLOAT64, &v, err));
    assert_ok(gguf_arr_float(v, 0, &d));
    assert_true(d == 1e300);
    assert_ok(gguf_get_arr(g, "a.u64", GGUF_TYPE_UINT64, &v, err));
    assert_status(gguf_arr_int(v, 1, &i64), KEEL_ERANGE);
    assert_ok(gguf_get_arr(g, "a.empty", GGUF_TYPE_UINT8, &v, err));
    assert_int_equal(v->n, 0);
    assert_ok(gguf_get_arr(g, "a.str", GGUF_TYPE_STRING, &v, err));
    assert_int_equal(v->n, 4);
    assert_non_null(v->offs);
    const char *expect[4] = {"hello", "", "w\xc3\xb6rld", "x"};
    for (int i = 3; i >= 0; i--) {
        assert_ok(gguf_arr_str(v, (uint64_t)i, &s, &n));
        assert_true(gguf_str_eq(s, n, expect[i]));
    }
    assert_status(gguf_arr_str(v, 4, &s, &n), KEEL_ERANGE);
    assert_ok(gguf_get_arr(g, "a.nested", GGUF_TYPE_ARRAY, &v, err));
    assert_int_equal(v->n, 2);
    gguf_value inner;
    assert_ok(gguf_arr_elem(v, 1, &inner));
    assert_int_equal(inner.type, GGUF_TYPE_ARRAY);
    assert_int_equal(inner.arr_type, GGUF_TYPE_STRING);
    assert_int_equal(inner.n, 1);
    assert_null(inner.offs);
    assert_ok(gguf_arr_str(&inner, 0, &s, &n));
    assert_true(gguf_str_eq(s, n, "def"));
    assert_ok(gguf_arr_elem(v, 0, &inner));
    assert_ok(gguf_arr_str(&inner, 1, &s, &n));
    assert_true(gguf_str_eq(s, n, "bc"));

    /* iteration: keys in insertion order, index lookups agree */
    for (int64_t i = 0; i < gguf_n_kv(g); i++) {
        const char *k = gguf_key_at(g, i);
        assert_non_null(k);
        assert_int_equal(gguf_find_key(g, k), i);
        assert_ptr_equal(gguf_value_at(g, i), gguf_find_value(g, k));
    }
    assert_null(gguf_key_at(g, -1));
    assert_null(gguf_key_at(g, gguf_n_kv(g)));
    assert_int_equal(gguf_find_key(g, "nope"), -1);

    /* tensors */
    const gguf_tensor *t;
    assert_ok(gguf_get_tensor(g, "t0", &t, err));
    assert_int_equal(t->dtype, KEEL_DTYPE_F32);
    assert_int_equal(t->n_dims, 2);
    assert_int_equal(t->ne[0], 3);
    assert_int_equal(t->ne[1], 2);
    assert_int_equal(t->ne[2], 1);
    assert_int_equal(t->nbytes, sizeof g_t0);
    assert_memory_equal(t->data, g_t0, sizeof g_t0);
    assert_int_equal(t->offset, 0);
    t = gguf_find_tensor(g, "t1.f16");
    assert_non_null(t);
    assert_memory_equal(t->data, g_t1, sizeof g_t1);
    assert_int_equal(t->offset, (24 + alignment - 1) / alignment * alignment);
    t = gguf_find_tensor(g, "blk.0.q8");
    assert_non_null(t);
    assert_int_equal(t->dtype, KEEL_DTYPE_Q8_0);
    assert_int_equal(t->nbytes, 68);
    assert_memory_equal(t->data, g_t2, 68);
    t = gguf_find_tensor(g, "t3");
    assert_non_null(t);
    assert_int_equal(t->n_dims, 4);
    assert_int_equal(t->ne[3], 2);
    assert_memory_equal(t->data, g_t3, sizeof g_t3);
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *ti = gguf_tensor_at(g, i);
        assert_ptr_equal(gguf_find_tensor(g, ti->name), ti);
        assert_int_equal(((const uint8_t *)ti->data - gguf_bytes(g)) % alignment, 0);
        assert_int_equal(ti->offset % alignment, 0);
    }
    assert_null(gguf_find_tensor(g, "missing"));
    assert_status(gguf_get_tensor(g, "blk.9.x", &t, err), KEEL_ENOENT);
    assert_string_equal(err, "missing tensor blk.9.x");
}

static void test_roundtrip_all_types(void **state)
{
    (void)state;
    uint32_t aligns[3] = {32, 64, 8};
    for (int a = 0; a < 3; a++) {
        void *data;
        size_t size;
        assert_ok(build_small(aligns[a], &data, &size));
        gguf *g = NULL;
        char err[BASE_ERR_CAP] = "";
        keel_status st = gguf_open_owned(data, size, &g, err);
        if (st) fail_msg("open: %s: %s", keel_status_name(st), err);
        check_small(g, aligns[a]);
        assert_int_equal(gguf_size(g), size);
        gguf_close(g);
    }
    gguf_close(NULL);
}

static void test_write_file(void **state)
{
    (void)state;
    gguf_writer *w;
    assert_ok(gguf_writer_open(&w));
    float x[64];
    for (int i = 0; i < 64; i++)
        x[i] = (float)i;
    int64_t ne[2] = {8, 8};
    assert_ok(gguf_writer_add_u32(w, "k", 7));
    assert_ok(gguf_writer_add_tensor(w, "x", KEEL_DTYPE_F32, 2, ne, x, sizeof x));
    /* duplicates and bad tensors are refused and change nothing */
    assert_status(gguf_writer_add_u32(w, "k", 8), KEEL_EINVAL);
    assert_string_equal(gguf_writer_last_error(w), "duplicate key k");
    assert_status(gguf_writer_add_tensor(w, "x", KEEL_DTYPE_F32, 2, ne, x, sizeof x), KEEL_EINVAL);
    assert_status(gguf_writer_add_tensor(w, "y", KEEL_DTYPE_F32, 2, ne, x, 4), KEEL_EINVAL);
    assert_status(gguf_writer_add_tensor(w, "y", KEEL_DTYPE_Q8_0, 2, ne, x, 4), KEEL_EINVAL);
    assert_status(gguf_writer_add_tensor(w, "y", (keel_dtype)4, 2, ne, x, 4), KEEL_EINVAL);
    assert_status(gguf_writer_add_tensor(w, "y", KEEL_DTYPE_F32, 5, ne, x, 4), KEEL_EINVAL);
    assert_status(gguf_writer_add_tensor(w, "", KEEL_DTYPE_F32, 2, ne, x, sizeof x), KEEL_EINVAL);
    assert_status(gguf_writer_set_alignment(w, 64), KEEL_EINVAL); /* after tensors */
    assert_status(gguf_writer_add_arr(w, "s", GGUF_TYPE_STRING, x, 1), KEEL_EINVAL);
    uint8_t bad[4] = {1, 2, 3, 4};
    assert_status(gguf_writer_add_raw(w, "r", GGUF_TYPE_STRING, bad, 4), KEEL_EINVAL);
    size_t size;
    assert_ok(gguf_writer_size(w, &size));
    char path[] = "/tmp/keel_gguf_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_ok(gguf_writer_write_path(w, path));
    uint8_t small[16];
    assert_status(gguf_writer_write_buf(w, small, sizeof small), KEEL_ERANGE);
    gguf_writer_close(w);
    gguf *g;
    char err[BASE_ERR_CAP];
    assert_ok(gguf_open_file(path, &g, err));
    assert_int_equal(gguf_size(g), size);
    assert_int_equal(gguf_n_kv(g), 1);
    const gguf_tensor *t = gguf_find_tensor(g, "x");
    assert_non_null(t);
    assert_memory_equal(t->data, x, sizeof x);
    assert_int_equal(gguf_data_offset(g) % 32, 0);
    assert_true(gguf_mapped(g));
    gguf_close(g);
    /* read into memory: the same file, not mapped */
    assert_ok(gguf_read_file(path, &g, err));
    assert_false(gguf_mapped(g));
    assert_int_equal(gguf_size(g), size);
    t = gguf_find_tensor(g, "x");
    assert_non_null(t);
    assert_memory_equal(t->data, x, sizeof x);
    gguf_close(g);
    /* an empty file: both openers refuse it as such */
    assert_int_equal(truncate(path, 0), 0);
    assert_status(gguf_open_file(path, &g, err), KEEL_EFORMAT);
    assert_status(gguf_read_file(path, &g, err), KEEL_EFORMAT);
    assert_null(g);
    unlink(path);
    assert_status(gguf_open_file(path, &g, err), KEEL_EIO);
    assert_null(g);
    assert_non_null(strstr(err, path));
    assert_status(gguf_read_file(path, &g, err), KEEL_EIO);
    assert_null(g);
    assert_status(gguf_open_file("/tmp", &g, err), KEEL_EIO);
    assert_status(gguf_read_file("/tmp", &g, err), KEEL_EIO);
    assert_non_null(strstr(err, "not a regular file"));
}

/* Deferred tensors: bytes from a fill callback, in file order. */
typedef struct fill_ctx {
    int calls;
    int64_t last;    /* index of the previous call */
    int64_t fail_at; /* index whose fill fails, -1 none */
} fill_ctx;

static keel_status fill_pattern(void *user, int64_t index, const char *name, void *buf,
                                size_t nbytes)
{
    fill_ctx *c = user;
    assert_true(index > c->last); /* file order */
    c->last = index;
    c->calls++;
    if (index == c->fail_at) return KEEL_ENOMEM;
    uint8_t *b = buf;
    for (size_t i = 0; i < nbytes; i++)
        b[i] = (uint8_t)(i * 7 + (size_t)name[0]);
    return KEEL_OK;
}

static void test_write_deferred(void **state)
{
    (void)state;
    gguf_writer *w;
    assert_ok(gguf_writer_open(&w));
    int64_t ne_a[2] = {8, 3}, ne_b[1] = {64};
    float plain[5] = {1, 2, 3, 4, 5};
    int64_t ne_p[1] = {5};
    assert_ok(gguf_writer_add_tensor_deferred(w, "a", KEEL_DTYPE_F32, 2, ne_a));
    assert_ok(gguf_writer_add_tensor(w, "p", KEEL_DTYPE_F32, 1, ne_p, plain, sizeof plain));
    assert_ok(gguf_writer_add_tensor_deferred(w, "b", KEEL_DTYPE_Q8_0, 1, ne_b));
    assert_status(gguf_writer_add_tensor_deferred(w, "c", KEEL_DTYPE_Q8_0, 1, ne_p), KEEL_EINVAL);
    void *data;
    size_t size;
    assert_status(gguf_writer_write_mem(w, &data, &size), KEEL_EINVAL); /* no fill yet */
    fill_ctx c = {0, -1, 2};
    gguf_writer_set_fill(w, fill_pattern, &c);
    assert_status(gguf_writer_write_mem(w, &data, &size), KEEL_ENOMEM); /* fill of "b" fails */
    assert_null(data);
    assert_int_equal(c.calls, 2);
    c = (fill_ctx){0, -1, -1};
    assert_ok(gguf_writer_write_mem(w, &data, &size));
    assert_int_equal(c.calls, 2);
    char path[] = "/tmp/keel_gguf_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    c = (fill_ctx){0, -1, -1};
    assert_ok(gguf_writer_write_path(w, path));
    gguf_writer_close(w);
    size_t fsize;
    void *fdata = test_read_file(path, &fsize);
    assert_non_null(fdata);
    assert_int_equal(fsize, size);
    assert_memory_equal(fdata, data, size); /* file and memory outputs agree */
    free(fdata);
    unlink(path);
    gguf *g;
    char err[BASE_ERR_CAP];
    assert_ok(gguf_open_owned(data, size, &g, err));
    const gguf_tensor *a = gguf_find_tensor(g, "a"), *b = gguf_find_tensor(g, "b");
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(a->nbytes, 96);
    assert_int_equal(b->nbytes, 68);
    const uint8_t *ab = a->data, *bb = b->data;
    for (size_t i = 0; i < a->nbytes; i++)
        assert_int_equal(ab[i], (uint8_t)(i * 7 + 'a'));
    for (size_t i = 0; i < b->nbytes; i++)
        assert_int_equal(bb[i], (uint8_t)(i * 7 + 'b'));
    assert_memory_equal(gguf_find_tensor(g, "p")->data, plain, sizeof plain);
    gguf_close(g);
}

/* ---- fixtures ------------------------------------------------------------ */

static void walk_all(const gguf *g)
{
    for (int64_t i = 0; i < gguf_n_kv(g); i++) {
        const gguf_value *v = gguf_value_at(g, i);
        if (v->type == GGUF_TYPE_ARRAY) {
            for (uint64_t j = 0; j < v->n && j < 100000; j++) {
                gguf_value e;
                assert_ok(gguf_arr_elem(v, j, &e));
                assert_true(e.data >= gguf_bytes(g) &&
                            e.data + e.nbytes <= gguf_bytes(g) + gguf_size(g));
            }
        }
    }
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        const uint8_t *p = t->data;
        assert_true(p >= gguf_bytes(g) && p + t->nbytes <= gguf_bytes(g) + gguf_size(g));
    }
}

static void test_fixture_stories(void **state)
{
    (void)state;
    const char *path = test_fixture("models/stories260K.gguf");
    if (!path) return;
    gguf *g;
    char err[BASE_ERR_CAP];
    assert_ok(gguf_open_file(path, &g, err));
    assert_int_equal(gguf_n_tensors(g), 48);
    assert_int_equal(gguf_n_kv(g), 19);
    int64_t n;
    assert_ok(gguf_get_int(g, "llama.block_count", &n, err));
    assert_int_equal(n, 5);
    float eps;
    assert_ok(gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &eps, err));
    assert_close(eps, 1e-5, 1e-9);
    const gguf_value *toks;
    assert_ok(gguf_get_arr(g, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &toks, err));
    assert_int_equal(toks->n, 512);
    const char *s;
    size_t sl;
    assert_ok(gguf_arr_str(toks, 261, &s, &sl));
    assert_true(gguf_str_eq(s, sl,
                            "\xe2\x96\x81"
                            "a"));
    const gguf_tensor *t = gguf_find_tensor(g, "token_embd.weight");
    assert_non_null(t);
    assert_int_equal(t->ne[0], 64);
    assert_int_equal(t->ne[1], 512);
    assert_int_equal(t->nbytes, 64 * 512 * 4);
    t = gguf_find_tensor(g, "blk.4.ffn_down.weight");
    assert_non_null(t);
    assert_int_equal(t->ne[0], 172);
    assert_int_equal(t->ne[1], 64);
    walk_all(g);
    gguf_close(g);
}

static void test_fixture_all_models(void **state)
{
    (void)state;
    const char *p = test_fixture("models/stories260K.gguf");
    if (!p) return;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", p);
    *strrchr(dir, '/') = '\0';
    DIR *d = opendir(dir);
    assert_non_null(d);
    int opened = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 5 || strcmp(e->d_name + l - 5, ".gguf") != 0) continue;
        char path[8192];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        gguf *g;
        char err[BASE_ERR_CAP] = "";
        keel_status st = gguf_open_file(path, &g, err);
        if (st) fail_msg("%s: %s: %s", e->d_name, keel_status_name(st), err);
        const char *arch;
        size_t n;
        assert_ok(gguf_get_str(g, "general.architecture", &arch, &n, err));
        walk_all(g);
        gguf_close(g);
        opened++;
    }
    closedir(d);
    assert_true(opened >= 11);
}

/* ---- bad input ------------------------------------------------------------ */

/* Opens an exact-size copy (so ASan sees any over-read). */
static keel_status open_copy(const uint8_t *data, size_t len, char *err)
{
    uint8_t *copy = malloc(len ? len : 1);
    memcpy(copy, data, len);
    gguf *g = NULL;
    keel_status st = gguf_open_buffer(copy, len, &g, err);
    if (st == KEEL_OK) {
        walk_all(g);
        gguf_close(g);
    } else {
        assert_null(g);
        assert_true(err[0] != '\0');
    }
    free(copy);
    return st;
}

static void test_every_truncation(void **state)
{
    (void)state;
    void *data;
    size_t size;
    assert_ok(build_small(32, &data, &size));
    gguf *g;
    assert_ok(gguf_open_buffer(data, size, &g, NULL));
    const gguf_tensor *last = gguf_tensor_at(g, gguf_n_tensors(g) - 1);
    size_t data_end = (size_t)((const uint8_t *)last->data - (const uint8_t *)data) + last->nbytes;
    gguf_close(g);
    for (size_t len = 0; len < size; len++) {
        char err[BASE_ERR_CAP] = "";
        keel_status st = open_copy(data, len, err);
        if (len < data_end) {
            if (st == KEEL_OK) fail_msg("truncated to %zu of %zu bytes opened", len, size);
            assert_true(st == KEEL_EFORMAT);
        }
    }
    base_free(data, size);
}

static void test_random_bitflips(void **state)
{
    (void)state;
    void *data;
    size_t size;
    assert_ok(build_small(32, &data, &size));
    uint8_t *buf = malloc(size);
    base_rng r;
    base_rng_seed(&r, 1234);
    int ok = 0;
    for (int it = 0; it < 1000; it++) {
        memcpy(buf, data, size);
        int flips = 1 + (int)base_rng_below(&r, 4);
        for (int f = 0; f < flips; f++) {
            /* bias towards the header, where the structure lives */
            size_t lim = base_rng_below(&r, 4) ? (size < 900 ? size : 900) : size;
            size_t pos = (size_t)base_rng_below(&r, lim);
            buf[pos] ^= (uint8_t)(1u << base_rng_below(&r, 8));
        }
        char err[BASE_ERR_CAP] = "";
        keel_status st = open_copy(buf, size, err);
        assert_true(st == KEEL_OK || st == KEEL_EFORMAT || st == KEEL_EUNSUPPORTED);
        ok += st == KEEL_OK;
    }
    assert_true(ok > 0 && ok < 1000);
    free(buf);
    base_free(data, size);
}

/* A hand-made header: magic, version, counts, then body bytes. */
typedef struct hbuf {
    uint8_t b[512];
    size_t n;
} hbuf;

static void h_u32(hbuf *h, uint32_t v)
{
    memcpy(h->b + h->n, &v, 4);
    h->n += 4;
}

static void h_u64(hbuf *h, uint64_t v)
{
    memcpy(h->b + h->n, &v, 8);
    h->n += 8;
}

static void h_str(hbuf *h, const char *s)
{
    h_u64(h, strlen(s));
    memcpy(h->b + h->n, s, strlen(s));
    h->n += strlen(s);
}

static void h_head(hbuf *h, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
    h->n = 0;
    memcpy(h->b, "GGUF", 4);
    h->n = 4;
    h_u32(h, version);
    h_u64(h, n_tensors);
    h_u64(h, n_kv);
}

static void h_pad(hbuf *h, size_t n)
{
    memset(h->b + h->n, 0, n);
    h->n += n;
}

static void expect_fail(const hbuf *h, keel_status want, const char *msg_part)
{
    char err[BASE_ERR_CAP] = "";
    test_alloc_install(0);
    keel_status st = open_copy(h->b, h->n, err);
    int64_t allocs = test_alloc_count();
    test_alloc_uninstall();
    if (st != want)
        fail_msg("status %s, want %s (%s)", keel_status_name(st), keel_status_name(want), err);
    if (msg_part && !strstr(err, msg_part)) fail_msg("message '%s' lacks '%s'", err, msg_part);
    (void)allocs;
}

/* Counts allocations made by a failing open. */
static int64_t fail_allocs(const hbuf *h)
{
    char err[BASE_ERR_CAP] = "";
    test_alloc_install(0);
    keel_status st = open_copy(h->b, h->n, err);
    int64_t allocs = test_alloc_count();
    assert_true(test_alloc_live_bytes() == 0);
    test_alloc_uninstall();
    assert_int_not_equal(st, KEEL_OK);
    return allocs;
}

static void test_malformed_headers(void **state)
{
    (void)state;
    hbuf h;
    /* magic, versions */
    h_head(&h, 3, 0, 0);
    memcpy(h.b, "GGUG", 4);
    expect_fail(&h, KEEL_EFORMAT, "bad magic");
    h_head(&h, 1, 0, 0);
    expect_fail(&h, KEEL_EUNSUPPORTED, "v1");
    h_head(&h, 0x03000000u, 0, 0);
    expect_fail(&h, KEEL_EUNSUPPORTED, "big-endian");
    h_head(&h, 4, 0, 0);
    expect_fail(&h, KEEL_EUNSUPPORTED, "version 4");
    h_head(&h, 2, 0, 0);
    char err[BASE_ERR_CAP];
    assert_ok(open_copy(h.b, h.n, err)); /* v2, empty: fine */

    /* oversized counts fail before the tables are allocated */
    h_head(&h, 3, 0, (uint64_t)1 << 60);
    expect_fail(&h, KEEL_EFORMAT, "keys cannot fit");
    assert_true(fail_allocs(&h) <= 1); /* only the gguf object */
    h_head(&h, 3, UINT64_MAX, 0);
    expect_fail(&h, KEEL_EFORMAT, "tensors cannot fit");
    assert_true(fail_allocs(&h) <= 1);

    /* huge string length */
    h_head(&h, 3, 0, 1);
    h_u64(&h, (uint64_t)1 << 62);
    h_pad(&h, 16);
    expect_fail(&h, KEEL_EFORMAT, "key 0: key length 4611686018427387904 past end of file");
    /* huge array count */
    h_head(&h, 3, 0, 1);
    h_str(&h, "a");
    h_u32(&h, GGUF_TYPE_ARRAY);
    h_u32(&h, GGUF_TYPE_UINT32);
    h_u64(&h, (uint64_t)1 << 62);
    expect_fail(&h, KEEL_EFORMAT, "key a: array of 4611686018427387904 u32");
    assert_true(fail_allocs(&h) <= 1);
    h_head(&h, 3, 0, 1);
    h_str(&h, "a");
    h_u32(&h, GGUF_TYPE_ARRAY);
    h_u32(&h, GGUF_TYPE_STRING);
    h_u64(&h, 1000);
    h_pad(&h, 16);
    expect_fail(&h, KEEL_EFORMAT, "array of 1000 string");
    /* nested too deep */
    h_head(&h, 3, 0, 1);
    h_str(&h, "deep");
    h_u32(&h, GGUF_TYPE_ARRAY);
    for (int i = 0; i < 5; i++) {
        h_u32(&h, GGUF_TYPE_ARRAY);
        h_u64(&h, 1);
    }
    h_pad(&h, 16);
    expect_fail(&h, KEEL_EFORMAT, "nested deeper");
    /* unknown value type */
    h_head(&h, 3, 0, 1);
    h_str(&h, "k");
    h_u32(&h, 13);
    h_pad(&h, 8);
    expect_fail(&h, KEEL_EFORMAT, "key k: unknown value type 13");
    /* empty key, key with NUL */
    h_head(&h, 3, 0, 1);
    h_u64(&h, 0);
    h_u32(&h, GGUF_TYPE_UINT8);
    h_pad(&h, 4);
    expect_fail(&h, KEEL_EFORMAT, "length 0");
    h_head(&h, 3, 0, 1);
    h_u64(&h, 3);
    memcpy(h.b + h.n, "a\0b", 3);
    h.n += 3;
    h_u32(&h, GGUF_TYPE_UINT8);
    h_pad(&h, 4);
    expect_fail(&h, KEEL_EFORMAT, "NUL");
    /* duplicate key */
    h_head(&h, 3, 0, 2);
    for (int i = 0; i < 2; i++) {
        h_str(&h, "dup");
        h_u32(&h, GGUF_TYPE_UINT8);
        h_pad(&h, 1);
    }
    expect_fail(&h, KEEL_EFORMAT, "duplicate key dup");
    /* bad alignment values */
    h_head(&h, 3, 0, 1);
    h_str(&h, "general.alignment");
    h_u32(&h, GGUF_TYPE_UINT32);
    h_u32(&h, 48);
    expect_fail(&h, KEEL_EFORMAT, "power of two");
    h_head(&h, 3, 0, 1);
    h_str(&h, "general.alignment");
    h_u32(&h, GGUF_TYPE_STRING);
    h_str(&h, "32");
    expect_fail(&h, KEEL_EFORMAT, "want an integer");

    /* tensor infos */
    struct {
        uint32_t n_dims;
        uint64_t ne0;
        uint32_t type;
        uint64_t offset;
        keel_status want;
        const char *msg;
    } cases[] = {
        {5, 4, 0, 0, KEEL_EFORMAT, "tensor w: n_dims 5 outside 1..4"},
        {0, 4, 0, 0, KEEL_EFORMAT, "n_dims 0"},
        {1, 0, 0, 0, KEEL_EFORMAT, "ne[0] = 0"},
        {1, (uint64_t)1 << 63, 0, 0, KEEL_EFORMAT, "ne[0]"},
        {1, 4, 99, 0, KEEL_EUNSUPPORTED, "tensor w: unknown dtype id 99"},
        {1, 4, 4, 0, KEEL_EUNSUPPORTED, "unknown dtype id 4"},
        {1, 33, 8, 0, KEEL_EFORMAT, "not a multiple of the q8_0 block"},
        {1, 4, 0, 8, KEEL_EFORMAT, "offset 8 not a multiple of the alignment 32"},
        {1, 4, 0, 928, KEEL_EFORMAT, "tensor w: offset 928 past end of file ("},
        {1, 64, 0, 0, KEEL_EFORMAT, "tensor w: 256 bytes at offset 0 run past end of file"},
        {2, (uint64_t)1 << 40, 0, 0, KEEL_EFORMAT, "overflows"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        h_head(&h, 3, 1, 0);
        h_str(&h, "w");
        h_u32(&h, cases[i].n_dims);
        for (uint32_t d = 0; d < cases[i].n_dims && d < 5; d++)
            h_u64(&h, d == 0 ? cases[i].ne0 : cases[i].ne0);
        h_u32(&h, cases[i].type);
        h_u64(&h, cases[i].offset);
        h_pad(&h, 64 - h.n % 32 + 16); /* data section: 16..48 bytes */
        expect_fail(&h, cases[i].want, cases[i].msg);
    }
    /* duplicate tensor names */
    h_head(&h, 3, 2, 0);
    for (int i = 0; i < 2; i++) {
        h_str(&h, "w");
        h_u32(&h, 1);
        h_u64(&h, 4);
        h_u32(&h, 0);
        h_u64(&h, 0);
    }
    h_pad(&h, 64);
    expect_fail(&h, KEEL_EFORMAT, "duplicate tensor w");
}

/* general.alignment (issue 8 item 6): the spec requires a multiple of 8;
 * 1, 2 and 4 left f32 data at odd addresses and were accepted. Each file
 * here is well formed for its alignment: data padded to it. */
static void test_alignment_values(void **state)
{
    (void)state;
    const float vals[3] = {1.5f, -2.0f, 3.25f};
    const uint32_t aligns[] = {1, 2, 4, 8, 16, 64};
    for (size_t i = 0; i < BASE_ARRAY_LEN(aligns); i++) {
        uint32_t a = aligns[i];
        hbuf h;
        h_head(&h, 3, 1, 1);
        h_str(&h, "general.alignment");
        h_u32(&h, GGUF_TYPE_UINT32);
        h_u32(&h, a);
        h_str(&h, "w");
        h_u32(&h, 1);
        h_u64(&h, 3);
        h_u32(&h, KEEL_DTYPE_F32);
        h_u64(&h, 0);
        h_pad(&h, (a - h.n % a) % a);
        size_t data_off = h.n;
        memcpy(h.b + h.n, vals, sizeof vals);
        h.n += sizeof vals;
        h_pad(&h, (a - sizeof vals % a) % a);
        if (a < 8) {
            char want[128];
            snprintf(want, sizeof want,
                     "key general.alignment: %u is not a power of two in 8..2^30 (GGUF requires "
                     "a multiple of 8)",
                     a);
            expect_fail(&h, KEEL_EFORMAT, want);
            continue;
        }
        gguf *g = NULL;
        char err[BASE_ERR_CAP] = "";
        keel_status st = gguf_open_buffer(h.b, h.n, &g, err);
        if (st) fail_msg("alignment %u: %s", a, err);
        assert_int_equal(gguf_alignment(g), a);
        assert_int_equal(gguf_data_offset(g), data_off);
        assert_memory_equal(gguf_tensor_at(g, 0)->data, vals, sizeof vals);
        gguf_close(g);
    }
    /* the writer does not make what the reader refuses */
    gguf_writer *w;
    assert_ok(gguf_writer_open(&w));
    for (uint32_t a = 1; a < 8; a *= 2) {
        assert_status(gguf_writer_set_alignment(w, a), KEEL_EINVAL);
        assert_non_null(strstr(gguf_writer_last_error(w), "not a power of two in 8..2^20"));
    }
    assert_ok(gguf_writer_set_alignment(w, 8));
    gguf_writer_close(w);
}

/* Byte offset of the dtype field of tensor info `name` in a file. */
static size_t info_dtype_at(const uint8_t *b, size_t size, const char *name)
{
    size_t n = strlen(name);
    for (size_t i = 0; i + 8 + n + 4 <= size; i++) {
        uint64_t len;
        memcpy(&len, b + i, 8);
        if (len != n || memcmp(b + i + 8, name, n) != 0) continue;
        uint32_t n_dims;
        memcpy(&n_dims, b + i + 8 + n, 4);
        return i + 8 + n + 4 + 8 * (size_t)n_dims;
    }
    fail_msg("tensor info %s not found", name);
    return 0;
}

/* A copy of (data, size) with tensor `name`'s dtype (if dtype >= 0),
 * offset (if offset >= 0) and ne[0] (if ne0 > 0) patched, extra zero
 * bytes appended; opened, and the status returned with err. */
static keel_status open_patched(const uint8_t *data, size_t size, const char *name, int dtype,
                                int64_t offset, int64_t ne0, size_t extra, char *err)
{
    uint8_t *b = calloc(1, size + extra);
    memcpy(b, data, size);
    size_t at = info_dtype_at(b, size, name);
    if (dtype >= 0) memcpy(b + at, &(uint32_t){(uint32_t)dtype}, 4);
    if (offset >= 0) memcpy(b + at + 4, &(uint64_t){(uint64_t)offset}, 8);
    if (ne0 > 0) memcpy(b + at - 8 * 1, &(uint64_t){(uint64_t)ne0}, 8); /* 1-D tensors */
    err[0] = '\0';
    keel_status st = open_copy(b, size + extra, err);
    free(b);
    return st;
}

/* Tensor data layout (issue 8 item 7), as llama.cpp's offset-continuity
 * check requires: in file order, each tensor at the previous one's padded
 * end. Overlap, reordering, a dtype relabelled to a smaller (or larger)
 * encoding, a shrunken shape and trailing bytes are refused, each naming
 * the tensors and sizes involved. */
static void test_tensor_layout(void **state)
{
    (void)state;
    static float fa[64], fb[64];
    static uint16_t hc[64];
    for (int i = 0; i < 64; i++) {
        fa[i] = (float)i;
        fb[i] = (float)-i;
        hc[i] = tensor_f32_to_f16((float)i / 8);
    }
    gguf_writer *w;
    assert_ok(gguf_writer_open(&w));
    int64_t ne[1] = {64};
    assert_ok(gguf_writer_add_tensor(w, "tA", KEEL_DTYPE_F32, 1, ne, fa, sizeof fa));
    assert_ok(gguf_writer_add_tensor(w, "tB", KEEL_DTYPE_F32, 1, ne, fb, sizeof fb));
    assert_ok(gguf_writer_add_tensor(w, "tC", KEEL_DTYPE_F16, 1, ne, hc, sizeof hc));
    void *data;
    size_t size;
    assert_ok(gguf_writer_write_mem(w, &data, &size));
    gguf_writer_close(w);
    char err[BASE_ERR_CAP];
    gguf *g;
    assert_ok(gguf_open_buffer(data, size, &g, err));
    assert_int_equal(gguf_tensor_at(g, 1)->offset, 256);
    assert_int_equal(gguf_tensor_at(g, 2)->offset, 512);
    assert_int_equal(gguf_size(g) - gguf_data_offset(g), 640);
    gguf_close(g);
    const struct {
        const char *name;
        int dtype;
        int64_t offset, ne0;
        size_t extra;
        const char *msg;
    } cases[] = {
        /* two tensors at one offset */
        {"tB", -1, 0, 0, 0,
         "tensor tB: data at offset 0 overlaps tensor tA (256 bytes of f32 [64] at offset 0)"},
        {"tC", -1, 256, 0, 0, "tensor tC: data at offset 256 overlaps tensor tB"},
        /* data out of info order */
        {"tA", -1, 256, 0, 0,
         "tensor tA: offset 256, expected 0 (the first tensor starts the data section)"},
        /* relabelled to a smaller encoding: the next offset no longer follows */
        {"tA", KEEL_DTYPE_F16, -1, 0, 0,
         "tensor tB: offset 256, expected 128: the file leaves 256 bytes for tensor tA, which as "
         "f16 [64] needs 128"},
        {"tB", KEEL_DTYPE_Q8_0, -1, 0, 0, "tensor tC: offset 512, expected 352"},
        /* a shrunken shape, likewise */
        {"tA", -1, -1, 32, 0, "tensor tB: offset 256, expected 128"},
        /* the last tensor: checked against the end of the file */
        {"tC", KEEL_DTYPE_Q8_0, -1, 0, 0,
         "60 bytes follow the data of the last tensor tC (q8_0 [64], 68 bytes at offset 512), "
         "more than its 28 bytes of padding"},
        {"tC", KEEL_DTYPE_F32, -1, 0, 0,
         "tensor tC: 256 bytes at offset 512 run past end of file"},
        {"tC", -1, -1, 0, 64, "64 bytes follow the data of the last tensor tC"},
        /* a gap */
        {"tC", -1, 544, 0, 64, "tensor tC: offset 544, expected 512"},
    };
    for (size_t i = 0; i < BASE_ARRAY_LEN(cases); i++) {
        keel_status st = open_patched(data, size, cases[i].name, cases[i].dtype, cases[i].offset,
                                      cases[i].ne0, cases[i].extra, err);
        if (st != KEEL_EFORMAT || !strstr(err, cases[i].msg))
            fail_msg("case %zu: %s '%s', want '%s'", i, keel_status_name(st), err, cases[i].msg);
    }
    /* the last tensor's padding may be cut short by the end of the file */
    assert_ok(gguf_writer_open(&w));
    int64_t ne40[1] = {40};
    assert_ok(gguf_writer_add_tensor(w, "tA", KEEL_DTYPE_F32, 1, ne, fa, sizeof fa));
    assert_ok(gguf_writer_add_tensor(w, "tC", KEEL_DTYPE_F16, 1, ne40, hc, 80));
    void *d2;
    size_t s2;
    assert_ok(gguf_writer_write_mem(w, &d2, &s2));
    gguf_writer_close(w);
    for (size_t cut = 0; cut <= 16; cut++)
        assert_ok(open_copy(d2, s2 - cut, err));
    assert_status(open_copy(d2, s2 - 17, err), KEEL_EFORMAT);
    base_free(d2, s2);
    base_free(data, size);
}

static keel_status open_small_op(void *ctx)
{
    const uint8_t *data = ((const void **)ctx)[0];
    size_t size = *(const size_t *)((const void **)ctx)[1];
    gguf *g = NULL;
    keel_status st = gguf_open_buffer(data, size, &g, NULL);
    gguf_close(g);
    return st;
}

static keel_status write_small_op(void *ctx)
{
    (void)ctx;
    void *data;
    size_t size;
    keel_status st = build_small(64, &data, &size);
    if (st) return st;
    gguf *g;
    st = gguf_open_owned(data, size, &g, NULL); /* frees data on failure */
    gguf_close(g);
    return st;
}

static void test_alloc_sweep_gguf(void **state)
{
    (void)state;
    void *data;
    size_t size;
    assert_ok(build_small(32, &data, &size));
    const void *ctx[2] = {data, &size};
    assert_true(test_alloc_sweep(open_small_op, ctx) >= 6);
    base_free(data, size);
    assert_true(test_alloc_sweep(write_small_op, NULL) >= 10);
}

/* ---- llama2.c conversion ---------------------------------------------------- */

/* A tiny llama2.c checkpoint: weights are their own float index, so every
 * tensor's placement can be checked. */
typedef struct l2c_file {
    uint8_t *model;
    size_t model_size;
    uint8_t *tok;
    size_t tok_size;
} l2c_file;

static void make_l2c(l2c_file *f, bool shared)
{
    const int32_t dim = 8, hid = 12, nl = 2, nh = 2, nkv = 1, vocab = 6, seq = 4;
    int32_t h[7] = {dim, hid, nl, nh, nkv, shared ? vocab : -vocab, seq};
    size_t hs = dim / nh, kv = hs * nkv;
    size_t n = vocab * dim + nl * dim + nl * dim * dim + 2 * nl * dim * kv + nl * dim * dim +
               nl * dim + 3 * nl * dim * hid + dim + 2 * seq * hs / 2 + (shared ? 0 : vocab * dim);
    f->model_size = 28 + 4 * n;
    f->model = malloc(f->model_size);
    memcpy(f->model, h, 28);
    for (size_t i = 0; i < n; i++) {
        float x = (float)i;
        memcpy(f->model + 28 + 4 * i, &x, 4);
    }
    const char *pieces[6] = {"<unk>", "\n<s>\n", "\n</s>\n", "<0x0A>", " hello", "a b"};
    f->tok = malloc(1024);
    size_t o = 0;
    int32_t maxlen = 6;
    memcpy(f->tok, &maxlen, 4), o = 4;
    for (int i = 0; i < 6; i++) {
        float sc = -(float)i;
        int32_t l = (int32_t)strlen(pieces[i]);
        memcpy(f->tok + o, &sc, 4), o += 4;
        memcpy(f->tok + o, &l, 4), o += 4;
        memcpy(f->tok + o, pieces[i], (size_t)l), o += (size_t)l;
    }
    f->tok_size = o;
}

static void free_l2c(l2c_file *f)
{
    free(f->model);
    free(f->tok);
}

static float first_float(const gguf_tensor *t)
{
    float x;
    memcpy(&x, t->data, 4);
    return x;
}

static void test_llama2c_synthetic(void **state)
{
    (void)state;
    for (int shared = 0; shared < 2; shared++) {
        l2c_file f;
        make_l2c(&f, shared);
        gguf *g;
        char err[BASE_ERR_CAP] = "";
        keel_status st = llama2c_open_buffer(f.model, f.model_size, f.tok, f.tok_size, &g, err);
        if (st) fail_msg("%s", err);
        int64_t v;
        assert_ok(gguf_get_int(g, "llama.block_count", &v, err));
        assert_int_equal(v, 2);
        assert_ok(gguf_get_int(g, "llama.attention.head_count_kv", &v, err));
        assert_int_equal(v, 1);
        assert_ok(gguf_get_int(g, "llama.rope.dimension_count", &v, err));
        assert_int_equal(v, 4);
        assert_ok(gguf_get_int(g, "llama.context_length", &v, err));
        assert_int_equal(v, 4);
        assert_int_equal(gguf_n_tensors(g), 2 + 9 * 2 + (shared ? 0 : 1));
        /* float index of each block start: emb 0, rms_att 48, wq 64, wk 192,
         * wv 256, wo 320, rms_ffn 448, w1 464, w2 656, w3 848, rms_final
         * 1040, freq 1048..1063, wcls 1064 */
        struct {
            const char *name;
            float first;
            int64_t ne0, ne1;
        } want[] = {
            {"token_embd.weight", 0, 8, 6},        {"blk.0.attn_norm.weight", 48, 8, 1},
            {"blk.1.attn_norm.weight", 56, 8, 1},  {"blk.0.attn_q.weight", 64, 8, 8},
            {"blk.1.attn_q.weight", 128, 8, 8},    {"blk.0.attn_k.weight", 192, 8, 4},
            {"blk.1.attn_v.weight", 288, 8, 4},    {"blk.1.attn_output.weight", 384, 8, 8},
            {"blk.1.ffn_norm.weight", 456, 8, 1},  {"blk.1.ffn_gate.weight", 560, 8, 12},
            {"blk.0.ffn_down.weight", 656, 12, 8}, {"blk.1.ffn_up.weight", 944, 8, 12},
            {"output_norm.weight", 1040, 8, 1},
        };
        for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
            const gguf_tensor *t = gguf_find_tensor(g, want[i].name);
            if (!t) fail_msg("missing %s", want[i].name);
            assert_true(first_float(t) == want[i].first);
            assert_int_equal(t->ne[0], want[i].ne0);
            assert_int_equal(t->ne[1], want[i].ne1);
        }
        const gguf_tensor *out = gguf_find_tensor(g, "output.weight");
        if (shared) {
            assert_null(out);
        } else {
            assert_non_null(out);
            assert_true(first_float(out) == 1064);
        }
        const gguf_value *toks, *types, *scores;
        assert_ok(gguf_get_arr(g, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &toks, err));
        assert_ok(gguf_get_arr(g, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, &types, err));
        assert_ok(gguf_get_arr(g, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, &scores, err));
        const char *wt[6] = {"<unk>",
                             "<s>",
                             "</s>",
                             "<0x0A>",
                             "\xe2\x96\x81hello",
                             ("a\xe2\x96\x81" /* split: \x81b would be one escape */
                              "b")};
        const int64_t wty[6] = {2, 3, 3, 6, 1, 1};
        for (int i = 0; i < 6; i++) {
            const char *s;
            size_t n;
            int64_t ty;
            double sc;
            assert_ok(gguf_arr_str(toks, (uint64_t)i, &s, &n));
            assert_true(gguf_str_eq(s, n, wt[i]));
            assert_ok(gguf_arr_int(types, (uint64_t)i, &ty));
            assert_int_equal(ty, wty[i]);
            assert_ok(gguf_arr_float(scores, (uint64_t)i, &sc));
            assert_true(sc == -i);
        }
        gguf_close(g);
        /* without a tokenizer: no tokenizer keys */
        assert_ok(llama2c_open_buffer(f.model, f.model_size, NULL, 0, &g, err));
        assert_int_equal(gguf_find_key(g, "tokenizer.ggml.tokens"), -1);
        gguf_close(g);
        free_l2c(&f);
    }
}

static void test_llama2c_bad_input(void **state)
{
    (void)state;
    l2c_file f;
    make_l2c(&f, false);
    char err[BASE_ERR_CAP];
    gguf *g;
    /* every truncation of the model and of the tokenizer */
    for (size_t len = 0; len < f.model_size; len++) {
        uint8_t *c = malloc(len ? len : 1);
        memcpy(c, f.model, len);
        err[0] = '\0';
        assert_status(llama2c_open_buffer(c, len, f.tok, f.tok_size, &g, err), KEEL_EFORMAT);
        assert_null(g);
        assert_true(err[0]);
        free(c);
    }
    for (size_t len = 0; len < f.tok_size; len++) {
        uint8_t *c = malloc(len ? len : 1);
        memcpy(c, f.tok, len);
        assert_status(llama2c_open_buffer(f.model, f.model_size, c, len, &g, err), KEEL_EFORMAT);
        free(c);
    }
    assert_status(llama2c_open_buffer(f.model, f.model_size - 4, f.tok, f.tok_size, &g, err),
                  KEEL_EFORMAT);
    assert_non_null(strstr(err, "truncated: header implies"));
    /* bad header fields */
    int32_t *h = (int32_t *)(void *)f.model;
    const int32_t orig[7] = {h[0], h[1], h[2], h[3], h[4], h[5], h[6]};
    struct {
        int field;
        int32_t value;
        const char *msg;
    } cases[] = {
        {0, 0, "dim = 0"},
        {1, -3, "hidden_dim = -3"},
        {2, 0, "n_layers"},
        {3, 3, "not divisible"},
        {4, 3, "n_kv_heads"},
        {5, 0, "vocab_size"},
        {5, INT32_MIN, "vocab_size"},
        {6, 0, "seq_len"},
        {2, 1 << 30, "truncated"},
        {0, 0x616b3432, "ak42"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memcpy(h, orig, 28);
        h[cases[i].field] = cases[i].value;
        keel_status st = llama2c_open_buffer(f.model, f.model_size, f.tok, f.tok_size, &g, err);
        assert_true(st == KEEL_EFORMAT || st == KEEL_EUNSUPPORTED);
        if (!strstr(err, cases[i].msg)) fail_msg("'%s' lacks '%s'", err, cases[i].msg);
    }
    memcpy(h, orig, 28);
    /* a token length past the end */
    int32_t big = 1 << 20;
    memcpy(f.tok + 4 + 4, &big, 4);
    assert_status(llama2c_open_buffer(f.model, f.model_size, f.tok, f.tok_size, &g, err),
                  KEEL_EFORMAT);
    assert_non_null(strstr(err, "token 0: length 1048576 past end of file"));
    assert_status(llama2c_open_file("/nonexistent/model.bin", NULL, &g, err), KEEL_EIO);
    free_l2c(&f);
}

static keel_status l2c_op(void *ctx)
{
    l2c_file *f = ctx;
    gguf *g;
    keel_status st = llama2c_open_buffer(f->model, f->model_size, f->tok, f->tok_size, &g, NULL);
    gguf_close(g);
    return st;
}

static void test_llama2c_alloc_sweep(void **state)
{
    (void)state;
    l2c_file f;
    make_l2c(&f, false);
    assert_true(test_alloc_sweep(l2c_op, &f) >= 10);
    free_l2c(&f);
}

/* The conversion of stories260K must match llama.cpp's conversion of the
 * same files: tokens, scores, types and every tensor byte for byte. */
static void test_llama2c_matches_llamacpp(void **state)
{
    (void)state;
    const char *p = test_fixture("models/stories260K.gguf");
    if (!p) return;
    char ref_path[4096], model_path[4096], tok_path[4096];
    snprintf(ref_path, sizeof ref_path, "%s", p);
    snprintf(model_path, sizeof model_path, "%s", test_fixture("models/stories260K.bin"));
    snprintf(tok_path, sizeof tok_path, "%s", test_fixture("models/tok512.bin"));
    gguf *ref, *g;
    char err[BASE_ERR_CAP] = "";
    assert_ok(gguf_open_file(ref_path, &ref, err));
    keel_status st = llama2c_open_file(model_path, tok_path, &g, err);
    if (st) fail_msg("%s", err);
    const char *keys_u32[] = {"llama.embedding_length",
                              "llama.feed_forward_length",
                              "llama.attention.head_count",
                              "llama.attention.head_count_kv",
                              "llama.block_count",
                              "llama.rope.dimension_count",
                              "tokenizer.ggml.bos_token_id",
                              "tokenizer.ggml.eos_token_id",
                              "tokenizer.ggml.unknown_token_id"};
    for (size_t i = 0; i < sizeof keys_u32 / sizeof keys_u32[0]; i++) {
        uint32_t a, b;
        assert_ok(gguf_get_u32(ref, keys_u32[i], &a, err));
        assert_ok(gguf_get_u32(g, keys_u32[i], &b, err));
        assert_int_equal(a, b);
    }
    float e1, e2;
    assert_ok(gguf_get_f32(ref, "llama.attention.layer_norm_rms_epsilon", &e1, err));
    assert_ok(gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &e2, err));
    assert_true(e1 == e2);
    const char *arrs[3] = {"tokenizer.ggml.tokens", "tokenizer.ggml.scores",
                           "tokenizer.ggml.token_type"};
    for (int i = 0; i < 3; i++) {
        const gguf_value *a, *b;
        assert_ok(gguf_get_arr(ref, arrs[i], GGUF_TYPE_COUNT_, &a, err));
        assert_ok(gguf_get_arr(g, arrs[i], GGUF_TYPE_COUNT_, &b, err));
        assert_int_equal(a->arr_type, b->arr_type);
        assert_int_equal(a->n, b->n);
        assert_int_equal(a->nbytes, b->nbytes);
        assert_memory_equal(a->data, b->data, a->nbytes);
    }
    /* every tensor of ours is in the reference, byte-equal; the reference's
     * output.weight is its copy of the shared embedding */
    assert_int_equal(gguf_n_tensors(g) + 1, gguf_n_tensors(ref));
    for (int64_t i = 0; i < gguf_n_tensors(ref); i++) {
        const gguf_tensor *r = gguf_tensor_at(ref, i);
        const char *name = strcmp(r->name, "output.weight") == 0 ? "token_embd.weight" : r->name;
        const gguf_tensor *t = gguf_find_tensor(g, name);
        if (!t) fail_msg("missing %s", name);
        assert_int_equal(t->dtype, r->dtype);
        assert_int_equal(t->n_dims, r->n_dims);
        assert_memory_equal(t->ne, r->ne, sizeof t->ne);
        assert_int_equal(t->nbytes, r->nbytes);
        if (memcmp(t->data, r->data, t->nbytes) != 0) fail_msg("%s differs", r->name);
    }
    gguf_close(g);
    gguf_close(ref);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_all_types), cmocka_unit_test(test_write_file),
        cmocka_unit_test(test_write_deferred),
        cmocka_unit_test(test_fixture_stories),     cmocka_unit_test(test_fixture_all_models),
        cmocka_unit_test(test_every_truncation),    cmocka_unit_test(test_random_bitflips),
        cmocka_unit_test(test_malformed_headers),   cmocka_unit_test(test_alloc_sweep_gguf),
        cmocka_unit_test(test_alignment_values),    cmocka_unit_test(test_tensor_layout),
        cmocka_unit_test(test_llama2c_synthetic),   cmocka_unit_test(test_llama2c_bad_input),
        cmocka_unit_test(test_llama2c_alloc_sweep), cmocka_unit_test(test_llama2c_matches_llamacpp),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
