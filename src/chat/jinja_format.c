/*
 * jinja_format.c — a chat template's string formatting, with CPython's
 * semantics: printf-style `%` (str % args), a str.format subset and the
 * strftime_now global (the render's clock, in the conversions templates use).
 */
#include "jinja_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- printf-style % formatting --------------------------------------------------- */

typedef struct fspec {
    char fill, align, sign;
    bool alt, zero, comma, have_prec;
    int64_t width, prec;
    char type;
} fspec;

/* Formats one number or string per spec into b. */
static keel_status format_value(jx *x, jsb *b, jv v, const fspec *f)
{
    char tmp[1024]; /* the longest: 309 integer digits, '.', 100 decimals */
    jsb body;
    jsb_init(&body, &x->mem, x->lim.max_output);
    char type = f->type;
    bool numeric = false, neg = false;
    if (type == 's' || type == 'r' || type == 'a' || (type == 0 && v.t != JT_INT &&
                                                       v.t != JT_FLOAT && v.t != JT_BOOL)) {
        if (type == 'r' || type == 'a')
            TRY(jv_repr(x, &body, v, 0));
        else
            TRY(jv_str(x, &body, v));
        if (f->have_prec) {
            /* precision truncates strings (code points) */
            size_t cut = body.n, k = 0, i = 0;
            while (i < body.n && k < (size_t)f->prec) {
                utf8_next(body.d, body.n, &i);
                k++;
            }
            if (i < cut) body.n = i;
        }
    } else {
        numeric = true;
        double d;
        int64_t iv;
        if (!jv_as_num(v, &d))
            return jx_fail(x, KEEL_EINVAL, "format requires a number, not %s", jv_type_name(v));
        bool isint = jv_as_int(v, &iv);
        if (type == 0) type = isint ? 'd' : 'g';
        if (type == 'c') {
            if (!isint) return jx_fail(x, KEEL_EINVAL, "%%c requires int or char");
            jsb_addcp(&body, (uint32_t)iv);
            numeric = false;
        } else if (type == 'd' || type == 'i' || type == 'u' || type == 'x' || type == 'X' ||
                   type == 'o' || type == 'b') {
            if (!isint) {
                if (type != 'd' && type != 'i' && type != 'u')
                    return jx_fail(x, KEEL_EINVAL, "%%%c format: an integer is required, not float",
                                   type);
                if (!isfinite(d)) return jx_fail(x, KEEL_EINVAL, "cannot convert float to integer");
                iv = (int64_t)d;
            }
            neg = iv < 0;
            uint64_t u = neg ? (uint64_t)0 - (uint64_t)iv : (uint64_t)iv;
            if (type == 'b') {
                char bits[65];
                int k = 64;
                bits[k] = 0;
                do {
                    bits[--k] = (char)('0' + (u & 1));
                    u >>= 1;
                } while (u);
                snprintf(tmp, sizeof tmp, "%s%s", f->alt ? "0b" : "", bits + k);
            } else if (type == 'x' || type == 'X') {
                snprintf(tmp, sizeof tmp, type == 'x' ? "%s%llx" : "%s%llX",
                         f->alt ? (type == 'x' ? "0x" : "0X") : "", (unsigned long long)u);
            } else if (type == 'o') {
                snprintf(tmp, sizeof tmp, "%s%llo", f->alt ? "0o" : "", (unsigned long long)u);
            } else if (f->comma) {
                char raw[32];
                int n = snprintf(raw, sizeof raw, "%llu", (unsigned long long)u), k = 0;
                for (int i = 0; i < n; i++) {
                    if (i && (n - i) % 3 == 0) tmp[k++] = ',';
                    tmp[k++] = raw[i];
                }
                tmp[k] = 0;
            } else {
                snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)u);
            }
            jsb_adds(&body, tmp);
        } else if (type && strchr("eEfFgG%", type)) {
            int prec = f->have_prec ? (int)BASE_MIN(f->prec, 100) : 6;
            neg = signbit(d) && !isnan(d);
            double a = fabs(d);
            if (type == '%') {
                snprintf(tmp, sizeof tmp, "%.*f%%", prec, a * 100);
            } else {
                char fmt[8] = {'%', '.', '*', type, 0};
                if (f->alt) fmt[1] = '#', fmt[2] = '.', fmt[3] = '*', fmt[4] = type, fmt[5] = 0;
                snprintf(tmp, sizeof tmp, fmt, prec, a);
            }
            jsb_adds(&body, tmp);
        } else {
            return jx_fail(x, KEEL_EINVAL, "unsupported format character '%c'", type);
        }
    }
    if (body.oom || body.over) return jsb_status(x, &body);
    const char *sign = neg ? "-" : numeric && f->sign == '+' ? "+" : numeric && f->sign == ' ' ? " " : "";
    size_t len = jstr_len_cp(&(jstr){body.n ? body.d : "", body.n, false}) + strlen(sign);
    int64_t pad = f->width > (int64_t)len ? f->width - (int64_t)len : 0;
    char align = f->align ? f->align : (numeric ? '>' : '<');
    char fill = f->fill ? f->fill : ' ';
    if (f->zero && numeric && !f->align) {
        jsb_adds(b, sign);
        for (int64_t i = 0; i < pad; i++) jsb_addc(b, '0');
        jsb_add(b, body.d, body.n);
    } else {
        int64_t left = align == '>' ? pad : align == '^' ? pad / 2 : 0;
        if (align == '=') {
            jsb_adds(b, sign);
            for (int64_t i = 0; i < pad; i++) jsb_addc(b, fill);
        } else {
            for (int64_t i = 0; i < left; i++) jsb_addc(b, fill);
            jsb_adds(b, sign);
        }
        jsb_add(b, body.d, body.n);
        if (align != '=')
            for (int64_t i = 0; i < pad - left; i++) jsb_addc(b, fill);
    }
    return b->oom || b->over ? jsb_status(x, b) : KEEL_OK;
}

