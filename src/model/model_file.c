/*
 * model_file.c — opening a model file of either format: looks at what the
 * path is and how the file starts, then maps a GGUF file or converts a
 * llama2.c checkpoint (with its tokenizer.bin). A GGUF file is mapped, or
 * read into memory when the caller asks (read: faster decode where TLB
 * misses cost, see keel_load); a checkpoint is converted into memory either
 * way. Owns nothing after a call returns (the gguf is the caller's).
 *
 * Messages say what was found, once, and never repeat the model path: the
 * caller knows it and prints it (keel run: "keel: /dev/null: ..."). Errors
 * about the tokenizer file name its path, since the caller's context is
 * the model.
 */
#include "llama2c.h"
#include "model.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *file_kind(mode_t m)
{
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISFIFO(m)) return "a pipe";
    if (S_ISSOCK(m)) return "a socket";
    return "a special file";
}

/* The first n (<= 4) bytes as text: printable ASCII as is, others \xNN. */
static const char *magic_text(const uint8_t *b, size_t n, char out[20])
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (b[i] >= 0x20 && b[i] < 0x7f && b[i] != '\'' && b[i] != '\\')
            out[k++] = (char)b[i];
        else
            k += (size_t)snprintf(out + k, 20 - k, "\\x%02x", b[i]);
    }
    out[k] = '\0';
    return out;
}

keel_status model_open_file(const char *path, const char *tok_path, bool read_all, gguf **out, char *err)
{
    if (!out) return base_err(err, KEEL_EINVAL, "out is NULL");
    *out = NULL;
    if (!path) return base_err(err, KEEL_EINVAL, "model path is NULL");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return base_err(err, KEEL_EIO, "cannot open: %s", strerror(errno));
    keel_status st = KEEL_OK;
    struct stat sb;
    uint8_t magic[4];
    size_t n = 0;
    if (fstat(fd, &sb) != 0) {
        st = base_err(err, KEEL_EIO, "cannot stat: %s", strerror(errno));
    } else if (S_ISDIR(sb.st_mode)) {
        st = base_err(err, KEEL_EIO, "is a directory, not a model file");
    } else if (!S_ISREG(sb.st_mode)) {
        st = base_err(err, KEEL_EIO,
                      "not a regular file (%s): a model is a GGUF file or a llama2.c checkpoint",
                      file_kind(sb.st_mode));
    } else if (sb.st_size == 0) {
        st = base_err(err, KEEL_EFORMAT,
                      "empty file (0 bytes): not a GGUF file or a llama2.c checkpoint");
    } else {
        while (n < sizeof magic) {
            ssize_t r = read(fd, magic + n, sizeof magic - n);
            if (r < 0 && errno == EINTR) continue;
            if (r < 0) {
                st = base_err(err, KEEL_EIO, "cannot read: %s", strerror(errno));
                break;
            }
            if (r == 0) break;
            n += (size_t)r;
        }
    }
    close(fd);
    if (st != KEEL_OK) return st;
    /* "FUGG": a big-endian GGUF, which the reader names and refuses */
    if (n == 4 && (memcmp(magic, "GGUF", 4) == 0 || memcmp(magic, "FUGG", 4) == 0)) {
        if (tok_path)
            base_log(KEEL_LOG_WARN, "tokenizer %s is ignored: a GGUF file carries its own",
                     tok_path);
        return read_all ? gguf_read_file(path, out, err) : gguf_open_file(path, out, err);
    }
    if (!tok_path) {
        char m[20];
        if (n < 4)
            return base_err(err, KEEL_EFORMAT,
                            "not a GGUF file (%zu bytes: '%s'); for a llama2.c checkpoint pass "
                            "--tokenizer",
                            n, magic_text(magic, n, m));
        return base_err(err, KEEL_EFORMAT,
                        "not a GGUF file (magic '%s'); for a llama2.c checkpoint pass --tokenizer",
                        magic_text(magic, n, m));
    }
    return llama2c_open_file(path, tok_path, out, err);
}
