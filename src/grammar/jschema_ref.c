/*
 * jschema_ref.c — the document index of jschema.c: each schema node's
 * location (a JSON pointer, for messages) and base URI (RFC 3986, from the
 * enclosing $id), the $id resources and the anchors ($anchor,
 * $dynamicAnchor) by absolute URI; and $ref resolution against them:
 * "#/json/pointer" (~0 ~1 %XX), "#anchor", relative and absolute URIs of
 * resources embedded in the document. Remote documents are refused.
 * Only schema positions are walked, so an "$id" inside an enum value or a
 * property name is not an identifier.
 */
#include "jschema_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the document index: locations, base URIs, resources ------------------------------ */

static size_t info_slot(json_t *k)
{
    uintptr_t h = (uintptr_t)k;
    h ^= h >> 17;
    h *= (uintptr_t)0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 7) & (JS_MAX_INFO * 2 - 1);
}

static jinfo *info_get(jsb *b, json_t *k)
{
    if (!b->info) return NULL;
    for (size_t i = info_slot(k);; i = (i + 1) & (JS_MAX_INFO * 2 - 1)) {
        if (b->info[i].k == k) return &b->info[i];
        if (!b->info[i].k) return NULL;
    }
}

const char *js_path(jsb *b, json_t *s)
{
    jinfo *i = info_get(b, s);
    return i ? i->path : "(a derived schema)";
}

static const char *js_base(jsb *b, json_t *s)
{
    jinfo *i = info_get(b, s);
    return i ? i->base : "";
}

static bool has_scheme(const char *r)
{
    for (const char *p = r; *p; p++) {
        if (*p == ':') return p > r;
        if (*p == '/' || *p == '?' || *p == '#') return false;
    }
    return false;
}

/* Removes "." and ".." segments of the path in u (RFC 3986 5.2.4) from
 * path_at on, up to '?' or '#'. */
static void remove_dots(char *u, size_t path_at)
{
    char out[1024];
    size_t n = 0;
    char *p = u + path_at;
    size_t plen = strcspn(p, "?#");
    char tail[1024];
    snprintf(tail, sizeof tail, "%s", p + plen);
    size_t i = 0;
    while (i < plen) {
        if (strncmp(p + i, "../", 3) == 0 && i == 0) i += 3;
        else if (strncmp(p + i, "./", 2) == 0 && i == 0) i += 2;
        else if (strncmp(p + i, "/./", 3) == 0) i += 2;
        else if (plen - i == 2 && strncmp(p + i, "/.", 2) == 0) {
            p[i + 1] = '/';
            i += 1;
            plen = i + 1;
        } else if (strncmp(p + i, "/../", 4) == 0 || (plen - i == 3 && strncmp(p + i, "/..", 3) == 0)) {
            bool last = plen - i == 3;
            while (n > 0 && out[n - 1] != '/') n--;
            if (n > 0) n--;
            if (last) {
                out[n++] = '/';
                i = plen;
            } else {
                i += 3;
            }
        } else {
            if (n + 1 < sizeof out) out[n++] = p[i];
            i++;
        }
    }
    out[n] = 0;
    snprintf(u + path_at, 1024 - path_at, "%s%s", out, tail);
}