keel_status jstr_percent_format(jx *x, jstr *fmt, jv args, jv *out)
{
    const jv *items = &args;
    size_t n = 1;
    const jdict *map = NULL;
    if (args.t == JT_LIST && args.u.l->kind == JL_TUPLE) {
        items = args.u.l->v;
        n = args.u.l->n;
    } else if (args.t == JT_DICT) {
        map = args.u.d;
    }
    size_t used = 0;
    jsb b;
    jsb_init(&b, &x->mem, x->lim.max_output);
    const char *s = fmt->s;
    size_t len = fmt->n;
    for (size_t i = 0; i < len;) {
        if (s[i] != '%') {
            size_t j = i;
            while (j < len && s[j] != '%') j++;
            jsb_add(&b, s + i, j - i);
            i = j;
            continue;
        }
        i++;
        if (i >= len) return jx_fail(x, KEEL_EINVAL, "incomplete format");
        if (s[i] == '%') {
            jsb_addc(&b, '%');
            i++;
            continue;
        }
        jv val;
        bool have_val = false;
        if (s[i] == '(') {
            size_t j = i + 1;
            while (j < len && s[j] != ')') j++;
            if (j >= len) return jx_fail(x, KEEL_EINVAL, "incomplete format key");
            if (!map) return jx_fail(x, KEEL_EINVAL, "format requires a mapping");
            int64_t k = jdict_find_str(map, s + i + 1, j - i - 1);
            if (k < 0)
                return jx_fail(x, KEEL_EINVAL, "KeyError: '%.*s'", (int)(j - i - 1), s + i + 1);
            val = map->v[k];
            have_val = true;
            i = j + 1;
        }
        fspec f = {0};
        while (i < len && s[i] && strchr("-+ #0", s[i])) {
            if (s[i] == '-') f.align = '<';
            if (s[i] == '+') f.sign = '+';
            if (s[i] == ' ' && !f.sign) f.sign = ' ';
            if (s[i] == '#') f.alt = true;
            if (s[i] == '0') f.zero = true;
            i++;
        }
        if (f.align) f.zero = false;
        if (i < len && s[i] == '*') return jx_fail(x, KEEL_EINVAL, "* width is not supported");
        while (i < len && s[i] >= '0' && s[i] <= '9' && f.width < 100000)
            f.width = f.width * 10 + (s[i++] - '0');
        if (i < len && s[i] == '.') {
            i++;
            f.have_prec = true;
            while (i < len && s[i] >= '0' && s[i] <= '9' && f.prec < 100000)
                f.prec = f.prec * 10 + (s[i++] - '0');
        }
        while (i < len && (s[i] == 'l' || s[i] == 'h' || s[i] == 'L')) i++;
        if (i >= len) return jx_fail(x, KEEL_EINVAL, "incomplete format");
        f.type = s[i++];
        if (!f.type || !strchr("sradiuoxXeEfFgGc", f.type))
            return jx_fail(x, KEEL_EINVAL, "unsupported format character '%c' (0x%x)", f.type,
                           (unsigned char)f.type);
        if (!have_val) {
            if (map) {
                val = args;
            } else {
                if (used >= n) return jx_fail(x, KEEL_EINVAL, "not enough arguments for format string");
                val = items[used++];
            }
        }
        if (f.type == 'i' || f.type == 'u') f.type = 'd';
        /* printf pads on the left unless '-'; 0 pads numbers only */
        if (strchr("sra", f.type)) f.zero = false;
        if (!f.align && !f.zero) f.align = '>';
        if (strchr("doxXeEfFgGc", f.type) && val.t != JT_INT &&
            val.t != JT_FLOAT && val.t != JT_BOOL)
            return jx_fail(x, KEEL_EINVAL, "%%%c format: a real number is required, not %s",
                           f.type, jv_type_name(val));
        TRY(format_value(x, &b, val, &f));
    }
    if (!map && used < n && !(n == 1 && args.t != JT_LIST))
        return jx_fail(x, KEEL_EINVAL, "not all arguments converted during string formatting");
    return jsb_ret(x, &b, out);
}

