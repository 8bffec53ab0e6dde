/*
 * toolcall_args.c — a committed call's body: JSON arguments streamed as
 * they arrive (a JSON string holding JSON is decoded), raw arguments when
 * they are not JSON, what ends the call, XML parameters typed by the tool's
 * schema, and gpt-oss harmony message headers.
 */
#include "toolcall_int.h"

#include <string.h>
#include <strings.h>

/* ---- arguments -------------------------------------------------------------------------- */

static const char g_err_json[] = "the arguments are not valid JSON";
static const char g_err_cut[] = "the output ended inside the arguments";

typedef struct dec_out {
    char b[256];
    size_t n;
} dec_out;

static void inner_check(toolcall_parser *p, uint8_t c)
{
    if (p->inner_bad) return;
    if (p->inner_done) {
        if (!tc_is_ws(c)) p->inner_bad = true;
        return;
    }
    js_result r = json_scan_byte(&p->inner, c);
    if (r == JS_R_BAD) p->inner_bad = true;
    if (r == JS_R_DONE) p->inner_done = true;
    if (r == JS_R_DONE_BEFORE) {
        p->inner_done = true;
        if (!tc_is_ws(c)) p->inner_bad = true;
    }
}

static keel_status dec_put(toolcall_parser *p, dec_out *o, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (o->n == sizeof o->b) {
            keel_status st = tc_out_args(p, o->b, o->n);
            if (st) return st;
            o->n = 0;
        }
        inner_check(p, (uint8_t)s[i]);
        o->b[o->n++] = s[i];
        p->args_any = true;
    }
    return KEEL_OK;
}

static keel_status dec_cp(toolcall_parser *p, dec_out *o, uint32_t cp)
{
    char u[4];
    size_t k;
    if (cp < 0x80) {
        u[0] = (char)cp, k = 1;
    } else if (cp < 0x800) {
        u[0] = (char)(0xC0 | (cp >> 6)), u[1] = (char)(0x80 | (cp & 0x3F)), k = 2;
    } else if (cp < 0x10000) {
        u[0] = (char)(0xE0 | (cp >> 12)), u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[2] = (char)(0x80 | (cp & 0x3F)), k = 3;
    } else {
        u[0] = (char)(0xF0 | (cp >> 18)), u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3F)), u[3] = (char)(0x80 | (cp & 0x3F)), k = 4;
    }
    return dec_put(p, o, u, k);
}

static uint32_t hex_at(const uint8_t *h)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        uint8_t c = h[i];
        v = v * 16 + (uint32_t)(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
    }
    return v;
}

/* One byte of a JSON string's body (the scanner has validated it). */
static keel_status dec_byte(toolcall_parser *p, dec_out *o, uint8_t c)
{
    static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
    if (p->esc_n == 0) {
        if (c == '\\') {
            p->esc[0] = c;
            p->esc_n = 1;
            return KEEL_OK;
        }
        char ch = (char)c;
        return dec_put(p, o, &ch, 1);
    }
    p->esc[p->esc_n++] = c;
    if (p->esc_n == 2) {
        if (c == 'u') return KEEL_OK;
        const char *f = strchr(from, c);
        p->esc_n = 0;
        char ch = f ? to[f - from] : (char)c;
        return dec_put(p, o, &ch, 1);
    }
    if (p->esc_n < 6) return KEEL_OK;
    if (p->esc_n == 6) {
        uint32_t cp = hex_at(p->esc + 2);
        if (cp >= 0xD800 && cp < 0xDC00) return KEEL_OK; /* wait for the low half */
        p->esc_n = 0;
        return dec_cp(p, o, cp >= 0xDC00 && cp < 0xE000 ? 0xFFFD : cp);
    }
    if (p->esc_n == 7 && c != '\\') {
        p->esc_n = 0;
        keel_status st = dec_cp(p, o, 0xFFFD);
        return st ? st : dec_byte(p, o, c);
    }
    if (p->esc_n == 8 && c != 'u') {
        p->esc_n = 0;
        keel_status st = dec_cp(p, o, 0xFFFD);
        if (st) return st;
        st = dec_byte(p, o, '\\');
        return st ? st : dec_byte(p, o, c);
    }
    if (p->esc_n < 12) return KEEL_OK;
    uint32_t hi = hex_at(p->esc + 2), lo = hex_at(p->esc + 8);
    if (lo >= 0xDC00 && lo < 0xE000) {
        p->esc_n = 0;
        return dec_cp(p, o, 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00));
    }
    /* the second escape stands alone: re-run it */
    keel_status st = dec_cp(p, o, 0xFFFD);
    if (st) return st;
    memmove(p->esc, p->esc + 6, 6);
    p->esc_n = 5;
    return dec_byte(p, o, p->esc[5]);
}

