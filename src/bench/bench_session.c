/*
 * bench_session.c — `keel bench session -m MODEL [-c N] [--ctk T --ctv T]
 * [--dir D] [-r R] [--json]`: session save and load speed (to a buffer and
 * to a file) of a context holding N tokens, each beside a reference measured
 * in the same run on the same bytes: memcpy of the blob (memory bandwidth)
 * for the buffer paths, a plain write + fsync and a read of a file of the
 * blob's size (disk) for the file paths. Best of R repetitions.
 */
#include "bench.h"

#include "../engine/engine.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static double now_s(void)
{
    return (double)keel_time_ns() * 1e-9;
}

/* Reference: writes n bytes to path with fsync, then reads them back. */
static keel_status disk_ref(const char *path, const uint8_t *b, size_t n, double *w_s, double *r_s)
{
    double t0 = now_s();
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return KEEL_EIO;
    size_t off = 0;
    while (off < n) {
        ssize_t w = write(fd, b + off, n - off);
        if (w <= 0) {
            close(fd);
            return KEEL_EIO;
        }
        off += (size_t)w;
    }
    if (fsync(fd) != 0 || close(fd) != 0) return KEEL_EIO;
    double t1 = now_s();
    uint8_t *x = base_alloc(n ? n : 1);
    if (!x) return KEEL_ENOMEM;
    fd = open(path, O_RDONLY);
    off = 0;
    while (fd >= 0 && off < n) {
        ssize_t r = read(fd, x + off, n - off);
        if (r <= 0) break;
        off += (size_t)r;
    }
    if (fd >= 0) close(fd);
    double t2 = now_s();
    base_free(x, n ? n : 1);
    unlink(path);
    if (off != n) return KEEL_EIO;
    *w_s = t1 - t0;
    *r_s = t2 - t1;
    return KEEL_OK;
}