/* ---- str.format ------------------------------------------------------------------ */

static keel_status parse_spec(jx *x, const char *s, size_t n, fspec *f)
{
    memset(f, 0, sizeof *f);
    size_t i = 0;
    if (n >= 2 && s[1] && strchr("<>=^", s[1])) {
        f->fill = s[0];
        f->align = s[1];
        i = 2;
    } else if (n >= 1 && s[0] && strchr("<>=^", s[0])) {
        f->align = s[0];
        i = 1;
    }
    if (i < n && s[i] && strchr("+- ", s[i])) f->sign = s[i++];
    if (f->sign == '-') f->sign = 0;
    if (i < n && s[i] == '#') f->alt = true, i++;
    if (i < n && s[i] == '0') f->zero = true, i++;
    while (i < n && s[i] >= '0' && s[i] <= '9' && f->width < 100000) f->width = f->width * 10 + (s[i++] - '0');
    if (i < n && s[i] == ',') f->comma = true, i++;
    if (i < n && s[i] == '.') {
        i++;
        f->have_prec = true;
        while (i < n && s[i] >= '0' && s[i] <= '9' && f->prec < 100000) f->prec = f->prec * 10 + (s[i++] - '0');
    }
    if (i < n) f->type = s[i++];
    if (i != n) return jx_fail(x, KEEL_EINVAL, "Invalid format specifier");
    if (f->zero && !f->align) f->fill = '0', f->align = '=', f->zero = false;
    return KEEL_OK;
}