/* ref resolved against base (RFC 3986 5.2, enough for schema URIs) into out[1024]. */
static void uri_resolve(const char *base, const char *ref, char *out)
{
    size_t cap = 1024;
    if (has_scheme(ref) || !base[0]) {
        snprintf(out, cap, "%s", ref);
        if (has_scheme(ref)) {
            const char *a = strstr(ref, "://");
            size_t at = a ? (size_t)(a - ref) + 3 : (size_t)(strchr(ref, ':') - ref) + 1;
            if (a) at += strcspn(ref + at, "/?#");
            remove_dots(out, at);
        }
        return;
    }
    size_t blen = strcspn(base, "#");
    if (ref[0] == '#' || ref[0] == 0) {
        snprintf(out, cap, "%.*s%s", (int)blen, base, ref);
        return;
    }
    const char *sch = strchr(base, ':');
    size_t slen = sch ? (size_t)(sch - base) + 1 : 0;
    if (ref[0] == '/' && ref[1] == '/') {
        snprintf(out, cap, "%.*s%s", (int)slen, base, ref);
        return;
    }
    size_t auth_end = slen;
    if (strncmp(base + slen, "//", 2) == 0) auth_end = slen + 2 + strcspn(base + slen + 2, "/?#");
    if (ref[0] == '/') {
        snprintf(out, cap, "%.*s%s", (int)auth_end, base, ref);
    } else {
        size_t plen = strcspn(base, "?#");
        size_t cut = plen;
        while (cut > auth_end && base[cut - 1] != '/') cut--;
        if (cut == auth_end && auth_end > slen) snprintf(out, cap, "%.*s/%s", (int)auth_end, base, ref);
        else snprintf(out, cap, "%.*s%s", (int)cut, base, ref);
    }
    remove_dots(out, auth_end);
}

keel_status js_add_res(jsb *b, const char *uri, json_t *node, const char *where, bool dyn)
{
    for (int i = 0; i < b->n_res; i++)
        if (strcmp(b->res[i].uri, uri) == 0) {
            if (b->res[i].node == node) return KEEL_OK;
            return js_refuse(b, where, "the identifier '%.200s' names two schemas", uri);
        }
    if (b->n_res == JS_MAX_RES) return js_refuse(b, where, "more than %d '$id' / '$anchor' identifiers", JS_MAX_RES);
    b->res[b->n_res].dyn = dyn;
    b->res[b->n_res].uri = js_strdup(b, uri, strlen(uri));
    b->res[b->n_res++].node = node;
    return b->st;
}


static keel_status index_child(jsb *b, json_t *s, const char *path, const char *kw, const char *k, const char *base,
                               int depth)
{
    char p[1024];
    if (k) {
        /* the key escaped as a JSON pointer token */
        char e[512];
        size_t n = 0;
        for (const char *q = k; *q && n + 3 < sizeof e; q++) {
            if (*q == '~' || *q == '/') {
                e[n++] = '~';
                e[n++] = *q == '~' ? '0' : '1';
            } else {
                e[n++] = *q;
            }
        }
        e[n] = 0;
        snprintf(p, sizeof p, "%s/%s/%s", path, kw, e);
    } else {
        snprintf(p, sizeof p, "%s/%s", path, kw);
    }
    return js_index(b, s, p, base, depth + 1);
}

/* Records s (a schema) and the schemas under it: location, base URI, $id
 * resources and anchors. Only schema positions are walked, so an "$id"
 * inside an enum value or a property name is not an identifier. */