static keel_status args_done(toolcall_parser *p)
{
    keel_status st = KEEL_OK;
    if (p->args_string) {
        if (p->esc_n) {
            dec_out o = {.n = 0};
            p->esc_n = 0;
            st = dec_cp(p, &o, 0xFFFD);
            if (st == KEEL_OK) st = tc_out_args(p, o.b, o.n);
            if (st) return st;
        }
        bool ok = p->inner_done || json_scan_end(&p->inner) == JS_R_DONE;
        if (p->args_any && (p->inner_bad || !ok)) tc_set_error(p, tc_err_strjson);
    }
    switch (p->sub) {
    case SUB_JSON:
        p->st = ST_TRAILER;
        json_scan_init_after_member(&p->scan);
        return KEEL_OK;
    case SUB_NAMED:
        st = tc_end_call(p, NULL);
        if (st == KEEL_OK) tc_block_next(p);
        return st;
    default: p->st = ST_CALLEND; return KEEL_OK;
    }
}

/* The output ended in the middle of a call. */
keel_status tc_call_cut(toolcall_parser *p, const char *why)
{
    keel_status st = tc_end_call(p, why);
    p->blk = TC_BLK_NONE;
    p->mark_end = 0;
    p->st = ST_TEXT;
    return st;
}

keel_status tc_h_args(toolcall_parser *p, bool at_end, bool *more)
{
    const char *s = tc_cur(p);
    size_t n = tc_avail(p), i = 0;
    keel_status st = KEEL_OK;
    if (!p->args_started) {
        while (i < n && tc_is_ws((uint8_t)s[i]))
            i++;
        p->pos += i;
        if (i == n) {
            if (at_end) return tc_call_cut(p, g_err_cut);
            *more = true;
            return KEEL_OK;
        }
        s += i, n -= i, i = 0;
        p->args_started = true;
        if (s[0] == '"') {
            p->args_string = true;
            json_scan_init(&p->inner);
        }
    }
    dec_out o = {.n = 0};
    size_t raw_from = 0;
    int next = 0; /* 0 continue, 1 done before s[i], 2 done with s[i], 3 bad */
    for (; i < n; i++) {
        uint8_t c = (uint8_t)s[i];
        bool in_str = json_scan_in_string(&p->scan);
        js_result r = json_scan_byte(&p->scan, c);
        if (r == JS_R_BAD) {
            next = 3;
            break;
        }
        if (r == JS_R_DONE_BEFORE) {
            next = 1;
            break;
        }
        if (p->args_string && in_str && r == JS_R_CONT) {
            st = dec_byte(p, &o, c);
            if (st) return st;
        }
        if (r == JS_R_DONE) {
            next = 2;
            break;
        }
    }
    size_t upto = next == 2 ? i + 1 : i;
    st = p->args_string ? tc_out_args(p, o.b, o.n) : tc_out_args(p, s + raw_from, upto - raw_from);
    if (st) return st;
    p->pos += upto;
    if (next == 1 || next == 2) return args_done(p);
    if (next == 3) {
        tc_set_error(p, g_err_json);
        p->st = ST_ARGS_RAW;
        return KEEL_OK;
    }
    if (!at_end) {
        *more = true;
        return KEEL_OK;
    }
    if (json_scan_end(&p->scan) == JS_R_DONE) return args_done(p);
    return tc_call_cut(p, g_err_cut);
}