keel_status jinja_str_format(jx *x, jstr *fmt, const jargs *a, jv *out)
{
    jsb b;
    jsb_init(&b, &x->mem, x->lim.max_output);
    const char *s = fmt->s;
    size_t len = fmt->n, autoi = 0;
    for (size_t i = 0; i < len;) {
        char c = s[i];
        if (c == '}') {
            if (i + 1 < len && s[i + 1] == '}') {
                jsb_addc(&b, '}');
                i += 2;
                continue;
            }
            return jx_fail(x, KEEL_EINVAL, "Single '}' encountered in format string");
        }
        if (c != '{') {
            size_t j = i;
            while (j < len && s[j] != '{' && s[j] != '}') j++;
            jsb_add(&b, s + i, j - i);
            i = j;
            continue;
        }
        if (i + 1 < len && s[i + 1] == '{') {
            jsb_addc(&b, '{');
            i += 2;
            continue;
        }
        size_t j = i + 1;
        while (j < len && s[j] != '}') j++;
        if (j >= len) return jx_fail(x, KEEL_EINVAL, "Single '{' encountered in format string");
        const char *field = s + i + 1;
        size_t fl = j - i - 1, name_end = 0;
        while (name_end < fl && field[name_end] != '.' && field[name_end] != '[' &&
               field[name_end] != '!' && field[name_end] != ':')
            name_end++;
        jv v;
        if (name_end == 0) {
            if (autoi >= a->n_pos)
                return jx_fail(x, KEEL_EINVAL, "Replacement index %zu out of range", autoi);
            v = a->pos[autoi++];
        } else if (strspn(field, "0123456789") >= name_end) {
            size_t k = 0;
            for (size_t q = 0; q < name_end && k < SIZE_MAX / 20; q++) k = k * 10 + (size_t)(field[q] - '0');
            if (k >= a->n_pos)
                return jx_fail(x, KEEL_EINVAL, "Replacement index %zu out of range", k);
            v = a->pos[k];
        } else {
            size_t q;
            for (q = 0; q < a->n_kw; q++)
                if (a->kw_names[q]->n == name_end && memcmp(a->kw_names[q]->s, field, name_end) == 0)
                    break;
            if (q == a->n_kw)
                return jx_fail(x, KEEL_EINVAL, "KeyError: '%.*s'", (int)name_end, field);
            v = a->kw[q];
        }
        size_t p = name_end;
        while (p < fl && (field[p] == '.' || field[p] == '[')) {
            if (field[p] == '.') {
                size_t e = p + 1;
                while (e < fl && field[e] != '.' && field[e] != '[' && field[e] != '!' &&
                       field[e] != ':')
                    e++;
                jstr *nm = jstr_new(&x->mem, field + p + 1, e - p - 1);
                if (!nm) return jx_oom(x);
                TRY(jv_getattr(x, v, nm, &v));
                p = e;
            } else {
                size_t e = p + 1;
                while (e < fl && field[e] != ']') e++;
                if (e >= fl) return jx_fail(x, KEEL_EINVAL, "Missing ']' in format string");
                const char *k = field + p + 1;
                size_t kl = e - p - 1;
                bool digits = kl > 0;
                int64_t iv = 0;
                for (size_t q = 0; q < kl && digits; q++) {
                    if (k[q] < '0' || k[q] > '9') {
                        digits = false;
                    } else {
                        if (iv > INT64_MAX / 10 - 1)
                            return jx_fail(x, KEEL_EINVAL, "Too many decimal digits in format string");
                        iv = iv * 10 + (k[q] - '0');
                    }
                }
                jv key;
                if (digits) {
                    key = jv_int(iv);
                } else {
                    jstr *ks = jstr_new(&x->mem, k, kl);
                    if (!ks) return jx_oom(x);
                    key = jv_strv(ks);
                }
                TRY(jv_getitem(x, v, key, &v));
                p = e + 1;
            }
        }
        char conv = 0;
        if (p < fl && field[p] == '!') {
            if (p + 1 >= fl) return jx_fail(x, KEEL_EINVAL, "end of string while looking for conversion specifier");
            conv = field[p + 1];
            p += 2;
        }
        fspec f;
        if (p < fl && field[p] == ':')
            TRY(parse_spec(x, field + p + 1, fl - p - 1, &f));
        else
            TRY(parse_spec(x, "", 0, &f));
        if (conv == 'r' || conv == 'a') {
            jsb t;
            jsb_init(&t, &x->mem, x->lim.max_output);
            TRY(jv_repr(x, &t, v, 0));
            jstr *r = jsb_done(&t);
            if (!r) return jx_oom(x);
            v = jv_strv(r);
        } else if (conv == 's') {
            jstr *r = NULL;
            TRY(jv_to_str(x, v, &r));
            v = jv_strv(r);
        }
        /* Undefined formats as '' (object.__format__), but not with a spec */
        if (v.t == JT_UNDEF && p < fl && field[p] == ':' && p + 1 < fl)
            return jx_fail(x, KEEL_EINVAL, "unsupported format string passed to Undefined.__format__");
        TRY(format_value(x, &b, v, &f));
        i = j + 1;
    }
    return jsb_ret(x, &b, out);
}

/* ---- strftime ---------------------------------------------------------------------- */

static const char *const g_wday[] = {"Sunday", "Monday", "Tuesday", "Wednesday", "Thursday",
                                     "Friday", "Saturday"};
