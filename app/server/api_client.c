/*
 * api_client.c — a small blocking HTTP/1.1 client and an SSE event parser,
 * for keel bench-serve and the server tests (they talk to a real server on
 * loopback). One request per connection: requests say "Connection: close";
 * bodies framed by Content-Length, chunked transfer coding, or the
 * connection's end are decoded. Every buffer is bounded (srv_buf's max).
 */
#include "srv.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

int srv_http_connect(const char *host, int port)
{
    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    if (getaddrinfo(host, ps, &hints, &ai) != 0 || !ai) return -1;
    int fd = -1;
    for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(ai);
    return fd;
}

static bool send_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        p += w;
        n -= (size_t)w;
    }
    return true;
}

bool srv_http_send(int fd, const char *method, const char *path, const char *extra, const char *body, size_t n)
{
    srv_buf h = {0};
    srv_buf_addf(&h, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n", method, path);
    if (body) srv_buf_addf(&h, "Content-Type: application/json\r\nContent-Length: %zu\r\n", n);
    if (extra) srv_buf_adds(&h, extra);
    srv_buf_adds(&h, "\r\n");
    bool ok = !h.overflow && send_all(fd, h.p, h.len) && (!body || send_all(fd, body, n));
    srv_buf_free(&h);
    return ok;
}

/* Reads more bytes into raw; 0 at the end, -1 on error or timeout. */
static int fill(int fd, srv_buf *raw, int timeout_ms)
{
    struct pollfd p = {fd, POLLIN, 0};
    int r = poll(&p, 1, timeout_ms);
    if (r <= 0) return -1;
    char tmp[16384];
    ssize_t got = recv(fd, tmp, sizeof tmp, 0);
    if (got < 0) return errno == EINTR ? 1 : -1;
    if (got == 0) return 0;
    return srv_buf_add(raw, tmp, (size_t)got) ? 1 : -1;
}

bool srv_http_header(const srv_http_resp *r, const char *name, char *out, size_t cap)
{
    size_t nl = strlen(name);
    const char *p = r->head.p;
    if (!p) return false;
    while ((p = strchr(p, '\n')) != NULL) {
        p++;
        if (strncasecmp(p, name, nl) == 0 && p[nl] == ':') {
            const char *v = p + nl + 1;
            while (*v == ' ') v++;
            size_t k = strcspn(v, "\r\n");
            if (k >= cap) k = cap - 1;
            memcpy(out, v, k);
            out[k] = 0;
            return true;
        }
    }
    return false;
}

bool srv_http_read(int fd, srv_http_resp *r, int timeout_ms, bool (*on_data)(void *user, const char *p, size_t n),
                   void *user)
{
    memset(r, 0, sizeof *r);
    r->status = -1;
    srv_buf raw = {0};
    raw.max = (size_t)64 << 20;
    r->body.max = (size_t)64 << 20;
    size_t hend = 0;
    bool ok = false;
    /* the head */
    for (;;) {
        char *e = raw.p ? strstr(raw.p, "\r\n\r\n") : NULL;
        if (e) {
            hend = (size_t)(e - raw.p) + 4;
            break;
        }
        int f = fill(fd, &raw, timeout_ms);
        if (f <= 0) goto out;
    }
    srv_buf_add(&r->head, raw.p, hend);
    if (sscanf(r->head.p, "HTTP/1.%*d %d", &r->status) != 1) goto out;
    char v[64];
    bool chunked = srv_http_header(r, "Transfer-Encoding", v, sizeof v) && strcasecmp(v, "chunked") == 0;
    long long clen = -1;
    if (!chunked && srv_http_header(r, "Content-Length", v, sizeof v)) clen = atoll(v);
    size_t pos = hend;
    bool stop = false;
    if (!chunked) {
        for (;;) {
            size_t have = raw.len - pos;
            if (clen >= 0 && (long long)have > clen - (long long)r->body.len) have = (size_t)(clen - (long long)r->body.len);
            if (have) {
                srv_buf_add(&r->body, raw.p + pos, have);
                if (on_data && !on_data(user, raw.p + pos, have)) stop = true;
                pos += have;
            }
            if (clen >= 0 && (long long)r->body.len >= clen) {
                ok = true;
                break;
            }
            if (stop) break;
            int f = fill(fd, &raw, timeout_ms);
            if (f < 0) break;
            if (f == 0) {
                ok = clen < 0; /* close-delimited */
                break;
            }
        }
        goto out;
    }
    for (;;) {
        /* chunk size line */
        char *nl;
        while (!(nl = memchr(raw.p + pos, '\n', raw.len - pos))) {
            if (fill(fd, &raw, timeout_ms) <= 0) goto out;
        }
        unsigned long long sz = strtoull(raw.p + pos, NULL, 16);
        pos = (size_t)(nl - raw.p) + 1;
        if (sz == 0) { /* trailer: up to the blank line */
            ok = true;
            break;
        }
        if (sz > raw.max) goto out;
        while (raw.len - pos < sz + 2) {
            if (fill(fd, &raw, timeout_ms) <= 0) goto out;
        }
        srv_buf_add(&r->body, raw.p + pos, (size_t)sz);
        if (on_data && !on_data(user, raw.p + pos, (size_t)sz)) break;
        pos += (size_t)sz + 2;
        /* keep raw small: drop what is consumed */
        memmove(raw.p, raw.p + pos, raw.len - pos);
        raw.len -= pos;
        raw.p[raw.len] = 0;
        pos = 0;
    }
out:
    srv_buf_free(&raw);
    return ok && !r->body.overflow;
}

bool srv_http_request(const char *host, int port, const char *method, const char *path, const char *extra,
                      const char *body, srv_http_resp *r, int timeout_ms)
{
    memset(r, 0, sizeof *r);
    r->status = -1;
    int fd = srv_http_connect(host, port);
    if (fd < 0) return false;
    /* a server may answer (413) and close before the body is all sent:
     * read its answer either way */
    bool sent = srv_http_send(fd, method, path, extra, body, body ? strlen(body) : 0);
    bool ok = srv_http_read(fd, r, timeout_ms, NULL, NULL) && (sent || r->status >= 400);
    close(fd);
    return ok;
}

void srv_http_resp_free(srv_http_resp *r)
{
    srv_buf_free(&r->head);
    srv_buf_free(&r->body);
}

bool srv_sse_next(const char *buf, size_t n, size_t *pos, srv_sse_event *ev, bool *bad)
{
    size_t p = *pos;
    /* an event ends at the first blank line */
    const char *end = NULL;
    for (size_t i = p; i + 1 < n; i++)
        if (buf[i] == '\n' && buf[i + 1] == '\n') {
            end = buf + i;
            break;
        }
    if (!end) return false;
    ev->event[0] = 0;
    srv_buf_reset(&ev->data);
    ev->comment = true;
    bool first_data = true;
    const char *s = buf + p;
    while (s <= end) {
        const char *nl = memchr(s, '\n', (size_t)(end - s) + 1);
        size_t len = (size_t)(nl - s);
        if (len && s[0] == ':') {
            /* comment */
        } else if (len >= 5 && strncmp(s, "data:", 5) == 0) {
            const char *v = s + 5 + (len > 5 && s[5] == ' ');
            if (!first_data) srv_buf_adds(&ev->data, "\n");
            srv_buf_add(&ev->data, v, (size_t)(s + len - v));
            first_data = false;
            ev->comment = false;
        } else if (len >= 6 && strncmp(s, "event:", 6) == 0) {
            const char *v = s + 6 + (len > 6 && s[6] == ' ');
            size_t k = (size_t)(s + len - v);
            if (k >= sizeof ev->event) k = sizeof ev->event - 1;
            memcpy(ev->event, v, k);
            ev->event[k] = 0;
            ev->comment = false;
        } else if (len) {
            *bad = true;
        }
        s = nl + 1;
    }
    *pos = (size_t)(end - buf) + 2;
    return true;
}