/* Finds the first of `stops` (NULL-terminated, plus `extra`) in s[0..n):
 * index of the match start (n if none) and *hit (index of stops[], 99 for
 * extra, -2 for a partial match at the end, -1 none). */
static size_t find_stop(const char *const *stops, const char *extra, const char *s, size_t n,
                        bool at_end, int *hit, size_t *mlen)
{
    for (size_t i = 0; i < n; i++) {
        bool partial = false;
        for (int k = -1; k == -1 || stops[k]; k++) {
            const char *m = k < 0 ? extra : stops[k];
            if (!m || m[0] != s[i]) continue;
            size_t len = strlen(m), q = len < n - i ? len : n - i;
            if (memcmp(s + i, m, q) != 0) continue;
            if (q == len) {
                *hit = k < 0 ? 99 : k;
                *mlen = len;
                return i;
            }
            partial = true;
        }
        if (partial && !at_end) {
            *hit = -2;
            return i;
        }
    }
    *hit = -1;
    return n;
}

keel_status tc_h_args_raw(toolcall_parser *p, bool at_end, bool *more)
{
    const char *s = tc_cur(p);
    size_t n = tc_avail(p), mlen = 0;
    int hit;
    size_t k = find_stop(p->sp->raw_stops, p->blk_close, s, n, at_end, &hit, &mlen);
    keel_status st = tc_out_args(p, s, k);
    if (st) return st;
    p->pos += k;
    if (hit == -2 || (hit == -1 && !at_end)) {
        *more = true;
        return KEEL_OK;
    }
    if (hit == -1) return tc_call_cut(p, NULL);
    if (p->sub == SUB_JSON || p->sub == SUB_NAMED) {
        st = tc_end_call(p, NULL);
        if (st == KEEL_OK) tc_block_next(p);
        return st;
    }
    p->st = ST_CALLEND;
    return KEEL_OK;
}

keel_status tc_h_trailer(toolcall_parser *p, bool at_end, bool *more)
{
    const char *s = tc_cur(p);
    size_t n = tc_avail(p);
    for (size_t i = 0; i < n; i++) {
        js_result r = json_scan_byte(&p->scan, (uint8_t)s[i]);
        if (r == JS_R_BAD || r == JS_R_DONE_BEFORE) {
            p->pos += i;
            return tc_call_cut(p, "unexpected text after the arguments");
        }
        if (r == JS_R_DONE) {
            p->pos += i + 1;
            keel_status st = tc_end_call(p, NULL);
            if (st == KEEL_OK) tc_block_next(p);
            return st;
        }
    }
    p->pos += n;
    if (at_end) return tc_call_cut(p, NULL);
    *more = true;
    return KEEL_OK;
}

/* The marker after a call's arguments. */
keel_status tc_h_callend(toolcall_parser *p, bool at_end, bool *more)
{
    static const char *const ds[] = {"<｜tool▁call▁end｜>", NULL};
    static const char *const kimi[] = {"<|tool_call_end|>", NULL};
    static const char *const func[] = {"</function>", NULL};
    static const char *const harmony[] = {"<|call|>", "<|end|>", "<|return|>", NULL};
    static const char *const gemma[] = {"<tool_call|>", NULL};
    static const char *const solar[] = {"<|tool_call:end|>", NULL};
    const char *const *ends = ds;
    if (p->blk == TC_BLK_SOLAR) ends = solar;
    if (p->blk == TC_BLK_GEMMA) ends = gemma;
    if (p->blk == TC_BLK_KIMI || p->blk == TC_BLK_KIMI1) ends = kimi;
    if (p->blk == TC_BLK_FUNC) ends = func;
    if (p->blk == TC_BLK_HARMONY) ends = harmony;
    const char *s = tc_cur(p);
    size_t n = tc_avail(p), j = tc_skip_ws(s, n, 0);
    tc_pr r = TC_FAIL;
    if (p->sub == SUB_R1 && j < n) {
        size_t k = j;
        r = tc_lit(s, n, &k, "```");
        if (r == TC_OK) j = tc_skip_ws(s, n, k);
        if (r == TC_MORE && !at_end) goto wait;
    }
    if (j >= n) {
        if (!at_end) goto wait;
        return tc_call_cut(p, NULL);
    }
    for (int e = 0; ends[e]; e++) {
        size_t k = j;
        r = tc_lit(s, n, &k, ends[e]);
        if (r == TC_OK) {
            p->pos += k;
            keel_status st = tc_end_call(p, NULL);
            if (st == KEEL_OK) tc_block_next(p);
            return st;
        }
        if (r == TC_MORE && !at_end) goto wait;
    }
    /* no end marker: the call is complete, what follows is text */
    p->pos += j;
    if (p->blk == TC_BLK_HARMONY) {
        keel_status st = tc_end_call(p, NULL);
        p->blk = TC_BLK_NONE;
        p->st = ST_TEXT;
        return st;
    }
    return tc_call_cut(p, NULL);
wait:
    *more = true;
    return KEEL_OK;
}

