/*
 * testutil.c — see testutil.h.
 */
#include "testutil.h"
#include "base/base.h"
#include "model/gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>
#include <unistd.h>

static _Atomic int64_t g_count, g_fail_at, g_live;
static _Atomic bool g_failed;

static void *counting_alloc(void *user, void *ptr, size_t old_size, size_t new_size)
{
    (void)user;
    if (new_size == 0) {
        if (ptr) {
            g_live -= (int64_t)old_size;
            free(ptr);
        }
        return NULL;
    }
    g_count++;
    if (g_fail_at > 0 && g_count == g_fail_at) {
        g_failed = true;
        return NULL;
    }
    size_t rounded = (new_size + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, rounded);
    if (!p) return NULL;
    g_live += (int64_t)new_size;
    if (ptr) {
        memcpy(p, ptr, old_size < new_size ? old_size : new_size);
        g_live -= (int64_t)old_size;
        free(ptr);
    }
    return p;
}

void test_alloc_install(int64_t fail_at)
{
    g_count = 0;
    g_fail_at = fail_at;
    g_live = 0;
    g_failed = false;
    keel_set_allocator(counting_alloc, NULL);
}

void test_alloc_uninstall(void)
{
    keel_set_allocator(NULL, NULL);
}

int64_t test_alloc_count(void)
{
    return g_count;
}

int64_t test_alloc_live_bytes(void)
{
    return g_live;
}

bool test_alloc_failed(void)
{
    return g_failed;
}

int64_t test_alloc_sweep(keel_status (*op)(void *ctx), void *ctx)
{
    test_alloc_install(0);
    keel_status st = op(ctx);
    int64_t n = test_alloc_count();
    int64_t live = test_alloc_live_bytes();
    test_alloc_uninstall();
    if (st != KEEL_OK) fail_msg("sweep: unfailed run returned %s", keel_status_name(st));
    if (live != 0) fail_msg("sweep: unfailed run leaked %lld bytes", (long long)live);
    for (int64_t i = 1; i <= n; i++) {
        test_alloc_install(i);
        st = op(ctx);
        live = test_alloc_live_bytes();
        bool failed = test_alloc_failed();
        test_alloc_uninstall();
        if (!failed) continue; /* the op took a different path with fewer allocations */
        if (st != KEEL_ENOMEM)
            fail_msg("sweep: failing allocation %lld of %lld returned %s, want KEEL_ENOMEM",
                     (long long)i, (long long)n, keel_status_name(st));
        if (live != 0)
            fail_msg("sweep: failing allocation %lld of %lld leaked %lld bytes", (long long)i,
                     (long long)n, (long long)live);
    }
    return n;
}

const char *test_fixture(const char *rel)
{
    static char path[4096];
    const char *root = getenv("KEEL_FIXTURES");
    if (!root || !*root) root = "../shared/fixtures";
    snprintf(path, sizeof path, "%s/%s", root, rel);
    FILE *f = fopen(path, "rb");
    if (!f) {
        printf("[  SKIP    ] fixture %s not found (../shared/fixtures absent)\n", path);
        return NULL;
    }
    fclose(f);
    return path;
}

bool test_temp_file(char *path, size_t cap, const char *stem)
{
    int n = snprintf(path, cap, "/tmp/keel_%s_XXXXXX", stem);
    if (n < 0 || (size_t)n >= cap) return false;
    int fd = mkstemp(path);
    if (fd < 0) return false;
    return close(fd) == 0;
}

bool test_gen_qwen2(char *path, size_t cap, const char *stem, int32_t n_layer, uint64_t seed)
{
    if (!test_temp_file(path, cap, stem)) return false;
    keel_gen_params gp = keel_gen_params_default();
    gp.arch = "qwen2";
    gp.n_layer = n_layer;
    gp.n_embd = 64;
    gp.n_head = 4;
    gp.n_head_kv = 2;
    gp.seed = seed;
    char err[256];
    return keel_gen_model(&gp, path, err) == KEEL_OK;
}

void *test_read_file(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (n < 0) {
        fclose(f);
        return NULL;
    }
    void *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf && size) *size = (size_t)n;
    return buf;
}

void test_fill_uniform(float *x, int64_t n, uint64_t seed)
{
    base_rng r;
    base_rng_seed(&r, seed);
    for (int64_t i = 0; i < n; i++) x[i] = (float)(base_rng_uniform(&r) * 2.0 - 1.0);
}

void test_fill_normal(float *x, int64_t n, uint64_t seed)
{
    base_rng r;
    base_rng_seed(&r, seed);
    for (int64_t i = 0; i < n; i++) x[i] = (float)base_rng_normal(&r);
}

bool test_fill_tensor_f32(const char *path, const char *tensor, float value)
{
    gguf *g = NULL;
    if (gguf_open_file(path, &g, NULL) != KEEL_OK) return false;
    const gguf_tensor *t = gguf_find_tensor(g, tensor);
    bool ok = t && t->dtype == KEEL_DTYPE_F32;
    size_t off = ok ? gguf_data_offset(g) + (size_t)t->offset : 0, n = ok ? t->nbytes / 4 : 0;
    gguf_close(g);
    FILE *f = ok ? fopen(path, "r+b") : NULL;
    ok = f && fseek(f, (long)off, SEEK_SET) == 0;
    for (size_t i = 0; ok && i < n; i++) ok = fwrite(&value, sizeof value, 1, f) == 1;
    if (f && fclose(f) != 0) ok = false;
    return ok;
}

bool test_patch_bytes(const char *path, const void *from, const void *to, size_t n)
{
    size_t size = 0;
    uint8_t *d = test_read_file(path, &size);
    bool ok = false;
    for (size_t i = 0; d && n && i + n <= size && !ok; i++)
        if (memcmp(d + i, from, n) == 0) {
            memcpy(d + i, to, n);
            ok = true;
        }
    FILE *f = ok ? fopen(path, "wb") : NULL;
    ok = f && fwrite(d, 1, size, f) == size;
    if (f && fclose(f) != 0) ok = false;
    free(d);
    return ok;
}