static const char *const g_mon[] = {"January", "February", "March",     "April",   "May",      "June",
                                    "July",    "August",   "September", "October", "November", "December"};

static int days_before_month(int y, int m)
{
    static const int cum[] = {0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334};
    bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    return cum[m - 1] + (leap && m > 2);
}

static int weekday(int y, int m, int d)
{
    /* Sakamoto: 0 = Sunday */
    static const int t[] = {0, 3, 2, 5, 0, 3, 5, 1, 4, 6, 2, 4};
    if (m < 3) y -= 1;
    return (y + y / 4 - y / 100 + y / 400 + t[m - 1] + d) % 7;
}

keel_status jinja_strftime_now(jx *x, jstr *fmt, jv *out)
{
    const jinja_time *t = &x->now;
    int wd = weekday(t->year, t->mon, t->mday), yd = days_before_month(t->year, t->mon) + t->mday;
    int h12 = t->hour % 12 == 0 ? 12 : t->hour % 12;
    jsb b;
    jsb_init(&b, &x->mem, x->lim.max_output);
    const char *s = fmt->s;
    for (size_t i = 0; i < fmt->n; i++) {
        if (s[i] != '%' || i + 1 >= fmt->n) {
            jsb_addc(&b, s[i]);
            continue;
        }
        char c = s[++i];
        bool nopad = false;
        if (c == '-' && i + 1 < fmt->n) {
            nopad = true;
            c = s[++i];
        }
        const char *f2 = nopad ? "%d" : "%02d";
        switch (c) {
        case 'Y': jsb_addf(&b, "%d", t->year); break;
        case 'y': jsb_addf(&b, f2, t->year % 100); break;
        case 'm': jsb_addf(&b, f2, t->mon); break;
        case 'd': jsb_addf(&b, f2, t->mday); break;
        case 'e': jsb_addf(&b, nopad ? "%d" : "%2d", t->mday); break;
        case 'H': jsb_addf(&b, f2, t->hour); break;
        case 'I': jsb_addf(&b, f2, h12); break;
        case 'M': jsb_addf(&b, f2, t->min); break;
        case 'S': jsb_addf(&b, f2, t->sec); break;
        case 'j': jsb_addf(&b, nopad ? "%d" : "%03d", yd); break;
        case 'p': jsb_adds(&b, t->hour < 12 ? "AM" : "PM"); break;
        case 'a': jsb_add(&b, g_wday[wd], 3); break;
        case 'A': jsb_adds(&b, g_wday[wd]); break;
        case 'b': case 'h': jsb_add(&b, g_mon[t->mon - 1], 3); break;
        case 'B': jsb_adds(&b, g_mon[t->mon - 1]); break;
        case 'w': jsb_addf(&b, "%d", wd); break;
        case 'u': jsb_addf(&b, "%d", wd == 0 ? 7 : wd); break;
        case 'D': jsb_addf(&b, "%02d/%02d/%02d", t->mon, t->mday, t->year % 100); break;
        case 'F': jsb_addf(&b, "%d-%02d-%02d", t->year, t->mon, t->mday); break;
        case 'T': jsb_addf(&b, "%02d:%02d:%02d", t->hour, t->min, t->sec); break;
        case 'R': jsb_addf(&b, "%02d:%02d", t->hour, t->min); break;
        case 'c':
            jsb_addf(&b, "%.3s %.3s %2d %02d:%02d:%02d %d", g_wday[wd], g_mon[t->mon - 1], t->mday,
                     t->hour, t->min, t->sec, t->year);
            break;
        case 'x': jsb_addf(&b, "%02d/%02d/%02d", t->mon, t->mday, t->year % 100); break;
        case 'X': jsb_addf(&b, "%02d:%02d:%02d", t->hour, t->min, t->sec); break;
        case 'Z': case 'z': break;
        case 'n': jsb_addc(&b, '\n'); break;
        case 't': jsb_addc(&b, '\t'); break;
        case '%': jsb_addc(&b, '%'); break;
        default:
            jsb_addc(&b, '%');
            if (nopad) jsb_addc(&b, '-');
            jsb_addc(&b, c);
            break;
        }
    }
    return jsb_ret(x, &b, out);
}