/* ---- XML parameters ------------------------------------------------------------------ */

static const char g_err_xml[] = "unexpected text in the tool call";
const char tc_err_unclosed[] = "the tool call is not closed";
static const char g_err_value[] = "a parameter value is not closed";

static keel_status xml_close(toolcall_parser *p, const char *why)
{
    keel_status st = tc_out_args_str(p, p->p_first ? "{}" : "}");
    return st ? st : tc_end_call(p, why);
}

static keel_status member_prefix(toolcall_parser *p)
{
    keel_status st = tc_out_args_str(p, p->p_first ? "{\"" : ", \"");
    if (st == KEEL_OK) st = tc_out_args_escaped(p, p->pname, strlen(p->pname));
    if (st == KEEL_OK) st = tc_out_args_str(p, "\": ");
    p->p_first = false;
    return st;
}

keel_status tc_h_xml_params(toolcall_parser *p, bool at_end, bool *more)
{
    const tc_xml *x = p->xml;
    const char *s = tc_cur(p);
    size_t n = tc_avail(p);
    bool capped = n >= HDR_CAP;
    size_t lim = capped ? HDR_CAP : n;
    bool end = at_end && !capped;
    size_t j = tc_skip_ws(s, lim, 0), k = j;
    tc_pr r;
    if (j >= lim) {
        if (capped) goto bad;
        if (at_end) {
            keel_status st = xml_close(p, tc_err_unclosed);
            p->pos += j;
            tc_block_done(p);
            return st;
        }
        goto wait;
    }
    r = tc_lit(s, lim, &k, x->param_open);
    if (r == TC_MORE) goto more_or_bad;
    if (r == TC_OK) {
        const char *stops = x->param_name_end == '"' ? "\"\n<>" : x->param_name_end == '>' ? ">\n<" : "<\n";
        r = tc_read_name(s, lim, &k, stops, p->pname);
        if (r == TC_MORE) goto more_or_bad;
        if (r == TC_FAIL) goto bad;
        size_t attr = k, attr_end = k;
        if (x->param_name_end == '"' || x->param_name_end == '>') {
            if (s[k] != x->param_name_end) goto bad;
            k++;
            attr = k;
            if (x->param_name_end == '"') {
                r = tc_xml_attrs(x, s, lim, k, &attr_end, &k);
                if (r == TC_MORE) goto more_or_bad;
                if (r == TC_FAIL) goto bad;
            }
        } else {
            r = tc_lit(s, lim, &k, x->param_after);
            if (r == TC_MORE) goto more_or_bad;
            if (r == TC_FAIL) goto bad;
            k = tc_skip_ws(s, lim, k);
            r = tc_lit(s, lim, &k, x->param_after2);
            if (r == TC_MORE) goto more_or_bad;
            if (r == TC_FAIL) goto bad;
        }
        p->ptype = tc_param_type(p, p->calls[p->call].name, p->pname);
        if (x->string_attr && attr_end > attr) { /* DSML: string="true|false" */
            if (memmem(s + attr, attr_end - attr, "string=\"true\"", 13)) p->ptype = PT_STRING;
            if (memmem(s + attr, attr_end - attr, "string=\"false\"", 14)) p->ptype = PT_JSON;
        }
        if (x->type_attr && attr_end > attr) { /* Kimi K3: type="string" or a JSON type */
            const char *t = memmem(s + attr, attr_end - attr, "type=\"", 6);
            if (t) {
                const char *te = memchr(t + 6, '"', (size_t)(s + attr_end - (t + 6)));
                p->ptype = te && te - (t + 6) == 6 && memcmp(t + 6, "string", 6) == 0 ? PT_STRING : PT_JSON;
            }
        }
        p->pos += k;
        p->v_stream = x->stream_strings && p->ptype == PT_STRING;
        p->v_start = true;
        p->v_scanned = 0;
        p->st = ST_XML_VALUE;
        if (p->v_stream) {
            keel_status st = member_prefix(p);
            if (st == KEEL_OK) st = tc_out_args_str(p, "\"");
            return st;
        }
        return KEEL_OK;
    }
    {
        const char *closes[3] = {x->invoke_close, x->block_close, x->block_close2};
        for (int c = 0; c < 3; c++) {
            if (!closes[c]) continue;
            k = j;
            r = tc_lit(s, lim, &k, closes[c]);
            if (r == TC_MORE) goto more_or_bad;
            if (r == TC_OK) {
                p->pos += k;
                keel_status st = xml_close(p, NULL);
                if (st) return st;
                if (c == 0)
                    tc_block_next(p);
                else
                    tc_block_done(p);
                return KEEL_OK;
            }
        }
    }
bad: {
    p->pos += j;
    keel_status st = xml_close(p, g_err_xml);
    p->blk = TC_BLK_NONE;
    p->st = ST_TEXT;
    return st;
}
more_or_bad:
    if (end || capped) goto bad;
wait:
    *more = true;
    return KEEL_OK;
}

