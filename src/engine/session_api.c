/*
 * session_api.c — sessions of a context (keel_session_*): the memory's
 * session blobs (src/memory/session.c) stamped with the model's
 * fingerprint, to a caller's buffer or to a file. Files are written
 * atomically (a temporary name in the same directory, fsync, rename, fsync
 * of the directory) and read with their size checked against the most this
 * context could ever have saved before anything is allocated.
 */
#include "engine.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

keel_status keel_session_save_buf(keel_context *c, int32_t seq, const int32_t *tokens, int32_t n_tokens,
                                  int32_t n_pending, void *buf, size_t cap, size_t *n_out)
{
    if (!c) return KEEL_EINVAL;
    c->err[0] = 0;
    keel_status st = keel_mem_save(c->mem, seq, keel_model_fingerprint(c->model), tokens, n_tokens, n_pending, buf,
                                   cap, n_out);
    if (st != KEEL_OK && (st != KEEL_ERANGE || buf))
        return base_err(c->err, st, "session: %s", keel_mem_last_error(c->mem));
    return st;
}

/* A load with the context's rules: the model's vocabulary, and (slots) a
 * history that describes the cells. */
static keel_status load_buf(keel_context *c, int32_t seq, const void *buf, size_t len, unsigned flags,
                            bool need_history, int32_t *tokens, int32_t cap, int32_t *n_tokens, int32_t *n_pending)
{
    const mem_load_rules rules = {c->model->w.hp.n_vocab, need_history};
    keel_status st = mem_session_load(c->mem, seq, buf, len, keel_model_fingerprint(c->model), flags, &rules, tokens,
                                      cap, n_tokens, n_pending);
    if (st != KEEL_OK) return base_err(c->err, st, "session: %s", keel_mem_last_error(c->mem));
    return KEEL_OK;
}

keel_status keel_session_load_buf(keel_context *c, int32_t seq, const void *buf, size_t len, unsigned flags,
                                  int32_t *tokens, int32_t cap, int32_t *n_tokens, int32_t *n_pending)
{
    if (!c) return KEEL_EINVAL;
    c->err[0] = 0;
    return load_buf(c, seq, buf, len, flags, false, tokens, cap, n_tokens, n_pending);
}

/* Writes n bytes to fd, retrying short writes. 0 or errno. */
static int write_all(int fd, const uint8_t *b, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, b, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return w < 0 ? errno : EIO;
        b += w;
        n -= (size_t)w;
    }
    return 0;
}

static const char *node_kind(mode_t m)
{
    return S_ISCHR(m) ? "character device" : S_ISBLK(m) ? "block device" : S_ISFIFO(m) ? "FIFO" : S_ISDIR(m) ? "directory"
           : S_ISSOCK(m) ? "socket" : S_ISLNK(m) ? "symbolic link" : "special file";
}

/* Where a save to path writes (dest, cap bytes): path itself when nothing
 * is there or a regular file is (the rename replaces it), a symbolic link's
 * resolved target when that is a regular file (the link stays). Anything
 * else (a device such as /dev/full, a FIFO, a directory, a socket, a link
 * to one or to nothing) is refused before anything is created: the rename
 * would put a regular file in its place. */
static keel_status save_dest(keel_context *c, const char *path, char *dest, size_t cap)
{
    struct stat sb, tb;
    keel_status st = KEEL_OK;
    int r = lstat(path, &sb);
    if (r != 0 && errno != ENOENT) {
        st = base_err(c->err, KEEL_EIO, "session: %s: %s", path, strerror(errno));
    } else if (r != 0 || S_ISREG(sb.st_mode)) {
        if (snprintf(dest, cap, "%s", path) >= (int)cap) st = base_err(c->err, KEEL_EINVAL, "session: path too long");
    } else if (!S_ISLNK(sb.st_mode)) {
        st = base_err(c->err, KEEL_EIO,
                      "session: %s exists and is a %s, not a regular file: not replaced (saving would put a regular "
                      "file in its place)",
                      path, node_kind(sb.st_mode));
    } else if (stat(path, &tb) != 0) {
        st = base_err(c->err, KEEL_EIO, "session: %s is a symbolic link to nothing (%s): not replaced", path,
                      strerror(errno));
    } else if (!S_ISREG(tb.st_mode)) {
        st = base_err(c->err, KEEL_EIO,
                      "session: %s links to a %s, not a regular file: not replaced (saving would put a regular file "
                      "in its place)",
                      path, node_kind(tb.st_mode));
    } else if (cap < PATH_MAX || !realpath(path, dest)) {
        st = base_err(c->err, KEEL_EIO, "session: resolving the link %s: %s", path, strerror(errno));
    }
    return st;
}