keel_status bench_session(int argc, char **argv, bench_out *o)
{
    static const bench_flag spec[] = {{"-m", true},   {"-c", true},   {"--ctk", true}, {"--ctv", true},
                                      {"--dir", true}, {"-r", true},  {"-t", true}};
    keel_status st = bench_check_args(o, "session", argc, argv, spec, BASE_ARRAY_LEN(spec));
    if (st != KEEL_OK) return st;
    const char *path = bench_opt(argc, argv, "-m"), *dir = bench_opt(argc, argv, "--dir");
    if (!path) return base_err(o->err, KEEL_EINVAL, "bench session: -m MODEL is required");
    int64_t n_tok, reps, threads;
    if ((st = bench_int_opt(o, "session", argc, argv, "-c", 16, 1 << 20, 4096, &n_tok)) != KEEL_OK ||
        (st = bench_int_opt(o, "session", argc, argv, "-r", 1, 100, 3, &reps)) != KEEL_OK ||
        (st = bench_int_opt(o, "session", argc, argv, "-t", 0, 256, 0, &threads)) != KEEL_OK)
        return st;
    keel_context_params cp = keel_context_params_default();
    cp.n_ctx = (int32_t)n_tok;
    cp.n_threads = (int32_t)threads;
    const char *kt = bench_opt(argc, argv, "--ctk"), *vt = bench_opt(argc, argv, "--ctv");
    if ((kt && keel_dtype_from_name(kt, &cp.type_k) != KEEL_OK) || (vt && keel_dtype_from_name(vt, &cp.type_v) != KEEL_OK))
        return base_err(o->err, KEEL_EINVAL, "bench session: unknown cache type");
    keel_model_params mp = keel_model_params_default();
    mp.path = path;
    keel_model *m = NULL;
    keel_context *c = NULL;
    uint8_t *blob = NULL, *copy = NULL;
    int32_t *toks = NULL;
    size_t n = 0;
    char err[256] = "", file[1024], ref[1024];
    if ((st = keel_model_open(&mp, &m, err)) != KEEL_OK) return base_err(o->err, st, "bench session: %s: %s", path, err);
    if ((st = keel_context_open(m, &cp, &c, err)) != KEEL_OK) {
        base_err(o->err, st, "bench session: context: %s", err);
        goto out;
    }
    int32_t nv = m->w.hp.n_vocab;
    toks = base_alloc((size_t)n_tok * sizeof(int32_t));
    if (!toks) {
        st = base_err(o->err, KEEL_ENOMEM, "bench session: out of memory");
        goto out;
    }
    for (int64_t i = 0; i < n_tok; i++) toks[i] = (int32_t)((i * 7919 + 13) % nv);
    for (int64_t i = 0; i < n_tok; i += cp.n_batch) {
        int32_t k = (int32_t)BASE_MIN((int64_t)cp.n_batch, n_tok - i);
        keel_batch b = {k, toks + i, NULL, NULL, NULL};
        if ((st = keel_decode(c, &b)) != KEEL_OK) {
            base_err(o->err, st, "bench session: filling the cache: %s", keel_context_last_error(c));
            goto out;
        }
    }
    if (keel_session_save_buf(c, 0, toks, (int32_t)n_tok, 0, NULL, 0, &n) != KEEL_ERANGE) {
        st = base_err(o->err, KEEL_EINTERNAL, "bench session: no size");
        goto out;
    }
    blob = base_alloc(n);
    copy = base_alloc(n);
    if (!blob || !copy) {
        st = base_err(o->err, KEEL_ENOMEM, "bench session: cannot allocate 2 x %zu bytes", n);
        goto out;
    }
    snprintf(file, sizeof file, "%s/keel-bench-%ld.session", dir ? dir : "/tmp", (long)getpid());
    snprintf(ref, sizeof ref, "%s/keel-bench-%ld.ref", dir ? dir : "/tmp", (long)getpid());
    double best[6] = {1e30, 1e30, 1e30, 1e30, 1e30, 1e30}; /* save buf, load buf, memcpy, save file, load file, (unused) */
    double disk_w = 1e30, disk_r = 1e30;
    int32_t nt = 0, np = 0;
    for (int64_t r = 0; r < reps; r++) {
        size_t got = 0;
        double t0 = now_s();
        if ((st = keel_session_save_buf(c, 0, toks, (int32_t)n_tok, 0, blob, n, &got)) != KEEL_OK) goto fail;
        double t1 = now_s();
        if ((st = keel_session_load_buf(c, 0, blob, got, 0, NULL, 0, &nt, &np)) != KEEL_OK) goto fail;
        double t2 = now_s();
        memcpy(copy, blob, n);
        double t3 = now_s();
        if ((st = keel_session_save(c, 0, toks, (int32_t)n_tok, 0, file)) != KEEL_OK) goto fail;
        double t4 = now_s();
        if ((st = keel_session_load(c, 0, file, 0, NULL, 0, &nt, &np)) != KEEL_OK) goto fail;
        double t5 = now_s();
        double w = 0, rd = 0;
        if ((st = disk_ref(ref, copy, n, &w, &rd)) != KEEL_OK) {
            base_err(o->err, st, "bench session: reference file %s: %s", ref, strerror(errno));
            goto out;
        }
        double d[5] = {t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4};
        for (int i = 0; i < 5; i++) best[i] = BASE_MIN(best[i], d[i]);
        disk_w = BASE_MIN(disk_w, w);
        disk_r = BASE_MIN(disk_r, rd);
    }
    unlink(file);
    double mb = (double)n / 1e6;
    if (o->json) {
        bench_printf(o,
                     "{\"bench\":\"session\",\"tokens\":%lld,\"bytes\":%zu,\"save_buffer_mbps\":%.1f,"
                     "\"load_buffer_mbps\":%.1f,\"memcpy_mbps\":%.1f,\"save_file_mbps\":%.1f,\"load_file_mbps\":%.1f,"
                     "\"disk_write_fsync_mbps\":%.1f,\"disk_read_mbps\":%.1f}\n",
                     (long long)n_tok, n, mb / best[0], mb / best[1], mb / best[2], mb / best[3], mb / best[4],
                     mb / disk_w, mb / disk_r);
    } else {
        bench_printf(o, "session of %lld tokens: %zu bytes (best of %lld)\n", (long long)n_tok, n, (long long)reps);
        bench_printf(o, "| path | MB/s | reference | MB/s | ratio |\n|---|---|---|---|---|\n");
        bench_printf(o, "| save to buffer | %.1f | memcpy | %.1f | %.2f |\n", mb / best[0], mb / best[2], best[2] / best[0]);
        bench_printf(o, "| load from buffer | %.1f | memcpy | %.1f | %.2f |\n", mb / best[1], mb / best[2], best[2] / best[1]);
        bench_printf(o, "| save to file (fsync) | %.1f | write + fsync | %.1f | %.2f |\n", mb / best[3], mb / disk_w,
                     disk_w / best[3]);
        bench_printf(o, "| load from file | %.1f | read | %.1f | %.2f |\n", mb / best[4], mb / disk_r, disk_r / best[4]);
    }
    st = KEEL_OK;
    goto out;
fail:
    base_err(o->err, st, "bench session: %s", keel_context_last_error(c));
out:
    base_free(blob, n);
    base_free(copy, n);
    base_free(toks, (size_t)n_tok * sizeof(int32_t));
    keel_context_close(c);
    keel_model_close(m);
    return st;
}