static bool ieq(const char *t, size_t n, const char *w)
{
    return strlen(w) == n && strncasecmp(t, w, n) == 0;
}

/* A complete XML value, typed: "name": value. */
static keel_status emit_value(toolcall_parser *p, const char *v, size_t n)
{
    const tc_xml *x = p->xml;
    if (x->strip_newlines) {
        if (n && v[0] == '\n') v++, n--;
        if (n && v[n - 1] == '\n') n--;
    }
    if (x->cdata && n >= 12 && memcmp(v, "<![CDATA[", 9) == 0 && memcmp(v + n - 3, "]]>", 3) == 0)
        v += 9, n -= 12;
    size_t a = 0, e = n;
    while (a < e && tc_is_ws((uint8_t)v[a]))
        a++;
    while (e > a && tc_is_ws((uint8_t)v[e - 1]))
        e--;
    const char *t = v + a;
    size_t tn = e - a;
    const char *raw = NULL;
    size_t rawn = 0;
    switch (p->ptype) {
    case PT_NUMBER:
    case PT_INTEGER:
        if (tn && (t[0] == '-' || (t[0] >= '0' && t[0] <= '9')) && tc_json_whole(t, tn)) raw = t, rawn = tn;
        break;
    case PT_BOOL:
        if (ieq(t, tn, "true")) raw = "true", rawn = 4;
        if (ieq(t, tn, "false")) raw = "false", rawn = 5;
        break;
    case PT_NULL:
        if (ieq(t, tn, "null") || ieq(t, tn, "none")) raw = "null", rawn = 4;
        break;
    case PT_OBJECT:
    case PT_ARRAY:
        if (tn && t[0] == (p->ptype == PT_OBJECT ? '{' : '[') && tc_json_whole(t, tn)) raw = t, rawn = tn;
        break;
    case PT_JSON:
        if (tc_json_whole(t, tn)) raw = t, rawn = tn;
        break;
    case PT_ANY:
        if (tn && (t[0] == '{' || t[0] == '[') && tc_json_whole(t, tn)) raw = t, rawn = tn;
        break;
    default: break;
    }
    keel_status st = member_prefix(p);
    if (st) return st;
    if (raw) return tc_out_args(p, raw, rawn);
    st = tc_out_args_str(p, "\"");
    if (st == KEEL_OK) st = tc_out_args_escaped(p, v, n);
    if (st == KEEL_OK) st = tc_out_args_str(p, "\"");
    return st;
}

