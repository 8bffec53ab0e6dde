/*
 * llama2c.c — converts legacy llama2.c checkpoints (model.bin, and
 * tokenizer.bin) into an in-memory GGUF laid out like llama.cpp's
 * convert-llama2c-to-ggml output, so the rest of keel reads only GGUF.
 * Owns nothing after a call returns: inputs are read, the output is a new
 * block handed to the caller (or to gguf_open_owned).
 *
 * Every header value and length is checked against the input size before it
 * is used (design.md rule 10); weights are copied byte for byte.
 * Tokenizer pieces: spaces become U+2581 (SentencePiece's marker); ids 0, 1,
 * 2 become "<unk>" (UNKNOWN), "<s>", "</s>" (CONTROL); "<0xHH>" pieces are
 * BYTE tokens, empty pieces CONTROL, the rest NORMAL.
 */
#include "llama2c.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

enum { TOKTYPE_NORMAL = 1, TOKTYPE_UNKNOWN = 2, TOKTYPE_CONTROL = 3, TOKTYPE_BYTE = 6 };

/* Element counts of each weight block, in file order. */
typedef struct l2c_layout {
    size_t emb, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final, freq, wcls;
    size_t total_floats;
} l2c_layout;

static bool layout_of(const llama2c_config *c, l2c_layout *l)
{
    size_t dim = (size_t)c->dim, hid = (size_t)c->hidden_dim, nl = (size_t)c->n_layers;
    size_t vocab = (size_t)c->vocab_size, hs = dim / (size_t)c->n_heads;
    size_t kv_dim = hs * (size_t)c->n_kv_heads, seq = (size_t)c->seq_len;
    memset(l, 0, sizeof *l);
    bool ok = size_mul(vocab, dim, &l->emb) && size_mul(nl, dim, &l->rms_att) &&
              size_mul(nl * dim, dim, &l->wq) && size_mul(nl * dim, kv_dim, &l->wk) &&
              size_mul(nl * dim, dim, &l->wo) && size_mul(nl * dim, hid, &l->w1) &&
              size_mul(seq, hs / 2, &l->freq);
    /* nl * dim cannot overflow: both are < 2^31 */
    if (!ok) return false;
    l->wv = l->wk;
    l->rms_ffn = l->rms_att;
    l->w2 = l->w3 = l->w1;
    l->rms_final = dim;
    l->wcls = c->shared_classifier ? 0 : l->emb;
    size_t parts[] = {l->emb, l->rms_att, l->wq, l->wk,        l->wv,   l->wo,   l->rms_ffn,
                      l->w1,  l->w2,      l->w3, l->rms_final, l->freq, l->freq, l->wcls};
    size_t t = 0;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        if (!size_add(t, parts[i], &t)) return false;
    l->total_floats = t;
    return true;
}

keel_status llama2c_read_config(const void *model, size_t model_size, llama2c_config *out,
                                char *err)
{
    int32_t h[7];
    if (!model || model_size < sizeof h)
        return base_err(err, KEEL_EFORMAT, "llama2.c: file of %zu bytes has no 28-byte header",
                        model_size);
    memcpy(h, model, sizeof h);
    if ((uint32_t)h[0] == 0x616b3432u)
        return base_err(err, KEEL_EUNSUPPORTED,
                        "llama2.c: versioned export (magic ak42, version %d) is not supported; "
                        "export with the legacy (v0) format",
                        h[1]);
    static const char *const names[7] = {"dim",        "hidden_dim", "n_layers", "n_heads",
                                         "n_kv_heads", "vocab_size", "seq_len"};
    for (int i = 0; i < 7; i++) {
        bool bad = i == 5 ? (h[i] == 0 || h[i] == INT32_MIN) : h[i] <= 0;
        if (bad) return base_err(err, KEEL_EFORMAT, "llama2.c: %s = %d is invalid", names[i], h[i]);
    }
    llama2c_config c = {
        .dim = h[0],
        .hidden_dim = h[1],
        .n_layers = h[2],
        .n_heads = h[3],
        .n_kv_heads = h[4],
        .vocab_size = h[5] < 0 ? -h[5] : h[5],
        .seq_len = h[6],
        .shared_classifier = h[5] > 0,
    };
    if (c.dim % c.n_heads != 0)
        return base_err(err, KEEL_EFORMAT, "llama2.c: dim %d not divisible by n_heads %d", c.dim,
                        c.n_heads);
    if (c.n_kv_heads > c.n_heads || c.n_heads % c.n_kv_heads != 0)
        return base_err(err, KEEL_EFORMAT, "llama2.c: n_heads %d not a multiple of n_kv_heads %d",
                        c.n_heads, c.n_kv_heads);
    if ((c.dim / c.n_heads) % 2 != 0)
        return base_err(err, KEEL_EFORMAT, "llama2.c: head size %d is odd", c.dim / c.n_heads);
    l2c_layout l;
    size_t need;
    if (!layout_of(&c, &l) || !size_mul_add(l.total_floats, 4, 28, &need))
        return base_err(err, KEEL_EFORMAT, "llama2.c: header sizes overflow");
    if (model_size < need)
        return base_err(err, KEEL_EFORMAT,
                        "llama2.c: truncated: header implies %zu bytes, file has %zu", need,
                        model_size);
    if (model_size > need)
        return base_err(err, KEEL_EFORMAT,
                        "llama2.c: header implies %zu bytes, file has %zu (%s classifier)", need,
                        model_size, c.shared_classifier ? "shared" : "unshared");
    *out = c;
    return KEEL_OK;
}