keel_status keel_session_save(keel_context *c, int32_t seq, const int32_t *tokens, int32_t n_tokens,
                              int32_t n_pending, const char *path)
{
    if (!c) return KEEL_EINVAL;
    c->err[0] = 0;
    if (!path || !*path) return base_err(c->err, KEEL_EINVAL, "session: no path");
    char dest[PATH_MAX];
    keel_status st = save_dest(c, path, dest, sizeof dest);
    if (st != KEEL_OK) return st;
    size_t n = 0;
    st = keel_session_save_buf(c, seq, tokens, n_tokens, n_pending, NULL, 0, &n);
    if (st != KEEL_ERANGE) return st == KEEL_OK ? base_err(c->err, KEEL_EINTERNAL, "session: empty size") : st;
    uint8_t *b = base_alloc(n);
    if (!b) return base_err(c->err, KEEL_ENOMEM, "session: cannot allocate %zu bytes", n);
    size_t got = 0;
    st = keel_session_save_buf(c, seq, tokens, n_tokens, n_pending, b, n, &got);
    char tmp[4096];
    int fd = -1, e = 0;
    if (st != KEEL_OK) goto out;
    /* a name of our own: never opened through something already there */
    for (int k = 0; fd < 0 && k < 16; k++) {
        if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%d", dest, (long)getpid(), k) >= (int)sizeof tmp) {
            st = base_err(c->err, KEEL_EINVAL, "session: path too long");
            goto out;
        }
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
        st = base_err(c->err, KEEL_EIO, "session: %s: %s", tmp, strerror(errno));
        goto out;
    }
    if ((e = write_all(fd, b, got)) != 0 || (fsync(fd) != 0 && (e = errno) != 0)) {
        close(fd);
        fd = -1;
        unlink(tmp);
        st = base_err(c->err, KEEL_EIO, "session: writing %s: %s", tmp, strerror(e));
        goto out;
    }
    int rc = close(fd);
    fd = -1;
    if (rc != 0) {
        e = errno;
        unlink(tmp);
        st = base_err(c->err, KEEL_EIO, "session: closing %s: %s", tmp, strerror(e));
        goto out;
    }
    if (rename(tmp, dest) != 0) {
        e = errno;
        unlink(tmp);
        st = base_err(c->err, KEEL_EIO, "session: renaming to %s: %s", path, strerror(e));
        goto out;
    }
    /* the rename itself is durable once the directory is synced */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", dest);
    int dfd = open(dirname(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        bool ok = fsync(dfd) == 0;
        e = errno;
        close(dfd);
        if (!ok && e != EINVAL) st = base_err(c->err, KEEL_EIO, "session: syncing the directory of %s: %s", path, strerror(e));
    }
out:
    base_free(b, n);
    return st;
}

keel_status keel_session_load(keel_context *c, int32_t seq, const char *path, unsigned flags, int32_t *tokens,
                              int32_t cap, int32_t *n_tokens, int32_t *n_pending)
{
    return engine_session_load(c, seq, path, flags, false, tokens, cap, n_tokens, n_pending);
}

keel_status engine_session_load(keel_context *c, int32_t seq, const char *path, unsigned flags, bool need_history,
                                int32_t *tokens, int32_t cap, int32_t *n_tokens, int32_t *n_pending)
{
    if (!c) return KEEL_EINVAL;
    c->err[0] = 0;
    if (!n_tokens) return base_err(c->err, KEEL_EINVAL, "session: n_tokens is NULL");
    if (!path) return base_err(c->err, KEEL_EINVAL, "session: no path");
    /* O_NONBLOCK: a FIFO is refused below instead of waiting for a writer */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return base_err(c->err, KEEL_EIO, "session: %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return base_err(c->err, KEEL_EIO, "session: %s: not a regular file", path);
    }
    /* the most a session of this context can take: every cell of every
     * table, stored in f32 (conversion may read wider rows than the cache
     * keeps), its metadata, and the token history the caller has room for */
    keel_mem_stats ms;
    keel_mem_stats_get(c->mem, &ms);
    size_t limit = (size_t)ms.cells_cap * 64 + 8 * c->plan.kv_bytes + (size_t)(cap > 0 ? cap : 0) * 4 + (1u << 20);
    if ((uint64_t)sb.st_size > limit) {
        close(fd);
        return base_err(c->err, KEEL_EFORMAT, "session: %s: %lld bytes, more than a session of this context can hold (%zu)",
                        path, (long long)sb.st_size, limit);
    }
    size_t n = (size_t)sb.st_size;
    uint8_t *b = base_alloc(n ? n : 1);
    if (!b) {
        close(fd);
        return base_err(c->err, KEEL_ENOMEM, "session: cannot allocate %zu bytes", n);
    }
    size_t off = 0;
    keel_status st = KEEL_OK;
    while (off < n) {
        ssize_t r = read(fd, b + off, n - off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            st = base_err(c->err, KEEL_EIO, "session: reading %s: %s", path, r < 0 ? strerror(errno) : "file shrank");
            break;
        }
        off += (size_t)r;
    }
    close(fd);
    if (st == KEEL_OK) st = load_buf(c, seq, b, n, flags, need_history, tokens, cap, n_tokens, n_pending);
    if (st != KEEL_OK && st != KEEL_EIO) {
        char detail[BASE_ERR_CAP];
        snprintf(detail, sizeof detail, "%s", c->err);
        base_err(c->err, st, "%s: %s", path, detail);
    }
    base_free(b, n ? n : 1);
    return st;
}