keel_status tc_h_xml_value(toolcall_parser *p, bool at_end, bool *more)
{
    const tc_xml *x = p->xml;
    const char *s = tc_cur(p);
    size_t n = tc_avail(p), mlen = strlen(x->param_close);
    keel_status st;
    if (p->v_stream) {
        if (p->v_start) {
            if (n == 0) goto eof_or_wait;
            p->v_start = false;
            if (x->strip_newlines && s[0] == '\n') {
                p->pos++;
                return KEEL_OK;
            }
        }
        char nl_close[64];
        const char *stops[3] = {x->param_close, NULL, NULL};
        if (x->strip_newlines && mlen + 2 <= sizeof nl_close) {
            nl_close[0] = '\n';
            memcpy(nl_close + 1, x->param_close, mlen + 1);
            stops[1] = nl_close;
        }
        int hit;
        size_t ml = 0, k = find_stop(stops, NULL, s, n, at_end, &hit, &ml);
        st = tc_out_args_escaped(p, s, k);
        if (st) return st;
        p->pos += k;
        if (hit >= 0) {
            p->pos += ml;
            p->st = ST_XML_PARAMS;
            return tc_out_args_str(p, "\"");
        }
        if (hit == -2 || !at_end) goto wait;
        st = tc_out_args_str(p, "\"");
        if (st == KEEL_OK) st = xml_close(p, g_err_value);
        tc_block_done(p);
        return st;
    }
    size_t w = n < p->max_held ? n : p->max_held;
    size_t from = p->v_scanned > mlen ? p->v_scanned - mlen : 0;
    if (x->cdata) { /* a CDATA section may hold the close tag: the value ends after it */
        size_t a = tc_skip_ws(s, w, 0), q = a;
        tc_pr r = tc_lit(s, w, &q, "<![CDATA[");
        if (r == TC_MORE && !at_end && w < p->max_held) goto wait;
        const char *ce = r == TC_OK ? memmem(s + q, w - q, "]]>", 3) : NULL;
        if (r == TC_OK && !ce && !at_end && w < p->max_held) {
            p->v_scanned = 0;
            goto wait;
        }
        if (ce) from = BASE_MAX(from, (size_t)(ce - s) + 3);
    }
    for (size_t i = from; i + mlen <= w; i++) {
        if (s[i] == x->param_close[0] && memcmp(s + i, x->param_close, mlen) == 0) {
            st = emit_value(p, s, i);
            p->pos += i + mlen;
            p->st = ST_XML_PARAMS;
            return st;
        }
    }
    p->v_scanned = w;
    if (n >= p->max_held) { /* too long to hold: it streams as a string */
        p->v_stream = true;
        p->ptype = PT_STRING;
        st = member_prefix(p);
        return st ? st : tc_out_args_str(p, "\"");
    }
    if (!at_end) goto wait;
    st = emit_value(p, s, n);
    p->pos += n;
    if (st == KEEL_OK) st = xml_close(p, g_err_value);
    tc_block_done(p);
    return st;
eof_or_wait:
    if (at_end) {
        st = tc_out_args_str(p, "\"");
        if (st == KEEL_OK) st = xml_close(p, g_err_value);
        tc_block_done(p);
        return st;
    }
wait:
    *more = true;
    return KEEL_OK;
}

/* ---- harmony -------------------------------------------------------------------------------- */

/* The token after `key` in h[0..n) (the last occurrence when last): up to
 * a space, '<' or the end. */