keel_status js_index(jsb *b, json_t *s, const char *path, const char *base, int depth)
{
    if (b->st) return b->st;
    if (!json_is_object(s)) return KEEL_OK;
    if (depth > JS_MAX_DEPTH) return js_refuse(b, path, "schemas nested more than %d deep", JS_MAX_DEPTH);
    if (info_get(b, s)) return KEEL_OK;
    if (b->n_info >= JS_MAX_INFO) return js_refuse(b, path, "more than %u schema objects", JS_MAX_INFO);
    char u[1024];
    json_t *id = json_object_get(s, "$id");
    if (json_is_string(id)) {
        uri_resolve(base, json_string_value(id), u);
        u[strcspn(u, "#")] = 0;
        if (js_add_res(b, u, s, path, false)) return b->st;
        base = u;
    }
    const char *bd = js_strdup(b, base, strlen(base));
    const char *pd = js_strdup(b, path, strlen(path));
    if (!bd || !pd) return b->st;
    size_t i = info_slot(s);
    while (b->info[i].k) i = (i + 1) & (JS_MAX_INFO * 2 - 1);
    b->info[i].k = s;
    b->info[i].path = pd;
    b->info[i].base = bd;
    b->n_info++;
    if (json_object_get(s, "unevaluatedProperties") || json_object_get(s, "unevaluatedItems")) b->uneval = true;
    static const char *const anchors[] = {"$anchor", "$dynamicAnchor", NULL};
    for (int a = 0; anchors[a]; a++) {
        json_t *an = json_object_get(s, anchors[a]);
        if (!json_is_string(an)) continue;
        char au[1200];
        snprintf(au, sizeof au, "%s#%s", bd, json_string_value(an));
        if (js_add_res(b, au, s, path, a == 1)) return b->st;
    }
    static const char *const one[] = {"items", "additionalProperties", "not", "if", "then", "else", "contains",
                                      "propertyNames", "unevaluatedItems", "unevaluatedProperties",
                                      "additionalItems", "contentSchema", NULL};
    static const char *const map[] = {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas",
                                      NULL};
    static const char *const list[] = {"allOf", "anyOf", "oneOf", "prefixItems", NULL};
    for (int k = 0; one[k]; k++) {
        json_t *c = json_object_get(s, one[k]);
        if (c && index_child(b, c, path, one[k], NULL, bd, depth)) return b->st;
    }
    for (int k = 0; map[k]; k++) {
        json_t *m = json_object_get(s, map[k]), *v;
        const char *key;
        if (!json_is_object(m)) continue;
        json_object_foreach(m, key, v) if (index_child(b, v, path, map[k], key, bd, depth)) return b->st;
    }
    for (int k = 0; list[k]; k++) {
        json_t *m = json_object_get(s, list[k]), *v;
        size_t j;
        if (!json_is_array(m)) continue;
        json_array_foreach(m, j, v) {
            char num[32];
            snprintf(num, sizeof num, "%zu", j);
            if (index_child(b, v, path, list[k], num, bd, depth)) return b->st;
        }
    }
    return b->st;
}

/* The schema $ref r (in node s) names, or NULL with the refusal set. */
json_t *js_resolve_ref(jsb *b, json_t *s, const char *r)
{
    const char *where = js_path(b, s);
    char u[1024];
    uri_resolve(js_base(b, s), r, u);
    char *hash = strchr(u, '#');
    const char *frag = hash ? hash + 1 : "";
    if (hash) *hash = 0;
    json_t *doc = NULL;
    for (int i = 0; i < b->n_res && !doc; i++)
        if (strcmp(b->res[i].uri, u) == 0) doc = b->res[i].node;
    if (!doc && !u[0]) doc = b->root;
    if (!doc) {
        js_refuse(b, where, "'$ref' to another document ('%.200s') is not supported", r);
        return NULL;
    }
    if (frag[0] && frag[0] != '/') {
        char au[1200];
        snprintf(au, sizeof au, "%s#%s", u, frag);
        for (int i = 0; i < b->n_res; i++)
            if (strcmp(b->res[i].uri, au) == 0) return b->res[i].node;
        js_refuse(b, where, "'$ref' to the anchor '%.200s' that names nothing in the schema", r);
        return NULL;
    }
    json_t *cur = doc;
    const char *p = frag;
    while (*p == '/') {
        char tok[256];
        size_t n = 0;
        for (p++; *p && *p != '/'; p++) {
            int c = (unsigned char)*p;
            if (c == '~' && (p[1] == '0' || p[1] == '1')) {
                c = p[1] == '0' ? '~' : '/';
                p++;
            } else if (c == '%' && p[1] && p[2]) {
                unsigned v = 0;
                if (sscanf(p + 1, "%2x", &v) == 1) {
                    c = (int)v;
                    p += 2;
                }
            }
            if (n + 1 >= sizeof tok) {
                js_refuse(b, where, "a '$ref' pointer segment longer than 255 bytes");
                return NULL;
            }
            tok[n++] = (char)c;
        }
        tok[n] = '\0';
        json_t *next = NULL;
        if (json_is_object(cur)) {
            next = json_object_get(cur, tok);
        } else if (json_is_array(cur)) {
            char *end = NULL;
            unsigned long k = strtoul(tok, &end, 10);
            if (n > 0 && *end == '\0') next = json_array_get(cur, k);
        }
        if (!next) {
            js_refuse(b, where, "a '$ref' that names nothing in the schema");
            return NULL;
        }
        cur = next;
    }
    return cur;
}

