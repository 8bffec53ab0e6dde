/*
 * testutil.h — shared test support: the failing allocator (fails the Nth
 * allocation, tracks live bytes to catch leaks), fixture lookup and
 * cmocka conveniences.
 */
#ifndef KEEL_TESTUTIL_H
#define KEEL_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include <cmocka.h>

#include "keel.h"

/* Installs the counting allocator. fail_at: the 1-based allocation that
 * fails (0: none fail). Resets counters. */
void test_alloc_install(int64_t fail_at);
/* Restores the default allocator. */
void test_alloc_uninstall(void);
/* Allocations attempted since install. */
int64_t test_alloc_count(void);
/* Bytes currently allocated through the counting allocator. */
int64_t test_alloc_live_bytes(void);
/* Whether the failure was triggered. */
bool test_alloc_failed(void);

/*
 * Failing-allocator sweep: runs op (which must allocate, return a status
 * and release everything it took on both success and failure) once to count
 * its allocations, then once with each allocation failing in turn.
 * Asserts: every failing run returns KEEL_ENOMEM (or the given
 * alt_status if non-zero) and leaves zero live bytes.
 * Returns the number of allocation sites swept.
 */
int64_t test_alloc_sweep(keel_status (*op)(void *ctx), void *ctx);

/* Path of a fixture file ("models/stories260K.gguf") or NULL if the
 * fixtures folder is absent. Static buffer. Prints a skip note when absent. */
const char *test_fixture(const char *rel);

/* Reads a whole file (malloc'd; caller frees). NULL on failure. */
void *test_read_file(const char *path, size_t *size);

/* Creates an empty file /tmp/keel_<stem>_XXXXXX (a unique name) and writes
 * its path into path[cap]; false if it cannot. The caller unlinks it. */
bool test_temp_file(char *path, size_t cap, const char *stem);
/* A small generated qwen2 model (n_embd 64, 4 heads, 2 KV heads, n_layer
 * layers, weights from seed) in a new temporary file named after stem
 * (path[cap]), for tests that need an engine rather than a given model.
 * false if the file or the model cannot be made. */
bool test_gen_qwen2(char *path, size_t cap, const char *stem, int32_t n_layer, uint64_t seed);

/* Overwrites every element of the f32 tensor `tensor` in the GGUF file at
 * path with value (to make a model whose weights are invalid but finite or
 * not, as a test needs). Returns false if the tensor is missing or not f32,
 * or on an I/O error. */
bool test_fill_tensor_f32(const char *path, const char *tensor, float value);

/* Replaces the first occurrence of the n bytes `from` in the file at path
 * by the n bytes `to` (same length, so offsets stay valid). */
bool test_patch_bytes(const char *path, const void *from, const void *to, size_t n);

/* Deterministic random floats in [-1, 1) / N(0, 1). */
void test_fill_uniform(float *x, int64_t n, uint64_t seed);
void test_fill_normal(float *x, int64_t n, uint64_t seed);

/* Asserts |a - b| <= tol (prints both). */
#define assert_close(a, b, tol)                                                                    \
    do {                                                                                           \
        double a_ = (double)(a), b_ = (double)(b), t_ = (double)(tol);                             \
        if (!(a_ - b_ <= t_ && b_ - a_ <= t_))                                                     \
            fail_msg("%s = %.9g, %s = %.9g, |diff| %.3g > %.3g", #a, a_, #b, b_,                   \
                     a_ > b_ ? a_ - b_ : b_ - a_, t_);                                             \
    } while (0)

#define assert_ok(expr)                                                                            \
    do {                                                                                           \
        keel_status s_ = (expr);                                                                   \
        if (s_ != KEEL_OK) fail_msg("%s returned %s (%s)", #expr, keel_status_name(s_),            \
                                    keel_strerror(s_));                                            \
    } while (0)

#define assert_status(expr, want)                                                                  \
    do {                                                                                           \
        keel_status s_ = (expr), w_ = (want);                                                      \
        if (s_ != w_) fail_msg("%s returned %s, want %s", #expr, keel_status_name(s_),             \
                               keel_status_name(w_));                                              \
    } while (0)

#endif