static size_t h_token(const char *h, size_t n, const char *key, bool last, const char **tok)
{
    size_t kl = strlen(key), len = 0;
    *tok = NULL;
    for (size_t i = 0; i + kl <= n; i++) {
        if (memcmp(h + i, key, kl) != 0) continue;
        if (key[0] == 't' && i > 0 && h[i - 1] != ' ' && h[i - 1] != '>') continue;
        size_t a = i + kl, e = a;
        while (e < n && h[e] != ' ' && h[e] != '<' && !tc_is_ws((uint8_t)h[e]))
            e++;
        *tok = h + a;
        len = e - a;
        if (!last) break;
    }
    return len;
}

static bool tok_is(const char *t, size_t n, const char *w)
{
    return t && strlen(w) == n && memcmp(t, w, n) == 0;
}

/*
 * A harmony message header ([<|start|>assistant][ to=R]<|channel|>C[ to=R]
 * [<|constrain|>..]<|message|>), then its body:
 *   - to=functions.NAME (with a tools list: NAME among them, else the
 *     message is text): a tool call, its body the arguments;
 *   - to=assistant / to=user: no recipient (the last channel counts);
 *   - any other recipient not among the tools (a built-in tool the request
 *     did not offer: container.exec, python, browser...): the message is
 *     dropped, as llama.cpp does;
 *   - channel analysis: reasoning; with reasoning_format none it stays in
 *     the content verbatim, header and <|end|> included, as llama.cpp does;
 *   - other channels (final, commentary): content.
 */
keel_status tc_h_h_header(toolcall_parser *p, bool at_end, bool *more)
{
    static const char msg[] = "<|message|>";
    const char *s = tc_cur(p);
    size_t n = tc_avail(p);
    bool capped = n >= HDR_CAP;
    size_t lim = capped ? HDR_CAP : n;
    size_t j = tc_skip_ws(s, lim, 0), k = j, q;
    p->h_drop = p->h_raw = p->h_tool = false;
    if (j > 0) { /* whitespace before a header is dropped */
        p->pos += j;
        return KEEL_OK;
    }
    if (n == 0) {
        if (at_end) {
            p->st = ST_TEXT;
            return KEEL_OK;
        }
        *more = true;
        return KEEL_OK;
    }
    tc_pr r = tc_lit(s, lim, &k, "<|start|>");
    if (r == TC_MORE) goto more_or_fail;
    size_t hstart = r == TC_OK ? k : j;
    for (q = hstart; q < lim; q++) {
        if (s[q] != '<') continue;
        size_t t = q;
        r = tc_lit(s, lim, &t, msg);
        if (r == TC_OK) break;
        if (r == TC_MORE) goto more_or_fail;
    }
    if (q >= lim) goto more_or_fail;
    {
        const char *h = s + hstart, *chan, *to;
        size_t hn = q - hstart, used = q + sizeof msg - 1;
        size_t cl = h_token(h, hn, "<|channel|>", true, &chan);
        size_t tl = h_token(h, hn, "to=", false, &to);
        if (p->sp->muse && to) { /* to=self: reasoning; to=user: the answer; to=TOOL: its call block */
            bool self = tok_is(to, tl, "self"), user = tok_is(to, tl, "user");
            char name[TOOLCALL_NAME_CAP];
            bool tool = !self && !user && tc_name_ok(to, tl);
            if (tool) {
                memcpy(name, to, tl);
                name[tl] = '\0';
                tool = tc_tool_known(p, name);
            }
            p->pos += used;
            p->reasoning_mode = self && p->o.parse_reasoning;
            p->h_tool = tool;
            p->h_drop = !self && !user && !tool; /* a recipient the request did not offer */
            p->st = ST_TEXT;
            p->skip_ws = false;
            return KEEL_OK;
        }
        if (tok_is(to, tl, "assistant") || tok_is(to, tl, "user")) to = NULL;
        if (to) {
            hdr hd;
            memset(&hd, 0, sizeof hd);
            bool fn = tl > 10 && memcmp(to, "functions.", 10) == 0;
            if (fn) to += 10, tl -= 10;
            if (!tc_name_ok(to, tl)) goto reject;
            memcpy(hd.name, to, tl);
            hd.name[tl] = '\0';
            bool known = p->o.tools && tc_tool_known(p, hd.name);
            /* a built-in recipient (container.exec, python) is not a call of
             * the request's: dropped; a function not among the tools is text */
            if (!fn && !known) goto drop;
            if (!tc_tool_known(p, hd.name)) goto reject;
            hd.kind = H_CALL;
            hd.next = ST_ARGS;
            hd.sub = SUB_V31;
            p->blk = TC_BLK_HARMONY;
            p->reasoning_mode = false;
            return tc_commit(p, &hd, used);
        drop: /* a call nobody offered: nothing of it reaches the client */
            p->pos += used;
            p->reasoning_mode = false;
            p->h_drop = true;
            p->st = ST_TEXT;
            return KEEL_OK;
        reject:
            p->reasoning_mode = false;
            p->seen_content = true;
            keel_status st = tc_emit_text(p, used);
            p->st = ST_TEXT;
            return st;
        }
        bool analysis = tok_is(chan, cl, "analysis");
        if (analysis && !p->o.parse_reasoning) { /* the message stays in the content, header included */
            p->reasoning_mode = false;
            p->seen_content = true;
            p->h_raw = true;
            size_t from = chan - s - (sizeof "<|channel|>" - 1);
            p->pos += from;
            keel_status st = tc_emit_text(p, used - from);
            p->st = ST_TEXT;
            return st;
        }
        p->pos += used;
        p->reasoning_mode = p->o.parse_reasoning && analysis;
        p->st = ST_TEXT;
        p->skip_ws = false;
        return KEEL_OK;
    }
more_or_fail:
    if (!at_end && !capped) {
        *more = true;
        return KEEL_OK;
    }
    {
        /* not a header: the text is content; step over a leading marker */
        size_t e = j, t = j;
        if (tc_lit(s, lim, &t, "<|start|>") == TC_OK) e = t;
        t = j;
        if (tc_lit(s, lim, &t, "<|channel|>") == TC_OK) e = t;
        p->reasoning_mode = false;
        p->seen_content = true;
        keel_status st = tc_emit_text(p, e);
        p->st = ST_TEXT;
        return st;
    }
}