/* ---- tokenizer ------------------------------------------------------------ */

typedef struct l2c_vocab {
    int32_t n;
    char **text;      /* [n] escaped pieces, each text_len[i] + 1 bytes */
    size_t *text_len; /* [n] */
    float *scores;    /* [n] */
    int32_t *types;   /* [n] */
} l2c_vocab;

static void vocab_free(l2c_vocab *v)
{
    if (v->text && v->text_len)
        for (int32_t i = 0; i < v->n; i++)
            base_free(v->text[i], v->text_len[i] + 1);
    base_free(v->text, (size_t)v->n * sizeof *v->text);
    base_free(v->text_len, (size_t)v->n * sizeof *v->text_len);
    base_free(v->scores, (size_t)v->n * sizeof *v->scores);
    base_free(v->types, (size_t)v->n * sizeof *v->types);
    memset(v, 0, sizeof *v);
}

static bool is_hex(uint8_t c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* what names the file in messages: "tokenizer" or "tokenizer PATH". */
static keel_status read_vocab(const uint8_t *p, size_t size, int32_t n, l2c_vocab *v,
                              const char *what, char *err)
{
    const uint8_t *end = p + size;
    keel_status st = KEEL_OK;
    memset(v, 0, sizeof *v);
    if (size < 4)
        return base_err(err, KEEL_EFORMAT, "%s: file of %zu bytes has no header", what, size);
    p += 4; /* max_token_length: unused */
    /* each token takes at least 8 bytes: bound n before allocating */
    if ((size_t)n > (size_t)(end - p) / 8)
        return base_err(err, KEEL_EFORMAT,
                        "%s: %d tokens cannot fit in %zu bytes (truncated?)", what, n, size);
    v->n = n;
    v->text = base_calloc((size_t)n, sizeof *v->text);
    v->text_len = base_calloc((size_t)n, sizeof *v->text_len);
    v->scores = base_alloc((size_t)n * sizeof *v->scores);
    v->types = base_alloc((size_t)n * sizeof *v->types);
    if (!v->text || !v->text_len || !v->scores || !v->types) {
        st = base_err(err, KEEL_ENOMEM, "%s: out of memory for %d tokens", what, n);
        goto fail;
    }
    for (int32_t i = 0; i < n; i++) {
        float score;
        int32_t len;
        if ((size_t)(end - p) < 8) {
            st = base_err(err, KEEL_EFORMAT, "%s: token %d: header past end of file", what, i);
            goto fail;
        }
        memcpy(&score, p, 4);
        memcpy(&len, p + 4, 4);
        p += 8;
        if (len < 0 || (size_t)len > (size_t)(end - p)) {
            st = base_err(err, KEEL_EFORMAT,
                          "%s: token %d: length %d past end of file (%zu bytes left)", what, i,
                          len, (size_t)(end - p));
            goto fail;
        }
        const uint8_t *s = p;
        size_t slen = (size_t)len;
        p += slen;
        int32_t type = TOKTYPE_NORMAL;
        if (i == 0) {
            s = (const uint8_t *)"<unk>", slen = 5, type = TOKTYPE_UNKNOWN;
        } else if (i == 1) {
            s = (const uint8_t *)"<s>", slen = 3, type = TOKTYPE_CONTROL;
        } else if (i == 2) {
            s = (const uint8_t *)"</s>", slen = 4, type = TOKTYPE_CONTROL;
        } else if (slen == 0) {
            type = TOKTYPE_CONTROL;
        } else if (slen == 6 && memcmp(s, "<0x", 3) == 0 && is_hex(s[3]) && is_hex(s[4]) &&
                   s[5] == '>') {
            type = TOKTYPE_BYTE;
        }
        /* escape spaces: each ' ' (1 byte) becomes U+2581 (3 bytes) */
        size_t n_sp = 0, out_len;
        for (size_t j = 0; j < slen; j++)
            n_sp += s[j] == ' ';
        out_len = slen + 2 * n_sp; /* slen < 2^31: no overflow */
        char *t = base_alloc(out_len + 1);
        if (!t) {
            st = base_err(err, KEEL_ENOMEM, "%s: out of memory", what);
            goto fail;
        }
        size_t k = 0;
        for (size_t j = 0; j < slen; j++) {
            if (s[j] == ' ') {
                memcpy(t + k, "\xe2\x96\x81", 3);
                k += 3;
            } else {
                t[k++] = (char)s[j];
            }
        }
        t[k] = '\0';
        v->text[i] = t;
        v->text_len[i] = out_len;
        v->scores[i] = score;
        v->types[i] = type;
    }
    if (p != end) {
        st = base_err(err, KEEL_EFORMAT, "%s: %zu trailing bytes after %d tokens", what,
                      (size_t)(end - p), n);
        goto fail;
    }
    return KEEL_OK;
fail:
    vocab_free(v);
    return st;
}

/* ---- conversion ------------------------------------------------------------ */

/* llama2c_convert; tok_what names the tokenizer in its messages. */
static keel_status convert(const void *model, size_t model_size, const void *tok, size_t tok_size,
                           const char *tok_what, void **out, size_t *out_size, char *err)
{
    keel_status st;
    llama2c_config c;
    l2c_vocab v = {0};
    gguf_writer *w = NULL;
    if (!out || !out_size) return base_err(err, KEEL_EINVAL, "out is NULL");
    *out = NULL;
    *out_size = 0;
    if ((st = llama2c_read_config(model, model_size, &c, err))) return st;
    if (tok && (st = read_vocab(tok, tok_size, c.vocab_size, &v, tok_what, err))) return st;
    if ((st = gguf_writer_open(&w))) {
        base_err(err, st, "out of memory");
        goto done;
    }
    uint32_t head_size = (uint32_t)(c.dim / c.n_heads);
    if (v.n) {
        if ((st = gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v.text,
                                          v.text_len, (uint64_t)v.n)) ||
            (st = gguf_writer_add_arr(w, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, v.scores,
                                      (uint64_t)v.n)) ||
            (st = gguf_writer_add_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, v.types,
                                      (uint64_t)v.n)) ||
            (st = gguf_writer_add_str(w, "tokenizer.ggml.model", "llama")))
            goto werr;
    }
    if ((st = gguf_writer_add_str(w, "general.architecture", "llama")) ||
        (st = gguf_writer_add_str(w, "general.name", "llama")))
        goto werr;
    if (v.n && ((st = gguf_writer_add_u32(w, "tokenizer.ggml.unknown_token_id", 0)) ||
                (st = gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", 1)) ||
                (st = gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", 2))))
        goto werr;
    if ((st = gguf_writer_add_u32(w, "llama.context_length", (uint32_t)c.seq_len)) ||
        (st = gguf_writer_add_u32(w, "llama.embedding_length", (uint32_t)c.dim)) ||
        (st = gguf_writer_add_u32(w, "llama.feed_forward_length", (uint32_t)c.hidden_dim)) ||
        (st = gguf_writer_add_u32(w, "llama.attention.head_count", (uint32_t)c.n_heads)) ||
        (st = gguf_writer_add_u32(w, "llama.attention.head_count_kv", (uint32_t)c.n_kv_heads)) ||
        (st = gguf_writer_add_u32(w, "llama.block_count", (uint32_t)c.n_layers)) ||
        (st = gguf_writer_add_u32(w, "llama.rope.dimension_count", head_size)) ||
        (st = gguf_writer_add_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f)))
        goto werr;

    l2c_layout l;
    layout_of(&c, &l); /* checked by llama2c_read_config */
    const uint8_t *base = (const uint8_t *)model + 28;
    const int64_t dim = c.dim, hid = c.hidden_dim, vocab = c.vocab_size;
    const int64_t kv_dim = (int64_t)head_size * c.n_kv_heads;
    /* byte offsets of each block */
    size_t o_emb = 0, o_rms_att = o_emb + 4 * l.emb, o_wq = o_rms_att + 4 * l.rms_att;
    size_t o_wk = o_wq + 4 * l.wq, o_wv = o_wk + 4 * l.wk, o_wo = o_wv + 4 * l.wv;
    size_t o_rms_ffn = o_wo + 4 * l.wo, o_w1 = o_rms_ffn + 4 * l.rms_ffn, o_w2 = o_w1 + 4 * l.w1;
    size_t o_w3 = o_w2 + 4 * l.w2, o_rms_final = o_w3 + 4 * l.w3;
    size_t o_wcls = o_rms_final + 4 * l.rms_final + 8 * l.freq;
    int64_t ne_emb[2] = {dim, vocab}, ne_dim[1] = {dim};
    if ((st = gguf_writer_add_tensor(w, "token_embd.weight", KEEL_DTYPE_F32, 2, ne_emb,
                                     base + o_emb, 4 * l.emb)) ||
        (st = gguf_writer_add_tensor(w, "output_norm.weight", KEEL_DTYPE_F32, 1, ne_dim,
                                     base + o_rms_final, 4 * l.rms_final)))
        goto werr;
    if (!c.shared_classifier && (st = gguf_writer_add_tensor(w, "output.weight", KEEL_DTYPE_F32, 2,
                                                             ne_emb, base + o_wcls, 4 * l.wcls)))
        goto werr;
    for (int32_t b = 0; b < c.n_layers; b++) {
        size_t L = (size_t)b;
        size_t sq = (size_t)(dim * dim), skv = (size_t)(dim * kv_dim), sff = (size_t)(dim * hid);
        struct {
            const char *name;
            int64_t ne0, ne1;
            size_t off, count;
        } t[9] = {
            {"attn_q", dim, dim, o_wq + 4 * L * sq, sq},
            {"attn_k", dim, kv_dim, o_wk + 4 * L * skv, skv},
            {"attn_v", dim, kv_dim, o_wv + 4 * L * skv, skv},
            {"attn_output", dim, dim, o_wo + 4 * L * sq, sq},
            {"attn_norm", dim, 0, o_rms_att + 4 * L * (size_t)dim, (size_t)dim},
            {"ffn_gate", dim, hid, o_w1 + 4 * L * sff, sff},
            {"ffn_down", hid, dim, o_w2 + 4 * L * sff, sff},
            {"ffn_up", dim, hid, o_w3 + 4 * L * sff, sff},
            {"ffn_norm", dim, 0, o_rms_ffn + 4 * L * (size_t)dim, (size_t)dim},
        };
        for (int i = 0; i < 9; i++) {
            char name[64];
            snprintf(name, sizeof name, "blk.%d.%s.weight", b, t[i].name);
            int64_t ne[2] = {t[i].ne0, t[i].ne1};
            if ((st = gguf_writer_add_tensor(w, name, KEEL_DTYPE_F32, t[i].ne1 ? 2 : 1, ne,
                                             base + t[i].off, 4 * t[i].count)))
                goto werr;
        }
    }
    if ((st = gguf_writer_write_mem(w, out, out_size))) goto werr;
    goto done;
werr:
    base_err(err, st, "llama2.c: %s", gguf_writer_last_error(w));
done:
    gguf_writer_close(w);
    vocab_free(&v);
    return st;
}

keel_status llama2c_convert(const void *model, size_t model_size, const void *tok, size_t tok_size,
                            void **out, size_t *out_size, char *err)
{
    return convert(model, model_size, tok, tok_size, "tokenizer", out, out_size, err);
}

static keel_status open_buffer(const void *model, size_t model_size, const void *tok,
                               size_t tok_size, const char *tok_what, gguf **out, char *err)
{
    void *data;
    size_t size;
    if (!out) return base_err(err, KEEL_EINVAL, "out is NULL");
    *out = NULL;
    keel_status st = convert(model, model_size, tok, tok_size, tok_what, &data, &size, err);
    if (st) return st;
    return gguf_open_owned(data, size, out, err);
}

keel_status llama2c_open_buffer(const void *model, size_t model_size, const void *tok,
                                size_t tok_size, gguf **out, char *err)
{
    return open_buffer(model, model_size, tok, tok_size, "tokenizer", out, err);
}

/* Maps a whole file read-only; what names it in messages ("model.bin",
 * "tokenizer tok.bin"). */
static keel_status map_file(const char *path, const char *what, void **data, size_t *size,
                            char *err)
{
    *data = NULL;
    *size = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return base_err(err, KEEL_EIO, "%s: %s", what, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size <= 0) {
        close(fd);
        return base_err(err, KEEL_EIO, "%s: not a readable non-empty file", what);
    }
    void *m = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (m == MAP_FAILED) return base_err(err, KEEL_EIO, "%s: mmap: %s", what, strerror(e));
    *data = m;
    *size = (size_t)sb.st_size;
    return KEEL_OK;
}

keel_status llama2c_open_file(const char *model_path, const char *tok_path, gguf **out, char *err)
{
    void *m = NULL, *t = NULL;
    size_t ms = 0, ts = 0;
    if (!out || !model_path) return base_err(err, KEEL_EINVAL, "path or out is NULL");
    *out = NULL;
    char tok_what[BASE_ERR_CAP];
    snprintf(tok_what, sizeof tok_what, "tokenizer %s", tok_path ? tok_path : "");
    keel_status st = map_file(model_path, model_path, &m, &ms, err);
    if (!st && tok_path) st = map_file(tok_path, tok_what, &t, &ts, err);
    if (!st) st = open_buffer(m, ms, t, ts, tok_what, out, err);
    if (m) munmap(m, ms);
    if (t) munmap(t, ts);
    return st;
}