/* ---- MiniMax M3 ------------------------------------------------------------------------------ */

/* An invoke's body up to NS</invoke>, converted whole (toolcall_mm3.c). */
keel_status tc_h_mm3(toolcall_parser *p, bool at_end, bool *more)
{
    static const char close[] = TC_MM3_NS "</invoke>";
    const size_t cl = sizeof close - 1;
    const char *s = tc_cur(p);
    size_t n = tc_avail(p), from = p->obj_len > cl ? p->obj_len - cl : 0, end = n;
    bool found = false;
    for (size_t i = from; i + cl <= n; i++)
        if (s[i] == close[0] && memcmp(s + i, close, cl) == 0) {
            end = i;
            found = true;
            break;
        }
    if (!found) {
        p->obj_len = n;
        if (!at_end && n < p->max_held) {
            *more = true;
            return KEEL_OK;
        }
    }
    tc_buf json = {0};
    bool ok = false;
    keel_status st = tc_mm3_args(tc_tool_params(p, p->calls[p->call].name), s, end, &json, &ok);
    /* a body that is not elements: the raw text, and the call marked */
    if (st == KEEL_OK) st = ok ? tc_out_args(p, json.p, json.len) : tc_out_args(p, s, end);
    tc_buf_free(&json);
    if (st) return tc_fail_nomem(p, st);
    p->pos += found ? end + cl : end;
    if (!found) return tc_call_cut(p, ok ? tc_err_unclosed : g_err_xml);
    st = tc_end_call(p, ok ? NULL : g_err_xml);
    if (st == KEEL_OK) tc_block_next(p);
    return st;
}
